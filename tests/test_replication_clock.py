"""replication/_clockguard.py: the members' clocks on the Raft traffic. The wire, fed to one
node's message handler (no network, no tick): what a follower answers, what a leader makes of
answers, and that malformed or missing fields change nothing else. Then three RaftNodes in this
process, one of whose wall clock is moved: the leader whose clock lies hands its leadership over
and does not win it back."""
from __future__ import annotations

import asyncio
import time

import pytest
from pysyncobj.monotonic import monotonic

from raftsched.core import clocksync
from raftsched.core import limits
from raftsched.replication import RaftNode, install, make_conf
from raftsched.replication import _clockguard
from raftsched.replication._clockguard import FIELD
from raftsched.replication._consumer import _StateConsumer
from raftsched.replication._syncobj import _SyncObj

from replication_helpers import SECRET, FakeState, free_ports, wait_until

WALL = 1_800_000_000_000


class _Wall:
    """A wall clock a test sets (ms)."""

    def __init__(self, ms: int = WALL) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def lone():
    """One _SyncObj on a wall clock of the test's, its sends recorded, and its two peers."""
    install()
    me, a, b = (f"127.0.0.1:{p}" for p in free_ports(3))
    wall = _Wall()
    sync = _SyncObj(me, [a, b], conf=make_conf(autoTick=False, password=SECRET),
                    consumers=[_StateConsumer(FakeState())], wall_ms=wall)
    sent: list[tuple] = []
    sync._SyncObj__transport.send = lambda node, msg: sent.append((node, msg))
    try:
        peers = sorted(sync._SyncObj__otherNodes, key=lambda n: [a, b].index(n.address))
        yield sync, peers[0], peers[1], wall, sent
    finally:
        sync.destroy()


def _append(sync, leader, term=1, clock=None, **extra):
    msg = {"type": "append_entries", "term": term, "commit_index": 1, "entries": [],
           "prevLogIdx": 1, "prevLogTerm": 0, **extra}
    if clock is not None:
        msg[FIELD] = clock
    sync._SyncObj__onMessageReceived(leader, msg)


def _answers(sent):
    return [m for _, m in sent if m.get("type") == "next_node_idx"]


def test_a_follower_answers_the_leaders_clock_with_its_own_and_anchors_cluster_time(lone):
    sync, leader, _, wall, sent = lone
    mono_ms = monotonic() * 1000
    _append(sync, leader, clock=[123456.5, WALL, 2.0])
    (ans,) = _answers(sent)
    assert ans[FIELD] == [123456.5, WALL]  # the echo, and this node's wall clock
    assert ans["success"] is True
    got = sync._clock.cluster_ms()
    assert WALL <= got <= WALL + (monotonic() * 1000 - mono_ms) + 1
    j = sync._clock.reading()
    assert j.state == clocksync.AGREES and abs(j.offset_ms) <= 50


def test_a_follower_whose_clock_disagrees_holds_off_its_candidacy_even_when_asked_to_stand(lone):
    sync, leader, _, wall, _ = lone
    wall.ms = WALL + 6000
    _append(sync, leader, clock=[1.0, WALL, 1.0])
    sync._clock.tick()
    j = sync._clock.reading()
    assert j.state == clocksync.DISAGREES and j.offset_ms == pytest.approx(6000, abs=50)
    # One anchor is not enough for a follower to act on (it may be a stale message's): the next
    # message's anchor says the same, and it holds.
    assert not sync._clock.holding() and sync._clock.counters["unconfirmed"] == 1
    _append(sync, leader, clock=[2.0, WALL + 200, 1.0])
    sync._clock._next_look = 0.0
    sync._clock.tick()
    assert sync._clock.reading().offset_ms == pytest.approx(5800, abs=50)
    assert sync._clock.holding()
    view = sync._clock.view()
    assert view["candidacy_held"] is True
    assert view["conditions"] == [{"type": "cluster.clock_disagrees", "node": "self", "offset_ms": view["offset_ms"],
                                   "error_ms": 1, "bound_ms": limits.clock_skew_ms_max}]
    # The leader asks it to stand at once (TimeoutNow), a staler candidate comes by: it does not.
    sync._SyncObj__onMessageReceived(leader, {"type": "timeout_now", "term": 1})
    assert sync._SyncObj__raftElectionDeadline - monotonic() >= 0.3
    sync._stand_soon()
    sync._clock.hold()
    assert sync._SyncObj__raftElectionDeadline - monotonic() >= 0.3
    # Its clock is put right: it agrees again, and stands as any follower after the hold.
    wall.ms = WALL + 10
    sync._clock.tick()
    assert sync._clock.reading().state == clocksync.AGREES


def test_a_message_without_the_field_is_answered_as_before(lone):
    """A leader of a version without the clock guard: its messages have no field, and the
    answers to them none either (pysyncobj reads the keys it knows)."""
    sync, leader, _, _, sent = lone
    _append(sync, leader)
    (ans,) = _answers(sent)
    assert FIELD not in ans and ans["success"] is True
    assert sync._clock.cluster_ms() is None
    assert sync._clock.reading().state == clocksync.UNKNOWN


@pytest.mark.parametrize("bad", [
    "x", 5, [], [1], [1, 2, 3, 4], ["a", None, None], [None, "x", "y"], [float("nan"), WALL, 1],
    [1, float("inf"), 1], [1, WALL, "e"], {"a": 1}, [True, WALL, 1], [[1], [2], [3]], [1e400, 1e400, 1],
])
def test_a_malformed_clock_field_never_breaks_a_replica(lone, bad):
    sync, leader, _, _, sent = lone
    log_before = list(sync._SyncObj__raftLog)
    _append(sync, leader, clock=bad, entries=[(b"c2", 2, 1)])
    (ans,) = _answers(sent)
    assert ans["success"] is True and ans["next_node_idx"] == 3  # the entry was taken as ever
    assert len(sync._SyncObj__raftLog) == len(log_before) + 1
    sync._clock.tick()
    sync._clock.view()
    # The leader's side: a malformed answer field makes no sample, and no error.
    g = sync._clock
    g.on_answer("peer", bad, monotonic())
    assert g.reading().state in (clocksync.UNKNOWN, clocksync.AGREES)


def _lead(sync, term=1):
    sync._SyncObj__raftCurrentTerm = term
    sync._SyncObj__connectedNodes.update(sync._SyncObj__otherNodes)
    sync._SyncObj__onBecomeLeader()


def test_a_leader_measures_its_followers_and_judges_itself_against_the_median(lone):
    sync, b, c, wall, sent = lone
    _lead(sync)
    stamps = {n.id: m[FIELD] for n, m in sent if m.get("type") == "append_entries" and FIELD in m}
    assert set(stamps) == {b.id, c.id}  # the first message of a term to each is stamped

    def answer(node, wall_ms):
        sync._SyncObj__onMessageReceived(node, {"type": "next_node_idx", "next_node_idx": 3, "reset": False,
                                                "success": True, "term": 1, "prev": 1,
                                                FIELD: [stamps[node.id][0], wall_ms]})

    # Both followers' clocks read the leader's: it agrees.
    answer(b, WALL)
    answer(c, WALL + 4)
    sync._clock.tick()
    j = sync._clock.reading()
    assert j.state == clocksync.AGREES and abs(j.offset_ms) < 100
    assert set(j.peers) == {b.id, c.id}
    # The leader's wall clock jumps 6 s: cluster time does not move with it; the leader disagrees.
    before = sync._clock.cluster_ms()
    wall.ms += 6000
    j = sync._clock.reading()
    assert j.state == clocksync.DISAGREES and j.offset_ms == pytest.approx(6000, abs=100)
    assert abs(sync._clock.cluster_ms() - before) < 100
    assert sync._clock.view()["conditions"][0]["node"] == "self"
    # A follower whose clock lies is named, and the leader still agrees with the median.
    wall.ms -= 6000
    answer(c, WALL + 9000)
    j = sync._clock.reading()
    assert j.state == clocksync.AGREES and j.peers[c.id][0] == pytest.approx(9000, abs=100)
    assert [x["node"] for x in sync._clock.view()["conditions"]] == [c.id]


class _Stall:
    """A thread stalled ``stall_s`` between reading the monotonic clock and reading the wall clock
    (a collection under memory pressure): both clocks move on by it while it waits. ``times``
    readings of the wall clock stall; the rest do not."""

    def __init__(self, wall: _Wall, stall_s: float, times: int) -> None:
        self.wall, self.stall_s, self.times, self.extra_s = wall, stall_s, times, 0.0

    def mono(self) -> float:
        return monotonic() + self.extra_s

    def read_wall(self) -> int:
        if self.times > 0:
            self.times -= 1
            self.extra_s += self.stall_s
            self.wall.ms += round(self.stall_s * 1000)
        return self.wall()


def _agreeing_leader(sync, b, c, sent):
    _lead(sync)
    stamps = {n.id: m[FIELD] for n, m in sent if m.get("type") == "append_entries" and FIELD in m}
    for node in (b, c):
        sync._SyncObj__onMessageReceived(node, {"type": "next_node_idx", "next_node_idx": 3, "reset": False,
                                                "success": True, "term": 1, "prev": 1,
                                                FIELD: [stamps[node.id][0], WALL]})
    sync._clock.tick()
    assert sync._clock.reading().state == clocksync.AGREES


def test_a_leader_stalled_while_it_reads_its_clock_does_not_judge_it_fast(lone):
    """Seen on a loaded cluster: ``clock.disagrees offset_ms=1759 err_ms=1`` on a leader whose
    wall clock was the others' (one machine), after a 1.76 s stall between its monotonic and
    wall readings; it handed its leadership over. The readings are paired: a stalled pair is
    read again."""
    sync, b, c, wall, sent = lone
    _agreeing_leader(sync, b, c, sent)
    g = sync._clock
    stall = _Stall(wall, 1.76, times=1)
    g._mono, g._wall = stall.mono, stall.read_wall
    g._next_look = 0.0
    g.tick()
    assert stall.times == 0  # it did stall once
    j = g.reading()
    assert j.state == clocksync.AGREES and abs(j.offset_ms) < 100, j
    assert not g.holding() and g.counters["transfers"] == 0 and g.counters["stalled_reads"] == 0
    # Stalled around every reading of a look: that look decides nothing (no hold, no hand-over).
    stall.times, stall.stall_s = clocksync.PAIR_TRIES, 0.1  # pairs 50 ms loose: beyond PAIR_ERR_MAX_MS
    g._next_look = 0.0
    g.tick()
    assert stall.times == 0 and g.counters["stalled_reads"] == 1
    assert not g.holding() and g.counters["transfers"] == 0
    assert g.reading().state == clocksync.AGREES


def test_a_follower_stalled_while_it_reads_its_clock_does_not_hold_its_candidacy(lone):
    sync, leader, _, wall, _ = lone
    _append(sync, leader, clock=[1.0, WALL, 1.0])
    g = sync._clock
    stall = _Stall(wall, 1.5, times=1)
    g._mono, g._wall = stall.mono, stall.read_wall
    g.tick()
    assert stall.times == 0
    assert g.reading().state == clocksync.AGREES and not g.holding()


def test_a_follower_that_handles_a_stale_message_first_does_not_judge_its_clock_fast(lone):
    """Seen in the 1M storm: after its tick thread stalled 1.6 s, a follower handled an old
    append_entries first, anchored cluster time on its bound (1.6 s low) and said
    ``clock.disagrees role=follower offset_ms=1595``, holding its candidacy for 3 s. A bound
    that far below the anchor it has is not taken until bounds a second apart say so
    (clocksync.observe_confirmed): cluster time stays, and so does the verdict; the next, fresh
    message refreshes the anchor. (A first anchor's verdict is not acted on alone either: the
    test of a follower whose clock disagrees, above.)"""
    sync, leader, _, wall, _ = lone
    g = sync._clock
    wall.ms = WALL + 1600
    _append(sync, leader, clock=[1.0, WALL + 1600, 1.0])
    g.tick()
    assert g.reading().state == clocksync.AGREES
    _append(sync, leader, clock=[2.0, WALL, 1.0])  # sent 1.6 s ago, handled now: 1 600 ms low
    g._next_look = 0.0
    g.tick()
    assert g.reading().state == clocksync.AGREES and g.cluster_ms() >= WALL + 1600
    assert not g.holding() and g.counters["unconfirmed"] == 0
    _append(sync, leader, clock=[3.0, WALL + 1600, 1.0])  # the next, fresh one
    g._next_look = 0.0
    g.tick()
    assert g.reading().state == clocksync.AGREES and not g.holding() and g._doubted is None


def test_a_leader_whose_followers_answer_without_the_field_acts_unchecked(lone):
    """A rolling upgrade: the followers run a version without the clock guard. The leader cannot
    judge, and fires by its own clock as before rather than not at all."""
    sync, b, c, _, _ = lone
    _lead(sync)
    for _ in range(_clockguard.UNVERSED_ANSWERS):
        sync._SyncObj__onMessageReceived(b, {"type": "next_node_idx", "next_node_idx": 2, "reset": False,
                                             "success": True, "term": 1})
    assert sync._clock.reading().state == clocksync.UNCHECKED
    # An answer of another term is not counted (nor sampled).
    sync._SyncObj__onMessageReceived(c, {"type": "next_node_idx", "next_node_idx": 2, "reset": False,
                                         "success": True, "term": 0, FIELD: [1, WALL]})
    assert sync._clock.counters["samples"] == 0


# ---------------------------------------------------------------------------------------------
# Three RaftNodes in this process, on wall clocks the test moves
# ---------------------------------------------------------------------------------------------

#: Node 0 stands first (short election timeout), the others late: without the hold, node 0 would
#: win every election it takes part in.
FAST = {"raftMinTimeout": 0.5, "raftMaxTimeout": 0.6}
SLOW = {"raftMinTimeout": 1.5, "raftMaxTimeout": 2.0, "leaderFallbackTimeout": 2.0, "connectionTimeout": 2.0}


@pytest.mark.timeout(90)
def test_a_leader_whose_clock_lies_hands_over_and_does_not_win_it_back(tmp_path):
    async def main():
        install()
        addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
        offsets = {a: 0 for a in addrs}
        loop = asyncio.get_running_loop()
        nodes: dict[str, RaftNode] = {}
        started: list[RaftNode] = []

        def start(i):
            a = addrs[i]
            n = RaftNode(self_addr=a, peers=addrs, data_dir=str(tmp_path / f"n{i}"), secret=SECRET,
                         state=FakeState(), conf_overrides=FAST if i == 0 else SLOW,
                         wall_ms=lambda a=a: time.time_ns() // 1_000_000 + offsets[a])
            started.append(n)
            n.start(loop)
            nodes[a] = n

        def leaders():
            return [a for a, n in nodes.items() if n.is_leader()]

        try:
            start(0)
            start(1)
            await wait_until(lambda: leaders() == [addrs[0]], 15, "node 0 leads")
            start(2)
            a0 = addrs[0]
            await wait_until(lambda: nodes[a0].clock_status()["state"] == "agrees"
                             and len(nodes[a0].clock_status()["peers"]) == 2, 10, "node 0 measures both")
            offsets[a0] = 6000  # its clock steps 6 s ahead
            t0 = time.monotonic()
            new = await wait_until(lambda: next((a for a in leaders() if a != a0), None), 10, "another leader")
            handed_over_s = time.monotonic() - t0
            assert not nodes[a0].is_leader()
            # The new leader sees node 0's clock off, and node 0 knows it of itself.
            await wait_until(lambda: any(c["node"] == a0 for c in nodes[new].clock_status()["conditions"]), 5,
                             "the condition on the new leader")
            st0 = nodes[a0].clock_status()
            assert st0["state"] == "disagrees" and st0["candidacy_held"], st0
            assert abs(st0["offset_ms"] - 6000) < 200
            assert "cluster.clock_disagrees" in [x["type"] for x in nodes[a0].status()["replication"]["conditions"]]
            # The new leader goes away: of the two left, node 0 would stand first, but it holds off.
            other = next(a for a in addrs if a not in (a0, new))
            nodes.pop(new).stop()
            third = await wait_until(lambda: next(iter(leaders()), None), 15, "a leader of the two left")
            assert third == other, (third, nodes[a0].clock_status())
            # Its clock put right, node 0 agrees again.
            offsets[a0] = 0
            await wait_until(lambda: nodes[a0].clock_status()["state"] == "agrees", 5, "node 0 agrees again")
            return handed_over_s
        finally:
            for n in started:
                n.stop()

    handed_over_s = asyncio.run(main())
    assert handed_over_s < 5


def test_a_leader_that_hears_two_clocks_apart_cannot_tell_and_says_so(lone, caplog):
    """Three members, one unheard: the leader and the follower it hears are 3 s apart. Their
    midpoint is no one's time and nothing says which clock lies: unknown (the trigger holds),
    no cluster time from it, and after UNKNOWN_S the clock.unknown warning and condition."""
    sync, b, _, wall, sent = lone
    _lead(sync)
    echo = next(m[FIELD][0] for n, m in sent if n == b and FIELD in m)
    sync._SyncObj__onMessageReceived(b, {"type": "next_node_idx", "next_node_idx": 3, "reset": False,
                                         "success": True, "term": 1, "prev": 1, FIELD: [echo, WALL + 3000]})
    g = sync._clock
    g.tick()
    j = g.reading()
    assert j.state == clocksync.UNKNOWN and j.cluster_ms is None and j.offset_ms == pytest.approx(-1500, abs=100)
    assert not g.holding()  # it does not know that its own clock is the one that lies
    assert g.view()["conditions"][0]["type"] == "cluster.clock_disagrees"  # the peer, off the midpoint
    g._unknown_since -= _clockguard.UNKNOWN_S
    g._next_look = 0.0
    g.tick()
    assert "clock.unknown" in caplog.text
    assert [c["type"] for c in g.view()["conditions"]][:1] == ["cluster.clock_unknown"]


def test_a_node_without_the_clock_guard_ignores_the_field():
    """A rolling upgrade: a stock pysyncobj SyncObj (what an older raftsched's corrections hand
    every message to, after reading the keys they know) takes a stamped append_entries as any
    other and answers it as ever."""
    from pysyncobj import SyncObj

    install()
    me, a, b = (f"127.0.0.1:{p}" for p in free_ports(3))
    stock = SyncObj(me, [a, b], conf=make_conf(autoTick=False, password=SECRET))
    sent: list[tuple] = []
    stock._SyncObj__transport.send = lambda node, msg: sent.append((node, msg))
    try:
        leader = sorted(stock._SyncObj__otherNodes, key=lambda n: n.address)[0]
        _append(stock, leader, clock=[1.0, WALL, 1.0], entries=[(b"c2", 2, 1)])
        (ans,) = _answers(sent)
        assert ans == {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True}
    finally:
        stock.destroy()


def test_a_learners_clock_does_not_count_in_the_leaders_judgement(lone):
    """Voters: the leader and b (c unheard). A learner (replicated to, not a voter) whose clock
    agrees with a leader 5 s ahead made a majority of two: the leader judged itself right, b the
    liar, and fired 5 s early. The voters' clocks alone cannot tell: unknown."""
    sync, b, _, wall, sent = lone
    _lead(sync)
    echo = next(m[FIELD][0] for n, m in sent if n == b and FIELD in m)
    wall.ms += 5000  # the leader's clock is 5 s ahead of b's
    sync._SyncObj__onMessageReceived(b, {"type": "next_node_idx", "next_node_idx": 3, "reset": False,
                                         "success": True, "term": 1, "prev": 1, FIELD: [echo, WALL]})
    learner = "127.0.0.1:1"  # answers as a learner does (_on_answer: every replication target)
    sync._clock.on_answer(learner, [echo, WALL + 5000], monotonic())
    sync._clock.tick()
    j = sync._clock.reading()
    assert j.state == clocksync.UNKNOWN and j.cluster_ms is None and learner not in j.peers
