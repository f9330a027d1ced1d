"""Sync before acknowledging, one sync for a group: ``_SyncGate`` between pysyncobj and its
transport, and ``durable_transport``, which puts it there.

pysyncobj answers an append_entries as soon as it has added the entries to its journal, and its
leader counts itself towards a commit for every entry in its own log: neither waits for a disk.
A power loss on a majority could then take entries the cluster had committed and acknowledged to
clients (and, with them, the fencing counter's last grants). Here, with ``fsync`` on:

- a message that speaks for this node's log or vote (``next_node_idx``, the follower's answer
  that tells the leader how far its log goes; ``request_vote``; ``response_vote``) leaves only
  once the journal is synced. While the journal holds unsynced writes, such a message, and every
  such message after it (their order is kept), waits in the gate's queue. Other messages (a
  command a follower forwards to the leader, a keepalive) make no claim and leave at once: a
  worker's proposal on a follower does not wait for that follower's sync;
- the gate flushes (one ``fdatasync`` if the journal is dirty, then the queue, in order) at two
  points of every tick: just before the tick waits in its poll (an on-tick callback, the last
  thing a tick does), and just after the poll (``_SyncObj._onTick``), so that the answers to
  every message one poll brought in go out after one sync, before anything else is done, and so
  that every tick begins with the journal synced: the leader counts itself towards a commit at
  the beginning of a tick, hence only for entries on its disk;
- a leader's append_entries go out at once, before its own sync: a follower's copy and the
  leader's are written in parallel (Raft thesis §10.2.1), and the leader's does not count until
  the flush that follows.

So one sync covers everything written since the previous one: all the entries of a burst, all
the messages of one poll, never one sync per entry. With ``fsync`` off there is no gate.
"""
from __future__ import annotations

import logging
import time

from ._storage import EXIT_SYNC_FAILED, stop_on_failed_write

__all__ = ["EXIT_SYNC_FAILED", "SPEAKS_FOR_THE_LOG", "durable_transport"]

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: A journal sync at least this long is logged (``replication.slow_sync``): the tick thread
#: waited for it, and with it this node's heartbeats (a leader) or answers; one of half the
#: election timeout (raftMinTimeout, 0.5 s) can cost the leadership.
SLOW_SYNC_S = 0.2

#: The messages that speak for this node's log or vote: sent only with the journal synced.
SPEAKS_FOR_THE_LOG = frozenset({"next_node_idx", "request_vote", "response_vote"})


class _SyncGate:
    """Holds back what must wait for the journal's sync; ``flush`` syncs and lets it go."""

    def __init__(self, journal, send) -> None:
        self._journal = journal
        self._send = send
        self._queue: list[tuple] = []
        #: messages that waited for a sync, and flushes that synced
        self.held = 0
        self.syncs = 0
        #: seconds the flushes spent syncing; seconds the held messages waited (summed over the
        #: messages), and the longest wait of one (``RaftNode.durability``)
        self.sync_s = 0.0
        self.sync_max_s = 0.0
        self.held_wait_s = 0.0
        self.held_wait_max_s = 0.0

    def send(self, node, message) -> bool:
        if (self._queue or self._journal.dirty) and type(message) is dict \
                and message.get("type") in SPEAKS_FOR_THE_LOG:
            self._queue.append((node, message, time.perf_counter()))
            self.held += 1
            return True
        return self._send(node, message)

    def flush(self) -> None:
        journal = self._journal
        if journal.dirty:
            t0 = time.perf_counter()
            try:
                journal.sync()  # (the journal stops the node itself on a failed sync)
            except OSError:
                stop_on_failed_write("fdatasync of the journal")
            self.syncs += 1
            dt = time.perf_counter() - t0
            self.sync_s += dt
            if dt > self.sync_max_s:
                self.sync_max_s = dt
            if dt >= SLOW_SYNC_S:
                logger.warning("replication.slow_sync ms=%.0f (the tick thread waited for the journal's "
                               "fdatasync: no heartbeat or answer left meanwhile)", dt * 1000)
        if self._queue:
            queue, self._queue = self._queue, []
            now = time.perf_counter()
            self.held_wait_s += sum(now - t for _, _, t in queue)
            self.held_wait_max_s = max(self.held_wait_max_s, now - queue[0][2])
            for node, message, _ in queue:
                self._send(node, message)


def durable_transport(factory):
    """Wrap a transport factory (pysyncobj's ``transportClass``): the transport it makes sends
    through a ``_SyncGate`` on the SyncObj's journal, which flushes before each poll and, through
    ``_SyncObj._onTick``, after it. Called inside ``SyncObj.__init__``, after the journal exists
    and before the tick thread starts."""

    def make(sync_obj, self_node, other_nodes):
        transport = factory(sync_obj, self_node, other_nodes)
        gate = _SyncGate(sync_obj._SyncObj__raftLog, transport.send)
        transport.send = gate.send
        sync_obj.addOnTickCallback(gate.flush)
        sync_obj._sync_gate = gate
        return transport

    return make
