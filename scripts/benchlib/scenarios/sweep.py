"""The sweep: N interval jobs every 1 s, staggered over the second, for growing N on one cluster
with no workers; slots committed per second, fire lag, slots fired ahead, and where it falls
behind, beside APScheduler with the same N."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from raftsched.testing.cluster import LocalCluster

from ..common import FELL_BEHIND_P99_MS, FELL_BEHIND_SHARE, PY_NOOP, fired_ahead, iso, lag_sample, lag_stats, pct, summary, wall_ms
from ..harness import FireLogs, NO_WORKER, check_alive, leader_checked, measurement_window, put_queue, run_baseline, start_cluster, wait_fire_log_past
from ..probes import rss_kib
from ..register import register_checked

SWEEP_QUEUE = "sweep"
#: The golden ratio's fractional part: job k's phase frac(k * PHI) * 1000 ms spreads any prefix of
#: the jobs evenly over the second, so registering in steps keeps every step staggered.
PHI = (math.sqrt(5) - 1) / 2


def stagger_probe(c: LocalCluster, i: int) -> dict:
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


def sweep(tmp: Path, ns: list[int], window_s: float, warmup_s: float, clusters: list, fire_log_ok: bool,
          register_budget_s: float, out: dict, extra_args: tuple = (), name: str = "sweep") -> dict:
    """N interval jobs every 1 s on one cluster with no workers, for each N in ``ns`` in turn (the
    jobs are added between steps). Per step, after a warm-up, a window of ``window_s``: slots
    committed per second (slots in fire-log records committed in the window), the fire lag of those
    slots (commit time minus slot), and whether the cluster fell behind. Fills ``out`` as it goes
    (so the steps done survive a failure of a later one) and returns it. ``extra_args`` go to
    every node after NO_WORKER (the durability scenario's ``--no-fsync``)."""
    steps = out.setdefault("steps", [])
    out.update({"queue": {"name": SWEEP_QUEUE, "max_depth": 1_000_000, "on_full": "drop_oldest"}})
    c = start_cluster(tmp, name, clusters, NO_WORKER + tuple(extra_args), fire_log=True)
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
