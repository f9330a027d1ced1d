"""``ClockGuard``: the members' wall clocks measured on the Raft traffic, and what a member does
about its own when it lies (issue 23: a leader stepped 6 s fast started runs seconds before their
slots, and nothing noticed). The arithmetic is core/clocksync.py; docs/design.md ("Clocks") and
docs/operations.md say what it guarantees.

On the wire, one extra key in two of pysyncobj's messages, which a node that does not know it
ignores (pysyncobj reads the keys it knows), and whose malformed value is ignored here:

- an append_entries from the leader carries ``FIELD: [mono_ms, cluster_ms, err_ms]``: the
  leader's monotonic time when it sent it, and cluster time then with its error (both None
  while the leader cannot judge). At most one message every ``STAMP_EVERY_S`` per follower
  carries it (heartbeats and the first of a burst), so a busy link pays for ~20 a second
  (each answer's sample costs the leader's tick thread ~40 us);
- the answer (next_node_idx) to such a message carries ``FIELD: [mono_ms, wall_ms]``: the
  leader's monotonic time echoed, and the follower's wall time (its node's clock, the one its
  commands are stamped with) when it answered.

The leader turns each answer into a sample of that follower's clock (``clocksync.sample``) and
judges its own clock against the median (``clocksync.judge``); a follower anchors cluster time
on its monotonic clock from the leader's messages and judges its own wall clock against it.
Both are redone on the tick thread every ``LOOK_EVERY_S`` (``tick``) and on demand from any
thread (``reading``): what other threads read is replaced whole, never changed in place.

What a member does with its judgement:

- ``disagrees`` (its wall clock is more than limits.clock_skew_ms_max off the cluster's): it
  logs it once (``clock.disagrees``); the node's trigger fires and expires nothing on it
  (node/trigger.py reads ``reading()``). As leader, it hands its leadership to a connected
  follower whose clock agrees and whose log is complete (pysyncobj's ``transferLeadership``,
  Raft's TimeoutNow), and steps down after ``STEP_DOWN_S`` if that has not happened; if no
  member's clock agrees, it stays, firing nothing: two clocks that disagree cannot tell which
  one lies. And it does not stand for election while it knows (``hold``, for ``HOLD_S`` after
  it last judged so), so it does not win back what it handed over.
- ``unknown``: a leader without fresh estimates from a majority (it cannot commit either), or
  whose majority's clocks are too far apart to tell which one lies (two members left, their
  clocks apart), or a follower that has not heard cluster time for
  ``clocksync.ANCHOR_AGE_MS_MAX``: its trigger waits. A leader that stays so for ``UNKNOWN_S``
  says so (``clock.unknown``, the condition ``cluster.clock_unknown``).
- ``unchecked``: a leader whose majority includes members that answer without the field (a
  version before this one, during a rolling upgrade): it acts on its own clock, as before.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use

from ..core import clocksync, limits
from ..core.clocksync import AGREES, DISAGREES, UNCHECKED, UNKNOWN, Judgement

logger = logging.getLogger("raftsched.replication")

#: The key both messages carry.
FIELD = "rs_clock"
#: A follower's messages carry the leader's clock at most this often (s).
STAMP_EVERY_S = 0.05
#: The tick thread judges this often at most (s).
LOOK_EVERY_S = 0.01
#: A member whose clock disagrees does not stand for election for this long after it last
#: judged so (s): beyond a whole election (raftMaxTimeout), so the others elect one of theirs.
HOLD_S = 3.0
#: A leader whose clock disagrees steps down after this long (s) if handing over has not
#: happened yet (no agreeing follower held its whole log when asked).
STEP_DOWN_S = 1.0
#: How often a leader asks an agreeing follower to stand (pysyncobj's TimeoutNow), at most (s).
TRANSFER_EVERY_S = 0.25
#: Answers without the field, and none with it, that make a peer "unversed" (another version).
UNVERSED_ANSWERS = 3
#: A leader that cannot judge its clock for this long (s) says so: a moment of it is a new term's
#: first heartbeats.
UNKNOWN_S = 2.0

#: pysyncobj's raft states (``_RAFT_STATE``).
_FOLLOWER, _LEADER = 0, 2
#: The pysyncobj internals this module calls beyond those ``_SyncObj`` overrides (``install``
#: checks them too).
RELIED_ON = ("_SyncObj__setState", "transferLeadership", "_SyncObj__getCurrentLogIndex")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ClockGuard:
    """One member's clock guard, attached to its ``_SyncObj`` (``sync``). Every method called by
    the tick thread never raises; ``reading`` and ``view`` may be called from any thread."""

    def __init__(self, sync, wall_ms: Callable[[], int] | None = None,
                 bound_ms: float = limits.clock_skew_ms_max,
                 mono_s: Callable[[], float] | None = None) -> None:
        self._sync = sync
        self._wall = wall_ms or _wall_ms
        self._mono = mono_s or monotonic  # the judgements' (a test's, to stall a thread)
        self.bound_ms = bound_ms
        # Tick thread only.
        self._samples: dict[str, clocksync.PeerSamples] = {}
        self._stamped: dict[object, float] = {}        # node -> monotonic s of its last stamp
        self._answers: dict[str, list[int]] = {}       # peer -> [with the field, without]
        self._next_look = 0.0
        self._last_transfer = 0.0
        self._disagree_since: float | None = None
        self._unknown_since: float | None = None       # leading, and unable to judge, since
        self._unknown_said = False
        self._said: str | None = None                  # the state last logged
        self._peers_said: set[str] = set()             # peers logged as disagreeing
        # Read by other threads: replaced whole.
        self._bests: dict[str, clocksync.Sample] = {}
        self._unversed: frozenset[str] = frozenset()
        self._anchor: clocksync.Anchor | None = None
        #: when a bound far below the anchor was first heard, not yet confirmed (clocksync.observe_confirmed)
        self._anchor_doubt: float | None = None
        self._hold_until = 0.0
        #: a follower's anchor on which it first judged its clock disagreeing, not yet confirmed
        #: on another anchor (None: no such verdict pending)
        self._doubted: clocksync.Anchor | None = None
        self.counters = {"samples": 0, "malformed": 0, "steps_seen": 0, "transfers": 0, "step_downs": 0,
                         "stalled_reads": 0, "unconfirmed": 0}

    # -- the wire (tick thread) ------------------------------------------------------------

    def stamp(self, node, now_s: float) -> list | None:
        """The field for an append_entries to ``node`` (None: this one goes without)."""
        if now_s - self._stamped.get(node, 0.0) < STAMP_EVERY_S:
            return None
        self._stamped[node] = now_s
        mono_ms = now_s * 1000
        cluster = clocksync.anchor_now(self._anchor, mono_ms) if self._anchor_is_own() else None
        a = self._anchor
        return [mono_ms, cluster, None if cluster is None or a is None else a.err_ms]

    def answer_field(self, request_field) -> list | None:
        """The field for the answer to an append_entries that carried ``request_field``."""
        try:
            echo = request_field[0]
        except (TypeError, IndexError, KeyError):
            return None
        if not clocksync.finite_number(echo):
            return None
        try:
            return [echo, self._wall()]
        except Exception:  # noqa: BLE001 - a clock that fails: answer without the field
            return None

    def on_answer(self, peer: str, value, now_s: float) -> None:
        """A follower's answer of this term, on the leader: a sample, or a note that it came
        without the field."""
        try:
            counts = self._answers.setdefault(peer, [0, 0])
            if value is None:
                counts[1] += 1
                if counts[0] == 0 and counts[1] >= UNVERSED_ANSWERS and peer not in self._unversed:
                    self._unversed = self._unversed | {peer}
                return
            counts[0] += 1
            if peer in self._unversed:
                self._unversed = self._unversed - {peer}
            s = None
            if isinstance(value, (list, tuple)) and len(value) == 2:
                s = clocksync.sample(value[0], now_s * 1000, value[1])
            if s is None:
                self.counters["malformed"] += 1
                return
            ps = self._samples.get(peer)
            if ps is None:
                ps = self._samples[peer] = clocksync.PeerSamples()
            if ps.add(s):
                self.counters["steps_seen"] += 1
            self.counters["samples"] += 1
            best = ps.best(s.at_ms)
            if best is not None and self._bests.get(peer) != best:
                self._bests = dict(self._bests, **{peer: best})
        except Exception:  # noqa: BLE001 - never a failure in the message handler
            logger.exception("clock.answer_failed peer=%s", peer)

    def on_append(self, leader: str, value, now_s: float) -> None:
        """An append_entries of the current leader, on a follower: cluster time as it said."""
        try:
            if not isinstance(value, (list, tuple)) or len(value) != 3:
                return
            new, self._anchor_doubt = clocksync.observe_confirmed(self._anchor, self._anchor_doubt, value[1],
                                                                 now_s * 1000, value[2], leader)
            if new is not self._anchor:
                self._anchor = new
        except Exception:  # noqa: BLE001
            logger.exception("clock.append_failed leader=%s", leader)

    def on_become_leader(self) -> None:
        """A new term as leader: whose answers carry the field is learnt again."""
        self._answers = {}
        self._unversed = frozenset()
        self._stamped = {}
        self._disagree_since = None

    # -- judging -------------------------------------------------------------------------------

    def _is_leader(self) -> bool:
        return self._sync._SyncObj__raftState == _LEADER

    def _anchor_is_own(self) -> bool:
        a = self._anchor
        return a is not None and a.source == "self"

    def _pair(self) -> tuple[float, float, float]:
        """This member's monotonic and wall clocks read together (ms), and the reading's error:
        ``clocksync.paired_read``."""
        mono = self._mono
        return clocksync.paired_read(lambda: mono() * 1000, self._wall)

    def reading(self) -> Judgement:
        """This member's clock against the cluster's, now (any thread)."""
        return self._judge(*self._pair())

    def _judge(self, mono_ms: float, wall: float, own_err_ms: float) -> Judgement:
        if self._is_leader():
            sync = self._sync
            voters = {n.id for n in sync._SyncObj__otherNodes}
            members = len(voters) + 1
            # The voters' clocks only: a learner (a machine still being set up) or a server just
            # removed is replicated to and answers, but counts no more for the clock than for a
            # commit (a leader and a learner both ahead would otherwise make the median theirs).
            bests = {p: s for p, s in self._bests.items() if p in voters}
            unversed = len([p for p in self._unversed if p not in bests and p in voters])
            return clocksync.judge(wall, mono_ms, bests, members, self.bound_ms, unversed=unversed,
                                   own_err_ms=own_err_ms)
        return clocksync.judge_by_anchor(wall, mono_ms, self._anchor, self.bound_ms, own_err_ms=own_err_ms)

    def cluster_ms(self, now_s: float | None = None) -> int | None:
        """Cluster time now, as this member knows it (None: it does not)."""
        now_s = monotonic() if now_s is None else now_s
        t = clocksync.anchor_now(self._anchor, now_s * 1000)
        return None if t is None else int(t)

    def holding(self, now_s: float | None = None) -> bool:
        now_s = monotonic() if now_s is None else now_s
        return now_s < self._hold_until

    def tick(self) -> None:
        """The tick callback: judge, anchor cluster time on the leader, log what changed, hand
        over or step down, and hold off candidacy. Never raises."""
        now = monotonic()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY_S
        try:
            self._look(now)
        except Exception:  # noqa: BLE001 - a tick callback that raises stops pysyncobj's tick
            logger.exception("clock.look_failed")

    def _look(self, now: float) -> None:
        mono_ms, wall, own_err_ms = self._pair()
        if own_err_ms > clocksync.PAIR_ERR_MAX_MS:
            # Stalled around every reading of the wall clock: such a judgement could be off by
            # the stall, and a leader that acted on it would hand over for nothing. Next look.
            self.counters["stalled_reads"] += 1
            return
        leader = self._is_leader()
        j = self._judge(mono_ms, wall, own_err_ms)
        if not leader and j.state == DISAGREES and (self._doubted is None or self._doubted is self._anchor):
            # A follower's verdict rests on one anchor, a lower bound from the leader's messages:
            # after its thread stalled, the first messages it handles are old ones, whose bound is
            # low by their age, and it read its own clock as fast by as much (offset_ms ~1 600
            # seen after a 1.6 s stall, holding its candidacy for nothing). It acts only once a
            # later anchor says the same; a fresh message replaces a stale anchor at once.
            if self._doubted is None:
                self.counters["unconfirmed"] += 1
            self._doubted = self._anchor
            self.hold(now)
            return
        if leader or j.state != DISAGREES:
            self._doubted = None
        if leader and j.cluster_ms is not None:
            self._anchor = clocksync.Anchor(j.cluster_ms, j.mono_ms, j.err_ms or 0.0, "self")
            self._anchor_doubt = None
        if leader and j.state == UNKNOWN:
            if self._unknown_since is None:
                self._unknown_since = now
            if now - self._unknown_since >= UNKNOWN_S and not self._unknown_said:
                self._unknown_said = True
                logger.warning("clock.unknown fresh=%d members=%d (this leader cannot tell the cluster's clock: "
                               "too few members heard, or their clocks too far apart to tell which one lies; "
                               "it fires and expires nothing)", len(j.peers) + 1,
                               len(self._sync._SyncObj__otherNodes) + 1)
        else:
            if self._unknown_said:
                logger.info("clock.known state=%s offset_ms=%.0f", j.state, j.offset_ms or 0.0)
            self._unknown_since, self._unknown_said = None, False
        self._say(j, leader)
        if j.state == DISAGREES:
            self._hold_until = now + HOLD_S
            if leader:
                self._hand_over(j, now)
        else:
            self._disagree_since = None
        self.hold(now)

    def hold(self, now_s: float | None = None) -> None:
        """While this member knows its clock disagrees, keep its election deadline ahead (a
        follower's or a candidate's): it does not stand, whatever asked it to (a timeout, a
        staler candidate, a TimeoutNow). Called on every tick and after every message."""
        try:
            sync = self._sync
            now_s = monotonic() if now_s is None else now_s
            if now_s >= self._hold_until or sync._SyncObj__raftState == _LEADER:
                return
            later = now_s + sync._SyncObj__conf.raftMinTimeout
            if sync._SyncObj__raftElectionDeadline < later:
                sync._SyncObj__raftElectionDeadline = later
        except Exception:  # noqa: BLE001
            logger.exception("clock.hold_failed")

    def _hand_over(self, j: Judgement, now: float) -> None:
        sync = self._sync
        if self._disagree_since is None:
            self._disagree_since = now
        connected = sync._SyncObj__connectedNodes
        agreeing = sorted(((abs(j.peers[n.id][0]), n.id, n) for n in sync._SyncObj__otherNodes
                           if n.id in j.peers and abs(j.peers[n.id][0]) <= self.bound_ms and n in connected),
                          key=lambda t: (t[0], t[1]))
        if not agreeing:
            return  # no member's clock agrees either: stay, firing nothing (logged by _say)
        last = sync._SyncObj__getCurrentLogIndex()
        match = sync._SyncObj__raftMatchIndex
        ready = [n for _, _, n in agreeing if match.get(n, 0) == last]
        if ready and now - self._last_transfer >= TRANSFER_EVERY_S:
            self._last_transfer = now
            self.counters["transfers"] += 1
            logger.warning("clock.hand_over to=%s offset_ms=%.0f (this leader's clock disagrees with the "
                           "cluster's; that member's agrees)", ready[0].id, j.offset_ms or 0.0)
            sync.transferLeadership(ready[0])
        if now - self._disagree_since >= STEP_DOWN_S and sync._SyncObj__raftState == _LEADER:
            # Handing over did not happen: step down as pysyncobj does when it loses its quorum;
            # the others elect one of theirs (this member holds off its candidacy).
            self.counters["step_downs"] += 1
            logger.warning("clock.step_down offset_ms=%.0f agreeing=%s", j.offset_ms or 0.0,
                           ",".join(i for _, i, _ in agreeing))
            sync._role_cause = "clock_step_down"  # why, for the role change's log and metric
            try:
                sync._SyncObj__setState(_FOLLOWER)
            finally:
                sync._role_cause = None
            sync._SyncObj__raftLeader = None
            self._disagree_since = None

    def _say(self, j: Judgement, leader: bool) -> None:
        """Log the transitions: this member's clock, and (on the leader) each peer's."""
        state = j.state
        if state == DISAGREES and self._said != DISAGREES:
            logger.warning("clock.disagrees role=%s offset_ms=%.0f err_ms=%.0f bound_ms=%.0f (this node's wall "
                           "clock is off the cluster's median: it fires and expires nothing, hands its "
                           "leadership to a member whose clock agrees, and does not stand for election)",
                           "leader" if leader else "follower", j.offset_ms or 0.0, j.err_ms or 0.0, self.bound_ms)
        elif state == AGREES and self._said == DISAGREES:
            logger.info("clock.agrees offset_ms=%.0f err_ms=%.0f", round(j.offset_ms or 0.0), j.err_ms or 0.0)
        elif state == UNCHECKED and self._said != UNCHECKED:
            logger.warning("clock.unchecked: too few members answer with their clocks (another version?): "
                           "this leader fires by its own clock")
        if state != UNKNOWN or self._said == UNCHECKED:
            self._said = state
        if not leader:
            self._peers_said = set()
            return
        for p, (off, err) in sorted(j.peers.items()):
            if abs(off) > self.bound_ms and p not in self._peers_said:
                self._peers_said.add(p)
                logger.warning("clock.peer_disagrees peer=%s offset_ms=%.0f err_ms=%.0f bound_ms=%.0f", p, off,
                               err, self.bound_ms)
            elif abs(off) <= self.bound_ms and p in self._peers_said:
                self._peers_said.discard(p)
                logger.info("clock.peer_agrees peer=%s offset_ms=%.0f", p, off)

    def view(self, now_s: float | None = None) -> dict:
        """What ``/v1/cluster`` shows as ``clock`` (any thread), and the conditions it implies:
        ``cluster.clock_disagrees`` for this member (``node: "self"``) and, on the leader, for
        each member whose clock it measured beyond the bound."""
        now_s = monotonic() if now_s is None else now_s
        j = self.reading()
        a = self._anchor

        def ms(v):
            return None if v is None else round(v)

        out = {
            "state": j.state, "offset_ms": ms(j.offset_ms), "error_ms": ms(j.err_ms),
            "bound_ms": ms(self.bound_ms), "cluster_ms": ms(j.cluster_ms),
            "source": None if a is None else a.source,
            "candidacy_held": self.holding(now_s),
            "peers": {p: {"offset_ms": ms(off), "error_ms": ms(err)} for p, (off, err) in j.peers.items()},
            **self.counters,
        }
        conditions = []
        since = self._unknown_since
        if j.state == UNKNOWN and since is not None and now_s - since >= UNKNOWN_S and self._is_leader():
            conditions.append({"type": "cluster.clock_unknown", "node": "self", "for_s": round(now_s - since, 3),
                               "peers_heard": len(j.peers)})
        if j.state == DISAGREES:
            conditions.append({"type": "cluster.clock_disagrees", "node": "self", "offset_ms": ms(j.offset_ms),
                               "error_ms": ms(j.err_ms), "bound_ms": ms(self.bound_ms)})
        for p, (off, err) in sorted(j.peers.items()):
            if abs(off) > self.bound_ms:
                conditions.append({"type": "cluster.clock_disagrees", "node": p, "offset_ms": ms(off),
                                   "error_ms": ms(err), "bound_ms": ms(self.bound_ms)})
        out["conditions"] = conditions
        return out


__all__ = ["FIELD", "ClockGuard", "AGREES", "DISAGREES", "UNKNOWN", "UNCHECKED"]
