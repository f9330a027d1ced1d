"""What a backfill costs: the proposer's count of a range (cron, the API request's wait), the
stepper's plan of a step (a walk over its replica) and every replica's apply of it.

    .venv/bin/python scripts/measure profile-backfill [--history 1000] [--slots 10000]

In process, one core, no network: figures per step and per slot, medians of a few repeats.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from measure import ROOT, Smoke

ARGPARSE = True
SMOKE = [Smoke(("--history", "40", "--slots", "300"), "us a run")]


def median_s(fn, repeat: int = 5) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv: list[str]) -> int:
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    from raftsched.core import backfill_plan, commands, limits  # noqa: E402
    from raftsched.node import backfills  # noqa: E402

    from backfill_helpers import finish_runs, next_slots, step_cmd  # noqa: E402
    from core_helpers import MIN, T0, apply, new_state, spec_of, tick  # noqa: E402

    ap = argparse.ArgumentParser(prog="scripts/measure profile-backfill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=1000, help="the job's history bound (entries it holds)")
    ap.add_argument("--slots", type=int, default=limits.backfill_slots_max, help="slots counted for a range")
    a = ap.parse_args(argv)

    cron = {"cron": "* * * * *", "timezone": "Europe/Berlin"}
    n = a.slots
    lo = T0 - n * MIN
    count_s = median_s(lambda: backfills.range_slots(cron, 0, lo, T0, limits.backfill_slots_max + 1, "oldest"), 3)
    print(f"count a range of {n} cron slots (the proposer, once a request): {count_s * 1000:.0f} ms "
          f"({count_s / n * 1e6:.1f} us a slot)")

    s = new_state(("j", spec_of({"every_s": 60}, "skip", history=a.history, retry={"max_attempts": 1})), now=T0)
    anchor = s.jobs["j"]["anchor"]
    for k in range(1, a.history + 1):
        tick(s, anchor + k * MIN)
    end = anchor + (a.history + 1) * MIN
    finish_runs(s, end, ok_fn=lambda rid: int(rid.split("@")[1]) // MIN % 2 == 0)  # every other one dead
    fields = dict(name="bf", job="j", reprocess="failed", order="oldest", max_concurrent=limits.backfill_concurrent_max,
                  rate_milli=None, max_slots=limits.backfill_slots_max, overlap="allow", planned=a.history,
                  schedule=s.jobs["j"]["spec"]["schedule"], anchor=anchor, **{"from": anchor + 1, "to": end})
    t = time.perf_counter()
    assert apply(s, commands.make("backfill", end, None, **fields))["ok"]
    create_ms = (time.perf_counter() - t) * 1000
    print(f"apply the backfill command over a history of {a.history} entries: {create_ms:.2f} ms")
    bf = s.backfills["bf"]
    slots, complete = next_slots(bf)
    plan_s = median_s(lambda: backfill_plan.plan_backfill_step(s, "bf", bf["cursor"], slots, complete, end))
    cmd = step_cmd(s, "bf", end)
    data = commands.encode(cmd)
    runs = cmd["slots"] and sum(1 for x in cmd["slots"] if (x - anchor) // MIN % 2)
    replicas = []
    for _ in range(5):
        r = new_state()
        r.restore(s.snapshot())
        replicas.append(r)
    times = []
    for r in replicas:
        t = time.perf_counter()
        res = r.apply_bytes(data)
        times.append(time.perf_counter() - t)
        assert res["created"] == runs, res
    apply_s = statistics.median(times)
    print(f"a backfill of failed: plan a step of {runs} runs among {len(cmd['slots'])} slots (the stepper's walk): "
          f"{plan_s * 1000:.2f} ms; "
          f"apply it: {apply_s * 1000:.2f} ms ({apply_s / runs * 1e6:.1f} us a run); "
          f"{len(data)} bytes")
    return 0
