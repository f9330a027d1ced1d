"""A graceful stop's dump (RaftNode.dump_before_stop, _SyncObj.dump_now): it is not waited for
when its writer failed, and a writer forked before a leader's snapshot arrived never lands its
older dump over the snapshot. In-process nodes (replication_helpers); conditions with deadlines."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from raftsched.replication import _consumer
from raftsched.replication._syncobj import _SyncObj

import replication_helpers
from replication_helpers import COMPACT, Cluster, FakeState, incr, run, wait_until


async def _five_then_a_follower(c: Cluster) -> tuple[str, str]:
    """Start the three nodes, count r to 5 on all: (the leader, a follower)."""
    c.start_all()
    leader = await c.agreed_leader()
    for _ in range(5):
        await c.nodes[leader].propose(incr("r"))
    await c.converged({"r": 5})
    return leader, next(a for a in c.addrs if a != leader)


@pytest.mark.parametrize("compact, after", [(None, 0), (COMPACT, 40)], ids=["fails_once", "fails_every_tick"])
def test_a_failed_dump_writer_is_not_waited_for_until_the_timeout(tmp_path, compact, after):
    """The forked writer fails (here: raft.dump.tmp cannot be created; in production a full
    disk, an OOM-killed child): no dump will come; the stop goes on (before, it waited the whole
    60 s). ``fails_every_tick``: with a journal past the compaction bound (``after`` more
    entries), pysyncobj forks a new writer at every tick after one failed, so a writer almost
    always runs; the stop still ends at the first failure of one forked for it."""
    async def main():
        c = Cluster(tmp_path, conf_overrides=compact)
        try:
            leader, f = await _five_then_a_follower(c)
            os.mkdir(os.path.join(c.dirs[f], "raft.dump.tmp"))  # the writer's open() fails, every time
            for _ in range(after):
                await c.nodes[leader].propose(incr("r"))
            await c.converged({"r": 5 + after})
            t0 = time.monotonic()
            ok = await asyncio.to_thread(c.nodes[f].dump_before_stop, 60.0)
            took = time.monotonic() - t0
            assert not ok
            assert took < 30.0, f"waited {took:.1f} s (the timeout) for a dump whose writer failed"
        finally:
            c.close()
    run(main)


#: addresses whose Raft messages are dropped (both ways): an in-process partition
DROP: set[str] = set()
_orig_on_message = _SyncObj._SyncObj__onMessageReceived


def _dropping(self, node, message):
    if self.selfNode.address in DROP or getattr(node, "address", None) in DROP:
        return
    return _orig_on_message(self, node, message)


#: states whose forked dump writer sleeps before it encodes (a slow writer: a big state)
SLOW: set[int] = set()
_orig_reduce = _consumer._DeferredSnapshot.__reduce__


def _slow_reduce(self):
    if os.getpid() != self._pid and id(self._state) in SLOW:
        time.sleep(4.0)  # ok-sleep: in the forked writer, stands for encoding a big state
    return _orig_reduce(self)


async def _stop_dump_forked_then_snapshot_sent(c: Cluster, slow_restore_s: float = 0.0):
    """Follower f, cut off while the leader writes 60 increments and compacts past what f holds,
    forks its stop dump (a slow writer, of r=5), then is let back: the leader sends it its
    snapshot. :returns: (f, the stop's dump_before_stop as a task)."""
    leader, f = await _five_then_a_follower(c)
    DROP.add(f)
    for _ in range(60):  # the leader compacts past what f holds
        await c.nodes[leader].propose(incr("r"))
    await wait_until(lambda: os.path.exists(os.path.join(c.dirs[leader], "raft.dump")), 10)
    SLOW.add(id(c.states[f]))
    c.states[f].slow_restore_s = slow_restore_s
    dumping = asyncio.create_task(asyncio.to_thread(c.nodes[f].dump_before_stop, 30.0))
    serializer = c.nodes[f]._sync._SyncObj__serializer
    await wait_until(lambda: serializer._Serializer__pid > 0, 10, "f forks its writer (of r=5)")
    DROP.discard(f)
    return f, dumping


class _SlowRestoreState(FakeState):
    """A state whose restore takes ``slow_restore_s`` (a big one: ~6 s at 1M jobs)."""
    slow_restore_s = 0.0

    def restore(self, data: bytes) -> None:
        time.sleep(self.slow_restore_s)  # ok-sleep: stands for the work of a big restore
        super().restore(data)


@pytest.fixture
def cut_and_slow(monkeypatch):
    """DROP cuts a node off, SLOW makes a state's dump writer slow, and the Cluster's states
    restore as slowly as their ``slow_restore_s`` says."""
    monkeypatch.setattr(_SyncObj, "_SyncObj__onMessageReceived", _dropping)
    monkeypatch.setattr(_consumer._DeferredSnapshot, "__reduce__", _slow_reduce)
    monkeypatch.setattr(replication_helpers, "FakeState", _SlowRestoreState)
    yield
    DROP.clear()
    SLOW.clear()


def test_a_dump_forced_on_stop_does_not_land_over_a_newer_installed_snapshot(tmp_path, cut_and_slow):
    """A follower forks its stop dump (index A), then installs the leader's snapshot (index B > A)
    and appends after it; the writer then renames its older dump over the installed one.
    dump_before_stop reports success, and at restart the dump is A, the journal (which begins at
    B-1) is thrown away: every entry after A that this node had acknowledged is gone from it."""

    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            f, dumping = await _stop_dump_forked_then_snapshot_sent(c)
            await wait_until(lambda: c.nodes[f].read(FakeState.read).get("r") == 65, 15, "f installs")
            assert await dumping  # "dumped_on_stop": the snapshot is the dump
            applied = c.nodes[f].read(FakeState.read)
            for a in list(c.nodes):
                c.stop(a)
            c.start(f)  # alone: it has only its own disk
            await wait_until(lambda: c.nodes[f].read(FakeState.read) == applied, 10,
                             f"f restarted alone holding what it applied, {applied}")
        finally:
            c.close()
    run(main)


def test_a_stop_dump_replaced_by_a_slowly_restored_snapshot_counts_as_written(tmp_path, cut_and_slow):
    """The stop's writer is killed by the leader's snapshot, which then takes seconds to restore:
    the snapshot is the dump (before, the wait gave up 2 s after the kill and said none was
    written)."""

    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            f, dumping = await _stop_dump_forked_then_snapshot_sent(c, slow_restore_s=3.0)
            assert await dumping, "the installed snapshot is the dump, but the stop said none was written"
            await wait_until(lambda: c.nodes[f].read(FakeState.read).get("r") == 65, 15, "f catches up")
        finally:
            c.close()
    run(main)


def test_a_dump_holds_none_of_the_nodes_own_fields_and_a_restart_from_one_reads_none(tmp_path):
    """pysyncobj dumps every attribute a SyncObj gets after its constructor: raftsched's node-local
    fields (when the tick thread last ticked, why the role changed) went into raft.dump and, through
    snapshots, into other nodes, which logged a tick gap as long as the dump was old, with a
    negative CPU time. Only pysyncobj's code version is dumped now, and a dump that holds them
    (an older one) is read without them."""
    from raftsched.replication._syncobj import _without_local_fields
    async def main():
        c = Cluster(tmp_path)
        try:
            leader, f = await _five_then_a_follower(c)
            sync = c.nodes[f]._sync
            assert sync._tick_at is not None and "_tick_at" in sync.__dict__  # set on the instance
            dumped = {k for k in sync.__dict__ if k not in sync._SyncObj__properies}
            assert dumped <= {"_SyncObj__enabledCodeVersion"}, dumped
            assert await asyncio.to_thread(c.nodes[f].dump_before_stop, 60.0)
        finally:
            c.close()
    run(main)
    older = ([{"_tick_at": 5.0, "_cpu_at": (1.0, 2.0), "_role_cause": "x", "_SyncObj__enabledCodeVersion": 0},
              {"state": 1}], ("e", 2), ("e", 1), {"n"})
    assert _without_local_fields(older) == ([{"_SyncObj__enabledCodeVersion": 0}, {"state": 1}],
                                            ("e", 2), ("e", 1), {"n"})
    assert _without_local_fields((None, 1, 2, 3)) == (None, 1, 2, 3)
