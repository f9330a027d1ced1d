"""The garbage collector's policy, in one place: what the node and the replication layer do to
keep collections from stalling the Raft thread on a node that holds a large state.

A full collection walks every tracked container and holds the GIL while it does, so the Raft
thread sends no heartbeat meanwhile. A node holding 1M jobs tracks ~3M containers (each job's
map, its spec, its counters, its history list), and a full collection of them takes ~1.2 s on
this machine (2 shared vCPUs): longer than the election timeout (0.5-1.0 s). CPython runs one
whenever the containers that survived younger collections outnumber a quarter of those that
survived the last full one, which happens again and again while a large state is registered or
restored; a full run of scripts/bench.py saw the leader change three times while 1M jobs were
registered, and the registration failed (docs/benchmarks.md, "What bounds 1M jobs").

Four measures, each used by one caller:

- ``set_young_threshold(gen0)`` (the node, at start): young collections less often
  (node/limits.py ``gc_gen0_threshold``).
- ``paused()`` (replication, around encoding a snapshot and around restoring one): no
  collection while millions of containers are built at once.
- ``freeze_restored()`` (replication, after a restore, before the collector runs again):
  otherwise the first young collection after it walks every restored object, 1.0-1.3 s at 1M
  jobs in a scale run.
- ``GcPauses`` and ``poll_forever`` (the node, about once a second): time every collection and
  freeze the long-lived state as it grows.

``gc.freeze()`` moves every tracked object into a permanent generation that no collection walks.
``GcPauses`` freezes:

- after a full collection that took ``freeze_pause_s`` or longer: its survivors are the
  long-lived state, and the next full collection walks only what was allocated since;
- when the replica's records (its jobs and its runs together) grew by ``freeze_growth_records``
  since the last freeze: before a full collection would have to walk them. The runs count too:
  a top-of-the-hour storm makes a run a job in a minute, and a million unfrozen runs made a full
  collection of 1.0-2.3 s on every node, three leader changes in 25 s (docs/benchmarks.md, Storm).
- when as many jobs were written (``written``: the state's put counter) since the last freeze:
  a put that replaces a job makes a new record and frees the old one, so re-putting every job
  of a large state (a deploy) grows nothing and used to freeze nothing: at 1M jobs the new
  records piled up unfrozen, full collections of 0.3-1.0 s came every 30-40 s, and the leader
  changed during the re-puts.

The numbers (the thresholds, how often the node polls) are the node's, in node/limits.py
(``gc_*``, with why each is what it is); the node passes them in. This module holds none, so the
replication layer, which uses ``paused`` and ``freeze_restored``, does not import the node.

A restore freezes what it made itself (``freeze_restored``); there a replaced job map only moves
the base the growth is counted from.

The price: an object frozen while alive that later becomes part of a garbage reference cycle is
never freed (objects freed by reference counting, which is every job and run record, are freed
as usual). Freezes happen only as the state grows (or is restored), not on a timer, so what can
leak is bounded by the number of such events times what was in flight at each (a few requests,
futures and tasks). ``gc.freeze`` was left out earlier as a periodic call for that reason.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from typing import Callable, Iterator

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Young collections
# ---------------------------------------------------------------------------------------------

def set_young_threshold(gen0: int) -> None:
    """Set the collector's gen0 threshold to ``gen0``, keeping gen1 and gen2 as they are."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)


# ---------------------------------------------------------------------------------------------
# Snapshots and restores
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collection inside the block; afterwards the collector is enabled again only if it was
    enabled before (so blocks nest, and a caller that switched it off keeps it off).

    For work that builds millions of containers at once: encoding a snapshot (building its job
    maps at 1M jobs; young collections over a large heap made it 2.7x slower, 200 000 jobs:
    3.5 s -> 1.3 s) and restoring one (unpacking creates every object of the state, tens of
    millions at 1M jobs, and young collections over them cost more than the unpacking itself:
    docs/benchmarks.md, "Scale").
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_restored() -> None:
    """Freeze what a restore just made, before the collector runs again: the restored state is
    long-lived, and otherwise the next young collection walks every object restored (1.0-1.3 s
    at 1M jobs, the GIL held: longer than the election timeout). Call it inside ``paused()``."""
    gc.freeze()


# ---------------------------------------------------------------------------------------------
# Freezing as the state grows
# ---------------------------------------------------------------------------------------------

class GcPauses:
    """Times every collection (``gc.callbacks``) and freezes as described in the module doc.

    ``jobs`` returns the replica's job map (read without its lock: only its identity and size).
    ``poll`` is called from the node's event loop about once a second; the callback may run on
    any thread (the one that allocated when a collection fell due).
    """

    def __init__(self, jobs: Callable[[], dict], *, freeze_pause_s: float, freeze_growth_records: int,
                 log_pause_s: float,
                 runs: Callable[[], int] = lambda: 0,
                 written: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.perf_counter,
                 freeze: Callable[[], None] = gc.freeze) -> None:
        self._jobs = jobs
        self._freeze_pause_s = freeze_pause_s
        self._runs = runs
        self._written = written
        self._freeze_growth_records = freeze_growth_records
        self._log_pause_s = log_pause_s
        self._clock = clock
        self._freeze = freeze
        self._lock = threading.Lock()
        self._started = 0.0
        self._freeze_wanted = False
        self._jobs_map = None
        self._records_at_freeze = 0
        self._written_at_freeze = 0
        #: per generation: collections, seconds spent in them, the longest one (s)
        self.collections = [0, 0, 0]
        self.pause_s_total = [0.0, 0.0, 0.0]
        self.pause_s_max = [0.0, 0.0, 0.0]
        self.freezes = 0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        # Runs inside the collector: no allocation-heavy work, and never raises.
        try:
            if phase == "start":
                self._started = self._clock()
                return
            gen = info["generation"]
            dt = self._clock() - self._started
            self.collections[gen] += 1
            self.pause_s_total[gen] += dt
            if dt > self.pause_s_max[gen]:
                self.pause_s_max[gen] = dt
            if gen == 2 and dt >= self._freeze_pause_s:
                self._freeze_wanted = True
            if dt >= self._log_pause_s:
                log.warning("gc.pause generation=%d ms=%.0f collected=%d", gen, dt * 1000,
                            info.get("collected", 0))
        except Exception:  # noqa: BLE001 - a failing callback must not break the collector
            pass

    def poll(self) -> bool:
        """Freeze if a long full collection or the state's growth asks for it. :returns: whether it did."""
        jobs = self._jobs()
        n = len(jobs) + self._runs()
        w = self._written()
        with self._lock:
            if self._jobs_map is not None and jobs is not self._jobs_map:
                # restored, and frozen by the restore: growth and writes count from here
                self._records_at_freeze, self._written_at_freeze = n, w
            self._jobs_map = jobs
            if w < self._written_at_freeze:
                self._written_at_freeze = w  # (a counter that went back: counted from here)
            if not (self._freeze_wanted or n - self._records_at_freeze >= self._freeze_growth_records
                    or w - self._written_at_freeze >= self._freeze_growth_records):
                if n < self._records_at_freeze:
                    self._records_at_freeze = n  # jobs or runs deleted: growth counts from here
                return False
            self._freeze_wanted = False
            self._records_at_freeze, self._written_at_freeze = n, w
        t0 = self._clock()
        self._freeze()
        self.freezes += 1
        # Not gc.get_freeze_count(): it walks the frozen objects (0.5 s at 850 000 jobs, with
        # the GIL held: it cost a scale run its leader).
        log.info("gc.freeze records=%d ms=%.1f", n, (self._clock() - t0) * 1000)
        return True


async def poll_forever(gc_pauses: GcPauses, period_s: float) -> None:
    """Let ``gc_pauses`` freeze the long-lived state when it asks to, every ``period_s``, until
    cancelled (the node runs it as one of its loops)."""
    while True:
        try:
            gc_pauses.poll()
        except Exception:  # a bug here must not stop the node (run_node ends when a loop does)
            log.exception("gc poll failed")
        await asyncio.sleep(period_s)
