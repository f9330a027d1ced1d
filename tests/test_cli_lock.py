"""``raftsched lock NAME -- COMMAND``: a command of the host run while it holds one of the
cluster's locks, as flock(1) on one host (raftsched/lock_cli.py); ``lock-show`` and
``lock-release``. Against one real node (a module's cluster), each process stopped by PID."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import pytest

from procs import REPO, running_cluster, wait_for
from raftsched.client import Client
from raftsched.lock_cli import EXIT_HELD, EXIT_LOST


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("cli-lock"), n=1)


def argv(c, *args):
    return [sys.executable, "-m", "raftsched.cli", *args[:2], "--url", c.url(0), "--token", c.token, *args[2:]]


def cli(c, *args, timeout_s=60):
    return subprocess.run(argv(c, *args), capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def client(c) -> Client:
    return Client(c.url(0), token=c.token)


def held_by(cl: Client, name: str, owner: str):
    info = cl.lock_info(name)
    return info if info is not None and info["owner"] == owner else None


def test_the_command_runs_with_its_token_its_status_is_kept_and_the_lock_is_released(node, tmp_path):
    out = tmp_path / "token"
    p = cli(node, "lock", "nightly", "--owner", "host-a", "--",
            "sh", "-c", f'echo "$RAFTSCHED_LOCK_NAME $RAFTSCHED_LOCK_OWNER $RAFTSCHED_LOCK_TOKEN" > {out}; exit 3')
    assert p.returncode == 3, p.stderr
    name, owner, token = out.read_text().split()
    assert (name, owner) == ("nightly", "host-a") and int(token) > 0
    assert client(node).lock_info("nightly") is None, "released when the command ended"
    p = cli(node, "lock", "nightly")
    assert p.returncode == 2 and "give the command to run after --" in p.stderr
    p = cli(node, "lock", "nightly", "--", "/nonexistent/cmd")
    assert p.returncode == 127 and "cannot run '/nonexistent/cmd'" in p.stderr, p.stderr
    assert client(node).lock_info("nightly") is None, "released when the command could not start"


def test_a_lock_another_holds_runs_nothing_and_says_who_then_lock_release_frees_it(node, tmp_path):
    cl = client(node)
    token = cl.lock_acquire("report", "host-b", 60)["token"]
    marker = tmp_path / "ran"
    for extra in ((), ("--wait", "--timeout", "1")):
        p = cli(node, "lock", "report", *extra, "--", "touch", str(marker))
        assert p.returncode == EXIT_HELD and "held by 'host-b'" in p.stderr, (extra, p.stderr)
        # when its lease ends, as an instant (a walk read "ends at 1796683716107 ms")
        assert re.search(r"its lease ends at \d{4}-\d\d-\d\dT[0-9:.]+Z unless renewed", p.stderr), p.stderr
        assert not marker.exists(), "the command did not run"
    p = cli(node, "lock-show", "report", "-o", "json")
    assert p.returncode == 0 and f'"token": {token}' in p.stdout and "host-b" in p.stdout, p.stdout
    p = cli(node, "lock-release", "report", "--fencing-token", str(token + 1000))
    assert p.returncode == 1 and "does not hold" in p.stdout + p.stderr, p.stdout + p.stderr
    assert cli(node, "lock-release", "report", "--fencing-token", str(token)).returncode == 0
    p = cli(node, "lock-show", "report", "-o", "json")
    assert p.returncode == 0 and '"held": false' in p.stdout, p.stdout
    assert cli(node, "lock", "report", "--", "touch", str(marker)).returncode == 0 and marker.exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _locked_shell_with_a_child(node, tmp_path, name: str, owner: str, ttl: str):
    """``raftsched lock NAME`` running ``sh`` that started ``sleep 120`` in the background,
    held: yields (the lock CLI's process, the lock's info, the sleep's pid); both stopped after."""
    cl = client(node)
    pidfile = tmp_path / "grandchild"
    proc = subprocess.Popen(argv(node, "lock", name, "--owner", owner, "--ttl", ttl, "--kill-after", "2",
                                 "--", "sh", "-c", f"sleep 120 & echo $! > {pidfile}; wait"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    grandchild = None
    try:
        info = wait_for(lambda: held_by(cl, name, owner), 30, "the lock held by the command's raftsched lock")
        grandchild = int(wait_for(lambda: pidfile.read_text().strip(), 30, "the command's child started"))
        yield proc, info, grandchild
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if grandchild is not None and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_lost_lease_stops_the_command_and_all_it_started_and_says_so(node, tmp_path):
    """And not the shell alone: its child (a review: sh -c '...' died, its sleep ran on, and
    another host took the lock) is in the same process group, stopped with it."""
    with _locked_shell_with_a_child(node, tmp_path, "lost", "host-c", "2") as (proc, info, grandchild):
        client(node).lock_release("lost", info["token"])  # as an operator breaking it: the next renew is refused
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_LOST, err
        assert "is lost: stopping the command" in err, err
        assert not _alive(grandchild), "the command's child outlived the lost lease"


def test_a_raftsched_lock_killed_9_stops_its_command_and_all_it_started(node, tmp_path):
    """A walk: ``raftsched lock`` killed -9 left its command running without the lock (no one
    renews the lease), while a second holder ran: two holders at once. Its guard, a process of
    its own, sees it gone and stops the command's process group."""
    with _locked_shell_with_a_child(node, tmp_path, "killed", "host-k", "30") as (proc, _info, grandchild):
        proc.kill()
        _, err = proc.communicate(timeout=30)
        wait_for(lambda: not _alive(grandchild), 20, "the command's child stopped by the guard")
        assert "gone while its command ran: stopping the command" in err, err


def test_a_signal_to_raftsched_lock_reaches_the_command_and_the_lock_is_released_after_it(node, tmp_path):
    cl = client(node)
    started = tmp_path / "started"
    proc = subprocess.Popen(argv(node, "lock", "sig", "--owner", "host-d", "--",
                                 "sh", "-c", f"trap 'exit 7' TERM; touch {started}; while :; do sleep 0.05; done"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        wait_for(lambda: held_by(cl, "sig", "host-d"), 30, "the lock held")
        wait_for(started.exists, 30, "the command running")  # (a signal before it runs: nothing runs)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 7, err
        assert cl.lock_info("sig") is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_signal_while_waiting_for_the_lock_ends_the_wait_and_runs_nothing(node, tmp_path):
    """A review: a SIGTERM before the command started killed raftsched lock by the default
    action, a lock it had acquired then held with nobody to renew or release it. The handlers are
    in place from the start: the wait ends, nothing runs, the status is 128 + 15."""
    cl = client(node)
    other = cl.lock_acquire("waited", "host-e", 60)["token"]
    marker = tmp_path / "ran"
    proc = subprocess.Popen(argv(node, "lock", "waited", "--wait", "--", "touch", str(marker)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        first = proc.stderr.readline()  # (it says so once it waits: its handlers are in place)
        while first.startswith("raftsched: warning"):
            first = proc.stderr.readline()
        assert first.startswith("raftsched lock: lock 'waited' is held by 'host-e': waiting"), first
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM and "it did not run" in err, err
        assert not marker.exists() and cl.lock_info("waited")["token"] == other
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cl.lock_release("waited", other)
