#!/usr/bin/env python3
"""APScheduler 4 on PostgreSQL, one of the HA peers of the benchmark's peers scenario (issue 27).

Usage (scripts/benchlib/scenarios/peers.py runs it with the peers' venv, never scripts/test.sh):

    python aps4_peer.py setup --dsn postgresql://bench@127.0.0.1:PORT/bench --jobs N --base-ms B [--tuned]
    python aps4_peer.py run   --dsn ... --sink FILE --name aps-1 [--tuned]

``setup`` creates N schedules in the shared data store (SQLAlchemyDataStore on asyncpg): schedule
``j{k}`` runs task ``fire`` every 1 s from ``B + frac(k * phi) * 1000`` ms (the same stagger over the
second as the raftsched sweep), misfire_grace_time None (a late fire still runs). ``run`` is one
scheduler process (role both: it claims schedules, creates their jobs, and runs jobs); three of them
on one database are the HA set. Both use AsyncpgEventBroker on the same database, the event broker
APScheduler 4's docs require for schedulers that share a data store.

* defaults: what APScheduler 4 does out of the box: an identity made of host, PID and object id
  (so a restarted process is a new scheduler and cannot reap its own abandoned jobs), lease_duration
  30 s, coalesce ``latest``.
* ``--tuned``: as its docs advise for several schedulers: a stable identity per process (``--name``),
  lease_duration 5 s, coalesce ``all`` (every missed fire time becomes a job).

In both, the task ``fire`` is configured with max_running_jobs None: the default of 1 would run at
most one of the N schedules' jobs at a time across the whole set.

A fire is counted when the job function starts: it appends ``{"j": schedule, "s": scheduled fire
time in ms, "t": now in ms, "w": name}`` to --sink with one unbuffered O_APPEND write, so a kill -9
loses no fire already counted. The sink's format and counting: scripts/benchlib/sink.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from datetime import datetime, timezone

import anyio
from apscheduler import AsyncScheduler, CoalescePolicy, ConflictPolicy, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.ext.asyncio import create_async_engine

PHI = (math.sqrt(5) - 1) / 2
UTC = timezone.utc
_SINK_FD = -1
_NAME = ""


async def fire(job: str) -> None:
    info = current_job.get()
    slot = info.scheduled_fire_time
    line = json.dumps({"j": job, "s": round(slot.timestamp() * 1000) if slot else None, "t": round(time.time() * 1000, 1),
                       "w": _NAME}) + "\n"
    os.write(_SINK_FD, line.encode())


def _engine(dsn: str):
    return create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))


def _scheduler(engine, tuned: bool, name: str) -> AsyncScheduler:
    store = SQLAlchemyDataStore(engine)
    broker = AsyncpgEventBroker.from_async_sqla_engine(engine)
    kw: dict = {"lease_duration": 5, "identity": name} if tuned else {}
    return AsyncScheduler(store, broker, max_concurrent_jobs=1000, **kw)


async def setup(args) -> None:
    engine = _engine(args.dsn)
    async with _scheduler(engine, args.tuned, "setup") as sch:
        await sch.configure_task("fire", func=fire, max_running_jobs=None, misfire_grace_time=None)
        coalesce = CoalescePolicy.all if args.tuned else CoalescePolicy.latest
        for k in range(args.jobs):
            start = datetime.fromtimestamp((args.base_ms + int((k * PHI) % 1 * 1000)) / 1000, UTC)
            await sch.add_schedule("fire", IntervalTrigger(seconds=1, start_time=start), id=f"j{k}", kwargs={"job": f"j{k}"},
                                   coalesce=coalesce, misfire_grace_time=None, conflict_policy=ConflictPolicy.replace)
    await engine.dispose()
    print(json.dumps({"schedules": args.jobs}))


async def run(args) -> None:
    global _SINK_FD, _NAME
    _NAME = args.name
    _SINK_FD = os.open(args.sink, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    engine = _engine(args.dsn)
    async with _scheduler(engine, args.tuned, args.name) as sch:
        await sch.configure_task("fire", func=fire, max_running_jobs=None, misfire_grace_time=None)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:
                async def stop_on_signal():
                    async for _ in signals:
                        await sch.stop()
                        tg.cancel_scope.cancel()
                        return
                tg.start_soon(stop_on_signal)
                await sch.run_until_stopped()
                tg.cancel_scope.cancel()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["setup", "run"])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--base-ms", type=int, default=0)
    ap.add_argument("--sink")
    ap.add_argument("--name", default="aps")
    ap.add_argument("--tuned", action="store_true")
    args = ap.parse_args()
    if args.mode == "run" and not args.sink:
        ap.error("run needs --sink")
    anyio.run(setup if args.mode == "setup" else run, args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
