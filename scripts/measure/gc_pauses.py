"""The collector's pauses while a storm's runs pile up, in one process, without a network:

    .venv/bin/python scripts/measure gc-pauses [--jobs N] [--ticks T] [--gen0 G0] [--gen1 G1 ...]

Registers N interval jobs (every_s 1, history 1) in one SchedulerState, then applies T ticks of
their fire commands in pieces of a storm's size (node/limits.py storm_fire_entries_max), the runs
left queued (N * T of them at the end, as a top-of-the-hour storm leaves them until workers take
them), with the node's collector: its gen0 threshold, and a ``gcpolicy.GcPauses`` that times every
collection and freezes as the node does (polled after every command, where the node polls every
second). For each gen1 threshold given, in a process of its own: µs a slot, each fire command's
apply time (p50 / p99 / max: what a lone read or write waits behind on a replica) and, per
generation, the collections, their total and their longest (docs/benchmarks.md, "Storm": a
gen1 threshold of 2 shortened the longest middle collection here, 90 -> 29 ms, but not the lone
read and write p99 of a 1M storm, so the node keeps CPython's 10).
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

from measure import ROOT, Smoke

SMOKE = [Smoke(("--jobs", "2000", "--ticks", "2", "--gen1", "10", "2"), "gen1 longest")]


def _one(jobs: int, ticks: int, gen0: int, gen1: int) -> str:
    sys.path.insert(0, ROOT)
    from raftsched import gcpolicy
    from raftsched.core import commands as C, model, policy
    from raftsched.core.due import DueIndex
    from raftsched.core.state import SchedulerState
    from raftsched.node import limits

    gc.set_threshold(gen0, gen1, gc.get_threshold()[2])
    st = SchedulerState()
    st.due = DueIndex()
    now = 1_800_000_000_000
    raw = {"schedule": {"every_s": 1}, "executor": {"type": "python", "target": "builtins:id"},
           "misfire": {"policy": "fire_all"}, "queue": "q", "history": 1}
    st.apply(C.make("put_queue", now, None, name="q", max_depth=10 ** 8, on_full="reject"))
    spec = model.validate_job("j", raw)
    pauses = gcpolicy.GcPauses(lambda: st.jobs, freeze_pause_s=limits.gc_freeze_pause_s,
                               freeze_growth_records=limits.gc_freeze_growth_records, log_pause_s=3600,
                               runs=lambda: len(st.runs))
    pauses.install()
    for i in range(jobs):
        st.apply_bytes(C.encode(C.make("put_job", now, f"r{i}", name=f"j{i}", spec=spec, next=now + 1000,
                                       cursor=now, anchor=now)))
        if i % 5000 == 0:
            pauses.poll()
    pauses.poll()
    base_n, base_t = list(pauses.collections), list(pauses.pause_s_total)
    pauses.pause_s_max = [0.0, 0.0, 0.0]
    piece = limits.storm_fire_entries_max
    lat: list[float] = []
    spent, slots = 0.0, 0
    for k in range(1, ticks + 1):
        t_ms = now + k * 1000
        due = st.due.pop(st.jobs, t_ms, 10 ** 9)
        plans = [policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t_ms, j["gen"], j["name"], 0)
                 for j in due]
        for i in range(0, len(plans), piece):
            data = C.encode(C.make("fire", t_ms, None, entries=plans[i:i + piece]))
            t0 = time.perf_counter()
            st.apply_bytes(data)
            dt = time.perf_counter() - t0
            lat.append(dt * 1000)
            spent += dt
            slots += len(plans[i:i + piece])
            pauses.poll()
    lat.sort()

    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]
    n = [a - b for a, b in zip(pauses.collections, base_n)]
    tot = [round(1000 * (a - b)) for a, b in zip(pauses.pause_s_total, base_t)]
    mx = [round(1000 * x, 1) for x in pauses.pause_s_max]
    return (f"gen0 {gen0} gen1 {gen1}: {1e6 * spent / max(slots, 1):.1f} us/slot, {len(st.runs)} runs queued; "
            f"fire command of {piece} applied p50 {q(.5):.1f} / p99 {q(.99):.1f} / max {lat[-1]:.1f} ms; "
            f"collections by generation {n}, total {tot} ms, gen1 longest {mx[1]} ms (gen0 {mx[0]}, gen2 {mx[2]}); "
            f"freezes {pauses.freezes}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="gc-pauses", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--gen0", type=int, default=None, help="default: node/limits.py gc_gen0_threshold")
    ap.add_argument("--gen1", type=int, nargs="+", default=[10, 2], help="gen1 thresholds, one process each")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.gen0 is None:
        sys.path.insert(0, ROOT)
        from raftsched.node import limits
        a.gen0 = limits.gc_gen0_threshold
    if a.child:
        print(_one(a.jobs, a.ticks, a.gen0, a.gen1[0]), flush=True)
        return 0
    for g1 in a.gen1:
        # A process each: the collector's state (frozen objects, counts) must not carry over.
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "measure"), "gc-pauses", "--child",
                            "--jobs", str(a.jobs), "--ticks", str(a.ticks), "--gen0", str(a.gen0),
                            "--gen1", str(g1)], check=False)
        if r.returncode:
            return r.returncode
    return 0
