"""Three real node processes, the leader's wall clock stepped 6 s ahead and then the next
leader's 6 s behind (the node's hidden ``--clock-offset-file``, as the fault harness's ``clock``
nemesis does it): each leader whose clock lies hands its leadership to a node whose clock agrees,
says why (/v1/cluster, /metrics), and no run begins before its slot by more than the bound, by
the real clock (docs/design.md I27)."""
from __future__ import annotations

import pytest

from raftsched.core import limits

from procs import Cluster, wait_for

pytestmark = pytest.mark.cluster

#: Each run prints the real time it began at (ms): the shell's clock is not shifted.
JOB = {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["sh", "-c", "date +%s%3N"]},
       "misfire": {"policy": "skip", "grace_s": 2}, "history": 1000}


def _runs(c: Cluster, i: int) -> list[dict]:
    s, b = c.get(i, "/v1/jobs/tick/runs?limit=1000&consistent=true")
    assert s == 200, b
    return b["runs"]


def _other_leader(c: Cluster, than: int) -> tuple[int] | None:
    """``(i,)`` when node i, not ``than``, is the agreed leader (a tuple: node 0 is falsy)."""
    i = c.leader()
    return None if i is None or i == than else (i,)


@pytest.mark.timeout(180)
def test_a_leader_whose_clock_steps_hands_over_and_no_run_begins_before_its_slot(tmp_path):
    clock_files = [tmp_path / f"clock-{i}.ms" for i in range(3)]
    for f in clock_files:
        f.write_text("0\n")
    c = Cluster(tmp_path, node_args=lambda i: ["--clock-offset-file", str(clock_files[i])])
    c.start()
    try:
        first = c.wait_leader(30)
        s, b = c.call(first, "PUT", "/v1/jobs/tick", JOB)
        assert s in (200, 201), b
        wait_for(lambda: sum(r["state"] == "succeeded" for r in _runs(c, first)) >= 3, 30, "three runs")
        leaders = [first]
        for step_ms in (6000, -6000):
            lying = leaders[-1]
            clock_files[lying].write_text(f"{step_ms}\n")
            # Within seconds another node leads, and every node names it.
            (new,) = wait_for(lambda lying=lying: _other_leader(c, lying), 15, "another leader")
            leaders.append(new)
            st = c.status(lying)
            assert st["clock"]["state"] == "disagrees", st["clock"]
            assert abs(st["clock"]["offset_ms"] - step_ms) < 500, st["clock"]
            assert st["clock"]["candidacy_held"] is True
            assert any({"type": "cluster.clock_disagrees", "node": "self"}.items() <= x.items()
                       for x in st["conditions"]), st["conditions"]  # (beside others: a handover's no_leader)
            s, text = c.get(lying, "/metrics")
            assert s == 200 and "raftsched_clock_disagrees 1.0" in text
            wait_for(lambda new=new, lying=lying: any(
                x["type"] == "cluster.clock_disagrees" and x["node"] == c.raft_addr(lying)
                for x in (c.status(new) or {}).get("conditions", [])), 10, "the condition on the new leader")
            # The schedule carries on, runs executing on the lying node too (a follower now).
            n = sum(r["state"] == "succeeded" for r in _runs(c, new))
            wait_for(lambda new=new, n=n: sum(r["state"] == "succeeded" for r in _runs(c, new)) >= n + 4, 30,
                     "runs after the hand-over")
            clock_files[lying].write_text("0\n")
            wait_for(lambda lying=lying: (c.status(lying) or {}).get("clock", {}).get("state") == "agrees", 10,
                     "the lying clock put right")
        assert leaders[1] != leaders[0] and leaders[2] != leaders[1]
        runs = _runs(c, leaders[-1])
        slots = [r["slot_ms"] for r in runs if r["kind"] == "scheduled"]
        assert len(slots) == len(set(slots)), "a slot fired twice"
        begun = [(r["slot_ms"], int(r["output"].strip())) for r in runs
                 if r["kind"] == "scheduled" and r["state"] == "succeeded" and (r["output"] or "").strip().isdigit()]
        assert len(begun) >= 10
        early = max(slot - t for slot, t in begun)
        assert early <= limits.clock_skew_ms_max, f"a run began {early} ms before its slot"
    finally:
        c.stop()
