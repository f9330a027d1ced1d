"""Real node processes for integration tests, under the names the test files import: the harness
itself is the package's (raftsched/testing/), shared with jepsen-style/ and the benchmark."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from raftsched.testing.cluster import LocalCluster as Cluster, http
from raftsched.testing.procs import free_ports, wait_for

REPO = Path(__file__).resolve().parent.parent


def jobs_dir(prefix: str) -> Path:
    """A new directory the tests' shell jobs may write into, and the tests read: jobs run as
    another user than the tests when these run as root (raftsched-run or nobody), who cannot
    reach pytest's private temporary directories. In the system's temporary directory, mode
    1777; the caller removes it (shutil.rmtree)."""
    d = Path(tempfile.mkdtemp(prefix=f"raftsched-test-{prefix}-"))
    os.chmod(d, 0o1777)
    return d


def targets_on_path(prefix: str, filename: str, text: str):
    """A module of python targets (``filename`` holding ``text``) in a jobs_dir the run user can
    read, on this process's import path (the run server's) until the generator is closed: the
    body of a fixture, ``yield from targets_on_path(...)``."""
    d = jobs_dir(prefix)
    (d / filename).write_text(text)
    os.chmod(d / filename, 0o644)
    sys.path.insert(0, str(d))
    try:
        yield d
    finally:
        sys.path.remove(str(d))
        shutil.rmtree(d, ignore_errors=True)


def pid_marks(prefix: str):
    """A jobs_dir every run may write; every pid a run wrote there (``*.pid``) is killed when
    the generator is closed: the body of a fixture, ``yield from pid_marks(...)``."""
    d = jobs_dir(prefix)
    try:
        yield d
    finally:
        for f in d.glob("*.pid"):
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except (ValueError, OSError):
                pass
        shutil.rmtree(d, ignore_errors=True)


def running_cluster(tmp, **kw):
    """A started Cluster that has a leader, stopped by its PIDs when the generator is closed:
    the body of a module-scoped fixture, ``yield from running_cluster(tmp, n=1)``."""
    c = Cluster(tmp, **kw)
    c.start()
    try:
        c.wait_leader(30)
        yield c
    finally:
        c.stop()


__all__ = ["REPO", "Cluster", "free_ports", "http", "jobs_dir", "pid_marks", "running_cluster", "targets_on_path",
           "wait_for"]


def alive(pid: int) -> bool:
    """``pid`` runs: not gone, nor a zombie (an orphan's reaper is init, which some containers
    lack, and a zombie answers ``kill(pid, 0)``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def wait_dead(pid: int, timeout_s: float = 30.0) -> bool:
    """Wait until ``pid`` no longer runs (:func:`alive`), at most ``timeout_s``; then kill it by its
    PID. True when it ended by itself."""
    import time
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # ok-sleep: polling a process's end, within a deadline
    if not alive(pid):
        return True
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return False

