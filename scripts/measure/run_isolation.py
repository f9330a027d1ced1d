"""What running a job's code isolated costs a run (worker/sandbox.py), against running it in the
worker's own process.

    .venv/bin/python scripts/measure run-isolation [RUNS] [--runs-dir DIR] [--parallel N]

Runs RUNS runs (default 300) of a no-op python target (``builtins:id``) and of a no-op shell run
(``true``) through the executors, N at a time (default 16, as a worker of 16 slots would): once
in this process (no sandbox: the python target in a run thread, ``true`` started by this
process), once in a sandbox (each run a directory of its own, started by the run server as the
run user: a fork of it for python, a ``posix_spawn`` for shell). Prints, a run, the CPU of this
process (the worker's side: the directory, the protocol, the deadline) and of the run server
with the runs it reaped (``/proc``), and the wall time per run. No cluster: what the lease
round trips cost is the same either way. docs/benchmarks.md ("The cost of running jobs
isolated") quotes its figures; ``--runs-dir`` puts the runs' directories elsewhere (a tmpfs).

Then, in a child process of its own, what a bare ``fork`` and ``_exit`` cost a process that has
imported what the run server imports, and one that has imported only the standard library's
``json`` and ``selectors``: CPU of the parent and of the child, and the child's minor page
faults (its copy-on-write), a fork.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time

from measure import ROOT, Smoke

SMOKE = [Smoke(("8", "--parallel", "4"), "a fork")]

#: Run in a fresh interpreter: fork and _exit N times after importing the modules given.
_FORKS = """
import gc, importlib, os, resource, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
gc.freeze()
n = int(sys.argv[1])
c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
c1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / n * 1e6
print(cpu(s0, s1), cpu(c0, c1), (c1.ru_minflt - c0.ru_minflt) / n)
"""


def _proc_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(pid: int) -> float:
    """_proc_cpu_s of ``pid`` and of its living children (the run server's python starter, whose
    reaped runs' CPU its own cutime holds until it exits)."""
    total = _proc_cpu_s(pid)
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
    for k in kids:
        try:
            total += _proc_cpu_s(k)
        except OSError:
            pass
    return total


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


async def _measure(kind: str, sandbox, runs: int, parallel: int) -> dict:
    from raftsched.worker.executors import RunContext, execute
    spec = {"type": "python", "target": "builtins:id"} if kind == "python" else {"type": "shell", "argv": ["true"]}
    sem = asyncio.Semaphore(parallel)

    async def one(k: int) -> None:
        async with sem:
            ctx = RunContext(run_id=f"noop@{k}", job="noop", slot_ms=0, attempt=1, fencing_token=k, payload=None,
                             worker_id="measure")
            out = await execute(spec, ctx, 60, sandbox=sandbox)
            assert out.ok, out

    await one(-1)  # warm: the target's import, the first run's allocations
    server = sandbox.server.pid if sandbox is not None else None
    mine0, srv0, t0 = _self_cpu_s(), _tree_cpu_s(server) if server else 0.0, time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(runs)))
    wall = time.perf_counter() - t0
    mine, srv = _self_cpu_s() - mine0, (_tree_cpu_s(server) - srv0) if server else 0.0
    return {"worker_us": mine / runs * 1e6, "server_us": srv / runs * 1e6, "wall_us": wall / runs * 1e6}


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    ap = argparse.ArgumentParser(prog="scripts/measure run-isolation")
    ap.add_argument("runs", nargs="?", type=int, default=300)
    ap.add_argument("--runs-dir", default=None)
    ap.add_argument("--parallel", type=int, default=16)
    args = ap.parse_args(argv)
    from raftsched.worker.sandbox import Sandbox, resolve_run_user

    async def all_of_it() -> list[tuple[str, str, dict]]:
        out = []
        sandbox = Sandbox(resolve_run_user(None), name="measure", runs_parent=args.runs_dir)
        await sandbox.start()
        try:
            for kind in ("python", "shell"):
                out.append((kind, "this process", await _measure(kind, None, args.runs, args.parallel)))
                out.append((kind, f"sandbox ({sandbox.user.name})",
                            await _measure(kind, sandbox, args.runs, args.parallel)))
        finally:
            await sandbox.close()
        return out

    rows = asyncio.run(all_of_it())
    import subprocess
    from raftsched.worker import runserver
    forks = []
    for what, mods in (("the run server's imports", runserver.PRELOAD), ("json, selectors", ("json", "selectors"))):
        p = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{_FORKS}",
                            str(args.runs), *mods], capture_output=True, text=True, check=True)
        forks.append((what, [float(x) for x in p.stdout.split()]))
    print(f"{args.runs} no-op runs per line, {args.parallel} at a time (python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}, runs directory in "
          f"{args.runs_dir or 'the temporary directory'})")
    print(f"{'run':<7} {'where':<26} {'worker':>12} {'run server':>14} {'total':>12} {'wall':>12}")
    for kind, where, m in rows:
        total = m["worker_us"] + m["server_us"]
        print(f"{kind:<7} {where:<26} {m['worker_us']:>9.0f} us {m['server_us']:>11.0f} us {total:>9.0f} us "
              f"{m['wall_us']:>9.0f} us a run")
    print(f"\n{'fork and _exit after importing':<34} {'parent':>10} {'child':>10} {'child faults':>13}")
    for what, (parent, child, faults) in forks:
        print(f"{what:<34} {parent:>7.0f} us {child:>7.0f} us {faults:>13.0f}   a fork")
    return 0
