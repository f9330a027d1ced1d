"""Backfills and bulk dead-letter operations: replicated objects that make runs for the past, or
act on the dead-letter queue, a step at a time (docs/backfill.md).

One mechanism for three kinds. A **backfill** runs a job for the slots of a past range
``[from, to)`` of its schedule: the ones that never ran (``reprocess: missing``), also the ones
whose last run failed or went dead (``failed``), or all of them (``all``), oldest or newest
first. A **requeue** queues the dead runs matching some filters again; a **purge** deletes them.
The object holds its request, a cursor and its counts, never the list of its slots: the leader's
stepper (node/backfills.py) proposes ``backfill_step`` (``dlq_bulk_step``) commands, each with the
next slots (dead runs) after the cursor; apply decides each one with the walk both sides share
(core/backfill_plan.py), makes the runs the budget allows (max_concurrent, the rate's token
bucket, the job queue's room, the overlap rule) and moves the cursor past what it handled.

A step planned from another cursor than the object's is dropped whole (``stale``), so a step
proposed twice, or by two leaders, or from a lagging view, never handles a slot twice: a slot is
before the cursor once handled, and the cursor only moves on. Apply computes no slot (I4): it
checks that a step's slots are in the range, after the cursor and in order.

Runs of a backfill have kind ``backfill``, name it (``run["backfill"]``), are due when created
(they queue behind what already waits) and get the id the slot's scheduled run would have had
(``job@slot``) when no entry has it, else ``job@slot#b<backfill>``: a backfill of ``missing`` can
never duplicate a slot that ran, because such a slot is left out (and its id is taken anyway).

The section ``backfills`` of the snapshot (version 4, written only when not empty) holds them, in
creation order; finished ones are kept up to ``limits.backfills_kept_max``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import backfill_plan, deadlines, limits, pipelines, schedule, snapshot
from .backfill_plan import (
    ACTIVE_STATES, FINISHED, MODES, ORDERS, OVERLAPS, BackfillWalk, BulkWalk, bucket_new,
    bucket_take, dead_matching, history_snapshot, job_of, live_active, queue_room,
)
from .backfill_model import check_not_heartbeat
from .model import REAL_STATES
from .errors import Conflict, InvalidCommand, LimitExceeded, NotFound
from .fire import add_entry, new_run
from .model import NAME_RE
from .notify import on_slot_recorded
from .queues import apply_dlq_delete, apply_dlq_requeue, enqueue, unqueue_count
from .records import RUN_TEMPLATE, Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState


# ------------------------------------------------------------------ the snapshot section
def _encode(section: dict[str, Record]) -> list[Record] | None:
    return list(section.values()) or None


def _decode(data: list[Record]) -> dict[str, Record]:
    return {bf["id"]: bf for bf in data}


snapshot.register(snapshot.Extension(name="backfills", new=dict, encode=_encode, decode=_decode))


# ------------------------------------------------------------------ field checks
def _id(cmd: Command) -> str:
    bf_id = cmd.get("name")
    if not isinstance(bf_id, str) or not bf_id or len(bf_id) > limits.backfill_id_chars_max \
            or not NAME_RE.fullmatch(bf_id):
        raise InvalidCommand(f"{cmd['op']} needs name, the backfill id")
    return bf_id


def _int_or_none(cmd: Command, key: str) -> int | None:
    v = cmd.get(key)
    if v is not None and not is_int(v):
        raise InvalidCommand(f"{cmd['op']}.{key} must be an integer or nil")
    return v


#: The largest rate_milli the API proposes (backfill_model._rate_milli): a larger one would make a
#: bucket's tokens, and the snapshot that holds them, overflow 64 bits.
RATE_MILLI_MAX = round(limits.backfill_rate_per_s_max * 1000)


def _rate(cmd: Command) -> int | None:
    rate = _int_or_none(cmd, "rate_milli")
    if rate is not None and not 1 <= rate <= RATE_MILLI_MAX:
        raise InvalidCommand(f"{cmd['op']}.rate_milli must be 1..{RATE_MILLI_MAX}")
    return rate


def _time_or_none(cmd: Command, key: str) -> int | None:
    """A time the API proposes (0..limits.time_ms_max, as schedule.parse_iso_ms bounds it), or nil."""
    v = _int_or_none(cmd, key)
    if v is not None and not 0 <= v <= limits.time_ms_max:
        raise InvalidCommand(f"{cmd['op']}.{key} must be a time in 0..{limits.time_ms_max}")
    return v


def _concurrent(cmd: Command, required: bool) -> int | None:
    n = cmd.get("max_concurrent")
    if n is None and not required:
        return None
    if not is_int(n) or not 1 <= n <= limits.backfill_concurrent_max:
        raise InvalidCommand(f"{cmd['op']}.max_concurrent must be 1..{limits.backfill_concurrent_max}")
    return n


def _jsonable(v: object, depth: int = 0) -> bool:
    """Whether a payload is made of what JSON holds (the executors send it as JSON)."""
    if depth > 32:
        return False
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, list):
        return all(_jsonable(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _jsonable(x, depth + 1) for k, x in v.items())
    return False


def _active_count(s: SchedulerState) -> int:
    return sum(1 for bf in s.backfills.values() if bf["state"] not in FINISHED)


def _record(bf_id: str, kind: str, job: str | None, req: dict[str, Any], plan: dict[str, Any], cursor: Any,
            planned: int, rate_milli: int | None, now: int) -> Record:
    """A new object, its fields in the order every replica writes them."""
    return {
        "id": bf_id, "kind": kind, "job": job, "state": "running", "paused_by": None, "reason": None,
        "created_at": now, "updated_at": now, "finished_at": None,
        "req": req, "plan": plan, "cursor": cursor, "exhausted": False,
        "planned": planned, "created": 0, "left_out": {}, "finished": {}, "active": [],
        "bucket": bucket_new(rate_milli, now),
    }


def _same_request(old: Record, kind: str, job: str | None, req: dict[str, Any],
                  limited_to: list[str] | None = None) -> Result:
    """The answer to a create whose id exists: the same request again is answered with the
    object as it is (created False); another request under that id is refused (the same body
    from a token limited to other tenants, or to none, is another request).
    :raises Conflict:"""
    if old["kind"] == kind and old["job"] == job and old["req"] == req and old.get("limited_to") == limited_to:
        return ok(id=old["id"], created=False, state=old["state"])
    # (not naming the other request's job: a backfill id is the cluster's, and the job may be
    # another tenant's)
    raise Conflict(f"backfill id {old['id']!r} is already used by another request; choose another id",
                   field="id")


def _bound_active(s: SchedulerState) -> None:
    if _active_count(s) >= limits.backfills_active_max:
        raise LimitExceeded(f"{limits.backfills_active_max} backfills and bulk operations are running or "
                            f"paused, the limit; cancel one or wait for one to finish", field="id")


def _limited_to(cmd: Command) -> list[str] | None:
    """``tenants``: the tenants of the token limited to them that asked (the proposer's), or nil."""
    v = cmd.get("tenants")
    if v is None:
        return None
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v) or v != sorted(set(v)):
        raise InvalidCommand(f"{cmd['op']}.tenants must be a sorted list of tenant names, or nil")
    return v


def _bound_tenant(s: SchedulerState, tenant: str) -> None:
    n = backfill_plan.limited_active(s)
    if n >= limits.backfills_limited_active_max:
        raise LimitExceeded(f"{n} backfills that tokens limited to tenants started are running or paused, the bound for "
                            f"them all (backfills_limited_active_max, {limits.backfills_limited_active_max}; the rest "
                            f"of the cluster's is kept for other tokens); cancel one or wait for one to finish",
                            field="id", limit=limits.backfills_limited_active_max)
    n = backfill_plan.tenant_active(s, tenant)
    if n >= limits.backfills_tenant_active_max:
        raise LimitExceeded(f"tenant {tenant!r} has {n} backfills running or paused, the bound for a token limited "
                            f"to tenants (backfills_tenant_active_max, {limits.backfills_tenant_active_max}); "
                            f"cancel one or wait for one to finish", field="id",
                            limit=limits.backfills_tenant_active_max)


# ------------------------------------------------------------------ backfill
def apply_backfill(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``backfill {name: id, job, from, to, reprocess, order, max_concurrent, rate_milli?,
    max_slots, overlap, payload?, planned, schedule, anchor, tenants?}``: a new backfill of ``job``'s slots
    in ``[from, to)``. ``schedule`` and ``anchor`` are the job's as the proposer saw them when it
    counted the range's slots (``planned``, at most ``max_slots``); the backfill keeps them, so its
    slots are the ones counted even if the job's schedule changes later. It also keeps what the
    job's history says of the range's slots now (backfill_plan.history_snapshot) and the job's
    cursor: slots after it are left out, not yet due, for good. An id that exists with the same
    request answers with that backfill (``created`` False). The backfill belongs to the job's
    tenant (``tenant``). ``tenants``: asked for by a token limited to them (``limited_to``): the
    job must be one of theirs (else as no such job), the job's tenant may have at most
    backfills_tenant_active_max active, and a cascade holds and counts only their children
    (core/pipelines.py _make_run).

    :raises InvalidCommand: a field missing or malformed. :raises NotFound: no such job (of
        ``tenants``). :raises Conflict: the id is used by another request, or the job's schedule
        is no longer the one planned with. :raises LimitExceeded: backfills_active_max are
        active, or (``tenants``) backfills_tenant_active_max of the job's tenant.
    :raises InvalidSpec: the job is a heartbeat job (field ``name``): nothing runs its slots."""
    bf_id = _id(cmd)
    job_name = cmd.get("job")
    lo, hi = cmd.get("from"), cmd.get("to")
    if not isinstance(job_name, str) or not is_int(lo) or not is_int(hi) \
            or not 0 <= lo < hi <= limits.time_ms_max:  # (a cursor, lo - 1, below int64 would fail every snapshot)
        raise InvalidCommand(f"backfill needs job and times 0 <= from < to <= {limits.time_ms_max}")
    reprocess, order, overlap = cmd.get("reprocess"), cmd.get("order"), cmd.get("overlap")
    if reprocess not in MODES or order not in ORDERS or overlap not in OVERLAPS:
        raise InvalidCommand("backfill needs reprocess, order and overlap")
    max_slots, planned = cmd.get("max_slots"), cmd.get("planned")
    if not is_int(max_slots) or not 1 <= max_slots <= limits.backfill_slots_max \
            or not is_int(planned) or not 0 <= planned <= max_slots:
        raise InvalidCommand(f"backfill needs max_slots 1..{limits.backfill_slots_max} and planned <= it")
    sched, anchor = cmd.get("schedule"), cmd.get("anchor")
    if not isinstance(sched, dict) or not is_int(anchor):
        raise InvalidCommand("backfill needs the job's schedule and anchor")
    req = {"from": lo, "to": hi, "reprocess": reprocess, "order": order,
           "max_concurrent": _concurrent(cmd, True), "rate_milli": _rate(cmd), "max_slots": max_slots,
           "overlap": overlap}
    if "payload" in cmd:
        if not _jsonable(cmd["payload"]):
            raise InvalidCommand("backfill.payload must be JSON data")
        req["payload"] = cmd["payload"]
    if "cascade" in cmd:  # pipelines: its runs' outcomes reach the job's children
        if cmd["cascade"] != "children":
            raise InvalidCommand("backfill.cascade must be children when given")
        req["cascade"] = "children"
    limited_to = _limited_to(cmd)
    old = s.backfills.get(bf_id)
    if old is not None:
        return _same_request(old, "backfill", job_name, req, limited_to)
    job = s.jobs.get(job_name)
    if job is None or (limited_to is not None and job["spec"]["tenant"] not in limited_to):
        raise NotFound(f"no job named {job_name!r}", field="name")
    if job["spec"].get("schedule") != sched or job["anchor"] != anchor:
        raise Conflict(f"job {job_name!r} was replaced with another schedule while this backfill was "
                       f"planned; send it again", field="name")
    check_not_heartbeat(job, "name", "backfill")
    _bound_active(s)
    if limited_to is not None:
        _bound_tenant(s, job["spec"]["tenant"])
    known, horizon = history_snapshot(s, job, lo, hi)
    plan = {"schedule": job["spec"]["schedule"], "anchor": anchor, "job_created": job["created"],
            "job_cursor": job["cursor"], "horizon": horizon, "known": known}
    cursor = lo - 1 if order == "oldest" else hi
    bf = s.backfills[bf_id] = _record(bf_id, "backfill", job_name, req, plan, cursor, planned, req["rate_milli"], now)
    bf["tenant"] = job["spec"]["tenant"]
    if limited_to is not None:
        bf["limited_to"] = limited_to
    if "cascade" in req:  # the children its runs' outcomes decide, held until its budget allows
        bf["held"] = {}
        bf["cascaded"] = 0
    return ok(id=bf_id, created=True, state="running")


def apply_backfill_step(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``backfill_step {name: id, after, slots, exhausted}``: the leader's next step of a
    backfill, planned from cursor ``after``: ``slots`` are the next slots of the range after it,
    in the backfill's order, and ``exhausted`` says the range holds no more after them. Each
    slot is run or left out (with its reason) as backfill_plan.BackfillWalk decides; the walk
    stops at the first slot the budget cannot run now, and the cursor moves past the slots
    handled. A full queue pauses the backfill (``paused_by: queue_full``) instead of dropping a
    run; a step resumes it once there is room. The step also counts the outcomes of the
    backfill's runs that finished, and ends the backfill (``done``) once its range is handled and
    none of its runs is queued or running. A step for a backfill that is paused by request or
    finished, or planned from another cursor, is dropped (``stale``); one for a job deleted
    since, or replaced by a heartbeat job, cancels the backfill.

    :raises NotFound: no such backfill. :raises InvalidCommand: slots not in order after the
        cursor, or outside the range (then nothing changes)."""
    bf = _object(s, cmd, ("backfill",))
    after, slots, exhausted = cmd.get("after"), cmd.get("slots"), cmd.get("exhausted")
    if not is_int(after) or not isinstance(slots, list) or len(slots) > limits.backfill_step_slots_max \
            or not isinstance(exhausted, bool):
        raise InvalidCommand(f"backfill_step needs after, at most {limits.backfill_step_slots_max} slots, exhausted")
    req = bf["req"]
    prev = after
    for slot in slots:
        if not is_int(slot):
            raise InvalidCommand("backfill_step slots must be integers")
        if req["order"] == "oldest":
            if not (prev < slot < req["to"]):
                raise InvalidCommand("backfill_step slots must ascend after the cursor and stay before to")
        elif not (req["from"] <= slot < prev):
            raise InvalidCommand("backfill_step slots must descend before the cursor and stay at or after from")
        prev = slot
    stale = _stale(bf, after)
    if stale is not None:
        return stale
    job = job_of(s, bf)
    if job is None:
        _finish(s, bf, "cancelled", now, f"job {bf['job']!r} was deleted")
        return ok(id=bf["id"], state="cancelled", created=0, left_out=0)
    if job["spec"]["executor"]["type"] == "heartbeat":  # replaced by one since: nothing runs its slots
        _refresh(s, bf)
        _finish(s, bf, "cancelled", now, f"job {bf['job']!r} became a heartbeat job (no worker runs its slots)")
        return ok(id=bf["id"], state="cancelled", created=0, left_out=0)
    _refresh(s, bf)
    walk = BackfillWalk(s, bf, job, now)
    # A cascade's held children first (their queues are theirs: a full queue of the job's own
    # that paused the backfill does not hold them back).
    released = pipelines.release_held(s, bf, walk.may_release, walk.took_child, now) if bf.get("held") else 0
    if bf["state"] == "paused":  # by a full queue: resumed when there is room
        if walk.depth >= walk.max_depth:
            bucket_take(bf["bucket"], now, released)
            res = ok(id=bf["id"], state="paused", created=0, left_out=0)
            if "held" in bf:
                res["children_queued"] = released
                res["children_held"] = len(bf["held"])
            return res
        bf.update(state="running", paused_by=None, reason=None)
    created = left = 0
    cursor, stopped = bf["cursor"], None
    # A cascade queues the children of the slots it ran before a new slot of its own.
    for slot in (() if bf.get("held") else slots):
        what, x = walk.next(slot)
        if what == "stop":
            stopped = x
            break
        if what == "left":
            bf["left_out"][x] = bf["left_out"].get(x, 0) + 1
            left += 1
        else:
            _backfill_run(s, bf, job, slot, x, now)
            walk.took()
            created += 1
        cursor = slot
    bucket_take(bf["bucket"], now, created + released)
    bf["cursor"] = cursor
    bf["updated_at"] = now
    if stopped == "queue_full":
        depth, max_depth = queue_room(s, walk.queue)
        bf.update(state="paused", paused_by="queue_full",
                  reason=f"queue {walk.queue!r} is full ({depth} runs, its max_depth {max_depth}); "
                         f"the backfill resumes when there is room")
    elif stopped is None and exhausted and not bf.get("held"):
        bf["exhausted"] = True
        bf["cursor"] = req["to"] - 1 if req["order"] == "oldest" else req["from"]
    _maybe_done(s, bf, now)
    res = ok(id=bf["id"], state=bf["state"], created=created, left_out=left)
    if "held" in bf:
        res["children_queued"] = released
        res["children_held"] = len(bf["held"])
    return res


def _backfill_run(s: SchedulerState, bf: Record, job: Record, slot: int, rid: str, now: int) -> None:
    """A backfill's run of ``slot``: queued in the job's queue, due now (behind what waits)."""
    spec = job["spec"]
    run = RUN_TEMPLATE.copy()
    run["id"] = rid
    run["job"] = job["name"]
    run["slot"] = slot
    run["kind"] = "backfill"
    run["queue"] = spec["queue"]
    run["priority"] = spec["priority"]
    run["tenant"] = spec["tenant"]
    run["fired_at"] = now
    run["due"] = now
    run["backfill"] = bf["id"]
    if "payload" in bf["req"]:
        run["payload"] = bf["req"]["payload"]
    if "cascade" in bf["req"]:
        run["propagate"] = True
    add_entry(s, job, run)
    enqueue(s, run)
    bf["active"].append(rid)
    bf["created"] += 1


# ------------------------------------------------------------------ bulk dead-letter operations
def apply_dlq_bulk(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``dlq_bulk {name: id, action, queue?, job?, error?, dead_from?, dead_to, max_count?,
    max_concurrent?, rate_milli?}``: a bulk operation on the dead runs that match the filters
    (queue, job, an error substring, dead between dead_from and dead_to) when its steps reach
    them, in DLQ order (finished_at, id), at most ``max_count``: ``action`` ``requeue`` queues
    each again with fresh budgets (as dlq_requeue does), ``purge`` deletes it (dlq_delete).
    ``planned`` counts the matching runs now. An id that exists with the same request answers
    with that operation (``created`` False).

    :raises InvalidCommand: a field missing or malformed. :raises Conflict: the id is used by
        another request. :raises LimitExceeded: backfills_active_max are active."""
    bf_id = _id(cmd)
    kind = cmd.get("action")
    if kind not in ("requeue", "purge"):
        raise InvalidCommand("dlq_bulk.action must be requeue or purge")
    req: dict[str, Any] = {}
    for key in ("queue", "job", "error"):
        v = cmd.get(key)
        if v is not None and not isinstance(v, str):
            raise InvalidCommand(f"dlq_bulk.{key} must be a string or nil")
        req[key] = v
    req["dead_from"] = _time_or_none(cmd, "dead_from")
    req["dead_to"] = _time_or_none(cmd, "dead_to")
    if req["dead_to"] is None:
        raise InvalidCommand("dlq_bulk needs dead_to")
    n = _int_or_none(cmd, "max_count")
    if n is not None and not 1 <= n <= limits.dlq_bulk_count_max:
        raise InvalidCommand(f"dlq_bulk.max_count must be 1..{limits.dlq_bulk_count_max}")
    req["max_count"] = n
    req["max_concurrent"] = _concurrent(cmd, kind == "requeue")
    req["rate_milli"] = _rate(cmd)
    old = s.backfills.get(bf_id)
    if old is not None:
        return _same_request(old, kind, req["job"], req)
    _bound_active(s)
    planned = len(dead_matching(s, req, None, n))
    s.backfills[bf_id] = _record(bf_id, kind, req["job"], req, {}, None, planned, req["rate_milli"], now)
    return ok(id=bf_id, created=True, state="running")


def apply_dlq_bulk_step(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``dlq_bulk_step {name: id, after, runs: [[finished_at, id], ...], exhausted}``: the next
    dead runs of a bulk operation after its cursor ``after`` (a key, or nil before the first),
    ascending by key, each acted on if it is still dead with that key and matches (else left out:
    ``gone``, ``not_dead``, ``filter``, ``no_job``, ``heartbeat_job``), within the budget (max_count, max_concurrent
    of a requeue's runs, the rate, a requeue's queue room); stale, paused and finished as
    backfill_step.

    :raises NotFound: no such operation. :raises InvalidCommand: keys malformed, not ascending
        after the cursor, or past dead_to."""
    bf = _object(s, cmd, ("requeue", "purge"))
    after, keys, exhausted = cmd.get("after"), cmd.get("runs"), cmd.get("exhausted")
    if not (after is None or _is_key(after)) or not isinstance(keys, list) \
            or len(keys) > limits.dlq_bulk_step_runs_max or not isinstance(exhausted, bool):
        raise InvalidCommand(f"dlq_bulk_step needs after, at most {limits.dlq_bulk_step_runs_max} runs, exhausted")
    prev = after
    for key in keys:
        if not _is_key(key) or (prev is not None and not key > prev) or key[0] > bf["req"]["dead_to"]:
            raise InvalidCommand("dlq_bulk_step runs must be [finished_at, id], ascending after the cursor, "
                                 "none after dead_to")
        prev = key
    stale = _stale(bf, after)
    if stale is not None:
        return stale
    _refresh(s, bf)
    if bf["state"] == "paused":
        bf.update(state="running", paused_by=None, reason=None)
    walk = BulkWalk(s, bf, now)
    acted = left = 0
    cursor, stopped, full_queue = bf["cursor"], None, ""  # full_queue: set with stopped
    for key in keys:
        what, x = walk.next(key)
        if what == "stop":
            stopped = x
            full_queue = s.runs[key[1]]["queue"]
            break
        if what == "left":
            bf["left_out"][x] = bf["left_out"].get(x, 0) + 1
            left += 1
        else:
            queue = s.runs[x]["queue"]
            one = {"op": "dlq_" + ("requeue" if bf["kind"] == "requeue" else "delete"), "run": x}
            if bf["kind"] == "requeue":
                apply_dlq_requeue(s, one, now)  # cannot refuse: next() checked the run and its job
                s.runs[x]["requeue"] = bf["id"]
                bf["active"].append(x)
            else:
                apply_dlq_delete(s, one, now)
            walk.took(queue)
            bf["created"] += 1
            acted += 1
        cursor = list(key)
    bucket_take(bf["bucket"], now, acted)
    bf["cursor"] = cursor
    bf["updated_at"] = now
    if stopped == "queue_full":
        depth, max_depth = queue_room(s, full_queue)
        bf.update(state="paused", paused_by="queue_full",
                  reason=f"queue {full_queue!r} is full ({depth} runs, its max_depth {max_depth}); "
                         f"the requeue resumes when there is room")
    elif stopped == "max_count" or (stopped is None and (exhausted or walk.count_left == 0)):
        bf["exhausted"] = True
        if stopped is None and exhausted:
            # The range is handled: the planned runs it never came to had left the dead-letter
            # queue before their turn (deleted with their job, requeued or deleted by hand), so
            # left out as gone, and created + left_out = planned (docs/backfill.md).
            short = bf["planned"] - bf["created"] - sum(bf["left_out"].values())
            if short > 0:
                bf["left_out"]["gone"] = bf["left_out"].get("gone", 0) + short
                left += short
    _maybe_done(s, bf, now)
    return ok(id=bf["id"], state=bf["state"], acted=acted, left_out=left)


def _is_key(k: object) -> bool:
    return isinstance(k, list) and len(k) == 2 and is_int(k[0]) and isinstance(k[1], str)


# ------------------------------------------------------------------ pause, resume, cancel
def apply_backfill_control(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``backfill_control {name: id, action}``: ``pause`` (no new run until resumed; its queued
    and running runs go on), ``resume``, or ``cancel`` (it ends: a backfill's queued runs are
    withdrawn, recorded skipped / cancelled, its running ones finish; a requeue's requeued runs
    stay queued). Pausing a paused one or resuming a running one changes nothing.

    :raises NotFound: no such backfill. :raises Conflict: it is done or cancelled already.
    :raises InvalidCommand: another action."""
    bf_id = _id(cmd)
    action = cmd.get("action")
    if action not in ("pause", "resume", "cancel"):
        raise InvalidCommand("backfill_control.action must be pause, resume or cancel")
    bf = s.backfills.get(bf_id)
    if bf is None:
        raise NotFound(f"no backfill {bf_id!r}", field="id")
    if bf["state"] in FINISHED:
        raise Conflict(f"backfill {bf_id!r} is {bf['state']} already", field="id", state=bf["state"])
    bf["updated_at"] = now
    if action == "pause":
        bf.update(state="paused", paused_by="user", reason="paused by request")
        return ok(id=bf_id, state="paused")
    if action == "resume":
        if bf["state"] == "paused":
            bf.update(state="running", paused_by=None, reason=None)
        return ok(id=bf_id, state="running")
    withdrawn = _withdraw(s, bf, now) if bf["kind"] == "backfill" else 0
    _refresh(s, bf)
    _finish(s, bf, "cancelled", now, "cancelled by request")
    return ok(id=bf_id, state="cancelled", withdrawn=withdrawn)


def _withdraw(s: SchedulerState, bf: Record, now: int) -> int:
    """A cancel's withdrawal: the backfill's runs still queued (a cascade's children's too) are
    recorded skipped, reason cancelled; its running ones finish. :returns: how many."""
    withdrawn = 0
    for rid in bf["active"]:
        run = s.runs.get(rid)
        if run is not None and run["state"] == "queued" and run.get("backfill") == bf["id"]:
            # (its own: not a later job's run under the same id, its job deleted and put again)
            unqueue_count(s, run)
            run.update(state="skipped", reason="cancelled", finished_at=now)
            s.stats.on_recorded("skipped", "cancelled")
            withdrawn += 1
            on_slot_recorded(s, run, now)
            deadlines.on_finish(s, run, now)
            pipelines.withdrawn(s, run, now)
    return withdrawn


# ------------------------------------------------------------------ a job deleted
def of_deleted_job(s: SchedulerState, name: str) -> list[Record]:
    """The backfills of job ``name`` still running or paused, as it is deleted (jobs.py): the
    outcomes of their finished runs are counted now, while those runs still exist."""
    out = [bf for bf in s.backfills.values()
           if bf["kind"] == "backfill" and bf["job"] == name and bf["state"] in ("running", "paused")]
    for bf in out:
        _refresh(s, bf)
    return out


def cancel_for_deleted_job(s: SchedulerState, bfs: list[Record], now: int) -> None:
    """Cancel the backfills ``of_deleted_job`` named, once the job and its runs are gone (its
    runs the delete took while active are counted ``forgotten``; a cascade's children's runs
    still queued are withdrawn, and those running finish, as for a cancel by request). Before, the next step cancelled them, which
    never came for one paused by request (its steps are dropped), and the outcomes of the runs
    the delete took were counted nowhere."""
    for bf in bfs:
        _withdraw(s, bf, now)  # a cascade's children's runs still queued, as a cancel's
        _refresh(s, bf)
        _finish(s, bf, "cancelled", now, f"job {bf['job']!r} was deleted")


# ------------------------------------------------------------------ shared
def _object(s: SchedulerState, cmd: Command, kinds: tuple[str, ...]) -> Record:
    bf_id = _id(cmd)
    bf = s.backfills.get(bf_id)
    if bf is None or bf["kind"] not in kinds:
        raise NotFound(f"no {' or '.join(kinds)} {bf_id!r}", field="id")
    return bf


def _stale(bf: Record, after: object) -> Result | None:
    """The result of a step that must be dropped (planned from another cursor, or for an object
    that is finished or paused by request), else None."""
    if bf["state"] in FINISHED or (bf["state"] == "paused" and bf["paused_by"] == "user") or bf["cursor"] != after:
        return ok(id=bf["id"], state=bf["state"], stale=True)
    return None


def _refresh(s: SchedulerState, bf: Record) -> None:
    """Count the outcomes of the runs that left the queue for good, and keep the active ones."""
    runs, keep, fin = s.runs, [], bf["finished"]
    for rid in bf["active"]:
        r = runs.get(rid)
        if r is None:
            fin["forgotten"] = fin.get("forgotten", 0) + 1  # trimmed from its history, or its job deleted
        elif r["state"] in ACTIVE_STATES:
            keep.append(rid)
        else:
            st = r["state"] if r["state"] in REAL_STATES else "skipped"
            fin[st] = fin.get(st, 0) + 1
    bf["active"] = keep


def _maybe_done(s: SchedulerState, bf: Record, now: int) -> None:
    if bf["state"] != "cancelled" and bf["exhausted"] and not bf.get("held") and live_active(s, bf["active"]) == 0:
        _refresh(s, bf)
        _finish(s, bf, "done", now, None)


def _finish(s: SchedulerState, bf: Record, state: str, now: int, reason: str | None) -> None:
    pipelines.drop_held(s, bf, now)  # a cascade that ends holding children records them (cancelled)
    bf.update(state=state, paused_by=None, reason=reason, finished_at=now, updated_at=now)
    finished = [b for b in s.backfills.values() if b["state"] in FINISHED]
    excess = len(finished) - limits.backfills_kept_max
    if excess > 0:
        for b in sorted(finished, key=lambda b: (b["finished_at"], b["id"]))[:excess]:
            del s.backfills[b["id"]]


# ------------------------------------------------------------------ trigger with a slot or a payload
def slot_not_come(name: str, slot: int) -> Conflict:
    """The refusal of a trigger of triggered job ``name`` (``after``, no schedule) for ``slot``,
    still to come: apply's (trigger_job_with) and the node's before it proposes."""
    return Conflict(f"slot {schedule.iso(slot) or slot} has not come: {name} runs after its parents, and its run "
                    "of a slot is made when they report it; a run now is a trigger without a slot", field="slot")


def trigger_job_with(s: SchedulerState, job: Record, cmd: Command, now: int) -> Result:
    """``trigger_job {name, slot?, payload?}`` with a slot or a payload (jobs.apply_trigger_job
    without them is unchanged). ``payload`` overrides the job's for this run; without ``slot``
    the run is the manual run ``job@now!manual-N`` it always was. With ``slot``, the
    run is for that scheduled time and is deduplicated like any slot: when the slot's run
    ``job@slot`` exists (or an earlier manual run of it, ``job@slot#manual``), the answer is that
    run (``created`` False); else the run gets ``job@slot`` when no entry has that id (a slot that
    was recorded, not run, has its record there), else ``job@slot#manual``. Its kind is
    ``manual``; it is due now.

    With ``rerun`` (and a slot): the slot runs again though its run ended (succeeded, or failed:
    cancelled, replaced; a record), as ``job@slot#manual`` or, that taken, ``job@slot#manual-N``;
    while a run of the slot has not ended (its own, a run by hand, a backfill's), the answer is
    that run (``created`` False): a slot never runs twice at once. Its newest run dead is refused:
    its place is the dead-letter queue, whose requeue runs it again (its children with it).

    :raises InvalidCommand: slot not an integer, payload not JSON data.
    :raises InvalidSpec: the job is a heartbeat job (field ``slot``, else ``payload``).
    :raises Conflict: the slot is after the job's cursor (its scheduled run is still to come), or
        a triggered job's slot is still to come, the job's queue is full, or (``rerun``) the
        slot's newest run is dead."""
    payload_given = "payload" in cmd
    payload = cmd.get("payload")
    if payload_given and not _jsonable(payload):
        raise InvalidCommand("trigger_job.payload must be JSON data")
    slot = cmd.get("slot")
    rerun = cmd.get("rerun", False)
    if type(rerun) is not bool or (rerun and slot is None):
        raise InvalidCommand("trigger_job.rerun must be a boolean, and needs a slot")
    check_not_heartbeat(job, "slot" if slot is not None else "payload", "trigger with a slot or a payload")
    name = job["name"]
    if slot is None:  # a manual run now, as without a payload (a full queue records it skipped)
        s.manual_seq += 1
        run = new_run(s, job, now, now, f"{name}@{now}!manual-{s.manual_seq}", "manual")
        if payload_given and run["state"] == "queued":
            run["payload"] = payload
        return ok(job=name, run=run["id"], state=run["state"], created=True)
    if not is_int(slot):
        raise InvalidCommand("trigger_job.slot must be an integer")
    if slot > job["cursor"] and "schedule" in job["spec"]:  # a triggered job's slots are its parents'
        raise Conflict(f"slot {slot} is after the cursor of job {name!r} ({job['cursor']}): the schedule "
                       f"has not handled it yet, and its run will come", field="slot", cursor=job["cursor"])
    if slot > now and "schedule" not in job["spec"]:
        # A triggered job's slot still to come: its run is made when its parents report it. A run
        # of it made now was granted at once and held its worker's slot until that time (no run
        # starts before its slot): a walk filled every slot of a cluster with eight of them, and
        # took the slot's id from the run its parents would make (a walk).
        raise slot_not_come(name, slot)
    base = f"{name}@{slot}"
    if rerun:
        entries = pipelines.slot_entries(s, name, slot)
        going = next((r for r in reversed(entries) if r["state"] in pipelines.UNFINISHED), None)
        if going is not None:
            return ok(job=name, run=going["id"], state=going["state"], created=False)
        ran = [r for r in entries if r.get("kind") != "recorded"]
        if ran and ran[-1]["state"] == "dead":
            dead = ran[-1]["id"]
            raise Conflict(f"run {dead} of slot {schedule.iso(slot)} is dead, in its queue's dead-letter queue: "
                           f"requeue it (raftsched requeue {dead}, POST /v1/dlq/{dead}/requeue) to run the slot "
                           "again (its children with it, when it propagates)",
                           field="rerun", run=dead)
    else:
        for rid in (base, base + "#manual"):
            r = s.runs.get(rid)
            if r is not None and r["kind"] != "recorded" and r["state"] in REAL_STATES:
                return ok(job=name, run=rid, state=r["state"], created=False)
    spec = job["spec"]
    depth, max_depth = queue_room(s, spec["queue"])
    if depth >= max_depth:  # (before any change: a refused command changes nothing)
        raise Conflict(f"queue {spec['queue']!r} is full ({depth} runs, its max_depth {max_depth})", field="queue")
    rid = pipelines.manual_slot_id(s, name, slot)
    run = RUN_TEMPLATE.copy()
    run["id"] = rid
    run["job"] = name
    run["slot"] = slot
    run["kind"] = "manual"
    run["queue"] = spec["queue"]
    run["priority"] = spec["priority"]
    run["tenant"] = spec["tenant"]
    run["fired_at"] = now
    run["due"] = now
    if payload_given:
        run["payload"] = payload
    if rerun and "after" in spec:  # (a child's slot run again: its parents' newest outcomes, as ctx.upstream)
        up = pipelines.newest_upstream(s, job, slot)
        if up is not None:
            run["upstream"] = up
    add_entry(s, job, run)
    enqueue(s, run)
    return ok(job=name, run=rid, state="queued", created=True)
