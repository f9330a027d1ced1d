"""The leader's read for ``run.unplaceable`` (core/notify.py's ``note_unplaceable``): here, not in
notify.py, because it reads the fleet (worker_queries), whose modules import notify's hooks."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import limits
from .worker_queries import may_wait_for_placement, waiting_for_many

if TYPE_CHECKING:
    from .state import SchedulerState


def unplaceable_overdue(s: SchedulerState, now_ms: int) -> list[str]:
    """Queued runs not reported yet that have waited longer than ``limits.unplaceable_report_ms``
    since they were fired and that no live worker may take (worker_queries.waiting_for_many's
    rule): what the leader proposes in ``note_unplaceable``. Nothing when no sink exists."""
    if not s.sinks or not may_wait_for_placement(s, now_ms):
        return []  # (else every queued run's id is listed and sorted: a storm's million, under the lock)
    old = now_ms - limits.unplaceable_report_ms
    ids = [rid for q in s._queued.values() for h in q.values() for _due, rid in h]
    runs = s.runs
    cand = sorted({rid for rid in ids if (r := runs.get(rid)) is not None and r["state"] == "queued"
                   and r.get("unplaceable_at") is None and r["fired_at"] <= old})
    return sorted(waiting_for_many(s, cand, now_ms))[:limits.unplaceable_runs_max]
