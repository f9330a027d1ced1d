"""Scale: memory per node with N idle jobs, and a whole-cluster cold restart until every job is
restored and the schedule fires again (with the raft journal each node replayed); the in-process
state-machine figures first."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from raftsched.testing.procs import wait_for

from ..common import BenchError, PY_NOOP, SCALE_SPEC, code_limit, fleet_spec, iso_ms, wall_ms
from ..harness import BenchCluster, FireLogs, NO_WORKER, check_alive, leader_checked, node_log_excerpt, put_ok, start_cluster
from ..probes import dir_sizes, journal_info, rss_kib
from ..register import register_checked
from .state_machine import state_machine

#: Three jobs that fire every second on the scale cluster: "it fires again" after a cold restart.
BEACON_SPEC = {"schedule": {"every_s": 1}, "executor": PY_NOOP, "misfire": {"policy": "fire_all"}, "history": 10}


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
            wait_for(lambda: all((c.status(i) or {}).get("jobs") == total for i in range(c.n)), 60 + n / 2000,  # noqa: B023 - called in this iteration
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
    """Stop every node (SIGTERM by PID, SIGKILL after 90 s: a node stopped so writes a dump of
    what it applied first, up to 60 s at 1M jobs; killed sooner, its dump writer would keep the
    data dir's lock past the start's 10 s wait), start them again on their data dirs
    and ports, and time (from the start) each node's API answering, a leader agreed, each node
    holding ``expect_jobs`` jobs with last_applied at least the commit index before the stop, and
    the first fire committed after the start (fire log; else a run with fired_at after the start)."""
    leader, _ = leader_checked(c)
    s, b = c.get(leader, "/v1/jobs?limit=1&consistent=true")  # a barrier: everything acknowledged is committed
    if s != 200:
        raise BenchError(f"scale: barrier read on node-{leader + 1}: {s} {b}")
    ci = (c.status(leader) or {}).get("commit_index")
    t0 = time.monotonic()
    c.children.stop_all(timeout_s=90.0)
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
                    s_, b_ = c.get(i, "/v1/runs?limit=5&stale=true")  # before a leader too
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
    return {"commit_index_before": ci, "journal": journal, "dump_bytes": dump, "stop_s": round(stop_s, 2), "stop": "SIGTERM to each node by PID (SIGKILL after 90 s; each writes its dump first)",
            "api_up_s": {f"node-{i + 1}": v for i, v in sorted(api_up.items())}, "leader_s": leader_at,
            "restored_s": {f"node-{i + 1}": v for i, v in sorted(restored.items())},
            "all_restored_s": max(restored.values()), "first_fire_s": first_fire["s"], "first_fire": first_fire,
            "first_fire_source": fire_src}
