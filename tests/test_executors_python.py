"""The python executor (DESIGN.md section 6), through both of its entry points: execute() and
execute_soon(), the worker's fast path for plain functions already imported.

Real imports and real run threads; no fixed sleeps: every wait is for an event or a condition,
under a deadline.
"""
from __future__ import annotations

import asyncio
import threading
import time

import exec_targets
from executor_helpers import PAYLOAD, cancel_and_expect_cancelled, ctx, py, run, wait_until
from raftsched.worker.executors import CancelEvent, Outcome, RunContext, execute, run_function


def test_python_sync_function_gets_the_context_in_a_thread():
    out = run(execute(py("record_sync"), ctx("py-sync"), 10))
    assert out.ok and out.error is None, out
    assert out.output == repr({"rows": 3, "run": "py-sync"})
    [rec] = exec_targets.RECORDED["py-sync"]
    assert (rec["job"], rec["attempt"], rec["fencing_token"], rec["payload"]) == ("nightly-report", 2, 17, PAYLOAD)
    assert rec["env"] == ctx("py-sync").env()
    assert rec["thread"] is not threading.main_thread()  # not on the worker's event loop


def test_python_async_function_is_awaited_on_the_loop():
    async def t():
        out = await execute(py("record_async"), ctx("py-async"), 10)
        assert out.ok and out.output == repr(["done", 17]), out
        [rec] = exec_targets.RECORDED["py-async"]
        assert rec["loop"] is asyncio.get_running_loop()
        assert rec["fencing_token"] == 17 and rec["payload"] == PAYLOAD
        # A plain function that returns a coroutine: the coroutine is awaited too.
        out = await execute(py("returns_coroutine"), ctx("py-coro"), 10)
        assert out.ok and out.output == repr(["done", 17]), out
    run(t())


def test_python_exceptions_are_failures():
    out = run(execute(py("boom"), ctx("py-boom"), 10))
    assert (out.ok, out.error) == (False, "ValueError: bad input py-boom")
    assert out.output.startswith("Traceback") and "exec_targets.py" in out.output and "bad input" in out.output
    out = run(execute(py("boom_async"), ctx(), 10))
    assert (out.ok, out.error) == (False, "KeyError: 'missing'")

    async def t():
        # SystemExit from a job ends the run, not the worker's event loop.
        for target, code in (("sys_exit", 3), ("sys_exit_async", 4)):
            out = await execute(py(target), ctx(), 10)
            assert (out.ok, out.error) == (False, f"SystemExit: {code}")
        await asyncio.sleep(0)  # ok-sleep: still running
    run(t())


def test_python_bad_targets_fail_without_raising():
    out = run(execute({"type": "python", "target": "raftsched_no_such_module:f"}, ctx(), 10))
    assert (out.ok, out.error) == (False, "ModuleNotFoundError: No module named 'raftsched_no_such_module'")
    out = run(execute(py("nope"), ctx(), 10))
    assert (out.ok, out.error) == (False, "AttributeError: module 'exec_targets' has no attribute 'nope'")
    out = run(execute(py("NOT_CALLABLE"), ctx(), 10))
    assert (out.ok, out.error) == (False, "TypeError: exec_targets:NOT_CALLABLE is not callable")
    out = run(execute({"type": "python", "target": "no-colon"}, ctx(), 10))
    assert not out.ok and out.error.startswith("ValueError: ")


def test_python_async_timeout_and_cancel_cancel_the_coroutine():
    async def t():
        exec_targets.STARTED["py-slow"] = asyncio.Event()
        out = await execute(py("slow_async"), ctx("py-slow"), 0.3)
        assert (out.ok, out.error) == (False, "timed out after 0.3s")
        assert [r["kind"] for r in exec_targets.RECORDED["py-slow"]] == ["started", "cancelled"]

        exec_targets.STARTED["py-lease"] = started = asyncio.Event()
        cancel = asyncio.Event()
        task = asyncio.create_task(execute(py("slow_async"), ctx("py-lease"), 30, cancel=cancel))
        await asyncio.wait_for(started.wait(), 5)
        cancel.set()
        out = await asyncio.wait_for(task, 5)
        assert (out.ok, out.error) == (False, "lease lost")
        assert [r["kind"] for r in exec_targets.RECORDED["py-lease"]] == ["started", "cancelled"]
    run(t())


def test_python_coroutine_ignoring_cancellation_is_abandoned_after_the_grace():
    async def t():
        exec_targets.STARTED["py-stubborn"] = asyncio.Event()
        t0 = time.monotonic()
        out = await execute(py("stubborn_async"), ctx("py-stubborn"), 0.2, kill_grace_s=0.3)
        assert (out.ok, out.error) == (False, "timed out after 0.2s")
        assert time.monotonic() - t0 < 2
        assert [r["kind"] for r in exec_targets.RECORDED["py-stubborn"]] == ["started", "ignored cancel"]
        # (asyncio.run cancels the abandoned task again at exit; this time it ends.)
    run(t())


def test_python_sync_timeout_abandons_the_thread():
    async def t():
        exec_targets.RELEASE["py-block"] = release = threading.Event()
        out = await execute(py("blocking"), ctx("py-block"), 0.3)
        assert (out.ok, out.error) == (False, "timed out after 0.3s")
        recs = exec_targets.RECORDED["py-block"]
        assert [r["kind"] for r in recs] == ["started"]  # still running: a thread cannot be killed
        thread = recs[0]["thread"]
        assert thread.is_alive() and thread.daemon and thread.name == "raftsched-run-py-block"
        # The abandoned thread delays no other run: the next one gets another thread at once.
        out = await execute(py("record_sync"), ctx("py-after-block"), 10)
        assert out.ok, out
        assert exec_targets.RECORDED["py-after-block"][0]["thread"] is not thread
        release.set()
        await wait_until(lambda: [r["kind"] for r in recs] == ["started", "finished"], 5, "the function to return")
        # Returned: the thread goes back to the pool for the next run.
        await wait_until(lambda: thread.name.startswith("raftsched-run-idle-"), 5, "the thread to be idle")
    run(t())


def test_python_threads_are_reused_and_idle_ones_exit():
    from raftsched.worker.executors._threads import RunThreads

    async def t():
        # One run after another: each takes the thread the one before it left idle.
        before = {th for th in threading.enumerate() if th.name.startswith("raftsched-run-")}
        for k in range(50):
            out = await execute(py("record_sync"), ctx(f"py-seq-{k}"), 10)
            assert out.ok, out
        used = {exec_targets.RECORDED[f"py-seq-{k}"][0]["thread"] for k in range(50)}
        assert len(used - before) <= 1, used - before
        # Runs at once: a thread each (a blocked or abandoned run never holds up another).
        outs = await asyncio.gather(*(execute(py("record_sync"), ctx(f"py-par-{k}"), 10) for k in range(20)))
        assert all(o.ok for o in outs), outs
    run(t())

    # A pool's thread exits once idle for idle_s; a job never waits for a busy thread.
    pool = RunThreads(idle_s=0.2)
    gate, done = threading.Event(), []
    pool.submit(lambda: (gate.wait(10), done.append("blocked"), lambda: None)[-1])
    pool.submit(lambda: (done.append(threading.current_thread()), lambda: None)[-1])
    deadline = time.monotonic() + 5
    while len(done) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # ok-sleep: polling inside a deadline loop
    assert len(done) == 1 and done[0] is not None  # ran while the first job blocks its thread
    worker = done[0]
    gate.set()
    worker.join(5)
    assert not worker.is_alive()
    deadline = time.monotonic() + 5
    while pool._idle and time.monotonic() < deadline:
        time.sleep(0.01)  # ok-sleep: polling inside a deadline loop
    assert pool._idle == 0 and done[1] == "blocked"


def test_python_target_already_imported_resolves_without_a_thread():
    from raftsched.worker.executors import python as executors

    assert executors._imported("builtins:id") is id
    assert executors._imported("exec_targets:record_sync") is exec_targets.record_sync
    for target in ("exec_targets:nope", "exec_targets:NOT_CALLABLE", "raftsched_no_such_module:f", "no-colon",
                   ":f", "exec_targets:"):
        assert executors._imported(target) is None, target  # resolved (and refused) in a thread


def test_python_import_is_raced_against_the_deadline_and_the_cancel_event():
    import sys as _sys

    async def t():
        spec = {"type": "python", "target": "exec_slow_import:imported"}
        assert "exec_slow_import" not in _sys.modules
        # Lease lost while the module's code runs: the run ends at once; the import goes on.
        cancel = asyncio.Event()
        task = asyncio.create_task(execute(spec, ctx("py-import-lease"), 30, cancel=cancel))
        await wait_until(lambda: "exec_slow_import" in _sys.modules, 5, "the import to start")
        cancel.set()
        out = await asyncio.wait_for(task, 5)
        assert (out.ok, out.error) == (False, "lease lost")
        # Still importing: the next run waits for that import in a thread of its own, within
        # its deadline.
        t0 = time.monotonic()
        out = await execute(spec, ctx("py-import-slow"), 0.3)
        assert (out.ok, out.error) == (False, "timed out after 0.3s") and time.monotonic() - t0 < 2
        exec_targets.IMPORT_GATE.set()
        await wait_until(lambda: not getattr(_sys.modules["exec_slow_import"].__spec__, "_initializing", False)
                         and hasattr(_sys.modules["exec_slow_import"], "imported"), 5, "the import to finish")
        out = await execute(spec, ctx("py-import-done"), 10)
        assert (out.ok, out.output) == (True, repr("imported")), out
    run(t())


def test_python_caller_cancellation_cancels_the_coroutine_at_once_and_propagates():
    async def t():
        exec_targets.STARTED["py-caller"] = started = asyncio.Event()
        task = asyncio.create_task(execute(py("slow_async"), ctx("py-caller"), 30, kill_grace_s=30))
        await asyncio.wait_for(started.wait(), 5)
        await cancel_and_expect_cancelled(task)
        # No grace for a caller's cancellation: the coroutine is cancelled, not waited for.
        await wait_until(lambda: [r["kind"] for r in exec_targets.RECORDED["py-caller"]] == ["started", "cancelled"],
                         2, "the coroutine to be cancelled")
    run(t())


def test_python_caller_cancellation_abandons_the_thread_quietly():
    async def t():
        errors = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        exec_targets.RELEASE["py-caller-block"] = release = threading.Event()
        task = asyncio.create_task(execute(py("blocking"), ctx("py-caller-block"), 30))
        await wait_until(lambda: exec_targets.RECORDED.get("py-caller-block"), 5, "the function to start")
        await cancel_and_expect_cancelled(task)
        # The function returns later: what it returns goes nowhere, and raises nothing on the loop.
        release.set()
        recs = exec_targets.RECORDED["py-caller-block"]
        await wait_until(lambda: [r["kind"] for r in recs] == ["started", "finished"], 5, "the function to return")
        await wait_until(lambda: recs[0]["thread"].name.startswith("raftsched-run-idle-"), 5, "the thread to be idle")
        await asyncio.sleep(0.05)  # ok-sleep: a late delivery would come within a loop turn or two
        assert errors == []
    run(t())


def test_python_awaitable_returned_by_a_plain_function_keeps_the_deadline_and_the_cancel_event():
    from raftsched.worker.executors import CancelEvent

    async def t():
        for way, run_id in (("execute", "py-ret-slow"), ("soon", "soon-ret-slow")):
            exec_targets.STARTED[run_id] = asyncio.Event()
            t0 = time.monotonic()
            if way == "execute":
                out = await execute(py("returns_slow_coroutine"), ctx(run_id), 0.3, cancel=CancelEvent())
            else:
                out = await soon(py("returns_slow_coroutine"), ctx(run_id), 0.3, cancel=CancelEvent())
            assert (out.ok, out.error) == (False, "timed out after 0.3s"), (way, out)
            assert time.monotonic() - t0 < 2
            assert [r["kind"] for r in exec_targets.RECORDED[run_id]] == ["started", "cancelled"], way

            lease_id = run_id + "-lease"
            exec_targets.STARTED[lease_id] = started = asyncio.Event()
            cancel = CancelEvent()
            if way == "execute":
                task = asyncio.ensure_future(execute(py("returns_slow_coroutine"), ctx(lease_id), 30, cancel=cancel))
            else:
                task = asyncio.ensure_future(soon(py("returns_slow_coroutine"), ctx(lease_id), 30, cancel=cancel))
            await asyncio.wait_for(started.wait(), 5)
            cancel.set()
            out = await asyncio.wait_for(task, 5)
            assert (out.ok, out.error) == (False, "lease lost"), (way, out)
            assert [r["kind"] for r in exec_targets.RECORDED[lease_id]] == ["started", "cancelled"], way
            assert cancel._callbacks == []
    run(t())


def test_python_task_cancelled_from_elsewhere_is_an_executor_error():
    async def t():
        outs = [await execute(py("cancels_own_task"), ctx(), 10),
                await soon(py("returns_self_cancelling"), ctx(), 10)]
        for out in outs:
            assert (out.ok, out.error) == (False, "executor error: RuntimeError: the run's task was cancelled from elsewhere"), out
        await asyncio.sleep(0)  # ok-sleep: the caller's task was not cancelled; it still runs
    run(t())


# ---------------------------------------------------------------------------------------------
# execute_soon: the same contract without a task per run

async def soon(spec, c: RunContext, timeout_s, **kw) -> Outcome:
    """execute_soon, awaited: asserts it took the run and returns its one Outcome."""
    from raftsched.worker.executors import execute_soon
    done = asyncio.get_running_loop().create_future()
    outcomes = []

    def on_done(out):
        outcomes.append(out)
        if not done.done():
            done.set_result(out)

    assert execute_soon(spec, c, timeout_s, on_done, **kw) is True
    out = await asyncio.wait_for(done, timeout_s + 5)
    await asyncio.sleep(0.05)  # ok-sleep: a second on_done would come within a loop turn or two
    assert outcomes == [out]
    return out


def test_execute_soon_gives_the_outcomes_of_execute():
    from raftsched.worker.executors import CancelEvent

    async def t():
        import exec_targets as _  # noqa: F401 - imported: execute_soon takes an imported module's function
        for target, run_id in (("record_sync", "soon-ok"), ("boom", "soon-boom"), ("sys_exit", "soon-exit"),
                               ("returns_coroutine", "soon-coro")):
            a = await soon(py(target), ctx(run_id), 10, cancel=CancelEvent())
            b = await execute(py(target), ctx(run_id), 10, cancel=CancelEvent())
            assert (a.ok, a.error, a.output) == (b.ok, b.error, b.output), (target, a, b)
        rec = exec_targets.RECORDED["soon-ok"][0]
        assert rec["env"] == ctx("soon-ok").env() and rec["thread"] is not threading.main_thread()
        out = await soon({"type": "python", "target": "builtins:id"}, ctx(), 10)
        assert out.ok and int(out.output) > 0
    run(t())


def test_execute_soon_timeout_and_cancel_settle_once_and_abandon_the_thread():
    from raftsched.worker.executors import CancelEvent

    async def t():
        exec_targets.RELEASE["soon-block"] = release = threading.Event()
        cancel = CancelEvent()
        t0 = time.monotonic()
        out = await soon(py("blocking"), ctx("soon-block"), 0.3, cancel=cancel)
        assert (out.ok, out.error) == (False, "timed out after 0.3s") and time.monotonic() - t0 < 2
        assert cancel._callbacks == []  # nothing left registered on the run's event
        assert [r["kind"] for r in exec_targets.RECORDED["soon-block"]] == ["started"]
        release.set()  # returns later: nothing more is reported (soon() checks on_done ran once)
        await wait_until(lambda: len(exec_targets.RECORDED["soon-block"]) == 2, 5, "the function to return")

        exec_targets.RELEASE["soon-lease"] = release = threading.Event()
        cancel = CancelEvent()
        task = asyncio.ensure_future(soon(py("blocking"), ctx("soon-lease"), 30, cancel=cancel))
        await wait_until(lambda: exec_targets.RECORDED.get("soon-lease"), 5, "the function to start")
        cancel.set()
        out = await asyncio.wait_for(task, 5)
        assert (out.ok, out.error) == (False, "lease lost")
        release.set()
    run(t())


def test_execute_soon_declines_what_it_does_not_run_fast():
    from raftsched.worker.executors import CancelEvent, execute_soon

    async def t():
        calls = []
        cancelled = CancelEvent()
        cancelled.set()
        for spec, kw in (({"type": "shell", "argv": ["true"]}, {}),
                         (py("record_async"), {}),  # a coroutine function runs on the loop
                         ({"type": "python", "target": "raftsched_no_such_module:f"}, {}),  # not imported
                         (py("nope"), {}),
                         (py("record_sync"), {"cancel": asyncio.Event()}),  # not a CancelEvent
                         (py("record_sync"), {"cancel": cancelled}),  # already set: execute() says so
                         (py("record_sync"), {"allowed_types": frozenset({"shell"})}),
                         ({"type": "python", "target": 42}, {}), (None, {})):
            assert execute_soon(spec, ctx("soon-declined"), 10, calls.append, **kw) is False, spec
        await asyncio.sleep(0.05)  # ok-sleep: nothing may run or report in the meantime
        assert calls == [] and "soon-declined" not in exec_targets.RECORDED
    run(t())


# ---------------------------------------------------------------------------- run_function
def test_run_function_runs_a_held_function_as_the_executor_runs_a_target():
    """The same run for a function the caller holds (an SDK App's handler): plain in a thread,
    async on the loop, the repr or the traceback as the output."""
    async def t():
        out = await run_function(exec_targets.record_sync, ctx("fn-sync"), 10, None, name="exec_targets:record_sync")
        assert out.ok and out.output == repr({"rows": 3, "run": "fn-sync"}) and out.linger is None, out
        assert exec_targets.RECORDED["fn-sync"][0]["thread"] is not threading.main_thread()
        out = await run_function(exec_targets.record_async, ctx("fn-async"), 10, None, name="exec_targets:record_async")
        assert out.ok and out.output == repr(["done", 17]), out
        assert exec_targets.RECORDED["fn-async"][0]["loop"] is asyncio.get_running_loop()
        out = await run_function(exec_targets.boom, ctx("fn-boom"), 10, None, name="exec_targets:boom", linger=True)
        assert (out.ok, out.error) == (False, "ValueError: bad input fn-boom") and out.output.startswith("Traceback")
    run(t())


def test_a_lingering_plain_function_fails_saying_its_thread_still_runs_and_tells_when_it_ends():
    async def t():
        exec_targets.RELEASE["fn-linger"] = threading.Event()
        out = await run_function(exec_targets.blocking, ctx("fn-linger"), 0.3, None, name="exec_targets:blocking",
                                 linger=True)
        assert (out.ok, out.error) == (False, "timed out after 0.3s; the handler's thread could not be stopped "
                                              "and is still running"), out
        assert out.linger is not None and not out.linger.done()
        exec_targets.RELEASE["fn-linger"].set()
        await asyncio.wait_for(out.linger, 10)
        last = exec_targets.RECORDED["fn-linger"][-1]
        assert (last["kind"], last["released"]) == ("finished", True)
        # Lease lost: the same, with its own reason.
        exec_targets.RELEASE["fn-linger-lost"] = threading.Event()
        cancel = CancelEvent()
        task = asyncio.ensure_future(run_function(exec_targets.blocking, ctx("fn-linger-lost"), 30, cancel,
                                                  name="exec_targets:blocking", linger=True))
        await wait_until(lambda: exec_targets.RECORDED.get("fn-linger-lost"), what="the run to start")
        cancel.set()
        out = await task
        assert out.error == "lease lost; the handler's thread could not be stopped and is still running", out
        exec_targets.RELEASE["fn-linger-lost"].set()
        await asyncio.wait_for(out.linger, 10)
        # An async function is cancelled: nothing lingers.
        exec_targets.STARTED["fn-linger-async"] = asyncio.Event()
        out = await run_function(exec_targets.slow_async, ctx("fn-linger-async"), 0.3, None,
                                 name="exec_targets:slow_async", linger=True)
        assert (out.error, out.linger) == ("timed out after 0.3s", None), out
        assert exec_targets.RECORDED["fn-linger-async"][-1]["kind"] == "cancelled"
    run(t())
