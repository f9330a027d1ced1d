"""raftsched/replication/node.py and conf.py: RaftNode's configuration and guards, group commit's
results, and three real nodes electing, replicating, failing over, restarting and refusing what
a minority cannot commit."""
from __future__ import annotations

import asyncio
import os
import socket
import time

import msgpack
import pytest
from pysyncobj.config import FAIL_REASON

from raftsched.core import limits
from raftsched.core.errors import Indeterminate, LimitExceeded, Unavailable
from raftsched.replication import RaftNode, Replicator, make_conf
from raftsched.replication.node import _settle_group
from raftsched.testing.fakes import FakeRaft

from replication_helpers import (
    COMPACT, SECRET, Cluster, FakeState, free_elsewhere, free_port, incr,
    incr_until_every_node_dumped,
    propose_retrying, restart_all_and_count_on, run, started_and_counted, wait_until,
)


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


def test_raft_node_and_the_fake_both_offer_what_the_node_layer_uses(tmp_path):
    assert isinstance(_node(tmp_path), Replicator)
    assert isinstance(FakeRaft(FakeState()), Replicator)


def test_a_node_that_has_not_read_its_log_says_starting_not_a_role(tmp_path):
    # A member restarted with --join said "none" here (so /healthz member: false and reads "not
    # a member") until its tick thread had read its log; and a node without --join said "voter".
    for join in (False, True):
        st = _node(tmp_path / str(join), join=join, peers=["127.0.0.1:7002"]).status()
        assert st["membership"]["self"] == "starting", st["membership"]
        assert st["running"] is False


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


def test_a_command_over_the_size_limit_is_refused_before_anything_enters_the_log(tmp_path):
    """pysyncobj mis-handles messages above 64 KiB: propose refuses a larger command (and a
    command that is not bytes) at once, before it looks for a leader; so does the constructor
    for a barrier command."""
    node = _node(tmp_path)
    with pytest.raises(LimitExceeded):
        asyncio.run(node.propose(b"x" * (limits.command_bytes_max + 1)))
    with pytest.raises(TypeError):
        asyncio.run(node.propose("not bytes"))
    with pytest.raises(Unavailable):  # within the limit: refused only because it is not running
        asyncio.run(node.propose(b"x" * limits.command_bytes_max))
    with pytest.raises(LimitExceeded):
        _node(tmp_path, barrier_command=b"x" * (limits.command_bytes_max + 1))


def test_read_runs_the_function_on_the_state_under_the_replicas_lock(tmp_path):
    """read(fn, *args) is fn(state, *args) while no command applies and no snapshot is taken or
    restored (the consumer holds the same lock for those)."""
    state = FakeState()
    state.apply_bytes(incr("a"))
    node = _node(tmp_path, state=state)

    def look(s, key):
        assert s is state
        locks = (node._lock,)
        return s.counters.get(key), [free_elsewhere(lk) for lk in locks]

    value, free = node.read(look, "a")
    assert value == 1 and free == [False] * len(free)
    assert node.read(lambda s: dict(s.counters)) == {"a": 1}
    with pytest.raises(KeyError):
        node.read(lambda s: s.counters["missing"])
    assert free_elsewhere(node._lock), "released when fn raises"


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
            # child), and the tick thread gives the replica's lock back afterwards.
            await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump"))
                                         for d in c.dirs.values()), 10, "dump files")
            for a, _s in c.states.items():
                assert c.nodes[a]._lock.acquire(timeout=2), "the lock still held after a dump"
                c.nodes[a]._lock.release()

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
        # Election timeout 3-4 s: the follower must still name the dead leader when the test
        # looks (with the default 0.5-1 s, a loaded machine sometimes looked after the follower
        # had already started an election, and there was no leader left to name).
        c = Cluster(tmp_path, conf_overrides={"raftMinTimeout": 3.0, "raftMaxTimeout": 4.0,
                                              "connectionTimeout": 4.0})
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


def _locked_against_another(data_dir) -> RaftNode:
    """A second node on ``data_dir`` cannot take its lock; returns that node (not started)."""
    other = RaftNode(self_addr=f"127.0.0.1:{free_port()}", peers=[], data_dir=str(data_dir),
                     secret=SECRET, state=FakeState())
    with pytest.raises(RuntimeError, match="in use"):
        other._lock_data_dir(wait_s=0.1)
    return other


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
            _locked_against_another(tmp_path)
        finally:
            node.stop()
    run(main)


def test_a_stop_whose_tick_thread_outlives_it_keeps_the_data_dir_locked(tmp_path, caplog):
    """A tick thread still alive after stop's wait may still write the journal (a compaction's
    last steps, the final sync): the lock stays, so no node started in this process opens the
    journal under it; it goes with the process (or an unlock once the thread has ended)."""
    async def main():
        port = free_port()
        node = RaftNode(self_addr=f"127.0.0.1:{port}", peers=[f"127.0.0.1:{port}"],
                        data_dir=str(tmp_path), secret=SECRET, state=FakeState())
        node.start(asyncio.get_running_loop())
        try:
            await wait_until(node.is_leader, 10, "single-node leader")
            sync = node._sync
            sync.tick_thread_alive = lambda: True  # as a thread stuck in a write would be
            with caplog.at_level("ERROR", logger="raftsched.replication"):
                node.stop(timeout_s=0.05)
            assert "replication.stop_timeout" in caplog.text
            other = _locked_against_another(tmp_path)
        finally:
            node.stop()
            node._unlock_data_dir()  # (the real thread has ended: destroy() stopped it)
        other._lock_data_dir(wait_s=2)
        other._unlock_data_dir()
    run(main)


def test_an_armed_call_reaches_the_loop_after_the_next_entry_on_every_node(tmp_path):
    """RaftNode.arm_applied: a reader on a follower waits for the state to move instead of
    polling it; the call comes on the loop, once, after the entry is applied there."""
    async def main():
        c = Cluster(tmp_path)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            follower = next(a for a in c.addrs if a != leader)
            woke = asyncio.Event()
            seen = []

            def on_applied():
                seen.append(c.states[follower].read())
                woke.set()
            c.nodes[follower].arm_applied(on_applied)
            assert (await c.nodes[leader].propose(incr("a")))["ok"]
            await asyncio.wait_for(woke.wait(), 10)
            assert seen == [{"a": 1}]
            await c.converged({"a": 1})
            assert (await c.nodes[leader].propose(incr("a")))["ok"]
            await c.converged({"a": 2})
            assert seen == [{"a": 1}]  # once: a second entry calls nothing until armed again
        finally:
            c.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_dump_before_stop_lets_each_node_restart_from_its_own_dump(tmp_path):
    """A graceful stop writes a dump of what the node applied and trims its journal to it
    (pysyncobj writes one only after 5 000 entries or 5 minutes): the nodes of a cluster stopped
    together each restart from their own dump, which is what makes an upgrade of all of them
    exact (docs/operations.md, Upgrading)."""
    async def main():
        c = Cluster(tmp_path)
        try:
            leader = await started_and_counted(c, 30)
            dumps = {a: os.path.join(d, "raft.dump") for a, d in c.dirs.items()}
            journals = {a: os.path.getsize(os.path.join(d, "raft.journal")) for a, d in c.dirs.items()}
            assert not any(os.path.exists(p) for p in dumps.values())
            for a, node in c.nodes.items():
                assert await asyncio.to_thread(node.dump_before_stop, 10.0), a
                assert os.path.exists(dumps[a]), a
                assert os.path.getsize(os.path.join(c.dirs[a], "raft.journal")) < journals[a], a
            written = {a: os.stat(p).st_mtime_ns for a, p in dumps.items()}
            # Nothing applied since: the dump stands, none is written again.
            assert await asyncio.to_thread(c.nodes[leader].dump_before_stop, 10.0)
            assert os.stat(dumps[leader]).st_mtime_ns == written[leader]
            stopped = c.nodes[leader]
            await restart_all_and_count_on(c, 30)
            assert stopped.dump_before_stop(1.0) is False  # a stopped node writes nothing
        finally:
            c.close()
    run(main)


def test_a_node_restarted_after_a_crash_replays_what_it_had_committed_as_a_replay(tmp_path):
    """What a node applies again at its start of the entries the process before had committed
    (so applied, and counted in its metrics) is a replay to its state (SchedulerState.replaying:
    not counted again); what comes after is not. Stopped without a dump (a crash), each node
    replays its whole log up to the commit index it wrote (once a second)."""
    async def main():
        c = Cluster(tmp_path)
        try:
            leader = await started_and_counted(c, 30)
            assert all(s.replays == [] for s in c.states.values())  # a fresh start replays nothing
            commit = c.nodes[leader].status()["commit_index"]

            def written(d):
                with open(os.path.join(d, "raft.journal.commit"), "rb") as f:
                    data = f.read(8)
                return len(data) == 8 and int.from_bytes(data, "little") >= commit
            await wait_until(lambda: all(written(d) for d in c.dirs.values()), 10, "commit indexes written")
            for a in list(c.nodes):
                c.stop(a)
            c.start_all()
            leader = await c.agreed_leader()
            await c.converged({"r": 30})
            assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == 31
            await c.converged({"r": 31})
            for a, st in c.states.items():
                assert st.replays == [True, False], (a, st.replays)
                assert st.replayed == 30, (a, st.replayed)  # the new increment counted as any
        finally:
            c.close()
    asyncio.run(asyncio.wait_for(main(), 60))
