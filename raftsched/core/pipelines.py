"""Pipelines: jobs that run after other jobs, slot by slot (docs/pipelines.md).

A job may name parents in ``after`` (``[{"job": P, "on": "success" | "failure" | "finished"}]``).
Without a ``schedule`` it is **triggered**: it has a run ``child@S`` for slot S exactly when every
parent has a final outcome for S that satisfies its edge. With a schedule it is **gated**: its own
slot S waits for the same condition (``match: same_slot``), or for every parent to have succeeded
once since the child last ran (``match: latest``).

Everything happens inside apply, in the command that records a parent's final outcome
(``notify``): the child's join for S is updated there and its run (or its record) is created
there, so a leader crash can neither lose a child nor make it twice, and a completion refused
as stale (its fencing token) never reaches ``notify``. A slot that cannot satisfy the child is
recorded, never dropped: ``upstream_failed`` (a parent's outcome fails its edge),
``upstream_succeeded`` (a parent succeeded on an edge ``on: failure``: not needed, not told),
``upstream_missed`` (a parent's slot was recorded skipped or coalesced), ``upstream_timeout``
(``max_wait_s`` passed, or the child had too many slots waiting), ``dependency_missing`` (a
parent was deleted with ``?force=true``). A record is itself a final outcome for the child's own
children: it cascades.

A dead parent requeued (``rearm``) takes back the records it caused, transitively: the children
wait for it again, with what their other parents had reported.

State (a snapshot section, ``pipes``): the joins (child -> slot -> the parents' reports so far,
whether the gated child's own slot came, since when it waits) and, for ``latest`` children, the
parents' successes since the child last ran. Derived: parent -> children, rebuilt from the jobs.
A job without ``after`` and without children costs one dict look-up per final outcome.
"""
from __future__ import annotations

import bisect
import itertools
import math
from typing import TYPE_CHECKING, Any

import msgpack

from . import deadlines, fire, limits, schedule, snapshot
from .errors import Conflict, InvalidCommand, InvalidSpec
from .model import REAL_STATES, slot_id
from .notify import on_slot_recorded
from . import pipehooks
from .records import RECORDED, Record, attempts_of, is_int

if TYPE_CHECKING:
    from .state import SchedulerState

#: The reasons a child's slot is recorded for (state ``skipped``); ``rearm`` takes these back.
UPSTREAM_REASONS = ("upstream_failed", "upstream_missed", "upstream_timeout", "dependency_missing", "upstream_succeeded")
#: Run kinds whose final outcome propagates always; others (manual, backfill) only when marked.
_PROPAGATING_KINDS = frozenset({"scheduled", "triggered", "recorded"})


def check_edges(s: SchedulerState, name: str, spec: Record, pending: dict[str, Record] | None = None) -> None:
    """The edges of ``spec`` (job ``name``) against the state (and the jobs of the same batch,
    ``pending``): every parent exists, no cycle, no parent with too many children.
    :raises InvalidSpec: naming the edge (422)."""
    after = spec.get("after")
    if not after:
        return
    pending = pending or {}

    def parents_of(job: str) -> list[str]:
        if job == name:
            return [e["job"] for e in after]
        sp = pending[job] if job in pending else (s.jobs[job]["spec"] if job in s.jobs else None)
        return [] if sp is None else [e["job"] for e in sp.get("after", ())]

    for i, e in enumerate(after):
        p = e["job"]
        if p not in s.jobs and p not in pending:
            raise InvalidSpec(f"names no job: {p} -> {name} (create {p} first)", field=f"after[{i}].job")
        kids = s.pipes.children.get(p, ())
        if name not in kids and len(kids) >= limits.children_per_job_max:
            raise InvalidSpec(f"{p} has {limits.children_per_job_max} children, the limit", field=f"after[{i}].job")
    # A cycle through name: walk up from its parents; reaching name again closes one.
    for i, e in enumerate(after):
        path = {e["job"]: name}
        todo = [e["job"]]
        while todo:
            j = todo.pop()
            for p in parents_of(j):
                if p == name:
                    raise InvalidSpec(f"makes a cycle: {name} -> {e['job']} -> ... -> {j} -> {name}"
                                      if j != e["job"] else f"makes a cycle: {name} -> {j} -> {name}",
                                      field=f"after[{i}].job")
                if p not in path:
                    path[p] = j
                    todo.append(p)


def dependents(s: SchedulerState, name: str) -> list[str]:
    """The jobs that name ``name`` as a parent, sorted."""
    return sorted(s.pipes.children.get(name, ()))


def slots_never_meet(child: Record, child_anchor: int, parent: Record, parent_anchor: int) -> str | None:
    """Why a gated child's slots (``match: same_slot``, the default) can never be its parent's
    (each slot waits for the parent's run of the same slot, and would time out), or None when
    they can, or when it cannot be told for sure. Three cases are certain: a ``jitter_s`` on either
    (each job's slots move by offsets of its own name), two interval schedules whose grids,
    anchored where each job was made (or at its ``start_at``), have no instant in common, and an
    interval schedule whose grid holds none of the whole minutes (or seconds) a cron schedule
    beside it fires on."""
    if "schedule" not in child or "after" not in child or child.get("match", "same_slot") != "same_slot" \
            or "schedule" not in parent:
        return None
    if child["schedule"].get("jitter_ms") or parent["schedule"].get("jitter_ms"):
        return ("jitter_s moves each job's slots by offsets of its own, so a slot of one is never a slot "
                "of the other; drop jitter_s, or use match latest")
    ce, pe = child["schedule"].get("every_s"), parent["schedule"].get("every_s")
    if ce is None and pe is None:
        return None  # (two cron schedules, or an at: not checked)
    if ce is None or pe is None:
        # One interval, one cron. A cron's slots are whole minutes of UTC (whole minutes of its
        # zone, whose offset is whole minutes: every zone's since 1972), or whole seconds with a
        # seconds field; an interval's are its anchor plus multiples of its every_s. They meet
        # only if the grid holds such an instant: an hourly interval job made at 12:00:07 (its
        # anchor 12:00:08) never meets "0 * * * *".
        cron, anchor, every = (child, parent_anchor, pe) if ce is None else (parent, child_anchor, ce)
        expr = cron["schedule"].get("cron")
        if not isinstance(expr, str):
            return None  # (an at)
        grain = 1000 if len(expr.split()) == 6 else 60_000
        if anchor % math.gcd(every * 1000, grain):
            unit = "second" if grain == 1000 else "minute"
            return (f"the cron schedule's slots are whole {unit}s, and the interval job's never are (anchored "
                    f"where it was made); give the interval job a start_at on a whole {unit}, or use "
                    "match latest")
        period = every * 1000
        if grain == 60_000 and period % 60_000 == 0 and 3_600_000 % period == 0:
            # An interval of whole minutes that divides the hour falls on the same minutes of
            # every hour (UTC); the cron on the minutes its zone's offsets put it on. A walk: an
            # hourly parent at :00 and a child on "30 * * * *", or on "0 * * * *" in
            # Asia/Kathmandu (:15 UTC), were accepted, every slot to time out a day later.
            cron_at = schedule.cron_utc_minutes(expr, cron["schedule"].get("timezone") or "UTC", anchor)
            step = period // 60_000
            grid = {(anchor // 60_000 + k * step) % 60 for k in range(60 // step)}
            if cron_at is not None and not cron_at & grid:
                return (f"the cron schedule fires on minute(s) {_minutes(cron_at)} of the hour (UTC), the interval "
                        f"job on minute(s) {_minutes(grid)}: no slot of one is a slot of the other; align them, "
                        "or use match latest")
        return None
    step = math.gcd(ce * 1000, pe * 1000)
    if (child_anchor - parent_anchor) % step:
        return ("their interval slots never fall on the same instant (each is anchored where its job was "
                "made, or at its start_at); give both the same start_at, or use match latest")
    return None


def _minutes(ms: set[int]) -> str:
    """Minutes of the hour, said short: ``:00, :30`` (the first eight, then how many more)."""
    out = sorted(ms)
    said = ", ".join(f":{m:02d}" for m in out[:8])
    return said + (f" and {len(out) - 8} more" if len(out) > 8 else "")


def with_dependents(s: SchedulerState, names: list[str]) -> set[str]:
    """Those of ``names`` that other jobs name as a parent (one read for a batch's jobs)."""
    kids = s.pipes.children
    return {n for n in names if kids.get(n)}


def check_delete(s: SchedulerState, name: str, force: bool) -> None:
    """:raises Conflict: ``name`` has dependents and the delete is not forced (409 listing them)."""
    kids = dependents(s, name)
    if kids and not force:
        raise Conflict(f"job {name!r} has dependents: {', '.join(kids[:20])}"
                       f"{' ...' if len(kids) > 20 else ''}; delete them first, or delete with ?force=true "
                       "(their slots are then recorded dependency_missing)", field="name", dependents=kids[:100])


# ------------------------------------------------------------------ the state section
class Pipes:
    """The pipeline section of the state: ``joins`` and ``latest`` (replicated), ``children``
    (derived)."""

    __slots__ = ("joins", "latest", "children", "fanout", "seq", "ranged", "held")

    def __init__(self) -> None:
        #: child -> slot -> {"got": {parent: [state, run id, token, result]}, "own": bool, "since": ms}
        self.joins: dict[str, dict[int, Record]] = {}
        #: child (match latest) -> parent -> [state, run id, token, result] of its last success
        self.latest: dict[str, dict[str, list[Any]]] = {}
        #: parent -> {child: None} (derived from the jobs' ``after``)
        self.children: dict[str, dict[str, None]] = {}
        #: deferred fan-outs: key (``seq``, zero-padded) -> {"src": the outcome, "after": last child offered}
        self.fanout: dict[str, Record] = {}
        self.seq = 0
        #: children that may hold a recorded range in their history (derived; a look-up saves a
        #: scan of the history of those that cannot: _in_range_record)
        self.ranged: set[str] = set()
        #: run id -> the backfill holding that child (derived from the backfills' ``held``)
        self.held: dict[str, str] = {}


def _encode(p: Pipes) -> Any:
    if not p.joins and not p.latest and not p.fanout and not p.seq:
        return None
    return {"joins": [[c, [[slot, j[slot]] for slot in sorted(j)]] for c, j in sorted(p.joins.items())],
            "latest": [[c, [[k, v[k]] for k in sorted(v)]] for c, v in sorted(p.latest.items())],
            "fanout": [[k, p.fanout[k]] for k in sorted(p.fanout)], "seq": p.seq}


def _decode(data: Any) -> Pipes:
    p = Pipes()
    for c, items in data.get("joins", ()):
        p.joins[c] = {slot: j for slot, j in items}
    for c, items in data.get("latest", ()):
        p.latest[c] = {k: v for k, v in items}
    for k, v in data.get("fanout", ()):
        p.fanout[k] = v
    p.seq = data.get("seq", 0)
    return p


def rebuild(s: SchedulerState) -> None:
    s.pipes.children = {}
    s.pipes.ranged = set()
    s.pipes.held = {rid: bf_id for bf_id, bf in s.backfills.items() for rid in (bf.get("held") or {})}
    for name, job in s.jobs.items():
        link(s, name, job["spec"])
        if "after" in job["spec"] and any("slot_to" in s.runs[r] for r in s.history.get(name, ())):
            s.pipes.ranged.add(name)


EXTENSION = snapshot.register(snapshot.Extension(name="pipes", new=Pipes, encode=_encode, decode=_decode,
                                                 rebuild=rebuild))


def link(s: SchedulerState, name: str, spec: Record) -> None:
    for e in spec.get("after", ()):
        s.pipes.children.setdefault(e["job"], {})[name] = None


def unlink(s: SchedulerState, name: str, spec: Record) -> None:
    ch = s.pipes.children
    for e in spec.get("after", ()):
        kids = ch.get(e["job"])
        if kids is not None:
            kids.pop(name, None)
            if not kids:
                del ch[e["job"]]


def on_put(s: SchedulerState, name: str, old: Record | None, spec: Record, now: int) -> None:
    """A job was put: its edges replace the old ones, and the slots it waits for are decided
    again by them. A job that no longer has ``after`` waits for nothing: a gated job's own
    slots that were waiting run now, as its other slots do (with no upstream, under no
    backfill), the rest of its joins (slots of its parents, not its own) are dropped, and the
    deadline records of slots only parents would have decided are closed (deadlines.close). A
    child whose edges changed (a parent taken or added, an edge's ``on``) forgets the reports of
    parents it no longer has (and the hold of a backfill that came with one), and has each
    waiting slot checked at once against the reports it holds: one the parents allow runs (or
    is recorded, as their outcomes say); before, it waited for a report that had come already,
    until its ``max_wait_s``, or for good (a gated job's own slot). Not while a parent it names
    does not exist yet (a batch that puts the parent after the child): its slots wait for that
    parent's report, as any. A parent added whose run of a slot ended before the edge is read
    back for the slots the child has yet to decide (_read_back)."""
    if old is not None:
        unlink(s, name, old["spec"])
    link(s, name, spec)
    if "after" in spec and name not in s.pipes.ranged:
        # A job made a child keeps the ranges its history recorded before (a misfire's): they
        # count as its children's records do, as on a replica that rebuilds ranged (rebuild).
        runs = s.runs
        if any("slot_to" in runs[r] for r in s.history.get(name, ())):
            s.pipes.ranged.add(name)
    child = s.jobs.get(name)
    waiting = s.pipes.joins.get(name)
    if "after" not in spec:
        s.pipes.latest.pop(name, None)
        reruns = sorted(k for k, j in (waiting or {}).items() if "rerun" in j)
        if waiting and reruns:  # (no parent of its own now: not run again; what waits below it has its earlier entry)
            told: list[tuple[Record, int]] = []
            for slot in reruns:
                del waiting[slot]
                _release(s, name, slot, now, told)
            _drain(s, told, now)
        if waiting and child is not None and "schedule" in spec:
            own = {k: {"got": {}, "own": True, "since": j["since"], **({"held": True} if j.get("held") else {})}
                   for k, j in waiting.items() if j["own"]}
            if own:
                s.pipes.joins[name] = own
                work: list[tuple[Record, int]] = []
                for slot in sorted(own):
                    _make_run(s, child, slot, own[slot], now, work)
                _drain(s, work, now)
        s.pipes.joins.pop(name, None)
        if old is not None and "after" in old["spec"]:
            # No parent will decide a slot for it now: the records of those without a run of
            # their own (tracked by a root's fire for it) are closed.
            runs = s.runs
            for _slot, rid in sorted((slot, rid) for rid, slot in s.deadlines.open.get(name, {}).items()
                                     if rid not in runs and _held_by(s, rid) is None):
                deadlines.close(s, rid)
        return
    if spec.get("match") != "latest":
        s.pipes.latest.pop(name, None)
    if old is None or child is None or old["spec"].get("after") == spec["after"]:
        return
    parents = {e["job"] for e in spec["after"]}
    got_latest = s.pipes.latest.get(name)
    if got_latest is not None:
        for p in [p for p in got_latest if p not in parents]:
            del got_latest[p]  # a parent it no longer has: not in its runs' upstream
    for j in (waiting or {}).values():
        gone = [(p, j["got"].pop(p)) for p in [p for p in j["got"] if p not in parents]]
        if "fresh" in j:
            j["fresh"] = [p for p in j["fresh"] if p in parents]
        if gone and "bf" in j:
            # The hold of a backfill whose run's report was a removed parent's, and no kept
            # parent's: its run is not that backfill's (an unknown run, trimmed, keeps it).
            of_bf = [s.runs.get(info[1], {}).get("backfill") == j["bf"] for _p, info in gone]
            if any(of_bf) and not any(s.runs.get(info[1], {}).get("backfill") == j["bf"] for info in j["got"].values()):
                del j["bf"]
    if old["spec"].get("match") != spec.get("match") or any(p not in s.jobs for p in parents):
        return  # (a parent a batch makes after this item: its report is to come, as any)
    work = []
    if spec.get("match") == "latest":
        _try_latest(s, child, now, work)
    else:
        had = {e["job"] for e in old["spec"].get("after", ())}
        added = [p for p in dict.fromkeys(e["job"] for e in spec["after"]) if p not in had] if had else []
        if added:
            _read_back(s, child, added, now, work)
            for slot, j in sorted((s.pipes.joins.get(name) or {}).items()):
                if "rerun" in j:  # (its slot ran: _read_back reads none back for it) an added
                    for p in added:  # parent's newest outcome of the slot, as at its opening
                        x = None if p in j["got"] else _slot_outcome(s, p, slot)
                        if x is not None:
                            j["got"][p] = x
        for slot in sorted(waiting or ()):
            if slot in s.pipes.joins.get(name, {}):  # (else decided by an earlier one)
                _check(s, child, slot, now, work)
    _drain(s, work, now)


def _read_back(s: SchedulerState, child: Record, added: list[str], now: int, work: list[tuple[Record, int]]) -> None:
    """The parents a put ``added`` to ``child``: their outcomes of the slots the child has yet to
    decide that ended before the edge existed (never reported to it) are offered now, as their
    reports would have been. The slots: those it waits on (a join), those its deadline records
    track, and those a parent it kept has a run of still to report. A slot's outcome is its
    newest run that propagates (a re-run by hand or a backfill's over the scheduled one); one
    still unfinished reports when it ends, as any. A scan of each parent's history, at the put."""
    c = child["name"]
    runs = s.runs
    slots = set(s.pipes.joins.get(c, ()))
    slots.update(slot for rid, slot in s.deadlines.open.get(c, {}).items() if rid not in runs)
    for e in child["spec"]["after"]:
        if e["job"] not in added:
            slots.update(r["slot"] for r in (runs[rid] for rid in s.history.get(e["job"], ()))
                         if r["state"] in UNFINISHED and propagates(r) and "slot_to" not in r)
    outcomes = {p: _slot_outcomes(s, p) for p in added}  # (one pass over each one's history)
    for slot in sorted(slots):
        rid = f"{c}@{slot}"
        for p in added:
            if rid in runs or _held_by(s, rid) is not None:
                break  # decided
            j = s.pipes.joins.get(c, {}).get(slot)
            if j is not None and p in j["got"]:
                continue
            x = _outcome_in(outcomes[p], slot)
            if x is not None:
                # Its wait counts as _fan's would: from the slot for the slot's own scheduled
                # run, from now (the report) for any other (a backfill's, a run by hand, a
                # triggered one).
                _offer(s, child, p, slot, report_of(x), now, work,
                       from_slot=_starts_wait_at(x, x["slot"]))


def _starts_wait_at(src: Record, slot: int) -> bool:
    """Whether ``src``'s report starts its children's wait at ``slot`` (the slot's own
    scheduled run), not at the report (a backfill's run, a run by hand, a triggered one)."""
    return src.get("backfill") is None and src.get("kind", "scheduled") == "scheduled" \
        and src["id"] == f"{src['job']}@{slot}"


def _outcome_in(outcomes: tuple[dict[int, Record], list[Record]], slot: int) -> Record | None:
    """The final entry of ``slot`` in a parent's _slot_outcomes, or None (none, or one
    unfinished: its report is to come)."""
    by_slot, ranges = outcomes
    x = by_slot.get(slot)
    if x is None:
        x = next((r for r in reversed(ranges) if r["slot"] <= slot <= r["slot_to"]), None)
    return None if x is None or x["state"] in UNFINISHED else x


def _slot_outcomes(s: SchedulerState, p: str) -> tuple[dict[int, Record], list[Record]]:
    """Parent ``p``'s entries that propagate, by slot: each slot's newest run (an unfinished one
    kept first: its report is to come), and its recorded ranges, oldest first; one pass over
    its history."""
    by_slot: dict[int, Record] = {}
    ranges: list[Record] = []
    runs = s.runs
    for rid in s.history.get(p, ()):
        x = runs[rid]
        if not propagates(x):
            continue
        if "slot_to" in x:
            ranges.append(x)
            continue
        slot = x["slot"]
        if rid != f"{p}@{slot}" and not rid.startswith(_rerun_ids(p, slot)):
            continue
        old = by_slot.get(slot)
        if old is None or old["state"] not in UNFINISHED:
            by_slot[slot] = x
    return by_slot, ranges


def _slot_outcome(s: SchedulerState, p: str, slot: int) -> list[Any] | None:
    """Parent ``p``'s outcome of ``slot`` as a report (_final_of's), read from its history: its
    newest entry for the slot that propagates (a run of it by hand with propagate, or a
    backfill's, after the scheduled run or the range that recorded it); None when it has none,
    or one is unfinished (its report is to come)."""
    x = _outcome_in(_slot_outcomes(s, p), slot)
    return None if x is None else report_of(x)


def on_delete(s: SchedulerState, name: str, spec: Record, now: int, unfinished: tuple[int, ...] = ()) -> None:
    """Job ``name`` was deleted (forced when it had children): its own joins go, and every slot
    its children are waiting on it for is recorded ``dependency_missing``: those in a join, and
    ``unfinished``, the slots of its runs the delete took before their final outcome (a child
    of it alone had no join for them: no parent had reported). A ``match: latest`` child's own
    slots waiting for it likewise (and those to come, as they come: _try_latest)."""
    unlink(s, name, spec)
    s.pipes.joins.pop(name, None)
    s.pipes.latest.pop(name, None)
    kids = s.pipes.children.get(name, {})
    work: list[tuple[Record, int]] = []
    why = f"parent {name} was deleted"
    for c in sorted(kids):  # name order: alike on a replica restored from a snapshot
        for slot in sorted(s.pipes.joins.get(c, {})):
            _decide(s, c, slot, "dependency_missing", why, now, work)
        child = s.jobs.get(c)
        if child is not None and "schedule" not in child["spec"]:
            # (a slot a trigger or a record of its own decided already stays as it is)
            undecided = [slot for slot in unfinished if f"{c}@{slot}" not in s.runs
                         and _held_by(s, f"{c}@{slot}") is None and not _in_range_record(s, c, slot)]
            if len(undecided) <= limits.delete_slots_recorded_one_by_one:
                for slot in undecided:
                    _decide(s, c, slot, "dependency_missing", why, now, work)
            else:
                _missing_ranges(s, child, undecided, why, now, work)
    _drain(s, work, now)


def _missing_ranges(s: SchedulerState, child: Record, slots: list[int], why: str, now: int,
                    work: list[tuple[Record, int]]) -> None:
    """Record ``slots`` (ascending) of ``child`` ``dependency_missing`` as ranges, as a misfire
    records a parent's missed slots: each run of them with no entry of the child between
    (a run, a record, a range) is one record with its ``count``, a lone slot a record of its
    own. A forced delete of a parent with a backlog of 10 000 runs and 16 children made 160 000
    records (and events) in one command, every replica stalled ~0.5 s for it, and a history of
    100 kept the last 100."""
    c = child["name"]
    lo, hi = slots[0], slots[-1]
    taken = [_span(x) for x in _entries_within(s, c, lo, hi)]
    prefix = f"{c}@"
    for rid in s.pipes.held:  # a slot a backfill holds for it: decided, its run to come
        if rid.startswith(prefix) and lo <= (x := int(rid[len(prefix):])) <= hi:
            taken.append((x, x))
    taken.sort()
    starts = [a for a, _ in taken]
    ends = list(itertools.accumulate((b for _, b in taken), max))  # the furthest end of the first k
    groups: list[list[int]] = [[slots[0]]]
    for slot in slots[1:]:
        prev = groups[-1][-1]
        # an entry of the child starts in (prev, slot), or one that starts at or before prev
        # reaches past it
        k = bisect.bisect_right(starts, prev)
        if (k < len(starts) and starts[k] < slot) or (k > 0 and ends[k - 1] > prev):
            groups.append([slot])
        else:
            groups[-1].append(slot)
    for g in groups:
        if len(g) == 1:
            _decide(s, c, g[0], "dependency_missing", why, now, work)
            continue
        entry = {"id": f"{c}@{g[0]}", "job": c, "slot": g[0], "state": "skipped", "reason": "dependency_missing",
                 "kind": "recorded", "fired_at": now, "error": why, "slot_to": g[-1], "count": len(g)}
        s.pipes.ranged.add(c)
        fire.add_entry(s, child, entry)
        child["stats"][RECORDED] += len(g)
        on_slot_recorded(s, entry, now)
        deadlines.on_finish(s, entry, now)  # the range's first slot, then each other slot's record
        book = s.deadlines.slots
        if book:
            for slot in g[1:]:
                if f"{c}@{slot}" in book:
                    deadlines.on_finish(s, dict(entry, id=f"{c}@{slot}", slot=slot), now)
        work.append((entry, now))


# ------------------------------------------------------------------ propagation (apply)
def propagates(run: Record) -> bool:
    return run.get("kind") in _PROPAGATING_KINDS or bool(run.get("propagate"))


def notify(s: SchedulerState, run: Record, now: int) -> None:
    """``run`` (or a recorded slot) reached its final outcome: offer it to its job's children.
    Callers test ``run["job"] in s.pipes.children`` first (the one look-up a job without
    children pays)."""
    if not propagates(run):
        return
    if run.get("propagate") and "slot_to" not in run:
        # A manual run or a backfill's, asked to propagate, for a slot its children may have
        # recorded already (the slot's own run failed): those records are taken back first, so
        # that this outcome decides them again. A child that ran stays run, unless the run is a
        # trigger's rerun asked for downstream, whose outcome opens the graph below it to run
        # again (open_downstream; a requeue of it, dead, does the same when it ends).
        rearmed = rearm(s, run, now)
        if run.get("downstream") is not None:  # (only a trigger's rerun carries it: the root)
            open_downstream(s, run, rearmed, now)
    work: list[tuple[Record, int]] = [(run, now)]
    _drain(s, work, now)


#: The fields of a run a deferred fan-out keeps (a pending item of ``Pipes.fanout``).
_SOURCE_FIELDS = ("job", "id", "slot", "slot_to", "state", "reason", "count", "fencing_token", "result",
                  "backfill", "kind", "released")


def _drain(s: SchedulerState, work: list[tuple[Record, int]], now: int, budget: list[int] | None = None) -> None:
    """Offer each final outcome in ``work`` to its job's children, and cascade what that
    records. A worklist, not recursion (depth bounded by the jobs). One command offers at most
    fanout_per_command children: the rest is kept in the state (``Pipes.fanout``), in the same
    command, and the leader's ``fanout_step`` commands go on from there (docs/pipelines.md,
    "Fan-out")."""
    if budget is None:
        budget = [limits.fanout_per_command]
    while work:
        run, _ = work.pop()
        if run["job"] not in s.pipes.children:
            continue
        _fan(s, {k: run[k] for k in _SOURCE_FIELDS if k in run}, None, now, work, budget)


def _fan(s: SchedulerState, src: Record, after: str | None, now: int, work: list[tuple[Record, int]],
         budget: list[int]) -> None:
    kids = s.pipes.children.get(src["job"])
    if not kids:
        return
    names = sorted(kids)  # the same order on every replica, restored or not
    if after is not None:
        names = names[bisect.bisect_right(names, after):]
    lo = src["slot"]
    hi = src["slot_to"] if "slot_to" in src else lo
    info = [src["state"], src["id"], src.get("fencing_token"), src.get("result")]
    # A slot's own scheduled run: its children's waits count from the slot; any other run of it
    # (a backfill's, a manual run's, which may name a slot long past) starts them now.
    from_slot = _starts_wait_at(src, lo)
    for c in names:
        if budget[0] <= 0:
            s.pipes.seq += 1
            s.pipes.fanout[f"{s.pipes.seq:016d}"] = {"src": src, "after": after}
            return
        budget[0] -= 1
        after = c
        child = s.jobs.get(c)
        if child is None:
            continue
        if lo != hi:
            _offer_range(s, child, src["job"], lo, hi, src, now, work)
        else:
            _offer(s, child, src["job"], lo, info, now, work, src.get("backfill"), from_slot, src.get("released", False))


def pending_fanout(s: SchedulerState, n: int) -> list[list[Any]]:
    """The leader's read: up to ``n`` deferred fan-outs, ``[key, after]``, oldest first."""
    return [[k, s.pipes.fanout[k]["after"]] for k in sorted(s.pipes.fanout)[:n]]


def apply_fanout_step(s: SchedulerState, cmd: Record, now: int) -> Record:
    """``fanout_step {key, after}``: the leader's next part of a deferred fan-out (``_drain``):
    up to fanout_per_command more children of the outcome it keeps, from the child after
    ``after`` on. Applied only while the item is still at ``after`` (a step repeated by a new
    leader is ``ignored``).

    :raises InvalidCommand: key not a string, after not a string or nil."""
    key, after = cmd.get("key"), cmd.get("after")
    if not isinstance(key, str) or not (after is None or isinstance(after, str)):
        raise InvalidCommand("fanout_step needs key and after")
    item = s.pipes.fanout.get(key)
    if item is None or item["after"] != after:
        return {"ok": True, "ignored": True}
    del s.pipes.fanout[key]
    work: list[tuple[Record, int]] = []
    budget = [limits.fanout_per_command]
    _fan(s, item["src"], after, now, work, budget)
    _drain(s, work, now, budget)
    return {"ok": True, "pending": len(s.pipes.fanout)}


def _edge(child: Record, parent: str) -> str:
    for e in child["spec"]["after"]:
        if e["job"] == parent:
            return str(e["on"])
    return "success"


def _satisfies(state: str, on: str) -> bool | None:
    """True: the outcome meets the edge; False: it fails it; None: the slot was missed."""
    if state in ("skipped", "coalesced"):
        return None
    if on == "finished":
        return True
    return (state == "succeeded") == (on == "success")


def _offer(s: SchedulerState, child: Record, parent: str, slot: int, info: list[Any], now: int,
           work: list[tuple[Record, int]], bf: str | None = None, from_slot: bool = True,
           released: bool = False) -> None:
    """Parent ``parent``'s final outcome ``info`` for ``slot`` reaches ``child``. ``bf``: the
    outcome is a run of a backfill with ``cascade: children``; the child's run, when the join
    completes, is then made under that backfill's pace and concurrency (held: ``hold``).
    A child's slot waiting to run again below a rerun (a rerun join: ``open_downstream``) takes
    the outcome as its parent's new one (``fresh``). ``released``: not a new outcome, but the
    parent's earlier one, standing because its own rerun was not made (``_decide``): only a
    rerun join waiting for it takes it, as not fresh."""
    c = child["name"]
    spec = child["spec"]
    latest = spec.get("match") == "latest"
    if latest:
        if released:
            return  # (an earlier outcome, for rerun joins only: no success of it is new)
        if info[0] == "succeeded":
            s.pipes.latest.setdefault(c, {})[parent] = info
            _try_latest(s, child, now, work)
        return
    rid = f"{c}@{slot}"
    waiting = s.pipes.joins.get(c)
    j = None if waiting is None else waiting.get(slot)
    if j is not None and j.get("rerun") is not None:
        if released:
            if parent in j["got"]:
                return  # (a new outcome came first)
        elif parent not in j["fresh"]:
            if not j["fresh"]:
                j["since"] = now  # (its max_wait_s counts from the first new outcome: overdue)
            j["fresh"].append(parent)
        j["got"][parent] = info
        _check(s, child, slot, now, work)
        return
    if released:
        return  # (an earlier outcome, for rerun joins only)
    done = s.runs.get(rid)
    if done is not None:
        # Decided already (a run, or a record): keep the report with an upstream record, for rearm.
        if done.get("kind") == "recorded" and done.get("reason") in UPSTREAM_REASONS and "upstream" in done:
            done["upstream"][parent] = info
        # A join the slot kept when it was run by hand (its own id, NAME@SLOT: the slot's run)
        # before this report came waits for nothing: it goes.
        waiting = s.pipes.joins.get(c)
        if waiting is not None and waiting.pop(slot, None) is not None and not waiting:
            del s.pipes.joins[c]
        return
    if _held_by(s, rid) is not None:
        return  # decided: its run waits for its backfill's budget
    joins = s.pipes.joins.setdefault(c, {})
    j = joins.get(slot)
    if j is None and _in_range_record(s, c, slot):
        if not joins:
            del s.pipes.joins[c]
        return  # decided by a recorded range (a parent's missed slots, or its own)
    if j is None and "schedule" in spec and (slot < child["created"] or not _on_grid(child, slot, {})):
        # A gated child runs for its own slots only: a parent's instant that is none of them (a
        # parent of a finer schedule, a manual run's instant, a cascading backfill's slot from
        # before the child existed) would wait in a join, shown "waiting for its own slot", until
        # max_wait_s, and go unrecorded (a pipelines walk).
        if not joins:
            del s.pipes.joins[c]
        return
    if j is None:
        if len(joins) >= limits.joins_per_child_max:
            oldest = min(joins)
            _decide(s, c, oldest, "upstream_timeout",
                    f"{limits.joins_per_child_max} slots of {c} were waiting for their parents", now, work)
            joins = s.pipes.joins.setdefault(c, {})
        # Its wait (max_wait_s) counts from the slot, as a gated child's own (own_slot), not from
        # the first parent's report: with one parent, that report completed the join at once, and
        # no wait ever ran out. A slot's other runs (``from_slot`` false: _fan) start it now.
        j = joins[slot] = {"got": {}, "own": False, "since": slot if from_slot else now}
        if "schedule" not in spec and slot < child["created"]:
            # A slot older than the child: its other parents' runs of it may have ended before
            # the child existed, and never reported to it (a child made after them, then one
            # parent's run requeued by hand: it waited for reports that never came, and timed
            # out, both parents having succeeded; a pipelines walk). Read back as a put that
            # adds a parent does (_read_back).
            for e in spec["after"]:
                p = e["job"]
                if p != parent and p in s.jobs:
                    x = _outcome_in(_slot_outcomes(s, p), slot)
                    if x is not None:
                        j["got"][p] = report_of(x)
    j["got"][parent] = info
    if bf is not None:
        j["bf"] = bf
    _check(s, child, slot, now, work)


def open_downstream(s: SchedulerState, root: Record, rearmed: list[str], now: int) -> list[str]:
    """A rerun asked for ``downstream`` (``root``, a trigger's run of slot S) ended: every job
    below it that ran for S waits to run again, in a join of its own for S (a rerun join:
    ``"rerun"``, the root's ``downstream``; ``"fresh"``, the parents whose new outcome came).
    Opened at once for the whole graph below, so that each waits for the new outcome of every
    parent that will have one (the root, the jobs ``rearmed`` took records back from, those
    opened here, a slot already waiting): a join below two branches of other lengths waits for
    both. Its other parents' newest outcomes of S are in it from the start. A job not to run
    again (``_may_rerun``) is not opened, and its children are reached only through another
    parent. :returns: the jobs opened, in the order opened (name order, level by level)."""
    slot, down = root["slot"], root["downstream"]
    again = {root["job"]} | {rid.partition("@")[0] for rid in rearmed}
    opened: list[Record] = []
    todo, seen = [root["job"]], {root["job"]}
    outcomes: dict[str, tuple[dict[int, Record], list[Record]]] = {}  # (each parent's history read once)

    def of(p: str) -> tuple[dict[int, Record], list[Record]]:
        if p not in outcomes:
            outcomes[p] = _slot_outcomes(s, p)
        return outcomes[p]

    def stuck(child: Record) -> bool:
        """A parent outside the rerun with no entry of the slot, nothing of it to come: the join
        could never complete (a parent added since the child ran, say): not run again."""
        for e in child["spec"]["after"]:
            p = e["job"]
            if p != root["job"] and p in s.jobs and slot not in s.pipes.joins.get(p, {}):
                by_slot, ranges = of(p)
                if slot not in by_slot and not any(r["slot"] <= slot <= r["slot_to"] for r in ranges):
                    return True
        return False

    while todo:
        p = todo.pop(0)
        for c in sorted(s.pipes.children.get(p, ())):  # (name order, alike on every replica)
            child = s.jobs.get(c)
            if c in seen or child is None:
                continue
            if len(seen) > limits.downstream_jobs_max:
                todo.clear()  # (jobs put below it since the trigger: those past the bound are left)
                break
            if c in again or slot in s.pipes.joins.get(c, {}):
                again.add(c)  # (its outcome of the slot is to come: re-armed, or waiting already)
            elif _may_rerun(s, child, slot, down) and not stuck(child):
                again.add(c)
                opened.append(child)
            else:
                continue
            seen.add(c)
            todo.append(c)
    for child in opened:
        got: dict[str, list[Any]] = {}
        for e in child["spec"]["after"]:
            p = e["job"]
            if p not in again and p in s.jobs:
                x = _outcome_in(of(p), slot)
                if x is not None:
                    got[p] = report_of(x)
        s.pipes.joins.setdefault(child["name"], {})[slot] = {"got": got, "own": True, "since": now, "rerun": down,
                                                            "fresh": []}
    return [c["name"] for c in opened]


def below(s: SchedulerState, name: str, n: int) -> int:
    """How many jobs a rerun of job ``name`` with ``downstream`` reads (open_downstream): those
    below it (its children, theirs, ...) and their other parents, counted up to ``n + 1``."""
    todo, seen, read = [name], {name}, {name}
    while todo and len(read) <= n + 1:
        for c in s.pipes.children.get(todo.pop(), ()):
            if c not in seen:
                seen.add(c)
                read.add(c)
                todo.append(c)
                job = s.jobs.get(c)
                read.update(e["job"] for e in (job["spec"].get("after", ()) if job is not None else ()))
    return min(len(read) - 1, n + 1)


def _may_rerun(s: SchedulerState, child: Record, slot: int, downstream: Any) -> bool:
    """Whether ``child`` runs ``slot`` again below a rerun: it ran for it (its run ended, or a
    record stands for it) and nothing of it is still to come. Not a paused child, a heartbeat
    job, one with ``match: latest``, another tenant's than ``downstream`` allows, a slot inside a
    recorded range, or a child whose waiting slots are at joins_per_child_max."""
    spec = child["spec"]
    if child["paused"] or spec["executor"]["type"] == "heartbeat" or spec.get("match") == "latest" \
            or (downstream is not True and spec["tenant"] not in downstream) \
            or len(s.pipes.joins.get(child["name"], ())) >= limits.joins_per_child_max:
        return False
    entries = slot_entries(s, child["name"], slot)
    return bool(entries) and not any(x["state"] in UNFINISHED or "slot_to" in x for x in entries)


def _release(s: SchedulerState, c: str, slot: int, now: int, work: list[tuple[Record, int]]) -> None:
    """Child ``c``'s slot does not run again below a rerun: its newest final entry of the slot
    stands, and reaches its children's rerun joins as their parent's outcome, not fresh
    (through ``work``, as any outcome, with ``released``). One that has an unfinished entry that
    propagates reports when it ends instead."""
    entries = slot_entries(s, c, slot)
    if any(x["state"] in UNFINISHED and propagates(x) for x in entries):
        return
    final = [x for x in entries if x["state"] not in UNFINISHED]
    best = [x for x in final if propagates(x)] or final
    if best:
        work.append((dict(best[-1], released=True), now))
    else:  # (none ended: what is below it waits for nothing from it, and does not run on it)
        work.append(({"job": c, "id": f"{c}@{slot}", "slot": slot, "state": "skipped", "released": True}, now))


def _offer_range(s: SchedulerState, child: Record, parent: str, lo: int, hi: int, rec: Record, now: int,
                 work: list[tuple[Record, int]]) -> None:
    """A recorded range of the parent's slots (a misfire's ``slot_to``/``count``): the child
    records the same range, ``upstream_missed``, and every join inside it is decided so."""
    c = child["name"]
    if child["spec"].get("match") == "latest":
        return
    why = f"{parent}@{lo}..{hi} was recorded {rec['state']} ({rec.get('reason')})"
    gated = "schedule" in child["spec"]
    cut = rec.get("cut", ())  # slots a rearm took out of it while it waited in a fan-out step
    joins = s.pipes.joins.get(c, {})
    for slot in sorted(k for k, j in joins.items() if lo <= k <= hi and (j["own"] or not gated) and k not in cut):
        # the record names the parent whose range missed the slot, beside those that reported
        joins[slot]["got"][parent] = [rec["state"], rec["id"], rec.get("fencing_token"), rec.get("result")]
        _decide(s, c, slot, "upstream_missed", why, now, work)
    if gated:
        return  # its own slots in the range find the parent's record when they come (_final_of)
    # Slots inside the range the child decided already (another parent's failed edge or missed
    # range, when this offer was deferred: a fan-out step): the range is recorded around them,
    # never over them, each part with the count of the range's slots it holds, on the range's
    # grid when it is known (_range_grid; a part that holds none is not recorded), else without.
    runs = s.runs
    inside = _entries_within(s, c, lo, hi)
    report = [rec["state"], rec["id"], rec.get("fencing_token"), rec.get("result")]
    for x in inside:
        # A slot decided by another parent keeps this parent's report too, as _offer keeps it:
        # if that parent's run is requeued (rearm), the join comes back with it, and does not
        # wait for a report that was given already (it would wait forever: no slot is silent).
        if x.get("kind") == "recorded" and x.get("reason") in UPSTREAM_REASONS and "upstream" in x \
                and x["slot"] not in cut:
            x["upstream"].setdefault(parent, report)
    taken: list[tuple[int, int]] = sorted([_span(x) for x in inside] + [(k, k) for k in cut if lo <= k <= hi])
    parts: list[tuple[int, int, int | None]] = []
    if not taken:
        parts.append((lo, hi, rec.get("count")))
    else:
        at = lo
        for a, b in taken:
            if a > at:
                parts.append((at, a - 1, None))
            at = max(at, b + 1)
        if at <= hi:
            parts.append((at, hi, None))
    grid = _range_grid(s, rec) if taken else None
    for a, b, count in parts:
        if grid is not None:
            count = schedule.count_slots(grid[0], a - 1, b, grid[1], _PART_COUNT_STEPS)
            if count == 0:
                continue  # (between two slots the child decided one after the other: none of the range's)
        rid = f"{c}@{a}"
        if rid in runs:
            continue
        entry = {"id": rid, "job": c, "slot": a, "state": "skipped", "reason": "upstream_missed",
                 "kind": "recorded", "fired_at": now, "error": why, "slot_to": b, "count": count}
        s.pipes.ranged.add(c)
        fire.add_entry(s, child, entry)
        child["stats"][RECORDED] += 1 if count is None else count
        on_slot_recorded(s, entry, now)
        deadlines.on_finish(s, entry, now)  # the range's first slot
        deadlines.finish_range(s, c, a, b, now)  # and the others
        work.append((entry, now))


def _range_grid(s: SchedulerState, rec: Record) -> tuple[Record, int] | None:
    """The grid the recorded range ``rec``'s ``count`` was counted on: its backfill's or its
    job's schedule (_grid_of), or, for a triggered job's range (its parents' slots), a scheduled
    ancestor's; the first on which the range holds ``count`` slots. None when none is known to
    be the range's (no count, a schedule changed since): its parts then keep every instant."""
    count = rec.get("count")
    if not isinstance(count, int):
        return None
    lo, hi = rec["slot"], rec["slot_to"]
    for grid in _grids(s, rec):
        if schedule.count_slots(grid[0], lo - 1, hi, grid[1], _PART_COUNT_STEPS) == count:
            return grid
    return None


def _grids(s: SchedulerState, rec: Record) -> list[tuple[Record, int]]:
    """The grids ``rec``'s slots may be of (_range_grid): its own (_grid_of), else those of the
    scheduled ancestors of its triggered job, nearest first."""
    grid = _grid_of(s, rec)
    if grid is not None:
        return [grid]
    out: list[tuple[Record, int]] = []
    seen: set[str] = set()
    todo = [rec["job"]]
    while todo:
        job = s.jobs.get(todo.pop(0))
        if job is None or job["name"] in seen:
            continue
        seen.add(job["name"])
        if "schedule" in job["spec"]:
            out.append((job["spec"]["schedule"], job["anchor"]))
        else:
            todo.extend(e["job"] for e in job["spec"].get("after", ()))
    return out


def _span(x: Record) -> tuple[int, int]:
    """The slots an entry covers: ``(slot, slot_to)``, a range's, or its one slot twice."""
    return x["slot"], x["slot_to"] if "slot_to" in x else x["slot"]


def _entries_within(s: SchedulerState, c: str, lo: int, hi: int) -> list[Record]:
    """Job ``c``'s entries (runs, records, ranges) that cover a slot in [lo, hi], as its
    history holds them (a scan of it)."""
    runs = s.runs
    return [x for x in (runs[r] for r in s.history.get(c, ())) if x["slot"] <= hi and _span(x)[1] >= lo]


def _in_range_record(s: SchedulerState, c: str, slot: int) -> bool:
    """Whether a recorded range of ``c``'s history covers ``slot`` (a scan of its history: only
    when a new join would be made)."""
    if c not in s.pipes.ranged:
        return False
    runs = s.runs
    ranges = False
    for rid in s.history.get(c, ()):
        r = runs[rid]
        if "slot_to" in r:
            if r["slot"] <= slot <= r["slot_to"]:
                return True
            ranges = True
    if not ranges:
        # Its ranges were trimmed from its history (or cut away): no scan until it records
        # another. (Only which scans run differs from a replica that rebuilt the set: I3.)
        s.pipes.ranged.discard(c)
    return False


def drop_joins(s: SchedulerState, c: str, lo: int, hi: int) -> None:
    """A gated job's own slots in [lo, hi] were recorded (a misfire, a pause): their joins go."""
    if hi != lo:
        s.pipes.ranged.add(c)
    joins = s.pipes.joins.get(c)
    if not joins:
        return
    for slot in [k for k in joins if lo <= k <= hi]:
        del joins[slot]
    if not joins:
        del s.pipes.joins[c]


def _check(s: SchedulerState, child: Record, slot: int, now: int, work: list[tuple[Record, int]]) -> None:
    """Decide child's slot when its join is complete or can no longer complete. A gated child's
    slot is decided at its own slot only (before it, nothing of its own exists to record)."""
    c = child["name"]
    j = s.pipes.joins[c][slot]
    if "schedule" in child["spec"] and not j["own"]:
        return  # gated: its own slot has not come yet
    got = j["got"]
    waiting = False
    quiet = None  # a `failure` edge whose parent succeeded: the child is not needed (upstream_succeeded)
    for e in child["spec"]["after"]:
        p = e["job"]
        info = got.get(p)
        if info is None and "schedule" in child["spec"] and "rerun" not in j:
            # (reported before the own slot came, a range say; a rerun join waits for a new one)
            info = _final_of(s, p, slot)
            if info is not None:
                got[p] = info
        if info is None:
            if p not in s.jobs:
                _decide(s, c, slot, "dependency_missing", f"parent {p} does not exist", now, work)
                return
            waiting = True
            continue
        ok = _satisfies(info[0], e["on"])
        if ok is None:
            rec = s.runs.get(info[1])
            if rec is not None and rec.get("reason") == "upstream_succeeded":
                # Its parent was a handler not needed: nor is it (told as nothing, as the parent).
                if quiet is None:
                    quiet = f"{info[1]} was not needed (upstream_succeeded)"
                continue
            # (with why, where the record says: a run cancelled, withdrawn by late_start, a misfire)
            said = f" ({rec['reason']})" if rec is not None and rec.get("reason") else ""
            _decide(s, c, slot, "upstream_missed", f"{info[1]} was recorded {info[0]}{said}", now, work)
            return
        if not ok:
            if e["on"] == "failure":  # (the only outcome that fails it: a success)
                if quiet is None:
                    quiet = f"{info[1]} succeeded; the edge runs {c} on its failure only"
                continue  # (another parent's failed edge, a missed or missing one, says more)
            _decide(s, c, slot, "upstream_failed", f"{info[1]} ended {info[0]}; the edge asks for {e['on']}",
                    now, work)
            return
    if quiet is not None:
        # Not a miss: what a handler of its parent's failure does when the parent succeeds. Recorded
        # (every slot has an entry, its children follow it), not told as slot.missed (notify).
        _decide(s, c, slot, "upstream_succeeded", quiet, now, work)
        return
    if not waiting and "rerun" in j and not j["fresh"]:
        # Below a rerun, every parent's outcome is an earlier one (none of them ran again): no run.
        _decide(s, c, slot, "upstream_timeout", "no parent ran again", now, work)
        return
    if not waiting:
        wait = child["spec"].get("max_wait_s", limits.max_wait_s_default) * 1000
        if j["since"] + wait <= now:
            # Every parent is final, but the last came past max_wait_s (what the leader's sweep
            # records when a parent is still to come: join_expire; a child of one parent never
            # waits in a join for it to find).
            _decide(s, c, slot, "upstream_timeout",
                    f"its parents' outcomes came {(now - j['since']) // 1000} s after it began to wait, past "
                    f"max_wait_s ({wait // 1000} s)", now, work)
            return
        _make_run(s, child, slot, j, now, work)


def _final_of(s: SchedulerState, p: str, slot: int) -> list[Any] | None:
    """Parent ``p``'s final outcome for ``slot`` from its history (its run, or a recorded range
    over the slot), as a report; None when it has none yet."""
    r = s.runs.get(f"{p}@{slot}")
    if r is None:
        runs = s.runs
        for rid in s.history.get(p, ()):
            x = runs[rid]
            if "slot_to" in x and x["slot"] <= slot <= x["slot_to"]:
                r = x
                break
    if r is None or r["state"] in UNFINISHED or not propagates(r):
        return None  # (a heartbeat's run waiting for its ping included)
    return report_of(r)


def _make_run(s: SchedulerState, child: Record, slot: int, j: Record, now: int,
              work: list[tuple[Record, int]] | None = None) -> None:
    c = child["name"]
    del s.pipes.joins[c][slot]
    if not s.pipes.joins[c]:
        del s.pipes.joins[c]
    bf_id = j.get("bf")
    if bf_id is not None:
        bf = s.backfills.get(bf_id)
        if bf is not None and bf.get("limited_to") is not None and child["spec"]["tenant"] not in bf["limited_to"]:
            # A cascade a token limited to tenants asked for holds and counts only their jobs'
            # children: another tenant's (an admin's edge) follows the backfill's run as it
            # follows any run of its parent, queued at once, neither held by the backfill's
            # budget, nor counted in its progress, nor withdrawn by its cancel (docs/security.md).
            bf = None
        if bf is not None and bf["state"] in ("running", "paused"):
            hold(s, bf, child, slot, j["got"])
            return
        if bf is not None and bf["state"] == "cancelled" and work is not None:
            _cancelled(s, child, slot, j["got"], bf_id, now, work)
            return
    _create(s, child, slot, j["got"], now, work, held=j.get("held", False), rerun=j.get("rerun"))


def _ran_by_hand(s: SchedulerState, c: str, slot: int) -> bool:
    """Whether job ``c``'s slot has a run made by a trigger with that slot under another id than
    the slot's (``C@S#manual``, ``C@S#manual-N``: the slot had an entry already): that run is
    the slot's (backfills.trigger_job_with), so its parents' reports make none."""
    base = f"{c}@{slot}#manual"
    if base not in s.runs:
        # (nearly every child run made: no history scan. A #manual-N is made only while
        # #manual exists, and a history trims its oldest first, so #manual-N never outlives it.)
        return False
    for rid in [base] + [r for r in s.history.get(c, ()) if r.startswith(base + "-")]:
        r = s.runs.get(rid)
        if r is not None and r["kind"] != "recorded" and r["state"] in REAL_STATES:
            return True
    return False


def _create(s: SchedulerState, child: Record, slot: int, got: dict[str, list[Any]], now: int,
            work: list[tuple[Record, int]] | None, bf: Record | None = None, held: bool = False,
            rerun: Any = None) -> Record | None:
    """Child ``child``'s run for ``slot`` (or its record: paused, overlap, a full queue, which
    reaches its own children through ``work``, or at once without one); ``bf``: made by that
    backfill's step (a held child released). A paused child's own slot (a gated job's) whose
    join its pause marked ``held``, or whose slot is still to come, is made held, as the pause
    holds the runs it fired ahead (notify.pause). ``rerun`` (a rerun join's, open_downstream:
    the root's ``downstream``): the slot ran, and runs again (``_create_rerun``). :returns: the
    run when it was queued."""
    c = child["name"]
    if rerun is not None:
        return _create_rerun(s, child, slot, got, now, work)
    rid = f"{c}@{slot}"
    if rid in s.runs or _ran_by_hand(s, c, slot):
        # The slot has its run already (a trigger of the job for that slot: NAME@SLOT, or
        # NAME@SLOT#manual when the slot had a record): it is not made twice (I2, and
        # backfills.trigger_job_with's rule), and the parents' reports that completed its join are spent.
        return None
    kind = "scheduled" if "schedule" in child["spec"] else "triggered"
    if child["paused"] and kind == "triggered":
        entry = {"id": rid, "job": c, "slot": slot, "state": "skipped", "reason": "paused",
                 "kind": "recorded", "fired_at": now}
        fire.add_entry(s, child, entry)
        on_slot_recorded(s, entry, now)
        deadlines.on_finish(s, entry, now)
        _cascade(s, entry, now, work)
        return None
    late_ms = deadlines.late_skip_ms(child["spec"]) if bf is None and "deadline" in child["spec"] else None
    if late_ms is not None and slot + late_ms <= now:
        # Its parents decided the slot after its start deadline (a parent late, or re-run: a dead
        # run requeued, a run by hand with propagate), and the job's late_start is skip: no run
        # starts that late (a run by hand of the child's slot, or a backfill, runs it).
        entry = fire.add_entry(s, child, {
            "id": rid, "job": c, "slot": slot, "state": "skipped", "reason": "late_start", "kind": "recorded",
            "fired_at": now, "error": deadlines.late_error(late_ms, "its parents decided the slot too late to start")})
        on_slot_recorded(s, entry, now)
        deadlines.on_finish(s, entry, now)
        _cascade(s, entry, now, work)
        return None
    blocked = fire.overlap(s, child, rid, now)
    if blocked is not None:
        entry = fire.add_entry(s, child, {"id": rid, "job": c, "slot": slot, "state": blocked, "reason": "overlap",
                                          "kind": "recorded", "fired_at": now})
        child["stats"][RECORDED] += 1
        on_slot_recorded(s, entry, now)
        deadlines.on_finish(s, entry, now)
        _cascade(s, entry, now, work)
        return None
    run = fire.new_run(s, child, slot, now, rid, kind)
    run["upstream"] = upstream_of(got)
    if child["paused"] and kind == "scheduled" and bf is None and (held or slot > now) \
            and (run["state"] == "queued" or run["state"] == "waiting"):
        run["due"] = None  # held until the resume (its index entry is stale from now: queues.py)
    if bf is not None:
        run["backfill"] = bf["id"]
        run["propagate"] = True  # its own children follow under the same backfill
    return run if run["state"] == "queued" else None


def _create_rerun(s: SchedulerState, child: Record, slot: int, got: dict[str, list[Any]], now: int,
                  work: list[tuple[Record, int]] | None) -> Record | None:
    """A child's slot run again below a rerun (_create's ``rerun``), as its run by hand with the
    slot would be (trigger_job_with: an id of its own, kind ``manual``, no overlap rule, no start
    deadline), its parents' outcomes its ``upstream``, propagating. Not made, and its earlier entry
    stands for its children (``_release``), when the child was paused or became a heartbeat job
    while it waited, or a run of the slot is going meanwhile (run by hand, a backfill's: never
    two at once; one that propagates reports itself). A full queue records it skipped, which
    reaches its children as any outcome."""
    c = child["name"]
    if child["paused"] or child["spec"]["executor"]["type"] == "heartbeat" \
            or any(x["state"] in UNFINISHED for x in slot_entries(s, c, slot)):
        if work is not None:
            _release(s, c, slot, now, work)
        return None
    run = fire.new_run(s, child, slot, now, manual_slot_id(s, c, slot), "manual", due=now)
    run["propagate"] = True  # (set on a full queue's record too: it reaches the children)
    if run["state"] != "queued":
        _cascade(s, run, now, work)
        return None
    run["upstream"] = upstream_of(got)
    return run


# ------------------------------------------------------------------ a backfill's cascade (held children)
# A backfill with ``cascade: children`` runs its slots' children under its own budget: a child
# whose join a backfill run completed is not queued at once but held by the backfill
# (``bf["held"]``: run id -> [child, slot, the parents' reports], in the order they came), and
# the backfill's steps queue the held children first, as its max_concurrent and rate allow,
# before any new slot of its own (core/backfills.py apply_backfill_step). The decision is made
# in the command that records the parent's outcome, as for any child; only the run waits.
def hold(s: SchedulerState, bf: Record, child: Record, slot: int, got: dict[str, list[Any]]) -> None:
    rid = f"{child['name']}@{slot}"
    # (a backfill made by an older version has no held yet)
    bf.setdefault("held", {})[rid] = [child["name"], slot, dict(got), child["created"]]
    s.pipes.held[rid] = bf["id"]


def _held_by(s: SchedulerState, rid: str) -> str | None:
    """The backfill holding run ``rid`` (a child decided, not yet queued), if any."""
    return s.pipes.held.get(rid)


def _unhold(s: SchedulerState, bf: Record, rid: str) -> None:
    del bf["held"][rid]
    if s.pipes.held.get(rid) == bf["id"]:
        del s.pipes.held[rid]


def forget_held(s: SchedulerState, name: str) -> None:
    """Job ``name`` was deleted: backfills no longer hold children of it. A job put again under
    the name, even within the same millisecond (the same ``created``), is another job, and a
    held child of the old one must not become its run."""
    for bf_id in sorted(set(s.pipes.held.values())):
        bf = s.backfills[bf_id]
        for rid in [r for r, item in bf["held"].items() if item[0] == name]:
            _unhold(s, bf, rid)


def release_held(s: SchedulerState, bf: Record, may: Any, took: Any, now: int) -> int:
    """Queue backfill ``bf``'s held children, oldest first, while ``may()`` allows one more run
    (its budget: concurrency, rate, the step's runs; ``took(1)`` spends it). A held child whose
    job is gone (or was deleted and made again: another job) is dropped; one decided meanwhile by
    another way (its id exists) too; one paused or blocked by its overlap rule is recorded as any
    child's run would be. A child whose queue is full stays held, and the step stops there (the
    backfill's runs never overflow a queue). At most backfill_step_runs_max held children are
    looked at a step, whatever they become. :returns: the runs queued."""
    held = bf["held"]
    made = looked = 0
    work: list[tuple[Record, int]] = []
    while held and may() and looked < limits.backfill_step_runs_max:
        looked += 1
        rid = next(iter(held))
        c, slot, got, created = held[rid]
        child = s.jobs.get(c)
        if child is None or child["created"] != created or rid in s.runs:
            _unhold(s, bf, rid)
            continue
        if not _has_room(s, child):
            break
        _unhold(s, bf, rid)
        run = _create(s, child, slot, got, now, work, bf)
        if run is not None:
            bf["active"].append(rid)
            bf["cascaded"] = bf.get("cascaded", 0) + 1
            took(1)
            made += 1
    _drain(s, work, now)
    return made


def _has_room(s: SchedulerState, child: Record) -> bool:
    if child["spec"]["executor"]["type"] == "heartbeat":
        return True  # its runs wait for pings, in no queue
    qname = child["spec"]["queue"]
    q = s.queues.get(qname)
    return bool(s._queue_depth.get(qname, 0) < (limits.queue_depth_default if q is None else q["max_depth"]))


def releasable(s: SchedulerState, bf: Record) -> bool:
    """Whether the first held child of ``bf`` could be queued now, queue-wise (the leader's
    stepper: budget aside)."""
    held = bf.get("held")
    if not held:
        return False
    c, _slot, _got, created = held[next(iter(held))]
    child = s.jobs.get(c)
    if child is None or child["created"] != created:
        return True  # dropped by the step
    return _has_room(s, child)


def drop_held(s: SchedulerState, bf: Record, now: int) -> int:
    """Backfill ``bf`` ended while it held children (cancelled by request, or its job deleted):
    each is recorded (skipped, ``cancelled``), and that record reaches the child's own children.
    :returns: how many."""
    held = bf.get("held")
    if not held:
        return 0
    work: list[tuple[Record, int]] = []
    n = 0
    for rid, (c, slot, got, created) in list(held.items()):
        _unhold(s, bf, rid)
        child = s.jobs.get(c)
        if child is not None and child["created"] == created and rid not in s.runs:
            _cancelled(s, child, slot, got, bf["id"], now, work)
            n += 1
    _drain(s, work, now)
    return n


def _cancelled(s: SchedulerState, child: Record, slot: int, got: dict[str, list[Any]], bf_id: str, now: int,
               work: list[tuple[Record, int]]) -> None:
    entry = {"id": f"{child['name']}@{slot}", "job": child["name"], "slot": slot, "state": "skipped",
             "reason": "cancelled", "kind": "recorded", "fired_at": now,
             "error": f"backfill {bf_id} was cancelled before this run was made", "upstream": dict(got)}
    fire.add_entry(s, child, entry)
    child["stats"][RECORDED] += 1
    on_slot_recorded(s, entry, now)
    deadlines.on_finish(s, entry, now)
    work.append((entry, now))


def withdrawn(s: SchedulerState, run: Record, now: int) -> None:
    """A backfill's queued ``run`` was withdrawn (its backfill cancelled): when it was to reach
    the children, they learn it was skipped (a child waiting for it records
    ``upstream_missed``), but a child's earlier decision for the slot is not taken back."""
    if run["job"] in s.pipes.children and propagates(run):
        _drain(s, [(run, now)], now)


def _cascade(s: SchedulerState, entry: Record, now: int, work: list[tuple[Record, int]] | None) -> None:
    """A record made here is a final outcome for the job's own children."""
    if work is not None:
        work.append((entry, now))
    else:
        _drain(s, [(entry, now)], now)


def report_of(x: Record) -> list[Any]:
    """A parent's entry as the report its children's joins keep: ``[state, id, token, result]``."""
    return [x["state"], x["id"], x.get("fencing_token"), x.get("result")]


def upstream_of(got: dict[str, list[Any]]) -> list[Record]:
    return [{"job": p, "run": v[1], "outcome": v[0], "token": v[2], "result": v[3]} for p, v in sorted(got.items())]


def _decide(s: SchedulerState, c: str, slot: int, reason: str, why: str, now: int,
            work: list[tuple[Record, int]]) -> None:
    """Record child ``c``'s slot ``slot`` skipped for ``reason`` (its join goes), and cascade.
    A gated child's join whose own slot has not come is only dropped: the slot is not one of
    the child's (yet), and its own slot records itself when it comes."""
    joins = s.pipes.joins.get(c, {})
    j = joins.pop(slot, None)
    if not joins:
        s.pipes.joins.pop(c, None)
    if j is not None and "rerun" in j:
        # A rerun not made (its parent failed, say): the child's earlier run of the slot stands,
        # and is what its children below the rerun get from it.
        _release(s, c, slot, now, work)
        return
    child = s.jobs.get(c)
    rid = f"{c}@{slot}"
    if child is None or rid in s.runs or ("schedule" in child["spec"] and not (j is not None and j["own"])):
        return
    entry = {"id": rid, "job": c, "slot": slot, "state": "skipped", "reason": reason, "kind": "recorded",
             "fired_at": now, "error": why, "upstream": dict(j["got"]) if j else {}}
    if j is not None and j.get("own"):
        entry["own"] = True
        if j.get("held"):  # (a rearm restores it: the slot stays held while the job is paused)
            entry["held"] = True
    fire.add_entry(s, child, entry)
    child["stats"][RECORDED] += 1
    on_slot_recorded(s, entry, now)
    deadlines.on_finish(s, entry, now)
    work.append((entry, now))


def _try_latest(s: SchedulerState, child: Record, now: int, work: list[tuple[Record, int]]) -> None:
    c = child["name"]
    gone = [e["job"] for e in child["spec"]["after"] if e["job"] not in s.jobs]
    if gone:
        # A parent deleted (with ?force=true) never succeeds again: each own slot is recorded
        # as it comes, as a same_slot child's is (_check), not left waiting for good.
        for slot in sorted(k for k, j in s.pipes.joins.get(c, {}).items() if j["own"]):
            _decide(s, c, slot, "dependency_missing", f"parent {gone[0]} does not exist", now, work)
        return
    got = s.pipes.latest.get(c, {})
    if any(e["job"] not in got for e in child["spec"]["after"]):
        return
    joins = s.pipes.joins.get(c, {})
    for k in [k for k in joins if f"{c}@{k}" in s.runs]:
        del joins[k]  # a slot run by hand meanwhile: decided, its parents' success is not its
    if not joins:
        s.pipes.joins.pop(c, None)
    waiting = sorted(k for k, j in joins.items() if j["own"])
    if not waiting:
        return
    slot = waiting[0]
    j = s.pipes.joins[c][slot]
    j["got"] = dict(got)
    del s.pipes.latest[c]
    _make_run(s, child, slot, j, now, work)


# ------------------------------------------------------------------ gated jobs' own slots (fire)
def own_slot(s: SchedulerState, job: Record, slot: int, now: int) -> None:
    """A gated job's slot fell due (fire): it becomes a run when the parents allow, else it
    waits in a join (or is recorded, when they never will)."""
    c = job["name"]
    if f"{c}@{slot}" in s.runs or (slot not in s.pipes.joins.get(c, {}) and _in_range_record(s, c, slot)):
        return  # decided already (its parents' outcome recorded it before its own slot came)
    joins = s.pipes.joins.setdefault(c, {})
    work: list[tuple[Record, int]] = []
    j = joins.get(slot)
    if j is None:
        if len(joins) >= limits.joins_per_child_max:
            _decide(s, c, min(joins), "upstream_timeout",
                    f"{limits.joins_per_child_max} slots of {c} were waiting for their parents", now, work)
            joins = s.pipes.joins.setdefault(c, {})
        # Its wait (max_wait_s) starts at its slot: fired ahead (up to 4 s), it would otherwise
        # run out that much sooner, and a short one before the slot it is decided at.
        j = joins[slot] = {"got": {}, "own": True, "since": max(now, slot)}
    elif j["since"] < slot:  # a parent reported first (a heartbeat parent pinged with this slot)
        j["since"] = slot
    j["own"] = True
    if job["spec"].get("match") == "latest":
        _try_latest(s, job, now, work)
    else:
        _check(s, job, slot, now, work)
    _drain(s, work, now)


# ------------------------------------------------------------------ re-drive, timeouts
def rearm(s: SchedulerState, run: Record, now: int) -> list[str]:
    """A dead ``run`` was requeued: take back the records its outcome caused in its children
    (transitively), their joins restored without the reports of the jobs taken back (they will
    report again). :returns: the re-armed ids. A run that does not propagate (a manual run not
    asked to) never decided its children's slots: nothing is taken back."""
    if not propagates(run):
        return []
    out: list[str] = []
    slot = run["slot"]
    grid = _grid_of(s, run)
    memo: dict[tuple[int, int, Any, int], tuple[int, Any, Any]] = {}
    again = {run["job"]}  # the jobs whose outcome for the slot is to come again
    todo = [run["job"]]
    while todo:
        parent = todo.pop()
        for c in sorted(s.pipes.children.get(parent, ())):  # name order, alike on every replica
            rid = f"{c}@{slot}"
            rec = s.runs.get(rid)
            child = s.jobs.get(c)
            if child is None:
                continue
            if rec is None or "slot_to" in rec:
                # No record of the slot its own, but a recorded range over it (a parent's missed
                # slots): the slot is cut out of the range, and decided again by this outcome.
                got = _split_range(s, child, slot, again, grid, memo)
                if got is None:
                    continue
                s.pipes.joins.setdefault(c, {})[slot] = {"got": got, "own": False, "since": now}
                deadlines.reopen(s, rid)  # (judged missed with the range: to be decided again)
                out.append(rid)
                again.add(c)
                todo.append(c)
                continue
            if rec.get("kind") != "recorded" or rec.get("reason") not in UPSTREAM_REASONS or "upstream" not in rec:
                continue
            if _ran_by_hand(s, c, slot):
                continue  # its slot ran by hand: the record stays, nothing below it is to come again
            s.runs.pop(rid, None)
            hist = s.history.get(c)
            if hist is not None and rid in hist:
                hist.remove(rid)
            kept = s.pipes.joins.get(c, {}).get(slot)
            # The slot is to be decided again, as any re-armed one. A rerun join waiting for it (below
            # a rerun: the record counted as its run) hands on the newest outcomes it holds, not the
            # record's (the reports of the jobs taken back are dropped from it below).
            got = dict(kept["got"]) if kept is not None and "rerun" in kept \
                else _rearmed_got(s, child, slot, rec["upstream"], again)
            join = s.pipes.joins.setdefault(c, {})[slot] = {"got": got, "own": bool(rec.get("own")), "since": now}
            if rec.get("held"):  # fired ahead of its job's pause, which still holds it (notify.pause)
                join["held"] = True
            deadlines.reopen(s, rid)  # (judged missed with the record taken back)
            out.append(rid)
            again.add(c)
            todo.append(c)
    # No fan-out still to be offered, and no join of the slot, keeps a report of a job taken back:
    # it would decide with a stale one. A range still to be offered over the slot (its parts cut
    # above, as it was recorded before) is offered without it: ``cut``, recorded around
    # (_offer_range), so that the slot waits for the job's new outcome.
    for key in list(s.pipes.fanout):
        src = s.pipes.fanout[key]["src"]
        if src["job"] not in again:
            continue
        if "slot_to" not in src:
            if src["slot"] == slot:
                del s.pipes.fanout[key]
        elif src["slot"] <= slot <= src["slot_to"] and slot not in src.get("cut", ()):
            bisect.insort(src.setdefault("cut", []), slot)
    for p in again:
        for c in s.pipes.children.get(p, ()):
            j = s.pipes.joins.get(c, {}).get(slot)
            if j is not None:
                j["got"] = {k: v for k, v in j["got"].items() if k not in again}
                if "fresh" in j:
                    j["fresh"] = [k for k in j["fresh"] if k not in again]
    return out


def _rearmed_got(s: SchedulerState, child: Record, slot: int, upstream: dict[str, list[Any]],
                 again: set[str]) -> dict[str, list[Any]]:
    """The reports a re-armed record's join starts with: those the record kept of the child's
    parents (not of a parent a put has taken since), and, for a parent a put has added since the
    record was made, its outcome of the slot read from its history (_slot_outcome), as a put
    reads back a parent it adds for a slot still to decide: that parent reported before the
    edge existed, and will not again (the join waited for it until max_wait_s). The reports of
    the jobs taken back (``again``) go at the end of the rearm."""
    got: dict[str, list[Any]] = {}
    for e in child["spec"].get("after", ()):
        p = e["job"]
        if p in upstream:
            got[p] = upstream[p]
        elif p not in again:
            info = _slot_outcome(s, p, slot)
            if info is not None:
                got[p] = info
    return got


def _grid_of(s: SchedulerState, run: Record) -> tuple[Record, int] | None:
    """The slots ``run``'s slot is one of: its backfill's (the schedule and anchor the backfill
    planned with; a cascade's children name it too), else its job's schedule; None for a
    triggered job's run outside a backfill."""
    bf = s.backfills.get(run["backfill"]) if "backfill" in run else None
    plan = bf.get("plan") if bf is not None else None
    if isinstance(plan, dict) and isinstance(plan.get("schedule"), dict):
        return plan["schedule"], plan["anchor"]
    job = s.jobs.get(run["job"])
    if job is not None and "schedule" in job["spec"]:
        return job["spec"]["schedule"], job["anchor"]
    return None


#: At most this many slots of a cron schedule are stepped through to count a range, and its
#: parts, when a slot is cut out of it (_split_range); past it the parts have no count.
_PART_COUNT_STEPS = 64


def _range_shape(grid: tuple[Record, int] | None, lo: int, hi: int, count: Any, slot: int,
                 memo: dict[tuple[int, int, Any, int], tuple[int, Any, Any]]) -> tuple[int, Any, Any]:
    """Where the part after ``slot`` of a range [lo, hi] of ``count`` slots starts, and the
    count of the part before and after it: (start, before, after). On ``grid`` (the rearmed
    run's slots) when it is the range's own (it counts ``count`` slots in the range): the next
    slot, and counts; else (no grid, a schedule changed since, another parent's range) 1 ms after
    the slot, and no counts, so that no slot the range held falls out of it. Memoised in
    ``memo`` (a fan-out's children share the range)."""
    key = (lo, hi, count, slot)
    got = memo.get(key)
    if got is not None:
        return got
    shape: tuple[int, Any, Any] = (slot + 1, None, None)
    if grid is not None and isinstance(count, int):
        sched, anchor = grid
        if schedule.count_slots(sched, lo - 1, hi, anchor, _PART_COUNT_STEPS) == count:
            nxt = schedule.next_slot_after(sched, slot, anchor)
            nxt = hi + 1 if nxt is None else nxt
            before = schedule.count_slots(sched, lo - 1, slot - 1, anchor, _PART_COUNT_STEPS) or None
            after = schedule.count_slots(sched, nxt - 1, hi, anchor, _PART_COUNT_STEPS) if nxt <= hi else None
            shape = (nxt, before, after or None)
    memo[key] = shape
    return shape


def _split_range(s: SchedulerState, child: Record, slot: int, again: set[str],
                 grid: tuple[Record, int] | None,
                 memo: dict[tuple[int, int, Any, int], tuple[int, Any, Any]]) -> dict[str, list[Any]] | None:
    """Cut ``slot`` out of the ``upstream_*`` range ``child`` recorded over it (a parent's missed
    range, _offer_range), for a rearm: the parts before and after it stay recorded
    (_range_shape), and the slot is to be decided again. :returns: the reports the slot's join
    starts with (each other parent's final outcome for it, but those of the jobs in ``again``,
    which come again), or None when no such range covers the slot, the slot ran by hand, or
    another parent's outcome for it decides it as it is recorded (nothing to decide again)."""
    c = child["name"]
    if c not in s.pipes.ranged or _ran_by_hand(s, c, slot):
        return None
    hist = s.history.get(c, [])
    runs = s.runs
    at = next((i for i, r in enumerate(hist) if "slot_to" in runs[r] and runs[r]["slot"] <= slot <= runs[r]["slot_to"]),
              None)
    if at is None:
        return None
    rec = runs[hist[at]]
    if rec.get("kind") != "recorded" or rec.get("reason") not in UPSTREAM_REASONS:
        return None
    got: dict[str, list[Any]] = {}
    for e in child["spec"]["after"]:
        p = e["job"]
        if p in again:
            continue
        if p not in s.jobs:
            return None  # (dependency_missing: as recorded, it stays so)
        info = _final_of(s, p, slot)
        if info is not None:
            if _satisfies(info[0], e["on"]) is not True:
                return None  # another parent missed or failed the slot: it stays recorded
            got[p] = info
    lo, hi = rec["slot"], rec["slot_to"]
    start, before, after = _range_shape(grid, lo, hi, rec.get("count"), slot, memo)
    while start <= hi and f"{c}@{start}" in runs:
        start += 1  # a run of its own there (by hand): the part starts after it (not counted)
        after = None
    # (Neither the stats nor the events count the parts again: the range was told once.)
    if lo < slot:
        rec["slot_to"], rec["count"] = slot - 1, before
        at += 1
    else:
        del runs[rec["id"]]
        del hist[at]
    if start <= hi:
        part = dict(rec, id=f"{c}@{start}", slot=start, slot_to=hi, count=after)
        runs[part["id"]] = part
        hist.insert(at, part["id"])
    if s._trim_clean:
        s._trim_clean.pop(id(hist), None)
    return got


def overdue(s: SchedulerState, now: int, n: int) -> list[list[Any]]:
    """The leader's read: up to ``n`` joins waiting longer than their child's max_wait_s,
    ``[child, slot, since]``."""
    out: list[list[Any]] = []
    for c, joins in s.pipes.joins.items():
        job = s.jobs.get(c)
        if job is None:
            continue
        wait = job["spec"].get("max_wait_s", limits.max_wait_s_default) * 1000
        for slot, j in joins.items():
            if "rerun" in j and not j["fresh"]:
                continue  # below a rerun, before any new outcome: each parent's comes (open_downstream)
            if j["since"] + wait <= now:
                out.append([c, slot, j["since"]])
                if len(out) >= n:
                    return out
    return out


def unreported(s: SchedulerState, now: int, n: int, after: str | None, budget: int) -> tuple[list[list[Any]], str | None]:
    """The leader's read, beside ``overdue``: a triggered child's slots no parent has reported
    yet, so no join holds them (a child of one parent whose run for the slot still runs), past
    the child's max_wait_s counted from the slot: ``[child, slot, slot]`` items for
    ``join_expire``, at most ``n``. It reads the newest ``_UNREPORTED_SCAN`` runs of each parent,
    in name order from the parent after ``after``, at most ``budget`` runs a call: returns the
    items and the parent to go on after (None: the end was reached, start again)."""
    out: list[list[Any]] = []
    parents = sorted(s.pipes.children)
    i = bisect.bisect_right(parents, after) if after is not None else 0
    runs, jobs, joins = s.runs, s.jobs, s.pipes.joins
    for p in parents[i:]:
        budget -= 1  # (a parent looked at costs, whatever it has)
        kids = [jobs[c] for c in sorted(s.pipes.children[p]) if c in jobs and "schedule" not in jobs[c]["spec"]]
        hist = s.history.get(p) or ()
        if kids and hist:
            k = 0
            for rid in reversed(hist):
                k += 1
                if k > _UNREPORTED_SCAN:
                    break
                run = runs[rid]
                slot = run["slot"]
                if not _starts_wait_at_slot(p, run):
                    continue
                budget -= len(kids)
                for child in kids:
                    c = child["name"]
                    if slot + child["spec"].get("max_wait_s", limits.max_wait_s_default) * 1000 <= now \
                            and slot not in joins.get(c, ()) and _waits_unreported(s, child, slot) \
                            and [c, slot, slot] not in out:
                        out.append([c, slot, slot])
                        if len(out) >= n:
                            return out, p
        if budget <= 0:
            return out, p
    return out, None


def _starts_wait_at_slot(p: str, run: Record) -> bool:
    """Whether parent ``p``'s ``run``, unfinished, is one whose report will start its children's
    wait at its slot (_fan's ``from_slot``): the slot's own scheduled run. A manual or backfill
    run (which may name a slot long past) starts it when it reports, and a triggered parent's
    when it reports too: no child of theirs waits before that."""
    return run["state"] in UNFINISHED and run.get("kind", "scheduled") == "scheduled" and "backfill" not in run \
        and run["id"] == f"{p}@{run['slot']}" and propagates(run)


#: The newest runs of a parent ``unreported`` reads (its unfinished runs are its newest).
_UNREPORTED_SCAN = 64
#: A run in these states has no final outcome yet (its children wait for it).
UNFINISHED = frozenset({"queued", "waiting", "running"})


def _waits_unreported(s: SchedulerState, job: Record, slot: int) -> list[str]:
    """The parents of triggered child ``job`` whose own run for ``slot`` has no final outcome
    yet, when ``job``'s slot has no join and no entry (``unreported``): else []."""
    c = job["name"]
    if "schedule" in job["spec"] or f"{c}@{slot}" in s.runs or _held_by(s, f"{c}@{slot}") is not None \
            or _in_range_record(s, c, slot):
        return []
    out = []
    for e in job["spec"]["after"]:
        r = s.runs.get(f"{e['job']}@{slot}")
        if r is not None and _starts_wait_at_slot(e["job"], r):
            out.append(e["job"])
    return out


def apply_join_expire(s: SchedulerState, cmd: Record, now: int) -> Record:
    """``join_expire {joins: [[child, slot, since], ...]}``: the leader's sweep of joins past
    their child's ``max_wait_s`` (by state time): each still waiting since ``since`` is recorded
    ``upstream_timeout``, naming the parents it waited for; the others are ``ignored``. An item
    whose slot has no join (``unreported``: ``since`` is the slot) is recorded when the child is
    triggered, its slot has no entry, and a parent's run for the slot has no final outcome.

    :raises InvalidCommand: not a bounded list of [child, slot, since]."""
    items = cmd.get("joins")
    if not isinstance(items, list) or len(items) > limits.expire_items_max:
        raise InvalidCommand("join_expire needs a bounded list of joins")
    for it in items:
        if not (isinstance(it, list) and len(it) == 3 and isinstance(it[0], str) and is_int(it[1])
                and is_int(it[2])):
            raise InvalidCommand("join_expire items are [child, slot, since]")
    work: list[tuple[Record, int]] = []
    expired, ignored = 0, 0
    for c, slot, since in items:
        j = s.pipes.joins.get(c, {}).get(slot)
        job = s.jobs.get(c)
        if j is None and job is not None and since == slot \
                and since + job["spec"].get("max_wait_s", limits.max_wait_s_default) * 1000 <= now:
            waited = _waits_unreported(s, job, slot)
            if waited:
                _decide(s, c, slot, "upstream_timeout", "waited for " + ", ".join(f"{p}@{slot}" for p in waited)
                        + f", past max_wait_s ({job['spec'].get('max_wait_s', limits.max_wait_s_default)} s)",
                        now, work)
                expired += 1
                continue
        if j is None or job is None or j["since"] != since \
                or since + job["spec"].get("max_wait_s", limits.max_wait_s_default) * 1000 > now:
            ignored += 1
            continue
        missing = [e["job"] for e in job["spec"]["after"] if e["job"] not in j["got"]]
        _decide(s, c, slot, "upstream_timeout", "waited for " + ", ".join(f"{p}@{slot}" for p in missing)
                or "waited for its own slot", now, work)
        expired += 1
    _drain(s, work, now)
    return {"ok": True, "expired": expired, "ignored": ignored}


# ------------------------------------------------------------------ results
def check_result(v: object) -> Any:
    """A run's result as a complete carries it: at most result_bytes_max encoded, else None
    (apply keeps it only when it fits; the worker checks first and says why)."""
    if v is None:
        return None
    try:
        size = len(msgpack.packb(v, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return None
    return v if size <= limits.result_bytes_max else None


# ------------------------------------------------------------------ reads
def deadline_children(s: SchedulerState, names: list[str]) -> dict[str, list[list[Any]]]:
    """The leader's read for a fire: for each of ``names`` (scheduled jobs) with triggered
    descendants that have a per-slot deadline, ``[name, gen, deadline]`` of each of those (the
    walk stops at a gated job: its own fire carries its slots). Empty when none has children."""
    kids_of = s.pipes.children
    out: dict[str, list[list[Any]]] = {}
    if not kids_of:
        return out
    for root in names:
        if root not in kids_of:
            continue
        found: list[list[Any]] = []
        seen: set[str] = set()
        todo = sorted(kids_of[root])
        while todo:
            c = todo.pop()
            job = s.jobs.get(c)
            if c in seen or job is None or "schedule" in job["spec"]:
                continue
            seen.add(c)
            d = job["spec"].get("deadline")
            if d and ("start_within_s" in d or "succeed_within_s" in d or "succeed_by" in d):
                found.append([c, job["gen"], d])
            todo.extend(sorted(kids_of.get(c, ())))
        if found:
            out[root] = sorted(found, key=lambda x: x[0])
    return out


def waiting_for(s: SchedulerState, name: str, slot: int) -> list[Record]:
    """What child ``name``'s slot waits for: each parent without a report, with its run's state;
    or, for a child a cascade holds, its backfill (``{"backfill", "state": "held", ...}``)."""
    job = s.jobs.get(name)
    if job is None or "after" not in job["spec"]:
        return []
    bf_id = _held_by(s, f"{name}@{slot}")
    if bf_id is not None:
        bf = s.backfills[bf_id]
        rate = bf["req"]["rate_milli"]
        return [{"backfill": bf_id, "state": "held", "run": f"{name}@{slot}",
                 "max_concurrent": bf["req"]["max_concurrent"], "rate_per_s": None if rate is None else rate / 1000,
                 "backfill_state": bf["state"]}]
    j = s.pipes.joins.get(name, {}).get(slot)
    got = j["got"] if j is not None else {}
    if job["spec"].get("match") == "latest":
        got = s.pipes.latest.get(name, {})
    out = []
    for e in job["spec"]["after"]:
        p = e["job"]
        if p in got:
            continue
        r = _parent_run(s, p, slot)
        item: Record = {"job": p, "on": e["on"], "run": f"{p}@{slot}" if r is None else r["id"]}
        if r is not None:
            item["state"] = r["state"]
            item["attempt"] = r.get("attempt")
            pj = s.jobs.get(p)
            if pj is not None:
                item["max_attempts"] = pj["spec"]["retry"]["max_attempts"]
        else:
            pj = s.jobs.get(p)
            if pj is None:
                item["state"] = "missing"
            elif pj["paused"]:
                item["state"] = "paused"  # its run of the slot comes when it is resumed, if ever
            elif "schedule" not in pj["spec"]:
                item["state"] = "waiting_parents"  # a triggered parent: waits for its own parents
            elif not _on_grid(pj, slot, {}):
                item["state"] = "never"  # an instant its schedule never reaches
            else:
                item["state"] = "not_fired"
        out.append(item)
    return out


def _parent_run(s: SchedulerState, p: str, slot: int) -> Record | None:
    """Parent ``p``'s run for ``slot`` that a child waits for: one not finished that reports to
    its children (the slot's scheduled run ``P@S``, a manual run with propagate ``P@S!manual-N``,
    a run of the slot by hand ``P@S#manual-N``, a cascading backfill's ``P@S#bID``), the
    scheduled one first, else the newest; else the scheduled run as it stands, or None. Before,
    only ``P@S`` was read: a child waiting for a manual run with propagate said "its slot has not
    fired" while that run was running. A read, under the replica's lock: of the parent's history,
    the newest ``_PARENT_RUN_SCAN`` entries when ``P@S`` is not one (such a run is made when it is
    asked for: among the newest)."""
    runs = s.runs
    r = runs.get(f"{p}@{slot}")
    if r is not None and r["state"] in UNFINISHED and propagates(r):
        return r
    again = _unfinished_rerun(s, p, slot, _PARENT_RUN_SCAN)
    return r if again is None else again


def downstream_preview(s: SchedulerState, name: str, slot: int,
                       tenants: frozenset[str] | None) -> tuple[list[str], list[str]]:
    """What a rerun of job ``name``'s ``slot`` with ``downstream`` leaves below it (a node's
    warnings, read at the trigger): the runs of the slot still going of the jobs below (they run
    on the earlier outcomes, and are not run again), and the jobs below of other tenants than
    ``tenants`` (not reached, nor what is only below them). Up to limits.downstream_jobs_max jobs."""
    going: list[str] = []
    other: list[str] = []
    todo, seen = [name], {name}
    while todo and len(seen) <= limits.downstream_jobs_max:
        for c in sorted(s.pipes.children.get(todo.pop(0), ())):
            job = s.jobs.get(c)
            if c in seen or job is None:
                continue
            seen.add(c)
            if tenants is not None and job["spec"]["tenant"] not in tenants:
                other.append(c)
                continue
            run = next((x for x in reversed(slot_entries(s, c, slot)) if x["state"] in UNFINISHED), None)
            if run is not None:
                going.append(run["id"])
            todo.append(c)
    return going, other


def rerun_waiting(s: SchedulerState, name: str, slot: int) -> str | None:
    """What job ``name``'s ``slot`` waits for to run again below a rerun (its rerun join), or None."""
    j = s.pipes.joins.get(name, {}).get(slot)
    return None if j is None or "rerun" not in j else waiting_text(waiting_for(s, name, slot))


def newest_entry(s: SchedulerState, name: str, slot: int) -> Record | None:
    """Job ``name``'s newest run of ``slot`` (not a record), or None."""
    return next((x for x in reversed(slot_entries(s, name, slot)) if x.get("kind") != "recorded"), None)


def newest_upstream(s: SchedulerState, job: Record, slot: int) -> list[Record] | None:
    """A child ``job``'s parents' newest outcomes of ``slot``, as a run's ``upstream`` (those that
    have one), or None (no parent has one, or ``job`` has no parents): what a rerun of the
    child's slot by hand is handed (trigger_job_with's ``rerun``), whether or not they meet its
    edges (the run is asked for; its handler reads what they did)."""
    got: dict[str, list[Any]] = {}
    for e in job["spec"].get("after", ()):
        p = e["job"]
        if p not in s.jobs:
            continue
        ended = [x for x in slot_entries(s, p, slot) if x["state"] not in UNFINISHED and propagates(x)]
        if ended:  # (the newest that ended, a run of it going again meanwhile or not)
            x = ended[-1]
            got[p] = report_of(x)
        else:
            rec = _slot_outcome(s, p, slot)  # (a recorded range over the slot)
            if rec is not None:
                got[p] = rec
    return upstream_of(got) if got else None


def slot_entries(s: SchedulerState, name: str, slot: int) -> list[Record]:
    """Job ``name``'s entries of ``slot`` in its history, oldest first: its own ``NAME@S`` and
    the runs of it by hand, a cascade's reruns and a backfill's (``NAME@S#...``). One pass over
    the job's history (bounded by its ``history``)."""
    base = f"{name}@{slot}"
    again = base + "#"
    runs = s.runs
    out = []
    for rid in s.history.get(name, ()):
        if rid == base or rid.startswith(again):
            x = runs.get(rid)
            if x is not None:
                out.append(x)
    return out


def manual_slot_id(s: SchedulerState, name: str, slot: int) -> str:
    """The id of a new run of job ``name``'s ``slot`` made by hand (a trigger with the slot, a
    cascade's rerun): ``NAME@S`` when no entry has it, else ``NAME@S#manual``, else
    ``NAME@S#manual-N`` (N the state's manual counter)."""
    base = f"{name}@{slot}"
    rid = base if base not in s.runs else base + "#manual"
    if rid in s.runs:
        s.manual_seq += 1
        rid = f"{base}#manual-{s.manual_seq}"
    return rid


def _rerun_ids(p: str, slot: int) -> tuple[str, str]:
    """The starts of the ids of parent ``p``'s runs of ``slot`` other than its own ``P@S``: a
    manual run with propagate (``P@S!manual-N``), a run by hand or a cascading backfill's
    (``P@S#...``)."""
    return f"{p}@{slot}!", f"{p}@{slot}#"


def _unfinished_rerun(s: SchedulerState, p: str, slot: int, newest: int | None = None) -> Record | None:
    """The newest of parent ``p``'s runs of ``slot`` other than its own (_rerun_ids) that is
    unfinished and reports to children, among the ``newest`` last entries of its history (all of
    them when None), or None."""
    runs, again = s.runs, _rerun_ids(p, slot)
    hist = s.history.get(p) or ()
    stop = -1 if newest is None else max(-1, len(hist) - 1 - newest)
    for k in range(len(hist) - 1, stop, -1):
        rid = hist[k]
        x = runs.get(rid)
        if x is not None and rid.startswith(again) and x["slot"] == slot and x["state"] in UNFINISHED \
                and propagates(x):
            return x
    return None


#: The newest entries of a parent's history _parent_run reads for a run of a slot other than its own.
_PARENT_RUN_SCAN = 256


def graph(s: SchedulerState, name: str) -> Record | None:
    """Job ``name``'s ancestors and descendants, transitively, with each edge's condition."""
    if name not in s.jobs:
        return None
    edges: set[tuple[str, str, str]] = set()
    up, todo = {name}, [name]
    while todo:
        j = todo.pop()
        job = s.jobs.get(j)
        for e in (job["spec"].get("after", ()) if job else ()):
            edges.add((e["job"], j, e["on"]))
            if e["job"] not in up:
                up.add(e["job"])
                todo.append(e["job"])
    down, todo = {name}, [name]
    while todo:
        j = todo.pop()
        for c in s.pipes.children.get(j, ()):
            cj = s.jobs.get(c)
            if cj is None:
                continue
            edges.add((j, c, _edge(cj, j)))
            if c not in down:
                down.add(c)
                todo.append(c)
    nodes = sorted(up | down)
    return {"job": name, "parents": sorted(up - {name}), "children": sorted(down - {name}),
            "nodes": [{"job": n, "kind": _kind(s, n)} for n in nodes],
            "edges": [{"from": a, "to": b, "on": on} for a, b, on in sorted(edges)]}


def _kind(s: SchedulerState, n: str) -> str:
    job = s.jobs.get(n)
    if job is None:
        return "missing"
    spec = job["spec"]
    if "after" not in spec:
        return "scheduled"
    return "gated" if "schedule" in spec else "triggered"


def _run_view_copy(r: Record) -> Record:
    out = dict(r)
    if "attempts" in r or r.get("state") == "succeeded":
        out["attempts"] = attempts_of(r)
    return out


def slot_runs(s: SchedulerState, name: str, slot: int) -> list[Record]:
    """The runs and records of slot ``slot`` across ``name``'s pipeline (its graph), each job's
    scheduled run first then those that ran the slot again (a backfill's, by hand), with what
    each waiting child waits for (a child for which ``slot`` is no slot has no entry: _may_wait)."""
    g = graph(s, name)
    if g is None:
        return []
    out = []
    grid: dict[str, bool] = {}
    runs = s.runs
    for node in g["nodes"]:
        n = node["job"]
        r = runs.get(f"{n}@{slot}")
        # The slot's later runs too (a backfill's NAME@SLOT#bID, a run of the slot by hand
        # NAME@SLOT#manual-N, a manual run NAME@T!manual-N at that instant): a reprocessed slot
        # showed its dead run only, its children after the backfill's success beside it.
        again = (f"{n}@{slot}#", f"{n}@{slot}!")
        later = [runs[rid] for rid in s.history.get(n, ()) if rid.startswith(again) and rid in runs]
        if r is None and not later:
            r = _range_covering(s, n, slot)
        if r is not None or later:
            # Copies, as every read answers runs (queries._run_copy): the view is made outside
            # the replica's lock, and a succeeded run's last attempt is not kept but shown.
            if r is not None:
                out.append(_run_view_copy(r))
            out.extend(_run_view_copy(x) for x in later)
        elif n in s.jobs and "after" in s.jobs[n]["spec"] and _may_wait(s, s.jobs[n], slot, grid) is None:
            on = waiting_for(s, n, slot)
            out.append({"id": f"{n}@{slot}", "job": n, "slot": slot, "state": "waiting", "kind": "waiting",
                        "waiting_on": on, "waiting_for": waiting_text(on)})
    return out


def _range_covering(s: SchedulerState, name: str, slot: int) -> Record | None:
    """Job ``name``'s recorded range (``slot`` .. ``slot_to``: an outage's missed slots, a
    parent's decided range) holding ``slot`` past its first, newest first; None when none does.
    (A walk: a slot inside a range showed the parent as having done nothing for it.)"""
    runs = s.runs
    for rid in reversed(s.history.get(name, ())):
        r = runs.get(rid)
        if r is not None and "slot_to" in r and r["slot"] <= slot <= r["slot_to"]:
            return r
    return None


def waiting_run(s: SchedulerState, run_id: str) -> Record | None:
    """The view of a child's run that does not exist yet (``report@<slot ms>`` of a job with
    ``after``): what it waits for; None when the id names no such job or slot
    (waiting_run_or_why)."""
    got = waiting_run_or_why(s, run_id)
    return got if isinstance(got, dict) else None


def waiting_run_or_why(s: SchedulerState, run_id: str) -> Record | str | None:
    """``GET /v1/runs/{id}`` of a run not made yet: the waiting view of child ``C@S`` when S is,
    or can be, one of C's slots (_may_wait); else why not (S names no slot of it); None when
    the id names no child job or no slot (ms with no leading zero, as run ids are made)."""
    got = slot_id(run_id)
    job = None if got is None else s.jobs.get(got[0])
    if got is None or job is None or "after" not in job["spec"]:
        return None
    name, slot = got
    why = _may_wait(s, job, slot)
    if why is not None:
        return why
    on = waiting_for(s, name, slot)
    return {"id": run_id, "job": name, "slot": slot, "state": "waiting", "kind": "waiting",
            "waiting_on": on, "waiting_for": waiting_text(on)}


#: The latest instant a slot may be (a schedule's next slot after limits.time_ms_max).
_SLOT_MS_MAX = limits.time_ms_max + limits.every_s_max * 1000


def _may_wait(s: SchedulerState, job: Record, slot: int, grid: dict[str, bool] | None = None) -> str | None:
    """None when child ``job``'s slot ``slot`` waits, or is to: it has a join, a backfill holds
    it, or (from when the job was made) it is a slot of the job's own schedule (gated) or of its
    parents' (triggered: of their parents' in turn, through triggered parents), or a parent's
    run of that slot, not finished, is to report to it. Else why it is none. A dict look-up a
    parent, and one next-slot search a schedule (remembered in ``grid``, by job, when given):
    cheap, and it never raises."""
    if grid is None:
        grid = {}
    c = job["name"]
    if slot in s.pipes.joins.get(c, {}) or _held_by(s, f"{c}@{slot}") is not None:
        return None
    when = schedule.iso(slot) or str(slot)
    if slot < job["created"]:
        if _waits_unreported(s, job, slot):
            return None
        return f"{when} is before {c} was created, and nothing of that slot waits"
    if "schedule" in job["spec"]:
        if _on_grid(job, slot, grid):
            return None
        return f"{when} is not a slot of {c}'s schedule"
    seen = {c}
    todo = [e["job"] for e in job["spec"]["after"]]
    handled = False  # a scheduled ancestor's slot, fired and ended: decided, not waiting
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        r = s.runs.get(f"{p}@{slot}")
        if r is not None and r["state"] in UNFINISHED and propagates(r):
            return None
        if _unfinished_rerun(s, p, slot) is not None:
            return None  # a run of the slot by hand with propagate, a backfill's with cascade
        if slot in s.pipes.joins.get(p, {}) or _held_by(s, f"{p}@{slot}") is not None:
            return None  # a triggered parent's slot waits for its own parents
        if s.pipes.fanout and any(it["src"]["job"] == p and it["src"]["slot"] <= slot <= it["src"].get(
                "slot_to", it["src"]["slot"]) for it in s.pipes.fanout.values()):
            return None  # its outcome is still to reach some of its children (a deferred fan-out)
        pj = s.jobs.get(p)
        if pj is None:
            continue  # deleted: no slot of its to come
        if "schedule" in pj["spec"]:
            if _on_grid(pj, slot, grid):
                if slot > pj["cursor"]:
                    return None  # its slot still to fire
                # Fired, and its run ended (or is no longer kept): its outcome reached the
                # child then, whose entry of the slot, gone now, was made of it (a walk: a dead
                # run purged from the dead-letter queue was shown waiting for a parent that had
                # succeeded).
                handled = True
        else:
            todo.extend(e["job"] for e in pj["spec"]["after"])
    if handled:
        return (f"{c}@{when} waits for nothing: its parents ran that slot and their runs ended, and its own "
                "entry of it is not kept (purged from the dead-letter queue, or trimmed from its history)")
    return f"{when} is not a slot of {c} or of its parents' schedules"


def _on_grid(job: Record, slot: int, grid: dict[str, bool]) -> bool:
    """Whether instant ``slot`` is a slot of scheduled ``job``'s schedule (its time zone, DST
    rules, start_at and jitter), an instant no schedule reaches (past _SLOT_MS_MAX) being none;
    remembered in ``grid`` by job name."""
    got = grid.get(job["name"])
    if got is None:
        got = False
        if 0 <= slot <= _SLOT_MS_MAX:
            try:
                got = schedule.next_slot_after(job["spec"]["schedule"], slot - 1, job["anchor"]) == slot
            except (OverflowError, ValueError):  # a local time past datetime's year 9999
                got = False
        grid[job["name"]] = got
    return got


def waiting_text(items: list[Record]) -> str:
    """``waiting for transform@2026-12-02T02:00:00Z (running, attempt 2 of 3), ...``"""
    from .schedule import iso
    parts = []
    for it in items:
        if "backfill" in it:
            return (f"decided; held by backfill {it['backfill']} ({it['backfill_state']}): queued when its "
                    f"max_concurrent ({it['max_concurrent']})"
                    + (f" and rate ({it['rate_per_s']}/s)" if it["rate_per_s"] is not None else "") + " allow")
        job, _, rest = it["run"].partition("@")
        # (a run of the slot other than its scheduled one: P@S!manual-N, P@S#bID)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        when = (iso(int(rest[:digits])) or rest[:digits]) + rest[digits:] if digits else rest
        st = it["state"]
        if st in ("queued", "running") and it.get("attempt") is not None:
            st += f", attempt {it['attempt']} of {it.get('max_attempts', '?')}"
        elif st == "not_fired":
            st = "its slot has not fired"
        elif st == "waiting_parents":
            st = "waiting for its own parents"
        elif st == "never":
            st = "no slot of its schedule: it never runs for this instant"
        parts.append(f"{job}@{when} ({st})")
    return "waiting for " + ", ".join(parts) if parts else "waiting for its own slot"


def pending(s: SchedulerState, name: str, n: int) -> list[Record]:
    """Up to ``n`` of child ``name``'s slots waiting for their parents, oldest first, each with
    what it waits for (explain)."""
    out: list[Record] = []
    slots = set(s.pipes.joins.get(name, {}))
    job = s.jobs.get(name)
    if job is not None and "after" in job["spec"] and "schedule" not in job["spec"]:
        # A triggered child's slots no parent has reported yet (no join): those of its parents'
        # own scheduled runs still unfinished (the newest of each, as the leader's sweep reads them),
        # and of their runs by hand with propagate (or a backfill's) still unfinished, which
        # GET /v1/runs/{id} shows waiting too (a walk found explain listing none of those).
        c = job["name"]
        for e in job["spec"]["after"]:
            for rid in itertools.islice(reversed(s.history.get(e["job"]) or ()), _UNREPORTED_SCAN):
                run = s.runs[rid]
                slot = run["slot"]
                if _starts_wait_at_slot(e["job"], run):
                    if _waits_unreported(s, job, slot):
                        slots.add(slot)
                elif run["state"] in UNFINISHED and propagates(run) and "slot_to" not in run \
                        and f"{c}@{slot}" not in s.runs and _held_by(s, f"{c}@{slot}") is None \
                        and not _in_range_record(s, c, slot):
                    slots.add(slot)
    for slot in sorted(slots)[:n]:
        on = waiting_for(s, name, slot)
        out.append({"slot": slot, "run": f"{name}@{slot}", "waiting_on": on, "waiting_for": waiting_text(on)})
    for bf in s.backfills.values():  # decided, and held by a cascade until its budget allows
        for c, slot, _got, _created in (bf.get("held") or {}).values():
            if c == name and len(out) < n:
                on = waiting_for(s, name, slot)
                out.append({"slot": slot, "run": f"{name}@{slot}", "waiting_on": on, "waiting_for": waiting_text(on)})
    return out


def parents_first(specs: dict[str, Record]) -> list[str]:
    """The names of ``specs`` ordered so that every parent among them comes before its
    children (``raftsched sync`` and a batch put them in this order), else as given."""
    out: list[str] = []
    seen: set[str] = set()
    for root in specs:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                if n not in seen:
                    seen.add(n)
                    out.append(n)
                continue
            if n in seen:
                continue
            stack.append((n, True))
            for e in reversed(specs[n].get("after", ())):
                p = e["job"] if isinstance(e, dict) else e
                if p in specs and p not in seen:
                    stack.append((p, False))
    return out


# The handlers of fire.py and queues.py call these through pipehooks (this module imports fire.py).
pipehooks.notify = notify
pipehooks.own_slot = own_slot
pipehooks.drop_joins = drop_joins
pipehooks.rearm = rearm
pipehooks.in_range_record = _in_range_record
