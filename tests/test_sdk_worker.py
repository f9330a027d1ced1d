"""``raftsched worker --app`` in process (raftsched/sdk/worker.py): which executor a grant gets
(the app's handler, or a visible refusal), and how a handler's end becomes the attempt's
outcome, plain and async, in a thread or in a child process. tests/test_sdk_worker_cluster.py
runs the same against real nodes."""
from __future__ import annotations

import asyncio
import os

import pytest

import sdk_worker_app
from executor_helpers import run, wait_until
import procs
from procs import REPO
from raftsched.worker.executors import CancelEvent, RunContext
from raftsched.sdk import APP_LABEL
from raftsched.sdk.worker import AppExecutors

TESTS = REPO / "tests"
SLOT_MS = 1_800_000_000_000


def grant(job: str, target: str | None = None, *, app=sdk_worker_app.app, executor=None, run_id=None) -> dict:
    decl = app.jobs.get(job)
    ex = executor or {"type": "python", "target": target or decl.target}
    return {"id": run_id or f"{job}@{SLOT_MS}", "job": job, "slot": SLOT_MS, "attempt": 1, "token": 7,
            "payload": {"k": "v"}, "executor": ex, "timeout_s": decl.spec["timeout_s"] if decl else 600}


def ctx_of(g: dict) -> RunContext:
    return RunContext(run_id=g["id"], job=g["job"], slot_ms=g["slot"], attempt=g["attempt"], fencing_token=g["token"],
                      payload=g["payload"], worker_id="w-test")


async def execute(lookup: AppExecutors, g: dict, cancel: CancelEvent | None = None, timeout_s: float | None = None):
    return await lookup(g)(ctx_of(g), g["timeout_s"] if timeout_s is None else timeout_s, cancel or CancelEvent())


@pytest.fixture
def notes(tmp_path, monkeypatch):
    monkeypatch.setenv("SDK_WORKER_TEST_DIR", str(tmp_path))
    return tmp_path


def test_a_grant_of_one_of_the_apps_handlers_runs_it_with_its_context():
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")
    assert lookup.labels == {APP_LABEL: "sdk-worker-test"} and lookup.unplaced() == []

    async def t():
        g = grant("sw-sync")
        out = await execute(lookup, g)
        assert out.ok and out.error is None, out
        got = eval(out.output)  # the python executor's repr of what it returned
        assert got == {"run": g["id"], "job": "sw-sync", "attempt": 1, "token": 7, "worker": "w-test",
                       "payload": {"k": "v"}, "logger": "raftsched.job.sw-sync", "pid": os.getpid(),
                       "upstream": None}
        out = await execute(lookup, grant("sw-async"))
        assert out.ok and "'loop': " in out.output and "'worker': 'w-test'" in out.output, out
    run(t())


def test_a_raising_handler_fails_with_the_exception_and_its_traceback():
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")
    out = run(execute(lookup, grant("sw-boom")))
    assert (out.ok, out.error) == (False, "RuntimeError: boom on attempt 1")
    assert out.output.startswith("Traceback") and "sdk_worker_app.py" in out.output and "in boom" in out.output


def test_a_grant_the_app_has_no_handler_for_fails_naming_what_is_missing():
    """A job synced from a newer version of the app than the worker runs (a handler this one
    does not declare), or a job placed on the app's label that is not python: refused visibly,
    nothing runs, and the job's retry policy decides what follows."""
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")
    out = run(execute(lookup, grant("sw-new", "sdk_worker_app:new_handler")))
    assert not out.ok and "has no handler 'sdk_worker_app:new_handler' for job 'sw-new'" in out.error, out
    assert "app 'sdk-worker-test'" in out.error and "a version of the app that does not declare it" in out.error
    out = run(execute(lookup, grant("sw-shell", executor={"type": "shell", "argv": ["true"]})))
    assert not out.ok and "its executor is 'shell'" in out.error, out
    # Another app's handler is not this app's, even in the same module.
    out = run(execute(lookup, grant("si-sync", app=sdk_worker_app.iso)))
    assert not out.ok and "has no handler 'sdk_worker_app:iso_hello'" in out.error
    assert lookup.refused == 3


def test_a_plain_handler_past_its_timeout_fails_and_keeps_its_slot_until_its_thread_ends(notes):
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")

    async def t():
        g = grant("sw-stuck")
        out = await execute(lookup, g, timeout_s=0.3)
        assert out.error == "timed out after 0.3s; the handler's thread could not be stopped and is still running"
        assert out.linger is not None and not out.linger.done()
        assert os.path.exists(sdk_worker_app.path_of(g["id"], "started"))
        open(sdk_worker_app.path_of(g["id"], "release"), "w").close()
        await asyncio.wait_for(out.linger, 10)  # its thread returned: the slot is free
        assert os.path.exists(sdk_worker_app.path_of(g["id"], "finished"))
    run(t())


def test_an_async_handler_past_its_timeout_is_cancelled(notes):
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")

    async def t():
        g = grant("sw-astuck")
        out = await execute(lookup, g, timeout_s=0.3)
        assert (out.ok, out.error, out.linger) == (False, "timed out after 0.3s", None), out
        assert os.path.exists(sdk_worker_app.path_of(g["id"], "cancelled"))
    run(t())


async def execute_soon(lookup: AppExecutors, g: dict, timeout_s: float | None = None, cancel=None):
    """The lease loop's way for an in-process handler (``soon``): started by callbacks, its one
    Outcome handed to ``on_done`` on the loop."""
    done = asyncio.get_running_loop().create_future()
    ex = lookup(g)
    assert ex.soon(ctx_of(g), g["timeout_s"] if timeout_s is None else timeout_s, cancel or CancelEvent(),
                   done.set_result)  # a second call would raise InvalidStateError on the loop
    return await asyncio.wait_for(done, 10)


def test_an_in_process_handler_started_by_callbacks_ends_as_when_awaited(notes):
    """``soon`` (no task of the lease loop's a run) gives the Outcome the awaited executor gives:
    a return, a raise, an async timeout, a plain handler's thread that outlives its timeout; and
    starts nothing for a cancel event already set."""
    lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")

    async def t():
        out = await execute_soon(lookup, grant("sw-sync"))
        assert out.ok and eval(out.output)["job"] == "sw-sync", out
        out = await execute_soon(lookup, grant("sw-async"))
        assert out.ok and "'loop': " in out.output, out
        out = await execute_soon(lookup, grant("sw-boom"))
        assert (out.ok, out.error) == (False, "RuntimeError: boom on attempt 1")
        g = grant("sw-astuck")
        out = await execute_soon(lookup, g, timeout_s=0.3)
        assert (out.ok, out.error, out.linger) == (False, "timed out after 0.3s", None), out
        g = grant("sw-stuck")
        out = await execute_soon(lookup, g, timeout_s=0.3)
        assert out.linger is not None and not out.linger.done()
        open(sdk_worker_app.path_of(g["id"], "release"), "w").close()
        await asyncio.wait_for(out.linger, 10)
        cancelled = CancelEvent()
        cancelled.set()
        assert lookup(grant("sw-sync")).soon(ctx_of(grant("sw-sync")), 5, cancelled, lambda out: None) is False
    run(t())


# ---------------------------------------------------------------------------- a child per run
@pytest.fixture
def child_env(notes, monkeypatch):
    # The child imports the app as the worker does: from its working directory and PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    return notes


def test_in_a_child_process_a_handler_reports_what_it_returned_or_raised(child_env):
    lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app:iso", isolation="subprocess")

    async def t():
        g = grant("si-sync", app=sdk_worker_app.iso)
        ctx = ctx_of(g)
        ctx.upstream = [{"job": "extract", "run": f"extract@{SLOT_MS}", "outcome": "succeeded", "token": 3,
                         "result": {"rows": 3}}]
        out = await lookup(g)(ctx, g["timeout_s"], CancelEvent())
        assert out.ok, out
        printed, logged, result = out.output.splitlines()
        got = eval(result)
        assert printed == f"hello from {got['pid']}" and got["pid"] != os.getpid()
        # the child sees its parents (ctx.upstream), and what it returned is its result, handed
        # to its own children as an in-process run's is (pipelines)
        assert got["upstream"] == ctx.upstream and ctx.result == got
        assert logged.endswith(" INFO raftsched.job.si-sync: logged from the child"), logged
        assert {k: got[k] for k in ("run", "job", "attempt", "token", "worker", "payload")} == \
               {"run": g["id"], "job": "si-sync", "attempt": 1, "token": 7, "worker": "w-test", "payload": {"k": "v"}}
        out = await execute(lookup, grant("si-boom", app=sdk_worker_app.iso))
        assert (out.ok, out.error) == (False, f"ValueError: bad input si-boom@{SLOT_MS}"), out
        assert "Traceback" in out.output and "in iso_boom" in out.output
        # An async handler is not sent to a child: it is cancelled on the loop instead.
        thread_lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app", isolation="subprocess")
        out = await execute(thread_lookup, grant("sw-async"))
        assert out.ok and f"'pid': {os.getpid()}" in out.output
    run(t())


@pytest.mark.parametrize("isolation", ["thread", "subprocess"])
def test_a_handlers_outcome_is_masked_of_the_jobs_secrets_before_it_is_cut(child_env, isolation):
    """As a python run's (tests/test_sandbox.py): a secret with two spaces in the exception is
    masked before the reason is made one line, and one in a long returned string before reprlib
    keeps its first characters only; in a child too, which is given the secrets to mask with."""
    lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app:iso", isolation=isolation)
    spaced, cut = "open  sesame", "A" * 20 + "-TAILPART-0123456789"

    async def t():
        g = grant("si-boom", app=sdk_worker_app.iso, run_id="r  open  sesame")
        ctx = ctx_of(g)
        ctx.secrets = {"PW": spaced}
        boom = await lookup(g)(ctx, g["timeout_s"], CancelEvent())
        g = grant("si-sync", app=sdk_worker_app.iso)
        g["payload"] = {"k": "y" * 4080 + cut}
        ctx = ctx_of(g)
        ctx.secrets = {"PW": cut}
        hello = await lookup(g)(ctx, g["timeout_s"], CancelEvent())
        return boom, hello
    boom, hello = run(t())
    assert (boom.ok, boom.error) == (False, "ValueError: bad input r ***"), boom
    assert "sesame" not in boom.output and "bad input r  ***" in boom.output
    assert hello.ok and "yyyy" in hello.output, hello
    assert "TAILPART" not in hello.output and "AAAA" not in hello.output, hello.output[-80:]


@pytest.mark.parametrize("isolation", ["thread", "subprocess"])
def test_a_handler_reads_its_jobs_secrets_as_ctx_secrets(child_env, isolation):
    """docs/security.md: a python function gets its job's secrets as ``ctx.secrets``; an SDK
    handler too, in the worker's process or in a child: read-only, in no repr nor ctx.env(),
    and masked in what the run prints."""
    lookup = AppExecutors(sdk_worker_app.secret_app, "sdk_worker_app:secret_app", isolation=isolation)
    secret = "s3cr3t-value-0123"

    async def t():
        g = grant("si-secret", app=sdk_worker_app.secret_app)
        g["secrets"] = {"PW": secret}
        ctx = ctx_of(g)
        ctx.secrets = {"PW": secret}  # (what worker/loop.py gives the run context)
        out = await lookup(g)(ctx, g["timeout_s"], CancelEvent())
        return out, ctx
    out, ctx = run(t())
    assert out.ok, out
    assert ctx.result == {"len": len(secret), "names": ["PW"], "writable": False, "in_repr": False,
                          "in_env": False}, ctx.result
    assert secret not in out.output, out.output
    if isolation == "subprocess":  # (in the worker's process, prints go to its own stdout)
        assert "the password is ***" in out.output, out.output


def test_a_child_holds_its_jobs_secrets_nowhere_another_process_reads_them(child_env):
    """Given in its environment, they stayed in /proc/PID/environ for the child's whole life,
    readable by any process of the user, its handler's subprocesses too: on its stdin they are
    read once, before the app is imported."""
    lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app:iso", isolation="subprocess")
    secret = "peek-a-boo-0123456789"

    async def t():
        g = grant("si-peek", app=sdk_worker_app.iso)
        g["payload"] = {"secret_reversed": secret[::-1]}
        ctx = ctx_of(g)
        ctx.secrets = {"PW": secret}
        out = await lookup(g)(ctx, g["timeout_s"], CancelEvent())
        return out, ctx
    out, ctx = run(t())
    assert out.ok, out
    assert ctx.result == {"proc_environ": False, "os_environ": False, "stdin": False, "subprocess": False,
                          "run_id_seen": True}, ctx.result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_in_a_child_process_a_handler_past_its_timeout_or_lease_is_killed(child_env):
    lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app:iso", isolation="subprocess", kill_grace_s=2)

    async def t():
        g = grant("si-stuck", app=sdk_worker_app.iso)
        out = await execute(lookup, g, timeout_s=1.5)
        assert (out.ok, out.error, out.linger) == (False, "timed out after 1.5s; the handler's process was killed",
                                                  None), out
        pid = int(open(sdk_worker_app.path_of(g["id"], "pid")).read())
        assert not _alive(pid) and not os.path.exists(sdk_worker_app.path_of(g["id"], "finished"))

        g = grant("si-stuck", app=sdk_worker_app.iso, run_id="si-stuck@lost")
        cancel = CancelEvent()
        task = asyncio.ensure_future(execute(lookup, g, cancel, timeout_s=30))
        await wait_until(lambda: os.path.exists(sdk_worker_app.path_of(g["id"], "pid")), 15, "the child to start")
        cancel.set()  # its lease was lost
        out = await task
        assert out.error == "lease lost; the handler's process was killed", out
        assert not _alive(int(open(sdk_worker_app.path_of(g["id"], "pid")).read()))
    run(t(), timeout_s=40)


def test_a_child_whose_worker_was_killed_kills_its_process_group_and_leaves_no_result_file(child_env, tmp_path):
    """``kill -9`` of an ``--isolation subprocess`` worker left its handler's child running (a
    process group of its own): once the lease expired the run was handed on and ran twice at
    once, the orphan writing with the older token (found by an SDK walk), and its result file
    stayed in /tmp. The child watches its worker now: gone, it removes the file and kills its
    group, what the handler started included."""
    import subprocess
    import sys
    import textwrap
    results = tmp_path / "tmp"
    results.mkdir()
    g = grant("si-stuck", app=sdk_worker_app.iso, run_id="si-stuck@orphan")
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import asyncio
        from raftsched.sdk.worker import AppExecutors
        from raftsched.worker.executors import CancelEvent
        import sdk_worker_app, test_sdk_worker as t
        lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app:iso", isolation="subprocess")
        g = t.grant("si-stuck", app=sdk_worker_app.iso, run_id={g["id"]!r})
        asyncio.run(lookup(g)(t.ctx_of(g), 60, CancelEvent()))
    """)], cwd=str(TESTS), env=dict(os.environ, TMPDIR=str(results)))
    try:
        pid_file = sdk_worker_app.path_of(g["id"], "pid")
        run(wait_until(lambda: os.path.exists(pid_file) and os.path.getsize(pid_file) > 0, 20, "the child to start"))
        child = int(open(pid_file).read())
        assert procs.alive(child) and list(results.glob("raftsched-result-*"))
    finally:
        worker.kill()
        worker.wait(timeout=30)
    run(wait_until(lambda: not procs.alive(child), 10, "the orphaned child to be killed"))
    assert not os.path.exists(sdk_worker_app.path_of(g["id"], "finished"))
    assert list(results.glob("raftsched-result-*")) == []


def test_a_child_that_cannot_load_the_app_fails_saying_why(child_env):
    lookup = AppExecutors(sdk_worker_app.iso, "sdk_worker_app_missing:iso", isolation="subprocess")
    out = run(execute(lookup, grant("si-sync", app=sdk_worker_app.iso)))
    assert not out.ok and out.error.startswith("cannot load sdk_worker_app_missing:iso for sdk_worker_app:iso_hello"), out
