"""A forced delete of a parent with a backlog records each child's slots as ranges
(pipelines._missing_ranges): each slot's deadline record is judged final, and a range goes
around a slot a backfill holds. From a review of the ranges."""
from __future__ import annotations

from raftsched.core import commands, limits
from core_helpers import SEC, T0, apply, new_state, restored
from pipeline_helpers import put, job_raw, lease, finish, chain_state
from pipeline_helpers import tick as core_tick
import test_core_deadlines as tcd

EX = {"type": "python", "target": "app.jobs:run"}


def _deadline_backlog(n):
    s = new_state()
    assert put(s, "a", {"schedule": {"every_s": 60}, "executor": EX, "misfire": {"policy": "fire_all"},
                        "retry": {"max_attempts": 1}})["ok"]
    assert put(s, "b", {"after": ["a"], "executor": EX, "deadline": {"succeed_within_s": 20}})["ok"]
    slots = [T0 + 60 * SEC * (i + 1) for i in range(n)]
    for sl in slots:
        tcd.tick(s, sl)
        tcd.tick(s, sl + 30 * SEC)  # b's deadline passes: missed (upstream), not final
    book = s.deadlines
    assert all(book.slots[f"b@{sl}"]["state"] == "missed" and not book.slots[f"b@{sl}"]["fin"] for sl in slots)
    end = slots[-1] + 40 * SEC
    assert apply(s, commands.delete_job(end, None, name="a", force=True))["ok"]
    return s, slots


def test_deadlines_of_a_backlog_deleted_one_by_one_are_final():
    s, slots = _deadline_backlog(limits.delete_slots_recorded_one_by_one)
    book = s.deadlines
    open_ = [sl for sl in slots if not book.slots[f"b@{sl}"]["fin"]]
    assert open_ == [] and book.pending == 0


def test_deadlines_of_a_backlog_deleted_as_ranges_are_final():
    s, slots = _deadline_backlog(limits.delete_slots_recorded_one_by_one + 4)
    print([(s.runs[r]["slot"], s.runs[r].get("slot_to"), s.runs[r].get("count")) for r in s.history["b"]])
    book = s.deadlines
    open_ = [sl for sl in slots if not book.slots[f"b@{sl}"]["fin"]]
    # and no later sweep finalises them: nothing is pending, nothing due
    for k in range(5):
        tcd.tick(s, slots[-1] + (100 + k * 60) * SEC)
    open_after = [sl for sl in slots if not book.slots[f"b@{sl}"]["fin"]]
    print("open", len(open_), "after sweeps", len(open_after), "book.pending", book.pending)
    assert open_after == [] and book.pending == 0


def test_a_backlog_range_goes_around_a_slot_a_backfill_holds():
    from backfill_helpers import backfill_cmd, step
    S = lambda i: T0 + 10 * SEC * i  # noqa: E731
    s = chain_state(("p", job_raw(every_s=10)), ("r", job_raw(every_s=10)), ("c", job_raw(after=["p", "r"])),
                    ("gc", job_raw(after=["c"])))
    for i in range(1, 10):
        core_tick(s, S(i))
    assert len(lease(s, S(9) + 1)) == 18  # p, r S1..S9 running (unfinished)
    core_tick(s, S(10))
    g = {x["job"]: x for x in lease(s, S(10) + 1)}
    finish(s, g["p"], S(10) + 2, True)
    finish(s, g["r"], S(10) + 2, False)  # r@S10 dead: c@S10 upstream_failed
    assert s.runs[f"c@{S(10)}"]["reason"] == "upstream_failed"
    for i in range(11, 21):
        core_tick(s, S(i))
    assert apply(s, backfill_cmd(s, "r", S(10), S(10) + 1, S(20) + 1, bf_id="bf", reprocess="failed",
                                 cascade="children"))["ok"]
    assert step(s, "bf", S(20) + 2)["created"] == 1
    grants = lease(s, S(20) + 3)   # the backfill's run, and p/r S11..S20 (running: unfinished)
    (gb,) = [x for x in grants if s.runs[x["id"]].get("backfill") == "bf"]
    finish(s, gb, S(20) + 4, True)
    assert list(s.backfills["bf"]["held"]) == [f"c@{S(10)}"]
    assert apply(s, commands.delete_job(S(20) + 5, None, name="p", force=True))["ok"]
    ranges = [(s.runs[x]["slot"], s.runs[x].get("slot_to"), s.runs[x].get("count")) for x in s.history["c"]]
    print("c history", [(a - T0, b and b - T0, n) for a, b, n in ranges])
    res = step(s, "bf", S(20) + 6)
    print("step", res)
    made = s.runs.get(f"c@{S(10)}")
    print("c@S10", made and (made["state"], made["kind"]))
    covering = [x for x in s.history["c"] if "slot_to" in s.runs[x] and s.runs[x]["slot"] <= S(10) <= s.runs[x]["slot_to"]]
    got = lease(s, S(20) + 7)
    print("leased", [x["id"] for x in got], s.runs[f"c@{S(10)}"])
    gcs = [x for x in got if x["id"] == f"c@{S(10)}"]
    if gcs:
        finish(s, gcs[0], S(20) + 8, True)
        print("c@S10 ->", s.runs[f"c@{S(10)}"]["state"], "; gc@S10:", s.runs.get(f"gc@{S(10)}"),
              "; gc history", [(s.runs[x]["slot"] - T0, s.runs[x].get("slot_to", 0) - T0, s.runs[x].get("reason")) for x in s.history["gc"]])
    assert not (made is not None and covering), f"c@S10 {made['state']} ({made['kind']}) made inside the range {covering}"


def test_snapshot_equal_after_deadline_ranges():
    s, slots = _deadline_backlog(limits.delete_slots_recorded_one_by_one + 4)
    assert restored(s).snapshot() == s.snapshot()
