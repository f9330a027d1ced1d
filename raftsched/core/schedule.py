"""Slot computation for cron, interval and one-shot schedules.

Pure: every function takes the time it starts from (integer ms since the epoch, UTC); nothing
here reads the clock. Only the proposer (the leader's trigger loop, or the node handling an API
write) calls these functions and writes their results into commands, so replicas never depend on
their own tzdata or cron library version (I4 in docs/design.md).

Cron: 5 fields (minute precision) or 6 fields with *seconds first* (``s m h dom mon dow``, as in
Quartz, Spring and Dkron), or one of the aliases ``@yearly @annually @monthly @weekly @daily
@midnight @hourly``. Fields follow Vixie/Debian cron (docs/api.md, "The cron dialect"), evaluated
by cronsim on *local wall times* of the job's IANA time zone (default UTC); this module maps
those wall times to instants, with the DST rules below. (croniter, used before, reads a range
with equal ends such as ``MON-MON`` as ``*`` in its 6.x and 7.x releases and departs from Vixie
cron's day-of-month/day-of-week rule: docs/design.md, "Cron".)

DST (docs/misfire.md): an expression is *wildcard-hour* when its hour field starts with ``*``
(``*``, ``*/n``), *fixed-hour* otherwise.
- A local time that does not exist (spring forward): fixed-hour expressions fire once right after
  the gap (``spring_forward: run_after_gap``), at the first instant after it whose seconds match;
  wildcard-hour ones have no slot in the gap (``skip``). ``schedule.dst.spring_forward`` chooses
  for either kind.
- A local time that happens twice (fall back): fixed-hour expressions fire once, at its first
  occurrence (``fall_back: once``); wildcard-hour ones fire at both, at real intervals (``twice``,
  Vixie cron's rule, so ``*/5 * * * *`` is not silent for an hour). ``schedule.dst.fall_back``
  chooses for either kind.
"""
from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from . import limits
from .errors import InvalidSpec
from .records import Record

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)

#: The aliases users paste from crontabs and Kubernetes, and the fields they stand for.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}

#: Hashed or random items (``H``, ``R``, ``R(0-30)``, ``r/5``) that other cron dialects draw per
#: parser: replicas and successive leaders would disagree. Matched per comma-separated item, so
#: that month and day names containing an R (MAR, APR, FRI, MON-FRI) stay valid.
_HASH_OR_RANDOM_RE = re.compile(r"[hr](\(|/|\Z)", re.IGNORECASE)

#: How far a DST transition can move local time: 2 h at the most (Antarctica/Troll), 1 h almost
#: everywhere, 30 min on Lord Howe Island. A repeated or skipped span lies within this of its
#: transition, so looking this far either side of an instant finds the one that matters.
_DST_SHIFT_MAX_MS = 3 * 3_600_000
#: How long after a spring-forward transition a missing local time may fire (_after_gap_ms: the
#: first instant whose seconds match, under a minute after the transition).
_AFTER_GAP_MAX_MS = 61_000


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """:raises InvalidSpec: for an unknown zone."""
    # ZoneInfo refuses relative and absolute paths itself (ValueError), and a name that is no
    # zone file (ZoneInfoNotFoundError); both are an unknown zone to the user.
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise InvalidSpec(f"unknown time zone {name!r}", field="schedule.timezone") from None


#: A range with equal ends, with or without a step (``10-10/5``, ``MON-MON``): one value.
_EQUAL_ENDS_RE = re.compile(r"([0-9A-Za-z]+)-([0-9A-Za-z]+)(/[0-9]+)?")


def _one_value(item: str) -> str:
    m = _EQUAL_ENDS_RE.fullmatch(item)
    if m and m.group(1).upper() == m.group(2).upper():
        # cronsim reads "N-N/S" as "N/S" (N, N+S, ... to the end of the field); Vixie cron and
        # cronsim's own "N-M/S" mean the values of the range, stepped: here, N alone.
        return m.group(1)
    return item


_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def _day_number(text: str) -> int | None:
    up = text.upper()
    if up in _DAYS:
        return _DAYS.index(up)
    # (ASCII only: "²".isdigit() is true and int("²") raises; cron's digits are ASCII)
    return int(text) if text.isascii() and text.isdigit() else None


def _wrapping_day_range(dow: str) -> str | None:
    """Why a day-of-week field is refused when it holds a range that runs past Saturday
    (``SAT-SUN``, ``FRI-MON``): Vixie cron refuses it too, and cronsim only says "Bad
    day-of-week". None when it holds none."""
    for item in dow.split(","):
        lo, sep, hi = item.split("/")[0].partition("-")
        a, b = _day_number(lo), _day_number(hi)
        if not sep or a is None or b is None or a <= b or a > 7:
            continue
        why = f"day-of-week range {item} runs past Saturday, which cron does not allow"
        if "/" in item:
            return why + ": list the days, e.g. SAT,SUN"
        names = ",".join(_DAYS[d % 7] for d in range(a, (b if b else 7) + (7 if b else 0) + 1))
        spans = [(a, 7)] + ([(1, b)] if b else [])
        numbers = ",".join(str(x) if x == y else f"{x}-{y}" for x, y in spans)
        return f"{why}: use {names} or {numbers}"
    return None


@functools.lru_cache(maxsize=4096)
def _fields(expr: str) -> str:
    """The expression's fields, an alias expanded, white space normalised and each range with
    equal ends written as its one value."""
    text = " ".join(expr.split())
    text = CRON_ALIASES.get(text.lower(), text)
    if "-" not in text:
        return text
    return " ".join(",".join(map(_one_value, f.split(","))) for f in text.split())


def check_cron(expr: object, now_ms: int | None = None, tz: str = "UTC") -> None:
    """Validate a cron expression; with ``now_ms``, also refuse one that never matches again
    after that time in zone ``tz``. :raises InvalidSpec: naming what is wrong."""
    field = "schedule.cron"
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidSpec("cron must be a non-empty string", field=field)
    if len(expr) > limits.cron_chars_max:
        raise InvalidSpec(f"cron expression is longer than {limits.cron_chars_max} characters", field=field)
    why = _cron_error(expr)
    if why is None and now_ms is not None and not _matches_after(expr, tz, now_ms // 60_000):
        why = (f"cron expression {expr!r} never matches after {iso(now_ms)} "
               f"(searched {limits.cron_years_between_matches_max} years ahead)")
    if why is not None:
        raise InvalidSpec(why, field=field)


#: A day-of-month item naming the weekday nearest a day (``15W``): not in cronsim's dialect.
_NEAREST_WEEKDAY_RE = re.compile(r"\d+W", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _cron_error(expr: str) -> str | None:
    """Why ``expr`` (a non-empty string of bounded length) is not a valid cron expression, or
    None. Memoised: the verdict depends on the text alone; a crontab import or a bulk
    registration repeats the same few expressions many times."""
    text = " ".join(expr.split())
    prefix = re.match(r"(CRON_TZ|TZ)=(\S*)", text)
    if prefix:
        # A crontab line of cronie or a Kubernetes CronJob: the zone is the schedule's own field.
        return (f"invalid cron expression {expr!r}: a {prefix.group(1)}= prefix is not part of the expression; "
                f"write the zone as schedule.timezone ({prefix.group(2) or 'the zone'!r}) and the fields alone")
    if text.startswith("@"):
        if text.lower() == "@reboot":
            return ("@reboot is not a schedule: a cluster has no boot of its own (nodes restart one at "
                    "a time); use a one-shot {\"at\": ...} schedule or POST /v1/jobs/{name}/trigger")
        if text.lower() not in CRON_ALIASES:
            return f"unknown cron alias {text!r}; known: {', '.join(CRON_ALIASES)}"
    parts = _fields(text).split()
    if len(parts) not in (5, 6):
        year = " (Quartz's year field is not supported)" if len(parts) == 7 else ""
        return f"cron needs 5 fields (m h dom mon dow) or 6 with seconds first; got {len(parts)}{year}"
    items = [item for p in parts for item in p.split(",")]
    if any(_HASH_OR_RANDOM_RE.match(item) for item in items):
        return "cron items 'H' (hashed) and 'R' (random) are not allowed: replicas would disagree"
    if "?" in items:
        return "cron item '?' (Quartz's \"no specific value\") is not supported: write '*'"
    nearest = [item for item in parts[-3].split(",") if _NEAREST_WEEKDAY_RE.fullmatch(item)]
    if nearest:
        return (f"cron item {nearest[0]!r} (the weekday nearest a day of the month) is not supported; "
                f"LW (the month's last weekday) is (docs/api.md, \"The cron dialect\")")
    if any("L" in item.upper() and "/" in item for p in parts[-3:] for item in p.split(",")):
        return f"invalid cron expression {expr!r}: L takes no step: write L, LW or nL alone"
    wrap = _wrapping_day_range(parts[-1])
    if wrap is not None:
        return f"invalid cron expression {expr!r}: {wrap}"
    try:
        CronSim(_fields(text), datetime(2000, 1, 1))
    except CronSimError as e:
        # cronsim names the field ("Bad day-of-month"); say which expression and what is allowed.
        return f"invalid cron expression {expr!r}: {e} (docs/api.md, \"The cron dialect\")"
    except (ValueError, IndexError, KeyError, TypeError) as e:
        return f"invalid cron expression {expr!r}: {type(e).__name__}"
    return None


@functools.lru_cache(maxsize=4096)
def _matches_after(expr: str, tz: str, minute: int) -> bool:
    """Whether ``expr`` has a slot after the start of minute ``minute`` (since the epoch).
    Memoised by the minute: a bulk registration validates the same expressions at one now."""
    return _cron_next(expr, tz, minute * 60_000) is not None


def cron_utc_minutes(expr: str, tz: str, around_ms: int) -> set[int] | None:
    """The minutes of the hour, in UTC, on which five-field cron ``expr`` in zone ``tz`` may fire
    (its minutes, less each offset the zone has within two years either side of ``around_ms``,
    modulo the hour: Asia/Kathmandu's "0 * * * *" fires at :15 UTC, Australia/Lord_Howe's at :00
    and :30), or None when it cannot be told (a seconds field, a bad expression or zone). A
    spring-forward gap's run after it is on the hour too (the gap's end is a whole offset)."""
    fields = _fields(expr).split()
    if len(fields) != 5:
        return None
    try:
        minutes = CronSim(" ".join(fields), datetime(2000, 1, 1)).minutes
        z = zone(tz)
    except (CronSimError, InvalidSpec, ValueError, IndexError, KeyError, TypeError):
        return None
    offsets = set()
    for k in range(-48, 49):  # twice a month over four years: every offset a zone keeps that long
        t = around_ms + k * 15 * 86_400_000
        if 0 <= t <= limits.time_ms_max:
            offsets.add(_offset_ms(t, z) // 60_000 % 60)
    return {(m - off) % 60 for m in minutes for off in offsets}


def _hour_is_wildcard(expr: str) -> bool:
    parts = _fields(expr).split()
    hour = parts[2] if len(parts) == 6 else parts[1]
    return hour.startswith("*")


#: Matches one next-slot search may pass over: local times in a spring-forward gap that
#: ``skip`` drops (at most 3600 for a seconds cron in a one-hour gap) and a few more.
_SKIPS_MAX = 4000


def fall_back_once(expr: str, dst: dict[str, str] | None) -> bool:
    """Whether a repeated local time fires once (at its first occurrence). Explicit
    ``dst.fall_back`` wins; by default fixed-hour expressions fire once and wildcard-hour ones
    (``*``, ``*/n``) keep firing through the repeated hour, at real intervals (Vixie cron)."""
    if dst and dst.get("fall_back"):
        return dst["fall_back"] == "once"
    return not _hour_is_wildcard(expr)


def spring_forward_runs(expr: str, dst: dict[str, str] | None) -> bool:
    """Whether local times that do not exist fire once after the gap. Explicit
    ``dst.spring_forward`` wins; by default fixed-hour expressions run after the gap and
    wildcard-hour ones have no slot in it (the hour they name goes by, like any other)."""
    if dst and dst.get("spring_forward"):
        return dst["spring_forward"] == "run_after_gap"
    return not _hour_is_wildcard(expr)


def _naive_next(expr: str, wall: datetime) -> datetime | None:
    """The first local wall time strictly after ``wall`` (naive) that ``expr`` matches."""
    try:
        return next(CronSim(expr, wall))
    except (StopIteration, OverflowError, ValueError):
        return None  # no match within cronsim's search bound (or past datetime's year 9999)


def _wall_of(ms: int, z: ZoneInfo) -> datetime:
    """The naive local wall time of instant ``ms`` in zone ``z``."""
    return (_EPOCH + ms * _MS).astimezone(z).replace(tzinfo=None)


def _offset_ms(ms: int, z: ZoneInfo) -> int:
    off = (_EPOCH + ms * _MS).astimezone(z).utcoffset()
    assert off is not None  # an aware time's offset (tzinfo a ZoneInfo) is never None
    return off // _MS


def _first_change_ms(z: ZoneInfo, lo: int, hi: int) -> int:
    """The first instant in (lo, hi] whose UTC offset differs from lo's (one change in between)."""
    off = _offset_ms(lo, z)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _offset_ms(mid, z) == off else (lo, mid)
    return hi


_UNIQUE, _REPEATED, _MISSING = 0, 1, 2


def _instants(wall: datetime, z: ZoneInfo) -> tuple[int, int, int]:
    """What local wall time ``wall`` is in zone ``z``: ``(_UNIQUE, ms, ms)``, ``(_REPEATED, first
    ms, second ms)``, or ``(_MISSING, transition ms, transition ms)`` for a time in a
    spring-forward gap, the transition being the first instant after the gap. PEP 495: fold 0 is
    the offset before a transition, fold 1 the one after."""
    off0 = wall.replace(tzinfo=z, fold=0).utcoffset()
    off1 = wall.replace(tzinfo=z, fold=1).utcoffset()
    assert off0 is not None and off1 is not None  # aware times: never None
    base = wall - _EPOCH_NAIVE
    a = (base - off0) // _MS
    if off0 == off1:
        return _UNIQUE, a, a
    b = (base - off1) // _MS
    if off0 > off1:
        return _REPEATED, a, b
    t = _first_change_ms(z, b, a)  # offset goes up: fold 1's instant is the earlier one
    return _MISSING, t, t


def _repeat_span(z: ZoneInfo, ms: int) -> tuple[int, datetime, datetime] | None:
    """``(transition ms, first repeated wall time, wall time where repetition ends)`` when
    instant ``ms`` lies in a repeated span (either pass), else None."""
    lo, hi = ms - _DST_SHIFT_MAX_MS, ms + _DST_SHIFT_MAX_MS
    before, after = _offset_ms(lo, z), _offset_ms(hi, z)
    if before <= after:
        return None  # no fall-back within reach
    t = _first_change_ms(z, lo, hi)
    shift = before - after
    if not t - shift <= ms < t + shift:
        return None
    end = _EPOCH_NAIVE + (t + before) * _MS
    return t, end - shift * _MS, end


def _after_gap_ms(expr: str, t_ms: int) -> int:
    """The first instant at or after transition ``t_ms`` whose seconds match ``expr``'s seconds
    field (a 5-field expression: second 0), where a missing local time fires."""
    parts = expr.split()
    sec = parts[0] if len(parts) == 6 else "0"
    wall = _EPOCH_NAIVE + (t_ms - 1000) * _MS
    nxt = _naive_next(f"{sec} * * * * *", wall)
    return t_ms if nxt is None else max(t_ms, (nxt - _EPOCH_NAIVE) // _MS)


def _cron_next(expr: str, tz: str, after_ms: int, dst: dict[str, str] | None = None) -> int | None:
    """The first slot of ``expr`` in ``tz`` strictly after ``after_ms``, or None.

    Two streams of instants, each increasing with wall time: first (or only) occurrences, and,
    when repeated times fire twice, second occurrences; the slot is the smaller of each stream's
    first instant after ``after_ms``. Only an instant inside a repeated span has a second stream
    to look at (_repeat_span)."""
    expr = _fields(expr)
    z = zone(tz)
    wall = _wall_of(after_ms, z)
    span = _repeat_span(z, after_ms)
    run_gap = spring_forward_runs(expr, dst)
    best: int | None = None
    start = wall
    if span is not None and after_ms >= span[0]:
        # In the second pass: first occurrences of wall times up to the end of the repeated span
        # are already in the past.
        start = max(wall, span[2] - _SECOND)
    elif run_gap and _offset_ms(after_ms - _AFTER_GAP_MAX_MS, z) < _offset_ms(after_ms, z):
        # Just after a spring-forward gap: a missing time fires at the first instant after the
        # gap whose seconds match (_after_gap_ms), up to a minute after the transition, and may
        # still be ahead although its wall time is behind ``wall``. Look from the gap's start.
        gap = _first_change_ms(z, after_ms - _AFTER_GAP_MAX_MS, after_ms)
        start = min(wall, _wall_of(gap - 1, z))
    t = start
    for _ in range(_SKIPS_MAX):
        found = _naive_next(expr, t)
        if found is None:
            break
        t = found
        kind, a, _b = _instants(t, z)
        if kind == _MISSING:
            if run_gap:
                g = _after_gap_ms(expr, a)
                if g > after_ms and (best is None or g < best):
                    best = g
            # Every other missing time of this gap fires at the same instant, or not at all: go on
            # from the gap's end (a seconds cron has 7 200 missing times in Troll's 2-hour gap).
            # A real slot right after the gap may still come first.
            t = max(t, _wall_of(a, z) - _SECOND)
            continue
        if a > after_ms:
            best = a if best is None else min(best, a)
            break
    if span is not None and not fall_back_once(expr, dst):
        t0, first, end = span
        again = _naive_next(expr, (first - _SECOND) if after_ms < t0 else wall)
        if again is not None and again < end:
            kind, _a, b = _instants(again, z)
            if kind == _REPEATED and b > after_ms and (best is None or b < best):
                best = b
    return best


def gap_skipped(expr: str, tz: str, after_ms: int, before_ms: int, dst: dict[str, str] | None = None,
                limit: int = 16) -> list[str]:
    """The local times (naive ISO) of ``expr`` in ``tz`` between two of its consecutive slots
    ``after_ms`` and ``before_ms`` that a spring-forward gap skipped (``dst.spring_forward:
    skip``, or a wildcard hour's default), at most ``limit``: what a preview names beside the
    first slot after the gap (a walk read a daily cron's missing day as no change at all)."""
    expr = _fields(expr)
    if spring_forward_runs(expr, dst):
        return []
    z = zone(tz)
    if _offset_ms(after_ms, z) >= _offset_ms(before_ms, z):
        return []  # no spring-forward between them
    out: list[str] = []
    t, end = _wall_of(after_ms, z), _wall_of(before_ms, z)
    for _ in range(_SKIPS_MAX):
        found = _naive_next(expr, t)
        if found is None or found >= end:
            break
        t = found
        if _instants(t, z)[0] == _MISSING:
            out.append(t.isoformat(timespec="seconds"))
            if len(out) >= limit:
                break
    return out


def jitter_offset_ms(key: str, nominal_ms: int, jitter_ms: int) -> int:
    """A slot's deterministic offset in [0, jitter_ms), whole seconds: a hash of the job name and the nominal
    slot, so jobs that all say ``0 * * * *`` spread out, and every replica and every run of the
    proposer agree."""
    h = hashlib.blake2b(f"{key}@{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % max(1, jitter_ms // 1000) * 1000  # whole seconds


def next_slot_after(schedule: Record, after_ms: int, anchor_ms: int) -> int | None:
    """The first slot strictly after ``after_ms``, or None when the schedule has no more.

    A schedule with ``jitter_ms`` moves each nominal slot later by its jitter offset; validation
    keeps the jitter below the schedule's shortest interval, so slots keep their order.

    :param schedule: a validated schedule (see model.validate_job)
    :param anchor_ms: where an interval schedule's slots start (the job's anchor)
    """
    j = schedule.get("jitter_ms")
    if not j:
        return _nominal_next(schedule, after_ms, anchor_ms)
    key = schedule["jitter_key"]
    n = _nominal_next(schedule, after_ms - j, anchor_ms)
    for _ in range(_SKIPS_MAX):
        if n is None:
            return None
        s = n + jitter_offset_ms(key, n, j)
        if s > after_ms:
            return s
        n = _nominal_next(schedule, n, anchor_ms)
    return None


def nominal_of(schedule: Record, slot_ms: int, anchor_ms: int) -> int | None:
    """The nominal slot whose jittered instant is ``slot_ms`` (``slot_ms`` itself without a
    jitter), or None when no slot of the schedule falls there. The jitter is below the shortest
    interval, so at most one nominal slot lies in (slot_ms - jitter, slot_ms]."""
    j = schedule.get("jitter_ms")
    if not j:
        return slot_ms if _nominal_next(schedule, slot_ms - 1, anchor_ms) == slot_ms else None
    n = _nominal_next(schedule, slot_ms - j, anchor_ms)
    if n is None or n > slot_ms or n + jitter_offset_ms(schedule["jitter_key"], n, j) != slot_ms:
        return None
    return n


def _nominal_next(schedule: Record, after_ms: int, anchor_ms: int) -> int | None:
    if "every_s" in schedule:
        every: int = schedule["every_s"] * 1000
        # The grid: anchor + k * every, from k = 0 with start_at (its phase: start_at is a slot),
        # from k = 1 without (anchored at creation, "the first slot one interval after"). Asked
        # from before the anchor (a jittered slot's search looks back by the jitter, a preview
        # from a time inside the creation's second), the anchor is a slot with start_at only.
        if after_ms < anchor_ms:
            return anchor_ms if "start_at" in schedule else anchor_ms + every
        k = (after_ms - anchor_ms) // every + 1
        return anchor_ms + k * every
    if "at" in schedule:
        at: int = schedule["at"]
        return at if at > after_ms else None
    return _cron_next(schedule["cron"], schedule.get("timezone", "UTC"), after_ms, schedule.get("dst"))


def iter_slots(schedule: Record, after_ms: int, until_ms: int, anchor_ms: int, limit: int) -> Iterator[int]:
    """Yield slots in (after_ms, until_ms], ascending, at most ``limit`` of them."""
    n = 0
    cur = after_ms
    while n < limit:
        nxt = next_slot_after(schedule, cur, anchor_ms)
        if nxt is None or nxt > until_ms:
            return
        yield nxt
        n += 1
        cur = nxt


def count_slots(schedule: Record, after_ms: int, until_ms: int, anchor_ms: int, limit: int) -> int | None:
    """How many slots lie in (after_ms, until_ms]; None when more than ``limit`` (cron only:
    intervals are counted exactly by arithmetic)."""
    if until_ms <= after_ms:
        return 0
    if "every_s" in schedule and not schedule.get("jitter_ms"):
        first = next_slot_after(schedule, after_ms, anchor_ms)
        if first is None or first > until_ms:  # (never None: an interval has no last slot)
            return 0
        every: int = schedule["every_s"] * 1000
        return (until_ms - first) // every + 1
    n = 0
    for _ in iter_slots(schedule, after_ms, until_ms, anchor_ms, limit + 1):
        n += 1
    return n if n <= limit else None


def last_slots_until(schedule: Record, after_ms: int, until_ms: int, anchor_ms: int, count: int) -> list[int]:
    """The last ``count`` slots in (after_ms, until_ms], ascending.

    Cron and one-shot (and jittered intervals): slots are stepped through forwards only (a
    backward search would need its own copy of the DST rules, which _cron_next applies forward
    only), from a start far enough back, and no probe steps through more than O(count) slots: a
    window before ``until_ms`` widens x8 until it holds at least ``count`` slots; when it holds
    many more (slots bunched at its far end: ``* * * * 1 *``, every second of January, looked at
    from February), its start is bisected between it and the previous window until the slots
    after it number between ``count`` and a few times ``count``."""
    if count <= 0:
        return []
    if "every_s" in schedule and not schedule.get("jitter_ms"):
        every = schedule["every_s"] * 1000
        first = next_slot_after(schedule, after_ms, anchor_ms)
        if first is None or first > until_ms:
            return []
        last = anchor_ms + ((until_ms - anchor_ms) // every) * every
        start = max(first, last - (count - 1) * every)
        return list(range(start, last + 1, every))
    # A window x8 wider than one with fewer than ``count`` slots holds about 8 * count of them when
    # slots are evenly spread: walked whole, as before. More, and the start is bisected instead,
    # until the slots after it number between count and band (each probe walks at most band + 1).
    grow_cap = 8 * count + 64
    band = 2 * count + 64
    fewer = until_ms  # a start with fewer than ``count`` slots after it (none: (until, until] is empty)
    window_ms = 60_000
    while True:
        lo = max(after_ms, until_ms - window_ms)
        out = list(iter_slots(schedule, lo, until_ms, anchor_ms, grow_cap + 1))
        if len(out) <= grow_cap and (len(out) >= count or lo == after_ms):
            return out[-count:]
        if len(out) > grow_cap:
            break
        fewer = lo
        window_ms *= 8
    more = lo  # more than ``band`` slots after it
    # Slots are instants: moving the start by 1 ms changes the slots after it by at most one, so
    # some start in (more, fewer) has between count and band slots after it.
    while fewer - more > 1:
        mid = (more + fewer) // 2
        out = list(iter_slots(schedule, mid, until_ms, anchor_ms, band + 1))
        if len(out) < count:
            fewer = mid
        elif len(out) > band:
            more = mid
        else:
            return out[-count:]
    return list(iter_slots(schedule, fewer, until_ms, anchor_ms, count))  # (not reached: see above)


def iso(ms: int | None) -> str | None:
    """ISO-8601 UTC with a Z, millisecond precision only when needed; None for None, and for a
    time datetime cannot render (past the year 9999: after limits.time_ms_max, the latest time a
    client may give, a schedule's next slot may be; it is shown as none)."""
    if ms is None:
        return None
    second = _iso_second(ms // 1000)  # (floored: -1 ms is 23:59:59.999 of the day before)
    if second is None:
        return None
    frac = ms % 1000
    return f"{second}.{frac:03d}Z" if frac else second + "Z"


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str | None:
    """``YYYY-MM-DDTHH:MM:SS`` of a whole second since the epoch, or None past datetime's range.
    Cached: the times rendered together (an audit record a request, the runs of one read, a
    history's slots) mostly share their seconds, and strftime is most of iso's cost."""
    try:
        dt = _EPOCH + timedelta(seconds=second)  # exact: no float rounding
    except (OverflowError, ValueError):  # (ValueError: a float infinity or NaN)
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S")


def parse_iso_ms(text: str, field: str) -> int:
    """Parse an ISO-8601 time with an explicit offset or Z. :raises InvalidSpec:"""
    if not isinstance(text, str):
        raise InvalidSpec("must be an ISO-8601 string such as 2026-12-01T02:00:00Z", field=field)
    if not text.isascii() or not text.isprintable():
        # (datetime's parser stops at a NUL: "...Z\x00" parsed as the time before it, a walk)
        raise InvalidSpec(f"{text[:64]!r} is not an ISO-8601 time: it holds a control or non-ASCII character",
                          field=field)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidSpec(f"{text!r} is not an ISO-8601 time", field=field) from None
    if dt.tzinfo is None:
        raise InvalidSpec(f"{text!r} has no time zone offset (add Z for UTC)", field=field)
    # Integer arithmetic: int(dt.timestamp() * 1000) loses a millisecond to float rounding
    # (1987-06-03T21:56:53.887Z became ...886).
    ms = (dt - _EPOCH) // _MS
    if not 0 <= ms <= limits.time_ms_max:
        raise InvalidSpec(f"must be between {iso(0)} and {iso(limits.time_ms_max)}", field=field)
    return ms
