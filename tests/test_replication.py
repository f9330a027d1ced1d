"""Tests of raftsched.replication: the pysyncobj adapter and LocalLog.

The cluster tests run three real RaftNodes (pysyncobj, one tick thread each) in this process on
free loopback ports, with a fake state (counters in a dict, msgpack snapshots). They wait on
conditions with deadlines, never on fixed sleeps, and stop every node they start.
"""
from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time

import msgpack
import pytest

from raftsched.core import limits
from raftsched.core.errors import Indeterminate, LimitExceeded, RaftschedError, Unavailable
from raftsched.replication import (
    BARRIER_NOOP, LocalLog, RaftNode, _settle_group, _StateConsumer, make_conf,
)
from pysyncobj.config import FAIL_REASON

SECRET = "test-cluster-secret"
#: Small compaction threshold so a few dozen commands force a full dump (and its restore path).
COMPACT = {"logCompactionMinEntries": 20}


# -- fakes and helpers ---------------------------------------------------------------------------

class FakeState:
    """The SchedulerState interface over a dict of counters."""

    def __init__(self):
        self.lock = threading.RLock()
        self.counters: dict[str, int] = {}
        self.restores = 0

    def apply_bytes(self, data: bytes) -> dict:
        with self.lock:
            try:
                cmd = msgpack.unpackb(data, raw=False)
            except Exception as e:  # apply_bytes never raises...
                return {"ok": False, "error": {"code": "invalid_command", "message": str(e),
                                               "field": None}}
            if cmd.get("op") == "raise":  # ...except this one, to test the adapter's guard
                raise RuntimeError("apply bug")
            if cmd.get("op") == "incr":
                key = cmd["key"]
                self.counters[key] = self.counters.get(key, 0) + 1
                return {"ok": True, "value": self.counters[key]}
            return {"ok": True}

    def snapshot(self) -> bytes:
        with self.lock:
            return msgpack.packb({"counters": self.counters}, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        with self.lock:
            self.counters = dict(msgpack.unpackb(data, raw=False)["counters"])
            self.restores += 1

    def read(self) -> dict:
        with self.lock:
            return dict(self.counters)


def incr(key: str = "k") -> bytes:
    return msgpack.packb({"op": "incr", "key": key})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_until(cond, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)  # ok-sleep: the poll interval of a deadline-bounded wait


async def propose_retrying(node, data: bytes, timeout_s: float = 10.0) -> dict:
    """Propose, retrying only definite failures (Unavailable: the command did not happen), for
    steps where a fail-over may be under way. An Indeterminate is not retried: a retried
    increment could count twice, and the tests count."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await node.propose(data, timeout_s=2.0)
        except Unavailable:
            if time.monotonic() > deadline:
                raise


class Cluster:
    """Three RaftNodes on loopback; every node started here is stopped in close()."""

    def __init__(self, tmp_path, addrs=None, conf_overrides=None, dial_maps=None):
        self.addrs = addrs or [f"127.0.0.1:{free_port()}" for _ in range(3)]
        self.dirs = {a: str(tmp_path / f"node{i}") for i, a in enumerate(self.addrs)}
        self.conf_overrides = conf_overrides
        self.dial_maps = dial_maps or {}
        self.nodes: dict[str, RaftNode] = {}
        self.states: dict[str, FakeState] = {}
        self.roles: dict[str, list[bool]] = {}
        self._all: list[RaftNode] = []

    def start(self, addr: str) -> RaftNode:
        loop = asyncio.get_running_loop()
        state = FakeState()
        events = self.roles.setdefault(addr, [])
        node = RaftNode(self_addr=addr, peers=self.addrs, data_dir=self.dirs[addr], secret=SECRET,
                        state=state, on_role_change=events.append,
                        dial_map=self.dial_maps.get(addr), conf_overrides=self.conf_overrides)
        self._all.append(node)
        node.start(loop)
        self.nodes[addr], self.states[addr] = node, state
        return node

    def start_all(self):
        for a in self.addrs:
            self.start(a)

    def stop(self, addr: str):
        self.nodes.pop(addr).stop()

    def close(self):
        for node in self._all:
            node.stop()

    async def agreed_leader(self, timeout_s: float = 10.0) -> str:
        """Wait until exactly one running node leads and every running node names it."""
        def agreed():
            leaders = [a for a, n in self.nodes.items() if n.is_leader()]
            if len(leaders) != 1:
                return None
            named = {n.status()["leader"] for n in self.nodes.values()}
            return leaders[0] if named == {leaders[0]} else None
        return await wait_until(agreed, timeout_s, "one agreed leader")

    async def converged(self, expected: dict, timeout_s: float = 10.0):
        """Barrier on every node, then compare its state. A barrier is a no-op, so retrying one
        after any failure is safe (a restarted node may still force one election: no pre-vote)."""
        deadline = time.monotonic() + timeout_s
        for addr, node in self.nodes.items():
            while True:
                try:
                    await node.barrier(timeout_s=2.0)
                    break
                except RaftschedError:
                    if time.monotonic() > deadline:
                        raise
            got = self.states[addr].read()
            assert got == expected, (addr, got, expected, node.status())


async def incr_until_every_node_dumped(c: Cluster, leader: str, n: int) -> None:
    """``n`` increments of "r" (more than COMPACT's threshold), converged on every node, then
    wait until every node has written a full dump."""
    for _ in range(n):
        await c.nodes[leader].propose(incr("r"))
    await c.converged({"r": n})
    await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump"))
                                 for d in c.dirs.values()), 10, "dump files")


async def restart_all_and_count_on(c: Cluster, r: int) -> None:
    """Stop every running node and start each again on its data dir with a fresh state: every
    node comes back to {"r": r} through its dump, and the cluster counts on from there."""
    for a in list(c.nodes):
        c.stop(a)
    c.start_all()
    leader = await c.agreed_leader()
    await c.converged({"r": r})
    assert all(s.restores >= 1 for s in c.states.values())  # the dump path ran
    assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == r + 1


def run(coro_fn, *args):
    return asyncio.run(coro_fn(*args))


# -- configuration ---------------------------------------------------------------------------------

def test_make_conf_refuses_an_unknown_key_and_names_it():
    with pytest.raises(ValueError, match="raftMinTimeoutt"):
        make_conf(raftMinTimeoutt=0.5)


def test_make_conf_accepts_known_keys():
    conf = make_conf(raftMinTimeout=0.5, raftMaxTimeout=1.0, appendEntriesUseBatch=False,
                     leaderFallbackTimeout=1.0)
    assert (conf.raftMinTimeout, conf.raftMaxTimeout) == (0.5, 1.0)
    assert conf.appendEntriesUseBatch is False and conf.leaderFallbackTimeout == 1.0


def test_make_conf_refuses_broken_timing_relations():
    with pytest.raises(ValueError, match="raftMinTimeout"):
        make_conf(raftMinTimeout=0.2, appendEntriesPeriod=0.1)
    with pytest.raises(ValueError, match="connectionTimeout"):
        make_conf(raftMinTimeout=0.5, raftMaxTimeout=3.0, connectionTimeout=1.0)


def _node(tmp_path, **kw):
    args = dict(self_addr="127.0.0.1:7001", peers=["127.0.0.1:7001"], data_dir=str(tmp_path),
                secret=SECRET, state=FakeState())
    args.update(kw)
    return RaftNode(**args)


def test_raft_node_refuses_an_empty_secret(tmp_path):
    with pytest.raises(ValueError, match="secret"):
        _node(tmp_path, secret="")
    with pytest.raises(ValueError, match="secret"):
        _node(tmp_path, secret=None)


def test_raft_node_refuses_reserved_unknown_or_unsafe_overrides(tmp_path):
    with pytest.raises(ValueError, match="password"):
        _node(tmp_path, conf_overrides={"password": None})
    with pytest.raises(ValueError, match="dynamicMembershipChange"):
        _node(tmp_path, conf_overrides={"dynamicMembershipChange": True})
    with pytest.raises(ValueError, match="leaderFallbackTimout"):
        _node(tmp_path, conf_overrides={"leaderFallbackTimout": 1.0})


# -- the adapter's guards, without a network ---------------------------------------------------

def test_apply_never_raises_and_the_barrier_never_reaches_the_state():
    state = FakeState()
    consumer = _StateConsumer(state)
    # _doApply=True is how pysyncobj runs a committed entry.
    assert consumer._apply(incr("a"), _doApply=True) == {"ok": True, "value": 1}
    failed = consumer._apply(msgpack.packb({"op": "raise"}), _doApply=True)
    assert failed["ok"] is False and failed["error"]["code"] == "internal"
    assert consumer._apply(BARRIER_NOOP, _doApply=True) == {"ok": True}
    assert state.read() == {"a": 1}


def test_a_group_applies_each_command_in_order_with_its_own_result():
    """Group commit: one log entry holding several commands applies each as if it had its own
    entry; a command that raises or does not decode is refused alone."""
    state = FakeState()
    consumer = _StateConsumer(state)
    group = (incr("a"), msgpack.packb({"op": "raise"}), BARRIER_NOOP, b"\xc1garbage", incr("a"))
    res = consumer._apply(group, _doApply=True)
    assert len(res) == 5
    assert res[0] == {"ok": True, "value": 1} and res[4] == {"ok": True, "value": 2}
    assert res[1]["ok"] is False and res[1]["error"]["code"] == "internal"
    assert res[2] == {"ok": True}
    assert res[3]["ok"] is False and res[3]["error"]["code"] == "invalid_command"
    assert state.read() == {"a": 2}


def test_a_groups_outcome_reaches_each_of_its_proposals():
    async def main():
        loop = asyncio.get_running_loop()
        ok = [loop.create_future() for _ in range(3)]
        _settle_group(tuple(ok), ([{"v": 1}, {"v": 2}, {"v": 3}], FAIL_REASON.SUCCESS))
        assert [f.result() for f in ok] == [({"v": k}, FAIL_REASON.SUCCESS) for k in (1, 2, 3)]
        failed = [loop.create_future() for _ in range(2)]
        failed[1].cancel()  # a caller that gave up
        _settle_group(tuple(failed), (None, FAIL_REASON.LEADER_CHANGED))
        assert failed[0].result() == (None, FAIL_REASON.LEADER_CHANGED) and failed[1].cancelled()
        odd = [loop.create_future() for _ in range(2)]
        _settle_group(tuple(odd), ([{"v": 1}], FAIL_REASON.SUCCESS))
        assert all(f.result()[0] is None and f.result()[1] != FAIL_REASON.SUCCESS for f in odd)
    run(main)




def _free_elsewhere(lock) -> bool:
    """Whether another thread can take ``lock`` now (an RLock is always free to its holder)."""
    got = []

    def take():
        if lock.acquire(blocking=False):
            lock.release()
            got.append(True)
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return bool(got)


def test_snapshot_roundtrip_through_the_consumer():
    import pickle
    state = FakeState()
    state.apply_bytes(incr("x"))
    consumer = _StateConsumer(state)
    dumped = pickle.dumps(consumer._serialize(), 2)  # what the dump writer does
    assert not _free_elsewhere(consumer._lock), "held across the dump, until the tick ends"
    consumer._release_snapshot_lock()
    assert _free_elsewhere(consumer._lock)  # released
    other = FakeState()
    frozen = gc.get_freeze_count()
    try:
        _StateConsumer(other)._deserialize(pickle.loads(dumped))
        # The restored state is frozen out of the collector's walks, and the collector is on again.
        assert gc.get_freeze_count() > frozen and gc.isenabled()
    finally:
        gc.unfreeze()
    assert other.read() == {"x": 1} and other.restores == 1


# -- LocalLog --------------------------------------------------------------------------------------

def test_local_log_applies_synchronously_and_reports_leader():
    async def main():
        state = FakeState()
        roles = []
        log = LocalLog(state, on_role_change=roles.append)
        log.start(asyncio.get_running_loop())
        assert await log.propose(incr("a")) == {"ok": True, "value": 1}
        assert await log.propose(incr("a")) == {"ok": True, "value": 2}
        await log.barrier()
        st = log.status()
        assert st["role"] == "leader" and st["is_leader"] and log.is_leader()
        assert (st["term"], st["commit_index"], st["leader"]) == (1, 2, "local")
        await asyncio.sleep(0)  # ok-sleep: one loop turn runs the call_soon'd role change
        assert roles == [True]

        log.fail_next(Indeterminate("injected"))
        with pytest.raises(Indeterminate):
            await log.propose(incr("a"))
        log.set_leader(False)
        with pytest.raises(Unavailable):
            await log.propose(incr("a"))
        log.set_leader(True)
        with pytest.raises(LimitExceeded):
            await log.propose(b"x" * (limits.command_bytes_max + 1))
        assert state.read() == {"a": 2} and log.status()["commit_index"] == 2
        log.stop()
        with pytest.raises(Unavailable):
            await log.propose(incr("a"))
        await asyncio.sleep(0)  # ok-sleep: one loop turn runs the call_soon'd role changes
        assert roles == [True, False, True, False]
    run(main)


# -- three real nodes ------------------------------------------------------------------------------

@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_three_nodes_elect_replicate_and_fail_over(tmp_path):
    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            follower = next(a for a in c.addrs if a != leader)

            # A proposal on a follower is forwarded and returns the result applied locally.
            assert await c.nodes[follower].propose(incr("a")) == {"ok": True, "value": 1}
            assert c.states[follower].read() == {"a": 1}

            # An apply that raises is refused as a value; the node is not wedged.
            failed = await c.nodes[leader].propose(msgpack.packb({"op": "raise"}))
            assert failed["ok"] is False and failed["error"]["code"] == "internal"

            for i in range(29):
                node = c.nodes[c.addrs[i % 3]]
                assert (await node.propose(incr("a")))["ok"]
            await c.converged({"a": 30})

            st = c.nodes[leader].status()
            assert st["role"] == "leader" and st["is_leader"] and st["members"] == sorted(c.addrs)
            assert st["term"] >= 1 and st["term"] == c.nodes[follower].status()["term"]
            assert st["commit_index"] >= 31 and st["last_applied"] >= 31
            assert c.nodes[follower].status()["role"] == "follower"
            await wait_until(lambda: c.roles[leader] and c.roles[leader][-1] is True, 5,
                             "on_role_change(True) on the leader")
            # The keepalive flows on every node.
            await wait_until(lambda: all(n.counters["keepalive_received"] > 0
                                         for n in c.nodes.values()), 5, "keepalives")

            # More than logCompactionMinEntries entries: every node writes a full dump (forked
            # child), and the tick thread gives the state's lock back afterwards.
            await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump"))
                                         for d in c.dirs.values()), 10, "dump files")
            for n in c.nodes.values():
                assert n._lock.acquire(timeout=2), "the state's lock still held after a dump"
                n._lock.release()

            # Stop the leader: the others elect a new one and keep committing.
            c.stop(leader)
            await wait_until(lambda: c.roles[leader][-1] is False, 5, "role change on stop")
            new_leader = await c.agreed_leader()
            assert new_leader != leader
            survivor = next(a for a in c.nodes)
            assert (await propose_retrying(c.nodes[survivor], incr("a")))["value"] == 31
            # Enough entries that the survivors compact past the old leader's log: it must
            # come back through a snapshot install (or its own dump) plus the journal.
            for _ in range(25):
                await propose_retrying(c.nodes[new_leader], incr("b"))
            c.start(leader)
            await c.agreed_leader()
            await c.converged({"a": 31, "b": 25})
            assert c.states[leader].restores >= 1
        finally:
            c.close()
    run(main)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_concurrent_proposals_share_log_entries_and_each_gets_its_own_result(tmp_path):
    """Group commit: proposals made in one turn of the event loop go into one log entry; each
    still gets the result of its own command, on the leader and through a follower."""
    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            follower = next(a for a in c.addrs if a != leader)
            before = {a: dict(n.counters) for a, n in c.nodes.items()}
            results = await asyncio.gather(
                *(c.nodes[leader].propose(incr("g")) for _ in range(40)),
                *(c.nodes[follower].propose(incr("g")) for _ in range(20)),
                c.nodes[leader].barrier(), c.nodes[follower].barrier())
            values = [r["value"] for r in results[:60]]
            assert sorted(values) == list(range(1, 61)), "every command applied once, in some order"
            assert values[:40] == sorted(values[:40]) and values[40:] == sorted(values[40:]), \
                "one node's proposals apply in the order they were made"
            for a in (leader, follower):
                n = c.nodes[a].counters
                commands = n["commands_proposed"] - before[a]["commands_proposed"]
                entries = n["log_entries_proposed"] - before[a]["log_entries_proposed"]
                assert commands in (41, 21) and entries < commands, (a, commands, entries)
            await c.converged({"g": 60})
            # Groups go through compaction, dumps and restarts like single commands.
            for _ in range(3):
                await asyncio.gather(*(c.nodes[leader].propose(incr("h")) for _ in range(10)))
            c.stop(follower)
            c.start(follower)
            await c.agreed_leader()
            await c.converged({"g": 60, "h": 30})
        finally:
            c.close()
    run(main)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_whole_cluster_restart_keeps_the_state(tmp_path):
    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            await incr_until_every_node_dumped(c, leader, 30)
            for _ in range(5):  # some entries after the dump, in the journal only
                await c.nodes[leader].propose(incr("r"))
            await c.converged({"r": 35})

            await restart_all_and_count_on(c, 35)
        finally:
            c.close()
    run(main)


def test_raft_messages_are_sealed_with_aes_gcm_and_refused_when_altered():
    from cryptography.exceptions import InvalidTag

    from raftsched.replication import _AeadEncryptor
    a, b = _AeadEncryptor(SECRET), _AeadEncryptor(SECRET)  # two processes, one secret
    data = b"a pickled message" * 10
    t1, t2 = a.encrypt_at_time(data, 7), a.encrypt_at_time(data, 8)
    assert data not in t1 and t1 != t2  # secret, and a fresh nonce each time
    assert b.extract_timestamp(t1) == 7 and b.extract_timestamp(t2) == 8
    assert b.decrypt(t1) == data and b.decrypt(t2) == data and a.decrypt(t1) == data
    assert b.decrypt(b.encrypt_at_time(b"", 0)) == b""
    # Any altered byte (version, salt, timestamp, nonce, ciphertext, tag) is refused.
    for i in range(len(t1)):
        bad = bytearray(t1)
        bad[i] ^= 0x01
        with pytest.raises((InvalidTag, ValueError)):
            _AeadEncryptor(SECRET).decrypt(bytes(bad))
    with pytest.raises(InvalidTag):
        _AeadEncryptor("another secret").decrypt(t1)
    for junk in (b"", b"\x01" * 20, t1[:-1] + b"", b"\x80" + t1[1:]):
        with pytest.raises((InvalidTag, ValueError)):
            b.decrypt(junk)
    # Nonces come from a counter under a per-process key: distinct processes, distinct keys.
    assert t1[1:17] == t2[1:17] != b.encrypt_at_time(data, 7)[1:17]
    assert int.from_bytes(t2[25:37], "big") == int.from_bytes(t1[25:37], "big") + 1


def test_raft_messages_are_not_compressed_and_old_compressed_ones_still_read():
    import zlib

    import pysyncobj.tcp_connection

    from raftsched.replication import _Uncompressed
    assert pysyncobj.tcp_connection.zlib is _Uncompressed
    data = b"\x80\x04a pickle"
    assert _Uncompressed.compress(data, 3) == b"\x00" + data
    assert _Uncompressed.decompress(_Uncompressed.compress(data, 3)) == data
    assert _Uncompressed.decompress(zlib.compress(data, 3)) == data


@pytest.fixture
def lone_follower():
    """One _SyncObj whose message handler the test calls directly (no network, no tick), and
    its two peers as pysyncobj nodes."""
    from raftsched.replication import _SyncObj
    me, a, b = (f"127.0.0.1:{free_port()}" for _ in range(3))
    sync = _SyncObj(me, [a, b], conf=make_conf(autoTick=False, password=SECRET),
                    consumers=[_StateConsumer(FakeState())])
    try:
        peers = sorted(sync._SyncObj__otherNodes, key=lambda n: [a, b].index(n.address))
        yield sync, peers[0], peers[1]
    finally:
        sync.destroy()


def _append(sync, leader, term, prev, prev_term, entries, commit):
    sync._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": term, "commit_index": commit,
        "entries": [(f"c{i}-{t}".encode(), i, t) for i, t in entries],
        "prevLogIdx": prev, "prevLogTerm": prev_term})


def test_a_follower_never_truncates_entries_it_already_holds(lone_follower):
    """Raft's receiver rules, fed to one follower's pysyncobj message handler: a late
    append_entries repeating a prefix of the log deletes nothing and does not commit past what
    it vouches for; a conflict still truncates from the conflict."""
    sync, leader, _ = lone_follower

    def append(term, prev, prev_term, entries, commit):
        _append(sync, leader, term, prev, prev_term, entries, commit)

    def log():
        j = sync._SyncObj__raftLog
        return [(j[k][1], j[k][2]) for k in range(len(j))]

    assert log() == [(1, 0)]  # pysyncobj's initial no-op
    append(1, 1, 0, [(2, 1), (3, 1), (4, 1), (5, 1)], commit=1)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    # A late resend of 2..3 with the leader's newer commit index: 4 and 5 stay, and the
    # commit index stops at 3, the last entry this message vouches for.
    append(1, 1, 0, [(2, 1), (3, 1)], commit=5)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert sync._SyncObj__raftCommitIndex == 3
    # A resend of everything it holds: nothing changes, the commit index follows.
    append(1, 1, 0, [(2, 1), (3, 1), (4, 1), (5, 1)], commit=5)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert sync._SyncObj__raftCommitIndex == 5
    # A held prefix then new entries: appended after the held ones.
    append(1, 3, 1, [(4, 1), (5, 1), (6, 1)], commit=5)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
    # A new leader whose entry 6 differs (term 2): the log is cut at the conflict.
    append(2, 4, 1, [(5, 1), (6, 2)], commit=5)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]
    assert sync._SyncObj__raftLog[5][0] == b"c6-2"
    append(2, 5, 1, [(6, 2), (7, 2)], commit=5)
    append(3, 5, 1, [(6, 3)], commit=5)  # a conflict right after prev: 7 goes with 6
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 3)]
    # A previous entry it does not hold: refused, nothing changes.
    append(3, 9, 2, [(10, 2)], commit=5)
    assert log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 3)]


def test_loading_a_dump_restarts_a_followers_election_timeout(lone_follower, monkeypatch):
    """A restore blocks the tick thread for seconds at 1M jobs; a follower that installed the
    leader's snapshot must not find its deadline long past and depose that leader."""
    from pysyncobj.monotonic import monotonic

    from raftsched.replication import _SyncObj
    sync, _, _ = lone_follower
    monkeypatch.setattr(_SyncObj, "_load_dump", lambda self, clear: None)
    conf = make_conf(autoTick=False, password=SECRET)
    sync._SyncObj__raftElectionDeadline = monotonic() - 5  # as after a long restore
    sync._SyncObj__loadDumpFile(True)
    assert sync._SyncObj__raftElectionDeadline - monotonic() >= conf.raftMinTimeout - 0.05
    sync._SyncObj__raftState = 2  # a leader's deadline is not its concern
    sync._SyncObj__raftElectionDeadline = 0.0
    sync._SyncObj__loadDumpFile(False)
    assert sync._SyncObj__raftElectionDeadline == 0.0


def test_a_split_vote_is_broken_by_node_id():
    """Two candidates of one term with equally recent logs each refuse the other (each voted for
    itself). The one with the lower id stands again within 0.1 s; the other waits at least a
    minimum timeout, so the next term's request reaches it first."""
    from pysyncobj.monotonic import monotonic

    from raftsched.replication import _SyncObj
    lo, me, hi = sorted(f"127.0.0.1:{free_port()}" for _ in range(3))
    conf = make_conf(autoTick=False, password=SECRET)
    sync = _SyncObj(me, [lo, hi], conf=conf, consumers=[_StateConsumer(FakeState())])
    try:
        peer = {n.address: n for n in sync._SyncObj__otherNodes}

        def split_with(addr):
            sync._SyncObj__raftState = 1  # a candidate of term 5 that voted for itself
            sync._SyncObj__raftCurrentTerm = 5
            sync._SyncObj__votedForNodeId = sync._SyncObj__selfNode.id
            sync._SyncObj__raftElectionDeadline = monotonic() + 0.3
            sync._SyncObj__onMessageReceived(peer[addr], {
                "type": "request_vote", "term": 5, "last_log_index": 1, "last_log_term": 0})
            assert sync._SyncObj__votedForNodeId == sync._SyncObj__selfNode.id  # refused
            return sync._SyncObj__raftElectionDeadline - monotonic()

        assert split_with(hi) <= 0.1                          # lower id than the other: stand
        assert split_with(lo) >= conf.raftMinTimeout - 0.05   # higher: let the other stand
        # The same request seen by a follower is an ordinary vote: granted.
        sync._SyncObj__raftState = 0
        sync._SyncObj__raftCurrentTerm = 5
        sync._SyncObj__votedForNodeId = None
        sync._SyncObj__onMessageReceived(peer[lo], {
            "type": "request_vote", "term": 5, "last_log_index": 1, "last_log_term": 0})
        assert sync._SyncObj__votedForNodeId == peer[lo].id
    finally:
        sync.destroy()


def test_a_follower_asked_by_a_staler_candidate_stands_for_election_soon(lone_follower):
    from pysyncobj.monotonic import monotonic
    sync, leader, candidate = lone_follower
    _append(sync, leader, 1, 1, 0, [(2, 1), (3, 1), (4, 1)], commit=4)

    def vote(term, last_idx, last_term):
        sync._SyncObj__onMessageReceived(candidate, {
            "type": "request_vote", "term": term, "last_log_index": last_idx,
            "last_log_term": last_term})
        return sync._SyncObj__raftElectionDeadline - monotonic()

    conf = make_conf(autoTick=False, password=SECRET)
    # Up to date (same last entry): the vote is granted and the timeout starts over.
    assert vote(2, 4, 1) >= conf.raftMinTimeout - 0.05
    assert sync._SyncObj__votedForNodeId == candidate.id
    # Behind (shorter log, or an older last term): refused, and this node stands within 0.1 s.
    assert vote(3, 3, 1) <= 0.1
    assert sync._SyncObj__votedForNodeId is None
    sync._SyncObj__raftElectionDeadline = monotonic() + 5
    assert vote(4, 9, 0) <= 0.1
    # A candidate from an older term changes nothing.
    sync._SyncObj__raftElectionDeadline = monotonic() + 5
    assert vote(1, 1, 0) > 4


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_restart_between_a_dump_and_its_trim_keeps_the_entries_after_the_dump(tmp_path,
                                                                                 monkeypatch):
    """Every node stops after writing a dump but before trimming its journal (the trim runs on
    the tick after the forked writer finishes). pysyncobj's loader would clear each journal down
    to the dump and lose the five entries committed after it, on every node."""
    from raftsched.replication import _SyncObj

    async def main():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        try:
            with monkeypatch.context() as m:
                m.setattr(_SyncObj, "_SyncObj__deleteEntriesTo", lambda self, idx: None,
                          raising=False)
                c.start_all()
                leader = await c.agreed_leader()
                await incr_until_every_node_dumped(c, leader, 30)
                # No further dumps: what follows is in the untrimmed journals only.
                m.setattr(_SyncObj, "_SyncObj__tryLogCompaction", lambda self: None,
                          raising=False)
                for _ in range(5):
                    await c.nodes[leader].propose(incr("r"))
                await c.converged({"r": 35})
                for a in list(c.nodes):  # stopped while trimming is still off
                    c.stop(a)
            # Started again with pysyncobj's own trim back in place.
            await restart_all_and_count_on(c, 35)
        finally:
            c.close()
    run(main)


def test_dumps_are_gzip_level_1_and_level_9_dumps_still_read(tmp_path):
    """pysyncobj wrote dumps at gzip level 9 (seconds at 1M jobs for a slightly larger file);
    _FastGzip writes level 1, and reads what level 9 wrote."""
    import gzip
    import io
    import pickle

    from pysyncobj import serializer
    from raftsched.replication import _FastGzip

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
    from pysyncobj.journal import FIRST_RECORD_OFFSET, createJournal
    from raftsched.replication import _cut_journal_file, _JournalFile

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


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_minority_cannot_commit_and_says_so_within_the_deadline(tmp_path):
    async def main():
        c = Cluster(tmp_path)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            await c.nodes[leader].propose(incr("m"))
            # Keep the old leader: it believes it leads for leaderFallbackTimeout, then steps
            # down. Either way nothing commits and propose must not hang.
            for a in [a for a in c.addrs if a != leader]:
                c.stop(a)
            for node in (c.nodes[leader],):
                for _ in range(2):  # once as a zombie leader, once after it stepped down
                    started = time.monotonic()
                    with pytest.raises((Unavailable, Indeterminate)):
                        await node.propose(incr("m"), timeout_s=1.0)
                    assert time.monotonic() - started < 2.0
            await wait_until(lambda: not c.nodes[leader].is_leader(), 5, "leader fallback")
            await wait_until(lambda: c.roles[leader][-1] is False, 5, "on_role_change(False)")
            started = time.monotonic()
            with pytest.raises(Unavailable) as info:
                await c.nodes[leader].propose(incr("m"), timeout_s=0.5)
            assert time.monotonic() - started < 1.5
            assert "leader" in info.value.message
        finally:
            c.close()
    run(main)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_follower_cut_off_from_the_leader_fails_definitely(tmp_path):
    async def main():
        c = Cluster(tmp_path)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            lone = next(a for a in c.addrs if a != leader)
            for a in [a for a in c.addrs if a != lone]:
                c.stop(a)
            # Once the follower has seen the links drop, it still names the dead leader but does
            # not forward (the command would be lost) and reports Unavailable. (Before it has
            # noticed, a forwarded command ends Indeterminate, which is also honest.)
            await wait_until(lambda: c.nodes[lone].status()["peers_connected"] == [], 5,
                             "the follower sees its links down")
            assert c.nodes[lone].status()["leader"] == leader
            started = time.monotonic()
            with pytest.raises(Unavailable):
                await c.nodes[lone].propose(incr("m"), timeout_s=1.0)
            assert time.monotonic() - started < 2.0
        finally:
            c.close()
    run(main)


async def _forwarder(target_port: int, stats: dict):
    """A loopback TCP forwarder (what a partition proxy will be): counts connections."""
    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        stats["connections"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:  # the test's loop is shutting down
            pass

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_dial_map_routes_links_through_proxies_and_keeps_peer_ids(tmp_path):
    async def main():
        addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        servers, stats, dial_maps = [], {}, {a: {} for a in addrs}
        try:
            # pysyncobj's rule: of two nodes, the one with the larger address dials.
            for a in addrs:
                for b in addrs:
                    if a > b:
                        stats[(a, b)] = {"connections": 0}
                        server = await _forwarder(int(b.rsplit(":", 1)[1]), stats[(a, b)])
                        servers.append(server)
                        port = server.sockets[0].getsockname()[1]
                        dial_maps[a][b] = f"127.0.0.1:{port}"
            c = Cluster(tmp_path, addrs=addrs, dial_maps=dial_maps)
            try:
                c.start_all()
                leader = await c.agreed_leader()
                follower = next(a for a in addrs if a != leader)
                assert (await c.nodes[follower].propose(incr("p")))["ok"]
                await c.converged({"p": 1})
                assert all(s["connections"] >= 1 for s in stats.values()), stats
                await wait_until(lambda: all(
                    n.status()["peers_connected"] == sorted(set(addrs) - {a})
                    for a, n in c.nodes.items()), 5, "all links up through the proxies")
            finally:
                c.close()
        finally:
            for s in servers:
                s.close()
    run(main)


def test_raft_port_binds_only_on_the_given_host(tmp_path):
    async def main():
        port = free_port()
        node = RaftNode(self_addr=f"127.0.0.1:{port}", peers=[f"127.0.0.1:{port}"],
                        data_dir=str(tmp_path), secret=SECRET, state=FakeState())
        try:
            node.start(asyncio.get_running_loop())
            await wait_until(node.is_leader, 10, "single-node leader")
            assert (await node.propose(incr("s")))["value"] == 1
            # Bound on 127.0.0.1 only: the same port is free on another loopback address.
            with socket.socket() as s:
                s.bind(("127.0.0.2", port))
            # The data dir is locked against a second node.
            other = RaftNode(self_addr=f"127.0.0.1:{free_port()}", peers=[], data_dir=str(tmp_path),
                             secret=SECRET, state=FakeState())
            with pytest.raises(RuntimeError, match="in use"):
                other._lock_data_dir(wait_s=0.1)
        finally:
            node.stop()
    run(main)


def test_read_runs_a_query_under_the_lock_applies_take(tmp_path):
    """RaftNode.read(fn, *args) is fn(state, *args) while the apply lock is held; LocalLog.read
    the same over its own lock."""
    state = FakeState()
    state.apply_bytes(incr("x"))
    node = RaftNode(self_addr="127.0.0.1:1", peers=[], data_dir=str(tmp_path), secret=SECRET, state=state)
    seen = []

    def query(s, key):
        seen.append(_free_elsewhere(node._lock))
        return s.counters.get(key)
    assert node.read(query, "x") == 1 and seen == [False]
    assert _free_elsewhere(node._lock)
    log = LocalLog(state)
    assert log.read(lambda s, k: s.counters[k], "x") == 1
