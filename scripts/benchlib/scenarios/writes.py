"""Writes: lone PUT latency to the leader and to a follower, then jobs registered per second by
concurrent clients (PUT per job, and the bulk endpoint when the nodes have it)."""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from raftsched.testing.cluster import LocalCluster

from ..common import BenchError, IDLE_SPEC, pct, summary
from ..harness import BenchCluster, Conn, NO_WORKER, check_alive, leader_checked, node_log_excerpt, start_cluster
from ..register import BULK_CONCURRENCY, BULK_PATH, CONCURRENCY, bulk_available, register_checked

def lone_writes(c: LocalCluster, n: int, warmup: int = 20) -> dict:
    """Sequential PUT /v1/jobs/w-N (a job that never falls due) from one client on one persistent
    connection, first to the leader, then to a follower; client-side time of each request."""
    leader, _ = leader_checked(c)
    follower = (leader + 1) % c.n
    out = {"spec": IDLE_SPEC, "n": n, "warmup": warmup}
    seq = 0
    for role, i in (("leader", leader), ("follower", follower)):
        conn = Conn(c.api_ports[i], token=c.token)
        try:
            for w in range(warmup):
                s, b = conn.request("PUT", f"/v1/jobs/w-warm-{role}-{w}", IDLE_SPEC)
                if s not in (200, 201):
                    raise BenchError(f"warm-up PUT on node-{i + 1} ({role}): {s} {b}")
            lat, statuses = [], {}
            t0 = time.perf_counter()
            for _ in range(n):
                body = IDLE_SPEC
                path = f"/v1/jobs/w-{seq}"
                seq += 1
                a = time.perf_counter()
                s, b = conn.request("PUT", path, body, retry=False)
                lat.append((time.perf_counter() - a) * 1000)
                statuses[s] = statuses.get(s, 0) + 1
                if s >= 500:
                    raise BenchError(f"PUT {path} on node-{i + 1} ({role}): {s} {b}\n" + node_log_excerpt(c, i))
            total = time.perf_counter() - t0
            check_alive(c, range(c.n))
            if set(statuses) != {201}:
                raise BenchError(f"writes to the {role}: statuses {statuses} (expected 201 only)")
            out[role] = {"node": f"node-{i + 1}", "latency_ms": summary(lat, 2), "statuses": statuses,
                         "writes_per_s": round(n / total, 1), "reconnects": conn.reconnects - 1}
            print(f"[bench] writes to the {role}: p50 {out[role]['latency_ms']['p50']} ms, "
                  f"p99 {out[role]['latency_ms']['p99']} ms", file=sys.stderr)
        finally:
            conn.close()
    return out


def paired_lone_writes(on: LocalCluster, off: LocalCluster, n: int, warmup: int = 20) -> dict:
    """Lone writes to two clusters at once, one request each in turn (``on`` first in even
    pairs, ``off`` first in odd ones), to the leader of each, then to a follower of each: what
    fsync adds to a lone write, from pairs of samples taken a few ms apart, so that the
    machine's drift (other work, the disk's state) falls on both alike. A figure of fresh
    clusters measured one after the other moves by more than the sync costs (docs/benchmarks.md,
    "Durability"). Each sample: client-side time of one PUT on a kept-alive connection.
    :returns: per role, each cluster's latency summary, and the median of the pairs'
    differences (on - off)."""
    out: dict = {"spec": IDLE_SPEC, "n": n, "warmup": warmup}
    seq = 0
    for role in ("leader", "follower"):
        conns = {}
        try:
            for key, c in (("on", on), ("off", off)):
                leader, _ = leader_checked(c)
                i = leader if role == "leader" else (leader + 1) % c.n
                conns[key] = (c, i, Conn(c.api_ports[i], token=c.token))
                for w in range(warmup):
                    s, b = conns[key][2].request("PUT", f"/v1/jobs/p-warm-{role}-{w}", IDLE_SPEC)
                    if s not in (200, 201):
                        raise BenchError(f"warm-up PUT on {key}'s node-{i + 1} ({role}): {s} {b}")
            lat: dict[str, list[float]] = {"on": [], "off": []}
            diffs = []
            for k in range(n):
                pair = {}
                for key in (("on", "off") if k % 2 == 0 else ("off", "on")):
                    c, i, conn = conns[key]
                    path = f"/v1/jobs/p-{seq}"
                    seq += 1
                    a = time.perf_counter()
                    s, b = conn.request("PUT", path, IDLE_SPEC, retry=False)
                    pair[key] = (time.perf_counter() - a) * 1000
                    if s != 201:
                        raise BenchError(f"PUT {path} on {key}'s node-{i + 1} ({role}): {s} {b}\n"
                                         + node_log_excerpt(c, i))
                    lat[key].append(pair[key])
                diffs.append(pair["on"] - pair["off"])
            for c, _, _ in conns.values():
                check_alive(c, range(c.n))
            out[role] = {"on": summary(lat["on"], 2), "off": summary(lat["off"], 2),
                         "added_median_ms": round(pct(diffs, 50), 3),
                         "nodes": {key: f"node-{i + 1}" for key, (_, i, _) in conns.items()}}
            print(f"[bench] paired lone writes to the {role}: p50 on {out[role]['on']['p50']} ms, off "
                  f"{out[role]['off']['p50']} ms; median of the pairs' differences {out[role]['added_median_ms']} ms",
                  file=sys.stderr)
        finally:
            for _, _, conn in conns.values():
                conn.close()
    return out


#: Concurrent readers of the reads figure (issue 26: "with 32 concurrent readers").
READERS = 32


def _read_all(c: LocalCluster, i: int, paths: list[str], stale: bool) -> tuple[list[float], dict]:
    """GET each of ``paths`` in turn on node ``i`` from one connection: client-side ms each."""
    conn = Conn(c.api_ports[i], token=c.token)
    lat, statuses = [], {}
    try:
        for path in paths:
            path += "?stale=true" if stale else ""
            a = time.perf_counter()
            s, b = conn.request("GET", path)
            lat.append((time.perf_counter() - a) * 1000)
            statuses[s] = statuses.get(s, 0) + 1
            if s != 200:
                raise BenchError(f"GET {path} on node-{i + 1}: {s} {b}\n" + node_log_excerpt(c, i))
    finally:
        conn.close()
    return lat, statuses


def reads(c: LocalCluster, n: int, per_reader: int) -> dict:
    """GET /v1/jobs/{name} on a follower: ``n`` sequential reads from one client, then
    ``per_reader`` reads from each of READERS concurrent clients; consistent (the default: a read
    barrier round, shared by the reads waiting at once, node/reads.py) and ``?stale=true`` beside
    it. The follower's barrier rounds (from its /metrics) say how many reads one round served."""
    leader, _ = leader_checked(c)
    follower = (leader + 1) % c.n
    names = [f"w-warm-leader-{k}" for k in range(20)]  # made by lone_writes

    def rounds() -> float:
        s, text = Conn(c.api_ports[follower], token=c.token).request("GET", "/metrics")
        line = [x for x in str(text).splitlines() if x.startswith("raftsched_read_barrier_rounds_total ")]
        return float(line[0].split()[1]) if s == 200 and line else float("nan")

    out: dict = {"node": f"node-{follower + 1}", "path": "/v1/jobs/{name}", "n": n, "readers": READERS,
                 "per_reader": per_reader}
    for stale in (False, True):
        key = "stale" if stale else "consistent"
        r0 = rounds()
        t0 = time.perf_counter()
        lat, _ = _read_all(c, follower, [f"/v1/jobs/{names[k % len(names)]}" for k in range(n)], stale)
        alone = {"latency_ms": summary(lat, 2), "reads_per_s": round(n / (time.perf_counter() - t0), 1)}
        r1 = rounds()
        with ThreadPoolExecutor(READERS) as pool:
            t0 = time.perf_counter()
            parts = list(pool.map(lambda w, st=stale: _read_all(
                c, follower, [f"/v1/jobs/{names[(w + k) % len(names)]}" for k in range(per_reader)], st)[0],
                range(READERS)))
            took = time.perf_counter() - t0
        r2 = rounds()
        lat = [v for part in parts for v in part]
        together = {"latency_ms": summary(lat, 2), "reads_per_s": round(len(lat) / took, 1)}
        if not stale:
            alone["barrier_rounds"] = r1 - r0
            together["barrier_rounds"] = r2 - r1
            together["reads_per_round"] = round(len(lat) / max(1.0, r2 - r1), 1)
        out[key] = {"alone": alone, f"{READERS}_readers": together}
        print(f"[bench] {key} reads on a follower: alone p50 {alone['latency_ms']['p50']} ms, p99 "
              f"{alone['latency_ms']['p99']} ms; {READERS} readers p50 {together['latency_ms']['p50']} ms, "
              f"p99 {together['latency_ms']['p99']} ms", file=sys.stderr)
    check_alive(c, range(c.n))
    return out


def writes(tmp: Path, p: dict, clusters: list, shared: BenchCluster | None = None) -> dict:
    """Lone writes (above), then jobs registered per second through the API: CONCURRENCY clients
    sending PUT /v1/jobs/{name}, and the bulk endpoint when the nodes have it. On ``shared`` when
    given (a quick run), else on a cluster of its own with no workers."""
    c = shared or start_cluster(tmp, "writes", clusters, NO_WORKER)
    out = lone_writes(c, p["writes"])
    out["cluster"] = c.tmp.name + ("" if shared is None else f" (shared, node args {c.extra_args})")
    out["reads"] = reads(c, p["reads"], p["reads_per_reader"])
    leader, _ = leader_checked(c)
    n_put = p["writes_register_put"]
    reg = register_checked(c, leader, [(f"wr-{k}", IDLE_SPEC) for k in range(n_put)],
                           f"writes: registration ({CONCURRENCY} PUT clients)", method="put")
    out["register_put"] = {k: v for k, v in reg.items() if k != "ended_at"}
    if bulk_available(c, leader):
        n_bulk = p["writes_register_bulk"]
        reg = register_checked(c, leader, [(f"wb-{k}", IDLE_SPEC) for k in range(n_bulk)],
                               f"writes: registration (bulk, {BULK_CONCURRENCY} clients)", method="bulk")
        out["register_bulk"] = {k: v for k, v in reg.items() if k != "ended_at"}
    else:
        out["register_bulk"] = {"not_run": f"the nodes have no bulk endpoint (POST {BULK_PATH}: 404/405)"}
    return out
