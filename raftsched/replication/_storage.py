"""What a node keeps on disk, in place of two of pysyncobj's own parts: the journal file written
with ``pwrite`` (``_JournalFile``, for ``ResizableFile``) and full dumps at gzip level 1
(``_FastGzip``, for ``gzip``). ``install`` puts them in place."""
from __future__ import annotations

import gzip
import logging
import os

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)


class _JournalFile:
    """Stands in for ``ResizableFile`` under pysyncobj's ``FileJournal``: the same file, in the
    same format, written with ``pwrite`` instead of through a shared mmap.

    Through the mmap, every page of the journal a node had written stayed mapped in the process
    and counted in its resident memory, on top of the very same entries that ``FileJournal``
    keeps in a list; and the mmap only ever grew (by doubling). Measured on a cluster
    registering 1M jobs: 220 MB of each node's resident memory was journal pages (RssFile), the
    file 334 MB for 89 MB of live records. Written with pwrite, the pages are the kernel's page
    cache, which it reclaims, and the file is cut back to its live records after every
    compaction (``_SyncObj.__deleteEntriesTo``). Durability is unchanged: a store to the mmap
    and a pwrite are both in the page cache when they return, safe from a killed process and
    not from a power loss (pysyncobj never msyncs while running; docs/operations.md)."""

    def __init__(self, fileName, initialSize=1024, resizeFactor=2.0, defaultContent=None):
        if not os.path.exists(fileName):
            with open(fileName, "wb") as f:
                if defaultContent is not None:
                    f.write(defaultContent)
        self._fd = os.open(fileName, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        if os.fstat(self._fd).st_size < initialSize:
            os.ftruncate(self._fd, initialSize)

    def write(self, offset: int, values) -> None:
        view = memoryview(values)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def truncate(self, size: int) -> None:
        """Drop what follows ``size`` (dead records past the journal's end)."""
        if os.fstat(self._fd).st_size > size:
            os.ftruncate(self._fd, size)

    def flush(self) -> None:
        os.fsync(self._fd)

    def _destroy(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()  # as ResizableFile's msync at close
            finally:
                os.close(self._fd)
                self._fd = -1


class _FastGzip:
    """Stands in for ``gzip`` in ``pysyncobj.serializer``, which writes full dumps with
    ``gzip.GzipFile``'s default level, 9. A dump is the msgpack snapshot inside a pickle, and
    level 9 spends seconds in its lazy matching for nothing: measured on a 200k-job snapshot
    (16 MB), level 9 took 2.92 s and made 1.82 MB, level 1 0.10 s and 1.70 MB. At 1M jobs
    that is ~15 s of the forked dump writer's CPU on a shared machine, for every compaction,
    and for every snapshot a leader sends. The file is still gzip: every dump reads as before."""

    BadGzipFile = gzip.BadGzipFile

    @staticmethod
    def GzipFile(filename=None, mode=None, compresslevel=1, fileobj=None, mtime=None):
        return gzip.GzipFile(filename, mode, compresslevel, fileobj, mtime)


def _cut_journal_file(journal) -> None:
    """Cut a FileJournal's file back to its live records (after a compaction rewrote them from
    the start); a MemoryJournal has no file."""
    f = getattr(journal, "_FileJournal__journalFile", None)
    end = getattr(journal, "_FileJournal__currentOffset", None)
    if isinstance(f, _JournalFile) and isinstance(end, int):
        try:
            f.truncate(end)
        except OSError:
            logger.exception("replication.journal_truncate_failed")
