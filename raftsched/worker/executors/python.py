"""The python executor: ``module:function`` called with the RunContext, in a run thread or on the loop.

``{"type": "python", "target": "module:function"}``; the package docstring gives the contract.
:func:`run_function` is the same run for a function its caller holds already (the SDK's
``raftsched worker --app`` calls an App's handlers through it): one python run implementation.
"""
from __future__ import annotations

import asyncio
import builtins
import importlib
import inspect
import logging
import reprlib
import sys
import time
import types
from collections.abc import Mapping, Sequence
from typing import Awaitable, Callable

from .. import limits
from ..masking import mask, secret_values
from ._context import Outcome, RunContext, Result
from ._deadline import CancelEvent, stopped, stopped_lingering
from ._output import OUTPUT_BYTES_MAX, exc_reason, executor_error, format_tb, short, tail_str
from ._threads import THREADS

log = logging.getLogger("raftsched.executors")

class _Repr(reprlib.Repr):
    """The bounded repr of what a run returned. With ``masked`` (the run's secrets), each string
    in it, and the repr of each other object, is masked of them before it is cut (reprlib keeps
    the first and last characters of a long one, and would cut a secret in the middle)."""

    def __init__(self, masked: Sequence[str] = ()) -> None:
        super().__init__()
        self.masked = masked
        # Generous but bounded: a huge return value must not cost a huge repr.
        self.maxlevel = limits.python_repr_levels_max
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = \
            self.maxarray = limits.python_repr_items_max
        self.maxstring = self.maxlong = self.maxother = OUTPUT_BYTES_MAX

    def repr_str(self, x, level):
        return super().repr_str((mask(x, self.masked) or "") if self.masked else x, level)

    def repr_int(self, x, level):
        return self._masked(x, self.maxlong) if self.masked else super().repr_int(x, level)

    def repr_instance(self, x, level):
        return self._masked(x, self.maxother) if self.masked else super().repr_instance(x, level)

    def _masked(self, x, limit: int) -> str:
        try:
            s = mask(builtins.repr(x), self.masked) or ""
        except Exception:  # a broken __repr__
            return super().repr_instance(x, 0)
        if len(s) > limit:  # as reprlib cuts it
            i = max(0, (limit - 3) // 2)
            j = max(0, limit - 3 - i)
            s = s[:i] + self.fillvalue + s[len(s) - j:]
        return s


_repr = _Repr()


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


def run_masked(ctx) -> list[str]:
    """The values a python run's outcome is masked of (worker/masking.py): its context's
    ``secrets``; for an SDK Context, those of the run context it was made of (``result_sink``)."""
    secrets = getattr(ctx, "secrets", None)
    if not secrets:
        secrets = getattr(getattr(ctx, "result_sink", None), "secrets", None)
    return secret_values(None, dict(secrets) if isinstance(secrets, Mapping) else None)


def _python_result(value: tuple, masked: Sequence[str] = ()) -> Result:
    """The outcome of a call that returned or raised, masked of ``masked`` before it is cut."""
    kind, obj = value
    if kind == "exc":
        return False, short(exc_reason(obj), masked=masked), tail_str(format_tb(obj), masked=masked)
    try:
        text = (_Repr(masked) if masked else _repr).repr(obj)
    except Exception as e:  # a broken __repr__ must not fail a run that succeeded
        text = f"<unrepresentable {type(obj).__name__}: {exc_reason(e)}>"
    return True, None, tail_str(text, masked=masked)


def _consume(task: asyncio.Future) -> None:
    # A done callback that retrieves the result, so that a late exception is not logged as
    # "never retrieved": the run has already been reported.
    task.cancelled() or task.exception()


async def run_python(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                     kill_grace_s: float, t0: float) -> Outcome:
    """:func:`~raftsched.worker.executors.execute` for a python spec: one :class:`_PythonRun`,
    awaited. When the caller is cancelled the run is killed (:meth:`_PythonRun.kill`) and the
    cancellation propagates."""
    target = ex["target"]
    return await _awaited(_PythonRun(target, ctx, timeout_s, cancel, kill_grace_s, None, t0), _imported(target))


async def run_function(fn: Callable, ctx, timeout_s: float, cancel: asyncio.Event | None, *,
                       name: str, kill_grace_s: float = limits.kill_grace_s_default,
                       linger: bool = False) -> Outcome:
    """Run ``fn(ctx)`` exactly as the python executor runs a target's function, and return its
    :class:`Outcome`: a coroutine function on the loop (cancelled at the deadline or when
    ``cancel`` is set), a plain one in a run thread; the return value's bounded repr or the
    traceback's tail as the output. ``ctx`` is what ``fn`` is called with (any object with a
    ``run_id``).

    :param name: the function's ``module:function``, for the logs.
    :param linger: a plain function that cannot be stopped fails with "timed out after 5s; the
        handler's thread could not be stopped and is still running" (or "lease lost; ..."), and
        the Outcome's ``linger`` future is done when its thread really ends (the caller keeps a
        slot for it until then). Without it, the thread is abandoned as the python executor's.
    :raises asyncio.CancelledError: the caller was cancelled (the run is killed first).
    """
    run = _PythonRun(name, ctx, timeout_s, cancel, kill_grace_s, None, time.monotonic(), linger)
    return await _awaited(run, fn)


def function_soon(fn: Callable, ctx, timeout_s: float, cancel: CancelEvent | None,
                  on_done: Callable[[Outcome], None], *, name: str,
                  kill_grace_s: float = limits.kill_grace_s_default, linger: bool = False) -> bool:
    """:func:`run_function` started by callbacks, as :func:`start_soon` starts a target: returns
    True and calls ``on_done(outcome)`` on the loop once with the Outcome ``run_function`` would
    have returned, without a task and a coroutine of the caller's own; or returns False having
    started nothing, when ``cancel`` is not a :class:`CancelEvent` or is set already (then await
    :func:`run_function`)."""
    if cancel is not None and (not isinstance(cancel, CancelEvent) or cancel.is_set()):
        return False
    _PythonRun(name, ctx, timeout_s, cancel, kill_grace_s, on_done, time.monotonic(), linger).start(fn)
    return True


async def _awaited(run: "_PythonRun", fn: Callable | None) -> Outcome:
    """Start ``run`` (with its function, or None to import its target first) and wait for its
    Outcome; when the caller is cancelled the run is killed and the cancellation propagates."""
    fut = asyncio.get_running_loop().create_future()

    def settle(outcome: Outcome) -> None:
        if not fut.done():  # cancelled with our caller, and the run not killed yet
            fut.set_result(outcome)

    run.on_done = settle
    run.start(fn)
    try:
        return await fut
    except asyncio.CancelledError:
        run.kill()
        raise


def start_soon(target: str, ctx: RunContext, timeout_s: float, cancel: CancelEvent | None,
               kill_grace_s: float, on_done: Callable[[Outcome], None]) -> bool:
    """:func:`~raftsched.worker.executors.execute_soon` for a python spec whose other conditions
    hold: start the run if its function is a plain one imported already, else return False."""
    fn = _imported(target)
    if fn is None or inspect.iscoroutinefunction(fn):
        return False
    _PythonRun(target, ctx, timeout_s, cancel, kill_grace_s, on_done, time.monotonic()).start(fn, plain=True)
    return True


class _PythonRun:
    """One python run, from the import of its target to its Outcome, by callbacks on the event
    loop: both :func:`run_python` (for ``execute``) and :func:`start_soon` (for
    ``execute_soon``) are this.

    The run goes through up to three steps, each raced against one timer (the run's deadline)
    and the cancel event; whichever comes first settles the run, once, and ``on_done`` gets its
    Outcome on the loop:

    - the import of the target's module, in a run thread, unless it is imported already;
    - the call: a plain function in a run thread, a coroutine function as a task on the loop;
    - an awaitable the plain function returned (a decorated or partial coroutine function, an
      object with an async ``__call__``), awaited as a task on the loop.

    A thread cannot be killed: stopped, it is abandoned (it keeps running until it returns, and
    what it returns is dropped); with ``linger``, the Outcome says it still runs and carries a
    future done when it returns. A task is cancelled and gets ``kill_grace_s`` to finish
    before it is abandoned. The common run, a plain function imported already, costs a thread
    handoff, a timer and a few callbacks: no task and no coroutine.
    """

    __slots__ = ("target", "ctx", "timeout_s", "cancel", "kill_grace_s", "on_done", "t0", "timer",
                 "settled", "thread_name", "importing", "task", "cancel_task", "stop_how", "grace",
                 "linger", "thread_end")

    def __init__(self, target: str, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                 kill_grace_s: float, on_done: Callable[[Outcome], None] | None, t0: float,
                 linger: bool = False) -> None:
        self.target, self.ctx, self.timeout_s, self.cancel = target, ctx, timeout_s, cancel
        self.kill_grace_s, self.on_done, self.t0 = kill_grace_s, on_done, t0
        self.linger = linger
        #: with ``linger``: done when the thread of a run stopped while it ran really ends
        self.thread_end: asyncio.Future | None = None
        self.settled = self.importing = False
        self.task: asyncio.Future | None = None
        self.cancel_task: asyncio.Future | None = None
        self.stop_how: str | None = None  # set while a stopped task has its grace
        self.grace: asyncio.TimerHandle | None = None
        self.thread_name = f"raftsched-run-{ctx.run_id}"

    def start(self, fn: Callable | None, plain: bool = False) -> None:
        """Start the run. Never raises: a run that cannot start fails, reported on the loop.

        :param fn: the target's function when it is imported already (:func:`_imported`);
            None to import it in a run thread first.
        :param plain: ``fn`` is known not to be a coroutine function.
        """
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(max(0.0, self.timeout_s), self._stop, "timeout")
        cancel = self.cancel
        if isinstance(cancel, CancelEvent):
            cancel.add_callback(self._cancelled)
        elif cancel is not None:
            # Any asyncio.Event works as cancel; one that calls nobody back costs a task that
            # waits for it.
            self.cancel_task = asyncio.ensure_future(cancel.wait())
            self.cancel_task.add_done_callback(self._cancelled)
        try:
            if plain:
                THREADS.call(fn, (self.ctx,), self.thread_name, self._returned)
            elif fn is not None:
                self._call(fn)
            else:
                # Import in a thread: module-level code is the job's, and it must neither block
                # the loop (lease renewals) nor escape the deadline.
                self.importing = True
                THREADS.call(_resolve, (self.target,), self.thread_name + "-import", self._resolved)
        except Exception as e:  # no thread could be started: the run fails, reported on the loop
            self._failed(e)

    def kill(self) -> None:
        """Our caller is cancelled: report nothing, and cancel a task at once (no grace: the
        run must not outlive the worker's interest in it). A thread is abandoned."""
        if not self.settled:
            self._settle()
            if self.task is not None:
                self.task.cancel()
        self.on_done = None
        self.stop_how = None
        if self.grace is not None:
            self.grace.cancel()
        if self.task is not None:
            self.task.add_done_callback(_consume)

    # Steps.

    def _call(self, fn: Callable) -> None:
        if inspect.iscoroutinefunction(fn):
            self._await(_call_async(fn, self.ctx))
        else:
            THREADS.call(fn, (self.ctx,), self.thread_name, self._returned)

    def _resolved(self, value: tuple) -> None:
        if self.settled:
            return  # stopped during the import: already reported
        self.importing = False
        if value[0] == "exc":
            self._finish(value)
            return
        try:
            self._call(value[1])
        except Exception as e:
            self._failed(e)

    def _returned(self, value: tuple) -> None:
        if self.settled:
            # Already reported as timed out or lease lost; with linger, its slot is now free.
            if self.thread_end is not None and not self.thread_end.done():
                log.info("run %s: %s returned at last in thread %s; what it returned is dropped",
                         self.ctx.run_id, self.target, self.thread_name)
                self.thread_end.set_result(None)
            return
        if value[0] == "ok" and inspect.isawaitable(value[1]):
            # A plain callable that returned an awaitable: await it on the loop, within what is
            # left of the deadline.
            try:
                self._await(_guarded(value[1]))
            except Exception as e:
                self._failed(e)
            return
        self._finish(value)

    def _await(self, coro: Awaitable) -> None:
        self.task = task = asyncio.ensure_future(coro)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future) -> None:
        if self.stop_how is not None:
            self._abandon()  # stopped, and it finished within its grace
            return
        if self.settled:
            return  # killed with our caller
        if task.cancelled():
            # Not our cancellation (that settles the run first) and not our caller's (kill()
            # does): it must not look like the caller's own cancellation to our caller.
            try:
                raise RuntimeError("the run's task was cancelled from elsewhere")
            except RuntimeError as e:
                self._failed(e)
            return
        self._finish(task.result())

    # Ends.

    def _cancelled(self, _: object = None) -> None:
        self._stop("cancel")

    def _stop(self, how: str) -> None:
        """The deadline passed ("timeout") or the cancel event was set ("cancel")."""
        if self.settled:
            return
        task = self.task
        if task is not None and task.done():
            return  # finished in this turn of the loop: its result wins, on its way to _task_done
        self._settle()
        if task is None:
            if self.importing:
                log.warning("run %s: import of %s abandoned (%s)", self.ctx.run_id, self.target, how)
            elif self.linger:
                log.info("run %s: %s cannot be stopped (%s): still running in thread %s; it fails, "
                         "and the Outcome tells when the function returns",
                         self.ctx.run_id, self.target, how, self.thread_name)
                self.thread_end = asyncio.get_running_loop().create_future()
                self._emit(stopped_lingering(how, self.timeout_s), self.thread_end)
                return
            else:
                log.warning("run %s: %s still running in thread %s; abandoned (%s)",
                            self.ctx.run_id, self.target, self.thread_name, how)
            self._emit(stopped(how, self.timeout_s))
            return
        # Give the coroutine a moment to run its finally blocks; one that swallows the
        # cancellation and keeps going is abandoned rather than allowed to hold the worker.
        self.stop_how = how
        task.cancel()
        self.grace = asyncio.get_running_loop().call_later(self.kill_grace_s, self._abandon)

    def _abandon(self) -> None:
        """A stopped task's grace is over, or it finished within it: report the stop."""
        how, self.stop_how = self.stop_how, None
        if how is None:
            return
        self.grace.cancel()
        task = self.task
        task.add_done_callback(_consume)
        if not task.done():
            log.warning("run task %r ignored cancellation; abandoned", task)
        self._emit(stopped(how, self.timeout_s))

    def _finish(self, value: tuple) -> None:
        self._settle()
        if value[0] == "ok":  # handed to the run's children (pipelines), when it is JSON of 4 KiB or less
            sink = getattr(self.ctx, "result_sink", None) or self.ctx  # an SDK Context's run context
            if isinstance(sink, RunContext):
                sink.result = value[1]
        try:
            result = _python_result(value, run_masked(self.ctx))
        except Exception as e:  # the contract is an Outcome, whatever went wrong in here
            self._failed(e)
            return
        self._emit(result)

    def _failed(self, e: Exception) -> None:
        """An error of the executor's own, not the job's (called in its ``except`` block): the
        run fails with it, reported on the loop in a later turn (never from inside ``start``)."""
        log.exception("python executor for run %s failed unexpectedly", self.ctx.run_id)
        if not self.settled:
            self._settle()
        if self.task is not None:
            self.task.add_done_callback(_consume)
        asyncio.get_running_loop().call_soon(self._emit, executor_error(e, run_masked(self.ctx)))

    def _settle(self) -> None:
        self.settled = True
        self.timer.cancel()
        cancel = self.cancel
        if cancel is not None:
            if self.cancel_task is None:
                cancel.remove_callback(self._cancelled)
            else:
                self.cancel_task.cancel()

    def _emit(self, result: Result, linger: asyncio.Future | None = None) -> None:
        on_done, self.on_done = self.on_done, None
        if on_done is None:
            return  # reported already, or killed with our caller
        ok, error, output = result
        on_done(Outcome(ok=ok, error=error, output=output,
                        duration_ms=int(round((time.monotonic() - self.t0) * 1000)), linger=linger))
