"""A put that changes a child's edges decides the slots it was waiting for by the new ones
(core/pipelines.py ``on_put``). Before, a gated job whose ``after`` was taken away lost the own
slots that were waiting for its parents, silently (never run, never recorded); and a child whose
parent was taken kept waiting for that parent's report until its ``max_wait_s``, though the
parents it kept had allowed the slot already."""
from __future__ import annotations

import pytest

from core_helpers import SEC, T0
from pipeline_helpers import finish, job_raw, lease, put
from test_core_deadlines import tick, told_state

ROUTES = [{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}]


def _one_reported(reported: str = "a"):
    """c after [a, b] (every 60 s); slot S fired; ``reported``'s run of it succeeded, the
    other's is running. :returns: the state, S, and the grants by job."""
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a", "b"]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got[reported], slot + 2 * SEC, True)
    return s, slot, got


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
    s, slot, got = _one_reported()
    assert s.pipes.joins["c"][slot]["got"].keys() == {"a"}
    assert put(s, "c", job_raw(after=["a"]), now=slot + 3 * SEC)["ok"]
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["a"]
    assert "c" not in s.pipes.joins
    finish(s, got["b"], slot + 4 * SEC, True)  # b is no longer c's parent: nothing more
    assert _states(s, "c") == {f"c@{slot}": "queued"}


def test_a_child_whose_reported_parent_is_taken_waits_for_the_one_it_keeps() -> None:
    s, slot, got = _one_reported()
    assert put(s, "c", job_raw(after=["b"]), now=slot + 3 * SEC)["ok"]
    assert s.pipes.joins["c"][slot]["got"] == {}  # a is no longer c's parent
    finish(s, got["b"], slot + 4 * SEC, True)
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["b"]


def test_a_report_that_comes_after_an_edge_changed_is_judged_by_the_new_edge() -> None:
    """c after a (on success) and b; b succeeds; c is put with a's edge on ``finished``, a's run
    still going; then a fails: the waiting slot runs, judged by the edge as it is now (a guard
    beside the re-decision at the put, which has nothing to decide here: a join only ever holds
    reports its edges allow, any other decides the slot at once)."""
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


def _batch_item(s, name: str, raw: dict, now: int) -> dict:
    """A put_jobs item as the node plans it."""
    from raftsched.core import commands, model
    from core_helpers import put_cmd
    spec = model.validate_job(name, raw, now)
    if "schedule" in spec:
        cmd = put_cmd(s, name, spec, now)
    else:
        cmd = commands.put_job(now, None, name=name, spec=spec, next=None, cursor=now, anchor=now, create_only=False)
    return {k: cmd[k] for k in ("name", "spec", "next", "cursor", "anchor", "create_only")}


def test_a_batch_that_puts_a_childs_new_parent_after_it_leaves_its_slots_waiting() -> None:
    """A review's probe: c, waiting for b, is put after [a, b, p] in a batch that makes p after
    it. Decided at once, the slot was recorded dependency_missing ("parent p does not exist")
    though p existed once the command applied; it waits, as before edges were re-decided."""
    from raftsched.core import commands
    from core_helpers import apply
    for latest in (False, True):
        s = told_state()
        assert put(s, "a", job_raw(every_s=60))["ok"]
        assert put(s, "b", job_raw(every_s=60))["ok"]
        extra = {"every_s": 60, "match": "latest"} if latest else {}
        assert put(s, "c", job_raw(after=["a", "b"], **extra))["ok"]
        slot = T0 + 60 * SEC
        tick(s, slot)
        got = {g["job"]: g for g in lease(s, slot + SEC)}
        finish(s, got["a"], slot + 2 * SEC, True)
        now = slot + 3 * SEC
        items = [_batch_item(s, "c", job_raw(after=["a", "b", "p"], **extra), now),
                 _batch_item(s, "p", job_raw(every_s=60), now)]
        assert apply(s, commands.put_jobs(now, None, jobs=items))["ok"]
        assert f"c@{slot}" not in s.runs and slot in s.pipes.joins["c"], latest


def test_a_batch_that_swaps_a_parent_for_one_it_makes_later_drops_the_removed_ones_report() -> None:
    """c after [a, b], b has reported; a batch puts c after [a, p] and then makes p (after a):
    the slot waits for p (it exists only later in the batch), and b's report is dropped at once,
    so the run, when a and p end, names its parents only (it named b)."""
    from raftsched.core import commands
    from core_helpers import apply
    s, slot, got = _one_reported("b")
    now = slot + 3 * SEC
    items = [_batch_item(s, "c", job_raw(after=["a", "p"]), now), _batch_item(s, "p", job_raw(after=["a"]), now)]
    assert apply(s, commands.put_jobs(now, None, jobs=items))["ok"]
    assert s.pipes.joins["c"][slot]["got"] == {}
    finish(s, got["a"], now + SEC, True)  # a ends: p runs, then c
    for g in lease(s, now + 2 * SEC):
        finish(s, g, now + 3 * SEC, True)
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["a", "p"]


def test_a_latest_child_forgets_the_successes_of_parents_it_no_longer_has() -> None:
    s = told_state()
    for p, every in (("a", 60), ("b", 3600), ("x", 3600)):
        assert put(s, p, job_raw(every_s=every))["ok"]
    assert put(s, "c", job_raw(every_s=60, after=["a", "x"], match="latest"))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["a"], slot + 2 * SEC, True)
    assert "a" in s.pipes.latest["c"]
    assert put(s, "c", job_raw(every_s=60, after=["b"], match="latest"), now=slot + 3 * SEC)["ok"]
    assert "a" not in s.pipes.latest.get("c", {})
    t = T0 + 3600 * SEC
    tick(s, t)
    for g in lease(s, t + SEC):
        if g["job"] == "b":
            finish(s, g, t + 2 * SEC, True)
    ups = [[u["job"] for u in r["upstream"]] for r in s.runs.values() if r["job"] == "c" and r.get("upstream")]
    assert ups and all(u == ["b"] for u in ups), ups


def test_a_gated_job_made_free_runs_its_waiting_slot_with_no_upstream() -> None:
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(every_s=60, after=["a", "b"]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["a"], slot + 2 * SEC, True)
    assert put(s, "c", job_raw(every_s=60), now=slot + 3 * SEC)["ok"]
    run = s.runs[f"c@{slot}"]
    assert run["state"] == "queued" and not run.get("upstream") and "backfill" not in run


def test_a_child_made_a_job_of_its_own_closes_the_deadline_records_no_parent_will_decide() -> None:
    """b after a, with a deadline; a dies, b's slot is recorded and judged missed; a is requeued
    (b's record re-armed, open again); then b is put with a schedule of its own and no after:
    nothing will decide that slot, so its record ends missed (it stayed open for good)."""
    from raftsched.core import commands
    from core_helpers import apply
    routes = [{"sink": "ops", "on": ["deadline.missed", "deadline.late"]}]
    s = told_state()
    assert put(s, "a", job_raw(every_s=3600))["ok"]
    assert put(s, "b", job_raw(after=["a"], deadline={"succeed_within_s": 600}, notify=routes))["ok"]
    slot = T0 + 3600 * SEC
    rid = f"b@{slot}"
    tick(s, slot)
    (g,) = lease(s, slot + SEC)
    finish(s, g, slot + 2 * SEC, False)
    assert apply(s, commands.dlq_requeue(slot + 3 * SEC, None, run=f"a@{slot}"))["ok"]
    assert not s.deadlines.slots[rid]["fin"]
    assert put(s, "b", job_raw(every_s=7200, deadline={"succeed_within_s": 600}, notify=routes), now=slot + 4 * SEC)["ok"]
    r = s.deadlines.slots[rid]
    assert (r["state"], r["fin"]) == ("missed", True) and rid not in s.deadlines.open.get("b", {})
    assert s.deadlines.pending == sum(1 for x in s.deadlines.slots.values() if not x["fin"])


@pytest.mark.parametrize("b_succeeds", [True, False])
def test_a_parent_added_is_read_back_for_a_slot_it_ran_before_the_edge(b_succeeds: bool) -> None:
    """c after a; b's run of slot S ended before c named b; then c is put after a and b, and
    a's run of S ends: c's slot waited for b's report, which had gone before the edge existed,
    until max_wait_s (upstream_timeout). Now b's outcome is read back, as its report would have
    decided: c runs the slot with both parents upstream, or records it upstream_failed."""
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a"]))["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["b"], slot + 2 * SEC, b_succeeds)
    assert put(s, "c", job_raw(after=["a", "b"]), now=slot + 3 * SEC)["ok"]
    finish(s, got["a"], slot + 4 * SEC, True)
    run = s.runs[f"c@{slot}"]
    if b_succeeds:
        assert run["state"] == "queued" and sorted(u["job"] for u in run["upstream"]) == ["a", "b"], run
    else:
        assert (run["state"], run["reason"]) == ("skipped", "upstream_failed"), run
    assert "c" not in s.pipes.joins or slot not in s.pipes.joins["c"]


def test_a_slot_no_parent_reported_is_decided_by_the_parents_that_replace_them() -> None:
    """c after a, with a deadline; a's run of S still running (no report, no join), b's run of
    S succeeded; c is put after b instead: the slot was decided by none (a's report no longer
    counts, b's had gone), its deadline record open for good. b's outcome is read back: c runs it."""
    s = told_state()
    assert put(s, "a", job_raw(every_s=60))["ok"]
    assert put(s, "b", job_raw(every_s=60))["ok"]
    assert put(s, "c", job_raw(after=["a"], deadline={"succeed_within_s": 600}, notify=ROUTES))["ok"]
    slot = T0 + 60 * SEC
    rid = f"c@{slot}"
    tick(s, slot)
    assert rid in s.deadlines.open.get("c", {})
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["b"], slot + 2 * SEC, True)
    assert put(s, "c", job_raw(after=["b"], deadline={"succeed_within_s": 600}, notify=ROUTES),
               now=slot + 3 * SEC)["ok"]
    run = s.runs[rid]
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["b"], run
    finish(s, got["a"], slot + 4 * SEC, True)  # a is no longer c's parent: nothing more
    (g,) = [g for g in lease(s, slot + 5 * SEC) if g["id"] == rid]
    finish(s, g, slot + 6 * SEC, True)
    assert s.deadlines.slots[rid]["state"] == "met" and rid not in s.deadlines.open.get("c", {})


def _rerun_by_hand(c_after):
    """x and a every 60 s, b after x, c after ``c_after``; x's run of S dies (b@S recorded
    upstream_failed), then b's slot S is run again by hand with propagate and succeeds."""
    from raftsched.core import commands
    from core_helpers import apply
    s = told_state()
    for n, raw in (("x", job_raw(every_s=60)), ("a", job_raw(every_s=60)), ("b", job_raw(after=["x"])),
                   ("c", job_raw(after=c_after))):
        assert put(s, n, raw)["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["x"], slot + 2 * SEC, False)
    assert s.runs[f"b@{slot}"]["reason"] == "upstream_failed"
    r = apply(s, commands.trigger_job(slot + 3 * SEC, None, name="b", extra={"slot": slot, "propagate": True}))
    assert r["ok"] and r["run"] == f"b@{slot}#manual", r
    (g,) = [g for g in lease(s, slot + 4 * SEC) if g["job"] == "b"]
    finish(s, g, slot + 5 * SEC, True)
    return s, slot, got


def test_a_parent_added_is_read_back_as_its_slots_newest_run_not_the_one_it_replaced() -> None:
    """A review: the read-back took b@S (recorded upstream_failed) where b's slot had been run
    again by hand and succeeded (b@S#manual), which its report would have said: c's slot was
    recorded upstream_missed, where with the edge from the start it ran."""
    for c_after, put_after in ((["a", "b"], None), (["a"], ["a", "b"])):
        s, slot, got = _rerun_by_hand(c_after)
        if put_after is not None:
            assert put(s, "c", job_raw(after=put_after), now=slot + 6 * SEC)["ok"]
        finish(s, got["a"], slot + 7 * SEC, True)
        r = s.runs[f"c@{slot}"]
        assert r["state"] == "queued", (c_after, r)


def test_a_put_reads_back_no_parent_it_kept_while_a_rearm_waits_for_its_rerun() -> None:
    """A review: c after a and b; b's slot run again by hand dies (c's slot upstream_failed),
    and is requeued (c's record taken back, waiting for the re-run); a put that adds d read
    b's stale record back for it and decided the slot while the re-run was still queued."""
    from raftsched.core import commands
    from core_helpers import apply
    s = told_state()
    for n, raw in (("x", job_raw(every_s=60)), ("a", job_raw(every_s=60)), ("d", job_raw(every_s=60)),
                   ("b", job_raw(after=["x"])), ("c", job_raw(after=["a", "b"]))):
        assert put(s, n, raw)["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["a"], slot + 2 * SEC, True)
    finish(s, got["d"], slot + 2 * SEC, True)
    finish(s, got["x"], slot + 2 * SEC, False)
    m = apply(s, commands.trigger_job(slot + 3 * SEC, None, name="b", extra={"slot": slot, "propagate": True}))["run"]
    (g,) = [g for g in lease(s, slot + 4 * SEC) if g["id"] == m]
    finish(s, g, slot + 5 * SEC, False)
    assert apply(s, commands.dlq_requeue(slot + 6 * SEC, None, run=m))["ok"]
    assert f"c@{slot}" not in s.runs and s.runs[m]["state"] == "queued"
    assert put(s, "c", job_raw(after=["a", "b", "d"]), now=slot + 7 * SEC)["ok"]
    assert f"c@{slot}" not in s.runs  # still waiting for b's re-run
    assert s.pipes.joins["c"][slot]["got"].keys() == {"a", "d"}
    (g,) = [g for g in lease(s, slot + 8 * SEC) if g["id"] == m]
    finish(s, g, slot + 9 * SEC, True)
    assert s.runs[f"c@{slot}"]["state"] == "queued"


def test_a_pause_and_resume_read_nothing_back() -> None:
    """Only a put that adds a parent reads back: c after a and b; b's slot re-run by hand dies
    and is requeued (c's record taken back, its join waiting for a and the re-run); c is paused
    and resumed, then a's run reports: the join still waits for b's re-run (a first read-back,
    gated on the child's last change, read b's stale record then and decided the slot)."""
    from raftsched.core import commands
    from core_helpers import apply
    s = told_state()
    for n, raw in (("x", job_raw(every_s=60)), ("a", job_raw(every_s=60)), ("b", job_raw(after=["x"])),
                   ("c", job_raw(after=["a", "b"]))):
        assert put(s, n, raw)["ok"]
    slot = T0 + 60 * SEC
    tick(s, slot)
    got = {g["job"]: g for g in lease(s, slot + SEC)}
    finish(s, got["x"], slot + 2 * SEC, False)
    m = apply(s, commands.trigger_job(slot + 3 * SEC, None, name="b", extra={"slot": slot, "propagate": True}))["run"]
    (g,) = [g for g in lease(s, slot + 4 * SEC) if g["id"] == m]
    finish(s, g, slot + 5 * SEC, False)
    assert apply(s, commands.dlq_requeue(slot + 6 * SEC, None, run=m))["ok"]
    assert f"c@{slot}" not in s.runs
    assert apply(s, commands.make("pause_job", slot + 7 * SEC, None, name="c"))["ok"]
    assert apply(s, commands.make("resume_job", slot + 8 * SEC, None, name="c"))["ok"]
    finish(s, got["a"], slot + 9 * SEC, True)
    assert f"c@{slot}" not in s.runs and s.pipes.joins["c"][slot]["got"].keys() == {"a"}
