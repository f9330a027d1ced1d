"""``Disk``: every file operation a node makes on what it must not lose (the journal, its meta,
the full dumps), in one place, so that where a sync happens, and what a sync covers, is decided
here and can be replaced whole by a model of a power loss (``powerloss.ShadowDisk``).

The rules it keeps (POSIX, Linux): data written with ``pwrite`` is in the page cache when the
call returns, safe from a killed process and not from a power loss or a kernel crash, until an
``fdatasync`` of the file returns (which also writes the file's size when it grew); a file's new
name (a create, a rename) is durable only once the directory it is in has been synced. With
``fsync=False`` no sync is ever made: a node then keeps what a killed process keeps, and a power
loss can take anything written since the kernel last wrote its pages back (docs/operations.md).
"""
from __future__ import annotations

import errno
import os
import time

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: copy_range: bytes a copy_file_range call is asked for, and a buffer's size where it is not used.
_COPY_MAX = 1 << 30
_COPY_BUFFER = 1 << 20
#: What copy_file_range raises where the kernel or the file system does not do it (then: a buffer).
_COPY_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


class Disk:
    """The real disk. ``fsync`` False: the syncs are no-ops (``raftsched node --no-fsync``).

    ``syncs`` and ``sync_s`` count the file syncs made and the time they took (metrics)."""

    def __init__(self, fsync: bool = True) -> None:
        self.fsync = bool(fsync)
        self.syncs = 0
        self.sync_s = 0.0

    # -- one file, by descriptor ------------------------------------------------------------

    def open(self, path: str, *, create_empty: bool = False) -> int:
        """Open ``path`` read-write, creating it if missing (emptied first with ``create_empty``)."""
        flags = os.O_RDWR | os.O_CREAT | _O_CLOEXEC | (os.O_TRUNC if create_empty else 0)
        return os.open(path, flags, 0o600)

    def pwrite(self, fd: int, data, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def copy_range(self, src: int, dst: int, count: int, src_offset: int, dst_offset: int) -> None:
        """Copy ``count`` bytes of ``src``'s file from ``src_offset`` to ``dst``'s at
        ``dst_offset``, as ``pwrite`` would write them: in the kernel (``copy_file_range``,
        the interpreter lock released; a journal's compaction copies tens of MB), or through a
        buffer where the kernel or the file system cannot.

        :raises OSError: a read or a write failed, or ``src`` ends before ``count`` bytes."""
        copy = getattr(os, "copy_file_range", None)
        while count > 0:
            n = 0
            if copy is not None:
                try:
                    n = copy(src, dst, min(count, _COPY_MAX), src_offset, dst_offset)
                except OSError as e:
                    if e.errno not in _COPY_UNSUPPORTED:
                        raise
                    copy = None
            if copy is None:
                data = os.pread(src, min(count, _COPY_BUFFER), src_offset)
                Disk.pwrite(self, dst, data, dst_offset)
                n = len(data)
            if n <= 0:
                raise OSError(errno.EIO, f"copy_range: the source ended {count} bytes early")
            count, src_offset, dst_offset = count - n, src_offset + n, dst_offset + n

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def sync(self, fd: int) -> None:
        """Make everything written to ``fd``'s file durable (``fdatasync``)."""
        if self.fsync:
            t0 = time.perf_counter()
            os.fdatasync(fd)
            self.sync_s += time.perf_counter() - t0
            self.syncs += 1

    def close(self, fd: int) -> None:
        os.close(fd)

    # -- names -------------------------------------------------------------------------------

    def sync_dir(self, path: str) -> None:
        """Make the names in directory ``path`` durable (creates, renames, removals)."""
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            t0 = time.perf_counter()
            os.fsync(fd)
            self.sync_s += time.perf_counter() - t0
            self.syncs += 1
        finally:
            os.close(fd)

    def sync_path(self, path: str) -> None:
        """Make the content of the file at ``path`` durable (a file written by other code: the
        forked dump writer's, an incoming snapshot's)."""
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            self.sync(fd)
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        """Put ``src`` in place of ``dst`` durably: ``src``'s content synced, the rename made,
        the directory synced. A crash at any point leaves ``dst`` whole, old or new."""
        self.sync_path(src)
        self.rename(src, dst)
        self.sync_dir(os.path.dirname(os.path.abspath(dst)))

    def write_file(self, path: str, data: bytes) -> None:
        """Replace the file at ``path`` by ``data``, durably and atomically (a temporary file,
        synced, renamed, the directory synced)."""
        tmp = path + ".tmp"
        fd = self.open(tmp, create_empty=True)
        try:
            self.pwrite(fd, data, 0)
            self.sync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        self.sync_dir(os.path.dirname(os.path.abspath(path)))

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (durable after a ``sync_dir``)."""
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        """Remove ``path`` if it exists (the removal is made durable by a later ``sync_dir``)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
