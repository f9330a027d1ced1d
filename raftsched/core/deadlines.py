"""Deadlines, judged per slot, and heartbeat jobs (docs/notifications.md, "Deadlines").

A job's ``deadline`` says when each of its slots must be done. The proposer (the leader's trigger
loop) computes each fired slot's instants with the job's schedule rules (:func:`instants`: the
cron and time-zone work is the proposer's, as for plans) and puts them in the ``fire`` command
(its ``dl`` field); apply keeps one record per slot, keyed by the slot's run id, so attribution is
strictly by slot: a retry of the 02:00 run is the 02:00 run, the 03:00 run is another record.

Each record is judged exactly once to a final outcome, in the apply that commits it, and the
same apply emits its event (core/events.py):

- when its run ends (``on_finish``: a success, the dead-letter queue, a heartbeat's ``fail``
  ping, or a slot recorded skipped/coalesced, which is judged in the fire that records it);
- when one of its instants passes, by the leader's sweep (the ``deadline_judge`` command, with
  the cluster's clock as its ``now``): ``missed`` at once, with its cause; a run that still
  succeeds afterwards turns the outcome into ``late``.

Outcomes: ``met``; ``late`` (succeeded after a deadline); ``missed`` with a cause:
``never_started``, ``still_running``, ``failed``, ``skipped``, ``paused``, ``upstream`` (and
``untracked``: evicted past ``limits.deadlines_pending_max``, see :func:`_track`; and for
``max_since_success_s`` only, ``no_slot``: no slot fell due since the last success).

``max_since_success_s`` is judged per job, not per slot: a job with no success for that long
misses once (``which`` = ``max_since_success_s``), and again only after a success.

The instant index (``_heap``) is derived: it is rebuilt on restore, and on every replica it is
bounded (rebuilt from the records once it holds too many stale entries), so a follower, which
never sweeps, holds no more than a leader. Jobs without ``deadline`` pay nothing: no record, no
index entry, and ``on_finish`` is a look-up in an empty map.
"""
from __future__ import annotations

import heapq
import re
from collections import OrderedDict, deque
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable

from . import events, limits, pipehooks, schedule, snapshot
from .errors import Conflict, InvalidCommand, InvalidSpec, NotFound
from .records import Record, Result, is_int, kept_attempts, ok, success_implied

if TYPE_CHECKING:  # pragma: no cover
    from .commands import Command
    from .state import SchedulerState

#: The fields of a job's ``deadline``.
FIELDS = ("start_within_s", "succeed_within_s", "succeed_by", "max_since_success_s")
#: What a slot whose run has not started by its ``start_within_s`` becomes (``late_start``): it
#: runs when a worker takes it (``run``, the default), or it is withdrawn (``skip``: recorded
#: skipped, reason ``late_start``), as Celery's ``expires`` drops a task that waited too long.
LATE_START = ("run", "skip")
#: Every key a ``deadline`` may hold.
KEYS = (*FIELDS, "late_start")
#: A slot record's deadlines, in the order of its instants.
WHICH = ("start_within_s", "succeed_within_s", "succeed_by")
OUTCOMES = ("pending", "met", "late", "missed")
CAUSES = ("never_started", "still_running", "failed", "skipped", "paused", "untracked", "upstream", "no_slot")
#: What a ``dl`` item costs in a fire command besides its job's name: five integers and framing.
DL_ITEM_BYTES = 56
_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


# ------------------------------------------------------------------ the spec (proposer side)
def validate(raw: object) -> Record:
    """A job's ``deadline``: ``{"start_within_s", "succeed_within_s", "succeed_by": "HH:MM",
    "max_since_success_s"}``, at least one. :raises InvalidSpec: naming the field."""
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object with start_within_s, succeed_within_s, succeed_by or "
                          "max_since_success_s", field="deadline")
    for k in raw:
        if k not in KEYS:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(KEYS)}", field=f"deadline.{k}")
    if not any(k in raw for k in FIELDS):
        raise InvalidSpec("must name at least one of " + ", ".join(FIELDS), field="deadline")
    out: Record = {}
    for k in ("start_within_s", "succeed_within_s", "max_since_success_s"):
        if k in raw:
            v = raw[k]
            if not is_int(v) or not 1 <= v <= limits.deadline_s_max:
                raise InvalidSpec(f"must be an integer of seconds, 1..{limits.deadline_s_max}", field=f"deadline.{k}")
            out[k] = v
    if "succeed_by" in raw:
        v = raw["succeed_by"]
        if not isinstance(v, str) or not _HHMM.fullmatch(v):
            raise InvalidSpec("must be a local time \"HH:MM\" (00:00..23:59) in the job's time zone",
                              field="deadline.succeed_by")
        out["succeed_by"] = v
    if "start_within_s" in out and "succeed_within_s" in out and out["start_within_s"] > out["succeed_within_s"]:
        raise InvalidSpec("must not be longer than succeed_within_s (a run cannot succeed before it starts)",
                          field="deadline.start_within_s")
    if "late_start" in raw:
        v = raw["late_start"]
        if v not in LATE_START:
            raise InvalidSpec(f"must be one of {', '.join(LATE_START)}", field="deadline.late_start")
        if "start_within_s" not in out:
            raise InvalidSpec("needs start_within_s: the time a run must start by, or be withdrawn",
                              field="deadline.late_start")
        out["late_start"] = v
    return out


def skips_late(spec: Record) -> bool:
    """Whether a job's runs not started by their ``start_within_s`` are withdrawn."""
    d = spec.get("deadline")
    return d is not None and d.get("late_start") == "skip"


def late_skip_ms(spec: Record) -> int | None:
    """A job with ``late_start: skip``: its ``start_within_s`` in ms (a slot whose run has not
    started that long after it never starts); else None. A slot the trigger fires that late (an
    outage's catch-up) is recorded at the fire (core/fire.py), a pipeline child's slot its parents
    decide that late likewise (core/pipelines.py), a run still queued at that instant is withdrawn
    by the sweep that judges it (:func:`judge`): the same instant, whether or not the slot has a
    deadline record (a fire tracks the newest of a long catch-up only: :func:`fire_items`)."""
    d = spec.get("deadline")
    if d is None or d.get("late_start") != "skip" or not is_int(d.get("start_within_s")):
        return None
    return int(d["start_within_s"]) * 1000


def governed_late(run: Record) -> bool:
    """Whether ``late_start`` governs ``run``: a run of a slot the schedule fired, or a pipeline
    child's of its parents' slot; not a run by hand, nor a backfill's (their slots are past on
    purpose, and have no deadline record)."""
    return run.get("kind") in ("scheduled", "triggered") and "backfill" not in run


def late_start_by(spec: Record, run: Record) -> int | None:
    """When ``run`` must have started by under ``late_start: skip`` (its slot + start_within_s,
    the cluster's time), or None: the grant's ``start_by`` (core/leases.py), which a worker
    holding the run for a free slot (prefetched) keeps to: it gives the run back rather than
    start it later (worker/loop.py)."""
    late_ms = late_skip_ms(spec)
    if late_ms is None or not governed_late(run) or not is_int(run.get("slot")) or not never_ran(run):
        return None  # (a retry, a lost lease's re-run, a dead run requeued: its first start was)
    return int(run["slot"]) + late_ms


def never_ran(run: Record) -> bool:
    """A run with no attempt that a worker began: none, or only leases its worker gave back
    saying it never began them (``unstarted``: a run held for a free slot past its start_by, a
    lease answer never delivered): for ``late_start`` it never started. A lease given back by a
    drain may have run (a drain kills what still runs, and gives it back): a start."""
    return all(a.get("unstarted") for a in run.get("attempts") or ())


def late_error(within_ms: int, what: str = "not started") -> str:
    """The error of a slot a ``late_start: skip`` recorded or withdrew."""
    return f"{what} within start_within_s ({within_ms // 1000} s of its slot), and the job's deadline.late_start is skip"


def _unbound_late(*args: Any) -> Any:
    raise RuntimeError("core.cancel is not imported: import raftsched.core.state")


#: cancel.withdraw_late(state, run, now): a queued run whose ``start_within_s`` passed under
#: ``late_start: skip`` is withdrawn. Bound by core/cancel.py when it is imported (state.py imports
#: it), which imports this module: an import from here would be a cycle.
withdraw_late: Callable[..., None] = _unbound_late


def _local_instant(wall: datetime, tz: str, dst: dict[str, str] | None) -> int:
    """The instant of local wall time ``wall`` in ``tz``, by the job's DST rules: a time in a
    spring-forward gap is the first instant after the gap (a deadline is never skipped); a
    repeated one is its first occurrence, or its second with ``fall_back: twice``."""
    kind, first, second = schedule._instants(wall, schedule.zone(tz))
    if kind == schedule._REPEATED and dst and dst.get("fall_back") == "twice":
        return second
    return first


def succeed_by_ms(sched: Record, hhmm: str, slot: int) -> int:
    """``succeed_by`` for the slot at ``slot``: that local time on the slot's local day in the
    job's time zone (UTC for interval and one-shot schedules), or on the next day when that falls
    at or before the slot (a slot at 03:00 cannot succeed by 03:00: an SRE's walk found the
    03:00 slot of a ``*/30`` job with ``succeed_by`` 03:00 missed every night)."""
    tz = sched.get("timezone", "UTC") if "cron" in sched else "UTC"
    dst = sched.get("dst")
    h, m = int(hhmm[:2]), int(hhmm[3:])
    day = schedule._wall_of(slot, schedule.zone(tz)).date()
    at = _local_instant(datetime(day.year, day.month, day.day, h, m), tz, dst)
    if at <= slot:
        nxt = day + timedelta(days=1)
        at = _local_instant(datetime(nxt.year, nxt.month, nxt.day, h, m), tz, dst)
    return at


def instants(spec: Record, slot: int) -> list[int | None] | None:
    """The slot's deadline instants ``[start, succeed_within, succeed_by]`` (ms, None where the
    job has no such deadline), or None when the job has no per-slot deadline. Proposer side."""
    d = spec.get("deadline")
    if not d or not ("start_within_s" in d or "succeed_within_s" in d or "succeed_by" in d):
        return None
    return [slot + d["start_within_s"] * 1000 if "start_within_s" in d else None,
            slot + d["succeed_within_s"] * 1000 if "succeed_within_s" in d else None,
            succeed_by_ms(spec["schedule"], d["succeed_by"], slot) if "succeed_by" in d else None]


def fire_items(spec: Record, entry: list[Any], anchor: int) -> list[list[Any]]:
    """The ``dl`` items of a fire entry (``policy.compact_entry``'s list) of a job with a
    deadline: ``[job, gen, slot, start, within, by]`` for each slot that becomes a run, and for
    each slot of each recorded range (skipped, coalesced), each judged on its own: the first
    ``limits.deadline_range_slots_max`` of a range (the rest of a longer range are in the same
    record, and counted by it). At most ``limits.fire_entry_deadline_bytes_max`` of items an
    entry: a catch-up that handles more slots at once keeps the newest. Empty for a job without
    one. Proposer side (``anchor``: the job's, for the slots of a range)."""
    name, gen, _after, _upto, _nxt, runs, rec = entry
    out: list[list[Any]] = []
    if "deadline" not in spec:
        return out
    slots = list(runs)
    for r in rec:
        if r[3] == r[2]:
            slots.append(r[2])
        else:
            slots.extend(schedule.iter_slots(spec["schedule"], r[2] - 1, r[3], anchor, limits.deadline_range_slots_max))
    keep = max(1, limits.fire_entry_deadline_bytes_max // (len(name.encode()) + DL_ITEM_BYTES))
    for slot in sorted(slots)[-keep:]:
        at = instants(spec, slot)
        if at is not None:
            out.append([name, gen, slot, *at])
    return out


def child_items(root: Record, entry: list[Any], anchor: int, kids: list[list[Any]], used: int = 0) -> list[list[Any]]:
    """The ``dl`` items a fire entry of scheduled job ``root`` carries for its triggered
    descendants with a per-slot deadline (``kids``: ``[name, gen, deadline]``, pipelines.py
    deadline_children): each of the entry's slots is theirs too (``same_slot``), so their
    instants are counted from it, ``succeed_by`` in the root's time zone. Within what is left of
    the entry's fire_entry_deadline_bytes_max after its own items (``used`` bytes): the
    descendants past it, in name order, are not tracked for these slots. Proposer side."""
    out: list[list[Any]] = []
    budget = limits.fire_entry_deadline_bytes_max - used
    root_name = entry[0]
    for name, gen, deadline in kids:
        pseudo = {"deadline": deadline, "schedule": root["schedule"]}
        # a seventh field, the root: apply tracks the item only if the root's entry was not stale
        items = [[name, gen, *it[2:], root_name] for it in fire_items(pseudo, [name, gen, *entry[2:]], anchor)]
        cost = len(items) * (len(name.encode()) + len(root_name.encode()) + DL_ITEM_BYTES)
        if cost > budget:
            break  # past it, the descendants left (in name order) are not tracked for these slots
        budget -= cost
        out.extend(items)
    return out


# ------------------------------------------------------------------ the replicated section
class Book:
    """Every slot's deadline record (pending, then judged), and the jobs watched for
    ``max_since_success_s``.

    ``slots``: run id -> record, in the order they were tracked; ``final``: the run ids judged
    for good, oldest first (the first to go past ``limits.deadlines_kept_max``); ``pending``:
    how many records are not final; ``since``: job -> ``[base_ms, missed]``, the last success
    (or when watching began) and whether that streak has missed already.

    ``open`` (derived, rebuilt on restore): job -> {run id: slot} of its records not final
    (pending, or judged missed while the slot's run may still come: a pipeline child's whose
    parents have not decided it, a run queued past its start), so that what decides a job's
    slots without a run of their own finds their records without a scan of the book
    (:func:`finish_range`; pipelines.on_put's :func:`close` of a job made free of parents)."""

    __slots__ = ("slots", "final", "pending", "since", "open", "_heap", "_since_heap")

    def __init__(self) -> None:
        self.slots: OrderedDict[str, Record] = OrderedDict()
        self.final: deque[str] = deque()
        self.pending = 0
        self.since: dict[str, list[Any]] = {}
        self.open: dict[str, dict[str, int]] = {}
        #: derived: (instant, run id) of the instants not yet passed, and (due, job) for since
        self._heap: list[tuple[int, str]] = []
        self._since_heap: list[tuple[int, str]] = []

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Book) and self.slots == other.slots and self.final == other.final
                and self.since == other.since)

    def rebuild(self, jobs: dict[str, Record]) -> None:
        """The indexes from the records and the watched jobs (``jobs``: the state's)."""
        self.open = {}
        for rid, r in self.slots.items():
            if not r["fin"] and r["slot"] is not None:
                self.open.setdefault(r["job"], {})[rid] = r["slot"]
        self._heap = [(t, rid) for rid, r in self.slots.items() if r["state"] in ("pending", "missed")
                      for t in _open_instants(r)]
        heapq.heapify(self._heap)
        self.rebuild_since(jobs)

    def rebuild_since(self, jobs: dict[str, Record]) -> None:
        """The since index alone, from the watched jobs."""
        self._since_heap = [(v[0] + _since_ms(jobs.get(job)), job) for job, v in self.since.items()
                            if not v[1] and _since_ms(jobs.get(job))]
        heapq.heapify(self._since_heap)

    def push_since(self, at: int, name: str, jobs: dict[str, Record]) -> None:
        """Index job ``name``'s since deadline at ``at``. Entries it replaces stay until popped:
        past twice the watched jobs (and a slack) the index is rebuilt, so re-puts of the same
        spec, successes and a sweep's put-backs cannot grow it without bound."""
        heapq.heappush(self._since_heap, (at, name))
        if len(self._since_heap) > 2 * len(self.since) + limits.queue_index_stale_slack:
            self.rebuild_since(jobs)


def _since_ms(job: Record | None) -> int:
    """The job's max_since_success_s in ms, or 0 when it has none."""
    if job is None:
        return 0
    d = job["spec"].get("deadline")
    return int(d["max_since_success_s"]) * 1000 if d is not None and "max_since_success_s" in d else 0


def _open_instants(r: Record) -> list[int]:
    return [t for t in (r["start"], r["within"], r["by"]) if t is not None and t > r["judged"]]


def _push(s: SchedulerState, book: Book, r: Record, rid: str) -> None:
    for t in _open_instants(r):
        heapq.heappush(book._heap, (t, rid))
    if len(book._heap) > 4 * len(book.slots) + 1024:
        book.rebuild(s.jobs)


def _book(s: SchedulerState) -> Book:
    book: Book = s.deadlines
    return book


def _finalise(s: SchedulerState, book: Book, rid: str, r: Record) -> None:
    if r["state"] == "pending" or r["fin"]:
        return
    r["fin"] = True
    book.final.append(rid)
    book.pending -= 1
    _unopen(book, r["job"], rid)
    while len(book.final) > limits.deadlines_kept_max:
        book.slots.pop(book.final.popleft(), None)


def _unopen(book: Book, job: str, rid: str) -> None:
    """Take ``rid`` out of job ``job``'s open records."""
    open_ = book.open.get(job)
    if open_ is not None and open_.pop(rid, None) is not None and not open_:
        del book.open[job]


def _emit(s: SchedulerState, r: Record, rid: str, now: int, attempt: int | None = None,
          withdrawn: bool = False) -> None:
    kind = "deadline.late" if r["state"] == "late" else "deadline.missed"
    s.stats.on_deadline(r["state"], r["which"], r["cause"])  # the metrics' count (stats.py)
    extra = {"withdrawn": True} if withdrawn else {}  # (late_start: skip: its run will not start)
    events.emit(s, kind, now, job=r["job"], tenant=r["tenant"], slot=r["slot"], run_id=rid, attempt=attempt,
                reason=r["cause"], deadline=r["which"], instant=r["at"], cause=r["cause"], **extra)


def _track(s: SchedulerState, job: Record, slot: int, at: list[Any], now: int) -> Record | None:
    """Start watching one slot's deadlines (the fire that made its run or record). Past
    ``limits.deadlines_pending_max`` records not yet judged, the oldest of them is judged at
    once, ``missed`` with cause ``untracked`` (an alert rather than silence)."""
    book = _book(s)
    rid = f"{job['name']}@{slot}"
    if rid in book.slots:
        return None
    r: Record = {"job": job["name"], "tenant": job["spec"]["tenant"], "slot": slot, "start": at[0],
                 "within": at[1], "by": at[2], "state": "pending", "which": None, "cause": None, "at": None,
                 "judged": 0, "done_at": None, "fin": False}
    # ``judged``: the time up to which the record's instants were looked at by a sweep (an
    # instant at or before it is not looked at again); none yet.
    book.slots[rid] = r
    book.pending += 1
    book.open.setdefault(job["name"], {})[rid] = slot
    if book.pending > limits.deadlines_pending_max:
        for old_id, old in book.slots.items():
            if old["state"] == "pending":
                _miss(s, book, old_id, old, now, _first(old), "untracked", None)
                break
    _push(s, book, r, rid)
    return r


def _first(r: Record) -> tuple[int | None, str | None]:
    """The record's earliest instant and which deadline it is."""
    best: tuple[int | None, str | None] = (None, None)
    for t, w in zip((r["start"], r["within"], r["by"]), WHICH):
        if t is not None and (best[0] is None or t < best[0]):
            best = (t, w)
    return best


def _miss(s: SchedulerState, book: Book, rid: str, r: Record, now: int, first: tuple[int | None, str | None],
          cause: str, at: int | None, final: bool = True, withdrawn: bool = False) -> None:
    """Judge ``r`` missed: ``first`` is (instant, which deadline), ``at`` the instant to report
    (None: the deadline's own, also for a miss judged before it, a dead run's). ``withdrawn``:
    its run is withdrawn by the same apply (``late_start: skip``), which the event says."""
    r["state"] = "missed"
    r["which"] = first[1]
    r["at"] = at if at is not None else first[0]
    r["cause"] = cause
    r["done_at"] = now
    run = s.runs.get(rid)
    _emit(s, r, rid, now, None if run is None else run.get("attempt"), withdrawn)
    if final:
        _finalise(s, book, rid, r)


def _first_start(run: Record) -> int | None:
    """When the slot's run first started, where that is still known."""
    att = run.get("attempts")
    if att and att[0].get("attempt") == 1:
        return int(att[0]["started_at"]) if att[0].get("started_at") is not None else None
    if run.get("attempt") == 1 and (run["state"] == "running" or (not att and success_implied(run))):
        # running, or succeeded at its first attempt, whose record is the run's own fields
        # (records.attempts_of: a success's attempt is not kept)
        return run.get("started_at")
    return None


def _cause(s: SchedulerState, run: Record | None) -> str:
    """Why a slot's run has not succeeded (yet)."""
    if run is None:
        return "skipped"
    st = run["state"]
    if st in ("skipped", "coalesced"):
        if run.get("reason") in ("upstream_failed", "upstream_missed", "upstream_timeout", "dependency_missing",
                                 "upstream_succeeded"):
            return "upstream"  # a pipeline child's slot its parents decided (core/pipelines.py)
        return "paused" if run.get("reason") == "paused" else "skipped"
    if st == "running":
        return "still_running"
    if st in ("failed", "dead") or (st == "queued" and run.get("attempts")):
        return "failed"
    job = s.jobs.get(run["job"])
    if job is not None and job["paused"]:
        return "paused"
    return "never_started"


def _late_by(r: Record, run: Record, done: int) -> tuple[int | None, str | None]:
    """The first deadline a run that succeeded at ``done`` broke, or (None, None)."""
    started = _first_start(run)
    if r["start"] is not None and started is not None and started > r["start"]:
        return r["start"], "start_within_s"
    for t, w in ((r["within"], "succeed_within_s"), (r["by"], "succeed_by")):
        if t is not None and done > t:
            return t, w
    return None, None


def on_finish(s: SchedulerState, run: Record, now: int, cause: str | None = None) -> None:
    """A slot's run ended (succeeded, dead, failed for good, or was recorded skipped): judge its
    record, if it has one (``cause``: why it missed, when the caller knows better than the run's
    state says). Called by apply wherever a run ends; O(1)."""
    book: Book = s.deadlines
    if not book.slots and not book.since:
        return
    if book.since and run["state"] == "succeeded" and run.get("kind") != "backfill" and "backfill" not in run:
        # (a backfill's run, a cascade's in a child included, is outside the job's health,
        # notify.of_backfill: a backfill of last week's slots says nothing of today's)
        since_success(s, run["job"], now)
    rid = run["id"]
    r = book.slots.get(rid)
    if r is None or r["fin"]:
        return
    if run["state"] == "succeeded":
        at, which = _late_by(r, run, now)
        if r["state"] == "missed" or at is not None:
            r["state"] = "late"
            if at is not None:
                r["at"], r["which"] = at, which
            r["cause"] = None
            r["done_at"] = now
            _emit(s, r, rid, now, run.get("attempt"))
        else:
            r["state"] = "met"
            r["done_at"] = now
        _finalise(s, book, rid, r)
        return
    if r["state"] == "missed":
        _finalise(s, book, rid, r)  # judged when its instant passed; it ends missed
        return
    if run.get("reason") == "upstream_succeeded":
        # A handler of its parent's failure not needed (the parent succeeded): no deadline of
        # its applies, and its miss would be told at every success of the parent.
        close(s, rid)
        return
    _miss(s, book, rid, r, now, _first_unmet(r, run), cause or _cause(s, run), None)


def _first_unmet(r: Record, run: Record) -> tuple[int | None, str | None]:
    """The earliest deadline of a slot whose run ended without succeeding that the run had not
    met already: its start deadline when it started in time is met, so the record names its
    succeed_within_s or succeed_by (the on-call reads which deadline was missed: a run that
    started on the dot and timed out did not miss its start). A record with a start deadline
    only still names it: the run cannot succeed any more, and that is the slot's deadline."""
    first = _first(r)
    if first[1] != "start_within_s" or (r["within"] is None and r["by"] is None):
        return first
    started = _first_start(run)
    if started is None or first[0] is None or started > first[0]:
        return first
    rest: tuple[int | None, str | None] = (None, None)
    for t, w in ((r["within"], "succeed_within_s"), (r["by"], "succeed_by")):
        if t is not None and (rest[0] is None or t < rest[0]):
            rest = (t, w)
    return rest


def finish_range(s: SchedulerState, job: str, lo: int, hi: int, now: int) -> None:
    """A range of ``job``'s slots [lo, hi] was recorded skipped (a pipeline child's share of its
    parent's missed range), so none of them will run: each of their records is judged as the
    range's first slot's is, at once: one still pending misses now (cause ``upstream``), as any
    slot recorded skipped does, and one judged missed before the range came is final as it
    stands (told already). Before, they waited for their instants and for the range to be in the
    job's history then (a range trimmed out of it left them open for good), or for nothing (one
    judged before a deferred fan-out brought the range). A slot with a run of its own is that
    run's to judge. In slot order (every replica the same); O(the job's open records)."""
    book: Book = s.deadlines
    open_ = book.open.get(job)
    if not open_:
        return
    runs = s.runs
    for _slot, rid in sorted((slot, rid) for rid, slot in open_.items() if lo <= slot <= hi and rid not in runs):
        r = book.slots[rid]
        if r["state"] == "pending":
            _miss(s, book, rid, r, now, _first(r), "upstream", None)
        else:
            _finalise(s, book, rid, r)


def since_success(s: SchedulerState, job_name: str, now: int) -> None:
    book: Book = s.deadlines
    w = book.since.get(job_name)
    if w is not None:
        w[0], w[1] = now, False
        job = s.jobs.get(job_name)
        if job is not None and "deadline" in job["spec"] and "max_since_success_s" in job["spec"]["deadline"]:
            book.push_since(now + job["spec"]["deadline"]["max_since_success_s"] * 1000, job_name, s.jobs)


# ------------------------------------------------------------------ apply: fire and judge
def check_fire_items(items: object) -> list[list[Any]]:
    """A fire command's ``dl``: ``[[job, gen, slot, start, within, by, root?], ...]`` (``root``:
    the scheduled job whose entry carries a pipeline descendant's item). :raises
    InvalidCommand: (checked before any entry of the command applies)."""
    if not isinstance(items, list) or len(items) > limits.fire_deadline_items_max:
        raise InvalidCommand("fire.dl must be a bounded list")
    for it in items:
        if not (isinstance(it, list) and len(it) in (6, 7) and isinstance(it[0], str) and is_int(it[1])
                and is_int(it[2]) and all(v is None or is_int(v) for v in it[3:6])
                and (len(it) == 6 or isinstance(it[6], str))):
            raise InvalidCommand("fire.dl item must be [job, gen, slot, start, within, by, root?]")
    return items


def on_fire(s: SchedulerState, items: list[list[Any]], stale: set[str], fired_at: int, now: int,
            ranges: dict[str, list[Any]], made: dict[str, Record] | None = None) -> None:
    """Track the deadlines of the slots a fire command handled (its jobs not in ``stale``): each
    item's slot is a run or record this command made (its ``fired_at``), or a slot inside a
    range it recorded (``ranges``: job -> the records of its entry). A slot recorded skipped or
    coalesced misses at once (``skipped``, or ``paused``), each on its own. ``made``: the runs and
    records the command made by its general path, by id: one its own adds trimmed already is
    still judged."""
    for it in items:
        name, gen, slot, start, within, by = it[:6]
        job = s.jobs.get(name)
        if job is None or job["gen"] != gen or name in stale or "deadline" not in job["spec"] \
                or (len(it) == 7 and it[6] in stale):
            continue
        run = s.runs.get(f"{name}@{slot}")
        if run is None and made:
            run = made.get(f"{name}@{slot}")
        cause = None
        if run is None or run.get("fired_at") != fired_at:
            # (its record may be gone already: the entry's own adds trim its history)
            inside = [rc for rc in ranges.get(name, ()) if rc[2] <= slot <= rc[3]]
            if inside:
                cause = "paused" if inside[0][1] == "paused" else "skipped"
            elif "after" not in job["spec"]:
                continue
            elif run is None and pipehooks.in_range_record(s, name, slot):
                cause = "upstream"  # inside the child's range its parent's (this fire's) recorded
            # else a pipeline child's slot: tracked from this fire, its run made (or not) later
        r = _track(s, job, slot, [start, within, by], now)
        if r is None:
            continue
        if cause is not None:
            _miss(s, _book(s), f"{name}@{slot}", r, now, _first(r), cause, None)
        elif run is not None and run["state"] in ("skipped", "coalesced"):
            _miss(s, _book(s), run["id"], r, now, _first(r), _cause(s, run), None)
        elif run is not None and run["state"] in ("succeeded", "dead"):
            on_finish(s, run, now)  # a pipeline child's slot decided before this fire tracked it
    for name in dict.fromkeys(it[0] for it in items):  # (in the items' order: a set's is the hash's, per process)
        job = s.jobs.get(name)
        if job is not None and "max_since_success_s" in job["spec"].get("deadline", {}) and name not in s.deadlines.since:
            s.deadlines.since[name] = [now, False]
            s.deadlines.push_since(now + job["spec"]["deadline"]["max_since_success_s"] * 1000, name, s.jobs)


def watch_since(s: SchedulerState, job: Record, now: int) -> None:
    """A job written with ``max_since_success_s`` is watched from now (put_job); one without,
    not."""
    book = _book(s)
    name = job["name"]
    d = job["spec"].get("deadline")
    if d is None or "max_since_success_s" not in d:
        book.since.pop(name, None)
        return
    if name not in book.since:
        book.since[name] = [now, False]
    book.push_since(book.since[name][0] + d["max_since_success_s"] * 1000, name, s.jobs)


def forget_job(s: SchedulerState, name: str, now: int) -> None:
    """A deleted job is no longer watched for max_since_success_s, and its records still open are
    closed as they stand (a pending one is dropped: its slot will never be judged; a missed one
    ends missed). Judged records stay. Linear in the records, on a delete only; nothing when the
    book is empty."""
    book = _book(s)
    book.since.pop(name, None)
    if not book.slots:
        return
    for rid, r in list(book.slots.items()):  # (in the order tracked, as the book finalises them)
        if r["job"] == name:
            close(s, rid)


def reopen(s: SchedulerState, rid: str) -> None:
    """Slot ``rid`` is to run again: its dead run requeued, or, in a pipeline child, the record
    its parents' outcome made taken back by a re-arm (or the slot cut out of a range). A record
    judged missed for good because of what is taken back is open again, still missed (told
    already): a success now turns it ``late`` (told, closing what the miss opened), another end
    leaves it missed (not told again). Before, it stayed missed, and the slot's success was told
    to no one. Nothing for a record not final, or judged otherwise (met, late)."""
    book = _book(s)
    r = book.slots.get(rid)
    if r is None or not r["fin"] or r["state"] != "missed" or r["slot"] is None:
        return
    r["fin"] = False
    final = book.final
    i = len(final) - 1
    while final[i] != rid:  # (from the newest: a run requeued soon after it died is near the end)
        i -= 1
    del final[i]
    book.pending += 1
    book.open.setdefault(r["job"], {})[rid] = r["slot"]


def close(s: SchedulerState, rid: str) -> None:
    """Stop judging slot ``rid``'s record, which nothing will decide: one still pending is
    dropped (its slot is no longer the job's to run), one judged missed ends missed (told
    already). Nothing when it is final or there is none."""
    book = _book(s)
    r = book.slots.get(rid)
    if r is None or r["fin"]:
        return
    if r["state"] == "pending":
        del book.slots[rid]
        book.pending -= 1
        _unopen(book, r["job"], rid)
    else:
        _finalise(s, book, rid, r)


def judge(s: SchedulerState, book: Book, rid: str, now: int) -> bool:
    """Judge the instants of record ``rid`` that passed by ``now``. :returns: whether an
    outcome was committed."""
    r = book.slots.get(rid)
    if r is None or r["fin"]:
        return False
    if r["state"] != "pending":
        return _late_after_miss(s, r, rid, now)
    run = s.runs.get(rid)
    passed = [(t, w) for t, w in zip((r["start"], r["within"], r["by"]), WHICH)
              if t is not None and r["judged"] < t <= now]
    r["judged"] = max(r["judged"], now)
    for t, w in sorted(passed, key=lambda p: p[0]):
        if run is None:
            job = s.jobs.get(r["job"])
            if job is not None and "after" in job["spec"]:
                # a pipeline child whose parents have not decided the slot yet: missed, not final
                # (its run may still come, and succeed late); or a slot inside a range its
                # parents' outcome recorded (final)
                _miss(s, book, rid, r, now, (t, w), "upstream", t,
                      final=pipehooks.in_range_record(s, r["job"], r["slot"]))
                return True
            _miss(s, book, rid, r, now, (t, w), "skipped", t)
            return True
        if w == "start_within_s":
            job = s.jobs.get(run["job"])
            if run["state"] == "queued" and job is not None and skips_late(job["spec"]) and governed_late(run) \
                    and never_ran(run):
                # (late_start: skip) it does not start late: recorded skipped, which finalises r.
                # A lease its worker gave back unbegun is no start (never_ran).
                cause = "never_started" if run.get("attempts") else _cause(s, run)
                _miss(s, book, rid, r, now, (t, w), cause, t, final=False, withdrawn=True)
                withdraw_late(s, run, now)
                return True
            started = _first_start(run)
            if run["state"] in ("queued", "waiting") and not run.get("attempts") and run.get("started_at") is None:
                _miss(s, book, rid, r, now, (t, w), _cause(s, run), t, final=False)
                return True
            if started is not None and started > t:
                _miss(s, book, rid, r, now, (t, w), "never_started", t, final=False)
                return True
            continue
        if run["state"] == "succeeded":
            continue  # judged by on_finish
        _miss(s, book, rid, r, now, (t, w), _cause_at(s, run, t), t,
              final=run["state"] not in ("queued", "running", "waiting"))
        return True
    return False


def _late_after_miss(s: SchedulerState, r: Record, rid: str, now: int) -> bool:
    """A record judged missed by an instant before its start instant (a ``succeed_by`` earlier
    than ``start_within_s``), still open: at its start instant, a run still queued and never
    started is withdrawn all the same under ``late_start: skip`` (told as ``slot.missed``: its
    ``deadline.missed`` said the other deadline). :returns: whether it was."""
    t = r["start"]
    job = s.jobs.get(r["job"])
    if t is None or not r["judged"] < t <= now or job is None or not skips_late(job["spec"]):
        return False  # (changing nothing: a job without late_start skip is judged as ever)
    r["judged"] = max(r["judged"], now)
    run = s.runs.get(rid)
    if run is None or run["state"] != "queued" or not governed_late(run) or not never_ran(run):
        return False
    withdraw_late(s, run, now, tell=True)
    return True


def _cause_at(s: SchedulerState, run: Record, t: int) -> str:
    """Why a slot's run had not succeeded at its deadline ``t``, judged at a sweep that may come
    long after (the first after a leader's outage): a run whose first attempt started after
    ``t`` had never started then, whatever it does now (an on-call walk: a slot whose run the
    cluster, back from an outage, started 13 s past its succeed_within_s was said missed
    "still_running")."""
    started = _first_start(run)
    if started is not None and started > t:
        job = s.jobs.get(run["job"])
        return "paused" if job is not None and job["paused"] else "never_started"
    return _cause(s, run)


def due(s: SchedulerState, now: int, limit: int) -> tuple[list[str], list[str]]:
    """The leader's sweep (a read): the run ids with an instant at or before ``now``, and the
    jobs past ``max_since_success_s``, at most ``limit`` of each, popped from the index. An
    item that does not commit is judged by the next sweep anyway: the index is rebuilt from
    the records on every restore, and :func:`repush` puts the popped ones back."""
    book = _book(s)
    out: list[str] = []
    seen: set[str] = set()
    heap = book._heap
    while heap and heap[0][0] <= now and len(out) < limit:
        t, rid = heapq.heappop(heap)
        r = book.slots.get(rid)
        if r is None or rid in seen or (r["state"] != "pending" and not (
                not r["fin"] and t == r["start"] and r["judged"] < t and (job := s.jobs.get(r["job"])) is not None
                and skips_late(job["spec"]))):
            # (a record missed by an earlier instant, still open, comes back at its start instant
            # when its job withdraws late runs: judge's _late_after_miss)
            continue
        seen.add(rid)
        out.append(rid)
    jobs: list[str] = []
    sh = book._since_heap
    while sh and sh[0][0] <= now and len(jobs) < limit:
        t, name = heapq.heappop(sh)
        w = book.since.get(name)
        job = s.jobs.get(name)
        if w is None or w[1] or job is None or name in jobs:
            continue
        if not _since_ms(job) or w[0] + _since_ms(job) != t:
            continue
        jobs.append(name)
    return out, jobs


def repush(s: SchedulerState, rids: list[str], jobs: list[str]) -> None:
    """Put back what a sweep popped and could not commit."""
    book = _book(s)
    for rid in rids:
        r = book.slots.get(rid)
        if r is not None:
            _push(s, book, r, rid)
    for name in jobs:
        w = book.since.get(name)
        job = s.jobs.get(name)
        if w is not None and _since_ms(job):
            book.push_since(w[0] + _since_ms(job), name, s.jobs)


def _names(v: object, field: str) -> list[str]:
    if not isinstance(v, list) or len(v) > limits.deadline_judge_items_max or not all(isinstance(x, str) for x in v):
        raise InvalidCommand(f"deadline_judge.{field} must be a list of at most {limits.deadline_judge_items_max} names")
    return v


def _latest_come(s: SchedulerState, name: str, at: int) -> Record | None:
    """The entry of job ``name``'s own slots whose time had come by ``at`` (its slot at or
    before it), the latest slot of them (of one slot, the newest entry: a manual run's, say),
    or None. Not the newest entry of the history: runs are committed up to ~4 s before their slot
    (docs/design.md, "Firing ahead"), and a queued run of a slot still to come says nothing of why
    the window passed (it said ``never_started`` of a job whose slot had run and failed). Not a
    backfill's run either: it is outside the window (its success does not re-arm it, on_finish).
    Read from the newest entry back, at most ``_LATEST_COME_SCAN`` entries past the first that
    came (a history is in the order its entries were made, nearly the slots'), and
    ``_LATEST_COME_SCAN_MAX`` in all: a history of queued runs is not bounded by ``history``, and
    this runs in apply. The same bounds on every replica, so the same answer."""
    last: Record | None = None
    hist = s.history.get(name) or ()
    runs = s.runs
    left_after = _LATEST_COME_SCAN
    for k in range(len(hist) - 1, max(-1, len(hist) - 1 - _LATEST_COME_SCAN_MAX), -1):
        x = runs.get(hist[k])
        if last is not None:
            left_after -= 1
            if left_after < 0:
                break
        if x is None or x.get("kind") == "backfill" or "backfill" in x or x["slot"] > at:
            continue
        if last is None or x["slot"] > last["slot"]:
            last = x
    return last


#: _latest_come reads at most this many entries past the first whose slot had come, and this
#: many in all.
_LATEST_COME_SCAN = 64
_LATEST_COME_SCAN_MAX = 4096


def apply_deadline_judge(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``deadline_judge {runs, jobs}``: the leader's sweep, ``now`` the cluster's clock: judge
    the instants of these slots' records that passed by now (``runs``: run ids), and the jobs
    (``jobs``) whose last success is older than their ``max_since_success_s``. What is judged
    already, or not yet due, is left as it is (a repeated or stale sweep changes nothing).

    :raises InvalidCommand: runs or jobs not bounded lists of strings (then nothing is judged)."""
    rids, names = _names(cmd.get("runs"), "runs"), _names(cmd.get("jobs", []), "jobs")
    book = _book(s)
    judged = 0
    for rid in rids:
        judged += judge(s, book, rid, now)
    for name in names:
        w = book.since.get(name)
        job = s.jobs.get(name)
        if w is None or w[1] or job is None:
            continue
        d = job["spec"].get("deadline") or {}
        if "max_since_success_s" not in d or w[0] + d["max_since_success_s"] * 1000 > now:
            continue
        w[1] = True
        at = w[0] + d["max_since_success_s"] * 1000
        last = _latest_come(s, name, at)
        if job["paused"]:
            cause = "paused"
        elif last is None or last["state"] == "succeeded":
            # No slot has fallen due since the last success (or since the job was written): its
            # schedule's slots are further apart than the window, or its next is still to come.
            # (The older code said never_started, or skipped: neither had happened.)
            cause = "no_slot"
        else:
            cause = _cause(s, last)
        # Told while the job is paused too (events.route): a pause forgotten is what it is for.
        events.emit(s, "deadline.missed", now, job=name, tenant=job["spec"]["tenant"], slot=None, run_id=None,
                    reason=cause, deadline="max_since_success_s", instant=at, cause=cause, since=w[0],
                    while_paused=True)
        s.stats.on_deadline("missed", "max_since_success_s", cause)
        rid = f"{name}#since@{at}"
        book.slots[rid] = {"job": name, "tenant": job["spec"]["tenant"], "slot": None, "start": None,
                           "within": None, "by": None, "state": "missed", "which": "max_since_success_s",
                           "cause": cause, "at": at, "judged": now, "done_at": now, "fin": False}
        book.pending += 1
        _finalise(s, book, rid, book.slots[rid])
        judged += 1
    return ok(judged=judged)


# ------------------------------------------------------------------ heartbeat jobs: pings
PING_STATUSES = ("start", "success", "fail")
#: How long before its slot a ping without a slot may be that slot's (the reporter's clock is not
#: the cluster's). What firing ahead commits was 2 s before limits.fire_ahead_span_ms grew to 3 s
#: (runs now exist up to 4 s ahead); the ping's window stayed 2 s, so no ping decides otherwise.
PING_AHEAD_MS = 2000


def ping_target(s: SchedulerState, name: str, status: str, now: int) -> tuple[int | None, bool]:
    """The slot a ping without one is for, as the node resolves it before it proposes the ping
    with that slot (node/service.py), and whether to wait for it first. A ping up to
    PING_AHEAD_MS before a slot is that slot's: when the slot is not committed yet (only the
    second to fourth slots of an entry are committed more than fire_ahead_ms ahead), wait
    (``(None, True)``); when it is, it wins over an older slot still open (a slot nothing
    pinged, which the ping would otherwise have been counted for: judged late, and the slot that
    ran missed). An end goes to a run that started (running) before one still waiting, as in
    apply_ping. Else the slot at hand: the first of the job's slots within PING_AHEAD_MS still to
    come, else the newest that came, whatever their state: apply_ping answers 409 for one that
    ended (a ping sent twice, a retried request), where apply_ping's rule would take the newest
    still waiting, an older slot nothing pinged (judged late, its miss undone). ``(None,
    False)``: none; apply_ping answers why. A read only: apply_ping's own rule for a ping
    without a slot, which nodes of older versions propose, is unchanged."""
    job = s.jobs.get(name)
    if job is None or job["spec"]["executor"]["type"] != "heartbeat":
        return None, False
    ahead = now + PING_AHEAD_MS
    nxt = job.get("next")
    hist = s.history.get(name) or []
    for st in (("waiting",) if status == "start" else ("running", "waiting")):
        if st == "waiting" and nxt is not None and now < nxt <= ahead and f"{name}@{nxt}" not in s.runs \
                and not job["paused"]:
            return None, True  # (an end goes to a run that started first, whatever comes)
        came = coming = None
        for rid in reversed(hist):  # newest first
            cand = s.runs[rid]
            if st == "running" and (cand["state"] != st or cand.get("due", 0) is None):
                continue
            # (else the slot at hand whatever its state: a ping sent twice meets the slot the first
            # ended, 409, not an older slot nothing pinged; one held by the pause, due None, is
            # sent by its slot, and apply says the job is paused)
            if cand["slot"] <= now:
                came = cand
                break
            if cand["slot"] <= ahead:
                coming = cand  # the first still to come, in the end
        pick = coming or came
        if pick is not None:
            if pick["state"] not in ("waiting", "running"):
                # The slot at hand ended (a ping sent twice): refused here, as apply refuses it, the
                # more so for a slot opened by hand, which apply's own rule would pass over for an
                # older slot nothing pinged.
                raise Conflict(f"run {pick['id']} ended already ({pick['state']})", field="slot")
            if pick["id"] == f"{name}@{pick['slot']}" or pick["state"] == "running":
                # (a start sent twice to a slot opened by hand, NAME@SLOT!manual-N: apply finds it
                # by its slot since 2026-12-06, docs/operations.md, and answers as for any start)
                return pick["slot"], False
            # A slot opened by hand and still waiting: apply's own rule, without a slot, takes it
            # (older replicas' apply_ping did not find it by its slot).
            return None, False
    return None, False


def apply_ping(s: SchedulerState, cmd: Command, now: int,
               told: tuple[Callable[..., None], Callable[..., None]] | None = None) -> Result:
    """``ping {name, status, slot?}``: what something outside reports about a heartbeat job's
    slot: ``start`` (its run is running), ``success`` or ``fail`` (it ended). Without ``slot``,
    the newest of the job's runs a ping can still move (a start: one waiting; an end: one running,
    else one waiting) whose slot came, else the first one due within PING_AHEAD_MS (committed
    ahead). A run that ended is not changed again.

    :raises NotFound: no such job, or no run for that slot. :raises Conflict: not a heartbeat job,
        or no run a ping can move. :raises InvalidCommand: a bad status or slot."""
    name, status, slot = cmd.get("name"), cmd.get("status"), cmd.get("slot")
    if not isinstance(name, str) or status not in PING_STATUSES or (slot is not None and not is_int(slot)):
        raise InvalidCommand("ping needs name, status (start, success or fail) and an integer slot or nil")
    job = s.jobs.get(name)
    if job is None:
        raise NotFound(f"no job {name!r}", field="name")
    if job["spec"]["executor"]["type"] != "heartbeat":
        raise Conflict(f"job {name} is not a heartbeat job (its executor is {job['spec']['executor']['type']})",
                       field="name")
    run: Record | None = None
    if slot is not None:
        run = s.runs.get(f"{name}@{slot}")
        if run is None:
            # A slot opened by hand (a trigger without a body) is the run NAME@SLOT!manual-N: the
            # newest of the job's runs of that slot a ping can still move.
            hist = s.history.get(name) or []
            run = next((s.runs[rid] for rid in reversed(hist)
                        if s.runs[rid]["slot"] == slot and s.runs[rid]["state"] in ("waiting", "running")), None)
        if run is None:
            raise NotFound(f"job {name} has no run for slot {slot} (ms since the epoch)", field="slot")
    else:
        hist = s.history.get(name) or []
        want = ("waiting",) if status == "start" else ("running", "waiting")
        # A slot is committed ahead of it (firing ahead), and the reporter's clock is not the
        # cluster's: a ping up to PING_AHEAD_MS early is the coming slot's when no slot that came
        # is open.
        ahead = now + PING_AHEAD_MS
        for st in want:
            for rid in reversed(hist):
                cand = s.runs[rid]
                if cand["state"] == st and cand["slot"] <= ahead and cand.get("due", 0) is not None:
                    run = cand  # newest first: the newest that came, else the first still to come
                    if cand["slot"] <= now:
                        break
            if run is not None:
                break
        if run is None:
            # (the text is kept as the older code's: apply's answers are part of the replicated
            # state, its request log, and a slot fired more than PING_AHEAD_MS ahead also lands here)
            raise Conflict(f"job {name} has no run waiting for a {status} ping (its next slot has not fired)",
                           field="slot")
    if run["state"] not in ("waiting", "running"):
        raise Conflict(f"run {run['id']} ended already ({run['state']})", field="slot")
    if run["state"] == "waiting" and run.get("due", 0) is None:  # held by the pause (notify.pause)
        raise Conflict(f"job {name} is paused: its run {run['id']} waits for the resume", field="name")
    if status == "start":
        if run["state"] == "waiting":
            run["state"] = "running"
            run["started_at"] = now
        return ok(run=run["id"], state=run["state"])
    if run["started_at"] is None:
        run["started_at"] = now
    run["finished_at"] = now
    error = None if status == "success" else "a fail ping"
    if run["id"] in s._running_ids:
        # A worker's lease from before the job became a heartbeat job: it ends with the run.
        end_lease(s, run, now, status == "success", error)
    else:
        run["attempts"] = [{"attempt": 1, "token": None, "worker": None, "started_at": run["started_at"],
                            "finished_at": now, "ok": status == "success", "error": error}]
    if status == "success":
        run["state"] = "succeeded"
    else:
        run["state"] = "failed"
        run["error"] = "a fail ping"
    s.stats.on_finished(run["state"])  # raftsched_runs_finished_total counts a pinged end too
    on_finish(s, run, now)
    # The job's health and events, as a run's outcome makes them (``told``: notify's on_success
    # and on_dead; notify.apply_ping, which state.py applies, passes them: notify imports this
    # module): a success (its health, an incident closed: job.recovered, run.succeeded opt-in),
    # a fail the run's death (nothing retries it: consecutive_failures, an incident told as
    # run.dead, pause_on_failure).
    if told is not None:
        if status == "success":
            told[0](s, run, now)
        else:
            told[1](s, run, now, "a fail ping")
    if name in s.pipes.children:  # a final outcome: its children follow (pipelines)
        pipehooks.notify(s, run, now)
    return ok(run=run["id"], state=run["state"])


def end_lease(s: SchedulerState, run: Record, now: int, ok_: bool, error: str | None) -> None:
    """End a worker's lease on ``run`` (in ``_running_ids``) because the scheduler ended the run
    (a heartbeat job's rule, an overlap replace: fire.revoke), so the lease indexes hold what a
    restore rebuilds from the runs, and the reaper never meets a run that is gone. Its attempt
    is kept; one that ends failed is marked ``killed`` (its worker is told, and kills it), and
    the run's ``output`` (an earlier attempt's) is cleared: the killed attempt's output is kept
    when its worker reports it (core/leases.py ``killed_output``)."""
    q = run["queue"]
    s._running_count[q] = s._running_count.get(q, 1) - 1
    s._running_ids.pop(run["id"], None)
    record = {"attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
              "started_at": run["started_at"], "finished_at": now, "ok": ok_, "error": error}
    if not ok_:
        record["killed"] = True
        run["output"] = None
    kept_attempts(run).append(record)
    run["deadline"] = None


def close_heartbeats(s: SchedulerState, job: Record, now: int, recorded: Callable[..., None],
                     keep: int = limits.heartbeat_open_max,
                     why: str = "no success or fail ping before the job's later runs closed it") -> None:
    """A heartbeat job keeps at most ``limits.heartbeat_open_max`` runs open (waiting for a ping,
    or started and not ended): past it, at its next fire, the oldest are closed: a waiting one as
    skipped (reason ``not_pinged``: counted and told as any slot recorded skipped, through
    ``recorded``, notify.on_slot_recorded, which imports this module; the job's health is left
    as it is: its pings make it, apply_ping), a started one as failed,
    each judged as it closes. With
    ``keep`` 0 (the job is no longer a heartbeat job: jobs.put_job), every one a ping waits for
    is closed, but a run a worker holds (leased before the job became a heartbeat job), which
    its worker ends as any run."""
    hist = s.history.get(job["name"]) or []
    open_ids = [rid for rid in hist if s.runs[rid]["state"] in ("waiting", "running")
                and (keep or rid not in s._running_ids)]
    for rid in open_ids[:max(0, len(open_ids) - keep)]:
        run = s.runs[rid]
        run["finished_at"] = now
        if run["state"] == "waiting":
            run.update(state="skipped", reason="not_pinged")
            s.stats.on_recorded("skipped", "not_pinged")
            recorded(s, run, now, health=False)
            on_finish(s, run, now, "never_started")
        else:
            if rid in s._running_ids:
                end_lease(s, run, now, False, why)
            run.update(state="failed", error=why)
            s.stats.on_finished("failed")
            on_finish(s, run, now, "still_running")
        if job["name"] in s.pipes.children:
            pipehooks.notify(s, run, now)


# ------------------------------------------------------------------ reads
def slot_view(s: SchedulerState, rid: str) -> Record | None:
    """A run's ``deadline`` block (plain data, ms), or None when its slot has no deadline."""
    r = _book(s).slots.get(rid)
    return None if r is None else _view(s, rid, r, {})


def slot_views(s: SchedulerState, rids: list[str]) -> dict[str, Record]:
    """The ``deadline`` blocks of these runs that have one (nothing to look at when no job has a
    deadline)."""
    slots = _book(s).slots
    if not slots:
        return {}
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    return {rid: _view(s, rid, slots[rid], ranges) for rid in rids if rid in slots}


#: The reasons a pipeline child's slot is recorded with when its parents decided it will not run.
_UPSTREAM_REASONS = ("upstream_failed", "upstream_missed", "upstream_timeout", "dependency_missing",
                     "upstream_succeeded")


def _view(s: SchedulerState, rid: str, r: Record, ranges: dict[str, list[tuple[int, int, str]]]) -> Record:
    out = {"run_id": None if r["slot"] is None else rid, "job": r["job"], "tenant": r["tenant"],
           "slot": r["slot"], "state": r["state"], "deadline": r["which"], "cause": r["cause"],
           "instant": r["at"], "judged_at": r["done_at"],
           "instants": {"start_within_s": r["start"], "succeed_within_s": r["within"], "succeed_by": r["by"]}}
    if r["cause"] == "upstream" and r["slot"] is not None:
        said = _parents_said(s, r["job"], rid, r["slot"], ranges)
        if said != "undecided" or not r["fin"]:
            # (a final record whose slot holds nothing now: its record trimmed from the child's
            # history; which it was is not known any more)
            out[PARENTS_KEY] = said
    return out


#: The key of a view of a record missed with cause ``upstream`` that says what its parents had
#: done (:func:`_parents_said`) for :func:`explain`; node/views.py deadline_view takes it out.
PARENTS_KEY = "_parents"


def _parents_said(s: SchedulerState, job: str, rid: str, slot: int,
                  ranges: dict[str, list[tuple[int, int, str]]]) -> str:
    """What a pipeline child's slot, missed with cause ``upstream``, holds now: ``"decided:REASON"``
    (its parents' outcome recorded it: the slot's record, or a recorded range of the child's
    history that covers it), ``"ran"`` (a run of its own came after the miss: the parents had
    not decided it then, and let it run since), ``"late"`` (they decided it after its start
    deadline, which ``late_start: skip`` recorded: no run), or ``"undecided"`` (none of these: its parents
    have not decided it yet). A read; O(the child's history) for the first slot of a job without
    a run, its ranges kept in ``ranges`` (job -> [(lo, hi, reason)]) for the others of a listing."""
    run = s.runs.get(rid)
    if run is not None:
        if run.get("reason") in _UPSTREAM_REASONS:
            return f"decided:{run['reason']}"
        if run.get("reason") == "late_start":
            return "late"
        return "ran"
    got = ranges.get(job)
    if got is None:
        got = ranges[job] = [(x["slot"], x["slot_to"], x["reason"]) for hid in s.history.get(job) or ()
                             if (x := s.runs.get(hid)) is not None and "slot_to" in x
                             and x.get("reason") in _UPSTREAM_REASONS]
    for lo, hi, reason in got:
        if lo <= slot <= hi:
            return f"decided:{reason}"
    return "undecided"


def _upstream_text(parents: str | None) -> str:
    """Why a pipeline child's slot missed with cause ``upstream``: its parents had not decided the
    slot when its instant passed, or decided it would not run; ``parents`` (:func:`_parents_said`)
    says which, where known."""
    if parents is not None and parents.startswith("decided:"):
        reason = parents.partition(":")[2] or "upstream_* or dependency_missing"
        return f"its parents decided it would not run (its slot was recorded {reason} by their outcome)"
    if parents == "undecided":
        return ("its parents had not decided the slot yet (a parent still running, waiting for a retry, or "
                "not yet fired); not final: a run that still succeeds makes it late")
    if parents == "ran":
        return ("its parents had not decided the slot yet when the instant passed (they let it run "
                "afterwards)")
    if parents == "late":
        return ("its parents had not decided the slot yet when the instant passed, and decided it after its "
                "start deadline: recorded skipped, late_start (deadline.late_start: skip), it never ran")
    return ("either its parents decided it would not run (its slot recorded upstream_* or dependency_missing), "
            "or they had not decided the slot yet when the instant passed (a parent still running or retrying)")


def listing(s: SchedulerState, state: str | None, job: str | None, since: int | None, tenants: Any,
            limit: int) -> list[Record]:
    """Deadline records, newest first: filtered by outcome, job, slot (or judgement) at or after
    ``since``, and the tenants a token may see (None: all)."""
    out: list[Record] = []
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for rid, r in reversed(_book(s).slots.items()):
        if state is not None and r["state"] != state:
            continue
        if job is not None and r["job"] != job:
            continue
        if tenants is not None and r["tenant"] not in tenants:
            continue
        when = r["slot"] if r["slot"] is not None else r["at"]
        if since is not None and (when is None or when < since):
            continue
        out.append(_view(s, rid, r, ranges))
        if len(out) >= limit:
            break
    return out


def explain(r: Record | None) -> str | None:
    """Why a slot met or missed its deadline, in a sentence."""
    if r is None:
        return None
    which = {"start_within_s": "start deadline", "succeed_within_s": "succeed_within_s deadline",
             "succeed_by": "succeed_by deadline", "max_since_success_s": "max_since_success_s deadline"}
    at = schedule.iso(r["instant"]) if r.get("instant") is not None else None
    if r["state"] == "pending":
        return "its deadlines have not passed yet"
    if r["state"] == "met":
        return "it met its deadlines"
    if r["state"] == "late":
        done, instant = r.get("judged_at"), r.get("instant")
        if done is not None and instant is not None and done <= instant:
            # judged missed at once (its run had died, or its parents had decided it would not
            # run), then run again (a requeue, a re-arm) and succeeded in time
            return (f"it succeeded before its {which.get(r['deadline'] or '', 'deadline')} ({at}), once run "
                    f"again, after it had been judged missed when its run could not succeed any more")
        return f"it succeeded after its {which.get(r['deadline'] or '', 'deadline')} ({at})"
    causes = {"never_started": "its run had not started", "still_running": "its run was still running",
              "failed": "its run had failed (dead, or waiting for a retry)",
              "skipped": "the slot was recorded skipped or coalesced, so no run was made for it",
              "paused": "the job was paused", "untracked": "more deadlines were pending than the cluster keeps",
              "upstream": _upstream_text(r.get(PARENTS_KEY)),
              "no_slot": "no slot of the job fell due since its last success (its schedule's slots are further "
                         "apart than max_since_success_s, or its next is still to come)"}
    judged, instant = r.get("judged_at"), r.get("instant")
    if r["cause"] in ("skipped", "upstream") and judged is not None and instant is not None and judged < instant:
        # (a child's slot is judged before its instant only when its parents decided it: one
        # they have not decided yet is judged when the instant passes)
        why = causes["skipped"] if r["cause"] == "skipped" else _upstream_text(r.get(PARENTS_KEY) or "decided:")
        return (f"it can no longer meet its {which.get(r['deadline'] or '', 'deadline')} ({at}), which had not come "
                f"yet: {why}; a slot that will have no run misses at once")
    if r["cause"] in ("failed", "still_running") and judged is not None and instant is not None and judged < instant:
        # Judged when its run ended for good, before the instant: the slot cannot succeed any
        # more (the record names the first deadline the run had not met: _first_unmet).
        how = (causes["failed"] if r["cause"] == "failed"
               else "it had started, and was closed before it ended (its job replaced, or a heartbeat job's later runs)")
        return (f"its run ended without succeeding, before its {which.get(r['deadline'] or '', 'deadline')} "
                f"({at}) came: {how}; a slot whose run cannot succeed any more misses at once")
    return (f"it missed its {which.get(r['deadline'] or '', 'deadline')} ({at}): "
            f"{causes.get(r['cause'] or '', r['cause'])}")


# ------------------------------------------------------------------ snapshot section
_REC = ("job", "tenant", "slot", "start", "within", "by", "state", "which", "cause", "at", "judged", "done_at", "fin")


def _encode(book: Book) -> list[Any] | None:
    if not book.slots and not book.since:
        return None
    return [[[rid] + [r[f] for f in _REC] for rid, r in book.slots.items()], list(book.final),
            [[k, v[0], v[1]] for k, v in book.since.items()]]


def _decode(data: list[Any]) -> Book:
    book = Book()
    for row in data[0]:
        book.slots[row[0]] = dict(zip(_REC, row[1:]))
    book.final.extend(data[1])
    book.pending = len(book.slots) - len(book.final)
    book.since = {row[0]: [row[1], row[2]] for row in data[2]}
    return book


def _rebuild(s: SchedulerState) -> None:
    _book(s).rebuild(s.jobs)


EXTENSION = snapshot.register(snapshot.Extension(name="deadlines", new=Book, encode=_encode, decode=_decode,
                                                 rebuild=_rebuild))


def judge_late_given_back(s: SchedulerState, rid: str, now: int) -> bool:
    """A run given back unstarted by its worker at or past its start instant, under
    ``late_start: skip`` (core/workers.py apply_release): its record, still pending (the lease
    counted as a start when the sweep looked), is judged missed, ``never_started``, withdrawn,
    before the run is. :returns: whether that was told (else the withdrawal is: a record judged
    missed already, or none)."""
    book = _book(s)
    r = book.slots.get(rid)
    if r is not None and not r["fin"] and r["state"] == "pending" and r["start"] is not None:
        _miss(s, book, rid, r, now, (r["start"], "start_within_s"), "never_started", r["start"], final=False,
              withdrawn=True)
        return True
    return False
