"""Slot computation for cron, interval and one-shot schedules.

Pure: every function takes the time it starts from (integer ms since the epoch, UTC); nothing
here reads the clock. Only the proposer (the leader's trigger loop, or the node handling an API
write) calls these functions and writes their results into commands, so replicas never depend on
their own tzdata or croniter version (I4 in docs/design.md).

Cron: 5 fields (minute precision) or 6 fields with *seconds first* (``s m h dom mon dow``, as in
Quartz, Spring and Dkron). Each expression is evaluated in its IANA time zone (default UTC).

DST (the default, documented in docs/design.md):
- a local time that does not exist (spring forward) fires once, right after the gap (croniter's
  own behaviour: 02:30 on a day when 02:00-03:00 is skipped fires at 03:00);
- a local time that happens twice (fall back) fires once, at its first occurrence, when the
  expression names fixed hours; an expression whose hour field is a wildcard (``*`` or ``*/n``)
  keeps firing through the repeated hour, at real intervals (Vixie cron's rule). croniter alone
  would fire ``30 1 * * *`` twice in America/New_York on 2026-11-01.
"""
from __future__ import annotations

import functools
import hashlib
import re
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter, CroniterError

from . import limits
from .errors import InvalidSpec

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

#: croniter's hashed/random items (``H``, ``R``, ``R(0-30)``, ``r/5``; croniter lowercases the
#: expression, so both cases count). Matched per comma-separated item, so that month and day
#: names containing an R (MAR, APR, FRI, MON-FRI) stay valid.
_HASH_OR_RANDOM_RE = re.compile(r"^[hr](\(|/|$)", re.IGNORECASE)


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """:raises InvalidSpec: for an unknown zone."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidSpec(f"unknown time zone {name!r}", field="schedule.timezone") from None


def check_cron(expr: str) -> None:
    """Validate a cron expression. :raises InvalidSpec: naming what is wrong."""
    field = "schedule.cron"
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidSpec("cron must be a non-empty string", field=field)
    if len(expr) > 256:
        raise InvalidSpec("cron expression is longer than 256 characters", field=field)
    why = _cron_error(expr)
    if why is not None:
        raise InvalidSpec(why, field=field)


@functools.lru_cache(maxsize=4096)
def _cron_error(expr: str) -> str | None:
    """Why ``expr`` (a non-empty string of at most 256 characters) is not a valid cron
    expression, or None. Memoised: the verdict depends on the text alone (and on croniter's
    version), and croniter parses an expression twice here, at 0.1-0.7 ms each; a crontab
    import or a bulk registration repeats the same few expressions many times."""
    parts = expr.split()
    if len(parts) not in (5, 6):
        return f"cron needs 5 fields (m h dom mon dow) or 6 with seconds first; got {len(parts)}"
    if any(_HASH_OR_RANDOM_RE.match(item) for p in parts for item in p.split(",")):
        # croniter's R ("random") is drawn per instance: replicas would disagree.
        return "cron field 'R' (random) is not allowed"
    if parts[0].startswith("@") or expr.startswith("@"):
        return "cron aliases (@daily, ...) are not supported: write the fields"
    try:
        if not croniter.is_valid(expr, second_at_beginning=len(parts) == 6):
            return f"invalid cron expression {expr!r}"
        it = _cron_iter(expr, "UTC")
        it.set_current(datetime(2026, 1, 1, tzinfo=UTC), force=True)
        it.get_next(datetime)
    except Exception as e:
        return f"cron expression {expr!r} never matches or is invalid: {e}"
    return None


@functools.lru_cache(maxsize=4096)
def _cron_iter(expr: str, tz: str) -> croniter:
    """One parsed croniter per (expression, zone): parsing costs far more than stepping."""
    six = len(expr.split()) == 6
    return croniter(
        expr,
        datetime(2000, 1, 1, tzinfo=zone(tz)),
        second_at_beginning=six,
        max_years_between_matches=limits.cron_years_between_matches_max,
    )


def _hour_is_wildcard(expr: str) -> bool:
    parts = expr.split()
    hour = parts[2] if len(parts) == 6 else parts[1]
    return hour.startswith("*")


#: Slots one next-slot search may pass over: the second occurrences of a repeated hour (at
#: most 3600 for a seconds cron) and one slot shifted past a spring-forward gap.
_SKIPS_MAX = 4000


def fall_back_once(expr: str, dst: dict | None) -> bool:
    """Whether a repeated local time fires once (at its first occurrence). Explicit
    ``dst.fall_back`` wins; by default fixed-hour expressions fire once and wildcard-hour ones
    (``*``, ``*/n``) keep firing through the repeated hour, at real intervals (Vixie cron)."""
    if dst and dst.get("fall_back"):
        return dst["fall_back"] == "once"
    return not _hour_is_wildcard(expr)


def _gap_shifted(expr: str, dt: datetime) -> bool:
    """Whether croniter moved this slot past a spring-forward gap: its local wall time does not
    match the expression (02:30 that does not exist, fired at 03:00)."""
    if dt.utcoffset() == (dt - timedelta(hours=3)).utcoffset():
        return False  # no transition in the last three hours: nothing can have been shifted
    six = len(expr.split()) == 6
    return not croniter.match(expr, dt.replace(tzinfo=None), second_at_beginning=six)


def _cron_next(expr: str, tz: str, after_ms: int, dst: dict | None = None) -> int | None:
    it = _cron_iter(expr, tz)
    z = zone(tz)
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(z)
    repeat_once = fall_back_once(expr, dst)
    skip_gap = bool(dst) and dst.get("spring_forward") == "skip"
    # croniter's set_current/get_next are not thread-safe on a shared instance; callers run on
    # one thread per process (the event loop), which is all that calls this.
    it.set_current(start, force=True)
    for _ in range(_SKIPS_MAX):
        try:
            nxt = it.get_next(datetime)
        except CroniterError:
            return None
        ms = int(nxt.timestamp() * 1000)
        if ms <= after_ms:
            continue
        if repeat_once and nxt.fold == 1 and _is_ambiguous(nxt):
            # Second occurrence of a repeated local time: fires once.
            continue
        if skip_gap and _gap_shifted(expr, nxt):
            # A local time that did not exist: spring_forward=skip drops it.
            continue
        return ms
    return None


def _is_ambiguous(dt: datetime) -> bool:
    a = dt.replace(fold=0).utcoffset()
    b = dt.replace(fold=1).utcoffset()
    return a != b


def jitter_offset_ms(key: str, nominal_ms: int, jitter_ms: int) -> int:
    """A slot's deterministic offset in [0, jitter_ms), whole seconds: a hash of the job name and the nominal
    slot, so jobs that all say ``0 * * * *`` spread out, and every replica and every run of the
    proposer agree."""
    h = hashlib.blake2b(f"{key}@{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % max(1, jitter_ms // 1000) * 1000  # whole seconds


def next_slot_after(schedule: dict, after_ms: int, anchor_ms: int) -> int | None:
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


def _nominal_next(schedule: dict, after_ms: int, anchor_ms: int) -> int | None:
    if "every_s" in schedule:
        every = schedule["every_s"] * 1000
        if after_ms < anchor_ms:
            return anchor_ms
        k = (after_ms - anchor_ms) // every + 1
        return anchor_ms + k * every
    if "at" in schedule:
        at = schedule["at"]
        return at if at > after_ms else None
    return _cron_next(schedule["cron"], schedule.get("timezone", "UTC"), after_ms, schedule.get("dst"))


def iter_slots(schedule: dict, after_ms: int, until_ms: int, anchor_ms: int, limit: int):
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


def count_slots(schedule: dict, after_ms: int, until_ms: int, anchor_ms: int, limit: int) -> int | None:
    """How many slots lie in (after_ms, until_ms]; None when more than ``limit`` (cron only:
    intervals are counted exactly by arithmetic)."""
    if until_ms <= after_ms:
        return 0
    if "every_s" in schedule and not schedule.get("jitter_ms"):
        first = next_slot_after(schedule, after_ms, anchor_ms)
        if first > until_ms:
            return 0
        return (until_ms - first) // (schedule["every_s"] * 1000) + 1
    n = 0
    for _ in iter_slots(schedule, after_ms, until_ms, anchor_ms, limit + 1):
        n += 1
    return n if n <= limit else None


def last_slots_until(schedule: dict, after_ms: int, until_ms: int, anchor_ms: int, count: int) -> list[int]:
    """The last ``count`` slots in (after_ms, until_ms], ascending."""
    if "every_s" in schedule and not schedule.get("jitter_ms"):
        every = schedule["every_s"] * 1000
        first = next_slot_after(schedule, after_ms, anchor_ms)
        if first is None or first > until_ms:
            return []
        last = anchor_ms + ((until_ms - anchor_ms) // every) * every
        start = max(first, last - (count - 1) * every)
        return list(range(start, last + 1, every))
    # Cron and one-shot: walk back by bisection-free stepping. For cron, croniter's get_prev is
    # not DST-consistent with get_next, so step forward from a point far enough back instead.
    out: list[int] = []
    window_ms = 60_000
    while True:
        lo = max(after_ms, until_ms - window_ms)
        out = list(iter_slots(schedule, lo, until_ms, anchor_ms, 10**6))
        if len(out) >= count or lo == after_ms:
            return out[-count:] if count > 0 else []  # out[-0:] would be all of them
        window_ms *= 8


def iso(ms: int | None) -> str | None:
    """ISO-8601 UTC with a Z, millisecond precision only when needed."""
    if ms is None:
        return None
    dt = _EPOCH + timedelta(milliseconds=ms)  # exact: no float rounding
    if ms % 1000:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_ms(text: str, field: str) -> int:
    """Parse an ISO-8601 time with an explicit offset or Z. :raises InvalidSpec:"""
    if not isinstance(text, str):
        raise InvalidSpec("must be an ISO-8601 string such as 2026-12-01T02:00:00Z", field=field)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidSpec(f"{text!r} is not an ISO-8601 time", field=field) from None
    if dt.tzinfo is None:
        raise InvalidSpec(f"{text!r} has no time zone offset (add Z for UTC)", field=field)
    # Integer arithmetic: int(dt.timestamp() * 1000) loses a millisecond to float rounding
    # (1987-06-03T21:56:53.887Z became ...886).
    return (dt - _EPOCH) // _MS
