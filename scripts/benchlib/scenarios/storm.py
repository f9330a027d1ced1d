"""The storm: M one-shot jobs due at one aligned second, on a cluster with no workers; how long the
leader takes to commit every slot, each slot's fire lag, and replicas that agree afterwards."""
from __future__ import annotations

import http.client
import math
import os
import sys
import threading
import time
from pathlib import Path

from ..checks import all_jobs, replica_agreement
from ..common import (BenchError, IDLE_SPEC, SHELL_TRUE, fire_ahead_ms, fired_ahead, iso, iso_ms, lag_sample, lag_stats, storm_lead_ms,
                      summary, wall_ms)
from ..harness import (BenchCluster, Conn, FireLogs, NO_WORKER, check_alive, leader_checked, node_log_excerpt, run_baseline,
                       start_cluster)
from ..register import bulk_available, register_checked, register_jobs

POLL_BURST_S = 0.050
BURST_QUEUE = "bench-burst"
#: The lone read and write probe's period during the storm (one GET and one PUT each turn).
PROBE_S = 0.1


class LoneProbe(threading.Thread):
    """While the storm is committed: a lone read (GET of one job) and a lone write (PUT of the
    same idle job) on the leader every PROBE_S, on a connection of their own; their latencies."""

    def __init__(self, port: int, token: str | None) -> None:
        super().__init__(daemon=True)
        self.conn = Conn(port, token=token)
        self.stop = threading.Event()
        self.read_ms: list[float] = []
        self.write_ms: list[float] = []
        #: (wall ms when each sent, read ms, write ms), for the latencies while slots are applied
        self.timed: list[tuple[float, float | None, float | None]] = []
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        path = "/v1/jobs/storm-probe"
        try:
            while not self.stop.is_set():
                t = time.perf_counter()
                sent = wall_ms()
                got: dict[str, float] = {}
                for method, out in (("PUT", self.write_ms), ("GET", self.read_ms)):
                    t0 = time.perf_counter()
                    try:
                        st, _ = self.conn.request(method, path, IDLE_SPEC if method == "PUT" else None, retry=method == "GET")
                    except (OSError, http.client.HTTPException) as e:
                        st = type(e).__name__
                    if st in (200, 201):
                        out.append((time.perf_counter() - t0) * 1000)
                        got[method] = out[-1]
                    else:
                        self.errors[f"{method} {st}"] = self.errors.get(f"{method} {st}", 0) + 1
                self.timed.append((sent, got.get("GET"), got.get("PUT")))
                self.stop.wait(max(0.0, PROBE_S - (time.perf_counter() - t)))
        finally:
            self.conn.close()

    def result(self, busy: list[tuple[float, float]] | None = None) -> dict:
        """Latencies; with ``busy`` (wall-ms intervals in which the leader applied slots), also
        those of the probes sent within them (``while_applying``) and outside them."""
        out = {"read_ms": summary(self.read_ms, 2), "write_ms": summary(self.write_ms, 2), "errors": self.errors,
               "period_ms": PROBE_S * 1000}
        if busy is not None:
            inside = [any(a <= t < b for a, b in busy) for t, _, _ in self.timed]
            for name, keep in (("while_applying", True), ("otherwise", False)):
                rows = [x for x, b in zip(self.timed, inside) if b == keep]
                out[name] = {"read_ms": summary([r for _, r, _ in rows if r is not None], 2),
                             "write_ms": summary([w for _, _, w in rows if w is not None], 2)}
        return out


def gc_pause_max_ms(c: BenchCluster) -> dict:
    """Each node's longest garbage collection since it started (ms, by generation), from its
    /metrics (``raftsched_gc_pause_seconds_max``); a collection holds the GIL, so a lone request
    waits for it."""
    out: dict[str, dict] = {}
    for i in range(c.n):
        try:
            s, text = c.get(i, "/metrics")
        except OSError:
            continue
        if s != 200 or not isinstance(text, str):
            continue
        gens = {}
        for line in text.splitlines():
            if line.startswith("raftsched_gc_pause_seconds_max{"):
                gen = line.split('generation="', 1)[1].split('"', 1)[0]
                gens[gen] = round(float(line.rsplit(" ", 1)[1]) * 1000, 1)
        out[f"node-{i + 1}"] = gens
    return out


def rss_mib(pid: int) -> float | None:
    """A process's resident memory (MiB), from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


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
    ncal = max(64, min(256, m // 8)) if not bulk_available(c, leader) else min(m, max(500, m // 20))
    cal = register_checked(c, leader, [(f"bc-{k}", IDLE_SPEC) for k in range(ncal)], "storm calibration")
    est_s = m / cal["jobs_per_s"]
    # The leader may commit these slots up to `ahead` ms before T (firing ahead, and a storm taken
    # up as early as committing it takes: storm_lead_ms): registration must end, and sampling
    # begin, before then.
    ahead = storm_lead_ms(m)
    # A large registration can slow as the state grows (100 000 jobs on a loaded machine: 1 to 2.6
    # times what 500 jobs calibrated in an empty cluster said, 2026-12-02); it is calibrated with
    # a twentieth of the storm, and given 2.5 times that. 10 000 (the quick run's) twice: at load
    # 7-10, 1.4 times what 500 jobs calibrated and the quick run's 1 s margin were 0.2 s short.
    factor = 1.4 if m < 5_000 else 2.0 if m < 50_000 else 2.5
    t_slot = (math.ceil(time.time() + est_s * factor + margin_s + ahead / 1000)) * 1000
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
    conn = Conn(lport, token=c.token)
    probe = LoneProbe(lport, c.token)
    probe.start()
    rss_peak: dict[str, float] = {}
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
                conn = Conn(c.api_ports[cur_leader], token=c.token)
                continue
            for i, p in c.procs.items():
                r = rss_mib(p.pid)
                if r is not None and r > rss_peak.get(f"node-{i + 1}", 0.0):
                    rss_peak[f"node-{i + 1}"] = r
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
        probe.stop.set()
        probe.join(5)
    leader = cur_leader
    check_alive(c, range(c.n))
    after = samples[1:]
    # The 50 ms sample intervals in which the leader applied slots (wall ms).
    busy = [(a["t_ms"] + t_slot, b2["t_ms"] + t_slot) for a, b2 in zip(samples, after) if b2["runs"] > a["runs"]]
    first_applied = next((x["t_ms"] for x in after if x["runs"] > base["runs"]), None)
    all_applied = next((x["t_ms"] for x in after if x["runs"] - base["runs"] >= m), None)
    # The sample just before all were applied: the true time lies in (before, all_applied].
    before_all = max((x["t_ms"] for x in samples if x["runs"] - base["runs"] < m), default=0.0)
    # slots_fired is the leading trigger's own counter: meaningless across a leader change.
    all_fired = None if leader_changes else next((x["t_ms"] for x in after if x["slots_fired"] - base["slots_fired"] >= m), None)
    # The replicas once quiet (their views paged from all three at once), then every burst job's
    # view as the leader holds it: how many runs its slot became (runs_fired), whether its cursor
    # passed the slot, and its fire lag (fired_at - slot). Paged node after node, and the leader's
    # twice, they took ~16 s of the 10 000-job scenario's 45 s: the leader's now serve both.
    # Of each burst job's view, only what the audit reads: the views are paged, hashed and dropped.
    def keep(v: dict):
        if not v["name"].startswith("b-"):
            return None
        st = v["state"]
        return st["runs_fired"], iso_ms(st["cursor"]), st["fire_lag_ms"]["last"]

    kept_by_node: dict = {}
    audit_t0 = time.monotonic()
    try:
        replicas = replica_agreement(c, kept_by_node, keep)
    except BenchError as e:
        replicas = {"agree": False, "error": str(e)}
    views = kept_by_node.get(leader)
    if views is None:
        views = all_jobs(c, leader, consistent=True, keep=keep)
    n_fired = [v[0] for v in views]
    fired_once = sum(1 for n in n_fired if n == 1)
    dup = sum(1 for n in n_fired if n > 1)
    unhandled = sum(1 for v in views if v[1] < t_slot)
    # Slots refused by a full queue are records, not runs (runs_fired stays 0): count them from the
    # run list. The queue is sized for the burst, so there should be none.
    s_, b_ = c.get(leader, "/v1/runs?state=skipped&limit=10000")
    if s_ != 200:
        raise BenchError(f"burst: GET /v1/runs?state=skipped: {s_} {b_}")
    qfull = sum(1 for r in b_["runs"] if r["job"].startswith("b-") and r.get("reason") == "queue_full" and r["slot_ms"] == t_slot)
    lost = m - len(views) + sum(1 for n in n_fired if n == 0) - qfull
    lag = [v[2] for v in views if v[2] is not None]
    audit_s = round(time.monotonic() - audit_t0, 1)  # the replicas' views and the leader's audit
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
        "fire_ahead_ms": fire_ahead_ms(), "storm_lead_ms_max": ahead,
        # From the first sample that saw a slot applied (the leader takes a storm up as early as
        # it needs, not at a fixed time ahead).
        "slots_per_s": (round(m / ((all_applied - first_applied) / 1000), 1)
                        if all_applied is not None and first_applied is not None and all_applied > first_applied else None),
        "slots_per_s_upper_bound": (round(m / ((before_all - first_applied) / 1000), 1)
                                    if first_applied is not None and before_all > first_applied else None),
        "lone_probe_during_storm": probe.result(busy),
        "gc_pause_max_ms": gc_pause_max_ms(c),
        "rss_peak_mib": {k: round(v, 1) for k, v in sorted(rss_peak.items())},
        "load_avg_after": list(os.getloadavg()),
        "peak_slots_per_s_50ms": round(peak, 1),
        "fired_at_minus_slot_ms": summary(lag, 1),
        "sample_interval_ms": POLL_BURST_S * 1000,
        "samples": samples,
    }
    res["replicas"] = replicas
    res["audit_s"] = audit_s  # reading every node's job views once the storm is applied (the scenario's largest part after it)
    print(f"[bench] storm: {m} slots, first applied at +{first_applied} ms, all applied at +{all_applied} ms, "
          f"runs {fired_once}, queue_full {qfull}", file=sys.stderr)
    return res


def storm(tmp: Path, m: int, clusters: list, fire_log_ok: bool, margin_s: float = 1.5) -> dict:
    """The storm: M one-shot jobs all due at one aligned whole second, on a cluster of its own
    with no workers (the burst measurement above, plus the fire lag from the fire-commit log)."""
    c = start_cluster(tmp, "storm", clusters, NO_WORKER, fire_log=True)
    return burst(c, m, FireLogs(c) if fire_log_ok else None, margin_s)


def aps_storm(tmp: Path, m: int, margin_s: float) -> dict:
    """APScheduler with the same storm, run after the storm cluster stopped (never beside it)."""
    return run_baseline(tmp, "aps_bench.py", ["--mode", "storm", "--jobs", str(m), "--margin", str(margin_s)],
                        f"aps-storm-{m}", timeout_s=90 + m / 500)
