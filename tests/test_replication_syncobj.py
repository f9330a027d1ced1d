"""raftsched/replication/_syncobj.py: the Raft corrections to pysyncobj's SyncObj, fed to one
node's message handler directly (no network, no tick), and a whole-cluster restart between a
dump and its trim."""
from __future__ import annotations

import pytest
from pysyncobj.monotonic import monotonic

from raftsched.replication import install, make_conf
from raftsched.replication._consumer import _StateConsumer
from raftsched.replication._syncobj import _SyncObj

from replication_helpers import (
    COMPACT, SECRET, Cluster, FakeState, free_port, incr, incr_until_every_node_dumped,
    restart_all_and_count_on, run,
)


@pytest.fixture
def lone_follower():
    """One _SyncObj whose message handler the test calls directly (no network, no tick), and
    its two peers as pysyncobj nodes."""
    install()  # what every RaftNode does before it builds one
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
    sync, _, _ = lone_follower
    monkeypatch.setattr(_SyncObj, "_load_dump", lambda self, clear: setattr(self, "_dump_load_done", True))
    conf = make_conf(autoTick=False, password=SECRET)
    sync._SyncObj__raftElectionDeadline = monotonic() - 5  # as after a long restore
    sync._SyncObj__loadDumpFile(True)
    assert sync._SyncObj__raftElectionDeadline - monotonic() >= conf.raftMinTimeout - 0.05
    sync._SyncObj__raftState = 2  # a leader's deadline is not its concern
    sync._SyncObj__raftElectionDeadline = 0.0
    sync._SyncObj__loadDumpFile(False)
    assert sync._SyncObj__raftElectionDeadline == 0.0


def test_a_follower_held_up_past_its_deadline_reads_what_waits_before_it_stands(lone_follower, monkeypatch):
    """pysyncobj's tick checks the election deadline before it reads the network: a follower
    whose tick thread was held up past its deadline (a collection, a sync, the interpreter lock)
    stood for election with its leader's heartbeat waiting unread, and deposed a healthy leader.
    It reads first now; with nothing from the leader waiting, it still stands."""
    sync, leader, _ = lone_follower
    sync._SyncObj__transport.tryGetReady()
    assert sync._SyncObj__transport.ready
    monkeypatch.setattr(sync, "_SyncObj__connectedToAnyone", lambda: True)  # its peers, as if connected
    _append(sync, leader, 1, 1, 0, [], commit=1)  # the leader of term 1, heard
    waiting = []

    def poll(timeout):  # the sockets: what waits in them is read, whatever the timeout
        while waiting:
            waiting.pop(0)()
    monkeypatch.setattr(sync._poller, "poll", poll)
    sync._SyncObj__raftElectionDeadline = monotonic() - 0.3  # held up 0.3 s past it
    waiting.append(lambda: _append(sync, leader, 1, 1, 0, [], commit=1))  # a heartbeat, unread
    sync._onTick(0.0)
    assert sync._SyncObj__raftCurrentTerm == 1 and sync._SyncObj__raftState == 0, "no election"
    assert sync._SyncObj__raftElectionDeadline > monotonic()
    # The leader gone: nothing waits, and the follower stands as before.
    sync._SyncObj__raftElectionDeadline = monotonic() - 0.3
    sync._onTick(0.0)
    assert sync._SyncObj__raftCurrentTerm == 2 and sync._SyncObj__raftState == 1


def test_a_follower_alone_forgets_a_leader_it_no_longer_hears(lone_follower, monkeypatch, caplog):
    """A walk: the leader and the other follower killed, the follower left named the dead leader
    for good (pysyncobj clears it only when it stands, which it does only while connected to a
    peer): /healthz 200, no cluster.no_leader. It forgets it an election timeout and a second
    after its last message, and knows it again at the next."""
    sync, leader, _ = lone_follower
    _append(sync, leader, 1, 1, 0, [], commit=1)  # the leader of term 1, heard
    assert sync._getLeader() == leader
    monkeypatch.setattr(sync._poller, "poll", lambda timeout: None)  # nothing comes in
    assert not sync._SyncObj__connectedToAnyone()  # (no peer connected: it never stands)
    sync._SyncObj__raftElectionDeadline = monotonic() - 0.5  # within the grace: still named
    sync._onTick(0.0)
    assert sync._getLeader() == leader
    sync._SyncObj__raftElectionDeadline = monotonic() - 1.5
    with caplog.at_level("WARNING"):
        sync._onTick(0.0)
    assert sync._getLeader() is None and "replication.leader_silent" in caplog.text
    assert sync._SyncObj__raftCurrentTerm == 1 and sync._SyncObj__raftState == 0, "no election, no new term"
    _append(sync, leader, 1, 1, 0, [], commit=1)  # heard again
    assert sync._getLeader() == leader
    # A transfer's target: TimeoutNow sets its deadline to 0 so that it stands at once; its
    # leader was heard a moment ago, and is not forgotten (a review: it was, its commands failed).
    sync._SyncObj__transferInProgress = True
    sync._SyncObj__raftElectionDeadline = 0
    sync._forget_silent_leader()
    assert sync._getLeader() == leader


def test_a_tick_thread_held_up_is_logged_with_the_cpu_it_used(lone_follower, monkeypatch, caplog):
    """A tick that starts 0.3 s or more after the one before is logged (replication.tick_gap),
    with the thread's CPU time meanwhile: working (a long apply, a collection) or waiting (the
    interpreter lock, a sync, the host)."""
    from raftsched.replication import _syncobj
    sync, _, _ = lone_follower
    times = iter([(10.0, 1.0), (10.05, 1.01), (10.55, 1.02), (11.5, 1.9)])
    now = {}

    def step():
        now["t"], now["cpu"] = next(times)
        sync._note_tick_gap()
    monkeypatch.setattr(_syncobj, "monotonic", lambda: now["t"])
    monkeypatch.setattr(_syncobj, "thread_time", lambda: now["cpu"])
    with caplog.at_level("WARNING", logger="raftsched.replication"):
        for _ in range(4):
            step()
    gaps = [r.getMessage() for r in caplog.records if "tick_gap" in r.getMessage()]
    assert len(gaps) == 2
    assert "ms=500 cpu_ms=10 " in gaps[0] and "ms=950 cpu_ms=880 " in gaps[1]


def test_a_tick_applies_a_bounded_share_of_a_long_commit_in_log_order(lone_follower, monkeypatch):
    """pysyncobj applied every committed entry in one tick: a leader applying a commit of 1M
    re-put jobs sent no heartbeat for up to 1.2 s and was deposed. A tick applies for at most
    _APPLY_TICK_S (at least one entry), the next ticks the rest, each entry once, in log order,
    its caller answered as before (its result, or discarded when the entry is another term's)."""
    from pysyncobj import FAIL_REASON

    from raftsched.replication import _syncobj
    sync, leader, _ = lone_follower
    clock = {"t": 100.0}
    monkeypatch.setattr(_syncobj, "monotonic", lambda: clock["t"])
    applied = []

    def apply(command):  # 10 ms an entry
        applied.append(command)
        clock["t"] += 0.01
        return len(applied)
    monkeypatch.setattr(sync, "_SyncObj__doApplyCommand", apply)
    monkeypatch.setattr(sync._SyncObj__conf, "appendEntriesUseBatch", False)  # as a RaftNode runs
    _append(sync, leader, 1, 1, 0, [(i, 1) for i in range(2, 202)], commit=201)
    answers = []
    sync._SyncObj__commandsWaitingCommit[3].append((1, lambda res, why: answers.append((3, res, why))))
    sync._SyncObj__commandsWaitingCommit[150].append((0, lambda res, why: answers.append((150, res, why))))
    before = sync._apply_behind()
    assert before == 201 - sync._SyncObj__raftLastApplied
    assert sync._SyncObj__applyLogEntries() is True, "applied: the commit index goes out"
    per_tick = round(_syncobj._APPLY_TICK_S / 0.01)
    assert len(applied) == per_tick and sync._apply_behind() == before - per_tick
    ticks = 1
    while sync._apply_behind():
        sync._SyncObj__applyLogEntries()
        ticks += 1
    assert ticks == -(-before // per_tick)
    assert applied[-200:] == [f"c{i}-1".encode() for i in range(2, 202)]
    assert len(applied) == before
    assert answers == [(3, applied.index(b"c3-1") + 1, FAIL_REASON.SUCCESS), (150, None, FAIL_REASON.DISCARDED)]
    assert sync._SyncObj__applyLogEntries() is False, "nothing left: nothing to send for it"


def test_a_tick_with_entries_left_to_apply_reads_without_waiting(lone_follower, monkeypatch):
    """After an apply stopped at its budget with entries left, the next ticks read the network
    without waiting, until the entries are applied; a tick that merely has new entries to apply
    waits as before (polling without waiting after every message made the ticks, and their
    fixed costs, several times as many under load)."""
    from raftsched.replication import _syncobj
    sync, leader, _ = lone_follower
    sync._SyncObj__transport.tryGetReady()
    clock = {"t": 100.0}
    monkeypatch.setattr(_syncobj, "monotonic", lambda: clock["t"])

    def apply(command):  # 10 ms an entry: 5 a tick
        clock["t"] += 0.01
    monkeypatch.setattr(sync, "_SyncObj__doApplyCommand", apply)
    waits = []
    monkeypatch.setattr(sync._poller, "poll", lambda timeout: waits.append(timeout))
    _append(sync, leader, 1, 1, 0, [(i, 1) for i in range(2, 22)], commit=21)
    behind = sync._apply_behind()
    for _ in range(-(-behind // 5) + 1):
        sync._onTick(0.05)
    assert sync._apply_behind() == 0
    assert waits == [0.05] + [0.0] * (-(-behind // 5) - 1) + [0.05]


def test_a_leader_far_behind_in_its_applies_takes_no_new_command(lone_follower, monkeypatch):
    """Past _APPLY_BACKLOG_MAX committed entries not yet applied, a leader leaves new commands
    in its queue (full, they are refused: 503) rather than grow the backlog."""
    from pysyncobj import SyncObj

    from raftsched.replication import _syncobj
    sync, _, _ = lone_follower
    taken = []
    monkeypatch.setattr(SyncObj, "_checkCommandsToApply", lambda self: taken.append(self._apply_behind()))
    sync._SyncObj__raftState = 2
    sync._SyncObj__raftCommitIndex = sync._SyncObj__raftLastApplied + _syncobj._APPLY_BACKLOG_MAX + 1
    sync._checkCommandsToApply()
    assert taken == []
    sync._SyncObj__raftCommitIndex -= 1
    sync._checkCommandsToApply()
    sync._SyncObj__raftState = 0  # a follower forwards to its leader whatever its backlog
    sync._SyncObj__raftCommitIndex += 100
    sync._checkCommandsToApply()
    assert taken == [_syncobj._APPLY_BACKLOG_MAX, _syncobj._APPLY_BACKLOG_MAX + 100]


def test_the_tick_gap_log_reads_the_threads_cpu_time_at_most_every_10_ms(lone_follower, monkeypatch):
    """Reading the thread's CPU time is a system call; a thread ticking thousands of times a
    second read it each tick (2-6 % of the nodes' CPU in the fleet benchmark)."""
    from raftsched.replication import _syncobj
    sync, _, _ = lone_follower
    now, reads = {"t": 50.0}, []
    monkeypatch.setattr(_syncobj, "monotonic", lambda: now["t"])
    monkeypatch.setattr(_syncobj, "thread_time", lambda: reads.append(now["t"]) or 1.0)
    for _ in range(1000):  # a tick every ms for a second
        now["t"] += 0.001
        sync._note_tick_gap()
    assert 90 <= len(reads) <= 101


def test_a_split_vote_is_broken_by_node_id():
    """Two candidates of one term with equally recent logs each refuse the other (each voted for
    itself). The one with the lower id stands again within 0.1 s; the other waits at least a
    minimum timeout, so the next term's request reaches it first."""
    install()  # what every RaftNode does before it builds one
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


def test_a_node_with_an_empty_log_votes_only_for_empty_logs_until_a_leader_sends_it_the_log(lone_follower):
    """A member restarted on an empty data directory (its term, vote and log lost) granted its
    vote to a candidate that lacked acknowledged entries, which won with it and replaced them
    (a disaster-recovery walk: a 201, then a 404, and one fencing token granted twice). An
    empty log (pysyncobj's initial entry of term 0 alone) withholds its vote from a candidate
    whose log is not empty; a fresh cluster's candidates (empty logs) are answered as before;
    once a leader sent entries, the node votes as any member. And a term learnt from a leader's
    append is that leader's vote: no other candidate of the term gets it."""
    sync, leader, other = lone_follower

    def vote(node, term, last_idx, last_term):
        sync._SyncObj__onMessageReceived(node, {"type": "request_vote", "term": term,
                                                "last_log_index": last_idx, "last_log_term": last_term})
        return sync._SyncObj__votedForNodeId

    assert vote(other, 7, 40, 6) is None and sync._SyncObj__raftCurrentTerm == 0  # withheld, term not moved
    assert vote(other, 7, 1, 0) == other.id  # a fresh cluster's candidate
    # A leader of term 8 sends the log: the term is the leader's, as if voted for.
    _append(sync, leader, 8, 1, 0, [(2, 6), (3, 8)], commit=3)
    assert sync._SyncObj__raftCurrentTerm == 8 and sync._SyncObj__votedForNodeId == leader.id
    assert sync._SyncObj__raftLog.getVotedForNodeId() == leader.id  # durable, as a vote
    assert vote(other, 8, 3, 8) == leader.id  # another candidate of term 8: not granted
    assert vote(other, 9, 3, 8) == other.id  # of term 9 with an up-to-date log: granted


def test_a_conflict_at_a_committed_entry_stops_the_node_as_diverged(lone_follower, monkeypatch):
    """A leader whose log differs at an entry this node committed (its history diverged: a
    member that lost its data helped elect a leader without it) was logged and ignored: the
    node stayed up, never caught up, said it was healthy and served reads of a state the
    cluster does not hold. It stops now with exit status 77, as docs/operations.md says."""
    from raftsched.replication import _storage
    sync, leader, _ = lone_follower
    _append(sync, leader, 1, 1, 0, [(2, 1), (3, 1), (4, 1)], commit=4)
    assert sync._SyncObj__raftCommitIndex == 4
    exits: list[int] = []

    def _exit(code):
        exits.append(code)
        raise SystemExit(code)
    monkeypatch.setattr(_storage, "_exit_process", _exit)
    with pytest.raises(SystemExit):
        _append(sync, leader, 3, 3, 2, [(4, 3)], commit=4)  # entry 3 is of term 1 here, 2 there
    assert exits == [_storage.EXIT_DIVERGED]


def test_a_snapshots_word_does_not_commit_a_tail_the_leaders_log_does_not_hold(lone_follower):
    """A review: pysyncobj raised a follower's commit index on an append_entries without
    ``prevLogIdx`` (a snapshot's part, or ``serialized: None`` while the leader writes one) to
    min(the leader's commit, its log's end), unchecked: a tail a deposed leader left was counted
    committed and applied, and the next append, at odds with it below that commit, stopped the
    node as diverged. The commit index moves on that path only once a snapshot is installed."""
    sync, _, other = lone_follower
    _append(sync, other, 1, 1, 0, [(2, 1), (3, 1), (4, 1)], commit=2)
    assert sync._SyncObj__raftCommitIndex == 2
    sync._SyncObj__onMessageReceived(other, {"type": "append_entries", "term": 2, "commit_index": 50,
                                             "serialized": None})
    assert sync._SyncObj__raftCommitIndex == 2 and sync._SyncObj__leaderCommitIndex == 50
    _append(sync, other, 2, 2, 1, [(3, 2)], commit=3)  # the new leader's entry 3: the tail goes
    assert [(sync._SyncObj__raftLog[k][1], sync._SyncObj__raftLog[k][2])
            for k in range(len(sync._SyncObj__raftLog))] == [(1, 0), (2, 1), (3, 2)]
    assert sync._SyncObj__raftCommitIndex == 3


def test_a_follower_asked_by_a_staler_candidate_stands_for_election_soon(lone_follower):
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


def test_each_role_change_has_its_cause():
    """_SyncObj.role_cause: what RaftNode logs and counts for each role change (an idle cluster's
    elections once said nothing of why). Fed to one node's handler directly (no network)."""
    install()
    me, a, b = (f"127.0.0.1:{free_port()}" for _ in range(3))
    seen = []
    holder = {}

    def on_state_changed(old, new):
        seen.append((old, new, holder["sync"].role_cause(old, new)))
    sync = holder["sync"] = _SyncObj(me, [a, b], conf=make_conf(autoTick=False, password=SECRET,
                                                                 onStateChanged=on_state_changed),
                                     consumers=[_StateConsumer(FakeState())])
    try:
        leader, other = sorted(sync._SyncObj__otherNodes, key=lambda n: [a, b].index(n.address))
        assert sync.role_cause(0, 1) == "election_timeout"  # no leader heard from: the timer
        assert sync.role_cause(1, 2) == "election_timeout"  # a won election counts its candidacy's
        _append(sync, leader, 1, 0, 0, [], 0)  # a leader of term 1...
        sync._SyncObj__onMessageReceived(leader, {"type": "timeout_now", "term": 1})  # ...hands over
        assert sync.role_cause(0, 1) == "transfer" and sync.role_cause(1, 2) == "transfer"
        # A leader that hears a higher term steps down for it, inside the message's handling.
        sync._SyncObj__raftState = 2
        sync._SyncObj__onMessageReceived(other, {"type": "request_vote", "term": 5, "last_log_index": 0,
                                                 "last_log_term": 0})
        assert seen[-1] == (2, 0, "higher_term")
        assert sync.role_cause(2, 0) == "quorum_lost"  # from the tick, with no message: no majority
        sync.transferLeadership(other)  # this leader hands over (refused here: not leading)
        assert sync.role_cause(2, 0) == "transfer"
    finally:
        sync.destroy()
