"""Tokens limited to tenants: what such a token sees and may change (docs/security.md, "Tenants").

A token with ``tenants: ["billing"]`` sees and changes only the jobs of tenant billing, their runs
and dead runs, and the queues those jobs use; it cannot create a job in another tenant (403
naming the tenant) nor replace a job of another tenant. Another tenant's job or run does not
exist for it (404, the same answer as for a name nobody uses), so names do not leak.

Each route's row in the route table (node/routes.py) says how (``Tenancy``): lists are filtered
by their handlers, through the same code every token's request takes (``FILTERED``); a job's
spec is checked by its handler (``CHECKED``, ``check_spec``); a route of one job, run, dead run
or queue is checked here before its handler runs (``check``); a route that is not tenant data
is served as it is (``SHARED``, ``WORKER``); any other (tokens, the fleet's admin routes,
routes added later without a decision) is refused (``REFUSED``): limited by default. Tokens
without tenants never come here.

The checks read this node's replica and the command is proposed after them, so a job moved to
another tenant in between (by a token allowed in both) could still be acted on once by a
limited token of its old tenant: docs/security.md, "What tenancy does not cover".
"""
from __future__ import annotations

from aiohttp import web

from ..core import queries
from ..core.errors import Forbidden, NotFound
from .http import SERVICE
from .routes import Route, Tenancy


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


def _queue_of(svc, p, name: str) -> None:
    owners = svc.read(queries.queue_tenants, name)
    if not owners or not owners <= p.tenants:
        raise Forbidden(f"queue {name!r} is not used only by jobs of this token's tenants ({_names(p)})",
                        field="name", tenant=None)


def check(route: Route, request: web.Request, p) -> None:
    """Hold a request of a token limited to ``p.tenants`` to them before its handler runs.

    :raises Forbidden: the route is not open to such tokens, or a queue is not theirs.
    :raises NotFound: the route's job, run or dead run is not one of theirs."""
    kind = route.tenancy
    if kind is Tenancy.REFUSED:
        raise Forbidden(f"{request.method} {route.key[1]} is not open to tokens limited to tenants",
                        tenant=None)
    svc = request.app[SERVICE]
    if kind is Tenancy.JOB:
        _job_in(svc, p, request.match_info["name"])
    elif kind is Tenancy.RUN:
        _run_in(svc, p, request.match_info["run"])
    elif kind is Tenancy.DEAD_RUN:
        _run_in(svc, p, request.match_info["run"], " in a dead-letter queue")
    elif kind is Tenancy.QUEUE:
        _queue_of(svc, p, request.match_info["name"])


def check_spec(svc, tenants: frozenset | None, name: str, spec) -> None:
    """For a handler that puts job ``name`` with ``spec``: a token limited to ``tenants`` may
    neither put it in another tenant nor replace another tenant's job (None: every tenant).

    :raises Forbidden: naming the field (``tenant``, or ``name`` for another tenant's job)."""
    if tenants is None:
        return
    if isinstance(spec, dict):
        t = spec.get("tenant", "default")
        if isinstance(t, str) and t not in tenants:
            raise Forbidden(f"this token is limited to tenants {', '.join(sorted(tenants))}: it cannot "
                            f"put job {name!r} in tenant {t!r}", field="tenant", tenant=t)
    current = svc.read(queries.job_tenant, name)
    if current is not None and current not in tenants:
        raise Forbidden(f"job {name!r} belongs to a tenant this token is not limited to "
                        f"({', '.join(sorted(tenants))})", field="name", tenant=None)
