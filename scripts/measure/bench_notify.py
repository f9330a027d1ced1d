"""What notifications cost: the sweep's apply with every job routed, and delivery's events a second.

Usage: .venv/bin/python scripts/measure bench-notify [--jobs 20000] [--events 2000]

In-process (docs/notifications.md). The sweep: ``--jobs`` jobs every 10 s, misfire ``skip``, fired
after an outage so that each records its missed slots (one range a job), applied as the trigger
proposes it (fire commands of 200 entries); once with no sink (events are not
kept: the cost is one check), once with every job routed to a sink on ``slot.missed`` (one event a
job). Milliseconds for the whole sweep, medians of 3. Delivery: ``--events`` events for one
webhook sink, delivered by the leader's Notifier over an in-process replica to a receiver on
loopback (aiohttp, one connection kept alive), signed, each committed in batches: events a second.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from measure import ROOT, Smoke

ARGPARSE = True
SMOKE = [Smoke(("--jobs", "200", "--events", "50"), "events a second")]

T0 = 1_800_000_000_000


def sweep_ms(n: int, routed: bool) -> float:
    from raftsched.core import commands, limits, model, policy, schedule
    from raftsched.core.state import SchedulerState

    raw = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "skip", "grace_s": 1}}
    if routed:
        raw["notify"] = [{"sink": "ops", "on": ["slot.missed"]}]
    spec = model.validate_job("j", raw, T0)
    out = []
    for _ in range(3):
        s = SchedulerState()
        if routed:
            sink = {"type": "webhook", "url": "http://127.0.0.1:9/", "secrets": {"signing_key": "k"},
                    "retry": {"max_attempts": 1, "backoff_s": 0, "backoff_max_s": 0}}
            s.apply(commands.put_sink(T0, None, name="ops", spec=sink))
        anchor, cursor = policy.initial_position(spec["schedule"], T0)
        for i in range(n):
            s.apply(commands.put_job(T0, None, name=f"j{i}", spec=spec, cursor=cursor, anchor=anchor,
                                     next=schedule.next_slot_after(spec["schedule"], cursor, anchor), create_only=False))
        now = T0 + 95_000  # an outage: nine slots missed a job, recorded as one range
        entries = []
        for name, j in s.jobs.items():
            e = policy.plan_fire(j["spec"], j["anchor"], j["cursor"], now, j["gen"], name)
            if e is not None:
                entries.append(policy.compact_entry(e))
        cmds = [commands.encode(commands.fire(now, entries=entries[k:k + 200]))  # (within command_bytes_max)
                for k in range(0, len(entries), 200)]
        t0 = time.perf_counter()
        for data in cmds:
            res = s.apply_bytes(data)
            assert res["ok"], res
        out.append((time.perf_counter() - t0) * 1000)
        assert len(s.outbox.events) == (min(n, limits.outbox_events_max) if routed else 0), len(s.outbox.events)
    return round(statistics.median(out), 1)


async def delivery_per_s(n: int) -> float:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from raftsched import sealing
    from raftsched.clock import FakeClock
    from raftsched.core import commands, notify_model
    from raftsched.core.state import SchedulerState
    from raftsched.node.notify import Notifier
    from raftsched.testing.fakes import FakeRaft

    got = 0

    async def hook(request: web.Request) -> web.Response:
        nonlocal got
        await request.read()
        got += 1
        return web.Response(status=204)
    app = web.Application()
    app.router.add_post("/", hook)
    async with TestServer(app, host="127.0.0.1") as srv:
        s = SchedulerState()
        raft = FakeRaft(s)
        sink = notify_model.validate_sink("ops", {"type": "webhook", "url": f"http://127.0.0.1:{srv.port}/",
                                                  "secrets": {"signing_key": "k"}})
        await raft.propose(commands.encode(commands.put_sink(T0, None, name="ops", spec=sink)))
        route = notify_model.validate_routes([{"sink": "ops", "on": ["job.triggered"]}])
        await raft.propose(commands.encode(commands.put_tenant_notify(T0, None, name="default", notify=route)))
        from raftsched.core import events
        for i in range(n):
            events.emit(s, "job.triggered", T0 + i, job=f"j{i}", tenant="default")
        n_ = Notifier(raft, FakeClock(), sealing.KeyRing())
        t0 = time.perf_counter()
        task = asyncio.ensure_future(n_.run_while_leading())
        while s.sinks["ops"]["cursor"] < n:
            await asyncio.sleep(0.01)
        dt = time.perf_counter() - t0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert got >= n
    return round(n / dt)


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    ap = argparse.ArgumentParser(prog="scripts/measure bench-notify", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args(argv)
    plain, routed = sweep_ms(args.jobs, False), sweep_ms(args.jobs, True)
    print(f"sweep of {args.jobs} jobs recording their missed slots: {plain} ms with no sink, {routed} ms with every "
          f"job routed on slot.missed ({round((routed - plain) / args.jobs * 1000, 2)} us an event)")
    print(f"delivery to one webhook on loopback: {asyncio.run(delivery_per_s(args.events))} events a second")
    return 0
