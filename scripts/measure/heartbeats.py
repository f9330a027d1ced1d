"""What a busy fleet's heartbeats cost the nodes: N workers, each holding a lease of a long run,
heartbeating it through the worker protocol.

Usage:
    .venv/bin/python scripts/measure heartbeats                        # 600 workers
    .venv/bin/python scripts/measure heartbeats --workers 200 --window-s 10
    .venv/bin/python scripts/measure heartbeats --git-ref HEAD~3       # the nodes run that commit

Starts a three-node cluster (scripts/benchlib/harness.py: real node processes, free 127.0.0.1
ports, a temporary directory, ``--slots 0``), registers N one-shot shell jobs due two seconds
later, and has N simulated workers in this process (one aiohttp session, each worker an HTTP
client of the worker protocol, spread over the nodes) each lease one of their runs, with a lease
TTL of ``--ttl-s`` (10 s, the worker's default), and then heartbeat it as ``raftsched worker``
does: every third of the TTL, at most every second, or as long as the node's answer asks
(``next_heartbeat_s``, spread over its last fifth), never longer than a quarter of the TTL. After
a warm-up of ``--warmup-s`` it counts the heartbeats answered and the three nodes' CPU (their
processes and children) for ``--window-s``, and prints one JSON line: heartbeats a second, the
nodes' CPU in % of one core and in us a heartbeat, the answers' latency, the intervals the nodes
asked for, and the leases reported lost (none expected). The simulator's own CPU is not counted.

Every process it starts is stopped by PID in a ``finally`` block. Exit status 1 if a lease was
lost or a request failed.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import time
from datetime import datetime, timezone

from benchlib.harness import probe_cluster, stop_probe
from benchlib.probes import cluster_cpu_s
from benchlib import common
from measure import Smoke

ARGPARSE = True
SMOKE = [Smoke(("--workers", "20", "--warmup-s", "2", "--window-s", "2"), "heartbeats_per_s")]


async def _fleet(c, token: str, args, out: dict) -> None:
    import aiohttp  # the project's own HTTP library, as the worker's

    n, ttl_ms = args.workers, int(args.ttl_s * 1000)
    longest = ttl_ms / 1000 / 4  # (what a node may ask for at the most: worker/limits.py)
    own = min(longest, 1.0)
    counts = {"sent": 0, "failed": 0}
    lost: list[str] = []
    latency: list[float] = []
    asked: collections.Counter = collections.Counter()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}, connector=conn) as sess:
        held: dict[int, list] = {}
        for k in range(n):
            body = {"max": 1, "wait_s": 5, "ttl_ms": ttl_ms, "slots": 1, "executors": ["shell"],
                    "queues": None, "labels": {}, "version": "measure", "instance": f"i{k}"}
            async with sess.post(f"{c.url(k % c.n)}/v1/workers/w{k}/lease", json=body) as r:
                b = await r.json()
                if r.status != 200 or not b.get("runs"):
                    raise SystemExit(f"worker w{k}: no run leased: {r.status} {str(b)[:300]}")
                g = b["runs"][0]
                held[k] = [[g["id"], g["token"]]]
        stop = asyncio.Event()

        async def worker(k: int) -> None:
            rng = random.Random(k)
            await asyncio.sleep(own * k / n)  # ok-sleep: the workers' heartbeats spread over an interval
            url = f"{c.url(k % c.n)}/v1/workers/w{k}/heartbeat"
            while not stop.is_set():
                t0 = time.monotonic()
                hint = None
                try:
                    async with sess.post(url, json={"leases": held[k], "ttl_ms": ttl_ms}) as r:
                        b = await r.json()
                    if r.status != 200:
                        counts["failed"] += 1
                    else:
                        counts["sent"] += 1
                        latency.append(time.monotonic() - t0)
                        lost.extend(b.get("lost") or [])
                        hint = b.get("next_heartbeat_s")
                        asked[hint] += 1
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    counts["failed"] += 1
                wait = own if not hint or hint <= own else min(longest, max(own, hint * rng.uniform(0.8, 1.0)))
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                except asyncio.TimeoutError:
                    pass

        tasks = [asyncio.create_task(worker(k)) for k in range(n)]
        await asyncio.sleep(args.warmup_s)  # ok-sleep: the fleet settles at the intervals asked for
        cpu0, sent0, lat0 = cluster_cpu_s(c), counts["sent"], len(latency)
        await asyncio.sleep(args.window_s)  # ok-sleep: the measurement window
        cpu1, sent1 = cluster_cpu_s(c), counts["sent"]
        window_lat = sorted(latency[lat0:])
        stop.set()
        await asyncio.gather(*tasks)
    beats = sent1 - sent0
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0

    def pct(q: float) -> float | None:
        return round(1000 * window_lat[min(len(window_lat) - 1, int(q * len(window_lat)))], 1) if window_lat else None

    out.update({"heartbeats_per_s": round(beats / args.window_s, 1),
                "node_cpu_pct_of_one_core": None if cpu is None else round(100 * cpu / args.window_s, 1),
                "node_cpu_us_a_heartbeat": None if cpu is None or not beats else round(1e6 * cpu / beats),
                "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
                "asked_intervals_s": {str(k): v for k, v in asked.most_common(4)},
                "lost": len(lost), "failed": counts["failed"]})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/measure heartbeats", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=600)
    ap.add_argument("--ttl-s", type=float, default=10.0, help="the workers' lease TTL")
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--window-s", type=float, default=10.0)
    common.add_code_args(ap)
    args = ap.parse_args(argv)

    tmp, code, c = probe_cluster(args, "heartbeats")
    out: dict = {"code": code, "workers": args.workers, "ttl_s": args.ttl_s}
    failed = False
    try:
        c.start()
        leader = c.wait_leader(30)
        token = c.token_file.read_text().strip()
        at = datetime.fromtimestamp(time.time() + 2, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        spec = {"schedule": {"at": at}, "misfire": {"policy": "fire_all"},
                "executor": {"type": "shell", "argv": ["sleep", "3600"]}}
        names = [f"hb-{k}" for k in range(args.workers)]
        for i in range(0, len(names), 500):
            s, b = c.call(leader, "POST", "/v1/jobs:batch", {"jobs": {nm: spec for nm in names[i:i + 500]}})
            if s not in (200, 201):
                raise SystemExit(f"POST /v1/jobs:batch: {s} {str(b)[:300]}")
        time.sleep(3)  # ok-sleep: the one-shot slot (2 s ahead) comes and its runs queue
        asyncio.run(_fleet(c, token, args, out))
        print(json.dumps(out), flush=True)
        failed = bool(out["lost"] or out["failed"])
    finally:
        stop_probe(c, tmp, failed or args.keep)
    return 1 if failed else 0
