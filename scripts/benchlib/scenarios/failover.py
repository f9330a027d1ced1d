"""Fail-over: kill -9 of the leader, repeated; the time from the kill until a survivor's API shows
the next committed fire, and an audit of every job's history on every replica."""
from __future__ import annotations

import http.client
import os
import signal
import sys
import time
from pathlib import Path

from raftsched.testing.procs import wait_for

from ..checks import slot_audit
from ..common import BenchError, SHELL_TRUE, fire_ahead_ms, iso, iso_ms, summary, wall_ms
from ..harness import Conn, check_alive, leader_checked, node_log_excerpt, put_ok, start_cluster

FAILOVER_SPEC = {"schedule": {"every_s": 1}, "executor": SHELL_TRUE, "misfire": {"policy": "fire_all"}, "history": 1000}
POLL_FAILOVER_S = 0.010


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
        conns = {i: Conn(c.api_ports[i], token=c.token) for i in survivors}
        try:
            # Steady state: the current leader has fired since the last restart caught up.
            t_ready = wall_ms()
            wait_for(lambda: any(iso_ms(r["fired_at"]) > t_ready for r in conns[survivors[0]].get("/v1/runs?limit=10&stale=true")[1]["runs"]),  # noqa: B023 - called in this iteration
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
                        s, b = conns[i].get("/v1/runs?limit=10&stale=true")  # the survivor's replica, leader or not
                        seen = time.perf_counter()
                    except (OSError, http.client.HTTPException):
                        continue
                    if s != 200:
                        raise BenchError(f"trial {k}: GET /v1/runs on node-{i + 1}: {s} {b}")
                    hits = [r for r in b["runs"] if iso_ms(r["fired_at"]) > t_kill]
                    if hits:
                        # The earliest slot of the first fire: an entry can carry several slots of
                        # a job (fire_ahead_span_ms), and only its first waits for fire_ahead_ms.
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
                me = c.status(leader)  # noqa: B023 - caught_up is waited on in this iteration
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
