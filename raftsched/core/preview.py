"""Preview and explain: what the schedule and the misfire rules will do, computed by the same
pure functions the trigger loop uses (core.schedule, core.policy), so the answer cannot drift
from the behaviour.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from . import deadlines, limits, policy, schedule
from .records import Record



def _local(ms: int, tz: str) -> tuple[str, int, bool]:
    """(local ISO time, UTC offset in seconds, ambiguous?) of a slot in zone ``tz``."""
    z = schedule.zone(tz)
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone(z)
    naive = dt.replace(tzinfo=None)
    ambiguous = naive.replace(tzinfo=z, fold=0).utcoffset() != naive.replace(tzinfo=z, fold=1).utcoffset()
    off = dt.utcoffset()
    assert off is not None  # an aware time's offset (tzinfo a ZoneInfo) is never None
    # In milliseconds when the slot has them (a start_at of .500), as the slot's own ISO text; a
    # float's microseconds (.500000) are no part of a slot.
    return dt.isoformat(timespec="milliseconds" if ms % 1000 else "seconds"), int(off.total_seconds()), ambiguous


def _fmt_offset(sec: int) -> str:
    sign = "-" if sec < 0 else "+"
    sec = abs(sec)
    return f"{sign}{sec // 3600:02d}:{sec % 3600 // 60:02d}"


def preview(spec: Record, anchor_ms: int, after_ms: int, count: int) -> list[dict[str, Any]]:
    """The next ``count`` slots after ``after_ms``: UTC, local time, and DST marks.

    ``dst`` is set on a slot whose UTC offset differs from the previous slot's (the first slot
    after a transition: a spring-forward slot that fires after the gap, or the first slot after
    a fall-back), with ``dst_skipped``, the local times the gap skipped since the slot before
    (``dst.spring_forward: skip``: a daily 02:30 has no slot on that day, and the mark falls on
    the next one); ``ambiguous_local_time`` on a slot whose local time happens twice that day
    (it fires once, at this first occurrence, unless its cron hour field is a wildcard).
    """
    sched = spec["schedule"]
    tz = sched.get("timezone", "UTC")
    out: list[dict[str, Any]] = []
    prev_off = prev_ms = None
    if "cron" in sched:
        before = schedule.last_slots_until(sched, after_ms - 400 * 86_400_000, after_ms, anchor_ms, 1)
        if before:
            prev_ms = before[-1]
            prev_off = _local(prev_ms, tz)[1]
    # No slot after the latest time a client may give is listed (its local time may not render).
    for ms in schedule.iter_slots(sched, after_ms, limits.time_ms_max, anchor_ms, min(count, limits.preview_count_max)):
        local, off, ambiguous = _local(ms, tz)
        item = {"slot": schedule.iso(ms), "slot_ms": ms, "local": local, "timezone": tz, "utc_offset": _fmt_offset(off)}
        if prev_off is not None and off != prev_off:
            item["dst"] = "spring_forward" if off > prev_off else "fall_back"
            if off > prev_off and prev_ms is not None and "cron" in sched:
                skipped = schedule.gap_skipped(sched["cron"], tz, prev_ms, ms, sched.get("dst"))
                if skipped:
                    item["dst_skipped"] = skipped
        if ambiguous:
            item["ambiguous_local_time"] = True
        prev_off, prev_ms = off, ms
        out.append(item)
    return out


#: Why a slot within grace_s did not run as on time (policy.plan_fire).
_OLDER_THAN_ON_TIME = (f"older than the newest {limits.max_catchup_max} slots within it, the most that run as "
                       "on time at once: counted as missed")
_OVER_ON_TIME = f"within grace_s, but {_OLDER_THAN_ON_TIME}"


def _committed_by(sched: Record, anchor_ms: int, name: str, at_ms: int) -> int:
    """How far a leader that kept up had committed the slots of a job that fires ahead by
    ``at_ms`` (never less than ``at_ms``): the trigger takes a job up once its next slot is
    within fire_ahead_ms, and plans it to policy.phased_ahead_ms past then (node/trigger.py);
    followed here from a few blocks before ``at_ms``. A slot more than fire_ahead_ms after the
    last take-up before ``at_ms`` was not committed: the misfire policy decides it."""
    ahead, span = limits.fire_ahead_ms, limits.fire_ahead_span_ms
    t = cursor = at_ms - 2 * (ahead + span + 1000)
    for _ in range(64):  # (a take-up commits at least up to fire_ahead_ms past it: few turns)
        nxt = schedule.next_slot_after(sched, cursor, anchor_ms)
        if nxt is None:
            break
        t = max(t, nxt - ahead)
        if t > at_ms:
            break
        cursor = t + policy.phased_ahead_ms(name, t, ahead, span)
    return max(cursor, at_ms)


def explain(spec: Record, anchor_ms: int, down_from_ms: int, down_to_ms: int, name: str = "explain") -> dict[str, Any]:
    """What happens to a job's slots if the scheduler is down from ``down_from_ms`` and a leader
    fires at ``down_to_ms``: the same plan_fire the trigger loop runs, with the cursor where a
    leader keeping up had it at the start of the outage. A job that fires ahead
    (policy.fires_ahead) had its slots up to its last take-up's horizon committed already
    (``_committed_by``, ``fired_ahead``): runs queued before the outage, which start when it ends, whatever the
    misfire policy."""
    sched = spec["schedule"]
    cursor = down_from_ms
    fired_ahead = []
    if limits.fire_ahead_ms > 0 and policy.fires_ahead(spec):
        cursor = _committed_by(sched, anchor_ms, name, down_from_ms)
        for s in schedule.iter_slots(sched, down_from_ms, min(cursor, down_to_ms), anchor_ms, limits.max_catchup_max):
            fired_ahead.append({
                "slot": schedule.iso(s), "slot_ms": s, "start_lag_ms": max(0, down_to_ms - s),
                "why": "committed before the outage (fired ahead): queued already, it starts when a leader "
                       "is back, late, whatever the misfire policy"})
    plan = policy.plan_fire(spec, anchor_ms, cursor, down_to_ms, 0, name) if cursor < down_to_ms else None
    m = spec["misfire"]
    grace_ms = policy.grace_ms(m)
    runs = []
    # At most max_catchup_max slots run as on time (policy.plan_fire): the newest within grace_s.
    # Older ones within it count as missed, whatever their lateness.
    plan_runs = plan["runs"] if plan else []
    in_grace = [s for s in plan_runs if down_to_ms - s <= grace_ms]
    on_time = set(in_grace[-limits.max_catchup_max:])
    for s in plan_runs:
        late = down_to_ms - s
        runs.append({
            "slot": schedule.iso(s), "slot_ms": s, "fire_lag_ms": late,
            "why": "on time (within grace_s)" if s in on_time else
            ("missed" if late > grace_ms else _OVER_ON_TIME) + {
                "fire_all": "; fire_all runs the oldest max_catchup missed slots",
                "fire_once": "; fire_once runs the latest missed slot",
                "skip": "",
            }[m["policy"]],
        })
    recorded = []
    for state, reason, lo, hi, count in (plan["rec"] if plan else []):
        why = {
            ("skipped", "misfire"): "missed by more than grace_s; policy skip records them",
            ("coalesced", "misfire"): "missed; fire_once coalesces them into the latest missed slot's run",
            ("skipped", "catchup_limit"): "missed beyond max_catchup; fire_all records the rest",
        }.get((state, reason), reason)
        if state in ("skipped", "coalesced") and down_to_ms - hi <= grace_ms:
            why = (f"{_OVER_ON_TIME}; policy {m['policy']} records them"
                   if down_to_ms - lo <= grace_ms else f"{why}, or within it but {_OLDER_THAN_ON_TIME}")
        recorded.append({
            "state": state, "reason": reason, "from": schedule.iso(lo), "to": schedule.iso(hi),
            "count": count,
            # a range too long to count (a cron's, past cron_slots_counted_max): at least this many
            "count_at_least": count if count is not None else limits.cron_slots_counted_max + 1,
            "why": why,
        })
    nxt = plan["next"] if plan else schedule.next_slot_after(sched, max(down_to_ms, cursor), anchor_ms)
    if deadlines.skips_late(spec):
        _late_start(spec, fired_ahead, runs, down_to_ms)
    overlap = _overlap(spec, [r for r in runs if not r.get("withdrawn")], name)
    for r in runs:
        r.setdefault("overlap", None)
    return {
        "down_from": schedule.iso(down_from_ms), "down_to": schedule.iso(down_to_ms),
        "policy": m["policy"], "grace_s": m["grace_s"], "max_catchup": m["max_catchup"],
        "fired_ahead": fired_ahead, "runs": runs, "recorded": recorded, "overlap": overlap,
        # At least: a range too long to count adds its lower bound (slots_due_exact false).
        "slots_due": len(fired_ahead) + len(runs) + sum(r["count_at_least"] for r in recorded),
        "slots_due_exact": all(r["count"] is not None for r in recorded),
        "next_slot": schedule.iso(nxt),
    }


def _late_start(spec: Record, fired_ahead: list[dict[str, Any]], runs: list[dict[str, Any]], down_to_ms: int) -> None:
    """``deadline.late_start: skip``: a slot whose ``start_within_s`` has passed when a leader is
    back at ``down_to`` never starts. A slot the misfire policy runs is recorded skipped (reason
    ``late_start``) by that fire (core/fire.py), before its overlap policy; a run fired ahead
    before the outage is withdrawn by the leader's first sweep (core/cancel.py withdraw_late).
    Each gets ``withdrawn`` True and its ``why`` says so; a run of ``runs`` recorded so makes no
    other run's overlap (``overlap`` is then None for it, and ``overlap.runs`` does not count it)."""
    within_ms = spec["deadline"]["start_within_s"] * 1000
    said = f"its start_within_s ({within_ms // 1000} s) has passed when a leader is back (deadline.late_start: skip)"
    for it in fired_ahead:
        if it["slot_ms"] + within_ms <= down_to_ms:
            it["withdrawn"] = True
            it["why"] += f"; then withdrawn by the leader's first sweep: {said}, so it never starts"
    for it in runs:
        if it["slot_ms"] + within_ms <= down_to_ms:
            it["withdrawn"] = True
            it["why"] += f"; recorded skipped (late_start) by that fire instead: {said}"


#: What explain's overlap outcomes assume: nothing of the job's from before the outage is active.
_OVERLAP_ASSUMES = ("no run of the job from before the outage queued, running or waiting for a retry "
                    "when the leader fires at down_to, and room for these runs in the job's queue. One "
                    "that is active counts as one more (forbid and max_concurrent then record more slots, "
                    "and so does queue_one for one still queued or waiting for a retry; replace revokes "
                    "it too); a bounded queue that is full records slots queue_full instead")


def _overlap(spec: Record, runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The job's overlap policy applied to the slots the misfire policy turns into runs, as the
    fire at ``down_to`` decides them (fire.overlap, slot by slot in one entry: each run it makes
    is still queued when the next slot is decided). Each item of ``runs`` gets ``overlap``: None
    when the slot stays a run, else what becomes of it (``state``, ``why``, and ``reason`` for a
    slot recorded, ``error`` for a run revoked). Returns the policy, how many of the runs run
    (``runs``), and what that assumes. A job that runs after others: ``runs`` None, and each
    run's ``overlap`` None, undecided (its parents release each slot, and the policy decides it
    then).

    A job that fires ahead has an overlap policy that reads no other run (policy.fires_ahead),
    so its ``fired_ahead`` runs never count here."""
    ov = spec.get("overlap") or {"policy": "allow"}
    pol = ov["policy"]
    cap = ov.get("max_concurrent") if pol == "allow" else None
    out: dict[str, Any] = {"policy": pol}
    if cap is not None:
        out["max_concurrent"] = cap
    if "after" in spec:
        # A gated job's slot becomes a run when its parents release it (fire.py, pipehooks), and
        # the overlap policy decides it then, from the runs active at that time.
        for r in runs:
            r["overlap"] = None
        out["runs"] = None
        out["assumes"] = ("each slot waits for its parents (docs/pipelines.md): the overlap policy decides "
                          "it when they release it, from the job's runs active then")
        return out
    first = runs[0]["slot"] if runs else None
    kept = 0
    for k, r in enumerate(runs):
        fate: dict[str, Any] | None = None
        if pol == "allow":
            if cap is not None and kept >= cap:
                fate = {"state": "skipped", "reason": "overlap",
                        "why": f"overlap allow with max_concurrent {cap}: the runs of the {cap} slots before "
                               "it are still queued when it fires"}
        elif pol == "forbid":
            if k:
                fate = {"state": "skipped", "reason": "overlap",
                        "why": f"overlap forbid: the run of {first} is still queued when it fires"}
        elif pol == "queue_one":
            if k:
                fate = {"state": "coalesced", "reason": "overlap",
                        "why": f"overlap queue_one: the run of {first} is still queued (waiting) when it fires"}
        elif k + 1 < len(runs):  # replace: the next slot's run revokes it at once (fire.revoke)
            nxt = f"{name}@{runs[k + 1]['slot_ms']}"
            fate = {"state": "failed", "error": f"replaced by run {nxt} (overlap policy replace)",
                    "why": f"overlap replace: made, then revoked by the run of {runs[k + 1]['slot']} in the "
                           "same fire"}
        r["overlap"] = fate
        if fate is None:
            kept += 1
    out["runs"] = kept
    if pol != "allow" or cap is not None:
        out["assumes"] = _OVERLAP_ASSUMES
    return out
