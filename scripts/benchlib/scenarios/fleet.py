"""The worker fleet (docs/workers.md): end to end through remote workers, and a fleet at rest.

``fleet_e2e``: three nodes that only schedule (``--slots 0``) and W ``raftsched worker``
processes, N no-op python jobs every 1 s: runs completed per second (the workers' accepted
outcomes, from the registry) against the N offered, slot -> start p50 / p99 (the e2e scenario's
sample of jobs), the CPU of the nodes and of the workers per completed run. The runs start no
process by default (``app``: benchlib/noop_app.py's async handler, ``raftsched worker --app``), so
the CPU is what the worker protocol and the log cost a run; ``sandbox`` runs ``builtins:id``
through a plain worker, a process a run as the run user (worker/sandbox.py).

``fleet_rest``: three nodes ``--slots 0`` and M simulated workers (scripts/benchlib/fleet_sim.py,
a few processes of asyncio HTTP clients, one waiting lease request each): the nodes' CPU with
no work (% of one core, all three together), their resident memory per connected worker, then
J jobs every 1 s staggered over the second (fired ahead, as interval jobs are): the time from a
run becoming due to a simulated worker receiving it, p50 / p99."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from raftsched.node import limits as node_limits
from raftsched.worker import limits as worker_limits
from raftsched.testing.procs import Procs, wait_for

from .. import common
from ..common import BenchError, PY_NOOP, REPO, summary, wall_ms
from ..harness import check_alive, leader_checked, node_log_excerpt, put_queue, start_cluster
from ..probes import cluster_cpu_s, rss_kib, tree_cpu_s
from ..register import register_checked
from .e2e import E2E_QUEUE, _e2e_latency

REST_QUEUE = "rest"
SIM_WORKERS_PER_PROC = 2500
#: a scrape of /metrics held a series per worker: at 10 000 workers on a loaded machine it took
#: more than the harness's default 10 s (code before the node's --metrics-workers-max, --git-ref)
METRICS_TIMEOUT_S = 60.0
#: golden-ratio phases: any prefix of the jobs is spread evenly over the second (as the sweep does)
_PHI = 0.6180339887498949


#: fleet_e2e's ways to run a no-op python run: ``app``, an SDK App's async handler in the
#: worker's process (benchlib/noop_app.py); ``sandbox``, ``builtins:id`` in a process of its own
#: as the run user (every python run of a plain worker)
FLEET_EXECUTORS = ("app", "sandbox")
NOOP_APP = "benchlib.noop_app:app"


def _noop_app_spec() -> dict:
    """The spec the App sends for its job (its executor target, its placement on the app's
    workers, queue and misfire), as ``raftsched sync`` would."""
    from benchlib.noop_app import app
    return app.specs()["noop"]


def _worker_cmd(c, wid: str, slots: int, executor: str) -> list[str]:
    urls = ",".join(c.url(i) for i in range(c.n))
    how = ["--app", NOOP_APP] if executor == "app" else ["--executors", "python"]
    if executor == "app" and os.geteuid() == 0:
        how.append("--allow-root-jobs")  # (the no-op app's handlers, as the bench's user)
    return [sys.executable, "-m", "raftsched.cli", "worker", "--url", urls, "--token-file", str(c.token_file),
            "--id", wid, "--slots", str(slots), *how, "--queues", E2E_QUEUE, "--wait-s", "5",
            "--log-level", "warning"]


def _workers(c, prefix: str) -> dict:
    i = c.alive()[0]
    s, b = c.get(i, "/v1/workers")
    if s != 200:
        raise BenchError(f"GET /v1/workers on node-{i + 1}: {s} {b}")
    return {w["id"]: w for w in b["workers"] if w["id"].startswith(prefix)}


def fleet_e2e(tmp: Path, n: int, window_s: float, warmup_s: float, workers: int, slots: int, clusters: list,
              executor: str = "app") -> dict:
    if executor not in FLEET_EXECUTORS:
        raise BenchError(f"fleet_e2e: executor {executor!r} is not one of {', '.join(FLEET_EXECUTORS)}")
    c = start_cluster(tmp, "fleet-e2e", clusters, ("--slots", "0"), fire_log=True)
    procs = Procs(new_session=True)
    try:
        leader, _ = leader_checked(c)
        put_queue(c, leader, E2E_QUEUE, 1_000_000, "reject")
        for k in range(workers):
            procs.start(k, _worker_cmd(c, f"bench-w{k}", slots, executor), c.tmp / f"worker-{k}.log",
                        env={"PYTHONPATH": f"{common.CODE_DIR}{os.pathsep}{REPO / 'scripts'}"}, cwd=common.CODE_DIR)
        try:
            wait_for(lambda: len(_workers(c, "bench-w")) == workers, 30, f"{workers} workers registered")
        except AssertionError as e:
            raise BenchError(f"fleet_e2e: {e}\n" + "\n".join(procs.log_tail(k, 20) for k in range(workers))) from None
        history = min(1000, int(window_s + warmup_s) + 30)
        if executor == "app":
            spec = {**_noop_app_spec(), "history": history}
        else:
            spec = {"schedule": {"every_s": 1}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"},
                    "history": history, "queue": E2E_QUEUE}
        reg = register_checked(c, leader, [(f"e2e-{k}", spec) for k in range(n)], f"fleet_e2e N={n}")

        def counters() -> dict:
            ws = _workers(c, "bench-w")
            return {k: sum(w[k] for w in ws.values()) for k in ("completed", "grants", "held", "releases", "losses")}
        warmup_note = None
        try:
            wait_for(lambda: counters()["completed"] >= n, 60, "the first round of runs to complete")
        except AssertionError as e:
            # As e2e: workers slower than the offered rate are measured as they are.
            done0 = counters()["completed"]
            if done0 <= 0:
                raise BenchError(f"fleet_e2e: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
            warmup_note = f"{done0} of the first round's {n} runs completed within 60 s: the workers complete fewer runs than offered"
            print(f"[bench] fleet_e2e N={n}: {warmup_note}", file=sys.stderr)
        time.sleep(warmup_s)  # ok-sleep: measurement window (warm-up)
        # Half a second past a whole second: the slots are whole seconds and a no-op run completes
        # within ms of its slot, so a window with its edges on them counted one slot's runs, or
        # none, or two (the quick run's 1 s window completed 0 or 100 of 100 offered).
        w0 = (wall_ms() // 1000 + 1) * 1000 + 500
        w1 = w0 + int(window_s) * 1000
        time.sleep(max(0.0, (w0 - wall_ms()) / 1000))  # ok-sleep: measurement window
        pids = [p.pid for p in procs.procs.values()]
        cpu_a, wcpu_a = cluster_cpu_s(c), [tree_cpu_s(p) for p in pids]
        per_node_a = {i: tree_cpu_s(p.pid) for i, p in c.procs.items()}
        lead_a = leader_checked(c)[0]
        ta, a = wall_ms(), counters()
        spies = _profile_start({i: p.pid for i, p in c.procs.items()}, (w1 - ta) / 1000 - 1, "e2e")
        time.sleep(max(0.0, (w1 - wall_ms()) / 1000))  # ok-sleep: measurement window
        tb, b = wall_ms(), counters()
        cpu_b, wcpu_b = cluster_cpu_s(c), [tree_cpu_s(p) for p in pids]
        per_node_b = {i: tree_cpu_s(p.pid) for i, p in c.procs.items()}
        _profile_wait(spies)
        check_alive(c, range(c.n))
        dead = [k for k in procs.procs if not procs.alive(k)]
        if dead:
            raise BenchError(f"fleet_e2e: worker(s) {dead} died:\n" + "\n".join(procs.log_tail(k, 30) for k in dead))
        secs = (tb - ta) / 1000
        d = {k: b[k] - a[k] for k in a}
        node_cpu = None if None in (cpu_a, cpu_b) else cpu_b - cpu_a
        worker_cpu = None if None in wcpu_a + wcpu_b else sum(wcpu_b) - sum(wcpu_a)
        done = d["completed"]
        rates = {"offered": n, "leased": round(d["grants"] / secs, 1), "completed": round(done / secs, 1)}
        lead_now = leader_checked(c)[0]
        follower = next(i for i in range(c.n) if i != lead_now)
        # Each node's share, the leader's first: what the leader alone spends (planning, the
        # worker protocol, proposing) against what every replica spends (applying, the log).
        # (a leader change in the window: no node is called the leader)
        split = {("leader" if i == lead_now == lead_a else f"node-{i + 1}"): round((per_node_b[i] - per_node_a[i]) * 1e6 / done, 1)
                 for i in sorted(per_node_a, key=lambda i: i != lead_now)
                 if done and per_node_a[i] is not None and per_node_b.get(i) is not None}
        lat = _e2e_latency(c, follower, n, w0, w1, history)
        out = {"cluster": c.tmp.name, "jobs": n, "job_spec": spec, "executor": executor, "workers": workers,
               "worker_slots": slots,
               "registration": {k: reg[k] for k in ("method", "jobs_per_s", "seconds")}, "window_s": round(secs, 2),
               "per_s": rates, "given_back": d["releases"], "lost": d["losses"],
               "node_cpu_s": None if node_cpu is None else round(node_cpu, 2),
               "worker_cpu_s": None if worker_cpu is None else round(worker_cpu, 2),
               "cpu_us_per_run": {"nodes": None if node_cpu is None or not done else round(node_cpu * 1e6 / done, 1),
                                  "workers": None if worker_cpu is None or not done else round(worker_cpu * 1e6 / done, 1),
                                  "per_node": split},
               **({"warmup_note": warmup_note} if warmup_note else {}), **lat}
        print(f"[bench] fleet_e2e N={n}, {workers} workers: per second {rates}; slot -> start p50 "
              f"{lat['slot_to_start_ms'].get('p50')} ms, p99 {lat['slot_to_start_ms'].get('p99')} ms; "
              f"µs of CPU a run by node {split}", file=sys.stderr)
        return out
    finally:
        procs.stop_all()


def _dispatch_counts(c) -> dict:
    """Each node's dispatcher counters, from its /metrics: acquires proposed, and how many of
    them granted nothing (another node's acquire took the run first)."""
    out = {}
    for i in range(c.n):
        s, m = c.get(i, "/metrics", timeout=METRICS_TIMEOUT_S)
        if s != 200:
            continue
        d = {}
        for line in m.splitlines():
            for name, key in (("raftsched_dispatch_acquires_total ", "acquires"),
                              ("raftsched_dispatch_acquires_empty_total ", "empty")):
                if line.startswith(name):
                    d[key] = int(float(line.split()[1]))
        out[f"node-{i + 1}"] = d
    return out


def _waiting(c) -> int | None:
    """Lease requests waiting at the three nodes together, from their /metrics."""
    total = 0
    for i in range(c.n):
        s, m = c.get(i, "/metrics", timeout=METRICS_TIMEOUT_S)
        if s != 200:
            return None
        for line in m.splitlines():
            if line.startswith("raftsched_lease_requests_waiting "):
                total += int(float(line.split()[1]))
    return total


def _profile_start(pids: dict, seconds: float, tag: str) -> list:
    """With RAFTSCHED_BENCH_PYSPY=DIR (py-spy installed in the venv), a py-spy record of each
    node for ``seconds``, written to DIR/TAG-node-N.txt (raw, for a flame graph or a sort)."""
    d = os.environ.get("RAFTSCHED_BENCH_PYSPY")
    spy = Path(sys.executable).parent / "py-spy"
    if not d or not spy.exists():
        return []
    Path(d).mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([str(spy), "record", "--rate", "200", "--nonblocking", *os.environ.get("RAFTSCHED_BENCH_PYSPY_ARGS", "").split(), "--format", "raw", "--duration",
                              str(max(1, int(seconds))), "--pid", str(pid), "-o", str(Path(d) / f"{tag}-node-{i + 1}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i, pid in pids.items()]


def _profile_wait(spies: list) -> None:
    for sp in spies:
        try:
            sp.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sp.kill()
            sp.wait()


def fleet_rest(tmp: Path, n_workers: int, n_procs: int, window_s: float, due_jobs: int, due_window_s: float,
               clusters: list, wait_s: float = 20.0) -> dict:
    # a simulator process holds at most SIM_WORKERS_PER_PROC workers (its CPU and descriptors)
    n_procs = max(n_procs, -(-n_workers // SIM_WORKERS_PER_PROC))
    # the window at rest holds at least one wait, the longest a node may ask for (next_wait_s)
    # included, so that every worker polls in it once or more (the quick run keeps its 1 s window:
    # it checks the harness, not the figure)
    rest_window_s = max(window_s, wait_s, worker_limits.lease_wait_s_max) if window_s >= 10 else window_s
    c = start_cluster(tmp, "fleet-rest", clusters, ("--slots", "0"))
    procs = Procs(new_session=True)
    outs = {k: c.tmp / f"sim-{k}.json" for k in range(n_procs)}
    try:
        leader, _ = leader_checked(c)
        put_queue(c, leader, REST_QUEUE, 100_000, "reject")
        time.sleep(1.0)  # ok-sleep: let the fresh cluster settle before its idle CPU is taken
        pids = {i: p.pid for i, p in c.procs.items()}
        rss0 = {i: rss_kib(p).get("VmRSS") for i, p in pids.items()}
        cpu0 = cluster_cpu_s(c)
        time.sleep(window_s)  # ok-sleep: measurement window (no workers)
        idle_cpu = None if cpu0 is None else (cluster_cpu_s(c) - cpu0)
        urls = ",".join(c.url(i) for i in range(c.n))
        per = -(-n_workers // n_procs)
        started = 0
        for k in range(n_procs):
            m = min(per, n_workers - started)
            started += m
            procs.start(k, [sys.executable, str(REPO / "scripts" / "benchlib" / "fleet_sim.py"), "--url", urls,
                            "--token-file", str(c.token_file), "--workers", str(m), "--prefix", f"sim{k}-",
                            "--queue", REST_QUEUE, "--wait-s", str(wait_s), "--out", str(outs[k])], c.tmp / f"sim-{k}.log",
                        env={"PYTHONPATH": str(common.CODE_DIR)}, cwd=common.CODE_DIR)
        t0 = time.monotonic()
        try:
            # every 2 s past 1 000 workers: a scrape of /metrics was not free at 10 000 on older
            # code (it is measured below); the quick run's 200 connect in well under a second
            wait_for(lambda: (_waiting(c) or 0) >= n_workers, 180, f"{n_workers} lease requests waiting",
                     interval_s=0.05 if n_workers <= 1000 else 2.0)
        except AssertionError as e:
            raise BenchError(f"fleet_rest: {e}; waiting {_waiting(c)}\n" + "\n".join(procs.log_tail(k, 10) for k in procs.procs)) from None
        connect_s = time.monotonic() - t0
        # ok-sleep: a workers_seen interval passes after the last hello (its cost is part of "at rest")
        time.sleep(node_limits.workers_seen_interval_s + 1)
        if window_s >= 10:
            # ok-sleep: every worker has had its first answer (after its wait_s), and with it the
            # wait its node asks for (next_wait_s): the window measures the fleet's steady state
            time.sleep(max(0.0, t0 + connect_s + wait_s + 2 - time.monotonic()))
        rss1 = {i: rss_kib(p).get("VmRSS") for i, p in pids.items()}
        spies = _profile_start(pids, rest_window_s, "rest")
        cpu_a = cluster_cpu_s(c)
        node_a = {i: tree_cpu_s(p) for i, p in pids.items()}
        time.sleep(rest_window_s)  # ok-sleep: measurement window (at rest, every worker waiting)
        rest_cpu = None if cpu_a is None else (cluster_cpu_s(c) - cpu_a)
        node_b = {i: tree_cpu_s(p) for i, p in pids.items()}
        rest_w = (wall_ms() - rest_window_s * 1000, wall_ms())
        _profile_wait(spies)
        # One scrape of /metrics (series per worker for four of its families, up to the node's
        # --metrics-workers-max workers; the fleet's totals past it): its cost.
        scrape_cpu0, scrape_t0 = tree_cpu_s(pids[0]), time.monotonic()
        st, _ = c.get(0, "/metrics", timeout=METRICS_TIMEOUT_S)
        scrape = {"status": st, "seconds": round(time.monotonic() - scrape_t0, 3),
                  "node_cpu_s": None if scrape_cpu0 is None else round((tree_cpu_s(pids[0]) or 0) - scrape_cpu0, 3)}
        waiting = _waiting(c)
        # Due runs: J jobs every 1 s, staggered over the second (start_at), fired ahead.
        base_s = int(time.time()) - 60
        jobs = []
        for k in range(due_jobs):
            phase_ms = int(((k * _PHI) % 1.0) * 1000)
            start = datetime.fromtimestamp(base_s + phase_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
            jobs.append((f"due-{k}", {"schedule": {"every_s": 1, "start_at": start.replace("+00:00", "Z")},
                                      "executor": PY_NOOP, "misfire": {"policy": "skip"}, "history": 20,
                                      "queue": REST_QUEUE}))
        register_checked(c, leader, jobs, f"fleet_rest due jobs J={due_jobs}")
        time.sleep(2.0)  # ok-sleep: warm-up (the first slots after the registration)
        acq0 = _dispatch_counts(c)
        w0 = wall_ms()
        cpu_d = cluster_cpu_s(c)
        due_a = {i: tree_cpu_s(p) for i, p in pids.items()}
        time.sleep(due_window_s)  # ok-sleep: measurement window (due runs)
        w1 = wall_ms()
        due_cpu = None if cpu_d is None else (cluster_cpu_s(c) - cpu_d)
        due_b = {i: tree_cpu_s(p) for i, p in pids.items()}
        acq1 = _dispatch_counts(c)
        acquires = {n: {k: v - acq0.get(n, {}).get(k, 0) for k, v in d.items()} for n, d in acq1.items()}
        check_alive(c, range(c.n))
        for k in procs.procs:
            procs.signal(k, signal.SIGTERM)
        received, errors, sim_rss, leases, error_kinds, idle_at = [], 0, [], 0, {}, []
        for k, path in outs.items():
            try:
                r = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise BenchError(f"fleet_rest: simulator {k} wrote no results ({e}):\n{procs.log_tail(k, 20)}") from None
            received += r["received"]
            errors += r["errors"]
            for kind, n in r.get("error_kinds", {}).items():
                error_kinds[kind] = error_kinds.get(kind, 0) + n
            leases += r["leases"]
            idle_at += r.get("idle_answers_ms", [])
            sim_rss.append(r.get("rss_kib"))
        lag = [r[2] - r[1] for r in received if w0 <= r[1] < w1]
        # by the node the worker waited at (k % 3, node-1 first): a follower forwards its acquire
        lag_by_node = {f"node-{i + 1}" + (" (leader)" if i == leader else ""):
                       summary([r[2] - r[1] for r in received if w0 <= r[1] < w1 and r[3] == i], 1) for i in range(c.n)}
        grown = [rss1[i] - rss0[i] for i in rss0 if rss0[i] is not None and rss1[i] is not None]
        out = {"cluster": c.tmp.name, "workers": n_workers, "wait_s": wait_s, "simulator_processes": n_procs,
               "connected_in_s": round(connect_s, 1), "waiting_at_window_end": waiting, "window_s": rest_window_s,
               "node_cpu_pct_of_one_core_at_rest": {f"node-{i + 1}": (None if node_a[i] is None or node_b[i] is None
                                                                     else round(100 * (node_b[i] - node_a[i]) / rest_window_s, 2))
                                                     for i in pids},
               "node_cpu_pct_of_one_core_due_runs": {f"node-{i + 1}": (None if due_a[i] is None or due_b[i] is None
                                                                       else round(100 * (due_b[i] - due_a[i]) / due_window_s, 2))
                                                       for i in pids},
               "nodes_cpu_pct_of_one_core": {
                   "no_workers": None if idle_cpu is None else round(100 * idle_cpu / window_s, 2),
                   "at_rest": None if rest_cpu is None else round(100 * rest_cpu / rest_window_s, 2),
                   "due_runs": None if due_cpu is None else round(100 * due_cpu / due_window_s, 2)},
               "nodes_rss_kib_before_after": [rss0, rss1],
               "node_kib_per_worker": round(sum(grown) / n_workers, 1) if grown else None,
               "metrics_scrape": scrape,
               "simulator_kib_per_worker": (round(sum(x for x in sim_rss if x) / n_workers, 1)
                                            if all(sim_rss) else None),
               "due_jobs": due_jobs, "due_window_s": due_window_s, "due_runs_received": len(lag),
               "due_runs_expected": int(due_jobs * due_window_s), "due_to_start_ms": summary(lag, 1),
               "due_to_start_ms_by_node": lag_by_node,
               # where it goes: the slot until a node proposed the acquire that granted the run
               # (its dispatcher's wake-up), then that acquire's commit and the HTTP answer
               "due_to_acquire_ms": summary([r[4] - r[1] for r in received if w0 <= r[1] < w1], 1),
               "acquire_to_receipt_ms": summary([r[2] - r[4] for r in received if w0 <= r[1] < w1], 1),
               # the receipt split at the node's answer (its cluster_ms): the acquire's commit and
               # the node's answer, then the response's way into the simulator's loop
               "acquire_to_answer_ms": summary([r[5] - r[4] for r in received
                                                 if w0 <= r[1] < w1 and len(r) > 5 and r[5] is not None], 1),
               "answer_to_receipt_ms": summary([r[2] - r[5] for r in received
                                                 if w0 <= r[1] < w1 and len(r) > 5 and r[5] is not None], 1),
               "due_to_answer_ms": summary([r[5] - r[1] for r in received
                                            if w0 <= r[1] < w1 and len(r) > 5 and r[5] is not None], 1),
               "due_window_acquires": acquires,
               "simulator_errors": errors, "simulator_error_kinds": error_kinds, "lease_answers": leases,
               # idle answers the fleet got per second in the window at rest: what the nodes' CPU
               # at rest pays for (their next_wait_s sets it)
               "idle_answers_per_s_at_rest": round(sum(1 for t in idle_at if rest_w[0] <= t < rest_w[1]) / rest_window_s, 1)}
        print(f"[bench] fleet_rest {n_workers} workers: nodes' CPU at rest {out['nodes_cpu_pct_of_one_core']} % of one core, "
              f"{out['node_kib_per_worker']} KiB a worker; due -> start p50 {out['due_to_start_ms'].get('p50')} ms, "
              f"p99 {out['due_to_start_ms'].get('p99')} ms", file=sys.stderr)
        return out
    finally:
        procs.stop_all()


def report_rows(res: dict, row, fmt, ppm, ratio) -> None:
    """The fleet's rows of the Markdown report (report.markdown calls this)."""
    f = res.get("fleet_e2e")
    if isinstance(f, dict) and "per_s" in f:
        r = f["per_s"]
        how = ("an SDK app's async no-op handler in the worker's process" if f.get("executor", "sandbox") == "app"
               else "each run a process as the run user")
        row(f"fleet end to end ({f['jobs']} no-op python jobs every 1 s, {how}; nodes --slots 0, {f['workers']} "
            f"raftsched worker processes of {f['worker_slots']} slots; window {f['window_s']} s)",
            "runs per second leased / completed; baseline: offered", f"{fmt(r['leased'])} / {fmt(r['completed'])}",
            fmt(r["offered"]), ratio(r["completed"], r["offered"]))
        row("", "slot → start (started_at − slot) ms p50 / p99 / max", ppm(f["slot_to_start_ms"]))
        row("", "slot → completion ms p50 / p99 / max", ppm(f["slot_to_completion_ms"]))
        cu = f.get("cpu_us_per_run") or {}
        nodes, wk = cu.get("nodes"), cu.get("workers")
        # The two drift together with the machine's speed (the same code: ±15 % between runs of one
        # hour), so their ratio compares code more steadily than either (docs/benchmarks.md).
        share = f" (÷ {nodes / wk:.2f})" if isinstance(nodes, (int, float)) and isinstance(wk, (int, float)) and wk else ""
        row("", "CPU per completed run (µs): the three nodes / the worker processes (nodes ÷ workers)",
            f"{fmt(nodes)} / {fmt(wk)}{share}")
        split = cu.get("per_node") or {}
        if split:  # the leader's own work against what every replica does
            row("", "of the nodes' CPU per run (µs), each node's (the leader's first)",
                " / ".join(f"{k} {fmt(v)}" for k, v in split.items()))
    g = res.get("fleet_rest")
    if isinstance(g, dict) and "nodes_cpu_pct_of_one_core" in g:
        cpu = g["nodes_cpu_pct_of_one_core"]
        row(f"fleet at rest ({fmt(g['workers'])} connected workers, each a long-polling HTTP client, in "
            f"{g['simulator_processes']} processes; nodes --slots 0)",
            "the three nodes' CPU, % of one core: no workers / all waiting, no work / with the due runs below",
            f"{fmt(cpu['no_workers'])} / {fmt(cpu['at_rest'])} / {fmt(cpu['due_runs'])}")
        row("", "resident memory per connected worker, KiB: the nodes (all three) / the simulated client",
            f"{fmt(g['node_kib_per_worker'])} / {fmt(g['simulator_kib_per_worker'])}")
        row("", f"due → start ms p50 / p99 / max ({g['due_jobs']} jobs every 1 s, staggered, fired ahead; "
                f"{g['due_runs_received']} of {g['due_runs_expected']} runs)", ppm(g["due_to_start_ms"]))
        if g.get("due_to_answer_ms", {}).get("n"):
            row("", "due → the node's answer (its cluster_ms) ms p50 / p99 / max", ppm(g["due_to_answer_ms"]))
        if "idle_answers_per_s_at_rest" in g:
            row("", "idle lease answers per second at rest, the fleet (its waits: the nodes' next_wait_s)",
                fmt(g["idle_answers_per_s_at_rest"]))
