"""raftsched/replication/_watch.py: a stalled commit index, or a stalled follower, becomes a
condition after STALL_S and stops being one when it advances; fed by a fake SyncObj and a fake
clock (no network, no real time)."""
from __future__ import annotations

import logging

import pytest

from raftsched.replication import _watch
from raftsched.replication._watch import STALL_S, ReplicationWatch


class FakeSync:
    def __init__(self):
        self.raftCommitIndex = 10
        self._SyncObj__leaderCommitIndex = 10
        self.last = 10
        self.followers: dict[str, dict] = {}
        self.leader: object | None = object()  # a node (its id is not read here)
        self.member = "voter"

    def _SyncObj__getCurrentLogIndex(self):
        return self.last

    def _getLeader(self):
        return self.leader

    def members_view(self):
        return {"self": self.member}

    def progress(self):
        return {peer: dict(f) for peer, f in self.followers.items()}


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(_watch, "monotonic", lambda: now[0])
    return now


def _look(w: ReplicationWatch, clock, dt: float) -> dict:
    clock[0] += dt
    w.tick()
    return w.view()


def test_a_follower_whose_commit_stays_behind_the_leaders_is_a_condition(clock, caplog):
    sync = FakeSync()
    w = ReplicationWatch(sync)
    assert _look(w, clock, 0.2)["conditions"] == []
    sync._SyncObj__leaderCommitIndex = 50  # the leader moves on; this node's commit does not
    v = _look(w, clock, STALL_S / 2)
    assert v["conditions"] == [] and v["commit_stalled_s"] == pytest.approx(STALL_S / 2)  # since first seen
    with caplog.at_level(logging.WARNING, logger="raftsched.replication"):
        v = _look(w, clock, STALL_S / 2 + 1)
    assert [c["type"] for c in v["conditions"]] == ["cluster.follower_stalled"]
    assert v["conditions"][0]["node"] == "self"
    assert "replication.commit_stalled" in caplog.text
    sync.raftCommitIndex = 50  # it catches up
    v = _look(w, clock, 0.2)
    assert v["conditions"] == [] and v["commit_stalled_s"] == 0


def test_an_idle_cluster_is_never_stalled(clock):
    sync = FakeSync()
    sync.followers = {"b": {"match_index": 10, "next_index": 11, "state": "replicate",
                            "inflight_bytes": 0, "last_ack_age_s": 0.0, "rejections": 0,
                            "stale_answers": 0}}
    w = ReplicationWatch(sync)
    v = _look(w, clock, 10 * STALL_S)
    assert v["conditions"] == [] and v["followers"]["b"]["stalled_s"] == 0


def test_the_leader_reports_a_follower_whose_match_index_does_not_advance(clock, caplog):
    sync = FakeSync()
    f = {"match_index": 10, "next_index": 11, "state": "replicate", "inflight_bytes": 0,
         "last_ack_age_s": 0.0, "rejections": 0, "stale_answers": 0}
    sync.followers = {"b": f, "c": dict(f)}
    w = ReplicationWatch(sync)
    _look(w, clock, 0.2)
    for _ in range(int(STALL_S) + 2):  # the log and commit move on; b keeps up, c does not
        sync.last += 10
        sync.raftCommitIndex = sync._SyncObj__leaderCommitIndex = sync.last
        sync.followers["b"]["match_index"] = sync.last
        with caplog.at_level(logging.WARNING, logger="raftsched.replication"):
            v = _look(w, clock, 1.0)
    assert [(c["type"], c["node"]) for c in v["conditions"]] == [("cluster.follower_stalled", "c")]
    assert v["followers"]["c"]["lag_entries"] == sync.last - 10
    assert v["followers"]["b"]["lag_entries"] == 0
    assert "replication.follower_stalled peer=c" in caplog.text
    sync.followers["c"]["match_index"] = sync.last
    assert _look(w, clock, 0.2)["conditions"] == []


def test_a_watch_that_fails_does_not_stop_the_tick(clock, caplog):
    class Broken(FakeSync):
        def progress(self):
            raise RuntimeError("boom")
    w = ReplicationWatch(Broken())
    clock[0] += 1
    w.tick()  # logged, not raised: an exception in a tick callback would stop pysyncobj's tick
    assert "replication.watch_failed" in caplog.text


def test_a_follower_that_only_just_fell_behind_after_an_idle_spell_is_not_stalled(clock):
    """The stall clock counts from when the node fell behind, not from when its commit index
    last moved: an idle minute, then one entry behind, is not a minute's stall."""
    sync = FakeSync()
    w = ReplicationWatch(sync)
    _look(w, clock, 0.2)
    _look(w, clock, 60.0)  # idle: commit == the leader's
    sync._SyncObj__leaderCommitIndex = 11
    v = _look(w, clock, 0.2)
    assert v["conditions"] == [] and v["commit_stalled_s"] < 1.0


def test_no_leader_for_longer_than_an_election_is_a_condition_until_one_is_known(clock):
    """A survivor of a lost quorum said ``conditions: []`` (and the dashboard "healthy")."""
    sync = FakeSync()
    w = ReplicationWatch(sync)
    assert _look(w, clock, 0.2)["conditions"] == []
    sync.leader = None
    assert _look(w, clock, 0.1)["conditions"] == []  # (seen from here)
    assert _look(w, clock, _watch.NO_LEADER_S - 0.5)["conditions"] == [], "an election is no outage"
    v = _look(w, clock, 1.0)
    assert [(c["type"], c["node"]) for c in v["conditions"]] == [("cluster.no_leader", "self")]
    assert v["conditions"][0]["for_s"] == pytest.approx(_watch.NO_LEADER_S + 0.5)
    sync.leader = object()
    assert _look(w, clock, 0.2)["conditions"] == []


def test_a_node_started_without_a_leader_counts_from_its_start(clock):
    sync = FakeSync()
    sync.leader = None
    w = ReplicationWatch(sync)
    assert [c["type"] for c in _look(w, clock, _watch.NO_LEADER_S + 0.2)["conditions"]] == ["cluster.no_leader"]


def test_a_node_that_is_no_member_says_so(clock):
    """A node removed while it still runs answered /healthz 200 with conditions []."""
    sync = FakeSync()
    w = ReplicationWatch(sync)
    sync.member = "none"
    assert _look(w, clock, 0.2)["conditions"] == [{"type": "cluster.not_a_member", "node": "self"}]
    sync.member = "learner"
    assert _look(w, clock, 0.2)["conditions"] == []


def test_no_leader_for_long_is_logged_once_with_what_may_be_wrong_and_its_end(clock, caplog):
    """A walk: a node started without --join beside a running cluster stood for election for
    minutes, and its log said nothing after role=candidate."""
    sync = FakeSync()
    sync.leader = None
    sync.raftCurrentTerm = 60
    w = ReplicationWatch(sync)
    with caplog.at_level(logging.INFO, logger="raftsched.replication"):
        _look(w, clock, _watch.NO_LEADER_LOG_S - 1)
        assert not caplog.records
        for _ in range(3):
            _look(w, clock, 1.0)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and said[0].startswith("replication.no_leader for_s=31 term=60") and "--join" in said[0]
        sync.leader = object()
        _look(w, clock, 0.2)
        _look(w, clock, 0.2)
        assert [r.getMessage().split()[0] for r in caplog.records] == ["replication.no_leader",
                                                                      "replication.leader_known"]


def test_a_node_no_member_of_what_it_knows_is_told_so_when_it_has_no_leader(clock, caplog):
    sync = FakeSync()
    sync.leader = None
    sync.member = "none"
    w = ReplicationWatch(sync)
    with caplog.at_level(logging.WARNING, logger="raftsched.replication"):
        _look(w, clock, _watch.NO_LEADER_LOG_S + 1)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "no member of the configuration it knows" in said and "raftsched members add" in said, said
