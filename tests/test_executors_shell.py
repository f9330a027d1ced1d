"""The shell executor (DESIGN.md section 6): what a run sees, how it ends, and that nothing of
its process group outlives it.

Real processes; no fixed sleeps: every wait is for an event or a condition, under a deadline.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

from executor_helpers import PAYLOAD, PY, cancel_and_expect_cancelled, ctx, run, wait_until
from raftsched.worker.executors import OUTPUT_BYTES_MAX, execute

from procs import alive  # (a zombie is gone; so is a process that ends while its stat is read)


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
        await cancel_and_expect_cancelled(task)
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


def test_stdin_data_reaches_the_run_whole_and_a_pipe_too_small_for_it_fails_the_run(tmp_path, monkeypatch):
    """run_shell's ``stdin_data`` (what an SDK child gets its secrets on): the run reads it whole
    on its stdin; a pipe the kernel gave less room than the data (a user over
    pipe-user-pages-soft gets one page) fails the run saying so, starts nothing, and leaves no
    descriptor open."""
    import fcntl

    from raftsched.worker.executors import shell

    data = b"s" * 50_000
    got = tmp_path / "got"
    argv = [PY, "-c", f"import sys; open({str(got)!r}, 'wb').write(sys.stdin.buffer.read())"]
    ok, error, _ = run(shell.run_shell({"argv": argv}, ctx(), 10, None, 1.0, stdin_data=data))
    assert ok and error is None and got.read_bytes() == data

    real_pipe = os.pipe

    def one_page_pipe():
        r, w = real_pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        return r, w
    monkeypatch.setattr(shell.os, "pipe", one_page_pipe)
    got.unlink()
    fds = set(os.listdir("/proc/self/fd"))
    ok, error, out = run(shell.run_shell({"argv": argv}, ctx(), 10, None, 1.0, stdin_data=data))
    assert not ok and "cannot hand the run its input" in error and "of 50000 bytes" in error, error
    assert not got.exists(), "the run was not started"
    assert set(os.listdir("/proc/self/fd")) <= fds, "no descriptor left open"
