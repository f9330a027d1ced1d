"""timeline.png: one lane per node (its role over time, the faults that hit it, and the spans in
which its commit index stalled: the commit-progress checker's counterexamples), then one lane
per job (its slots: runs coloured by outcome, recorded ranges as bars; the sink's writes as
ticks, refused writes as red crosses). Time is seconds since the workload started."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROLE_COLOURS = {"leader": "#2ca02c", "follower": "#aec7e8", "candidate": "#ff7f0e", "down": "#444444",
                "paused": "#9467bd", "unreachable": "#d62728"}
RUN_COLOURS = {"succeeded": "#2ca02c", "dead": "#d62728", "failed": "#d62728", "queued": "#7f7f7f",
               "running": "#1f77b4"}
REC_COLOURS = {"skipped": "#ff9896", "coalesced": "#ffbb78"}
FAULT_COLOURS = {"kill": "#000000", "pause": "#9467bd", "partition": "#d62728", "clock": "#17becf",
                 "restart-all": "#8c564b", "power": "#e377c2", "member-replace": "#2ca02c",
                 "member-grow-shrink": "#2ca02c", "member-remove-leader": "#2ca02c"}
STALL_COLOUR = "#e6007e"


def plot(data: dict, results: dict, path) -> None:
    times = data.get("times") or {}
    t0 = times.get("t0_ms")
    if t0 is None:
        return

    def x(ms):
        return (ms - t0) / 1000

    final = (data.get("reads") or {}).get("restart") or (data.get("reads") or {}).get("final") or {}
    read = next((r for _, r in sorted(final.items()) if r.get("runs") is not None), None)
    runs = read["runs"] if read else []
    jobs = sorted({r["job"] for r in runs} | {w.get("job") for w in data.get("sink", []) if w.get("job")})
    n_nodes = max(3, len(data.get("nodes") or []))
    n_lanes = n_nodes + len(jobs)
    fig, ax = plt.subplots(figsize=(16, max(5, 0.32 * n_lanes + 2)))
    # Node lanes: role from the monitor, one bar per sample interval.
    lanes = {}
    for i in range(n_nodes):
        y = n_lanes - 1 - i
        lanes[i] = y
        samples = sorted((s for s in data.get("monitor", []) if s["node"] == i), key=lambda s: s["t_ms"])
        for s, nxt in zip(samples, samples[1:] + [None]):
            end = nxt["t_ms"] if nxt else s["t_ms"] + 500
            role = ("paused" if s.get("paused") else "down" if not s.get("alive", True)
                    else s.get("role") if s.get("up") else "unreachable")
            ax.barh(y, x(end) - x(s["t_ms"]), left=x(s["t_ms"]), height=0.6,
                    color=ROLE_COLOURS.get(role, "#cccccc"), linewidth=0)
    for f in data.get("faults", []):
        start, end = f.get("start_ms"), f.get("end_ms") or f.get("start_ms")
        for i in f.get("nodes") or []:
            y = lanes[i]
            ax.plot([x(start), x(end)], [y + 0.38, y + 0.38], color=FAULT_COLOURS.get(f["kind"], "k"), linewidth=3)
            label = f["kind"]
            if f["kind"] == "partition":
                label += f"/{f['fault'].get('mode')}"
            if f["kind"] == "clock":
                label += f" {f['fault'].get('offset_ms', 0) / 1000:+.0f}s"
            if f["fault"].get("burst"):
                label += "+burst"
            ax.text(x(start), y + 0.45, label, fontsize=6, va="bottom")
    for sp in (results.get("checkers", {}).get("commit-progress") or {}).get("stalls") or []:
        y = lanes[sp["node"]]
        ax.plot([x(sp["from_ms"]), x(sp["to_ms"])], [y - 0.2, y - 0.2], color=STALL_COLOUR, linewidth=4)
        ax.text(x(sp["to_ms"]), y - 0.2, f" commit stalled at {sp['commit']}", fontsize=6, va="center", color=STALL_COLOUR)
    heal = times.get("heal_ms")
    if heal:
        ax.axvline(x(heal), color="k", linestyle="--", linewidth=0.8)
        ax.text(x(heal), n_lanes - 0.3, " heal", fontsize=7)
    if times.get("restart_ms"):
        ax.axvline(x(times["restart_ms"]), color="#8c564b", linestyle=":", linewidth=0.8)
        ax.text(x(times["restart_ms"]), n_lanes - 0.3, " restart-all", fontsize=7)
    # Job lanes.
    for k, job in enumerate(jobs):
        y = n_lanes - n_nodes - 1 - k
        for r in runs:
            if r["job"] != job:
                continue
            if r.get("kind") == "recorded":
                hi = r.get("slot_to") or r["slot_ms"]
                ax.barh(y, max(0.3, x(hi) - x(r["slot_ms"])), left=x(r["slot_ms"]), height=0.5,
                        color=REC_COLOURS.get(r["state"], "#dddddd"), linewidth=0)
            else:
                ax.plot(x(r["slot_ms"]), y, "o", markersize=3.5, color=RUN_COLOURS.get(r["state"], "#7f7f7f"))
        ws = [w for w in data.get("sink", []) if w.get("job") == job]
        ok = [x(w["t_ms"]) for w in ws if w.get("accepted")]
        bad = [x(w["t_ms"]) for w in ws if not w.get("accepted")]
        ax.plot(ok, [y - 0.3] * len(ok), "|", markersize=4, color="#555555")
        if bad:
            ax.plot(bad, [y - 0.3] * len(bad), "x", markersize=7, color="#d62728", markeredgewidth=2)
    ax.set_yticks([n_lanes - 1 - i for i in range(n_nodes)] + [n_lanes - n_nodes - 1 - k for k in range(len(jobs))])
    ax.set_yticklabels([f"node-{i + 1}" for i in range(n_nodes)] + jobs, fontsize=7)
    ax.set_xlabel("seconds since the workload started")
    ax.set_ylim(-1, n_lanes + 0.5)
    sched = data.get("schedule") or {}
    ax.set_title(f"seed {sched.get('seed')} ({sched.get('profile')}): {results.get('valid', '?').upper()}  —  "
                 + ", ".join(f"{n} {r['valid']}" for n, r in results.get("checkers", {}).items()), fontsize=9)
    handles = [Patch(color=c, label=r) for r, c in ROLE_COLOURS.items()]
    handles += [Line2D([], [], color=c, linewidth=3, label=f) for f, c in FAULT_COLOURS.items()]
    handles += [Line2D([], [], color=STALL_COLOUR, linewidth=4, label="commit stalled")]
    handles += [Line2D([], [], marker="o", linestyle="", color=c, label=f"run {s}") for s, c in RUN_COLOURS.items() if s != "failed"]
    handles += [Patch(color=c, label=f"recorded {s}") for s, c in REC_COLOURS.items()]
    handles += [Line2D([], [], marker="|", linestyle="", color="#555555", label="sink write"),
                Line2D([], [], marker="x", linestyle="", color="#d62728", label="sink refused")]
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
