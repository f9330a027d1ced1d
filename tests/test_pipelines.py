"""Pipelines in the core (core/pipelines.py, docs/pipelines.md): a child's run or record is made
in the command that records its parents' final outcome, once, and no slot is silent. No clock,
no network: commands applied to a replica as replication applies them."""
from __future__ import annotations

import pytest

from raftsched.core import commands, limits, model, pipelines
from raftsched.core.errors import InvalidSpec

from core_helpers import complete_many, new_state, restored
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, put, tick

S1 = T0 + 10 * SEC  # the first slot of an every_s 10 job put at T0


def states(s, *ids):
    return {i: (s.runs[i]["state"], s.runs[i].get("reason")) if i in s.runs else None for i in ids}


def by_job(grants):
    return {g["job"]: g for g in grants}


def test_a_chain_runs_slot_by_slot_with_the_parents_outcome_and_result():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, S1)
    (ga,) = lease(s, S1)
    assert lease(s, S1) == [] and "b@%d" % S1 not in s.runs  # nothing before a's outcome
    finish(s, ga, S1 + 1, True, result={"rows": 3})
    (gb,) = lease(s, S1 + 2)
    assert gb["id"] == f"b@{S1}" and gb["slot"] == S1
    assert gb["upstream"] == [{"job": "a", "run": f"a@{S1}", "outcome": "succeeded", "token": ga["token"],
                               "result": {"rows": 3}}]
    finish(s, gb, S1 + 3, True)
    (gc,) = lease(s, S1 + 4)
    assert gc["id"] == f"c@{S1}" and gc["upstream"][0]["run"] == f"b@{S1}"
    assert restored(s).snapshot() == s.snapshot()


def test_a_diamond_child_runs_once_after_both_parents():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["a"])),
                    ("d", job_raw(after=["b", "c"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, True)
    g = by_job(lease(s, S1 + 1))
    assert set(g) == {"b", "c"}
    finish(s, g["b"], S1 + 2, True)
    assert f"d@{S1}" not in s.runs and s.pipes.joins["d"][S1]["got"].keys() == {"b"}
    finish(s, g["c"], S1 + 3, True)
    (gd,) = lease(s, S1 + 4)
    assert gd["id"] == f"d@{S1}" and [u["job"] for u in gd["upstream"]] == ["b", "c"]
    assert s.pipes.joins == {}
    assert [r for r in s.runs if r.startswith("d@")] == [f"d@{S1}"]


def test_retries_are_not_final_and_a_dead_parent_records_its_children_naming_it():
    s = chain_state(("a", job_raw(every_s=10, retries=2)), ("ok", job_raw(after=["a"])),
                    ("onfail", job_raw(after=[{"job": "a", "on": "failure"}])),
                    ("any", job_raw(after=[{"job": "a", "on": "finished"}])), ("grand", job_raw(after=["ok"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, False)  # attempt 1 of 2 failed: a retry is pending
    assert s.runs[f"a@{S1}"]["state"] == "queued" and not s.pipes.joins
    assert all(f"{c}@{S1}" not in s.runs for c in ("ok", "onfail", "any"))
    finish(s, lease(s, S1 + 1)[0], S1 + 1, False)  # dead
    assert states(s, f"ok@{S1}", f"grand@{S1}") == {f"ok@{S1}": ("skipped", "upstream_failed"),
                                                    f"grand@{S1}": ("skipped", "upstream_missed")}
    assert f"a@{S1}" in s.runs[f"ok@{S1}"]["error"]
    assert {g["job"] for g in lease(s, S1 + 2)} == {"onfail", "any"}


def test_requeuing_a_dead_parent_rearms_its_children_transitively():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, True)
    gb = lease(s, S1 + 1)[0]
    finish(s, gb, S1 + 2, False)
    assert states(s, f"c@{S1}") == {f"c@{S1}": ("skipped", "upstream_failed")}
    res = apply(s, commands.dlq_requeue(S1 + 3, None, run=f"b@{S1}"))
    assert res["rearmed"] == [f"c@{S1}"] and f"c@{S1}" not in s.runs
    finish(s, lease(s, S1 + 4)[0], S1 + 5, True)
    (gc,) = lease(s, S1 + 6)
    assert gc["id"] == f"c@{S1}" and gc["upstream"][0]["token"] == s.runs[f"b@{S1}"]["fencing_token"]
    # Requeuing a child alone is allowed: it runs, its own children follow.
    finish(s, gc, S1 + 7, False)
    assert apply(s, commands.dlq_requeue(S1 + 8, None, run=f"c@{S1}"))["ok"]
    assert lease(s, S1 + 9)[0]["id"] == f"c@{S1}"


def test_a_stale_completion_triggers_nothing_and_a_retried_one_adds_nothing():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])))
    tick(s, S1)
    ga = lease(s, S1)[0]
    # The lease is lost (the worker paused) and granted again: the old token's success is refused.
    apply(s, commands.expire(S1 + 1, runs=[[ga["id"], ga["token"], 0]], locks=[]))
    ga2 = lease(s, S1 + 2)[0]
    stale = complete_many(s, commands.complete_many(S1 + 3, None, results=[{"run": ga["id"], "token": ga["token"],
                                                                            "success": True}], worker="w"))[1]
    assert not stale[0]["ok"] and f"b@{S1}" not in s.runs
    item = [{"run": ga2["id"], "token": ga2["token"], "success": True}]
    assert complete_many(s, commands.complete_many(S1 + 4, "req-1", results=item, worker="w"))[1][0]["ok"]
    again, each = complete_many(s, commands.complete_many(S1 + 5, "req-1", results=item, worker="w"))
    assert again["duplicate"] and each[0]["ok"]  # the same request, answered from its id
    assert [r for r in s.runs if r.startswith("b@")] == [f"b@{S1}"]


def test_a_manual_trigger_propagates_only_when_asked():
    s = chain_state(("a", job_raw(every_s=3600)), ("b", job_raw(after=["a"])))
    r1 = apply(s, commands.trigger_job(T0 + 1, None, name="a"))
    finish(s, lease(s, T0 + 1)[0], T0 + 2, True)
    assert not [r for r in s.runs if r.startswith("b@")]
    apply(s, commands.trigger_job(T0 + 3, None, name="a", extra={"propagate": True}))
    finish(s, lease(s, T0 + 3)[0], T0 + 4, True)
    (gb,) = lease(s, T0 + 5)
    assert gb["id"] == f"b@{T0 + 3}" and r1["run"] != gb["upstream"][0]["run"]


def test_missed_parent_slots_are_recorded_in_the_child_never_silent():
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, T0 + 45 * SEC)  # four slots missed, recorded as one range
    rec = s.runs[f"a@{S1}"]
    assert rec["state"] == "skipped" and rec.get("slot_to") == T0 + 40 * SEC
    for child in ("b", "c"):
        r = s.runs[f"{child}@{S1}"]
        assert (r["state"], r["reason"], r["slot_to"], r["count"]) == ("skipped", "upstream_missed",
                                                                      T0 + 40 * SEC, rec["count"])


def test_a_gated_job_waits_for_its_parents_same_slot():
    s = chain_state(("a", job_raw(every_s=10)), ("g", job_raw(every_s=10, after=["a"])))
    tick(s, S1)
    (ga,) = lease(s, S1)  # g's slot came too, but waits
    assert f"g@{S1}" not in s.runs and s.pipes.joins["g"][S1]["own"] is True
    finish(s, ga, S1 + 1, True)
    (gg,) = lease(s, S1 + 2)
    assert gg["id"] == f"g@{S1}"


def test_match_latest_waits_for_a_success_since_the_child_last_ran():
    s = chain_state(("a", job_raw(every_s=5)), ("g", job_raw(every_s=10, after=["a"], match="latest")))
    tick(s, T0 + 5 * SEC)
    finish(s, lease(s, T0 + 5 * SEC)[0], T0 + 6 * SEC, True)
    tick(s, S1)
    grants = by_job(lease(s, S1))
    assert set(grants) == {"a", "g"} and grants["g"]["upstream"][0]["run"] == f"a@{T0 + 5 * SEC}"
    finish(s, grants["a"], S1 + 1, False)  # a fails: the next g slot waits
    tick(s, T0 + 20 * SEC)
    assert {g["job"] for g in lease(s, T0 + 20 * SEC)} == {"a"}
    assert f"g@{T0 + 20 * SEC}" not in s.runs


def test_edges_are_checked_in_apply_cycles_and_unknown_parents_name_the_edge():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    res = put(s, "a", job_raw(every_s=10, after=["c"]))
    assert res["error"]["code"] == "invalid" and res["error"]["field"] == "after[0].job"
    assert "cycle" in res["error"]["message"] and "a -> c" in res["error"]["message"]
    res = put(s, "x", job_raw(after=["nope"]))
    assert res["error"]["field"] == "after[0].job" and "nope -> x" in res["error"]["message"]
    assert "x" not in s.jobs
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("x", job_raw(after=["x"]))
    assert e.value.field == "after[0].job"
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("x", job_raw(after=[{"job": "a", "on": "maybe"}]))
    assert e.value.field == "after[0].on"
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("x", job_raw())  # neither schedule nor after
    assert e.value.field == "schedule"


def test_a_child_takes_any_deadline_and_no_heartbeat_executor():
    """A child's per-slot deadlines are carried by its root's fire (test_core_deadlines.py
    test_a_pipeline_childs_slot_deadline_is_carried_by_its_roots_fire_and_judged_like_any); a
    heartbeat child is refused (its runs are what pings report)."""
    for raw in (job_raw(after=["a"]), job_raw(every_s=10, after=["a"])):
        with pytest.raises(InvalidSpec) as e:
            model.validate_job("x", {**raw, "executor": {"type": "heartbeat"}})
        assert e.value.field == "after"
        d = {"max_since_success_s": 600, "succeed_within_s": 60, "succeed_by": "03:00"}
        assert model.validate_job("x", {**raw, "deadline": d})["deadline"] == d


def test_a_batch_may_name_parents_later_in_it():
    s = chain_state()
    items = []
    for name, raw in (("c", job_raw(after=["b"])), ("b", job_raw(after=["a"])), ("a", job_raw(every_s=10))):
        spec = model.validate_job(name, raw, T0)
        nxt = T0 + 10 * SEC if "schedule" in spec else None
        items.append({"name": name, "spec": spec, "next": nxt, "cursor": T0, "anchor": T0, "create_only": False})
    assert apply(s, commands.put_jobs(T0, None, jobs=items))["ok"]
    assert s.pipes.children == {"a": {"b": None}, "b": {"c": None}}
    items[0]["spec"] = model.validate_job("c", job_raw(after=["zz"]), T0)
    res = apply(s, commands.put_jobs(T0, None, jobs=items))
    assert res["error"]["field"] == "after[0].job"


def test_delete_with_dependents_is_a_conflict_unless_forced_then_they_record_dependency_missing():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)), ("c", job_raw(after=["a", "b"])))
    tick(s, S1)
    g = by_job(lease(s, S1))
    finish(s, g["b"], S1, True)  # c@S1 waits for a
    res = apply(s, commands.delete_job(S1 + 1, None, name="a"))
    assert res["error"]["code"] == "conflict" and res["error"]["dependents"] == ["c"]
    assert apply(s, commands.delete_job(S1 + 2, None, name="a", force=True))["ok"]
    assert states(s, f"c@{S1}") == {f"c@{S1}": ("skipped", "dependency_missing")}
    # b's next outcome: c's slot is recorded at once, a is gone.
    tick(s, T0 + 20 * SEC)
    finish(s, lease(s, T0 + 20 * SEC)[0], T0 + 21 * SEC, True)
    assert states(s, f"c@{T0 + 20 * SEC}")[f"c@{T0 + 20 * SEC}"] == ("skipped", "dependency_missing")
    assert restored(s).snapshot() == s.snapshot()


def test_slots_waiting_past_max_wait_are_recorded_upstream_timeout():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)),
                    ("c", job_raw(after=["a", "b"], max_wait_s=60)))
    tick(s, S1)
    finish(s, by_job(lease(s, S1))["a"], S1, True)
    from raftsched.core import pipelines
    assert pipelines.overdue(s, S1 + 59 * SEC, 10) == []
    due = pipelines.overdue(s, S1 + 60 * SEC, 10)
    assert due == [["c", S1, S1]]
    assert apply(s, commands.join_expire(S1 + 60 * SEC, joins=due))["expired"] == 1
    r = s.runs[f"c@{S1}"]
    assert (r["state"], r["reason"]) == ("skipped", "upstream_timeout") and f"b@{S1}" in r["error"]
    again = apply(s, commands.join_expire(S1 + 61 * SEC, joins=due))
    assert again == {"ok": True, "expired": 0, "ignored": 1}


def test_a_triggered_childs_wait_counts_from_its_slot_whatever_its_parents_report_when():
    """max_wait_s of a child run by its parents counted from the first parent's report: with one
    parent, that report completed the join at once, so no wait ever ran out (a parent retried
    for hours still ran its child); with two, it counted from the first one's end. It counts from
    the slot: a parent whose outcome comes past it records the child upstream_timeout."""
    from raftsched.core import pipelines
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)),
                    ("one", job_raw(after=["a"], max_wait_s=3)), ("two", job_raw(after=["a", "b"], max_wait_s=3)))
    tick(s, S1)
    runs = by_job(lease(s, S1))
    finish(s, runs["b"], S1 + 2500, True)  # in time
    assert s.pipes.joins["two"][S1]["since"] == S1
    assert pipelines.overdue(s, S1 + 2999, 10) == [] and pipelines.overdue(s, S1 + 3000, 10) == [["two", S1, S1]]
    finish(s, runs["a"], S1 + 3500, True)  # past the wait
    for c in ("one", "two"):
        r = s.runs[f"{c}@{S1}"]
        assert (r["state"], r["reason"]) == ("skipped", "upstream_timeout"), (c, r)
    # in time, the same child runs
    tick(s, S1 + 10 * SEC)
    runs = by_job(lease(s, S1 + 10 * SEC))
    finish(s, runs["a"], S1 + 12 * SEC, True)
    assert s.runs[f"one@{S1 + 10 * SEC}"]["state"] == "queued"
    # a manual run of an old slot, asked to propagate: the wait starts with it, not at the slot
    old = S1 - 3600 * SEC
    made = apply(s, commands.trigger_job(S1 + 20 * SEC, None, name="a", extra={"slot": old, "propagate": True}))
    assert made["ok"], made
    (g,) = [g for g in lease(s, S1 + 20 * SEC) if g["id"] == made["run"]]
    finish(s, g, S1 + 21 * SEC, True)
    assert s.runs[f"one@{old}"]["state"] == "queued", s.runs[f"one@{old}"]


def test_a_gated_slot_fired_ahead_waits_max_wait_s_from_its_slot_not_from_its_fire():
    """g's own slot S1, fired 4 s ahead, with max_wait_s 3: it is never decided before its slot,
    and a parent that ends 2.5 s after the slot is still in time (counted from the fire, the
    wait ran out 1 s before the slot)."""
    from raftsched.core import pipelines
    s = chain_state(("a", job_raw(every_s=10)), ("g", job_raw(every_s=10, after=["a"], max_wait_s=3)))
    ahead = [["a", s.jobs["a"]["gen"], s.jobs["a"]["cursor"], S1, S1 + 10 * SEC, [S1], []],
             ["g", s.jobs["g"]["gen"], s.jobs["g"]["cursor"], S1, S1 + 10 * SEC, [S1], []]]
    assert apply(s, commands.make("fire", S1 - 4000, None, entries=ahead))["fired"] == 2
    assert pipelines.overdue(s, S1 - 1, 10) == [] and pipelines.overdue(s, S1 + 2999, 10) == []
    late = apply(s, commands.join_expire(S1 - 1, joins=[["g", S1, S1 - 4000]]))
    assert late == {"ok": True, "expired": 0, "ignored": 1}, "a sweep planned from the fire time"
    finish(s, by_job(lease(s, S1))["a"], S1 + 2500, True)
    assert s.runs[f"g@{S1}"]["state"] == "queued"
    assert pipelines.overdue(s, S1 + 10 * SEC, 10) == []


def test_a_gated_slot_whose_parent_reported_before_its_own_fire_still_waits_from_its_slot():
    """A heartbeat parent pinged for slot S before S made g's join first; its wait counts from S
    all the same (before 2026-12-06: from the ping, until g's own slot, fired ahead after it,
    moved it to S): nothing decides g@S before S."""
    from raftsched.core import pipelines
    s = chain_state(("h", job_raw(every_s=10, executor={"type": "heartbeat"})), ("b", job_raw(every_s=10)),
                    ("g", job_raw(every_s=10, after=["h", "b"], max_wait_s=1)))
    plan = [[n, s.jobs[n]["gen"], s.jobs[n]["cursor"], S1, S1 + 10 * SEC, [S1], []] for n in ("h", "b")]
    assert apply(s, commands.make("fire", S1 - 4000, None, entries=plan))["fired"] == 2
    assert apply(s, commands.ping(S1 - 3000, None, name="h", status="success", slot=S1))["ok"]
    assert s.pipes.joins["g"][S1]["since"] == S1
    own = [["g", s.jobs["g"]["gen"], s.jobs["g"]["cursor"], S1, S1 + 10 * SEC, [S1], []]]
    assert apply(s, commands.make("fire", S1 - 1000, None, entries=own))["fired"] == 1
    assert s.pipes.joins["g"][S1]["since"] == S1
    assert pipelines.overdue(s, S1 - 1000, 10) == [] and pipelines.overdue(s, S1 + 999, 10) == []
    assert pipelines.overdue(s, S1 + 1000, 10) == [["g", S1, S1]]


@pytest.mark.parametrize("joins", [None, "x", [["c"]], [["c", "slot", 1]], [[1, 2, 3]],
                                   [["c", 1, 1]] * (limits.expire_items_max + 1)])
def test_a_malformed_join_expire_is_refused_and_changes_nothing(joins):
    s = chain_state(("a", job_raw(every_s=10)), ("c", job_raw(after=["a"])))
    before = s.snapshot()
    res = apply(s, commands.make("join_expire", T0, None, joins=joins))
    assert not res["ok"] and res["error"]["code"] == "invalid_command"
    s.applied -= 1
    assert s.snapshot() == before


@pytest.mark.parametrize("spec_patch", [{"after": "a"}, {"after": [{"job": 1, "on": "success"}]},
                                        {"after": [{"job": "a", "on": "sometimes"}]}, {"match": "never"}])
def test_a_malformed_stored_after_is_refused_in_apply(spec_patch):
    s = chain_state(("a", job_raw(every_s=10)))
    spec = model.validate_job("c", job_raw(after=["a"]))
    spec.update(spec_patch)
    res = apply(s, commands.put_job(T0, None, name="c", spec=spec, next=None, cursor=T0, anchor=T0,
                                    create_only=False))
    assert res["error"]["code"] == "invalid_command" and "c" not in s.jobs


def test_a_result_too_large_is_not_kept():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, True, result="x" * (limits.result_bytes_max + 1))
    assert lease(s, S1 + 1)[0]["upstream"][0]["result"] is None


def test_a_fan_out_beyond_one_commands_bound_goes_on_in_bounded_steps(monkeypatch):
    from raftsched.core import pipelines
    monkeypatch.setattr(limits, "fanout_per_command", 2)
    s = chain_state(("a", job_raw(every_s=10)), *((f"c{i}", job_raw(after=["a"])) for i in range(5)))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, True)
    assert sorted(r for r in s.runs if r.startswith("c")) == [f"c0@{S1}", f"c1@{S1}"]
    assert pipelines.pending_fanout(s, 10) == [["0000000000000001", "c1"]]
    # the children still to be offered wait, and say so (a review: shown as decided, 404)
    view = pipelines.waiting_run_or_why(s, f"c4@{S1}")
    assert isinstance(view, dict) and view["state"] == "waiting", view
    assert {v["job"] for v in pipelines.slot_runs(s, "a", S1)} >= {"c2", "c3", "c4"}
    assert restored(s).snapshot() == s.snapshot()  # the rest is in the state, not in a leader's memory
    step = commands.fanout_step(S1 + 1, key="0000000000000001", after="c1")
    assert apply(s, step)["ok"]
    assert apply(s, step) == {"ok": True, "ignored": True}  # a new leader repeating it adds nothing
    (key, after), = pipelines.pending_fanout(s, 10)
    assert apply(s, commands.fanout_step(S1 + 2, key=key, after=after))["pending"] == 0
    assert sorted(r for r in s.runs if r.startswith("c")) == [f"c{i}@{S1}" for i in range(5)]
    assert apply(s, commands.make("fanout_step", S1, None, key=1, after=None))["error"]["code"] == "invalid_command"


def test_a_backfill_with_cascade_reaches_the_children_and_redecides_a_slot_they_recorded():
    from raftsched.core import backfill_model
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, False)  # a@S1 dead: b@S1 recorded upstream_failed
    assert s.runs[f"b@{S1}"]["reason"] == "upstream_failed"
    req = backfill_model.validate_backfill({"from": "2026-05-28T20:26:50Z", "to": "2026-05-28T20:27:00Z",
                                            "reprocess": "failed", "cascade": "children"}, S1 + 15 * SEC)
    assert req["cascade"] == "children"
    job = s.jobs["a"]
    fields = {"name": "bf1", "job": "a", "from": req["from"], "to": req["to"], "reprocess": "failed",
              "order": "oldest", "max_concurrent": 1, "rate_milli": None, "max_slots": 10, "overlap": "allow",
              "planned": 1, "schedule": job["spec"]["schedule"], "anchor": job["anchor"], "cascade": "children"}
    assert apply(s, commands.backfill(S1 + 15 * SEC, "r1", fields))["ok"]
    from backfill_helpers import step
    assert step(s, "bf1", S1 + 15 * SEC)["created"] == 1
    (g,) = lease(s, S1 + 16 * SEC)
    assert g["id"].startswith(f"a@{S1}") and s.runs[g["id"]]["propagate"] is True
    finish(s, g, S1 + 17 * SEC, True)
    # b@S1 is decided in that command, and held by the backfill until its budget allows a run
    assert lease(s, S1 + 17 * SEC) == [] and list(s.backfills["bf1"]["held"]) == [f"b@{S1}"]
    res = step(s, "bf1", S1 + 18 * SEC)
    assert res["children_queued"] == 1 and res["children_held"] == 0 and res["state"] == "running"
    (gb,) = lease(s, S1 + 18 * SEC)
    assert gb["id"] == f"b@{S1}" and gb["upstream"][0]["run"] == g["id"]
    assert s.runs[gb["id"]]["backfill"] == "bf1"
    finish(s, gb, S1 + 19 * SEC, True)
    assert step(s, "bf1", S1 + 20 * SEC)["state"] == "done"  # done once the cascade's runs are
    with pytest.raises(InvalidSpec) as e:
        backfill_model.validate_backfill({"from": "2026-05-28T20:26:50Z", "to": "2026-05-28T20:27:00Z",
                                          "cascade": "all"}, S1 + 15 * SEC)
    assert e.value.field == "cascade"


def test_a_heartbeat_parents_pings_reach_its_children():
    """A heartbeat job's run ends by a ping (core/deadlines.py apply_ping), not by a worker's
    completion: its outcome is final like any run's, so its children follow it."""
    s = chain_state(("hb", job_raw(every_s=10, executor={"type": "heartbeat"})),
                    ("ok", job_raw(after=["hb"])), ("onfail", job_raw(after=[{"job": "hb", "on": "failure"}])))
    tick(s, S1)
    assert s.runs[f"hb@{S1}"]["state"] == "waiting"
    res = apply(s, commands.ping(S1 + 1, None, name="hb", status="success", slot=S1))
    assert res["ok"], res
    assert states(s, f"ok@{S1}", f"onfail@{S1}") == {f"ok@{S1}": ("queued", None),
                                                      f"onfail@{S1}": ("skipped", "upstream_succeeded")}


def test_a_paused_childs_record_reaches_its_own_children_and_their_records_are_told():
    """A triggered child's slot recorded instead of run (the child paused; its overlap rule
    records the same way) is a final outcome like any record: its own children record the slot,
    and each record is a ``slot.missed`` event (docs/notifications.md) but the paused one (as a
    paused job's slots are not)."""
    from raftsched.core.notify_model import validate_sink
    s = new_state()
    sink = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=sink))["ok"]
    told_to = [{"sink": "ops", "on": ["slot.missed"]}]
    for name, raw in (("a", job_raw(every_s=10)), ("b", job_raw(after=["a"], notify=told_to)),
                      ("c", job_raw(after=["b"], notify=told_to))):
        assert put(s, name, raw)["ok"]
    assert apply(s, commands.make("pause_job", T0, None, name="b"))["ok"]
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, True)
    assert states(s, f"b@{S1}", f"c@{S1}") == {f"b@{S1}": ("skipped", "paused"),
                                                f"c@{S1}": ("skipped", "upstream_missed")}
    assert s.pipes.joins == {}
    told = [(e["job"], e["reason"]) for e in s.outbox.events if e["kind"] == "slot.missed"]
    assert told == [("c", "upstream_missed")]


def test_a_failure_handler_not_needed_is_recorded_upstream_succeeded_and_not_told_as_missed():
    """A user's walk: a child `after` its parent `on: failure` (a handler of its failure) was
    recorded upstream_failed and told as slot.missed at every success of the parent: paged on
    every normal night, under a reason saying the parent failed. Such a slot is recorded
    ``upstream_succeeded`` and told as nothing (its children still follow it), at once, whatever
    its other parents are still to do. A handler whose other parent's own edge failed first is
    upstream_failed, and told; the parent's death runs it."""
    from raftsched.core.notify_model import validate_sink
    s = new_state()
    sink = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=sink))["ok"]
    told_to = [{"sink": "ops", "on": ["slot.missed", "deadline.missed"]}]
    for name, raw in (("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)),
                      ("onfail", job_raw(after=[{"job": "a", "on": "failure"}], notify=told_to,
                                         deadline={"succeed_within_s": 60})),
                      ("grand", job_raw(after=["onfail"], notify=told_to)),
                      ("both", job_raw(after=[{"job": "a", "on": "failure"}, {"job": "b", "on": "success"}],
                                       notify=told_to))):
        assert put(s, name, raw)["ok"]
    tick(s, S1)
    got = by_job(lease(s, S1))
    finish(s, got["b"], S1, False)  # b dead: both's success edge fails, which says more
    finish(s, got["a"], S1, True)
    assert states(s, f"onfail@{S1}", f"both@{S1}", f"grand@{S1}") == {
        f"onfail@{S1}": ("skipped", "upstream_succeeded"), f"both@{S1}": ("skipped", "upstream_failed"),
        f"grand@{S1}": ("skipped", "upstream_succeeded")}  # (its handler parent not needed: nor is it)
    assert f"onfail@{S1}" not in s.deadlines.slots  # its deadline applies to no run: dropped, not missed
    assert "a@" in s.runs[f"onfail@{S1}"]["error"] and "failure" in s.runs[f"onfail@{S1}"]["error"]
    told = [(e["kind"], e["job"], e["reason"]) for e in s.outbox.events]
    assert told == [("slot.missed", "both", "upstream_failed")], told
    # The next slot: a dies, and its handler runs.
    S2 = S1 + 10 * SEC
    tick(s, S2)
    got = by_job(lease(s, S2))
    finish(s, got["a"], S2, False)
    assert "onfail" in {g["job"] for g in lease(s, S2 + 1)}


def test_a_run_a_full_drop_oldest_queue_drops_reaches_the_children():
    """A queued run dropped by a full ``drop_oldest`` queue is recorded skipped / queue_full: a
    final outcome, so the children record the slot instead of waiting for it."""
    s = chain_state()
    apply(s, commands.make("put_queue", T0, None, name="q1", max_depth=1, on_full="drop_oldest"))
    assert put(s, "a", job_raw(every_s=10, queue="q1"))["ok"]
    assert put(s, "b", job_raw(after=["a"]))["ok"]
    tick(s, S1)
    tick(s, S1 + 10 * SEC)  # a@S1 never ran: dropped for a@S2
    assert states(s, f"a@{S1}", f"b@{S1}") == {f"a@{S1}": ("skipped", "queue_full"),
                                                f"b@{S1}": ("skipped", "upstream_missed")}
    assert s.pipes.joins == {}


# ----------------------------------------------------------------------------- a paused gated child
S1 = T0 + 10 * SEC


def _gated_fired_ahead_and_paused():
    """a every 10 s; g every 10 s after a. Both fired ahead for S1 at S1-1.5s (g's slot waits in
    its join), then g paused at S1-1s. :returns: (state, a's grant for S1)."""
    s = chain_state(("a", job_raw(every_s=10)), ("g", job_raw(every_s=10, after=["a"])))
    ahead = [["a", s.jobs["a"]["gen"], s.jobs["a"]["cursor"], S1, S1 + 10 * SEC, [S1], []],
             ["g", s.jobs["g"]["gen"], s.jobs["g"]["cursor"], S1, S1 + 10 * SEC, [S1], []]]
    assert apply(s, commands.make("fire", S1 - 1500, None, entries=ahead))["fired"] == 2
    assert s.pipes.joins["g"][S1]["own"] is True
    assert apply(s, commands.make("pause_job", S1 - 1000, None, name="g"))["ok"]
    (ga,) = lease(s, S1)
    return s, ga


def test_a_paused_gated_childs_slot_fired_ahead_is_held_when_its_parent_lets_it_be_made():
    """Its run is made when a's run ends, while g is paused: held, as the pause holds what it
    fired ahead (before, it was handed to a worker)."""
    s, ga = _gated_fired_ahead_and_paused()
    finish(s, ga, S1 + 100, True)
    run = s.runs[f"g@{S1}"]
    assert (run["state"], run["due"]) == ("queued", None)
    for replica in (s, restored(s)):
        assert f"g@{S1}" not in [g["id"] for g in lease(replica, S1 + 200)]
    res = apply(s, commands.make("resume_job", S1 + 300, None, name="g", catch_up=True))
    assert (res["released"], res["skipped"]) == (1, 0), res
    assert [g["id"] for g in lease(s, S1 + 400)] == [f"g@{S1}"]


def test_a_paused_latest_childs_run_made_before_its_slot_is_held():
    s = chain_state(("a", job_raw(every_s=5)), ("g", job_raw(every_s=10, after=["a"], match="latest")))
    a5 = T0 + 5 * SEC
    apply(s, commands.make("fire", a5, None, entries=[["a", s.jobs["a"]["gen"], s.jobs["a"]["cursor"], a5,
                                                        a5 + 5 * SEC, [a5], []]]))
    (ga,) = lease(s, a5)
    g = s.jobs["g"]
    apply(s, commands.make("fire", S1 - 1500, None, entries=[["g", g["gen"], g["cursor"], S1, S1 + 10 * SEC, [S1], []]]))
    assert f"g@{S1}" not in s.runs
    assert apply(s, commands.make("pause_job", S1 - 1000, None, name="g"))["ok"]
    finish(s, ga, S1 - 800, True)          # g@S1 is made now, paused, its slot still to come
    assert s.runs[f"g@{S1}"]["due"] is None
    for replica in (s, restored(s)):
        assert f"g@{S1}" not in [x["id"] for x in lease(replica, S1 + 100)]


def test_a_rearmed_join_of_a_paused_gated_child_keeps_its_hold():
    """g's own slot S1, fired ahead, is held by g's pause; a@S1 dies, so g@S1 is recorded
    upstream_failed; a@S1 is requeued from the DLQ while g is still paused (its join is made
    again) and succeeds: g@S1 is made held, not handed to a worker of the paused job. After the
    resume, a later rearm of the slot is not held any more."""
    s, ga = _gated_fired_ahead_and_paused()
    assert s.pipes.joins["g"][S1].get("held") is True
    finish(s, ga, S1 + 100, False)  # max_attempts 1: dead
    assert s.runs[f"g@{S1}"]["reason"] == "upstream_failed"
    res = apply(s, commands.dlq_requeue(S1 + 200, None, run=f"a@{S1}"))
    assert res["rearmed"] == [f"g@{S1}"], res
    (ga2,) = lease(s, S1 + 300)
    finish(s, ga2, S1 + 400, True)
    run = s.runs[f"g@{S1}"]
    assert (run["state"], run["due"]) == ("queued", None), run
    for replica in (s, restored(s)):
        assert f"g@{S1}" not in [x["id"] for x in lease(replica, S1 + 500)]


def test_a_slot_recorded_while_held_is_not_held_after_the_resume():
    s, ga = _gated_fired_ahead_and_paused()
    finish(s, ga, S1 + 100, False)
    assert s.runs[f"g@{S1}"].get("held") is True
    apply(s, commands.make("resume_job", S1 + 150, None, name="g", catch_up=True))
    assert "held" not in s.runs[f"g@{S1}"]
    assert apply(s, commands.dlq_requeue(S1 + 200, None, run=f"a@{S1}"))["rearmed"] == [f"g@{S1}"]
    (ga2,) = lease(s, S1 + 300)
    finish(s, ga2, S1 + 400, True)
    assert [x["id"] for x in lease(s, S1 + 500)] == [f"g@{S1}"]


def test_a_slots_pipeline_view_shows_the_runs_that_ran_it_again():
    """A user's walk: after a backfill with reprocess: failed and cascade: children, the slot's
    pipeline view showed the parent's dead run only, beside children that had run after the
    backfill's success. It lists each job's runs of the slot that ran it again too (a backfill's,
    one by hand), after its scheduled one."""
    from backfill_helpers import backfill_cmd, finish_runs, step
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, False)  # a@S1 dead: b@S1 upstream_failed
    assert states(s, f"b@{S1}") == {f"b@{S1}": ("skipped", "upstream_failed")}
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 1, S1 + SEC, reprocess="failed", cascade="children"))["ok"]
    for k in range(20):
        if s.backfills["b1"]["state"] == "done":
            break
        step(s, "b1", S1 + 2 * SEC + k)
        finish_runs(s, S1 + 2 * SEC + k)
    view = [(r["id"].split("@")[0] + ("#" if "#" in r["id"] else ""), r["state"]) for r in pipelines.slot_runs(s, "a", S1)]
    assert view[:2] == [("a", "dead"), ("a#", "succeeded")], view
    assert ("b#", "succeeded") in view or ("b", "succeeded") in view, view


def test_a_jobs_cancel_leaves_its_backfills_runs_to_the_backfill():
    """(a review) POST /v1/jobs/{name}/cancel listed a backfill's queued runs with the job's: each
    press left holes in the range the backfill was asked to run. Its own cancel ends those."""
    from raftsched.core import backfill_model, queries
    s = chain_state(("a", job_raw(every_s=10)))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1, False)
    req = backfill_model.validate_backfill({"from": "2026-05-28T20:26:50Z", "to": "2026-05-28T20:27:00Z",
                                            "reprocess": "failed"}, S1 + 15 * SEC)
    job = s.jobs["a"]
    fields = {"name": "bf1", "job": "a", "from": req["from"], "to": req["to"], "reprocess": "failed",
              "order": "oldest", "max_concurrent": 1, "rate_milli": None, "max_slots": 10, "overlap": "allow",
              "planned": 1, "schedule": job["spec"]["schedule"], "anchor": job["anchor"]}
    assert apply(s, commands.backfill(S1 + 15 * SEC, "r1", fields))["ok"]
    from backfill_helpers import step
    assert step(s, "bf1", S1 + 15 * SEC)["created"] == 1
    tick(s, S1 + 20 * SEC)  # the job's own next slots, queued
    own = [r for r in s.history["a"] if s.runs[r]["state"] == "queued" and "backfill" not in s.runs[r]
           and s.runs[r].get("kind") != "backfill"]
    theirs = [r for r in s.history["a"] if s.runs[r]["state"] == "queued" and r not in own]
    assert own and theirs, (own, theirs)
    hist = s.history["a"]
    assert queries.runs_to_cancel(s, "a", False, None, 100, 1000) == (own, None)
    got, nxt = queries.runs_to_cancel(s, "a", False, None, 1, 1000)
    assert got == own[:1] and nxt == got[0], (got, nxt)  # the limit's: go on after the last found
    if len(own) > 1:
        assert queries.runs_to_cancel(s, "a", False, None, 1, 1000, nxt)[0] == own[1:2]
    got, nxt = queries.runs_to_cancel(s, "a", False, None, 100, 1)  # the scan's bound: a cursor past what it read
    assert got == [r for r in hist[:1] if r in own] and nxt == hist[0], (got, nxt)
    assert queries.runs_to_cancel(s, "a", False, None, 100, 1000, "a@gone") == (own, None)  # a cursor gone: from the front
