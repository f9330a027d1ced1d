"""The due index: which jobs the leader should plan next, by their next slot.

Derived and leader-only: it is not in the snapshot, and no replica's replicated state depends on
it. The trigger makes one when its node leads and hands it to the state (``attach``), and takes
it back when it stops (``detach``). Apply feeds it as it moves a job's next slot (a put, a
resume, a fire); the trigger pops the jobs that fell due (``pop_due``), plans them, and pushes
back the ones whose plan did not commit (``repush``), each through the replication adapter's
``read`` so that it runs under the lock applies take. A follower keeps none (``state.due`` is
None): it would push every fired job and never pop, rebuilding the index whenever it held twice
the jobs (measured: 2 % of a follower's time at 10k slots/s).

Two timer wheels (:class:`DueWheel`) keyed by next slot: jobs that fire ahead
(``policy.fires_ahead``) and the others. The leader pops the first up to
``limits.fire_ahead_ms`` past now, the others up to now; ``pop``'s ``ahead_ms`` defaults to 0,
which pops both by their slot.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

from .policy import fires_ahead
from .records import Record

if TYPE_CHECKING:
    from .state import SchedulerState

#: ``valid(name, gen, next)``: whether a wheel's entry still stands for its job (_validator).
Validator: TypeAlias = Callable[[str, int, int], bool]

#: Stale entries a wheel may hold beyond twice the jobs before it is rebuilt from them.
_REBUILD_SLACK = 1024


class DueWheel:
    """Jobs by next slot, a timer wheel: ``{slot_ms: [name, gen, name, gen, ...]}`` plus a heap
    of the distinct slots. Jobs that share a slot (every ``every_s: 60`` job, every ``0 * * * *``
    job) share one bucket, so a push and a pop are O(1) and the heap holds one entry per distinct
    time, not per job. A bucket is a flat list, two items a job, not a list of (name, gen)
    tuples: a tuple a job cost 64 bytes (1M jobs: 61 MiB), two list slots 16. Entries are
    checked lazily against the job (a replaced, paused, deleted or already fired job leaves a
    stale entry behind, skipped when met); the index is rebuilt when stale entries outnumber
    the jobs."""

    __slots__ = ("at", "times", "size")

    def __init__(self) -> None:
        #: slot -> [name, gen, name, gen, ...], the last job pushed last
        self.at: dict[int, list[Any]] = {}
        self.times: list[int] = []
        self.size = 0

    def push(self, slot: int, name: str, gen: int) -> None:
        bucket = self.at.get(slot)
        if bucket is None:
            self.at[slot] = [name, gen]
            heapq.heappush(self.times, slot)
        else:
            bucket.append(name)
            bucket.append(gen)
        self.size += 1

    def pop_until(self, until: int, limit: int, valid: Validator, jobs: dict[str, Record], out: list[Record],
                  seen: set[str]) -> None:
        times, at = self.times, self.at
        while times and times[0] <= until and len(out) < limit:
            t = times[0]
            bucket = at[t]
            while bucket and len(out) < limit:
                gen = bucket.pop()
                name = bucket.pop()
                self.size -= 1
                if name in seen or not valid(name, gen, t):
                    continue
                seen.add(name)
                out.append(jobs[name])
            if not bucket:
                heapq.heappop(times)
                del at[t]

    def reindex(self) -> None:
        """Make the heap of times and the size from the buckets, once they were filled directly
        (DueIndex.rebuild: pushing job by job kept a heap of times that was then rebuilt anyway)."""
        self.times = list(self.at)
        heapq.heapify(self.times)
        self.size = sum(map(len, self.at.values())) // 2

    def peek(self, valid: Validator) -> int | None:
        times, at = self.times, self.at
        while times:
            t = times[0]
            bucket = at[t]
            while bucket and not valid(bucket[-2], bucket[-1], t):
                del bucket[-2:]
                self.size -= 1
            if bucket:
                return t
            heapq.heappop(times)
            del at[t]
        return None


def _validator(jobs: dict[str, Record]) -> Validator:
    """``valid(name, gen, next)``: whether an entry still stands for its job's next slot."""
    def valid(name: str, gen: int, nxt: int) -> bool:
        job = jobs.get(name)
        return job is not None and job["gen"] == gen and job["next"] == nxt and not job["paused"]
    return valid


class DueIndex:
    """The two wheels of the due index. Every method that can look at jobs is given the state's
    job map (``jobs``): a restore replaces that map, never this object."""

    __slots__ = ("now", "ahead")

    def __init__(self) -> None:
        #: jobs that are planned when their slot comes
        self.now = DueWheel()
        #: jobs that may be planned up to fire_ahead_ms before it (policy.fires_ahead)
        self.ahead = DueWheel()

    def clear(self) -> None:
        self.now, self.ahead = DueWheel(), DueWheel()

    def push(self, job: Record, jobs: dict[str, Record]) -> None:
        """Index ``job`` at its next slot (apply calls this whenever it moves one)."""
        nxt = job["next"]
        if nxt is not None and not job["paused"]:
            wheel = self.ahead if fires_ahead(job["spec"]) else self.now
            wheel.push(nxt, job["name"], job["gen"])
            if wheel.size > 2 * len(jobs) + _REBUILD_SLACK:
                self.rebuild(jobs)

    def rebuild_bound(self, jobs: dict[str, Record]) -> int:
        """The wheel size past which push rebuilds (fire's fast path checks it inline)."""
        return 2 * len(jobs) + _REBUILD_SLACK

    def rebuild(self, jobs: dict[str, Record]) -> None:
        """Rebuild from the jobs (on restore, and on becoming leader)."""
        self.clear()
        # The buckets are filled directly and the heaps of times made once (what push does
        # job by job, in the same order), and fires_ahead is asked once per overlap object:
        # it reads only the spec's overlap, and jobs share those objects (1M jobs: ~1 s less).
        at = (self.now.at, self.ahead.at)
        ahead_of: dict[int, bool] = {}
        for n, j in jobs.items():
            nxt = j["next"]
            if nxt is None or j["paused"]:
                continue
            spec = j["spec"]
            ov = spec.get("overlap")
            ahead = ahead_of.get(id(ov))
            if ahead is None:
                ahead = ahead_of[id(ov)] = fires_ahead(spec)
            wheel = at[ahead]
            bucket = wheel.get(nxt)
            if bucket is None:
                wheel[nxt] = [n, j["gen"]]
            else:
                bucket.append(n)
                bucket.append(j["gen"])
        self.reindex()

    def reindex(self) -> None:
        """Both wheels' heaps and sizes, after their buckets were filled directly."""
        self.now.reindex()
        self.ahead.reindex()

    def pop(self, jobs: dict[str, Record], now_ms: int, limit: int, ahead_ms: int = 0) -> list[Record]:
        """Pop up to ``limit`` jobs to plan at ``now_ms``: those whose next slot is at or before
        it, and, with ``ahead_ms``, the jobs that fire ahead whose next slot is at most that much
        later. Earliest slots first within each kind.

        A popped job comes back into the index when its fire applies (or by ``repush``)."""
        out: list[Record] = []
        seen: set[str] = set()
        valid = _validator(jobs)
        self.ahead.pop_until(now_ms + ahead_ms, limit, valid, jobs, out, seen)
        self.now.pop_until(now_ms, limit, valid, jobs, out, seen)
        return out

    def next_ms(self, jobs: dict[str, Record], ahead_ms: int = 0) -> int | None:
        """When the leader should next plan something (see pop), or None."""
        valid = _validator(jobs)
        a = self.ahead.peek(valid)
        b = self.now.peek(valid)
        cands = ([] if a is None else [a - ahead_ms]) + ([] if b is None else [b])
        return min(cands) if cands else None

    def repush(self, jobs: dict[str, Record], names: Iterable[str]) -> None:
        """Index again the jobs ``names`` whose plans did not commit."""
        for n in names:
            job = jobs.get(n)
            if job is not None:
                self.push(job, jobs)


def push_due(s: SchedulerState, job: Record) -> None:
    """Apply's feed: index ``job`` at its next slot when the state has a due index."""
    due = s.due
    if due is not None:
        due.push(job, s.jobs)


# The trigger's side, each ``fn(state, ...)`` for RaftNode.read. Without an attached index they
# find nothing and do nothing.

def attach(s: SchedulerState, index: DueIndex) -> None:
    """Hand ``index`` to the state (its node now leads), built from the jobs."""
    s.due = index
    index.rebuild(s.jobs)


def detach(s: SchedulerState) -> None:
    """Take the due index away (its node no longer leads): apply stops feeding it."""
    s.due = None


def pop_due(s: SchedulerState, now_ms: int, limit: int, ahead_ms: int = 0) -> list[str]:
    """The names of the jobs to plan at ``now_ms`` (DueIndex.pop), at most ``limit``."""
    due = s.due
    return [] if due is None else [j["name"] for j in due.pop(s.jobs, now_ms, limit, ahead_ms)]


def next_due_ms(s: SchedulerState, ahead_ms: int = 0) -> int | None:
    """When the trigger should next plan something (DueIndex.next_ms), or None."""
    due = s.due
    return None if due is None else due.next_ms(s.jobs, ahead_ms)


def repush(s: SchedulerState, names: Iterable[str]) -> None:
    """Index again the jobs ``names`` whose plans did not commit."""
    due = s.due
    if due is not None:
        due.repush(s.jobs, names)
