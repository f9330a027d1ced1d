"""``ReplicationWatch``: whether this node's log keeps up, as the node itself and the leader see
it (issue 20: a deposed leader's commit index stayed frozen for minutes and nothing said so).

Run on pysyncobj's tick thread (a tick callback), read from the event loop (``view``):

- On every node: the commit index, the leader's commit index as the leader's last message told
  it, and how long this node's commit index has not advanced while the leader's was ahead
  (``commit_stalled_s``).
- On the leader: each follower's match and next index, how far its match index is behind the
  leader's log (``lag_entries``), the walk-back state of ``_progress.py`` (probe or replicate,
  bytes in flight, rejections, stale answers ignored), and how long its match index has been
  below the commit index without advancing (``stalled_s``).

A stall longer than ``STALL_S`` is a condition, ``cluster.follower_stalled`` (``conditions``),
logged once as a warning when it starts (``replication.follower_stalled`` on the leader,
``replication.commit_stalled`` on the stalled node) and once when it ends.

Two more conditions of this node's own: ``cluster.no_leader`` once it has known no leader for
``NO_LEADER_S`` (longer than an election: the majority is gone, or this node is cut off from
it), and ``cluster.not_a_member`` while it is neither a voter nor a learner of the latest
configuration (removed while it still runs, or started with ``--join`` and not added yet): a
survivor of a lost quorum and a removed node each said ``conditions: []``.
"""
from __future__ import annotations

import logging

from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use

logger = logging.getLogger("raftsched.replication")

#: Seconds a commit (or a follower's match) index may stay behind the leader's without advancing
#: before it is a condition. A healthy follower is within a heartbeat (0.1 s) of the leader; one
#: that installs a large snapshot can take a few seconds (1M jobs: ~6 s to load), so 10 s.
STALL_S = 10.0
#: Seconds without a known leader before it is a condition: an election after a leader's death
#: takes about a second (docs/benchmarks.md, fail-over), so this is no election but an outage.
NO_LEADER_S = 3.0
#: Seconds without a known leader before this node logs it, once, with what may be wrong (a walk:
#: a node started without --join beside a running cluster stood for election for minutes, its
#: term climbing, and its log said nothing after "role=candidate").
NO_LEADER_LOG_S = 30.0
#: How often the tick callback looks (it runs on every tick).
_EVERY_S = 0.1


class ReplicationWatch:
    def __init__(self, sync) -> None:
        self._sync = sync
        self._next = 0.0
        now = monotonic()
        self._commit = -1
        self._commit_at = now
        self._stalled_since: float | None = None      # this node's commit, behind the leader's
        self._no_leader_since: float | None = now      # no leader known since (None: one is)
        self._no_leader_warned = False
        self._follower_seen: dict[str, tuple[int, float]] = {}  # id -> (match, since)
        self._followers_warned: set[str] = set()
        self._view: dict = {"commit_stalled_s": 0.0, "leader_commit_index": 0, "followers": {},
                            "no_leader_s": 0.0, "member": True}

    def tick(self) -> None:
        now = monotonic()
        if now < self._next:
            return
        self._next = now + _EVERY_S
        try:
            self._look(now)
        except Exception:  # noqa: BLE001 - a tick callback that raises stops pysyncobj's tick
            logger.exception("replication.watch_failed")

    def _look(self, now: float) -> None:
        sync = self._sync
        commit = sync.raftCommitIndex
        leader_commit = sync._SyncObj__leaderCommitIndex or 0
        behind = leader_commit > commit
        if commit != self._commit or not behind:
            # The stall clock counts from when this node fell behind, or last moved.
            self._commit, self._commit_at = commit, now
        stalled_s = now - self._commit_at if behind else 0.0
        if stalled_s > STALL_S and self._stalled_since is None:
            self._stalled_since = self._commit_at
            logger.warning("replication.commit_stalled commit=%d leader_commit=%d for_s=%.1f "
                           "(this node's log is not catching up with the leader's)",
                           commit, leader_commit, stalled_s)
        elif stalled_s <= STALL_S and self._stalled_since is not None:
            logger.info("replication.commit_resumed commit=%d after_s=%.1f", commit,
                        now - self._stalled_since)
            self._stalled_since = None
        followers = {}
        for peer, p in sync.progress().items():
            match = p["match_index"]
            seen = self._follower_seen.get(peer)
            if seen is None or match != seen[0] or match >= commit:
                seen = self._follower_seen[peer] = (match, now)
            f_stalled = now - seen[1] if match < commit else 0.0
            if f_stalled > STALL_S and peer not in self._followers_warned:
                self._followers_warned.add(peer)
                logger.warning("replication.follower_stalled peer=%s match=%d commit=%d for_s=%.1f "
                               "state=%s rejections=%d", peer, match, commit, f_stalled,
                               p["state"], p["rejections"])
            elif f_stalled <= STALL_S and peer in self._followers_warned:
                self._followers_warned.discard(peer)
                logger.info("replication.follower_resumed peer=%s match=%d", peer, match)
            followers[peer] = dict(p, lag_entries=max(0, sync._SyncObj__getCurrentLogIndex() - match),
                                   stalled_s=round(f_stalled, 3))
        if not followers:
            self._follower_seen.clear()
            self._followers_warned.clear()
        if sync._getLeader() is None:
            if self._no_leader_since is None:
                self._no_leader_since = now
        else:
            self._no_leader_since = None
        no_leader_s = 0.0 if self._no_leader_since is None else now - self._no_leader_since
        view = sync.members_view()
        if no_leader_s > NO_LEADER_LOG_S and not self._no_leader_warned:
            self._no_leader_warned = True
            if view is not None and view.get("self") == "none":
                why = ("this node is no member of the configuration it knows: removed (stop it), or started with "
                       "--join and not added yet (raftsched members add)")
            else:
                why = ("no majority of the members answers this node: are they running, and does --peers name them "
                       "as they name each other? A node added to a running cluster is started with --join on an "
                       "empty --data-dir, then added with raftsched members add")
            logger.warning("replication.no_leader for_s=%.0f term=%s (%s)", no_leader_s,
                           getattr(sync, "raftCurrentTerm", None), why)
        elif self._no_leader_since is None and self._no_leader_warned:
            self._no_leader_warned = False
            logger.info("replication.leader_known (after the outage logged as replication.no_leader)")
        self._view = {"commit_stalled_s": round(stalled_s, 3), "leader_commit_index": leader_commit,
                      "followers": followers, "no_leader_s": round(no_leader_s, 3),
                      "member": view is None or view.get("self") != "none"}

    def view(self) -> dict:
        """The last look (at most ``_EVERY_S`` old), with the conditions it implies; each
        follower's ``last_heard_s`` (seconds since the leader last had an answer of it this term,
        None before its first) aged now, from the look's ``heard_at``."""
        v = self._view
        if any("heard_at" in f for f in v["followers"].values()):
            now = monotonic()
            v = dict(v, followers={
                peer: {**{k: x for k, x in f.items() if k != "heard_at"},
                       "last_heard_s": None if f.get("heard_at") is None else round(max(0.0, now - f["heard_at"]), 3)}
                for peer, f in v["followers"].items()})
        conditions = []
        if v["commit_stalled_s"] > STALL_S:
            conditions.append({"type": "cluster.follower_stalled", "node": "self",
                               "for_s": v["commit_stalled_s"]})
        for peer, f in sorted(v["followers"].items()):
            if f["stalled_s"] > STALL_S:
                conditions.append({"type": "cluster.follower_stalled", "node": peer,
                                   "for_s": f["stalled_s"], "match_index": f["match_index"]})
        if v["no_leader_s"] > NO_LEADER_S:
            conditions.append({"type": "cluster.no_leader", "node": "self", "for_s": v["no_leader_s"]})
        if not v["member"]:
            conditions.append({"type": "cluster.not_a_member", "node": "self"})
        return dict(v, conditions=conditions)
