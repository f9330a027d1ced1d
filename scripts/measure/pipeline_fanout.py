#!/usr/bin/env python3
"""Pipelines in the core: the apply cost of a chain step against an independent job, and a fan-out.

    .venv/bin/python scripts/measure pipeline-fanout [--children 10000] [--chain 400]

One replica, no network, no clock (the core alone, as profile-apply measures it). It prints the
median apply time of a completion of a job with no children, of a parent with one child (the
child's run made in the same apply: the cost of a propagated run), and of the child's own
completion; then how a parent with ``--children`` children is committed: the completion and the
``fanout_step`` commands after it (core/pipelines.py, limits.fanout_per_command each), the
longest apply among them and their sum (docs/pipelines.md, "Fan-out"; docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

try:  # run through scripts/measure
    from measure import Smoke
    SMOKE = [Smoke(("--children", "60", "--chain", "20"), "fan-out of 60 children")]
except ImportError:
    pass

T0 = 1_780_000_000_000
SEC = 1000
EXEC = {"type": "python", "target": "app.jobs:run"}


def _state(jobs_max: int):
    from raftsched.core import limits
    from raftsched.core.state import SchedulerState
    limits.jobs_max = max(limits.jobs_max, jobs_max)
    return SchedulerState()


def _apply(s, cmd) -> tuple[dict, float]:
    from raftsched.core import commands
    data = commands.encode(cmd)
    t = time.perf_counter()
    res = s.apply_bytes(data)
    return res, time.perf_counter() - t


def _put(s, name: str, raw: dict) -> None:
    from raftsched.core import commands, model, schedule
    spec = model.validate_job(name, raw, T0)
    nxt = schedule.next_slot_after(spec["schedule"], T0, T0) if "schedule" in spec else None
    res, _ = _apply(s, commands.put_job(T0, None, name=name, spec=spec, next=nxt, cursor=T0, anchor=T0,
                                         create_only=False))
    assert res["ok"], res


def _fire(s, now: int) -> None:
    from raftsched.core import commands, policy
    entries = []
    for name, job in s.jobs.items():
        if job["next"] is not None:
            plan = policy.plan_fire(job["spec"], job["anchor"], job["cursor"], now, job["gen"], name)
            if plan is not None:
                entries.append(plan)
    if entries:
        res, _ = _apply(s, commands.make("fire", now, None, entries=entries))
        assert res["ok"], res


def _lease(s, now: int) -> list[dict]:
    from raftsched.core import commands
    res, _ = _apply(s, commands.acquire(now, worker="w", queues=None, max=100, ttl=30 * SEC, types=None))
    return res["runs"]


def _complete(s, g: dict, now: int) -> float:
    from raftsched.core import commands
    res, dt = _apply(s, commands.complete_many(now, None, results=[{"run": g["id"], "token": g["token"],
                                                                    "success": True}], worker="w"))
    from raftsched.core.records import outcome_results
    assert res["ok"] and outcome_results(res, [g["id"]])[0]["ok"], res
    return dt


def chain_costs(steps: int) -> dict[str, float]:
    """Median apply µs of a completion: an independent job's, a parent's with one child, the child's."""
    s = _state(10)
    _put(s, "x", {"schedule": {"every_s": 10}, "executor": EXEC, "misfire": {"policy": "fire_all"}})
    _put(s, "p", {"schedule": {"every_s": 10}, "executor": EXEC, "misfire": {"policy": "fire_all"}})
    _put(s, "k", {"after": ["p"], "executor": EXEC})
    times: dict[str, list[float]] = {"x": [], "p": [], "k": []}
    for i in range(steps):
        now = T0 + (i + 1) * 10 * SEC
        _fire(s, now)
        for g in _lease(s, now):
            times[g["job"]].append(_complete(s, g, now + 1))
        for g in _lease(s, now + 2):
            times[g["job"]].append(_complete(s, g, now + 3))
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def fan_out(n: int) -> tuple[int, float, float, float, int]:
    """(commands, longest apply ms, median apply ms, total apply ms, children's runs) of one
    parent's success."""
    from raftsched.core import commands, model, pipelines
    s = _state(n + 10)
    _put(s, "p", {"schedule": {"every_s": 10}, "executor": EXEC, "misfire": {"policy": "fire_all"}})
    spec = model.validate_job("c", {"after": ["p"], "executor": EXEC}, T0)
    items = [{"name": f"c{i:06d}", "spec": dict(spec), "next": None, "cursor": T0, "anchor": T0,
              "create_only": False} for i in range(n)]
    for k in range(0, n, 80):
        res, _ = _apply(s, commands.put_jobs(T0, None, jobs=items[k:k + 80]))
        assert res["ok"], res
    res, _ = _apply(s, commands.put_queue(T0, None, name="default",
                                          fields={"max_depth": max(10_000, 2 * n), "on_full": "reject"}))
    assert res["ok"], res
    now = T0 + 10 * SEC
    _fire(s, now)
    (g,) = _lease(s, now)
    times = [_complete(s, g, now + 1)]
    while s.pipes.fanout:
        ((key, after),) = pipelines.pending_fanout(s, 1)
        res, dt = _apply(s, commands.fanout_step(now + 2, key=key, after=after))
        assert res["ok"], res
        times.append(dt)
    made = sum(1 for r in s.runs.values() if r["job"] != "p" and r["kind"] == "triggered")
    return len(times), max(times) * 1000, statistics.median(times) * 1000, sum(times) * 1000, made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--children", type=int, default=10_000)
    ap.add_argument("--chain", type=int, default=400, help="slots of the chain-step comparison")
    ap.add_argument("--per-command", type=int, default=None,
                    help="children one command offers (default: limits.fanout_per_command; the children "
                         "count: all of them in the completion's command)")
    a = ap.parse_args(argv)
    from raftsched.core import limits
    if a.per_command is not None:
        limits.fanout_per_command = a.per_command
    c = chain_costs(a.chain)
    print(f"complete, a job without children: median {c['x']:.1f} us; a parent with one child (its run made "
          f"in it): {c['p']:.1f} us; the child's own: {c['k']:.1f} us ({a.chain} slots)")
    cmds, longest, median, total, made = fan_out(a.children)
    print(f"fan-out of {a.children} children: {cmds} commands (the completion and {cmds - 1} fanout_step, "
          f"{limits.fanout_per_command} children each), apply median {median:.1f} ms, longest {longest:.1f} ms, "
          f"all {total:.1f} ms, {made} runs made")
    return 0 if made == a.children else 1


if __name__ == "__main__":
    sys.exit(main())
