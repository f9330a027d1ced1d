"""Targets for the python executor in tests/test_executors_python.py (and tests/test_worker.py, below).

Each target records what it received in ``RECORDED`` (keyed by run id), so a test can check the
RunContext, the thread and the cancellation a target saw. Tests that need to synchronise with a
running target put an event in ``STARTED`` / ``RELEASE`` under the run id first.
"""
from __future__ import annotations

import asyncio
import threading

RECORDED: dict[str, list[dict]] = {}
#: run id -> asyncio.Event (async targets) set once the target is running.
STARTED: dict[str, asyncio.Event] = {}
#: run id -> threading.Event the blocking target waits for.
RELEASE: dict[str, threading.Event] = {}

NOT_CALLABLE = 42


def _record(ctx, **extra) -> None:
    RECORDED.setdefault(ctx.run_id, []).append({
        "run_id": ctx.run_id,
        "job": ctx.job,
        "attempt": ctx.attempt,
        "fencing_token": ctx.fencing_token,
        "payload": ctx.payload,
        "env": ctx.env(),
        "thread": threading.current_thread(),
        **extra,
    })


def record_sync(ctx):
    _record(ctx, kind="sync")
    return {"rows": 3, "run": ctx.run_id}


async def record_async(ctx):
    _record(ctx, kind="async", loop=asyncio.get_running_loop())
    await asyncio.sleep(0)  # ok-sleep: a yield, so the coroutine is really asynchronous
    return ["done", ctx.fencing_token]


def returns_coroutine(ctx):
    """A plain function that returns an awaitable: the executor awaits it."""
    return record_async(ctx)


def boom(ctx):
    raise ValueError(f"bad input {ctx.run_id}")


def login_refused(ctx):
    raise RuntimeError("login refused for password " + ctx.secrets["PW"])


def returns_escaped_secret(ctx):
    """The secret where a repr escapes it: in a dataclass-like object's repr, and as bytes."""
    class Creds:
        def __init__(self, pw):
            self.pw = pw

        def __repr__(self):
            return f"Creds(pw={self.pw!r})"
    return {"creds": repr(Creds(ctx.secrets["PW"])), "raw": ctx.secrets["PW"].encode()}


def key_error_of_secret(ctx):
    raise KeyError(ctx.secrets["PW"])


async def boom_async(ctx):
    await asyncio.sleep(0)  # ok-sleep: a yield, so the coroutine is really asynchronous
    raise KeyError("missing")


def sys_exit(ctx):
    raise SystemExit(3)


async def sys_exit_async(ctx):
    raise SystemExit(4)


async def slow_async(ctx):
    _record(ctx, kind="started")
    STARTED[ctx.run_id].set()
    try:
        await asyncio.Event().wait()  # forever
    except asyncio.CancelledError:
        _record(ctx, kind="cancelled")
        raise


def blocking(ctx):
    _record(ctx, kind="started")
    released = RELEASE[ctx.run_id].wait(30)
    _record(ctx, kind="finished", released=released)
    return "late"


async def stubborn_async(ctx):
    """Swallows the first cancellation and keeps going (until cancelled again)."""
    _record(ctx, kind="started")
    STARTED[ctx.run_id].set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        _record(ctx, kind="ignored cancel")
    await asyncio.Event().wait()


def returns_slow_coroutine(ctx):
    """A plain function that returns a coroutine that waits until it is cancelled."""
    return slow_async(ctx)


async def cancels_own_task(ctx):
    """Cancels the task it runs in (as code that cancels "the current task" by mistake would)."""
    asyncio.current_task().cancel()
    await asyncio.sleep(0)  # ok-sleep: a yield, where the cancellation is delivered


def returns_self_cancelling(ctx):
    return cancels_own_task(ctx)


#: exec_slow_import waits for this event while it is being imported.
IMPORT_GATE = threading.Event()


# Targets for tests/test_worker.py -----------------------------------------------------------

#: concurrent(): how many run at this moment, and the most that ever ran at once.
CONCURRENCY = {"now": 0, "max": 0}
_concurrency_lock = threading.Lock()
#: gate() waits for this event (set it to let every gated run return).
GATE = threading.Event()


def concurrent(ctx):
    """Runs for a few milliseconds, counting how many run at once."""
    with _concurrency_lock:
        CONCURRENCY["now"] += 1
        CONCURRENCY["max"] = max(CONCURRENCY["max"], CONCURRENCY["now"])
    try:
        GATE.wait(0.005)  # a short, blocking run (GATE unset: the full 5 ms)
    finally:
        with _concurrency_lock:
            CONCURRENCY["now"] -= 1
    _record(ctx, kind="concurrent")


def gate(ctx):
    _record(ctx, kind="started")
    GATE.wait(30)
    _record(ctx, kind="finished")


def sleepy(ctx):
    """A run much longer than an in-process acquire."""
    threading.Event().wait(0.15)
    _record(ctx, kind="slept")
