"""The command codec: a versioned msgpack envelope with a size limit.

A command is a dict ``{"v": version, "op": name, "now": now_ms, "rid": request_id | None, ...}``.
Times are integer milliseconds since the epoch, UTC. ``decode`` refuses, as a value, anything
it cannot read: bad bytes, an unknown version or an oversize command raise ``InvalidCommand``,
which ``SchedulerState.apply_bytes`` turns into a refusal (apply never raises).
"""
from __future__ import annotations

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
    if not isinstance(now, int) or isinstance(now, bool) or now < 0:
        raise InvalidCommand("command has no valid now")
    rid = cmd.get("rid")
    if rid is not None and (not isinstance(rid, str) or len(rid) > limits.request_id_chars_max):
        raise InvalidCommand("bad request id")
    return cmd
