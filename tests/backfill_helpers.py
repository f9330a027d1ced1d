"""Helpers of the backfill tests (test_backfills.py, the stateful machines): the commands as
node/backfills.py builds them (the proposer's count, the stepper's plan), encoded and applied as
replication does. Nothing here reads a clock."""
from __future__ import annotations

from raftsched.core import backfill_plan, commands, limits
from raftsched.node import backfills

from core_helpers import apply


def range_slots(s, job: str, lo: int, hi: int, order: str = "oldest", limit: int = limits.backfill_slots_max) -> list[int]:
    """The slots of ``[lo, hi)`` of the job's schedule, in the backfill's order (the proposer's)."""
    j = s.jobs[job]
    return backfills.range_slots(j["spec"]["schedule"], j["anchor"], lo, hi, limit, order)


def backfill_cmd(s, job: str, lo: int, hi: int, now: int, bf_id: str = "b1", rid: str | None = None,
                 reprocess: str = "missing", order: str = "oldest", max_concurrent: int = 1,
                 rate_milli: int | None = None, max_slots: int = limits.backfill_max_slots_default,
                 overlap: str = "allow", **extra) -> dict:
    """A backfill command as BackfillService.create proposes it."""
    j = s.jobs[job]
    planned = len(range_slots(s, job, lo, hi, order, max_slots))
    fields = {"name": bf_id, "job": job, "from": lo, "to": hi, "reprocess": reprocess, "order": order,
              "max_concurrent": max_concurrent, "rate_milli": rate_milli, "max_slots": max_slots,
              "overlap": overlap, "planned": planned, "schedule": j["spec"]["schedule"], "anchor": j["anchor"]}
    fields.update(extra)
    return commands.make("backfill", now, rid, **fields)


def next_slots(bf: dict, k: int = 256) -> tuple[list[int], bool]:
    """The stepper's next slots after a backfill's cursor (BackfillStepper._next_slots, uncached)."""
    slots = backfills.next_slots(bf["plan"]["schedule"], bf["plan"]["anchor"], bf["req"], bf["cursor"], k)
    return slots, len(slots) < k


def step_cmd(s, bf_id: str, now: int) -> dict | None:
    """What the leader's stepper proposes for ``bf_id`` at ``now`` (BackfillStepper._plan), or
    None when it proposes nothing."""
    views = {v["id"]: v for v in backfill_plan.stepper_views(s, now)}
    v = views.get(bf_id)
    if v is None:
        return None
    bf = s.backfills[bf_id]
    may_run = v["stop"] is None or (v["stop"] == "queue_full" and v["state"] == "running")
    if v["kind"] != "backfill":
        op = "dlq_bulk_step"
        if not v["exhausted"] and may_run:
            fields = backfill_plan.plan_bulk_step(s, bf_id, now)
        elif v["finishable"]:
            fields = {"name": bf_id, "after": v["cursor"], "runs": [], "exhausted": True}
        else:
            fields = None
    else:
        op = "backfill_step"
        if v["job_gone"]:
            fields = {"name": bf_id, "after": v["cursor"], "slots": [], "exhausted": False}
        elif v["exhausted"]:
            fields = {"name": bf_id, "after": v["cursor"], "slots": [], "exhausted": True} if v["finishable"] else (
                {"name": bf_id, "after": v["cursor"], "slots": [], "exhausted": False} if v["release"] else None)
        elif may_run:
            slots, complete = next_slots(bf)
            fields = backfill_plan.plan_backfill_step(s, bf_id, v["cursor"], slots, complete, now)
        elif v["release"]:
            fields = {"name": bf_id, "after": v["cursor"], "slots": [], "exhausted": False}
        else:
            fields = None
    return None if fields is None else commands.make(op, now, None, **fields)


def step(s, bf_id: str, now: int) -> dict | None:
    """Plan and apply one step; the result, or None when the stepper would propose nothing."""
    cmd = step_cmd(s, bf_id, now)
    return None if cmd is None else apply(s, cmd)


def finish_runs(s, now: int, ok_fn=lambda rid: True, worker: str = "w1") -> int:
    """A worker takes every ready run and reports it (success unless ``ok_fn(run_id)`` says no)."""
    n = 0
    while True:
        res = apply(s, commands.make("acquire", now, None, worker=worker, queues=None, max=100, ttl=10_000))
        assert res["ok"], res
        if not res["runs"]:
            return n
        results = [{"run": g["id"], "token": g["token"], "success": bool(ok_fn(g["id"])),
                    "error": None if ok_fn(g["id"]) else "boom"} for g in res["runs"]]
        out = apply(s, commands.make("complete_many", now, None, results=results))
        assert out["ok"], out
        n += len(results)


def backfill_runs(s, bf_id: str) -> list[dict]:
    """Every run of a backfill the state holds, in the order they were made."""
    return [r for r in s.runs.values() if r.get("backfill") == bf_id]
