#!/usr/bin/env python3
"""APScheduler 3.x baseline for the raftsched benchmarks (issue #6).

Usage (scripts/bench.py runs it in its own process):

    .venv/bin/python scripts/baselines/aps_bench.py --mode interval --jobs N --seconds W [--warmup S] [--margin M] --out result.json
    .venv/bin/python scripts/baselines/aps_bench.py --mode storm --jobs N [--margin M] --out result.json

Setup, the same in both modes: one ``BackgroundScheduler`` (timezone UTC) with the default memory
job store and the default ``ThreadPoolExecutor`` (10 threads). The job function is a no-op. Job
defaults: ``coalesce=False`` and ``misfire_grace_time=None``. With APScheduler's default grace
time of 1 s, a fire that starts more than 1 s late is dropped and only an EVENT_JOB_MISSED event
records it. It does not run and it has no lag. With ``None``, a late fire still runs, so its lag is
measured. ``max_instances`` keeps its default of 1. When the pool is so far behind that a job's
previous fire has not finished by its next slot, APScheduler skips that fire and sends
EVENT_JOB_MAX_INSTANCES. We count those events. They are not lag figures.

Measurement: one listener on EVENT_JOB_EXECUTED. APScheduler calls it on the pool thread after
the job has run. It appends ``(time.time(), event.scheduled_run_time)`` to a list and does no
other work. The lag of a fire is that time minus ``scheduled_run_time``, in ms. A second listener
counts EVENT_JOB_MISSED, EVENT_JOB_ERROR and EVENT_JOB_MAX_INSTANCES, by scheduled run time.
Percentiles are nearest-rank on the sorted list.

Registration: the jobs are added one ``add_job`` call at a time to the running scheduler.
Registration time is the time those calls take. Nothing is due while they run. A short
calibration (at most 500 jobs, removed afterwards) estimates how long the real registration will
take. The first slot is then put at a whole second at least ``--margin`` (default 2 s) after the
estimated end of registration. If registration overruns that, the jobs are removed and the registration is retried
with a later slot, at most 3 times.

* interval: N jobs, each ``IntervalTrigger(seconds=1)``. Job k starts at ``base + k/N`` s, where
  ``base`` is that whole second, so the fires are spread evenly over each second. After
  ``--warmup`` seconds the script measures a window of W whole seconds, ``[base + warmup,
  base + warmup + W)``. That window holds exactly ``expected = N*W`` slots. ``fires`` counts the
  executed events whose scheduled_run_time falls in the window. After the window, the script
  polls for at most 10 s (never a fixed sleep) for late fires of slots in the window. It stops
  early once every slot in the window is accounted for (executed, missed, error or
  max_instances). ``fell_behind`` is true when fires < 95 % of expected, or when the lag p99 is
  over 1000 ms.
* storm: N jobs, each a ``DateTrigger`` at one whole-second slot at least ``--margin`` s after
  the last add. The script polls (no fixed sleep) until all N have executed or 60 s have passed since the
  slot. It reports the lag of each fire and the time from the slot to the last fire.

The result is written to --out as JSON and printed on stdout as one line. Exit status: 0 when the
benchmark ran, even if APScheduler fell behind. Non-zero on an error. The scheduler is always shut
down with ``wait=False`` before the script exits.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
import traceback
from datetime import datetime, timezone

import apscheduler
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
)
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

UTC = timezone.utc
MARGIN_S = 2.0  # first slot >= this long after the last add_job (--margin)
CALIBRATION_JOBS = 500
REGISTRATION_ATTEMPTS = 3
POLL_S = 0.02  # polling interval while waiting for a count (a poll, not a wait for the condition)
LATE_GRACE_S = 10.0  # interval mode: how long after the window to wait for its late fires
STORM_DEADLINE_S = 60.0
LAGS_SAMPLE_MAX = 5000
FELL_BEHIND_FRACTION = 0.95
FELL_BEHIND_P99_MS = 1000.0
FAR_FUTURE = datetime(2099, 1, 1, tzinfo=UTC)


def noop():
    pass


def pct(sorted_values, p: float):
    """Nearest-rank percentile of an already sorted list (p99 of fewer than 100 values is the max)."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def lag_summary(lags_sorted) -> dict:
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {"n": len(lags_sorted), "p50": r(pct(lags_sorted, 50)), "p99": r(pct(lags_sorted, 99)),
            "max": r(lags_sorted[-1] if lags_sorted else None)}


def even_sample(values, k: int):
    """At most k values, picked at evenly spaced indices (keeps the first and the last)."""
    n = len(values)
    if n <= k:
        return list(values)
    if k == 1:
        return [values[0]]
    return [values[round(i * (n - 1) / (k - 1))] for i in range(k)]


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Recorder:
    """The event listeners. They only append; the lists are read after the measurement."""

    def __init__(self) -> None:
        self.executed: list = []  # (time.time() after the job ran, scheduled_run_time)
        self.other: list = []  # (event code, [scheduled run times])

    def install(self, sched: BackgroundScheduler) -> None:
        executed_append = self.executed.append
        other_append = self.other.append
        now = time.time

        def on_executed(event):
            executed_append((now(), event.scheduled_run_time))

        def on_other(event):
            if event.code == EVENT_JOB_MAX_INSTANCES:  # JobSubmissionEvent: a list of run times
                other_append((event.code, event.scheduled_run_times))
            else:  # JobExecutionEvent: one run time
                other_append((event.code, [event.scheduled_run_time]))

        sched.add_listener(on_executed, EVENT_JOB_EXECUTED)
        sched.add_listener(on_other, EVENT_JOB_MISSED | EVENT_JOB_ERROR | EVENT_JOB_MAX_INSTANCES)

    def reset(self) -> None:
        self.executed.clear()
        self.other.clear()

    def count_other(self, code: int, lo: float = -math.inf, hi: float = math.inf) -> int:
        """Number of fires with this event code whose scheduled time is in [lo, hi)."""
        n = 0
        for c, run_times in list(self.other):
            if c == code:
                n += sum(1 for rt in run_times if lo <= rt.timestamp() < hi)
        return n


def make_scheduler() -> BackgroundScheduler:
    # Jobs that hit max_instances make APScheduler log one warning per skipped fire. Without a
    # handler, logging's last-resort handler writes each one to stderr, and that would slow the
    # scheduler down. The counts come from the events instead.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    return BackgroundScheduler(
        timezone=UTC,
        job_defaults={"misfire_grace_time": None, "coalesce": False},
    )  # default job store: memory; default executor: ThreadPoolExecutor(max_workers=10)


def calibrate(sched: BackgroundScheduler, n: int) -> float:
    """Seconds per add_job on this running scheduler, measured with up to 500 never-due jobs."""
    k = min(n, CALIBRATION_JOBS)
    t0 = time.perf_counter()
    for i in range(k):
        sched.add_job(noop, DateTrigger(run_date=FAR_FUTURE), id=f"cal{i}")
    dt = time.perf_counter() - t0
    sched.remove_all_jobs()
    return dt / k


def register(sched: BackgroundScheduler, rec: Recorder, n: int, mode: str, margin_s: float = MARGIN_S) -> dict:
    """Add the N jobs with their first slot >= ``margin_s`` after the last add. Returns the slot
    base (a whole second, epoch s) and the registration figures."""
    per_job = calibrate(sched, n)
    estimate = n * per_job * 1.5 + 0.5
    attempts = []
    for _attempt in range(1, REGISTRATION_ATTEMPTS + 1):
        rec.reset()
        base = float(math.ceil(time.time() + estimate + margin_s))
        t0 = time.perf_counter()
        if mode == "interval":
            for k in range(n):
                start = datetime.fromtimestamp(base + k / n, tz=UTC)
                sched.add_job(noop, IntervalTrigger(seconds=1, start_date=start, timezone=UTC), id=f"j{k}")
        else:
            slot = datetime.fromtimestamp(base, tz=UTC)
            for k in range(n):
                sched.add_job(noop, DateTrigger(run_date=slot, timezone=UTC), id=f"j{k}")
        elapsed = time.perf_counter() - t0
        end = time.time()
        attempts.append({"estimate_s": round(estimate, 3), "registration_s": round(elapsed, 3),
                         "margin_s": round(base - end, 3)})
        if end + margin_s <= base:
            return {"base": base, "registration_s": elapsed, "registration_jobs_per_s": n / elapsed,
                    "attempts": attempts}
        print(f"[aps_bench] registration took {elapsed:.2f} s, over the estimate of {estimate:.2f} s; "
              f"retrying with a later slot", file=sys.stderr)
        sched.remove_all_jobs()
        estimate = elapsed * 1.5 + 1.0
    raise RuntimeError(f"registration overran its slot {REGISTRATION_ATTEMPTS} times: {attempts}")


def sleep_until(t: float) -> None:
    """Sleep until wall-clock time t (used for the measurement window itself)."""
    while True:
        d = t - time.time()
        if d <= 0:
            return
        time.sleep(min(d, 0.5))


def run_interval(sched, rec: Recorder, n: int, window_s: float, warmup_s: float, margin_s: float = MARGIN_S) -> dict:
    reg = register(sched, rec, n, "interval", margin_s)
    ws = reg["base"] + warmup_s
    we = ws + window_s
    expected = int(round(n * window_s))
    sleep_until(ws)  # the warm-up
    cpu0 = time.process_time()
    sleep_until(we)  # the measurement window
    cpu_window = time.process_time() - cpu0

    # Late fires of slots in the window: poll until every slot is accounted for, or the deadline.
    # Counted incrementally (only the entries new since the last poll), so that polling takes
    # little CPU from the scheduler, which shares the cores.
    deadline = we + LATE_GRACE_S
    executed, other = rec.executed, rec.other
    seen_e = seen_o = accounted = 0
    while True:
        n_e, n_o = len(executed), len(other)
        for i in range(seen_e, n_e):
            if ws <= executed[i][1].timestamp() < we:
                accounted += 1
        for i in range(seen_o, n_o):
            accounted += sum(1 for rt in other[i][1] if ws <= rt.timestamp() < we)
        seen_e, seen_o = n_e, n_o
        if accounted >= expected or time.time() >= deadline:
            break
        time.sleep(POLL_S)
    waited_after_window = time.time() - we

    snapshot = list(executed)
    in_window = []  # (scheduled ts, lag ms)
    completed_in_window = 0
    for t_done, srt in snapshot:
        s = srt.timestamp()
        if ws <= s < we:
            in_window.append((s, (t_done - s) * 1000.0))
        if ws <= t_done < we:
            completed_in_window += 1
    in_window.sort()
    lags = sorted(l for _, l in in_window)
    summ = lag_summary(lags)
    fires = len(in_window)
    missed = rec.count_other(EVENT_JOB_MISSED, ws, we)
    errors = rec.count_other(EVENT_JOB_ERROR, ws, we)
    max_inst = rec.count_other(EVENT_JOB_MAX_INSTANCES, ws, we)
    fell_behind = fires < FELL_BEHIND_FRACTION * expected or summ["p99"] is None or summ["p99"] > FELL_BEHIND_P99_MS
    return {
        "window_s": window_s, "warmup_s": warmup_s,
        "window_start": datetime.fromtimestamp(ws, tz=UTC).isoformat(timespec="milliseconds"),
        "fires": fires, "fires_per_s": round(fires / window_s, 1), "expected": expected,
        "lag_ms": summ, "missed": missed, "errors": errors, "max_instances": max_inst,
        "fell_behind": fell_behind,
        "registration_jobs_per_s": round(reg["registration_jobs_per_s"], 1),
        "registration_s": round(reg["registration_s"], 3), "registration_attempts": reg["attempts"],
        # extra figures: fires of any slot that finished inside the window, per second; slots of
        # the window with no event at all by the end of the wait; how long the wait took
        "completions_per_s": round(completed_in_window / window_s, 1),
        "unaccounted": expected - fires - missed - errors - max_inst,
        "waited_after_window_s": round(waited_after_window, 3),
        # CPU time of this process (all threads) during the window, per second of window: about
        # 1.0 means the scheduler was bound by the GIL; well below 1.0 with a growing lag means
        # other processes kept it off the CPUs
        "cpu_cores_in_window": round(cpu_window / window_s, 2),
        "totals": {"executed": len(snapshot), "missed": rec.count_other(EVENT_JOB_MISSED),
                   "errors": rec.count_other(EVENT_JOB_ERROR),
                   "max_instances": rec.count_other(EVENT_JOB_MAX_INSTANCES)},
        "lags_sample": [round(l, 1) for _, l in even_sample(in_window, LAGS_SAMPLE_MAX)],
    }


def run_storm(sched, rec: Recorder, n: int, margin_s: float = MARGIN_S) -> dict:
    reg = register(sched, rec, n, "storm", margin_s)
    slot = reg["base"]
    deadline = slot + STORM_DEADLINE_S
    sleep_until(slot)
    executed = rec.executed
    while len(executed) < n and time.time() < deadline:
        time.sleep(POLL_S)
    snapshot = list(executed)
    timed_out = len(snapshot) < n
    done_times = [t for t, _ in snapshot]
    by_done = sorted(snapshot, key=lambda e: e[0])
    lag_pairs = [(t, (t - srt.timestamp()) * 1000.0) for t, srt in by_done]
    lags = sorted(l for _, l in lag_pairs)
    fires = len(snapshot)
    last = (max(done_times) - slot) * 1000.0 if done_times else None
    first = (min(done_times) - slot) * 1000.0 if done_times else None
    return {
        "window_s": None, "warmup_s": None,
        "slot": datetime.fromtimestamp(slot, tz=UTC).isoformat(timespec="milliseconds"),
        "fires": fires, "expected": n,
        # fires per second over the storm: fires / (slot -> last fire)
        "fires_per_s": round(fires / (last / 1000.0), 1) if last and last > 0 else None,
        "lag_ms": lag_summary(lags),
        "slot_to_first_fire_ms": None if first is None else round(first, 1),
        "slot_to_last_fire_ms": None if last is None else round(last, 1),
        "timed_out": timed_out,
        "missed": rec.count_other(EVENT_JOB_MISSED), "errors": rec.count_other(EVENT_JOB_ERROR),
        "max_instances": rec.count_other(EVENT_JOB_MAX_INSTANCES),
        "fell_behind": None,  # defined for interval mode only; see timed_out and the lag figures
        "registration_jobs_per_s": round(reg["registration_jobs_per_s"], 1),
        "registration_s": round(reg["registration_s"], 3), "registration_attempts": reg["attempts"],
        # ordered by completion time, so a plot shows the lag growing through the storm
        "lags_sample": [round(l, 1) for _, l in even_sample(lag_pairs, LAGS_SAMPLE_MAX)],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("interval", "storm"), required=True)
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=5.0, help="interval mode: measurement window (s)")
    ap.add_argument("--warmup", type=float, default=3.0, help="interval mode: warm-up before the window (s)")
    ap.add_argument("--margin", type=float, default=MARGIN_S,
                    help="first slot at least this long after the last add_job (s; default %(default)s)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    if args.mode == "interval" and (args.seconds <= 0 or args.warmup < 0):
        ap.error("--seconds must be > 0 and --warmup >= 0")
    if args.margin < 0.5:
        ap.error("--margin must be >= 0.5")

    load_before = loadavg()
    sched = make_scheduler()
    rec = Recorder()
    rec.install(sched)
    try:
        sched.start()
        if args.mode == "interval":
            body = run_interval(sched, rec, args.jobs, args.seconds, args.warmup, args.margin)
        else:
            body = run_storm(sched, rec, args.jobs, args.margin)
    finally:
        sched.shutdown(wait=False)

    result = {"baseline": "apscheduler", "version": apscheduler.__version__,
              "python": platform.python_version(), "mode": args.mode, "jobs": args.jobs}
    result.update(body)
    result["settings"] = {"jobstore": "memory", "executor": "ThreadPoolExecutor(max_workers=10)",
                          "misfire_grace_time": None, "coalesce": False, "max_instances": 1,
                          "margin_s": args.margin}
    result["loadavg_before_after"] = [load_before, loadavg()]
    line = json.dumps(result)
    with open(args.out, "w") as f:
        f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
