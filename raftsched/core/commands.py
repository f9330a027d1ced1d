"""The command codec: a versioned msgpack envelope with a size limit.

A command is a dict ``{"v": version, "op": name, "now": now_ms, "rid": request_id | None, ...}``.
Times are integer milliseconds since the epoch, UTC. ``decode`` refuses, as a value, anything
it cannot read: bad bytes, an unknown version or an oversize command raise ``InvalidCommand``,
which ``SchedulerState.apply_bytes`` turns into a refusal (apply never raises).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, TypeAlias

import msgpack

from . import limits
from .errors import InvalidCommand, InvalidSpec, LimitExceeded

#: A command, as made by ``make`` and returned by ``decode``: a plain map (untrusted until its
#: handler has checked the fields it reads).
Command: TypeAlias = dict[str, Any]

OPS = (
    "noop",        # a barrier: applied for its position in the log only
    "put_job",     # create or replace a job; carries the proposer-computed next slot
    "put_jobs",    # several put_job payloads in one command (POST /v1/jobs:batch)
    "delete_job",
    "pause_job",
    "resume_job",  # carries the next slot computed by the proposer
    "trigger_job", # a manual run now
    "fire",        # a batch of due slots, planned by the leader
    "takeover",    # a new leader's first command
    "put_queue",
    # Leased execution (core/leases.py, core/queues.py, core/tenants.py, core/locks.py)
    "acquire",     # a worker asks for up to N runs of its queues: leases + fencing tokens
    "heartbeat",   # one per worker per interval: extends all its leases
    "complete",    # success or failure of one attempt, with its fencing token
    "complete_many",  # several outcomes in one command, each judged alone
    "expire",      # the leader's reaper: leases and locks past their deadline
    "dlq_requeue",
    "dlq_delete",
    "put_tenant",  # a tenant's rate limit (token bucket)
    "delete_tenant",
    "lock_acquire",
    "lock_renew",
    "lock_release",
    # Backfills and bulk dead-letter operations (core/backfills.py)
    "backfill",          # a new backfill of a job's past slots
    "backfill_step",     # the leader's next slots of a backfill, from its cursor
    "backfill_control",  # pause, resume or cancel a backfill or bulk operation
    "dlq_bulk",          # a new bulk requeue or purge of matching dead runs
    "dlq_bulk_step",     # the leader's next dead runs of a bulk operation, from its cursor
    # The worker fleet (core/workers.py)
    "worker_hello",    # a worker registers, or says its facts changed
    "workers_seen",    # one per node per interval: the workers connected to it
    "drain_worker",
    "forget_workers",  # the leader's clean-up of workers long gone
    "release",         # a worker gives leases back: queued again, no budget spent
    # API tokens (core/tokens.py)
    "token_create",  # a token's role, tenants, expiry and salted hash (never its secret)
    "token_revoke",
    # Secrets at rest (core/seal_keys.py)
    "reseal",  # the key new secret values are sealed under, and stored values sealed again under it
    # Tenant policies (core/tenants.py)
    "put_tenant_policy",  # a tenant's executor types, required placement labels and networks
    # Deadlines and heartbeat jobs (core/deadlines.py)
    "deadline_judge",  # the leader's sweep: slots whose deadline instants passed, by the cluster's clock
    "ping",            # a heartbeat job's start / success / fail, reported from outside
    # Notifications (core/notify.py)
    "put_sink",
    "delete_sink",
    "sink_progress",      # the leader's delivery: cursors, requeued events handled, dead events
    "sink_requeue",       # a sink's dead events delivered again
    "put_tenant_notify",  # a tenant's default notify routes
    "note_unplaceable",   # the leader's report of runs waiting too long for a worker that matches
    "sink_reseal",        # a rotation's sink secrets sealed again, if each sink is as it read it
    # The members' API URLs (core/members.py)
    "member_url",  # a node announces where its API is
    # Pipelines (core/pipelines.py)
    "join_expire",  # the leader's sweep of children's slots waiting past their max_wait_s
    "fanout_step",  # the leader's next part of a fan-out too large for one command
    # The fencing counter (core/locks.py)
    "fencing_floor",  # an operator's: the counter at least this (after a restore from copies)
    # A run ended by request (core/cancel.py)
    "cancel_run",
    "cancel_runs",  # many of one job's (POST /v1/jobs/{name}/cancel)
)


def encode(cmd: Command) -> bytes:
    """Encode a command. :raises LimitExceeded: when it is larger than ``command_bytes_max``.
    :raises InvalidSpec: a value msgpack cannot hold (an integer beyond 64 bits)."""
    try:
        data: bytes = msgpack.packb(cmd, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as e:
        raise InvalidSpec(f"a value cannot be stored (integers must fit in 64 bits): {type(e).__name__}") from None
    if len(data) > limits.command_bytes_max:
        raise LimitExceeded(
            f"command is {len(data)} bytes; the limit is {limits.command_bytes_max}", field=None
        )
    return data


def make(op: str, now_ms: int, rid: str | None = None, /, **fields: Any) -> Command:
    cmd = {"v": limits.command_version, "op": op, "now": int(now_ms), "rid": rid}
    cmd.update(fields)
    return cmd


def decode(data: bytes) -> Command:
    """Decode and check the envelope. :raises InvalidCommand: for anything unreadable."""
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidCommand(f"command must be bytes, not {type(data).__name__}")
    if len(data) > limits.command_bytes_max:
        raise InvalidCommand(f"command is {len(data)} bytes; limit {limits.command_bytes_max}")
    try:
        # The size is bounded above; unpackb has no max_buffer_size (that is Unpacker's).
        cmd = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise InvalidCommand(f"undecodable command: {type(e).__name__}") from None
    if not isinstance(cmd, dict):
        raise InvalidCommand("command is not a map")
    if cmd.get("v") != limits.command_version:
        raise InvalidCommand(f"unsupported command version {cmd.get('v')!r}")
    if cmd.get("op") not in OPS:
        raise InvalidCommand(f"unknown op {cmd.get('op')!r}")
    now = cmd.get("now")
    if not isinstance(now, int) or isinstance(now, bool) or not 0 <= now <= limits.time_ms_max:
        # (bounded: a state time past year 9999 would stay, and its deadlines outgrow 64 bits)
        raise InvalidCommand("command has no valid now")
    rid = cmd.get("rid")
    if rid is not None and (not isinstance(rid, str) or len(rid) > limits.request_id_chars_max):
        raise InvalidCommand("bad request id")
    return cmd


# ------------------------------------------------------------------ typed constructors
# One a command, the only way the node builds one (issue 21): each names its fields and their
# types, and writes them in the order the command has always had, so the bytes on the wire, in
# journals and in snapshots' request tables do not change. ``now`` is the proposer's clock in
# ms, ``rid`` the request id (None: no retry can repeat it). Fields that come from a validated
# body (core.bodies, core.model, core.backfill_model) are passed as that mapping, in its order.
Fields: TypeAlias = Mapping[str, Any]
#: Tenants a worker token is limited to (a set or a list; sorted into the command), or None.
Tenants: TypeAlias = Collection[str] | None


def noop(now: int, rid: str | None = None) -> Command:
    return make("noop", now, rid)


def put_job(now: int, rid: str | None, *, name: str, spec: dict[str, Any], next: int | None, cursor: int | None,
            anchor: int | None, create_only: bool, claim: str | None = None,
            was: int | None = None, paused: bool = False, by: str | None = None) -> Command:
    """``claim``: the tenant a token limited to tenants claims the job's queue for, when it has
    no owners (core/queues.py); only then is the field written. ``was``: a change of the
    jitter alone, its position planned from the job where it was (queries.position_digest,
    rejitter_position); only then is the field written. ``paused``: the job is paused by the
    same command (jobs.put_job), ``by`` the token id that asked; only then are they written."""
    cmd = make("put_job", now, rid, name=name, spec=spec, next=next, cursor=cursor, anchor=anchor,
               create_only=create_only)
    if claim is not None:
        cmd["claim"] = claim
    if was is not None:
        cmd["was"] = was
    if paused:
        cmd["paused"] = True
        if by is not None:
            cmd["by"] = by
    return cmd


def put_jobs(now: int, rid: str | None, *, jobs: list[Any]) -> Command:
    return make("put_jobs", now, rid, jobs=jobs)


def delete_job(now: int, rid: str | None, *, name: str, force: bool = False) -> Command:
    """``force``: delete a job other jobs run after (pipelines); only then is the field written."""
    cmd = make("delete_job", now, rid, name=name)
    if force:
        cmd["force"] = True
    return cmd


def pause_job(now: int, rid: str | None, *, name: str, by: str | None = None, note: str | None = None) -> Command:
    """``by``: the token id that asked; ``note``: why, in its words (core/bodies.validate_pause)."""
    extra = {k: v for k, v in (("by", by), ("note", note)) if v is not None}
    return make("pause_job", now, rid, name=name, **extra)


def resume_job(now: int, rid: str | None, *, name: str, catch_up: bool, plan: Fields | None = None) -> Command:
    """``plan``: without ``catch_up``, the job's generation and policy.plan_resume's fields."""
    return make("resume_job", now, rid, name=name, catch_up=catch_up, **(plan or {}))


def trigger_job(now: int, rid: str | None, *, name: str, extra: Fields | None = None) -> Command:
    """``extra``: a slot, a payload and/or propagate (core.backfill_model.validate_trigger)."""
    return make("trigger_job", now, rid, name=name, **(extra or {}))


def fanout_step(now: int, *, key: str, after: str | None) -> Command:
    """``key``, ``after``: a deferred fan-out (core.pipelines.pending_fanout)."""
    return make("fanout_step", now, None, key=key, after=after)


def join_expire(now: int, *, joins: list[Any]) -> Command:
    """``joins``: ``[child, slot, since]`` items (core.pipelines.overdue)."""
    return make("join_expire", now, None, joins=joins)


def fire(now: int, *, entries: list[Any], dl: list[Any] | None = None) -> Command:
    """``dl``: the deadline instants of the slots of jobs with a ``deadline`` (core/deadlines.py
    fire_items); written only when there are some, so other fires keep their bytes."""
    if dl:
        return make("fire", now, None, entries=entries, dl=dl)
    return make("fire", now, None, entries=entries)


def deadline_judge(now: int, *, runs: list[str], jobs: list[str]) -> Command:
    return make("deadline_judge", now, None, runs=runs, jobs=jobs)


def ping(now: int, rid: str | None, *, name: str, status: str, slot: int | None) -> Command:
    return make("ping", now, rid, name=name, status=status, slot=slot)


def takeover(now: int, *, node: str, seen: int | None = None) -> Command:
    """``seen``: the state time the new leader's replica had applied up to (for the gap without a
    leader that ``cluster.no_leader`` reports); only then is the field written."""
    cmd = make("takeover", now, None, node=node)
    if seen is not None:
        cmd["seen"] = seen
    return cmd


def expire(now: int, *, runs: list[Any], locks: list[Any]) -> Command:
    return make("expire", now, None, runs=runs, locks=locks)


def put_queue(now: int, rid: str | None, *, name: str, fields: Fields) -> Command:
    return make("put_queue", now, rid, name=name, **fields)


def put_tenant(now: int, rid: str | None, *, name: str, fields: Fields) -> Command:
    return make("put_tenant", now, rid, name=name, **fields)


def delete_tenant(now: int, rid: str | None, *, name: str) -> Command:
    return make("delete_tenant", now, rid, name=name)


def put_tenant_policy(now: int, rid: str | None, *, name: str, fields: Fields) -> Command:
    """``fields``: ``{"executors", "labels", "allow"}`` (core.bodies.validate_tenant's policy)."""
    return make("put_tenant_policy", now, rid, name=name, **fields)


def dlq_requeue(now: int, rid: str | None, *, run: str) -> Command:
    return make("dlq_requeue", now, rid, run=run)


def dlq_delete(now: int, rid: str | None, *, run: str) -> Command:
    return make("dlq_delete", now, rid, run=run)


def lock_command(op: str, now: int, rid: str | None, *, name: str, fields: Fields) -> Command:
    """``lock_acquire``, ``lock_renew`` or ``lock_release`` (core.bodies.validate_lock)."""
    if op not in ("lock_acquire", "lock_renew", "lock_release"):
        raise ValueError(f"not a lock command: {op!r}")
    return make(op, now, rid, name=name, **fields)


def backfill(now: int, rid: str | None, fields: Fields) -> Command:
    return make("backfill", now, rid, **fields)


def dlq_bulk(now: int, rid: str | None, fields: Fields) -> Command:
    return make("dlq_bulk", now, rid, **fields)


def backfill_control(now: int, rid: str | None, *, name: str, action: str) -> Command:
    return make("backfill_control", now, rid, name=name, action=action)


def step(op: str, now: int, fields: Fields) -> Command:
    """The leader's ``backfill_step`` or ``dlq_bulk_step`` (core.backfill_plan)."""
    if op not in ("backfill_step", "dlq_bulk_step"):
        raise ValueError(f"not a step command: {op!r}")
    return make(op, now, None, **fields)


def token_create(now: int, rid: str | None, *, id: str, hash: dict[str, Any], fields: Fields) -> Command:
    return make("token_create", now, rid, id=id, hash=hash, **fields)


def token_revoke(now: int, rid: str | None, *, id: str) -> Command:
    return make("token_revoke", now, rid, id=id)


def reseal(now: int, rid: str | None, *, key: str, jobs: list[Any]) -> Command:
    """``jobs``: ``[name, gen, {map: {name: sealed bytes}}]`` items (core/seal_keys.py)."""
    return make("reseal", now, rid, key=key, jobs=jobs)


# The worker protocol: the embedded worker and the node's side of a remote worker's requests
# build these five the same way (``tenants``: the worker token's, I23; ``own``: a remote
# worker reports only on its own leases).
def _limited(cmd: Command, tenants: Tenants) -> Command:
    if tenants is not None:
        cmd["tenants"] = sorted(tenants)
    return cmd


def worker_hello(now: int, *, worker: str, facts: Fields) -> Command:
    return make("worker_hello", now, None, worker=worker, **facts)


def acquire(now: int, *, worker: str, queues: list[str] | None, max: int, ttl: int,
            types: list[str] | None, tenants: Tenants = None, by: str | None = None) -> Command:
    """``by``: the name of the node proposing it; the other replicas lease the same runs and
    build no grants (core/leases.py apply_acquire). Written last, and only when given."""
    cmd = _limited(make("acquire", now, None, worker=worker, queues=queues, max=max, ttl=ttl, types=types),
                   tenants)
    if by is not None:
        cmd["by"] = by
    return cmd


def heartbeat(now: int, *, worker: str, leases: list[Any], ttl: int, tenants: Tenants = None) -> Command:
    return _limited(make("heartbeat", now, None, worker=worker, leases=leases, ttl=ttl), tenants)


def complete_many(now: int, rid: str | None, *, results: list[Any], worker: str, own: bool = False,
                  tenants: Tenants = None) -> Command:
    """``results``: outcomes as maps ``{run, token, success, error?, output?, result?}``, written
    as rows ``[run, token, success, error, output]`` (and ``result`` sixth when there is one):
    a map's keys were most of what every replica decoded (core/leases.py apply_complete_many).
    An item without run, token or success gives a row apply refuses, as it refused the map."""
    rows = []
    for it in results:
        row = [it.get("run"), it.get("token"), it.get("success"), it.get("error"), it.get("output")]
        if it.get("result") is not None:
            row.append(it["result"])
        rows.append(row)
    cmd = make("complete_many", now, rid, rows=rows, worker=worker)
    if own:
        cmd["own"] = True
    return _limited(cmd, tenants)


def release(now: int, rid: str | None, *, worker: str, leases: list[Any], reason: str,
            tenants: Tenants = None, not_started: bool = False) -> Command:
    """``not_started``: the worker never began these runs (core/workers.py apply_release)."""
    cmd = make("release", now, rid, worker=worker, leases=leases, reason=reason)
    if not_started:  # (written only when set: the command of every other release is as it was)
        cmd["not_started"] = True
    return _limited(cmd, tenants)


def drain_worker(now: int, rid: str | None, *, worker: str) -> Command:
    return make("drain_worker", now, rid, worker=worker)


def workers_seen(now: int, *, node: str, workers: list[Any]) -> Command:
    return make("workers_seen", now, None, node=node, workers=workers)


def forget_workers(now: int, *, workers: list[Any]) -> Command:
    return make("forget_workers", now, None, workers=workers)


# Notifications (core/notify.py)
def put_sink(now: int, rid: str | None, *, name: str, spec: dict[str, Any]) -> Command:
    return make("put_sink", now, rid, name=name, spec=spec)


def delete_sink(now: int, rid: str | None, *, name: str) -> Command:
    return make("delete_sink", now, rid, name=name)


def sink_progress(now: int, *, items: list[Any]) -> Command:
    return make("sink_progress", now, None, items=items)


def sink_requeue(now: int, rid: str | None, *, name: str, events: list[str] | None) -> Command:
    return make("sink_requeue", now, rid, name=name, events=events)


def put_tenant_notify(now: int, rid: str | None, *, name: str, notify: list[Any]) -> Command:
    return make("put_tenant_notify", now, rid, name=name, notify=notify)


def note_unplaceable(now: int, *, runs: list[str], handler: list[str] | None = None) -> Command:
    """``handler``: those of ``runs`` that wait for a worker with their handler (written only when
    there are some: the command is then the one the code before wrote)."""
    if handler:
        return make("note_unplaceable", now, None, runs=runs, handler=handler)
    return make("note_unplaceable", now, None, runs=runs)


def sink_reseal(now: int, rid: str | None, *, items: list[Any]) -> Command:
    """``items``: ``[name, {name: stored value read}, {name: sealed bytes}]`` (core/notify.py)."""
    return make("sink_reseal", now, rid, items=items)


def fencing_floor(now: int, rid: str | None, *, at_least: int) -> Command:
    """The fencing counter raised to at least ``at_least`` (core/locks.py)."""
    return make("fencing_floor", now, rid, at_least=at_least)


def cancel_run(now: int, rid: str | None, *, run: str, reason: str | None = None) -> Command:
    """A queued or running run ended by request (core/cancel.py), ``reason`` why in the words of
    who asked."""
    return make("cancel_run", now, rid, run=run, **({} if reason is None else {"reason": reason}))


def cancel_runs(now: int, rid: str | None, *, runs: list[str], reason: str | None = None,
                running: bool = False, name: str | None = None, upto: str | None = None,
                upto_at: int | None = None) -> Command:
    """Runs ended by request (core/cancel.py apply_cancel_runs): the queued ones of ``runs``, and
    with ``running`` the running ones too; ``reason`` why in the words of who asked. ``name``, the
    job's, and ``upto``, the newest entry of its history the node read, with ``upto_at`` its
    fired_at, go with a request id (records.request_what: the key names the job's cancel; a
    retry walks no further)."""
    return make("cancel_runs", now, rid, runs=runs, running=running, **({} if reason is None else {"reason": reason}),
                **({} if name is None else {"name": name, "upto": upto, "upto_at": upto_at}))


def member_url(now: int, *, addr: str, url: str) -> Command:
    """A node's announcement of its API URL (core/members.py)."""
    return make("member_url", now, None, addr=addr, url=url)
