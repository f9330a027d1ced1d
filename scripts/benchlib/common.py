"""What every part of the benchmark shares, standard library only: the job specs that more than
one scenario uses, the nodes' code directory (the working tree, or an exported commit with
--git-ref), time and ISO helpers, and the summaries (nearest-rank percentiles, fire-lag
statistics) that the scenarios write and the report reads."""
from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"  # every cluster and every request stays on loopback
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SHELL_TRUE = {"type": "shell", "argv": ["true"]}
PY_NOOP = {"type": "python", "target": "builtins:id"}
#: A job that never falls due during the benchmark: writes measure the write path only.
IDLE_SPEC = {"schedule": {"at": "2099-01-01T00:00:00Z"}, "executor": SHELL_TRUE, "misfire": {"policy": "skip"}}
#: The scale scenario's jobs, as a fleet registers them: one template (interval, misfire, history)
#: with an executor of each job's own (an HTTP hook per job, on loopback, never called: the jobs
#: first fall due an hour after their creation). The scenario measures what holding them costs,
#: not firing them; the in-process state-machine figures use the same jobs (fleet_spec).
SCALE_SPEC = {"schedule": {"every_s": 3600}, "executor": {"type": "http", "url": "http://127.0.0.1:9/hooks/s-0"},
              "misfire": {"policy": "skip"}, "history": 1}


def fleet_spec(k: int) -> dict:
    """Job s-k of the scale scenario: SCALE_SPEC with its own executor URL."""
    spec = dict(SCALE_SPEC)
    spec["executor"] = {"type": "http", "url": f"http://127.0.0.1:9/hooks/s-{k}"}
    return spec


ALL_SCENARIOS = ("failover", "writes", "sweep", "storm", "e2e", "raw_raft", "scale", "fleet_e2e", "fleet_rest",
                 "durability", "pipeline")
#: Scenarios of the full run only (not in --quick unless named with --only): peers needs PostgreSQL,
#: Redis and the peers' packages, which the benchmark installs when it runs.
FULL_ONLY_SCENARIOS = ("peers",)
#: How a run of one job's slots is considered late: fell behind when fewer than this share of the
#: due slots was committed in the window, or the fire lag p99 exceeded FELL_BEHIND_P99_MS.
FELL_BEHIND_SHARE = 0.95
FELL_BEHIND_P99_MS = 1000
#: Fire lag values kept in the JSON for a plot (a seeded sample; the quantiles use all of them).
LAG_SAMPLE_MAX = 5000


class BenchError(Exception):
    """A scenario failed outright."""


def wall_ms() -> float:
    return time.time_ns() / 1e6


def iso_ms(text: str | None) -> int | None:
    if text is None:
        return None
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (dt - EPOCH) // timedelta(milliseconds=1)


def iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pct(values, p: float):
    """Nearest-rank percentile (p99 of fewer than 100 values is the maximum)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summary(values, digits: int = 1) -> dict:
    if not values:
        return {"n": 0}
    r = lambda v: round(v, digits)  # noqa: E731
    return {"n": len(values), "min": r(min(values)), "p50": r(pct(values, 50)), "p99": r(pct(values, 99)),
            "max": r(max(values)), "mean": r(sum(values) / len(values))}


def lag_stats(lags: list[float]) -> dict:
    """p50 / p99 / max (and more) of fire lags in ms, plus quantiles for a CDF plot."""
    if not lags:
        return {"n": 0}
    s = sorted(lags)
    out = summary(s, 1)
    out["quantiles_ms"] = [round(s[min(len(s) - 1, int(q / 100 * len(s)))], 1) for q in range(0, 101)]
    return out


def lag_sample(lags: list[float], seed: int = 6) -> list[float]:
    if len(lags) <= LAG_SAMPLE_MAX:
        return [round(x, 1) for x in lags]
    return [round(x, 1) for x in random.Random(seed).sample(lags, LAG_SAMPLE_MAX)]


def fired_ahead(raw: list[float]) -> dict:
    """Slots committed before their slot (fire ahead): how many, their share, and by how much
    (lead = slot - commit, ms). ``raw`` holds commit - slot per slot."""
    leads = [-x for x in raw if x < 0]
    return {"n": len(leads), "share_pct": round(100 * len(leads) / len(raw), 1) if raw else None,
            "lead_ms": summary(leads, 1)}


#: Where the nodes' code comes from: the working tree (default) or an exported commit (--git-ref).
CODE_DIR = REPO


def venv_python() -> str:
    """The interpreter for the baselines: the repository's venv, else the one running this."""
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def fire_log_how() -> str | None:
    """How the nodes' code (CODE_DIR) is told where to write its fire-commit log: "flag" (the
    hidden --fire-log of ``raftsched node``), "env" (RAFTSCHED_FIRE_LOG, in code from before
    that flag), or None (no fire log)."""
    try:
        if '"--fire-log"' in (CODE_DIR / "raftsched" / "cli.py").read_text(errors="replace"):
            return "flag"
    except OSError:
        pass
    for p in (CODE_DIR / "raftsched").rglob("*.py"):
        try:
            if "RAFTSCHED_FIRE_LOG" in p.read_text(errors="replace"):
                return "env"
        except OSError:
            continue
    return None


def fire_log_supported() -> bool:
    """Whether the nodes' code (CODE_DIR) can write the fire-commit log at all."""
    return fire_log_how() is not None


def code_has(text: str) -> bool:
    """Whether the nodes' code (CODE_DIR/raftsched) contains ``text`` (e.g. the bulk route)."""
    for p in (CODE_DIR / "raftsched").rglob("*.py"):
        try:
            if text in p.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def code_limit(name: str) -> int | None:
    """An integer constant of raftsched/core/limits.py in the nodes' code (CODE_DIR), read from the
    source so that --git-ref works: ``name = 123`` or ``name = 16 * 2**20``; None if absent."""
    import re
    try:
        m = re.search(rf"^{name}\s*=\s*([0-9_ *]+)$", (CODE_DIR / "raftsched" / "core" / "limits.py").read_text(), re.M)
    except OSError:
        return None
    if not m:
        return None
    try:
        v = 1
        for factor in m.group(1).replace("_", "").split(" * "):
            b, _, e = factor.strip().partition("**")
            v *= int(b) ** int(e) if e else int(b)
        return v
    except ValueError:
        return None


def code_number(name: str, rel: str = "raftsched/node/limits.py") -> float | None:
    """A plain numeric constant (``name = 1.5``, ``name = 10_000``) of a module in the nodes' code
    (CODE_DIR), read from the source as code_limit does; None if absent."""
    import re
    try:
        m = re.search(rf"^{name}\s*=\s*([0-9_.]+)\s*$", (CODE_DIR / rel).read_text(), re.M)
    except OSError:
        return None
    try:
        return float(m.group(1).replace("_", "")) if m else None
    except ValueError:
        return None


def storm_lead_ms(m: int) -> int:
    """How long before its slot the nodes' code may start committing a storm of ``m`` slots of
    one second: fire_ahead_ms, or, with a storm look-ahead (node/limits.py storm_*), what it takes
    at the rate it assumes before measuring one, with its margin, capped at storm_ahead_ms_max,
    plus its slack (storm_commit_slack_ms, where the code has one) and the second the storm's
    slots may spread over (docs/design.md, "Firing ahead")."""
    base = fire_ahead_ms()
    mx, rate, margin, smin = (code_number(k) for k in ("storm_ahead_ms_max", "storm_commit_rate_default",
                                                         "storm_commit_margin", "storm_second_min"))
    if not (mx and rate and margin and smin) or m < smin:
        return base
    slack = code_number("storm_commit_slack_ms")
    if slack is not None:
        margin = 1.0  # code with a slack starts a storm by its default rate without the margin
    return int(min(mx, base + (slack or 0) + m * margin * 1000 / rate)) + 1000


def fire_ahead_ms() -> int:
    """How far ahead of a job's next slot the nodes' code may commit it (``limits.fire_ahead_ms``
    in CODE_DIR; 0 for code that fires at the slot). Later slots of the same entry may be
    committed up to ``fire_ahead_span_ms`` more ahead; the storm's one-shot jobs have none."""
    return code_limit("fire_ahead_ms") or 0


def file_tail(p: Path, n: int = 15) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def add_code_args(ap) -> None:
    """A probe's ``--git-ref``, ``--code-dir`` and ``--keep`` (choose_code reads the first two)."""
    ap.add_argument("--git-ref", help="run the nodes from this commit (git archive) instead of the working tree")
    ap.add_argument("--code-dir", help="run the nodes from this directory (a copy of the tree) instead")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and node logs")


def choose_code(code_dir: str | None, git_ref: str | None, tmp: Path) -> str:
    """Point CODE_DIR at the code the nodes run, from a probe's ``--code-dir`` or ``--git-ref``
    (exported into ``tmp``/code), else the working tree; what it is, in words."""
    global CODE_DIR
    if code_dir:
        CODE_DIR = Path(code_dir).resolve()
        return f"directory {CODE_DIR}"
    if git_ref:
        sha = export_commit(git_ref, tmp / "code")
        CODE_DIR = tmp / "code"
        return f"commit {sha[:12]} ({git_ref})"
    return "working tree"


def export_commit(ref: str, dest: Path) -> str:
    """Export commit ``ref`` of this repository into ``dest`` (created; git archive), so that nodes
    can run a fixed commit while the working tree changes. Returns the commit's full hash.

    :raises subprocess.CalledProcessError: when ``ref`` names no commit.
    """
    sha = subprocess.run(["git", "rev-parse", "--verify", ref + "^{commit}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.strip()
    dest.mkdir()
    arch = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return sha
