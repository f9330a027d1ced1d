"""Deadlines judged per slot, and heartbeat jobs (core/deadlines.py): the pure core, no clock.

Every command is built as the proposer builds it (the trigger's compact plans with their ``dl``
items, deadline_judge with the cluster's time as ``now``) and applied through its bytes.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, deadlines, due, limits, model, pipelines, policy
from raftsched.core.errors import InvalidSpec
from raftsched.core.state import SchedulerState

from raftsched.core.notify_model import validate_routes, validate_sink

from core_helpers import DAY, HOUR, SEC, T0, apply, ms, new_state, put_cmd, raw_job, resume_cmd, snap_obj
from long_tests import examples


def spec(sched: dict, deadline: dict, policy_name: str = "fire_all", grace_s: int | None = None,
         max_catchup: int | None = None, executor: dict | None = None, **extra) -> dict:
    raw = raw_job(sched, policy_name, grace_s, max_catchup, deadline=deadline, **extra)
    if executor is not None:
        raw["executor"] = executor
    return model.validate_job("j", raw)


def tick(s: SchedulerState, now: int, ahead: bool = False) -> list[dict]:
    """One trigger tick: the fire of what is due, then the deadline sweep, each as the trigger
    proposes it. :returns: the results."""
    out = []
    entries, dl = [], []
    ahead_ms = limits.fire_ahead_ms if ahead else 0  # as the trigger fires ahead (node/trigger.py)
    span = ahead_ms + limits.fire_ahead_span_ms if ahead else 0
    names = due.pop_due(s, now, limits.fire_entries_max, ahead_ms)
    kids = pipelines.deadline_children(s, names)  # as node/trigger.py reads them
    for name in names:
        job = s.jobs[name]
        e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], now, job["gen"], name,
                                     span if policy.fires_ahead(job["spec"]) else 0)
        if e is None:
            due.repush(s, [name])
            continue
        entries.append(e)
        own = deadlines.fire_items(job["spec"], e, job["anchor"])
        dl.extend(own)
        if name in kids:
            used = sum(len(it[0].encode()) + deadlines.DL_ITEM_BYTES for it in own)
            dl.extend(deadlines.child_items(job["spec"], e, job["anchor"], kids[name], used))
    if entries:
        out.append(apply(s, commands.fire(now, entries=entries, dl=dl)))
    rids, names = deadlines.due(s, now, limits.deadline_judge_items_max)
    if rids or names:
        out.append(apply(s, commands.deadline_judge(now, runs=rids, jobs=names)))
    return out


def run_to(s: SchedulerState, start: int, end: int, step: int = SEC) -> None:
    t = start
    while t <= end:
        tick(s, t)
        t += step


def acquire(s: SchedulerState, now: int) -> list[dict]:
    res = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))
    assert res["ok"], res
    return res["runs"]


def complete(s: SchedulerState, now: int, grant: dict, success: bool) -> dict:
    return apply(s, commands.complete_many(now, None, worker="w", results=[
        {"run": grant["id"], "token": grant["token"], "success": success}]))


def rec(s: SchedulerState, rid: str) -> dict | None:
    return deadlines.slot_view(s, rid)


def told_state(*jobs: tuple[str, dict], now: int = T0) -> SchedulerState:
    """new_state, with a sink that hears of the jobs' deadline events: an event nobody is told of
    is not kept (core/events.py), so the tests that read the events route them somewhere."""
    s = new_state(now=now)
    sink = validate_sink("ops", {"type": "webhook", "url": "https://example.com/h", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(now, None, name="ops", spec=sink))["ok"]
    routes = validate_routes([{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}])
    for name, sp in jobs:
        assert apply(s, put_cmd(s, name, dict(sp, notify=routes), now))["ok"]
    return s


def deadline_events(s: SchedulerState) -> list[tuple]:
    return [(e["kind"], e["run_id"], e["reason"], e["detail"].get("deadline")) for e in s.outbox.events
            if e["kind"].startswith("deadline.")]


# ------------------------------------------------------------------ the spec
@pytest.mark.parametrize("raw, field", [
    ("03:00", "deadline"),
    ({}, "deadline"),
    ({"soon": 1}, "deadline.soon"),
    ({"start_within_s": 0}, "deadline.start_within_s"),
    ({"succeed_within_s": True}, "deadline.succeed_within_s"),
    ({"max_since_success_s": limits.deadline_s_max + 1}, "deadline.max_since_success_s"),
    ({"succeed_by": "3:00"}, "deadline.succeed_by"),
    ({"succeed_by": "24:00"}, "deadline.succeed_by"),
    ({"start_within_s": 600, "succeed_within_s": 60}, "deadline.start_within_s"),
])
def test_a_bad_deadline_is_refused_naming_its_field(raw, field) -> None:
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("j", raw_job({"every_s": 60}, deadline=raw))
    assert e.value.field == field


def test_a_heartbeat_job_runs_nothing_and_allows_no_overlap_policy_or_placement() -> None:
    sp = spec({"every_s": 60}, {"succeed_within_s": 30}, executor={"type": "heartbeat"})
    assert sp["executor"] == {"type": "heartbeat"}
    for extra, field in (({"overlap": {"policy": "forbid"}}, "overlap"),
                         ({"placement": {"labels": {"pool": "a"}}}, "placement")):
        with pytest.raises(InvalidSpec) as e:
            spec({"every_s": 60}, {"succeed_within_s": 30}, executor={"type": "heartbeat"}, **extra)
        assert e.value.field == field
    with pytest.raises(InvalidSpec) as e:
        spec({"every_s": 60}, {"succeed_within_s": 30}, executor={"type": "heartbeat", "argv": ["x"]})
    assert e.value.field == "executor.argv"


def test_no_tenant_policy_refuses_a_heartbeat_job_which_runs_nothing() -> None:
    from raftsched.core import tenants
    sp = spec({"every_s": 60}, {"succeed_within_s": 30}, executor={"type": "heartbeat"})
    strict = {"executors": ["http"], "labels": {"tenant": "billing"}, "allow": []}
    assert tenants.refusal(strict, sp) is None
    assert tenants.refusal(strict, spec({"every_s": 60}, {"succeed_within_s": 30}))[0] == "executor.type"


def test_succeed_by_is_local_time_on_the_slots_day_or_the_next_and_follows_dst() -> None:
    berlin = {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    # 02:00 Berlin (CEST, +2) on 2026-06-01; 03:00 the same day.
    assert deadlines.succeed_by_ms(berlin, "03:00", ms("2026-06-01T00:00:00Z")) == ms("2026-06-01T01:00:00Z")
    # A deadline before the slot's local time is the next day's.
    assert deadlines.succeed_by_ms(berlin, "01:00", ms("2026-06-01T00:00:00Z")) == ms("2026-06-01T23:00:00Z")
    # Spring forward (2026-03-29: 02:00 -> 03:00 CEST): 02:30 does not exist; the deadline is the
    # first instant after the gap.
    assert deadlines.succeed_by_ms(berlin, "02:30", ms("2026-03-28T23:30:00Z")) == ms("2026-03-29T01:00:00Z")
    # Fall back (2026-10-25: 03:00 CEST -> 02:00 CET): 02:30 happens twice: the first by default,
    # the second with fall_back: twice.
    slot = ms("2026-10-24T23:00:00Z")  # 01:00 CEST
    assert deadlines.succeed_by_ms(berlin, "02:30", slot) == ms("2026-10-25T00:30:00Z")
    assert deadlines.succeed_by_ms(dict(berlin, dst={"fall_back": "twice"}), "02:30", slot) == ms("2026-10-25T01:30:00Z")
    # Interval schedules: UTC.
    assert deadlines.succeed_by_ms({"every_s": 60}, "03:00", ms("2026-06-01T02:00:00Z")) == ms("2026-06-01T03:00:00Z")
    # A slot at the very time: it cannot succeed by the instant it falls due (it was judged
    # missed, never_started, a millisecond later): the next day's.
    assert deadlines.succeed_by_ms({"every_s": 60}, "03:00", ms("2026-06-01T03:00:00Z")) == ms("2026-06-02T03:00:00Z")
    assert deadlines.succeed_by_ms(berlin, "03:00", ms("2026-06-01T01:00:00Z")) == ms("2026-06-02T01:00:00Z")


# ------------------------------------------------------------------ per-slot judgement
def test_met_late_and_missed_each_by_its_own_slot() -> None:
    s = told_state(("j", spec({"every_s": 60}, {"succeed_within_s": 30})), now=T0)
    first = T0 + 60 * SEC
    run_to(s, first, first)
    (g,) = acquire(s, first + 1)
    complete(s, first + 10 * SEC, g, True)
    assert rec(s, f"j@{first}")["state"] == "met"
    # The next slot succeeds after its 30 s: missed at the instant, then late.
    second = first + 60 * SEC
    run_to(s, second, second + 31 * SEC)
    r = rec(s, f"j@{second}")
    assert (r["state"], r["cause"], r["deadline"], r["instant"]) == ("missed", "never_started", "succeed_within_s",
                                                                    second + 30 * SEC)
    (g,) = acquire(s, second + 40 * SEC)
    complete(s, second + 50 * SEC, g, True)
    assert rec(s, f"j@{second}")["state"] == "late"
    assert deadline_events(s) == [("deadline.missed", f"j@{second}", "never_started", "succeed_within_s"),
                                  ("deadline.late", f"j@{second}", None, "succeed_within_s")]


def test_a_retry_of_a_slot_can_meet_its_deadline_the_next_slots_run_cannot() -> None:
    sp = spec({"every_s": 60}, {"succeed_within_s": 50}, retry={"max_attempts": 3, "backoff_s": 1})
    s = new_state(("j", sp), now=T0)
    first = T0 + 60 * SEC
    run_to(s, first, first)
    (g,) = acquire(s, first)
    complete(s, first + SEC, g, False)  # attempt 1 fails: a retry of the same slot
    assert rec(s, f"j@{first}")["state"] == "pending"
    (g,) = acquire(s, first + 3 * SEC)
    assert g["id"] == f"j@{first}"
    complete(s, first + 4 * SEC, g, True)
    assert rec(s, f"j@{first}")["state"] == "met"
    # The next slot: its run never succeeds in time; the one after succeeds, and does not help.
    second, third = first + 60 * SEC, first + 120 * SEC
    run_to(s, second, third)
    grants = {g["id"]: g for g in acquire(s, third)}
    complete(s, third + SEC, grants[f"j@{third}"], True)
    assert rec(s, f"j@{third}")["state"] == "met"
    r = rec(s, f"j@{second}")
    assert (r["state"], r["cause"]) == ("missed", "never_started")


def test_a_dead_run_misses_at_once_and_a_still_running_one_is_said_so() -> None:
    sp = spec({"every_s": 600}, {"succeed_within_s": 300}, retry={"max_attempts": 1})
    s = new_state(("j", sp), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    (g,) = acquire(s, first)
    complete(s, first + SEC, g, False)  # dead: long before its instant
    r = rec(s, f"j@{first}")
    assert (r["state"], r["cause"], r["judged_at"]) == ("missed", "failed", first + SEC)
    second = first + 600 * SEC
    run_to(s, second, second)
    acquire(s, second)
    run_to(s, second + 300 * SEC, second + 300 * SEC)
    r = rec(s, f"j@{second}")
    assert (r["state"], r["cause"]) == ("missed", "still_running")
    assert "still running" in deadlines.explain(r)


def test_a_deadline_judged_late_names_the_cause_at_its_instant_not_at_the_sweep() -> None:
    """An on-call walk: the cluster down across a slot's succeed_within_s instant, its run started
    when it came back (13 s past the instant) and the first sweep said it missed "still_running";
    at the instant it had never started."""
    sp = spec({"every_s": 600}, {"succeed_within_s": 300}, retry={"max_attempts": 1})
    s = new_state(("j", sp), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)  # fired, queued; then no leader until 313 s later
    back = first + 313 * SEC
    (g,) = acquire(s, back)  # a worker takes it before the sweep judges it
    tick(s, back)
    r = rec(s, f"j@{first}")
    assert (r["state"], r["cause"]) == ("missed", "never_started"), r
    # One that started before its instant and runs past it is still running, as before.
    second = first + 600 * SEC
    run_to(s, second, second)
    acquire(s, second + SEC)
    run_to(s, second + 300 * SEC, second + 300 * SEC)
    assert rec(s, f"j@{second}")["cause"] == "still_running"


@pytest.mark.parametrize("deadline, which, after_s", [
    ({"start_within_s": 10, "succeed_within_s": 20}, "succeed_within_s", 20),
    ({"start_within_s": 10, "succeed_by": "23:59", "succeed_within_s": 20}, "succeed_within_s", 20),
    ({"start_within_s": 10}, "start_within_s", 10),
])
def test_a_run_that_started_in_time_and_died_names_the_deadline_it_missed(deadline, which, after_s) -> None:
    """A run that started on the dot and died (a timeout, no retry) did not miss its start
    deadline: the record names its succeed deadline, and the text says the run failed before it
    (a user's on-call was pointed at the start). With a start deadline only, that one."""
    sp = spec({"every_s": 600}, deadline, retry={"max_attempts": 1})
    s = new_state(("j", sp), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    (g,) = acquire(s, first)
    complete(s, first + 3 * SEC, g, False)
    r = rec(s, f"j@{first}")
    assert (r["state"], r["cause"], r["deadline"], r["instant"]) == ("missed", "failed", which, first + after_s * SEC)
    assert which.split("_")[0] in deadlines.explain(r) or which == "start_within_s"


def test_start_within_misses_when_the_run_has_not_started() -> None:
    s = new_state(("j", spec({"every_s": 600}, {"start_within_s": 10})), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first + 11 * SEC)
    r = rec(s, f"j@{first}")
    assert (r["state"], r["cause"], r["deadline"]) == ("missed", "never_started", "start_within_s")


def test_a_run_that_started_late_and_succeeded_at_its_first_attempt_is_late_by_its_start() -> None:
    """A success's attempt is not kept as a record of its own (records.attempts_of): when the run
    ends, its first start is still its own started_at."""
    s = new_state(("j", spec({"every_s": 600}, {"start_within_s": 10, "succeed_within_s": 60})), now=T0)
    first, second = T0 + 600 * SEC, T0 + 1200 * SEC
    run_to(s, first, first)  # no sweep between the fire and the finish: judged when it ends
    (g,) = acquire(s, first + 20 * SEC)
    complete(s, first + 25 * SEC, g, True)
    r = rec(s, f"j@{first}")
    assert (r["state"], r["deadline"], r["instant"]) == ("late", "start_within_s", first + 10 * SEC)
    run_to(s, second, second)
    (g,) = acquire(s, second + 5 * SEC)
    complete(s, second + 25 * SEC, g, True)
    assert rec(s, f"j@{second}")["state"] == "met"


def test_a_paused_job_misses_with_cause_paused() -> None:
    s = new_state(("j", spec({"every_s": 600}, {"succeed_within_s": 60})), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    assert apply(s, commands.pause_job(first + SEC, None, name="j"))["ok"]
    run_to(s, first + 61 * SEC, first + 61 * SEC)
    assert rec(s, f"j@{first}")["cause"] == "paused"


def test_skipped_slots_miss_at_once_and_max_since_success_catches_a_job_whose_every_slot_is_skipped() -> None:
    sp = spec({"every_s": 60}, {"succeed_within_s": 30, "max_since_success_s": 150}, policy_name="skip", grace_s=0)
    s = told_state(("j", sp), now=T0)
    # The leader is away 200 s: every slot is missed and recorded skipped by the first fire back.
    back = T0 + 200 * SEC
    run_to(s, back, back)
    missed = [r for r in deadlines.listing(s, "missed", "j", None, None, 100) if r["cause"] == "skipped"]
    assert missed, deadline_events(s)
    assert ("deadline.missed", None, "skipped", "max_since_success_s") in deadline_events(s)
    # Once a streak: the next sweeps add no second one.
    n = len(deadline_events(s))
    run_to(s, back + SEC, back + 5 * SEC)
    assert len(deadline_events(s)) == n
    # Armed again by a success; a new leader (a replica restored from a snapshot) judges the next
    # streak from the replicated base.
    trig = apply(s, commands.trigger_job(back + 6 * SEC, None, name="j"))
    (g,) = acquire(s, back + 6 * SEC)
    assert g["id"] == trig["run"]
    complete(s, back + 7 * SEC, g, True)
    r = SchedulerState()
    r.restore(s.snapshot())
    due.attach(r, due.DueIndex())
    run_to(r, back + 8 * SEC, back + 160 * SEC, 4 * SEC)
    streaks = [e for e in r.outbox.events if e["detail"].get("deadline") == "max_since_success_s"]
    assert len(streaks) == 2 and streaks[-1]["detail"]["since"] == back + 7 * SEC, streaks


def test_max_since_success_with_no_slot_due_since_says_no_slot_not_a_cause_that_did_not_happen() -> None:
    """A user's walk: a daily job with a manual success and a 60 s window missed with cause
    ``skipped`` ("the slot was recorded skipped or coalesced": nothing was), and a job never run
    with ``never_started`` ("its run had not started": there was none). No slot fell due in the
    window: ``no_slot``, said so; a slot that fell due and did not succeed still says why."""
    sp = spec({"every_s": 86_400}, {"max_since_success_s": 60}, policy_name="skip", grace_s=0)
    s = told_state(("daily", sp), ("never", sp), now=T0)
    trig = apply(s, commands.trigger_job(T0 + SEC, None, name="daily"))
    (g,) = acquire(s, T0 + SEC)
    assert g["id"] == trig["run"]
    complete(s, T0 + 2 * SEC, g, True)
    run_to(s, T0 + 3 * SEC, T0 + 70 * SEC, 4 * SEC)
    got = {(ev["job"], ev["reason"]) for ev in s.outbox.events if ev["detail"].get("deadline") == "max_since_success_s"}
    assert got == {("daily", "no_slot"), ("never", "no_slot")}, got
    r = [x for x in deadlines.listing(s, "missed", "daily", None, None, 10) if x["deadline"] == "max_since_success_s"]
    assert r and "no slot of the job fell due" in deadlines.explain(r[0])


def test_a_job_paused_past_max_since_success_misses_with_cause_paused_and_is_told() -> None:
    """A job paused after a success missed its max_since_success_s with cause ``skipped`` (its
    last run succeeded: the rule for every slot since not running won over the pause), and the
    event was not routed: nothing is told of a paused job. It is ``paused`` now, and told (the
    miss is what catches a pause forgotten); a per-slot miss of a paused job still is not."""
    sp = spec({"every_s": 60}, {"max_since_success_s": 150})
    s = told_state(("j", sp), now=T0)
    trig = apply(s, commands.trigger_job(T0 + SEC, None, name="j"))
    (g,) = acquire(s, T0 + SEC)
    assert g["id"] == trig["run"]
    complete(s, T0 + 2 * SEC, g, True)
    assert apply(s, commands.pause_job(T0 + 3 * SEC, None, name="j"))["ok"]
    run_to(s, T0 + 4 * SEC, T0 + 200 * SEC, 4 * SEC)
    (r,) = [r for r in deadlines.listing(s, "missed", "j", None, None, 100)]
    assert (r["deadline"], r["cause"]) == ("max_since_success_s", "paused"), r
    told = [e for e in s.outbox.events if e["kind"] == "deadline.missed"]
    assert len(told) == 1 and told[0]["detail"]["cause"] == "paused" and told[0]["to"] == ["ops"], told


def test_under_fire_once_each_coalesced_slot_is_judged_on_its_own() -> None:
    s = told_state(("j", spec({"every_s": 60}, {"succeed_within_s": 30}, policy_name="fire_once", grace_s=5)), now=T0)
    back = T0 + 640 * SEC  # ten slots missed: the last runs, nine are coalesced into one record
    tick(s, back)
    (rec_entry,) = [r for r in s.runs.values() if r["state"] == "coalesced"]
    assert rec_entry["count"] == 9
    for k in range(1, 10):
        r = rec(s, f"j@{T0 + k * 60 * SEC}")
        assert (r["state"], r["cause"], r["instant"]) == ("missed", "skipped", T0 + k * 60 * SEC + 30 * SEC), k
    r = rec(s, f"j@{T0 + 600 * SEC}")  # the run: judged by its own state, its instant passed already
    assert (r["state"], r["cause"]) == ("missed", "never_started")
    assert len([e for e in s.outbox.events if e["kind"] == "deadline.missed"]) == 10


def test_a_long_catch_up_fits_its_command_and_tracks_its_newest_slots() -> None:
    name = "n" * limits.job_name_chars_max
    sp = spec({"every_s": 1}, {"succeed_within_s": 30}, policy_name="fire_all", grace_s=0,
              max_catchup=limits.max_catchup_max)
    s = new_state((name, sp), now=T0)
    res = tick(s, T0 + 3 * HOUR)  # apply encodes the command: past 32 KB it would raise
    assert all(x["ok"] for x in res), res
    tracked = sorted(r["slot"] for r in s.deadlines.slots.values())
    runs = sorted(r["slot"] for r in s.runs.values() if r["kind"] == "scheduled")
    assert len(runs) >= limits.max_catchup_max and 16 <= len(tracked) < len(runs)
    assert max(set(runs) - set(tracked)) < min(tracked)  # the newest are tracked


def test_a_deadline_that_falls_in_a_leaderless_gap_is_judged_by_the_next_leader() -> None:
    s = new_state(("j", spec({"every_s": 600}, {"succeed_within_s": 60})), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    # The leader dies; its successor restores from a snapshot and attaches a due index.
    follower = SchedulerState()
    follower.restore(s.snapshot())
    due.attach(follower, due.DueIndex())
    back = first + 3600 * SEC  # long after the instant
    tick(follower, back)
    r = rec(follower, f"j@{first}")
    assert (r["state"], r["instant"], r["judged_at"]) == ("missed", first + 60 * SEC, back)


def test_jobs_without_deadlines_add_nothing_and_a_malformed_sweep_or_ping_changes_nothing() -> None:
    s = new_state(("j", model.validate_job("j", raw_job({"every_s": 60}))), now=T0)
    before = s.snapshot()
    run_to(s, T0 + 60 * SEC, T0 + 60 * SEC)
    assert not s.deadlines.slots and deadlines.due(s, T0 + DAY, 10) == ([], [])
    h = snap_obj(s, drop=("applied", "now_ms"))
    for cmd in (commands.make("deadline_judge", T0 + DAY, None, runs="j@1", jobs=[]),
                commands.make("deadline_judge", T0 + DAY, None, runs=[1], jobs=[]),
                commands.make("ping", T0 + DAY, None, name="j", status="done"),
                commands.make("fire", T0 + DAY, None, entries=[], dl=[["j", 1, 2]])):
        res = apply(s, cmd)
        assert not res["ok"] and res["error"]["code"] == "invalid_command", res
    assert s.snapshot() != before and snap_obj(s, drop=("applied", "now_ms")) == h


def test_snapshots_keep_the_records_and_replicas_stay_byte_identical() -> None:
    sp = spec({"every_s": 60}, {"succeed_within_s": 30, "max_since_success_s": 3600})
    a = new_state(("j", sp), now=T0)
    b = SchedulerState()
    cmds: list[dict] = []
    orig = a.apply

    def record(cmd: dict) -> dict:
        cmds.append(cmd)
        return orig(cmd)

    a.apply = record  # type: ignore[method-assign]
    b.restore(a.snapshot())
    run_to(a, T0 + 60 * SEC, T0 + 200 * SEC, 10 * SEC)
    for c in cmds:
        b.apply(c)
    assert a.deadlines.slots and snap_obj(a) == snap_obj(b)
    c = SchedulerState()
    c.restore(a.snapshot())
    assert c.snapshot() == a.snapshot() and c.deadlines == a.deadlines


def test_pending_deadlines_are_bounded_the_oldest_missing_as_untracked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "deadlines_pending_max", 2)
    monkeypatch.setattr(limits, "deadlines_kept_max", 3)
    s = new_state(("j", spec({"every_s": 60}, {"succeed_within_s": 3000})), now=T0)
    run_to(s, T0 + 60 * SEC, T0 + 300 * SEC, 60 * SEC)
    book = s.deadlines
    assert book.pending <= 2 and len(book.slots) <= 2 + 3
    assert [r["cause"] for r in deadlines.listing(s, "missed", None, None, None, 10)] == ["untracked"] * 3


# ------------------------------------------------------------------ heartbeat jobs
def test_a_heartbeat_job_is_never_leased_and_pings_move_its_slot() -> None:
    sp = spec({"every_s": 600}, {"start_within_s": 60, "succeed_within_s": 300}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    assert s.runs[f"hb@{first}"]["state"] == "waiting"
    assert acquire(s, first + SEC) == []
    res = apply(s, commands.ping(first + 5 * SEC, None, name="hb", status="start", slot=None))
    assert res["ok"] and res["run"] == f"hb@{first}" and res["state"] == "running"
    res = apply(s, commands.ping(first + 9 * SEC, None, name="hb", status="success", slot=None))
    assert res["state"] == "succeeded" and rec(s, f"hb@{first}")["state"] == "met"
    # Not pinged: the next slot misses its start deadline.
    second = first + 600 * SEC
    run_to(s, second, second + 61 * SEC)
    r = rec(s, f"hb@{second}")
    assert (r["state"], r["cause"], r["deadline"]) == ("missed", "never_started", "start_within_s")
    # A late success with its slot named: late. A ping for an ended run is a conflict.
    res = apply(s, commands.ping(second + 400 * SEC, None, name="hb", status="success", slot=second))
    assert res["ok"] and rec(s, f"hb@{second}")["state"] == "late"
    res = apply(s, commands.ping(second + 401 * SEC, None, name="hb", status="fail", slot=second))
    assert not res["ok"] and res["error"]["code"] == "conflict"
    res = apply(s, commands.ping(second + 401 * SEC, None, name="hb", status="fail", slot=second + 1))
    assert not res["ok"] and res["error"]["code"] == "not_found"
    # A ping a little before a slot committed ahead is that slot's; before it is committed, nobody's.
    third = second + 600 * SEC
    res = apply(s, commands.ping(third - 5 * SEC, None, name="hb", status="start", slot=None))
    assert res["error"]["code"] == "conflict", res
    tick(s, third - 900, ahead=True)  # the trigger commits it ahead of its time
    assert s.runs[f"hb@{third}"]["state"] == "waiting"
    res = apply(s, commands.ping(third - 800, None, name="hb", status="start", slot=None))
    assert res["ok"] and res["run"] == f"hb@{third}", res


def test_a_ping_is_a_slot_committed_ahead_only_within_2_s_of_it() -> None:
    """A heartbeat job every 3 s has a slot committed up to 4 s ahead (fire_ahead_ms +
    fire_ahead_span_ms), but a ping without a slot is a coming slot's only within PING_AHEAD_MS
    (2 s, what it was before the span grew): nodes of either version decide a ping alike."""
    assert deadlines.PING_AHEAD_MS == 2000
    s = new_state(("hb", spec({"every_s": 3}, {"succeed_within_s": 60}, executor={"type": "heartbeat"})), now=T0)
    first = s.jobs["hb"]["next"]
    tick(s, first - 1000, ahead=True)
    assert [r["slot"] for r in s.runs.values()] == [first, first + 3 * SEC]  # the second 4 s ahead
    assert apply(s, commands.ping(first, None, name="hb", status="success", slot=first))["ok"]
    res = apply(s, commands.ping(first + 500, None, name="hb", status="start", slot=None))
    assert res["error"]["code"] == "conflict", res
    assert s.runs[f"hb@{first + 3 * SEC}"]["state"] == "waiting"
    res = apply(s, commands.ping(first + 1100, None, name="hb", status="start", slot=None))
    assert res["ok"] and res["run"] == f"hb@{first + 3 * SEC}", res


def test_a_ping_without_a_slot_is_the_coming_slots_over_an_older_one_still_open() -> None:
    """The node resolves a ping without a slot (deadlines.ping_target) before it proposes it: a
    ping up to PING_AHEAD_MS before a slot is that slot's, over an older slot nothing pinged
    (counted for it, the older slot was judged late and the one that ran missed); not committed
    yet, it is waited for; an end goes to the slot started first; otherwise the newest that came."""
    sp = spec({"every_s": 10}, {"start_within_s": 3}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    s1 = s.jobs["hb"]["next"]
    run_to(s, s1 - 2 * SEC, s1)  # s1 opens; nothing pings it
    s2 = s1 + 10 * SEC
    assert s.jobs["hb"]["next"] == s2
    assert deadlines.ping_target(s, "hb", "start", s1 + 500) == (s1, False)  # just after s1: s1's
    assert deadlines.ping_target(s, "hb", "start", s2 - 1500) == (None, True), "s2 is not committed yet: wait"
    assert deadlines.ping_target(s, "hb", "start", s2 - 2500) == (s1, False)  # further from s2 than 2 s
    tick(s, s2 - 900, ahead=True)  # the trigger commits s2 ahead
    assert s.runs[f"hb@{s2}"]["state"] == "waiting" and s.runs[f"hb@{s1}"]["state"] == "waiting"
    assert deadlines.ping_target(s, "hb", "start", s2 - 800) == (s2, False), "the coming slot, not s1"
    assert apply(s, commands.ping(s2 - 800, None, name="hb", status="start", slot=s2))["state"] == "running"
    assert deadlines.ping_target(s, "hb", "success", s2 + 500) == (s2, False)
    # an end goes to a run that started, before one still waiting
    assert deadlines.ping_target(s, "hb", "success", s2 + 9_500) == (s2, False)
    assert deadlines.ping_target(s, "nope", "start", s2) == (None, False)


def _ping_as_the_node(s, name: str, status: str, now: int) -> dict:
    """A ping without a slot as the node sends it: resolved by ping_target (whose refusal the node
    answers itself), proposed with it."""
    from raftsched.core.errors import Conflict
    try:
        slot, wait = deadlines.ping_target(s, name, status, now)
    except Conflict as e:
        return {"ok": False, "error": e.to_dict()}
    assert not wait
    return apply(s, commands.ping(now, None, name=name, status=status, slot=slot))


@pytest.mark.parametrize("status", ["success", "start"])
def test_a_ping_sent_twice_to_a_slot_opened_by_hand_is_refused_too_and_a_paused_job_says_paused(status: str) -> None:
    """A review: the slot at hand opened by hand (NAME@SLOT!manual-N) was left to apply's own rule,
    which took the newest slot still waiting: a second success ping closed an older slot nothing
    had pinged, as succeeded and late. It is refused (409) as any ended slot at hand; a start sent
    twice answers as for any start. A ping of a paused job whose slot at hand is held by the
    pause says it is paused."""
    sp = spec({"every_s": 60}, {"start_within_s": 5, "succeed_within_s": 15}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    s1 = s.jobs["hb"]["next"]
    run_to(s, s1 - 2 * SEC, s1 + 20 * SEC)  # s1 came, nothing pinged it: missed
    opened = apply(s, commands.make("trigger_job", s1 + 21 * SEC, None, name="hb"))
    assert opened["ok"] and "!manual-" in opened["run"], opened
    first = _ping_as_the_node(s, "hb", status, s1 + 22 * SEC)
    assert first["ok"] and first["run"] == opened["run"], first
    again = _ping_as_the_node(s, "hb", status, s1 + 23 * SEC)
    if status == "start":
        assert again["ok"] and again["run"] == opened["run"] and again["state"] == "running", again
    else:
        assert again["error"]["code"] == "conflict" and opened["run"] in again["error"]["message"], again
    assert s.runs[f"hb@{s1}"]["state"] == "waiting" and rec(s, f"hb@{s1}")["state"] == "missed"
    # Paused: its slot fired ahead is held, and is the slot at hand once it came: "paused".
    if status == "start":
        return  # (the run started by hand takes the next end ping, paused or not)
    s2 = s1 + 60 * SEC
    tick(s, s2 - 900, ahead=True)  # s2 committed ahead, then the job paused: s2 held
    assert apply(s, commands.make("pause_job", s2 - 800, None, name="hb"))["ok"]
    held = s.runs[f"hb@{s2}"]
    assert held["state"] == "waiting" and held.get("due", 0) is None
    paused = _ping_as_the_node(s, "hb", "success", s2 + SEC)
    assert not paused["ok"] and "paused" in paused["error"]["message"], paused
    assert s.runs[f"hb@{s1}"]["state"] == "waiting"


@pytest.mark.parametrize("status", ["success", "fail", "start"])
def test_a_ping_sent_twice_is_refused_and_never_taken_for_an_older_slot_nothing_pinged(status: str) -> None:
    """A dead-man's switch pinged twice (a retried curl): the second ping is the same slot's, which
    the first ended (409), not an older slot nothing pinged, whose miss must stand (it was
    closed succeeded and judged late, a deadline.late told for a run that never happened). The
    same for a ping up to 2 s before a slot, which is that slot's."""
    sp = spec({"every_s": 20}, {"start_within_s": 5, "succeed_within_s": 15}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    s1 = s.jobs["hb"]["next"]
    s2 = s1 + 20 * SEC
    run_to(s, s1 - 2 * SEC, s2 + SEC)  # s1 came and went, nothing pinged it; s2 came
    assert rec(s, f"hb@{s1}")["state"] == "missed" and s.runs[f"hb@{s1}"]["state"] == "waiting"
    first = _ping_as_the_node(s, "hb", status, s2 + 2 * SEC)
    assert first["ok"] and first["run"] == f"hb@{s2}", first
    again = _ping_as_the_node(s, "hb", status, s2 + 3 * SEC)
    if status == "start":  # a start of the slot already started: the same answer, nothing moves
        assert again["ok"] and again["run"] == f"hb@{s2}" and again["state"] == "running", again
    else:
        assert again["error"]["code"] == "conflict" and f"hb@{s2}" in again["error"]["message"], again
    assert s.runs[f"hb@{s1}"]["state"] == "waiting" and rec(s, f"hb@{s1}")["state"] == "missed"
    # A ping a little before the next slot is that slot's; sent twice, the second is refused too.
    if status == "start":
        assert apply(s, commands.ping(s2 + 4 * SEC, None, name="hb", status="success", slot=s2))["ok"]
    s3 = s2 + 20 * SEC
    tick(s, s3 - 900, ahead=True)  # the trigger commits s3 ahead
    end = "success" if status == "start" else status
    assert _ping_as_the_node(s, "hb", end, s3 - 800)["run"] == f"hb@{s3}"
    assert _ping_as_the_node(s, "hb", end, s3 - 700)["error"]["code"] == "conflict"
    assert s.runs[f"hb@{s1}"]["state"] == "waiting"
    # Its slot named, a late report for s1 is still taken: late.
    assert apply(s, commands.ping(s3, None, name="hb", status="success", slot=s1))["ok"]
    assert rec(s, f"hb@{s1}")["state"] == "late"


def test_a_heartbeat_jobs_pings_make_its_health_and_a_fail_ping_is_told_as_its_runs_death() -> None:
    """A user's walk: after success pings and unpinged slots the job's health still said it never
    succeeded, and a route on run.succeeded heard nothing. A success ping is the slot's success
    (health, run.succeeded, job.recovered closing an incident); a fail ping its death (nothing
    retries it): consecutive_failures, an incident told once as run.dead, pause_on_failure."""
    from raftsched.core.notify import view_health
    s = new_state(now=T0)
    sink = validate_sink("ops", {"type": "webhook", "url": "https://example.com/h", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=sink))["ok"]
    routes = validate_routes([{"sink": "ops", "on": ["run.dead", "job.recovered", "run.succeeded", "job.paused"]}])
    sp = spec({"every_s": 10}, {"succeed_within_s": 9}, executor={"type": "heartbeat"})
    assert apply(s, put_cmd(s, "hb", dict(sp, notify=routes, pause_on_failure={"after_consecutive": 2}), T0))["ok"]
    s1 = s.jobs["hb"]["next"]
    run_to(s, s1 - 2 * SEC, s1)
    assert apply(s, commands.ping(s1 + SEC, None, name="hb", status="success", slot=s1))["ok"]
    h = view_health(s.health.get("hb"))
    assert h["last_success_at"] == s1 + SEC and h["last_slot_outcome"] == {"slot": s1, "outcome": "succeeded",
                                                                           "reason": None}
    s2 = s1 + 10 * SEC
    run_to(s, s1 + 2 * SEC, s2)
    assert apply(s, commands.ping(s2 + SEC, None, name="hb", status="fail", slot=s2))["ok"]
    h = view_health(s.health["hb"])
    assert h["consecutive_failures"] == 1 and h["incident"] is not None and h["last_failure_at"] == s2 + SEC
    dead = [e for e in s.outbox.events if e["kind"] == "run.dead"]
    assert [(e["run_id"], e["reason"]) for e in dead] == [(f"hb@{s2}", "a fail ping")]
    s3 = s2 + 10 * SEC
    run_to(s, s2 + 2 * SEC, s3)
    assert apply(s, commands.ping(s3 + SEC, None, name="hb", status="success", slot=s3))["ok"]
    assert view_health(s.health["hb"])["incident"] is None
    assert [e["kind"] for e in s.outbox.events] == ["run.succeeded", "run.dead", "job.recovered", "run.succeeded"]
    # Two fail pings in a row: paused, as any job whose runs die.
    for k in (4, 5):
        sk = s1 + (k - 1) * 10 * SEC
        run_to(s, sk - 8 * SEC, sk)
        assert apply(s, commands.ping(sk + SEC, None, name="hb", status="fail", slot=sk))["ok"]
    assert s.jobs["hb"]["paused"] and s.outbox.events[-1]["kind"] == "job.paused"


def test_a_heartbeat_job_pinged_before_its_first_slot_is_refused_until_a_trigger_opens_one() -> None:
    """README's heartbeat example: right after the job is made nothing waits for a ping (409);
    a trigger without a body opens a slot, which the pings then start and end, its deadlines
    judged as any slot's (docs/notifications.md, "Heartbeat jobs")."""
    sp = spec({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, {"start_within_s": 600, "succeed_by": "04:00"},
              "skip", executor={"type": "heartbeat"})
    s = new_state(("backup", sp), now=T0)
    res = apply(s, commands.ping(T0 + SEC, None, name="backup", status="start", slot=None))
    assert res["error"]["code"] == "conflict" and "has not fired" in res["error"]["message"], res
    opened = apply(s, commands.make("trigger_job", T0 + 2 * SEC, None, name="backup"))
    assert opened["ok"] and opened["state"] == "waiting", opened
    res = apply(s, commands.ping(T0 + 3 * SEC, None, name="backup", status="start", slot=None))
    assert res["ok"] and (res["run"], res["state"]) == (opened["run"], "running"), res
    res = apply(s, commands.ping(T0 + 4 * SEC, None, name="backup", status="success", slot=None))
    assert res["ok"] and (res["run"], res["state"]) == (opened["run"], "succeeded"), res


def test_a_slot_opened_by_hand_is_pinged_through_the_node_and_by_its_slot() -> None:
    """The README's path broke: the node resolves a ping without a slot (ping_target) and
    proposes it with that slot, and apply looked the slot up as NAME@SLOT, which a slot opened by
    hand (NAME@SLOT!manual-N) is not: 404. ping_target leaves such a run to apply's own rule, and
    apply finds a run of the slot among the job's runs when NAME@SLOT is none."""
    sp = spec({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, {"start_within_s": 600},
              "skip", executor={"type": "heartbeat"})
    s = new_state(("backup", sp), now=T0)
    opened = apply(s, commands.make("trigger_job", T0 + 2 * SEC, None, name="backup"))
    assert opened["ok"] and "!manual-" in opened["run"], opened
    slot = s.runs[opened["run"]]["slot"]
    assert deadlines.ping_target(s, "backup", "start", T0 + 3 * SEC) == (None, False)
    res = apply(s, commands.ping(T0 + 3 * SEC, None, name="backup", status="start", slot=slot))
    assert res["ok"] and (res["run"], res["state"]) == (opened["run"], "running"), res
    res = apply(s, commands.ping(T0 + 4 * SEC, None, name="backup", status="success", slot=slot))
    assert res["ok"] and (res["run"], res["state"]) == (opened["run"], "succeeded"), res
    res = apply(s, commands.ping(T0 + 5 * SEC, None, name="backup", status="success", slot=slot + 1))
    assert res["error"]["code"] == "not_found", res


def test_a_fail_ping_misses_at_once_and_a_ping_for_another_job_is_refused() -> None:
    s = new_state(("hb", spec({"every_s": 600}, {"succeed_within_s": 300}, executor={"type": "heartbeat"})),
                  ("py", spec({"every_s": 600}, {"succeed_within_s": 300})), now=T0)
    first = T0 + 600 * SEC
    run_to(s, first, first)
    assert apply(s, commands.ping(first + SEC, None, name="hb", status="fail", slot=None))["state"] == "failed"
    r = rec(s, f"hb@{first}")
    assert (r["state"], r["cause"]) == ("missed", "failed")
    res = apply(s, commands.ping(first + SEC, None, name="py", status="start", slot=None))
    assert res["error"]["code"] == "conflict" and "not a heartbeat job" in res["error"]["message"]


def test_a_heartbeat_job_never_pinged_keeps_a_bounded_number_of_runs_open() -> None:
    s = new_state(("hb", spec({"every_s": 60}, {"succeed_within_s": 3600}, executor={"type": "heartbeat"})), now=T0)
    run_to(s, T0 + 60 * SEC, T0 + 60 * SEC * (limits.heartbeat_open_max + 5), 60 * SEC)
    open_runs = [r for r in s.runs.values() if r["state"] == "waiting"]
    assert len(open_runs) == limits.heartbeat_open_max
    assert any(r.get("reason") == "not_pinged" for r in s.runs.values())
    closed = [d for d in deadlines.listing(s, "missed", "hb", None, None, 100) if d["judged_at"] < d["instant"]]
    assert closed and {d["cause"] for d in closed} == {"never_started"}, closed


# ------------------------------------------------------------------ properties
POLICIES = ("fire_all", "fire_once", "skip")


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_name=st.sampled_from(POLICIES), every=st.sampled_from([60, 300]),
       within=st.integers(1, 600), gap=st.integers(0, 1200), done_after=st.one_of(st.none(), st.integers(0, 900)),
       zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]), dst_day=st.booleans())
def test_every_slot_is_judged_once_by_its_own_run(policy_name, every, within, gap, done_after, zone, dst_day) -> None:
    """Under every misfire policy, with a leaderless gap of random length (near a DST change in
    some cases): every slot fired with a deadline ends judged exactly once (met, late or missed
    with a cause), by its own run; the judgement is the same on a replica restored mid-way."""
    start = ms("2026-03-29T00:00:00Z") if dst_day else T0
    sched = {"every_s": every} if zone == "UTC" else {"cron": f"*/{every // 60} * * * *", "timezone": zone}
    sp = spec(sched, {"succeed_within_s": within, "succeed_by": "02:45"}, policy_name=policy_name, grace_s=30,
              max_catchup=3)
    s = new_state(("j", sp), now=start)
    t = start + every * SEC
    end = t + 4 * every * SEC + gap * SEC + DAY
    lead = True
    gap_from = t + every * SEC
    while t <= end:
        in_gap = gap_from <= t < gap_from + gap * SEC
        if in_gap:
            lead = False
        else:
            if not lead:
                r = SchedulerState()
                r.restore(s.snapshot())
                assert r.snapshot() == s.snapshot()
                due.attach(r, due.DueIndex())
                s, lead = r, True
            tick(s, t)
            if done_after is not None:
                for g in acquire(s, t):
                    slot = s.runs[g["id"]]["slot"]
                    complete(s, max(t, slot + done_after * SEC), g, True)
        t += max(every * SEC // 2, 30 * SEC) if t < end - DAY else HOUR
    # Paused, and judged once every instant has passed: nothing stays pending.
    assert apply(s, commands.pause_job(t, None, name="j"))["ok"]
    tick(s, t + 2 * DAY)
    book = s.deadlines
    judged = {rid: r for rid, r in book.slots.items() if r["slot"] is not None}
    assert judged
    for rid, r in judged.items():
        run = s.runs.get(rid)
        assert r["state"] != "pending", (rid, r)
        if run is None:  # trimmed from the job's history once it ended (judged by then)
            continue
        if r["state"] == "met":
            assert run["state"] == "succeeded" and run["finished_at"] <= min(x for x in (r["within"], r["by"]) if x)
        elif r["state"] == "late":
            assert run["state"] == "succeeded"
        else:
            assert r["cause"] in deadlines.CAUSES
            if run is not None and run["state"] in ("skipped", "coalesced"):
                assert r["cause"] == "skipped"
    missed_events = [e for e in s.outbox.events if e["kind"] == "deadline.missed" and e["run_id"]]
    assert len({e["run_id"] for e in missed_events}) == len(missed_events)  # once a slot


# ------------------------------------------------------------------ pipeline children
def test_a_pipeline_childs_slot_deadline_is_carried_by_its_roots_fire_and_judged_like_any():
    """A triggered child's per-slot deadline is counted from its slot (its root's), tracked by
    the root's fire (deadlines.child_items) before the child's run exists: missed with cause
    ``upstream`` while its parents keep it waiting (then ``late`` when it still succeeds), and
    missed for good when its parents' outcome records the slot."""
    from pipeline_helpers import put
    from raftsched.core import pipelines as _p  # noqa: F401  (binds the hooks)
    s = new_state()
    routes = validate_routes([{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}])
    sink = validate_sink("ops", {"type": "webhook", "url": "https://example.com/h", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=sink))["ok"]
    ex = {"type": "python", "target": "app.jobs:run"}
    assert put(s, "a", {"schedule": {"every_s": 60}, "executor": ex, "misfire": {"policy": "fire_all"},
                        "retry": {"max_attempts": 1}})["ok"]
    assert put(s, "b", {"after": ["a"], "executor": ex, "deadline": {"succeed_within_s": 20}, "notify": routes})["ok"]
    s1, s2, s3 = T0 + 60 * SEC, T0 + 120 * SEC, T0 + 180 * SEC

    def run_all(now, ok_for=lambda job: True):
        for g in acquire(s, now):
            assert complete(s, now, g, ok_for(g["job"]))["ok"]

    # s1: a succeeds at once, b succeeds in time: met
    tick(s, s1)
    assert rec(s, f"b@{s1}")["state"] == "pending"  # tracked before b's run exists
    run_all(s1 + SEC)
    run_all(s1 + 2 * SEC)
    assert rec(s, f"b@{s1}")["state"] == "met"
    # s2: a is still running at b's deadline: missed, cause upstream; b then succeeds: late
    tick(s, s2)
    (ga,) = acquire(s, s2 + SEC)
    tick(s, s2 + 21 * SEC)
    r = rec(s, f"b@{s2}")
    assert (r["state"], r["cause"], r["deadline"]) == ("missed", "upstream", "succeed_within_s")
    assert complete(s, s2 + 30 * SEC, ga, True)["ok"]
    run_all(s2 + 31 * SEC)
    assert rec(s, f"b@{s2}")["state"] == "late"
    # s3: a dies: b's slot is recorded upstream_failed, and its deadline missed at once
    tick(s, s3)
    run_all(s3 + SEC, ok_for=lambda job: job != "a")
    r = rec(s, f"b@{s3}")
    assert (s.runs[f"b@{s3}"]["reason"], r["state"], r["cause"]) == ("upstream_failed", "missed", "upstream")
    told = [(k, rid) for k, rid, _reason, _d in deadline_events(s)]
    assert told == [("deadline.missed", f"b@{s2}"), ("deadline.late", f"b@{s2}"), ("deadline.missed", f"b@{s3}")]


def test_a_descendants_deadline_is_not_tracked_when_its_roots_fire_entry_is_stale():
    from pipeline_helpers import put
    s = new_state()
    ex = {"type": "python", "target": "app.jobs:run"}
    a = {"schedule": {"every_s": 60}, "executor": ex, "misfire": {"policy": "fire_all"}}
    assert put(s, "a", a)["ok"]
    assert put(s, "b", {"after": ["a"], "executor": ex, "deadline": {"succeed_within_s": 20}})["ok"]
    s1 = T0 + 60 * SEC
    names = due.pop_due(s, s1, limits.fire_entries_max, 0)
    job = s.jobs["a"]
    e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], s1, job["gen"], "a", 0)
    dl = deadlines.child_items(job["spec"], e, job["anchor"], pipelines.deadline_children(s, names)["a"])
    assert [it[0] for it in dl] == ["b"] and dl[0][6] == "a"
    assert put(s, "a", dict(a, timeout_s=99), now=s1 - SEC)["ok"]  # a replaced: the planned entry is stale
    res = apply(s, commands.fire(s1, entries=[e], dl=dl))
    assert res["ok"] and res["stale_jobs"] == ["a"]
    assert rec(s, f"b@{s1}") is None
    bad = [dl[0][:6] + [7]]
    assert apply(s, commands.fire(s1, entries=[e], dl=bad))["error"]["code"] == "invalid_command"


def test_a_job_made_a_heartbeat_job_while_a_worker_holds_its_run_ends_that_lease():
    """Closing a leased run (a worker's, from before the executor became heartbeat) ends its
    lease as a revocation does: the lease indexes then hold what a restore rebuilds, and once
    the run is trimmed the reaper's read does not meet a run that is gone (found by a review)."""
    from raftsched.core import queries
    s = new_state()
    raw = raw_job({"every_s": 1}, "fire_all", grace_s=3600, history=100)
    now = T0
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, now), now))["ok"]

    def fire_to(t):
        j = s.jobs["j"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], "j")
        if e is not None:
            assert apply(s, commands.make("fire", t, None, entries=[e]))["ok"]
    now += SEC
    fire_to(now)
    g = apply(s, commands.make("acquire", now, None, worker="w", queues=None, max=1, ttl=600_000))["runs"][0]
    raw["executor"] = {"type": "heartbeat"}
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, now), now))["ok"]
    for _ in range(17):
        now += SEC
        fire_to(now)
    run = s.runs[g["id"]]
    assert run["state"] == "failed" and g["id"] not in s._running_ids and run["attempts"][-1]["ok"] is False
    restored = SchedulerState()
    restored.restore(s.snapshot())
    counts = {q: n for q, n in s._running_count.items() if n}  # (a queue's 0 is no count)
    assert list(restored._running_ids) == list(s._running_ids) and restored._running_count == counts
    take = commands.make("takeover", now, None, node="n2")
    assert apply(s, take) == apply(restored, take) and s.snapshot() == restored.snapshot()
    raw["history"] = 1
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, now), now))["ok"]
    for _ in range(20):
        now += SEC
        fire_to(now)
    assert g["id"] not in s.runs
    queries.lease_snapshot(s)  # the leader's reaper reads it every tick
    assert apply(s, commands.make("takeover", now, None, node="n3"))["ok"]


def test_pausing_a_heartbeat_job_holds_the_slot_it_fired_ahead() -> None:
    """A pause holds the runs fired ahead for slots after it: a heartbeat job's too, which wait
    for a ping rather than in a queue. A ping does not start it while the job is paused (before
    the pause held anything, a ping started a run of the paused job); a resume after its slot
    records it skipped / paused, and its deadline says so."""
    sp = spec({"every_s": 600}, {"succeed_within_s": 300}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    first = T0 + 600 * SEC
    tick(s, first - 900, ahead=True)
    assert s.runs[f"hb@{first}"]["state"] == "waiting"
    res = apply(s, commands.make("pause_job", first - 800, None, name="hb"))
    assert res["ok"] and res.get("held") == 1, res
    run = s.runs[f"hb@{first}"]
    assert (run["state"], run["due"]) == ("waiting", None)
    for slot in (None, first):
        res = apply(s, commands.ping(first - 700, None, name="hb", status="start", slot=slot))
        assert res["error"]["code"] == "conflict", res
    assert run["state"] == "waiting"
    res = apply(s, resume_cmd(s, "hb", first + 10 * SEC))
    assert (res["released"], res["skipped"]) == (0, 1), res
    assert (run["state"], run["reason"]) == ("skipped", "paused")
    assert rec(s, f"hb@{first}")["cause"] == "paused"


def test_a_heartbeat_jobs_held_slot_waits_for_its_ping_again_after_a_resume_before_it() -> None:
    sp = spec({"every_s": 600}, {"succeed_within_s": 300}, executor={"type": "heartbeat"})
    s = new_state(("hb", sp), now=T0)
    first = T0 + 600 * SEC
    tick(s, first - 900, ahead=True)
    apply(s, commands.make("pause_job", first - 800, None, name="hb"))
    res = apply(s, resume_cmd(s, "hb", first - 600))
    assert (res["released"], res["skipped"]) == (1, 0), res
    res = apply(s, commands.ping(first - 500, None, name="hb", status="success", slot=None))
    assert res["ok"] and res["run"] == f"hb@{first}" and s.runs[res["run"]]["state"] == "succeeded", res


def test_explain_of_a_slot_closed_before_its_instant_does_not_say_it_missed_that_deadline() -> None:
    """A heartbeat slot pinged ``start`` in time, then closed by a replace, was explained as "it
    missed its start deadline (T): its run was still running", T still ahead: the record names the
    slot's first deadline, which it met. Judged before the instant, the sentence says the run
    ended without succeeding; judged after it, as before."""
    early = {"state": "missed", "deadline": "start_within_s", "cause": "still_running",
             "instant": T0 + 100 * SEC, "judged_at": T0 + 2 * SEC}
    why = deadlines.explain(early)
    assert why.startswith("its run ended without succeeding, before its start deadline") and "closed" in why, why
    failed = dict(early, cause="failed")
    assert "its run had failed" in deadlines.explain(failed)
    late = dict(early, judged_at=T0 + 101 * SEC)
    assert deadlines.explain(late).startswith("it missed its start deadline"), deadlines.explain(late)
    # A pipeline child's slot its parents decided (cause upstream) was "...: upstream", the cause
    # raw, and read as if the instant had passed.
    up = dict(early, cause="upstream")
    why = deadlines.explain(up)
    assert why.startswith("it can no longer meet its start deadline") and "parents decided" in why, why
    assert "parents decided" in deadlines.explain(dict(up, judged_at=T0 + 101 * SEC))
    assert "had not come yet" in deadlines.explain(dict(early, cause="skipped"))


_SINCE_ORDER_SCRIPT = """
import hashlib, sys
sys.path[:0] = sys.argv[1:]
from test_core_deadlines import SEC, T0, new_state, spec, run_to
jobs = [(f"job-{i}", spec({"every_s": 60}, {"succeed_within_s": 30, "max_since_success_s": 600})) for i in range(12)]
s = new_state(*jobs, now=T0)
s.deadlines.since.clear()  # watched by their puts: a replica whose book lacks them, as a fire finds it
run_to(s, T0 + 60 * SEC, T0 + 61 * SEC)
print(list(s.deadlines.since)[:3], hashlib.sha256(s.snapshot()).hexdigest())
"""


def test_the_jobs_a_fire_starts_to_watch_are_in_its_order_whatever_the_processes_hash_seed() -> None:
    """A fire that finds jobs with max_since_success_s not watched yet watched them in the order
    of a set of their names: the order of their hashes, which differs between processes (a
    string's hash is seeded per process), so replicas wrote different snapshot bytes. They go in
    the fire's order now: every seed gives the same bytes."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    outs = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", _SINCE_ORDER_SCRIPT, here, root], env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        outs.add(res.stdout.strip())
    assert len(outs) == 1, outs
