"""Replication: the only module that imports pysyncobj.

``RaftNode`` replicates one state object (``apply_bytes`` / ``snapshot`` / ``restore``) through a
pysyncobj 0.3.17 Raft group with static membership, and gives the asyncio world three things:
``await propose(bytes) -> result``, leadership events, and ``status()``. ``LocalLog`` has the same
API for a single in-process replica, for tests of the upper layers.

pysyncobj is used from the outside only, through its extension points (a ``SyncObjConsumer``, a
``transportClass``, ``addOnTickCallback``, ``onStateChanged``, the conf), because several of its
behaviours are traps (measured on 0.3.17; the figures are in RAFT_CONF_DEFAULTS):

- An exception inside a replicated method wedges the node forever, and an exception inside a
  result callback makes it apply the same entry again. ``_apply`` and every callback here catch
  everything.
- Results come back on pysyncobj's tick thread. Callbacks only hand them to the event loop
  (through a ``LoopInbox``: one ``loop.call_soon_threadsafe`` for all the results that arrive
  before the loop drains them); a timed-out ``propose`` does not cancel anything in pysyncobj (it
  cannot), so a late result is dropped and the command may still apply: ``Indeterminate``.
- Its messages are pickles. A node never starts without a secret, every message is
  authenticated before it is unpickled (AES-256-GCM, ``_AeadEncryptor``, in place of pysyncobj's
  Fernet, which cost ~14x more per message), and the Raft port binds only on ``self_addr``'s host
  (pysyncobj binds 0.0.0.0 unless ``bindAddress`` is set).
- ``SyncObjConf`` silently accepts misspelt options: ``make_conf`` refuses unknown keys.
- A journal without a full dump file loses the state after a compaction and a restart: both files
  are always set, in ``data_dir``.
- The tick thread that runs Raft also serialises snapshots. The dump is written by a forked child
  (``useFork``), and the state is encoded *in the child* (see ``_DeferredSnapshot``), so a
  compaction costs the tick thread a ``fork()``, not an encoding of the whole state.
- Membership is static: pysyncobj's membership change is unsafe (its one-change-at-a-time guard
  is dead code), so ``dynamicMembershipChange`` is refused.
- Its cost is per log entry (one encrypted append_entries to each follower and one answer back,
  with batching off), so ``propose`` commits the commands proposed in one turn of the event loop
  as one entry, a group, applied in order and answered one by one (``RaftNode._enqueue``).

Threading contract: ``start``, ``propose``, ``barrier``, ``status``, ``is_leader``, ``read`` and
``stop`` are called from the event loop thread. The state is single-threaded: the lock that keeps
the tick thread's applies and the loop's reads (``read``) apart is this module's. ``start`` must run on a thread that outlives the node (the loop
thread): pysyncobj's tick thread exits when the thread that created the ``SyncObj`` ends.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import gc
import gzip
import itertools
import logging
import os
import random
import threading
import time
import zlib
from typing import Any, Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use
from pysyncobj import journal as _pysyncobj_journal
from pysyncobj import serializer as _pysyncobj_serializer
from pysyncobj import tcp_connection as _pysyncobj_tcp_connection
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from .core import limits
from .core.errors import Indeterminate, LimitExceeded, Unavailable
from .node.aio import LoopInbox

logger = logging.getLogger(__name__)

__all__ = ["make_conf", "RaftNode", "LocalLog", "RAFT_CONF_DEFAULTS", "BARRIER_NOOP"]

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

#: Every option SyncObjConf knows, read from a default instance (its __init__ assigns them all).
_KNOWN_CONF_KEYS = frozenset(vars(SyncObjConf()).keys())

#: Tuned defaults, with the figures behind them (2 vCPU, loopback, password on; "in one process"
#: = three RaftNodes sharing one interpreter, as in tests/test_replication.py).
RAFT_CONF_DEFAULTS: dict[str, Any] = {
    # Batching off. With batching on (pysyncobj's default) a lone command waits for the next
    # heartbeat: a lone propose measured p50 103 ms on the leader, 207 ms on a follower (60
    # sequential proposals, in one process); the shared notes: 101.5 ms, i.e. ~10 writes/s. Off,
    # the leader sends append_entries at once: p50 2.7 ms on the leader, 3.7 ms on a follower (in
    # one process, so the three nodes share a GIL; 0.25 ms in the notes' 3-process bench without
    # a password). Throughput comes from batching at the command level (one `fire` for all due
    # slots, one `heartbeat` per worker), which costs less than pysyncobj's batching gives
    # (notes: 11.8k vs 15.8k ops/s).
    "appendEntriesUseBatch": False,
    # Heartbeat. pysyncobj requires raftMinTimeout > 3 x appendEntriesPeriod; 0.1 s lets a
    # follower miss four heartbeats (a ~0.4 s stall of a tick thread: GC, a large apply) before
    # it runs for leader.
    "appendEntriesPeriod": 0.1,
    # Election timeout, drawn uniformly in [min, max]. pysyncobj has no pre-vote: a spurious
    # election deposes a healthy leader, so the floor stays at five heartbeats rather than the
    # 0.3 s that gave the fastest fail-over in the notes (0.41 s). Measured kill -9 of the leader
    # -> first commit on a survivor, 3 processes: medians 0.65, 0.86 and 0.65 s over three runs
    # of 8 kills (range 0.53-1.7 s); 1.0/2.0 measured 1.56 s in the notes. Inside the 5 s misfire
    # grace (limits.grace_s_default) either way.
    "raftMinTimeout": 0.5,
    "raftMaxTimeout": 1.0,
    # A leader cut off from the majority steps down after this long without answers (pysyncobj
    # default 30 s: a zombie leader for 30 s). 1.0 s = raftMaxTimeout, so an old and a new leader
    # both believe they lead for at most ~0.5 s. Nothing may be decided on that belief alone:
    # fires, leases and reads go through the log.
    "leaderFallbackTimeout": 1.0,
    # A connection with nothing received for this long is dropped. pysyncobj requires it to be
    # >= raftMaxTimeout. Every link carries a keepalive every _KEEPALIVE_PERIOD_S (0.5 s) and the
    # leader's links a heartbeat every 0.1 s, so 2.0 s is four lost keepalives: it detects a
    # black-holed or paused peer in 2 s and does not flap on a GC pause.
    "connectionTimeout": 2.0,
    # pysyncobj's dialling side retries a dead peer only every connectionRetryTime (default 5 s).
    # A restarted node runs for leader after 0.5-1.0 s without a heartbeat and, with no pre-vote,
    # deposes the healthy leader: at 0.25 s the leader's reconnect + key exchange + first
    # heartbeat (<= ~0.35 s) lands before the restarted node's earliest election timeout. A
    # connect attempt to a dead peer costs one SYN.
    "connectionRetryTime": 0.25,
    # Fail fast with MISSING_LEADER (definite) instead of queueing commands inside pysyncobj until
    # some leader appears, possibly long after the caller gave up. propose() itself waits for a
    # reachable leader until its deadline, resubmitting only after definite failures.
    "commandsWaitLeader": False,
    # Bound on commands queued for the tick thread: ~1 s of backlog at pysyncobj's ~10k ops/s;
    # beyond that callers get QUEUE_FULL (Unavailable, 503) instead of growing latency.
    "commandsQueueSize": 10_000,
    # Dumps are written by a forked child, which also encodes the state (see _DeferredSnapshot):
    # the tick thread pays for fork() only. In-thread, 200k jobs blocked the tick thread 6-7 s
    # and caused elections (notes).
    "useFork": True,
    "logCompactionMinEntries": 5000,
    "logCompactionMinTime": 300,
    "bindRetryTime": 0.5,
    "dynamicMembershipChange": False,
}

#: Keys RaftNode sets itself; conf_overrides may not change them.
_RESERVED_CONF_KEYS = frozenset({
    "password", "journalFile", "fullDumpFile", "bindAddress", "onStateChanged", "onReady",
    "dynamicMembershipChange", "serializer", "deserializer", "serializeChecker", "autoTick",
    "useFork",
})

#: Keepalive period on every link; see _RaftTransport.
_KEEPALIVE_PERIOD_S = 0.5
#: The keepalive message. A dict with an unknown 'type', so that a peer running a plain
#: TCPTransport ignores it too (SyncObj dispatches on message['type'] and has no else branch).
_KEEPALIVE_MESSAGE = {"type": "raftsched_keepalive"}

#: The log entry barrier() proposes when no barrier_command is given. _apply recognises it and
#: returns without touching the state: it is applied for its position in the log only.
BARRIER_NOOP = b""

#: Pause between two attempts of a proposal that failed definitely for want of a leader.
_RETRY_PAUSE_S = 0.025

#: Bytes a command adds to a group's pickled tuple beyond its own (opcode, length, memo).
_GROUP_ITEM_BYTES = 8
#: The reason a proposal's future is settled with when its deadline passes first.
_TIMED_OUT = "raftsched_timed_out"


def make_conf(**kwargs: Any) -> SyncObjConf:
    """Build a ``SyncObjConf``, refusing what pysyncobj would silently ignore or assert on.

    :raises ValueError: for a key SyncObjConf does not know (pysyncobj accepts typos as no-ops),
        or for values that break its own invariants.
    """
    unknown = sorted(set(kwargs) - _KNOWN_CONF_KEYS)
    if unknown:
        raise ValueError(f"unknown SyncObjConf option(s): {', '.join(unknown)}")
    conf = SyncObjConf(**kwargs)
    # SyncObjConf.validate() uses bare asserts (gone under -O, and without messages): check the
    # timing relations ourselves, then let validate() catch the rest.
    if not conf.raftMinTimeout > 3 * conf.appendEntriesPeriod:
        raise ValueError("raftMinTimeout must be > 3 x appendEntriesPeriod")
    if not conf.raftMaxTimeout > conf.raftMinTimeout:
        raise ValueError("raftMaxTimeout must be > raftMinTimeout")
    if not conf.connectionTimeout >= conf.raftMaxTimeout:
        raise ValueError("connectionTimeout must be >= raftMaxTimeout")
    if not conf.leaderFallbackTimeout > conf.appendEntriesPeriod:
        raise ValueError("leaderFallbackTimeout must be > appendEntriesPeriod")
    try:
        conf.validate()
    except AssertionError:
        raise ValueError("SyncObjConf.validate() refused the options") from None
    return conf


# ---------------------------------------------------------------------------------------------
# The replicated state
# ---------------------------------------------------------------------------------------------

_DUMP_FORMAT = 1


class _DeferredSnapshot:
    """Pickles as ``state.snapshot()`` bytes, encoded when pickled, not when created.

    pysyncobj builds the dump data on its tick thread, then forks and pickles it in the child. By
    deferring the encoding to pickling time, the child encodes its copy-on-write image of the
    state and the tick thread only pays for ``fork()``. The tick thread holds the state's lock
    across the fork (``_StateConsumer._serialize``), so in the child the lock is owned by the
    surviving thread and may be taken again (it is an RLock); no other thread can be half-way
    through the state in the copied image. Unpickled, it is plain ``bytes``.

    The collector is paused while the child encodes: building the snapshot's job maps allocates
    millions of containers at 1M jobs, and young collections over a large heap made it 2.7x
    slower (200 000 jobs: 3.5 s -> 1.3 s).
    """

    __slots__ = ("_state", "_lock")

    def __init__(self, state, lock):
        self._state = state
        self._lock = lock

    def __reduce__(self):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self._lock:
                return (bytes, (bytes(self._state.snapshot()),))
        finally:
            if was_enabled:
                gc.enable()


def _error_result(code: str, message: str) -> dict:
    return {"ok": False, "error": {"code": code, "message": message, "field": None}}


class _SyncObj(SyncObj):
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
    """

    def __init__(self, *args, encryptor: "_AeadEncryptor | None" = None, **kwargs):
        # Set before SyncObj.__init__: its tick thread may connect to peers right away.
        self._raft_encryptor = encryptor
        super().__init__(*args, **kwargs)

    @property
    def encryptor(self):
        """What pysyncobj's transport protects each connection with: ours (``_AeadEncryptor``)
        when given, else pysyncobj's Fernet from ``password``."""
        if self._raft_encryptor is not None:
            return self._raft_encryptor
        return SyncObj.encryptor.fget(self)

    def _SyncObj__applyLogEntries(self):
        t0 = monotonic()
        res = SyncObj._SyncObj__applyLogEntries(self)
        spent = monotonic() - t0
        if spent > _APPLY_STALL_S and not self._isLeader():
            self._SyncObj__raftElectionDeadline += spent
        return res

    def _SyncObj__onMessageReceived(self, node, message):
        kind = message.get("type") if type(message) is dict else None
        if kind == "append_entries" and message.get("entries") and "prevLogIdx" in message \
                and "transmission" not in message:
            held = _entries_already_held(self, message)
            if held is not None:
                message, _tick.keep_log_tail = held
        order = _candidate_log_order(self, message) if kind == "request_vote" else None
        # Two candidates of one term with equally recent logs: a split vote (each voted for
        # itself), seen from both sides as each one's request reaches the other.
        split = order == 0 and self._SyncObj__raftState == _CANDIDATE \
            and message["term"] == self._SyncObj__raftCurrentTerm
        try:
            return SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            _tick.keep_log_tail = False
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

    def _stand_soon(self) -> None:
        soon = monotonic() + random.uniform(0.0, _STAND_SOON_S)
        if self._SyncObj__raftElectionDeadline > soon:
            self._SyncObj__raftElectionDeadline = soon

    def _SyncObj__deleteEntriesFrom(self, fromIDx):
        if getattr(_tick, "keep_log_tail", False):
            return  # see _entries_already_held: no entry after prevLogIdx conflicts
        return SyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)

    def _SyncObj__deleteEntriesTo(self, toIDx):
        # A compaction: pysyncobj rewrites the entries it keeps from the start of the file.
        SyncObj._SyncObj__deleteEntriesTo(self, toIDx)
        _cut_journal_file(self._SyncObj__raftLog)

    def _SyncObj__loadDumpFile(self, clearJournal):
        try:
            return self._load_dump(clearJournal)
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
        if clearJournal:
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        try:
            data = serializer.deserialize()
        except Exception:  # noqa: BLE001 - the loader below logs it and fails the same way
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        _keep_journal_after_dump(self, data)
        # The loader reads the file again: hand it the copy already read (a 1M-job dump takes
        # seconds to gunzip).
        serializer.deserialize = lambda: data
        try:
            return SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        finally:
            del serializer.deserialize


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


logging.getLogger("pysyncobj.syncobj").addFilter(_HeldEntriesLogFilter())


#: pysyncobj's raft states (``_RAFT_STATE``).
_CANDIDATE, _LEADER = 1, 2
#: A node that refuses its vote to a candidate whose log is behind its own, or that wins the tie
#: of a split vote, stands for election within this many seconds (uniformly drawn, so two such
#: nodes rarely collide).
_STAND_SOON_S = 0.1


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
# renamed one, the override would silently stop applying: refuse to run instead. (The private
# attributes they read are exercised by tests/test_replication.py.)
_OVERRIDDEN = ("_SyncObj__applyLogEntries", "_SyncObj__onMessageReceived",
               "_SyncObj__deleteEntriesFrom", "_SyncObj__deleteEntriesTo",
               "_SyncObj__loadDumpFile", "_SyncObj__generateRaftTimeout")
_missing = [n for n in _OVERRIDDEN if not hasattr(SyncObj, n)]
if not hasattr(_pysyncobj_serializer, "gzip"):  # _FastGzip stands in for it
    _missing.append("serializer.gzip")
if not ("ResizableFile" in _pysyncobj_journal.FileJournal.__init__.__code__.co_names
        and hasattr(_pysyncobj_journal, "ResizableFile")):  # _JournalFile stands in for it
    _missing.append("journal.FileJournal -> ResizableFile")
if _missing:  # pragma: no cover - only with an unsupported pysyncobj
    raise ImportError(f"raftsched.replication needs pysyncobj 0.3.x internals {_missing}")


#: An apply longer than this extends a follower's election deadline by its duration (_SyncObj).
_APPLY_STALL_S = 0.02


class _StateConsumer(SyncObjConsumer):
    """Holds the state for pysyncobj. The state is set before SyncObj exists (a state assigned
    after SyncObj.__init__ races its tick thread, which may already apply the journal)."""

    def __init__(self, state, lock=None):
        super().__init__()
        self._state = state
        #: Keeps applies (the tick thread) and reads (RaftNode.read, the loop) apart.
        self._lock = lock if lock is not None else threading.RLock()
        # True while the tick thread holds the lock across a dump fork; released by
        # _release_snapshot_lock on the same thread at the end of the same tick.
        self._snapshot_lock_held = False

    # A single replicated method, forever: pysyncobj numbers replicated methods by sorted
    # (version, name), so adding one could renumber the ids stored in old log entries. Commands
    # are versioned inside the msgpack envelope instead.
    @replicated
    def _apply(self, data: bytes | tuple) -> dict | list:
        if isinstance(data, tuple):
            # A group (RaftNode._flush_group): commands proposed in one event-loop turn and
            # committed as one log entry. Each is applied in order, exactly as if it had its own
            # entry, and gets its own result; under one lock, so readers see whole groups.
            with self._lock:
                return [self._apply_one(d) for d in data]
        with self._lock:
            return self._apply_one(data)

    def _apply_one(self, data: bytes) -> dict:
        if data == BARRIER_NOOP:
            return {"ok": True}
        try:
            return self._state.apply_bytes(data)
        except BaseException as e:  # noqa: BLE001 - an exception here wedges pysyncobj forever
            logger.critical("replication.apply_raised error=%r (a bug in apply_bytes; the entry "
                            "is recorded as refused on this replica)", e, exc_info=True)
            return _error_result("internal", f"apply failed: {type(e).__name__}")

    def _serialize(self) -> dict:
        # Called on the tick thread right before pysyncobj forks the dump writer. See
        # _DeferredSnapshot for why the lock is held across the fork.
        if not self._snapshot_lock_held:
            self._lock.acquire()
            self._snapshot_lock_held = True
        return {"format": _DUMP_FORMAT, "state": _DeferredSnapshot(self._state, self._lock)}

    def _release_snapshot_lock(self) -> None:
        if self._snapshot_lock_held:
            self._snapshot_lock_held = False
            self._lock.release()

    def _deserialize(self, data) -> None:
        # A full dump loaded at start-up, or a snapshot installed from the leader. pysyncobj
        # catches and logs an exception here and leaves the node unable to apply further: a
        # fail-stop, which beats applying entries to a half-restored state.
        if not isinstance(data, dict) or data.get("format") != _DUMP_FORMAT \
                or not isinstance(data.get("state"), (bytes, bytearray)):
            logger.critical("replication.dump_unreadable type=%s", type(data).__name__)
            raise ValueError("unreadable raftsched dump")
        started = time.monotonic()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with self._lock:
                self._state.restore(bytes(data["state"]))
            # The restored state is long-lived: frozen out of the collector's walks before it
            # runs again. Otherwise the next young collection walks every object restored
            # (1.0-1.3 s at 1M jobs, the GIL held: longer than the election timeout).
            # node/gcpause.py does the same as the state grows.
            gc.freeze()
        finally:
            if was_enabled:
                gc.enable()
        logger.info("replication.restored bytes=%d ms=%.1f", len(data["state"]),
                    (time.monotonic() - started) * 1000)


# ---------------------------------------------------------------------------------------------
# Message protection: AES-256-GCM in place of Fernet
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _master_key(secret: str) -> bytes:
    # Stretched like pysyncobj's own key (PBKDF2-SHA256, 100 000 rounds), with our own salt so the
    # two keys are unrelated. Cached: a test process starts many nodes with one secret.
    return PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=b"raftsched raft key v1",
                      iterations=100_000).derive(secret.encode())


class _AeadEncryptor:
    """Protects every Raft message with AES-256-GCM, in pysyncobj's encryptor interface
    (``encrypt_at_time`` / ``extract_timestamp`` / ``decrypt``; pysyncobj zlib-compresses the
    pickle first and refuses a timestamp older than the last one seen on the connection).

    Why not pysyncobj's Fernet: its per-message cost is mostly Python (AES-CBC, padding, a
    separate HMAC, base64 both ways): ~56 us for a 200-byte message, 790 us for 32 KB, against
    ~4 and ~30 us here (one C call each way), and Raft traffic is several messages per command.
    The guarantee is the same: nothing unauthenticated is unpickled, and the traffic is secret.

    Nonces never repeat under one key: each process draws a random 16-byte salt, derives its own
    sending key from the master key with HKDF, and numbers its messages (a 96-bit counter). The
    salt travels in each message, so a receiver derives the sender's key once and keeps it
    (only after a message under it verified, so garbage cannot fill the cache).

    Token: version (1) | salt (16) | timestamp (8) | nonce (12) | ciphertext and tag; the first
    three are authenticated as associated data.
    """

    _VERSION = b"\x01"
    _AAD_END = 1 + 16 + 8
    _NONCE_END = _AAD_END + 12
    _TAG = 16
    _PEER_KEYS_MAX = 256

    def __init__(self, secret: str):
        self._master = _master_key(secret)
        self._salt = os.urandom(16)
        self._aead = AESGCM(self._subkey(self._salt))
        self._count = itertools.count(1)
        self._peer_keys: dict[bytes, AESGCM] = {}

    def _subkey(self, salt: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt,
                    info=b"raftsched raft aes-256-gcm v1").derive(self._master)

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        head = self._VERSION + self._salt + int(current_time).to_bytes(8, "big")
        nonce = next(self._count).to_bytes(12, "big")
        return head + nonce + self._aead.encrypt(nonce, bytes(data), head)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < self._NONCE_END + self._TAG or token[:1] != self._VERSION:
            raise ValueError("not a raftsched Raft message")
        return int.from_bytes(token[17:self._AAD_END], "big")

    def decrypt(self, token: bytes) -> bytes:
        token = bytes(token)
        self.extract_timestamp(token)  # checks the version and the length
        salt = token[1:17]
        aead = self._peer_keys.get(salt)
        known = aead is not None
        if not known:
            aead = AESGCM(self._subkey(salt))
        data = aead.decrypt(token[self._AAD_END:self._NONCE_END], token[self._NONCE_END:],
                            token[:self._AAD_END])  # raises InvalidTag: pysyncobj disconnects
        if not known:
            if len(self._peer_keys) >= self._PEER_KEYS_MAX:
                self._peer_keys.clear()  # peers restarted many times; re-derived on use
            self._peer_keys[salt] = aead
        return data


class _Uncompressed:
    """Stands in for ``zlib`` in ``pysyncobj.tcp_connection``, which compresses every message
    (level 3) before sealing it. ``deflateInit`` alone costs ~20 us, so a 180-byte message paid
    ~20 us to save 15 bytes, several times per run; a 24 KB fire command paid ~145 us to send
    and ~50 us to read, per follower. Loopback and LAN links are not what bounds this system;
    CPU is. A message is now its pickle behind a 0 byte (a zlib stream never starts with one),
    and a zlib stream is still read."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        return b"\x00" + data

    @staticmethod
    def decompress(data: bytes) -> bytes:
        if data[:1] == b"\x00":
            return data[1:]
        return zlib.decompress(data)


_pysyncobj_tcp_connection.zlib = _Uncompressed


class _JournalFile:
    """Stands in for ``ResizableFile`` under pysyncobj's ``FileJournal``: the same file, in the
    same format, written with ``pwrite`` instead of through a shared mmap.

    Through the mmap, every page of the journal a node had written stayed mapped in the process
    and counted in its resident memory, on top of the very same entries that ``FileJournal``
    keeps in a list; and the mmap only ever grew (by doubling). Measured on a cluster
    registering 1M jobs: 220 MB of each node's resident memory was journal pages (RssFile), the
    file 334 MB for 89 MB of live records. Written with pwrite, the pages are the kernel's page
    cache, which it reclaims, and the file is cut back to its live records after every
    compaction (``_SyncObj.__deleteEntriesTo``). Durability is unchanged: a store to the mmap
    and a pwrite are both in the page cache when they return, safe from a killed process and
    not from a power loss (pysyncobj never msyncs while running; docs/operations.md)."""

    def __init__(self, fileName, initialSize=1024, resizeFactor=2.0, defaultContent=None):
        if not os.path.exists(fileName):
            with open(fileName, "wb") as f:
                if defaultContent is not None:
                    f.write(defaultContent)
        self._fd = os.open(fileName, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        if os.fstat(self._fd).st_size < initialSize:
            os.ftruncate(self._fd, initialSize)

    def write(self, offset: int, values) -> None:
        view = memoryview(values)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def truncate(self, size: int) -> None:
        """Drop what follows ``size`` (dead records past the journal's end)."""
        if os.fstat(self._fd).st_size > size:
            os.ftruncate(self._fd, size)

    def flush(self) -> None:
        os.fsync(self._fd)

    def _destroy(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()  # as ResizableFile's msync at close
            finally:
                os.close(self._fd)
                self._fd = -1


_pysyncobj_journal.ResizableFile = _JournalFile


class _FastGzip:
    """Stands in for ``gzip`` in ``pysyncobj.serializer``, which writes full dumps with
    ``gzip.GzipFile``'s default level, 9. A dump is the msgpack snapshot inside a pickle, and
    level 9 spends seconds in its lazy matching for nothing: measured on a 200k-job snapshot
    (16 MB), level 9 took 2.92 s and made 1.82 MB, level 1 0.10 s and 1.70 MB. At 1M jobs
    that is ~15 s of the forked dump writer's CPU on a shared machine, for every compaction,
    and for every snapshot a leader sends. The file is still gzip: every dump reads as before."""

    BadGzipFile = gzip.BadGzipFile

    @staticmethod
    def GzipFile(filename=None, mode=None, compresslevel=1, fileobj=None, mtime=None):
        return gzip.GzipFile(filename, mode, compresslevel, fileobj, mtime)


_pysyncobj_serializer.gzip = _FastGzip


def _cut_journal_file(journal) -> None:
    """Cut a FileJournal's file back to its live records (after a compaction rewrote them from
    the start); a MemoryJournal has no file."""
    f = getattr(journal, "_FileJournal__journalFile", None)
    end = getattr(journal, "_FileJournal__currentOffset", None)
    if isinstance(f, _JournalFile) and isinstance(end, int):
        try:
            f.truncate(end)
        except OSError:
            logger.exception("replication.journal_truncate_failed")


# ---------------------------------------------------------------------------------------------
# Transport: dial map, keepalive, bind warnings
# ---------------------------------------------------------------------------------------------

class _RaftTransport(TCPTransport):
    """pysyncobj's TCP transport with three additions.

    - ``dial_map``: this node dials ``dial_map[peer]`` instead of the peer's own address, and
      still identifies the link by the peer's address (so one TCP proxy per link can cut it).
      Only the node with the larger address dials a link (pysyncobj's rule), so a map entry for
      a larger-addressed peer is unused.
    - A keepalive to every connected peer every 0.5 s. pysyncobj only notices a dead link when it
      sends on it, and follower<->follower links carry nothing while a leader lives: the first
      vote request after a leader dies hit connectionTimeout on that idle link, was lost, and the
      election needed a second round. Measured (in one process, links idle 2.6 s, 5 kills
      each): leader stop -> first commit, median 1.46 s without the keepalive, 0.56 s with it
      (notes, 3 processes: 1.26 s -> 0.41 s). The keepalive is swallowed on receipt: SyncObj
      never sees it, so it cannot keep a cut-off leader believing it leads.
    - A warning while the Raft port cannot be bound (pysyncobj retries silently forever).
    """

    def __init__(self, syncObj, selfNode, otherNodes, *, dial_map=None, counters=None):
        # Set before super().__init__, which adds the nodes and registers our tick callback.
        self._dial_map = dict(dial_map or {})
        self._counters = counters if counters is not None else {}
        self._counters.setdefault("keepalive_sent", 0)
        self._counters.setdefault("keepalive_received", 0)
        self._next_keepalive = 0.0
        self._created = monotonic()
        self._bind_warned_at = 0.0
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self._keepalive_tick)

    def _connectIfNecessarySingle(self, node):
        target = self._dial_map.get(node.id) if isinstance(node, TCPNode) else None
        if target is None:
            return super()._connectIfNecessarySingle(node)
        # TCPTransport._connectIfNecessarySingle, with the dial address swapped.
        conn = self._connections.get(node)
        if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        last = self._lastConnectAttempt.get(node)
        if last is not None and monotonic() - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = monotonic()
        dial = TCPNode(target)
        return self._connections[node].connect(dial.ip, dial.port)

    def _keepalive_tick(self):
        now = monotonic()
        if now < self._next_keepalive:
            return
        self._next_keepalive = now + _KEEPALIVE_PERIOD_S
        for node in list(self._nodes):
            # Only on links SyncObj considers connected: before the key exchange completes, an
            # unexpected message would break the handshake and drop the connection.
            if self._syncObj.isNodeConnected(node) and self.send(node, _KEEPALIVE_MESSAGE):
                self._counters["keepalive_sent"] += 1

    def _onMessageReceived(self, node, message):
        if isinstance(message, dict) and message.get("type") == _KEEPALIVE_MESSAGE["type"]:
            self._counters["keepalive_received"] += 1
            return
        super()._onMessageReceived(node, message)

    def _maybeBind(self):
        try:
            super()._maybeBind()
        finally:
            now = monotonic()
            if not self._ready and now - self._created > 2.0 and now - self._bind_warned_at > 5.0:
                self._bind_warned_at = now
                logger.warning("replication.bind_retrying addr=%s (port in use or address not "
                               "local; retrying)", self._syncObj.conf.bindAddress)


# ---------------------------------------------------------------------------------------------
# Cross-thread delivery
# ---------------------------------------------------------------------------------------------

# Every call from the tick thread to the loop goes through one LoopInbox (RaftNode._inbox): one
# wake-up of the loop for all the calls that arrive before it drains them, in the order they were
# posted. Its post never raises: it runs inside pysyncobj callbacks, where an exception makes
# pysyncobj apply the same entry again.


def _settle(fut: asyncio.Future, value) -> None:
    # A late result for a future that already timed out is dropped here.
    if not fut.done():
        fut.set_result(value)


def _settle_group(futs: tuple, value: tuple) -> None:
    """Hand each command of a group its own result (pysyncobj's result is their list)."""
    result, reason = value
    if reason == FAIL_REASON.SUCCESS:
        if isinstance(result, list) and len(result) == len(futs):
            for fut, res in zip(futs, result):
                _settle(fut, (res, reason))
            return
        reason = "bad_group_result"  # cannot happen: _apply returns one result per command
    for fut in futs:
        _settle(fut, (None, reason))


def _parse_addr(addr: str, what: str) -> tuple[str, int]:
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"{what} must be 'host:port', got {addr!r}")
    host, port_s = addr.rsplit(":", 1)
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"{what} has no numeric port: {addr!r}") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"{what} must be 'host:port' with a port in 1..65535, got {addr!r}")
    return host, port


def _check_command(data) -> None:
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"a command is bytes, not {type(data).__name__}")
    # pysyncobj mis-handles messages above 64 KiB (its chunking path), and pickling inflates
    # bytes ~1.7x: refuse before anything enters the log.
    if len(data) > limits.command_bytes_max:
        raise LimitExceeded(
            f"command is {len(data)} bytes; the limit is {limits.command_bytes_max}")


_ROLE_BY_RAFT_STATE = {0: "follower", 1: "candidate", 2: "leader"}

_DEFINITE_NO_LEADER = (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER)
_REASON_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}


# ---------------------------------------------------------------------------------------------
# RaftNode
# ---------------------------------------------------------------------------------------------

class RaftNode:
    """One member of a static Raft group replicating ``state``.

    :param self_addr: this node's ``host:port``; the Raft port binds on that host only.
    :param peers: every member's ``host:port`` (this node's may be included).
    :param data_dir: holds the journal (``raft.journal``, ``.meta``) and the full dump
        (``raft.dump``); created if missing; locked against a second node.
    :param secret: the cluster secret (pysyncobj's ``password``); never empty.
    :param state: a *freshly constructed* state (``apply_bytes``, ``snapshot``, ``restore``); the
        node rebuilds it from ``data_dir`` and the group, and serialises every use of it
        (``read``).
    :param on_role_change: ``f(is_leader: bool)``, called on the event loop whenever this node
        gains or loses leadership.
    :param dial_map: ``{peer_addr: proxy_addr}``: dial the proxy instead of the peer.
    :param conf_overrides: SyncObjConf options over ``RAFT_CONF_DEFAULTS`` (not the reserved
        ones: password, files, bind address, callbacks, membership, serializer, fork).
    :param barrier_command: the bytes ``barrier()`` proposes; by default ``BARRIER_NOOP``, which
        never reaches the state.
    """

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str, secret: str,
                 state, on_role_change: Callable[[bool], Any] | None = None,
                 dial_map: dict[str, str] | None = None, conf_overrides: dict | None = None,
                 barrier_command: bytes | None = None):
        if not isinstance(secret, str) or not secret:
            raise ValueError("a cluster secret is required: pysyncobj unpickles whatever reaches "
                             "its port unless every message is authenticated")
        self_host, _ = _parse_addr(self_addr, "self_addr")
        for p in peers:
            _parse_addr(p, "peer")
        for k, v in (dial_map or {}).items():
            _parse_addr(k, "dial_map key")
            _parse_addr(v, "dial_map value")
            if k not in peers or k == self_addr:
                raise ValueError(f"dial_map key {k!r} is not a peer")
        overrides = dict(conf_overrides or {})
        reserved = sorted(set(overrides) & _RESERVED_CONF_KEYS)
        if reserved:
            raise ValueError(f"conf_overrides may not set {', '.join(reserved)}")
        if barrier_command is not None:
            _check_command(barrier_command)

        self._self_addr = self_addr
        self._peers = sorted({p for p in peers if p != self_addr})
        self._members = sorted(set(self._peers) | {self_addr})
        self._data_dir = os.path.abspath(data_dir)
        self._state = state
        #: Applies (the tick thread) and reads (read) take it; an RLock: a dump re-enters it.
        self._lock = threading.RLock()
        self._on_role_change = on_role_change
        self._dial_map = dict(dial_map or {})
        self._barrier_command = BARRIER_NOOP if barrier_command is None else bytes(barrier_command)
        #: keepalives (the transport's), and log entries vs commands proposed (group commit)
        self.counters: dict[str, int] = {"log_entries_proposed": 0, "commands_proposed": 0}

        os.makedirs(self._data_dir, exist_ok=True)
        options = dict(RAFT_CONF_DEFAULTS)
        options.update(overrides)
        options.update(
            password=secret,
            journalFile=os.path.join(self._data_dir, "raft.journal"),
            fullDumpFile=os.path.join(self._data_dir, "raft.dump"),
            # pysyncobj binds 0.0.0.0 unless told otherwise.
            bindAddress=self_addr,
            onStateChanged=self._on_state_changed,
        )
        self._conf = make_conf(**options)
        if self_host in ("0.0.0.0", "::"):
            logger.warning("replication.bind_all_interfaces addr=%s", self_addr)

        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: LoopInbox | None = None
        self._sync: SyncObj | None = None
        self._consumer: _StateConsumer | None = None
        self._lock_fd: int | None = None
        self._stopped = False
        self._raft_state = 0           # written by the tick thread (onStateChanged)
        self._leader_flag = False      # last leadership value handed to on_role_change
        self._pending: set[asyncio.Future] = set()
        # Group commit (_enqueue): commands waiting for the next loop turn, their encoded size.
        self._group: list[tuple[bytes, asyncio.Future]] = []
        self._group_bytes = 0
        self._flush_handle: asyncio.Handle | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the event loop used for callbacks and start pysyncobj (its tick thread binds the
        port and connects to the peers in the background).

        :raises RuntimeError: when started twice, or when another node holds ``data_dir``.
        """
        if self._sync is not None or self._stopped:
            raise RuntimeError("a RaftNode starts once; build a new one (with a fresh state)")
        self._loop = loop
        self._inbox = LoopInbox(loop)
        self._lock_data_dir()
        try:
            self._consumer = _StateConsumer(self._state, self._lock)
            transport = functools.partial(_RaftTransport, dial_map=self._dial_map,
                                          counters=self.counters)
            self._sync = _SyncObj(self._self_addr, self._peers, conf=self._conf,
                                  consumers=[self._consumer], transportClass=transport,
                                  encryptor=_AeadEncryptor(self._conf.password))
            self._sync.addOnTickCallback(self._consumer._release_snapshot_lock)
        except BaseException:
            self._unlock_data_dir()
            raise
        logger.info("replication.started self=%s members=%s data_dir=%s", self._self_addr,
                    ",".join(self._members), self._data_dir)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Destroy the SyncObj, join its tick thread, release the port and ``data_dir``.
        Proposals still waiting raise ``Indeterminate``. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.destroy()
            deadline = time.monotonic() + timeout_s
            while sync.tick_thread_alive() and time.monotonic() < deadline:
                time.sleep(0.005)
            if sync.tick_thread_alive():
                logger.error("replication.stop_timeout self=%s: tick thread still running",
                             self._self_addr)
            else:
                self._close_leaked_fds(sync)
        for fut in list(self._pending):
            if not fut.done():
                fut.set_result((None, "stopped"))
        self._pending.clear()
        self._group, self._group_bytes = [], 0
        if self._leader_flag:
            self._leader_flag = False
            self._deliver_role(False)
        self._unlock_data_dir()
        logger.info("replication.stopped self=%s", self._self_addr)

    @staticmethod
    def _close_leaked_fds(sync: SyncObj) -> None:
        # With appendEntriesUseBatch off, SyncObj wakes its poller through a pipe that destroy()
        # never closes: two fds per node. Closed here once the tick thread is gone.
        notifier = getattr(sync, "_SyncObj__pipeNotifier", None)
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name, None)
            if isinstance(fd, int):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _lock_data_dir(self, wait_s: float = 10.0) -> None:
        # Two nodes on one journal would corrupt it (it is an mmap). A dump writer forked by a
        # previous node inherits the lock until it exits, so a restart also waits for it: its
        # late rename could otherwise put an older dump behind a newer, compacted journal.
        path = os.path.join(self._data_dir, "raft.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(f"data dir {self._data_dir} is in use by another node")
                time.sleep(0.02)
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- callbacks from the tick thread ------------------------------------------------------

    def _on_state_changed(self, old_state, new_state) -> None:
        # Tick thread, inside pysyncobj's message handling: must never raise.
        try:
            self._raft_state = new_state
            is_leader = new_state == 2
            if is_leader != self._leader_flag:
                self._leader_flag = is_leader
                logger.info("replication.role self=%s role=%s term=%s", self._self_addr,
                            _ROLE_BY_RAFT_STATE.get(new_state), self._term_or_none())
                self._deliver_role(is_leader)
        except BaseException:  # noqa: BLE001
            pass

    def _term_or_none(self):
        sync = self._sync
        return None if sync is None else sync.raftCurrentTerm

    def _deliver_role(self, is_leader: bool) -> None:
        if self._on_role_change is not None:
            inbox = self._inbox
            if inbox is not None:
                inbox.post(self._call_role_change, is_leader)

    def _call_role_change(self, is_leader: bool) -> None:
        try:
            self._on_role_change(is_leader)
        except Exception:
            logger.exception("replication.on_role_change_raised")

    # -- proposals ---------------------------------------------------------------------------

    def _enqueue(self, data: bytes) -> asyncio.Future:
        """Queue one command for the next group and return the future of its (result, reason).

        Group commit: every command proposed during one turn of the event loop goes into
        pysyncobj as one log entry (``_flush_group`` runs at the next turn), up to
        ``command_bytes_max`` bytes. With batching off (RAFT_CONF_DEFAULTS), pysyncobj sends one
        encrypted append_entries to every follower per log entry, gets one answer from each, and
        wakes its tick thread through a pipe per command: per entry, not per byte. Measured with
        32 concurrent API clients on a three-node cluster, that was over half of the leader's
        CPU (scripts/bench_register.py). A lone proposal still goes out at the next turn, alone, as
        plain bytes.
        """
        loop = self._loop
        fut = loop.create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        size = len(data) + _GROUP_ITEM_BYTES
        if self._group and self._group_bytes + size > limits.command_bytes_max:
            self._flush_group()
        self._group.append((data, fut))
        self._group_bytes += size
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush_group)
        return fut

    def _flush_group(self) -> None:
        """Submit the queued commands as one log entry (plain bytes when there is one)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        # A caller that gave up (cancelled) before its command left: it never happens.
        group = [(d, f) for d, f in self._group if not f.done()]
        self._group, self._group_bytes = [], 0
        if not group:
            return
        post = self._inbox.post
        futs = tuple(f for _, f in group)
        if len(group) == 1:
            payload = group[0][0]

            def on_result(result, reason, _settle_it=functools.partial(_settle, futs[0])):
                # Tick thread (or this thread for QUEUE_FULL). Must never raise: pysyncobj
                # would apply the entry again (post never does).
                post(_settle_it, (result, reason))
        else:
            payload = tuple(d for d, _ in group)

            def on_result(result, reason, _settle_them=functools.partial(_settle_group, futs)):
                post(_settle_them, (result, reason))
        self.counters["log_entries_proposed"] += 1
        self.counters["commands_proposed"] += len(group)
        sync, consumer = self._sync, self._consumer
        try:
            if sync is None:
                raise RuntimeError("raft node stopped")
            consumer._apply(payload, callback=on_result)
        except OSError as e:
            # The command is queued; only waking the tick thread failed (its notify pipe is
            # full: the thread is behind). The result will still come.
            logger.debug("replication.notify_failed error=%r", e)
        except Exception as e:  # noqa: BLE001
            err = Indeterminate(f"submitting the command failed: {type(e).__name__}",
                                leader=self._leader_id())
            for f in futs:
                if not f.done():
                    f.set_exception(err)

    def _leader_id(self) -> str | None:
        sync = self._sync
        leader = None if sync is None else sync._getLeader()
        return None if leader is None else leader.id

    def _reachable_leader(self) -> tuple[bool, str]:
        sync = self._sync
        leader = sync._getLeader()
        if leader is None:
            return False, "no leader (election in progress or no quorum)"
        if leader == sync.selfNode:
            return (True, "") if sync._isLeader() else (False, "no leader")
        if not sync.isNodeConnected(leader):
            return False, f"leader {leader.id} is not reachable from {self._self_addr}"
        return True, ""

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        """Replicate one command and return ``apply_bytes``'s result, as applied on this node.

        While there is no reachable leader, waits for one until the deadline, resubmitting only
        after definite failures.

        :raises Unavailable: the command did not happen (no leader, queue full, discarded).
        :raises Indeterminate: it may still happen (leader changed, timeout, node stopped).
        :raises LimitExceeded: the command is larger than ``limits.command_bytes_max``.
        """
        _check_command(data)
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if self._sync is None:
            raise Unavailable("raft node is not running", leader=None)
        loop = self._loop
        if asyncio.get_running_loop() is not loop:
            raise RuntimeError("propose() must run on the loop given to start()")
        data = bytes(data)
        deadline = loop.time() + timeout_s
        why = ""
        while True:
            if self._sync is None:
                raise Unavailable("raft node stopped", leader=None)
            ok, why = self._reachable_leader()
            if ok:
                fut = self._enqueue(data)
                # One timer that settles the future, rather than asyncio.wait_for (a second
                # future, two callbacks and a timer per proposal).
                timer = loop.call_at(max(deadline, loop.time() + 0.001), _settle, fut, (None, _TIMED_OUT))
                try:
                    result, reason = await fut
                finally:
                    timer.cancel()
                if reason == _TIMED_OUT:
                    raise Indeterminate(
                        f"no result within {timeout_s:g} s; the command may still apply",
                        leader=self._leader_id())
                if reason == FAIL_REASON.SUCCESS:
                    return result
                if reason == "stopped":
                    raise Indeterminate("raft node stopped before the result arrived",
                                        leader=None)
                name = _REASON_NAMES.get(reason, str(reason))
                if reason in _DEFINITE_NO_LEADER:
                    why = f"no leader accepted the command ({name})"
                elif reason == FAIL_REASON.QUEUE_FULL:
                    raise Unavailable("raft command queue is full", leader=self._leader_id(),
                                      reason=name)
                elif reason in (FAIL_REASON.DISCARDED, FAIL_REASON.REQUEST_DENIED):
                    raise Unavailable(f"command not applied ({name})", leader=self._leader_id(),
                                      reason=name)
                else:  # LEADER_CHANGED, UNKNOWN_OUTCOME, anything new
                    raise Indeterminate(f"outcome unknown ({name}); the command may still apply",
                                        leader=self._leader_id(), reason=name)
            if deadline - loop.time() <= _RETRY_PAUSE_S:
                leader = self._leader_id()
                raise Unavailable(f"{why}; last known leader: {leader or 'none'}", leader=leader)
            await asyncio.sleep(_RETRY_PAUSE_S)

    async def barrier(self, timeout_s: float = 5.0) -> None:
        """Commit a no-op and wait until this node applied it: a read of the local state after
        this returns sees every write acknowledged before the call (a linearizable read through
        the log; pysyncobj has no ReadIndex or leader lease).

        :raises Unavailable, Indeterminate: as ``propose``.
        """
        await self.propose(self._barrier_command, timeout_s)

    # -- introspection -------------------------------------------------------------------------

    def read(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(state, *args)`` under the lock applies take: a consistent read of the local
        replica (as of its last applied entry; ``barrier`` first for a linearizable one)."""
        with self._lock:
            return fn(self._state, *args)

    def is_leader(self) -> bool:
        """Whether this node is in the leader role now. A leader cut off from the majority keeps
        this True for up to leaderFallbackTimeout: decide nothing on it alone."""
        sync = self._sync
        return sync is not None and sync._isLeader()

    def status(self) -> dict:
        """A snapshot of this node's view, read without locks (single attribute reads are atomic
        under the GIL; ``SyncObj.getStatus()`` iterates dicts the tick thread may grow)."""
        sync = self._sync
        if sync is None:
            return {"self": self._self_addr, "role": "follower", "leader": None, "term": 0,
                    "commit_index": 0, "last_applied": 0, "members": list(self._members),
                    "is_leader": False, "running": False, "peers_connected": []}
        leader = sync._getLeader()
        role = _ROLE_BY_RAFT_STATE.get(self._raft_state, "follower")
        return {
            "self": self._self_addr,
            "role": role,
            "leader": None if leader is None else leader.id,
            "term": sync.raftCurrentTerm,
            "commit_index": sync.raftCommitIndex,
            "last_applied": sync.raftLastApplied,
            "members": list(self._members),
            "is_leader": role == "leader",
            "running": True,
            "peers_connected": sorted(n.id for n in sync.otherNodes if sync.isNodeConnected(n)),
        }


# ---------------------------------------------------------------------------------------------
# LocalLog
# ---------------------------------------------------------------------------------------------

class LocalLog:
    """A single in-process replica with RaftNode's API, for tests of the upper layers.

    ``propose`` applies at once under its lock and returns the result; the node is always
    the leader (term 1) unless a test calls ``set_leader(False)``; ``commit_index`` counts the
    commands applied (``barrier`` counts only when a ``barrier_command`` is applied).

    Test hooks: ``set_leader(flag)`` (delivers ``on_role_change``; while not leader, proposals
    raise ``Unavailable``) and ``fail_next(exc, count=1)`` (the next proposals raise ``exc``
    without applying, e.g. ``Indeterminate(...)``).
    """

    def __init__(self, state, *, self_addr: str = "local", on_role_change=None,
                 barrier_command: bytes | None = None):
        self._state = state
        self._lock = threading.RLock()
        self._self_addr = self_addr
        self._on_role_change = on_role_change
        self._barrier_command = barrier_command
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leader = True
        self._running = False
        self._index = 0
        self._failures: list[BaseException] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._running = True
        if self._on_role_change is not None:
            loop.call_soon(self._on_role_change, True)

    def stop(self) -> None:
        if self._running and self._leader and self._on_role_change is not None \
                and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon(self._on_role_change, False)
        self._running = False

    def set_leader(self, flag: bool) -> None:
        flag = bool(flag)
        if flag != self._leader:
            self._leader = flag
            if self._on_role_change is not None and self._loop is not None:
                self._loop.call_soon(self._on_role_change, flag)

    def fail_next(self, exc: BaseException, count: int = 1) -> None:
        self._failures.extend([exc] * count)

    def read(self, fn, *args):
        with self._lock:
            return fn(self._state, *args)

    def _apply(self, data: bytes) -> dict:
        with self._lock:
            result = self._state.apply_bytes(bytes(data))
            self._index += 1
        return result

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        _check_command(data)
        if not self._running:
            raise Unavailable("local log is not running", leader=None)
        if self._failures:
            raise self._failures.pop(0)
        if not self._leader:
            raise Unavailable("no leader (LocalLog.set_leader(False))", leader=None)
        return self._apply(data)

    async def barrier(self, timeout_s: float = 5.0) -> None:
        if not self._running:
            raise Unavailable("local log is not running", leader=None)
        if not self._leader:
            raise Unavailable("no leader (LocalLog.set_leader(False))", leader=None)
        if self._barrier_command is not None:
            self._apply(self._barrier_command)

    def is_leader(self) -> bool:
        return self._running and self._leader

    def status(self) -> dict:
        leader = self._running and self._leader
        return {
            "self": self._self_addr,
            "role": "leader" if leader else "follower",
            "leader": self._self_addr if leader else None,
            "term": 1,
            "commit_index": self._index,
            "last_applied": self._index,
            "members": [self._self_addr],
            "is_leader": leader,
            "running": self._running,
            "peers_connected": [],
        }
