"""``raftsched worker --app MODULE:app``: an App's handlers, run in the worker's own process
(docs/sdk.md, "Running the handlers").

The worker is the fleet's ``raftsched worker`` (worker/remote.py) with two differences:

- **What it is granted.** It carries the label ``raftsched.app=NAME`` and is dedicated to it
  (core/workers.py): the cluster grants it only runs of jobs placed on that label, which is
  where the App places its jobs (sdk/app.py). So it takes this app's runs and nothing else, and
  no other worker takes them. It also says which handlers it has (:meth:`AppExecutors.targets`,
  the fact ``targets``), so that a run of a job its version of the app does not declare waits
  for a worker that does (for limits.handler_wait_ms). The nodes never import the app's code.
- **How a run executes.** :class:`AppExecutors` is the lease loop's ``executor_lookup``
  (worker/loop.py): for every grant it gives the executor that runs it, never the built-in
  ones. A grant whose target is one of the app's handlers runs that handler with a
  :class:`~raftsched.sdk.Context`, through the python executor's own run
  (``executors.run_function``, or ``function_soon`` when the lease loop starts it by callbacks,
  without a task of its own): an ``async def`` handler on the worker's event loop, cancelled
  at its ``timeout_s`` or when its lease is lost; a plain one in a run thread, at most
  ``--slots`` at once. A thread cannot be stopped: past its timeout the attempt fails with
  "timed out after Ns; the handler's thread could not be stopped and is still running", and its
  slot stays taken until the function returns. With ``isolation="subprocess"`` each run of a
  plain handler is a child process (``python -m raftsched.sdk.child``) that is killed at the
  timeout instead (SIGTERM to its process group, then SIGKILL: the shell executor's run).
  Anything else it is granted fails visibly, naming what is missing (a handler of a newer
  version of the app past that wait, or from a node that does not take ``targets``; a job that
  is not python), and is retried by the job's retry policy.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Awaitable, Callable

from ..core import limits
from ..worker import limits as worker_limits
from ..worker.executors import CancelEvent, Outcome, RunContext, function_soon, run_function
from ..worker.executors._output import may_be_cut, short, tail_str
from ..worker.masking import secret_values
from ..worker.executors.shell import run_shell
from .app import APP_LABEL, App
from .child import WORKER_PID_ENV
from .context import Context

log = logging.getLogger("raftsched.sdk.worker")

#: how a plain (non-async) handler runs: in a run thread of the worker, or in a child process
ISOLATIONS = ("thread", "subprocess")

Executor = Callable[[RunContext, float, CancelEvent], Awaitable[Outcome]]

#: what a stopped child's error adds (its process group was killed)
KILLED = "the handler's process was killed"


class _InProcess:
    """The executor of a handler run in the worker's process (an ``async def`` on its loop, a
    plain one in a run thread): awaited, or started by callbacks (``soon``: the lease loop's way
    for a run that may start now, without a task of its own, as worker/executors
    ``execute_soon`` for a plain python target)."""

    __slots__ = ("handler", "target", "kill_grace_s", "linger")

    def __init__(self, handler: Callable, target: str, kill_grace_s: float, *, linger: bool) -> None:
        self.handler, self.target, self.kill_grace_s, self.linger = handler, target, kill_grace_s, linger

    async def __call__(self, ctx: RunContext, timeout_s: float, cancel: CancelEvent) -> Outcome:
        return await run_function(self.handler, Context.of(ctx), timeout_s, cancel, name=self.target,
                                  kill_grace_s=self.kill_grace_s, linger=self.linger)

    def soon(self, ctx: RunContext, timeout_s: float, cancel: CancelEvent,
             on_done: Callable[[Outcome], None]) -> bool:
        """Start the run and return True (``on_done(outcome)`` then comes once, on the loop), or
        return False having started nothing (await the executor instead)."""
        return function_soon(self.handler, Context.of(ctx), timeout_s, cancel, on_done, name=self.target,
                             kill_grace_s=self.kill_grace_s, linger=self.linger)


class AppExecutors:
    """The ``executor_lookup`` of a worker that runs ``app``'s handlers (worker/loop.py's seam):
    called with each grant as its run starts, it returns the executor that runs it.

    :param app: the App, imported already (sdk/loader.py ``load_app``).
    :param ref: ``MODULE:ATTR`` it was loaded from: what a child process imports.
    :param isolation: ``thread`` or ``subprocess``, for plain handlers (``ISOLATIONS``).
    :param kill_grace_s: how long a cancelled async handler, or a child process sent SIGTERM,
        has to finish before it is abandoned or killed.
    """

    def __init__(self, app: App, ref: str, *, isolation: str = "thread",
                 kill_grace_s: float = worker_limits.kill_grace_s_default) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
        self.app = app
        self.ref = ref
        self.isolation = isolation
        self.kill_grace_s = kill_grace_s
        #: refusals so far (grants this app's workers cannot run), for the logs and the tests
        self.refused = 0

    @property
    def labels(self) -> dict[str, str]:
        """The worker labels ``--app`` adds: the one the App places its jobs on."""
        return {APP_LABEL: self.app.name}

    def __call__(self, grant: dict) -> Executor:
        ex = grant.get("executor") or {}
        job = grant.get("job")
        if ex.get("type") != "python":
            return self._refuse(grant, f"job {job!r} is placed on the workers of app {self.app.name!r}, but its "
                                       f"executor is {ex.get('type')!r}: such a worker runs the app's python "
                                       "handlers only")
        target = ex.get("target")
        try:
            decl = self.app.declaration_for(target)
        except KeyError:
            return self._refuse(grant, f"app {self.app.name!r} on this worker has no handler {target!r} for job "
                                       f"{job!r}: this worker runs a version of the app that does not declare it "
                                       "(deploy the version that does to the app's workers, or sync this one)")
        handler = decl.handler

        if decl.is_async or self.isolation == "thread":
            return _InProcess(handler, target, self.kill_grace_s, linger=not decl.is_async)

        async def in_child(ctx: RunContext, timeout_s: float, cancel: CancelEvent) -> Outcome:
            return await run_in_child(self.ref, target, ctx, timeout_s, cancel, self.kill_grace_s)
        return in_child

    def _refuse(self, grant: dict, reason: str) -> Executor:
        self.refused += 1
        log.warning("run %s: %s", grant.get("id"), reason)
        error = short(reason)

        async def refuse(ctx: RunContext, timeout_s: float, cancel: CancelEvent) -> Outcome:
            return Outcome(ok=False, error=error, output="", duration_ms=0)
        return refuse

    def targets(self) -> list[str] | None:
        """The python targets of the app's handlers, sorted: what the worker tells the cluster it
        has (the fact ``targets``, core/workers.py), so that it is granted no run of a job its
        version of the app does not declare. None when there are more than the cluster takes, or
        one is longer (the worker then takes any run of the app, and refuses what it cannot run),
        and for an app of no jobs."""
        targets = sorted({d.target for d in self.app.jobs.values()})
        if not targets or len(targets) > limits.worker_targets_max \
                or any(len(t) > limits.worker_target_chars_max for t in targets):
            return None  # (an app of no jobs has nothing placed on its label: nothing to say)
        return targets

    def describe(self) -> str:
        """One line for the worker's start: the app, its handlers, how plain ones run."""
        decls = list(self.app.jobs.values())
        n_async = sum(d.is_async for d in decls)
        targets = sorted({d.target for d in decls})
        return (f"app {self.app.name!r} ({self.ref}): {len(targets)} handler(s) for {len(decls)} job(s), "
                f"{n_async} async; plain handlers run in {'child processes' if self.isolation == 'subprocess' else 'threads'}")

    def unplaced(self) -> list[str]:
        """The app's jobs that are not placed on its workers (declared with ``placement=None``):
        this worker never takes them; any other worker that can import them may."""
        out = []
        for name, d in self.app.jobs.items():
            labels = (d.spec.get("placement") or {}).get("labels") or {}
            if labels.get(APP_LABEL) != self.app.name:
                out.append(name)
        return out


# ---------------------------------------------------------------------------- a child per run
async def run_in_child(ref: str, target: str, ctx: RunContext, timeout_s: float, cancel: CancelEvent | None,
                       kill_grace_s: float) -> Outcome:
    """Run the handler ``target`` of the App ``ref`` in a child process that imports the app
    and calls the handler with the run's Context (``python -m raftsched.sdk.child``), killed at
    ``timeout_s`` or when ``cancel`` is set.

    The child is a shell executor run (its own process group, the run's ``RAFTSCHED_*``
    environment, SIGTERM then SIGKILL after ``kill_grace_s``, the tail of what it printed), so
    it is killed as a shell run is. It writes the handler's outcome as the python executor
    reports it (the repr of the return value, or the exception and its traceback) to a file
    whose path it is given; the Outcome's output is what the child printed followed by that.

    :raises asyncio.CancelledError: the caller was cancelled (the child is killed first).
    """
    t0 = time.monotonic()
    masked = secret_values(None, ctx.secrets)
    fd, path = tempfile.mkstemp(prefix="raftsched-result-", suffix=".json")
    os.close(fd)
    try:
        argv = [sys.executable, "-m", "raftsched.sdk.child", ref, target, path]
        # What the child masks its outcome of before it cuts it, as an in-process run does: on its
        # stdin (never on disk, in its argv, nor in its environment, which /proc shows for good).
        secrets = json.dumps(dict(ctx.secrets)).encode() if ctx.secrets else None
        # Its pid: the child kills its process group once its parent is another (this worker died).
        ex = {"argv": argv, "env": {WORKER_PID_ENV: str(os.getpid())}}
        ok, error, printed = await run_shell(ex, ctx, timeout_s, cancel, kill_grace_s, stdin_data=secrets)
        result = _read_result(path, masked)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    duration_ms = int(round((time.monotonic() - t0) * 1000))
    if error is not None and (error == "lease lost" or error.startswith("timed out")):
        return Outcome(ok=False, error=f"{error}; {KILLED}", output=printed, duration_ms=duration_ms)
    if result is None:
        # It died before it could say (os._exit, a signal, a broken interpreter): what it printed
        # and its exit status are all there is.
        return Outcome(ok=False, error=short(f"the handler's process ended without an outcome ({error or 'exit 0'})"),
                       output=printed, duration_ms=duration_ms)
    output = result["output"] if not printed else tail_str(printed.rstrip("\n") + "\n" + result["output"], masked=masked)
    if result["ok"] and "result" in result:
        ctx.result = result["result"]  # reported with the success (worker/loop.py), as in-process
    return Outcome(ok=result["ok"], error=result["error"], output=output, duration_ms=duration_ms)


def _read_result(path: str, masked: Sequence[str] = ()) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = f.read(worker_limits.child_result_bytes_max + 1)
    except OSError:
        return None
    if not data or len(data) > worker_limits.child_result_bytes_max:
        return None
    try:
        res = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(res, dict) and isinstance(res.get("ok"), bool) and isinstance(res.get("output"), str)
            and (res.get("error") is None or isinstance(res["error"], str))):
        return None
    out = {"ok": res["ok"], "error": None if res["ok"] else short(res["error"] or "failed", masked=masked),
           "output": tail_str(res["output"], masked=masked, cut=may_be_cut(res["output"]))}
    if "result" in res:
        out["result"] = res["result"]  # checked again where it is reported (loop.run_result)
    return out
