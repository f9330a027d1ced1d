"""Executors: how a worker runs one leased run (DESIGN.md section 6, the executor contract).

:func:`execute` takes a validated executor spec (``core.model.validate_executor``), the run's
identity (:class:`RunContext`) and a timeout, and returns an :class:`Outcome`. It never raises
(an unexpected error becomes a failed Outcome), except ``asyncio.CancelledError`` when the
calling task itself is cancelled, and then only after the run has been killed.

Where shell and python runs execute is the ``sandbox``'s (worker/sandbox.py): a worker gives
one, and its runs then execute as the run user, in a directory of their own, with a clean
environment, each in a process of its own started by the worker's run server; never in the
worker's process (docs/security.md, "What a job can reach"). Without one they execute in the
calling process, its environment and its working directory: for a process that is itself the
sandbox (``raftsched worker --app``'s child process) and for the tests of the executors.

Three executor types:

``shell``
    ``{"type": "shell", "argv": [...], "env"?: {...}, "cwd"?: "..."}``. argv is executed
    directly, never through a shell (use ``["sh", "-c", "..."]`` to ask for one), in a new
    session, so the run is a process group that can be signalled as a whole; in ``cwd`` if
    given, else in the run's directory. Environment: in a sandbox, ``PATH``, ``LANG`` and ``TZ``
    of the worker's (and its ``--pass-env`` names) and ``HOME`` (the run's directory), without
    one the caller's whole environment; then the executor's ``env`` (the job's secrets
    included), then the run identity (``RAFTSCHED_*``, last, so a job cannot spoof it). stdin
    is /dev/null; stdout and stderr share one pipe, so the output is interleaved as the process
    wrote it, and only its last :data:`OUTPUT_BYTES_MAX` bytes are kept. Success is exit status
    0. When the main process exits, whatever is left of its process group is killed too (the
    run is the whole group; a job that wants a daemon to outlive it must detach it into its own
    session and away from stdout).

``http``
    ``{"type": "http", "url": "...", "headers"?: {...}}``. POSTs the payload as JSON with the
    run identity in ``X-Raftsched-*`` headers. 2xx is success. Redirects are not followed: a
    3xx is a failure "HTTP 3xx" (following a 302 would turn the POST into a GET and drop the
    payload while reporting success). A run its tenant's policy holds connects only to
    addresses the policy allows, checked after resolution (executors/http.py).

``python``
    ``{"type": "python", "target": "module:function"}``. Imports the module and calls the
    function with the :class:`RunContext` (its ``secrets`` there, not in the environment); the
    output is the bounded repr of what it returned, or the exception's traceback. In a sandbox,
    each run is a process of its own, forked from the run server (the worker's import path,
    the environment of a shell run without the executor's ``env``): it imports the module,
    calls the function (a coroutine function, or an awaitable a plain one returned, on an event
    loop of its own), and is killed on timeout or lease loss as a shell run is; what it printed
    comes before the outcome in the output. Without a sandbox, in the calling process:
    coroutine functions run on its event loop and are cancelled on timeout or lease loss; plain
    functions run in a daemon thread of their own while they run (threads are reused from one
    run to the next, and a new one starts whenever none is idle); a thread cannot be killed, so
    on timeout or lease loss the run is reported failed and the thread is abandoned (it keeps
    running until it returns). The module is imported in such a thread too, unless it is
    imported already.

A run past ``timeout_s`` is killed and fails with "timed out after {timeout_s}s"; when the
``cancel`` event is set (the worker lost its lease), the run is killed the same way and fails
with "lease lost". Killing a shell run (or a sandboxed python run) is SIGTERM to its process
group, then SIGKILL after ``kill_grace_s`` if anything in the group is still alive.

The package: this module holds the two entry points, :func:`execute` (awaited, any type) and
:func:`execute_soon` (the fast path of a worker without a sandbox, python only). ``shell``, ``http`` and ``python``
are one executor each; ``_context`` holds RunContext and Outcome, ``_deadline`` the race of a
run against its deadline and the cancel event, ``_output`` the output tails and error reasons,
``_threads`` the process's run threads. Bounds are ``worker/limits.py``'s. ``run_function`` runs a
function its caller holds (an SDK App's handler) the way the python executor runs a target's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from .. import limits
from ._context import ALL_TYPES, Outcome, RunContext, Result
from ._deadline import CancelEvent
from ..masking import secret_values
from ._output import OUTPUT_BYTES_MAX, executor_error
from .python import function_soon, run_function, run_python, start_soon
from .shell import run_shell

if TYPE_CHECKING:
    import aiohttp

    from ..sandbox import Sandbox

__all__ = ["ALL_TYPES", "CancelEvent", "OUTPUT_BYTES_MAX", "Outcome", "RunContext", "execute", "execute_soon",
           "function_soon", "run_function"]

log = logging.getLogger("raftsched.executors")


async def execute(executor: dict, ctx: RunContext, timeout_s: float, *,
                  cancel: asyncio.Event | None = None,
                  allowed_types: frozenset[str] = ALL_TYPES,
                  kill_grace_s: float = limits.kill_grace_s_default,
                  http_session: aiohttp.ClientSession | None = None,
                  network: dict | None = None, sandbox: Sandbox | None = None) -> Outcome:
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
        running anything ("executor type 'shell' is not allowed on this worker").
    :param kill_grace_s: how long a shell run's process group has between SIGTERM and SIGKILL;
        also how long a cancelled python coroutine has to finish before it is abandoned.
    :param http_session: a session for http executors to share connections; by default each
        run opens (and closes) its own.
    :param network: for an http run its tenant's policy holds (the grant's ``network``,
        ``{"allow": [networks]}``): where it may connect (executors/http.py); None: anywhere.
    :param sandbox: where shell and python runs execute (worker/sandbox.py: the run user, a
        clean environment, a directory of their own; a python run in a process of its own).
        None: in this process, its environment and its working directory (the process is the
        sandbox: ``raftsched worker --app``'s child, the tests of the executors themselves).
    :returns: the Outcome; ``duration_ms`` covers the kill and cleanup too.
    """
    t0 = time.monotonic()
    try:
        kind = executor.get("type") if isinstance(executor, dict) else None
        if kind not in allowed_types:
            result: Result = (False, f"executor type {kind!r} is not allowed on this worker", "")
        elif cancel is not None and cancel.is_set():
            result = (False, "lease lost", "")
        elif kind == "shell" and sandbox is not None:
            result = await sandbox.run_shell(executor, ctx, timeout_s, cancel, kill_grace_s)
        elif kind == "shell":
            result = await run_shell(executor, ctx, timeout_s, cancel, kill_grace_s)
        elif kind == "http":
            # Imported on first use: aiohttp is most of what importing the executors costs, and
            # a child process of raftsched worker --app --isolation subprocess runs python only.
            from .http import run_http
            result = await run_http(executor, ctx, timeout_s, cancel, http_session, network)
        elif kind == "python" and sandbox is not None:
            result = await sandbox.run_python(executor, ctx, timeout_s, cancel, kill_grace_s)
        elif kind == "python":
            return await run_python(executor, ctx, timeout_s, cancel, kill_grace_s, t0)
        else:
            result = (False, f"unknown executor type {kind!r}", "")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the contract is an Outcome, whatever went wrong in here
        # The type only: a spec's env and headers may hold secrets.
        log.exception("%s executor for run %s failed unexpectedly",
                      executor.get("type") if isinstance(executor, dict) else type(executor).__name__,
                      getattr(ctx, "run_id", "?"))
        result = executor_error(e, secret_values(executor if isinstance(executor, dict) else None,
                                                 getattr(ctx, "secrets", None)))
    ok, error, output = result
    return Outcome(ok=ok, error=error, output=output,
                   duration_ms=int(round((time.monotonic() - t0) * 1000)))


def execute_soon(executor: dict, ctx: RunContext, timeout_s: float, on_done: Callable[[Outcome], None], *,
                 cancel: CancelEvent | None = None, allowed_types: frozenset[str] = ALL_TYPES,
                 kill_grace_s: float = limits.kill_grace_s_default) -> bool:
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
    return start_soon(executor["target"], ctx, timeout_s, cancel, kill_grace_s, on_done)
