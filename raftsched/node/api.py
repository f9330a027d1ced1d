"""The admin API (aiohttp, JSON, under /v1). See docs/api.md.

Any node accepts any request; writes go through Raft (the replication layer forwards a follower's
command to the leader). One middleware maps every error to ``{"error": {"code", "message",
"field"}}`` with the status its type carries; nothing a client sends produces a 500.

The handlers, then ``ROUTES``: the route table (node/routes.py), one row a route, from which
``make_app`` builds the router and the middlewares take each request's scope and tenancy rule.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import os
import socket

from aiohttp import web

from ..core import deadlines, limits, members, model, queries
from ..core.bodies import validate_cancel, validate_cancel_job, validate_pause
from ..core.errors import (BadRequest, Conflict, InvalidSpec, NotFound, RaftschedError, RequestTimeout, TooManyRequests,
                           Unauthorized, Unavailable)
from ..core.model import RUN_STATES
from ..replication import check_member_addr
from . import auth as auth_module
from . import limits as node_limits
from . import build, dashboard, notify, openapi, reads, rotation, routes, tenancy
from .http import (AUDIT, AUTH, BACKFILLS, FLEET, METRICS, PRINCIPAL, ROUTE_TABLE, SERVICE, TOKEN,  # noqa: F401 - re-exported
                   TRIGGER, UNCHANGED, WORKER, DRY_RUN, ClientGone, bool_param, choice_param, client_key, int_param, json_body,
                   json_response, label_params, optional_json_body, read_body, rid, scope_key, state_param,
                   tenants_of, job_param, queue_param, time_param)
from .routes import CONSISTENT, OPEN, STALE, Param, Route, Tenancy
from .backfills import BackfillService
from .fleet import Fleet
from .audit import AuditLog
from .auth import Auth
from .metrics import NodeMetrics
from .service import Service
from .trigger import Trigger
from .walks import SingleFlight
from ..worker.loop import Worker

log = logging.getLogger("raftsched.api")
#: The app's OpenAPI document, encoded at its first request (a dict: the app is frozen by then).
OPENAPI = web.AppKey("openapi", dict)
#: Scrapes of /metrics arriving together share one render, off the loop (node/walks.py).
METRICS_RENDER = web.AppKey("metrics_render", SingleFlight)

#: A request key: the read was served stale (``?stale=true``).
STALE_READ = web.RequestKey("stale_read", bool)
#: This request's replica was caught up with every acknowledged write already (auth_middleware,
#: for a token limited to tenants): the read middleware need not wait again.
CAUGHT_UP = web.RequestKey("caught_up", bool)
#: The routes whose tenancy checks (node/tenancy.py) and handlers read tenant data of the replica.
_TENANT_DATA = frozenset(t for t in Tenancy if t not in (Tenancy.REFUSED, Tenancy.SHARED, Tenancy.WORKER))


def _error_response(e: RaftschedError) -> web.Response:
    headers = {}
    if isinstance(e, Unavailable):
        headers["Retry-After"] = "1"
    if isinstance(e, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(e, TooManyRequests):
        headers["Retry-After"] = str(max(1, math.ceil(e.extra.get("retry_after_s", 1))))
    resp = json_response({"error": e.to_dict()}, status=e.http_status, headers=headers)
    if isinstance(e, RequestTimeout):
        resp.force_close()  # Connection: close: that connection's body is given up on, and it with it
    return resp


#: The status a request is counted with (/metrics) and audited with when its client closed the
#: connection before it was answered: nginx's "client closed request". No client ever reads it.
CLIENT_CLOSED = 499


def _client_closed(request: web.Request, e: Exception) -> bool:
    """``e`` is the client going away, not a fault of the node: its body's read lost the
    connection (http.read_body), or a ConnectionError came while the connection is gone."""
    if isinstance(e, ClientGone):
        return True
    transport = request.transport
    return isinstance(e, ConnectionError) and (transport is None or transport.is_closing())


def _name_client_key(request: web.Request, e: Conflict) -> Conflict:
    """A 409 for a request id used before (core/records.py ``replayed``, ``outcome_results``) names
    the request id the state machine knows: the client's key hashed with its token (http.scope_key).
    The answer leads with the key the client sent and keeps the internal id after it."""
    try:
        key = client_key(request)
    except RaftschedError:
        return e
    if key is None:
        return e
    internal = scope_key(request, key)
    ours = f"request id {internal!r}"
    if e.message.startswith(ours):
        tail = e.message[len(ours):]
        msg = f"Idempotency-Key {key!r} (request id {internal!r}){tail}"
    elif e.message.startswith("this request id "):
        msg = f"Idempotency-Key {key!r} (request id {internal!r}){e.message[len('this request id'):]}"
    else:
        return e
    msg += "; send a different request with a new key"
    return type(e)(msg, e.field, **e.extra)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except RaftschedError as e:
        if isinstance(e, Conflict) and e.field == "Idempotency-Key":
            e = _name_client_key(request, e)
        return _error_response(e)
    except web.HTTPRequestEntityTooLarge:
        return json_response(
            {"error": {"code": "too_large", "message": f"request body larger than {node_limits.request_bytes_max} bytes", "field": None}},
            status=413,
        )
    except web.HTTPException as e:
        if e.status >= 400:
            code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
            return json_response(
                {"error": {"code": code, "message": e.reason, "field": None}}, status=e.status,
                headers={k: v for k, v in e.headers.items() if k.lower() == "allow"},
            )
        raise
    except Exception as e:
        if _client_closed(request, e):
            # Nothing to answer, and nothing the node did wrong: a client that gives up is no
            # 500, nor an error in the node's log (a response is returned for the audit record
            # and the request counters; aiohttp drops it: the connection is gone).
            log.debug("api: %s %s: %s", request.method, request.path,
                      e if isinstance(e, ClientGone) else f"the client closed the connection ({e!r})")
            return json_response({"error": {"code": "client_closed", "message": "the client closed the connection",
                                            "field": None}}, status=CLIENT_CLOSED)
        log.exception("api: internal error on %s %s", request.method, request.path)
        return json_response(
            {"error": {"code": "internal", "message": "internal error (logged on the node)", "field": None}},
            status=500,
        )


@web.middleware
async def auth_middleware(request: web.Request, handler):
    """Every request but the open ones needs a token whose role has the route's scope
    (node/auth.py); a token limited to tenants is held to them (node/tenancy.py). Both read the
    route's row of the table; a route that matched but has no row is not served."""
    path = routes.canonical(request)
    route = routes.lookup(request.app[ROUTE_TABLE], request.method, path)
    if route is None and path is not None and request.match_info.http_exception is None:
        log.error("api: %s %s has no row in the route table: not served", request.method, path)
        raise NotFound(f"{request.method} {path} is not served")
    try:
        principal = auth_module.check_request(request.app[AUTH], request, route, final=False)
    except auth_module.UnknownToken:
        # This replica may not hold the token yet: a node that just started replays its log, and
        # one behind the leader has not applied a token made a moment ago. Refused (401) only if
        # it is still unknown once this node has applied what it knows the leader committed;
        # without a leader to say so, 503 (the worker took a 401 as final, and dropped a batch of
        # outcomes whose runs then ran again). No entry through the log (a read barrier's
        # would be): a client sending made-up tokens makes no commit.
        try:
            await request.app[SERVICE].reads.caught_up()
        except Unavailable as e:
            auth_module.note_claimed(request)  # (audited with the token id it claimed, as a 401)
            raise Unavailable(f"cannot tell whether this token is known: {e.message}", leader=e.extra.get("leader")) \
                from None
        principal = auth_module.check_request(request.app[AUTH], request, route)
    unknown = routes.unknown_param(route, request.query) if route is not None else None
    if unknown is not None:  # after the token: an unauthenticated probe learns nothing of the table
        takes = ", ".join(p.name for p in route.params) or "none"  # type: ignore[union-attr]
        hint = routes.unknown_param_hint(route, unknown, path)  # type: ignore[arg-type]
        raise BadRequest(f"unknown query parameter {unknown!r}; {route.method} {path} takes: {takes}{hint}",  # type: ignore[union-attr]
                         field=unknown)
    twice = routes.twice_param(route, request.query) if route is not None else None
    if twice is not None:
        raise BadRequest(f"query parameter {twice!r} is given more than once; give it once", field=twice)
    client_key(request)  # a bad Idempotency-Key is a 400 on every route, read by its handler or not
    if route is not None and route.body is None and request.body_exists:
        await _no_body(request, route, path)
    if principal is not None and principal.tenants is not None and route is not None:
        if route.tenancy in _TENANT_DATA and (
                (route.scope != "read" and STALE not in route.params)
                or (STALE in route.params and not bool_param(request, "stale"))):
            # The tenancy checks read this replica: a follower behind the leader would judge a
            # write by a view without the latest writes (a job or sink an admin just created
            # could be taken over as new, one just moved away still seen as the token's). A
            # consistent read waits here instead of after the check; a read that never waits
            # (explain: what an outage did, asked while there is no leader) does not.
            await request.app[SERVICE].reads.wait()
            request[CAUGHT_UP] = True
        tenancy.check(route, request, principal)
    return await handler(request)


async def _no_body(request: web.Request, route: Route, path: str | None) -> None:
    """A route that takes no body is sent one: refused, unless it is empty or ``{}``, rather than
    ignored (a resume sent ``{"catch_up": true}`` resumed without catching up, and the missed
    slots were recorded skipped for good). A field that is one of the route's query parameters
    says so."""
    raw = await read_body(request)
    if not raw.strip():
        return
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if doc == {}:
        return
    where = f"{route.method} {path or route.path}"
    if isinstance(doc, dict):
        field = str(next(iter(doc)))[:64].encode("utf-8", "backslashreplace").decode()  # (sent back: printable)
        param = next((p for p in route.params if p.name == field), None)
        if param is not None:
            raise InvalidSpec(f"{where} takes no body: {field} is a query parameter (?{field}=...)", field=field)
        takes = ", ".join(p.name for p in route.params) or "none"
        raise InvalidSpec(f"{where} takes no body, and no field {field!r} (its query parameters: {takes})",
                          field=field)
    raise BadRequest(f"{where} takes no body; send none (or {{}})")


@web.middleware
async def read_middleware(request: web.Request, handler):
    """Innermost: a read route (one that declares ``stale``) waits, after the token is checked,
    until this node has applied every write acknowledged before the request (node/reads.py),
    unless ``?stale=true``; a stale answer says so (``_mark_stale``)."""
    route = routes.lookup(request.app[ROUTE_TABLE], request.method, routes.canonical(request))
    if route is not None and STALE in route.params:
        bool_param(request, "consistent")  # checked; every read is consistent unless stale
        if bool_param(request, "stale"):
            request[STALE_READ] = True
        elif not request.get(CAUGHT_UP):
            await request.app[SERVICE].reads.wait()
    return await handler(request)


async def _mark_stale(request: web.Request, response: web.StreamResponse) -> None:
    if request.get(STALE_READ):
        response.headers[reads.STALE_HEADER] = "true"


@web.middleware
async def audit_middleware(request: web.Request, handler):
    """Outermost: every mutation, and every request refused for its token, goes to the audit
    log with the status it was answered (node/audit.py): one record each when the token was
    valid, counted in a summary when it was not (401) or not even looked at (429)."""
    status = None
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        # raised, not returned: a redirect (the dashboard's /ui -> /ui/; errors_middleware answers
        # every 4xx and 5xx one as a response); counted as the status it answers, not as a 500 (a
        # false 5xx in the metrics)
        status = e.status
        raise
    finally:
        log_ = request.app.get(AUDIT)
        if log_ is not None:
            record_audit(log_, request, status)
        metrics = request.app.get(METRICS)
        if metrics is not None:  # requests by route template and status (/metrics)
            metrics.count_request(request.method, routes.canonical(request), status)


def record_audit(audit_log: AuditLog, request: web.Request, status: int | None) -> None:
    path = routes.canonical(request)
    route = routes.lookup(request.app[ROUTE_TABLE], request.method, path)
    mutation = route.mutates if route is not None else request.method not in ("GET", "HEAD", "OPTIONS")
    denied = status in (401, 403, 429)
    if not (mutation or denied) or (status == 200 and request.get(UNCHANGED)):
        return
    p = request.get(PRINCIPAL)
    now_ms = request.app[SERVICE].clock.now_ms()
    agent = request.headers.get("User-Agent")
    if p is None:  # no valid token: anyone can send these, so they are counted, not recorded
        audit_log.refused(now_ms=now_ms, reason="throttled" if status == 429 else "unauthenticated",
                          source=request.remote, token=request.get(auth_module.CLAIMED), method=request.method,
                          route=path or request.path, status=status, agent=agent)
        return
    audit_log.record(
        now_ms=now_ms, source=request.remote, token=p.id, role=p.role,
        method=request.method, route=path or request.path,
        target=dict(request.match_info, dry_run="true") if request.get(DRY_RUN) else dict(request.match_info),
        status=status,
        auth="denied" if denied else "allowed",
        request_id=request.headers.get("Idempotency-Key") or request.headers.get("X-Request-Id"), agent=agent)


def make_app(service: Service, token: str | None, *, trigger: Trigger | None = None,
             worker: Worker | None = None, metrics: NodeMetrics | None = None,
             fleet: Fleet | None = None, auth: Auth | None = None,
             audit: AuditLog | None = None) -> web.Application:
    """Build the API application.

    :param token: the bootstrap (admin) token, when ``auth`` is not given.
    :param trigger: the node's trigger, whose counters /v1/cluster shows.
    :param worker: the node's worker, likewise.
    :param metrics: the node's metrics, which /metrics renders (404 without them).
    :param fleet: the node's side of the worker fleet (node/fleet.py); without it, one over the
        service's replica is made (it needs its ``run`` loop for long-polls to be answered).
    :param auth: who may call what (default: the bootstrap ``token`` and the replica's tokens).
    :param audit: the audit log (default: none).
    """
    app = web.Application(middlewares=[audit_middleware, errors_middleware, auth_middleware, read_middleware],
                          client_max_size=node_limits.request_bytes_max)
    app.on_response_prepare.append(_mark_stale)
    app[SERVICE] = service
    app[TOKEN] = token or ""
    app[AUTH] = auth if auth is not None else Auth(token or "", service.read, service.clock)
    if audit is not None:
        app[AUDIT] = audit
    for key, value in ((TRIGGER, trigger), (WORKER, worker), (METRICS, metrics)):
        if value is not None:
            app[key] = value
    if metrics is not None:
        metrics.watch_reads(service.reads)
    app[FLEET] = fleet if fleet is not None else Fleet(service.raft, service.clock, service.node_id)
    app[BACKFILLS] = BackfillService(service)
    app[ROUTE_TABLE] = routes.install(app.router, ROUTES)
    app[OPENAPI] = {}
    app[METRICS_RENDER] = SingleFlight()
    return app


async def metrics_text(request: web.Request) -> web.Response:
    m = request.app.get(METRICS)
    if m is None:
        raise NotFound("metrics are not enabled on this node")
    # Off the loop (node/walks.py): a scrape's collectors may walk large parts of the replica
    # (the queued runs of a placement nothing serves); scrapes arriving together share one.
    body = await request.app[METRICS_RENDER].run(m.render)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def openapi_json(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 document of this app's route table (node/openapi.py), made once."""
    cache = request.app[OPENAPI]
    if "doc" not in cache:
        # What this node asks a token for: GET /metrics is open on a node started with --metrics-open.
        doc = openapi.document(request.app[ROUTE_TABLE], is_open=request.app[AUTH].is_open)
        cache["doc"] = json.dumps(doc, separators=(",", ":")).encode()
    return web.Response(body=cache["doc"], content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    """200 when this node sees a leader and is a member (a voter or a learner of the latest
    configuration); else 503, ``member: false`` saying why when it is not one: a node removed
    while it still runs saw the leader and answered 200, and a load balancer sent it requests
    it answers 503."""
    svc = request.app[SERVICE]
    st = svc.raft.status()
    member = (st.get("membership") or {}).get("self") != "none"
    ok = st.get("leader") is not None and member
    body = {"ok": ok, "role": st.get("role"), "leader": st.get("leader")}
    if not member:
        body["member"] = False
    return json_response(body, status=200 if ok else 503, headers={} if ok else {"Retry-After": "1"})


async def cluster(request: web.Request) -> web.Response:
    """This node's view, served without a leader too (as /healthz is): it is how an operator and
    cluster.sh find out there is none. Stale (and saying so) unless ``?consistent=true``."""
    svc = request.app[SERVICE]
    if bool_param(request, "consistent"):
        await svc.read_barrier()
    else:
        request[STALE_READ] = True
    st = svc.raft.status()
    want_hash = bool_param(request, "hash")
    # The hash is opt-in (it encodes the whole state); with it, the count of commands it reflects,
    # read in the same query, so two replicas with equal state_applied must have equal hashes (I1).
    c = svc.read(queries.counts, want_hash)
    body = {
        "node": svc.node_id, "role": st.get("role"), "leader": st.get("leader"),
        "term": st.get("term"), "commit_index": st.get("commit_index"),
        "last_applied": st.get("last_applied"), "members": st.get("members"),
        "learners": st.get("learners", []), "membership": st.get("membership"),
        "pid": os.getpid(), "raft": st.get("self"), "jobs": c["jobs"], "runs": c["runs"],
        "state_now_ms": c["now_ms"], "code": build.code(),
    }
    if want_hash:
        body["state_hash"], body["state_applied"] = c["state_hash"], c["applied"]
    # Where each member's API is, as the members announced it (core/members.py): current
    # members and learners only, those that announced one.
    urls = svc.read(members.member_urls)
    body["member_urls"] = {m: urls[m] for m in [*(body["members"] or []), *(body["learners"] or [])] if m in urls}
    repl = st.get("replication")
    if repl is not None:
        # How this node's log keeps up, each follower's as the leader sees it, and the
        # conditions (cluster.follower_stalled) they imply: docs/api.md, docs/operations.md.
        body["replication"] = {k: repl[k] for k in ("commit_stalled_s", "leader_commit_index",
                                                    "followers")}
        body["conditions"] = list(repl["conditions"])
    else:
        body["conditions"] = []
    keys = request.app[FLEET].keys_condition()
    if keys is not None:
        body["conditions"].append(keys)
    clock = st.get("clock")
    if clock is not None:
        # This node's wall clock against the cluster's (on the leader, every member's), whose
        # cluster.clock_disagrees conditions are among the ones above: docs/operations.md.
        body["clock"] = {k: v for k, v in clock.items() if k != "conditions"}
    if st.get("durability") is not None:  # fsync on or off, and the syncs made (docs/operations.md)
        body["durability"] = st["durability"]
    worker = request.app.get(WORKER)
    if worker is not None:
        body["worker"] = worker.stats()
    trigger = request.app.get(TRIGGER)
    if trigger is not None:
        ts = trigger.stats()
        body["trigger"] = {"fires_proposed": ts["fires_proposed"], "slots_fired": ts["slots_fired"],
                           "held_by_clock": ts.get("held_by_clock")}
    return json_response(body)


async def add_member(request: web.Request) -> web.Response:
    """Add a node by its Raft address: a learner once committed (202), a voter once it holds the
    log (the leader promotes it); a voter already: 200, nothing changed."""
    body = await json_body(request)
    if not isinstance(body, dict):
        raise InvalidSpec('expected {"addr": "HOST:PORT"}', None)
    unknown = sorted(set(body) - {"addr"})
    if unknown:
        raise InvalidSpec(f"unknown field {unknown[0]!r}; the body is {{\"addr\": \"HOST:PORT\"}}", unknown[0])
    if "addr" not in body:
        raise InvalidSpec("addr is required: the new node's Raft address, HOST:PORT", "addr")
    if not isinstance(body["addr"], str):
        raise InvalidSpec(f"must be a string, the new node's Raft address HOST:PORT; got {type(body['addr']).__name__}",
                          "addr")
    raft = request.app[SERVICE].raft
    await _check_new_member(raft, body["addr"])
    res = await raft.change_members("add", body["addr"], timeout_s=node_limits.membership_change_timeout_s)
    return json_response(res, status=202 if res.get("state") == "learner" else 200)


async def _resolved(addr: str) -> set[tuple[str, int]] | str:
    """The (IP, port) pairs a member's ``HOST:PORT`` names, or why it names none."""
    host, _, port = addr.rpartition(":")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        return f"{host!r} does not resolve ({getattr(e, 'strerror', None) or e})"
    return {(_plain_ip(i[4][0]), i[4][1]) for i in infos}


def _plain_ip(ip: str) -> str:
    """An IPv4-mapped IPv6 address as the IPv4 address it is (``::ffff:127.0.0.1`` dials
    127.0.0.1); any other address as it is."""
    try:
        mapped = getattr(ipaddress.ip_address(ip.split("%")[0]), "ipv4_mapped", None)
    except ValueError:
        return ip
    return str(mapped) if mapped is not None else ip


async def _check_new_member(raft, addr: str) -> None:
    """Before an add: a name that resolves to nothing, or to a member's address under another
    name (``localhost:9702`` for ``127.0.0.1:9702``), would be a learner nobody answers for, a
    member slot taken for good until removed; refused (422, 409). The address and the members'
    are resolved together, within one deadline (member_resolve_s). A member asked again under
    its own name is change_members' to answer (``changed`` false), as is an address of another
    form (its error)."""
    try:
        check_member_addr(addr)
    except ValueError:
        return
    host = addr.rpartition(":")[0]
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise InvalidSpec(f"{addr!r} is not HOST:PORT: a host holds no ':' (an IPv6 address is written in "
                          "brackets, [::1]:9700)", "addr")
    st = raft.status()
    members = sorted(set(st.get("members") or ()) | set(st.get("learners") or ()))
    if addr in members:
        return
    wait = node_limits.member_resolve_s
    try:
        mine, *theirs = await asyncio.wait_for(asyncio.gather(*(_resolved(a) for a in [addr, *members])), wait)
    except TimeoutError:
        raise InvalidSpec(f"{addr} and the members' addresses did not resolve within {wait:g} s: a member's "
                          f"address must be one the other members can reach", "addr") from None
    if isinstance(mine, str):
        raise InvalidSpec(f"{mine}: a member's address must be one the other members can reach", "addr")
    if any(ipaddress.ip_address(ip.split("%")[0]).is_unspecified for ip, _ in mine):
        # 0.0.0.0 (or "0", or ::) is every interface to listen on; dialled, it is this host: a
        # member's address under another name the check below cannot see, counted twice.
        raise InvalidSpec(f"{addr} is a wildcard address (every interface, and whichever host dials it): name the "
                          "node by an address the other members reach it at", "addr")
    for m, got in zip(members, theirs):
        if not isinstance(got, str) and mine & got:
            raise Conflict(f"{addr} is member {m} under another name: name it as the cluster does", "addr")


async def get_fencing(request: web.Request) -> web.Response:
    return json_response(request.app[SERVICE].fencing())


async def fencing_floor(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.fencing_floor(await json_body(request), rid(request)))


async def remove_member(request: web.Request) -> web.Response:
    """Remove a node by its Raft address (a leader removing itself hands its leadership over
    first); not a member: 200, nothing changed, and a warning that says so. A member's address
    under another name (``localhost:9702`` for ``127.0.0.1:9702``) is refused (409): answered
    "removed, nothing changed", an operator took a voter for gone and shut its machine down."""
    raft = request.app[SERVICE].raft
    addr = request.match_info["addr"]
    warning = await _check_removed_member(raft, addr)
    res = await raft.change_members("remove", addr, timeout_s=node_limits.membership_change_timeout_s)
    if warning is not None and not res.get("changed"):
        res = dict(res, warnings=[warning])
    return json_response(res)


async def _check_removed_member(raft, addr: str) -> str | None:
    """Before a remove of ``addr``, not a member nor a learner under that name: the member it
    names under another name refused (409, as an add's), else the warning that nothing is
    removed (a retry of a remove that applied sees it too, and is told the truth). A name that
    does not resolve (a dead machine's, say) names no member; an address change_members
    refuses is its to answer. None: a member's own name."""
    try:
        check_member_addr(addr)
    except ValueError:
        return None
    st = raft.status()
    members = sorted(set(st.get("members") or ()) | set(st.get("learners") or ()))
    if addr in members:
        return None
    wait = node_limits.member_resolve_s
    try:
        mine, *theirs = await asyncio.wait_for(asyncio.gather(*(_resolved(a) for a in [addr, *members])), wait)
    except TimeoutError:
        return (f"addr: {addr} is no member's or learner's name (its members: {', '.join(members)}), and the "
                f"names did not resolve within {wait:g} s to tell whether it is another name of one: nothing "
                "was removed")
    if not isinstance(mine, str):
        for m, got in zip(members, theirs):
            if not isinstance(got, str) and mine & got:
                raise Conflict(f"{addr} is member {m} under another name: name it as the cluster does "
                               f"(raftsched members remove {m})", "addr")
    return (f"addr: {addr} is not a member nor a learner of this cluster (its members: {', '.join(members)}): "
            "nothing was removed")


def _pausers_shown(request: web.Request, jobs: list[dict]) -> None:
    """A job's ``state.pause.by`` is a token id: shown to a token that may list tokens (scope
    ``tokens``) and to the token that paused it; left out for the others (a tenant's operator
    learns no admin's token ids)."""
    p = request.get(PRINCIPAL)
    if p is not None and p.allows("tokens"):
        return
    for job in jobs:
        why = (job.get("state") or {}).get("pause")
        if why and why.get("by") is not None and (p is None or why["by"] != p.id):
            why.pop("by")


async def list_jobs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    limit = int_param(request, "limit", 100, 1, node_limits.jobs_page_max)
    page = await svc.list_jobs(limit, job_param(request, "after"), label_params(request), tenants_of(request))
    _pausers_shown(request, page["jobs"])
    return json_response(page)


async def put_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    name = request.match_info["name"]
    # Jobs have no entity tags: If-None-Match is * (create only) or nothing, and If-Match is not
    # taken (ignored, a client's optimistic write would replace whatever is there).
    inm = request.headers.get("If-None-Match")
    if inm is not None and inm.strip() != "*":
        raise BadRequest("only * is taken (create only, never replace): jobs have no entity tags",
                         field="If-None-Match")
    if "If-Match" in request.headers:
        raise BadRequest("is not taken: jobs have no entity tags (If-None-Match: * creates only)", field="If-Match")
    body = await json_body(request)
    create_only = inm is not None
    res = await svc.put_job(name, body, rid(request), create_only=create_only, tenants=tenants_of(request),
                            paused=bool_param(request, "paused"), by=_principal_id(request))
    return json_response(res, status=201 if res["created"] else 200)


async def put_jobs_batch(request: web.Request) -> web.Response:
    """Create or replace many jobs; the body may be up to batch_request_bytes_max."""
    body = await _batch_body(request)
    if isinstance(body, web.Response):
        return body
    _dry_run_noted(request, body)
    return json_response(await request.app[SERVICE].put_jobs(body, client_key(request), tenants_of(request),
                                                             lambda key: scope_key(request, key),
                                                             by=_principal_id(request)))


async def plan_jobs_batch(request: web.Request) -> web.Response:
    """``POST /v1/jobs:plan``: a batch's dry run (what it would do to each job, changing nothing)
    for a token that may read: a drift check in CI needs no token that may write jobs. The body
    is a batch's; a ``dry_run`` in it must be true."""
    body = await _batch_body(request)
    if isinstance(body, web.Response):
        return body
    if isinstance(body, dict):
        if body.get("dry_run", True) is not True:
            raise BadRequest("a plan changes nothing: leave dry_run out (or true); POST /v1/jobs:batch writes",
                             field="dry_run")
        body = dict(body, dry_run=True)
    principal = request.get(PRINCIPAL)
    writer = principal is None or principal.allows("jobs.write")
    return json_response(await request.app[SERVICE].put_jobs(body, None, tenants_of(request), writer=writer))


async def _batch_body(request: web.Request):
    """A batch's body (up to batch_request_bytes_max), or the 413 answer for a larger one."""
    limit = limits.batch_request_bytes_max
    too_large = json_response(
        {"error": {"code": "too_large", "message": f"request body larger than {limit} bytes; send at most "
                   f"{limits.batch_jobs_max} jobs per request", "field": None}}, status=413)
    if request.content_length is not None and request.content_length > limit:
        return too_large
    try:
        return await json_body(request.clone(client_max_size=limit))
    except web.HTTPRequestEntityTooLarge:
        return too_large


async def get_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    job = svc.get_job(request.match_info["name"], tenants_of(request))
    _pausers_shown(request, [job])
    return json_response(job)


async def delete_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.delete_job(request.match_info["name"], rid(request),
                                                  bool_param(request, "force"), tenants_of(request)))


async def job_graph(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.job_graph(request.match_info["name"], tenants_of(request)))


async def pause_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    note = validate_pause(await optional_json_body(request))
    return json_response(await svc.pause_job(request.match_info["name"], rid(request),
                                             by=_principal_id(request), note=note))


def _principal_id(request: web.Request) -> str | None:
    """The id of the token that sent ``request`` (a pause's ``by``), or None."""
    p = request.get(PRINCIPAL)
    return None if p is None else p.id


async def resume_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    catch_up = bool_param(request, "catch_up")
    return json_response(await svc.resume_job(request.match_info["name"], rid(request), catch_up))


async def trigger_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    body = await optional_json_body(request)
    if body is not None:  # a payload override or a slot: node/backfills.py
        status, body = await request.app[BACKFILLS].trigger(request.match_info["name"], body, rid(request),
                                                            tenants_of(request))
        return json_response(body, status=status)
    return json_response(await svc.trigger_job(request.match_info["name"], rid(request)), status=201)


def _run_window(request: web.Request) -> queries.RunWindow:
    """``?since=&until=`` (a slot window) and ``?before=`` (the cursor: the ``next`` of the page
    before) of a run list. :raises BadRequest: naming the parameter."""
    since, until = time_param(request, "since"), time_param(request, "until")
    if since is not None and until is not None and until <= since:
        raise BadRequest("must be after since", field="until")
    before = request.query.get("before")
    if before is not None:
        try:
            model.check_run_id(before)
        except InvalidSpec as e:
            raise BadRequest(f"a run id (the next of the page before): {e.message}", field="before") from None
    return queries.RunWindow(since, until, before)


async def job_runs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    limit = int_param(request, "limit", 100, 1, node_limits.job_runs_page_max,
                      f"a job's whole history: at most {limits.history_per_job_max} kept entries besides up to "
                      f"{limits.queue_depth_max} queued runs")
    slot_ms = time_param(request, "slot")
    return json_response(svc.job_runs(request.match_info["name"], limit, state_param(request), slot_ms,
                                          tenants_of(request), _run_window(request)))


async def list_runs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    limit = int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    return json_response(svc.list_runs(state_param(request), limit, tenants_of(request), _run_window(request)))


async def get_run(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.get_run(request.match_info["run"]))


async def preview_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    count = int_param(request, "count", 10, 1, limits.preview_count_max)
    after_ms = time_param(request, "after")
    return json_response(await svc.preview_job(request.match_info["name"], count, after_ms))


async def preview_spec(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    count = int_param(request, "count", 10, 1, limits.preview_count_max)
    name = job_param(request, "name")
    after_ms = time_param(request, "after")
    return json_response(await svc.preview_spec(await json_body(request), count, name, after_ms))


async def explain_job(request: web.Request) -> web.Response:
    """Read-only (it proposes nothing): scope read."""
    svc = request.app[SERVICE]
    return json_response(await svc.explain_job(request.match_info["name"], await json_body(request), tenants_of(request)))


async def ping_job(request: web.Request) -> web.Response:
    """A heartbeat job's ping (scope ping: a worker, operator or admin token, or a ping token
    bound to this job)."""
    svc = request.app[SERVICE]
    body = await optional_json_body(request)
    return json_response(await svc.ping(request.match_info["name"], body, rid(request)))


async def list_deadlines(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    limit = int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    job = job_param(request)
    return json_response(svc.list_deadlines(choice_param(request, "state", deadlines.OUTCOMES), job,
                                                time_param(request, "since"), limit, tenants_of(request)))


async def list_queues(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    # The count of unplaceable runs walks every queued run when placements are in use: off the
    # loop, one walk for the polls that arrive together (node/walks.py).
    return json_response(svc.list_queues(tenants_of(request), await svc.queue_walks()))


async def put_queue(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.put_queue(request.match_info["name"], await json_body(request), rid(request),
                                                 tenants_of(request)))


async def list_tenants(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.list_tenants(tenants_of(request)))


async def get_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.get_tenant(request.match_info["name"]))


async def put_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.put_tenant(request.match_info["name"], await json_body(request), rid(request)))


async def delete_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.delete_tenant(request.match_info["name"], rid(request)))


async def list_dlq(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    limit = int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    return json_response(svc.list_dlq(queue_param(request), limit, tenants_of(request)))


async def get_dlq(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.get_dlq(request.match_info["run"]))


async def dlq_requeue(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.dlq_requeue(request.match_info["run"], rid(request), tenants_of(request)))


async def cancel_run(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    reason = validate_cancel(await optional_json_body(request))
    return json_response(await svc.cancel_run(request.match_info["run"], rid(request), reason=reason))


async def cancel_job_runs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    reason, running, after = validate_cancel_job(await optional_json_body(request))
    return json_response(await svc.cancel_job_runs(request.match_info["name"], rid(request), reason=reason,
                                                   running=running, tenants=tenants_of(request), after=after))


async def dlq_delete(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.dlq_delete(request.match_info["run"], rid(request)))


async def get_lock(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(svc.get_lock(request.match_info["name"]))


async def lock_acquire(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.lock_acquire(request.match_info["name"], await json_body(request), rid(request),
                                             tenants_of(request)))


async def lock_renew(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.lock_renew(request.match_info["name"], await json_body(request), rid(request),
                                             tenants_of(request)))


async def lock_release(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await svc.lock_release(request.match_info["name"], await json_body(request), rid(request),
                                             tenants_of(request)))


# ------------------------------------------------------------------ backfills and bulk DLQ operations
_BACKFILL_KINDS = ("backfill", "requeue", "purge")
_BACKFILL_STATES = ("running", "paused", "done", "cancelled")


def _dry_run_noted(request: web.Request, body) -> None:
    """A body that asks only what it would do: its audit record says ``dry_run``."""
    if isinstance(body, dict) and body.get("dry_run") is True:
        request[DRY_RUN] = True


async def create_backfill(request: web.Request) -> web.Response:
    body = await json_body(request)
    _dry_run_noted(request, body)
    status, body = await request.app[BACKFILLS].create(request.match_info["name"], body,
                                                       rid(request), tenants_of(request))
    return json_response(body, status=status)


async def list_backfills(request: web.Request) -> web.Response:
    return json_response(request.app[BACKFILLS].list(
        choice_param(request, "kind", _BACKFILL_KINDS), job_param(request),
        choice_param(request, "state", _BACKFILL_STATES), tenants_of(request)))


async def get_backfill(request: web.Request) -> web.Response:
    return json_response(request.app[BACKFILLS].get(request.match_info["id"]))


async def control_backfill(request: web.Request) -> web.Response:
    return json_response(await request.app[BACKFILLS].control(
        request.match_info["id"], request.match_info["action"], rid(request)))


async def _dlq_bulk(request: web.Request, action: str) -> web.Response:
    body = await optional_json_body(request, {})
    _dry_run_noted(request, body)
    status, out = await request.app[BACKFILLS].dlq_bulk(action, body, rid(request))
    return json_response(out, status=status)


async def dlq_bulk_requeue(request: web.Request) -> web.Response:
    return await _dlq_bulk(request, "requeue")


async def dlq_bulk_purge(request: web.Request) -> web.Response:
    return await _dlq_bulk(request, "purge")


# ------------------------------------------------------------------ the worker fleet
#: The worker protocol's bodies are read without the check for a key named twice (http.json_body):
#: machines write them, from maps, many times a second, and the check took ~40 % of a lease
#: body's parse (200 outcomes: 188 -> 265 us). docs/api.md says so.
WORKER_PROTOCOL = False
async def worker_lease(request: web.Request) -> web.StreamResponse:
    """A long-poll: answered when runs were granted, or with none after ``wait_s``; outcomes it
    carries are proposed with its Idempotency-Key as their request id. Runs granted for a client
    that can no longer be answered are given back at once (release)."""
    fleet = request.app[FLEET]
    wid = request.match_info["id"]
    res, changed = await fleet.lease_changed(wid, await json_body(request, WORKER_PROTOCOL),
                                             alive=lambda: request.transport is not None and not request.transport.is_closing(),
                                             tenants=tenants_of(request), key=rid(request))
    resp = json_response(res)
    if not res["runs"]:
        if not changed:  # an idle poll: no audit record (docs/security.md, "The audit log")
            request[UNCHANGED] = True
        return resp
    try:
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("the client went away")
        await resp.prepare(request)
        await resp.write_eof()
    except (ConnectionError, RuntimeError) as e:
        log.info("api: lease answer for %s not delivered (%s): giving its %d runs back", wid, e, len(res["runs"]))
        await fleet.release_grants(wid, res["runs"], "the lease answer could not be delivered")
    return resp


async def worker_heartbeat(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(await fleet.heartbeat(request.match_info["id"], await json_body(request, WORKER_PROTOCOL),
                                                   tenants=tenants_of(request)))


async def worker_complete(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(await fleet.complete(request.match_info["id"], await json_body(request, WORKER_PROTOCOL), rid(request),
                                                  tenants=tenants_of(request)))


async def worker_release(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(await fleet.release(request.match_info["id"], await json_body(request, WORKER_PROTOCOL), rid(request),
                                                 tenants=tenants_of(request)))


async def worker_leave(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(await fleet.leave(request.match_info["id"], await json_body(request, WORKER_PROTOCOL), rid(request),
                                           tenants=tenants_of(request)))


async def list_workers(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(fleet.list_workers())


async def get_worker(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(fleet.get_worker(request.match_info["id"]))


async def drain_worker(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(await fleet.drain(request.match_info["id"], rid(request)))


# ------------------------------------------------------------------ the route table
def _limit(hi: int) -> Param:
    return Param("limit", "integer", "at most this many", default=100, lo=1, hi=hi)


_RUNS_PAGE = _limit(node_limits.runs_page_max)
_STATE = Param("state", "enum", "only runs in this state", choices=RUN_STATES)
#: A run list's time window and cursor (_run_window).
_WINDOW = (Param("since", "time", "only runs whose slot is at or after this time"),
           Param("until", "time", "only runs whose slot is before this time"),
           Param("before", "string", "the page after this run: the previous page's next"))
_COUNT = Param("count", "integer", "how many slots", default=10, lo=1, hi=limits.preview_count_max)
_R, _W = "read", "jobs.write"
T = Tenancy

#: One row a route (node/routes.py): method, path, handler, scope, tenancy rule, summary, query
#: parameters, request body schema, success status, extra error statuses. ``make_app`` serves
#: these and nothing else; docs/api.md documents each.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, OPEN, T.SHARED, "is there a leader (no token)", also_ok=(503,),
          response="health"),
    Route("GET", "/openapi.json", openapi_json, OPEN, T.SHARED, "this document (no token)", response="openapi"),
    Route("GET", "/v1/openapi.json", openapi_json, OPEN, T.SHARED, "this document (no token)", response="openapi"),
    Route("GET", "/metrics", metrics_text, _R, T.SHARED, "Prometheus metrics", errors=(404,), response="metrics"),
    Route("GET", "/v1/cluster", cluster, _R, T.SHARED, "this node, the leader, the members, replication",
          params=(CONSISTENT, Param("hash", "boolean", "add the replica's state hash", default=False)),
          response="cluster"),
    Route("POST", "/v1/cluster/members", add_member, "admin", T.REFUSED,
          "add a node (a learner, then a voter once it holds the log)", body="member", ok=202, also_ok=(200,),
          errors=(409, 422), response="member_changed"),
    Route("DELETE", "/v1/cluster/members/{addr}", remove_member, "admin", T.REFUSED, "remove a node",
          errors=(409, 422), response="member_changed"),
    Route("GET", "/v1/cluster/fencing", get_fencing, _R, T.REFUSED, "the highest fencing token granted",
          params=(STALE, CONSISTENT), response="fencing"),
    Route("POST", "/v1/cluster/fencing", fencing_floor, "admin", T.REFUSED,
          "raise the fencing counter (after a restore from copies)", body="fencing_floor", errors=(422,),
          response="fencing_raised"),
    # jobs
    Route("GET", "/v1/jobs", list_jobs, _R, T.FILTERED, "a page of jobs by name",
          params=(STALE, CONSISTENT, _limit(node_limits.jobs_page_max), Param("after", "job", "the last name of the page before"),
                  Param("label", "string", "KEY=VALUE: only jobs with this label", repeated=True)),
          response="jobs_page"),
    Route("POST", "/v1/jobs:batch", put_jobs_batch, _W, T.CHECKED, "create or replace many jobs",
          body="jobs_batch", errors=(413, 422), response="jobs_batch_written",
          body_bytes_max=limits.batch_request_bytes_max),
    Route("POST", "/v1/jobs:plan", plan_jobs_batch, _R, T.CHECKED,
          "what a batch would do to each job, changing nothing (a dry run a reader may send)",
          body="jobs_batch", errors=(413, 422), response="jobs_planned",
          body_bytes_max=limits.batch_request_bytes_max),
    Route("PUT", "/v1/jobs/{name}", put_job, _W, T.CHECKED, "create (201) or replace (200) a job",
          params=(Param("paused", "boolean", "pause the job in the same command: created paused, it fires nothing "
                                             "until resumed", default=False),),
          body="job_spec", ok=201, also_ok=(200,), errors=(409, 422), response="job_written"),
    Route("GET", "/v1/jobs/{name}", get_job, _R, T.JOB, "a job, its state and next slot", params=(STALE, CONSISTENT),
          errors=(404,), response="job"),
    Route("DELETE", "/v1/jobs/{name}", delete_job, _W, T.JOB, "delete a job",
          params=(Param("force", "boolean", "delete it though other jobs run after it (their waiting slots "
                        "are recorded dependency_missing)", default=False),), errors=(404, 409), response="job_deleted"),
    Route("GET", "/v1/jobs/{name}/graph", job_graph, _R, T.JOB,
          "the jobs it runs after and that run after it, transitively, with each edge's condition",
          params=(STALE, CONSISTENT), errors=(404,), response="job_graph"),
    Route("POST", "/v1/jobs/{name}/pause", pause_job, _W, T.JOB, "pause a job (with a note: why)",
          body="pause", body_optional=True, errors=(404, 422), response="job_paused"),
    Route("POST", "/v1/jobs/{name}/resume", resume_job, _W, T.JOB, "resume a job",
          params=(Param("catch_up", "boolean", "fire the slots missed while paused, by policy", default=False),),
          errors=(404,), response="job_paused"),
    Route("POST", "/v1/jobs/{name}/cancel", cancel_job_runs, _W, T.JOB,
          "cancel a job's queued runs (and running ones, if asked)", body="cancel_job", body_optional=True,
          errors=(404, 422), response="job_runs_cancelled"),
    Route("POST", "/v1/jobs/{name}/trigger", trigger_job, _W, T.JOB, "run a job now (or for a slot)",
          body="trigger", body_optional=True, ok=201, also_ok=(200,), errors=(404, 409, 422), response="triggered"),
    Route("GET", "/v1/jobs/{name}/runs", job_runs, _R, T.JOB, "a job's runs and recorded slots, newest first",
          params=(STALE, CONSISTENT, _limit(node_limits.job_runs_page_max), _STATE,
                  Param("slot", "time", "only this slot's")) + _WINDOW, errors=(404,), response="job_runs"),
    Route("GET", "/v1/jobs/{name}/preview", preview_job, _R, T.JOB, "a job's next slots",
          params=(STALE, _COUNT, Param("after", "time", "slots after this time")), errors=(404,), response="slots"),
    Route("POST", "/v1/jobs/{name}/explain", explain_job, _R, T.JOB, "what an outage would do to a job's slots",
          body="explain", errors=(404, 422), response="explained"),
    Route("POST", "/v1/preview", preview_spec, _R, T.SHARED, "a spec's next slots (proposes nothing)",
          params=(_COUNT, Param("name", "job", "the name the job would have: a jitter_s offset is a hash of it, "
                                "and the spec's after is checked against it, as PUT /v1/jobs/{name} would "
                                "(default preview)"),
                  Param("after", "time", "slots after this time (default now: the job as if made now, which "
                                         "has no slot before)")),
          body="job_spec", errors=(422,), response="slots"),
    Route("POST", "/v1/jobs/{name}/backfills", create_backfill, _W, T.JOB, "run a job for a past range",
          body="backfill", ok=201, also_ok=(200,), errors=(404, 409, 422), response="backfill_created"),
    # queues and tenants
    Route("GET", "/v1/queues", list_queues, _R, T.FILTERED, "every queue's depth, bounds and counts",
          params=(STALE, CONSISTENT), response="queues"),
    Route("PUT", "/v1/queues/{name}", put_queue, "queues.write", T.CHECKED,
          "a queue's bounds, and the tenants it belongs to", body="queue", errors=(422,), response="queue_written"),
    Route("GET", "/v1/tenants", list_tenants, _R, T.FILTERED, "every tenant's rate limit, policy and default routes",
          params=(STALE, CONSISTENT), response="tenants"),
    Route("GET", "/v1/tenants/{name}", get_tenant, _R, T.TENANT, "a tenant's rate limit, policy and default routes",
          params=(STALE, CONSISTENT), errors=(404,), response="tenant"),
    Route("PUT", "/v1/tenants/{name}", put_tenant, "tenants.write", T.REFUSED, "a tenant's rate limit and/or policy",
          body="tenant", errors=(422,), response="tenant_written"),
    Route("DELETE", "/v1/tenants/{name}", delete_tenant, "tenants.write", T.REFUSED,
          "remove a tenant's rate limit, policy and default routes", errors=(404,), response="tenant_deleted"),
    # the dead-letter queue
    Route("GET", "/v1/dlq", list_dlq, _R, T.FILTERED, "dead runs, newest first",
          params=(STALE, CONSISTENT, _RUNS_PAGE, Param("queue", "queue", "only this queue's")), response="dlq_page"),
    Route("GET", "/v1/dlq/{run}", get_dlq, _R, T.DEAD_RUN, "a dead run with every attempt's error",
          params=(STALE, CONSISTENT), errors=(404,), response="run"),
    Route("POST", "/v1/dlq/{run}/requeue", dlq_requeue, "dlq.write", T.DEAD_RUN, "queue a dead run again",
          errors=(404,), response="dlq_requeued"),
    Route("DELETE", "/v1/dlq/{run}", dlq_delete, "dlq.write", T.DEAD_RUN, "drop a dead run", errors=(404,), response="run_deleted"),
    Route("POST", "/v1/dlq:requeue", dlq_bulk_requeue, "dlq.write", T.REFUSED, "queue many dead runs again",
          body="dlq_bulk", body_optional=True, ok=201, also_ok=(200,), errors=(409, 422), response="dlq_bulk_started"),
    Route("POST", "/v1/dlq:purge", dlq_bulk_purge, "dlq.write", T.REFUSED, "drop many dead runs",
          body="dlq_bulk", body_optional=True, ok=201, also_ok=(200,), errors=(409, 422), response="dlq_bulk_started"),
    # locks
    Route("GET", "/v1/locks/{name}", get_lock, _R, T.SHARED, "a lock's holder and fencing token",
          params=(STALE, CONSISTENT), errors=(404,), response="lock"),
    Route("POST", "/v1/locks/{name}/acquire", lock_acquire, "locks.write", T.SHARED, "take a lock",
          body="lock_acquire", errors=(409, 422), response="lock_held"),
    Route("POST", "/v1/locks/{name}/renew", lock_renew, "locks.write", T.SHARED, "renew a held lock",
          body="lock_token", errors=(409, 422), response="lock_held"),
    Route("POST", "/v1/locks/{name}/release", lock_release, "locks.write", T.SHARED, "release a held lock",
          body="lock_token", errors=(409, 422), response="lock_released"),
    # runs
    Route("GET", "/v1/runs", list_runs, _R, T.FILTERED, "runs and recorded slots, newest first",
          params=(STALE, CONSISTENT, _RUNS_PAGE, _STATE) + _WINDOW, response="runs_page"),
    Route("GET", "/v1/runs/{run}", get_run, _R, T.RUN, "a run", params=(STALE, CONSISTENT), errors=(404,), response="run"),
    Route("POST", "/v1/runs/{run}/cancel", cancel_run, _W, T.RUN,
          "cancel a queued or running run (a running one's worker stops it)", body="cancel", body_optional=True,
          errors=(404, 409, 422), response="run_cancelled"),
    Route("POST", "/v1/jobs/{name}/ping", ping_job, "ping", T.JOB, "a heartbeat job's start, success or fail",
          body="ping", body_optional=True, errors=(404, 409, 422), response="pinged"),
    Route("GET", "/v1/deadlines", list_deadlines, _R, T.FILTERED, "slots' deadline outcomes, newest first",
          params=(Param("state", "enum", "only this outcome", choices=deadlines.OUTCOMES),
                  Param("job", "job", "only this job's"),
                  Param("since", "time", "only slots at or after this time"), _RUNS_PAGE, STALE, CONSISTENT), response="deadlines"),
    # backfills and bulk operations
    Route("GET", "/v1/backfills", list_backfills, _R, T.FILTERED, "backfills and bulk DLQ operations",
          params=(STALE, CONSISTENT, Param("kind", "enum", "only this kind", choices=_BACKFILL_KINDS),
                  Param("job", "job", "only this job's"),
                  Param("state", "enum", "only in this state", choices=_BACKFILL_STATES)), response="backfills"),
    Route("GET", "/v1/backfills/{id}", get_backfill, _R, T.BACKFILL, "one backfill or bulk operation",
          params=(STALE, CONSISTENT), errors=(404,), response="backfill"),
    Route("POST", "/v1/backfills/{id}/{action:pause|resume|cancel}", control_backfill, _W, T.BACKFILL,
          "pause, resume or cancel a backfill", errors=(404, 409), response="backfill_controlled"),
    # the worker protocol (docs/api.md, "The worker protocol"); a worker id may hold a "/": it is
    # sent percent-encoded, and routes match the raw path
    Route("POST", "/v1/workers/{id}/lease", worker_lease, "worker", T.WORKER, "lease runs (a long-poll)",
          body="lease", errors=(422,), response="leased"),
    Route("POST", "/v1/workers/{id}/heartbeat", worker_heartbeat, "worker", T.WORKER, "renew leases",
          body="heartbeat", errors=(422,), response="heartbeat"),
    Route("POST", "/v1/workers/{id}/complete", worker_complete, "worker", T.WORKER, "report outcomes",
          body="complete", errors=(422,), response="completed"),
    Route("POST", "/v1/workers/{id}/release", worker_release, "worker", T.WORKER, "give leases back",
          body="release", errors=(422,), response="released"),
    Route("POST", "/v1/workers/{id}/leave", worker_leave, "worker", T.WORKER,
          "the worker process is going away: drain it", body="leave", errors=(404, 422), response="worker_left"),
    # the fleet, for operators
    Route("GET", "/v1/workers", list_workers, _R, T.REFUSED, "every registered worker", params=(STALE, CONSISTENT), response="workers"),
    Route("GET", "/v1/workers/{id}", get_worker, _R, T.REFUSED, "one worker", params=(STALE, CONSISTENT),
          errors=(404,), response="worker"),
    Route("POST", "/v1/workers/{id}/drain", drain_worker, "admin", T.REFUSED, "stop a worker taking runs",
          errors=(404,), response="worker_drained"),
) + auth_module.TOKEN_ROUTES + rotation.SECRETS_ROUTES + notify.SINK_ROUTES + dashboard.UI_ROUTES
