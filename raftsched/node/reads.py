"""Reads that see every acknowledged write: one barrier round for every read waiting at once.

Every GET of the API (but ``/healthz`` and ``/metrics``) is linearizable by default, as etcd's
are: before it reads this node's replica, it waits until the replica has applied every write
acknowledged before the request arrived. ``?stale=true`` reads the replica as it is, and the
answer says so (``X-Raftsched-Stale: true``).

How (docs/design.md, "Reads"): etcd's ReadIndex asks the leader for its commit index, the leader
confirms it still leads with a heartbeat round, and the node waits until it has applied that
index; hashicorp/raft's VerifyLeader is the same confirmation. pysyncobj offers neither: what it
offers is a committed entry, so a round here is ``raft.barrier()``: a no-op committed through the
leader (which proves both its leadership and the commit index at that moment) and applied on this
node. The cost is made small by batching, as etcd batches ReadIndex requests: at most one round
is in flight; every read that arrives while it is becomes one batch, served by the next round,
which starts when the one in flight ends. A round must start after every read it serves arrived
(a round already in flight may have been proposed before a write those reads must see), so a
burst of reads costs one round (two at most for the read that started the first), not one each.

A node that knows no leader, or is not connected to the one it knows, cannot tell what is current:
the read fails at once (503, Retry-After) rather than waiting out an election; ``?stale=true``
still answers from its replica.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ..core.errors import Indeterminate, RaftschedError, Unavailable

log = logging.getLogger("raftsched.reads")

#: The header a stale read's answer carries.
STALE_HEADER = "X-Raftsched-Stale"
#: How often ``ReadBarrier.caught_up`` looks at the replica's progress while it is behind.
_CATCH_UP_POLL_S = 0.02


#: How long a leader whose connections reach no quorum waits for one to be made again before a
#: read fails (a peer reconnecting; a leader cut off steps down after about 1 s).
_QUORUM_GRACE_S = 1.0


def _no_quorum(st: dict) -> tuple[int, int] | None:
    """(voters reached, voters) when this node leads and its connections reach no quorum of the
    voters of its latest configuration (the pending change's, else the committed one's, which
    its connections follow), else None."""
    leader, connected = st.get("leader"), st.get("peers_connected")
    if leader is None or leader != st.get("self") or connected is None:
        return None
    pending = (st.get("membership") or {}).get("pending")
    voters = (pending or {}).get("voters") or st.get("members") or ()
    if not voters:
        return None
    reach = sum(1 for v in voters if v == leader or v in connected)
    return None if reach >= len(voters) // 2 + 1 else (reach, len(voters))


class ReadBarrier:
    """One barrier round for every read waiting when it starts (see the module's doc).

    :param raft: the replication adapter (``barrier``, ``status``).
    :param timeout_s: how long a round may take before its reads fail (503).
    :param observe: ``f(seconds)`` for each round's duration (the read-barrier latency metric).
    """

    def __init__(self, raft, timeout_s: float, observe: Callable[[float], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.raft = raft
        self.timeout_s = timeout_s
        self.observe = observe
        self._monotonic = monotonic
        #: The batch the next round serves (None: nobody waits for one).
        self._next: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        #: Rounds started, and reads served (a read waits for exactly one round).
        self.rounds = 0
        self.reads = 0

    async def wait(self) -> None:
        """Return once this node has applied every write acknowledged before the call.

        :raises Unavailable: no leader now, or the round failed (nothing a read did changes).
        """
        loop = asyncio.get_running_loop()
        fut = self._next
        if fut is None:
            fut = self._next = loop.create_future()
            # A failed batch whose readers all went away still has its exception retrieved.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._rounds())
        self.reads += 1
        await asyncio.shield(fut)

    async def caught_up(self, timeout_s: float | None = None) -> None:
        """Return once this node has applied every entry it knows the leader committed (the
        leader: its own commit index; a follower: the leader's, as its last message said), with
        no entry of its own: what a node that just started and replays its log, or one behind,
        has yet to apply. Weaker than :meth:`wait` (a write committed within the leader's last
        heartbeat may not be known here yet), and free: a client that sends what this node
        cannot know yet (a token, node/api.py) makes no commit through the log.

        :raises Unavailable: no leader known, or not caught up within ``timeout_s`` (the
            barrier's timeout by default)."""
        st = self.raft.status()
        if st.get("leader") is None:
            raise Unavailable("no leader: this node cannot tell which writes are acknowledged; retry",
                              leader=None)
        repl = st.get("replication") or {}
        target = max(st.get("commit_index") or 0, 0 if st.get("is_leader") else repl.get("leader_commit_index") or 0)
        deadline = self._monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while (st.get("last_applied") or 0) < target:
            if self._monotonic() >= deadline:
                raise Unavailable(f"this node has applied {st.get('last_applied')} of the {target} entries the "
                                  "leader committed, and did not catch up in time; retry", leader=st.get("leader"))
            await asyncio.sleep(_CATCH_UP_POLL_S)  # ok-sleep: polling the replica's progress within a deadline
            st = self.raft.status()

    async def _rounds(self) -> None:
        while self._next is not None:
            fut, self._next = self._next, None
            self.rounds += 1
            started = self._monotonic()
            try:
                await self._round()
            except RaftschedError as e:
                if not fut.done():
                    fut.set_exception(e)
            except BaseException as e:  # cancelled (the node stops): its reads end too
                if not fut.done():
                    fut.set_exception(Unavailable(f"read barrier interrupted ({type(e).__name__})"))
                raise
            else:
                if not fut.done():
                    fut.set_result(None)
            finally:
                if self.observe is not None:
                    try:
                        self.observe(self._monotonic() - started)
                    except Exception:  # a metric never stalls the reads waiting for the next round
                        log.exception("reads: the barrier latency observer raised")

    async def _round(self) -> None:
        st = self.raft.status()
        leader = st.get("leader")
        me = (st.get("membership") or {}).get("self")
        if me == "starting":
            raise Unavailable("this node is starting: it has not read its log yet; retry in a moment, or read "
                              "its replica as it is with ?stale=true", leader=leader)
        if me == "none":
            # Removed (or not added yet): it hears no leader's entries, so no retry here helps.
            raise Unavailable("this node is not a member of the cluster (removed, or not added yet): its replica "
                              "is not kept up to date; ask a member, or read this replica as it is with "
                              "?stale=true", leader=leader)
        if leader is None:
            raise Unavailable("no leader: this node cannot tell which writes are acknowledged; "
                              "retry, or read its replica as it is with ?stale=true", leader=None)
        connected = st.get("peers_connected")
        if leader != st.get("self") and connected is not None and leader not in connected:
            # Cut off from the leader it last heard of: no round could commit before the deadline.
            raise Unavailable(f"the leader {leader} is not reachable from this node; retry, or read its "
                              "replica as it is with ?stale=true", leader=leader)
        short = _no_quorum(st)
        if short is not None:
            # A leader cut off from its quorum (the others killed, a partition) until it steps
            # down: no round can commit. A connection that is being made again (a peer
            # reconnecting) is given _QUORUM_GRACE_S; then the read fails, not after the deadline.
            deadline = self._monotonic() + _QUORUM_GRACE_S
            while short is not None and self._monotonic() < deadline:
                await asyncio.sleep(_CATCH_UP_POLL_S)  # ok-sleep: polling the connections within a deadline
                short = _no_quorum(self.raft.status())
            if short is not None:
                raise Unavailable(f"this node leads but reaches {short[0]} of the {short[1]} voters, no quorum: it "
                                  "cannot tell which writes are acknowledged; retry, or read its replica as it is "
                                  "with ?stale=true", leader=leader)
        try:
            await self.raft.barrier(timeout_s=self.timeout_s)
        except Indeterminate as e:
            # The barrier is a no-op: whether it applied or not, this read learnt nothing.
            why = e.message.split("; the command may still apply")[0]
            raise Unavailable(f"read barrier: no quorum confirmed that this node holds every acknowledged write "
                              f"({why}); retry, or read its replica as it is with ?stale=true",
                              leader=e.extra.get("leader")) from None
