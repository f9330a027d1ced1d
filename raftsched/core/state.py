"""The replicated scheduler state: apply, snapshot, restore.

Pure and deterministic (I1 in docs/design.md): ``apply`` reads no clock, no randomness, no
environment and no disk; every time it uses is a field of the command (``now``, written by the
proposer). The same commands in the same order give the same snapshot bytes on every replica.

``apply_bytes`` never raises (I3): an exception inside a pysyncobj replicated method wedges that
node forever, so a malformed or unknown command is refused as a value, identically on every
replica, and changes nothing.

Derived indexes (the due-job heap, queue depths) are not part of the snapshot; ``restore``
rebuilds them.
"""
from __future__ import annotations

import gc
import hashlib
import heapq
import sys
import threading
from collections import OrderedDict
from itertools import repeat
from operator import is_, itemgetter

import msgpack

from . import limits
from .commands import decode
from .errors import Conflict, InvalidCommand, LimitExceeded, NotFound, RaftschedError
from .execution import ExecutionMixin
from .model import TERMINAL_STATES
from .policy import fires_ahead

#: A job's counters, a list (a 5-key map cost ~200 bytes a job; 1M jobs: 190 MB).
STATS_FIELDS = ("runs", "recorded", "lag_ms_last", "lag_ms_max", "lag_ms_sum")
_RUNS, _RECORDED, _LAG_LAST, _LAG_MAX, _LAG_SUM = range(5)
#: 2: spec parts (_SHARED_PARTS) are stored once, in "parts", and jobs refer to them by index;
#: a job's stats are a list (STATS_FIELDS).
#: 3: jobs as columns, specs as shared templates plus each job's executor, histories by job
#: position and only when not empty (SchedulerState._snapshot_obj).
#: restore reads 1, 2 and 3.
SNAPSHOT_VERSION = 3
#: A job record's fields (_put_job), in the order of its map and of a version 3 snapshot's columns.
_JOB_FIELDS = ("name", "spec", "gen", "created", "updated", "anchor", "cursor", "next", "paused", "stats")
#: Job fields whose values jobs often have in common (registered together, or due together):
#: a version 3 snapshot writes each of these columns as its distinct values and an index into
#: them when that halves it (_encode_ints), and a restore then holds one object for equal values.
_SHARED_INT_FIELDS = ("created", "updated", "anchor", "cursor", "next")
_INT_OR_NONE = frozenset({int, type(None)})


# Records (jobs, specs, runs) are plain dicts whose key table is shared by every record of their
# kind: CPython's key-sharing dictionaries (PEP 412), the ones instances' __dict__ use. A dict of
# its own keys costs a table of hashes, keys and values; a shared-key one a row of values. Python
# 3.11, measured (scripts/bench.py scale, docs/benchmarks.md): a job map 280 -> 176 bytes, a
# spec 472 -> 184, a run 472 -> 336, and a run is copied from its template in half the time.
# Only memory and speed differ: they are dicts, equal, ordered and encoded as any other, on any
# Python; a record that gains a key of another kind simply gets a table of its own again.
class _JobKeys:
    """Makes job records (``_job(...)``), fields in _JOB_FIELDS order."""

    def __init__(self, name, spec, gen, created, updated, anchor, cursor, next, paused, stats):
        self.name = name
        self.spec = spec
        self.gen = gen
        self.created = created
        self.updated = updated
        self.anchor = anchor
        self.cursor = cursor
        self.next = next
        self.paused = paused
        self.stats = stats


def _job(name, spec, gen, created, updated, anchor, cursor, nxt, paused, stats) -> dict:
    """A job record: ``{"name": name, "spec": spec, ...}`` in _JOB_FIELDS order, keys shared."""
    return _JobKeys(name, spec, gen, created, updated, anchor, cursor, nxt, paused, stats).__dict__


class _SpecKeys:
    """The key table of stored specs (_shared_keys)."""


class _RunKeys:
    """The key table of run records (_RUN_TEMPLATE and its copies)."""


def _shared_keys(kind: type, items=()) -> dict:
    """A dict with ``items`` (pairs, in order) whose key table is ``kind``'s, shared. Any key
    works: one that is not a str, or one past what a shared table holds, only costs the sharing.
    (Never from a dict: ``dict.update(dict)`` copies the other's table; its ``.items()`` do not.)"""
    d = object.__new__(kind).__dict__
    if items:
        d.update(items)
    return d


#: A new run, its fields in their order (the snapshot's bytes follow it). Runs are made by copying
#: it and setting the fields of the run: a copy of a map of constant keys costs ~0.5 us, a map
#: display of 18 keys ~1.2 us (Python 3.11), and every replica makes one per slot. Its copies
#: share its key table (_shared_keys). Never changed.
_RUN_TEMPLATE = _shared_keys(_RunKeys, {
    "id": None, "job": None, "slot": None, "state": "queued", "kind": "scheduled",
    "attempt": 1, "fencing_token": None, "worker": None, "queue": None,
    "priority": None, "tenant": None,
    "fired_at": None, "started_at": None, "finished_at": None, "error": None,
    "due": None, "deadline": None, "ttl": None,
}.items())
#: Most slots one fire entry may carry as runs: a plan runs up to max_catchup_max missed slots and
#: max_catchup_max on-time ones; plus one, the bound the entry check always had. The inline check
#: of _apply_fire and _check_fire_entry both use it.
_FIRE_ENTRY_RUNS_MAX = 2 * limits.max_catchup_max + 1
#: How far past its bound a job's history may grow while its oldest entry is still active
#: before trimming scans past it (SchedulerState._trim).
_TRIM_SCAN_SLACK = 16


def _ok(**fields) -> dict:
    fields["ok"] = True
    return fields


def _err(e: RaftschedError) -> dict:
    return {"ok": False, "error": e.to_dict()}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_stored_spec(spec) -> None:
    """A structural guard on a spec inside a command. Full validation (croniter, zoneinfo) runs
    on the proposer only: apply must not depend on a replica's library versions (I4)."""
    if not isinstance(spec, dict):
        raise InvalidCommand("spec is not a map")
    sched = spec.get("schedule")
    if not isinstance(sched, dict) or not (
        isinstance(sched.get("cron"), str) or _is_int(sched.get("every_s")) or _is_int(sched.get("at"))
    ):
        raise InvalidCommand("spec.schedule is malformed")
    for key, typ in (("executor", dict), ("misfire", dict), ("retry", dict), ("queue", str), ("tenant", str)):
        if not isinstance(spec.get(key), typ):
            raise InvalidCommand(f"spec.{key} is malformed")
    for key in ("priority", "timeout_s", "history"):
        if not _is_int(spec.get(key)):
            raise InvalidCommand(f"spec.{key} is malformed")
    ov = spec.get("overlap")
    if ov is not None and (not isinstance(ov, dict) or ov.get("policy") not in ("allow", "forbid", "queue_one", "replace")
                           or ("max_concurrent" in ov and not _is_int(ov["max_concurrent"]))):
        raise InvalidCommand("spec.overlap is malformed")
    if "jitter_ms" in sched and (not _is_int(sched["jitter_ms"]) or not isinstance(sched.get("jitter_key"), str)):
        raise InvalidCommand("spec.schedule jitter is malformed")
    m = spec["misfire"]
    if m.get("policy") not in ("fire_all", "fire_once", "skip") or not _is_int(m.get("grace_s")) or not _is_int(m.get("max_catchup")):
        raise InvalidCommand("spec.misfire is malformed")


def _check_put_job(cmd: dict, what: str) -> None:
    """The shape of one put_job payload (the put_job command itself, or an item of put_jobs)."""
    name, spec = cmd.get("name"), cmd.get("spec")
    if not isinstance(name, str) or not name:
        raise InvalidCommand(f"{what} needs name")
    try:
        _check_stored_spec(spec)
    except InvalidCommand as e:
        raise InvalidCommand(f"{what}: {e.message}") from None
    nxt, cursor, anchor = cmd.get("next"), cmd.get("cursor"), cmd.get("anchor")
    if nxt is not None and not _is_int(nxt):
        raise InvalidCommand(f"{what}.next must be an integer or nil")
    if not _is_int(cursor) or not _is_int(anchor):
        raise InvalidCommand(f"{what} needs cursor and anchor")


#: Parts of a spec that many jobs tend to share (the defaults, a fleet's templates). Specs are
#: never changed in place (a replace stores a new spec), so jobs may hold the same part objects.
_SHARED_PARTS = ("schedule", "misfire", "retry", "overlap", "payload")


def _freeze(v):
    """A hashable key for a spec part made of maps, lists and scalars (None: not shareable)."""
    if isinstance(v, dict):
        return ("d",) + tuple((k, _freeze(x)) for k, x in v.items())
    if isinstance(v, list):
        return ("l",) + tuple(_freeze(x) for x in v)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return (type(v).__name__, v)
    raise TypeError


def _part_key(k: str, v):
    """The sharing key of spec part ``k``: equal keys encode to the same bytes. Flat maps (most
    parts) by their items and the value types (True == 1 in a tuple, not on the wire)."""
    if type(v) is dict:
        key = (k, tuple(v.items()), tuple(map(type, v.values())))
        try:
            hash(key)  # TypeError for a value that is a map or a list: not flat
            return key
        except TypeError:
            pass
    return (k, _freeze(v))


def _intern_str(v):
    return sys.intern(v) if type(v) is str and len(v) <= 64 else v


#: The canonical order of a spec's keys in a version 3 snapshot: model.validate_job's, then any
#: other key (_spec_keys).
_SPEC_KEY_ORDER = {k: i for i, k in enumerate((
    "schedule", "executor", "payload", "timeout_s", "misfire", "retry", "queue", "priority",
    "tenant", "history", "overlap", "description"))}


def _spec_keys(spec: dict) -> tuple:
    """``spec``'s keys in canonical order: a version 3 snapshot writes (and a restore makes) every
    spec in it, so the bytes do not depend on the order a replica holds them in."""
    n = len(_SPEC_KEY_ORDER)
    return tuple(sorted(spec, key=lambda k: (_SPEC_KEY_ORDER.get(k, n), type(k).__name__, k)))


def _encode_ints(col):
    """A job column of ints (and None) as ``{"values": distinct values in order of first use,
    "index": [i, ...]}`` when it has at most half as many distinct values as jobs (a fleet
    registered together, jobs due at one time), else as it is. The index is small ints: they
    pack in a byte or two and unpack to Python's cached objects, and a restore holds one object
    for each value (an int past 256 is 32 bytes of its own). Only ints and None: True == 1 and
    0.0 == -0.0 must stay apart. All at C speed: ``map(len, repeat(seen))`` yields the next
    index just before ``seen.setdefault`` is called with it."""
    if not set(map(type, col)) <= _INT_OR_NONE:
        return col
    seen: dict = {}
    index = list(map(seen.setdefault, col, map(len, repeat(seen))))
    if 2 * len(seen) > len(col):
        return col
    return {"values": list(seen), "index": index}


def _decode_ints(col) -> list:
    if type(col) is dict:
        return list(map(col["values"].__getitem__, col["index"]))
    return col


def _count_fire(st: list, lag: int) -> None:
    """Count a scheduled run and its fire lag in a job's stats (STATS_FIELDS)."""
    st[_RUNS] += 1
    st[_LAG_LAST] = lag
    if lag > st[_LAG_MAX]:
        st[_LAG_MAX] = lag
    st[_LAG_SUM] += lag


def _check_disjoint(runs: list, rec: list) -> None:
    """Runs and records of one entry must cover disjoint slots: a slot is a run or recorded,
    once. (Checked before applying: an overlap would otherwise fail half-way, on a duplicate
    entry id, after some entries were already added.)"""
    spans = sorted([(s, s) for s in runs] + [(r[2], r[3]) for r in rec])
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        raise InvalidCommand("runs and records overlap")


class _DueWheel:
    """Jobs by next slot, a timer wheel: ``{slot_ms: [name, gen, name, gen, ...]}`` plus a heap
    of the distinct slots. Jobs that share a slot (every ``every_s: 60`` job, every ``0 * * * *``
    job) share one bucket, so a push and a pop are O(1) and the heap holds one entry per distinct
    time, not per job. A bucket is a flat list, two items a job, not a list of (name, gen)
    tuples: a tuple a job cost 64 bytes (1M jobs: 61 MiB), two list slots 16. Entries are
    checked lazily against the job (a replaced, paused, deleted or already fired job leaves a
    stale entry behind, skipped when met); the state rebuilds the wheel when stale entries
    outnumber the jobs. Derived, leader-only: not in the snapshot."""

    __slots__ = ("at", "times", "size")

    def __init__(self) -> None:
        #: slot -> [name, gen, name, gen, ...], the last job pushed last
        self.at: dict[int, list] = {}
        self.times: list[int] = []
        self.size = 0

    def push(self, slot: int, name: str, gen: int) -> None:
        bucket = self.at.get(slot)
        if bucket is None:
            self.at[slot] = [name, gen]
            heapq.heappush(self.times, slot)
        else:
            bucket.append(name)
            bucket.append(gen)
        self.size += 1

    def pop_until(self, until: int, limit: int, valid, jobs: dict, out: list, seen: set) -> None:
        times, at = self.times, self.at
        while times and times[0] <= until and len(out) < limit:
            t = times[0]
            bucket = at[t]
            while bucket and len(out) < limit:
                gen = bucket.pop()
                name = bucket.pop()
                self.size -= 1
                if name in seen or not valid(name, gen, t):
                    continue
                seen.add(name)
                out.append(jobs[name])
            if not bucket:
                heapq.heappop(times)
                del at[t]

    def reindex(self) -> None:
        """Make the heap of times and the size from the buckets, once they were filled directly
        (rebuild_due: pushing job by job kept a heap of times that was then rebuilt anyway)."""
        self.times = list(self.at)
        heapq.heapify(self.times)
        self.size = sum(map(len, self.at.values())) // 2

    def peek(self, valid) -> int | None:
        times, at = self.times, self.at
        while times:
            t = times[0]
            bucket = at[t]
            while bucket and not valid(bucket[-2], bucket[-1], t):
                del bucket[-2:]
                self.size -= 1
            if bucket:
                return t
            heapq.heappop(times)
            del at[t]
        return None


class SchedulerState(ExecutionMixin):
    """The whole replicated state of a raftsched cluster."""

    #: Whether apply takes the inlined fast paths of the hottest commands (fire's one-slot entry,
    #: complete_many's success). Always on; tests turn it off on an instance to compare the fast paths
    #: with the general code they stand for (tests/test_state_fast_paths.py).
    _fast_paths = True

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Whether apply keeps the due index (only a leader's trigger reads it). A node's
        #: trigger turns it on when it leads, with rebuild_due, and off when it stops: a
        #: follower would otherwise push every fired job and never pop, rebuilding the index
        #: whenever it held twice the jobs (measured: 2 % of a follower's time at 10k slots/s).
        self.due_index = True
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        #: name -> job record (see _apply_put_job)
        self.jobs: dict[str, dict] = {}
        #: run id -> run or recorded-slot record
        self.runs: dict[str, dict] = {}
        #: job name -> run ids, oldest first (bounded by the job's history)
        self.history: dict[str, list[str]] = {}
        #: queue name -> {"max_depth", "on_full"}
        self.queues: dict[str, dict] = {}
        #: request id -> result, FIFO-bounded by request_ids_max
        self.requests: OrderedDict[str, dict] = OrderedDict()
        #: highest ``now`` seen: state time never runs backwards
        self.now_ms = 0
        #: global, only-increasing counters
        self.gen = 0           # job generations (a replaced job gets a new one)
        self.manual_seq = 0    # manual trigger suffixes
        self.fencing_token = 0 # issue 3: tokens for leases
        self.applied = 0       # commands applied (including refused ones)
        self.leader: dict | None = None
        # Derived (not in the snapshot).
        self._due_now = _DueWheel()
        self._due_ahead = _DueWheel()
        #: frozen spec part -> the one object every job with that part holds (_share_spec)
        self._parts: dict[tuple, object] = {}
        #: int -> the one object jobs hold for it (_share_int)
        self._ints: dict[int, int] = {}
        self._queue_depth: dict[str, int] = {}
        self._reset_execution()

    # ------------------------------------------------------------------ apply
    def apply_bytes(self, data: bytes) -> dict:
        """Apply one committed command. Never raises (I3)."""
        with self.lock:
            self.applied += 1
            try:
                cmd = decode(data)
            except RaftschedError as e:
                return _err(e)
            except Exception as e:  # pragma: no cover - decode maps its errors already
                return _err(InvalidCommand(f"undecodable: {type(e).__name__}"))
            return self.apply(cmd)

    def apply(self, cmd: dict) -> dict:
        """Apply one decoded command (see commands.OPS). Never raises."""
        with self.lock:
            rid = cmd.get("rid")
            what = f"{cmd['op']}:{cmd.get('name') or cmd.get('run') or ''}"
            if rid is not None and rid in self.requests:  # I7: a retried request acts once
                seen_what, seen = self.requests[rid]
                if seen_what != what:
                    return _err(Conflict(
                        f"request id {rid!r} was already used for a different request ({seen_what})",
                        field="Idempotency-Key"))
                res = dict(seen)
                res["duplicate"] = True
                return res
            now = cmd["now"]
            if now > self.now_ms:  # I6: state time never runs backwards
                self.now_ms = now
            handler = getattr(self, "_apply_" + cmd["op"], None)
            try:
                if handler is None:
                    raise InvalidCommand(f"unknown op {cmd['op']!r}")
                res = handler(cmd, self.now_ms)
            except RaftschedError as e:
                res = _err(e)
            except Exception as e:
                # A bug, not a request: refuse as a value rather than wedge the replica. Every
                # replica runs the same code on the same input, so all refuse alike.
                res = _err(InvalidCommand(f"command could not be applied: {type(e).__name__}: {e}"))
            if rid is not None:
                self.requests[rid] = [what, res]
                while len(self.requests) > limits.request_ids_max:
                    self.requests.popitem(last=False)
            return res

    # Each handler validates every field it reads before it changes anything, so a refused
    # command leaves the state as it was.

    def _apply_noop(self, cmd, now):
        return _ok(now=now)

    def _apply_takeover(self, cmd, now):
        node = cmd.get("node")
        if not isinstance(node, str):
            raise InvalidCommand("takeover needs node")
        self.leader = {"node": node, "since": now}
        return _ok(extended=self._takeover_leases(now))

    def _apply_put_job(self, cmd, now):
        _check_put_job(cmd, "put_job")
        return self._put_job(cmd, now)

    def _put_job(self, cmd, now):
        """Create or replace one job from a payload ``_check_put_job`` accepted (a put_job command,
        or an item of put_jobs). :raises Conflict: create_only and the job exists.
        :raises LimitExceeded: a new job beyond jobs_max. Either raises before any change."""
        name, spec = cmd["name"], cmd["spec"]
        nxt, cursor, anchor = cmd.get("next"), cmd["cursor"], cmd["anchor"]
        create_only = bool(cmd.get("create_only"))
        old = self.jobs.get(name)
        if old is not None and create_only:
            raise Conflict(f"job {name!r} exists", field="name")
        if old is None and len(self.jobs) >= limits.jobs_max:
            raise LimitExceeded(f"the cluster holds {limits.jobs_max} jobs, its limit", field="name")
        self.gen += 1
        if old is not None and old["spec"]["schedule"] == spec["schedule"]:
            # Same schedule: keep the cursor and next slot, so a replace never re-fires a slot
            # nor loses a pending one.
            cursor, nxt, anchor = old["cursor"], old["next"], old["anchor"]
        elif old is not None:
            cursor = max(cursor, old["cursor"])
        spec = self._share_spec(spec)
        share = self._share_int
        job = _job(name, spec, self.gen, old["created"] if old else now, now,
                   share(anchor), share(cursor), share(nxt), old["paused"] if old else False,
                   old["stats"] if old else [0, 0, None, 0, 0])  # see STATS_FIELDS
        self.jobs[name] = job
        # A job's history list is made by its first entry (_add_entry), not here: an empty list
        # and its map entry cost ~110 bytes a job (1M jobs never fired: 105 MiB). The snapshot
        # writes no empty history, so a replica that made one writes the same bytes.
        hist = self.history.get(name)
        if hist is not None and len(hist) > spec["history"]:
            # A replace may lower the bound: trim now, not at the next fire.
            self._trim(hist, spec["history"], full=True)
        self._push_due(job)
        return _ok(job=name, gen=job["gen"], created=old is None)

    def _apply_put_jobs(self, cmd, now):
        """Create or replace several jobs in one command, in the order given (a chunk of
        POST /v1/jobs:batch). Each item is a put_job payload, applied exactly as a put_job
        command with the same fields would be.

        Every item is checked, and the jobs limit for all of them, before anything changes: a
        malformed item, or more new jobs than the cluster may still hold, refuses the whole
        command. An item whose job exists while it says ``create_only`` is refused alone (a
        conflict, listed by index in ``conflicts``); the others apply. The result is compact
        (it is kept with the request id for retries): per item, its generation (None when
        refused) and whether it created the job."""
        items = cmd.get("jobs")
        if not isinstance(items, list) or not items or len(items) > limits.put_jobs_items_max:
            raise InvalidCommand(f"put_jobs needs a list of 1-{limits.put_jobs_items_max} jobs")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidCommand(f"put_jobs.jobs[{i}] is not a map")
            _check_put_job(item, f"put_jobs.jobs[{i}]")
        new = {item["name"] for item in items if item["name"] not in self.jobs}
        if len(self.jobs) + len(new) > limits.jobs_max:
            raise LimitExceeded(f"{len(new)} new jobs would exceed the cluster's limit of {limits.jobs_max}",
                                field="jobs")
        gens, created, conflicts = [], [], []
        for i, item in enumerate(items):
            try:
                res = self._put_job(item, now)
            except Conflict:
                gens.append(None)
                created.append(False)
                conflicts.append(i)
                continue
            gens.append(res["gen"])
            created.append(res["created"])
        return _ok(gen=gens, created=created, conflicts=conflicts)

    def _job(self, cmd) -> dict:
        name = cmd.get("name")
        if not isinstance(name, str):
            raise InvalidCommand(f"{cmd['op']} needs name")
        job = self.jobs.get(name)
        if job is None:
            raise NotFound(f"no job named {name!r}", field="name")
        return job

    def _apply_delete_job(self, cmd, now):
        job = self._job(cmd)
        name = job["name"]
        for rid in self.history.pop(name, []):
            run = self.runs.pop(rid, None)
            if run is not None and run["state"] == "queued":
                self._queue_depth[run["queue"]] = self._queue_depth.get(run["queue"], 1) - 1
            elif run is not None and run["state"] == "running":
                # Its lease dies with it: the worker's heartbeat and completion are refused.
                self._running_count[run["queue"]] = self._running_count.get(run["queue"], 1) - 1
                self._running_ids.pop(run["id"], None)
            elif run is not None and run["state"] == "dead":
                # Out of its queue's DLQ index too: a stale id there would count against
                # dlq_per_queue_max (and purge a live dead run early) on this replica only.
                self._remove_dead(run)
        del self.jobs[name]
        return _ok(job=name, deleted=True)

    def _apply_pause_job(self, cmd, now):
        """Pause: no slot fires until resume. Runs fired ahead for slots after now (still
        queued, not yet startable) are recorded as skipped / paused, like the slots of the pause."""
        job = self._job(cmd)
        job["paused"] = True
        job["updated"] = now
        withdrawn = 0
        for rid in self.history.get(job["name"], ()):
            run = self.runs[rid]
            if run["state"] == "queued" and run["kind"] == "scheduled" and run["slot"] > now:
                self._unqueue_count(run)
                run.update(state="skipped", reason="paused", finished_at=now)
                withdrawn += 1
        if withdrawn:
            return _ok(job=job["name"], paused=True, withdrawn=withdrawn)
        return _ok(job=job["name"], paused=True)

    def _apply_resume_job(self, cmd, now):
        """Resume: slots that fell due while paused are recorded as skipped (paused), unless the
        command says ``catch_up``, in which case the misfire policy decides for them."""
        job = self._job(cmd)
        if not job["paused"]:
            return _ok(job=job["name"], paused=False)
        catch_up = bool(cmd.get("catch_up"))
        if not catch_up:
            nxt, rec = cmd.get("next"), cmd.get("rec")
            if nxt is not None and not _is_int(nxt):
                raise InvalidCommand("resume_job.next must be an integer or nil")
            if cmd.get("gen") != job["gen"] or cmd.get("after") != job["cursor"]:
                raise Conflict("the job changed while resuming; retry", field="name")
            upto = cmd.get("upto", now)
            if not _is_int(upto):
                raise InvalidCommand("resume_job.upto must be an integer")
            upto = max(job["cursor"], upto)
            # Validate every record before recording any: a refused command changes nothing,
            # and a record may only cover slots after the cursor (no slot handled twice).
            rec = rec or []
            self._check_records(rec, job["cursor"], upto)
            _check_disjoint([], rec)
            if rec:
                self._record(job, rec, now)
            job["cursor"] = upto
            job["next"] = nxt
        job["paused"] = False
        job["updated"] = now
        self._push_due(job)
        return _ok(job=job["name"], paused=False)

    def _apply_trigger_job(self, cmd, now):
        job = self._job(cmd)
        self.manual_seq += 1
        rid = f"{job['name']}@{now}!manual-{self.manual_seq}"
        run = self._new_run(job, now, now, rid, "manual")
        return _ok(job=job["name"], run=run["id"], state=run["state"])

    def _apply_put_queue(self, cmd, now):
        name = cmd.get("name")
        depth, on_full = cmd.get("max_depth"), cmd.get("on_full")
        if not isinstance(name, str) or not _is_int(depth) or on_full not in ("reject", "drop_oldest"):
            raise InvalidCommand("put_queue needs name, max_depth, on_full")
        self.queues[name] = {"max_depth": depth, "on_full": on_full}
        return _ok(queue=name)

    def _apply_fire(self, cmd, now):
        """Apply a batch of planned fires. An entry planned from a stale view (its job's
        generation or cursor moved since) is dropped whole: no slot can become two runs (I2).

        An entry is a list ``[job, gen, after, upto, next, runs, rec]`` (what the trigger
        proposes: see :func:`raftsched.core.policy.compact_entry`) or the same fields as a map
        (``policy.plan_fire``'s form; older logs). Every entry is checked before any applies.
        This is the hottest path of the cluster (every replica applies every slot), hence the
        inline checks for the common shape: one on-time run and no records.
        """
        entries = cmd.get("entries")
        if type(entries) is not list or len(entries) > limits.fire_entries_max:
            raise InvalidCommand("fire needs a bounded list of entries")
        checked = []
        for e in entries:
            if type(e) is list and len(e) == 7:
                name, gen, after, upto, nxt, runs, rec = e
                if (type(name) is str and type(gen) is int and type(after) is int and type(upto) is int
                        and type(runs) is list and 0 < len(runs) <= _FIRE_ENTRY_RUNS_MAX and type(rec) is list and not rec
                        and (nxt is None or (type(nxt) is int and nxt > upto))):
                    # What _check_fire_entry asks of an entry without records: slots ascending,
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
            self._check_fire_entry(e)
            checked.append((e["job"], e["gen"], e["after"], e["upto"], e.get("next"), e["runs"], e["rec"]))
        fired = stale = recorded = 0
        stale_jobs = []
        jobs, all_runs, history = self.jobs, self.runs, self.history
        queues, depths, queued = self.queues, self._queue_depth, self._queued
        due_index = self.due_index
        due_max = 2 * len(jobs) + 1024  # _push_due's rebuild bound (no fire adds or removes jobs)
        heappush = heapq.heappush
        fast = self._fast_paths
        for name, gen, after, upto, nxt, runs, rec in checked:
            job = jobs.get(name)
            if job is None or job["gen"] != gen or job["cursor"] != after or job["paused"]:
                # I2: a plan made from any other view of the job is dropped whole.
                stale += 1
                stale_jobs.append(name)
                continue
            spec = job["spec"]
            ov = spec.get("overlap")
            if fast and runs and not rec and (ov is None or (ov.get("policy") == "allow" and "max_concurrent" not in ov)):
                # The common case, inline: slots that all become runs (no records), an overlap
                # policy that reads no other run (policy.fires_ahead, so _overlap creates them),
                # room in its queue for all of them or a queue that drops its oldest run for each.
                # One slot when on time; several when the trigger catches up (which is when speed
                # matters most) or for a job firing every second (limits.fire_ahead_span_ms). Exactly what _new_run,
                # _add_entry, _enqueue and _push_due do, slot by slot, in the same order (the
                # property test in tests/test_state_fast_paths.py compares the two paths).
                qname = spec["queue"]
                q = queues.get(qname)
                depth = depths.get(qname, 0)
                max_depth = limits.queue_depth_default if q is None else q["max_depth"]
                # Room for every slot, or a full queue that drops its oldest run for each.
                if depth + len(runs) <= max_depth or (q is not None and q["on_full"] == "drop_oldest"):
                    prio, tenant, bound, stats = spec["priority"], spec["tenant"], spec["history"], job["stats"]
                    hist = history.get(name)
                    if hist is None:
                        hist = history[name] = []
                    prios = queued.get(qname)
                    if prios is None:
                        prios = queued[qname] = {}
                    h = prios.get(prio)
                    if h is None:
                        h = prios[prio] = []
                    by_slot = self._by_slot.get(qname)
                    for slot in runs:
                        if depth >= max_depth:
                            depths[qname] = depth
                            self._drop_oldest_queued(qname, now)  # before the new run exists, as _new_run
                            depth = depths[qname]
                            by_slot = self._by_slot.get(qname)
                        rid = f"{name}@{slot}"
                        run = _RUN_TEMPLATE.copy()
                        run["id"] = rid
                        run["job"] = name
                        run["slot"] = slot
                        run["queue"] = qname
                        run["priority"] = prio
                        run["tenant"] = tenant
                        run["fired_at"] = now
                        run["due"] = slot
                        _count_fire(stats, now - slot if now > slot else 0)
                        assert rid not in all_runs, f"I2: run id {rid} already exists"
                        all_runs[rid] = run
                        hist.append(rid)
                        excess = len(hist) - bound
                        if excess > 0:
                            # _trim, unless it would return at once: the oldest entry is still
                            # active and this is not a scan turn (a backlog, or a sweep's queued runs).
                            head = all_runs[hist[0]]["state"]
                            if (head in TERMINAL_STATES and head != "dead") or not excess % _TRIM_SCAN_SLACK:
                                self._trim(hist, bound)
                        heappush(h, (slot, rid))
                        depth += 1
                        if by_slot is not None:
                            heappush(by_slot, (slot, rid))
                    depths[qname] = depth
                    if len(h) > 2 * depth + limits.queue_index_stale_slack:
                        self._compact_queued(qname, prio, h)
                    if by_slot is not None and len(by_slot) > 2 * depth + limits.queue_index_stale_slack:
                        del self._by_slot[qname]
                    fired += len(runs)
                    job["cursor"] = upto
                    job["next"] = nxt
                    if nxt is not None and due_index:
                        wheel = self._due_ahead  # fires_ahead: this job's wheel (_push_due)
                        wheel.push(nxt, name, gen)
                        if wheel.size > due_max:
                            self.rebuild_due()
                    continue
            if rec:
                # Oldest slot first, runs and records interleaved, so history reads in slot order.
                items = sorted([(slot, None) for slot in runs] + [(r[2], r) for r in rec], key=lambda it: it[0])
            else:
                items = [(slot, None) for slot in runs]
            for slot, r in items:
                if r is None:
                    rid = f"{name}@{slot}"
                    blocked = self._overlap(job, rid, now)
                    if blocked is not None:
                        # The slot is handled (the cursor passes it) but becomes a record.
                        self._add_entry(job, {"id": rid, "job": name, "slot": slot, "state": blocked,
                                              "reason": "overlap", "kind": "recorded", "fired_at": now})
                        job["stats"][_RECORDED] += 1
                        recorded += 1
                        continue
                    self._new_run(job, slot, now, rid, "scheduled")
                    fired += 1
                else:
                    recorded += self._record(job, [r], now)
            job["cursor"] = upto
            job["next"] = nxt
            self._push_due(job)
        if stale_jobs:
            return _ok(fired=fired, recorded=recorded, stale=stale, stale_jobs=stale_jobs)
        return _ok(fired=fired, recorded=recorded, stale=stale)

    def _check_fire_entry(self, e) -> None:
        if not isinstance(e, dict):
            raise InvalidCommand("fire entry is not a map or a 7-item list")
        if not isinstance(e.get("job"), str) or not _is_int(e.get("gen")) or not _is_int(e.get("after")) or not _is_int(e.get("upto")):
            raise InvalidCommand("fire entry needs job, gen, after, upto")
        runs, rec, nxt = e.get("runs"), e.get("rec"), e.get("next")
        if not isinstance(runs, list) or not all(_is_int(s) for s in runs) or len(runs) > _FIRE_ENTRY_RUNS_MAX:
            raise InvalidCommand("fire entry runs malformed")
        if runs != sorted(set(runs)) or (runs and (runs[0] <= e["after"] or runs[-1] > e["upto"])):
            raise InvalidCommand("fire entry runs must be ascending, unique and inside (after, upto]")
        if e["upto"] < e["after"]:
            # The cursor would move back and let slots already handled fire again.
            raise InvalidCommand("fire entry upto must not be before after")
        if nxt is not None and (not _is_int(nxt) or nxt <= e["upto"]):
            raise InvalidCommand("fire entry next must be after upto")
        self._check_records(rec, e["after"], e["upto"])
        _check_disjoint(runs, rec)

    def _check_records(self, rec, after, upto) -> None:
        if not isinstance(rec, list) or len(rec) > 4:
            raise InvalidCommand("records malformed")
        for r in rec:
            if not (isinstance(r, list) and len(r) == 5 and r[0] in ("skipped", "coalesced")
                    and isinstance(r[1], str) and _is_int(r[2]) and _is_int(r[3])
                    and (r[4] is None or _is_int(r[4])) and after < r[2] <= r[3] <= upto):
                raise InvalidCommand("record malformed")

    # ------------------------------------------------------------------ memory
    def _share_spec(self, spec: dict) -> dict:
        """The same spec, holding shared objects for the parts other jobs have identical, and
        interned short strings. Derived and invisible: the snapshot bytes do not change. At 1M
        jobs the parts were ~1.1 KB of a job's ~2.7 KB (docs/benchmarks.md, "Scale")."""
        parts = self._parts
        out = _shared_keys(_SpecKeys)
        for k, v in spec.items():
            if k in _SHARED_PARTS:
                try:
                    key = _part_key(k, v)
                except TypeError:
                    out[k] = v
                    continue
                shared = parts.get(key)
                if shared is None:
                    if len(parts) < limits.shared_spec_parts_max:
                        parts[key] = v
                    shared = v
                out[k] = shared
            elif type(v) is dict:
                out[k] = {kk: _intern_str(vv) for kk, vv in v.items()}
            elif type(v) is int:
                out[k] = self._share_int(v)
            else:
                out[k] = _intern_str(v)
        return out

    def _share_int(self, v):
        """``v``, or an equal int object already held by another job: jobs registered together
        share their anchor, cursor and next slot, and a fleet its timeout (an int past 256 is a
        32-byte object of its own each time it is decoded). Invisible in the bytes. Only exact
        ints (True == 1 as a key); the cache is emptied when it reaches its bound."""
        if type(v) is not int:
            return v
        ints = self._ints
        shared = ints.get(v)
        if shared is None:
            if len(ints) >= 4096:
                ints.clear()
            shared = ints[v] = v
        return shared

    # ------------------------------------------------------------------ overlap
    def _active_runs(self, job: dict) -> list[dict]:
        """The job's queued and running runs (scans its history, which bounds them)."""
        out = []
        for rid in self.history.get(job["name"], ()):
            run = self.runs.get(rid)
            if run is not None and run["state"] in ("queued", "running"):
                out.append(run)
        return out

    def _overlap(self, job: dict, new_id: str, now: int) -> str | None:
        """Apply the job's overlap policy to a slot about to become a run (DESIGN.md section 4).

        :returns: None to create the run, or the state ("skipped" / "coalesced") to record the
            slot as instead. ``replace`` revokes the active runs first: a running run's token
            goes stale (its heartbeat and completion are refused, its worker kills it).
        """
        if fires_ahead(job["spec"]):
            return None  # allow without max_concurrent: nothing here depends on other runs
        ov = job["spec"]["overlap"]
        policy = ov["policy"]
        active = self._active_runs(job)
        if policy == "allow":
            return "skipped" if len(active) >= ov["max_concurrent"] else None
        if policy == "forbid":
            return "skipped" if active else None
        if policy == "queue_one":
            return "coalesced" if any(r["state"] == "queued" for r in active) else None
        for run in active:  # replace
            self._revoke(run, now, f"replaced by run {new_id} (overlap policy replace)")
        return None

    def _revoke(self, run: dict, now: int, why: str) -> None:
        q = run["queue"]
        if run["state"] == "running":
            self._running_count[q] = self._running_count.get(q, 1) - 1
            self._running_ids.pop(run["id"], None)
            run.setdefault("attempts", []).append({
                "attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
                "started_at": run["started_at"], "finished_at": now, "ok": False, "error": why})
        else:
            self._unqueue_count(run)
        run.update(state="failed", error=why, finished_at=now, deadline=None)

    # ------------------------------------------------------------------ runs
    def _new_run(self, job: dict, slot: int, now: int, rid: str, kind: str) -> dict:
        spec = job["spec"]
        qname = spec["queue"]
        q = self.queues.get(qname, {"max_depth": limits.queue_depth_default, "on_full": "reject"})
        depth = self._queue_depth.get(qname, 0)
        lag = max(0, now - slot)
        if depth >= q["max_depth"]:
            if q["on_full"] == "reject":
                return self._add_entry(job, {
                    "id": rid, "job": job["name"], "slot": slot, "state": "skipped",
                    "reason": "queue_full", "kind": kind, "fired_at": now, "queue": qname,
                })
            self._drop_oldest_queued(qname, now)
        run = _RUN_TEMPLATE.copy()
        run["id"] = rid
        run["job"] = job["name"]
        run["slot"] = slot
        run["kind"] = kind
        run["queue"] = qname
        run["priority"] = spec["priority"]
        run["tenant"] = spec["tenant"]
        run["fired_at"] = now
        run["due"] = slot
        if kind == "scheduled":
            # Fire lag is a property of the trigger: manual runs (lag 0 by definition) stay out.
            _count_fire(job["stats"], lag)
        self._add_entry(job, run)
        self._enqueue(run)  # counts it in the queue's depth (re-read: drop_oldest may have lowered it)
        return run

    def _record(self, job: dict, recs: list, now: int) -> int:
        n = 0
        for state, reason, lo, hi, count in recs:
            rid = f"{job['name']}@{lo}"
            entry = {"id": rid, "job": job["name"], "slot": lo, "state": state, "reason": reason,
                     "kind": "recorded", "fired_at": now}
            if hi != lo or count != 1:
                entry["slot_to"] = hi
                entry["count"] = count
            self._add_entry(job, entry)
            job["stats"][_RECORDED] += 1 if count is None else count
            n += 1
        return n

    def _add_entry(self, job: dict, entry: dict) -> dict:
        rid = entry["id"]
        assert rid not in self.runs, f"I2: run id {rid} already exists"
        self.runs[rid] = entry
        hist = self.history.setdefault(job["name"], [])
        hist.append(rid)
        bound = job["spec"]["history"]
        if len(hist) > bound:
            self._trim(hist, bound)
        return entry

    def _trim(self, hist: list[str], bound: int, full: bool = False) -> None:
        """Drop the oldest finished entries beyond the bound; queued/running ones stay.

        Dead runs are the dead-letter queue: they leave by requeue, delete or its own bound.

        The common case is O(1): the oldest entries are finished and go from the front. When the
        oldest entry is still queued, running or dead (a backlog, or the DLQ), finding finished
        entries behind it means scanning the history, so that scan runs only on every
        ``_TRIM_SCAN_SLACK``-th entry past the bound (or when ``full``): behind such an entry,
        finished entries over the bound wait for at most that many more adds. (Scanning on every
        fire cost 30 % of a follower's time with 50 queued runs a job: scripts/profile_fire.py.)
        The rule reads only replicated state, so every replica trims the same entries."""
        excess = len(hist) - bound
        runs = self.runs
        while excess > 0:
            st = runs[hist[0]]["state"]
            if st not in TERMINAL_STATES or st == "dead":
                break
            del runs[hist[0]]
            del hist[0]
            excess -= 1
        if excess <= 0 or (excess % _TRIM_SCAN_SLACK and not full):
            return
        keep = []
        for rid in hist:
            st = runs[rid]["state"]
            if excess > 0 and st in TERMINAL_STATES and st != "dead":
                del runs[rid]
                excess -= 1
            else:
                keep.append(rid)
        hist[:] = keep

    # ------------------------------------------------------------------ derived: due index
    # Two timer wheels (_DueWheel) keyed by next slot: jobs that fire ahead (policy.fires_ahead)
    # and the others. The leader pops the first up to limits.fire_ahead_ms past now, the others
    # up to now; pop_due's ``ahead_ms`` defaults to 0, which pops both by their slot.

    def _push_due(self, job: dict) -> None:
        nxt = job["next"]
        if nxt is not None and not job["paused"] and self.due_index:
            wheel = self._due_ahead if fires_ahead(job["spec"]) else self._due_now
            wheel.push(nxt, job["name"], job["gen"])
            if wheel.size > 2 * len(self.jobs) + 1024:
                self.rebuild_due()

    def rebuild_due(self) -> None:
        """Rebuild the due index from the jobs (on restore, and on becoming leader)."""
        with self.lock:
            self._due_now, self._due_ahead = _DueWheel(), _DueWheel()
            if not self.due_index:
                return
            # The buckets are filled directly and the heaps of times made once (what push does
            # job by job, in the same order), and fires_ahead is asked once per overlap object:
            # it reads only the spec's overlap, and jobs share those objects (1M jobs: ~1 s less).
            at = (self._due_now.at, self._due_ahead.at)
            ahead_of: dict[int, bool] = {}
            for n, j in self.jobs.items():
                nxt = j["next"]
                if nxt is None or j["paused"]:
                    continue
                spec = j["spec"]
                ov = spec.get("overlap")
                ahead = ahead_of.get(id(ov))
                if ahead is None:
                    ahead = ahead_of[id(ov)] = fires_ahead(spec)
                wheel = at[ahead]
                bucket = wheel.get(nxt)
                if bucket is None:
                    wheel[nxt] = [n, j["gen"]]
                else:
                    bucket.append(n)
                    bucket.append(j["gen"])
            self._due_now.reindex()
            self._due_ahead.reindex()

    def _due_valid(self, name: str, gen: int, nxt: int) -> bool:
        job = self.jobs.get(name)
        return job is not None and job["gen"] == gen and job["next"] == nxt and not job["paused"]

    def pop_due(self, now_ms: int, limit: int, ahead_ms: int = 0) -> list[dict]:
        """Pop up to ``limit`` jobs to plan at ``now_ms`` (leader only): those whose next slot is
        at or before it, and, with ``ahead_ms``, the jobs that fire ahead whose next slot is at
        most that much later. Earliest slots first within each kind.

        A popped job comes back into the index when its fire applies (or by ``repush``)."""
        with self.lock:
            out: list[dict] = []
            seen: set[str] = set()
            self._due_ahead.pop_until(now_ms + ahead_ms, limit, self._due_valid, self.jobs, out, seen)
            self._due_now.pop_until(now_ms, limit, self._due_valid, self.jobs, out, seen)
            return out

    def set_due_index(self, on: bool) -> None:
        """Keep (and rebuild) the due index, or drop it (see ``due_index``)."""
        with self.lock:
            self.due_index = on
            self.rebuild_due()

    def next_due_ms(self, ahead_ms: int = 0) -> int | None:
        """When the leader should next plan something (see pop_due), or None."""
        with self.lock:
            a = self._due_ahead.peek(self._due_valid)
            b = self._due_now.peek(self._due_valid)
            cands = ([] if a is None else [a - ahead_ms]) + ([] if b is None else [b])
            return min(cands) if cands else None

    def repush(self, names) -> None:
        with self.lock:
            for n in names:
                job = self.jobs.get(n)
                if job is not None:
                    self._push_due(job)

    # ------------------------------------------------------------------ snapshot
    # Version 3 (docs/design.md, "Snapshots"): the jobs as columns, one list a field, instead of
    # a map a job: the field names are written once, not once a job, and a restore makes each
    # job's record with one map display instead of unpacking ~30 objects a job. A spec is
    # written as a template (its fields in canonical order (_spec_keys) but the executor, spec
    # parts by index into "parts") and its own executor; jobs with equal templates share one.
    # Templates and parts are indexed by content, in order of first use, so replicas that share
    # objects differently (or hold a spec's keys in another order) still write the same bytes.
    # Histories are written in job order, by job position, only when not empty.
    def _snapshot_obj(self) -> dict:
        parts: list = []
        part_index: dict = {}
        key_of: dict[int, object] = {}

        def part_ref(k, v) -> int:
            key = key_of.get(id(v))
            if key is None:
                try:
                    key = _part_key(k, v)
                except TypeError:
                    key = ("unshareable", id(v))
                key_of[id(v)] = key
            i = part_index.get(key)
            if i is None:
                i = part_index[key] = len(parts)
                parts.append(v)
            return i

        specs: list = []          # templates, by first use
        spec_index: dict = {}     # content key -> template index
        by_ids: dict = {}         # (keys, ids of the values) -> template index: a memo

        def template_of(spec: dict):
            """The template index of ``spec``, the number of its keys, a getter of its values
            (the executor last) and the values but the executor, or no getter when the spec has
            no executor."""
            keys = _spec_keys(spec)
            has_exec = "executor" in spec
            rest = tuple(k for k in keys if k != "executor")
            get = itemgetter(*rest, "executor") if has_exec else None
            vals = tuple(spec[k] for k in rest)
            memo = (rest, has_exec, tuple(map(id, vals)))
            ti = by_ids.get(memo)
            if ti is None:
                tmpl, key, own = {}, [], False
                for k in keys:
                    v = spec[k]
                    if k == "executor":
                        tmpl[k] = None
                        key.append((k,))
                    elif k in _SHARED_PARTS:
                        tmpl[k] = i = part_ref(k, v)
                        key.append((k, i))
                    else:
                        tmpl[k] = v
                        t = type(v)
                        # Equal and of one type encode alike (True == 1, 0.0 == -0.0 do not);
                        # any other value keeps a template of its own.
                        if t is str or t is int or t is bool or v is None:
                            key.append((k, t, v))
                        else:
                            key.append((k, id(spec)))
                            own = True
                key = tuple(key)
                ti = spec_index.get(key)
                if ti is None:
                    ti = spec_index[key] = len(specs)
                    specs.append(tmpl)
                if own:
                    # A template of its own must stay one on every replica: never found again
                    # by the identity of its values (a replica whose jobs happen to hold the
                    # same float object would otherwise write fewer templates).
                    return ti, len(spec), None, vals
                by_ids[memo] = ti
            return ti, len(spec), get, vals

        fields = itemgetter(*_JOB_FIELDS)
        nf = len(_JOB_FIELDS)
        names, records = list(self.jobs), list(self.jobs.values())
        others: list = []
        cols = None
        if set(map(len, records)) <= {nf}:
            try:  # a column a field, at C speed, when every job is of this shape
                cols = [list(map(itemgetter(f), records)) for f in _JOB_FIELDS]
            except KeyError:
                pass
        if cols is None or cols[0] != names or set(map(type, cols[1])) - {dict}:
            rows = []
            for pos, (name, job) in enumerate(zip(names, records)):
                row = None
                if len(job) == nf:
                    try:
                        row = fields(job)
                    except KeyError:
                        pass
                if row is None or row[0] != name or type(row[1]) is not dict:
                    others.append([pos, name, job])  # not a job record of this version: written whole
                else:
                    rows.append(row)
            cols = [list(col) for col in zip(*rows)] if rows else [[] for _ in _JOB_FIELDS]
            del rows
        del records
        history = self.history
        hist_at, hist = [], []
        if history:
            hist = list(map(history.get, names))
            hist_at = [pos for pos, h in enumerate(hist) if h]
            hist = [hist[pos] for pos in hist_at]
            if len(hist) < len(history):  # a history with no job (or empty ones): by name, after
                jobs = self.jobs
                for name, h in history.items():
                    if h and name not in jobs:
                        hist_at.append(name)
                        hist.append(h)
        del names
        # Templates: a job whose spec holds the very objects of the previous job's (a fleet)
        # takes its template without looking at the content.
        spec_col, execs = [], []
        ti, n, get, same = -1, -1, None, ()
        for spec in cols[1]:
            if len(spec) == n:
                try:
                    vals = get(spec)
                except KeyError:
                    vals = None
                if vals is not None and all(map(is_, vals, same)):
                    spec_col.append(ti)
                    execs.append(vals[-1])
                    continue
            ti, n, get, same = template_of(spec)
            if get is None:
                n = -1
            spec_col.append(ti)
            execs.append(spec.get("executor"))
        columns = dict(zip(_JOB_FIELDS, cols))
        for f in _SHARED_INT_FIELDS:
            columns[f] = _encode_ints(columns[f])
        columns["spec"] = spec_col
        columns["executor"] = execs
        return {
            "v": SNAPSHOT_VERSION, "parts": parts, "specs": specs, "jobs": columns, "jobs_other": others,
            "runs": self.runs, "history_at": hist_at, "history": hist,
            "queues": self.queues, "requests": list(self.requests.items()), "now_ms": self.now_ms,
            "gen": self.gen, "manual_seq": self.manual_seq, "fencing_token": self.fencing_token,
            "applied": self.applied, "leader": self.leader,
            "tenants": self.tenants, "locks": self.locks,
        }

    def snapshot(self) -> bytes:
        """The whole state as bytes (msgpack). The collector is paused meanwhile: building the
        snapshot's job maps allocates millions of containers at 1M jobs, and young collections
        over a large heap made it 2.7x slower (200 000 jobs: 3.5 s -> 1.3 s)."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self.lock:
                return msgpack.packb(self._snapshot_obj(), use_bin_type=True)
        finally:
            if was_enabled:
                gc.enable()

    def restore(self, data: bytes) -> None:
        """Discard all state and load a snapshot. :raises ValueError: for a newer version.

        The collector is paused while it runs: unpacking creates every object of the state
        (tens of millions at 1M jobs), and young collections over them cost more than the
        unpacking itself (docs/benchmarks.md, "Scale")."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._restore(data)
        finally:
            if was_enabled:
                gc.enable()

    def _part_resolver(self, parts: list):
        """A function that replaces a snapshot spec's (or template's) part indexes by the parts
        themselves (versions 2 and 3), seeding each part once for later put_jobs to share."""
        seeded = [False] * len(parts)

        def resolve(spec: dict) -> None:
            for k in _SHARED_PARTS:
                if k in spec:
                    i = spec[k]
                    spec[k] = parts[i]
                    if not seeded[i]:
                        seeded[i] = True
                        self._seed_parts(k, parts[i])
        return resolve

    def _seed_parts(self, k: str, part) -> None:
        """Later put_jobs share this restored part object."""
        if len(self._parts) < limits.shared_spec_parts_max:
            try:
                self._parts.setdefault(_part_key(k, part), part)
            except TypeError:
                pass

    def _restore(self, data: bytes) -> None:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
        if obj.get("v") not in (1, 2, 3):
            raise ValueError(f"snapshot version {obj.get('v')} is not 1, 2 or {SNAPSHOT_VERSION}")
        with self.lock:
            self._reset()
            due_built = False
            if obj["v"] == 3:
                due_built = self._restore_jobs_v3(obj)
            else:
                self._restore_jobs_v2(obj)
            runs = obj["runs"]
            for rid, run in runs.items():  # to the key table runs are made with (_RUN_TEMPLATE)
                if type(run) is dict:
                    runs[rid] = _shared_keys(_RunKeys, run.items())
            self.runs = runs
            self.queues = obj["queues"]
            self.requests = OrderedDict((k, v) for k, v in obj["requests"])
            self.now_ms = obj["now_ms"]
            self.gen = obj["gen"]
            self.manual_seq = obj["manual_seq"]
            self.fencing_token = obj["fencing_token"]
            self.applied = obj["applied"]
            self.leader = obj["leader"]
            if not due_built:
                self.rebuild_due()
            self.tenants = obj["tenants"]
            self.locks = obj["locks"]
            self._rebuild_execution()

    def _restore_jobs_v2(self, obj: dict) -> None:
        """Jobs and histories of a version 1 or 2 snapshot: a map a job."""
        self.jobs = obj["jobs"]
        if obj["v"] == 1:
            for job in self.jobs.values():
                job["spec"] = self._share_spec(job["spec"])
                st = job["stats"]
                job["stats"] = [st[k] for k in STATS_FIELDS]  # version 1 kept a map
        else:
            resolve = self._part_resolver(obj["parts"])
            for job in self.jobs.values():
                spec = job["spec"]
                resolve(spec)
                for k, v in spec.items():  # the other fields as _share_spec holds them
                    t = type(v)
                    if t is str:
                        spec[k] = _intern_str(v)
                    elif t is int:
                        spec[k] = self._share_int(v)
                    elif t is dict and k not in _SHARED_PARTS:
                        spec[k] = {kk: _intern_str(vv) for kk, vv in v.items()}
        # One object for a job's name and equal positions, as _put_job holds them: version 3's
        # snapshot finds a fleet's template by the identity of its values (_snapshot_obj).
        share = self._share_int
        for name, job in self.jobs.items():
            if job.get("name") == name:
                job["name"] = name
            for k in _SHARED_INT_FIELDS:
                if k in job:
                    job[k] = share(job[k])
        # Empty histories are not kept (_put_job): versions 1 and 2 wrote one for every job.
        self.history = {name: h for name, h in obj["history"].items() if h}

    def _restore_jobs_v3(self, obj: dict) -> bool:
        """Jobs and histories of a version 3 snapshot (see _snapshot_obj). :returns: whether it
        built the due index too (from the columns: what rebuild_due makes, without walking the
        job records again; fires_ahead reads the overlap only, so a template answers for its
        jobs)."""
        tmpls, has_exec = obj["specs"], []
        resolve = self._part_resolver(obj["parts"])
        for i, t in enumerate(tmpls):
            resolve(t)
            has_exec.append("executor" in t)
            tmpls[i] = _shared_keys(_SpecKeys, t.items())  # its copies share its key table
        c = obj["jobs"]
        cols = [(_decode_ints(c[f]) if f in _SHARED_INT_FIELDS else c[f]) for f in _JOB_FIELDS]
        n = len(cols[0])
        if any(len(col) != n for col in cols) or len(c["executor"]) != n:
            raise ValueError("snapshot job columns differ in length")
        jobs: dict = {}
        job = _JobKeys  # _job, without its call
        for name, ti, ex, g, cr, up, an, cu, nx, pa, st in zip(
                cols[0], cols[1], c["executor"], *cols[2:]):
            spec = tmpls[ti].copy()
            if has_exec[ti]:
                spec["executor"] = ex
            jobs[name] = job(name, spec, g, cr, up, an, cu, nx, pa, st).__dict__
        others = obj["jobs_other"]
        if others:  # jobs of another shape, at their positions
            merged, it = {}, iter(jobs.items())
            for pos, name, job in others:
                while len(merged) < pos:
                    k, v = next(it)
                    merged[k] = v
                if isinstance(job.get("spec"), dict):
                    job["spec"] = self._share_spec(job["spec"])
                merged[name] = job
            for k, v in it:
                merged[k] = v
            jobs = merged
        self.jobs = jobs
        names = list(jobs) if obj["history_at"] else []
        self.history = {(names[p] if type(p) is int else p): h
                        for p, h in zip(obj["history_at"], obj["history"])}
        if others or not self.due_index:
            return False
        ahead = [fires_ahead(t) for t in tmpls]
        at = (self._due_now.at, self._due_ahead.at)
        for name, ti, g, nx, pa in zip(cols[0], cols[1], cols[2], cols[7], cols[8]):
            if nx is None or pa:
                continue
            wheel = at[ahead[ti]]
            bucket = wheel.get(nx)
            if bucket is None:
                wheel[nx] = [name, g]
            else:
                bucket.append(name)
                bucket.append(g)
        self._due_now.reindex()
        self._due_ahead.reindex()
        return True

    def state_hash(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()

    # ------------------------------------------------------------------ reads
    def queue_depth(self, name: str) -> int:
        with self.lock:
            return self._queue_depth.get(name, 0)
