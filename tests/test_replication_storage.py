"""raftsched/replication/_storage.py: the journal file written with pwrite and cut back after a
compaction, and dumps at gzip level 1 that still read level 9."""
from __future__ import annotations

import gzip
import io
import os
import pickle

from pysyncobj import serializer
from pysyncobj.journal import FIRST_RECORD_OFFSET, createJournal

from raftsched.replication import install
from raftsched.replication._storage import _cut_journal_file, _FastGzip, _JournalFile


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


def test_the_journal_file_is_not_mapped_and_is_cut_back_after_a_compaction(tmp_path):
    """pysyncobj's FileJournal on _JournalFile: the same records read back, the file never
    mmapped (its pages counted in a node's resident memory, on top of FileJournal's own list),
    and a compaction cuts the file back to the records it keeps."""
    install()  # what every RaftNode does
    path = str(tmp_path / "raft.journal")
    j = createJournal(path)
    assert isinstance(j._FileJournal__journalFile, _JournalFile)
    entries = [(os.urandom(1000), i, 1 + i // 20) for i in range(1, 61)]
    for e in entries:
        j.add(*e)
    with open("/proc/self/maps") as f:
        assert path not in f.read()
    record = 8 + 16 + 1000  # two lengths, index and term, the command
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 60 * record
    j._destroy()

    j = createJournal(path)  # what a restarted node reads
    assert [tuple(j[i]) for i in range(len(j))] == entries
    j.deleteEntriesTo(50)  # what a compaction does (pysyncobj), then _SyncObj cuts the file
    _cut_journal_file(j)
    assert os.path.getsize(path) == FIRST_RECORD_OFFSET + 10 * record
    j.add(b"x" * 10, 61, 4)
    j._destroy()

    j = createJournal(path)
    assert [tuple(j[i]) for i in range(len(j))] == entries[50:] + [(b"x" * 10, 61, 4)]
    j._destroy()
