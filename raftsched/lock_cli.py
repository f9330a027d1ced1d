"""The CLI's lock subcommands (docs/api.md, "Locks"):

- ``raftsched lock NAME [--wait] -- COMMAND ...`` runs a command of the host while it holds one
  of the cluster's locks, as ``flock(1)`` does on one host: the cron line on every host of a
  fleet, of which one runs. The lease is renewed in the background; the command finds its
  fencing token in ``RAFTSCHED_LOCK_TOKEN``. When the lease is lost (a renew refused, or none
  answered for a whole TTL) the command is sent SIGTERM, and SIGKILL ``--kill-after`` seconds
  later; so is it when ``raftsched lock`` itself dies (killed -9: a guard process of its own
  sees it, ``_GUARD``), since no one renews the lease then. The lock is released when the
  command ends.
- ``raftsched lock-show NAME``: who holds it, its token, since when, until when.
- ``raftsched lock-release NAME --fencing-token N``: release it with its token (the holder's, as
  ``lock-show`` says it: to free a lock whose holder is gone before its TTL ends).

Exit status of ``lock``: the command's (128 + N when a signal N ended it), or
:data:`EXIT_HELD` when the lock was held by another (and ``--wait`` was not given, or its
``--timeout`` ran out), or :data:`EXIT_LOST` when the lease was lost while the command ran (it
was stopped), or 127 (126) when the command could not be found (run)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from .client import Client
from .client.core import LockHeld
from .client.policy import LOCK_TTL_S_DEFAULT
from .core.schedule import iso

#: ``raftsched lock``'s status when the command did not run: the lock is another's (EX_TEMPFAIL).
EXIT_HELD = 75
#: ``raftsched lock``'s status when the lease was lost while the command ran and it was stopped.
EXIT_LOST = 74
#: How long a command told to stop (the lease lost) has before SIGKILL, unless ``--kill-after``.
KILL_AFTER_S_DEFAULT = 10.0
#: The signals ``raftsched lock`` passes on to its command (then waits for it, and releases).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _say(msg: str) -> None:
    print(f"raftsched lock: {msg}", file=sys.stderr, flush=True)


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    """``sig`` to the command and everything it started (its process group: a shell's children
    too, which a signal to the shell alone would leave running)."""
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _group_gone(child: subprocess.Popen) -> bool:
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _stop_when_lost(lease: Any, child: subprocess.Popen, done: threading.Event, kill_after_s: float,
                    lost: threading.Event) -> None:
    """In a thread: once the lease is lost while the command runs, SIGTERM its process group,
    then SIGKILL what is left of it ``kill_after_s`` later (the command itself may have ended
    while a child it started still runs)."""
    lease.lost.wait()
    if done.is_set():
        return  # (the command ended first: the release marks the lease lost)
    lost.set()
    _say(f"the lease of lock {lease.name!r} (token {lease.token}) is lost: stopping the command "
         f"(SIGTERM, SIGKILL after {kill_after_s:g} s); its token may be another holder's from now")
    _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + kill_after_s
    while time.monotonic() < deadline and not _group_gone(child):
        time.sleep(0.05)  # ok-sleep: polling the process group within its deadline
    if not _group_gone(child):
        _signal_group(child, signal.SIGKILL)


#: The guard of a running command (a process of its own, run by the interpreter that runs this):
#: it reads the end of a pipe ``raftsched lock`` holds; an end of file before the word that the
#: command ended means ``raftsched lock`` is gone (killed -9, OOM-killed, a cron timeout), and the
#: lease with it (no one renews it): the command's process group gets SIGTERM, then SIGKILL after
#: the grace (argv: the group, the grace, the lock's name). It goes when the group does.
_GUARD = r"""
import os, select, signal, sys, time
pg, grace, name = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def gone():
    try:
        os.killpg(pg, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
while True:
    ready = select.select([0], [], [], 0.5)[0]
    if ready:
        if os.read(0, 1):
            sys.exit(0)
        break
    if gone():
        sys.exit(0)
print(f"raftsched lock: gone while its command ran: stopping the command (it no longer holds lock {name!r}: no "
      f"one renews the lease); SIGTERM, SIGKILL after {grace:g} s", file=sys.stderr, flush=True)
try:
    os.killpg(pg, signal.SIGTERM)
except ProcessLookupError:
    sys.exit(0)
end = time.monotonic() + grace
while time.monotonic() < end and not gone():
    time.sleep(0.05)  # ok-sleep: polling the process group within its deadline
if not gone():
    try:
        os.killpg(pg, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def _guard(child: subprocess.Popen, grace_s: float, name: str) -> int | None:
    """Start the guard of ``child``'s process group (_GUARD); returns the write end of its pipe,
    which this process holds until the command ended (then writes a byte: the guard leaves the
    group alone), or None when it could not start (said: the command runs unguarded)."""
    r, w = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-I", "-c", _GUARD, str(child.pid), f"{grace_s:g}", name],
                         stdin=r, start_new_session=True)
    except OSError as e:
        os.close(w)
        _say(f"cannot start the guard that stops the command if this process dies ({e.strerror or e}): "
             "the command runs unguarded")
        return None
    finally:
        os.close(r)
    return w


def _unguard(w: int | None) -> None:
    """Tell the guard the command ended (it leaves the group alone), and close its pipe."""
    if w is None:
        return
    try:
        os.write(w, b"x")
    except OSError:
        pass
    os.close(w)


class _Interrupted(Exception):
    """A signal came before the command was started: it is not started, the lock is released."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``raftsched lock NAME [flags] -- COMMAND ...``: the arguments before ``--`` (for the
    parser: a flag of raftsched's may come anywhere before it) and the command after it, which
    may look like flags (``-- sh -c ...``); None when the subcommand is not ``lock`` or has no
    ``--``. (The top level takes no flag with a value: its first word that is not a flag is the
    subcommand.)"""
    sub = next((t for t in argv if not t.startswith("-")), None)
    if sub != "lock" or "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def run_locked(a, c: Client) -> int:
    argv = list(a.command or ())
    if not argv:
        _say("give the command to run after --: raftsched lock NAME -- COMMAND [ARG...]")
        return 2
    if a.ttl is not None and not 1 <= a.ttl <= 600:
        _say("--ttl must be 1-600 seconds")
        return 2
    if a.timeout is not None and not a.wait:
        _say("--timeout is how long --wait waits: give --wait too")
        return 2
    owner = a.owner or f"{socket.gethostname()}:{os.getpid()}"
    ttl = a.ttl or LOCK_TTL_S_DEFAULT
    lock = c.lock(a.name, owner, ttl)
    # Signals are taken from the start: before the command runs one ends the wait (or the
    # acquire) and releases what was acquired; while it runs it is passed to its process group;
    # the lock is released only once the command has ended.
    phase = ["acquiring"]
    pending: list[int] = []
    box: list[subprocess.Popen] = []

    def on_signal(n: int, _f: Any) -> None:
        if phase[0] == "acquiring":
            raise _Interrupted(n)
        if box:
            _signal_group(box[0], n)
        else:
            pending.append(n)  # (between the acquire and the command's start: passed on once it runs)
    old = {sig: signal.signal(sig, on_signal) for sig in FORWARDED}
    done, lost = threading.Event(), threading.Event()
    watch: threading.Thread | None = None
    try:
        try:
            try:
                lease = lock.acquire()
            except LockHeld as e:
                if not a.wait:
                    raise
                _say(f"lock {a.name!r} is held by {e.holder!r}: waiting"
                     + (f" (at most {a.timeout:g} s)" if a.timeout is not None else ""))
                lock = c.lock(a.name, owner, ttl, blocking=True, timeout_s=a.timeout)
                lease = lock.acquire()
            phase[0] = "starting"
        except LockHeld as e:
            # (an instant, as every answer gives one: a walk read "ends at 1796683716107 ms")
            until = (f" (its lease ends at {iso(e.expires_at_ms)} unless renewed)"
                     if isinstance(e.expires_at_ms, int) and e.expires_at_ms > 0 else "")
            waited = f" after waiting {a.timeout:g} s" if a.wait else ""
            _say(f"lock {a.name!r} is held by {e.holder!r}{until}{waited}: the command did not run")
            return EXIT_HELD
        env = dict(os.environ, RAFTSCHED_LOCK_NAME=a.name, RAFTSCHED_LOCK_OWNER=owner,
                   RAFTSCHED_LOCK_TOKEN=str(lease.token))
        try:
            # A process group of its own: a lost lease stops all of it, and a terminal's Ctrl-C
            # reaches it once (passed on), not twice.
            child = subprocess.Popen(argv, env=env, start_new_session=True)
        except OSError as e:
            _say(f"cannot run {argv[0]!r}: {e.strerror or e}")
            return 127 if isinstance(e, FileNotFoundError) else 126
        box.append(child)
        guard = _guard(child, a.kill_after, a.name)
        phase[0] = "running"
        for n in pending:
            _signal_group(child, n)
        watch = threading.Thread(target=_stop_when_lost, args=(lease, child, done, a.kill_after, lost),
                                 name="raftsched-lock-watch", daemon=True)
        watch.start()
        rc = child.wait()
        _unguard(guard)
        if lost.is_set():
            watch.join()  # (what the command started is stopped too before this exits)
            return EXIT_LOST
        return rc if rc >= 0 else 128 - rc
    except _Interrupted as e:
        _say(f"signal {e.sig} before the command ran: it did not run")
        return 128 + e.sig
    finally:
        done.set()
        phase[0] = "done"
        lock.release()
        for sig, h in old.items():
            signal.signal(sig, h)


def add_commands(client) -> None:
    """Add the subcommands through cli.main's ``client(name, help, call, run=)``."""
    r = client("lock", "run a command while holding one of the cluster's locks (as flock does on one host)",
               run=run_locked)
    r.add_argument("name")
    r.usage = "raftsched lock NAME [flags] -- COMMAND [ARG...]"
    r.epilog = ("The command, after --, finds its fencing token in RAFTSCHED_LOCK_TOKEN (and RAFTSCHED_LOCK_NAME, "
                f"RAFTSCHED_LOCK_OWNER). Exit status: the command's; {EXIT_HELD} when another holds the lock; "
                f"{EXIT_LOST} when the lease was lost and the command stopped.")
    r.add_argument("--owner", help="the holder's name the lock shows (default: HOST:PID)")
    r.add_argument("--ttl", type=float, help=f"the lease's TTL, 1-600 s, renewed every third of it "
                                             f"(default {LOCK_TTL_S_DEFAULT:g})")
    r.add_argument("--wait", action="store_true", help="wait while another holds it (default: exit "
                                                       f"{EXIT_HELD} at once without running the command)")
    r.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds (exit "
                                                 f"{EXIT_HELD})")
    r.add_argument("--kill-after", type=float, default=KILL_AFTER_S_DEFAULT,
                   help="once the lease is lost, SIGTERM the command, and SIGKILL it this many seconds "
                        f"later (default {KILL_AFTER_S_DEFAULT:g}; the status is then {EXIT_LOST})")
    client("lock-show", "who holds a lock, its fencing token, since and until when",
           lambda a, c: c.lock_info(a.name) or {"lock": a.name, "held": False}, read=True).add_argument("name")
    r = client("lock-release", "release a lock with its token (lock-show says it): free a lock whose holder is gone",
               lambda a, c: c.lock_release(a.name, a.fencing_token))
    r.add_argument("name")
    r.add_argument("--fencing-token", type=int, required=True, help="the fencing token that holds it")
