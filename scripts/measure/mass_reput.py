"""Leader changes while every job of a large state is put again (a deploy), and after a kill -9 of the leader.

Usage:
    .venv/bin/python scripts/measure mass-reput                           # 1M jobs, 2 re-puts
    .venv/bin/python scripts/measure mass-reput --jobs 300000 --rounds 3
    .venv/bin/python scripts/measure mass-reput --git-ref HEAD~2          # the nodes run that commit
    .venv/bin/python scripts/measure mass-reput --code-dir /tmp/tree      # the nodes run that copy

Starts a three-node cluster (scripts/benchlib/harness.py: real node processes, free 127.0.0.1
ports, a temporary directory, ``--slots 0``), registers ``--jobs`` jobs on one ``0 * * * *``
slot through the bulk endpoint, puts every one of them again ``--rounds`` times (each round a
spec with another ``history``, so every put replaces its job), then kills the leader with
SIGKILL and watches the survivors for ``--watch-s`` seconds. Per phase it prints one JSON line:
its seconds, the elections it saw (the leader's term before and after, from GET /v1/cluster),
and from the node logs the elections each node won, its collections of 200 ms or more
(``gc.pause``) and its journal syncs of 200 ms or more (``replication.slow_sync``), with the
longest of each. At 1M jobs a node holds ~1.2 GB: the run needs ~4 GB and ~10
minutes. What it is for: a re-put leaves a stale entry in the leader's due index and a new
record a job, and both used to stall the leader at that scale (docs/benchmarks.md, "The leader's
due index without a stall").

Every process it starts is stopped by PID in a ``finally`` block. Exit status 1 if a request
failed or a node died before the kill.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import time

from benchlib import common
from benchlib.harness import BenchCluster, probe_cluster, stop_probe
from benchlib.register import register_jobs
from measure import Smoke

ARGPARSE = True
SMOKE = [Smoke(("--jobs", "200", "--rounds", "1", "--watch-s", "1"), "elections")]

SPEC = {"schedule": {"cron": "0 * * * *"}, "executor": {"type": "shell", "argv": ["true"]},
        "misfire": {"policy": "skip"}, "history": 1}
_ROLE = re.compile(r"role=leader was=candidate term=(\d+)")
_GC = re.compile(r"gc\.pause generation=(\d) ms=(\d+)")
_SYNC = re.compile(r"replication\.slow_sync ms=(\d+)")


def _terms(c: BenchCluster, nodes) -> dict:
    out = {}
    for i in nodes:
        st = c.status(i) or {}
        out[f"node-{i + 1}"] = st.get("term")
    return out


def _log_since(c: BenchCluster, offsets: dict) -> dict:
    """What each node logged since ``offsets`` (updated): elections won, long collections."""
    out = {}
    for i in range(c.n):
        path = c.log_path(i)
        with open(path, errors="replace") as f:
            f.seek(offsets.get(i, 0))
            text = f.read()
            offsets[i] = f.tell()
        pauses = [int(ms) for _, ms in _GC.findall(text)]
        syncs = [int(ms) for ms in _SYNC.findall(text)]
        out[f"node-{i + 1}"] = {"elections_won": len(_ROLE.findall(text)), "gc_pauses_200ms": len(pauses),
                                "gc_pause_ms_max": max(pauses, default=None), "slow_syncs": len(syncs),
                                "slow_sync_ms_max": max(syncs, default=None)}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/measure mass-reput", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2, help="times every job is put again")
    ap.add_argument("--watch-s", type=float, default=15.0, help="how long the survivors are watched after the kill")
    common.add_code_args(ap)
    args = ap.parse_args(argv)

    tmp, code, c = probe_cluster(args, "mass-reput")
    failed = False
    offsets: dict = {}
    try:
        c.start()
        leader = c.wait_leader(30)
        print(json.dumps({"code": code, "jobs": args.jobs, "rounds": args.rounds, "spec": SPEC}), flush=True)
        _log_since(c, offsets)
        phases = [("create", SPEC)] + [(f"re-put {r + 1}", dict(SPEC, history=2 + r)) for r in range(args.rounds)]
        for phase, spec in phases:
            leader = c.wait_leader(60)
            before = _terms(c, range(c.n))
            t0 = time.monotonic()
            reg = register_jobs(c, leader, [(f"m-{k}", spec) for k in range(args.jobs)], "bulk",
                                key_prefix=phase.replace(" ", ""))
            secs = time.monotonic() - t0
            dead = [i for i, p in c.procs.items() if p.poll() is not None]
            print(json.dumps({"phase": phase, "seconds": round(secs, 1), "jobs_per_s": round(args.jobs / secs),
                              "errors": reg["errors"][:3], "terms_before": before, "terms_after": _terms(c, range(c.n)),
                              "elections": _log_since(c, offsets), "dead_nodes": dead}), flush=True)
            if reg["errors"] or dead:
                failed = True
                return 1
        leader = c.wait_leader(60)
        before = _terms(c, range(c.n))
        c.kill(leader, signal.SIGKILL)
        rest = [i for i in range(c.n) if i != leader]
        t0 = time.monotonic()
        new = c.wait_leader(60, among=rest)
        elected = time.monotonic() - t0
        time.sleep(args.watch_s)  # ok-sleep: the window the survivors are watched in
        print(json.dumps({"phase": f"kill -9 of node-{leader + 1} (the leader)", "new_leader": f"node-{new + 1}",
                          "elected_after_s": round(elected, 2), "watched_s": args.watch_s,
                          "terms_before": before, "terms_after": _terms(c, rest),
                          "elections": _log_since(c, offsets)}), flush=True)
    finally:
        stop_probe(c, tmp, failed or args.keep)
    return 1 if failed else 0
