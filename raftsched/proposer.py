"""``Proposer``: the one way a command goes out of the node (issue 21): encode it, answer it from
the replica when its request id was applied already (the replay rule, core.queries.replayed),
propose it, wait for its result, and turn a refusal into the caller's error.

Every writer of the node goes through one: the API's service (node/service.py), the tokens
endpoints, backfills and their stepper, the worker fleet's protocol, the trigger loop, and the
embedded worker's channel (worker/loop.py: which is why this module sits beside the packages,
importing only core, and not in node/).
"""
from __future__ import annotations

import asyncio
import logging
import weakref

from .core import commands, queries
from .core.errors import RaftschedError
from .worker import limits as worker_limits

log = logging.getLogger("raftsched.proposer")


class _Lane:
    """The proposals in flight on one replication layer that no background proposer should
    queue behind (every proposal but a ``background`` one), and the background proposers
    waiting for them to end (``Proposer.yield_to_foreground``)."""

    __slots__ = ("busy", "waiters", "__weakref__")

    def __init__(self) -> None:
        self.busy = 0
        self.waiters: list[asyncio.Future] = []

    def leave(self) -> None:
        self.busy -= 1
        if self.busy == 0 and self.waiters:
            waiters, self.waiters = self.waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)


#: One lane per replication layer, shared by every Proposer over it (the API's, the trigger's,
#: the worker protocol's...): a storm's fire commands yield to the writes of all of them.
_LANES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lane(raft) -> _Lane:
    try:
        lane = _LANES.get(raft)
        if lane is None:
            lane = _LANES[raft] = _Lane()
    except TypeError:  # a stand-in that cannot be weakly referenced (None in a test): a lane of its own
        lane = _Lane()
    return lane


class Proposer:
    """:param raft: the replication layer (``propose(data, timeout_s)``, ``read(fn, *args)``).
    :param timeout_s: how long a proposal may wait for its result before it is Indeterminate."""

    def __init__(self, raft, timeout_s: float = worker_limits.propose_timeout_s_default) -> None:
        self.raft = raft
        self.timeout_s = timeout_s
        self._lane = _lane(raft)

    async def yield_to_foreground(self, max_s: float) -> bool:
        """Wait, at most ``max_s``, until no foreground proposal (any but a ``background`` one) is
        in flight on this replication layer: what a background proposer (a storm's fire commands,
        committed ahead of their slot) calls before it proposes, so that a lone API write is not
        grouped with, nor queued behind, a command it does not need. Returns whether it waited."""
        lane = self._lane
        if lane.busy == 0:
            return False
        fut = asyncio.get_running_loop().create_future()
        lane.waiters.append(fut)
        try:
            await asyncio.wait_for(fut, max_s)
        except asyncio.TimeoutError:
            pass  # bounded: a steady stream of writes delays a storm, it does not stop it
        return True

    async def propose(self, cmd: dict, *, timeout_s: float | None = None, replay: bool = True,
                      background: bool = False) -> dict:
        """Propose ``cmd`` (a core.commands constructor's) and return its applied result.

        A request id this replica has seen applied is answered from there, without proposing:
        that answer is final (a retry, or a key reused for another request). That look takes the
        replica's lock, which an apply may hold: the worker protocol's hot path (``replay=False``)
        leaves it to apply, which answers a repeated id the same way.

        :raises RaftschedError: the state refused it (the error apply gave: ``invalid``,
            ``conflict``, ``not_found``, ... and ``internal`` for a bug in a handler, logged
            here with its command); ``Unavailable`` (it did not happen) or ``Indeterminate``
            (it may still) from replication; ``LimitExceeded`` when it is too large."""
        data = commands.encode(cmd)
        if replay and cmd.get("rid") is not None:
            seen = self.raft.read(queries.replayed, cmd)
            if seen is not None:
                return self.result(seen, cmd)
        return await self.propose_encoded(data, cmd, timeout_s=timeout_s, background=background)

    async def propose_encoded(self, data: bytes, cmd: dict | None = None, *,
                              timeout_s: float | None = None, background: bool = False) -> dict:
        """``propose`` for a command already encoded (``cmd``, when given, names it in a log
        line about a bug). A ``background`` proposal is one others do not wait for
        (``yield_to_foreground``); every other one is foreground while it is in flight."""
        lane = None if background else self._lane
        if lane is not None:
            lane.busy += 1
        try:
            res = await self.raft.propose(data, timeout_s=self.timeout_s if timeout_s is None else timeout_s)
        finally:
            if lane is not None:
                lane.leave()
        return self.result(res, cmd)

    @staticmethod
    def result(res: dict, cmd: dict | None = None) -> dict:
        """``res`` when it is a success, else the error it carries, raised."""
        if res.get("ok"):
            return res
        error = res.get("error") or {"code": "internal", "message": "refused without a reason"}
        if error.get("code") == "internal":
            op = None if cmd is None else cmd.get("op")
            log.error("proposer: the state could not apply %s (a bug, every replica alike): %s",
                      op or "a command", error.get("message"))
        raise RaftschedError.from_dict(error)

    @staticmethod
    def out(res: dict, body: dict) -> dict:
        """The response body, marked when the request id had already been applied."""
        if res.get("duplicate"):
            body["duplicate"] = True
        return body
