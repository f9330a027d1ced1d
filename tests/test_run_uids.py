"""Per-run users (``--run-uids LO-HI``; worker/sandbox.py, worker/runserver.py; docs/security.md,
"What a job can reach"): each shell and python run of a root worker as a uid of its own, which no
other live run of the worker holds; what a run leaves running is killed when it ends, before its
uid is given again; and the flag's checks.

Real processes, as root (as CI runs): skipped otherwise, or where this machine cannot switch to
the test's uids. Every wait is for a condition under a deadline, and every process a test starts
is killed at its end (the ``marks`` fixture, by the pid files the runs write).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from executor_helpers import cancel_and_expect_cancelled, ctx, run, wait_until
from procs import alive, pid_marks, targets_on_path, wait_dead
from raftsched.config import ConfigError
from raftsched.worker.executors import CancelEvent, RunContext, execute
from raftsched.worker import sandbox as sb
from raftsched.worker.sandbox import Sandbox, parse_run_uids, resolve_run_user

#: Far above any uid or gid a test machine's /etc/passwd or /etc/group holds.
LO = 1_900_000_000
REPO = Path(__file__).resolve().parents[1]


def _can_switch() -> str | None:
    """Why this machine cannot run a process as uid LO (None: it can)."""
    if os.geteuid() != 0:
        return "per-run users need a worker running as root"
    try:
        parse_run_uids(f"{LO}-{LO + 3}", 1)
    except ConfigError as e:
        return f"the test's uids are taken here: {e}"
    try:
        p = subprocess.run(["true"], user=LO, group=LO, extra_groups=[], timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot switch to uid {LO}: {e}"
    return None if p.returncode == 0 else f"cannot switch to uid {LO}: exit {p.returncode}"


WHY_NOT = _can_switch()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

TARGETS = textwrap.dedent('''
    import os
    import subprocess

    def leave_one(ctx):
        # A process of its own session that outlives the run unless its uid's are killed.
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)
        return {"pid": p.pid}

    def whoami(ctx):
        st = os.stat(".")
        return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
                "home_owner": [st.st_uid, st.st_gid, oct(st.st_mode & 0o777)], "home": os.getcwd()}
''')


@pytest.fixture(scope="module")
def targets():
    yield from targets_on_path("uid-targets", "run_uids_targets.py", TARGETS)


@pytest.fixture
def marks():
    """A directory every run may write (1777); every pid a run wrote there is killed after."""
    yield from pid_marks("uid-marks")


async def started(n: int = 4) -> Sandbox:
    s = Sandbox(resolve_run_user(None), name="uids", run_uids=range(LO, LO + n))
    await s.start()
    return s


def sh(script: str, **kw) -> dict:
    return {"type": "shell", "argv": ["sh", "-c", script], **kw}


def c(run_id: str) -> RunContext:
    x = ctx(run_id, None)
    x.worker_id = "w-1"
    x.secrets = {}
    return x


def fields(output: str) -> dict:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def _wait_for(path: str, seconds: int = 20) -> str:
    """Shell: wait (bounded) until ``path`` exists."""
    return f'n=0; while [ ! -e "{path}" ] && [ $n -lt {seconds * 20} ]; do sleep 0.05; n=$((n+1)); done; '


def test_two_runs_at_once_are_two_users_that_cannot_read_or_write_each_others(marks):
    # A holds a secret in its environment and waits; B, meanwhile, tries its /proc environ and
    # its directory.
    a_script = (f'echo "uid=$(id -u)"; echo "home=$HOME"; echo $HOME > "{marks}/a.home"; '
                f'echo $$ > "{marks}/a.pid.tmp"; mv "{marks}/a.pid.tmp" "{marks}/a.pid"; '
                + _wait_for(f"{marks}/b.done") + 'echo "after=$(ls -A "$HOME")"')
    b_script = (_wait_for(f"{marks}/a.pid") + f'a=$(cat "{marks}/a.pid"); ahome=$(cat "{marks}/a.home"); '
                'echo "uid=$(id -u)"; '
                'if tr "\\0" "\\n" < /proc/$a/environ; then echo "environ=read"; else echo "environ=refused"; fi; '
                'if touch "$ahome/planted" 2>/dev/null; then echo "plant=made"; else echo "plant=refused"; fi; '
                'if kill -0 $a 2>/dev/null; then echo "signal=sent"; else echo "signal=refused"; fi; '
                f'touch "{marks}/b.done"')

    async def t():
        s = await started()
        try:
            return await asyncio.gather(
                execute(sh(a_script, env={"TENANT_A_SECRET": "a-secret-value"}), c("a"), 30, sandbox=s),
                execute(sh(b_script), c("b"), 30, sandbox=s))
        finally:
            await s.close()
    a, b = run(t())
    assert a.ok and b.ok, (a, b)
    fa, fb = fields(a.output), fields(b.output)
    assert fa["uid"] != fb["uid"], (fa, fb)
    assert {int(fa["uid"]), int(fb["uid"])} <= set(range(LO, LO + 4))
    assert "a-secret-value" not in b.output, b.output
    assert fb["environ"] == "refused" and fb["plant"] == "refused" and fb["signal"] == "refused", b.output
    assert fa["after"] == "", a.output


@pytest.mark.parametrize("ending", ["exit", "timeout", "lease lost", "cancelled"])
def test_what_a_run_leaves_running_is_killed_when_it_ends(marks, ending):
    # In a session of its own: out of the run's process group, which the worker kills anyway.
    script = (f'setsid sh -c \'echo $$ > "{marks}/bg.pid.tmp"; mv "{marks}/bg.pid.tmp" "{marks}/bg.pid"; '
              'exec sleep 300\' > /dev/null 2>&1 < /dev/null & '
              + _wait_for(f"{marks}/bg.pid") + 'echo left'
              + ("" if ending == "exit" else "; sleep 300"))

    async def t():
        s = await started()
        try:
            cancel = CancelEvent()
            task = asyncio.create_task(execute(sh(script), c("leaves"), 2 if ending == "timeout" else 30,
                                               kill_grace_s=0.3, cancel=cancel, sandbox=s))
            await wait_until(lambda: (marks / "bg.pid").exists(), 10, "the run to start its process")
            if ending == "lease lost":
                cancel.set()
            if ending == "cancelled":
                await cancel_and_expect_cancelled(task)
                # (the run's end, its uid's kill among it, goes on shielded from the cancel)
                await wait_until(lambda: len(s._uids_free) == 4, 10, "the uid freed")
                out = None
            else:
                out = await task
            pid = int((marks / "bg.pid").read_text())
            # Killed before run_shell returned (SIGKILL, delivered at once): only its zombie may
            # linger until it is reaped.
            await wait_until(lambda: not alive(pid), 10, "the left process killed")
            return out, pid, list(s._uids_free)
        finally:
            await s.close()
    out, pid, free = run(t())
    if ending in ("exit", "timeout"):
        assert out.output.startswith("left"), out
        assert out.ok == (ending == "exit"), out
    if ending == "lease lost":
        assert not out.ok and out.error == "lease lost", out
    assert not alive(pid)
    assert sorted(free) == list(range(LO, LO + 4)), "the uid is free again"


def test_a_run_that_stops_every_process_of_its_uid_cannot_stop_the_kill_of_its_uid(marks):
    """A process of the run's uid that sends SIGSTOP to all it may signal, again and again: the
    kill of its uid is no process it may signal, so the run server neither hangs nor leaves it."""
    script = (f'setsid sh -c \'echo $$ > "{marks}/bg.pid.tmp"; mv "{marks}/bg.pid.tmp" "{marks}/bg.pid"; '
              'while :; do kill -STOP -1; done\' > /dev/null 2>&1 < /dev/null & '
              + _wait_for(f"{marks}/bg.pid") + 'sleep 300')

    async def t():
        s = await started()
        try:
            out = await execute(sh(script), c("stopper"), 2, kill_grace_s=0.3, sandbox=s)
            pid = int((marks / "bg.pid").read_text())
            await wait_until(lambda: not alive(pid), 10, "the stopping process killed")
            after = await execute(sh("echo fine"), c("after"), 10, sandbox=s)
            return out, after, s.server.starts, sorted(s._uids_free)
        finally:
            await s.close()
    out, after, starts, free = run(t())
    assert not out.ok and after.ok and after.output == "fine\n", (out, after)
    assert starts == 1, "the run server answered throughout"
    assert free == list(range(LO, LO + 4))


def test_a_run_server_that_stops_kills_what_its_runs_left_running(marks):
    script = (f'setsid sh -c \'echo $$ > "{marks}/bg.pid.tmp"; mv "{marks}/bg.pid.tmp" "{marks}/bg.pid"; '
              'exec sleep 300\' > /dev/null 2>&1 < /dev/null & ' + _wait_for(f"{marks}/bg.pid") + 'sleep 300')

    async def t():
        s = await started()
        try:
            task = asyncio.create_task(execute(sh(script), c("held"), 60, sandbox=s))
            await wait_until(lambda: (marks / "bg.pid").exists(), 20, "the run started its process")
        finally:
            await s.close()  # the worker stops: its server kills every uid it gave out
        await asyncio.gather(task, return_exceptions=True)
        pid = int((marks / "bg.pid").read_text())
        await wait_until(lambda: not alive(pid), 10, "the left process killed")
        return pid
    assert not alive(run(t()))


def test_a_python_run_is_its_own_uid_too(targets):
    async def t():
        s = await started()
        try:
            out = await execute({"type": "python", "target": "run_uids_targets:whoami"}, c("py"), 30, sandbox=s)
            with open(f"/proc/{s.server.pid}/status") as f:
                server_uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
            return out, server_uids
        finally:
            await s.close()
    out, server_uids = run(t())
    assert server_uids == ["0"] * 4, "the run server stays root: no run may signal it"
    assert out.ok, out
    got = eval(out.output, {"__builtins__": {}})
    assert LO <= got["uid"] < LO + 4 and got["euid"] == got["uid"] == got["gid"], got
    assert got["groups"] in ([], [got["gid"]]), got
    assert got["home_owner"] == [got["uid"], got["uid"], "0o700"], got


def test_a_uid_is_given_again_once_its_run_ended(marks):
    async def t():
        s = await started(2)
        try:
            def hold(name: str) -> str:
                return f'touch "{marks}/{name}.up"; ' + _wait_for(f"{marks}/go") + "id -u"
            first = asyncio.gather(execute(sh(hold("h1")), c("h1"), 30, sandbox=s),
                                   execute(sh(hold("h2")), c("h2"), 30, sandbox=s))
            # Both runs hold their uids at once, then end.
            await wait_until(lambda: len(list(marks.glob("*.up"))) == 2, 20, "both runs up")
            (marks / "go").touch()
            both = await first
            after = [await execute(sh("id -u"), c(f"n{k}"), 30, sandbox=s) for k in range(3)]
            return both, after
        finally:
            await s.close()
    both, after = run(t())
    assert all(o.ok for o in both + after), (both, after)
    assert sorted(int(o.output) for o in both) == [LO, LO + 1]
    assert [int(o.output) for o in after] == [LO, LO, LO], "the lowest free uid, again and again"


@pytest.mark.parametrize("value, says", [
    ("abc", "expected LO-HI"),
    ("1900000005-1900000001", "is above"),
    ("0-2000", "from 1000"),
    ("999-2000", "from 1000"),
    (f"{LO}-{2**31 - 1}", "from 1000"),
    (f"{LO}-{LO + 1}", "2 uid(s) for 4 slots"),
    ("100000-2000000000", "more than 65536"),  # (a list of ~1.9 billion uids, before)
])
def test_bad_run_uids_are_refused_naming_the_flag(tmp_path, value, says):
    for cmd in ("worker", "node"):
        p = _cli(tmp_path, cmd, "--run-uids", value, "--slots", "4")
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        line = p.stderr.strip().splitlines()[-1]
        assert "--run-uids" in line and says in line, (cmd, p.stderr)


def test_run_uids_that_hold_a_user_or_group_of_this_host_or_come_with_run_as_are_refused(tmp_path, monkeypatch):
    import grp
    import pwd
    users = [pwd.struct_passwd(("tenant-x", "x", LO + 5, 100, "", "/", "/bin/sh")),
             pwd.struct_passwd(("tenant-y", "x", 100, LO + 7, "", "/", "/bin/sh"))]
    groups = [grp.struct_group(("team-z", "x", LO + 9, []))]
    monkeypatch.setattr(sb.pwd, "getpwall", lambda: users)
    monkeypatch.setattr(sb.grp, "getgrall", lambda: groups)
    with pytest.raises(ConfigError, match=f"^--run-uids {LO}-{LO + 5}: includes uid {LO + 5} of user tenant-x"):
        parse_run_uids(f"{LO}-{LO + 5}", 1)
    with pytest.raises(ConfigError, match=f"^--run-uids {LO + 6}-{LO + 7}: includes gid {LO + 7} of user tenant-y"):
        parse_run_uids(f"{LO + 6}-{LO + 7}", 1)
    with pytest.raises(ConfigError, match=f"^--run-uids {LO + 8}-{LO + 20}: includes gid {LO + 9} of group team-z"):
        parse_run_uids(f"{LO + 8}-{LO + 20}", 1)
    assert parse_run_uids(f"{LO + 10}-{LO + 20}", 11) == range(LO + 10, LO + 21)
    # A user's subordinate ids (rootless containers), and a user a directory knows but does not list.
    monkeypatch.setattr(sb, "_subordinate_ranges",
                        lambda path: [("alice", LO + 30, 65536)] if path == "/etc/subuid" else [])
    with pytest.raises(ConfigError, match=f"^--run-uids {LO + 21}-{LO + 40}: overlaps alice's subordinate ids"):
        parse_run_uids(f"{LO + 21}-{LO + 40}", 1)
    monkeypatch.setattr(sb.pwd, "getpwuid", lambda u: users[0] if u == LO + 25 else (_ for _ in ()).throw(KeyError(u)))
    with pytest.raises(ConfigError, match=f"^--run-uids {LO + 21}-{LO + 29}: includes uid {LO + 25} of user tenant-x"):
        parse_run_uids(f"{LO + 21}-{LO + 29}", 1)
    monkeypatch.setattr(sb.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="^--run-uids: .*needs root"):
        parse_run_uids(f"{LO}-{LO + 9}", 1)
    monkeypatch.undo()
    p = _cli(tmp_path, "worker", "--run-uids", f"{LO}-{LO + 9}", "--run-as", "nobody")
    assert p.returncode == 2 and "--run-uids" in p.stderr and "--run-as" in p.stderr, p.stderr


def test_a_range_another_worker_of_the_host_holds_in_part_is_refused_and_freed_when_it_ends(tmp_path):
    """Two workers of a host with overlapping ``--run-uids`` would give one uid to two runs, and
    each run's end (and each run server's start) kills every process of its uids: the other
    worker's runs too. Each process claims its range on the host (sandbox.claim_run_uids); a
    second claim of any part of it is refused naming the uids, one of another part is not, and a
    claim ends with its process. Before, nothing noticed."""
    claims = str(tmp_path / "claims" / "run-uids.lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from raftsched.worker.sandbox import claim_run_uids
            claim_run_uids(range({LO + 100}, {LO + 110}), {claims!r})
            print("claimed", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(ConfigError, match=f"^--run-uids {LO + 105}-{LO + 120}: another worker of this host holds "
                                              f"part of this range \\(uids {LO + 105}-{LO + 109} of it\\)"):
            sb.claim_run_uids(range(LO + 105, LO + 121), claims)
        with pytest.raises(ConfigError, match="another worker of this host"):
            sb.claim_run_uids(range(LO + 90, LO + 101), claims)
        sb.claim_run_uids(range(LO + 110, LO + 120), claims)  # next to it: no overlap
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    sb.claim_run_uids(range(LO + 100, LO + 110), claims)  # its process ended: free again
    # A fork of the claimant (a node's dump writer) does not keep the claim after the claimant ends.
    gone = tmp_path / "child-may-go"
    forker = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, sys, time
            from raftsched.worker.sandbox import claim_run_uids
            claim_run_uids(range({LO + 300}, {LO + 310}), {claims!r})
            pid = os.fork()
            if pid == 0:  # the child outlives its parent until the test lets it go
                deadline = time.monotonic() + 60
                while not os.path.exists({str(gone)!r}) and time.monotonic() < deadline:
                    time.sleep(0.05)  # ok-sleep: waiting for a file the test makes, within a deadline
                os._exit(0)
            print(pid, flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = None
    try:
        child = int(forker.stdout.readline())
    finally:
        forker.stdin.close()
        forker.wait(timeout=30)
    try:
        assert child is not None and alive(child)
        sb.claim_run_uids(range(LO + 300, LO + 310), claims)  # the claimant ended: free, its fork lives on
    finally:
        gone.touch()
        if child is not None:
            wait_dead(child)
    # The CLI claims the range before anything else: a worker given a held range exits 2 naming it.
    sb.claim_run_uids(range(LO + 200, LO + 209))
    p = _cli(tmp_path, "worker", "--run-uids", f"{LO + 205}-{LO + 215}", "--slots", "2")
    assert p.returncode == 2, (p.stdout, p.stderr)
    line = p.stderr.strip().splitlines()[-1]
    assert f"--run-uids {LO + 205}-{LO + 215}: another worker of this host" in line, p.stderr


def _cli(tmp_path: Path, cmd: str, *extra: str) -> subprocess.CompletedProcess:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    if cmd == "worker":
        args = ["worker", "--url", "http://127.0.0.1:1", "--token-file", str(token), "--id", "w"]
    else:
        secret, data = tmp_path / "secret", tmp_path / "data"
        secret.write_text("s" * 32)
        secret.chmod(0o600)
        data.mkdir(exist_ok=True, mode=0o700)
        args = ["node", "--id", "n", "--api", "127.0.0.1:1", "--raft", "127.0.0.1:2", "--data-dir", str(data),
                "--cluster-secret-file", str(secret), "--token-file", str(token)]
    return subprocess.run([sys.executable, "-m", "raftsched.cli", *args, *extra],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.cluster
def test_a_node_started_with_run_uids_runs_its_jobs_as_them(tmp_path):
    """The flag, end to end: ``raftsched node --run-uids`` to the node's worker's runs."""
    from procs import Cluster, wait_for
    lo, hi = LO + 10, LO + 13
    c = Cluster(tmp_path, n=1, node_args=["--slots", "2", "--run-uids", f"{lo}-{hi}"])
    c.start()
    try:
        c.wait_leader(30)
        s, b = c.call(0, "PUT", "/v1/jobs/uid-probe",
                      {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"},
                       "executor": {"type": "shell", "argv": ["sh", "-c", "id -u; id -G; stat -c %u:%a $HOME"]}})
        assert s == 201, b
        s, b = c.call(0, "POST", "/v1/jobs/uid-probe/trigger")
        assert s == 201, b
        rid = b["run"]

        def finished():
            s, r = c.call(0, "GET", f"/v1/runs/{rid}")
            return (r,) if s == 200 and r["state"] in ("succeeded", "dead", "failed") else None
        r = wait_for(finished, 60, f"run {rid} to finish")[0]
    finally:
        c.stop()
    assert r["state"] == "succeeded", r
    uid, groups, home = r["output"].split()
    assert lo <= int(uid) <= hi and groups == uid and home == f"{uid}:700", r["output"]


def test_a_uid_whose_processes_could_not_be_killed_waits_for_a_new_run_server(monkeypatch):
    """Not given again while what its run left may still run; a run server that starts kills
    every process of the range's uids, so after one the uid is free again."""
    real = sb.RunServer.kill_uid
    failing = [True]

    async def kill_uid(self, uid):
        return False if failing[0] else await real(self, uid)
    monkeypatch.setattr(sb.RunServer, "kill_uid", kill_uid)

    async def t():
        s = await started(2)
        try:
            first = await execute(sh("id -u"), c("stuck"), 30, sandbox=s)
            stuck = (sorted(s._uids_free), dict(s._uids_stuck))
            failing[0] = False
            second = await execute(sh("id -u"), c("other"), 30, sandbox=s)
            still = sorted(s._uids_free)
            s.server.stalled("the test")  # killed: the next run starts a new server
            await wait_until(lambda: not s.server.alive, 10, "the server gone")
            third = await execute(sh("id -u"), c("after"), 30, sandbox=s)
            return first, stuck, second, still, third, sorted(s._uids_free)
        finally:
            await s.close()
    first, stuck, second, still, third, free = run(t())
    assert first.ok and second.ok and third.ok, (first, second, third)
    assert int(first.output) == LO and stuck == ([LO + 1], {LO: 1})
    assert int(second.output) == LO + 1 and still == [LO + 1], "the stuck uid is not given again"
    assert free == [LO, LO + 1], "free again once a new server swept the range"


def test_a_python_run_cancelled_at_once_leaves_no_process_of_its_uid(targets):
    """A review: the starter answered a python run's pid right after its fork, before the child
    was in its session and its uid; a run cancelled at once (a lease lost before the server
    answered) had its group and its uid killed in that gap, found nothing, and the child then
    became the uid, ran, and outlived it while the uid went to the next run (3 of 20 here).
    The pid is answered once the child is its own user: nothing of the uid is left."""
    def uids_running(lo: int, hi: int) -> set[int]:
        """The uids from lo to hi with a live process (a zombie left to a PID 1 that reaps late is
        none: it runs nothing; nor is a process with a SIGKILL pending, which the kernel has not
        scheduled to die yet on a busy machine: it runs no more of its code. The any-year step
        found one such, once in 40, in the instant after the kill)."""
        out = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    status = Path(f"/proc/{name}/status").read_text()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                pending = int(fields.get("SigPnd", "0").strip() or "0", 16) | int(fields.get("ShdPnd", "0").strip() or "0", 16)
                if fields.get("State", "").strip()[:1] not in ("Z", "X") and not pending & (1 << (signal.SIGKILL - 1)):
                    out.update(u for u in map(int, fields.get("Uid", "").split()) if lo <= u <= hi)
        return out

    async def t():
        s = await started(2)
        left = []
        try:
            for k in range(40):
                cancel = CancelEvent()
                cancel.set()
                # (the sandbox's own call: the executor looks at cancel before it, the sandbox after)
                await s.run_python({"type": "python", "target": "run_uids_targets:leave_one"}, c(f"py-{k}"), 30,
                                   cancel, 1.0)
                left.append(sorted(uids_running(LO, LO + 1)))
        finally:
            await s.close()
        return left
    left = run(t())
    assert not any(left), f"processes of a run's uid outlived it: {left}"
