"""The run server: the one process that starts a worker's runs (docs/security.md, "What a job can
reach"; the worker's side is worker/sandbox.py).

A worker (a node's embedded one, or ``raftsched worker``) starts it once, as a child process with
a clean environment. It imports what a python run needs (the executors, asyncio), drops to the run
user (``setgroups``, ``setgid``, ``setuid``: here, never in the worker), and then starts every
shell and python run the worker asks for:

- a shell run is ``posix_spawn`` of its argv, in a session of its own, stdin /dev/null, stdout and
  stderr one pipe;
- a python run is a ``fork`` of this process as it was before it read any request (its python
  starter, :class:`_Starter`, forked at start: the interpreter and its imports are there
  already, no interpreter starts per run, and no earlier run's request is in its memory), which
  reads its own request, makes itself a session, imports the target and calls it with the
  RunContext, its stdout and stderr a pipe and its outcome written to a second one.

Each run's working directory and environment come with its request, made by the worker. The server
keeps the last ``output_bytes`` bytes of each run's output, reaps its process, and tells the worker
what happened; deadlines and kills are the worker's (it signals the run's process group, whose id
the server reports), so a run is killed the same way whether this process lives or not.

The protocol, over one stream socket from the worker: frames of a 4-byte big-endian length and a
JSON object. Requests: ``{"op": "shell", "id", "argv", "env", "cwd"}``, ``{"op": "python", "id",
"target", "ctx", "secrets", "env", "cwd"}``, ``{"op": "flush", "id"}`` (send what there is now,
stop reading the run's pipes), ``{"op": "kill_uid", "id", "uid"}`` (kill every process of that run
uid: per-run users, below). Answers: ``{"ready", "pid", "uid", "gid", "groups"}`` once at
start (or ``{"fatal": reason}``, then exit), then per run ``{"id", "pid"}`` or ``{"id", "error"}``
(it could not start), ``{"id", "exit": returncode}`` when reaped (negative: the signal), and
``{"id", "done", "output" (base64 of the tail), "total", "result"}`` once the process is reaped
and its pipes are closed, or on ``flush`` (with ``"exit"`` in it when its pipes closed before
the process was reaped: one message for both), ``{"id", "killed": true}`` for ``kill_uid``. When the
worker's end of the socket closes (the worker stopped, or died), every run still alive is killed
(SIGKILL to its process group) and the server exits.

Per-run users (``--run-uids``, config ``"pool": true``): the server stays root (it never runs a
job's code itself, and so no run can signal it), and each shell or python request names a
``"uid"`` of the worker's pool, held by that run alone. The run's process switches to it
(``setgroups([])``, ``setgid``, ``setuid``, then checks that nothing of root remains, as the
server itself does otherwise) and sets no_new_privs (a setuid program another uid left in /tmp
gives it nothing) before any of the job's code runs: a shell run is a ``fork`` and ``exec``
(posix_spawn cannot change the user), a python run switches in its fork before it imports the
target. ``kill_uid`` kills every process of a uid whose run is over (a fork whose effective uid
is that uid calls ``kill(-1, SIGKILL)``: exactly that uid's processes), so nothing a run left behind
outlives it into the next run of that uid; the server does it too for the uids of its runs when
it stops, and at start for every uid of the pool that has a process (one a worker killed with
SIGKILL left behind).

Standard library only at module level, and no asyncio in the server's own loop: every python run
is a fork of this process, and what it imports is what each fork copies.
"""
from __future__ import annotations

import base64
import errno
import fcntl
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: nothing more is imported into what every run forks)
    from typing import Any, Callable

#: The largest request the server reads (a run's env and secrets are bounded far below it).
FRAME_BYTES_MAX = 8 * 1024 * 1024
_LEN = struct.Struct(">I")


def frame(obj: dict) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return _LEN.pack(len(data)) + data


class _Run:
    __slots__ = ("id", "pid", "out", "res", "buf", "total", "rbuf", "rover", "exited", "finished")

    def __init__(self, rid: int, pid: int, out: int, res: int | None) -> None:
        self.id, self.pid, self.out, self.res = rid, pid, out, res
        self.buf = bytearray()
        self.total = 0
        self.rbuf = bytearray()
        self.rover = False
        self.exited = False
        self.finished = False  # "done" sent


class Server:
    def __init__(self, ctl: int, output_bytes: int, result_bytes: int, starter: _Starter | None = None,
                 pool: bool = False, uids: tuple[int, int] | None = None) -> None:
        self.ctl = ctl
        #: per-run users: the worker's range, the only uids a request may name (defence in depth)
        self.uid_range = uids
        #: per-run users: each run names its uid, which its process switches to (module docstring)
        self.pool = pool
        #: the uids of runs started and not yet killed (``kill_uid``): killed when the server stops
        self.uids: set[int] = set()
        #: forks python runs from memory that never held a request (None: this process does)
        self.starter = starter
        self.output_bytes = output_bytes
        self.result_bytes = result_bytes
        self.sel = selectors.DefaultSelector()
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.runs: dict[int, _Run] = {}
        self.by_pid: dict[int, _Run] = {}
        self.by_fd: dict[int, _Run] = {}
        self.live: set[int] = set()  # pids started and not reaped (process group ids too)
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.ctl, self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.sel.register(self.ctl, selectors.EVENT_READ, self._on_ctl)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._on_wake)
        if starter is not None:
            self.sel.register(starter.exits, selectors.EVENT_READ, self._on_starter_exits)
        self.writing = False
        self.exits_buf = bytearray()

    # ------------------------------------------------------------------ the loop
    def serve(self) -> None:
        try:
            while True:
                for key, events in self.sel.select():
                    key.data(key.fd, events)
        except _Stop:
            pass
        finally:
            # Whatever still runs, and what a finished run left in its group.
            for pid in self.live | {run.pid for run in self.runs.values()}:
                _kill_group(pid)
            # And what they started elsewhere (a session of its own, a double fork).
            for uid in sorted(self.uids):
                kill_uid(uid)

    def _in_pool(self, uid: object) -> bool:
        if not _pool_uid(uid):
            return False
        return self.uid_range is None or self.uid_range[0] <= uid <= self.uid_range[1]  # type: ignore[operator]

    def send(self, obj: dict) -> None:
        self.outbuf += frame(obj)
        self._flush()

    def _flush(self) -> None:
        while self.outbuf:
            try:
                n = os.write(self.ctl, self.outbuf)
            except BlockingIOError:
                break
            except OSError:
                raise _Stop() from None  # the worker is gone
            del self.outbuf[:n]
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.outbuf else 0)
        if bool(self.outbuf) != self.writing:
            self.writing = bool(self.outbuf)
            self.sel.modify(self.ctl, want, self._on_ctl)

    def _on_ctl(self, fd: int, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush()
        if not events & selectors.EVENT_READ:
            return
        while True:
            try:
                data = os.read(self.ctl, 65536)
            except BlockingIOError:
                break
            except OSError:
                raise _Stop() from None
            if not data:
                raise _Stop()  # the worker closed its end: stop, killing what runs
            self.inbuf += data
        while len(self.inbuf) >= 4:
            (n,) = _LEN.unpack_from(self.inbuf)
            if n > FRAME_BYTES_MAX:
                raise _Stop()
            if len(self.inbuf) < 4 + n:
                break
            req = json.loads(bytes(self.inbuf[4:4 + n]))
            del self.inbuf[:4 + n]
            self._request(req)

    def _request(self, req: dict) -> None:
        op, rid = req.get("op"), req.get("id")
        if op == "flush":
            run = self.runs.get(rid)
            if run is not None:
                self._done(run)
            return
        if op == "kill_uid":
            uid = req.get("uid")
            if not self.pool or not self._in_pool(uid):
                self.send({"id": rid, "error": f"kill_uid: not a run uid: {uid!r}"})
                return
            if not kill_uid(uid):
                self.send({"id": rid, "error": f"kill_uid: the processes of uid {uid} could not be killed"})
                return
            self.uids.discard(uid)
            self.send({"id": rid, "killed": True})
            return
        if self.pool and op in ("shell", "python"):
            if not self._in_pool(req.get("uid")):
                self.send({"id": rid, "error": "cannot execute: the run has no uid of its own"})
                return
            self.uids.add(req["uid"])
        try:
            if op == "shell":
                run = self._spawn(rid, req)
            elif op == "python":
                run = self._fork(rid, req)
            else:
                self.send({"id": rid, "error": f"unknown request {op!r}"})
                return
        except Exception as e:  # noqa: BLE001 - one request's failure is that run's, never the server's
            # OSError (no such program, a directory gone); ValueError (a NUL in argv or cwd,
            # which posix_spawn and chdir refuse: a spec stored before the API refused them);
            # anything else this request alone caused. The server's other runs go on.
            self.send({"id": rid, "error": f"cannot execute: {e}" if isinstance(e, OSError)
                       else f"cannot execute: {type(e).__name__}: {e}"})
            return
        self.runs[rid] = run
        self.by_pid[run.pid] = run
        self.live.add(run.pid)
        self.by_fd[run.out] = run
        self.sel.register(run.out, selectors.EVENT_READ, self._on_out)
        if run.res is not None:
            self.by_fd[run.res] = run
            self.sel.register(run.res, selectors.EVENT_READ, self._on_res)
        self.send({"id": rid, "pid": run.pid})

    # ------------------------------------------------------------------ starting runs
    def _spawn(self, rid: int, req: dict) -> _Run:
        argv, env, cwd = req["argv"], req["env"], req["cwd"]
        r, w = os.pipe()
        try:
            pid = _fork_exec(argv, env, cwd, req["uid"], w) if self.pool else _spawn_in(argv, env, cwd, w)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        os.set_blocking(r, False)
        return _Run(rid, pid, r, None)

    def _fork(self, rid: int, req: dict) -> _Run:
        r, w = os.pipe()
        rr, rw = os.pipe()
        # The run says when it is in its session and, with per-run users, its own uid: its pid is
        # reported (and its group or uid killed by it) only then. A kill before that (a lease
        # lost at once) found no group, and a kill_uid no process of the uid, while the child,
        # still root, went on to become that uid and run (a review).
        gr, gw = os.pipe()
        try:
            if self.starter is not None:
                pid = self.starter.start(req, w, rw, gw)
            else:
                pid = os.fork()
                if pid == 0:
                    os.close(gr)
                    _python_child(req, w, rw, gw)  # never returns
        except BaseException:
            for fd in (r, w, rr, rw, gr, gw):
                os.close(fd)
            raise
        os.close(gw)
        try:
            _await_ready(gr, pid)
        except BaseException:
            for fd in (r, w, rr, rw):
                os.close(fd)
            raise
        finally:
            os.close(gr)
        os.close(w)
        os.close(rw)
        os.set_blocking(r, False)
        os.set_blocking(rr, False)
        return _Run(rid, pid, r, rr)

    # ------------------------------------------------------------------ runs' pipes and ends
    def _on_out(self, fd: int, _events: int) -> None:
        run = self.by_fd.get(fd)
        while run is not None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._close(run, "out")
                self._maybe_done(run)
                return
            run.total += len(data)
            run.buf += data
            if len(run.buf) > self.output_bytes:
                del run.buf[:-self.output_bytes]

    def _on_res(self, fd: int, _events: int) -> None:
        run = self.by_fd.get(fd)
        while run is not None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._close(run, "res")
                self._maybe_done(run)
                return
            if len(run.rbuf) + len(data) > self.result_bytes:
                run.rover = True
            else:
                run.rbuf += data

    def _close(self, run: _Run, which: str) -> None:
        fd = getattr(run, which)
        if fd is not None:
            self.by_fd.pop(fd, None)
            self.sel.unregister(fd)
            os.close(fd)
            setattr(run, which, None)

    def _on_wake(self, fd: int, _events: int) -> None:
        for pid, code in _reaped(fd):
            if self.starter is not None and pid == self.starter.pid:
                raise _Stop()  # python runs cannot start any more: the worker starts a new server
            self._exited(pid, code)

    def _exited(self, pid: int, code: int) -> None:
        self.live.discard(pid)
        run = self.by_pid.pop(pid, None)
        if run is None:
            return
        run.exited = True
        if run.out is None and run.res is None:
            self._done(run, code)  # its pipes are closed already: one message says both
        else:
            self.send({"id": run.id, "exit": code})

    def _on_starter_exits(self, fd: int, _events: int) -> None:
        """The starter's reports of python runs reaped: ``pid code`` lines."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            raise _Stop()  # the starter is gone
        self.exits_buf += data
        while b"\n" in self.exits_buf:
            line, _, rest = bytes(self.exits_buf).partition(b"\n")
            self.exits_buf[:] = rest
            pid, code = (int(x) for x in line.split())
            self._exited(pid, code)

    def _maybe_done(self, run: _Run) -> None:
        if run.exited and run.out is None and run.res is None:
            self._done(run)

    def _done(self, run: _Run, code: int | None = None) -> None:
        if run.finished:
            return
        run.finished = True
        self._close(run, "out")
        self._close(run, "res")
        self.runs.pop(run.id, None)
        result = None if run.rover or not run.rbuf else run.rbuf.decode("utf-8", "replace")
        msg = {"id": run.id, "done": True, "output": base64.b64encode(bytes(run.buf)).decode(),
               "total": run.total, "result": result}
        if code is not None:
            msg["exit"] = code
        self.send(msg)


class _Stop(Exception):
    pass


def _reaped(wake_fd: int) -> list[tuple[int, int]]:
    """After SIGCHLD (its wakeup pipe ``wake_fd``, emptied here): every child that ended,
    reaped, with its exit code (negative: the signal)."""
    try:
        while os.read(wake_fd, 512):
            pass
    except BlockingIOError:
        pass
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        out.append((pid, os.waitstatus_to_exitcode(status)))
    return out


def _spawn_in(argv: list, env: dict, cwd: str, w: int) -> int:
    """posix_spawn of a run as the server's run user, its output to ``w``. The working directory
    is the spawned process's: posix_spawn has no chdir action in Python, and the server's loop is
    single-threaded, so the server moves there for the call."""
    os.chdir(cwd)
    try:
        return _spawnp(argv, env, [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                   (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
    finally:
        os.chdir("/")


def _kill_group(pgid: int) -> None:
    _kill(-pgid)  # (kill of -pgid is killpg's: every process of the group)


def _spawnp(argv: list, env: dict, actions: list) -> int:
    """posix_spawn of ``argv`` in a new session, the executable found on the run's own PATH
    (as ``subprocess`` would: the first candidate that is not missing, else the first other
    error)."""
    kw = dict(file_actions=actions, setsid=True,
              setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT), setsigmask=())
    return _on_path(argv, env, lambda path: os.posix_spawn(path, argv, env, **kw))


def _on_path(argv: list, env: dict, start: Callable[[str], Any]) -> Any:
    """``start(path)`` of ``argv[0]``, itself when it names a directory, else the first candidate
    of the run's own PATH that is not missing (as ``subprocess`` finds it); else the first other
    error (a directory of PATH this user may not search hides nothing it could run)."""
    name = argv[0]
    if "/" in name:
        return start(name)
    first = None
    for d in os.get_exec_path(env):
        path = os.path.join(d, name)
        try:
            return start(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            if first is None and os.path.exists(path):
                first = e
    raise first or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


# ---------------------------------------------------------------------------- per-run users
#: The lowest uid a run may be given (``--run-uids`` refuses lower ones): a request naming a lower
#: one is refused, so that ``kill_uid`` never becomes a system user (nor root: kill(-1) as root
#: would kill every process of the host).
RUN_UID_MIN = 1000
RUN_UID_MAX = 2**31 - 2


def _pool_uid(uid: object) -> bool:
    return type(uid) is int and RUN_UID_MIN <= uid <= RUN_UID_MAX


def become(uid: int, gid: int, groups: list) -> None:
    """Switch this process to ``uid``:``gid`` with ``groups``, for good, and check that nothing of
    root remains: its ids, its groups and its capabilities. :raises OSError:"""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if (os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getegid() != gid
            or set(os.getgroups()) != set(groups)):
        raise OSError("the user did not change")
    left = _capabilities()
    if left:
        raise OSError(f"capabilities remain after the switch to uid {uid}: {left}")


#: prctl(2), loaded at start in pool mode (ctypes: nothing of it is imported otherwise).
_prctl = None
_PR_SET_NO_NEW_PRIVS = 38


def _no_new_privs() -> None:
    """No exec of this process (or its children) gains privileges (a setuid or setcap program)."""
    if _prctl is None:
        raise OSError("prctl is not available: no_new_privs cannot be set")
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")


def _load_prctl():
    import ctypes
    fn = ctypes.CDLL(None, use_errno=True).prctl
    fn.restype = ctypes.c_int
    return fn


#: The real and saved uid of the process that kills a run uid's processes (``--run-uids`` may not
#: include it): one no run has, so that no run's process may signal (stop) or trace it.
KILLER_UID = RUN_UID_MAX + 1


def kill_uid(uid: int) -> bool:
    """SIGKILL every process of ``uid`` (its real or saved uid: what kill(2) as that uid reaches);
    whether it was done. A fork whose effective uid is ``uid`` calls ``kill(-1, SIGKILL)``,
    which reaches every process of that uid at once (none of them forks meanwhile) and no other.
    Its real and saved uid are :data:`KILLER_UID`, not ``uid``, so that no process of ``uid`` may
    stop it (SIGSTOP) in the instant before its kill; where that uid does not exist (a user
    namespace that maps fewer), they are ``uid``, and a fork that is stopped, or killed (by
    another worker's, whose real uid is the same), is killed here and tried again."""
    if not _pool_uid(uid):
        raise ValueError(f"not a run uid: {uid!r}")
    for _ in range(10):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                os.setgroups([])
                try:
                    os.setresgid(KILLER_UID, KILLER_UID, KILLER_UID)
                    os.setresuid(KILLER_UID, uid, KILLER_UID)
                except OSError:
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                if os.geteuid() == uid and 0 not in os.getresuid() and not os.getgroups() and not _capabilities():
                    for _ in range(2):
                        try:
                            os.kill(-1, signal.SIGKILL)
                        except ProcessLookupError:
                            break
                    code = 0
            finally:
                os._exit(code)
        status = _wait_child(pid, os.WUNTRACED)
        if status is not None and os.WIFSTOPPED(status):
            _kill(pid)
            status = _wait_child(pid, 0)
            continue
        if status is not None and os.WIFEXITED(status):
            return os.WEXITSTATUS(status) == 0
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _wait_child(pid: int, options: int) -> int | None:
    """waitpid(pid, options)'s status; None when there is no such child."""
    while True:
        try:
            return os.waitpid(pid, options)[1]
        except ChildProcessError:
            return None
        except InterruptedError:
            continue


def uids_running(lo: int, hi: int) -> set[int]:
    """The uids from ``lo`` to ``hi`` that have a process (any of its real, effective, saved or
    file system uid), from /proc."""
    out: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        out.update(u for u in map(int, line.split()[1:]) if lo <= u <= hi)
                        break
        except (OSError, ValueError):
            continue
    return out


def _fork_exec(argv: list, env: dict, cwd: str, uid: int, out_w: int) -> int:
    """A shell run as ``uid`` (gid the same, no other group): fork, switch, exec (:func:`_spawnp`'s
    search of the run's PATH). Its pid; what kept it from exec raised here, as posix_spawn would."""
    err_r, err_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            _exec_child(argv, env, cwd, uid, out_w, err_w)  # never returns
        os.close(err_w)
        err_w = -1
        data = b""
        while True:
            chunk = os.read(err_r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(err_r)
        if err_w >= 0:
            os.close(err_w)
    if not data:
        return pid  # exec closed the pipe (close-on-exec): the run runs
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    try:
        why = json.loads(data)
    except ValueError:
        why = {"type": "OSError", "msg": "the run's process failed before exec"}
    if why.get("errno"):
        if why.get("filename") is not None:
            raise OSError(why["errno"], why.get("strerror") or "", why["filename"])
        raise OSError(why["errno"], why.get("strerror") or "")
    if why.get("type") == "ValueError":
        raise ValueError(why.get("msg"))
    raise OSError(f"{why.get('type')}: {why.get('msg')}")


def _exec_child(argv: list, env: dict, cwd: str, uid: int, out_w: int, err_w: int) -> None:
    """The forked process of a shell run: never returns (exec, or ``os._exit``)."""
    report = err_w  # (where a failure is written: the error pipe, fd 3 once moved there)
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()
        out_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        err_w = report = fcntl.fcntl(err_w, fcntl.F_DUPFD, 10)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(err_w, 3, inheritable=False)
        report = 3
        os.closerange(4, _FD_MAX)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        become(uid, uid, [])
        _no_new_privs()
        os.chdir(cwd)  # as the run's user: its directory, or one it may enter
        _execp(argv, env)
    except BaseException as e:
        try:
            if isinstance(e, OSError) and e.errno:
                why = {"errno": e.errno, "strerror": e.strerror, "filename": e.filename}
            else:
                why = {"type": type(e).__name__, "msg": str(e)}
            data = json.dumps(why).encode()
            while data:
                data = data[os.write(report, data):]
        except BaseException:
            pass
    os._exit(127)


def _execp(argv: list, env: dict) -> None:
    """exec ``argv``, found on the run's own PATH as :func:`_spawnp` finds it."""
    _on_path(argv, env, lambda path: os.execve(path, argv, env))


# ---------------------------------------------------------------------------- the python starter
class _Starter:
    """The server's end of its python starter: a process forked from the server before the
    server read any request, which forks each python run in turn. A run forked from the server
    itself would hold in its memory what the server read before: earlier runs' requests, their
    secrets among them (a run can read its own memory). The starter never reads a request: the
    server writes each into a memory file (memfd) whose descriptor it passes, and only the run
    reads it. The starter reports each run's pid at once, and its exit when reaped."""

    def __init__(self) -> None:
        self.req_s, req_z = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        exits_r, exits_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the starter
            code = 1
            try:
                self.req_s.close()
                os.close(exits_r)
                # Nothing else of the server (its socket to the worker above all) stays open.
                keep = sorted((req_z.fileno(), exits_w))
                os.closerange(3, keep[0])
                os.closerange(keep[0] + 1, keep[1])
                os.closerange(keep[1] + 1, _FD_MAX)
                _starter_loop(req_z, exits_w)
                code = 0
            finally:
                os._exit(code)
        req_z.close()
        os.close(exits_w)
        os.set_blocking(exits_r, False)
        os.set_inheritable(exits_r, False)
        self.pid, self.exits = pid, exits_r

    def start(self, req: dict, out_w: int, res_w: int, ready_w: int) -> int:
        """Have run ``req`` forked, its stdout and stderr ``out_w``, its outcome ``res_w``, its ready
        byte ``ready_w`` (Server._fork): its pid."""
        mfd = os.memfd_create("run", os.MFD_CLOEXEC)
        try:
            data = json.dumps(req).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(mfd, view):]
            os.lseek(mfd, 0, os.SEEK_SET)
            socket.send_fds(self.req_s, [b"r"], [mfd, out_w, res_w, ready_w])
        finally:
            os.close(mfd)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = self.req_s.recv(64)
            if not chunk:
                raise OSError(errno.EPIPE, "the python starter is gone")
            answer += chunk
        pid = int(answer)
        if pid <= 0:
            raise OSError(-pid, os.strerror(-pid))
        return pid


#: How long a python run may take to be in its session (and its uid) before it is killed.
READY_S = 10.0


def _await_ready(fd: int, pid: int) -> None:
    """Wait until run ``pid`` wrote its ready byte on ``fd`` (or ended: EOF, its exit is reaped
    as any). One that is not ready within READY_S is killed. :raises OSError: then."""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            if not sel.select(READY_S):
                _kill(pid)
                raise OSError(errno.ETIMEDOUT, f"the python run did not start within {READY_S:g} s")
            try:
                os.read(fd, 1)
                return
            except InterruptedError:
                continue
    finally:
        sel.close()


def _starter_loop(req_z: socket.socket, exits_w: int) -> None:
    """The starter: fork a run per request, report its pid; reap, report exits. Until the
    server's end closes."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(req_z, selectors.EVENT_READ, "req")
    sel.register(r, selectors.EVENT_READ, "wake")
    while True:
        for key, _ in sel.select():
            if key.data == "wake":
                for pid, code in _reaped(r):
                    os.write(exits_w, b"%d %d\n" % (pid, code))
                continue
            msg, fds, _flags, _addr = socket.recv_fds(req_z, 16, 4)
            if not msg:
                return
            if len(fds) != 4:
                for fd in fds:
                    os.close(fd)
                req_z.sendall(b"%d\n" % -errno.EINVAL)
                continue
            try:
                pid = os.fork()
            except OSError as e:
                pid = -(e.errno or errno.EAGAIN)
            if pid == 0:
                req_z.close()
                os.close(r)
                os.close(w)
                os.close(exits_w)
                _python_child_of(fds[0], fds[1], fds[2], fds[3])  # never returns
            for fd in fds:
                os.close(fd)
            req_z.sendall(b"%d\n" % pid)


def _python_child_of(req_fd: int, out_w: int, res_w: int, ready_w: int) -> None:
    """A python run forked by the starter: its request from its memory file, then as any."""
    try:
        chunks = []
        while True:
            chunk = os.read(req_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(req_fd)
        req = json.loads(b"".join(chunks))
    except BaseException:
        os._exit(2)
    _python_child(req, out_w, res_w, ready_w)


# ---------------------------------------------------------------------------- a python run
def _python_child(req: dict, out_w: int, res_w: int, ready_w: int) -> None:
    """The forked process of one python run: never returns (``os._exit``)."""
    code = 2
    try:
        os.setsid()
        # fds: 0 /dev/null, 1 and 2 the output pipe, 3 the outcome's; nothing else of the server
        # (its socket to the worker above all) stays open.
        out_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        res_w = fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
        ready_w = fcntl.fcntl(ready_w, fcntl.F_DUPFD, 10)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, 3, inheritable=False)
        os.dup2(ready_w, 4, inheritable=False)
        os.closerange(5, _FD_MAX)  # one close_range(2) where the kernel has it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if "uid" in req:
            # Per-run users: this run's own, before anything of the job's is imported.
            become(req["uid"], req["uid"], [])
            _no_new_privs()
            if _RUN_PATH is not None:
                sys.path[:] = _RUN_PATH
        os.write(4, b"r")  # in its session, its own user: the server reports its pid now
        os.close(4)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass
        ok, error, output = _call(req)
        data = json.dumps({"ok": ok, "error": error, "output": output}).encode()
        while data:
            data = data[os.write(3, data):]
        os.close(3)
        code = 0 if ok else 1
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


_FD_MAX = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536
#: Per-run users: the worker's import path, a python run's once it is its own user (the server,
#: root, keeps the entries no run may write).
_RUN_PATH: list | None = None


def _call(req: dict) -> tuple:
    """Import the target and call it with the run's context, as the python executor runs a
    function (``executors/python.py``): a coroutine function, or a plain one that returns an
    awaitable, on an event loop of its own; the outcome is the bounded repr of what it returned,
    or the exception and the tail of its traceback."""
    import asyncio
    import inspect

    from .executors import python as pyexec
    from .executors._context import RunContext
    ctx = RunContext(**req["ctx"], secrets=req.get("secrets") or {})
    try:
        fn = pyexec._resolve(req["target"])
        if inspect.iscoroutinefunction(fn):
            value = asyncio.run(fn(ctx))
        else:
            value = fn(ctx)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        outcome: tuple = ("ok", value)
        _leave_result(req["env"].get("RAFTSCHED_RESULT_FILE"), value)
    except BaseException as e:  # the job's SystemExit too: it ends the run with a failure
        outcome = ("exc", e)
    return pyexec._python_result(outcome, pyexec.run_masked(ctx))


def _leave_result(path: str | None, value) -> None:
    """A python run's return value, as its result (pipelines), in its result file unless the
    run wrote one itself; nothing when it is not JSON."""
    if path is None or value is None:
        return
    import json
    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except (TypeError, ValueError, OSError):
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def _awaited(aw):
    return await aw


# ---------------------------------------------------------------------------- start
#: What the server imports before it drops privileges: a python run is a fork of it (of its
#: starter, a copy of it), so what a run needs to be called is there already (the run's own
#: modules are imported by the run). With them, the codec every connection to a host name needs (``socket`` encodes the name as IDNA on
#: first use): a run user who cannot read the interpreter's files (one under /root) can still
#: open a connection.
PRELOAD = ("asyncio", "inspect", "traceback", "encodings.idna", "raftsched.worker.executors")


def _capabilities() -> dict:
    """The capability sets of this process that are not empty (from /proc; none where there is
    no /proc)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("CapInh", "CapPrm", "CapEff", "CapAmb") and int(value.strip() or "0", 16):
                    out[key] = value.strip()
    except OSError:
        pass
    return out


def main(argv: list[str]) -> int:
    """``python -c ... CONFIG``: CONFIG is JSON ``{"fd", "uid", "gid", "groups", "output_bytes",
    "result_bytes", "path", "pool", "uids"}`` (uid None: stay the user it was started as). sys.path
    is set by the caller to the entries the run user cannot write (sandbox.root_import_path): what
    is imported before the switch comes from there only; ``path``, the worker's whole import path,
    is the runs' (a jobs directory the run user may write among it), set after the switch. With
    ``pool`` (per-run users, ``uids`` the worker's ``[lo, hi]``), the server stays root and
    ``path`` is each python run's, set once it is its own user."""
    global _RUN_PATH, _prctl
    cfg = json.loads(argv[0])
    ctl = cfg["fd"]
    pool = bool(cfg.get("pool"))
    try:
        import importlib
        later = []
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:
                later.append(name)  # only where the run user may write: imported as the run user
        if pool:
            if cfg.get("uid") is not None or os.geteuid() != 0:
                raise OSError("per-run users need a run server that stays root")
            _prctl = _load_prctl()
            lo, hi = cfg["uids"]
            # What a worker killed with SIGKILL (and its server) left running as a run's uid.
            for uid in sorted(uids_running(lo, hi)):
                if not kill_uid(uid):
                    raise OSError(f"the processes of run uid {uid} (left by an earlier worker) could not be killed")
            _RUN_PATH = cfg.get("path")
            # (``later``: imported by each python run, as its own user.)
        else:
            if cfg.get("uid") is not None:
                become(cfg["uid"], cfg["gid"], cfg["groups"])
            if cfg.get("path") is not None:
                sys.path[:] = cfg["path"]
            for name in later:
                importlib.import_module(name)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.chdir("/")
        # Moves every object so far out of the collector's reach: a fork that never collects them
        # never writes their pages, so they stay shared with this process.
        gc.freeze()
        # Before any request is read: python runs are forked from this clean copy (_Starter).
        starter = _Starter() if hasattr(os, "memfd_create") and hasattr(socket, "send_fds") else None
        server = Server(ctl, cfg["output_bytes"], cfg["result_bytes"], starter, pool,
                        tuple(cfg["uids"]) if pool else None)
    except BaseException as e:
        try:
            os.set_blocking(ctl, True)
            os.write(ctl, frame({"fatal": f"{type(e).__name__}: {e}"}))
        except OSError:
            pass
        return 1
    server.send({"ready": True, "pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(),
                 "groups": sorted(os.getgroups())})
    server.serve()
    return 0
