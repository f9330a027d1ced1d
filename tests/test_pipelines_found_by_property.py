"""Pipelines cases the property test (tests/test_pipelines_property.py) and its reviews found once its actions
took in runs of a slot by hand with propagate, pauses and resumes, requeues of any dead run and
children put again with other edges; each test failed on the code before its fix."""
from __future__ import annotations

import pytest

from core_helpers import SEC, T0, apply, resume_cmd, tick
from pipeline_helpers import chain_state, finish, job_raw, lease, put

from raftsched.core import commands, limits, pipelines
from raftsched.core.notify_model import validate_sink

S1 = T0 + 10 * SEC
S2 = T0 + 20 * SEC
#: A sink told of missed slots (test_a_deferred_range_...).
SINK = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook",
                             "secrets": {"signing_key": "k"}, "retry": {"max_attempts": 1}})


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


def test_a_requeue_rearms_a_slot_with_the_outcome_of_a_parent_added_since() -> None:
    """c after a; a's run of S1 dies (c@S1 upstream_failed) and b's succeeds; c is put again
    after a and b (S1 decided: nothing to read back). a's run requeued takes c@S1 back, its join
    restored from the record's reports: b had never reported to c (the edge came after its
    run), so when a succeeded the slot waited for b until max_wait_s and was recorded
    upstream_timeout, though both parents allowed it."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)), ("c", job_raw(after=["a"])))
    tick(s, S1)
    got = {g["job"]: g for g in lease(s, S1 + 1)}
    finish(s, got["a"], S1 + 2, False)
    finish(s, got["b"], S1 + 3, True)
    assert s.runs[f"c@{S1}"]["reason"] == "upstream_failed"
    assert put(s, "c", job_raw(after=["a", "b"]), now=S1 + 4)["ok"]
    res = apply(s, commands.dlq_requeue(S1 + 5, None, run=f"a@{S1}"))
    assert res["ok"] and res["rearmed"] == [f"c@{S1}"], res
    (g,) = lease(s, S1 + 6)
    finish(s, g, S1 + 7, True)
    run = s.runs.get(f"c@{S1}")
    assert run is not None, s.pipes.joins  # (it waited for b's report)
    assert run["state"] == "queued" and [u["job"] for u in run["upstream"]] == ["a", "b"], run
    assert "c" not in s.pipes.joins


@pytest.mark.parametrize("via", [None, "x"])
def test_a_deferred_range_records_no_part_between_two_slots_the_child_decided(via) -> None:
    """c after a (or after x, a triggered child of a) and b; a paused over S1 and S2, whose b
    runs die (c records both upstream_failed). a's resume records its S1..S2 paused (one range,
    x's too), which reaches c in a later fan-out step (another child of a, or of x, takes the
    first): recorded around the slots c decided, it made a part S1+1 ms..S2-1 ms, which holds no
    slot of a's, and told it as a slot.missed."""
    told = [{"sink": "ops", "on": ["slot.missed"]}]
    up = via or "a"
    jobs = [("a", job_raw(every_s=10)), ("b", job_raw(every_s=10))]
    if via:
        jobs.append((via, job_raw(after=["a"])))
    jobs += [("c", job_raw(after=[up, "b"], notify=told)), ("z", job_raw(after=[up]))]
    s = chain_state(*jobs)
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=SINK))["ok"]
    assert apply(s, commands.pause_job(T0 + 1, None, name="a"))["ok"]
    tick(s, S2)  # b fires S1 and S2; a is paused
    for g in lease(s, S2 + 1):
        finish(s, g, S2 + 2, False)  # c@S1, c@S2 upstream_failed
    was = limits.fanout_per_command
    limits.fanout_per_command = 1  # the range reaches c in a fan-out step (z, beside it, later)
    try:
        assert apply(s, resume_cmd(s, "a", S2 + 3))["ok"]  # a's S1..S2 recorded paused, one range
        for _ in range(4):
            for key, after in pipelines.pending_fanout(s, 10):
                assert apply(s, commands.fanout_step(S2 + 4, key=key, after=after))["ok"]
    finally:
        limits.fanout_per_command = was
    assert not s.pipes.fanout and [s.runs[r]["slot"] for r in s.history["z"]] == [S1]  # (z: the range)
    assert [s.runs[r]["slot"] for r in s.history["c"]] == [S1, S2]
    assert [e["slot"] for e in s.outbox.events if e["kind"] == "slot.missed" and e["job"] == "c"] == [S1, S2]


def test_a_range_still_to_be_offered_is_offered_without_the_slot_a_rearm_took_back() -> None:
    """a misses S1..S3 (one range); b, its child, records it, and b's range waits in a fan-out
    step for b's children c and d. a's slot S1 is run by hand with propagate and succeeds: the
    rearm cuts S1 out of b's range, and b's S1 runs; but the step then offered c the range as it
    was, S1 included: c recorded S1 upstream_missed and never ran it after b's success."""
    s3 = T0 + 30 * SEC
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])), ("d", job_raw(after=["b"])))
    was = limits.fanout_per_command
    limits.fanout_per_command = 1  # b's range waits in a step for c and d

    def steps(now):
        while pipelines.pending_fanout(s, 10):
            for key, after in pipelines.pending_fanout(s, 10):
                assert apply(s, commands.fanout_step(now, key=key, after=after))["ok"]

    try:
        tick(s, s3 + 5 * SEC)  # a's S1..S3 recorded missed, one range; b's too
        assert s.runs[f"b@{S1}"]["slot_to"] == s3 and s.pipes.fanout
        res = apply(s, commands.trigger_job(s3 + 6 * SEC, None, name="a", extra={"slot": S1, "propagate": True}))
        (g,) = lease(s, s3 + 7 * SEC)
        finish(s, g, s3 + 8 * SEC, True)  # a@S1#manual: b's range cut, b@S1 runs
        assert res["run"] == f"a@{S1}#manual" and s.runs[f"b@{S1}"]["state"] == "queued"
        steps(s3 + 9 * SEC)
        (g,) = lease(s, s3 + 10 * SEC)
        finish(s, g, s3 + 11 * SEC, True)  # b@S1 succeeds
        steps(s3 + 12 * SEC)
    finally:
        limits.fanout_per_command = was
    for child in ("c", "d"):
        mine = [s.runs[r] for r in s.history[child] if s.runs[r]["slot"] <= S1 <= s.runs[r].get("slot_to", S1)]
        assert [(x["id"], x["state"]) for x in mine] == [(f"{child}@{S1}", "queued")], mine
        assert [(s.runs[r]["slot"], s.runs[r]["slot_to"], s.runs[r]["count"]) for r in s.history[child]
                if "slot_to" in s.runs[r]] == [(S1 + 1, s3, 2)]  # the rest of b's range: S2, S3


@pytest.mark.parametrize("put_later", [False, True])
def test_a_triggered_parent_read_back_starts_the_wait_at_its_report_not_at_the_slot(put_later) -> None:
    """A review: the read-back of a parent added by a put started the slot's wait at the slot
    for any outcome, where a triggered parent's report starts it at the report (_fan): c
    (max_wait_s 60) recorded upstream_timeout a slot whose parents had all allowed it, which
    it ran with the edge there from the start."""
    from pipeline_helpers import put
    s = chain_state(("r", job_raw(every_s=10)), ("x", job_raw(after=["r"])), ("y", job_raw(after=["r"])),
                    ("c", job_raw(after=["x"] if put_later else ["x", "y"], max_wait_s=60)))
    tick(s, S1)
    (g,) = lease(s, S1 + 1)
    finish(s, g, S1 + 2, True)
    got = {g["job"]: g for g in lease(s, S1 + 3)}
    finish(s, got["y"], S1 + 50 * SEC, True)
    if put_later:
        assert put(s, "c", job_raw(after=["x", "y"], max_wait_s=60), now=S1 + 51 * SEC)["ok"]
    finish(s, got["x"], S1 + 100 * SEC, True)
    r = s.runs.get(f"c@{S1}")
    assert r is not None and r["state"] == "queued", r


def test_a_latest_childs_slot_run_by_hand_does_not_take_its_parents_success() -> None:
    """A review: a match-latest child's own slot run by hand kept its join; the parents' next
    success went to that slot (already run: nothing made) and was used up, and the slot after
    it waited on."""
    s = chain_state(("a", job_raw(every_s=300)), ("c", job_raw(every_s=60, after=["a"], match="latest")))
    first = T0 + 60 * SEC
    tick(s, first)
    tick(s, first + 60 * SEC)
    res = apply(s, commands.trigger_job(first + 61 * SEC, None, name="c", extra={"slot": first, "propagate": True}))
    assert res["ok"] and res["run"] == f"c@{first}", res
    t = T0 + 300 * SEC
    tick(s, t)
    for g in lease(s, t + 1):
        if g["job"] == "a":
            finish(s, g, t + 2, True)
    assert s.runs[f"c@{first + 60 * SEC}"]["kind"] == "scheduled"
