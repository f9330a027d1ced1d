"""Executors: how a worker runs one leased run (DESIGN.md section 6, the executor contract).

:func:`execute` takes a validated executor spec (``core.model.validate_executor``), the run's
identity (:class:`RunContext`) and a timeout, and returns an :class:`Outcome`. It never raises
(an unexpected error becomes a failed Outcome), except ``asyncio.CancelledError`` when the
calling task itself is cancelled, and then only after the run has been killed.

Three executor types:

``shell``
    ``{"type": "shell", "argv": [...], "env"?: {...}, "cwd"?: "..."}``. argv is executed
    directly, never through a shell (use ``["sh", "-c", "..."]`` to ask for one), in a new
    session, so the run is a process group that can be signalled as a whole. Environment:
    the worker's, then the executor's ``env``, then the run identity (``RAFTSCHED_*``, last, so
    a job cannot spoof it). stdin is /dev/null; stdout and stderr share one pipe, so the output
    is interleaved as the process wrote it, and only its last :data:`OUTPUT_BYTES_MAX` bytes
    are kept. Success is exit status 0. When the main process exits, whatever is left of its
    process group is killed too (the run is the whole group; a job that wants a daemon to
    outlive it must detach it into its own session and away from stdout).

``http``
    ``{"type": "http", "url": "...", "headers"?: {...}}``. POSTs the payload as JSON with the
    run identity in ``X-Raftsched-*`` headers. 2xx is success. Redirects are not followed: a
    3xx is a failure "HTTP 3xx" (following a 302 would turn the POST into a GET and drop the
    payload while reporting success).

``python``
    ``{"type": "python", "target": "module:function"}``. Imports the module in the worker
    process and calls the function with the :class:`RunContext`. Coroutine functions run on
    the worker's event loop and are cancelled on timeout or lease loss. Plain functions run in
    a daemon thread of their own while they run (threads are reused from one run to the next,
    and a new one starts whenever none is idle); a thread cannot be killed, so on timeout or
    lease loss the run is reported failed and the thread is abandoned (it keeps running until
    it returns). The module is imported in such a thread too, unless it is imported already.

A run past ``timeout_s`` is killed and fails with "timed out after {timeout_s}s"; when the
``cancel`` event is set (the worker lost its lease), the run is killed the same way and fails
with "lease lost". Killing a shell run is SIGTERM to its process group, then SIGKILL after
``kill_grace_s`` if anything in the group is still alive.
"""
from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import importlib
import inspect
import itertools
import json
import logging
import os
import queue
import reprlib
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
import weakref
from typing import Any, Awaitable, Callable

import aiohttp
from multidict import CIMultiDict

from ..core.schedule import iso
from ..aio import LoopInbox

log = logging.getLogger("raftsched.executors")

#: bytes of output kept per run (the tail: the end of a log says why a run failed).
OUTPUT_BYTES_MAX = 4096
#: bytes of an HTTP response body read at most; the rest is never read.
HTTP_BODY_READ_MAX = 64 * 1024
#: characters of an error reason kept: the reason is one short line, the detail is in output.
ERROR_CHARS_MAX = 300
#: the executor types a node runs unless configured otherwise.
ALL_TYPES = frozenset({"shell", "http", "python"})

#: after the process group is gone, how long to wait for the pipe's end-of-file. Only a process
#: that left the group (setsid) while keeping stdout can hold it open; then the pipe is closed.
_DRAIN_S = 1.0
#: after SIGKILL, how long to wait for the main process to be reaped (a process stuck in the
#: kernel can outlive SIGKILL for a while; the child watcher still reaps it later).
_REAP_WAIT_S = 5.0
#: how long a cancelled HTTP request gets to finish its cleanup before it is abandoned (a job's
#: coroutine gets ``kill_grace_s``, like a process).
_CANCEL_WAIT_S = 1.0


@dataclasses.dataclass
class RunContext:
    """The identity of one run, as the executor shows it to the job.

    :param run_id: the run's id.
    :param job: the job's name.
    :param slot_ms: the scheduled slot, epoch milliseconds UTC.
    :param attempt: 1 for the first attempt, then 2, 3, ... on retries.
    :param fencing_token: the lease's fencing token; a downstream system that records the
        highest token it has seen can refuse writes from a stale worker.
    :param payload: the job's JSON-able payload.
    """

    run_id: str
    job: str
    slot_ms: int
    attempt: int
    fencing_token: int
    payload: Any

    @property
    def slot_iso(self) -> str:
        """The slot as ISO-8601 UTC with a Z, milliseconds only when non-zero."""
        return iso(self.slot_ms)

    def payload_json(self) -> str:
        """The payload as compact JSON (ASCII-only, so it is safe in any environment)."""
        return json.dumps(self.payload, separators=(",", ":"))

    def env(self) -> dict[str, str]:
        """The ``RAFTSCHED_*`` environment variables of the run (shell and python executors)."""
        return {
            "RAFTSCHED_RUN_ID": self.run_id,
            "RAFTSCHED_JOB": self.job,
            "RAFTSCHED_SLOT": self.slot_iso,
            "RAFTSCHED_ATTEMPT": str(self.attempt),
            "RAFTSCHED_FENCING_TOKEN": str(self.fencing_token),
            "RAFTSCHED_PAYLOAD": self.payload_json(),
        }

    def headers(self) -> dict[str, str]:
        """The ``X-Raftsched-*`` request headers of the run (http executor; the payload is the body)."""
        return {
            "X-Raftsched-Run-Id": self.run_id,
            "X-Raftsched-Job": self.job,
            "X-Raftsched-Slot": self.slot_iso,
            "X-Raftsched-Attempt": str(self.attempt),
            "X-Raftsched-Fencing-Token": str(self.fencing_token),
        }


@dataclasses.dataclass
class Outcome:
    """How a run ended.

    :param ok: True when the run succeeded (exit status 0, HTTP 2xx, or the function returned).
    :param error: a short reason when not ok ("exit status 3", "timed out after 5s", "HTTP 500",
        "lease lost", "ImportError: ..."), None when ok.
    :param output: the bounded tail of what the run produced: the last :data:`OUTPUT_BYTES_MAX`
        bytes of stdout+stderr (shell), "HTTP <status>\\n<body tail>" (http), or the repr of the
        return value / the traceback tail (python). Decoded as UTF-8, invalid bytes replaced.
    :param duration_ms: wall time of the whole execution, kill and cleanup included.
    """

    ok: bool
    error: str | None
    output: str
    duration_ms: int


# A runner's result before the duration is added: (ok, error, output).
_Result = tuple[bool, "str | None", str]


async def execute(executor: dict, ctx: RunContext, timeout_s: float, *,
                  cancel: asyncio.Event | None = None,
                  allowed_types: frozenset[str] = ALL_TYPES,
                  kill_grace_s: float = 5.0,
                  http_session: aiohttp.ClientSession | None = None) -> Outcome:
    """Run one executor spec for one run and report how it ended.

    Never raises: a spec that cannot run, a failing job and an internal error all become a
    failed :class:`Outcome`. The one exception is ``asyncio.CancelledError`` when the calling
    task is cancelled (e.g. the worker shuts down): the run is killed first (SIGKILL to a shell
    run's process group, cancellation of a coroutine) and the cancellation propagates.

    A plain (non-async) python function cannot be killed: on timeout or lease loss the Outcome
    is a failure and the thread is abandoned, still running, until the function returns.

    :param executor: a validated executor spec, ``{"type": "shell"|"http"|"python", ...}``.
    :param ctx: the run's identity and payload.
    :param timeout_s: the run's deadline in seconds from now; past it the run is killed and
        fails with "timed out after {timeout_s}s".
    :param cancel: set by the worker when it loses the run's lease; the run is killed and fails
        with "lease lost". Already set: nothing runs.
    :param allowed_types: the executor types this node runs; another type fails without
        running anything ("executor type 'shell' is not allowed on this node").
    :param kill_grace_s: how long a shell run's process group has between SIGTERM and SIGKILL;
        also how long a cancelled python coroutine has to finish before it is abandoned.
    :param http_session: a session for http executors to share connections; by default each
        run opens (and closes) its own.
    :returns: the Outcome; ``duration_ms`` covers the kill and cleanup too.
    """
    t0 = time.monotonic()
    try:
        kind = executor.get("type") if isinstance(executor, dict) else None
        if kind not in allowed_types:
            result: _Result = (False, f"executor type {kind!r} is not allowed on this node", "")
        elif cancel is not None and cancel.is_set():
            result = (False, "lease lost", "")
        elif kind == "shell":
            result = await _run_shell(executor, ctx, timeout_s, cancel, kill_grace_s)
        elif kind == "http":
            result = await _run_http(executor, ctx, timeout_s, cancel, http_session)
        elif kind == "python":
            result = await _run_python(executor, ctx, timeout_s, cancel, kill_grace_s)
        else:
            result = (False, f"unknown executor type {kind!r}", "")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the contract is an Outcome, whatever went wrong in here
        # The type only: a spec's env and headers may hold secrets.
        log.exception("%s executor for run %s failed unexpectedly",
                      executor.get("type") if isinstance(executor, dict) else type(executor).__name__,
                      getattr(ctx, "run_id", "?"))
        result = (False, _short(f"executor error: {_exc_reason(e)}"), _tail_str(_format_tb(e)))
    ok, error, output = result
    return Outcome(ok=ok, error=error, output=output,
                   duration_ms=int(round((time.monotonic() - t0) * 1000)))


# ---------------------------------------------------------------------------------------------
# Deadlines and cancellation, shared by all executor types.

def _timed_out(timeout_s: float) -> str:
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


async def _race(aw: asyncio.Future, timeout_s: float, cancel: asyncio.Event | None) -> str:
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


async def _run_task(coro: Awaitable, timeout_s: float, cancel: asyncio.Event | None,
                    grace_s: float = _CANCEL_WAIT_S) -> tuple[str, Any]:
    """Run ``coro`` as a task under a deadline and a cancel event; cancel it when either fires.

    :param grace_s: how long the cancelled task gets to finish before it is abandoned.

    :returns: ("done", result), ("timeout", None) or ("cancel", None). The task's exception, if
        any, is raised from here (runners wrap user code so it does not raise).
    """
    task = asyncio.ensure_future(coro)
    try:
        how = await _race(task, timeout_s, cancel)
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


def _stopped(how: str, timeout_s: float) -> _Result:
    return (False, "lease lost" if how == "cancel" else _timed_out(timeout_s), "")


# ---------------------------------------------------------------------------------------------
# Output bounding.

def _tail_bytes(data: bytes | bytearray, limit: int = OUTPUT_BYTES_MAX, cut: bool = False) -> str:
    """The last ``limit`` bytes of ``data`` as text (UTF-8, invalid bytes replaced).

    :param cut: ``data`` is itself the tail of something longer (so it may start mid-character).
    """
    tail = bytes(data[-limit:]) if limit > 0 else b""
    if cut or len(data) > limit:
        # The cut may fall inside a multi-byte character: drop its continuation bytes rather
        # than show a replacement character for half a character.
        i = 0
        while i < min(3, len(tail)) and 0x80 <= tail[i] <= 0xBF:
            i += 1
        tail = tail[i:]
    return tail.decode("utf-8", "replace")


def _tail_str(text: str, limit: int = OUTPUT_BYTES_MAX) -> str:
    return _tail_bytes(text.encode("utf-8", "replace"), limit)


def _short(text: str) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= ERROR_CHARS_MAX else text[:ERROR_CHARS_MAX - 3] + "..."


def _exc_reason(e: BaseException) -> str:
    msg = str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _format_tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))


# ---------------------------------------------------------------------------------------------
# shell

class _TailProtocol(asyncio.Protocol):
    """Reads a pipe to its end keeping only the last ``limit`` bytes: output is never buffered
    unbounded, and the writer never blocks on a full pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.total = 0  # bytes received, kept or not
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[:-self.limit]

    def eof_received(self) -> bool:
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already, or nothing left in it we may signal


def _group_exists(pgid: int) -> bool:
    """Whether kill(2) still finds the process group (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # only processes we may not signal (setuid): nothing we could do anyway
    return True


def _group_has_live_member(pgid: int) -> bool:
    """Whether the process group has a member that is not a zombie.

    kill(2) also finds zombies, and an orphan killed in a container whose PID 1 never reaps
    stays a zombie forever: waiting for kill(2) to fail would always cost the whole grace. On
    Linux /proc tells zombies apart; elsewhere this falls back to kill(2).
    """
    if not _group_exists(pgid):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(b")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def _terminate_group(pgid: int, main_exit: asyncio.Future, grace_s: float) -> None:
    """SIGTERM the process group, wait up to ``grace_s`` for it to be gone, then SIGKILL it."""
    _signal_group(pgid, signal.SIGTERM)
    # A stopped process would only see the SIGTERM once continued.
    _signal_group(pgid, signal.SIGCONT)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    delay = 0.01
    while True:
        if main_exit.done() and not _group_has_live_member(pgid):
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        # Polling: there is no event for "the last process of a group exited" (the main
        # process's exit is one, but its children may outlive it).
        if main_exit.done():
            await asyncio.sleep(min(delay, remaining))
        else:
            await asyncio.wait({main_exit}, timeout=min(delay, remaining))
        delay = min(delay * 2, 0.1)
    # Unconditionally while kill(2) finds the group: SIGKILL to a zombie is harmless, and the
    # /proc check above must not be the only thing standing between a survivor and SIGKILL.
    if _group_exists(pgid):
        _signal_group(pgid, signal.SIGKILL)


async def _run_shell(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                     kill_grace_s: float) -> _Result:
    env = dict(os.environ)
    env.update(ex.get("env") or {})
    env.update(ctx.env())
    loop = asyncio.get_running_loop()
    # Our own pipe rather than asyncio's PIPE: stdout and stderr share its write end (interleaved
    # output), and closing the read end is ours to do, even if a stray process still writes.
    r, w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *ex["argv"], stdin=subprocess.DEVNULL, stdout=w, stderr=w, env=env,
            cwd=ex.get("cwd"), start_new_session=True)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        os.close(r)
        return False, _short(f"cannot execute: {e}"), ""
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)  # only the child's copies remain: end-of-file once they are all closed
    pgid = proc.pid  # start_new_session: the child leads its own session and process group
    pipe = os.fdopen(r, "rb", buffering=0)  # owns r from here on
    proto = _TailProtocol(OUTPUT_BYTES_MAX)
    transport = None
    main_exit = asyncio.ensure_future(proc.wait())
    try:
        transport, _ = await loop.connect_read_pipe(lambda: proto, pipe)
        how = await _race(main_exit, timeout_s, cancel)
        if how != "done":
            await _terminate_group(pgid, main_exit, kill_grace_s)
        elif _group_has_live_member(pgid):
            # The main process is done; what it left behind in its group is part of the run.
            log.info("run %s: killing processes left in group %d after exit", ctx.run_id, pgid)
            await _terminate_group(pgid, main_exit, kill_grace_s)
        await asyncio.wait({main_exit}, timeout=_REAP_WAIT_S)
        await asyncio.wait({proto.closed}, timeout=_DRAIN_S)
    except BaseException:
        # Our caller is cancelled (or something broke here): no grace, the run must not outlive
        # the worker's interest in it. The child watcher still reaps the main process.
        _signal_group(pgid, signal.SIGKILL)
        raise
    finally:
        if transport is not None:
            transport.close()  # closes the pipe; a stray writer left gets EPIPE
        else:
            pipe.close()
        if not main_exit.done():
            main_exit.cancel()
    output = _tail_bytes(proto.buf, cut=proto.total > len(proto.buf))
    if how != "done":
        return False, ("lease lost" if how == "cancel" else _timed_out(timeout_s)), output
    rc = proc.returncode
    if rc == 0:
        return True, None, output
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return False, f"killed by signal {name}", output
    return False, f"exit status {rc}", output


# ---------------------------------------------------------------------------------------------
# http

async def _read_capped(content: aiohttp.StreamReader, cap: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < cap:
        chunk = await content.read(cap - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


async def _http_post(ex: dict, ctx: RunContext, timeout_s: float,
                     session: aiohttp.ClientSession | None) -> _Result:
    own = session is None
    if own:
        session = aiohttp.ClientSession()
    try:
        headers: CIMultiDict[str] = CIMultiDict(ex.get("headers") or {})
        # The run identity last, replacing (case-insensitively) any executor header of that name.
        for name, value in ctx.headers().items():
            headers[name] = value
        headers.setdefault("Content-Type", "application/json")
        body = ctx.payload_json().encode()
        try:
            async with session.post(ex["url"], data=body, headers=headers, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                data = await _read_capped(resp.content, HTTP_BODY_READ_MAX)
                # Cut at the read cap: the kept tail may then start mid-character.
                cut = len(data) >= HTTP_BODY_READ_MAX
                status = resp.status
                location = resp.headers.get("Location")
        except asyncio.TimeoutError:
            return False, _timed_out(timeout_s), ""
        except (aiohttp.ClientError, OSError, ValueError) as e:
            # Connection refused, DNS, TLS, a malformed response: the class says which.
            return False, _short(_exc_reason(e)), ""
    finally:
        if own:
            await session.close()
    head = f"HTTP {status}\n"
    if location is not None and 300 <= status < 400:
        head += f"Location: {location}\n"
    output = head + _tail_bytes(data, max(0, OUTPUT_BYTES_MAX - len(head.encode())), cut=cut)
    if 200 <= status < 300:
        return True, None, output
    return False, f"HTTP {status}", output


async def _run_http(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                    session: aiohttp.ClientSession | None) -> _Result:
    # aiohttp's total timeout covers the request; the race adds the cancel event (and is a
    # backstop should the client's timeout not fire).
    how, result = await _run_task(_http_post(ex, ctx, timeout_s, session), timeout_s, cancel)
    return result if how == "done" else _stopped(how, timeout_s)


# ---------------------------------------------------------------------------------------------
# python

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


def _python_result(value: tuple) -> _Result:
    kind, obj = value
    if kind == "exc":
        return False, _short(_exc_reason(obj)), _tail_str(_format_tb(obj))
    try:
        text = _repr.repr(obj)
    except Exception as e:  # a broken __repr__ must not fail a run that succeeded
        text = f"<unrepresentable {type(obj).__name__}: {_exc_reason(e)}>"
    return True, None, _tail_str(text)


async def _run_python(ex: dict, ctx: RunContext, timeout_s: float,
                      cancel: asyncio.Event | None, kill_grace_s: float) -> _Result:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    thread_name = f"raftsched-run-{ctx.run_id}"
    fn = _imported(ex["target"])
    if fn is None:
        # Import in a thread: module-level code is the job's, and it must neither block the
        # loop (lease renewals) nor escape the deadline.
        fut = _in_thread(_resolve, ex["target"], name=thread_name + "-import")
        how = await _race(fut, timeout_s, cancel)
        if how != "done":
            log.warning("run %s: import of %s abandoned (%s)", ctx.run_id, ex["target"], how)
            return _stopped(how, timeout_s)
        kind, fn = fut.result()
        if kind == "exc":
            return _python_result((kind, fn))

    if inspect.iscoroutinefunction(fn):
        how, value = await _run_task(_call_async(fn, ctx), deadline - loop.time(), cancel, kill_grace_s)
        return _python_result(value) if how == "done" else _stopped(how, timeout_s)

    fut = _in_thread(fn, ctx, name=thread_name)
    how = await _race(fut, deadline - loop.time(), cancel)
    if how != "done":
        log.warning("run %s: %s still running in thread %s; abandoned (%s)",
                    ctx.run_id, ex["target"], thread_name, how)
        return _stopped(how, timeout_s)
    value = fut.result()
    if value[0] == "ok" and inspect.isawaitable(value[1]):
        # A plain callable that returns an awaitable (a decorated or partial coroutine
        # function, an object with an async __call__): await it on the loop.
        how, value = await _run_task(_guarded(value[1]), deadline - loop.time(), cancel, kill_grace_s)
        if how != "done":
            return _stopped(how, timeout_s)
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
            log.error("run %s: %s not started: %s", self.ctx.run_id, self.target, _exc_reason(e))
            loop.call_soon(self._emit, (False, _short(f"executor error: {_exc_reason(e)}"), ""))

    def _cancelled(self) -> None:
        self._stop("cancel")

    def _stop(self, how: str) -> None:
        if self.settled:
            return
        log.warning("run %s: %s still running in thread %s; abandoned (%s)",
                    self.ctx.run_id, self.target, self.thread_name, how)
        self._settle()
        self._emit(_stopped(how, self.timeout_s))

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
            result = (False, _short(f"executor error: {_exc_reason(e)}"), "")
        self._emit(result)

    async def _await(self, aw: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            how, value = await _run_task(_guarded(aw), self.deadline - loop.time(), self.cancel, self.kill_grace_s)
            result = _python_result(value) if how == "done" else _stopped(how, self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            result = (False, _short(f"executor error: {_exc_reason(e)}"), _tail_str(_format_tb(e)))
        self._emit(result)

    def _settle(self) -> None:
        self.settled = True
        self.timer.cancel()
        if self.cancel is not None:
            self.cancel.remove_callback(self._cancelled)

    def _emit(self, result: _Result) -> None:
        ok, error, output = result
        self.on_done(Outcome(ok=ok, error=error, output=output,
                             duration_ms=int(round((time.monotonic() - self.t0) * 1000))))
