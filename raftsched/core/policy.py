"""Misfire and retry rules, as pure functions (DESIGN.md sections 4 and 5; docs/design.md I5-I7).

The proposer (the leader's trigger loop) calls :func:`plan_fire` for each due job; the plan goes
into a ``fire`` command, and apply checks it against the job's cursor so that a plan made from a
stale view, or proposed twice, or by two leaders, changes nothing (I2).

Terms: a job's *cursor* is the time up to which its slots have been handled (fired or
recorded). The *due* slots are those in (cursor, now]. A due slot is *on time* when
``now - slot <= grace`` (:func:`grace_ms`: ``grace_s``, and never under
``limits.grace_ms_floor``); older due slots were *missed*.
"""
from __future__ import annotations

import hashlib
import zlib
from typing import Any, TypeAlias

from . import limits, schedule
from .records import Record

#: The due slots between an enumeration's head and tail: (first ms, last ms, count or None when
#: too many to count), or None when there are none.
Middle: TypeAlias = tuple[int, int, int | None] | None


def grace_ms(misfire: Record) -> int:
    """How late a slot may be fired and still be on time: the job's ``grace_s``, but never less
    than ``limits.grace_ms_floor`` (the trigger's own lateness is no misfire)."""
    grace_s: int = misfire["grace_s"]
    return max(grace_s * 1000, limits.grace_ms_floor)


def _enumerate_due(spec: Record, anchor_ms: int, cursor_ms: int, now_ms: int) -> tuple[list[int], Middle, list[int]]:
    """Due slots in (cursor, now]: (head, middle, tail).

    ``head`` is the oldest slots (at most ``fire_slots_enumerated_max``), ``tail`` the newest
    ones when there are more than head holds, and ``middle`` = (first_ms, last_ms, count|None)
    summarises the slots in between (count None when too many to count: cron only).
    """
    sched = spec["schedule"]
    n = limits.fire_slots_enumerated_max
    head = list(schedule.iter_slots(sched, cursor_ms, now_ms, anchor_ms, n))
    if len(head) < n:
        return head, None, []
    tail = schedule.last_slots_until(sched, head[-1], now_ms, anchor_ms, n)
    if not tail:
        return head, None, []
    first_mid = schedule.next_slot_after(sched, head[-1], anchor_ms)
    if first_mid is None or first_mid >= tail[0]:
        return head, None, tail
    count = schedule.count_slots(sched, head[-1], tail[0] - 1, anchor_ms, limits.cron_slots_counted_max)
    # last slot of the middle: the one before tail[0]
    last_mid = schedule.last_slots_until(sched, head[-1], tail[0] - 1, anchor_ms, 1)
    return head, (first_mid, last_mid[-1] if last_mid else first_mid, count), tail


def fires_ahead(spec: Record) -> bool:
    """Whether the leader may commit this job's slots up to ``limits.fire_ahead_ms`` before they
    fall due (docs/design.md, "Firing ahead"). Only when nothing decided at fire time depends on
    the job's other runs: the overlap policy is ``allow`` with no ``max_concurrent``. (forbid,
    queue_one, replace and max_concurrent look at the runs still active, which must be judged at
    the slot, not before it.)"""
    ov = spec.get("overlap")
    return ov is None or (ov.get("policy") == "allow" and "max_concurrent" not in ov)


def plan_fire(spec: Record, anchor_ms: int, cursor_ms: int, now_ms: int, gen: int, name: str,
              ahead_ms: int = 0) -> dict[str, Any] | None:
    """Plan one job's fire entry: which due slots become runs and which are recorded.

    :param ahead_ms: also plan the slots of the next ``ahead_ms`` (firing ahead: they become
        runs that no worker may start before their slot). Lateness is still judged against
        ``now_ms``.
    :returns: ``{"job", "gen", "after", "runs": [slot_ms], "rec": [[state, reason, from_ms,
        to_ms, count]], "next": next_ms | None, "upto"}``, or None when nothing is due.
    """
    until_ms = now_ms + ahead_ms
    head, middle, tail = _enumerate_due(spec, anchor_ms, cursor_ms, until_ms)
    if not head:
        return None
    m = spec["misfire"]
    grace = grace_ms(m)
    newest = tail if tail else head
    # On-time slots are the newest ones; at most max_catchup_max of them run. They are looked for
    # in head and tail together: when the tail is short (just over fire_slots_enumerated_max due
    # slots), some on-time slots are still in the head and must not be treated as missed. The
    # middle only holds on-time slots when more than max_catchup_max are on time (capped anyway).
    on_time = [s for s in head + tail if now_ms - s <= grace][-limits.max_catchup_max:]
    cut = on_time[0] if on_time else None
    head_missed = [s for s in head if cut is None or s < cut]
    tail_missed = [s for s in tail if cut is None or s < cut] if tail else []
    runs: list[int] = []
    recs: list[list[Any] | None] = []
    policy = m["policy"]
    missed_any = bool(head_missed)
    if missed_any:
        if policy == "fire_all":
            k = m["max_catchup"]
            runs.extend(head_missed[:k])
            rest_head = head_missed[k:]
            recs.append(_span("skipped", "catchup_limit", rest_head, middle, tail_missed))
        elif policy == "fire_once":
            latest = tail_missed[-1] if tail_missed else head_missed[-1]
            runs.append(latest)
            recs.append(_span("coalesced", "misfire", head_missed, middle,
                              tail_missed, exclude=latest))
        else:  # skip
            recs.append(_span("skipped", "misfire", head_missed, middle, tail_missed))
    runs.extend(on_time)
    last_due = newest[-1]
    nxt = schedule.next_slot_after(spec["schedule"], max(until_ms, last_due), anchor_ms)
    return {
        "job": name, "gen": gen, "after": cursor_ms,
        "runs": runs, "rec": [r for r in recs if r is not None],
        "next": nxt, "upto": max(until_ms, last_due),
    }


def compact_entry(plan: dict[str, Any]) -> list[Any]:
    """A plan in the fire command's wire form: ``[job, gen, after, upto, next, runs, rec]``.

    A list, not a map: no key names on the wire, and apply unpacks it without a lookup per
    field (the fire path is the hottest of the cluster; see docs/benchmarks.md)."""
    return [plan["job"], plan["gen"], plan["after"], plan["upto"], plan["next"], plan["runs"], plan["rec"]]


def phased_ahead_ms(name: str, now_ms: int, ahead_ms: int, span_ms: int) -> int:
    """How far past ``now_ms`` the trigger plans a job that fires ahead, taken up now with the
    ordinary look-ahead ``ahead_ms`` (limits.fire_ahead_ms) and its span ``span_ms``
    (limits.fire_ahead_span_ms): its slots up to the end of the job's current block of
    ``span_ms`` + 1 s, at most ``ahead_ms + span_ms``.

    The blocks' phase is a hash of the job's name, the same on every leader, so the jobs that
    fire every second are taken up spread evenly over the block whenever they were registered (a
    burst of registrations otherwise made bursts of take-ups, one per block, for good): a job's
    first entry may carry fewer slots, its later ones carry ``span_ms`` / 1 s + 1. A leader's
    planning only; apply checks what it is given, whatever the horizon."""
    if span_ms <= 0:
        return ahead_ms
    block = span_ms + 1000
    base = now_ms + ahead_ms
    end = base + block - 1 - (base - zlib.crc32(name.encode()) % block) % block
    return min(end, base + span_ms) - now_ms


def plan_fire_compact(spec: Record, anchor_ms: int, cursor_ms: int, now_ms: int, gen: int, name: str,
                      ahead_ms: int = 0) -> list[Any] | None:
    """:func:`plan_fire` in wire form (:func:`compact_entry`), with a fast path for the common
    case: an interval job without jitter whose due slots are all on time. The result is the same
    as ``compact_entry(plan_fire(...))`` (tests/test_policy.py checks it on random inputs)."""
    sched = spec["schedule"]
    every_s = sched.get("every_s")
    if every_s is not None and not sched.get("jitter_ms"):
        every = every_s * 1000
        until = now_ms + ahead_ms
        if cursor_ms < anchor_ms:  # (schedule._nominal_next's grid: the anchor is a slot with start_at only)
            first = anchor_ms if "start_at" in sched else anchor_ms + every
        else:
            first = anchor_ms + ((cursor_ms - anchor_ms) // every + 1) * every
        if first > until:
            return None
        if now_ms - first <= grace_ms(spec["misfire"]):
            # The oldest due slot is on time, so all are; as long as they are few enough to
            # all run (max_catchup_max), they are the runs and nothing is recorded. One slot
            # when on time, several when the trigger catches up.
            n = (until - first) // every + 1
            if n <= limits.max_catchup_max:
                nxt = anchor_ms + ((until - anchor_ms) // every + 1) * every
                return [name, gen, cursor_ms, until, nxt,
                        [first] if n == 1 else list(range(first, first + n * every, every)), []]
    plan = plan_fire(spec, anchor_ms, cursor_ms, now_ms, gen, name, ahead_ms)
    return None if plan is None else compact_entry(plan)


def _span(state: str, reason: str, head_part: list[int], middle: Middle, tail_part: list[int],
          exclude: int | None = None) -> list[Any] | None:
    """One record covering head_part + middle + tail_part (all missed, ascending), minus exclude."""
    slots = [s for s in head_part if s != exclude]
    tail_slots = [s for s in tail_part if s != exclude]
    lo = slots[0] if slots else (middle[0] if middle else (tail_slots[0] if tail_slots else None))
    hi = tail_slots[-1] if tail_slots else (middle[1] if middle else (slots[-1] if slots else None))
    if lo is None:
        return None
    mid_count = middle[2] if middle else 0
    count = None if mid_count is None else len(slots) + mid_count + len(tail_slots)
    if count == 0:
        return None
    return [state, reason, lo, hi, count]


def explain_outage(spec: Record, anchor_ms: int, down_from_ms: int, down_to_ms: int,
                   name: str = "job") -> dict[str, Any]:
    """What firing would do if the leader was down from ``down_from_ms`` until ``down_to_ms``:
    the same :func:`plan_fire` the trigger uses, with the cursor at the start of the outage."""
    return plan_fire(spec, anchor_ms, down_from_ms, down_to_ms, 0, name) or {
        "job": name, "gen": 0, "after": down_from_ms, "runs": [], "rec": [],
        "next": schedule.next_slot_after(spec["schedule"], down_to_ms, anchor_ms), "upto": down_to_ms,
    }


def initial_position(sched: Record, now_ms: int) -> tuple[int, int]:
    """Where a new job's slots start: ``(anchor, cursor)``.

    Interval slots fall on whole seconds counted from the creation time rounded up (the anchor),
    the first one interval after it, unless the schedule has ``start_at``. A one-shot time already past is due at once (its misfire
    policy decides). Other schedules count from ``now``.
    """
    if "start_at" in sched:
        # An explicit phase: slots at start_at + k * every_s. The first is start_at itself when
        # it is still ahead; otherwise the first point of that grid after now (slots before
        # the job existed are not due).
        anchor = sched["start_at"]
        return anchor, (anchor - 1 if anchor > now_ms else now_ms)
    anchor = now_ms - now_ms % 1000 + (1000 if now_ms % 1000 else 0)
    cursor = anchor if "every_s" in sched else now_ms
    if "at" in sched and sched["at"] <= now_ms:
        cursor = sched["at"] - 1
    return anchor, cursor


def plan_resume(spec: Record, anchor_ms: int, cursor_ms: int, now_ms: int) -> dict[str, Any]:
    """The fields of a ``resume_job`` that resumes from now: every slot that fell due while the
    job was paused is one ``skipped`` / ``paused`` record."""
    sched = spec["schedule"]
    upto = max(now_ms, cursor_ms)
    rec = []
    n = schedule.count_slots(sched, cursor_ms, upto, anchor_ms, limits.cron_slots_counted_max)
    if n != 0:
        first = schedule.next_slot_after(sched, cursor_ms, anchor_ms)
        last = schedule.last_slots_until(sched, cursor_ms, upto, anchor_ms, 1)
        rec = [["skipped", "paused", first, last[-1] if last else first, n]]
    return {"after": cursor_ms, "upto": upto, "rec": rec,
            "next": schedule.next_slot_after(sched, upto, anchor_ms)}


def backoff_ms(retry: Record, run_id: str, attempt: int) -> int:
    """Delay before attempt ``attempt + 1`` after attempt ``attempt`` failed.

    ``backoff_s * backoff_multiplier ** (attempt - 1)``, capped at ``backoff_max_s``, then spread by
    ``jitter`` (a fraction: 0.1 = +-10 %) using a hash of the run id and attempt, never a random
    generator, so every replica computes the same delay.
    """
    base = min(retry["backoff_max_s"], retry["backoff_s"] * retry["backoff_multiplier"] ** (attempt - 1))
    h = hashlib.blake2b(f"{run_id}#{attempt}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "big") / 2**64  # [0, 1)
    factor = 1 + retry["jitter"] * (2 * u - 1)
    return max(0, int(base * factor * 1000))
