"""Ending a run that has not: by request (``POST /v1/runs/{id}/cancel``, and many of a job's at once,
``POST /v1/jobs/{name}/cancel``: :func:`apply_cancel_runs`; docs/api.md), and a run of
a job with ``deadline.late_start: skip`` that has not started by its start deadline
(:func:`withdraw_late`; docs/notifications.md, "Deadlines").

A run that has not ended can be cancelled, whatever its job does next (its job is not paused: a
run stuck, or a slot that must not run after all). What the cancel makes of it depends on where
the run is, and mirrors what the scheduler itself does to a run in that place:

- ``queued`` (its slot not yet handed out, a retry waiting for its backoff, a run a pause holds):
  it leaves its queue and its slot is recorded ``skipped``, reason ``cancelled``, as a backfill's
  cancel withdraws its queued runs (core/backfills.py ``_withdraw``). Attempts already made are
  kept.
- ``running`` (a worker's lease, or a heartbeat job's run a ``start`` ping began): it ends
  ``failed``, its error saying so, as an overlap ``replace`` revokes a run (core/fire.py
  ``revoke``): the lease ends, so its fencing token goes stale; the worker's next heartbeat is
  told it no longer holds the run and stops it; of the outcome it then sends only the output is
  kept (core/leases.py ``killed_output``).
  The cancel does not retry it and does not dead-letter it.

Either way the slot's deadlines are judged at once (core/deadlines.py ``on_finish``), the run's
pipeline children learn the outcome as they learn any other (core/pipelines.py), the job's last
slot outcome says it (unless it is an older slot's), and ``run.cancelled`` goes to the sinks that
route it: an operator's change, as ``job.paused`` is, not a failure of the job's code, so it
counts in no ``consecutive_failures`` and opens no incident. Nothing else ends: a run of another
slot, the job, its schedule.

Refused (nothing changes): a run that has ended (409 ``Conflict`` with its ``state``), a dead run
(its place is the dead-letter queue: purge it there), a heartbeat job's slot waiting for its
ping, and an id that names no run (404). A queued run by hand with ``propagate`` that is
cancelled never ran: its children's earlier decision for the slot stays (pipelines.withdrawn).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import deadlines, limits, pipehooks, pipelines
from .errors import Conflict, InvalidCommand, NotFound
from .events import LAST_SLOT, emit_for
from .notify import health, of_backfill, older_than_last
from .queues import unqueue_count
from .records import Record, Result, is_int, ok

if TYPE_CHECKING:  # pragma: no cover
    from .commands import Command
    from .state import SchedulerState

#: What a cancel makes of a run, by the state it was in.
BECOMES = {"queued": "skipped", "running": "failed"}


def why(reason: str | None) -> str:
    """The error a cancelled run shows: why, in the words of who asked. Not who asked: a token's
    id is shown to its holder and to admins only (as a pause's ``by``), and a run is read by
    every reader of its tenant; the node's audit log names the token (docs/security.md)."""
    return f"cancelled by request: {reason}" if reason else "cancelled by request"


def apply_cancel_run(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``cancel_run {run, reason?}``: end a queued or running run (module docstring). ``reason``:
    why, in the words of who asked.

    :raises InvalidCommand: a field of the wrong type. :raises NotFound: no run of that id.
    :raises Conflict: the run has ended, is dead, or is a heartbeat job's slot waiting."""
    rid, reason = cmd.get("run"), _reason(cmd, "cancel_run")
    if not isinstance(rid, str) or not rid or len(rid) > limits.run_id_chars_max:
        raise InvalidCommand("cancel_run needs run")
    run = s.runs.get(rid)
    if run is None:
        raise NotFound(f"no run {rid!r}", field="run")
    state = run["state"]
    if state == "dead":
        raise Conflict(f"run {rid!r} is dead: it is in its queue's dead-letter queue, where DELETE "
                       f"/v1/dlq/{rid} purges it", field="run", state=state)
    if state == "waiting":
        raise Conflict(f"run {rid!r} is a heartbeat job's slot waiting for its start ping: nothing runs it, so "
                       "there is nothing to cancel (its deadline judges it if no ping comes)", field="run",
                       state=state)
    if state not in BECOMES:
        raise Conflict(f"run {rid!r} has ended ({state}): only a queued or running run can be cancelled",
                       field="run", state=state)
    leased = _end(s, run, why(reason), now)
    out = ok(run=rid, state=run["state"], was=state)
    if leased:
        out.update(worker=run["worker"], token=run["fencing_token"])
    return out


def apply_cancel_runs(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``cancel_runs {runs, running, reason?}``: end each of ``runs`` (at most
    limits.run_refs_per_command ids) that is queued, and with ``running`` each that is running,
    as ``cancel_run`` ends one (module docstring), in the order given: one ``run.cancelled`` a
    run. The others are passed over, not refused: a run started meanwhile (without ``running``),
    ended, dead, a heartbeat slot waiting, or gone. The node lists a job's runs for
    ``POST /v1/jobs/{name}/cancel`` and sends them in such commands; a run that moved on between
    its read and this apply is passed over, so the cancel never ends a run that started unless
    asked to.

    A command with a request id (the first of a ``POST /v1/jobs/{name}/cancel`` that carried an
    Idempotency-Key, with the job's ``name`` so that the key names this request) answers
    ``upto``, the newest entry of the job's history when the node read it (a run id, or None),
    and ``upto_at``, its ``fired_at``: a retry of that request, answered that the key was seen,
    walks the history no further (node/service.py cancel_job_runs).

    :returns: ``cancelled`` (how many ended: the others of ``runs``), ``passed`` (``[id,
        state]`` of those passed over, state None for an id that names no run), and with a
        request id ``upto`` and ``upto_at``: kept short, as the request log keeps it.
    :raises InvalidCommand: a field of the wrong type, no ids, or more than the bound."""
    ids, running, reason = cmd.get("runs"), cmd.get("running", False), _reason(cmd, "cancel_runs")
    upto, upto_at = cmd.get("upto"), cmd.get("upto_at")
    if upto is not None and not (isinstance(upto, str) and 0 < len(upto) <= limits.run_id_chars_max):
        raise InvalidCommand("cancel_runs.upto must be a run id or nil")
    if upto_at is not None and not (is_int(upto_at) and 0 <= upto_at <= limits.time_ms_max):
        raise InvalidCommand("cancel_runs.upto_at must be a time in ms or nil")
    if not isinstance(ids, list) or not 1 <= len(ids) <= limits.run_refs_per_command \
            or not all(isinstance(r, str) and r and len(r) <= limits.run_id_chars_max for r in ids):
        raise InvalidCommand(f"cancel_runs.runs must be 1-{limits.run_refs_per_command} run ids")
    if type(running) is not bool:
        raise InvalidCommand("cancel_runs.running must be a boolean")
    error = why(reason)
    cancelled = 0
    passed: list[list[str | None]] = []
    for rid in ids:
        run = s.runs.get(rid)
        state = None if run is None else run["state"]
        if run is not None and (state == "queued" or (running and state == "running")):
            _end(s, run, error, now)
            cancelled += 1
        else:
            passed.append([rid, state])
    if cmd.get("rid") is not None:
        return ok(cancelled=cancelled, passed=passed, upto=upto, upto_at=upto_at)
    return ok(cancelled=cancelled, passed=passed)


def _reason(cmd: Command, op: str) -> str | None:
    reason = cmd.get("reason")
    if reason is not None and not (isinstance(reason, str) and 1 <= len(reason) <= limits.cancel_reason_chars_max):
        raise InvalidCommand(f"{op}.reason must be a string of 1-{limits.cancel_reason_chars_max} characters or nil")
    return reason


def _end(s: SchedulerState, run: Record, error: str, now: int) -> bool:
    """End ``run``, queued or running, cancelled with ``error`` (module docstring). Returns
    whether a worker's lease ended with it (a heartbeat job's run a ping started holds none)."""
    rid, state = run["id"], run["state"]
    backfill = of_backfill(run)
    leased = rid in s._running_ids
    if state == "queued":
        unqueue_count(s, run)
        run.update(state="skipped", reason="cancelled", error=error, finished_at=now)
        s.stats.on_recorded("skipped", "cancelled")
        if not backfill:  # (made if the job has none yet: the cancel is said, as a running run's)
            h = health(s, run["job"])
            if not older_than_last(h, run["slot"]):
                h[LAST_SLOT] = [run["slot"], "skipped", "cancelled"]
    else:
        if leased:
            deadlines.end_lease(s, run, now, False, error)
        run.update(state="failed", error=error, finished_at=now, deadline=None)
        s.stats.on_finished("failed")
        if not backfill:  # (as a run an overlap replace revokes: notify.on_replaced)
            h = health(s, run["job"])
            if not older_than_last(h, run["slot"]):
                h[LAST_SLOT] = [run["slot"], "failed", error]
    if s.sinks:  # told while its job is paused too (events._WHILE_PAUSED): someone asked for it
        emit_for(s, "run.cancelled", now, backfill, job=run["job"], tenant=run.get("tenant"), slot=run["slot"],
                 run_id=rid, attempt=run["attempt"], reason=error, was=state, state=run["state"])
    deadlines.on_finish(s, run, now)
    if run["job"] in s.pipes.children:
        if state == "queued":
            # It never ran: its children record the slot as for a backfill's run withdrawn (a
            # child's earlier decision for the slot, a run by hand with propagate re-run, stays).
            pipelines.withdrawn(s, run, now)
        else:
            pipehooks.notify(s, run, now)  # a final outcome, failed, as a revoked run's
    return leased


def withdraw_late(s: SchedulerState, run: Record, now: int, tell: bool = False, queued: bool = True) -> None:
    """A queued run whose ``start_within_s`` passed, of a job with ``deadline.late_start: skip``
    (deadlines.judge, the leader's sweep, in the apply that judges it missed): it does not start
    late. Its slot is recorded ``skipped``, reason ``late_start``; the deadline's ``deadline.missed``
    event says ``withdrawn`` (no ``slot.missed`` as well: one miss, told once), unless ``tell``
    (the record was judged missed by an earlier deadline, told then without it: ``slot.missed``
    now); its children decide the slot as for any slot recorded skipped. ``queued`` False: a run
    given back (core/workers.py apply_release), in no queue's count."""
    within_ms = deadlines.late_skip_ms(s.jobs[run["job"]]["spec"]) or 0
    backfill = of_backfill(run)
    if queued:
        unqueue_count(s, run)
    run.update(state="skipped", reason="late_start", finished_at=now, error=deadlines.late_error(within_ms))
    s.stats.on_recorded("skipped", "late_start")
    h = None if backfill else s.health.get(run["job"])
    if h is not None and not older_than_last(h, run["slot"]):
        h[LAST_SLOT] = [run["slot"], "skipped", "late_start"]
    if tell and s.sinks:
        emit_for(s, "slot.missed", now, backfill, job=run["job"], slot=run["slot"], run_id=run["id"],
                 reason="late_start", state="skipped", error=run["error"])
    deadlines.on_finish(s, run, now)
    if run["job"] in s.pipes.children:
        pipelines.withdrawn(s, run, now)


deadlines.withdraw_late = withdraw_late
