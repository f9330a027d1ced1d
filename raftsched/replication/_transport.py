"""The Raft transport: pysyncobj's TCP transport with a dial map, a keepalive, bind warnings, and
the Raft port held shut to whoever does not hold the secret (``RaftTransport``), and its messages
sent uncompressed (``_Uncompressed``, which ``install`` puts in place of ``zlib`` in
``pysyncobj.tcp_connection``)."""
from __future__ import annotations

import functools
import logging
import zlib

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from ..core import limits
from ._connection import DROP_REASONS, _BoundedConnection, _BoundedServer
from ._frames import first_frame_bytes_max, frame_bytes_max
from .conf import RAFT_PORT_DEFAULTS

logger = logging.getLogger("raftsched.replication")  # one logger for the package (docs/operations.md)

#: Keepalive period on every link; see RaftTransport.
_KEEPALIVE_PERIOD_S = 0.5
#: A gap this long between two admission sweeps means the tick thread was stalled (an apply, a
#: snapshot load, a collection): the deadlines of connections still authenticating move on by it.
#: (A stall longer than connectionTimeout still drops every connection whose last read is older:
#: pysyncobj checks that at each connection's next event.)
_SWEEP_STALL_S = 0.25
#: A dropped connection is logged once per reason, then at most once per this many seconds with
#: the number of drops not logged (they are all counted: ``RaftNode.status()``).
_DROP_LOG_EVERY_S = 60.0
#: closed_before_auth is logged from this many in a row to one member (counted from the first).
_REFUSALS_LOGGED_FROM = 3
#: What a drop's log line adds, for the two reasons a member with another secret causes.
_DROP_HINTS = {
    "auth_failed": ": a frame that does not verify under this node's cluster secret: if the peer"
                   " is a member, its secret differs from this node's",
    "closed_before_auth": ": the member this node dialled closed the connection before anything"
                          " from it verified: it refused this node's first frame; check that its"
                          " cluster secret is this node's",
}

#: The keepalive message. A dict with an unknown 'type', so that a peer running a plain
#: TCPTransport ignores it too (SyncObj dispatches on message['type'] and has no else branch).
_KEEPALIVE_MESSAGE = {"type": "raftsched_keepalive"}


class RaftTransport(TCPTransport):
    """pysyncobj's TCP transport with four additions.

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
    - The port held shut to strangers (issue 22). Every connection is a ``_BoundedConnection``:
      frames are capped at their header, at the key exchange's size until the peer has proved
      it holds the secret and at ``frame_bytes_max`` of this configuration after, and read in
      linear time. A connection that has not completed the key exchange ``authTimeout`` after
      it opened (conf.RAFT_PORT_DEFAULTS) is dropped by a sweep on every tick. Drops are counted
      by reason (``dropped``, ``DROP_REASONS``) and logged once per reason and minute.
    """

    def __init__(self, syncObj, selfNode, otherNodes, *, dial_map=None, counters=None,
                 dropped=None, auth_timeout_s=RAFT_PORT_DEFAULTS["authTimeout"]):
        # Set before super().__init__, which adds the nodes and registers our tick callback.
        self._dial_map = dict(dial_map or {})
        self._counters = counters if counters is not None else {}
        self._counters.setdefault("keepalive_sent", 0)
        self._counters.setdefault("keepalive_received", 0)
        self._next_keepalive = 0.0
        self._created = monotonic()
        self._bind_warned_at = 0.0
        conf = syncObj.conf
        #: The largest frame a member of this configuration sends, and the largest one before the
        #: key exchange (_frames.py), under the encryptor SyncObj made before its transport.
        self.frame_cap = frame_bytes_max(batch_bytes=conf.appendEntriesBatchSizeBytes,
                                         chunk_bytes=conf.logCompactionBatchSize,
                                         command_bytes_max=limits.command_bytes_max,
                                         encryptor=syncObj.encryptor)
        self.first_frame_cap = first_frame_bytes_max(syncObj.encryptor)
        self._auth_timeout_s = float(auth_timeout_s)
        self._dropped = dropped if dropped is not None else {}
        for reason in DROP_REASONS:
            self._dropped.setdefault(reason, 0)
        self._drop_logged_at: dict[str, float] = {}
        self._drops_unlogged: dict[str, int] = {}
        #: dialled connections each member closed before anything verified, in a row
        self._refusals: dict[str, int] = {}
        self._last_sweep = monotonic()
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self._keepalive_tick)
        syncObj.addOnTickCallback(self._admission_tick)

    # -- connections: ours, in place of pysyncobj's -----------------------------------------

    def _new_connection(self, sock=None) -> _BoundedConnection:
        conf = self._syncObj.conf
        return _BoundedConnection(
            self._syncObj._poller, cap=self.frame_cap, first_cap=self.first_frame_cap,
            auth_timeout_s=self._auth_timeout_s, on_drop=self._note_drop, stats=self._counters,
            on_verified=self._note_verified,
            sock=sock,
            timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            # As pysyncobj: its accepted connections get no keepalive option, its dialled ones
            # the conf's.
            keepalive=conf.tcp_keepalive if sock is None else None)

    def _createServer(self):
        # TCPTransport._createServer, building a _BoundedServer.
        conf = self._syncObj.conf
        self_addr = self._selfNode.address
        if conf.bindAddress is not None:
            host, port = conf.bindAddress.rsplit(":", 1)
        elif self_addr is not None:
            host, port = self_addr.rsplit(":", 1)
            host = "::" if ":" in host else "0.0.0.0"
        else:
            raise RuntimeError("Unable to determine bind address")
        if host != "0.0.0.0":
            host = globalDnsResolver().resolve(host)
        self._server = _BoundedServer(
            self._syncObj._poller, host, port, self._onNewIncomingConnection,
            make_connection=self._new_connection, sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize, connectionTimeout=conf.connectionTimeout)

    def addNode(self, node):
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None and not isinstance(conn, _BoundedConnection):
            # TCPTransport.addNode made a TcpConnection to dial this peer (not connected yet):
            # ours in its place, wired the same way.
            ours = self._new_connection()
            ours.encryptor = self._syncObj.encryptor
            ours.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, ours))
            ours.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            ours.setOnDisconnectedCallback(functools.partial(self._onDisconnected, ours))
            self._connections[node] = ours

    def _admission_tick(self):
        """Drop the connections that have not completed the key exchange in time: an incoming
        one must have proved it holds the secret and named itself as a member, one we dialled
        must have proved the secret. The clock of a connection still dialling starts when it
        connects; the time this thread was stalled does not count."""
        try:
            now = monotonic()
            gap, self._last_sweep = now - self._last_sweep, now
            unknown = self._unknownConnections
            for conn in list(unknown) + list(self._connections.values()):
                if not isinstance(conn, _BoundedConnection):
                    continue
                state = conn.state
                if state == CONNECTION_STATE.DISCONNECTED \
                        or (conn.authenticated and conn not in unknown):
                    continue
                if state == CONNECTION_STATE.CONNECTING:
                    conn.admit_by = now + self._auth_timeout_s
                elif gap > _SWEEP_STALL_S:
                    conn.admit_by += gap
                elif now > conn.admit_by:
                    conn.drop("auth_timeout", f"no key exchange within {self._auth_timeout_s:g} s")
        except Exception:  # noqa: BLE001 - a tick callback that raises stops pysyncobj's tick
            logger.exception("replication.admission_sweep_failed")

    def _note_drop(self, conn: _BoundedConnection, reason: str, detail: str) -> None:
        # On the tick thread, from _BoundedConnection.drop: count always, log once per reason
        # and _DROP_LOG_EVERY_S.
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        if reason == "closed_before_auth":
            # Logged from the third in a row to one member: one that refuses this node's frames
            # (another secret) does it at every dial (4 a second); a member killed or a link
            # reset just as a connection opened does it once.
            n = self._refusals[conn.peer] = self._refusals.get(conn.peer, 0) + 1
            if n < _REFUSALS_LOGGED_FROM:
                return
        now = monotonic()
        last = self._drop_logged_at.get(reason)
        if last is not None and now - last < _DROP_LOG_EVERY_S:
            self._drops_unlogged[reason] = self._drops_unlogged.get(reason, 0) + 1
            return
        self._drop_logged_at[reason] = now
        logger.warning("replication.connection_dropped reason=%s peer=%s authenticated=%s "
                       "detail=%s unlogged_before=%d (logged once a minute per reason at most)%s",
                       reason, conn.peer, conn.authenticated, detail,
                       self._drops_unlogged.pop(reason, 0), _DROP_HINTS.get(reason, ""))

    def _note_verified(self, conn: _BoundedConnection) -> None:
        # A connection this node dialled verified: that member takes its frames (again).
        if self._refusals:
            self._refusals.pop(conn.peer, None)

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
