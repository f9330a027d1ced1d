"""The asyncio transport: :class:`AsyncClient` (aiohttp) and :class:`AsyncLock` (a lease
renewed by a task), with the blocking Client's methods, awaited.

    from raftsched import AsyncClient

    async with AsyncClient(["http://127.0.0.1:8701", "http://127.0.0.1:8702"], token=token) as c:
        await c.put_job("nightly", {"schedule": {"cron": "30 2 * * *"}, ...})
        page = await c.list_jobs(labels={"raftsched.app": "reports"})
        async with c.lock("reindex", owner="host-a", ttl_s=10) as lease:
            await store.write("index", data, token=lease.token)

Every endpoint method of :class:`raftsched.client.Client` is a coroutine method here, with the
same name, arguments and answer, and both hand the same request description
(raftsched/client/endpoints.py) to the same rules (raftsched/client/core.py): the same nodes in
the same order, the same ``Idempotency-Key`` on every retry of a mutation, the same typed errors,
and an unknown outcome never reported as a definite failure. tests/test_client_layout.py checks
that the two classes keep the same methods.

Transport differences: one ``aiohttp.ClientSession`` (connections kept alive) per client,
opened on first use and closed by :meth:`AsyncClient.close` or ``async with``. The rule is the
blocking Client's: a request whose connection could not be made was not sent; once a connection
was made, any failure, a timeout included, may have applied (for a mutation, the call then ends
:class:`Indeterminate` rather than ``Unavailable`` if nothing better comes back). aiohttp sends
a PUT or DELETE again by itself, once, on a new connection, when its connection drops
mid-request, and raises the error of that resend: a "connection refused" there does not mean
the request never left, so every attempt of a request is counted (:class:`_Attempts`) and the
request counts as not sent only if every attempt failed to connect.
"""
from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Callable

import aiohttp
import yarl

from ..aio import wait_event
from ..core.errors import RaftschedError
from . import endpoints
from .core import (
    DEADLINE_S_DEFAULT, TIMEOUT_S_DEFAULT, LockHeld, LostAfterSendError, Node, NotSentError, Request, TlsFailedError,
    Transport, TransportError, Try, Wait, decode, lost_why, NO_CLIENT_CERT_HINT,
)
from .endpoints import PAGE_LIMIT_DEFAULT, PREVIEW_COUNT_DEFAULT, UNSET
from .policy import BACKFILL_POLL_S_DEFAULT, LOCK_TTL_S_DEFAULT, BackfillWait, Lease, LockPolicy
from .tls import client_tls_context, probe_context

__all__ = ["AsyncClient", "AsyncLock"]

#: The errors of an attempt that never got a connection: its request cannot have left.
_NO_CONNECTION = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)

#: TCP keepalive on every connection of the client: a node whose host vanished (powered off, cut
#: off: no reset comes) is noticed ~KEEPALIVE_IDLE_S + KEEPALIVE_PROBES x KEEPALIVE_INTERVAL_S
#: after its connection went quiet (25 s), not at the end of the request's timeout: a remote
#: worker's long-poll waits up to 60 s when its node asks for long waits (its timeout is the
#: wait plus 10 s). A live node's kernel answers the probes; nothing reaches the node's code.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3


def keepalive_socket(addr_info: tuple) -> socket.socket:
    """The client's socket factory (aiohttp's ``socket_factory``): a socket for ``addr_info``
    (family, type, proto, canonname, sockaddr) with TCP keepalive on, probing as above where
    the system lets the values be set (Linux, macOS)."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                            ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
            opt = getattr(socket, name, None)
            if opt is not None:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    except OSError:
        pass  # not a TCP socket, or options the system refuses: a connection without keepalive
    return sock


class _Attempts:
    """The attempts of one request, counted by an aiohttp client middleware passed with it.

    aiohttp (3.9 and later) resends a request of an idempotent method (GET, PUT, DELETE, ...)
    once, on a new connection, when the first attempt's connection drops after it was made
    (``retry_persistent_connection`` in ``ClientSession._request``), and raises the second
    attempt's error. It offers no supported way to turn that off (``ClientSession._retry_connection``
    is private; aio-libs/aiohttp#10790). A client middleware (documented, aiohttp 3.12) wraps
    every attempt, the resend included, so it sees each attempt's outcome: an attempt that ended
    in a connect error never left; any other (an answer, a lost connection, a timeout after the
    connection was made) may have. The resend itself is harmless here (a mutation carries one
    ``Idempotency-Key`` on every attempt) and spares a stale keep-alive connection a round.
    """

    __slots__ = ("made", "not_connected")

    def __init__(self) -> None:
        self.made = 0           # attempts that reached the transport (the middleware ran)
        self.not_connected = 0  # of them, those that never got a connection

    @property
    def may_have_left(self) -> bool:
        """Whether some attempt got a connection, so that its request may have left."""
        return self.made > self.not_connected

    async def __call__(self, req: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        self.made += 1
        try:
            return await handler(req)
        except _NO_CONNECTION:
            self.not_connected += 1
            raise


async def _speaks_tls(node: Node, timeout: float) -> bool:
    """Whether a node that dropped a plain HTTP request completes a TLS handshake (blocking.py's
    ``_speaks_tls``, on the loop)."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(node.host, node.port, ssl=probe_context(), server_hostname=node.host), timeout)
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    writer.close()
    return True


class AsyncClient(Transport):
    """An asyncio client of a raftsched cluster; see the module docstring.

    :param urls: one base URL or a list of them, one per node.
    :param token: the API bearer token.
    :param timeout_s: the timeout of one HTTP attempt (keep it above the node's 5 s propose
        timeout).
    :param deadline_s: how long one logical call keeps retrying before it raises.
    :param session: an aiohttp session to use (this client then does not close it).
    :param ca_file: for ``https://`` URLs, the CA (PEM) the nodes' certificates chain to
        (default: the system's); ``cert_file`` and ``key_file``, a client certificate for mutual
        TLS. As :class:`raftsched.client.Client`: certificates and host names are always verified,
        and a certificate that does not verify fails at once.
    """

    def __init__(self, urls: list[str] | str, token: str | None = None, timeout_s: float = TIMEOUT_S_DEFAULT,
                 *, deadline_s: float = DEADLINE_S_DEFAULT, session: aiohttp.ClientSession | None = None,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None, fail_fast: bool = False) -> None:
        super().__init__(urls, token, timeout_s, deadline_s, fail_fast)
        self._ssl = client_tls_context(ca_file, cert_file, key_file) if self._uses_https() else None
        self._client_cert = bool(cert_file)
        self._session = session
        self._own_session = session is None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session this client opened (not one it was given)."""
        s, self._session = self._session, None
        if s is not None and self._own_session:
            await s.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = (aiohttp.TCPConnector(ssl=self._ssl, socket_factory=keepalive_socket) if self._ssl is not None
                         else aiohttp.TCPConnector(socket_factory=keepalive_socket))
            self._session = aiohttp.ClientSession(connector=connector)
            self._own_session = True
        return self._session

    # ------------------------------------------------------------------ transport
    async def _once(self, i: int, method: str, target: str, body: bytes | None, headers: dict,
                    timeout: float) -> tuple[int, dict, Any]:
        node = self._nodes[i]
        url = yarl.URL(node.base + target, encoded=True)
        session = self._http()
        attempts = _Attempts()
        # A request's own middlewares replace the session's, so a given session's are put first
        # (aiohttp has no public accessor for them); ours is innermost, next to each attempt.
        middlewares = (*getattr(session, "_middlewares", ()), attempts)
        answered = False  # a status line came back
        try:
            async with session.request(
                    method, url, data=body, headers=headers, allow_redirects=False, middlewares=middlewares,
                    timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=timeout)) as resp:
                answered = True
                raw = await resp.read()
                status = resp.status
                rh = {k.lower(): v for k, v in resp.headers.items()}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if not node.https and attempts.may_have_left and await _speaks_tls(node, timeout):
                # A TLS port could not read the request as HTTP: nothing was done (blocking.py alike).
                raise TlsFailedError(f"{node.url}: the node expects TLS: use https://{node.base[7:]} "
                                     "(and a CA file)") from e
            # (a node that wants a certificate closes the connection before any answer, at once)
            hint = (NO_CLIENT_CERT_HINT if node.https and not self._client_cert and not answered
                    and not isinstance(e, TimeoutError) else "")
            if attempts.may_have_left:
                # Whatever the last attempt's error (aiohttp's resend meeting "connection
                # refused", say), an earlier attempt got a connection: the outcome is unknown.
                raise LostAfterSendError(f"{node.url}: {lost_why(e, timeout)} (aiohttp made "
                                         f"{attempts.made} attempt(s); one had a connection){hint}") from e
            if isinstance(e, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientConnectorSSLError)):
                raise TlsFailedError(f"TLS with {node.url} failed: {e}") from e
            if isinstance(e, _NO_CONNECTION):
                raise NotSentError(f"{node.url}: {e}") from e
            raise LostAfterSendError(f"{node.url}: {lost_why(e, timeout)}{hint}") from e
        return status, rh, decode(raw)

    async def _send(self, request: Request) -> Any:
        """Send one logical request (core.Exchange's steps) and return its result."""
        ex = self._exchange(request, time.monotonic())
        while True:
            step = ex.next(time.monotonic())
            if isinstance(step, Try):
                try:
                    answer = await self._once(step.node, ex.method, ex.target, ex.data, ex.headers, step.timeout_s)
                except TransportError as e:
                    ex.failed(step.node, e)
                else:
                    ex.answered(step.node, *answer, time.monotonic())
            elif isinstance(step, Wait):
                await asyncio.sleep(step.seconds)
            else:
                return self._finish(ex)

    async def request(self, method: str, path: str, body: Any = None, *, idempotent_key: str | None = None,
                      deadline_s: float | None = None, timeout_s: float | None = None, headers: dict | None = None,
                      recover: Callable[[RaftschedError], Any] | None = None, accept: tuple[int, ...] = ()) -> Any:
        """:meth:`raftsched.client.Client.request`, awaited: the same rules, the same errors."""
        return await self._send(self._request(method, path, body, idempotent_key, deadline_s, timeout_s, headers,
                                              recover, accept))

    # ------------------------------------------------------------------ what is more than one call
    def lock(self, name: str, owner: str, ttl_s: float = LOCK_TTL_S_DEFAULT, *, blocking: bool = False,
             timeout_s: float | None = None) -> AsyncLock:
        """An :class:`AsyncLock` (``async with``): acquire, renew in a task, release on exit.
        Pass ``lease.token`` to every downstream write, and check ``lease.lost`` before each."""
        return AsyncLock(self, name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)

    async def wait_backfill(self, backfill_id: str, *, poll_s: float = BACKFILL_POLL_S_DEFAULT,
                            timeout_s: float | None = None, on_progress: Callable[[dict], Any] | None = None) -> dict:
        """Poll a backfill (or bulk operation) until it is done or cancelled; ``on_progress(view)``
        is called with each view read. :raises TimeoutError: still running after ``timeout_s``."""
        w = BackfillWait(backfill_id, poll_s=poll_s, timeout_s=timeout_s, on_progress=on_progress)
        while True:
            view = await self.get_backfill(backfill_id)
            if w.done(view):
                return view
            await asyncio.sleep(w.poll_s)

    # ------------------------------------------------------------------ the endpoints (endpoints.py)
    async def cluster(self, consistent: bool = False) -> dict:
        """``GET /v1/cluster``: the answering node, its role, the leader, members, indexes."""
        return await self._send(endpoints.cluster(consistent))

    async def whoami(self) -> dict:
        """``GET /v1/whoami``: the token's id, role, tenants and scopes."""
        return await self._send(endpoints.whoami())

    async def fencing(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/cluster/fencing``: the highest fencing token granted."""
        return await self._send(endpoints.fencing(consistent, stale=stale))

    async def raise_fencing(self, at_least: int) -> dict:
        """``POST /v1/cluster/fencing``: the fencing counter raised to ``at_least`` when below."""
        return await self._send(endpoints.raise_fencing(at_least))

    async def add_member(self, addr: str) -> dict:
        """``POST /v1/cluster/members``: add a node (a learner, then a voter once it holds the log)."""
        return await self._send(endpoints.add_member(addr))

    async def remove_member(self, addr: str) -> dict:
        """``DELETE /v1/cluster/members/{addr}``: remove a node (a leader hands its leadership over)."""
        return await self._send(endpoints.remove_member(addr))

    async def put_job(self, name: str, spec: dict, create_only: bool = False, *, paused: bool = False) -> dict:
        """``PUT /v1/jobs/{name}``: create or replace a job (``create_only``: 409 if it exists; ``paused``: paused by the same command)."""
        return await self._send(endpoints.put_job(name, spec, create_only, paused=paused))

    async def put_jobs(self, jobs: dict[str, dict], create_only: bool = False, *, idempotency_key: str | None = None,
                       deadline_s: float | None = None, paused: bool = False, dry_run: bool = False) -> dict:
        """``POST /v1/jobs:batch``: create or replace up to 10 000 jobs, validated whole first (``paused``: each paused by the same command; ``dry_run``: what it would do, changing nothing)."""
        return await self._send(endpoints.put_jobs(jobs, create_only, idempotency_key=idempotency_key,
                                                   deadline_s=deadline_s, paused=paused, dry_run=dry_run))

    async def plan_jobs(self, jobs: dict[str, dict], create_only: bool = False, *, deadline_s: float | None = None,
                        paused: bool = False) -> dict:
        """``POST /v1/jobs:plan``: what a batch of these jobs would do to each, changing nothing (a reader may ask)."""
        return await self._send(endpoints.plan_jobs(jobs, create_only, deadline_s=deadline_s, paused=paused))

    async def get_job(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}``: a job's spec and state."""
        return await self._send(endpoints.get_job(name, consistent, stale=stale))

    async def delete_job(self, name: str, force: bool = False) -> dict:
        """``DELETE /v1/jobs/{name}``: delete a job (``force``: though other jobs run after it)."""
        return await self._send(endpoints.delete_job(name, force))

    async def graph(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/graph``: its parents and children, transitively (pipelines)."""
        return await self._send(endpoints.graph(name, consistent, stale=stale))

    async def list_jobs(self, limit: int = PAGE_LIMIT_DEFAULT, after: str | None = None, consistent: bool = False,
                        labels: dict[str, str] | None = None, *, stale: bool = False) -> dict:
        """``GET /v1/jobs``: one page of jobs, ``{"jobs", "next", "total"}`` (``labels``: only those)."""
        return await self._send(endpoints.list_jobs(limit, after, consistent, labels, stale=stale))

    async def runs(self, name: str, limit: int = PAGE_LIMIT_DEFAULT, state: str | None = None,
                   slot: str | None = None, consistent: bool = False, *, since: str | None = None,
                   until: str | None = None, before: str | None = None, stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/runs``: a job's runs, newest first (a window, a cursor)."""
        return await self._send(endpoints.runs(name, limit, state, slot, consistent, since=since, until=until,
                                               before=before, stale=stale))

    async def get_run(self, run: str, *, stale: bool = False) -> dict:
        """``GET /v1/runs/{run}``: one run."""
        return await self._send(endpoints.get_run(run, stale=stale))

    async def preview(self, name: str, count: int = PREVIEW_COUNT_DEFAULT, after: str | None = None, *,
                      stale: bool = False) -> dict:
        """``GET /v1/jobs/{name}/preview``: a job's next ``count`` slots, with DST marks."""
        return await self._send(endpoints.preview(name, count, after, stale=stale))

    async def explain(self, name: str, down_from: str | None = None, down_to: str | None = None, *,
                      slot: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/explain``: an outage window's effect, or why a slot missed its deadline."""
        return await self._send(endpoints.explain(name, down_from, down_to, slot=slot))

    async def ping(self, name: str, status: str = "success", *, slot: str | int | None = None) -> dict:
        """``POST /v1/jobs/{name}/ping``: a heartbeat job's start, success or fail."""
        return await self._send(endpoints.ping(name, status, slot=slot))

    async def list_deadlines(self, state: str | None = None, job: str | None = None, since: str | None = None,
                      limit: int = PAGE_LIMIT_DEFAULT, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/deadlines``: slots' deadline outcomes, newest first."""
        return await self._send(endpoints.list_deadlines(state, job, since, limit, consistent, stale=stale))

    async def trigger(self, name: str, *, slot: str | None = None, payload: Any = UNSET,
                      propagate: bool = False, rerun: bool = False, downstream: bool = False) -> dict:
        """``POST /v1/jobs/{name}/trigger``: a manual run now (or of ``slot``, deduplicated; ``propagate``: to children; ``rerun``: the slot again; ``downstream``: its children too)."""
        return await self._send(endpoints.trigger(name, slot=slot, payload=payload, propagate=propagate, rerun=rerun,
                                                  downstream=downstream))

    async def pause(self, name: str, note: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/pause``: fire no more slots until resumed (``note``: why)."""
        return await self._send(endpoints.pause(name, note))

    async def resume(self, name: str, catch_up: bool = False) -> dict:
        """``POST /v1/jobs/{name}/resume``: fire again (``catch_up``: the missed slots too)."""
        return await self._send(endpoints.resume(name, catch_up))

    async def dlq(self, queue: str | None = None, limit: int = PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> dict:
        """``GET /v1/dlq``: dead runs, of every queue or of ``queue``."""
        return await self._send(endpoints.dlq(queue, limit, stale=stale))

    async def dlq_get(self, run: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/dlq/{run}``: one dead run."""
        return await self._send(endpoints.dlq_get(run, consistent, stale=stale))

    async def cancel_run(self, run: str, reason: str | None = None) -> dict:
        """``POST /v1/runs/{run}/cancel``: end a queued or running run (``reason``: why)."""
        return await self._send(endpoints.cancel_run(run, reason))

    async def cancel_job_runs(self, name: str, reason: str | None = None, running: bool = False,
                              after: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/cancel``: end a job's queued runs (``running``: its running ones too)."""
        return await self._send(endpoints.cancel_job_runs(name, reason, running, after))

    async def dlq_requeue(self, run: str) -> dict:
        """``POST /v1/dlq/{run}/requeue``: queue a dead run again, with a fresh budget."""
        return await self._send(endpoints.dlq_requeue(run))

    async def dlq_delete(self, run: str) -> dict:
        """``DELETE /v1/dlq/{run}``: delete a dead run from its dead-letter queue."""
        return await self._send(endpoints.dlq_delete(run))

    async def queues(self, *, stale: bool = False) -> dict:
        """``GET /v1/queues``: every queue: depth, running, oldest waiting, dead."""
        return await self._send(endpoints.queues(stale=stale))

    async def put_queue(self, name: str, max_depth: int | None = None, on_full: str | None = None, *,
                  tenants: Any = UNSET) -> dict:
        """``PUT /v1/queues/{name}``: a queue's settings, and the tenants it belongs to."""
        return await self._send(endpoints.put_queue(name, max_depth, on_full, tenants=tenants))

    async def tenants(self, *, stale: bool = False) -> dict:
        """``GET /v1/tenants``: every tenant's rate limit, policy and default routes."""
        return await self._send(endpoints.tenants(stale=stale))

    async def tenant(self, name: str, *, stale: bool = False) -> dict:
        """``GET /v1/tenants/{name}``: a tenant's rate limit, policy and default routes."""
        return await self._send(endpoints.tenant(name, stale=stale))

    async def put_tenant(self, name: str, rate_per_s: float | None = None, burst: int | None = None, *,
                   executors: list[str] | None = None, placement_labels: dict[str, str] | None = None,
                   network_allow: list[str] | None = None, notify: list[dict] | None = None) -> dict:
        """``PUT /v1/tenants/{name}``: a tenant's rate limit and/or its policy and/or default routes."""
        return await self._send(endpoints.put_tenant(name, rate_per_s, burst, executors=executors,
                                                 placement_labels=placement_labels, network_allow=network_allow,
                                                 notify=notify))

    async def sinks(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/sinks``: every sink (secrets redacted)."""
        return await self._send(endpoints.sinks(consistent, stale=stale))

    async def get_sink(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/sinks/{name}``: a sink. :raises NotFound:"""
        return await self._send(endpoints.get_sink(name, consistent, stale=stale))

    async def put_sink(self, name: str, spec: dict) -> dict:
        """``PUT /v1/sinks/{name}``: create or replace a sink."""
        return await self._send(endpoints.put_sink(name, spec))

    async def delete_sink(self, name: str) -> dict:
        """``DELETE /v1/sinks/{name}``."""
        return await self._send(endpoints.delete_sink(name))

    async def sink_dead(self, name: str, limit: int = endpoints.PAGE_LIMIT_DEFAULT, *, stale: bool = False) -> dict:
        """``GET /v1/sinks/{name}/dead``: the events the sink refused past its retry budget."""
        return await self._send(endpoints.sink_dead(name, limit, stale=stale))

    async def sink_requeue(self, name: str, events: list[str] | None = None) -> dict:
        """``POST /v1/sinks/{name}/dead:requeue``: deliver dead events again."""
        return await self._send(endpoints.sink_requeue(name, events))

    async def delete_tenant(self, name: str) -> dict:
        """``DELETE /v1/tenants/{name}``: lift the tenant's rate limit, policy and default routes."""
        return await self._send(endpoints.delete_tenant(name))

    async def backfill(self, job: str, from_: str, to: str, *, reprocess: str | None = None, order: str | None = None,
                       max_concurrent: int | None = None, rate_per_s: float | None = None,
                       max_slots: int | None = None, payload: Any = UNSET, overlap: str | None = None,
                       dry_run: bool = False, backfill_id: str | None = None, cascade: str | None = None,
                       upstream: str | None = None) -> dict:
        """``POST /v1/jobs/{job}/backfills``: run a job for the slots of a past range."""
        return await self._send(endpoints.backfill(job, from_, to, reprocess=reprocess, order=order,
                                                   max_concurrent=max_concurrent, rate_per_s=rate_per_s,
                                                   max_slots=max_slots, payload=payload, overlap=overlap,
                                                   dry_run=dry_run, backfill_id=backfill_id, cascade=cascade,
                                                   upstream=upstream))

    async def backfills(self, kind: str | None = None, job: str | None = None, state: str | None = None, *,
                        stale: bool = False) -> dict:
        """``GET /v1/backfills``: every backfill and bulk DLQ operation."""
        return await self._send(endpoints.backfills(kind, job, state, stale=stale))

    async def get_backfill(self, backfill_id: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/backfills/{id}``: one backfill or bulk operation, with its progress."""
        return await self._send(endpoints.get_backfill(backfill_id, consistent, stale=stale))

    async def pause_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/pause``: start no more of its runs until resumed."""
        return await self._send(endpoints.pause_backfill(backfill_id))

    async def resume_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/resume``: go on with a paused operation."""
        return await self._send(endpoints.resume_backfill(backfill_id))

    async def cancel_backfill(self, backfill_id: str) -> dict:
        """``POST /v1/backfills/{id}/cancel``: stop a backfill or bulk operation."""
        return await self._send(endpoints.cancel_backfill(backfill_id))

    async def dlq_requeue_matching(self, *, queue: str | None = None, job: str | None = None,
                                   error: str | None = None, dead_from: str | None = None, dead_to: str | None = None,
                                   max_count: int | None = None, rate_per_s: float | None = None,
                                   max_concurrent: int | None = None, dry_run: bool = False,
                                   op_id: str | None = None, all_runs: bool = False) -> dict:
        """``POST /v1/dlq:requeue``: queue again the dead runs that match, as one operation."""
        return await self._send(endpoints.dlq_requeue_matching(queue=queue, job=job, error=error, dead_from=dead_from,
                                                               dead_to=dead_to, max_count=max_count,
                                                               rate_per_s=rate_per_s, max_concurrent=max_concurrent,
                                                               dry_run=dry_run, op_id=op_id, all_runs=all_runs))

    async def dlq_purge_matching(self, *, queue: str | None = None, job: str | None = None, error: str | None = None,
                                 dead_from: str | None = None, dead_to: str | None = None,
                                 max_count: int | None = None, rate_per_s: float | None = None, dry_run: bool = False,
                                 op_id: str | None = None, all_runs: bool = False) -> dict:
        """``POST /v1/dlq:purge``: delete the dead runs that match, as one operation."""
        return await self._send(endpoints.dlq_purge_matching(queue=queue, job=job, error=error, dead_from=dead_from,
                                                             dead_to=dead_to, max_count=max_count,
                                                             rate_per_s=rate_per_s, dry_run=dry_run, op_id=op_id,
                                                             all_runs=all_runs))

    async def list_runs(self, state: str | None = None, limit: int = PAGE_LIMIT_DEFAULT,
                        consistent: bool = False, *, since: str | None = None, until: str | None = None,
                        before: str | None = None, stale: bool = False) -> dict:
        """``GET /v1/runs``: runs and recorded slots of every job, newest first (a window, a cursor)."""
        return await self._send(endpoints.list_runs(state, limit, consistent, since=since, until=until,
                                                    before=before, stale=stale))

    async def preview_spec(self, spec: dict, count: int = PREVIEW_COUNT_DEFAULT, name: str | None = None,
                           after: str | None = None) -> dict:
        """``POST /v1/preview``: the next ``count`` slots after ``after`` of a spec not stored, as job ``name``'s."""
        return await self._send(endpoints.preview_spec(spec, count, name, after))

    async def healthz(self, *, deadline_s: float | None = None) -> dict:
        """``GET /healthz``: ``{"ok", "role", "leader"}`` of the node tried first (a 503 returned), for ``deadline_s`` at most."""
        return await self._send(endpoints.healthz(deadline_s=deadline_s))

    async def metrics(self) -> str:
        """``GET /metrics``: the node's Prometheus text."""
        return await self._send(endpoints.metrics())

    async def openapi(self) -> dict:
        """``GET /v1/openapi.json``: the API's OpenAPI 3.1 document."""
        return await self._send(endpoints.openapi())

    async def workers(self, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/workers``: every registered worker."""
        return await self._send(endpoints.workers(consistent, stale=stale))

    async def worker(self, worker_id: str, consistent: bool = False, *, stale: bool = False) -> dict:
        """``GET /v1/workers/{id}``: one worker, with the runs it holds."""
        return await self._send(endpoints.worker(worker_id, consistent, stale=stale))

    async def drain_worker(self, worker_id: str) -> dict:
        """``POST /v1/workers/{id}/drain``: no more runs for a worker; it finishes and stops."""
        return await self._send(endpoints.drain_worker(worker_id))

    async def worker_lease(self, worker_id: str, *, max_runs: int, wait_s: float, ttl_ms: int,
                           facts: dict | None = None, results: list | None = None,
                           idempotent_key: str | None = None, timeout_s: float | None = None,
                           deadline_s: float | None = None,
                           on_answer: Callable[[float], None] | None = None) -> dict:
        """``POST /v1/workers/{id}/lease``: up to ``max_runs`` runs, waiting up to ``wait_s``; and ``results``."""
        return await self._send(endpoints.worker_lease(worker_id, max_runs=max_runs, wait_s=wait_s, ttl_ms=ttl_ms,
                                                       facts=facts, results=results, idempotent_key=idempotent_key,
                                                       timeout_s=timeout_s, deadline_s=deadline_s, on_answer=on_answer))

    async def worker_heartbeat(self, worker_id: str, leases: list, ttl_ms: int, *, timeout_s: float | None = None,
                               deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/heartbeat``: extend a worker's leases."""
        return await self._send(endpoints.worker_heartbeat(worker_id, leases, ttl_ms, timeout_s=timeout_s,
                                                           deadline_s=deadline_s))

    async def worker_complete(self, worker_id: str, results: list, *, idempotent_key: str | None = None,
                              timeout_s: float | None = None, deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/complete``: report the outcomes of runs."""
        return await self._send(endpoints.worker_complete(worker_id, results, idempotent_key=idempotent_key,
                                                          timeout_s=timeout_s, deadline_s=deadline_s))

    async def worker_release(self, worker_id: str, leases: list, reason: str = "", *,
                             idempotent_key: str | None = None, timeout_s: float | None = None,
                             deadline_s: float | None = None, not_started: bool = False) -> dict:
        """``POST /v1/workers/{id}/release``: give leases back (queued again at once)."""
        return await self._send(endpoints.worker_release(worker_id, leases, reason, idempotent_key=idempotent_key,
                                                         timeout_s=timeout_s, deadline_s=deadline_s,
                                                         not_started=not_started))

    async def worker_leave(self, worker_id: str, instance: str, reason: str | None = None, *,
                           idempotent_key: str | None = None, timeout_s: float | None = None,
                           deadline_s: float | None = None) -> dict:
        """``POST /v1/workers/{id}/leave``: the worker process ``instance`` is going away (drained)."""
        return await self._send(endpoints.worker_leave(worker_id, instance, reason, idempotent_key=idempotent_key,
                                                       timeout_s=timeout_s, deadline_s=deadline_s))

    async def create_token(self, role: str, tenants: list[str] | None = None, expires: str | int | None = None,
                           note: str | None = None, workers: list[str] | None = None, jobs: list[str] | None = None) -> dict:
        """``POST /v1/tokens``: a new API token; its secret is shown this once."""
        return await self._send(endpoints.create_token(role, tenants, expires, note, workers, jobs))

    async def tokens(self, *, stale: bool = False) -> dict:
        """``GET /v1/tokens``: every token, without secrets."""
        return await self._send(endpoints.tokens(stale=stale))

    async def revoke_token(self, token_id: str) -> dict:
        """``DELETE /v1/tokens/{id}``: revoke a token."""
        return await self._send(endpoints.revoke_token(token_id))

    async def secrets_status(self, *, stale: bool = False) -> dict:
        """``GET /v1/secrets``: which keys the stored secret values are sealed under."""
        return await self._send(endpoints.secrets_status(stale=stale))

    async def rotate_seal_key(self, key: str) -> dict:
        """``POST /v1/secrets:rotate``: seal every stored secret value under key ``key``."""
        return await self._send(endpoints.rotate_seal_key(key))

    async def lock_acquire(self, name: str, owner: str, ttl_s: float, *, deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/acquire``: the lock and its fencing token (LockHeld if held)."""
        return await self._send(endpoints.lock_acquire(name, owner, ttl_s, deadline_s=deadline_s))

    async def lock_renew(self, name: str, token: int, ttl_s: float | None = None, *,
                         deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/renew``: extend the lease of ``token`` (LockLost if lost)."""
        return await self._send(endpoints.lock_renew(name, token, ttl_s, deadline_s=deadline_s))

    async def lock_release(self, name: str, token: int, *, deadline_s: float | None = None) -> dict:
        """``POST /v1/locks/{name}/release``: release the lock held with ``token``."""
        return await self._send(endpoints.lock_release(name, token, deadline_s=deadline_s))

    async def lock_info(self, name: str, consistent: bool = False, *, stale: bool = False) -> dict | None:
        """``GET /v1/locks/{name}``: the current holder, or None when the lock is free."""
        return await self._send(endpoints.lock_info(name, consistent, stale=stale))


#: Releases sent in the background (a release whose caller was cancelled), held until they end.
#: The longest a release waits for its answer in a task that is being cancelled: the
#: cancellation is held that long, no longer (the lease then ends by its TTL).
CANCELLED_RELEASE_S = 2.0


async def _release_while_cancelled(lock: AsyncLock, lease: Lease) -> None:
    """Release ``lease`` for a caller that is being cancelled, in the caller's task (its client
    still open: a task of its own ran only after the caller's ``async with`` had closed the
    client, or never, at the end of ``asyncio.run``), within CANCELLED_RELEASE_S. Every failure
    is logged as a failed release, never raised: the cancellation goes on to the caller."""
    try:
        await asyncio.wait_for(
            lock.client.lock_release(lock.name, lease.token,
                                     deadline_s=min(CANCELLED_RELEASE_S, lock.release_deadline_s(lock.client.deadline_s))),
            CANCELLED_RELEASE_S)
    except RaftschedError as e:
        lock.release_failed(lease, e)
    except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - a closed session, a second cancel: said
        lock.release_failed(lease, RaftschedError(f"{type(e).__name__}: {e}"))


class AsyncLock(LockPolicy):
    """:class:`raftsched.client.Lock` for asyncio: a lock held with a lease that a task renews
    every ``ttl_s / 3``; ``async with client.lock(...) as lease``. The same honesty applies:
    holding it does not make you safe by itself, the fencing token does (raftsched/client/).

    :param blocking: wait for the lock while it is held (polling until the holder's lease ends).
    :param timeout_s: with ``blocking``, how long to wait (None: forever); then LockHeld.
    """

    def __init__(self, client: AsyncClient, name: str, owner: str, ttl_s: float = LOCK_TTL_S_DEFAULT, *,
                 blocking: bool = False, timeout_s: float | None = None) -> None:
        super().__init__(name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)
        self.client = client
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def acquire(self) -> Lease:
        self.acquiring()
        while True:
            sent = self.clock.monotonic_s()
            try:
                res = await self.client.lock_acquire(self.name, self.owner, self.ttl_s)
                break
            except LockHeld as e:
                pause = self.pause_after(e)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        lease = self.acquired(sent, res)
        self._stop.clear()
        self._task = asyncio.create_task(self._renew_loop(lease), name=f"raftsched-lock-renew:{self.name}")
        return lease

    async def release(self) -> None:
        """Stop renewing and release; a refused or failed release is logged, not raised (the
        lease then ends by its TTL). Cancelling the task that awaits it cancels the renewal,
        sends the release (best effort, for at most CANCELLED_RELEASE_S) and raises CancelledError."""
        lease = self.lease
        if lease is None:
            return
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(task, self.stop_wait_s(self.client.timeout_s))
            except asyncio.TimeoutError:
                task.cancel()
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    # This task is being cancelled (wait_for has cancelled the renewal): the
                    # lease is given up at once, its release sent before the cancellation goes on
                    # to the caller (briefly: CANCELLED_RELEASE_S).
                    self.lease = None
                    lease.lost.set()
                    await _release_while_cancelled(self, lease)
                    raise
                # Else the renewal was cancelled by someone else: release as usual.
        self.lease = None
        try:
            await self.client.lock_release(self.name, lease.token,
                                           deadline_s=self.release_deadline_s(self.client.deadline_s))
        except RaftschedError as e:
            self.release_failed(lease, e)
        finally:
            lease.lost.set()

    async def __aenter__(self) -> Lease:
        return await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def _renew_loop(self, lease: Lease) -> None:
        while not await wait_event(self._stop, self.renew_wait_s(lease)):
            deadline_s = self.renew_deadline_s(lease)
            if deadline_s is None:
                return
            sent = self.clock.monotonic_s()
            try:
                res = await self.client.lock_renew(self.name, lease.token, self.ttl_s, deadline_s=deadline_s)
            except Exception as e:
                if not self.renew_failed(lease, e):
                    return
            else:
                if not self.renewed(lease, sent, res):
                    return
