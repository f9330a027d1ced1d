"""A put that changes a child's edges decides the slots it was waiting for by the new ones
(core/pipelines.py ``on_put``). Before, a gated job whose ``after`` was taken away lost the own
slots that were waiting for its parents, silently (never run, never recorded); and a child whose
parent was taken kept waiting for that parent's report until its ``max_wait_s``, though the
parents it kept had allowed the slot already."""
from __future__ import annotations

from core_helpers import SEC, T0
from pipeline_helpers import finish, job_raw, lease, put
from test_core_deadlines import tick, told_state

ROUTES = [{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}]


def _states(s, job: str) -> dict[str, str]:
    return {rid: r["state"] for rid, r in s.runs.items() if r["job"] == job}


def test_a_gated_job_made_free_of_its_parents_runs_the_own_slots_that_were_waiting() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(every_s=60, after=["a"], deadline={"succeed_within_s": 20}, notify=ROUTES))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)  # c's own slot waits for a's run of it
    rid = f"c@{slot}"
    assert rid not in s.runs and s.pipes.joins["c"][slot]["own"]
    assert put(s, "c", job_raw(every_s=60, deadline={"succeed_within_s": 20}, notify=ROUTES), now=slot + SEC)["ok"]
    assert s.runs[rid]["state"] == "queued" and "c" not in s.pipes.joins
    got = {g["id"]: g for g in lease(s, slot + 2 * SEC)}
    assert rid in got
    finish(s, got[rid], slot + 3 * SEC, True)
    assert s.runs[rid]["state"] == "succeeded"
    assert s.deadlines.slots[rid]["state"] == "met"  # judged by its run, as any slot
    tick(s, slot + 60 * SEC)
    assert f"c@{slot + 60 * SEC}" in s.runs  # and the next ones are ordinary slots


def test_a_child_whose_unreported_parent_is_taken_runs_when_the_parents_it_keeps_allowed_it() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a", "b"]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["a"], slot + 2 * SEC, True)  # a reports; b's run is still going
    assert s.pipes.joins["c"][slot]["got"].keys() == {"a"}
    assert put(s, "c", job_raw(after=["a"]), now=slot + 3 * SEC)["ok"]
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["a"]
    assert "c" not in s.pipes.joins
    finish(s, got["b"], slot + 4 * SEC, True)  # b is no longer c's parent: nothing more
    assert _states(s, "c") == {f"c@{slot}": "queued"}


def test_a_child_whose_reported_parent_is_taken_waits_for_the_one_it_keeps() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a", "b"]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["a"], slot + 2 * SEC, True)  # a reports; b's run is still going
    assert put(s, "c", job_raw(after=["b"]), now=slot + 3 * SEC)["ok"]
    assert s.pipes.joins["c"][slot]["got"] == {}  # a is no longer c's parent
    finish(s, got["b"], slot + 4 * SEC, True)
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["b"]


def test_a_child_whose_edge_now_takes_a_failure_runs_the_slot_that_failure_left_waiting() -> None:
    """c after a (on success) and b; a's run failed and b's is running: the slot is decided
    when b reports (upstream_failed). c is put with a's edge on ``finished``: a's failure now
    allows it, and the slot runs once b succeeds, as it would have had the edge been so."""
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a", {"job": "b", "on": "success"}]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["b"], slot + 2 * SEC, True)
    assert put(s, "c", job_raw(after=[{"job": "a", "on": "finished"}, "b"]), now=slot + 3 * SEC)["ok"]
    assert f"c@{slot}" not in s.runs  # a has not reported yet
    finish(s, got["a"], slot + 4 * SEC, False)
    assert s.runs[f"c@{slot}"]["state"] == "queued"
