"""Online membership change: a node added as a learner that votes only once it holds the log,
one change at a time, decided by the leader and in force from the moment it is in a node's log
(docs/design.md, "Membership"; docs/operations.md, "Changing the members").

pysyncobj's own (``dynamicMembershipChange``) stays off, and refused as an option
(conf.py), for five faults of its 0.3.17:

- its one-change-at-a-time guard is dead code (``__changeClusterIDx`` is never set), so a
  second change can enter the log before the first commits, and two configurations that differ
  by two servers can then be in use at once: two disjoint majorities, two leaders of one term;
- it applies a change on append and again on commit, over any newer change appended since
  (add X then remove X: the commit of "add X" adds X back on every node);
- a full dump's member list replaces a node's view at load (its issue 133), and that list is
  the view when the dump was *written*, which counts changes after the dump's index (appended,
  perhaps never committed), while the changes before it in the journal are not replayed;
- it has no learners: a new server counts toward commits and elections from the moment it is
  added, before it holds a single entry;
- a leader that removes itself counts its own vote toward the commit of its removal.

What is here instead, after the Raft thesis (section 4: single-server changes, each in force in
a node's log from the moment it is appended) with etcd's learners and its strict
reconfiguration check and hashicorp/raft's one uncommitted change:

- A configuration is ``voters`` and ``learners``, written whole in a log entry of its own type
  (``CONFIG_ENTRY``: a type byte pysyncobj does not know, which it replicates, commits and
  applies as a no-op). A node uses the latest configuration in its log, committed or not; a
  truncation takes its entries back with it. ``MembershipLog`` keeps them by index over a base:
  the configuration in force where the log begins, which a full dump records as of its own
  index (``_StateConsumer._serialize``) and the command line gives a node that has neither.
  So a node's view after a restart is exactly its log's, whatever its ``--peers`` say.
- Only the leader appends one, and only after its term's first entry and the previous
  configuration entry are committed (``decide``): one change at a time, serialised by the
  leader's tick thread. A request on another node is forwarded to the leader. Requests are
  declarative ("X is a member", "X is not a member"), so a retry after an unknown outcome is
  safe: it finds the change made, or waits for the same entry to commit, or makes it.
- ``add`` makes a learner: replicated to, never counted in a commit or an election, never a
  candidate (``is_voter``). The leader promotes it to a voter once it holds every committed
  entry and answers (``promotion``). A node that joins on an empty data directory may find
  itself a voter in its log's older configurations (its address was a member once, and was
  removed): it counts itself a voter only through a configuration entry after the commit index
  of the first message a leader sent it (``JoinMarker``), which the entries of its address's
  earlier life all precede, and its own promotion follows.
- ``remove`` of a voter is refused when the voters left would have no quorum of answering
  nodes. A leader asked to remove itself first hands its leadership to a caught-up voter
  (pysyncobj's ``transferLeadership``); the new leader removes it. A leader keeps replicating
  to a server it removed until the removal commits, so that the server learns it is out.

``MembershipMixin`` is the part of ``_SyncObj`` that does this on pysyncobj's tick thread;
``decide``, ``promotion`` and ``MembershipLog`` are pure.
"""
from __future__ import annotations

import collections
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use
from pysyncobj.node import TCPNode

from ._disk import Disk

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: The type byte of a configuration entry (pysyncobj's own are 0-3; it replicates an entry of
#: another type and applies it as a no-op).
CONFIG_ENTRY = 0x10
_PREFIX = bytes([CONFIG_ENTRY])
#: Members (voters and learners) a cluster may have: a change past it is refused.
MEMBERS_MAX = 9
#: A leader asked to remove itself hands its leadership over at most this often.
TRANSFER_RETRY_S = 1.0
#: A request forwarded to the leader that has no answer after this long is tried again.
FORWARD_TIMEOUT_S = 2.0
#: A leader keeps sending heartbeats to a server it removed for this long after the removal
#: commits, so that the server hears of the commit (each heartbeat carries the commit index).
LINGER_S = 2.0
#: The messages of the forwarding (a stock pysyncobj ignores a type it does not know).
REQUEST_MESSAGE = "raftsched_members"
ANSWER_MESSAGE = "raftsched_members_answer"

OPS = ("add", "remove")


def check_addr(addr: Any) -> str:
    """A member's Raft address, ``host:port`` with a port in 1..65535.

    :raises ValueError: naming what is wrong.
    """
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"a member is 'host:port', got {addr!r}")
    host, port_s = addr.rsplit(":", 1)
    if not host or any(c.isspace() or c in ",/" for c in host) or len(addr) > 255:
        raise ValueError(f"a member is 'host:port', got {addr!r}")
    if not (port_s.isascii() and port_s.isdigit()) or not 0 < int(port_s) < 65536:
        raise ValueError(f"a member's port is 1..65535, got {addr!r}")
    return addr


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass(frozen=True)
class Config:
    """A configuration: the voters and the learners, each sorted, disjoint."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    @classmethod
    def of(cls, voters, learners=()) -> Config:
        v = tuple(sorted(set(voters)))
        return cls(v, tuple(sorted(set(learners) - set(v))))

    @property
    def members(self) -> frozenset[str]:
        return frozenset(self.voters) | frozenset(self.learners)

    def role(self, addr: str) -> str | None:
        if addr in self.voters:
            return "voter"
        if addr in self.learners:
            return "learner"
        return None

    def to_dict(self) -> dict:
        return {"voters": list(self.voters), "learners": list(self.learners)}

    @classmethod
    def from_dict(cls, d: Any) -> Config | None:
        """The configuration a dump or an entry holds, or None when it holds none readable."""
        try:
            voters, learners = d["voters"], d.get("learners", [])
            if not isinstance(voters, list) or not isinstance(learners, list) or not voters:
                return None
            for a in voters + learners:
                check_addr(a)
            return cls.of(voters, learners)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def encode_entry(cfg: Config, change: dict) -> bytes:
    """A configuration entry's bytes (the type byte, then JSON)."""
    body = dict(cfg.to_dict(), v=1, change=change)
    return _PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(data: Any) -> tuple[Config, dict] | None:
    """``(configuration, change)`` of a log entry's bytes, or None when it is no configuration
    entry. One that cannot be read is logged and ignored alike on every node."""
    if not isinstance(data, (bytes, bytearray)) or data[:1] != _PREFIX:
        return None
    try:
        body = json.loads(bytes(data[1:]))
        cfg = Config.from_dict(body)
        change = body.get("change") if isinstance(body.get("change"), dict) else {}
    except (ValueError, AttributeError):
        cfg = None
    if cfg is None:
        logger.critical("replication.config_entry_unreadable bytes=%d (ignored)", len(data))
        return None
    return cfg, change


# ------------------------------------------------------------------ the configurations in a log

@dataclass(frozen=True)
class ConfigEntry:
    index: int
    term: int
    config: Config
    change: dict = field(compare=False, default_factory=dict)


class MembershipLog:
    """The configurations of one node's log: ``base``, in force where the log begins (at
    ``base_index``: a full dump's last entry, 0 for the command line's), and each configuration
    entry after it, by index. The latest is the one in use (Raft thesis 4.1). ``config_index``:
    the log entry ``base`` came from, as far as known (a dump records it; 0 for the command
    line's, or a dump that predates it), what the view shows as the configuration's index."""

    def __init__(self, base: Config, base_index: int = 0, config_index: int = 0) -> None:
        self.base = base
        self.base_index = base_index
        self.config_index = config_index
        self.entries: list[ConfigEntry] = []

    @property
    def latest_index(self) -> int:
        """The index of the entry the latest configuration comes from (``base_index`` for the base)."""
        return self.entries[-1].index if self.entries else self.base_index

    @property
    def latest(self) -> Config:
        return self.entries[-1].config if self.entries else self.base

    @property
    def last_entry(self) -> ConfigEntry | None:
        return self.entries[-1] if self.entries else None

    def at(self, index: int) -> Config:
        """The configuration in force at ``index`` (committed at it, when it is committed)."""
        e = self.entry_at(index)
        return self.base if e is None else e.config

    def entry_at(self, index: int) -> ConfigEntry | None:
        for e in reversed(self.entries):
            if e.index <= index:
                return e
        return None

    def append(self, e: ConfigEntry) -> None:
        while self.entries and self.entries[-1].index >= e.index:
            self.entries.pop()  # the log replaced it (a caller missed the truncation)
        self.entries.append(e)

    def truncate_from(self, index: int) -> bool:
        """Entries at ``index`` and after are gone from the log; True when one was a configuration."""
        n = len(self.entries)
        while self.entries and self.entries[-1].index >= index:
            self.entries.pop()
        return len(self.entries) != n

    def compact_below(self, first: int) -> None:
        """The log now begins at ``first``: the entries before it fold into the base."""
        old = [e for e in self.entries if e.index < first]
        if old:
            self.base, self.base_index = old[-1].config, old[-1].index
            self.config_index = old[-1].index
            self.entries = [e for e in self.entries if e.index >= first]


# ------------------------------------------------------------------ the leader's rules (pure)

@dataclass(frozen=True)
class Decision:
    """What the leader does with one request.

    ``kind``: ``done`` (the configuration already is what was asked: nothing to append),
    ``append`` (append ``config``), ``wait`` (the uncommitted entry ``pending`` makes what was
    asked: wait for it), ``transfer`` (the leader removes itself: hand leadership over first),
    ``retry`` (not now: the leader's first entry is not committed yet) or ``refused`` (with
    ``code`` and ``message``).
    """

    kind: str
    config: Config | None = None
    change: dict | None = None
    code: str = ""
    message: str = ""


def decide(op: str, addr: str, *, me: str, latest: Config, pending: ConfigEntry | None,
           noop_committed: bool, reachable: frozenset[str],
           members_max: int = MEMBERS_MAX) -> Decision:
    """The leader's decision on ``op`` (``add``, ``remove``) of ``addr``.

    :param me: the leader's address.
    :param latest: the latest configuration in its log.
    :param pending: the configuration entry not committed yet, or None.
    :param noop_committed: whether the entry the leader appended when elected is committed
        (Raft thesis, 4.1 and its errata: a change before it could follow an uncommitted change
        of an older term).
    :param reachable: the voters the leader heard from lately, itself included.
    """
    if op not in OPS:
        return Decision("refused", code="invalid", message=f"unknown membership operation {op!r}")
    try:
        check_addr(addr)
    except ValueError as e:
        return Decision("refused", code="invalid", message=str(e))
    want = (lambda c: addr in c.members) if op == "add" else (lambda c: addr not in c.members)
    if want(latest):
        if pending is not None:
            return Decision("wait", config=latest)
        return Decision("done", config=latest)
    if pending is not None:
        what = pending.change.get("op", "a change")
        return Decision("refused", code="conflict", message=(
            f"a membership change is in progress ({what} {pending.change.get('node', '')}, log index "
            f"{pending.index}, not committed yet): one change at a time; retry once it is committed"))
    if not noop_committed:
        return Decision("retry", message="the leader was elected moments ago and its first entry is not "
                                         "committed yet")
    if op == "add":
        if len(latest.members) >= members_max:
            return Decision("refused", code="conflict", message=(
                f"the cluster has {len(latest.members)} members, the most it may have ({members_max})"))
        return Decision("append", config=Config.of(latest.voters, (*latest.learners, addr)),
                        change={"op": "add_learner", "node": addr})
    if addr in latest.learners:
        return Decision("append", config=Config.of(latest.voters, set(latest.learners) - {addr}),
                        change={"op": "remove", "node": addr})
    remaining = set(latest.voters) - {addr}
    if not remaining:
        return Decision("refused", code="conflict", message=f"{addr} is the only voter: a cluster needs one")
    # (before a leader hands its leadership over to remove itself: a removal refused must change
    # nothing, and a walk saw a refused one move the leadership, a new term and its events)
    answering = len(remaining & reachable)
    if answering < majority(len(remaining)):
        return Decision("refused", code="conflict", message=(
            f"removing {addr} would leave {len(remaining)} voters of which {answering} answer the leader: "
            f"{majority(len(remaining))} are needed to commit anything. Bring the others back first "
            f"(or remove a voter that does not answer)"))
    if addr == me:
        return Decision("transfer")
    return Decision("append", config=Config.of(remaining, latest.learners),
                    change={"op": "remove", "node": addr})


def promotion(latest: Config, *, pending: ConfigEntry | None, noop_committed: bool, commit_index: int,
              learners: dict[str, tuple[int, float]], reachable: frozenset[str],
              answered_within_s: float) -> tuple[str, Config] | None:
    """The learner to make a voter now, and the configuration that does, or None.

    A learner is promoted once it holds every committed entry (its match index at the commit
    index) and answered within ``answered_within_s``, one change at a time, and only when the
    voters then, the learner included, have a quorum of answering nodes.

    :param learners: each learner's ``(match index, seconds since its last answer)``.
    """
    if pending is not None or not noop_committed:
        return None
    for addr in latest.learners:
        match, age = learners.get(addr, (0, float("inf")))
        if match < commit_index or age > answered_within_s:
            continue
        voters = (*latest.voters, addr)
        if len((set(voters) & reachable) | {addr}) < majority(len(voters)):
            continue
        return addr, Config.of(voters, set(latest.learners) - {addr})
    return None


# ------------------------------------------------------------------ a joining node's marker

class JoinMarker:
    """``raft.join`` in a joining node's data directory: written when the node starts with
    ``--join`` on an empty data directory, and kept. ``after`` is the commit index carried by
    the first append_entries a leader sent the node, written before the node answers it: every
    configuration entry of an earlier life of its address (a member once, removed since) is at
    or before it (that removal committed before the add that made this node a learner, and the
    leader's commit index only grows), and the promotion of this node comes after it (the leader
    promotes a learner only once it answered). None until then."""

    FILE = "raft.join"

    def __init__(self, path: str, after: int | None = None, disk: Disk | None = None) -> None:
        self.path = path
        self.after = after
        #: written through the node's disk (durable and atomic: _disk.Disk.write_file)
        self.disk = disk if disk is not None else Disk(fsync=True)

    @classmethod
    def open(cls, data_dir: str, join: bool, fresh: bool, disk: Disk | None = None) -> JoinMarker | None:
        """The marker of a node in ``data_dir``: the one written there, a new one for a node
        that joins on an empty directory (``fresh``), else None (a node of its own history)."""
        path = os.path.join(data_dir, cls.FILE)
        try:
            with open(path) as f:
                after = json.load(f).get("after")
            return cls(path, after if isinstance(after, int) else None, disk)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError):
            logger.critical("replication.join_marker_unreadable path=%s (the node waits for a leader's first "
                            "message again)", path)
            return cls(path, None, disk)
        if not (join and fresh):
            return None
        marker = cls(path, None, disk)
        marker.write()
        return marker

    def write(self) -> None:
        self.disk.write_file(self.path, json.dumps({"after": self.after}).encode())

    def note_leader(self, commit_index: Any) -> None:
        """A leader's append_entries, before it is answered: the first sets ``after``."""
        if self.after is None and isinstance(commit_index, int):
            self.after = commit_index
            self.write()
            logger.info("replication.join_first_leader_message commit_index=%d (this node counts itself a voter "
                        "only through a configuration after it)", commit_index)


# ------------------------------------------------------------------ on pysyncobj's tick thread

_FOLLOWER, _LEADER = 0, 2

#: An outcome handed to a request's callback: ("done", view, changed) (changed: the attempt
#: appended the entry that made it, or waited for one), ("refused", code, message) or ("retry",
#: why, may_have_applied).
Outcome = tuple


class MembershipMixin:
    """The membership side of ``_SyncObj``. Every method runs on pysyncobj's tick thread, but
    ``submit_member_change`` (any thread) and ``members_view`` (a published snapshot).

    Every attribute is set in ``_members_setup``, before ``SyncObj.__init__``: pysyncobj writes
    an attribute created later into each full dump (``__tryLogCompaction``), and restores it."""

    def _members_setup(self, self_addr: str, peers, join: bool, marker: JoinMarker | None = None) -> None:
        #: The configuration of a node whose log and dump hold none: its command line. A node
        #: that joins a running cluster is not in it: it waits to be added.
        self._members_cmdline = Config.of(list(peers) + ([] if (join or marker) else [self_addr]))
        #: A joining node's marker (JoinMarker), None for any other.
        self._members_join = marker
        self._mlog: MembershipLog | None = None
        #: The configuration pysyncobj and the transport use (the command line's at first).
        self._members_in_force = self._members_cmdline
        #: Every node a leader sends entries to beyond pysyncobj's voters (_replication_targets).
        self._member_targets: set = set()
        #: The base the last full dump loaded holds (None: that dump predates membership), that
        #: dump's last index, and the index of the entry its base came from (0: not recorded).
        self._members_dump_base: Config | None = None
        self._members_dump_index = 0
        self._members_dump_config_index = 0
        self._members_scanned = 0
        #: The log's first index when the configurations were last folded (a compaction).
        self._members_first = 0
        #: (latest entry index, committed entry index, leader?) when the configuration was last
        #: put in force: _member_tick puts it in force again when one of them moves.
        self._members_applied: tuple | None = None
        self._members_published: dict | None = None
        #: Servers the leader dropped from its configurations, linked until then (LINGER_S).
        self._members_linger: dict[str, float] = {}
        #: A follower kept links its configuration drops while its log was behind.
        self._members_prune_later = False
        self._members_was_member = False
        #: Requests from other threads (a deque: append and popleft are thread-safe).
        self._member_requests: collections.deque = collections.deque()
        #: Requests forwarded to the leader: id -> (callback, sent at, op, addr).
        self._member_forwarded: dict[int, tuple] = {}
        self._member_next_id = 0
        self._member_transfer_at = -1e9
        #: Set (any thread) when the node is stopping: while it leads, it hands its leadership to
        #: a caught-up voter (``_handover_tick``), so a stop is not an election timeout of 503s.
        self._handover_wanted = False
        #: The answer times pysyncobj stamped on every node when this node last became leader
        #: (not answers: a node counts as answering only once its time moved past its stamp).
        self._members_led_stamps: dict = {}

    # -- the log's configurations ---------------------------------------------------------

    def _members(self) -> MembershipLog:
        if self._mlog is None:
            self._members_rebuild(apply=False)
        assert self._mlog is not None
        return self._mlog

    def _members_rebuild(self, apply: bool = True) -> None:
        """From the base and the whole log (at start, and after a full dump is loaded)."""
        if self._members_dump_base is not None:
            self._mlog = MembershipLog(self._members_dump_base, self._members_dump_index,
                                       self._members_dump_config_index)
        else:
            self._mlog = MembershipLog(self._members_cmdline)
        log = self._SyncObj__raftLog
        self._members_scanned = log[0][1] - 1
        self._members_scan(apply=False)
        self._members_announce()
        if apply and self._mlog.latest != self._members_in_force:
            self._members_apply()

    def _members_scan(self, apply: bool = True) -> None:
        """Take in the configuration entries appended since the last scan."""
        ml = self._mlog
        if ml is None:
            return self._members_rebuild(apply)
        log = self._SyncObj__raftLog
        first, last = log[0][1], log[len(log) - 1][1]
        start = max(self._members_scanned + 1, first)
        if start > last:
            return None
        changed = False
        for data, idx, term in log[start - first:]:
            if data[:1] == _PREFIX:
                got = decode_entry(data)
                if got is not None:
                    ml.append(ConfigEntry(idx, term, got[0], got[1]))
                    changed = True
                    logger.info("replication.config_appended index=%d term=%d voters=%s learners=%s change=%s",
                                idx, term, ",".join(got[0].voters), ",".join(got[0].learners) or "-",
                                json.dumps(got[1], sort_keys=True))
        self._members_scanned = last
        if changed and apply:
            self._members_apply()
        return None

    def _members_truncated(self, from_idx: int) -> None:
        """Entries from ``from_idx`` on were deleted from the log (a conflict)."""
        if self._mlog is None:
            return
        self._members_scanned = min(self._members_scanned, from_idx - 1)
        if self._mlog.truncate_from(from_idx):
            logger.info("replication.config_truncated from=%d latest_voters=%s", from_idx,
                        ",".join(self._mlog.latest.voters))
            self._members_apply()

    def _members_compacted(self) -> None:
        if self._mlog is not None:
            self._mlog.compact_below(self._SyncObj__raftLog[0][1])

    def _members_dump(self) -> dict:
        """What a full dump records: the configuration in force at its last entry (the last
        applied one), not the latest appended, and the index of the entry it came from (older
        code reads the configuration and passes over ``index``)."""
        ml = self._members()
        at = self._SyncObj__raftLastApplied
        e = ml.entry_at(at)
        return dict(ml.at(at).to_dict(), index=e.index if e is not None else ml.config_index)

    def _members_dump_loaded(self, members: Any) -> None:
        """A full dump was restored (its ``members``, None for a dump that predates them)."""
        self._members_dump_base = Config.from_dict(members) if members is not None else None
        index = members.get("index") if isinstance(members, dict) else None
        self._members_dump_config_index = index if type(index) is int and index >= 0 else 0
        if members is not None and self._members_dump_base is None:
            logger.critical("replication.dump_members_unreadable (the command line's are used)")

    # -- in force -------------------------------------------------------------------------

    def is_voter(self) -> bool:
        """Whether this node is a voter of its latest configuration (for a node that joined:
        through an entry of its own life, see JoinMarker)."""
        ml = self._members()
        if self._SyncObj__selfNode.id not in ml.latest.voters:
            return False
        marker = self._members_join
        return marker is None or (marker.after is not None and ml.latest_index > marker.after)

    def _members_note_append(self, message: dict) -> None:
        """Before pysyncobj handles an append_entries: a joining node's first leader message."""
        marker = self._members_join
        if marker is not None and marker.after is None:
            try:
                if message["term"] >= self._SyncObj__raftCurrentTerm:
                    marker.note_leader(message["commit_index"])
            except (KeyError, TypeError):
                pass
            except OSError:
                logger.exception("replication.join_marker_write_failed")

    def _members_pending(self) -> ConfigEntry | None:
        e = self._members().last_entry
        return e if e is not None and e.index > self._SyncObj__raftCommitIndex else None

    def _members_apply(self, as_leader: bool | None = None) -> None:
        """Make pysyncobj use the latest configuration: its voters are the ones it counts
        (``otherNodes``), and the transport links every member; a leader also keeps the
        members of the committed configuration until the latest commits."""
        ml = self._members()
        me = self._SyncObj__selfNode.id
        leader = self._SyncObj__raftState == _LEADER if as_leader is None else as_leader
        latest = ml.latest
        committed = ml.at(self._SyncObj__raftCommitIndex)
        want = set(latest.members) | (set(committed.members) if leader else set())
        want.discard(me)
        tr = self._SyncObj__transport
        have = {n.id: n for n in list(tr._nodes)}
        linger = self._members_linger
        if leader:
            now = monotonic()
            for a in set(have) - want:
                linger.setdefault(a, now + LINGER_S)
            for a in list(linger):
                if linger[a] <= now or a in want:
                    del linger[a]
            want |= set(linger)
        else:
            linger.clear()
            # A follower whose log is behind the leader's may be in force with an old
            # configuration that lacks the leader itself (an address removed, then added again
            # since): it keeps every link, and the leader's, until it has caught up (raftsched,
            # unlike Raft, refuses a link from an address it does not know).
            current = self._SyncObj__raftLeader
            if current is not None:
                want.add(current.id)
            behind = self._SyncObj__raftCommitIndex < (self._SyncObj__leaderCommitIndex or 0)
            self._members_prune_later = behind and bool(set(have) - want)
            if behind:
                want |= set(have)
        for a in sorted(set(have) - want):
            tr.dropNode(have[a])
            self._SyncObj__connectedNodes.discard(have[a])
        for a in sorted(want - set(have)):
            tr.addNode(TCPNode(a))
        nodes = tr._nodeAddrToNode
        self._SyncObj__otherNodes = {nodes[a] for a in latest.voters if a != me}
        self._member_targets = {nodes[a] for a in want}
        self._members_in_force = latest
        if leader:
            self._members_leader_books()
        self._members_applied = self._members_signature(leader)
        self._members_announce()

    def _members_signature(self, leader: bool) -> tuple:
        ml = self._members()
        last = ml.last_entry
        done = ml.entry_at(self._SyncObj__raftCommitIndex)
        return (last.index if last else 0, done.index if done else 0, leader)

    def _replication_targets(self) -> set:
        """Who the leader sends entries to: every member of the latest and of the committed
        configuration but itself (voters, learners, a server removed by the uncommitted change),
        and pysyncobj's read-only nodes."""
        return self._SyncObj__otherNodes | self._SyncObj__readonlyNodes | self._member_targets

    def _members_leader_books(self) -> None:
        targets = self._replication_targets()
        nexts, match = self._SyncObj__raftNextIndex, self._SyncObj__raftMatchIndex
        answered = self._SyncObj__lastResponseTime
        nxt, now = self._SyncObj__getCurrentLogIndex() + 1, monotonic()
        for n in targets:
            nexts.setdefault(n, nxt)
            match.setdefault(n, 0)
        for n in self._SyncObj__otherNodes:
            answered.setdefault(n, now)  # pysyncobj reads it for every voter
        for n in list(nexts):
            if n not in targets:
                nexts.pop(n, None)
                match.pop(n, None)
                self._progress.pop(n, None)

    def _members_on_become_leader(self) -> None:
        """Before pysyncobj's own: every node the new leader sends to starts over at its log's
        end (pysyncobj resets its voters only; a learner's index may be a past term's)."""
        self._members_scan(apply=False)
        self._members_apply(as_leader=True)
        nxt = self._SyncObj__getCurrentLogIndex() + 1
        for n in self._replication_targets():
            self._SyncObj__raftNextIndex[n] = nxt
            self._SyncObj__raftMatchIndex[n] = 0

    def _members_announce(self) -> None:
        """Publish the view ``members_view`` reads; log the committed configuration when it
        changes, and once when this node finds itself out of it."""
        ml = self._mlog
        if ml is None:
            return
        commit = self._SyncObj__raftCommitIndex
        done = ml.entry_at(commit)
        committed = ml.at(commit)
        pending = self._members_pending()
        me = self._SyncObj__selfNode.id
        view = {"voters": list(committed.voters), "learners": list(committed.learners),
                "index": done.index if done else ml.config_index,
                "pending": None if pending is None else dict(pending.config.to_dict(), index=pending.index,
                                                             change=dict(pending.change)),
                "self": "voter" if self.is_voter() else "learner" if me in ml.latest.members else "none"}
        old = self._members_published
        if old is not None and (old["voters"], old["learners"]) != (view["voters"], view["learners"]):
            logger.info("replication.members_committed index=%d voters=%s learners=%s", view["index"],
                        ",".join(view["voters"]), ",".join(view["learners"]) or "-")
        role = committed.role(me)
        # A joining node replays the history of its address too (a node of that address removed
        # before it was started): a membership of that history is not its own (JoinMarker), and
        # its removal is no reason to stop it (a walk: the replacement's first lines said so).
        marker = self._members_join
        own = marker is None or (marker.after is not None and view["index"] > marker.after)
        if role is not None and own:
            self._members_was_member = True
        elif role is None and self._members_was_member:
            self._members_was_member = False
            logger.warning("replication.removed self=%s: this node is no longer a member of the cluster "
                           "(committed at log index %s); it takes no part in it: stop it", me, view["index"])
        self._members_published = view

    def members_view(self) -> dict | None:
        """The committed configuration (``voters``, ``learners``, ``index``: its entry, 0 for the
        one the cluster started with), the change not committed yet (``pending``), and this
        node's role in the latest (``self``: voter, learner or none). Any thread."""
        return self._members_published

    # -- requests -----------------------------------------------------------------------------

    def submit_member_change(self, op: str, addr: str, callback: Callable[[Outcome], Any]) -> None:
        """Queue one attempt at ``op addr``; ``callback(outcome)`` is called once, on the tick
        thread. Any thread."""
        self._member_requests.append((op, addr, callback))

    def _member_tick(self) -> None:
        """A tick callback: new configuration entries, the configuration in force after a
        commit or a change of role, promotions, requests."""
        try:
            self._members_scan()
            first = self._SyncObj__raftLog[0][1]
            if first > self._members_first:  # a compaction: fold what it dropped into the base
                self._members_first = first
                self._members_compacted()
            leader = self._SyncObj__raftState == _LEADER
            linger = self._members_linger
            if self._members_applied != self._members_signature(leader) or \
                    (linger and min(linger.values()) <= monotonic()) or \
                    (self._members_prune_later and self._SyncObj__raftCommitIndex >= (self._SyncObj__leaderCommitIndex or 0)):
                self._members_apply()
            if leader and self._mlog is not None and self._mlog.latest.learners:
                self._member_promote()
            now = monotonic()
            for rid, (cb, sent, _op, _addr) in list(self._member_forwarded.items()):
                if now - sent > FORWARD_TIMEOUT_S:
                    del self._member_forwarded[rid]
                    _call(cb, ("retry", "the leader did not answer the forwarded request", True))
            while self._member_requests:
                op, addr, cb = self._member_requests.popleft()
                self._member_attempt(op, addr, cb)
        except Exception:  # noqa: BLE001 - a tick callback that raises stops pysyncobj's tick
            logger.exception("replication.members_tick_failed")

    def _member_reachable(self) -> frozenset[str]:
        now = monotonic()
        within = self._SyncObj__conf.leaderFallbackTimeout
        answered = self._SyncObj__lastResponseTime
        stamped = self._members_led_stamps
        # A new leader stamps every node as just answered, a dead one too: for a leaderFallbackTimeout
        # after an election, that stamp would let a removal leave a quorum of one live node and one
        # dead (then nothing commits, and the configuration in the log keeps it so through restarts).
        ids = {n.id for n in self._SyncObj__otherNodes
               if now - answered.get(n, -1e9) < within and answered.get(n, -1e9) != stamped.get(n)}
        return frozenset(ids | {self._SyncObj__selfNode.id})

    def _member_noop_committed(self) -> bool:
        noop = self._SyncObj__noopIDx
        return noop is not None and self._SyncObj__raftCommitIndex >= noop

    def _member_decide(self, op: str, addr: str) -> Decision:
        ml = self._members()
        return decide(op, addr, me=self._SyncObj__selfNode.id, latest=ml.latest,
                      pending=self._members_pending(), noop_committed=self._member_noop_committed(),
                      reachable=self._member_reachable())

    def _member_append(self, cfg: Config, change: dict) -> tuple[int, int]:
        """Append a configuration entry (the leader) and put it in force at once."""
        idx, term = self._SyncObj__getCurrentLogIndex() + 1, self._SyncObj__raftCurrentTerm
        self._SyncObj__raftLog.add(encode_entry(cfg, change), idx, term)
        self._members_scan()
        self._SyncObj__sendAppendEntries()
        return idx, term

    def _member_promote(self) -> None:
        ml = self._members()
        match = self._SyncObj__raftMatchIndex
        answered = self._SyncObj__lastResponseTime
        nodes = self._SyncObj__transport._nodeAddrToNode
        now = monotonic()
        learners = {}
        for a in ml.latest.learners:
            n = nodes.get(a)
            if n is not None:
                learners[a] = (match.get(n, 0), now - answered.get(n, -1e9))
        got = promotion(ml.latest, pending=self._members_pending(), noop_committed=self._member_noop_committed(),
                        commit_index=self._SyncObj__raftCommitIndex, learners=learners,
                        reachable=self._member_reachable(),
                        answered_within_s=self._SyncObj__conf.leaderFallbackTimeout)
        if got is not None:
            addr, cfg = got
            idx, _ = self._member_append(cfg, {"op": "promote", "node": addr})
            logger.info("replication.learner_promoted node=%s index=%d (it holds every committed entry)",
                        addr, idx)

    def _member_leader_attempt(self, op: str, addr: str) -> tuple:
        """The leader's side of one attempt: ("done", view, False), ("refused", code, message),
        ("retry", why, False) or ("appended", index, term)."""
        d = self._member_decide(op, addr)
        if d.kind == "done":
            self._members_announce()
            return ("done", self.members_view(), False)
        if d.kind == "refused":
            return ("refused", d.code, d.message)
        if d.kind == "retry":
            return ("retry", d.message, False)
        if d.kind == "wait":
            pending = self._members_pending()
            assert pending is not None
            return ("appended", pending.index, pending.term)
        if d.kind == "transfer":
            return self._member_transfer()
        assert d.config is not None and d.change is not None
        idx, term = self._member_append(d.config, d.change)
        return ("appended", idx, term)

    def request_handover(self) -> None:
        """From any thread: hand this node's leadership over, when it leads (a stop)."""
        self._handover_wanted = True

    def _handover_tick(self) -> None:
        """On the tick thread: a leader asked to hand over does, to the voter furthest along
        that answers, tried again every TRANSFER_RETRY_S (``_member_transfer``)."""
        if self._handover_wanted and self._SyncObj__raftState == _LEADER and self._SyncObj__otherNodes:
            self._member_transfer()

    def _member_transfer(self) -> tuple:
        """Hand leadership to the voter furthest along that answers (pysyncobj's TimeoutNow:
        it must hold the leader's whole log), at most once a TRANSFER_RETRY_S."""
        now = monotonic()
        if now - self._member_transfer_at >= TRANSFER_RETRY_S:
            match = self._SyncObj__raftMatchIndex
            reach = self._member_reachable()
            best = sorted(((match.get(n, 0), n.id, n) for n in self._SyncObj__otherNodes
                           if n.id in reach and self.isNodeConnected(n)), key=lambda t: t[:2])
            if best:
                target = best[-1][2]

                def sent(_res, err, target=target) -> None:
                    # Refused while the target lacks an entry of the leader's: tried again at
                    # the next attempt, not a TRANSFER_RETRY_S later.
                    if err == FAIL_REASON.SUCCESS:
                        self._member_transfer_at = now
                        logger.info("replication.leadership_transfer to=%s (this leader %s)", target.id,
                                    "stops" if self._handover_wanted else "is asked to remove itself")
                self.transferLeadership(target, callback=sent)
        return ("retry", "this node leads and is asked to remove itself: it hands its leadership over "
                         "first, and the new leader removes it", False)

    def _member_attempt(self, op: str, addr: str, cb: Callable[[Outcome], Any]) -> None:
        if self._SyncObj__raftState == _LEADER:
            got = self._member_leader_attempt(op, addr)
            if got[0] == "appended":
                self._member_wait_commit(got[1], got[2], op, addr, cb)
            else:
                _call(cb, got)
            return
        leader = self._SyncObj__raftLeader
        if leader is None or not self.isNodeConnected(leader):
            _call(cb, ("retry", "no leader (election in progress or no quorum)"
                       if leader is None else f"leader {leader.id} is not reachable", False))
            return
        self._member_next_id += 1
        rid = self._member_next_id
        self._member_forwarded[rid] = (cb, monotonic(), op, addr)
        self._SyncObj__transport.send(leader, {"type": REQUEST_MESSAGE, "id": rid, "op": op, "addr": addr})

    def _member_wait_commit(self, idx: int, term: int, op: str, addr: str, cb) -> None:
        """Answer once entry ``idx`` is applied here: done when the committed configuration is
        then what was asked, else a retry (the entry was replaced by another leader's)."""
        def judge(_res=None, _reason=None) -> None:
            latest_committed = self._members().at(self._SyncObj__raftCommitIndex)
            ok = addr in latest_committed.members if op == "add" else addr not in latest_committed.members
            if ok:
                self._members_announce()
                _call(cb, ("done", self.members_view(), True))
            else:
                _call(cb, ("retry", f"the change at log index {idx} was replaced by another leader's", True))

        if idx <= self._SyncObj__raftLastApplied:
            judge()
        else:
            self._SyncObj__commandsWaitingCommit[idx].append((term, judge))

    def _on_member_message(self, node, message: dict) -> None:
        try:
            if message["type"] == REQUEST_MESSAGE:
                rid, op, addr = message["id"], message["op"], message["addr"]
                if self._SyncObj__raftState != _LEADER:
                    got: tuple = ("retry", "the node asked no longer leads", False)
                else:
                    got = self._member_leader_attempt(str(op), str(addr))
                self._SyncObj__transport.send(node, {"type": ANSWER_MESSAGE, "id": rid, "outcome": list(got)})
                return
            entry = self._member_forwarded.pop(message["id"], None)
            if entry is None:
                return  # answered after it was given up
            cb, _sent, op, addr = entry
            got = tuple(message["outcome"])
            if got[0] == "appended":
                self._member_wait_commit(int(got[1]), int(got[2]), op, addr, cb)
            elif got[0] == "done":  # the leader's committed view: this node's may lag it
                _call(cb, ("done", got[1] if isinstance(got[1], dict) else self.members_view(), False))
            elif got[0] in ("refused", "retry"):
                _call(cb, got)
        except (KeyError, TypeError, ValueError, IndexError):
            logger.warning("replication.members_message_malformed from=%s", getattr(node, "id", node))


def _call(cb, outcome) -> None:
    try:
        cb(outcome)
    except Exception:  # noqa: BLE001 - on the tick thread: never raise into pysyncobj
        logger.exception("replication.members_callback_raised")


#: pysyncobj's answer to a forwarded command that carries a configuration entry's type byte:
#: only the leader's own rules append one.
REFUSED_COMMAND = FAIL_REASON.REQUEST_DENIED
