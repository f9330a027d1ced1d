#!/usr/bin/env python3
"""raftsched benchmarks, first cut: fail-over, lone write latency, burst commit rate.

Usage:  .venv/bin/python scripts/bench.py [--quick] [--out bench-results.json]

Starts its own three-node clusters (real node processes, tests/procs.py) on free 127.0.0.1
ports in a temporary directory, and stops every process it started, by PID, whatever happens.
Prints a Markdown table and writes every figure (and each fail-over trial) as JSON to --out.
What each figure means, exactly, is in docs/benchmarks.md; the short version is in the
docstring of each scenario below.

Exit status: 0 when every scenario ran and every invariant held; 1 when a scenario failed
outright (no leader, a 5xx, a timeout, a node that died) or a slot was lost or duplicated.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timedelta, timezone
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from procs import Cluster, wait_for  # noqa: E402  (tests/procs.py: real nodes, stop by PID)

HOST = "127.0.0.1"  # every cluster and every request stays on loopback
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SHELL_TRUE = {"type": "shell", "argv": ["true"]}
FAILOVER_SPEC = {"schedule": {"every_s": 1}, "executor": SHELL_TRUE, "misfire": {"policy": "fire_all"}, "history": 1000}
#: A job that never falls due during the benchmark: writes measure the write path only.
IDLE_SPEC = {"schedule": {"at": "2099-01-01T00:00:00Z"}, "executor": SHELL_TRUE, "misfire": {"policy": "skip"}}

PROFILES = {
    "quick": {"failover_trials": 5, "writes": 200, "burst_jobs": 2000},
    "full": {"failover_trials": 20, "writes": 1000, "burst_jobs": 20000},
}
POLL_FAILOVER_S = 0.010
POLL_BURST_S = 0.050
CONCURRENCY = 32
BURST_QUEUE = "bench-burst"
WRITES_BURST_NODE_ARGS = ("--slots", "0")


class BenchError(Exception):
    """A scenario failed outright."""


# ------------------------------------------------------------------------------------ helpers

def wall_ms() -> float:
    return time.time_ns() / 1e6


def iso_ms(text: str | None) -> int | None:
    if text is None:
        return None
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (dt - EPOCH) // timedelta(milliseconds=1)


def iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pct(values, p: float):
    """Nearest-rank percentile (p99 of fewer than 100 values is the maximum)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summary(values, digits: int = 1) -> dict:
    if not values:
        return {"n": 0}
    r = lambda v: round(v, digits)  # noqa: E731
    return {"n": len(values), "min": r(min(values)), "p50": r(pct(values, 50)), "p99": r(pct(values, 99)),
            "max": r(max(values)), "mean": r(sum(values) / len(values))}


class Conn:
    """One persistent HTTP/1.1 connection to a node's API (http.client), so that a timed request
    measures the request only, not a TCP handshake."""

    def __init__(self, port: int, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.port = port
        self.token = token
        self.timeout_s = timeout_s
        self.c: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def _conn(self) -> http.client.HTTPConnection:
        if self.c is None:
            self.c = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout_s)
            self.c.connect()
            self.reconnects += 1
        return self.c

    def request(self, method: str, path: str, body=None, headers: dict | None = None, retry: bool = True):
        """Returns (status, parsed JSON or text). Retries once on a dropped keep-alive connection
        when ``retry`` (reads only: never for a timed write)."""
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            try:
                c = self._conn()
                c.request(method, path, body=data, headers=hdrs)
                r = c.getresponse()
                raw = r.read()
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt or not retry:
                    raise
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode(errors="replace")

    def get(self, path: str):
        return self.request("GET", path)

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


def node_log_excerpt(c: Cluster, i: int, n: int = 30) -> str:
    return f"--- node-{i + 1} ({c.data_dir(i) / 'node.log'}), last {n} lines ---\n{c.log_tail(i, n)}"


def check_alive(c: Cluster, expected) -> None:
    dead = [i for i in expected if i not in c.alive()]
    if dead:
        raise BenchError("node(s) died: " + ", ".join(f"node-{i + 1} (exit {c.procs[i].returncode})" for i in dead)
                         + "\n" + "\n".join(node_log_excerpt(c, i) for i in dead))


#: Where the nodes' code comes from: the working tree (default) or an exported commit (--git-ref).
CODE_DIR = REPO


class BenchCluster(Cluster):
    """tests/procs.Cluster with extra arguments for every node (e.g. ``--slots 0``), started from
    CODE_DIR (cwd and PYTHONPATH), so a benchmark can run a fixed commit while the tree changes."""

    def __init__(self, tmp: Path, extra_args: tuple = (), **kw) -> None:
        super().__init__(tmp, env={"PYTHONPATH": str(CODE_DIR)}, **kw)
        self.extra_args = list(extra_args)

    def argv(self, i: int) -> list[str]:
        return super().argv(i) + self.extra_args

    def start(self, i: int | None = None) -> None:
        # procs.Cluster.start, with cwd=CODE_DIR: ``python -m raftsched.cli`` imports from its cwd.
        for j in ([i] if i is not None else range(self.n)):
            self.data_dir(j).mkdir(parents=True, exist_ok=True)
            log = open(self.data_dir(j) / "node.log", "ab")
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
            self.procs[j] = subprocess.Popen(self.argv(j), stdout=log, stderr=subprocess.STDOUT, cwd=CODE_DIR, env=env)
            log.close()


def start_cluster(tmp: Path, name: str, clusters: list, extra_args: tuple = ()) -> Cluster:
    (tmp / name).mkdir(parents=True)
    c = BenchCluster(tmp / name, extra_args)
    clusters.append(c)  # registered before start: the finally block stops whatever started
    t0 = time.monotonic()
    c.start()
    try:
        c.wait_leader(30)
    except AssertionError as e:
        raise BenchError(f"{name}: no leader within 30 s: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
    print(f"[bench] {name}: 3 nodes up, leader elected in {time.monotonic() - t0:.1f} s "
          f"(API ports {c.api_ports}; extra node args {list(extra_args)})", file=sys.stderr)
    return c


def leader_checked(c: Cluster, timeout_s: float = 30) -> tuple[int, dict]:
    """The agreed leader and its /v1/cluster body; its reported pid must be the one we started."""
    try:
        i = c.wait_leader(timeout_s)
    except AssertionError as e:
        raise BenchError(f"no agreed leader: {e}") from None
    st = c.status(i)
    if st is None or st.get("pid") != c.procs[i].pid:
        raise BenchError(f"node-{i + 1} reports pid {st and st.get('pid')} but we started pid {c.procs[i].pid}")
    return i, st


def put_ok(c: Cluster, i: int, name: str, spec: dict) -> None:
    s, b = c.call(i, "PUT", f"/v1/jobs/{name}", spec)
    if s not in (200, 201):
        raise BenchError(f"PUT /v1/jobs/{name} on node-{i + 1}: {s} {b}")


# ------------------------------------------------------------------------------------ 1. fail-over

def slot_audit(runs: list[dict], every_ms: int) -> dict:
    """Lost and duplicated slots in one job's history (runs and records, any order).

    lost: slots on the job's grid between the first and the last slot that are neither a run nor
    inside a record. duplicated: slots that are two runs, or a run and a record, or two records.
    """
    count: dict[int, int] = {}
    for r in runs:
        if r.get("kind") == "manual":
            continue
        lo = r["slot_ms"]
        hi = iso_ms(r["slot_to"]) if r["state"] in ("skipped", "coalesced") and "slot_to" in r else lo
        for s in range(lo, hi + 1, every_ms):
            count[s] = count.get(s, 0) + 1
    if not count:
        return {"slots": 0, "first": None, "last": None, "last_ms": None, "lost": 0, "duplicated": 0,
                "off_grid": 0, "records": 0, "lost_examples": [], "duplicated_examples": []}
    lo, hi = min(count), max(count)
    lost = [s for s in range(lo, hi + 1, every_ms) if s not in count]
    dup = [s for s, n in count.items() if n > 1]
    return {
        "slots": len(count), "first": iso(lo), "last": iso(hi), "last_ms": hi,
        "lost": len(lost), "duplicated": len(dup), "off_grid": sum(1 for s in count if (s - lo) % every_ms),
        "records": sum(1 for r in runs if r["state"] in ("skipped", "coalesced")),
        "lost_examples": [iso(s) for s in lost[:5]], "duplicated_examples": [iso(s) for s in dup[:5]],
    }


def failover(tmp: Path, trials: int, clusters: list, n_jobs: int = 3) -> dict:
    """kill -9 the leader ``trials`` times; per trial, the time from the SIGKILL until a survivor's
    API shows the first run whose fired_at is later than the kill (polled every 10 ms).

    Kill times are spread over the second (phase k/trials of a whole second), because the figure
    includes waiting for the next due slot when the election ends before it."""
    c = start_cluster(tmp, "failover", clusters)
    leader, _ = leader_checked(c)
    jobs = [f"fo-{k}" for k in range(n_jobs)]
    for j in jobs:
        put_ok(c, leader, j, FAILOVER_SPEC)
    wait_for(lambda: all(len(c.get(leader, f"/v1/jobs/{j}/runs?limit=5")[1]["runs"]) >= 2 for j in jobs), 20,
             "first runs of the fail-over jobs")
    out_trials = []
    for k in range(trials):
        leader, st = leader_checked(c)
        survivors = [i for i in range(c.n) if i != leader]
        conns = {i: Conn(c.api_ports[i]) for i in survivors}
        try:
            # Steady state: the current leader has fired since the last restart caught up.
            t_ready = wall_ms()
            wait_for(lambda: any(iso_ms(r["fired_at"]) > t_ready for r in conns[survivors[0]].get("/v1/runs?limit=10")[1]["runs"]),
                     10, "a fire by the current leader before the kill", interval_s=0.02)
            # Kill at phase k/trials of a second.
            phase_ms = (k * 1000) // trials
            now = wall_ms()
            target = (now // 1000 + 1) * 1000 + phase_ms
            if target - now < 50:
                target += 1000
            time.sleep((target - wall_ms()) / 1000)  # ok-sleep: choosing the kill's phase
            pid = c.procs[leader].pid
            os.kill(pid, signal.SIGKILL)
            t_kill = wall_ms()
            t_kill_mono = time.perf_counter()
            c.procs[leader].wait(timeout=15)
            elected = None
            first = None
            deadline = t_kill_mono + 30
            while first is None:
                if time.perf_counter() > deadline:
                    raise BenchError(f"trial {k}: no run fired within 30 s of killing node-{leader + 1}\n"
                                     + "\n".join(node_log_excerpt(c, i) for i in survivors))
                tick = time.perf_counter()
                for i in survivors:
                    try:
                        if elected is None:
                            s, b = conns[i].get("/v1/cluster")
                            if s == 200 and b.get("role") == "leader" and b.get("term", 0) > st["term"]:
                                elected = {"ms": (time.perf_counter() - t_kill_mono) * 1000, "node": b["node"], "term": b["term"]}
                        s, b = conns[i].get("/v1/runs?limit=10")
                        seen = time.perf_counter()
                    except (OSError, http.client.HTTPException):
                        continue
                    if s != 200:
                        raise BenchError(f"trial {k}: GET /v1/runs on node-{i + 1}: {s} {b}")
                    hits = [r for r in b["runs"] if iso_ms(r["fired_at"]) > t_kill]
                    if hits:
                        r = min(hits, key=lambda r: iso_ms(r["fired_at"]))
                        fired_at = iso_ms(r["fired_at"])
                        first = {"observed_ms": round((seen - t_kill_mono) * 1000, 1), "via": f"node-{i + 1}",
                                 "run": r["id"], "slot": r["slot"], "fired_at": r["fired_at"],
                                 "fired_at_minus_kill_ms": round(fired_at - t_kill, 1),
                                 "slot_minus_kill_ms": round(r["slot_ms"] - t_kill, 1)}
                        break
                check_alive(c, survivors)
                rest = POLL_FAILOVER_S - (time.perf_counter() - tick)
                if first is None and rest > 0:
                    time.sleep(rest)  # ok-sleep: the 10 ms poll interval
            trial = {
                "trial": k, "killed": f"node-{leader + 1}", "killed_pid": pid, "old_term": st["term"],
                "kill_at": iso(t_kill), "kill_phase_ms": round(t_kill % 1000),
                "election_observed_ms": None if elected is None else round(elected["ms"], 1),
                "new_leader": None if elected is None else elected["node"],
                "new_term": None if elected is None else elected["term"], **first,
            }
            # The unavoidable part: a slot due after the kill cannot be fired before it is due.
            trial["observed_minus_slot_wait_ms"] = round(first["observed_ms"] - max(0.0, first["slot_minus_kill_ms"]), 1)
            # Restart the killed node on its data dir; wait until it has applied what the leader had
            # committed when we looked, and every node agrees on one leader.
            t_restart = time.monotonic()
            c.start(leader)

            def caught_up():
                lead = c.leader()
                if lead is None:
                    return False
                target_ci = c.status(lead)["commit_index"]
                me = c.status(leader)
                return me is not None and me["last_applied"] >= target_ci

            try:
                wait_for(caught_up, 60, f"node-{leader + 1} to rejoin and catch up", interval_s=0.05)
            except AssertionError as e:
                raise BenchError(f"trial {k}: {e}\n" + node_log_excerpt(c, leader)) from None
            check_alive(c, range(c.n))
            trial["restart_catch_up_s"] = round(time.monotonic() - t_restart, 2)
            out_trials.append(trial)
            print(f"[bench] fail-over trial {k + 1}/{trials}: killed node-{leader + 1} at phase {trial['kill_phase_ms']} ms; "
                  f"leader {trial['new_leader']} seen at {trial['election_observed_ms']} ms; first fire seen at "
                  f"{first['observed_ms']} ms (slot {first['slot_minus_kill_ms']:+.0f} ms vs kill); "
                  f"rejoined in {trial['restart_catch_up_s']} s", file=sys.stderr)
        finally:
            for cn in conns.values():
                cn.close()
    t_end = wall_ms()
    # Audit every job's whole history on every replica, after a barrier (consistent=true).
    audits = {}
    problems = []
    for i in range(c.n):
        for j in jobs:
            s, b = c.get(i, f"/v1/jobs/{j}/runs?limit=100000&consistent=true")
            if s != 200:
                raise BenchError(f"audit: GET /v1/jobs/{j}/runs on node-{i + 1}: {s} {b}")
            a = slot_audit(b["runs"], 1000)
            a["entries"] = len(b["runs"])
            audits[f"node-{i + 1}/{j}"] = a
            if a["lost"] or a["duplicated"] or a.get("off_grid"):
                problems.append(f"node-{i + 1}/{j}: lost {a['lost']} {a['lost_examples']}, duplicated {a['duplicated']} "
                                f"{a['duplicated_examples']}, off-grid {a.get('off_grid')}")
            if a["last_ms"] is None or a["last_ms"] < t_end - 5000:
                problems.append(f"node-{i + 1}/{j}: last slot {a['last']} is more than 5 s before the end of the run")
    obs = [t["observed_ms"] for t in out_trials]
    return {
        "trials": out_trials,
        "jobs": len(jobs), "job_spec": FAILOVER_SPEC,
        "first_fire_observed_ms": summary(obs),
        "election_observed_ms": summary([t["election_observed_ms"] for t in out_trials if t["election_observed_ms"] is not None]),
        "observed_minus_slot_wait_ms": summary([t["observed_minus_slot_wait_ms"] for t in out_trials]),
        "restart_catch_up_s": summary([t["restart_catch_up_s"] for t in out_trials], 2),
        "slots_lost": sum(a["lost"] for a in audits.values()),
        "slots_duplicated": sum(a["duplicated"] for a in audits.values()),
        "slots_audited": sum(a["slots"] for a in audits.values()),
        "audit": audits, "problems": problems,
    }


# ------------------------------------------------------------------------------------ 2. writes

def lone_writes(c: Cluster, n: int, warmup: int = 20) -> dict:
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


# ------------------------------------------------------------------------------------ 3. burst

async def _register(port: int, token: str, items: list[tuple[str, dict]]) -> dict:
    """PUT every (name, spec) with CONCURRENCY requests in flight; per-request latency and the
    wall second in which each one completed. 503/504 are retried with the same Idempotency-Key."""
    import aiohttp

    base = f"http://{HOST}:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    lat, done_at, statuses, errors = [], [], {}, []
    retries = 0
    it = iter(enumerate(items))

    async def worker(session):
        nonlocal retries
        for k, (name, spec) in it:
            key = f"bench-{name}"
            for attempt in range(6):
                a = time.perf_counter()
                async with session.put(f"{base}/v1/jobs/{name}", json=spec,
                                       headers={**headers, "Idempotency-Key": key}) as r:
                    body = await r.read()
                    s = r.status
                statuses[s] = statuses.get(s, 0) + 1
                if s in (503, 504) and attempt < 5:
                    retries += 1
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                break
            lat.append((time.perf_counter() - a) * 1000)
            done_at.append(time.time())
            if s not in (200, 201):
                errors.append(f"{name}: {s} {body[:300]!r}")

    t0 = time.perf_counter()
    conn = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
    total = time.perf_counter() - t0
    per_sec: dict[int, int] = {}
    for t in done_at:
        per_sec[int(t)] = per_sec.get(int(t), 0) + 1
    secs = sorted(per_sec)
    full_secs = [per_sec[s] for s in secs[1:-1]]  # whole seconds only (the first and last are partial)
    return {"n": len(items), "seconds": round(total, 2), "jobs_per_s": round(len(items) / total, 1),
            "per_whole_second": {"min": min(full_secs), "max": max(full_secs)} if full_secs else None,
            "per_second_series": [per_sec[s] for s in secs],
            "latency_ms": summary(lat, 1), "statuses": statuses, "retries_503_504": retries,
            "errors": errors[:10], "error_count": len(errors), "ended_at": time.time()}


def burst(c: Cluster, m: int) -> dict:
    """M one-shot jobs due at the same instant T; how long the leader takes to commit all M slots.

    The jobs are registered first (32 concurrent PUTs), with T far enough ahead that the last
    registration ends before it. From T-1 s, the leader's GET /v1/cluster is sampled every 50 ms:
    ``runs`` (entries in its applied state) shows slots being committed and applied;
    ``trigger.slots_fired`` moves once, when the whole tick's fire commands have returned."""
    leader, st0 = leader_checked(c)
    lport = c.api_ports[leader]
    # A queue deep enough for the whole burst (the default depth is 10,000).
    depth = max(m, 10_000)
    s_, b_ = c.call(leader, "PUT", f"/v1/queues/{BURST_QUEUE}", {"max_depth": depth, "on_full": "reject"})
    if s_ not in (200, 201):
        raise BenchError(f"burst: PUT /v1/queues/{BURST_QUEUE}: {s_} {b_}")
    # Calibrate the registration rate with a few idle jobs, then pick T.
    ncal = max(64, min(256, m // 8))
    cal = asyncio.run(_register(lport, c.token, [(f"bc-{k}", IDLE_SPEC) for k in range(ncal)]))
    if cal["error_count"]:
        raise BenchError(f"burst calibration: {cal['error_count']} errors: {cal['errors']}")
    est_s = m / cal["jobs_per_s"]
    t_slot = (math.ceil(time.time() + est_s * 1.5 + 2.0)) * 1000
    spec = {"schedule": {"at": iso(t_slot)}, "executor": SHELL_TRUE, "misfire": {"policy": "fire_all"}, "queue": BURST_QUEUE}
    print(f"[bench] burst: calibration {cal['jobs_per_s']} jobs/s; registering {m} jobs due at {iso(t_slot)} "
          f"(~{est_s:.1f} s of registration expected)", file=sys.stderr)
    reg = asyncio.run(_register(lport, c.token, [(f"b-{k}", spec) for k in range(m)]))
    check_alive(c, range(c.n))
    if reg["error_count"]:
        raise BenchError(f"burst registration: {reg['error_count']} errors: {reg['errors']}\n" + node_log_excerpt(c, leader))
    if reg["statuses"].get(500):
        raise BenchError(f"burst registration: 500s {reg['statuses']}\n" + node_log_excerpt(c, leader))
    margin_ms = t_slot - reg["ended_at"] * 1000
    if margin_ms < 300:
        raise BenchError(f"burst registration ended {(-margin_ms):.0f} ms after the slot: slower than calibrated; no clean burst")
    print(f"[bench] burst: registered {m} jobs in {reg['seconds']} s ({reg['jobs_per_s']} jobs/s); "
          f"slot in {margin_ms / 1000:.1f} s", file=sys.stderr)
    # A leader change while registering is recorded (a warning), and the burst is measured on
    # whichever node leads now.
    leader_before, term_before = leader, st0["term"]
    leader, st0 = leader_checked(c)
    lport = c.api_ports[leader]
    changed = None
    if st0["term"] != term_before:
        changed = {"leader_before": f"node-{leader_before + 1}", "term_before": term_before,
                   "leader_after": f"node-{leader + 1}", "term_after": st0["term"]}
        print(f"[bench] burst: WARNING leadership changed during registration: {changed}", file=sys.stderr)
    # Sample the leader's counters from T-1 s.
    time.sleep(max(0.0, (t_slot - 1000 - wall_ms()) / 1000))  # ok-sleep: until just before the slot
    conn = Conn(lport)
    samples = []
    leader_changes = []
    base = None
    cur_leader, cur_term = leader, st0["term"]
    try:
        deadline = time.monotonic() + max(60.0, m / 100)
        while True:
            tick = time.perf_counter()
            try:
                s, b = conn.get("/v1/cluster")
            except (OSError, http.client.HTTPException) as e:
                s, b = None, repr(e)
            t = wall_ms()
            if s != 200:
                raise BenchError(f"burst: GET /v1/cluster on node-{cur_leader + 1}: {s} {b}")
            if b["role"] != "leader" or b["term"] != cur_term:
                # A leader change during the burst: recorded, and sampling moves to the new leader
                # (the applied-entry count is replicated state, so it stays comparable).
                ev = {"t_ms": round(t - t_slot, 1), "from": f"node-{cur_leader + 1}", "term_from": cur_term}
                conn.close()
                try:
                    cur_leader = c.wait_leader(30)
                except AssertionError as e:
                    raise BenchError(f"burst: no leader after a leader change during the burst: {e}\n"
                                     + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
                cur_term = c.status(cur_leader)["term"]
                ev.update({"to": f"node-{cur_leader + 1}", "term_to": cur_term, "found_at_ms": round(wall_ms() - t_slot, 1)})
                leader_changes.append(ev)
                print(f"[bench] burst: WARNING leadership changed during the burst: {ev}", file=sys.stderr)
                conn = Conn(c.api_ports[cur_leader])
                continue
            smp = {"t_ms": round(t - t_slot, 1), "node": f"node-{cur_leader + 1}", "runs": b["runs"],
                   "slots_fired": b["trigger"]["slots_fired"], "commit_index": b["commit_index"]}
            samples.append(smp)
            if t < t_slot:
                base = smp
            elif base is None:
                raise BenchError("burst: no sample before the slot (the bench fell behind)")
            elif smp["runs"] - base["runs"] >= m and (leader_changes or smp["slots_fired"] - base["slots_fired"] >= m):
                break
            if time.monotonic() > deadline:
                check_alive(c, range(c.n))
                raise BenchError(f"burst: after {max(60.0, m / 100):.0f} s only {smp['runs'] - base['runs']} of {m} slots "
                                 f"applied on the leader\n" + node_log_excerpt(c, cur_leader))
            rest = POLL_BURST_S - (time.perf_counter() - tick)
            if rest > 0:
                time.sleep(rest)  # ok-sleep: the 50 ms sample interval
    finally:
        conn.close()
    leader = cur_leader
    check_alive(c, range(c.n))
    after = [x for x in samples if x["t_ms"] >= 0]
    first_applied = next((x["t_ms"] for x in after if x["runs"] > base["runs"]), None)
    all_applied = next((x["t_ms"] for x in after if x["runs"] - base["runs"] >= m), None)
    # The sample just before all were applied: the true time lies in (before, all_applied].
    before_all = max((x["t_ms"] for x in after if x["runs"] - base["runs"] < m), default=0.0)
    # slots_fired is the leading trigger's own counter: meaningless across a leader change.
    all_fired = None if leader_changes else next((x["t_ms"] for x in after if x["slots_fired"] - base["slots_fired"] >= m), None)
    # Every burst job's view, paged from the leader after a barrier: how many runs its slot became
    # (runs_fired), whether its cursor passed the slot, and its fire lag (fired_at - slot).
    views = [v for v in all_jobs(c, leader, consistent=True) if v["name"].startswith("b-")]
    n_fired = [v["state"]["runs_fired"] for v in views]
    fired_once = sum(1 for n in n_fired if n == 1)
    dup = sum(1 for n in n_fired if n > 1)
    unhandled = sum(1 for v in views if iso_ms(v["state"]["cursor"]) < t_slot)
    # Slots refused by a full queue are records, not runs (runs_fired stays 0): count them from the
    # run list. The queue is sized for the burst, so there should be none.
    s_, b_ = c.get(leader, "/v1/runs?state=skipped&limit=10000")
    if s_ != 200:
        raise BenchError(f"burst: GET /v1/runs?state=skipped: {s_} {b_}")
    qfull = sum(1 for r in b_["runs"] if r["job"].startswith("b-") and r.get("reason") == "queue_full" and r["slot_ms"] == t_slot)
    lost = m - len(views) + sum(1 for v, n in zip(views, n_fired) if n == 0) - qfull
    lag = [v["state"]["fire_lag_ms"]["last"] for v in views if v["state"]["fire_lag_ms"]["last"] is not None]
    # Commit rate between consecutive samples (applied entries on the leader / elapsed).
    peak = 0.0
    for a, b2 in zip(after, after[1:]):
        if b2["t_ms"] > a["t_ms"]:
            peak = max(peak, (b2["runs"] - a["runs"]) / ((b2["t_ms"] - a["t_ms"]) / 1000))
    res = {
        "jobs": m, "slot": iso(t_slot), "job_spec": spec,
        "calibration": {k: cal[k] for k in ("n", "jobs_per_s", "latency_ms")},
        "registration": {k: v for k, v in reg.items() if k != "ended_at"},
        "registration_margin_s": round(margin_ms / 1000, 2),
        "leader_change_during_registration": changed, "burst_leader": f"node-{leader + 1}",
        "leader_changes_during_burst": leader_changes,
        "queue": {"name": BURST_QUEUE, "max_depth": depth},
        "burst_size": fired_once + dup + qfull, "runs": fired_once, "records_queue_full": qfull,
        "jobs_not_past_slot": unhandled, "lost": lost, "duplicated": dup,
        "first_applied_ms": first_applied, "all_applied_ms": all_applied,
        "all_applied_after_ms": before_all, "slots_fired_counter_ms": all_fired,
        "slots_per_s": round(m / (all_applied / 1000), 1) if all_applied else None,
        "slots_per_s_upper_bound": round(m / (before_all / 1000), 1) if before_all > 0 else None,
        "peak_slots_per_s_50ms": round(peak, 1),
        "fired_at_minus_slot_ms": summary(lag, 1),
        "sample_interval_ms": POLL_BURST_S * 1000,
        "samples": samples,
    }
    try:
        res["replicas"] = replica_agreement(c)
    except BenchError as e:
        res["replicas"] = {"agree": False, "error": str(e)}
    print(f"[bench] burst: {m} slots, first applied at +{first_applied} ms, all applied at +{all_applied} ms, "
          f"runs {fired_once}, queue_full {qfull}", file=sys.stderr)
    return res


def all_jobs(c: Cluster, i: int, consistent: bool) -> list[dict]:
    """Every job's view from node i, paged (1,000 a page); the first page after a barrier when
    ``consistent``."""
    out, after = [], ""
    while True:
        q = "/v1/jobs?limit=1000" + (f"&after={after}" if after else "") + ("&consistent=true" if consistent and not after else "")
        s, b = c.get(i, q)
        if s != 200:
            raise BenchError(f"GET {q} on node-{i + 1}: {s} {b}")
        out += b["jobs"]
        if not b.get("next"):
            return out
        after = b["next"]


def replica_agreement(c: Cluster) -> dict:
    """Once the cluster is quiet (the same last_applied on every node, twice, 200 ms apart), the
    three replicas must hold the same jobs (every job's full view: cursor, next slot, generation,
    counters), the same number of runs and the same queue depths: compared as a SHA-256 of what
    the API returns."""
    import hashlib

    def applied():
        sts = [c.status(i) for i in range(c.n)]
        if any(x is None for x in sts):
            return None
        return tuple(x["last_applied"] for x in sts), tuple(x["commit_index"] for x in sts)

    prev = None
    t0 = time.monotonic()
    trace = []
    while True:
        cur = applied()
        trace.append([round(time.monotonic() - t0, 1), cur and list(cur[0])])
        if cur is not None and cur == prev and len(set(cur[0])) == 1:
            break
        if time.monotonic() - t0 > 60:
            raise BenchError(f"replicas did not settle within 60 s (last_applied, commit_index): first "
                             f"{trace[0]}, last {trace[-1]}, {len(trace)} samples")
        prev = cur
        time.sleep(0.2)  # ok-sleep: settle interval inside a deadline loop
    out = {"last_applied": cur[0][0], "settled_after_s": trace[-1][0]}
    digests = {}
    for i in range(c.n):
        h = hashlib.sha256()
        views = all_jobs(c, i, consistent=False)
        for j in views:
            h.update(json.dumps(j, sort_keys=True).encode())
        s_, q = c.get(i, "/v1/queues")
        if s_ != 200:
            raise BenchError(f"replica check: GET /v1/queues on node-{i + 1}: {s_} {q}")
        depths = sorted((x["name"], x["depth"], x["running"], x["dead"]) for x in q["queues"])
        h.update(json.dumps(depths).encode())
        st = c.status(i)
        digests[f"node-{i + 1}"] = {"jobs": len(views), "runs_total": st["runs"], "queues": depths, "sha256": h.hexdigest()[:16]}
    out["nodes"] = digests
    out["agree"] = len({(d["jobs"], d["runs_total"], d["sha256"]) for d in digests.values()}) == 1
    if not out["agree"]:
        raise BenchError(f"replicas disagree after the burst: {digests}")
    return out


def raft_log_warnings(c: Cluster) -> dict:
    """Counts of critical/error lines in each node's log (pysyncobj's 'truncating already-applied
    log entries' among them), with the first example of each kind."""
    out = {}
    for i in range(c.n):
        try:
            text = (c.data_dir(i) / "node.log").read_text(errors="replace")
        except OSError:
            continue
        kinds: dict[str, dict] = {}
        for line in text.splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 4 or parts[1] not in ("critical", "error"):
                continue
            key = parts[3][:40]
            k = kinds.setdefault(key, {"count": 0, "first": line[:300]})
            k["count"] += 1
        if kinds:
            out[f"node-{i + 1}"] = kinds
    return out


# ------------------------------------------------------------------------------------ report

def machine() -> dict:
    def ver(p):
        try:
            return metadata.version(p)
        except metadata.PackageNotFoundError:
            return None
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024} MiB"
    except (OSError, ValueError):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "nproc": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu, "memory": mem, "kernel": platform.release(), "python": platform.python_version(),
        "packages": {p: ver(p) for p in ("pysyncobj", "aiohttp", "msgpack", "croniter")},
        "git_commit": commit, "git_dirty": dirty,
    }


def fmt(v, unit=""):
    return "-" if v is None else f"{v}{unit}"


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"### raftsched bench ({res['profile']}), {res['started_at']}", "",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, Python {m['python']}, "
             + ", ".join(f"{k} {v}" for k, v in m["packages"].items()),
             "", "Code: " + (f"commit {res['code']['commit'][:12]} (--git-ref {res['code']['ref']})" if res["code"].get("commit")
                             else f"working tree at {m['git_commit']}{' with uncommitted changes' if m['git_dirty'] else ''}")
             + f"; command: `{res['command']}`",
             "", "| scenario | figure | value |", "|---|---|---|"]
    f = res.get("failover")
    if isinstance(f, dict) and "trials" in f:
        o, e, x = f["first_fire_observed_ms"], f["election_observed_ms"], f["observed_minus_slot_wait_ms"]
        lines += [
            f"| fail-over ({len(f['trials'])} kill -9 of the leader, {f['jobs']} jobs every 1 s) | SIGKILL → first run with fired_at > kill, seen on a survivor (ms) p50 / p99 / max | {o['p50']} / {o['p99']} / {o['max']} |",
            f"| | same, minus the wait for the first slot due after the kill, if any (ms) p50 / p99 / max | {x['p50']} / {x['p99']} / {x['max']} |",
            f"| | SIGKILL → a survivor reports role=leader in a new term (ms) p50 / p99 / max | {e.get('p50')} / {e.get('p99')} / {e.get('max')} |",
            f"| | killed node restarted → caught up (s) p50 / max | {f['restart_catch_up_s']['p50']} / {f['restart_catch_up_s']['max']} |",
            f"| | slots lost / duplicated (of {f['slots_audited']} audited on 3 replicas) | {f['slots_lost']} / {f['slots_duplicated']} |",
        ]
    w = res.get("writes")
    if isinstance(w, dict) and "leader" in w:
        for role in ("leader", "follower"):
            if role in w:
                l = w[role]["latency_ms"]
                lines.append(f"| lone writes ({w['n']} sequential PUT, 1 client) | to the {role}: p50 / p99 / max (ms), writes/s | "
                             f"{l['p50']} / {l['p99']} / {l['max']}, {w[role]['writes_per_s']} |")
    b = res.get("burst")
    if isinstance(b, dict) and "burst_size" in b:
        r = b["registration"]
        lines += [
            f"| burst ({b['jobs']} one-shot jobs due at one instant) | registration, 32 concurrent PUT: jobs/s (whole seconds min-max); PUT p50 / p99 ms | "
            f"{r['jobs_per_s']} ({fmt(r['per_whole_second'] and r['per_whole_second']['min'])}-{fmt(r['per_whole_second'] and r['per_whole_second']['max'])}); {r['latency_ms']['p50']} / {r['latency_ms']['p99']} |",
            f"| | burst size: slots that became runs + queue_full records (lost / duplicated) | {b['burst_size']} = {b['runs']} + {b['records_queue_full']} ({b['lost']} / {b['duplicated']}) |",
            f"| | slot → first / all of the burst applied on the leader (ms, sampled every 50 ms: all applied after the previous sample, {b['all_applied_after_ms']} ms) | {b['first_applied_ms']} / {b['all_applied_ms']} |",
            f"| | slots committed per second = burst size / (slot → all applied) (at most: / previous sample) | {b['slots_per_s']} (≤ {fmt(b['slots_per_s_upper_bound'])}) |",
            f"| | fired_at − slot (the leader's decision time, not commit) max | {b['fired_at_minus_slot_ms'].get('max')} ms |",
            f"| | replicas agree afterwards (job count, run count, SHA-256 of every job view and queue depth) | {'yes' if b.get('replicas', {}).get('agree') else 'NO'} |",
        ]
    for name in ("failover", "writes", "burst"):
        if isinstance(res.get(name), dict) and "error" in res[name]:
            lines.append(f"| {name} | FAILED | {res[name]['error'].splitlines()[0][:200]} |")
    notes = []
    for name in ("failover", "writes", "burst"):
        la = (res.get(name) or {}).get("loadavg_before_after")
        if la and la[0][0] > 1.0:
            notes.append(f"{name}: load average {la[0][0]} when it started (2 CPUs): other processes were competing for the CPUs")
    if isinstance(b, dict) and b.get("leader_change_during_registration"):
        ch = b["leader_change_during_registration"]
        notes.append(f"leadership changed during the burst's registration: {ch['leader_before']} (term {ch['term_before']}) → "
                     f"{ch['leader_after']} (term {ch['term_after']}); the burst was measured on {b['burst_leader']}")
    for ev in (b.get("leader_changes_during_burst") or []) if isinstance(b, dict) else []:
        notes.append(f"leadership changed during the burst, {ev['t_ms']} ms after the slot: {ev['from']} (term {ev['term_from']}) → "
                     f"{ev['to']} (term {ev['term_to']}); sampling moved to the new leader")
    for cname, nodes in (res.get("node_log_warnings") or {}).items():
        for node, kinds in nodes.items():
            for key, k in kinds.items():
                notes.append(f"{cname}/{node}: {k['count']} × `{k['first'][24:140]}…`")
    if notes:
        lines += ["", "Warnings:", ""] + [f"- {n}" for n in notes]
    if isinstance(f, dict) and "trials" in f:
        lines += ["", "Fail-over trials:", "",
                  "| # | killed | phase ms | leader seen ms | first fire seen ms | its slot − kill ms | fired_at − kill ms | rejoin s |",
                  "|---|---|---|---|---|---|---|---|"]
        for t in f["trials"]:
            lines.append(f"| {t['trial']} | {t['killed']} | {t['kill_phase_ms']} | {fmt(t['election_observed_ms'])} | {t['observed_ms']} | "
                         f"{t['slot_minus_kill_ms']:+.0f} | {t['fired_at_minus_kill_ms']} | {t['restart_catch_up_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 fail-overs, 200 writes, 2,000-job burst (< ~60 s)")
    ap.add_argument("--out", default="bench-results.json", help="JSON results (default: bench-results.json in the cwd)")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' data dirs and logs even on success")
    ap.add_argument("--git-ref", help="run the nodes from this commit (git archive into the temp dir) "
                                      "instead of the working tree")
    ap.add_argument("--burst-jobs", type=int, help="override the burst size (for investigations)")
    ap.add_argument("--only", default="failover,writes,burst", help="comma-separated subset of failover,writes,burst")
    args = ap.parse_args(argv)
    profile = "quick" if args.quick else "full"
    p = dict(PROFILES[profile])
    if args.burst_jobs:
        p["burst_jobs"] = args.burst_jobs

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    tmp = Path(tempfile.mkdtemp(prefix="raftsched-bench-"))
    global CODE_DIR
    code = {"source": "working tree"}
    if args.git_ref:
        sha = subprocess.run(["git", "rev-parse", "--verify", args.git_ref + "^{commit}"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.strip()
        CODE_DIR = tmp / "code"
        CODE_DIR.mkdir()
        arch = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(CODE_DIR)], input=arch, check=True)
        code = {"source": "git archive", "ref": args.git_ref, "commit": sha}
    clusters: list[Cluster] = []
    t0 = time.monotonic()
    res = {"profile": profile, "params": p, "command": " ".join([".venv/bin/python", "scripts/bench.py"] + sys.argv[1:]),
           "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(), "code": code}
    failed = []
    try:
        for name in [n for n in ("failover", "writes", "burst") if n in args.only.split(",")]:
            load_before = [round(x, 2) for x in os.getloadavg()]
            try:
                if name == "failover":
                    res[name] = failover(tmp, p["failover_trials"], clusters)
                    clusters[-1].stop()  # free the CPU for the next scenario
                elif name == "writes":
                    # No run ever falls due on this cluster before the burst; the burst's runs wait
                    # in their queue (--slots 0: no node executes), so the burst measures firing.
                    res[name] = lone_writes(start_cluster(tmp, "writes", clusters, WRITES_BURST_NODE_ARGS), p["writes"])
                else:
                    c = clusters[-1] if clusters else None
                    if c is None or c.tmp.name != "writes" or len(c.alive()) != c.n:
                        c = start_cluster(tmp, "burst", clusters, WRITES_BURST_NODE_ARGS)
                    res[name] = burst(c, p["burst_jobs"])
            except Exception as e:  # any failure of a scenario is reported, and the next one still runs
                failed.append(name)
                res[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                print(f"[bench] {name} FAILED: {e}", file=sys.stderr)
            res[name]["loadavg_before_after"] = [load_before, [round(x, 2) for x in os.getloadavg()]]
            if load_before[0] > 1.0:
                print(f"[bench] WARNING: load average {load_before} before {name}: other work shares the CPUs", file=sys.stderr)
    except KeyboardInterrupt as e:
        failed.append(f"interrupted ({e})")
    finally:
        for c in clusters:
            try:
                c.stop()
            except Exception as e:  # keep stopping the others
                print(f"[bench] stopping a cluster: {e!r}", file=sys.stderr)
        res["node_log_warnings"] = {c.tmp.name: raft_log_warnings(c) for c in clusters}
        leftover = [pr.pid for c in clusters for pr in c.procs.values() if pr.poll() is None]
        if leftover:
            print(f"[bench] WARNING: processes still running: {leftover}", file=sys.stderr)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    f = res.get("failover", {})
    b = res.get("burst", {})
    if f.get("slots_lost") or f.get("slots_duplicated") or f.get("problems"):
        failed.append("fail-over audit: " + "; ".join(f.get("problems") or []))
    if b.get("replicas") and not b["replicas"].get("agree"):
        failed.append(f"burst: replicas: {b['replicas'].get('error') or 'disagree'}")
    if b.get("lost") or b.get("duplicated") or b.get("jobs_not_past_slot"):
        failed.append(f"burst: lost {b.get('lost')}, duplicated {b.get('duplicated')}, jobs whose cursor did not pass "
                      f"the slot {b.get('jobs_not_past_slot')}")
    res["failed"] = failed
    res["ok"] = not failed
    if failed or args.keep:
        res["data_dir"] = str(tmp)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    print(f"\nelapsed {res['elapsed_s']} s; JSON in {args.out}")
    if failed:
        print(f"FAILED: {failed}; node logs kept in {tmp}", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
