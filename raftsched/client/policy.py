"""The clients' policies, without I/O or sleeping: when a lock's lease is renewed, when it is lost,
how long a blocking acquire waits between tries, and when polling a backfill ends. The clock is
injected (:class:`raftsched.clock.Clock`: ``monotonic_s`` for waits and the lease's local
estimate, ``now_ms`` for the cluster's expiry times), so tests drive them with a FakeClock.

:class:`raftsched.client.Lock` (a thread) and :class:`raftsched.AsyncLock` (a task) are a
:class:`LockPolicy` that does the I/O and the sleeping, and nothing else; ``wait_backfill`` of
both clients is a loop around :class:`BackfillWait`.
"""
from __future__ import annotations

import logging
import random
import threading
from typing import Any, Callable

from ..clock import Clock, SystemClock
from ..core.errors import RaftschedError
from .core import LockHeld, LockLost

log = logging.getLogger("raftsched.client")

#: The TTL of a lock's lease unless told otherwise (seconds).
LOCK_TTL_S_DEFAULT = 10.0
#: Renewals per TTL: with three, a lease survives two failed renewals.
RENEWALS_PER_TTL = 3
#: After a failed renewal, the next try comes after this share of the TTL (at least
#: RENEW_RETRY_S_MIN), sooner than the regular interval.
RENEW_RETRY_TTL_SHARE = 0.1
RENEW_RETRY_S_MIN = 0.05
#: A blocking acquire polls a held lock: right after the holder's lease ends (plus
#: LOCK_POLL_EXPIRY_SLACK_S) when the node said when, else after LOCK_POLL_S_DEFAULT; within
#: [LOCK_POLL_S_MIN, LOCK_POLL_S_MAX] (clocks differ), with jitter.
LOCK_POLL_S_DEFAULT = 0.25
LOCK_POLL_S_MIN = 0.05
LOCK_POLL_S_MAX = 1.0
LOCK_POLL_EXPIRY_SLACK_S = 0.02
#: The shortest deadline a release is given (it is otherwise the TTL, capped by the client's).
RELEASE_DEADLINE_S_MIN = 1.0
#: How often ``wait_backfill`` reads the operation unless told otherwise (seconds).
BACKFILL_POLL_S_DEFAULT = 0.5

_SYSTEM_CLOCK = SystemClock()


class Lease:
    """What a lock holds while it is held.

    ``token`` is the fencing token: pass it to every downstream write; holding the lease does not
    make you safe by itself. ``lost`` is set when a renew was refused, or when no renew has
    succeeded for a whole TTL by this process's monotonic clock; after that, stop working: the
    lock may belong to someone else already.
    """

    def __init__(self, name: str, owner: str, token: int, ttl_s: float, expires_at: str | None,
                 valid_until: float, *, clock: Clock = _SYSTEM_CLOCK) -> None:
        self.name = name
        self.owner = owner
        self.token = token
        self.ttl_s = ttl_s
        self.expires_at = expires_at  # the cluster's view, ISO-8601 UTC
        self.lost = threading.Event()
        self.renewals = 0
        #: the monotonic time until which the lease is held at the earliest estimate: the send
        #: time of the last successful acquire/renew plus the TTL.
        self.valid_until = valid_until
        self._clock = clock

    def remaining_s(self) -> float:
        """Seconds the lease is still held by the local estimate (0 when lost)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self.valid_until - self._clock.monotonic_s())

    def valid(self) -> bool:
        """Not lost and not past its local estimate. Still NOT a guarantee: use the token."""
        return self.remaining_s() > 0

    def __repr__(self) -> str:
        return (f"Lease({self.name!r}, owner={self.owner!r}, token={self.token}, "
                f"lost={self.lost.is_set()}, remaining_s={self.remaining_s():.2f})")


def lock_poll_pause(e: LockHeld, now_s: float, wait_until: float | None, *, wall_ms: int | None = None,
                    uniform: Callable[[float, float], float] = random.uniform) -> float | None:
    """How long a blocking acquire that got ``e`` waits before it tries again (None: give up,
    ``wait_until`` has passed). Right after the holder's lease ends by its expiry, if the node
    said when (``wall_ms``: the wall clock now, epoch ms); clocks differ, so never more than
    LOCK_POLL_S_MAX between attempts."""
    if wait_until is not None and now_s >= wait_until:
        return None
    pause = LOCK_POLL_S_DEFAULT
    if e.expires_at_ms is not None:
        if wall_ms is None:
            wall_ms = _SYSTEM_CLOCK.now_ms()
        pause = (e.expires_at_ms - wall_ms) / 1000 + LOCK_POLL_EXPIRY_SLACK_S
    pause = min(max(pause, LOCK_POLL_S_MIN), LOCK_POLL_S_MAX) * uniform(0.8, 1.0)
    if wait_until is not None:
        pause = min(pause, max(0.0, wait_until - now_s))
    return pause


class LockPolicy:
    """The decisions of one lock held with a lease: acquire (and, ``blocking``, how long to wait
    between tries), renew every ``ttl_s / RENEWALS_PER_TTL`` and sooner after a failure, mark the
    lease lost when a renew is refused or none succeeded for a TTL, and release.

    A lock class drives it: around its acquire calls :meth:`acquiring`, :meth:`pause_after` and
    :meth:`acquired`; in its renewal thread or task, sleeps :meth:`renew_wait_s` (or until
    stopped), asks :meth:`renew_deadline_s` (None: lost, stop), renews, and reports
    :meth:`renewed` or :meth:`renew_failed` (False: lost, stop); releases with
    :meth:`release_deadline_s` and reports a failure to :meth:`release_failed`.

    :param blocking: wait for the lock while it is held (polling until the holder's lease ends),
        instead of raising :class:`LockHeld` at once.
    :param timeout_s: with ``blocking``, how long to wait (None: forever); then LockHeld.
    :param clock: monotonic time for the waits and the lease's estimate, wall time for the
        holder's expiry (default: the system's).
    :param uniform: ``random.uniform``, or a stand-in in tests: the jitter of the polls.
    """

    def __init__(self, name: str, owner: str, ttl_s: float = LOCK_TTL_S_DEFAULT, *, blocking: bool = False,
                 timeout_s: float | None = None, clock: Clock = _SYSTEM_CLOCK,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self.name = name
        self.owner = owner
        self.ttl_s = float(ttl_s)
        self.blocking = blocking
        self.timeout_s = timeout_s
        self.lease: Lease | None = None
        self.clock = clock
        self._uniform = uniform
        self._wait_until: float | None = None
        self._renew_wait_s = self.renew_interval_s

    @property
    def renew_interval_s(self) -> float:
        """The time between two renewals that succeed."""
        return self.ttl_s / RENEWALS_PER_TTL

    @property
    def renew_retry_s(self) -> float:
        """The time before the next try after a renewal that failed."""
        return max(RENEW_RETRY_S_MIN, self.ttl_s * RENEW_RETRY_TTL_SHARE)

    # ------------------------------------------------------------------ acquire
    def acquiring(self) -> None:
        """An acquire starts. :raises RuntimeError: this object holds the lock already."""
        if self.lease is not None:
            raise RuntimeError(f"lock {self.name!r} is already acquired by this {type(self).__name__} object")
        self._wait_until = None if self.timeout_s is None else self.clock.monotonic_s() + self.timeout_s

    def pause_after(self, e: LockHeld) -> float | None:
        """An attempt found the lock held: how long to wait before the next one, or None to
        give up (not blocking, or waited ``timeout_s``) and raise ``e``."""
        if not self.blocking:
            return None
        return lock_poll_pause(e, self.clock.monotonic_s(), self._wait_until, wall_ms=self.clock.now_ms(),
                               uniform=self._uniform)

    def acquired(self, sent_s: float, answer: dict) -> Lease:
        """The attempt sent at ``sent_s`` (monotonic) got the lock: the lease, held until
        ``sent_s + ttl_s`` at the earliest estimate."""
        self.lease = Lease(self.name, self.owner, answer["token"], self.ttl_s, answer.get("expires_at"),
                           valid_until=sent_s + self.ttl_s, clock=self.clock)
        self._renew_wait_s = self.renew_interval_s
        return self.lease

    # ------------------------------------------------------------------ renew
    def renew_wait_s(self, lease: Lease) -> float:
        """How long to wait before the next renewal: the interval (or the retry time after a
        failure), and never past the lease's local estimate."""
        return min(self._renew_wait_s, max(0.0, lease.valid_until - self.clock.monotonic_s()))

    def renew_deadline_s(self, lease: Lease) -> float | None:
        """After the wait: the deadline to give the renewal (what is left of the lease, so that
        ``lost`` is set on time), or None when no renewal succeeded for a whole TTL (the lease
        is then marked lost)."""
        left = lease.valid_until - self.clock.monotonic_s()
        if left <= 0:
            log.warning("lock %s: no renew succeeded for a whole TTL (%.3g s); the lease is lost",
                        self.name, self.ttl_s)
            lease.lost.set()
            return None
        return left

    def renewed(self, lease: Lease, sent_s: float, answer: Any) -> bool:
        """The renewal sent at ``sent_s`` was answered: whether the lease is still held (False:
        the answer names another token; the lease is marked lost)."""
        token = answer.get("token") if isinstance(answer, dict) else None
        if token != lease.token:
            log.warning("lock %s: renew answered token %s, not %d; the lease is lost", self.name, token, lease.token)
            lease.lost.set()
            return False
        lease.valid_until = max(lease.valid_until, sent_s + self.ttl_s)
        lease.expires_at = answer.get("expires_at", lease.expires_at)
        lease.renewals += 1
        self._renew_wait_s = self.renew_interval_s
        return True

    def renew_failed(self, lease: Lease, e: BaseException) -> bool:
        """The renewal raised ``e``: whether to try again (after :attr:`renew_retry_s`); False
        when the renewal was refused (LockLost) or failed unexpectedly, and the lease is marked
        lost (a bug here must not leave the holder believing it holds the lock)."""
        if isinstance(e, LockLost):
            log.warning("lock %s: renew refused, the lease is lost: %s", self.name, e.message)
        elif isinstance(e, RaftschedError):
            log.warning("lock %s: renew failed (%s); retrying", self.name, e.message)
            self._renew_wait_s = self.renew_retry_s
            return True
        else:
            log.error("lock %s: renew raised unexpectedly; the lease is treated as lost", self.name,
                      exc_info=(type(e), e, e.__traceback__))
        lease.lost.set()
        return False

    # ------------------------------------------------------------------ release
    def stop_wait_s(self, client_timeout_s: float) -> float:
        """How long a release waits for the renewal thread or task to stop."""
        return self.ttl_s + client_timeout_s

    def release_deadline_s(self, client_deadline_s: float) -> float:
        """The deadline of the release call: the TTL (after it the lease ends anyway), within
        the client's deadline, and at least RELEASE_DEADLINE_S_MIN."""
        return max(RELEASE_DEADLINE_S_MIN, min(self.ttl_s, client_deadline_s))

    def release_failed(self, lease: Lease, e: RaftschedError) -> None:
        """A release raised ``e``: logged, not raised (the lease then ends by its TTL)."""
        if isinstance(e, LockLost):
            log.info("lock %s: release of token %d refused (the lease had expired already): %s",
                     self.name, lease.token, e.message)
        else:
            log.warning("lock %s: release of token %d failed (%s); it ends by its TTL",
                        self.name, lease.token, e.message)


class BackfillWait:
    """``wait_backfill``'s policy: each view read is shown to ``on_progress``; polling ends when
    the operation is done or cancelled, or with TimeoutError after ``timeout_s``; between two
    reads, ``poll_s``."""

    #: the states after which an operation changes no more
    FINAL_STATES = ("done", "cancelled")

    def __init__(self, backfill_id: str, *, poll_s: float = BACKFILL_POLL_S_DEFAULT, timeout_s: float | None = None,
                 on_progress: Callable[[dict], Any] | None = None, clock: Clock = _SYSTEM_CLOCK) -> None:
        self.backfill_id = backfill_id
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.on_progress = on_progress
        self.clock = clock
        self.deadline_s = None if timeout_s is None else clock.monotonic_s() + timeout_s

    def done(self, view: dict) -> bool:
        """Whether polling ends with ``view`` (then it is the answer); False: read again after
        :attr:`poll_s`. :raises TimeoutError: still running after ``timeout_s``."""
        if self.on_progress is not None:
            self.on_progress(view)
        if view["state"] in self.FINAL_STATES:
            return True
        if self.deadline_s is not None and self.clock.monotonic_s() >= self.deadline_s:
            raise TimeoutError(f"backfill {self.backfill_id} is still {view['state']} after {self.timeout_s:g} s")
        return False
