"""The pipeline scenario's counting (scripts/benchlib/scenarios/pipeline.py): a chain's child
start after its parent, the commands of a fan-out, the probe's windows, the checks that fail a
run. Pure: no processes, no clock."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib.common import iso  # noqa: E402
from benchlib.scenarios.pipeline import chain_lags, fanout_commands, net_cpu_us, probe_summary, problems  # noqa: E402

B = 1_000_000_000_000  # a whole second, ms since the epoch


def run(job: str, slot: int, state: str = "succeeded", kind: str = "scheduled", fired: int | None = None,
        started: int | None = None, finished: int | None = None) -> dict:
    return {"id": f"{job}@{slot}", "job": job, "slot_ms": slot, "state": state, "kind": kind,
            "fired_at": iso(slot if fired is None else fired), "started_at": None if started is None else iso(started),
            "finished_at": None if finished is None else iso(finished)}


def test_chain_lags_pairs_each_parent_success_with_the_child_of_its_slot():
    parents = [run("a", B, finished=B + 300), run("a", B + 1000, finished=B + 1200),
               run("a", B + 2000, state="dead", finished=B + 2100),  # no child expected
               run("a", B + 3000, finished=B + 3400),  # its child is missing
               run("a", B + 4000, state="running", started=B + 4100),
               run("a", B + 5000, kind="manual", finished=B + 5100),  # not a slot of the schedule
               run("a", B + 9000, finished=B + 9100)]  # outside the window
    children = [run("b", B, kind="triggered", fired=B + 300, started=B + 340, finished=B + 360),
                run("b", B + 1000, kind="triggered", fired=B + 1201, started=B + 1500, finished=B + 1510),
                run("b", B + 9000, kind="triggered", fired=B + 9100, started=B + 9150)]
    r = chain_lags(parents, children, B, B + 6000)
    assert r == {"pairs": 2, "start_lag_ms": [40, 300], "made_in_completion": 1, "missing": 1, "unfinished": 1}


def test_a_child_not_started_yet_is_unfinished_and_has_no_lag():
    r = chain_lags([run("a", B, finished=B + 10)], [run("b", B, state="queued", kind="triggered", fired=B + 10)], B, B + 1000)
    assert (r["pairs"], r["unfinished"], r["start_lag_ms"], r["made_in_completion"]) == (1, 1, [], 1)


def test_fanout_commands_count_each_command_time_by_the_per_command_bound():
    # The completion made 500 at B, two steps 500 each, the last step 200.
    fired = [B] * 500 + [B + 40] * 500 + [B + 90] * 500 + [B + 130] * 200
    assert fanout_commands(fired, 500) == {"commands": 4, "groups": 4, "largest": 500, "span_ms": 130}
    # Two commands with the same time (one ms) are still counted by the bound.
    assert fanout_commands([B] * 1000, 500)["commands"] == 2
    assert fanout_commands([], 500) == {"commands": 0, "groups": 0, "largest": 0, "span_ms": None}


def test_probe_summary_takes_the_window_and_names_the_failures():
    samples = [(B - 10.0, "read", 100.0, 200), (B, "read", 2.0, 200), (B + 1, "write", 5.0, 201),
               (B + 2, "read", 4.0, 200), (B + 3, "write", 9.0, 503), (B + 50, "read", 70.0, 200)]
    s = probe_summary(samples, B, B + 50)
    assert (s["read"]["n"], s["read"]["max"], s["write"]["n"], s["write"]["p50"]) == (2, 4.0, 2, 5.0)
    assert s["errors"] == {"write 503": 1}
    assert probe_summary([], B, B + 1)["read"] == {"n": 0}


def test_net_cpu_takes_the_idle_share_off():
    assert net_cpu_us(2.0, 0.1, 10.0, 1000) == 1000.0
    assert net_cpu_us(2.0, None, 10.0, 1000) is None and net_cpu_us(2.0, 0.1, 10.0, 0) is None


def test_problems_fail_a_missing_child_a_lost_or_doubled_child_and_a_leader_change():
    ok = {"chains": {"sample": {"missing": 0}}, "fanout": {"children_lost": 0, "children_duplicated": 0, "leader_changes": []}}
    assert problems(ok) == [] and problems({}) == []
    bad = {"chains": {"sample": {"missing": 2}},
           "fanout": {"children_lost": 1, "children_duplicated": 0, "leader_changes": [{"t_ms": 5, "term": 3}]}}
    assert len(problems(bad)) == 3
