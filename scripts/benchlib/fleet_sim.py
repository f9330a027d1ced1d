"""Simulated remote workers for the benchmark's fleet-at-rest scenario: many workers in one
process, each a real HTTP client of the worker protocol (docs/api.md), on one asyncio loop.

    python scripts/benchlib/fleet_sim.py --url URL[,URL...] --token-file F --workers N
        --prefix sim-0- --queue rest --out results.json

Worker k (id PREFIX + k) keeps one lease request waiting at a node (``wait_s`` 20, or longer when
an idle answer asks for it with ``next_wait_s``, spread as ``raftsched worker`` spreads it; one run
at a time), spread over the nodes by k; a run it is granted is "started" at once (its receipt time is
recorded: the time from the run becoming due to a worker starting it) and completed. Until
SIGTERM; then it writes ``{"workers", "received": [[run, slot_ms, receipt_ms, node, acquired_ms, answered_ms]...], "leases", "idle_answers_ms",
"errors", "error_kinds", "rss_kib"}`` to --out and exits 0. Standard library plus aiohttp (the project's)."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import signal
import time
import urllib.parse

import aiohttp


def rss_kib() -> int | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def raise_nofile(need: int) -> None:
    """A descriptor for each worker's connection and some to spare: the soft limit up to the hard
    one, and the hard one too when that is short (the benchmark runs as root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            return
        except (ValueError, OSError):
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _kind(out: dict, kind: str) -> None:
    """Count an error by its kind (an HTTP status, an exception's class)."""
    out["error_kinds"][kind] = out["error_kinds"].get(kind, 0) + 1


async def worker(k: int, args, session: aiohttp.ClientSession, urls: list[str], out: dict, stop: asyncio.Event) -> None:
    wid = f"{args.prefix}{k}"
    # Connections ramp up (--connect-per-s), so that thousands of SYNs do not overflow a backlog.
    await asyncio.sleep(k / args.connect_per_s)
    base = urls[k % len(urls)] + "/v1/workers/" + urllib.parse.quote(wid, safe="")
    body = {"slots": 1, "executors": ["python"], "queues": [args.queue], "labels": {}, "version": "sim",
            "instance": f"{args.prefix}{k}", "max": 1, "wait_s": args.wait_s, "ttl_ms": 10_000}
    rng = random.Random(k)
    asked = None  # the node's last next_wait_s (as raftsched worker: worker/remote.py lease_wait_s)
    while not stop.is_set():
        body["wait_s"] = args.wait_s if asked is None else round(max(args.wait_s, asked * rng.uniform(0.8, 1.0)), 3)
        timeout = aiohttp.ClientTimeout(total=body["wait_s"] + 15)
        try:
            async with session.post(base + "/lease", json=body, timeout=timeout) as r:
                data = await r.json(content_type=None)
                recv = time.time_ns() / 1e6
                if r.status != 200:
                    out["errors"] += 1
                    _kind(out, str(r.status))
                    await asyncio.sleep(1.0)
                    continue
            out["leases"] += 1
            runs = data.get("runs") or []
            if not runs:
                out["idle_answers_ms"].append(round(recv))
                hint = data.get("next_wait_s")
                asked = min(float(hint), 60.0) if isinstance(hint, (int, float)) and hint > args.wait_s else None
                continue
            for g in runs:
                # the acquire's time (its command's now, by the proposing node's clock): the lease's
                # deadline less its ttl; and when the node answered (its cluster_ms: None if absent)
                out["received"].append([g["id"], g["slot"], round(recv, 1), k % len(urls), g["deadline"] - body["ttl_ms"],
                                        data.get("cluster_ms")])
            results = [{"run": g["id"], "token": g["token"], "success": True} for g in runs]
            async with session.post(base + "/complete", json={"results": results}, timeout=timeout) as r:
                await r.read()
                if r.status != 200:
                    out["errors"] += 1
                    _kind(out, f"complete {r.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            out["errors"] += 1
            _kind(out, type(e).__name__)
            await asyncio.sleep(1.0)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--queue", default="rest")
    ap.add_argument("--wait-s", type=float, default=20.0)
    ap.add_argument("--connect-per-s", type=float, default=2000.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    raise_nofile(args.workers + 256)
    urls = [u.rstrip("/") for u in args.url.split(",") if u.strip()]
    token = open(args.token_file).read().strip()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    out = {"workers": args.workers, "received": [], "leases": 0, "errors": 0, "error_kinds": {}, "idle_answers_ms": []}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {token}"}) as session:
        tasks = [asyncio.create_task(worker(k, args, session, urls, out, stop)) for k in range(args.workers)]
        await stop.wait()
        out["rss_kib"] = rss_kib()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    asyncio.run(main())
