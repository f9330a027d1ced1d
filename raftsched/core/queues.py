"""Run queues: their derived indexes, the queue_full policies, and the dead-letter queue.

Derived indexes (not in the snapshot, made again by ``rebuild_indexes`` on restore): per queue
and priority the queued runs ordered by (due, id), a ``ready.ReadyIndex`` (a heap's operations,
laid out by due), whose heads are the runs whose due has come (an acquire merges the heads by
(-priority, due, id)); per queue the dead runs oldest
first, by (finished_at, id); per queue whose ``on_full`` is ``drop_oldest``, a heap of its
queued runs by (slot, id), made when ``put_queue`` makes it so (and on restore) and kept
(``by_slot_index``, ``drop_oldest_queued``);
and the counts of queued and running runs per queue. A heap's entries go stale when a run leaves
the queue another way than by being popped; stale entries are skipped when popped, and a heap
that holds more than twice its queue's depth in entries is compacted
(``limits.queue_index_stale_slack``). (No lease index: the reaper reads the running runs' ids
a part at a time, ``queries.lease_sweep``, and an index nothing pops would grow with every
heartbeat.) Keys are
unique (they end with the run id), so the order in which runs are handed out is the same on
every replica, whether a replica built its heaps incrementally or from a snapshot.

Beside them, indexes of the jobs kept here because they are reset and rebuilt with the rest: the
paused count, the jobs with per-job metrics, the jobs with a placement, every job's name in
order (a ``SortedList``: a page of ``GET /v1/jobs`` is a range of it, not a walk of every job),
each tenant's job names in order, and the tenants using each queue.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from . import deadlines, limits, pipehooks, snapshot
from .errors import Conflict, InvalidCommand, NotFound
from .model import is_name
from .events import emit
from .locks import count_tenants
from .ready import ReadyIndex
from .records import HANDLER_WAITED, Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState


def reset_indexes(s: SchedulerState) -> None:
    """Empty indexes, for a state with no runs."""
    #: queue -> priority -> its queued runs by (due, run id); ready once due has come
    s._queued = {}
    #: queue -> heap of (slot, run id) of its queued runs: drop_oldest's index, kept for every
    #: queue whose on_full is drop_oldest (by_slot_index)
    s._by_slot = {}
    #: queue -> ids of its dead runs, oldest first by (finished_at, id)
    s._dead = {}
    #: queue -> runs queued in it (its depth) / leased and running
    s._queue_depth = {}
    s._running_count = {}
    #: ids of running runs, in grant order: what the reaper watches
    s._running_ids = {}
    #: how many jobs are paused (jobs.apply_pause_job / apply_resume_job / apply_delete_job)
    s._paused_count = 0
    #: tenant -> locks held by its tokens (locks.count_tenants)
    s._lock_tenants = {}
    #: the jobs whose spec says "metrics": true, in no particular order (notify.metric_jobs)
    s._metric_jobs = {}
    #: the jobs whose spec has a placement, in no particular order (worker_queries.unplaceable)
    s._placed_jobs = {}
    #: every job's name, in order (queries.jobs_page): a page is a range of it, where one pass
    #: over a million names took ~0.3 s a page under the replica's lock (the Raft thread waiting:
    #: a benchmark paging 1M jobs from three replicas saw the leader change, again and again)
    s._names = SortedList()
    #: tenant -> its jobs' names, in order (queries.jobs_page_in: a tenant's page without a
    #: walk of every job); queue -> tenant -> jobs of that tenant using the queue (who uses a
    #: queue nobody owns: queries.queues_access, queues_of). Kept by index_job / unindex_job.
    s._tenant_names = {}
    s._queue_users = {}


def index_job(s: SchedulerState, name: str, spec: Record) -> None:
    """A job of ``spec`` is added under ``name``: into the tenants' and queues' indexes."""
    tenant = spec["tenant"]
    names = s._tenant_names.get(tenant)
    if names is None:
        names = s._tenant_names[tenant] = SortedList()
    names.add(name)
    users = s._queue_users.setdefault(spec["queue"], {})
    users[tenant] = users.get(tenant, 0) + 1


def unindex_job(s: SchedulerState, name: str, spec: Record) -> None:
    """The job ``name`` of ``spec`` goes (deleted, or replaced by another spec): out of them."""
    tenant, queue = spec["tenant"], spec["queue"]
    names = s._tenant_names.get(tenant)
    if names is not None:
        names.discard(name)
        if not names:
            del s._tenant_names[tenant]
    users = s._queue_users.get(queue)
    if users is not None and tenant in users:
        users[tenant] -= 1
        if users[tenant] <= 0:
            del users[tenant]
        if not users:
            del s._queue_users[queue]


def rebuild_indexes(s: SchedulerState) -> None:
    """Make every index from the runs (after a restore)."""
    reset_indexes(s)
    dead = []
    for run in s.runs.values():
        st = run["state"]
        if st == "queued":
            enqueue(s, run)
        elif st == "running" and run["fencing_token"] is not None:
            # A worker's lease (leases.apply_acquire). A heartbeat job's run pinged "start" is running
            # with no token and no lease (deadlines.apply_ping): a live replica never indexed it.
            s._running_count[run["queue"]] = s._running_count.get(run["queue"], 0) + 1
            s._running_ids[run["id"]] = None
        elif st == "dead":
            dead.append(run)
    for run in sorted(dead, key=lambda r: (r["finished_at"], r["id"])):
        s._dead.setdefault(run["queue"], deque()).append(run["id"])
    for name, qrec in s.queues.items():
        if qrec["on_full"] == "drop_oldest":
            by_slot_index(s, name)
    s._paused_count = sum(1 for j in s.jobs.values() if j["paused"])
    for lk in s.locks.values():
        count_tenants(s, lk.get("tenants"), 1)
    s._metric_jobs = {name: None for name, j in s.jobs.items() if j["spec"].get("metrics")}
    s._placed_jobs = {name: None for name, j in s.jobs.items() if "placement" in j["spec"]}
    s._names = SortedList(s.jobs)
    by_tenant: dict[str, list[str]] = {}
    for name, j in s.jobs.items():
        spec = j["spec"]
        by_tenant.setdefault(spec["tenant"], []).append(name)
        users = s._queue_users.setdefault(spec["queue"], {})
        users[spec["tenant"]] = users.get(spec["tenant"], 0) + 1
    s._tenant_names = {t: SortedList(names) for t, names in by_tenant.items()}


def enqueue(s: SchedulerState, run: Record) -> None:
    """Put a queued run into its queue's indexes. A run held by its job's pause (``due`` None:
    notify.pause) counts in its queue's depth but has no index entry until released."""
    q = run["queue"]
    depth = s._queue_depth[q] = s._queue_depth.get(q, 0) + 1
    due = run.get("due", run["slot"])
    if due is not None:
        _index(s, run, due, depth)


def release_held(s: SchedulerState, run: Record) -> None:
    """A queued run held by its job's pause (counted in its queue's depth already) becomes
    leasable again at its slot: into its queue's indexes."""
    due = run["due"] = run["slot"]
    _index(s, run, due, s._queue_depth.get(run["queue"], 0))


def _index(s: SchedulerState, run: Record, due: int, depth: int) -> None:
    q = run["queue"]
    prios = s._queued.get(q)
    if prios is None:
        prios = s._queued[q] = {}
    p = run["priority"]
    h = prios.get(p)
    if h is None:
        h = prios[p] = ReadyIndex()
    h.push(due, run["id"])
    if len(h) > 2 * depth + limits.queue_index_stale_slack:
        compact_queued(s, q, p, h)
    bs = s._by_slot.get(q)
    if bs is not None:
        heapq.heappush(bs, (run["slot"], run["id"]))
        by_slot_pushed(s, q, bs, depth, 1)


def compact_queued(s: SchedulerState, q: str, p: int, h: ReadyIndex) -> None:
    """Keep only the live entries of queue ``q``'s priority ``p`` index, in place (callers
    hold it). Which entries an index holds beside the live ones changes nothing any replica
    decides: acquire skips stale ones, and every queued run has a live one."""
    runs = s.runs

    def live(due: int, rid: str) -> bool:
        run = runs.get(rid)
        return run is not None and run["state"] == "queued" and run["queue"] == q \
            and run["priority"] == p and run.get("due", run["slot"]) == due
    h.keep_only(live)


def drop_oldest_queued(s: SchedulerState, qname: str, now: int) -> Record | None:
    """Mark the queued run of ``qname`` with the oldest slot (the smallest id among equal
    slots) skipped: on_full=drop_oldest. O(log n) from the queue's by-slot heap
    (``by_slot_index``). The run's entry in its acquire index goes too when it is that index's
    head (a queue of runs due at their slots: every drop), so that a full queue's drops do not
    leave an entry each to compact. :returns: the run dropped (its outcome's hooks are the
    caller's: fire.dropped)."""
    bs = by_slot_index(s, qname)
    runs, pop = s.runs, heapq.heappop
    while bs:
        slot, rid = pop(bs)
        run = runs.get(rid)
        if run is not None and run["state"] == "queued" and run["queue"] == qname and run["slot"] == slot \
                and run.get("due", slot) is not None:  # (a run held by its job's pause is not dropped)
            h = s._queued.get(qname, {}).get(run["priority"])
            if h is not None and h.head() == (run.get("due", slot), rid):
                h.pop()
            s._trim_epoch += 1  # an entry of a history finished (fire.trim's scan cache)
            run["state"] = "skipped"
            run["reason"] = "queue_full"
            run["finished_at"] = now
            s.stats.on_recorded("skipped", "queue_full")
            s._queue_depth[qname] -= 1
            return run
    return None


def by_slot_index(s: SchedulerState, qname: str) -> list[tuple[int, str]]:
    """Queue ``qname``'s heap of (slot, run id), every queued run of it in it (and stale
    entries): made from its acquire indexes when missing. It is kept for every ``drop_oldest``
    queue from ``put_queue`` on (and made on restore), not made at the first drop: at a bound of
    300 000 runs making it took 0.37 s in one apply (in one process; over a second at a
    million), on every replica at once, and the cluster lost its leader (docs/benchmarks.md,
    "A full queue's drops")."""
    bs = s._by_slot.get(qname)
    if bs is None:
        bs = s._by_slot[qname] = _queued_by_slot(s, qname)
    return bs


def by_slot_pushed(s: SchedulerState, qname: str, bs: list[tuple[int, str]], depth: int, n: int) -> None:
    """``n`` runs were pushed into queue ``qname``'s by-slot heap ``bs`` (its depth now
    ``depth``): take up to ``n + 1`` stale entries off its top (runs leased, or gone another way:
    a queue's runs leave it oldest first, mostly), so that stale ones do not pile up until a
    compaction of the whole heap; compact it when they did anyway (over twice its depth)."""
    if len(bs) > depth:
        runs, pop = s.runs, heapq.heappop
        for _ in range(n + 1):
            slot, rid = bs[0]
            run = runs.get(rid)
            if run is not None and run["state"] == "queued" and run["queue"] == qname and run["slot"] == slot \
                    and run.get("due", slot) is not None:
                break
            pop(bs)
            if not bs:
                break
        if len(bs) > 2 * depth + limits.queue_index_stale_slack:
            _compact_by_slot(s, qname, bs)


def _compact_by_slot(s: SchedulerState, qname: str, bs: list[tuple[int, str]]) -> None:
    """Keep only the live entries of queue ``qname``'s by-slot heap ``bs``, one a run, in place
    (a caller may hold the list): read from the heap itself, not from the acquire indexes."""
    runs, seen, keep = s.runs, set(), []
    for slot, rid in bs:
        if rid in seen:
            continue
        run = runs.get(rid)
        if run is not None and run["state"] == "queued" and run["queue"] == qname and run["slot"] == slot \
                and run.get("due", slot) is not None:
            seen.add(rid)
            keep.append((slot, rid))
    heapq.heapify(keep)
    bs[:] = keep


def _queued_by_slot(s: SchedulerState, qname: str) -> list[tuple[int, str]]:
    """A heap of (slot, id) of every queued run of ``qname``, from its acquire heaps (every
    queued run has an entry there)."""
    runs, seen, out = s.runs, set(), []
    for h in s._queued.get(qname, {}).values():
        for _, rid in h:  # (every entry, stale ones too)
            run = runs.get(rid)
            if run is not None and rid not in seen and run["state"] == "queued" and run["queue"] == qname \
                    and run.get("due", 0) is not None:
                seen.add(rid)
                out.append((run["slot"], rid))
    heapq.heapify(out)
    return out


def unqueue_count(s: SchedulerState, run: Record) -> None:
    """A queued run leaves its queue by another way than acquire: one fewer in its depth."""
    q = run["queue"]
    s._queue_depth[q] = s._queue_depth.get(q, 1) - 1


# ------------------------------------------------------------------ the dead-letter queue
def add_dead(s: SchedulerState, run: Record, now: int) -> None:
    """Put a run that just died (``finished_at`` = ``now``) into its queue's DLQ, purging the
    oldest dead runs beyond ``limits.dlq_per_queue_max``."""
    dq = s._dead.setdefault(run["queue"], deque())
    # Oldest first by (finished_at, id), the order rebuild_indexes restores: runs that die at
    # the same now in another order than their ids must be purged alike on a replica restored
    # from a snapshot. (finished_at only grows, so this looks at the tail only.)
    i = len(dq)
    while i > 0:
        prev = s.runs.get(dq[i - 1])
        if prev is None or (prev["finished_at"], prev["id"]) < (now, run["id"]):
            break
        i -= 1
    dq.insert(i, run["id"])
    while len(dq) > limits.dlq_per_queue_max:
        old = s.runs.get(dq.popleft())
        if old is not None and old["state"] == "dead":
            drop_entry(s, old)


def drop_entry(s: SchedulerState, run: Record) -> None:
    """Forget a run: out of the runs and out of its job's history."""
    s.runs.pop(run["id"], None)
    hist = s.history.get(run["job"])
    if hist is not None:
        try:
            hist.remove(run["id"])
        except ValueError:
            pass


def remove_dead(s: SchedulerState, run: Record) -> None:
    """Take a dead run out of its queue's DLQ index (requeued, deleted, or its job deleted)."""
    dq = s._dead.get(run["queue"])
    if dq is not None:
        try:
            dq.remove(run["id"])
        except ValueError:
            pass


def _dead_run(s: SchedulerState, cmd: Command) -> Record:
    rid = cmd.get("run")
    if not isinstance(rid, str):
        raise InvalidCommand(f"{cmd['op']} needs run")
    run = s.runs.get(rid)
    if run is None or run["state"] != "dead":
        raise NotFound(f"no run {rid!r} in a dead-letter queue", field="run")
    return run


def apply_dlq_requeue(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``dlq_requeue {run}``: a dead run queued again, due now, with fresh budgets (its
    failures and lost leases count from zero) and its attempt number one higher.

    :raises NotFound: no dead run of that id. :raises Conflict: its job no longer exists, or
        is a heartbeat job now (no worker would run it), or its queue is full."""
    run = _dead_run(s, cmd)
    job = s.jobs.get(run["job"])
    if job is None:
        raise Conflict(f"job {run['job']!r} no longer exists; the run cannot be requeued", field="run")
    if job["spec"]["executor"]["type"] == "heartbeat":
        raise Conflict(f"job {run['job']!r} is a heartbeat job now: no worker runs its slots, so the run cannot be "
                       f"requeued", field="run")
    qname = run["queue"]
    q = s.queues.get(qname, {"max_depth": limits.queue_depth_default, "on_full": "reject"})
    depth = s._queue_depth.get(qname, 0)
    if depth >= q["max_depth"]:
        # Not over its bound (a bulk requeue waits for room; a new slot is refused or drops the
        # oldest by on_full): a requeue by hand neither drops another's run nor overfills it.
        raise Conflict(f"queue {qname!r} is full ({depth} of {q['max_depth']} queued): the run stays dead; requeue "
                       f"it once the queue has room", field="run")
    remove_dead(s, run)
    run["attempt"] += 1
    run["failures"] = 0  # a fresh budget: max_attempts more failures, and backoff from the start
    run["lost"] = 0
    run.pop(HANDLER_WAITED, None)  # (a handler may have been deployed since: it waits for one again)
    run.update(state="queued", due=now, worker=None, deadline=None, finished_at=None)
    enqueue(s, run)
    deadlines.reopen(s, run["id"])  # its slot may still succeed: then late, not missed
    if s.sinks:
        emit(s, "run.requeued", now, job=run["job"], tenant=run.get("tenant"), slot=run["slot"], run_id=run["id"],
             attempt=run["attempt"], reason="manual")
    if run["job"] in s.pipes.children:  # its children wait for it again (pipelines.rearm)
        rearmed = pipehooks.rearm(s, run, now)
        if rearmed:
            return {"ok": True, "run": run["id"], "state": "queued", "attempt": run["attempt"], "rearmed": rearmed}
    return {"ok": True, "run": run["id"], "state": "queued", "attempt": run["attempt"]}


def apply_dlq_delete(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``dlq_delete {run}``: purge a dead run (out of the DLQ and its job's history).

    :raises NotFound: no dead run of that id."""
    run = _dead_run(s, cmd)
    remove_dead(s, run)
    drop_entry(s, run)
    return {"ok": True, "run": run["id"], "deleted": True}


def apply_put_queue(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_queue {name, max_depth, on_full, tenants?}``: a queue's bound and what a full queue
    does with a new run (``reject`` it, recorded skipped, or ``drop_oldest``). Queues that were
    never put have ``limits.queue_depth_default`` and reject. With ``tenants`` (a list of tenant
    names, or nil), the queue's owners are set to them (nil: it has none); without the key they
    stay as they are (``queue_owners``).

    :raises InvalidCommand: a field missing or of the wrong type."""
    name = cmd.get("name")
    depth, on_full = cmd.get("max_depth"), cmd.get("on_full")
    if not is_name(name) or not is_int(depth) or on_full not in ("reject", "drop_oldest"):
        raise InvalidCommand("put_queue needs name, max_depth, on_full")
    owners = cmd.get("tenants")
    if owners is not None and (not isinstance(owners, list) or not owners
                               or len(owners) > limits.token_tenants_max
                               or not all(type(t) is str and t for t in owners)):
        raise InvalidCommand("put_queue.tenants must be a list of tenant names or nil")
    s.queues[name] = {"max_depth": depth, "on_full": on_full}
    if on_full == "drop_oldest":
        by_slot_index(s, name)  # (from its queued runs, if any: kept from now on)
    else:
        s._by_slot.pop(name, None)
    if "tenants" in cmd:
        if owners is None:
            s.queue_owners.pop(name, None)
        else:
            s.queue_owners[name] = sorted(set(owners))
    return ok(queue=name)


# ------------------------------------------------------------------ owners
# A queue belongs to the tenants its owners list names (docs/security.md, "Queues"): set by an
# admin (put_queue's tenants: several tenants share it by the admin's choice), or claimed for
# one tenant by a token limited to tenants, when it configures the queue or puts a job in it
# while the queue has no owners (put_queue, put_job's ``claim``). Who may claim what is the
# proposer's check (node/tenancy.py); apply only records it. The snapshot section
# ``queue_owners``: queue -> sorted tenant names.
def claim_queue(s: SchedulerState, queue: str, tenant: object) -> None:
    """A put_job's ``claim``: ``queue`` is ``tenant``'s if it has no owners yet."""
    if type(tenant) is str and tenant and queue not in s.queue_owners:
        s.queue_owners[queue] = [tenant]


def _encode_owners(owners: dict[str, list[str]]) -> list[list[Any]] | None:
    return [[q, owners[q]] for q in sorted(owners)] or None


def _decode_owners(data: list[list[Any]]) -> dict[str, list[str]]:
    return {q: t for q, t in data}


snapshot.register(snapshot.Extension(name="queue_owners", new=dict, encode=_encode_owners, decode=_decode_owners))
