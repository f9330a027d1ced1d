"""The client's core, without I/O: what one logical call is, how it is routed and retried, and
how an answer becomes a result or a typed error. Both transports drive it.

How a call is routed and retried
--------------------------------
- The nodes are tried in order, starting with the last one that answered. A node that cannot be
  reached (the connection is refused or times out before the request is sent) or that answers
  503 (no leader: the command definitely did not happen) is skipped for the next one. When every
  node was tried, the client waits (``Retry-After``, within ``ROUND_WAIT_S_MIN`` and
  ``ROUND_WAIT_S_MAX``) and goes round again until the call's deadline (``deadline_s``).
- Every mutating call gets one ``Idempotency-Key`` (a uuid4 hex, unless the caller gives one) for
  its whole life. On a 504 (the outcome is unknown) or when the connection is lost after the
  request was sent, the same request is sent again with the same key; the state machine applies
  it at most once and answers the retry with the first result. If the deadline passes after such
  an unknown outcome, the call raises :class:`~raftsched.core.errors.Indeterminate` (``definite``
  is False: the command may still have applied), never a plain ``Unavailable``.
- Every other error status is raised at once as the typed error of its ``code``
  (:meth:`RaftschedError.from_dict`), with ``.status`` (and ``.http_status``) set to the HTTP
  status and ``.body`` to the decoded answer. A request description may recover from it
  (:attr:`Request.recover`: a 409 of a lock call retyped, a 404 read as None).

What a transport must tell apart (its own rule for it is in its module): a request that never
left (:class:`NotSentError`: no connection could be made), one that may have left
(:class:`LostAfterSendError`), and a TLS handshake that failed (:class:`TlsFailedError`: nothing
was sent, and no retry would help).

A transport drives an :class:`Exchange`, in full (the blocking one; the asyncio one awaits its
attempt and ``asyncio.sleep``)::

    ex = self._exchange(request, time.monotonic())
    while True:
        step = ex.next(time.monotonic())
        if isinstance(step, Try):
            try:
                answer = attempt(step.node, ex.method, ex.target, ex.data, ex.headers, step.timeout_s)
            except TransportError as e:
                ex.failed(step.node, e)
            else:
                ex.answered(step.node, *answer, time.monotonic())  # (the clock: for on_answer)
        elif isinstance(step, Wait):
            time.sleep(step.seconds)
        else:
            return self._finish(ex)  # the payload, or the typed error raised
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import urllib.parse
import uuid
from typing import Any, Callable

from ..config import token_flaw
from ..core.errors import Conflict, Indeterminate, NotFound, RaftschedError, Unavailable

log = logging.getLogger("raftsched.client")

# Defaults and bounds ------------------------------------------------------------------------
#: The longest one HTTP attempt may take, unless the client is given another ``timeout_s``:
#: above the node's propose timeout (core/limits.py propose_timeout_s_default, 5 s), so that a
#: write that waits for a new leader is not cut short.
TIMEOUT_S_DEFAULT = 10.0
#: How long one logical call keeps retrying (other nodes, 503, 504) before it raises, unless the
#: client or the call is given another ``deadline_s``.
DEADLINE_S_DEFAULT = 30.0
#: The attempt timeout to give a client that sends whole batches (``put_jobs`` of up to
#: core/limits.py batch_jobs_max jobs takes seconds); the CLI's client uses it for every call.
BATCH_TIMEOUT_S = 30.0
#: The shortest wait between two rounds of every node, and the longest (seconds). A node's
#: ``Retry-After`` is followed within these bounds; without one, ROUND_WAIT_S_DEFAULT.
ROUND_WAIT_S_MIN = 0.05
ROUND_WAIT_S_MAX = 1.0
ROUND_WAIT_S_DEFAULT = 0.2
#: The shortest timeout one attempt is given, even when the call's deadline is closer.
ATTEMPT_TIMEOUT_S_MIN = 0.05
#: How long a ``fail_fast`` read goes round again when no node has a leader: a node answers a
#: read 503 at once (a write only after waiting its propose timeout), and an election after a
#: leader's death takes about a second, which a read should ride through; a cluster without a
#: quorum is told after this.
FAIL_FAST_READ_GRACE_S = 3.0
#: The error statuses that stay definite after an earlier attempt's outcome became unknown: the
#: node judged the request itself, under the same Idempotency-Key (a remembered answer is
#: replayed), so the earlier attempt would have got the same answer. Any other (5xx, 401, 403,
#: 408, 429) ends the call as Indeterminate.
DEFINITE_AFTER_UNKNOWN = frozenset({400, 404, 405, 409, 413, 422})
#: Added to a lost connection's message from an https node when the client shows no certificate:
#: a node that requires one (mutual TLS) closes the connection after the handshake, which looks
#: like any connection lost (a worker logged "connection lost ... may have applied" for a minute).
NO_CLIENT_CERT_HINT = ("; if the node requires a client certificate (mutual TLS), give one "
                       "(--client-cert and --client-key, or $RAFTSCHED_CLIENT_CERT)")


def lost_why(e: BaseException, timeout_s: float) -> str:
    """Why an attempt got no whole answer, for its message: a timeout's own text is empty."""
    if isinstance(e, TimeoutError):  # (asyncio.TimeoutError and socket.timeout are this one)
        return f"no whole answer within the attempt's {timeout_s:g} s"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# Errors -------------------------------------------------------------------------------------
class TransportError(Exception):
    """How one attempt failed without an answer (a transport raises one of the subclasses)."""


class NotSentError(TransportError):
    """The request never left: the node is unreachable; nothing can have happened."""


class LostAfterSendError(TransportError):
    """The request was sent but no (complete) answer came back: the outcome is unknown."""


class TlsFailedError(TransportError):
    """The TLS handshake failed (a certificate that does not verify): nothing was sent, and
    trying again or another node would only wait for the deadline."""


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


def with_status(e: RaftschedError, status: int | None) -> RaftschedError:
    """``e`` with ``.status`` (and ``.http_status``, when known) set to the HTTP status."""
    e.status = status  # type: ignore[attr-defined]
    if status is not None:
        e.http_status = status
    return e


def error_of(status: int, payload: Any) -> RaftschedError:
    """The typed error of an error answer (``RaftschedError.from_dict`` of its ``error``), with
    ``.status`` and ``.body`` (the answer as the node sent it; the CLI prints it)."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        e = RaftschedError.from_dict(payload["error"])
    else:
        e = RaftschedError(f"HTTP {status}: {str(payload)[:200]}")
    e.body = payload  # type: ignore[attr-defined]
    return with_status(e, status)


def conflict_as(klass: type[Conflict]) -> Callable[[RaftschedError], Any]:
    """A :attr:`Request.recover` that raises a 409 as ``klass`` (LockHeld, LockLost)."""
    def recover(e: RaftschedError) -> Any:
        if isinstance(e, Conflict):
            raise _retype(e, klass) from None
        raise e
    return recover


def none_if_not_found(e: RaftschedError) -> None:
    """A :attr:`Request.recover`: a 404 is None."""
    if isinstance(e, NotFound):
        return None
    raise e


def _retype(e: Conflict, klass: type[Conflict]) -> Conflict:
    if e.field == "Idempotency-Key" or (klass is LockHeld and "holder" not in e.extra):
        return e  # a reused request id, or the cluster's lock limit: not about this lock's holder
    new = klass(e.message, e.field, **e.extra)
    return with_status(new, getattr(e, "status", 409))  # type: ignore[return-value]


# Requests -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    """What one endpoint call sends and how its end is read: the description a transport sends
    (raftsched/client/endpoints.py makes one per endpoint).

    :param query: the query parameters; a None value is left out, a list repeats its key.
    :param body: the JSON body, or None for none.
    :param idempotency_key: a mutation's ``Idempotency-Key`` for all its attempts (None: a fresh
        uuid4 hex for the call). A read carries none.
    :param timeout_s: the longest one attempt may take, instead of the client's (a long-poll
        waits at the node longer than an ordinary answer takes).
    :param deadline_s: how long the call keeps retrying, instead of the client's.
    :param recover: called with the error the call ends with; what it returns is returned
        instead (or it raises another error).
    :param accept: error statuses whose answer is returned like a 2xx one.
    :param on_answer: called, once the call ends with an answer, with how long the attempt that
        answered took (seconds, from the transport being told to try, its connection included,
        to the answer read): the call's earlier attempts (a 503, a lost connection, the waits
        between) left out. What it raises is logged, not raised: the call has its answer.
    """

    method: str
    path: str
    query: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] | None = None
    idempotency_key: str | None = None
    timeout_s: float | None = None
    deadline_s: float | None = None
    recover: Callable[[RaftschedError], Any] | None = None
    accept: tuple[int, ...] = ()
    on_answer: Callable[[float], None] | None = None

    @property
    def mutating(self) -> bool:
        """Whether it changes something (anything but GET/HEAD): it carries an Idempotency-Key,
        and an unknown outcome makes its final error Indeterminate."""
        return self.method not in ("GET", "HEAD")

    @property
    def target(self) -> str:
        """The path with its query string, as sent."""
        q = {k: v for k, v in (self.query or {}).items() if v is not None}
        return self.path + ("?" + urllib.parse.urlencode(q, doseq=True) if q else "")


def quote(segment: Any) -> str:
    """A path segment, percent-encoded whole (a ``/`` in a name included)."""
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
        flaw = token_flaw(token)
        if flaw is not None:  # (http.client's own error would quote the header, token and all)
            raise ValueError(f"the client's token cannot be sent: {flaw}")
        hdrs["Authorization"] = f"Bearer {token}"
    if headers:
        hdrs.update(headers)
    return mutating, data, hdrs


def decode(raw: bytes) -> Any:
    """An answer's body: its JSON value, its text when it is not JSON, None when empty."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


class Node:
    """One node's base URL, parsed: ``http(s)://host[:port][/prefix]``."""

    __slots__ = ("url", "host", "port", "https", "prefix", "base")

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        #: scheme, host, port and prefix: the target is appended to it
        self.base = f"{'https' if self.https else 'http'}://{host}:{self.port}{self.prefix}"


# Routing and retries ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Try:
    """Send the request to node ``node`` (an index into the call's URLs) with this timeout."""

    node: int
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class Wait:
    """Every node was tried: sleep this long, then ask :meth:`Call.next` again."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class Done:
    """The call succeeded: ``payload`` is the decoded body of node ``node``'s answer."""

    node: int
    payload: Any


@dataclasses.dataclass(frozen=True)
class Fail:
    """The call failed: raise ``error``. ``node`` is the node whose answer it is (the one to
    prefer next time), or None when the call gave up (the deadline passed)."""

    error: RaftschedError
    node: int | None = None


class Call:
    """The routing and retry state of one logical request.

    :param urls: every node's base URL, by index (for messages).
    :param mutating: the request changes something (anything but GET/HEAD): an unknown outcome
        then makes the final error :class:`Indeterminate`.
    :param start: the node tried first (the one that answered last).
    :param timeout_s: the longest one attempt may take.
    :param budget_s: how long the whole call keeps retrying.
    :param now_s: the monotonic time the call starts at.
    :param accept: error statuses returned as a success (``GET /healthz`` answers 503 with a
        body that says why).
    :param uniform: ``random.uniform``, or a stand-in in tests: the jitter of the waits.
    :param fail_fast: one round only: once every node was tried and none answered for good
        (unreachable, 503, lost), fail at once with what each node said (the command line:
        a node answers a write 503 only after waiting its propose timeout for a leader, so a
        second round would only repeat it). A read's 503 for want of a leader comes at once: a
        read goes round again for FAIL_FAST_READ_GRACE_S, through an election. A round in which a node answered a mutation 504 is the
        exception: that node has a leader and the outcome is unknown, so the request is sent
        again (same Idempotency-Key) round after round until the deadline, as without
        ``fail_fast``.
    """

    def __init__(self, urls: list[str], method: str, path: str, mutating: bool, *, start: int,
                 timeout_s: float, budget_s: float, now_s: float, accept: tuple[int, ...] = (),
                 uniform: Callable[[float, float], float] = random.uniform, fail_fast: bool = False) -> None:
        if not urls:
            raise ValueError("give at least one node URL")
        self.urls = list(urls)
        self.method, self.path, self.mutating = method, path, mutating
        self.start = start % len(self.urls)
        self.timeout_s = timeout_s
        self.budget_s = budget_s
        self.deadline_s = now_s + budget_s
        self.accept = accept
        self._uniform = uniform
        #: a 504 or a lost connection happened: never report "definitely not"
        self.maybe_applied = False
        self.last: RaftschedError | None = None
        self.attempts = 0
        self._k = 0             # the next node of this round, counted from start
        self._retry_after = 0.0  # the longest Retry-After of this round
        self._waited = False    # the last step was a Wait
        self.fail_fast = fail_fast
        #: what each node of this round said, when it gave no final answer: (url, 503 or None, message)
        self.round: list[tuple[str, int | None, str]] = []
        #: a node answered this round's request 504, for a mutation (fail_fast goes round again)
        self._round_504 = False
        #: the body of the last 504 (a batch's says which jobs committed): the final error keeps it
        self.unknown_body: Any = None
        #: a fail_fast read goes round again until then (FAIL_FAST_READ_GRACE_S)
        self._read_grace_until = now_s + (0.0 if mutating else FAIL_FAST_READ_GRACE_S)

    # ------------------------------------------------------------------ what to do next
    def next(self, now_s: float) -> Try | Wait | Fail:
        """The next step: try a node, wait for the next round, or give up."""
        n = len(self.urls)
        if self._waited:
            self._waited = False
            if self.deadline_s - now_s <= 0:
                return Fail(self.gave_up())
            self._k, self._retry_after = 0, 0.0
            self.round, self._round_504 = [], False
        remaining = self.deadline_s - now_s
        if self._k < n and not (remaining <= 0 and self.attempts):
            i = (self.start + self._k) % n
            self._k += 1
            self.attempts += 1
            return Try(i, max(ATTEMPT_TIMEOUT_S_MIN, min(self.timeout_s, remaining)))
        # Every node was tried this round (or the deadline passed).
        if remaining <= 0:
            return Fail(self.gave_up())
        if self.fail_fast and not self._round_504 and not (
                now_s < self._read_grace_until and any(st == 503 and "leader" in msg for _, st, msg in self.round)):
            return Fail(self.round_error())
        self._k = n
        self._waited = True
        pause = max(ROUND_WAIT_S_MIN, min(self._retry_after or ROUND_WAIT_S_DEFAULT, ROUND_WAIT_S_MAX))
        return Wait(min(pause * self._uniform(0.7, 1.0), remaining))

    # ------------------------------------------------------------------ what happened
    def not_sent(self, node: int, why: str) -> None:
        """The request could not be sent to ``node``: try the next one."""
        self.last = with_status(Unavailable(f"node unreachable: {why}", node=self.urls[node]), None)
        self.round.append((self.urls[node], None, f"unreachable ({_without(why, self.urls[node])})"))
        log.debug("client: %s", self.last.message)

    def lost(self, node: int, why: str) -> None:
        """The request was sent to ``node`` but no whole answer came back: for a request that
        changes something the outcome is unknown (try again, with the same Idempotency-Key); a
        read changed nothing, so it is only unanswered (Unavailable, never Indeterminate)."""
        if not self.mutating:
            # A read changes nothing: there is no outcome to be unsure of, only no answer yet.
            self.last = with_status(Unavailable(
                f"connection lost after sending {self.method} {self.path}: {why}", node=self.urls[node]), None)
            self.round.append((self.urls[node], None, f"connection lost ({_without(why, self.urls[node])})"))
            log.debug("client: %s (a read: retrying)", self.last.message)
            return
        self.maybe_applied = True
        self.round.append((self.urls[node], None,
                           f"connection lost after the request was sent ({_without(why, self.urls[node])})"))
        self.last = with_status(Indeterminate(
            f"connection lost after sending {self.method} {self.path}: {why}; the request may have applied",
            node=self.urls[node]), None)
        log.info("client: %s (retrying with the same Idempotency-Key)", self.last.message)

    def answered(self, node: int, status: int, headers: dict, payload: Any) -> Done | Fail | None:
        """Node ``node`` answered ``status`` (``headers`` with lower-case names). Returns how the
        call ends, or None to go on (a 503 or a 504)."""
        if 200 <= status < 300 or status in self.accept:
            return Done(node, payload)
        err = error_of(status, payload)
        if status == 503:
            self.last = err
            try:
                retry_after = float(headers.get("retry-after", ROUND_WAIT_S_DEFAULT))
            except ValueError:
                retry_after = ROUND_WAIT_S_DEFAULT
            self._retry_after = max(self._retry_after, retry_after)
            self.round.append((self.urls[node], 503, err.message))
            log.debug("client: %s answered 503: %s", self.urls[node], err.message)
            return None
        if status == 504:
            self.maybe_applied = self.maybe_applied or self.mutating
            self._round_504 = self._round_504 or self.mutating
            self.unknown_body = payload
            self.last = err
            self.round.append((self.urls[node], 504, err.message))
            log.info("client: %s answered 504 (%s); retrying with the same Idempotency-Key",
                     self.urls[node], err.message)
            return None
        if self.maybe_applied and status not in DEFINITE_AFTER_UNKNOWN:
            # An earlier attempt may have applied, and this answer does not say it did not: a
            # 5xx of a proxy, a 429 refused before the request was looked at, a 401/403 of a
            # token revoked since. Only an answer the node gave the same request under the same
            # Idempotency-Key for what the request is (a malformed body, a missing job, a
            # conflict it judged with the key) is definite.
            return Fail(self.unknown_after(err), node)
        return Fail(err, node)

    def unknown_after(self, err: RaftschedError) -> RaftschedError:
        """``err``, which ends a call that an earlier attempt may have applied, as the
        :class:`Indeterminate` it is (``err`` its cause; its status and body kept)."""
        if isinstance(err, Indeterminate):
            return err
        e = with_status(Indeterminate(
            f"the outcome is unknown: an earlier attempt may have applied, and the last node answered "
            f"{err.message}. Look before sending it again (raftsched get, raftsched runs)",
            **({"node": err.extra["node"]} if "node" in err.extra else {})), None)
        e.__cause__ = err
        if hasattr(err, "body"):
            e.body = err.body  # type: ignore[attr-defined]
        return e

    def gave_up(self) -> RaftschedError:
        """The error to raise when the deadline has passed: a ``fail_fast`` call's says what
        its last round's nodes said (:meth:`round_error`)."""
        return self.round_error() if self.fail_fast and self.round else self.final_error()

    def _with_unknown_body(self, e: RaftschedError) -> RaftschedError:
        """``e`` (an Indeterminate the call made up) with the last 504's body, when one came."""
        if self.unknown_body is not None and not hasattr(e, "body"):
            e.body = self.unknown_body  # type: ignore[attr-defined]
        return e

    def round_error(self) -> RaftschedError:
        """The error of a ``fail_fast`` call after its last round: what happened, once, and what
        to do next."""
        said = "; ".join(f"{url}: {'HTTP %d, ' % st if st else ''}{msg}" for url, st, msg in self.round)
        if self.maybe_applied:
            return self._with_unknown_body(with_status(Indeterminate(
                f"the outcome is unknown: the request may have applied ({said}). Look before sending it "
                "again (raftsched get, raftsched runs)"), None))
        if any(st == 503 and "leader" in msg for _, st, msg in self.round):
            changed = "Nothing was changed. " if self.mutating else ""
            if all(st == 503 for _, st, _ in self.round):
                # Every node answered, and none had a leader: no node is stopped, so no quorum
                # is lost to a stopped one; they cannot elect (cut off from each other), or an
                # election outlasted the call.
                return with_status(Unavailable(
                    f"no leader: every node answered, and none has a leader ({said}). {changed}The "
                    "nodes may not reach each other (their Raft ports); try again"), None)
            return with_status(Unavailable(
                f"no quorum: no node has a leader ({said}). {changed}Start the stopped "
                "nodes (scripts/cluster.sh status lists them) and try again"), None)
        if any(st == 503 for _, st, _ in self.round):
            return with_status(Unavailable(f"unavailable ({said}). Nothing was changed; try again later"), None)
        return with_status(Unavailable(
            f"node unreachable: {said}. Is the cluster running (scripts/cluster.sh status)? --url, "
            "RAFTSCHED_URL or a context names its nodes"), None)

    def final_error(self) -> RaftschedError:
        """The error to raise once the deadline has passed."""
        last = self.last
        assert last is not None
        if self.maybe_applied and not isinstance(last, Indeterminate):
            return self._with_unknown_body(with_status(Indeterminate(
                f"gave up after {self.budget_s:g} s; an earlier attempt's outcome is unknown, so the request "
                f"may have applied (last error: {last.message})"), None))
        if isinstance(last, Unavailable) and getattr(last, "status", None) is None:
            return with_status(Unavailable(
                f"no node reachable within {self.budget_s:g} s ({', '.join(self.urls)}); last: {last.message}"), None)
        return last


def _without(why: str, url: str) -> str:
    """A transport's message without the node's URL in front (the caller names the node)."""
    return why[len(url) + 2:] if why.startswith(url + ": ") else why


class Exchange:
    """One :class:`Request` from its first attempt to its result: its encoding (one
    Idempotency-Key for every attempt), the :class:`Call` that routes and retries it, and how it
    ends (:meth:`result`: the payload, what ``recover`` makes of the error, or the error).

    A transport calls :meth:`next` and does what it says: send to a node (:class:`Try`), then
    report :meth:`answered` or :meth:`failed`; sleep (:class:`Wait`); or, on None, take
    :meth:`result`.
    """

    def __init__(self, request: Request, urls: list[str], *, token: str | None, start: int,
                 timeout_s: float, deadline_s: float, now_s: float,
                 uniform: Callable[[float, float], float] = random.uniform, fail_fast: bool = False) -> None:
        self.request = request
        self.method = request.method
        self.target = request.target
        _, self.data, self.headers = prepare(request.method, request.body, request.idempotency_key, token,
                                             request.headers)
        self.call = Call(urls, request.method, self.target, request.mutating, start=start,
                         timeout_s=timeout_s if request.timeout_s is None else request.timeout_s,
                         budget_s=deadline_s if request.deadline_s is None else request.deadline_s,
                         now_s=now_s, accept=request.accept, uniform=uniform, fail_fast=fail_fast)
        self.end: Done | Fail | None = None
        self._tried_s = now_s  # when the last Try was handed out

    @property
    def answered_by(self) -> int | None:
        """The node whose answer ended the call (the one to try first next time), if one did."""
        return None if self.end is None else self.end.node

    def next(self, now_s: float) -> Try | Wait | None:
        """The next step; None once the call has ended (then :meth:`result`)."""
        if self.end is not None:
            return None
        step = self.call.next(now_s)
        if isinstance(step, Fail):
            self.end = step
            return None
        if isinstance(step, Try):
            self._tried_s = now_s
        return step

    def answered(self, node: int, status: int, headers: dict, payload: Any, now_s: float | None = None) -> None:
        """Node ``node`` answered (``headers`` with lower-case names, ``payload`` decoded) at
        ``now_s`` (the clock :meth:`next` was given; None: the request's ``on_answer`` is not
        called)."""
        self.end = self.call.answered(node, status, headers, payload)
        if self.end is not None and now_s is not None and self.request.on_answer is not None:
            try:
                self.request.on_answer(max(0.0, now_s - self._tried_s))
            except Exception as e:  # noqa: BLE001 - the call has its answer (a lease's grants) all the same
                log.error("client: on_answer of %s %s raised %r", self.method, self.target, e)

    def failed(self, node: int, e: TransportError) -> None:
        """The attempt at node ``node`` ended without an answer."""
        if isinstance(e, TlsFailedError):
            # (tls_failed: a setting of the client's, never a state of the cluster: a worker says it at once)
            err = with_status(Unavailable(str(e), node=self.call.urls[node], tls_failed=True), None)
            self.end = Fail(self.call.unknown_after(err) if self.call.maybe_applied else err)
        elif isinstance(e, NotSentError):
            self.call.not_sent(node, str(e))
        else:
            self.call.lost(node, str(e))

    def result(self) -> Any:
        """The call's result once it has ended. :raises RaftschedError: its error (or what
        ``recover`` raises)."""
        end = self.end
        assert end is not None, "the call has not ended"
        if isinstance(end, Done):
            return end.payload
        if self.request.recover is None:
            raise end.error
        return self.request.recover(end.error)


class Transport:
    """What both clients share above their I/O: the nodes, the token, the timeouts, the node to
    try first, and the start and end of each exchange.

    :param urls: one base URL (``http://127.0.0.1:8701``) or a list of them, one per node.
    """

    def __init__(self, urls: list[str] | str, token: str | None, timeout_s: float, deadline_s: float,
                 fail_fast: bool = False) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("give at least one node URL")
        self._nodes = [Node(u) for u in urls]
        self.token = token
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        #: one round of the nodes per call, then the error (core.Call's ``fail_fast``)
        self.fail_fast = fail_fast
        self._preferred = 0  # index of the node that answered last

    @property
    def urls(self) -> list[str]:
        """Every node's base URL, as given."""
        return [n.url for n in self._nodes]

    def _uses_https(self) -> bool:
        return any(n.https for n in self._nodes)

    def _exchange(self, request: Request, now_s: float) -> Exchange:
        return Exchange(request, self.urls, token=self.token, start=self._preferred,
                        timeout_s=self.timeout_s, deadline_s=self.deadline_s, now_s=now_s,
                        fail_fast=self.fail_fast)

    def _finish(self, ex: Exchange) -> Any:
        if ex.answered_by is not None:
            self._preferred = ex.answered_by
        return ex.result()

    @staticmethod
    def _request(method: str, path: str, body: Any, idempotent_key: str | None, deadline_s: float | None,
                 timeout_s: float | None, headers: dict | None, recover: Callable[[RaftschedError], Any] | None,
                 accept: tuple[int, ...]) -> Request:
        """The :class:`Request` of the clients' generic ``request`` method."""
        return Request(method, path, body=body, headers=headers, idempotency_key=idempotent_key,
                       timeout_s=timeout_s, deadline_s=deadline_s, recover=recover, accept=accept)
