#!/usr/bin/env python3
"""raftsched benchmarks (issue #6): fire throughput and punctuality, a storm of aligned slots, end to
end execution, fail-over, writes and scale, side by side with APScheduler and raw pysyncobj.

Usage:  .venv/bin/python scripts/bench.py [--quick] [--out bench-results.json] [--plot PNG]

Each scenario starts its own three-node cluster (real node processes, tests/procs.py) on free
127.0.0.1 ports in a temporary directory, and stops every process it started, by PID, whatever
happens. The baselines (scripts/baselines/aps_bench.py, scripts/baselines/raw_raft.py) run as
subprocesses with the venv's Python, never at the same time as a cluster; a missing baseline is
recorded as "not run: <why>". Prints a Markdown table, writes every figure as JSON to --out and a
plot of the fire lag distributions (matplotlib, Agg) to --plot (default: --out with .png).

Scenarios (--only takes a comma-separated subset; docs/benchmarks.md says what each figure means):
  failover  kill -9 of the leader, repeated: time to the next committed fire, slots lost/duplicated
  writes    lone PUT latency (leader, follower); jobs registered per second, 32 clients (and bulk)
  sweep     N interval jobs every 1 s, staggered over the second (schedule.start_at): slots committed
            per second, fire lag, slots fired ahead, where each falls behind
  storm     M one-shot jobs due at one aligned second: fire lag, lost/duplicated, replicas agree
  e2e       no-op python runs fired, leased, executed, completed per second; slot -> completion
  raw_raft  raw pysyncobj commits per second and latency (the Raft layer's ceiling)
  scale     in process: a SchedulerState's memory, snapshot and restore time at 100k jobs; on a cluster:
            resident memory per node at 100k jobs (1M with --scale-1m); cold restart until it fires,
            with the raft journal it replayed

--quick runs every scenario small (about a minute): writes, scale and e2e share one cluster.

Fire lag on our nodes comes from the fire-commit log: a node started with --fire-log <path>
(RAFTSCHED_FIRE_LOG=<path> in code from before that flag) appends {"c": commit_ms, "p": plan_ms, "s": [slot_ms, ...]} for each committed fire command while it
leads; each node gets its own path, and the bench reads all three. Code without that log is reported
as "no fire log", with the figures that do not need it.

Exit status: 0 when every scenario ran and every invariant held; 1 when a scenario failed outright
(no leader, a 5xx, a timeout, a node that died), a slot was lost or duplicated, or the code has a
fire log that stayed empty. A missing baseline does not fail the run.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import platform
import random
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
PY_NOOP = {"type": "python", "target": "builtins:id"}
FAILOVER_SPEC = {"schedule": {"every_s": 1}, "executor": SHELL_TRUE, "misfire": {"policy": "fire_all"}, "history": 1000}
#: A job that never falls due during the benchmark: writes measure the write path only.
IDLE_SPEC = {"schedule": {"at": "2099-01-01T00:00:00Z"}, "executor": SHELL_TRUE, "misfire": {"policy": "skip"}}
#: The scale scenario's jobs, as a fleet registers them: one template (interval, misfire, history)
#: with an executor of each job's own (an HTTP hook per job, on loopback, never called: the jobs
#: first fall due an hour after their creation). The scenario measures what holding them costs,
#: not firing them; the in-process state-machine figures use the same jobs (fleet_spec).
SCALE_SPEC = {"schedule": {"every_s": 3600}, "executor": {"type": "http", "url": "http://127.0.0.1:9/hooks/s-0"},
              "misfire": {"policy": "skip"}, "history": 1}


def fleet_spec(k: int) -> dict:
    """Job s-k of the scale scenario: SCALE_SPEC with its own executor URL."""
    spec = dict(SCALE_SPEC)
    spec["executor"] = {"type": "http", "url": f"http://127.0.0.1:9/hooks/s-{k}"}
    return spec


#: Three jobs that fire every second on the scale cluster: "it fires again" after a cold restart.
BEACON_SPEC = {"schedule": {"every_s": 1}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"}, "history": 10}

ALL_SCENARIOS = ("failover", "writes", "sweep", "storm", "e2e", "raw_raft", "scale")
PROFILES = {
    # Sizes for a run that checks the harness end to end (scripts/test.sh), not figures: about a
    # minute on 2 shared cores. Writes, scale and e2e share one cluster (shared_cluster), in that
    # order; windows are 1 s and sizes small. Registering through PUT costs ~2-5 ms of the leader
    # per job, so without a bulk endpoint the sizes marked *_put are used (the run records which).
    "quick": {"failover_trials": 3, "writes": 50, "writes_register_put": 300, "writes_register_bulk": 1000,
              "storm_jobs": 1000, "sweep_ns": [1000, 3000], "sweep_ns_put": [500, 1500], "sweep_window_s": 1,
              "sweep_warmup_s": 0.5, "aps_warmup_s": 0.25, "aps_margin_s": 0.5, "storm_margin_s": 1.0,
              "e2e_jobs": 300, "e2e_window_s": 1, "e2e_warmup_s": 0, "e2e_slots": 32,
              "raw_raft_s": 0.5, "raw_raft_warmup_s": 0.25, "raw_raft_in_flight": 200, "scale_ns": [5000], "scale_ns_put": [1000],
              "state_ns": [10000], "shared_cluster": True},
    "full": {"failover_trials": 20, "writes": 1000, "writes_register_put": 5000, "writes_register_bulk": 50000,
             "storm_jobs": 10000, "sweep_ns": [1000, 10000, 30000, 100000], "sweep_ns_put": None,
             "sweep_window_s": 10, "sweep_warmup_s": 3, "aps_warmup_s": 3, "aps_margin_s": 2.0, "storm_margin_s": 1.5,
             "e2e_jobs": 5000, "e2e_window_s": 10, "e2e_warmup_s": 3,
             "e2e_slots": 32, "raw_raft_s": 10, "raw_raft_warmup_s": 2, "raw_raft_in_flight": 1000, "scale_ns": [100000], "scale_ns_put": None,
             "state_ns": [100000], "shared_cluster": False},
}
#: With shared_cluster (quick), these scenarios run one after the other on one cluster, started by
#: the first of them, with workers on (the e2e scenario needs them) and the fire log on.
SHARED_SCENARIOS = ("writes", "scale", "e2e")
#: The order of a quick run: the shared cluster's scenarios next to each other.
QUICK_ORDER = ("failover", "writes", "scale", "e2e", "sweep", "storm", "raw_raft")
SCALE_1M = 1_000_000
POLL_FAILOVER_S = 0.010
POLL_BURST_S = 0.050
CONCURRENCY = 32
BURST_QUEUE = "bench-burst"
SWEEP_QUEUE = "sweep"
E2E_QUEUE = "e2e"
#: --slots 0: no worker on any node, so firing is measured alone (runs stay queued).
NO_WORKER = ("--slots", "0")
WRITES_BURST_NODE_ARGS = NO_WORKER
#: The bulk registration endpoint (body {"jobs": {name: spec}}); absent (404/405) -> PUT per job.
BULK_PATH = "/v1/jobs:batch"
#: A bulk request: well under the endpoint's limits (limits.batch_jobs_max, batch_request_bytes_max).
BULK_BODY_BYTES_MAX = 2 * 1024 * 1024
BULK_JOBS_MAX = 2000
BULK_CONCURRENCY = 4
#: How a run of one job's slots is considered late: fell behind when fewer than this share of the
#: due slots was committed in the window, or the fire lag p99 exceeded FELL_BEHIND_P99_MS.
FELL_BEHIND_SHARE = 0.95
FELL_BEHIND_P99_MS = 1000
#: Jobs whose runs are read back for the slot-to-completion latency of the e2e scenario.
E2E_SAMPLE_JOBS = 100
#: Fire lag values kept in the JSON for a plot (a seeded sample; the quantiles use all of them).
LAG_SAMPLE_MAX = 5000


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




#: Where the nodes' code comes from: the working tree (default) or an exported commit (--git-ref).
CODE_DIR = REPO


def venv_python() -> str:
    """The interpreter for the baselines: the repository's venv, else the one running this."""
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


class BenchCluster(Cluster):
    """tests/procs.Cluster with extra arguments for every node (e.g. ``--slots 0``), started from
    CODE_DIR (cwd and PYTHONPATH), so a benchmark can run a fixed commit while the tree changes.
    With ``fire_log``, node i writes its fire-commit log to ``fire_log_path(i)``."""

    def __init__(self, tmp: Path, extra_args: tuple = (), fire_log: bool = False, **kw) -> None:
        how = fire_log_how() if fire_log else None
        super().__init__(tmp, env={"PYTHONPATH": str(CODE_DIR)}, cwd=CODE_DIR,
                         node_env=(lambda i: {"RAFTSCHED_FIRE_LOG": str(self.fire_log_path(i))}) if how == "env" else None, **kw)
        self.extra_args = list(extra_args)
        self.fire_log = fire_log
        self._fire_log_flag = how == "flag"
        #: the bulk endpoint: None until probed, then its path or False (see register_jobs)
        self.bulk_path: str | bool | None = None

    def argv(self, i: int) -> list[str]:
        return super().argv(i) + self.extra_args + (["--fire-log", str(self.fire_log_path(i))] if self._fire_log_flag else [])

    def fire_log_path(self, i: int) -> Path:
        return self.data_dir(i) / "fire.log"


def start_cluster(tmp: Path, name: str, clusters: list, extra_args: tuple = (), fire_log: bool = False) -> BenchCluster:
    (tmp / name).mkdir(parents=True)
    c = BenchCluster(tmp / name, extra_args, fire_log=fire_log)
    clusters.append(c)  # registered before start: the finally block stops whatever started
    t0 = time.monotonic()
    c.start()
    try:
        c.wait_leader(30)
    except AssertionError as e:
        raise BenchError(f"{name}: no leader within 30 s: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
    print(f"[bench] {name}: 3 nodes up, leader elected in {time.monotonic() - t0:.1f} s "
          f"(API ports {c.api_ports}; extra node args {list(extra_args)}{'; fire log on' if fire_log else ''})", file=sys.stderr)
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


def put_queue(c: Cluster, i: int, name: str, max_depth: int, on_full: str) -> None:
    s, b = c.call(i, "PUT", f"/v1/queues/{name}", {"max_depth": max_depth, "on_full": on_full})
    if s not in (200, 201):
        raise BenchError(f"PUT /v1/queues/{name}: {s} {b}")


def rss_kib(pid: int) -> dict:
    """VmRSS and VmHWM (peak) of a process, KiB, from /proc/PID/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return out


def dir_sizes(d: Path) -> dict:
    """Bytes of each file in a node's data dir (journal, dump, logs)."""
    out = {}
    try:
        for p in sorted(d.iterdir()):
            if p.is_file():
                out[p.name] = p.stat().st_size
    except OSError:
        pass
    return out


# ------------------------------------------------------------------------------------ fire log

def fire_log_how() -> str | None:
    """How the nodes' code (CODE_DIR) is told where to write its fire-commit log: "flag" (the
    hidden --fire-log of ``raftsched node``), "env" (RAFTSCHED_FIRE_LOG, in code from before
    that flag), or None (no fire log)."""
    try:
        if '"--fire-log"' in (CODE_DIR / "raftsched" / "cli.py").read_text(errors="replace"):
            return "flag"
    except OSError:
        pass
    for p in (CODE_DIR / "raftsched").rglob("*.py"):
        try:
            if "RAFTSCHED_FIRE_LOG" in p.read_text(errors="replace"):
                return "env"
        except OSError:
            continue
    return None


def fire_log_supported() -> bool:
    """Whether the nodes' code (CODE_DIR) can write the fire-commit log at all."""
    return fire_log_how() is not None


class FireLogs:
    """Reads the three nodes' fire-commit logs incrementally (each node writes only while it
    leads, and leadership may move). A record is (commit_ms, plan_ms, [slot_ms, ...], node).

    Only complete lines are read; a line cut by ``skip_to_end`` or a half-written last line is
    left for later or dropped, never misread."""

    def __init__(self, c: BenchCluster) -> None:
        self.paths = {i: c.fire_log_path(i) for i in range(c.n)}
        self.offsets = {i: 0 for i in self.paths}
        self.resync = {i: False for i in self.paths}  # offset set blindly: drop up to the next newline
        self.bad_lines = 0
        self.max_commit_ms = 0.0

    def skip_to_end(self) -> None:
        """Forget everything written so far (e.g. the registration's fires)."""
        for i, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size > self.offsets[i]:
                        f.seek(size - 1)
                        # At a line boundary nothing is cut; otherwise drop the rest of that line.
                        self.resync[i] = f.read(1) != b"\n"
                        self.offsets[i] = size
            except OSError:
                continue

    def read_new(self) -> list[tuple]:
        out = []
        for i, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    if os.fstat(f.fileno()).st_size < self.offsets[i]:
                        self.offsets[i] = 0  # truncated or replaced (a restarted node reopened it): from the top
                        self.resync[i] = False
                    f.seek(self.offsets[i])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            start = 0
            if self.resync[i]:
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                start = nl + 1
                self.resync[i] = False
            end = data.rfind(b"\n")
            if end < start:
                self.offsets[i] += start
                continue
            for line in data[start:end].split(b"\n"):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    rec = (float(r["c"]), float(r.get("p", r["c"])), [int(s) for s in r["s"]], i)
                except (ValueError, KeyError, TypeError):
                    self.bad_lines += 1
                    continue
                self.max_commit_ms = max(self.max_commit_ms, rec[0])
                out.append(rec)
            self.offsets[i] += end + 1
        return out

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths.values() if p.exists())


def wait_fire_log_past(logs: FireLogs, t_ms: float, timeout_s: float, keep: list) -> bool:
    """Read the logs into ``keep`` until one record was committed at or after t_ms (so every record
    committed before t_ms has been written), or the deadline passes. Returns whether it got there."""
    deadline = time.monotonic() + timeout_s
    while True:
        keep += logs.read_new()
        if logs.max_commit_ms >= t_ms:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop


def code_limit(name: str) -> int | None:
    """An integer constant of raftsched/core/limits.py in the nodes' code (CODE_DIR), read from the
    source so that --git-ref works: ``name = 123`` or ``name = 16 * 2**20``; None if absent."""
    import re
    try:
        m = re.search(rf"^{name}\s*=\s*([0-9_ *]+)$", (CODE_DIR / "raftsched" / "core" / "limits.py").read_text(), re.M)
    except OSError:
        return None
    if not m:
        return None
    try:
        v = 1
        for factor in m.group(1).replace("_", "").split(" * "):
            b, _, e = factor.strip().partition("**")
            v *= int(b) ** int(e) if e else int(b)
        return v
    except ValueError:
        return None


def fire_ahead_ms() -> int:
    """How far ahead of a job's next slot the nodes' code may commit it (``limits.fire_ahead_ms``
    in CODE_DIR; 0 for code that fires at the slot). Later slots of the same entry may be
    committed up to ``fire_ahead_span_ms`` more ahead; the storm's one-shot jobs have none."""
    return code_limit("fire_ahead_ms") or 0


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float | None:
    """CPU seconds a process has used (user + system, its waited-for children included), from
    /proc/PID/stat; None if it cannot be read. CPU per unit of work holds on a shared machine
    where rates do not: a competing process slows the cluster down, it does not make a slot or
    a run cost more CPU (to a first approximation: caches and frequency are shared too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / _CLK_TCK  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
        return None


def cluster_cpu_s(c) -> float | None:
    """CPU seconds used so far by every node process of cluster ``c`` (None if one is unreadable)."""
    vals = [cpu_s(p.pid) for p in c.procs.values()]
    return None if any(v is None for v in vals) else sum(vals)


def measurement_window(window_s: int, c=None) -> tuple[float, float] | tuple[float, float, float | None]:
    """Wait out a window of ``window_s`` whole seconds that starts on the next whole second and
    return its bounds (wall ms). Interval slots fall on whole seconds, so a window aligned to them
    holds whole seconds' commits: one that started mid-burst would cut a second's slots in two.
    With a cluster ``c``, also the CPU seconds its node processes used in the window."""
    w0 = (wall_ms() // 1000 + 1) * 1000
    w1 = w0 + int(window_s) * 1000
    marks = []
    for t in (w0, w1):
        time.sleep(max(0.0, (t - wall_ms()) / 1000))  # ok-sleep: measurement window
        if c is not None:
            marks.append(cluster_cpu_s(c))
    if c is None:
        return w0, w1
    return w0, w1, None if None in marks else marks[1] - marks[0]


def lag_stats(lags: list[float]) -> dict:
    """p50 / p99 / max (and more) of fire lags in ms, plus quantiles for a CDF plot."""
    if not lags:
        return {"n": 0}
    s = sorted(lags)
    out = summary(s, 1)
    out["quantiles_ms"] = [round(s[min(len(s) - 1, int(q / 100 * len(s)))], 1) for q in range(0, 101)]
    return out


def lag_sample(lags: list[float], seed: int = 6) -> list[float]:
    if len(lags) <= LAG_SAMPLE_MAX:
        return [round(x, 1) for x in lags]
    return [round(x, 1) for x in random.Random(seed).sample(lags, LAG_SAMPLE_MAX)]


# ------------------------------------------------------------------------------------ registration

def _chunks(items: list[tuple[str, dict]]) -> list[list[tuple[str, dict]]]:
    """Bulk request bodies: at most BULK_JOBS_MAX jobs and BULK_BODY_BYTES_MAX bytes each."""
    out, cur, size = [], [], 20
    for name, spec in items:
        n = len(json.dumps(spec)) + len(name) + 8
        if cur and (len(cur) >= BULK_JOBS_MAX or size + n > BULK_BODY_BYTES_MAX):
            out.append(cur)
            cur, size = [], 20
        cur.append((name, spec))
        size += n
    if cur:
        out.append(cur)
    return out


def _bulk_errors(body) -> list[str]:
    """Per-job refusals in a bulk answer, whatever its exact shape: an "errors" list or mapping,
    or per-job results carrying a status >= 400."""
    if not isinstance(body, dict):
        return []
    errs = body.get("errors")
    if isinstance(errs, dict):
        return [f"{k}: {v}" for k, v in errs.items()]
    if isinstance(errs, list):
        return [str(e)[:300] for e in errs]
    res = body.get("results") or body.get("jobs")
    if isinstance(res, dict):
        return [f"{k}: {v}" for k, v in res.items() if isinstance(v, dict) and int(v.get("status", 200)) >= 400]
    if isinstance(res, list):
        return [str(v)[:300] for v in res if isinstance(v, dict) and int(v.get("status", 200)) >= 400]
    return []


def register_jobs(c: BenchCluster, i: int, items: list[tuple[str, dict]], method: str = "auto",
                  deadline_s: float | None = None) -> dict:
    """Register (name, spec) pairs through node i: the one registrar of this script.

    ``method``: "auto" tries the bulk endpoint (BULK_PATH, body {"jobs": {name: spec}}) with the
    first chunk and keeps using it if the node has it; on 404/405 (or any other refusal of the
    probe) it registers with PUT /v1/jobs/{name}, CONCURRENCY requests in flight. "put" forces PUT,
    "bulk" fails without the endpoint. The probe's outcome is remembered on the cluster. Every
    request carries an Idempotency-Key; 503 and 504 are retried with it.

    Returns jobs/s, the slowest and fastest whole second, per-request latency, statuses and errors,
    ``method`` ("bulk" or "put") and ``incomplete`` when ``deadline_s`` passed first."""
    return asyncio.run(_register_async(c, i, items, method, deadline_s))


async def _register_async(c: BenchCluster, i: int, items, method: str, deadline_s) -> dict:
    import aiohttp

    base = c.url(i)
    headers = {"Authorization": f"Bearer {c.token}"}
    lat, done_at, statuses, errors = [], [], {}, []
    retries = 0
    notes = []
    t0 = time.perf_counter()
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    registered = 0

    async def send(session, verb, path, body, key):
        """One request, retried on 503/504 with the same key: (status, parsed body, latency ms)."""
        nonlocal retries
        for attempt in range(6):
            a = time.perf_counter()
            async with session.request(verb, base + path, json=body, headers={**headers, "Idempotency-Key": key}) as r:
                raw = await r.read()
                s = r.status
            statuses[s] = statuses.get(s, 0) + 1
            if s in (503, 504) and attempt < 5:
                retries += 1
                await asyncio.sleep(0.2 * (attempt + 1))  # backoff before a retry with the same key
                continue
            break
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw[:300].decode(errors="replace")
        return s, parsed, (time.perf_counter() - a) * 1000

    def account(n_jobs, s, body, ms, what):
        nonlocal registered
        lat.append(ms)
        done_at.append((time.time(), n_jobs))
        if s not in (200, 201, 207):
            errors.append(f"{what}: {s} {str(body)[:300]}")
            return
        errs = _bulk_errors(body) if n_jobs > 1 else []
        errors.extend(errs[:10])
        registered += n_jobs - len(errs)

    conn = aiohttp.TCPConnector(limit=CONCURRENCY)
    used = "put"
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        todo = list(items)
        if method in ("auto", "bulk") and c.bulk_path is not False and todo:
            chunks = _chunks(todo)
            s, body, ms = await send(session, "POST", BULK_PATH, {"jobs": dict(chunks[0])}, f"bench-bulk-{chunks[0][0][0]}")
            if s in (200, 201, 207):
                c.bulk_path = BULK_PATH
                used = "bulk"
                account(len(chunks[0]), s, body, ms, f"POST {BULK_PATH}")
                it = iter(chunks[1:])

                async def bulk_worker():
                    for ch in it:
                        if deadline is not None and time.monotonic() > deadline:
                            return
                        s, body, ms = await send(session, "POST", BULK_PATH, {"jobs": dict(ch)}, f"bench-bulk-{ch[0][0]}")
                        account(len(ch), s, body, ms, f"POST {BULK_PATH} ({ch[0][0]}..)")

                await asyncio.gather(*(bulk_worker() for _ in range(BULK_CONCURRENCY)))
                todo = []
            else:
                c.bulk_path = False
                statuses.clear()  # the probe's status is a note, not a registration outcome
                notes.append(f"POST {BULK_PATH} answered {s}: {str(body)[:200]}; registered with PUT instead")
                if method == "bulk":
                    raise BenchError(notes[-1])
        if todo:
            it2 = iter(todo)

            async def put_worker():
                for name, spec in it2:
                    if deadline is not None and time.monotonic() > deadline:
                        return
                    s, body, ms = await send(session, "PUT", f"/v1/jobs/{name}", spec, f"bench-{name}")
                    account(1, s, body, ms, name)

            await asyncio.gather(*(put_worker() for _ in range(CONCURRENCY)))
    total = time.perf_counter() - t0
    per_sec: dict[int, int] = {}
    for t, n in done_at:
        per_sec[int(t)] = per_sec.get(int(t), 0) + n
    secs = sorted(per_sec)
    full_secs = [per_sec[s] for s in secs[1:-1]]  # whole seconds only (the first and last are partial)
    return {"method": used, "notes": notes, "n": len(items), "registered": registered,
            "incomplete": registered < len(items) and not errors,
            "seconds": round(total, 2), "jobs_per_s": round(registered / total, 1) if total > 0 else None,
            "per_whole_second": {"min": min(full_secs), "max": max(full_secs)} if full_secs else None,
            "per_second_series": [per_sec[s] for s in secs],
            "requests": len(lat), "latency_ms": summary(lat, 1), "statuses": statuses, "retries_503_504": retries,
            "errors": errors[:10], "error_count": len(errors), "ended_at": time.time()}


def register_checked(c: BenchCluster, i: int, items, what: str, method: str = "auto", deadline_s: float | None = None,
                     expect_jobs: int | None = None) -> dict:
    """register_jobs, then fail the scenario on any error, and check that node i holds
    ``expect_jobs`` jobs (its own replica: a write answers once applied on the node it went to)."""
    t0 = time.monotonic()
    reg = register_jobs(c, i, items, method, deadline_s)
    check_alive(c, range(c.n))
    if reg["error_count"]:
        raise BenchError(f"{what}: {reg['error_count']} registration errors: {reg['errors']}\n" + node_log_excerpt(c, i))
    if reg["incomplete"]:
        raise BenchError(f"{what}: registered {reg['registered']} of {reg['n']} jobs in {deadline_s} s "
                         f"({reg['jobs_per_s']} jobs/s, {reg['method']}); the run's time budget is spent")
    if expect_jobs is not None:
        st = c.status(i) or {}
        if st.get("jobs") is not None and st["jobs"] < expect_jobs:
            raise BenchError(f"{what}: node-{i + 1} holds {st['jobs']} jobs after registration, expected {expect_jobs}")
    print(f"[bench] {what}: registered {len(items)} jobs in {time.monotonic() - t0:.1f} s ({reg['jobs_per_s']} jobs/s, "
          f"{reg['method']}{'; ' + reg['notes'][0] if reg['notes'] else ''})", file=sys.stderr)
    return reg


def bulk_available(c: BenchCluster, i: int) -> bool:
    """Whether node i has the bulk endpoint: probed with an empty request body once per cluster
    (404/405 = absent; any other answer, e.g. 422 for an empty batch, = present)."""
    if c.bulk_path is None:
        s, _ = c.call(i, "POST", BULK_PATH, {"jobs": {}})
        c.bulk_path = False if s in (404, 405) else BULK_PATH
    return bool(c.bulk_path)


# ------------------------------------------------------------------------------------ baselines

def run_baseline(tmp: Path, script: str, args: list[str], label: str, timeout_s: float) -> dict:
    """Run scripts/baselines/<script> with the venv's Python and parse the JSON it writes to --out.

    Never raises: a missing script, a non-zero exit, a timeout or unreadable JSON is recorded as
    {"not_run": "<why>"}. The script runs in its own session; on a timeout its process group (whose
    id is the PID we started) is killed, so its children go too."""
    path = REPO / "scripts" / "baselines" / script
    if not path.exists():
        return {"not_run": f"scripts/baselines/{script} does not exist"}
    out = tmp / "baselines" / f"{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".log")
    argv = [venv_python(), str(path), *args, "--out", str(out)]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"not_run": f"timed out after {timeout_s:.0f} s", "argv": argv[1:], "log_tail": _tail(log_path)}
    finally:
        if p.poll() is None:
            # Its own session: the group id is the PID we started. SIGTERM first, so that it can
            # stop its children and remove its files; SIGKILL the group after 5 s.
            for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
    elapsed = round(time.monotonic() - t0, 1)
    if rc != 0:
        return {"not_run": f"exit status {rc}", "argv": argv[1:], "log_tail": _tail(log_path), "elapsed_s": elapsed}
    try:
        res = json.loads(out.read_text())
    except (OSError, ValueError) as e:
        return {"not_run": f"no JSON in --out ({e})", "argv": argv[1:], "log_tail": _tail(log_path), "elapsed_s": elapsed}
    if not isinstance(res, dict):
        return {"not_run": "its JSON is not an object", "argv": argv[1:]}
    res["argv"] = argv[1:]
    res["elapsed_s"] = elapsed
    print(f"[bench] baseline {label}: done in {elapsed} s", file=sys.stderr)
    return res


def _tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def ratio(ours, theirs, digits: int = 2):
    """ours ÷ theirs, or None when either is missing or theirs is 0."""
    if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)) or not theirs:
        return None
    return round(ours / theirs, digits)


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
    wait_for(lambda: all(len(c.get(leader, f"/v1/jobs/{j}/runs?limit=5")[1]["runs"]) >= 1 for j in jobs), 20,
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
            # Kill at phase k/trials of a second: this second's if that is still 50 ms ahead, else
            # the next one's.
            phase_ms = (k * 1000) // trials
            now = wall_ms()
            target = (now // 1000) * 1000 + phase_ms
            while target - now < 50:
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
                        # The earliest slot of the first fire: an entry can carry two slots of a
                        # job (fire_ahead_span_ms), and only its first waits for fire_ahead_ms.
                        r = min(hits, key=lambda r: (iso_ms(r["fired_at"]), r["slot_ms"]))
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
            # (Fired ahead, a slot can be committed fire_ahead_ms before it is due.)
            trial["observed_minus_slot_wait_ms"] = round(first["observed_ms"] - max(0.0, first["slot_minus_kill_ms"] - fire_ahead_ms()), 1)
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


# ------------------------------------------------------------------------------------ 2. writes: lone writes (the registration rate is below)

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


# ------------------------------------------------------------------------------------ 3. storm (the burst of aligned one-shot slots)

def burst(c: BenchCluster, m: int, logs: FireLogs | None = None, margin_s: float = 1.5) -> dict:
    """M one-shot jobs due at the same instant T; how long the leader takes to commit all M slots.
    With the fire-commit log (``logs``), each slot's fire lag: the leader's commit time minus T.

    The jobs are registered first (register_jobs: bulk, or 32 concurrent PUTs), with T far enough ahead that the last
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
    # (The same registrar as the registration below: bulk when the node has it, else PUT.)
    ncal = max(64, min(256, m // 8)) if not bulk_available(c, leader) else min(m, 500)
    cal = register_checked(c, leader, [(f"bc-{k}", IDLE_SPEC) for k in range(ncal)], "storm calibration")
    est_s = m / cal["jobs_per_s"]
    # The leader may commit these slots up to `ahead` ms before T (firing ahead): registration must
    # end, and sampling begin, before then.
    ahead = fire_ahead_ms()
    t_slot = (math.ceil(time.time() + est_s * 1.4 + margin_s + ahead / 1000)) * 1000
    spec = {"schedule": {"at": iso(t_slot)}, "executor": SHELL_TRUE, "misfire": {"policy": "fire_all"}, "queue": BURST_QUEUE}
    print(f"[bench] storm: calibration {cal['jobs_per_s']} jobs/s ({cal['method']}); registering {m} jobs due at {iso(t_slot)} "
          f"(~{est_s:.1f} s of registration expected)", file=sys.stderr)
    reg = register_jobs(c, leader, [(f"b-{k}", spec) for k in range(m)])
    check_alive(c, range(c.n))
    if reg["error_count"]:
        raise BenchError(f"burst registration: {reg['error_count']} errors: {reg['errors']}\n" + node_log_excerpt(c, leader))
    if reg["statuses"].get(500):
        raise BenchError(f"burst registration: 500s {reg['statuses']}\n" + node_log_excerpt(c, leader))
    margin_ms = t_slot - reg["ended_at"] * 1000
    if margin_ms - ahead < 300:
        raise BenchError(f"burst registration ended {margin_ms:.0f} ms before the slot, less than 300 ms before the leader may "
                         f"fire it ({ahead} ms ahead): slower than calibrated; no clean burst")
    print(f"[bench] storm: registered {m} jobs in {reg['seconds']} s ({reg['jobs_per_s']} jobs/s); "
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
    # Sample the leader's counters from 250 ms before the leader may fire the slots (T - ahead).
    time.sleep(max(0.0, (t_slot - ahead - 250 - wall_ms()) / 1000))  # ok-sleep: until just before the burst
    if logs is not None:
        logs.skip_to_end()  # the calibration and registration fired nothing; start clean anyway
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
            if base is None:
                base = smp  # the first sample, before the leader may fire the slots
                if t >= t_slot - ahead:
                    raise BenchError("burst: no sample before the leader could fire the slots (the bench fell behind)")
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
    after = samples[1:]
    first_applied = next((x["t_ms"] for x in after if x["runs"] > base["runs"]), None)
    all_applied = next((x["t_ms"] for x in after if x["runs"] - base["runs"] >= m), None)
    # The sample just before all were applied: the true time lies in (before, all_applied].
    before_all = max((x["t_ms"] for x in samples if x["runs"] - base["runs"] < m), default=0.0)
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
    # Fire lag from the fire-commit log: every slot T that a committed fire turned into a run.
    fire_log = None
    if logs is not None:
        # Every run of T is committed (the samples above saw them applied on the leader); its fire
        # log line follows the commit at once. Read until the log has them all, or 10 s passed.
        recs: list = []
        deadline = time.monotonic() + 10
        while True:
            recs += logs.read_new()
            got = sum(1 for r in recs for s_ in r[2] if s_ == t_slot) >= fired_once + dup
            if got or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop
        raw = [r[0] - t_slot for r in recs for s_ in r[2] if s_ == t_slot]
        lags = [max(0.0, x) for x in raw]  # 0 for a slot committed ahead of it (docs/design.md)
        first_c = min((r[0] for r in recs if t_slot in r[2]), default=None)
        mine = [r for r in recs if t_slot in r[2]]
        span_ms = (max(r[0] for r in mine) - min(r[1] for r in mine)) if mine else None
        fire_log = {"slots": len(lags), "commands": len(mine),
                    "lag_ms": lag_stats(lags), "lags_sample": lag_sample(lags),
                    "commit_minus_slot_ms": summary(raw, 1), "committed_ahead": sum(1 for x in raw if x < 0),
                    "fired_ahead": fired_ahead(raw),
                    "first_plan_to_last_commit_ms": None if span_ms is None else round(span_ms, 1),
                    "slots_per_s": round(len(lags) / (span_ms / 1000), 1) if span_ms else None,
                    "plan_minus_slot_ms_max": round(max((r[1] - t_slot for r in recs if t_slot in r[2]), default=0), 1),
                    "first_commit_minus_slot_ms": None if first_c is None else round(first_c - t_slot, 1),
                    "bad_lines": logs.bad_lines}
        if not got or len(lags) != fired_once + dup:
            fire_log["problem"] = f"the fire logs show {len(lags)} commits of slot T (after 10 s), the job views {fired_once + dup} runs"
    res = {
        "jobs": m, "slot": iso(t_slot), "job_spec": spec, "fire_log": fire_log,
        "calibration": {k: cal[k] for k in ("n", "jobs_per_s", "latency_ms", "method")},
        "registration": {k: v for k, v in reg.items() if k != "ended_at"},
        "registration_margin_s": round(margin_ms / 1000, 2),
        "leader_change_during_registration": changed, "burst_leader": f"node-{leader + 1}",
        "leader_changes_during_burst": leader_changes,
        "queue": {"name": BURST_QUEUE, "max_depth": depth},
        "burst_size": fired_once + dup + qfull, "runs": fired_once, "records_queue_full": qfull,
        "jobs_not_past_slot": unhandled, "lost": lost, "duplicated": dup,
        "first_applied_ms": first_applied, "all_applied_ms": all_applied,
        "all_applied_after_ms": before_all, "slots_fired_counter_ms": all_fired,
        # From T - ahead, when the leader may start committing the burst.
        "fire_ahead_ms": ahead,
        "slots_per_s": round(m / ((all_applied + ahead) / 1000), 1) if all_applied is not None and all_applied + ahead > 0 else None,
        "slots_per_s_upper_bound": round(m / ((before_all + ahead) / 1000), 1) if before_all + ahead > 0 else None,
        "peak_slots_per_s_50ms": round(peak, 1),
        "fired_at_minus_slot_ms": summary(lag, 1),
        "sample_interval_ms": POLL_BURST_S * 1000,
        "samples": samples,
    }
    try:
        res["replicas"] = replica_agreement(c)
    except BenchError as e:
        res["replicas"] = {"agree": False, "error": str(e)}
    print(f"[bench] storm: {m} slots, first applied at +{first_applied} ms, all applied at +{all_applied} ms, "
          f"runs {fired_once}, queue_full {qfull}", file=sys.stderr)
    return res



def storm(tmp: Path, m: int, clusters: list, fire_log_ok: bool, margin_s: float = 1.5) -> dict:
    """The storm: M one-shot jobs all due at one aligned whole second, on a cluster of its own
    with no workers (the burst measurement above, plus the fire lag from the fire-commit log)."""
    c = start_cluster(tmp, "storm", clusters, NO_WORKER, fire_log=True)
    return burst(c, m, FireLogs(c) if fire_log_ok else None, margin_s)


# ------------------------------------------------------------------------------------ 2b. writes: the scenario

def writes(tmp: Path, p: dict, clusters: list, shared: BenchCluster | None = None) -> dict:
    """Lone writes (above), then jobs registered per second through the API: CONCURRENCY clients
    sending PUT /v1/jobs/{name}, and the bulk endpoint when the nodes have it. On ``shared`` when
    given (a quick run), else on a cluster of its own with no workers."""
    c = shared or start_cluster(tmp, "writes", clusters, NO_WORKER)
    out = lone_writes(c, p["writes"])
    out["cluster"] = c.tmp.name + ("" if shared is None else f" (shared, node args {c.extra_args})")
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


# ------------------------------------------------------------------------------------ 4. sweep

#: The golden ratio's fractional part: job k's phase frac(k * PHI) * 1000 ms spreads any prefix of
#: the jobs evenly over the second, so registering in steps keeps every step staggered.
PHI = (math.sqrt(5) - 1) / 2


def stagger_probe(c: Cluster, i: int) -> dict:
    """How an interval job's phase within the second can be set, if at all: a few plausible schedule
    fields are tried with POST /v1/preview (validated like a PUT, nothing stored), and one counts
    only if the previewed slots move to that phase. Since commit 07707e3 that is ``start_at``
    (docs/api.md: slots at start_at + k * every_s). Older code anchors an interval at its creation
    rounded up to a whole second, and its jitter_s is whole seconds below the interval (0 for
    every_s: 1), so every slot falls on a whole second."""
    now = wall_ms()
    target = (int(now) // 1000 + 5) * 1000 + 437  # a phase nothing else produces
    candidates = [("start_at", iso(target)), ("anchor", iso(target)), ("offset_ms", 437)]
    tried = {}
    for field, value in candidates:
        spec = {"schedule": {"every_s": 1, field: value}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"}}
        s, b = c.call(i, "POST", "/v1/preview?count=2", spec)
        tried[field] = s
        if s == 200 and isinstance(b, dict) and b.get("slots") and all(x["slot_ms"] % 1000 == 437 for x in b["slots"]):
            return {"staggered": True, "field": field, "tried": tried,
                    "how": f"job sw-k: schedule.{field} = a whole second in the past + frac(k·φ)·1000 ms, so its slots "
                           "fall at that phase of every second (the first one within a second of its creation)"}
    return {"staggered": False, "tried": tried,
            "why": "no schedule field sets a sub-second phase for an every_s job in this code (start_at came with "
                   "commit 07707e3): its slots fall on whole seconds, so every second all N slots fall due at once"}


#: The stagger's base: a whole second well in the past (set by sweep()). With start_at in the past
#: a job's first slot is the first point of its grid after its creation (docs/api.md), so no slot
#: waits for a base ahead and none is missed; only the phase (start_at mod 1000) matters.
_STAGGER_BASE_MS = 0


def sweep_spec(k: int, stagger: dict) -> dict:
    spec = {"schedule": {"every_s": 1}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"}, "history": 1,
            "queue": SWEEP_QUEUE}
    if stagger.get("staggered"):
        # Job k's phase: frac(k * PHI) of the second; any prefix of the jobs is spread evenly.
        phase = int((k * PHI) % 1 * 1000)
        field = stagger["field"]
        spec["schedule"][field] = phase if field == "offset_ms" else iso(_STAGGER_BASE_MS + phase)
    return spec


def slot_phases(slots: list[int]) -> dict:
    """Where in the second the slots fall: counts per 100 ms bucket of slot mod 1000, the smallest
    and largest bucket's share, and how many distinct millisecond phases there are. Aligned slots
    put everything in bucket 0 with 1 distinct phase."""
    buckets = [0] * 10
    distinct = set()
    for s_ in slots:
        ph = s_ % 1000
        buckets[ph // 100] += 1
        distinct.add(ph)
    n = len(slots)
    return {"buckets_100ms": buckets, "distinct_ms": len(distinct),
            "share_min_pct": round(100 * min(buckets) / n, 1) if n else None,
            "share_max_pct": round(100 * max(buckets) / n, 1) if n else None}


def fired_ahead(raw: list[float]) -> dict:
    """Slots committed before their slot (fire ahead): how many, their share, and by how much
    (lead = slot - commit, ms). ``raw`` holds commit - slot per slot."""
    leads = [-x for x in raw if x < 0]
    return {"n": len(leads), "share_pct": round(100 * len(leads) / len(raw), 1) if raw else None,
            "lead_ms": summary(leads, 1)}


def sweep(tmp: Path, ns: list[int], window_s: float, warmup_s: float, clusters: list, fire_log_ok: bool,
          register_budget_s: float, out: dict) -> dict:
    """N interval jobs every 1 s on one cluster with no workers, for each N in ``ns`` in turn (the
    jobs are added between steps). Per step, after a warm-up, a window of ``window_s``: slots
    committed per second (slots in fire-log records committed in the window), the fire lag of those
    slots (commit time minus slot), and whether the cluster fell behind. Fills ``out`` as it goes
    (so the steps done survive a failure of a later one) and returns it."""
    steps = out.setdefault("steps", [])
    out.update({"queue": {"name": SWEEP_QUEUE, "max_depth": 1_000_000, "on_full": "drop_oldest"}})
    c = start_cluster(tmp, "sweep", clusters, NO_WORKER, fire_log=True)
    leader, _ = leader_checked(c)
    # Runs stay queued (no worker): the deepest queue the limits allow, and drop_oldest so that a
    # full queue still turns every slot into a run (the fire log lists runs, not records).
    put_queue(c, leader, SWEEP_QUEUE, 1_000_000, "drop_oldest")
    stagger = out["stagger"] = stagger_probe(c, leader)
    global _STAGGER_BASE_MS
    _STAGGER_BASE_MS = (int(wall_ms()) // 1000 - 60) * 1000
    out["job_spec"] = sweep_spec(0, stagger)
    out["job_spec_1"] = sweep_spec(1, stagger)
    logs = FireLogs(c) if fire_log_ok else None
    have = 0
    for n in ns:
        leader, _ = leader_checked(c)
        reg = register_checked(c, leader, [(f"sw-{k}", sweep_spec(k, stagger)) for k in range(have, n)],
                               f"sweep N={n}", deadline_s=register_budget_s)
        have = n
        time.sleep(warmup_s)  # ok-sleep: measurement window (warm-up: the last jobs registered reach their first slot)
        leader, st0 = leader_checked(c)
        if logs is not None:
            logs.skip_to_end()
        w0, w1, cpu_win = measurement_window(window_s, c)
        st1 = c.status(leader) or {}
        check_alive(c, range(c.n))
        win_s = (w1 - w0) / 1000
        step = {"n": n, "registration": {k: v for k, v in reg.items() if k not in ("ended_at", "per_second_series")},
                "window_s": round(win_s, 2), "expected_slots": round(n * win_s),
                "leader": f"node-{leader + 1}", "term_changed": st1.get("term") != st0["term"],
                "slots_fired_counter": (st1.get("trigger", {}).get("slots_fired", 0) - st0["trigger"]["slots_fired"])
                if st1.get("term") == st0["term"] else None,
                "rss_kib": {f"node-{i + 1}": rss_kib(c.procs[i].pid) for i in range(c.n)}}
        if logs is not None:
            recs: list = []
            step["fire_log_caught_up"] = wait_fire_log_past(logs, w1, 5, recs)
            win = [r for r in recs if w0 <= r[0] < w1]
            raw = [r[0] - s for r in win for s in r[2]]
            lags = [max(0.0, x) for x in raw]  # 0 for a slot committed ahead of it (docs/design.md)
            per_sec = [0] * int(window_s)
            for r in win:
                per_sec[int((r[0] - w0) // 1000)] += len(r[2])
            committed = len(lags)
            step.update({
                "slots_committed": committed, "fire_commands": len(win),
                "slots_per_s": round(committed / win_s, 1),
                "per_second": {"series": per_sec, "median": pct(per_sec, 50), "min": min(per_sec), "max": max(per_sec)},
                "lag_ms": lag_stats(lags), "lags_sample": lag_sample(lags),
                "commit_minus_slot_ms": summary(raw, 1), "committed_ahead": sum(1 for x in raw if x < 0),
                "fired_ahead": fired_ahead(raw),
                "plan_to_commit_ms": summary([r[0] - r[1] for r in win], 1),
                "slot_phase": slot_phases([s_ for r in win for s_ in r[2]]),
            })
            p99 = step["lag_ms"].get("p99")
            step["fell_behind"] = committed < FELL_BEHIND_SHARE * step["expected_slots"] or (p99 is not None and p99 > FELL_BEHIND_P99_MS)
            step["cluster_cpu_s"] = None if cpu_win is None else round(cpu_win, 2)
            step["cpu_us_per_slot"] = None if not cpu_win or not committed else round(cpu_win * 1e6 / committed, 1)
        else:
            cnt = step["slots_fired_counter"]
            step["slots_per_s"] = None if cnt is None else round(cnt / win_s, 1)
            step["fell_behind"] = None if cnt is None else cnt < FELL_BEHIND_SHARE * step["expected_slots"]
            step["note"] = "no fire log: slots/s from the leader's trigger.slots_fired counter; no fire lag"
        steps.append(step)
        print(f"[bench] sweep N={n}: {step['slots_per_s']} slots/s committed (expected {n}/s), lag "
              f"{step.get('lag_ms', {}).get('p50')} / {step.get('lag_ms', {}).get('p99')} / {step.get('lag_ms', {}).get('max')} ms, "
              f"fell behind: {step['fell_behind']}; slot phases {step.get('slot_phase', {}).get('buckets_100ms')} "
              f"({step.get('slot_phase', {}).get('distinct_ms')} distinct ms)", file=sys.stderr)
        if step["fell_behind"]:
            # Past saturation there is nothing more to learn, and registering more jobs into a
            # saturated cluster times out behind its fire commands (a full run failed that way at
            # N = 100k after falling behind at 30k): the larger N are reported as not run.
            out["not_run_after_falling_behind"] = [m for m in ns if m > n]
            break
    out["fire_log_bad_lines"] = logs.bad_lines if logs else None
    return out


def aps_interval(tmp: Path, ns: list[int], window_s: float, warmup_s: float, margin_s: float) -> dict:
    """APScheduler with the same N, run before the sweep cluster starts (never beside it).
    ``margin_s``: its first slot at least this long after its last add_job."""
    out = {}
    for n in ns:
        out[str(n)] = run_baseline(tmp, "aps_bench.py", ["--mode", "interval", "--jobs", str(n), "--seconds", str(window_s),
                                                         "--warmup", str(warmup_s), "--margin", str(margin_s)],
                                   f"aps-interval-{n}",
                                   timeout_s=warmup_s + window_s + 60 + n / 1000)
        if "not_run" in out[str(n)] and "does not exist" in out[str(n)]["not_run"]:
            for m in ns[ns.index(n) + 1:]:
                out[str(m)] = out[str(n)]
            break
    return out


def falls_behind_at(ns: list[int], flags: list) -> dict:
    """The smallest N that fell behind, or None with the largest N tested that kept up."""
    for n, f in zip(ns, flags):
        if f:
            return {"n": n, "kept_up_to": max([m for m, g in zip(ns, flags) if m < n and g is False], default=None)}
    tested = [n for n, f in zip(ns, flags) if f is False]
    return {"n": None, "kept_up_to": max(tested, default=None)}


# ------------------------------------------------------------------------------------ 5. e2e

def e2e(tmp: Path, n: int, window_s: float, warmup_s: float, slots: int, clusters: list, fire_log_ok: bool,
        shared: BenchCluster | None = None) -> dict:
    """No-op python runs (builtins:id) end to end: N interval jobs every 1 s, workers on (the two
    followers, ``--slots`` each; a leader of several nodes does not execute). Over a window:
    fired (fire log, else the leader's counter), leased, executed and completed per second across
    the cluster (worker counters), and slot -> completion for the window's runs of a sample of jobs."""
    c = shared or start_cluster(tmp, "e2e", clusters, ("--slots", str(slots)), fire_log=True)
    leader, _ = leader_checked(c)
    put_queue(c, leader, E2E_QUEUE, 1_000_000, "reject")
    history = min(1000, int(window_s + warmup_s) + 30)  # every run of the window is still kept at read-back
    spec = {"schedule": {"every_s": 1}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"}, "history": history,
            "queue": E2E_QUEUE}

    def workers():
        sts = {i: c.status(i) for i in range(c.n)}
        if any(s is None for s in sts.values()):
            return None
        w = [s.get("worker", {}) for s in sts.values()]
        return {"completed": sum(x.get("completed", 0) for x in w), "refused": sum(x.get("refused", 0) for x in w),
                "running": sum(x.get("running", 0) for x in w), "sts": sts}

    # Runs completed before (a shared cluster's beacons): the first round is counted from here.
    done0 = (workers() or {}).get("completed", 0)
    reg = register_checked(c, leader, [(f"e2e-{k}", spec) for k in range(n)], f"e2e N={n}")
    try:
        wait_for(lambda: (workers() or {}).get("completed", 0) - done0 >= n, 60, "the first round of runs to complete")
    except AssertionError as e:
        raise BenchError(f"e2e: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
    time.sleep(warmup_s)  # ok-sleep: measurement window (warm-up)
    follower = next(i for i in range(c.n) if i != leader)
    logs = FireLogs(c) if fire_log_ok else None
    leader, _ = leader_checked(c)
    if logs is not None:
        logs.skip_to_end()
    # The window: whole seconds from the next one. The worker counters are read at its start and
    # end (their rates use the times of those reads); the backlog half a second after its start and
    # half a second before its end (mid-second: every second's runs fall due at once, on the second).
    w0 = (wall_ms() // 1000 + 1) * 1000
    w1 = w0 + int(window_s) * 1000

    def at(t_ms):
        time.sleep(max(0.0, (t_ms - wall_ms()) / 1000))  # ok-sleep: measurement window

    at(w0)
    cpu_a = cluster_cpu_s(c)
    ta, a = wall_ms(), workers()
    at(w0 + 500)
    q0 = _queue_depth(c, follower, E2E_QUEUE)
    at(w1 - 500)
    q1 = _queue_depth(c, follower, E2E_QUEUE)
    at(w1)
    tb, b = wall_ms(), workers()
    cpu_b = cluster_cpu_s(c)
    check_alive(c, range(c.n))
    if a is None or b is None:
        raise BenchError("e2e: a node did not answer GET /v1/cluster around the window")
    win_s = (w1 - w0) / 1000
    counters_s = (tb - ta) / 1000
    fired = None
    if logs is not None:
        recs: list = []
        wait_fire_log_past(logs, w1, 5, recs)
        fired = sum(len(r[2]) for r in recs if w0 <= r[0] < w1)
    else:
        la, lb = a["sts"][leader], b["sts"][leader]
        if la["term"] == lb["term"]:
            fired = lb["trigger"]["slots_fired"] - la["trigger"]["slots_fired"]
    d = {k: b[k] - a[k] for k in ("completed", "refused", "running")}
    rates = {"offered": n, "fired": None if fired is None else round(fired / win_s, 1),
             "leased": round((d["completed"] + d["refused"] + d["running"]) / counters_s, 1),
             "executed": round((d["completed"] + d["refused"]) / counters_s, 1),
             "completed": round(d["completed"] / counters_s, 1)}
    lat = _e2e_latency(c, follower, n, w0, w1, history)
    out = {"cluster": c.tmp.name + ("" if shared is None else f" (shared, node args {c.extra_args}; other jobs on it: "
                                                          f"{(a['sts'][leader].get('jobs') or 0) - n})"),
           "jobs": n, "job_spec": spec, "worker_slots_per_node": slots, "registration": {k: reg[k] for k in ("method", "jobs_per_s", "seconds")},
           "window_s": round(win_s, 2), "per_s": rates, "fired_source": "fire log" if logs is not None else "leader's slots_fired counter",
           "refused": d["refused"], "worker_counters_s": round(counters_s, 3), "queue_depth_before_after": [q0, q1],
           "cluster_cpu_s": None if None in (cpu_a, cpu_b) else round(cpu_b - cpu_a, 2),
           "cpu_us_per_run": None if None in (cpu_a, cpu_b) or not d["completed"] else round((cpu_b - cpu_a) * 1e6 / d["completed"], 1),
           **lat}
    print(f"[bench] e2e N={n}: per second {rates}; slot -> completion p50 {lat['slot_to_completion_ms'].get('p50')} ms, "
          f"p99 {lat['slot_to_completion_ms'].get('p99')} ms; backlog {q0} -> {q1}", file=sys.stderr)
    return out


def _queue_depth(c: Cluster, i: int, queue: str) -> dict | None:
    """The queue's depth (queued runs, including runs fired ahead that are not due yet) and ready
    (queued runs already due: the backlog the workers have not taken)."""
    s, b = c.get(i, "/v1/queues")
    if s != 200:
        return None
    q = next((q for q in b["queues"] if q["name"] == queue), {})
    return {"depth": q.get("depth", 0), "ready": q.get("ready", 0)}


def _e2e_latency(c: Cluster, i: int, n: int, w0: float, w1: float, history: int) -> dict:
    """Slot -> finished_at and slot -> started_at of every run with its slot in [w0, w1) of a
    sample of jobs (every (n / E2E_SAMPLE_JOBS)-th), read from node i's replica once all of them
    are finished (or 15 s passed: those are counted as unfinished)."""
    step = max(1, n // E2E_SAMPLE_JOBS)
    pending = {f"e2e-{k}" for k in range(0, n, step)}
    sample = len(pending)
    done: dict[str, list] = {}
    unfinished: dict[str, int] = {}
    conn = Conn(c.api_ports[i])
    deadline = time.monotonic() + 15
    try:
        while pending:
            for name in sorted(pending):
                s, b = conn.get(f"/v1/jobs/{name}/runs?limit={history}")
                if s != 200:
                    raise BenchError(f"e2e: GET /v1/jobs/{name}/runs on node-{i + 1}: {s} {b}")
                runs = [r for r in b["runs"] if r.get("kind") != "manual" and r["state"] not in ("skipped", "coalesced")
                        and w0 <= r["slot_ms"] < w1]
                open_ = [r for r in runs if r["state"] in ("queued", "running")]
                if not open_:
                    done[name] = runs
                    pending.discard(name)
                    unfinished.pop(name, None)
                else:
                    unfinished[name] = len(open_)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # ok-sleep: polling interval inside a deadline loop
    finally:
        conn.close()
    runs = [r for rs in done.values() for r in rs]
    fin = [iso_ms(r["finished_at"]) - r["slot_ms"] for r in runs if r.get("finished_at")]
    start = [iso_ms(r["started_at"]) - r["slot_ms"] for r in runs if r.get("started_at")]
    states: dict[str, int] = {}
    for r in runs:
        states[r["state"]] = states.get(r["state"], 0) + 1
    return {"latency_sample": {"jobs": sample, "runs": len(runs), "states": states,
                               "unfinished_after_15_s": sum(unfinished.values()), "jobs_unfinished": len(unfinished)},
            "slot_to_completion_ms": summary(fin, 1), "slot_to_start_ms": summary(start, 1)}


# ------------------------------------------------------------------------------------ 6. scale

#: The in-process state-machine measurement's repeats: snapshot and restore are timed this many
#: times up to STATE_REPEAT_MAX_N jobs (median and spread), once above.
STATE_REPEATS = 3
STATE_REPEAT_MAX_N = 100_000


def state_machine_child(n: int) -> dict:
    """Runs in a subprocess of its own (``--state-machine-child N``), with the nodes' code
    (CODE_DIR) on PYTHONPATH: builds a SchedulerState holding N jobs the way a node's replica
    does (put_jobs commands of at most command_bytes_max, encoded with core.commands and applied
    with apply_bytes; each job validated with model.validate_job and positioned with
    policy.initial_position, as the API's bulk path does), then times state.snapshot() (what a
    node's dump writer encodes) and SchedulerState().restore(bytes) (what a node loads from its
    dump at start), and reads this process's VmRSS."""
    import gc

    import msgpack

    import raftsched
    from raftsched.core import commands, limits, model, policy, schedule
    from raftsched.core.state import SchedulerState
    gen0 = None
    try:  # the node's garbage collector setting (raftsched/gcpolicy.py), when the code has one
        from raftsched.gcpolicy import GC_GEN0_THRESHOLD as gen0
    except (ImportError, AttributeError):
        try:  # where older code kept it
            from raftsched.node.node import GC_GEN0_THRESHOLD as gen0
        except (ImportError, AttributeError):
            pass
    if gen0:
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(gen0, g1, g2)
    pid = os.getpid()
    rss_start = rss_kib(pid)
    state = SchedulerState()
    now = int(time.time() * 1000)
    budget = limits.command_bytes_max - 1024  # the put_jobs envelope
    items_max = getattr(limits, "put_jobs_items_max", 500)
    t_apply = 0.0
    n_cmds = 0
    cmd_bytes = 0

    def flush(items):
        nonlocal t_apply, n_cmds, cmd_bytes
        data = commands.encode(commands.make("put_jobs", now, f"sm-{n_cmds}", jobs=items))
        t = time.perf_counter()
        r = state.apply_bytes(data)
        t_apply += time.perf_counter() - t
        if not r.get("ok"):
            raise RuntimeError(f"put_jobs command {n_cmds} refused: {r}")
        n_cmds += 1
        cmd_bytes += len(data)

    t0 = time.perf_counter()
    items, size = [], 0
    for k in range(n):
        name = f"s-{k}"
        spec = model.validate_job(name, fleet_spec(k))
        anchor, cursor = policy.initial_position(spec["schedule"], now)
        item = {"name": name, "spec": spec, "next": schedule.next_slot_after(spec["schedule"], cursor, anchor),
                "cursor": cursor, "anchor": anchor, "create_only": False}
        isz = len(msgpack.packb(item, use_bin_type=True))
        if items and (size + isz > budget or len(items) >= items_max):
            flush(items)
            items, size = [], 0
        items.append(item)
        size += isz
    if items:
        flush(items)
    del items
    build_s = time.perf_counter() - t0
    rss_built = rss_kib(pid)
    if len(state.jobs) != n:
        raise RuntimeError(f"the state holds {len(state.jobs)} jobs, not {n}")
    repeats = STATE_REPEATS if n <= STATE_REPEAT_MAX_N else 1
    snap_s, restore_s = [], []
    data = b""
    for _ in range(repeats):
        data = b""
        t = time.perf_counter()
        data = state.snapshot()
        snap_s.append(time.perf_counter() - t)
    identical = None
    for r in range(repeats):
        s2 = SchedulerState()
        t = time.perf_counter()
        s2.restore(data)
        restore_s.append(time.perf_counter() - t)
        if r == repeats - 1:
            if len(s2.jobs) != n:
                raise RuntimeError(f"the restored state holds {len(s2.jobs)} jobs, not {n}")
            identical = s2.snapshot() == data
        del s2
    rss_end = rss_kib(pid)
    return {"n": n, "code": str(Path(raftsched.__file__).resolve().parent), "gc_gen0_threshold": gc.get_threshold()[0],
            "due_index": getattr(state, "due_index", None), "job_spec_0": fleet_spec(0),
            "build_s": round(build_s, 2), "apply_s": round(t_apply, 2), "put_jobs_commands": n_cmds, "command_bytes": cmd_bytes,
            "rss_kib_start": rss_start.get("VmRSS"), "rss_kib_built": rss_built.get("VmRSS"),
            "rss_mib_built": round(rss_built.get("VmRSS", 0) / 1024, 1),
            "state_mib": round((rss_built.get("VmRSS", 0) - rss_start.get("VmRSS", 0)) / 1024, 1),
            "peak_mib": round(rss_end.get("VmHWM", 0) / 1024, 1),
            "snapshot_bytes": len(data), "repeats": repeats,
            "snapshot_s": summary(snap_s, 3), "restore_s": summary(restore_s, 3),
            "snapshot_plus_restore_s": round(pct(snap_s, 50) + pct(restore_s, 50), 3),
            "round_trip_identical": identical}


def state_machine(tmp: Path, n: int, timeout_s: float) -> dict:
    """state_machine_child(n) in a subprocess (this script, the venv's Python, the nodes' code on
    PYTHONPATH), stopped by its PID on a timeout. Raises BenchError when it fails."""
    argv = [venv_python(), str(Path(__file__).resolve()), "--state-machine-child", str(n)]
    env = dict(os.environ, PYTHONPATH=str(CODE_DIR))
    log = tmp / f"state-machine-{n}.log"
    t0 = time.monotonic()
    with open(log, "wb") as err:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, cwd=CODE_DIR, env=env)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"state machine N={n}: not done after {timeout_s:.0f} s\n{_tail(log)}") from None
    finally:
        if p.poll() is None:
            p.kill()  # by its PID (Popen.kill)
            p.wait(timeout=10)
    if p.returncode != 0:
        raise BenchError(f"state machine N={n}: exit status {p.returncode}\n{_tail(log)}")
    try:
        res = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise BenchError(f"state machine N={n}: no JSON on stdout ({e})\n{_tail(log)}") from None
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print(f"[bench] state machine N={n}: built in {res['build_s']} s, RSS {res['rss_mib_built']} MiB "
          f"(+{res['state_mib']} MiB), snapshot {res['snapshot_bytes']:,} B in {res['snapshot_s']['p50']} s, "
          f"restore {res['restore_s']['p50']} s, round trip identical: {res['round_trip_identical']}", file=sys.stderr)
    return res


def journal_info(path: Path) -> dict:
    """A pysyncobj journal file (raft.journal): its size on disk, and the records it holds (what
    a node replays at start, on top of its last full dump): their bytes, count and first/last
    index. The live part ends at the last-record offset in its header (pysyncobj/journal.py,
    format 1); a node cuts the file back to it at each compaction, and code before that let the
    file only grow (its size then a high-water mark)."""
    import mmap
    import struct
    out: dict = {"file_bytes": None}
    try:
        f = open(path, "rb")
    except OSError:
        return out
    with f:
        size = os.fstat(f.fileno()).st_size
        out["file_bytes"] = size
        if size < 40:
            return out
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as raw:
            _journal_records(raw, out)
    return out


def _journal_records(raw, out: dict) -> None:
    import struct
    try:
        # Header: name (24 bytes), version (8), format (uint32), last-record offset (uint32).
        (version,) = struct.unpack_from("<I", raw, 32)
        (last,) = struct.unpack_from("<I", raw, 36)
        first = 40
        if version != 1 or not first <= last <= len(raw):
            return
        off, count, idx0, idx1 = first, 0, None, None
        while off < last:
            (size,) = struct.unpack_from("<I", raw, off)
            idx, _term = struct.unpack_from("<QQ", raw, off + 4)
            idx0 = idx if idx0 is None else idx0
            idx1 = idx
            count += 1
            off += size + 8
        out.update({"records_bytes": last - first, "records": count, "first_index": idx0, "last_index": idx1})
    except struct.error:
        pass



def scale(tmp: Path, ns: list[int], state_ns: list[int], clusters: list, fire_log_ok: bool, register_budget_s: float,
          out: dict, shared: BenchCluster | None = None) -> dict:
    """First, in-process, for each N in ``state_ns``: the state machine alone holding N jobs
    (state_machine: its memory, snapshot and restore time), before any cluster of this scenario
    starts. Then, on a cluster (``shared`` when given, else one of its own with no workers), for
    each N in ``ns`` (jobs added between steps): resident memory of each node once every replica
    holds N idle interval jobs (fleet_spec) plus three beacons that fire every second, then a
    whole-cluster cold restart: stop all three by PID, start them on their data dirs, and time how
    long until every node has restored every job and until the first new fire commits. Fills
    ``out`` as it goes and returns it."""
    steps = out.setdefault("steps", [])
    out.update({"job_spec": SCALE_SPEC, "job_spec_k": "the same with executor.url http://127.0.0.1:9/hooks/s-k",
                "journal_bytes_compact": code_limit("journal_bytes_compact"),
                "beacon_spec": BEACON_SPEC,
                "snapshot": "no API triggers a snapshot on a node, so snapshot and restore are measured in process "
                            "(state_machine): SchedulerState.snapshot() and restore() with N jobs"})
    sm = out.setdefault("state_machine", {
        "what": "in-process state-machine figures: one SchedulerState built through apply (put_jobs commands), in a "
                "subprocess of its own; not a node (no Raft, no API, no journal)", "steps": []})
    for n in state_ns:
        sm["steps"].append(state_machine(tmp, n, timeout_s=120 + n / 250))
    c = shared or start_cluster(tmp, "scale", clusters, NO_WORKER, fire_log=True)
    out["cluster"] = c.tmp.name + ("" if shared is None else f" (shared, node args {c.extra_args})")
    leader, st = leader_checked(c)
    base = st.get("jobs") or 0  # jobs an earlier scenario left on a shared cluster
    out["jobs_before"] = base
    for k in range(3):
        put_ok(c, leader, f"beacon-{k}", BEACON_SPEC)
    logs = FireLogs(c) if fire_log_ok else None
    have = 0
    for n in ns:
        leader, _ = leader_checked(c)
        total = base + 3 + n
        reg = register_checked(c, leader, [(f"s-{k}", fleet_spec(k)) for k in range(have, n)], f"scale N={n}",
                               deadline_s=register_budget_s, expect_jobs=total)
        have = n
        try:
            wait_for(lambda: all((c.status(i) or {}).get("jobs") == total for i in range(c.n)), 60 + n / 2000,
                     f"every replica to hold {total} jobs")
        except AssertionError as e:
            raise BenchError(f"scale: {e}") from None
        step = {"n": n, "jobs_total": total,
                "registration": {k: reg[k] for k in ("method", "jobs_per_s", "seconds", "latency_ms")},
                "rss_kib": {f"node-{i + 1}": rss_kib(c.procs[i].pid) for i in range(c.n)},
                "data_dir_bytes": {f"node-{i + 1}": dir_sizes(c.data_dir(i)) for i in range(c.n)}}
        step["rss_mib_max"] = round(max(v.get("VmRSS", 0) for v in step["rss_kib"].values()) / 1024, 1)
        step["restart"] = cold_restart(c, total, logs)
        step["rss_kib_after_restart"] = {f"node-{i + 1}": rss_kib(c.procs[i].pid) for i in range(c.n)}
        steps.append(step)
        r = step["restart"]
        print(f"[bench] scale N={n}: RSS max {step['rss_mib_max']} MiB; cold restart: all restored in {r['all_restored_s']} s, "
              f"first fire {r['first_fire_s']} s after start ({r['first_fire_source']}); journal records replayed "
              f"{[j.get('records') for j in r['journal'].values()]} ({[j.get('records_bytes') for j in r['journal'].values()]} B)",
              file=sys.stderr)
    return out


def cold_restart(c: BenchCluster, expect_jobs: int, logs: FireLogs | None) -> dict:
    """Stop every node (SIGTERM by PID, SIGKILL after 10 s), start them again on their data dirs
    and ports, and time (from the start) each node's API answering, a leader agreed, each node
    holding ``expect_jobs`` jobs with last_applied at least the commit index before the stop, and
    the first fire committed after the start (fire log; else a run with fired_at after the start)."""
    leader, _ = leader_checked(c)
    s, b = c.get(leader, "/v1/jobs?limit=1&consistent=true")  # a barrier: everything acknowledged is committed
    if s != 200:
        raise BenchError(f"scale: barrier read on node-{leader + 1}: {s} {b}")
    ci = (c.status(leader) or {}).get("commit_index")
    t0 = time.monotonic()
    c.stop()
    stop_s = time.monotonic() - t0
    # What the start will load: each node's last full dump and the journal written since the last
    # log compaction (pysyncobj compacts after 5,000 entries or 300 s; the node also asks for one
    # per limits.journal_bytes_compact applied), which it replays entry by entry.
    journal = {f"node-{i + 1}": journal_info(c.data_dir(i) / "raft.journal") for i in range(c.n)}
    dump = {f"node-{i + 1}": (c.data_dir(i) / "raft.dump").stat().st_size if (c.data_dir(i) / "raft.dump").exists() else None
            for i in range(c.n)}
    if logs is not None:
        logs.read_new()  # drop what was committed before the stop
    t_start = wall_ms()
    t1 = time.monotonic()
    c.start()
    api_up, restored, leader_at, first_fire = {}, {}, None, None
    deadline = t1 + max(120.0, expect_jobs / 2000)
    fire_src = "fire log" if logs is not None else "GET /v1/runs: a beacon run with fired_at after the start"
    while True:
        now = time.monotonic() - t1
        for i in range(c.n):
            st = c.status(i)
            if st is None:
                continue
            api_up.setdefault(i, round(now, 2))
            if st.get("jobs", 0) >= expect_jobs and st.get("last_applied", 0) >= ci:
                restored.setdefault(i, round(now, 2))
        if leader_at is None and c.leader() is not None:
            leader_at = round(time.monotonic() - t1, 2)
        if first_fire is None:
            if logs is not None:
                new = [r for r in logs.read_new() if r[0] >= t_start]
                if new:
                    r = min(new, key=lambda r: r[0])
                    first_fire = {"s": round((r[0] - t_start) / 1000, 2), "slot_minus_start_ms": round(min(r[2]) - t_start) if r[2] else None}
            else:
                for i in api_up:
                    s_, b_ = c.get(i, "/v1/runs?limit=5")
                    hits = [iso_ms(x["fired_at"]) for x in (b_.get("runs", []) if s_ == 200 else [])
                            if x.get("fired_at") and iso_ms(x["fired_at"]) > t_start]
                    if hits:
                        first_fire = {"s": round((min(hits) - t_start) / 1000, 2), "seen_s": round(time.monotonic() - t1, 2)}
                        break
        if len(restored) == c.n and first_fire is not None:
            break
        check_alive(c, range(c.n))
        if time.monotonic() > deadline:
            raise BenchError(f"scale: cold restart not done after {deadline - t1:.0f} s: API up {api_up}, restored {restored}, "
                             f"leader at {leader_at}, first fire {first_fire}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n)))
        time.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop
    return {"commit_index_before": ci, "journal": journal, "dump_bytes": dump, "stop_s": round(stop_s, 2), "stop": "SIGTERM to each node by PID (SIGKILL after 10 s)",
            "api_up_s": {f"node-{i + 1}": v for i, v in sorted(api_up.items())}, "leader_s": leader_at,
            "restored_s": {f"node-{i + 1}": v for i, v in sorted(restored.items())},
            "all_restored_s": max(restored.values()), "first_fire_s": first_fire["s"], "first_fire": first_fire,
            "first_fire_source": fire_src}


# ------------------------------------------------------------------------------------ replicas, logs, machine

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
        "packages": {p: ver(p) for p in ("pysyncobj", "aiohttp", "msgpack", "croniter", "apscheduler", "matplotlib")},
        "git_commit": commit, "git_dirty": dirty,
    }



# ------------------------------------------------------------------------------------ report


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float) and v < 1000:
        return f"{round(v, 1)}{unit}"
    if isinstance(v, float) and v >= 1000:
        return f"{v:,.0f}{unit}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1000:
        return f"{v:,}{unit}"
    return f"{v}{unit}"


def fmt_ratio(r) -> str:
    return "-" if r is None else f"{r}×"


def _ppm(d: dict | None) -> str:
    """p50 / p99 / max of a summary (or "-")."""
    if not isinstance(d, dict) or not d.get("n", d.get("p50")):
        return "-"
    return f"{fmt(d.get('p50'))} / {fmt(d.get('p99'))} / {fmt(d.get('max'))}"


def _not_run(b) -> str | None:
    if not isinstance(b, dict):
        return "not run"
    if "not_run" in b:
        return f"not run: {b['not_run']}"
    return None


def _ahead(fa: dict) -> str:
    """'share % / lead p50 ms' of fired_ahead()."""
    if fa.get("share_pct") is None:
        return "-"
    return f"{fa['share_pct']} % / {fmt((fa.get('lead_ms') or {}).get('p50'))}"


def _kn(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n))


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"### raftsched bench ({res['profile']}), {res['started_at']}", "",
             f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, Python {m['python']}, "
             + ", ".join(f"{k} {v}" for k, v in m["packages"].items()),
             "", "Code: " + (f"commit {res['code']['commit'][:12]} (--git-ref {res['code']['ref']})" if res["code"].get("commit")
                             else f"working tree at {m['git_commit']}{' with uncommitted changes' if m['git_dirty'] else ''}")
             + f"; command: `{res['command']}`; {res.get('elapsed_s', '?')} s",
             "", "Fire log: " + res["fire_log"]["note"] + f". Registration: {res['registration_note']}.",
             "", "| scenario | figure | raftsched | baseline | raftsched ÷ baseline |", "|---|---|---|---|---|"]

    def row(scen, fig, ours="-", base="-", r=None):
        lines.append(f"| {scen} | {fig} | {ours} | {base} | {fmt_ratio(r)} |")

    raw = res.get("raw_raft")
    raw_ok = isinstance(raw, dict) and "leader" in raw
    f = res.get("failover")
    if isinstance(f, dict) and "trials" in f:
        o, e, x = f["first_fire_observed_ms"], f["election_observed_ms"], f["observed_minus_slot_wait_ms"]
        row(f"fail-over ({len(f['trials'])} kill -9 of the leader, {f['jobs']} jobs every 1 s)",
            "SIGKILL → first run with fired_at > kill, seen on a survivor (ms) p50 / p99 / max", _ppm(o))
        row("", "same, minus the wait for the first slot due after the kill, if any (ms) p50 / p99 / max", _ppm(x))
        row("", "SIGKILL → a survivor reports role=leader in a new term (ms) p50 / p99 / max", _ppm(e))
        row("", "killed node restarted → caught up (s) p50 / max", f"{f['restart_catch_up_s']['p50']} / {f['restart_catch_up_s']['max']}")
        row("", f"slots lost / duplicated (of {f['slots_audited']} audited on 3 replicas)", f"{f['slots_lost']} / {f['slots_duplicated']}")
    w = res.get("writes")
    if isinstance(w, dict) and "leader" in w:
        for role in ("leader", "follower"):
            if role in w:
                lat = w[role]["latency_ms"]
                row(f"lone writes ({w['n']} sequential PUT, 1 client{'; on the shared cluster' if 'shared' in str(w.get('cluster')) else ''})"
                    if role == "leader" else "",
                    f"to the {role}: p50 / p99 / max (ms), writes/s", f"{_ppm(lat)}; {w[role]['writes_per_s']}")
        for key, label in (("register_put", f"{CONCURRENCY} clients, PUT per job"), ("register_bulk", f"bulk endpoint, {BULK_CONCURRENCY} clients")):
            r = w.get(key) or {}
            if "not_run" in r:
                row("", f"jobs registered per second ({label})", r["not_run"])
            elif r:
                pw = r.get("per_whole_second")
                row("", f"jobs registered per second ({label}; {fmt(r['n'])} jobs): jobs/s (whole seconds min-max); request p50 / p99 ms",
                    f"{fmt(r['jobs_per_s'])}" + (f" ({fmt(pw['min'])}-{fmt(pw['max'])})" if pw else "")
                    + f"; {r['latency_ms'].get('p50')} / {r['latency_ms'].get('p99')}")
    sw = res.get("sweep")
    if isinstance(sw, dict) and "ours" in sw:
        ours, aps = sw["ours"], sw.get("apscheduler", {})
        sg = ours.get("stagger") or {}
        stag = (f"staggered: schedule.{sg.get('field')} gives job k the phase frac(k·φ) of the second; APScheduler's job k "
                "starts at k/N s" if sg.get("staggered")
                else "ours NOT staggered: all N due on each whole second; APScheduler's spread over the second")
        for st in ours.get("steps", []):
            a = aps.get(str(st["n"]), {})
            nr = _not_run(a)
            ps = st.get("per_second") or {}
            row(f"sweep N={_kn(st['n'])} (every 1 s, {stag}; window {st['window_s']} s)",
                "slots committed per second (whole seconds: median, min-max); baseline: APScheduler fires/s",
                f"{fmt(st.get('slots_per_s'))}" + (f" ({fmt(ps.get('median'))}, {fmt(ps.get('min'))}-{fmt(ps.get('max'))})" if ps else ""),
                nr or fmt(a.get("fires_per_s")), ratio(st.get("slots_per_s"), a.get("fires_per_s")))
            lag = st.get("lag_ms")
            row("", f"fire lag = commit − slot, 0 if committed ahead ({fmt(st.get('committed_ahead'))} were) (ms) p50 / p99 / max; "
                    "baseline: run time − scheduled time",
                _ppm(lag) if lag else "no fire log", nr or _ppm(a.get("lag_ms")), ratio((lag or {}).get("p99"), (a.get("lag_ms") or {}).get("p99")))
            fa = st.get("fired_ahead")
            if fa:
                row("", "slots committed before their slot (fired ahead), % / lead p50 (ms)", _ahead(fa))
            ph = st.get("slot_phase")
            if ph:
                row("", "where the window's slots fall in the second (slot mod 1000 ms): share of the smallest-largest "
                        "100 ms bucket; distinct ms phases", f"{ph['share_min_pct']}-{ph['share_max_pct']} %; {fmt(ph['distinct_ms'])}",
                    nr or "k/N of the second by construction")
            row("", f"fell behind (< {FELL_BEHIND_SHARE:.0%} of N × window committed, or p99 > {FELL_BEHIND_P99_MS} ms)",
                {True: "yes", False: "no", None: "-"}[st.get("fell_behind")], nr or {True: "yes", False: "no"}.get(a.get("fell_behind"), "-"))
            if st.get("cpu_us_per_slot") is not None:
                row("", "CPU of the three node processes per committed slot (µs; cores busy in the window)",
                    f"{fmt(st['cpu_us_per_slot'])} ({st['cluster_cpu_s'] / st['window_s']:.2f})")
        for skipped_n in ours.get("not_run_after_falling_behind") or []:
            a = aps.get(str(skipped_n), {})
            row(f"sweep N={_kn(skipped_n)}", "not run for raftsched: it fell behind at a smaller N; baseline: APScheduler fires/s, lag p50 / p99 / max (ms)",
                "-", _not_run(a) or f"{fmt(a.get('fires_per_s'))}; {_ppm(a.get('lag_ms'))}")
        fb = sw.get("falls_behind_at", {})

        def fb_s(d):
            if not d:
                return "-"
            if d.get("n") is None:
                return f"did not (kept up to N={_kn(d['kept_up_to'])}, the largest tested)" if d.get("kept_up_to") else "-"
            return f"N={_kn(d['n'])}" + (f" (kept up at {_kn(d['kept_up_to'])})" if d.get("kept_up_to") else "")
        row("sweep", "falls behind first at", fb_s(fb.get("raftsched")), fb_s(fb.get("apscheduler")))
    stm = res.get("storm")
    if isinstance(stm, dict) and "ours" in stm:
        b, a = stm["ours"], stm.get("apscheduler", {})
        nr = _not_run(a)
        if "burst_size" in b:
            fl = b.get("fire_log")
            lag = (fl or {}).get("lag_ms")
            row(f"storm ({fmt(b['jobs'])} one-shot jobs due at one aligned second)",
                f"fire lag = commit − slot, 0 if committed ahead ({fmt((fl or {}).get('committed_ahead'))} were) (ms) p50 / p99 / max; "
                "baseline: APScheduler run time − scheduled time",
                _ppm(lag) if lag else "no fire log", nr or _ppm(a.get("lag_ms")),
                ratio((lag or {}).get("p99"), (a.get("lag_ms") or {}).get("p99")))
            if (fl or {}).get("fired_ahead"):
                row("", "slots committed before their slot (fired ahead), % / lead p50 (ms)", _ahead(fl["fired_ahead"]))
            if a.get("slot_to_last_fire_ms") is not None or fl:
                # The raw commit - slot of the last slot committed: negative when the whole storm was
                # committed ahead (no ratio then: it would compare a lead with a lag).
                last = ((fl or {}).get("commit_minus_slot_ms") or {}).get("max")
                row("", "slot → last slot committed (ms, negative = before the slot: fired ahead); baseline: slot → last fire",
                    fmt(last), nr or fmt(a.get("slot_to_last_fire_ms")),
                    ratio(last, a.get("slot_to_last_fire_ms")) if isinstance(last, (int, float)) and last > 0 else None)
            r = b["registration"]
            row("", f"registration ({r.get('method')}): jobs/s; request p50 / p99 ms", f"{fmt(r['jobs_per_s'])}; {r['latency_ms']['p50']} / {r['latency_ms']['p99']}")
            row("", "burst size: slots that became runs + queue_full records (lost / duplicated)",
                f"{fmt(b['burst_size'])} = {fmt(b['runs'])} + {b['records_queue_full']} ({b['lost']} / {b['duplicated']})")
            row("", f"slot → first / all applied on the leader (ms, 50 ms samples, negative = before the slot; previous sample "
                    f"{b['all_applied_after_ms']} ms); slots/s from T − {b.get('fire_ahead_ms', 0)} ms (when it may fire)",
                f"{b['first_applied_ms']} / {b['all_applied_ms']}; {fmt(b['slots_per_s'])}")
            if fl and fl.get("slots_per_s"):
                row("", "slots committed per second = burst / (first fire planned → last committed), from the fire log",
                    f"{fmt(fl['slots_per_s'])} ({fl['first_plan_to_last_commit_ms']} ms)")
            row("", "replicas agree afterwards (job count, run count, SHA-256 of every job view and queue depth)",
                "yes" if b.get("replicas", {}).get("agree") else "NO")
    e = res.get("e2e")
    if isinstance(e, dict) and "per_s" in e:
        r = e["per_s"]
        row(f"end to end ({fmt(e['jobs'])} no-op python jobs every 1 s, {e['worker_slots_per_node']} slots per worker; window {e['window_s']} s"
            + ("; on the shared cluster, with the jobs earlier scenarios left on it" if "shared" in str(e.get("cluster")) else "") + ")",
            f"runs per second fired / leased / executed / completed (offered {fmt(r['offered'])}/s)",
            f"{fmt(r['fired'])} / {fmt(r['leased'])} / {fmt(r['executed'])} / {fmt(r['completed'])}")
        ls = e["latency_sample"]
        row("", f"slot → completion (finished_at − slot) ms p50 / p99 / max ({ls['runs']} runs of {ls['jobs']} jobs; "
                f"{ls['unfinished_after_15_s']} unfinished)", _ppm(e["slot_to_completion_ms"]))
        row("", "slot → start (started_at − slot) ms p50 / p99 / max", _ppm(e["slot_to_start_ms"]))
        q = [x or {} for x in (e.get("queue_depth_before_after") or [None, None])]
        row("", "backlog before → after the window: queued runs already due (all queued, with those fired ahead)",
            f"{fmt(q[0].get('ready'))} → {fmt(q[1].get('ready'))} ({fmt(q[0].get('depth'))} → {fmt(q[1].get('depth'))})")
        if e.get("cpu_us_per_run") is not None:
            row("", "CPU of the three node processes per completed run (µs; cores busy in the window)",
                f"{fmt(e['cpu_us_per_run'])} ({e['cluster_cpu_s'] / e['worker_counters_s']:.2f})")
    if raw_ok:
        best = max((s.get("slots_per_s") or 0 for s in (res.get("sweep") or {}).get("ours", {}).get("steps", [])), default=None)
        for role in ("leader", "follower"):
            x = raw.get(role) or {}
            row(f"raw pysyncobj (3 processes, our Raft configuration, pipelined no-op commands, {raw.get('in_flight')} in flight)"
                if role == "leader" else "",
                f"commits per second, client on the {role}; latency p50 / p99 / max (ms)", "-",
                f"{fmt(x.get('commits_per_s'))}; {_ppm(x.get('latency_ms'))}")
        row("", "our best sweep slots/s ÷ raw commits/s on the leader (slots are batched into fire commands)",
            fmt(best or None), fmt((raw.get("leader") or {}).get("commits_per_s")), ratio(best or None, (raw.get("leader") or {}).get("commits_per_s")))
    elif "raw_raft" in res:
        row("raw pysyncobj", "commits per second", "-", _not_run(raw) or "failed")
    sc = res.get("scale")
    if isinstance(sc, dict) and ("steps" in sc or "state_machine" in sc):
        shared_note = "; on the shared cluster" if "shared" in str(sc.get("cluster", "")) else ""
        for st in sc.get("steps", []):
            rss = " / ".join(f"{v.get('VmRSS', 0) / 1024:.0f}" for v in st["rss_kib"].values())
            rr = st["restart"]
            row(f"scale ({_kn(st['n'])} idle interval jobs + 3 every 1 s{shared_note})", "resident memory per node (MiB)", rss)
            jr = rr.get("journal") or {}
            jl = [f"{fmt(j.get('records'))} entries / {round(j['records_bytes'] / 2**20, 1)} MiB"
                  for j in jr.values() if j.get("records_bytes") is not None]
            jtxt = (f"{jl[0]} on each node" if len(jl) == len(jr) and len(set(jl)) == 1 else ", ".join(jl)) or "-"
            jbc = sc.get("journal_bytes_compact")
            dump = [d for d in (rr.get("dump_bytes") or {}).values() if d]
            row("", "whole-cluster cold restart (SIGTERM all three, start again): leader / every job restored on all nodes / "
                    "first new fire committed (s after start). A start loads the node's last full dump and replays the "
                    "raft journal written since the last log compaction (pysyncobj compacts after 5,000 entries or 300 s"
                    + (f"; the node also asks for one per {round(jbc / 2**20)} MiB applied" if jbc else "")
                    + "): journal replayed per node; largest dump",
                f"{rr['leader_s']} / {rr['all_restored_s']} / {rr['first_fire_s']}; journal {jtxt}; "
                + (f"dump {fmt(round(max(dump) / 2**20, 1))} MiB" if dump else "no dump yet"))
        sm = sc.get("state_machine") or {}
        for st in sm.get("steps", []):
            sn, rs = st["snapshot_s"], st["restore_s"]
            spread = (lambda d: f"{d['p50']}" + (f" ({d['min']}-{d['max']} over {d['n']})" if d.get("n", 1) > 1 else ""))
            row(f"scale, in-process state-machine figures ({_kn(st['n'])} jobs in one SchedulerState built through apply, "
                "in a subprocess; not a node)",
                "resident memory of that process with the state built (MiB; the state's share over the interpreter with the code imported)",
                f"{st['rss_mib_built']} (+{st['state_mib']})")
            row("", "state.snapshot(): bytes; time (s) p50 (min-max)",
                f"{fmt(st['snapshot_bytes'])} B ({st['snapshot_bytes'] / 2**20:.1f} MiB); {spread(sn)}")
            row("", "SchedulerState().restore(bytes): time (s) p50 (min-max); restored state snapshots to the same bytes",
                f"{spread(rs)}; {'yes' if st.get('round_trip_identical') else 'NO'}")
            row("", "snapshot + restore (s, p50s)", f"{st['snapshot_plus_restore_s']:.3f}")
        if sc.get("skipped"):
            row("scale (1M jobs)", "resident memory, cold restart, in-process snapshot and restore", f"skipped: {sc['skipped']}")
    for name in ALL_SCENARIOS:
        v = res.get(name)
        if isinstance(v, dict) and "error" in v:
            row(name, "FAILED", v["error"].splitlines()[0][:200].replace("|", "\\|"))
        elif isinstance(v, dict) and "not_run" in v and name != "raw_raft":  # raw_raft has its own row
            row(name, "not run", v["not_run"])
    notes = list(res.get("notes") or [])
    if res.get("shared_cluster"):
        sh = res["shared_cluster"]
        notes.append(f"{', '.join(sh['scenarios'])} ran one after the other on one cluster (node args {sh['node_args']}): "
                     "a quick run checks that every scenario works; its figures are not comparable with a full run's")
    for name in ALL_SCENARIOS:
        la = (res.get(name) or {}).get("loadavg_before_after")
        if la and la[0][0] > 1.0:
            notes.append(f"{name}: load average {la[0][0]} when it started ({m['nproc']} CPUs): other processes were competing for the CPUs")
    b = (res.get("storm") or {}).get("ours") or {}
    if b.get("leader_change_during_registration"):
        ch = b["leader_change_during_registration"]
        notes.append(f"storm: leadership changed during registration: {ch['leader_before']} (term {ch['term_before']}) → "
                     f"{ch['leader_after']} (term {ch['term_after']}); the burst was measured on {b['burst_leader']}")
    for ev in b.get("leader_changes_during_burst") or []:
        notes.append(f"storm: leadership changed {ev['t_ms']} ms after the slot: {ev['from']} (term {ev['term_from']}) → "
                     f"{ev['to']} (term {ev['term_to']}); sampling moved to the new leader")
    if (b.get("fire_log") or {}).get("problem"):
        notes.append("storm: " + b["fire_log"]["problem"])
    for st in ((res.get("sweep") or {}).get("ours") or {}).get("steps", []):
        if st.get("term_changed"):
            notes.append(f"sweep N={st['n']}: the leader's term changed during the window (records of every node were counted)")
        if st.get("fire_log_caught_up") is False:
            notes.append(f"sweep N={st['n']}: no fire-log record committed after the window was seen within 5 s (the leader stalled)")
    for cname, nodes in (res.get("node_log_warnings") or {}).items():
        for node, kinds in nodes.items():
            for key, k in kinds.items():
                notes.append(f"{cname}/{node}: {k['count']} × `{k['first'][24:140]}…`")
    if notes:
        lines += ["", "Notes and warnings:", ""] + [f"- {n}" for n in notes]
    if isinstance(f, dict) and "trials" in f:
        lines += ["", "Fail-over trials:", "",
                  "| # | killed | phase ms | leader seen ms | first fire seen ms | its slot − kill ms | fired_at − kill ms | rejoin s |",
                  "|---|---|---|---|---|---|---|---|"]
        for t in f["trials"]:
            lines.append(f"| {t['trial']} | {t['killed']} | {t['kill_phase_ms']} | {fmt(t['election_observed_ms'])} | {fmt(t['observed_ms'])} | "
                         f"{t['slot_minus_kill_ms']:+.0f} | {t['fired_at_minus_kill_ms']} | {t['restart_catch_up_s']} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> str | None:
    """Fire lag CDFs, ours (solid) and APScheduler (dashed): one panel per sweep N, one for the
    storm. Returns None, or why no plot was written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib is not installed ({e})"
    panels = []
    sw = res.get("sweep") or {}
    for st in (sw.get("ours") or {}).get("steps", []):
        aps = (sw.get("apscheduler") or {}).get(str(st["n"])) or {}
        panels.append((f"sweep: N = {st['n']:,} jobs every 1 s", st.get("lags_sample"), aps.get("lags_sample")))
    stm = res.get("storm") or {}
    if "ours" in stm:
        fl = (stm["ours"] or {}).get("fire_log") or {}
        panels.append((f"storm: {(stm['ours'] or {}).get('jobs', '?'):,} jobs due at one second", fl.get("lags_sample"),
                       (stm.get("apscheduler") or {}).get("lags_sample")))
    if not panels:
        return "no sweep or storm results"
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, ours, theirs) in zip(axes.flat, panels):
        drawn = False
        for vals, label, style in ((ours, "raftsched (commit − slot, 0 if ahead)", "-"), (theirs, "APScheduler (run − scheduled)", "--")):
            if vals:
                s = sorted(max(0.1, float(v)) for v in vals)
                ax.plot(s, [(k + 1) / len(s) for k in range(len(s))], style, label=f"{label}, {len(vals):,} slots" + (" (a sample)" if len(vals) >= LAG_SAMPLE_MAX else ""))
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no data\n(no fire log, baseline not run)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xscale("log")
        ax.set_xlabel("fire lag (ms, log; values below 0.1 shown at 0.1)")
        ax.set_ylabel("share of slots")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"fire lag CDF, {res['profile']} run {res['started_at']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def code_has(text: str) -> bool:
    """Whether the nodes' code (CODE_DIR/raftsched) contains ``text`` (e.g. the bulk route)."""
    for p in (CODE_DIR / "raftsched").rglob("*.py"):
        try:
            if text in p.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small version of every scenario (about a minute; "
                                                         "writes, scale and e2e share one cluster)")
    ap.add_argument("--out", default="bench-results.json", help="JSON results (default: bench-results.json in the cwd)")
    ap.add_argument("--plot", help="PNG of the fire lag distributions (default: --out with .png)")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' data dirs and logs even on success")
    ap.add_argument("--git-ref", help="run the nodes from this commit (git archive into the temp dir) "
                                      "instead of the working tree")
    ap.add_argument("--storm-jobs", "--burst-jobs", dest="storm_jobs", type=int, help="override the storm size")
    ap.add_argument("--sweep-ns", help="override the sweep's job counts, comma-separated (e.g. 1000,10000)")
    ap.add_argument("--e2e-jobs", type=int, help="override the end-to-end scenario's job count (offered runs per second)")
    ap.add_argument("--scale-1m", action="store_true", help="also register 1,000,000 jobs in the scale scenario "
                                                           "(through PUT that takes an hour or more)")
    ap.add_argument("--state-machine-child", type=int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--only", default=",".join(ALL_SCENARIOS), help="comma-separated subset of " + ",".join(ALL_SCENARIOS)
                    + " (burst = storm)")
    args = ap.parse_args(argv)
    if args.state_machine_child:  # the scale scenario's in-process measurement (state_machine)
        print(json.dumps(state_machine_child(args.state_machine_child)))
        return 0
    profile = "quick" if args.quick else "full"
    p = dict(PROFILES[profile])
    only = [("storm" if x.strip() == "burst" else x.strip()) for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in ALL_SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {','.join(ALL_SCENARIOS)}")
    plot_path = Path(args.plot) if args.plot else Path(args.out).with_suffix(".png")

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
    # What the nodes' code offers decides what can be measured, and (for a quick run) how many jobs
    # fit in its time: registering through PUT costs the leader a Raft entry per job.
    fire_log_ok = fire_log_supported()
    bulk = code_has(BULK_PATH.rsplit("/", 1)[-1])
    if args.storm_jobs:
        p["storm_jobs"] = args.storm_jobs
    if args.e2e_jobs:
        p["e2e_jobs"] = args.e2e_jobs
    p["sweep_ns"] = ([int(x) for x in args.sweep_ns.split(",")] if args.sweep_ns
                     else (p["sweep_ns"] if bulk or not p["sweep_ns_put"] else p["sweep_ns_put"]))
    p["scale_ns"] = p["scale_ns"] if bulk or not p["scale_ns_put"] else p["scale_ns_put"]
    skipped_1m = None
    if args.scale_1m:
        p["scale_ns"] = sorted(set(p["scale_ns"] + [SCALE_1M]))
        p["state_ns"] = sorted(set(p["state_ns"] + [SCALE_1M]))
    else:
        skipped_1m = "needs --scale-1m (registering 1M jobs takes minutes with the bulk endpoint, an hour or more through PUT)"
    register_budget_s = 120.0 if args.quick else (5 * 3600.0 if args.scale_1m else 3600.0)
    clusters: list[Cluster] = []
    t0 = time.monotonic()
    res = {"profile": profile, "params": p, "command": " ".join([".venv/bin/python", "scripts/bench.py"] + sys.argv[1:]),
           "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(), "code": code,
           "scenarios": only,
           "fire_log": {"supported": fire_log_ok,
                        "note": ("on (one file per node)" if fire_log_ok else
                                 "NO FIRE LOG: the nodes' code has neither --fire-log nor RAFTSCHED_FIRE_LOG, "
                                 "so there is no fire lag; slots/s come from the leader's trigger counter")},
           "registration_note": (f"bulk endpoint ({BULK_PATH}) found in the code" if bulk else
                                 f"no bulk endpoint ({BULK_PATH}) in the code: PUT per job"
                                 + (", with the smaller *_put sizes" if args.quick else "")),
           "notes": []}
    if not fire_log_ok:
        print("[bench] NO FIRE LOG: the nodes' code has neither --fire-log nor RAFTSCHED_FIRE_LOG; fire lag will be missing", file=sys.stderr)
    failed = []
    order = [n for n in (QUICK_ORDER if p["shared_cluster"] else ALL_SCENARIOS) if n in only]
    res["run_order"] = order
    sharing = [n for n in order if p["shared_cluster"] and n in SHARED_SCENARIOS]
    if sharing:
        res["shared_cluster"] = {"scenarios": sharing, "node_args": ["--slots", str(p["e2e_slots"])], "fire_log": True,
                                 "note": "a quick run's writes, scale and e2e run one after the other on one cluster "
                                         "(workers on, for e2e): their figures include what the earlier ones left on it"}
    shared: BenchCluster | None = None
    shared_starts = 0

    def shared_cluster() -> BenchCluster:
        nonlocal shared, shared_starts
        if shared is None:
            shared_starts += 1
            shared = start_cluster(tmp, "shared" + (f"-{shared_starts}" if shared_starts > 1 else ""), clusters,
                                   ("--slots", str(p["e2e_slots"])), fire_log=True)
        return shared

    try:
        for pos, name in enumerate(order):
            load_before = [round(x, 2) for x in os.getloadavg()]
            t_scen = time.monotonic()
            ok = False
            try:
                if name == "failover":
                    res[name] = failover(tmp, p["failover_trials"], clusters)
                elif name == "writes":
                    res[name] = writes(tmp, p, clusters, shared_cluster() if name in sharing else None)
                elif name == "raw_raft":
                    res[name] = run_baseline(tmp, "raw_raft.py", ["--seconds", str(p["raw_raft_s"]), "--warmup", str(p["raw_raft_warmup_s"]),
                                                            "--in-flight", str(p["raw_raft_in_flight"])],
                                             "raw-raft", timeout_s=2 * (p["raw_raft_s"] + p["raw_raft_warmup_s"]) + 90)
                elif name == "sweep":
                    # APScheduler first, alone; then our cluster (never both at once: they share the CPUs).
                    aps = aps_interval(tmp, p["sweep_ns"], p["sweep_window_s"], p["aps_warmup_s"], p["aps_margin_s"])
                    res[name] = {"apscheduler": aps, "ours": {}}
                    sweep(tmp, p["sweep_ns"], p["sweep_window_s"], p["sweep_warmup_s"], clusters, fire_log_ok, register_budget_s,
                          res[name]["ours"])
                elif name == "storm":
                    res[name] = {"ours": storm(tmp, p["storm_jobs"], clusters, fire_log_ok, p["storm_margin_s"])}
                    _stop_all(clusters)  # the baseline runs alone
                    res[name]["apscheduler"] = run_baseline(tmp, "aps_bench.py", ["--mode", "storm", "--jobs", str(p["storm_jobs"]),
                                                                                   "--margin", str(p["aps_margin_s"])],
                                                            f"aps-storm-{p['storm_jobs']}", timeout_s=90 + p["storm_jobs"] / 500)
                elif name == "e2e":
                    res[name] = e2e(tmp, p["e2e_jobs"], p["e2e_window_s"], p["e2e_warmup_s"], p["e2e_slots"], clusters, fire_log_ok,
                                    shared_cluster() if name in sharing else None)
                elif name == "scale":
                    res[name] = {"skipped": skipped_1m}
                    # The in-process measurement first, before this scenario's cluster starts (on a
                    # quick run the shared cluster is already up, idle).
                    scale(tmp, p["scale_ns"], p["state_ns"], clusters, fire_log_ok, register_budget_s, res[name],
                          shared_cluster() if name in sharing else None)
                ok = True
            except Exception as e:  # any failure of a scenario is reported, and the next one still runs
                failed.append(name)
                partial = res.get(name) if isinstance(res.get(name), dict) else {}
                res[name] = {**partial, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                print(f"[bench] {name} FAILED: {e}", file=sys.stderr)
            # Free the CPUs for the next scenario; the shared cluster stays up for the next scenario
            # that shares it, unless this one failed (the next one then starts a fresh cluster).
            keep = shared if (ok and shared is not None and name in sharing and pos + 1 < len(order)
                              and order[pos + 1] in sharing) else None
            _stop_all([c for c in clusters if c is not keep])
            if keep is None:
                shared = None
            if name == "sweep" and (res[name].get("ours") or {}).get("steps"):
                # Over the steps that ran (all of them, unless the scenario failed part way).
                steps = res[name]["ours"]["steps"]
                ns = [st["n"] for st in steps]
                res[name]["falls_behind_at"] = {
                    "raftsched": falls_behind_at(ns, [st["fell_behind"] for st in steps]),
                    "apscheduler": falls_behind_at(ns, [res[name]["apscheduler"].get(str(n), {}).get("fell_behind") for n in ns])}
            res[name]["loadavg_before_after"] = [load_before, [round(x, 2) for x in os.getloadavg()]]
            res[name]["elapsed_s"] = round(time.monotonic() - t_scen, 1)
            print(f"[bench] {name}: {res[name]['elapsed_s']} s", file=sys.stderr)
            if load_before[0] > 1.0:
                print(f"[bench] WARNING: load average {load_before} before {name}: other work shares the CPUs", file=sys.stderr)
    except KeyboardInterrupt as e:
        failed.append(f"interrupted ({e})")
    finally:
        _stop_all(clusters)
        res["node_log_warnings"] = {c.tmp.name: raft_log_warnings(c) for c in clusters}
        leftover = [pr.pid for c in clusters for pr in c.procs.values() if pr.poll() is None]
        if leftover:
            print(f"[bench] WARNING: processes still running: {leftover}", file=sys.stderr)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    failed += invariant_failures(res, fire_log_ok)
    for name in ("sweep", "storm"):
        for who, b in (((res.get(name) or {}).get("apscheduler") or {}).items() if name == "sweep"
                       else [("storm", (res.get(name) or {}).get("apscheduler"))]):
            if isinstance(b, dict) and "not_run" in b:
                res["notes"].append(f"APScheduler baseline ({name} {who}) not run: {b['not_run']}")
    if isinstance(res.get("raw_raft"), dict) and "not_run" in res["raw_raft"]:
        res["notes"].append(f"raw pysyncobj baseline not run: {res['raw_raft']['not_run']}")
    res["failed"] = failed
    res["ok"] = not failed
    if failed or args.keep:
        res["data_dir"] = str(tmp)
    why = None
    try:
        why = plot(res, plot_path)
    except Exception as e:  # a plot never fails the run; the JSON has every figure
        why = f"{type(e).__name__}: {e}"
    res["plot"] = str(plot_path) if why is None else None
    if why:
        res["notes"].append(f"no plot: {why}")
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    print(f"\nelapsed {res['elapsed_s']} s; JSON in {args.out}" + (f"; plot in {plot_path}" if why is None else ""))
    if failed:
        print(f"FAILED: {failed}; node logs kept in {tmp}", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _stop_all(clusters: list) -> None:
    for c in clusters:
        try:
            c.stop()
        except Exception as e:  # keep stopping the others
            print(f"[bench] stopping a cluster: {e!r}", file=sys.stderr)


def invariant_failures(res: dict, fire_log_ok: bool) -> list[str]:
    """What makes the run fail besides a scenario error: a lost or duplicated slot, replicas that
    disagree, and a fire log that the code has but that stayed empty."""
    failed = []
    f = res.get("failover") or {}
    b = (res.get("storm") or {}).get("ours") or {}
    if f.get("slots_lost") or f.get("slots_duplicated") or f.get("problems"):
        failed.append("fail-over audit: " + "; ".join(f.get("problems") or []))
    if b.get("replicas") and not b["replicas"].get("agree"):
        failed.append(f"storm: replicas: {b['replicas'].get('error') or 'disagree'}")
    if b.get("lost") or b.get("duplicated") or b.get("jobs_not_past_slot"):
        failed.append(f"storm: lost {b.get('lost')}, duplicated {b.get('duplicated')}, jobs whose cursor did not pass "
                      f"the slot {b.get('jobs_not_past_slot')}")
    if fire_log_ok:
        if (b.get("fire_log") or {}).get("problem"):
            failed.append("storm fire log: " + b["fire_log"]["problem"])
        for st in ((res.get("sweep") or {}).get("ours") or {}).get("steps", []):
            if not st.get("slots_committed"):
                failed.append(f"sweep N={st['n']}: the fire logs hold no record committed in the window")
    return failed


if __name__ == "__main__":
    sys.exit(main())
