"""Executors (DESIGN.md section 6): what a run sees, how it ends, and that nothing outlives it.

Real processes, a real HTTP server on 127.0.0.1 and real imports; no fixed sleeps: every wait is
for an event or a condition, under a deadline.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

import exec_targets
from raftsched.node.executors import OUTPUT_BYTES_MAX, Outcome, RunContext, execute

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


def alive(pid: int) -> bool:
    """Whether pid is a live process. A zombie counts as gone: it has been killed, and where
    PID 1 does not reap orphans (some containers) it stays a zombie forever."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def read_pid(path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


# A process group whose child ignores SIGTERM: the parent writes both pids (atomically) to the
# directory in argv[1] once the child has installed SIG_IGN, then both sleep for an hour.
_CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
time.sleep(3600)  # ok-sleep: a child that waits to be killed
"""
_GROUP = """
import os, subprocess, sys, time
d = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE)
child_pid = int(child.stdout.readline())  # the child ignores SIGTERM from here on
def put(name, pid):
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, os.path.join(d, name))
put("child", child_pid)
put("parent", os.getpid())
print("ready", flush=True)
time.sleep(3600)  # ok-sleep: a child that waits to be killed
"""


def group_spec(tmp_path) -> dict:
    return {"type": "shell", "argv": [PY, "-c", _GROUP, str(tmp_path), _CHILD]}


# ---------------------------------------------------------------------------------------------
# RunContext

def test_slot_iso_env_and_headers():
    c = ctx()
    assert c.slot_iso == "2026-12-01T02:00:00Z"
    assert RunContext("r", "j", SLOT_MS + 250, 1, 1, None).slot_iso == "2026-12-01T02:00:00.250Z"
    assert c.env() == {
        "RAFTSCHED_RUN_ID": "r-1", "RAFTSCHED_JOB": "nightly-report",
        "RAFTSCHED_SLOT": "2026-12-01T02:00:00Z", "RAFTSCHED_ATTEMPT": "2",
        "RAFTSCHED_FENCING_TOKEN": "17", "RAFTSCHED_PAYLOAD": c.env()["RAFTSCHED_PAYLOAD"],
    }
    assert json.loads(c.env()["RAFTSCHED_PAYLOAD"]) == PAYLOAD
    assert c.headers() == {
        "X-Raftsched-Run-Id": "r-1", "X-Raftsched-Job": "nightly-report",
        "X-Raftsched-Slot": "2026-12-01T02:00:00Z", "X-Raftsched-Attempt": "2",
        "X-Raftsched-Fencing-Token": "17",
    }


# ---------------------------------------------------------------------------------------------
# shell

def test_shell_success_and_environment_contract(tmp_path):
    script = ("import os, json; print(json.dumps({'env': {k: v for k, v in os.environ.items() "
              "if k.startswith('RAFTSCHED_') or k == 'FROM_SPEC'}, 'cwd': os.getcwd(), "
              "'stdin': os.read(0, 10).decode()}))")
    spec = {"type": "shell", "argv": [PY, "-c", script], "cwd": str(tmp_path),
            # The spec's env is passed, but cannot replace the run's identity.
            "env": {"FROM_SPEC": "yes", "RAFTSCHED_JOB": "spoofed", "RAFTSCHED_FENCING_TOKEN": "99"}}
    out = run(execute(spec, ctx(), 10))
    assert out.ok and out.error is None, out
    seen = json.loads(out.output)
    env = seen["env"]
    assert env.pop("FROM_SPEC") == "yes"
    assert env == ctx().env()
    assert env["RAFTSCHED_SLOT"] == "2026-12-01T02:00:00Z"
    assert env["RAFTSCHED_FENCING_TOKEN"] == "17" and env["RAFTSCHED_ATTEMPT"] == "2"
    assert json.loads(env["RAFTSCHED_PAYLOAD"]) == PAYLOAD
    assert os.path.samefile(seen["cwd"], tmp_path)
    assert seen["stdin"] == ""  # /dev/null
    assert isinstance(out.duration_ms, int) and out.duration_ms >= 0
    # The worker's own environment is inherited.
    out = run(execute({"type": "shell", "argv": [PY, "-c", "import os; print(os.environ['PATH'])"]}, ctx(), 10))
    assert out.ok and out.output.strip() == os.environ["PATH"]


def test_shell_nonzero_exit_and_signal():
    out = run(execute({"type": "shell", "argv": [PY, "-c", "import sys; print('bye'); sys.exit(3)"]}, ctx(), 10))
    assert (out.ok, out.error, out.output) == (False, "exit status 3", "bye\n")
    out = run(execute({"type": "shell", "argv": [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]}, ctx(), 10))
    assert (out.ok, out.error) == (False, "killed by signal SIGKILL")


def test_shell_output_is_interleaved_and_bounded_to_the_tail():
    script = ("import sys\n"
              "sys.stdout.write('a' * 1_000_000); sys.stdout.flush()\n"
              "sys.stderr.write('<err>'); sys.stderr.flush()\n"
              "sys.stdout.write('<out>' + ''.join(chr(48 + i % 10) for i in range(100)) + '<end>\\n')\n")
    out = run(execute({"type": "shell", "argv": [PY, "-c", script]}, ctx(), 10))
    assert out.ok, out
    expected = ("a" * 1_000_000 + "<err><out>" + "".join(chr(48 + i % 10) for i in range(100)) + "<end>\n")
    assert out.output == expected[-OUTPUT_BYTES_MAX:]
    assert len(out.output.encode()) == OUTPUT_BYTES_MAX


def test_shell_output_tail_does_not_start_mid_character():
    # 4096 bytes from the end falls inside a 3-byte character (4096 = 3 * 1365 + 1): its last
    # byte is dropped, not shown as a replacement character.
    script = "import sys; sys.stdout.buffer.write(('\u20ac' * 3000).encode())"
    out = run(execute({"type": "shell", "argv": [PY, "-c", script]}, ctx(), 10))
    assert out.ok and out.output == "\u20ac" * 1365
    assert "\ufffd" not in out.output


def test_shell_argv_is_not_interpreted_by_a_shell():
    arg = "$HOME;echo hi `id` | cat > /dev/null && 'q'"
    out = run(execute({"type": "shell", "argv": [PY, "-c", "import sys; print(repr(sys.argv[1:]))", arg, "*"]}, ctx(), 10))
    assert out.ok and out.output == repr([arg, "*"]) + "\n"
    # A shell only when asked for one.
    out = run(execute({"type": "shell", "argv": ["sh", "-c", "echo $RAFTSCHED_JOB; echo hi"]}, ctx(), 10))
    assert out.ok and out.output == "nightly-report\nhi\n"


def test_shell_missing_executable_or_cwd(tmp_path):
    out = run(execute({"type": "shell", "argv": [str(tmp_path / "no-such-binary")]}, ctx(), 10))
    assert not out.ok and out.error.startswith("cannot execute:") and "no-such-binary" in out.error
    out = run(execute({"type": "shell", "argv": ["raftsched-no-such-command-on-path"]}, ctx(), 10))
    assert not out.ok and out.error.startswith("cannot execute:")
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    out = run(execute({"type": "shell", "argv": [str(script)]}, ctx(), 10))
    assert not out.ok and out.error.startswith("cannot execute:") and "Permission denied" in out.error
    out = run(execute({"type": "shell", "argv": ["true"], "cwd": str(tmp_path / "nope")}, ctx(), 10))
    assert not out.ok and out.error.startswith("cannot execute:")


def test_shell_timeout_kills_the_group_sigkill_after_grace(tmp_path):
    async def t():
        t0 = time.monotonic()
        out = await execute(group_spec(tmp_path), ctx(), 2.0, kill_grace_s=0.5)
        elapsed = time.monotonic() - t0
        parent, child = read_pid(tmp_path / "parent"), read_pid(tmp_path / "child")
        assert parent and child, "the group did not start within the timeout"
        assert (out.ok, out.error) == (False, "timed out after 2s")
        assert "ready" in out.output
        # The parent died of SIGTERM; the child ignored it and needed the SIGKILL after the grace.
        assert elapsed >= 2.0 + 0.5 - 0.05, elapsed
        await wait_until(lambda: not alive(parent) and not alive(child), 2.0, "the group to be gone")
    run(t())


def test_shell_cancel_event_kills_the_group(tmp_path):
    async def t():
        cancel = asyncio.Event()
        task = asyncio.create_task(execute(group_spec(tmp_path), ctx(), 30, cancel=cancel, kill_grace_s=0.5))
        await wait_until(lambda: (tmp_path / "parent").exists(), 10, "the group to start")
        parent, child = read_pid(tmp_path / "parent"), read_pid(tmp_path / "child")
        assert alive(parent) and alive(child)
        cancel.set()
        out = await task
        assert (out.ok, out.error) == (False, "lease lost")
        assert out.output == "ready\n"
        await wait_until(lambda: not alive(parent) and not alive(child), 2.0, "the group to be gone")
    run(t())


def test_shell_cancel_already_set_runs_nothing(tmp_path):
    cancel_set = asyncio.Event()
    cancel_set.set()
    marker = tmp_path / "ran"
    out = run(execute({"type": "shell", "argv": ["touch", str(marker)]}, ctx(), 10, cancel=cancel_set))
    assert (out.ok, out.error) == (False, "lease lost")
    assert not marker.exists()


def test_shell_processes_left_behind_are_killed_after_exit():
    async def t():
        # The main process exits 0 at once; the background sleep it left behind holds stdout.
        out = await execute({"type": "shell", "argv": ["sh", "-c", "sleep 30 & echo $!"]}, ctx(), 10, kill_grace_s=0.5)
        assert out.ok, out
        pid = int(out.output)
        await wait_until(lambda: not alive(pid), 2.0, "the left-behind sleep to be gone")
        assert out.duration_ms < 5000
    run(t())


def test_shell_caller_cancellation_kills_the_group_and_propagates(tmp_path):
    async def t():
        task = asyncio.create_task(execute(group_spec(tmp_path), ctx(), 30, kill_grace_s=5))
        await wait_until(lambda: (tmp_path / "parent").exists(), 10, "the group to start")
        parent, child = read_pid(tmp_path / "parent"), read_pid(tmp_path / "child")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a cancelled execute must propagate the cancellation")
        await wait_until(lambda: not alive(parent) and not alive(child), 2.0, "the group to be gone")
    run(t())


def test_no_pipe_or_fd_leaks_across_runs():
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def t():
        spec = {"type": "shell", "argv": [PY, "-c", "print('x')"]}
        await execute(spec, ctx(), 10)  # warm up lazily created loop resources
        before = fds()
        for _ in range(5):
            assert (await execute(spec, ctx(), 10)).ok
        await execute({"type": "shell", "argv": ["sh", "-c", "sleep 30"]}, ctx(), 0.2, kill_grace_s=0.5)
        await execute({"type": "shell", "argv": ["/nonexistent/x"]}, ctx(), 10)
        assert fds() == before
    run(t())


# ---------------------------------------------------------------------------------------------
# http

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hook:
    """A webhook receiver on 127.0.0.1 that records requests and can hold them open."""

    def __init__(self):
        self.requests: list[dict] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/ok", self.ok)
        app.router.add_post("/fail", self.fail)
        app.router.add_post("/slow", self.slow)
        app.router.add_post("/big", self.big)
        app.router.add_post("/redirect", self.redirect)
        self.server = TestServer(app, host="127.0.0.1")

    async def __aenter__(self):
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc):
        self.release.set()  # let held handlers finish before the server closes
        await self.server.close()

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def ok(self, request):
        self.requests.append({"headers": dict(request.headers), "body": await request.read()})
        return web.Response(status=202, text="accepted")

    async def fail(self, request):
        return web.Response(status=500, text="boom: database down")

    async def slow(self, request):
        self.entered.set()
        await self.release.wait()
        return web.Response(text="too late")

    async def big(self, request):
        return web.Response(body=b"a" * 200_000 + b"<end>")

    async def redirect(self, request):
        raise web.HTTPFound("/ok")


def test_http_posts_payload_and_identity_headers():
    async def t():
        async with Hook() as hook:
            spec = {"type": "http", "url": hook.url("/ok"),
                    "headers": {"Authorization": "Bearer s3cret", "x-raftsched-run-id": "spoofed"}}
            out = await execute(spec, ctx(), 10)
            assert out.ok and out.error is None, out
            assert out.output == "HTTP 202\naccepted"
            [req] = hook.requests
            assert json.loads(req["body"]) == PAYLOAD
            h = req["headers"]
            assert h["Content-Type"] == "application/json"
            assert h["Authorization"] == "Bearer s3cret"
            for name, value in ctx().headers().items():
                assert h[name] == value, name
            assert [k for k in h if k.lower() == "x-raftsched-run-id"] == ["X-Raftsched-Run-Id"]
    run(t())


def test_http_error_status_redirect_and_bounded_body():
    async def t():
        async with Hook() as hook:
            out = await execute({"type": "http", "url": hook.url("/fail")}, ctx(), 10)
            assert (out.ok, out.error, out.output) == (False, "HTTP 500", "HTTP 500\nboom: database down")
            # A redirect is not followed (it would turn the POST into a GET without the payload).
            out = await execute({"type": "http", "url": hook.url("/redirect")}, ctx(), 10)
            assert (out.ok, out.error) == (False, "HTTP 302")
            assert out.output.startswith("HTTP 302\nLocation: /ok\n")
            assert hook.requests == []
            out = await execute({"type": "http", "url": hook.url("/big")}, ctx(), 10)
            assert out.ok and out.output.startswith("HTTP 200\na")
            assert len(out.output.encode()) == OUTPUT_BYTES_MAX
    run(t())


def test_http_timeout_and_cancel():
    async def t():
        async with Hook() as hook:
            out = await execute({"type": "http", "url": hook.url("/slow")}, ctx(), 0.3)
            assert (out.ok, out.error) == (False, "timed out after 0.3s")
            assert hook.entered.is_set()
            hook.entered.clear()
            cancel = asyncio.Event()
            task = asyncio.create_task(execute({"type": "http", "url": hook.url("/slow")}, ctx(), 30, cancel=cancel))
            await asyncio.wait_for(hook.entered.wait(), 5)
            cancel.set()
            out = await asyncio.wait_for(task, 5)
            assert (out.ok, out.error) == (False, "lease lost")
    run(t())


def test_http_connection_refused_and_shared_session():
    async def t():
        out = await execute({"type": "http", "url": f"http://127.0.0.1:{free_port()}/hook"}, ctx(), 5)
        assert not out.ok and out.error.startswith("ClientConnectorError: "), out
        async with Hook() as hook, aiohttp.ClientSession() as session:
            for _ in range(2):
                out = await execute({"type": "http", "url": hook.url("/ok")}, ctx(), 5, http_session=session)
                assert out.ok, out
            assert not session.closed  # a caller's session is the caller's to close
            assert len(hook.requests) == 2
    run(t())


# ---------------------------------------------------------------------------------------------
# python

def py(target: str) -> dict:
    return {"type": "python", "target": f"exec_targets:{target}"}


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
    from raftsched.node.executors._threads import RunThreads

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
    from raftsched.node.executors import python as executors

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
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a cancelled execute must propagate the cancellation")
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
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a cancelled execute must propagate the cancellation")
        # The function returns later: what it returns goes nowhere, and raises nothing on the loop.
        release.set()
        recs = exec_targets.RECORDED["py-caller-block"]
        await wait_until(lambda: [r["kind"] for r in recs] == ["started", "finished"], 5, "the function to return")
        await wait_until(lambda: recs[0]["thread"].name.startswith("raftsched-run-idle-"), 5, "the thread to be idle")
        await asyncio.sleep(0.05)  # ok-sleep: a late delivery would come within a loop turn or two
        assert errors == []
    run(t())


def test_python_awaitable_returned_by_a_plain_function_keeps_the_deadline_and_the_cancel_event():
    from raftsched.node.executors import CancelEvent

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
# allowed types and specs that cannot run

def test_disallowed_type_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    out = run(execute({"type": "shell", "argv": ["touch", str(marker)]}, ctx(), 10,
                      allowed_types=frozenset({"http", "python"})))
    assert out == Outcome(ok=False, error="executor type 'shell' is not allowed on this node",
                          output="", duration_ms=out.duration_ms)
    assert not marker.exists()
    out = run(execute(py("record_sync"), ctx("py-refused"), 10, allowed_types=frozenset({"shell"})))
    assert (out.ok, out.error) == (False, "executor type 'python' is not allowed on this node")
    assert "py-refused" not in exec_targets.RECORDED


def test_malformed_specs_fail_without_raising():
    for spec in (None, {}, {"type": "ftp"}, {"type": "shell"}, {"type": "shell", "argv": []},
                 {"type": "http"}, {"type": "http", "url": "not a url"}, {"type": "python"}):
        out = run(execute(spec, ctx(), 5, allowed_types=frozenset({"shell", "http", "python", "ftp"})))
        assert isinstance(out, Outcome) and not out.ok and out.error, (spec, out)


# ---------------------------------------------------------------------------------------------
# execute_soon: the same contract without a task per run

async def soon(spec, c: RunContext, timeout_s, **kw) -> Outcome:
    """execute_soon, awaited: asserts it took the run and returns its one Outcome."""
    from raftsched.node.executors import execute_soon
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
    from raftsched.node.executors import CancelEvent

    async def t():
        import exec_targets as _  # imported: execute_soon takes it
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
    from raftsched.node.executors import CancelEvent

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
    from raftsched.node.executors import CancelEvent, execute_soon

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
