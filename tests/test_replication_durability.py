"""Durability (docs/design.md, I26): the journal, its meta and the dumps against a model of a power
loss (replication/powerloss.py: what was synced survives, nothing else), a compaction crashed at
every step, a sync torn at every write, and three real RaftNodes whose acknowledged writes
survive a power cut of the whole cluster because nothing answers for an unsynced entry (the sync
gate, replication/_durable.py)."""
from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading

import pytest

from raftsched.replication import _durable, _storage, _syncobj, install
from raftsched.replication._storage import COMPACT_SUFFIX, StoragePath, _DurableJournal, durable_replace
from raftsched.replication.node import RaftNode
from raftsched.replication.powerloss import ShadowDisk, power_cut
from tests.replication_helpers import COMPACT, SECRET, Cluster, FakeState, incr, propose_retrying, wait_until


def entries(j) -> list[tuple]:
    return [tuple(j[i]) for i in range(len(j))]


def cmd(i: int, size: int = 40) -> bytes:
    return (b"%d:" % i) * (size // 3 + 1)


def open_journal(d) -> _DurableJournal:
    return _DurableJournal(str(d / "raft.journal"), ShadowDisk(str(d)))


def test_a_power_cut_keeps_what_was_synced_and_nothing_else(tmp_path):
    j = open_journal(tmp_path)
    first = [(cmd(i), i, 1) for i in range(1, 6)]
    for e in first:
        j.add(*e)
    assert j.dirty and j.sync() and not j.dirty and j.synced_index == 5
    for i in range(6, 9):
        j.add(cmd(i), i, 1)
    j._disk.freeze()  # the power goes; the process is not asked
    done = power_cut(str(tmp_path))
    assert "raft.journal" in done["reverted"]
    assert entries(open_journal(tmp_path)) == first


def test_without_a_sync_a_power_cut_leaves_nothing(tmp_path):
    """The model's teeth: with fsync off nothing reaches the shadow, whatever the journal did."""
    disk = ShadowDisk(str(tmp_path), fsync=False)
    j = _DurableJournal(str(tmp_path / "raft.journal"), disk)
    for i in range(1, 6):
        j.add(cmd(i), i, 1)
    j.setCurrentTerm(3, "127.0.0.1:1")
    j.sync()
    j._destroy()
    power_cut(str(tmp_path))
    assert not os.path.exists(tmp_path / "raft.journal")
    assert not os.path.exists(tmp_path / "raft.journal.meta")


def test_term_and_vote_are_durable_when_set_current_term_returns(tmp_path):
    """Raft: a vote leaves only once term and vote are on disk; setCurrentTerm syncs the
    journal first, so the commit index in the meta never covers entries a cut can take."""
    j = open_journal(tmp_path)
    j.add(cmd(1), 1, 1)
    j.setRaftCommitIndex(1)
    j.setCurrentTerm(7, "127.0.0.1:9001")
    j._disk.freeze()
    power_cut(str(tmp_path))
    j = open_journal(tmp_path)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (7, "127.0.0.1:9001", 1)
    assert entries(j) == [(cmd(1), 1, 1)]


def test_the_commit_index_alone_costs_no_sync_and_never_covers_an_unsynced_entry(tmp_path):
    """A commit index that moved is written once a second in place, unsynced (as etcd's raft:
    no sync for the commit index alone), never above the synced entries; a power loss leaves an
    older one, and a torn file reads as none. Term and vote stay durable."""
    j = open_journal(tmp_path)
    for i in range(1, 4):
        j.add(cmd(i), i, 1)
    j.setCurrentTerm(2, "127.0.0.1:9001")  # synced: the meta holds commit index 1
    syncs = j._disk.syncs
    j.setRaftCommitIndex(3)
    j.onOneSecondTimer()
    assert j._disk.syncs == syncs  # was: the meta rewritten durably, two syncs every second
    assert open_journal(tmp_path).getRaftCommitIndex() == 3  # what a restart after kill -9 reads
    for i in range(4, 7):
        j.add(cmd(i), i, 1)
    j.setRaftCommitIndex(6)
    j.onOneSecondTimer()
    assert j.synced_index == 6 and j._disk.syncs == syncs + 1  # the entries first, then the index
    j._disk.freeze()
    power_cut(str(tmp_path))
    j = open_journal(tmp_path)
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (2, "127.0.0.1:9001")
    assert len(entries(j)) == 6 and j.getRaftCommitIndex() <= 6
    j._destroy()
    with open(tmp_path / "raft.journal.commit", "r+b") as f:
        f.write(b"\x05" * 12)  # torn
    assert open_journal(tmp_path).getRaftCommitIndex() == 1  # the meta's


class _Crash(Exception):
    pass


class CrashingDisk(ShadowDisk):
    """Dies (raises _Crash, and freezes: nothing after reaches the shadow) at its ``at``-th
    operation; ``ops`` counts them."""

    def __init__(self, root, at: int | None) -> None:
        super().__init__(root)
        self.at, self.ops = at, 0

    def _step(self):
        if self.at is not None and self.ops == self.at:
            self.freeze()
            raise _Crash(self.ops)
        self.ops += 1


for _name in ("open", "pwrite", "copy_range", "truncate", "sync", "close", "rename", "remove", "sync_dir", "sync_path"):
    def _wrapped(self, *a, _op=_name, **kw):
        if not self.frozen:
            self._step()
        return getattr(ShadowDisk, _op)(self, *a, **kw)
    setattr(CrashingDisk, _name, _wrapped)


def _journal_with(d, n: int, synced: int) -> list[tuple]:
    """A journal of entries 1..n in ``d``, 1..synced of them synced; returns them."""
    j = open_journal(d)
    es = [(cmd(i, 30 + 7 * i), i, 1 + i // 10) for i in range(1, n + 1)]
    for e in es[:synced]:
        j.add(*e)
    j.sync()
    for e in es[synced:]:
        j.add(*e)
    j._disk.freeze()  # what follows starts from the files as they are (a new process)
    return es


def _copy(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def _compact_in_place(j: _DurableJournal, entry_to: int) -> None:
    """pysyncobj's FileJournal.deleteEntriesTo: clear, then add back what it keeps, in place."""
    kept = entries(j)[entry_to:]
    j.clear()
    for e in kept:
        j.add(*e)


def _crashing_at(tmp_path, base, k: int, disk_type):
    """The k-th try: a copy of the files in ``base``, opened on a ``disk_type`` (a CrashingDisk)
    that crashes at its k-th operation from here on. Returns (its directory, the disk, the journal)."""
    d = tmp_path / f"k{k}"
    _copy(base, d)
    disk = disk_type(str(d), at=None)
    j = _DurableJournal(str(d / "raft.journal"), disk)
    disk.ops, disk.at = 0, k
    return d, disk, j


def _kill_and_cut(tmp_path, d, k: int) -> tuple[list[tuple], list[tuple]]:
    """The journal in ``d`` after a crash, read as a restart reads it: after a kill -9 (the files
    as the process left them) and after a power cut at the crash's instant (in a copy, cut
    first: reading the journal syncs it whole, as a restarted node does)."""
    cut = tmp_path / f"cut{k}"
    _copy(d, cut)
    power_cut(str(cut))
    after_cut = entries(_DurableJournal(str(cut / "raft.journal"), ShadowDisk(str(cut))))
    killed = entries(_DurableJournal(str(d / "raft.journal"), ShadowDisk(str(d))))
    return killed, after_cut


def _kept(got: list[tuple], written: list[tuple], required: list[tuple]) -> bool:
    """``got`` is a run of ``written`` (in order, none missing between its ends) holding every
    entry of ``required``."""
    contiguous = bool(got) and got == written[got[0][1] - 1:got[-1][1]]
    return contiguous and all(e in got for e in required)


@pytest.mark.parametrize("compact", ["rename", "background", "in place"])
def test_a_compaction_crashed_at_every_step_keeps_every_entry_after_the_dump(tmp_path, compact):
    """A compaction drops the entries a durable dump holds (here 1..20 of a journal of 1..30).
    Crashed at each of its disk operations, then (a) restarted as the process left the files
    (kill -9), (b) after a power cut: the journal is a run of the entries with every one after
    20. pysyncobj's in-place rewrite ("in place") loses some at some step. "background": the
    copy made by the compaction's own thread while two entries are appended, then finished by
    the caller (as the tick thread does); a crash in the thread is a crash of the process."""
    base = tmp_path / "base"
    base.mkdir()
    es = _journal_with(base, 30, 25)
    more = [(cmd(i, 30 + 7 * i), i, 4) for i in (31, 32)] if compact == "background" else []
    lost_somewhere = []
    k = 0
    while True:
        d, disk, j = _crashing_at(tmp_path, base, k, CrashingDisk)
        j.background_compaction = compact == "background"
        crashed = False
        try:
            if compact == "in place":
                _compact_in_place(j, 20)
            else:
                j.deleteEntriesTo(20)
                if compact == "background":
                    j._compaction.done.wait()
                    for e in more:
                        j.add(*e)
                    j._finish_compaction(wait=False)
                    assert j._compaction is None
                    if j._closer is not None:
                        j._closer.join()
            j.sync()
        except _Crash:
            crashed = True
        crashed = crashed or disk.frozen  # (the compaction's thread crashed: the process did)
        killed, after_cut = _kill_and_cut(tmp_path, d, k)
        for what, got in (("kill -9", killed), ("power cut", after_cut)):
            if not _kept(got, es + more, [e for e in es if e[1] > 20]):
                lost_somewhere.append((k, what, [e[1] for e in got]))
        assert not os.path.exists(str(d / "raft.journal") + COMPACT_SUFFIX) or crashed
        if not crashed:
            assert disk.ops == k
            break
        k += 1
    assert k > 5  # every step was tried
    if compact != "in place":
        assert lost_somewhere == []
    else:
        assert lost_somewhere, "the in-place rewrite was expected to lose entries at some step"


class TornDisk(ShadowDisk):
    """Its next sync reaches the shadow with only the first ``keep`` writes of its window (a
    sync interrupted by the power cut), then the power is off."""

    def __init__(self, root, keep: int) -> None:
        super().__init__(root)
        self.keep = keep
        self.armed = False

    def sync(self, fd):
        st = self._fds.get(fd)
        if self.armed and st is not None and st.pending is not None and not self.frozen:
            st.pending = st.pending[:self.keep]
            super().sync(fd)
            self.freeze()
            return
        super().sync(fd)


@pytest.mark.parametrize("size", [30, 31])
def test_a_sync_torn_at_every_write_leaves_a_journal_that_holds_together(tmp_path, size):
    """A window that truncates a tail (a follower meeting a new leader) and appends the new
    leader's entries, cut after each of its writes (in order): the journal read back is the old
    one or the new one up to some entry, never old entries mixed with new ones, with records of
    the same size (31) or not (30)."""
    base = tmp_path / "base"
    base.mkdir()
    old = [(cmd(i, 30), i, 1) for i in range(1, 11)]
    j = open_journal(base)
    for e in old:
        j.add(*e)
    j.sync()
    j._disk.freeze()
    new = [(cmd(100 + i, size), i, 2) for i in (8, 9, 10, 11)]
    allowed = [old] + [old[:7] + new[:m] for m in range(len(new) + 1)]
    keep = 0
    while True:
        d = tmp_path / f"w{keep}"
        _copy(base, d)
        disk = TornDisk(str(d), keep)
        j = _DurableJournal(str(d / "raft.journal"), disk)
        disk.armed = True
        j.deleteEntriesFrom(7)
        for e in new:
            j.add(*e)
        j.sync()
        assert disk.frozen
        power_cut(str(d))
        got = entries(_DurableJournal(str(d / "raft.journal"), ShadowDisk(str(d))))
        assert got in allowed, (keep, [(e[1], e[2]) for e in got])
        if got == old[:7] + new:
            break
        keep += 1


def test_a_process_forked_before_the_cut_makes_nothing_durable_after_it(tmp_path):
    """pysyncobj's dump writer is a fork, with its own copy of the node's disk. A power cut
    stops it too: its directory sync after the cut must not make durable the names the frozen
    node renamed since (here the meta, rewritten after the cut and never synced: before, the
    restart read it empty, took term and vote from the log, and lost acknowledged writes)."""
    disk = ShadowDisk(str(tmp_path))
    meta = str(tmp_path / "raft.journal.meta")
    disk.write_file(meta, b"term 1")
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the dump writer: waits, then syncs the directory, as durable_replace ends
        try:
            os.close(go_w)
            os.read(go_r, 1)
            disk.sync_dir(str(tmp_path))
        finally:
            os._exit(0)
    os.close(go_r)
    disk.freeze()
    disk.write_file(meta, b"term 2")  # the frozen node goes on: renamed, never synced
    os.write(go_w, b"x")
    os.close(go_w)
    assert os.waitpid(pid, 0)[1] == 0
    power_cut(str(tmp_path))
    with open(meta, "rb") as f:
        assert f.read() == b"term 1"
    assert not os.path.exists(os.path.join(tmp_path, ".powerloss", "frozen"))  # the power is back
    disk = ShadowDisk(str(tmp_path))
    disk.write_file(meta, b"term 3")
    disk.freeze()
    power_cut(str(tmp_path))
    with open(meta, "rb") as f:
        assert f.read() == b"term 3"


def test_a_dump_is_in_place_only_once_durable(tmp_path):
    """durable_replace (pysyncobj's atomicReplace): the dump synced, renamed, the directory
    synced; a cut before the directory's sync leaves the old dump whole."""
    for crash_at_dir_sync in (False, True):
        d = tmp_path / str(crash_at_dir_sync)
        d.mkdir()
        disk = ShadowDisk(str(d))
        dump = StoragePath(str(d / "raft.dump"), disk)
        for content in (b"old dump", b"new dump"):
            with open(dump + ".tmp", "wb") as f:  # as pysyncobj's serializer writes it
                f.write(content)
            if content == b"new dump" and crash_at_dir_sync:
                disk.sync_dir = lambda path, disk=disk: disk.freeze()
            durable_replace(dump + ".tmp", dump)
        disk.freeze()
        power_cut(str(d))
        with open(dump, "rb") as f:
            assert f.read() == (b"old dump" if crash_at_dir_sync else b"new dump")


# ---------------------------------------------------------------------------------------------
# Three RaftNodes
# ---------------------------------------------------------------------------------------------

class PowerCluster(Cluster):
    """Cluster whose nodes write through a ShadowDisk each (fsync as given)."""

    def __init__(self, tmp_path, fsync: bool = True, **kw):
        super().__init__(tmp_path, **kw)
        self.fsync = fsync
        self.disks: dict[str, ShadowDisk] = {}

    def start(self, addr: str) -> RaftNode:
        os.makedirs(self.dirs[addr], exist_ok=True)
        disk = self.disks[addr] = ShadowDisk(self.dirs[addr], fsync=self.fsync)
        state = FakeState()
        node = RaftNode(self_addr=addr, peers=self.addrs, data_dir=self.dirs[addr], secret=SECRET,
                        state=state, conf_overrides=self.conf_overrides, fsync=self.fsync, disk=disk)
        self._all.append(node)
        node.start(asyncio.get_running_loop())
        self.nodes[addr], self.states[addr] = node, state
        return node

    def power_cut_all(self) -> None:
        for a in list(self.nodes):
            self.disks[a].freeze()
        for a in list(self.nodes):
            sync = self.nodes[a]._sync
            self.stop(a)
            if sync is not None:  # a dump writer it forked dies with the power, as the soak's killpg does
                _syncobj._stop_dump_writer(sync._SyncObj__serializer)
        for a in self.addrs:
            power_cut(self.dirs[a])


async def _count_then_cut(tmp_path, fsync: bool, n: int) -> tuple[int, int]:
    """n increments, each acknowledged, then a power cut of every node and a restart: returns
    (acknowledged, counted after the restart)."""
    c = PowerCluster(tmp_path, fsync=fsync, conf_overrides=COMPACT)
    try:
        c.start_all()
        leader = await c.agreed_leader()
        acked = 0
        for _ in range(n):
            await c.nodes[leader].propose(incr("r"))
            acked += 1
        c.power_cut_all()
        c.start_all()
        leader = await c.agreed_leader(20)
        await c.nodes[leader].barrier(timeout_s=5)
        counted = c.nodes[leader].read(FakeState.read).get("r", 0)
        return acked, counted
    finally:
        c.close()


def test_acknowledged_writes_survive_a_power_cut_of_the_whole_cluster(tmp_path):
    """60 increments (three compactions at COMPACT's 20 entries: dumps, journal rewrites), each
    acknowledged, then every node loses power: all 60 are there after the restart."""
    acked, counted = asyncio.run(_count_then_cut(tmp_path, True, 60))
    assert counted == acked == 60


def test_with_fsync_off_a_power_cut_loses_acknowledged_writes(tmp_path):
    """The same with fsync off (raftsched node --no-fsync; pysyncobj as shipped never syncs):
    the cluster comes back without them."""
    acked, counted = asyncio.run(_count_then_cut(tmp_path, False, 30))
    assert acked == 30 and counted < acked


async def _watch_acks(tmp_path, gate: bool) -> list[str]:
    """Three nodes under concurrent writes; every message checked as it leaves: a follower's
    answer never names an entry above its synced index, and a leader's commit index is never
    above its own synced index. Returns the violations seen."""
    bad: list[str] = []
    c = Cluster(tmp_path)
    real = _durable.durable_transport

    def checking(factory):
        made = real(factory) if gate else factory

        def make(sync_obj, self_node, other_nodes):
            transport = made(sync_obj, self_node, other_nodes)
            journal = sync_obj._SyncObj__raftLog
            inner = sync_obj._sync_gate._send if gate else transport.send

            def send_checked(node, message):
                kind = message.get("type") if type(message) is dict else None
                synced = journal.synced_index or 0
                if kind == "next_node_idx" and message.get("success") \
                        and message["next_node_idx"] - 1 > synced:
                    bad.append(f"{self_node}: acknowledged {message['next_node_idx'] - 1}, synced {synced}")
                if kind == "append_entries" and message.get("commit_index", 0) > synced:
                    bad.append(f"{self_node}: commit index {message['commit_index']}, synced {synced}")
                return inner(node, message)
            if gate:
                sync_obj._sync_gate._send = send_checked  # what the gate lets go
            else:
                transport.send = send_checked
            return transport
        return make

    import raftsched.replication.node as node_module
    node_module.durable_transport = checking
    try:
        c.start_all()
        leader = await c.agreed_leader()
        nodes = list(c.nodes.values())
        follower = next(n for a, n in c.nodes.items() if a != leader)
        first = follower.status()["commit_index"]
        futs = []
        for k in range(300):
            # one command a turn of the loop: one log entry each (RaftNode groups a turn's)
            futs.append(asyncio.ensure_future(nodes[k % 3].propose(incr(f"k{k % 7}"))))
            await asyncio.sleep(0)  # ok-sleep: one loop turn, so each proposal is an entry of its own
        await asyncio.gather(*futs)
        await wait_until(lambda: len({n.status()["commit_index"] for n in nodes}) == 1, 10, "commit")
        if gate:
            g = follower._sync._SyncObj__transport.send.__self__
            entries = follower.status()["commit_index"] - first
            # group commit: one sync covers several entries, and answers did wait for them
            assert entries >= 100 and g.syncs < entries / 2 and g.held > 0, (g.syncs, entries, g.held)
    finally:
        node_module.durable_transport = real
        c.close()
    return bad


def test_nothing_answers_for_an_unsynced_entry_and_one_sync_covers_many(tmp_path):
    assert asyncio.run(_watch_acks(tmp_path, gate=True)) == []


def test_without_the_gate_nodes_answer_for_unsynced_entries(tmp_path):
    """The check above has teeth: pysyncobj's own order (no gate) answers first."""
    assert asyncio.run(_watch_acks(tmp_path, gate=False))


class _GateJournal:
    """What the gate sees of a journal: dirty or not, and a sync that may fail."""

    def __init__(self, fail: bool = False) -> None:
        self.dirty, self.fail, self.log = True, fail, []

    def sync(self) -> None:
        if self.fail:
            raise OSError(5, "Input/output error")
        self.log.append("sync")
        self.dirty = False


def _stops_instead_of_exiting(monkeypatch) -> type[BaseException]:
    """The exception a failed journal write raises here in place of the node's exit (its code
    the argument)."""
    class Stopped(BaseException):
        pass

    def _exit(code):
        raise Stopped(code)
    monkeypatch.setattr(_storage, "_exit_process", _exit)
    monkeypatch.setattr(_storage.logging, "shutdown", lambda: None)
    return Stopped


def test_an_answer_leaves_only_after_its_sync_and_a_failed_sync_stops_the_node(monkeypatch):
    j = _GateJournal()
    gate = _durable._SyncGate(j, lambda node, m: j.log.append(m["type"]))
    answer = {"type": "next_node_idx", "next_node_idx": 8, "success": True}
    gate.send("n2", answer)
    gate.send("n2", {"type": "apply_command", "command": b"x"})  # speaks for nothing: at once
    assert j.log == ["apply_command"] and gate.held == 1
    gate.flush()
    assert j.log == ["apply_command", "sync", "next_node_idx"] and gate.syncs == 1

    Stopped = _stops_instead_of_exiting(monkeypatch)
    j = _GateJournal(fail=True)
    gate = _durable._SyncGate(j, lambda node, m: j.log.append(m["type"]))
    gate.send("n2", answer)
    with pytest.raises(Stopped) as stopped:
        gate.flush()
    assert stopped.value.args == (_durable.EXIT_SYNC_FAILED,) and j.log == []  # nothing answered


def test_a_slow_sync_is_logged_and_the_longest_kept(monkeypatch, caplog):
    """A sync that held the tick thread long enough to cost a leader its heartbeats is said in
    the log (replication.slow_sync) and kept as the gate's longest (/v1/cluster durability)."""
    clock = iter([0.0, 0.05, 1.0, 1.3])  # two syncs: 50 ms, then 300 ms
    monkeypatch.setattr(_durable.time, "perf_counter", lambda: next(clock))
    j = _GateJournal()
    gate = _durable._SyncGate(j, lambda node, m: j.log.append(m["type"]))
    with caplog.at_level("WARNING", logger="raftsched.replication"):
        j.dirty = True
        gate.flush()
        assert not [r for r in caplog.records if "slow_sync" in r.getMessage()]
        j.dirty = True
        gate.flush()
    slow = [r.getMessage() for r in caplog.records if "slow_sync" in r.getMessage()]
    assert len(slow) == 1 and "ms=300" in slow[0]
    assert gate.syncs == 2 and abs(gate.sync_max_s - 0.3) < 1e-9 and abs(gate.sync_s - 0.35) < 1e-9


class _FailingOnceDisk(ShadowDisk):
    """A disk whose next sync or write fails once with EIO, as Linux reports a writeback error
    once: a retried fdatasync then succeeds though the pages it could not write were dropped."""

    fail: str | None = None

    def sync(self, fd):
        if self.fail == "sync":
            self.fail = None
            raise OSError(5, "Input/output error")
        return super().sync(fd)

    def pwrite(self, fd, data, offset):
        if self.fail == "write":
            self.fail = None
            raise OSError(28, "No space left on device")
        return super().pwrite(fd, data, offset)

    def write_file(self, path, data):
        if self.fail == "meta":
            self.fail = None
            raise OSError(5, "Input/output error")
        return super().write_file(path, data)


@pytest.mark.parametrize("fail, step", [
    ("sync", "term"),     # a higher term arrives while the journal holds unsynced entries
    ("meta", "term"),     # the term and vote cannot be written
    ("write", "add"),     # an entry cannot be appended (held in memory only)
])
def test_every_failed_write_or_sync_of_the_journal_stops_the_node(tmp_path, monkeypatch, fail, step):
    """Not only the gate's sync: a failed sync inside setCurrentTerm raised out of the message
    handler, the gate's sync after it then succeeded, and the held answers went out."""
    Stopped = _stops_instead_of_exiting(monkeypatch)
    disk = _FailingOnceDisk(str(tmp_path))
    j = _DurableJournal(str(tmp_path / "raft.journal"), disk)
    sent = []
    gate = _durable._SyncGate(j, lambda node, m: sent.append(m) or True)
    j.add(b"\x00entry-1", 1, 1)
    gate.send("leader", {"type": "next_node_idx", "next_node_idx": 2, "success": True})
    disk.fail = fail
    with pytest.raises(Stopped) as stopped:
        if step == "term":
            j.setCurrentTerm(2, None)
        else:
            j.add(b"\x00entry-2", 2, 1)
            gate.flush()
    assert stopped.value.args == (_storage.EXIT_SYNC_FAILED,)
    assert sent == []  # the answer never left


def test_a_forked_child_does_not_keep_a_shadow_lock_another_thread_holds(tmp_path) -> None:
    """pysyncobj's dump writer is a fork: a child that kept its copy of a lock file another thread
    had locked would hold the lock for its whole life (a flock belongs to the open file, not to
    the process). With three nodes in one process that deadlocked a power-cut test: the child
    waited for a lock a thread held, the threads for the locks the child had copied."""
    import fcntl
    import threading

    from raftsched.replication.powerloss import _Shadow

    sh = _Shadow(str(tmp_path))
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with sh.locked():
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork hooks have run): say so, then wait, holding what it kept
        os.close(w)
        os.write(ready_w, b"r")
        os.read(r, 1)
        os._exit(0)
    try:
        os.close(r)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"r"
        os.close(ready_r)
        release.set()
        t.join(10)
        fd = os.open(os.path.join(sh.dir, "lock"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if the child kept it
        finally:
            os.close(fd)
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


@pytest.mark.parametrize("name, damage", [("raft.dump", "empty"), ("raft.dump", "truncated"), ("raft.dump", "garbage"),
                                          ("raft.journal.meta", "empty")])
def test_a_node_whose_dump_or_vote_cannot_be_loaded_stops_instead_of_serving(tmp_path, monkeypatch, name, damage):
    """pysyncobj's loader logs a dump it cannot read and goes on: the node kept an empty state
    that its journal (trimmed to the dump) could never rebuild, while it voted, acknowledged
    entries and could lead (then nothing committed). It stops with its own status instead;
    the other members go on. So does a node whose term and vote (the journal's meta) cannot be
    read: it could vote twice in one term (exit 78)."""
    exits: list[int] = []
    monkeypatch.setattr(_storage, "_exit_process", exits.append)  # (the node thread goes on: recorded only)
    monkeypatch.setattr(_storage.logging, "shutdown", lambda: None)

    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            for _ in range(30):
                await c.nodes[leader].propose(incr("r"))
            await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump")) for d in c.dirs.values()),
                             10, "a dump on every node")
            victim = next(a for a in c.addrs if a != leader)
            c.stop(victim)
            path = os.path.join(c.dirs[victim], name)
            with open(path, "rb") as f:
                whole = f.read()
            with open(path, "wb") as f:
                f.write({"empty": b"", "truncated": whole[:len(whole) // 2], "garbage": os.urandom(len(whole))}[damage])
            c.start(victim)
            await wait_until(lambda: exits, 10, "the victim to stop")
            assert exits == [_storage.EXIT_DUMP_UNREADABLE if name == "raft.dump" else _storage.EXIT_META_UNREADABLE]
            c.stop(victim)  # (what the exit does)
            ldr = await c.agreed_leader(20)
            assert (await c.nodes[ldr].propose(incr("r")))["value"] == 31
        finally:
            c.close()
    asyncio.run(main())


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "a list"])
def test_a_journal_whose_term_and_vote_cannot_be_read_stops_the_node(tmp_path, monkeypatch, caplog, damage):
    """pysyncobj started a node whose meta it could not read with no term and no vote: it could
    vote again in a term it had voted in, and help elect a second leader of that term, whose
    entries replace acknowledged ones. With fsync on, the meta is replaced whole and synced, so
    an unreadable one is damage: the node stops (exit 78). With fsync off a power cut may leave
    it empty, as any write: the node starts as before, saying so."""
    import pickle

    exits: list[int] = []
    monkeypatch.setattr(_storage, "_exit_process", exits.append)
    monkeypatch.setattr(_storage.logging, "shutdown", lambda: None)
    j = open_journal(tmp_path)
    j.add(cmd(1), 1, 3)
    j.setCurrentTerm(3, "127.0.0.1:1")
    j._destroy()
    meta = tmp_path / "raft.journal.meta"
    whole = meta.read_bytes()
    meta.write_bytes({"empty": b"", "truncated": whole[:len(whole) // 2], "garbage": os.urandom(len(whole)),
                      "a list": pickle.dumps([3, "127.0.0.1:1"])}[damage])
    _DurableJournal(str(tmp_path / "raft.journal"), ShadowDisk(str(tmp_path)))._destroy()
    assert exits == [_storage.EXIT_META_UNREADABLE]
    assert "stopping the node" in caplog.text
    exits.clear()
    j = _DurableJournal(str(tmp_path / "raft.journal"), ShadowDisk(str(tmp_path), fsync=False))
    assert exits == [] and j.getCurrentTerm() == 0 and entries(j) == [(cmd(1), 1, 3)]
    j._destroy()


def test_a_node_whose_applied_entries_the_leaders_log_replaces_stops(tmp_path, monkeypatch):
    """A member restored from an older copy of its data directory forgets entries it
    acknowledged; a leader elected without them writes others in their place. The node that
    applied the lost ones then holds a state the cluster's log does not: it stops (exit 77)
    instead of answering and executing from it."""
    exits: list[int] = []
    monkeypatch.setattr(_storage, "_exit_process", exits.append)  # (the node thread goes on: recorded only)
    monkeypatch.setattr(_storage.logging, "shutdown", lambda: None)

    async def main():
        c = Cluster(tmp_path)
        try:
            c.start_all()
            # a leads throughout the first term, so the writes c forgets are of that term, and
            # the leader b and c elect writes in a later one (a copy restored also takes back
            # its term and vote: writes of the same term would not even look different).
            a = await c.agreed_leader()
            b, cc = (x for x in c.addrs if x != a)
            for _ in range(5):
                await c.nodes[a].propose(incr("r"))
            await wait_until(lambda: all(c.nodes[x].read(FakeState.read).get("r") == 5 for x in c.addrs), 10, "5")
            c.stop(cc)
            shutil.copytree(c.dirs[cc], str(tmp_path / "copy"))
            c.start(cc)
            c.stop(b)
            for _ in range(5):
                await propose_retrying(c.nodes[a], incr("r"))
            await wait_until(lambda: c.nodes[a].read(FakeState.read).get("r") == 10, 10, "a applied 10")
            c.stop(cc)
            shutil.rmtree(c.dirs[cc])
            shutil.copytree(str(tmp_path / "copy"), c.dirs[cc])
            c.stop(a)
            c.start(b)
            c.start(cc)
            ldr = await c.agreed_leader(20)
            assert ldr in (b, cc)
            assert (await propose_retrying(c.nodes[ldr], incr("r")))["value"] == 6, "the lost writes are lost"
            assert exits == []
            c.start(a)
            await wait_until(lambda: exits, 20, "a to stop")
            assert exits[0] == _storage.EXIT_DIVERGED
        finally:
            c.close()
    asyncio.run(main())


def test_a_failed_directory_sync_after_a_compaction_stops_the_node(tmp_path, monkeypatch):
    """The rename of a compacted journal is durable only once its directory is synced: until
    then a power cut may bring back the old name, and with it lose entries written since to the
    new file. A failed directory sync stops the node as a failed fdatasync does, rather than
    answering for entries on a name that may not survive."""
    from raftsched.replication._disk import Disk
    from raftsched.replication._storage import create_journal
    install()
    path = str(tmp_path / "raft.journal")
    j = create_journal(path)
    for i in range(1, 11):
        j.add(os.urandom(100), i, 1)
    Stopped = _stops_instead_of_exiting(monkeypatch)

    def fails(self, p):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(Disk, "sync_dir", fails)
    j.deleteEntriesTo(8)
    j._compaction.done.wait()
    with pytest.raises(Stopped) as stopped:
        j.onOneSecondTimer()
    assert stopped.value.args == (_durable.EXIT_SYNC_FAILED,)


class _HeldCopyDisk(CrashingDisk):
    """A CrashingDisk whose copy_range, called by the compaction's thread, waits until ``go``:
    the tick thread appends and syncs meanwhile, in an order that is the same on every run."""

    def __init__(self, root, at: int | None) -> None:
        super().__init__(root, at)
        self.entered, self.go = threading.Event(), threading.Event()

    def copy_range(self, *a, **kw):
        if threading.current_thread() is not threading.main_thread():
            self.entered.set()
            self.go.wait(10)
        return CrashingDisk.copy_range(self, *a, **kw)


def test_entries_appended_and_synced_during_the_compactions_copy_survive_a_crash_at_every_step(tmp_path):
    """The compaction's thread copies while the tick thread appends two entries to the old file
    and syncs them (the gate's sync: they are acknowledged), then the copy goes on and the tick
    thread finishes it. Crashed at each disk operation of both threads, then restarted as the
    process left the files (kill -9) and after a power cut: every entry after the dump survives,
    and so does each appended entry once its sync returned."""
    base = tmp_path / "base"
    base.mkdir()
    es = _journal_with(base, 30, 25)
    more = [(cmd(i, 30 + 7 * i), i, 4) for i in (31, 32)]
    lost = []
    k = 0
    while True:
        d, disk, j = _crashing_at(tmp_path, base, k, _HeldCopyDisk)
        crashed = acked = False
        try:
            j.deleteEntriesTo(20)
            c = j._compaction
            while not (disk.entered.is_set() or c.done.is_set()):
                c.done.wait(0.001)
            for e in more:
                j.add(*e)
            j.sync()
            acked = not disk.frozen
            disk.go.set()
            c.done.wait()
            j._finish_compaction(wait=False)
            if j._closer is not None:
                j._closer.join()
            j.sync()
        except _Crash:
            crashed = True
        finally:
            disk.go.set()
            if j._compaction is not None:
                j._compaction.done.wait()
        crashed = crashed or disk.frozen
        killed, after_cut = _kill_and_cut(tmp_path, d, k)
        for what, got in (("kill -9", killed), ("power cut", after_cut)):
            if not _kept(got, es + more, [e for e in es + (more if acked else []) if e[1] > 20]):
                lost.append((k, what, acked, [e[1] for e in got]))
        if not crashed:
            assert acked and killed[-2:] == after_cut[-2:] == more
            break
        k += 1
    assert k > 8  # every step of both threads was tried
    assert lost == []
