"""A node's dispatcher of waiting lease requests: fair and herd-free long-polls.

Remote workers ask a node for runs with a long-poll (``POST /v1/workers/{id}/lease``, docs/api.md):
"up to N runs of these queues that my labels satisfy, wait at most W seconds". Hundreds of them
may wait at one node at once. Answering them by letting each one propose an acquire whenever the
replica shows work would be a thundering herd: a thousand acquires for one run, all but one
granting nothing, each a log entry. The dispatcher instead keeps the waiting requests first in,
first out, grouped by what they can take (queues, labels, executor types: requests of one group
are interchangeable), and, when its replica shows ready work for a group
(``queries.ready_scan``), proposes acquires for that group's oldest requests (their free
slots), only as many as cover the work it counted (one, for one run), in one turn of the loop,
so they travel in one log entry and apply oldest first. Work that falls due while they are in
flight, beyond what they cover, gets acquires for the next requests at once: a run due every
20 ms does not wait for the previous run's commit; that count passes over the share of the
acquires in flight unread while the group's counts read nothing but runs its workers can take
and its acquires grant something (``queries.ready_scan``). A request that waits ``wait_s`` without
work is answered with no runs. A look costs the same however many requests wait: it reads
the ready work and the few oldest requests of each group, never every request. The loop does
not poll the replica: it sleeps until the replica applies an entry (``arm_applied``; at most
one look per ``dispatch_poll_s`` for that), a due time, a request for a group that may have
work, an acquire's end, or the full look of every second. A request of a worker drained while
it waits is answered ``draining`` at the next look.

The acquire is a replicated command like any other (core/leases.py): a run is granted once,
through the log, to one worker, whichever node's dispatcher proposed the acquire. The leader's
dispatcher acquires a run as it falls due, a follower's once it has been due for
``dispatch_follower_grace_ms`` (a follower's acquire also travels to the leader first): by
then the leader's acquire has usually reached the follower's replica, so a run costs one
acquire, not one per node, wherever the leader has a request waiting for it, and a run only
followers have requests for waits that much longer. Dispatchers of different nodes may still
propose for the same run; one gets it, the others' acquires grant nothing, and their group
waits ``dispatch_empty_backoff_s`` before it tries again.

A request whose acquire grants runs after it was given up (its client went away, or its wait
ran out while the acquire was in flight) has its runs given back at once (``release``: queued
again without an attempt spent), so no run waits a lease TTL for a worker that never heard of
it.

Everything runs on the node's event loop; the replica is read through ``raft.read``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Awaitable, Callable

from ..aio import wait_event
from ..clock import Clock
from ..core import commands, queries
from ..core.errors import RaftschedError, Unavailable
from . import limits as node_limits

log = logging.getLogger("raftsched.dispatch")


class LeaseRequest:
    """One waiting lease request: whose, what it can take, how many runs for how long.

    ``key`` groups interchangeable requests: the same queues, labels (and dedicated labels),
    executor types, tenants (those of a token limited to tenants; None: every tenant) and python
    targets (those it has handlers for; None: any)."""

    __slots__ = ("worker", "queues", "labels", "types", "n", "ttl_ms", "key", "done", "grants", "draining",
                 "error", "in_flight", "abandoned", "alive", "dedicated", "tenants", "targets")

    def __init__(self, worker: str, queues: list[str] | None, labels: dict, types: list[str] | None, n: int,
                 ttl_ms: int, alive: Callable[[], bool] | None = None, dedicated: list[str] | None = None,
                 tenants: list[str] | None = None, targets: list[str] | None = None) -> None:
        self.worker = worker
        self.queues = queues
        self.labels = labels
        self.types = types
        self.n = n
        self.ttl_ms = ttl_ms
        #: the names of its labels the worker is dedicated to (core/workers.py)
        self.dedicated = tuple(dedicated or ())
        #: the tenants whose runs it may be granted (sorted), or None: every tenant
        self.tenants = None if tenants is None else sorted(tenants)
        #: the python targets it has handlers for, or None: any (core/workers.py TARGETS)
        self.targets = None if targets is None else frozenset(targets)
        self.key = (None if queues is None else tuple(queues), tuple(sorted(labels.items())),
                    None if types is None else tuple(types), self.dedicated,
                    None if tenants is None else tuple(self.tenants),
                    None if targets is None else tuple(sorted(self.targets)))
        self.done = asyncio.Event()
        self.grants: list[dict] = []
        self.draining = False
        self.error: RaftschedError | None = None
        #: an acquire for it has been proposed and not answered yet
        self.in_flight = False
        #: its client no longer waits for it (timed out, went away)
        self.abandoned = False
        #: whether its client is still connected (None: assume so): a worker that died while its
        #: request waited is passed over, not granted runs it will never hear of
        self.alive = alive

    def gone(self) -> bool:
        """Answered, given up, or its client disconnected."""
        return self.abandoned or self.done.is_set() or (self.alive is not None and not self.alive())


class Dispatcher:
    """The waiting lease requests of one node, and the loop that serves them.

    :param raft: the replication adapter (``read``).
    :param propose: ``await propose(cmd) -> result``, raising RaftschedError on a refusal.
    :param release: ``await release(worker, grants, reason)``: give back runs granted to a
        request nobody waits for any more.
    """

    def __init__(self, raft, clock: Clock, propose: Callable[[dict], Awaitable[dict]],
                 release: Callable[[str, list[dict], str], Awaitable[None]], by: str | None = None) -> None:
        self.raft = raft
        #: this node's name, written into its acquires: the other replicas build no grants
        #: (core/leases.py apply_acquire; the node sets its state's answers_for to the same)
        self.by = by
        self.clock = clock
        self._propose = propose
        self._release = release
        self._groups: dict[tuple, collections.deque[LeaseRequest]] = {}
        #: group -> acquires in flight for it, and the runs they may take: a run that falls due
        #: while they are in flight gets an acquire of its own at once (they do not wait for
        #: each other's commits), ready work they cover does not
        self._busy: dict[tuple, int] = {}
        self._cover: dict[tuple, int] = {}
        #: group -> no acquire before this monotonic time (after one that granted nothing)
        self._backoff: dict[tuple, float] = {}
        #: group -> monotonic time of its last acquire
        self._last_try: dict[tuple, float] = {}
        #: group -> how many queue entries from the head its counts found, all runs its workers
        #: can take: a count with acquires in flight passes over as many of their share unread
        #: (queries.ready_scan); less what each acquire takes as it ends, none after one that
        #: granted nothing or a count that read any other entry
        self._known: dict[tuple, int] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        #: what the last full look saw: the replica's applied count, the earliest future due time
        #: of the groups' queues (ms), when it ran (monotonic), and whether anything happened since
        #: that a look must see (a request came, an acquire ended, a backoff ran out)
        self._seen_applied: int | None = None
        #: the replica's count of drains (queries.drains_count) when the waiting requests were
        #: last checked for drained workers
        self._seen_drains: int | None = None
        self._next_due_ms: float = float("inf")
        self._full_at = 0.0
        self._dirty = True
        #: groups whose last look found no ready work for them: a request joining one needs no look
        self._quiet: set[tuple] = set()
        #: requests waiting (not abandoned, not answered)
        self.waiting = 0
        #: set once run() ends (the node stops): lease requests are answered at once, empty
        self.closed = False
        self.acquires = 0
        self.acquires_empty = 0
        self.given_back = 0

    def stats(self) -> dict:
        """``waiting`` requests, ``groups``, ``acquires`` proposed, ``acquires_empty`` (granted
        nothing) and ``given_back`` (runs released because nobody waited for them any more)."""
        return {"waiting": self.waiting, "groups": len(self._groups), "acquires": self.acquires,
                "acquires_empty": self.acquires_empty, "given_back": self.given_back}

    def waiting_workers(self) -> set[str]:
        """The ids of the workers with a request waiting here now."""
        return {r.worker for q in self._groups.values() for r in q if not r.abandoned}

    async def lease(self, req: LeaseRequest, wait_s: float) -> LeaseRequest:
        """Wait until ``req`` is answered (its ``grants``, maybe ``draining``) or ``wait_s``
        passed (no grants). An acquire in flight for it when the wait runs out is waited for:
        its grants are the request's.

        :raises Unavailable: too many requests wait at this node already.
        :raises RaftschedError: the acquire proposed for it failed (no leader, ...)."""
        if self.closed:
            return req  # the node is stopping: no grants, at once (the worker asks another node)
        if self.waiting >= node_limits.lease_waiters_max:
            raise Unavailable(f"{self.waiting} lease requests wait at this node already; try another node")
        q = self._groups.setdefault(req.key, collections.deque())
        # A request joining a group that waits with no work for it changes no look's answer (the
        # same queues, labels and types; nothing ready to share out): it waits at the back, and
        # the next apply, due time or full look serves the group. Otherwise it is looked at now.
        # A short wait (a request that carries outcomes: worker/limits.py carried_lease_wait_s)
        # is looked at now: it may be over before the next apply wakes the loop.
        quiet = bool(q) and req.key in self._quiet and wait_s >= node_limits.dispatch_full_look_s
        q.append(req)
        self.waiting += 1
        if not quiet:
            self._dirty = True
            self._wake.set()
        try:
            got = await wait_event(req.done, wait_s)
            if not got and req.in_flight:
                got = await wait_event(req.done, node_limits.propose_timeout_s_default + 1)
        except asyncio.CancelledError:
            self._abandon(req)
            raise
        if not got:
            self._abandon(req)
            return req
        if req.error is not None:
            raise req.error
        return req

    def _abandon(self, req: LeaseRequest) -> None:
        if not req.abandoned and not req.done.is_set():
            req.abandoned = True
            if not req.in_flight:
                self.waiting -= 1

    async def run(self) -> None:
        """Serve the waiting requests until cancelled; then answer every waiting one at once,
        with no grants: a stopping node must not hold long-polls open for their whole wait
        (the API's cleanup waits for its handlers, and a node stopped with SIGTERM would wait
        out a worker's wait_s, or be killed)."""
        arm = getattr(self.raft, "arm_applied", None)
        try:
            while True:
                self._wake.clear()
                timeout = self._look()
                if arm is None or not self._groups:
                    await wait_event(self._wake, timeout)
                    continue
                # Woken by the replica rather than polling it: the next entry applied wakes the
                # loop (an idle node with requests waiting spent ~1.4 % of a core looking every
                # dispatch_poll_s); armed, then read, so an entry applied in between is seen.
                looked = self.clock.monotonic_s()
                arm(self._wake.set)
                if self.raft.read(queries.applied_count) != self._seen_applied:
                    self._wake.set()
                if await wait_event(self._wake, timeout) and not self._dirty:
                    # An entry applied: at most one look per dispatch_poll_s for that, as before,
                    # however fast entries apply; a request or an acquire's end (which make it
                    # dirty) still wakes the loop at once, and so does a due time.
                    # (never past the due time, backoff or full look the look asked to wake at)
                    gap = min(node_limits.dispatch_poll_s, timeout) - (self.clock.monotonic_s() - looked)
                    if gap > 0:
                        self._wake.clear()
                        await wait_event(self._wake, gap)
        finally:
            self.closed = True
            for t in list(self._tasks):
                t.cancel()
            for q in self._groups.values():
                for req in list(q):
                    if not req.done.is_set():
                        # An acquire in flight for it was cancelled: if it committed after all,
                        # its runs' leases expire, and they run elsewhere (at least once).
                        req.grants, req.draining, req.error, req.in_flight = [], False, None, False
                        req.done.set()
            self._groups.clear()
            self._quiet.clear()
            self.waiting = 0

    def _look(self) -> float:
        """One look at every group that is not busy nor backing off: when its replica shows
        ready work for it, acquires for its oldest requests, as many as cover that work (at
        most ``dispatch_batch_max``), proposed in one turn of the loop (one log entry). Returns
        how long to sleep."""
        if not self._groups:
            return node_limits.dispatch_poll_s * 50  # nothing waits: a request wakes the loop
        mono = self.clock.monotonic_s()
        now_ms = self.clock.now_ms()
        # Woken by the replica's applies (run), the loop need not poll it: it sleeps until a due
        # time, a backoff's end or the next full look. Without that (a replica that cannot say),
        # it polls every dispatch_poll_s.
        timeout = (node_limits.dispatch_full_look_s if hasattr(self.raft, "arm_applied")
                   else node_limits.dispatch_poll_s)
        # A look whose answer cannot have changed is skipped: the same replica (no command applied
        # since), no due time reached, nothing new here, and a full look not long ago (time alone
        # refills tenants' buckets). Idle requests of many groups then cost one read a wake-up.
        applied = self.raft.read(queries.applied_count)
        if (not self._dirty and applied == self._seen_applied and now_ms < self._next_due_ms
                and mono - self._full_at < node_limits.dispatch_full_look_s):
            return max(0.001, min(timeout, (self._next_due_ms - now_ms) / 1000,
                                  self._full_at + node_limits.dispatch_full_look_s - mono))
        self._dirty = False
        self._seen_applied = applied
        self._full_at = mono
        drains = self.raft.read(queries.drains_count)
        if drains != self._seen_drains:
            self._seen_drains = drains
            self._answer_drained()
        self._next_due_ms = float("inf")
        # The leader's dispatcher acquires a run as it falls due; a follower's only once it has
        # been due for dispatch_follower_grace_ms, by when the leader's acquire has usually
        # reached its replica: one acquire a run, not one per node, when the leader has workers
        # waiting for it (each empty acquire is a log entry, and a backoff of its group).
        grace = 0 if self.raft.is_leader() else node_limits.dispatch_follower_grace_ms
        ready_ms = now_ms - grace
        for key in list(self._groups):
            q = self._groups[key]
            self._quiet.discard(key)
            while q and q[0].gone():
                self._abandon(q.popleft())
            if not q:
                del self._groups[key]
                self._backoff.pop(key, None)
                self._last_try.pop(key, None)
                self._known.pop(key, None)
                continue
            in_flight = self._busy.get(key, 0)
            if in_flight >= node_limits.dispatch_batch_max:
                continue
            after = self._backoff.get(key, 0.0)
            if after > mono:
                timeout = min(timeout, after - mono)
                self._dirty = True  # its backoff runs out before the state need change: look again
                continue
            head = q[0]
            types = None if head.types is None else frozenset(head.types)
            # The runs its requests want, counted only as far as a scan reads: a look costs the
            # same with ten thousand idle requests waiting as with ten.
            want, wants = 0, []
            for r in q:
                n = r.n
                wants.append(n)
                want += n
                if want >= node_limits.dispatch_ready_scan_max:
                    want = node_limits.dispatch_ready_scan_max
                    break
            if want <= self._cover.get(key, 0):
                # The acquires in flight cover as many runs as the count may show (it shows at
                # most want): what it could find is theirs (count - cover <= want - cover <= 0),
                # whether or not a request counted is free (a free one further back, or one
                # that came while its group's acquires cover the scan's whole want). An
                # acquire's end or a new request looks again; under load that is most looks,
                # each a scan of up to want runs saved.
                continue
            cover = self._cover.get(key, 0) if in_flight else 0
            # The requests an acquire may go to now (free), as the picking below goes through
            # them, as far as the largest count this look can give (want - cover) reaches: the
            # count need not go past their n but the last one's, and one more (the picks are
            # the same; a group of one request reads one entry where it read its n). Free ones
            # can lie past the want's requests (requests gone but not yet unlinked: test_fleet.py).
            free, need, last, most = 0, 0, 0, want - cover
            room = node_limits.dispatch_batch_max - in_flight
            for i, r in enumerate(q):
                if free >= room or need >= most:
                    break
                if r.in_flight or r.gone():
                    continue
                n = wants[i] if i < len(wants) else r.n
                free += 1
                need += n
                last = n
            if not free:
                continue  # all in flight or gone: an acquire's end looks again
            # What the acquires in flight will take is not there for more: counted, then
            # subtracted. Of their share, the entries the group's counts found from the head, all
            # runs its workers can take, are passed over unread (each entry read is a run and a
            # job looked up: under load every run was read about twice, once as part of the share
            # in flight); the count reads on from there. Passed over, entries of another
            # placement that fell due meanwhile count too: an acquire that then grants nothing
            # makes the group count from the head again (_serve).
            skip = min(cover, self._known.get(key, 0))
            limit = min(want - skip, need - last + 1 + cover - skip)
            found, clean = self.raft.read(queries.ready_scan, head.queues, head.labels, types, ready_ms,
                                          node_limits.dispatch_ready_scan_max, limit, head.dedicated,
                                          None if head.tenants is None else frozenset(head.tenants),
                                          head.targets, skip)
            self._known[key] = skip + found if clean else 0
            count = max(0, skip + found - cover)
            if not count and not in_flight and mono - self._last_try.setdefault(key, mono) >= node_limits.dispatch_retry_s:
                # Ready work beyond the scan, maybe: acquire looks further, now and then.
                count = int(self.raft.read(queries.has_ready_work, head.queues, ready_ms))
            if not count:
                self._quiet.add(key)
                nxt = self.raft.read(queries.next_due_ms, head.queues)
                if nxt is not None and nxt + grace > now_ms:
                    timeout = min(timeout, (nxt + grace - now_ms) / 1000)
                    self._next_due_ms = min(self._next_due_ms, nxt + grace)
                continue
            picked, covered = [], 0
            for r in q:
                if r.gone() or r.in_flight:
                    continue
                picked.append(r)
                covered += r.n
                if covered >= count or in_flight + len(picked) >= node_limits.dispatch_batch_max:
                    break
            if not picked:
                continue
            self._busy[key] = in_flight + len(picked)
            self._cover[key] = self._cover.get(key, 0) + covered
            self._last_try[key] = mono
            for r in picked:
                r.in_flight = True
                t = asyncio.create_task(self._serve(key, r), name="dispatch acquire")
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
        return max(0.001, timeout)

    async def _serve(self, key: tuple, req: LeaseRequest) -> None:
        """One acquire for ``req``; answer it, or give its runs back if nobody waits for them
        any more."""
        q = self._groups.get(key)
        try:
            # I23: with tenants, only these tenants' runs (core/leases.py)
            cmd = commands.acquire(self.clock.now_ms(), worker=req.worker, queues=req.queues, max=req.n,
                                   ttl=req.ttl_ms, types=req.types, tenants=req.tenants, by=self.by)
            self.acquires += 1
            try:
                res = await self._propose(cmd)
            except RaftschedError as e:
                if not req.abandoned:
                    self._answer(q, req, [], False, e)
                else:
                    self._drop(q, req)
                self._backoff[key] = self.clock.monotonic_s() + node_limits.dispatch_empty_backoff_s
                return
            grants, draining = res.get("runs", []), bool(res.get("draining"))
            if not grants:
                self.acquires_empty += 1
                self._known.pop(key, None)  # its count may have passed over runs it cannot take
                self._backoff[key] = self.clock.monotonic_s() + node_limits.dispatch_empty_backoff_s
            if req.abandoned:
                self._drop(q, req)
                if grants:
                    self.given_back += len(grants)
                    await self._release(req.worker, grants, "its lease request was no longer waited for")
            elif grants or draining:
                self._answer(q, req, grants, draining, None)
            else:
                req.in_flight = False  # nothing for it: it waits on, in its place
        finally:
            left = self._busy.get(key, 1) - 1
            if left > 0:
                self._busy[key] = left
                self._cover[key] = max(0, self._cover.get(key, 0) - req.n)
            else:
                self._busy.pop(key, None)
                self._cover.pop(key, None)
            if key in self._known:  # the runs it took were at the head (or were never counted)
                self._known[key] = max(0, self._known[key] - req.n)
            self._dirty = True
            self._wake.set()

    def _answer_drained(self) -> None:
        """Answer ``draining`` at once to the waiting requests of workers drained since they came:
        a drain reaches an idle worker now, not at the end of its wait (up to lease_wait_s_max).
        A request with an acquire in flight hears it from the acquire's answer."""
        ids = {r.worker for q in self._groups.values() for r in q if not r.gone() and not r.in_flight}
        if not ids:
            return
        drained = self.raft.read(queries.draining_among, ids)
        if not drained:
            return
        for q in list(self._groups.values()):
            for r in [r for r in q if r.worker in drained and not r.gone() and not r.in_flight]:
                self._answer(q, r, [], True, None)

    def _answer(self, q, req: LeaseRequest, grants: list[dict], draining: bool, error) -> None:
        req.grants, req.draining, req.error = grants, draining, error
        req.in_flight = False
        self.waiting -= 1
        req.done.set()
        self._unlink(q, req)

    def _drop(self, q, req: LeaseRequest) -> None:
        req.in_flight = False
        self.waiting -= 1  # abandoned while in flight: counted out now
        self._unlink(q, req)

    @staticmethod
    def _unlink(q, req: LeaseRequest) -> None:
        if q is not None:
            try:
                q.remove(req)
            except ValueError:
                pass
