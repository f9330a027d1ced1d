"""Both clients cover every route of the API (node/api.py), and answer alike.

The routes come from the router itself, so a route added without a client method fails
``test_every_route_of_the_api_has_a_client_call``: add its function to
raftsched/client/endpoints.py, a method to both Client and AsyncClient
(tests/test_client_layout.py says what it must look like) and its call to CALLS below. Each call
is then made by the sync Client and by the AsyncClient, against two replicas that start alike,
and must hit its route and give the same answer (or the same error) from both.
"""
from __future__ import annotations

import asyncio
import inspect

from aiohttp import web
from aiohttp.test_utils import TestServer

from raftsched import AsyncClient, Client
from raftsched.async_client import ENDPOINT_METHODS
from raftsched.core.errors import RaftschedError

from test_api import SPEC, TOKEN, Env

PAUSED_SPEC = dict(SPEC, schedule={"every_s": 60})


def _token(results: dict) -> int:
    return results["lock_acquire"]["token"]


#: (method, route as the router spells it) -> the client method and its arguments, in the order
#: they are made (an argument may be computed from the earlier answers).
CALLS = [
    (("GET", "/healthz"), "healthz", ()),
    (("GET", "/v1/cluster"), "cluster", ()),
    (("GET", "/v1/whoami"), "whoami", ()),
    (("POST", "/v1/cluster/members"), "add_member", ("127.0.0.1:7",)),
    (("GET", "/v1/cluster/fencing"), "fencing", ()),
    (("POST", "/v1/cluster/fencing"), "raise_fencing", (5,)),
    (("DELETE", "/v1/cluster/members/{addr}"), "remove_member", ("127.0.0.1:7",)),
    (("GET", "/metrics"), "metrics", ()),
    (("GET", "/v1/openapi.json"), "openapi", ()),
    (("PUT", "/v1/jobs/{name}"), "put_job", ("a", SPEC)),
    (("POST", "/v1/jobs:batch"), "put_jobs", ({"b": dict(SPEC, labels={"raftsched.app": "x"})},)),
    (("POST", "/v1/jobs:plan"), "plan_jobs", ({"b": SPEC},)),
    (("GET", "/v1/jobs/{name}"), "get_job", ("a",)),
    (("GET", "/v1/jobs"), "list_jobs", (), {"labels": {"raftsched.app": "x"}}),
    (("GET", "/v1/jobs/{name}/runs"), "runs", ("a",), {"since": "2000-01-01T00:00:00Z"}),
    (("GET", "/v1/jobs/{name}/graph"), "graph", ("a",)),
    (("GET", "/v1/jobs/{name}/preview"), "preview", ("a", 3)),
    (("POST", "/v1/preview"), "preview_spec", (PAUSED_SPEC, 2)),
    (("POST", "/v1/jobs/{name}/explain"), "explain", ("a", "2027-01-15T08:00:00Z", "2027-01-15T08:01:00Z")),
    (("POST", "/v1/jobs/{name}/trigger"), "trigger", ("a",)),
    (("POST", "/v1/jobs/{name}/ping"), "ping", ("a", "start")),
    (("GET", "/v1/deadlines"), "list_deadlines", (), {"state": "missed", "since": "2027-01-15T08:00:00Z"}),
    (("GET", "/v1/runs"), "list_runs", (), {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"}),
    (("GET", "/v1/runs/{run}"), "get_run", ("a@nosuch",)),
    (("POST", "/v1/jobs/{name}/pause"), "pause", ("a",)),
    (("POST", "/v1/jobs/{name}/resume"), "resume", ("a",)),
    (("GET", "/v1/queues"), "queues", ()),
    (("PUT", "/v1/queues/{name}"), "put_queue", ("q", 5, "drop_oldest")),
    (("GET", "/v1/tenants"), "tenants", ()),
    (("PUT", "/v1/tenants/{name}"), "put_tenant", ("t", 2.5, 4), {"executors": ["http"], "network_allow": ["10.0.0.0/8"]}),
    (("GET", "/v1/tenants/{name}"), "tenant", ("t",)),
    (("DELETE", "/v1/tenants/{name}"), "delete_tenant", ("t",)),
    (("GET", "/v1/dlq"), "dlq", ()),
    (("GET", "/v1/dlq/{run}"), "dlq_get", ("a@nosuch",)),
    (("POST", "/v1/dlq/{run}/requeue"), "dlq_requeue", ("a@nosuch",)),
    (("POST", "/v1/runs/{run}/cancel"), "cancel_run", ("a@nosuch", "why")),
    (("POST", "/v1/jobs/{name}/cancel"), "cancel_job_runs", ("nosuch", "why", True)),
    (("DELETE", "/v1/dlq/{run}"), "dlq_delete", ("a@nosuch",)),
    (("POST", "/v1/locks/{name}/acquire"), "lock_acquire", ("l", "me", 5)),
    (("GET", "/v1/locks/{name}"), "lock_info", ("l",)),
    (("POST", "/v1/locks/{name}/renew"), "lock_renew", ("l", _token)),
    (("POST", "/v1/locks/{name}/release"), "lock_release", ("l", _token)),
    (("POST", "/v1/jobs/{name}/backfills"), "backfill", ("a", "2027-01-15T07:59:00Z", "2027-01-15T08:00:00Z"),
     {"dry_run": True}),
    (("GET", "/v1/backfills"), "backfills", ()),
    (("GET", "/v1/backfills/{id}"), "get_backfill", ("nosuch",)),
    (("POST", "/v1/backfills/{id}/{action}"), "cancel_backfill", ("nosuch",)),
    (("POST", "/v1/dlq:requeue"), "dlq_requeue_matching", (), {"dry_run": True, "all_runs": True}),
    (("POST", "/v1/dlq:purge"), "dlq_purge_matching", (), {"dry_run": True, "all_runs": True}),
    (("POST", "/v1/workers/{id}/lease"), "worker_lease", ("w/1",), {"max_runs": 1, "wait_s": 0.05, "ttl_ms": 10_000}),
    (("POST", "/v1/workers/{id}/heartbeat"), "worker_heartbeat", ("w/1", [["a@nosuch", 1]], 10_000)),
    (("POST", "/v1/workers/{id}/complete"), "worker_complete",
     ("w/1", [{"run": "a@nosuch", "token": 1, "success": True}])),
    (("POST", "/v1/workers/{id}/release"), "worker_release", ("w/1", [["a@nosuch", 1]])),
    (("POST", "/v1/workers/{id}/leave"), "worker_leave", ("w/1", "another-instance")),
    (("GET", "/v1/workers"), "workers", ()),
    (("GET", "/v1/workers/{id}"), "worker", ("w/1",)),
    (("POST", "/v1/workers/{id}/drain"), "drain_worker", ("w/1",)),
    (("DELETE", "/v1/jobs/{name}"), "delete_job", ("b",)),
    # Tokens: a create both clients get refused alike (a made token's id and secret differ).
    (("POST", "/v1/tokens"), "create_token", ("root",)),
    (("GET", "/v1/tokens"), "tokens", ()),
    (("DELETE", "/v1/tokens/{id}"), "revoke_token", ("0123456789abcdef",)),
    # Secrets at rest: both replicas' services seal with the process's one key, "process".
    (("POST", "/v1/secrets:rotate"), "rotate_seal_key", ("process",)),
    (("GET", "/v1/secrets"), "secrets_status", ()),
    (("PUT", "/v1/sinks/{name}"), "put_sink", ("ops", {"type": "slack", "secrets": {"url": "https://hooks.example/x"}})),
    (("GET", "/v1/sinks"), "sinks", ()),
    (("GET", "/v1/sinks/{name}"), "get_sink", ("ops",)),
    (("GET", "/v1/sinks/{name}/dead"), "sink_dead", ("ops",)),
    (("POST", "/v1/sinks/{name}/dead:requeue"), "sink_requeue", ("ops",)),
    (("DELETE", "/v1/sinks/{name}"), "delete_sink", ("ops",)),
]


def _routes(app: web.Application) -> set[tuple[str, str]]:
    # aiohttp adds a HEAD route beside every GET.
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


#: The dashboard's static files (node/dashboard.py): a page for browsers, not an API call.
NOT_API = {("GET", "/ui"), ("GET", "/ui/"), ("GET", "/ui/{file}")}


def test_every_route_of_the_api_has_a_client_call():
    # /openapi.json is the same document as /v1/openapi.json, which the clients read.
    routes = _routes(Env().app) - NOT_API - {("GET", "/openapi.json")}
    listed = [route for route, *_ in CALLS]
    assert len(listed) == len(set(listed)), "a route listed twice"
    assert not routes - set(listed), f"routes without a client call here: {sorted(routes - set(listed))}"
    assert not set(listed) - routes, f"calls of routes the API does not have: {sorted(set(listed) - routes)}"


def test_both_clients_have_every_method_and_the_async_ones_are_coroutines():
    names = {name for _, name, *_ in CALLS}
    assert names <= set(ENDPOINT_METHODS)
    for name in names:
        assert callable(getattr(Client, name)), name
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert inspect.signature(getattr(AsyncClient, name)) == inspect.signature(getattr(Client, name))


def _outcome(fn) -> tuple:
    try:
        return ("ok", fn())
    except RaftschedError as e:
        return ("error", type(e).__name__, getattr(e, "status", None), e.code, e.field)


async def _served(calls_fn):
    """Run ``calls_fn(url, seen)`` against a fresh in-process node; ``seen`` records the route
    each request matched."""
    env = Env(metrics=True)
    seen: list = []

    @web.middleware
    async def record(request, handler):
        route = request.match_info.route
        seen.append((request.method, route.resource.canonical if route.resource is not None else None))
        return await handler(request)

    env.app.middlewares.append(record)
    server = TestServer(env.app, host="127.0.0.1")
    await server.start_server()
    try:
        return await calls_fn(str(server.make_url("")), seen)
    finally:
        await server.close()


def _args(spec: tuple, results: dict) -> tuple[tuple, dict]:
    args = tuple(a(results) if callable(a) else a for a in spec[2])
    return args, (spec[3] if len(spec) > 3 else {})


def test_each_method_calls_its_route_and_both_clients_answer_alike():
    async def with_sync(url, seen):
        c = Client(url, token=TOKEN, deadline_s=5)
        results, out = {}, []
        for spec in CALLS:
            args, kw = _args(spec, results)
            n = len(seen)
            res = await asyncio.to_thread(_outcome, lambda: getattr(c, spec[1])(*args, **kw))  # noqa: B023 - called in this iteration
            out.append((seen[n:], res))
            if res[0] == "ok":
                results[spec[1]] = res[1]
        return out

    async def with_async(url, seen):
        results, out = {}, []
        async with AsyncClient(url, token=TOKEN, deadline_s=5) as c:
            for spec in CALLS:
                args, kw = _args(spec, results)
                n = len(seen)
                try:
                    res = ("ok", await getattr(c, spec[1])(*args, **kw))
                except RaftschedError as e:
                    res = ("error", type(e).__name__, getattr(e, "status", None), e.code, e.field)
                out.append((seen[n:], res))
                if res[0] == "ok":
                    results[spec[1]] = res[1]
        return out

    sync_out = asyncio.run(_served(with_sync))
    async_out = asyncio.run(_served(with_async))
    for spec, (s_seen, s_res), (a_seen, a_res) in zip(CALLS, sync_out, async_out):
        route, name = spec[0], spec[1]
        assert s_seen == [route], (name, s_seen)
        assert a_seen == [route], (name, a_seen)
        if name == "metrics":  # counters of request timings differ from run to run
            assert s_res[0] == a_res[0] == "ok" and isinstance(s_res[1], str) and isinstance(a_res[1], str)
            assert "raftsched_" in a_res[1]
            continue
        assert s_res == a_res, name
    oks = {spec[1] for spec, (_, res) in zip(CALLS, sync_out) if res[0] == "ok"}
    # The calls that must succeed against this replica (the rest are 404s of runs that do not
    # exist, which still show the route is the right one).
    assert oks >= {"healthz", "cluster", "put_job", "put_jobs", "get_job", "list_jobs", "preview_spec",
                   "trigger", "pause", "resume", "put_queue", "put_tenant", "delete_tenant",
                   "lock_acquire", "lock_info", "lock_renew", "lock_release", "delete_job"}
    listed = dict((spec[1], res) for spec, (_, res) in zip(CALLS, sync_out))
    assert [j["name"] for j in listed["list_jobs"][1]["jobs"]] == ["b"]


def test_every_read_takes_stale_and_sends_it_only_when_asked():
    """Reads are consistent by default (the node's read barrier); ``stale=True`` asks for the
    replica as it is (``?stale=true``). Every client method of a route that takes ``stale`` has
    it, and both clients send it when asked and only then; ``consistent=`` is still accepted."""
    from raftsched.node import api, routes
    table = routes.table(api.ROUTES)
    takes_stale = {(r.method, r.key[1]) for r in table.values() if any(p.name == "stale" for p in r.params)}
    reads = [spec for spec in CALLS if spec[0] in takes_stale]
    assert {spec[0] for spec in reads} == takes_stale, "a read route without a call in CALLS"
    for spec in reads:
        for cls in (Client, AsyncClient):
            assert "stale" in inspect.signature(getattr(cls, spec[1])).parameters, f"{cls.__name__}.{spec[1]}"

    async def calls(url, seen):
        out = []
        sync = Client(url, token=TOKEN, deadline_s=5)
        async with AsyncClient(url, token=TOKEN, deadline_s=5) as ac:
            for spec in reads:
                args, kw = _args(spec, {"lock_acquire": {"token": 1}})
                for stale in (False, True):
                    for which in ("sync", "async"):
                        n = len(seen)
                        try:
                            if which == "sync":
                                await asyncio.to_thread(getattr(sync, spec[1]), *args, **kw, stale=stale)
                            else:
                                await getattr(ac, spec[1])(*args, **kw, stale=stale)
                        except RaftschedError:
                            pass  # a 404 of a thing not made here still shows what was sent
                        out.append((spec[1], which, stale, seen[n:]))
            n = len(seen)
            try:
                await ac.get_job("nosuch", True)  # consistent=, as older callers pass it
            except RaftschedError:
                pass
            out.append(("get_job", "async", "consistent", seen[n:]))
        return out

    async def served(fn):
        env = Env()
        seen: list = []

        @web.middleware
        async def record(request, handler):
            seen.append((request.method, request.match_info.route.resource.canonical, dict(request.query)))
            return await handler(request)
        env.app.middlewares.append(record)
        server = TestServer(env.app, host="127.0.0.1")
        await server.start_server()
        try:
            return await fn(str(server.make_url("")), seen)
        finally:
            await server.close()

    out = asyncio.run(served(calls))
    for name, which, stale, hits in out:
        assert len(hits) == 1, (name, which, hits)
        query = hits[0][2]
        if stale == "consistent":
            assert query.get("consistent") == "true" and "stale" not in query
        elif stale:
            assert query.get("stale") == "true", (name, which, query)
        else:
            assert "stale" not in query, (name, which, query)
