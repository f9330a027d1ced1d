"""Notifications on the node (docs/notifications.md): the sinks' API and the leader's delivery.

The API: ``PUT/GET/DELETE /v1/sinks/{name}``, ``GET /v1/sinks``, ``GET /v1/sinks/{name}/dead`` and
``POST /v1/sinks/{name}/dead:requeue``. An admin may write any sink; an operator only a sink
limited to a tenant (``"tenant"``), and a token limited to tenants only a sink of one of theirs.
Secret values are sealed before the proposal and shown redacted by every read, as a job's
(node/redact.py, raftsched/sealing.py: the sink's values are sealed at ``sink:<name>``).

Delivery: while this node leads, one task a sink (``Notifier.run_while_leading``, a task of
the trigger's leadership, beside the firing loop, never inside it nor inside a request) reads the
sink's next events from its committed cursor, sends each (retried with backoff up to the sink's
``retry.max_attempts``; the event's id as ``Idempotency-Key``), and commits the cursor, the
requeued events done and the events refused past the budget (its dead list) in one
``sink_progress`` command a batch. A new leader starts from the committed cursor: events sent and
not yet committed are sent again, with the same id (at least once).
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import smtplib
import socket
import ssl
import time
from collections import Counter
from datetime import datetime, timezone
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any, Awaitable, Callable
from urllib.parse import quote, urlsplit

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from yarl import URL

from .. import sealing
from .walks import off_loop
from ..core import commands, events, limits, network as net_policy, notify as core_notify, notify_queries, queries
from ..core.bodies import check_body
from ..core.errors import Conflict, Forbidden, InvalidSpec, LimitExceeded, NotFound
from ..core.notify_model import validate_sink
from ..core.tenants import DEFAULT_POLICY
from ..proposer import Proposer
from ..worker import limits as worker_limits
from ..worker.executors.http import _Pinned, checked_addresses
from ..worker.masking import mask
from .http import PRINCIPAL, SERVICE, int_param, json_body, json_response, optional_json_body, rid, tenants_of
from .redact import restore_redacted
from .routes import CONSISTENT, STALE, Param, Route, Tenancy

log = logging.getLogger("raftsched.notify")

#: Events a batch reads per sink, and how long an idle sink's task waits before it looks again.
BATCH = 50
IDLE_S = 0.2
#: One delivery attempt's bound (connect, send, answer).
SEND_TIMEOUT_S = 10.0
#: Delivery latency buckets (seconds), from the event's commit to its acceptance.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
#: How often the leader looks for runs waiting too long for a worker (run.unplaceable).
UNPLACEABLE_CHECK_S = 5.0
#: Candidates of that look decided under one hold of the replica's lock (a few ms).
OVERDUE_SLICE = 5_000
SIGNATURE_HEADER = "X-Raftsched-Signature"
TIMESTAMP_HEADER = "X-Raftsched-Timestamp"


def _place(name: str, key: str) -> bytes:
    return sealing.place("sink:" + name, ("secrets",), key)


# ------------------------------------------------------------------ the API
def _check_access(request: web.Request, spec: dict | None) -> None:
    """An admin writes any sink; anyone else only a sink limited to one of its tenants.
    :raises Forbidden:"""
    p = request.get(PRINCIPAL)
    if p is None or p.role == "admin":
        return
    tenant = None if spec is None else spec.get("tenant")
    if tenant is None:
        raise Forbidden(f"{'an' if p.role[:1] in 'aeiou' else 'a'} {p.role} token may write only a sink limited to a tenant (\"tenant\"); a sink for the "
                        "whole cluster is an admin's", field="tenant")
    if p.tenants is not None and tenant not in p.tenants:
        raise Forbidden(f"this token may write sinks of tenants {', '.join(sorted(p.tenants))} only",
                        field="tenant")


def _visible(request: web.Request, spec: dict) -> bool:
    only = tenants_of(request)
    return only is None or spec.get("tenant") in only


def sink_view(rec: dict, fp) -> dict:
    spec = rec["spec"]
    out = dict(spec)
    if isinstance(spec.get("secrets"), dict):
        out["secrets"] = {k: fp.of_stored(v) for k, v in spec["secrets"].items()}
    if isinstance(spec.get("retry"), dict) and "outage_s" not in spec["retry"]:
        # stored before the field was: delivered with its default, shown so
        out["retry"] = dict(spec["retry"], outage_s=limits.sink_outage_s_default)
    return {"name": rec["name"], "spec": out, "cursor": rec["cursor"], "behind": rec["behind"],
            "dead": rec["dead"], "requeued": rec["redo"]}


def _stored(svc, name: str, request: web.Request) -> dict:
    rec = svc.read(core_notify.sink_record, name)
    if rec is None or not _visible(request, rec["spec"]):
        raise NotFound(f"no sink named {name!r}", field="name")
    return rec


async def put_sink(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    name = request.match_info["name"]
    body = await json_body(request)
    old = svc.read(core_notify.sink_record, name)
    # A sink this token may not see (another tenant's, the cluster's) is answered as a job is
    # (node/tenancy.py): the body validated and the token's own rules checked as for a free
    # name, and only then 409, the name taken (names are the cluster's), nothing more of it.
    hidden = old is not None and not _visible(request, old["spec"])
    if old is not None and not hidden:
        _check_access(request, old["spec"])
    spec = restore_redacted(validate_sink(name, body), lambda: old["spec"] if old and not hidden else None,
                            svc.fingerprint)
    _check_access(request, spec)
    if hidden:
        raise Conflict(f"the sink name {name!r} is taken", field="name")
    warnings = policy_warnings(spec, svc.read(_allowed, spec.get("tenant")))
    if old is None and len(svc.read(core_notify.sink_names)) >= limits.sinks_max:
        # apply's refusal, before anything is proposed: a first seal may name the cluster's key
        raise LimitExceeded(f"the cluster holds {limits.sinks_max} sinks, its limit", field="name")
    if sealing.has_clear(spec):
        spec = sealing.seal_spec(spec, "sink:" + name, svc.keyring, await svc.seal_key(), svc.fingerprint.digest)
    res = await svc.propose(commands.put_sink(svc.clock.now_ms(), rid(request), name=name, spec=spec))
    rec = svc.read(core_notify.sink_record, name)
    out = svc._out(res, sink_view(rec, svc.fingerprint) if rec else {"name": name})
    if warnings:
        out["warnings"] = warnings
    return json_response(out, status=201 if res.get("created") else 200)


def _allowed(s, tenant) -> list[str] | None:
    """The networks a sink of ``tenant`` may reach beyond the public ones (its tenant's policy,
    else DEFAULT_POLICY's), as delivery reads them (``Notifier._allow``); None: no tenant, no
    policy holds the sink."""
    if tenant is None:
        return None
    pol = s.tenant_policies.get(tenant) or DEFAULT_POLICY
    return list(pol.get("allow") or ())


def policy_warnings(spec: dict, allow: list[str] | None) -> list[str]:
    """For a sink limited to a tenant (``allow``: its policy's networks), a line for each address
    it names as an IP address literal (``url``, ``smtp.host``, a slack ``secrets.url`` in clear)
    that the tenant's network policy refuses: delivery would refuse every event (``_send``).
    A host name is not resolved here (its addresses are delivery's to check, each time); the
    policy may change before delivery, so this warns, it does not refuse. A secret URL's address
    is not repeated."""
    if allow is None:
        return []
    tenant = spec.get("tenant")
    hosts: list[tuple[str, str | None, bool]] = []  # (field, host, secret)
    if spec.get("type") == "email":
        hosts.append(("smtp.host", (spec.get("smtp") or {}).get("host"), False))
    elif spec.get("type") == "slack":
        url = (spec.get("secrets") or {}).get("url")
        hosts.append(("secrets.url", _host(url) if isinstance(url, str) else None, True))
    else:
        hosts.append(("url", _host(spec.get("url")), False))
    out = []
    for field, host, secret in hosts:
        if not isinstance(host, str):
            continue
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            continue  # a name: resolved and checked at delivery
        what = net_policy.refused_as(host, allow)
        if what is not None:
            shown = f"its address is {what}" if secret else f"{host} is {what}"
            out.append(f"{field}: {shown}, which the network policy of tenant {tenant!r} refuses: delivery will "
                       f"refuse every event (dead: refused by the network policy); an admin may allow the network "
                       f"(network.allow in PUT /v1/tenants/{tenant})")
    return out


async def get_sink(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(sink_view(_stored(svc, request.match_info["name"], request), svc.fingerprint))


async def list_sinks(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    out = []
    for name in svc.read(core_notify.sink_names):
        rec = svc.read(core_notify.sink_record, name)
        if rec is not None and _visible(request, rec["spec"]):
            out.append(sink_view(rec, svc.fingerprint))
    return json_response({"sinks": out})


async def delete_sink(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    name = request.match_info["name"]
    if not svc.read(queries.request_was, rid(request), f"delete_sink:{name}"):  # (a retry of this delete replays)
        rec = _stored(svc, name, request)
        _check_access(request, rec["spec"])
    res = await svc.propose(commands.delete_sink(svc.clock.now_ms(), rid(request), name=name))
    return json_response(svc._out(res, {"sink": name, "deleted": True}))


async def sink_dead(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    name = request.match_info["name"]
    limit = int_param(request, "limit", 100, 1, 1000)
    rec = _stored(svc, name, request)
    dead = svc.read(core_notify.sink_dead, name, limit) or []
    # Masked again as it is read: an error kept by a version that did not mask (a slack sink's
    # URL in an aiohttp error), or before a secret it holds was set, shows none of it now; one
    # whose secrets cannot be unsealed shows only the error's kind.
    secrets = clear_secrets(svc.keyring, name, rec["spec"])

    def shown(error):
        if not isinstance(error, str) or not isinstance(secrets, dict):
            return None if error is None else str(error).split(":", 1)[0][:ERROR_CHARS_MAX]
        return scrub(error, rec["spec"], secrets)
    return json_response({"sink": name, "dead": [
        {"event": events.view(d["event"]), "error": shown(d["error"]), "attempts": d["attempts"], "at": d["at"]}
        for d in dead]})


async def sink_requeue(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    name = request.match_info["name"]
    body = await optional_json_body(request, {})
    rec = _stored(svc, name, request)
    _check_access(request, rec["spec"])
    ids = check_body(body, {"events"}).get("events")  # (an unknown field is named: 422)
    if "events" in body and (not isinstance(ids, list) or len(ids) > 1000
                             or not all(isinstance(x, str) and len(x) <= 32 for x in ids)):
        raise InvalidSpec("must be a list of at most 1000 event ids (\"ev-17\"); send {} for every dead event",
                          field="events")
    res = await svc.propose(commands.sink_requeue(svc.clock.now_ms(), rid(request), name=name, events=ids))
    return json_response(svc._out(res, {"sink": name, "requeued": res.get("requeued", 0)}))


_LIMIT = Param("limit", "integer", "at most this many, newest first", default=100, lo=1, hi=1000)

#: The rows of the route table (node/routes.py).
SINK_ROUTES = (
    Route("GET", "/v1/sinks", list_sinks, "read", Tenancy.FILTERED, "every sink (secrets redacted)",
          params=(STALE, CONSISTENT), response="sinks"),
    Route("PUT", "/v1/sinks/{name}", put_sink, "jobs.write", Tenancy.CHECKED,
          "create (201) or replace (200) a sink", body="sink", ok=201, also_ok=(200,), errors=(403, 409, 422), response="sink_written"),
    Route("GET", "/v1/sinks/{name}", get_sink, "read", Tenancy.CHECKED, "a sink and its delivery cursor",
          params=(STALE, CONSISTENT), errors=(404,), response="sink"),
    Route("DELETE", "/v1/sinks/{name}", delete_sink, "jobs.write", Tenancy.CHECKED, "delete a sink",
          errors=(403, 404), response="sink_deleted"),
    Route("GET", "/v1/sinks/{name}/dead", sink_dead, "read", Tenancy.CHECKED,
          "the events a sink refused past its retry budget", params=(STALE, CONSISTENT, _LIMIT), errors=(404,), response="sink_dead"),
    Route("POST", "/v1/sinks/{name}/dead:requeue", sink_requeue, "jobs.write", Tenancy.CHECKED,
          "deliver a sink's dead events again", body="sink_requeue", body_optional=True, errors=(403, 404, 422), response="sink_requeued"),
)


# ------------------------------------------------------------------ messages
def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _link(spec: dict, body: dict) -> str | None:
    base = spec.get("link")
    if not base:
        return None
    if body.get("run_id"):
        return base.rstrip("/") + "/v1/runs/" + quote(body["run_id"], safe="")
    if body.get("job"):
        return base.rstrip("/") + "/v1/jobs/" + quote(body["job"], safe="")
    return base


def one_line(body: dict) -> str:
    """An event as one readable line (slack, an email's subject, PagerDuty's summary)."""
    parts = [body["kind"]]
    if body.get("job"):
        parts.append(f"job {body['job']}" + (f" ({body['tenant']})" if body.get("tenant") else ""))
    if body.get("slot") is not None:
        parts.append(f"slot {_iso(body['slot'])}")
    if body.get("attempt") is not None:
        parts.append(f"attempt {body['attempt']}")
    if isinstance(body.get("deadline"), str):  # which deadline, and its instant (deadline.missed, .late)
        at = body.get("instant")
        parts.append(f"its {body['deadline']}" + (f" at {_iso(at)}" if isinstance(at, int) else ""))
    for k in ("worker", "node", "gap_ms", "consecutive_failures", "failures"):
        if body.get(k) is not None:
            parts.append(f"{k.replace('_', ' ')} {body[k]}")
    line = ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    if body.get("reason"):
        line += f": {body['reason']}"
        if body["kind"] == "slot.missed" and body.get("error"):
            line += f" ({body['error']})"  # which rule, which parent: the reason's words
    # One line whatever the reason holds (a worker's error is often a traceback): an email's
    # subject may hold no line break, and a chat line or a summary reads better without.
    return " ".join(line.split())[:500]


def sign(key: str, timestamp: str, data: bytes) -> str:
    """The webhook signature: ``sha256=`` HMAC-SHA256 over ``timestamp + "." + body``."""
    return "sha256=" + hmac.new(key.encode(), timestamp.encode() + b"." + data, hashlib.sha256).hexdigest()


#: A delivery error kept (in the dead list) and logged is cut to this many characters, after
#: its secrets are masked (a cut first could leave part of one that no longer matches).
ERROR_CHARS_MAX = 300


def _host(url: str | None) -> str | None:
    try:
        return urlsplit(url).hostname if url else None
    except ValueError:
        return None


def _target(spec: dict, secrets) -> str | None:
    """The URL a sink is sent to (a slack sink's is its secret ``url``), or None (email)."""
    if spec.get("type") == "slack":
        return secrets.get("url") if isinstance(secrets, dict) else None
    return spec.get("url")


#: aiohttp's exceptions whose message may hold a URL: an invalid or non-http one (a redirect's
#: too), and a response's (its request's URL).
_NAMES_URL = (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError, aiohttp.RedirectClientError,
              aiohttp.ClientResponseError)


def exc_error(e: BaseException, url: str | None) -> str:
    """An exception of a delivery attempt as its error: ``Class: message``, except for one that
    may carry a URL (_NAMES_URL), which is told by its class and the host of the URL the sink is
    sent to, only: a slack sink's URL is its secret."""
    if isinstance(e, _NAMES_URL):
        host = _host(url)
        return f"{type(e).__name__}" + (f" (host {host})" if host else "")
    return f"{type(e).__name__}: {e}"


def secret_texts(spec: dict, secrets) -> list[str]:
    """What a sink's delivery errors are masked of, longest first: its secret values in clear
    and, for a slack sink, its URL as given and as yarl writes it, and the URL's path and query
    (the part that is the secret), whole and each part of the path alone."""
    vals: set[str] = set()
    if isinstance(secrets, dict):
        vals.update(v for v in secrets.values() if isinstance(v, str))
        url = secrets.get("url") if spec.get("type") == "slack" else None
        if isinstance(url, str):
            try:
                parsed = URL(url)
                vals.update((str(parsed), parsed.raw_path_qs, parsed.path_qs))
            except Exception:  # (not a URL yarl reads: masked as it is)
                pass
            try:
                u = urlsplit(url)
            except ValueError:
                u = None
            if u is not None:
                path = u.path + ("?" + u.query if u.query else "")
                vals.update((path, path.lstrip("/"), u.query))
                vals.update(u.path.split("/"))  # (each part alone too: a token is one)
    return sorted((v for v in vals if len(v) >= worker_limits.mask_chars_min and v != "/"), key=len, reverse=True)


def clear_secrets(keyring: sealing.KeyRing, name: str, spec: dict) -> dict[str, str] | str:
    """Sink ``name``'s secret values in clear, or why they cannot be had: ``Unreachable`` when
    this node's key ring lacks the key (a key file not copied to it: the node's fault, not the
    sink's, so its events wait as for a sink that cannot be reached, and go out once the file is
    there, where they went to the dead list after their attempts), else a refusal."""
    out = {}
    for k, v in (spec.get("secrets") or {}).items():
        if isinstance(v, str):
            out[k] = v
            continue
        try:
            out[k] = keyring.unseal(v, _place(name, k))
        except sealing.KeyMissing as e:
            return Unreachable(f"sink secret {k} cannot be unsealed on this node: {e} (docs/operations.md, "
                               "\"Key files\")")
        except sealing.SealError as e:
            return f"sink secret {k} cannot be unsealed: {e}"
    return out


def scrub(error: str | None, spec: dict, secrets) -> str | None:
    """``error`` with the sink's secrets masked (``***``), then cut to ERROR_CHARS_MAX."""
    if error is None:
        return None
    return (mask(error, secret_texts(spec, secrets)) or "")[:ERROR_CHARS_MAX]


_SEVERITY = {"run.dead": "error", "deadline.missed": "error", "cluster.no_leader": "error", "worker.lost": "warning",
             "slot.missed": "warning", "run.failed": "warning", "deadline.late": "warning",
             "run.unplaceable": "warning"}


def pagerduty_message(spec: dict, routing_key: str, body: dict) -> dict[str, Any]:
    """The Events API v2 message of event ``body``: a ``trigger`` keyed ``TENANT/JOB`` (a job's
    failures are one incident), or for ``job.recovered`` the ``resolve`` of that key. An event
    that reports no failure (a success, a pause, a trigger: severity ``info``) routed here is an
    incident of its own kind, ``TENANT/JOB/KIND``: under the job's key it reopened, or added to,
    the failure's incident that job.recovered resolves."""
    dedup = f"{body.get('tenant') or '-'}/{body.get('job') or body['kind']}"
    if body["kind"] == "job.recovered":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup}
    if body["kind"] not in _SEVERITY:
        dedup = f"{dedup}/{body['kind']}"
    elif body["kind"] == "worker.lost" and isinstance(body.get("worker"), str):
        # One incident a worker: under "-/worker.lost" every worker's loss folded into the first
        # one's incident, still open (nothing resolves it), and paged no one again (a walk).
        dedup = f"{dedup}/{body['worker']}"
    msg: dict[str, Any] = {
        "routing_key": routing_key, "event_action": "trigger", "dedup_key": dedup,
        "payload": {"summary": one_line(body)[:1024], "source": "raftsched",
                    "severity": _SEVERITY.get(body["kind"], "info"), "timestamp": _iso(body["at"]),
                    "component": body.get("job") or "cluster", "group": body.get("tenant") or "cluster",
                    "class": body["kind"], "custom_details": body}}
    link = _link(spec, body)
    if link:
        msg["links"] = [{"href": link, "text": body.get("run_id") or body.get("job") or "raftsched"}]
    return msg


class Notifier:
    """The leader's delivery (module docstring), and its counters for /metrics."""

    def __init__(self, raft, clock, keyring: sealing.KeyRing, proposer: Proposer | None = None) -> None:
        self.raft, self.clock, self.keyring = raft, clock, keyring
        self.proposer = proposer or Proposer(raft)
        self.delivered: Counter = Counter()  # (sink, kind) -> events accepted
        self.dead: Counter = Counter()       # (sink, kind) -> events given up
        self.attempts_failed: Counter = Counter()  # sink -> attempts refused
        self.lost: Counter = Counter()  # sink -> events the outbox gave up before it was sent them (at most)
        self._lost_at: dict[str, int] = {}
        #: sink -> when (ms) its outage began: an attempt that could not reach it, none taken since
        self._unreachable: dict[str, int] = {}
        self._latency: list[int] = [0] * (len(LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._unplaceable_checked_ms = 0

    # -------------------------------------------------------------- the loop
    async def run_while_leading(self) -> None:
        """One task a sink while this node leads (the trigger cancels this on a lost term)."""
        tasks: dict[str, asyncio.Task] = {}
        self._session = aiohttp.ClientSession()
        try:
            while True:
                try:
                    await self._supervise(tasks)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a failed look is retried, never the end of delivery this term
                    log.warning("notify: %s: %s", type(e).__name__, e)
                await asyncio.sleep(IDLE_S * 5)
        finally:
            for t in tasks.values():
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks.values(), return_exceptions=True)
            await self._session.close()
            self._session = None
            self._unreachable.clear()

    async def _supervise(self, tasks: dict[str, asyncio.Task]) -> None:
        """One look: a task for each sink (again for one that ended), and overdue unplaceable runs."""
        names = set(self.raft.read(core_notify.sink_names))
        for name in list(tasks):
            if name not in names or tasks[name].done():
                t = tasks.pop(name)
                t.cancel()
                if t.done() and not t.cancelled() and t.exception() is not None:
                    log.error("notify: sink %s's delivery failed: %r", name, t.exception())
        for name in names - set(tasks):
            tasks[name] = asyncio.ensure_future(self._sink_loop(name))
        self._forget_deleted(names)
        now = self.clock.now_ms()
        if names and now - self._unplaceable_checked_ms >= UNPLACEABLE_CHECK_S * 1000:
            self._unplaceable_checked_ms = now
            # In a thread, the replica's lock held a slice at a time (core/notify_queries.py): the
            # look walks every queued run, a storm's million, beside the applies and the API.
            late, handler = await off_loop(self._unplaceable_overdue, now)
            if late:
                await self.proposer.propose(commands.note_unplaceable(now, runs=late, handler=handler))

    def _forget_deleted(self, names: set[str]) -> None:
        """Drop the counters of sinks no longer in the state: else a cluster that makes and
        deletes sinks under new names grows them (and /metrics' series) for good. A sink put again
        under the same name starts its counters from 0, as counters do after a restart."""
        for c in (self.delivered, self.dead):
            for key in [k for k in c if k[0] not in names]:
                del c[key]
        for c in (self.attempts_failed, self.lost):
            for key in [k for k in c if k not in names]:
                del c[key]
        for key in [k for k in self._unreachable if k not in names]:
            del self._unreachable[key]
        for key in [k for k in self._lost_at if k not in names]:
            del self._lost_at[key]

    def _unplaceable_overdue(self, now: int) -> tuple[list[str], list[str]]:
        """``notify_queries.unplaceable_overdue`` with the replica's lock held for the heaps' copy
        and then for ``OVERDUE_SLICE`` candidates at a time, never for the whole walk; and those of
        them that wait for a worker with their handler (the command's ``handler``)."""
        inputs = self.raft.read(notify_queries.overdue_inputs, now)
        if inputs is None:
            return [], []
        cand = notify_queries.overdue_candidates(inputs, now)
        late: list[str] = []
        for k in range(0, len(cand), OVERDUE_SLICE):
            late += self.raft.read(notify_queries.overdue_among, cand[k:k + OVERDUE_SLICE], now, inputs[2])
            if len(late) >= limits.unplaceable_runs_max:
                break
        late = late[:limits.unplaceable_runs_max]
        return late, self.raft.read(notify_queries.for_handler, late, now, inputs[2]) if late else []

    async def _sink_loop(self, name: str) -> None:
        while True:
            batch = self.raft.read(core_notify.sink_batch, name, BATCH)
            if batch is None:
                return
            if batch["cursor"] + 1 < batch["first"] and self._lost_at.get(name) != batch["cursor"]:
                # The outbox gave up events this sink had not been sent (it was further behind than
                # the outbox holds): at most this many of them were for it.
                self._lost_at[name] = batch["cursor"]
                gap = batch["first"] - 1 - batch["cursor"]
                self.lost[name] += gap
                log.error("notify: sink %s was %d events behind the outbox's oldest: those for it are lost", name, gap)
            if not batch["redo"] and not batch["events"]:
                if batch["upto"] > batch["cursor"] and batch["upto"] - batch["cursor"] >= BATCH:
                    # Events for other sinks only: move past them, rarely.
                    await self._commit(name, batch["upto"], [], [])
                await asyncio.sleep(IDLE_S)
                continue
            spec, gen = batch["spec"], batch["gen"]
            secrets = self._secrets(name, spec)
            dead: list[dict] = []
            done_redo: list[int] = []
            n_redo = len(batch["redo"])
            # A PUT that replaces the sink (its URL, key, tenant) while this batch is delivered:
            # the batch is abandoned, the cursor where it was, and read again with the new spec.
            # (A spec that differs only in how its secrets are sealed moves ``held`` instead.)
            held = [gen]
            replaced = functools.partial(self._replaced, name, spec, secrets, held)
            at = [batch["cursor"]]  # the cursor committed
            try:
                for i, ev in enumerate(batch["redo"] + batch["events"]):
                    if i < n_redo:
                        done_redo.append(ev["seq"])
                    if spec.get("tenant") is not None and ev.get("tenant") != spec["tenant"]:
                        continue  # (routed before the sink was limited to another tenant: not its)
                    cursor = at[0] if i < n_redo else max(at[0], ev["seq"] - 1)
                    ok, error, attempts = await self._deliver(
                        name, spec, secrets, ev, replaced,
                        functools.partial(self._checkpoint, name, cursor, at, done_redo, i < n_redo, dead, held))
                    if not ok:
                        dead.append({"event": ev, "error": error, "attempts": attempts})
                        self.dead[(name, ev["kind"])] += 1
            except _Replaced:
                self._unreachable.pop(name, None)
                log.info("notify: sink %s was replaced: its batch starts again with the new spec", name)
                continue
            await self._commit(name, batch["upto"], done_redo, dead, at[0], held[0])

    async def _checkpoint(self, name: str, cursor: int, at: list[int], done_redo: list[int], in_redo: bool,
                          dead: list[dict], held: list[int]) -> None:
        """Before an outage is waited out on an event: what its batch did before it is committed,
        the cursor to ``cursor`` (the outbox events before it), the requeued events done (the one
        at hand, the last of ``done_redo`` when ``in_redo``, is not), the dead; so a new leader,
        or the batch read again after a replace, starts from it, not from the batch's start, which
        a day's wait would send again. ``at[0]``: the cursor committed, moved."""
        redo = done_redo[:-1] if in_redo else list(done_redo)
        if redo or dead or cursor > at[0]:
            await self._commit(name, cursor, redo, dead, at[0], held[0])
            del done_redo[:len(redo)]
            dead.clear()
            at[0] = cursor

    def _replaced(self, name: str, spec: dict, secrets, held: list[int]) -> bool:
        """Whether sink ``name`` is no longer generation ``held[0]`` (replaced, or gone). A new
        generation whose spec is ``spec`` but for its secrets' sealed bytes, which open to the
        same ``secrets`` (a key rotation's re-seal; a PUT of the same values sealed under the
        newer key), is not a replace: ``held[0]`` becomes it, and the batch goes on (its
        progress then names it, which apply takes)."""
        gen = self.raft.read(core_notify.sink_gen, name)
        if gen == held[0]:
            return False
        record = self.raft.read(core_notify.sink_record, name)
        if gen is None or record is None or isinstance(secrets, str):
            return True
        new = record["spec"]
        if {k: v for k, v in new.items() if k != "secrets"} != {k: v for k, v in spec.items() if k != "secrets"} \
                or self._secrets(name, new) != secrets:
            return True
        held[0] = core_notify.spec_gen(new)  # (the spec read: gen above may be older by a put since)
        return False

    async def _commit(self, name: str, upto: int, redo: list[int], dead: list[dict], before: int = 0,
                      gen: int | None = None) -> None:
        """Commit a batch: the dead events first, in commands that fit (the cursor where it was,
        ``before``), then the cursor and the requeued events done. A crash in between gives the
        batch again: at least once, for the dead list too. Each command names the sink's
        generation ``gen`` the batch was read with: apply ignores it if the sink was replaced
        since (its next batch sends those events again, with the new spec)."""
        budget = limits.command_bytes_max // 2
        head: dict[str, Any] = {"sink": name} if gen is None else {"sink": name, "gen": gen}
        chunk: list[dict] = []
        size = 0
        for d in dead:
            n = len(msgpack.packb(d, use_bin_type=True))
            if n > budget:  # an event too large for a command: kept without its detail
                d = dict(d, event=dict(d["event"], detail={"cut": "too large to keep whole"}))
                n = len(msgpack.packb(d, use_bin_type=True))
            if chunk and size + n > budget:
                await self._propose_progress(dict(head, cursor=before, dead=chunk))
                chunk, size = [], 0
            chunk.append(d)
            size += n
        item: dict[str, Any] = dict(head, cursor=upto)
        if redo:
            item["redo"] = redo
        if chunk:
            item["dead"] = chunk
        await self._propose_progress(item)

    async def _propose_progress(self, item: dict) -> None:
        await self.proposer.propose(commands.sink_progress(self.clock.now_ms(), items=[item]))

    def _secrets(self, name: str, spec: dict) -> dict[str, str] | str:
        """The sink's secret values in clear, or why they cannot be had."""
        return clear_secrets(self.keyring, name, spec)

    async def _deliver(self, name: str, spec: dict, secrets, ev: dict,
                       replaced: Callable[[], bool] | None = None,
                       checkpoint: Callable[[], Awaitable[None]] | None = None) -> tuple[bool, str | None, int]:
        """Send one event, retried up to the budget, and past it while the sink cannot be
        reached, until its outage (counted from its first such attempt, whichever event's, by
        this node) has lasted ``retry.outage_s``; ``checkpoint()`` is awaited before that wait.
        :raises _Replaced: ``replaced()`` says the sink was replaced since ``spec`` was read
        (asked before each attempt and while waiting)."""
        retry = spec["retry"]
        outage_ms = retry.get("outage_s", limits.sink_outage_s_default) * 1000
        error: str | None = None
        attempt = 0
        while True:
            attempt += 1
            if replaced is not None and replaced():
                raise _Replaced
            if isinstance(secrets, Unreachable):  # this node's ring lacked a key: read again (a file copied in)
                secrets = self._secrets(name, spec)
            if isinstance(secrets, str):
                error = secrets
            else:
                try:
                    error = await self._send(name, spec, secrets, ev)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a sink's failure is its own, never the loop's
                    error = exc_error(e, _target(spec, secrets))
            if error is None:
                self.delivered[(name, ev["kind"])] += 1
                lat = max(0.0, (self.clock.now_ms() - ev["at"]) / 1000)
                i = 0
                while i < len(LATENCY_BUCKETS) and lat > LATENCY_BUCKETS[i]:
                    i += 1
                self._latency[i] += 1
                self._latency_sum += lat
                since = self._unreachable.pop(name, None)
                if since is not None and attempt > retry["max_attempts"]:
                    log.warning("notify: sink %s took event %s again, after %d attempts, its outage %.0f s long",
                                name, events.event_id(ev["seq"]), attempt, (self.clock.now_ms() - since) / 1000)
                return True, None, attempt
            unreachable = isinstance(error, Unreachable)
            # Before it is kept in the dead list (any reader's) or logged: no secret in it.
            error = scrub(error, spec, secrets)
            self.attempts_failed[name] += 1
            now = self.clock.now_ms()
            delay = min(retry["backoff_s"] * 2 ** min(attempt - 1, 32), retry["backoff_max_s"])
            if unreachable:
                self._unreachable.setdefault(name, now)  # an outage begins (until the sink answers)
            else:
                self._unreachable.pop(name, None)  # a refusal is an answer: no outage
            if attempt >= retry["max_attempts"]:
                # Past its attempts: an outage (no answer, a connection that failed, a 5xx, 408 or
                # 429) is waited out until it has lasted outage_s, the event kept at the head of
                # its sink's order; a refusal ends it in the dead list, as does an outage that
                # has lasted longer (each later event then after its attempts, until one is taken).
                since = self._unreachable.get(name) if unreachable else None
                if since is None or now - since >= outage_ms:
                    break
                if attempt == retry["max_attempts"]:
                    log.warning("notify: sink %s cannot be reached (%s): event %s is retried until %s "
                                "(retry.outage_s), the events after it wait", name, error,
                                events.event_id(ev["seq"]), _iso(since + outage_ms))
                    if checkpoint is not None:
                        await checkpoint()
                delay = max(delay, limits.sink_outage_wait_s_min)
            await _backoff(delay, replaced)
        log.warning("notify: sink %s gave up event %s after %d attempts: %s", name, events.event_id(ev["seq"]),
                    attempt, error)
        return False, error, attempt

    # -------------------------------------------------------------- the sinks
    async def _send(self, name: str, spec: dict, secrets: dict, ev: dict) -> str | None:
        """One attempt: None when the sink accepted it, else why not."""
        body = events.view(ev)
        typ = spec["type"]
        tenant = spec.get("tenant")
        if typ == "email":
            pinned = None
            if tenant is not None:  # the SMTP server too is held to the tenant's network policy
                smtp = spec["smtp"]
                host = smtp["host"]  # (an IPv6 address bracketed, unless stored so by an older check)
                host = f"[{host}]" if ":" in host and not host.startswith("[") else host
                addrs, why = await checked_addresses(f"smtp://{host}:{smtp['port']}/", self._allow(tenant), tenant)
                if addrs is None:
                    return _policy_error(why)
                pinned = addrs[0][1]
            return await asyncio.to_thread(self._send_email, spec, secrets, body, pinned)
        headers = {"Content-Type": "application/json", "Idempotency-Key": body["event_id"],
                   "User-Agent": "raftsched-notify"}
        if typ == "webhook":
            url = spec["url"]
            data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
            ts = str(self.clock.now_ms() // 1000)
            headers[TIMESTAMP_HEADER] = ts
            headers[SIGNATURE_HEADER] = sign(secrets["signing_key"], ts, data)
        elif typ == "slack":
            url = secrets["url"]
            link = _link(spec, body)
            text = one_line(body) + (f" <{link}|{body.get('run_id') or body.get('job')}>" if link else "")
            data = json.dumps({"text": text}).encode()
        else:  # pagerduty
            url = spec["url"]
            data = json.dumps(pagerduty_message(spec, secrets["routing_key"], body)).encode()
        session = self._session
        own = None
        if tenant is not None:  # a tenant's sink reaches what its http jobs may (core/network.py)
            addrs, why = await checked_addresses(url, self._allow(tenant), tenant)
            if addrs is None:
                return _policy_error(why)
            own = session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=_Pinned(addrs),
                                                                                 use_dns_cache=False))
        if session is None:
            own = session = aiohttp.ClientSession()
        try:
            async with session.post(url, data=data, headers=headers, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_S)) as resp:
                await resp.read()
                if 200 <= resp.status < 300:
                    return None
                if (resp.status >= 500 and resp.status not in (501, 505)) or resp.status in (408, 429):
                    return Unreachable(f"HTTP {resp.status}")  # (501, 505: it will never take it)
                return f"HTTP {resp.status}"
        except asyncio.TimeoutError:
            return Unreachable(f"no answer in {SEND_TIMEOUT_S:g} s")
        except (aiohttp.ClientError, OSError, ValueError) as e:
            if isinstance(e, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)) \
                    and not isinstance(e, (ValueError, aiohttp.ClientSSLError, aiohttp.ServerFingerprintMismatch,
                                           ssl.SSLError, ssl.CertificateError)):
                return Unreachable(exc_error(e, url))
            return exc_error(e, url)
        finally:
            if own is not None:
                await own.close()

    def _allow(self, tenant: str) -> list[str]:
        pol = self.raft.read(lambda s: s.tenant_policies.get(tenant)) or DEFAULT_POLICY
        return list(pol.get("allow") or ())

    def _send_email(self, spec: dict, secrets: dict, body: dict, pinned: str | None = None) -> str | None:
        smtp = spec["smtp"]
        try:
            # (inside: a header the message refuses is this event's failure, told as one)
            msg = EmailMessage()
            msg["Subject"] = "[raftsched] " + one_line(body)[:200]
            msg["From"] = smtp["from"]
            msg["To"] = ", ".join(smtp["to"])
            # RFC 5322 requires an origination date (smtplib adds none): the send time, in UTC
            msg["Date"] = format_datetime(datetime.fromtimestamp(self.clock.now_ms() / 1000, timezone.utc))
            msg["Message-ID"] = f"<{body['event_id']}.{body['at']}@raftsched>"
            msg["X-Raftsched-Event-Id"] = body["event_id"]
            msg["Idempotency-Key"] = body["event_id"]
            link = _link(spec, body)
            msg.set_content(one_line(body) + ("\n\n" + link if link else "") + "\n\n"
                            + json.dumps(body, indent=2, sort_keys=True) + "\n")
            # (the host named at construction: STARTTLS verifies the certificate for it)
            with _SMTP(pinned, smtp["host"], smtp["port"], timeout=SEND_TIMEOUT_S) as c:
                if smtp["starttls"]:
                    c.starttls(context=ssl.create_default_context())
                if secrets.get("username"):
                    c.login(secrets["username"], secrets.get("password", ""))
                c.send_message(msg)
        except (smtplib.SMTPException, OSError, ssl.SSLError, ValueError) as e:
            return Unreachable(exc_error(e, None)) if _smtp_unreachable(e) else exc_error(e, None)
        return None

    # -------------------------------------------------------------- metrics
    def collector(self):
        return _Collector(self)


class Unreachable(str):
    """An attempt's error that says the sink could not take the event now: no answer, a
    connection that could not be made or broke, a name that did not resolve, HTTP 5xx (but 501
    and 505), 408 or 429, an SMTP 4xx reply (recipients greylisted included). Past its attempts
    such an event is retried until the sink's outage has lasted ``retry.outage_s``; any other
    error (a refusal: 4xx, a certificate, a tenant's network policy, a secret that cannot be
    opened) ends it in the dead list. A secret sealed under a key this node's ring lacks is this
    node's outage, not a refusal (clear_secrets)."""


def _policy_error(why: str | None) -> str:
    """A tenant's sink's address check that failed: a name that did not resolve is an outage, an
    address the policy refuses a refusal."""
    if why is None:
        return "refused by the tenant's network policy"
    return Unreachable(why) if why.startswith("cannot resolve ") else why


def _smtp_unreachable(e: BaseException) -> bool:
    if isinstance(e, smtplib.SMTPResponseException):
        return 400 <= e.smtp_code < 500  # "try again later"; 5xx is a refusal
    if isinstance(e, smtplib.SMTPRecipientsRefused):  # each recipient's reply: 4xx for all (greylisted)
        codes = [v[0] for v in e.recipients.values() if isinstance(v, tuple) and v]
        return bool(codes) and all(isinstance(c, int) and 400 <= c < 500 for c in codes)
    if isinstance(e, (smtplib.SMTPServerDisconnected, ssl.SSLEOFError)):
        return True  # the connection broke
    if isinstance(e, (smtplib.SMTPException, ssl.SSLError, ssl.CertificateError, ValueError)):
        return False  # a sender refused, no STARTTLS, a certificate or a handshake, a header
    return isinstance(e, OSError)  # refused, reset, timed out, no route to the host, no such name


class _Replaced(Exception):
    """The sink was replaced while a batch read with its older spec was delivered."""


async def _backoff(delay_s: float, replaced: Callable[[], bool] | None) -> None:
    """Wait ``delay_s`` before the next attempt, or less once ``replaced()`` says so (looked at
    every IDLE_S * 5: a backoff of minutes does not hold up the sink's new spec)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + delay_s
    while (left := end - loop.time()) > 0:
        if replaced is not None and replaced():
            raise _Replaced
        await asyncio.sleep(min(left, IDLE_S * 5))


class _SMTP(smtplib.SMTP):
    """SMTP that connects to ``pinned`` (an address checked against a tenant's network policy)
    when given, while naming the host (STARTTLS verifies the certificate for it)."""

    def __init__(self, pinned: str | None, host: str, port: int, **kw: Any) -> None:
        self._pinned = pinned
        super().__init__(host, port, **kw)

    def _get_socket(self, host, port, timeout):
        return socket.create_connection((self._pinned or host, port), timeout, self.source_address)


class _Collector:
    def __init__(self, n: Notifier) -> None:
        self.n = n

    def collect(self):
        n = self.n
        counts = n.raft.read(core_notify.outbox_counts)
        yield CounterMetricFamily("raftsched_events_emitted", "events kept in the outbox since the cluster began "
                                  "(events no sink is sent are not kept)", value=counts["seq"])
        # The sinks that exist: a deleted sink's series go at once on every node (a node that
        # delivered for it and leads no more forgets its counters only when it leads again).
        live = set(n.raft.read(core_notify.sink_names))
        held = GaugeMetricFamily("raftsched_events_outbox", "events held in the replicated outbox, by kind",
                                 labels=["kind"])
        for k, v in sorted(counts["held"].items()):
            held.add_metric([k], v)
        yield held
        for metric, doc, c in (("raftsched_events_delivered", "events a sink accepted (this node, while leading)",
                                n.delivered),
                               ("raftsched_events_dead", "events a sink refused past its retry budget (this node)",
                                n.dead)):
            fam = CounterMetricFamily(metric, doc, labels=["sink", "kind"])
            for (sink, kind), v in sorted(dict(c).items()):  # a copy first: scrapes run in a thread
                if sink in live:
                    fam.add_metric([sink, kind], v)
            yield fam
        failed = CounterMetricFamily("raftsched_event_attempts_failed", "delivery attempts a sink refused or "
                                     "that failed, retried ones included (this node, while leading)", labels=["sink"])
        # Every live sink's series from the first scrape, at 0: a series that first appears at 1
        # has no increase() (as the alert rules' counters: docs/operations.md).
        attempts = dict(n.attempts_failed)
        for sink in sorted(live):
            failed.add_metric([sink], attempts.get(sink, 0))
        yield failed
        down = GaugeMetricFamily("raftsched_sink_unreachable_seconds", "how long a sink's outage has lasted "
                                 "(since an attempt first could not reach it, none taken since), absent while it has "
                                 "none (this node, while leading)", labels=["sink"])
        now = n.clock.now_ms()
        for sink, since in sorted(dict(n._unreachable).items()):
            if sink in live:
                down.add_metric([sink], max(0, now - since) / 1000)
        yield down
        lost = CounterMetricFamily("raftsched_events_lost", "events the outbox gave up before a sink was sent them "
                                   "(at most: not all of them were for it), seen by this node", labels=["sink"])
        gone = dict(n.lost)
        for sink in sorted(live):
            lost.add_metric([sink], gone.get(sink, 0))
        yield lost
        # From the replicated state, the same on every node (whoever leads, through a fail-over):
        # what a sink has not been sent yet, and how long the oldest of it has waited.
        behind = GaugeMetricFamily("raftsched_sink_pending_events", "events routed to a sink that it was not sent "
                                   "yet (after its cursor, and requeued ones), from the replicated state",
                                   labels=["sink"])
        oldest = GaugeMetricFamily("raftsched_sink_oldest_pending_seconds", "how long the oldest event a sink was "
                                   "not sent yet has waited, since its commit or its requeue (0 when none waits)",
                                   labels=["sink"])
        dead = GaugeMetricFamily("raftsched_sink_dead_events", "events in a sink's dead list (given up on, until "
                                 "requeued or the list's bound drops them), from the replicated state", labels=["sink"])
        for sink, (count, at, d) in sorted(counts["sinks"].items()):
            behind.add_metric([sink], count)
            oldest.add_metric([sink], 0 if at is None else max(0, now - at) / 1000)
            dead.add_metric([sink], d)
        yield behind
        yield oldest
        yield dead
        gave = CounterMetricFamily("raftsched_sink_events_given_up", "events put in a sink's dead list (refused past "
                                   "their attempts, or past its outage_s), as this replica applied them; from the "
                                   "first scrape for every sink, at 0 (the dead list is bounded, this is not)",
                                   labels=["sink"])
        for sink in sorted(counts["sinks"]):
            gave.add_metric([sink], counts["given_up"].get(sink, 0))
        yield gave
        h = HistogramMetricFamily("raftsched_event_delivery_seconds",
                                  "from an event's commit to a sink's acceptance (this node)")
        acc, buckets = 0, []
        for bound, v in zip(LATENCY_BUCKETS, n._latency):
            acc += v
            buckets.append((str(bound), acc))
        buckets.append(("+Inf", acc + n._latency[-1]))
        h.add_metric([], buckets, n._latency_sum)
        yield h
        jobs = n.raft.read(core_notify.metric_jobs)
        last = GaugeMetricFamily("raftsched_job_last_success_timestamp_seconds",
                                 "a job's last success (jobs with \"metrics\": true), NaN before one", labels=["job"])
        fails = GaugeMetricFamily("raftsched_job_consecutive_failures",
                                  "runs of a job dead since its last success (jobs with \"metrics\": true)",
                                  labels=["job"])
        for name, hl in jobs:
            ls = hl["last_success_at"]
            last.add_metric([name], float("nan") if ls is None else ls / 1000)
            fails.add_metric([name], hl["consecutive_failures"])
        yield last
        yield fails
