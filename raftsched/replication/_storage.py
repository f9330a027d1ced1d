"""What a node keeps on disk, in place of three of pysyncobj's own parts: the journal
(``_DurableJournal``, for ``FileJournal``: its file format with a checksum a record, written with ``pwrite``, synced
in groups, compacted into a new file), the dump's rename (``durable_replace``, for
``atomicReplace``: the dump synced, renamed, the directory synced) and full dumps at gzip level
1 (``_FastGzip``, for ``gzip``). ``install`` puts them in place; every file operation goes
through a ``Disk`` (``_disk.py``), carried by the file names RaftNode gives pysyncobj
(``StoragePath``)."""
from __future__ import annotations

import gzip
import logging
import os
import struct
import threading
import zlib

from pysyncobj.journal import (
    APP_NAME,
    APP_VERSION,
    FIRST_RECORD_OFFSET,
    JOURNAL_FORMAT_VERSION,
    LAST_RECORD_OFFSET_OFFSET,
    NAME_SIZE,
    VERSION_SIZE,
    Journal,
    MemoryJournal,
)
from pysyncobj.pickle import dumps as _pickle_dumps
from pysyncobj.pickle import loads as _pickle_loads
from pysyncobj.pickle import to_bytes

from ._disk import Disk

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: The exit status of a node whose journal could not be written or synced (as PostgreSQL, it
#: stops rather than carry on past a failed fsync: Linux may have dropped the pages it could not
#: write, and a later fsync would report success for what is no longer there).
EXIT_SYNC_FAILED = 75
#: The exit status of a node whose dump (or a snapshot the leader sent) cannot be loaded.
EXIT_DUMP_UNREADABLE = 76
#: The exit status of a node whose applied entries the leader's log replaces (its state diverged).
EXIT_DIVERGED = 77
#: The exit status of a node whose ``raft.journal.meta`` (its term and vote) cannot be read.
EXIT_META_UNREADABLE = 78
#: How the stops below end the process (tests put a recorder here, never on ``os._exit`` itself,
#: which the forked dump writer needs).
_exit_process = os._exit


def stop_on_failed_write(what: str) -> None:
    """Stop the process at once: the journal (or its meta) failed to reach the disk, so this
    node can no longer say what it holds. Called from inside an ``except OSError``."""
    logger.critical("replication.journal_sync_failed: stopping the node (%s failed; what it was to "
                    "make durable may be lost)", what, exc_info=True)
    logging.shutdown()
    _exit_process(EXIT_SYNC_FAILED)


def stop_on_unreadable_dump(what: str) -> None:
    """Stop the process at once: ``what`` (the node's dump, or a snapshot from the leader) did not
    load (pysyncobj logged why just before). Its journal holds only what follows the dump, so
    this node cannot rebuild its state; it must not vote or acknowledge entries without one.
    The member is replaced on an empty data directory (docs/operations.md, "When a node cannot
    load its dump")."""
    logger.critical("replication.dump_unreadable: stopping the node (%s could not be loaded: see the "
                    "error above; this member must be replaced on an empty data directory)", what)
    logging.shutdown()
    _exit_process(EXIT_DUMP_UNREADABLE)


def stop_on_unreadable_meta(path: str) -> None:
    """Stop the process at once: the term and the vote at ``path`` cannot be read. Starting
    without them (as pysyncobj does) lets the node vote a second time in a term it already voted
    in, so two leaders of one term can each commit: acknowledged writes lost. The meta is
    replaced whole and synced (``Disk.write_file``), so only a damaged disk or a hand-edited file
    comes here; the member is replaced on an empty data directory (docs/operations.md).
    Called from inside an ``except``."""
    logger.critical("replication.journal_meta_unreadable path=%s: stopping the node (its term and vote "
                    "cannot be read: it could vote twice in one term; replace this member on an empty "
                    "data directory)", path, exc_info=True)
    logging.shutdown()
    _exit_process(EXIT_META_UNREADABLE)


def stop_on_diverged(from_index: int, last_applied: int) -> None:
    """Stop the process at once: the leader's log replaces entries from ``from_index`` on, and
    this node applied up to ``last_applied``: its state holds commands the cluster's log does
    not, and no later entry can take them out. The member is replaced on an empty data
    directory (docs/operations.md, Durability)."""
    logger.critical("replication.applied_entries_truncated: stopping the node (the leader's log differs from "
                    "index %d, and this node applied up to %d: its state has diverged from the cluster's; "
                    "replace this member on an empty data directory)", from_index, last_applied)
    logging.shutdown()
    _exit_process(EXIT_DIVERGED)


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


class StoragePath(str):
    """A file name that carries the ``Disk`` to write it through. pysyncobj hands its conf's
    ``journalFile`` to ``createJournal`` and its ``fullDumpFile`` to ``atomicReplace`` as they
    are, so the stand-ins find each node's disk (and its fsync setting) on the name itself."""

    disk: Disk

    def __new__(cls, path: str, disk: Disk) -> "StoragePath":
        s = super().__new__(cls, path)
        s.disk = disk
        return s


def _disk_of(path) -> Disk:
    # A SyncObj not built by RaftNode (a bare path): durable, as a node's is by default.
    disk = getattr(path, "disk", None)
    return disk if isinstance(disk, Disk) else Disk(fsync=True)


def create_journal(journalFile=None):
    """Stands in for ``pysyncobj.journal.createJournal`` in ``pysyncobj.syncobj``."""
    if journalFile is None:
        return MemoryJournal()
    return _DurableJournal(str(journalFile), _disk_of(journalFile))


def durable_replace(src: str, dst: str) -> None:
    """Stands in for ``atomicReplace`` (``os.rename``) in ``pysyncobj.serializer``, which puts a
    full dump in place: the forked writer's (whose success lets the tick thread drop the journal
    up to it) and an incoming snapshot's. The dump is synced before the rename and the directory
    after it: a journal is never trimmed to a dump a power loss could take back."""
    _disk_of(dst).replace(src, dst)


#: A compaction writes the entries it keeps here, then renames it over the journal.
COMPACT_SUFFIX = ".compact"
#: The commit index, written in place and never synced (``_DurableJournal``).
COMMIT_SUFFIX = ".commit"
_COMMIT = struct.Struct("<QI")  # the commit index, the CRC-32 of its 8 bytes
_HEADER = struct.Struct("<I")
_RECORD_HEAD = struct.Struct("<IQQ")  # size, index, term; the command follows, then the size again
_IDX_TERM = struct.Struct("<QQ")
#: The journal's format: pysyncobj's header and records, each record with a CRC-32 of its index,
#: term and command between the command and the trailing size (the size counts it). pysyncobj's
#: own format (JOURNAL_FORMAT_VERSION, 1: no checksum) is read, and rewritten in this one at open.
JOURNAL_FORMAT_CRC = 0x52530002
#: Where the header keeps the format (after the application's name and version).
_FORMAT_OFFSET = NAME_SIZE + VERSION_SIZE


def _header(end: int) -> bytes:
    return (APP_NAME + b"\0" * (NAME_SIZE - len(APP_NAME))
            + APP_VERSION + b"\0" * (VERSION_SIZE - len(APP_VERSION))
            + struct.pack("<II", JOURNAL_FORMAT_CRC, end))


def _record(command, idx: int, term: int) -> bytes:
    data = to_bytes(command)
    size = 20 + len(data)
    crc = zlib.crc32(data, zlib.crc32(_IDX_TERM.pack(idx, term)))
    return b"".join((_RECORD_HEAD.pack(size, idx, term), data, _HEADER.pack(crc), _HEADER.pack(size)))


class _DurableJournal(Journal):
    """pysyncobj's journal (``FileJournal``'s file format, its entries in a list), durable.

    - ``add`` writes the record and then the header's end offset with ``pwrite`` (no mmap: the
      pages are the kernel's page cache, not the node's resident memory), and marks the journal
      dirty; ``sync`` makes everything written since the last sync durable with one
      ``fdatasync``: group commit. When it runs is the gate's business (``_durable.py``): before
      this node answers for its log, and before a leader counts itself towards a commit.
    - ``setCurrentTerm`` (a vote, a new term) syncs the journal, then writes the meta file
      (term, vote, commit index) durably (a temporary file, synced, renamed, the directory
      synced) before it returns, hence before any message that reflects it.
    - The commit index alone is not worth a sync (nor is it in etcd's raft, whose ``MustSync``
      asks for one only when entries, the term or the vote change): Raft recomputes it, and a
      node that restarts with an older one only learns it again. Once a second, when it moved,
      it is written in place into ``raft.journal.commit`` (12 bytes with a CRC; ``pwrite``, no
      sync, no rename), after a sync of the journal if that is dirty, so the index written
      never covers an entry a power loss can take. A power loss leaves an older index there,
      or a torn or empty file, which reads as none; a start takes the larger of it and the
      meta's. Before, every second with commits cost a durable rewrite of the meta: two syncs
      with directory updates on the tick thread (``_store_meta``).
    - ``deleteEntriesTo`` (a compaction, once a dump is durable) writes the entries it keeps to
      ``raft.journal.compact``, syncs it and renames it over the journal (the directory synced).
      pysyncobj rewrote the journal in place from its start: a node killed in the middle kept a
      journal that ended part of the way through the entries after the dump, and lost the rest,
      committed ones included. Now a crash at any step leaves the old journal or the new one,
      each whole (tests/test_replication_durability.py tries every step).
    - Opening syncs the file (a previous process may have left writes in the page cache only:
      they are answered for as soon as the node runs), drops a compaction that did not finish,
      and reads records up to the header's end offset, stopping at the first record that does
      not hold together (a size beyond the file, a trailer that differs, a checksum that differs,
      an index out of sequence), which it logs: the tail a power cut tore. A record that does
      not hold together at or below the commit index written (entries this node synced) is
      logged as damage (``replication.journal_damaged``), unless a dump covers it. A journal in
      pysyncobj's own format (no checksums: nodes before 2026-12-04) is read and rewritten in
      this one, as a compaction rewrites it.
    """

    def __init__(self, path: str, disk: Disk) -> None:
        self._path = path
        self._disk = disk
        self._dir = os.path.dirname(os.path.abspath(path))
        disk.remove(path + COMPACT_SUFFIX)
        self._fd = disk.open(path)
        self._entries: list[tuple] = []
        #: where each entry's record starts in the file (a compaction copies the bytes it keeps)
        self._offsets: list[int] = []
        self._end = FIRST_RECORD_OFFSET
        #: a compaction copies the records it keeps on a thread of its own (``deleteEntriesTo``);
        #: False: on the caller's
        self.background_compaction = True
        self._compaction: _Compaction | None = None
        #: the thread closing the file a compaction replaced (``_compact``)
        self._closer: threading.Thread | None = None
        legacy, cut = self._load()
        #: the file's records are in pysyncobj's format (a compaction rewrites them in this one)
        self._legacy = legacy
        self._meta_path = path + ".meta"
        self._meta = self._read_meta()
        self._commit_fd = disk.open(path + COMMIT_SUFFIX)
        commit = self._read_commit()
        if cut:
            # A tear lies past the last sync, and the commit index written never covers an
            # unsynced entry: one below it is damage to what this node synced (and acknowledged),
            # unless the full dump it loads next covers it (a journal cleared for a snapshot the
            # leader sent, its new entries torn over the old ones). Which it is, the dump says;
            # the journal cannot tell, so it says so loudly and keeps what holds together.
            kept = self._entries[-1][1] if self._entries else 0
            committed = max(self._meta.get("raftCommitIndex", 0), commit or 0)
            if kept < committed:
                logger.critical("replication.journal_damaged path=%s: the journal holds together up to entry "
                                "%d, below the commit index written (%d): unless this node's full dump "
                                "covers entry %d, entries it synced are lost; check the disk, and replace "
                                "the node if it happens again (docs/operations.md)", path, kept, committed,
                                kept + 1)
        # An index beyond the log is not this log's (a journal removed by hand): ignored.
        if commit is not None and commit > self._meta.get("raftCommitIndex", 1) \
                and self._entries and commit <= self._entries[-1][1]:
            self._meta["raftCommitIndex"] = commit
        #: the commit index this node had written before it started (the meta's or the commit
        #: file's): the entries up to it were applied by the process before, which counted them
        #: in its metrics (_SyncObj's replay)
        self.opened_commit_index: int = self._meta.get("raftCommitIndex", 1)
        if legacy:
            self.deleteEntriesTo(0)  # rewritten in this format, as a compaction writes (synced, renamed)
        #: the commit index moved since it was last written (to the meta or the commit file)
        self._commit_saved = True
        #: written since the last sync
        self.dirty = True
        #: the last entry's index at the last sync (None before the first)
        self.synced_index: int | None = None
        #: group syncs made (one covers every entry added since the one before)
        self.syncs = 0
        self.sync()
        disk.sync_dir(self._dir)

    # -- reading at start ---------------------------------------------------------------------

    def _load(self) -> tuple[bool, bool]:
        """Read the records; returns (the file is in pysyncobj's format, a tail was cut)."""
        disk, fd = self._disk, self._fd
        size = disk.size(fd)
        if size < FIRST_RECORD_OFFSET:
            disk.truncate(fd, 0)
            disk.pwrite(fd, _header(FIRST_RECORD_OFFSET), 0)
            return False, False
        fmt, end = struct.unpack("<II", disk.pread(fd, 8, _FORMAT_OFFSET))
        if fmt == 0 and end == 0:  # a header that never reached the disk: an empty journal
            disk.pwrite(fd, _header(FIRST_RECORD_OFFSET), 0)
            return False, False
        if fmt not in (JOURNAL_FORMAT_CRC, JOURNAL_FORMAT_VERSION):
            disk.close(fd)
            raise RuntimeError(f"{self._path}: journal format {fmt} is not one this version reads "
                               "(written by a newer version?)")
        legacy = fmt == JOURNAL_FORMAT_VERSION
        extra = 16 if legacy else 20  # what a record's size counts beyond its command
        off, entries, why = FIRST_RECORD_OFFSET, self._entries, None
        while off < end:
            head = disk.pread(fd, _RECORD_HEAD.size, off)
            if len(head) < _RECORD_HEAD.size:
                why = "a record header past the end of the file"
                break
            rsize, idx, term = _RECORD_HEAD.unpack(head)
            if rsize < extra or off + 8 + rsize > min(end, size):
                why = f"a record of {rsize} bytes past the journal's end"
                break
            if _HEADER.unpack(disk.pread(fd, 4, off + 4 + rsize))[0] != rsize:
                why = "a record whose trailing size differs from its leading size"
                break
            if entries and (idx != entries[-1][1] + 1 or term < entries[-1][2]):
                why = f"entry {idx} (term {term}) after entry {entries[-1][1]} (term {entries[-1][2]})"
                break
            data = disk.pread(fd, rsize - extra, off + 20)
            if not legacy and zlib.crc32(data, zlib.crc32(_IDX_TERM.pack(idx, term))) \
                    != _HEADER.unpack(disk.pread(fd, 4, off + rsize))[0]:
                why = f"entry {idx} (term {term}) whose checksum differs (written in part)"
                break
            entries.append((data, idx, term))
            self._offsets.append(off)
            off += 8 + rsize
        self._end = off
        if why is not None:
            logger.error("replication.journal_tail_dropped path=%s at=%d header_end=%d: %s; "
                         "%d entries kept", self._path, off, end, why, len(entries))
            self._write_end()
        return legacy, why is not None

    def _read_commit(self) -> int | None:
        data = self._disk.pread(self._commit_fd, _COMMIT.size, 0)
        if len(data) < _COMMIT.size:
            return None
        commit, crc = _COMMIT.unpack(data)
        return commit if zlib.crc32(data[:8]) == crc else None

    def _write_commit(self) -> None:
        commit = self._meta.get("raftCommitIndex", 1)
        self._disk.pwrite(self._commit_fd, _COMMIT.pack(commit, zlib.crc32(struct.pack("<Q", commit))), 0)
        self._commit_saved = True

    def _read_meta(self) -> dict:
        try:
            with open(self._meta_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            meta = _pickle_loads(data)
            if not isinstance(meta, dict):
                raise ValueError(f"not a dict: {type(meta).__name__}")
            return meta
        except Exception:  # noqa: BLE001 - whatever the unpickler raises
            if not self._disk.fsync:
                # --no-fsync: a power cut may leave the meta empty, as it may take any write; the
                # operator chose that, and the node starts as pysyncobj does, loudly.
                logger.exception("replication.journal_meta_unreadable path=%s (fsync is off: term and "
                                 "vote start from the log)", self._meta_path)
                return {}
            stop_on_unreadable_meta(self._meta_path)  # damage: a stop
            return {}  # (a test's recorder in place of the exit)

    # -- the log ------------------------------------------------------------------------------

    def _write_end(self) -> None:
        self.dirty = True
        try:
            self._disk.pwrite(self._fd, _HEADER.pack(self._end), LAST_RECORD_OFFSET_OFFSET)
        except OSError:
            stop_on_failed_write("writing the journal's header")

    def add(self, command, idx, term):
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        rec = _record(command, idx, term)
        try:
            self._disk.pwrite(self._fd, rec, self._end)
        except OSError:  # (held in memory, not on disk: the two would disagree from here on)
            stop_on_failed_write("appending to the journal")
        self._end += len(rec)
        self._write_end()

    def clear(self):
        self._finish_compaction(wait=True)
        self._entries = []
        self._offsets = []
        self._end = FIRST_RECORD_OFFSET
        self._write_end()

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom):
        remove = len(self._entries) - entryFrom
        if remove <= 0:
            return
        self._finish_compaction(wait=True)  # (the copy may hold records this cuts)
        del self._entries[entryFrom:]
        self._end = self._offsets[entryFrom]
        del self._offsets[entryFrom:]
        self._write_end()

    def deleteEntriesTo(self, entryTo):
        """Keep the entries from position ``entryTo`` on, in a new file that replaces the
        journal once it is durable (the class docstring). The list drops the others at once;
        the file's records it keeps are copied, then synced, by a thread of its own
        (``_Compaction``) while entries are still appended to this file, and the tick thread
        finishes it (``_finish_compaction``: the records added meanwhile copied, the new file
        synced and renamed over this one) at the next once-a-second timer. Until the rename a
        crash leaves this file whole; a restart then trims it to the dump."""
        self._finish_compaction(wait=True)  # (one at a time: the one before, if not done)
        first = self._offsets[entryTo] if entryTo < len(self._offsets) else self._end
        background = self.background_compaction and not self._legacy
        if background:  # (set before the list changes: ``compacting`` is read by other threads)
            self._compaction = _Compaction(self._disk, self._fd, self._path + COMPACT_SUFFIX, first, self._end)
        self._entries = self._entries[entryTo:]
        self._offsets = self._offsets[entryTo:]
        if not background:
            self._compact(first, self._end, None)

    @property
    def compacting(self) -> bool:
        """A compaction started and neither finished nor dropped: until then the file holds the
        entries dropped from the list. (A dropped one, which failed, leaves them in the file too,
        until the next compaction; a restart trims the file to the dump either way.)"""
        return self._compaction is not None

    def _finish_compaction(self, wait: bool) -> None:
        """Finish the compaction in progress if its thread is done (or, with ``wait``, once it
        is): what was appended since it started copied, the new file synced and renamed over
        the journal. A thread that failed leaves its work to the tick thread (``_compact``)."""
        c = self._compaction
        if c is None or not (wait or c.done.is_set()):
            return
        c.done.wait()
        try:
            if c.error is not None:
                logger.warning("replication.journal_compaction_retried error=%r (the copy failed; "
                               "done again on the tick thread)", c.error)
                if c.fd is not None:
                    self._disk.close(c.fd)
                c.fd = None
            self._compact(c.first, c.end, c)
        except OSError as e:
            # Failed again (a full disk: a compaction needs room for a second copy of what it
            # keeps) before the rename, so the journal is this file, whole, and the offsets are
            # its own: the entries dropped from the list stay in the file, the next compaction
            # drops them, and a restart trims the file to the dump. Raising instead would fail
            # whoever waited for it (a snapshot install's clear, a cut, the stop).
            logger.error("replication.journal_compaction_failed error=%r (the journal keeps the entries "
                         "before the dump until the next compaction or a restart)", e)
            _remove_quietly(self._disk, self._path + COMPACT_SUFFIX)
        finally:
            self._compaction = None  # (after the rename, or a failure: nothing is left to wait for)

    def _compact(self, first: int, end0: int, c: "_Compaction | None") -> None:
        """Replace the journal by a file of its records from offset ``first`` on: ``c``'s file
        holds them up to ``end0`` already (copied and synced), or none (``c`` None)."""
        disk = self._disk
        tmp = self._path + COMPACT_SUFFIX
        if self._legacy:  # records in pysyncobj's format: written again, in this one
            records = [_record(*e) for e in self._entries]
            body, offsets, off = b"".join(records), [], FIRST_RECORD_OFFSET
            for r in records:
                offsets.append(off)
                off += len(r)
            size = len(body)
        else:
            # The records it keeps are the file's, from the first kept one to the end: copied as
            # they are, in the kernel (Disk.copy_range), not encoded again on the tick thread
            # (0.2-0.4 s of CPU with the interpreter lock held for the 36-110 MB a compaction
            # kept during a mass registration at 1M jobs: docs/benchmarks.md).
            body, size = b"", self._end - first
            offsets = [o - first + FIRST_RECORD_OFFSET for o in self._offsets]
        end = FIRST_RECORD_OFFSET + size
        fd = c.fd if c is not None and c.fd is not None else disk.open(tmp, create_empty=True)
        done = end0 - first if c is not None and c.fd is not None else 0
        try:
            disk.pwrite(fd, _header(end) + body, 0)
            if not body and size > done:
                disk.copy_range(self._fd, fd, size - done, first + done, FIRST_RECORD_OFFSET + done)
            disk.sync(fd)
            disk.rename(tmp, self._path)
        except BaseException:
            disk.close(fd)
            raise
        old, self._fd = self._fd, fd
        self._offsets, self._end, self._legacy = offsets, end, False
        self.dirty = False
        self.synced_index = self._entries[-1][1] if self._entries else None
        try:
            disk.sync_dir(self._dir)
        except OSError:  # (until it is durable, a power cut may bring back the old name)
            stop_on_failed_write("syncing the journal's directory after its compaction")
        if c is None:
            disk.close(old)
        else:  # closing the last descriptor of the old file frees it: ~60 ms for 200 MB
            self._closer = threading.Thread(target=_close_quietly, args=(disk, old), name="journal-close",
                                            daemon=True)
            self._closer.start()

    # -- durability ---------------------------------------------------------------------------

    def sync(self) -> bool:
        """Make every entry added so far durable, if any was added since the last sync (one
        ``fdatasync`` for all of them); returns whether it synced."""
        if not self.dirty:
            return False
        try:
            self._disk.sync(self._fd)
        except OSError:
            # Whoever called (the gate before an answer, setCurrentTerm before a vote, the commit
            # index's writer): a retry could report success for pages the kernel dropped.
            stop_on_failed_write("fdatasync of the journal")
        self.dirty = False
        self.synced_index = self._entries[-1][1] if self._entries else None
        self.syncs += 1
        return True

    def flush(self):
        self.sync()

    def _destroy(self):
        if self._fd < 0:
            return
        try:
            self._finish_compaction(wait=True)
            if self._closer is not None:
                self._closer.join()
            self.sync()
            if not self._commit_saved:
                self._store_meta()
                self._write_commit()
        finally:
            self._disk.close(self._fd)
            self._disk.close(self._commit_fd)
            self._fd = -1

    # -- meta: term, vote, commit index -------------------------------------------------------

    def _store_meta(self) -> None:
        self.sync()  # the commit index stored never covers entries a power loss could take
        try:
            self._disk.write_file(self._meta_path, _pickle_dumps(self._meta))
        except OSError:  # (the term and vote in memory would run ahead of what survives a restart)
            stop_on_failed_write("writing the term and vote")

    def setRaftCommitIndex(self, raftCommitIndex):
        if raftCommitIndex != self._meta.get("raftCommitIndex"):
            self._meta["raftCommitIndex"] = raftCommitIndex
            self._commit_saved = False

    def getRaftCommitIndex(self):
        return self._meta.get("raftCommitIndex", 1)

    def setCurrentTerm(self, term, votedForNodeId):
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        # Raft: currentTerm and votedFor are durable before any message that reflects them.
        self._store_meta()

    def getCurrentTerm(self):
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self):
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self):
        self._finish_compaction(wait=False)
        if not self._commit_saved:
            self.sync()  # the index written never covers an unsynced entry (class docstring)
            self._write_commit()


def _close_quietly(disk: Disk, fd: int) -> None:
    try:
        disk.close(fd)
    except BaseException as e:  # noqa: BLE001 - a descriptor left open; nothing else depends on it
        logger.warning("replication.journal_close_failed error=%r", e)


def _remove_quietly(disk: Disk, path: str) -> None:
    try:
        disk.remove(path)
    except OSError as e:  # (the next compaction writes over it, a restart removes it)
        logger.warning("replication.journal_compaction_remove_failed path=%s error=%r", path, e)


class _Compaction:
    """A journal compaction's first part, on a thread of its own: a new file (``path``) with the
    records of ``src`` from ``first`` to ``end`` copied in, synced. ``done`` is set when it
    ended; ``error`` is what it raised (then ``fd`` may be None: the tick thread does it all)."""

    def __init__(self, disk: Disk, src: int, path: str, first: int, end: int) -> None:
        self.disk, self.src, self.path, self.first, self.end = disk, src, path, first, end
        self.fd: int | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="journal-compaction", daemon=True).start()

    def _run(self) -> None:
        try:
            self.fd = self.disk.open(self.path, create_empty=True)
            if self.end > self.first:
                self.disk.copy_range(self.src, self.fd, self.end - self.first, self.first, FIRST_RECORD_OFFSET)
            self.disk.sync(self.fd)
        except BaseException as e:  # noqa: BLE001 - said, and done again, by the tick thread
            self.error = e
        finally:
            self.done.set()
