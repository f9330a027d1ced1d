"""Pipelines cases a review found (each test failed on the code before its fix): a job made a
child keeps its recorded ranges alike on live and restored replicas; a slot's run is never made
twice; a triggered job given a schedule does not fire a slot its history holds; a requeued run
that does not propagate takes nothing back; a refused batch item does not stand for its job."""
from __future__ import annotations

import functools

from core_helpers import MIN, SEC, T0, apply, complete_many, new_state, plan_tick, put_cmd, repush, restored, spec_of, tick
from pipeline_helpers import chain_state, finish, job_raw, lease, put

from raftsched.core import backfills, commands, model, pipelines, schedule


def test_a_job_made_a_child_keeps_its_ranges_on_every_replica():
    slot = lambda k: T0 + k * 10 * SEC  # noqa: E731
    s = chain_state(("a", job_raw(every_s=10)),
                    ("b", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})))
    tick(s, T0 + 45 * SEC)  # a: runs at slots 1-4; b: one recorded range over them
    assert any("slot_to" in s.runs[r] for r in s.history["b"])
    assert put(s, "b", job_raw(after=["a"]), now=T0 + 46 * SEC)["ok"]
    r = restored(s)
    assert s.pipes.ranged == r.pipes.ranged
    for st in (s, r):
        (g,) = [g for g in lease(st, T0 + 47 * SEC) if g["id"] == f"a@{slot(2)}"]
        finish(st, g, T0 + 48 * SEC, True)
    assert f"b@{slot(2)}" not in s.runs  # the range covers it: no second decision
    assert s.snapshot() == r.snapshot()


def test_a_slot_triggered_by_hand_is_not_made_again_by_its_latest_join():
    s1 = T0 + 10 * SEC
    s = chain_state(("a", job_raw(every_s=10)), ("g", job_raw(every_s=10, after=["a"], match="latest")),
                    ("h", job_raw(after=["a"])))
    tick(s, s1)  # a@s1 queued; g's own slot s1 waits in a join
    assert apply(s, commands.trigger_job(s1 + 1, None, name="g", extra={"slot": s1}))["ok"]
    (ga,) = [g for g in lease(s, s1 + 2) if g["job"] == "a"]
    item = {"run": ga["id"], "token": ga["token"], "success": True}
    res, each = complete_many(s, commands.complete_many(s1 + 3, "req-x", results=[item], worker="w"))
    assert res["ok"] and each[0]["ok"], res
    assert s.runs[f"g@{s1}"]["state"] in ("queued", "running")  # the trigger's run, made once
    assert f"h@{s1}" in s.runs  # the sibling offered after g still gets its run
    assert s.snapshot() == restored(s).snapshot()


def test_a_triggered_job_given_a_schedule_never_fires_a_slot_its_history_holds():
    ahead = T0 + 101 * SEC  # a slot of the schedule c gets below (every 10 s from T0 + 1 s)
    s = chain_state(("a", job_raw(every_s=10)), ("c", job_raw(after=["a"])))
    # A run of that slot in its history: the older code made one for a trigger with a slot still to
    # come (refused since 2026-12-07), and its journals and dumps may hold it; made here as it did.
    assert backfills.trigger_job_with(s, s.jobs["c"], {"op": "trigger_job", "slot": ahead}, ahead)["ok"]
    assert f"c@{ahead}" in s.runs
    assert put(s, "c", job_raw(every_s=10), now=T0 + 2)["ok"]
    assert s.jobs["c"]["next"] > ahead
    assert put(s, "z", job_raw(every_s=10), now=T0 + 2)["ok"]
    for k in range(1, 14):
        now = T0 + k * 10 * SEC + 2000
        cmd, names = plan_tick(s, now)
        if cmd is None:
            continue
        res = apply(s, cmd)
        if not res.get("ok"):
            repush(s, names)
        assert res.get("ok"), res
    assert s.jobs["c"]["cursor"] > T0 + 120 * SEC and s.jobs["z"]["cursor"] > T0 + 120 * SEC


def test_a_requeued_run_that_does_not_propagate_takes_nothing_back():
    s1 = T0 + 10 * SEC
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"], max_wait_s=60)))
    tick(s, s1 + 5 * SEC)  # a's slot s1 missed: b's slot s1 recorded upstream_missed
    assert s.runs[f"b@{s1}"]["reason"] == "upstream_missed"
    r = apply(s, commands.trigger_job(s1 + 6 * SEC, None, name="a", extra={"slot": s1}))  # no propagate
    (g,) = lease(s, s1 + 7 * SEC)
    finish(s, g, s1 + 8 * SEC, False)  # dead
    res = apply(s, commands.dlq_requeue(s1 + 9 * SEC, None, run=r["run"]))
    assert res["ok"] and "rearmed" not in res
    assert s.runs[f"b@{s1}"]["reason"] == "upstream_missed" and not s.pipes.joins.get("b")


def _item(now, name, raw, **kw):
    """A put_jobs item of job ``name`` (``raw`` validated at ``now``)."""
    d = {"name": name, "spec": model.validate_job(name, raw, now), "next": None, "cursor": now,
         "anchor": now, "create_only": False}
    d.update(kw)
    return d


def test_a_refused_batch_item_does_not_stand_for_its_job_in_later_edges():
    s = chain_state(("y", job_raw(every_s=10)), ("x", job_raw(after=["y"])))
    now = T0 + 1
    item = functools.partial(_item, now)

    res = apply(s, commands.make("put_jobs", now, None, jobs=[
        item("x", job_raw(every_s=10), create_only=True),  # refused: x exists, keeps after y
        item("y", job_raw(after=["x"])),  # would close y -> x -> y
    ]))
    assert not res["ok"] and "cycle" in res["error"]["message"]  # nothing stored: all refused
    assert "after" not in s.jobs["y"]["spec"]
    edges = pipelines.graph(s, "x")["edges"]
    assert edges == [{"from": "y", "to": "x", "on": "success"}]


def test_a_refused_batch_item_refuses_alone_the_items_whose_edges_then_fail():
    s = chain_state(("y", job_raw(every_s=10)), ("x", job_raw(after=["y"])))
    now = T0 + 1
    item = functools.partial(_item, now)

    res = apply(s, commands.make("put_jobs", now, None, jobs=[
        item("w", job_raw(after=["y"])),  # a new job: stored
        item("x", job_raw(every_s=10), create_only=True),  # refused: x exists
        item("y", job_raw(after=["x"])),  # a cycle against the x that stays: refused alone
    ]))
    assert res["ok"] and res["conflicts"] == [1] and [i for i, _ in res["invalid"]] == [2]
    assert "cycle" in res["invalid"][0][1]
    assert "w" in s.jobs and "after" not in s.jobs["y"]["spec"]
    assert s.snapshot() == restored(s).snapshot()


def test_a_manual_run_does_not_raise_a_replaces_cursor():
    # an hourly job, a manual run after its first slot, then a replace by a one-shot time already
    # past: due at once, as a one-shot replace is (the manual run's id is no slot's)
    s = new_state()
    assert apply(s, put_cmd(s, "j", spec_of({"every_s": 3600}), T0))["ok"]
    tick(s, T0 + 2 * SEC)
    assert apply(s, commands.trigger_job(T0 + 25 * MIN, None, name="j"))["ok"]
    now = T0 + 31 * MIN
    assert apply(s, put_cmd(s, "j", spec_of({"at": schedule.iso(T0 + 20 * MIN)}), now))["ok"]
    assert s.jobs["j"]["next"] == T0 + 20 * MIN


def test_the_batch_answer_names_an_item_refused_for_its_edges():
    from raftsched.node import batch
    chunks = [[{"name": "w", "next": None}, {"name": "y", "next": None}]]
    res = {"ok": True, "gen": [3, None], "created": [True, False], "conflicts": [],
           "invalid": [[1, "makes a cycle: y -> x -> y"]]}
    out = batch.merge({"w": {}, "y": {}}, chunks, [res], "k")
    assert out["jobs"]["w"]["created"] is True
    assert out["jobs"]["y"] == {"error": {"code": "invalid", "field": "after", "message": "makes a cycle: y -> x -> y"}}
    assert out["conflicts"] == 1


def test_a_batch_item_whose_edges_fail_after_others_were_stored_is_refused_alone(monkeypatch):
    # a parent one child short of its limit: the batch's first child takes the last place, and
    # the second (checked by the proposer against the state alone) is refused alone at apply
    from raftsched.core import limits
    monkeypatch.setattr(limits, "children_per_job_max", 2)
    s = chain_state(("p", job_raw(every_s=10)), ("c0", job_raw(after=["p"])))
    now = T0 + 1

    def item(name):
        return {"name": name, "spec": model.validate_job(name, job_raw(after=["p"]), now), "next": None,
                "cursor": now, "anchor": now, "create_only": False}

    res = apply(s, commands.make("put_jobs", now, None, jobs=[item("c1"), item("c2")]))
    assert res["ok"] and [i for i, _ in res["invalid"]] == [1] and res["gen"][0] is not None
    assert "c1" in s.jobs and "c2" not in s.jobs
    # the first item refused: the whole command, nothing changed
    res = apply(s, commands.make("put_jobs", now, None, jobs=[item("c3")]))
    assert not res["ok"] and "c3" not in s.jobs
