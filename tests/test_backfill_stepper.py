"""The leader's backfill stepper (node/backfills.py) over FakeRaft: it runs beside the trigger loop
only while the node leads, steps every active backfill from its committed cursor, reuses the
slots it enumerated, and a proposal that fails is simply planned again."""
from __future__ import annotations

import asyncio

from raftsched.clock import FakeClock
from raftsched.core import commands, due
from raftsched.core.errors import Unavailable
from raftsched.node import backfills
from raftsched.node.backfills import BackfillStepper
from raftsched.node.trigger import Trigger

from backfill_helpers import backfill_cmd, backfill_runs, finish_runs
from core_helpers import MIN, new_state, spec_of, tick
from fakes import FakeRaft


def state_with_history(clock: FakeClock, slots: int = 6):
    """Job j, every 60 s, whose ``slots`` slots all passed while no leader fired (recorded
    skipped), and the clock after them."""
    now = clock.now_ms()
    s = new_state(("j", spec_of({"every_s": 60}, "skip", grace_s=5)), now=now)
    anchor = s.jobs["j"]["anchor"]
    end = anchor + (slots + 1) * MIN
    tick(s, end)
    due.detach(s)  # as a follower holds it; the trigger attaches its own when it leads
    clock.advance(end - now)
    return s, anchor, end


def test_the_stepper_runs_only_while_leading_beside_the_trigger():
    async def main():
        clock = FakeClock()
        s, anchor, end = state_with_history(clock)
        raft = FakeRaft(s)
        trig = Trigger(raft, clock, "node-1")
        stepper = BackfillStepper(raft, clock, interval_s=0.01)
        trig.leader_tasks.append(stepper.run_while_leading)
        s.apply_bytes(commands.encode(backfill_cmd(s, "j", anchor, end, end, "bf", reprocess="all", max_concurrent=2)))
        task = asyncio.ensure_future(trig.run())
        for _ in range(200):
            if stepper.steps_proposed:
                break
            await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a bounded loop
        assert stepper.steps_proposed >= 1 and len(backfill_runs(s, "bf")) == 2
        raft.leader = False
        trig.on_role_change(False)
        await asyncio.sleep(0.2)  # ok-sleep: the trigger's tick (50 ms) sees it and stops leading; a window nothing may happen in
        n = stepper.steps_proposed
        finish_runs(s, clock.now_ms())
        await asyncio.sleep(0.1)  # ok-sleep: a negative check: no step may come in this window
        assert stepper.steps_proposed == n, "a follower's stepper proposed a step"
        raft.leader = True
        trig.on_role_change(True)
        for _ in range(300):
            if len(backfill_runs(s, "bf")) >= 4:
                break
            await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a bounded loop
        assert len(backfill_runs(s, "bf")) == 4, "a new term's stepper carries on from the cursor"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(main())


def test_a_failed_proposal_is_planned_again_and_slots_are_enumerated_once_for_many_steps(monkeypatch):
    async def main():
        clock = FakeClock()
        s, anchor, end = state_with_history(clock, slots=20)
        raft = FakeRaft(s)
        stepper = BackfillStepper(raft, clock)
        s.apply_bytes(commands.encode(backfill_cmd(s, "j", anchor, end, end, "bf", reprocess="all", max_concurrent=1)))
        enumerated = []

        def counting(*args):
            enumerated.append(args[3])  # the cursor it enumerated from
            return real(*args)
        monkeypatch.setattr(backfills, "next_slots", counting)
        raft.fail = "unavailable"
        try:
            await stepper.tick()
        except Unavailable:
            pass
        assert backfill_runs(s, "bf") == []
        raft.fail = None
        for _ in range(20):
            assert await stepper.tick() == 1
            finish_runs(s, clock.now_ms())
        assert [r["slot"] for r in backfill_runs(s, "bf")] == [anchor + k * MIN for k in range(1, 21)]
        assert s.backfills["bf"]["exhausted"]
        assert await stepper.tick() == 1  # the last, empty step makes it done
        assert s.backfills["bf"]["state"] == "done" and await stepper.tick() == 0
        assert len(enumerated) == 1, "the 20 slots were enumerated once, for the failed try and the 20 steps"
    real = backfills.next_slots
    asyncio.run(main())
