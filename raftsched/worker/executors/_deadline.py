"""Deadlines and cancellation, shared by all executor types."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from .. import limits
from ._context import Result

log = logging.getLogger("raftsched.executors")


def timed_out(timeout_s: float) -> str:
    # "5s" for 5 or 5.0, "0.5s" for 0.5: the number reads as the job's spec wrote it.
    t = float(timeout_s)
    return f"timed out after {int(t) if t.is_integer() else t}s"


class CancelEvent(asyncio.Event):
    """An :class:`asyncio.Event` that also calls back when set. The worker gives one to
    :func:`execute` as ``cancel``: waiting for it then costs a callback rather than a task per
    run. (Any asyncio.Event works as ``cancel``.)"""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def add_callback(self, cb: Callable[[], None]) -> None:
        self._callbacks.append(cb)

    def remove_callback(self, cb: Callable[[], None]) -> None:
        try:
            self._callbacks.remove(cb)
        except ValueError:
            pass

    def set(self) -> None:
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()


async def race(aw: asyncio.Future, timeout_s: float, cancel: asyncio.Event | None) -> str:
    """Wait for ``aw``, the deadline or the cancel event, whichever comes first.

    :returns: "done", "timeout" or "cancel". When ``aw`` is done it wins a tie: the run finished.
    """
    if not aw.done() and not (cancel is not None and cancel.is_set()):
        # One future woken by whichever comes first (a callback each), not asyncio.wait's
        # machinery and a task waiting on the event: this runs once per run.
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        aw.add_done_callback(wake)
        timer = loop.call_later(max(0.0, timeout_s), wake)
        cancel_task = None
        if isinstance(cancel, CancelEvent):
            cancel.add_callback(wake)
        elif cancel is not None:
            cancel_task = asyncio.ensure_future(cancel.wait())
            cancel_task.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            aw.remove_done_callback(wake)
            if isinstance(cancel, CancelEvent):
                cancel.remove_callback(wake)
            elif cancel_task is not None:
                cancel_task.cancel()
    if aw.done():
        return "done"
    if cancel is not None and cancel.is_set():
        return "cancel"
    return "timeout"


async def run_task(coro: Awaitable, timeout_s: float, cancel: asyncio.Event | None,
                    grace_s: float = limits.http_cancel_grace_s) -> tuple[str, Any]:
    """Run ``coro`` as a task under a deadline and a cancel event; cancel it when either fires.

    :param grace_s: how long the cancelled task gets to finish before it is abandoned.

    :returns: ("done", result), ("timeout", None) or ("cancel", None). The task's exception, if
        any, is raised from here (runners wrap user code so it does not raise).
    """
    task = asyncio.ensure_future(coro)
    try:
        how = await race(task, timeout_s, cancel)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if how == "done":
        if task.cancelled():
            # Not our cancellation (that would be "timeout"/"cancel") and not the caller's (that
            # raised above): must not look like the caller's own cancellation to our caller.
            raise RuntimeError("the run's task was cancelled from elsewhere")
        return how, task.result()
    task.cancel()
    # Give the coroutine a moment to run its finally blocks; one that swallows the cancellation
    # and keeps going is abandoned rather than allowed to hold the worker.
    await asyncio.wait({task}, timeout=grace_s)
    # Consume the result (now or whenever the task ends) so that a late exception is not logged
    # as "never retrieved": the run has already been reported.
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    if not task.done():
        log.warning("run task %r ignored cancellation; abandoned", task)
    return how, None


def stopped(how: str, timeout_s: float) -> Result:
    return (False, "lease lost" if how == "cancel" else timed_out(timeout_s), "")


#: what a stopped run's error adds when its thread goes on (``run_function(..., linger=True)``)
STILL_RUNNING = "the handler's thread could not be stopped and is still running"


def stopped_lingering(how: str, timeout_s: float) -> Result:
    """:func:`stopped` of a plain function whose thread could not be stopped: the error says
    that it still runs ("timed out after 5s; the handler's thread could not be stopped and is
    still running")."""
    ok, error, output = stopped(how, timeout_s)
    return ok, f"{error}; {STILL_RUNNING}", output


