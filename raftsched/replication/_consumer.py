"""The replicated state as pysyncobj sees it: ``_StateConsumer`` (the one ``@replicated``
method, and the dump's serializer and deserializer), ``_DeferredSnapshot`` (a dump encoded by
the forked writer rather than by the tick thread), and the replica's lock.

The lock is replication's: pysyncobj's tick thread applies commands, takes snapshots and
restores them, and the event loop reads the state (``RaftNode.read``); the lock keeps each of
those whole. It is an RLock, created here (``replica_lock``), and held around every apply, the
fork of a dump writer and every restore; the state (core/) owns no lock of its own.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from pysyncobj import SyncObjConsumer, replicated

from .. import gcpolicy

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: The log entry barrier() proposes when no barrier_command is given. _apply recognises it and
#: returns without touching the state: it is applied for its position in the log only.
BARRIER_NOOP = b""

_DUMP_FORMAT = 1

#: The niceness the forked dump writer adds to itself before it encodes (os.nice): it runs on
#: the CPU the node leaves idle, not beside it. At 1 000 000 jobs a writer encodes for ~20 s; the
#: three nodes' writers, started within a second of each other (the same log length), took the
#: two cores from the nodes, and the leader's lone reads and writes took 30-80 ms (5 ms
#: otherwise) for as long as they ran (docs/benchmarks.md, Storm). 10, not 19: on a node busy
#: without pause the writer still gets ~10 % of a core against each busy thread, so a dump ends
#: in minutes, and the log it truncates does not grow without bound.
DUMP_WRITER_NICE = 10


def replica_lock(state):
    """A new lock for the replica holding ``state``: an RLock, since a dump writer's child
    re-enters it (``_DeferredSnapshot``). The state itself is single-threaded and owns none."""
    return threading.RLock()


class _DeferredSnapshot:
    """Pickles as ``state.snapshot()`` bytes, encoded when pickled, not when created.

    pysyncobj builds the dump data on its tick thread, then forks and pickles it in the child. By
    deferring the encoding to pickling time, the child encodes its copy-on-write image of the
    state and the tick thread only pays for ``fork()``. The tick thread holds the replica's lock
    across the fork (``_StateConsumer._serialize``), so in the child the lock is owned by the
    surviving thread and the encoding may take it again (it is an RLock); no other thread can be half-way through the state in the copied image.
    Unpickled, it is plain ``bytes``.
    """

    __slots__ = ("_state", "_lock", "_pid")

    def __init__(self, state, lock):
        self._state = state
        self._lock = lock
        self._pid = os.getpid()

    def __reduce__(self):
        if os.getpid() != self._pid:
            _lower_priority()  # the forked dump writer, not the node
        # The encoding builds a container for every job at once: no collection meanwhile
        # (gcpolicy.paused). In a node it runs in the forked dump writer (useFork), whose
        # collector is the only one it pauses.
        with self._lock, gcpolicy.paused():
            return (bytes, (bytes(self._state.snapshot()),))


def _lower_priority() -> None:
    """Make this process (a forked dump writer) yield the CPU to the node: DUMP_WRITER_NICE."""
    try:
        os.nice(DUMP_WRITER_NICE)
    except OSError:
        # A writer at its normal priority is slower for the node, not wrong. Not logged: in a
        # forked child another thread may have held the logging lock at the fork.
        pass


def _error_result(code: str, message: str) -> dict:
    return {"ok": False, "error": {"code": code, "message": message, "field": None}}


class _StateConsumer(SyncObjConsumer):
    """Holds the state for pysyncobj. The state is set before SyncObj exists (a state assigned
    after SyncObj.__init__ races its tick thread, which may already apply the journal)."""

    def __init__(self, state, lock=None):
        super().__init__()
        self._state = state
        #: The replica's lock (``replica_lock``), held around every apply, snapshot and restore.
        self._lock = replica_lock(state) if lock is None else lock
        # True while the tick thread holds the lock across a dump fork; released by
        # _release_snapshot_lock on the same thread at the end of the same tick.
        self._snapshot_lock_held = False
        #: called once (then cleared) after the next entry is applied or a dump restored
        #: (RaftNode.arm_applied); it must never raise: it runs inside pysyncobj's apply
        self.armed: Callable[[], None] | None = None

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
                out: dict | list = [self._apply_one(d) for d in data]
        else:
            with self._lock:
                out = self._apply_one(data)
        self._fire_armed()  # after the state moved: whoever armed it and then reads, sees it
        return out

    def replaying(self, on: bool) -> None:
        """The entries applied from now on (``on``), or no more, are this node's replay of what
        the process before it applied (_SyncObj._replay_check): the state's ``replaying``, when
        it has one."""
        hook = getattr(self._state, "replaying", None)
        if hook is not None:
            with self._lock:
                hook(on)

    def _fire_armed(self) -> None:
        cb = self.armed
        if cb is not None:
            self.armed = None
            try:
                cb()
            except BaseException as e:  # noqa: BLE001 - raised here, pysyncobj would apply the entry again
                logger.error("replication.armed_call_failed error=%r", e)

    def _apply_one(self, data: bytes) -> dict:
        if data == BARRIER_NOOP:
            return {"ok": True}
        try:
            res = self._state.apply_bytes(data)
            if not res.get("ok") and (res.get("error") or {}).get("code") == "internal":
                # A command handler raised (core/state.py): refused alike on every replica, and
                # said here on each, since no client may be there to hear it.
                logger.error("replication.apply_internal_error %s", res["error"].get("message"))
            return res
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
        out = {"format": _DUMP_FORMAT, "state": _DeferredSnapshot(self._state, self._lock)}
        members = getattr(self._syncObj, "_members_dump", None)
        if members is not None:
            # The configuration in force at the dump's last entry (_membership.py); a dump
            # without it (older) loads with the command line's.
            out["members"] = members()
        return out

    def _release_snapshot_lock(self) -> None:
        if self._snapshot_lock_held:
            self._snapshot_lock_held = False
            self._lock.release()

    def _deserialize(self, data) -> None:
        # A full dump loaded at start-up, or a snapshot installed from the leader. pysyncobj
        # catches and logs an exception here; the loader's override (_syncobj.py) then stops
        # the node (exit 76), which beats applying entries to a half-restored state, or voting
        # with none.
        if not isinstance(data, dict) or data.get("format") != _DUMP_FORMAT \
                or not isinstance(data.get("state"), (bytes, bytearray)):
            logger.critical("replication.dump_unreadable type=%s", type(data).__name__)
            raise ValueError("unreadable raftsched dump")
        started = time.monotonic()
        # No collection while the restore creates every object of the state, and the restored
        # state frozen out of the collector's walks before it runs again (gcpolicy says why).
        with gcpolicy.paused():
            with self._lock:
                self._state.restore(bytes(data["state"]))
            gcpolicy.freeze_restored()
        self._fire_armed()
        logger.info("replication.restored bytes=%d ms=%.1f", len(data["state"]),
                    (time.monotonic() - started) * 1000)
        loaded = getattr(self._syncObj, "_members_dump_loaded", None)
        if loaded is not None:
            loaded(data.get("members"))
