"""Shared by the executor tests (tests/test_executors*.py): a run's identity, and running a
test coroutine or waiting for a condition under a deadline."""
from __future__ import annotations

import asyncio
import sys
import time

from raftsched.worker.executors import RunContext

PY = sys.executable
PAYLOAD = {"rows": [1, 2], "note": "caf\u00e9 $HOME;echo hi", "none": None}
SLOT_MS = 1_796_090_400_000  # 2026-12-01T02:00:00Z


def ctx(run_id: str = "r-1", payload=PAYLOAD) -> RunContext:
    return RunContext(run_id=run_id, job="nightly-report", slot_ms=SLOT_MS, attempt=2,
                      fencing_token=17, payload=payload)


def run(coro, timeout_s: float = 15.0):
    """Run one test coroutine under a deadline (a hang fails the test instead of the suite)."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def wait_until(cond, timeout_s: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop


def py(target: str) -> dict:
    return {"type": "python", "target": f"exec_targets:{target}"}


async def cancel_and_expect_cancelled(task: asyncio.Task) -> None:
    """Cancel ``task`` (a running execute) and check that the cancellation propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return
    raise AssertionError("a cancelled execute must propagate the cancellation")
