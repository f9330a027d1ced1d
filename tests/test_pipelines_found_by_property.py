"""Pipelines cases the property test (tests/test_pipelines_property.py) found once its actions
took in runs of a slot by hand with propagate, pauses and resumes, requeues of any dead run and
children put again with other edges; each test failed on the code before its fix."""
from __future__ import annotations

from core_helpers import SEC, T0, apply, tick
from pipeline_helpers import chain_state, finish, job_raw, lease

from raftsched.core import commands, pipelines

S1 = T0 + 10 * SEC


def test_a_slot_run_by_hand_while_its_join_waited_leaves_no_join_waiting() -> None:
    """c after a and b. b's run of S1 reports; c's slot S1 is run by hand (c@S1, the slot's own
    run); then a's run reports. The join kept b's report and waited on: a's report found the
    slot decided and left it, and explain listed c@S1 as waiting for a, until max_wait_s (a day
    by default) and the leader's sweep dropped it. P3: nothing waits for a slot its parents
    have all decided."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)), ("c", job_raw(after=["a", "b"])))
    tick(s, S1)
    got = {g["job"]: g for g in lease(s, S1 + 1)}
    finish(s, got["b"], S1 + 2, True)
    res = apply(s, commands.trigger_job(S1 + 3, None, name="c", extra={"slot": S1, "propagate": True}))
    assert res["ok"] and res["run"] == f"c@{S1}", res
    finish(s, got["a"], S1 + 4, True)
    assert S1 not in s.pipes.joins.get("c", {}), s.pipes.joins
    assert pipelines.pending(s, "c", 20) == []
    assert [r for r in s.history["c"]] == [f"c@{S1}"]  # the run by hand, made once
