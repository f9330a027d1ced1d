"""Backfills and bulk dead-letter operations on the node: the proposer side of their requests,
their JSON shapes, and the leader's stepper that moves them on (docs/backfill.md).

The proposer validates a request (core/backfill_model.py), counts the range's slots with the
job's schedule (cron runs here, never in apply: I4) and proposes a ``backfill`` (``dlq_bulk``)
command; a dry run walks the same slots over this replica and proposes nothing. The stepper runs
while this node leads (Trigger.leader_tasks): every tick it reads what each active backfill may do
now (core/backfill_plan.stepper_views), enumerates the next slots after its committed cursor and
proposes a ``backfill_step`` with the ones apply will take. A step that was planned from a view
the log has moved past is dropped by apply, so a new leader simply carries on from the cursor.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging

from ..core import backfill_model, backfill_plan, commands, limits, pipelines, queries, schedule
from ..core import backfills as core_backfills
from ..core.errors import Conflict, InvalidSpec, NotFound, RaftschedError
from ..core.model import check_name
from . import limits as node_limits
from ..proposer import Proposer
from .service import Service, new_request_id

log = logging.getLogger("raftsched.backfill")


def generated_id(rid: str) -> str:
    """The id of a backfill whose request gave none: from the request id, so a retry of the same
    request (same Idempotency-Key) names the same backfill."""
    return hashlib.blake2b(rid.encode(), digest_size=5).hexdigest()


def _floor(sched: dict, anchor: int) -> int | None:
    """The time a schedule's slots come after: an interval's grid starts at its anchor (the
    creation time, rounded up), whose first slot is one interval later (policy.initial_position),
    unless it has a ``start_at``, which is a slot itself. None: no floor."""
    return anchor if "every_s" in sched and "start_at" not in sched else None


def range_slots(sched: dict, anchor: int, lo: int, hi: int, limit: int, order: str) -> list[int]:
    """The slots of ``[lo, hi)``, at most ``limit``, in the backfill's order."""
    floor = _floor(sched, anchor)
    after = lo - 1 if floor is None else max(lo - 1, floor)
    slots = list(schedule.iter_slots(sched, after, hi - 1, anchor, limit))
    return slots[::-1] if order == "newest" else slots


def next_slots(sched: dict, anchor: int, req: dict, cursor: int, limit: int) -> list[int]:
    """The next slots of a backfill's range after its cursor, in its order, at most ``limit``."""
    floor = _floor(sched, anchor)
    if req["order"] == "oldest":
        after = cursor if floor is None else max(cursor, floor)
        return list(schedule.iter_slots(sched, after, req["to"] - 1, anchor, limit))
    lo = req["from"] if floor is None else max(req["from"], floor + 1)
    if cursor <= lo:
        return []
    return schedule.last_slots_until(sched, lo - 1, cursor - 1, anchor, limit)[::-1]


# ------------------------------------------------------------------ views
def _rate(milli):
    return None if milli is None else milli / 1000


def backfill_view(bf: dict) -> dict:
    """A backfill or bulk operation (backfill_plan.view) as ``GET /v1/backfills/{id}`` shows it:
    ``cursor`` is the last slot (dead run) handled, null before the first and once
    ``range_handled`` (every slot made a run or left out; ``done`` follows when its runs end)."""
    req, kind = bf["req"], bf["kind"]
    p = bf["progress"]
    left = dict(bf["left_out"])
    if bf["state"] == "cancelled":
        # The slots (dead runs) a cancel left it never came to: left out, reason cancelled, so
        # created + left_out = planned holds for a cancelled operation too (docs/backfill.md).
        short = bf["planned"] - bf["created"] - sum(left.values())
        if short > 0:
            left["cancelled"] = left.get("cancelled", 0) + short
    left = dict(sorted(left.items()))
    v = {"id": bf["id"], "kind": kind, "job": bf["job"], "state": bf["state"], "reason": bf["reason"],
         "created_at": schedule.iso(bf["created_at"]), "updated_at": schedule.iso(bf["updated_at"]),
         "finished_at": schedule.iso(bf["finished_at"])}
    counts = {"planned": bf["planned"], ("created" if kind == "backfill" else kind + "d"): bf["created"],
              "left_out": sum(left.values()), "left_out_reasons": left}
    if kind == "backfill":
        v["request"] = {"from": schedule.iso(req["from"]), "to": schedule.iso(req["to"]),
                        "reprocess": req["reprocess"], "order": req["order"],
                        "max_concurrent": req["max_concurrent"], "rate_per_s": _rate(req["rate_milli"]),
                        "max_slots": req["max_slots"], "overlap": req["overlap"]}
        if "payload" in req:
            v["request"]["payload"] = req["payload"]
        v["request"]["cascade"] = req.get("cascade", "none")
        first = req["from"] - 1 if req["order"] == "oldest" else req["to"]
        v["cursor"] = None if bf["cursor"] == first or bf["exhausted"] else schedule.iso(bf["cursor"])
    else:
        v["request"] = {"queue": req["queue"], "job": req["job"], "error": req["error"],
                        "dead_from": schedule.iso(req["dead_from"]), "dead_to": schedule.iso(req["dead_to"]),
                        "max_count": req["max_count"], "max_concurrent": req["max_concurrent"],
                        "rate_per_s": _rate(req["rate_milli"])}
        v["cursor"] = None if bf["cursor"] is None or bf["exhausted"] else {
            "finished_at": schedule.iso(bf["cursor"][0]), "run": bf["cursor"][1]}
    v["range_handled"] = bf["exhausted"]
    if kind != "purge":
        for k in ("queued", "running", "succeeded", "failed", "dead"):
            counts[k] = p.get(k, 0)
        for k in ("skipped", "forgotten"):
            if p.get(k):
                counts[k] = p[k]
    if "held" in bf:  # a cascade: the children it queued, and those decided and waiting for its budget
        counts["children_queued"] = bf.get("cascaded", 0)
        counts["children_held"] = len(bf["held"])
        v["held"] = [f"{c}@{slot}" for c, slot in bf["held"][:node_limits.backfill_held_shown]]
    v["progress"] = counts
    return v


# ------------------------------------------------------------------ the proposer side
def _of_tenant(s, run_ids: list[str], tenant: str) -> list[str]:
    """Those of ``run_ids`` whose run belongs to ``tenant`` (a read)."""
    runs = s.runs
    return [r for r in run_ids if (x := runs.get(r)) is not None and x.get("tenant") == tenant]


def _defaulted_dead_to(s, bf_id: str, action: str, filters: dict, b: dict) -> int | None:
    """The ``dead_to`` of bulk operation ``bf_id`` when it is this request but for ``dead_to``
    (which the request left to default), else None (core/backfills.py _same_request compares
    the whole request)."""
    old = s.backfills.get(bf_id)
    if old is None or old["kind"] != action:
        return None
    req = old["req"]
    mine = dict(filters, max_count=b["max_count"], max_concurrent=b["max_concurrent"], rate_milli=b["rate_milli"])
    if any(req.get(k) != v for k, v in mine.items() if k != "dead_to"):
        return None
    return req.get("dead_to")


class BackfillService:
    """The requests of backfills and bulk DLQ operations, over a node's :class:`Service` (its
    clock, propose and reads)."""

    def __init__(self, service: Service) -> None:
        self.svc = service

    def _view(self, bf_id: str) -> dict:
        bf = self.svc.read(backfill_plan.view, bf_id)
        if bf is None:
            raise NotFound(f"no backfill {bf_id!r}", field="id")
        return self._waits(bf, backfill_view(bf))

    def _waits(self, bf: dict, v: dict) -> dict:
        """``waiting_for`` on a running backfill whose queued runs no live worker may take for
        their placement (as a run's view says it, docs/workers.md): it makes no progress until
        such a worker comes, and ``reason`` (null while running) would not say why."""
        if bf["state"] != "running" or not bf["active"]:
            return v
        active = bf["active"]
        if bf.get("tenant") is not None:
            # Only its tenant's runs are named: after its job moved to another tenant, the runs it
            # makes are that tenant's, and a token of the backfill's tenant sees this view.
            active = self.svc.read(_of_tenant, active, bf["tenant"])
        why = self.svc.read(queries.waiting_for_many, active, self.svc.clock.now_ms())
        if why:
            rid = next(r for r in active if r in why)
            more = f" (and {len(why) - 1} more of its runs)" if len(why) > 1 else ""
            v["waiting_for"] = f"its run {rid}: {why[rid]}{more}"
        return v

    async def create(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> tuple[int, dict]:
        """``POST /v1/jobs/{name}/backfills``: ``(status, body)``: 200 and the dry run's answer,
        201 and the new backfill's view, or 200 and the existing one's when its id is known.

        :raises InvalidSpec: the body, or a range of more than max_slots slots (``slots`` says
            how many, or ``null`` for more than limits.backfill_slots_max)."""
        check_name(name)
        now = self.svc.clock.now_ms()
        b = backfill_model.validate_backfill(body, now)
        # The count and the dry run are of this replica's view: after a barrier, the one the log has.
        await self.svc.raft.barrier(timeout_s=self.svc.propose_timeout_s)
        job = self.svc.read(queries.job, name)
        if job is None:
            raise NotFound(f"no job named {name!r}", field="name")
        backfill_model.check_not_heartbeat(job, "name", "backfill")
        if "schedule" not in job["spec"]:
            raise InvalidSpec(f"job {name!r} runs after {', '.join(e['job'] for e in job['spec']['after'])} and has no "
                              f"slots of its own: backfill its parent with \"cascade\": \"children\"", field="name")
        if job["spec"].get("after") and (body or {}).get("upstream", "wait") != "ignore":
            # A gated job (pipelines: a schedule of its own and parents): its backfilled slots
            # would run whatever its parents did for them, a report published over a failed
            # extract (a pipelines walk). Its parents' backfill with cascade decides each slot.
            parents = ", ".join(e["job"] for e in job["spec"]["after"])
            raise InvalidSpec(f"job {name!r} runs after {parents}: a backfill of it would run its slots whatever its "
                              f"parents did for them; backfill its parents with \"cascade\": \"children\" (it "
                              f"follows each slot they run), or send \"upstream\": \"ignore\" to run these slots "
                              f"without them", field="upstream")
        sched, anchor = job["spec"]["schedule"], job["anchor"]
        slots = await asyncio.to_thread(range_slots, sched, anchor, b["from"], b["to"], b["max_slots"] + 1, b["order"])
        if len(slots) > b["max_slots"]:
            n = await asyncio.to_thread(schedule.count_slots, sched, b["from"] - 1, b["to"] - 1, anchor,
                                        limits.backfill_slots_max)
            many = f"{n}" if n is not None else f"more than {limits.backfill_slots_max}"
            raise InvalidSpec(f"the range holds {many} slots of the schedule of job {name!r}, more than max_slots "
                              f"({b['max_slots']}); raise max_slots (at most {limits.backfill_slots_max}) or "
                              f"split the range", field="max_slots", slots=n)
        overlap = b["overlap"] or backfill_model.overlap_of(job["spec"])
        if b["dry_run"]:
            res = self.svc.read(backfill_plan.dry_run_backfill, name, slots, b["reprocess"], b["id"])
            if res is None:
                raise NotFound(f"no job named {name!r}", field="name")
            out = {"dry_run": True, "job": name, "reprocess": b["reprocess"], "order": b["order"],
                   "planned": len(slots), "slots": [schedule.iso(x) for x in res["slots"]],
                   "left_out": [{"slot": schedule.iso(x), "reason": why} for x, why in res["left_out"]]}
            if "cascade" in b:  # pipelines: the jobs that follow each slot's run, and their edges
                # (as the job's graph shows them to this token: its tenants' jobs only)
                g = self.svc.job_graph(name, tenants)
                out["cascade"] = {"children": g["children"],
                                  "edges": [e for e in g["edges"] if e["to"] != name and e["to"] in g["children"]]}
            return 200, out
        rid = rid or new_request_id()
        bf_id = b["id"] or generated_id(rid)
        fields = {"name": bf_id, "job": name, "from": b["from"], "to": b["to"], "reprocess": b["reprocess"],
                  "order": b["order"], "max_concurrent": b["max_concurrent"], "rate_milli": b["rate_milli"],
                  "max_slots": b["max_slots"], "overlap": overlap, "planned": len(slots),
                  "schedule": sched, "anchor": anchor}
        if "payload" in b:
            fields["payload"] = b["payload"]
        if "cascade" in b:
            fields["cascade"] = b["cascade"]
        if tenants is not None:  # apply holds it to them and bounds their tenant's (core/backfills.py)
            fields["tenants"] = sorted(tenants)
        res = await self.svc.propose(commands.backfill(now, rid, fields))
        view = self._view(bf_id)
        if tenants is not None and view.get("held"):  # (a cascade's children of another tenant: not named)
            shown = set(self.svc.visible_jobs({h.rpartition("@")[0] for h in view["held"]}, tenants))
            view["held"] = [h for h in view["held"] if h.rpartition("@")[0] in shown]
        view["created"] = bool(res.get("created"))
        return (201 if view["created"] else 200), self.svc._out(res, view)

    async def dlq_bulk(self, action: str, body, rid: str | None) -> tuple[int, dict]:
        """``POST /v1/dlq:requeue`` and ``/v1/dlq:purge``: the dry run's list (200), or the new
        operation's view (201; 200 when its id is known)."""
        now = self.svc.clock.now_ms()
        b = backfill_model.validate_dlq_bulk(body, action, now)
        filters = {k: b[k] for k in ("queue", "job", "error", "dead_from", "dead_to")}
        if b["dry_run"]:
            await self.svc.raft.barrier(timeout_s=self.svc.propose_timeout_s)
            keys = self.svc.read(backfill_plan.dead_matching, filters, None, None)
            left: dict[str, int] = {}
            if action == "requeue":  # (what its steps would leave out whatever their pace)
                keys, left = self.svc.read(backfill_plan.dry_run_requeue, keys)
            chosen = keys if b["max_count"] is None else keys[:b["max_count"]]
            return 200, {"dry_run": True, "action": action, "runs": [k[1] for k in chosen], "total": len(keys),
                         "left_out_reasons": left}
        rid = rid or new_request_id()
        bf_id = b["id"] or generated_id(rid)
        if b["id"] is not None and (not isinstance(body, dict) or body.get("dead_to") is None):
            # dead_to defaults to now: the same body sent again under its id (a retry, the CLI run
            # twice) must be the same request, not "another request under that id" for its now.
            await self.svc.raft.barrier(timeout_s=self.svc.propose_timeout_s)  # (a follower behind sees it too)
            filters["dead_to"] = self.svc.read(_defaulted_dead_to, bf_id, action, filters, b) or filters["dead_to"]
        fields = dict(filters, name=bf_id, action=action, max_count=b["max_count"],
                      max_concurrent=b["max_concurrent"], rate_milli=b["rate_milli"])
        res = await self.svc.propose(commands.dlq_bulk(now, rid, fields))
        view = self._view(bf_id)
        view["created"] = bool(res.get("created"))
        return (201 if view["created"] else 200), self.svc._out(res, view)

    async def control(self, bf_id: str, action: str, rid: str | None) -> dict:
        """``POST /v1/backfills/{id}/pause|resume|cancel``."""
        check_name(bf_id, "id", limits.backfill_id_chars_max)
        res = await self.svc.propose(commands.backfill_control(self.svc.clock.now_ms(), rid or new_request_id(),
                                                               name=bf_id, action=action))
        view = self._view(bf_id) if self.svc.read(backfill_plan.view, bf_id) is not None else {"id": bf_id}
        if "withdrawn" in res:
            view["withdrawn"] = res["withdrawn"]
        return self.svc._out(res, view)

    def get(self, bf_id: str) -> dict:
        check_name(bf_id, "id", limits.backfill_id_chars_max)
        return self._view(bf_id)

    def list(self, kind: str | None, job: str | None, state: str | None, tenants: frozenset | None = None) -> dict:
        """``GET /v1/backfills``: a token limited to ``tenants`` sees the backfills of their jobs
        only (core/backfill_plan.py visible_to)."""
        out = [self._waits(bf, backfill_view(bf)) for bf in self.svc.read(backfill_plan.views, kind, job, state, tenants)]
        return {"backfills": out}

    async def trigger(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> tuple[int, dict]:
        """``POST /v1/jobs/{name}/trigger`` with a body: a ``payload`` override, a ``slot`` (and
        ``rerun``, ``downstream``). 201 for a new run; 200 with the slot's existing run
        (``created`` False), with a warning when it ended and the request did not ask for a
        rerun. A token limited to ``tenants`` reruns downstream their children only."""
        check_name(name)
        t = backfill_model.validate_trigger(body)
        if t.get("downstream") and tenants is not None:
            t["downstream"] = sorted(tenants)  # (apply reruns the children of these tenants only)
        if "slot" in t or "payload" in t:
            job = self.svc.read(queries.job, name)
            if job is None:
                raise NotFound(f"no job named {name!r}", field="name")
            backfill_model.check_not_heartbeat(job, "slot" if "slot" in t else "payload", "trigger with a slot or a payload")
        if "slot" in t:
            sched = job["spec"].get("schedule")  # a triggered job (pipelines) runs for any slot of its parents'
            if sched is not None and schedule.next_slot_after(sched, t["slot"] - 1, job["anchor"]) != t["slot"]:
                raise InvalidSpec(f"{schedule.iso(t['slot'])} is not a slot of the schedule of job {name!r}",
                                  field="slot")
            if sched is not None and t["slot"] > job["cursor"]:  # apply refuses it too; here with ISO times
                raise Conflict(f"slot {schedule.iso(t['slot'])} is after the cursor of job {name!r} "
                               f"({schedule.iso(job['cursor'])}): the schedule has not handled it yet, and its run "
                               f"will come", field="slot", cursor=schedule.iso(job["cursor"]))
            if sched is None and t["slot"] > self.svc.clock.now_ms():  # apply refuses it too
                raise core_backfills.slot_not_come(name, t["slot"])
        res = await self.svc.propose(commands.trigger_job(self.svc.clock.now_ms(), rid or new_request_id(),
                                                          name=name, extra=t))
        body = {"job": name, "run": res["run"], "state": res["state"], "created": res.get("created", True)}
        body = self.svc.with_upstream_warning(name, res["run"], self.svc._out(res, body))
        said = body.setdefault("warnings", [])
        at = None if "slot" not in t else schedule.iso(t["slot"])
        if not body["created"] and not t.get("rerun") and body["state"] in ("succeeded", "failed", "dead"):
            # The slot's run ended: a trigger of the slot finds it and runs nothing (a walk took
            # the 200 for a rerun that never came). What to do follows the slot's newest run.
            newest = self.svc.read(pipelines.newest_entry, name, t["slot"]) or {"id": res["run"], "state": res["state"]}
            how = (f"its newest run {newest['id']} is dead: requeue it (raftsched requeue {newest['id']}) to run the "
                   "slot again" if newest["state"] == "dead" else
                   "send rerun (raftsched trigger --rerun) to run the slot again, and downstream to run "
                   "again the jobs after it that ran for it")
            said.append(f"slot {at} has its run {res['run']}, which ended {body['state']}: nothing new runs; {how}")
        elif t.get("rerun") and body["created"] and res["run"] == f"{name}@{t['slot']}":
            said.append(f"slot {at} had no run of {name}: this is its first, not a run again (is it the slot you meant?)")
        elif t.get("rerun") and not body["created"]:
            said.append(f"slot {at} has a run still going, {res['run']} ({body['state']}): nothing new runs (a slot "
                        "runs once at a time)" + (", nor below it" if t.get("downstream") else "")
                        + "; send it again once that run has ended")
        if t.get("downstream") and body["created"]:
            going, other = self.svc.read(pipelines.downstream_preview, name, t["slot"], tenants)
            if going:
                said.append(f"still running for slot {at} below it, on the earlier outcomes: {_some(going)}: the rerun "
                            "does not run them again; rerun them (--rerun --downstream) once they end")
            if other:
                said.append(f"jobs below it of other tenants are not run again (nor what is only below them): "
                            f"{_some(other)}")
        if not said:
            del body["warnings"]
        return (201 if body["created"] else 200), body


def _some(names: list[str], n: int = 5) -> str:
    """The first ``n`` of ``names``, and how many more."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


# ------------------------------------------------------------------ the leader's stepper
class BackfillStepper:
    """Moves active backfills and bulk operations on, a step at a time, while this node leads.

    :param raft: the replication adapter (``propose``, ``read``, ``is_leader``).
    :param clock: wall time for the steps' ``now``.
    """

    def __init__(self, raft, clock, interval_s: float = node_limits.backfill_tick_s) -> None:
        self.raft = raft
        self.proposer = Proposer(raft)
        self.clock = clock
        self.interval_s = interval_s
        #: backfill id -> (cursor the slots follow, the next slots in its order, whether they are
        #: all the range holds): enumerated with cron once, used by the steps that follow
        self._slots: dict[str, tuple[int, list[int], bool]] = {}
        self.steps_proposed = 0
        self.last_error: str | None = None

    async def run_while_leading(self) -> None:
        """Step every ``interval_s`` while this node leads (the trigger runs and cancels it)."""
        self._slots.clear()
        while self.raft.is_leader():
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except RaftschedError as e:
                self.last_error = e.message
                log.warning("backfill: step failed: %s", e.message)
            except Exception as e:  # a bug must not stop the others: logged, and the next tick retries
                self.last_error = repr(e)
                log.exception("backfill: step failed")
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> int:
        """Propose one step for each backfill that can move now. Returns how many were proposed."""
        now = self.clock.now_ms()
        views = self.raft.read(backfill_plan.stepper_views, now)
        live = {v["id"] for v in views}
        for k in [k for k in self._slots if k not in live]:
            del self._slots[k]
        n = 0
        for v in views:
            fields, op = await self._plan(v, now)
            if fields is None:
                continue
            await self.proposer.propose(commands.step(op, now, fields))
            n += 1
            self.steps_proposed += 1
        return n

    async def _plan(self, v: dict, now: int) -> tuple[dict | None, str]:
        bf_id, cursor = v["id"], v["cursor"]
        may_run = v["stop"] is None or (v["stop"] == "queue_full" and v["state"] == "running")
        if v["kind"] != "backfill":
            op = "dlq_bulk_step"
            if not v["exhausted"] and may_run:
                return self.raft.read(backfill_plan.plan_bulk_step, bf_id, now), op
            if v["finishable"]:
                return {"name": bf_id, "after": cursor, "runs": [], "exhausted": True}, op
            return None, op
        op = "backfill_step"
        if v["job_gone"]:
            return {"name": bf_id, "after": cursor, "slots": [], "exhausted": False}, op
        if v["exhausted"]:
            if v["finishable"]:
                return {"name": bf_id, "after": cursor, "slots": [], "exhausted": True}, op
            if v["release"]:  # a cascade's held children (core/pipelines.py release_held)
                return {"name": bf_id, "after": cursor, "slots": [], "exhausted": False}, op
            return None, op
        if not may_run:
            if v["release"]:
                return {"name": bf_id, "after": cursor, "slots": [], "exhausted": False}, op
            return None, op
        slots, complete = await self._next_slots(v)
        return self.raft.read(backfill_plan.plan_backfill_step, bf_id, cursor, slots, complete, now), op

    async def _next_slots(self, v: dict) -> tuple[list[int], bool]:
        """The next slots of a backfill after its cursor, in its order, and whether they are all
        its range holds: from the cache while the cursor is inside it, else enumerated (a thread:
        cron takes 20-60 us a slot)."""
        bf_id, cursor, req = v["id"], v["cursor"], v["req"]
        cached = self._slots.get(bf_id)
        if cached is not None:
            base, slots, complete = cached
            if cursor == base:
                rest = slots
            else:
                try:
                    rest = slots[slots.index(cursor) + 1:]
                except ValueError:
                    rest = None
            if rest is not None and (complete or len(rest) >= node_limits.backfill_slots_refill_min):
                self._slots[bf_id] = (cursor, rest, complete)
                return rest, complete
        k = node_limits.backfill_slots_enumerated
        slots = await asyncio.to_thread(next_slots, v["plan"]["schedule"], v["plan"]["anchor"], req, cursor, k)
        complete = len(slots) < k
        self._slots[bf_id] = (cursor, slots, complete)
        return slots, complete

    def stats(self) -> dict:
        return {"steps_proposed": self.steps_proposed, "last_error": self.last_error}
