"""The python executor: ``module:function`` called with the RunContext, in a run thread or on the loop.

``{"type": "python", "target": "module:function"}``; the package docstring gives the contract.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import itertools
import logging
import queue
import reprlib
import sys
import threading
import time
import types
import weakref
from typing import Any, Awaitable, Callable

from ..aio import LoopInbox
from ._context import ALL_TYPES, Outcome, RunContext, Result
from ._deadline import CancelEvent, race, run_task, stopped
from ._output import OUTPUT_BYTES_MAX, exc_reason, format_tb, short, tail_str

log = logging.getLogger("raftsched.executors")

_repr = reprlib.Repr()
# Generous but bounded: a huge return value must not cost a huge repr.
_repr.maxlevel = 6
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 100
_repr.maxarray = 100
_repr.maxstring = _repr.maxlong = _repr.maxother = OUTPUT_BYTES_MAX


_inboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox]" = weakref.WeakKeyDictionary()


class _RunThreads:
    """Daemon threads for plain python runs, reused from run to run.

    A job always gets a thread at once: when no thread is idle, a new one is started, so a run
    that blocks, or one abandoned at its timeout, never delays another (as with a thread per
    run), but a busy worker does not pay for starting a thread per run. A thread idle for
    ``idle_s`` exits. ``_idle`` counts the threads waiting for a job minus the jobs queued for
    them, so it is never negative and a queued job always has a waiting thread.
    """

    def __init__(self, idle_s: float) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._idle_s = idle_s
        self._seq = itertools.count(1)

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


#: seconds an idle run thread waits for another run before it exits.
_THREAD_IDLE_S = 30.0
_threads = _RunThreads(_THREAD_IDLE_S)


def _submit(fn: Callable, args: tuple, name: str, deliver: Callable[[tuple], None]) -> None:
    """Run ``fn(*args)`` in a daemon thread (:class:`_RunThreads`, named ``name`` while it runs
    this), in a copy of the caller's context; ``deliver`` gets ("ok", result) or ("exc", e) on
    the caller's event loop.

    Not ``asyncio.to_thread``: a run that times out abandons its thread, and abandoned threads
    in the loop's default executor would, one by one, starve everything else that uses it
    (aiohttp's DNS resolution among them). Here a thread that is not idle is never waited for.
    Daemon, so an abandoned thread never holds up exit.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    inbox = _inboxes.get(loop)
    if inbox is None:
        inbox = _inboxes[loop] = LoopInbox(loop)

    def job() -> Callable[[], None]:
        threading.current_thread().name = name
        try:
            value: tuple = ("ok", context.run(fn, *args))
        except BaseException as e:  # the job's SystemExit too: it ends the run, not the worker
            value = ("exc", e)
        return functools.partial(inbox.post, deliver, value)

    _threads.submit(job)


def _in_thread(fn: Callable, *args: Any, name: str) -> asyncio.Future:
    """:func:`_submit` with a future: it gets ("ok", result) or ("exc", e)."""
    fut = asyncio.get_running_loop().create_future()

    def settle(value: tuple) -> None:
        if not fut.done():
            fut.set_result(value)

    _submit(fn, args, name, settle)
    return fut


def _imported(target: str) -> Callable | None:
    """The target's function if its module is imported already, fully, and defines it: then
    resolving it is a dictionary lookup that runs none of the job's code, and needs no thread.
    None otherwise (:func:`_resolve` in a thread imports it, and reports what is wrong)."""
    module_name, _, attr = target.partition(":")
    module = sys.modules.get(module_name)
    if type(module) is not types.ModuleType or not attr:
        return None
    namespace = module.__dict__
    spec = namespace.get("__spec__")
    if spec is not None and getattr(spec, "_initializing", False):
        return None  # still importing (in another thread): _resolve waits for it
    fn = namespace.get(attr)
    return fn if fn is not None and callable(fn) else None


def _resolve(target: str) -> Callable:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target {target!r} is not 'module:function'")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn


async def _guarded(aw: Awaitable) -> tuple:
    """Await the job's awaitable; its exceptions become ("exc", e).

    SystemExit or KeyboardInterrupt escaping a task would stop the worker's event loop, so they
    are caught here, before the task machinery sees them. Cancellation passes through.
    """
    try:
        return ("ok", await aw)
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # we are being cancelled (timeout, lease lost, worker stopping)
        return ("exc", e)  # the job cancelled something of its own and let it escape
    except BaseException as e:
        return ("exc", e)


async def _call_async(fn: Callable, ctx: RunContext) -> tuple:
    try:
        aw = fn(ctx)
    except BaseException as e:
        return ("exc", e)
    return await _guarded(aw)


def _python_result(value: tuple) -> Result:
    kind, obj = value
    if kind == "exc":
        return False, short(exc_reason(obj)), tail_str(format_tb(obj))
    try:
        text = _repr.repr(obj)
    except Exception as e:  # a broken __repr__ must not fail a run that succeeded
        text = f"<unrepresentable {type(obj).__name__}: {exc_reason(e)}>"
    return True, None, tail_str(text)


async def run_python(ex: dict, ctx: RunContext, timeout_s: float,
                      cancel: asyncio.Event | None, kill_grace_s: float) -> Result:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    thread_name = f"raftsched-run-{ctx.run_id}"
    fn = _imported(ex["target"])
    if fn is None:
        # Import in a thread: module-level code is the job's, and it must neither block the
        # loop (lease renewals) nor escape the deadline.
        fut = _in_thread(_resolve, ex["target"], name=thread_name + "-import")
        how = await race(fut, timeout_s, cancel)
        if how != "done":
            log.warning("run %s: import of %s abandoned (%s)", ctx.run_id, ex["target"], how)
            return stopped(how, timeout_s)
        kind, fn = fut.result()
        if kind == "exc":
            return _python_result((kind, fn))

    if inspect.iscoroutinefunction(fn):
        how, value = await run_task(_call_async(fn, ctx), deadline - loop.time(), cancel, kill_grace_s)
        return _python_result(value) if how == "done" else stopped(how, timeout_s)

    fut = _in_thread(fn, ctx, name=thread_name)
    how = await race(fut, deadline - loop.time(), cancel)
    if how != "done":
        log.warning("run %s: %s still running in thread %s; abandoned (%s)",
                    ctx.run_id, ex["target"], thread_name, how)
        return stopped(how, timeout_s)
    value = fut.result()
    if value[0] == "ok" and inspect.isawaitable(value[1]):
        # A plain callable that returns an awaitable (a decorated or partial coroutine
        # function, an object with an async __call__): await it on the loop.
        how, value = await run_task(_guarded(value[1]), deadline - loop.time(), cancel, kill_grace_s)
        if how != "done":
            return stopped(how, timeout_s)
    return _python_result(value)


# ---------------------------------------------------------------------------------------------
# The fast path: a plain python function already imported, without a coroutine per run.

def execute_soon(executor: dict, ctx: RunContext, timeout_s: float, on_done: Callable[[Outcome], None], *,
                 cancel: CancelEvent | None = None, allowed_types: frozenset[str] = ALL_TYPES,
                 kill_grace_s: float = 5.0) -> bool:
    """Start a run the way :func:`execute` would and return True, if it is a plain python
    function whose module is imported already; ``on_done(outcome)`` is then called on the
    event loop once, with the :class:`Outcome` that ``execute`` would have returned. A busy
    worker's runs are mostly such, and each then costs a thread handoff, a timer and a few
    callbacks instead of a task and its coroutines.

    For anything else (another executor type, a coroutine function, a module not imported
    yet, a ``cancel`` that is not a :class:`CancelEvent` or is already set) nothing starts and
    it returns False: await :func:`execute` instead.
    """
    if (not isinstance(executor, dict) or executor.get("type") != "python" or "python" not in allowed_types
            or not isinstance(executor.get("target"), str)
            or (cancel is not None and (not isinstance(cancel, CancelEvent) or cancel.is_set()))):
        return False
    fn = _imported(executor["target"])
    if fn is None or inspect.iscoroutinefunction(fn):
        return False
    _PythonRun(executor["target"], ctx, timeout_s, cancel, kill_grace_s, on_done).start(fn)
    return True


class _PythonRun:
    """One run of :func:`execute_soon`: the function in a thread, raced against a timer and the
    cancel event by callbacks; whichever comes first settles it, once."""

    __slots__ = ("target", "ctx", "timeout_s", "cancel", "kill_grace_s", "on_done", "t0", "deadline",
                 "timer", "settled", "thread_name")

    def __init__(self, target: str, ctx: RunContext, timeout_s: float, cancel: CancelEvent | None,
                 kill_grace_s: float, on_done: Callable[[Outcome], None]) -> None:
        self.target, self.ctx, self.timeout_s, self.cancel = target, ctx, timeout_s, cancel
        self.kill_grace_s, self.on_done = kill_grace_s, on_done
        self.settled = False
        self.thread_name = f"raftsched-run-{ctx.run_id}"

    def start(self, fn: Callable) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = time.monotonic()
        self.deadline = loop.time() + self.timeout_s
        self.timer = loop.call_later(max(0.0, self.timeout_s), self._stop, "timeout")
        if self.cancel is not None:
            self.cancel.add_callback(self._cancelled)
        try:
            _submit(fn, (self.ctx,), self.thread_name, self._returned)
        except Exception as e:  # no thread could be started: the run fails, reported on the loop
            self._settle()
            log.error("run %s: %s not started: %s", self.ctx.run_id, self.target, exc_reason(e))
            loop.call_soon(self._emit, (False, short(f"executor error: {exc_reason(e)}"), ""))

    def _cancelled(self) -> None:
        self._stop("cancel")

    def _stop(self, how: str) -> None:
        if self.settled:
            return
        log.warning("run %s: %s still running in thread %s; abandoned (%s)",
                    self.ctx.run_id, self.target, self.thread_name, how)
        self._settle()
        self._emit(stopped(how, self.timeout_s))

    def _returned(self, value: tuple) -> None:
        if self.settled:
            return  # already reported as timed out or lease lost
        self._settle()
        if value[0] == "ok" and inspect.isawaitable(value[1]):
            # A plain callable that returned an awaitable: await it on the loop, as execute()
            # does, within what is left of the deadline.
            asyncio.ensure_future(self._await(value[1]))
            return
        try:
            result = _python_result(value)
        except Exception as e:  # the contract is an Outcome, whatever went wrong in here
            result = (False, short(f"executor error: {exc_reason(e)}"), "")
        self._emit(result)

    async def _await(self, aw: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            how, value = await run_task(_guarded(aw), self.deadline - loop.time(), self.cancel, self.kill_grace_s)
            result = _python_result(value) if how == "done" else stopped(how, self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            result = (False, short(f"executor error: {exc_reason(e)}"), tail_str(format_tb(e)))
        self._emit(result)

    def _settle(self) -> None:
        self.settled = True
        self.timer.cancel()
        if self.cancel is not None:
            self.cancel.remove_callback(self._cancelled)

    def _emit(self, result: Result) -> None:
        ok, error, output = result
        self.on_done(Outcome(ok=ok, error=error, output=output,
                             duration_ms=int(round((time.monotonic() - self.t0) * 1000))))
