"""Backlog ranges of a forced delete around many held slots, beside jobs whose names share a
prefix; every deadline record not held is final. From a review of the ranges."""
from __future__ import annotations

from raftsched.core import commands, limits
from core_helpers import SEC, T0, apply, new_state
from pipeline_helpers import put
import test_core_deadlines as tcd

EX = {"type": "python", "target": "app.jobs:run"}


def _state(n, names=("b",)):
    s = new_state()
    assert put(s, "a", {"schedule": {"every_s": 60}, "executor": EX, "misfire": {"policy": "fire_all"},
                        "retry": {"max_attempts": 1}})["ok"]
    for nm in names:
        assert put(s, nm, {"after": ["a"], "executor": EX, "deadline": {"succeed_within_s": 20}})["ok"]
    slots = [T0 + 60 * SEC * (i + 1) for i in range(n)]
    for sl in slots:
        tcd.tick(s, sl)
        tcd.tick(s, sl + 30 * SEC)
    return s, slots


def test_many_held_slots_and_prefix_names():
    n = limits.delete_slots_recorded_one_by_one + 20
    s, slots = _state(n, names=("b", "b.x", "b-x", "bb"))
    held = [slots[3], slots[4], slots[10], slots[n - 1], slots[0]]
    for sl in held:
        s.pipes.held[f"b@{sl}"] = "bf"
    for sl in (slots[6], slots[12]):  # other jobs' held ids sharing a prefix
        s.pipes.held[f"b.x@{sl}"] = "bf"
        s.pipes.held[f"bb@{sl}"] = "bf"
        s.pipes.held[f"b-x@{sl}"] = "bf"
    s.backfills["bf"] = {"id": "bf", "kind": "backfill", "job": "zz", "state": "running", "held": {rid: [rid.split("@")[0], int(rid.split("@")[1]), {}, 0] for rid in s.pipes.held}}
    end = slots[-1] + 40 * SEC
    r = apply(s, commands.delete_job(end, None, name="a", force=True))
    assert r["ok"], r
    for name in ("b", "b.x", "b-x", "bb"):
        rng = [(s.runs[r]["slot"], s.runs[r].get("slot_to", s.runs[r]["slot"])) for r in s.history[name]]
        idx = [((a - T0) // (60 * SEC) - 1, (b - T0) // (60 * SEC) - 1) for a, b in rng]
        print(name, idx)
        myheld = held if name == "b" else [slots[6], slots[12]]
        for h in myheld:
            assert not any(a <= h <= b for a, b in rng), (name, h)
        covered = sorted(set(x for a, b in idx for x in range(a, b + 1)))
        expect = [i for i in range(n) if slots[i] not in myheld]
        assert covered == expect, (name, covered)
        open_ = [sl for sl in slots if sl not in myheld and not s.deadlines.slots[f"{name}@{sl}"]["fin"]]
        assert not open_, (name, len(open_))
