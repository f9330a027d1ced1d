"""Tokens limited to tenants: what such a token sees and may change (docs/security.md, "Tenants").

A token with ``tenants: ["billing"]`` sees and changes only the jobs of tenant billing, their runs
and dead runs, and the queues those jobs use; it cannot create a job in another tenant (403
naming the tenant) nor replace a job of another tenant. Another tenant's job or run does not
exist for it (404, the same answer as for a name nobody uses), so names do not leak. Reads are
filtered; writes are checked here, before anything is proposed.

Every route a limited token may call has a rule in ``RULES``; any other route (rate limits,
tokens, routes added later) is refused to it (403): limited by default. Tokens without tenants
never come here, and take the API's handlers unchanged.

The checks read this node's replica and the command is proposed after them, so a job moved to
another tenant in between (by a token allowed in both) could still be acted on once by a
limited token of its old tenant: docs/security.md, "What tenancy does not cover".
"""
from __future__ import annotations

from aiohttp import web

from ..core import queries
from ..core.errors import Forbidden, NotFound
from . import limits as node_limits
from .views import run_view, tenant_view


def _svc(request: web.Request):
    from .api import SERVICE  # api.py imports this module
    return request.app[SERVICE]


def _names(p) -> str:
    return ", ".join(sorted(p.tenants))


def _job_in(svc, p, name: str) -> None:
    """:raises NotFound: no job ``name`` in the token's tenants."""
    t = svc.read(queries.job_tenant, name)
    if t is None or t not in p.tenants:
        raise NotFound(f"no job named {name!r}", field="name")


def _run_in(svc, p, run_id: str, where: str = "") -> None:
    t = svc.read(queries.run_tenant, run_id)
    if t is None or t not in p.tenants:
        raise NotFound(f"no run {run_id!r}{where}", field="run")


def _spec_tenant(p, name: str, spec) -> None:
    """:raises Forbidden: the spec puts the job in a tenant the token is not limited to."""
    if isinstance(spec, dict):
        t = spec.get("tenant", "default")
        if isinstance(t, str) and t not in p.tenants:
            raise Forbidden(f"this token is limited to tenants {_names(p)}: it cannot put job {name!r} "
                            f"in tenant {t!r}", field="tenant", tenant=t)


def _replaces_in(svc, p, name: str) -> None:
    t = svc.read(queries.job_tenant, name)
    if t is not None and t not in p.tenants:
        raise Forbidden(f"job {name!r} belongs to a tenant this token is not limited to "
                        f"({_names(p)})", field="name", tenant=None)


async def _job_route(request, handler, p):
    _job_in(_svc(request), p, request.match_info["name"])
    return await handler(request)


async def _put_job(request, handler, p):
    from .api import _json_body
    svc, name = _svc(request), request.match_info["name"]
    body = await _json_body(request)  # read once: the handler reads the same bytes
    _spec_tenant(p, name, body)
    _replaces_in(svc, p, name)
    return await handler(request)


async def _put_jobs(request, handler, p):
    from .api import _json_body, _rid
    from ..core import limits
    svc = _svc(request)
    if request.content_length is not None and request.content_length > limits.batch_request_bytes_max:
        return await handler(request)  # too large: the handler says so, having read nothing
    try:
        body = await _json_body(request.clone(client_max_size=limits.batch_request_bytes_max))
    except web.HTTPRequestEntityTooLarge:
        return web.json_response({"error": {"code": "too_large", "message": f"request body larger than "
                                            f"{limits.batch_request_bytes_max} bytes", "field": None}}, status=413)
    jobs = body.get("jobs") if isinstance(body, dict) else None
    if isinstance(jobs, dict):
        for name, spec in jobs.items():
            _spec_tenant(p, name, spec)
            _replaces_in(svc, p, name)
    return web.json_response(await svc.put_jobs(body, _rid(request)))


async def _list_jobs(request, handler, p):
    from .api import _bool_param, _int_param, _label_params
    svc = _svc(request)
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.jobs_page_max)
    page = svc.read(queries.jobs_page_in, p.tenants, limit, request.query.get("after"), _label_params(request))
    page["jobs"] = [svc.job_view(j) for j in page["jobs"]]
    return web.json_response(page)


async def _list_runs(request, handler, p):
    from .api import _bool_param, _int_param, _state_param
    svc = _svc(request)
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    runs = svc.read(queries.runs_in, p.tenants, _state_param(request), limit)
    return web.json_response({"runs": [run_view(r) for r in runs]})


async def _run_route(request, handler, p):
    _run_in(_svc(request), p, request.match_info["run"])
    return await handler(request)


async def _dlq_run_route(request, handler, p):
    _run_in(_svc(request), p, request.match_info["run"], " in a dead-letter queue")
    return await handler(request)


async def _list_dlq(request, handler, p):
    from .api import _bool_param, _int_param
    svc = _svc(request)
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    out = [run_view(r) for r in svc.read(queries.dead_runs, request.query.get("queue")) if r.get("tenant") in p.tenants]
    out.sort(key=lambda r: (r["finished_at"] or "", r["id"]), reverse=True)
    return web.json_response({"runs": out[:limit], "total": len(out)})


async def _list_queues(request, handler, p):
    from .api import _bool_param
    svc = _svc(request)
    await svc.read_barrier(_bool_param(request, "consistent"))
    mine = svc.read(queries.queues_of, p.tenants)
    return web.json_response({"queues": [q for q in svc.list_queues()["queues"] if q["name"] in mine]})


async def _put_queue(request, handler, p):
    svc, name = _svc(request), request.match_info["name"]
    owners = svc.read(queries.queue_tenants, name)
    if not owners or not owners <= p.tenants:
        raise Forbidden(f"queue {name!r} is not used only by jobs of this token's tenants ({_names(p)})",
                        field="name", tenant=None)
    return await handler(request)


async def _list_tenants(request, handler, p):
    from .api import _bool_param
    svc = _svc(request)
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response({"tenants": [tenant_view(t) for t in svc.read(queries.tenants) if t["name"] in p.tenants]})


async def _as_is(request, handler, p):
    return await handler(request)


#: (method, route) -> the rule a limited token's request follows. HEAD is GET's.
RULES = {
    ("GET", "/v1/jobs"): _list_jobs,
    ("POST", "/v1/jobs:batch"): _put_jobs,
    ("PUT", "/v1/jobs/{name}"): _put_job,
    ("GET", "/v1/runs"): _list_runs,
    ("GET", "/v1/runs/{run}"): _run_route,
    ("GET", "/v1/dlq"): _list_dlq,
    ("GET", "/v1/dlq/{run}"): _dlq_run_route,
    ("POST", "/v1/dlq/{run}/requeue"): _dlq_run_route,
    ("DELETE", "/v1/dlq/{run}"): _dlq_run_route,
    ("GET", "/v1/queues"): _list_queues,
    ("PUT", "/v1/queues/{name}"): _put_queue,
    ("GET", "/v1/tenants"): _list_tenants,
    # Not tenant data: a spec's preview is computed, not stored; locks are the cluster's.
    ("POST", "/v1/preview"): _as_is,
    ("GET", "/v1/cluster"): _as_is,
    ("GET", "/metrics"): _as_is,
    ("GET", "/v1/locks/{name}"): _as_is,
    ("POST", "/v1/locks/{name}/acquire"): _as_is,
    ("POST", "/v1/locks/{name}/renew"): _as_is,
    ("POST", "/v1/locks/{name}/release"): _as_is,
    # The worker protocol: the handlers hold a worker limited to tenants to them (node/fleet.py:
    # it is granted only their runs, and its reports of other runs are refused).
    ("POST", "/v1/workers/{id}/lease"): _as_is,
    ("POST", "/v1/workers/{id}/heartbeat"): _as_is,
    ("POST", "/v1/workers/{id}/complete"): _as_is,
    ("POST", "/v1/workers/{id}/release"): _as_is,
}


async def handle(request: web.Request, handler, p, route: str):
    """Serve a request of a token limited to tenants ``p.tenants`` (see the module docstring).
    Routes of one job (``/v1/jobs/{name}`` and below, backfills included) need the job to be in
    the token's tenants. :raises Forbidden: a route no rule allows a limited token."""
    m = "GET" if request.method == "HEAD" else request.method
    rule = RULES.get((m, route))
    if rule is None and route.startswith("/v1/jobs/{name}"):
        rule = _job_route
    if rule is None:
        raise Forbidden(f"{request.method} {route} is not open to tokens limited to tenants", tenant=None)
    return await rule(request, handler, p)
