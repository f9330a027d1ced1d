"""raftsched/replication/_storage.py: the journal file written with pwrite, in pysyncobj's format,
rewritten to its live records by a compaction, and dumps at gzip level 1 that still read level 9.
(Its durability: tests/test_replication_durability.py.)"""
from __future__ import annotations

import errno
import gzip
import io
import os
import pickle
import struct


import pytest
from pysyncobj import serializer
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal, ResizableFile

from raftsched.replication import install
from raftsched.replication._storage import JOURNAL_FORMAT_CRC, _DurableJournal, _FastGzip, create_journal


def test_dumps_are_gzip_level_1_and_level_9_dumps_still_read(tmp_path):
    """pysyncobj wrote dumps at gzip level 9 (seconds at 1M jobs for a slightly larger file);
    _FastGzip writes level 1, and reads what level 9 wrote."""
    install()  # what every RaftNode does
    assert serializer.gzip is _FastGzip
    path = str(tmp_path / "raft.dump")
    data = (b"state" * 1000, 7, 8)
    s = serializer.Serializer(path, transmissionBatchSize=2 ** 16, tryUseFork=False,
                              serializer=None, deserializer=None, serializeChecker=None)
    s.serialize(data, 1)
    with open(path, "rb") as f:
        head = f.read(10)
    assert head[:2] == b"\x1f\x8b" and head[8] == 4  # XFL 4: the fastest level (9 writes 2)
    assert s.deserialize() == data
    with open(path, "wb") as f:  # a dump an older node wrote
        f.write(gzip.compress(pickle.dumps(data), 9))
    assert s.deserialize() == data
    with _FastGzip.GzipFile(fileobj=io.BytesIO(gzip.compress(b"x" * 100, 9))) as g:
        assert g.read() == b"x" * 100


def test_the_journal_is_not_mapped_and_a_compaction_keeps_only_its_live_records(tmp_path):
    """The journal pysyncobj now gets: the same records read back, the file never mmapped (its
    pages counted in a node's resident memory, on top of the journal's own list), and a
    compaction leaves a file of the records it keeps."""
    install()  # what every RaftNode does
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    assert isinstance(j, _DurableJournal)
    entries = [(os.urandom(1000), i, 1 + i // 20) for i in range(1, 61)]
    for e in entries:
        j.add(*e)
    with open("/proc/self/maps") as f:
        assert path not in f.read()
    record = 8 + 16 + 1000 + 4  # two lengths, index and term, the command, its checksum
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 60 * record
    j._destroy()

    j = create_journal(path)  # what a restarted node reads
    assert [tuple(j[i]) for i in range(len(j))] == entries
    j.deleteEntriesTo(50)  # what a compaction does
    j._finish_compaction(wait=True)  # (its thread copies, the tick thread finishes)
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 10 * record
    j.add(b"x" * 10, 61, 4)
    j._destroy()

    j = create_journal(path)
    assert [tuple(j[i]) for i in range(len(j))] == entries[50:] + [(b"x" * 10, 61, 4)]
    j._destroy()


@pytest.mark.parametrize("copy", ["kernel", "buffer"])
def test_a_compaction_copies_the_records_it_keeps_without_encoding_them_again(tmp_path, monkeypatch, copy):
    """A compaction writes the records it keeps as the file holds them (copied, in the kernel
    where it can: Disk.copy_range), not encoded again on the tick thread: 0.2-0.4 s of CPU with
    the interpreter lock held at 1M jobs, while the heartbeats waited. The result reads back the
    same after any mix of appends, cuts and compactions, and after a restart."""
    from raftsched.replication import _storage
    install()
    if copy == "buffer":  # a kernel or file system without copy_file_range
        def refuse(*a):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    model = []
    for i in range(1, 41):
        e = (os.urandom(10 + 37 * i % 500), i, 1 + i // 15)
        j.add(*e)
        model.append(e)
    encoded = []
    real_record = _storage._record
    monkeypatch.setattr(_storage, "_record", lambda *e: encoded.append(e[1]) or real_record(*e))
    j.deleteEntriesTo(25)  # keeps 26..40
    model = model[25:]
    assert encoded == [], "the kept records were encoded again"
    j.deleteEntriesFrom(10)  # a conflict cuts 36..40
    model = model[:10]
    for i in range(36, 46):
        e = (os.urandom(3 + i), i, 9)
        j.add(*e)
        model.append(e)
    j.deleteEntriesTo(4)
    model = model[4:]
    for i in range(46, 49):  # appended while the compaction's thread copies
        e = (os.urandom(100 + i), i, 9)
        j.add(*e)
        model.append(e)
    assert [tuple(j[i]) for i in range(len(j))] == model
    j._destroy()
    j = create_journal(path)  # a restart reads every record whole (checksums, sequence)
    assert [tuple(j[i]) for i in range(len(j))] == model
    record_sizes = sum(8 + 16 + len(e[0]) + 4 for e in model)
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + record_sizes
    j.deleteEntriesTo(len(model))  # everything in the dump: an empty journal
    j.add(b"z", 49, 9)
    j._destroy()
    assert [tuple(e) for e in create_journal(path)._entries] == [(b"z", 49, 9)]


def _journal_of_20(tmp_path):
    """A journal of entries 1..20 of 200 random bytes: (its path, the journal, the entries)."""
    install()
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    model = [(os.urandom(200), i, 1) for i in range(1, 21)]
    for e in model:
        j.add(*e)
    return path, j, model


def test_a_compaction_whose_thread_failed_is_done_by_the_tick_thread(tmp_path, monkeypatch, caplog):
    """The compaction's thread failing (a full disk, an I/O error) leaves the journal whole; the
    tick thread, finishing it, does it all again itself and says so."""
    from raftsched.replication._disk import Disk
    path, j, model = _journal_of_20(tmp_path)
    real, calls = Disk.copy_range, []

    def once(self, *a):
        calls.append(a)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "no space left")
        return real(self, *a)
    monkeypatch.setattr(Disk, "copy_range", once)
    j.deleteEntriesTo(15)
    j._compaction.done.wait()
    j.add(b"late", 21, 2)
    with caplog.at_level("WARNING", logger="raftsched.replication"):
        j.onOneSecondTimer()  # the tick thread's timer finishes it
    assert j._compaction is None and len(calls) == 2
    assert "journal_compaction_retried" in caplog.text
    j._destroy()
    assert [tuple(e) for e in create_journal(path)._entries] == model[15:] + [(b"late", 21, 2)]
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 5 * (28 + 200) + 28 + 4


@pytest.mark.parametrize("then", ["clear", "cut", "timer", "stop"])
def test_a_compaction_that_fails_again_leaves_the_journal_whole_and_raises_to_nobody(tmp_path, monkeypatch,
                                                                                       caplog, then):
    """The thread's copy and the tick thread's retry both failing (a full disk: a compaction
    needs room for a second copy) happen before the rename, so the journal is the old file,
    whole: the failure is logged and dropped, not raised to whoever waited for it (a snapshot
    install's clear, which would stop the node as if its dump were unreadable; a cut; the
    stop, which would skip its last sync and commit index), and the partial copy is removed."""
    from raftsched.replication._disk import Disk
    path, j, model = _journal_of_20(tmp_path)

    def full(self, *a):
        raise OSError(errno.ENOSPC, "no space left")
    monkeypatch.setattr(Disk, "copy_range", full)
    j.deleteEntriesTo(15)
    j._compaction.done.wait()
    j.add(b"late", 21, 2)
    with caplog.at_level("WARNING", logger="raftsched.replication"):
        if then == "clear":
            j.clear()
        elif then == "cut":
            j.deleteEntriesFrom(4)  # the list's positions: model[15:19] kept
        elif then == "timer":
            j.onOneSecondTimer()
        j._destroy()
    assert "journal_compaction_failed" in caplog.text and not j.compacting
    assert not os.path.exists(path + ".compact")
    kept = [tuple(e) for e in create_journal(path)._entries]
    if then == "clear":
        assert kept == []
    elif then == "cut":
        assert kept[-4:] == model[15:19] and len(kept) == 19  # the old file: the dropped prefix too
    else:
        assert kept == model + [(b"late", 21, 2)]  # whole; a restart trims it to the dump
    monkeypatch.undo()
    install()
    j = create_journal(path)  # the next compaction drops what the failed one could not
    j.add(b"next", 30, 3)
    j.deleteEntriesTo(len(j) - 1)
    j._compaction.done.wait()
    j.onOneSecondTimer()
    j._destroy()
    assert [tuple(e) for e in create_journal(path)._entries] == [(b"next", 30, 3)]
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 28 + 4


def test_a_compaction_is_said_to_be_in_progress_until_the_file_is_trimmed(tmp_path, monkeypatch):
    """``compacting`` (what a graceful stop's dump_now waits on) stays True until the new file
    has replaced the journal: read by another thread, a False said the file was trimmed."""
    from raftsched.replication._disk import Disk
    install()
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    for i in range(1, 11):
        j.add(os.urandom(300), i, 1)
    seen = []
    real = Disk.rename
    monkeypatch.setattr(Disk, "rename", lambda self, a, b: (seen.append(j.compacting), real(self, a, b))[1])
    j.deleteEntriesTo(8)
    assert j.compacting and len(j) == 2
    j._compaction.done.wait()
    j.onOneSecondTimer()
    assert seen == [True] and not j.compacting
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 2 * (28 + 300)
    j._destroy()


def test_a_copy_from_a_source_that_ends_early_is_an_error(tmp_path):
    from raftsched.replication._disk import Disk
    d = Disk()
    src, dst = d.open(str(tmp_path / "a")), d.open(str(tmp_path / "b"))
    d.pwrite(src, b"0123456789", 0)
    d.copy_range(src, dst, 6, 2, 4)
    assert d.pread(dst, 100, 0) == b"\0" * 4 + b"234567"
    with pytest.raises(OSError):
        d.copy_range(src, dst, 20, 0, 0)
    d.close(src)
    d.close(dst)


def test_a_journal_pysyncobj_wrote_is_read_and_rewritten_with_checksums(tmp_path):
    """A journal in pysyncobj's own format (FileJournal's; raftsched's before 2026-12-04) reads
    back here and is rewritten at open in this format, whose records carry a checksum."""
    path = str(tmp_path / "raft.journal")
    install()
    assert serializer.gzip is _FastGzip
    theirs = FileJournal(path)  # pysyncobj's own journal, on its mmapped ResizableFile
    assert isinstance(theirs._FileJournal__journalFile, ResizableFile)
    entries = [(os.urandom(50), i, 1) for i in range(1, 11)]
    for e in entries:
        theirs.add(*e)
    theirs.setCurrentTerm(3, "127.0.0.1:9")
    theirs._destroy()
    ours = create_journal(path)
    assert [tuple(ours[i]) for i in range(len(ours))] == entries
    assert (ours.getCurrentTerm(), ours.getVotedForNodeId()) == (3, "127.0.0.1:9")
    ours.deleteEntriesFrom(8)
    ours.add(b"new", 9, 2)
    ours._destroy()
    with open(path, "rb") as f:
        assert struct.unpack_from("<I", f.read(40), 32)[0] == JOURNAL_FORMAT_CRC
    again = create_journal(path)
    assert [tuple(again[i]) for i in range(len(again))] == entries[:8] + [(b"new", 9, 2)]
    again._destroy()
    # pysyncobj's empty journal too: what is appended after is in this format.
    path2 = str(tmp_path / "empty.journal")
    FileJournal(path2)._destroy()
    j = create_journal(path2)
    j.add(b"x", 1, 1)
    j._destroy()
    assert [tuple(create_journal(path2)[0])] == [(b"x", 1, 1)]


def _bytes_of(path):
    with open(path, "rb") as f:
        return bytearray(f.read())


def test_an_entry_written_in_part_past_the_commit_index_is_cut_with_what_follows(tmp_path, caplog):
    """A power cut can leave an unsynced entry's first and last pages on disk and not a page
    between: its sizes agree, and only its checksum tells. It and every later entry (all past
    the last sync) are dropped; the leader sends them again."""
    install()
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    entries = [(b"\x00" + os.urandom(10_000), i, 1) for i in range(1, 5)]
    for e in entries:
        j.add(*e)
    j.setRaftCommitIndex(2)
    j.onOneSecondTimer()  # the commit index written: 2 (entries 1 and 2 synced)
    j._destroy()
    raw = _bytes_of(path)
    third = 40 + 2 * (28 + 10_001)
    raw[third + 4000:third + 8000] = bytes(4000)  # a page inside entry 3 never written
    with open(path, "wb") as f:
        f.write(raw)
    j = create_journal(path)
    assert [tuple(j[i]) for i in range(len(j))] == entries[:2]
    assert "checksum differs" in caplog.text
    j._destroy()


def test_damage_at_or_below_the_commit_index_written_is_said_loudly(tmp_path, caplog):
    """Below the commit index written, entries were synced: a record there that does not hold
    together is damage (or a journal cleared for a snapshot, which the dump then covers)."""
    install()
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    for i in range(1, 5):
        j.add(b"\x00" + bytes([i]) * 100, i, 1)
    j.setRaftCommitIndex(3)
    j.onOneSecondTimer()
    j._destroy()
    raw = _bytes_of(path)
    raw[40 + (28 + 101) + 50] ^= 0xFF  # one bit of entry 2, synced and committed
    with open(path, "wb") as f:
        f.write(raw)
    j = create_journal(path)
    assert len(j) == 1 and "replication.journal_damaged" in caplog.text and "covers entry 2" in caplog.text
    j._destroy()
