"""Reads of the state: pure functions over a SchedulerState returning plain data, in storage
units (integer milliseconds since the epoch, UTC).

The other door of the core: the edges (service, API, metrics, trigger, worker) read the state
only through these, never its dicts, so the layout of its records can change behind them. The
caller runs them under the lock that serialises them with apply (replication's ``read``); what
they return shares no mutable object with the state (specs excepted: a spec is never changed in
place, a replace stores a new one), so it can be used after the lock is gone. Presentation (ISO
times, JSON shapes) is the node's: node/views.py.
"""
from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Iterable
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeAlias

from . import limits, schedule
from .errors import BadRequest, NotFound
from . import records
from .model import slot_id
from .records import STATS_FIELDS, Record, Result, attempts_of, is_int
from .notify import PAUSE_FIELDS, view_health
from .ready import Buckets, entries_of
from .tenants import DEFAULT_POLICY, refusal as policy_refusal

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: A lease or a lock as the reaper watches it: (kind, id, token, renewals, ttl_ms).
LeaseView: TypeAlias = tuple[str, str, int, int, int]
#: What the trigger plans a job's fire from: (spec, anchor, cursor, gen, name).
PlanView: TypeAlias = tuple[Record, int, int, int, str]

_QUEUE_DEFAULT = {"max_depth": limits.queue_depth_default, "on_full": "reject"}


# ------------------------------------------------------------------ jobs
def kept_position(old: Record | None, sched: Record | None) -> tuple[int, int, int | None] | None:
    """The ``(cursor, anchor, next)`` a put of schedule ``sched`` keeps from the job ``old`` it
    replaces: a replace with the same schedule keeps where the job was, so it never re-fires a
    slot nor loses a pending one. None when there is nothing to keep (a new job, or another
    schedule). The one statement of the rule: apply follows it (jobs.put_job), and the
    proposer follows it to compute the next slot it sends (put_position). (A change of the
    jitter alone: rejitter_position, the proposer's.)"""
    if old is not None and old["spec"].get("schedule") == sched:  # (a triggered job has none)
        return old["cursor"], old["anchor"], old["next"]
    return None


#: What ``jitter_s`` adds to a schedule (model._add_jitter).
_JITTER_FIELDS = ("jitter_ms", "jitter_key")


def same_but_jitter(a: Record | None, b: Record | None) -> bool:
    """Whether schedules ``a`` and ``b`` differ, and at most in their jitter (the same nominal
    slots). A comparison of the records only: apply calls it (jobs.put_job)."""
    if a is None or b is None or a == b:
        return False
    return {k: v for k, v in a.items() if k not in _JITTER_FIELDS} == \
        {k: v for k, v in b.items() if k not in _JITTER_FIELDS}


def position_digest(job: Record) -> int:
    """A digest of where job ``job`` is (its gen, cursor and next), 63 bits: what a change of
    its jitter was planned from (put_job's ``was``; 9 bytes, where the three would take 27 in
    every item of a bulk put, whose size is reserved before its position is known)."""
    h = hashlib.blake2b(b"%d:%d:%d" % (job["gen"], job["cursor"], job["next"] if job["next"] is not None else -1),
                        digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


def rejitter_position(s: SchedulerState, name: str, sched: Record) -> tuple[int, int, int, int] | None:
    """The proposer's position for a replace of job ``name`` that changes only its schedule's
    jitter: ``(cursor, anchor, next, was)``, or None when that is not the case (or the
    job's next slot is not one of its schedule's). The same grid (anchor) and the same nominal
    slots: the next is the old next slot's nominal slot at its new offset, so no slot fires
    twice (one fired at its old offset, due again at a later new one) or never (one still to
    come at its old offset, past at its new one: it is late, and its misfire policy decides
    it). The trigger walks from the cursor: it moves up over a slot before that one which would
    come again at its new offset (at most a jitter ahead of the slot it ran at), or back to just
    before that one when the trigger fired ahead past its new instant (no slot before it lies
    later), unless a run has that slot's id already (then that run is the slot's). ``was`` is
    the job's position_digest as read here: apply takes the position only if the job is still
    there (jobs.put_job), and computes no slot."""
    old = s.jobs.get(name)
    if old is None or old["next"] is None or not same_but_jitter(old["spec"].get("schedule"), sched):
        return None
    old_sched, cursor, anchor = old["spec"]["schedule"], old["cursor"], old["anchor"]
    n = schedule.nominal_of(old_sched, old["next"], anchor)
    nxt = None if n is None else schedule.next_slot_after(sched, n - 1, anchor)
    if nxt is None:
        return None
    if cursor >= nxt and f"{name}@{nxt}" not in s.runs:
        cursor = nxt - 1
    elif cursor >= nxt:
        # Its id is a run's already (a trigger of that slot by hand; a run of an older schedule,
        # or of a triggered job's parent, that took that instant): that run is the slot's.
        nxt = schedule.next_slot_after(sched, cursor, anchor)
        if nxt is None:
            return None
    else:
        for _ in range(_REJITTER_STEPS):
            x = schedule.next_slot_after(sched, cursor, anchor)
            if x is None or x >= nxt:
                break
            cursor = x
        else:
            cursor = nxt - 1
    return cursor, anchor, nxt, position_digest(old)


#: rejitter_position steps the cursor over at most this many slots before the next one (one
#: at most: a jitter is below the schedule's shortest interval).
_REJITTER_STEPS = 4


def put_position(s: SchedulerState, name: str, sched: Record) -> tuple[int, int, int | None] | None:
    """kept_position for a put of job ``name`` with schedule ``sched``."""
    return kept_position(s.jobs.get(name), sched)


def replace_position(s: SchedulerState, name: str, sched: Record) -> tuple[
        tuple[int, int, int | None] | None, tuple[int, int, int, int] | None]:
    """put_position and rejitter_position in one read (the proposer's, for each job of a bulk
    put): ``(kept, moved)``, at most one of them not None."""
    old = s.jobs.get(name)
    if old is None:
        return None, None
    kept = kept_position(old, sched)
    return kept, (None if kept is not None else rejitter_position(s, name, sched))


def cursor_floor(s: SchedulerState, name: str) -> int | None:
    """The cursor a put of job ``name`` with another schedule starts from at the least
    (floor_of, which apply keeps when it is ahead: jobs.put_job), or None for a new job."""
    old = s.jobs.get(name)
    return None if old is None else floor_of(s, old)


def floor_of(s: SchedulerState, old: Record) -> int:
    """The old job's cursor, or the newest slot its history holds under a slot's id when that is later: a
    triggered job's runs and records take their parents' slots (fired ahead, or a trigger for
    a given slot), which may be past its cursor, and a new schedule's slot must never take the
    id of a run or record that is kept (I2). One scan of the history (bounded), only on a put
    with another schedule.

    The cursor of a ``start_at`` that has fired nothing (``start_at`` - 1, where its grid
    begins: policy.initial_position) marks no slot handled: only the history floors then. Taken
    whole, it held a replace's new schedule silent until the old ``start_at`` (a typo of a year
    ahead, corrected, left the job silent for that year). (Not bounded by ``now``: apply's state
    time is not the proposer's clock, and the two would floor differently.)"""
    sched = old["spec"].get("schedule") or {}
    floor: int = -1 if "start_at" in sched and old["cursor"] == old["anchor"] - 1 else old["cursor"]
    runs, name = s.runs, old["name"]
    for rid in s.history.get(name, ()):
        r = runs[rid]
        slot = r["slot"]
        if rid != f"{name}@{slot}":
            continue  # a manual run's id (job@now!manual-N), which no slot of a schedule takes
        top = r.get("slot_to") or slot
        if is_int(top) and top > floor:
            floor = top
    return floor


def state_time(s: SchedulerState) -> int:
    """The state's time: the largest ``now`` of the commands applied (I6)."""
    return s.now_ms


def slot_unanswered(s: SchedulerState, name: str, slot_ms: int) -> dict[str, Any] | None:
    """Why job ``name``'s history holds nothing for instant ``slot_ms`` (``?slot=`` found no
    run): what the reader of an empty answer had to work out. ``{"created", "cursor",
    "oldest_entry", "paused"}`` (instants in ms, ``oldest_entry`` the slot of the oldest entry its
    history still holds, None when empty), or None for no such job."""
    j = s.jobs.get(name)
    if j is None:
        return None
    hist = s.history.get(name)
    first = s.runs.get(hist[0]) if hist else None
    return {"created": j["created"], "cursor": j["cursor"], "paused": j["paused"],
            "oldest_entry": None if first is None else first["slot"], "history": j["spec"].get("history")}


def job(s: SchedulerState, name: str) -> dict[str, Any] | None:
    """Job ``name`` as ``{"name", "spec", "gen", "created", "updated", "anchor", "cursor",
    "next", "paused", "stats": {STATS_FIELDS...}}``, or None."""
    j = s.jobs.get(name)
    if j is None:
        return None
    out = dict(j)
    out["stats"] = dict(zip(STATS_FIELDS, j["stats"]))
    out["health"] = view_health(s.health.get(name))  # core/notify.py
    why = s.pauses.get(name) if j["paused"] else None
    out["pause"] = None if why is None else dict(zip(PAUSE_FIELDS, why))
    hist = s.history.get(name)
    last = s.runs.get(hist[-1]) if hist else None
    # The newest run or recorded slot, for a list's "last outcome" (one lookup, no scan).
    out["last"] = None if last is None else {k: last[k] for k in ("id", "slot", "state", "reason") if k in last}
    return out


def jobs_page(s: SchedulerState, limit: int, after: str | None) -> dict[str, Any]:
    """Up to ``limit`` jobs by name after ``after``: ``{"jobs": [job...], "next": the last name
    when more follow, else None, "total": every job}``."""
    got = list(islice(s._names.irange(minimum=after or None, inclusive=(False, True)), limit + 1))
    page, more = got[:limit], len(got) > limit
    return {"jobs": [job(s, n) for n in page], "next": page[-1] if more else None,
            "total": len(s.jobs)}


def _names_page(names: Collection[str], limit: int, after: str | None) -> tuple[list[str], bool]:
    """The first ``limit`` of ``names`` (a filtered subset of the jobs) in order after ``after``,
    and whether more follow. One pass keeping the smallest ``limit + 1`` (O(n log limit)), not a
    sort of every name a page (at 1 000 000 names a sort took ~0.7 s a page)."""
    it = names if not after else filter(after.__lt__, names)
    got = heapq.nsmallest(limit + 1, it)
    return got[:limit], len(got) > limit


def jobs_labelled_page(s: SchedulerState, labels: dict[str, str], limit: int, after: str | None) -> dict[str, Any]:
    """jobs_page of the jobs whose spec has every label of ``labels`` (key and value): ``next``
    and ``total`` count those jobs only. A scan of every job (jobs_page reads the sorted name
    index instead; a filter has none)."""
    want = labels.items()
    names = [n for n, j in s.jobs.items() if want <= j["spec"].get("labels", {}).items()]
    page, more = _names_page(names, limit, after)
    return {"jobs": [job(s, n) for n in page], "next": page[-1] if more else None,
            "total": len(names)}


#: What :func:`labelled_walk` reads: the state's jobs map, and the names to look at (every
#: job's, or those of some tenants), copied under the replica's lock.
LabelledInputs: TypeAlias = tuple[dict[str, Record], list[str], frozenset[str] | None]


def labelled_inputs(s: SchedulerState, tenants: Collection[str] | None) -> LabelledInputs:
    """Under the replica's lock: the names a page filtered by labels looks at (every job's, or
    those of ``tenants``), copied (in C: a few ms for a million), for :func:`labelled_walk`
    outside it."""
    if tenants is None:
        return s.jobs, list(s.jobs), None
    names: list[str] = []
    for t in sorted(set(tenants)):
        ns = s._tenant_names.get(t)
        if ns is not None:
            names.extend(ns)
    return s.jobs, names, frozenset(tenants)


def labelled_walk(inputs: LabelledInputs, labels: dict[str, str], limit: int,
                  after: str | None) -> tuple[list[str], bool, int]:
    """Outside the replica's lock, from any thread: the names of the page of jobs carrying every
    one of ``labels`` (jobs_labelled_page's, jobs_page_in's), whether more follow, and how many
    carry them. Reads the jobs map one key at a time, never iterates it; a job's spec is never
    changed in place, so a job an apply replaces meanwhile is judged as it was or as it is. A
    walk of every job (~0.3 s at a million) held the Raft thread that long under the lock."""
    jobs, names, tenants = inputs
    want = labels.items()
    matched = []
    for n in names:
        j = jobs.get(n)
        if j is None:
            continue
        spec = j["spec"]  # replaced, never changed in place
        if want <= spec.get("labels", _NONE).items() and (tenants is None or spec["tenant"] in tenants):
            matched.append(n)
    page, more = _names_page(matched, limit, after)
    return page, more, len(matched)


_NONE: dict[str, str] = {}


def jobs_named(s: SchedulerState, names: list[str], tenants: Collection[str] | None = None) -> list[dict[str, Any]]:
    """:func:`job` of each of ``names`` that still exists (and, with ``tenants``, is still one of
    theirs: a job may have moved to another tenant since its name was picked), in order."""
    out = []
    for n in names:
        j = s.jobs.get(n)
        if j is not None and (tenants is None or j["spec"]["tenant"] in tenants):
            view = job(s, n)
            if view is not None:
                out.append(view)
    return out


def job_runs(s: SchedulerState, name: str, limit: int, state: str | None = None,
             slot_ms: int | None = None, tenants: Collection[str] | None = None,
             window: RunWindow | None = None) -> dict[str, Any]:
    """Job ``name``'s history, newest first: up to ``limit`` runs and records, those in ``state``
    only, or only the one covering ``slot_ms``; with ``tenants``, those of these tenants only (a
    job moved from another tenant keeps that tenant's runs); with ``window``, those whose slots
    meet it, after its cursor. ``{"job", "runs": [run...], "history_max", "next"}``: ``next`` is
    the cursor of the page after this one (the last run's id), or None when none follows.

    :raises NotFound: no such job.
    :raises BadRequest: the window's cursor names no run of the job's history (field ``before``)."""
    j = s.jobs.get(name)
    if j is None:
        raise NotFound(f"no job named {name!r}", field="name")
    runs = s.runs
    out: list[dict[str, Any]] = []
    ids: Any = reversed(s.history.get(name, []))
    if window is not None and window.before is not None:
        ids = _after_cursor(s, ids, window.before, tenants)
    for rid in ids:
        r = runs[rid]
        if state and r["state"] != state:
            continue
        if tenants is not None and _tenant_of_run(s, r) not in tenants:
            continue
        if slot_ms is not None:
            slot: int = r["slot"]
            if not slot <= slot_ms <= r.get("slot_to", slot):
                continue
        if window is not None and not window.meets(r):
            continue
        if len(out) >= limit:
            return {"job": name, "runs": out, "history_max": j["spec"]["history"], "next": out[-1]["id"]}
        out.append(_run_copy(r))
    return {"job": name, "runs": out, "history_max": j["spec"]["history"], "next": None}


def ended_leases(s: SchedulerState, worker: str, leases: list[list[Any]],
                 tenants: Collection[str] | None = None) -> dict[str, str]:
    """Of ``leases`` (``[run_id, token]``) a heartbeat of ``worker`` found lost, those whose run was
    ended while that lease held it, by something other than its worker: a cancel by request, its
    overlap policy's replace. ``{run_id: the run's error}``: what a worker says when it kills the
    run (docs/api.md, "The worker protocol"), instead of a lost lease it cannot explain. A lease
    lost otherwise (expired: the run queued again, under another token) is not among them, nor a
    run that was not this worker's, nor (``tenants``: its token's) one of another tenant: a
    guessed id and token tell nothing of it."""
    out: dict[str, str] = {}
    for rid, tok in leases:
        r = s.runs.get(rid) if type(rid) is str else None
        if r is not None and r["state"] == "failed" and r.get("fencing_token") == tok and r.get("worker") == worker \
                and isinstance(r.get("error"), str) and (tenants is None or _tenant_of_run(s, r) in tenants):
            out[rid] = r["error"]
    return out


def runs_to_cancel(s: SchedulerState, name: str, running: bool, tenants: Collection[str] | None,
                   limit: int, scan_max: int, after: str | None = None,
                   upto: str | None = None, upto_at: int | None = None) -> tuple[list[str], str | None]:
    """The ids of job ``name``'s queued runs (and with ``running`` its running ones), oldest first
    (the order its history holds them in: as they were fired or triggered), after run ``after``
    in it (a cursor: the ``next`` of the answer before; one no longer in the history starts from
    its front), those of ``tenants`` only (None: every tenant; a job moved from another tenant
    keeps that tenant's runs), not a backfill's (its own cancel ends those: a job's cancel would
    leave holes in the range it was asked to run), at most ``limit``; and the cursor to go on
    from, None when the walk reached the history's end. It stops at ``limit`` found or
    ``scan_max`` entries read (the walk holds the replica's lock; the entries a cancel ended stay
    in the history until its job's next fire trims them, and a cursor walks past them once).
    A job's queued and running runs are never trimmed from its history. With ``upto`` (a
    retry's: the newest entry of the history when the request it repeats read it), the walk
    ends at that entry: what was fired or triggered since is not looked at. An ``upto`` no
    longer in the history (a finished entry is trimmed wherever it is, the older queued ones
    kept) bounds it by ``upto_at``, that entry's ``fired_at``: an entry fired later is passed
    over (state time, which only increases: one fired in the same millisecond is not told
    apart); without it, the walk ends at once. ``POST /v1/jobs/{name}/cancel``.

    :raises NotFound: no such job."""
    if name not in s.jobs:
        raise NotFound(f"no job named {name!r}", field="name")
    runs, hist = s.runs, s.history.get(name, [])
    start = 0
    if after is not None:
        try:
            start = hist.index(after) + 1  # (a C-speed search, ~30 ms for a million entries)
        except ValueError:
            start = 0
    end = len(hist)
    later: int | None = None  # entries fired after this instant are passed over
    if upto is not None:
        try:
            end = hist.index(upto) + 1
        except ValueError:
            if upto_at is None:
                end = 0
            else:
                later = upto_at
    out: list[str] = []
    for k in range(start, end):
        rid = hist[k]
        if k - start >= scan_max or len(out) == limit:
            return out, hist[k - 1] if k > start else after
        r = runs[rid]
        if (r["state"] == "queued" or (running and r["state"] == "running")) and not r.get("kind") == "backfill" \
                and "backfill" not in r and (tenants is None or _tenant_of_run(s, r) in tenants) \
                and (later is None or (r.get("fired_at") or 0) <= later):
            out.append(rid)
    return out, None


def cancel_walk(s: SchedulerState, name: str, running: bool, tenants: Collection[str] | None,
                limit: int, scan_max: int, after: str | None = None, upto: str | None = None,
                upto_at: int | None = None) -> tuple[list[str], str | None, str | None, int | None]:
    """:func:`runs_to_cancel`, and the newest entry of the job's history in the same read, with
    its ``fired_at`` (None, None: none): what a job's cancel with an Idempotency-Key remembers,
    so that its retry walks no further (node/service.py cancel_job_runs)."""
    ids, nxt = runs_to_cancel(s, name, running, tenants, limit, scan_max, after, upto, upto_at)
    hist = s.history.get(name)
    if not hist:
        return ids, nxt, None, None
    at = s.runs[hist[-1]].get("fired_at")
    return ids, nxt, hist[-1], at if type(at) is int else None


class RunWindow:
    """A run list's time window and cursor (``GET /v1/runs``, ``/v1/jobs/{name}/runs``): runs
    whose slot (a recorded range: any of its slots) is at or after ``since`` and before
    ``until`` (ms, either None: unbounded), after run ``before`` in the list's order (the
    ``next`` of the page before; None: from the newest)."""

    __slots__ = ("since", "until", "before")

    def __init__(self, since: int | None = None, until: int | None = None, before: str | None = None) -> None:
        self.since, self.until, self.before = since, until, before

    def meets(self, r: Record) -> bool:
        slot: int = r["slot"]
        if self.until is not None and slot >= self.until:
            return False
        return self.since is None or r.get("slot_to", slot) >= self.since


def _after_cursor(s: SchedulerState, ids: Any, cursor: str, tenants: Collection[str] | None) -> Any:
    """The ids of ``ids`` after ``cursor``. :raises BadRequest: ``cursor`` is not among them, or
    is a run of a tenant outside ``tenants`` (None: every tenant), the same answer: a cursor
    must not tell a token limited to tenants whether another tenant's run exists (run ids of
    scheduled slots, ``name@slot``, can be guessed)."""
    r = s.runs.get(cursor)
    if r is not None and (tenants is None or _tenant_of_run(s, r) in tenants):
        it = iter(ids)
        for rid in it:
            if rid == cursor:
                return it
    raise BadRequest(f"no run {cursor[:200]!r} in this list (collected, or from another list): "
                      "start again without before", field="before")


def plan_views(s: SchedulerState, names: list[str]) -> list[PlanView]:
    """What the trigger plans a fire from: ``(spec, anchor, cursor, gen, name)`` of each job of
    ``names`` that still exists, one consistent view of each (a spec read before a replace and a
    generation read after it would make a plan that apply cannot tell is stale)."""
    jobs, out = s.jobs, []
    for n in names:
        j = jobs.get(n)
        if j is not None:
            out.append((j["spec"], j["anchor"], j["cursor"], j["gen"], n))
    return out


# ------------------------------------------------------------------ runs
def _run_copy(r: Record) -> dict[str, Any]:
    out = dict(r)
    if "attempts" in r or r.get("state") == "succeeded":
        # a new list (the kept one is appended to in place; each attempt never changes), with
        # a succeeded run's last attempt, which is not kept (records.attempts_of)
        out["attempts"] = attempts_of(r)
    return out


def run(s: SchedulerState, run_id: str) -> dict[str, Any] | None:
    """Run (or recorded slot) ``run_id``, or None."""
    r = s.runs.get(run_id)
    return None if r is None else _run_copy(r)


def covering_record(s: SchedulerState, run_id: str) -> dict[str, Any] | None:
    """The recorded range of the job's history that covers the instant ``run_id`` names
    (``J@<ms>``, with no run of its own: a misfire or a pause recorded its slots with others,
    under the range's first slot), or None. Any instant from the range's first slot to its last
    (``slot_to``) is covered, as ``?slot=`` of a job's runs reads it: which of them were slots
    is the schedule's of when it was recorded, which a replace may have changed since. A scan
    of the job's history (bounded by its ``history``)."""
    got = slot_id(run_id)
    if got is None or got[0] not in s.jobs:
        return None
    (name, slot), runs = got, s.runs
    for rid in s.history.get(name, ()):
        r = runs[rid]
        if "slot_to" in r and r["slot"] <= slot <= r["slot_to"]:
            return _run_copy(r)
    return None


def runs(s: SchedulerState, state: str | None, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` runs and records, the newest first, those in ``state`` only."""
    runs_: list[dict[str, Any]] = _newest(s, state, limit, None)["runs"]
    return runs_


def runs_page(s: SchedulerState, state: str | None, limit: int, tenants: Collection[str] | None,
              window: RunWindow | None) -> dict[str, Any]:
    """A page of runs and records, newest first: in ``state`` (None: any), of ``tenants`` (None:
    every tenant), in ``window``. ``{"runs", "next"}`` as job_runs'.

    :raises BadRequest: the window's cursor names no run (field ``before``)."""
    return _newest(s, state, limit, tenants, window)


def _newest(s: SchedulerState, state: str | None, limit: int,
            tenants: Collection[str] | None, window: RunWindow | None = None) -> dict[str, Any]:
    """Up to ``limit`` runs and records, newest first, in ``state`` (None: any), of ``tenants``
    (None: every tenant) and in ``window``: ``{"runs", "next"}`` as job_runs'."""
    out: list[dict[str, Any]] = []
    values: Any = reversed(s.runs.values())
    if window is not None and window.before is not None:
        values = (s.runs[rid] for rid in _after_cursor(s, reversed(s.runs), window.before, tenants))
    for r in values:
        if (state and r["state"] != state) or (tenants is not None and _tenant_of_run(s, r) not in tenants):
            continue
        if window is not None and not window.meets(r):
            continue
        if len(out) >= limit:
            return {"runs": out, "next": out[-1]["id"]}
        out.append(_run_copy(r))
    return {"runs": out, "next": None}


def _dead_in(s: SchedulerState, queue: str) -> list[Record]:
    """The dead runs of ``queue`` from its DLQ index, oldest first by (finished_at, id)."""
    runs, out = s.runs, []
    for rid in s._dead.get(queue, ()):
        r = runs.get(rid)
        if r is not None and r["state"] == "dead" and r["queue"] == queue:
            out.append(r)
    return out


def dead_runs(s: SchedulerState, queue: str | None) -> list[dict[str, Any]]:
    """The runs of ``queue``'s dead-letter queue (every queue's when None), from the DLQ index
    (not a scan of every run), oldest first by (finished_at, id) within a queue."""
    names = [queue] if queue is not None else sorted(s._dead)
    return [_run_copy(r) for q in names for r in _dead_in(s, q)]


def dead_run(s: SchedulerState, run_id: str) -> dict[str, Any] | None:
    """Run ``run_id`` if it is in a dead-letter queue, else None."""
    r = s.runs.get(run_id)
    return None if r is None or r["state"] != "dead" else _run_copy(r)


# ------------------------------------------------------------------ queues
def queue_stats(s: SchedulerState, now_ms: int,
                ready_by_queue: dict[str, tuple[int, int | None]] | None = None) -> list[dict[str, Any]]:
    """Every configured queue, every queue that belongs to tenants, and every queue holding
    queued, running or dead runs, by name: ``{"name", "max_depth", "on_full", "configured",
    "depth", "ready", "running", "dead", "oldest_waiting_age_ms", "tenants"}`` (``tenants``: the
    ones it belongs to, or None). Depth and running come from the state's counters, dead from the
    DLQ index, and ready (queued runs whose due has come) and the oldest ready run's wait from
    the queue's acquire heaps: nothing here walks every run, but the heaps are walked, every
    entry of them, unless ``ready_by_queue`` (:func:`queue_walk`'s, taken outside the replica's
    lock) gives those two figures."""
    queues, depths, running, owners = s.queues, s._queue_depth, s._running_count, s.queue_owners
    dead = {q: len(_dead_in(s, q)) for q in s._dead}
    names = set(queues) | set(owners)
    names.update(q for q, n in depths.items() if n)
    names.update(q for q, n in running.items() if n)
    names.update(q for q, n in dead.items() if n)
    out = []
    for name in sorted(names):
        cfg = queues.get(name, _QUEUE_DEFAULT)
        if ready_by_queue is None:
            ready, oldest = _ready(s, name, now_ms)
        else:
            ready, oldest = ready_by_queue.get(name, (0, None))
        out.append({"name": name, "max_depth": cfg["max_depth"], "on_full": cfg["on_full"],
                    "configured": name in queues, "depth": depths.get(name, 0), "ready": ready,
                    "running": running.get(name, 0), "dead": dead.get(name, 0),
                    "oldest_waiting_age_ms": oldest,
                    "tenants": list(owners[name]) if name in owners else None})
    return out


def _ready(s: SchedulerState, q: str, now_ms: int) -> tuple[int, int | None]:
    """Queued runs of ``q`` whose due has come, and the wait of the oldest of them (None when
    none), from the live entries of its acquire heaps: every queued run has one, under its
    current (due, id), and stale entries are told apart as acquire does."""
    return _ready_in(s.runs, q, s._queued.get(q, {}).items(), now_ms)


def _ready_in(runs: dict[str, Record], q: str, heaps: Iterable[tuple[int, Iterable[tuple[int, str]]]],
              now_ms: int) -> tuple[int, int | None]:
    """:func:`_ready` over ``heaps`` ((priority, entries (due, id)) of queue ``q``), reading
    ``runs`` one key at a time."""
    seen: set[str] = set()
    ready = 0
    oldest: int | None = None
    for p, h in heaps:
        for due, rid in h:
            if due > now_ms or rid in seen:
                continue
            r = runs.get(rid)
            if r is None or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                    or r.get("due", r["slot"]) != due:
                continue
            seen.add(rid)
            ready += 1
            age = now_ms - due
            if oldest is None or age > oldest:
                oldest = age
    return ready, oldest


#: What :func:`queue_walk` reads: the time, the state's runs map, the heaps copied
#: (worker_queries.heaps_copy), and the unplaceable count's inputs (None: no run can count).
QueueWalkInputs: TypeAlias = tuple[int, dict[str, Record], list[tuple[str, int, Buckets]], Any]


def queue_walk_inputs(s: SchedulerState, now_ms: int) -> QueueWalkInputs:
    """Under the replica's lock: what ``GET /v1/queues`` walks, the heaps copied once for both of
    its walks (ready runs, and runs no live worker may take)."""
    heaps = heaps_copy(s)
    return now_ms, s.runs, heaps, unplaceable_inputs(s, now_ms, heaps)


def queue_walk(inputs: QueueWalkInputs) -> tuple[dict[str, tuple[int, int | None]], dict[str, int]]:
    """Outside the replica's lock, from any thread (as :func:`unplaceable_walk`, whose rules it
    keeps: the runs map read one key at a time, never iterated; a run an apply changes meanwhile
    counts as it was or as it is): queue -> (ready runs, the oldest one's wait) for
    :func:`queue_stats`, and queue -> unplaceable runs. A node holding a storm's million queued
    runs walked them all under the lock for each ``GET /v1/queues`` (the dashboard polls it),
    its Raft thread waiting meanwhile."""
    now_ms, runs, heaps, unplaceable_in = inputs
    by_queue: dict[str, list[tuple[int, Iterable[tuple[int, str]]]]] = {}
    for q, p, h in heaps:
        by_queue.setdefault(q, []).append((p, entries_of(h)))
    ready = {q: _ready_in(runs, q, hs, now_ms) for q, hs in by_queue.items()}
    return ready, ({} if unplaceable_in is None else unplaceable_walk(unplaceable_in))


def oldest_ready(s: SchedulerState, now_ms: int) -> dict[str, int]:
    """Per queue holding a ready run: how long its longest-waiting ready run has waited (ms).
    For the metrics scrape, without a walk: the top of each priority's acquire heap is that
    heap's earliest due when it is live; a queue whose top entry is stale (a retried or removed
    run, or the run a full ``drop_oldest`` queue dropped) is walked as queue_stats walks it.
    The node takes :func:`oldest_ready_inputs` under the replica's lock and
    :func:`oldest_ready_walk` outside it."""
    return oldest_ready_walk(oldest_ready_inputs(s, now_ms))


#: What :func:`oldest_ready_walk` reads: the time, the runs map, the answers of the queues whose
#: heaps' tops are live, and the heaps copied of those with a stale top.
OldestInputs: TypeAlias = tuple[int, dict[str, Record], dict[str, int], list[tuple[str, list[tuple[int, Buckets]]]]]


def oldest_ready_inputs(s: SchedulerState, now_ms: int) -> OldestInputs:
    """Under the replica's lock: each queue's answer from its heaps' tops, or, for a queue whose
    top entry is stale, its heaps copied for :func:`oldest_ready_walk` (a full ``drop_oldest``
    queue of a million runs, walked under the lock at each scrape, held the Raft thread ~1 s)."""
    runs = s.runs
    done: dict[str, int] = {}
    walk: list[tuple[str, list[tuple[int, Buckets]]]] = []
    for q, heaps in s._queued.items():
        oldest: int | None = None
        stale = False
        for p, h in heaps.items():
            top = h.peek()
            if top is None:
                continue
            due, rid = top
            r = runs.get(rid)
            if r is None or r["state"] != "queued" or r["queue"] != q or r["priority"] != p \
                    or r.get("due", r["slot"]) != due:
                stale = True
                break
            if due <= now_ms and (oldest is None or now_ms - due > oldest):
                oldest = now_ms - due
        if stale:
            walk.append((q, [(p, h.copy_buckets()) for p, h in heaps.items()]))
        elif oldest is not None:
            done[q] = oldest
    return now_ms, runs, done, walk


def oldest_ready_walk(inputs: OldestInputs) -> dict[str, int]:
    """:func:`oldest_ready` from its inputs, outside the replica's lock, from any thread (the
    runs map read one key at a time: :func:`queue_walk`'s rules)."""
    now_ms, runs, done, walk = inputs
    out = dict(done)
    for q, heaps in walk:
        _, oldest = _ready_in(runs, q, [(p, entries_of(h)) for p, h in heaps], now_ms)
        if oldest is not None:
            out[q] = oldest
    return dict(sorted(out.items()))


def apply_stats(s: SchedulerState) -> dict[str, Any]:
    """A copy of what this replica counted as it applied (core/stats.py), for the metrics:
    ``{"recorded": {(state, reason): slots}, "slot_to_start": (bounds_ms, counts, sum_ms),
    "slot_to_completion": (...)}``."""
    st = s.counted  # (not what a replay at the node's start applies again)
    return {"recorded": dict(st.recorded), "finished": dict(st.finished), "deadlines": dict(st.deadlines),
            "held_back": dict(st.held_back),
            "slot_to_start": (st.slot_to_start.bounds_ms, list(st.slot_to_start.counts), st.slot_to_start.sum_ms),
            "slot_to_completion": (st.slot_to_completion.bounds_ms, list(st.slot_to_completion.counts),
                                   st.slot_to_completion.sum_ms)}


def queue_depth(s: SchedulerState, name: str) -> int:
    """Runs queued in queue ``name`` (whether due or not)."""
    return s._queue_depth.get(name, 0)


def has_ready_work(s: SchedulerState, queues: list[str] | None, now_ms: int) -> bool:
    """Whether an acquire could hand out something (a cheap local check; it may say yes for
    index entries that turn out stale or rate-limited, never no when work is ready)."""
    names = queues if queues is not None else list(s._queued)
    for q in names:
        for h in s._queued.get(q, {}).values():
            due = h.head_due()
            if due is not None and due <= now_ms:
                return True
    return False


# ------------------------------------------------------------------ leases, tenants, locks
def lease_snapshot(s: SchedulerState) -> list[LeaseView]:
    """Every live lease and lock as ``(kind, id, token, renewals, ttl_ms)``, in canonical order
    (a replica restored from a snapshot rebuilds _running_ids in another order than the grants
    happened). Linear in running runs and held locks: the reaper reads them a part at a time
    (``lease_sweep``, ``lease_views``)."""
    out = lease_views(s, s._running_ids, s.locks)
    out.sort()
    return out


def lease_sweep(s: SchedulerState, k: int) -> tuple[list[str], list[str], list[LeaseView]]:
    """The start of a reaper's sweep: the ids of every running run and the names of every held
    lock (copies of the indexes, at C speed), and the views of the first ``k`` of them (runs
    first), read under one hold of the lock. The rest goes by ``lease_views`` reads."""
    run_ids, lock_names = list(s._running_ids), list(s.locks)
    head_runs = run_ids[:k]
    return run_ids, lock_names, lease_views(s, head_runs, lock_names[:k - len(head_runs)])


def lease_views(s: SchedulerState, run_ids: Iterable[str], lock_names: Iterable[str]) -> list[LeaseView]:
    """``(kind, id, token, renewals, ttl_ms)`` of those of ``run_ids`` still running and those
    of ``lock_names`` still held, in the order given (runs, then locks)."""
    running, runs, locks = s._running_ids, s.runs, s.locks
    out: list[LeaseView] = []
    for rid in run_ids:
        if rid in running:
            r = runs[rid]
            out.append(("run", rid, r["fencing_token"], r.get("renewals", 0), r["ttl"]))
    for n in lock_names:
        lk = locks.get(n)
        if lk is not None:
            out.append(("lock", n, lk["token"], lk.get("renewals", 0), lk["ttl"]))
    return out


def tenants(s: SchedulerState) -> list[dict[str, Any]]:
    """Every tenant's rate limit by name: ``{"name", "rate_milli", "burst", "tokens_micro",
    "last_ms"}`` (tokens per 1000 s, micro-tokens: tenants.py's units)."""
    return [dict(t, name=n) for n, t in sorted(s.tenants.items())]


def tenant_configs(s: SchedulerState) -> list[dict[str, Any]]:
    """Every tenant with a rate limit, a policy or default routes, by name (tenant_config's)."""
    return [tenant_config(s, n) for n in sorted(set(s.tenants) | set(s.tenant_policies) | set(s.tenant_notify))]


def tenant_config(s: SchedulerState, name: str) -> dict[str, Any]:
    """Tenant ``name``'s rate limit and policy (each None when it has none), the policy that
    holds the jobs tokens limited to tenants write in it (``effective``: its own, or
    tenants.DEFAULT_POLICY), and its default routes (``notify``: copies, [] when it has none)."""
    t, p = s.tenants.get(name), s.tenant_policies.get(name)
    pol = None if p is None else {"executors": list(p["executors"]), "labels": dict(p["labels"]),
                                  "allow": list(p["allow"])}
    eff = pol if pol is not None else {k: (dict(v) if isinstance(v, dict) else list(v))
                                       for k, v in DEFAULT_POLICY.items()}
    return {"name": name, "limit": None if t is None else dict(t, name=name), "policy": pol, "effective": eff,
            "notify": [dict(r, on=list(r["on"])) for r in s.tenant_notify.get(name, ())]}


def policy_check(s: SchedulerState, spec: Record, limited: bool) -> tuple[str, str] | None:
    """``(field, why)`` when a job of ``spec`` may not be written under its tenant's policy by a
    token that is (``limited``) or is not limited to tenants: the tenant's policy holds every
    writer; without one, DEFAULT_POLICY holds a limited token's jobs only. None: allowed."""
    pol = s.tenant_policies.get(spec["tenant"])
    if pol is None:
        pol = DEFAULT_POLICY if limited else None
    return None if pol is None else policy_refusal(pol, spec)


def lock(s: SchedulerState, name: str) -> dict[str, Any] | None:
    """Lock ``name`` as ``{"owner", "token", "deadline", "ttl", "since", "renewals"}`` while it
    is held (until released or expired by the leader's reaper), else None."""
    lk = s.locks.get(name)
    return None if lk is None else dict(lk)


# ------------------------------------------------------------------ counts
def counts(s: SchedulerState, with_hash: bool = False) -> dict[str, Any]:
    """What ``GET /v1/cluster`` shows of the state: ``{"jobs", "runs", "now_ms", "applied"}``,
    all O(1); ``with_hash`` adds ``state_hash``, which encodes the whole state. The hash and
    ``applied`` are read together: two replicas with equal ``applied`` must have equal hashes
    (I1)."""
    out: dict[str, Any] = {"jobs": len(s.jobs), "runs": len(s.runs), "now_ms": s.now_ms, "applied": s.applied}
    if with_hash:
        out["state_hash"] = hashlib.sha256(s.snapshot()).hexdigest()
    return out


def gauges(s: SchedulerState) -> dict[str, Any]:
    """What a metrics scrape shows of the state: ``{"jobs", "jobs_paused", "runs_by_state":
    {"queued", "running", "dead": n}, "queues": {queue: (queued, running, dead)}, "locks",
    "fencing_token"}``. From the counters and the DLQ index, not a walk of the runs: finished
    runs and recorded slots are counted as they are applied instead (apply_stats)."""
    per_q = {q: (n, 0, 0) for q, n in s._queue_depth.items() if n}
    for q, n in s._running_count.items():
        if n:
            a, _, c = per_q.get(q, (0, 0, 0))
            per_q[q] = (a, n, c)
    for q in s._dead:
        n = len(_dead_in(s, q))
        if n:
            a, b, _ = per_q.get(q, (0, 0, 0))
            per_q[q] = (a, b, n)
    for q in s.queues:
        per_q.setdefault(q, (0, 0, 0))
    for q in s._queue_users:  # (a queue some job names, declared or not: its series from the start, at 0)
        per_q.setdefault(q, (0, 0, 0))
    by_state = {"queued": sum(a for a, _, _ in per_q.values()), "running": sum(b for _, b, _ in per_q.values()),
                "dead": sum(c for _, _, c in per_q.values())}
    return {"jobs": len(s.jobs), "jobs_paused": s._paused_count,
            "runs_by_state": by_state, "queues": per_q,
            "locks": len(s.locks), "fencing_token": s.fencing_token}


def fencing_token(s: SchedulerState) -> int:
    """The highest fencing token granted (I13)."""
    return s.fencing_token


# ------------------------------------------------------------------ API tokens (core/tokens.py)
def token_list(s: SchedulerState) -> list[dict[str, Any]]:
    """Every token without its hash, oldest first (by created, then id): ``{"id", "role",
    "tenants", "workers", "created", "expires", "revoked", "note"}``."""
    out = [{"id": tid, "role": t["role"], "tenants": None if t["tenants"] is None else list(t["tenants"]),
            "workers": list(t["workers"]) if "workers" in t else None,
            "jobs": list(t["jobs"]) if "jobs" in t else None,
            "created": t["created"], "expires": t["expires"], "revoked": t["revoked"], "note": t["note"]}
           for tid, t in s.tokens.items()]
    out.sort(key=lambda t: (t["created"], t["id"]))
    return out


def token_auth(s: SchedulerState, token_id: str) -> tuple[
        str, tuple[str, ...] | None, int | None, Record, tuple[str, ...] | None] | None:
    """:func:`token_auth_jobs` without the jobs of a ping token."""
    rec = token_auth_jobs(s, token_id)
    return None if rec is None else rec[:5]


def token_known(s: SchedulerState, token_id: str) -> bool:
    """Whether this replica holds a record of token ``token_id`` (revoked or not)."""
    return token_id in s.tokens


def token_auth_jobs(s: SchedulerState, token_id: str) -> tuple[
        str, tuple[str, ...] | None, int | None, Record, tuple[str, ...] | None, tuple[str, ...] | None] | None:
    """What a node checks a presented token against: ``(role, tenants, expires, hash, workers)``
    of a token that is not revoked, or None (no such token, or revoked). ``tenants`` and
    ``workers`` are tuples, or None (every tenant, any worker id)."""
    t = s.tokens.get(token_id)
    if t is None or t["revoked"] is not None:
        return None
    workers = tuple(t["workers"]) if "workers" in t else None
    jobs = tuple(t["jobs"]) if "jobs" in t else None
    return t["role"], None if t["tenants"] is None else tuple(t["tenants"]), t["expires"], t["hash"], workers, jobs


# ------------------------------------------------------------------ reads limited to tenants
# For tokens limited to tenants (node/tenancy.py): the same reads as above, of those tenants'
# jobs and runs only. A run belongs to the tenant its job had when the run was created; a
# recorded slot (skipped, coalesced) to its job's tenant.
def job_tenant(s: SchedulerState, name: str) -> str | None:
    """The tenant of job ``name``, or None when there is no such job."""
    j = s.jobs.get(name)
    return None if j is None else j["spec"]["tenant"]


def dependent_tenants(s: SchedulerState, name: str) -> set[str]:
    """The tenants of the jobs that name job ``name`` as a parent (``after``), whether or not
    ``name`` exists (a forced delete leaves its children naming it)."""
    jobs = s.jobs
    return {jobs[k]["spec"]["tenant"] for k in s.pipes.children.get(name, ()) if k in jobs}


def foreign_runs(s: SchedulerState, name: str, tenants: Collection[str]) -> int:
    """How many entries of job ``name``'s history (its runs and records, dead runs included)
    belong to tenants outside ``tenants``: those made before the job moved to its tenant."""
    runs = s.runs
    return sum(1 for rid in s.history.get(name, ()) if (r := runs.get(rid)) is not None
               and _tenant_of_run(s, r) not in tenants)


def _tenant_of_run(s: SchedulerState, r: Record) -> str | None:
    """A run's tenant; a recorded slot (which has none) belongs to its job's."""
    t = r.get("tenant")
    if t is None:
        j = s.jobs.get(r["job"])
        t = None if j is None else j["spec"]["tenant"]
    return t


def run_tenant(s: SchedulerState, run_id: str) -> str | None:
    """The tenant of run (or recorded slot) ``run_id``, or None when there is no such run."""
    r = s.runs.get(run_id)
    return None if r is None else _tenant_of_run(s, r)


def run_or_slot_tenant(s: SchedulerState, run_id: str) -> str | None:
    """run_tenant; for an id with no run that names a slot of a job (``J@<ms>``: a slot a
    recorded range covers, a pipeline child's waiting slot), its job's tenant."""
    t = run_tenant(s, run_id)
    if t is None and (got := slot_id(run_id)) is not None:
        return job_tenant(s, got[0])
    return t


def jobs_page_in(s: SchedulerState, tenants: Collection[str], limit: int, after: str | None,
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
    """jobs_page of the jobs of ``tenants`` only (``total`` counts those); with ``labels``, of
    those that carry every one of them too (jobs_labelled_page). From the tenants' sorted names
    (queues.index_job): a page is ranges of them, the labels looked at in their jobs only."""
    lists = [s._tenant_names[t] for t in sorted(set(tenants)) if t in s._tenant_names]
    if not labels:
        # A range of each tenant's sorted names, merged (a job has one tenant: no repeats).
        ranges = [ns.irange(minimum=after or None, inclusive=(False, True)) for ns in lists]
        got = list(islice(heapq.merge(*ranges), limit + 1))
        page, more = got[:limit], len(got) > limit
        total = sum(len(ns) for ns in lists)
    else:
        want, jobs = labels.items(), s.jobs
        names = [n for ns in lists for n in ns if want <= jobs[n]["spec"].get("labels", {}).items()]
        page, more = _names_page(names, limit, after)
        total = len(names)
    return {"jobs": [job(s, n) for n in page], "next": page[-1] if more else None, "total": total}


def runs_in(s: SchedulerState, tenants: Collection[str], state: str | None, limit: int) -> list[dict[str, Any]]:
    """runs of ``tenants`` only."""
    runs_: list[dict[str, Any]] = _newest(s, state, limit, tenants)["runs"]
    return runs_


def queue_tenants(s: SchedulerState, queue: str) -> set[str]:
    """The tenants of the jobs whose queue is ``queue``."""
    return set(s._queue_users.get(queue, ()))


def queue_access(s: SchedulerState, queue: str, exclude: str | None = None) -> tuple[list[str] | None, set[str]]:
    """What decides who may use ``queue`` (node/tenancy.py): the tenants it belongs to (None:
    none), and, when it belongs to none, the tenants of the jobs that use it but job ``exclude``
    (the one a put replaces)."""
    owners = s.queue_owners.get(queue)
    if owners is not None:
        return list(owners), set()
    return None, queues_access(s, [queue], {exclude} if exclude is not None else set())[queue][1]


def queues_access(s: SchedulerState, queues: Collection[str],
                  exclude: Collection[str]) -> dict[str, tuple[list[str] | None, set[str]]]:
    """queue_access of each of ``queues``, leaving out the jobs ``exclude`` names (a batch's):
    the users of a queue that belongs to no tenant are its count of jobs per tenant
    (queues.index_job) less the excluded jobs that use it, not a walk of every job (a put of a
    token limited to tenants took one, ~0.3 s at a million jobs under the replica's lock)."""
    owners, jobs = s.queue_owners, s.jobs
    asked = set(queues)
    left_out: dict[tuple[str, str], int] = {}  # (queue, tenant) -> excluded jobs, one pass
    for n in set(exclude):
        j = jobs.get(n)
        if j is not None and j["spec"]["queue"] in asked:
            key = (j["spec"]["queue"], j["spec"]["tenant"])
            left_out[key] = left_out.get(key, 0) + 1
    out: dict[str, tuple[list[str] | None, set[str]]] = {}
    for q in asked:
        if q in owners:
            out[q] = (list(owners[q]), set())
        else:
            out[q] = (None, {t for t, k in s._queue_users.get(q, {}).items() if k > left_out.get((q, t), 0)})
    return out


def queues_of(s: SchedulerState, tenants: Collection[str]) -> set[str]:
    """The queues of ``tenants``: those that belong to one of them, and those that belong to no
    tenant and are used by jobs of these tenants only (docs/security.md, "Queues")."""
    owners, mine = s.queue_owners, set(tenants)
    out = {q for q, ts in owners.items() if any(t in mine for t in ts)}
    out.update(q for q, users in s._queue_users.items() if q not in owners and users.keys() <= mine)
    return out


# ------------------------------------------------------------------ request ids
request_what = records.request_what


def request_was(s: SchedulerState, rid: str | None, what: str) -> bool:
    """Whether request id ``rid`` was applied already as ``what`` (records.request_what: the
    op and its target, ``delete_job:nightly``): a retry of it replays its first answer."""
    seen = s.requests.get(rid) if rid is not None else None
    return seen is not None and seen[0] == what


def replayed(s: SchedulerState, cmd: Command) -> Result | None:
    """What apply answers ``cmd`` when its request id is one the state remembers (records.replayed:
    the one rule apply uses too), or None."""
    return records.replayed(s.requests, cmd)


# The worker fleet's reads live in core/worker_queries.py; they are part of this door, and its
# callers read them here.
from .worker_queries import (  # noqa: E402,F401
    workers, worker, worker_record, workers_to_forget,
    unplaceable, unplaceable_inputs, unplaceable_walk, heaps_copy, waiting_for, waiting_for_many, waits_for_worker,
    why_queued_many, live_workers, labels_none_carries, fleet_gauges,
    ready_for, ready_count, ready_scan, applied_count, next_due_ms, NO_WORKER_MATCHES, NO_HANDLER, NO_LIVE_WORKER,
    drains_count,
    draining_among,
)

# Secrets at rest (core/seal_keys.py): which key new values are sealed under, and what a reseal reads.
from .seal_keys import seal_key, secret_maps  # noqa: E402,F401
