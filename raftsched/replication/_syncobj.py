"""``_SyncObj``: pysyncobj's ``SyncObj`` with the Raft corrections raftsched makes to it, and the
log filter that goes with one of them.

The corrections override pysyncobj internals by their mangled names (``_OVERRIDDEN``); the guard
in ``install`` refuses to run if a pysyncobj release renamed one of them.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import threading
from time import thread_time
from typing import TYPE_CHECKING

import pysyncobj.pickle as _pickle  # what pysyncobj pickles a replicated call with
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use

from . import _progress
from ._clockguard import FIELD as _CLOCK_FIELD, ClockGuard
from ._membership import ANSWER_MESSAGE, CONFIG_ENTRY, REFUSED_COMMAND, REQUEST_MESSAGE, MembershipMixin
from ._progress import _Progress
from ._storage import stop_on_diverged, stop_on_unreadable_dump

if TYPE_CHECKING:
    from ._crypto import _AeadEncryptor

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: An apply longer than this extends a follower's election deadline by its duration (_SyncObj).
_APPLY_STALL_S = 0.02

#: The apply work one tick does (s): past it, the committed entries left wait for the next tick,
#: after this one has sent what is due (a leader's heartbeats) and read the network (a
#: follower's answers). pysyncobj applied every committed entry in one go, however long that
#: took (a put_jobs entry of 80 jobs applies in ~2 ms: a commit of a mass registration's
#: entries held the tick for as long as they took). Half a heartbeat period.
_APPLY_TICK_S = 0.05
#: Committed entries read from the log at a time by the apply loop (a slice of the log each).
_APPLY_READ = 64
#: A leader with more committed entries than this still to apply takes no new command from its
#: queue: they wait there (and past commandsQueueSize are refused, 503), as when one tick applied
#: everything, instead of growing a backlog of applies that no answer waits behind.
_APPLY_BACKLOG_MAX = 256

#: A gap of at least this long between two ticks' starts is logged (``replication.tick_gap``):
#: a tick waits at most autoTickPeriod (50 ms) for messages, so the tick thread was held up (its
#: own work, a collection, a sync, or the interpreter lock held by another thread: the CPU it used
#: meanwhile tells which). A leader's tick thread held up for the shortest election timeout
#: (raftMinTimeout, 0.5 s) can cost its leadership.
_TICK_GAP_LOG_S = 0.3
#: The tick thread's CPU time is read at most this often (s) for the tick-gap log.
_CPU_READ_S = 0.01


class _SyncObj(MembershipMixin, SyncObj):
    """SyncObj whose followers do not count time spent applying toward their election timeout,
    never truncate entries they already hold (``_entries_already_held``), and stand for election
    at once when a candidate with a staler log asks for their vote; whose split votes are broken
    by node id; and whose start-up keeps the journal entries that follow the full dump.

    pysyncobj's tick checks the election deadline, then applies every committed entry, then
    reads the sockets. A follower that spent 0.6 s applying a burst of fire commands (or was
    starved of CPU while doing so) finds its deadline passed at the next tick, with the leader's
    heartbeats unread in its socket, and deposes a healthy leader (there is no pre-vote). Measured:
    a 10 000-job aligned storm under load 4 on two cores caused an election every few seconds.
    Here the deadline moves on by the time the apply took: a dead leader is still detected, at
    most that much later, and a busy follower no longer mistakes its own work for silence.
    (Name-mangled override: SyncObj calls ``self.__applyLogEntries``.)

    Its membership changes online (``MembershipMixin``, _membership.py): ``join`` starts a node
    that waits to be added to a running cluster, with no vote; ``join_marker`` is a joining
    node's ``JoinMarker``.
    """

    def __init__(self, selfNode, otherNodes, *args, encryptor: "_AeadEncryptor | None" = None, wall_ms=None,
                 join: bool = False, join_marker=None, **kwargs):
        # Set before SyncObj.__init__: its tick thread may connect to peers right away.
        self._raft_encryptor = encryptor
        #: the members' clocks, measured on the traffic below (_clockguard.py); ``wall_ms``: the
        #: node's wall clock, the one its commands are stamped with
        self._clock = ClockGuard(self, wall_ms)
        #: The leader's view of each follower beyond next/match index (_progress.py); anew at
        #: each election won.
        self._progress: dict = {}
        self._members_setup(selfNode, otherNodes, join, join_marker)
        #: The last entry of this node's replay (None: not known before the first apply; 0: none
        #: or done): what it applies again at its start of what the process before had committed,
        #: and so applied and counted in its metrics (``_replay_check``).
        self._replay_to: int | None = None
        self._replay_from = 0
        super().__init__(selfNode, otherNodes, *args, **kwargs)
        # pysyncobj dumps every attribute set after its constructor (a subclass's too): this
        # node's own fields (when it last ticked, why its role changed) went into its dumps and,
        # through snapshots, into other nodes, which then logged a tick gap as long as the dump
        # was old. The state is the consumer's; only pysyncobj's code version is replicated here.
        self._SyncObj__properies = _LocalFields()
        # A leader's snapshot replaces raft.dump: a dump writer forked before it must not rename
        # its older dump over it afterwards (_stop_dump_writer). A failed writer is noted for
        # dump_now.
        serializer = self._SyncObj__serializer
        receive = serializer.setTransmissionData

        def set_transmission_data(data):
            if data is not None and data[2]:  # the last part: the install renames it into place next
                _stop_dump_writer(serializer)
            return receive(data)
        serializer.setTransmissionData = set_transmission_data
        check = serializer.checkSerializing

        def check_serializing():
            state, ident = check()
            if state == SERIALIZER_STATE.FAILED:  # (pysyncobj logs "Failed to store full dump")
                self._dump_failed = (ident, monotonic())
            return state, ident
        serializer.checkSerializing = check_serializing

    #: The last dump whose writer failed: pysyncobj's id of it (its second-to-last index) and
    #: when (monotonic s); read by dump_now.
    _dump_failed: tuple = (None, 0.0)

    #: The journal's sync gate (``_durable.py``; None with fsync off), set by its transport factory.
    _sync_gate = None
    #: When the last tick started (monotonic s), and when the tick thread's CPU time was last
    #: read and what it was: (monotonic s, CPU s) (_note_tick_gap).
    _tick_at: float | None = None
    _cpu_at: tuple[float, float] = (0.0, 0.0)
    #: The last apply stopped at _APPLY_TICK_S with committed entries left (``_onTick``).
    _apply_cut = False

    # -- why the role changes (role_cause; logged and counted by RaftNode) -------------------
    #: Set while a message or a step that may change the role is handled: its cause.
    _role_cause: str | None = None
    #: When this node was last asked to stand at once by its leader (timeout_now), and when it
    #: last handed its own leadership over (monotonic s).
    _transfer_asked_at = -1e9
    _transferred_at = -1e9
    #: Why this node's current candidacy began (the cause a won election is counted with).
    _candidacy_cause = "election_timeout"

    def transferLeadership(self, node=None, callback=None):
        self._transferred_at = monotonic()
        return SyncObj.transferLeadership(self, node, callback)

    def role_cause(self, old: int, new: int) -> str:
        """Why the role changes from ``old`` to ``new`` now (called from onStateChanged, on the
        tick thread): ``election_timeout`` (no word from a leader within the election timeout),
        ``transfer`` (the leader handed over: asked to stand, or handing over), ``higher_term``
        (a member with a higher term), ``leader_seen`` (another member won this term),
        ``quorum_lost`` (a leader without answers from a majority for leaderFallbackTimeout),
        ``clock_step_down`` (_clockguard.py), ``elected`` is never a cause: a won election is
        counted with its candidacy's."""
        now = monotonic()
        if new == _CANDIDATE:
            cause = "transfer" if now - self._transfer_asked_at < _TRANSFER_CAUSE_S else "election_timeout"
            self._candidacy_cause = cause
            return cause
        if new == _LEADER:
            return self._candidacy_cause
        if old == _LEADER and now - self._transferred_at < _TRANSFER_CAUSE_S:
            return "transfer"
        if self._role_cause is not None:
            return self._role_cause
        return "quorum_lost" if old == _LEADER else "unknown"

    def _onTick(self, timeToWait=0.0):
        # Sync before acknowledging (_durable.py): every tick begins with the journal synced
        # (the leader counts itself towards a commit then), and the answers to what the poll
        # at the end of the tick brought in go out after one sync, before anything else.
        self._note_tick_gap()
        if self._apply_cut:
            timeToWait = 0.0  # committed entries wait to be applied: read, do not wait
        gate = self._sync_gate
        if gate is None:
            self._read_before_electing()
            try:
                return SyncObj._onTick(self, timeToWait)
            finally:
                self._forget_silent_leader()
                self._handover_tick()
        gate.flush()
        try:
            self._read_before_electing()
            return SyncObj._onTick(self, timeToWait)
        finally:
            gate.flush()
            self._forget_silent_leader()
            self._handover_tick()

    def _forget_silent_leader(self) -> None:
        """A follower forgets a leader it has not heard from for its election timeout and
        _SILENT_LEADER_GRACE_S more. pysyncobj clears the leader only when it stands for election,
        which it does only while connected to some peer: a follower left alone (the leader and
        the other follower dead) named the dead leader for good, its /healthz 200 and no
        ``cluster.no_leader`` (a walk), and a learner, which never stands, likewise. The next
        message of a leader names it again (pysyncobj's append_entries). Waiting commands are
        failed as on any change of leader."""
        if self._SyncObj__raftState == _LEADER or self._SyncObj__raftLeader is None \
                or self._SyncObj__transferInProgress \
                or self._SyncObj__raftElectionDeadline + _SILENT_LEADER_GRACE_S >= monotonic():
            # (a transfer's target: TimeoutNow set its deadline to 0 to stand at once, its leader
            # heard a moment ago; a review saw it forget that leader, and fail its commands)
            return
        logger.warning("replication.leader_silent leader=%s (no message from it for an election timeout: no leader "
                       "known until one is heard from)", getattr(self._SyncObj__raftLeader, "address", None))
        self._SyncObj__raftLeader = None
        self._SyncObj__onLeaderChanged()

    def _read_before_electing(self) -> None:
        """pysyncobj's tick checks a follower's election deadline before it reads the network:
        a follower whose tick thread was held up past its deadline (a collection, a sync, the
        interpreter lock held by its node's event loop, the host) ran for leader though the
        leader's heartbeats were waiting in its sockets, and deposed a healthy leader. Read
        what waits first (a poll that does not wait): a heartbeat among it moves the deadline,
        as it would have had the thread not been held up."""
        if self._SyncObj__raftState == _LEADER \
                or self._SyncObj__raftElectionDeadline >= monotonic() \
                or not self._SyncObj__transport.ready:
            return
        self._poller.poll(0)

    def _note_tick_gap(self) -> None:
        """Log a tick that started _TICK_GAP_LOG_S or more after the one before (the thread's
        CPU time meanwhile says whether it worked or waited). The CPU time is read at most every
        _CPU_READ_S (a system call: under load a thread ticks thousands of times a second, and
        reading it each time was 2-6 % of the nodes' CPU in the fleet benchmark), so the CPU
        said is over the gap and up to _CPU_READ_S before it."""
        now = monotonic()
        last = self._tick_at
        self._tick_at = now
        cpu_at = self._cpu_at
        if last is not None and now - last >= _TICK_GAP_LOG_S:
            cpu = thread_time()
            self._cpu_at = (now, cpu)
            logger.warning("replication.tick_gap ms=%.0f cpu_ms=%.0f leader=%s (the Raft thread was held up: "
                           "no message read or sent meanwhile)", (now - last) * 1000, (cpu - cpu_at[1]) * 1000,
                           self._SyncObj__raftState == _LEADER)
        elif now - cpu_at[0] >= _CPU_READ_S:
            self._cpu_at = (now, thread_time())

    @property
    def encryptor(self):
        """What pysyncobj's transport protects each connection with: ours (``_AeadEncryptor``)
        when given, else pysyncobj's Fernet from ``password``."""
        if self._raft_encryptor is not None:
            return self._raft_encryptor
        return SyncObj.encryptor.fget(self)

    def _SyncObj__applyLogEntries(self):
        """pysyncobj's apply loop, stopped after _APPLY_TICK_S of work (at least one entry a
        tick is applied, read from the log _APPLY_READ at a time); the next ticks apply the
        rest, and do not wait for the network meanwhile (``_onTick``). Results reach their
        callers in log order as before."""
        t0 = monotonic()
        end = t0 + _APPLY_TICK_S
        applied = False
        waiting = self._SyncObj__commandsWaitingCommit
        apply = self._SyncObj__doApplyCommand
        if self._replay_to != 0:
            self._replay_check()
        while True:
            pending = self._SyncObj__raftCommitIndex - self._SyncObj__raftLastApplied
            entries = self._SyncObj__getEntries(self._SyncObj__raftLastApplied + 1, min(pending, _APPLY_READ)) \
                if pending > 0 else ()
            if not entries:
                break
            for entry in entries:
                term = entry[2]
                subscribers = waiting.pop(entry[1], [])
                res = apply(entry[0])
                for subscribed_term, callback in subscribers:
                    if subscribed_term == term:
                        callback(res, FAIL_REASON.SUCCESS)
                    else:
                        callback(None, FAIL_REASON.DISCARDED)
                self._SyncObj__raftLastApplied += 1
                applied = True
                if self._replay_to:
                    self._replay_check()
                if monotonic() >= end:
                    break
            else:
                continue
            break
        self._apply_cut = self._SyncObj__raftCommitIndex > self._SyncObj__raftLastApplied
        spent = monotonic() - t0
        if spent > _APPLY_STALL_S and not self._isLeader():
            self._SyncObj__raftElectionDeadline += spent
        return applied and not self._SyncObj__conf.appendEntriesUseBatch

    def _replay_check(self) -> None:
        """Start or end this node's replay. The entries after its dump up to the commit index it
        had written before it stopped were applied by the process before, whose metrics counted
        them (runs finished, deadlines missed, slots recorded): applied again at this start,
        they are not counted again (the consumers' ``replaying``), or an alert on an increase
        fired for them anew after every restart. An entry past that index counts as any: the
        process before may have applied a few (the index is written once a second) whose counts
        then come twice, and counts it made but no scrape read are gone, as any counter's at a
        crash. A snapshot installed meanwhile ends the replay once past it."""
        last = self._SyncObj__raftLastApplied
        if self._replay_to is None:
            to = getattr(self._SyncObj__raftLog, "opened_commit_index", 0)
            self._replay_to = to if isinstance(to, int) and to > last else 0
            if self._replay_to:
                self._replay_from = last
                self._replaying(True)
        elif last >= self._replay_to:
            logger.info("replication.replayed entries=%d to=%d (applied again at this start, not counted again "
                        "in the metrics)", last - self._replay_from, self._replay_to)
            self._replay_to = 0
            self._replaying(False)

    def _replaying(self, on: bool) -> None:
        for consumer in self._SyncObj__consumers:
            hook = getattr(consumer, "replaying", None)
            if hook is not None:
                hook(on)

    def _apply_behind(self) -> int:
        """Committed entries not yet applied."""
        return self._SyncObj__raftCommitIndex - self._SyncObj__raftLastApplied

    def _checkCommandsToApply(self):
        # A leader whose applies are _APPLY_BACKLOG_MAX entries behind takes no new command.
        if self._apply_behind() > _APPLY_BACKLOG_MAX and self._SyncObj__raftState == _LEADER:
            return None
        return SyncObj._checkCommandsToApply(self)

    def _SyncObj__doApplyCommand(self, command):
        # pysyncobj's, for the entries this cluster writes (a replicated call; its no-op and this
        # package's configuration entries, applied as nothing), with what pysyncobj would raise
        # on made a no-op instead: an entry it cannot read (a malformed pickle, an unknown
        # method, other arguments) raised out of its apply loop, which then stopped for good on
        # every replica, each new leader included. A pysyncobj membership or code-version
        # entry (never written here: one would change the members outside the rules, or stop
        # apply) is ignored alike. Every replica reads the same bytes, so each decides the same.
        if type(command) is bytes and command[:1] == _REGULAR:
            try:
                call = _pickle.loads(command[1:])
                if type(call) is tuple and len(call) == 2 and type(call[1]) is tuple and len(call[1]) == 1:
                    method = self._idToMethod[call[0]]
                else:
                    raise ValueError("not a call of one argument")
            except Exception as e:  # noqa: BLE001 - what raises here would stop apply for good
                logger.error("replication.entry_unreadable (applied as nothing on every replica): %s",
                             f"{type(e).__name__}: {e}"[:200])
                return None
            return method(call[1][0], _doApply=True)
        if type(command) is not bytes or command[:1] not in _APPLIED_AS_NOTHING:
            logger.error("replication.entry_ignored type=%r (not written by this cluster; applied as nothing)",
                         command[:1] if isinstance(command, (bytes, bytearray)) else type(command).__name__)
        return None

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if type(message) is dict else None
        if kind == "next_node_idx" and self._SyncObj__raftState == _LEADER:
            return self._on_answer(node, message)
        if kind in (REQUEST_MESSAGE, ANSWER_MESSAGE):
            return self._on_member_message(node, message)
        if _membership_forbidden(self, node, kind, message):
            return None
        order = _candidate_log_order(self, message) if kind == "request_vote" else None
        if kind == "timeout_now" and node == self._SyncObj__raftLeader:
            self._transfer_asked_at = monotonic()
        term = message.get("term") if kind is not None else None
        if isinstance(term, int) and term > self._SyncObj__raftCurrentTerm:
            self._role_cause = "higher_term"
        elif kind == "append_entries":
            self._role_cause = "leader_seen"
        # Two candidates of one term with equally recent logs: a split vote (each voted for
        # itself), seen from both sides as each one's request reaches the other.
        split = order == 0 and self._SyncObj__raftState == _CANDIDATE \
            and message["term"] == self._SyncObj__raftCurrentTerm
        clock = message.get(_CLOCK_FIELD) if kind == "append_entries" else None
        _tick.clock_echo = clock  # what the answer echoes (__sendNextNodeIdx)
        if kind == "append_entries":
            self._members_note_append(message)
            _tick.appending_from, _tick.appending_term = getattr(node, "id", None), term
        snapshot_commit = None
        if kind == "append_entries" and "prevLogIdx" not in message \
                and type(message.get("commit_index")) is int \
                and message["commit_index"] > self._SyncObj__raftCommitIndex:
            # A snapshot's part, or the word that one is being written (``serialized`` None):
            # pysyncobj raises the commit index on it to min(the leader's, this log's end)
            # without checking that this log agrees with the leader's, so a tail a deposed
            # leader left here was counted committed and applied (found by a review). The
            # commit index moves only once the snapshot is installed (_SyncObj__loadDumpFile).
            snapshot_commit = message["commit_index"]
            message = dict(message, commit_index=self._SyncObj__raftCommitIndex)
            self._snapshot_installed = False
        try:
            if kind == "append_entries" and "prevLogIdx" in message \
                    and "transmission" not in message:
                found = self._check_previous(message)
                if found == "match" and message.get("entries"):
                    held = _entries_already_held(self, message)
                    if held is not None:
                        message, _tick.keep_log_tail = held
                elif found == "match":
                    empty = _empty_append(self, message)
                    if empty is not None:
                        message, _tick.keep_log_tail = empty, True
            result = SyncObj._SyncObj__onMessageReceived(self, node, message)
            if snapshot_commit is not None:
                self._SyncObj__leaderCommitIndex = snapshot_commit
                if self._snapshot_installed:
                    commit = min(snapshot_commit, self._SyncObj__getCurrentLogIndex())
                    if commit > self._SyncObj__raftCommitIndex:
                        self._SyncObj__raftCommitIndex = commit
                        self._SyncObj__raftLog.setRaftCommitIndex(commit)
            return result
        finally:
            self._role_cause = None
            _tick.appending_from = _tick.appending_term = None
            _tick.keep_log_tail = False
            _tick.answer = None
            _tick.clock_echo = None
            if clock is not None and node == self._SyncObj__raftLeader \
                    and message.get("term") == self._SyncObj__raftCurrentTerm:
                self._clock.on_append(node.id, clock, monotonic())
            if kind == "append_entries":
                self._members_scan()  # a configuration is in force from its append on
            if order == -1 and self._SyncObj__raftState != _LEADER:
                # A candidate whose log is behind ours cannot win, and it has already moved
                # the term on (no pre-vote): the leader is gone or deposed. Stand soon rather
                # than at our own timeout, which may come after the stale candidate's next
                # one (measured: a kill of the leader that took three election rounds, 2.75 s,
                # the fail-over tail). Raft leaves election timing free; safety is unchanged.
                self._stand_soon()
            elif split and self._SyncObj__raftState == _CANDIDATE:
                # Break the tie by node id instead of by another random draw (which costs a
                # whole election timeout and may split again: measured, a second round took a
                # fail-over to 2.35 s). Both candidates see the same pair of ids, so exactly one
                # stands again at once; the other waits at least a minimum timeout, and grants
                # the newer term's request when it comes.
                if self._SyncObj__selfNode.id < node.id:
                    self._stand_soon()
                else:
                    later = monotonic() + self._SyncObj__conf.raftMinTimeout
                    if self._SyncObj__raftElectionDeadline < later:
                        self._SyncObj__raftElectionDeadline = later
            self._clock.hold()  # a member whose clock disagrees stands for nothing

    # -- the walk back to where a follower's log agrees (_progress.py) -------------------------

    def _check_previous(self, message: dict) -> str | None:
        """A follower's side: before pysyncobj handles an append_entries, truncate a conflicting
        entry at its previous index (above the commit index) and note what the answer must add
        (``_tick.answer``: the index answered, and the hint). Returns what was found."""
        try:
            if message["term"] < self._SyncObj__raftCurrentTerm:
                return None  # pysyncobj ignores it
            prev = message["prevLogIdx"]
            commit = self._SyncObj__raftCommitIndex
            found, hint = _progress.follower_check(self._SyncObj__raftLog, commit, prev,
                                                   message["prevLogTerm"])
        except (KeyError, TypeError, IndexError):
            return None  # malformed: pysyncobj's handler decides, as before
        if found == "conflict":
            if prev <= commit:
                # A leader of this term or later holds every committed entry, so this node's
                # committed entry at prev is one the cluster's log does not hold: its history
                # diverged (a member that lost its data, or voted twice in a term, helped elect a
                # leader without it). It would never catch up, answer reads from a state the
                # cluster does not have, and say it is healthy: it stops, as when an applied
                # entry is replaced (docs/operations.md, Durability).
                logger.critical("replication.conflict_below_commit prev=%d commit=%d", prev, commit)
                stop_on_diverged(prev, self._SyncObj__raftLastApplied)
                hint = None
            else:
                # The entry at prev is not in the leader's log, so it is not committed, nor is
                # anything after it: drop them now, so that every later message of the leader's
                # burst gets the same answer ("from prev") instead of "from the end of my tail".
                self._SyncObj__deleteEntriesFrom(prev)
                logger.info("replication.conflicting_tail_truncated from=%d hint=%d", prev, hint)
        _tick.answer = (prev, found, hint)
        return found

    def _SyncObj__sendNextNodeIdx(self, node, reset=False, nextNodeIdx=None, success=False):
        # pysyncobj's answer, plus the previous index it answers ("prev") and the follower's hint.
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        message = {"type": "next_node_idx", "next_node_idx": nextNodeIdx, "reset": reset,
                   "success": success, "term": self._SyncObj__raftCurrentTerm}
        answer = getattr(_tick, "answer", None)
        if answer is not None:
            prev, found, hint = answer
            message["prev"] = prev
            if found == "compacted" and reset:
                # Asked about an entry below our log: every entry up to our commit index is
                # committed, hence in the leader's log. Say so (as etcd's raft does).
                message.update(next_node_idx=self._SyncObj__raftCommitIndex + 1, reset=False,
                               success=True)
            elif reset and hint is not None:
                message["next_node_idx"] = hint
        clock = self._clock.answer_field(getattr(_tick, "clock_echo", None))
        if clock is not None:
            message[_CLOCK_FIELD] = clock
        self._SyncObj__transport.send(node, message)

    def _SyncObj__onBecomeLeader(self):
        self._progress = {}
        self._clock.on_become_leader()
        self._members_on_become_leader()  # learners and the server being removed get entries too
        SyncObj._SyncObj__onBecomeLeader(self)
        # pysyncobj stamps every node as answering now, dead ones too: what it stamped is no answer.
        self._members_led_stamps = dict(self._SyncObj__lastResponseTime)

    def _SyncObj__connectedToAnyone(self):
        # pysyncobj asks this only before it stands for election: a learner, or a node not in
        # its latest configuration, never does (_membership.py).
        return self.is_voter() and SyncObj._SyncObj__connectedToAnyone(self)

    def _on_answer(self, node, message: dict) -> None:
        """The leader's side of a follower's answer (pysyncobj's ``next_node_idx``)."""
        match, nexts = self._SyncObj__raftMatchIndex, self._SyncObj__raftNextIndex
        if node not in match or node not in nexts:
            return
        pr = self._progress.get(node)
        if pr is None:
            pr = self._progress[node] = _Progress()
        term = message.get("term")
        if term is not None and term != self._SyncObj__raftCurrentTerm:
            # An answer of another term (held in a link across elections): it speaks of a log
            # this leader did not send, so it moves nothing, and it is not a sign of life.
            pr.stale_answers += 1
            return
        self._SyncObj__lastResponseTime[node] = monotonic()
        self._clock.on_answer(node.id, message.get(_CLOCK_FIELD), monotonic())
        try:
            n = int(message["next_node_idx"])
            success, reset = bool(message["success"]), bool(message["reset"])
            prev = message.get("prev")
            prev = None if prev is None else int(prev)
        except (KeyError, TypeError, ValueError):
            return
        if success:
            nexts[node], match[node], resumed = _progress.on_success(pr, nexts[node], match[node],
                                                                     n - 1)
            if resumed:  # out of probe: back to the pipeline, at once
                self._SyncObj__newAppendEntriesTime = 0
            return
        if not reset:
            return  # a part of a large entry arrived (pysyncobj's "transmission")
        if prev is None:  # an answer in pysyncobj's own form: as pysyncobj does
            nexts[node] = n
            pr.probe()
            return
        decided = _progress.on_rejection(pr, nexts[node], match[node], prev, n, getattr(node, "address", str(node)))
        if decided is None:
            return
        nexts[node], match[node] = decided
        # Each valid rejection moves the next index strictly back: probe again at once.
        self._SyncObj__newAppendEntriesTime = 0

    def _SyncObj__sendAppendEntries(self):
        """pysyncobj's sender, with a follower in probe sent one message a heartbeat period
        until it answers, and one in replicate at most ``INFLIGHT_BYTES_MAX`` unacknowledged."""
        conf = self._SyncObj__conf
        start = monotonic()
        self._SyncObj__newAppendEntriesTime = start + conf.appendEntriesPeriod
        connected = self._SyncObj__connectedNodes
        for node in self._replication_targets():  # voters, learners, read-only nodes
            pr = self._progress.get(node)
            if pr is None:
                pr = self._progress[node] = _Progress()
            if node not in connected:
                self._SyncObj__serializer.cancelTransmisstion(node)
                if not pr.probing:
                    pr.probe()  # its answers went with the connection
                continue
            if pr.probing:
                if pr.probe_sent_at is not None \
                        and start - pr.probe_sent_at < conf.appendEntriesPeriod:
                    continue  # one probe in flight
            elif pr.inflight and start - pr.last_ack > _progress.INFLIGHT_STALL_S:
                pr.probe()
            self._send_entries(node, pr, start)

    def _send_entries(self, node, pr: _Progress, start: float) -> None:
        conf = self._SyncObj__conf
        batch = conf.appendEntriesBatchSizeBytes
        log = self._SyncObj__raftLog
        transport = self._SyncObj__transport
        connected = self._SyncObj__connectedNodes
        nexts = self._SyncObj__raftNextIndex
        term, commit = self._SyncObj__raftCurrentTerm, self._SyncObj__raftCommitIndex
        send_single, sending_serialized = True, False
        nxt = nexts[node]
        while nxt <= log[len(log) - 1][1] or send_single or sending_serialized:
            if nxt > log[0][1]:
                prev_idx, prev_term = self._SyncObj__getPrevLogIndexTerm(nxt)
                entries = []
                if nxt <= log[len(log) - 1][1] and (
                        pr.probing or pr.inflight_bytes < _progress.INFLIGHT_BYTES_MAX):
                    entries = self._SyncObj__getEntries(nxt, None, batch)
                    if not pr.probing:
                        nexts[node] = entries[-1][1] + 1
                if len(entries) == 1 and len(entries[0][0]) >= batch:
                    self._send_in_parts(node, entries[0], prev_idx, prev_term)
                else:
                    msg = {"type": "append_entries", "term": term, "commit_index": commit,
                           "entries": entries, "prevLogIdx": prev_idx, "prevLogTerm": prev_term}
                    clock = self._clock.stamp(node, monotonic())
                    if clock is not None:  # the leader's clock, at most every STAMP_EVERY_S
                        msg[_CLOCK_FIELD] = clock
                    transport.send(node, msg)
                if pr.probing:
                    pr.probe_sent_at = monotonic()
                    break  # one message until it is answered
                if not entries:
                    break  # a heartbeat: nothing to send, or as much in flight as allowed
                pr.sent(entries[-1][1], sum(len(e[0]) for e in entries))
                if node not in connected:
                    break
            else:
                # Below the leader's log: its snapshot, in parts, as pysyncobj sends it.
                data = self._SyncObj__serializer.getTransmissionData(node)
                transport.send(node, {"type": "append_entries", "term": term,
                                      "commit_index": commit, "serialized": data})
                if node not in connected:
                    break
                if not data:
                    break  # nothing to send yet, or the dump could not be read (pysyncobj spun
                    #        here until the round's end)
                sending_serialized = not data[2]
                if data[2]:  # the last part: its answer ends the probe
                    nexts[node] = log[1][1] + 1
                    pr.probe()
                    pr.probe_sent_at = monotonic()
            nxt = nexts[node]
            send_single = False
            if monotonic() - start > conf.appendEntriesPeriod:
                break

    def _send_in_parts(self, node, entry, prev_idx, prev_term) -> None:
        # pysyncobj's path for one entry of a batch's size or more (raftsched's commands are
        # far below it: limits.command_bytes_max); kept as pysyncobj sends it.
        import pysyncobj.pickle as pysyncobj_pickle
        batch = self._SyncObj__conf.appendEntriesBatchSizeBytes
        data = pysyncobj_pickle.dumps(entry)
        for pos in range(0, len(data), batch):
            if pos == 0:
                part = "start"
            elif pos + batch >= len(entry[0]):
                part = "finish"
            else:
                part = "process"
            self._SyncObj__transport.send(node, {
                "type": "append_entries", "transmission": part, "data": data[pos:pos + batch],
                "term": self._SyncObj__raftCurrentTerm, "commit_index": self._SyncObj__raftCommitIndex,
                "prevLogIdx": prev_idx, "prevLogTerm": prev_term})
            if node not in self._SyncObj__connectedNodes:
                break

    def progress(self) -> dict:
        """The leader's view of each follower (id -> match and next index, state, bytes in
        flight, seconds since its last acknowledgement); empty on a follower. Called on the tick
        thread (``ReplicationWatch``); reads only, and copies."""
        if self._SyncObj__raftState != _LEADER:
            return {}
        out = {}
        match, nexts = dict(self._SyncObj__raftMatchIndex), dict(self._SyncObj__raftNextIndex)
        # When the leader last had an answer of each, of this term (_on_answer; its election
        # counts as one): last_ack_age_s is the age of the last acknowledgement that moved its
        # match index, which grows on a live follower of an idle cluster too.
        # The stamps pysyncobj wrote for every node at the election (a dead one too) are no
        # answer (_member_reachable's rule): a node not heard since is None. The stamp itself is
        # kept (``heard_at``, pysyncobj's monotonic clock): its age is taken when it is read
        # (ReplicationWatch.view), not here, so a tick thread held up does not make it look fresh.
        answered, stamped = dict(self._SyncObj__lastResponseTime), self._members_led_stamps
        for node, pr in list(self._progress.items()):
            if node in match:
                heard = answered.get(node)
                if heard is not None and heard == stamped.get(node):
                    heard = None
                out[node.id] = dict(pr.view(), match_index=match[node], next_index=nexts.get(node),
                                    rejections=pr.rejections, stale_answers=pr.stale_answers, heard_at=heard)
        return out

    def dump_now(self, timeout_s: float) -> int | None:
        """Called off the tick thread (a graceful stop): have the tick thread write a full dump
        of what this node has applied now, and trim the journal to it, and wait for both.
        pysyncobj writes one only after 5 000 entries or 5 minutes; a node stopped this way
        restarts from its own state without replaying its journal, and the nodes of a cluster
        stopped together hold dumps of what each applied (docs/operations.md, Upgrading).

        :returns: the last index the dump on disk covers (the journal trimmed to it; a leader's
            snapshot installed meanwhile counts), or None when none is written within
            ``timeout_s``, a writer forked for it failed, or the tick thread is gone (a writer
            still running finishes on its own; the next start waits for it and keeps every entry
            after its dump: _load_dump)."""
        serializer = self._SyncObj__serializer

        def covered() -> int:
            # What raft.dump covers: the last dump this process wrote (its second-to-last entry,
            # pysyncobj's id of it, is where the journal was trimmed), or a leader's snapshot
            # installed since (the journal then starts at that snapshot's last two entries).
            done = self._SyncObj__lastSerializedEntry  # (None until this process wrote one)
            try:
                first = self._SyncObj__raftLog[0][1]
            except (IndexError, TypeError):
                first = 1
            # (a journal never trimmed starts at index 1, and no dump covers it)
            return max(-1 if done is None else done, first if first > 1 else -1) + 1

        target = self._SyncObj__raftLastApplied
        if target < 2 or covered() >= target:
            return max(covered(), 0)  # nothing applied since the dump on disk
        asked = monotonic()
        self.forceLogCompaction()  # the tick thread forks the writer at its next tick
        deadline = asked + timeout_s
        pause = threading.Event()
        while monotonic() < deadline and self.tick_thread_alive():
            if covered() >= target and serializer._Serializer__pid == 0 \
                    and not getattr(self._SyncObj__raftLog, "compacting", False):  # (trimmed on disk, or a failed trim dropped)
                self._SyncObj__forceLogCompaction = False  # (no writer left behind to fork)
                return covered()
            failed, failed_at = self._dump_failed
            if failed is not None and failed >= target - 1 and failed_at >= asked \
                    and serializer._Serializer__pid == 0:
                # A writer forked for this request ended without the dump (a full disk, the
                # writer killed): pysyncobj forks another at every tick then; none will write it.
                logger.warning("replication.dump_on_stop_failed self=%s: the dump writer failed "
                               "(pysyncobj: \"Failed to store full dump\")", self._SyncObj__selfNode.id)
                return None
            pause.wait(0.005)
        return None

    def _stand_soon(self) -> None:
        soon = monotonic() + random.uniform(0.0, _STAND_SOON_S)
        if self._SyncObj__raftElectionDeadline > soon:
            self._SyncObj__raftElectionDeadline = soon

    def _SyncObj__setCurrentTerm(self, term, votedForNodeId):
        # A term learnt from its leader's append_entries is that leader's, as a vote is (Raft
        # leaves it free): a node that lost its vote with its data directory, then heard the
        # leader of the term, never votes for another candidate of that term.
        if votedForNodeId is None:
            leader = getattr(_tick, "appending_from", None)
            if leader is not None and term == getattr(_tick, "appending_term", None):
                votedForNodeId = leader
        SyncObj._SyncObj__setCurrentTerm(self, term, votedForNodeId)

    def _SyncObj__deleteEntriesFrom(self, fromIDx):
        if getattr(_tick, "keep_log_tail", False):
            return  # see _entries_already_held: no entry after prevLogIdx conflicts
        if fromIDx <= self._SyncObj__raftLastApplied:
            # The leader's log differs from this node's at an entry this node applied: its state
            # holds a command the cluster's log does not (a data directory restored from an
            # older copy somewhere, a journal removed, a disk that lost synced writes). It would
            # go on answering from that state and executing from it: it stops instead.
            stop_on_diverged(fromIDx, self._SyncObj__raftLastApplied)
        SyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)
        self._members_truncated(fromIDx)  # a configuration goes with its entry

    def _SyncObj__onSetCodeVersion(self, newVersion):
        SyncObj._SyncObj__onSetCodeVersion(self, newVersion)
        # pysyncobj's dump loader ends with this call: reached, the load went through whole.
        self._dump_load_done = True

    def _SyncObj__loadDumpFile(self, clearJournal):
        # pysyncobj's loader catches every exception, logs it and goes on. A node whose dump
        # did not load would keep an empty (or half-restored) state while its journal, trimmed
        # to the dump, can never bring it back: it still voted, acknowledged entries and could
        # win an election, after which nothing committed. It stops instead (_storage).
        self._dump_load_done = False
        try:
            loaded = self._load_dump(clearJournal)
            if not self._dump_load_done:
                stop_on_unreadable_dump("a snapshot sent by the leader" if clearJournal else "raft.dump")
            self._snapshot_installed = clearJournal  # (the leader's: its commit index may follow)
            # The dump's configuration, then the log's after it (not pysyncobj's issue 133).
            self._members_dump_index = self._SyncObj__raftLastApplied
            self._members_rebuild()
            return loaded
        finally:
            # Restoring a large state blocks the tick thread for seconds (1M jobs: ~6 s), and a
            # follower that installed the leader's snapshot then found its election deadline
            # long past and deposed the leader that had just sent it: measured, registering 1M
            # jobs moved the term from 7 to 83 in eight minutes, a snapshot install and an
            # election at a time. A load counts as hearing from the leader: the timeout starts
            # over (a dead leader is still detected, one timeout after the load).
            if self._SyncObj__raftState != _LEADER:
                self._SyncObj__raftElectionDeadline = \
                    monotonic() + self._SyncObj__generateRaftTimeout()

    def _load_dump(self, clearJournal):
        """Load the full dump without throwing away journal entries that follow it.

        pysyncobj's loader keeps the journal only if its first two entries are the two the dump
        ends with, i.e. only if the journal was trimmed after the dump. A node that stopped
        after a dump was written but before the next tick trimmed the journal (the dump is
        written by a forked child; the trim happens when the tick thread sees it finished)
        restarts with a journal that still begins further back, and the loader clears it:
        every entry after the dump, committed ones included, is gone on this node. If the whole
        cluster restarts that way, they are gone from the cluster (measured: the 100k cold
        restart in scripts/bench.py clamped every node's commit index). Here the journal is
        trimmed up to the dump first, which is what the missing tick would have done, and the
        loader then finds it consistent. A journal that does not hold the dump's entries (it
        is behind the dump, or from another history) is still replaced, as pysyncobj does; so
        is every journal when a snapshot comes from the leader (``clearJournal``).
        """
        serializer = self._SyncObj__serializer
        try:
            data = serializer.deserialize()
        except Exception:  # noqa: BLE001 - the loader below logs it and fails the same way
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        data = _without_local_fields(data)
        if not clearJournal:
            _keep_journal_after_dump(self, data)
        # The loader reads the file again: hand it the copy already read (a 1M-job dump takes
        # seconds to gunzip).
        serializer.deserialize = lambda: data
        try:
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        finally:
            del serializer.deserialize


def _stop_dump_writer(serializer) -> None:
    """Before a leader's snapshot is renamed over raft.dump: stop a dump writer this node forked
    before it, and reap it, so that it cannot rename its older dump over the snapshot afterwards
    (then the journal, which starts after the snapshot, would not follow the dump on disk, and
    the next start would drop it: every entry this node applied after the older dump). The
    tick thread then sees no writer (no trim for it); the snapshot is the dump."""
    pid = serializer._Serializer__pid
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    serializer._Serializer__pid = 0
    logger.info("replication.dump_writer_stopped pid=%d: a snapshot from the leader replaces its dump", pid)


#: Per tick thread: set while pysyncobj handles an append_entries whose entries this follower
#: already holds and whose log goes further (``_entries_already_held``).
_tick = threading.local()


class _HeldEntriesLogFilter(logging.Filter):
    """Drops pysyncobj's "truncating already-applied log entries" warning for a message whose
    entries were all held: nothing is truncated then (``_SyncObj__deleteEntriesFrom``), and
    the warning would claim a divergence that did not happen. A real truncation still logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_tick, "keep_log_tail", False)
                    and str(record.msg).startswith("truncating already-applied"))


#: The one filter ``install`` adds to pysyncobj's logger (one instance, so adding it is idempotent).
HELD_ENTRIES_LOG_FILTER = _HeldEntriesLogFilter()
#: The logger it filters: pysyncobj's SyncObj logs there.
PYSYNCOBJ_LOGGER = "pysyncobj.syncobj"


#: pysyncobj's raft states (``_RAFT_STATE``).
_CANDIDATE, _LEADER = 1, 2
#: Seconds past its election deadline a follower still names a leader it has not heard from
#: (``_forget_silent_leader``): an election, when a peer answers, clears it before that.
_SILENT_LEADER_GRACE_S = 1.0
#: A node that refuses its vote to a candidate whose log is behind its own, or that wins the tie
#: of a split vote, stands for election within this many seconds (uniformly drawn, so two such
#: nodes rarely collide).
_STAND_SOON_S = 0.1
#: A candidacy this soon after the leader asked this node to stand, or a lost leadership this
#: soon after handing it over, is a transfer's (role_cause).
_TRANSFER_CAUSE_S = 2.0


def _candidate_log_order(sync: SyncObj, message: dict) -> int | None:
    """How a request_vote's candidate's log compares with ours (Raft §5.4.1: last term, then
    last index): -1 behind (we refuse it), 0 as recent, 1 more recent; None for a request from
    an older term or a malformed one."""
    try:
        if message["term"] < sync._SyncObj__raftCurrentTerm:
            return None
        log = sync._SyncObj__raftLog
        last = log[len(log) - 1]
        theirs, ours = (message["last_log_term"], message["last_log_index"]), (last[2], last[1])
        return (theirs > ours) - (theirs < ours)
    except (KeyError, TypeError, IndexError):
        return None


def _entries_already_held(sync: SyncObj, message: dict):
    """Raft's AppendEntries receiver rule for entries this follower already holds.

    pysyncobj deletes every entry after ``prevLogIdx`` whenever its log goes further, then
    appends the message's entries, even when those entries are ones it holds already (same
    index, same term). Raft deletes only from the first *conflicting* entry. The difference
    bites on a late or repeated append_entries (a resend after a ``reset``, a leader going
    back after a stale answer): a follower that had acknowledged entries 1..10 receives 1..6
    again and drops 7..10, which the leader has already counted toward a commit. Until they
    are sent again, those committed entries exist on fewer nodes than the leader believes;
    if it dies then, they can be lost (logged by pysyncobj as "truncating already-applied log
    entries", seen in every busy benchmark run).

    Returns None to let pysyncobj handle the message as it is (the previous entry does not
    match, or the first entry is new or conflicts), or ``(message, keep_tail)``: a copy with
    the already-held prefix of the entries dropped (``prevLogIdx`` moved to the last held
    one). ``keep_tail`` is True when every entry was held and the log goes further: then
    nothing is deleted, and the commit index the message carries is capped at the last
    entry it vouched for (Raft: min(leaderCommit, index of last new entry)), because the
    entries after it have not been checked against the leader's log.
    """
    log = sync._SyncObj__raftLog
    n = len(log)
    if n == 0:
        return None
    first = log[0][1]
    prev = message["prevLogIdx"]
    p = prev - first
    if p < 0 or p >= n or log[p][2] != message["prevLogTerm"]:
        return None
    entries = message["entries"]
    k = 0
    for e in entries:
        q = e[1] - first
        if q >= n or log[q][2] != e[2]:
            break
        k += 1
    if k == 0:
        return None
    out = dict(message)
    out["prevLogIdx"], out["prevLogTerm"] = entries[k - 1][1], entries[k - 1][2]
    out["entries"] = list(entries[k:])
    keep_tail = k == len(entries) and entries[-1][1] < log[n - 1][1]
    if keep_tail:
        out["commit_index"] = min(message["commit_index"], entries[-1][1])
    return out, keep_tail


def _empty_append(sync: SyncObj, message: dict):
    """Raft's receiver rule for an append_entries with no entries whose previous entry matches:
    nothing is deleted (pysyncobj deleted everything after ``prevLogIdx``, so a late heartbeat
    dropped entries the follower had acknowledged), and the commit index it carries is capped at
    ``prevLogIdx``, the last entry it vouches for. None when the log ends at ``prevLogIdx``
    (nothing to keep: pysyncobj's handling is already right)."""
    log = sync._SyncObj__raftLog
    if log[len(log) - 1][1] <= message["prevLogIdx"]:
        return None
    return dict(message, commit_index=min(message["commit_index"], message["prevLogIdx"]))


#: The first byte of a replicated call's entry (pysyncobj's _COMMAND_TYPE.REGULAR).
_REGULAR = b"\x00"
#: Entries apply reads as nothing: pysyncobj's no-op (a new leader's first) and this package's
#: configuration entries (read by the membership log, not by apply).
_APPLIED_AS_NOTHING = (b"\x01", bytes([CONFIG_ENTRY]))


#: When a vote withheld by _vote_withheld was last logged (monotonic seconds; one line a second).
_withheld_logged = [0.0]


def _vote_withheld(sync: SyncObj, node, message: dict) -> bool:
    """A vote request this node does not answer because its log is empty (nothing but the
    initial entry of term 0: a new member, or one whose data directory was lost) and the
    candidate's is not. Such a node cannot tell a candidate that holds every committed entry
    from one that missed some, and a data directory lost with its term and vote may already
    have voted in the term asked for: granted, its vote let a member whose log lacked
    acknowledged entries win, and the leader replaced them (found by a disaster-recovery walk:
    a member restarted on an empty directory with its old --peers, a 201 then a 404, and one
    fencing token granted twice). A fresh cluster elects its first leader as before (every log
    is empty until then). Once a leader sends it entries, the node votes as any member. The price:
    the cluster waits (no leader) whenever the members that are up and hold a log are fewer than
    a majority of the voters, as when a first leader reached one member of three and died before
    the third heard from it, or when a member with the log is lost for good beside one whose log
    is empty (then only a restore recovers). Two members that both lost their logs can still
    elect one of them: a double fault this does not cover."""
    try:
        log = sync._SyncObj__raftLog
        if log[len(log) - 1][2] != 0 or message["last_log_term"] == 0:
            return False
    except (KeyError, TypeError, IndexError):
        return False
    now = monotonic()
    if now - _withheld_logged[0] >= 1.0:
        _withheld_logged[0] = now
        logger.warning("replication.vote_withheld candidate=%s term=%s: this node's log is empty (a new member, or "
                       "a data directory that was lost) and the candidate's is not; it votes once a leader has sent "
                       "it the log", getattr(node, "id", node), message.get("term"))
    return True


def _membership_forbidden(sync: SyncObj, node, kind, message: dict) -> bool:
    """Messages that would bypass the membership rules, dropped: a vote request from a node that
    is no voter in this node's latest configuration (a learner, a removed server: it would move
    the term on and depose a healthy leader; hashicorp/raft ignores them alike), a vote from a
    node that is no voter (pysyncobj counts every answer), and a forwarded command carrying a
    configuration entry's type (only the leader's own rules append one; it is refused)."""
    if kind == "request_vote":
        return getattr(node, "id", None) not in sync._members().latest.voters or _vote_withheld(sync, node, message)
    if kind == "response_vote":
        return node not in sync._SyncObj__otherNodes
    if kind == "apply_command":
        command = message.get("command")
        # A follower forwards only replicated calls: anything else (a configuration entry, which
        # only the leader's own rules append; pysyncobj's membership or version entries; no bytes
        # at all) is refused, not appended for every replica to trip on.
        if type(command) is not bytes or command[:1] != _REGULAR:
            if "request_id" in message:
                sync._SyncObj__transport.send(node, {"type": "apply_command_response",
                                                     "request_id": message["request_id"],
                                                     "error": REFUSED_COMMAND})
            return True
    return False


#: The one field of a SyncObj's own that pysyncobj replicates through its dumps here (the
#: state is its consumer's): its code version (setCodeVersion, never called by raftsched).
_REPLICATED_FIELDS = frozenset({"_SyncObj__enabledCodeVersion"})


class _LocalFields(set):
    """What pysyncobj's dump leaves out of a SyncObj's own attributes: every one but
    _REPLICATED_FIELDS (it tests ``name not in properties``)."""

    def __contains__(self, name: object) -> bool:
        return name not in _REPLICATED_FIELDS


def _without_local_fields(data):
    """A deserialized dump (``(state, last, before_last, cluster)``, state ``[own fields,
    consumer...]``) without the node-local fields an older dump carried in its own fields."""
    try:
        state = data[0]
        if isinstance(state, list) and state and isinstance(state[0], dict):
            own = {k: v for k, v in state[0].items() if k in _REPLICATED_FIELDS}
            return ([own] + state[1:],) + tuple(data[1:])
    except (TypeError, IndexError):  # (malformed: the loader says so)
        pass
    return data


def _keep_journal_after_dump(sync: SyncObj, data) -> None:
    """Trim ``sync``'s journal so that it begins with the dump's last two entries, if it holds
    them (``data`` is a deserialized dump: ``(state, last, before_last, cluster)``)."""
    try:
        last, before = tuple(data[1]), tuple(data[2])
        log = sync._SyncObj__raftLog
        if len(log) < 2:
            return
        pos = before[1] - log[0][1]
        if pos <= 0 or pos + 1 >= len(log):
            return  # already trimmed (pos 0), or the journal does not reach past the dump
        if tuple(log[pos]) != before or tuple(log[pos + 1]) != last:
            return
        logger.warning("replication.journal_untrimmed_after_dump first=%d dump_last=%d "
                       "journal_last=%d (stopped between a dump and its trim; keeping the "
                       "entries after the dump)", log[0][1], last[1], log[len(log) - 1][1])
        sync._SyncObj__deleteEntriesTo(before[1])
    except Exception:  # noqa: BLE001 - fall back to pysyncobj's own rule, never fail the load
        logger.exception("replication.journal_trim_check_failed")


# The overrides above replace pysyncobj internals by their mangled names. If a pysyncobj release
# renamed one, the override would silently stop applying: ``install`` refuses to run instead.
# (The private attributes they read are exercised by tests/test_replication_syncobj.py.)
_OVERRIDDEN = ("_SyncObj__applyLogEntries", "_SyncObj__onMessageReceived", "_SyncObj__doApplyCommand",
               "_SyncObj__deleteEntriesFrom", "_SyncObj__deleteEntriesTo", "_SyncObj__setCurrentTerm",
               "_SyncObj__loadDumpFile", "_SyncObj__onSetCodeVersion", "_SyncObj__generateRaftTimeout",
               "_SyncObj__sendNextNodeIdx", "_SyncObj__onBecomeLeader",
               "_SyncObj__sendAppendEntries", "_SyncObj__getPrevLogIndexTerm",
               "_SyncObj__getEntries", "_SyncObj__getCurrentLogIndex",
               "_SyncObj__connectedToAnyone", "transferLeadership")
