"""What this replica applied, counted as it applies, for the node's metrics (node/metrics.py).

Kept beside the state (``SchedulerState.stats``), never in a snapshot, never read by apply: it
changes no result, so replicas stay identical whatever it holds. A scrape reads these counters
and buckets, so it costs the same with 10 jobs or 1M (no walk of the runs). Each replica counts
the commands it applied since its process started (Prometheus counters: they restart at zero),
but the ones it applies again at its start of what the process before it had applied and
counted (its log after its dump, up to the commit index it had written: ``SchedulerState.replaying``).

- ``finished``: runs that ended, by state (``succeeded``, ``failed``, ``dead``).
- ``deadlines``: deadlines judged ``missed`` (with the cause) or ``late`` (deadlines.py).
- ``held_back``: events a route's ``repeat_every_s`` did not send, by kind (events.route).
- ``given_up``: events put in a sink's dead list, by sink (notify.apply_sink_progress).
- ``recorded``: slots that did not become runs, by ``(state, reason)`` (``skipped`` / ``coalesced``;
  ``misfire``, ``overlap``, ``queue_full``, ``paused``, ...), counted in slots (a record may stand
  for a range of them).
- ``slot_to_start`` / ``slot_to_completion``: for scheduled runs, from the slot to the first
  attempt's lease (the command's ``now``: the proposer's clock), and from the slot to the end of
  the attempt that succeeded; in ms, into fixed buckets.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

#: Bucket bounds (ms) of the slot -> start and slot -> completion histograms: from a run leased
#: in the slot's tick to one that waited an hour in its queue.
SLOT_BOUNDS_MS: tuple[int, ...] = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000,
                                   300_000, 900_000, 3_600_000)


class Buckets:
    """A histogram in ms: ``counts[i]`` observations at most ``bounds[i]`` and above the bound
    before (the last: above every bound), and their sum."""

    def __init__(self, bounds_ms: tuple[int, ...]) -> None:
        self.bounds_ms = bounds_ms
        self.counts = [0] * (len(bounds_ms) + 1)
        self.sum_ms = 0

    def observe(self, ms: int) -> None:
        if ms < 0:
            ms = 0
        self.counts[bisect_left(self.bounds_ms, ms)] += 1
        self.sum_ms += ms


class ApplyStats:
    """The counters above (see the module's doc)."""

    def __init__(self) -> None:
        self.recorded: dict[tuple[str, str], int] = {}
        #: runs that ended, by state: succeeded, failed (revoked), dead
        self.finished: dict[str, int] = {}
        #: deadlines judged missed or late (deadlines.py), by (outcome, which deadline, cause)
        self.deadlines: dict[tuple[str, str, str], int] = {}
        self.slot_to_start = Buckets(SLOT_BOUNDS_MS)
        self.slot_to_completion = Buckets(SLOT_BOUNDS_MS)
        #: events a route's repeat_every_s held back (not sent to that sink), by kind
        self.held_back: dict[str, int] = {}
        #: events given up on (put in the sink's dead list, which is bounded), by sink
        self.given_up: dict[str, int] = {}
        #: times a worker's state may have become ``draining``: a drain applied, or a restore
        #: (which may bring drains). A node's dispatcher answers its waiting lease requests of
        #: drained workers when it moves (node/dispatch.py), not at the end of their wait.
        self.drains = 0

    def on_entry(self, entry: dict[str, Any]) -> None:
        """A run or a record entered a job's history (fire.add_entry)."""
        state = entry.get("state")
        if state == "skipped" or state == "coalesced":
            count = entry.get("count")
            self.on_recorded(state, entry.get("reason"), count if isinstance(count, int) else 1)

    def on_recorded(self, state: str, reason: Any, slots: int = 1) -> None:
        """``slots`` slots ended as ``state`` for ``reason`` (a record, or a queued run skipped)."""
        key = (state, reason if isinstance(reason, str) else "unknown")
        self.recorded[key] = self.recorded.get(key, 0) + slots

    def on_start(self, run: dict[str, Any], now: int) -> None:
        """A run was leased (leases._grant): its first attempt's start, for a scheduled run."""
        _observe_runs(self.slot_to_start, (run,), now, first_only=True)

    def on_starts(self, runs: Sequence[dict[str, Any]], now: int) -> None:
        """on_start of each of ``runs``, leased by one command at ``now``."""
        _observe_runs(self.slot_to_start, runs, now, first_only=True)

    def on_successes(self, runs: Sequence[dict[str, Any]], now: int) -> None:
        """on_success of each of ``runs``, completed by one command at ``now``."""
        finished = self.finished
        finished["succeeded"] = finished.get("succeeded", 0) + len(runs)
        _observe_runs(self.slot_to_completion, runs, now, first_only=False)

    def on_deadline(self, outcome: Any, which: Any, cause: Any) -> None:
        """A deadline was judged ``missed`` (``cause``: never_started, still_running, failed, upstream,
        skipped, paused, untracked, no_slot) or ``late`` (no cause), for ``which`` deadline."""
        key = (str(outcome), which if isinstance(which, str) else "unknown",
               cause if isinstance(cause, str) else "none")
        self.deadlines[key] = self.deadlines.get(key, 0) + 1

    def on_held_back(self, kind: str) -> None:
        """An event of ``kind`` was not sent to one of its routes' sinks: the route's
        ``repeat_every_s`` had sent one of that kind of the job within it (events._quiet_enough)."""
        self.held_back[kind] = self.held_back.get(kind, 0) + 1

    def on_given_up(self, sink: str, n: int) -> None:
        """``n`` events of ``sink`` went to its dead list (notify.apply_sink_progress)."""
        self.given_up[sink] = self.given_up.get(sink, 0) + n

    def on_finished(self, state: str) -> None:
        """A run ended ``state`` (failed, dead; a worker's success is on_success's, a heartbeat
        job's pinged one this)."""
        self.finished[state] = self.finished.get(state, 0) + 1

    def on_success(self, run: dict[str, Any], now: int) -> None:
        """A run's attempt succeeded (leases.close_attempt): the run is complete."""
        self.on_successes((run,), now)


def _observe_runs(b: Buckets, runs: Sequence[dict[str, Any]], now: int, first_only: bool) -> None:
    """Observe ``now - slot`` in ``b`` for each scheduled run of ``runs`` (with ``first_only``,
    those on their first attempt), as on_start / on_success do a run: the runs of one command
    mostly share their slot, so a slot's bucket is found once for the runs after it."""
    counts, bounds = b.counts, b.bounds_ms
    last, i, total = None, 0, 0
    for run in runs:
        if run.get("kind") == "scheduled" and not (first_only and run.get("attempts")):
            slot = run.get("slot")
            if isinstance(slot, int):
                ms = now - slot
                if ms < 0:
                    ms = 0
                if slot != last:
                    last, i = slot, bisect_left(bounds, ms)
                counts[i] += 1
                total += ms
    b.sum_ms += total
