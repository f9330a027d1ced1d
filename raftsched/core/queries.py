"""Reads of the state: pure functions over a SchedulerState returning plain data, in storage
units (integer milliseconds since the epoch, UTC).

The other door of the core: the edges (service, API, metrics, trigger, worker) read the state
only through these, never its dicts, so the layout of its records can change behind them. The
caller runs them under the lock that serialises them with apply (replication's ``read``); what
they return shares no mutable object with the state (specs excepted: a spec is never changed in
place, a replace stores a new one), so it can be used after the lock is gone. Presentation (ISO
times, JSON shapes) is the node's: node/views.py.
"""
from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from operator import itemgetter

from . import limits
from .errors import NotFound
from .model import RUN_STATES, placement_ok
from .records import STATS_FIELDS
from .workers import DEDICATED, FACTS, is_gone

_QUEUE_DEFAULT = {"max_depth": limits.queue_depth_default, "on_full": "reject"}
_state_of = itemgetter("state")
_paused_of = itemgetter("paused")


# ------------------------------------------------------------------ jobs
def kept_position(old: dict | None, sched: dict) -> tuple[int, int, int | None] | None:
    """The ``(cursor, anchor, next)`` a put of schedule ``sched`` keeps from the job ``old`` it
    replaces: a replace with the same schedule keeps where the job was, so it never re-fires a
    slot nor loses a pending one. None when there is nothing to keep (a new job, or another
    schedule). The one statement of the rule: apply follows it (jobs.put_job), and the
    proposer follows it to compute the next slot it sends (put_position)."""
    if old is not None and old["spec"]["schedule"] == sched:
        return old["cursor"], old["anchor"], old["next"]
    return None


def put_position(s, name: str, sched: dict) -> tuple[int, int, int | None] | None:
    """kept_position for a put of job ``name`` with schedule ``sched``."""
    return kept_position(s.jobs.get(name), sched)


def cursor_floor(s, name: str) -> int | None:
    """The cursor a put of job ``name`` with another schedule starts from at the least (the old
    job's, which apply keeps when it is ahead: jobs.put_job), or None for a new job."""
    old = s.jobs.get(name)
    return None if old is None else old["cursor"]


def job(s, name: str) -> dict | None:
    """Job ``name`` as ``{"name", "spec", "gen", "created", "updated", "anchor", "cursor",
    "next", "paused", "stats": {STATS_FIELDS...}}``, or None."""
    j = s.jobs.get(name)
    if j is None:
        return None
    out = dict(j)
    out["stats"] = dict(zip(STATS_FIELDS, j["stats"]))
    return out


def jobs_page(s, limit: int, after: str | None) -> dict:
    """Up to ``limit`` jobs by name after ``after``: ``{"jobs": [job...], "next": the last name
    when more follow, else None, "total": every job}``."""
    names = sorted(s.jobs)
    if after:
        names = names[bisect.bisect_right(names, after):]
    page = names[:limit]
    return {"jobs": [job(s, n) for n in page], "next": page[-1] if len(names) > limit else None,
            "total": len(s.jobs)}


def jobs_labelled_page(s, labels: dict, limit: int, after: str | None) -> dict:
    """jobs_page of the jobs whose spec has every label of ``labels`` (key and value): ``next``
    and ``total`` count those jobs only. A scan of every job, as jobs_page's sort already is."""
    want = labels.items()
    names = sorted(n for n, j in s.jobs.items() if want <= j["spec"].get("labels", {}).items())
    total = len(names)
    if after:
        names = names[bisect.bisect_right(names, after):]
    page = names[:limit]
    return {"jobs": [job(s, n) for n in page], "next": page[-1] if len(names) > limit else None,
            "total": total}


def job_runs(s, name: str, limit: int, state: str | None = None, slot_ms: int | None = None) -> dict:
    """Job ``name``'s history, newest first: up to ``limit`` runs and records, those in ``state``
    only, or only the one covering ``slot_ms``. ``{"job", "runs": [run...], "history_max"}``.

    :raises NotFound: no such job."""
    j = s.jobs.get(name)
    if j is None:
        raise NotFound(f"no job named {name!r}", field="name")
    runs, out = s.runs, []
    for rid in reversed(s.history.get(name, [])):
        r = runs[rid]
        if state and r["state"] != state:
            continue
        if slot_ms is not None and not (r["slot"] <= slot_ms <= r.get("slot_to", r["slot"])):
            continue
        out.append(_run_copy(r))
        if len(out) >= limit:
            break
    return {"job": name, "runs": out, "history_max": j["spec"]["history"]}


def plan_views(s, names: list[str]) -> list[tuple]:
    """What the trigger plans a fire from: ``(spec, anchor, cursor, gen, name)`` of each job of
    ``names`` that still exists, one consistent view of each (a spec read before a replace and a
    generation read after it would make a plan that apply cannot tell is stale)."""
    jobs, out = s.jobs, []
    for n in names:
        j = jobs.get(n)
        if j is not None:
            out.append((j["spec"], j["anchor"], j["cursor"], j["gen"], n))
    return out


# ------------------------------------------------------------------ runs
def _run_copy(r: dict) -> dict:
    out = dict(r)
    if "attempts" in r:
        out["attempts"] = list(r["attempts"])  # appended to in place; each attempt never changes
    return out


def run(s, run_id: str) -> dict | None:
    """Run (or recorded slot) ``run_id``, or None."""
    r = s.runs.get(run_id)
    return None if r is None else _run_copy(r)


def runs(s, state: str | None, limit: int) -> list[dict]:
    """Up to ``limit`` runs and records, the newest first, those in ``state`` only."""
    out = []
    for r in reversed(s.runs.values()):
        if state and r["state"] != state:
            continue
        out.append(_run_copy(r))
        if len(out) >= limit:
            break
    return out


def _dead_in(s, queue: str) -> list[dict]:
    """The dead runs of ``queue`` from its DLQ index, oldest first by (finished_at, id)."""
    runs, out = s.runs, []
    for rid in s._dead.get(queue, ()):
        r = runs.get(rid)
        if r is not None and r["state"] == "dead" and r["queue"] == queue:
            out.append(r)
    return out


def dead_runs(s, queue: str | None) -> list[dict]:
    """The runs of ``queue``'s dead-letter queue (every queue's when None), from the DLQ index
    (not a scan of every run), oldest first by (finished_at, id) within a queue."""
    names = [queue] if queue is not None else sorted(s._dead)
    return [_run_copy(r) for q in names for r in _dead_in(s, q)]


def dead_run(s, run_id: str) -> dict | None:
    """Run ``run_id`` if it is in a dead-letter queue, else None."""
    r = s.runs.get(run_id)
    return None if r is None or r["state"] != "dead" else _run_copy(r)


# ------------------------------------------------------------------ queues
def queue_stats(s, now_ms: int) -> list[dict]:
    """Every configured queue, and every queue holding queued, running or dead runs, by name:
    ``{"name", "max_depth", "on_full", "configured", "depth", "ready", "running", "dead",
    "oldest_waiting_age_ms"}``. Depth and running come from the state's counters, dead from the
    DLQ index, and ready (queued runs whose due has come) and the oldest ready run's wait from
    the queue's acquire heaps: nothing here walks every run."""
    queues, depths, running = s.queues, s._queue_depth, s._running_count
    dead = {q: len(_dead_in(s, q)) for q in s._dead}
    names = set(queues)
    names.update(q for q, n in depths.items() if n)
    names.update(q for q, n in running.items() if n)
    names.update(q for q, n in dead.items() if n)
    out = []
    for name in sorted(names):
        cfg = queues.get(name, _QUEUE_DEFAULT)
        ready, oldest = _ready(s, name, now_ms)
        out.append({"name": name, "max_depth": cfg["max_depth"], "on_full": cfg["on_full"],
                    "configured": name in queues, "depth": depths.get(name, 0), "ready": ready,
                    "running": running.get(name, 0), "dead": dead.get(name, 0),
                    "oldest_waiting_age_ms": oldest})
    return out


def _ready(s, q: str, now_ms: int) -> tuple[int, int | None]:
    """Queued runs of ``q`` whose due has come, and the wait of the oldest of them (None when
    none), from the live entries of its acquire heaps: every queued run has one, under its
    current (due, id), and stale entries are told apart as acquire does."""
    runs, seen = s.runs, set()
    ready, oldest = 0, None
    for p, h in s._queued.get(q, {}).items():
        for due, rid in h:
            if due > now_ms or rid in seen:
                continue
            r = runs.get(rid)
            if r is None or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                    or r.get("due", r["slot"]) != due:
                continue
            seen.add(rid)
            ready += 1
            age = now_ms - due
            if oldest is None or age > oldest:
                oldest = age
    return ready, oldest


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


# ------------------------------------------------------------------ leases, tenants, locks
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


def tenants(s) -> list[dict]:
    """Every tenant's rate limit by name: ``{"name", "rate_milli", "burst", "tokens_micro",
    "last_ms"}`` (tokens per 1000 s, micro-tokens: tenants.py's units)."""
    return [dict(t, name=n) for n, t in sorted(s.tenants.items())]


def lock(s, name: str) -> dict | None:
    """Lock ``name`` as ``{"owner", "token", "deadline", "ttl", "since", "renewals"}`` while it
    is held (until released or expired by the leader's reaper), else None."""
    lk = s.locks.get(name)
    return None if lk is None else dict(lk)


# ------------------------------------------------------------------ counts
def counts(s, with_hash: bool = False) -> dict:
    """What ``GET /v1/cluster`` shows of the state: ``{"jobs", "runs", "now_ms", "applied"}``,
    all O(1); ``with_hash`` adds ``state_hash``, which encodes the whole state. The hash and
    ``applied`` are read together: two replicas with equal ``applied`` must have equal hashes
    (I1)."""
    out = {"jobs": len(s.jobs), "runs": len(s.runs), "now_ms": s.now_ms, "applied": s.applied}
    if with_hash:
        out["state_hash"] = hashlib.sha256(s.snapshot()).hexdigest()
    return out


def gauges(s) -> dict:
    """What a metrics scrape shows of the state: ``{"jobs", "jobs_paused", "runs_by_state":
    {state: n} for every run state, "queues": {queue: (queued, running, dead)}, "locks",
    "fencing_token"}``. Per queue from the counters and the DLQ index; the runs by state are
    counted over every record, at C speed (the state keeps no counter of finished ones)."""
    by_state = Counter(map(_state_of, s.runs.values()))
    per_q = {q: (n, 0, 0) for q, n in s._queue_depth.items() if n}
    for q, n in s._running_count.items():
        if n:
            a, _, c = per_q.get(q, (0, 0, 0))
            per_q[q] = (a, n, c)
    for q in s._dead:
        n = len(_dead_in(s, q))
        if n:
            a, b, _ = per_q.get(q, (0, 0, 0))
            per_q[q] = (a, b, n)
    for q in s.queues:
        per_q.setdefault(q, (0, 0, 0))
    return {"jobs": len(s.jobs), "jobs_paused": sum(map(bool, map(_paused_of, s.jobs.values()))),
            "runs_by_state": {st: by_state.get(st, 0) for st in RUN_STATES}, "queues": per_q,
            "locks": len(s.locks), "fencing_token": s.fencing_token}


# ------------------------------------------------------------------ the worker fleet (workers.py)
# Whether a worker is gone is judged here, at read time, from its last_seen (state time) and the
# reader's now (workers.is_gone). What a run needs of a worker: its queue served, its executor
# type run, its placement's labels carried and, for a dedicated worker, its dedicated labels named
# by the placement (model.placement_ok), active, not gone, a slot.

def _held_by(s) -> dict[str, list[str]]:
    """worker id -> the ids of the runs it holds (running under its lease), in grant order."""
    runs, out = s.runs, {}
    for rid in s._running_ids:
        out.setdefault(runs[rid]["worker"], []).append(rid)
    return out


def _worker_view(wid: str, w: dict, now_ms: int, held: int) -> dict:
    out = dict(w, id=wid, gone=is_gone(w, now_ms), held=held)
    out["labels"] = dict(w["labels"])
    out["dedicated"] = list(w.get(DEDICATED, ()))
    out["executors"] = list(w["executors"])
    out["queues"] = None if w["queues"] is None else list(w["queues"])
    out["status"] = "gone" if out["gone"] else w["state"]
    return out


def workers(s, now_ms: int) -> list[dict]:
    """Every registered worker by id: its record (workers._record: kind, labels, slots,
    executors, queues, version, instance, first_seen, last_seen, state, grants, losses,
    releases, completed) with ``id``, ``gone``, ``status`` (``active``, ``draining`` or ``gone``) and
    ``held`` (runs it holds). Linear in the workers and the running runs."""
    held = _held_by(s)
    return [_worker_view(wid, w, now_ms, len(held.get(wid, ()))) for wid, w in sorted(s.workers.items())]


def worker(s, wid: str, now_ms: int) -> dict | None:
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


def worker_record(s, wid: str) -> dict | None:
    """Worker ``wid``'s facts as its last hello gave them (workers.FACTS) and its ``state``, or
    None: what a node compares a lease request with, to say hello only when something changed."""
    w = s.workers.get(wid)
    if w is None:
        return None
    out = {k: w[k] for k in FACTS}
    out["labels"] = dict(w["labels"])
    out[DEDICATED] = list(w.get(DEDICATED, ()))
    out["state"] = w["state"]
    return out


def workers_to_forget(s, now_ms: int, limit: int) -> list[list]:
    """``[id, last_seen]`` of up to ``limit`` workers gone for longer than
    limits.worker_forget_ms at ``now_ms``, longest gone first: the leader's forget_workers."""
    old = sorted((w["last_seen"], wid) for wid, w in s.workers.items()
                 if now_ms - w["last_seen"] > limits.worker_forget_ms)
    return [[wid, seen] for seen, wid in old[:limit]]


def _live_workers(s, now_ms: int) -> list[tuple]:
    """(queues or None, labels, executors, dedicated) of every worker that could take a run now:
    active, not gone, with a slot."""
    return [(None if w["queues"] is None else frozenset(w["queues"]), w["labels"], frozenset(w["executors"]),
             w.get(DEDICATED, ()))
            for w in s.workers.values() if w["state"] == "active" and w["slots"] > 0 and not is_gone(w, now_ms)]


def _placeable(live: list[tuple], queue: str, spec: dict) -> bool:
    t = spec["executor"]["type"]
    return any((qs is None or queue in qs) and t in ex and placement_ok(spec, labels, ded)
               for qs, labels, ex, ded in live)


def _judged(spec: dict, live: list[tuple]) -> bool:
    """Whether a run of ``spec`` may wait for a worker because of placement: its job has one, or
    it has none and some live worker is dedicated (then only the others may take it)."""
    return "placement" in spec or any(ded for *_, ded in live)


def unplaceable(s, now_ms: int) -> dict[str, int]:
    """queue -> queued runs (due or not) whose job has a placement that no live worker serving
    the queue (active, not gone, a slot, the job's executor type) satisfies: they wait for a
    worker with those labels. While some live worker is dedicated (workers.py), a run of a job
    without placement counts too when only dedicated workers serve its queue. Queues with none
    are left out. Walks the queues' acquire heaps (stale entries told apart as acquire does),
    deciding once per distinct placement."""
    live = _live_workers(s, now_ms)
    any_dedicated = any(ded for *_, ded in live)
    runs, jobs, out, memo = s.runs, s.jobs, {}, {}
    for q, prios in s._queued.items():
        seen = set()
        for p, h in prios.items():
            for due, rid in h:
                r = runs.get(rid)
                if r is None or rid in seen or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                        or r.get("due", r["slot"]) != due:
                    continue
                seen.add(rid)
                job = jobs.get(r["job"])
                if job is None or ("placement" not in job["spec"] and not any_dedicated):
                    continue
                spec = job["spec"]
                key = (q, id(spec.get("placement")), spec["executor"]["type"])
                fits = memo.get(key)
                if fits is None:
                    fits = memo[key] = _placeable(live, q, spec)
                if not fits:
                    out[q] = out.get(q, 0) + 1
    return out


def waiting_for(s, run_id: str, now_ms: int) -> str | None:
    """Why queued run ``run_id`` waits, when it is for a worker: "no worker matches its
    placement" (no live worker serving its queue carries its placement's labels); else None."""
    r = s.runs.get(run_id)
    if r is None or r["state"] != "queued":
        return None
    job = s.jobs.get(r["job"])
    if job is None:
        return None
    live = _live_workers(s, now_ms)
    if not _judged(job["spec"], live) or _placeable(live, r["queue"], job["spec"]):
        return None
    return NO_WORKER_MATCHES


#: what ``waiting_for`` says of a run no live worker may take for its placement
NO_WORKER_MATCHES = "no worker matches its placement"


def waiting_for_many(s, run_ids: list[str], now_ms: int) -> dict[str, str]:
    """``waiting_for`` of several runs, deciding once per distinct placement: run id -> reason,
    for the runs that have one."""
    live, out, memo = None, {}, {}
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
        if not _judged(spec, live):
            continue
        key = (r["queue"], id(spec.get("placement")), spec["executor"]["type"])
        if key not in memo:
            memo[key] = _placeable(live, r["queue"], spec)
        if not memo[key]:
            out[rid] = NO_WORKER_MATCHES
    return out


def fleet_gauges(s, now_ms: int) -> dict:
    """What a metrics scrape shows of the fleet: ``{"by_status": {status: n} for active,
    draining and gone, "workers": {id: (held, grants, losses, releases)}, "unplaceable":
    {queue: n}}``."""
    held = _held_by(s)
    by_status = {"active": 0, "draining": 0, "gone": 0}
    per = {}
    for wid, w in s.workers.items():
        by_status["gone" if is_gone(w, now_ms) else w["state"]] += 1
        per[wid] = (len(held.get(wid, ())), w["grants"], w["losses"], w["releases"])
    return {"by_status": by_status, "workers": per, "unplaceable": unplaceable(s, now_ms)}


def ready_for(s, queues: list[str] | None, labels: dict, types: frozenset | None, now_ms: int,
              scan_max: int, dedicated=()) -> bool:
    """Whether an acquire by a worker of ``labels`` (``dedicated`` to some of them) and executor
    ``types`` (None: every type) serving ``queues`` (None: every queue) would hand something out
    now (``ready_count``)."""
    return ready_count(s, queues, labels, types, now_ms, scan_max, 1, dedicated) > 0


def ready_count(s, queues: list[str] | None, labels: dict, types: frozenset | None, now_ms: int,
                scan_max: int, limit: int, dedicated=()) -> int:
    """How many runs (up to ``limit``) an acquire by a worker of ``labels`` (``dedicated`` to
    some of them) and executor ``types`` (None: every type) serving ``queues`` (None: every
    queue) could hand out now: a
    cheap local count for a node's dispatcher of lease requests. Looks at the ready part of each
    heap (the entries whose due has come, a subtree at its root) up to ``scan_max`` entries in
    all; it may count a run acquire turns out not to hand out (another node's worker took it
    first, or its tenant's tokens were counted once for several of its runs), and miss one
    beyond the scan (the dispatcher then tries now and then anyway)."""
    names = queues if queues is not None else list(s._queued)
    runs, jobs, tenants, scanned, found = s.runs, s.jobs, s.tenants, 0, 0
    for q in names:
        for p, h in s._queued.get(q, {}).items():
            stack = [0]
            while stack and scanned < scan_max:
                i = stack.pop()
                if i >= len(h) or h[i][0] > now_ms:
                    continue
                stack.append(2 * i + 2)
                stack.append(2 * i + 1)
                scanned += 1
                due, rid = h[i]
                r = runs.get(rid)
                if r is None or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                        or r.get("due", r["slot"]) != due:
                    continue
                job = jobs.get(r["job"])
                if job is not None:
                    spec = job["spec"]
                    if types is not None and spec["executor"]["type"] not in types:
                        continue
                    if ("placement" in spec or dedicated) and not placement_ok(spec, labels, dedicated):
                        continue
                t = tenants.get(r["tenant"])
                if t is not None and min(t["burst"] * 1_000_000, t["tokens_micro"]
                                         + max(0, now_ms - t["last_ms"]) * t["rate_milli"]) < 1_000_000:
                    continue
                found += 1
                if found >= limit:
                    return found
    return found


def applied_count(s) -> int:
    """Commands this replica applied (refused ones included): a reader that saw the same count
    before saw the same state."""
    return s.applied


def next_due_ms(s, queues: list[str] | None) -> int | None:
    """The earliest due time at the head of the served queues' heaps (a hint: the head may be
    stale), or None when they are empty: how long a dispatcher may sleep."""
    names = queues if queues is not None else list(s._queued)
    best = None
    for q in names:
        for h in s._queued.get(q, {}).values():
            if h and (best is None or h[0][0] < best):
                best = h[0][0]
    return best
