"""Fire: the leader's planned slots become runs and records (docs/design.md, "Slots, cursors and
fire plans").

``apply_fire`` is the hottest path of the cluster: every replica applies every slot. Its common
case (one or a few on-time slots of a job whose overlap policy reads no other run) is written
inline, beside the general path it stands for: ``new_run``, ``add_entry``, ``queues.enqueue``
and the due index's push, slot by slot, in the same order (tests/test_state_fast_paths.py
compares the two paths, command by command).

The rest of this module is what makes a run or a record out of a slot: the overlap policy and
the revocation it may do, the queue's bound, and the job's history and its trim.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import deadlines, limits, pipehooks
from .due import push_due
from .errors import InvalidCommand
from .model import TERMINAL_STATES
from .notify import on_replaced, on_slot_recorded
from .policy import fires_ahead
from .queues import by_slot_pushed, compact_queued, drop_oldest_queued, enqueue, unqueue_count
from .ready import ReadyIndex
from .records import LAG_LAST, LAG_MAX, LAG_SUM, RECORDED, RUN_TEMPLATE, RUNS, Record, Result, count_fire, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: Most slots one fire entry may carry as runs: a plan runs up to max_catchup_max missed slots and
#: max_catchup_max on-time ones; plus one, the bound the entry check always had. The inline check
#: of apply_fire and check_fire_entry both use it.
FIRE_ENTRY_RUNS_MAX = 2 * limits.max_catchup_max + 1
#: limits.history_trim_scan_slack and limits.fire_entry_records_max, by the names this module
#: reads them under in its hot paths.
TRIM_SCAN_SLACK = limits.history_trim_scan_slack
RECORDS_PER_ENTRY_MAX = limits.fire_entry_records_max
#: The states trim may drop: finished, but not dead (dead runs are the dead-letter queue).
TRIMMABLE = TERMINAL_STATES - {"dead"}


def apply_fire(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``fire {entries}``: apply a batch of planned fires. An entry planned from a stale view
    (its job's generation or cursor moved since, or the job is paused) is dropped whole: no
    slot can become two runs (I2). Each slot of an entry's ``runs`` becomes a run (or a record,
    when its overlap policy or a full queue says so), each of its ``rec`` a recorded range; the
    job's cursor moves to ``upto`` and its next slot to ``next``.

    An entry is a list ``[job, gen, after, upto, next, runs, rec]`` (what the trigger
    proposes: see :func:`raftsched.core.policy.compact_entry`) or the same fields as a map
    (``policy.plan_fire``'s form; older logs). Every entry is checked before any applies.
    This is the hottest path of the cluster (every replica applies every slot), hence the
    inline checks for the common shape: one on-time run and no records.

    :raises InvalidCommand: more than fire_entries_max entries, or an entry whose slots are
        not ascending and unique inside (after, upto], whose next is not after upto, or whose
        runs and records overlap (then none applies).
    """
    entries = cmd.get("entries")
    if type(entries) is not list or len(entries) > limits.fire_entries_max:
        raise InvalidCommand("fire needs a bounded list of entries")
    dl = cmd.get("dl")
    if dl is not None:  # the slots' deadline instants (core/deadlines.py), checked before any entry applies
        dl = deadlines.check_fire_items(dl)
    checked: list[Sequence[Any]] = []  # [job, gen, after, upto, next, runs, rec]: lists and tuples
    for e in entries:
        if type(e) is list and len(e) == 7:
            name, gen, after, upto, nxt, runs, rec = e
            if (type(name) is str and type(gen) is int and type(after) is int and type(upto) is int
                    and type(runs) is list and 0 < len(runs) <= FIRE_ENTRY_RUNS_MAX and type(rec) is list and not rec
                    and (nxt is None or (type(nxt) is int and nxt > upto))):
                # What check_fire_entry asks of an entry without records: slots ascending,
                # unique, inside (after, upto].
                prev = after
                for slot in runs:
                    if type(slot) is not int or slot <= prev:
                        break
                    prev = slot
                else:
                    if prev <= upto:
                        checked.append(e)
                        continue
            e = {"job": name, "gen": gen, "after": after, "upto": upto, "next": nxt, "runs": runs, "rec": rec}
        check_fire_entry(e)
        checked.append((e["job"], e["gen"], e["after"], e["upto"], e.get("next"), e["runs"], e["rec"]))
    fired = stale = recorded = 0
    stale_jobs = []
    made: dict[str, Record] = {}  # with deadlines: the general path's runs and records, trimmed or not
    jobs, all_runs, history = s.jobs, s.runs, s.history
    queues, depths, queued = s.queues, s._queue_depth, s._queued
    due = s.due
    due_max = due.compact_bound(jobs) if due is not None else 0  # no fire adds or removes jobs
    heappush = heapq.heappush
    fast = s._fast_paths
    for name, gen, after, upto, nxt, runs, rec in checked:
        job = jobs.get(name)
        if job is None or job["gen"] != gen or job["cursor"] != after or job["paused"]:
            # I2: a plan made from any other view of the job is dropped whole.
            stale += 1
            stale_jobs.append(name)
            continue
        spec = job["spec"]
        ov = spec.get("overlap")
        heartbeat = spec["executor"]["type"] == "heartbeat"
        # deadline.late_start: skip: a slot fired past its start_within_s is recorded, not run
        late_ms = deadlines.late_skip_ms(spec) if "deadline" in spec else None
        if fast and runs and not rec and not heartbeat and "after" not in spec and (
                ov is None or (ov.get("policy") == "allow" and "max_concurrent" not in ov)) and (
                late_ms is None or runs[0] + late_ms > now):
            # The common case, inline: slots that all become runs (no records), an overlap
            # policy that reads no other run (policy.fires_ahead, so overlap() creates them),
            # room in its queue for all of them or a queue that drops its oldest run for each.
            # One slot when on time; several when the trigger catches up (which is when speed
            # matters most) or for a job firing every second (limits.fire_ahead_span_ms). Exactly what new_run,
            # add_entry, enqueue and the due push do, slot by slot, in the same order (the
            # property test in tests/test_state_fast_paths.py compares the two paths).
            qname = spec["queue"]
            q = queues.get(qname)
            depth = depths.get(qname, 0)
            max_depth = limits.queue_depth_default if q is None else q["max_depth"]
            # Room for every slot, or a full queue that drops its oldest run for each: but not
            # for a job whose slots' deadlines this command tracks, as the runs it drops (its own
            # too, which its history may then trim) must reach deadlines.on_fire through ``made``,
            # which only the general path fills (a test per entry, none per slot).
            if depth + len(runs) <= max_depth or (q is not None and q["on_full"] == "drop_oldest"
                                                  and not (dl and "deadline" in spec)):
                prio, tenant, bound, stats = spec["priority"], spec["tenant"], spec["history"], job["stats"]
                # The job map's own key object (equal to the command's): its runs and their ids
                # hold it, so a look-up of a run's job compares by identity, not by its bytes
                # (acquire, complete), and the runs share one string.
                name = job["name"]
                hist = history.get(name)
                if hist is None:
                    hist = history[name] = []
                    clean_history(s, hist)  # no entry yet, so none finished (trim's scan cache)
                prios = queued.get(qname)
                if prios is None:
                    prios = queued[qname] = {}
                h = prios.get(prio)
                if h is None:
                    h = prios[prio] = ReadyIndex()
                # h.push inlined (ready.py), as the rest of this path is: a call a slot was
                # a tenth of a slot's instructions.
                buckets, dues, multi, unsorted = h._buckets, h._dues, h._multi, h._unsorted
                large = h.sort_max >> 1
                by_slot = s._by_slot.get(qname)
                lag_sum = 0
                pushed = 0  # into h, not yet counted in h._n
                try:
                    for slot in runs:
                        if depth >= max_depth:
                            depths[qname] = depth
                            h._n += pushed  # (what it drops may queue a pipeline's child: h read whole)
                            pushed = 0
                            dropped(s, drop_oldest_queued(s, qname, now), now)  # before the new run exists, as new_run
                            depth = depths[qname]
                            by_slot = s._by_slot.get(qname)
                        rid = f"{name}@{slot}"
                        run = RUN_TEMPLATE.copy()
                        run["id"] = rid
                        run["job"] = name
                        run["slot"] = slot
                        run["queue"] = qname
                        run["priority"] = prio
                        run["tenant"] = tenant
                        run["fired_at"] = now
                        run["due"] = slot
                        if now > slot:
                            lag_sum += now - slot
                        if all_runs.setdefault(rid, run) is not run:  # (one probe of the map, not two)
                            raise AssertionError(f"I2: run id {rid} already exists")
                        hist.append(rid)
                        excess = len(hist) - bound
                        if excess > 0:
                            # trim, unless it would return at once: the oldest entry is still
                            # active and this is not a scan turn (a backlog, or a sweep's queued runs).
                            # One past the bound behind a finished oldest entry (a full history of
                            # runs that ran): trim drops that entry and returns, done here.
                            head = hist[0]
                            if all_runs[head]["state"] in TRIMMABLE:
                                if excess == 1:
                                    del all_runs[head]
                                    del hist[0]
                                else:
                                    trim(s, hist, bound, cached=True)
                            elif not excess % TRIM_SCAN_SLACK:
                                trim(s, hist, bound, cached=True)
                        b = buckets.get(slot)
                        if b is None:
                            buckets[slot] = rid
                            heappush(dues, slot)
                        elif type(b) is str:
                            buckets[slot] = [b, rid] if rid <= b else [rid, b]
                            multi.add(slot)
                        elif len(b) >= large:
                            h.push_large(slot, b, rid)  # type: ignore[arg-type]
                        else:
                            if rid > b[-1]:
                                unsorted.add(slot)
                            b.append(rid)  # type: ignore[union-attr]
                        pushed += 1
                        depth += 1
                        if by_slot is not None:
                            heappush(by_slot, (slot, rid))
                finally:
                    # (apply refuses a command that raises, keeping what it did: h counts what it holds)
                    h._n += pushed
                depths[qname] = depth
                # count_fire of each slot, at once: slots ascend, so the first has the largest lag
                # and the last the smallest (the one kept as the last lag).
                stats[RUNS] += len(runs)
                lag = now - runs[-1]
                stats[LAG_LAST] = lag if lag > 0 else 0
                lag = now - runs[0]
                if lag > stats[LAG_MAX]:
                    stats[LAG_MAX] = lag
                stats[LAG_SUM] += lag_sum
                if h._n > 2 * depth + limits.queue_index_stale_slack:
                    compact_queued(s, qname, prio, h)
                if by_slot is not None:
                    by_slot_pushed(s, qname, by_slot, depth, len(runs))
                fired += len(runs)
                job["cursor"] = upto
                job["next"] = nxt
                if nxt is not None and due is not None:
                    wheel = due.ahead  # fires_ahead: this job's wheel (DueIndex.push)
                    wheel.push(nxt, name, gen)
                    if wheel.size > due_max:
                        due.compact(wheel, jobs)
                continue
        # The general path (its trims scan whole histories: trim's cache is the fast path's).
        # What it does to a fast-path job's history is append, or skip a queued run to make room
        # in a full drop_oldest queue, which moves the epoch (queues.drop_oldest_queued).
        if rec:
            # Oldest slot first, runs and records interleaved, so history reads in slot order.
            items = sorted([(slot, None) for slot in runs] + [(r[2], r) for r in rec], key=lambda it: it[0])
        else:
            items = [(slot, None) for slot in runs]
        for slot, r in items:
            if r is None:
                rid = f"{name}@{slot}"
                if "after" in spec:  # gated (pipelines): the slot waits for its parents
                    pipehooks.own_slot(s, job, slot, now)
                    fired += 1
                    continue
                if late_ms is not None and slot + late_ms <= now:
                    # Its run could only start past its start deadline (an outage's catch-up):
                    # recorded, as the sweep would withdraw it, and before the overlap policy (no
                    # run is made, so none is revoked or counted).
                    _recorded(s, job, {"id": rid, "job": name, "slot": slot, "state": "skipped", "reason": "late_start",
                                       "kind": "recorded", "fired_at": now,
                                       "error": deadlines.late_error(late_ms, "fired too late to start")},
                              made if dl else None, now)
                    recorded += 1
                    continue
                blocked = overlap(s, job, rid, now)
                if blocked is not None:
                    # The slot is handled (the cursor passes it) but becomes a record.
                    _recorded(s, job, {"id": rid, "job": name, "slot": slot, "state": blocked, "reason": "overlap",
                                       "kind": "recorded", "fired_at": now}, made if dl else None, now)
                    recorded += 1
                    continue
                entry = new_run(s, job, slot, now, rid, "scheduled")
                if dl:
                    made[rid] = entry  # (a queue_full record may be trimmed by its own add)
                fired += 1
            else:
                recorded += record(s, job, [r], now)
        if heartbeat:
            deadlines.close_heartbeats(s, job, now, on_slot_recorded)
        job["cursor"] = upto
        job["next"] = nxt
        push_due(s, job)
    if dl:
        deadlines.on_fire(s, dl, set(stale_jobs), now, now, {e[0]: e[6] for e in checked if e[6]}, made)
    if stale_jobs:
        return ok(fired=fired, recorded=recorded, stale=stale, stale_jobs=stale_jobs)
    return ok(fired=fired, recorded=recorded, stale=stale)


def _recorded(s: SchedulerState, job: Record, entry: Record, made: dict[str, Record] | None, now: int) -> None:
    """A slot of the general path recorded instead of run (its overlap, a late_start skip): kept,
    told, counted, and offered to the job's children. ``made``: the fire's deadline entries.
    (The entry add_entry returns: its own trim may have dropped it already.)"""
    entry = add_entry(s, job, entry)
    if made is not None:
        made[entry["id"]] = entry
    on_slot_recorded(s, entry, now)
    job["stats"][RECORDED] += 1
    if job["name"] in s.pipes.children:
        pipehooks.notify(s, entry, now)


def check_fire_entry(e: object) -> None:
    """The full check of a fire entry in its map form (apply_fire's inline check passes the
    common shape without it). :raises InvalidCommand: naming what is wrong."""
    if not isinstance(e, dict):
        raise InvalidCommand("fire entry is not a map or a 7-item list")
    if not isinstance(e.get("job"), str) or not is_int(e.get("gen")) or not is_int(e.get("after")) or not is_int(e.get("upto")):
        raise InvalidCommand("fire entry needs job, gen, after, upto")
    runs, rec, nxt = e.get("runs"), e.get("rec"), e.get("next")
    if not isinstance(runs, list) or not all(is_int(s) for s in runs) or len(runs) > FIRE_ENTRY_RUNS_MAX:
        raise InvalidCommand("fire entry runs malformed")
    if runs != sorted(set(runs)) or (runs and (runs[0] <= e["after"] or runs[-1] > e["upto"])):
        raise InvalidCommand("fire entry runs must be ascending, unique and inside (after, upto]")
    if e["upto"] < e["after"]:
        # The cursor would move back and let slots already handled fire again.
        raise InvalidCommand("fire entry upto must not be before after")
    if nxt is not None and (not is_int(nxt) or nxt <= e["upto"]):
        raise InvalidCommand("fire entry next must be after upto")
    rec = check_records(rec, e["after"], e["upto"])
    check_disjoint(runs, rec)


def check_records(rec: object, after: int, upto: int) -> list[list[Any]]:
    """Records ``[state, reason, from_ms, to_ms, count]`` of slots in (after, upto], at most
    RECORDS_PER_ENTRY_MAX of them: ``rec``, checked. :raises InvalidCommand:"""
    if not isinstance(rec, list) or len(rec) > RECORDS_PER_ENTRY_MAX:
        raise InvalidCommand("records malformed")
    for r in rec:
        if not (isinstance(r, list) and len(r) == 5 and r[0] in ("skipped", "coalesced")
                and isinstance(r[1], str) and is_int(r[2]) and is_int(r[3])
                and (r[4] is None or (is_int(r[4]) and r[4] >= 1)) and after < r[2] <= r[3] <= upto):
            raise InvalidCommand("record malformed")
    return rec


def check_disjoint(runs: list[int], rec: list[list[Any]]) -> None:
    """Runs and records of one entry must cover disjoint slots: a slot is a run or recorded,
    once. (Checked before applying: an overlap would otherwise fail half-way, on a duplicate
    entry id, after some entries were already added.)"""
    spans = sorted([(s, s) for s in runs] + [(r[2], r[3]) for r in rec])
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        raise InvalidCommand("runs and records overlap")


# ------------------------------------------------------------------ overlap
def active_runs(s: SchedulerState, job: Record) -> list[Record]:
    """The job's queued and running runs (scans its history, which bounds them)."""
    out = []
    for rid in s.history.get(job["name"], ()):
        run = s.runs.get(rid)
        if run is not None and run["state"] in ("queued", "running"):
            out.append(run)
    return out


def overlap(s: SchedulerState, job: Record, new_id: str, now: int) -> str | None:
    """Apply the job's overlap policy to a slot about to become a run (DESIGN.md section 4).

    :returns: None to create the run, or the state ("skipped" / "coalesced") to record the
        slot as instead. ``replace`` revokes the active runs first: a running run's token
        goes stale (its heartbeat and completion are refused, its worker kills it).
    """
    if fires_ahead(job["spec"]):
        return None  # allow without max_concurrent: nothing here depends on other runs
    ov = job["spec"]["overlap"]
    policy = ov["policy"]
    active = active_runs(s, job)
    if policy == "allow":
        return "skipped" if len(active) >= ov["max_concurrent"] else None
    if policy == "forbid":
        return "skipped" if active else None
    if policy == "queue_one":
        return "coalesced" if any(r["state"] == "queued" for r in active) else None
    for run in active:  # replace
        revoke(s, run, now, f"replaced by run {new_id} (overlap policy replace)")
    return None


def revoke(s: SchedulerState, run: Record, now: int, why: str) -> None:
    """End a queued or running run as failed (overlap replace): a running one's lease ends with
    it, so its token goes stale."""
    if run["state"] == "running":
        if run["id"] in s._running_ids:  # a worker's lease (a heartbeat run a ping started holds none)
            deadlines.end_lease(s, run, now, False, why)
    else:
        unqueue_count(s, run)
    run.update(state="failed", error=why, finished_at=now, deadline=None)
    s.stats.on_finished("failed")
    on_replaced(s, run, why)
    deadlines.on_finish(s, run, now)
    if run["job"] in s.pipes.children:
        pipehooks.notify(s, run, now)


# ------------------------------------------------------------------ runs and records
def new_run(s: SchedulerState, job: Record, slot: int, now: int, rid: str, kind: str,
            due: int | None = None) -> Record:
    """A run of ``job`` for ``slot`` in the job's queue, due at ``due`` (its slot when None), or,
    when the queue is full and rejects, a record of the slot as skipped (``queue_full``). A full
    ``drop_oldest`` queue drops its oldest queued run first."""
    spec = job["spec"]
    qname = spec["queue"]
    if spec["executor"]["type"] == "heartbeat":
        # Runs nothing: no queue, no worker; it waits for its pings (core/deadlines.py).
        run = RUN_TEMPLATE.copy()
        run.update(id=rid, job=job["name"], slot=slot, kind=kind, queue=qname, priority=spec["priority"],
                   tenant=spec["tenant"], fired_at=now, due=slot, state="waiting")
        return add_entry(s, job, run)
    q = s.queues.get(qname, {"max_depth": limits.queue_depth_default, "on_full": "reject"})
    depth = s._queue_depth.get(qname, 0)
    lag = max(0, now - slot)
    if depth >= q["max_depth"]:
        if q["on_full"] == "reject":
            entry = add_entry(s, job, {
                "id": rid, "job": job["name"], "slot": slot, "state": "skipped",
                "reason": "queue_full", "kind": kind, "fired_at": now, "queue": qname,
            })
            on_slot_recorded(s, entry, now)
            if job["name"] in s.pipes.children:
                pipehooks.notify(s, entry, now)
            return entry
        dropped(s, drop_oldest_queued(s, qname, now), now)
    run = RUN_TEMPLATE.copy()
    run["id"] = rid
    run["job"] = job["name"]
    run["slot"] = slot
    run["kind"] = kind
    run["queue"] = qname
    run["priority"] = spec["priority"]
    run["tenant"] = spec["tenant"]
    run["fired_at"] = now
    run["due"] = slot if due is None else due
    if kind == "scheduled":
        # Fire lag is a property of the trigger: manual runs (lag 0 by definition) stay out.
        count_fire(job["stats"], lag)
    add_entry(s, job, run)
    enqueue(s, run)  # counts it in the queue's depth (re-read: drop_oldest may have lowered it)
    return run


def record(s: SchedulerState, job: Record, recs: list[list[Any]], now: int) -> int:
    """Record ranges of slots that did not become runs (``[state, reason, lo, hi, count]``)
    in the job's history. :returns: how many records were added."""
    n = 0
    for state, reason, lo, hi, count in recs:
        rid = f"{job['name']}@{lo}"
        entry = {"id": rid, "job": job["name"], "slot": lo, "state": state, "reason": reason,
                 "kind": "recorded", "fired_at": now}
        if hi != lo or count != 1:
            entry["slot_to"] = hi
            entry["count"] = count
        if "after" in job["spec"]:  # a gated job's own slots recorded: they wait for nothing more
            pipehooks.drop_joins(s, job["name"], lo, hi)
        add_entry(s, job, entry)
        on_slot_recorded(s, entry, now)
        job["stats"][RECORDED] += 1 if count is None else count
        n += 1
        if job["name"] in s.pipes.children:
            pipehooks.notify(s, entry, now)
    return n


def dropped(s: SchedulerState, run: Record | None, now: int) -> None:
    """A queued run a full ``drop_oldest`` queue dropped (recorded skipped / queue_full): a
    final outcome like any record's: told (slot.missed), its deadline judged, and offered to
    its job's children."""
    if run is None:
        return
    on_slot_recorded(s, run, now)
    deadlines.on_finish(s, run, now)
    if run["job"] in s.pipes.children:
        pipehooks.notify(s, run, now)


def add_entry(s: SchedulerState, job: Record, entry: Record) -> Record:
    """Keep a run or a record, newest last in its job's history (trimmed to its bound)."""
    rid = entry["id"]
    assert rid not in s.runs, f"I2: run id {rid} already exists"
    s.runs[rid] = entry
    s.stats.on_entry(entry)
    hist = s.history.setdefault(job["name"], [])
    if s._trim_clean:
        s._trim_clean.pop(id(hist), None)  # (it may add a finished entry: trim's scan cache)
    hist.append(rid)
    bound = job["spec"]["history"]
    if len(hist) > bound:
        trim(s, hist, bound)
    return entry


def trim(s: SchedulerState, hist: list[str], bound: int, full: bool = False, cached: bool = False) -> None:
    """Drop the oldest finished entries beyond the bound; queued/running ones stay.

    Dead runs are the dead-letter queue: they leave by requeue, delete or its own bound.

    The common case is O(1): the oldest entries are finished and go from the front. When the
    oldest entry is still queued, running or dead (a backlog, or the DLQ), finding finished
    entries behind it means scanning the history, so that scan runs only on every
    ``TRIM_SCAN_SLACK``-th entry past the bound (or when ``full``): behind such an entry,
    finished entries over the bound wait for at most that many more adds. (Scanning on every
    fire cost 30 % of a follower's time with 50 queued runs a job: scripts/measure profile-fire.)
    The rule reads only replicated state, so every replica trims the same entries.

    ``cached`` (the fire fast path's calls only): no scan of a history known to hold no entry
    trim may drop (``clean_history``): the scan cache, which is not state (the same entries go
    as with a full scan, on every replica).
    """
    excess = len(hist) - bound
    runs = s.runs
    while excess > 0:
        if runs[hist[0]]["state"] not in TRIMMABLE:
            break
        del runs[hist[0]]
        del hist[0]
        excess -= 1
    if excess <= 0 or (excess % TRIM_SCAN_SLACK and not full):
        return
    # The scan: the oldest ``excess`` finished entries go, wherever they are. Behind a backlog
    # it usually finds none (a sweep's runs all queued), so it looks first and rebuilds the
    # list only when something goes: the same entries go as a loop that rebuilt it each time.
    # Behind a backlog that grows for long (workers gone) it read every entry of every job
    # every TRIM_SCAN_SLACK slots: 18.5 us a slot with 600 queued runs a job; with the cache of
    # histories known clean, a scan reads a history once an epoch (docs/benchmarks.md).
    cache = _clean_histories(s) if cached and s._fast_paths else None
    if cache is not None and cache.get(id(hist)) is hist:
        return  # nothing in it trim may drop (clean_history)
    drop = [i for i, rid in enumerate(hist) if runs[rid]["state"] in TRIMMABLE]
    if not drop:
        if cache is not None:
            cache[id(hist)] = hist
        return
    if s._trim_clean:
        s._trim_clean.pop(id(hist), None)  # (entries go: it is no longer known clean)
    del drop[excess:]
    for i in drop:
        del runs[hist[i]]
    gone = set(drop)
    hist[:] = [rid for i, rid in enumerate(hist) if i not in gone]


def clean_history(s: SchedulerState, hist: list[str]) -> None:
    """Note that no entry of ``hist`` is one trim may drop (finished, not dead), so that the fire
    fast path's scans of it (trim, ``cached``) read nothing while that holds: until the epoch
    moves (SchedulerState._trim_epoch: every command that may finish a run) or the general path
    adds an entry to it (add_entry). Within one epoch only the fire fast path adds to such a
    history, and only queued runs."""
    _clean_histories(s)[id(hist)] = hist


def _clean_histories(s: SchedulerState) -> dict[int, list[str]]:
    """The scan cache of the histories known clean (clean_history), emptied when the epoch moved."""
    if s._trim_clean_epoch != s._trim_epoch:
        s._trim_clean.clear()
        s._trim_clean_epoch = s._trim_epoch
    return s._trim_clean
