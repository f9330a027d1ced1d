"""The route table: one row a route, and everything else about the HTTP API derived from it.

Each ``Route`` names its method, path, handler, the scope a token needs (node/auth.py), how a
token limited to tenants is held to them (``Tenancy``, node/tenancy.py), its query parameters,
its request body, its success status and the error statuses it can answer beyond the common
ones. ``install`` builds the application's router from the rows and nothing else, so a route
without a row cannot be served; the permission check and the tenant filter read the same row
(``lookup``); the OpenAPI document is generated from the rows (node/openapi.py).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

#: The scope of a route no token is needed for.
OPEN = "open"


class Tenancy(enum.Enum):
    """How a request of a token limited to tenants is served (node/tenancy.py)."""

    #: Refused (403): not open to tokens limited to tenants (tokens, the fleet's admin routes).
    REFUSED = "refused"
    #: Not tenant data: served as to any token (the cluster, metrics, locks, a spec's preview).
    SHARED = "shared"
    #: The handler filters what it returns to the token's tenants (lists).
    FILTERED = "filtered"
    #: The handler checks the request's body against the token's tenants (a job's spec, a
    #: queue's configuration).
    CHECKED = "checked"
    #: The ``{name}`` job must be one of the token's tenants' (else 404, as for no such job).
    JOB = "job"
    #: The ``{run}`` run must be one of the token's tenants' (else 404).
    RUN = "run"
    #: Likewise, in a dead-letter queue.
    DEAD_RUN = "dead_run"
    #: The ``{name}`` tenant must be one of the token's (else 404, as for no such tenant).
    TENANT = "tenant"
    #: The ``{id}`` backfill must be one the token sees: of its tenants' jobs (else 404, as for
    #: no such backfill; core/backfill_plan.py visible_to).
    BACKFILL = "backfill"
    #: The worker protocol: the handlers hold a worker limited to tenants to them (node/fleet.py).
    WORKER = "worker"


@dataclass(frozen=True)
class Param:
    """A query parameter: ``kind`` is ``boolean``, ``integer`` (``lo``..``hi``, ``default``),
    ``string``, ``job`` (a job's name), ``queue`` (a queue's), ``time`` (ISO-8601 or ms since the epoch) or ``enum``
    (``choices``)."""

    name: str
    kind: str
    doc: str
    default: object = None
    lo: int | None = None
    hi: int | None = None
    choices: tuple = ()
    repeated: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    scope: str
    tenancy: Tenancy
    summary: str
    params: tuple[Param, ...] = ()
    #: The request body: the name of its schema (docs/api.md; ``None``: no body).
    body: str | None = None
    body_optional: bool = False
    #: The success status, and the error statuses this route answers beyond the ones every
    #: route may (400 bad_request, 401, 403, 429, 503 unavailable, 504 indeterminate).
    ok: int = 200
    errors: tuple[int, ...] = ()
    #: Other statuses answered with the success body (a dry run's 200 beside a 201, a replaced
    #: job's 200 beside 201, /healthz's 503 without a leader).
    also_ok: tuple[int, ...] = ()
    #: The success body: the name of its schema in node/openapi.py RESPONSES (``None``: a JSON
    #: object the document does not detail).
    response: str | None = None
    #: The query string is not read, so any is accepted rather than refused (the dashboard's
    #: page and files: a link to them may carry one, a cache-buster or a tracker's).
    any_query: bool = False
    #: The largest body it reads, when not node/limits.py request_bytes_max (a batch's).
    body_bytes_max: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(method, the path as the router's canonical form writes it: ``{action}`` for
        ``{action:pause|resume|cancel}``)."""
        return self.method, _VARIABLE_RE.sub(r"{\1}", self.path)

    @property
    def mutates(self) -> bool:
        """Whether it may change the state (audited): not a read, and not open."""
        return self.method not in ("GET", "HEAD") and self.scope not in ("read", OPEN)


_VARIABLE_RE = re.compile(r"\{(\w+):[^}]*\}")

#: Query parameters several routes share.
#: A read route declares STALE: it is linearizable unless ``?stale=true`` (node/reads.py: the read
#: middleware waits for a barrier round before the handler runs on every route that declares it).
STALE = Param("stale", "boolean", "read this node's replica as it is, without waiting until it has applied "
              "every write acknowledged before the request (the answer says X-Raftsched-Stale: true)",
              default=False)
#: Accepted (and checked) for clients written when reads were stale unless they asked: every read
#: is consistent now unless ``stale=true``, whatever this says.
CONSISTENT = Param("consistent", "boolean", "accepted for older clients; reads are consistent unless stale=true",
                   default=False)


def table(routes) -> dict[tuple[str, str], Route]:
    """``(method, path) -> Route``, refusing a route given twice."""
    out: dict[tuple[str, str], Route] = {}
    for r in routes:
        if r.key in out:
            raise ValueError(f"route {r.method} {r.path} is in the table twice")
        out[r.key] = r
    return out


def install(router: web.UrlDispatcher, routes) -> dict[tuple[str, str], Route]:
    """Add every row to ``router`` (GET rows answer HEAD too) and return the table."""
    t = table(routes)
    for r in t.values():
        if r.method == "GET":
            router.add_get(r.path, r.handler)
        else:
            router.add_route(r.method, r.path, r.handler)
    return t


def canonical(request: web.Request) -> str | None:
    """The route a request matched, as the table names it (a path with ``{name}`` parts), or
    None when it matched none (404, 405)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def unknown_param(route: Route, names) -> str | None:
    """The first query parameter of ``names`` the row does not declare, or None: a request is
    never answered as if a parameter it sent were not there (``POST /v1/preview?after=`` was, before it took one)."""
    if route.any_query:
        return None
    known = {p.name for p in route.params}
    return next((n for n in names if n not in known), None)


def unknown_param_hint(route: Route, name: str, path: str | None) -> str:
    """What to add to the 400 of an unknown parameter ``name``, or "": ``?stale=true`` sent to a
    route that reads this node's own view already, with no read barrier unless
    ``?consistent=true`` (``GET /v1/cluster``: the README's ``?stale=true`` opts out of the
    barrier on every other read, and was answered as if it made no sense here)."""
    if name == STALE.name and CONSISTENT in route.params and STALE not in route.params:
        return (f"; {path or route.path} is this node's own view already (stale: no read barrier); "
                "?consistent=true waits until this node has applied every write acknowledged before the request")
    return ""


def twice_param(route: Route, query) -> str | None:
    """The first query parameter of ``query`` (a multidict) given more than once that the row
    does not declare repeatable, or None: ``?limit=5&limit=500`` is refused, not answered by
    whichever one a handler happens to read."""
    if route.any_query or len(query) == len(set(query)):  # (len counts every pair; set() of the names, each once)
        return None
    repeated = {p.name for p in route.params if p.repeated}
    seen: set[str] = set()
    for n, _ in query.items():
        if n in seen and n not in repeated:
            return n
        seen.add(n)
    return None


def lookup(t: dict[tuple[str, str], Route], method: str, path: str | None) -> Route | None:
    """The row of ``method path`` (HEAD is GET's), or None."""
    if path is None:
        return None
    return t.get(("GET" if method == "HEAD" else method, path))
