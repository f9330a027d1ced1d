"""Two Apps for the tests of ``raftsched worker --app`` (tests/test_sdk_worker.py, in process;
tests/test_sdk_worker_cluster.py, real processes): handlers that succeed, raise, and overrun
their timeout, plain and async.

A handler that blocks notes what it did in files under ``$SDK_WORKER_TEST_DIR`` (one per run
and event: ``<run>.started``, ``<run>.finished``, ``<run>.cancelled``, ``<run>.pid``), so a
test in another process can tell; it blocks until ``<run>.release`` exists, at most 30 s.
"""
from __future__ import annotations

import asyncio
import os
import time

from raftsched import App

#: the app whose plain handlers run in threads in the tests
app = App("sdk-worker-test", misfire="skip", retry={"max_attempts": 1}, history=100)
#: the same kind of handlers, run by a worker with --isolation subprocess
iso = App("sdk-worker-iso", misfire="skip", retry={"max_attempts": 1}, history=100)


def path_of(run_id: str, event: str) -> str:
    """The file that notes ``event`` of run ``run_id`` (under $SDK_WORKER_TEST_DIR)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return os.path.join(os.environ.get("SDK_WORKER_TEST_DIR", "/nonexistent"), f"{safe}.{event}")


def _note(ctx, event: str, text: str = "") -> None:
    if os.environ.get("SDK_WORKER_TEST_DIR"):
        # Written whole, then renamed into place: a test that waits for the file to exist reads
        # its text (a pid read from a file created but not written yet failed the any-year run).
        path = path_of(ctx.run_id, event)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def _released(ctx) -> bool:
    return os.path.exists(path_of(ctx.run_id, "release"))


def _context(ctx) -> dict:
    return {"run": ctx.run_id, "job": ctx.job, "attempt": ctx.attempt, "token": ctx.fencing_token,
            "worker": ctx.worker, "payload": ctx.payload, "logger": ctx.log.name, "pid": os.getpid(),
            "upstream": ctx.upstream}


@app.job("sw-sync", every_s=3600, payload={"k": "v"})
def hello(ctx):
    return _context(ctx)


@app.job("sw-async", every_s=3600)
async def ahello(ctx):
    await asyncio.sleep(0)  # ok-sleep: a yield to the loop it runs on
    return dict(_context(ctx), loop=type(asyncio.get_running_loop()).__name__)


@app.job("sw-boom", every_s=3600, retry={"max_attempts": 2, "backoff_s": 0})
def boom(ctx):
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


def _block(ctx) -> str:
    _note(ctx, "pid", str(os.getpid()))
    _note(ctx, "started")
    deadline = time.monotonic() + 30
    while not _released(ctx) and time.monotonic() < deadline:
        time.sleep(0.02)  # ok-sleep: polling a file another process creates, within a deadline
    _note(ctx, "finished")
    return "finished late"


@app.job("sw-stuck", every_s=3600, timeout_s=1)
def stuck(ctx):
    return _block(ctx)


@app.job("sw-astuck", every_s=3600, timeout_s=1)
async def astuck(ctx):
    _note(ctx, "started")
    try:
        await asyncio.sleep(30)  # ok-sleep: stands for awaited work that overruns its timeout
    except asyncio.CancelledError:
        _note(ctx, "cancelled")
        raise
    return "finished late"


@iso.job("si-sync", every_s=3600)
def iso_hello(ctx):
    print(f"hello from {os.getpid()}", flush=True)
    ctx.log.info("logged from the child")
    return _context(ctx)


@iso.job("si-boom", every_s=3600)
def iso_boom(ctx):
    raise ValueError(f"bad input {ctx.run_id}")


@iso.job("si-stuck", every_s=3600, timeout_s=1)
def iso_stuck(ctx):
    return _block(ctx)


@iso.job("si-peek", every_s=3600)
def iso_peek(ctx):
    """Where the child's process shows the job's secret (the payload names it) to itself and to
    what it starts: its environment (as /proc shows it for its whole life), its stdin, a
    subprocess's view of its parent."""
    import subprocess
    import sys
    secret = ctx.payload["secret_reversed"][::-1]  # (the payload itself is in the environment)
    with open("/proc/self/environ", "rb") as f:
        environ = f.read().decode(errors="replace")
    peek = subprocess.run([sys.executable, "-c", "import os,sys; print(open(f'/proc/{os.getppid()}/environ','rb')"
                           ".read().decode(errors='replace') + sys.stdin.read())"],
                          capture_output=True, text=True, timeout=30).stdout
    return {"proc_environ": secret in environ, "os_environ": secret in str(dict(os.environ)),
            "stdin": secret in sys.stdin.read(), "subprocess": secret in peek,
            "run_id_seen": "RAFTSCHED_RUN_ID" in environ}


#: An app of its own, so the apps above keep their job counts.
secret_app = App("sdk-worker-secret", misfire="skip", retry={"max_attempts": 1})


@secret_app.job("si-secret", every_s=3600, secrets={"PW": "from-ci-store"})
def iso_secret(ctx):
    """Reads its job's secret as ctx.secrets, and prints it (which the outcome masks)."""
    print("the password is", ctx.secrets["PW"])
    try:
        ctx.secrets["PW"] = "x"  # read-only
        writable = True
    except TypeError:
        writable = False
    return {"len": len(ctx.secrets["PW"]), "names": sorted(ctx.secrets), "writable": writable,
            "in_repr": ctx.secrets["PW"] in repr(ctx), "in_env": ctx.secrets["PW"] in str(ctx.env())}
