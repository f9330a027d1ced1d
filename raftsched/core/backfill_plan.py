"""What a backfill or a bulk dead-letter operation does next: the decisions apply makes and the
proposer predicts (docs/backfill.md).

Pure functions over the state, shared by both sides so that they cannot disagree: apply
(core/backfills.py) walks the slots (or dead runs) a step command carries and decides each one
with :class:`BackfillWalk` (:class:`BulkWalk`); the leader's stepper (node/backfills.py) walks the
same candidates over its own replica to decide what to propose, and the dry run walks every slot
of the range without a budget. None of this evaluates cron (I4): slots come from the proposer.

Also here, the reads of backfills the node makes (``views``, ``view``, ``stepper_views``,
``dry_run_backfill``, ``dead_matching``): plain data, copies of the state's records.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import limits, pipelines
from .fire import active_runs
from .model import REAL_STATES, TERMINAL_STATES
from .records import RUNS, Record

if TYPE_CHECKING:
    from .state import SchedulerState

#: Micro-tokens in one token (tenants.py's unit).
MICRO = 1_000_000
KINDS = ("backfill", "requeue", "purge")
MODES = ("missing", "failed", "all")
ORDERS = ("oldest", "newest")
OVERLAPS = ("allow", "forbid")
#: A backfill's runs still active (queued or running: what its max_concurrent counts).
ACTIVE_STATES = frozenset({"queued", "running"})
#: A backfill's states. running and paused are active; done and cancelled are finished.
STATES = ("running", "paused", "done", "cancelled")
FINISHED = frozenset({"done", "cancelled"})
#: Outcomes of a backfill's runs once they left the queue for good (progress counts them).
OUTCOMES = ("succeeded", "failed", "dead", "skipped")


# ------------------------------------------------------------------ token bucket
def bucket_new(rate_milli: int | None, now: int) -> Record | None:
    """A rate's bucket, starting with one token: the first run at once, then one every 1/rate s.
    Its size is one second of the rate (at least one token), so a stepper that looks every
    100 ms can keep up with any rate; None for no rate."""
    if rate_milli is None:
        return None
    return {"rate_milli": rate_milli, "burst": max(1, -(-rate_milli // 1000)), "tokens_micro": MICRO,
            "last_ms": now}


def bucket_micro(b: Record, now: int) -> int:
    """The bucket's micro-tokens at ``now`` (refilled, not changed): tenants.py's arithmetic."""
    elapsed = max(0, now - b["last_ms"])
    micro: int = min(b["burst"] * MICRO, b["tokens_micro"] + elapsed * b["rate_milli"])
    return micro


def bucket_take(b: Record | None, now: int, n: int) -> None:
    """Refill the bucket to ``now`` and take ``n`` tokens (apply only, after a walk allowed them)."""
    if b is None:
        return
    b["tokens_micro"] = bucket_micro(b, now) - n * MICRO
    b["last_ms"] = max(b["last_ms"], now)


def tokens(b: Record | None, now: int) -> int | None:
    """Whole tokens available at ``now``; None: no rate."""
    return None if b is None else bucket_micro(b, now) // MICRO


# ------------------------------------------------------------------ the history of a job's slots
def latest_by_slot(s: SchedulerState, job_name: str, lo: int | None = None, hi: int | None = None) -> dict[int, str]:
    """slot -> the state of the slot's latest run (the last added to the job's history) among
    the runs that ran or will run (REAL_STATES), whatever their kind (scheduled, manual,
    backfill); records and runs that never ran (skipped, coalesced) do not count. Only slots in
    ``[lo, hi)`` when given."""
    out: dict[int, str] = {}
    runs = s.runs
    for rid in s.history.get(job_name, ()):
        r = runs[rid]
        if r["kind"] == "recorded" or r["state"] not in REAL_STATES:
            continue
        slot = r["slot"]
        if (lo is None or slot >= lo) and (hi is None or slot < hi):
            out[slot] = r["state"]
    return out


def history_horizon(s: SchedulerState, job: Record) -> int | None:
    """The slot before which the job's history may have forgotten runs, or None when it has
    forgotten nothing. A history that holds its bound (``spec.history``) may have been trimmed:
    its oldest finished entries went first, so the oldest scheduled or recorded entry it still
    holds (their order is the slots' order) is where its knowledge starts. With none, nothing
    before the job's cursor is known. A history below its bound was trimmed too when it holds
    fewer scheduled runs than the job ever fired (its stats): a bound raised since, or a dead
    run purged from the dead-letter queue after trims."""
    hist = s.history.get(job["name"], ())
    runs = s.runs
    if len(hist) < job["spec"]["history"] \
            and job["stats"][RUNS] <= sum(1 for rid in hist if runs[rid]["kind"] == "scheduled"):
        return None
    oldest: int | None = None
    for rid in hist:
        r = runs[rid]
        if r["kind"] in ("scheduled", "recorded") and r["state"] in TERMINAL_STATES and r["state"] != "dead":
            if oldest is None or r["slot"] < oldest:
                oldest = r["slot"]
    horizon: int = job["cursor"] + 1 if oldest is None else oldest
    return horizon


def history_snapshot(s: SchedulerState, job: Record, lo: int, hi: int) -> tuple[list[list[Any]], int | None]:
    """What a backfill of ``[lo, hi)`` remembers of the job's history when it is created:
    ``([[slot, latest state], ...] ascending, horizon)``. Runs trimmed from the history later
    (the backfill's own runs push old entries out) are still known to it, so a backfill never
    takes a slot for missing because its run was forgotten meanwhile."""
    latest = latest_by_slot(s, job["name"], lo, hi)
    return [[slot, latest[slot]] for slot in sorted(latest)], history_horizon(s, job)


def verdict(mode: str, slot: int, latest: str | None, horizon: int | None, job_cursor: int) -> str | None:
    """Whether a backfill in ``mode`` runs ``slot`` (None) or leaves it out, and why.

    - ``not_yet_due``: after the job's cursor (when the backfill was made), the schedule had not
      handled the slot yet (its scheduled run was still to come; a paused job's cursor waits for
      its resume).
    - ``missing`` leaves out every slot that has a run (the reason is the latest run's state:
      ``succeeded``, ``failed``, ``dead``, ``queued``, ``running``); ``failed`` leaves out those
      whose latest run is ``succeeded``, ``queued`` or ``running``; ``all`` runs every slot.
    - ``beyond_history``: (missing, failed) no run is known, but the slot is older than what the
      job's history still holds, so raftsched cannot tell whether it ran.
    """
    if slot > job_cursor:
        return "not_yet_due"
    if mode == "all":
        return None
    if latest is None:
        return "beyond_history" if horizon is not None and slot < horizon else None
    if mode == "missing" or latest not in ("failed", "dead"):
        return latest
    return None


def run_id_for(s: SchedulerState, job_name: str, slot: int, bf_id: str) -> str | None:
    """The id of a backfilled slot's run: ``job@slot`` (the id its scheduled run would have had)
    when no entry has it, else ``job@slot#b<backfill>``; None when both are taken (a backfill id
    used again after the first was forgotten)."""
    base = f"{job_name}@{slot}"
    if base not in s.runs:
        return base
    alt = f"{base}#b{bf_id}"
    return alt if alt not in s.runs else None


def live_active(s: SchedulerState, rids: Iterable[str]) -> int:
    """How many of ``rids`` are queued or running now."""
    runs = s.runs
    n = 0
    for rid in rids:
        r = runs.get(rid)
        if r is not None and r["state"] in ACTIVE_STATES:
            n += 1
    return n


def queue_room(s: SchedulerState, qname: str) -> tuple[int, int]:
    """``(depth, max_depth)`` of a queue."""
    q = s.queues.get(qname)
    return s._queue_depth.get(qname, 0), (limits.queue_depth_default if q is None else q["max_depth"])


def job_of(s: SchedulerState, bf: Record) -> Record | None:
    """The job a backfill runs, if it is still the one it was created for (not deleted, nor
    deleted and created again under the same name)."""
    job = s.jobs.get(bf["job"])
    if job is None or job["created"] != bf["plan"]["job_created"] or bf.get("job_gone"):
        return None  # (job_gone: deleted, in case it was put again within the same millisecond)
    return job


# ------------------------------------------------------------------ walks
class BackfillWalk:
    """One step's decisions, slot by slot, over the state as it is (nothing is changed here):
    ``next(slot)`` says ``("left", reason)``, ``("run", run_id)`` or ``("stop", why)``, and
    after a run is made (or, by the proposer, assumed) ``took()`` spends its budget. Apply and
    the stepper walk the same slots with the same budget: max_concurrent (the backfill's runs
    queued or running), the rate's tokens at ``now``, the overlap rule, the job queue's room and
    the runs one step may create."""

    #: slot -> the latest state of its run when the backfill was made (plan["known"]); set with
    #: _live on the first next()
    _known: dict[int, str]

    def __init__(self, s: SchedulerState, bf: Record, job: Record, now: int) -> None:
        req, plan = bf["req"], bf["plan"]
        self.s = s
        self.bf_id = bf["id"]
        self.job_name = job["name"]
        self.mode = req["reprocess"]
        self._plan = plan
        # the slots' latest states, read on the first next(): stop_reason needs none
        self._live: dict[int, str] | None = None
        self.horizon = plan["horizon"]
        # Not the job's cursor now: its cursor when the backfill was made (a cursor only moves
        # on), so a slot left out as not yet due then is left out for good, as the dry run said.
        self.job_cursor = plan["job_cursor"]
        self.room = req["max_concurrent"] - live_active(s, bf["active"])
        self.tokens = tokens(bf["bucket"], now)
        self.forbid = req["overlap"] == "forbid"
        self.busy = self.forbid and bool(active_runs(s, job))
        self.queue = job["spec"]["queue"]
        self.depth, self.max_depth = queue_room(s, self.queue)
        self.runs_left = limits.backfill_step_runs_max

    def stop_reason(self) -> str | None:
        """Why no run can be made now (None: one can)."""
        if self.runs_left <= 0:
            return "step"
        if self.room <= 0:
            return "max_concurrent"
        if self.tokens is not None and self.tokens <= 0:
            return "rate"
        if self.busy:
            return "overlap"
        if self.depth >= self.max_depth:
            return "queue_full"
        return None

    def next(self, slot: int) -> tuple[str, str]:
        if self._live is None:
            if self.mode == "all":
                self._live, self._known = {}, {}
            else:
                self._live = latest_by_slot(self.s, self.job_name)
                self._known = {x: st for x, st in self._plan["known"]}
        latest = self._live.get(slot)
        if latest is None:
            latest = self._known.get(slot)
        why = verdict(self.mode, slot, latest, self.horizon, self.job_cursor)
        if why is not None:
            return "left", why
        stop = self.stop_reason()
        if stop is not None:
            return "stop", stop
        rid = run_id_for(self.s, self.job_name, slot, self.bf_id)
        if rid is None:
            return "left", "exists"
        return "run", rid

    def may_release(self) -> bool:
        """Whether one more held child may be queued (a cascade: backfills.py): the runs one step
        makes, max_concurrent and the rate (the parent job's overlap and queue are not its)."""
        return self.runs_left > 0 and self.room > 0 and (self.tokens is None or self.tokens > 0)

    def took_child(self, n: int) -> None:
        self.runs_left -= n
        self.room -= n
        if self.tokens is not None:
            self.tokens -= n

    def took(self) -> None:
        self.runs_left -= 1
        self.room -= 1
        if self.tokens is not None:
            self.tokens -= 1
        self.busy = self.busy or self.forbid  # the run just made is one of the job's
        self.depth += 1


def dead_key(run: Record) -> list[Any]:
    """A dead run's place in its DLQ: ``[finished_at, id]`` (queues.py's order)."""
    return [run["finished_at"], run["id"]]


def matches(run: Record, f: dict[str, Any]) -> bool:
    """Whether a dead run matches a bulk operation's filters (``queue``, ``job``, ``error``
    substring, ``dead_from`` <= finished_at <= ``dead_to``; None: any)."""
    if f["queue"] is not None and run["queue"] != f["queue"]:
        return False
    if f["job"] is not None and run["job"] != f["job"]:
        return False
    if f["error"] is not None and f["error"] not in (run.get("error") or ""):
        return False
    fin: int = run["finished_at"]
    if f["dead_from"] is not None and fin < f["dead_from"]:
        return False
    dead_to: int = f["dead_to"]
    return fin <= dead_to


def dead_matching(s: SchedulerState, f: dict[str, Any], after: list[Any] | None = None,
                  limit: int | None = None) -> list[list[Any]]:
    """The keys ``[finished_at, id]`` of the dead runs matching filters ``f``, after ``after``,
    ascending, at most ``limit``: a merge of the matching queues' DLQ indexes (each is in key
    order already)."""
    runs = s.runs
    names = [f["queue"]] if f["queue"] is not None else sorted(s._dead)

    def keys(q: str) -> Iterator[tuple[int, str]]:
        for rid in s._dead.get(q, ()):
            r = runs.get(rid)
            if r is not None and r["state"] == "dead" and r["queue"] == q:
                yield (r["finished_at"], rid)

    out = []
    for fin, rid in heapq.merge(*(keys(q) for q in names)):
        if after is not None and [fin, rid] <= after:
            continue
        if fin > f["dead_to"]:
            break
        if matches(runs[rid], f):
            out.append([fin, rid])
            if limit is not None and len(out) >= limit:
                break
    return out


def requeue_left_out(s: SchedulerState, run: Record, succeeded: dict[str, set[int]]) -> str | None:
    """Why a bulk requeue leaves dead run ``run`` out whatever its pace (None: it takes it): its
    job deleted (``no_job``), a heartbeat job now (``heartbeat_job``: no worker would run it), or
    its slot run again and succeeded since (``slot_succeeded``: a backfill with reprocess, a run
    by hand of the slot; requeued, the dead run would run it a third time). ``succeeded``: the
    slots of a job that a run in its history succeeded, filled as jobs are read (a step's, a
    dry run's)."""
    name = run["job"]
    job = s.jobs.get(name)
    if job is None:
        return "no_job"
    if job["spec"]["executor"]["type"] == "heartbeat":
        return "heartbeat_job"
    got = succeeded.get(name)
    if got is None:
        # A job with children counts only a success its children followed (a scheduled run's, a
        # backfill's with cascade, one by hand with propagate): the dead run's requeue is what
        # re-arms the children it left upstream_failed.
        runs, kids = s.runs, name in s.pipes.children
        got = succeeded[name] = {r["slot"] for rid in s.history.get(name, ())
                                 if (r := runs.get(rid)) is not None and r["state"] == "succeeded"
                                 and (not kids or pipelines.propagates(r))}
    return "slot_succeeded" if run["slot"] in got else None


def dry_run_requeue(s: SchedulerState, keys: list[list[Any]]) -> tuple[list[list[Any]], dict[str, int]]:
    """Of the dead runs ``keys`` (dead_matching's), those a bulk requeue would take, and how many
    it would leave out by reason (requeue_left_out)."""
    kept: list[list[Any]] = []
    left: dict[str, int] = {}
    succeeded: dict[str, set[int]] = {}
    for key in keys:
        run = s.runs.get(key[1])
        why = None if run is None else requeue_left_out(s, run, succeeded)
        if why is None:
            kept.append(key)
        else:
            left[why] = left.get(why, 0) + 1
    return kept, left


class BulkWalk:
    """BackfillWalk's counterpart for a bulk requeue or purge: ``next(key)`` over dead runs."""

    def __init__(self, s: SchedulerState, bf: Record, now: int) -> None:
        req = bf["req"]
        self.s = s
        self.kind = bf["kind"]
        self.filters = req
        self.room = (req["max_concurrent"] - live_active(s, bf["active"])) if self.kind == "requeue" else None
        self.tokens = tokens(bf["bucket"], now)
        self.count_left = None if req["max_count"] is None else req["max_count"] - bf["created"]
        self.runs_left = limits.dlq_bulk_step_runs_max
        self.depths: dict[str, int] = {}
        self.succeeded: dict[str, set[int]] = {}  # a job's slots a run of which succeeded (this step's)

    def stop_reason(self, queue: str | None = None) -> str | None:
        if self.count_left is not None and self.count_left <= 0:
            return "max_count"
        if self.runs_left <= 0:
            return "step"
        if self.room is not None and self.room <= 0:
            return "max_concurrent"
        if self.tokens is not None and self.tokens <= 0:
            return "rate"
        if queue is not None and self.kind == "requeue":
            depth, max_depth = queue_room(self.s, queue)
            if self.depths.get(queue, depth) >= max_depth:
                return "queue_full"
        return None

    def next(self, key: list[Any]) -> tuple[str, str]:
        rid = key[1]
        run = self.s.runs.get(rid)
        if run is None:
            return "left", "gone"
        if run["state"] != "dead" or dead_key(run) != key:
            return "left", "not_dead"
        if not matches(run, self.filters):
            return "left", "filter"
        if self.kind == "requeue":
            why = requeue_left_out(self.s, run, self.succeeded)
            if why is not None:
                return "left", why
        stop = self.stop_reason(run["queue"])
        if stop is not None:
            return "stop", stop
        return "run", rid

    def took(self, queue: str) -> None:
        if self.count_left is not None:
            self.count_left -= 1
        self.runs_left -= 1
        if self.room is not None:
            self.room -= 1
        if self.tokens is not None:
            self.tokens -= 1
        if self.kind == "requeue":
            depth = self.depths.get(queue)
            if depth is None:
                depth = queue_room(self.s, queue)[0]
            self.depths[queue] = depth + 1


# ------------------------------------------------------------------ reads
def progress(s: SchedulerState, bf: Record) -> dict[str, int]:
    """A backfill's counts now: its finished outcomes plus the live states of its active runs
    (which the next step will count as finished)."""
    out = {k: 0 for k in ("queued", "running") + OUTCOMES}
    for k, n in bf["finished"].items():
        out[k] = out.get(k, 0) + n
    runs = s.runs
    for rid in bf["active"]:
        r = runs.get(rid)
        if r is None:
            continue
        st = r["state"]
        out[st if st in out else "skipped"] = out.get(st if st in out else "skipped", 0) + 1
    return out


def _copy(s: SchedulerState, bf: Record) -> dict[str, Any]:
    out = dict(bf)
    out["req"] = dict(bf["req"])
    out["plan"] = {k: v for k, v in bf["plan"].items() if k != "known"}
    out["left_out"] = dict(bf["left_out"])
    out["finished"] = dict(bf["finished"])
    out["active"] = list(bf["active"])
    out["cursor"] = list(bf["cursor"]) if isinstance(bf["cursor"], list) else bf["cursor"]
    out["bucket"] = dict(bf["bucket"]) if bf["bucket"] is not None else None
    if "held" in bf:
        out["held"] = [[h[0], h[1]] for h in bf["held"].values()]
    out["progress"] = progress(s, bf)
    return out


def tenant_of(s: SchedulerState, bf: Record) -> str | None:
    """The tenant a backfill belongs to: its job's when it was made; none for a bulk DLQ
    operation, and for a backfill made by an older version, which kept no tenant (only a token
    without tenants sees it: its job's tenant now may be another's, the job deleted and put again
    under that name by another tenant)."""
    if bf["kind"] != "backfill":
        return None
    t: str | None = bf.get("tenant")
    return t


def visible_to(s: SchedulerState, bf: Record, tenants: frozenset[str]) -> bool:
    """Whether a token limited to ``tenants`` sees (and may pause, resume, cancel) ``bf``: a
    backfill of a job of its tenants, whose cascade, if any, was asked for by a token limited to
    some of them (an unlimited token's cascade may hold and count other tenants' runs: it stays
    the admin's). docs/security.md, "Tenants"."""
    if tenant_of(s, bf) not in tenants:
        return False
    if "cascade" not in bf["req"]:
        return True
    reach = bf.get("limited_to")
    return reach is not None and set(reach) <= tenants


def tenant_active(s: SchedulerState, tenant: str) -> int:
    """The backfills of ``tenant`` running or paused (limits.backfills_tenant_active_max)."""
    return sum(1 for bf in s.backfills.values() if bf["state"] not in FINISHED and tenant_of(s, bf) == tenant)


def limited_active(s: SchedulerState) -> int:
    """The backfills running or paused that tokens limited to tenants started
    (limits.backfills_limited_active_max)."""
    return sum(1 for bf in s.backfills.values() if bf["state"] not in FINISHED and "limited_to" in bf)


def view(s: SchedulerState, bf_id: str, tenants: frozenset[str] | None = None) -> dict[str, Any] | None:
    """Backfill (or bulk operation) ``bf_id`` with its live ``progress``, or None (also when it
    is not one ``tenants``, a limited token's, sees: :func:`visible_to`)."""
    bf = s.backfills.get(bf_id)
    if bf is None or (tenants is not None and not visible_to(s, bf, tenants)):
        return None
    return _copy(s, bf)


def views(s: SchedulerState, kind: str | None = None, job: str | None = None,
          state: str | None = None, tenants: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """Every backfill and bulk operation the state keeps, in creation order, those of ``kind``,
    ``job`` and ``state`` only, and those ``tenants`` (a limited token's) sees only."""
    out = []
    for bf in s.backfills.values():
        if (kind is None or bf["kind"] == kind) and (job is None or bf["job"] == job) \
                and (state is None or bf["state"] == state) \
                and (tenants is None or visible_to(s, bf, tenants)):
            out.append(_copy(s, bf))
    return out


def stepper_views(s: SchedulerState, now: int) -> list[dict[str, Any]]:
    """What the leader's stepper needs of each backfill it may step: those running, and those a
    full queue paused. Per backfill: ``{"id", "kind", "cursor", "exhausted", "req", "plan"
    (schedule, anchor), "job_gone", "stop" (why no run can be made now, or None),
    "finishable" (its range is handled and none of its runs is queued or running: one empty
    step makes it done)}``."""
    out = []
    for bf in s.backfills.values():
        if not (bf["state"] == "running" or (bf["state"] == "paused" and bf["paused_by"] == "queue_full")):
            continue
        v = {"id": bf["id"], "kind": bf["kind"], "state": bf["state"], "cursor": bf["cursor"],
             "exhausted": bf["exhausted"],
             "req": dict(bf["req"]), "job_gone": False, "stop": None,
             "finishable": bf["exhausted"] and not bf.get("held") and live_active(s, bf["active"]) == 0,
             "release": False}
        if bf["kind"] == "backfill":
            v["plan"] = {"schedule": bf["plan"]["schedule"], "anchor": bf["plan"]["anchor"]}
            job = job_of(s, bf)
            if job is None or job["spec"]["executor"]["type"] == "heartbeat":
                v["job_gone"] = True  # (a heartbeat job's: one empty step cancels it too)
            else:
                walk = BackfillWalk(s, bf, job, now)
                v["stop"] = walk.stop_reason()
                # a cascade's held children: a step queues them while its budget allows
                v["release"] = walk.may_release() and pipelines.releasable(s, bf)
        else:
            v["stop"] = BulkWalk(s, bf, now).stop_reason()
            if v["stop"] is None and bf["state"] == "paused":
                # Paused by a full queue: the queue of the next dead run decides whether to go on
                # (a step would only pause it again, ten times a second).
                nxt = dead_matching(s, bf["req"], bf["cursor"], 1)
                if nxt and s.runs[nxt[0][1]]["queue"] is not None:
                    depth, max_depth = queue_room(s, s.runs[nxt[0][1]]["queue"])
                    if depth >= max_depth:
                        v["stop"] = "queue_full"
        out.append(v)
    return out


def plan_backfill_step(s: SchedulerState, bf_id: str, after: int, slots: list[int], complete: bool,
                       now: int) -> dict[str, Any] | None:
    """The step the proposer sends for backfill ``bf_id`` planned from cursor ``after``, given the
    next ``slots`` after it (in the backfill's order) and whether they are all the range still
    holds (``complete``): the slots up to the first one that cannot be run now (a walk over this
    replica, as apply will walk them), and ``exhausted`` when that is all of them. None when
    there is nothing to send (the backfill moved on, or its first slot must wait)."""
    bf = s.backfills.get(bf_id)
    if bf is None or bf["cursor"] != after or bf["kind"] != "backfill":
        return None
    job = job_of(s, bf)
    if job is None:
        return {"name": bf_id, "after": after, "slots": [], "exhausted": False}
    walk = BackfillWalk(s, bf, job, now)
    if bf.get("held"):  # a cascade's held children go first, and no new slot while any is held
        if walk.may_release() and pipelines.releasable(s, bf):
            return {"name": bf_id, "after": after, "slots": [], "exhausted": False}
        return None
    taken, stopped = _walk(walk, slots, lambda _slot: walk.took())
    exhausted = complete and not stopped
    if not taken and not exhausted:
        return None
    return {"name": bf_id, "after": after, "slots": taken, "exhausted": exhausted}


def _walk(walk: BackfillWalk | BulkWalk, items: Sequence[Any],
          took: Callable[[Any], None]) -> tuple[list[Any], bool]:
    """The items a step sends, walking ``items`` as apply will (``walk.next``), up to the first
    that stops it: ``(taken, stopped)``. One stopped by a full queue is taken too: apply stops
    there as well, and pauses the backfill or bulk operation, visibly. ``took(item)`` is told
    of each item that makes a run."""
    taken, stopped = [], False
    for item in items:
        what, why = walk.next(item)
        if what == "stop":
            stopped = True
            if why == "queue_full":
                taken.append(item)
            break
        taken.append(item)
        if what == "run":
            took(item)
    return taken, stopped


def plan_bulk_step(s: SchedulerState, bf_id: str, now: int) -> dict[str, Any] | None:
    """The step the proposer sends for bulk operation ``bf_id``: the next matching dead runs
    after its cursor, up to the first that cannot be acted on now. None when there is nothing
    to send."""
    bf = s.backfills.get(bf_id)
    if bf is None or bf["kind"] == "backfill":
        return None
    walk = BulkWalk(s, bf, now)
    if walk.stop_reason() == "max_count":
        return {"name": bf_id, "after": bf["cursor"], "runs": [], "exhausted": True}
    cands = dead_matching(s, bf["req"], bf["cursor"], limits.run_refs_per_command)
    taken, stopped = _walk(walk, cands, lambda key: walk.took(s.runs[key[1]]["queue"]))
    exhausted = len(cands) < limits.run_refs_per_command and not stopped
    if not taken and not exhausted:
        return None
    return {"name": bf_id, "after": bf["cursor"], "runs": taken, "exhausted": exhausted}


def dry_run_backfill(s: SchedulerState, job_name: str, slots: list[int], mode: str,
                     bf_id: str | None = None) -> dict[str, Any] | None:
    """What a backfill of ``slots`` (the range's slots, in its order) in ``mode`` would do to job
    ``job_name`` as the state is now: ``{"slots": [slot...] it would run, "left_out": [[slot,
    reason], ...]}`` (budgets aside: they decide when, not whether). None: no such job."""
    job = s.jobs.get(job_name)
    if job is None:
        return None
    if slots:
        lo, hi = min(slots), max(slots) + 1
        known, horizon = history_snapshot(s, job, lo, hi)
    else:
        known, horizon = [], None
    latest = dict(map(tuple, known))
    run, left = [], []
    for slot in slots:
        why = verdict(mode, slot, latest.get(slot), horizon, job["cursor"])
        if why is None and bf_id is not None and run_id_for(s, job_name, slot, bf_id) is None:
            why = "exists"
        if why is None:
            run.append(slot)
        else:
            left.append([slot, why])
    return {"slots": run, "left_out": left}
