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

A storm (many slots of one second) is taken up earlier than that: each wheel counts its entries
per second (``DueWheel.per_s``), :func:`storm_seconds` says from those counts which seconds ahead
must be taken up now to be committed before they fall due at the leader's measured commit rate,
and ``pop_early`` pops those seconds (docs/design.md, "Firing ahead").
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

from .policy import fires_ahead
from .records import Record

if TYPE_CHECKING:
    from .state import SchedulerState

#: ``valid(name, gen, next)``: whether a wheel's entry still stands for its job (_validator).
Validator: TypeAlias = Callable[[str, int, int], bool]

#: Stale entries a wheel may hold beyond twice the jobs before the pushes sweep them out.
_REBUILD_SLACK = 1024

#: Entries a push past that bound looks at (DueWheel.compact): ~10 us of an apply.
_COMPACT_STEP = 32


class DueWheel:
    """Jobs by next slot, a timer wheel: ``{slot_ms: [name, gen, name, gen, ...]}`` plus a heap
    of the distinct slots. Jobs that share a slot (every ``every_s: 60`` job, every ``0 * * * *``
    job) share one bucket, so a push and a pop are O(1) and the heap holds one entry per distinct
    time, not per job. A bucket is a flat list, two items a job, not a list of (name, gen)
    tuples: a tuple a job cost 64 bytes (1M jobs: 61 MiB), two list slots 16. Entries are
    checked lazily against the job (a replaced, paused, deleted or already fired job leaves a
    stale entry behind, skipped when met); when stale entries outnumber the jobs, the pushes
    that follow sweep them out a few at a time (``compact``), never all in one apply."""

    __slots__ = ("at", "times", "size", "per_s", "_sweep", "_cur", "_pos", "_kept", "_keys")

    def __init__(self) -> None:
        #: slot -> [name, gen, name, gen, ...], the last job pushed last
        self.at: dict[int, list[Any]] = {}
        self.times: list[int] = []
        self.size = 0
        #: slot // 1000 -> entries in the buckets of that second (stale ones too, until met): what
        #: the leader sizes a storm by without walking the jobs (storm_seconds)
        self.per_s: dict[int, int] = {}
        #: the sweep under way (compact): the times of the buckets still to sweep, the bucket
        #: being swept (None: none) and how far, its entries kept so far and their (name, gen)
        self._sweep: list[int] | None = None
        self._cur: int | None = None
        self._pos = 0
        self._kept: list[Any] = []
        self._keys: dict[str, int] = {}

    def push(self, slot: int, name: str, gen: int) -> None:
        bucket = self.at.get(slot)
        if bucket is None:
            self.at[slot] = [name, gen]
            heapq.heappush(self.times, slot)
        else:
            bucket.append(name)  # (an empty bucket is one pop_second emptied; its time is still in the heap)
            bucket.append(gen)
        self.size += 1
        sec = slot // 1000
        self.per_s[sec] = self.per_s.get(sec, 0) + 1

    def _uncount(self, slot: int, n: int) -> None:
        sec = slot // 1000
        left = self.per_s.get(sec, 0) - n
        if left > 0:
            self.per_s[sec] = left
        else:
            self.per_s.pop(sec, None)

    def pop_until(self, until: int, limit: int, valid: Validator, jobs: dict[str, Record], out: list[Record],
                  seen: set[str]) -> None:
        times, at = self.times, self.at
        while times and times[0] <= until and len(out) < limit:
            t = times[0]
            bucket = at[t]
            self._take(t, bucket, limit, valid, jobs, out, seen)
            if not bucket:
                heapq.heappop(times)
                del at[t]

    def pop_second(self, sec: int, limit: int, valid: Validator, jobs: dict[str, Record], out: list[Record],
                   seen: set[str]) -> None:
        """Pop up to ``limit`` jobs in all of ``out`` whose slot falls in second ``sec`` (a storm
        taken up early), earliest slot first. An emptied bucket stays (empty) until the heap of
        times reaches it, as pop_until and peek expect. Looks at the second's 1000 possible
        slots only when the second is counted."""
        if not self.per_s.get(sec):
            return
        at = self.at
        for t in range(sec * 1000, sec * 1000 + 1000):
            if len(out) >= limit:
                return
            bucket = at.get(t)
            if bucket:
                self._take(t, bucket, limit, valid, jobs, out, seen)

    def _take(self, t: int, bucket: list[Any], limit: int, valid: Validator, jobs: dict[str, Record],
              out: list[Record], seen: set[str]) -> None:
        """Pop the jobs of slot time ``t``'s bucket into ``out`` (the valid ones not ``seen``),
        until it is empty or ``out`` holds ``limit``; its count goes down by what was popped."""
        if t == self._cur:
            self._cur = None  # a bucket being taken is not swept on (compact)
        before = len(bucket)
        while bucket and len(out) < limit:
            gen = bucket.pop()
            name = bucket.pop()
            self.size -= 1
            if name in seen or not valid(name, gen, t):
                continue
            seen.add(name)
            out.append(jobs[name])
        if before != len(bucket):
            self._uncount(t, (before - len(bucket)) // 2)

    def reindex(self) -> None:
        """Make the heap of times and the size from the buckets, once they were filled directly
        (DueIndex.rebuild: pushing job by job kept a heap of times that was then rebuilt anyway)."""
        self.times = list(self.at)
        heapq.heapify(self.times)
        self.size = sum(map(len, self.at.values())) // 2
        per_s: dict[int, int] = {}
        for t, bucket in self.at.items():
            sec = t // 1000
            per_s[sec] = per_s.get(sec, 0) + len(bucket) // 2
        self.per_s = per_s

    def compact(self, valid: Validator, budget: int) -> None:
        """Sweep stale entries out, about ``budget`` entries looked at (a bucket that is gone
        counts one): a step of a sweep of every bucket, begun if none is under way. The index
        calls it on each push while the wheel holds more than twice its jobs (and a slack), so
        a sweep ends before the wheel has grown by about a ``budget``-th of what it sweeps (it
        reads what is pushed behind it too), and no push looks at more than ``budget`` entries
        (the step that ends a bucket also frees what it dropped: 70-80 ms for one bucket of 2M
        entries): rebuilding the wheel from the jobs in the apply that crossed the bound took
        0.44-0.66 s at 1M jobs, a stalled leader.

        An entry stays when ``valid`` says it still stands for its job, once per (name, gen):
        what a rebuild from the jobs would leave of it, judged when the sweep gets to it (an
        entry that goes stale later is skipped when met, as always; a job that becomes due
        again is pushed again by apply). Entries pushed while its bucket is swept are looked at
        too. A bucket a pop takes from meanwhile is left as it is (_take, peek): its time has
        come, and what it holds goes with it."""
        if self._sweep is None:
            self._sweep = list(self.at)
        at = self.at
        while budget > 0:
            t = self._cur
            if t is None:
                if not self._sweep:
                    self._sweep = None
                    return
                t = self._sweep.pop()
                if t not in at:
                    budget -= 1
                    continue
                self._cur, self._pos, self._kept, self._keys = t, 0, [], {}
            bucket = at.get(t)
            if bucket is None:  # gone (a pop took it whole; _take already ends its sweep)
                self._cur = None
                continue
            pos, kept, keys = self._pos, self._kept, self._keys
            end = min(len(bucket), pos + 2 * budget)
            for i in range(pos, end, 2):
                name, gen = bucket[i], bucket[i + 1]
                if keys.get(name) != gen and valid(name, gen, t):
                    keys[name] = gen
                    kept.append(name)
                    kept.append(gen)
            budget -= max(1, (end - pos) // 2)
            self._pos = end
            if end >= len(bucket):
                dropped = (len(bucket) - len(kept)) // 2
                if dropped:
                    at[t] = kept
                    self.size -= dropped
                    self._uncount(t, dropped)
                self._cur, self._kept, self._keys = None, [], {}

    def sweeping(self) -> bool:
        """Whether a sweep (compact) is under way."""
        return self._sweep is not None

    def peek(self, valid: Validator) -> int | None:
        times, at = self.times, self.at
        while times:
            t = times[0]
            bucket = at[t]
            if t == self._cur and bucket and not valid(bucket[-2], bucket[-1], t):
                self._cur = None  # (as _take)
            while bucket and not valid(bucket[-2], bucket[-1], t):
                del bucket[-2:]
                self.size -= 1
                self._uncount(t, 1)
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

    __slots__ = ("now", "ahead", "filling")

    def __init__(self) -> None:
        #: jobs that are planned when their slot comes
        self.now = DueWheel()
        #: jobs that may be planned up to fire_ahead_ms before it (policy.fires_ahead)
        self.ahead = DueWheel()
        #: while the trigger fills the index in steps (attach_empty, fill, filled): the names of
        #: the jobs apply pushed meanwhile, which the fill passes over (their entries are
        #: current); None otherwise
        self.filling: set[str] | None = None

    def clear(self) -> None:
        self.now, self.ahead = DueWheel(), DueWheel()
        self.filling = None  # (a restore's rebuild indexes every job: a fill under way stops)

    def push(self, job: Record, jobs: dict[str, Record]) -> None:
        """Index ``job`` at its next slot (apply calls this whenever it moves one)."""
        nxt = job["next"]
        if nxt is not None and not job["paused"]:
            wheel = self.ahead if fires_ahead(job["spec"]) else self.now
            wheel.push(nxt, job["name"], job["gen"])
            if self.filling is not None:
                self.filling.add(job["name"])
            if wheel.size > 2 * len(jobs) + _REBUILD_SLACK:
                wheel.compact(_validator(jobs), _COMPACT_STEP)

    def compact_bound(self, jobs: dict[str, Record]) -> int:
        """The wheel size past which a push sweeps (fire's fast path checks it inline)."""
        return 2 * len(jobs) + _REBUILD_SLACK

    def compact(self, wheel: DueWheel, jobs: dict[str, Record]) -> None:
        """A step of ``wheel``'s sweep (DueWheel.compact), as push takes one past the bound."""
        wheel.compact(_validator(jobs), _COMPACT_STEP)

    def fill(self, records: Iterable[Record]) -> None:
        """Index the jobs ``records`` as they are now, but those apply pushed since the fill
        began (``filling``), as rebuild would: one step of a fill (module function fill). A
        record apply has since replaced with a plannable one was pushed (so passed over); one it
        replaced with an unplannable one, or deleted, leaves an entry that no longer stands for
        its job (another gen, or none), skipped when met, as a delete leaves one. Taking the
        records, not looking each name up, makes a 1M-job fill ~0.4 s shorter
        (docs/benchmarks.md)."""
        pushed = self.filling or ()
        wheels = (self.now, self.ahead)
        ahead_of: dict[int, bool] = {}
        last_ov: object = ahead_of  # (no overlap part is this object)
        last_ahead = False
        # What DueWheel.push does job by job, its counts added once at the end (as rebuild),
        # counted by runs of jobs of one second (jobs registered together share theirs).
        counts: tuple[dict[int, int], dict[int, int]] = ({}, {})
        run_sec, run_ahead, run = 0, False, 0
        for j in records:
            n = j["name"]  # (the job map's key: pop_due answers with it too)
            if n in pushed:
                continue
            nxt = j["next"]
            if nxt is None or j["paused"]:
                continue
            spec = j["spec"]
            ov = spec.get("overlap")
            if ov is last_ov:
                ahead = last_ahead
            else:
                known = ahead_of.get(id(ov))
                ahead = ahead_of[id(ov)] = fires_ahead(spec) if known is None else known
                last_ov, last_ahead = ov, ahead
            wheel = wheels[ahead]
            bucket = wheel.at.get(nxt)
            if bucket is None:
                wheel.at[nxt] = [n, j["gen"]]
                heapq.heappush(wheel.times, nxt)
            else:  # (an empty bucket is one pop_second emptied: its time is still in the heap)
                bucket.append(n)
                bucket.append(j["gen"])
            sec = nxt // 1000
            if sec == run_sec and ahead == run_ahead:
                run += 1
            else:
                if run:
                    c = counts[run_ahead]
                    c[run_sec] = c.get(run_sec, 0) + run
                run_sec, run_ahead, run = sec, ahead, 1
        if run:
            c = counts[run_ahead]
            c[run_sec] = c.get(run_sec, 0) + run
        for wheel, c in zip(wheels, counts):
            per_s = wheel.per_s
            for sec, k in c.items():
                per_s[sec] = per_s.get(sec, 0) + k
                wheel.size += k

    def rebuild(self, jobs: dict[str, Record]) -> None:
        """Rebuild from the jobs, in one go (on restore; attach)."""
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
        later. Earliest slots first within each kind; the jobs due now of both kinds before any
        not yet due (a storm taken up ahead never holds back a job due now).

        A popped job comes back into the index when its fire applies (or by ``repush``)."""
        out: list[Record] = []
        seen: set[str] = set()
        valid = _validator(jobs)
        self.ahead.pop_until(now_ms, limit, valid, jobs, out, seen)
        self.now.pop_until(now_ms, limit, valid, jobs, out, seen)
        if ahead_ms > 0:
            self.ahead.pop_until(now_ms + ahead_ms, limit, valid, jobs, out, seen)
        return out

    def next_ms(self, jobs: dict[str, Record], ahead_ms: int = 0) -> int | None:
        """When the leader should next plan something (see pop), or None."""
        valid = _validator(jobs)
        a = self.ahead.peek(valid)
        b = self.now.peek(valid)
        cands = ([] if a is None else [a - ahead_ms]) + ([] if b is None else [b])
        return min(cands) if cands else None

    def counts_ahead(self, now_ms: int, span_ms: int) -> list[tuple[int, int]]:
        """``[(second_ms, entries)]`` of the jobs that fire ahead, for each second from now's to
        ``span_ms`` past now that holds any, in order: one dict look-up a second, never a walk of
        the jobs. Counts stale entries too until they are met (an overestimate: a storm is taken
        up a little early, never late)."""
        per_s = self.ahead.per_s
        out = []
        for sec in range(now_ms // 1000, (now_ms + span_ms) // 1000 + 1):
            n = per_s.get(sec)
            if n:
                out.append((sec * 1000, n))
        return out

    def pop_early(self, jobs: dict[str, Record], seconds: Iterable[int], limit: int) -> list[tuple[int, list[Record]]]:
        """Pop up to ``limit`` jobs that fire ahead from the seconds ``seconds`` (their first
        milliseconds, ascending: storm_seconds), ``[(second_ms, [job, ...])]``."""
        out: list[tuple[int, list[Record]]] = []
        seen: set[str] = set()
        valid = _validator(jobs)
        n = 0
        for sec_ms in seconds:
            if n >= limit:
                break
            got: list[Record] = []
            self.ahead.pop_second(sec_ms // 1000, limit - n, valid, jobs, got, seen)
            if got:
                out.append((sec_ms, got))
                n += len(got)
        return out

    def repush(self, jobs: dict[str, Record], names: Iterable[str]) -> None:
        """Index again the jobs ``names`` whose plans did not commit."""
        for n in names:
            job = jobs.get(n)
            if job is not None:
                self.push(job, jobs)


def storm_seconds(counts: Iterable[tuple[int, int]], now_ms: int, rate_per_s: float, base_ms: int, max_ms: int,
                  max_slots: int, margin: float, second_min: int, slack_ms: int = 0,
                  started: Collection[int] = (), size_rate_per_s: float | None = None,
                  steady_load: float = 0.0) -> list[int]:
    """The seconds ahead (their first milliseconds, ascending) whose jobs the leader must take
    up now so that, committing at ``rate_per_s`` slowed by ``margin``, all of them are committed
    before they fall due: a pure function of the due index's counts (``counts_ahead``) and the
    leader's measured rate, no clock read.

    A second at ``t`` is taken up now when it is more than ``base_ms`` ahead (nearer ones are
    taken up anyway, as before), is a storm: holds at least ``second_min`` entries and more than
    the ordinary look-ahead commits (``margin * n / rate >= base_ms``; not the next slots of a
    steady load, such as jobs every second, which that look-ahead keeps up with and which would
    otherwise march ahead second by second; a second in ``started``, one the leader has begun to
    take up early, stays a storm however little of it is left, so that its tail is not left to the
    ordinary look-ahead; ``size_rate_per_s``, when given, is the rate this test uses instead of
    ``rate_per_s``: what the ordinary ticks measured; and more than ``steady_load`` entries: the
    trigger passes storm_load_factor times the entries of recurring jobs it planned a second
    lately, and a second within that is the next second of the load it keeps up with, not a
    storm, whatever the rates say), and
    ``t - now <= base_ms + slack_ms + margin * cum / rate``, where
    ``cum`` counts the entries from now to the end of that second (everything due by then must be
    committed by then). Bounds: no second more than ``max_ms`` ahead, and none once ``cum``
    passes ``max_slots``; what they leave out is taken up later, at the latest ``base_ms`` before
    its slot, as without a storm."""
    out: list[int] = []
    if rate_per_s <= 0:
        return out
    cum = 0
    per_entry_ms = margin * 1000.0 / rate_per_s
    size_entry_ms = per_entry_ms if not size_rate_per_s else margin * 1000.0 / size_rate_per_s
    for t, n in counts:
        cum += n
        if cum > max_slots:
            break
        ahead = t - now_ms
        if ahead > max_ms:
            break
        storm = t in started or (n >= second_min and n > steady_load and n * size_entry_ms >= base_ms)
        if ahead > base_ms and storm and ahead <= base_ms + slack_ms + cum * per_entry_ms:
            out.append(t)
    return out


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


def attach_empty(s: SchedulerState, index: DueIndex) -> list[Record]:
    """Hand an empty ``index`` to the state, to be filled in steps (``fill``, then ``filled``)
    while apply feeds it: the records of the jobs to fill it with, as they are now. ``attach``
    in one read held the lock applies take for 0.4 s at 1M jobs, the new leader's tick thread
    with it."""
    index.clear()
    index.filling = set()
    s.due = index
    return list(s.jobs.values())


def fill(s: SchedulerState, index: DueIndex, records: list[Record]) -> bool:
    """Index the jobs ``records`` (a step of attach_empty's fill). False, doing nothing, when
    ``index`` is no longer the state's or is no longer filled (a restore rebuilt it whole)."""
    if s.due is not index or index.filling is None:
        return False
    index.fill(records)
    return True


def filled(s: SchedulerState, index: DueIndex) -> None:
    """The fill is over: apply's pushes are no longer noted."""
    index.filling = None


def detach(s: SchedulerState) -> None:
    """Take the due index away (its node no longer leads): apply stops feeding it."""
    s.due = None


def pop_due(s: SchedulerState, now_ms: int, limit: int, ahead_ms: int = 0) -> list[str]:
    """The names of the jobs to plan at ``now_ms`` (DueIndex.pop), at most ``limit``."""
    due = s.due
    return [] if due is None else [j["name"] for j in due.pop(s.jobs, now_ms, limit, ahead_ms)]


def storm_due(s: SchedulerState, now_ms: int, rate_per_s: float, base_ms: int, max_ms: int, max_slots: int,
              margin: float, second_min: int, slack_ms: int = 0, started: Collection[int] = (),
              size_rate_per_s: float | None = None, steady_load: float = 0.0) -> list[int]:
    """:func:`storm_seconds` over this state's due index (none without one)."""
    due = s.due
    if due is None:
        return []
    return storm_seconds(due.counts_ahead(now_ms, max_ms), now_ms, rate_per_s, base_ms, max_ms, max_slots,
                         margin, second_min, slack_ms, started, size_rate_per_s, steady_load)


def pop_storm(s: SchedulerState, seconds: list[int], limit: int) -> list[tuple[int, list[str]]]:
    """The names of up to ``limit`` jobs of the seconds ``seconds`` (DueIndex.pop_early), by second."""
    due = s.due
    if due is None:
        return []
    return [(sec, [j["name"] for j in got]) for sec, got in due.pop_early(s.jobs, seconds, limit)]


def next_due_ms(s: SchedulerState, ahead_ms: int = 0) -> int | None:
    """When the trigger should next plan something (DueIndex.next_ms), or None."""
    due = s.due
    return None if due is None else due.next_ms(s.jobs, ahead_ms)


def repush(s: SchedulerState, names: Iterable[str]) -> None:
    """Index again the jobs ``names`` whose plans did not commit."""
    due = s.due
    if due is not None:
        due.repush(s.jobs, names)
