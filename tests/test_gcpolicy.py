"""raftsched/gcpolicy.py: when the node freezes its long-lived objects, what it times, and the
collector paused around snapshots and restores."""
from __future__ import annotations

import asyncio
import gc

import pytest

from raftsched import gcpolicy
from raftsched.gcpolicy import GcPauses
from raftsched.node import limits as node_limits
from raftsched.node.metrics import _GcCollector


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


#: The node's numbers (node/limits.py), which it passes to GcPauses.
NODE = {"freeze_pause_s": node_limits.gc_freeze_pause_s, "freeze_growth_records": node_limits.gc_freeze_growth_records,
        "log_pause_s": node_limits.gc_log_pause_s}


def make(jobs: dict, **kw):
    kw = {**NODE, **kw}
    box = {"jobs": jobs}
    frozen = []
    clock = Clock()
    g = GcPauses(lambda: box["jobs"], clock=clock, freeze=lambda: frozen.append(len(box["jobs"])), **kw)
    return g, box, frozen, clock


def collect(g: GcPauses, clock: Clock, gen: int, seconds: float):
    g._callback("start", {"generation": gen, "collected": 0, "uncollectable": 0})
    clock.t += seconds
    g._callback("stop", {"generation": gen, "collected": 0, "uncollectable": 0})


def test_a_long_full_collection_is_followed_by_a_freeze_and_a_short_one_or_a_young_one_is_not():
    g, box, frozen, clock = make({}, freeze_pause_s=0.05)
    collect(g, clock, 2, 0.01)
    collect(g, clock, 1, 0.30)  # a long young collection: freezing would not shorten the next full one
    assert g.poll() is False and frozen == []
    collect(g, clock, 2, 0.06)
    assert g.poll() is True and frozen == [0]
    assert g.poll() is False, "once per long collection"
    assert g.collections == [0, 1, 2] and g.pause_s_max[2] == 0.06 and abs(g.pause_s_total[2] - 0.07) < 1e-9


def test_growth_of_the_jobs_freezes_once_per_step_and_deletions_reset_the_base():
    jobs: dict = {}
    g, box, frozen, clock = make(jobs, freeze_growth_records=100)
    jobs.update((f"j{i}", {}) for i in range(99))
    assert g.poll() is False
    jobs["j99"] = {}
    assert g.poll() is True and frozen == [100]
    jobs.update((f"k{i}", {}) for i in range(99))
    assert g.poll() is False
    for i in range(150):
        jobs.pop(f"k{i}", None) if i < 99 else jobs.pop(f"j{i - 99}")
    assert len(jobs) == 49 and g.poll() is False
    jobs.update((f"m{i}", {}) for i in range(100))  # 100 more than the low point
    assert g.poll() is True and frozen == [100, 149]


def test_runs_count_with_the_jobs_so_a_storm_of_runs_is_frozen_as_it_grows():
    """A top-of-the-hour storm adds a run a job and no job: counted with the jobs, its runs are
    frozen as they grow (a million unfrozen runs made full collections of 1-2.3 s on every node
    and three leader changes in 25 s). Runs trimmed away lower the base, as deleted jobs do."""
    box = {"jobs": {f"j{i}": {} for i in range(10)}}
    runs = {"n": 0}
    frozen = []
    g = GcPauses(lambda: box["jobs"], runs=lambda: runs["n"], freeze=lambda: frozen.append(runs["n"]),
                 **{**NODE, "freeze_growth_records": 100})
    assert g.poll() is False
    runs["n"] = 89
    assert g.poll() is False, "99 records: 10 jobs and 89 runs"
    runs["n"] = 90
    assert g.poll() is True and frozen == [90]
    runs["n"] = 40  # trimmed: 50 records, the new base
    assert g.poll() is False
    runs["n"] = 139
    assert g.poll() is False
    runs["n"] = 140
    assert g.poll() is True and frozen == [90, 140]


def test_jobs_written_again_freeze_as_growth_does():
    """Every job put again (a deploy) grows nothing, but makes a new record a job: counted by
    the put counter, they are frozen as they come (at 1M jobs, unfrozen, they made full
    collections of 0.3-1.0 s every 30-40 s and leader changes). A restore moves the base."""
    box = {"jobs": {f"j{i}": {} for i in range(10)}}
    written = {"n": 0}
    frozen = []
    g = GcPauses(lambda: box["jobs"], written=lambda: written["n"], freeze=lambda: frozen.append(written["n"]),
                 **{**NODE, "freeze_growth_records": 100})
    assert g.poll() is False
    written["n"] = 10  # the ten jobs put
    assert g.poll() is False
    written["n"] = 99  # the same ten jobs, put again and again: no growth
    assert g.poll() is False
    written["n"] = 100
    assert g.poll() is True and frozen == [100]
    assert g.poll() is False, "once per step"
    box["jobs"] = dict(box["jobs"])  # restored: its put counter is the snapshot's
    written["n"] = 5_000
    assert g.poll() is False and frozen == [100]
    written["n"] = 5_099
    assert g.poll() is False
    written["n"] = 5_100
    assert g.poll() is True and frozen == [100, 5_100]


def test_a_restored_state_is_not_frozen_again_and_its_size_is_the_new_base():
    """A restore freezes what it made (gcpolicy.freeze_restored); a second freeze
    here would only keep more cyclic garbage alive. Growth counts from the restored size."""
    g, box, frozen, clock = make({"a": {}}, freeze_growth_records=10)
    assert g.poll() is False
    box["jobs"] = {f"j{i}": {} for i in range(15)}  # restore() replaces the job map
    assert g.poll() is False and frozen == []
    box["jobs"].update((f"k{i}", {}) for i in range(9))
    assert g.poll() is False
    box["jobs"]["k9"] = {}
    assert g.poll() is True and frozen == [25]


def test_real_collections_are_timed_and_exposed_as_metrics():
    g = GcPauses(lambda: {}, freeze=lambda: None, **NODE)
    g.install()
    g.install()  # once only
    try:
        assert gc.callbacks.count(g._callback) == 1
        gc.collect()
    finally:
        g.uninstall()
    assert g._callback not in gc.callbacks
    assert g.collections[2] >= 1 and g.pause_s_max[2] > 0
    names = {m.name: m for m in _GcCollector(g).collect()}
    assert set(names) == {"raftsched_gc_collections", "raftsched_gc_pause_seconds", "raftsched_gc_pause_seconds_max",
                          "raftsched_gc_freezes"}
    full = [s for s in names["raftsched_gc_collections"].samples if s.labels == {"generation": "2"}]
    assert full and full[0].value >= 1


def test_the_callback_never_raises():
    g, box, frozen, clock = make({})
    g._callback("stop", {})  # no generation in the info: swallowed
    g._callback("start", None)


def test_a_freeze_walks_nothing(monkeypatch):
    """gc.get_freeze_count walks every frozen object (0.5 s with the GIL held at 850 000 jobs):
    a freeze must not call it, nor anything else that walks the heap."""
    def walks(*a):
        raise AssertionError("walked the heap")
    monkeypatch.setattr(gc, "get_freeze_count", walks)
    monkeypatch.setattr(gc, "get_objects", walks)
    g, box, frozen, clock = make({f"j{i}": {} for i in range(10)}, freeze_growth_records=10)
    assert g.poll() is True and frozen == [10]


def test_paused_switches_the_collector_off_and_back_on_only_if_it_was_on():
    assert gc.isenabled()
    with gcpolicy.paused():
        assert not gc.isenabled()
        with gcpolicy.paused():  # nested: the inner block leaves it off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gcpolicy.paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "a collector switched off before stays off"
    finally:
        gc.enable()
    with pytest.raises(RuntimeError):
        with gcpolicy.paused():
            raise RuntimeError("the block failed")
    assert gc.isenabled()


def test_the_young_threshold_is_set_and_the_older_ones_kept():
    before = gc.get_threshold()
    try:
        gcpolicy.set_young_threshold(node_limits.gc_gen0_threshold)
        assert gc.get_threshold() == (node_limits.gc_gen0_threshold, before[1], before[2])
        gcpolicy.set_young_threshold(1234)
        assert gc.get_threshold() == (1234, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_the_poll_loop_polls_and_survives_a_failing_poll():
    class Pauses:
        def __init__(self):
            self.polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 1:
                raise RuntimeError("a bug in poll")
            return False

    async def main():
        p = Pauses()
        task = asyncio.create_task(gcpolicy.poll_forever(p, period_s=0.001))
        deadline = asyncio.get_running_loop().time() + 5
        while p.polls < 3:
            assert asyncio.get_running_loop().time() < deadline, "the loop stopped polling"
            await asyncio.sleep(0.001)  # ok-sleep: the poll interval of a deadline-bounded wait
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
