"""asyncio helpers that the node's loops and the replication layer share.

They sit at the package root, beside ``clock.py``, because both floors above the core use them:
``replication`` posts pysyncobj's results to the loop through a ``LoopInbox``, and ``node/``
waits on events with ``wait_event``. A module under ``node/`` would make replication import
upward."""
from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any, Callable

log = logging.getLogger(__name__)


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


class LoopInbox:
    """Calls from other threads to one event loop, with one wake-up of the loop (a write to its
    self-pipe, ``call_soon_threadsafe``) for all the calls that arrive before it drains them,
    rather than one each. First in, first called.

    The run threads deliver results through one (worker/executors/_threads.py), and pysyncobj's tick thread
    the results of proposals and role changes (the replication layer): a wake-up is a system call, and a
    leader committing ~30 000 slots a second spent 4.4 % of its samples (py-spy) in
    ``_write_to_self``, one a proposal's result.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # A weak reference: a loop that is gone must not be kept alive by an inbox that a
        # thread still holds.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[[Any], None], Any]] = []

    def post(self, fn: Callable[[Any], None], value: Any) -> None:
        """From any thread: call ``fn(value)`` on the loop. Never raises; dropped when the loop
        is closed or gone."""
        with self._lock:
            self._items.append((fn, value))
            if len(self._items) > 1:
                return  # a drain is already on its way
        loop = self._loop()
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._drain)
        except BaseException:  # noqa: BLE001 - closed between the check and the call, etc.
            with self._lock:
                self._items.clear()

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for fn, value in items:
            try:
                fn(value)
            except Exception:  # one call's failure must not lose the others
                log.exception("a call posted to the loop raised")
