#!/usr/bin/env python3
"""How fast a three-node cluster registers jobs through the API (issue #6), and what each costs.

Usage:
    .venv/bin/python scripts/bench_register.py                       # PUT, 32 clients, 5,000 jobs
    .venv/bin/python scripts/bench_register.py --mode batch --jobs 100000
    .venv/bin/python scripts/bench_register.py --git-ref HEAD~1      # the nodes run that commit
    .venv/bin/python scripts/bench_register.py --code-dir /tmp/tree  # the nodes run that copy
    .venv/bin/python scripts/bench_register.py --spec cron --rounds 3

Starts a three-node cluster (tests/procs.py: real node processes, free 127.0.0.1 ports, a
temporary directory, ``--slots 0``), registers 300 untimed warm-up jobs, then, per round,
``--jobs`` new jobs with a spec that never falls due during the run:

- ``put``: ``PUT /v1/jobs/{name}``, ``--concurrency`` requests in flight (aiohttp, kept-alive
  connections, an Idempotency-Key each), all to the leader (``--to follower``: to a follower);
- ``batch``: ``POST /v1/jobs:batch`` with ``--batch`` jobs per request, ``--concurrency``
  requests in flight.

Per round it prints one JSON line: jobs/s, request latency (p50 / p99, ms), the CPU time the
three node processes used (from /proc, utime + stime) per job, for the leader and for the
cluster, and the Raft log entries per job (the leader's commit_index before and after). CPU per
job is the figure to compare between two versions on a shared machine: throughput and latency
move with whatever else runs on the cores, CPU per job much less. The load average before and
after each round is printed too.

Every process it starts is stopped by PID in a ``finally`` block. Exit status 1 if a request
failed (any status other than 200/201) or a node died.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from procs import Cluster  # noqa: E402

HOST = "127.0.0.1"
SPECS = {
    # Never due during the run: the registration path only, no fire.
    "at": {"schedule": {"at": "2099-01-01T00:00:00Z"}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "skip"}},
    "every": {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["true"]},
              "misfire": {"policy": "skip"}},
    # A crontab line: croniter runs on the node that validates (and to compute the next slot).
    "cron": {"schedule": {"cron": "17 3 * * 1-5", "timezone": "Europe/Berlin"},
             "executor": {"type": "shell", "argv": ["/usr/local/bin/report", "--daily"]},
             "misfire": {"policy": "fire_once"}},
}


class CodeCluster(Cluster):
    """procs.Cluster whose nodes run the code in ``code_dir`` (cwd and PYTHONPATH)."""

    def __init__(self, tmp: Path, code_dir: Path, **kw) -> None:
        super().__init__(tmp, env={"PYTHONPATH": str(code_dir)}, node_args=["--slots", "0"], **kw)
        self.code_dir = code_dir

    def start(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(self.n)):
            self.data_dir(j).mkdir(parents=True, exist_ok=True)
            log = open(self.data_dir(j) / "node.log", "ab")
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
            self.procs[j] = subprocess.Popen(self.argv(j), stdout=log, stderr=subprocess.STDOUT,
                                             cwd=self.code_dir, env=env)
            log.close()


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[max(0, -(-len(s) * p // 100) - 1)], 1)


async def drive(port: int, token: str, names: list[str], spec: dict, mode: str, batch: int,
                concurrency: int, tag: str) -> dict:
    import aiohttp

    base = f"http://{HOST}:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    if mode == "put":
        work = iter([(f"/v1/jobs/{n}", "PUT", spec, f"{tag}-{n}") for n in names])
    else:
        chunks = [names[i:i + batch] for i in range(0, len(names), batch)]
        work = iter([("/v1/jobs:batch", "POST", {"jobs": {n: spec for n in ch}}, f"{tag}-b{k}")
                     for k, ch in enumerate(chunks)])

    async def worker(session):
        for path, method, body, key in work:
            a = time.perf_counter()
            async with session.request(method, base + path, json=body,
                                       headers={**auth, "Idempotency-Key": key}) as r:
                raw = await r.read()
                s = r.status
            lat.append((time.perf_counter() - a) * 1000)
            statuses[s] = statuses.get(s, 0) + 1
            if s not in (200, 201) and len(errors) < 5:
                errors.append(f"{method} {path}: {s} {raw[:300]!r}")

    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    total = time.perf_counter() - t0
    return {"seconds": round(total, 2), "jobs_per_s": round(len(names) / total, 1),
            "latency_ms": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": pct(lat, 100)},
            "requests": len(lat), "statuses": statuses, "errors": errors}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=5000, help="jobs registered per round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mode", choices=("put", "batch"), default="put")
    ap.add_argument("--batch", type=int, default=1000, help="jobs per POST /v1/jobs:batch")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    ap.add_argument("--spec", choices=sorted(SPECS), default="at")
    ap.add_argument("--to", choices=("leader", "follower"), default="leader")
    ap.add_argument("--git-ref", help="run the nodes from this commit (git archive) instead of the working tree")
    ap.add_argument("--code-dir", help="run the nodes from this directory (a copy of the tree) instead")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and node logs")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="raftsched-bench-register-"))
    code_dir = REPO
    code = "working tree"
    if args.code_dir:
        code_dir = Path(args.code_dir).resolve()
        code = f"directory {code_dir}"
    elif args.git_ref:
        sha = subprocess.run(["git", "rev-parse", "--verify", args.git_ref + "^{commit}"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.strip()
        code_dir = tmp / "code"
        code_dir.mkdir()
        arch = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(code_dir)], input=arch, check=True)
        code = f"commit {sha[:12]} ({args.git_ref})"
    (tmp / "cluster").mkdir()
    c = CodeCluster(tmp / "cluster", code_dir)
    failed = False
    try:
        c.start()
        leader = c.wait_leader(30)
        target = leader if args.to == "leader" else (leader + 1) % c.n
        port = c.api_ports[target]
        spec = SPECS[args.spec]
        print(json.dumps({"code": code, "mode": args.mode, "spec": args.spec, "jobs": args.jobs,
                          "concurrency": args.concurrency, "batch": args.batch if args.mode == "batch" else None,
                          "to": f"node-{target + 1} ({args.to})"}), flush=True)
        warm = asyncio.run(drive(port, c.token, [f"warm-{k}" for k in range(300)], spec, "put", 0,
                                 args.concurrency, "warm"))
        if warm["errors"]:
            print(json.dumps({"warm_up_errors": warm["errors"]}), flush=True)
            return 1
        for r in range(args.rounds):
            names = [f"r{r}-{k}" for k in range(args.jobs)]
            pids = {i: p.pid for i, p in c.procs.items()}
            ci0 = c.status(leader)["commit_index"]
            load0 = os.getloadavg()[0]
            cpu0 = {i: cpu_s(pid) for i, pid in pids.items()}
            res = asyncio.run(drive(port, c.token, names, spec, args.mode, args.batch, args.concurrency, f"r{r}"))
            cpu1 = {i: cpu_s(pid) for i, pid in pids.items()}
            ci1 = c.status(leader)["commit_index"]
            used = {i: cpu1[i] - cpu0[i] for i in pids}
            res.update({
                "round": r,
                "leader_cpu_ms_per_job": round(used[leader] * 1000 / args.jobs, 3),
                "cluster_cpu_ms_per_job": round(sum(used.values()) * 1000 / args.jobs, 3),
                "log_entries_per_job": round((ci1 - ci0) / args.jobs, 3),
                "loadavg_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
            })
            print(json.dumps(res), flush=True)
            if res["errors"] or set(res["statuses"]) - {200, 201}:
                failed = True
        dead = [i for i, p in c.procs.items() if p.poll() is not None]
        if dead:
            print(json.dumps({"dead_nodes": dead}), flush=True)
            failed = True
    finally:
        c.stop()
        if failed or args.keep:
            print(f"data dirs and node logs kept in {tmp}", file=sys.stderr)
        else:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
