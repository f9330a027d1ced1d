"""``deadline.late_start: skip`` (core/deadlines.py judge, core/cancel.py withdraw_late): a run not
started by its slot's ``start_within_s`` is withdrawn, recorded skipped (reason ``late_start``),
where by default it runs whenever a worker takes it. The pure core: commands built as the
proposer builds them (the trigger's fires with their ``dl`` items, the leader's sweep), no clock.
"""
from __future__ import annotations

import pytest

from raftsched.core import commands, model
from raftsched.core.errors import InvalidSpec

from core_helpers import SEC, T0, apply, new_state, put_cmd, restored
from test_core_deadlines import acquire, rec, spec, tick
from test_core_fire import counters

SKIP = {"start_within_s": 5, "late_start": "skip"}


def state_with(deadline: dict, **extra):
    s = new_state()
    assert apply(s, put_cmd(s, "j", spec({"every_s": 10}, deadline, **extra), T0))["ok"]
    return s


def told_state():
    """A job with late_start skip whose deadline.missed and slot.missed go to a sink, its first
    slot fired: (state, that slot's run id)."""
    from test_notify_core import WEBHOOK
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    apply(s, put_cmd(s, "j", spec({"every_s": 10}, SKIP, notify=[{"sink": "ops", "on": ["deadline.missed",
                                                                                          "slot.missed"]}]), T0))
    tick(s, T0 + 10 * SEC)
    return s, f"j@{T0 + 10 * SEC}"


def test_a_run_not_started_by_its_start_deadline_is_withdrawn_and_told_once():
    s, rid = told_state()
    tick(s, T0 + 14 * SEC)  # not yet: 1 s to go
    assert s.runs[rid]["state"] == "queued"
    tick(s, T0 + 15 * SEC)  # the sweep at the instant: missed, and withdrawn in the same apply
    run = s.runs[rid]
    assert (run["state"], run["reason"]) == ("skipped", "late_start")
    assert "start_within_s (5 s of its slot)" in run["error"]
    r = rec(s, rid)
    assert (r["state"], r["cause"], r["deadline"]) == ("missed", "never_started", "start_within_s")
    assert [(e["kind"], e["detail"].get("withdrawn")) for e in s.outbox.events] == [("deadline.missed", True)]
    assert acquire(s, T0 + 16 * SEC) == []
    assert s.stats.recorded[("skipped", "late_start")] == 1
    assert counters(s) == counters(restored(s))
    assert restored(s).snapshot() == s.snapshot()


def test_by_default_a_late_run_still_runs():
    s = state_with({"start_within_s": 5})
    tick(s, T0 + 10 * SEC)
    tick(s, T0 + 20 * SEC - 1)
    rid = f"j@{T0 + 10 * SEC}"
    assert s.runs[rid]["state"] == "queued" and rec(s, rid)["state"] == "missed"
    assert [g["id"] for g in acquire(s, T0 + 20 * SEC - 1)] == [rid]


def test_a_run_that_started_in_time_is_not_withdrawn():
    s = state_with(SKIP)
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    acquire(s, T0 + 12 * SEC)
    tick(s, T0 + 16 * SEC)
    assert s.runs[rid]["state"] == "running"


def test_a_run_a_pause_holds_is_withdrawn_at_its_deadline_and_the_resume_leaves_it():
    from core_helpers import resume_cmd
    s = state_with(SKIP)
    tick(s, T0 + 10 * SEC)
    tick(s, T0 + 19 * SEC, ahead=True)  # the next slot's run fired ahead: a pause holds it
    nxt = f"j@{T0 + 20 * SEC}"
    assert s.runs[nxt]["state"] == "queued"
    apply(s, commands.pause_job(T0 + 19 * SEC + 500, None, name="j"))
    assert s.runs[nxt]["due"] is None  # held
    tick(s, T0 + 26 * SEC)
    assert (s.runs[nxt]["state"], s.runs[nxt]["reason"]) == ("skipped", "late_start")
    assert apply(s, resume_cmd(s, "j", T0 + 27 * SEC))["ok"]
    assert s.runs[nxt]["state"] == "skipped"
    assert counters(s) == counters(restored(s))


@pytest.mark.parametrize("parent_ends_s,child", [(2, ("queued", None)), (8, ("skipped", "late_start"))])
def test_a_pipeline_childs_slot_decided_after_its_start_deadline_is_recorded_late_start(parent_ends_s, child):
    from pipeline_helpers import job_raw, put as put_job
    s = new_state()
    put_job(s, "a", job_raw(every_s=10))
    put_job(s, "b", job_raw(after=["a"], deadline=SKIP))
    tick(s, T0 + 10 * SEC)
    slot = T0 + 10 * SEC
    g = acquire(s, T0 + 11 * SEC)[0]
    tick(s, slot + parent_ends_s * SEC)  # the sweep: b's slot past its start instant when 8
    res = apply(s, commands.complete_many(slot + parent_ends_s * SEC, None, worker="w", results=[
        {"run": g["id"], "token": g["token"], "success": True}]))
    assert res["ok"]
    b = s.runs[f"b@{slot}"]
    assert (b["state"], b.get("reason")) == child, b
    if child[0] == "skipped":
        assert rec(s, f"b@{slot}")["state"] == "missed"
    assert restored(s).snapshot() == s.snapshot()


@pytest.mark.parametrize("deadline,field,words", [
    ({"succeed_within_s": 60, "late_start": "skip"}, "deadline.late_start", "needs start_within_s"),
    ({"start_within_s": 60, "late_start": "drop"}, "deadline.late_start", "one of run, skip"),
    ({"late_start": "skip"}, "deadline", "at least one of"),
])
def test_a_bad_late_start_names_the_field(deadline, field, words):
    raw = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"},
           "deadline": deadline}
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("j", raw)
    assert e.value.field == field and words in e.value.message, e.value.message


def test_a_heartbeat_job_takes_no_late_start_skip_and_run_is_kept_as_given():
    raw = {"schedule": {"every_s": 10}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
           "deadline": SKIP}
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("j", raw)
    assert e.value.field == "deadline.late_start"
    with pytest.raises(InvalidSpec) as e:  # (a walk: "run" was taken, though nothing of it applies)
        model.validate_job("j", dict(raw, deadline={"start_within_s": 5, "late_start": "run"}))
    assert e.value.field == "deadline.late_start"
    ok = model.validate_job("j", {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                                  "misfire": {"policy": "skip"}, "deadline": {"start_within_s": 5, "late_start": "run"}})
    assert ok["deadline"] == {"start_within_s": 5, "late_start": "run"}


def test_explain_says_which_runs_of_an_outage_a_late_start_skip_withdraws():
    from raftsched.core import preview
    sp = spec({"every_s": 10}, {"start_within_s": 15, "late_start": "skip"}, "fire_all", grace_s=3600, max_catchup=10)
    ex = preview.explain(sp, T0, T0 + 5 * SEC, T0 + 40 * SEC)
    lags = {r["slot_ms"] - T0: r.get("withdrawn", False) for r in ex["fired_ahead"] + ex["runs"]}
    # back at 40 s: a slot 15 s or more before it (10 s, 20 s) has passed its start deadline
    assert lags == {10_000: True, 20_000: True, 30_000: False, 40_000: False}, ex
    on_edge = preview.explain(sp, T0, T0 + 5 * SEC, T0 + 35 * SEC)  # 20 + 15 = 35: withdrawn, as judge's t <= now
    assert {r["slot_ms"] - T0: r.get("withdrawn", False) for r in on_edge["fired_ahead"] + on_edge["runs"]} == {
        10_000: True, 20_000: True, 30_000: False}, on_edge
    assert all("late_start" in r["why"] for r in ex["fired_ahead"] + ex["runs"] if r.get("withdrawn"))
    plain = preview.explain(spec({"every_s": 10}, {"start_within_s": 15}, "fire_all", grace_s=3600, max_catchup=10),
                            T0, T0 + 5 * SEC, T0 + 40 * SEC)
    assert not any(r.get("withdrawn") for r in plain["fired_ahead"] + plain["runs"])


def test_explain_counts_no_overlap_for_a_slot_late_start_records():
    # (found by a review: explain marked slots withdrawn that forbid had recorded, and counted them)
    from raftsched.core import preview
    sp = spec({"every_s": 10}, {"start_within_s": 15, "late_start": "skip"}, "fire_all", grace_s=3600, max_catchup=10,
              overlap={"policy": "forbid"})
    ex = preview.explain(sp, T0, T0 + 5 * SEC, T0 + 60 * SEC)
    ran = [r["slot_ms"] - T0 for r in ex["runs"] if not r.get("withdrawn") and r["overlap"] is None]
    assert ran == [50_000] and ex["overlap"]["runs"] == 1, ex  # 50 s runs; 60 s is forbidden behind it
    assert all(r["overlap"] is None for r in ex["runs"] if r.get("withdrawn"))


def test_a_slot_fired_past_its_start_deadline_is_recorded_at_the_fire_tracked_or_not():
    # (found by a review: a long catch-up's oldest slots carry no deadline record, so no sweep
    # withdrew their runs; they are recorded at the fire now)
    s = state_with({"start_within_s": 15, "late_start": "skip"}, policy_name="fire_all", grace_s=3600,
                   max_catchup=50)
    tick(s, T0 + 10 * SEC)
    acquire(s, T0 + 10 * SEC)
    res = tick(s, T0 + 300 * SEC)  # back after an outage: 29 slots due at once
    made = [s.runs[f"j@{T0 + k * 10 * SEC}"] for k in range(2, 31)]
    late = [r for r in made if r["state"] == "skipped"]
    assert [r["slot"] - T0 for r in made if r["state"] == "queued"] == [290_000, 300_000], res
    assert all(r["reason"] == "late_start" and r["kind"] == "recorded" and "fired too late" in r["error"] for r in late)
    assert counters(s) == counters(restored(s))
    assert restored(s).snapshot() == s.snapshot()


def test_a_run_missed_by_an_earlier_succeed_by_is_withdrawn_at_its_start_instant_all_the_same():
    # (found by a review: judge stopped at the first miss, so the start instant was never looked at)
    from test_notify_core import WEBHOOK
    from raftsched.core import schedule
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    # every 10 s; succeed_by the next minute's start, start_within_s long after it
    slot = schedule.next_slot_after({"every_s": 10}, T0, T0)
    hhmm = schedule.iso(slot + 60 * SEC)[11:16]
    sp = spec({"every_s": 10}, {"start_within_s": 3600, "succeed_within_s": 7200, "succeed_by": hhmm,
                                 "late_start": "skip"}, notify=[{"sink": "ops", "on": ["deadline.missed", "slot.missed"]}])
    apply(s, put_cmd(s, "j", sp, T0))
    tick(s, slot)
    rid = f"j@{slot}"
    r = rec(s, rid)
    assert r["instants"]["succeed_by"] < r["instants"]["start_within_s"], r
    tick(s, slot + 120 * SEC)  # succeed_by passed: missed, the run still queued
    assert s.runs[rid]["state"] == "queued" and rec(s, rid)["deadline"] == "succeed_by"
    tick(s, slot + 3600 * SEC)  # its start instant: withdrawn, and said (slot.missed)
    assert (s.runs[rid]["state"], s.runs[rid]["reason"]) == ("skipped", "late_start")
    told = [(e["kind"], e["run_id"], e["reason"]) for e in s.outbox.events if e["run_id"] == rid]
    assert told == [("deadline.missed", rid, "never_started"), ("slot.missed", rid, "late_start")], told
    assert counters(s) == counters(restored(s))
    assert restored(s).snapshot() == s.snapshot()


def test_a_childs_slot_re_armed_past_its_start_deadline_is_recorded_late_start():
    # A dead parent requeued an hour later: the child's slot would start an hour late.
    from pipeline_helpers import job_raw, put as put_job
    s = new_state()
    put_job(s, "a", job_raw(every_s=3600))
    put_job(s, "b", job_raw(after=["a"], deadline=SKIP))
    slot = next(iter(j["next"] for j in [s.jobs["a"]]))
    tick(s, slot)
    g = acquire(s, slot + SEC)[0]
    apply(s, commands.complete_many(slot + 2 * SEC, None, worker="w", results=[
        {"run": g["id"], "token": g["token"], "success": False, "error": "exit 1"}]))
    assert s.runs[f"b@{slot}"]["reason"] == "upstream_failed"
    apply(s, commands.dlq_requeue(slot + 3600 * SEC, None, run=g["id"]))
    g2 = acquire(s, slot + 3600 * SEC)[0]
    apply(s, commands.complete_many(slot + 3601 * SEC, None, worker="w", results=[
        {"run": g2["id"], "token": g2["token"], "success": True}]))
    b = s.runs[f"b@{slot}"]
    assert (b["state"], b["reason"]) == ("skipped", "late_start") and "too late" in b["error"], b


def test_without_late_start_skip_a_missed_records_start_instant_changes_nothing():
    # A node of the older code judges nothing more of a record once it is missed: the new code
    # must not either, for a job without late_start skip (its replicas would differ).
    from raftsched.core import deadlines, schedule
    from core_helpers import snap_obj
    s = new_state()
    slot = schedule.next_slot_after({"every_s": 10}, T0, T0)
    hhmm = schedule.iso(slot + 60 * SEC)[11:16]
    apply(s, put_cmd(s, "j", spec({"every_s": 10}, {"start_within_s": 3600, "succeed_within_s": 7200,
                                                     "succeed_by": hhmm}), T0))
    tick(s, slot)
    tick(s, slot + 120 * SEC)
    rid = f"j@{slot}"
    assert rec(s, rid)["deadline"] == "succeed_by"
    rids, _ = deadlines.due(s, slot + 3600 * SEC, 1000)
    assert rid not in rids
    before = snap_obj(s, ("applied", "now_ms"))
    apply(s, commands.deadline_judge(slot + 3600 * SEC, runs=[rid], jobs=[]))  # (a hand-made sweep naming it)
    assert snap_obj(s, ("applied", "now_ms")) == before


def test_a_grant_carries_start_by_and_a_run_given_back_past_it_is_withdrawn():
    # (found by a walk: a worker held runs for a slot behind long ones and started them 35 s late)
    s = state_with(SKIP)
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    g = acquire(s, T0 + 11 * SEC)[0]
    assert g["start_by"] == T0 + 15 * SEC
    tick(s, T0 + 15 * SEC)  # the sweep at the start instant: leased, so judged nothing yet
    assert s.runs[rid]["state"] == "running" and rec(s, rid)["state"] == "pending"
    res = apply(s, commands.release(T0 + 15 * SEC, None, worker="w", leases=[[rid, g["token"]]],
                                    reason="not started by its start deadline (late_start: skip)", not_started=True))
    assert res["released"] == [rid]
    r = s.runs[rid]
    assert (r["state"], r["reason"], r["attempt"]) == ("skipped", "late_start", 1)
    assert r["attempts"][-1]["released"] is True and r["attempts"][-1]["unstarted"] is True
    # (a walk: the run's view said it started, at its lease's time, beside never_started)
    from raftsched.node.views import run_view
    v = run_view(r)
    assert v["started_at"] is None and v["attempts"][-1]["started_at"] is not None, v
    d = rec(s, rid)
    assert (d["state"], d["deadline"], d["cause"]) == ("missed", "start_within_s", "never_started")
    assert counters(s) == counters(restored(s)) == {"depth": {}, "running": {}, "running_ids": set(), "dead": {}}
    assert restored(s).snapshot() == s.snapshot()


def test_a_run_given_back_unstarted_before_its_start_deadline_is_queued_and_withdrawn_at_it_if_still_unstarted():
    s = state_with(SKIP)
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    g = acquire(s, T0 + 11 * SEC)[0]
    apply(s, commands.release(T0 + 12 * SEC, None, worker="w", leases=[[rid, g["token"]]], reason="not delivered",
                              not_started=True))
    assert s.runs[rid]["state"] == "queued" and s.runs[rid]["attempt"] == 2
    tick(s, T0 + 15 * SEC)  # a lease its worker never began is no start: withdrawn at the instant
    assert (s.runs[rid]["state"], s.runs[rid]["reason"]) == ("skipped", "late_start")
    assert rec(s, rid)["cause"] == "never_started"
    assert counters(s) == counters(restored(s))


@pytest.mark.parametrize("how", ["failed", "expired", "drained", "requeued"])
def test_a_slot_that_started_once_runs_again_whatever_late_start_says(how):
    # (found by a review: every later grant carried the first start_by, so a retry, a lost
    # lease's re-run and a dead run requeued were given back and withdrawn; and a run a drain
    # killed while it ran was withdrawn as never started)
    spec_ = spec({"every_s": 10}, SKIP, retry={"max_attempts": 1 if how == "requeued" else 3, "backoff_s": 1})
    s = new_state()
    apply(s, put_cmd(s, "j", spec_, T0))
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    g = acquire(s, T0 + 11 * SEC)[0]
    if how == "failed":
        apply(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
            {"run": rid, "token": g["token"], "success": False, "error": "exit 1"}]))
    elif how == "expired":
        apply(s, commands.make("expire", T0 + 12 * SEC, None, runs=[[rid, g["token"], 0]], locks=[]))
    elif how == "drained":  # a drain kills a run still going and gives it back (no not_started)
        res = apply(s, commands.release(T0 + 20 * SEC, None, worker="w", leases=[[rid, g["token"]]], reason="draining"))
        assert res["released"] == [rid]
    else:
        apply(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
            {"run": rid, "token": g["token"], "success": False, "error": "exit 1"}]))
        assert s.runs[rid]["state"] == "dead"
        apply(s, commands.dlq_requeue(T0 + 13 * SEC, None, run=rid))
    assert s.runs[rid]["state"] == "queued", s.runs[rid]
    tick(s, T0 + 30 * SEC)  # past the start instant: the sweep withdraws nothing
    assert s.runs[rid]["state"] == "queued"
    g2 = acquire(s, T0 + 30 * SEC)[0]
    assert g2["id"] == rid and "start_by" not in g2, g2


def test_runs_by_hand_and_backfills_carry_no_start_by():
    s = state_with(SKIP)
    res = apply(s, commands.trigger_job(T0 + SEC, None, name="j"))
    g = acquire(s, T0 + 2 * SEC)[0]
    assert g["id"] == res["run"] and "start_by" not in g


def test_a_run_leased_past_its_instant_then_given_back_is_told_as_slot_missed():
    # (found by a review: the sweep judged it missed while leased, no withdrawal said; the
    # give-back's withdrawal then said nothing)
    s, rid = told_state()
    g = acquire(s, T0 + 15 * SEC + 100)[0]  # leased past the instant, before the sweep
    tick(s, T0 + 15 * SEC + 200)
    assert rec(s, rid)["state"] == "missed" and s.runs[rid]["state"] == "running"
    apply(s, commands.release(T0 + 15 * SEC + 300, None, worker="w", leases=[[rid, g["token"]]], reason="late",
                              not_started=True))
    assert (s.runs[rid]["state"], s.runs[rid]["reason"]) == ("skipped", "late_start")
    told = [(e["kind"], e["reason"], e["detail"].get("withdrawn")) for e in s.outbox.events if e["run_id"] == rid]
    assert told == [("deadline.missed", "never_started", None), ("slot.missed", "late_start", None)], told
