"""The lease loop: leases runs, executes them, heartbeats, reports (DESIGN.md sections 3 and 6).

One implementation for both kinds of worker (docs/workers.md): the loop (:class:`LeaseLoop`)
talks to the cluster through a small :class:`Channel`, of which there are two. The embedded
worker of a node (:class:`Worker`, :class:`EmbeddedChannel`) proposes its commands through the
node's own Raft adapter and looks at the local replica for ready work; a ``raftsched worker``
process outside the quorum (worker/remote.py, ``RemoteChannel``) speaks the worker protocol over
HTTP to any node (docs/api.md, "The worker protocol").

Following the design card, followers execute and the leader executes only when it is the only
member or was told to (``execute_on_leader``), so the leader's event loop stays free for the
trigger loop and the log.

- It asks for work only when its channel says runs may be ready (the embedded channel: the
  local replica shows runs ready in the queues it serves; the remote one: always, since its
  lease request waits at the node until there is work). At most ``slots`` runs execute at once.
  It asks for no more runs than it has free slots, plus, while its runs end faster than an
  acquire's round trip through the log, as many again (prefetch): those wait for a slot, in the
  order granted, with their leases renewed. Runs slower than that round trip turn prefetching
  off, and so do runs still executing past it, slot by slot; a run prefetched just before the
  runs turned slow is given back unbegun (``release`` with ``not_started``) once it has waited
  prefetch_wait_s_min (worker/limits.py) or more with every slot still taken: queued again, for
  a worker with a free slot.
- Outcomes are reported in batches (``complete_many``), and the acquire for the slots they
  free goes out in the same turn of the event loop, so both travel in one log entry (and, for
  a remote worker, in one request: worker/remote.py).
- A run is awaited through ``execute``: shell and python runs in the worker's sandbox
  (worker/sandbox.py: the run user, a clean environment, a directory of its own; never in this
  process), http runs here. Or through the executor ``executor_lookup`` gives for it
  (``raftsched worker --app``: the app's handlers, the worker's own code, in this process).
  Without a sandbox (such a worker, and the tests of this loop), a plain python function whose
  module is imported already runs in a pooled thread without a task of its own
  (``executors.execute_soon``). An Outcome that lingers (a thread that could not be stopped at
  its timeout) is reported at once, and its slot stays taken until the thread ends: at most
  ``slots`` threads run at once.
- One ``heartbeat`` per interval (a third of the lease TTL, at most 1 s) extends all its leases
  (in as many commands as run_refs_per_command makes). A lease the state reports lost is killed
  at once. If no heartbeat has succeeded for a whole TTL, by this process's monotonic clock,
  every run is killed: the leader may already have expired the leases and handed the runs to
  another worker.
- The lease loop, the heartbeat loop and that watchdog run in one task group (``run``): if one
  of them fails, the others stop with it, every run held is given back (``release``) and
  ``WorkerFailed`` is raised, logged. A node stops on it; ``raftsched worker`` exits 1.
- ``complete`` carries the run's fencing token; a refusal (stale token) means another attempt
  owns the run now, and the outcome is dropped. A completion whose outcome is unknown (504) is
  retried with the same request id, which the state machine deduplicates.
- Draining (``drain``: SIGTERM of a ``raftsched worker``, or the cluster's answer ``draining``
  after ``POST /v1/workers/{id}/drain``): no more leases; runs granted but not started are given
  back at once (``release``), running ones get up to the drain time to finish and be reported,
  and those still running then are killed and given back: queued again without spending an
  attempt.

The embedded worker's id includes the process id, so a restarted node never mistakes its
predecessor's leases for its own: those expire and their runs are executed again, with attempt
+ 1. A remote worker keeps its ``--id`` across restarts, and its tokens keep the leases of one
process apart from the next's.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import os
import uuid
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
import msgpack

from ..clock import Clock
from ..core import commands, limits, queries
from ..core.errors import Indeterminate, RaftschedError, Unavailable
from ..core.records import outcome_results
from ..proposer import Proposer
from ..aio import wait_event
from .. import sealing
from . import limits as worker_limits
from . import masking
from .results import check_result
from .executors import ALL_TYPES, CancelEvent, Outcome, RunContext, execute, execute_soon
from .sandbox import RunServerError, Sandbox

log = logging.getLogger("raftsched.worker")

#: the version a worker reports of itself in its hello
VERSION = "0.1.0"

#: The seam for applications that bring their own handlers (``raftsched worker --app``): given a
#: grant, an awaitable executor ``(ctx, timeout_s, cancel) -> Outcome`` for it, or None for the
#: built-in executors (shell, http, python). Called on the event loop when the run starts.
ExecutorLookup = Callable[[dict], "Callable[[RunContext, float, CancelEvent], Awaitable[Outcome]] | None"]


class WorkerFailed(Exception):
    """One of a worker's tasks (its lease loop, heartbeat loop or lease watchdog) failed, or
    ended: the worker stopped and gave back the runs it held. ``task`` names it; the cause is
    chained."""

    def __init__(self, task: str, reason: str) -> None:
        super().__init__(f"the worker's {task} failed: {reason}")
        self.task = task


class Grants:
    """What an acquire answered: the grants, whether the worker is draining, how long to wait
    before asking again when nothing was granted (None: the loop's own backoff), and how long
    the answer may have been on its way (``transit_ms``: the round trip of the attempt that was
    answered less the time the node held the request; None when not known, as on a node's own
    channel)."""

    __slots__ = ("runs", "draining", "retry_after_s", "transit_ms")

    def __init__(self, runs: list[dict], draining: bool = False, retry_after_s: float | None = None,
                 transit_ms: float | None = None) -> None:
        self.runs = runs
        self.draining = draining
        self.retry_after_s = retry_after_s
        self.transit_ms = transit_ms


class Channel(Protocol):
    """How a lease loop talks to the cluster. Every method but ``may_acquire`` and
    ``executes`` may raise a RaftschedError (Unavailable, Indeterminate, a refusal)."""

    #: the worker's id, as every command and request names it
    worker_id: str
    #: run id -> why the cluster ended it, for leases the last heartbeats found lost because their
    #: run was ended while they held it (a cancel, an overlap replace); the loop pops what it reads
    lost_why: dict[str, str]
    #: "embedded" or "remote"
    kind: str

    async def hello(self) -> None:
        """Register (or update) the worker's facts in the cluster; idempotent."""

    def registered(self) -> bool:
        """Whether the cluster is known to hold the worker's facts as they are (the loop says
        hello again when not)."""

    def may_acquire(self) -> bool:
        """Whether an acquire may grant something now (a cheap local hint; the remote channel's
        lease request waits at the node instead, so it always says yes)."""

    def executes(self) -> bool:
        """Whether this worker takes runs at all now (an embedded worker does not while its
        node leads a cluster of several)."""

    async def acquire(self, n: int, ttl_ms: int, types: list[str] | None) -> Grants:
        """Up to ``n`` runs, each with a lease of ``ttl_ms``, of the executor ``types`` (None:
        every type)."""

    async def heartbeat(self, leases: list[list], ttl_ms: int, timeout_s: float) -> tuple[list[str], bool]:
        """Extend ``leases`` (``[run, token]``, at most heartbeat_leases_max): the runs whose
        lease is lost, and whether the worker is draining."""

    def heartbeat_interval_s(self, own_s: float, longest_s: float) -> float:
        """How long to wait before the next heartbeat: ``own_s``, or longer when the cluster
        asked for it (a remote worker's node, ``next_heartbeat_s``), never over ``longest_s``."""

    async def complete(self, items: list[dict]) -> list[dict] | None:
        """Report outcomes (``complete_many`` items); one result per item, or None when they
        could not be delivered (the leases then expire)."""

    async def release(self, leases: list[list], reason: str, not_started: bool = False) -> None:
        """Give leases back: the runs are queued again without spending an attempt.
        ``not_started``: this worker never began them (core/workers.py apply_release)."""

    async def close(self) -> None:
        """Free what the channel holds (connections)."""


#: run_result's encoder: iterencode without the one-shot C path yields as it goes.
_RESULT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def run_result(value: Any) -> Any:
    """``value`` as a run's result (pipelines: handed to its children): JSON data of at most
    result_bytes_max bytes that a command can carry (no integer past 64 bits), else None."""
    # Encoded piece by piece, and given up once past the bound: a handler that returns a million
    # rows costs the worker's loop a few KiB of encoding, not seconds of it.
    parts: list[str] = []
    size = 0
    try:
        for part in _RESULT_ENCODER.iterencode(value):
            size += len(part.encode())
            if size > limits.result_bytes_max:
                return None
            parts.append(part)
    except (TypeError, ValueError, RecursionError):  # not JSON, or nested too deep to encode
        return None
    out, _ = check_result(json.loads("".join(parts)))  # (too deep, or what a command cannot carry: None)
    return out


def _log_failure(t: asyncio.Future) -> None:
    """A done callback: log the exception of a task nobody may await any more (its awaiter
    cancelled), rather than "exception was never retrieved"."""
    if not t.cancelled() and t.exception() is not None:
        log.error("worker: placing granted runs failed", exc_info=t.exception())


class _Held:
    __slots__ = ("grant", "cancel", "task", "token", "executing", "giving_back", "kill_unreported", "ctx", "reporting",
                 "renewed", "since", "ended")

    def __init__(self, grant: dict, renewed: float = 0.0) -> None:
        self.grant = grant
        #: when its lease was last known renewed (asked for: its grant, or a heartbeat that
        #: kept it), by the loop's monotonic clock: the watchdog judges each lease by it
        self.renewed = renewed
        #: the run's context once started (its ``result`` is reported with a success)
        self.ctx: RunContext | None = None
        self.token = grant["token"]
        self.cancel = CancelEvent()
        #: the run's task, or a future done when an executor that started by callbacks is done
        self.task: asyncio.Future | None = None
        #: True while the executor runs (False before it starts and once only its report is pending)
        self.executing = False
        #: killed by a drain: its lease is given back (release), its outcome is not reported
        self.giving_back = False
        #: killed by the worker's stop or its lease watchdog: a failure then is the kill's, not
        #: the run's, and is not reported (_executed)
        self.kill_unreported = False
        #: ended by the cluster (a cancel, a replace: the heartbeat's ``ended``): killed, and its
        #: outcome reported all the same, for the state to keep its output (the run keeps the
        #: outcome the cluster gave it)
        self.ended = False
        #: the run is over and its outcome on its way (the outbox, or a report in flight)
        self.reporting = False
        #: by the loop's monotonic clock: since when it waits for a slot (prefetched), then since
        #: when it executes (``_unstick`` reads both)
        self.since = 0.0


class LeaseLoop:
    """The lease loop of one worker, over one :class:`Channel`.

    :param sandbox: where shell and python runs execute (worker/sandbox.py): started with the
        loop, closed when it ends. None runs them in this process, in its environment and its
        working directory: for an ``--app`` worker, whose handlers are its own code, and for tests
        of the loop's logic; a worker that runs jobs' code gives one.
    :param executor_lookup: the seam for ``--app`` (``ExecutorLookup``); None: the built-in
        executors only.
    """

    def __init__(self, channel: Channel, clock: Clock, *, sandbox: Sandbox | None,
                 slots: int = worker_limits.slots_default, allowed_types=ALL_TYPES,
                 lease_ttl_ms: int = worker_limits.lease_ttl_ms_default,
                 poll_interval_s: float = worker_limits.worker_poll_s_default,
                 kill_grace_s: float = worker_limits.kill_grace_s_default,
                 executor_lookup: ExecutorLookup | None = None) -> None:
        self.channel = channel
        self.sandbox = sandbox
        self.clock = clock
        self.worker_id = channel.worker_id
        self.slots = slots
        self.allowed_types = frozenset(allowed_types)
        self.lease_ttl_ms = lease_ttl_ms
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self.executor_lookup = executor_lookup
        self.held: dict[str, _Held] = {}
        #: the tasks of earlier attempts of runs granted again, killed, until they end
        self._superseded: set[asyncio.Task] = set()
        #: give-backs of held runs on their way: past their start_by (late_start: skip), or held for a
        #: slot that did not free (``_unstick``)
        self._backs: set[asyncio.Future] = set()
        self._session: aiohttp.ClientSession | None = None
        #: outcomes not yet sent, oldest first, and since when the oldest waits
        self._outbox: collections.deque[tuple[dict, _Held]] = collections.deque()
        self._outbox_since = 0.0
        #: complete_many commands in flight
        self._reporting: set[asyncio.Task] = set()
        #: set when a slot frees (its outcome queued) or an acquire or report ends: _pump looks again
        self._wake = asyncio.Event()
        #: runs executing now (held with ``executing``), runs granted and waiting for a slot
        #: (prefetched), and runs asked for by acquires in flight
        self._executing = 0
        #: slots taken by threads that outlived their runs (an Outcome's ``linger``: a handler
        #: that could not be stopped), until they end
        self.lingering = 0
        self._waiting: collections.deque[_Held] = collections.deque()
        self._asked = 0
        #: moving averages of how long a run executes and an acquire takes (None: not seen yet)
        self._exec_s: float | None = None
        self._acquire_rtt_s: float | None = None
        #: slots taken by runs executing for longer than an acquire's round trip, and by threads
        #: that outlived their runs, when the heartbeat loop last looked (``_unstick``)
        self._long = 0
        self._acquiring: set[asyncio.Task] = set()
        #: grants of answered acquires being started, held or given back (``_place``)
        self._placing: set[asyncio.Future] = set()
        #: no acquire before this monotonic time (a pause after a failed or empty acquire)
        self._acquire_after = 0.0
        #: since when (monotonic) no acquire was answered (None: the last one was), when that was
        #: last logged (None: not yet), and when the latest acquire answered was sent (_unanswered)
        self._unanswered_since: float | None = None
        self._unanswered_said: float | None = None
        self._tls_said: float | None = None  # when a TLS setting that cannot work was last said (_unanswered)
        self._answered_sent = float("-inf")
        #: the last acquire granted nothing: one lease request at a time until one grants again
        #: (a remote worker's idle long-poll needs no second one beside it)
        self._idle = False
        self._stopping = False
        #: the task that failed (``WorkerFailed``): the lease loop, heartbeat loop or watchdog
        self.failed: str | None = None
        #: no more leases: set by drain(), or when the cluster answers "draining"
        self.draining = False
        #: set when the cluster said this worker is draining (POST /v1/workers/{id}/drain)
        self.drain_requested = asyncio.Event()
        self.completed = 0
        self.refused = 0
        self.released = 0
        #: runs granted before their slot by the cluster's clock, which waited for it to start
        self.waited_for_slot = 0
        #: grants that arrived with little of their lease left (confirmed by a heartbeat before
        #: starting), and those of them whose lease was gone already (not started)
        self.late_grants = 0
        self.late_grants_gone = 0

    def stats(self) -> dict:
        """This worker: ``id``, ``slots``, ``running`` (leases held: runs executing,
        prefetched, or finished with their report on its way), ``completed`` (attempts reported
        and accepted), ``refused`` (reports refused for a stale token), ``released`` (leases
        given back: a drain, late grants whose lease could not be confirmed, runs held for a slot that did not free), ``waited_for_slot``, ``late_grants`` and ``late_grants_gone``
        (``_confirm_late``), ``draining`` and ``executes`` (whether it takes runs now: not
        while it leads a cluster of several, unless told to, nor while draining)."""
        return {"id": self.worker_id, "slots": self.slots, "running": len(self.held),
                "completed": self.completed, "refused": self.refused, "released": self.released,
                "waited_for_slot": self.waited_for_slot, "late_grants": self.late_grants,
                "late_grants_gone": self.late_grants_gone, "draining": self.draining,
                "executes": self.slots > 0 and not self.draining and self.channel.executes()}

    # ---------------------------------------------------------------- main loops
    async def run(self) -> None:
        """Lease and execute runs until cancelled; then stop: runs killed, what ended reported.

        The lease loop, the heartbeat loop and the lease watchdog run in one task group. If one
        of them fails (or ends), the others are stopped with it, every run held is given back
        (``release``: queued again at once, without spending an attempt) and
        :class:`WorkerFailed` is raised, after a logged error: never a worker that leases on
        without heartbeats, nor one whose rule "kill a run whose lease is past its TTL" has
        silently stopped. A node stops on it (a failed loop); ``raftsched worker`` exits 1.

        :raises WorkerFailed:
        """
        if self.sandbox is not None:
            try:
                await self.sandbox.start()
            except RunServerError as e:
                self.failed = "sandbox"
                log.error("worker %s: cannot run jobs: %s", self.worker_id, e)
                raise WorkerFailed("sandbox", str(e)) from e
            log.info("worker %s: %s", self.worker_id, self.sandbox.describe())
        try:
            await self._run()
        finally:
            if self.sandbox is not None:
                await self.sandbox.close()

    async def _run(self) -> None:
        self._session = aiohttp.ClientSession()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._supervised("heartbeat loop", self._heartbeat_loop()), name="heartbeat")
                tg.create_task(self._supervised("lease watchdog", self._watchdog()), name="lease watchdog")
                try:
                    await self._supervised("lease loop", self._lease())
                finally:
                    if self.failed is None:
                        # Stopped (cancelled): runs are killed (their leases expire), what ended
                        # on its own is reported, heartbeats go on meanwhile.
                        await self._stop()
        except BaseExceptionGroup as eg:
            failures = [e for e in eg.exceptions if isinstance(e, WorkerFailed)]
            if not failures or len(failures) != len(eg.exceptions):
                raise
            # Outside the group, so that nothing cancels the giving back.
            try:
                await self._give_back_all(f"the worker's {failures[0].task} failed")
            except Exception:
                log.exception("worker %s: giving back its runs failed (their leases will expire)", self.worker_id)
            await self._stop()
            raise failures[0] from failures[0].__cause__
        finally:
            await self._session.close()

    async def _supervised(self, name: str, coro: Awaitable[None]) -> None:
        """Run one of the worker's tasks, which run until cancelled: an error, or an end, is a
        failure of the worker. Logs it, notes it in ``failed``, raises :class:`WorkerFailed`."""
        try:
            await coro
        except Exception as e:
            self.failed = self.failed or name
            log.error("worker %s: the %s failed: %r; stopping the worker, its runs given back", self.worker_id,
                      name, e, exc_info=True)
            raise WorkerFailed(name, repr(e)) from e
        self.failed = self.failed or name
        log.error("worker %s: the %s ended; stopping the worker, its runs given back", self.worker_id, name)
        raise WorkerFailed(name, "it returned")

    async def _lease(self) -> None:
        """The lease loop itself: say hello, then pump until cancelled."""
        await self._say_hello()
        while True:
            self._wake.clear()
            timeout = self._pump()
            # Wake when a slot frees, an outcome is ready, an acquire or report ends; or poll
            # for new work.
            await wait_event(self._wake, timeout)

    async def _stop(self) -> None:
        """Stop leasing and end every run: acquires in flight are cancelled (runs they still
        grant are never started: their leases expire), runs waiting for a slot are forgotten
        likewise, running ones are killed, and what ended on its own is reported, all within the
        kill grace plus ``stop_report_grace_s``. A run the stop killed is not reported (its
        "lease lost" is the kill's, not the run's: reported, it was a failed attempt, and a job
        of the default max_attempts of 1 went to the dead-letter queue on a rolling restart): its
        lease expires, a lost attempt, and it runs again after one TTL, as after a crash,
        bounded by the lost-lease budget (``_executed``)."""
        self._stopping = True
        for t in list(self._acquiring):
            t.cancel()
        for h in self._waiting:
            self._release(h)
        self._waiting.clear()
        for h in list(self.held.values()):
            if h.executing:
                h.kill_unreported = True
            h.cancel.set()
        tasks = [h.task for h in self.held.values() if h.task and not h.task.done()]
        tasks += [t for t in self._superseded if not t.done()]  # (killed when superseded)
        tasks += [t for t in self._backs if not t.done()]  # (give-backs of held runs on their way)
        grace_s = self.kill_grace_s + worker_limits.stop_report_grace_s
        deadline = self.clock.monotonic_s() + grace_s
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        # Report what ended within the same bound (heartbeating meanwhile, unless they failed).
        while (self._outbox or self._reporting) and self.clock.monotonic_s() < deadline:
            while self._outbox and len(self._reporting) < worker_limits.reports_in_flight_max:
                self._flush()
            self._wake.clear()
            await wait_event(self._wake, max(0.01, deadline - self.clock.monotonic_s()))
        for t in list(self._reporting):
            t.cancel()
        await asyncio.gather(*self._reporting, return_exceptions=True)

    async def _give_back_all(self, reason: str) -> None:
        """After a failure: let go of every lease held, at once. Acquires in flight are
        cancelled, runs waiting for a slot are given back, running ones are killed and given
        back (``release``: queued again without spending an attempt). Outcomes already in
        hand are reported still (``_stop``)."""
        self._stopping = True
        for t in list(self._acquiring):
            t.cancel()
        await self._placed()  # grants already answered are given back (_place)
        waiting, self._waiting = list(self._waiting), collections.deque()
        running = [h for h in self.held.values() if h.executing]
        if waiting or running:
            log.warning("worker %s: giving back %d runs (%s)", self.worker_id, len(waiting) + len(running), reason)
        await self._kill_and_give_back(running, reason, waiting)

    async def _kill_and_give_back(self, running: list[_Held], reason: str, waiting: list[_Held] = ()) -> None:
        """Kill the runs of ``running`` (their outcomes are not reported), wait for them up to
        the kill grace, and give their leases back, with those of ``waiting`` (never started)."""
        for h in running:
            h.giving_back = True
            h.cancel.set()
        tasks = [h.task for h in running if h.task and not h.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.kill_grace_s + 1)
        if waiting:  # (never begun: said so, core/workers.py apply_release)
            await self._give_back(list(waiting), reason, not_started=True)
        if running:
            await self._give_back(running, reason)

    async def _say_hello(self) -> None:
        """Register with the cluster; a failure is not fatal (the heartbeat loop tries again)."""
        try:
            await self.channel.hello()
        except RaftschedError as e:
            log.info("worker %s: hello not delivered yet: %s", self.worker_id, e.message)

    def _pump(self) -> float:
        """Send what is due, in one turn of the event loop: outcomes (``complete_many``) and an
        acquire for the free slots. Commands proposed in one turn travel as one log entry
        (replication's group commit), so a worker whose runs all ended reports them and asks
        for as many again at the price of one entry. Returns how long the loop may sleep.

        At most ``slots`` runs execute at once. The runs asked for, granted and waiting, and
        executing together stay within the slots plus the prefetch (``_prefetch``); a finished
        run whose report is still on its way keeps its lease (heartbeated) but counts in
        neither. A second acquire goes out while one is in flight only for
        1/acquires_in_flight_max (worker/limits.py) of that budget or more, so slots do not sit idle for a log
        round trip and each acquire still carries many runs; and not while the last acquire
        granted nothing. Outcomes wait for the runs still executing, at most
        outcome_coalesce_s, so that the outcomes of one batch share one command.
        """
        now = self.clock.monotonic_s()
        timeout = self.poll_interval_s
        budget = self.slots + self._prefetch()
        free = budget - self._executing - self.lingering - len(self._waiting) - self._asked
        in_flight_max = 1 if self._idle else worker_limits.acquires_in_flight_max
        can_acquire = (free > 0 and len(self._acquiring) < in_flight_max and now >= self._acquire_after
                       and not self.draining)
        want_acquire = can_acquire and (not self._acquiring or free * worker_limits.acquires_in_flight_max >= budget)
        if self._acquire_after > now:
            timeout = min(timeout, self._acquire_after - now)
        flushed = False
        if self._outbox and len(self._reporting) < worker_limits.reports_in_flight_max:
            waited = now - self._outbox_since
            if (self._executing == 0 or waited >= worker_limits.outcome_coalesce_s or want_acquire
                    or len(self._outbox) >= limits.complete_batch_max):
                while self._outbox and len(self._reporting) < worker_limits.reports_in_flight_max:
                    self._flush()
                flushed = True
            else:
                timeout = min(timeout, worker_limits.outcome_coalesce_s - waited)
        # An acquire that rides with a report costs no log entry of its own.
        if (want_acquire or (flushed and can_acquire)) and self.channel.executes() and self.channel.may_acquire():
            n = min(free, limits.acquire_runs_max)
            self._asked += n
            t = asyncio.create_task(self._acquire(n), name="acquire")
            self._acquiring.add(t)
            t.add_done_callback(self._acquiring.discard)
        return max(0.001, timeout)

    def _prefetch(self) -> int:
        """Runs this worker may hold beyond its slots, waiting for one to free: as many as its
        slots while its runs end faster than an acquire's round trip (they would otherwise sit
        idle for most of it, and the round trip, not the slots, would bound the rate), none
        while they take longer (a run must not wait behind long ones when another worker could
        start it). The runs that have ended say how long runs take; the slots taken by runs
        still executing past a round trip (``_long``) are no slots short runs free, and count
        out: a worker whose every slot holds a run that has not ended prefetches nothing, however
        short its runs used to be."""
        if self._exec_s is None or self._acquire_rtt_s is None or self._exec_s >= self._acquire_rtt_s:
            return 0
        return max(0, self.slots - self._long)

    def _unstick(self) -> None:
        """Looked at once a heartbeat interval: count the slots taken by long runs (``_long``,
        for ``_prefetch``), and give back the runs held for a slot (prefetched) that have waited
        for one longer than prefetch_wait_s_min or prefetch_wait_rtts round trips (at most
        prefetch_wait_s_max; worker/limits.py) while every slot stays taken: the runs ahead of them
        turned long, and a worker with a free slot starts them now (``release`` with
        ``not_started``: queued again, due now, no attempt spent; a job's late_start skip withdraws
        one past its start_by). Until the next look this worker prefetches nothing, so the acquire
        that may ride with the release is not granted them back."""
        rtt = self._acquire_rtt_s
        now = self.clock.monotonic_s()
        self._long = self.lingering + (0 if rtt is None else sum(
            1 for h in self.held.values() if h.executing and now - h.since >= rtt))
        if not self._waiting or self._executing + self.lingering < self.slots or self._stopping or self.draining:
            return
        bound = max(worker_limits.prefetch_wait_s_min,
                    min(worker_limits.prefetch_wait_rtts * (rtt or 0.0), worker_limits.prefetch_wait_s_max))
        stuck = [h for h in self._waiting if not h.cancel.is_set() and now - h.since >= bound]
        if not stuck:
            return
        for h in stuck:
            self._waiting.remove(h)
        # No prefetch until the next look counts the slots again: an acquire riding with this
        # release would otherwise be granted the runs given back (due now) at once.
        self._long = self.slots
        log.info("worker %s: giving back %d run(s) held %.1f s or more for a slot that did not free (the runs ahead "
                 "of them run long): %s", self.worker_id, len(stuck), bound, ", ".join(h.grant["id"] for h in stuck[:5]))
        t = asyncio.ensure_future(self._give_back(stuck, "no slot of this worker freed for it in time", not_started=True))
        self._backs.add(t)
        t.add_done_callback(self._backs.discard)
        self._wake.set()

    def _unanswered(self, sent: float, e: RaftschedError) -> None:
        """An acquire sent at ``sent`` failed. When no node could take it (Unavailable,
        Indeterminate: none reachable, no leader, no answer in time) and no acquire sent since
        was answered, the outage is said once it has lasted unanswered_warn_after_s (a leader
        change is shorter), then every unanswered_log_every_s: a worker pointed at nodes that
        are all gone said nothing, and looked idle. Other errors were answers (a refusal)."""
        if not isinstance(e, (Unavailable, Indeterminate)) or sent < self._answered_sent:
            log.debug("worker: acquire failed: %s", e.message)
            return
        now = self.clock.monotonic_s()
        if e.extra.get("tls_failed") and (self._tls_said is None or now - self._tls_said >= worker_limits.unanswered_log_every_s):
            # A URL or CA of the worker's that cannot work (http:// for a TLS node, a certificate
            # that does not verify): no waiting out an outage that is none; said at once, and again
            # every unanswered_log_every_s while it lasts (another of its nodes may answer meanwhile).
            self._tls_said = now
            log.warning("worker %s: %s; fix the worker's --url or --ca-file (still asking its other nodes, if any)",
                        self.worker_id, e.message)
        if self._unanswered_since is None:
            self._unanswered_since = sent
        since = self._unanswered_since
        said = self._unanswered_said
        if now - since < worker_limits.unanswered_warn_after_s or (said is not None and now - said < worker_limits.unanswered_log_every_s):
            log.debug("worker: acquire failed: %s", e.message)
            return
        self._unanswered_said = now
        log.warning("worker %s: no lease request answered for %.0f s (%s); still asking%s", self.worker_id,
                    now - since, e.message,
                    "" if said is None else f", said again every {worker_limits.unanswered_log_every_s:g} s")

    def _answered(self, sent: float) -> None:
        """An acquire sent at ``sent`` was answered: an outage said is said to be over."""
        self._answered_sent = max(self._answered_sent, sent)
        if self._unanswered_since is not None and self._unanswered_said is not None:
            log.warning("worker %s: lease requests answered again, after %.0f s", self.worker_id,
                        self.clock.monotonic_s() - self._unanswered_since)
        self._unanswered_since = self._unanswered_said = None

    async def _acquire(self, n: int) -> None:
        """One acquire for ``n`` runs (slots reserved by the caller in ``_asked``); starts every
        run granted. Backs off after a failure, or when nothing was granted (ready entries were
        stale or rate-limited), rather than spin on the log."""
        sent = self.clock.monotonic_s()  # a fresh lease counts from when it was asked for
        # Sent while idle: a remote worker's request then waits at the node for work (up to its
        # wait_s), which is no round trip: its time is not taken for one (_prefetch, _unstick).
        idle = self._idle
        # Only runs of executor types this worker runs: a node started with --executors http
        # leaves shell runs to the nodes that take them.
        types = sorted(self.allowed_types) if self.allowed_types != ALL_TYPES else None
        try:
            try:
                res = await self.channel.acquire(n, self.lease_ttl_ms, types)
            except RaftschedError as e:
                self._unanswered(sent, e)
                self._acquire_after = self.clock.monotonic_s() + self.poll_interval_s
                return
            self._answered(sent)
            if res.draining:
                self._on_draining()
            runs = res.runs
            if not runs:
                self._idle = True
                after = (res.retry_after_s if res.retry_after_s is not None
                         else worker_limits.empty_acquire_backoff_polls * self.poll_interval_s)
                self._acquire_after = self.clock.monotonic_s() + after
                return
            self._idle = False
            self._acquire_after = 0.0
            rtt = self.clock.monotonic_s() - sent
            if not idle:
                self._acquire_rtt_s = rtt if self._acquire_rtt_s is None else self._acquire_rtt_s + worker_limits.ewma_weight * (rtt - self._acquire_rtt_s)
            try:
                late = self._late_among(runs, getattr(res, "transit_ms", None))
            except Exception:  # a bug in judging lateness must not cost the grants: held as before
                log.exception("worker %s: judging whether grants came late failed", self.worker_id)
                late = []
            if not late and not self.draining and not self._stopping:
                # The common case, nothing to wait for. Each lease ends no earlier than a TTL
                # after the request was sent (it was granted after), nor than the share of a TTL
                # an answer in time has left (_late): the watchdog counts from the later.
                self._hold(runs, sent)
                return
            # From here on the grants are this worker's: placing them goes on even if this
            # acquire is cancelled (a drain, a failure), so that each is started, held or given
            # back, never dropped.
            place = asyncio.ensure_future(self._place(runs, late))
            self._placing.add(place)
            place.add_done_callback(self._placing.discard)
            place.add_done_callback(_log_failure)
            await asyncio.shield(place)
        finally:
            self._asked -= n
            self._acquiring.discard(asyncio.current_task())  # before _pump looks again
            self._wake.set()

    async def _place(self, runs: list[dict], late: list[dict]) -> None:
        """Place the grants of one acquire's answer (``_hold``), the ``late`` ones only once a
        heartbeat kept their lease (``_confirm_late``), and give back what a drain or stop
        begun meanwhile leaves."""
        asked_at = self.clock.monotonic_s()  # (the heartbeat _confirm_late sends renews them all)
        if late:
            try:
                runs = await self._confirm_late(runs, late)
            except Exception:  # a bug, not a failed request (those are answered in _confirm_late)
                log.exception("worker %s: confirming late grants failed; giving them back", self.worker_id)
                await self._give_back([_Held(g) for g in runs], "its lease could not be confirmed", not_started=True)
                return
        back = self._hold(runs, asked_at if late else None)
        if back:
            await self._give_back(back, "draining", not_started=True)  # (granted as the drain began: never begun)

    def _hold(self, runs: list[dict], asked_at: float | None = None) -> list[_Held]:
        """Hold each grant: start it, or keep it until a slot frees (prefetched); returns those
        to give back instead (a drain or stop began), held until then. ``asked_at``: when the
        grants were asked for (their leases count from no earlier)."""
        back: list[_Held] = []
        late: list[_Held] = []  # (late_start: skip) past their start_by already: given back together
        mono, now_ms, ttl_ms = self.clock.monotonic_s(), self.clock.now_ms(), self.lease_ttl_ms
        for grant in runs:
            # When its lease was renewed, as the watchdog counts: a TTL before it ends. It ends
            # no earlier than a TTL after it was asked for (it was granted after), and by its
            # deadline on the cluster's clock (an answer in time has at least
            # grant_late_ttl_share of a TTL left: _late).
            renewed = mono if asked_at is None else asked_at
            deadline = grant.get("deadline")
            if type(deadline) is int:
                left_ms = min(ttl_ms, max(deadline - now_ms, ttl_ms * worker_limits.grant_late_ttl_share))
                renewed = max(renewed, mono - (ttl_ms - left_ms) / 1000)
            h = _Held(grant, renewed)
            old = self.held.get(grant["id"])
            if old is not None and old.token != h.token:
                # Granted again (its earlier attempt's lease is gone, the run handed on to this
                # worker again): the earlier attempt is killed, and kept track of until it ends,
                # so that a stop or drain still waits for it.
                if not old.cancel.is_set() and not old.reporting:
                    log.warning("worker: %s was granted again: killing its earlier attempt", grant["id"])
                    old.cancel.set()
                if old.task is not None and not old.task.done():
                    self._superseded.add(old.task)
                    old.task.add_done_callback(self._superseded.discard)
                if old in self._waiting:
                    self._waiting.remove(old)
            self.held[grant["id"]] = h
            if self.draining or self._stopping:
                back.append(h)  # granted as the drain began: given back at once
            elif self._too_late(grant):
                late.append(h)
            elif self._executing + self.lingering < self.slots:
                self._start(h)
            else:
                h.since = mono
                self._waiting.append(h)  # prefetched: starts when a slot frees
        if late:
            self._give_back_soon(late)
        return back

    async def _placed(self) -> None:
        """Wait (at most a lease TTL) for the grants being placed (``_place``): a drain returns
        when they are given back."""
        if self._placing:
            await asyncio.wait(list(self._placing), timeout=self.lease_ttl_ms / 1000)

    def _on_draining(self) -> None:
        if not self.drain_requested.is_set():
            if not self.draining:  # (else its own drain, which it told the cluster of: worker/remote.py leave)
                log.warning("worker %s: the cluster says this worker is draining: no more leases", self.worker_id)
            self.drain_requested.set()
        self.draining = True

    async def _heartbeat_loop(self) -> None:
        # A third of the TTL, and at most a second: a lease survives two lost heartbeats. A
        # node with many workers heartbeating at it asks for longer, up to a quarter of the TTL
        # (a lease survives a heartbeat given up after half a TTL between two such intervals).
        interval = min(self.lease_ttl_ms / 1000 / worker_limits.heartbeats_per_lease_ttl,
                       worker_limits.heartbeat_interval_s_max)
        longest = max(interval, self.lease_ttl_ms / 1000 * worker_limits.heartbeat_asked_ttl_share_max)
        while True:
            await asyncio.sleep(self.channel.heartbeat_interval_s(interval, longest))
            if not self.channel.registered():
                await self._say_hello()
            if not self.held:
                self._long = 0  # (no run: none long)
                continue
            self._give_back_late()
            self._unstick()
            await self._heartbeat_once()

    async def _heartbeat_once(self, extra: list[list] | None = None) -> set[str] | None:
        """One heartbeat of every lease held, and of ``extra`` (``[run, token]``: late grants not
        held yet, ``_confirm_late``). Kills the held runs whose lease is lost. Returns the runs
        lost, or None when the heartbeat failed."""
        extra = extra or []
        again = {rid for rid, _ in extra}
        leases = []
        for rid, h in list(self.held.items()):  # (a copy: a kill may forget a lease, _check_heartbeats)
            if rid in again:
                # Granted again (attempt + 1) while this worker still held the attempt before:
                # that lease is gone, its run handed on (to this worker, again). The state names
                # lost leases by run id: heartbeating both would lose the new one too.
                if not h.cancel.is_set() and not h.reporting:
                    log.warning("worker: %s was granted again: its earlier attempt's lease is gone; killing it", rid)
                    h.cancel.set()
                continue
            leases.append([rid, h.token])
        leases += extra
        sent = self.clock.monotonic_s()
        # Bounded by half a TTL: a heartbeat that takes longer is of no use, and the watchdog
        # must not wait behind it. One command carries at most run_refs_per_command leases
        # (a worker with prefetched runs can hold twice its slots).
        timeout_s = self.lease_ttl_ms / 1000 * worker_limits.heartbeat_timeout_lease_ttl_share
        step = limits.run_refs_per_command
        try:
            parts = await asyncio.gather(*(self.channel.heartbeat(leases[k:k + step], self.lease_ttl_ms, timeout_s)
                                           for k in range(0, len(leases), step)))
        except RaftschedError as e:
            log.warning("worker: heartbeat failed: %s", e.message)
            return None
        gone: set[str] = set()
        for lost, draining in parts:
            if draining:
                self._on_draining()
            gone.update(lost)
        sent_tokens = {rid: tok for rid, tok in leases}
        for rid, tok in sent_tokens.items():
            h = self.held.get(rid)
            # The state names a lost lease by its run id: it is the attempt this heartbeat
            # named (its token), not one granted since (a new attempt of the same run).
            if h is None or h.token != tok:
                continue
            if rid not in gone:
                h.renewed = max(h.renewed, sent)
            # A run whose outcome is on its way has nothing left to kill: its lease is gone
            # because the report applied (its answer is still to come), or it expired, and
            # then the report is refused as stale.
            elif not h.cancel.is_set() and not h.reporting:
                why = self._lost_why(rid)
                if why is not None:
                    # Ended by the cluster (a cancel by request, an overlap replace): said so. The
                    # kill's outcome is reported: the run has its outcome already, and the state
                    # keeps what it wrote as its output (core/leases.py killed_output).
                    log.info("worker: run %s was ended by the cluster (%s): killing it", rid, why)
                    h.ended = True
                else:
                    log.warning("worker: lease on %s lost (heartbeat refused): killing the run", rid)
                h.cancel.set()
        said = getattr(self.channel, "lost_why", None)
        if isinstance(said, dict):
            for rid in sent_tokens:  # (what this heartbeat was told and did not use: no longer held)
                said.pop(rid, None)
        return gone

    def _lost_why(self, rid: str) -> str | None:
        """Why the cluster ended run ``rid`` whose lease a heartbeat found lost, when its channel
        was told (its ``lost_why``: a cancel by request, an overlap replace); None otherwise."""
        said = getattr(self.channel, "lost_why", None)
        return said.pop(rid, None) if isinstance(said, dict) else None

    def _late(self, g: dict, transit_ms: float | None = None, now_ms: int | None = None) -> bool:
        """Whether grant ``g`` arrived with less than grant_late_ttl_share of its lease left: by
        this worker's clock (the cluster's), or by the answer's time on the way (``transit_ms``,
        by the worker's monotonic clock). The second catches an answer held up in the network:
        the cluster's clock a remote worker keeps is anchored on the answers it hears, so a late
        one sets it back by as much as it was late, and the first then sees nothing."""
        left_min = self.lease_ttl_ms * worker_limits.grant_late_ttl_share
        if transit_ms is not None and transit_ms > self.lease_ttl_ms - left_min:
            return True
        deadline = g.get("deadline")
        if not isinstance(deadline, int) or isinstance(deadline, bool):
            return False
        return deadline - (self.clock.now_ms() if now_ms is None else now_ms) < left_min

    def _late_among(self, runs: list[dict], transit_ms: float | None) -> list[dict]:
        """The late grants of an answer (``_late``); none while a drain or stop gives every
        grant back anyway."""
        if self.draining or self._stopping:
            return []
        now_ms = self.clock.now_ms()  # once an answer: the cluster's clock is not free to read
        return [g for g in runs if self._late(g, transit_ms, now_ms)]

    async def _confirm_late(self, runs: list[dict], late: list[dict]) -> list[dict]:
        """The grants of ``runs`` to start: those that arrived in time, and the ``late`` ones
        (``_late``) whose lease a heartbeat, sent now, found still held (and so renewed). A late
        grant whose lease is gone (expired on the way, its run regranted) is not started: its
        attempt is over, and starting it would only have the fencing token refuse its writes.
        When the heartbeat fails, the late grants are given back (release), not started."""
        if self.draining or self._stopping:
            return runs  # given back by the caller, late or not
        self.late_grants += len(late)
        # The whole answer: its grants share a deadline (one acquire), and none is renewed by
        # the heartbeat loop before it is held.
        lost = await self._heartbeat_once([[g["id"], g["token"]] for g in runs])
        if lost is None:
            log.warning("worker %s: %d runs granted late, and no heartbeat confirms their leases: giving them back",
                        self.worker_id, len(late))
            late_ids = {g["id"] for g in late}
            await self._give_back([_Held(g) for g in late], "granted late, and its lease could not be confirmed",
                                  not_started=True)
            return [g for g in runs if g["id"] not in late_ids]
        gone = [g["id"] for g in runs if g["id"] in lost]
        if gone:
            self.late_grants_gone += len(gone)
            log.warning("worker %s: %d runs granted late whose leases are gone already, not started: %s",
                        self.worker_id, len(gone), ", ".join(gone[:5]))
        return [g for g in runs if g["id"] not in lost]

    async def _watchdog(self) -> None:
        """Kill every run once no heartbeat has succeeded for a whole TTL by this process's
        monotonic clock: the leader may have expired the leases and handed the runs on. The
        leader judges expiry from when it saw the last heartbeat, which is after it was sent,
        so this kill comes first."""
        while True:
            await asyncio.sleep(worker_limits.lease_watchdog_interval_s)
            self._check_heartbeats()

    def _check_heartbeats(self) -> None:
        """One look of the watchdog: kill every run held whose lease was not renewed (granted,
        or kept by a heartbeat that succeeded) for a whole TTL, by the injected clock. Per
        lease: a fresh grant renews its own lease, not the others'."""
        now, ttl = self.clock.monotonic_s(), self.lease_ttl_ms / 1000
        # (a copy: a run started by callbacks, an app's thread handler, ends inside its cancel
        # event's set, and its lease is forgotten there: _executed)
        for rid, h in list(self.held.items()):
            if now - h.renewed > ttl and not h.cancel.is_set():
                log.warning("worker: no heartbeat for a lease TTL: killing %s (not reported: its lease "
                            "expires, and it runs again)", rid)
                # Not the run's failure: reported, its "lease lost" was a failed attempt with a
                # token no leader had expired yet (a cluster without a quorum for a TTL), and a
                # job of max_attempts 1 went to the dead-letter queue. Its lease expires instead:
                # a lost attempt, retried within the lost-lease budget, as after a crash.
                h.kill_unreported = True
                h.cancel.set()

    # ---------------------------------------------------------------- draining
    async def drain(self, drain_s: float) -> None:
        """Stop leasing and let go of every lease (SIGTERM, or the cluster's ``draining``):
        acquires in flight are cancelled (a grant that still arrives is given back), runs
        granted but not started are given back at once, running ones get ``drain_s`` to finish
        and be reported, and those still running then are killed and given back. Returns when
        the worker holds nothing (or the stop grace is spent); the caller then stops ``run``."""
        self.draining = True
        log.info("worker %s: draining: %d runs held, up to %.1f s for them to finish", self.worker_id,
                 len(self.held), drain_s)
        for t in list(self._acquiring):
            t.cancel()
        await self._placed()  # grants already answered are given back (_place)
        waiting, self._waiting = list(self._waiting), collections.deque()
        if waiting:  # (never begun: held for a free slot)
            await self._give_back(waiting, "draining", not_started=True)
        deadline = self.clock.monotonic_s() + drain_s
        while self._executing and self.clock.monotonic_s() < deadline:
            self._wake.clear()
            await wait_event(self._wake, max(0.01, min(0.5, deadline - self.clock.monotonic_s())))
        running = [h for h in self.held.values() if h.executing]
        await self._kill_and_give_back(running, f"still running after the drain time ({drain_s:g} s)")
        # What finished is reported by the loop (it flushes the outbox); wait for that, and for
        # the give-backs of held runs on their way.
        deadline = self.clock.monotonic_s() + worker_limits.stop_report_grace_s
        if self._backs:
            await asyncio.wait(list(self._backs), timeout=worker_limits.stop_report_grace_s)
        while (self._outbox or self._reporting) and self.clock.monotonic_s() < deadline:
            self._wake.set()
            await asyncio.sleep(0.01)  # ok-sleep: polling inside a deadline; the pump flushes
        log.info("worker %s: drained (%d completed, %d given back)", self.worker_id, self.completed, self.released)

    async def _give_back(self, hs: list[_Held], reason: str, not_started: bool = False) -> None:
        """Release the leases of ``hs`` (runs not started, or killed by a drain): queued again at
        once without spending an attempt. Forgotten here whatever the answer (a lease whose
        release did not get through expires: a lost attempt). ``not_started``: none of them was
        begun (a cluster withdraws one past its start_by: late_start skip)."""
        for h in hs:
            self._release(h)
        leases = [[h.grant["id"], h.token] for h in hs]
        step = limits.run_refs_per_command
        for k in range(0, len(leases), step):
            try:
                if not_started:
                    await self.channel.release(leases[k:k + step], reason, not_started=True)
                else:  # (a channel of an older node's protocol takes no not_started)
                    await self.channel.release(leases[k:k + step], reason)
                self.released += len(leases[k:k + step])
            except RaftschedError as e:
                log.warning("worker: release of %d leases failed (they will expire): %s", len(leases[k:k + step]), e.message)

    # ---------------------------------------------------------------- one run
    def _early_ms(self, g: dict) -> int:
        """How long before its slot, by this worker's clock (a node's and a remote worker's is the
        cluster's: raftsched/clock.py ClusterClock), the run of grant ``g`` would start now."""
        slot = g.get("slot")
        if not isinstance(slot, int) or isinstance(slot, bool):
            return 0
        return slot - self.clock.now_ms()

    def _start(self, h: _Held) -> None:
        h.executing = True
        self._executing += 1
        g = h.grant
        h.since = t0 = self.clock.monotonic_s()
        early = self._early_ms(g) > 0
        try:
            if g.get("executor") is not None:
                ctx = RunContext(run_id=g["id"], job=g["job"], slot_ms=g["slot"], attempt=g["attempt"],
                                 fencing_token=g["token"], payload=g.get("payload"), worker_id=self.worker_id,
                                 secrets=dict(g.get("secrets") or {}), upstream=g.get("upstream"))
                h.ctx = ctx
                own = self.executor_lookup(g) if self.executor_lookup is not None else None
                # In this process (no sandbox), a plain python function already imported runs
                # without a task of its own; so does an executor that can start by callbacks
                # (``soon``: an --app worker's handlers, raftsched/sdk/worker.py).
                if own is None and not early and self.sandbox is None and execute_soon(g["executor"], ctx, g["timeout_s"], functools.partial(self._soon_done, h, t0, None),
                                                cancel=h.cancel, allowed_types=self.allowed_types,
                                                kill_grace_s=self.kill_grace_s):
                    return
                soon = getattr(own, "soon", None)
                if soon is not None and not early:
                    # Done when its Outcome comes: what a stop or a drain waits for, as for a task.
                    done = asyncio.get_running_loop().create_future()
                    if soon(ctx, g["timeout_s"], h.cancel, functools.partial(self._soon_done, h, t0, done)):
                        h.task = done
                        return
            else:
                ctx = own = None
            h.task = asyncio.create_task(self._execute(h, ctx, t0, own, early), name=f"run {g['id']}")
        except Exception:
            # Never a slot lost to a bug here: the run is dropped (its lease expires).
            log.exception("worker: run %s could not be started", g["id"])
            self._release(h)
            self._free_slot(h)

    async def _execute(self, h: _Held, ctx: RunContext | None, t0: float, own=None, early: bool = False) -> None:
        g = h.grant
        try:
            if early:
                if not await self._until_slot(h):
                    return  # given up before its slot: nothing ran
                t0 = self.clock.monotonic_s()
            if ctx is None:  # no executor: the job was deleted, or its secrets could not be unsealed
                out = Outcome(ok=False, error=g.get("secrets_error") or "the job was deleted", output="", duration_ms=0)
            elif own is not None:
                out = await own(ctx, g["timeout_s"], h.cancel)
            else:
                out = await execute(masking.deliver(g["executor"], g.get("secrets")), ctx, g["timeout_s"], cancel=h.cancel,
                                    allowed_types=self.allowed_types, kill_grace_s=self.kill_grace_s,
                                    http_session=self._session, network=g.get("network"), sandbox=self.sandbox)
            self._executed(h, t0, out)
        except asyncio.CancelledError:
            self._release(h)
            raise
        except Exception:
            log.exception("worker: run %s failed unexpectedly", g["id"])
            self._release(h)
        finally:
            self._free_slot(h)

    async def _until_slot(self, h: _Held) -> bool:
        """Wait, holding the run's slot and its lease (heartbeated), until its slot has come by
        this worker's clock: the cluster's (raftsched/clock.py ClusterClock), so a worker starts
        no run before its slot whatever its own clock says. A run is granted before its slot
        when the state's time is ahead of that clock: a command stamped by a clock that ran
        fast (a leader's before it stepped down, a node of another version), or only the
        estimates' noise. True once the slot has come; False if the run was given up first
        (its lease lost, a drain, the worker stopping): nothing ran then, and its lease is
        given back unless a drain gives it back itself."""
        g = h.grant
        early = self._early_ms(g)
        self.waited_for_slot += 1
        if early >= worker_limits.slot_wait_logged_ms:
            log.info("worker %s: run %s was granted %d ms before its slot by the cluster's clock: waiting for it",
                     self.worker_id, g["id"], early)
        while True:
            left = self._early_ms(g)
            if left <= 0:
                return True
            if h.cancel.is_set():
                break
            await wait_event(h.cancel, min(left / 1000, worker_limits.slot_wait_poll_s))
        if not h.giving_back:
            await self._give_back([h], "given up before its slot", not_started=True)
        return False

    def _soon_done(self, h: _Held, t0: float, done: asyncio.Future | None, out: Outcome) -> None:
        """The Outcome of a run an executor started by callbacks (``soon``, ``execute_soon``):
        ``_executed``, guarded as ``_execute`` guards it for an awaited run. Without the guard, an
        error in it went to whoever called back (the loop's handler, a thread's inbox, or a
        heartbeat that set the run's cancel event), and the run kept its slot and its lease,
        heartbeated for ever."""
        if done is not None and not done.done():
            done.set_result(None)
        try:
            self._executed(h, t0, out)
        except Exception:
            log.exception("worker: run %s failed unexpectedly", h.grant["id"])
            self._release(h)
            self._free_slot(h, out.linger)

    def _executed(self, h: _Held, t0: float, out: Outcome) -> None:
        """Queue the outcome for the next report and free the run's slot. Reported even when
        the lease was lost: the state refuses a stale token, and accepts the outcome if the
        lease survived after all. The lease stays held (and heartbeated) until the report is
        answered. A run killed by a drain is given back instead (``drain``)."""
        now = self.clock.monotonic_s()
        self._exec_s = now - t0 if self._exec_s is None else self._exec_s + worker_limits.ewma_weight * (now - t0 - self._exec_s)
        if h.giving_back:
            self._free_slot(h, out.linger)
            return
        if h.kill_unreported and not out.ok:
            # Killed by the worker's stop (_stop) or its watchdog (_check_heartbeats): not the
            # run's outcome. Forgotten; its lease expires (a lost attempt). A success that came
            # first is reported as any.
            self._release(h)
            self._free_slot(h, out.linger)
            return
        if not self._outbox:
            self._outbox_since = now
        g = h.grant
        output, error = out.output, out.error
        if g.get("keep_output") is False:
            output = ""  # the job asked for its output not to be kept
        masked = masking.secret_values(g.get("executor"), g.get("secrets"))
        if masked:  # masked where it was cut (executors/_output.py); again here, whatever the executor
            output, error = masking.mask(output, masked), masking.mask(error, masked)
        item = {"run": g["id"], "token": g["token"], "success": out.ok, "error": error, "output": output}
        if out.ok and h.ctx is not None and h.ctx.result is not None:
            result = run_result(h.ctx.result)
            if result is not None:
                item["result"] = result
            else:
                log.info("worker: run %s returned a result that is not JSON of at most %d bytes; not kept",
                         g["id"], limits.result_bytes_max)
        h.reporting = True
        self._outbox.append((item, h))
        self._free_slot(h, out.linger)

    def _free_slot(self, h: _Held, linger: asyncio.Future | None = None) -> None:
        """The run of ``h`` no longer executes. Its slot is free, and the next run waiting for
        one starts; unless ``linger`` (an Outcome's: a thread that could not be stopped) is not
        done yet: then the slot stays taken until it is, so the worker never runs more threads
        than its slots."""
        if h.executing:
            h.executing = False
            self._executing -= 1
            self._wake.set()
            if linger is not None and not linger.done():
                self.lingering += 1
                log.warning("worker %s: run %s is over but its thread is not; its slot stays taken until it "
                            "returns (%d of %d slots so taken)", self.worker_id, h.grant["id"], self.lingering,
                            self.slots)
                linger.add_done_callback(self._lingered)
                return
            self._start_waiting()

    def _lingered(self, _: asyncio.Future) -> None:
        """A thread that outlived its run ended: its slot is free."""
        self.lingering -= 1
        log.info("worker %s: a thread that outlived its run ended; its slot is free (%d still taken so)",
                 self.worker_id, self.lingering)
        self._wake.set()
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start the next run waiting for a slot (prefetched), if a slot is free."""
        late: list[_Held] = []  # (late_start: skip) past their start_by: given back together
        while (self._waiting and not self._stopping and not self.draining
               and self._executing + self.lingering < self.slots):
            nxt = self._waiting.popleft()
            if nxt.cancel.is_set():
                # Its lease was lost, or given up, before it started: nothing ran, nothing
                # to report; if the lease still exists it expires, a lost attempt.
                self._release(nxt)
                continue
            if self._too_late(nxt.grant):
                late.append(nxt)
                continue
            self._start(nxt)
            break
        if late:
            self._give_back_soon(late)

    def _too_late(self, grant: dict) -> bool:
        """Whether a grant of a job with ``late_start: skip`` has passed its ``start_by`` (the
        cluster's time: core/deadlines.py late_start_by): it must not start, but go back (the
        cluster withdraws it: core/workers.py apply_release)."""
        start_by = grant.get("start_by")
        return type(start_by) is int and self.clock.now_ms() >= start_by

    def _give_back_late(self) -> None:
        """Give back the runs held for a slot (prefetched) whose start_by has passed: a slot that
        did not free in time (long runs ahead of them) must not start them late."""
        late = [h for h in self._waiting if not h.cancel.is_set() and self._too_late(h.grant)]
        for h in late:
            self._waiting.remove(h)
        if late:
            self._give_back_soon(late)

    def _give_back_soon(self, hs: list[_Held]) -> None:
        log.info("worker %s: giving back %d run(s) not started by their start deadline (late_start: skip): %s",
                 self.worker_id, len(hs), ", ".join(h.grant["id"] for h in hs[:5]))
        t = asyncio.ensure_future(self._give_back(hs, "not started by its start deadline (late_start: skip)",
                                                  not_started=True))
        self._backs.add(t)
        t.add_done_callback(self._backs.discard)

    def _release(self, h: _Held) -> None:
        """Forget a lease: its run was reported, or will never be (then the lease expires)."""
        rid = h.grant["id"]
        if self.held.get(rid) is h:
            del self.held[rid]

    def _flush(self) -> None:
        """Send the oldest outcomes as one ``complete_many`` (each judged alone by the state), as
        many as fit in a command."""
        batch, size = [], 0
        while self._outbox and len(batch) < limits.complete_batch_max:
            item = self._outbox[0][0]
            try:
                n = len(msgpack.packb(item, use_bin_type=True))
            except (OverflowError, TypeError, ValueError) as e:
                # A value no command can carry (a result or an error made elsewhere than
                # run_result): the outcome goes without it rather than take the batch down.
                log.warning("worker %s: outcome of %s not encodable (%s); reported without its result",
                            self.worker_id, item.get("run"), e)
                item.pop("result", None)
                for k in ("error", "output"):
                    if isinstance(item.get(k), str):
                        item[k] = item[k].encode("utf-8", "replace").decode()
                try:
                    n = len(msgpack.packb(item, use_bin_type=True))
                except (OverflowError, TypeError, ValueError):
                    # Reported as a failure of its own, which any command carries: never dropped
                    # (its lease, renewed while it is reported, would never end).
                    item.clear()
                    item.update(run=self._outbox[0][1].grant["id"], token=self._outbox[0][1].token, success=False,
                                error="the run's outcome could not be encoded", output="")
                    n = len(msgpack.packb(item, use_bin_type=True))
            if batch and size + n > worker_limits.complete_batch_bytes_max:
                break
            batch.append(self._outbox.popleft())
            size += n
        self._outbox_since = self.clock.monotonic_s()
        t = asyncio.create_task(self._report(batch), name="report")
        self._reporting.add(t)
        t.add_done_callback(self._reporting.discard)

    async def _report(self, batch: list[tuple[dict, _Held]]) -> None:
        results = None
        try:
            results = await self.channel.complete([item for item, _ in batch])
        finally:
            # Answered, or given up (then the leases expire and the runs are retried): the
            # leases are no longer this worker's to renew.
            for k, (item, h) in enumerate(batch):
                self._release(h)
                res = None if results is None else results[k]
                if res is None:
                    continue
                if res.get("ok"):
                    if res.get("kept") != "output":
                        self.completed += 1
                    elif not h.ended:  # (a killed run's output is no outcome of this worker's)
                        # Its outcome came after the cluster ended it (a cancel, a replace): the run
                        # keeps that ending, a success included; once a warning, "refused".
                        log.info("worker: run %s had been ended by the cluster when its outcome came (%s): "
                                 "only its output was kept", item["run"], "succeeded" if item.get("success") else "failed")
                elif h.ended:  # (a node before 2026-12-07 keeps no output of a run it ended)
                    log.info("worker: output of %s, which the cluster ended, not kept: %s", item["run"],
                             (res.get("error") or {}).get("message"))
                elif (res.get("error") or {}).get("code") == "conflict":
                    self.refused += 1
                    log.warning("worker: completion of %s refused: %s", item["run"], res["error"].get("message"))
            self._reporting.discard(asyncio.current_task())  # before _pump looks again
            self._wake.set()


# ---------------------------------------------------------------------------- embedded
class EmbeddedChannel:
    """The embedded worker's channel: commands proposed through the node's own Raft adapter
    (``propose``), ready work and the worker's registration read from the local replica
    (``read``)."""

    kind = "embedded"

    def __init__(self, raft, clock: Clock, worker_id: str, *, slots: int, queues: list[str] | None,
                 allowed_types, labels: dict | None = None, execute_on_leader: bool = False,
                 single_node: bool = False, unseal: Callable[[dict], dict] | None = None,
                 by: str | None = None) -> None:
        self.raft = raft
        #: the node's name, written into its acquires (node/dispatch.py Dispatcher.by)
        self.by = by
        #: why the cluster ended runs whose leases a heartbeat found lost (queries.ended_leases), until
        #: the loop reads it (LeaseLoop._lost_why)
        self.lost_why: dict[str, str] = {}
        #: a grant with its secrets unsealed (raftsched/sealing.py unseal_grant, with the node's ring)
        self.unseal = unseal or functools.partial(sealing.unseal_grant, ring=sealing.PROCESS_RING)
        #: keys its node's ring lacked to unseal a run's secrets (sealing.note_keys_missing): the
        #: node's fleet reads the same set (node/node.py)
        self.keys_missing: set[str] = set()
        #: the one way a command goes out (raftsched/proposer.py), as for the rest of the node
        self.proposer = Proposer(raft)
        self.clock = clock
        self.worker_id = worker_id
        self.queues = queues
        self.execute_on_leader = execute_on_leader
        self.single_node = single_node
        #: what this worker says of itself (core/workers.py FACTS), but its slots (``facts``); the
        #: instance is this process
        self._facts = {"kind": "embedded", "labels": dict(sorted((labels or {}).items())), "slots": slots,
                       "executors": sorted(allowed_types), "queues": queues, "version": VERSION,
                       "instance": uuid.uuid4().hex[:16]}

    @property
    def facts(self) -> dict:
        """What it says of itself: its slots are 0 while it runs nothing (``executes``: its node
        leads a cluster of several), so that the registry, and what reads it (placement's
        judgements, a PUT's warnings, a queued run's ``waiting_for``), does not count the
        leader's worker as one free to take runs. The heartbeat loop's ``registered`` sees the
        change within a heartbeat and says hello again (one command a change of leader a node)."""
        if self.executes():
            return self._facts
        return dict(self._facts, slots=0)

    async def hello(self) -> None:
        await self._propose(commands.worker_hello(self.clock.now_ms(), worker=self.worker_id, facts=self.facts))

    def registered(self) -> bool:
        rec = self.raft.read(queries.worker_record, self.worker_id)
        return rec is not None and all(rec[k] == v for k, v in self.facts.items())

    def may_acquire(self) -> bool:
        return self.raft.read(queries.has_ready_work, self.queues, self.clock.now_ms())

    def executes(self) -> bool:
        if self.single_node or self.execute_on_leader:
            return True
        if not self.raft.is_leader():
            return True
        # The leader executes when it is its cluster's only voter: one started alone, or one
        # whose others were removed (the members change online: docs/operations.md).
        return len(self.raft.status().get("members") or ()) <= 1

    async def acquire(self, n: int, ttl_ms: int, types: list[str] | None) -> Grants:
        res = await self._propose(commands.acquire(self.clock.now_ms(), worker=self.worker_id, queues=self.queues,
                                                   max=n, ttl=ttl_ms, types=types, by=self.by))
        runs = [self.unseal(g) for g in res.get("runs", [])]
        sealing.note_keys_missing(runs, self.keys_missing, f"worker {self.worker_id}")
        return Grants(runs, bool(res.get("draining")))

    async def heartbeat(self, leases: list[list], ttl_ms: int, timeout_s: float) -> tuple[list[str], bool]:
        res = await self._propose(commands.heartbeat(self.clock.now_ms(), worker=self.worker_id, leases=leases,
                                                     ttl=ttl_ms), timeout_s=timeout_s)
        lost = res.get("lost", [])
        if lost:
            gone = set(lost)
            self.lost_why.update(self.raft.read(queries.ended_leases, self.worker_id,
                                                [lease for lease in leases if lease[0] in gone]))
        return lost, bool(res.get("draining"))

    def heartbeat_interval_s(self, own_s: float, longest_s: float) -> float:
        return own_s  # (one worker a node: its own node never asks for longer)

    async def complete(self, items: list[dict]) -> list[dict] | None:
        """Propose one complete_many, retrying an unknown outcome with the same request id (the
        state machine deduplicates it). None when it could not be delivered for a minute."""
        rid = uuid.uuid4().hex
        deadline = self.clock.monotonic_s() + worker_limits.report_deadline_s
        while True:
            cmd = commands.complete_many(self.clock.now_ms(), rid, results=items, worker=self.worker_id)
            try:
                return outcome_results(await self._propose(cmd), [it.get("run") for it in items])
            except (Indeterminate, Unavailable) as e:
                if self.clock.monotonic_s() > deadline:
                    log.warning("worker: giving up reporting %d outcomes: %s (their leases will expire)", len(items), e.message)
                    return None
                await asyncio.sleep(worker_limits.report_retry_s)
            except RaftschedError as e:
                log.error("worker: outcomes refused as a whole: %s", e.message)
                return None

    async def release(self, leases: list[list], reason: str, not_started: bool = False) -> None:
        await self._propose(commands.release(self.clock.now_ms(), uuid.uuid4().hex, worker=self.worker_id,
                                             leases=leases, reason=reason, not_started=not_started))

    async def close(self) -> None:
        pass

    async def _propose(self, cmd: dict, timeout_s: float | None = None) -> dict:
        # No replay look (a lock the tick thread's apply holds): apply deduplicates a retry.
        return await self.proposer.propose(cmd, timeout_s=timeout_s, replay=False)


class Worker(LeaseLoop):
    """A node's embedded worker: the lease loop over an :class:`EmbeddedChannel`.

    :param labels: the node's ``--labels``: which placed jobs this worker may run.
    :param unseal: a grant with its secrets unsealed by the node's key ring (node/node.py).
    :param sandbox: where its shell and python runs execute (:class:`LeaseLoop`).
    """

    def __init__(self, raft, clock: Clock, node_id: str, *, sandbox: Sandbox | None,
                 slots: int = worker_limits.slots_default,
                 queues: list[str] | None = None, allowed_types=ALL_TYPES,
                 lease_ttl_ms: int = worker_limits.lease_ttl_ms_default, execute_on_leader: bool = False,
                 single_node: bool = False, poll_interval_s: float = worker_limits.worker_poll_s_default,
                 kill_grace_s: float = worker_limits.kill_grace_s_default, labels: dict | None = None,
                 unseal: Callable[[dict], dict] | None = None) -> None:
        queues = sorted(set(queues)) if queues else None
        channel = EmbeddedChannel(raft, clock, f"{node_id}/{os.getpid()}", slots=slots, queues=queues,
                                  allowed_types=allowed_types, labels=labels, execute_on_leader=execute_on_leader,
                                  single_node=single_node, unseal=unseal, by=node_id)
        super().__init__(channel, clock, sandbox=sandbox, slots=slots, allowed_types=allowed_types,
                         lease_ttl_ms=lease_ttl_ms, poll_interval_s=poll_interval_s, kill_grace_s=kill_grace_s)
        self.raft = raft
        self.queues = queues

    def _on_draining(self) -> None:
        """A drained embedded worker stops leasing and stays so until its node restarts (a new
        process instance); the node itself carries on."""
        if not self.draining:
            log.warning("worker %s: drained: this node's worker takes no more runs until the node restarts",
                        self.worker_id)
        self.draining = True
