"""Holes a review of multi-tenancy found (2026-12-06), each closed, over an in-process app: a token
limited to tenant ``ta`` must neither drive tenant ``tb``'s jobs, nor bound or watch the queue
every job without a queue uses, nor learn whether a run of ``tb`` exists, nor remove ``tb``'s
runs (docs/security.md, "Tenants")."""
from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core.state import SchedulerState
from raftsched.node.api import make_app
from raftsched.node.service import Service

from fakes import FakeRaft

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def http_job(tenant: str, queue: str, **more) -> dict:
    return {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"}, "tenant": tenant, "queue": queue,
            "executor": {"type": "http", "url": "https://example.com/hook"}, **more}


def run(body) -> None:
    async def main():
        state = SchedulerState()
        app = make_app(Service(FakeRaft(state), FakeClock(), "node-1"), TOKEN)
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            async def call(method, path, token=TOKEN, body=None, **kw):
                r = await c.request(method, path, headers={"Authorization": f"Bearer {token}"},
                                    data=None if body is None else json.dumps(body), **kw)
                return r.status, await r.json()

            async def operator(tenant: str) -> str:
                s, b = await call("POST", "/v1/tokens", body={"role": "operator", "tenants": [tenant]})
                assert s == 201, b
                return b["token"]
            await body(call, operator, state)
    asyncio.run(main())


def test_a_tenant_cannot_claim_the_default_queue():
    """On a cluster whose default queue no job used yet, a limited operator's job there claimed
    it: the tenant then bounded it (max_depth 1: every other job's runs in it skipped
    queue_full), saw their counts, and other tenants' tokens were refused it. It belongs to no
    tenant until an admin shares it."""
    async def t(call, operator, state):
        a = await operator("ta")
        s, e = await call("PUT", "/v1/jobs/aj", a, http_job("ta", "default"))
        assert s == 403 and e["error"]["field"] == "queue" and "default queue" in e["error"]["message"], e
        s, e = await call("PUT", "/v1/queues/default", a, {"max_depth": 1})
        assert s == 403 and "default queue" in e["error"]["message"], e
        assert "default" not in state.queue_owners and "default" not in state.queues
        s, b = await call("GET", "/v1/queues", a)
        assert s == 200 and "default" not in [q["name"] for q in b["queues"]], b
        # its own queue it claims, as before; the default one once an admin shares it
        assert (await call("PUT", "/v1/jobs/aj", a, http_job("ta", "qa")))[0] == 201
        assert (await call("PUT", "/v1/queues/default", TOKEN, {"tenants": ["ta"]}))[0] == 200
        assert (await call("PUT", "/v1/jobs/aj2", a, http_job("ta", "default")))[0] == 201
    run(t)


def test_a_tenant_cannot_take_over_another_tenants_child_by_its_deleted_parents_name():
    """tb's child named tb's parent, which tb deleted with force: ta made a job of that name and
    tb's child ran on its every slot, with ta's results as its upstream. The name is taken for a
    token of a tenant other than the children's, as another tenant's job name is."""
    async def t(call, operator, state):
        a, b = await operator("ta"), await operator("tb")
        assert (await call("PUT", "/v1/jobs/b-ok", b, http_job("tb", "qb")))[0] == 201
        child = http_job("tb", "qb", after=["b-ok"])
        del child["schedule"], child["misfire"]
        s, r = await call("PUT", "/v1/jobs/b-child", b, child)
        assert s == 201, r
        assert (await call("DELETE", "/v1/jobs/b-ok", b, params={"force": "true"}))[0] == 200
        s, e = await call("PUT", "/v1/jobs/b-ok", a, http_job("ta", "qa"))
        assert s == 409 and e["error"]["field"] == "name" and "taken" in e["error"]["message"], e
        assert "b-ok" not in state.jobs
        s, e = await call("POST", "/v1/jobs:batch", a, {"jobs": {"b-ok": http_job("ta", "qa")}})
        assert s == 409 and e["error"]["field"] == "name" and "taken" in e["error"]["message"], e
        assert "b-ok" not in state.jobs
        # tb itself may make it again, and an admin may give it to anyone
        assert (await call("PUT", "/v1/jobs/b-ok", b, http_job("tb", "qb")))[0] == 201
    run(t)


def test_a_list_cursor_does_not_tell_whether_another_tenants_run_exists():
    """``GET /v1/runs?before=RUN`` positioned the cursor among every tenant's runs: a run id of
    tb's (``name@slot``, guessable for a cron job) answered 200, an unknown one 400. Both are
    400 now, with the same message; the token's own cursor still pages."""
    async def t(call, operator, state):
        a, b = await operator("ta"), await operator("tb")
        for tok, tenant, q in ((a, "ta", "qa"), (b, "tb", "qb")):
            assert (await call("PUT", f"/v1/jobs/j-{tenant}", tok, http_job(tenant, q)))[0] == 201
        runs = {}
        for tok, tenant in ((a, "ta"), (a, "ta"), (b, "tb")):
            s, r = await call("POST", f"/v1/jobs/j-{tenant}/trigger", tok)
            assert s == 201, r
            runs.setdefault(tenant, []).append(r["run"])
        answers = []
        for cursor in (runs["tb"][0], runs["tb"][0].replace("j-tb", "j-nobody")):
            for path in ("/v1/runs", "/v1/jobs/j-ta/runs"):
                s, e = await call("GET", path, a, params={"limit": "1", "before": cursor})
                assert s == 400 and e["error"]["field"] == "before", (path, s, e)
                answers.append(e["error"]["message"].replace(cursor, "X"))
        assert len(set(answers)) == 1, answers
        s, page = await call("GET", "/v1/runs", a, params={"limit": "1"})
        assert s == 200 and page["next"] == runs["ta"][1], page
        s, page = await call("GET", "/v1/runs", a, params={"limit": "1", "before": page["next"]})
        assert s == 200 and [r["id"] for r in page["runs"]] == [runs["ta"][0]], page
        s, page = await call("GET", "/v1/runs", TOKEN, params={"limit": "5", "before": runs["tb"][0]})
        assert s == 200, page
    run(t)


def test_a_tenant_cannot_delete_another_tenants_runs_with_a_job_moved_to_it():
    """A job moved from tb to ta (by a token of both) keeps tb's runs, dead ones too; a delete by
    ta's token removed them from tb's lists and DLQ. Refused to a limited token while the job
    holds runs of another tenant; an admin's delete goes through."""
    async def t(call, operator, state):
        a = await operator("ta")
        assert (await call("PUT", "/v1/queues/qa", TOKEN, {"tenants": ["ta"]}))[0] == 200
        assert (await call("PUT", "/v1/jobs/mv", TOKEN, http_job("tb", "qb")))[0] == 201
        s, r = await call("POST", "/v1/jobs/mv/trigger", TOKEN)
        assert s == 201, r
        assert (await call("PUT", "/v1/jobs/mv", TOKEN, http_job("ta", "qa")))[0] == 200
        s, e = await call("DELETE", "/v1/jobs/mv", a)
        assert s == 403 and e["error"]["field"] == "name" and "another tenant" in e["error"]["message"], e
        assert r["run"] in state.runs and "mv" in state.jobs
        assert (await call("DELETE", "/v1/jobs/mv", TOKEN))[0] == 200
        # a job of its own tenant only is deleted as before
        assert (await call("PUT", "/v1/jobs/own", a, http_job("ta", "qa")))[0] == 201
        assert (await call("POST", "/v1/jobs/own/trigger", a))[0] == 201
        assert (await call("DELETE", "/v1/jobs/own", a))[0] == 200
    run(t)


def test_a_dry_run_shows_no_other_tenants_job():
    """A batch's dry run answers the fields that would change, both values: for another tenant's
    job it is refused as the batch is, so a limited token reads no spec through it."""
    async def t(call, operator, state):
        s, b = await call("PUT", "/v1/jobs/theirs", body=http_job("b", "qb", labels={"owner": "team-b"}))
        assert s == 201, b
        tok = await operator("a")
        s, b = await call("POST", "/v1/jobs:batch", token=tok,
                          body={"jobs": {"theirs": http_job("a", "qa")}, "dry_run": True})
        assert s in (403, 409) and b["error"]["job"] == "theirs", b
        assert "team-b" not in json.dumps(b) and "qb" not in json.dumps(b)
        s, b = await call("POST", "/v1/jobs:batch", token=tok, body={"jobs": {"mine": http_job("a", "qa")},
                                                                       "dry_run": True})
        assert s == 200 and b["jobs"]["mine"]["action"] == "create" and "mine" not in state.jobs, b
    run(t)


def test_a_tenants_operator_cannot_fill_the_clusters_jobs(monkeypatch):
    """A batch of a limited token that would take its tenant past jobs_per_tenant_max is refused
    whole before any command (422 limit_exceeded), and a single PUT past it by the command."""
    from raftsched.core import limits
    monkeypatch.setattr(limits, "jobs_per_tenant_max", 2)

    async def t(call, operator, state):
        tok = await operator("a")
        s, b = await call("POST", "/v1/jobs:batch", token=tok,
                          body={"jobs": {f"j{i}": http_job("a", "qa") for i in range(3)}})
        assert s == 422 and b["error"]["code"] == "limit_exceeded" and b["error"]["field"] == "jobs", b
        assert not state.jobs
        s, b = await call("POST", "/v1/jobs:batch", token=tok,
                          body={"jobs": {f"j{i}": http_job("a", "qa") for i in range(3)}, "dry_run": True})
        assert s == 422 and b["error"]["code"] == "limit_exceeded", b
        s, b = await call("POST", "/v1/jobs:batch", token=tok, body={"jobs": {f"j{i}": http_job("a", "qa") for i in range(2)}})
        assert s == 200 and b["created"] == 2, b
        s, b = await call("PUT", "/v1/jobs/j9", token=tok, body=http_job("a", "qa"))
        assert s == 422 and b["error"]["code"] == "limit_exceeded" and b["error"]["field"] == "tenant", b
        s, b = await call("PUT", "/v1/jobs/j9", body=http_job("a", "qa"))  # the admin's token
        assert s == 201, b
    run(t)


def test_a_limited_tokens_job_without_a_tenant_is_told_which_tenant_to_give_it():
    """A walk: a spec without "tenant" is the default tenant's, and a token limited to billing
    was refused it with no word of how to fix it."""
    async def t(call, operator, state):
        tok = await operator("billing")
        job = http_job("billing", "qb")
        del job["tenant"]
        s, b = await call("PUT", "/v1/jobs/nightly", token=tok, body=job)
        assert s == 403 and b["error"]["field"] == "tenant", b
        assert b["error"]["message"].endswith('give the job "tenant": "billing"'), b
    run(t)


def test_a_batch_refused_for_its_tenants_lists_every_job_refused():
    """A walk fixed a batch's tenancy refusals one request at a time: each named only the first."""
    async def t(call, operator, state):
        tok = await operator("billing")
        jobs = {"a-ok": http_job("billing", "qb"), "b-other": http_job("acme", "qb"),
                "c-default-queue": http_job("billing", "default"), "d-other": http_job("acme", "qa")}
        s, b = await call("POST", "/v1/jobs:batch", token=tok, body={"jobs": jobs})
        e = b["error"]
        assert s == 403 and e["job"] == "b-other" and e["refused"] == 3, b
        assert [(x["job"], x["field"], x["status"]) for x in e["errors"]] == [
            ("b-other", "tenant", 403), ("c-default-queue", "queue", 403), ("d-other", "tenant", 403)]
        assert not state.jobs
    run(t)
