"""The acquire index of one queue's priority: its queued runs by (due, run id), ready once due.

It hands entries out in the order a heap of ``(due, run id)`` tuples did, and holds what that
heap held (stale entries included: queues.py), so every replica decides what it decided. The
layout differs: a heap of the distinct dues, and per due its run id (a due of one run, as
staggered interval jobs' are: no list made) or a list of its run ids (a bucket) kept sorted
from the largest to the smallest, so that the next id is the list's last. Thousands of
runs share a due (every job on ``every_s: 1`` or ``0 * * * *`` falls due at the same
millisecond), and a heap of tuples compared each pop's dozen or more pairs by their ids' strings,
three objects a side scattered in memory: the acquire's heap pop was the largest single line of
the nodes' CPU in ``scripts/bench.py --only fleet_e2e`` (~6 %), ~3.5 µs a pop beside other work
against ~0.5 µs here (docs/benchmarks.md). An entry of a shared due is one pointer in its list
instead of a tuple (and its own integer, decoded from the command).

A list is sorted when first read after entries were added out of order (``_unsorted``), so a
fire's thousands of runs of one due cost one sort, and entries put back in the reverse of the
order they were taken (an acquire's held-back runs) keep it sorted. A list of more than
``limits.ready_sort_max`` ids (a storm's) is a heap of its ids instead (``_heaped``): sorting a
million in one apply would hold the Raft thread for about a second.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterator, TypeAlias

from . import limits

#: A copy of an index for a walk outside the replica's lock: due -> its run id, or its run ids.
Buckets: TypeAlias = "dict[int, str | list[str]]"


class ReadyIndex:
    """Entries ``(due, run id)`` with the min-heap's operations: ``push``, ``head``, ``pop``,
    ``len``; iteration yields every entry (in no particular order)."""

    __slots__ = ("_dues", "_buckets", "_multi", "_unsorted", "_heaped", "_n")

    #: the most run ids a due's list sorts at once (limits.ready_sort_max; tests lower it)
    sort_max = limits.ready_sort_max

    def __init__(self) -> None:
        #: the distinct dues of the entries, a min-heap (each once)
        self._dues: list[int] = []
        #: due -> the run id of that due (one entry: a string, no list made), or the run ids of
        #: that due (a list: largest first unless the due is in _unsorted or _heaped)
        self._buckets: dict[int, str | list[str]] = {}
        #: the dues whose bucket is a list
        self._multi: set[int] = set()
        #: dues whose list may be out of order
        self._unsorted: set[int] = set()
        #: dues whose list is a min-heap (it held more than sort_max; it holds at least half of it)
        self._heaped: set[int] = set()
        self._n = 0

    def push(self, due: int, rid: str) -> None:
        b = self._buckets.get(due)
        if b is None:
            self._buckets[due] = rid
            heapq.heappush(self._dues, due)
        elif type(b) is str:
            self._buckets[due] = [b, rid] if rid <= b else [rid, b]
            self._multi.add(due)
        elif len(b) >= self.sort_max >> 1:
            self.push_large(due, b, rid)  # type: ignore[arg-type]
        else:
            if rid > b[-1]:
                self._unsorted.add(due)
            b.append(rid)  # type: ignore[union-attr]
        self._n += 1

    def push_large(self, due: int, b: list[str], rid: str) -> None:
        """``push`` of ``rid`` into ``due``'s list ``b`` of sort_max / 2 or more (fire.py calls it
        too, and counts ``_n`` itself): into the heap, or appended, and the list made a heap when
        it grows past sort_max."""
        if due in self._heaped:
            heapq.heappush(b, rid)
            return
        if rid > b[-1]:
            self._unsorted.add(due)
        b.append(rid)
        if len(b) > self.sort_max:
            if due in self._unsorted:
                heapq.heapify(b)
                self._unsorted.discard(due)
            else:
                b.reverse()  # (largest first: reversed, a min-heap)
            self._heaped.add(due)

    def _first(self, due: int, b: list[str]) -> str:
        """The smallest of ``due``'s list ``b`` (sorted first when it is not known sorted)."""
        if due in self._heaped:
            return b[0]
        if due in self._unsorted:
            b.sort(reverse=True)
            self._unsorted.discard(due)
        return b[-1]

    def head(self) -> tuple[int, str] | None:
        """The smallest entry, or None when empty (a heap's ``h[0]``)."""
        if not self._n:
            return None
        due = self._dues[0]
        b = self._buckets[due]
        return due, (b if type(b) is str else self._first(due, b))  # type: ignore[arg-type]

    def peek(self) -> tuple[int, str] | None:
        """``head`` for a read: the same entry, and the index left as it was."""
        if not self._n:
            return None
        due = self._dues[0]
        b = self._buckets[due]
        if type(b) is str:
            return due, b
        if due in self._heaped:
            return due, b[0]
        return due, (min(b) if due in self._unsorted else b[-1])

    def head_due(self) -> int | None:
        """The smallest entry's due, or None when empty (``h[0][0]``)."""
        return self._dues[0] if self._n else None

    def pop(self) -> tuple[int, str]:
        """Take the smallest entry. :raises IndexError: when empty."""
        if not self._n:
            raise IndexError("pop from an empty ReadyIndex")
        self._n -= 1
        due = self._dues[0]
        b = self._buckets[due]
        if type(b) is str:
            del self._buckets[due]
            heapq.heappop(self._dues)
            return due, b
        if due in self._heaped:
            rid = heapq.heappop(b)  # type: ignore[arg-type]
            if len(b) < self.sort_max >> 1:
                b.sort(reverse=True)  # type: ignore[union-attr]  # (a few thousand: a list again)
                self._heaped.discard(due)
        else:
            if due in self._unsorted:
                b.sort(reverse=True)  # type: ignore[union-attr]
                self._unsorted.discard(due)
            rid = b.pop()  # type: ignore[union-attr]
        if not b:
            del self._buckets[due]
            self._multi.discard(due)
            self._heaped.discard(due)
            heapq.heappop(self._dues)
        return due, rid

    def pop_due_by(self, now: int) -> tuple[int, str] | None:
        """Take the smallest entry if its due is at or before ``now``, else None."""
        if not self._n or self._dues[0] > now:
            return None
        return self.pop()

    def peek_due_by(self, now: int, k: int) -> tuple[int, list[str]] | None:
        """The smallest due and its first run ids, in the order pops take them, if that due has
        come by ``now`` (else None): up to ``k`` (k >= 1) of a sorted list, one of a heap (a
        storm's: its order is not a slice). Nothing is taken: ``drop_first`` takes them, once
        they are looked at. An acquire reads a request's runs this way (core/leases.py): a slice
        of a sorted list in C, where a pop a run was two method calls."""
        if k < 1:
            raise ValueError("k must be >= 1")
        if not self._n or self._dues[0] > now:
            return None
        due = self._dues[0]
        b = self._buckets[due]
        if type(b) is str:
            return due, [b]
        lst: list[str] = b  # type: ignore[assignment]
        if due in self._heaped:
            return due, [lst[0]]
        if due in self._unsorted:
            lst.sort(reverse=True)  # (as the first pop would)
            self._unsorted.discard(due)
        rids = lst[-k:]  # (largest first: the smallest k, reversed)
        rids.reverse()
        return due, rids

    def drop_first(self, due: int, j: int) -> None:
        """Take the first ``j`` entries of ``due``, the smallest due (those ``peek_due_by`` gave
        last, or fewer): the index is left as ``j`` pops leave it. ``j`` = 0 takes nothing."""
        if j <= 0:
            return
        b = self._buckets[due]
        self._n -= j
        if type(b) is str:
            if j != 1:
                raise ValueError(f"a due of one entry has no {j} to take")
            b = ""
        elif due in self._heaped:
            pop = heapq.heappop
            for _ in range(j):
                pop(b)  # type: ignore[arg-type]
            if len(b) < self.sort_max >> 1:
                b.sort(reverse=True)  # type: ignore[union-attr]  # (as pop does)
                self._heaped.discard(due)
        else:
            del b[-j:]  # type: ignore[union-attr]
        if not b:
            del self._buckets[due]
            self._multi.discard(due)
            self._heaped.discard(due)
            heapq.heappop(self._dues)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return entries_of(self._buckets)

    def __contains__(self, entry: object) -> bool:
        if not isinstance(entry, tuple) or len(entry) != 2:
            return False
        b = self._buckets.get(entry[0])
        return b is not None and (b == entry[1] if type(b) is str else entry[1] in b)

    def __eq__(self, other: object) -> bool:
        """The same entries, as many times each (their layout aside)."""
        if not isinstance(other, ReadyIndex):
            return NotImplemented
        return self._n == other._n and sorted(self) == sorted(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadyIndex({sorted(self)!r})"

    def copy_buckets(self) -> Buckets:
        """Every due's entries, for a walk outside the replica's lock (``entries_of``): the map
        copied (in C: a few ms for a million dues), and each list of several run ids."""
        out = self._buckets.copy()
        for due in self._multi:
            out[due] = out[due][:]
        return out

    def ready_buckets(self, now: int) -> Iterator[tuple[int, str | list[str]]]:
        """The buckets whose due is at or before ``now`` (in no particular order), each as it is
        (a run id, or a list of them): for a read under the lock that may stop early
        (``worker_queries.ready_scan``). A list not known sorted is read as it is, so a read
        changes nothing."""
        dues, buckets, stack = self._dues, self._buckets, [0]
        while stack:
            i = stack.pop()
            if i >= len(dues) or dues[i] > now:
                continue
            stack.append(2 * i + 2)
            stack.append(2 * i + 1)
            yield dues[i], buckets[dues[i]]

    def keep_only(self, keep: Callable[[int, str], bool]) -> None:
        """Keep the entries ``keep(due, rid)`` says yes to, each run id once (queues.compact_queued)."""
        seen: set[str] = set()
        buckets: dict[int, str | list[str]] = {}
        heaped = set()
        for due, b in self._buckets.items():
            kept = []
            for rid in ((b,) if type(b) is str else b):
                if rid not in seen and keep(due, rid):
                    seen.add(rid)
                    kept.append(rid)
            if len(kept) == 1:
                buckets[due] = kept[0]
            elif kept:
                buckets[due] = kept  # (in the order it had: a sorted list stays sorted)
                if due in self._heaped:
                    if len(kept) < self.sort_max >> 1:
                        kept.sort(reverse=True)
                    else:
                        heapq.heapify(kept)
                        heaped.add(due)
        # In place, each container kept: fire.py's fast path holds them across a compaction that
        # a run it drops can cause (a pipeline's child queued in the same queue).
        multi = {d for d, b in buckets.items() if type(b) is not str}
        unsorted = {d for d in multi if d in self._unsorted}
        self._multi.clear()
        self._multi.update(multi)
        self._unsorted.clear()
        self._unsorted.update(unsorted)
        self._heaped.clear()
        self._heaped.update(heaped)
        self._buckets.clear()
        self._buckets.update(buckets)
        self._dues[:] = buckets
        heapq.heapify(self._dues)
        self._n = sum(1 if type(b) is str else len(b) for b in buckets.values())


def entries_of(buckets: Buckets) -> Iterator[tuple[int, str]]:
    """The entries of a ``copy_buckets`` copy (or of an index's own map)."""
    for due, b in buckets.items():
        if type(b) is str:
            yield due, b
        else:
            for rid in b:
                yield due, rid
