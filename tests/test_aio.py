"""raftsched/aio.py."""
from __future__ import annotations

import asyncio
import threading
from unittest import mock

from raftsched.aio import LoopInbox, wait_event


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


def test_loop_inbox_wakes_the_loop_once_for_the_calls_before_a_drain_in_their_order():
    async def main():
        loop = asyncio.get_running_loop()
        inbox = LoopInbox(loop)
        got: list = []
        done = asyncio.Event()

        def from_a_thread():
            for i in range(200):
                inbox.post(got.append, i)
            inbox.post(lambda _: done.set(), None)

        with mock.patch.object(loop, "call_soon_threadsafe", wraps=loop.call_soon_threadsafe) as wake:
            t = threading.Thread(target=from_a_thread)
            t.start()  # the loop does not run while the thread posts: one drain for all of them
            t.join()
            assert wake.call_count == 1
            assert await wait_event(done, 5)
        assert got == list(range(200))
        inbox.post(got.append, "next")  # a new wake-up after a drain
        await asyncio.sleep(0)  # ok-sleep: one turn of the loop runs the drain
        assert got[-1] == "next"
    run(main())


def test_loop_inbox_delivers_the_other_calls_when_one_raises():
    async def main():
        loop = asyncio.get_running_loop()
        inbox = LoopInbox(loop)
        got: list = []

        def boom(_):
            raise ValueError("one call fails")

        inbox.post(got.append, 1)
        inbox.post(boom, None)
        inbox.post(got.append, 2)
        await asyncio.sleep(0)  # ok-sleep: one turn of the loop runs the drain
        assert got == [1, 2]
    run(main())


def test_loop_inbox_post_to_a_closed_loop_does_not_raise_and_holds_nothing():
    loop = asyncio.new_event_loop()
    inbox = LoopInbox(loop)
    loop.close()
    inbox.post(print, "never")
    inbox.post(print, "never")
    assert inbox._items == []
