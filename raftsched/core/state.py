"""The replicated scheduler state: its fields, and the one door writes come in by.

Pure and deterministic (I1 in docs/design.md): ``apply`` reads no clock, no randomness, no
environment and no disk; every time it uses is a field of the command (``now``, written by the
proposer). The same commands in the same order give the same snapshot bytes on every replica.

``apply_bytes`` never raises (I3): an exception inside a pysyncobj replicated method wedges that
node forever, so a malformed or unknown command is refused as a value, identically on every
replica, and changes nothing.

Each command goes to the handler of its op in ``HANDLERS``: ``apply_<op>(state, cmd, now_ms)``,
one module per area (jobs, fire, leases, queues, tenants, locks), each handler's docstring the
schema of its command. Each handler validates every field it reads before it changes anything,
so a refused command leaves the state as it was. Records and their memory are records.py's, the
snapshot codec snapshot.py's, the leader's due index due.py's.

Derived indexes (the due index, queue heaps and depths) are not part of the snapshot; ``restore``
rebuilds them.

Single-threaded, like etcd's RawNode: the state owns no lock and sets no collector policy. Whoever
makes a second thread (replication: its tick thread applies, the event loop reads) serialises
applies and reads (``RaftNode.read``), and pauses the collector around a snapshot or a restore.
"""
from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from typing import Any, TypeAlias

from sortedcontainers import SortedList

from . import commands, snapshot
from .commands import Command
from .due import DueIndex
from .stats import ApplyStats
from .errors import InvalidCommand, RaftschedError
from .fire import apply_fire
from .jobs import (
    apply_delete_job, apply_pause_job, apply_put_job, apply_put_jobs, apply_resume_job, apply_trigger_job,
)
from .leases import (
    apply_acquire, apply_complete, apply_complete_many, apply_expire, apply_heartbeat, apply_takeover,
)
from .locks import apply_fencing_floor, apply_lock_acquire, apply_lock_release, apply_lock_renew
from .cancel import apply_cancel_run, apply_cancel_runs
from .queues import apply_dlq_delete, apply_dlq_requeue, apply_put_queue, rebuild_indexes, reset_indexes
from .ready import ReadyIndex
from .records import IntTable, PartTable, Record, RequestLog, Result, err, ok, replayed, request_what
from .tenants import apply_delete_tenant, apply_put_tenant, apply_put_tenant_policy
from .backfills import (
    apply_backfill, apply_backfill_control, apply_backfill_step, apply_dlq_bulk, apply_dlq_bulk_step,
)
from .workers import (
    apply_drain_worker, apply_forget_workers, apply_release, apply_worker_hello, apply_workers_seen,
)
from .tokens import apply_token_create, apply_token_revoke
from .seal_keys import apply_reseal
from .events import Outbox
from .deadlines import Book, apply_deadline_judge
from .notify import (
    apply_delete_sink, apply_note_unplaceable, apply_ping, apply_put_sink, apply_put_tenant_notify,
    apply_sink_progress, apply_sink_requeue, apply_sink_reseal,
)
from .members import apply_member_url
from .pipelines import Pipes, apply_fanout_step, apply_join_expire


def apply_noop(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``noop``: a barrier, applied for its position in the log only."""
    return ok(now=now)


#: A command's handler: ``handler(state, cmd, now_ms)``.
Handler: TypeAlias = Callable[["SchedulerState", Command, int], Result]

#: Every command's handler, in commands.OPS order (checked below): ``handler(state, cmd, now_ms)``
#: returns the result (``ok``: True) or raises a RaftschedError, which apply turns into a refusal.
HANDLERS: dict[str, Handler] = {
    "noop": apply_noop,
    "put_job": apply_put_job,
    "put_jobs": apply_put_jobs,
    "delete_job": apply_delete_job,
    "pause_job": apply_pause_job,
    "resume_job": apply_resume_job,
    "trigger_job": apply_trigger_job,
    "fire": apply_fire,
    "takeover": apply_takeover,
    "put_queue": apply_put_queue,
    "acquire": apply_acquire,
    "heartbeat": apply_heartbeat,
    "complete": apply_complete,
    "complete_many": apply_complete_many,
    "expire": apply_expire,
    "dlq_requeue": apply_dlq_requeue,
    "dlq_delete": apply_dlq_delete,
    "put_tenant": apply_put_tenant,
    "delete_tenant": apply_delete_tenant,
    "lock_acquire": apply_lock_acquire,
    "lock_renew": apply_lock_renew,
    "lock_release": apply_lock_release,
    "backfill": apply_backfill,
    "backfill_step": apply_backfill_step,
    "backfill_control": apply_backfill_control,
    "dlq_bulk": apply_dlq_bulk,
    "dlq_bulk_step": apply_dlq_bulk_step,
    # The worker fleet (core/workers.py)
    "worker_hello": apply_worker_hello,
    "workers_seen": apply_workers_seen,
    "drain_worker": apply_drain_worker,
    "forget_workers": apply_forget_workers,
    "release": apply_release,
    "token_create": apply_token_create,
    "token_revoke": apply_token_revoke,
    "reseal": apply_reseal,
    "put_tenant_policy": apply_put_tenant_policy,
    "deadline_judge": apply_deadline_judge,
    "ping": apply_ping,
    "put_sink": apply_put_sink,
    "delete_sink": apply_delete_sink,
    "sink_progress": apply_sink_progress,
    "sink_requeue": apply_sink_requeue,
    "put_tenant_notify": apply_put_tenant_notify,
    "note_unplaceable": apply_note_unplaceable,
    "sink_reseal": apply_sink_reseal,
    "member_url": apply_member_url,
    "join_expire": apply_join_expire,
    "fanout_step": apply_fanout_step,
    "fencing_floor": apply_fencing_floor,
    "cancel_run": apply_cancel_run,
    "cancel_runs": apply_cancel_runs,
}
# The codec refuses an op with no handler; a handler for an op the codec refuses would never run.
assert tuple(HANDLERS) == commands.OPS, "commands.OPS and state.HANDLERS must list the same ops"


#: The ops that never finish a run nor add a finished entry to a fast-path job's history, or
#: say so themselves: they leave fire.trim's scan cache valid (fire.clean_history). Every other
#: op invalidates it. A ``fire`` finishes runs it did not make only in histories the cache never
#: holds (replace's revocations, heartbeat closes, pipelines' slots: jobs that never take the
#: fast path, and a job's spec changes only by an op that invalidates), and by
#: queues.drop_oldest_queued, which invalidates it itself; its general path's entries
#: (fire.add_entry) take their history out of the cache. A put_job or put_jobs invalidates it
#: when it replaces a job (jobs.put_job); one that only creates jobs touches no run.
_RUNS_UNTOUCHED = frozenset({"fire", "noop", "workers_seen", "member_url", "put_job", "put_jobs"})


class SchedulerState:
    """The whole replicated state of a raftsched cluster."""

    #: Whether apply takes the inlined fast paths of the hottest commands (fire's one-slot entry,
    #: complete_many's success). Always on; tests turn it off on an instance to compare the fast paths
    #: with the general code they stand for (tests/test_state_fast_paths.py).
    _fast_paths = True
    #: The name of the node this replica belongs to (set by the node; None: none), which an
    #: acquire's ``by`` is compared with: another node's acquire builds no grants here
    #: (leases.apply_acquire). Not replicated, and kept across a restore.
    answers_for: str | None = None

    # Declared for the type checker only (no value here: _reset sets them on the instance).
    # The sections added since snapshot version 3 (snapshot.EXTENSIONS), each set by _reset to
    # its empty form by name: worker id -> record (workers.py), backfill id -> record
    # (backfills.py), token id -> record (tokens.py), the key secrets are sealed under (seal_keys.py),
    # and the two below.
    workers: dict[str, Record]
    backfills: dict[str, Record]
    tokens: dict[str, Record]
    seal: dict[str, Any]
    #: tenant -> its policy (tenants.py); queue -> the tenants it belongs to (queues.py)
    tenant_policies: dict[str, Record]
    queue_owners: dict[str, list[str]]
    #: the events not yet given up, for delivery (events.py)
    outbox: Outbox
    #: every slot's deadline record, and the jobs watched for max_since_success_s (deadlines.py)
    deadlines: Book
    #: sink name -> record; job -> health; tenant -> default notify routes (notify.py)
    sinks: dict[str, Record]
    health: dict[str, list[Any]]
    tenant_notify: dict[str, list[Any]]
    pauses: dict[str, list[Any]]  # why each paused job is (notify.PAUSE_FIELDS)
    #: Raft address -> API URL, as the members announce them (members.py)
    member_urls: dict[str, str]
    #: the pipelines' joins and their derived parent -> children index (pipelines.py)
    pipes: Pipes
    # The derived indexes of the queues (queues.reset_indexes says what each holds).
    _queued: dict[str, dict[int, ReadyIndex]]
    _by_slot: dict[str, list[tuple[int, str]]]
    _dead: dict[str, deque[str]]
    _queue_depth: dict[str, int]
    _running_count: dict[str, int]
    _running_ids: dict[str, None]
    #: paused jobs (jobs.py keeps it; the metrics read it instead of walking the jobs)
    _paused_count: int
    _lock_tenants: dict[str, int]
    _metric_jobs: dict[str, None]
    _placed_jobs: dict[str, None]
    _names: SortedList
    _tenant_names: dict[str, SortedList]
    _queue_users: dict[str, dict[str, int]]

    def __init__(self) -> None:
        #: The leader's due index (due.py), or None: only a leader's trigger reads it. The
        #: trigger attaches one when its node leads (due.attach) and detaches it when it stops;
        #: a follower keeps none, and neither does a state nobody attached one to.
        self.due: DueIndex | None = None
        #: What this replica applied, for the metrics (stats.py): not in the snapshot, never
        #: read by apply, kept across a restore (counters since the process started).
        self.stats = ApplyStats()
        #: While this node replays what the process before it applied (``replaying``): the
        #: counters the metrics read, held aside; ``stats`` then counts into a scratch copy.
        self._counted: ApplyStats | None = None
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        #: name -> job record (records.JOB_FIELDS; see jobs.put_job)
        self.jobs: dict[str, Record] = {}
        #: run id -> run or recorded-slot record
        self.runs: dict[str, Record] = {}
        #: job name -> run ids, oldest first (bounded by the job's history)
        self.history: dict[str, list[str]] = {}
        #: queue name -> {"max_depth", "on_full"}
        self.queues: dict[str, Record] = {}
        #: request id -> [what, result], in three logs FIFO-bounded by request_ids_max each
        self.requests = RequestLog()
        #: highest ``now`` seen: state time never runs backwards
        self.now_ms = 0
        #: global, only-increasing counters
        self.gen = 0           # job generations (a replaced job gets a new one)
        self.manual_seq = 0    # manual trigger suffixes
        self.fencing_token = 0 # I13: one counter for every lease and lock token
        self.applied = 0       # commands applied (including refused ones)
        self.leader: Record | None = None
        #: tenant -> {"rate_milli": tokens per 1000 s, "burst": int, "tokens_micro": int, "last_ms": int}
        self.tenants: dict[str, Record] = {}
        #: lock name -> {"owner", "token", "deadline", "ttl", "since", "renewals"}
        self.locks: dict[str, Record] = {}
        #: the sections added since snapshot version 3 (snapshot.EXTENSIONS), each empty
        for name, ext in snapshot.EXTENSIONS.items():
            setattr(self, name, ext.new())
        # Derived (not in the snapshot).
        if self.due is not None:
            self.due.clear()
        #: frozen spec part -> the one object every job with that part holds (records.share_spec)
        self._parts: PartTable = {}
        #: int -> the one object jobs hold for it (records.share_int)
        self._ints: IntTable = {}
        #: a worker targets list, as a tuple -> the one list workers hold for it (workers.share_targets)
        self._target_lists: dict[tuple[str, ...], list[str]] = {}
        #: fire.trim's scan cache (the fire fast path's): id(history list) -> that list, for the
        #: histories known to hold no entry trim may drop (fire.clean_history), valid while
        #: ``_trim_epoch`` is ``_trim_clean_epoch``. The epoch moves with every command that may
        #: finish a run (apply, _RUNS_UNTOUCHED), and when a full drop_oldest queue skips a
        #: queued run (queues.drop_oldest_queued), the one way a fire finishes a run of a job
        #: whose history it may hold.
        self._trim_epoch = 0
        self._trim_clean_epoch = 0
        self._trim_clean: dict[int, list[str]] = {}
        reset_indexes(self)

    # ------------------------------------------------------------------ apply
    def apply_bytes(self, data: bytes) -> Result:
        """Apply one committed command. Never raises (I3)."""
        self.applied += 1
        try:
            cmd = commands.decode(data)
        except RaftschedError as e:
            return err(e)
        except Exception as e:  # pragma: no cover - decode maps its errors already
            return err(InvalidCommand(f"undecodable: {type(e).__name__}"))
        return self.apply(cmd)

    def apply(self, cmd: Command) -> Result:
        """Apply one decoded command (see commands.OPS). Never raises."""
        rid = cmd.get("rid")
        if rid is not None:  # I7: a retried request acts once
            seen = replayed(self.requests, cmd)
            if seen is not None:
                return seen
        now = cmd["now"]
        if now > self.now_ms:  # I6: state time never runs backwards
            self.now_ms = now
        op = cmd["op"]
        if op not in _RUNS_UNTOUCHED:
            self._trim_epoch += 1  # its runs may have changed state (fire.trim's scan cache)
        handler = HANDLERS.get(op)
        try:
            if handler is None:
                raise InvalidCommand(f"unknown op {cmd['op']!r}")
            res = handler(self, cmd, self.now_ms)
        except RaftschedError as e:
            res = err(e)
        except Exception as e:
            # A bug, not a request: refuse as a value rather than wedge the replica. Every
            # replica runs the same code on the same input, so all refuse alike. It is an
            # ``internal`` error (HTTP 500): the proposer logs it with its command, and so does
            # every replica's consumer (replication/_consumer.py).
            res = err(RaftschedError(f"{cmd['op']} could not be applied (a bug): {type(e).__name__}: {e}"))
        if rid is not None:
            self.requests[rid] = [request_what(cmd), res]  # (its log forgets its oldest beyond the bound)
        return res

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> bytes:
        """The whole state as bytes (snapshot.py: version 3, or 4 when a section added since is
        not empty)."""
        return snapshot.encode(self)

    def restore(self, data: bytes) -> None:
        """Discard all state and load a snapshot (versions 1-4), then rebuild the derived
        indexes; an attached due index is rebuilt in place. :raises ValueError: for another
        version (nothing changes then)."""
        fields, due_src = snapshot.decode(data)
        self._reset()
        for k, v in fields.items():
            setattr(self, k, v)
        if self.due is not None:
            if due_src is not None:
                snapshot.fill_due(self.due, due_src)
            else:
                self.due.rebuild(self.jobs)
        rebuild_indexes(self)
        for ext in snapshot.EXTENSIONS.values():
            if ext.rebuild is not None:
                ext.rebuild(self)
        self.stats.drains += 1  # the restored workers may be draining (stats.ApplyStats.drains)

    def replaying(self, on: bool) -> None:
        """From now on (``on``), until called with False, the commands applied are this node's
        replay at its start of entries the process before it applied and counted in its metrics
        (replication's ``_replay_check``): they are not counted again. The applies count into a
        scratch ``stats`` meanwhile, the metrics reading the held ones (``counted``), but for
        ``drains``, which the dispatcher reads as it moves and which carries on."""
        if on and self._counted is None:
            self._counted, self.stats = self.stats, ApplyStats()
            self.stats.drains = self._counted.drains
        elif not on and self._counted is not None:
            scratch, self.stats, self._counted = self.stats, self._counted, None
            self.stats.drains = scratch.drains

    @property
    def counted(self) -> ApplyStats:
        """The counters the metrics read (``stats``, but those held aside during a replay)."""
        return self.stats if self._counted is None else self._counted

    def state_hash(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()
