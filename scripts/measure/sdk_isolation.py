"""What ``raftsched worker --app ... --isolation subprocess`` costs a run, against a thread.

    .venv/bin/python scripts/measure sdk-isolation [RUNS] [MODULE...]

Runs RUNS runs (default 40) of a trivial plain handler (it returns a small dict) through the
executor ``raftsched worker --app`` gives its lease loop (raftsched/sdk/worker.py,
``AppExecutors``), once per isolation, one run at a time and then two at a time (a worker of
two slots), and prints the wall time of each run (median and 95th percentile) and runs per
second. The handler's module is written to a temporary directory, once bare (``import raftsched``
only) and once importing what the example app imports (sqlite3, zoneinfo, json): a child
process pays its interpreter's start, the import of raftsched and of the app's module, on every
run. No cluster: this is the cost of the run itself, the lease round trips are the same for both.
docs/sdk.md quotes its figures. MODULE (``bare``, ``example-imports``; default both) limits the
modules measured.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import ROOT, Smoke

MODULES = {
    "bare": "",
    "example-imports": "import json, sqlite3\nfrom zoneinfo import ZoneInfo\nZoneInfo('Europe/Berlin')\n",
}


def module_text(imports: str) -> str:
    return (f"{imports}from raftsched import App\n"
            'app = App("iso-cost", misfire="skip")\n\n'
            '@app.job("trivial", every_s=3600)\n'
            "def trivial(ctx):\n"
            "    return {'run': ctx.run_id, 'token': ctx.fencing_token}\n")


SMOKE = [Smoke(("2", "bare"), "runs/s")]


async def measure(lookup, runs: int, parallel: int) -> dict:
    from raftsched.worker.executors import CancelEvent, RunContext
    grant = {"id": "trivial@0", "job": "trivial", "slot": 0, "attempt": 1, "token": 1, "payload": None,
             "executor": {"type": "python", "target": next(iter(lookup.app.jobs.values())).target}, "timeout_s": 60}
    times: list[float] = []
    sem = asyncio.Semaphore(parallel)

    async def one(k: int) -> None:
        async with sem:
            ctx = RunContext(run_id=f"trivial@{k}", job="trivial", slot_ms=0, attempt=1, fencing_token=k,
                             payload=None, worker_id="bench")
            t0 = time.perf_counter()
            out = await lookup(grant)(ctx, 60, CancelEvent())
            times.append(time.perf_counter() - t0)
            assert out.ok, out

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(runs)))
    wall = time.perf_counter() - t0
    times.sort()
    return {"p50_ms": statistics.median(times) * 1000, "p95_ms": times[int(0.95 * (len(times) - 1))] * 1000,
            "runs_per_s": runs / wall}


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    runs = int(argv[0]) if argv else 40
    modules = {name: MODULES[name] for name in argv[1:]} if len(argv) > 1 else MODULES
    from raftsched.sdk.loader import load_app
    from raftsched.sdk.worker import AppExecutors
    print(f"{runs} runs of a trivial plain handler per line (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(f"{'module':<16} {'isolation':<11} {'at once':>7} {'p50 ms':>8} {'p95 ms':>8} {'runs/s':>8}")
    with tempfile.TemporaryDirectory() as d:
        old_cwd = os.getcwd()
        os.chdir(d)  # the child imports the module from its working directory, as a worker's does
        try:
            for name, imports in modules.items():
                mod = f"iso_cost_{name.replace('-', '_')}"
                Path(d, f"{mod}.py").write_text(module_text(imports))
                app = load_app(f"{mod}:app")
                for isolation in ("thread", "subprocess"):
                    lookup = AppExecutors(app, f"{mod}:app", isolation=isolation)
                    for parallel in (1, 2):
                        asyncio.run(measure(lookup, 2, parallel))  # warm up (thread pool, page cache)
                        r = asyncio.run(measure(lookup, runs, parallel))
                        print(f"{name:<16} {isolation:<11} {parallel:>7} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} "
                              f"{r['runs_per_s']:>8.1f}")
        finally:
            os.chdir(old_cwd)
    return 0
