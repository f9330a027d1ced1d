"""Where a worker's shell and python runs execute: as which user, in which directory, with which
environment (docs/security.md, "What a job can reach").

A :class:`Sandbox` is what a worker (a node's embedded one, or ``raftsched worker``) runs its jobs'
code through. Every shell and python run:

- runs as the **run user** (:func:`resolve_run_user`): ``--run-as USER``; by default, for a
  process running as root, the system user ``raftsched-run`` if it exists, else ``nobody``; for
  any other process, its own user (it cannot become another). Root only with
  ``--allow-root-jobs``;
- gets a **clean environment**: ``PATH``, ``LANG`` and ``TZ`` of the worker's own (and the
  names the operator adds with ``--pass-env``), ``HOME`` set to the run's directory, then the
  job's own (a shell executor's ``env`` and the job's ``secrets``), then the ``RAFTSCHED_*`` run
  contract, which nothing overrides. Nothing else of the worker's environment;
- starts in a **fresh directory** of its own, ``<tmp>/raftsched-runs-<worker>.<pid>-XXXX/<run>.XXXX``
  (mode 0700, owned by the run user; the parent is the worker's, 0711), removed when the run is
  over, killed or not (a worker killed with SIGKILL leaves them: the next worker to start there
  removes them, :func:`sweep_runs_dirs`); a shell executor's ``cwd`` still names where it starts.

A worker holds an exclusive ``flock`` on a lock file in its runs directory (``RUNS_LOCK``, 0600,
the worker's, in a directory the run user cannot write) for as long as it lives, on a descriptor
no other process has (close-on-exec; the run server gets only its socket). The kernel drops the
lock when the worker is gone, however it ended, so a later worker removes a runs directory only
when it can take that lock: whatever pid namespace its owner was in (containers sharing a host's
``/tmp`` or a volume, where a live worker's pid looks dead). A runs directory without the lock file
(made by a raftsched before it, or by a worker killed while it made it) is left alone: its owner
cannot be told alive or dead, and removing a live worker's directory fails its runs.

The runs are started by one long-lived child process, the run server (worker/runserver.py), which
drops to the run user once, after its imports: a shell run is a ``posix_spawn`` of it, a python
run a ``fork`` of a copy of it made before it read any request (so no earlier run's secrets are
in a run's memory); neither starts an interpreter nor forks the worker, and no privilege is
ever changed in the worker itself. Deadlines and kills stay here: the run is a process group (a
session of its own), signalled as the shell executor signals one (SIGTERM, the kill grace,
SIGKILL). When the run server dies, the runs it had started are killed and fail, and the next run
starts a new one.

Per-run users (``--run-uids LO-HI``, :func:`parse_run_uids`): instead of one run user, each shell
and python run gets a uid of the range that no other live run of this worker holds (its gid the
same number, no other group), and its directory is made that uid's. The run server stays root and
the run's own process switches before any of the job's code runs (worker/runserver.py). When the
run is over, every process still running as its uid is killed (the run server's ``kill_uid``)
before the directory is removed and the uid is free again: runs of different tenants cannot read
each other's environment, signal each other or write in each other's directory, and nothing a run
left behind lives on into the next run of its uid.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import fcntl
import grp
import itertools
import json
import logging
import os
import pwd
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from ..config import ConfigError
from ..core import limits as core_limits
from . import limits
from .masking import secret_values
from .results import parse_result
from .executors._context import ALL_TYPES, RunContext, Result
from .executors._deadline import race, timed_out
from .executors._output import OUTPUT_BYTES_MAX, may_be_cut, short, tail_bytes, tail_str
from .executors.shell import _group_has_live_member, _signal_group, _terminate_group
from .runserver import FRAME_BYTES_MAX, KILLER_UID, RUN_UID_MAX, RUN_UID_MIN, frame

log = logging.getLogger("raftsched.sandbox")

#: What a run gets of its worker's environment, unless the operator adds names (``--pass-env``).
ENV_ALLOWED = ("PATH", "LANG", "TZ")
#: PATH when the worker has none.
PATH_DEFAULT = "/usr/local/bin:/usr/bin:/bin"
#: The run user of a worker running as root, when it exists (``scripts/cluster.sh`` creates it);
#: else FALLBACK_USER.
DEFAULT_USER = "raftsched-run"
FALLBACK_USER = "nobody"
#: Executor types whose runs are the job's own code, run through the sandbox.
CODE_TYPES = frozenset({"shell", "python"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class RunUser:
    """The user runs execute as: its name, ids and supplementary groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @property
    def switches(self) -> bool:
        """Whether runs change user (the worker runs as another)."""
        return self.uid != os.geteuid()

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def _user(name: str) -> RunUser:
    try:
        pw = pwd.getpwuid(int(name)) if name.isascii() and name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ConfigError(f"--run-as {name}: no such user") from None
    try:
        groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    except OSError:
        groups = (pw.pw_gid,)
    return RunUser(pw.pw_name, pw.pw_uid, pw.pw_gid, groups)


def can_switch_user() -> bool:
    """Whether this process may run jobs as another user: only as root. (A process of another
    user that holds CAP_SETUID keeps its capabilities across setuid, and its runs would too:
    one could become root again. From root to another user, the kernel clears them all.)"""
    return os.geteuid() == 0


def resolve_run_user(run_as: str | None, allow_root_jobs: bool = False) -> RunUser:
    """The user shell and python runs execute as (module docstring).

    :raises ConfigError: no such user; root without ``allow_root_jobs``; another user while this
        process may not switch; a root process with neither ``raftsched-run`` nor ``nobody``.
    """
    euid = os.geteuid()
    if run_as:
        user = _user(run_as)
    elif euid == 0:
        user = None
        for name in (DEFAULT_USER, FALLBACK_USER):
            try:
                user = _user(name)
                break
            except ConfigError:
                continue
        if user is None:
            raise ConfigError(f"running as root, and neither {DEFAULT_USER} nor {FALLBACK_USER} exists to run jobs "
                              f"as: create {DEFAULT_USER} (useradd --system {DEFAULT_USER}) or give --run-as USER")
    else:
        try:
            user = _user(str(euid))
        except ConfigError:
            user = RunUser(str(euid), euid, os.getegid(), tuple(sorted(set(os.getgroups()))))
    if user.uid == 0 and not allow_root_jobs:
        raise ConfigError(f"--run-as {user.name}: shell and python jobs would run as root, with every right on this "
                          "host; pass --allow-root-jobs to allow it, or leave --run-as out")
    if user.switches and not can_switch_user():
        raise ConfigError(f"--run-as {user.name}: running jobs as another user needs root; this process runs as "
                          f"uid {euid}")
    return user


def parse_run_uids(text: str, slots: int) -> range:
    """``--run-uids LO-HI``: the uids (and gids) of a root worker's runs, one a run (module
    docstring). None of /etc/passwd's or /etc/group's ids, none below RUN_UID_MIN nor above
    RUN_UID_MAX, and at least ``slots`` of them.

    :raises ConfigError:
    """
    m = re.fullmatch(r"\s*(\d{1,10})\s*-\s*(\d{1,10})\s*", text or "")
    if m is None:
        raise ConfigError(f"--run-uids {text}: expected LO-HI, two uids (e.g. 1900000000-1900000099: ids no user, "
                          "group or subordinate range has)")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo > hi:
        raise ConfigError(f"--run-uids {text}: {lo} is above {hi}")
    if lo < RUN_UID_MIN or hi > RUN_UID_MAX:
        raise ConfigError(f"--run-uids {text}: the uids must be from {RUN_UID_MIN} to {RUN_UID_MAX} (not root's, "
                          "nor a system user's)")
    uids = range(lo, hi + 1)
    if len(uids) > RUN_UIDS_MAX:
        raise ConfigError(f"--run-uids {text}: {len(uids)} uids, more than {RUN_UIDS_MAX}: a run needs one, and "
                          "the pool holds them all")
    if len(uids) < slots:
        raise ConfigError(f"--run-uids {text}: {len(uids)} uid(s) for {slots} slots: a run needs one of its own")
    if not can_switch_user():
        raise ConfigError(f"--run-uids: running jobs as other users needs root; this process runs as uid "
                          f"{os.geteuid()}")
    for pw in pwd.getpwall():
        if pw.pw_uid == KILLER_UID:
            raise ConfigError(f"--run-uids: user {pw.pw_name} has uid {KILLER_UID}, the one the processes a run left "
                              "are killed as (they would be killed too)")
        if pw.pw_uid in uids or pw.pw_gid in uids:
            which = f"uid {pw.pw_uid}" if pw.pw_uid in uids else f"gid {pw.pw_gid}"
            raise ConfigError(f"--run-uids {text}: includes {which} of user {pw.pw_name} (/etc/passwd): choose ids "
                              "no user or group has")
    for gr in grp.getgrall():
        if gr.gr_gid in uids:
            raise ConfigError(f"--run-uids {text}: includes gid {gr.gr_gid} of group {gr.gr_name} (/etc/group): "
                              "choose ids no user or group has")
    for path in ("/etc/subuid", "/etc/subgid"):
        # Subordinate ids (rootless containers' users): the pool's kills and files would be theirs.
        for owner, start, count in _subordinate_ranges(path):
            if start < uids.stop and uids.start < start + count:
                raise ConfigError(f"--run-uids {text}: overlaps {owner}'s subordinate ids {start}-{start + count - 1} "
                                  f"({path}): choose ids no user, group or subordinate range has")
    for u in uids if len(uids) <= 4096 else ():
        # Users and groups a directory service knows but does not list (getpwall enumerates /etc).
        try:
            pw = pwd.getpwuid(u)
        except KeyError:
            pw = None
        if pw is not None:
            raise ConfigError(f"--run-uids {text}: includes uid {u} of user {pw.pw_name}: choose ids no user or "
                              "group has")
    return uids


#: The most uids a pool may hold (a run needs one; they are kept as a list).
RUN_UIDS_MAX = 65_536

#: Where the workers of a host claim their ``--run-uids`` (:func:`claim_run_uids`): a lock on the
#: bytes LO..HI of this file, one per range. It is never written.
RUN_UIDS_CLAIMS = "/run/raftsched/run-uids.lock"

#: ``struct flock`` as Linux lays it out (short type, short whence, off_t start, off_t len, pid_t pid).
_FLOCK = "@hhqqi4x"

#: The claims this process holds: open for as long as it runs (closing one gives up its range).
_claimed: list[int] = []


def _drop_claims_in_child() -> None:
    """A fork of this process (a node's dump writer) shares the claims' open file descriptions,
    so the lock would outlive this process as long as the child: a node restarted meanwhile was
    refused its own range. The child closes its copies; the lock stays this process's."""
    for fd in _claimed:
        try:
            os.close(fd)
        except OSError:
            pass
    _claimed.clear()


os.register_at_fork(after_in_child=_drop_claims_in_child)


def claim_run_uids(uids: range, path: str = RUN_UIDS_CLAIMS) -> None:
    """Claim ``uids`` on this host for as long as this process runs, or refuse them when a part is
    another live process's claim. Two workers whose ranges overlap would give one uid to two runs
    at once, and each run's end, and each run server's start, kills every process of its uids:
    the other worker's runs too. The claim is an open file description's lock on the bytes
    ``uids`` of ``path`` (F_OFD_SETLK): the kernel drops it when the process ends, however it
    ends, so a worker killed by SIGKILL leaves no stale claim.

    :raises ConfigError: a part of ``uids`` is claimed, or the claims file cannot be opened."""
    text = f"{uids.start}-{uids.stop - 1}"
    setlk = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
    getlk = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ConfigError(f"--run-uids {text}: cannot open {path}, where the workers of this host claim their "
                          f"ranges: {e.strerror}") from None
    want = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, uids.start, len(uids), 0)
    try:
        fcntl.fcntl(fd, setlk, want)
    except OSError:
        try:
            _, _, start, length, _ = struct.unpack(_FLOCK, fcntl.fcntl(fd, getlk, want))
            held = f" (uids {max(start, uids.start)}-{min(start + length, uids.stop) - 1} of it)"
        except (OSError, struct.error):
            held = ""
        os.close(fd)
        raise ConfigError(f"--run-uids {text}: another worker of this host holds part of this range{held} "
                          f"(claimed in {path}): two workers of a host need ranges that do not overlap, "
                          "or each kills the other's runs") from None
    _claimed.append(fd)


def _subordinate_ranges(path: str) -> list[tuple[str, int, int]]:
    """``owner:start:count`` lines of /etc/subuid or /etc/subgid (none when there is no file)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    out.append((parts[0], int(parts[1]), int(parts[2])))
    except OSError:
        pass
    return out


def pool_user(uids: range) -> RunUser:
    """What stands for a pool's runs where one user is asked for (the checks of what they may
    read or write: every uid of the pool is alike, a user of no file and no group)."""
    return RunUser(f"run uids {uids.start}-{uids.stop - 1}", uids.start, uids.start, ())


def check_pass_env(names: list[str]) -> tuple[str, ...]:
    """``--pass-env``: environment variable names, none of the run contract's. :raises ConfigError:"""
    for n in names:
        if not _ENV_NAME.fullmatch(n):
            raise ConfigError(f"--pass-env: {n!r} is not an environment variable name")
        if n.startswith("RAFTSCHED_") or n == "HOME":
            raise ConfigError(f"--pass-env: {n} is set by the worker for each run, not passed")
    return tuple(dict.fromkeys(names))


def check_private(path: str, what: str, user: RunUser | None) -> None:
    """Refuse a file or directory that others may read, or that the run user owns (``what``
    names it in the error, with the fix).

    :raises ConfigError:
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        fix = "chmod 700" if stat.S_ISDIR(st.st_mode) else "chmod 600"
        raise ConfigError(f"{what} {path} is open to group or others (mode {oct(st.st_mode & 0o777)}), so a job's "
                          f"code could read it: {fix} it")
    if user is not None and user.switches and st.st_uid == user.uid:
        raise ConfigError(f"{what} {path} is owned by {user.name}, the user jobs run as, so a job's code could read "
                          "it: chown it to the user the node runs as")


def readable_by(path: str, user: RunUser) -> bool:
    """Whether ``user`` could read ``path`` (every directory on the way searchable, the last
    readable), judged from the modes (no ACLs)."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for k in range(1, len(parts) + 1):
        p = os.sep.join(parts[:k]) or os.sep
        try:
            st = os.stat(p)
        except OSError:
            return False
        last = k == len(parts)
        need = (4 if last else 0) | (1 if stat.S_ISDIR(st.st_mode) else 0)
        if user.uid == 0:
            continue
        if st.st_uid == user.uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid in user.groups or st.st_gid == user.gid:
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        if bits & need != need:
            return False
    return True


#: The start of a worker's runs directory's name: ``raftsched-runs-<worker>.<pid>-XXXXXXXX``.
RUNS_PREFIX = "raftsched-runs-"
#: The lock file in a worker's runs directory, flocked (exclusive) by that worker while it lives.
RUNS_LOCK = ".raftsched-worker.lock"


#: The runs directories this process's sandboxes hold the lock of: a sweep here never tries their
#: locks (where flock is emulated with POSIX locks, on NFS, a process would get its own lock again,
#: and closing the descriptor it tried it with would drop the lock). Each lock's descriptor, and
#: its directory's (device, inode).
_HELD: dict[int, tuple[int, int]] = {}


def lock_runs_dir(runs_dir: str) -> int | None:
    """Take this worker's lock on its runs directory (made by it, empty): its descriptor, to keep
    open for the worker's life (closed: the lock is dropped). The file is made under another name,
    locked, then renamed into place, so a sweep never finds it unlocked while its owner lives.
    Close-on-exec (Python's default), and never passed on: no run process holds it. None when the
    file system has no locks (logged): then the directory has no lock file, and no sweep removes it.

    :raises OSError: the file could not be made.
    """
    dfd = os.open(runs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        tmp = RUNS_LOCK + ".new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            log.warning("runs directory %s: no lock (%s): a later worker's sweep will leave it alone", runs_dir, e)
            return None
        try:
            os.rename(tmp, RUNS_LOCK, src_dir_fd=dfd, dst_dir_fd=dfd)
            st = os.fstat(dfd)
        except BaseException:
            os.close(fd)
            raise
        _HELD[fd] = (st.st_dev, st.st_ino)
    finally:
        os.close(dfd)
    return fd


def _owner_gone(path: str) -> int | None:
    """When the worker that made the runs directory ``path`` is certainly gone (it is a directory
    of this user, not a link, with a lock file no one holds): a descriptor holding its lock now
    (for the caller to close before it removes the directory). None otherwise: a live owner (in
    any pid namespace: the kernel holds its lock), no lock file (module docstring), not ours."""
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if os.fstat(dfd).st_uid != os.geteuid():
            return None
        try:
            # For writing: on NFS, an exclusive flock (emulated with a POSIX lock) needs a file
            # opened for writing, and fails (EBADF) on one opened to read, which read "held".
            fd = os.open(RUNS_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                os.close(fd)
                return None
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None  # held: its owner lives
        return fd
    finally:
        os.close(dfd)


def sweep_runs_dirs(parent: str) -> list[str]:
    """Remove the runs directories in ``parent`` that a worker of this user left when it was
    killed (no process holds its lock any longer: module docstring): the directories of the runs
    it had, which it never got to remove. Returns what it removed. Never follows a link: a
    directory is opened, and emptied, by descriptor (:func:`_rmtree`)."""
    removed: list[str] = []
    unlocked: list[str] = []
    held = set(_HELD.values())  # (copied at once: a worker's start may add to it meanwhile)
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(RUNS_PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or (st.st_dev, st.st_ino) in held:
            continue
        lock = _owner_gone(path)
        if lock is None:
            if not os.path.lexists(os.path.join(path, RUNS_LOCK)):
                unlocked.append(path)
            continue
        # Its owner is gone for good (a dead worker does not come back): the lock is let go
        # before the lock file is removed, since NFS keeps a file unlinked while open as a
        # ".nfs..." entry, which left the directory behind, and lock-less to later sweeps.
        os.close(lock)
        _rmtree(path)
        removed.append(path)
    if removed:
        log.info("removed %d runs directory(ies) of workers that were killed: %s", len(removed), ", ".join(removed))
    if unlocked:
        log.info("left %d runs directory(ies) without a lock file (made by an older raftsched, or by a worker killed "
                 "as it started; their owner cannot be told gone): %s; remove them once no worker uses them",
                 len(unlocked), ", ".join(unlocked))
    return removed


def _safe(text: str, n: int = 48) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:n] or "run"


# ---------------------------------------------------------------------------- the run server, from here
class RunServerError(Exception):
    """The run server could not be started, or stopped."""


#: What a run's start says when its server died before it started the run.
_NEVER_STARTED = "the run server stopped before the run started"


class _Handle:
    __slots__ = ("id", "submitted", "started", "exited", "done")

    def __init__(self, rid: int, loop: asyncio.AbstractEventLoop) -> None:
        self.id = rid
        #: when it was sent to the server (the loop's clock)
        self.submitted = loop.time()
        #: the run's pid (its process group), or why it could not start (str)
        self.started: asyncio.Future = loop.create_future()
        #: its return code (negative: the signal), or None when the server died first
        self.exited: asyncio.Future = loop.create_future()
        #: the server's "done" message, or None when the server died first
        self.done: asyncio.Future = loop.create_future()


_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from raftsched.worker.runserver import main; sys.exit(main(sys.argv[2:]))")


def _writable_by(path: str, user: RunUser, uids: range | None = None) -> bool:
    """Whether ``user`` (or any uid of ``uids``, gids the same) may change what ``path`` holds:
    write into it (it, or it is owned by them), or replace it through a directory above it that
    they may write without the sticky bit (with it, they may move only their own entries)."""
    pool = uids if uids is not None else range(0)

    def owns(st: os.stat_result) -> bool:
        return st.st_uid == user.uid or st.st_uid in pool

    def may_write(p: str, st: os.stat_result) -> bool:
        m = st.st_mode
        return (owns(st) or bool(m & stat.S_IWOTH)
                or (bool(m & stat.S_IWGRP) and (st.st_gid == user.gid or st.st_gid in user.groups
                                                  or st.st_gid in pool))
                or _has_acl(p))
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return True  # (missing: it could be made; nothing to import from it anyway)
    if may_write(real, st):
        return True
    parent = os.path.dirname(real)
    while True:
        try:
            pst = os.stat(parent)
        except OSError:
            return True
        if owns(pst) or (may_write(parent, pst) and not pst.st_mode & stat.S_ISVTX):
            return True
        if parent == os.path.dirname(parent):
            return False
        parent = os.path.dirname(parent)


def _has_acl(path: str) -> bool:
    """Whether ``path`` has a POSIX access ACL (which may grant what its mode bits do not): taken
    as writable by anyone, rather than read."""
    try:
        os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    except OSError:
        return False  # (none, or no ACLs on this file system)
    return True


def root_import_path(path: list[str], user: RunUser, uids: range | None = None) -> list[str]:
    """The entries of ``path`` the run server may import from while it is still root (before it
    becomes the run user): those ``user`` cannot write, resolved (the directory checked is the
    one read: a link on the path the run user could repoint is not followed again). A module a
    run could plant in any other (a shared jobs directory on PYTHONPATH, a worker started in a
    writable directory) would run as root the next time the server starts."""
    return [os.path.realpath(p) for p in path if not _writable_by(p, user, uids)]


class RunServer:
    """The worker's end of the run server (worker/runserver.py): starts it, sends it runs, and
    hands each run's answers to its :class:`_Handle`."""

    def __init__(self, user: RunUser, env: dict[str, str], uids: range | None = None) -> None:
        self.user = user
        self.env = env
        #: per-run users: the server stays root, each run names its uid of these
        self.uids = uids
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._handles: dict[int, _Handle] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None
        self._failure = ""
        self._closing = False
        #: times it was started, and times it died under its runs (the tests, the logs)
        self.starts = 0
        self.deaths = 0

    @property
    def alive(self) -> bool:
        return self._writer is not None

    async def ensure(self) -> RunServer:
        """This server, started if it does not run. :raises RunServerError:"""
        if self._writer is not None:
            return self
        async with self._lock:
            if self._writer is not None:
                return self
            loop = asyncio.get_running_loop()
            if self._failed_at is not None and loop.time() - self._failed_at < limits.run_server_restart_s:
                raise RunServerError(self._failure)
            try:
                await self._start()
            except RunServerError as e:
                self._failed_at, self._failure = loop.time(), str(e)
                raise
            self._failed_at = None
            return self

    async def _start(self) -> None:
        path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        root_path = path
        if self.user.switches:
            root_path = root_import_path(path, self.user, self.uids)
            home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if _writable_by(home, self.user, self.uids):
                raise RunServerError(f"raftsched is installed in {home}, which the run user {self.user} can write "
                                     "(or replace): a run could change the code the run server runs as root. "
                                     "Install it where only root may write")
        switch = self.user.switches and self.uids is None
        cfg = {"fd": None, "uid": self.user.uid if switch else None, "gid": self.user.gid,
               "groups": list(self.user.groups), "output_bytes": OUTPUT_BYTES_MAX,
               "result_bytes": limits.child_result_bytes_max, "path": path}
        if self.uids is not None:
            cfg.update(pool=True, uids=[self.uids.start, self.uids.stop - 1])
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            cfg["fd"] = theirs.fileno()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-I", "-c", _BOOT, json.dumps(root_path), json.dumps(cfg),
                    stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=self.env, cwd="/",
                    start_new_session=True)
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                raise RunServerError(f"the run server could not start: {e}") from None
        finally:
            theirs.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=mine, limit=FRAME_BYTES_MAX)
            try:
                hello = await asyncio.wait_for(_read_frame(reader), limits.run_server_start_s)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError, ValueError) as e:
                raise RunServerError(f"the run server did not start ({type(e).__name__}: {e})") from None
            if "fatal" in hello:
                raise RunServerError(f"the run server could not start: {hello['fatal']}")
            want = self.user.uid if switch else os.geteuid()
            if hello.get("uid") != want:
                raise RunServerError(f"the run server runs as uid {hello.get('uid')}, not {want}")
        except BaseException:
            mine.close()
            _kill(proc)
            await _reap(proc)
            raise
        self.proc, self.pid, self._writer = proc, proc.pid, writer
        self.starts += 1
        self._reader_task = asyncio.create_task(self._read(reader), name="run server")
        if self.uids is not None:
            log.info("run server: pid %d, as root; each run as a uid of its own of %d-%d", proc.pid,
                     self.uids.start, self.uids.stop - 1)
        else:
            log.info("run server: pid %d, as %s, groups %s", proc.pid, self.user,
                     ",".join(str(g) for g in hello.get("groups", [])) or "none")

    def submit(self, req: dict) -> _Handle:
        """Send one run; its answers arrive on the handle. The server must be alive (:meth:`ensure`)."""
        h = _Handle(next(self._ids), asyncio.get_running_loop())
        self._handles[h.id] = h
        assert self._writer is not None
        self._writer.write(frame(dict(req, id=h.id)))
        return h

    def flush(self, h: _Handle) -> None:
        """Ask for what the server has of the run now (its "done"), and to stop reading its pipes."""
        if self._writer is not None and h.id in self._handles:
            self._writer.write(frame({"op": "flush", "id": h.id}))

    def forget(self, h: _Handle) -> None:
        self._handles.pop(h.id, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "it closed its socket"
        try:
            while True:
                msg = await _read_frame(reader)
                h = self._handles.get(msg.get("id"))
                if h is None:
                    continue
                if "killed" in msg:
                    for fut in (h.started, h.exited, h.done):
                        _settle(fut, msg)
                    self._handles.pop(h.id, None)
                elif "pid" in msg:
                    _settle(h.started, msg["pid"])
                elif "error" in msg:
                    _settle(h.started, str(msg["error"]))  # shaped where the run's secrets are known
                    _settle(h.exited, None)
                    _settle(h.done, None)
                    self._handles.pop(h.id, None)
                else:
                    if "exit" in msg:
                        _settle(h.exited, msg["exit"])
                    if "done" in msg:
                        _settle(h.done, msg)
                        self._handles.pop(h.id, None)
        except asyncio.IncompleteReadError:
            pass
        except (OSError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
        finally:
            self._gone(why)

    async def kill_uid(self, uid: int) -> bool:
        """Have every process of run uid ``uid`` killed (per-run users); whether the server said
        it did."""
        if self._closing:
            # Stopped (the worker stops): it killed every uid it gave out as it stopped, and no
            # new one is started for this.
            return True
        try:
            server = await self.ensure()
        except RunServerError:
            return False
        h = server.submit({"op": "kill_uid", "uid": uid})
        try:
            await asyncio.wait({h.done}, timeout=limits.run_server_answer_s)
        finally:
            server.forget(h)
        msg = h.done.result() if h.done.done() else None
        return isinstance(msg, dict) and msg.get("killed") is True

    def oldest_unanswered_s(self) -> float:
        """How long the oldest run sent and not yet answered (its start) has waited."""
        now = asyncio.get_running_loop().time()
        return max((now - h.submitted for h in self._handles.values() if not h.started.done()), default=0.0)

    def stalled(self, why: str) -> None:
        """The server stopped answering: kill it (root may, whatever its state); its socket's
        end then fails its runs (``_gone``)."""
        proc = self.proc
        if proc is not None and self._writer is not None:
            log.warning("run server (pid %d) killed: %s", proc.pid, why)
            _kill(proc)

    def _gone(self, why: str) -> None:
        """The server's socket is closed: every run it had is over as far as it can tell."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        handles, self._handles = self._handles, {}
        if handles:
            self.deaths += 1
        for h in handles.values():
            _settle(h.started, _NEVER_STARTED)
            _settle(h.exited, None)
            _settle(h.done, None)
        proc = self.proc
        if proc is not None and not self._closing:
            log.warning("run server (pid %d) gone (%s) with %d run(s) in flight; the next run starts a new one",
                        proc.pid, why, len(handles))
            _kill(proc)

    async def close(self) -> None:
        """Stop the server: it kills the runs it still has, and exits."""
        self._closing = True
        writer, proc, task = self._writer, self.proc, self._reader_task
        self._writer = None
        if writer is not None:
            writer.close()  # end of file: the server kills its runs and exits
        if proc is not None:
            try:
                await asyncio.wait_for(proc.wait(), limits.run_server_stop_s)
            except asyncio.TimeoutError:
                _kill(proc)
            await _reap(proc)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _settle(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


async def _read_frame(reader: asyncio.StreamReader) -> dict:
    (n,) = struct.unpack(">I", await reader.readexactly(4))
    if n > FRAME_BYTES_MAX:
        raise ValueError(f"a frame of {n} bytes")
    msg = json.loads(await reader.readexactly(n))
    if not isinstance(msg, dict):
        raise ValueError("a frame that is not an object")
    return msg


def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the run server and its python starter (its process group: the server is a session
    of its own; runs are sessions of theirs)."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass


async def _reap(proc: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(proc.wait(), limits.run_server_stop_s)
    except asyncio.TimeoutError:
        log.warning("run server (pid %d) not reaped after SIGKILL", proc.pid)


# ---------------------------------------------------------------------------- the sandbox
class Sandbox:
    """Runs shell and python executors as the run user, with a clean environment, each in a
    fresh directory (module docstring).

    :param user: who runs execute as (:func:`resolve_run_user`).
    :param pass_env: names of the worker's environment variables runs get too (``--pass-env``).
    :param name: the worker's name, in its runs directory's name.
    :param runs_parent: where its runs directory is made (``--runs-dir``; None: the system's
        temporary directory).
    :param run_uids: per-run users (``--run-uids``, :func:`parse_run_uids`): each run as a uid of
        these that no other live run holds; ``user`` is then unused.
    """

    def __init__(self, user: RunUser, *, pass_env: tuple[str, ...] = (), name: str = "worker",
                 runs_parent: str | None = None, run_uids: range | None = None) -> None:
        if run_uids is not None:
            if not (run_uids.step == 1 and len(run_uids) and run_uids.start >= RUN_UID_MIN
                    and run_uids.stop - 1 <= RUN_UID_MAX):
                raise ConfigError(f"--run-uids: not a range of run uids: {run_uids}")
            user = pool_user(run_uids)
        self.user = user
        self.run_uids = run_uids
        #: per-run users: the uids no live run holds (the lowest is given first)
        self._uids_free: list[int] = list(run_uids) if run_uids is not None else []
        self._uids_free.reverse()
        #: uids whose processes could not be killed when their run ended, each with the count
        #: of run servers started then: free again once a later server has started (it kills
        #: every process of the range's uids as it starts)
        self._uids_stuck: dict[int, int] = {}
        self.pass_env = tuple(pass_env)
        self.name = name
        self.runs_parent = runs_parent
        #: this worker's runs directory, made at start
        self.runs_dir: str | None = None
        #: the descriptor holding its lock (RUNS_LOCK), while this worker is started
        self._lock_fd: int | None = None
        self.base_env = self._base_env()
        self.server = RunServer(user, self.base_env, run_uids)

    def _base_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in dict.fromkeys(ENV_ALLOWED + self.pass_env) if k in os.environ}
        env.setdefault("PATH", PATH_DEFAULT)
        return env

    def describe(self) -> str:
        """One line for the worker's start: who runs execute as, with what, where."""
        who = (f"each shell and python run as a uid of its own of {self.run_uids.start}-{self.run_uids.stop - 1}"
               if self.run_uids is not None else f"shell and python runs as {self.user}")
        return (f"{who}, environment {', '.join(sorted(self.base_env))} "
                f"(+ HOME, the job's env and secrets, RAFTSCHED_*), each in a new directory under {self.runs_dir}")

    async def start(self) -> None:
        """Make the runs directory and start the run server. :raises RunServerError:"""
        parent = self.runs_parent or tempfile.gettempdir()
        await asyncio.to_thread(sweep_runs_dirs, parent)
        # 0700 from mkdtemp; the run user gets through it to its own run's directory (0711) and
        # cannot list it, nor make or replace anything in it (its lock file). The lock, held while
        # this worker lives, tells a later worker's sweep whether it may remove it.
        self.runs_dir = tempfile.mkdtemp(prefix=f"{RUNS_PREFIX}{_safe(self.name, 40)}.{os.getpid()}-", dir=parent)
        try:
            self._lock_fd = lock_runs_dir(self.runs_dir)
            if self.user.switches:
                os.chmod(self.runs_dir, 0o711)
            await self.server.ensure()
        except BaseException:
            _rmtree(self.runs_dir)
            self._unlock()
            raise
        for what, how in self.warnings():
            log.warning("%s: %s", what, how)

    def warnings(self) -> list[tuple[str, str]]:
        """What the operator should know about where runs execute (logged at start)."""
        out = []
        if self.user.uid == 0:
            out.append(("jobs run as root", "--allow-root-jobs: shell and python jobs have every right on this host"))
        elif not self.user.switches:
            out.append((f"jobs run as {self.user.name}, this process's own user",
                        "their code can read what this process can (its token file, the cluster secret and the "
                        "data directory of a node); start it as root to run them as another user (docs/security.md)"))
        lib = self.unreadable_library()
        if lib is not None:
            out.append((f"{self.user.name} cannot read the Python library ({lib})",
                        "a python run can import only what the run server imported before it dropped to that "
                        "user; install Python where the run user can read it"))
        return out

    def unreadable_library(self) -> str | None:
        """The Python library's directory when the run user cannot read it (then a python run
        imports only what the run server imported before it dropped to that user), else None."""
        if not hasattr(self, "_lib_unreadable"):
            lib = os.path.dirname(os.__file__)
            self._lib_unreadable = lib if self.user.switches and not readable_by(lib, self.user) else None
        return self._lib_unreadable

    async def close(self) -> None:
        await self.server.close()
        if self.runs_dir is not None:
            await asyncio.to_thread(_rmtree, self.runs_dir)
        self._unlock()

    def _unlock(self) -> None:
        """Drop the runs directory's lock (after the directory is removed)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            _HELD.pop(fd, None)
            os.close(fd)

    # ------------------------------------------------------------------ per-run users
    def _take_uid(self) -> int | None:
        """A uid for a new run (per-run users; None otherwise). :raises RuntimeError: none free."""
        if self.run_uids is None:
            return None
        self._unstick()
        if not self._uids_free:
            raise RuntimeError(f"no run uid free: {len(self.run_uids)} runs hold every uid of --run-uids")
        return self._uids_free.pop()

    async def _release_uid(self, uid: int, path: str | None) -> None:
        """The run of ``uid`` is over: kill every process of ``uid``, remove the run's directory
        ``path``, then free the uid. A uid whose processes could not be killed is not given
        again (logged)."""
        # A second try goes to a new server if this one died meanwhile (one that starts kills
        # every process of the pool's uids first).
        ok = await self.server.kill_uid(uid) or await self.server.kill_uid(uid)
        if path is not None:
            await asyncio.to_thread(_remove_run_dir, path)
        if not ok:
            log.error("run uid %d: its processes could not be killed (the run server does not answer); it is not "
                      "given to another run until a new run server has started", uid)
            self._uids_stuck[uid] = self.server.starts
            return
        self._free(uid)
        self._unstick()

    def _free(self, uid: int) -> None:
        self._uids_free.append(uid)
        self._uids_free.sort(reverse=True)

    def _unstick(self) -> None:
        """Free the stuck uids a run server started since has swept."""
        for uid, starts in list(self._uids_stuck.items()):
            if self.server.starts > starts:
                del self._uids_stuck[uid]
                self._free(uid)

    # ------------------------------------------------------------------ runs
    async def run_shell(self, ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                        kill_grace_s: float) -> Result:
        """The shell executor's run (executors/shell.py's contract) in the sandbox."""
        masked = secret_values(ex, ctx.secrets)
        async with _RunDir(self, ctx.run_id) as rd:
            home = rd.home
            rfile = os.path.join(home, RESULT_FILE)
            env = {**self.base_env, "HOME": home, **(ex.get("env") or {}), **ctx.env(),
                   "RAFTSCHED_RESULT_FILE": rfile}
            # The executor's cwd if it gives one (a relative one is in the run's directory).
            cwd = os.path.join(home, ex["cwd"]) if ex.get("cwd") else home
            req = {"op": "shell", "argv": list(ex["argv"]), "env": env, "cwd": cwd}
            if rd.uid is not None:
                req["uid"] = rd.uid
            how, rc, done, error = await self._run(req, ctx, timeout_s, cancel, kill_grace_s)
            note = await _run_result(ctx, rfile) if how == "done" and rc == 0 else None
        if error is not None:
            return False, short(error, masked=masked), ""
        output = _noted(_output(done, masked), note, masked)
        if how != "done":
            return False, ("lease lost" if how == "cancel" else timed_out(timeout_s)), output
        if rc is None:
            return False, "the run server stopped while the run ran", output
        if rc == 0:
            return True, None, output
        return False, _status(rc), output

    async def run_python(self, ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                         kill_grace_s: float) -> Result:
        """The python executor's run in a process of its own, forked from the run server: the
        target is imported there and called with ``ctx``; the outcome is the one the python
        executor reports (the repr of what it returned, or the exception and its traceback),
        after what the run printed. Both are masked of the run's secrets (``ctx.secrets``) where
        they are cut: by the run's process (which has them), and here again."""
        masked = secret_values(ex, ctx.secrets)
        async with _RunDir(self, ctx.run_id) as rd:
            home = rd.home
            rfile = os.path.join(home, RESULT_FILE)
            req = {"op": "python", "target": ex["target"],
                   "env": {**self.base_env, "HOME": home, **ctx.env(), "RAFTSCHED_RESULT_FILE": rfile},
                   "cwd": home, "secrets": dict(ctx.secrets),
                   "ctx": {"run_id": ctx.run_id, "job": ctx.job, "slot_ms": ctx.slot_ms, "attempt": ctx.attempt,
                           "fencing_token": ctx.fencing_token, "payload": ctx.payload, "worker_id": ctx.worker_id,
                           "upstream": ctx.upstream}}
            if rd.uid is not None:
                req["uid"] = rd.uid
            how, rc, done, error = await self._run(req, ctx, timeout_s, cancel, kill_grace_s)
            note = await _run_result(ctx, rfile) if how == "done" else None
        if error is not None:
            return False, short(error, masked=masked), ""
        printed = _output(done, masked)
        if how != "done":
            return False, ("lease lost" if how == "cancel" else timed_out(timeout_s)), printed
        result = _result(done, masked)
        if result is None:
            why = "the run server stopped" if rc is None else _status(rc) if rc else "exit 0"
            return False, short(f"the run's process ended without an outcome ({why})"), printed
        ok, err, out = result
        out = tail_str(printed.rstrip("\n") + "\n" + out, masked=masked) if printed else out
        lib = None if ok or not err else self.unreadable_library()
        if lib is not None and err is not None and ("ModuleNotFoundError" in err or "ImportError" in err):
            # Said where the operator looks first: the run's error, not only the worker's log.
            hint = (f" (the run user {self.user.name} cannot read the Python library, {lib}: install Python "
                    f"where it can; docs/security.md)")
            err = short(err, limits.outcome_error_chars_max - len(hint)) + hint
        return ok, err, _noted(out, note, masked) if ok else out

    async def _run(self, req: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                   kill_grace_s: float) -> tuple[str, int | None, dict | None, str | None]:
        """Start ``req`` on the run server and see it to its end: (how it ended: "done",
        "timeout" or "cancel"; its return code, None if unknown; the server's "done" message, None
        if none came; why it could not start, or None)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        pid: int | None = None
        for attempt in (1, 2):
            try:
                server = await self.server.ensure()
            except RunServerError as e:
                return "done", None, None, short(str(e))
            h = server.submit(req)
            answer_by = min(deadline, loop.time() + limits.run_server_answer_s)
            try:
                how = await race(h.started, answer_by - loop.time(), cancel)
            except BaseException:
                h.started.add_done_callback(_kill_when_started)
                server.flush(h)
                raise
            if how == "timeout" and not h.started.done() and (
                    loop.time() < deadline or server.oldest_unanswered_s() > limits.run_server_answer_s):
                # The server answers a run at once (a spawn or a fork). One that does not is
                # stopped or stuck (a run, as its user, may SIGSTOP it): every later run would wait
                # for it in vain. It is killed (its runs end with it).
                server.stalled(f"no answer to a run within {limits.run_server_answer_s:g} s")
                await asyncio.wait({h.started}, timeout=limits.run_server_stop_s)
                how = "done" if h.started.done() else "timeout"
            if attempt == 2 or how != "done" or h.started.result() != _NEVER_STARTED:
                break
            # The server died before it started this run (killed as stalled, here or by another
            # run's wait): the run goes to a new server, once.
            server.forget(h)
        try:
            if how != "done":
                # Not started yet (a busy run server): whenever it is, it is killed at once (the
                # handle stays until the server says the run is done).
                h.started.add_done_callback(_kill_when_started)
                server.flush(h)
                return how, None, None, None
            started = h.started.result()
            if isinstance(started, str):
                return "done", None, None, started
            pid = started
            how = await race(h.exited, deadline - loop.time(), cancel)
            if how != "done":
                await _terminate_group(pid, h.exited, kill_grace_s)
            elif _group_has_live_member(pid):
                # The main process is done; what it left behind in its group is part of the run.
                log.info("run %s: killing processes left in group %d after exit", ctx.run_id, pid)
                await _terminate_group(pid, h.exited, kill_grace_s)
            if not h.exited.done():
                await asyncio.wait({h.exited}, timeout=limits.shell_reap_s_max)
            if not h.done.done():
                await asyncio.wait({h.done}, timeout=limits.shell_drain_s_max)
            if not h.done.done():
                # Something outside the group still holds the run's output open.
                server.flush(h)
                await asyncio.wait({h.done}, timeout=limits.shell_drain_s_max)
        except BaseException:
            # Our caller is cancelled (or something broke here): no grace, the run must not
            # outlive the worker's interest in it.
            if pid is not None:
                _signal_group(pid, signal.SIGKILL)
            else:
                h.started.add_done_callback(_kill_when_started)
            server.flush(h)
            raise
        finally:
            if h.started.done():
                server.forget(h)
        rc = h.exited.result() if h.exited.done() else None
        return how, rc, (h.done.result() if h.done.done() else None), None


def _kill_when_started(fut: asyncio.Future) -> None:
    if not fut.cancelled() and isinstance(fut.result(), int):
        _signal_group(fut.result(), signal.SIGKILL)


def _status(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def _output(done: dict | None, masked: Sequence[str] = ()) -> str:
    if not done:
        return ""
    try:
        data = base64.b64decode(done.get("output") or "")
    except ValueError:
        return ""
    return tail_bytes(data, cut=int(done.get("total") or 0) > len(data), masked=masked)


def _result(done: dict | None, masked: Sequence[str] = ()) -> Result | None:
    """A python run's outcome as its process wrote it, checked and masked of ``masked`` (the
    process masked it before it cut it; an output as long as the bound may have been cut, so
    what it starts with of a secret is dropped); None when there is none."""
    text = (done or {}).get("result")
    if not isinstance(text, str):
        return None
    try:
        res = json.loads(text)
    except (ValueError, RecursionError):  # (what the run's own process wrote: its code could nest it)
        return None
    if not (isinstance(res, dict) and isinstance(res.get("ok"), bool) and isinstance(res.get("output"), str)
            and (res.get("error") is None or isinstance(res["error"], str))):
        return None
    return (res["ok"], None if res["ok"] else short(res["error"] or "failed", masked=masked),
            tail_str(res["output"], masked=masked, cut=may_be_cut(res["output"])))


class _RunDir:
    """A run's fresh directory: made (0700, owned by the run user) on entry, removed on exit. In a
    thread: a directory made and removed costs milliseconds of waiting on a journaling file
    system, which the event loop must not spend (``--runs-dir`` on a tmpfs costs far less).

    With per-run users, the run's uid too: taken on entry (the directory is that uid's), and on
    exit, every process of it killed, the directory removed, then the uid freed."""

    def __init__(self, sandbox: Sandbox, run_id: str) -> None:
        self.sandbox = sandbox
        self.run_id = run_id
        self.path: str | None = None
        #: the run's own uid (per-run users), else None
        self.uid: int | None = None

    @property
    def home(self) -> str:
        assert self.path is not None
        return self.path

    async def __aenter__(self) -> _RunDir:
        sb = self.sandbox
        if sb.runs_dir is None:
            raise RuntimeError("the sandbox is not started")
        self.uid = sb._take_uid()
        user = sb.user if self.uid is None else RunUser(str(self.uid), self.uid, self.uid, ())
        try:
            self.path = await asyncio.to_thread(_make_run_dir, sb.runs_dir, _safe(self.run_id) + ".", user)
        except BaseException:
            if self.uid is not None:
                sb._free(self.uid)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self._end())

    async def _end(self) -> None:
        if self.uid is not None:
            # Before the directory goes: nothing of the run writes in it any more.
            await self.sandbox._release_uid(self.uid, self.path)
            return
        if self.path is not None:
            await asyncio.to_thread(_remove_run_dir, self.path)


#: The file in a run's directory a run may leave its result in (``$RAFTSCHED_RESULT_FILE``; a python
#: run's return value is written there for it): JSON, handed to the run's children (pipelines).
RESULT_FILE = "raftsched-result.json"


def read_result(path: str) -> object:
    """The JSON a run left at ``path``, or None (no file, not a regular file, not JSON, or more
    than result_bytes_max). Opened without following a link: the run user wrote it, this
    process may be root. Nor a hard link (a second name of a file the run did not write, which
    root could read where the run user may not, where the kernel allows such links)."""
    return _read_result(path)[0]


def _read_result(path: str) -> tuple[object, str | None]:
    """:func:`read_result`, and why a file that is there was not kept (None when it was kept,
    or when there is none): a note for the run's output and the log, never silent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be opened ({e.strerror or e})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if st.st_nlink != 1:
            return None, "has more than one name (a hard link)"
        data = os.read(fd, core_limits.result_bytes_max + 1)
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)
    return parse_result(data)


async def _run_result(ctx: RunContext, path: str) -> str | None:
    """Set ``ctx.result`` from the result file at ``path``; a note for the run's output when the
    run left one that is not kept (logged as a warning too)."""
    ctx.result, why = await asyncio.to_thread(_read_result, path)
    if why is None:
        return None
    log.warning("sandbox: the result file of run %s %s; no result kept", ctx.run_id, why)
    return f"raftsched: $RAFTSCHED_RESULT_FILE {why}; no result kept (docs/pipelines.md, \"Results\")"


def _noted(output: str, note: str | None, masked: Sequence[str]) -> str:
    """``output`` with ``note`` as its last line (the tail kept, as the output's bound keeps it)."""
    if note is None:
        return output
    return tail_str((output.rstrip("\n") + "\n" if output else "") + note + "\n", masked=masked)


def _make_run_dir(runs_dir: str, prefix: str, user: RunUser) -> str:
    """A run's directory in ``runs_dir``, 0700, ``user``'s (when runs switch user)."""
    path = tempfile.mkdtemp(prefix=prefix, dir=runs_dir)
    if user.switches:
        # By descriptor, never by name: a chown must not follow a link, wherever it is.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, user.uid, user.gid)
        finally:
            os.close(fd)
    return path


def _remove_run_dir(path: str) -> None:
    try:
        os.rmdir(path)  # the common case: the run left nothing
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    _rmtree(path)


def _rmtree(path: str) -> None:
    """Remove a run's directory, whatever the run left in it (a directory it made read-only too).

    The tree is the run user's, and the caller may be root: it is walked by descriptor, each
    entry first unlinked (a file, a link, a FIFO: never opened), and only what unlink says is a
    directory opened, with O_DIRECTORY, O_NOFOLLOW and O_NONBLOCK. shutil.rmtree (3.11) opens an
    entry it found to be a directory by name, and a process the run left behind may have
    swapped it for a link to a FIFO by then: root's open would block for good, holding a worker
    thread, or open a path the run chose."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        top = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("could not remove %s: %s", path, e)
        return
    frames: list[tuple[int, list[str], str]] = [(top, _names(top), "")]
    try:
        while frames:
            fd, names, name_in_parent = frames[-1]
            if not names:
                frames.pop()
                if name_in_parent:  # a directory below the top, emptied
                    os.close(fd)
                    try:
                        os.rmdir(name_in_parent, dir_fd=frames[-1][0])
                    except OSError:
                        pass
                continue
            name = names.pop()
            child = _unlink_or_open(fd, name, flags)
            if child is not None:
                if len(frames) >= _RMTREE_DEPTH_MAX:
                    # A descriptor a level, so bounded: a deeper directory is moved up to the
                    # top (by descriptors: nothing followed), and emptied from there later.
                    os.close(child)
                    moved = f".raftsched-deep-{next(_deep_names)}"
                    try:
                        os.rename(name, moved, src_dir_fd=fd, dst_dir_fd=top)
                        frames[0][1].append(moved)
                    except OSError:
                        pass
                    continue
                frames.append((child, _names(child), name))
    finally:
        for fd, _left, name_in_parent in frames:
            if name_in_parent:
                os.close(fd)
        os.close(top)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass
    if os.path.lexists(path):
        log.warning("could not remove all of %s", path)


#: How deep _rmtree goes (it holds a descriptor a level); a deeper directory is moved up first.
_RMTREE_DEPTH_MAX = 64
_deep_names = itertools.count()


def _names(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _unlink_or_open(dir_fd: int, name: str, flags: int) -> int | None:
    """Unlink entry ``name``; when it is a directory, open it (its descriptor, to empty it)."""
    for _ in range(2):
        try:
            os.unlink(name, dir_fd=dir_fd)
            return None
        except IsADirectoryError:
            break
        except PermissionError:
            # A directory the run made read-only (only as the run's own user: root is never
            # refused). By descriptor, so nothing is changed by name.
            if os.geteuid() == 0:
                break  # (EPERM for a directory on some kernels)
            try:
                os.fchmod(dir_fd, 0o700)
            except OSError:
                return None
        except OSError:
            return None
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None  # gone, or no longer a directory: a later pass, or the warning, says so


__all__ = ["ALL_TYPES", "CODE_TYPES", "RunServer", "RunServerError", "RunUser", "Sandbox", "check_pass_env",
           "check_private", "resolve_run_user"]
