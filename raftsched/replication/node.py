"""``RaftNode``: one member of a Raft group, as the asyncio world uses it (lifecycle, group
commit, ``propose`` and what its outcomes mean, ``read``, ``status``, ``change_members``)."""
from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import os
import time
from typing import Any, Callable, TypeVar

from pysyncobj import SyncObj
from pysyncobj.config import FAIL_REASON

from ..aio import LoopInbox
from ..core import limits
from ..core.errors import Conflict, Indeterminate, InvalidSpec, LimitExceeded, Unavailable
from ._connection import DROP_REASONS
from ._consumer import BARRIER_NOOP, _StateConsumer, replica_lock
from ._crypto import _AeadEncryptor
from ._disk import Disk
from ._durable import durable_transport
from . import _identity
from ._install import install
from ._membership import OPS as MEMBER_OPS, JoinMarker, check_addr
from ._storage import StoragePath
from ._syncobj import _SyncObj
from ._transport import RaftTransport
from ._watch import ReplicationWatch
from .conf import (_RESERVED_CONF_KEYS, RAFT_CONF_DEFAULTS, RAFT_PORT_DEFAULTS, make_conf,
                   make_port_options)

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

T = TypeVar("T")

#: Pause between two attempts of a proposal that failed definitely for want of a leader.
_RETRY_PAUSE_S = 0.025

#: Bytes a command adds to a group's pickled tuple beyond its own (opcode, length, memo).
_GROUP_ITEM_BYTES = 8
#: The reason a proposal's future is settled with when its deadline passes first.
_TIMED_OUT = "raftsched_timed_out"


# Every call from the tick thread to the loop goes through one LoopInbox (RaftNode._inbox): one
# wake-up of the loop for all the calls that arrive before it drains them, in the order they were
# posted. Its post never raises: it runs inside pysyncobj callbacks, where an exception makes
# pysyncobj apply the same entry again.


def _settle(fut: asyncio.Future, value) -> None:
    # A late result for a future that already timed out is dropped here.
    if not fut.done():
        fut.set_result(value)


def _call_without_value(fn: Callable[[], None]) -> None:
    fn()


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

#: What each cause of a role change (_SyncObj.role_cause) means, for the log line.
ROLE_CAUSES = {
    "election_timeout": "no word from a leader within the election timeout",
    "transfer": "the leader handed its leadership over",
    "higher_term": "a member spoke with a higher term",
    "leader_seen": "another member won the election",
    "quorum_lost": "no answer from a majority within leaderFallbackTimeout",
    "clock_step_down": "this node's clock disagrees with the cluster's",
    "unknown": "not known",
}

#: Pause between two attempts of a membership change that found no leader ready for it.
_MEMBER_RETRY_PAUSE_S = 0.1


def _post_outcome(post, fut: asyncio.Future, outcome) -> None:
    # Tick thread: hand a membership attempt's outcome to the loop (post never raises).
    post(functools.partial(_settle, fut), (outcome, None))


def _member_result(addr: str, view: dict, changed: bool) -> dict:
    """``change_members``' answer from the committed view after the change."""
    voters, learners = view.get("voters") or [], view.get("learners") or []
    state = "voter" if addr in voters else "learner" if addr in learners else "removed"
    return {"addr": addr, "state": state, "changed": changed,
            "members": {"voters": list(voters), "learners": list(learners), "index": view.get("index", 0)}}

_DEFINITE_NO_LEADER = (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER)
_REASON_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}


class RaftNode:
    """One member of a Raft group replicating ``state``.

    :param self_addr: this node's ``host:port``; the Raft port binds on that host only.
    :param peers: every member's ``host:port`` (this node's may be included): the group a node
        whose data directory holds no configuration starts with. Once its log or dump holds one
        (a membership change was made), that one is used, whatever ``peers`` says.
    :param join: this node joins a running group (``peers`` are its members) and is not one of
        them: it has no vote until it is added (``change_members``) and holds the log.
    :param data_dir: holds the journal (``raft.journal``, ``.meta``, ``.commit``) and the full dump
        (``raft.dump``); created if missing; locked against a second node; claimed by ``name``
        (``raft.identity``, _identity.py): ``start`` refuses a directory another node claimed.
    :param name: the name this node's data directory is claimed under: the node's id (``raftsched
        node --id``); None: its address.
    :param secret: the cluster secret (pysyncobj's ``password``); never empty.
    :param state: a *freshly constructed* state (``apply_bytes``, ``snapshot``, ``restore``); the
        node rebuilds it from ``data_dir`` and the group. Read it through ``read``. If it has a
        ``lock`` of its own (an RLock), the node takes that too wherever it takes its own.
    :param on_role_change: ``f(is_leader: bool)``, called on the event loop whenever this node
        gains or loses leadership.
    :param dial_map: ``{peer_addr: proxy_addr}``: dial the proxy instead of the peer (of any
        member, one that joins later too).
    :param conf_overrides: SyncObjConf options over ``RAFT_CONF_DEFAULTS`` (not the reserved
        ones: password, files, bind address, callbacks, membership, serializer, fork), and the
        Raft port's own over ``RAFT_PORT_DEFAULTS`` (``authTimeout``).
    :param barrier_command: the bytes ``barrier()`` proposes; by default ``BARRIER_NOOP``, which
        never reaches the state.
    :param wall_ms: the node's wall clock (ms), the one its commands are stamped with: the
        members' clocks are measured with it (``_clockguard.py``); default: the system's.
    :param fsync: sync the journal before this node answers for its log and before it counts
        itself towards a commit, and sync the meta and the dumps (``_durable.py``). False keeps
        only what a killed process keeps (docs/operations.md, "Durability").
    :param disk: the ``Disk`` the journal, meta and dumps are written through (tests and the
        fault harness pass ``powerloss.ShadowDisk``, made with their own ``fsync``, which then
        decides); by default the real one, with ``fsync``.
    :raises RuntimeError: when this pysyncobj's internals are not the ones ``install`` expects.
    :raises ValueError, TypeError: for an empty secret, a bad address, or refused options.
    """

    def __init__(self, *, self_addr: str, peers: list[str], data_dir: str, secret: str,
                 state, on_role_change: Callable[[bool], Any] | None = None,
                 dial_map: dict[str, str] | None = None, conf_overrides: dict | None = None,
                 barrier_command: bytes | None = None, wall_ms: Callable[[], int] | None = None,
                 fsync: bool = True, disk: Disk | None = None, join: bool = False, name: str | None = None):
        # The stand-ins for pysyncobj's parts, before anything of pysyncobj is built (raises
        # RuntimeError for a pysyncobj whose internals are not the expected ones).
        install()
        if not isinstance(secret, str) or not secret:
            raise ValueError("a cluster secret is required: pysyncobj unpickles whatever reaches "
                             "its port unless every message is authenticated")
        self_host, _ = _parse_addr(self_addr, "self_addr")
        for p in peers:
            _parse_addr(p, "peer")
        for k, v in (dial_map or {}).items():
            _parse_addr(k, "dial_map key")
            _parse_addr(v, "dial_map value")
            if k == self_addr:  # any other: a member may join later (change_members)
                raise ValueError(f"dial_map key {k!r} is this node")
        overrides = dict(conf_overrides or {})
        reserved = sorted(set(overrides) & _RESERVED_CONF_KEYS)
        if reserved:
            raise ValueError(f"conf_overrides may not set {', '.join(reserved)}")
        self._port_options = make_port_options(
            **{k: overrides.pop(k) for k in list(overrides) if k in RAFT_PORT_DEFAULTS})
        if barrier_command is not None:
            _check_command(barrier_command)

        if join and not [p for p in peers if p != self_addr]:
            raise ValueError("a node that joins a running cluster needs its members as peers")
        self._self_addr = self_addr
        self._peers = sorted({p for p in peers if p != self_addr})
        self._join = bool(join)
        self._members = self._peers if join else sorted(set(self._peers) | {self_addr})
        self._data_dir = os.path.abspath(data_dir)
        #: whose ``data_dir`` is (_identity.py): the node's id, or its address
        self._name = name or self_addr
        self._state = state
        #: The replica's lock: every apply, snapshot and restore holds it, and so does ``read``.
        self._lock = replica_lock(state)
        self._on_role_change = on_role_change
        self._dial_map = dict(dial_map or {})
        self._barrier_command = BARRIER_NOOP if barrier_command is None else bytes(barrier_command)
        self._wall_ms = wall_ms
        self._disk = disk if disk is not None else Disk(fsync)
        #: keepalives and the longest frame received (the transport's), and log entries vs
        #: commands proposed (group commit)
        self.counters: dict[str, int] = {"log_entries_proposed": 0, "commands_proposed": 0}
        #: connections the Raft port dropped, by reason (the transport's; ``status()``)
        self.connections_dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        #: ("gained" / "lost", cause) -> how often this node gained or lost the leadership, and
        #: why (_SyncObj.role_cause: a gain counts its candidacy's cause)
        self.leadership_changes: dict[tuple[str, str], int] = {}
        #: ``f(seconds, outcome)`` for each ``propose`` (barriers too): outcome ``ok``,
        #: ``unavailable``, ``indeterminate`` or ``error``; the node's metrics set it.
        self.propose_observer: Callable[[float, str], None] | None = None

        os.makedirs(self._data_dir, exist_ok=True)
        options = dict(RAFT_CONF_DEFAULTS)
        options.update(overrides)
        options.update(
            password=secret,
            # The names carry the disk to write through (_storage.StoragePath).
            journalFile=StoragePath(os.path.join(self._data_dir, "raft.journal"), self._disk),
            fullDumpFile=StoragePath(os.path.join(self._data_dir, "raft.dump"), self._disk),
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
        self._watch: ReplicationWatch | None = None
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
        :raises _identity.DataDirOfAnotherNode: ``data_dir`` is another node's (a RuntimeError).
        """
        if self._sync is not None or self._stopped:
            raise RuntimeError("a RaftNode starts once; build a new one (with a fresh state)")
        self._loop = loop
        self._inbox = LoopInbox(loop)
        self._lock_data_dir()
        try:
            _identity.claim(self._data_dir, self._name, self._disk)  # before the log is read
            fresh = not any(os.path.exists(os.path.join(self._data_dir, f))
                            for f in ("raft.journal", "raft.dump"))
            marker = JoinMarker.open(self._data_dir, self._join, fresh, self._disk)
            if self._join and marker is None:
                logger.warning("replication.join_ignored self=%s: the data directory holds a log; "
                               "its members are the log's", self._self_addr)
            self._consumer = _StateConsumer(self._state, self._lock)
            transport = functools.partial(RaftTransport, dial_map=self._dial_map,
                                          counters=self.counters,
                                          dropped=self.connections_dropped,
                                          auth_timeout_s=self._port_options["authTimeout"])
            if self._disk.fsync:
                transport = durable_transport(transport)  # sync before acknowledging
            self._sync = _SyncObj(self._self_addr, self._peers, conf=self._conf,
                                  consumers=[self._consumer], transportClass=transport,
                                  encryptor=_AeadEncryptor(self._conf.password), wall_ms=self._wall_ms,
                                  join=marker is not None, join_marker=marker)
            self._sync.addOnTickCallback(self._consumer._release_snapshot_lock)
            self._sync.addOnTickCallback(self._sync._member_tick)
            self._watch = ReplicationWatch(self._sync)
            self._sync.addOnTickCallback(self._watch.tick)
            self._sync.addOnTickCallback(self._sync._clock.tick)
        except BaseException:
            self._unlock_data_dir()
            raise
        # "joining" on a first start with --join; a node that joined before keeps its raft.join (where its
        # membership starts) and says so, whatever its flags now.
        how = "" if marker is None else (" (joining)" if fresh else " (joined before: raft.join)")
        logger.info("replication.started self=%s members=%s%s data_dir=%s", self._self_addr,
                    ",".join(self._members), how, self._data_dir)

    async def hand_over(self, timeout_s: float) -> bool:
        """Before a stop: while this node leads a cluster of other voters, hand the leadership to
        one that holds the whole log and answers, and wait (up to ``timeout_s``) until another
        leads, so the cluster elects no one after an election timeout of refused writes (a walk:
        ~1.5 s of 503 on every node for each leader of a rolling restart). True when it led and
        no longer does."""
        sync = self._sync
        if sync is None:
            return False
        # (asked whether it leads now or not: one elected while it dumps and stops hands over too)
        sync.request_handover()
        if not sync._isLeader() or len(self.status().get("members") or ()) <= 1:
            return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # ok-sleep: polling the role inside a deadline
            other = sync._getLeader()
            if not sync._isLeader() and other is not None and other != sync._SyncObj__selfNode:
                # (another leads: not merely this one stepping down, or a candidate's vote asked)
                logger.info("replication.handed_over self=%s to=%s (stopping)", self._self_addr,
                            getattr(other, "address", other))
                return True
        logger.warning("replication.hand_over_timeout self=%s: still leading after %.1f s; stopping all the same",
                       self._self_addr, timeout_s)
        return False

    def dump_before_stop(self, timeout_s: float) -> bool:
        """Before a graceful stop: write a full dump of what this node has applied and trim its
        journal to it (``_SyncObj.dump_now``), waiting at most ``timeout_s``. The node keeps
        serving meanwhile. :returns: whether the dump was written (or nothing was applied
        since this process's last one)."""
        sync = self._sync
        if sync is None or self._stopped or not sync.tick_thread_alive():
            return False
        t0 = time.monotonic()
        try:
            index = sync.dump_now(timeout_s)
        except Exception:  # noqa: BLE001 - a stop goes on whatever the dump does
            logger.exception("replication.dump_on_stop_failed self=%s", self._self_addr)
            return False
        if index is None:
            logger.warning("replication.dump_on_stop_timeout self=%s: no dump written (in %.0f s, at most "
                           "%.0f); the node stops with its journal, which it replays at its next start",
                           self._self_addr, time.monotonic() - t0, timeout_s)
            return False
        logger.info("replication.dumped_on_stop self=%s index=%d in %.0f ms", self._self_addr, index,
                    1000 * (time.monotonic() - t0))
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Destroy the SyncObj, join its tick thread, release the port and ``data_dir``.
        Proposals still waiting raise ``Indeterminate``. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        sync, self._sync = self._sync, None
        stuck = False
        if sync is not None:
            sync.destroy()
            deadline = time.monotonic() + timeout_s
            while sync.tick_thread_alive() and time.monotonic() < deadline:
                time.sleep(0.005)
            stuck = sync.tick_thread_alive()
            if stuck:
                # It may still write the journal (a compaction's last steps, the final sync):
                # the data directory stays locked until it ends or the process exits, so no node
                # started in this process opens the journal under it.
                logger.error("replication.stop_timeout self=%s: tick thread still running; data_dir "
                             "stays locked until it ends or the process exits", self._self_addr)
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
        if not stuck:
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
        # Two nodes on one journal would corrupt it. A dump writer forked by a
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
                    raise RuntimeError(f"data dir {self._data_dir} is in use by another node") from None
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
            sync = self._sync
            try:  # the role change is delivered whatever befalls its explanation
                cause = sync.role_cause(old_state, new_state) if isinstance(sync, _SyncObj) else "unknown"
            except Exception:  # noqa: BLE001
                cause = "unknown"
            is_leader = new_state == 2
            # Every role change says why (an election on an idle cluster is a question).
            logger.info("replication.role self=%s role=%s was=%s term=%s cause=%s (%s)", self._self_addr,
                        _ROLE_BY_RAFT_STATE.get(new_state), _ROLE_BY_RAFT_STATE.get(old_state),
                        self._term_or_none(), cause, ROLE_CAUSES.get(cause, "?"))
            if is_leader != self._leader_flag:
                self._leader_flag = is_leader
                key = ("gained" if is_leader else "lost", cause)
                self.leadership_changes[key] = self.leadership_changes.get(key, 0) + 1
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
        CPU (`scripts/measure bench-register`). A lone proposal still goes out at the next turn, alone, as
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

            def on_result(result, reason, _settle_it=functools.partial(_settle, futs[0])):  # noqa: B008 - bound once per call
                # Tick thread (or this thread for QUEUE_FULL). Must never raise: pysyncobj
                # would apply the entry again (post never does).
                post(_settle_it, (result, reason))
        else:
            payload = tuple(d for d, _ in group)

            def on_result(result, reason, _settle_them=functools.partial(_settle_group, futs)):  # noqa: B008 - bound once per call
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
        """``_propose``, timed for ``propose_observer``."""
        t0 = time.monotonic()
        outcome = "error"
        try:
            res = await self._propose(data, timeout_s)
            outcome = "ok"
            return res
        except Unavailable:
            outcome = "unavailable"
            raise
        except Indeterminate:
            outcome = "indeterminate"
            raise
        finally:
            observe = self.propose_observer
            if observe is not None:
                try:
                    observe(time.monotonic() - t0, outcome)
                except Exception:  # noqa: BLE001 - a metric never fails a proposal
                    logger.exception("replication.propose_observer_raised")

    async def _propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
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

    # -- membership ----------------------------------------------------------------------------

    async def change_members(self, op: str, addr: str, timeout_s: float = 30.0) -> dict:
        """Add (``op="add"``) or remove (``"remove"``) the member at Raft address ``addr``, one
        change at a time, decided by the leader (this node forwards it there) and answered once
        committed (_membership.py). An added node is a learner until it holds the log, then the
        leader makes it a voter. A leader asked to remove itself hands its leadership over first.

        The request says what the cluster should be, so asking again is safe: a member added
        already, or a node removed already, changes nothing (``changed`` False).

        :returns: ``{"addr", "state": "voter" | "learner" | "removed", "changed", "members":
            the committed configuration}``.
        :raises InvalidSpec: ``op`` or ``addr`` is not one (field ``addr``).
        :raises Conflict: the change cannot be made safely now (another is in progress, the
            voters left would have no quorum, the cluster is full...): nothing changed.
        :raises Unavailable: no leader took it before the deadline: nothing changed.
        :raises Indeterminate: the deadline passed after a leader may have made it.
        """
        if op not in MEMBER_OPS:
            raise InvalidSpec(f"unknown membership operation {op!r}; one of {', '.join(MEMBER_OPS)}", "op")
        try:
            check_addr(addr)
        except ValueError as e:
            raise InvalidSpec(str(e), "addr") from None
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        sync, loop = self._sync, self._loop
        if sync is None:
            raise Unavailable("raft node is not running", leader=None)
        if asyncio.get_running_loop() is not loop:
            raise RuntimeError("change_members() must run on the loop given to start()")
        deadline = loop.time() + timeout_s
        may_have_applied = False
        why = ""
        while True:
            if self._sync is None:
                raise Indeterminate("raft node stopped", leader=None)
            fut = loop.create_future()
            self._pending.add(fut)
            fut.add_done_callback(self._pending.discard)
            post = self._inbox.post
            sync.submit_member_change(op, addr, functools.partial(_post_outcome, post, fut))
            timer = loop.call_at(max(deadline, loop.time() + 0.001), _settle, fut, (("timeout",), None))
            try:
                outcome, _ = await fut
            finally:
                timer.cancel()
            kind = outcome[0] if isinstance(outcome, tuple) and outcome else "stopped"
            if kind == "done":
                return _member_result(addr, outcome[1] or {}, bool(outcome[2]))
            if kind == "refused":
                cls = InvalidSpec if outcome[1] == "invalid" else Conflict
                raise cls(outcome[2], "addr")
            if kind == "retry":
                why, may_have_applied = outcome[1], may_have_applied or bool(outcome[2])
            elif kind in ("timeout", "stopped"):
                may_have_applied = True  # an attempt was under way
                why = "no answer in time: the change may be made and not yet known committed here"
            if kind in ("timeout", "stopped") or deadline - loop.time() <= _MEMBER_RETRY_PAUSE_S:
                leader = self._leader_id()
                if may_have_applied:
                    raise Indeterminate(f"membership change not confirmed within {timeout_s:g} s ({why}); "
                                        "it may still be made: ask again", leader=leader)
                raise Unavailable(f"membership change not made: {why}", leader=leader)
            await asyncio.sleep(_MEMBER_RETRY_PAUSE_S)

    # -- reads ---------------------------------------------------------------------------------

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(state, *args)`` under the replica's lock and return what it returns: no
        command applies, and no snapshot is taken or restored, while it runs, so it sees the
        state between two log entries (whole groups). Callable from any thread, before ``start``
        too. The tick thread waits for it: keep ``fn`` short and let it copy what it needs.
        """
        with self._lock:
            return fn(self._state, *args)

    def arm_applied(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the loop, once, after the next log entry this replica applies (or the
        next snapshot it restores); a later call replaces an armed ``fn`` not yet called. For a
        reader that would otherwise poll for a change: arm, then read, and wait only if the read
        shows nothing new (the tick thread applies, then looks at what is armed, so one of the
        two sees the other). A no-op before ``start`` and after ``stop``."""
        consumer, inbox = self._consumer, self._inbox
        if consumer is not None and inbox is not None:
            consumer.armed = functools.partial(inbox.post, _call_without_value, fn)

    # -- introspection -------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """Whether this node is in the leader role now. A leader cut off from the majority keeps
        this True for up to leaderFallbackTimeout: decide nothing on it alone."""
        sync = self._sync
        return sync is not None and sync._isLeader()

    def cluster_ms(self) -> int | None:
        """Cluster time now (ms): the median of the members' wall clocks, as this node knows it
        (measured on the leader, told to the followers: ``_clockguard.py``); None when it does
        not (not started, or no word from a leader for a while). Any thread."""
        sync = self._sync
        return None if sync is None else sync._clock.cluster_ms()

    def clock_status(self) -> dict:
        """This node's wall clock against the cluster's: ``state`` (agrees, disagrees: more
        than limits.clock_skew_ms_max off, unknown, unchecked), ``offset_ms`` (its wall clock
        minus cluster time), ``error_ms``, ``bound_ms``, ``cluster_ms``, ``source`` (who told it
        cluster time: "self" on the leader), ``candidacy_held``, on the leader each peer's
        offset (``peers``), counters, and the ``conditions`` it implies. Any thread."""
        sync = self._sync
        if sync is None:
            return {"state": "unknown", "offset_ms": None, "error_ms": None, "bound_ms": limits.clock_skew_ms_max,
                    "cluster_ms": None, "source": None, "candidacy_held": False, "peers": {}, "conditions": []}
        return sync._clock.view()

    def status(self) -> dict:
        """A snapshot of this node's view, read without locks (single attribute reads are atomic
        under the GIL; ``SyncObj.getStatus()`` iterates dicts the tick thread may grow).
        ``members`` and ``learners`` are the committed configuration's; ``membership`` adds the
        change not committed yet and this node's role (_membership.py)."""
        sync = self._sync
        view = None if sync is None else sync.members_view()
        if view is None:
            # Its log not read yet (the tick thread publishes the view once it has): a member
            # restarted with --join said "none" here, and its reads "not a member", for a moment.
            view = {"voters": list(self._members), "learners": [], "index": 0, "pending": None,
                    "self": "starting"}
        if sync is None:
            return {"self": self._self_addr, "role": "follower", "leader": None, "term": 0,
                    "commit_index": 0, "last_applied": 0, "members": list(view["voters"]),
                    "learners": list(view["learners"]), "membership": view,
                    "is_leader": False, "running": False, "peers_connected": [],
                    "replication": None, "connections_dropped": dict(self.connections_dropped),
                    "clock": self.clock_status(), "durability": self.durability()}
        leader = sync._getLeader()
        role = _ROLE_BY_RAFT_STATE.get(self._raft_state, "follower")
        watch = self._watch
        clock = self.clock_status()
        repl = None if watch is None else watch.view()
        if repl is not None:
            # One list of conditions: replication's (cluster.follower_stalled) and the clocks'.
            repl = dict(repl, conditions=repl["conditions"] + clock["conditions"])
        return {
            "self": self._self_addr,
            "role": role,
            "leader": None if leader is None else leader.id,
            "term": sync.raftCurrentTerm,
            "commit_index": sync.raftCommitIndex,
            "last_applied": sync.raftLastApplied,
            "members": list(view["voters"]),
            "learners": list(view["learners"]),
            "membership": view,
            "is_leader": role == "leader",
            "running": True,
            "peers_connected": sorted(n.id for n in sync.otherNodes if sync.isNodeConnected(n)),
            # How this node's log keeps up, and (on the leader) each follower's: _watch.py.
            "replication": repl,
            # What the Raft port refused, by reason (_connection.DROP_REASONS).
            "connections_dropped": dict(self.connections_dropped),
            # This node's clock against the cluster's: _clockguard.py.
            "clock": clock,
            "durability": self.durability(),
        }

    def durability(self) -> dict:
        """Whether this node syncs before acknowledging, and the syncs its disk made so far
        (journal groups, meta, dumps, directories) and the seconds they took."""
        disk = self._disk
        out = {"fsync": disk.fsync, "syncs": disk.syncs, "sync_s": round(disk.sync_s, 6)}
        gate = None if self._sync is None else self._sync._sync_gate
        if gate is not None:
            # The journal's group syncs and the messages that waited for them (_durable.py).
            out["gate"] = {"syncs": gate.syncs, "sync_s": round(gate.sync_s, 6),
                           "sync_max_s": round(gate.sync_max_s, 6), "held": gate.held,
                           "held_wait_s": round(gate.held_wait_s, 6),
                           "held_wait_max_s": round(gate.held_wait_max_s, 6)}
        return out
