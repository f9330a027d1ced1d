"""node/walks.py: the node's walks of its replica run off the loop, one at a time, and callers
that arrive while one runs share it (a dashboard polling GET /v1/queues every 2 s during a
storm's million queued runs must not queue a walk a poll)."""
from __future__ import annotations

import asyncio
import threading
import time

from raftsched.node.walks import SingleFlight, off_loop


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop


def test_callers_that_arrive_during_a_walk_share_it_and_a_later_one_starts_another():
    async def t():
        flight = SingleFlight()
        calls: list[str] = []
        gate = threading.Event()

        def walk() -> int:
            calls.append(threading.current_thread().name)
            assert gate.wait(5)
            return len(calls)
        first = asyncio.ensure_future(flight.run(walk))
        await _until(lambda: calls)
        second = asyncio.ensure_future(flight.run(walk))
        await asyncio.sleep(0)  # ok-sleep: no wait, one turn of the loop: the second caller runs up to its wait
        gate.set()
        # One walk: a walk of its own would have run after the first, in the one thread (2).
        assert await first == 1 and await second == 1 and len(calls) == 1
        assert calls[0].startswith("raftsched-walk")  # off the loop, in the walks' thread
        assert await flight.run(walk) == 2  # the walk ended: the next caller gets a new one
    asyncio.run(t())


def test_a_cancelled_caller_does_not_cancel_the_walk_the_others_wait_for():
    async def t():
        flight = SingleFlight()
        gate = threading.Event()
        first = asyncio.ensure_future(flight.run(lambda: gate.wait(5) and "done"))
        await asyncio.sleep(0)  # ok-sleep: no wait, one turn of the loop: the first walk starts
        second = asyncio.ensure_future(flight.run(lambda: "not run"))
        await asyncio.sleep(0)  # ok-sleep: no wait, one turn of the loop: the second caller joins it
        first.cancel()
        gate.set()
        assert await second == "done"
        assert await off_loop(lambda: threading.current_thread().name.startswith("raftsched-walk"))
    asyncio.run(t())
