"""Measure the cron choice behind core/schedule.py: how often croniter and raftsched (cronsim on
local wall times) disagree on random expressions, and what a next slot costs in each.

    .venv/bin/python scripts/measure cron-libraries [--n 3000] [--seed 1]

croniter is in the dev extra for this measurement only (pip install -e '.[dev]'; the runtime does
not use it); the figures in docs/design.md are of croniter 7.0.0.

Which of the two is right where they disagree is decided by tests/test_cron_differential.py, a
model written from the dialect's description (Vixie cron): raftsched passes it; croniter 7.0.0
reads a range with equal ends (``MON-MON``, ``10-10``) as ``*`` and applies the day-of-month /
day-of-week OR rule to fields such as ``*/2`` that Vixie cron treats as wildcards.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import datetime, timezone

from measure import ROOT, Smoke

ARGPARSE = True
SMOKE = [Smoke(("--n", "60", "--slots", "5"), "next slot: raftsched")]

MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
DAYS = "SUN MON TUE WED THU FRI SAT".split()


def expression(r: random.Random) -> str:
    def item(lo, hi, names=None):
        k = r.random()
        name = (lambda x: names[x - lo] if names and r.random() < 0.3 and x - lo < len(names) else str(x))
        if k < 0.25:
            return "*"
        if k < 0.35:
            return f"*/{r.randint(1, max(1, hi - lo))}"
        if k < 0.6:
            return name(r.randint(lo, hi))
        a, b = sorted((r.randint(lo, hi), r.randint(lo, hi)))
        if r.random() < 0.3:
            b = a
        s = f"{name(a)}-{name(b)}"
        return s + (f"/{r.randint(1, 5)}" if r.random() < 0.3 else "")

    def field(lo, hi, names=None):
        items = [item(lo, hi, names) for _ in range(r.choice([1, 1, 1, 2, 3]))]
        if len(items) > 1 and "*" in items:
            items = [i for i in items if i != "*"] or ["*"]
        return ",".join(items)

    return " ".join([field(0, 59), field(0, 23), field(1, 31), field(1, 12, MONTHS), field(0, 6, DAYS)])


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    from raftsched.core import schedule  # noqa: E402

    ap = argparse.ArgumentParser(prog="scripts/measure cron-libraries", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slots", type=int, default=20)
    a = ap.parse_args(argv)
    try:
        from croniter import croniter  # type: ignore
    except ImportError:
        print("croniter is not installed: .venv/bin/pip install -e '.[dev]' (or pip install croniter)", file=sys.stderr)
        return 1
    from importlib.metadata import version
    croniter_version = version("croniter")
    r = random.Random(a.seed)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    start_ms = int(start.timestamp() * 1000)
    differ = both = 0
    t_ours = t_theirs = 0.0
    calls = 0
    examples = []
    for _ in range(a.n):
        e = expression(r)
        try:
            schedule.check_cron(e)
        except Exception:
            continue
        sched = {"cron": e, "timezone": "UTC"}
        t0 = time.perf_counter()
        ours, cur = [], start_ms
        for _ in range(a.slots):
            cur = schedule.next_slot_after(sched, cur, 0)
            if cur is None:
                break
            ours.append(cur)
        t_ours += time.perf_counter() - t0
        try:
            it = croniter(e, start)
            t0 = time.perf_counter()
            theirs = [int(it.get_next(datetime).timestamp() * 1000) for _ in range(len(ours))]
            t_theirs += time.perf_counter() - t0
        except Exception:
            continue
        calls += len(ours)
        both += 1
        if ours != theirs:
            differ += 1
            if len(examples) < 5:
                examples.append((e, [schedule.iso(x) for x in ours[:2]], [schedule.iso(x) for x in theirs[:2]]))
    print(f"croniter {croniter_version}: {both} valid expressions, {differ} ({100 * differ / max(1, both):.0f} %) "
          f"give other slots than raftsched")
    for e, o, t in examples:
        print(f"  {e!r}: raftsched {o}, croniter {t}")
    print(f"next slot: raftsched {t_ours / max(1, calls) * 1e6:.1f} us, croniter {t_theirs / max(1, calls) * 1e6:.1f} us "
          f"(UTC, {calls} calls each; raftsched's includes its DST mapping)")
    return 0
