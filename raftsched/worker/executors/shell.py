"""The shell executor: argv in a process group of its own, output tail, SIGTERM then SIGKILL.

``{"type": "shell", "argv": [...], "env"?: {...}, "cwd"?: "..."}``; the package docstring gives
the contract.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess

from .. import limits
from ._context import RunContext, Result
from ._deadline import race, timed_out
from ..masking import secret_values
from ._output import OUTPUT_BYTES_MAX, short, tail_bytes

log = logging.getLogger("raftsched.executors")


class _TailProtocol(asyncio.Protocol):
    """Reads a pipe to its end keeping only the last ``limit`` bytes: output is never buffered
    unbounded, and the writer never blocks on a full pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.total = 0  # bytes received, kept or not
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[:-self.limit]

    def eof_received(self) -> bool:
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already, or nothing left in it we may signal


def _group_exists(pgid: int) -> bool:
    """Whether kill(2) still finds the process group (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # only processes we may not signal (setuid): nothing we could do anyway
    return True


def _group_has_live_member(pgid: int) -> bool:
    """Whether the process group has a member that is not a zombie.

    kill(2) also finds zombies, and an orphan killed in a container whose PID 1 never reaps
    stays a zombie forever: waiting for kill(2) to fail would always cost the whole grace. On
    Linux /proc tells zombies apart; elsewhere this falls back to kill(2).
    """
    if not _group_exists(pgid):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not (name.isascii() and name.isdigit()):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(b")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def _terminate_group(pgid: int, main_exit: asyncio.Future, grace_s: float) -> None:
    """SIGTERM the process group, wait up to ``grace_s`` for it to be gone, then SIGKILL it."""
    _signal_group(pgid, signal.SIGTERM)
    # A stopped process would only see the SIGTERM once continued.
    _signal_group(pgid, signal.SIGCONT)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    delay = limits.kill_poll_s_min
    while True:
        if main_exit.done() and not _group_has_live_member(pgid):
            break
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        # Polling: there is no event for "the last process of a group exited" (the main
        # process's exit is one, but its children may outlive it).
        if main_exit.done():
            await asyncio.sleep(min(delay, remaining))
        else:
            await asyncio.wait({main_exit}, timeout=min(delay, remaining))
        delay = min(delay * 2, limits.kill_poll_s_max)
    # Unconditionally while kill(2) finds the group: SIGKILL to a zombie is harmless, and the
    # /proc check above must not be the only thing standing between a survivor and SIGKILL.
    if _group_exists(pgid):
        _signal_group(pgid, signal.SIGKILL)


#: The most ``run_shell`` writes to a run's stdin (a pipe's buffer on Linux is 64 KiB; a job's
#: secrets, all of its spec, are at most job_spec_bytes_max).
STDIN_BYTES_MAX = 60_000


async def run_shell(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                     kill_grace_s: float, stdin_data: bytes | None = None) -> Result:
    """Run ``ex``'s argv (module docstring). ``stdin_data``: what its stdin holds (a pipe, the
    data written and closed before it starts: at most a pipe's buffer), else /dev/null."""
    masked = secret_values(ex, ctx.secrets)
    env = dict(os.environ)
    env.update(ex.get("env") or {})
    env.update(ctx.env())
    loop = asyncio.get_running_loop()
    # Our own pipe rather than asyncio's PIPE: stdout and stderr share its write end (interleaved
    # output), and closing the read end is ours to do, even if a stray process still writes.
    stdin: int = subprocess.DEVNULL
    if stdin_data is not None:
        if len(stdin_data) > STDIN_BYTES_MAX:
            raise ValueError(f"stdin_data of {len(stdin_data)} bytes; at most {STDIN_BYTES_MAX}")
        stdin, sw = os.pipe()
        try:
            # Written whole before the child starts, never blocking the loop: a pipe the kernel
            # gave less room than this (a user over pipe-user-pages-soft) refuses the run.
            os.set_blocking(sw, False)
            written = os.write(sw, stdin_data) if stdin_data else 0
            if written != len(stdin_data):
                raise BlockingIOError(f"wrote {written} of {len(stdin_data)} bytes")
        except OSError as e:
            os.close(stdin)
            return False, short(f"cannot hand the run its input: {e}", masked=masked), ""
        finally:
            os.close(sw)
    r, w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *ex["argv"], stdin=stdin, stdout=w, stderr=w, env=env,
            cwd=ex.get("cwd"), start_new_session=True)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        os.close(r)
        return False, short(f"cannot execute: {e}", masked=masked), ""
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)  # only the child's copies remain: end-of-file once they are all closed
        if stdin_data is not None:
            os.close(stdin)
    pgid = proc.pid  # start_new_session: the child leads its own session and process group
    pipe = os.fdopen(r, "rb", buffering=0)  # owns r from here on
    proto = _TailProtocol(OUTPUT_BYTES_MAX)
    transport = None
    main_exit = asyncio.ensure_future(proc.wait())
    try:
        transport, _ = await loop.connect_read_pipe(lambda: proto, pipe)
        how = await race(main_exit, timeout_s, cancel)
        if how != "done":
            await _terminate_group(pgid, main_exit, kill_grace_s)
        elif _group_has_live_member(pgid):
            # The main process is done; what it left behind in its group is part of the run.
            log.info("run %s: killing processes left in group %d after exit", ctx.run_id, pgid)
            await _terminate_group(pgid, main_exit, kill_grace_s)
        await asyncio.wait({main_exit}, timeout=limits.shell_reap_s_max)
        await asyncio.wait({proto.closed}, timeout=limits.shell_drain_s_max)
    except BaseException:
        # Our caller is cancelled (or something broke here): no grace, the run must not outlive
        # the worker's interest in it. The child watcher still reaps the main process.
        _signal_group(pgid, signal.SIGKILL)
        raise
    finally:
        if transport is not None:
            transport.close()  # closes the pipe; a stray writer left gets EPIPE
        else:
            pipe.close()
        if not main_exit.done():
            main_exit.cancel()
    output = tail_bytes(proto.buf, cut=proto.total > len(proto.buf), masked=masked)
    if how != "done":
        return False, ("lease lost" if how == "cancel" else timed_out(timeout_s)), output
    rc = proc.returncode
    if rc == 0:
        return True, None, output
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return False, f"killed by signal {name}", output
    return False, f"exit status {rc}", output

