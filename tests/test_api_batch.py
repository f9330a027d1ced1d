"""POST /v1/jobs:batch over an in-process replica (FakeRaft, FakeClock): every job is validated
before anything is proposed; the jobs go out in as few put_jobs commands as the size limit
allows; a failure part-way says which jobs are committed; a retry with the same key is safe."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.core import commands, limits
from raftsched.node import limits as node_limits
from raftsched.core.errors import Indeterminate, Unavailable

from test_api import AUTH, SPEC, Env, err
from core_helpers import live_worker

AT = {"schedule": {"at": "2099-01-01T00:00:00Z"}, "executor": {"type": "shell", "argv": ["true"]},
      "misfire": {"policy": "skip"}}
CRON = {"schedule": {"cron": "17 3 * * 1-5", "timezone": "Europe/Berlin"},
        "executor": {"type": "shell", "argv": ["/usr/local/bin/report", "--daily"]}, "misfire": {"policy": "fire_once"}}


class FlakyRaft:
    """FakeRaft's behaviour, plus a script of outcomes for the next proposals: "ok", "unavailable"
    (not applied), "lost" (not applied, the caller hears a timeout), "applied" (applied, the caller
    hears a timeout)."""

    def __init__(self, inner):
        self.inner = inner
        self.script: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        outcome = self.script.pop(0) if self.script else "ok"
        if outcome == "unavailable":
            raise Unavailable("no leader", leader=None)
        if outcome == "lost":
            raise Indeterminate("timed out")
        res = await self.inner.propose(data, timeout_s)
        if outcome == "applied":
            raise Indeterminate("leader changed")
        return res


def run(coro_fn):
    async def main():
        env = Env()
        env.flaky = FlakyRaft(env.raft)
        env.service.raft = env.service.proposer.raft = env.flaky
        # Every request needs a token: batch() sends its own headers, the rest the default.
        async with TestClient(TestServer(env.app, host="127.0.0.1"), headers=AUTH) as client:
            await coro_fn(env, client)
    asyncio.run(main())


async def batch(client, jobs, key=None, create_only=None, headers=AUTH, raw=None):
    h = dict(headers)
    if key:
        h["Idempotency-Key"] = key
    body = {"jobs": jobs} if raw is None else raw
    if create_only is not None:
        body["create_only"] = create_only
    return await client.post("/v1/jobs:batch", data=json.dumps(body), headers=h)


def many(n, spec=AT, prefix="job"):
    return {f"{prefix}-{i:05d}": spec for i in range(n)}


def put_jobs_commands(env) -> list[dict]:
    return [c for c in map(commands.decode, env.raft.proposed) if c["op"] == "put_jobs"]


def test_a_batch_creates_every_job_in_as_few_commands_as_fit():
    async def t(env, c):
        jobs = many(600, CRON)
        r = await batch(c, jobs, key="k1")
        body = await r.json()
        assert r.status == 200, body
        assert (body["created"], body["replaced"], body["conflicts"]) == (600, 0, 0)
        assert list(body["jobs"]) == list(jobs), "results in the order of the request"
        res = body["jobs"]["job-00007"]
        assert res["created"] is True and res["next_slot"].endswith("Z")
        assert env.state.jobs["job-00007"]["gen"] == res["gen"]
        cmds = put_jobs_commands(env)
        assert len(cmds) == body["commands"] > 1
        sizes = [len(d) for d in env.raft.proposed]
        assert max(sizes) <= limits.command_bytes_max
        # As few as fit: each command but the last could not take the next job (at its widest,
        # and with room for the 14 bytes of a `was`, as a scheduled job's position may have one).
        assert all(size > limits.command_bytes_max - 1000 - 14 * len(cmd["jobs"]) for size, cmd in zip(sizes[:-1], cmds))
        assert sum(len(cmd["jobs"]) for cmd in cmds) == 600 == len(env.state.jobs)
        got = (await (await c.get("/v1/jobs/job-00599")).json())["spec"]
        assert got["schedule"]["cron"] == "17 3 * * 1-5" and got["misfire"]["policy"] == "fire_once"
        # Replaced the second time.
        body = await (await batch(c, {"job-00001": AT, "fresh": AT})).json()
        assert body["jobs"]["job-00001"]["created"] is False and body["jobs"]["fresh"]["created"] is True
        assert (body["created"], body["replaced"]) == (1, 1)
    run(t)


def test_a_batch_and_single_puts_make_the_same_jobs():
    async def t(env, c):
        jobs = {"a": SPEC, "b": CRON, "c": AT}
        assert (await batch(c, jobs)).status == 200
        viaput = Env()
        for name, spec in jobs.items():
            await viaput.service.put_job(name, spec, None)
        for name in jobs:
            a, b = env.state.jobs[name], viaput.state.jobs[name]
            assert a["spec"] == b["spec"] and a["next"] == b["next"] and a["anchor"] == b["anchor"], name
    run(t)


def test_one_invalid_job_is_422_naming_it_and_its_field_and_nothing_changes():
    async def t(env, c):
        assert (await batch(c, {"x": AT})).status == 200
        before, proposed = env.state.snapshot(), len(env.raft.proposed)
        jobs = many(300)
        jobs["job-00150"] = dict(AT, schedule={"cron": "61 * * * *"})
        jobs["job-00200"] = {"schedule": {"every_s": 60}, "misfire": {"policy": "skip"}}
        jobs["bad name!"] = AT
        body = await err(await batch(c, jobs), 422, "invalid", "schedule.cron")
        e = body["error"]
        assert e["job"] == "job-00150" and "job-00150" in e["message"]
        assert e["invalid"] == 3
        assert [(x["job"], x["field"]) for x in e["errors"]] == [
            ("job-00150", "schedule.cron"), ("job-00200", "executor"), ("bad name!", "name")]
        assert env.state.snapshot() == before and len(env.raft.proposed) == proposed, "nothing proposed"
    run(t)


@pytest.mark.parametrize("raw,field", [
    ([1, 2], None),
    ({}, "jobs"),
    ({"jobs": {}}, "jobs"),
    ({"jobs": []}, "jobs"),
    ({"jobs": {"a": AT}, "create_only": "yes"}, "create_only"),
    ({"jobs": {"a": AT}, "surprise": 1}, "surprise"),
])
def test_a_malformed_body_is_400_naming_the_field(raw, field):
    async def t(env, c):
        before = env.state.snapshot()
        await err(await batch(c, None, raw=raw), 400, "bad_request", field)
        assert env.state.snapshot() == before
    run(t)


def test_bad_json_too_many_jobs_too_large_and_no_token(monkeypatch):
    monkeypatch.setattr(limits, "batch_jobs_max", 5)
    monkeypatch.setattr(limits, "batch_request_bytes_max", 100_000)

    async def t(env, c):
        r = await c.post("/v1/jobs:batch", data=b"{nope", headers=AUTH)
        await err(r, 400, "bad_request")
        body = await err(await batch(c, many(6)), 400, "bad_request", "jobs")
        assert "at most 5" in body["error"]["message"]
        big = {"jobs": {"a": dict(AT, description="x" * 1000)}, "pad": "y" * 200_000}
        await err(await c.post("/v1/jobs:batch", data=json.dumps(big), headers=AUTH), 413, "too_large")
        # The larger limit is the batch's only: other requests keep 64 KiB.
        await err(await c.put("/v1/jobs/a", data=json.dumps(dict(AT, description="x" * 70_000)), headers=AUTH),
                  413, "too_large")
        await err(await batch(c, many(2), headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
        assert env.state.jobs == {}
    run(t)


def test_create_only_reports_existing_jobs_as_conflicts_and_creates_the_rest():
    async def t(env, c):
        assert (await batch(c, {"b": AT})).status == 200
        gen_b = env.state.jobs["b"]["gen"]
        r = await batch(c, {"a": AT, "b": CRON, "c": AT}, create_only=True)
        body = await r.json()
        assert r.status == 200, body
        assert body["jobs"]["b"] == {"error": {"code": "conflict", "message": "job 'b' exists", "field": "name"}}
        assert body["jobs"]["a"]["created"] and body["jobs"]["c"]["created"]
        assert (body["created"], body["replaced"], body["conflicts"]) == (2, 0, 1)
        assert env.state.jobs["b"]["gen"] == gen_b and "at" in env.state.jobs["b"]["spec"]["schedule"]
    run(t)


def test_the_same_body_with_the_same_key_applies_once():
    async def t(env, c):
        jobs = many(400, CRON)
        first = await (await batch(c, jobs, key="import-1")).json()
        gen, n = env.state.gen, len(env.raft.proposed)
        env.clock.advance(60_000)  # a later retry: other times, the same commands
        again = await (await batch(c, dict(reversed(list(jobs.items()))), key="import-1")).json()
        assert again["duplicate"] is True
        assert {k: v["gen"] for k, v in again["jobs"].items()} == {k: v["gen"] for k, v in first["jobs"].items()}
        assert env.state.gen == gen, "nothing applied twice"
        cmds = put_jobs_commands(env)
        assert len(cmds) == 2 * n and [x["rid"] for x in cmds[n:]] == [x["rid"] for x in cmds[:n]], \
            "the same request ids, whatever the order of the body and the time"
        # Another key is another request: the jobs are replaced.
        other = await (await batch(c, jobs, key="import-2")).json()
        assert other["replaced"] == 400 and env.state.gen == gen + 400
    run(t)


@pytest.mark.parametrize("outcome,status,code", [
    ("unavailable", 503, "unavailable"), ("lost", 504, "indeterminate"), ("applied", 504, "indeterminate")])
def test_a_failure_part_way_says_what_is_committed_and_a_retry_finishes_it(outcome, status, code):
    async def t(env, c):
        jobs = many(500)
        env.flaky.script = ["ok", outcome, "ok"]
        r = await batch(c, jobs, key="imp")
        body = await err(r, status, code)
        e = body["error"]
        if status == 503:
            assert r.headers["Retry-After"] == "1"
        n = e["commands"]
        assert n >= 3 and e["commands_failed"] == 1 and e["idempotency_key"] == "imp"
        lost = e["not_committed"] if status == 503 else e["unknown"]
        assert lost and set(lost) | set(e["jobs"]) == set(jobs) and not set(lost) & set(e["jobs"])
        assert all(v["created"] for v in e["jobs"].values())
        committed_gens = {k: v["gen"] for k, v in e["jobs"].items()}
        assert all(env.state.jobs[k]["gen"] == g for k, g in committed_gens.items())
        if outcome != "applied":
            assert not set(lost) & set(env.state.jobs)
        # The retry, with the same key: the committed commands answer from memory.
        r = await batch(c, jobs, key="imp")
        body = await r.json()
        assert r.status == 200, body
        assert set(env.state.jobs) == set(jobs)
        assert all(body["jobs"][k]["gen"] == g for k, g in committed_gens.items()), "not applied twice"
        assert all(v["created"] for v in body["jobs"].values())
    run(t)


def test_a_refusal_from_the_state_is_reported_per_command(monkeypatch):
    monkeypatch.setattr(limits, "jobs_max", 150)

    async def t(env, c):
        r = await batch(c, many(300))
        body = await err(r, 422, "limit_exceeded", "jobs")
        e = body["error"]
        assert len(e["jobs"]) + len(e["not_committed"]) == 300 and not e["unknown"]
        assert len(env.state.jobs) == len(e["jobs"]) <= 150
    run(t)


def test_the_event_loop_is_not_held_for_a_whole_batch(monkeypatch):
    """Validation yields to the loop every batch_validate_step jobs."""
    monkeypatch.setattr(node_limits, "batch_validate_step", 50)

    async def t(env, c):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)  # ok-sleep: counts the loop turns it gets

        task = asyncio.create_task(ticker())
        try:
            assert (await batch(c, many(1000))).status == 200
        finally:
            task.cancel()
        assert ticks >= 1000 / 50
    run(t)


def test_a_batch_and_a_put_may_pause_each_job_in_the_command_that_writes_it():
    """A migrating user's walk: a CronJob's suspend had no equivalent at creation (a put, then a
    pause, let a slot fire in between); an import ahead of a cut-over made every job fire at once.
    ``"paused": true`` in a batch, ``?paused=true`` on a PUT, pause each job in its own command."""
    async def t(env, c):
        r = await batch(c, {"a": SPEC, "b": CRON}, raw={"jobs": {"a": SPEC, "b": CRON}, "paused": True})
        body = await r.json()
        assert r.status == 200 and body["paused"] is True and body["created"] == 2, body
        assert env.state.jobs["a"]["paused"] and env.state.jobs["b"]["paused"]
        assert all(c_.get("paused") is True for cmd in put_jobs_commands(env) for c_ in cmd["jobs"])
        view = await (await c.get("/v1/jobs/a")).json()
        pause = view["state"]["pause"]
        assert view["state"]["paused"] is True and pause["reason"] == "manual", view["state"]
        assert pause["by"] == "bootstrap", pause  # (the token that asked, as a pause's: a re-walk)
        r = await c.put("/v1/jobs/one", data=json.dumps(SPEC), params={"paused": "true"})
        body = await r.json()
        assert r.status == 201 and body["paused"] is True and env.state.jobs["one"]["paused"], body
        assert (await (await c.get("/v1/jobs/one")).json())["state"]["pause"]["by"] == "bootstrap"
        r = await c.put("/v1/jobs/one", data=json.dumps(SPEC), params={"paused": "true"})
        assert r.status == 200 and "paused" not in await r.json()  # paused already: not said (a re-walk)
        r = await c.put("/v1/jobs/two", data=json.dumps(SPEC))
        assert r.status == 201 and "paused" not in await r.json() and not env.state.jobs["two"]["paused"]
        for bad in ({"paused": "yes"}, {"paused": 1}):
            r = await batch(c, {}, raw={"jobs": {"x": SPEC}, **bad})
            e = (await r.json())["error"]
            assert r.status == 400 and e["field"] == "paused" and "x" not in env.state.jobs, e
        r = await c.put("/v1/jobs/x", data=json.dumps(SPEC), params={"paused": "maybe"})
        assert r.status == 400 and (await r.json())["error"]["field"] == "paused" and "x" not in env.state.jobs
    run(t)


def test_a_dry_run_says_what_each_job_would_become_and_changes_nothing():
    """``raftsched apply`` had no way to see what a file would change (a migration walk): a dry
    run checks every job as the batch does and answers create, replace (with each changed field,
    both values), unchanged or conflict, proposing nothing."""
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        assert (await batch(c, {"same": AT, "moved": CRON})).status == 200
        before = len(env.raft.proposed)
        gens = {n: env.state.jobs[n]["gen"] for n in ("same", "moved")}
        moved = dict(CRON, schedule={"cron": "30 4 * * *", "timezone": "Europe/Berlin"}, retry={"max_attempts": 3})
        r = await batch(c, {}, raw={"jobs": {"new": AT, "moved": moved, "same": AT}, "dry_run": True})
        body = await r.json()
        assert r.status == 200, body
        assert env.raft.proposed[before:] == [] and "new" not in env.state.jobs  # nothing proposed
        assert {n: env.state.jobs[n]["gen"] for n in gens} == gens
        assert list(body["jobs"]) == ["new", "moved", "same"]  # the body's order
        assert (body["dry_run"], body["create"], body["replace"], body["unchanged"], body["conflicts"]) == \
            (True, 1, 1, 1, 0)
        assert body["jobs"]["new"] == {"action": "create", "next_slot": "2099-01-01T00:00:00Z"}
        assert body["jobs"]["same"]["action"] == "unchanged" and "changes" not in body["jobs"]["same"]
        m = body["jobs"]["moved"]
        assert m["action"] == "replace", m
        changes = {ch["field"]: ch for ch in m["changes"]}
        assert changes["schedule.cron"] == {"field": "schedule.cron", "from": "17 3 * * 1-5", "to": "30 4 * * *"}
        assert changes["retry.max_attempts"]["to"] == 3 and "retry.max_attempts" in changes
        view = await (await c.get("/v1/jobs/moved")).json()
        assert m["next_slot"] != view["state"]["next_slot"]  # the new schedule's next slot, not the stored one
        # The apply itself then does what the dry run said.
        r = await batch(c, {"new": AT, "moved": moved, "same": AT})
        done = await r.json()
        assert (done["created"], done["replaced"]) == (1, 2) and done["jobs"]["moved"]["next_slot"] == m["next_slot"]
        r = await batch(c, {}, raw={"jobs": {"moved": moved}, "dry_run": True})
        assert (await r.json())["jobs"]["moved"]["action"] == "unchanged"
    run(t)


def test_a_dry_run_refuses_what_the_batch_refuses_and_reports_conflicts_and_pauses():
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        assert (await batch(c, {"b": AT})).status == 200
        before = len(env.raft.proposed)
        bad = dict(AT, misfire={"policy": "sometimes"})
        r = await batch(c, {}, raw={"jobs": {"a": AT, "x": bad}, "dry_run": True})
        body = await err(r, 422, "invalid", "misfire.policy")
        assert body["error"]["job"] == "x"
        for raw in ({"jobs": {"a": AT}, "dry_run": "yes"}, {"jobs": {"a": AT}, "dry_run": 1}):
            await err(await batch(c, {}, raw=raw), 400, "bad_request", "dry_run")
        r = await batch(c, {}, raw={"jobs": {"a": AT, "b": CRON}, "dry_run": True, "create_only": True,
                                    "paused": True})
        body = await r.json()
        assert r.status == 200, body
        assert body["jobs"]["b"] == {"action": "conflict",
                                     "error": {"code": "conflict", "message": "job 'b' exists", "field": "name"}}
        assert body["jobs"]["a"]["pauses"] is True and body["paused"] is True and body["conflicts"] == 1
        # A job paused already is not paused again; a drift check sees it paused (a walk: a job
        # paused by hand passed as "unchanged").
        assert (await c.post("/v1/jobs/b/pause")).status == 200
        before = len(env.raft.proposed)
        r = await batch(c, {}, raw={"jobs": {"b": AT}, "dry_run": True, "paused": True})
        res = (await r.json())["jobs"]["b"]
        assert "pauses" not in res and res["paused_in_cluster"] is True, res
        r = await batch(c, {}, raw={"jobs": {"b": AT}, "dry_run": True})
        assert (await r.json())["jobs"]["b"] == {"action": "unchanged", "paused_in_cluster": True,
                                                 "next_slot": "2099-01-01T00:00:00Z"}
        assert env.raft.proposed[before:] == [] and "a" not in env.state.jobs
    run(t)


def test_a_dry_runs_answer_shows_long_values_by_their_size_and_stays_bounded(monkeypatch):
    """A review: each replace's ``from`` carried the stored value whole (payloads of 16 KB), so a
    40 KB request of small specs was answered with 9.7 MB. A value over dry_run_value_bytes_max
    is shown by its size, and past dry_run_values_bytes_max in one answer, every value is."""
    async def t(env, c):
        big = dict(AT, payload={"blob": "x" * 3000})
        assert (await batch(c, {f"j{i}": dict(big, description=f"job number {i}") for i in range(5)})).status == 200
        monkeypatch.setattr(node_limits, "dry_run_values_bytes_max", 40)
        r = await batch(c, {}, raw={"jobs": {f"j{i}": AT for i in range(5)}, "dry_run": True})
        body = await r.json()
        assert r.status == 200 and len(await r.read()) < 3000, body
        ch = {x["field"]: x for x in body["jobs"]["j0"]["changes"]}
        assert ch["payload.blob"] == {"field": "payload.blob", "from_bytes": 3002}  # (the JSON string)
        assert ch["description"] == {"field": "description", "from": "job number 0"}  # within the budget
        assert body["values_left_out"] is True
        assert body["jobs"]["j4"]["changes"][0].keys() <= {"field", "from_bytes", "to_bytes"}  # past it
    run(t)
