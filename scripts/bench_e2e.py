#!/usr/bin/env python3
"""End-to-end throughput: no-op python runs fired, leased, executed and completed per second.

    .venv/bin/python scripts/bench_e2e.py [--jobs 1000] [--slots 32] [--seconds 20]

Starts a three-node cluster on free loopback ports (tests/procs.py), registers JOBS interval jobs
(`every_s: 1`, python executor `builtins:id`, a no-op that succeeds), lets it warm up, then
samples every node's worker `completed` counter (GET /v1/cluster) for SECONDS and reports
completed runs per second across the cluster, plus the backlog (queued runs) at the end: an offered
load the cluster keeps up with ends with a flat backlog. Every process it starts, it stops.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from procs import Cluster, wait_for  # noqa: E402


def completed(c: Cluster) -> int:
    return sum((c.status(i) or {}).get("worker", {}).get("completed", 0) for i in range(3))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="raftsched-e2e-"))
    c = Cluster(tmp, node_args=["--slots", str(args.slots)])
    c.start()
    try:
        leader = c.wait_leader(30)
        s, _ = c.call(leader, "PUT", "/v1/queues/default", {"max_depth": 1_000_000, "on_full": "reject"})
        spec = {"schedule": {"every_s": 1}, "executor": {"type": "python", "target": "builtins:id"},
                "misfire": {"policy": "fire_all"}, "history": 10}
        t0 = time.monotonic()
        for k in range(args.jobs):
            s, b = c.call(leader, "PUT", f"/v1/jobs/e2e-{k}", spec)
            assert s in (200, 201), b
        reg_s = time.monotonic() - t0
        wait_for(lambda: completed(c) > args.jobs, 60, "warm-up")
        n0, t0 = completed(c), time.monotonic()
        time.sleep(args.seconds)  # a measurement window, not a test
        n1, t1 = completed(c), time.monotonic()
        q = c.get(leader, "/v1/queues")[1]["queues"]
        backlog = sum(x["depth"] for x in q)
        rate = (n1 - n0) / (t1 - t0)
        out = {"jobs": args.jobs, "offered_runs_per_s": args.jobs, "slots_per_node": args.slots,
               "completed_runs_per_s": round(rate, 1), "backlog_queued_at_end": backlog,
               "registration_jobs_per_s": round(args.jobs / reg_s, 1), "window_s": round(t1 - t0, 1),
               "nproc": os.cpu_count()}
        print(json.dumps(out))
        return 0
    finally:
        c.stop()


if __name__ == "__main__":
    sys.exit(main())
