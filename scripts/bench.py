#!/usr/bin/env python3
"""raftsched benchmarks (issue #6): fire throughput and punctuality, a storm of aligned slots, end to
end execution, fail-over, writes and scale, side by side with APScheduler and raw pysyncobj.

Usage:  .venv/bin/python scripts/bench.py [--quick] [--out bench-results.json] [--plot PNG]

Each scenario starts its own three-node cluster (real node processes, raftsched/testing/) on free
127.0.0.1 ports in a temporary directory, and stops every process it started, by PID, whatever
happens. The baselines (scripts/baselines/aps_bench.py, scripts/baselines/raw_raft.py) run as
subprocesses with the venv's Python, never at the same time as a cluster; a missing baseline is
recorded as "not run: <why>". Prints a Markdown table, writes every figure as JSON to --out and a
plot of the fire lag distributions (matplotlib, Agg) to --plot (default: --out with .png).

Scenarios (--only takes a comma-separated subset; docs/benchmarks.md says what each figure means):
  failover  kill -9 of the leader, repeated: time to the next committed fire, slots lost/duplicated
  writes    lone PUT latency (leader, follower); jobs registered per second, 32 clients (and bulk);
            GET latency on a follower, consistent and ?stale=true, alone and 32 concurrent readers
  sweep     N interval jobs every 1 s, staggered over the second (schedule.start_at): slots committed
            per second, fire lag, slots fired ahead, where each falls behind
  storm     M one-shot jobs due at one aligned second (10 000 quick, 100 000 full, 1M with --scale-1m):
            fire lag, lost/duplicated, replicas agree, leader changes, the leader's lone read/write
            latency and the nodes' peak resident memory while it is committed
  e2e       no-op python runs fired, leased, executed, completed per second; slot -> completion
  raw_raft  raw pysyncobj commits per second and latency (the Raft layer's ceiling)
  scale     in process: a SchedulerState's memory, snapshot and restore time at 100k jobs; on a cluster:
            resident memory per node at 100k jobs (1M with --scale-1m); cold restart until it fires,
            with the raft journal it replayed
  fleet_e2e  no-op python jobs through raftsched worker processes (nodes --slots 0; an SDK app's
            handler in the worker's process unless --fleet-executor sandbox): completed per second
            against offered, slot -> start, CPU of nodes and workers a run
  fleet_rest 10 000 simulated long-polling workers (asyncio HTTP clients; 200 with --quick): the nodes'
            CPU with no work (each node's), memory per connected worker, due -> receipt of runs fired
            ahead (by node, and split at the acquire)
  durability the same lone writes, registration, sweep (one N) and e2e with fsync on and off
            (raftsched node --no-fsync), fresh clusters, alternating: what syncing before
            acknowledging costs
  pipeline  (issue 25) R no-op runs a second as R independent jobs, then as R/2 chains a -> b, run by
            raftsched worker processes (nodes --slots 0): the nodes' CPU per run and the child's
            start after its parent's completion; then one parent with 10 000 children: the time
            until every child's run is committed, the commands it took, the leader's lone read and
            write latency meanwhile, leader changes (none allowed)
  peers     (full run only, or --only peers) the HA peers on the same work: APScheduler 4 with three
            schedulers on one PostgreSQL database, Celery beat + RedBeat with three beats on Redis
            (each with its defaults and tuned for HA) beside our three nodes: fires per second and
            lag at N jobs; K kill -9 of the active scheduler, a pause, a whole-set restart, with
            slots lost and fired twice counted from one sink format (benchlib/sink.py). Installs
            postgresql and redis-server with apt-get and the peers extra into a venv of its own
            when missing; a peer that cannot be installed or started is "not run: why"

--quick runs every scenario but peers small (about two minutes): writes, scale and e2e share one cluster.

Fire lag on our nodes comes from the fire-commit log: a node started with --fire-log <path>
(RAFTSCHED_FIRE_LOG=<path> in code from before that flag) appends {"c": commit_ms, "p": plan_ms, "s": [slot_ms, ...]} for each committed fire command while it
leads; each node gets its own path, and the bench reads all three. Code without that log is reported
as "no fire log", with the figures that do not need it.

Exit status: 0 when every scenario ran and every invariant held; 1 when a scenario failed outright
(no leader, a 5xx, a timeout, a node that died), a slot was lost or duplicated, or the code has a
fire log that stayed empty. A missing baseline does not fail the run.

The code is the package next to this file, scripts/benchlib/: harness.py (the clusters, over
raftsched/testing/), register.py, scenarios/ (one module each), checks.py, report.py and main.py
(the profiles and this command line).
"""
from __future__ import annotations

import sys
from pathlib import Path

# benchlib sits next to this file: scripts/ is on sys.path when this file runs as a script or is
# imported the way scripts/test.sh imports it; this covers any other importer.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from benchlib.common import ALL_SCENARIOS  # noqa: E402,F401  (read by scripts/test.sh)

if __name__ == "__main__":
    from benchlib.main import main
    sys.exit(main())
