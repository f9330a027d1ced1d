"""The benchmark's command line (scripts/bench.py, whose docstring is the usage): the profiles,
argument parsing, and the scenario loop, which runs each scenario, records a failure and goes on
to the next, stops every cluster, checks the invariants, and writes the JSON, the report and the
plot."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from . import common
from .checks import falls_behind_at, invariant_failures, raft_log_warnings
from .common import ALL_SCENARIOS, FULL_ONLY_SCENARIOS, REPO, code_has, export_commit, fire_log_supported
from .harness import BenchCluster, start_cluster, stop_clusters
from .register import BULK_PATH
from .report import markdown, plot
from .scenarios.durability import durability
from .scenarios.e2e import e2e
from .scenarios.failover import failover
from .scenarios.fleet import FLEET_EXECUTORS, fleet_e2e, fleet_rest
from .scenarios.scale import scale
from .scenarios.state_machine import state_machine_child
from .scenarios.peers import peers
from .scenarios.pipeline import pipeline
from .scenarios.raw_raft import raw_raft
from .scenarios.storm import aps_storm, storm
from .scenarios.sweep import aps_interval, sweep
from .scenarios.writes import writes

#: The first line of scripts/bench.py's docstring: what --help says.
DESCRIPTION = ("raftsched benchmarks (issue #6): fire throughput and punctuality, a storm of aligned slots, end to")
PROFILES = {
    # Sizes for a run that checks the harness end to end (scripts/test.sh), not figures: about a
    # minute on 2 shared cores. Writes, scale and e2e share one cluster (shared_cluster), in that
    # order; windows are 1 s and sizes small. Registering through PUT costs ~2-5 ms of the leader
    # per job, so without a bulk endpoint the sizes marked *_put are used (the run records which).
    "quick": {"failover_trials": 3, "writes": 50, "reads": 50, "reads_per_reader": 5, "writes_register_put": 300, "writes_register_bulk": 1000,
              "storm_jobs": 10000, "aps_storm_jobs": 1000, "sweep_ns": [1000, 3000], "sweep_ns_put": [500, 1500], "sweep_window_s": 2,
              "sweep_warmup_s": 0.5, "aps_warmup_s": 0.25, "aps_margin_s": 0.5, "storm_margin_s": 1.0,
              "e2e_jobs": 100, "e2e_window_s": 1, "e2e_warmup_s": 0, "e2e_slots": 32,
              "raw_raft_s": 0.5, "raw_raft_warmup_s": 0.25, "raw_raft_in_flight": 200, "scale_ns": [5000], "scale_ns_put": [1000],
              "state_ns": [10000], "shared_cluster": True,
              "fleet_e2e_jobs": 100, "fleet_workers": 4, "fleet_slots": 8, "fleet_window_s": 1, "fleet_warmup_s": 0,
              "fleet_rest_workers": 200, "fleet_rest_procs": 2, "fleet_rest_window_s": 1, "fleet_rest_due_jobs": 20,
              "fleet_rest_due_window_s": 2,
              "durability_rounds": 1, "durability_writes": 20, "durability_register": 100, "durability_sweep_n": 1000,
              "durability_e2e_jobs": 0,
              "peers_ns": [200], "peers_jobs": 5, "peers_kills": 1, "peers_pause_s": 6.0, "peers_down_s": 5.0,
              "peers_window_s": 2, "peers_warmup_s": 1,
              "pipeline_rate": 60, "pipeline_workers": 2, "pipeline_worker_slots": 16, "pipeline_window_s": 1,
              "pipeline_warmup_s": 0, "pipeline_fanout": 1000, "pipeline_probe_before_s": 0.5, "pipeline_idle_s": 0},
    "full": {"failover_trials": 20, "writes": 1000, "reads": 1000, "reads_per_reader": 100, "writes_register_put": 5000, "writes_register_bulk": 50000,
             "storm_jobs": 100000, "aps_storm_jobs": 10000, "sweep_ns": [1000, 10000, 30000, 100000], "sweep_ns_put": None,
             "sweep_window_s": 10, "sweep_warmup_s": 3, "aps_warmup_s": 3, "aps_margin_s": 2.0, "storm_margin_s": 1.5,
             "e2e_jobs": 5000, "e2e_window_s": 10, "e2e_warmup_s": 3,
             "e2e_slots": 32, "raw_raft_s": 10, "raw_raft_warmup_s": 2, "raw_raft_in_flight": 1000, "scale_ns": [100000], "scale_ns_put": None,
             "state_ns": [100000], "shared_cluster": False,
             "fleet_e2e_jobs": 5000, "fleet_workers": 4, "fleet_slots": 32, "fleet_window_s": 10, "fleet_warmup_s": 3,
             "fleet_rest_workers": 10000, "fleet_rest_procs": 4, "fleet_rest_window_s": 20, "fleet_rest_due_jobs": 50,
             "fleet_rest_due_window_s": 10,
             "durability_rounds": 2, "durability_writes": 500, "durability_register": 3000, "durability_sweep_n": 10000,
             "durability_e2e_jobs": 2000,
             # The HA peers (issue 27): N jobs every 1 s for throughput; J jobs for the HA session:
             # K kills of the active scheduler, a pause longer than the peers' lease/lock timeouts
             # (APScheduler 4's default lease is 30 s), every process down for 30 s.
             "peers_ns": [1000, 10000, 30000], "peers_jobs": 20, "peers_kills": 20, "peers_pause_s": 35.0,
             "peers_down_s": 30.0, "peers_window_s": 10, "peers_warmup_s": 3,
             # Pipelines (issue 25): R runs offered a second, as R independent jobs, then R/2 chains,
             # executed by W worker processes (a rate a loaded two-core machine keeps up with: an
             # isolated run costs ~10 ms of CPU); then one parent with this many children.
             "pipeline_rate": 100, "pipeline_workers": 2, "pipeline_worker_slots": 16, "pipeline_window_s": 10,
             "pipeline_warmup_s": 3, "pipeline_fanout": 10000, "pipeline_probe_before_s": 3, "pipeline_idle_s": 5},
}
#: With shared_cluster (quick), these scenarios run one after the other on one cluster, started by
#: the first of them, with workers on (the e2e scenario needs them) and the fire log on.
SHARED_SCENARIOS = ("writes", "scale", "e2e")
#: The order of a quick run: the shared cluster's scenarios next to each other.
QUICK_ORDER = ("failover", "writes", "scale", "e2e", "sweep", "storm", "raw_raft", "fleet_e2e", "fleet_rest", "durability",
               "pipeline", *FULL_ONLY_SCENARIOS)
SCALE_1M = 1_000_000


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--quick", action="store_true", help="a small version of every scenario (about two minutes; "
                                                         "writes, scale and e2e share one cluster)")
    ap.add_argument("--out", default="bench-results.json", help="JSON results (default: bench-results.json in the cwd)")
    ap.add_argument("--plot", help="PNG of the fire lag distributions (default: --out with .png)")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' data dirs and logs even on success")
    ap.add_argument("--git-ref", help="run the nodes from this commit (git archive into the temp dir) "
                                      "instead of the working tree")
    ap.add_argument("--storm-jobs", "--burst-jobs", dest="storm_jobs", type=int, help="override the storm size")
    ap.add_argument("--sweep-ns", help="override the sweep's job counts, comma-separated (e.g. 1000,10000)")
    ap.add_argument("--e2e-jobs", type=int, help="override the end-to-end scenarios' job count (offered runs per second; "
                                             "e2e and fleet_e2e alike, so that both are offered one rate)")
    ap.add_argument("--fleet-slots", type=int, help="override the slots of each fleet_e2e worker process")
    ap.add_argument("--fleet-executor", choices=FLEET_EXECUTORS, default="app",
                    help="how fleet_e2e's workers run the no-op runs: app (default), an SDK app's async handler in "
                         "the worker's process, the scheduling alone; sandbox, each run a process as the run user")
    ap.add_argument("--pipeline-rate", type=int, help="override the pipeline scenario's offered runs a second (R "
                                                       "independent jobs, then R/2 chains)")
    ap.add_argument("--fleet-rest-workers", type=int, help="override the simulated idle workers of fleet_rest")
    ap.add_argument("--fleet-rest-wait-s", type=float, help="the wait_s of fleet_rest's simulated workers (default 20, "
                                                           "raftsched worker's default)")
    ap.add_argument("--scale-1m", action="store_true", help="also register 1,000,000 jobs in the scale scenario, and "
                                                           "make the storm 1,000,000 jobs (through PUT that takes an hour or more)")
    ap.add_argument("--state-machine-child", type=int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--peers-ns", help="override the peers scenario's job counts for throughput, comma-separated")
    ap.add_argument("--peers-kills", type=int, help="override the peers scenario's kills of the active scheduler")
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(ALL_SCENARIOS + FULL_ONLY_SCENARIOS)
                    + " (burst = storm; default: all, less " + ",".join(FULL_ONLY_SCENARIOS) + " with --quick)")
    args = ap.parse_args(argv)
    if args.state_machine_child:  # the scale scenario's in-process measurement (state_machine)
        print(json.dumps(state_machine_child(args.state_machine_child)))
        return 0
    profile = "quick" if args.quick else "full"
    p = dict(PROFILES[profile])
    only_arg = args.only or ",".join(ALL_SCENARIOS + (() if args.quick else FULL_ONLY_SCENARIOS))
    only = [("storm" if x.strip() == "burst" else x.strip()) for x in only_arg.split(",") if x.strip()]
    unknown = [x for x in only if x not in ALL_SCENARIOS + FULL_ONLY_SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {','.join(ALL_SCENARIOS + FULL_ONLY_SCENARIOS)}")
    plot_path = Path(args.plot) if args.plot else Path(args.out).with_suffix(".png")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    tmp = Path(tempfile.mkdtemp(prefix="raftsched-bench-"))
    code = {"source": "working tree"}
    if args.git_ref:
        common.CODE_DIR = tmp / "code"
        sha = export_commit(args.git_ref, common.CODE_DIR)
        code = {"source": "git archive", "ref": args.git_ref, "commit": sha}
    # What the nodes' code offers decides what can be measured, and (for a quick run) how many jobs
    # fit in its time: registering through PUT costs the leader a Raft entry per job.
    fire_log_ok = fire_log_supported()
    bulk = code_has(BULK_PATH.rsplit("/", 1)[-1])
    if args.scale_1m:
        p["storm_jobs"] = SCALE_1M
    if args.storm_jobs:
        p["storm_jobs"] = args.storm_jobs
    if args.e2e_jobs:
        p["e2e_jobs"] = args.e2e_jobs
    if args.fleet_slots:
        p["fleet_slots"] = args.fleet_slots
    if args.pipeline_rate:
        p["pipeline_rate"] = args.pipeline_rate
    if args.fleet_rest_workers:
        p["fleet_rest_workers"] = args.fleet_rest_workers
    p["fleet_rest_wait_s"] = args.fleet_rest_wait_s or 20.0
    if args.peers_ns:
        p["peers_ns"] = [int(x) for x in args.peers_ns.split(",")]
    if args.peers_kills is not None:
        p["peers_kills"] = args.peers_kills
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
    clusters: list[BenchCluster] = []
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
    order = [n for n in (QUICK_ORDER if p["shared_cluster"] else ALL_SCENARIOS + FULL_ONLY_SCENARIOS) if n in only]
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
                    res[name] = raw_raft(tmp, p)
                elif name == "sweep":
                    # APScheduler first, alone; then our cluster (never both at once: they share the CPUs).
                    aps = aps_interval(tmp, p["sweep_ns"], p["sweep_window_s"], p["aps_warmup_s"], p["aps_margin_s"])
                    res[name] = {"apscheduler": aps, "ours": {}}
                    sweep(tmp, p["sweep_ns"], p["sweep_window_s"], p["sweep_warmup_s"], clusters, fire_log_ok, register_budget_s,
                          res[name]["ours"])
                elif name == "storm":
                    res[name] = {"ours": storm(tmp, p["storm_jobs"], clusters, fire_log_ok, p["storm_margin_s"])}
                    stop_clusters(clusters)  # the baseline runs alone
                    res[name]["apscheduler"] = aps_storm(tmp, min(p["storm_jobs"], p["aps_storm_jobs"]), p["aps_margin_s"])
                elif name == "e2e":
                    res[name] = e2e(tmp, p["e2e_jobs"], p["e2e_window_s"], p["e2e_warmup_s"], p["e2e_slots"], clusters, fire_log_ok,
                                    shared_cluster() if name in sharing else None)
                elif name == "fleet_e2e":
                    n_jobs = args.e2e_jobs or p["fleet_e2e_jobs"]
                    res[name] = fleet_e2e(tmp, n_jobs, p["fleet_window_s"], p["fleet_warmup_s"], p["fleet_workers"],
                                          p["fleet_slots"], clusters, args.fleet_executor)
                elif name == "fleet_rest":
                    res[name] = fleet_rest(tmp, p["fleet_rest_workers"], p["fleet_rest_procs"], p["fleet_rest_window_s"],
                                           p["fleet_rest_due_jobs"], p["fleet_rest_due_window_s"], clusters,
                                           p["fleet_rest_wait_s"])
                elif name == "peers":
                    res[name] = peers(tmp, p, clusters, fire_log_ok, register_budget_s)
                elif name == "durability":
                    res[name] = durability(tmp, p, clusters, fire_log_ok, register_budget_s)
                elif name == "pipeline":
                    res[name] = {}
                    pipeline(tmp, p, clusters, res[name])
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
            stop_clusters([c for c in clusters if c is not keep])
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
        stop_clusters(clusters)
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
