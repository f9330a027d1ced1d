"""Pipelines (issue 25) on three real nodes: what a chain step costs against an independent job,
and a fan-out of one parent to many children with the leader's lone read and write latency
measured while it is committed.

Part 1, chains against independent jobs, at one offered rate R runs a second: R independent
no-op python jobs every 1 s, then R/2 two-step chains (``pa-k`` every 1 s, ``pb-k`` triggered by
its success), each measured over a window as fleet_e2e is: the runs are executed by ``raftsched
worker`` processes (nodes ``--slots 0``), so the three nodes' CPU per completed run is the
scheduling alone, without the ~10 ms of CPU a run's isolated execution costs (docs/benchmarks.md),
and the workers' CPU, the same work for both kinds of run, is reported beside it as the noise;
for a sample of chains, the child's start after its parent's completion.

Part 2, the fan-out: one parent with N children (``limits.children_per_job_max`` at most),
registered with the bulk endpoint; the parent is triggered with ``propagate`` and run by a worker;
the leader is polled until every child's run is applied on it, while a probe sends one GET and
one small PUT at a time to the leader.

One cluster for both parts. The workers serve the queue ``pipe`` only (``--queues``): the
fan-out's children go to a queue no worker serves, so what is measured is their making, not their
execution. Between the parts the scheduled jobs are put again with a slot far ahead."""
from __future__ import annotations

import http.client
import sys
import threading
import time
from pathlib import Path

from raftsched.testing.procs import Procs, wait_for

from .. import common
from ..common import BenchError, PY_NOOP, code_limit, iso, iso_ms, summary, wall_ms
from ..harness import BenchCluster, Conn, NO_WORKER, check_alive, leader_checked, node_log_excerpt, put_queue, start_cluster
from ..probes import cluster_cpu_s, tree_cpu_s
from ..register import register_checked, register_jobs

QUEUE = "pipe"
FANOUT_QUEUE = "fanout"
#: A slot that never comes during the benchmark: puts a scheduled job to rest.
FAR = "2099-01-01T00:00:00Z"
REST_SPEC = {"schedule": {"at": FAR}, "executor": PY_NOOP, "misfire": {"policy": "skip"}, "queue": QUEUE}
PROBE_SPEC = {"schedule": {"at": FAR}, "executor": PY_NOOP, "misfire": {"policy": "skip"}}
#: Chains (and independent jobs) whose runs are read back for the latencies.
SAMPLE = 100
POLL_S = 0.05
#: Queue pipe holds this many seconds of the offered rate (1 000 runs at least).
QUEUE_SECONDS = 3


# --- pure helpers (tests/test_bench_pipeline.py) -------------------------------------------------

def chain_lags(parent_runs: list[dict], child_runs: list[dict], w0: float, w1: float) -> dict:
    """One chain's runs with their slot in [w0, w1) (run views as GET /v1/jobs/{name}/runs gives
    them): for each parent run that succeeded, the child's run of the same slot. Returns
    ``start_lag_ms`` (child started_at − parent finished_at, per pair), ``made_in_completion``
    (pairs whose child was made in the parent's completion: fired_at == finished_at),
    ``missing`` (a parent success without a child run), ``unfinished`` (a pair still queued or
    running) and ``pairs``."""
    kids = {r["slot_ms"]: r for r in child_runs if r.get("kind") == "triggered" and w0 <= r["slot_ms"] < w1}
    out: dict = {"pairs": 0, "start_lag_ms": [], "made_in_completion": 0, "missing": 0, "unfinished": 0}
    for p in parent_runs:
        if p.get("kind") == "manual" or not w0 <= p["slot_ms"] < w1 or p["state"] in ("skipped", "coalesced"):
            continue
        if p["state"] in ("queued", "running"):
            out["unfinished"] += 1
            continue
        if p["state"] != "succeeded":
            continue
        k = kids.get(p["slot_ms"])
        if k is None:
            out["missing"] += 1
            continue
        out["pairs"] += 1
        done = iso_ms(p.get("finished_at"))
        if iso_ms(k.get("fired_at")) == done:
            out["made_in_completion"] += 1
        if k["state"] in ("queued", "running") or k.get("started_at") is None:
            out["unfinished"] += 1
            continue
        out["start_lag_ms"].append(iso_ms(k["started_at"]) - done)
    return out


def fanout_commands(fired_ms: list[int], per_command: int) -> dict:
    """The commands that made a fan-out's children, from the children's ``fired_at`` (ms): every
    child made by one command carries that command's time, the leader proposes one step of a
    fan-out a tick (core/pipelines.py pending_fanout), and a command makes at most
    ``per_command`` children. Returns ``commands`` (Σ ⌈group / per_command⌉ over the groups of
    one time: the completion and the fanout_step commands), ``groups`` (distinct times), the
    largest group, and the span from the first to the last command's time."""
    groups: dict[int, int] = {}
    for t in fired_ms:
        groups[t] = groups.get(t, 0) + 1
    if not groups:
        return {"commands": 0, "groups": 0, "largest": 0, "span_ms": None}
    cmds = sum(-(-g // per_command) for g in groups.values())
    return {"commands": cmds, "groups": len(groups), "largest": max(groups.values()),
            "span_ms": max(groups) - min(groups)}


def net_cpu_us(cpu_s: float | None, idle_cores: float | None, window_s: float, runs: int) -> float | None:
    """CPU µs a run once the cluster's idle CPU over the window is taken off (None without an
    idle figure or a run)."""
    if cpu_s is None or idle_cores is None or not runs:
        return None
    return round((cpu_s - idle_cores * window_s) * 1e6 / runs, 1)


def probe_summary(samples: list[tuple[float, str, float, int]], t0: float, t1: float) -> dict:
    """The probe's samples (start wall ms, "read" | "write", latency ms, status) that started in
    [t0, t1): latency p50 / p99 / max of each kind, and the statuses that were not 200/201."""
    out: dict = {}
    for kind in ("read", "write"):
        lat = [ms for t, k, ms, _s in samples if k == kind and t0 <= t < t1]
        out[kind] = summary(lat, 2)
    bad: dict[str, int] = {}
    for t, k, _ms, s in samples:
        if t0 <= t < t1 and s not in (200, 201):
            bad[f"{k} {s}"] = bad.get(f"{k} {s}", 0) + 1
    out["errors"] = bad
    return out


# --- the cluster part ----------------------------------------------------------------------------

class _Fleet:
    """W ``raftsched worker`` processes serving queue pipe (python only), started by PID and
    stopped by ``stop``: the runs' executors, outside the nodes, so that the nodes' CPU is the
    scheduling alone (as fleet_e2e counts it)."""

    def __init__(self, c: BenchCluster, workers: int, slots: int) -> None:
        self.c = c
        self.procs = Procs(new_session=True)
        urls = ",".join(c.url(i) for i in range(c.n))
        for k in range(workers):
            self.procs.start(k, [sys.executable, "-m", "raftsched.cli", "worker", "--url", urls, "--token-file",
                                 str(c.token_file), "--id", f"pipe-w{k}", "--slots", str(slots), "--executors", "python",
                                 "--queues", QUEUE, "--wait-s", "5", "--log-level", "warning"],
                             c.tmp / f"worker-{k}.log", env={"PYTHONPATH": str(common.CODE_DIR)}, cwd=common.CODE_DIR)
        try:
            wait_for(lambda: len(self._registry()) == workers, 30, f"{workers} workers registered")
        except AssertionError as e:
            raise BenchError(f"pipeline: {e}\n" + "\n".join(self.procs.log_tail(k, 20) for k in range(workers))) from None

    def _registry(self) -> dict:
        i = self.c.alive()[0]
        s, b = self.c.get(i, "/v1/workers")
        if s != 200:
            raise BenchError(f"pipeline: GET /v1/workers on node-{i + 1}: {s} {b}")
        return {w["id"]: w for w in b["workers"] if w["id"].startswith("pipe-w")}

    def completed(self) -> int:
        """Runs completed by the workers (their accepted outcomes, in the registry)."""
        return sum(w["completed"] for w in self._registry().values())

    def cpu_s(self) -> float | None:
        vals = [tree_cpu_s(p.pid) for p in self.procs.procs.values()]
        return None if any(v is None for v in vals) else sum(vals)

    def check(self) -> None:
        dead = [k for k in self.procs.procs if not self.procs.alive(k)]
        if dead:
            raise BenchError(f"pipeline: worker(s) {dead} died:\n" + "\n".join(self.procs.log_tail(k, 30) for k in dead))

    def stop(self) -> None:
        self.procs.stop_all()


def _queue(c: BenchCluster, i: int, name: str, stale: bool = False) -> dict:
    s, b = c.get(i, "/v1/queues" + ("?stale=true" if stale else ""))
    if s != 200:
        raise BenchError(f"pipeline: GET /v1/queues on node-{i + 1}: {s} {b}")
    return next((q for q in b["queues"] if q["name"] == name), {"depth": 0, "running": 0})


def _rest(c: BenchCluster, leader: int, names: list[str], what: str) -> None:
    """Put the scheduled jobs ``names`` to rest (a slot far ahead), then wait until nothing of
    theirs is queued or running (runs fired ahead included)."""
    reg = register_jobs(c, leader, [(n, REST_SPEC) for n in names], key_prefix=f"bench-rest-{what}")
    if reg["error_count"] or reg["incomplete"]:
        raise BenchError(f"pipeline: putting the {what} jobs to rest: {reg['errors']}")
    # Workers that fell behind leave a backlog: wait while it shrinks, and fail only when it stops.
    last, stuck_since = None, time.monotonic()
    while True:
        q = _queue(c, leader, QUEUE, stale=True)  # the leader's own state: what it acquires from
        left = q.get("depth", 0) + q.get("running", 0)
        if not left:
            return
        if last is None or left < last:
            last, stuck_since = left, time.monotonic()
        elif time.monotonic() - stuck_since > 30:
            raise BenchError(f"pipeline: {left} {what} runs still queued or running in {QUEUE}, none done in 30 s\n"
                             + node_log_excerpt(c, leader))
        time.sleep(0.2)  # ok-sleep: polling interval inside a deadline loop


def _window(c: BenchCluster, fleet: _Fleet, window_s: float) -> dict:
    """A window of whole seconds from the next one: runs completed in it, the nodes' CPU and the
    workers' CPU."""
    w0 = (wall_ms() // 1000 + 1) * 1000
    w1 = w0 + int(window_s) * 1000
    time.sleep(max(0.0, (w0 - wall_ms()) / 1000))  # ok-sleep: measurement window
    cpu_a, wcpu_a, ta, a = cluster_cpu_s(c), fleet.cpu_s(), wall_ms(), fleet.completed()
    # The backlog (queued runs already due) mid-second: every second's slots fall due on it.
    time.sleep(max(0.0, (w0 + 500 - wall_ms()) / 1000))  # ok-sleep: measurement window
    q0 = _queue(c, 0, QUEUE, stale=True).get("ready")
    time.sleep(max(0.0, (w1 - 500 - wall_ms()) / 1000))  # ok-sleep: measurement window
    q1 = _queue(c, 0, QUEUE, stale=True).get("ready")
    time.sleep(max(0.0, (w1 - wall_ms()) / 1000))  # ok-sleep: measurement window
    tb, b = wall_ms(), fleet.completed()
    cpu_b, wcpu_b = cluster_cpu_s(c), fleet.cpu_s()
    check_alive(c, range(c.n))
    fleet.check()
    done = b - a
    cpu = None if None in (cpu_a, cpu_b) else cpu_b - cpu_a
    wcpu = None if None in (wcpu_a, wcpu_b) else wcpu_b - wcpu_a
    return {"w0": w0, "w1": w1, "window_s": round((w1 - w0) / 1000, 2), "completed": done,
            "completed_per_s": round(done / ((tb - ta) / 1000), 1), "backlog_ready_start_end": [q0, q1],
            "cluster_cpu_s": None if cpu is None else round(cpu, 2),
            "cpu_us_per_run": None if cpu is None or not done else round(cpu * 1e6 / done, 1),
            "worker_cpu_us_per_run": None if wcpu is None or not done else round(wcpu * 1e6 / done, 1)}


def _runs(conn: Conn, name: str, limit: int, stale: bool = False) -> list[dict]:
    s, b = conn.get(f"/v1/jobs/{name}/runs?limit={limit}" + ("&stale=true" if stale else ""))
    if s != 200:
        raise BenchError(f"pipeline: GET /v1/jobs/{name}/runs: {s} {b}")
    return b["runs"]


def _read_back(c: BenchCluster, i: int, names, w0: float, w1: float, history: int, chains: bool) -> dict:
    """The sample's runs of the window, once finished (15 s at most): for chains the child's start
    after its parent's completion (chain_lags), for independent jobs slot -> start. Read from
    node i's own replica (?stale=true: no barrier a read; a child is made in the command that
    records its parent's success, so a replica that shows the success shows the child)."""
    conn = Conn(c.api_ports[i], token=c.token)
    deadline = time.monotonic() + 15
    try:
        while True:
            agg: dict = {"pairs": 0, "start_lag_ms": [], "made_in_completion": 0, "missing": 0, "unfinished": 0}
            for k in names:
                if chains:
                    r = chain_lags(_runs(conn, f"pa-{k}", history, True), _runs(conn, f"pb-{k}", history, True), w0, w1)
                else:
                    runs = [x for x in _runs(conn, f"ind-{k}", history, True) if w0 <= x["slot_ms"] < w1
                            and x.get("kind") != "manual" and x["state"] not in ("skipped", "coalesced")]
                    r = {"pairs": len(runs), "start_lag_ms": [iso_ms(x["started_at"]) - x["slot_ms"] for x in runs
                                                            if x.get("started_at") and x["state"] not in ("queued", "running")],
                         "unfinished": sum(1 for x in runs if x["state"] in ("queued", "running"))}
                for key, v in r.items():
                    agg[key] = agg.get(key, 0) + v if not isinstance(v, list) else agg[key] + v
            if not agg["unfinished"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # ok-sleep: polling interval inside a deadline loop
    finally:
        conn.close()
    lags = agg.pop("start_lag_ms")
    return {**agg, "jobs": len(names), ("start_after_parent_ms" if chains else "slot_to_start_ms"): summary(lags, 1)}


def _part(c: BenchCluster, fleet: _Fleet, leader: int, rate: int, chains: bool, window_s: float, warmup_s: float,
          out: dict) -> None:
    history = min(1000, int(window_s + warmup_s) + 30)
    # start_at in the past: the first slot is the next whole second, not one interval after it.
    run_spec = {"schedule": {"every_s": 1, "start_at": iso((wall_ms() // 1000 - 60) * 1000)}, "executor": PY_NOOP,
                "misfire": {"policy": "fire_all"},
                "history": history, "queue": QUEUE}
    n = rate // 2 if chains else rate
    label = f"{n} chains" if chains else f"{n} independent jobs"
    done0 = fleet.completed()
    phases: dict[str, float] = {}
    t = time.monotonic()

    def phase(name: str) -> None:
        nonlocal t
        phases[name] = round(time.monotonic() - t, 1)
        t = time.monotonic()

    if chains:
        reg = register_checked(c, leader, [(f"pa-{k}", run_spec) for k in range(n)], f"pipeline: {label}, parents")
        register_checked(c, leader, [(f"pb-{k}", {"after": [f"pa-{k}"], "executor": PY_NOOP, "history": history,
                                                  "queue": QUEUE}) for k in range(n)], f"pipeline: {label}, children")
    else:
        reg = register_checked(c, leader, [(f"ind-{k}", run_spec) for k in range(n)], f"pipeline: {label}")
    try:
        wait_for(lambda: fleet.completed() - done0 >= rate, 60, f"{label}: a first round of runs")
    except AssertionError as e:
        raise BenchError(f"pipeline: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
    phase("register_and_first_round")
    time.sleep(warmup_s)  # ok-sleep: measurement window (warm-up)
    win = _window(c, fleet, window_s)
    phase("warmup_and_window")
    follower = next(i for i in range(c.n) if i != leader)
    step = max(1, n // SAMPLE)
    lat = _read_back(c, follower, range(0, n, step), win["w0"], win["w1"], history, chains)
    phase("read_back")
    out.update({"jobs": n * 2 if chains else n, "offered_runs_per_s": rate, "registration_method": reg["method"],
                **{k: v for k, v in win.items() if k not in ("w0", "w1")}, "sample": lat, "phases_s": phases})
    # Drained, even the independent jobs' runs: workers that fell behind would still be executing
    # them in the chains' window (a loaded machine, measured), and the chains' before the probe.
    _rest(c, leader, [f"pa-{k}" if chains else f"ind-{k}" for k in range(n)], "chain" if chains else "independent")
    phase("rest")
    print(f"[bench] pipeline {label}: {win['completed_per_s']} runs/s completed, {win['cpu_us_per_run']} µs of CPU a run; "
          f"{'start after parent' if chains else 'slot -> start'} "
          f"{lat.get('start_after_parent_ms', lat.get('slot_to_start_ms'))}; backlog {win['backlog_ready_start_end']}",
          file=sys.stderr)


class _Probe(threading.Thread):
    """One GET and one small PUT at a time to the leader, on one connection each, until stopped:
    (start wall ms, kind, latency ms, status) per request."""

    def __init__(self, c: BenchCluster, i: int, read_path: str) -> None:
        super().__init__(daemon=True)
        self.c, self.i, self.read_path = c, i, read_path
        self.samples: list[tuple[float, str, float, int]] = []
        self.stop_ev = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        conn = Conn(self.c.api_ports[self.i], token=self.c.token)
        k = 0
        try:
            while not self.stop_ev.is_set():
                for kind, method, path, body in (("read", "GET", self.read_path, None),
                                                 ("write", "PUT", f"/v1/jobs/probe-{k}", PROBE_SPEC)):
                    t, a = wall_ms(), time.perf_counter()
                    s, _ = conn.request(method, path, body, retry=method == "GET")
                    self.samples.append((t, kind, (time.perf_counter() - a) * 1000, s))
                k += 1
        except (OSError, http.client.HTTPException) as e:
            self.error = repr(e)
        finally:
            conn.close()


def _fanout(c: BenchCluster, leader: int, n_req: int, before_s: float) -> dict:
    cap = code_limit("children_per_job_max")
    n = min(n_req, cap) if cap else n_req
    per = code_limit("fanout_per_command") or 0
    put_queue(c, leader, FANOUT_QUEUE, max(10_000, 2 * n), "reject")
    s, b = c.call(leader, "PUT", "/v1/jobs/fan-p", REST_SPEC)
    if s not in (200, 201):
        raise BenchError(f"pipeline: PUT /v1/jobs/fan-p: {s} {b}")
    kids = [(f"fan-c-{k:05d}", {"after": ["fan-p"], "executor": PY_NOOP, "queue": FANOUT_QUEUE}) for k in range(n)]
    reg = register_checked(c, leader, kids, f"pipeline: fan-out, {n} children")
    leader, st0 = leader_checked(c)
    term0 = st0["term"]
    poll = Conn(c.api_ports[leader], token=c.token)
    probe = _Probe(c, leader, "/v1/jobs/fan-p")
    probe.start()
    changes: list[dict] = []
    try:
        time.sleep(before_s)  # ok-sleep: the probe's figures before the fan-out, for comparison
        t_trig = wall_ms()
        s, b = c.call(leader, "POST", "/v1/jobs/fan-p/trigger", {"propagate": True})
        if s not in (200, 201):
            raise BenchError(f"pipeline: POST /v1/jobs/fan-p/trigger: {s} {b}")
        deadline = time.monotonic() + max(60.0, n / 50)
        prev_t, t_all, depth = t_trig, None, 0
        while True:
            tick = time.perf_counter()
            try:
                sq, bq = poll.get("/v1/queues?stale=true")
                sc, bc = poll.get("/v1/cluster")
            except (OSError, http.client.HTTPException) as e:
                raise BenchError(f"pipeline: polling the leader: {e!r}\n" + node_log_excerpt(c, leader)) from None
            t = wall_ms()
            if sq != 200 or sc != 200:
                raise BenchError(f"pipeline: polling the leader: {sq} / {sc}")
            if bc["role"] != "leader" or bc["term"] != term0:
                changes.append({"t_ms": round(t - t_trig, 1), "role": bc["role"], "term": bc["term"], "term_before": term0})
                break  # the fan-out goes on under another leader; this figure is void
            depth = next((q["depth"] for q in bq["queues"] if q["name"] == FANOUT_QUEUE), 0)
            if depth >= n:
                t_all = t
                break
            prev_t = t
            if time.monotonic() > deadline:
                check_alive(c, range(c.n))
                raise BenchError(f"pipeline: {depth} of {n} children's runs on the leader after "
                                 f"{max(60.0, n / 50):.0f} s\n" + node_log_excerpt(c, leader))
            time.sleep(max(0.0, POLL_S - (time.perf_counter() - tick)))  # ok-sleep: the poll interval
    finally:
        probe.stop_ev.set()
        probe.join(30)
        poll.close()
    check_alive(c, range(c.n))
    # What was made: the parent's run, and every child's, read back from the leader's replica.
    conn = Conn(c.api_ports[leader], token=c.token, timeout_s=60)
    try:
        parent = [r for r in _runs(conn, "fan-p", 5) if r.get("kind") == "manual"]
        kid_runs, before = [], None
        since = iso(t_trig - 5_000)  # the children's slot is the trigger's time
        while True:
            q = f"/v1/runs?since={since}&limit=10000" + (f"&before={before}" if before else "")
            s, b = conn.get(q)
            if s != 200:
                raise BenchError(f"pipeline: GET {q}: {s} {b}")
            kid_runs += [r for r in b["runs"] if r["job"].startswith("fan-c-")]
            before = b.get("next")
            if not before:
                break
    finally:
        conn.close()
    if not parent or not parent[0].get("finished_at"):
        raise BenchError(f"pipeline: the fan-out's parent run did not finish: {parent}")
    p = parent[0]
    done = iso_ms(p["finished_at"])
    per_job: dict[str, int] = {}
    for r in kid_runs:
        per_job[r["job"]] = per_job.get(r["job"], 0) + 1
    fired = [iso_ms(r["fired_at"]) for r in kid_runs]
    cmds = fanout_commands(fired, per) if per else {"commands": None}
    follower_runs = {}
    for i in range(c.n):
        st = c.status(i) or {}
        follower_runs[f"node-{i + 1}"] = st.get("runs")
    out = {"children": n, "children_requested": n_req, "children_per_job_max": cap, "fanout_per_command": per,
           "registration": {k: reg[k] for k in ("method", "jobs_per_s", "seconds")},
           "parent_run": p["id"], "parent_state": p["state"],
           "children_runs": len(kid_runs), "children_with_a_run": len(per_job),
           "children_duplicated": sum(1 for v in per_job.values() if v > 1),
           "children_lost": n - len(per_job),
           "made_in_completion": sum(1 for t in fired if t == done),
           "commands": cmds,
           "fanout_steps": None if cmds.get("commands") is None else cmds["commands"] - 1,
           # State time (the commands' own times): the parent's completion -> the last child's command.
           "completion_to_last_command_ms": None if not fired else max(fired) - done,
           # Wall time, observed by polling the leader every 50 ms: all children applied there.
           "completion_to_all_applied_ms": None if t_all is None else round(t_all - done, 1),
           "all_applied_after_ms": round(prev_t - done, 1),
           "trigger_to_all_applied_ms": None if t_all is None else round(t_all - t_trig, 1),
           "parent_started_after_trigger_ms": None if not p.get("started_at") else round(iso_ms(p["started_at"]) - t_trig, 1),
           "leader": f"node-{leader + 1}", "leader_changes": changes,
           "probe": {"before": probe_summary(probe.samples, t_trig - before_s * 1000, t_trig),
                     "during": probe_summary(probe.samples, t_trig, t_all if t_all is not None else wall_ms()),
                     "error": probe.error},
           "runs_on_each_node_after": follower_runs}
    d = out["probe"]["during"]
    print(f"[bench] pipeline fan-out of {n}: all applied on the leader {out['completion_to_all_applied_ms']} ms after the "
          f"parent's completion, {cmds.get('commands')} commands; lone read p99 {d['read'].get('p99')} ms, "
          f"lone write p99 {d['write'].get('p99')} ms; leader changes {len(changes)}", file=sys.stderr)
    return out


def pipeline(tmp: Path, p: dict, clusters: list, res: dict) -> dict:
    """The scenario (the module's docstring): part 1 at ``pipeline_rate`` runs a second, then the
    fan-out of ``pipeline_fanout`` children, on one cluster (nodes ``--slots 0``, remote workers
    on queue pipe). Fills ``res`` as it goes, so that a failure keeps the parts measured before it."""
    t0 = time.monotonic()
    phases = res["phases_s"] = {}
    c = start_cluster(tmp, "pipeline", clusters, NO_WORKER)
    leader, _ = leader_checked(c)
    phases["cluster"] = round(time.monotonic() - t0, 1)
    # Bounded: workers that fall behind (a loaded machine) leave at most a few seconds of runs to
    # drain; a slot refused by the full queue is a record (queue_full), and the report says so.
    depth = max(1000, QUEUE_SECONDS * p["pipeline_rate"])
    put_queue(c, leader, QUEUE, depth, "reject")
    res.update({"cluster": c.tmp.name, "node_args": c.extra_args, "executor": PY_NOOP, "queue_max_depth": depth,
                "workers": p["pipeline_workers"], "worker_slots": p["pipeline_worker_slots"]})
    fleet = _Fleet(c, p["pipeline_workers"], p["pipeline_worker_slots"])
    phases["workers"] = round(time.monotonic() - t0 - phases["cluster"], 1)
    try:
        if p.get("pipeline_idle_s"):
            # The nodes' own CPU with no job (heartbeats, ticks, the workers' long polls): the share
            # of each run's CPU that any rate pays, subtracted in net_cpu_us_per_run.
            idle = _window(c, fleet, p["pipeline_idle_s"])
            res["idle_cores"] = None if idle["cluster_cpu_s"] is None else round(idle["cluster_cpu_s"] / idle["window_s"], 3)
        for key, chains in (("independent", False), ("chains", True)):
            res[key] = {}
            _part(c, fleet, leader, p["pipeline_rate"], chains, p["pipeline_window_s"], p["pipeline_warmup_s"], res[key])
        for part in (res["independent"], res["chains"]):
            part["net_cpu_us_per_run"] = net_cpu_us(part.get("cluster_cpu_s"), res.get("idle_cores"), part["window_s"],
                                                    part["completed"])
        for key in ("cpu_us_per_run", "net_cpu_us_per_run", "worker_cpu_us_per_run"):
            a, b = res["independent"].get(key), res["chains"].get(key)
            res[key.replace("cpu_us_per_run", "cpu_per_run_ratio")] = round(b / a, 2) if a and b else None
        leader, _ = leader_checked(c)
        t1 = time.monotonic()
        res["fanout"] = _fanout(c, leader, p["pipeline_fanout"], p["pipeline_probe_before_s"])
        phases["fanout"] = round(time.monotonic() - t1, 1)
    finally:
        fleet.stop()
    return res


def problems(res: dict) -> list[str]:
    """What makes the run fail (checks.invariant_failures): a chain's child missing, a fan-out
    child lost or made twice, a leader change during the fan-out."""
    out = []
    ch = (res.get("chains") or {}).get("sample") or {}
    if ch.get("missing"):
        out.append(f"pipeline: {ch['missing']} parent successes of the sample without their child's run")
    f = res.get("fanout") or {}
    if f.get("children_lost") or f.get("children_duplicated"):
        out.append(f"pipeline fan-out: children lost {f.get('children_lost')}, made twice {f.get('children_duplicated')}")
    if f.get("leader_changes"):
        out.append(f"pipeline fan-out: leader changed during the fan-out: {f['leader_changes']}")
    return out


def report_rows(res: dict, row, fmt, ppm) -> None:
    """The scenario's rows of the Markdown report (report.markdown calls this)."""
    r = res.get("pipeline")
    if not isinstance(r, dict) or "chains" not in r:
        return
    ind, ch = r["independent"], r["chains"]
    row(f"pipeline: chain step vs independent job ({fmt(ind['offered_runs_per_s'])} no-op python runs offered a second: "
        f"{fmt(ind['jobs'])} independent jobs, then {fmt(ch['jobs'] // 2)} chains a → b; nodes --slots 0, "
        f"{r.get('workers')} raftsched worker processes of {r.get('worker_slots')} slots; window {ch['window_s']} s)",
        "CPU of the three nodes per completed run (µs): independent / chain; ratio",
        f"{fmt(ind['cpu_us_per_run'])} / {fmt(ch['cpu_us_per_run'])}; {fmt(r.get('cpu_per_run_ratio'))}")
    row("", "CPU of the worker processes (the runs' execution) per completed run (µs): independent / chain",
        f"{fmt(ind.get('worker_cpu_us_per_run'))} / {fmt(ch.get('worker_cpu_us_per_run'))}")
    if r.get("idle_cores") is not None:
        row("", f"the nodes' CPU less their idle CPU ({r['idle_cores']} cores with no job): independent / chain; ratio",
            f"{fmt(ind.get('net_cpu_us_per_run'))} / {fmt(ch.get('net_cpu_us_per_run'))}; {fmt(r.get('net_cpu_per_run_ratio'))}")
    row("", "runs completed per second: independent / chain", f"{fmt(ind['completed_per_s'])} / {fmt(ch['completed_per_s'])}")
    bi, bc = ind.get("backlog_ready_start_end") or [None, None], ch.get("backlog_ready_start_end") or [None, None]
    row("", f"backlog, queued runs already due, 0.5 s into the window → 0.5 s before its end (queue bound "
            f"{fmt(r.get('queue_max_depth'))}): independent; chain",
        f"{fmt(bi[0])} → {fmt(bi[1])}; {fmt(bc[0])} → {fmt(bc[1])}")
    s = ch["sample"]
    row("", f"child's start after its parent's completion (ms) p50 / p99 / max ({s['pairs']} pairs of {s['jobs']} chains; "
            f"{s['made_in_completion']} children made in the parent's completion command); independent: slot → start",
        f"{ppm(s['start_after_parent_ms'])}; {ppm(ind['sample']['slot_to_start_ms'])}")
    f = r.get("fanout") or {}
    if "children" in f:
        row(f"pipeline: fan-out (one parent, {fmt(f['children'])} children, registered in bulk)",
            "parent's completion → every child's run applied on the leader (ms, 50 ms polls); "
            "→ the last child's command (state time)",
            f"{fmt(f['completion_to_all_applied_ms'])}; {fmt(f['completion_to_last_command_ms'])}")
        cm = f["commands"]
        row("", f"commands: the completion + fanout_step ({fmt(f['fanout_per_command'])} children each at most)",
            f"1 + {fmt(f['fanout_steps'])} ({fmt(cm.get('groups'))} distinct command times)")
        for kind in ("read", "write"):
            row("", f"leader's lone {kind} ({'GET /v1/jobs/{name}' if kind == 'read' else 'PUT of a small job'}) "
                    "p50 / p99 / max (ms): during the fan-out; before it",
                f"{ppm(f['probe']['during'][kind])}; {ppm(f['probe']['before'][kind])}")
        row("", "leader changes during the fan-out; children lost / made twice",
            f"{len(f['leader_changes'])}; {f['children_lost']} / {f['children_duplicated']}")
