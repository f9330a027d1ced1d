"""raftsched/testing/fakes.py: the replication fake behaves as the upper layers' tests assume
(each proposal applied at once, failures as pysyncobj reports them, reads as plain calls)."""
from __future__ import annotations

import asyncio

import pytest

from raftsched.core.errors import Indeterminate, Unavailable
from raftsched.testing.fakes import FakeRaft


class Log:
    """A state that records the commands applied to it, in order."""

    def __init__(self):
        self.applied: list[bytes] = []

    def apply_bytes(self, data: bytes) -> dict:
        self.applied.append(data)
        return {"ok": True, "n": len(self.applied)}


def test_a_proposal_applies_at_once_and_returns_the_states_result():
    async def main():
        st = Log()
        raft = FakeRaft(st)
        raft.start(asyncio.get_running_loop())
        assert await raft.propose(b"a") == {"ok": True, "n": 1}
        assert st.applied == [b"a"]
        assert await raft.propose(b"b") == {"ok": True, "n": 2}
        await raft.barrier()
        status = raft.status()
        assert status["role"] == "leader" and status["is_leader"] and raft.is_leader()
        assert (status["term"], status["commit_index"], status["last_applied"]) == (1, 2, 2)
        assert raft.proposed == [b"a", b"b"] == st.applied
        raft.stop()
    asyncio.run(main())


def test_failures_say_whether_the_command_applied():
    async def main():
        st = Log()
        raft = FakeRaft(st)
        raft.fail = "unavailable"  # definite: not applied
        with pytest.raises(Unavailable):
            await raft.propose(b"u")
        with pytest.raises(Unavailable):
            await raft.barrier()
        raft.fail = "indeterminate_lost"  # the caller hears a timeout; nothing applied
        with pytest.raises(Indeterminate):
            await raft.propose(b"l")
        assert st.applied == [] and raft.index == 0 and raft.proposed == []
        raft.fail = "indeterminate_applied"  # the caller hears a timeout; it applied
        with pytest.raises(Indeterminate):
            await raft.propose(b"i")
        assert st.applied == [b"i"] and raft.index == 1
        raft.fail = None
        await raft.barrier()
    asyncio.run(main())


def test_a_follower_reports_no_leader_and_still_applies_what_it_forwards():
    async def main():
        st = Log()
        raft = FakeRaft(st, leader=False)
        assert not raft.is_leader()
        status = raft.status()
        assert status["role"] == "follower" and status["leader"] is None and not status["is_leader"]
        assert (await raft.propose(b"f"))["ok"] and st.applied == [b"f"]
    asyncio.run(main())


def test_read_calls_the_function_on_the_state_with_the_arguments():
    st = Log()
    st.apply_bytes(b"r1")
    st.apply_bytes(b"x1")
    raft = FakeRaft(st)
    assert raft.read(lambda s: list(s.applied)) == [b"r1", b"x1"]
    assert raft.read(lambda s, p: [c for c in s.applied if c.startswith(p)], b"r") == [b"r1"]
