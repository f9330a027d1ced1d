"""In-process stand-ins for the replication layer: no sockets, no threads, no clock.

``FakeRaft`` is the one replication fake: it has the methods of the ``Replicator`` protocol
(``raftsched.replication``) that the node layer calls, and applies each proposal at once to one
state, so the upper layers (service, API, trigger, worker) are tested without pysyncobj.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, TypeVar

from raftsched.core.errors import Conflict, Indeterminate, InvalidSpec, Unavailable

__all__ = ["FakeRaft"]

T = TypeVar("T")


class FakeRaft:
    """Applies each proposal at once to one state; can be told to fail like pysyncobj does.

    ``fail`` = None | "unavailable" (definite: not applied) | "indeterminate_applied" (applied,
    but the caller hears a timeout) | "indeterminate_lost" (not applied, caller hears a timeout).
    ``leader`` is what ``is_leader`` and ``status`` report; a proposal applies either way (a
    RaftNode that follows forwards it to the leader). ``proposed`` holds every command that was
    applied, in order, and ``index`` counts them.
    """

    def __init__(self, state, leader: bool = True) -> None:
        self.state = state
        self.leader = leader
        self.fail: str | None = None
        self.proposed: list[bytes] = []
        self.index = 0
        self.armed: Callable[[], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: reads and applies one at a time, as RaftNode's lock makes them: the node reads from
        #: threads too (node/walks.py: a metrics scrape, GET /v1/queues, the notifier's look)
        self._lock = threading.RLock()
        #: What ``status()["replication"]`` reports (RaftNode's ReplicationWatch.view): a lone
        #: node that keeps up, unless a test sets another view.
        self.replication: dict = {"commit_stalled_s": 0.0, "leader_commit_index": 0,
                                  "followers": {}, "conditions": []}
        #: The configuration ``change_members`` changes: an added member is a voter at once
        #: (there is no log to catch up with); ``refuse`` makes the next change a Conflict.
        self.voters: list[str] = ["127.0.0.1:1"]
        self.refuse: str | None = None
        #: What ``clock_status()`` reports: a lone node's clock agrees with itself, unless a
        #: test sets another state.
        self.clock: dict = {"state": "agrees", "offset_ms": 0, "error_ms": 0, "bound_ms": 1000,
                            "cluster_ms": None, "source": "self", "candidacy_held": False, "peers": {},
                            "conditions": []}

    def arm_applied(self, fn: Callable[[], None]) -> None:
        """As RaftNode's: ``fn`` is called on the loop after the next proposal applies (a test
        that changes ``state`` directly wakes nobody)."""
        self.armed = fn

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Nothing to start: remembers the loop, as RaftNode does."""
        self.loop = loop

    def dump_before_stop(self, timeout_s: float) -> bool:
        """Nothing to dump (no journal)."""
        return True

    def stop(self) -> None:
        """Nothing to stop."""

    def is_leader(self) -> bool:
        return self.leader

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(state, *args)`` under the lock applies take (from any thread, as RaftNode's)."""
        with self._lock:
            return fn(self.state, *args)

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        if self.fail == "unavailable":
            raise Unavailable("no leader", leader=None)
        if self.fail == "indeterminate_lost":
            raise Indeterminate("timed out")
        self.proposed.append(data)
        self.index += 1
        with self._lock:
            res = self.state.apply_bytes(data)
        armed, self.armed = self.armed, None
        if armed is not None:
            asyncio.get_running_loop().call_soon(armed)
        if self.fail == "indeterminate_applied":
            raise Indeterminate("leader changed")
        return res

    async def barrier(self, timeout_s: float = 5.0) -> None:
        if self.fail:
            raise Unavailable("no leader")

    async def change_members(self, op: str, addr: str, timeout_s: float = 30.0) -> dict:
        if op not in ("add", "remove") or not isinstance(addr, str) or ":" not in addr:
            raise InvalidSpec(f"bad membership change {op!r} {addr!r}", "addr")
        if self.fail == "unavailable":
            raise Unavailable("no leader", leader=None)
        if self.refuse:
            raise Conflict(self.refuse, "addr")
        was = addr in self.voters
        if op == "add" and not was:
            self.voters = sorted([*self.voters, addr])
        elif op == "remove" and was:
            self.voters = [v for v in self.voters if v != addr]
        state = "voter" if addr in self.voters else "removed"
        return {"addr": addr, "state": state, "changed": was != (state == "voter"),
                "members": {"voters": list(self.voters), "learners": [], "index": self.index}}

    def cluster_ms(self) -> int | None:
        """No cluster clock: a ClusterClock over this fake runs on its local clock."""
        return None

    def clock_status(self) -> dict:
        """What ``RaftNode.clock_status`` reports: ``clock`` (a test may set another state)."""
        return dict(self.clock)

    def status(self) -> dict:
        return {"self": "127.0.0.1:1", "role": "leader" if self.leader else "follower",
                "leader": "127.0.0.1:1" if self.leader else None, "term": 1,
                "commit_index": self.index, "last_applied": self.index, "members": list(self.voters),
                "learners": [], "membership": {"voters": list(self.voters), "learners": [], "index": 0,
                                               "pending": None, "self": "voter"},
                "is_leader": self.leader,
                # One list of conditions, as RaftNode.status makes it: replication's and the clock's.
                "replication": dict(self.replication, leader_commit_index=self.index,
                                    conditions=self.replication["conditions"] + self.clock["conditions"]),
                "clock": self.clock_status()}
