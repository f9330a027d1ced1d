"""A pipeline child's slot deadlines inside a range its parent recorded (a misfire's outage)
when the child's share of the fan-out comes in a later command (core/pipelines.py
``_offer_range``, core/deadlines.py): a record the sweep judged missed in between (cause
``upstream``, not final: the child's run might still come) is final once the range records the
slot, so it leaves the pending count, and nothing is told twice."""
from __future__ import annotations

import pytest

from raftsched.core import commands, deadlines, limits, pipelines

from core_helpers import SEC, T0, apply, restored
from pipeline_helpers import finish, job_raw, lease, put
from test_core_deadlines import deadline_events, tick, told_state

PARENT = job_raw(every_s=60, misfire={"policy": "skip", "grace_s": 1})
#: the children's routes: told_state's sink hears their deadline events
ROUTES = [{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}]


def _open(s, job: str) -> list[str]:
    """The job's deadline records not final, inside a's (first) recorded range."""
    rng = min((r for r in s.runs.values() if r["job"] == "a" and "slot_to" in r), key=lambda r: r["slot"])
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
        raw = job_raw(after=["a"], deadline={"succeed_within_s": 20}, notify=ROUTES)
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
    assert r2.deadlines.open == s.deadlines.open and len(s.deadlines.open["b1"]) == 11
    for state in (s, r2):
        for key, after in pipelines.pending_fanout(state, 10):
            assert apply(state, commands.fanout_step(now + SEC, key=key, after=after))["ok"]
    assert _open(r2, "b1") == [] and r2.deadlines == s.deadlines
    # left open: the slot before the outage, whose parent's run is still queued, and the one
    # after it, whose instant has not passed
    first, last = T0 + 60 * SEC, T0 + 11 * 60 * SEC
    assert r2.deadlines.open == s.deadlines.open == {
        b: {f"{b}@{first}": first, f"{b}@{last}": last} for b in ("b0", "b1")}


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


def test_a_childs_slots_in_its_range_miss_at_once_so_a_range_trimmed_from_its_history_leaves_none_open() -> None:
    """The child's range comes in the fire that records the parent's (no deferral); its slots'
    records, still pending (their instants an hour away), miss at once as the range's first slot
    does. Before, they waited for their instants, and a range the child's own runs had pushed
    out of its short history by then left them missed and open for good."""
    s = told_state()
    assert put(s, "a", PARENT)["ok"]
    assert put(s, "b", job_raw(after=["a"], history=3, deadline={"succeed_within_s": 3600}, notify=ROUTES))["ok"]
    tick(s, T0 + 60 * SEC)
    for g in lease(s, T0 + 61 * SEC):
        finish(s, g, T0 + 62 * SEC, True)
    now = T0 + 11 * 60 * SEC
    tick(s, now)  # the outage: a's range, and b's, in one command
    (rng,) = [r for r in s.runs.values() if r["job"] == "b" and "slot_to" in r]
    inside = [rid for rid, r in s.deadlines.slots.items() if r["job"] == "b" and rng["slot"] <= r["slot"] <= rng["slot_to"]]
    assert len(inside) == rng["count"] == 9
    for rid in inside:
        r = s.deadlines.slots[rid]
        assert (r["state"], r["cause"], r["fin"]) == ("missed", "upstream", True), (rid, r)
    assert sorted(e[1] for e in deadline_events(s)) == sorted(inside)  # told once each, now
    t = now
    for _ in range(8):  # b's own runs push the range out of its history of 3
        for g in lease(s, t):
            finish(s, g, t + SEC, True)
        t += 60 * SEC
        tick(s, t)
    assert not any("slot_to" in s.runs[r] for r in s.history["b"])
    tick(s, T0 + 2 * 3600 * SEC)
    assert _open(s, "b") == []
    assert s.deadlines.pending == sum(1 for r in s.deadlines.slots.values() if not r["fin"])
    assert sorted(e[1] for e in deadline_events(s) if e[1] in inside) == sorted(inside)  # not again
