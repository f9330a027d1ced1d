"""Durability: what syncing before acknowledging costs (docs/operations.md, "Durability"). The same
measurements with fsync on (the default) and off (``raftsched node --no-fsync``), on fresh
clusters, the two settings alternating round by round so that the machine's drift falls on both:
lone write latency to the leader and a follower, jobs registered per second (PUT per job), sweep
slots per second at one N (no workers), and end-to-end runs per second (workers on)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..common import IDLE_SPEC
from ..harness import NO_WORKER, leader_checked, start_cluster, stop_clusters
from ..register import register_checked
from .e2e import e2e
from .sweep import sweep
from .writes import lone_writes, paired_lone_writes

SETTINGS = {"on": (), "off": ("--no-fsync",)}


def durability(tmp: Path, p: dict, clusters: list, fire_log_ok: bool, register_budget_s: float) -> dict:
    rounds = p["durability_rounds"]
    out: dict = {"rounds": rounds, "sweep_n": p["durability_sweep_n"], "e2e_jobs": p["durability_e2e_jobs"],
                 "writes": p["durability_writes"], "register": p["durability_register"], "on": [], "off": []}
    # First, lone writes to a cluster of each setting at once, in turn: the sync's cost as the
    # difference of samples taken a few ms apart. Then the rounds, on fresh clusters.
    pair = [start_cluster(tmp, f"dur-paired-{setting}", clusters, NO_WORKER + SETTINGS[setting])
            for setting in ("on", "off")]
    out["paired"] = paired_lone_writes(pair[0], pair[1], p["durability_writes"])
    stop_clusters(clusters)
    for r in range(rounds):
        for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
            args = SETTINGS[setting]
            tag = f"dur-{setting}-{r}"
            one: dict = {}
            out[setting].append(one)
            # Lone writes and registration, then the end-to-end runs, on one cluster with workers.
            c = start_cluster(tmp, tag, clusters, ("--slots", str(p["e2e_slots"])) + args, fire_log=True)
            w = lone_writes(c, p["durability_writes"])
            one["lone_ms"] = {role: w[role]["latency_ms"] for role in ("leader", "follower")}
            leader, _ = leader_checked(c)
            reg = register_checked(c, leader, [(f"dr-{k}", IDLE_SPEC) for k in range(p["durability_register"])],
                                   f"durability ({setting}): registration", method="put")
            one["register_jobs_per_s"] = reg["jobs_per_s"]
            if p["durability_e2e_jobs"]:  # 0 in --quick: the e2e scenario runs on its own there
                e = e2e(tmp, p["durability_e2e_jobs"], p["e2e_window_s"], p["e2e_warmup_s"], p["e2e_slots"], clusters,
                        fire_log_ok, c)
                one["e2e_per_s"] = e["per_s"]
                one["e2e_slot_to_completion_ms"] = e["slot_to_completion_ms"]
            else:
                one["e2e_per_s"] = one["e2e_slot_to_completion_ms"] = None
            one["syncs"] = {f"node-{i + 1}": (c.status(i) or {}).get("durability") for i in range(c.n)}
            stop_clusters(clusters)
            sw: dict = {}
            sweep(tmp, [p["durability_sweep_n"]], p["sweep_window_s"], p["sweep_warmup_s"], clusters, fire_log_ok,
                  register_budget_s, sw, extra_args=args, name=f"{tag}-sweep")
            step = (sw.get("steps") or [{}])[-1]
            one["sweep_slots_per_s"] = step.get("slots_per_s")
            one["sweep_lag_ms"] = step.get("lag_ms")
            stop_clusters(clusters)
            print(f"[bench] durability fsync {setting} round {r + 1}: lone write p50 leader "
                  f"{one['lone_ms']['leader'].get('p50')} ms, follower {one['lone_ms']['follower'].get('p50')} ms; "
                  f"{one['register_jobs_per_s']} jobs/s; sweep {one['sweep_slots_per_s']} slots/s; "
                  f"e2e {(one['e2e_per_s'] or {}).get('completed')} runs/s", file=sys.stderr)
    out["summary"] = summarize(out)
    return out


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def summarize(out: dict) -> dict:
    """Per setting, the median over rounds of each figure; and what fsync on costs."""
    figs = {
        "lone_leader_p50_ms": lambda o: o["lone_ms"]["leader"].get("p50"),
        "lone_follower_p50_ms": lambda o: o["lone_ms"]["follower"].get("p50"),
        "lone_leader_p99_ms": lambda o: o["lone_ms"]["leader"].get("p99"),
        "register_jobs_per_s": lambda o: o.get("register_jobs_per_s"),
        "sweep_slots_per_s": lambda o: o.get("sweep_slots_per_s"),
        "e2e_completed_per_s": lambda o: (o.get("e2e_per_s") or {}).get("completed"),
    }
    s: dict = {}
    for setting in ("on", "off"):
        s[setting] = {k: _median([f(o) for o in out[setting] if o]) for k, f in figs.items()}
    cost = {}
    for k in figs:
        on, off = s["on"][k], s["off"][k]
        if on is None or off is None or not off:
            continue
        if k.endswith("_ms"):
            cost[k.replace("_ms", "_added_ms")] = round(on - off, 3)
        else:
            cost[k.replace("_per_s", "_lost_pct")] = round(100 * (off - on) / off, 1)
    paired = out.get("paired") or {}
    for role in ("leader", "follower"):
        if role in paired:
            cost[f"lone_{role}_paired_added_ms"] = paired[role]["added_median_ms"]
            cost[f"lone_{role}_paired_p50_ms"] = [paired[role]["on"]["p50"], paired[role]["off"]["p50"]]
    s["cost_of_fsync"] = cost
    return s
