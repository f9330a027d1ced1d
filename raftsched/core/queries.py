"""Reads of the state: pure functions over a SchedulerState returning plain data, in storage
units (integer milliseconds since the epoch, UTC).

The other door of the core: the edges (service, API, metrics, trigger, worker) read the state
only through these, never its dicts, so the layout of its records can change behind them. The
caller runs them under the lock that serialises them with apply (replication's ``read``); what
they return shares no mutable object with the state, so it can be used after the lock is gone.
"""
from __future__ import annotations


def queue_depth(s, name: str) -> int:
    """Runs queued in queue ``name`` (whether due or not)."""
    return s._queue_depth.get(name, 0)


def has_ready_work(s, queues: list[str] | None, now_ms: int) -> bool:
    """Whether an acquire could hand out something (a cheap local check; it may say yes for
    index entries that turn out stale or rate-limited, never no when work is ready)."""
    names = queues if queues is not None else list(s._queued)
    for q in names:
        for h in s._queued.get(q, {}).values():
            if h and h[0][0] <= now_ms:
                return True
    return False


def lease_snapshot(s) -> list[tuple]:
    """Every live lease and lock as ``(kind, id, token, renewals, ttl_ms)``: what the leader's
    reaper watches. Linear in running runs (bounded by the workers' slots) and held locks."""
    out = []
    for rid in s._running_ids:
        r = s.runs[rid]
        out.append(("run", rid, r["fencing_token"], r.get("renewals", 0), r["ttl"]))
    out.extend(("lock", n, lk["token"], lk.get("renewals", 0), lk["ttl"]) for n, lk in s.locks.items())
    # Canonical order: a replica restored from a snapshot rebuilds _running_ids in
    # another order than the grants happened, and the reaper's command must not differ.
    out.sort()
    return out
