"""Notifications' replicated state: sinks and their delivery cursors, jobs' health and incidents,
tenants' default routes; and the hooks the handlers call to emit events (docs/notifications.md).

Every hook runs inside the apply of the change it reports (I28 in docs/design.md: an event
exists exactly when its change does), reads no clock (``now`` is the command's) and touches only
the job it is about: health is kept on every completion, never by a scan.

A job's health is a list (events.LAST_SUCCESS ... SENT), made at its first outcome:
``last_success_at``, ``last_failure_at``, ``consecutive_failures`` (runs that ended dead since the
last success), ``last_slot_outcome`` (``[slot, outcome, reason]``), ``incident`` (``{"since",
"run"}`` while the job is failing, else None) and the routes' noise state.

A sink is ``{"spec", "cursor", "dead", "redo"}``: its spec (secret values sealed by the
proposer), the seq up to which delivery handled the outbox (committed by ``sink_progress``, so a
new leader resumes there), the events refused past its retry budget (newest last, bounded), the
dead events requeued for delivery again. Its generation is derived, never stored: a digest of
its spec (:func:`spec_gen`), so a put that changes what delivery sends with (its URL, tenant, a secret)
changes it and one that changes nothing does not (delivery abandons a batch read with an older
spec; ``sink_progress`` of an older one is ignored). A function of the spec alone, it is the same
on a replica that replayed the put and on one that loaded a dump (of any version) after it.
"""
from __future__ import annotations

import hashlib
from itertools import islice
from typing import TYPE_CHECKING, Any

import msgpack

from . import deadlines, limits, pipehooks, snapshot
from .errors import InvalidCommand, LimitExceeded, NotFound
from .events import CONSECUTIVE, INCIDENT, LAST_FAILURE, LAST_SLOT, LAST_SUCCESS, SENT, emit, emit_for, is_event
from .events import event_id, new_health
from .events import pending as events_pending
from .notify_model import check_routes, check_sink_spec
from .queues import release_held, unqueue_count
from .placement import NO_HANDLER, NO_WORKER_MATCHES
from .records import Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState


# ------------------------------------------------------------------ health
def of_backfill(run: Record) -> bool:
    """Whether ``run`` is a backfill's: its own (kind ``backfill``), or a child its cascade made
    (``cascade: children``, pipelines._create: kind ``triggered`` or ``scheduled``, naming the
    backfill): outside the job's health, told only to routes that ask for ``backfills``."""
    return run.get("kind") == "backfill" or "backfill" in run


def health(s: SchedulerState, job: str) -> list[Any]:
    h: list[Any] | None = s.health.get(job)
    if h is None:
        h = s.health[job] = new_health()
    return h


def on_success(s: SchedulerState, run: Record, now: int) -> None:
    """A run succeeded: the job's health, ``job.recovered`` when it closes an incident, and
    ``run.succeeded`` (opt-in). Nothing for a backfill's run but its opt-in event."""
    backfill = of_backfill(run)
    if not backfill:
        h = health(s, run["job"])
        h[LAST_SUCCESS] = now
        # A slot before the last one decided (a dead run requeued from the DLQ while newer
        # slots have died since, runs allowed to overlap ending out of order): it says nothing
        # of the job now, so it neither closes the incident nor is the last outcome.
        older = older_than_last(h, run["slot"])
        if not older:
            h[LAST_SLOT] = [run["slot"], "succeeded", None]
        if h[CONSECUTIVE] and not older:
            inc = h[INCIDENT]
            emit(s, "job.recovered", now, job=run["job"], tenant=run.get("tenant"), slot=run["slot"],
                 run_id=run["id"], attempt=run["attempt"], failures=h[CONSECUTIVE],
                 incident_since=inc["since"] if inc else None)
            h[CONSECUTIVE] = 0
            h[INCIDENT] = None
            sent = h[SENT]
            if sent:
                for k in [k for k in sent if k.endswith("|run.dead")]:
                    del sent[k]
    if s.sinks:
        emit_for(s, "run.succeeded", now, backfill, job=run["job"], tenant=run.get("tenant"), slot=run["slot"],
                 run_id=run["id"], attempt=run["attempt"])


def apply_ping(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``ping``: deadlines.apply_ping, its outcome making the heartbeat job's health and events
    as a run's does (on_success, on_dead)."""
    return deadlines.apply_ping(s, cmd, now, (on_success, on_dead))


def older_than_last(h: list[Any], slot: int) -> bool:
    """Whether ``slot`` is before the slot of the job's ``last_slot_outcome`` when that is a run's
    outcome (succeeded or dead): a slot recorded skipped or coalesced after a run still running
    (its overlap, a misfire) does not make that run's success an older slot's."""
    last = h[LAST_SLOT]
    return last is not None and last[1] in RUN_OUTCOMES and type(last[0]) is int and type(slot) is int \
        and slot < last[0]


#: the outcomes of a run in ``last_slot_outcome`` (the others are a recorded slot's)
RUN_OUTCOMES = ("succeeded", "dead", "failed")


def on_replaced(s: SchedulerState, run: Record, why: str) -> None:
    """A run revoked by its job's overlap policy ``replace`` (fire.revoke): the job's last
    outcome, ``failed`` with ``why``, unless an older slot's (as on_dead). It is no death: it
    counts in no ``consecutive_failures``, opens no incident, sends no ``run.dead``; a job whose
    runs are all replaced before they end is told by a deadline (``max_since_success_s``). Its
    ``last_slot_outcome`` said the run before, or nothing, while no run of it ever ended."""
    if of_backfill(run):
        return
    h = health(s, run["job"])
    if not older_than_last(h, run["slot"]):
        h[LAST_SLOT] = [run["slot"], "failed", why]


def on_attempt_failed(s: SchedulerState, run: Record, now: int, error: str | None) -> None:
    """An attempt failed and the run will be tried again: ``run.failed`` (opt-in)."""
    if s.sinks:
        emit_for(s, "run.failed", now, of_backfill(run), job=run["job"], tenant=run.get("tenant"),
                 slot=run["slot"], run_id=run["id"], attempt=run["attempt"], reason=error)


def on_dead(s: SchedulerState, run: Record, now: int, error: str | None) -> None:
    """A run is dead (its retries spent): the job's health and incident, ``run.dead``, and the
    job paused when its ``pause_on_failure`` says so (``job.paused``, reason
    ``pause_on_failure``)."""
    backfill = of_backfill(run)
    name = run["job"]
    if backfill:
        if s.sinks:
            emit_for(s, "run.dead", now, True, job=name, tenant=run.get("tenant"), slot=run["slot"],
                     run_id=run["id"], attempt=run["attempt"], reason=error, queue=run["queue"])
        return
    h = health(s, name)
    h[LAST_FAILURE] = now
    h[CONSECUTIVE] += 1
    if not older_than_last(h, run["slot"]):
        # (as on_success: a slot before the last run outcome's, a dead run requeued and dead
        # again while newer slots have ended since, is not the job's last outcome)
        h[LAST_SLOT] = [run["slot"], "dead", error]
    if h[INCIDENT] is None:
        h[INCIDENT] = {"since": now, "run": run["id"]}
    if s.sinks:
        emit(s, "run.dead", now, job=name, tenant=run.get("tenant"), slot=run["slot"], run_id=run["id"],
             attempt=run["attempt"], reason=error, queue=run["queue"], consecutive_failures=h[CONSECUTIVE])
    job = s.jobs.get(name)
    if job is not None and not job["paused"]:
        p = job["spec"].get("pause_on_failure")
        if p is not None and h[CONSECUTIVE] >= p["after_consecutive"]:
            emit(s, "job.paused", now, job=name, reason="pause_on_failure", consecutive_failures=h[CONSECUTIVE])
            cause = f"{h[CONSECUTIVE]} consecutive failures; the last, run {run['id']}" + (f": {error}" if error else "")
            pause(s, job, now, ("pause_on_failure", None, cause[:limits.pause_note_chars_max]))


def on_slot_recorded(s: SchedulerState, entry: Record, now: int, health: bool = True) -> None:
    """A slot recorded skipped or coalesced (misfire, the catch-up limit, overlap, a full queue):
    ``last_slot_outcome`` (when the job has health already) and ``slot.missed`` with its reason
    (one event a recorded range). ``health`` False: the event only (a heartbeat job's slots
    closed unpinged or withdrawn: deadlines.close_heartbeats, jobs.withdraw_queued; its pings
    make its health, deadlines.apply_ping)."""
    name = entry["job"]
    h = s.health.get(name) if health else None
    # (made by a run's outcome: a job that only records slots costs nothing here; a backfill's
    # slots are outside the job's health, as its runs' outcomes are)
    if h is not None and not of_backfill(entry):
        h[LAST_SLOT] = [entry["slot"], entry["state"], entry["reason"]]
    if s.sinks and entry["reason"] not in ("paused", "upstream_succeeded"):
        # (nothing missed: a job paused says so itself, and a handler of a parent's failure is
        # not needed when the parent succeeded: told, it paged on every success)
        extra = {"count": entry["count"], "slot_to": entry["slot_to"]} if "count" in entry else {}
        if entry.get("error"):  # what decided it, in words (the policy rule refused, the parent's outcome)
            extra["error"] = entry["error"]
        emit_for(s, "slot.missed", now, of_backfill(entry), job=name, slot=entry["slot"],
                 run_id=entry["id"], reason=entry["reason"], state=entry["state"], **extra)


#: Why a paused job is paused: ``s.pauses[name] = [since, reason, by, note]``, made by the pause
#: that paused it (a pause of a paused job changes nothing), dropped by its resume or delete.
#: ``reason`` is ``manual`` (pause_job: ``by`` the token id that asked, ``note`` its words) or
#: ``pause_on_failure`` (``note`` says which run ended the streak). A job paused by code before
#: this section has none (GET shows ``pause: null``).
PAUSE_FIELDS = ("since", "reason", "by", "note")


def pause(s: SchedulerState, job: Record, now: int, why: tuple[str, str | None, str | None] = ("manual", None, None)
          ) -> int:
    """Pause a job (pause_job, and pause_on_failure), ``why`` its (reason, by, note) for
    :data:`PAUSE_FIELDS`. Runs fired ahead for slots after ``now``
    (queued; a heartbeat job's waiting for their ping) are held: they stay queued (or waiting),
    but no worker is handed one and no ping starts one (``due`` None: out of the acquire index)
    until the resume decides them (:func:`resume_held`); so is the run of a gated job's own slot
    fired ahead that its parents let be made while the job is paused. Runs queued for slots at
    or before ``now`` are not held. :returns: how many runs this pause held."""
    if not job["paused"]:
        s._paused_count += 1  # the metrics' count of paused jobs (queues.reset_indexes)
        job["paused"] = True
        job["updated"] = now  # (pausing a paused job changes nothing: docs/api.md)
        s.pauses[job["name"]] = [now, *why]
    held = 0
    runs = s.runs
    for slot, j in s.pipes.joins.get(job["name"], {}).items():
        if j["own"] and slot > now:
            # A gated job's own slot fired ahead, waiting for its parents: its run is made held
            # (pipelines._create), whenever they let it be made while the job is paused.
            j["held"] = True
    for rid in s.history.get(job["name"], ()):
        run = runs[rid]
        state = run["state"]
        if (state == "queued" or state == "waiting") and run["kind"] == "scheduled" and run["slot"] > now \
                and run.get("due", 0) is not None:
            run["due"] = None  # (a queued run's index entry is stale from now: queues.py)
            held += 1
    return held


def resume_held(s: SchedulerState, job: Record, now: int, catch_up: bool) -> tuple[int, int]:
    """The job is resumed: its runs the pause held (:func:`pause`) that are still queued or
    waiting are decided. One whose slot came while the job was paused (at or before ``now``) is
    recorded skipped, reason ``paused``, as the slots of the pause that never fired are, unless
    ``catch_up``: then it is released with the rest, a run that starts late (as a queued run
    waits for a worker), not a slot missed. The others are released: queued again from their
    slot (a heartbeat job's wait for their ping as before). :returns: (released, skipped)."""
    released = skipped = 0
    name = job["name"]
    runs = s.runs
    for j in s.pipes.joins.get(name, {}).values():
        j.pop("held", None)  # (pipelines._create: a run made from now on is not held)
    for rid in list(s.history.get(name, ())):
        run = runs.get(rid)
        if run is not None and "held" in run:
            del run["held"]  # a gated slot's record (pipelines._decide): a rearm now queues it
        if run is None or run.get("due", 0) is not None:
            continue
        state = run["state"]
        if state != "queued" and state != "waiting":
            run["due"] = run["slot"]  # (a heartbeat job's run pinged meanwhile)
            continue
        if run["slot"] <= now and not catch_up:
            if state == "queued":
                unqueue_count(s, run)
            run["due"] = run["slot"]
            run.update(state="skipped", reason="paused", finished_at=now)
            s.stats.on_recorded("skipped", "paused")
            deadlines.on_finish(s, run, now)
            skipped += 1
            if name in s.pipes.children:  # a final outcome: its children record the slot
                pipehooks.notify(s, run, now)
        elif state == "queued":
            release_held(s, run)
            released += 1
        else:
            run["due"] = run["slot"]
            released += 1
    return released, skipped


def view_health(h: list[Any] | None) -> Record:
    """A job's ``health`` as its view shows it (times in ms; node/views.py formats them)."""
    if h is None:
        return {"last_success_at": None, "last_failure_at": None, "consecutive_failures": 0,
                "last_slot_outcome": None, "incident": None}
    last = h[LAST_SLOT]
    return {"last_success_at": h[LAST_SUCCESS], "last_failure_at": h[LAST_FAILURE],
            "consecutive_failures": h[CONSECUTIVE],
            "last_slot_outcome": None if last is None else {"slot": last[0], "outcome": last[1], "reason": last[2]},
            "incident": None if h[INCIDENT] is None else dict(h[INCIDENT])}


# ------------------------------------------------------------------ sinks
def _canonical(v: Any) -> Any:
    if isinstance(v, dict):
        return [[k, _canonical(v[k])] for k in sorted(v)]
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    return v


def spec_gen(spec: dict[str, Any]) -> int:
    """A sink's generation: 63 bits of a digest of its spec, keys in order (secrets as sealed:
    a rotation's re-seal changes it; the delivering node, which can open both, then goes on
    with its batch under the new generation: node/notify.py, ``Notifier._replaced``)."""
    digest = hashlib.blake2b(msgpack.packb(_canonical(spec), use_bin_type=True), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def apply_put_sink(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_sink {name, spec}``: create or replace a sink (notify_model.validate_sink's spec,
    its secrets sealed). A new sink starts at the outbox's end (it is sent what happens from now
    on); a replace keeps its cursor and dead list, but for one that changes the sink's tenant,
    which starts it at the outbox's end with no dead or requeued events (those were routed for
    the tenant it had). A spec that differs changes its generation: a later sink_progress of a
    batch read before is ignored (delivery starts that batch again with the new spec); the same
    spec put again changes nothing delivery reads.

    :raises InvalidCommand: malformed. :raises LimitExceeded: a new sink beyond sinks_max."""
    name, spec = cmd.get("name"), cmd.get("spec")
    if not isinstance(name, str) or not name:
        raise InvalidCommand("put_sink needs name")
    check_sink_spec(spec)
    assert isinstance(spec, dict)  # (check_sink_spec refused anything else)
    old = s.sinks.get(name)
    tenant = spec.get("tenant")
    if tenant is not None and (old is None or old["spec"].get("tenant") != tenant) \
            and sum(1 for x in s.sinks.values() if x["spec"].get("tenant") == tenant) >= limits.sinks_per_tenant_max:
        raise LimitExceeded(f"tenant {tenant!r} holds {limits.sinks_per_tenant_max} sinks, a tenant's limit",
                            field="tenant")
    if old is None:
        if len(s.sinks) >= limits.sinks_max:
            raise LimitExceeded(f"the cluster holds {limits.sinks_max} sinks, its limit", field="name")
        s.sinks[name] = {"spec": spec, "cursor": s.outbox.seq, "dead": [], "redo": []}
    else:
        if spec.get("tenant") != old["spec"].get("tenant"):
            old.update(cursor=s.outbox.seq, dead=[], redo=[])
        old["spec"] = spec
    return ok(sink=name, created=old is None)


def apply_sink_reseal(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``sink_reseal {items: [[name, expect: {name: stored}, secrets: {name: sealed}], ...]}``: a
    rotation's (node/rotation.py) values sealed again. Each item's ``secrets`` replace the sink's
    values of those names if the sink still exists and its stored secrets are exactly ``expect``
    (what the proposer read); else the item is ``stale`` (the sink was deleted, or written since:
    its new values were sealed by their own write) and nothing of it changes. It never creates a
    sink, and changes nothing of one but those values (not its spec's other fields, not its
    cursor nor its dead list).

    :raises InvalidCommand: malformed (checked before anything changes)."""
    items = cmd.get("items")
    if not isinstance(items, list) or not items or len(items) > limits.sinks_max:
        raise InvalidCommand(f"sink_reseal.items must be a list of 1-{limits.sinks_max} items")
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and item[0]
                and isinstance(item[1], dict) and isinstance(item[2], dict) and item[2]
                and all(isinstance(k, str) and isinstance(v, (str, bytes)) for k, v in item[1].items())
                and all(isinstance(k, str) and isinstance(v, bytes) and k in item[1] for k, v in item[2].items())):
            raise InvalidCommand(f"sink_reseal.items[{i}] must be [name, {{name: stored}}, {{name: sealed}}] "
                                 "(sealed values only, of names it expects)")
    resealed = 0
    stale: list[str] = []
    for name, expect, vals in items:
        sk = s.sinks.get(name)
        if sk is None or sk["spec"].get("secrets") != expect:
            stale.append(name)
            continue
        # (a new spec, never the stored one changed in place: a read may hold it)
        sk["spec"] = dict(sk["spec"], secrets={**expect, **vals})
        resealed += 1
    return ok(resealed=resealed, stale=stale)


def apply_delete_sink(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``delete_sink {name}``. :raises NotFound:"""
    name = cmd.get("name")
    if not isinstance(name, str) or name not in s.sinks:
        raise NotFound(f"no sink named {name!r}", field="name")
    del s.sinks[name]
    return ok(sink=name, deleted=True)


def apply_sink_progress(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``sink_progress {items: [{sink, cursor, gen?, redo?: [seq], dead?: [{event, error, attempts}]}]}``:
    the leader's delivery, batched: each sink's cursor moves forward (never back), its requeued
    events ``redo`` were handled, and ``dead`` events go to its dead list (the oldest beyond
    sink_dead_max give way). An item for a sink that is gone, or (``gen``) for an earlier
    generation of it (delivered with a spec replaced since), is ignored.

    :raises InvalidCommand: malformed (then nothing changes)."""
    items = cmd.get("items")
    if not isinstance(items, list) or len(items) > limits.sink_progress_items_max:
        raise InvalidCommand("sink_progress needs a bounded list of items")
    for it in items:
        if not (isinstance(it, dict) and isinstance(it.get("sink"), str) and is_int(it.get("cursor"))
                and ("gen" not in it or is_int(it["gen"]))):
            raise InvalidCommand("sink_progress items need sink and cursor (and gen an integer)")
        redo, dead = it.get("redo", []), it.get("dead", [])
        if not (isinstance(redo, list) and all(is_int(x) for x in redo)):
            raise InvalidCommand("sink_progress redo must be a list of seqs")
        if not (isinstance(dead, list) and len(dead) <= limits.sink_progress_dead_max
                and all(isinstance(d, dict) and is_event(d.get("event"))
                        and is_int(d.get("attempts")) and isinstance(d.get("error"), (str, type(None)))
                        for d in dead)):
            raise InvalidCommand("sink_progress dead must be a bounded list of {event, error, attempts}")
    moved = 0
    for it in items:
        sk = s.sinks.get(it["sink"])
        if sk is None or ("gen" in it and it["gen"] != spec_gen(sk["spec"])):
            continue
        if it["cursor"] > sk["cursor"]:
            sk["cursor"] = min(it["cursor"], s.outbox.seq)
            moved += 1
        done = set(it.get("redo", ()))
        if done:
            sk["redo"] = [ev for ev in sk["redo"] if ev["seq"] not in done]
        for d in it.get("dead", ()):
            sk["dead"].append({"event": d["event"], "error": d.get("error"), "attempts": d["attempts"], "at": now})
        if it.get("dead"):
            s.stats.on_given_up(it["sink"], len(it["dead"]))  # (the metrics' count: the list is bounded)
        if len(sk["dead"]) > limits.sink_dead_max:
            del sk["dead"][:len(sk["dead"]) - limits.sink_dead_max]
    return ok(moved=moved)


#: Ids a refused requeue's message names (the rest are counted): a refusal is kept with its
#: request id, so it stays small whatever the command held.
_NAMED_IDS_MAX = 10


def apply_sink_requeue(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``sink_requeue {name, events?: [event_id]}``: dead events (those named, or all) are
    delivered again (``redo``), with a fresh retry budget.

    :raises NotFound: no such sink, or an id named that is not one of its dead events (then
        nothing changes: the check reads the state only, so every replica refuses alike)."""
    name, ids = cmd.get("name"), cmd.get("events")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(x, str) for x in ids)):
        raise InvalidCommand("sink_requeue.events must be a list of event ids")
    sk = s.sinks.get(name) if isinstance(name, str) else None
    if sk is None:
        raise NotFound(f"no sink named {name!r}", field="name")
    want = None if ids is None else set(ids)
    if ids is not None:
        dead_ids = {event_id(d["event"]["seq"]) for d in sk["dead"]}
        missing = [x for x in dict.fromkeys(ids) if x not in dead_ids]  # (in the order sent, once)
        if missing:
            named = ", ".join(repr(x) for x in missing[:_NAMED_IDS_MAX])
            more = len(missing) - _NAMED_IDS_MAX
            raise NotFound(f"no dead event {named}{f' and {more} more' if more > 0 else ''} in sink {name!r} "
                           f"(its dead list: GET /v1/sinks/{name}/dead); nothing was requeued", field="events")
    keep: list[Record] = []
    moved: list[Record] = []
    for d in sk["dead"]:
        if (want is None or f"ev-{d['event']['seq']}" in want) and len(sk["redo"]) + len(moved) < limits.sink_redo_max:
            moved.append(d["event"])
        else:
            keep.append(d)
    sk["dead"] = keep
    sk["redo"].extend(moved)
    if moved:
        # When the requeued events began to wait again (their own "at" is when they were emitted):
        # the metrics' age of what the sink was not sent yet (outbox_counts).
        sk["requeued_at"] = now
    return ok(sink=name, requeued=len(moved))


def apply_note_unplaceable(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``note_unplaceable {runs: [run id], handler?: [run id]}``: the leader saw these queued runs
    wait longer than ``limits.unplaceable_report_ms`` for a worker their placement (or tenant)
    allows (``unplaceable_overdue``), those of ``handler`` for a worker with their handler
    (worker_queries.NO_HANDLER): each still queued and not told already is marked and reported,
    ``run.unplaceable``, once. The reason is the leader's, read from the command: apply reads no
    worker registry for it. :raises InvalidCommand: not bounded lists of ids."""
    ids, handler = cmd.get("runs"), cmd.get("handler", [])
    for v in (ids, handler):
        if not (isinstance(v, list) and len(v) <= limits.unplaceable_runs_max and all(isinstance(x, str) for x in v)):
            raise InvalidCommand("note_unplaceable needs bounded lists of run ids")
    assert isinstance(ids, list) and isinstance(handler, list)  # (checked above)
    for_handler = set(handler)
    told = 0
    for rid in ids:
        run = s.runs.get(rid)
        if run is None or run["state"] != "queued" or run.get("unplaceable_at") is not None:
            continue
        run["unplaceable_at"] = now
        told += 1
        emit_for(s, "run.unplaceable", now, of_backfill(run), job=run["job"], tenant=run.get("tenant"),
                 slot=run["slot"], run_id=rid, attempt=run["attempt"],
                 reason=NO_HANDLER if rid in for_handler else NO_WORKER_MATCHES,
                 queue=run["queue"], waited_ms=now - run["fired_at"])
    return ok(told=told)


def apply_put_tenant_notify(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_tenant_notify {name, notify}``: a tenant's default routes, for its jobs that name
    none (notify_model.validate_routes'); an empty list removes them."""
    name, routes = cmd.get("name"), cmd.get("notify")
    if not isinstance(name, str) or not name:
        raise InvalidCommand("put_tenant_notify needs name")
    check_routes(routes, "put_tenant_notify.notify")
    assert isinstance(routes, list)  # (check_routes refused anything else)
    if routes:
        s.tenant_notify[name] = routes
    else:
        s.tenant_notify.pop(name, None)
    return ok(tenant=name, notify=len(routes))


# ------------------------------------------------------------------ snapshot sections
def _enc_sorted(d: dict[str, Any]) -> list[Any] | None:
    return [[k, d[k]] for k in sorted(d)] if d else None


def _dec_pairs(data: list[Any]) -> dict[str, Any]:
    return {k: v for k, v in data}


def _dec_sinks(data: list[Any]) -> dict[str, Any]:
    out = _dec_pairs(data)
    for sk in out.values():
        sk.pop("gen", None)  # (a dump of a version that stored it: it is the spec's, computed when read)
    return out


snapshot.register(snapshot.Extension(name="sinks", new=dict, encode=_enc_sorted, decode=_dec_sinks))
snapshot.register(snapshot.Extension(name="health", new=dict, encode=_enc_sorted, decode=_dec_pairs))
snapshot.register(snapshot.Extension(name="tenant_notify", new=dict, encode=_enc_sorted, decode=_dec_pairs))
snapshot.register(snapshot.Extension(name="pauses", new=dict, encode=_enc_sorted, decode=_dec_pairs))


# ------------------------------------------------------------------ reads (node/notify.py)
def sink_names(s: SchedulerState) -> list[str]:
    return sorted(s.sinks)


def sink_record(s: SchedulerState, name: str) -> Record | None:
    """A copy of sink ``name``'s record without its dead and redo lists (their sizes instead)."""
    sk = s.sinks.get(name)
    if sk is None:
        return None
    return {"name": name, "spec": sk["spec"], "cursor": sk["cursor"], "dead": len(sk["dead"]),
            "redo": len(sk["redo"]), "behind": _behind(s, name, sk["cursor"])}


def _behind(s: SchedulerState, name: str, cursor: int) -> int:
    box = s.outbox
    if not box.events:
        return 0
    start = max(0, cursor + 1 - box.events[0]["seq"])
    return sum(1 for ev in islice(box.events, start, None) if name in ev["to"])


def sink_dead(s: SchedulerState, name: str, limit: int) -> list[Record] | None:
    """Sink ``name``'s dead events, newest first (copies), or None: no such sink."""
    sk = s.sinks.get(name)
    if sk is None:
        return None
    return [{"event": dict(d["event"]), "error": d["error"], "attempts": d["attempts"], "at": d["at"]}
            for d in reversed(sk["dead"][-limit:])]


def sink_gen(s: SchedulerState, name: str) -> int | None:
    """Sink ``name``'s generation (changed by every put), or None: no such sink."""
    sk = s.sinks.get(name)
    return None if sk is None else spec_gen(sk["spec"])


def sink_batch(s: SchedulerState, name: str, n: int) -> Record | None:
    """What delivery sends sink ``name`` next: its spec and generation, its requeued events and
    up to ``n`` events after its cursor (copies), and the cursor they take it to; None: no such
    sink."""
    sk = s.sinks.get(name)
    if sk is None:
        return None
    redo = [dict(ev) for ev in sk["redo"][:n]]
    evs, upto = events_pending(s.outbox, sk["cursor"], name, n)
    return {"spec": sk["spec"], "gen": spec_gen(sk["spec"]), "redo": redo, "events": [dict(ev) for ev in evs],
            "upto": upto, "cursor": sk["cursor"], "first": s.outbox.first_seq()}


def health_of(s: SchedulerState, job: str) -> Record:
    return view_health(s.health.get(job))


def metric_jobs(s: SchedulerState) -> list[tuple[str, Record]]:
    """(name, health) of the jobs whose spec says ``"metrics": true`` (per-job gauges)."""
    return [(name, view_health(s.health.get(name))) for name in sorted(s._metric_jobs)]


def outbox_counts(s: SchedulerState) -> Record:
    """The outbox's last seq (events kept since the cluster began), the events it holds by kind,
    and for each sink (``sinks``: ``name -> [pending, oldest, dead]``) the events routed to it that
    it was not sent yet (after its cursor, and its requeued ones), the time (ms) the oldest of them
    began to wait (None when none waits: a requeued event waits since its requeue, not since it
    was emitted, maybe days before) and its dead events: one walk of the outbox for every sink,
    the events by kind, then those after the lowest cursor."""
    by: dict[str, int] = {}
    cursors = {name: sk["cursor"] for name, sk in s.sinks.items()}
    pending: dict[str, list[Any]] = {name: [len(sk["redo"]), sk.get("requeued_at") if sk["redo"] else None,
                                            len(sk["dead"])] for name, sk in s.sinks.items()}
    events = s.outbox.events
    for ev in events:
        k = ev["kind"]
        by[k] = by.get(k, 0) + 1
    given_up = dict(s.counted.given_up)  # (this replica's count, stats.py: not the state's)
    if not cursors or not events:
        return {"seq": s.outbox.seq, "held": by, "sinks": pending, "given_up": given_up}
    start = max(0, min(cursors.values()) + 1 - events[0]["seq"])
    for ev in islice(events, start, None):
        seq = ev["seq"]
        for name in ev["to"]:
            c = cursors.get(name)
            if c is not None and seq > c:
                p = pending[name]
                p[0] += 1
                if p[1] is None or ev["at"] < p[1]:
                    p[1] = ev["at"]
    return {"seq": s.outbox.seq, "held": by, "sinks": pending, "given_up": given_up}

