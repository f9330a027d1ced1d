"""How fast a three-node cluster registers jobs through the API (issue #6), and what each costs.

Usage:
    .venv/bin/python scripts/measure bench-register                       # PUT, 32 clients, 5,000 jobs
    .venv/bin/python scripts/measure bench-register --mode batch --jobs 100000
    .venv/bin/python scripts/measure bench-register --git-ref HEAD~1      # the nodes run that commit
    .venv/bin/python scripts/measure bench-register --code-dir /tmp/tree  # the nodes run that copy
    .venv/bin/python scripts/measure bench-register --spec cron --rounds 3

Starts a three-node cluster (raftsched/testing/ through scripts/benchlib/harness.py: real node
processes, free 127.0.0.1 ports, a temporary directory, ``--slots 0``), registers 300 untimed
warm-up jobs (``--warmup``), then, per round, ``--jobs`` new jobs with a spec that never falls due
during the run:

- ``put``: ``PUT /v1/jobs/{name}``, ``--concurrency`` requests in flight (aiohttp, kept-alive
  connections, an Idempotency-Key each), all to the leader (``--to follower``: to a follower);
- ``batch``: ``POST /v1/jobs:batch`` with ``--batch`` jobs per request, ``--concurrency``
  requests in flight.

Both go through the benchmark's registrar (scripts/benchlib/register.py), which retries a 503 or
504 with the same Idempotency-Key; every attempt is counted in the statuses.

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
import json
import os

from benchlib import common
from benchlib.harness import BenchCluster, probe_cluster, stop_probe
from benchlib.probes import cpu_s
from benchlib.register import register_jobs
from measure import Smoke

ARGPARSE = True
SMOKE = [Smoke(("--jobs", "60", "--warmup", "20", "--concurrency", "8", "--mode", "batch", "--batch", "25"),
               "cluster_cpu_ms_per_job")]

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


def drive(c: BenchCluster, i: int, names: list[str], spec: dict, mode: str, batch: int, concurrency: int,
          tag: str) -> dict:
    """Register ``names`` (all with ``spec``) through node i, ``mode`` "put" or "batch"; the
    round's figures as this script prints them."""
    r = register_jobs(c, i, [(n, spec) for n in names], "put" if mode == "put" else "bulk",
                      concurrency=concurrency, bulk_concurrency=concurrency, bulk_jobs_max=batch, key_prefix=tag)
    lat = r["latency_ms"]
    return {"seconds": r["seconds"], "jobs_per_s": round(len(names) / r["seconds"], 1) if r["seconds"] else None,
            "latency_ms": {"p50": lat.get("p50"), "p99": lat.get("p99"), "max": lat.get("max")},
            "requests": r["requests"], "statuses": r["statuses"], "errors": r["errors"][:5]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/measure bench-register", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=5000, help="jobs registered per round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=300, help="untimed jobs registered first (with PUT)")
    ap.add_argument("--mode", choices=("put", "batch"), default="put")
    ap.add_argument("--batch", type=int, default=1000, help="jobs per POST /v1/jobs:batch")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    ap.add_argument("--spec", choices=sorted(SPECS), default="at")
    ap.add_argument("--to", choices=("leader", "follower"), default="leader")
    common.add_code_args(ap)
    args = ap.parse_args(argv)

    tmp, code, c = probe_cluster(args, "bench-register")
    failed = False
    try:
        c.start()
        leader = c.wait_leader(30)
        target = leader if args.to == "leader" else (leader + 1) % c.n
        spec = SPECS[args.spec]
        print(json.dumps({"code": code, "mode": args.mode, "spec": args.spec, "jobs": args.jobs,
                          "concurrency": args.concurrency, "batch": args.batch if args.mode == "batch" else None,
                          "to": f"node-{target + 1} ({args.to})"}), flush=True)
        warm = drive(c, target, [f"warm-{k}" for k in range(args.warmup)], spec, "put", 0, args.concurrency, "warm")
        if warm["errors"]:
            print(json.dumps({"warm_up_errors": warm["errors"]}), flush=True)
            return 1
        for r in range(args.rounds):
            names = [f"r{r}-{k}" for k in range(args.jobs)]
            pids = {i: p.pid for i, p in c.procs.items()}
            ci0 = c.status(leader)["commit_index"]
            load0 = os.getloadavg()[0]
            cpu0 = {i: cpu_s(pid, children=False) for i, pid in pids.items()}
            res = drive(c, target, names, spec, args.mode, args.batch, args.concurrency, f"r{r}")
            cpu1 = {i: cpu_s(pid, children=False) for i, pid in pids.items()}
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
        stop_probe(c, tmp, failed or args.keep)
    return 1 if failed else 0
