"""Tokens limited to tenants, and tenants' policies: what a token sees and may change, and what a
job may be (docs/security.md, "Tenants" and "Tenant policy").

A token with ``tenants: ["billing"]`` sees and changes only the jobs of tenant billing, their runs
and dead runs, and billing's queues; it cannot create a job in another tenant (403 naming the
tenant) nor replace a job of another tenant. Another tenant's job or run does not exist for it
(404, the same answer as for a name nobody uses), so names do not leak.

Each route's row in the route table (node/routes.py) says how (``Tenancy``): lists are filtered
by their handlers, through the same code every token's request takes (``FILTERED``); a job's
spec and a queue's body are checked by their handlers (``CHECKED``: ``check_job``,
``check_queue``); a route of one job, run, dead run or tenant is checked here before its handler
runs (``check``; a backfill's: ``BACKFILL``); a route that is not tenant data is served as it is (``SHARED``, ``WORKER``);
any other (tokens, the fleet's admin routes, routes added later without a decision) is refused
(``REFUSED``): limited by default. Tokens without tenants come here only for ``check_job``: a
tenant's policy holds every writer.

A write's answer to a limited token depends on other tenants' objects only where the write would
otherwise succeed: the body is validated and the token's own rules are checked first, and only
then whether the name (or the queue) is another tenant's (409, or 403 for a queue). Names are the
cluster's: a name another tenant holds cannot be taken.

The checks read this node's replica (caught up first with every acknowledged write: the auth
middleware waits for a read barrier) and the command is proposed after them, so a job moved to
another tenant in between (by a token allowed in both) could still be acted on once by a
limited token of its old tenant: docs/security.md, "What tenancy does not cover".
"""
from __future__ import annotations

from aiohttp import web

from ..core import backfill_plan, limits, queries
from ..core.model import check_name
from ..core.errors import Conflict, Forbidden, InvalidSpec, NotFound
from .http import SERVICE, rid
from .routes import Route, Tenancy


def _names(tenants) -> str:
    return ", ".join(sorted(tenants))


def _job_in(svc, p, name: str) -> None:
    """:raises NotFound: no job ``name`` in the token's tenants."""
    t = svc.read(queries.job_tenant, name)
    if t is None or t not in p.tenants:
        raise NotFound(f"no job named {name!r}", field="name")


def _run_in(svc, p, run_id: str, where: str = "", slot_too: bool = False) -> None:
    """``slot_too``: an id of no run that names a slot of a job (a recorded range's, a waiting
    child's: GET /v1/runs/{run}) is its job's tenant's."""
    t = svc.read(queries.run_or_slot_tenant if slot_too else queries.run_tenant, run_id)
    if t is None or t not in p.tenants:
        raise NotFound(f"no run {run_id!r}{where}", field="run")


def check(route: Route, request: web.Request, p) -> None:
    """Hold a request of a token limited to ``p.tenants`` to them before its handler runs.

    :raises Forbidden: the route is not open to such tokens.
    :raises NotFound: the route's job, run, dead run or tenant is not one of theirs."""
    kind = route.tenancy
    if kind is Tenancy.REFUSED:
        raise Forbidden(f"{request.method} {route.key[1]} is not open to tokens limited to tenants",
                        tenant=None)
    svc = request.app[SERVICE]
    try:
        if kind is Tenancy.JOB:
            _job_in(svc, p, request.match_info["name"])
        elif kind is Tenancy.RUN:
            _run_in(svc, p, request.match_info["run"], slot_too=True)
        elif kind is Tenancy.DEAD_RUN:
            _run_in(svc, p, request.match_info["run"], " in a dead-letter queue")
    except NotFound:
        # A retried delete that applied (its job or dead run is gone now) is answered by the
        # replay of its first answer, as for any token: its key is this token's (http.scope_key),
        # and it was remembered as a delete of this very job or run (a key of another request
        # of the token's does not pass). Any other method is held to the check.
        what = (f"delete_job:{request.match_info['name']}" if kind is Tenancy.JOB
                else f"dlq_delete:{request.match_info['run']}" if kind is Tenancy.DEAD_RUN else None)
        if request.method != "DELETE" or what is None or not svc.read(queries.request_was, rid(request), what):
            raise
    if kind is Tenancy.BACKFILL:
        bf_id = request.match_info["id"]
        check_name(bf_id, "id", limits.backfill_id_chars_max)  # (a malformed id: 422, as to any token)
        if svc.read(backfill_plan.view, bf_id, p.tenants) is None:
            raise NotFound(f"no backfill {bf_id!r}", field="id")
    if kind is Tenancy.TENANT:
        if request.match_info["name"] not in p.tenants:
            raise NotFound(f"no tenant {request.match_info['name']!r}", field="name")


#: The queue of every job that names none: it is never claimed (a tenant's first job in it
#: would make it the tenant's, bounding and counting every other job's runs in it).
DEFAULT_QUEUE = "default"
_DEFAULT_QUEUE_WHY = ("the default queue belongs to no tenant until an admin shares it (every job that names no "
                      "queue uses it)")


def check_job(svc, tenants: frozenset | None, name: str, spec: dict, access: dict | None = None) -> str | None:
    """For a handler that puts job ``name`` with ``spec`` (validated already), written by a
    token limited to ``tenants`` (None: every tenant). The tenant's policy holds every writer; a
    limited token is also held to its tenants, their queues and names not another tenant's.

    :param access: queries.queues_access of the job's queue, when the caller read it already
        (a batch: one walk for all its jobs); else it is read here.
    :returns: the tenant whose queue the job's queue becomes if it belongs to none (the put
        command's ``claim``), for a limited token; None otherwise.
    :raises Forbidden: naming the field: ``tenant`` (another tenant), ``executor.type`` or
        ``placement.labels`` (the tenant's policy), ``queue`` (another tenant's queue).
    :raises Conflict: the name is another tenant's job's (``name``)."""
    t = spec["tenant"]
    if tenants is not None and t not in tenants:
        # (a spec without "tenant" is the default tenant's: the likeliest mistake, so say how)
        hint = "" if t != "default" else (f'; give the job "tenant": "{next(iter(tenants))}"' if len(tenants) == 1
                                          else f'; give the job a "tenant" (one of {_names(tenants)})')
        raise Forbidden(f"this token is limited to tenants {_names(tenants)}: it cannot "
                        f"put job {name!r} in tenant {t!r}{hint}", field="tenant", tenant=t)
    broken = svc.read(queries.policy_check, spec, tenants is not None)
    if broken is not None:
        field, why = broken
        raise Forbidden(f"{why}; an admin sets the policy: PUT /v1/tenants/{t}", field=field, tenant=t)
    if tenants is None:
        return None
    q = spec["queue"]
    owners, users = access[q] if access is not None and q in access else svc.read(queries.queue_access, q, name)
    if owners is not None and t not in owners:
        raise Forbidden(f"queue {q!r} is not one of tenant {t!r}'s queues; give the job a queue of its own, "
                        f"or ask an admin to share this one (PUT /v1/queues/{q} with tenants)",
                        field="queue", tenant=t)
    if owners is None and q == DEFAULT_QUEUE:
        raise Forbidden(_DEFAULT_QUEUE_WHY + "; give the job a queue of its own (queue), or ask an admin to share "
                        f"it (PUT /v1/queues/{q} with tenants)", field="queue", tenant=t)
    if owners is None and users - {t}:
        raise Forbidden(f"queue {q!r} is used by jobs of other tenants than {t!r}; give the job a queue of its "
                        f"own, or ask an admin to share this one (PUT /v1/queues/{q} with tenants)",
                        field="queue", tenant=t)
    current = svc.read(queries.job_tenant, name)
    if current is not None and current not in tenants:
        raise Conflict(f"the job name {name!r} is taken", field="name")
    if current is None and not svc.read(queries.dependent_tenants, name) <= tenants:
        # Another tenant's children still name it (their parent was deleted with force): a job
        # made under the name would run them, and hand them its results. The same answer as a
        # name another tenant's job holds.
        raise Conflict(f"the job name {name!r} is taken", field="name")
    return t


def check_queue(svc, tenants: frozenset, name: str, fields: dict) -> None:
    """For ``PUT /v1/queues/{name}`` by a token limited to ``tenants``: the queue must be theirs
    (it belongs to some of them only), or belong to no tenant and be used by their jobs only;
    then it becomes theirs: ``fields["tenants"]`` is set to the tenants it is claimed for (the
    body's, or the token's one tenant, or the one tenant whose jobs use it).

    :raises Forbidden: the queue is another tenant's, or the body names another tenant.
    :raises InvalidSpec: a token of several tenants claims a queue without saying for which."""
    want = fields.get("tenants", ())
    if "tenants" in fields and (want is None or not set(want) <= tenants):
        raise Forbidden(f"this token is limited to tenants {_names(tenants)}: a queue it configures belongs to "
                        "some of them", field="tenants", tenant=None)
    owners, users = svc.read(queries.queue_access, name, None)
    if owners is None and name == DEFAULT_QUEUE:
        raise Forbidden(_DEFAULT_QUEUE_WHY + ": an admin configures it, or shares it (PUT /v1/queues/"
                        f"{name} with tenants)", field="name", tenant=None)
    if owners is not None:
        if not set(owners) <= tenants:
            raise Forbidden(f"queue {name!r} belongs to other tenants than this token's ({_names(tenants)})",
                            field="name", tenant=None)
        return
    if not users <= tenants:
        raise Forbidden(f"queue {name!r} is used by jobs of other tenants than this token's ({_names(tenants)})",
                        field="name", tenant=None)
    if "tenants" not in fields:
        mine = users or tenants
        if len(mine) != 1:
            raise InvalidSpec("this token is limited to several tenants: say which this queue belongs to",
                              field="tenants")
        fields["tenants"] = sorted(mine)
