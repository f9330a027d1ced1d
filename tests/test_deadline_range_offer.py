"""A pipeline child's slot deadlines inside a range its parent recorded (a misfire's outage)
when the child's share of the fan-out comes in a later command (core/pipelines.py
``_offer_range``, core/deadlines.py): a record the sweep judged missed in between (cause
``upstream``, not final: the child's run might still come) is final once the range records the
slot, so it leaves the pending count, and nothing is told twice."""
from __future__ import annotations

import pytest

from raftsched.core import commands, deadlines, limits, pipelines

from core_helpers import SEC, T0, apply, restored
from pipeline_helpers import job_raw, put
from test_core_deadlines import deadline_events, tick, told_state

PARENT = job_raw(every_s=60, misfire={"policy": "skip", "grace_s": 1})


def _open(s, job: str) -> list[str]:
    """The job's deadline records not final, inside a's recorded range."""
    (rng,) = [r for r in s.runs.values() if r["job"] == "a" and "slot_to" in r]
    return sorted(rid for rid, r in s.deadlines.slots.items()
                  if r["job"] == job and not r["fin"] and rng["slot"] <= r["slot"] <= rng["slot_to"])


def _outage_then_fanout(monkeypatch: pytest.MonkeyPatch, children: int):
    """a (every 60 s) with ``children`` triggered children with a deadline; one fan-out a command
    (so the second child's share is deferred); ten minutes without a leader, then a tick: a's
    missed slots are one recorded range, and the sweep runs before the deferred share."""
    monkeypatch.setattr(limits, "fanout_per_command", 1)
    s = told_state()
    assert put(s, "a", PARENT)["ok"]
    for i in range(children):
        raw = job_raw(after=["a"], deadline={"succeed_within_s": 20},
                      notify=[{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}])
        assert put(s, f"b{i}", raw)["ok"]
    tick(s, T0 + 60 * SEC)  # a's first slot: a run
    now = T0 + 11 * 60 * SEC
    tick(s, now)  # the outage's slots: one range, offered to b0; b1's share waits
    return s, now


def test_a_childs_slots_judged_before_its_deferred_range_are_final_once_it_comes(monkeypatch) -> None:
    s, now = _outage_then_fanout(monkeypatch, 2)
    (rng,) = [r for r in s.runs.values() if r["job"] == "a" and "slot_to" in r]
    assert rng["slot_to"] > rng["slot"]
    assert s.pipes.fanout, "b1's share of the range is deferred"
    # the sweep judged b1's slots of the range (their instants passed in the outage): missed,
    # cause upstream, not final, since no range of b1 covers them yet
    open_b1 = _open(s, "b1")
    assert len(open_b1) == rng["count"] == 9
    assert all(s.deadlines.slots[r]["state"] == "missed" for r in open_b1)
    told_before = deadline_events(s)
    for key, after in pipelines.pending_fanout(s, 10):
        assert apply(s, commands.fanout_step(now + SEC, key=key, after=after))["ok"]
    assert not s.pipes.fanout
    assert any(r["job"] == "b1" and "slot_to" in r for r in s.runs.values())
    assert _open(s, "b1") == []
    for rid in open_b1:
        r = s.deadlines.slots[rid]
        assert (r["state"], r["cause"], r["fin"]) == ("missed", "upstream", True)
    # every record of the range is final, and the pending count says so (left: the slots
    # around the range, whose parent's runs have not run)
    tick(s, now + 2 * SEC)
    assert _open(s, "b0") == [] and _open(s, "b1") == []
    assert s.deadlines.pending == sum(1 for r in s.deadlines.slots.values() if not r["fin"]) == 4
    # judged once each: the step finalises, it does not tell again
    assert deadline_events(s) == told_before


def test_the_index_of_open_misses_is_rebuilt_by_a_restore(monkeypatch) -> None:
    s, now = _outage_then_fanout(monkeypatch, 2)
    r2 = restored(s)
    assert r2.deadlines == s.deadlines
    assert r2.deadlines.open_missed == s.deadlines.open_missed and len(s.deadlines.open_missed["b1"]) == 10
    for state in (s, r2):
        for key, after in pipelines.pending_fanout(state, 10):
            assert apply(state, commands.fanout_step(now + SEC, key=key, after=after))["ok"]
    assert _open(r2, "b1") == [] and r2.deadlines == s.deadlines
    # left open: the slot before the outage, whose parent's run is still queued
    assert r2.deadlines.open_missed == s.deadlines.open_missed == {
        "b0": {f"b0@{T0 + 60 * SEC}": T0 + 60 * SEC}, "b1": {f"b1@{T0 + 60 * SEC}": T0 + 60 * SEC}}


def test_a_slot_decided_by_its_own_run_inside_the_range_stays_that_runs(monkeypatch) -> None:
    """A slot of the child's range that a manual run of the child holds is a boundary of the
    range (core/pipelines.py): its record is that run's to judge, not the range's."""
    s, now = _outage_then_fanout(monkeypatch, 2)
    open_b1 = _open(s, "b1")
    held = open_b1[-1]
    slot = int(held.split("@")[1])
    res = apply(s, commands.trigger_job(now, None, name="b1", extra={"slot": slot}))
    assert res["ok"], res
    for key, after in pipelines.pending_fanout(s, 10):
        assert apply(s, commands.fanout_step(now + SEC, key=key, after=after))["ok"]
    assert _open(s, "b1") == [held]
    assert s.deadlines.slots[held]["state"] == "missed"
    assert deadlines.slot_view(s, held)["cause"] == "upstream"
