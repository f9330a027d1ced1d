"""The report: the Markdown table printed at the end of a run (every figure from the results
JSON) and the plot of the fire-lag distributions (matplotlib, Agg)."""
from __future__ import annotations

import math
from pathlib import Path

from .peers_report import peers_markdown
from .common import ALL_SCENARIOS, FELL_BEHIND_P99_MS, FELL_BEHIND_SHARE, LAG_SAMPLE_MAX
from .register import BULK_CONCURRENCY, CONCURRENCY
from .scenarios.fleet import report_rows as fleet_rows
from .scenarios.pipeline import report_rows as pipeline_rows

def ratio(ours, theirs, digits: int = 2):
    """ours ÷ theirs, or None when either is missing or theirs is 0."""
    if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)) or not theirs:
        return None
    return round(ours / theirs, digits)


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
    rd = (w or {}).get("reads") if isinstance(w, dict) else None
    if isinstance(rd, dict) and "consistent" in rd:
        n_r = rd["readers"]
        for key, label in (("consistent", "consistent (default)"), ("stale", "?stale=true")):
            for part, who in (("alone", f"1 client, {fmt(rd['n'])} sequential"),
                              (f"{n_r}_readers", f"{n_r} clients, {fmt(rd['per_reader'])} each")):
                r = rd[key][part]
                extra = (f"; {fmt(r['barrier_rounds'])} barrier rounds" if "barrier_rounds" in r else "")
                row(f"reads (GET {rd['path']} on a follower)" if (key, part) == ("consistent", "alone") else "",
                    f"{label}, {who}: p50 / p99 / max (ms), reads/s", f"{_ppm(r['latency_ms'])}; {fmt(r['reads_per_s'])}{extra}")
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
                    f"{b['all_applied_after_ms']} ms); slots/s from the first applied"
                    + (f" (the storm may be taken up from T − {b['storm_lead_ms_max']} ms)" if b.get("storm_lead_ms_max") else ""),
                f"{b['first_applied_ms']} / {b['all_applied_ms']}; {fmt(b['slots_per_s'])}")
            lp = b.get("lone_probe_during_storm")
            if lp:
                row("", "the leader's lone read / write while the storm is committed: p50 / p99 / max (ms)",
                    f"{_ppm(lp['read_ms'])} / {_ppm(lp['write_ms'])}" + (f"; errors {lp['errors']}" if lp.get("errors") else ""))
            if b.get("rss_peak_mib"):
                row("", "resident memory at the peak, per node (MiB)", ", ".join(f"{k} {v}" for k, v in b["rss_peak_mib"].items()))
            row("", "leader changes during the storm", str(len(b.get("leader_changes_during_burst") or [])))
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
            row("", "CPU of the three node processes and their run servers (runs included) per completed run (µs; cores busy in the window)",
                f"{fmt(e['cpu_us_per_run'])} ({e['cluster_cpu_s'] / e['worker_counters_s']:.2f})")
    fleet_rows(res, row, fmt, _ppm, ratio)
    pipeline_rows(res, row, fmt, _ppm)
    d = res.get("durability")
    if isinstance(d, dict) and "summary" in d:
        on, off, cost = d["summary"]["on"], d["summary"]["off"], d["summary"]["cost_of_fsync"]
        label = (f"durability: fsync on vs --no-fsync (fresh clusters, medians of {d['rounds']} round(s) each; "
                 f"sweep N={fmt(d['sweep_n'])}, e2e {fmt(d['e2e_jobs'])} jobs)")
        for role in ("leader", "follower"):
            pp = cost.get(f"lone_{role}_paired_p50_ms")
            if pp is not None:
                row(label, f"lone write to the {role} p50 (ms), two clusters written in turn: on / off; "
                           "median of the pairs' differences",
                    f"{fmt(pp[0])} / {fmt(pp[1])}; {cost[f'lone_{role}_paired_added_ms']} ms")
                label = ""
        for k, fig in (("lone_leader_p50_ms", "lone write to the leader p50 (ms)"),
                       ("lone_follower_p50_ms", "lone write to a follower p50 (ms)"),
                       ("register_jobs_per_s", "jobs registered per second (PUT)"),
                       ("sweep_slots_per_s", "sweep slots committed per second"),
                       ("e2e_completed_per_s", "end-to-end runs completed per second")):
            c = cost.get(k.replace("_ms", "_added_ms") if k.endswith("_ms") else k.replace("_per_s", "_lost_pct"))
            row(label, f"{fig}: on / off" + ("; added by fsync" if k.endswith("_ms") else "; lost to fsync"),
                f"{fmt(on.get(k))} / {fmt(off.get(k))}; " + ("-" if c is None else (f"{c} ms" if k.endswith("_ms") else f"{c} %")))
            label = ""
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
            for _key, k in kinds.items():
                notes.append(f"{cname}/{node}: {k['count']} × `{k['first'][24:140]}…`")
    for name in ("e2e", "fleet_e2e"):
        if (res.get(name) or {}).get("warmup_note"):
            notes.append(f"{name}: " + res[name]["warmup_note"])
    if notes:
        lines += ["", "Notes and warnings:", ""] + [f"- {n}" for n in notes]
    if isinstance(f, dict) and "trials" in f:
        lines += ["", "Fail-over trials:", "",
                  "| # | killed | phase ms | leader seen ms | first fire seen ms | its slot − kill ms | fired_at − kill ms | rejoin s |",
                  "|---|---|---|---|---|---|---|---|"]
        for t in f["trials"]:
            lines.append(f"| {t['trial']} | {t['killed']} | {t['kill_phase_ms']} | {fmt(t['election_observed_ms'])} | {fmt(t['observed_ms'])} | "
                         f"{t['slot_minus_kill_ms']:+.0f} | {t['fired_at_minus_kill_ms']} | {t['restart_catch_up_s']} |")
    lines += peers_markdown(res.get("peers"))
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
