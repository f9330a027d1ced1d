"""The shapes of the state's records, and the memory they cost.

Jobs, specs and runs are plain dicts (they are encoded as they are, and every edge reads them as
maps), made here so that records of one kind share one key table, and so that equal spec parts
and equal integers of different jobs are one object. None of this is visible in a snapshot's
bytes: it only decides how much a replica holds per job (docs/benchmarks.md, "Scale").

Also here, because every handler module needs them: the result helpers (``ok``, ``err``), the
integer check apply uses on command fields (``is_int``) and a job's counters (``STATS_FIELDS``).
"""
from __future__ import annotations

import sys
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import chain
from typing import Any, TypeAlias, TypeGuard, TypeVar

import msgpack

from . import limits
from .errors import Conflict, RaftschedError

T = TypeVar("T")

#: A record of the state: a job, a spec or a part of one, a run or a recorded slot, a queue, a
#: tenant's bucket, a lock, a worker, a backfill... Plain dicts (see below), so typed as maps.
Record: TypeAlias = dict[str, Any]
#: What a handler returns, and apply: ``ok(...)`` or ``err(e)``, kept with its request id.
Result: TypeAlias = dict[str, Any]
#: The state's tables of shared objects (SchedulerState._parts, _ints): sharing key -> part,
#: int -> the one object jobs hold for it.
PartTable: TypeAlias = dict[tuple[str, bytes], Any]
IntTable: TypeAlias = dict[int, int]

#: The stored spec key of a job written by a token limited to tenants (tenants.LIMITED, which
#: names it there; here so that events.route reads it without importing the tenants' module).
LIMITED = "limited"
#: A run's key, set when it was granted to a worker without its handler once its wait was over
#: (leases.apply_acquire): it is held back for a handler no more, so a refused run's retries reach
#: the dead-letter queue at once, not a wait each. A DLQ requeue (queues.py) clears it.
HANDLER_WAITED = "handler_waited"

#: A job's counters, a list (a 5-key map cost ~200 bytes a job; 1M jobs: 190 MB).
STATS_FIELDS = ("runs", "recorded", "lag_ms_last", "lag_ms_max", "lag_ms_sum")
RUNS, RECORDED, LAG_LAST, LAG_MAX, LAG_SUM = range(5)
#: A job record's fields (jobs.put_job), in the order of its map and of a version 3 snapshot's
#: columns.
JOB_FIELDS = ("name", "spec", "gen", "created", "updated", "anchor", "cursor", "next", "paused", "stats")


def cut_by(items: Iterable[T], size_of: Callable[[T], int], count_max: int, bytes_max: int) -> list[list[T]]:
    """``items`` in order, cut into runs of at most ``count_max`` items whose ``size_of`` sum to
    at most ``bytes_max`` (what a sender puts in one command or request). An item larger than
    ``bytes_max`` alone is a run of its own (its receiver then says why it refuses it)."""
    out: list[list[T]] = []
    cur: list[T] = []
    size = 0
    for it in items:
        n = size_of(it)
        if cur and (len(cur) >= count_max or size + n > bytes_max):
            out.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += n
    if cur:
        out.append(cur)
    return out


def ok(**fields: Any) -> Result:
    """A handler's result for a command that applied."""
    fields["ok"] = True
    return fields


def err(e: RaftschedError) -> Result:
    """The result of a refused command: the error as a value, kept with its request id."""
    return {"ok": False, "error": e.to_dict()}


def is_int(v: object) -> TypeGuard[int]:
    """Whether a command field is an integer (a bool is not, though Python says so)."""
    return isinstance(v, int) and not isinstance(v, bool)


#: Characters that change how the text around them reads, unseen: the direction marks,
#: embeddings, overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069) and
#: the line and paragraph separators (U+2028, U+2029). An operator's words (core/bodies.py) and
#: the URLs a spec holds (a job's http executor, a sink's) refuse them: shown in the dashboard,
#: the CLI and the logs, they would read otherwise than they were written.
LAYOUT_CHARS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")
#: What the refusals say.
LAYOUT_CHARS_SAID = ("a direction mark, embedding, override or isolate (U+061C, U+200E-U+200F, U+202A-U+202E, "
                     "U+2066-U+2069) or a line or paragraph separator (U+2028, U+2029)")


def bound_text(v: object, n: int) -> str | None:
    """Bound a text field: its last ``n`` characters (the end of an error says the most)."""
    if v is None:
        return None
    v = str(v)
    return v if len(v) <= n else "…" + v[-(n - 1):]


#: A succeeded run's ``attempts`` when it kept no record before its success's (which it does not
#: keep: ``attempts_of``): one shared empty tuple, the key in the place the record's list had.
NONE_KEPT: tuple[()] = ()


def final_attempt(run: Record) -> Record:
    """The record of a succeeded run's last attempt, which leases.close_attempt does not keep:
    the run's own fields say all of it (``attempts_of``)."""
    error = run["error"]
    return {"attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
            "started_at": run["started_at"], "finished_at": run["finished_at"], "ok": True,
            "error": None if error is None else bound_text(error, limits.attempt_error_chars_max)}


#: The keys of an attempt's record, in the order every version wrote them (final_attempt).
FINAL_KEYS = ("attempt", "token", "worker", "started_at", "finished_at", "ok", "error")


def success_implied(run: Record) -> bool:
    """Whether ``run`` succeeded through a lease's success (leases.close_attempt), whose attempt
    record is not kept in ``run["attempts"]`` (``NONE_KEPT``, or the attempts before, each of
    which failed or was lost or given back) but made from the run's fields when read. A
    heartbeat ping's success keeps its record (its last is ``ok``); a record of another shape,
    restored from an older snapshot, is shown as it is."""
    if run.get("state") != "succeeded":
        return False
    kept = run.get("attempts", 0)
    if type(kept) is not list and kept is not NONE_KEPT:
        return False  # none (older records), or not a list of records
    if kept and (type(kept[-1]) is not dict or kept[-1].get("ok") is not False):
        return False
    return FINAL_FIELDS <= run.keys()


#: The fields of a run final_attempt reads (snapshot.py checks them too).
FINAL_FIELDS = frozenset(("attempt", "fencing_token", "worker", "started_at", "finished_at", "error"))


def attempts_of(run: Record) -> list[Record]:
    """``run``'s attempts as the API shows them (a new list): the records kept, and a succeeded
    run's last attempt when it is not kept (``success_implied``). The close that did not keep it
    made room for it as if it had (leases.close_attempt), so these are the records the code that
    kept every attempt held."""
    kept = list(run.get("attempts") or ())
    if success_implied(run):
        kept.append(final_attempt(run))
    return kept


def kept_attempts(run: Record) -> list[Record]:
    """``run["attempts"]``, to append a record to: a new list in place of none (or of
    ``NONE_KEPT``, which a run that ends holds only once it has ended)."""
    kept = run.get("attempts")
    if type(kept) is not list:
        kept = run["attempts"] = []
    return kept


def count_fire(st: list[Any], lag: int) -> None:
    """Count a scheduled run and its fire lag in a job's stats (STATS_FIELDS)."""
    st[RUNS] += 1
    st[LAG_LAST] = lag
    if lag > st[LAG_MAX]:
        st[LAG_MAX] = lag
    st[LAG_SUM] += lag


# Records (jobs, specs, runs) are plain dicts whose key table is shared by every record of their
# kind: CPython's key-sharing dictionaries (PEP 412), the ones instances' __dict__ use. A dict of
# its own keys costs a table of hashes, keys and values; a shared-key one a row of values. Python
# 3.11, measured (scripts/bench.py scale, docs/benchmarks.md): a job map 280 -> 176 bytes, a
# spec 472 -> 184, a run 472 -> 336, and a run is copied from its template in half the time.
# Only memory and speed differ: they are dicts, equal, ordered and encoded as any other, on any
# Python; a record that gains a key of another kind simply gets a table of its own again.
class JobKeys:
    """Makes job records (``job_record(...)``), fields in JOB_FIELDS order."""

    def __init__(self, name: str, spec: Record, gen: int, created: int, updated: int, anchor: int,
                 cursor: int, next: int | None, paused: bool, stats: list[Any]) -> None:
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


def job_record(name: str, spec: Record, gen: int, created: int, updated: int, anchor: int, cursor: int,
               nxt: int | None, paused: bool, stats: list[Any]) -> Record:
    """A job record: ``{"name": name, "spec": spec, ...}`` in JOB_FIELDS order, keys shared."""
    return JobKeys(name, spec, gen, created, updated, anchor, cursor, nxt, paused, stats).__dict__


class SpecKeys:
    """The key table of stored specs (shared_keys)."""


class RunKeys:
    """The key table of run records (RUN_TEMPLATE and its copies)."""


def shared_keys(kind: type[Any], items: Collection[tuple[Any, Any]] = ()) -> Record:
    """A dict with ``items`` (pairs, in order) whose key table is ``kind``'s, shared. Any key
    works: one that is not a str, or one past what a shared table holds, only costs the sharing.
    (Never from a dict: ``dict.update(dict)`` copies the other's table; its ``.items()`` do not.)"""
    d: Record = object.__new__(kind).__dict__
    if items:
        d.update(items)
    return d


#: A new run, its fields in their order (the snapshot's bytes follow it). Runs are made by copying
#: it and setting the fields of the run: a copy of a map of constant keys costs ~0.5 us, a map
#: display of 18 keys ~1.2 us (Python 3.11), and every replica makes one per slot. Its copies
#: share its key table (shared_keys). Never changed.
RUN_TEMPLATE = shared_keys(RunKeys, {
    "id": None, "job": None, "slot": None, "state": "queued", "kind": "scheduled",
    "attempt": 1, "fencing_token": None, "worker": None, "queue": None,
    "priority": None, "tenant": None,
    "fired_at": None, "started_at": None, "finished_at": None, "error": None,
    "due": None, "deadline": None, "ttl": None,
}.items())

#: Parts of a spec that many jobs tend to share (the defaults, a fleet's templates). Specs are
#: never changed in place (a replace stores a new spec), so jobs may hold the same part objects.
SHARED_PARTS = ("schedule", "misfire", "retry", "overlap", "payload", "placement")
#: limits.shared_ints_max: distinct ints share_int keeps before it starts again from empty.
_SHARED_INTS_MAX = limits.shared_ints_max


def part_key(k: str, v: Any, pack: Callable[[Any], bytes] | None = None) -> tuple[str, bytes]:
    """The sharing key of spec part ``k``: its msgpack bytes, so equal keys encode to the same
    bytes and parts that encode differently never share (True and 1, 1 and 1.0, -0.0 and 0.0,
    the order of a map's keys). ``pack``: a msgpack packer's ``pack`` to reuse (share_spec makes
    one a spec). Hashing bytes made in C is ~4x cheaper than the nested tuples of the items it
    replaces (a put of the default spec: ~8.7 against ~2.2 us, docs/benchmarks.md).

    :raises TypeError: a value msgpack cannot hold (then the part is not shared)."""
    try:
        return (k, (pack or _packb)(v))
    except (ValueError, OverflowError) as e:  # an int past 64 bits, nesting past msgpack's limit
        raise TypeError(str(e)) from e


def _packb(v: Any) -> bytes:
    return msgpack.packb(v, use_bin_type=True)  # type: ignore[no-any-return]


def intern_str(v: Any) -> Any:
    return sys.intern(v) if type(v) is str and len(v) <= limits.interned_str_chars_max else v


def share_spec(spec: Record, parts: PartTable, ints: IntTable) -> Record:
    """The same spec, holding shared objects for the parts other jobs have identical (``parts``:
    the state's table of them), and interned short strings. Derived and invisible: the snapshot
    bytes do not change. At 1M jobs the parts were ~1.1 KB of a job's ~2.7 KB
    (docs/benchmarks.md, "Scale")."""
    out = shared_keys(SpecKeys)
    pack = msgpack.Packer(use_bin_type=True).pack  # one a call: no packer is shared by threads
    for k, v in spec.items():
        if k in SHARED_PARTS:
            try:
                key = part_key(k, v, pack)
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
            out[k] = {kk: intern_str(vv) for kk, vv in v.items()}
        elif type(v) is int:
            out[k] = share_int(v, ints)
        else:
            out[k] = intern_str(v)
    return out


def share_int(v: Any, ints: IntTable) -> Any:
    """``v``, or an equal int object already held by another job (``ints``: the state's table):
    jobs registered together share their anchor, cursor and next slot, and a fleet its timeout
    (an int past 256 is a 32-byte object of its own each time it is decoded). Invisible in the
    bytes. Only exact ints (True == 1 as a key); the table is emptied when it reaches its bound."""
    if type(v) is not int:
        return v
    shared = ints.get(v)
    if shared is None:
        if len(ints) >= _SHARED_INTS_MAX:
            ints.clear()
        shared = ints[v] = v
    return shared


def seed_part(parts: PartTable, k: str, part: Any) -> None:
    """Later put_jobs share this part object (one restored from a snapshot)."""
    if len(parts) < limits.shared_spec_parts_max:
        try:
            parts.setdefault(part_key(k, part), part)
        except TypeError:
            pass


# ------------------------------------------------------------------ complete_many's answer
def run_ids_digest(ids: list[Any]) -> int:
    """What a complete_many's answer keeps of the runs it answers: the crc32 of their ids, one a
    line, in the order the command carried them (outcome_results reads the answer back against
    the outcomes of the request that gets it)."""
    try:
        text = "\n".join(ids)
    except TypeError:  # (not from apply, whose ids are strings)
        text = "\n".join(i if type(i) is str else repr(i) for i in ids)
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def outcome_results(res: Result, run_ids: list[Any]) -> list[Result]:
    """The answer of each outcome of a complete_many (core/leases.py apply_complete_many), for
    the runs ``run_ids`` its outcomes named, in their order: ``{"ok": true, "run", "state",
    "attempt"}`` (with ``"kept": "output"`` for a killed attempt's output) or ``{"ok": false, "run",
    "error"}``, as ``POST /v1/workers/{id}/complete``
    answers them (docs/api.md).

    Apply answers in short: ``{"ok": true, "judged": [...], "ids": digest}``, an outcome's item
    the number of the attempt it ended with a success, or its whole answer otherwise. The state
    keeps every answer by its request id (I7, ``request_ids_max`` of them): a map of four keys
    and the run's id for each of a worker's hundred outcomes a request came to ~270 bytes an
    outcome on every replica, a few hundred MB a node at a few thousand runs a second, and as
    much again in every dump. The ids are the request's own; ``ids`` checks them.

    :raises Conflict: the answer is of other runs (other ids, more, fewer, or in another order): a
        request id used again for other outcomes. (The same runs with other tokens or
        successes get the first answer, as any request id sent again with another body.)"""
    old: list[Result] | None = res.get("results")
    if old is not None:  # an answer in full, as older versions kept it (their dumps, journals)
        if [r.get("run") for r in old] != list(run_ids):
            raise _reused()
        return old
    judged = res["judged"]
    if len(judged) != len(run_ids) or res.get("ids") != run_ids_digest(run_ids):
        raise _reused()
    return [{"ok": True, "run": rid, "state": "succeeded", "attempt": a} if type(a) is int else a
            for rid, a in zip(run_ids, judged)]


def _reused() -> Conflict:
    return Conflict("this request id was already used for the outcomes of other runs", field="Idempotency-Key")


# ------------------------------------------------------------------ request ids (I7)
#: What a request id a client's key made starts with (node/http.scope_key): a worker token's, and
#: any other token's. Any other id is one a node made up for a request without a key.
WORKER_KEY_PREFIX = "w-"
CLIENT_KEY_PREFIX = "k-"


class RequestLog:
    """The request ids the state remembers, with ``[what, result]`` each (I7): three FIFO logs of
    ``request_ids_max`` each, one for the ids of clients' keys, one for worker tokens' keys (a
    fleet's completions, ~90 a second at 9 000 runs a second) and one for the ids nodes make up
    for requests without a key (every other mutation). One log of 10 000 let a busy fleet, or
    another tenant's writes without a key, push a client's key out within a minute or two, after
    which its retry applied again. A snapshot writes them as one list (the clients' ids, the
    workers', the rest), and a restore sorts any list back by prefix, an older one's too."""

    __slots__ = ("client", "worker", "other")

    def __init__(self, items: Any = ()) -> None:
        self.client: OrderedDict[str, list[Any]] = OrderedDict()
        self.worker: OrderedDict[str, list[Any]] = OrderedDict()
        self.other: OrderedDict[str, list[Any]] = OrderedDict()
        for rid, v in items:
            self._log(rid)[rid] = v
        for log in (self.client, self.worker, self.other):
            while len(log) > limits.request_ids_max:
                log.popitem(last=False)

    def _log(self, rid: object) -> OrderedDict[str, list[Any]]:
        if type(rid) is str:
            if rid.startswith(CLIENT_KEY_PREFIX):
                return self.client
            if rid.startswith(WORKER_KEY_PREFIX):
                return self.worker
        return self.other

    def get(self, rid: object, default: Any = None) -> Any:
        return self._log(rid).get(rid, default)  # type: ignore[call-overload]

    def __getitem__(self, rid: str) -> list[Any]:
        return self._log(rid)[rid]

    def __contains__(self, rid: object) -> bool:
        return rid in self._log(rid)

    def __setitem__(self, rid: str, value: list[Any]) -> None:
        """Remember ``rid``: its log forgets its oldest beyond ``request_ids_max``."""
        log = self._log(rid)
        log[rid] = value
        while len(log) > limits.request_ids_max:
            log.popitem(last=False)

    def __len__(self) -> int:
        return len(self.client) + len(self.worker) + len(self.other)

    def __iter__(self) -> Iterator[str]:
        return chain(self.client, self.worker, self.other)

    def items(self) -> Iterator[tuple[str, list[Any]]]:
        return chain(self.client.items(), self.worker.items(), self.other.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestLog) and (self.client, self.worker, self.other) == \
            (other.client, other.worker, other.other)

    __hash__ = None  # type: ignore[assignment]


def request_what(cmd: Record) -> str:
    """What a request id is remembered with: the command's op and target."""
    return f"{cmd['op']}:{cmd.get('name') or cmd.get('run') or ''}"


def replayed(requests: RequestLog, cmd: Record) -> Result | None:
    """The replay rule, written once: the result a command gets when its request id is one
    ``requests`` (the state's ``{rid: [what, result]}``) remembers: the first result, marked
    duplicate, or a conflict when the id was used for another request; None when it is not
    remembered. SchedulerState.apply answers with it, and a proposer that finds one answers
    without proposing, since the answer is final (queries.replayed)."""
    rid = cmd.get("rid")
    seen = requests.get(rid) if rid is not None else None
    if seen is None:
        return None
    seen_what, res = seen
    if seen_what != request_what(cmd):
        return err(Conflict(f"request id {rid!r} was already used for a different request ({seen_what})",
                            field="Idempotency-Key"))
    out = dict(res)
    out["duplicate"] = True
    return out
