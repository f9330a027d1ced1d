"""A slot judged missed because its run could not succeed any more is open again when the slot is
run again (core/deadlines.py ``reopen``): a dead run requeued, a pipeline child's record taken
back by its parent's requeue, a slot cut out of a child's range by a run with ``propagate``.
Its success is then told (``deadline.late``, closing what the miss opened); before, the record
stayed missed, and ``explain`` said the slot could not succeed while its run had succeeded."""
from __future__ import annotations

from raftsched.core import commands, deadlines

from core_helpers import SEC, T0, apply
from pipeline_helpers import finish, job_raw, lease, put
from test_core_deadlines import deadline_events, tick, told_state

ROUTES = [{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}]


def _told(s, rid: str) -> list[str]:
    return [e[0] for e in deadline_events(s) if e[1] == rid]


def _run_all(s, t: int, ok: bool = True) -> None:
    for _ in range(5):
        got = lease(s, t)
        if not got:
            return
        for g in got:
            finish(s, g, t + SEC, ok)
        t += 2 * SEC


def _hourly_with_a_deadline():
    """A state with job j every hour, succeed_within_s 600, its deadlines told; its first slot
    fired: (state, slot, run id)."""
    s = told_state()
    assert put(s, "j", job_raw(every_s=3600, deadline={"succeed_within_s": 600}, notify=ROUTES))["ok"]
    slot = T0 + 3600 * SEC
    tick(s, slot)
    return s, slot, f"j@{slot}"


def test_a_dead_run_requeued_that_succeeds_in_time_is_told_late_and_explained_so() -> None:
    s, slot, rid = _hourly_with_a_deadline()
    (g,) = lease(s, slot + SEC)
    finish(s, g, slot + 2 * SEC, False)  # one attempt: dead
    assert s.runs[rid]["state"] == "dead"
    assert deadlines.slot_view(s, rid)["state"] == "missed" and _told(s, rid) == ["deadline.missed"]
    assert s.deadlines.slots[rid]["fin"]
    res = apply(s, commands.dlq_requeue(slot + 60 * SEC, None, run=rid))
    assert res["ok"], res
    assert not s.deadlines.slots[rid]["fin"] and s.deadlines.open["j"] == {rid: slot}
    (g,) = lease(s, slot + 61 * SEC)
    finish(s, g, slot + 62 * SEC, True)  # before its instant (slot + 600 s)
    view = deadlines.slot_view(s, rid)
    assert view["state"] == "late" and s.deadlines.slots[rid]["fin"]
    assert _told(s, rid) == ["deadline.missed", "deadline.late"]
    why = deadlines.explain(view)
    assert why.startswith("it succeeded before its succeed_within_s deadline"), why
    assert s.deadlines.pending == sum(1 for r in s.deadlines.slots.values() if not r["fin"])


def test_a_requeued_run_that_dies_again_stays_missed_and_is_not_told_twice() -> None:
    s, slot, rid = _hourly_with_a_deadline()
    for t in (slot + SEC, slot + 60 * SEC):
        if t > slot + SEC:
            assert apply(s, commands.dlq_requeue(t - SEC, None, run=rid))["ok"]
        (g,) = lease(s, t)
        finish(s, g, t + SEC, False)
    r = s.deadlines.slots[rid]
    assert (r["state"], r["fin"]) == ("missed", True)
    assert _told(s, rid) == ["deadline.missed"]
    assert list(s.deadlines.final).count(rid) == 1


def test_a_childs_slot_taken_back_by_its_parents_requeue_is_told_late_when_it_succeeds() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=3600))["ok"]
    assert put(s, "b", job_raw(after=["a"], deadline={"succeed_within_s": 600}, notify=ROUTES))["ok"]
    slot = T0 + 3600 * SEC
    rid = f"b@{slot}"
    tick(s, slot)
    _run_all(s, slot + SEC, ok=False)  # a dies: b's slot recorded upstream_failed, missed at once
    assert s.runs[rid]["reason"] == "upstream_failed" and _told(s, rid) == ["deadline.missed"]
    res = apply(s, commands.dlq_requeue(slot + 60 * SEC, None, run=f"a@{slot}"))
    assert res["ok"] and res["rearmed"] == [rid], res
    _run_all(s, slot + 61 * SEC)  # a, then b, succeed
    assert s.runs[rid]["state"] == "succeeded"
    assert deadlines.slot_view(s, rid)["state"] == "late"
    assert _told(s, rid) == ["deadline.missed", "deadline.late"]


def test_a_slot_cut_out_of_a_childs_range_and_run_is_told_late_when_it_succeeds() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=60, misfire={"policy": "skip", "grace_s": 1}))["ok"]
    assert put(s, "b", job_raw(after=["a"], deadline={"succeed_within_s": 3600}, notify=ROUTES))["ok"]
    tick(s, T0 + 60 * SEC)
    _run_all(s, T0 + 61 * SEC)
    now = T0 + 11 * 60 * SEC
    tick(s, now)  # the outage: a range of a's, and b's, each slot of b's missed at once
    slot = T0 + 5 * 60 * SEC
    rid = f"b@{slot}"
    assert deadlines.slot_view(s, rid)["state"] == "missed" and _told(s, rid) == ["deadline.missed"]
    res = apply(s, commands.trigger_job(now + SEC, None, name="a", extra={"slot": slot, "propagate": True}))
    assert res["ok"], res
    _run_all(s, now + 2 * SEC)
    assert s.runs[rid]["state"] == "succeeded"
    assert deadlines.slot_view(s, rid)["state"] == "late"
    assert _told(s, rid) == ["deadline.missed", "deadline.late"]
