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


def test_a_run_not_started_by_its_start_deadline_is_withdrawn_and_told_once():
    from test_notify_core import WEBHOOK
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    apply(s, put_cmd(s, "j", spec({"every_s": 10}, SKIP, notify=[{"sink": "ops", "on": ["deadline.missed",
                                                                                          "slot.missed"]}]), T0))
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
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
    ok = model.validate_job("j", {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                                  "misfire": {"policy": "skip"}, "deadline": {"start_within_s": 5, "late_start": "run"}})
    assert ok["deadline"] == {"start_within_s": 5, "late_start": "run"}


def test_explain_says_which_runs_of_an_outage_a_late_start_skip_withdraws():
    from raftsched.core import preview
    sp = spec({"every_s": 10}, {"start_within_s": 15, "late_start": "skip"}, "fire_all", grace_s=3600, max_catchup=10)
    ex = preview.explain(sp, T0, T0 + 5 * SEC, T0 + 40 * SEC)
    lags = {r["slot_ms"] - T0: r.get("withdrawn", False) for r in ex["fired_ahead"] + ex["runs"]}
    # back at 40 s: a slot more than 15 s before it (10 s, 20 s) has passed its start deadline
    assert lags == {10_000: True, 20_000: True, 30_000: False, 40_000: False}, ex
    assert all("late_start" in r["why"] for r in ex["fired_ahead"] + ex["runs"] if r.get("withdrawn"))
    plain = preview.explain(spec({"every_s": 10}, {"start_within_s": 15}, "fire_all", grace_s=3600, max_catchup=10),
                            T0, T0 + 5 * SEC, T0 + 40 * SEC)
    assert not any(r.get("withdrawn") for r in plain["fired_ahead"] + plain["runs"])
