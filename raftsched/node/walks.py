"""One thread for the node's walks of large parts of its replica: a metrics scrape's render
(the count of unplaceable runs walks every queued run when placements are in use), the
``GET /v1/queues`` count of them, and the leader's look for runs that waited too long for a
worker (node/notify.py).

Off the event loop, so the API and the worker protocol are served meanwhile; in a thread of
their own rather than the loop's default executor, so that however many scrapes and dashboard
polls arrive during a storm's million queued runs, at most one walk runs at a time (beside the
applies, for the GIL) and the default executor's threads stay free for the embedded worker's
sandbox and the notifier's mail. Callers that may arrive together share one walk
(:class:`SingleFlight`) rather than queueing one each behind it."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftsched-walk")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the walks' thread."""
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)


class SingleFlight:
    """One walk at a time for its callers: a call while one is running waits for that one and
    gets its result (a poll arriving mid-walk is answered with a count that began before it:
    a gauge's reading)."""

    def __init__(self) -> None:
        self._running: asyncio.Future | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        fut = self._running
        if fut is None or fut.done():
            fut = self._running = asyncio.ensure_future(off_loop(fn, *args))
        return await asyncio.shield(fut)
