"""Tokens, roles and the permission table over an in-process replica (node/auth.py, node/audit.py,
node/tenancy.py): every request needs a token, each role gets its scopes and nothing else, a
revoked or expired token is refused at once, refused tokens from one source are slowed down,
every mutation is in the audit log, and a token limited to tenants sees and changes only theirs."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core import commands, limits, schedule
from raftsched.core.state import SchedulerState
from raftsched.node import auth
from raftsched.node.api import make_app
from raftsched.node.audit import AuditLog
from raftsched.node.auth import Auth, FailureLimiter
from raftsched.node import api, routes
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger

from fakes import FakeRaft

BOOT = "b" * 32
SPEC = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}


class Env:
    def __init__(self, tmp_path=None, burst=1000):
        self.state = SchedulerState()
        self.raft = FakeRaft(self.state)
        self.clock = FakeClock()
        self.service = Service(self.raft, self.clock, "node-1")
        self.trigger = Trigger(self.raft, self.clock, "node-1")
        self.trigger.take_due_index()
        self.auth = Auth(BOOT, self.service.read, self.clock, limiter=FailureLimiter(burst, 1.0))
        self.audit = AuditLog(str(tmp_path / "audit.jsonl"), "node-1") if tmp_path is not None else None
        self.app = make_app(self.service, BOOT, trigger=self.trigger, auth=self.auth, audit=self.audit)


def run(coro_fn, tmp_path=None, **kw):
    async def main():
        env = Env(tmp_path, **kw)
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as client:
            await coro_fn(env, client)
    asyncio.run(main())


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


async def call(c, method, path, token=BOOT, body=None, headers=None):
    h = dict(bearer(token) if token else {}, **(headers or {}))
    r = await c.request(method, path, headers=h, data=None if body is None else json.dumps(body))
    return r.status, await r.json(content_type=None)


async def new_token(c, role, **body):
    s, b = await call(c, "POST", "/v1/tokens", body=dict(role=role, **body))
    assert s == 201, b
    return b


def test_a_created_token_is_shown_once_listed_without_secret_and_works_until_revoked():
    async def t(env, c):
        b = await new_token(c, "reader", note="dashboard")
        tok = b["token"]
        assert tok.startswith("rst_" + b["id"] + "_") and len(tok) > 50
        assert (await call(c, "GET", "/v1/jobs", tok))[0] == 200
        s, listed = await call(c, "GET", "/v1/tokens")
        assert s == 200
        mine = [t for t in listed["tokens"] if t["id"] == b["id"]][0]
        assert mine["role"] == "reader" and mine["state"] == "active" and mine["note"] == "dashboard"
        text = json.dumps(listed)
        assert tok.split("_", 2)[2] not in text and "digest" not in text and "salt" not in text
        assert listed["tokens"][0]["id"] == "bootstrap"
        # The state holds a hash, never the secret.
        assert tok.split("_", 2)[2].encode() not in env.state.snapshot()
        s, r = await call(c, "DELETE", f"/v1/tokens/{b['id']}")
        assert s == 200 and r["revoked_at"]
        s, e = await call(c, "GET", "/v1/jobs", tok)
        assert s == 401 and e["error"]["code"] == "unauthorized"
        assert [t["state"] for t in (await call(c, "GET", "/v1/tokens"))[1]["tokens"] if t["id"] == b["id"]] == ["revoked"]
    run(t)


def test_an_expired_token_is_refused_by_the_node_clock():
    async def t(env, c):
        b = await new_token(c, "operator", expires=env.clock.now_ms() + 60_000)
        assert (await call(c, "GET", "/v1/jobs", b["token"]))[0] == 200
        env.clock.advance(60_000)
        s, e = await call(c, "GET", "/v1/jobs", b["token"])
        assert s == 401 and "expired" in e["error"]["message"]
    run(t)


def test_forged_and_malformed_tokens_are_401_naming_no_secret():
    async def t(env, c):
        b = await new_token(c, "admin")
        tid, secret = b["id"], b["token"].split("_", 2)[2]
        for forged in (f"rst_{tid}_{secret[:-1]}x", f"rst_{tid}_", f"rst_{'0' * 16}_{secret}", BOOT + "x",
                       BOOT[:-1], "rst_", "", "Basic " + BOOT, secret):
            s, e = await call(c, "GET", "/v1/jobs", None, headers={"Authorization": f"Bearer {forged}"})
            assert s == 401, forged
            assert secret not in json.dumps(e) and BOOT not in json.dumps(e)
        s, _ = await call(c, "GET", "/v1/jobs", None, headers={"Authorization": BOOT})
        assert s == 401, "the Bearer scheme is required"
    run(t)


ROUTES = [  # (method, path, body): one request a route, valid enough to pass auth
    ("GET", "/v1/cluster", None), ("GET", "/v1/jobs", None), ("GET", "/v1/jobs/a", None),
    ("PUT", "/v1/jobs/b", SPEC), ("POST", "/v1/jobs:batch", {"jobs": {"c": SPEC}}),
    ("POST", "/v1/jobs:plan", {"jobs": {"c": SPEC}}),
    ("POST", "/v1/jobs/a/pause", None), ("POST", "/v1/jobs/a/resume", None), ("POST", "/v1/jobs/a/trigger", None),
    ("GET", "/v1/jobs/a/runs", None), ("GET", "/v1/jobs/a/preview", None),
    ("POST", "/v1/jobs/a/explain", {"down_from": "2030-01-01T00:00:00Z", "down_to": "2030-01-01T01:00:00Z"}),
    ("POST", "/v1/preview", SPEC), ("GET", "/v1/queues", None), ("PUT", "/v1/queues/q", {"max_depth": 5}),
    ("GET", "/v1/tenants", None), ("GET", "/v1/tenants/t", None), ("PUT", "/v1/tenants/t", {"rate_per_s": 1}),
    ("DELETE", "/v1/tenants/t", None),
    ("GET", "/v1/dlq", None), ("GET", "/v1/dlq/a@1", None), ("POST", "/v1/dlq/a@1/requeue", None),
    ("DELETE", "/v1/dlq/a@1", None), ("GET", "/v1/locks/l", None),
    ("POST", "/v1/locks/l/acquire", {"owner": "me", "ttl_s": 5}), ("POST", "/v1/locks/l/renew", {"token": 1}),
    ("POST", "/v1/locks/l/release", {"token": 1}), ("GET", "/v1/runs", None), ("GET", "/v1/runs/a@1", None),
    ("POST", "/v1/runs/a@1/cancel", None), ("POST", "/v1/jobs/a/cancel", None),
    ("GET", "/v1/tokens", None), ("POST", "/v1/tokens", {"role": "reader"}),
    ("DELETE", "/v1/tokens/0123456789abcdef", None), ("DELETE", "/v1/jobs/zz", None),
    ("POST", "/v1/jobs/a/backfills", {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z", "dry_run": True}),
    ("GET", "/v1/backfills", None), ("GET", "/v1/backfills/nope", None), ("POST", "/v1/backfills/nope/cancel", None),
    ("POST", "/v1/dlq:requeue", {"dry_run": True, "all": True}),
    ("POST", "/v1/dlq:purge", {"dry_run": True, "all": True}),
    ("POST", "/v1/workers/w1/lease", {"max": 1, "wait_s": 0, "ttl_ms": 10_000}),
    ("POST", "/v1/workers/w1/heartbeat", {"leases": [], "ttl_ms": 10_000}),
    ("POST", "/v1/workers/w1/complete", {"results": []}), ("POST", "/v1/workers/w1/release", {"leases": []}),
    ("POST", "/v1/workers/w1/leave", {"instance": "i1"}),
    ("GET", "/v1/workers", None), ("GET", "/v1/workers/w1", None), ("POST", "/v1/workers/w1/drain", None),
    ("POST", "/v1/jobs/a/ping", {"status": "start"}), ("GET", "/v1/deadlines", None), ("GET", "/v1/jobs/a/graph", None),
    ("GET", "/v1/secrets", None), ("POST", "/v1/secrets:rotate", {"key": "process"}),
    ("POST", "/v1/cluster/members", {"addr": "127.0.0.1:7"}), ("DELETE", "/v1/cluster/members/127.0.0.1:8", None),
    ("GET", "/v1/cluster/fencing", None), ("POST", "/v1/cluster/fencing", {"at_least": 5}),
    ("GET", "/v1/sinks", None), ("GET", "/v1/sinks/s", None), ("GET", "/v1/sinks/s/dead", None),
    ("PUT", "/v1/sinks/s", {"type": "webhook", "url": "http://127.0.0.1:9/", "tenant": "t",
                            "secrets": {"signing_key": "k"}}),
    ("POST", "/v1/sinks/s/dead:requeue", None), ("DELETE", "/v1/sinks/zz", None),
    ("GET", "/v1/whoami", None),
]
#: The open rows besides /healthz and /metrics: the dashboard's static files (tests/test_dashboard.py).
OPEN_UI = {("GET", "/ui"), ("GET", "/ui/"), ("GET", "/ui/{file}")}
ALLOWED = {
    "admin": set(auth.SCOPES),
    "operator": {"read", "jobs.write", "dlq.write", "queues.write", "locks.write", "ping"},
    "reader": {"read"},
    "worker": {"worker", "ping"},
    "ping": {"ping"},
}


def canonical(app, path: str) -> str:
    """The route (resource canonical path) a concrete path matches."""
    for res in app.router.resources():
        info = res.get_info()
        if info.get("path") == path or ("pattern" in info and info["pattern"].fullmatch(path)):
            return res.canonical
    raise LookupError(path)


def scope_of(method: str, route: str) -> str:
    """The scope the route table gives ``method route``."""
    return routes.lookup(routes.table(api.ROUTES), method, route).scope


def test_the_app_serves_exactly_the_route_table_and_every_row_is_tested_here():
    """The app is built from the route table (node/routes.py) and nothing else: every route it
    serves has one row (with its scope and its tenancy rule), every row is served, and every row
    but the open ones is exercised by ROUTES above for each role."""
    app = Env().app
    served = set()
    for res in app.router.resources():
        for route in res:
            if route.method in ("HEAD", "*"):
                continue
            served.add((route.method, res.canonical))
    table = routes.table(api.ROUTES)
    assert served == set(table), (served ^ set(table))
    for row in table.values():
        assert row.scope in auth.SCOPES or row.scope == routes.OPEN, row
        assert isinstance(row.tenancy, routes.Tenancy), row
    tested = {(m, canonical(app, p)) for m, p, _ in ROUTES}
    assert tested <= served, "ROUTES names only routes the API serves"
    untested = {("GET", "/metrics"), ("GET", "/healthz"), ("GET", "/openapi.json"), ("GET", "/v1/openapi.json")} | OPEN_UI
    assert served - tested == untested, f"untested: {served - tested - untested}"


def test_a_route_added_without_a_row_is_not_served():
    async def extra(request):
        return aiohttp.web.json_response({"ok": True})

    async def t(env, c):
        env.app.router._frozen = False  # as a later module adding a route by hand would
        env.app.router.add_get("/v1/sneaky", extra)
        s, b = await call(c, "GET", "/v1/sneaky")
        assert s == 404 and b["error"]["code"] == "not_found"
    run(t)


@pytest.mark.parametrize("role", ["admin", "operator", "reader", "worker", "ping"])
def test_each_role_gets_its_scopes_and_403_names_the_missing_one(role):
    async def t(env, c):
        await call(c, "PUT", "/v1/jobs/a", body=SPEC)
        tok = (await new_token(c, role, **({"jobs": ["a"]} if role == "ping" else {})))["token"]
        for method, path, body in ROUTES:
            scope = scope_of(method, canonical(env.app, path))
            s, b = await call(c, method, path, tok, body)
            assert s < 500, (method, path, b)
            if scope in ALLOWED[role]:
                assert s != 403, (role, method, path, b)
            else:
                assert s == 403 and b["error"]["code"] == "forbidden" and b["error"]["scope"] == scope, (role, method, path, b)
                assert scope in b["error"]["message"]
    run(t)


def test_a_ping_token_pings_only_its_jobs():
    async def t(env, c):
        for name in ("a", "b"):
            await call(c, "PUT", f"/v1/jobs/{name}", body=SPEC)
        b = await new_token(c, "ping", jobs=["a"])
        assert b["jobs"] == ["a"]
        s, body = await call(c, "POST", "/v1/jobs/a/ping", b["token"], {"status": "start"})
        assert s == 409 and "not a heartbeat job" in body["error"]["message"], body  # allowed: judged by the state
        s, body = await call(c, "POST", "/v1/jobs/b/ping", b["token"], {"status": "start"})
        assert s == 403 and body["error"]["field"] == "name", body
        for bad, field in (({"status": "done"}, "status"), ({"slot": "yesterday"}, "slot"), ({"when": 1}, "when"),
                           ([1], None)):
            s, body = await call(c, "POST", "/v1/jobs/a/ping", b["token"], bad)
            assert s == 422 and body["error"]["field"] == field, (bad, body)
        s, body = await call(c, "GET", "/v1/deadlines?state=late&job=a")
        assert s == 200 and body == {"deadlines": []}, body
        s, body = await call(c, "GET", "/v1/deadlines?state=sometimes")
        assert s == 400 and body["error"]["field"] == "state", body
        for bad, field in (({"role": "ping"}, "jobs"), ({"role": "reader", "jobs": ["a"]}, "jobs"),
                           ({"role": "ping", "jobs": ["a", "a"]}, "jobs"), ({"role": "ping", "jobs": ["../x"]}, "jobs[0]")):
            s, body = await call(c, "POST", "/v1/tokens", body=bad)
            assert s == 422 and body["error"]["field"] == field, (bad, body)
        # a role given but unknown is not said to be missing
        for bad, words in (({"role": "superuser"}, "must be one of admin"), ({}, "is required: one of admin")):
            s, body = await call(c, "POST", "/v1/tokens", body=bad)
            assert s == 422 and body["error"]["field"] == "role" and body["error"]["message"].startswith(words), body
        # A ping token for a job that does not exist (a typo) is made, and the answer says so.
        s, body = await call(c, "POST", "/v1/tokens", body={"role": "ping", "jobs": ["a", "nosuchjob"]})
        assert s == 201 and body["warnings"] == [
            "jobs: no job named 'nosuchjob' (yet): this token's pings of it are refused until one is put"], body
        s, body = await call(c, "POST", "/v1/tokens", body={"role": "ping", "jobs": ["a"]})
        assert s == 201 and "warnings" not in body, body
        s, body = await call(c, "POST", "/v1/tokens", body={"role": "reader"})
        assert s == 201 and "warnings" not in body, body
    run(t)


def test_the_worker_protocol_is_the_worker_scope_and_draining_is_an_admins():
    for path in ("/v1/workers/{id}/lease", "/v1/workers/{id}/heartbeat", "/v1/workers/{id}/complete",
                 "/v1/workers/{id}/release", "/v1/workers/{id}/leave"):
        assert scope_of("POST", path) == "worker"
    assert scope_of("POST", "/v1/workers/{id}/drain") == "admin"
    assert scope_of("GET", "/v1/workers") == scope_of("GET", "/v1/workers/{id}") == "read"
    assert scope_of("POST", "/v1/jobs/{name}/backfills") == "jobs.write"
    assert scope_of("POST", "/v1/cluster/members") == scope_of("DELETE", "/v1/cluster/members/{addr}") == "admin"
    assert scope_of("POST", "/v1/backfills/{id}/{action}") == "jobs.write"
    assert scope_of("GET", "/v1/backfills") == "read"
    assert scope_of("HEAD", "/v1/jobs") == "read"


def test_token_requests_are_validated_and_the_bootstrap_token_is_not_revocable():
    async def t(env, c):
        now = env.clock.now_ms()
        for body, field in (({"role": "root"}, "role"), ({}, "role"), ({"role": "admin", "tenants": ["a"]}, "tenants"),
                            ({"role": "reader", "workers": ["w1"]}, "workers"),
                            ({"role": "worker", "workers": []}, "workers"),
                            ({"role": "worker", "workers": ["w1", "w1"]}, "workers"),
                            ({"role": "worker", "workers": ["-x"]}, "workers[0]"),
                            ({"role": "reader", "tenants": []}, "tenants"),
                            ({"role": "reader", "tenants": ["../x"]}, "tenants[0]"),
                            ({"role": "reader", "tenants": ["a", "a"]}, "tenants"),
                            ({"role": "reader", "expires": now - 1}, "expires"),
                            ({"role": "reader", "expires": "yesterday"}, "expires"),
                            ({"role": "reader", "note": "x" * 300}, "note"), ({"role": "reader", "secret": "x"}, "secret")):
            s, e = await call(c, "POST", "/v1/tokens", body=body)
            assert s == 422 and e["error"]["field"] == field, (body, e)
        s, e = await call(c, "DELETE", "/v1/tokens/bootstrap")
        assert s == 422 and "token-file" in e["error"]["message"]
        assert (await call(c, "DELETE", "/v1/tokens/nope"))[0] == 422
        assert (await call(c, "DELETE", "/v1/tokens/0123456789abcdef"))[0] == 404
        assert env.state.tokens == {}
    run(t)


def test_a_retried_create_cannot_show_the_secret_again():
    async def t(env, c):
        h = {"Idempotency-Key": "tok-1"}
        s1, b1 = await call(c, "POST", "/v1/tokens", body={"role": "reader"}, headers=h)
        s2, b2 = await call(c, "POST", "/v1/tokens", body={"role": "reader"}, headers=h)
        assert s1 == 201 and b1["token"]
        assert s2 == 200 and b2["token"] is None and b2["duplicate"] and b2["id"] == b1["id"]
        assert len(env.state.tokens) == 1
        # The same key with another body answers the token that key made, as it is: a reader
        # without tenants, not the operator of tenant x the second body asked for.
        s3, b3 = await call(c, "POST", "/v1/tokens", body={"role": "operator", "tenants": ["x"], "note": "other"},
                            headers=h)
        assert s3 == 200 and b3["duplicate"] and b3["id"] == b1["id"], b3
        assert (b3["role"], b3["tenants"], b3["note"], b3["state"]) == ("reader", None, None, "active"), b3
        assert len(env.state.tokens) == 1
    run(t)


def test_refused_tokens_from_one_source_are_slowed_down():
    async def t(env, c):
        for _ in range(3):
            assert (await call(c, "GET", "/v1/jobs", "nope"))[0] == 401
        r = await c.get("/v1/jobs", headers=bearer(BOOT))
        assert r.status == 429 and r.headers["Retry-After"] == "1", "even a good token waits: nothing is tested"
        assert (await r.json())["error"]["code"] == "too_many_requests"
        assert (await c.get("/healthz")).status == 200, "open routes are not slowed"
        env.clock.advance(1000)
        assert (await call(c, "GET", "/v1/jobs"))[0] == 200
        assert (await call(c, "GET", "/v1/jobs", "nope"))[0] == 401
        assert (await call(c, "GET", "/v1/jobs", "nope"))[0] == 429
    run(t, burst=3)


def test_the_failure_table_is_bounded():
    lim = FailureLimiter(2, 1.0, sources_max=3)
    for i in range(10):
        lim.failed(f"10.0.0.{i}", 0.0)
    assert len(lim._buckets) == 3 and "10.0.0.9" in lim._buckets


def test_every_mutation_and_every_refusal_is_in_the_audit_log_and_no_secret_is(tmp_path):
    reader = {}

    async def t(env, c):
        reader.update(await new_token(c, "reader"))
        tok = reader["token"]
        await call(c, "PUT", "/v1/jobs/a", body=SPEC, headers={"Idempotency-Key": "put-a"})
        await call(c, "PUT", "/v1/jobs/a", tok, body=SPEC)           # 403
        await call(c, "GET", "/v1/jobs", tok)                        # a read: not recorded
        await call(c, "POST", "/v1/preview", tok, body=SPEC)         # read-only: not recorded
        await call(c, "GET", "/v1/jobs", "rst_0123456789abcdef_nope")  # 401: counted (audit-refused.jsonl)
        await call(c, "PUT", "/v1/jobs/a", body={"bad": 1})          # 422, still a mutation
        env.audit.close(env.clock.now_ms())
    run(t, tmp_path)
    text = (tmp_path / "audit.jsonl").read_text()
    recs = [json.loads(line) for line in text.splitlines()]
    got = [(r["method"], r["route"], r["status"], r["auth"], r["token"], r["role"]) for r in recs]
    assert got[0][:4] == ("POST", "/v1/tokens", 201, "allowed") and got[0][4:] == ("bootstrap", "admin")
    assert got[1:] == [
        ("PUT", "/v1/jobs/{name}", 201, "allowed", "bootstrap", "admin"),
        ("PUT", "/v1/jobs/{name}", 403, "denied", reader["id"], "reader"),
        ("PUT", "/v1/jobs/{name}", 422, "allowed", "bootstrap", "admin"),
    ]
    assert recs[1]["target"] == {"name": "a"} and recs[1]["request_id"] == "put-a" and recs[1]["source"] == "127.0.0.1"
    refused = (tmp_path / "audit-refused.jsonl").read_text()
    [summary] = [json.loads(line) for line in refused.splitlines()]
    assert (summary["reason"], summary["status"], summary["count"], summary["routes"], summary["tokens"]) == (
        "unauthenticated", 401, 1, {"GET /v1/jobs": 1}, {"0123456789abcdef": 1})
    for t_ in (text, refused):
        assert BOOT not in t_ and "Bearer" not in t_ and "rst_" not in t_


def test_the_audit_log_rotates_and_keeps_a_bounded_number_of_files(tmp_path):
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n", max_bytes=500, keep=2)
    for i in range(40):
        a.record(now_ms=i, source="s", token="t", role="admin", method="PUT", route="/r", target={"name": "x" * 1000},
                 status=200, auth="allowed", request_id=None)
    a.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size < 500 + 2 * limits.command_bytes_max
        for line in p.read_text().splitlines():
            assert len(json.loads(line)["target"]["name"]) <= 256


# ------------------------------------------------------------------ tenants
async def _seed(c):
    for name, tenant, queue in (("a1", "alpha", "qa"), ("a2", "alpha", "shared"), ("b1", "beta", "shared")):
        s, b = await call(c, "PUT", f"/v1/jobs/{name}", body=dict(SPEC, tenant=tenant, queue=queue))
        assert s == 201, b
    for name in ("a1", "b1"):
        assert (await call(c, "POST", f"/v1/jobs/{name}/trigger"))[0] == 201


def test_a_token_limited_to_tenants_sees_and_changes_only_theirs():
    async def t(env, c):
        await _seed(c)
        # Tenant alpha may run shell jobs (an admin's choice: tokens limited to it may write only
        # http jobs until then, test_a_limited_token_is_held_to_its_tenants_policy).
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http", "shell"]}))[0] == 200
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        s, b = await call(c, "GET", "/v1/jobs", tok)
        assert [j["name"] for j in b["jobs"]] == ["a1", "a2"] and b["total"] == 2
        await call(c, "PUT", "/v1/jobs/a5", body=dict(SPEC, tenant="alpha", labels={"team": "x"}))
        await call(c, "PUT", "/v1/jobs/b5", body=dict(SPEC, tenant="beta", labels={"team": "x"}))
        s, b = await call(c, "GET", "/v1/jobs?label=team=x", tok)
        assert [j["name"] for j in b["jobs"]] == ["a5"] and b["total"] == 1, "labels filter within its tenants"
        await call(c, "DELETE", "/v1/jobs/a5")
        assert (await call(c, "GET", "/v1/jobs/a1", tok))[0] == 200
        s, e = await call(c, "GET", "/v1/jobs/b1", tok)
        assert s == 404 and e["error"]["message"] == "no job named 'b1'", "another tenant's job does not exist for it"
        for method, path in (("POST", "/v1/jobs/b1/pause"), ("DELETE", "/v1/jobs/b1"), ("POST", "/v1/jobs/b1/trigger"),
                             ("GET", "/v1/jobs/b1/runs"), ("GET", "/v1/jobs/b1/preview")):
            assert (await call(c, method, path, tok))[0] == 404, path
        assert not env.state.jobs["b1"]["paused"]
        runs = (await call(c, "GET", "/v1/runs", tok))[1]["runs"]
        assert runs and {r["tenant"] for r in runs} == {"alpha"}
        b1_run = [r for r in env.state.runs if r.startswith("b1@")][0]
        assert (await call(c, "GET", f"/v1/runs/{b1_run}", tok))[0] == 404
        # Creating in another tenant, or replacing another tenant's job, is 403 naming it.
        s, e = await call(c, "PUT", "/v1/jobs/new", tok, body=dict(SPEC, tenant="beta"))
        assert s == 403 and e["error"]["tenant"] == "beta" and "beta" in e["error"]["message"]
        s, e = await call(c, "PUT", "/v1/jobs/new", tok, body=SPEC)  # tenant default
        assert s == 403 and e["error"]["tenant"] == "default"
        # Another tenant's name cannot be taken: 409, only for a request that would otherwise succeed.
        s, e = await call(c, "PUT", "/v1/jobs/b1", tok, body=dict(SPEC, tenant="alpha", queue="qa"))
        assert s == 409 and e["error"]["field"] == "name" and env.state.jobs["b1"]["spec"]["tenant"] == "beta"
        s, e = await call(c, "POST", "/v1/jobs:batch", tok, body={"jobs": {"x": dict(SPEC, tenant="alpha", queue="qa"),
                                                                            "y": dict(SPEC, tenant="beta")}})
        assert s == 403 and e["error"]["job"] == "y" and "x" not in env.state.jobs
        assert (await call(c, "PUT", "/v1/jobs/a3", tok, body=dict(SPEC, tenant="alpha", queue="qa")))[0] == 201
        assert (await call(c, "POST", "/v1/jobs:batch", tok,
                           body={"jobs": {"a4": dict(SPEC, tenant="alpha", queue="qa")}}))[0] == 200
        # A plan is held to its tenants as the batch is; a reader limited to them may ask it (a
        # drift check in CI with a token that may not write).
        reader = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        s, p = await call(c, "POST", "/v1/jobs:plan", reader, body={"jobs": {"a4": dict(SPEC, tenant="alpha",
                                                                                       queue="qa", timeout_s=5)}})
        assert s == 200 and p["dry_run"] is True and p["jobs"]["a4"]["action"] == "replace", p
        assert env.state.jobs["a4"]["spec"]["timeout_s"] != 5  # nothing changed
        s, e = await call(c, "POST", "/v1/jobs:plan", reader, body={"jobs": {"y": dict(SPEC, tenant="beta")}})
        assert s == 403 and e["error"]["job"] == "y", e
        s, e = await call(c, "POST", "/v1/jobs:plan", reader, body={"jobs": {"a4": SPEC}, "dry_run": False})
        assert s == 400 and e["error"]["field"] == "dry_run", e
        assert (await call(c, "POST", "/v1/jobs:batch", reader, body={"jobs": {"a4": SPEC}, "dry_run": True}))[0] == 403
        # A secret value in clear is refused to a reader's plan (a review: unchanged or its
        # fingerprint told it whether a guess was right); the redacted value a read shows is compared.
        with_secret = dict(SPEC, tenant="alpha", queue="qa", secrets={"API_KEY": "hunter2-hunter2"})
        assert (await call(c, "PUT", "/v1/jobs/a6", body=with_secret))[0] == 201
        s, e = await call(c, "POST", "/v1/jobs:plan", reader, body={"jobs": {"a6": with_secret}})
        assert s == 403 and e["error"]["field"] == "secrets.API_KEY" and e["error"]["job"] == "a6", e
        shown = (await call(c, "GET", "/v1/jobs/a6", reader))[1]["spec"]["secrets"]
        s, p = await call(c, "POST", "/v1/jobs:plan", reader, body={"jobs": {"a6": dict(with_secret, secrets=shown)}})
        assert s == 200 and p["jobs"]["a6"]["action"] == "unchanged", p
        s, p = await call(c, "POST", "/v1/jobs:plan", body={"jobs": {"a6": with_secret}})  # a writer's: compared
        assert s == 200 and p["jobs"]["a6"]["action"] == "unchanged", p
        # Queues: its tenants' (qa is alpha's now: a3 claimed it); one another tenant's jobs use is
        # neither listed nor changed, and a queue nobody uses becomes alpha's when it configures it.
        assert env.state.queue_owners["qa"] == ["alpha"]
        names = [q["name"] for q in (await call(c, "GET", "/v1/queues", tok))[1]["queues"]]
        assert names == ["qa"]
        assert (await call(c, "PUT", "/v1/queues/qa", tok, body={"max_depth": 7}))[0] == 200
        assert (await call(c, "PUT", "/v1/queues/shared", tok, body={"max_depth": 7}))[0] == 403
        s, b = await call(c, "PUT", "/v1/queues/nobody", tok, body={"max_depth": 7})
        assert s == 200 and b["tenants"] == ["alpha"]
        s, e = await call(c, "PUT", "/v1/queues/mine", tok, body={"tenants": ["beta"]})
        assert s == 403 and e["error"]["field"] == "tenants"
        # Rate limits: only its tenants' are listed; tokens are not for it at all.
        await call(c, "PUT", "/v1/tenants/alpha", body={"rate_per_s": 5})
        await call(c, "PUT", "/v1/tenants/beta", body={"rate_per_s": 5})
        assert [t["name"] for t in (await call(c, "GET", "/v1/tenants", tok))[1]["tenants"]] == ["alpha"]
        assert (await call(c, "GET", "/v1/tokens", tok))[0] == 403
    run(t)


def test_a_limited_token_sees_only_its_tenants_dead_runs():
    async def t(env, c):
        await _seed(c)
        for _rid in list(env.state.runs):  # both manual runs fail for good
            env.state.apply_bytes(commands.encode(commands.make("acquire", env.clock.now_ms(), None, worker="w",
                                                                queues=None, max=10, ttl=10_000, types=None)))
        for rid, r in list(env.state.runs.items()):
            env.state.apply_bytes(commands.encode(commands.make("complete", env.clock.now_ms(), None, run=rid,
                                                                token=r["fencing_token"], success=False,
                                                                error="no", output="")))
        assert {r["state"] for r in env.state.runs.values()} == {"dead"}
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        dead = (await call(c, "GET", "/v1/dlq", tok))[1]
        assert [r["job"] for r in dead["runs"]] == ["a1"] and dead["total"] == 1
        b1_run = [r for r in env.state.runs if r.startswith("b1@")][0]
        for method, path in (("GET", f"/v1/dlq/{b1_run}"), ("POST", f"/v1/dlq/{b1_run}/requeue"),
                             ("DELETE", f"/v1/dlq/{b1_run}")):
            assert (await call(c, method, path, tok))[0] == 404
        assert env.state.runs[b1_run]["state"] == "dead"
        a1_run = [r for r in env.state.runs if r.startswith("a1@")][0]
        assert (await call(c, "POST", f"/v1/dlq/{a1_run}/requeue", tok))[0] == 200
    run(t)


def test_a_limited_token_cancels_only_its_tenants_runs_and_a_reader_none():
    async def t(env, c):
        await _seed(c)  # a1 (alpha) and b1 (beta) each have a queued manual run
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        reader = (await new_token(c, "reader"))["token"]
        b1_run = [r for r in env.state.runs if r.startswith("b1@")][0]
        a1_run = [r for r in env.state.runs if r.startswith("a1@")][0]
        s, e = await call(c, "POST", f"/v1/runs/{b1_run}/cancel", tok)
        assert s == 404 and e["error"]["field"] == "run"  # another tenant's run does not exist for it
        assert (await call(c, "POST", f"/v1/runs/{a1_run}/cancel", reader))[0] == 403
        assert {r["state"] for r in env.state.runs.values()} == {"queued"}
        s, b = await call(c, "POST", f"/v1/runs/{a1_run}/cancel", tok, body={"reason": "wrong input"})
        assert s == 200 and b == {"run": a1_run, "state": "skipped", "was": "queued"}, b
        run_ = env.state.runs[a1_run]
        assert run_["error"] == "cancelled by request: wrong input", run_["error"]
        assert tok.split("_")[1] not in json.dumps(await call(c, "GET", f"/v1/runs/{a1_run}", reader))
        assert env.state.runs[b1_run]["state"] == "queued"
        s, e = await call(c, "POST", f"/v1/runs/{a1_run}/cancel", tok)  # once ended, a 409 says how
        assert s == 409 and e["error"]["state"] == "skipped" and e["error"]["field"] == "run"
        s, e = await call(c, "POST", f"/v1/runs/{b1_run}/cancel", body={"reason": "x" * 257})
        assert s == 422 and e["error"]["field"] == "reason"
        s, e = await call(c, "POST", f"/v1/runs/{b1_run}/cancel", body={"why": "x"})
        assert s == 422 and e["error"]["field"] == "why"
        for bad in ("a\nb", "a\x85b", "a\x7fb", "disk full\u202e!kcab", "a\u2028b", "a\u2066b"):
            # (a walk: NEL, a C1 control, was taken; a direction override reorders what is shown)
            s, e = await call(c, "POST", f"/v1/runs/{b1_run}/cancel", body={"reason": bad})
            assert s == 422 and e["error"]["field"] == "reason", bad
        assert env.state.runs[b1_run]["state"] == "queued"
        # A job's runs at once: another tenant's job does not exist for it, a reader may not, and
        # a bad body changes nothing.
        s, e = await call(c, "POST", "/v1/jobs/b1/cancel", tok)
        assert s == 404 and e["error"]["field"] == "name", e
        assert (await call(c, "POST", "/v1/jobs/a1/cancel", reader))[0] == 403
        for body, field in (({"running": "yes"}, "running"), ({"reason": ""}, "reason"), ({"all": True}, "all")):
            s, e = await call(c, "POST", "/v1/jobs/b1/cancel", body=body)
            assert s == 422 and e["error"]["field"] == field, (body, e)
        assert env.state.runs[b1_run]["state"] == "queued"
        s, b = await call(c, "POST", "/v1/jobs/b1/cancel", body={"reason": "backlog"})
        assert s == 200 and b == {"job": "b1", "cancelled": 1, "runs": [b1_run], "passed": [], "more": False}, b
        assert env.state.runs[b1_run]["error"] == "cancelled by request: backlog"
    run(t)


def test_a_limited_token_sees_the_recorded_slots_of_its_jobs():
    async def t(env, c):
        await call(c, "PUT", "/v1/jobs/r", body=dict(SPEC, tenant="alpha", misfire={"policy": "skip", "grace_s": 0},
                                                     schedule={"every_s": 5}))
        env.clock.advance(60_000)
        await env.trigger.tick()
        rec = [rid for rid, r in env.state.runs.items() if r["state"] == "skipped"]
        assert rec, "the missed slots were recorded"
        tok = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        assert (await call(c, "GET", f"/v1/runs/{rec[0]}", tok))[0] == 200
        assert rec[0] in [r["id"] for r in (await call(c, "GET", "/v1/runs", tok))[1]["runs"]]
        other = (await new_token(c, "reader", tenants=["beta"]))["token"]
        assert (await call(c, "GET", f"/v1/runs/{rec[0]}", other))[0] == 404
    run(t)


def test_a_request_the_http_parser_refuses_is_logged_without_its_token(caplog):
    import logging

    from aiohttp.http_exceptions import BadHttpMessage

    from raftsched.node.audit import install_log_redaction
    install_log_redaction()
    install_log_redaction()  # once only
    assert sum(type(f).__name__ == "RedactBadRequests" for f in logging.getLogger("aiohttp.server").filters) == 1
    try:
        raise BadHttpMessage(f"Invalid header value char:\n\n    b'Authorization: Bearer {BOOT}\\x00'")
    except BadHttpMessage as e:
        exc = e
    with caplog.at_level(logging.INFO, logger="aiohttp.server"):
        logging.getLogger("aiohttp.server").error("Error handling request from %s", "10.0.0.1", exc_info=exc)
    text = caplog.text
    assert "Error handling request from 10.0.0.1: BadHttpMessage 400" in text and BOOT not in text
    assert [r.levelname for r in caplog.records] == ["INFO"], "a client's malformed request is not the node's error"


def test_metrics_need_a_read_token_unless_the_node_opens_them():
    async def t(env, c):
        assert (await call(c, "GET", "/metrics", None))[0] == 401
        assert (await call(c, "GET", "/metrics", (await new_token(c, "worker"))["token"]))[0] == 403
        env.auth.metrics_open = True
        s, b = await call(c, "GET", "/metrics", None)
        assert s == 404 and b["error"]["message"] == "metrics are not enabled on this node", "open: no token asked"
        assert (await call(c, "GET", "/v1/jobs", None))[0] == 401, "only /metrics is opened"
    run(t)


def test_a_limited_tokens_run_list_is_the_same_view_as_everyone_elses():
    """Tenant-limited reads go through the same handlers, filtered: a queued run no worker may
    take shows ``waiting_for`` to a token limited to its tenant too (it was dropped when the
    limited list was a copy of the handler)."""
    async def t(env, c):
        spec = dict(SPEC, tenant="alpha", placement={"labels": {"pool": "nowhere"}})
        assert (await call(c, "PUT", "/v1/jobs/p", body=spec))[0] == 201
        assert (await call(c, "POST", "/v1/jobs/p/trigger"))[0] == 201
        tok = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        everyone = [r for r in (await call(c, "GET", "/v1/runs"))[1]["runs"] if r["job"] == "p"]
        limited = (await call(c, "GET", "/v1/runs", tok))[1]["runs"]
        assert everyone and everyone[0]["waiting_for"] == "no worker matches its placement"
        assert limited == everyone
    run(t)


# ------------------------------------------------------------------ tenant policies (issue 22)
HTTP = {"schedule": {"every_s": 10}, "executor": {"type": "http", "url": "https://example.com/hook"},
        "misfire": {"policy": "skip"}}


def _acquire(env, worker="w"):
    return env.state.apply_bytes(commands.encode(commands.make(
        "acquire", env.clock.now_ms(), None, worker=worker, queues=None, max=10, ttl=10_000, types=None)))


def test_a_limited_token_is_held_to_its_tenants_policy():
    """Closed by default: a token limited to tenants writes only http jobs until an admin allows
    more; an admin's policy names the executor types and the placement labels a tenant's jobs
    must have, and holds every writer; a token without tenants keeps its rights elsewhere."""
    async def t(env, c):
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        s, e = await call(c, "PUT", "/v1/jobs/sh", tok, body=dict(SPEC, tenant="alpha", queue="qa"))
        assert s == 403 and e["error"]["field"] == "executor.type" and "shell" in e["error"]["message"]
        s, e = await call(c, "POST", "/v1/jobs:batch", tok, body={"jobs": {"sh": dict(SPEC, tenant="alpha", queue="qa")}})
        assert s == 403 and e["error"]["field"] == "executor.type" and e["error"]["job"] == "sh"
        assert "sh" not in env.state.jobs
        s, b = await call(c, "PUT", "/v1/jobs/h", tok, body=dict(HTTP, tenant="alpha", queue="qa"))
        assert s == 201, b
        s, b = await call(c, "GET", "/v1/jobs/h", tok)
        assert b["limited"] is True and "limited" not in b["spec"], "the mark is shown beside the spec"
        # Unlimited writers keep today's rights in a tenant without a policy.
        assert (await call(c, "PUT", "/v1/jobs/adm", body=dict(SPEC, tenant="alpha", queue="qa")))[0] == 201
        # An admin's policy: shell allowed, on alpha's own workers only.
        s, b = await call(c, "PUT", "/v1/tenants/alpha", tok, body={"executors": ["shell"]})
        assert s == 403, "a policy is an admin's"
        pol = {"executors": ["shell", "http"], "placement": {"labels": {"tenant": "alpha"}},
               "network": {"allow": ["10.1.2.0/24"]}}
        s, b = await call(c, "PUT", "/v1/tenants/alpha", body=pol)
        assert s == 200 and b["policy"] == {"executors": ["http", "shell"], "placement": {"labels": {"tenant": "alpha"}},
                                            "network": {"allow": ["10.1.2.0/24"]}}, b
        s, e = await call(c, "PUT", "/v1/jobs/sh", tok, body=dict(SPEC, tenant="alpha", queue="qa"))
        assert s == 403 and e["error"]["field"] == "placement.labels" and "tenant=alpha" in e["error"]["message"]
        s, e = await call(c, "PUT", "/v1/jobs/sh2", body=dict(SPEC, tenant="alpha", queue="qa"))
        assert s == 403 and e["error"]["field"] == "placement.labels", "an admin's policy holds every writer"
        placed = dict(SPEC, tenant="alpha", queue="qa", placement={"labels": {"tenant": "alpha", "pool": "x"}})
        assert (await call(c, "PUT", "/v1/jobs/sh", tok, body=placed))[0] == 201
        # Read by the tenant's operators (with the policy its limited tokens' jobs are held to), and
        # not by another tenant's: 404, as for a tenant nobody configured... for it.
        s, b = await call(c, "GET", "/v1/tenants/alpha", tok)
        assert s == 200 and b["policy"]["executors"] == ["http", "shell"] and b["effective_policy"] == b["policy"]
        other = (await new_token(c, "reader", tenants=["beta"]))["token"]
        assert (await call(c, "GET", "/v1/tenants/alpha", other))[0] == 404
        s, b = await call(c, "GET", "/v1/tenants/beta", other)
        assert s == 200 and b["policy"] is None and b["effective_policy"]["executors"] == ["http"]
        assert b["effective_policy"]["network"] == {"allow": []}
        # Validation names the field and changes nothing.
        for body, field in (({"executors": ["bash"]}, "executors[0]"), ({"executors": "shell"}, "executors"),
                            ({"network": {"allow": ["10.0.0.1/8"]}}, "network.allow[0]"),
                            ({"network": {"deny": []}}, "network.deny"), ({"placement": {}}, "placement.labels"),
                            ({"placement": {"labels": {"a b": "c"}}}, "placement.labels.a b"), ({}, "rate_per_s"),
                            ({"burst": 3}, "rate_per_s"), ({"executors": ["http", "http"]}, "executors")):
            before = env.state.state_hash()
            s, e = await call(c, "PUT", "/v1/tenants/alpha", body=body)
            assert s == 422 and e["error"]["field"] == field, (body, e)
            assert env.state.state_hash() == before
        # A rate limit alone leaves the policy as it is; DELETE removes both.
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"rate_per_s": 2}))[0] == 200
        assert env.state.tenant_policies["alpha"]["executors"] == ["http", "shell"]
        s, b = await call(c, "DELETE", "/v1/tenants/alpha")
        assert s == 200 and "alpha" not in env.state.tenant_policies and "alpha" not in env.state.tenants
    run(t)


def test_a_narrowed_policy_refuses_the_runs_of_jobs_written_before_it():
    """A job written while its tenant's policy allowed it is not run once the policy no longer
    does: its run is recorded skipped, reason policy, with the rule it broke."""
    async def t(env, c):
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["shell", "http"]}))[0] == 200
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        assert (await call(c, "PUT", "/v1/jobs/sh", tok, body=dict(SPEC, tenant="alpha", queue="qa")))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/adm", body=dict(SPEC, tenant="beta", queue="qb")))[0] == 201
        # Narrowed by a new policy, then (another way) by deleting it: the job a limited token wrote
        # falls back to the default policy, http only.
        for narrow in ({"executors": ["http"]}, None):
            if narrow is not None:
                assert (await call(c, "PUT", "/v1/tenants/alpha", body=narrow))[0] == 200
            else:
                assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["shell", "http"]}))[0] == 200
                assert (await call(c, "DELETE", "/v1/tenants/alpha"))[0] == 200
            s, b = await call(c, "POST", "/v1/jobs/sh/trigger", tok)
            assert s == 201, b
            s, b2 = await call(c, "POST", "/v1/jobs/adm/trigger")
            res = _acquire(env)
            assert [g["id"] for g in res["runs"]] == [b2["run"]] and res["refused"] == 1, res
            s, r = await call(c, "GET", f"/v1/runs/{b['run']}", tok)
            assert r["state"] == "skipped" and r["reason"] == "policy", r
            assert "does not allow executor type 'shell'" in r["error"]
    run(t)


def test_a_limited_tokens_http_runs_carry_its_network_policy():
    """The grant of an http run a policy holds says where it may connect (the worker checks it:
    tests/test_executors_http.py); a job no policy holds carries nothing."""
    async def t(env, c):
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        assert (await call(c, "PUT", "/v1/jobs/h", tok, body=dict(HTTP, tenant="alpha", queue="qa")))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/adm", body=HTTP))[0] == 201
        for job in ("h", "adm"):
            assert (await call(c, "POST", f"/v1/jobs/{job}/trigger"))[0] == 201
        grants = {g["job"]: g for g in _acquire(env)["runs"]}
        assert grants["h"]["network"] == {"allow": [], "tenant": "alpha"} and "network" not in grants["adm"]
        await call(c, "PUT", "/v1/tenants/alpha", body={"network": {"allow": ["192.168.0.0/16", "127.0.0.1"]}})
        assert (await call(c, "POST", "/v1/jobs/h/trigger"))[0] == 201
        g = _acquire(env)["runs"][0]
        assert g["network"] == {"allow": ["127.0.0.1/32", "192.168.0.0/16"], "tenant": "alpha"}
    run(t)


def test_framing_headers_are_refused_naming_the_header():
    async def t(env, c):
        for headers in ({"Host": "internal"}, {"content-length": "0"}, {"Transfer-Encoding": "chunked"},
                        {"CONNECTION": "close"}):
            name = next(iter(headers))
            s, e = await call(c, "PUT", "/v1/jobs/h", body=dict(HTTP, executor=dict(HTTP["executor"], headers=headers)))
            assert s == 422 and e["error"]["field"] == f"executor.headers.{name}", e
        s, e = await call(c, "PUT", "/v1/jobs/h", body=dict(HTTP, secrets={"Host": "internal"}))
        assert s == 422 and e["error"]["field"] == "secrets.Host", "an http job's secrets are headers"
        assert (await call(c, "PUT", "/v1/jobs/s", body=dict(SPEC, secrets={"Host": "x"})))[0] == 201, "env for shell"
        assert "h" not in env.state.jobs
    run(t)


def test_a_job_moved_to_another_tenant_keeps_its_runs_in_the_old_one():
    """Hole 3: a run belongs to the tenant its job had when the run was made, everywhere: the
    job's run list, a run by id, the run list; recorded slots too."""
    async def t(env, c):
        await call(c, "PUT", "/v1/jobs/m", body=dict(SPEC, tenant="alpha", misfire={"policy": "skip", "grace_s": 0},
                                                     schedule={"every_s": 5}))
        env.clock.advance(60_000)
        await env.trigger.tick()
        old = set(env.state.runs)
        assert any(r["state"] == "skipped" for r in env.state.runs.values()), "recorded slots"
        s, b = await call(c, "POST", "/v1/jobs/m/trigger")
        old.add(b["run"])
        assert (await call(c, "PUT", "/v1/jobs/m", body=dict(SPEC, tenant="beta", schedule={"every_s": 5})))[0] == 200
        s, b = await call(c, "POST", "/v1/jobs/m/trigger")
        new = b["run"]
        alpha = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        beta = (await new_token(c, "reader", tenants=["beta"]))["token"]
        s, b = await call(c, "GET", "/v1/jobs/m/runs", beta)
        assert s == 200 and [r["id"] for r in b["runs"]] == [new], "none of alpha's runs"
        for rid in old:
            assert (await call(c, "GET", f"/v1/runs/{rid}", beta))[0] == 404
            s, r = await call(c, "GET", f"/v1/runs/{rid}", alpha)
            assert s == 200 and r["tenant"] == "alpha"
        assert {r["id"] for r in (await call(c, "GET", "/v1/runs", beta))[1]["runs"]} == {new}
        assert {r["id"] for r in (await call(c, "GET", "/v1/runs", alpha))[1]["runs"]} == old
        assert (await call(c, "GET", "/v1/jobs/m/runs", alpha))[0] == 404, "the job is beta's"
        s, b = await call(c, "GET", "/v1/jobs/m/runs")
        assert {r["id"] for r in b["runs"]} == old | {new}, "an unlimited token sees the whole history"
    run(t)


def test_a_limited_tokens_answers_do_not_depend_on_other_tenants_jobs():
    """Hole 4: a PUT that cannot succeed answers the same whether the name is another tenant's
    or nobody's; only a PUT that would succeed on a free name learns the name is taken (409)."""
    async def t(env, c):
        await call(c, "PUT", "/v1/jobs/taken", body=dict(HTTP, tenant="beta", queue="qb",
                                                        secrets={"TOKEN": "beta-secret-value"}))
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        redacted = (await call(c, "GET", "/v1/jobs/taken"))[1]["spec"]["secrets"]["TOKEN"]
        probes = [
            dict(HTTP, tenant="alpha", queue="qa", timeout_s=0),               # invalid: 422
            dict(HTTP, tenant="beta"),                                          # another tenant: 403
            dict(SPEC, tenant="alpha", queue="qa"),                             # its policy: 403
            dict(HTTP, tenant="alpha", queue="qa", secrets={"TOKEN": redacted}),  # a redacted value: 422
        ]
        for body in probes:
            for path in ("/v1/jobs/taken", "/v1/jobs/free"):
                before = env.state.state_hash()
                answers = set()
                for p in (path, "/v1/jobs/free" if path == "/v1/jobs/taken" else "/v1/jobs/taken"):
                    s, e = await call(c, "PUT", p, tok, body=body)
                    answers.add((s, e["error"]["code"], e["error"]["field"],
                                 e["error"]["message"].replace("'taken'", "'free'")))
                assert len(answers) == 1, (body, answers)
                assert env.state.state_hash() == before
            s, e = await call(c, "POST", "/v1/jobs:batch", tok, body={"jobs": {"taken": body}})
            s2, e2 = await call(c, "POST", "/v1/jobs:batch", tok, body={"jobs": {"free": body}})
            assert (s, e["error"]["field"]) == (s2, e2["error"]["field"]), (body, e, e2)
        s, e = await call(c, "PUT", "/v1/jobs/taken", tok, body=dict(HTTP, tenant="alpha", queue="qa"))
        assert s == 409 and e["error"]["field"] == "name" and "beta" not in json.dumps(e)
        assert env.state.jobs["taken"]["spec"]["tenant"] == "beta"
    run(t)


def test_idempotency_keys_belong_to_the_token_that_sent_them():
    """Hole 5: another token's key neither replays its answer nor conflicts with it, and no
    answer names what another token used a key for."""
    async def t(env, c):
        alpha = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        beta = (await new_token(c, "operator", tenants=["beta"]))["token"]
        key = {"Idempotency-Key": "k-1"}
        s, b = await call(c, "PUT", "/v1/jobs/b-secret", beta, body=dict(HTTP, tenant="beta", queue="qb"), headers=key)
        assert s == 201, b
        s, b = await call(c, "POST", "/v1/jobs/b-secret/pause", beta, headers=key)
        assert s == 409 and "put_job:b-secret" in b["error"]["message"], "its own key, its own request"
        s, b = await call(c, "PUT", "/v1/jobs/a-job", alpha, body=dict(HTTP, tenant="alpha", queue="qa"), headers=key)
        assert s == 201 and "duplicate" not in b, b
        s, b = await call(c, "PUT", "/v1/jobs/a-job", alpha, body=dict(HTTP, tenant="alpha", queue="qa"), headers=key)
        assert s == 201 and b["duplicate"] is True, "a retry of its own request is one"
        s, b = await call(c, "POST", "/v1/jobs/a-job/trigger", alpha, headers=key)
        assert s == 409 and "b-secret" not in json.dumps(b)
        # The same for a batch, whose commands' ids are derived from the key.
        s, b = await call(c, "POST", "/v1/jobs:batch", beta, body={"jobs": {"b2": dict(HTTP, tenant="beta", queue="qb")}},
                          headers={"Idempotency-Key": "batch-1"})
        assert s == 200 and b["created"] == 1
        s, b = await call(c, "POST", "/v1/jobs:batch", alpha, body={"jobs": {"a2": dict(HTTP, tenant="alpha", queue="qa")}},
                          headers={"Idempotency-Key": "batch-1"})
        assert s == 200 and b["created"] == 1 and "duplicate" not in b, b
    run(t)


def test_a_tenants_queue_is_its_own():
    """Hole 6: a queue belongs to a tenant (claimed by its first limited write, or given by an
    admin, who may share it); another tenant can neither put jobs in it, nor see its counts, and
    the owner keeps configuring it."""
    async def t(env, c):
        alpha = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        beta = (await new_token(c, "operator", tenants=["beta"]))["token"]
        assert (await call(c, "PUT", "/v1/jobs/a1", alpha, body=dict(HTTP, tenant="alpha", queue="qa")))[0] == 201
        assert env.state.queue_owners == {"qa": ["alpha"]}
        s, e = await call(c, "PUT", "/v1/jobs/b1", beta, body=dict(HTTP, tenant="beta", queue="qa"))
        assert s == 403 and e["error"]["field"] == "queue", e
        s, e = await call(c, "POST", "/v1/jobs:batch", beta, body={"jobs": {"b1": dict(HTTP, tenant="beta", queue="qa")}})
        assert s == 403 and e["error"]["field"] == "queue"
        assert (await call(c, "PUT", "/v1/queues/qa", beta, body={"max_depth": 1}))[0] == 403
        assert (await call(c, "POST", "/v1/jobs/a1/trigger", alpha))[0] == 201
        assert "qa" not in [q["name"] for q in (await call(c, "GET", "/v1/queues", beta))[1]["queues"]]
        s, b = await call(c, "PUT", "/v1/queues/qa", alpha, body={"max_depth": 5})
        assert s == 200 and b["tenants"] == ["alpha"]
        qa = [q for q in (await call(c, "GET", "/v1/queues", alpha))[1]["queues"] if q["name"] == "qa"][0]
        assert qa["depth"] == 1 and qa["tenants"] == ["alpha"]
        # The default queue is no one's to take once two tenants' jobs use it...
        assert (await call(c, "PUT", "/v1/jobs/d", body=dict(HTTP, tenant="beta")))[0] == 201
        s, e = await call(c, "PUT", "/v1/jobs/a2", alpha, body=dict(HTTP, tenant="alpha"))
        assert s == 403 and e["error"]["field"] == "queue"
        # ... until an admin shares it.
        s, b = await call(c, "PUT", "/v1/queues/default", body={"tenants": ["alpha", "beta"]})
        assert s == 200 and b["tenants"] == ["alpha", "beta"]
        assert (await call(c, "PUT", "/v1/jobs/a2", alpha, body=dict(HTTP, tenant="alpha")))[0] == 201
        assert (await call(c, "PUT", "/v1/queues/default", alpha, body={"max_depth": 3}))[0] == 403, "shared: an admin's"
        assert (await call(c, "PUT", "/v1/queues/default", body={"tenants": None}))[1]["tenants"] is None
        assert "default" not in env.state.queue_owners
    run(t)


def test_a_tenant_put_whose_policy_is_refused_changes_nothing(monkeypatch):
    """A body with a rate and a policy is two commands. The policy is the one a valid body can
    still have refused (a new policy past the cluster's limit): it goes first, so a refused
    request leaves the tenant's rate as it was too."""
    from raftsched.core import limits
    async def t(env, c):
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http"]}))[0] == 200
        monkeypatch.setattr(limits, "tenant_policies_max", 1)
        routes = [{"on": ["run.dead"], "sink": "nowhere"}]
        s, e = await call(c, "PUT", "/v1/tenants/beta", body={"rate_per_s": 5, "executors": ["http"],
                                                              "notify": routes})
        assert 400 <= s < 500 and e["error"]["code"] == "limit_exceeded", (s, e)
        st = env.state
        assert "beta" not in st.tenants and "beta" not in st.tenant_policies and "beta" not in st.tenant_notify
        s, b = await call(c, "PUT", "/v1/tenants/alpha", body={"rate_per_s": 5, "executors": ["http", "shell"]})
        assert s == 200 and b["rate_per_s"] == 5 and b["policy"]["executors"] == ["http", "shell"], b
    run(t)


def test_a_tenant_put_reusing_a_key_for_other_parts_is_refused_whole():
    """A tenant PUT is up to three commands, each under an id derived from the key. A key
    reused with a body of other parts used to apply the parts its ids did not know yet, then
    answer 409 (a policy widened by a refused request), or answer "duplicate" for routes it did
    not store. Every part's id is looked up first: the request is refused whole."""
    async def t(env, c):
        k = {"Idempotency-Key": "tenant-k"}
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http"]}, headers=k))[0] == 200
        s, e = await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http", "shell"], "rate_per_s": 5},
                          headers=k)
        assert s == 409 and e["error"]["field"] == "Idempotency-Key", e
        assert env.state.tenant_policies["alpha"]["executors"] == ["http"] and "alpha" not in env.state.tenants
        k = {"Idempotency-Key": "tenant-n"}
        r1, r2 = [{"sink": "a"}], [{"sink": "b"}]
        assert (await call(c, "PUT", "/v1/tenants/beta", body={"notify": r1}, headers=k))[0] == 200
        s, e = await call(c, "PUT", "/v1/tenants/beta", body={"notify": r2, "rate_per_s": 2}, headers=k)
        assert s == 409, e
        assert env.state.tenant_notify["beta"][0]["sink"] == "a" and "beta" not in env.state.tenants
        # The same body again is a retry: every part answered from the first time.
        k = {"Idempotency-Key": "tenant-r"}
        body = {"notify": r2, "rate_per_s": 2, "executors": ["http"]}
        s, b1 = await call(c, "PUT", "/v1/tenants/gamma", body=body, headers=k)
        s2, b2 = await call(c, "PUT", "/v1/tenants/gamma", body=body, headers=k)
        assert s == s2 == 200 and b2.pop("duplicate") is True and b1 == b2, (b1, b2)
    run(t)


def test_a_retried_delete_that_applied_answers_duplicate_for_a_limited_token_too():
    """A delete retried with its key after it applied (a lost answer) answers as the first did.
    A token limited to tenants got a 404 from the tenancy check (the job was gone), and every
    token from the sink route's own look-up. A remembered key opens nothing else: it passes the
    check only as a delete of the very job it deleted, so another tenant's job stays 404, to a
    GET and to a DELETE under that key alike (which were checked as the key's own delete, and
    answered 409 only because its replay told the targets apart)."""
    async def t(env, c):
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        assert (await call(c, "PUT", "/v1/jobs/j1", tok, body=dict(HTTP, tenant="alpha", queue="qa")))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/other", body=dict(HTTP, tenant="beta", queue="qb")))[0] == 201
        k = {"Idempotency-Key": "del-1"}
        assert await call(c, "DELETE", "/v1/jobs/j1", tok, headers=k) == (200, {"job": "j1", "deleted": True})
        assert await call(c, "DELETE", "/v1/jobs/j1", tok, headers=k) == \
            (200, {"job": "j1", "deleted": True, "duplicate": True})
        assert (await call(c, "GET", "/v1/jobs/other", tok, headers=k))[0] == 404
        s, e = await call(c, "DELETE", "/v1/jobs/other", tok, headers=k)
        assert s == 404 and "other" in env.state.jobs, e
        assert (await call(c, "DELETE", "/v1/jobs/other", tok, headers={"Idempotency-Key": "new"}))[0] == 404
        sink = {"type": "webhook", "url": "https://example.com/hook", "secrets": {"signing_key": "s" * 32}}
        assert (await call(c, "PUT", "/v1/sinks/ops", body=sink))[0] in (200, 201)
        k = {"Idempotency-Key": "del-sink"}
        assert (await call(c, "DELETE", "/v1/sinks/ops", headers=k))[0] == 200
        assert await call(c, "DELETE", "/v1/sinks/ops", headers=k) == \
            (200, {"sink": "ops", "deleted": True, "duplicate": True})
        # The limited token's key of its own sink's delete does not pass it to the admin's sink.
        assert (await call(c, "PUT", "/v1/sinks/mine", body=dict(sink, tenant="alpha")))[0] == 201
        assert (await call(c, "PUT", "/v1/sinks/pager", body=sink))[0] == 201
        k = {"Idempotency-Key": "del-mine"}
        assert (await call(c, "DELETE", "/v1/sinks/mine", tok, headers=k))[0] == 200
        s, e = await call(c, "DELETE", "/v1/sinks/pager", tok, headers=k)
        assert s == 404 and "pager" in env.state.sinks, e
    run(t)


def test_a_limited_token_learns_no_other_tenants_job_from_a_backfill():
    """A dry-run backfill with cascade lists the children the job's graph shows this token (its
    tenants' jobs only); a backfill id another tenant's backfill holds is refused without naming
    that backfill's job."""
    async def t(env, c):
        hook = {"executor": {"type": "http", "url": "https://example.com/"}}
        parent = dict(hook, schedule={"every_s": 60}, misfire={"policy": "skip"}, tenant="alpha", queue="qa")
        assert (await call(c, "PUT", "/v1/jobs/a-parent", body=parent))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/a-child", body=dict(hook, after=[{"job": "a-parent"}],
                                                                   tenant="alpha", queue="qa")))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/beta-secret-child", body=dict(hook, after=[{"job": "a-parent"}],
                                                                            tenant="beta", queue="qb")))[0] == 201
        assert (await call(c, "PUT", "/v1/jobs/beta-payroll", body=dict(parent, tenant="beta", queue="qb")))[0] == 201
        env.clock.advance(3_600_000)
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        rng = {"from": schedule.iso(env.clock.now_ms() - 600_000), "to": schedule.iso(env.clock.now_ms() - 300_000)}
        s, b = await call(c, "POST", "/v1/jobs/a-parent/backfills", tok, body=dict(rng, dry_run=True, cascade="children"))
        assert s == 200 and b["cascade"]["children"] == ["a-child"], b
        assert all("beta" not in e["to"] for e in b["cascade"]["edges"]), b
        s, b = await call(c, "POST", "/v1/jobs/beta-payroll/backfills", body=dict(rng, id="nightly"))
        assert s == 201, b
        s, e = await call(c, "POST", "/v1/jobs/a-parent/backfills", tok, body=dict(rng, id="nightly"))
        assert s == 409 and e["error"]["field"] == "id" and "beta" not in e["error"]["message"], e
    run(t)


def test_a_lone_surrogate_in_a_body_is_refused_naming_its_field():
    """JSON may hold a UTF-16 surrogate alone ("\\ud800"), which is no text: it could not be
    stored, signed or sent on (a sink's key holding one was stored, and every delivery failed).
    Every body is refused 422 naming the field; a pair is one character and is taken."""
    async def t(env, c):
        sink = {"type": "webhook", "url": "https://example.com/hook", "secrets": {"signing_key": "s" * 31 + "\ud800"}}
        s, e = await call(c, "PUT", "/v1/sinks/s", body=sink)
        assert s == 422 and e["error"]["field"] == "secrets.signing_key", e
        assert "s" not in env.state.sinks
        s, e = await call(c, "PUT", "/v1/jobs/j", body=dict(SPEC, payload={"k": ["x", "\udc00"]}))
        assert s == 422 and e["error"]["field"] == "payload.k[1]", e
        s, e = await call(c, "PUT", "/v1/jobs/j", body=dict(SPEC, payload={"\ud800k": 1}))
        assert s == 422 and e["error"]["field"] == "payload.\\ud800k", e
        s, b = await call(c, "PUT", "/v1/jobs/j", body=dict(SPEC, payload={"k": "\U0001f600"}))
        assert s == 201 and env.state.jobs["j"]["spec"]["payload"] == {"k": "\U0001f600"}, b
    run(t)


_HOOK = {"executor": {"type": "http", "url": "https://example.com/"}, "retry": {"max_attempts": 1}}
_EVERY_MIN = dict(_HOOK, schedule={"every_s": 60}, misfire={"policy": "skip", "grace_s": 300})


def _do(env, kind, **kw):
    return env.state.apply_bytes(commands.encode(commands.make(kind, env.clock.now_ms(), None, **kw)))


def _fail_running(env, error="boom"):
    _do(env, "acquire", worker="w", queues=None, max=50, ttl=10_000, types=None)
    for rid, r in list(env.state.runs.items()):
        if r["state"] == "running":
            _do(env, "complete", run=rid, token=r["fencing_token"], success=False, error=error, output="")


def test_a_job_moved_between_tenants_shows_its_new_tenant_none_of_the_old_ones_runs():
    """Its old runs stay the old tenant's (docs/security.md): a limited token of the new tenant
    does not get one through explain, nor as the job's last run or health incident."""
    async def t(env, c):
        assert (await call(c, "PUT", "/v1/jobs/m", body=dict(_EVERY_MIN, tenant="beta", queue="qb")))[0] == 201
        env.clock.advance(61_000)
        await env.trigger.tick()
        (rid,) = [k for k in env.state.runs if k.startswith("m@")]
        _fail_running(env, "beta db password rejected: hunter2")
        assert env.state.runs[rid]["state"] == "dead"
        assert (await call(c, "PUT", "/v1/jobs/m", body=dict(_EVERY_MIN, tenant="alpha", queue="qa")))[0] == 200
        alpha = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        slot = schedule.iso(env.state.runs[rid]["slot"])
        s, b = await call(c, "POST", "/v1/jobs/m/explain", alpha, body={"slot": slot})
        assert s == 200 and b["run"] is None and b["deadline"] is None, b
        s, b = await call(c, "GET", "/v1/jobs/m", alpha)
        assert s == 200 and b["state"]["last_run"] is None and "hunter2" not in json.dumps(b), b
        s, b = await call(c, "GET", "/v1/jobs", alpha)
        assert [j["state"]["last_run"] for j in b["jobs"]] == [None]
        s, b = await call(c, "POST", "/v1/jobs/m/explain", body={"slot": slot})  # an admin sees it
        assert b["run"]["id"] == rid
    run(t)


def test_a_moved_jobs_trimmed_slot_shows_a_limited_token_no_deadline_of_the_old_tenant():
    """Once the old tenant's run of the slot is trimmed (history 1), its deadline record is left,
    naming that tenant: explain does not show it to a token of the new tenant (it did, the run
    being gone), nor does the listing."""
    async def t(env, c):
        beta = dict(_EVERY_MIN, tenant="beta", queue="qb", history=1, deadline={"succeed_within_s": 30})
        assert (await call(c, "PUT", "/v1/jobs/m", body=beta))[0] == 201
        env.clock.advance(61_000)
        await env.trigger.tick()
        (rid,) = [k for k in env.state.runs if k.startswith("m@")]
        slot = schedule.iso(env.state.runs[rid]["slot"])
        env.clock.advance(60_000)
        await env.trigger.tick()  # judged missed for beta (and the next slot fired)
        _do(env, "acquire", worker="w", queues=None, max=50, ttl=10_000, types=None)
        for k, r in list(env.state.runs.items()):  # late successes: finished, so the history may trim them
            if r["state"] == "running":
                _do(env, "complete", run=k, token=r["fencing_token"], success=True, error=None, output="")
        assert (await call(c, "PUT", "/v1/jobs/m", body=dict(beta, tenant="alpha", queue="qa")))[0] == 200
        env.clock.advance(60_000)
        await env.trigger.tick()
        assert rid not in env.state.runs  # trimmed: only its deadline record is left
        alpha = (await new_token(c, "reader", tenants=["alpha"]))["token"]
        s, b = await call(c, "POST", "/v1/jobs/m/explain", alpha, body={"slot": slot})
        assert s == 200 and b["run"] is None and b["deadline"] is None and "beta" not in json.dumps(b), b
        s, b = await call(c, "GET", "/v1/deadlines?job=m", alpha)
        assert s == 200 and rid not in json.dumps(b), b
        s, b = await call(c, "POST", "/v1/jobs/m/explain", body={"slot": slot})  # an admin sees it
        assert b["deadline"]["tenant"] == "beta", b
    run(t)


def test_a_pipeline_across_tenants_names_no_other_tenants_job_to_a_limited_token():
    """An admin may make a job run after another tenant's. A token limited to one of them is
    not told the other's job names: not in a delete's dependents, a cycle's path, nor the
    children slots a requeue re-armed."""
    async def t(env, c):
        for n, body in (("a-parent", dict(_EVERY_MIN, tenant="alpha", queue="qa")),
                        ("a-child", dict(_HOOK, after=["a-parent"], tenant="alpha", queue="qa")),
                        ("beta-secret-child", dict(_HOOK, after=["a-parent"], tenant="beta", queue="qb")),
                        ("a-grandchild", dict(_HOOK, after=["beta-secret-child"], tenant="alpha", queue="qa"))):
            s, b = await call(c, "PUT", f"/v1/jobs/{n}", body=body)
            assert s == 201, b
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        s, e = await call(c, "DELETE", "/v1/jobs/a-parent", tok)
        assert s == 409 and e["error"]["dependents"] == ["a-child"], e
        assert "beta" not in e["error"]["message"] and "1 of other tenants" in e["error"]["message"], e
        s, e = await call(c, "DELETE", "/v1/jobs/a-parent")  # an admin is told all of them
        assert s == 409 and e["error"]["dependents"] == ["a-child", "beta-secret-child"], e
        s, e = await call(c, "PUT", "/v1/jobs/a-parent", tok,
                          body=dict(_EVERY_MIN, after=["a-grandchild"], tenant="alpha", queue="qa"))
        assert s == 422 and "cycle" in e["error"]["message"] and "beta" not in e["error"]["message"], e
        env.clock.advance(61_000)
        await env.trigger.tick()
        _fail_running(env)
        (dead,) = [k for k in env.state.runs if k.startswith("a-parent@")]
        s, b = await call(c, "POST", f"/v1/dlq/{dead}/requeue", tok)
        assert s == 200 and all(not r.startswith("beta") for r in b.get("rearmed", [])), b
        assert sorted(r.rpartition("@")[0] for r in b["rearmed"]) == ["a-child", "a-grandchild"], b
        # The graph walks its tenants' jobs only: a-grandchild runs after a-parent through beta's
        # job, which it was listed upstream of with no edge; now left out, and counted.
        s, g = await call(c, "GET", "/v1/jobs/a-grandchild/graph", tok)
        assert s == 200 and (g["parents"], g["edges"], g["not_shown"]) == ([], [], 2), g
        assert [n["job"] for n in g["nodes"]] == ["a-grandchild"], g
        s, g = await call(c, "GET", "/v1/jobs/a-parent/graph", tok)
        assert (g["children"], g["not_shown"]) == (["a-child"], 2), g
        assert g["edges"] == [{"from": "a-parent", "to": "a-child", "on": "success"}], g
        s, g = await call(c, "GET", "/v1/jobs/a-parent/graph")  # an admin sees all of it
        assert g["children"] == ["a-child", "a-grandchild", "beta-secret-child"] and "not_shown" not in g, g
        # a parent deleted with force is shown as missing, not counted as hidden (a review)
        for n, body in (("a-gone", dict(_EVERY_MIN, tenant="alpha", queue="qa")),
                        ("a-orphan", dict(_HOOK, after=["a-gone"], tenant="alpha", queue="qa"))):
            assert (await call(c, "PUT", f"/v1/jobs/{n}", body=body))[0] == 201
        assert (await call(c, "DELETE", "/v1/jobs/a-gone?force=true"))[0] == 200
        s, g = await call(c, "GET", "/v1/jobs/a-orphan/graph", tok)
        assert s == 200 and g["parents"] == ["a-gone"] and "not_shown" not in g, g
        assert {n["job"]: n["kind"] for n in g["nodes"]}["a-gone"] == "missing", g
    run(t)


def test_a_refused_put_with_secrets_names_no_sealing_key(monkeypatch):
    """The first secret a cluster seals has a reseal name its key first. A PUT of a job (an
    unknown parent) or of a sink (past the cluster's sinks) refused after that reseal changed
    the state; they are refused before it."""
    async def t(env, c):
        assert (await call(c, "GET", "/v1/secrets"))[1]["key"] is None
        s, e = await call(c, "PUT", "/v1/jobs/child", body=dict(SPEC, secrets={"TOKEN": "hunter2"},
                                                                 after=[{"job": "no-such-parent"}]))
        assert s == 422 and e["error"]["field"] == "after[0].job", e
        monkeypatch.setattr(limits, "sinks_max", 0)
        sink = {"type": "webhook", "url": "https://example.com/hook", "secrets": {"signing_key": "s" * 32}}
        s, e = await call(c, "PUT", "/v1/sinks/ops", body=sink)
        assert s == 422 and e["error"]["code"] == "limit_exceeded", e
        assert (await call(c, "GET", "/v1/secrets"))[1]["key"] is None and env.state.jobs == {}
    run(t)


def test_a_limited_tokens_checks_wait_until_the_replica_holds_every_acknowledged_write():
    """A follower behind the leader judged a limited token's write by its older view: a job
    (or sink) an admin had just created looked free, and the token's PUT took it over. Now the
    node catches up first (one read barrier), as reads do: the token is told the name is taken
    (a sink's too: 409, as a job's)."""
    async def t(env, c):
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http", "shell"]}))[0] == 200
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        behind, since = env.state.snapshot(), len(env.raft.proposed)  # this replica, before the admin's writes
        assert (await call(c, "PUT", "/v1/jobs/pay", body=dict(SPEC, tenant="beta")))[0] == 201
        s, b = await call(c, "PUT", "/v1/sinks/pager",
                          body={"type": "webhook", "url": "http://127.0.0.1:9/hook", "secrets": {"signing_key": "k"}})
        assert s == 201, b
        held = list(env.raft.proposed[since:])
        env.state.restore(behind)
        waited = []

        async def catch_up():  # the barrier: this replica applies what the leader committed
            waited.append(True)
            while held:
                env.state.apply_bytes(held.pop(0))
        env.service.reads.wait = catch_up
        s, e = await call(c, "PUT", "/v1/jobs/pay", tok, body=dict(SPEC, tenant="alpha", queue="qa"))
        assert s == 409 and e["error"]["field"] == "name" and waited
        assert env.state.jobs["pay"]["spec"]["tenant"] == "beta"
        s, _ = await call(c, "PUT", "/v1/sinks/pager", tok,
                          body={"type": "webhook", "url": "http://127.0.0.1:9/mine", "tenant": "alpha",
                                "secrets": {"signing_key": "mine"}})
        assert s == 409 and env.state.sinks["pager"]["spec"].get("tenant") is None  # (taken, as a job's name)
    run(t)


def test_a_limited_token_explains_without_a_leader_and_its_writes_wait_for_one():
    """Explain reads this replica as it is (what an outage did, asked while there is no leader):
    a limited token's too, with no barrier before its checks; a write of that token waits for
    the barrier, which without a leader is a 503."""
    async def t(env, c):
        assert (await call(c, "PUT", "/v1/tenants/alpha", body={"executors": ["http", "shell"]}))[0] == 200
        tok = (await new_token(c, "operator", tenants=["alpha"]))["token"]
        assert (await call(c, "PUT", "/v1/jobs/a1", body=dict(SPEC, tenant="alpha", queue="qa")))[0] == 201

        async def no_leader():
            raise api.Unavailable("no leader")
        env.service.reads.wait = no_leader
        import datetime
        iso = datetime.datetime.fromtimestamp(env.clock.now_ms() / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        iso2 = datetime.datetime.fromtimestamp(env.clock.now_ms() / 1000 + 3600, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        window = {"down_from": iso, "down_to": iso2}
        s, b = await call(c, "POST", "/v1/jobs/a1/explain", tok, body=window)
        assert s == 200, b
        s, b = await call(c, "POST", "/v1/jobs/a1/explain?stale=true", tok, body=window)
        assert s == 400 and b["error"]["field"] == "stale"
        assert (await call(c, "POST", "/v1/jobs/a1/pause", tok))[0] == 503
    run(t)


def test_a_refusal_reads_as_english_and_a_lock_owner_given_wrong_is_not_said_missing():
    """A user's walk: "a operator token may not POST /v1/tokens", and a lock acquire with
    ``{"owner": 5}`` answered "is required" though the field was there."""
    from raftsched.core import bodies
    from raftsched.core.errors import InvalidSpec

    async def t(env, c):
        tok = (await new_token(c, "operator"))["token"]
        s, b = await call(c, "POST", "/v1/tokens", tok, body={"role": "reader"})
        assert s == 403 and b["error"]["message"].startswith("an operator token may not"), b
        tok = (await new_token(c, "reader"))["token"]
        s, b = await call(c, "POST", "/v1/tokens", tok, body={"role": "reader"})
        assert s == 403 and b["error"]["message"].startswith("a reader token may not"), b
    run(t)
    with pytest.raises(InvalidSpec) as e:
        bodies.validate_lock_acquire("L", {"owner": 5, "ttl_s": 5})
    assert e.value.field == "owner" and e.value.message.startswith("must be")
    with pytest.raises(InvalidSpec) as e:
        bodies.validate_lock_acquire("L", {"ttl_s": 5})
    assert e.value.message.startswith("is required")


def test_a_ping_token_made_without_tenants_is_bound_to_its_jobs_tenants_and_pings_no_namesake():
    """A security review: a ping token for acme's job `hb`, made as docs/notifications.md shows
    (no tenants), pinged globex's job `hb` once acme's was deleted and globex made one of that
    name. The token is bound, when made, to the tenants of the jobs it names."""
    async def t(env, c):
        hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"}}
        assert (await call(c, "PUT", "/v1/jobs/hb", body=dict(hb, tenant="acme")))[0] == 201
        tok = await new_token(c, "ping", jobs=["hb"])
        assert tok["tenants"] == ["acme"], tok
        s, b = await call(c, "POST", "/v1/jobs/hb/ping", tok["token"], {"status": "start"})
        assert s not in (401, 403, 404), b  # (let through: the job's state answers it)
        assert (await call(c, "DELETE", "/v1/jobs/hb"))[0] == 200
        assert (await call(c, "PUT", "/v1/jobs/hb", body=dict(hb, tenant="globex")))[0] == 201
        s, b = await call(c, "POST", "/v1/jobs/hb/ping", tok["token"], {"status": "fail"})
        assert s == 404, b
        # Given tenants, it keeps them; naming no job that exists, it is bound to none (and warned).
        assert (await new_token(c, "ping", jobs=["hb"], tenants=["acme"]))["tenants"] == ["acme"]
        made = await new_token(c, "ping", jobs=["later"])
        assert made["tenants"] is None and made["warnings"], made
    run(t)
