"""The durability scenario's summary (scripts/benchlib/scenarios/durability.py): medians over
rounds, and the paired lone writes' figure of what fsync adds. Pure: no processes, no clock."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib.scenarios.durability import summarize  # noqa: E402


def one(leader: float, follower: float, jobs: float, slots: float) -> dict:
    return {"lone_ms": {"leader": {"p50": leader, "p99": leader * 3}, "follower": {"p50": follower}},
            "register_jobs_per_s": jobs, "sweep_slots_per_s": slots, "e2e_per_s": {"completed": 100.0}}


def test_rounds_medians_and_the_paired_figure():
    out = {"on": [one(3.0, 4.0, 900, 9_900), one(5.0, 6.0, 1_100, 10_100)],
           "off": [one(2.0, 2.5, 1_000, 10_000), one(2.0, 3.5, 1_000, 10_000)],
           "paired": {"leader": {"on": {"p50": 2.9}, "off": {"p50": 2.1}, "added_median_ms": 0.75},
                      "follower": {"on": {"p50": 3.3}, "off": {"p50": 2.2}, "added_median_ms": 1.05}}}
    s = summarize(out)
    assert s["on"]["lone_leader_p50_ms"] == 4.0 and s["off"]["lone_follower_p50_ms"] == 3.0
    cost = s["cost_of_fsync"]
    assert cost["lone_leader_p50_added_ms"] == 2.0 and cost["register_jobs_lost_pct"] == 0.0
    # The paired figure is the pairs' own median, not the difference of the rounds' p50s.
    assert cost["lone_leader_paired_added_ms"] == 0.75 and cost["lone_follower_paired_added_ms"] == 1.05
    assert cost["lone_follower_paired_p50_ms"] == [3.3, 2.2]


def test_without_paired_writes_the_summary_is_the_rounds_alone():
    s = summarize({"on": [one(3.0, 4.0, 900, 9_900)], "off": [one(2.0, 2.5, 1_000, 10_000)]})
    assert not any("paired" in k for k in s["cost_of_fsync"])
    assert s["cost_of_fsync"]["sweep_slots_lost_pct"] == 1.0
