"""An asyncio client of the raftsched admin API (aiohttp), with the sync Client's methods.

    from raftsched import AsyncClient

    async with AsyncClient(["http://127.0.0.1:8701", "http://127.0.0.1:8702"], token=token) as c:
        await c.put_job("nightly", {"schedule": {"cron": "30 2 * * *"}, ...})
        page = await c.list_jobs(labels={"raftsched.app": "reports"})
        async with c.lock("reindex", owner="host-a", ttl_s=10) as lease:
            await store.write("index", data, token=lease.token)

Every endpoint method of :class:`raftsched.client.Client` is a coroutine method here, with the
same name, arguments and answer: the methods are Client's own, awaited (so an endpoint added to
Client is here too; tests/test_client_coverage.py checks both against every route of the API).
Routing and retries are :class:`raftsched.client_rules.Call`'s, which the sync Client drives
too: the same nodes in the same order, the same ``Idempotency-Key`` on every retry of a
mutation, the same typed errors, and an unknown outcome never reported as a definite failure.

Transport differences: one ``aiohttp.ClientSession`` (connections kept alive) per client,
opened on first use and closed by :meth:`AsyncClient.close` or ``async with``. The rule is the
sync Client's: a request whose connection could not be made was not sent; once a connection was
made, any failure, a timeout included, may have applied (for a mutation, the call then ends
:class:`Indeterminate` rather than ``Unavailable`` if nothing better comes back). aiohttp sends
a PUT or DELETE again by itself, once, on a new connection, when its connection drops
mid-request, and raises the error of that resend: a "connection refused" there does not mean
the request never left, so every attempt of a request is counted (:class:`_Attempts`) and the
request counts as not sent only if every attempt failed to connect.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
from typing import Any, Callable

import aiohttp
import yarl

from .aio import wait_event
from .client import Client, Lease, LockHeld, LockLost, TlsFailedError, _Node, client_tls_context, lock_poll_pause, prepare
from .client_rules import Call, Done, Fail, LostAfterSendError, NotSentError, Wait, with_status
from .core.errors import RaftschedError, Unavailable

log = logging.getLogger("raftsched.client")

__all__ = ["AsyncClient", "AsyncLock"]

#: Client's methods that are not endpoints: the transport, and the thread-renewed Lock (this
#: client has its own, :meth:`AsyncClient.lock`). Every other public method of Client is taken
#: as it is, so it must be an endpoint call: build the request and return ``self.request(...)``
#: or ``self._get(...)`` (post-processing goes in ``recover``), doing nothing after it. A
#: method of Client that does more belongs here, with an async version of its own.
_NOT_BORROWED = frozenset({"request", "lock", "wait_backfill"})


#: The errors of an attempt that never got a connection: its request cannot have left.
_NO_CONNECTION = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


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

    async def __call__(self, req: aiohttp.ClientRequest, handler) -> aiohttp.ClientResponse:
        self.made += 1
        try:
            return await handler(req)
        except _NO_CONNECTION:
            self.not_connected += 1
            raise


def _base(node: _Node) -> str:
    host = f"[{node.host}]" if ":" in node.host else node.host
    return f"{'https' if node.https else 'http'}://{host}:{node.port}{node.prefix}"


class AsyncClient:
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

    def __init__(self, urls: list[str] | str, token: str | None = None, timeout_s: float = 10.0,
                 *, deadline_s: float = 30.0, session: aiohttp.ClientSession | None = None,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("give at least one node URL")
        self._nodes = [_Node(u) for u in urls]
        self._bases = [_base(n) for n in self._nodes]
        self._ssl = client_tls_context(ca_file, cert_file, key_file) if any(n.https for n in self._nodes) else None
        self.token = token
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self._preferred = 0
        self._session = session
        self._own_session = session is None

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self._nodes]

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session this client opened (not one it was given)."""
        s, self._session = self._session, None
        if s is not None and self._own_session:
            await s.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(connector=connector)
            self._own_session = True
        return self._session

    # ------------------------------------------------------------------ transport
    async def _once(self, i: int, method: str, path: str, body: bytes | None, headers: dict,
                    timeout: float) -> tuple[int, dict, Any]:
        url = yarl.URL(self._bases[i] + path, encoded=True)
        session = self._http()
        attempts = _Attempts()
        # A request's own middlewares replace the session's, so a given session's are put first
        # (aiohttp has no public accessor for them); ours is innermost, next to each attempt.
        middlewares = (*getattr(session, "_middlewares", ()), attempts)
        try:
            async with session.request(
                    method, url, data=body, headers=headers, allow_redirects=False, middlewares=middlewares,
                    timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=timeout)) as resp:
                raw = await resp.read()
                status = resp.status
                rh = {k.lower(): v for k, v in resp.headers.items()}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if attempts.may_have_left:
                # Whatever the last attempt's error (aiohttp's resend meeting "connection
                # refused", say), an earlier attempt got a connection: the outcome is unknown.
                raise LostAfterSendError(f"{self._nodes[i].url}: {type(e).__name__}: {e} (aiohttp made "
                                         f"{attempts.made} attempt(s); one had a connection)") from e
            if isinstance(e, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientConnectorSSLError)):
                raise TlsFailedError(f"TLS with {self._nodes[i].url} failed: {e}") from e
            if isinstance(e, _NO_CONNECTION):
                raise NotSentError(f"{self._nodes[i].url}: {e}") from e
            raise LostAfterSendError(f"{self._nodes[i].url}: {type(e).__name__}: {e}") from e
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return status, rh, data

    async def request(self, method: str, path: str, body: Any = None, *, idempotent_key: str | None = None,
                      deadline_s: float | None = None, timeout_s: float | None = None, headers: dict | None = None,
                      recover: Callable[[RaftschedError], Any] | None = None,
                      accept: tuple[int, ...] = ()) -> Any:
        """:meth:`raftsched.client.Client.request`, awaited: the same rules, the same errors."""
        mutating, data, hdrs = prepare(method, body, idempotent_key, self.token, headers)
        call = Call(self.urls, method, path, mutating, start=self._preferred,
                    timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                    budget_s=self.deadline_s if deadline_s is None else deadline_s,
                    now_s=time.monotonic(), accept=accept)
        try:
            while True:
                step = call.next(time.monotonic())
                if isinstance(step, Wait):
                    await asyncio.sleep(step.seconds)
                    continue
                if isinstance(step, Fail):
                    raise step.error
                try:
                    status, rh, payload = await self._once(step.node, method, path, data, hdrs, step.timeout_s)
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

    # Client._get and _dlq_bulk build the request and return self.request(...): here, the coroutine.
    _get = Client._get
    _dlq_bulk = Client._dlq_bulk

    async def wait_backfill(self, backfill_id: str, *, poll_s: float = 0.5, timeout_s: float | None = None,
                            on_progress=None) -> dict:
        """:meth:`raftsched.client.Client.wait_backfill`, awaited: polls without blocking the loop."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = await self.get_backfill(backfill_id)
            if on_progress is not None:
                on_progress(view)
            if view["state"] in ("done", "cancelled"):
                return view
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"backfill {backfill_id} is still {view['state']} after {timeout_s:g} s")
            await asyncio.sleep(poll_s)

    def lock(self, name: str, owner: str, ttl_s: float = 10.0, *, blocking: bool = False,
             timeout_s: float | None = None) -> AsyncLock:
        """An :class:`AsyncLock` (``async with``): acquire, renew in a task, release on exit.
        Pass ``lease.token`` to every downstream write, and check ``lease.lost`` before each."""
        return AsyncLock(self, name, owner, ttl_s, blocking=blocking, timeout_s=timeout_s)


def _borrow(fn: Callable) -> Callable:
    """Client's endpoint method ``fn`` as a coroutine method: it builds the request and returns
    what ``self.request`` returns, here a coroutine, which is awaited."""
    @functools.wraps(fn)
    async def method(self, *args, **kwargs):
        return await fn(self, *args, **kwargs)
    return method


#: Client's endpoint methods, by name (every public function of the class but the transport).
ENDPOINT_METHODS = tuple(name for name, fn in vars(Client).items()
                         if inspect.isfunction(fn) and not name.startswith("_") and name not in _NOT_BORROWED)
for _name in ENDPOINT_METHODS:
    setattr(AsyncClient, _name, _borrow(vars(Client)[_name]))
del _name


class AsyncLock:
    """:class:`raftsched.client.Lock` for asyncio: a lock held with a lease that a task renews
    every ``ttl_s / 3``; ``async with client.lock(...) as lease``. The same honesty applies:
    holding it does not make you safe by itself, the fencing token does (client.py's docstring).

    :param blocking: wait for the lock while it is held (polling until the holder's lease ends).
    :param timeout_s: with ``blocking``, how long to wait (None: forever); then LockHeld.
    """

    def __init__(self, client: AsyncClient, name: str, owner: str, ttl_s: float = 10.0, *,
                 blocking: bool = False, timeout_s: float | None = None) -> None:
        self.client = client
        self.name = name
        self.owner = owner
        self.ttl_s = float(ttl_s)
        self.blocking = blocking
        self.timeout_s = timeout_s
        self.lease: Lease | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def acquire(self) -> Lease:
        if self.lease is not None:
            raise RuntimeError(f"lock {self.name!r} is already acquired by this AsyncLock object")
        wait_until = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            sent = time.monotonic()
            try:
                res = await self.client.lock_acquire(self.name, self.owner, self.ttl_s)
                break
            except LockHeld as e:
                if not self.blocking:
                    raise
                pause = lock_poll_pause(e, time.monotonic(), wait_until)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        self.lease = Lease(self.name, self.owner, res["token"], self.ttl_s, res.get("expires_at"),
                           valid_until=sent + self.ttl_s)
        self._stop.clear()
        self._task = asyncio.create_task(self._renew_loop(self.lease), name=f"raftsched-lock-renew:{self.name}")
        return self.lease

    async def release(self) -> None:
        """Stop renewing and release; a refused or failed release is logged, not raised (the
        lease then ends by its TTL)."""
        lease = self.lease
        if lease is None:
            return
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(task, self.ttl_s + self.client.timeout_s)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
        self.lease = None
        try:
            await self.client.lock_release(self.name, lease.token,
                                           deadline_s=max(1.0, min(self.ttl_s, self.client.deadline_s)))
        except LockLost as e:
            log.info("lock %s: release of token %d refused (the lease had expired already): %s",
                     self.name, lease.token, e.message)
        except RaftschedError as e:
            log.warning("lock %s: release of token %d failed (%s); it ends by its TTL",
                        self.name, lease.token, e.message)
        finally:
            lease.lost.set()

    async def __aenter__(self) -> Lease:
        return await self.acquire()

    async def __aexit__(self, *exc) -> None:
        await self.release()

    async def _renew_loop(self, lease: Lease) -> None:
        """Lock._renew_loop on the loop: renew every third of the TTL, retry sooner after a
        failure, and mark the lease lost when a renew is refused or none succeeded for a TTL."""
        interval = self.ttl_s / 3
        retry = max(0.05, self.ttl_s / 10)
        wait = interval
        while not await wait_event(self._stop, min(wait, max(0.0, lease.valid_until - time.monotonic()))):
            left = lease.valid_until - time.monotonic()
            if left <= 0:
                log.warning("lock %s: no renew succeeded for a whole TTL (%.3g s); the lease is lost",
                            self.name, self.ttl_s)
                lease.lost.set()
                return
            sent = time.monotonic()
            try:
                res = await self.client.lock_renew(self.name, lease.token, self.ttl_s, deadline_s=left)
            except LockLost as e:
                log.warning("lock %s: renew refused, the lease is lost: %s", self.name, e.message)
                lease.lost.set()
                return
            except RaftschedError as e:
                log.warning("lock %s: renew failed (%s); retrying", self.name, e.message)
                wait = retry
                continue
            except Exception:
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
