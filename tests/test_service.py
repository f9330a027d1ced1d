"""node/service.py over an in-process replica whose local state may lag the log."""
from __future__ import annotations

import asyncio

from raftsched.clock import FakeClock
from raftsched.core import commands
from raftsched.core.state import SchedulerState
from raftsched.node.service import Service

from fakes import FakeRaft


class LaggingRaft(FakeRaft):
    """Commits (``commit_later``) without applying on this replica until a barrier: a follower
    that is behind, or a node replaying its journal after a restart."""

    def __init__(self, state) -> None:
        super().__init__(state)
        self.unapplied: list[bytes] = []

    def commit_later(self, data: bytes) -> None:
        self.unapplied.append(data)

    async def barrier(self, timeout_s: float = 5.0) -> None:
        await super().barrier(timeout_s)
        while self.unapplied:
            self.state.apply_bytes(self.unapplied.pop(0))


def test_resume_reads_the_job_after_a_barrier_not_from_a_lagging_replica():
    st = SchedulerState()
    raft = LaggingRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    asyncio.run(svc.put_job("j", {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                                   "misfire": {"policy": "skip"}}, None))
    raft.commit_later(commands.encode(commands.make("pause_job", clock.now_ms(), None, name="j")))
    # Committed elsewhere, not applied here yet: the job is not paused in this replica's view.
    assert st.jobs["j"]["paused"] is False
    out = asyncio.run(svc.resume_job("j", None))
    assert out["paused"] is False and st.jobs["j"]["paused"] is False
    assert raft.unapplied == []


def test_resume_of_a_job_created_but_not_yet_applied_here_is_not_a_404():
    st = SchedulerState()
    raft = LaggingRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    spec = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    asyncio.run(svc.put_job("j", spec, None))
    asyncio.run(svc.pause_job("j", None))
    st2 = SchedulerState()  # a replica that has applied nothing yet
    lag = LaggingRaft(st2)
    for data in raft.proposed:
        lag.commit_later(data)
    out = asyncio.run(Service(lag, clock, "n2").resume_job("j", None))
    assert out["paused"] is False
