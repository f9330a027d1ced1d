"""The run threads: daemon threads that plain python runs are called in, reused from run to run."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import queue
import threading
import weakref
from typing import Callable

from .. import limits
from ...aio import LoopInbox


class RunThreads:
    """Daemon threads for plain python runs, reused from run to run.

    A job always gets a thread at once: when no thread is idle, a new one is started, so a run
    that blocks, or one abandoned at its timeout, never delays another (as with a thread per
    run), but a busy worker does not pay for starting a thread per run. A thread idle for
    ``idle_s`` exits. ``_idle`` counts the threads waiting for a job minus the jobs queued for
    them, so it is never negative and a queued job always has a waiting thread.

    Not ``asyncio.to_thread``: a run that times out abandons its thread, and abandoned threads
    in the loop's default executor would, one by one, starve everything else that uses it
    (aiohttp's DNS resolution among them). Here a thread that is not idle is never waited for.
    Daemon, so an abandoned thread never holds up exit.
    """

    def __init__(self, idle_s: float) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._idle_s = idle_s
        self._seq = itertools.count(1)
        # One inbox per event loop that calls: results of the runs a loop started go back to it
        # with one wake-up for all that arrive before it drains them.
        self._inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox] = weakref.WeakKeyDictionary()

    def call(self, fn: Callable, args: tuple, name: str, deliver: Callable[[tuple], None]) -> None:
        """Run ``fn(*args)`` in one of the threads (named ``name`` while it runs this), in a
        copy of the caller's context; ``deliver`` gets ("ok", result) or ("exc", e) on the
        caller's event loop. Raises only when no thread could be started.
        """
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        inbox = self._inboxes.get(loop)
        if inbox is None:
            inbox = self._inboxes[loop] = LoopInbox(loop)

        def job() -> Callable[[], None]:
            threading.current_thread().name = name
            try:
                value: tuple = ("ok", context.run(fn, *args))
            except BaseException as e:  # the job's SystemExit too: it ends the run, not the worker
                value = ("exc", e)
            return functools.partial(inbox.post, deliver, value)

        self.submit(job)

    def submit(self, job: Callable[[], Callable[[], None]]) -> None:
        """Run ``job()`` in a thread now, then the callable it returns once the thread counts as
        idle again (the delivery of the result: the next run may then take the same thread).
        Neither may raise."""
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # that waiting thread is spoken for
        if spawn:
            # Started before the job is queued: if no thread can be started, this raises and
            # nothing is left queued without a thread to take it.
            threading.Thread(target=self._serve, name=f"raftsched-run-idle-{next(self._seq)}", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        me = threading.current_thread()
        idle_name = me.name
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:
                        self._idle -= 1
                        return
                continue  # every waiting thread is spoken for: a job is on its way to one of us
            deliver = job()
            job = None
            me.name = idle_name
            with self._lock:
                self._idle += 1
            deliver()
            deliver = None  # hold nothing of a finished run while idle


#: The process's run threads, shared by every worker and event loop in it. One pool per process
#: rather than one per worker: a thread abandoned at a timeout outlives the run, and can outlive
#: the worker that started it, so no worker could shut its own pool down anyway.
THREADS = RunThreads(limits.run_thread_idle_s)
