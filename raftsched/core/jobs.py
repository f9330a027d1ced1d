"""The job registry's commands: put (one or many), delete, pause, resume and a manual trigger.

A command carries what only its proposer may compute (node/service.py): the full validation of
the spec (cron, zoneinfo) and the job's first slots. Apply checks only the shape of what it
is given (I4): it must not depend on a replica's library versions.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import deadlines, limits, pipehooks
from .due import push_due
from .errors import Conflict, InvalidCommand, InvalidSpec, LimitExceeded, NotFound, StaleReplace
from .fire import check_disjoint, check_records, new_run, record, trim
from .model import MISFIRE_POLICIES, OVERLAP_POLICIES, is_name
from .queries import floor_of, kept_position, position_digest, same_but_jitter
from .queues import claim_queue, index_job, remove_dead, unindex_job, unqueue_count
from .backfills import cancel_for_deleted_job, of_deleted_job, trigger_job_with
from .events import emit
from .notify import on_slot_recorded, pause, resume_held
from .notify_model import check_job_fields
from .records import Record, Result, is_int, job_record, ok, share_int, share_spec
from .tenants import LIMITED
from .pipelines import below, check_delete, check_edges, forget_held, on_delete, on_put
from .pipelines import UNFINISHED, propagates as pipelines_propagates
from .pipeline_model import check_stored_after

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: The schedule a triggered job's spec stands for when checked (never stored).
_NO_SCHEDULE: Record = {}


#: The retry block's numbers and their least values (model.validate_retry).
_RETRY_NUMBERS = (("backoff_s", 0), ("backoff_multiplier", 1), ("backoff_max_s", 0), ("jitter", 0))


def _number_at_least(v: object, lo: int) -> bool:
    """A finite int or float (not a bool) of at least ``lo``."""
    return (type(v) is int or type(v) is float) and lo <= v < math.inf


def check_stored_spec(spec: object) -> None:
    """A structural guard on a spec inside a command. Full validation (cron, zoneinfo) runs
    on the proposer only: apply must not depend on a replica's library versions (I4)."""
    if not isinstance(spec, dict):
        raise InvalidCommand("spec is not a map")
    check_stored_after(spec)  # a triggered job (after, no schedule) has no schedule
    sched = spec.get("schedule", _NO_SCHEDULE)
    if not isinstance(sched, dict) or not ("after" in spec and sched is _NO_SCHEDULE) and not (
        isinstance(sched.get("cron"), str) or is_int(sched.get("every_s")) or is_int(sched.get("at"))
    ):
        raise InvalidCommand("spec.schedule is malformed")
    for key, typ in (("executor", dict), ("misfire", dict), ("retry", dict)):
        if not isinstance(spec.get(key), typ):
            raise InvalidCommand(f"spec.{key} is malformed")
    for key in ("queue", "tenant"):
        if not is_name(spec.get(key)):
            raise InvalidCommand(f"spec.{key} is malformed")
    for key in ("priority", "timeout_s", "history"):
        if not is_int(spec.get(key)):
            raise InvalidCommand(f"spec.{key} is malformed")
    # What apply computes with, bounded as model.validate_job bounds it: a trim to a history
    # under 1, an interval of 0 s, a retry or an executor without its fields would fail in a
    # later command, after it had changed the state (a refusal half-applied).
    if spec["history"] < 1 or spec["timeout_s"] < 1:
        raise InvalidCommand("spec.history and spec.timeout_s must be at least 1")
    if "every_s" in sched and not (is_int(sched["every_s"]) and sched["every_s"] >= limits.every_s_min):
        raise InvalidCommand("spec.schedule.every_s is malformed")
    if not isinstance(spec["executor"].get("type"), str):
        raise InvalidCommand("spec.executor.type is malformed")
    r = spec["retry"]
    if not (is_int(r.get("max_attempts")) and r["max_attempts"] >= 1
            and all(_number_at_least(r.get(k), lo) for k, lo in _RETRY_NUMBERS)):
        raise InvalidCommand("spec.retry is malformed")
    ov = spec.get("overlap")
    if ov is not None and (not isinstance(ov, dict) or ov.get("policy") not in OVERLAP_POLICIES
                           or ("max_concurrent" in ov and not is_int(ov["max_concurrent"]))):
        raise InvalidCommand("spec.overlap is malformed")
    if "jitter_ms" in sched and (not is_int(sched["jitter_ms"]) or not isinstance(sched.get("jitter_key"), str)):
        raise InvalidCommand("spec.schedule jitter is malformed")
    # Secret values are sealed bytes (core/seal_keys.py), or strings in clear from a journal
    # written before sealing: opaque either way, here.
    if "secrets" in spec and not (isinstance(spec["secrets"], dict)
                                  and all(isinstance(v, (str, bytes)) for v in spec["secrets"].values())):
        raise InvalidCommand("spec.secrets is malformed")
    for key in ("env", "headers"):
        m = spec["executor"].get(key)
        if m is not None and not (isinstance(m, dict) and all(isinstance(v, (str, bytes)) for v in m.values())):
            raise InvalidCommand(f"spec.executor.{key} is malformed")
    if "keep_output" in spec and not isinstance(spec["keep_output"], bool):
        raise InvalidCommand("spec.keep_output is malformed")
    d = spec.get("deadline")
    if d is not None and not (isinstance(d, dict) and all(
            is_int(d[k]) and d[k] > 0 for k in ("start_within_s", "succeed_within_s", "max_since_success_s") if k in d)
            and ("succeed_by" not in d or isinstance(d["succeed_by"], str))):
        raise InvalidCommand("spec.deadline is malformed")
    if LIMITED in spec and spec[LIMITED] is not True:
        raise InvalidCommand(f"spec.{LIMITED} is malformed")
    check_job_fields(spec)  # notify, pause_on_failure, metrics (routing reads them at apply)
    m = spec["misfire"]
    if m.get("policy") not in MISFIRE_POLICIES or not is_int(m.get("grace_s")) or not is_int(m.get("max_catchup")) \
            or m["grace_s"] < 0 or m["max_catchup"] < 0:
        raise InvalidCommand("spec.misfire is malformed")
    labels = spec.get("labels")
    if labels is not None and (not isinstance(labels, dict) or len(labels) > limits.job_labels_max
                               or not all(type(k) is str and type(v) is str for k, v in labels.items())):
        raise InvalidCommand("spec.labels is malformed")
    # Placement (docs/workers.md): acquire compares its labels with a worker's, so its shape is
    # what apply relies on (I18).
    pl = spec.get("placement")
    if pl is not None and not (isinstance(pl, dict) and isinstance(pl.get("labels"), dict)
                               and all(isinstance(k, str) and isinstance(v, str) for k, v in pl["labels"].items())):
        raise InvalidCommand("spec.placement is malformed")


def check_put_job(cmd: Command, what: str) -> None:
    """The shape of one put_job payload (the put_job command itself, or an item of put_jobs)."""
    name, spec = cmd.get("name"), cmd.get("spec")
    if not is_name(name):
        raise InvalidCommand(f"{what} needs name")
    try:
        check_stored_spec(spec)
    except InvalidCommand as e:
        raise InvalidCommand(f"{what}: {e.message}") from None
    nxt, cursor, anchor = cmd.get("next"), cmd.get("cursor"), cmd.get("anchor")
    if nxt is not None and not is_int(nxt):
        raise InvalidCommand(f"{what}.next must be an integer or nil")
    claim = cmd.get("claim")
    if claim is not None and (not isinstance(claim, str) or not claim):
        raise InvalidCommand(f"{what}.claim must be a tenant name or nil")
    if not is_int(cursor) or not is_int(anchor):
        raise InvalidCommand(f"{what} needs cursor and anchor")
    was = cmd.get("was")
    if was is not None and not (is_int(was) and is_int(nxt) and nxt > cursor):
        raise InvalidCommand(f"{what}.was must be an integer, with a next slot after the cursor")
    if cmd.get("paused") is not None and cmd.get("paused") is not True:
        raise InvalidCommand(f"{what}.paused must be true or nil")
    by = cmd.get("by")
    if by is not None and not (isinstance(by, str) and len(by) <= limits.pause_by_chars_max):
        raise InvalidCommand(f"{what}.by must be a token id or nil")


def apply_put_job(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_job {name, spec, next, cursor, anchor, create_only?, claim?, was?}``: create
    or replace a job. ``spec`` is model.validate_job's output; ``cursor``, ``anchor`` and
    ``next`` are the proposer's first position for it (policy.initial_position,
    schedule.next_slot_after). A replace with the same schedule keeps the job's position
    whatever the command says; one that changes only the schedule's jitter takes the command's
    (queries.rejitter_position) if the job is still where it was planned from (``was``: a
    digest of its gen, cursor and next), else it is refused as stale; with another schedule,
    its cursor never moves back. A replace keeps the job's counters and pause. With ``paused``
    (true), the job is paused by the same command (reason ``manual``): created paused, it fires
    nothing until a resume (a migration imports its jobs so, and cuts over with resumes).
    A replace into another tenant first gives the job's recorded slots its old tenant (runs have
    theirs already): its history stays the old tenant's. With ``claim`` (a tenant, written by a
    proposer for a token limited to tenants), the job's queue becomes that tenant's if it has
    no owners yet (queues.claim_queue).

    :raises InvalidCommand: a field missing or malformed (the spec's shape only, I4).
    :raises Conflict: ``create_only`` and the job exists.
    :raises LimitExceeded: a new job beyond jobs_max."""
    check_put_job(cmd, "put_job")
    return put_job(s, cmd, now)


def put_job(s: SchedulerState, cmd: Command, now: int, pending: dict[str, Record] | None = None) -> Result:
    """Create or replace one job from a payload ``check_put_job`` accepted (a put_job command,
    or an item of put_jobs). :raises Conflict: create_only and the job exists.
    :raises LimitExceeded: a new job beyond jobs_max. Either raises before any change."""
    name, spec = cmd["name"], cmd["spec"]
    nxt, cursor, anchor = cmd.get("next"), cmd["cursor"], cmd["anchor"]
    create_only = bool(cmd.get("create_only"))
    jobs = s.jobs
    old = jobs.get(name)
    if old is not None and create_only:
        raise Conflict(f"job {name!r} exists", field="name")
    if old is None and len(jobs) >= limits.jobs_max:
        raise LimitExceeded(f"the cluster holds {limits.jobs_max} jobs, its limit", field="name")
    tenant = spec["tenant"]
    if spec.get(LIMITED) is True and (old is None or old["spec"]["tenant"] != tenant) \
            and len(s._tenant_names.get(tenant, ())) >= limits.jobs_per_tenant_max:
        raise LimitExceeded(tenant_full(tenant), field="tenant")
    if old is not None:
        s._trim_epoch += 1  # a replace may finish its runs (fire.trim's scan cache; state._RUNS_UNTOUCHED)
    if "after" in spec:
        check_edges(s, name, spec, pending)  # I4: the edges against this replica's jobs, alike everywhere
    kept = kept_position(old, spec.get("schedule"))
    was = cmd.get("was")
    if kept is None and was is not None:
        # Only the jitter changed: the proposer's position (queries.rejitter_position; apply
        # computes no slot, I4), as long as nothing fired, replaced or deleted the job since.
        if old is None or not same_but_jitter(old["spec"].get("schedule"), spec.get("schedule")) \
                or was != position_digest(old) or anchor != old["anchor"] or f"{name}@{nxt}" in s.runs:
            # (the last: a trigger of that slot by hand since, which moves none of the three)
            raise StaleReplace(f"job {name!r} fired or was replaced while this change of its jitter was "
                               "planned; send it again", field="name", stale=True)
        kept = (cursor, anchor, nxt)
    floor = floor_of(s, old) if kept is None and old is not None else None  # (one history scan)
    if kept is not None:
        # Same schedule: keep the cursor and next slot, so a replace never re-fires a slot
        # nor loses a pending one.
        cursor, anchor, nxt = kept
    elif floor is not None and floor > cursor:
        # Another schedule: its slots start after the old one's cursor, which may be ahead of
        # the one this replace was planned from (fired ahead, up to 4 s), and after the slots
        # its history holds (a triggered job's, which take its parents' slots), so that no new
        # slot can take the id of a run already made (I2). The proposer plans from the same
        # floor (queries.cursor_floor); when its replica lagged and the command's next slot is
        # not after the cursor, the replace is refused rather than stored with a next slot
        # behind its cursor.
        cursor = floor
        if nxt is not None and nxt <= cursor:
            raise StaleReplace(
                f"job {name!r} fired up to {cursor} while this replace was planned from an older "
                f"view; send it again", field="name", stale=True)
    if old is not None and old["spec"]["tenant"] != spec["tenant"]:
        # A run belongs to the tenant its job had when the run was made, everywhere: a recorded
        # slot carries none of its own (its job's is read), so it is given the old one now.
        was, runs = old["spec"]["tenant"], s.runs
        for rid in s.history.get(name, ()):
            r = runs[rid]
            if r.get("tenant") is None:
                r["tenant"] = was
    if "claim" in cmd:
        claim_queue(s, spec["queue"], cmd["claim"])
    s.gen += 1
    ints = s._ints
    spec = share_spec(spec, s._parts, ints)
    # A replace keeps the name object the job map holds as its key (assigning to a key keeps
    # the first key object): runs hold it (fire.py), and look their job up by identity.
    job = job_record(old["name"] if old else name, spec, s.gen, old["created"] if old else now, now,
                     share_int(anchor, ints), share_int(cursor, ints), share_int(nxt, ints),
                     old["paused"] if old else False,
                     old["stats"] if old else [0, 0, None, 0, 0])  # see records.STATS_FIELDS
    if old is None:
        s._names.add(name)
        index_job(s, name, spec)
    elif old["spec"]["tenant"] != spec["tenant"] or old["spec"]["queue"] != spec["queue"]:
        unindex_job(s, name, old["spec"])
        index_job(s, name, spec)
    jobs[name] = job
    if spec.get("metrics"):  # the per-job gauges' jobs, kept so a scrape walks only them
        s._metric_jobs[name] = None
    else:
        s._metric_jobs.pop(name, None)
    if "placement" in spec:  # the jobs whose runs may wait for a worker (worker_queries.unplaceable)
        s._placed_jobs[name] = None
    else:
        s._placed_jobs.pop(name, None)
    if "after" in spec or (old is not None and "after" in old["spec"]):
        on_put(s, name, old, spec, now)
    if old is not None and old["spec"]["executor"]["type"] == "heartbeat" != spec["executor"]["type"]:
        # Nothing pings its runs any more: those still open end now (else a started one would
        # stay running for good, and an overlap policy would count it).
        deadlines.close_heartbeats(s, job, now, on_slot_recorded, 0, "the job is no longer a heartbeat job")
    elif old is not None and spec["executor"]["type"] == "heartbeat" != old["spec"]["executor"]["type"]:
        withdraw_queued(s, job, now)
    # A job's history list is made by its first entry (fire.add_entry), not here: an empty list
    # and its map entry cost ~110 bytes a job (1M jobs never fired: 105 MiB). The snapshot
    # writes no empty history, so a replica that made one writes the same bytes.
    hist = s.history.get(name)
    if hist is not None and len(hist) > spec["history"]:
        # A replace may lower the bound: trim now, not at the next fire.
        trim(s, hist, spec["history"], full=True)
    paused = cmd.get("paused") is True and not job["paused"]
    if paused:
        # (before its deadline watch and the due index: a job made paused never fires, and is
        # judged as paused)
        if s.sinks:
            emit(s, "job.paused", now, job=name, reason="manual")
        pause(s, job, now, ("manual", cmd.get("by"), None))
    push_due(s, job)
    if "deadline" in spec or name in s.deadlines.since:
        deadlines.watch_since(s, job, now)
    if paused:
        return ok(job=name, gen=job["gen"], created=old is None, paused=True)
    return ok(job=name, gen=job["gen"], created=old is None)


def apply_put_jobs(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_jobs {jobs: [put_job payload, ...]}``: create or replace several jobs in one
    command, in the order given (a chunk of POST /v1/jobs:batch). Each item is applied exactly
    as a put_job command with the same fields would be.

    Every item is checked, and the jobs limit for all of them, before anything changes: a
    malformed item, or more new jobs than the cluster may still hold, refuses the whole
    command. An item whose job exists while it says ``create_only`` is refused alone (a
    conflict, listed by index in ``conflicts``), and so is a replace planned from a view older than
    the job's cursor (listed in ``stale``, see put_job); the others apply. The result is compact
    (it is kept with the request id for retries): per item, its generation (None when
    refused) and whether it created the job.

    :raises InvalidCommand: no items, more than put_jobs_items_max, or one malformed.
    :raises LimitExceeded: the new jobs would exceed jobs_max."""
    items = cmd.get("jobs")
    if not isinstance(items, list) or not items or len(items) > limits.put_jobs_items_max:
        raise InvalidCommand(f"put_jobs needs a list of 1-{limits.put_jobs_items_max} jobs")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidCommand(f"put_jobs.jobs[{i}] is not a map")
        check_put_job(item, f"put_jobs.jobs[{i}]")
    new = {item["name"] for item in items if item["name"] not in s.jobs}
    if len(s.jobs) + len(new) > limits.jobs_max:
        raise LimitExceeded(f"{len(new)} new jobs would exceed the cluster's limit of {limits.jobs_max}",
                            field="jobs")
    over = tenant_overflow(s, [(item["name"], item["spec"]) for item in items])
    if over is not None:
        raise LimitExceeded(tenant_full(*over), field="jobs")
    # Parents may come later in the same batch (raftsched sync orders them first, a crontab
    # import need not): edges are checked against the state and the whole batch.
    pending = {item["name"]: item["spec"] for item in items} if any("after" in it["spec"] for it in items) else None
    gens: list[int | None] = []
    created: list[bool] = []
    conflicts: list[int] = []
    stale: list[int] = []
    invalid: list[list[Any]] = []
    for i, item in enumerate(items):
        try:
            res = put_job(s, item, now, pending)
        except InvalidSpec as e:
            if all(g is None for g in gens):
                raise  # nothing stored yet: the whole command is refused, and changes nothing
            # Its edges fail against what an earlier item did or could not do (a parent's
            # children now at their limit, a job it could not replace: _refused_item), or
            # against a change applied since the proposer checked them: refused alone, since
            # earlier items are stored already.
            gens.append(None)
            created.append(False)
            invalid.append([i, e.message])
            _refused_item(s, pending, item["name"])
            continue
        except StaleReplace:
            gens.append(None)
            created.append(False)
            stale.append(i)
            _refused_item(s, pending, item["name"])
            continue
        except Conflict:
            gens.append(None)
            created.append(False)
            conflicts.append(i)
            _refused_item(s, pending, item["name"])
            continue
        if pending is not None:
            pending[item["name"]] = item["spec"]
        gens.append(res["gen"])
        created.append(res["created"])
    extra: dict[str, Any] = {}
    if stale:  # only then: a result without it keeps the bytes it always had
        extra["stale"] = stale
    if invalid:  # [index, why]: as stale
        extra["invalid"] = invalid
    return ok(gen=gens, created=created, conflicts=conflicts, **extra)


def tenant_overflow(s: SchedulerState, specs: list[tuple[str, Record]]) -> tuple[str, int] | None:
    """The first tenant (by name) that the specs a limited token wrote (``LIMITED``) would take
    past jobs_per_tenant_max, with how many jobs they bring into it (created, or moved from
    another tenant), or None. Apply (put_jobs) and the proposer's batch check count alike."""
    moved: dict[str, int] = {}
    for name, spec in specs:
        if spec.get(LIMITED) is True:
            old = s.jobs.get(name)
            if old is None or old["spec"]["tenant"] != spec["tenant"]:
                moved[spec["tenant"]] = moved.get(spec["tenant"], 0) + 1
    for tenant in sorted(moved):
        if len(s._tenant_names.get(tenant, ())) + moved[tenant] > limits.jobs_per_tenant_max:
            return tenant, moved[tenant]
    return None


def tenant_full(tenant: str, adding: int = 1) -> str:
    """Why a token limited to tenants may not bring ``adding`` more jobs into ``tenant``."""
    what = "a new job" if adding == 1 else f"{adding} new jobs"
    return (f"{what} would take tenant {tenant!r} past {limits.jobs_per_tenant_max} jobs, the most a token limited "
            f"to tenants may bring a tenant to; delete some, or ask an admin (a token without tenants) to put it")


def _refused_item(s: SchedulerState, pending: dict[str, Record] | None, name: str) -> None:
    """A batch item refused: the later items' edges are checked against the job as it is
    stored, not against the spec that was refused (a cycle could otherwise be stored). (The
    earlier items were checked against it: a batch orders parents first, raftsched sync does.)"""
    if pending is not None:
        if name in s.jobs:
            pending[name] = s.jobs[name]["spec"]
        else:
            pending.pop(name, None)


def _job(s: SchedulerState, cmd: Command) -> Record:
    name = cmd.get("name")
    if not isinstance(name, str):
        raise InvalidCommand(f"{cmd['op']} needs name")
    job = s.jobs.get(name)
    if job is None:
        raise NotFound(f"no job named {name!r}", field="name")
    return job


def apply_delete_job(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``delete_job {name, force?}``: the job and its history go; its queued runs leave their queues,
    its running runs lose their leases (their heartbeats and completions are refused), its dead
    runs leave the DLQ; the result counts them (``runs_ended``, when any). A job other jobs run after (pipelines) is deleted only with ``force``:
    then the slots its children wait on it for are recorded ``dependency_missing``.

    :raises NotFound: no such job. :raises Conflict: it has dependents and no ``force``."""
    job = _job(s, cmd)
    name = job["name"]
    if name in s.pipes.children:
        check_delete(s, name, cmd.get("force") is True)
    doomed = of_deleted_job(s, name)
    unfinished: set[int] = set()  # the slots of its runs taken before their final outcome (pipelines)
    has_children = name in s.pipes.children
    queued = running = dead = 0
    for rid in s.history.pop(name, []):
        run = s.runs.pop(rid, None)
        if has_children and run is not None and run["state"] in UNFINISHED and pipelines_propagates(run):
            unfinished.add(run["slot"])
        if run is not None and run["state"] == "queued":
            s._queue_depth[run["queue"]] = s._queue_depth.get(run["queue"], 1) - 1
            queued += 1
        elif run is not None and run["state"] == "running" and rid in s._running_ids:
            # Its lease dies with it (a heartbeat job's started run holds none): the worker's heartbeat and completion are refused.
            s._running_count[run["queue"]] = s._running_count.get(run["queue"], 1) - 1
            s._running_ids.pop(run["id"], None)
            running += 1
        elif run is not None and run["state"] == "dead":
            # Out of its queue's DLQ index too: a stale id there would count against
            # dlq_per_queue_max (and purge a live dead run early) on this replica only.
            remove_dead(s, run)
            dead += 1
    if job["paused"]:
        s._paused_count -= 1
        s.pauses.pop(name, None)
    s._metric_jobs.pop(name, None)
    s._placed_jobs.pop(name, None)
    s._names.discard(name)
    unindex_job(s, name, job["spec"])
    del s.jobs[name]
    cancel_for_deleted_job(s, doomed, now)
    for bf in s.backfills.values():
        if bf["job"] == name and bf["state"] in ("running", "paused"):
            # (a bulk DLQ operation's job filter; a backfill journalled by older code, its
            # next step cancels it: backfill_plan.job_of)
            bf["job_gone"] = True
    if s.pipes.held:
        forget_held(s, name)
    deadlines.forget_job(s, name, now)
    s.health.pop(name, None)
    if name in s.pipes.children or "after" in job["spec"] or name in s.pipes.joins:
        on_delete(s, name, job["spec"], now, tuple(sorted(unfinished)))
    if queued or running or dead:
        # What went with it, for its answer (a walk: a running run killed, and nothing said so)
        return ok(job=name, deleted=True, runs_ended={"queued": queued, "running": running, "dead": dead})
    return ok(job=name, deleted=True)


def apply_pause_job(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``pause_job {name, by?, note?}``: no slot fires until resume; ``by`` (the token id that
    asked) and ``note`` are kept as why (notify.PAUSE_FIELDS) by the pause that pauses it. Runs fired ahead for slots after now
    (still queued, not yet startable) are held: no worker takes them until the resume decides
    them (notify.pause); ``held`` counts them.

    :raises NotFound: no such job."""
    job = _job(s, cmd)
    by, note = cmd.get("by"), cmd.get("note")
    if by is not None and not (isinstance(by, str) and len(by) <= limits.pause_by_chars_max):
        raise InvalidCommand("pause_job.by must be a token id or nil")
    if note is not None and not (isinstance(note, str) and 1 <= len(note) <= limits.pause_note_chars_max):
        raise InvalidCommand(f"pause_job.note must be a string of 1-{limits.pause_note_chars_max} characters or nil")
    if not job["paused"] and s.sinks:
        if note is None:
            emit(s, "job.paused", now, job=job["name"], reason="manual")
        else:  # (the operator's words reach whoever is told: "paused for the migration")
            emit(s, "job.paused", now, job=job["name"], reason="manual", note=note)
    held = pause(s, job, now, ("manual", by, note))
    if held:
        return ok(job=job["name"], paused=True, held=held)
    return ok(job=job["name"], paused=True)


def apply_resume_job(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``resume_job {name, catch_up, gen?, after?, upto?, next?, rec?}``: resume a paused job.
    Slots that fell due while paused are recorded as skipped (paused), as the proposer planned
    them from its view (policy.plan_resume: ``gen`` and ``after`` are the generation and cursor
    it planned from, ``rec`` its records of slots in (after, upto], ``next`` the next slot),
    unless ``catch_up``, in which case the misfire policy decides for them at the next fire. A
    triggered job (no schedule) has no slot to plan: its command carries no plan either way.
    The runs the pause held are released, but those whose slot came while paused, which are
    recorded skipped (paused) unless ``catch_up`` (notify.resume_held); ``released`` and
    ``skipped`` count them when there were any, and ``recorded`` the slots recorded skipped
    (paused) by the plan. A job that is not paused is left as it is.

    :raises NotFound: no such job. :raises Conflict: the job changed since the proposer looked.
    :raises InvalidCommand: malformed next, upto or records (then nothing is recorded)."""
    job = _job(s, cmd)
    if not job["paused"]:
        return ok(job=job["name"], paused=False)
    catch_up = bool(cmd.get("catch_up"))
    recorded = 0
    if not catch_up and "schedule" in job["spec"]:  # (a triggered job has no slot to plan)
        nxt, rec = cmd.get("next"), cmd.get("rec")
        if nxt is not None and not is_int(nxt):
            raise InvalidCommand("resume_job.next must be an integer or nil")
        if cmd.get("gen") != job["gen"] or cmd.get("after") != job["cursor"]:
            raise Conflict("the job changed while resuming; retry", field="name")
        upto = cmd.get("upto", now)
        if not is_int(upto):
            raise InvalidCommand("resume_job.upto must be an integer")
        upto = max(job["cursor"], upto)
        if nxt is not None and nxt <= upto:
            # (the cursor would pass slots never fired, or the next fire look at ones recorded)
            raise InvalidCommand("resume_job.next must be after upto")
        # Validate every record before recording any: a refused command changes nothing,
        # and a record may only cover slots after the cursor (no slot handled twice).
        rec = rec or []
        check_records(rec, job["cursor"], upto)
        check_disjoint([], rec)
        if rec:
            record(s, job, rec, now)
        recorded = sum(1 if r[4] is None else r[4] for r in rec)
        job["cursor"] = upto
        job["next"] = nxt
    job["paused"] = False
    s._paused_count -= 1  # it was paused (checked above)
    s.pauses.pop(job["name"], None)
    job["updated"] = now
    released, skipped = resume_held(s, job, now, catch_up)
    push_due(s, job)
    if s.sinks:
        emit(s, "job.resumed", now, job=job["name"], reason="manual", catch_up=catch_up)
    if recorded:  # (the slots that fell due while it was paused, recorded skipped / paused)
        return ok(job=job["name"], paused=False, released=released, skipped=skipped, recorded=recorded)
    if released or skipped:
        return ok(job=job["name"], paused=False, released=released, skipped=skipped)
    return ok(job=job["name"], paused=False)


def withdraw_queued(s: SchedulerState, job: Record, now: int) -> int:
    """The job became a heartbeat job: no worker takes its runs any more (acquire would hand a
    worker an executor it cannot run), so those still queued are recorded skipped, reason
    ``heartbeat_job``, each judged as it ends; a run a worker leased already is its worker's to
    end. :returns: how many."""
    withdrawn = 0
    name = job["name"]
    for rid in s.history.get(name, ()):
        run = s.runs[rid]
        if run["state"] == "queued":
            unqueue_count(s, run)
            run.update(state="skipped", reason="heartbeat_job", finished_at=now)
            s.stats.on_recorded("skipped", "heartbeat_job")
            on_slot_recorded(s, run, now, health=False)  # told as any slot recorded skipped (health: see there)
            withdrawn += 1
            deadlines.on_finish(s, run, now)
            if name in s.pipes.children:  # a final outcome: its children record the slot
                pipehooks.notify(s, run, now)
    return withdrawn


def apply_trigger_job(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``trigger_job {name, slot?, payload?, propagate?, rerun?, downstream?}``: a manual run now,
    ``job@now!manual-N`` (N from the state's manual counter), queued like a scheduled one (or
    recorded skipped when its queue is full). With a ``slot`` (a run for that scheduled time,
    deduplicated; ``rerun``: again, though its run ended) or a ``payload`` override:
    backfills.trigger_job_with. With ``propagate``, its final outcome reaches the job's children
    (pipelines) as a scheduled run's does; without it, it reaches none. ``downstream`` (with
    ``rerun`` and ``propagate``; true, or the tenants of a token limited to them): the children
    that ran for the slot run again after it, and theirs, down the graph (pipelines.py, "clear
    downstream").

    :raises NotFound: no such job. :raises InvalidCommand: ``downstream`` without ``rerun`` and
        ``propagate``, or neither true nor a list of tenant names."""
    job = _job(s, cmd)
    down = cmd.get("downstream")
    if down is not None and not ((down is True or (type(down) is list and all(type(t) is str for t in down)))
                                 and cmd.get("rerun") is True and cmd.get("propagate") is True):
        raise InvalidCommand("trigger_job.downstream must be true or a list of tenants, with rerun and propagate")
    if "rerun" in cmd and "slot" not in cmd:
        raise InvalidCommand("trigger_job.rerun needs a slot")
    if down is not None and below(s, job["name"], limits.downstream_jobs_max) > limits.downstream_jobs_max:
        raise Conflict(f"more than {limits.downstream_jobs_max} jobs run after {job['name']} (limits.downstream_jobs_max): "
                       "rerun a job lower in the graph with downstream, or its jobs one by one", field="downstream")
    if "slot" in cmd or "payload" in cmd:
        res = trigger_job_with(s, job, cmd, now)
        if cmd.get("propagate") is True and res.get("created"):
            made = s.runs.get(res["run"])  # (a record its own add may have trimmed already)
            if made is not None:
                made["propagate"] = True
                if down is not None:
                    made["downstream"] = down
    else:
        s.manual_seq += 1
        rid = f"{job['name']}@{now}!manual-{s.manual_seq}"
        run = new_run(s, job, now, now, rid, "manual")
        if cmd.get("propagate") is True:  # pipelines: its outcome reaches its children
            run["propagate"] = True
        res = ok(job=job["name"], run=run["id"], state=run["state"])
    if s.sinks and res.get("run") is not None and res.get("created", True):  # (a slot's run found: no change)
        emit(s, "job.triggered", now, job=job["name"], slot=cmd.get("slot", now), run_id=res["run"],
             reason="manual", state=res.get("state"))
    return res
