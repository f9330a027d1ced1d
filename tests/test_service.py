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


def test_preview_and_explain_compute_slots_off_the_event_loop(monkeypatch):
    # A schedule's slots can take a while to compute; a read-scope request must not hold the
    # node's event loop (the trigger, the API, lease renewals) meanwhile.
    import threading

    from raftsched.core import preview

    threads: list[str] = []
    real_preview, real_explain = preview.preview, preview.explain

    def spy(real):
        def wrapped(*args):
            threads.append(threading.current_thread().name)
            return real(*args)
        return wrapped

    monkeypatch.setattr(preview, "preview", spy(real_preview))
    monkeypatch.setattr(preview, "explain", spy(real_explain))
    raw = {"schedule": {"cron": "*/5 * * * *"}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "fire_once"}}
    svc = Service(FakeRaft(SchedulerState()), FakeClock(), "n1")

    async def main():
        await svc.put_job("j", raw, None)
        a = await svc.preview_job("j", 3, None)
        b = await svc.preview_spec(raw, 2)
        c = await svc.explain_job("j", {"down_from": "2027-01-01T00:00:00Z", "down_to": "2027-01-01T01:00:00Z"})
        return threading.current_thread().name, a, b, c

    loop_thread, a, b, c = asyncio.run(main())
    assert len(a["slots"]) == 3 and len(b["slots"]) == 2 and c["slots_due"] == 12
    assert len(threads) == 3 and loop_thread not in threads
