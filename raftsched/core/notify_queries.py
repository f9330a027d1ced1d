"""The leader's read for ``run.unplaceable`` (core/notify.py's ``note_unplaceable``): here, not in
notify.py, because it reads the fleet (worker_queries), whose modules import notify's hooks.

The look walks every queued run, so the leader takes it in three steps (node/notify.py), and holds
the replica's lock only for the first and the last: :func:`overdue_inputs` copies the queues'
heaps, :func:`overdue_candidates` picks the runs fired long enough ago and not told yet, outside
the lock (one key read at a time, as worker_queries.unplaceable_walk does), and
:func:`overdue_among` decides, under the lock again, a sorted slice of them at a time, until
enough are found. :func:`unplaceable_overdue` is the three at once (the reference, and tests)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from . import limits
from .ready import Buckets, entries_of
from .worker_queries import NO_HANDLER, LiveWorker, live_workers, may_wait_among, waiting_for_many

if TYPE_CHECKING:
    from .records import Record
    from .state import SchedulerState

#: :func:`overdue_inputs`: the state's runs map, a copy of every queue's acquire heaps, and the
#: live workers (built once a look: a walk of the registry, 35 ms at 10 000 workers).
OverdueInputs: TypeAlias = "tuple[dict[str, Record], list[Buckets], list[LiveWorker]]"


def unplaceable_overdue(s: SchedulerState, now_ms: int) -> list[str]:
    """Queued runs not reported yet that have waited longer than ``limits.unplaceable_report_ms``
    since they were fired and that no live worker may take (worker_queries.waiting_for_many's
    rule), sorted, at most ``limits.unplaceable_runs_max``: what the leader proposes in
    ``note_unplaceable``. Nothing when no sink exists."""
    inputs = overdue_inputs(s, now_ms)
    if inputs is None:
        return []
    return overdue_among(s, overdue_candidates(inputs, now_ms), now_ms, inputs[2])


def overdue_inputs(s: SchedulerState, now_ms: int) -> OverdueInputs | None:
    """Under the lock: what :func:`overdue_candidates` walks (a list copy of each heap, in C), or
    None when no run can be reported (no sink, or no run may wait for placement)."""
    if not s.sinks:
        return None
    live = live_workers(s, now_ms)
    if not may_wait_among(s, live):
        return None  # (else every queued run's id is listed and sorted: a storm's million)
    return s.runs, [h.copy_buckets() for q in s._queued.values() for h in q.values()], live


def overdue_candidates(inputs: OverdueInputs, now_ms: int) -> list[str]:
    """Outside the lock, from any thread: the ids, sorted, of the queued runs fired more than
    ``limits.unplaceable_report_ms`` ago and not reported yet (as they were when read: the last
    step decides under the lock)."""
    runs, heaps, _live = inputs
    old = now_ms - limits.unplaceable_report_ms
    out: set[str] = set()
    for h in heaps:
        for _due, rid in entries_of(h):
            r: Any = runs.get(rid)
            if r is not None and r["state"] == "queued" and r.get("unplaceable_at") is None and r["fired_at"] <= old:
                out.add(rid)
    return sorted(out)


def overdue_among(s: SchedulerState, candidates: list[str], now_ms: int, live: list[LiveWorker]) -> list[str]:
    """Under the lock: those of ``candidates`` (sorted) still queued, not reported and waiting
    for a worker none of ``live`` (:func:`overdue_inputs`'s) may take, sorted, the first
    ``limits.unplaceable_runs_max`` (the node reads it a slice of candidates per hold of the
    lock, and stops once it has enough: node/notify.py)."""
    old = now_ms - limits.unplaceable_report_ms
    runs = s.runs
    # (a run held by its job's pause, ``due`` None, waits for the resume, not for a worker)
    part = [rid for rid in candidates if (r := runs.get(rid)) is not None and r["state"] == "queued"
            and r.get("unplaceable_at") is None and r["fired_at"] <= old and r.get("due", 0) is not None]
    return sorted(waiting_for_many(s, part, now_ms, live))[:limits.unplaceable_runs_max]


def for_handler(s: SchedulerState, run_ids: list[str], now_ms: int, live: list[LiveWorker]) -> list[str]:
    """Under the lock: those of ``run_ids`` (:func:`overdue_among`'s) that wait for a worker with
    their handler (worker_queries.NO_HANDLER), in their order: ``note_unplaceable``'s ``handler``."""
    why = waiting_for_many(s, run_ids, now_ms, live)
    return [rid for rid in run_ids if why.get(rid) == NO_HANDLER]
