"""The peers scenario's sink and how it is counted, the same way for every system (pure: no
processes, no clock).

A sink is one JSON line per fire: ``{"j": job, "s": slot_ms, "t": fired_ms, "w": who}``: the job's
name, the slot the scheduler fired it for (a point of the job's grid, ms since the epoch), the wall
time it fired and which scheduler process fired it. The peers' programs (scripts/baselines/
aps4_peer.py, redbeat_peer.py) append these lines themselves, one unbuffered write per fire, so a
``kill -9`` loses no line already written; raftsched's fires are turned into the same lines from the
jobs' run histories (slot_ms, fired_at) after the run.

Counting, per job and per window ``[lo, hi)`` of slot times: the expected slots are the points of
the job's grid in the window (its phase is any of its slots modulo the interval); a slot is *lost*
when no line names it, *fired twice* when two or more lines name it. Lag is ``t - s``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path


def read_sink(paths) -> list[dict]:
    """Every fire line of these files; a torn last line (a writer killed mid-write) is skipped."""
    out = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and {"j", "s", "t"} <= d.keys():
                out.append(d)
    return out


def phases(fires: list[dict], every_ms: int) -> dict[str, int]:
    """Each job's phase within its interval, from its fires."""
    out: dict[str, int] = {}
    for f in fires:
        out.setdefault(f["j"], int(f["s"]) % every_ms)
    return out


def _pct(sorted_vals: list[float], p: float) -> float | None:
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return round(sorted_vals[k], 1)


def count_window(fires: list[dict], jobs: list[str], every_ms: int, lo_ms: float, hi_ms: float,
                 phase: dict[str, int]) -> dict:
    """Slots lost and slots fired twice among the slots of ``jobs`` in ``[lo_ms, hi_ms)``, and the
    lag of the fires of those slots. A job with no known phase counts each of its slots as lost
    (``window / every`` of them, rounded down)."""
    seen: dict[tuple[str, int], int] = {}
    lags = []
    js = set(jobs)
    for f in fires:
        s = int(f["s"])
        if f["j"] in js and lo_ms <= s < hi_ms:
            seen[(f["j"], s)] = seen.get((f["j"], s), 0) + 1
            lags.append(float(f["t"]) - s)
    expected = lost = 0
    lost_examples = []
    for j in jobs:
        if j not in phase:
            n = int((hi_ms - lo_ms) // every_ms)
            expected += n
            lost += n
            continue
        first = math.ceil((lo_ms - phase[j]) / every_ms) * every_ms + phase[j]
        s = first
        while s < hi_ms:
            expected += 1
            if (j, s) not in seen:
                lost += 1
                if len(lost_examples) < 5:
                    lost_examples.append([j, s])
            s += every_ms
    dup = sum(1 for n in seen.values() if n > 1)
    extra = sum(n - 1 for n in seen.values() if n > 1)
    off_grid = sum(1 for (j, s) in seen if j in phase and (s - phase[j]) % every_ms)
    lags.sort()
    return {"expected": expected, "fired_slots": len(seen), "fires": sum(seen.values()), "lost": lost,
            "fired_twice": dup, "extra_fires": extra, "off_grid": off_grid, "lost_examples": lost_examples,
            "lag_ms": {"p50": _pct(lags, 50), "p99": _pct(lags, 99), "max": round(lags[-1], 1) if lags else None}}


def first_fire_after(fires: list[dict], t_ms: float, jobs: list[str] | None = None) -> dict:
    """After an event at ``t_ms`` (a kill, a restart): the first fire of any job, and the time by
    which every job (of ``jobs``) has fired again; None where it never happened."""
    firsts: dict[str, float] = {}
    for f in fires:
        t = float(f["t"])
        if t > t_ms and (jobs is None or f["j"] in jobs):
            if f["j"] not in firsts or t < firsts[f["j"]]:
                firsts[f["j"]] = t
    want = set(jobs) if jobs is not None else set(firsts)
    any_ms = round(min(firsts.values()) - t_ms, 1) if firsts else None
    all_ms = round(max(firsts.values()) - t_ms, 1) if firsts and want <= firsts.keys() else None
    return {"next_fire_ms": any_ms, "all_jobs_fired_ms": all_ms, "jobs_fired": len(firsts), "jobs": len(want)}


def throughput(fires: list[dict], jobs: list[str], every_ms: int, lo_ms: float, hi_ms: float) -> dict:
    """Fires per second sustained over ``[lo_ms, hi_ms)`` of slot time, with the window's counts."""
    c = count_window(fires, jobs, every_ms, lo_ms, hi_ms, phases(fires, every_ms))
    secs = (hi_ms - lo_ms) / 1000
    c["fires_per_s"] = round(c["fired_slots"] / secs, 1) if secs > 0 else None
    c["window_s"] = secs
    return c
