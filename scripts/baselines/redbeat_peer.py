#!/usr/bin/env python3
"""Celery beat with RedBeat on Redis, one of the HA peers of the benchmark's peers scenario (issue 27).

Usage (scripts/benchlib/scenarios/peers.py runs it with the peers' venv, never scripts/test.sh):

    python redbeat_peer.py setup --redis redis://127.0.0.1:PORT/0 --jobs N --base-ms B
    python redbeat_peer.py run   --redis ... --sink FILE --name beat-1 [--tuned]

``setup`` saves N RedBeat entries: ``j{k}`` sends task ``sink.fire`` every 1 s (celery's
``schedule(run_every=1 s)``), its first due time ``B + frac(k * phi) * 1000`` ms (the same stagger as
the raftsched sweep; set through the entry's last_run_at, one interval earlier). ``run`` is one
``celery beat`` process with RedBeat's scheduler; three of them compete for RedBeat's lock, and only
the holder sends.

* defaults: RedBeat's and Celery's: beat_max_loop_interval 300 s, so the lock timeout is 5 x 300 s
  = 25 min and a process waiting for the lock retries every 300 s.
* ``--tuned``: as RedBeat's docs advise for a fast fail-over: redbeat_lock_timeout 5 s and
  beat_max_loop_interval 1 s.

The task is never executed (no Celery worker runs): the beat's ``apply_async``, after RedBeat has
advanced and saved the entry's last_run_at (as it does before sending), appends ``{"j": name, "s":
slot ms, "t": now ms, "w": name}`` to --sink with one unbuffered O_APPEND write instead of
publishing a message. So a fire is counted when the beat *sends* it. The slot is the due time the
entry fired for (its previous last_run_at + 1 s), rounded to the nearest point of the job's grid,
since an interval schedule's last_run_at is the time of the last send and drifts by its lag.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.schedules import schedule
from redbeat import RedBeatScheduler, RedBeatSchedulerEntry

PHI = (math.sqrt(5) - 1) / 2
UTC = timezone.utc
_SINK_FD = -1
_NAME = ""


def _app(redis_url: str, tuned: bool) -> Celery:
    app = Celery("peers", broker=redis_url)
    app.conf.redbeat_redis_url = redis_url
    app.conf.timezone = "UTC"
    app.conf.broker_connection_retry_on_startup = True
    if tuned:
        app.conf.redbeat_lock_timeout = 5
        app.conf.beat_max_loop_interval = 1
    return app


class SinkScheduler(RedBeatScheduler):
    """RedBeat's scheduler whose send writes the fire to the sink."""

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        last = entry.last_run_at
        phase = int((entry.kwargs or {}).get("phase_ms", 0))
        if advance:
            entry = self.reserve(entry)  # RedBeat saves the new last_run_at in Redis here
        now = time.time() * 1000
        due = (last.timestamp() * 1000 + 1000) if last is not None else now
        slot = phase + round((due - phase) / 1000) * 1000
        os.write(_SINK_FD, (json.dumps({"j": entry.name, "s": int(slot), "t": round(now, 1), "w": _NAME}) + "\n").encode())
        return None


def setup(args) -> None:
    app = _app(args.redis, False)
    for k in range(args.jobs):
        phase = int((k * PHI) % 1 * 1000)
        e = RedBeatSchedulerEntry(f"j{k}", "sink.fire", schedule(run_every=timedelta(seconds=1)), kwargs={"phase_ms": phase}, app=app)
        e.last_run_at = datetime.fromtimestamp((args.base_ms + phase - 1000) / 1000, UTC)
        e.save()
    print(json.dumps({"entries": args.jobs}))


def run(args) -> None:
    global _SINK_FD, _NAME
    _NAME = args.name
    _SINK_FD = os.open(args.sink, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    app = _app(args.redis, args.tuned)
    beat = app.Beat(scheduler=SinkScheduler, loglevel="WARNING", quiet=True,
                    max_interval=1 if args.tuned else None, schedule=os.devnull)
    beat.run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["setup", "run"])
    ap.add_argument("--redis", required=True)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--base-ms", type=int, default=0)
    ap.add_argument("--sink")
    ap.add_argument("--name", default="beat")
    ap.add_argument("--tuned", action="store_true")
    args = ap.parse_args()
    if args.mode == "run" and not args.sink:
        ap.error("run needs --sink")
    (setup if args.mode == "setup" else run)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
