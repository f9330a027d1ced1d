"""Where a worker's runs execute (worker/sandbox.py, worker/runserver.py; docs/security.md, "What a
job can reach"): as the run user, with a clean environment, each in a directory of its own that
is removed afterwards; a python run in a process of its own, forked from the run server; the run
server's death fails the runs it had and is survived; and the checks a node makes of its files
and flags before it starts.

Real processes; every wait is for a condition under a deadline. Most of it means most when the
tests run as root (as CI does): runs then switch to another user.
"""
from __future__ import annotations

import asyncio
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from executor_helpers import cancel_and_expect_cancelled, ctx, run, wait_until
from procs import alive, pid_marks, targets_on_path
from raftsched.config import ConfigError
from raftsched.worker.executors import CancelEvent, RunContext, execute
from raftsched.worker import sandbox as sb
from raftsched.worker.masking import deliver
from raftsched.worker.sandbox import Sandbox, check_pass_env, check_private, resolve_run_user

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="runs switch user only when the worker runs as root")

TARGETS = textwrap.dedent('''
    import asyncio, os, sys, time

    def whoami(ctx):
        print("printed by the run")
        return {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "env": dict(os.environ),
                "secrets": dict(ctx.secrets), "payload": ctx.payload, "run": ctx.run_id, "token": ctx.fencing_token,
                "worker": ctx.worker_id, "slot": ctx.slot_iso, "files": os.listdir(".")}

    async def async_whoami(ctx):
        await asyncio.sleep(0)  # ok-sleep: an await inside the async target (no wait)
        return {"pid": os.getpid(), "run": ctx.run_id}

    def boom(ctx):
        raise ValueError("no good")

    def exits(ctx):
        sys.exit(3)

    def dies(ctx):
        os._exit(9)

    def sleeps(ctx):
        path = os.path.join(ctx.payload["dir"], ctx.run_id + ".pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # whole, once it is there
        time.sleep(3600)  # ok-sleep: a run that waits to be killed

    def connects(ctx):
        import socket
        try:
            socket.create_connection(("localhost", ctx.payload["port"]), timeout=5).close()
        except OSError as e:
            return type(e).__name__
        return "connected"

    def refused(ctx):
        raise RuntimeError("login refused for password " + ctx.secrets["PW"])

    def prints_secret(ctx):
        sys.stdout.write(ctx.secrets["PW"] + "x" * ctx.payload["pad"])

    def returns_secret(ctx):
        return "y" * ctx.payload["pre"] + ctx.secrets["PW"] + "y" * ctx.payload["post"]

    def litters(ctx):
        os.makedirs("a/b")
        with open("a/b/f", "w") as f:
            f.write("x")
        os.chmod("a/b", 0o500)
        return "left a tree"
''')


@pytest.fixture(scope="module")
def targets():
    """A module of python targets, where the run user can read it, on the import path the run
    server is given (this process's)."""
    yield from targets_on_path("targets", "sandbox_targets.py", TARGETS)


@pytest.fixture
def marks():
    yield from pid_marks("marks")


def box(**kw) -> Sandbox:
    return Sandbox(resolve_run_user(None), name="test", **kw)


async def started(**kw) -> Sandbox:
    s = box(**kw)
    await s.start()
    return s


def sh(script: str, argv0: str | None = None, **kw) -> dict:
    return {"type": "shell", "argv": ["sh", "-c", script, *([] if argv0 is None else [argv0])], **kw}


def py(target: str) -> dict:
    return {"type": "python", "target": f"sandbox_targets:{target}"}


def c(run_id: str = "r-1", payload=None, secrets=None) -> RunContext:
    x = ctx(run_id, payload)
    x.worker_id = "w-1"
    x.secrets = dict(secrets or {})
    return x


def _state(pid: int) -> bytes | None:
    """The process's state letter (R, S, T, Z ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0]
    except FileNotFoundError:
        return None


def fields(output: str) -> dict:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


# ---------------------------------------------------------------------------- masking
#: 40 characters: a run that prints it and then 4 076 more bytes has its output cut 20 characters
#: into it, at the 4 KB kept
CUT_SECRET = "A" * 20 + "-TAILPART-0123456789"
#: two spaces: a reason made one line would no longer hold it
SPACED_SECRET = "correct  horse battery"


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "in-process"])
def test_a_runs_secrets_are_masked_before_its_output_is_cut_and_its_error_made_one_line(targets, sandboxed):
    """Masked after the shaping, a secret the 4 KB cut went through left its end in the output,
    and one with two spaces was no longer found in the error made one line."""
    assert len(CUT_SECRET) == 40

    async def t():
        s = await started() if sandboxed else None
        try:
            secrets = {"PW": CUT_SECRET}
            shell = await execute(deliver(sh('printf "%s" "$PW"; head -c 4076 /dev/zero | tr "\\000" x'), secrets),
                                  c("sh-cut", secrets=secrets), 10, sandbox=s)
            # What it prints (a run of its own only: in this process, it goes to this one's stdout),
            # and the repr of what it returns, which keeps a long string's first and last
            # characters: a secret at the end of what is kept of its start, and one in the middle.
            python = [await execute(py("prints_secret"), c("py-printed", {"pad": 4076}, secrets), 10, sandbox=s)]
            for pre, post in ((4080, 0), (2030, 3000)):
                python.append(await execute(py("returns_secret"), c(f"py-{pre}", {"pre": pre, "post": post}, secrets),
                                            10, sandbox=s))
            refused = await execute(py("refused"), c("py-refused", secrets={"PW": SPACED_SECRET}), 10, sandbox=s)
            return shell, python, refused
        finally:
            if s is not None:
                await s.close()
    shell, python, refused = run(t())
    assert shell.ok and shell.output == "x" * 4076, shell.output[:40]
    if sandboxed:
        assert python[0].output.startswith("x" * 4000), python[0].output[:40]
    for out in python:
        assert out.ok, out
        for part in ("TAILPART", "0123456789", "A" * 4):
            assert part not in out.output, (part, out.output[:60], out.output[-60:])
    assert not refused.ok and refused.error == "RuntimeError: login refused for password ***", refused.error
    assert "horse" not in refused.output and "RuntimeError: login refused for password ***" in refused.output


# ---------------------------------------------------------------------------- who, where, what
def test_a_shell_run_gets_a_clean_environment_a_fresh_directory_and_the_run_user(monkeypatch):
    monkeypatch.setenv("NODE_ONLY_CANARY", "do-not-pass")
    monkeypatch.setenv("TZ", "Europe/Berlin")

    async def t():
        s = await started()
        try:
            out = await execute(sh('echo "uid=$(id -u)"; echo "pwd=$(pwd)"; echo "files=$(ls -A)"; env',
                                   env={"JOB_VAR": "j"}), c(), 10, sandbox=s)
        finally:
            await s.close()
        return s, out
    s, out = run(t())
    assert out.ok, out
    env = fields(out.output)
    assert "NODE_ONLY_CANARY" not in out.output
    ours = {"uid", "pwd", "files", "PWD", "OLDPWD", "SHLVL", "_"}  # this script's, and the shell's own
    assert {k for k in env if not k.startswith("RAFTSCHED_")} - ours <= {"PATH", "LANG", "TZ", "HOME", "JOB_VAR"}
    assert env["TZ"] == "Europe/Berlin" and env["JOB_VAR"] == "j" and env["RAFTSCHED_RUN_ID"] == "r-1"
    assert env["pwd"] == env["HOME"] and env["HOME"].startswith(s.runs_dir + "/r-1.")
    assert not env["HOME"].startswith(os.getcwd())
    assert env["files"] == "", "it starts empty"
    assert int(env["uid"]) == s.user.uid and (not ROOT or s.user.uid != 0)
    assert not os.path.exists(env["HOME"]) and not os.path.exists(s.runs_dir), "removed after the run, and at close"


def test_pass_env_adds_names_of_the_workers_environment_and_nothing_else(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("OTHER", "x")

    async def t():
        s = await started(pass_env=check_pass_env(["HTTPS_PROXY"]))
        try:
            return await execute(sh("env"), c(), 10, sandbox=s)
        finally:
            await s.close()
    env = fields(run(t()).output)
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and "OTHER" not in env
    for bad in ("RAFTSCHED_TOKEN", "HOME", "A-B", "1A"):
        with pytest.raises(ConfigError):
            check_pass_env([bad])


def test_a_shell_run_that_cannot_start_says_why_and_a_failing_one_reports_its_status():
    async def t():
        s = await started()
        try:
            return (await execute({"type": "shell", "argv": ["no-such-program-x"]}, c("a"), 10, sandbox=s),
                    await execute(sh("echo out; echo err >&2; exit 3"), c("b"), 10, sandbox=s),
                    await execute(sh("kill -KILL $$"), c("c"), 10, sandbox=s),
                    await execute(sh("pwd", cwd="/"), c("d"), 10, sandbox=s))
        finally:
            await s.close()
    a, b, k, d = run(t())
    assert not a.ok and a.error == "cannot execute: [Errno 2] No such file or directory: 'no-such-program-x'"
    assert not b.ok and b.error == "exit status 3" and b.output == "out\nerr\n"
    assert not k.ok and k.error == "killed by signal SIGKILL"
    assert d.ok and d.output == "/\n", "a shell executor's cwd is still where it starts"


def test_a_run_the_server_cannot_start_for_a_nul_fails_alone_and_the_servers_other_runs_go_on():
    """A NUL in a shell run's argv or cwd (a spec stored before the API refused them) made
    posix_spawn and chdir raise ValueError, which the run server did not catch: it died, and
    every run it had started on that worker with it. Now that run fails and says why."""
    async def t():
        s = await started()
        try:
            sleeper = asyncio.ensure_future(execute(sh("sleep 1; echo slept"), c("sleeper"), 20, sandbox=s))
            await wait_until(lambda: s.server is not None and len(s.server._handles) == 1, 10)  # sent first
            pid = s.server.pid
            bad = [await execute({"type": "shell", "argv": ["echo", "a\x00b"]}, c("nul-argv"), 10, sandbox=s),
                   await execute(sh("true", cwd="/tmp\x00x"), c("nul-cwd"), 10, sandbox=s)]
            after = await execute(sh("echo ok"), c("after"), 10, sandbox=s)
            return bad, await asyncio.wait_for(sleeper, 20), after, pid, s.server.pid, (s.server.starts, s.server.deaths)
        finally:
            await s.close()
    bad, sleeper, after, pid, pid_after, starts = run(t(), 60)
    assert [o.ok for o in bad] == [False, False], bad
    assert all(o.error.startswith("cannot execute: ValueError: ") and "null" in o.error for o in bad), bad
    assert sleeper.ok and sleeper.output == "slept\n", "the run in flight was not killed"
    assert after.ok and (pid_after, starts) == (pid, (1, 0)), "the same server serves the next run"


def test_a_result_file_that_is_not_json_is_no_result_and_the_run_says_so(caplog):
    """The shell strips the quotes of ``echo {"rows": 42}``: the file says ``{rows: 42}``, no
    result is kept, and the run's output and the worker's log say why (once only a log line at
    info said it)."""
    async def t():
        s = await started()
        try:
            bad, good, none = c("bad"), c("good"), c("none")
            outs = (await execute(sh('echo out; echo {"rows": 42} > "$RAFTSCHED_RESULT_FILE"'), bad, 10, sandbox=s),
                    await execute(sh('echo "$0" > "$RAFTSCHED_RESULT_FILE"', argv0='{"rows": 42}'), good, 10,
                                  sandbox=s),
                    await execute(sh("echo out"), none, 10, sandbox=s))
            # Nested as deep as the parser goes: no result, and the run keeps its success (a
            # RecursionError out of the reader made it dead, a traceback in its output).
            deep = c("deep")
            deep_out = await execute(sh('printf "%s" "$0" > "$RAFTSCHED_RESULT_FILE"', argv0="[" * 2048 + "]" * 2048),
                                     deep, 10, sandbox=s)
            assert deep_out.ok and deep.result is None, deep_out
            assert deep_out.output == "raftsched: $RAFTSCHED_RESULT_FILE is nested more than 32 levels deep; no " \
                                      'result kept (docs/pipelines.md, "Results")\n', deep_out.output
            return outs, (bad.result, good.result, none.result)
        finally:
            await s.close()
    caplog.set_level("WARNING", logger="raftsched.sandbox")
    (bad, good, none), results = run(t())
    assert results == (None, {"rows": 42}, None)
    assert bad.ok and bad.output == "out\nraftsched: $RAFTSCHED_RESULT_FILE is not JSON; no result kept " \
                                     '(docs/pipelines.md, "Results")\n', bad.output
    assert good.ok and good.output == "" and none.ok and none.output == "out\n"
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "result file" in r.getMessage()]
    assert len(warned) == 2 and "run bad is not JSON" in warned[0].getMessage()


def test_a_python_run_is_a_process_of_its_own_as_the_run_user_with_its_context(targets):
    async def t():
        s = await started()
        try:
            return s, await execute(py("whoami"), c("py-1", {"n": 1}, {"KEY": "v-1"}), 10, sandbox=s), \
                await execute(py("async_whoami"), c("py-2"), 10, sandbox=s)
        finally:
            await s.close()
    s, out, aout = run(t())
    assert out.ok, out
    printed, _, rest = out.output.partition("\n")
    assert printed == "printed by the run"
    got = eval(rest, {"__builtins__": {}})
    assert got["pid"] != os.getpid() and got["uid"] == s.user.uid and (not ROOT or got["uid"] != 0)
    assert got["cwd"] == got["env"]["HOME"] and got["files"] == []
    assert got["secrets"] == {"KEY": "v-1"} and "KEY" not in got["env"], "secrets in ctx, not in the environment"
    assert got["payload"] == {"n": 1} and got["run"] == "py-1" and got["token"] == 17 and got["worker"] == "w-1"
    assert got["env"]["RAFTSCHED_RUN_ID"] == "py-1" and got["slot"] == "2026-12-01T02:00:00Z"
    assert set(got["env"]) <= {"PATH", "LANG", "TZ", "HOME"} | {k for k in got["env"] if k.startswith("RAFTSCHED_")}
    assert aout.ok and eval(aout.output, {"__builtins__": {}})["pid"] not in (os.getpid(), got["pid"])


def test_a_python_runs_failures_read_as_the_python_executors(targets):
    async def t():
        s = await started()
        try:
            return [await execute(py(name), c(name), 10, sandbox=s) for name in ("boom", "exits", "dies")] + \
                [await execute({"type": "python", "target": "no_such_module_x:f"}, c("nomod"), 10, sandbox=s)] + \
                [s.unreadable_library()]
        finally:
            await s.close()
    boom, exits, dies, nomod, lib = run(t())
    assert not boom.ok and boom.error == "ValueError: no good" and "Traceback" in boom.output
    assert not exits.ok and exits.error == "SystemExit: 3"
    assert not dies.ok and dies.error == "the run's process ended without an outcome (exit status 9)"
    said = "ModuleNotFoundError: No module named 'no_such_module_x'"
    # (where the run user cannot read the Python library, as under a pyenv in /root, the error says so)
    assert not nomod.ok and nomod.error == (said if lib is None else said + _lib_hint(lib)), nomod.error


def _lib_hint(lib: str) -> str:
    return f" (the run user {resolve_run_user(None).name} cannot read the Python library, {lib}: install Python " \
           f"where it can; docs/security.md)"


def test_an_import_error_of_a_run_that_cannot_read_the_python_library_says_so(targets, monkeypatch):
    """A user's python jobs failed with "No module named 'colorsys'" and nothing in the run said
    why (the worker's log did, once, at start): the run user could not read the library."""
    monkeypatch.setattr(Sandbox, "unreadable_library", lambda self: "/opt/py/lib/python3.11")

    async def t():
        s = await started()
        try:
            return [await execute({"type": "python", "target": "no_such_module_x:f"}, c("nomod"), 10, sandbox=s),
                    await execute(py("boom"), c("boom"), 10, sandbox=s)]
        finally:
            await s.close()
    nomod, boom = run(t())
    assert nomod.error == "ModuleNotFoundError: No module named 'no_such_module_x'" + _lib_hint("/opt/py/lib/python3.11")
    assert boom.error == "ValueError: no good"  # another failure is not given the hint


def test_a_python_run_connects_to_a_host_by_name(targets):
    """The run server imports the IDNA codec a connection to a host name needs before it drops
    privileges: a run user who cannot read the interpreter's files (a Python under /root) could
    not import it later."""
    from raftsched.testing.procs import free_port

    async def t():
        s = await started()
        try:
            return await execute(py("connects"), c("net", {"port": free_port()}), 10, sandbox=s)
        finally:
            await s.close()
    out = run(t())
    assert out.ok and out.output == "'ConnectionRefusedError'", out


def test_what_a_run_leaves_in_its_directory_is_removed_even_read_only(targets):
    async def t():
        s = await started()
        try:
            out = await execute(py("litters"), c("lit"), 10, sandbox=s)
            left = [n for n in os.listdir(s.runs_dir) if n != sb.RUNS_LOCK]  # (the worker's lock stays)
        finally:
            await s.close()
        return out, left
    out, left = run(t())
    assert out.ok and left == []


# ---------------------------------------------------------------------------- ends
def test_a_run_past_its_timeout_is_killed_with_its_whole_group_and_its_directory_removed(marks, targets):
    script = (f'trap "" TERM; sleep 3600 & echo $! > "{marks}/child.pid"; echo $$ > "{marks}/main.pid"; '
              'echo started; wait')

    async def t():
        s = await started()
        try:
            out = await execute(sh(script), c("slow"), 0.5, kill_grace_s=0.3, sandbox=s)
            pout = await execute(py("sleeps"), c("pyslow", {"dir": str(marks)}), 0.5, kill_grace_s=0.3, sandbox=s)
            left = [n for n in os.listdir(s.runs_dir) if n != sb.RUNS_LOCK]  # (the worker's lock stays)
        finally:
            await s.close()
        return out, pout, left
    out, pout, left = run(t())
    assert not out.ok and out.error == "timed out after 0.5s" and out.output == "started\n"
    assert not pout.ok and pout.error == "timed out after 0.5s"
    for name in ("child", "main", "pyslow"):
        assert not alive(int((marks / f"{name}.pid").read_text())), name
    assert left == []


def test_a_lost_lease_kills_the_run_and_a_cancelled_caller_kills_it_too(marks, targets):
    async def t():
        s = await started()
        try:
            cancel = CancelEvent()
            task = asyncio.create_task(execute(py("sleeps"), c("lost", {"dir": str(marks)}), 60, cancel=cancel,
                                               sandbox=s))
            await wait_until(lambda: (marks / "lost.pid").exists(), 10, "the run to start")
            cancel.set()
            lost = await task
            task = asyncio.create_task(execute(py("sleeps"), c("gone", {"dir": str(marks)}), 60, sandbox=s))
            await wait_until(lambda: (marks / "gone.pid").exists(), 10, "the run to start")
            await cancel_and_expect_cancelled(task)
            pid = int((marks / "gone.pid").read_text())
            await wait_until(lambda: not alive(pid), 10, "the run to be killed")
        finally:
            await s.close()
        return lost
    lost = run(t(), 40)
    assert not lost.ok and lost.error == "lease lost"
    assert not alive(int((marks / "lost.pid").read_text()))


PLANTED = """
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran-as"), "a") as f:
    f.write("%d\\n" % os.geteuid())
raise ImportError("planted")
"""


@as_root
def test_the_run_server_imports_nothing_as_root_from_where_the_run_user_may_write(marks):
    """A directory on the worker's import path that the run user can write (a shared jobs
    directory on PYTHONPATH, a worker started in /tmp): a run could plant a module there, stop
    the run server (its own user), and the next run's server, started as root, would import it
    as root. Only entries the run user cannot write are read before the switch; the others are
    the runs' import path after it."""
    shared = marks / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    user = resolve_run_user(None)
    for name in ("selectors", "inspect"):  # one the server imports, one it preloads
        (shared / f"{name}.py").write_text(PLANTED)
        os.chown(shared / f"{name}.py", user.uid, user.gid)
    assert sb.root_import_path([str(shared), "/usr/lib"], user) == ["/usr/lib"]
    assert sb.root_import_path([str(marks)], user) == []  # (mode 1777: writable)
    sys.path.insert(0, str(shared))
    try:
        async def t():
            s = await started()
            try:
                return await execute(sh('echo "$PWD"'), c("after-plant"), 20, sandbox=s)
            finally:
                await s.close()
        out = run(t(), 60)
    finally:
        sys.path.remove(str(shared))
    assert out.ok, out
    ran = (shared / "ran-as").read_text().split() if (shared / "ran-as").exists() else []
    assert "0" not in ran, f"a planted module ran as root: {ran}"


async def _stopped_by_a_run(s: Sandbox, timeout_s: float) -> tuple[int, asyncio.Task]:
    """A run that SIGSTOPs its run server (its parent, its own user): the server's pid, once it
    is stopped, and the run's task."""
    first = s.server.pid
    stopper = asyncio.create_task(execute(sh("kill -STOP $PPID; echo stopped"), c("stopper"), timeout_s, sandbox=s))
    await wait_until(lambda: _state(first) == b"T", 10, "the run server to be stopped")
    return first, stopper


def test_a_run_server_a_run_stopped_is_replaced_and_the_next_runs_go_on(monkeypatch):
    """A run is the run server's user, so it may SIGSTOP it. The server answers a run at once:
    one that does not within run_server_answer_s is killed, and a new one takes the runs it had
    not started, once (the stopping run too, which may stop the new one: a run caught by both
    fails, and says why)."""
    from raftsched.worker import limits as worker_limits
    monkeypatch.setattr(worker_limits, "run_server_answer_s", 1.0)

    async def t():
        s = await started()
        try:
            first, stopper = await _stopped_by_a_run(s, 60)
            after = [await execute(sh("echo ok"), c(f"next-{i}"), 20, sandbox=s) for i in range(4)]
            await asyncio.wait_for(stopper, 20)  # (it ended with the server it stopped)
            return first, s.server.pid, after, s.server.starts
        finally:
            await s.close()
    first, second, after, starts = run(t(), 90)
    assert first != second and starts >= 2, (first, second, starts)
    assert after[2].ok and after[3].ok, after
    assert all(o.ok or o.error == "the run server stopped before the run started" for o in after), after


def test_removing_a_runs_directory_opens_nothing_a_run_swapped_in(tmp_path, monkeypatch):
    """Root empties the run's tree, which a process the run left behind may still change: an
    entry found to be a directory may be a link to a FIFO by the time it is opened (root's open
    of it blocked for good, holding a worker thread). Here the swap is made at that instant,
    every time: the removal returns, opens no FIFO, and removes what it may."""
    import threading
    top = tmp_path / "run"
    (top / "d" / "e").mkdir(parents=True)
    (top / "d" / "e" / "f").write_text("x")
    (top / "plain").write_text("y")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_open = os.open

    def swapping_open(name, flags, mode=0o777, *, dir_fd=None):
        if name == "d" and dir_fd is not None and os.path.isdir(f"/proc/self/fd/{dir_fd}/d"):
            # the swap, once it was found to be a directory and just before it is opened
            os.rename("d", "d-moved", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.symlink(str(fifo), "d", dir_fd=dir_fd)
        return real_open(name, flags, mode, dir_fd=dir_fd)
    monkeypatch.setattr(os, "open", swapping_open)
    done = threading.Event()
    t = threading.Thread(target=lambda: (sb._rmtree(str(top)), done.set()), daemon=True)
    t.start()
    finished = done.wait(10)
    if not finished:
        with open(fifo, "wb"):  # let the blocked open go, so that the thread ends
            pass
    assert finished, "the removal blocked on a FIFO a run swapped in"
    assert fifo.exists() and not (top / "plain").exists()


def _count_in_memory(pid: int, needle: bytes) -> int:
    """How often ``needle`` is in process ``pid``'s readable memory (read as root)."""
    found = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            lo_hi, perms = line.split()[:2]
            if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line:
                continue
            lo, hi = (int(x, 16) for x in lo_hi.split("-"))
            try:
                mem.seek(lo)
                found += mem.read(hi - lo).count(needle)
            except (OSError, ValueError, OverflowError):
                pass
    return found


@as_root
def test_a_python_run_does_not_hold_an_earlier_runs_secrets_in_its_memory(marks, targets):
    """A python run is forked: from the run server it would get a copy of everything the
    server had read, earlier runs' requests and their secrets among them (a run can read its
    own memory). It is forked from a starter that never read a request."""
    canary = "K" + os.urandom(12).hex()

    async def t():
        s = await started()
        try:
            first = await execute(sh("true"), c("shell-first", secrets={"TOKEN": canary}), 20, sandbox=s)
            second = await execute(py("whoami"), c("py-first", secrets={"TOKEN": canary}), 20, sandbox=s)
            probe = asyncio.create_task(execute(py("sleeps"), c("probe", {"dir": str(marks)}), 60, sandbox=s))
            await wait_until(lambda: (marks / "probe.pid").exists(), 10, "the probe run to start")
            pid = int((marks / "probe.pid").read_text())
            in_probe = _count_in_memory(pid, canary.encode())
            in_server = _count_in_memory(s.server.pid, canary.encode())
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)
            return first, second, in_probe, in_server
        finally:
            await s.close()
    first, second, in_probe, in_server = run(t(), 90)
    assert first.ok and second.ok, (first, second)
    assert in_server > 0, "the server read the canary: what a fork of it would hold (the test's premise)"
    assert in_probe == 0, f"a later python run holds an earlier run's secret {in_probe} times"


@as_root
def test_the_root_import_path_is_resolved_and_counts_acls(marks, tmp_path):
    """An entry that is a link the run user may repoint (it sits in their directory) is given
    to the server resolved: the directory checked is the one read. A directory whose mode bits
    keep the run user out but whose ACL lets them in is writable."""
    user = resolve_run_user(None)
    safe = tmp_path / "safe"
    safe.mkdir()
    os.chmod(tmp_path, 0o755)
    link = marks / "link"  # (marks: mode 1777, the run user's to change)
    os.symlink(safe, link)
    assert sb.root_import_path([str(link)], user) == [os.path.realpath(safe)]
    if shutil.which("setfacl"):
        acl = tmp_path / "acl"
        acl.mkdir(mode=0o755)
        subprocess.run(["setfacl", "-m", f"u:{user.uid}:rwx", str(acl)], check=True)
        assert sb.root_import_path([str(acl)], user) == []


def test_a_stopped_run_server_is_replaced_when_every_run_times_out_sooner(monkeypatch):
    """Runs whose timeouts are all shorter than run_server_answer_s still have a stopped server
    replaced: the server is judged by its oldest run it did not answer."""
    from raftsched.worker import limits as worker_limits
    monkeypatch.setattr(worker_limits, "run_server_answer_s", 1.0)

    async def t():
        s = await started()
        try:
            first, stopper = await _stopped_by_a_run(s, 0.5)
            outs = []
            for i in range(20):  # short runs: each may time out until the server is replaced
                outs.append(await execute(sh("echo ok"), c(f"short-{i}"), 0.5, sandbox=s))
                if outs[-1].ok:
                    break
            await asyncio.gather(stopper, return_exceptions=True)
            return first, s.server.pid, outs
        finally:
            await s.close()
    first, second, outs = run(t(), 90)
    assert first != second and outs[-1].ok, (first, second, outs)


def test_removing_a_very_deep_tree_holds_few_descriptors_and_removes_it_all(tmp_path):
    """A descriptor a level, bounded: a run's tree deeper than that is moved up level by level,
    and removed whole."""
    top = tmp_path / "run"
    p = top
    for _ in range(300):
        p = p / "d"
    p.mkdir(parents=True)
    (p / "f").write_text("x")
    sb._rmtree(str(top))
    assert not top.exists()


def test_runs_die_with_the_run_server_and_the_next_run_starts_a_new_one(marks, targets):
    async def t():
        s = await started()
        try:
            first = s.server.pid
            task = asyncio.create_task(execute(py("sleeps"), c("orphan", {"dir": str(marks)}), 60, sandbox=s))
            await wait_until(lambda: (marks / "orphan.pid").exists(), 10, "the run to start")
            os.kill(first, signal.SIGKILL)
            out = await asyncio.wait_for(task, 20)
            pid = int((marks / "orphan.pid").read_text())
            await wait_until(lambda: not alive(pid), 10, "the orphaned run to be killed")
            again = await execute(py("async_whoami"), c("after"), 20, sandbox=s)
            return out, first, s.server.pid, again, s.server.starts, s.server.deaths
        finally:
            await s.close()
    out, first, second, again, starts, deaths = run(t(), 60)
    assert not out.ok and "the run server stopped" in out.error, out
    assert again.ok and second != first and starts == 2 and deaths == 1


def test_closing_the_sandbox_kills_what_runs_and_stops_the_server(marks, targets):
    async def t():
        s = await started()
        script = f'echo $$ > "{marks}/closed.tmp" && mv "{marks}/closed.tmp" "{marks}/closed.pid"; exec sleep 3600'
        task = asyncio.create_task(execute(sh(script), c("c"), 60, sandbox=s))
        await wait_until(lambda: (marks / "closed.pid").exists(), 10, "the run to start")
        server = s.server.pid
        await s.close()
        out = await asyncio.wait_for(task, 20)
        return out, server
    out, server = run(t(), 40)
    assert not out.ok
    assert not alive(int((marks / "closed.pid").read_text())) and not alive(server)


# ---------------------------------------------------------------------------- the run user
@as_root
def test_a_root_worker_runs_jobs_as_raftsched_run_or_nobody_and_never_as_root_unless_allowed():
    u = resolve_run_user(None)
    want = sb.DEFAULT_USER if _exists(sb.DEFAULT_USER) else sb.FALLBACK_USER
    assert u.name == want and u.uid != 0 and u.switches
    with pytest.raises(ConfigError, match="--allow-root-jobs"):
        resolve_run_user("root")
    with pytest.raises(ConfigError, match="--allow-root-jobs"):
        resolve_run_user("0")
    assert resolve_run_user("root", allow_root_jobs=True).uid == 0
    with pytest.raises(ConfigError, match="no such user"):
        resolve_run_user("no-such-user-x")


def test_another_user_needs_the_right_to_switch(monkeypatch):
    monkeypatch.setattr(sb, "can_switch_user", lambda: False)
    other = "nobody" if os.geteuid() != pwd.getpwnam("nobody").pw_uid else "root"
    with pytest.raises(ConfigError, match="needs root"):
        resolve_run_user(other, allow_root_jobs=True)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------------------- the node's files
def test_files_and_directories_a_job_could_read_are_refused_naming_them(tmp_path):
    f = tmp_path / "secret"
    f.write_text("x" * 32)
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    f.chmod(0o600)
    check_private(str(f), "cluster secret file", None)
    check_private(str(d), "data directory", None)
    f.chmod(0o640)
    with pytest.raises(ConfigError, match=f"cluster secret file {f} is open to group or others.*chmod 600"):
        check_private(str(f), "cluster secret file", None)
    d.chmod(0o755)
    with pytest.raises(ConfigError, match=f"data directory {d} is open to group or others.*chmod 700"):
        check_private(str(d), "data directory", None)
    with pytest.raises(ConfigError, match="No such file"):
        check_private(str(tmp_path / "nope"), "TLS key file", None)


@as_root
def test_a_file_the_run_user_owns_is_refused(tmp_path):
    user = resolve_run_user(None)
    f = tmp_path / "token"
    f.write_text("x" * 32)
    f.chmod(0o600)
    os.chown(f, user.uid, user.gid)
    with pytest.raises(ConfigError, match=f"owned by {user.name}, the user jobs run as"):
        check_private(str(f), "token file", user)


def _node(tmp_path: Path, *extra: str, data_mode: int = 0o700, key_mode: int | None = None) -> subprocess.CompletedProcess:
    secret, token = tmp_path / "secret", tmp_path / "token"
    for p in (secret, token):
        p.write_text("s" * 32)
        p.chmod(0o600)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    data.chmod(data_mode)
    args = []
    if key_mode is not None:
        key = tmp_path / "key.pem"
        key.write_text("not a key")
        key.chmod(key_mode)
        args = ["--tls-cert", str(key), "--tls-key", str(key)]
    return subprocess.run([sys.executable, "-m", "raftsched.cli", "node", "--id", "n", "--api", "127.0.0.1:1",
                           "--raft", "127.0.0.1:2", "--data-dir", str(data), "--cluster-secret-file", str(secret),
                           "--token-file", str(token), *args, *extra],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])


def test_a_node_refuses_to_start_on_a_data_directory_or_a_tls_key_others_may_read(tmp_path):
    p = _node(tmp_path, data_mode=0o755)
    assert p.returncode == 2 and f"data directory {tmp_path / 'data'} is open to group or others" in p.stderr, p.stderr
    p = _node(tmp_path, key_mode=0o644)
    assert p.returncode == 2 and f"TLS key file {tmp_path / 'key.pem'} is open to group or others" in p.stderr, p.stderr


@as_root
def test_a_root_node_refuses_to_run_jobs_as_root_unless_told(tmp_path):
    p = _node(tmp_path, "--run-as", "root")
    assert p.returncode == 2 and "--allow-root-jobs" in p.stderr, p.stderr
    # A node that runs no job code needs no run user: it gets past that check (and stops at the
    # next one, before it would start).
    p = _node(tmp_path, "--run-as", "root", "--executors", "http", "--auth-failures-burst", "0")
    assert p.returncode == 2 and "--auth-failures-burst" in p.stderr, p.stderr
    p = _node(tmp_path, "--runs-dir", str(tmp_path / "data"))
    assert p.returncode == 2 and "inside the data directory" in p.stderr, p.stderr


_HOLD_LOCK = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
              "print('locked', flush=True); sys.stdin.read()")


def _hold_lock(path: Path) -> subprocess.Popen:
    """A process that holds an exclusive flock on ``path`` until its stdin closes (or it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 10)
        assert ready and p.stdout.readline().strip() == "locked", "the helper did not take the lock"
    except BaseException:
        p.kill()
        p.wait()
        raise
    return p


def _runs_dir(parent: Path, name: str, lock: bool = True) -> Path:
    d = parent / f"{sb.RUNS_PREFIX}{name}-abcdefgh"
    (d / "r-1.xyz").mkdir(parents=True)
    (d / "r-1.xyz" / "left").write_text("x")
    if lock:
        (d / sb.RUNS_LOCK).write_text("")
    return d


def test_a_worker_that_starts_removes_the_runs_directories_of_killed_ones(tmp_path):
    """A worker killed with SIGKILL never removes its runs' directories; the next one to start in
    the same place does (no one holds the directory's lock), and leaves alone a live worker's
    (its lock is held), whatever its name's pid says: in another pid namespace (containers sharing
    a /tmp), a live worker's pid looks dead here."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = _runs_dir(tmp_path, f"node-1.{dead.pid}")
    held = _runs_dir(tmp_path, f"node-2.{dead.pid}")   # a live worker of another pid namespace
    older = _runs_dir(tmp_path, f"node-3.{dead.pid}", lock=False)  # no lock file: left alone
    other = tmp_path / "raftsched-runs-not-ours"
    other.mkdir()
    target = _runs_dir(tmp_path / "elsewhere", f"node-4.{dead.pid}")  # a free lock, behind a link
    link = tmp_path / f"{sb.RUNS_PREFIX}node-5.{dead.pid}-abcdefgh"
    link.symlink_to(target)
    holder = _hold_lock(held / sb.RUNS_LOCK)
    try:
        async def t():
            first = await started(runs_parent=str(tmp_path))
            try:
                # A worker of this process that runs: its lock is held too (by its descriptor).
                second = await started(runs_parent=str(tmp_path))
                await second.close()
                return first.runs_dir, sorted(os.listdir(first.runs_dir))
            finally:
                await first.close()
        mine, inside = run(t())
        assert inside == [sb.RUNS_LOCK]
        assert not stale.exists() and held.exists() and older.exists() and other.exists()
        assert (held / "r-1.xyz" / "left").exists() and (older / "r-1.xyz" / "left").exists()
        assert link.is_symlink() and (target / "r-1.xyz" / "left").exists(), "nothing followed through a link"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([held.name, older.name, other.name, link.name,
                                                                     "elsewhere"])
        assert not os.path.exists(mine)
        # Its owner gone (killed), the lock is free: the next sweep removes it.
        assert sb.sweep_runs_dirs(str(tmp_path)) == []
        holder.kill()
        holder.wait(10)
        assert sb.sweep_runs_dirs(str(tmp_path)) == [str(held)]
        assert not held.exists() and older.exists()
    finally:
        holder.kill()
        holder.wait(10)


def test_no_run_and_not_the_run_server_holds_the_runs_directory_lock():
    """The lock is the worker's alone: were a run (or the run server) to hold it, a run left
    behind by a killed worker would keep its directory from being removed, and a run could
    drop it early."""
    async def t():
        s = await started()  # (the system's temporary directory: the run user must reach it)
        try:
            res = await s.run_shell(sh("ls -l /proc/$$/fd/ 2>&1; echo done"), c(), 10, None, 1.0)
            server_fds = [os.readlink(f"/proc/{s.server.pid}/fd/{n}") for n in os.listdir(f"/proc/{s.server.pid}/fd")]
            swept = sb.sweep_runs_dirs(os.path.dirname(s.runs_dir))
            return res, server_fds, s.runs_dir not in swept and os.path.exists(s.runs_dir)
        finally:
            await s.close()
    (ok, err, out), server_fds, kept = run(t())
    assert ok, (err, out)
    assert "done" in out and sb.RUNS_LOCK not in out, out
    assert server_fds and not any(sb.RUNS_LOCK in f for f in server_fds), server_fds
    assert kept, "a worker's own sweep leaves its own directory"


def _worker(tmp_path: Path, *extra: str, token_owner: int | None = None) -> subprocess.CompletedProcess:
    token = tmp_path / "wtoken"
    token.write_text("t" * 32)
    token.chmod(0o600)
    if token_owner is not None:
        os.chown(token, token_owner, -1)
    return subprocess.run([sys.executable, "-m", "raftsched.cli", "worker", "--url", "http://127.0.0.1:1",
                           "--token-file", str(token), "--id", "w", *extra],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])


def test_a_worker_checks_its_isolation_flags_before_it_starts(tmp_path):
    p = _worker(tmp_path, "--pass-env", "RAFTSCHED_TOKEN")
    assert p.returncode == 2 and "--pass-env: RAFTSCHED_TOKEN is set by the worker" in p.stderr, p.stderr
    p = _worker(tmp_path, "--runs-dir", str(tmp_path / "nope"))
    assert p.returncode == 2 and "--runs-dir" in p.stderr and "not a directory" in p.stderr, p.stderr
    p = _worker(tmp_path, "--run-as", "no-such-user-x")
    assert p.returncode == 2 and "no such user" in p.stderr, p.stderr


@as_root
def test_a_root_worker_refuses_root_jobs_and_a_token_file_its_run_user_owns(tmp_path):
    p = _worker(tmp_path, "--run-as", "root")
    assert p.returncode == 2 and "--allow-root-jobs" in p.stderr, p.stderr
    p = _worker(tmp_path, token_owner=resolve_run_user(None).uid)
    assert p.returncode == 2 and "the user jobs run as" in p.stderr, p.stderr


def test_a_worker_whose_run_server_cannot_start_fails_at_once_saying_why(monkeypatch):
    """A worker that cannot run jobs' code stops (a node with it), rather than lease runs it
    would fail one by one."""
    from raftsched.clock import SystemClock
    from raftsched.worker.loop import LeaseLoop, WorkerFailed

    async def broken(self):
        raise sb.RunServerError("the run server could not start: PermissionError: no")
    monkeypatch.setattr(sb.RunServer, "_start", broken)

    class Never:
        worker_id = "w"
        kind = "remote"

    async def t():
        loop = LeaseLoop(Never(), SystemClock(), sandbox=box())
        with pytest.raises(WorkerFailed, match="sandbox failed: the run server could not start"):
            await loop.run()
        return loop
    assert run(t()).failed == "sandbox"
