"""The worker fleet's reads (core/workers.py's registry): part of the read door of
core/queries.py, which re-exports them; pure functions over a state, returning plain data.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeAlias

from . import limits
from .ready import Buckets, entries_of
from .placement import NO_HANDLER as NO_HANDLER, NO_WORKER_MATCHES as NO_WORKER_MATCHES, placement_ok
from .records import HANDLER_WAITED, Record
from .schedule import iso
from .tenants import token_due_ms
from .workers import DEDICATED, FACTS, TARGETS, TENANTS, is_gone

if TYPE_CHECKING:
    from .state import SchedulerState

#: A worker that could take a run now, as _live_workers sees it: (queues or None, labels,
#: executors, dedicated label names, tenants or None, python targets or None).
LiveWorker: TypeAlias = tuple[frozenset[str] | None, dict[str, str], frozenset[str], Collection[str],
                              frozenset[str] | None, Collection[str] | None]


# Whether a worker is gone is judged here, at read time, from its last_seen (state time) and the
# reader's now (workers.is_gone). What a run needs of a worker: its queue served, its executor
# type run, its placement's labels carried and, for a dedicated worker, its dedicated labels named
# by the placement (placement.placement_ok), the run's tenant among the worker's (when its token is
# limited to tenants), active, not gone, a slot.

def _held_by(s: SchedulerState) -> dict[str, list[str]]:
    """worker id -> the ids of the runs it holds (running under its lease), in grant order."""
    runs = s.runs
    out: dict[str, list[str]] = {}
    for rid in s._running_ids:
        out.setdefault(runs[rid]["worker"], []).append(rid)
    return out


def _worker_view(wid: str, w: Record, now_ms: int, held: int) -> dict[str, Any]:
    out = dict(w, id=wid, gone=is_gone(w, now_ms), held=held)
    out["labels"] = dict(w["labels"])
    out["dedicated"] = list(w.get(DEDICATED, ()))
    out[TENANTS] = list(w[TENANTS]) if TENANTS in w else None
    out[TARGETS] = list(w[TARGETS]) if TARGETS in w else None
    out["executors"] = list(w["executors"])
    out["queues"] = None if w["queues"] is None else list(w["queues"])
    out["status"] = "gone" if out["gone"] else w["state"]
    return out


def workers(s: SchedulerState, now_ms: int) -> list[dict[str, Any]]:
    """Every registered worker by id: its record (workers._record: kind, labels, slots,
    executors, queues, version, instance, first_seen, last_seen, state, grants, losses,
    releases, completed) with ``id``, ``gone``, ``status`` (``active``, ``draining`` or ``gone``) and
    ``held`` (runs it holds). Linear in the workers and the running runs."""
    held = _held_by(s)
    return [_worker_view(wid, w, now_ms, len(held.get(wid, ()))) for wid, w in sorted(s.workers.items())]


def worker(s: SchedulerState, wid: str, now_ms: int) -> dict[str, Any] | None:
    """Worker ``wid`` as ``workers`` shows it, with ``runs``: the runs it holds, ``{"id",
    "job", "attempt", "token", "started_at", "deadline", "queue"}``; None when not registered.
    Runs held by a worker id that is not registered (an old worker's, or a forgotten one's)
    are listed too, under a view with ``registered: False``."""
    runs = s.runs
    mine = [rid for rid in s._running_ids if runs[rid]["worker"] == wid]
    w = s.workers.get(wid)
    if w is None and not mine:
        return None
    held = [{"id": rid, "job": runs[rid]["job"], "attempt": runs[rid]["attempt"],
             "token": runs[rid]["fencing_token"], "started_at": runs[rid]["started_at"],
             "deadline": runs[rid]["deadline"], "queue": runs[rid]["queue"]} for rid in mine]
    if w is None:
        return {"id": wid, "registered": False, "held": len(held), "runs": held}
    out = _worker_view(wid, w, now_ms, len(held))
    out["registered"] = True
    out["runs"] = held
    return out


def worker_record(s: SchedulerState, wid: str) -> dict[str, Any] | None:
    """Worker ``wid``'s facts as its last hello gave them (workers.FACTS) and its ``state``, or
    None: what a node compares a lease request with, to say hello only when something changed."""
    w = s.workers.get(wid)
    if w is None:
        return None
    out = {k: w[k] for k in FACTS}
    out["labels"] = dict(w["labels"])
    out[DEDICATED] = list(w.get(DEDICATED, ()))
    out[TENANTS] = list(w[TENANTS]) if TENANTS in w else None
    out[TARGETS] = list(w[TARGETS]) if TARGETS in w else None
    out["state"] = w["state"]
    return out


def workers_to_forget(s: SchedulerState, now_ms: int, limit: int) -> list[list[Any]]:
    """``[id, last_seen]`` of up to ``limit`` workers gone for longer than
    limits.worker_forget_ms at ``now_ms``, longest gone first: the leader's forget_workers."""
    old = sorted((w["last_seen"], wid) for wid, w in s.workers.items()
                 if now_ms - w["last_seen"] > limits.worker_forget_ms)
    return [[wid, seen] for seen, wid in old[:limit]]


def _live_workers(s: SchedulerState, now_ms: int) -> list[LiveWorker]:
    """(queues or None, labels, executors, dedicated, tenants or None, targets or None) of every
    worker that could take a run now: active, not gone, with a slot."""
    return [_live(w) for w in s.workers.values() if w["state"] == "active" and w["slots"] > 0 and not is_gone(w, now_ms)]


def _live(w: Record) -> LiveWorker:
    return (None if w["queues"] is None else frozenset(w["queues"]), w["labels"], frozenset(w["executors"]),
            w.get(DEDICATED, ()), frozenset(w[TENANTS]) if TENANTS in w else None,
            w.get(TARGETS))  # (the record's list, looked in only for a python run: 128 at most)


def _placeable(live: list[LiveWorker], queue: str, spec: Record, tenant: str, handlers: bool = True) -> bool:
    """Whether some live worker may take a run of ``spec`` in ``queue`` of ``tenant``; with
    ``handlers`` False, whatever the python targets the workers have handlers for."""
    return any(_takes(lw, queue, spec, tenant, handlers) for lw in live)


def _takes(lw: LiveWorker, queue: str, spec: Record, tenant: str, handlers: bool) -> bool:
    """Whether live worker ``lw`` may take a run of ``spec`` in ``queue`` of ``tenant`` (:func:`_placeable`)."""
    qs, labels, ex, ded, ts, tg = lw
    target = spec["executor"].get("target")
    return ((qs is None or queue in qs) and spec["executor"]["type"] in ex and (ts is None or tenant in ts)
            and (tg is None or target is None or target in tg or not handlers)
            and placement_ok(spec, labels, ded))


def _restricted(live: list[LiveWorker]) -> bool:
    """Whether some live worker takes only some runs without placement: one dedicated to its
    labels, one limited to tenants, or one that has handlers for some python targets only."""
    return any(ded or ts is not None or tg is not None for _q, _l, _e, ded, ts, tg in live)


def _why_waiting(live: list[LiveWorker], queue: str, spec: Record, tenant: str) -> str | None:
    """What ``waiting_for`` says of a run no live worker may take, None when one may."""
    if _placeable(live, queue, spec, tenant):
        return None
    if spec["executor"].get("target") is not None and _placeable(live, queue, spec, tenant, handlers=False):
        return NO_HANDLER
    return NO_WORKER_MATCHES


def _judged(spec: Record, live: list[LiveWorker]) -> bool:
    """Whether a run of ``spec`` may wait for a worker because of placement: its job has one, or
    it has none and some live worker is dedicated, limited to tenants or to the python targets it
    has handlers for (then only the others, or those of its tenant or with its handler, may
    take it)."""
    return "placement" in spec or _restricted(live)


def unplaceable(s: SchedulerState, now_ms: int) -> dict[str, int]:
    """queue -> queued runs (due or not) whose job has a placement that no live worker serving
    the queue (active, not gone, a slot, the job's executor type) satisfies: they wait for a
    worker with those labels. While some live worker is dedicated (workers.py), a run of a job
    without placement counts too when only dedicated workers serve its queue. Queues with none
    are left out. Workers limited to tenants take only their tenants' runs: a run no live worker
    of its tenant may take counts too. Walks the queues' acquire heaps (stale entries told apart
    as acquire does), deciding once per distinct placement and tenant.

    Without a job that has a placement, nor a live worker dedicated or limited to tenants, no
    run can count: the answer is known without the walk (:func:`may_wait_for_placement`). Run
    whole under the replica's lock, the walk holds it as long as it takes: a metrics scrape of a
    node holding a top-of-the-hour storm's million queued runs walked them all, 3 s or more each,
    the Raft thread waiting, and the leader lost its quorum again and again. So the node's readers
    (the metrics, ``GET /v1/queues``) take :func:`unplaceable_inputs` under the lock and
    :func:`unplaceable_walk` outside it."""
    inputs = unplaceable_inputs(s, now_ms)
    return {} if inputs is None else unplaceable_walk(inputs)


#: What :func:`unplaceable_walk` reads: the live workers, whether any is restricted, the state's
#: runs and jobs maps, and a copy of every queue's acquire heaps (queue, priority, entries).
UnplaceableInputs: TypeAlias = tuple[list[LiveWorker], bool, dict[str, Record], dict[str, Record],
                                     list[tuple[str, int, Buckets]]]


def unplaceable_inputs(s: SchedulerState, now_ms: int,
                       heaps: list[tuple[str, int, Buckets]] | None = None) -> UnplaceableInputs | None:
    """Under the replica's lock (``raft.read``): what :func:`unplaceable` walks, the heaps copied
    (:func:`heaps_copy`, unless given), or None when no run can count."""
    live = _live_workers(s, now_ms)
    if not _may_wait(s, live):
        return None
    return live, _restricted(live), s.runs, s.jobs, heaps_copy(s) if heaps is None else heaps


def heaps_copy(s: SchedulerState) -> list[tuple[str, int, Buckets]]:
    """Under the replica's lock: every queue's acquire indexes as (queue, priority, copy), each
    ``ReadyIndex.copy_buckets`` (in C: a few ms for a million entries), for a walk outside the
    lock (``ready.entries_of``)."""
    return [(q, p, h.copy_buckets()) for q, prios in s._queued.items() for p, h in prios.items()]


def unplaceable_walk(inputs: UnplaceableInputs) -> dict[str, int]:
    """:func:`unplaceable`'s count from :func:`unplaceable_inputs`, callable outside the replica's
    lock, from any thread: it reads the runs and jobs maps one key at a time (each look-up whole,
    under the GIL) and never iterates them, so applies go on meanwhile, and a run they change
    while it walks is counted as it was or as it is: a gauge's reading, not a decision."""
    live, any_dedicated, runs, jobs, heaps = inputs
    out: dict[str, int] = {}
    # (queue, id of the placement, executor type, tenant) -> (fits, the placement): holding the
    # placement keeps its id from being reused by another while the walk runs beside applies
    memo: dict[tuple[str, int, str, str, str | None], tuple[bool, Any]] = {}
    seen_in: dict[str, set[str]] = {}
    for q, p, h in heaps:
        seen = seen_in.setdefault(q, set())
        for due, rid in entries_of(h):
            r = runs.get(rid)
            if r is None or rid in seen or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                    or r.get("due", r["slot"]) != due:
                continue
            seen.add(rid)
            job = jobs.get(r["job"])
            if job is None or ("placement" not in job["spec"] and not any_dedicated):
                continue
            spec = job["spec"]
            placement = spec.get("placement")
            key = (q, id(placement), spec["executor"]["type"], r["tenant"], spec["executor"].get("target"))
            known = memo.get(key)
            if known is None:
                known = memo[key] = (_placeable(live, q, spec, r["tenant"]), placement)
            if not known[0]:
                out[q] = out.get(q, 0) + 1
    return out


def may_wait_for_placement(s: SchedulerState, now_ms: int) -> bool:
    """Whether any queued run may wait for a worker because of placement (:func:`_judged`): some
    job has a placement, or some live worker is dedicated, limited to tenants or to its handlers' targets. False makes
    :func:`unplaceable` and :func:`waiting_for_many` empty without a look at the runs."""
    return _may_wait(s, _live_workers(s, now_ms))


def _may_wait(s: SchedulerState, live: list[LiveWorker]) -> bool:
    return bool(s._placed_jobs) or _restricted(live)


def waiting_for(s: SchedulerState, run_id: str, now_ms: int) -> str | None:
    """Why queued run ``run_id`` waits, when it is for a worker: "no worker matches its
    placement" (no live worker serving its queue carries its placement's labels, or takes its
    tenant's runs); else None."""
    r = s.runs.get(run_id)
    if r is None or r["state"] != "queued":
        return None
    job = s.jobs.get(r["job"])
    if job is None:
        return None
    live = _live_workers(s, now_ms)
    if not _judged(job["spec"], live):
        return None
    return _why_waiting(live, r["queue"], job["spec"], r["tenant"])





def waits_for_worker(live: list[LiveWorker], specs: list[Record]) -> list[str | None]:
    """For each of ``specs`` (validated job specs), what ``waiting_for`` would say of a queued run
    of its job among the ``live`` workers (:func:`live_workers`; a PUT's warning: node/service.py):
    :data:`NO_WORKER_MATCHES` or :data:`NO_HANDLER`; :data:`NO_LIVE_WORKER` for a spec without
    placement while no live worker is restricted, when none serves its queue and executor type
    (:func:`why_queued_many` says it of a due run); or None when some live worker may take it, or
    for a heartbeat job (its runs are pinged, not leased). Pure; one judgement for specs alike (a
    batch's thousand jobs of one app)."""
    memo: dict[tuple[Any, ...], str | None] = {}
    out: list[str | None] = []
    restricted = _restricted(live)  # (_judged's walk of the workers, once: not once a spec)
    for spec in specs:
        ex = spec["executor"]
        if ex["type"] == "heartbeat":
            out.append(None)
            continue
        if not ("placement" in spec or restricted):
            # No placement in play: its runs wait only when no live worker serves the queue and
            # the executor type at all (why_queued_many's "a worker: ...").
            key: tuple[Any, ...] = (spec["queue"], ex["type"], spec["tenant"])
            if key not in memo:
                memo[key] = None if _placeable(live, spec["queue"], spec, spec["tenant"]) else NO_LIVE_WORKER
            out.append(memo[key])
            continue
        q, tenant = spec["queue"], spec["tenant"]
        key = (q, ex["type"], ex.get("target"), tenant, repr(spec.get("placement")))
        if key not in memo:
            memo[key] = _why_waiting(live, q, spec, tenant)
        out.append(memo[key])
    return out


def labels_none_carries(live: list[LiveWorker], spec: Record) -> list[str]:
    """The labels (``key=value``) of ``spec``'s placement that no worker of ``live`` serving its
    queue and executor type carries: what to name in a PUT's warning (a typo in a label's name or
    value), none when each is some worker's (no one worker carries them all). Pure."""
    want = (spec.get("placement") or {}).get("labels") or {}
    q, t = spec["queue"], spec["executor"]["type"]
    serving = [labels for qs, labels, ex, _d, _ts, _tg in live if (qs is None or q in qs) and t in ex]
    return [f"{k}={v}" for k, v in sorted(want.items()) if not any(lb.get(k) == v for lb in serving)]


def live_workers(s: SchedulerState, now_ms: int) -> list[LiveWorker]:
    """The live workers as :func:`waiting_for_many` judges runs against them (a walk of the
    registry: a caller deciding runs in several calls builds it once)."""
    return _live_workers(s, now_ms)


def may_wait_among(s: SchedulerState, live: list[LiveWorker]) -> bool:
    """:func:`may_wait_for_placement` with the live workers already built."""
    return _may_wait(s, live)


def waiting_for_many(s: SchedulerState, run_ids: list[str], now_ms: int,
                     live: list[LiveWorker] | None = None) -> dict[str, str]:
    """``waiting_for`` of several runs, deciding once per distinct placement: run id -> reason,
    for the runs that have one. ``live``: :func:`live_workers`, if the caller has it."""
    out, memo = {}, {}
    restricted = None  # (_judged's walk of the workers, once: not once a run)
    for rid in run_ids:
        r = s.runs.get(rid)
        if r is None or r["state"] != "queued":
            continue
        job = s.jobs.get(r["job"])
        if job is None:
            continue
        if live is None:
            live = _live_workers(s, now_ms)
        spec = job["spec"]
        if "placement" not in spec:
            if restricted is None:
                restricted = _restricted(live)
            if not restricted:
                continue
        key = (r["queue"], id(spec.get("placement")), spec["executor"]["type"], r["tenant"],
               spec["executor"].get("target"))
        if key not in memo:
            memo[key] = _why_waiting(live, r["queue"], spec, r["tenant"])
        why = memo[key]
        if why is not None:
            out[rid] = why
    return out


#: :func:`waits_for_worker` of a spec no live worker may take while no placement is in play: no
#: live worker serves its queue and executor type (a PUT's warning says so in its own words).
NO_LIVE_WORKER = "no live worker serves its queue and executor type"


def why_queued_many(s: SchedulerState, run_ids: list[str], now_ms: int) -> dict[str, str]:
    """What a queued run's view says it waits for (``waiting_for``), for each of ``run_ids`` that
    waits for something: :func:`waiting_for_many`'s (a worker with its placement's labels, or
    with its handler) and, for a run whose due has come that no placement keeps back:

    - its tenant's rate limit, when the tenant's bucket holds no token now (acquire passes over
      its runs until one is refilled: ``tenants.tenant_take``), with when the next one is;
    - a worker, when no live worker (active, not gone, with a slot) serves its queue and runs its
      executor type: none registered, every one gone or draining, nodes started with
      ``--slots 0`` and no worker process, or workers of other queues only;
    - a free slot, when every live worker that may take it holds as many runs as it has slots.

    Else nothing: a due run some worker with a free slot may take is granted at that worker's
    next lease request (unless older or higher-priority runs take the slots first). Only for
    reading (the views, explain): :func:`waiting_for_many` alone decides what ``run.unplaceable``
    reports. Under the replica's lock: the live workers are walked once more (:func:`_groups`),
    with the running runs, when a run is judged against the fleet, and each kind of run (queue,
    placement, executor, target, and tenant while some worker is limited to tenants) is judged
    once, against groups of workers alike, not worker by worker (10 000 workers and a page of
    1 000 queued runs: ~25 ms in one process)."""
    live = _live_workers(s, now_ms)
    out = waiting_for_many(s, run_ids, now_ms, live)
    runs, jobs = s.runs, s.jobs
    groups: list[_Group] | None = None  # the live workers, grouped by what they take
    by_tenant = any(lw[4] is not None for lw in live)  # a worker limited to tenants: the tenant matters
    memo: dict[tuple[Any, ...], str | None] = {}
    for rid in run_ids:
        if rid in out:
            continue
        r = runs.get(rid)
        if r is None or r["state"] != "queued":
            continue
        due = r.get("due", r["slot"])
        if type(due) is not int or due > now_ms:
            continue  # not due yet, or held by its job's pause (the view says so)
        job = jobs.get(r["job"])
        if job is None:
            continue
        spec, tenant = job["spec"], r["tenant"]
        bucket = s.tenants.get(tenant)
        if bucket is not None:
            at = token_due_ms(bucket, now_ms)
            if at is not None:
                rate = f"{bucket['rate_milli'] / 1000:g} a second, burst {bucket['burst']}"
                out[rid] = (f"its tenant's rate limit: tenant {tenant!r} may start no run (a rate of 0)" if at < 0
                            else f"its tenant's rate limit: tenant {tenant!r} starts at most {rate}; its next "
                                 f"run may start at {iso(at)}")
                continue
        ex = spec["executor"]
        # A worker without the run's handler takes it too once it waited handler_wait_ms, or at
        # once after one refused it (acquire: leases.py)
        any_handler = HANDLER_WAITED in r or now_ms - due >= limits.handler_wait_ms
        key = (r["queue"], id(spec.get("placement")), ex["type"], tenant if by_tenant else None, ex.get("target"),
               any_handler)
        if key not in memo:
            if groups is None:
                groups = _groups(s, now_ms)
            takers = [g for g in groups if _takes(g.worker, r["queue"], spec, tenant, not any_handler)]
            if not takers:
                memo[key] = (f"a worker: no live worker serves queue {r['queue']!r} and runs {ex['type']} jobs "
                             "(GET /v1/workers lists the workers)")
            elif any(g.free for g in takers):
                memo[key] = None
            elif any(g.quiet for g in takers):
                # free slots only on workers not seen for a while: most likely stopped (a SIGKILL,
                # a lost machine), counted live until they are gone
                quiet = sorted(w for g in takers for w in g.quiet)
                ago = (now_ms - quiet[-1][0]) // 1000
                names = ", ".join(wid for _seen, wid in quiet[:3]) + (f" and {len(quiet) - 3} more"
                                                                       if len(quiet) > 3 else "")
                memo[key] = (f"a worker: the live worker(s) with a free slot that may take it ({names}) were not "
                             f"seen for {ago} s or more (a worker unseen for {limits.worker_gone_ms // 1000} s is "
                             "gone)")
            else:
                n = sum(g.n for g in takers)
                held, slots = sum(g.held for g in takers), sum(g.slots for g in takers)
                memo[key] = (f"a free slot: {'the' if n == 1 else 'every'} live worker that may take it ({n}) "
                             f"{'holds' if n == 1 else 'hold'} {held} run(s) in {slots} slot(s)")
        why = memo[key]
        if why is not None:
            out[rid] = why
    return out


class _Group:
    """Live workers that take the same runs (the same facts, as _live tuples them): how many,
    their slots and held runs together, and whether one of them has a free slot."""

    __slots__ = ("worker", "n", "slots", "held", "free", "quiet")

    def __init__(self, worker: LiveWorker) -> None:
        self.worker = worker
        self.n = self.slots = self.held = 0
        self.free = False  # a worker seen lately with a free slot
        #: (last_seen, id) of its workers with a free slot not seen for limits.worker_quiet_ms
        self.quiet: list[tuple[int, str]] = []


def _groups(s: SchedulerState, now_ms: int) -> list[_Group]:
    """The live workers (:func:`_live_workers`'s), grouped by their facts, with the runs each
    holds (running under its lease): a fleet of one app's ten thousand workers is one group, so
    each kind of run is judged against a handful of groups, not every worker."""
    held: dict[str, int] = {}
    runs = s.runs
    for rid in s._running_ids:
        w = runs[rid]["worker"]
        held[w] = held.get(w, 0) + 1
    out: dict[tuple[Any, ...], _Group] = {}
    for wid, w in s.workers.items():
        if w["state"] != "active" or w["slots"] <= 0 or is_gone(w, now_ms):
            continue
        lw = _live(w)
        qs, labels, ex, ded, ts, tg = lw
        key = (qs, tuple(labels.items()), ex, tuple(ded), ts, None if tg is None else tuple(tg))
        g = out.get(key)
        if g is None:
            g = out[key] = _Group(lw)
        n = held.get(wid, 0)
        g.n += 1
        g.slots += w["slots"]
        g.held += n
        if n < w["slots"]:
            if now_ms - w["last_seen"] < limits.worker_quiet_ms:
                g.free = True
            else:
                g.quiet.append((w["last_seen"], wid))
    return list(out.values())


def fleet_gauges(s: SchedulerState, now_ms: int) -> dict[str, Any]:
    """What a metrics scrape shows of the fleet: ``{"by_status": {status: n} for active,
    draining and gone, "workers": {id: (held, grants, losses, releases)}, "unplaceable": what
    :func:`unplaceable_walk` counts, outside the lock, or None (none can count)}``."""
    held = _held_by(s)
    by_status = {"active": 0, "draining": 0, "gone": 0}
    per = {}
    for wid, w in s.workers.items():
        by_status["gone" if is_gone(w, now_ms) else w["state"]] += 1
        per[wid] = (len(held.get(wid, ())), w["grants"], w["losses"], w["releases"])
    return {"by_status": by_status, "workers": per, "unplaceable": unplaceable_inputs(s, now_ms)}


def ready_for(s: SchedulerState, queues: list[str] | None, labels: dict[str, str], types: frozenset[str] | None,
              now_ms: int, scan_max: int, dedicated: Collection[str] = (),
              tenants: frozenset[str] | None = None, targets: frozenset[str] | None = None) -> bool:
    """Whether an acquire by a worker of ``labels`` (``dedicated`` to some of them) and executor
    ``types`` (None: every type) serving ``queues`` (None: every queue) would hand something out
    now (``ready_count``)."""
    return ready_count(s, queues, labels, types, now_ms, scan_max, 1, dedicated, tenants, targets) > 0


def ready_count(s: SchedulerState, queues: list[str] | None, labels: dict[str, str], types: frozenset[str] | None,
                now_ms: int, scan_max: int, limit: int, dedicated: Collection[str] = (),
                tenants: frozenset[str] | None = None, targets: frozenset[str] | None = None) -> int:
    """How many runs (up to ``limit``) an acquire by a worker of ``labels`` (``dedicated`` to
    some of them), executor ``types`` (None: every type) and ``tenants`` (None: every tenant)
    serving ``queues`` (None: every queue) could hand out now: a
    cheap local count for a node's dispatcher of lease requests. Looks at the ready part of each
    index (the entries whose due has come) up to ``scan_max`` entries in all; it may count a run
    acquire turns out not to hand out (another node's worker took it first, or its tenant's tokens
    were counted once for several of its runs), and miss one beyond the scan (the dispatcher then
    tries now and then anyway)."""
    return ready_scan(s, queues, labels, types, now_ms, scan_max, limit, dedicated, tenants, targets)[0]


def ready_scan(s: SchedulerState, queues: list[str] | None, labels: dict[str, str], types: frozenset[str] | None,
               now_ms: int, scan_max: int, limit: int, dedicated: Collection[str] = (),
               tenants: frozenset[str] | None = None, targets: frozenset[str] | None = None,
               skip: int = 0) -> tuple[int, bool]:
    """:func:`ready_count` past the first ``skip`` entries of its scan, passed over unread (they
    count against ``scan_max``), and whether it read at least one entry and every entry it read
    was a run the worker could take (not a stale entry, another worker's placement or executor
    type, or a tenant out of tokens).

    The dispatcher passes over the share of its acquires in flight when its last scan read
    nothing but such runs: each entry read is a look-up in the run map and the job's, and under
    load the scans read every run about twice (node/dispatch.py). Where every entry is one the
    worker can take, the count is the same as counting from the head and subtracting the share;
    where the entries passed over hold others, it is more (an acquire may then grant nothing,
    and the dispatcher counts from the head again)."""
    names = queues if queues is not None else list(s._queued)
    runs, jobs, rates, only, scanned, found = s.runs, s.jobs, s.tenants, tenants, 0, 0
    # (a run without a python target passes: "" stands for its target, as in leases.apply_acquire)
    handlers = None if targets is None else targets.union(("",))
    placed: dict[int, bool] = {}  # by placement object, as acquire reads them (core/leases.py)
    for q in names:
        for p, h in s._queued.get(q, {}).items():
            for due, bucket in h.ready_buckets(now_ms):
                if scanned < skip:
                    # Passed over whole when it fits (a bucket is a slot's runs: one each
                    # interval job of a fleet's), else entry by entry.
                    n = 1 if type(bucket) is str else len(bucket)
                    if scanned + n <= skip:
                        scanned += n
                        continue
                    start = skip - scanned
                    scanned = skip
                else:
                    start = 0
                # (smallest first, when the list is sorted)
                entries: Iterable[str] = (bucket,) if type(bucket) is str else reversed(bucket)
                if start:
                    entries = islice(entries, start, None)
                for rid in entries:
                    if scanned >= scan_max:
                        return found, 0 < found == scanned - skip
                    scanned += 1
                    r = runs.get(rid)
                    if r is None or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                            or r.get("due", r["slot"]) != due:
                        continue
                    job = jobs.get(r["job"])
                    if job is not None:
                        spec = job["spec"]
                        if types is not None and spec["executor"]["type"] not in types:
                            continue
                        if handlers is not None and spec["executor"].get("target", "") not in handlers \
                                and HANDLER_WAITED not in r and now_ms - due < limits.handler_wait_ms:
                            continue
                        if "placement" in spec or dedicated:
                            key = id(spec.get("placement"))
                            fits = placed.get(key)
                            if fits is None:
                                fits = placed[key] = placement_ok(spec, labels, dedicated)
                            if not fits:
                                continue
                    if only is not None and r["tenant"] not in only:
                        continue
                    t = rates.get(r["tenant"])
                    if t is not None and min(t["burst"] * 1_000_000, t["tokens_micro"]
                                             + max(0, now_ms - t["last_ms"]) * t["rate_milli"]) < 1_000_000:
                        continue
                    found += 1
                    if found >= limit:
                        return found, found == scanned - skip
    return found, 0 < found == scanned - skip


def applied_count(s: SchedulerState) -> int:
    """Commands this replica applied (refused ones included): a reader that saw the same count
    before saw the same state."""
    return s.applied


def drains_count(s: SchedulerState) -> int:
    """How many times a worker may have become draining on this replica (stats.ApplyStats.drains):
    a reader that saw the same count before has no new drain to look for."""
    return s.stats.drains


def draining_among(s: SchedulerState, worker_ids: Collection[str]) -> set[str]:
    """Those of ``worker_ids`` whose registered state is ``draining``."""
    reg = s.workers
    return {w for w in worker_ids if (rec := reg.get(w)) is not None and rec["state"] == "draining"}


def next_due_ms(s: SchedulerState, queues: list[str] | None) -> int | None:
    """The earliest due time at the head of the served queues' heaps (a hint: the head may be
    stale), or None when they are empty: how long a dispatcher may sleep."""
    names = queues if queues is not None else list(s._queued)
    best: int | None = None
    for q in names:
        for h in s._queued.get(q, {}).values():
            due = h.head_due()
            if due is not None and (best is None or due < best):
                best = due
    return best
