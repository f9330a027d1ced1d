"""A model of a power loss, for tests and the fault harness (jepsen-style/, nemesis ``power``):
``ShadowDisk``, a ``Disk`` that keeps, beside every file a node must not lose, what of it a
power loss would leave, and ``power_cut``, which puts exactly that back once the node is dead.

Why it is sound. Every byte the journal, its meta and the dumps put on disk goes through a
``Disk`` (``_disk.py``); nothing else in the node writes them. ``ShadowDisk`` writes the real
files as ``Disk`` does (the running node, and a node restarted after a kill -9, see the page
cache: what they read is what the kernel holds), and keeps a *durable shadow* apart, under
``DATA_DIR/.powerloss/``, which only a sync changes:

- each file is an id (its inode, as far as the model is concerned: a rename keeps it, a new
  file gets a new one); ``blobs/ID`` holds its content as of its last sync: a sync of a file
  (``sync``, ``sync_path``) copies what it holds then, and nothing else ever writes a blob;
- ``live.json`` maps the names that exist now to ids (creates, renames, removals, as made);
  ``durable.json`` maps the names a power loss would leave, and only a sync of the directory
  (``sync_dir``) copies ``live.json`` into it.

``power_cut(data_dir)``, called once the node's processes are dead (kill -9), makes the data
dir what the disk would hold after the power came back: a name not in ``durable.json`` is gone,
and a durable name holds its blob (nothing, if its file was never synced). So a node survives a
cut with exactly what it synced, whatever its own bookkeeping believed: the model knows nothing
of journals or Raft, only of syncs. With ``fsync`` off (``raftsched node --no-fsync``) nothing
is ever synced, and a cut leaves nothing of what the node wrote.

The instant of the cut (``freeze``) is a mark in the shadow, read under its lock by every
operation that would change what is durable: a process forked before the cut (pysyncobj's dump
writer) that runs on after it, as no process does once the power is gone, makes nothing durable
(before 2026-12-06 only the freezing process stopped, and a writer's directory sync made names
durable whose content the frozen node had never synced: an empty meta, an empty journal).
``power_cut``, and a ``ShadowDisk`` made on the directory (a node started), clear the mark.

What the model does not do: a sync interrupted by the kill (between the real ``fdatasync`` and
the end of the blob's update) leaves the blob holding a prefix of the writes made since the last
sync, in the order they were made; a disk that reorders the writes of one window is not
modelled here (the journal's records carry a checksum that finds such a tear at start:
tests/test_replication_storage.py tears one by hand). Files the
node writes without a ``Disk`` (its lock file, its API token, logs) are not touched by a cut.

Test-only: ``raftsched node --simulate-power-loss`` is refused unless ``RAFTSCHED_TEST_POWER_LOSS=1``
is set (``ENV_VAR``). The blobs double the bytes the journal writes.
"""
from __future__ import annotations

import contextlib
import fcntl
import filecmp
import json
import os
import shutil
import threading
import uuid

from ._disk import Disk

#: ``raftsched node --simulate-power-loss`` is refused unless this is set to 1.
ENV_VAR = "RAFTSCHED_TEST_POWER_LOSS"
#: The shadow's directory, inside the data dir.
SHADOW_DIR = ".powerloss"
#: In the shadow's directory: the power is off (``ShadowDisk.freeze``; ``power_cut`` and a new
#: ``ShadowDisk``, a node started, clear it).
FROZEN_MARK = "frozen"


class _Open:
    """What the model holds for one open descriptor: its file's name and id, and the writes made
    since its last sync (``None`` until a first sync has copied the whole file)."""

    __slots__ = ("name", "id", "pending")

    def __init__(self, name: str, id_: str) -> None:
        self.name = name
        self.id = id_
        self.pending: list[tuple[int | None, bytes | int]] | None = None


#: The lock files' descriptors open in this process, and the lock that guards the set. A fork
#: (pysyncobj's dump writer) copies every descriptor, and a flock belongs to the open file
#: description, not to the process: a child that kept a copy of one another thread had locked (or
#: was waiting to lock) would hold that lock for as long as it runs, and, in a process with several
#: nodes (the in-process tests), block their threads while it waits for a lock they hold. So the
#: child closes its copies at once; the parent's thread still holds, and later releases, the lock.
_OPEN_LOCK_FDS: set[int] = set()
_OPEN_LOCK_FDS_GUARD = threading.Lock()


def _close_inherited_lock_fds() -> None:
    global _OPEN_LOCK_FDS_GUARD
    for fd in _OPEN_LOCK_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN_LOCK_FDS.clear()
    _OPEN_LOCK_FDS_GUARD = threading.Lock()  # held by the forking parent's before-hook


os.register_at_fork(before=lambda: _OPEN_LOCK_FDS_GUARD.acquire(),
                    after_in_parent=lambda: _OPEN_LOCK_FDS_GUARD.release(),
                    after_in_child=_close_inherited_lock_fds)


class _Shadow:
    """The shadow's files, read and written under one lock (a dump writer is a forked child)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.dir = os.path.join(self.root, SHADOW_DIR)
        os.makedirs(os.path.join(self.dir, "blobs"), exist_ok=True)

    @contextlib.contextmanager
    def locked(self):
        with _OPEN_LOCK_FDS_GUARD:
            fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            _OPEN_LOCK_FDS.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with _OPEN_LOCK_FDS_GUARD:
                _OPEN_LOCK_FDS.discard(fd)
                os.close(fd)

    def name(self, path: str) -> str:
        p = os.path.abspath(path)
        if os.path.dirname(p) != self.root:
            raise ValueError(f"{path} is not a file of {self.root}")
        return os.path.basename(p)

    def is_cut(self) -> bool:
        """The power is off (call under ``locked``)."""
        return os.path.exists(os.path.join(self.dir, FROZEN_MARK))

    def blob(self, id_: str) -> str:
        return os.path.join(self.dir, "blobs", id_)

    def read(self, which: str) -> dict[str, str]:
        try:
            with open(os.path.join(self.dir, which + ".json")) as f:
                return dict(json.load(f))
        except FileNotFoundError:
            return {}

    def write(self, which: str, names: dict[str, str]) -> None:
        path = os.path.join(self.dir, which + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(names, f)
        os.replace(path + ".tmp", path)  # whole, whenever the process is killed

    def copy_to_blob(self, path: str, id_: str) -> None:
        """The blob of ``id_`` := the file at ``path`` as it is now (whole, or not at all)."""
        tmp = self.blob(id_) + ".tmp"
        shutil.copyfile(path, tmp)
        os.replace(tmp, self.blob(id_))

    def collect(self, live: dict[str, str], durable: dict[str, str], keep=()) -> None:
        """Remove the blobs no name refers to, now or after a power loss."""
        used = set(live.values()) | set(durable.values()) | set(keep)
        for f in os.listdir(os.path.join(self.dir, "blobs")):
            if f.split(".")[0] not in used:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, "blobs", f))


def _new_id() -> str:
    return uuid.uuid4().hex


class ShadowDisk(Disk):
    """A ``Disk`` over ``data_dir`` that keeps the durable shadow described in the module's
    docstring; ``power_cut`` uses it. Test-only."""

    def __init__(self, data_dir: str, fsync: bool = True) -> None:
        super().__init__(fsync)
        self._shadow = _Shadow(data_dir)
        self._fds: dict[int, _Open] = {}
        #: set by ``freeze``: the power is off for this disk (in-process tests)
        self.frozen = False
        with self._shadow.locked():  # a disk made is a node started: the power is back
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._shadow.dir, FROZEN_MARK))

    def freeze(self) -> None:
        """The instant of a power cut, for a node that cannot be killed (one in the test's own
        process): from now on no sync reaches the shadow, from this process or from one it
        forked (the mark in the shadow). Stop the node, then ``power_cut``."""
        self.frozen = True
        with self._shadow.locked():
            open(os.path.join(self._shadow.dir, FROZEN_MARK), "w").close()

    def _cut(self) -> bool:
        """The power is off: frozen here, or by another process (call under the shadow's lock)."""
        if not self.frozen and self._shadow.is_cut():
            self.frozen = True
        return self.frozen

    def open(self, path: str, *, create_empty: bool = False) -> int:
        sh = self._shadow
        name = sh.name(path)
        with sh.locked():
            live = sh.read("live")
            id_ = live.get(name)
            if id_ is None:
                id_ = _new_id()
                if os.path.exists(path) and not create_empty and not self._cut():
                    # A file the model has not seen (written before it was in use): durable as it is.
                    sh.copy_to_blob(path, id_)
                    durable = sh.read("durable")
                    durable[name] = id_
                    sh.write("durable", durable)
                live[name] = id_
                sh.write("live", live)
            fd = super().open(path, create_empty=create_empty)
        st = _Open(name, id_)
        self._fds[fd] = st
        return fd

    def pwrite(self, fd: int, data, offset: int) -> None:
        super().pwrite(fd, data, offset)
        st = self._fds.get(fd)
        if st is not None and st.pending is not None:
            st.pending.append((offset, bytes(data)))

    def copy_range(self, src: int, dst: int, count: int, src_offset: int, dst_offset: int) -> None:
        super().copy_range(src, dst, count, src_offset, dst_offset)
        st = self._fds.get(dst)
        if st is not None and st.pending is not None:  # what it wrote, as a pwrite of it
            st.pending.append((dst_offset, os.pread(dst, count, dst_offset)))

    def truncate(self, fd: int, size: int) -> None:
        super().truncate(fd, size)
        st = self._fds.get(fd)
        if st is not None and st.pending is not None:
            st.pending.append((None, size))

    def sync(self, fd: int) -> None:
        if not self.fsync or self.frozen:
            return
        super().sync(fd)
        st = self._fds.get(fd)
        if st is None:
            return
        blob = self._shadow.blob(st.id)
        with self._shadow.locked():
            if self._cut():
                return
            if st.pending is None or not os.path.exists(blob):
                # The first sync through this descriptor: the whole file (a previous process may
                # have left writes in the page cache that this sync makes durable too).
                self._shadow.copy_to_blob(f"/proc/self/fd/{fd}", st.id)
            else:
                # The writes since the last sync, in the order they were made.
                bfd = os.open(blob, os.O_RDWR)
                try:
                    for offset, data in st.pending:
                        if offset is None:
                            os.ftruncate(bfd, data)  # type: ignore[arg-type]
                        else:
                            Disk.pwrite(self, bfd, data, offset)
                finally:
                    os.close(bfd)
        st.pending = []

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        super().close(fd)

    def sync_path(self, path: str) -> None:
        if not self.fsync or self.frozen:
            return
        super().sync_path(path)
        sh = self._shadow
        name = sh.name(path)
        with sh.locked():
            if self._cut():
                return
            live = sh.read("live")
            id_ = live.get(name)
            if id_ is None:  # written by other code (a dump): now known
                id_ = live[name] = _new_id()
                sh.write("live", live)
            sh.copy_to_blob(path, id_)

    def rename(self, src: str, dst: str) -> None:
        sh = self._shadow
        s, d = sh.name(src), sh.name(dst)
        with sh.locked():
            super().rename(src, dst)
            live = sh.read("live")
            live[d] = live.pop(s, None) or _new_id()
            sh.write("live", live)

    def remove(self, path: str) -> None:
        sh = self._shadow
        name = sh.name(path)
        with sh.locked():
            super().remove(path)
            live = sh.read("live")
            if live.pop(name, None) is not None:
                sh.write("live", live)

    def sync_dir(self, path: str) -> None:
        if not self.fsync or self.frozen:
            return
        super().sync_dir(path)
        sh = self._shadow
        if os.path.abspath(path) != sh.root:
            return
        with sh.locked():
            if self._cut():
                return
            live = sh.read("live")
            sh.write("durable", live)
            sh.collect(live, live, keep=[st.id for st in self._fds.values()])


def power_cut(data_dir: str) -> dict:
    """Make ``data_dir`` what a power loss leaves of it: every file the model knows reverts to
    what was synced of it, a name never made durable is gone. Call it only once every process
    of the node is dead. Returns what it did: ``{"kept": {name: size}, "reverted": [names whose
    content changed], "dropped": [names removed]}``."""
    sh = _Shadow(data_dir)
    with sh.locked():
        live, durable = sh.read("live"), sh.read("durable")
        dropped = []
        for name in sorted(set(live) - set(durable)):
            path = os.path.join(sh.root, name)
            if os.path.exists(path):
                os.unlink(path)
                dropped.append(name)
        kept, reverted = {}, []
        for name, id_ in sorted(durable.items()):
            path = os.path.join(sh.root, name)
            blob = sh.blob(id_)
            tmp = path + ".powercut"
            if os.path.exists(blob):
                shutil.copyfile(blob, tmp)
            else:
                open(tmp, "wb").close()
            if not (os.path.exists(path) and filecmp.cmp(tmp, path, shallow=False)):
                reverted.append(name)
            os.replace(tmp, path)
            kept[name] = os.path.getsize(path)
        sh.write("live", dict(durable))
        sh.collect(durable, durable)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(sh.dir, FROZEN_MARK))  # the power is back
    return {"kept": kept, "reverted": reverted, "dropped": dropped}
