"""A slot run again by hand (``trigger_job`` with ``rerun``) and what ran below it run again too
(``downstream``: Airflow's "clear downstream"), core/backfills.py trigger_job_with and
core/pipelines.py (_rerun_join, _create_rerun). Driven through apply as a replica applies it:
no clock, no network.

What it promises: a slot whose run ended runs again under an id of its own (``NAME@S#manual``,
then ``#manual-N``), never while a run of the slot is still going, never over a dead run (its
place is the dead-letter queue); with ``downstream`` each child that ran for the slot runs again
once its parents' newest outcomes of the slot allow it, with those outcomes as its upstream, and
its children after it, down the graph; a rerun that fails runs nothing below it and leaves the
earlier runs standing; a paused child, or another tenant's for a limited token, is left as it
is; replicas restored from a snapshot hold the same.
"""
from __future__ import annotations

import pytest

from raftsched.core import commands, pipelines

from core_helpers import refused, restored
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, put, tick

S1 = T0 + 10 * SEC  # the first slot of an every_s 10 job put at T0


def trigger(s, now, name, **extra):
    return apply(s, commands.trigger_job(now, None, name=name, extra=extra))


def ran_chain(*children):
    """a every 10 s, and children (name, after) that all ran and succeeded for S1."""
    s = chain_state(("a", job_raw(every_s=10)), *((c, job_raw(after=after)) for c, after in children))
    tick(s, S1)
    _, now = drive(s, S1)
    return s, now


def drive(s, now, outcome=lambda g: True):
    """Lease and finish whatever is due, until nothing is: the ids run, in order."""
    done = []
    while True:
        grants = lease(s, now)
        if not grants:
            return done, now
        for g in grants:
            now += 1
            finish(s, g, now, outcome(g))
            done.append(g["id"])


def test_a_slot_whose_run_ended_runs_again_only_when_asked():
    s, now = ran_chain()
    plain = trigger(s, now + 1, "a", slot=S1)
    assert plain["created"] is False and plain["run"] == f"a@{S1}"  # deduplicated, as ever
    again = trigger(s, now + 2, "a", slot=S1, rerun=True)
    assert again["created"] is True and again["run"] == f"a@{S1}#manual", again
    # While it has not ended, the slot does not run a third time: the answer is that run.
    assert trigger(s, now + 3, "a", slot=S1, rerun=True) == {**again, "created": False}
    done, now = drive(s, now + 4)
    assert done == [f"a@{S1}#manual"]
    third = trigger(s, now + 1, "a", slot=S1, rerun=True)
    assert third["created"] and third["run"].startswith(f"a@{S1}#manual-"), third
    assert s.runs[third["run"]]["kind"] == "manual" and s.runs[third["run"]]["slot"] == S1
    assert restored(s).snapshot() == s.snapshot()


def test_a_dead_slot_is_not_run_again_by_hand_but_requeued():
    s = chain_state(("a", job_raw(every_s=10)))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, False)
    assert s.runs[f"a@{S1}"]["state"] == "dead"
    e = refused(s, commands.trigger_job(S1 + 2, None, name="a", extra={"slot": S1, "rerun": True}), "conflict")["error"]
    assert e["field"] == "rerun" and f"/v1/dlq/a@{S1}/requeue" in e["message"] and e["run"] == f"a@{S1}", e


@pytest.mark.parametrize("extra,why", [
    ({"rerun": True}, "needs a slot"),
    ({"slot": S1, "rerun": "yes"}, "boolean"),
    ({"slot": S1, "rerun": True, "downstream": True}, "with rerun and propagate"),
    ({"slot": S1, "propagate": True, "downstream": True}, "with rerun and propagate"),
    ({"slot": S1, "rerun": True, "propagate": True, "downstream": "all"}, "true or a list"),
    ({"slot": S1, "rerun": True, "propagate": True, "downstream": [1]}, "true or a list"),
])
def test_a_malformed_rerun_is_refused_changing_nothing(extra, why):
    s, now = ran_chain(("b", ["a"]))
    e = refused(s, commands.trigger_job(now + 1, None, name="a", extra=extra), "invalid_command")["error"]
    assert why in e["message"], e  # (refused: the state is as it was)


def test_a_failed_slot_rerun_with_propagate_decides_its_children_again():
    """A cancelled run is failed for good (no retry, no dead-letter queue): a rerun is how it runs
    again, and with propagate its children, which recorded the failure, run after it."""
    s = chain_state(("a", job_raw(every_s=10, retry={"max_attempts": 3, "backoff_s": 0})),
                    ("b", job_raw(after=["a"])))
    tick(s, S1)
    lease(s, S1)
    apply(s, commands.cancel_run(S1 + 1, None, run=f"a@{S1}"))
    assert s.runs[f"b@{S1}"]["reason"] == "upstream_failed"
    made = trigger(s, S1 + 2, "a", slot=S1, rerun=True, propagate=True)
    done, _ = drive(s, S1 + 3)
    assert done == [made["run"], f"b@{S1}"]
    assert s.runs[f"b@{S1}"]["upstream"][0]["run"] == made["run"]


def test_downstream_runs_again_what_ran_below_the_slot_down_the_graph():
    s, now = ran_chain(("b", ["a"]), ("c", ["b"]), ("other", ["a"]))
    tokens = {j: s.runs[f"{j}@{S1}"]["fencing_token"] for j in ("a", "b", "c", "other")}
    made = trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    assert s.runs[made["run"]]["downstream"] is True
    done, now = drive(s, now + 2)
    assert done == [f"a@{S1}#manual", f"b@{S1}#manual", f"other@{S1}#manual", f"c@{S1}#manual"], done
    for j in ("b", "c", "other"):
        r = s.runs[f"{j}@{S1}#manual"]
        assert (r["state"], r["kind"], r["slot"], r["propagate"]) == ("succeeded", "manual", S1, True), r
        assert s.runs[f"{j}@{S1}"]["fencing_token"] == tokens[j]  # the earlier run stands as it was
    assert s.runs[f"c@{S1}#manual"]["upstream"][0]["run"] == f"b@{S1}#manual"
    assert not s.pipes.joins
    assert restored(s).snapshot() == s.snapshot()
    # Without downstream, a rerun runs the slot alone: its children ran for it already.
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True)
    done, _ = drive(s, now + 2)
    assert len(done) == 1 and done[0].startswith(f"a@{S1}#manual-")


def test_a_rerun_that_fails_runs_nothing_below_it_and_leaves_what_ran():
    s, now = ran_chain(("b", ["a"]), ("c", ["b"]))
    before = {rid: dict(r) for rid, r in s.runs.items() if not rid.startswith("a@")}
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    done, _ = drive(s, now + 2, outcome=lambda g: False)
    assert done == [f"a@{S1}#manual"]
    assert {rid: r for rid, r in s.runs.items() if not rid.startswith("a@")} == before
    assert not s.pipes.joins


def test_a_diamond_reruns_its_join_once_with_both_parents_newest_outcomes():
    s, now = ran_chain(("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]))
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    done, _ = drive(s, now + 2)
    assert sorted(done) == sorted([f"a@{S1}#manual", f"b@{S1}#manual", f"c@{S1}#manual", f"d@{S1}#manual"])
    assert done[-1] == f"d@{S1}#manual"
    assert [u["run"] for u in s.runs[f"d@{S1}#manual"]["upstream"]] == [f"b@{S1}#manual", f"c@{S1}#manual"]


def test_a_rerun_join_waits_for_another_parents_rerun_and_a_child_with_a_failed_edge_stays():
    """d runs after b and c; only b is below the rerun of a: d reruns with c's outcome it had. A
    child whose edge the new outcome fails (on: failure, a succeeded parent) is not run again."""
    s = chain_state(("a", job_raw(every_s=10)), ("c", job_raw(every_s=10)), ("b", job_raw(after=["a"])),
                    ("d", job_raw(after=["b", "c"])), ("cleanup", job_raw(after=[{"job": "a", "on": "failure"}])))
    tick(s, S1)
    done, now = drive(s, S1)
    assert f"d@{S1}" in done and s.runs[f"cleanup@{S1}"]["reason"] == "upstream_succeeded"
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    done, _ = drive(s, now + 2)
    assert done == [f"a@{S1}#manual", f"b@{S1}#manual", f"d@{S1}#manual"], done
    assert [u["run"] for u in s.runs[f"d@{S1}#manual"]["upstream"]] == [f"b@{S1}#manual", f"c@{S1}"]
    assert s.runs[f"cleanup@{S1}"]["reason"] == "upstream_succeeded" and not s.pipes.joins


def test_a_paused_child_and_another_tenants_are_left_as_they_are():
    s = chain_state(("a", job_raw(every_s=10, tenant="t1")), ("b", job_raw(after=["a"], tenant="t1")),
                    ("theirs", job_raw(after=["a"], tenant="t2")), ("held", job_raw(after=["a"], tenant="t1")))
    tick(s, S1)
    _, now = drive(s, S1)
    apply(s, commands.pause_job(now + 1, None, name="held"))
    trigger(s, now + 2, "a", slot=S1, rerun=True, propagate=True, downstream=["t1"])
    done, _ = drive(s, now + 3)
    assert done == [f"a@{S1}#manual", f"b@{S1}#manual"], done
    assert not s.pipes.joins


def test_a_child_that_never_ran_for_the_slot_runs_as_its_slots_run_and_carries_the_rerun_on():
    """a's run was cancelled: b recorded the slot upstream_failed, c upstream_missed below it; c ran
    by hand for the slot since. The rerun of a takes b's record back (as a requeue does): b runs
    as b@S and, carrying downstream, c runs again after it."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, S1)
    lease(s, S1)
    apply(s, commands.cancel_run(S1 + 1, None, run=f"a@{S1}"))
    assert s.runs[f"c@{S1}"]["reason"] == "upstream_missed"
    trigger(s, S1 + 2, "c", slot=S1)  # c by hand for the slot: c@S1#manual
    done, now = drive(s, S1 + 3)
    assert done == [f"c@{S1}#manual"]
    made = trigger(s, now + 2, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    assert made["run"] == f"a@{S1}#manual", made
    done, _ = drive(s, now + 3)
    assert done[:2] == [f"a@{S1}#manual", f"b@{S1}"] and done[2].startswith(f"c@{S1}#manual-"), done
    assert s.runs[done[2]]["upstream"][0]["run"] == f"b@{S1}"
    assert restored(s).snapshot() == s.snapshot()


def test_a_rerun_is_the_same_on_a_replica_restored_midway():
    s, now = ran_chain(("b", ["a"]), ("c", ["b"]))
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    g = lease(s, now + 2)[0]
    finish(s, g, now + 3, True)  # b's rerun is queued, c's to come
    twin = restored(s)
    for replica in (s, twin):
        done, _ = drive(replica, now + 4)
        assert done == [f"b@{S1}#manual", f"c@{S1}#manual"]
    assert twin.snapshot() == s.snapshot()


def diamond(gated=False, **more):
    """a -> {b, c} -> d, every job ran for S1; then a's slot rerun with downstream, a's rerun done
    and b's and c's leased: (state, now, {id: grant})."""
    d = job_raw(after=["b", "c"], every_s=10) if gated else job_raw(after=["b", "c"])
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["a"])),
                    ("d", d), *more.items())
    tick(s, S1)
    _, now = drive(s, S1)
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, True)
    return s, now + 4, {g["id"]: g for g in lease(s, now + 4)}


@pytest.mark.parametrize("gated", [False, True])
def test_a_join_below_the_rerun_waits_for_every_parent_the_rerun_reaches(gated):
    """A review: d ran again on c's earlier outcome once b's rerun ended (a gated d read c's
    earlier run at once; a triggered d below branches of other lengths took the shorter's)."""
    s, now, g = diamond(gated)
    finish(s, g[f"b@{S1}#manual"], now + 1, True)
    assert f"d@{S1}#manual" not in s.runs and s.pipes.joins["d"][S1]["fresh"] == ["b"]
    finish(s, g[f"c@{S1}#manual"], now + 2, True)
    assert [u["run"] for u in s.runs[f"d@{S1}#manual"]["upstream"]] == [f"b@{S1}#manual", f"c@{S1}#manual"]
    assert restored(s).snapshot() == s.snapshot()


def test_branches_of_other_lengths_meet_once_on_the_new_outcomes():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c1", job_raw(after=["a"])),
                    ("c2", job_raw(after=["c1"])), ("d", job_raw(after=["b", "c2"])))
    tick(s, S1)
    _, now = drive(s, S1)
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    done, _ = drive(s, now + 2)
    assert [r for r in done if r.startswith("d@")] == [f"d@{S1}#manual"] and done[-1] == f"d@{S1}#manual", done
    assert [u["run"] for u in s.runs[f"d@{S1}#manual"]["upstream"]] == [f"b@{S1}#manual", f"c2@{S1}#manual"]


def test_a_branch_not_run_again_lets_the_join_run_on_its_earlier_outcome_and_none_runs_on_none_new():
    """c's rerun fails: d (after b and c, on success) is not run again, nor e below c; the earlier
    runs stand. c paused while its rerun waited: c is not run again, and d runs on b's new
    outcome and c's earlier one (released to it). Below a job not run again only, nothing runs
    again on earlier outcomes alone."""
    s, now, g = diamond()
    apply(s, commands.pause_job(now, None, name="c"))
    cancel = g[f"c@{S1}#manual"]  # (leased before the pause: it runs on, and is cancelled)
    apply(s, commands.cancel_run(now + 1, None, run=cancel["id"]))
    finish(s, g[f"b@{S1}#manual"], now + 2, True)
    assert f"d@{S1}#manual" not in s.runs and not s.pipes.joins  # (c's cancelled rerun failed d's edge)
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c0", job_raw(after=["a"])),
                    ("c", job_raw(after=["c0"])), ("d", job_raw(after=["b", "c"])))
    tick(s, S1)
    _, now = drive(s, S1)
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, True)
    g = {x["id"]: x for x in lease(s, now + 4)}
    apply(s, commands.pause_job(now + 5, None, name="c"))  # c waits for c0's rerun: paused meanwhile
    finish(s, g[f"c0@{S1}#manual"], now + 6, True)
    assert f"c@{S1}#manual" not in s.runs
    finish(s, g[f"b@{S1}#manual"], now + 7, True)
    assert [u["run"] for u in s.runs[f"d@{S1}#manual"]["upstream"]] == [f"b@{S1}#manual", f"c@{S1}"]
    s, now, g = diamond(e=job_raw(after=["c"]))
    finish(s, g[f"b@{S1}#manual"], now + 1, True)
    finish(s, g[f"c@{S1}#manual"], now + 2, False)
    assert f"d@{S1}#manual" not in s.runs and not s.pipes.joins
    assert s.runs[f"d@{S1}"]["state"] == "succeeded" and f"e@{S1}#manual" not in s.runs
    # A chain whose middle job is paused: what is below it does not run again on earlier outcomes.
    s = chain_state(("a", job_raw(every_s=10)), ("p", job_raw(after=["a"])), ("q", job_raw(after=["p"])))
    tick(s, S1)
    _, now = drive(s, S1)
    apply(s, commands.pause_job(now + 1, None, name="p"))
    trigger(s, now + 2, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    done, _ = drive(s, now + 3)
    assert done == [f"a@{S1}#manual"] and not s.pipes.joins


def test_a_child_paused_or_run_by_hand_while_it_waits_is_not_run_twice_nor_while_paused():
    s, now, g = diamond()
    finish(s, g[f"b@{S1}#manual"], now + 1, True)
    apply(s, commands.pause_job(now + 2, None, name="d"))
    finish(s, g[f"c@{S1}#manual"], now + 3, True)
    assert f"d@{S1}#manual" not in s.runs and not s.pipes.joins and lease(s, now + 4) == []
    s, now, g = diamond()
    finish(s, g[f"b@{S1}#manual"], now + 1, True)
    by_hand = trigger(s, now + 2, "d", slot=S1, rerun=True)  # run again by hand meanwhile
    finish(s, g[f"c@{S1}#manual"], now + 3, True)
    going = [r for r in s.history["d"] if s.runs[r]["state"] == "queued"]
    assert going == [by_hand["run"]], going  # never two runs of the slot at once


def test_a_rerun_below_ignores_overlap_as_a_run_by_hand_does():
    """A review: with overlap replace, a downstream rerun of an old slot revoked the child's run of
    today's slot. A run by hand of a slot (trigger_job_with) applies no overlap rule; nor do the
    runs a rerun makes below it."""
    S2 = S1 + 10 * SEC
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"], overlap={"policy": "replace"})))
    tick(s, S1)
    _, now = drive(s, S1)
    tick(s, S2)
    finish(s, lease(s, S2)[0], S2 + 1, True)
    assert [g["id"] for g in lease(s, S2 + 2)] == [f"b@{S2}"]  # today's run of b, running
    trigger(s, S2 + 3, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, S2 + 4)[0], S2 + 5, True)
    assert s.runs[f"b@{S2}"]["state"] == "running" and s.runs[f"b@{S1}#manual"]["state"] == "queued"


def test_a_parent_added_while_the_join_waits_counts_with_its_outcome():
    s, now, g = diamond(e=job_raw(every_s=10))
    finish(s, g[f"b@{S1}#manual"], now + 1, True)
    assert put(s, "d", job_raw(after=["b", "c", "e"]), now=now + 2)["ok"]
    finish(s, g[f"c@{S1}#manual"], now + 3, True)
    made = s.runs[f"d@{S1}#manual"]
    assert [u["run"] for u in made["upstream"]] == [f"b@{S1}#manual", f"c@{S1}#manual", f"e@{S1}"]
    assert not s.pipes.joins


def test_a_graph_below_past_the_bound_is_refused_and_one_grown_since_is_opened_up_to_it(monkeypatch):
    """The rerun's end opens the graph below in one command, reading each job's history: bounded
    (limits.downstream_jobs_max) as a fan-out is. A trigger whose job has more below is refused,
    changing nothing; jobs put below it since are opened up to the bound."""
    from raftsched.core import limits
    s, now = ran_chain(("b", ["a"]), ("c", ["a"]), ("d", ["a"]))
    monkeypatch.setattr(limits, "downstream_jobs_max", 2)
    e = refused(s, commands.trigger_job(now + 1, None, name="a", extra={
        "slot": S1, "rerun": True, "propagate": True, "downstream": True}), "conflict")["error"]
    assert e["field"] == "downstream" and "more than 2 jobs" in e["message"], e
    monkeypatch.setattr(limits, "downstream_jobs_max", 3)
    trigger(s, now + 2, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    monkeypatch.setattr(limits, "downstream_jobs_max", 2)  # (as if jobs were put below it since)
    done, _ = drive(s, now + 3)
    assert done[0] == f"a@{S1}#manual" and len(done) == 3, done  # two of the three below


def test_an_earlier_outcome_released_is_no_new_success_for_a_latest_child():
    """A second review: a's rerun failed, b's earlier success was released below, and a child of
    match latest took it for a new success and ran again."""
    S2 = S1 + 10 * SEC
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])),
                    ("l", job_raw(every_s=10, after=["b"], match="latest")))
    tick(s, S1)
    drive(s, S1)
    tick(s, S2)
    trigger(s, S2 + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    for g in lease(s, S2 + 2):
        if g["id"] == f"a@{S1}#manual":
            finish(s, g, S2 + 3, False)
    assert [r for r in s.history["l"] if s.runs[r]["state"] != "succeeded"] in ([], [f"l@{S2}"])
    assert all(s.runs[r]["state"] != "queued" for r in s.history["l"]), [s.runs[r] for r in s.history["l"]]


def test_a_long_step_above_does_not_time_out_the_join_below_it():
    """A second review: each join below the rerun counted its max_wait_s from the rerun's end, so
    the tail of a long chain timed out where it never does normally. It counts from the first new
    outcome (before it, each parent's outcome is to come: open_downstream)."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"], max_wait_s=60)))
    tick(s, S1)
    _, now = drive(s, S1)
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, True)
    g = lease(s, now + 4)[0]
    assert pipelines.overdue(s, now + 70 * SEC, 10) == []
    finish(s, g, now + 120 * SEC, True)  # b's rerun took two minutes
    assert s.runs[f"c@{S1}#manual"]["upstream"][0]["run"] == f"b@{S1}#manual"


def test_a_requeue_above_a_waiting_rerun_join_keeps_it_waiting_for_the_new_outcomes():
    """A second review: d@S1 died (c recorded upstream_failed); a's rerun opened c; then d's
    requeue took c's record back and replaced c's rerun join by one holding b's earlier outcome:
    c ran on it, and b's new outcome reached nothing. The slot is decided again (its record was
    what it had), by a join that keeps the newest outcomes: it waits for b's and d's."""
    s = chain_state(("a", job_raw(every_s=10)), ("d", job_raw(every_s=10)), ("b", job_raw(after=["a"])),
                    ("c", job_raw(after=["b", "d"])))
    tick(s, S1)
    _, now = drive(s, S1, outcome=lambda g: not g["id"].startswith("d@"))
    assert s.runs[f"c@{S1}"]["reason"] == "upstream_failed"
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, True)
    assert apply(s, commands.dlq_requeue(now + 4, None, run=f"d@{S1}"))["ok"]
    assert s.pipes.joins["c"][S1]["got"] == {}  # (neither b's old outcome nor d's dead one)
    done, _ = drive(s, now + 5)
    made = [r for r in s.history["c"] if s.runs[r].get("upstream")]
    assert len(made) == 1, made
    assert sorted(u["run"] for u in s.runs[made[0]]["upstream"]) == [f"b@{S1}#manual", f"d@{S1}"]
    assert not s.pipes.joins


def test_a_job_that_loses_its_parents_while_it_waits_lets_go_of_the_graph_below():
    s = chain_state(("a", job_raw(every_s=10)), ("e", job_raw(every_s=10)), ("b", job_raw(after=["a", "e"])),
                    ("c", job_raw(after=["b"])))
    tick(s, S1)
    _, now = drive(s, S1)
    trigger(s, now + 1, "e", slot=S1, rerun=True, propagate=True)  # going when a's rerun ends: b waits
    trigger(s, now + 2, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    grants = {g["job"]: g for g in lease(s, now + 3)}
    finish(s, grants["a"], now + 4, True)
    assert "rerun" in s.pipes.joins["b"][S1] and "rerun" in s.pipes.joins["c"][S1]
    assert put(s, "b", job_raw(every_s=10), now=now + 5)["ok"]  # b has no parents now
    assert not s.pipes.joins  # c: b's earlier outcome released, none new: not run again
    finish(s, grants["e"], now + 6, True)
    assert lease(s, now + 7) == [] and not s.pipes.joins


def test_what_a_rerun_makes_below_is_due_now_and_a_childs_rerun_by_hand_has_its_parents_newest():
    """A walk: the runs made below a rerun were due at their (past) slot, so a queue's oldest
    waiting age read a day for a run queued seconds before; and a child's slot run again by hand
    had no parents' outcomes (ctx.upstream None) where its parents had ended."""
    s, now = ran_chain(("b", ["a"]), ("c", ["b"]))
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, True)
    made = s.runs[f"b@{S1}#manual"]
    assert made["due"] == now + 3 and made["slot"] == S1, made
    by_hand = trigger(s, now + 10, "c", slot=S1, rerun=True)
    assert [u["run"] for u in s.runs[by_hand["run"]]["upstream"]] == [f"b@{S1}"]  # (b's rerun not ended yet)


def test_a_dead_root_requeued_reruns_what_is_below_when_it_ends():
    """A rerun asked for downstream that died: its requeue carries the downstream on (docs)."""
    s, now = ran_chain(("b", ["a"]))
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    finish(s, lease(s, now + 2)[0], now + 3, False)
    root = f"a@{S1}#manual"
    assert s.runs[root]["state"] == "dead" and f"b@{S1}#manual" not in s.runs
    assert apply(s, commands.dlq_requeue(now + 4, None, run=root))["ok"]
    done, _ = drive(s, now + 5)
    assert done == [root, f"b@{S1}#manual"], done


def test_a_record_below_a_rerun_that_a_new_outcome_takes_back_is_decided_again():
    """Found by the property test: c (after b, on failure) had recorded the slot
    upstream_succeeded; below a's rerun it waited to run again, b's new outcome took the record
    back (as any propagating run's does) and then did not meet c's edge: the rerun join was
    dropped, and c's slot was left with no entry at all (P3). It is decided again as any
    re-armed slot: recorded upstream_succeeded anew."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10, after=["a"])),
                    ("c", job_raw(after=[{"job": "b", "on": "failure"}])))
    tick(s, S1)
    _, now = drive(s, S1)
    assert s.runs[f"c@{S1}"]["reason"] == "upstream_succeeded"
    trigger(s, now + 1, "a", slot=S1, rerun=True, propagate=True, downstream=True)
    drive(s, now + 2)
    rec = s.runs[f"c@{S1}"]
    assert rec["reason"] == "upstream_succeeded" and f"b@{S1}#manual" in rec["error"], rec
    assert not s.pipes.joins
