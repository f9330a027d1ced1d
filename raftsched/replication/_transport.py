"""The Raft transport: pysyncobj's TCP transport with a dial map, a keepalive and bind warnings
(``RaftTransport``), and its messages sent uncompressed (``_Uncompressed``, which ``install``
puts in place of ``zlib`` in ``pysyncobj.tcp_connection``)."""
from __future__ import annotations

import logging
import zlib

from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: Keepalive period on every link; see RaftTransport.
_KEEPALIVE_PERIOD_S = 0.5
#: The keepalive message. A dict with an unknown 'type', so that a peer running a plain
#: TCPTransport ignores it too (SyncObj dispatches on message['type'] and has no else branch).
_KEEPALIVE_MESSAGE = {"type": "raftsched_keepalive"}


class RaftTransport(TCPTransport):
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
