"""A small synchronous client of the raftsched admin API (standard library only).

    from raftsched.client import Client

    c = Client(["http://127.0.0.1:8701", "http://127.0.0.1:8702", "http://127.0.0.1:8703"],
               token=open(".raftsched/token").read().strip())
    c.put_job("nightly", {"schedule": {"cron": "30 2 * * *"}, ...})
    with c.lock("reindex", owner="host-a", ttl_s=10) as lease:
        store.write("index", data, token=lease.token)   # pass the token to EVERY downstream write

How a call is routed and retried
--------------------------------
The rules below are :class:`raftsched.client_rules.Call`'s, in one place: this client and
:class:`raftsched.AsyncClient` (asyncio, aiohttp, the same methods) both follow them.

- The nodes are tried in order, starting with the last one that answered. A node that cannot be
  reached (the connection is refused or times out before the request is sent) or that answers
  503 (no leader: the command definitely did not happen) is skipped for the next one. When every
  node was tried, the client waits (``Retry-After``, at most a second) and goes round again until
  the call's deadline (``deadline_s``).
- Every mutating call gets one ``Idempotency-Key`` (a uuid4 hex) for its whole life. On a 504 (the
  outcome is unknown) or when the connection is lost after the request was sent, the same
  request is sent again with the same key; the state machine applies it at most once and answers
  the retry with the first result. If the deadline passes after such an unknown outcome, the
  client raises :class:`~raftsched.core.errors.Indeterminate` (``definite`` is False: the command
  may still have applied), never a plain ``Unavailable``.
- Every other error status is raised at once as the typed error of its ``code``
  (:meth:`RaftschedError.from_dict`), with ``.status`` (and ``.http_status``) set to the HTTP status
  and ``.body`` to the decoded answer.

Locks, honestly
---------------
A lock here is a lease: unless renewed, the leader expires it once it has seen no renewal for ``ttl_s`` (by its own monotonic clock). Holding it does
NOT make you safe by itself: your process can be paused (GC, SIGSTOP, a VM migration, a slow disk)
for longer than the TTL, the lock passes to someone else, and then your process wakes up and
writes, believing it still holds it. The only protection is the fencing token: every acquire
returns a token that is larger than every token handed out before, cluster-wide, and the system
you write to must refuse a write that carries a lower token than one it has already accepted (see
``examples/fenced_store.py`` and ``docs/fencing.md``). Pass ``lease.token`` to every downstream write.
"""
from __future__ import annotations

import http.client
import json
import logging
import random
import ssl
import threading
import time
import urllib.parse
import uuid
from typing import Any, Callable

from .client_rules import Call, Done, Fail, LostAfterSendError, NotSentError, Wait, with_status
from .core import limits
from .core.errors import Conflict, NotFound, RaftschedError, Unavailable

log = logging.getLogger("raftsched.client")

__all__ = ["Client", "Lock", "Lease", "LockHeld", "LockLost"]

#: "not given", for arguments whose None is a value (a payload may be null).
_UNSET = object()


class LockHeld(Conflict):
    """The lock is held by someone else. ``holder`` names them (when the node said so) and
    ``expires_at_ms`` is when their lease ends unless renewed (epoch ms, by the cluster's clock)."""

    @property
    def holder(self) -> str | None:
        return self.extra.get("holder")

    @property
    def expires_at_ms(self) -> int | None:
        return self.extra.get("expires_at_ms")


class LockLost(Conflict):
    """A renew or release was refused: the token no longer holds the lock (it expired, and maybe
    someone else holds it now). Stop writing with that token."""

    @property
    def holder(self) -> str | None:
        return self.extra.get("holder")


def _q(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


def prepare(method: str, body: Any, idempotent_key: str | None, token: str | None,
            headers: dict | None) -> tuple[bool, bytes | None, dict]:
    """``(mutating, encoded body, headers)`` of a request: JSON, the bearer token (every request
    but ``/healthz`` needs one, reads included), and for a mutation one ``Idempotency-Key``
    (``idempotent_key`` or a fresh uuid4 hex)."""
    mutating = method not in ("GET", "HEAD")
    hdrs = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    if mutating:
        hdrs["Idempotency-Key"] = idempotent_key or uuid.uuid4().hex
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    if headers:
        hdrs.update(headers)
    return mutating, data, hdrs


def client_tls_context(ca_file: str | None = None, cert_file: str | None = None,
                       key_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and host name: against
    ``ca_file`` when given, else the system's CAs; with a client certificate when ``cert_file``
    is given (mutual TLS). :raises OSError, ssl.SSLError: a file that cannot be used."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class TlsFailedError(Exception):
    """The TLS handshake failed (a certificate that does not verify): nothing was sent, and
    trying again or another node would only wait for the deadline."""


class _Node:
    __slots__ = ("url", "host", "port", "https", "prefix")

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")


class Client:
    """A synchronous, thread-safe client of a raftsched cluster.

    :param urls: one base URL (``http://127.0.0.1:8701``) or a list of them, one per node.
    :param token: the API bearer token, sent with every request (every request but
        ``/healthz`` needs one; docs/security.md).
    :param timeout_s: the socket timeout of one HTTP attempt. Keep it above the node's propose
        timeout (5 s) so a write that waits for a new leader is not cut short.
    :param deadline_s: how long one logical call keeps retrying (other nodes, 503, 504) before it
        raises.
    :param ca_file: for ``https://`` URLs, the CA certificate (PEM) the nodes' certificates must
        chain to (default: the system's trusted CAs). Certificates and host names are always
        verified.
    :param cert_file: a client certificate (PEM) for nodes that ask for one (mutual TLS), and
        ``key_file`` its key (default: in ``cert_file``).
    """

    def __init__(self, urls: list[str] | str, token: str | None = None, timeout_s: float = 10.0,
                 *, deadline_s: float = 30.0, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("give at least one node URL")
        self._nodes = [_Node(u) for u in urls]
        self._ssl = client_tls_context(ca_file, cert_file, key_file) if any(n.https for n in self._nodes) else None
        self.token = token
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self._preferred = 0  # index of the node that answered last

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self._nodes]

    # ------------------------------------------------------------------ transport
    def _once(self, node: _Node, method: str, path: str, body: bytes | None, headers: dict,
              timeout: float) -> tuple[int, dict, Any]:
        if node.https:
            conn = http.client.HTTPSConnection(node.host, node.port, timeout=timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(node.host, node.port, timeout=timeout)
        try:
            try:
                conn.connect()
            except ssl.SSLError as e:
                raise TlsFailedError(f"TLS with {node.url} failed: {e}") from e
            except OSError as e:
                raise NotSentError(f"{node.url}: {e}") from e
            try:
                conn.request(method, node.prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                raise LostAfterSendError(f"{node.url}: {type(e).__name__}: {e}") from e
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = raw.decode(errors="replace")
            return resp.status, dict((k.lower(), v) for k, v in resp.getheaders()), data
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None, *, idempotent_key: str | None = None,
                deadline_s: float | None = None, timeout_s: float | None = None, headers: dict | None = None,
                recover: Callable[[RaftschedError], Any] | None = None, accept: tuple[int, ...] = ()) -> Any:
        """Send one logical request and return the decoded JSON body of its 2xx answer (the
        text, for a body that is not JSON).

        A mutation (anything but GET/HEAD) carries one ``Idempotency-Key`` for all its retries
        (``idempotent_key``, or a fresh uuid4 hex). The retries follow
        :class:`raftsched.client_rules.Call`, which the AsyncClient drives too.

        :param timeout_s: the longest one attempt may take, instead of the client's (a
            long-poll waits at the node longer than an ordinary answer takes).
        :param recover: called with the error the call ends with; what it returns is returned
            instead (or it raises another error).
        :param accept: error statuses whose answer is returned like a 2xx one.
        :raises RaftschedError: the typed error of the answer's ``code``, with ``.status``.
        :raises Unavailable: no node answered, or none had a leader, until the deadline.
        :raises Indeterminate: the last attempts' outcome is unknown (504 / lost after sending).
        """
        mutating, data, hdrs = prepare(method, body, idempotent_key, self.token, headers)
        call = Call(self.urls, method, path, mutating, start=self._preferred,
                    timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                    budget_s=self.deadline_s if deadline_s is None else deadline_s,
                    now_s=time.monotonic(), accept=accept)
        try:
            while True:
                step = call.next(time.monotonic())
                if isinstance(step, Wait):
                    time.sleep(step.seconds)
                    continue
                if isinstance(step, Fail):
                    raise step.error
                try:
                    status, rh, payload = self._once(self._nodes[step.node], method, path, data, hdrs, step.timeout_s)
                except TlsFailedError as e:
                    raise with_status(Unavailable(str(e), node=self._nodes[step.node].url), None) from None
                except NotSentError as e:
                    call.not_sent(step.node, str(e))
                    continue
                except LostAfterSendError as e:
                    call.lost(step.node, str(e))
                    continue
                end = call.answered(step.node, status, rh, payload)
                if end is None:
                    continue
                self._preferred = end.node
                if isinstance(end, Done):
                    return end.payload
                raise end.error
        except RaftschedError as e:
            if recover is None:
                raise
            return recover(e)

    def _get(self, path: str, params: dict | None = None, **kw) -> Any:
        """A GET with the query ``params`` (None values left out, a list repeats its key);
        ``kw`` goes to :meth:`request`."""
        q = {k: v for k, v in (params or {}).items() if v is not None}
        if q:
            path += "?" + urllib.parse.urlencode(q, doseq=True)
        return self.request("GET", path, **kw)

    # ------------------------------------------------------------------ cluster and jobs
    def cluster(self, consistent: bool = False) -> dict:
        """``GET /v1/cluster``: the answering node, its role, the leader, members, indexes."""
        return self._get("/v1/cluster", {"consistent": "true" if consistent else None})

    def put_job(self, name: str, spec: dict, create_only: bool = False) -> dict:
        """Create or replace a job; ``create_only`` sends ``If-None-Match: *`` (409 if it exists)."""
        return self.request("PUT", f"/v1/jobs/{_q(name)}", spec,
                            headers={"If-None-Match": "*"} if create_only else None)

    def put_jobs(self, jobs: dict[str, dict], create_only: bool = False, *,
                 idempotency_key: str | None = None, deadline_s: float | None = None) -> dict:
        """Create or replace up to ``limits.batch_jobs_max`` (10 000) jobs in one request,
        ``POST /v1/jobs:batch``: ``{"jobs": {name: result}, "created", "replaced", "conflicts",
        "commands"}``. A result is ``{"created", "gen", "next_slot"}``, or with ``create_only``
        and an existing job, ``{"error": {"code": "conflict", ...}}``.

        Every job is validated before anything changes. The call is retried like every other
        (503 on the next node, 504 or a lost connection with the same Idempotency-Key), and a
        retry of the same jobs with the same key applies each of the node's commands at most
        once, so a failure part-way is finished by the retry. A batch of thousands of jobs
        can take seconds: give the client a ``timeout_s`` to match.

        :raises InvalidSpec: a job is invalid; ``.extra["job"]`` and ``.field`` name the first,
            ``.extra["errors"]`` lists up to 100. Nothing changed.
        :raises Unavailable, Indeterminate: the deadline passed with commands still failing;
            ``.extra`` says which jobs are committed (``jobs``), ``not_committed`` and
            ``unknown``, and the ``idempotency_key`` to retry with.
        """
        if len(jobs) > limits.batch_jobs_max:
            raise ValueError(f"{len(jobs)} jobs; send at most {limits.batch_jobs_max} per call")
        body: dict = {"jobs": jobs}
        if create_only:
            body["create_only"] = True
        return self.request("POST", "/v1/jobs:batch", body, idempotent_key=idempotency_key,
                            deadline_s=deadline_s)

    def get_job(self, name: str, consistent: bool = False) -> dict:
        return self._get(f"/v1/jobs/{_q(name)}", {"consistent": "true" if consistent else None})

    def delete_job(self, name: str) -> dict:
        return self.request("DELETE", f"/v1/jobs/{_q(name)}")

    def list_jobs(self, limit: int = 100, after: str | None = None, consistent: bool = False,
                  labels: dict[str, str] | None = None) -> dict:
        """One page: ``{"jobs", "next", "total"}``; pass ``after=page["next"]`` for the next one.
        With ``labels``, only the jobs that carry every one of them (``?label=KEY=VALUE``)."""
        return self._get("/v1/jobs", {"limit": limit, "after": after, "consistent": "true" if consistent else None,
                                      "label": [f"{k}={v}" for k, v in labels.items()] if labels else None})

    def runs(self, name: str, limit: int = 100, state: str | None = None, slot: str | None = None,
             consistent: bool = False) -> dict:
        """A job's runs, newest first; ``slot`` is an ISO-8601 time."""
        return self._get(f"/v1/jobs/{_q(name)}/runs",
                         {"limit": limit, "state": state, "slot": slot,
                          "consistent": "true" if consistent else None})

    def get_run(self, run: str) -> dict:
        return self._get(f"/v1/runs/{_q(run)}")

    def preview(self, name: str, count: int = 10, after: str | None = None) -> dict:
        """A job's next ``count`` slots (after ``after``, an ISO-8601 time; default now), with
        DST marks."""
        return self._get(f"/v1/jobs/{_q(name)}/preview", {"count": count, "after": after})

    def explain(self, name: str, down_from: str, down_to: str) -> dict:
        """What an outage from ``down_from`` to ``down_to`` (ISO-8601) would do to a job's
        slots, by its misfire policy. Read-only: it proposes nothing."""
        return self.request("POST", f"/v1/jobs/{_q(name)}/explain", {"down_from": down_from, "down_to": down_to})

    def trigger(self, name: str, *, slot: str | None = None, payload: Any = _UNSET) -> dict:
        """Start a manual run now (one run per call, even when the call is retried). ``payload``
        overrides the job's for this run; ``slot`` (ISO-8601) makes it the run of that scheduled
        time, deduplicated: when the slot has a run already, that run is the answer
        (``created`` False)."""
        body: dict = {}
        if slot is not None:
            body["slot"] = slot
        if payload is not _UNSET:
            body["payload"] = payload
        return self.request("POST", f"/v1/jobs/{_q(name)}/trigger", body or None)

    def pause(self, name: str) -> dict:
        return self.request("POST", f"/v1/jobs/{_q(name)}/pause")

    def resume(self, name: str, catch_up: bool = False) -> dict:
        path = f"/v1/jobs/{_q(name)}/resume" + ("?catch_up=true" if catch_up else "")
        return self.request("POST", path)

    # ------------------------------------------------------------------ queues, tenants, DLQ
    def dlq(self, queue: str | None = None, limit: int = 100) -> dict:
        return self._get("/v1/dlq", {"queue": queue, "limit": limit})

    def dlq_requeue(self, run: str) -> dict:
        return self.request("POST", f"/v1/dlq/{_q(run)}/requeue")

    def dlq_delete(self, run: str) -> dict:
        """Delete a dead run from its dead-letter queue."""
        return self.request("DELETE", f"/v1/dlq/{_q(run)}")

    def queues(self) -> dict:
        return self._get("/v1/queues")

    def put_queue(self, name: str, max_depth: int | None = None, on_full: str | None = None) -> dict:
        body = {k: v for k, v in (("max_depth", max_depth), ("on_full", on_full)) if v is not None}
        return self.request("PUT", f"/v1/queues/{_q(name)}", body)

    def tenants(self) -> dict:
        return self._get("/v1/tenants")

    def put_tenant(self, name: str, rate_per_s: float, burst: int | None = None) -> dict:
        body: dict = {"rate_per_s": rate_per_s}
        if burst is not None:
            body["burst"] = burst
        return self.request("PUT", f"/v1/tenants/{_q(name)}", body)

    # ------------------------------------------------------------------ backfills and bulk DLQ operations
    def backfill(self, job: str, from_: str, to: str, *, reprocess: str | None = None, order: str | None = None,
                 max_concurrent: int | None = None, rate_per_s: float | None = None, max_slots: int | None = None,
                 payload: Any = _UNSET, overlap: str | None = None, dry_run: bool = False,
                 backfill_id: str | None = None) -> dict:
        """``POST /v1/jobs/{job}/backfills``: run ``job`` for the slots of ``[from_, to)`` (ISO-8601)
        that never ran (``reprocess`` ``missing``, the default), also those whose last run failed
        or went dead (``failed``), or all of them (``all``); ``order`` ``oldest`` (default) or
        ``newest``; at most ``max_concurrent`` (default 1) of its runs queued or running, at most
        ``rate_per_s`` started a second. ``dry_run``: the slots it would run and why the others
        are left out, changing nothing. ``backfill_id`` makes the call idempotent: the same id
        again answers with the same backfill (``created`` False; docs/backfill.md)."""
        body: dict = {"from": from_, "to": to}
        for k, v in (("reprocess", reprocess), ("order", order), ("max_concurrent", max_concurrent),
                     ("rate_per_s", rate_per_s), ("max_slots", max_slots), ("overlap", overlap),
                     ("id", backfill_id)):
            if v is not None:
                body[k] = v
        if payload is not _UNSET:
            body["payload"] = payload
        if dry_run:
            body["dry_run"] = True
        return self.request("POST", f"/v1/jobs/{_q(job)}/backfills", body)

    def backfills(self, kind: str | None = None, job: str | None = None, state: str | None = None) -> dict:
        """``GET /v1/backfills``: every backfill and bulk DLQ operation the cluster keeps."""
        return self._get("/v1/backfills", {"kind": kind, "job": job, "state": state})

    def get_backfill(self, backfill_id: str, consistent: bool = False) -> dict:
        return self._get(f"/v1/backfills/{_q(backfill_id)}", {"consistent": "true" if consistent else None})

    def pause_backfill(self, backfill_id: str) -> dict:
        return self.request("POST", f"/v1/backfills/{_q(backfill_id)}/pause")

    def resume_backfill(self, backfill_id: str) -> dict:
        return self.request("POST", f"/v1/backfills/{_q(backfill_id)}/resume")

    def cancel_backfill(self, backfill_id: str) -> dict:
        """Stop a backfill (its queued runs are withdrawn) or a bulk operation."""
        return self.request("POST", f"/v1/backfills/{_q(backfill_id)}/cancel")

    def wait_backfill(self, backfill_id: str, *, poll_s: float = 0.5, timeout_s: float | None = None,
                      on_progress=None) -> dict:
        """Poll a backfill (or bulk operation) until it is done or cancelled; ``on_progress(view)``
        is called with each view read. :raises TimeoutError: still running after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = self.get_backfill(backfill_id)
            if on_progress is not None:
                on_progress(view)
            if view["state"] in ("done", "cancelled"):
                return view
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"backfill {backfill_id} is still {view['state']} after {timeout_s:g} s")
            time.sleep(poll_s)

    def _dlq_bulk(self, action: str, filters: dict, dry_run: bool, op_id: str | None) -> dict:
        body = {k: v for k, v in filters.items() if v is not None}
        if dry_run:
            body["dry_run"] = True
        if op_id is not None:
            body["id"] = op_id
        return self.request("POST", f"/v1/dlq:{action}", body)

    def dlq_requeue_matching(self, *, queue: str | None = None, job: str | None = None, error: str | None = None,
                             dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                             rate_per_s: float | None = None, max_concurrent: int | None = None,
                             dry_run: bool = False, op_id: str | None = None) -> dict:
        """``POST /v1/dlq:requeue``: queue again, with fresh budgets, the dead runs that match
        (``error`` is a substring of their error; dead between ``dead_from`` and ``dead_to``, ISO),
        at most ``max_count``, ``rate_per_s`` a second (10 by default): one replicated operation
        whose progress :meth:`get_backfill` shows. ``dry_run``: the runs it would requeue."""
        return self._dlq_bulk("requeue", {"queue": queue, "job": job, "error": error, "dead_from": dead_from,
                                          "dead_to": dead_to, "max_count": max_count, "rate_per_s": rate_per_s,
                                          "max_concurrent": max_concurrent}, dry_run, op_id)

    def dlq_purge_matching(self, *, queue: str | None = None, job: str | None = None, error: str | None = None,
                           dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                           rate_per_s: float | None = None, dry_run: bool = False, op_id: str | None = None) -> dict:
        """``POST /v1/dlq:purge``: delete the dead runs that match, as :meth:`dlq_requeue_matching`
        selects them (no rate unless given)."""
        return self._dlq_bulk("purge", {"queue": queue, "job": job, "error": error, "dead_from": dead_from,
                                        "dead_to": dead_to, "max_count": max_count, "rate_per_s": rate_per_s},
                              dry_run, op_id)
    # ------------------------------------------------------------------ the worker fleet
    def workers(self, consistent: bool = False) -> dict:
        """Every registered worker: ``{"workers": [...], "total"}`` (docs/api.md, "Workers")."""
        return self._get("/v1/workers", {"consistent": "true" if consistent else None})

    def worker(self, worker_id: str, consistent: bool = False) -> dict:
        """One worker, with the runs it holds. :raises NotFound: no such worker."""
        return self._get(f"/v1/workers/{_q(worker_id)}", {"consistent": "true" if consistent else None})

    def drain_worker(self, worker_id: str) -> dict:
        """Drain a worker: it is granted nothing more, lets its runs finish and stops
        (docs/workers.md). ``{"worker", "state": "draining", "held"}``."""
        return self.request("POST", f"/v1/workers/{_q(worker_id)}/drain")

    # ------------------------------------------------------------------ the worker protocol (docs/api.md)
    # What `raftsched worker` speaks (node/remote.py drives these through the AsyncClient); a
    # worker-role token may call them and nothing else.
    def worker_lease(self, worker_id: str, *, max_runs: int, wait_s: float, ttl_ms: int,
                     facts: dict | None = None, timeout_s: float | None = None,
                     deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/lease``: up to ``max_runs`` runs this worker's facts (queues,
        labels, slots, executors, version, instance) allow, waiting at the node up to ``wait_s``
        for work: ``{"runs": [grants], "draining"}``. Retried on another node only while no
        attempt may have granted runs (a lease is not idempotent: its runs would wait out their
        TTL)."""
        body = dict(facts or {}, max=max_runs, wait_s=wait_s, ttl_ms=ttl_ms)
        return self.request("POST", f"/v1/workers/{_q(worker_id)}/lease", body,
                            timeout_s=timeout_s, deadline_s=deadline_s)

    def worker_heartbeat(self, worker_id: str, leases: list, ttl_ms: int, *, timeout_s: float | None = None,
                         deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/heartbeat``: extend ``leases`` (``[[run, token], ...]``):
        ``{"extended", "lost", "draining"}``."""
        return self.request("POST", f"/v1/workers/{_q(worker_id)}/heartbeat", {"leases": leases, "ttl_ms": ttl_ms},
                            timeout_s=timeout_s, deadline_s=deadline_s)

    def worker_complete(self, worker_id: str, results: list, *, idempotent_key: str | None = None,
                        timeout_s: float | None = None, deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/complete``: outcomes (``{"run", "token", "success", "error",
        "output"}``), each judged alone: ``{"results": [...]}``."""
        return self.request("POST", f"/v1/workers/{_q(worker_id)}/complete", {"results": results},
                            idempotent_key=idempotent_key, timeout_s=timeout_s, deadline_s=deadline_s)

    def worker_release(self, worker_id: str, leases: list, reason: str = "", *, idempotent_key: str | None = None,
                       timeout_s: float | None = None, deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/release``: give ``leases`` back (queued again at once, no
        budget spent)."""
        return self.request("POST", f"/v1/workers/{_q(worker_id)}/release", {"leases": leases, "reason": reason},
                            idempotent_key=idempotent_key, timeout_s=timeout_s, deadline_s=deadline_s)
    # ------------------------------------------------------------------ tokens (admin)
    def create_token(self, role: str, tenants: list[str] | None = None, expires: str | int | None = None,
                     note: str | None = None, workers: list[str] | None = None) -> dict:
        """``POST /v1/tokens``: ``{"id", "token", "role", "tenants", "workers", "expires_at",
        "note"}``; the token (its secret) is shown this once. ``expires``: ISO-8601 or ms since
        the epoch; ``workers``: the worker ids a worker token may speak for (None: any)."""
        body: dict = {"role": role}
        for k, v in (("tenants", tenants), ("expires", expires), ("note", note), ("workers", workers)):
            if v is not None:
                body[k] = v
        return self.request("POST", "/v1/tokens", body)

    def tokens(self) -> dict:
        """``GET /v1/tokens``: every token, without secrets."""
        return self._get("/v1/tokens")

    def revoke_token(self, token_id: str) -> dict:
        """``DELETE /v1/tokens/{id}``: every node refuses it once it has applied the revocation."""
        return self.request("DELETE", f"/v1/tokens/{_q(token_id)}")

    # ------------------------------------------------------------------ locks
    def lock_acquire(self, name: str, owner: str, ttl_s: float, *, deadline_s: float | None = None) -> dict:
        """Acquire lock ``name`` for ``ttl_s`` seconds: ``{"lock", "owner", "token", "expires_at"}``.

        ``token`` is the fencing token: pass it to every write you make under the lock. Holding
        the lock does not make you safe by itself (see the module docstring).

        :raises LockHeld: someone else holds it (``.holder``, ``.expires_at_ms``).
        """
        return self.request("POST", f"/v1/locks/{_q(name)}/acquire", {"owner": owner, "ttl_s": ttl_s},
                            deadline_s=deadline_s, recover=_conflict_as(LockHeld))

    def lock_renew(self, name: str, token: int, ttl_s: float | None = None, *,
                   deadline_s: float | None = None) -> dict:
        """Extend the lease of ``token`` by ``ttl_s`` (default: the TTL it was acquired with).

        :raises LockLost: the token does not hold the lock any more.
        """
        body: dict = {"token": token}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return self.request("POST", f"/v1/locks/{_q(name)}/renew", body, deadline_s=deadline_s,
                            recover=_conflict_as(LockLost))

    def lock_release(self, name: str, token: int, *, deadline_s: float | None = None) -> dict:
        """Release the lock held with ``token``.

        :raises LockLost: the token did not hold it (it had expired already).
        """
        return self.request("POST", f"/v1/locks/{_q(name)}/release", {"token": token}, deadline_s=deadline_s,
                            recover=_conflict_as(LockLost))

    def lock_info(self, name: str, consistent: bool = False) -> dict | None:
        """The current holder ``{"lock", "owner", "token", "expires_at", "since"}``, or None."""
        return self._get(f"/v1/locks/{_q(name)}", {"consistent": "true" if consistent else None},
                         recover=_none_if_not_found)

    def lock(self, name: str, owner: str, ttl_s: float = 10.0, *, blocking: bool = False,
             timeout_s: float | None = None) -> "Lock":
        """A :class:`Lock` context manager: acquire, renew in the background, release on exit.

        Holding the lock does not make you safe by itself; pass ``lease.token`` to every
        downstream write, and check ``lease.lost`` before each one.
        """
        return Lock(self, name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)

    # ------------------------------------------------------------------ the other endpoints
    def healthz(self) -> dict:
        """``GET /healthz`` of the node tried first: ``{"ok", "role", "leader"}``, ``ok`` False
        (a 503, returned rather than raised) when that node sees no leader."""
        return self._get("/healthz", accept=(503,))

    def metrics(self) -> str:
        """``GET /metrics``: the node's Prometheus text (NotFound when the node has none)."""
        return self._get("/metrics")

    def list_runs(self, state: str | None = None, limit: int = 100, consistent: bool = False) -> dict:
        """``GET /v1/runs``: runs and recorded slots of every job, newest first: ``{"runs"}``."""
        return self._get("/v1/runs", {"state": state, "limit": limit, "consistent": "true" if consistent else None})

    def preview_spec(self, spec: dict, count: int = 10) -> dict:
        """``POST /v1/preview``: the next ``count`` slots of a spec that is not stored (it is
        validated like a PUT's). Read-only: it proposes nothing."""
        return self.request("POST", f"/v1/preview?count={int(count)}", spec)

    def dlq_get(self, run: str, consistent: bool = False) -> dict:
        """``GET /v1/dlq/{run}``: one dead run (NotFound unless it is in a dead-letter queue)."""
        return self._get(f"/v1/dlq/{_q(run)}", {"consistent": "true" if consistent else None})

    def delete_tenant(self, name: str) -> dict:
        """``DELETE /v1/tenants/{name}``: lift the tenant's rate limit."""
        return self.request("DELETE", f"/v1/tenants/{_q(name)}")


def _conflict_as(klass: type[Conflict]) -> Callable[[RaftschedError], Any]:
    """A ``recover`` for :meth:`Client.request` that raises a 409 as ``klass``."""
    def recover(e: RaftschedError):
        if isinstance(e, Conflict):
            raise _retype(e, klass) from None
        raise e
    return recover


def _none_if_not_found(e: RaftschedError) -> None:
    """A ``recover`` for :meth:`Client.request`: a 404 is None."""
    if isinstance(e, NotFound):
        return None
    raise e


def _retype(e: Conflict, klass: type[Conflict]) -> Conflict:
    if e.field == "Idempotency-Key" or (klass is LockHeld and "holder" not in e.extra):
        return e  # a reused request id, or the cluster's lock limit: not about this lock's holder
    new = klass(e.message, e.field, **e.extra)
    return with_status(new, getattr(e, "status", 409))


def lock_poll_pause(e: LockHeld, now_s: float, wait_until: float | None) -> float | None:
    """How long a blocking acquire that got ``e`` waits before it tries again (None: give up,
    ``wait_until`` has passed). Right after the holder's lease ends by its expiry, if the node
    said when; clocks differ, so never more than a second between attempts."""
    if wait_until is not None and now_s >= wait_until:
        return None
    pause = 0.25
    if e.expires_at_ms is not None:
        pause = e.expires_at_ms / 1000 - time.time() + 0.02
    pause = min(max(pause, 0.05), 1.0) * random.uniform(0.8, 1.0)
    if wait_until is not None:
        pause = min(pause, max(0.0, wait_until - now_s))
    return pause


class Lease:
    """What a :class:`Lock` holds while it is held.

    ``token`` is the fencing token: pass it to every downstream write; holding the lease does not
    make you safe by itself. ``lost`` is set when a renew was refused, or when no renew has
    succeeded for a whole TTL by this process's monotonic clock; after that, stop working: the
    lock may belong to someone else already.
    """

    def __init__(self, name: str, owner: str, token: int, ttl_s: float, expires_at: str | None,
                 valid_until: float) -> None:
        self.name = name
        self.owner = owner
        self.token = token
        self.ttl_s = ttl_s
        self.expires_at = expires_at  # the cluster's view, ISO-8601 UTC
        self.lost = threading.Event()
        self.renewals = 0
        #: time.monotonic() until which the lease is held at the earliest estimate: the send
        #: time of the last successful acquire/renew plus the TTL.
        self.valid_until = valid_until

    def remaining_s(self) -> float:
        """Seconds the lease is still held by the local estimate (0 when lost)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self.valid_until - time.monotonic())

    def valid(self) -> bool:
        """Not lost and not past its local estimate. Still NOT a guarantee: use the token."""
        return self.remaining_s() > 0

    def __repr__(self) -> str:
        return (f"Lease({self.name!r}, owner={self.owner!r}, token={self.token}, "
                f"lost={self.lost.is_set()}, remaining_s={self.remaining_s():.2f})")


class Lock:
    """A lock held with a lease that a background daemon thread renews every ``ttl_s / 3``.

        with client.lock("reindex", owner="host-a", ttl_s=10) as lease:
            for batch in work:
                if lease.lost.is_set():
                    break
                sink.write(batch, fencing_token=lease.token)

    Holding the lock does not make you safe by itself. Your process can stop for longer than the
    TTL (GC pause, SIGSTOP, VM migration) between checking ``lease.lost`` and writing; meanwhile
    another owner gets the lock. Pass ``lease.token`` to every downstream write and make the
    downstream refuse a lower token than one it has already seen.

    :param blocking: wait for the lock when it is held (polling until the holder's lease ends),
        instead of raising :class:`LockHeld` at once.
    :param timeout_s: with ``blocking``, how long to wait (None: forever); then LockHeld.

    If acquiring raises :class:`~raftsched.core.errors.Indeterminate`, the lock may have been
    granted to this owner anyway; nobody renews it, so it ends by its TTL.
    """

    def __init__(self, client: Client, name: str, owner: str, ttl_s: float = 10.0, *,
                 blocking: bool = False, timeout_s: float | None = None) -> None:
        self.client = client
        self.name = name
        self.owner = owner
        self.ttl_s = float(ttl_s)
        self.blocking = blocking
        self.timeout_s = timeout_s
        self.lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ acquire / release
    def acquire(self) -> Lease:
        if self.lease is not None:
            raise RuntimeError(f"lock {self.name!r} is already acquired by this Lock object")
        wait_until = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            sent = time.monotonic()
            try:
                res = self.client.lock_acquire(self.name, self.owner, self.ttl_s)
                break
            except LockHeld as e:
                if not self.blocking:
                    raise
                pause = lock_poll_pause(e, time.monotonic(), wait_until)
                if pause is None:
                    raise
                time.sleep(pause)
        self.lease = Lease(self.name, self.owner, res["token"], self.ttl_s, res.get("expires_at"),
                           valid_until=sent + self.ttl_s)
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, args=(self.lease,),
                                        name=f"raftsched-lock-renew:{self.name}", daemon=True)
        self._thread.start()
        return self.lease

    def release(self) -> None:
        """Stop renewing and release. A refused release (the lease had expired already) is
        logged, not raised; so is a release that could not reach the cluster (the lease then ends
        by its TTL)."""
        lease = self.lease
        if lease is None:
            return
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.ttl_s + self.client.timeout_s)
        self._thread = None
        self.lease = None
        try:
            self.client.lock_release(self.name, lease.token, deadline_s=max(1.0, min(self.ttl_s, self.client.deadline_s)))
        except LockLost as e:
            log.info("lock %s: release of token %d refused (the lease had expired already): %s",
                     self.name, lease.token, e.message)
        except RaftschedError as e:
            log.warning("lock %s: release of token %d failed (%s); it ends by its TTL",
                        self.name, lease.token, e.message)
        finally:
            lease.lost.set()  # whatever happened, this lease is not held any more

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ renewals
    def _renew_loop(self, lease: Lease) -> None:
        interval = self.ttl_s / 3
        retry = max(0.05, self.ttl_s / 10)
        wait = interval
        while not self._stop.wait(min(wait, max(0.0, lease.valid_until - time.monotonic()))):
            left = lease.valid_until - time.monotonic()
            if left <= 0:
                log.warning("lock %s: no renew succeeded for a whole TTL (%.3g s); the lease is lost",
                            self.name, self.ttl_s)
                lease.lost.set()
                return
            sent = time.monotonic()
            try:
                # Bounded by what is left of the lease, so `lost` is set on time.
                res = self.client.lock_renew(self.name, lease.token, self.ttl_s, deadline_s=left)
            except LockLost as e:
                log.warning("lock %s: renew refused, the lease is lost: %s", self.name, e.message)
                lease.lost.set()
                return
            except RaftschedError as e:
                log.warning("lock %s: renew failed (%s); retrying", self.name, e.message)
                wait = retry
                continue
            except Exception:  # a bug here must not leave the holder believing it holds the lock
                log.exception("lock %s: renew raised unexpectedly; the lease is treated as lost", self.name)
                lease.lost.set()
                return
            if res.get("token") != lease.token:
                log.warning("lock %s: renew answered token %s, not %d; the lease is lost",
                            self.name, res.get("token"), lease.token)
                lease.lost.set()
                return
            lease.valid_until = max(lease.valid_until, sent + self.ttl_s)
            lease.expires_at = res.get("expires_at", lease.expires_at)
            lease.renewals += 1
            wait = interval
