"""In-process stand-ins for the replication layer: no sockets, no threads, no clock."""
from __future__ import annotations

from raftsched.core.errors import Indeterminate, Unavailable


class FakeRaft:
    """Applies each proposal at once to one state; can be told to fail like pysyncobj does.

    ``fail`` = None | "unavailable" (definite: not applied) | "indeterminate_applied" (applied,
    but the caller hears a timeout) | "indeterminate_lost" (not applied, caller hears a timeout).
    """

    def __init__(self, state, leader: bool = True) -> None:
        self.state = state
        self.leader = leader
        self.fail: str | None = None
        self.proposed: list[bytes] = []
        self.index = 0

    def is_leader(self) -> bool:
        return self.leader

    def read(self, fn, *args):
        """``fn(state, *args)``: one thread here, so no lock to take."""
        return fn(self.state, *args)

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        if self.fail == "unavailable":
            raise Unavailable("no leader", leader=None)
        if self.fail == "indeterminate_lost":
            raise Indeterminate("timed out")
        self.proposed.append(data)
        self.index += 1
        res = self.state.apply_bytes(data)
        if self.fail == "indeterminate_applied":
            raise Indeterminate("leader changed")
        return res

    async def barrier(self, timeout_s: float = 5.0) -> None:
        if self.fail:
            raise Unavailable("no leader")

    def status(self) -> dict:
        return {"self": "127.0.0.1:1", "role": "leader" if self.leader else "follower",
                "leader": "127.0.0.1:1" if self.leader else None, "term": 1,
                "commit_index": self.index, "last_applied": self.index, "members": ["127.0.0.1:1"],
                "is_leader": self.leader}
