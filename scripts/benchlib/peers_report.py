"""The peers scenario's table (issue 27): one row per system and config, raftsched ÷ peer where a
ratio means something (fires per second)."""
from __future__ import annotations


def _ms(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _list_ms(vs) -> str:
    vs = [v for v in (vs or [])]
    if not vs:
        return "-"
    done = sorted(v for v in vs if v is not None)
    never = len(vs) - len(done)
    s = f"{_ms(done[len(done) // 2])} (max {_ms(done[-1])})" if done else ""
    return (s + (f"; none in {never} of {len(vs)}" if never else "")).strip("; ") or "-"


def peers_markdown(pr: dict) -> list[str]:
    if not isinstance(pr, dict) or "systems" not in pr:
        return []
    prm = pr.get("params", {})
    lines = ["", f"#### HA peers (issue 27): {prm.get('jobs')} jobs every 1 s for fail-over; {prm.get('kills')} kill -9 of the "
             f"active scheduler, restarted after {prm.get('restart_after_s')} s; pause {prm.get('pause_s')} s; every process "
             f"down {prm.get('down_s')} s", "",
             "| system | fires/s at N (lag p50/p99 ms) | steady: lost / twice (of slots) | kills: next fire ms p50 (max) | kills: every job again ms p50 (max) "
             "| kills: lost / twice (of slots) | pause: lost / twice; paused one fired late | restart: missed slots fired late / not fired when read / twice "
             "| restart: every job again ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    ours_tp = (pr["systems"].get("raftsched") or {}).get("throughput") or {}
    for name, s in pr["systems"].items():
        if "not_run" in s and "ha" not in s:
            lines.append(f"| {name} | not run: {s['not_run'][:200]} | | | | | | | |")
            continue
        tp = []
        for n, t in (s.get("throughput") or {}).items():
            lag = t.get("lag_ms") or {}
            ratio = ""
            o = ours_tp.get(n) or {}
            if name != "raftsched" and o.get("fires_per_s") and t.get("fires_per_s"):
                ratio = f", raftsched ÷ = {o['fires_per_s'] / t['fires_per_s']:.2f}"
            tp.append(f"N={int(n):,}: {t.get('fires_per_s')} ({_ms(lag.get('p50'))}/{_ms(lag.get('p99'))}"
                      f"{'; fell behind' if t.get('fell_behind') else ''}{ratio})")
        h = s.get("ha") or {}
        fo, pa, rs, st = h.get("failover") or {}, h.get("pause") or {}, h.get("restart") or {}, h.get("steady") or {}
        mw, af = rs.get("missed_window") or {}, rs.get("after") or {}
        cells = [
            "; ".join(tp) or "-",
            f"{st.get('lost', '-')} / {st.get('fired_twice', '-')} (of {st.get('expected', '-')})" if st else "-",
            _list_ms(fo.get("next_fire_ms")), _list_ms(fo.get("all_jobs_fired_ms")),
            f"{fo.get('lost', '-')} / {fo.get('fired_twice', '-')} (of {fo.get('expected', '-')})" if fo else "-",
            f"{pa.get('lost', '-')} / {pa.get('fired_twice', '-')}; {pa.get('fired_by_paused_after_cont', '-')}" if pa else "-",
            (f"{mw.get('fired_slots', '-')} / {mw.get('lost', '-')} / {mw.get('fired_twice', '-')} (of {mw.get('expected', '-')}); "
             f"after: lost {af.get('lost', '-')}, twice {af.get('fired_twice', '-')}") if mw else "-",
            _ms(rs.get("all_jobs_fired_ms")) if rs else "-",
        ]
        if "not_run" in s:
            cells[0] += f" (then: {s['not_run'][:120]})"
        lines.append(f"| {name} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines
