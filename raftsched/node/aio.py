"""asyncio helpers the node's loops share."""
from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """``event.wait()`` for at most ``timeout_s``: True if the event was set, False on timeout.

    Not ``asyncio.wait_for(event.wait(), timeout_s)``: on Python 3.11, when the task is cancelled
    in the same turn of the loop as the event is set, wait_for returns the event's result and the
    cancellation is lost (CPython issue #86296, bpo-42130; wait_for was rewritten on
    ``asyncio.timeout`` in 3.12). A worker stopped that way kept polling forever, and the task
    that stopped it waited for it forever (tests/test_worker.py, about 1 run in 30).
    ``asyncio.timeout`` tells its own timeout from a cancellation and lets the latter through.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False
