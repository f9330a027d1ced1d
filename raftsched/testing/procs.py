"""Child processes for tests, the fault harness and the benchmark: free loopback ports, waiting on
a condition with a deadline, and named children that are stopped by their PID.

Nothing here sleeps for a fixed time to let something happen: every wait polls a condition until
a deadline, and says what it waited for when the deadline passes. Every process started through
:class:`Procs` is recorded, so that one ``stop_all()`` in a ``finally`` block stops it whatever
the caller did in between.

Standard library only: ``scripts/cluster.sh`` may run this package with a bare ``python3``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Loopback only: nothing the harness starts listens beyond this machine.
HOST = "127.0.0.1"
#: How long a stop waits for SIGTERM to end the processes before it sends SIGKILL.
STOP_TIMEOUT_S = 10.0
#: How long a SIGKILLed process may take to be reaped (the kernel frees it at once; this only
#: bounds a wait that should never be long).
REAP_TIMEOUT_S = 15.0


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline. An ``AssertionError``, so that a test that
    waits reads as a test that failed, and callers that caught ``AssertionError`` still do."""


def free_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct free ports on ``host``: bound together (so no two are the same), then
    released for the caller to bind. Another process may take one in between; callers bind them
    within moments, and allocate every port of one setup in one call so they never collide with
    each other.

    :param n: how many ports.
    :param host: the address to bind (loopback by default).
    """
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port(host: str = HOST) -> int:
    """One free port on ``host``: ``free_ports(1, host)[0]``. Several ports of one setup come from
    one :func:`free_ports` call instead, so they cannot collide with each other.

    :param host: the address to bind (loopback by default).
    """
    return free_ports(1, host)[0]


def wait_for(cond: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll ``cond`` until it returns a truthy value, and return that value.

    An exception from ``cond`` counts as "not yet" (a node that does not listen yet, a body
    without the field yet); the last one is named in the error if the deadline passes.

    :param cond: called every ``interval_s`` seconds.
    :param timeout_s: the deadline, in seconds from now.
    :param what: what is awaited, for the error message.
    :raises WaitTimeout: when the deadline passes first.
    """
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # a node not yet listening, etc.
            last_exc = e
        time.sleep(interval_s)  # ok-sleep: polling interval inside a deadline loop
    raise WaitTimeout(f"timed out after {timeout_s}s waiting for {what}"
                      + (f" (last error: {last_exc!r})" if last_exc else ""))


def wait_port(port: int, timeout_s: float, host: str = HOST) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    :raises RuntimeError: when nothing listens there before the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s}s") from None
            time.sleep(0.05)  # ok-sleep: polling inside a deadline


class Procs:
    """Named child processes, each stopped by its PID, never by a name or a pattern.

    A child's stdout and stderr go to its log file (appended to, so a restarted child's log
    follows the previous run's). A child paused with SIGSTOP is remembered in :attr:`paused`
    until SIGCONT, SIGKILL or a new start: a paused process answers nothing, so callers that ask
    the live ones must skip it, and a stop sends it SIGCONT first so that SIGTERM can act.

    :param new_session: start each child in a session of its own (``setsid``), so that a signal
        sent to the caller's terminal or process group (Ctrl-C) does not reach the children
        behind the harness's back; the harness stops them itself.
    """

    def __init__(self, new_session: bool = False) -> None:
        self.new_session = new_session
        #: the children by name: the last process started under each name
        self.procs: dict[Hashable, subprocess.Popen] = {}
        #: names of the children stopped with SIGSTOP and not resumed since
        self.paused: set[Hashable] = set()
        self.logs: dict[Hashable, Path] = {}

    def start(self, name: Hashable, argv: list[str], log_path: Path, env: dict | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` as child ``name``.

        :param log_path: the file its stdout and stderr are appended to.
        :param env: added to this process's environment (with ``PYTHONUNBUFFERED=1``, so a
            Python child's log is complete when it is killed).
        :raises AssertionError: if a child of that name still runs: starting another would lose
            the first one's PID, and nothing would stop it.
        """
        old = self.procs.get(name)
        assert old is None or old.poll() is not None, f"{name} is still running"
        log = open(log_path, "ab")
        try:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                 start_new_session=self.new_session)
        finally:
            log.close()
        self.procs[name] = p
        self.logs[name] = Path(log_path)
        self.paused.discard(name)
        return p

    def alive(self, name: Hashable) -> bool:
        """Whether child ``name`` runs (a paused child runs)."""
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def pid(self, name: Hashable) -> int | None:
        p = self.procs.get(name)
        return p.pid if p is not None else None

    def signal(self, name: Hashable, sig: int) -> bool:
        """Send ``sig`` to child ``name`` by its PID; False if it does not run.

        SIGSTOP marks it paused, SIGCONT and SIGKILL unmark it. After SIGKILL or SIGTERM the call
        waits for the process to end (SIGTERM on a paused child therefore times out: send
        SIGCONT first, as :meth:`stop` does).
        """
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return False
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGSTOP:
            self.paused.add(name)
        elif sig in (signal.SIGCONT, signal.SIGKILL):
            self.paused.discard(name)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            p.wait(timeout=REAP_TIMEOUT_S)
        return True

    def stop(self, name: Hashable, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop child ``name``: SIGCONT, SIGTERM, and SIGKILL if it still runs after
        ``timeout_s``."""
        self._stop([name], timeout_s)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every child at once: SIGCONT and SIGTERM to all, one deadline for all of them,
        then SIGKILL to those still running. A failure to stop one is printed and the others are
        stopped anyway."""
        self._stop(list(self.procs), timeout_s)

    def _stop(self, names: list, timeout_s: float) -> None:
        running = []
        for name in names:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            running.append(name)
        deadline = time.monotonic() + timeout_s
        for name in running:
            p = self.procs[name]
            try:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(timeout=REAP_TIMEOUT_S)
            except ProcessLookupError:
                pass
            except Exception as e:  # keep stopping the others
                print(f"procs: stopping {name} (pid {p.pid}) failed: {e!r}", file=sys.stderr)
            self.paused.discard(name)

    def log_tail(self, name: Hashable, n: int = 40) -> str:
        """The last ``n`` lines of child ``name``'s log ("" if it has none)."""
        try:
            return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-n:])
        except (KeyError, OSError):
            return ""
