"""The admin API (aiohttp, JSON, under /v1). See docs/api.md.

Any node accepts any request; writes go through Raft (the replication layer forwards a follower's
command to the leader). One middleware maps every error to ``{"error": {"code", "message",
"field"}}`` with the status its type carries; nothing a client sends produces a 500.
"""
from __future__ import annotations

import json
import logging
import math
import os

from aiohttp import web

from ..core import limits, preview, queries
from ..core.errors import BadRequest, InvalidSpec, NotFound, RaftschedError, TooManyRequests, Unauthorized, Unavailable
from ..core.model import RUN_STATES, check_label_key, check_label_value
from . import auth as auth_module
from . import tenancy
from . import limits as node_limits
from .backfills import BackfillService
from .fleet import Fleet
from .audit import AuditLog
from .auth import Auth
from .metrics import NodeMetrics
from .service import Service, parse_slot_param
from .trigger import Trigger
from ..worker.loop import Worker

log = logging.getLogger("raftsched.api")

SERVICE = web.AppKey("service", Service)
TOKEN = web.AppKey("token", str)
#: The node's loops, when the app serves a node: /v1/cluster shows their counters, /metrics
#: renders the registry. An app without them (tests) leaves the keys unset.
TRIGGER = web.AppKey("trigger", Trigger)
WORKER = web.AppKey("worker", Worker)
METRICS = web.AppKey("metrics", NodeMetrics)
BACKFILLS = web.AppKey("backfills", BackfillService)
#: The worker fleet's side of this node (node/fleet.py): the worker protocol and /v1/workers.
FLEET = web.AppKey("fleet", Fleet)
#: Who may call what (node/auth.py), and where mutations are recorded (node/audit.py; unset: nowhere).
AUTH = web.AppKey("auth", Auth)
AUDIT = web.AppKey("audit", AuditLog)


def _error_response(e: RaftschedError) -> web.Response:
    headers = {}
    if isinstance(e, Unavailable):
        headers["Retry-After"] = "1"
    if isinstance(e, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(e, TooManyRequests):
        headers["Retry-After"] = str(max(1, math.ceil(e.extra.get("retry_after_s", 1))))
    return web.json_response({"error": e.to_dict()}, status=e.http_status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except RaftschedError as e:
        return _error_response(e)
    except web.HTTPRequestEntityTooLarge:
        return web.json_response(
            {"error": {"code": "too_large", "message": f"request body larger than {node_limits.request_bytes_max} bytes", "field": None}},
            status=413,
        )
    except web.HTTPException as e:
        if e.status >= 400:
            code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
            return web.json_response(
                {"error": {"code": code, "message": e.reason, "field": None}}, status=e.status,
                headers={k: v for k, v in e.headers.items() if k.lower() == "allow"},
            )
        raise
    except Exception:
        log.exception("api: internal error on %s %s", request.method, request.path)
        return web.json_response(
            {"error": {"code": "internal", "message": "internal error (logged on the node)", "field": None}},
            status=500,
        )


@web.middleware
async def auth_middleware(request: web.Request, handler):
    """Every request but the open ones needs a token whose role has the route's scope
    (node/auth.py); a token limited to tenants is held to them (node/tenancy.py)."""
    principal, scope = auth_module.check_request(request.app[AUTH], request)
    if principal is not None and principal.tenants is not None and scope != "none":
        return await tenancy.handle(request, handler, principal, request.match_info.route.resource.canonical)
    return await handler(request)


@web.middleware
async def audit_middleware(request: web.Request, handler):
    """Outermost: every mutation, and every request refused a token, goes to the audit log
    with the status it was answered (node/audit.py)."""
    status = None
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    finally:
        log_ = request.app.get(AUDIT)
        if log_ is not None:
            record_audit(log_, request, status)


def record_audit(audit_log: AuditLog, request: web.Request, status: int | None) -> None:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    mutation = request.method not in ("GET", "HEAD", "OPTIONS") and auth_module.scope_of(request.method, route) != "read"
    denied = status in (401, 403, 429)
    if not (mutation or denied):
        return
    p = request.get(auth_module.PRINCIPAL)
    audit_log.record(
        now_ms=request.app[SERVICE].clock.now_ms(), source=request.remote,
        token=p.id if p is not None else request.get(auth_module.CLAIMED), role=p.role if p is not None else None,
        method=request.method, route=route, target=dict(request.match_info), status=status,
        auth="denied" if denied else "allowed",
        request_id=request.headers.get("Idempotency-Key") or request.headers.get("X-Request-Id"))


async def _json_body(request: web.Request):
    raw = await request.read()
    if not raw:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None


def _rid(request: web.Request) -> str | None:
    rid = request.headers.get("Idempotency-Key") or request.headers.get("X-Request-Id")
    if rid is not None and (not rid or len(rid) > limits.request_id_chars_max):
        raise BadRequest(f"Idempotency-Key must be 1-{limits.request_id_chars_max} characters", field="Idempotency-Key")
    return rid


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        v = int(text)
    except ValueError:
        raise BadRequest(f"must be an integer between {lo} and {hi}", field=name) from None
    if not lo <= v <= hi:
        raise BadRequest(f"must be between {lo} and {hi}", field=name)
    return v


def _bool_param(request: web.Request, name: str) -> bool:
    text = request.query.get(name, "false").lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise BadRequest("must be true or false", field=name)
    return text in ("true", "1", "yes")


def _label_params(request: web.Request) -> dict:
    """``?label=KEY=VALUE``, repeatable (every one must match): the labels a job list is
    filtered on. :raises BadRequest: naming ``label``."""
    items = request.query.getall("label", [])
    if len(items) > limits.job_labels_max:
        raise BadRequest(f"at most {limits.job_labels_max} label filters", field="label")
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise InvalidSpec("must be KEY=VALUE, e.g. label=raftsched.app=billing", field="label")
            check_label_key(key, "label")
            check_label_value(value, "label")
        except InvalidSpec as e:
            raise BadRequest(e.message, field="label") from None
        if out.get(key, value) != value:
            raise BadRequest(f"label {key!r} is given twice with different values", field="label")
        out[key] = value
    return out


def _state_param(request: web.Request) -> str | None:
    s = request.query.get("state")
    if s is not None and s not in RUN_STATES:
        raise BadRequest(f"must be one of {', '.join(RUN_STATES)}", field="state")
    return s


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
    app = web.Application(middlewares=[audit_middleware, errors_middleware, auth_middleware],
                          client_max_size=node_limits.request_bytes_max)
    app[SERVICE] = service
    app[TOKEN] = token or ""
    app[AUTH] = auth if auth is not None else Auth(token or "", service.read, service.clock)
    if audit is not None:
        app[AUDIT] = audit
    for key, value in ((TRIGGER, trigger), (WORKER, worker), (METRICS, metrics)):
        if value is not None:
            app[key] = value
    app[FLEET] = fleet if fleet is not None else Fleet(service.raft, service.clock, service.node_id)
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/v1/cluster", cluster)
    r.add_get("/metrics", metrics_text)
    r.add_get("/v1/jobs", list_jobs)
    r.add_post("/v1/jobs:batch", put_jobs_batch)
    r.add_put("/v1/jobs/{name}", put_job)
    r.add_get("/v1/jobs/{name}", get_job)
    r.add_delete("/v1/jobs/{name}", delete_job)
    r.add_post("/v1/jobs/{name}/pause", pause_job)
    r.add_post("/v1/jobs/{name}/resume", resume_job)
    r.add_post("/v1/jobs/{name}/trigger", trigger_job)
    r.add_get("/v1/jobs/{name}/runs", job_runs)
    r.add_get("/v1/jobs/{name}/preview", preview_job)
    r.add_post("/v1/jobs/{name}/explain", explain_job)
    r.add_post("/v1/preview", preview_spec)
    r.add_get("/v1/queues", list_queues)
    r.add_put("/v1/queues/{name}", put_queue)
    r.add_get("/v1/tenants", list_tenants)
    r.add_put("/v1/tenants/{name}", put_tenant)
    r.add_delete("/v1/tenants/{name}", delete_tenant)
    r.add_get("/v1/dlq", list_dlq)
    r.add_get("/v1/dlq/{run}", get_dlq)
    r.add_post("/v1/dlq/{run}/requeue", dlq_requeue)
    r.add_delete("/v1/dlq/{run}", dlq_delete)
    r.add_get("/v1/locks/{name}", get_lock)
    r.add_post("/v1/locks/{name}/acquire", lock_acquire)
    r.add_post("/v1/locks/{name}/renew", lock_renew)
    r.add_post("/v1/locks/{name}/release", lock_release)
    r.add_get("/v1/runs", list_runs)
    r.add_get("/v1/runs/{run}", get_run)
    # Backfills and bulk dead-letter operations (node/backfills.py)
    app[BACKFILLS] = BackfillService(service)
    r.add_post("/v1/jobs/{name}/backfills", create_backfill)
    r.add_get("/v1/backfills", list_backfills)
    r.add_get("/v1/backfills/{id}", get_backfill)
    r.add_post("/v1/backfills/{id}/{action:pause|resume|cancel}", control_backfill)
    r.add_post("/v1/dlq:requeue", dlq_bulk_requeue)
    r.add_post("/v1/dlq:purge", dlq_bulk_purge)
    # The worker fleet (docs/api.md, "The worker protocol" and "Workers"): the protocol a
    # `raftsched worker` speaks (lease, heartbeat, complete, release), then the admin routes.
    # A worker id may hold a "/": it is sent percent-encoded, and routes match the raw path.
    r.add_post("/v1/workers/{id}/lease", worker_lease)
    r.add_post("/v1/workers/{id}/heartbeat", worker_heartbeat)
    r.add_post("/v1/workers/{id}/complete", worker_complete)
    r.add_post("/v1/workers/{id}/release", worker_release)
    r.add_get("/v1/workers", list_workers)
    r.add_get("/v1/workers/{id}", get_worker)
    r.add_post("/v1/workers/{id}/drain", drain_worker)
    auth_module.add_routes(r)
    return app


async def metrics_text(request: web.Request) -> web.Response:
    m = request.app.get(METRICS)
    if m is None:
        raise NotFound("metrics are not enabled on this node")
    return web.Response(body=m.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def healthz(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    st = svc.raft.status()
    ok = st.get("leader") is not None
    return web.json_response({"ok": ok, "role": st.get("role"), "leader": st.get("leader")},
                             status=200 if ok else 503, headers={} if ok else {"Retry-After": "1"})


async def cluster(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    st = svc.raft.status()
    want_hash = _bool_param(request, "hash")
    # The hash is opt-in (it encodes the whole state); with it, the count of commands it reflects,
    # read in the same query, so two replicas with equal state_applied must have equal hashes (I1).
    c = svc.read(queries.counts, want_hash)
    body = {
        "node": svc.node_id, "role": st.get("role"), "leader": st.get("leader"),
        "term": st.get("term"), "commit_index": st.get("commit_index"),
        "last_applied": st.get("last_applied"), "members": st.get("members"),
        "pid": os.getpid(), "raft": st.get("self"), "jobs": c["jobs"], "runs": c["runs"],
        "state_now_ms": c["now_ms"],
    }
    if want_hash:
        body["state_hash"], body["state_applied"] = c["state_hash"], c["applied"]
    repl = st.get("replication")
    if repl is not None:
        # How this node's log keeps up, each follower's as the leader sees it, and the
        # conditions (cluster.follower_stalled) they imply: docs/api.md, docs/operations.md.
        body["replication"] = {k: repl[k] for k in ("commit_stalled_s", "leader_commit_index",
                                                    "followers")}
        body["conditions"] = repl["conditions"]
    else:
        body["conditions"] = []
    worker = request.app.get(WORKER)
    if worker is not None:
        body["worker"] = worker.stats()
    trigger = request.app.get(TRIGGER)
    if trigger is not None:
        ts = trigger.stats()
        body["trigger"] = {"fires_proposed": ts["fires_proposed"], "slots_fired": ts["slots_fired"]}
    return web.json_response(body)


async def list_jobs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.jobs_page_max)
    return web.json_response(svc.list_jobs(limit, request.query.get("after"), _label_params(request)))


async def put_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    body = await _json_body(request)
    create_only = request.headers.get("If-None-Match") == "*"
    res = await svc.put_job(request.match_info["name"], body, _rid(request), create_only=create_only)
    return web.json_response(res, status=201 if res["created"] else 200)


async def put_jobs_batch(request: web.Request) -> web.Response:
    """Create or replace many jobs; the body may be up to batch_request_bytes_max."""
    svc = request.app[SERVICE]
    limit = limits.batch_request_bytes_max
    too_large = web.json_response(
        {"error": {"code": "too_large", "message": f"request body larger than {limit} bytes; send at most "
                   f"{limits.batch_jobs_max} jobs per request", "field": None}}, status=413)
    if request.content_length is not None and request.content_length > limit:
        return too_large
    try:
        body = await _json_body(request.clone(client_max_size=limit))
    except web.HTTPRequestEntityTooLarge:
        return too_large
    return web.json_response(await svc.put_jobs(body, _rid(request)))


async def get_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.get_job(request.match_info["name"]))


async def delete_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.delete_job(request.match_info["name"], _rid(request)))


async def pause_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.pause_job(request.match_info["name"], _rid(request)))


async def resume_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    catch_up = _bool_param(request, "catch_up")
    return web.json_response(await svc.resume_job(request.match_info["name"], _rid(request), catch_up))


async def trigger_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    if await request.read():  # a payload override or a slot: node/backfills.py
        status, body = await request.app[BACKFILLS].trigger(request.match_info["name"], await _json_body(request),
                                                            _rid(request))
        return web.json_response(body, status=status)
    return web.json_response(await svc.trigger_job(request.match_info["name"], _rid(request)), status=201)


async def job_runs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, limits.history_per_job_max + limits.queue_depth_max)
    slot = request.query.get("slot")
    slot_ms = parse_slot_param(slot) if slot is not None else None
    return web.json_response(svc.job_runs(request.match_info["name"], limit, _state_param(request), slot_ms))


async def list_runs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    return web.json_response(svc.list_runs(_state_param(request), limit))


async def get_run(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.get_run(request.match_info["run"]))


async def preview_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    count = _int_param(request, "count", 10, 1, limits.preview_count_max)
    after = request.query.get("after")
    after_ms = parse_slot_param(after) if after is not None else None
    return web.json_response(svc.preview_job(request.match_info["name"], count, after_ms))


async def preview_spec(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    count = _int_param(request, "count", 10, 1, limits.preview_count_max)
    return web.json_response(svc.preview_spec(await _json_body(request), count))


async def explain_job(request: web.Request) -> web.Response:
    """Read-only (it proposes nothing): scope read."""
    svc = request.app[SERVICE]
    return web.json_response(svc.explain_job(request.match_info["name"], await _json_body(request)))


async def list_queues(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.list_queues())


async def put_queue(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.put_queue(request.match_info["name"], await _json_body(request), _rid(request)))


async def list_tenants(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.list_tenants())


async def put_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.put_tenant(request.match_info["name"], await _json_body(request), _rid(request)))


async def delete_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.delete_tenant(request.match_info["name"], _rid(request)))


async def list_dlq(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    limit = _int_param(request, "limit", 100, 1, node_limits.runs_page_max)
    return web.json_response(svc.list_dlq(request.query.get("queue"), limit))


async def get_dlq(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.get_dlq(request.match_info["run"]))


async def dlq_requeue(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.dlq_requeue(request.match_info["run"], _rid(request)))


async def dlq_delete(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.dlq_delete(request.match_info["run"], _rid(request)))


async def get_lock(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(svc.get_lock(request.match_info["name"]))


async def lock_acquire(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.lock_acquire(request.match_info["name"], await _json_body(request), _rid(request)))


async def lock_renew(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.lock_renew(request.match_info["name"], await _json_body(request), _rid(request)))


async def lock_release(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response(await svc.lock_release(request.match_info["name"], await _json_body(request), _rid(request)))


# ------------------------------------------------------------------ backfills and bulk DLQ operations
_BACKFILL_KINDS = ("backfill", "requeue", "purge")
_BACKFILL_STATES = ("running", "paused", "done", "cancelled")


def _choice_param(request: web.Request, name: str, choices: tuple) -> str | None:
    v = request.query.get(name)
    if v is not None and v not in choices:
        raise BadRequest(f"must be one of {', '.join(choices)}", field=name)
    return v


async def create_backfill(request: web.Request) -> web.Response:
    status, body = await request.app[BACKFILLS].create(request.match_info["name"], await _json_body(request),
                                                       _rid(request))
    return web.json_response(body, status=status)


async def list_backfills(request: web.Request) -> web.Response:
    await request.app[SERVICE].read_barrier(_bool_param(request, "consistent"))
    return web.json_response(request.app[BACKFILLS].list(
        _choice_param(request, "kind", _BACKFILL_KINDS), request.query.get("job"),
        _choice_param(request, "state", _BACKFILL_STATES)))


async def get_backfill(request: web.Request) -> web.Response:
    await request.app[SERVICE].read_barrier(_bool_param(request, "consistent"))
    return web.json_response(request.app[BACKFILLS].get(request.match_info["id"]))


async def control_backfill(request: web.Request) -> web.Response:
    return web.json_response(await request.app[BACKFILLS].control(
        request.match_info["id"], request.match_info["action"], _rid(request)))


async def _dlq_bulk(request: web.Request, action: str) -> web.Response:
    raw = await request.read()
    body = await _json_body(request) if raw else {}
    status, out = await request.app[BACKFILLS].dlq_bulk(action, body, _rid(request))
    return web.json_response(out, status=status)


async def dlq_bulk_requeue(request: web.Request) -> web.Response:
    return await _dlq_bulk(request, "requeue")


async def dlq_bulk_purge(request: web.Request) -> web.Response:
    return await _dlq_bulk(request, "purge")


# ------------------------------------------------------------------ the worker fleet
async def worker_lease(request: web.Request) -> web.StreamResponse:
    """A long-poll: answered when runs were granted, or with none after ``wait_s``. Runs granted
    for a client that can no longer be answered are given back at once (release)."""
    fleet = request.app[FLEET]
    wid = request.match_info["id"]
    res = await fleet.lease(wid, await _json_body(request),
                            alive=lambda: request.transport is not None and not request.transport.is_closing(),
                            tenants=_tenants_of(request))
    resp = web.json_response(res)
    if not res["runs"]:
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


def _tenants_of(request: web.Request) -> frozenset | None:
    """The tenants the request's token is limited to, or None (every tenant)."""
    p = request.get(auth_module.PRINCIPAL)
    return None if p is None else p.tenants


async def worker_heartbeat(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return web.json_response(await fleet.heartbeat(request.match_info["id"], await _json_body(request),
                                                   tenants=_tenants_of(request)))


async def worker_complete(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return web.json_response(await fleet.complete(request.match_info["id"], await _json_body(request), _rid(request),
                                                  tenants=_tenants_of(request)))


async def worker_release(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return web.json_response(await fleet.release(request.match_info["id"], await _json_body(request), _rid(request),
                                                 tenants=_tenants_of(request)))


async def list_workers(request: web.Request) -> web.Response:
    svc, fleet = request.app[SERVICE], request.app[FLEET]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(fleet.list_workers())


async def get_worker(request: web.Request) -> web.Response:
    svc, fleet = request.app[SERVICE], request.app[FLEET]
    await svc.read_barrier(_bool_param(request, "consistent"))
    return web.json_response(fleet.get_worker(request.match_info["id"]))


async def drain_worker(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return web.json_response(await fleet.drain(request.match_info["id"], _rid(request)))


#: POST handlers that propose nothing (a spec's preview, an outage's explanation): no token.
READ_ONLY_POSTS = frozenset({preview_spec, explain_job})
