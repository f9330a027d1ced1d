"""Pipelines through the API and the SDK (an in-process replica: FakeRaft, FakeClock): edges
refused with a 422 naming them, a delete with dependents a 409 unless forced, the graph, a
slot's runs across the chain with what a waiting child waits for, and the SDK's ``after``."""
from __future__ import annotations

import json

from raftsched.core import commands, pipelines, schedule
from raftsched.sdk import App

from test_api import err, put, run

EX = {"type": "shell", "argv": ["true"]}
A = {"schedule": {"every_s": 10}, "executor": EX, "misfire": {"policy": "fire_all"}}


def after(*parents, **extra):
    return {"executor": EX, "after": list(parents), **extra}


def test_edges_are_checked_and_a_triggered_job_has_no_slots_of_its_own():
    async def body(env, c):
        assert (await put(c, "a", A)).status == 201
        r = await put(c, "b", after("a"))
        assert r.status == 201, await r.text()
        assert (await r.json())["next_slot"] is None
        job = await (await c.get("/v1/jobs/b")).json()
        assert job["spec"]["schedule"] is None and job["spec"]["after"] == [{"job": "a", "on": "success"}]
        b = await err(await put(c, "c", after("nope")), 422, "invalid", "after[0].job")
        assert "nope -> c" in b["error"]["message"]
        b = await err(await put(c, "a", dict(A, after=["b"])), 422, "invalid", "after[0].job")
        assert "cycle" in b["error"]["message"]
        await err(await put(c, "c", after({"job": "a", "on": "often"})), 422, "invalid", "after[0].on")
        await err(await put(c, "c", dict(A, after=["a"], match="soon")), 422, "invalid", "match")
        await err(await put(c, "c", after("a", max_wait_s=0)), 422, "invalid", "max_wait_s")
        prev = await (await c.get("/v1/jobs/b/preview")).json()
        assert prev["slots"] == [] and prev["triggered_by"][0]["job"] == "a"
        ex = await c.post("/v1/jobs/b/explain", data=json.dumps({"down_from": "2026-01-01T00:00:00Z",
                                                                 "down_to": "2026-01-01T01:00:00Z"}))
        assert ex.status == 200 and "runs after a" in (await ex.json())["summary"]
        # A child's run id whose slot is not ASCII digits names no run ("²".isdigit(), int raised: 500)
        for rid in ("b@²", "b@١٢٣", "b@"):
            await err(await c.get(f"/v1/runs/{rid}"), 404, "not_found", "run")
        # nor one that is no slot's id (leading zeros), nor a slot from before the job existed
        for rid in ("b@0001796542320000", "b@12345"):
            await err(await c.get(f"/v1/runs/{rid}"), 404, "not_found", "run")
    run(body)


def test_explain_gives_a_waiting_slot_as_every_answer_does():
    """A pipelines walk: explain's ``waiting[].slot`` was raw ms where every other answer gives
    a slot as ISO with ``slot_ms``."""
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        slot = env.state.jobs["a"]["next"]
        env.clock.advance(slot - env.clock.now_ms())
        await env.trigger.tick()  # a's run of the slot is queued: b's slot waits for it
        ex = await c.post("/v1/jobs/b/explain", data=json.dumps({"down_from": "2026-01-01T00:00:00Z",
                                                                 "down_to": "2026-01-01T01:00:00Z"}))
        assert ex.status == 200
        (w,) = (await ex.json())["waiting"]
        assert w["slot"] == schedule.iso(slot) and w["slot_ms"] == slot and w["run"] == f"b@{slot}", w
        # A triggered job needs no made-up outage window (a walk): {} answers the same; a scheduled
        # job's {} names the window's field it lacks.
        r = await c.post("/v1/jobs/b/explain", data=json.dumps({}))
        assert r.status == 200, await r.text()
        alone = await r.json()
        assert "runs after a" in alone["summary"] and alone["waiting"] == (await ex.json())["waiting"], alone
        await err(await c.post("/v1/jobs/a/explain", data=json.dumps({})), 400, "bad_request", "down_from")
        # A run of a by hand with propagate, queued: b's slot of its instant waits for it, in
        # explain as in the run's view (a walk: the view said waiting, explain listed nothing).
        env.clock.advance(1_000)
        manual = await (await c.post("/v1/jobs/a/trigger", data=json.dumps({"propagate": True}))).json()
        at = env.state.runs[manual["run"]]["slot"]
        ex = await (await c.post("/v1/jobs/b/explain", data=json.dumps({"down_from": "2026-01-01T00:00:00Z",
                                                                       "down_to": "2026-01-01T01:00:00Z"}))).json()
        listed = {x["slot_ms"]: x for x in ex["waiting"]}
        assert at in listed and listed[at]["waiting_on"][0]["run"] == manual["run"], ex["waiting"]
        view = await (await c.get(f"/v1/runs/b@{at}")).json()
        assert view["state"] == "waiting" and view["waiting_for"] == listed[at]["waiting_for"], view
    run(body)


def test_delete_with_dependents_is_409_unless_forced():
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        b = await err(await c.delete("/v1/jobs/a"), 409, "conflict", "name")
        assert b["error"]["dependents"] == ["b"] and "force=true" in b["error"]["message"]
        assert (await c.delete("/v1/jobs/a?force=true")).status == 200
        assert (await c.delete("/v1/jobs/a?force=maybe")).status == 400
    run(body)


def test_a_parent_deleted_with_force_is_a_missing_node_of_the_graph_as_the_docs_say():
    """The graph's node kinds (pipeline_model.GRAPH_KINDS) are each documented in docs/api.md's
    graph section and docs/pipelines.md; ``missing`` is a parent deleted with ?force=true that a
    child's ``after`` still names (it was left out of both)."""
    import pathlib
    import re

    from raftsched.core.pipeline_model import GRAPH_KINDS

    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        assert (await c.delete("/v1/jobs/a?force=true")).status == 200
        g = await (await c.get("/v1/jobs/b/graph")).json()
        assert {n["job"]: n["kind"] for n in g["nodes"]} == {"a": "missing", "b": "triggered"}
        assert g["edges"] == [{"from": "a", "to": "b", "on": "success"}]
    run(body)
    docs = pathlib.Path(__file__).resolve().parent.parent / "docs"
    api = (docs / "api.md").read_text()
    graph = re.search(r"A node's `kind`:(.*?)\.\n", api, re.S)
    assert graph is not None
    pipes = re.search(r"`nodes` \(each with its(.*?)\)", (docs / "pipelines.md").read_text(), re.S)
    assert pipes is not None
    for kind in GRAPH_KINDS:
        assert f"`{kind}`" in graph.group(1), kind
        assert f"`{kind}`" in pipes.group(1), kind


def test_graph_and_a_slots_runs_across_the_chain():
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        await put(c, "c", after({"job": "b", "on": "finished"}))
        g = await (await c.get("/v1/jobs/b/graph")).json()
        assert g["parents"] == ["a"] and g["children"] == ["c"]
        assert g["edges"] == [{"from": "a", "to": "b", "on": "success"}, {"from": "b", "to": "c", "on": "finished"}]
        assert {n["job"]: n["kind"] for n in g["nodes"]} == {"a": "scheduled", "b": "triggered", "c": "triggered"}
        assert (await c.get("/v1/jobs/zz/graph")).status == 404
        slot = env.state.jobs["a"]["next"]
        env.clock.advance(slot - env.clock.now_ms())
        await env.trigger.tick()
        iso = schedule.iso(slot)
        r = await (await c.get("/v1/jobs/c/runs", params={"slot": iso})).json()
        chain = {v["job"]: v for v in r["pipeline"]}
        assert chain["a"]["state"] == "queued" and chain["b"]["state"] == "waiting"
        assert chain["b"]["waiting_for"].startswith("waiting for a@") and "(queued, attempt 1 of 1)" in chain["b"]["waiting_for"]
        assert (await c.get("/v1/jobs/zz/runs", params={"slot": iso})).status == 404
        # A user's walk: a succeeded run of the chain showed "attempts": [] (its last attempt is
        # not kept, and the chain's view did not add it back as GET /v1/runs/{id} does).
        now = env.clock.now_ms()
        g = env.state.apply(commands.acquire(now, worker="t", queues=None, max=10, ttl=30_000, types=None))["runs"][0]
        env.state.apply(commands.complete_many(now, None, results=[{"run": g["id"], "token": g["token"],
                                                                    "success": True}], worker="t"))
        r = await (await c.get("/v1/jobs/c/runs", params={"slot": iso})).json()
        a = {v["job"]: v for v in r["pipeline"]}["a"]
        own = await (await c.get(f"/v1/runs/{g['id']}")).json()
        assert a["state"] == "succeeded" and a["attempts"] == own["attempts"] and len(own["attempts"]) == 1, (a, own)
    run(body)


def test_a_childs_run_is_shown_waiting_for_a_slot_of_its_parents_only():
    """GET /v1/runs/b@<ms> answered 200 "waiting for a@... (its slot has not fired)" for any
    instant: one between a's slots, one far off its grid. They are 404 saying why; a slot of a
    that has not fired yet is still shown waiting."""
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        slot = env.state.jobs["a"]["next"]
        for off in (1234, 10 ** 9 + 7):
            b = await err(await c.get(f"/v1/runs/b@{slot + off}"), 404, "not_found", "run")
            assert "is not a slot of b or of its parents' schedules" in b["error"]["message"], b
        v = await (await c.get(f"/v1/runs/b@{slot + 10 ** 9}")).json()
        assert v["state"] == "waiting" and v["waiting_for"].endswith("(its slot has not fired)"), v
        await err(await c.get("/v1/runs/b@9999999999999999999"), 404, "not_found", "run")
    run(body)


def test_an_instant_inside_a_recorded_range_answers_the_range():
    """GET /v1/runs/J@S for a slot a misfire recorded with others (under the range's first slot)
    answered 404 for a scheduled job, and "waiting" for its child, whose range the parent's had
    made: both answer the range that covers S."""
    async def body(env, c):
        await put(c, "a", dict(A, misfire={"policy": "skip", "grace_s": 0}))
        await put(c, "b", after("a"))
        first = env.state.jobs["a"]["next"]
        env.clock.advance(first - env.clock.now_ms() + 95_000)  # ten slots gone by
        await env.trigger.tick()
        ranges = {}
        for job in ("a", "b"):
            recs = [env.state.runs[r] for r in env.state.history[job] if "slot_to" in env.state.runs[r]]
            assert recs, (job, [env.state.runs[r] for r in env.state.history[job]])
            ranges[job] = recs[0]
        for job, rec in ranges.items():
            inside = rec["slot"] + 10_000
            assert inside <= rec["slot_to"]
            v = await (await c.get(f"/v1/runs/{job}@{inside}")).json()
            assert (v["id"], v["state"], v["count"]) == (rec["id"], "skipped", rec["count"]), v
        # any instant the range spans answers it (as ?slot= reads a job's runs: the schedule may
        # have been replaced since); one past it is no run of a's
        v = await (await c.get(f"/v1/runs/a@{ranges['a']['slot'] + 1234}")).json()
        assert v["id"] == ranges["a"]["id"], v
        await err(await c.get(f"/v1/runs/a@{ranges['a']['slot_to'] + 1234}"), 404, "not_found", "run")
    run(body)


def test_a_trigger_propagates_when_asked_and_refuses_a_bad_flag():
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        r = await c.post("/v1/jobs/a/trigger", data=json.dumps({"propagate": True}))
        assert r.status == 201, await r.text()
        assert env.state.runs[(await r.json())["run"]]["propagate"] is True
        await err(await c.post("/v1/jobs/a/trigger", data=json.dumps({"propagate": "yes"})), 422, "invalid",
                  "propagate")
    run(body)


def test_a_batch_puts_parents_first_whatever_its_order():
    async def body(env, c):
        jobs = {"c": after("b"), "b": after("a"), "a": A}
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": jobs}))
        assert r.status == 200, await r.text()
        assert env.state.pipes.children == {"a": {"b": None}, "b": {"c": None}}
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"d": after("zz")}}))
        await err(r, 422, "invalid", "after[0].job")
    run(body)


def extract(ctx):
    return {"rows": 1}


def transform(ctx):
    return None


def report(ctx):
    return ctx.upstream


def test_the_sdk_declares_after_and_orders_parents_first():
    app = App("pipe", misfire="skip")
    handler = app.job("report", after=["transform"])(report)
    app.job("transform", after=[{"job": "extract", "on": "success"}], max_wait_s=600)(transform)
    app.job("extract", every_s=60)(extract)
    specs = app.specs()
    assert "schedule" not in specs["report"] and specs["report"]["after"] == ["transform"]
    assert pipelines.parents_first(specs) == ["extract", "transform", "report"]
    from raftsched.sdk.context import Context
    ctx = Context.from_grant({"id": "report@1", "job": "report", "slot": 1, "attempt": 1, "token": 9,
                              "upstream": [{"job": "transform", "result": {"x": 1}}]})
    assert handler(ctx) == [{"job": "transform", "result": {"x": 1}}]
    assert "RAFTSCHED_UPSTREAM" in ctx.env()


def test_the_cli_graph_prints_one_line_an_edge(capsys):
    from argparse import Namespace

    from raftsched.cli import _graph

    class Fake:
        def graph(self, name):
            return {"job": name, "parents": ["a"], "children": ["c"],
                    "nodes": [{"job": "a", "kind": "scheduled"}, {"job": "b", "kind": "triggered"},
                              {"job": "c", "kind": "gated"}],
                    "edges": [{"from": "a", "to": "b", "on": "success"}, {"from": "b", "to": "c", "on": "finished"}]}

    from raftsched.cli_output import set_format
    set_format("table")  # (as on a terminal)
    assert _graph(Namespace(name="b", json=False), Fake()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["b (triggered): 1 upstream, 1 downstream", "  a -> [b]  (on success; b is triggered)",
                   "  [b] -> c  (on finished; c is gated)"]
    # -o json, or no -o in a pipe: the answer as JSON, as every command prints it (it printed text)
    for fmt in ("json", None):
        set_format(fmt)
        assert _graph(Namespace(name="b", json=False), Fake()) == 0
        assert json.loads(capsys.readouterr().out) == Fake().graph("b"), fmt


def test_a_handlers_return_value_is_its_runs_result_and_a_result_file_is_read_safely(tmp_path):
    import asyncio
    import os

    from raftsched.sdk.context import Context
    from raftsched.worker.executors import RunContext, run_function
    from raftsched.worker.loop import run_result
    from raftsched.worker.sandbox import read_result

    rc = RunContext(run_id="j@1", job="j", slot_ms=1, attempt=1, fencing_token=1, payload=None,
                    upstream=[{"job": "p", "result": 2}])
    out = asyncio.run(run_function(lambda ctx: {"n": ctx.upstream[0]["result"] + 1}, Context.of(rc), 5, None,
                                   name="t"))
    assert out.ok and rc.result == {"n": 3}
    assert run_result({"x": "y" * 5000}) is None and run_result({1, 2}) is None and run_result([1]) == [1]
    # JSON that no command can carry (a hash as an int): none, not a worker that fails on it
    assert run_result({"digest": 2**255}) is None and run_result({"n": -2**63}) == {"n": -2**63}
    deep: list = []
    for _ in range(100_000):  # nested too deep to encode: no result, not an error
        deep = [deep]
    assert run_result(deep) is None
    assert run_result({"s": "é", "f": 1.5, "n": None}) == {"s": "é", "f": 1.5, "n": None}
    assert run_result([float("nan")]) is None

    # A handler that returns a million rows: the worker gives up once past the bound, and does
    # not encode the rest on its loop (counted in rows the encoder took, not in seconds).
    taken = [0]

    class Rows(list):
        def __iter__(self):
            for row in list.__iter__(self):
                taken[0] += 1
                yield row
    assert run_result(Rows([{"id": i} for i in range(1_000_000)])) is None
    assert taken[0] < 2_000, taken[0]
    f = tmp_path / "r.json"
    f.write_text('{"rows": 42}')
    assert read_result(str(f)) == {"rows": 42}
    os.symlink(f, tmp_path / "link.json")
    assert read_result(str(tmp_path / "link.json")) is None  # never followed: the run user wrote it
    os.link(f, tmp_path / "hard.json")
    assert read_result(str(tmp_path / "hard.json")) is None  # a second name: maybe of a file it could not read
    assert read_result(str(f)) is None  # (either name)
    (tmp_path / "big.json").write_text('"' + "x" * 5000 + '"')
    assert read_result(str(tmp_path / "big.json")) is None and read_result(str(tmp_path / "none")) is None


def test_a_backfill_dry_run_shows_the_cascade_and_a_triggered_job_is_not_backfilled():
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        await put(c, "c", after("b"))
        env.clock.advance(3_600_000)
        lo, hi = schedule.iso(env.clock.now_ms() - 60_000), schedule.iso(env.clock.now_ms() - 1000)
        r = await c.post("/v1/jobs/a/backfills", data=json.dumps({"from": lo, "to": hi, "dry_run": True,
                                                                  "cascade": "children"}))
        assert r.status == 200, await r.text()
        plan = (await r.json())["cascade"]
        assert plan["children"] == ["b", "c"] and {"from": "b", "to": "c", "on": "success"} in plan["edges"]
        b = await err(await c.post("/v1/jobs/b/backfills", data=json.dumps({"from": lo, "to": hi})), 422,
                      "invalid", "name")
        assert "cascade" in b["error"]["message"]
        await err(await c.post("/v1/jobs/a/backfills", data=json.dumps({"from": lo, "to": hi, "cascade": 1})),
                  422, "invalid", "cascade")
    run(body)


def test_a_backfill_of_a_gated_job_is_refused_unless_it_says_it_ignores_its_parents():
    """A gated job (a schedule of its own, and ``after``) backfilled ran each slot whatever its
    parents did for it: a report published for a night whose extract failed (a pipelines walk:
    ``upstream: null`` on a success after the parent's dead run). Refused now, naming how to
    backfill it (its parents, with cascade); ``"upstream": "ignore"`` runs the slots anyway."""
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "g", {**A, "after": ["a"]})
        env.clock.advance(3_600_000)
        lo, hi = schedule.iso(env.clock.now_ms() - 60_000), schedule.iso(env.clock.now_ms() - 1000)
        runs = len(env.state.runs)
        for extra in ({}, {"dry_run": True}, {"upstream": "wait"}):
            b = await err(await c.post("/v1/jobs/g/backfills", data=json.dumps({"from": lo, "to": hi, **extra})),
                          422, "invalid", "upstream")
            assert "runs after a" in b["error"]["message"] and "cascade" in b["error"]["message"], b
        await err(await c.post("/v1/jobs/g/backfills", data=json.dumps({"from": lo, "to": hi, "upstream": "no"})),
                  422, "invalid", "upstream")
        assert len(env.state.runs) == runs and not env.state.backfills
        r = await c.post("/v1/jobs/g/backfills", data=json.dumps({"from": lo, "to": hi, "upstream": "ignore"}))
        assert r.status == 201, await r.text()
        r = await c.post("/v1/jobs/a/backfills", data=json.dumps({"from": lo, "to": hi, "upstream": "wait"}))
        assert r.status == 201, await r.text()  # a job without parents: nothing to wait for
    run(body)


def test_the_leaders_trigger_steps_a_deferred_fan_out_and_records_slots_waiting_too_long(monkeypatch):
    from raftsched.core import commands, limits as core_limits

    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", A)
        for k in range(3):
            await put(c, f"k{k}", after("a"))
        await put(c, "w", after("a", "b", max_wait_s=1))
        slot = env.state.jobs["a"]["next"]
        env.clock.advance(slot - env.clock.now_ms())
        monkeypatch.setattr(core_limits, "fanout_per_command", 1)
        await env.trigger.tick()  # a and b fire
        now = env.clock.now_ms()
        grants = env.state.apply(commands.acquire(now, worker="t", queues=None, max=10, ttl=30_000,
                                                  types=None))["runs"]
        ga = next(g for g in grants if g["job"] == "a")
        env.state.apply(commands.complete_many(now, None, results=[{"run": ga["id"], "token": ga["token"],
                                                                    "success": True}], worker="t"))
        assert env.state.pipes.fanout  # one child offered in the completion, the rest deferred
        for _ in range(6):  # a fanout_step a tick for each part (children k1, k2, w)
            if not env.state.pipes.fanout:
                break
            await env.trigger.tick()
        assert not env.state.pipes.fanout
        assert all(f"k{k}@{slot}" in env.state.runs for k in range(3))
        env.clock.advance(2000)  # w's slot, waiting on b past its max_wait_s 1, times out
        await env.trigger.tick()
        r = env.state.runs[f"w@{slot}"]
        assert (r["state"], r["reason"]) == ("skipped", "upstream_timeout") and f"b@{slot}" in r["error"]
    run(body)


def test_a_triggered_job_is_replaced_and_run_by_hand_for_a_slot_of_its_parents():
    async def body(env, c):
        await put(c, "a", A)
        assert (await put(c, "b", after("a"))).status == 201
        r = await put(c, "b", after({"job": "a", "on": "finished"}, max_wait_s=60))
        assert r.status == 200, await r.text()  # a replace of a job without a schedule
        assert (await put(c, "b", A)).status == 200  # and into a scheduled one, and back
        assert (await put(c, "b", after("a"))).status == 200
        slot = schedule.iso(env.clock.now_ms() - 3_600_000)  # any slot come: its parents' slots are its own
        r = await c.post("/v1/jobs/b/trigger", data=json.dumps({"slot": slot}))
        assert r.status == 201, await r.text()
        assert (await r.json())["run"].startswith("b@")
        assert (await c.post("/v1/jobs/b/pause")).status == 200
        r = await c.post("/v1/jobs/b/resume")
        assert r.status == 200, await r.text()
        assert not env.state.jobs["b"]["paused"]
    run(body)


def test_a_tenant_token_reads_its_own_jobs_recorded_range_by_an_instant_and_no_other_tenants():
    """GET /v1/runs/{id} is held to the token's tenants by the run's tenant: an instant a range
    covers has no run of its own, and was 404 to every tenant-limited token."""
    from test_auth import call, new_token, run as auth_run

    async def body(env, c):
        for name, tenant in (("a", "acme"), ("z", "zeta")):
            s, b = await call(c, "PUT", f"/v1/jobs/{name}", body=dict(A, tenant=tenant,
                                                                      misfire={"policy": "skip", "grace_s": 0}))
            assert s == 201, b
        first = env.state.jobs["a"]["next"]
        env.clock.advance(first - env.clock.now_ms() + 95_000)
        await env.trigger.tick()
        acme = (await new_token(c, "reader", tenants=["acme"]))["token"]
        for name, want in (("a", 200), ("z", 404)):
            rec = next(env.state.runs[r] for r in env.state.history[name] if "slot_to" in env.state.runs[r])
            s, b = await call(c, "GET", f"/v1/runs/{name}@{rec['slot'] + 10_000}", acme)
            assert s == want, (name, b)
            if want == 200:
                assert b["id"] == rec["id"]
            else:
                assert b["error"]["field"] == "run"
    auth_run(body)


def test_a_slot_whose_run_ended_runs_again_with_rerun_and_a_plain_trigger_says_how():
    """A walk triggered a failed slot with propagate and got a 200 that ran nothing, silently:
    the answer now warns (requeue a dead run; rerun another), and ``rerun`` (``downstream``)
    runs the slot again (and what ran below it); malformed flags are 422 naming them."""
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        await put(c, "once", after("a", retry={"max_attempts": 1}))
        slot = schedule.iso(env.clock.now_ms() - 60_000)  # a slot of its parent's: any, for a triggered job
        r = await c.post("/v1/jobs/b/trigger", data=json.dumps({"slot": slot}))
        first = (await r.json())["run"]
        # The readable form of its id (what waiting_for shows: the slot as an ISO time) finds it too.
        from urllib.parse import quote
        r = await c.get("/v1/runs/" + quote(f"b@{slot}", safe=""))
        assert r.status == 200 and (await r.json())["id"] == first, await r.text()
        now = env.clock.now_ms()
        g = env.state.apply(commands.acquire(now, worker="w", queues=None, max=1, ttl=30_000, types=None))["runs"][0]
        env.state.apply(commands.complete_many(now, None, worker="w", results=[
            {"run": g["id"], "token": g["token"], "success": True}]))
        r = await c.post("/v1/jobs/b/trigger", data=json.dumps({"slot": slot}))
        assert r.status == 200, await r.text()
        said = await r.json()
        assert said["run"] == first and not said["created"] and "send rerun" in said["warnings"][-1], said
        r = await c.post("/v1/jobs/b/trigger", data=json.dumps({"slot": slot, "rerun": True, "downstream": True}))
        assert r.status == 201, await r.text()
        made = await r.json()
        assert made["run"] == f"{first}#manual" and "warnings" in made  # (no parents' outcomes: said)
        assert env.state.runs[made["run"]]["propagate"] is True and env.state.runs[made["run"]]["downstream"] is True
        # A dead run is requeued, not rerun.
        r = await c.post("/v1/jobs/once/trigger", data=json.dumps({"slot": slot}))
        dead = (await r.json())["run"]
        g = env.state.apply(commands.acquire(now, worker="w", queues=None, max=5, ttl=30_000, types=None))["runs"]
        g = next(x for x in g if x["id"] == dead)
        env.state.apply(commands.complete_many(now, None, worker="w", results=[
            {"run": dead, "token": g["token"], "success": False}]))
        assert env.state.runs[dead]["state"] == "dead"
        said = await (await c.post("/v1/jobs/once/trigger", data=json.dumps({"slot": slot}))).json()
        assert f"its newest run {dead} is dead: requeue it (raftsched requeue {dead})" in said["warnings"][-1], said
        e = await err(await c.post("/v1/jobs/once/trigger", data=json.dumps({"slot": slot, "rerun": True})),
                      409, "conflict", "rerun")
        assert e["error"]["run"] == dead
        for bad, field in (({"rerun": True}, "rerun"), ({"slot": slot, "rerun": 1}, "rerun"),
                           ({"slot": slot, "downstream": True}, "downstream"),
                           ({"slot": slot, "rerun": True, "downstream": True, "propagate": False}, "downstream")):
            await err(await c.post("/v1/jobs/b/trigger", data=json.dumps(bad)), 422, "invalid", field)
    run(body)


def test_a_limited_tokens_downstream_rerun_reaches_its_tenants_children_only():
    from test_auth import call, new_token, run as auth_run

    async def body(env, c):
        for name, spec in (("a", dict(A, tenant="acme")), ("b", after("a", tenant="acme")),
                           ("z", after("a", tenant="zeta"))):  # (an admin's edge across tenants)
            s, b = await call(c, "PUT", f"/v1/jobs/{name}", body=spec)
            assert s == 201, b
        op = (await new_token(c, "operator", tenants=["acme"]))["token"]
        first = env.state.jobs["a"]["next"]
        env.clock.advance(first - env.clock.now_ms() + 1_000)
        await env.trigger.tick()  # a's first slot fired, and ran
        now = env.clock.now_ms()
        g = env.state.apply(commands.acquire(now, worker="w", queues=None, max=1, ttl=30_000, types=None))["runs"][0]
        env.state.apply(commands.complete_many(now, None, worker="w", results=[
            {"run": g["id"], "token": g["token"], "success": True}]))
        slot = schedule.iso(first)
        s, b = await call(c, "POST", "/v1/jobs/a/trigger", op, body={"slot": slot, "rerun": True, "downstream": True})
        assert s == 201, b
        assert env.state.runs[b["run"]]["downstream"] == ["acme"], env.state.runs[b["run"]]
        assert "jobs below it of other tenants are not run again (nor what is only below them): z" in b["warnings"], b
        s, b = await call(c, "POST", "/v1/jobs/a/trigger", body={"slot": slot, "rerun": True, "downstream": True})
        assert s == 200 and not b["created"], b  # (the slot's rerun is still going: that run)
        assert "still going" in b["warnings"][-1] and "nor below it" in b["warnings"][-1], b
    auth_run(body)


def test_a_rerun_says_what_it_leaves_below_and_a_run_shows_what_its_slot_waits_for_to_run_again():
    """A walk: a child still running for the slot was not run again, silently; a mistyped slot of
    a triggered job made a first run, silently; what waits to run again below a rerun showed
    nowhere but explain."""
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        await put(c, "c", after("b"))
        first = env.state.jobs["a"]["next"]
        env.clock.advance(first - env.clock.now_ms() + 1_000)
        await env.trigger.tick()
        slot = schedule.iso(first)

        def work(n=5, fail=()):
            now = env.clock.now_ms()
            got = env.state.apply(commands.acquire(now, worker="w", queues=None, max=n, ttl=30_000, types=None))["runs"]
            env.state.apply(commands.complete_many(now, None, worker="w", results=[
                {"run": g["id"], "token": g["token"], "success": g["job"] not in fail} for g in got]))
            return got

        work()  # a@S
        now = env.clock.now_ms()
        b_run = env.state.apply(commands.acquire(now, worker="w", queues=None, max=1, ttl=30_000, types=None))["runs"][0]
        assert b_run["id"] == f"b@{first}"  # b's run of the slot, still going
        said = await (await c.post("/v1/jobs/a/trigger", data=json.dumps(
            {"slot": slot, "rerun": True, "downstream": True}))).json()
        assert any(w.startswith(f"still running for slot {slot} below it, on the earlier outcomes: b@{first}")
                   for w in said["warnings"]), said
        env.state.apply(commands.complete_many(now, None, worker="w", results=[
            {"run": b_run["id"], "token": b_run["token"], "success": True}]))
        while work():
            pass
        # Now everything ran: a rerun with downstream opens b and c; c waits for b's new outcome.
        said = await (await c.post("/v1/jobs/a/trigger", data=json.dumps(
            {"slot": slot, "rerun": True, "downstream": True}))).json()
        assert "warnings" not in said, said
        work(1)  # a's rerun: b runs again (queued), c waits for it
        view = await (await c.get(f"/v1/runs/c@{first}")).json()
        assert view["rerun_waiting_for"].startswith(f"waiting for b@{slot}#manual"), view
        # A triggered job's slot that never ran, "run again": its first run, said so.
        odd = schedule.iso(first + 500)
        said = await (await c.post("/v1/jobs/c/trigger", data=json.dumps({"slot": odd, "rerun": True}))).json()
        assert any(w.startswith(f"slot {odd} had no run of c: this is its first") for w in said["warnings"]), said
    run(body)


def test_a_triggered_jobs_future_slot_is_refused_at_the_node_with_its_time():
    async def body(env, c):
        await put(c, "a", A)
        await put(c, "b", after("a"))
        before = len(env.raft.proposed)
        r = await c.post("/v1/jobs/b/trigger", data=json.dumps({"slot": "2099-01-01T12:00:00Z"}))
        b = await err(r, 409, "conflict", "slot")
        assert b["error"]["message"].startswith("slot 2099-01-01T12:00:00Z has not come: b runs after its parents"), b
        assert len(env.raft.proposed) == before  # refused before anything was proposed
    run(body)


def test_explain_of_a_gated_job_says_which_slots_its_parents_own_policy_records():
    """A walk: t-par (misfire skip) and t-gated (same grid, after t-par, fire_all); explain of the
    outage said t-gated RUNs three missed slots, and all three were recorded upstream_missed,
    as t-par skipped them. Each such slot says so now (``upstream``), and how many."""
    async def body(env, c):
        skip = dict(A, misfire={"policy": "skip"}, schedule={"every_s": 10, "start_at": "2030-01-01T00:00:00Z"})
        assert (await put(c, "tpar", skip)).status == 201
        gated = dict(A, schedule={"every_s": 10, "start_at": "2030-01-01T00:00:00Z"}, after=["tpar"])
        assert (await put(c, "tgated", gated)).status == 201
        window = {"down_from": "2030-01-01T00:00:05Z", "down_to": "2030-01-01T00:00:40Z"}
        ex = await (await c.post("/v1/jobs/tgated/explain", data=json.dumps(window))).json()
        missed = [r for r in ex["runs"] if r.get("upstream")]
        assert ex["upstream_missed"] == len(missed) == 3, ex
        assert {r["upstream"]["job"] for r in missed} == {"tpar"} and "upstream_missed" in missed[0]["upstream"]["why"]
        # A parent that runs its missed slots: nothing said.
        assert (await put(c, "tpar", dict(skip, misfire={"policy": "fire_all"}))).status == 200
        ex = await (await c.post("/v1/jobs/tgated/explain", data=json.dumps(window))).json()
        assert ex["upstream_missed"] == 0 and not any(r.get("upstream") for r in ex["runs"]), ex
        # A parent whose late runs are withdrawn (late_start: skip) records those slots too.
        late = dict(skip, misfire={"policy": "fire_all"}, deadline={"start_within_s": 5, "late_start": "skip"})
        assert (await put(c, "tpar", late)).status == 200
        ex = await (await c.post("/v1/jobs/tgated/explain", data=json.dumps(window))).json()
        said = [r["upstream"]["reason"] for r in ex["runs"] if r.get("upstream")]
        assert said and set(said) == {"late_start"} and ex["upstream_missed"] == len(said), ex
    run(body)
