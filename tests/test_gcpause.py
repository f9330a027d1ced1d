"""raftsched/node/gcpause.py: when the node freezes its long-lived objects, and what it times."""
from __future__ import annotations

import gc

from raftsched.node.gcpause import GcPauses
from raftsched.node.metrics import _GcCollector


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(jobs: dict, **kw):
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
    g, box, frozen, clock = make(jobs, freeze_growth_jobs=100)
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


def test_a_restored_state_is_not_frozen_again_and_its_size_is_the_new_base():
    """A restore freezes what it made (replication._StateConsumer._deserialize); a second freeze
    here would only keep more cyclic garbage alive. Growth counts from the restored size."""
    g, box, frozen, clock = make({"a": {}}, freeze_growth_jobs=10)
    assert g.poll() is False
    box["jobs"] = {f"j{i}": {} for i in range(15)}  # restore() replaces the job map
    assert g.poll() is False and frozen == []
    box["jobs"].update((f"k{i}", {}) for i in range(9))
    assert g.poll() is False
    box["jobs"]["k9"] = {}
    assert g.poll() is True and frozen == [25]


def test_real_collections_are_timed_and_exposed_as_metrics():
    g = GcPauses(lambda: {}, freeze=lambda: None)
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
    g, box, frozen, clock = make({f"j{i}": {} for i in range(10)}, freeze_growth_jobs=10)
    assert g.poll() is True and frozen == [10]
