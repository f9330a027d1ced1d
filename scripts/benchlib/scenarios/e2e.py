"""End to end: no-op python runs fired, leased, executed and completed per second by the workers
of a cluster, and the slot -> completion latency of a sample of jobs."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.procs import wait_for

from ..common import BenchError, PY_NOOP, iso_ms, summary, wall_ms
from ..harness import BenchCluster, Conn, FireLogs, check_alive, leader_checked, node_log_excerpt, put_queue, start_cluster, wait_fire_log_past
from ..probes import cluster_cpu_s
from ..register import register_checked

E2E_QUEUE = "e2e"
#: Jobs whose runs are read back for the slot-to-completion latency of the e2e scenario.
E2E_SAMPLE_JOBS = 100


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
    warmup_note = None
    try:
        wait_for(lambda: (workers() or {}).get("completed", 0) - done0 >= n, 60, "the first round of runs to complete")
    except AssertionError as e:
        # Workers that complete fewer runs a second than are offered (each run a process of its
        # own: docs/benchmarks.md) are measured as they are, if they complete runs at all.
        done = (workers() or {}).get("completed", 0) - done0
        if done <= 0:
            raise BenchError(f"e2e: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
        warmup_note = f"{done} of the first round's {n} runs completed within 60 s: the workers complete fewer runs than offered"
        print(f"[bench] e2e N={n}: {warmup_note}", file=sys.stderr)
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
           **({"warmup_note": warmup_note} if warmup_note else {}), **lat}
    print(f"[bench] e2e N={n}: per second {rates}; slot -> completion p50 {lat['slot_to_completion_ms'].get('p50')} ms, "
          f"p99 {lat['slot_to_completion_ms'].get('p99')} ms; backlog {q0} -> {q1}", file=sys.stderr)
    return out


def _queue_depth(c: LocalCluster, i: int, queue: str) -> dict | None:
    """The queue's depth (queued runs, including runs fired ahead that are not due yet) and ready
    (queued runs already due: the backlog the workers have not taken)."""
    s, b = c.get(i, "/v1/queues")
    if s != 200:
        return None
    q = next((q for q in b["queues"] if q["name"] == queue), {})
    return {"depth": q.get("depth", 0), "ready": q.get("ready", 0)}


def _e2e_latency(c: LocalCluster, i: int, n: int, w0: float, w1: float, history: int) -> dict:
    """Slot -> finished_at and slot -> started_at of every run with its slot in [w0, w1) of a
    sample of jobs (every (n / E2E_SAMPLE_JOBS)-th), read from node i's replica once all of them
    are finished (or 15 s passed: those are counted as unfinished)."""
    step = max(1, n // E2E_SAMPLE_JOBS)
    pending = {f"e2e-{k}" for k in range(0, n, step)}
    sample = len(pending)
    done: dict[str, list] = {}
    unfinished: dict[str, int] = {}
    conn = Conn(c.api_ports[i], token=c.token)
    deadline = time.monotonic() + 15
    refused: dict[str, tuple] = {}  # a read refused while the cluster changes leader: asked again
    try:
        while pending:
            for name in sorted(pending):
                s, b = conn.get(f"/v1/jobs/{name}/runs?limit={history}")
                if s == 503:  # no leader to confirm the read against (an election): ask again
                    refused[name] = (s, b)
                    continue
                refused.pop(name, None)
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
    if refused:
        name, (s, b) = next(iter(refused.items()))
        raise BenchError(f"e2e: GET /v1/jobs/{name}/runs on node-{i + 1}: {s} {b} (and {len(refused) - 1} more "
                         "jobs' runs) until the deadline")
    runs = [r for rs in done.values() for r in rs]
    fin = [iso_ms(r["finished_at"]) - r["slot_ms"] for r in runs if r.get("finished_at")]
    start = [iso_ms(r["started_at"]) - r["slot_ms"] for r in runs if r.get("started_at")]
    states: dict[str, int] = {}
    for r in runs:
        states[r["state"]] = states.get(r["state"], 0) + 1
    return {"latency_sample": {"jobs": sample, "runs": len(runs), "states": states,
                               "unfinished_after_15_s": sum(unfinished.values()), "jobs_unfinished": len(unfinished)},
            "slot_to_completion_ms": summary(fin, 1), "slot_to_start_ms": summary(start, 1)}
