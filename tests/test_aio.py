"""raftsched/node/aio.py."""
from __future__ import annotations

import asyncio

from raftsched.node.aio import wait_event


def run(coro):
    return asyncio.run(coro)


def test_wait_event_answers_whether_the_event_was_set():
    async def main():
        ev = asyncio.Event()
        assert await wait_event(ev, 0.01) is False
        asyncio.get_running_loop().call_soon(ev.set)
        assert await wait_event(ev, 5) is True
    run(main())


def test_a_cancellation_in_the_turn_the_event_is_set_is_not_lost():
    """The race of CPython #86296: the event is set and the waiting task cancelled in one turn of
    the loop. asyncio.wait_for (3.11) returns the event's result and the task, a loop like the
    worker's, goes on waiting; wait_event lets the cancellation through."""
    async def main():
        ev = asyncio.Event()
        turns = 0

        async def loop_like_the_worker():
            nonlocal turns
            while True:
                ev.clear()
                await wait_event(ev, 10)
                turns += 1

        for _ in range(20):
            task = asyncio.create_task(loop_like_the_worker())
            await asyncio.sleep(0)  # ok-sleep: one turn of the loop, after which it waits on the event
            ev.set()
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert task in done and task.cancelled(), "the cancellation was swallowed"
        assert turns == 0
    run(main())
