"""The Raft port's connections: pysyncobj's ``TcpConnection`` and ``TcpServer`` with frames capped,
buffers handled in linear time, and every drop counted by reason (``_BoundedConnection``,
``_BoundedServer``). ``RaftTransport`` builds them and drops the connections that do not
authenticate in time (``_transport.py``).

The overrides replace ``TcpConnection``'s reading and sending by their mangled names, as
``_SyncObj`` does for ``SyncObj``; ``install`` refuses a pysyncobj whose internals differ
(``_OVERRIDDEN``).
"""
from __future__ import annotations

import errno
import socket
from typing import Callable

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import tcp_connection as pysyncobj_tcp_connection
from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer

from ._frames import HEADER_BYTES, FrameReader, FrameTooLarge

#: Why a connection was dropped (the keys of ``RaftNode.status()["connections_dropped"]``):
#: ``frame_too_large``: a frame header announced more than the cap (before authentication, more
#: than the key exchange's frame); ``auth_failed``: a frame did not verify (another secret,
#: garbage, a replay from another connection or an older timestamp); ``auth_timeout``: no key
#: exchange within the bound (``RaftTransport``); ``bad_message``: a frame verified but did not
#: decode (only a holder of the secret can send one: a bug or another version);
#: ``closed_before_auth``: a connection this node dialled was closed by the member it dialled
#: before anything from it verified, within the authentication bound: that member refused this
#: node's first frame, as a member with another secret does (its own log says ``auth_failed``,
#: from an address it cannot name; without this, the dialling side said nothing).
DROP_REASONS = ("frame_too_large", "auth_failed", "auth_timeout", "bad_message", "closed_before_auth")

#: Errors of ``accept`` that leave the listening socket usable (pysyncobj's server unbound itself
#: for good on any error but EAGAIN: out of file descriptors, the Raft port was closed forever).
_ACCEPT_TRANSIENT = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.EMFILE,
                               errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                               errno.EPROTO, errno.EPERM})

#: The listening socket's accept queue (pysyncobj: 5), and the connections taken from it per
#: poll event (pysyncobj: 1). With one a tick, a burst of strangers' connections filled the queue
#: and a member's connect waited in the kernel for SYN-ACK retries (seconds), and connections
#: that would be dropped after authTimeout lived on in the queue for up to 15 s first.
_BACKLOG = 128
_ACCEPTS_PER_EVENT = 64

DropCallback = Callable[["_BoundedConnection", str, str], None]


class _BoundedConnection(TcpConnection):
    """pysyncobj's connection, reading through a ``FrameReader``.

    - Frame caps: ``first_cap`` until a frame has verified under the secret (``authenticated``),
      ``cap`` after; a header over the cap drops the connection as soon as it is read.
    - It reads ahead at most one frame of the current cap before parsing (pysyncobj read until
      the socket was empty), so a stranger's bytes never pile up behind a small first frame: at
      most ~300 bytes of a connection are read before its first frame is checked.
    - The send buffer is a bytearray, sent from its front (``del`` of a prefix is cheap), not a
      ``bytes`` copied after every ``send`` call.
    - ``admit_by``: when ``RaftTransport`` drops it unless it has authenticated (and, on an
      incoming connection, named itself as a member) by then.
    """

    def __init__(self, poller, *, cap: int, first_cap: int, auth_timeout_s: float,
                 on_drop: DropCallback, stats: dict | None = None,
                 on_verified: Callable[["_BoundedConnection"], None] | None = None,
                 sock: socket.socket | None = None, **kwargs):
        # Before TcpConnection.__init__, which subscribes an accepted socket to the poller.
        self._frames = FrameReader()
        #: ``frame_bytes_received_max``: the longest frame that verified, kept up to date here.
        self._stats = stats if stats is not None else {}
        self._stats.setdefault("frame_bytes_received_max", 0)
        self._cap, self._first_cap = cap, first_cap
        self._auth_timeout_s = auth_timeout_s
        self._on_drop = on_drop
        #: called once when a frame first verifies on a connection this node dialled
        self._on_verified = on_verified
        self.authenticated = False
        self.admit_by = monotonic() + auth_timeout_s
        #: when this node dialled the connection (None: accepted), for closed_before_auth
        self.dialled_at: float | None = None
        self.peer = "?"
        if sock is not None:
            try:
                name = sock.getpeername()
            except OSError:
                name = None
            if isinstance(name, tuple) and len(name) >= 2:
                self.peer = f"{name[0]}:{name[1]}"
        super().__init__(poller, socket=sock, **kwargs)

    def frame_cap(self) -> int:
        if self.authenticated or not self.encryptor:
            return self._cap
        return self._first_cap

    def connect(self, host, port):
        self._frames.clear()
        self.authenticated = False
        self.admit_by = monotonic() + self._auth_timeout_s
        self.dialled_at = monotonic()
        self.peer = f"{host}:{port}"
        return super().connect(host, port)

    def disconnect(self):
        self._frames.clear()
        self.authenticated = False
        super().disconnect()

    def drop(self, reason: str, detail: str = "") -> None:
        """Count the reason, then disconnect."""
        try:
            self._on_drop(self, reason, detail)
        finally:
            self.disconnect()

    def _closed_by_peer(self, how: str) -> None:
        """The other end closed (``how``): counted as ``closed_before_auth`` when this node
        dialled it, under a secret, and nothing from it verified within the authentication
        bound (members exchange keys and then keepalives at once: a member that closes so soon
        refused this node's first frame); else an ordinary disconnect."""
        dialled = self.dialled_at
        if dialled is not None and self.encryptor and not self.authenticated \
                and monotonic() - dialled <= self._auth_timeout_s:
            self.drop("closed_before_auth", f"{how} before anything from it verified")
        else:
            self.disconnect()

    # -- reading ---------------------------------------------------------------------------------

    def _TcpConnection__processRead(self):
        sock = self._TcpConnection__socket
        cap = self.frame_cap()
        # At most up to a whole frame of the cap (after a parse, less than that is buffered: a
        # frame still incomplete), so a stranger gets ~300 bytes read, not a socket buffer's worth.
        want = min(self._TcpConnection__recvBufferSize, cap + HEADER_BYTES - self._frames.buffered)
        if want <= 0:
            return False
        try:
            incoming = sock.recv(want)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._closed_by_peer(errno.errorcode.get(e.errno or 0, "reset"))
            return False
        if not incoming:
            self._closed_by_peer("closed")
            return False
        try:
            self._frames.feed(incoming, cap)
        except FrameTooLarge as e:
            self.drop("frame_too_large", str(e))
            return False
        return self._frames.buffered < cap + HEADER_BYTES  # read on until a whole frame may be in

    def _TcpConnection__processParseMessage(self):
        if self.state == pysyncobj_tcp_connection.CONNECTION_STATE.DISCONNECTED:
            return None
        try:
            frame = self._frames.next_frame(self.frame_cap())
        except FrameTooLarge as e:
            self.drop("frame_too_large", str(e))
            return None
        if frame is None:
            return None
        data = frame
        reason = "auth_failed"
        try:
            encryptor = self.encryptor
            if encryptor:
                timestamp = encryptor.extract_timestamp(data)
                if timestamp < self.recvLastTimestamp:
                    raise ValueError("a timestamp older than the last one on this connection")
                data = encryptor.decrypt(data)  # raises unless it verifies under the secret
                self.recvLastTimestamp = timestamp
            reason = "bad_message"
            # pysyncobj_tcp_connection.zlib: _Uncompressed once install() ran.
            message = pysyncobj_pickle.loads(pysyncobj_tcp_connection.zlib.decompress(data))
            if self.recvRandKey:
                key, message = message
                if key != self.recvRandKey:
                    reason = "auth_failed"  # a message recorded on another connection
                    raise ValueError("not this connection's key")
        except Exception as e:  # noqa: BLE001 - whatever a peer sends, the connection just ends
            self.drop(reason, type(e).__name__)
            return None
        if not self.authenticated:
            self.authenticated = True
            if self.dialled_at is not None and self._on_verified is not None:
                self._on_verified(self)
        if len(frame) > self._stats["frame_bytes_received_max"]:
            self._stats["frame_bytes_received_max"] = len(frame)
        return message

    # -- sending ---------------------------------------------------------------------------------

    def _TcpConnection__processSend(self):
        buf = self._TcpConnection__writeBuffer
        if not buf:
            return False
        if type(buf) is not bytearray:
            # TcpConnection.send appends with +=, in place once this is a bytearray; it resets
            # it to bytes() on connect and disconnect.
            buf = self._TcpConnection__writeBuffer = bytearray(buf)
        try:
            sent = self._TcpConnection__socket.send(buf)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if sent < 0:
            self.disconnect()
            return False
        if sent == 0:
            return False
        del buf[:sent]
        return True


class _BoundedServer(TcpServer):
    """pysyncobj's server, making each accepted connection with ``make_connection(sock)``,
    draining its accept queue at each event (``_BACKLOG``, ``_ACCEPTS_PER_EVENT``), and staying
    bound through an ``accept`` error that does not break the listening socket."""

    def __init__(self, poller, host, port, onNewConnection, *, make_connection,
                 sendBufferSize, recvBufferSize, **kwargs):
        super().__init__(poller, host, port, onNewConnection, sendBufferSize=sendBufferSize,
                         recvBufferSize=recvBufferSize, **kwargs)
        self._make_connection = make_connection
        self._on_new_connection = onNewConnection
        self._buffer_sizes = (sendBufferSize, recvBufferSize)

    def bind(self):
        super().bind()
        self._TcpServer__socket.listen(_BACKLOG)  # again: a listening socket takes the new size

    def _TcpServer__onNewConnection(self, descr, event):
        if event & POLL_EVENT_TYPE.READ:
            for _ in range(_ACCEPTS_PER_EVENT):
                listener = self._TcpServer__socket
                if listener is None:
                    return
                try:
                    sock, _ = listener.accept()
                except OSError as e:
                    if e.errno not in _ACCEPT_TRANSIENT:
                        self.unbind()
                        return
                    break  # the queue is empty (EAGAIN), or try again at the next event
                try:
                    send_size, recv_size = self._buffer_sizes
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_size)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_size)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.setblocking(False)
                    conn = self._make_connection(sock)
                except OSError:
                    sock.close()  # reset before we got to it
                    continue
                self._on_new_connection(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


#: The pysyncobj internals these classes override or read, by mangled name (``install`` checks).
_OVERRIDDEN_METHODS = {
    TcpConnection: ("_TcpConnection__processRead", "_TcpConnection__processParseMessage",
                    "_TcpConnection__processSend", "_TcpConnection__tryReadBuffer",
                    "_TcpConnection__processConnection"),
    TcpServer: ("_TcpServer__onNewConnection",),
}
_READ_ATTRIBUTES = {
    TcpConnection: ("_TcpConnection__socket", "_TcpConnection__recvBufferSize",
                    "_TcpConnection__writeBuffer"),
    TcpServer: ("_TcpServer__socket",),
}


def missing_internals() -> list[str]:
    """The internals above that this pysyncobj lacks (an attribute counts as present when
    ``__init__`` assigns it)."""
    missing = []
    for cls, names in _OVERRIDDEN_METHODS.items():
        missing += [f"{cls.__name__}.{n}" for n in names if not hasattr(cls, n)]
    for cls, names in _READ_ATTRIBUTES.items():
        assigned = cls.__init__.__code__.co_names
        missing += [f"{cls.__name__}.{n}" for n in names if n not in assigned]
    return missing
