"""The next-index walk with the real code on both sides (issue 20; docs/design.md I24): the
leader's ``_SyncObj__sendAppendEntries`` / ``_send_entries`` / ``_on_answer`` and the follower's
``_SyncObj__onMessageReceived`` (raftsched's override and pysyncobj's handler under it:
``_check_previous``, ``_entries_already_held``, ``_empty_append``, ``_SyncObj__sendNextNodeIdx``),
on objects built without sockets or threads, with a fake clock, TCP-ordered links that a
disconnect empties, follower compaction, new leader entries and stalls. And the cases a review
found: an answer of another term, a probe answered at the match index, an idle spell, a late
heartbeat. No network, no real clock.
"""
from __future__ import annotations

import contextlib
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.journal import MemoryJournal

from raftsched.replication import _progress as P
from raftsched.replication import _syncobj as S
from raftsched.replication._clockguard import ClockGuard

ENTRY_BYTES = 20_000        # about three entries a 64 KiB batch
INFLIGHT_MAX = 120_000      # small, so that the cap is reached


class Node:
    def __init__(self, id):
        self.id = id

    def __repr__(self):
        return self.id


class Transport:
    def __init__(self):
        self.sent = []

    def send(self, node, msg):
        self.sent.append((node, msg))
        return True


class Serializer:
    def cancelTransmisstion(self, node):
        pass

    def getTransmissionData(self, node):
        return None


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@contextlib.contextmanager
def fake_time(inflight_max=P.INFLIGHT_BYTES_MAX):
    clock = Clock()
    saved = S.monotonic, P.monotonic, P.INFLIGHT_BYTES_MAX
    S.monotonic = P.monotonic = clock
    P.INFLIGHT_BYTES_MAX = inflight_max
    try:
        yield clock
    finally:
        S.monotonic, P.monotonic, P.INFLIGHT_BYTES_MAX = saved


def _journal(entries):
    j = MemoryJournal()
    for idx, t in entries:
        j.add(b"x" * ENTRY_BYTES, idx, t)
    return j


_CONF = types.SimpleNamespace(appendEntriesPeriod=0.1, appendEntriesBatchSizeBytes=2 ** 16, raftMinTimeout=0.5,
                              raftMaxTimeout=1.0, dynamicMembershipChange=False, onStateChanged=None)


def leader(entries, term, commit, clock, others=("f",)):
    s = object.__new__(S._SyncObj)
    nodes = [Node(o) for o in others]
    s.__dict__.update({
        "_progress": {}, "_SyncObj__conf": _CONF, "_SyncObj__raftLog": _journal(entries),
        "_SyncObj__otherNodes": set(nodes), "_SyncObj__readonlyNodes": set(),
        "_SyncObj__connectedNodes": set(nodes), "_SyncObj__serializer": Serializer(),
        "_SyncObj__transport": Transport(), "_SyncObj__raftCurrentTerm": term,
        "_SyncObj__raftCommitIndex": commit, "_SyncObj__raftState": S._LEADER,
        "_SyncObj__newAppendEntriesTime": 0, "_SyncObj__lastResponseTime": {n: clock() for n in nodes},
        "_SyncObj__raftNextIndex": {n: entries[-1][0] + 1 for n in nodes},
        "_SyncObj__raftMatchIndex": {n: 0 for n in nodes},
    })
    s._clock = ClockGuard(s)  # what _SyncObj.__init__ makes (the clocks ride on the same messages)
    s._members_setup("l", list(others), False)  # what _SyncObj.__init__ sets before SyncObj's
    return s, {n.id: n for n in nodes}


def follower(entries, commit, term):
    f = object.__new__(S._SyncObj)
    f.__dict__.update({
        "_progress": {}, "_raft_encryptor": None, "_SyncObj__conf": _CONF, "_SyncObj__selfNode": Node("f"),
        "_SyncObj__raftCurrentTerm": term, "_SyncObj__votedForNodeId": None,
        "_SyncObj__transferInProgress": False, "_SyncObj__raftElectionDeadline": 0,
        "_SyncObj__raftLeader": None, "_SyncObj__commandsWaitingReply": {}, "_SyncObj__raftState": 0,
        "_SyncObj__leaderCommitIndex": None, "_SyncObj__recvTransmission": "",
        "_SyncObj__raftLog": _journal(entries), "_SyncObj__raftCommitIndex": commit,
        "_SyncObj__raftLastApplied": commit, "_SyncObj__transport": Transport(),
        "_SyncObj__serializer": Serializer(),
    })
    f._clock = ClockGuard(f)
    f._members_setup("f", ["l"], False)  # what _SyncObj.__init__ sets before SyncObj's
    return f


def log_of(sync):
    lg = sync._SyncObj__raftLog
    return [(lg[i][1], lg[i][2]) for i in range(len(lg))]


def agree(leader_terms, f) -> int:
    lg = log_of(f)
    k = lg[0][0] - 1  # what it compacted was committed: the leader's
    by = dict(lg)
    while k < len(leader_terms) and by.get(k + 1) == leader_terms[k]:
        k += 1
    return k


def take(sync):
    out, sync._SyncObj__transport.sent = sync._SyncObj__transport.sent, []
    return [m for _, m in out]


@st.composite
def divergent_logs(draw):
    common = sorted(draw(st.lists(st.integers(1, 3), min_size=2, max_size=10)))
    base = common[-1]
    f_tail = sorted(draw(st.lists(st.integers(base, base + 3), max_size=25)))
    l_tail = sorted(draw(st.lists(st.integers(base + 4, base + 6), max_size=25)))
    shared = draw(st.integers(0, len(f_tail)))
    leader_terms = common + f_tail[:shared] + l_tail + [base + 7]
    follower_terms = common + f_tail
    commit = draw(st.integers(1, len(common)))
    first = draw(st.integers(1, commit))
    lcommit = draw(st.integers(max(commit, len(common)), len(leader_terms)))
    return leader_terms, follower_terms[first - 1:], first, commit, lcommit


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(logs=divergent_logs(), data=st.data())
def test_the_real_walk_keeps_match_and_commit_honest_and_converges(logs, data):
    """At every step: the leader's match index and the follower's commit index are never past
    where the logs agree, and no committed entry is lost; then fair rounds converge."""
    leader_terms, follower_terms, first, commit, lcommit = logs
    term = leader_terms[-1]
    with fake_time(INFLIGHT_MAX) as clock:
        L, nodes = leader([(i + 1, t) for i, t in enumerate(leader_terms)], term, lcommit, clock)
        fn, ln = nodes["f"], Node("L")
        F = follower([(first + k, t) for k, t in enumerate(follower_terms)], commit, max(follower_terms))
        committed = {i: t for i, t in log_of(F) if i <= commit}
        to_f: list = []
        to_l: list = []

        def check(what):
            lt = [t for _, t in log_of(L)]
            a = agree(lt, F)
            assert L._SyncObj__raftMatchIndex[fn] <= a, what
            assert F._SyncObj__raftCommitIndex <= a, what
            fl = dict(log_of(F))
            for i, t in committed.items():
                assert i < log_of(F)[0][0] or fl.get(i) == t, f"committed {i} lost after {what}"
            for i, t in fl.items():
                if i <= F._SyncObj__raftCommitIndex:
                    committed.setdefault(i, t)

        def send():
            L._SyncObj__sendAppendEntries()
            sent = take(L)
            if fn in L._SyncObj__connectedNodes:
                to_f.extend(sent)

        def deliver():
            F._SyncObj__onMessageReceived(ln, to_f.pop(0))
            to_l.extend(take(F))

        for _ in range(data.draw(st.integers(0, 60))):
            act = data.draw(st.sampled_from(["send", "send", "deliver", "deliver", "answer", "answer",
                                             "disconnect", "append", "compact", "stall"]))
            if act == "send":
                clock.t += data.draw(st.sampled_from([0.0, 0.05, 0.11]))
                send()
            elif act == "deliver" and to_f:
                deliver()
            elif act == "answer" and to_l:
                L._SyncObj__onMessageReceived(fn, to_l.pop(0))
            elif act == "disconnect":
                to_f.clear()
                to_l.clear()
                L._SyncObj__connectedNodes.discard(fn)
                clock.t += 0.11
                send()
                L._SyncObj__connectedNodes.add(fn)
            elif act == "append":
                for _ in range(data.draw(st.integers(1, 4))):
                    L._SyncObj__raftLog.add(b"x" * ENTRY_BYTES, log_of(L)[-1][0] + 1, term)
            elif act == "compact":
                fc, f0 = F._SyncObj__raftCommitIndex, log_of(F)[0][0]
                if fc - 1 > f0:
                    F._SyncObj__raftLastApplied = fc
                    F._SyncObj__raftLog.deleteEntriesTo(fc - 1 - f0)
            elif act == "stall":
                clock.t += 2.5
            check(act)
        for _ in range(40):  # fair rounds
            clock.t += 0.11
            send()
            while to_f or to_l:
                while to_f:
                    deliver()
                    check("deliver")
                while to_l:
                    L._SyncObj__onMessageReceived(fn, to_l.pop(0))
                    check("answer")
            last = log_of(L)[-1]
            if log_of(F)[-1] == last and L._SyncObj__raftMatchIndex[fn] == last[0]:
                return
        raise AssertionError(f"no convergence: {L.progress()} F ends {log_of(F)[-3:]} L ends {log_of(L)[-3:]}")


def test_an_answer_of_another_term_moves_nothing():
    """A success the follower sent in term 5, held in a link across two elections, reaches the
    node that leads again in term 7: it must not set the match index (the follower truncated
    those entries in term 6). pysyncobj's answers had no term."""
    with fake_time() as clock:
        base = [(i, 1) for i in range(1, 11)]
        F = follower(base, 10, 1)
        F._SyncObj__onMessageReceived(Node("X"), {
            "type": "append_entries", "term": 5, "commit_index": 10, "prevLogIdx": 10, "prevLogTerm": 1,
            "entries": [(b"x", i, 5) for i in range(11, 15)]})
        held = take(F)[-1]
        assert held["success"] and held["next_node_idx"] == 15 and held["term"] == 5
        X7, nodes = leader(base + [(11, 6), (12, 6), (13, 7), (14, 7)], 7, 12, clock)
        X7._SyncObj__onMessageReceived(nodes["f"], held)
        assert X7._SyncObj__raftMatchIndex[nodes["f"]] == 0
        assert X7.progress()["f"]["stale_answers"] == 1


def test_a_probe_answered_at_the_match_index_resumes_the_pipeline():
    with fake_time() as clock:
        L, nodes = leader([(i, 1) for i in range(1, 11)], 1, 10, clock)
        f = nodes["f"]
        L._SyncObj__raftMatchIndex[f] = 10
        pr = P._Progress()
        pr.probe()
        L._progress[f] = pr
        L._SyncObj__onMessageReceived(f, {"type": "next_node_idx", "next_node_idx": 11, "reset": False,
                                          "success": True, "term": 1, "prev": 10})
        assert not pr.probing and L.progress()["f"]["state"] == "replicate"


def test_an_idle_spell_does_not_put_a_healthy_follower_in_probe():
    """The stall clock counts from the oldest unacknowledged send, not from the last progress:
    after 3 s idle, a new burst is pipelined, not probed."""
    with fake_time() as clock:
        L, nodes = leader([(i, 1) for i in range(1, 11)], 1, 10, clock)
        f = nodes["f"]
        L._SyncObj__raftMatchIndex[f] = 10
        L._SyncObj__sendAppendEntries()  # a heartbeat: nothing to send, nothing in flight
        clock.t += 3.0
        for i in range(11, 20):
            L._SyncObj__raftLog.add(b"x" * ENTRY_BYTES, i, 1)
        L._SyncObj__sendAppendEntries()
        clock.t += 0.11
        L._SyncObj__sendAppendEntries()
        assert not L._progress[f].probing


def test_a_late_heartbeat_keeps_the_entries_the_follower_acknowledged():
    """An append_entries with no entries whose previous entry matches deletes nothing (Raft),
    and commits no further than that entry: pysyncobj dropped everything after it."""
    with fake_time():
        F = follower([(i, 1) for i in range(1, 11)], 10, 1)
        lead = Node("L")
        F._SyncObj__onMessageReceived(lead, {"type": "append_entries", "term": 2, "commit_index": 10,
                                             "prevLogIdx": 10, "prevLogTerm": 1,
                                             "entries": [(b"x", i, 2) for i in range(11, 15)]})
        assert take(F)[-1]["next_node_idx"] == 15
        F._SyncObj__onMessageReceived(lead, {"type": "append_entries", "term": 2, "commit_index": 14,
                                             "prevLogIdx": 10, "prevLogTerm": 1, "entries": []})
        assert log_of(F)[-1] == (14, 2)
        assert F._SyncObj__raftCommitIndex == 10, "commits no further than the entry it vouches for"


@pytest.mark.parametrize("term", [None, 3])
def test_an_answer_of_this_term_or_of_an_older_release_is_taken(term):
    """Answers without a term (a node of an older release) are handled as before."""
    with fake_time() as clock:
        L, nodes = leader([(i, 3) for i in range(1, 11)], 3, 10, clock)
        msg = {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True, "prev": 10}
        if term is not None:
            msg["term"] = term
        L._SyncObj__onMessageReceived(nodes["f"], msg)
        assert L._SyncObj__raftMatchIndex[nodes["f"]] == 10
