"""raftsched/replication/_membership.py: online membership change.

The leader's rules as pure functions (one change at a time, the quorum check, learners promoted
only once they hold the log); one node's configuration through appends, truncations, a full dump
and restarts, fed to its message handler directly (the dump records the configuration at its own
index, not pysyncobj's view when it was written: its issue 133); and real RaftNodes on loopback
(a learner that does not count, concurrent changes, a leader that removes itself, a restart of
every node with command lines that no longer say who the members are).
"""
from __future__ import annotations

import asyncio
import gzip
import os
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core.errors import Conflict, InvalidSpec
from raftsched.replication import RaftNode, install, make_conf
from raftsched.replication._consumer import _StateConsumer
from raftsched.replication._membership import (
    Config, ConfigEntry, JoinMarker, MembershipLog, decide, decode_entry, encode_entry, majority, promotion,
)
from raftsched.replication._syncobj import _SyncObj

from replication_helpers import (
    COMPACT, SECRET, Cluster, FakeState, free_port, incr, propose_retrying, run, wait_until,
)

A, B, C, D, E = (f"10.0.0.{k}:9000" for k in range(1, 6))
ALL = frozenset({A, B, C, D, E})


def cfg(voters, learners=()) -> Config:
    return Config.of(voters, learners)


def pending_entry(config: Config, op: str, node: str, index: int = 9) -> ConfigEntry:
    return ConfigEntry(index, 2, config, {"op": op, "node": node})


# ------------------------------------------------------------------ the leader's rules

def test_add_makes_a_learner_and_asking_again_changes_nothing():
    d = decide("add", D, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=True, reachable=ALL)
    assert (d.kind, d.config) == ("append", cfg([A, B, C], [D]))
    assert d.change == {"op": "add_learner", "node": D}
    for latest in (cfg([A, B, C], [D]), cfg([A, B, C, D])):
        assert decide("add", D, me=A, latest=latest, pending=None, noop_committed=True,
                      reachable=ALL).kind == "done"
    assert decide("remove", E, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=True,
                  reachable=ALL).kind == "done"


def test_a_second_change_is_refused_while_one_is_not_committed():
    """pysyncobj's guard never engages (``__changeClusterIDx`` is never set): two changes could
    be uncommitted at once, and configurations two servers apart in use together."""
    latest = cfg([A, B, C], [D])
    pending = pending_entry(latest, "add_learner", D)
    for op, node in (("add", E), ("remove", B), ("remove", D)):
        d = decide(op, node, me=A, latest=latest, pending=pending, noop_committed=True, reachable=ALL)
        assert d.kind == "refused" and d.code == "conflict", (op, node, d)
        assert "in progress" in d.message and "index 9" in d.message
    # Asking for what the uncommitted change makes waits for it rather than being refused.
    assert decide("add", D, me=A, latest=latest, pending=pending, noop_committed=True,
                  reachable=ALL).kind == "wait"


def test_no_change_before_the_leaders_first_entry_commits():
    d = decide("add", D, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=False, reachable=ALL)
    assert d.kind == "retry" and "first entry" in d.message


def test_removing_a_voter_is_refused_when_the_voters_left_would_have_no_quorum_that_answers():
    latest = cfg([A, B, C])
    answering = frozenset({A, B})  # C is down
    d = decide("remove", B, me=A, latest=latest, pending=None, noop_committed=True, reachable=answering)
    assert d.kind == "refused" and d.code == "conflict"
    assert "leave 2 voters of which 1 answer" in d.message and "2 are needed" in d.message
    d = decide("remove", C, me=A, latest=latest, pending=None, noop_committed=True, reachable=answering)
    assert (d.kind, d.config) == ("append", cfg([A, B]))
    # Five voters, two down: removing a live one leaves four of which two answer.
    five = cfg([A, B, C, D, E])
    assert decide("remove", B, me=A, latest=five, pending=None, noop_committed=True,
                  reachable=frozenset({A, B, C})).kind == "refused"
    assert decide("remove", D, me=A, latest=five, pending=None, noop_committed=True,
                  reachable=frozenset({A, B, C})).kind == "append"
    # A learner never counts: removing one is always safe.
    assert decide("remove", D, me=A, latest=cfg([A, B, C], [D]), pending=None, noop_committed=True,
                  reachable=frozenset({A})).config == cfg([A, B, C])


def test_the_last_voter_stays_and_a_leader_removing_itself_hands_over_first():
    d = decide("remove", A, me=A, latest=cfg([A], [B]), pending=None, noop_committed=True, reachable=ALL)
    assert d.kind == "refused" and "only voter" in d.message
    assert decide("remove", A, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=True,
                  reachable=ALL).kind == "transfer"
    # A leader asked to remove itself while another voter is down: refused before any hand-over
    # (a walk saw the refused removal move the leadership all the same: a new term, its events).
    d = decide("remove", A, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=True,
               reachable=frozenset({A, B}))
    assert d.kind == "refused" and "leave 2 voters of which 1 answer" in d.message


def test_a_full_cluster_and_bad_requests_are_refused_naming_why():
    d = decide("add", E, me=A, latest=cfg([A, B, C], [D]), pending=None, noop_committed=True, reachable=ALL,
               members_max=4)
    assert d.kind == "refused" and "most it may have (4)" in d.message
    for op, node in (("promote", D), ("add", "no-port"), ("add", "h:0"), ("add", "h:70000"), ("add", ":1"),
                     ("add", "a b:1"), ("add", 7)):
        d = decide(op, node, me=A, latest=cfg([A, B, C]), pending=None, noop_committed=True, reachable=ALL)
        assert d.kind == "refused" and d.code == "invalid", (op, node)


def test_a_learner_is_promoted_only_once_it_holds_every_committed_entry_and_answers():
    latest = cfg([A, B, C], [D])

    def promote(match, age=0.1, pending=None, reachable=ALL, noop=True):
        return promotion(latest, pending=pending, noop_committed=noop, commit_index=100,
                         learners={D: (match, age)}, reachable=reachable, answered_within_s=1.0)
    assert promote(99) is None
    assert promote(100) == (D, cfg([A, B, C, D]))
    assert promote(100, age=5.0) is None                     # has not answered lately
    assert promote(100, pending=pending_entry(latest, "add_learner", D)) is None
    assert promote(100, noop=False) is None
    # Four voters need three that answer: with B and C down, D would make two.
    assert promote(100, reachable=frozenset({A})) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "commit", "promote", "crash"]),
                          st.sampled_from([A, B, C, D, E]), st.sets(st.sampled_from([A, B, C, D, E]))),
                max_size=40))
def test_every_configuration_appended_differs_from_the_one_before_by_one_server(steps):
    """A model of one leader's log under random requests, commits, promotions and answering
    sets: each configuration appended is one server away from the latest before it, and none is
    appended while another is uncommitted. Two configurations in use at once are therefore at
    most one server apart, and any majority of one meets any majority of the other (thesis 4.1)."""
    log = MembershipLog(cfg([A, B, C]))
    committed = 0
    index = 0
    for kind, node, answering in steps:
        reachable = frozenset(answering | {A})
        pending = log.last_entry if log.last_entry and log.last_entry.index > committed else None
        if kind == "commit":
            committed = index
            continue
        if kind == "crash":  # the uncommitted entry is lost with the leader
            if pending is not None:
                log.truncate_from(pending.index)
                index = pending.index - 1
            continue
        if kind == "promote":
            got = promotion(log.latest, pending=pending, noop_committed=True, commit_index=committed,
                            learners={node: (committed, 0.0)}, reachable=reachable, answered_within_s=1.0)
            new = None if got is None else got[1]
        else:
            d = decide(kind, node, me=A, latest=log.latest, pending=pending, noop_committed=True,
                       reachable=reachable)
            new = d.config if d.kind == "append" else None
        if new is None:
            continue
        assert pending is None
        old = log.latest
        assert len(set(old.voters) ^ set(new.voters)) + len(set(old.learners) ^ set(new.learners)) <= 2
        assert len(set(old.voters) ^ set(new.voters)) <= 1
        assert A in new.voters  # the leader never appends its own removal
        index += 1
        log.append(ConfigEntry(index, 1, new))


def test_the_log_of_configurations_follows_appends_truncations_and_compactions():
    log = MembershipLog(cfg([A, B, C]))
    log.append(ConfigEntry(5, 1, cfg([A, B, C], [D])))
    log.append(ConfigEntry(9, 1, cfg([A, B, C, D])))
    assert (log.at(4), log.at(5), log.at(8), log.latest) == (cfg([A, B, C]), cfg([A, B, C], [D]),
                                                             cfg([A, B, C], [D]), cfg([A, B, C, D]))
    assert log.truncate_from(9) and log.latest == cfg([A, B, C], [D])
    assert not log.truncate_from(9)
    log.append(ConfigEntry(7, 2, cfg([A, B, C])))
    log.compact_below(8)  # the entries before 8 fold into the base
    assert (log.base, log.entries) == (cfg([A, B, C]), [])


def test_a_configuration_entry_round_trips_and_a_broken_one_is_ignored():
    c = cfg([B, A], [D])
    assert decode_entry(encode_entry(c, {"op": "add_learner", "node": D})) == (c, {"op": "add_learner", "node": D})
    assert decode_entry(b"\x00regular") is None
    assert decode_entry(b"c{not json") is None
    assert decode_entry(b'c{"voters": []}') is None
    assert majority(4) == 3 and majority(5) == 3


# ------------------------------------------------------------------ one node's view, a dump, a restart

def _sync(me, peers, data_dir, join=False, marker=None):
    install()
    conf = make_conf(autoTick=False, password=SECRET, useFork=False,
                     journalFile=os.path.join(data_dir, "raft.journal"),
                     fullDumpFile=os.path.join(data_dir, "raft.dump"), bindAddress=me)
    sync = _SyncObj(me, peers, conf=conf, consumers=[_StateConsumer(FakeState())], join=join,
                    join_marker=marker)
    sync.addOnTickCallback(sync._member_tick)  # as RaftNode.start does
    return sync


#: An entry pysyncobj applies as a no-op (its NO_OP type).
NOOP = b"\x01"


def _append(sync, leader, term, prev, prev_term, entries, commit):
    sync._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": term, "commit_index": commit, "entries": entries,
        "prevLogIdx": prev, "prevLogTerm": prev_term})


def _node(sync, addr):
    return sync._SyncObj__transport._nodeAddrToNode[addr]


def _view(sync):
    v = sync.members_view()
    others = sorted(n.id for n in sync._SyncObj__otherNodes)
    linked = sorted(n.id for n in sync._SyncObj__transport._nodes)
    return (v["voters"], v["learners"], (v["pending"] or {}).get("voters")), others, linked


def _read_dump(data_dir):
    with gzip.open(os.path.join(data_dir, "raft.dump"), "rb") as f:
        return pickle.load(f)


def test_the_view_after_a_restart_is_the_logs_whatever_the_dump_was_written_with(tmp_path):
    """A follower F (started with peers A and B) takes in: X added as a learner and promoted
    (committed), then the removal of B (not committed). A full dump written now holds the
    configuration at its own last entry (X a voter, B a voter), where pysyncobj's own record of
    the cluster in it is its view when writing (B gone). Restarted with its stale command line,
    F uses the log's configuration: the dump's, then the uncommitted removal from its journal;
    when a new leader's log replaces that entry, B is back. Had the dump held the view when
    written (pysyncobj's, whose list then wins at load: its issue 133), B would be lost for good
    with that truncation, the entries that added X and kept B being compacted away."""
    f_, a, b, x = (f"127.0.0.1:{free_port()}" for _ in range(4))
    d = str(tmp_path)
    sync = _sync(f_, [a, b], d)
    v3, v5, v8 = cfg([a, b, f_], [x]), cfg([a, b, f_, x]), cfg([a, f_, x])
    try:
        leader = _node(sync, a)
        entries = [(NOOP, 2, 1), (encode_entry(v3, {"op": "add_learner", "node": x}), 3, 1), (NOOP, 4, 1),
                   (encode_entry(v5, {"op": "promote", "node": x}), 5, 1), (NOOP, 6, 1), (NOOP, 7, 1)]
        _append(sync, leader, 1, 1, 0, entries, commit=7)
        sync.doTick()  # applies 2..7
        assert _view(sync) == ((list(v5.voters), [], None), sorted([a, b, x]), sorted([a, b, x]))
        assert sync.members_view()["index"] == 5
        _append(sync, leader, 1, 7, 1, [(encode_entry(v8, {"op": "remove", "node": b}), 8, 1), (NOOP, 9, 1)],
                commit=7)
        assert _view(sync) == ((list(v5.voters), [], list(v8.voters)), sorted([a, x]), sorted([a, x]))
        sync.forceLogCompaction()
        sync.doTick()
        sync.doTick()  # the dump is written; the journal now begins at 6
        assert sync._SyncObj__raftLog[0][1] == 6
        dump = _read_dump(d)
    finally:
        sync.destroy()

    sync = _sync(f_, [a, b], d)  # the same stale command line
    try:
        sync.doTick()  # loads the dump, then the journal after it
        assert _view(sync) == ((list(v5.voters), [], list(v8.voters)), sorted([a, x]), sorted([a, x]))
        # The committed configuration's entry (5) is in the dump, not the journal: its index
        # was shown as 0, the one the cluster started with.
        assert sync.members_view()["index"] == 5
        # A new leader (X, term 2) whose log has another entry 8: the removal goes with it.
        _append(sync, _node(sync, x), 2, 7, 1, [(NOOP + b"other", 8, 2)], commit=8)
        assert _view(sync) == ((list(v5.voters), [], None), sorted([a, b, x]), sorted([a, b, x]))
    finally:
        sync.destroy()

    sync = _sync(f_, [a, b], d)
    try:
        sync.doTick()
        assert _view(sync) == ((list(v5.voters), [], None), sorted([a, b, x]), sorted([a, b, x]))
    finally:
        sync.destroy()
    assert dump[1][1] == 7  # the dump ends at the last applied entry,
    assert dump[0][1]["members"] == dict(v5.to_dict(), index=5)  # holds the configuration in force there,
    assert {n.id for n in dump[3]} == {a, f_, x}  # where pysyncobj's record is its view when writing


def test_a_node_that_joins_stands_for_nothing_until_its_log_makes_it_a_voter(tmp_path):
    """Started with --join, a node never stands for election (pysyncobj asks
    ``__connectedToAnyone`` before it does), connected or not, as a learner too; it stands once
    its log makes it a voter."""
    x, a, b, c = (f"127.0.0.1:{free_port()}" for _ in range(4))
    sync = _sync(x, [a, b, c], str(tmp_path), join=True)
    try:
        assert not sync.is_voter() and not sync._SyncObj__connectedToAnyone()
        sync._SyncObj__connectedNodes.add(_node(sync, a))  # even connected, it does not stand
        assert not sync._SyncObj__connectedToAnyone()
        assert sync.members_view()["self"] == "none"
        _append(sync, _node(sync, a), 1, 1, 0, [
            (encode_entry(cfg([a, b, c], [x]), {"op": "add_learner", "node": x}), 2, 1)], commit=2)
        assert sync.members_view()["self"] == "learner" and not sync._SyncObj__connectedToAnyone()
        _append(sync, _node(sync, a), 1, 2, 1, [
            (encode_entry(cfg([a, b, c, x]), {"op": "promote", "node": x}), 3, 1)], commit=2)
        assert sync.is_voter() and sync._SyncObj__connectedToAnyone()
        assert {n.id for n in sync._SyncObj__otherNodes} == {a, b, c}
    finally:
        sync.destroy()


def test_a_node_joining_at_a_former_members_address_is_no_voter_through_that_members_entries(tmp_path):
    """X's address was a voter once and was removed; a new X joins on an empty directory. The
    first leader message carries commit index 5: the configurations at or before it (X a voter,
    then X removed, then X a learner again) are of X's first life or its re-add, and X stands
    for nothing while its log ends among them; its promotion at 7 makes it a voter. Without the
    marker the old entries alone made it one (and a catching-up node that stands moves its term
    past the leader's and ignores it from then on)."""
    x, a, b = (f"127.0.0.1:{free_port()}" for _ in range(3))
    d = str(tmp_path)
    for with_marker in (True, False):
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        marker = JoinMarker.open(d, join=True, fresh=True) if with_marker else None
        sync = _sync(x, [a, b], d, join=True, marker=marker)
        try:
            leader = _node(sync, a)
            first = [(encode_entry(cfg([a, b], [x]), {"op": "add_learner", "node": x}), 2, 1),
                     (encode_entry(cfg([a, b, x]), {"op": "promote", "node": x}), 3, 1)]
            _append(sync, leader, 1, 1, 0, first, commit=5)  # a prefix of a longer log
            sync._SyncObj__connectedNodes.add(leader)
            if not with_marker:
                assert sync.is_voter()  # pysyncobj's rule alone: the first life's entry counts
                continue
            assert marker.after == 5 and JoinMarker.open(d, join=False, fresh=False).after == 5  # on disk
            assert not sync.is_voter() and not sync._SyncObj__connectedToAnyone()
            assert sync.members_view()["self"] == "learner"
            rest = [(encode_entry(cfg([a, b]), {"op": "remove", "node": x}), 4, 1),
                    (encode_entry(cfg([a, b], [x]), {"op": "add_learner", "node": x}), 5, 1), (NOOP, 6, 1)]
            _append(sync, leader, 1, 3, 1, rest, commit=6)
            assert not sync.is_voter()
            _append(sync, leader, 1, 6, 1, [(encode_entry(cfg([a, b, x]), {"op": "promote", "node": x}), 7, 1)],
                    commit=6)
            assert sync.is_voter() and sync._SyncObj__connectedToAnyone()
        finally:
            sync.destroy()


def test_a_vote_request_from_a_node_out_of_the_configuration_is_ignored(tmp_path):
    me, a, b, gone = (f"127.0.0.1:{free_port()}" for _ in range(4))
    sync = _sync(me, [a, b, gone], str(tmp_path))
    try:
        leader = _node(sync, a)
        _append(sync, leader, 1, 1, 0, [
            (encode_entry(cfg([me, a, b]), {"op": "remove", "node": gone}), 2, 1)], commit=2)
        assert gone not in {n.id for n in sync._SyncObj__transport._nodes}
        from pysyncobj.node import TCPNode
        sync._SyncObj__onMessageReceived(TCPNode(gone), {"type": "request_vote", "term": 9,
                                                         "last_log_index": 9, "last_log_term": 9})
        assert sync.raftCurrentTerm == 1  # a removed server cannot move the term on
        # Nor can a forwarded command carrying a configuration entry's type reach the log.
        sync._SyncObj__raftState = 2
        n = len(sync._SyncObj__raftLog)
        sync._SyncObj__onMessageReceived(leader, {"type": "apply_command", "request_id": 1,
                                                  "command": encode_entry(cfg([a]), {})})
        sync._checkCommandsToApply()
        assert len(sync._SyncObj__raftLog) == n
    finally:
        sync.destroy()


# ------------------------------------------------------------------ real nodes on loopback

class Joining:
    """A node started with ``join=True`` beside a replication_helpers.Cluster."""

    def __init__(self, c: Cluster, tmp_path, name: str = "x"):
        self.c, self.addr = c, f"127.0.0.1:{free_port()}"
        self.dir, self.state, self.node = str(tmp_path / name), FakeState(), None

    def start(self, peers=None):
        self.state = FakeState()
        self.node = RaftNode(self_addr=self.addr, peers=peers or self.c.addrs, data_dir=self.dir, secret=SECRET,
                             state=self.state, join=True, conf_overrides=self.c.conf_overrides)
        self.c._all.append(self.node)
        self.node.start(asyncio.get_running_loop())
        return self.node


def test_a_learner_counts_for_nothing_until_it_holds_the_log_then_votes(tmp_path):
    async def go():
        c = Cluster(tmp_path)
        c.start_all()
        x = Joining(c, tmp_path)
        try:
            leader = await c.agreed_leader()
            for _ in range(5):
                await c.nodes[leader].propose(incr("r"))
            follower = next(a for a in c.addrs if a != leader)
            # X is added before it runs: a learner, never promoted (it answers nothing), and
            # commits go on without it.
            res = await c.nodes[follower].change_members("add", x.addr)
            assert (res["state"], res["changed"], res["members"]["learners"]) == ("learner", True, [x.addr])
            again = await c.nodes[leader].change_members("add", x.addr)
            assert (again["state"], again["changed"]) == ("learner", False)
            other = next(a for a in c.addrs if a not in (leader, follower))
            c.stop(other)  # two voters of three remain: still a quorum; the learner is no voter
            assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == 6
            await asyncio.sleep(1.5)  # ok-sleep: a promotion would need the learner's answers
            st = c.nodes[leader].status()
            assert x.addr not in st["members"] and st["learners"] == [x.addr]
            # Started, it catches up and the leader makes it a voter.
            node = x.start()
            await wait_until(lambda: x.addr in c.nodes[leader].status()["members"], 15, "X promoted")
            await wait_until(lambda: node.read(FakeState.read) == {"r": 6}, 10, "X holds the state")
            assert node.status()["membership"]["self"] == "voter"
            # Now a voter of four with one down: it counts (three of four answer).
            assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == 7
        finally:
            c.close()
    run(go)


def test_two_changes_at_once_one_is_refused_while_the_other_is_uncommitted(tmp_path):
    async def go():
        c = Cluster(tmp_path)
        c.start_all()
        try:
            leader = await c.agreed_leader()
            await propose_retrying(c.nodes[leader], incr("r"))
            x, y = (f"127.0.0.1:{free_port()}" for _ in range(2))
            # Both reach the leader's tick thread together: the second finds the first in the
            # log, not committed.
            got = await asyncio.gather(c.nodes[leader].change_members("add", x),
                                       c.nodes[leader].change_members("add", y), return_exceptions=True)
            ok = [g for g in got if isinstance(g, dict)]
            refused = [g for g in got if isinstance(g, Conflict)]
            assert len(ok) == 1 and len(refused) == 1, got
            assert "in progress" in refused[0].message and refused[0].field == "addr"
            # Once it is committed, the other goes through.
            second = y if ok[0]["addr"] == x else x
            assert (await c.nodes[leader].change_members("add", second))["state"] == "learner"
            with pytest.raises(InvalidSpec):
                await c.nodes[leader].change_members("add", "not-an-address")
        finally:
            c.close()
    run(go)


def test_a_leader_that_removes_itself_steps_down_and_the_rest_carry_on(tmp_path):
    async def go():
        c = Cluster(tmp_path)
        c.start_all()
        try:
            leader = await c.agreed_leader()
            for _ in range(3):
                await c.nodes[leader].propose(incr("r"))
            res = await c.nodes[leader].change_members("remove", leader)
            assert (res["state"], res["changed"]) == ("removed", True)
            assert leader not in res["members"]["voters"] and len(res["members"]["voters"]) == 2
            rest = [a for a in c.addrs if a != leader]
            new = await wait_until(lambda: next((a for a in rest if c.nodes[a].is_leader()), None), 10, "new leader")
            assert (await propose_retrying(c.nodes[new], incr("r")))["value"] == 4
            # The removed node heard of its removal's commit, stands for nothing, and the others
            # ignore it.
            await wait_until(lambda: c.nodes[leader].status()["membership"]["self"] == "none", 5, "told")
            assert not c.nodes[leader].is_leader()
            term = c.nodes[new].status()["term"]
            await asyncio.sleep(2.5)  # ok-sleep: more than two election timeouts of the removed node
            assert c.nodes[new].is_leader() and c.nodes[new].status()["term"] == term
        finally:
            c.close()
    run(go)


def test_removing_a_live_voter_while_another_is_down_is_refused_and_removing_the_dead_one_works(tmp_path):
    async def go():
        c = Cluster(tmp_path)
        c.start_all()
        try:
            leader = await c.agreed_leader()
            await propose_retrying(c.nodes[leader], incr("r"))
            dead, live = [a for a in c.addrs if a != leader]
            c.stop(dead)
            await asyncio.sleep(1.5)  # ok-sleep: past leaderFallbackTimeout, the leader sees it silent
            with pytest.raises(Conflict) as e:
                await c.nodes[leader].change_members("remove", live)
            assert "1 answer the leader" in e.value.message
            assert c.nodes[leader].status()["members"] == sorted(c.addrs)  # nothing changed
            res = await c.nodes[leader].change_members("remove", dead)
            assert res["members"]["voters"] == sorted([leader, live])
            assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == 2
        finally:
            c.close()
    run(go)


def test_right_after_an_election_a_voter_that_never_answered_does_not_count_for_a_removal(tmp_path):
    """A new leader's pysyncobj stamps every node as having just answered, a dead one too: a
    removal of the live follower in the second after an election passed the quorum check, left
    {leader, dead} as the voters, and nothing committed again (through restarts too)."""
    async def go():
        c = Cluster(tmp_path)
        c.start(c.addrs[0])
        c.start(c.addrs[1])  # the third never runs
        try:
            leader = await c.agreed_leader()
            await propose_retrying(c.nodes[leader], incr("r"))  # the leader's first entry is committed
            live = next(a for a in c.addrs[:2] if a != leader)
            with pytest.raises(Conflict) as e:
                await c.nodes[leader].change_members("remove", live)
            assert "1 answer the leader" in e.value.message
            assert c.nodes[leader].status()["members"] == sorted(c.addrs)  # nothing changed
            assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == 2
        finally:
            c.close()
    run(go)


def test_every_node_restarted_with_stale_peers_keeps_the_logs_members(tmp_path):
    """Grow to four (X added, promoted), dumps taken, one of the first three removed, then every
    node stopped and started again with the command lines of the first three: each uses its
    log's configuration (X a voter, the removed one out), the removed one cannot disturb them,
    and the state is whole."""
    async def go():
        c = Cluster(tmp_path, conf_overrides=COMPACT)
        c.start_all()
        x = Joining(c, tmp_path)
        try:
            leader = await c.agreed_leader()
            x.start()
            await c.nodes[leader].change_members("add", x.addr)
            await wait_until(lambda: x.addr in c.nodes[leader].status()["members"], 15, "X promoted")
            for _ in range(30):  # past the compaction threshold: the changes go into the dumps
                await propose_retrying(c.nodes[leader], incr("r"))
            gone = next(a for a in c.addrs if a != leader)
            await c.nodes[leader].change_members("remove", gone)
            for _ in range(25):
                await propose_retrying(c.nodes[leader], incr("r"))
            await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump")) for d in c.dirs.values()),
                             15, "dump files")
            want = sorted([a for a in c.addrs if a != gone] + [x.addr])
            for a in list(c.nodes):
                c.stop(a)
            x.node.stop()
            c.start_all()  # the first three's command lines, gone's included
            x.start()
            nodes = {a: n for a, n in c.nodes.items() if a != gone}
            nodes[x.addr] = x.node

            def agreed():
                leaders = [a for a, n in nodes.items() if n.is_leader()]
                return leaders[0] if len(leaders) == 1 and all(
                    n.status()["leader"] == leaders[0] for n in nodes.values()) else None
            new = await wait_until(agreed, 20, "a leader of the new members")
            for n in nodes.values():
                assert n.status()["members"] == want
            assert (await propose_retrying(nodes[new], incr("r")))["value"] == 56
            await wait_until(lambda: x.node.read(FakeState.read) == {"r": 56}, 10, "X holds the state")
            # The removed node, started on its own data, knows it is out (its log ends in its
            # removal, whose commit it may not have heard of) and stays out.
            assert c.nodes[gone].status()["membership"]["self"] == "none"
            assert not c.nodes[gone].is_leader() and nodes[new].is_leader()
        finally:
            c.close()
    run(go)


def test_a_node_removed_and_added_again_at_its_address_on_a_fresh_directory_catches_up_as_a_learner(tmp_path):
    """X is added, promoted, removed, and its address added again with an empty data directory.
    Catching up, X's log holds the configurations of X's first life, in which X is a voter: it
    must not stand for election on them (a candidate whose term passed the leader's ignores the
    leader and never catches up: seen in the fault harness). It counts itself a voter only
    through its own promotion (raftsched.replication._membership.JoinMarker)."""
    async def go():
        c = Cluster(tmp_path)
        c.start_all()
        x = Joining(c, tmp_path)
        try:
            leader = await c.agreed_leader()
            x.start()
            await c.nodes[leader].change_members("add", x.addr)
            await wait_until(lambda: x.addr in c.nodes[leader].status()["members"], 15, "X promoted")
            for _ in range(5):
                await propose_retrying(c.nodes[leader], incr("r"))
            await c.nodes[leader].change_members("remove", x.addr)
            x.node.stop()
            import shutil
            shutil.rmtree(x.dir)
            for _ in range(5):
                await propose_retrying(c.nodes[leader], incr("r"))
            node = x.start()
            await c.nodes[leader].change_members("add", x.addr)
            await wait_until(lambda: x.addr in c.nodes[leader].status()["members"], 15, "X promoted again")
            await wait_until(lambda: node.read(FakeState.read) == {"r": 10}, 10, "X holds the state")
            assert node.status()["term"] == c.nodes[leader].status()["term"]  # it never stood
            assert c.nodes[leader].is_leader()
        finally:
            c.close()
    run(go)


def _lone_leader(tmp_path):
    sync = _sync(f"127.0.0.1:{free_port()}", [], str(tmp_path))
    for _ in range(300):
        sync.doTick(0.01)
        if sync._isLeader() and sync._member_noop_committed():
            return sync
    sync.destroy()
    raise AssertionError("a lone node did not become leader")


@pytest.mark.parametrize("command", [
    b"\x02" + pickle.dumps(("add", "127.0.0.1:1")),  # pysyncobj's own membership change
    b"\x03" + pickle.dumps(99),                       # a code version no node has
    b"\x10" + b"{}",                                  # a configuration entry
    "not bytes", None,
])
def test_a_forwarded_command_that_is_no_replicated_call_is_refused_and_never_appended(tmp_path, command):
    sync = _lone_leader(tmp_path)
    try:
        before = sync._SyncObj__getCurrentLogIndex()
        sync._SyncObj__onMessageReceived(object(), {"type": "apply_command", "command": command})
        for _ in range(10):
            sync.doTick(0.01)
        assert sync._SyncObj__getCurrentLogIndex() == before
        assert not sync._SyncObj__otherNodes and tuple(sync._members().latest.voters) == (sync.selfNode.id,)
    finally:
        sync.destroy()


@pytest.mark.parametrize("entry", [
    b"\x00not a pickle",
    b"\x00" + pickle.dumps((12345, (b"x",))),        # no such replicated method
    b"\x00" + pickle.dumps((0, (b"x", b"y"))),       # another number of arguments
    b"\x00" + pickle.dumps((0, (b"x",), {"z": 1})),  # keyword arguments
    b"\x02" + pickle.dumps(("add", "127.0.0.1:1")),
    b"\x03" + pickle.dumps(99),
])
def test_a_committed_entry_apply_cannot_read_is_applied_as_nothing_and_apply_goes_on(tmp_path, entry):
    """What pysyncobj raised on (an unreadable replicated call) stopped its apply loop for good,
    on every replica alike; its membership entry changed the members outside the rules."""
    sync = _lone_leader(tmp_path)
    try:
        sync._applyCommand(entry, None)  # as the leader's own queue would append it
        for _ in range(20):
            sync.doTick(0.01)
        assert sync._SyncObj__raftLastApplied == sync._SyncObj__raftCommitIndex
        assert not sync._SyncObj__otherNodes
        got = []
        consumer = next(m.__self__ for m in sync._idToMethod.values() if isinstance(m.__self__, _StateConsumer))
        consumer._apply(incr("r"), callback=lambda res, err: got.append((res, err)))
        for _ in range(50):
            sync.doTick(0.01)
            if got:
                break
        assert got and got[0][0]["ok"] and sync._SyncObj__raftLastApplied == sync._SyncObj__raftCommitIndex
    finally:
        sync.destroy()


def test_a_member_address_with_a_port_of_other_digits_is_refused_naming_it():
    """"²".isdigit() is true and int("²") raises: the port is refused with the rule, not with
    int's message."""
    from raftsched.replication._membership import check_addr
    for addr in ("127.0.0.1:²", "127.0.0.1:٩٧٠٤", "127.0.0.1:0", "127.0.0.1:x"):
        with pytest.raises(ValueError, match="port is 1..65535"):
            check_addr(addr)
    assert check_addr("127.0.0.1:9704") == "127.0.0.1:9704"


def test_the_start_up_line_says_joining_once_and_a_log_without_a_join_ignores_the_flag(tmp_path, caplog):
    """A disaster-recovery walk: a node that joined said "(joining)" on every restart. It says
    "(joining)" on its first start with --join on an empty directory, "(joined before: raft.join)"
    after; a directory that holds a log of a node that never joined ignores --join with a warning."""
    import logging

    def start_stop(d: str, join: bool, peers: list[str]) -> None:
        async def go():
            node = RaftNode(self_addr=me, peers=peers, data_dir=d, secret=SECRET, state=FakeState(), join=join)
            node.start(asyncio.get_running_loop())
            node.stop()
        run(go)

    me, other = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    joined, own = str(tmp_path / "joined"), str(tmp_path / "own")

    def lines() -> list[str]:
        got = [r.getMessage() for r in caplog.records if "replication.started" in r.getMessage()
               or "replication.join_ignored" in r.getMessage()]
        caplog.clear()
        return got
    with caplog.at_level(logging.INFO, logger="raftsched.replication"):
        start_stop(joined, True, [other])
        assert [ln for ln in lines() if "started" in ln][0].endswith(f"(joining) data_dir={joined}")
        start_stop(joined, True, [other])
        got = lines()
        assert "(joined before: raft.join)" in got[-1] and not any("join_ignored" in ln for ln in got), got
        start_stop(own, False, [])  # a node of its own history: one member, its log written at stop
        lines()
        start_stop(own, True, [other])
        got = lines()
        assert any("join_ignored" in ln for ln in got) and "(join" not in got[-1], got


def test_a_joining_node_replaying_its_addresses_earlier_life_is_not_told_to_stop(caplog):
    """A walk: a replacement started with --join at a removed node's address logged first
    'replication.removed ...: stop it', replaying the removal of the address's earlier life. A
    joining node's membership counts only through entries after its JoinMarker; a node of its
    own history is still told when it is removed."""
    from types import SimpleNamespace
    from raftsched.replication._membership import ConfigEntry, JoinMarker, MembershipLog, MembershipMixin
    X = C

    def node(marker):
        ml = MembershipLog(cfg([A, B]))
        ml.entries = [ConfigEntry(3, 1, cfg([A, B, X])), ConfigEntry(5, 1, cfg([A, B]))]  # X's earlier life
        fake = SimpleNamespace(_mlog=ml, _SyncObj__raftCommitIndex=0, _members_pending=lambda: None,
                               _SyncObj__selfNode=SimpleNamespace(id=X), is_voter=lambda: False,
                               _members_published=None, _members_was_member=False, _members_join=marker)
        for commit in (3, 4, 5, 6):  # (each configuration committed in turn, as a catch-up applies them)
            fake._SyncObj__raftCommitIndex = commit
            MembershipMixin._members_announce(fake)
        return fake
    with caplog.at_level("WARNING", logger="raftsched"):
        node(JoinMarker("/nonexistent/raft.join", after=6, disk=object()))
    assert "replication.removed" not in caplog.text
    with caplog.at_level("WARNING", logger="raftsched"):
        node(None)  # a node of its own history, removed: told
    assert caplog.text.count(f"replication.removed self={X}") == 1
