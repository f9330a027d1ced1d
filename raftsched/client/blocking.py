"""The blocking transport: :class:`Client` (``http.client``, a connection per request, safe to
share between threads) and :class:`Lock` (a lease renewed by a daemon thread).

The rules of a call (routing, retries, Idempotency-Key, errors) are the core's
(raftsched/client/core.py); what each endpoint sends is raftsched/client/endpoints.py's; this
module only sends and sleeps. Its rule for a failed attempt: the connection is made first
(``connect()``), so an error before it is made is :class:`NotSentError` (nothing left), a
certificate that does not verify is :class:`TlsFailedError`, and any error after it is
:class:`LostAfterSendError` (the request may have left).

An attempt's timeout bounds the whole attempt, as the asyncio client's ``ClientTimeout(total=)``
does, not each socket operation (``http.client``'s own timeout): before every send and every read
the socket's timeout is lowered to what is left of it, so a node that sends its answer a byte at
a time cannot keep a call past its deadline. An attempt that runs out once connected is lost
after sending, as a read timeout is.
"""
from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
from typing import Any, Callable

from ..core.errors import RaftschedError
from . import endpoints
from .core import (
    DEADLINE_S_DEFAULT, TIMEOUT_S_DEFAULT, LockHeld, LostAfterSendError, Node, NotSentError, Request, TlsFailedError,
    Transport, TransportError, Try, Wait, decode, lost_why, NO_CLIENT_CERT_HINT,
)
from .endpoints import PAGE_LIMIT_DEFAULT, PREVIEW_COUNT_DEFAULT, UNSET
from .policy import BACKFILL_POLL_S_DEFAULT, LOCK_TTL_S_DEFAULT, BackfillWait, Lease, LockPolicy
from .tls import client_tls_context, probe_context

__all__ = ["Client", "Lock"]


def _speaks_tls(node: Node, timeout: float) -> bool:
    """Whether a node that dropped a plain HTTP request completes a TLS handshake: it serves
    HTTPS, and the URL says http://. Only asks; sends nothing (no certificate is trusted)."""
    try:
        with socket.create_connection((node.host, node.port), timeout=timeout) as raw:
            with probe_context().wrap_socket(raw, server_hostname=node.host):
                return True
    except (OSError, ValueError):
        return False


class _AttemptTimeout(TimeoutError):
    """The attempt's time ran out (raised instead of reading or sending past it)."""


def _time_left(deadline: float) -> float:
    """The seconds left before the monotonic ``deadline``: :class:`_AttemptTimeout` if none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _AttemptTimeout("the attempt's timeout passed")
    return left


def _resolve_by(host: str, port: int, deadline: float) -> list:
    """``getaddrinfo`` bounded by the attempt: a name is resolved in a daemon thread of its own,
    waited for only until ``deadline`` (the C resolver cannot be interrupted; a thread left behind
    ends with the resolver's own timeouts, and never holds the process at exit). An address
    literal is resolved here, at once."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    got: list = []

    def resolve() -> None:
        try:
            got.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except BaseException as e:  # (handed to the caller)
            got.append(e)
    t = threading.Thread(target=resolve, name="raftsched-resolve", daemon=True)
    t.start()
    t.join(_time_left(deadline))
    if not got:
        raise _AttemptTimeout(f"resolving {host} outlasted the attempt's timeout")
    if isinstance(got[0], BaseException):
        raise got[0]
    return got[0]


def _connect_by(deadline: float) -> Callable[..., socket.socket]:
    """A ``create_connection`` for an ``HTTPConnection`` that gives the name's resolution, then
    each address it tries, only what is left of the attempt (``socket.create_connection`` waits
    on the resolver unbounded and gives each address the whole timeout), and leaves the socket
    with that left for what follows (a TLS handshake)."""
    def connect(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
        host, port = address
        err: OSError | None = None
        for family, kind, proto, _, addr in _resolve_by(host, port, deadline):
            sock = None
            try:
                sock = socket.socket(family, kind, proto)  # (IPv6 off on this host: the next address)
                sock.settimeout(_time_left(deadline))
                if source_address:
                    sock.bind(source_address)
                sock.connect(addr)
                sock.settimeout(_time_left(deadline))
                return sock
            except OSError as e:  # (_AttemptTimeout is one: the attempt's time is spent)
                if sock is not None:
                    sock.close()
                err = e
                if isinstance(e, _AttemptTimeout):
                    break
        raise err if err is not None else OSError(f"getaddrinfo returned nothing for {host}")
    return connect


class _BoundedReader(io.RawIOBase):
    """A response's socket reader that gives every read only what is left of the attempt."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int | None:
        self._sock.settimeout(_time_left(self._deadline))
        return self._raw.readinto(b)

    def close(self) -> None:
        try:
            self._raw.close()  # (the socket's own reader: the socket closes with the last one)
        finally:
            super().close()


class _BoundedResponse(http.client.HTTPResponse):
    """An ``HTTPResponse`` whose status line, headers and body are read by a :class:`_BoundedReader`."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        # Nothing has been read yet: the socket's reader is wrapped before it buffers anything.
        self.fp = io.BufferedReader(_BoundedReader(self.fp.detach(), sock, deadline))


class Client(Transport):
    """A synchronous, thread-safe client of a raftsched cluster.

    :param urls: one base URL (``http://127.0.0.1:8701``) or a list of them, one per node.
    :param token: the API bearer token, sent with every request (every request but
        ``/healthz`` needs one; docs/security.md).
    :param timeout_s: the longest one HTTP attempt may take, from resolving the name to the last byte of
        the answer. Keep it above the node's propose timeout (5 s) so a write that waits for a new
        leader is not cut short.
    :param deadline_s: how long one logical call keeps retrying (other nodes, 503, 504) before it
        raises.
    :param ca_file: for ``https://`` URLs, the CA certificate (PEM) the nodes' certificates must
        chain to (default: the system's trusted CAs). Certificates and host names are always
        verified.
    :param cert_file: a client certificate (PEM) for nodes that ask for one (mutual TLS), and
        ``key_file`` its key (default: in ``cert_file``).
    :param fail_fast: try each node once per call and then raise what each said, instead of
        going round until the deadline (the command line's choice; core.Call).
    """

    def __init__(self, urls: list[str] | str, token: str | None = None, timeout_s: float = TIMEOUT_S_DEFAULT,
                 *, deadline_s: float = DEADLINE_S_DEFAULT, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, fail_fast: bool = False) -> None:
        super().__init__(urls, token, timeout_s, deadline_s, fail_fast)
        self._ssl = client_tls_context(ca_file, cert_file, key_file) if self._uses_https() else None
        self._client_cert = bool(cert_file)

    # ------------------------------------------------------------------ transport
    def _once(self, node: Node, method: str, target: str, body: bytes | None, headers: dict,
              timeout: float) -> tuple[int, dict, Any]:
        deadline = time.monotonic() + timeout  # the whole attempt's, connection included
        if node.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(node.host, node.port, timeout=timeout,
                                                                            context=self._ssl)
        else:
            conn = http.client.HTTPConnection(node.host, node.port, timeout=timeout)
        conn.response_class = functools.partial(_BoundedResponse, deadline=deadline)  # type: ignore[assignment]
        conn._create_connection = _connect_by(deadline)  # type: ignore[attr-defined]
        answered = False  # a status line came back: the node speaks HTTP
        try:
            try:
                conn.connect()
                assert conn.sock is not None
                conn.sock.settimeout(_time_left(deadline))
            except ssl.SSLError as e:
                if "WRONG_VERSION_NUMBER" in str(e):
                    raise TlsFailedError(f"{node.url}: the node does not speak TLS: use http://") from e
                if isinstance(e, ssl.SSLCertVerificationError):
                    raise TlsFailedError(f"TLS with {node.url} failed: {e.verify_message or e}; give the CA "
                                         "its certificate chains to (--ca-file)") from e
                raise TlsFailedError(f"TLS with {node.url} failed: {e}") from e
            except OSError as e:
                raise NotSentError(f"{node.url}: {e}") from e
            try:
                conn.request(method, node.prefix + target, body=body, headers=headers)
                resp = conn.getresponse()
                answered = True
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                # A TLS node drops a plain request at once: a timeout, or an error after a status
                # line came back, is no sign of one (and the probe would outlast the attempt).
                if not (answered or node.https or isinstance(e, TimeoutError)) and _speaks_tls(node, timeout):
                    # It could not read the request as HTTP: nothing was done.
                    raise TlsFailedError(f"{node.url}: the node expects TLS: use https://{node.base[7:]} "
                                         "(and --ca-file)") from e
                # (a node that wants a certificate closes the connection before any answer, at once)
                hint = (NO_CLIENT_CERT_HINT if node.https and not answered and not self._client_cert
                        and not isinstance(e, TimeoutError) else "")
                raise LostAfterSendError(f"{node.url}: {lost_why(e, timeout)}{hint}") from e
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, decode(raw)
        finally:
            conn.close()

    def _send(self, request: Request) -> Any:
        """Send one logical request (core.Exchange's steps) and return its result."""
        ex = self._exchange(request, time.monotonic())
        while True:
            step = ex.next(time.monotonic())
            if isinstance(step, Try):
                try:
                    answer = self._once(self._nodes[step.node], ex.method, ex.target, ex.data, ex.headers,
                                        step.timeout_s)
                except TransportError as e:
                    ex.failed(step.node, e)
                else:
                    ex.answered(step.node, *answer, time.monotonic())
            elif isinstance(step, Wait):
                time.sleep(step.seconds)
            else:
                return self._finish(ex)

    def request(self, method: str, path: str, body: Any = None, *, idempotent_key: str | None = None,
                deadline_s: float | None = None, timeout_s: float | None = None, headers: dict | None = None,
                recover: Callable[[RaftschedError], Any] | None = None, accept: tuple[int, ...] = ()) -> Any:
        """Send one logical request and return the decoded JSON body of its 2xx answer (the
        text, for a body that is not JSON); the parameters are :class:`core.Request`'s.

        :raises RaftschedError: the typed error of the answer's ``code``, with ``.status``.
        :raises Unavailable: no node answered, or none had a leader, until the deadline.
        :raises Indeterminate: the last attempts' outcome is unknown (504 / lost after sending).
        """
        return self._send(self._request(method, path, body, idempotent_key, deadline_s, timeout_s, headers,
                                        recover, accept))

    # ------------------------------------------------------------------ what is more than one call
    def lock(self, name: str, owner: str, ttl_s: float = LOCK_TTL_S_DEFAULT, *, blocking: bool = False,
             timeout_s: float | None = None) -> Lock:
        """A :class:`Lock` context manager: acquire, renew in a thread, release on exit. Pass
        ``lease.token`` to every downstream write, and check ``lease.lost`` before each one."""
        return Lock(self, name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)

    def wait_backfill(self, backfill_id: str, *, poll_s: float = BACKFILL_POLL_S_DEFAULT,
                      timeout_s: float | None = None, on_progress: Callable[[dict], Any] | None = None) -> dict:
        """Poll a backfill (or bulk operation) until it is done or cancelled; ``on_progress(view)``
        is called with each view read. :raises TimeoutError: still running after ``timeout_s``."""
        w = BackfillWait(backfill_id, poll_s=poll_s, timeout_s=timeout_s, on_progress=on_progress)
        while True:
            view = self.get_backfill(backfill_id)
            if w.done(view):
                return view
            time.sleep(w.poll_s)

    # ------------------------------------------------------------------ the endpoints (endpoints.py)
    def cluster(self, consistent: bool = False) -> dict:
        """``GET /v1/cluster``: the answering node, its role, the leader, members, indexes."""
        return self._send(endpoints.cluster(consistent))

    def whoami(self) -> dict:
        """``GET /v1/whoami``: the token's id, role, tenants and scopes."""
        return self._send(endpoints.whoami())

    def fencing(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/cluster/fencing``: the highest fencing token granted."""
        return self._send(endpoints.fencing(consistent, stale=stale))

    def raise_fencing(self, at_least: int) -> dict:
        """``POST /v1/cluster/fencing``: the fencing counter raised to ``at_least`` when below."""
        return self._send(endpoints.raise_fencing(at_least))

    def add_member(self, addr: str) -> dict:
        """``POST /v1/cluster/members``: add a node (a learner, then a voter once it holds the log)."""
        return self._send(endpoints.add_member(addr))

    def remove_member(self, addr: str) -> dict:
        """``DELETE /v1/cluster/members/{addr}``: remove a node (a leader hands its leadership over)."""
        return self._send(endpoints.remove_member(addr))

    def put_job(self, name: str, spec: dict, create_only: bool = False, *, paused: bool = False) -> dict:
        """``PUT /v1/jobs/{name}``: create or replace a job (``create_only``: 409 if it exists; ``paused``: paused by the same command)."""
        return self._send(endpoints.put_job(name, spec, create_only, paused=paused))

    def put_jobs(self, jobs: dict[str, dict], create_only: bool = False, *, idempotency_key: str | None = None,
                 deadline_s: float | None = None, paused: bool = False, dry_run: bool = False) -> dict:
        """``POST /v1/jobs:batch``: create or replace up to 10 000 jobs, validated whole first (``paused``: each paused by the same command; ``dry_run``: what it would do, changing nothing)."""
        return self._send(endpoints.put_jobs(jobs, create_only, idempotency_key=idempotency_key,
                                             deadline_s=deadline_s, paused=paused, dry_run=dry_run))

    def plan_jobs(self, jobs: dict[str, dict], create_only: bool = False, *, deadline_s: float | None = None,
                  paused: bool = False) -> dict:
        """``POST /v1/jobs:plan``: what a batch of these jobs would do to each, changing nothing (a reader may ask)."""
        return self._send(endpoints.plan_jobs(jobs, create_only, deadline_s=deadline_s, paused=paused))

    def get_job(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}``: a job's spec and state."""
        return self._send(endpoints.get_job(name, consistent, stale=stale))

    def delete_job(self, name: str, force: bool = False) -> dict:
        """``DELETE /v1/jobs/{name}``: delete a job (``force``: though other jobs run after it)."""
        return self._send(endpoints.delete_job(name, force))

    def graph(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/graph``: its parents and children, transitively (pipelines)."""
        return self._send(endpoints.graph(name, consistent, stale=stale))

    def list_jobs(self, limit: int = PAGE_LIMIT_DEFAULT, after: str | None = None, consistent: bool = False,
                  labels: dict[str, str] | None = None, *, stale: bool = False) -> dict:
        """``GET /v1/jobs``: one page of jobs, ``{"jobs", "next", "total"}`` (``labels``: only those)."""
        return self._send(endpoints.list_jobs(limit, after, consistent, labels, stale=stale))

    def runs(self, name: str, limit: int = PAGE_LIMIT_DEFAULT, state: str | None = None, slot: str | None = None,
             consistent: bool = False, *, since: str | None = None, until: str | None = None,
             before: str | None = None, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/runs``: a job's runs, newest first (a window, a cursor)."""
        return self._send(endpoints.runs(name, limit, state, slot, consistent, since=since, until=until,
                                         before=before, stale=stale))

    def get_run(self, run: str, *, stale: bool = False) -> dict:
        """``GET /v1/runs/{run}``: one run."""
        return self._send(endpoints.get_run(run, stale=stale))

    def preview(self, name: str, count: int = PREVIEW_COUNT_DEFAULT, after: str | None = None, *,
                stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/preview``: a job's next ``count`` slots, with DST marks."""
        return self._send(endpoints.preview(name, count, after, stale=stale))

    def explain(self, name: str, down_from: str | None = None, down_to: str | None = None, *,
                slot: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/explain``: an outage window's effect, or why a slot missed its deadline."""
        return self._send(endpoints.explain(name, down_from, down_to, slot=slot))

    def ping(self, name: str, status: str = "success", *, slot: str | int | None = None) -> dict:
        """``POST /v1/jobs/{name}/ping``: a heartbeat job's start, success or fail."""
        return self._send(endpoints.ping(name, status, slot=slot))

    def list_deadlines(self, state: str | None = None, job: str | None = None, since: str | None = None,
                limit: int = PAGE_LIMIT_DEFAULT, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/deadlines``: slots' deadline outcomes, newest first."""
        return self._send(endpoints.list_deadlines(state, job, since, limit, consistent, stale=stale))

    def trigger(self, name: str, *, slot: str | None = None, payload: Any = UNSET,
                propagate: bool = False, rerun: bool = False, downstream: bool = False) -> dict:
        """``POST /v1/jobs/{name}/trigger``: a manual run now (or of ``slot``, deduplicated; ``propagate``: to children; ``rerun``: the slot again; ``downstream``: its children too)."""
        return self._send(endpoints.trigger(name, slot=slot, payload=payload, propagate=propagate, rerun=rerun,
                                            downstream=downstream))

    def pause(self, name: str, note: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/pause``: fire no more slots until resumed (``note``: why)."""
        return self._send(endpoints.pause(name, note))

    def resume(self, name: str, catch_up: bool = False) -> dict:
        """``POST /v1/jobs/{name}/resume``: fire again (``catch_up``: the missed slots too)."""
        return self._send(endpoints.resume(name, catch_up))

    def dlq(self, queue: str | None = None, limit: int = PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> dict:
        """``GET /v1/dlq``: dead runs, of every queue or of ``queue``."""
        return self._send(endpoints.dlq(queue, limit, stale=stale))

    def dlq_get(self, run: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/dlq/{run}``: one dead run."""
        return self._send(endpoints.dlq_get(run, consistent, stale=stale))

    def cancel_run(self, run: str, reason: str | None = None) -> dict:
        """``POST /v1/runs/{run}/cancel``: end a queued or running run (``reason``: why)."""
        return self._send(endpoints.cancel_run(run, reason))

    def cancel_job_runs(self, name: str, reason: str | None = None, running: bool = False,
                        after: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/cancel``: end a job's queued runs (``running``: its running ones too)."""
        return self._send(endpoints.cancel_job_runs(name, reason, running, after))

    def dlq_requeue(self, run: str) -> dict:
        """``POST /v1/dlq/{run}/requeue``: queue a dead run again, with a fresh budget."""
        return self._send(endpoints.dlq_requeue(run))

    def dlq_delete(self, run: str) -> dict:
        """``DELETE /v1/dlq/{run}``: delete a dead run from its dead-letter queue."""
        return self._send(endpoints.dlq_delete(run))

    def queues(self, *, stale: bool = False) -> dict:
        """``GET /v1/queues``: every queue: depth, running, oldest waiting, dead."""
        return self._send(endpoints.queues(stale=stale))

    def put_queue(self, name: str, max_depth: int | None = None, on_full: str | None = None, *,
                  tenants: Any = UNSET) -> dict:
        """``PUT /v1/queues/{name}``: a queue's settings, and the tenants it belongs to."""
        return self._send(endpoints.put_queue(name, max_depth, on_full, tenants=tenants))

    def tenants(self, *, stale: bool = False) -> dict:
        """``GET /v1/tenants``: every tenant's rate limit, policy and default routes."""
        return self._send(endpoints.tenants(stale=stale))

    def tenant(self, name: str, *, stale: bool = False) -> dict:
        """``GET /v1/tenants/{name}``: a tenant's rate limit, policy and default routes."""
        return self._send(endpoints.tenant(name, stale=stale))

    def put_tenant(self, name: str, rate_per_s: float | None = None, burst: int | None = None, *,
                   executors: list[str] | None = None, placement_labels: dict[str, str] | None = None,
                   network_allow: list[str] | None = None, notify: list[dict] | None = None) -> dict:
        """``PUT /v1/tenants/{name}``: a tenant's rate limit and/or its policy and/or default routes."""
        return self._send(endpoints.put_tenant(name, rate_per_s, burst, executors=executors,
                                                 placement_labels=placement_labels, network_allow=network_allow,
                                                 notify=notify))

    def sinks(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/sinks``: every sink (secrets redacted)."""
        return self._send(endpoints.sinks(consistent, stale=stale))

    def get_sink(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/sinks/{name}``: a sink. :raises NotFound:"""
        return self._send(endpoints.get_sink(name, consistent, stale=stale))

    def put_sink(self, name: str, spec: dict) -> dict:
        """``PUT /v1/sinks/{name}``: create or replace a sink."""
        return self._send(endpoints.put_sink(name, spec))

    def delete_sink(self, name: str) -> dict:
        """``DELETE /v1/sinks/{name}``."""
        return self._send(endpoints.delete_sink(name))

    def sink_dead(self, name: str, limit: int = endpoints.PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> dict:
        """``GET /v1/sinks/{name}/dead``: the events the sink refused past its retry budget."""
        return self._send(endpoints.sink_dead(name, limit, stale=stale))

    def sink_requeue(self, name: str, events: list[str] | None = None) -> dict:
        """``POST /v1/sinks/{name}/dead:requeue``: deliver dead events again."""
        return self._send(endpoints.sink_requeue(name, events))

    def delete_tenant(self, name: str) -> dict:
        """``DELETE /v1/tenants/{name}``: lift the tenant's rate limit, policy and default routes."""
        return self._send(endpoints.delete_tenant(name))

    def backfill(self, job: str, from_: str, to: str, *, reprocess: str | None = None, order: str | None = None,
                 max_concurrent: int | None = None, rate_per_s: float | None = None, max_slots: int | None = None,
                 payload: Any = UNSET, overlap: str | None = None, dry_run: bool = False,
                 backfill_id: str | None = None, cascade: str | None = None,
                 upstream: str | None = None) -> dict:
        """``POST /v1/jobs/{job}/backfills``: run a job for the slots of a past range."""
        return self._send(endpoints.backfill(job, from_, to, reprocess=reprocess, order=order,
                                             max_concurrent=max_concurrent, rate_per_s=rate_per_s,
                                             max_slots=max_slots, payload=payload, overlap=overlap, dry_run=dry_run,
                                             backfill_id=backfill_id, cascade=cascade, upstream=upstream))

    def backfills(self, kind: str | None = None, job: str | None = None, state: str | None = None, *,
                  stale: bool = False) -> dict:
        """``GET /v1/backfills``: every backfill and bulk DLQ operation."""
        return self._send(endpoints.backfills(kind, job, state, stale=stale))

    def get_backfill(self, backfill_id: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/backfills/{id}``: one backfill or bulk operation, with its progress."""
        return self._send(endpoints.get_backfill(backfill_id, consistent, stale=stale))

    def pause_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/pause``: start no more of its runs until resumed."""
        return self._send(endpoints.pause_backfill(backfill_id))

    def resume_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/resume``: go on with a paused operation."""
        return self._send(endpoints.resume_backfill(backfill_id))

    def cancel_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/cancel``: stop a backfill or bulk operation."""
        return self._send(endpoints.cancel_backfill(backfill_id))

    def dlq_requeue_matching(self, *, queue: str | None = None, job: str | None = None, error: str | None = None,
                             dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                             rate_per_s: float | None = None, max_concurrent: int | None = None,
                             dry_run: bool = False, op_id: str | None = None, all_runs: bool = False) -> dict:
        """``POST /v1/dlq:requeue``: queue again the dead runs that match, as one operation."""
        return self._send(endpoints.dlq_requeue_matching(queue=queue, job=job, error=error, dead_from=dead_from,
                                                         dead_to=dead_to, max_count=max_count, rate_per_s=rate_per_s,
                                                         max_concurrent=max_concurrent, dry_run=dry_run, op_id=op_id,
                                                         all_runs=all_runs))

    def dlq_purge_matching(self, *, queue: str | None = None, job: str | None = None, error: str | None = None,
                           dead_from: str | None = None, dead_to: str | None = None, max_count: int | None = None,
                           rate_per_s: float | None = None, dry_run: bool = False, op_id: str | None = None,
                           all_runs: bool = False) -> dict:
        """``POST /v1/dlq:purge``: delete the dead runs that match, as one operation."""
        return self._send(endpoints.dlq_purge_matching(queue=queue, job=job, error=error, dead_from=dead_from,
                                                       dead_to=dead_to, max_count=max_count, rate_per_s=rate_per_s,
                                                       dry_run=dry_run, op_id=op_id, all_runs=all_runs))

    def list_runs(self, state: str | None = None, limit: int = PAGE_LIMIT_DEFAULT, consistent: bool = False, *,
                  since: str | None = None, until: str | None = None, before: str | None = None,
                  stale: bool = False) -> dict:
        """``GET /v1/runs``: runs and recorded slots of every job, newest first (a window, a cursor)."""
        return self._send(endpoints.list_runs(state, limit, consistent, since=since, until=until, before=before,
                                              stale=stale))

    def preview_spec(self, spec: dict, count: int = PREVIEW_COUNT_DEFAULT, name: str | None = None,
                     after: str | None = None) -> dict:
        """``POST /v1/preview``: the next ``count`` slots after ``after`` of a spec not stored, as job ``name``'s."""
        return self._send(endpoints.preview_spec(spec, count, name, after))

    def healthz(self, *, deadline_s: float | None = None) -> dict:
        """``GET /healthz``: ``{"ok", "role", "leader"}`` of the node tried first (a 503 returned), for ``deadline_s`` at most."""
        return self._send(endpoints.healthz(deadline_s=deadline_s))

    def metrics(self) -> str:
        """``GET /metrics``: the node's Prometheus text."""
        return self._send(endpoints.metrics())

    def openapi(self) -> dict:
        """``GET /v1/openapi.json``: the API's OpenAPI 3.1 document."""
        return self._send(endpoints.openapi())

    def workers(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/workers``: every registered worker."""
        return self._send(endpoints.workers(consistent, stale=stale))

    def worker(self, worker_id: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/workers/{id}``: one worker, with the runs it holds."""
        return self._send(endpoints.worker(worker_id, consistent, stale=stale))

    def drain_worker(self, worker_id: str) -> dict:
        """``POST /v1/workers/{id}/drain``: no more runs for a worker; it finishes and stops."""
        return self._send(endpoints.drain_worker(worker_id))

    def worker_lease(self, worker_id: str, *, max_runs: int, wait_s: float, ttl_ms: int, facts: dict | None = None,
                     results: list | None = None, idempotent_key: str | None = None,
                     timeout_s: float | None = None, deadline_s: float | None = None,
                     on_answer: Callable[[float], None] | None = None) -> dict:
        """``POST /v1/workers/{id}/lease``: up to ``max_runs`` runs, waiting up to ``wait_s``; and ``results``."""
        return self._send(endpoints.worker_lease(worker_id, max_runs=max_runs, wait_s=wait_s, ttl_ms=ttl_ms,
                                                 facts=facts, results=results, idempotent_key=idempotent_key,
                                                 timeout_s=timeout_s, deadline_s=deadline_s, on_answer=on_answer))

    def worker_heartbeat(self, worker_id: str, leases: list, ttl_ms: int, *, timeout_s: float | None = None,
                         deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/heartbeat``: extend a worker's leases."""
        return self._send(endpoints.worker_heartbeat(worker_id, leases, ttl_ms, timeout_s=timeout_s,
                                                     deadline_s=deadline_s))

    def worker_complete(self, worker_id: str, results: list, *, idempotent_key: str | None = None,
                        timeout_s: float | None = None, deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/complete``: report the outcomes of runs."""
        return self._send(endpoints.worker_complete(worker_id, results, idempotent_key=idempotent_key,
                                                    timeout_s=timeout_s, deadline_s=deadline_s))

    def worker_release(self, worker_id: str, leases: list, reason: str = "", *, idempotent_key: str | None = None,
                       timeout_s: float | None = None, deadline_s: float | None = None, not_started: bool = False) -> dict:
        """``POST /v1/workers/{id}/release``: give leases back (queued again at once)."""
        return self._send(endpoints.worker_release(worker_id, leases, reason, idempotent_key=idempotent_key,
                                                   timeout_s=timeout_s, deadline_s=deadline_s,
                                                   not_started=not_started))

    def worker_leave(self, worker_id: str, instance: str, reason: str | None = None, *,
                     idempotent_key: str | None = None, timeout_s: float | None = None,
                     deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/leave``: the worker process ``instance`` is going away (drained)."""
        return self._send(endpoints.worker_leave(worker_id, instance, reason, idempotent_key=idempotent_key,
                                                 timeout_s=timeout_s, deadline_s=deadline_s))

    def create_token(self, role: str, tenants: list[str] | None = None, expires: str | int | None = None,
                     note: str | None = None, workers: list[str] | None = None, jobs: list[str] | None = None) -> dict:
        """``POST /v1/tokens``: a new API token; its secret is shown this once."""
        return self._send(endpoints.create_token(role, tenants, expires, note, workers, jobs))

    def tokens(self, *, stale: bool = False) -> dict:
        """``GET /v1/tokens``: every token, without secrets."""
        return self._send(endpoints.tokens(stale=stale))

    def revoke_token(self, token_id: str) -> dict:
        """``DELETE /v1/tokens/{id}``: revoke a token."""
        return self._send(endpoints.revoke_token(token_id))

    def secrets_status(self, *, stale: bool = False) -> dict:
        """``GET /v1/secrets``: which keys the stored secret values are sealed under."""
        return self._send(endpoints.secrets_status(stale=stale))

    def rotate_seal_key(self, key: str) -> dict:
        """``POST /v1/secrets:rotate``: seal every stored secret value under key ``key``."""
        return self._send(endpoints.rotate_seal_key(key))

    def lock_acquire(self, name: str, owner: str, ttl_s: float, *, deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/acquire``: the lock and its fencing token (LockHeld if held)."""
        return self._send(endpoints.lock_acquire(name, owner, ttl_s, deadline_s=deadline_s))

    def lock_renew(self, name: str, token: int, ttl_s: float | None = None, *,
                   deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/renew``: extend the lease of ``token`` (LockLost if lost)."""
        return self._send(endpoints.lock_renew(name, token, ttl_s, deadline_s=deadline_s))

    def lock_release(self, name: str, token: int, *, deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/release``: release the lock held with ``token``."""
        return self._send(endpoints.lock_release(name, token, deadline_s=deadline_s))

    def lock_info(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict | None:
        """``GET /v1/locks/{name}``: the current holder, or None when the lock is free."""
        return self._send(endpoints.lock_info(name, consistent, stale=stale))


class Lock(LockPolicy):
    """A lock held with a lease that a background daemon thread renews every ``ttl_s / 3``
    (the decisions are :class:`~raftsched.client.policy.LockPolicy`'s).

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

    def __init__(self, client: Client, name: str, owner: str, ttl_s: float = LOCK_TTL_S_DEFAULT, *,
                 blocking: bool = False, timeout_s: float | None = None) -> None:
        super().__init__(name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)
        self.client = client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Lease:
        self.acquiring()
        while True:
            sent = self.clock.monotonic_s()
            try:
                res = self.client.lock_acquire(self.name, self.owner, self.ttl_s)
                break
            except LockHeld as e:
                pause = self.pause_after(e)
                if pause is None:
                    raise
                time.sleep(pause)
        lease = self.acquired(sent, res)
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, args=(lease,),
                                        name=f"raftsched-lock-renew:{self.name}", daemon=True)
        self._thread.start()
        return lease

    def release(self) -> None:
        """Stop renewing and release. A refused release (the lease had expired already) is
        logged, not raised; so is a release that could not reach the cluster (the lease then ends
        by its TTL)."""
        lease = self.lease
        if lease is None:
            return
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.stop_wait_s(self.client.timeout_s))
        self.lease = None
        try:
            self.client.lock_release(self.name, lease.token,
                                     deadline_s=self.release_deadline_s(self.client.deadline_s))
        except RaftschedError as e:
            self.release_failed(lease, e)
        finally:
            lease.lost.set()  # whatever happened, this lease is not held any more

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _renew_loop(self, lease: Lease) -> None:
        while not self._stop.wait(self.renew_wait_s(lease)):
            deadline_s = self.renew_deadline_s(lease)
            if deadline_s is None:
                return
            sent = self.clock.monotonic_s()
            try:
                res = self.client.lock_renew(self.name, lease.token, self.ttl_s, deadline_s=deadline_s)
            except Exception as e:
                if not self.renew_failed(lease, e):
                    return
            else:
                if not self.renewed(lease, sent, res):
                    return
