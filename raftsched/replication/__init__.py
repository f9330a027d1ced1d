"""Replication: the only package that imports pysyncobj.

``RaftNode`` replicates one state object (``apply_bytes`` / ``snapshot`` / ``restore``) through a
pysyncobj 0.3.17 Raft group, and gives the asyncio world four things: ``await propose(bytes) ->
result``, leadership events, ``status()`` and ``await change_members(op, addr)``. ``Replicator`` is what
the node layer uses of it; the upper layers are tested against
``raftsched.testing.fakes.FakeRaft`` instead.

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
- Its connections believed any frame length a peer announced and buffered the whole frame,
  copying it again at every read, before the authentication could refuse it: a stranger's
  16 MiB frame deposed a leader, and a stranger's silent connections stayed open for good.
  ``RaftTransport`` reads through ``_BoundedConnection`` (``_connection.py``): frames capped at
  their header (``_frames.py``: the key exchange's size until the peer has proved the secret,
  then the largest frame this configuration sends), read in linear time, and a connection that
  has not completed the key exchange within ``authTimeout`` dropped.
- ``SyncObjConf`` silently accepts misspelt options: ``make_conf`` refuses unknown keys.
- A journal without a full dump file loses the state after a compaction and a restart: both files
  are always set, in ``data_dir``.
- The tick thread that runs Raft also serialises snapshots. The dump is written by a forked child
  (``useFork``), and the state is encoded *in the child* (see ``_DeferredSnapshot``), so a
  compaction costs the tick thread a ``fork()``, not an encoding of the whole state.
- pysyncobj's membership change is unsafe (its one-change-at-a-time guard is dead code, a dump's
  member list overrides the log's, it has no learners), so ``dynamicMembershipChange`` is refused
  and membership changes online through raftsched's own rules (``_membership``).
- It never syncs its journal: a follower answered for entries in its page cache only, so a
  power loss of a majority could lose acknowledged writes. The journal is raftsched's
  (``_storage._DurableJournal``), and with ``fsync`` on, a sync gate holds back every answer that
  speaks for the log until one ``fdatasync`` covers it (``_durable.py``).
- Its cost is per log entry (one encrypted append_entries to each follower and one answer back,
  with batching off), so ``propose`` commits the commands proposed in one turn of the event loop
  as one entry, a group, applied in order and answered one by one (``RaftNode._enqueue``).

Threading contract: ``start``, ``propose``, ``barrier``, ``status``, ``is_leader`` and ``stop`` are
called from the event loop thread. ``start`` must run on a thread that outlives the node (the loop
thread): pysyncobj's tick thread exits when the thread that created the ``SyncObj`` ends.

The modules: ``node`` (RaftNode), ``conf`` (RAFT_CONF_DEFAULTS, make_conf), ``_consumer`` (the
replicated state as pysyncobj sees it), ``_syncobj`` (the Raft corrections to SyncObj),
``_transport`` (RaftTransport, uncompressed messages), ``_connection`` and ``_frames`` (the Raft
port's connections and their frame caps), ``_storage`` (the durable journal, the dump's rename
and gzip), ``_disk`` (every file operation on them), ``_durable`` (the sync gate), ``powerloss``
(a model of a power loss, for tests), ``_crypto`` (message protection), ``_membership`` (online
membership change: learners, one change at a time) and ``_install`` (the stand-ins put into
pysyncobj).

Importing the package changes nothing in pysyncobj. The stand-ins for four of its module
globals and the filter on its logger are put in place by ``install()``, which every ``RaftNode``
calls when it is made, and which refuses to run on a pysyncobj whose internals differ from the
ones they were written against.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

from ._consumer import BARRIER_NOOP
from ._identity import refusal as data_dir_refusal
from ._install import install
from ._membership import check_addr as check_member_addr
from ._transport import RaftTransport
from .conf import RAFT_CONF_DEFAULTS, make_conf
from .node import RaftNode

__all__ = ["BARRIER_NOOP", "RAFT_CONF_DEFAULTS", "RaftNode", "RaftTransport", "Replicator",
           "check_member_addr", "data_dir_refusal", "install", "make_conf"]


T = TypeVar("T")


@runtime_checkable
class Replicator(Protocol):
    """What the node layer uses of a replication adapter: ``RaftNode``, or
    ``raftsched.testing.fakes.FakeRaft`` in tests.

    ``propose`` and ``barrier`` raise ``Unavailable`` when the command did not happen and
    ``Indeterminate`` when it may still happen (``RaftNode.propose`` says when each is raised).
    """

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start replicating; results and role changes are delivered on ``loop``."""

    def dump_before_stop(self, timeout_s: float) -> bool:
        """Before a graceful stop: write a full dump of what this node has applied (waiting at
        most ``timeout_s``); whether it was written."""

    def stop(self) -> None:
        """Stop; proposals still waiting end ``Indeterminate``."""

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        """Replicate one command and return its result as applied on this node."""

    async def barrier(self, timeout_s: float = 5.0) -> None:
        """Return once this node has applied every write acknowledged before the call."""

    def is_leader(self) -> bool:
        """Whether this node is in the leader role now (decide nothing on it alone)."""

    def status(self) -> dict:
        """This node's view of the group: role, leader, term, commit index, members..."""

    async def change_members(self, op: str, addr: str, timeout_s: float = 30.0) -> dict:
        """Add (``op="add"``) or remove (``"remove"``) a member by its Raft address, once
        committed; ``RaftNode.change_members`` says what it answers and raises."""

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(state, *args)``, run while no command applies: the one way to read the state."""

    def arm_applied(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the loop, once, after the next entry this replica applies: a reader waits
        for the state to move instead of polling it (``RaftNode.arm_applied``)."""

    def cluster_ms(self) -> int | None:
        """Cluster time now (the median of the members' wall clocks), or None when unknown."""

    def clock_status(self) -> dict:
        """This node's wall clock against the cluster's (``state``: agrees, disagrees, unknown,
        unchecked; ``offset_ms``, ``error_ms``, ``bound_ms``, ``conditions``...)."""
