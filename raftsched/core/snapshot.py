"""The snapshot codec: a state as bytes (version 3), and bytes of versions 1, 2 and 3 as the
fields of a state (docs/design.md, "Snapshots").

Version 3: the jobs as columns, one list a field, instead of a map a job: the field names are
written once, not once a job, and a restore makes each job's record with one map display instead
of unpacking ~30 objects a job. A spec is written as a template (its fields in canonical order
(``spec_keys``) but the executor, spec parts by index into "parts") and its own executor; jobs
with equal templates share one. Templates and parts are indexed by content, in order of first
use, so replicas that share objects differently (or hold a spec's keys in another order) still
write the same bytes. Histories are written in job order, by job position, only when not empty.

Version 4 is version 3 plus ``"ext"``: the sections of the state added since (the worker fleet,
backfills, tokens...), each registered by the module that owns it (``register``, ``EXTENSIONS``)
and written only when it is not empty. A state that uses none of them therefore snapshots to
exactly the version 3 bytes it always did, and code that knows only version 3 refuses a snapshot
that holds a section it would otherwise drop (ValueError), rather than lose it silently.

Version 2 wrote a map a job, its spec parts by index into "parts", and a job's stats as a list;
version 1 the same with whole specs and the stats as a map. Both still restore, to a state that
snapshots to the same bytes as the one they were taken from.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeAlias
from operator import is_, itemgetter

import msgpack

from .policy import fires_ahead
from .records import (
    FINAL_FIELDS, FINAL_KEYS, JOB_FIELDS, NONE_KEPT, SHARED_PARTS, STATS_FIELDS, IntTable, JobKeys, PartTable, Record,
    RequestLog,
    RunKeys, SpecKeys, attempts_of, final_attempt, intern_str, part_key, seed_part, share_int, share_spec,
    shared_keys, success_implied,
)

if TYPE_CHECKING:
    from .due import DueIndex
    from .state import SchedulerState

#: What fill_due builds a due index from (decode's second value): a version 3 snapshot's spec
#: templates and its columns name, spec (template index), gen, next and paused.
DueSource: TypeAlias = tuple[list[Record], list[str], list[int], list[int], list[int | None], list[bool]]

#: 2: spec parts (SHARED_PARTS) are stored once, in "parts", and jobs refer to them by index;
#: a job's stats are a list (STATS_FIELDS).
#: 3: jobs as columns, specs as shared templates plus each job's executor, histories by job
#: position and only when not empty (snapshot_obj).
#: 4: version 3 and "ext", the sections registered in EXTENSIONS that are not empty.
#: decode reads 1, 2, 3 and 4.
SNAPSHOT_VERSION = 3
SNAPSHOT_VERSION_EXT = 4


@dataclass(frozen=True)
class Extension:
    """A section of the replicated state added after snapshot version 3.

    :param name: the section's key in ``"ext"``, and the state's attribute that holds it.
    :param new: makes an empty section (``SchedulerState._reset`` sets the attribute to it).
    :param encode: the section as plain msgpack data, or None when it is empty (then it is not
        written at all). Deterministic: equal sections give equal data on every replica.
    :param decode: the section from that data (what ``encode`` wrote).
    :param rebuild: rebuilds the section's derived indexes on a restored state (or None).
    """

    name: str
    new: Callable[[], Any]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    rebuild: Callable[[Any], None] | None = None


#: name -> Extension, in registration order (the order their data is written in).
EXTENSIONS: dict[str, Extension] = {}


def register(ext: Extension) -> Extension:
    """Add a section of the state (at import of the module that owns it). :raises ValueError:
    a section of that name exists, or the name is a field of version 3."""
    if ext.name in EXTENSIONS or ext.name in _V3_FIELDS:
        raise ValueError(f"snapshot section {ext.name!r} exists")
    EXTENSIONS[ext.name] = ext
    return ext


_V3_FIELDS = frozenset({"jobs", "runs", "history", "queues", "requests", "now_ms", "gen", "manual_seq",
                        "fencing_token", "applied", "leader", "tenants", "locks", "due"})
#: Job fields whose values jobs often have in common (registered together, or due together):
#: a version 3 snapshot writes each of these columns as its distinct values and an index into
#: them when that halves it (encode_ints), and a restore then holds one object for equal values.
SHARED_INT_FIELDS = ("created", "updated", "anchor", "cursor", "next")
_INT_OR_NONE = frozenset({int, type(None)})

#: The canonical order of a spec's keys in a version 3 snapshot: model.validate_job's, then any
#: other key (spec_keys).
_SPEC_KEY_ORDER = {k: i for i, k in enumerate((
    "schedule", "executor", "payload", "timeout_s", "misfire", "retry", "queue", "priority",
    "tenant", "history", "overlap", "description", "placement"))}


def spec_keys(spec: Record) -> tuple[str, ...]:
    """``spec``'s keys in canonical order: a version 3 snapshot writes (and a restore makes) every
    spec in it, so the bytes do not depend on the order a replica holds them in."""
    n = len(_SPEC_KEY_ORDER)
    return tuple(sorted(spec, key=lambda k: (_SPEC_KEY_ORDER.get(k, n), type(k).__name__, k)))


def encode_ints(col: list[Any]) -> list[Any] | dict[str, list[Any]]:
    """A job column of ints (and None) as ``{"values": distinct values in order of first use,
    "index": [i, ...]}`` when it has at most half as many distinct values as jobs (a fleet
    registered together, jobs due at one time), else as it is. The index is small ints: they
    pack in a byte or two and unpack to Python's cached objects, and a restore holds one object
    for each value (an int past 256 is 32 bytes of its own). Only ints and None: True == 1 and
    0.0 == -0.0 must stay apart. All at C speed: ``map(len, repeat(seen))`` yields the next
    index just before ``seen.setdefault`` is called with it."""
    if not set(map(type, col)) <= _INT_OR_NONE:
        return col
    seen: dict[int | None, int] = {}
    index = list(map(seen.setdefault, col, map(len, repeat(seen))))
    if 2 * len(seen) > len(col):
        return col
    return {"values": list(seen), "index": index}


def decode_ints(col: list[Any] | dict[str, list[Any]]) -> list[Any]:
    if isinstance(col, dict):  # (decoded msgpack: a dict or a list, never a subclass)
        return list(map(col["values"].__getitem__, col["index"]))
    return col


# ------------------------------------------------------------------ encode
def encode(s: SchedulerState) -> bytes:
    """The whole state as bytes (msgpack, version 3)."""
    obj = snapshot_obj(s)
    pk = msgpack.Packer(use_bin_type=True)
    out = [pk.pack_map_header(len(obj))]
    for k, v in obj.items():  # (packb(obj)'s bytes, but the runs are written a slice at a time)
        out.append(pk.pack(k))
        out.extend(_runs_packed(pk, v) if k == "runs" else (pk.pack(v),))
    return b"".join(out)


def snapshot_obj(s: SchedulerState) -> dict[str, Any]:
    """The map a version 3 snapshot encodes (see the module docstring)."""
    parts: list[Any] = []
    part_index: dict[tuple[Any, ...], int] = {}
    key_of: dict[int, tuple[Any, ...]] = {}

    def part_ref(k: str, v: Any) -> int:
        key = key_of.get(id(v))
        if key is None:
            try:
                key = part_key(k, v)
            except TypeError:
                key = ("unshareable", id(v))
            key_of[id(v)] = key
        i = part_index.get(key)
        if i is None:
            i = part_index[key] = len(parts)
            parts.append(v)
        return i

    specs: list[Record] = []                          # templates, by first use
    spec_index: dict[tuple[Any, ...], int] = {}       # content key -> template index
    by_ids: dict[tuple[Any, ...], int] = {}           # (keys, ids of the values) -> template index: a memo

    def template_of(spec: Record) -> tuple[int, int, Callable[[Record], tuple[Any, ...]] | None, tuple[Any, ...]]:
        """The template index of ``spec``, the number of its keys, a getter of its values
        (the executor last) and the values but the executor, or no getter when the spec has
        no executor."""
        keys = spec_keys(spec)
        has_exec = "executor" in spec
        rest = tuple(k for k in keys if k != "executor")
        get = itemgetter(*rest, "executor") if has_exec else None
        vals = tuple(spec[k] for k in rest)
        memo = (rest, has_exec, tuple(map(id, vals)))
        ti = by_ids.get(memo)
        if ti is None:
            tmpl: Record = {}
            key: list[tuple[Any, ...]] = []
            own = False
            for k in keys:
                v = spec[k]
                if k == "executor":
                    tmpl[k] = None
                    key.append((k,))
                elif k in SHARED_PARTS:
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
            content = tuple(key)
            ti = spec_index.get(content)
            if ti is None:
                ti = spec_index[content] = len(specs)
                specs.append(tmpl)
            if own:
                # A template of its own must stay one on every replica: never found again
                # by the identity of its values (a replica whose jobs happen to hold the
                # same float object would otherwise write fewer templates).
                return ti, len(spec), None, vals
            by_ids[memo] = ti
        return ti, len(spec), get, vals

    fields = itemgetter(*JOB_FIELDS)
    nf = len(JOB_FIELDS)
    names, records = list(s.jobs), list(s.jobs.values())
    others: list[list[Any]] = []
    cols: list[list[Any]] | None = None
    if set(map(len, records)) <= {nf}:
        try:  # a column a field, at C speed, when every job is of this shape
            cols = [list(map(itemgetter(f), records)) for f in JOB_FIELDS]
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
        cols = [list(col) for col in zip(*rows)] if rows else [[] for _ in JOB_FIELDS]
        del rows
    del records
    history = s.history
    hist_at: list[Any] = []  # job positions (int), then names (str: histories without a job)
    hist: list[Any] = []  # their histories (lists of run ids; None for a job without one at first)
    if history:
        hist = list(map(history.get, names))
        hist_at = [pos for pos, h in enumerate(hist) if h]
        hist = [hist[pos] for pos in hist_at]
        if len(hist) < len(history):  # a history with no job (or empty ones): by name, after
            jobs = s.jobs
            for name, h in history.items():
                if h and name not in jobs:
                    hist_at.append(name)
                    hist.append(h)
    del names
    # Templates: a job whose spec holds the very objects of the previous job's (a fleet)
    # takes its template without looking at the content.
    spec_col, execs = [], []
    ti, n, same = -1, -1, ()
    get: Callable[[Record], tuple[Any, ...]] | None = None
    for spec in cols[1]:
        if len(spec) == n and get is not None:  # (n is -1 while get is None)
            try:
                vals: tuple[Any, ...] | None = get(spec)
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
    columns: dict[str, Any] = dict(zip(JOB_FIELDS, cols))
    for f in SHARED_INT_FIELDS:
        columns[f] = encode_ints(columns[f])
    columns["spec"] = spec_col
    columns["executor"] = execs
    obj = {
        "v": SNAPSHOT_VERSION, "parts": parts, "specs": specs, "jobs": columns, "jobs_other": others,
        "runs": s.runs, "history_at": hist_at, "history": hist,
        "queues": s.queues, "requests": list(s.requests.items()), "now_ms": s.now_ms,
        "gen": s.gen, "manual_seq": s.manual_seq, "fencing_token": s.fencing_token,
        "applied": s.applied, "leader": s.leader,
        "tenants": s.tenants, "locks": s.locks,
    }
    ext: dict[str, Any] = {}
    for name, e in EXTENSIONS.items():
        data = e.encode(getattr(s, name))
        if data is not None:
            ext[name] = data
    if ext:
        obj["v"] = SNAPSHOT_VERSION_EXT
        obj["ext"] = ext
    return obj


#: Runs a slice of the snapshot's runs map packs at once (_runs_packed).
_RUNS_SLICE = 4096


def _runs_packed(pk: msgpack.Packer, runs: dict[str, Record]) -> Iterator[bytes]:
    """The runs map as packb would write it, in pieces: each succeeded run's last attempt, which
    the state does not keep (records.attempts_of), written in its ``attempts`` (whose key is where
    the record's list was: ``NONE_KEPT``) as when every attempt was kept, so that the bytes are
    those the code before wrote and any version reads them. The runs a slice rewrites exist only
    while it is packed: a dump writer holds a slice's copies, not a copy of every run."""
    yield pk.pack_map_header(len(runs))
    items = iter(runs.items())
    while True:
        piece = dict(islice(items, _RUNS_SLICE))
        if not piece:
            return
        for rid, r in piece.items():
            if r.get("state") != "succeeded":
                continue
            kept = r.get("attempts", 0)
            if kept is NONE_KEPT and FINAL_FIELDS <= r.keys():  # (nearly every one: inline)
                att = [final_attempt(r)]
            elif kept != 0 and success_implied(r):
                att = attempts_of(r)
            else:
                continue
            w = piece[rid] = r.copy()
            w["attempts"] = att
        data = pk.pack(piece)
        yield data[_map_header_bytes(len(piece)):]  # its entries: the header is the whole map's


def _map_header_bytes(n: int) -> int:
    """The length of a msgpack map header of ``n`` entries (fixmap, map 16, map 32)."""
    return 1 if n <= 15 else 3 if n <= 0xFFFF else 5


def _drop_final_attempt(run: Record) -> None:
    """A restored succeeded run as the state keeps it: its last attempt's record dropped when it
    is exactly (keys, their order, values and their types) what the run's own fields make
    (records.final_attempt), so that writing it back gives the same bytes; kept otherwise."""
    kept = run.get("attempts")
    if type(kept) is not list or not kept:
        return
    last = kept[-1]
    if type(last) is not dict or tuple(last) != FINAL_KEYS or not FINAL_FIELDS <= run.keys():
        return
    if len(kept) > 1 and (type(kept[-2]) is not dict or kept[-2].get("ok") is not False):
        return  # (then the record would not be made back: records.success_implied)
    made = tuple(final_attempt(run).values())
    got = tuple(last.values())
    if got != made or tuple(map(type, got)) != tuple(map(type, made)):
        return
    if len(kept) == 1:
        run["attempts"] = NONE_KEPT
    else:
        kept.pop()


# ------------------------------------------------------------------ decode
def decode(data: bytes) -> tuple[dict[str, Any], DueSource | None]:
    """The fields of the state ``data`` holds, and what builds its due index without walking
    the jobs again (``fill_due``), or None when the jobs must be walked (``DueIndex.rebuild``).

    The fields are the replicated ones (``jobs``, ``runs``, ``history``, ``queues``,
    ``requests``, ``now_ms``, ``gen``, ``manual_seq``, ``fencing_token``, ``applied``,
    ``leader``, ``tenants``, ``locks``) and the interning tables made while decoding
    (``_parts``, ``_ints``), so that later puts share the restored objects.

    Version 4 adds each registered section (``EXTENSIONS``): the fields hold every section, the
    ones the snapshot does not hold empty.

    :raises ValueError: for a version other than 1-4, a section this code does not know, or
        malformed job columns."""
    obj = _unpacked(data)
    if obj.get("v") not in (1, 2, 3, SNAPSHOT_VERSION_EXT):
        raise ValueError(f"snapshot version {obj.get('v')} is not 1, 2, 3 or {SNAPSHOT_VERSION_EXT}")
    ext = (obj.get("ext") or {}) if obj["v"] == SNAPSHOT_VERSION_EXT else {}
    if not isinstance(ext, dict):
        raise ValueError("snapshot sections (ext) are not a map")
    unknown = sorted(set(ext) - set(EXTENSIONS))
    if unknown:
        raise ValueError(f"snapshot holds sections this code does not know: {', '.join(map(str, unknown))}")
    parts: PartTable = {}
    ints: IntTable = {}
    due_src = None
    if obj["v"] >= 3:
        jobs, history, due_src = _jobs_v3(obj, parts, ints)
    else:
        jobs, history = _jobs_v2(obj, parts, ints)
    runs = obj["runs"]
    # One string object a job name and a run id, as the applies make them (jobs.py, fire.py):
    # decoding made one for each place it is written, so a run's look-up of its job compared
    # bytes, and each run held a copy of its job's name. Equal values: nothing else changes.
    for name, job in jobs.items():
        if type(name) is str and type(job) is dict and type(n := job.get("name")) is str and n == name:
            job["name"] = name
    for rid, run in runs.items():  # (_unpacked made them RUN_TEMPLATE's key table's)
        if type(run) is dict:
            j = run.get("job")
            if type(j) is str and type(of := jobs.get(j)) is dict and type(n := of.get("name")) is str and n == j:
                run["job"] = n  # (the key object, above)
            if type(rid) is str and type(i := run.get("id")) is str and i == rid:
                run["id"] = rid
            if run.get("state") == "succeeded":
                _drop_final_attempt(run)
    fields = {
        "jobs": jobs, "runs": runs, "history": history, "queues": obj["queues"],
        "requests": RequestLog(obj["requests"]),
        "now_ms": obj["now_ms"], "gen": obj["gen"], "manual_seq": obj["manual_seq"],
        "fencing_token": obj["fencing_token"], "applied": obj["applied"], "leader": obj["leader"],
        "tenants": obj["tenants"], "locks": obj["locks"],
        "_parts": parts, "_ints": ints,
    }
    for name, e in EXTENSIONS.items():
        fields[name] = e.decode(ext[name]) if name in ext else e.new()
    return fields, due_src


#: What the restore's unpacker reads of the snapshot's bytes at once (_unpacked).
_READ_SIZE = 1 << 20
#: A run's fields whose values many runs share (_unpacked): strings and ints.
_RUN_STRS = ("state", "kind", "queue", "tenant", "worker", "reason")
_RUN_INTS = ("slot", "due", "fired_at", "started_at", "finished_at")


def _unpacked(data: bytes) -> dict[Any, Any]:
    """What ``msgpack.unpackb`` makes of a snapshot, but each run made a record of the runs' key
    table (records.RunKeys) as it is read. Decoding the whole map first held every run twice,
    once as a plain map, until each was copied: a restored node's memory stayed at that peak
    (the allocator keeps what it freed among live records): 645 MiB for a state that applies
    had built in 250 (docs/benchmarks.md). :raises ValueError: for bytes
    that are not one map."""
    # (read from the bytes, not fed: feeding copies them into the unpacker's buffer)
    up = msgpack.Unpacker(io.BytesIO(data), raw=False, use_list=True, strict_map_key=False,
                          max_buffer_size=max(len(data), 1), read_size=min(_READ_SIZE, max(len(data), 1)))
    try:
        return _unpacked_from(up, len(data))
    except (msgpack.OutOfData, msgpack.UnpackException) as e:  # (as unpackb's errors were: ValueError)
        raise ValueError(f"snapshot is not one map: {type(e).__name__}") from None


def _unpacked_from(up: msgpack.Unpacker, size: int) -> dict[Any, Any]:
    obj: dict[Any, Any] = {}
    for _ in range(up.read_map_header()):
        key = up.unpack()
        if key != "runs":
            obj[key] = up.unpack()
            continue
        runs: dict[Any, Any] = {}
        strs: dict[str, str] = {}
        ints: IntTable = {}
        for _ in range(up.read_map_header()):
            rid = up.unpack()
            run = up.unpack()
            if type(run) is dict:
                run = shared_keys(RunKeys, run.items())
                # The values many runs hold alike, one object each, as the applies that made
                # them share them (a state, a queue, a command's instant, a slot's).
                for k in _RUN_STRS:
                    v = run.get(k)
                    if type(v) is str:
                        run[k] = strs.setdefault(v, v)
                for k in _RUN_INTS:
                    v = run.get(k)
                    if type(v) is int:
                        run[k] = share_int(v, ints)
            runs[rid] = run
        obj[key] = runs
    if up.tell() != size:
        raise ValueError("snapshot has bytes past its map")
    return obj


def _part_resolver(parts: list[Any], table: PartTable) -> Callable[[Record], None]:
    """A function that replaces a snapshot spec's (or template's) part indexes by the parts
    themselves (versions 2 and 3), seeding each part once in ``table`` for later puts to
    share."""
    seeded = [False] * len(parts)

    def resolve(spec: Record) -> None:
        for k in SHARED_PARTS:
            if k in spec:
                i = spec[k]
                spec[k] = parts[i]
                if not seeded[i]:
                    seeded[i] = True
                    seed_part(table, k, parts[i])
    return resolve


def _jobs_v2(obj: dict[str, Any], parts: PartTable, ints: IntTable) -> tuple[dict[str, Record], dict[str, list[str]]]:
    """Jobs and histories of a version 1 or 2 snapshot: a map a job."""
    jobs = obj["jobs"]
    if obj["v"] == 1:
        for job in jobs.values():
            job["spec"] = share_spec(job["spec"], parts, ints)
            st = job["stats"]
            job["stats"] = [st[k] for k in STATS_FIELDS]  # version 1 kept a map
    else:
        resolve = _part_resolver(obj["parts"], parts)
        for job in jobs.values():
            spec = job["spec"]
            resolve(spec)
            for k, v in spec.items():  # the other fields as share_spec holds them
                t = type(v)
                if t is str:
                    spec[k] = intern_str(v)
                elif t is int:
                    spec[k] = share_int(v, ints)
                elif t is dict and k not in SHARED_PARTS:
                    spec[k] = {kk: intern_str(vv) for kk, vv in v.items()}
    # One object for a job's name and equal positions, as jobs.put_job holds them: version 3's
    # snapshot finds a fleet's template by the identity of its values (snapshot_obj).
    for name, job in jobs.items():
        if job.get("name") == name:
            job["name"] = name
        for k in SHARED_INT_FIELDS:
            if k in job:
                job[k] = share_int(job[k], ints)
    # Empty histories are not kept (jobs.put_job): versions 1 and 2 wrote one for every job.
    history = {name: h for name, h in obj["history"].items() if h}
    return jobs, history


def _jobs_v3(obj: dict[str, Any], parts: PartTable,
             ints: IntTable) -> tuple[dict[str, Record], dict[str, list[str]], DueSource | None]:
    """Jobs and histories of a version 3 snapshot (see snapshot_obj), and what fill_due needs
    to build the due index from the columns (what DueIndex.rebuild makes, without walking the
    job records again; fires_ahead reads the overlap only, so a template answers for its jobs),
    or None when there are jobs of another shape."""
    tmpls, has_exec = obj["specs"], []
    resolve = _part_resolver(obj["parts"], parts)
    for i, t in enumerate(tmpls):
        resolve(t)
        has_exec.append("executor" in t)
        tmpls[i] = shared_keys(SpecKeys, t.items())  # its copies share its key table
    c = obj["jobs"]
    cols = [(decode_ints(c[f]) if f in SHARED_INT_FIELDS else c[f]) for f in JOB_FIELDS]
    n = len(cols[0])
    if any(len(col) != n for col in cols) or len(c["executor"]) != n:
        raise ValueError("snapshot job columns differ in length")
    jobs: dict[str, Record] = {}
    job_keys = JobKeys  # records.job_record, without its call
    for name, ti, ex, g, cr, up, an, cu, nx, pa, st in zip(
            cols[0], cols[1], c["executor"], *cols[2:]):
        spec = tmpls[ti].copy()
        if has_exec[ti]:
            spec["executor"] = ex
        jobs[name] = job_keys(name, spec, g, cr, up, an, cu, nx, pa, st).__dict__
    others = obj["jobs_other"]
    if others:  # jobs of another shape, at their positions
        merged: dict[str, Record] = {}
        it = iter(jobs.items())
        for pos, name, job in others:
            while len(merged) < pos:
                k, v = next(it)
                merged[k] = v
            if isinstance(job.get("spec"), dict):
                job["spec"] = share_spec(job["spec"], parts, ints)
            merged[name] = job
        for k, v in it:
            merged[k] = v
        jobs = merged
    names = list(jobs) if obj["history_at"] else []
    history = {(names[p] if type(p) is int else p): h
               for p, h in zip(obj["history_at"], obj["history"])}
    due_src = None if others else (tmpls, cols[0], cols[1], cols[2], cols[7], cols[8])
    return jobs, history, due_src


def fill_due(due: DueIndex, src: DueSource) -> None:
    """Fill an empty due index from a version 3 snapshot's columns (decode's ``due_src``): the
    buckets DueIndex.rebuild makes, in the same order."""
    tmpls, names, tis, gens, nexts, paused = src
    ahead = [fires_ahead(t) for t in tmpls]
    at = (due.now.at, due.ahead.at)
    for name, ti, g, nx, pa in zip(names, tis, gens, nexts, paused):
        if nx is None or pa:
            continue
        wheel = at[ahead[ti]]
        bucket = wheel.get(nx)
        if bucket is None:
            wheel[nx] = [name, g]
        else:
            bucket.append(name)
            bucket.append(g)
    due.reindex()
