"""How one logical call to the API is routed and retried, as data and without I/O.

The synchronous :class:`raftsched.client.Client` and the :class:`raftsched.AsyncClient` both
drive a :class:`Call`: they ask it what to do next (:meth:`Call.next`: try node i, wait, or give
up with an error), do it with their own transport and clock, and tell it what happened
(:meth:`Call.answered`, :meth:`Call.not_sent`, :meth:`Call.lost`). So the two clients follow one
set of rules, stated in client.py's docstring: nodes in turn from the last one that answered, 503
and unreachable nodes skipped, a 504 or a connection lost after sending retried with the same
``Idempotency-Key``, and an unknown outcome never reported as a definite failure.

A driver, in full (the sync client's; the async one awaits its transport and ``asyncio.sleep``)::

    call = Call(urls, method, path, mutating, start=preferred, timeout_s=..., budget_s=...,
                now_s=time.monotonic())
    while True:
        step = call.next(time.monotonic())
        if isinstance(step, Wait):
            time.sleep(step.seconds)
        elif isinstance(step, Fail):
            raise step.error
        else:
            try:
                status, headers, payload = send(step.node, step.timeout_s)
            except NotSentError as e:
                call.not_sent(step.node, str(e))
                continue
            except LostAfterSendError as e:
                call.lost(step.node, str(e))
                continue
            end = call.answered(step.node, status, headers, payload)
            if end is not None:
                ...  # Done: return end.payload; Fail: raise end.error (end.node answered)
"""
from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any, Callable

from .core.errors import Indeterminate, RaftschedError, Unavailable

log = logging.getLogger("raftsched.client")

#: The shortest wait between two rounds of every node, and the longest (seconds). A node's
#: ``Retry-After`` is followed within these bounds; without one, 0.2 s.
ROUND_WAIT_S_MIN = 0.05
ROUND_WAIT_S_MAX = 1.0
#: The shortest timeout one attempt is given, even when the call's deadline is closer.
ATTEMPT_TIMEOUT_S_MIN = 0.05


class NotSentError(Exception):
    """The request never left: the node is unreachable; nothing can have happened."""


class LostAfterSendError(Exception):
    """The request was sent but no (complete) answer came back: the outcome is unknown."""


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


def with_status(e: RaftschedError, status: int | None) -> RaftschedError:
    """``e`` with ``.status`` (and ``.http_status``, when known) set to the HTTP status."""
    e.status = status
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
    e.body = payload
    return with_status(e, status)


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
    """

    def __init__(self, urls: list[str], method: str, path: str, mutating: bool, *, start: int,
                 timeout_s: float, budget_s: float, now_s: float, accept: tuple[int, ...] = (),
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
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

    # ------------------------------------------------------------------ what to do next
    def next(self, now_s: float) -> Try | Wait | Fail:
        """The next step: try a node, wait for the next round, or give up."""
        n = len(self.urls)
        if self._waited:
            self._waited = False
            if self.deadline_s - now_s <= 0:
                return Fail(self.final_error())
            self._k, self._retry_after = 0, 0.0
        remaining = self.deadline_s - now_s
        if self._k < n and not (remaining <= 0 and self.attempts):
            i = (self.start + self._k) % n
            self._k += 1
            self.attempts += 1
            return Try(i, max(ATTEMPT_TIMEOUT_S_MIN, min(self.timeout_s, remaining)))
        # Every node was tried this round (or the deadline passed).
        if remaining <= 0:
            return Fail(self.final_error())
        self._k = n
        self._waited = True
        pause = max(ROUND_WAIT_S_MIN, min(self._retry_after or 0.2, ROUND_WAIT_S_MAX))
        return Wait(min(pause * self._uniform(0.7, 1.0), remaining))

    # ------------------------------------------------------------------ what happened
    def not_sent(self, node: int, why: str) -> None:
        """The request could not be sent to ``node``: try the next one."""
        self.last = with_status(Unavailable(f"node unreachable: {why}", node=self.urls[node]), None)
        log.debug("client: %s", self.last.message)

    def lost(self, node: int, why: str) -> None:
        """The request was sent to ``node`` but no whole answer came back: the outcome is
        unknown; try again (with the same Idempotency-Key)."""
        self.maybe_applied = self.maybe_applied or self.mutating
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
                self._retry_after = max(self._retry_after, float(headers.get("retry-after", "0.2")))
            except ValueError:
                self._retry_after = max(self._retry_after, 0.2)
            log.debug("client: %s answered 503: %s", self.urls[node], err.message)
            return None
        if status == 504:
            self.maybe_applied = self.maybe_applied or self.mutating
            self.last = err
            log.info("client: %s answered 504 (%s); retrying with the same Idempotency-Key",
                     self.urls[node], err.message)
            return None
        return Fail(err, node)

    def final_error(self) -> RaftschedError:
        """The error to raise once the deadline has passed."""
        last = self.last
        assert last is not None
        if self.maybe_applied and not isinstance(last, Indeterminate):
            return with_status(Indeterminate(
                f"gave up after {self.budget_s:g} s; an earlier attempt's outcome is unknown, so the request "
                f"may have applied (last error: {last.message})"), None)
        if isinstance(last, Unavailable) and last.status is None:
            return with_status(Unavailable(
                f"no node reachable within {self.budget_s:g} s ({', '.join(self.urls)}); last: {last.message}"), None)
        return last
