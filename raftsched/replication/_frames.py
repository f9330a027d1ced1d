"""Frames on the Raft port: ``FrameReader``, which cuts a byte stream into pysyncobj's frames with
a cap on the length checked before the frame is buffered, and the caps themselves, derived from
the configuration (``frame_bytes_max``, ``first_frame_bytes_max``).

pysyncobj frames every message as a 4-byte length (``struct`` ``'i'``, native order) followed by
that many bytes, the sealed message (``_crypto.py``). Its own reader believed any length, kept
reading until the socket was empty, and grew its buffer by concatenating ``bytes`` (each receive
copied everything received so far), all on the Raft thread and before the AES-GCM check: a
stranger's 16 MiB frame stalled the leader long enough to depose it (issue 22).
"""
from __future__ import annotations

import struct

from ._crypto import _AeadEncryptor

#: The frame header. pysyncobj writes it with 'i'; read unsigned, a negative length is simply
#: larger than any cap.
_LENGTH = struct.Struct("I")
HEADER_BYTES = _LENGTH.size

# -- the largest frame a member sends ------------------------------------------------------------
#
# pysyncobj pickles every message with protocol 2, and so did raftsched's members before they
# wrote protocol 4 (``_install.PICKLE_PROTOCOL``); a cluster being upgraded has both. At protocol 2
# a ``bytes`` object of n bytes becomes ``codecs.encode(<n-character latin-1 str>, 'latin1')`` and
# the str is stored in UTF-8: up to 2n bytes (every byte >= 0x80 takes two), plus opcodes; at
# protocol 4 it is n bytes behind a 9-byte header at most. The bounds below follow from protocol
# 2, the wider; the figures in brackets are measured with the widest values
# (tests/test_replication_raft_port.py checks each bound against real pickles of the largest
# messages at both protocols).

#: Opcodes around one pickled bytes object: the str's BINUNICODE header (5), memo gets of
#: ``codecs.encode`` and ``'latin1'`` (5 each), TUPLE2 and REDUCE (2), memo puts of the str and the
#: result (5 each): 27.
_BYTES_OPCODES_MAX = 32
#: One log entry ``(command, index, term)`` in an append_entries' list, beyond 2 bytes per byte
#: of its command: the command's opcodes (32), two ints below 2**64 as LONG1 (11 each), TUPLE3 and
#: its memo put (6), the list's MARK and APPENDS every 1000 items (< 1). [an entry of a 2-byte
#: command in a long list, with 64-bit ints: 57.5 bytes, 4 of them the command's]
_ENTRY_OPCODES_MAX = 64
#: Everything in a message that is not a command or a chunk of data: the pickle's header and STOP,
#: the ``codecs.encode`` global spelled out once, the dict, its keys, its ints and flags, and the
#: ``(key, message)`` pair that carries the connection's 32-byte key. [329 bytes: an entry sent in
#: parts, the widest template]
_MESSAGE_FIXED_MAX = 1024
#: What a log entry adds to the command it carries: pysyncobj's command-type byte and the pickled
#: call ``(method id, (payload,))``. [~30 bytes]
_COMMAND_WRAPPER_MAX = 128
#: pysyncobj's connection keys (``os.urandom(32)``).
_KEY_BYTES = 32
#: The key exchange's pickle: a connection key, or the pair of keys that answers it. [197 bytes
#: for the pair]
_KEY_EXCHANGE_PICKLE_MAX = 2 * (2 * _KEY_BYTES + _BYTES_OPCODES_MAX) + 64


def sealed_bytes_max(pickle_bytes: int, encryptor) -> int:
    """The longest frame that carries a pickle of at most ``pickle_bytes``: the uncompressed
    marker (``_transport._Uncompressed``), then the encryptor's sealing. raftsched's own
    (``_AeadEncryptor``) adds its version, salt, timestamp, nonce and tag; pysyncobj's Fernet
    (its ``password`` alone: ``scripts/baselines/raw_raft.py``) is url-safe base64 of a version,
    a timestamp, an IV, the data padded to whole 16-byte blocks and an HMAC."""
    n = pickle_bytes + 1
    if not encryptor:
        return n
    if isinstance(encryptor, _AeadEncryptor):
        return n + _AeadEncryptor._NONCE_END + _AeadEncryptor._TAG
    return 4 * -(-(1 + 8 + 16 + (n // 16 + 1) * 16 + 32) // 3)


def first_frame_bytes_max(encryptor) -> int:
    """The first frame on a connection, the only one read before the peer has proved it holds
    the secret: the key exchange's, sealed (310 bytes with ``_AeadEncryptor``)."""
    return sealed_bytes_max(_KEY_EXCHANGE_PICKLE_MAX, encryptor)


def entry_bytes_max(command_bytes_max: int) -> int:
    """The longest log entry: a command of ``command_bytes_max`` bytes, or a group of commands
    whose lengths plus 8 each add up to at most that (``RaftNode._enqueue``), pickled. A bytes
    item of n bytes pickles to at most 2n + 32 <= 4 (n + 8) bytes, so a payload to at most
    4 x ``command_bytes_max``."""
    return 4 * command_bytes_max + _COMMAND_WRAPPER_MAX


def frame_bytes_max(*, batch_bytes: int, chunk_bytes: int, command_bytes_max: int,
                    encryptor) -> int:
    """The largest frame a member of this configuration sends, from three settings:
    ``appendEntriesBatchSizeBytes`` (``batch_bytes``), ``logCompactionBatchSize`` (``chunk_bytes``,
    the snapshot's part size) and ``limits.command_bytes_max``, sealed by ``encryptor``. The
    largest of:

    - an append_entries with entries. pysyncobj adds entries while the total of their lengths is
      below ``batch_bytes`` (``__getEntries``), so the entries but the last total at most
      ``batch_bytes - 1`` bytes, each at least one byte (pysyncobj's no-op entry), and the last is
      at most ``entry_bytes_max``;
    - an append_entries carrying one part of an entry too large for a batch (``batch_bytes``);
    - an append_entries carrying one part of the snapshot (``chunk_bytes``).

    The first is the largest with the defaults: ~4.4 MiB, most of it the opcodes of 65 535 one-byte
    entries, which a real log never holds (commands are tens of bytes at least). Only a peer
    that has proved it holds the secret gets this cap; before that, ``first_frame_bytes_max``.
    """
    entries = ((batch_bytes - 1) * (2 + _ENTRY_OPCODES_MAX)
               + 2 * entry_bytes_max(command_bytes_max) + _ENTRY_OPCODES_MAX)
    entry_part = 2 * batch_bytes + _BYTES_OPCODES_MAX
    snapshot_part = 2 * chunk_bytes + _BYTES_OPCODES_MAX
    return sealed_bytes_max(_MESSAGE_FIXED_MAX + max(entries, entry_part, snapshot_part),
                            encryptor)


class FrameTooLarge(ValueError):
    """A frame header claims more bytes than the cap."""

    def __init__(self, length: int, cap: int):
        super().__init__(f"frame of {length} bytes announced; the cap is {cap}")
        self.length, self.cap = length, cap


class FrameReader:
    """Cuts a byte stream into frames, in time linear in the bytes received.

    Received bytes are appended to one ``bytearray``; frames are cut at an offset and copied out
    once each; the consumed prefix is dropped when it is more than half of the buffer (so every
    byte is moved at most once more). A header is checked against the cap as soon as its four
    bytes are in, before any of its frame is buffered: ``feed`` and ``next_frame`` raise
    ``FrameTooLarge`` then. The cap is an argument of each call because it changes with the
    connection's state (``first_frame_bytes_max`` until the peer has authenticated).
    """

    __slots__ = ("_buf", "_pos")

    #: Below this many consumed bytes, the prefix is kept (dropping it costs a move).
    _COMPACT_MIN = 64 * 1024

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def clear(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes, cap: int) -> None:
        """Append received bytes.

        :raises FrameTooLarge: the next frame's header is in and announces more than ``cap``.
        """
        self._buf += data
        self._check(cap)

    def _check(self, cap: int) -> int | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_BYTES:
            return None
        (length,) = _LENGTH.unpack_from(buf, pos)
        if length > cap:
            raise FrameTooLarge(length, cap)
        return int(length)

    def next_frame(self, cap: int) -> bytes | None:
        """The next complete frame's bytes (without the header), or None until it is all in.

        :raises FrameTooLarge: its header announces more than ``cap``.
        """
        length = self._check(cap)
        if length is None:
            return None
        start = self._pos + HEADER_BYTES
        end = start + length
        buf = self._buf
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            frame = bytes(view[start:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > self._COMPACT_MIN and 2 * end > len(buf):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return frame
