"""The worker over an in-process replica: a real SchedulerState behind a fake log that commits,
like replication.RaftNode, the commands proposed in one turn of the event loop as one group.
Every wait has a deadline; no fixed sleeps decide an outcome."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

import exec_targets
from raftsched.clock import Clock, FakeClock, SystemClock
from raftsched.core import commands
from raftsched.core.errors import Indeterminate, Unavailable
from raftsched.core.state import SchedulerState
from raftsched.node.service import Service
from raftsched.worker.loop import Worker, WorkerFailed


class GroupRaft:
    """Applies the commands proposed in one turn of the event loop together, ``delay_s`` later
    (a log round trip), and records each group's decoded commands."""

    def __init__(self, state, delay_s: float = 0.0) -> None:
        self.state = state
        self.delay_s = delay_s
        self.groups: list[list[dict]] = []
        self._pending: list[tuple[bytes, asyncio.Future]] = []
        #: op -> how its proposals fail: "unavailable" (refused at once, like a lost leader) or
        #: "hang" (no answer until the proposal's timeout, then Indeterminate, like RaftNode)
        self.failing: dict[str, str] = {}
        #: op -> called with (command, result) once it applied, before its proposer hears
        #: (what happens meanwhile while an answer is on its way)
        self.on_applied: dict[str, object] = {}

    def is_leader(self) -> bool:
        return True

    def status(self) -> dict:
        """What a read barrier asks first (node/reads.py): there is a leader, this node."""
        return {"leader": "127.0.0.1:1", "is_leader": True}

    def read(self, fn, *args):
        return fn(self.state, *args)

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        how = self.failing.get(commands.decode(data)["op"]) if self.failing else None
        if how == "unavailable":
            raise Unavailable("no leader", leader=None)
        if how == "hang":
            try:
                await asyncio.wait_for(asyncio.get_running_loop().create_future(), timeout_s)
            except asyncio.TimeoutError:
                raise Indeterminate("timed out") from None
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((data, fut))
        return await fut

    def _flush(self) -> None:
        group, self._pending = self._pending, []

        async def commit() -> None:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)  # ok-sleep: the simulated round trip
            self.groups.append([commands.decode(d) for d, _ in group])
            for d, fut in group:
                res = self.state.apply_bytes(d)
                hook = self.on_applied.get(commands.decode(d)["op"]) if self.on_applied else None
                if hook is not None:
                    hook(commands.decode(d), res)
                if not fut.done():
                    fut.set_result(res)

        asyncio.ensure_future(commit())

    def ops(self, op: str) -> list[dict]:
        return [c for g in self.groups for c in g if c["op"] == op]


async def wait_until(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # ok-sleep: polling interval inside a deadline loop


class Env:
    """One worker over one replica. The clock is the system's by default: prefetching and
    outcome coalescing are decided by how long real runs and the simulated log round trip take.
    A test of the lease watchdog passes a ``FakeClock`` and moves it by hand."""

    def __init__(self, job: str, target: str, runs: int, slots: int, delay_s: float = 0.0,
                 clock: Clock | None = None, **worker_kw) -> None:
        self.state = SchedulerState()
        self.raft = GroupRaft(self.state, delay_s)
        self.clock = clock if clock is not None else SystemClock()
        self.service = Service(self.raft, self.clock, "node-1")
        self.job, self.target, self.runs = job, target, runs
        # No sandbox: these tests watch the lease loop run targets in this process (exec_targets'
        # events); tests/test_sandbox.py runs them isolated.
        self.worker = Worker(self.raft, self.clock, "node-1", sandbox=None, slots=slots, single_node=True,
                             poll_interval_s=0.01, **worker_kw)

    async def setup(self) -> list[str]:
        spec = {"schedule": {"every_s": 3600}, "executor": {"type": "python", "target": self.target},
                "history": 1000, "misfire": {"policy": "skip"}}
        await self.service.put_job(self.job, spec, None)
        return [(await self.service.trigger_job(self.job, None))["run"] for _ in range(self.runs)]

    def states(self, ids) -> dict[str, int]:
        out: dict[str, int] = {}
        for rid in ids:
            st = self.state.runs[rid]["state"]
            out[st] = out.get(st, 0) + 1
        return out


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_runs_are_reported_in_batches_that_share_an_entry_with_the_next_acquire():
    async def t():
        env = Env("batched", "builtins:id", runs=200, slots=8)
        ids = await env.setup()
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: env.worker.completed == 200, 20, "every run to complete")
        await stop(task)
        assert env.states(ids) == {"succeeded": 200}
        assert all(int(env.state.runs[r]["output"]) > 0 for r in ids)  # id()'s value, as repr
        reports = env.raft.ops("complete_many")
        assert sum(len(c["rows"]) for c in reports) == 200
        assert len(reports) < 200 / 4, len(reports)  # batched
        # Reports and the acquire for the slots they freed travel in one group (one log entry).
        assert any({"acquire", "complete_many"} <= {c["op"] for c in g} for g in env.raft.groups)
        # Never more asked for than slots plus prefetch (as many again).
        assert max(c["max"] for c in env.raft.ops("acquire")) <= 16
        assert env.worker.held == {} and env.worker._executing == 0
    run(t())


def test_short_runs_are_prefetched_but_no_more_than_slots_execute_at_once():
    async def t():
        exec_targets.GATE.clear()
        exec_targets.CONCURRENCY.update(now=0, max=0)
        # Runs of ~5 ms against a 30 ms round trip: the round trip would bound the rate.
        env = Env("prefetched", "exec_targets:concurrent", runs=120, slots=4)
        ids = await env.setup()
        env.raft.delay_s = 0.03
        task = asyncio.create_task(env.worker.run())
        waiting_max = 0
        while env.worker.completed < 120:
            waiting_max = max(waiting_max, len(env.worker._waiting))
            assert len(env.worker._waiting) <= 4  # prefetch: at most the slots again
            await asyncio.sleep(0.001)  # ok-sleep: sampling interval; the loop ends on the count
            assert not task.done(), task
        await stop(task)
        assert env.states(ids) == {"succeeded": 120}
        assert exec_targets.CONCURRENCY["max"] <= 4
        assert waiting_max > 0  # runs were granted ahead of a free slot
        assert max(c["max"] for c in env.raft.ops("acquire")) > 4
    run(t())


def test_long_runs_are_not_prefetched():
    async def t():
        env = Env("long", "exec_targets:sleepy", runs=12, slots=3)
        ids = await env.setup()
        task = asyncio.create_task(env.worker.run())
        while env.worker.completed < 12:
            assert not env.worker._waiting and env.worker._prefetch() == 0
            await asyncio.sleep(0.005)  # ok-sleep: sampling interval; the loop ends on the count
            assert not task.done(), task
        await stop(task)
        assert env.states(ids) == {"succeeded": 12}
        assert max(c["max"] for c in env.raft.ops("acquire")) <= 3
    run(t())


def test_a_prefetched_run_whose_lease_is_lost_never_starts():
    async def t():
        exec_targets.GATE.clear()
        env = Env("lost-ahead", "exec_targets:gate", runs=2, slots=1)
        ids = await env.setup()
        # As if short runs and a slow log had been measured: prefetch one run.
        env.worker._exec_s, env.worker._acquire_rtt_s = 0.001, 1.0
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: len(env.worker._waiting) == 1, 5, "a run granted ahead of a slot")
        await wait_until(lambda: any(r in exec_targets.RECORDED for r in ids), 5, "the first run to start")
        first = next(r for r in ids if r in exec_targets.RECORDED)
        second = next(r for r in ids if r != first)
        assert env.worker._waiting[0].grant["id"] == second
        env.worker._waiting[0].cancel.set()  # its heartbeat came back "lost"
        exec_targets.GATE.set()
        await wait_until(lambda: env.worker.completed == 1, 5, "the first run to be reported")
        await wait_until(lambda: not env.worker.held, 5, "the worker to let go of both leases")
        await stop(task)
        assert second not in exec_targets.RECORDED  # never started
        assert env.state.runs[first]["state"] == "succeeded"
        assert env.state.runs[second]["state"] == "running"  # its lease expires: a lost attempt
        exec_targets.GATE.clear()
    run(t())


@pytest.mark.parametrize("way", ["awaited", "soon"])
def test_a_thread_that_outlives_its_run_keeps_the_slot_taken_until_it_returns(way):
    """An executor whose Outcome lingers (a handler's thread that could not be stopped,
    ``run_function(..., linger=True)``): the attempt is reported at once, but the worker starts
    no other run in that slot until the thread has returned, so it never runs more threads than
    its slots. The same for an executor the loop starts by callbacks (``soon``, an --app
    worker's in-process handlers), which it never awaits."""
    from raftsched.worker.executors import function_soon, run_function

    async def t():
        exec_targets.GATE.clear()
        env = Env("lingering", "exec_targets:gate", runs=2, slots=1)
        spec = {"schedule": {"every_s": 3600}, "executor": {"type": "python", "target": env.target},
                "history": 1000, "misfire": {"policy": "skip"}, "timeout_s": 1, "retry": {"max_attempts": 1}}
        await env.service.put_job(env.job, spec, None)
        ids = [(await env.service.trigger_job(env.job, None))["run"] for _ in range(2)]
        for rid in ids:
            exec_targets.RECORDED.pop(rid, None)  # run ids are derived: another test may have used them

        class Soon:
            async def __call__(self, ctx, timeout_s, cancel):
                raise AssertionError("an executor that can start by callbacks is not awaited")

            def soon(self, ctx, timeout_s, cancel, on_done):
                return function_soon(exec_targets.gate, ctx, timeout_s, cancel, on_done, name=env.target,
                                     linger=True)

        def lookup(grant):
            if way == "soon":
                return Soon()
            return lambda ctx, timeout_s, cancel: run_function(exec_targets.gate, ctx, timeout_s, cancel,
                                                               name=env.target, linger=True)
        env.worker.executor_lookup = lookup
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: any(r in exec_targets.RECORDED for r in ids), 5, "the first run to start")
        first = next(r for r in ids if r in exec_targets.RECORDED)
        second = next(r for r in ids if r != first)
        await wait_until(lambda: env.state.runs[first]["state"] == "dead", 10, "the first run's timeout to be reported")
        assert env.state.runs[first]["error"] == ("timed out after 1s; the handler's thread could not be stopped "
                                                  "and is still running")
        assert env.worker.lingering == 1
        # The report went out without an acquire for the slot: it is still taken.
        assert len(env.raft.ops("acquire")) == 1 and env.state.runs[second]["state"] == "queued"
        exec_targets.GATE.set()  # the thread returns; the slot is free
        await wait_until(lambda: env.state.runs[second]["state"] == "succeeded", 10, "the second run to run")
        assert env.worker.lingering == 0
        await stop(task)
        exec_targets.GATE.clear()
    run(t())


@pytest.mark.parametrize("way", ["awaited", "soon", "plain"])
def test_an_error_reporting_a_runs_outcome_frees_its_slot_and_lets_its_lease_go(way, monkeypatch):
    """Whatever goes wrong between a run's end and its report (here: keeping its result), the
    run is dropped (its lease expires, and the run goes again) and its slot frees, whether the
    loop awaited the executor or was called back (``soon``, an --app worker's handlers;
    ``execute_soon``, a plain python target): the callback's error once kept the slot taken and
    the lease renewed for ever."""
    from raftsched.worker import loop as loop_module
    from raftsched.worker.executors import function_soon, run_function

    def broken(value):
        raise RuntimeError("a bug keeping the result")
    monkeypatch.setattr(loop_module, "run_result", broken)

    class Soon:
        async def __call__(self, ctx, timeout_s, cancel):
            return await run_function(exec_targets.record_sync, ctx, timeout_s, cancel, name="t")

        def soon(self, ctx, timeout_s, cancel, on_done):
            return function_soon(exec_targets.record_sync, ctx, timeout_s, cancel, on_done, name="t")

    class Awaited:
        async def __call__(self, ctx, timeout_s, cancel):
            return await run_function(exec_targets.record_sync, ctx, timeout_s, cancel, name="t")

    async def t():
        env = Env(f"report-bug-{way}", "exec_targets:record_sync", runs=2, slots=1)
        if way != "plain":
            env.worker.executor_lookup = lambda grant: Soon() if way == "soon" else Awaited()
        ids = await env.setup()
        for rid in ids:
            exec_targets.RECORDED.pop(rid, None)
        task = asyncio.create_task(env.worker.run())
        # Both run in the one slot: the first's failed report freed it.
        await wait_until(lambda: all(r in exec_targets.RECORDED for r in ids), 10, "both runs to start")
        await wait_until(lambda: not env.worker.held and env.worker._executing == 0, 10, "both leases let go")
        await stop(task)
        assert env.states(ids) == {"running": 2}  # not reported: the leases expire, the runs go again
    run(t())


def test_a_stopped_worker_does_not_report_the_runs_it_killed_as_failed():
    """A node stopped gracefully (SIGTERM cancels its worker) killed its runs and reported them
    failed, "lease lost", with their valid tokens: a failed attempt, so a job of the default
    max_attempts 1 went dead (found by the membership test, which stops a node under load),
    where a crash would have had it run again. The kill's outcome is not reported now: the
    leases expire, a lost attempt, as after a crash. A run that succeeded first is reported."""
    async def t():
        env = Env("stopped", "exec_targets:slow_async", runs=2, slots=3)
        ids = await env.setup()
        done = (await env.service.put_job("quick", {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
                                                    "executor": {"type": "python", "target": "exec_targets:record_async"}},
                                          None), await env.service.trigger_job("quick", None))[1]["run"]
        for rid in ids:
            exec_targets.RECORDED.pop(rid, None)
            exec_targets.STARTED[rid] = asyncio.Event()
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: all(any(r["kind"] == "started" for r in exec_targets.RECORDED.get(i, ()))
                                     for i in ids), 5, "both slow runs to start")
        await wait_until(lambda: env.state.runs[done]["state"] == "succeeded", 5, "the quick run to be reported")
        await stop(task)
        assert all(any(r["kind"] == "cancelled" for r in exec_targets.RECORDED[i]) for i in ids), "killed"
        _not_reported_and_leases_left_to_expire(env, ids)
        assert not env.worker.held
    run(t())


def test_a_run_cancelled_by_request_is_stopped_by_its_worker_and_its_slot_freed(caplog):
    """POST /v1/runs/{id}/cancel of a running run (core/cancel.py): the lease ends in the state,
    the worker's next heartbeat is told it lost the run and why, and kills it (saying it was
    cancelled, not that a lease was lost: a walk's on-call went looking for a network fault), its
    slot takes the next run, and the cancelled run stays failed with the reason: its kill's
    outcome is reported, and the state keeps only what the run wrote (its output; before
    2026-12-07 it was not reported, and a cancelled run showed no output), once."""
    caplog.set_level("INFO", logger="raftsched.worker")

    async def t():
        env = Env("cancelled", "exec_targets:slow_async", runs=1, slots=1, lease_ttl_ms=3_000)
        (rid,) = await env.setup()
        exec_targets.RECORDED.pop(rid, None)
        exec_targets.STARTED[rid] = asyncio.Event()
        task = asyncio.create_task(env.worker.run())
        await asyncio.wait_for(exec_targets.STARTED[rid].wait(), 5)
        res = await env.service.cancel_run(rid, None, reason="stuck on a lock")
        assert res["state"] == "failed" and res["was"] == "running" and res["worker"].startswith("node-1"), res
        await wait_until(lambda: any(r["kind"] == "cancelled" for r in exec_targets.RECORDED.get(rid, ())), 5,
                         "the worker to kill the cancelled run")
        await wait_until(lambda: not env.worker.held and env.worker._executing == 0, 5, "its slot to be freed")
        nxt = (await env.service.trigger_job(env.job, None))["run"]
        exec_targets.STARTED[nxt] = asyncio.Event()
        await asyncio.wait_for(exec_targets.STARTED[nxt].wait(), 5)  # the one slot runs the next run
        await stop(task)
        r = env.state.runs[rid]
        assert (r["state"], r["error"]) == ("failed", "cancelled by request: stuck on a lock"), r
        assert len(r["attempts"]) == 1 and r["attempts"][0]["ok"] is False and r["attempts"][0]["killed"] is True
        reports = [row for c in env.raft.ops("complete_many") for row in c["rows"] if row[0] == rid]
        assert len(reports) == 1 and reports[0][2] is False, reports
        assert r["output"] == reports[0][4] and isinstance(r["output"], str), r
        assert env.worker.refused == 0 and env.worker.completed == 0  # (not an outcome of its own)
        # Sent again (a report whose answer was lost), or by another worker: refused, nothing changes.
        before = dict(r)
        for worker in (env.worker.worker_id, "someone-else"):
            res = env.state.apply(commands.complete_many(env.clock.now_ms(), None, worker=worker, results=[
                {"run": rid, "token": r["fencing_token"], "success": True, "error": None, "output": "again"}]))
            assert res["judged"][0]["ok"] is False and res["judged"][0]["error"]["code"] == "conflict", res
        assert env.state.runs[rid] == before
    run(t())
    said = caplog.text
    assert "was ended by the cluster (cancelled by request: stuck on a lock)" in said and "lost (heartbeat" not in said


def test_a_cancelled_shell_runs_output_is_kept(tmp_path):
    """What a killed run wrote is what its operator needs to see where it hung: the state keeps
    the output the killed attempt's worker reports (core/leases.py killed_output). (Another
    worker's report, a wrong token, a second one: tests/test_core_cancel.py.)"""
    async def t():
        env = Env("hung", "unused:unused", runs=0, slots=1, lease_ttl_ms=3_000)
        await env.service.put_job(env.job, {"schedule": {"every_s": 3600}, "history": 100,
                                            "misfire": {"policy": "skip"}, "executor": {
                                                "type": "shell", "argv": ["sh", "-c", "echo waiting on the lock; touch \"$0\"; sleep 30",
                                                                          str(tmp_path / "began")]}},
                                  None)
        rid = (await env.service.trigger_job(env.job, None))["run"]
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: (tmp_path / "began").exists(), 10, "the run to write its line")
        await env.service.cancel_run(rid, None, reason="hung")
        await wait_until(lambda: env.state.runs[rid]["output"] is not None, 10, "the killed run's output to be kept")
        await stop(task)
        r = env.state.runs[rid]
        assert "waiting on the lock" in r["output"] and r["state"] == "failed", r
        assert r["error"] == "cancelled by request: hung", r
    run(t())


def test_a_prefetched_run_of_a_late_start_skip_job_is_given_back_at_its_start_by_not_started_late():
    """A walk: a worker held runs (prefetched) behind long runs that did not end, and started them
    35 s past their start deadline, judged met (a lease counted as a start). A grant of a job with
    late_start skip carries start_by; the worker gives it back then, and the cluster withdraws it."""
    from raftsched.core import deadlines, policy

    class Shifted(SystemClock):
        """The system's clocks, wall time moved by hand (monotonic time goes on: the worker's
        pauses and its watchdog run as ever)."""
        offset_ms = 0

        def now_ms(self) -> int:
            return super().now_ms() + self.offset_ms

        def jump(self, ms: int) -> None:
            self.offset_ms += ms

    async def t():
        clock = Shifted()
        env = Env("long", "exec_targets:slow_async", runs=1, slots=1, clock=clock, lease_ttl_ms=3_000)
        (long_run,) = await env.setup()
        exec_targets.STARTED[long_run] = asyncio.Event()
        late = {"schedule": {"every_s": 60}, "misfire": {"policy": "skip"}, "history": 100,
                "executor": {"type": "python", "target": "exec_targets:record_async"},
                "deadline": {"start_within_s": 5, "late_start": "skip"}}
        await env.service.put_job("late", late, None)
        task = asyncio.create_task(env.worker.run())
        await asyncio.wait_for(exec_targets.STARTED[long_run].wait(), 5)  # its one slot is taken
        env.worker._exec_s, env.worker._acquire_rtt_s = 0.0, 1.0  # runs seen short so far: it prefetches
        job = env.state.jobs["late"]
        slot = job["next"]
        clock.jump(slot - clock.now_ms())
        # the leader's fire of its slot, as the trigger plans it (this replica keeps no due index)
        e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], slot, job["gen"], "late", 0)
        dl = deadlines.fire_items(job["spec"], e, job["anchor"])
        assert env.state.apply_bytes(commands.encode(commands.fire(slot, entries=[e], dl=dl)))["ok"]
        rid = f"late@{slot}"
        await wait_until(lambda: any(h.grant["id"] == rid for h in env.worker._waiting), 5, "the run prefetched")
        assert env.state.runs[rid]["state"] == "running"  # leased, held for a slot
        clock.jump(6_000)  # its start_by passes, the long run goes on
        await wait_until(lambda: env.state.runs[rid]["state"] == "skipped", 5, "the run given back and withdrawn")
        await stop(task)
        r = env.state.runs[rid]
        assert r["reason"] == "late_start" and r["attempts"][-1]["released"] is True, r
        assert rid not in exec_targets.RECORDED, "it never started"
        d = env.state.deadlines.slots[rid]
        assert (d["state"], d["which"], d["cause"]) == ("missed", "start_within_s", "never_started"), d
    run(t())


async def _one_running_one_held(env: Env, rtt_s: float) -> tuple[list[str], asyncio.Task, str]:
    """Two slow runs on a worker of one slot that prefetches (runs seen short so far, a round trip
    of ``rtt_s``): one executing, one held for the slot. Returns the ids, the loop's task and the
    held run's id."""
    ids = await env.setup()
    for rid in ids:
        exec_targets.STARTED[rid] = asyncio.Event()
    task = asyncio.create_task(env.worker.run())
    env.worker._exec_s, env.worker._acquire_rtt_s = 0.0, rtt_s
    await wait_until(lambda: env.worker._executing == 1 and len(env.worker._waiting) == 1, 5,
                     "one run executing, one held for the slot")
    return ids, task, env.worker._waiting[0].grant["id"]


def test_giving_everything_back_says_which_runs_were_never_begun():
    """After a failure the worker gives back its held runs (never begun: ``not_started``, which a
    late_start skip job's withdrawal reads) apart from the running ones it killed (begun)."""
    async def t():
        env = Env("two", "exec_targets:slow_async", runs=2, slots=1)
        ids, task, waiting = await _one_running_one_held(env, 1.0)
        await env.worker._give_back_all("a test's failure")
        await stop(task)
        rel = env.raft.ops("release")
        flags = {lease[0]: c.get("not_started", False) for c in rel for lease in c["leases"]}
        assert flags == {waiting: True, next(i for i in ids if i != waiting): False}, rel
        assert env.state.runs[waiting]["attempts"][-1]["unstarted"] is True
    run(t())


def test_a_run_held_behind_runs_that_turned_long_is_given_back_for_another_worker():
    """A worker prefetched while its runs were short, then its slots filled with runs that did
    not end: the run it held waited behind them (for as long as they ran) while another worker
    sat idle. Past prefetch_wait_s_min it gives the run back unbegun and asks for none while
    its slots hold long runs; another worker starts it."""
    async def t():
        env = Env("turned-long", "exec_targets:slow_async", runs=2, slots=1, lease_ttl_ms=3_000)
        ids, task, held = await _one_running_one_held(env, 0.01)
        long_run = next(i for i in ids if i != held)
        await wait_until(lambda: env.state.runs[held]["state"] == "queued", 10, "the held run given back")
        r = env.state.runs[held]
        assert r["attempt"] == 2 and r["attempts"][-1]["unstarted"] is True, r
        assert env.worker._prefetch() == 0  # its one slot holds a run longer than a round trip
        other = Worker(env.raft, env.clock, "node-2", sandbox=None, slots=1, single_node=True, poll_interval_s=0.01)
        task2 = asyncio.create_task(other.run())
        await asyncio.wait_for(exec_targets.STARTED[held].wait(), 5)
        assert env.state.runs[held]["worker"] == other.worker_id
        assert env.state.runs[long_run]["worker"] == env.worker.worker_id
        await stop(task)
        await stop(task2)
    run(t())


def test_an_acquire_sent_while_idle_is_not_taken_for_a_round_trip():
    """A remote worker's request sent while it had no work waits at the node until work comes (up
    to its wait_s): taken for a round trip, one such answer made the estimate seconds long, and
    with it prefetching for runs of seconds and giving back held runs only after ~80 s."""
    async def t():
        env = Env("idle", "exec_targets:record_async", runs=1, slots=1, delay_s=0.3)
        await env.setup()
        env.worker._idle, env.worker._acquire_rtt_s = True, 0.01  # its last request got nothing
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: env.worker.completed == 1, 10, "the run")
        await stop(task)
        assert env.worker._acquire_rtt_s == 0.01, env.worker._acquire_rtt_s
    run(t())


def _not_reported_and_leases_left_to_expire(env: Env, ids: list[str]) -> None:
    """No outcome of ``ids`` was reported, and each is still running its first attempt: its
    lease expires (a lost attempt), as after a crash."""
    reported = [row[0] if isinstance(row, list) else row["run"] for c in env.raft.ops("complete_many")
                for row in (c.get("rows") or c.get("results") or [])]
    assert not set(ids) & set(reported), "the kills' outcomes are not reported"
    for rid in ids:
        r = env.state.runs[rid]
        assert r["state"] == "running" and r["attempt"] == 1 and not r.get("attempts"), r


class _Looks:
    """Counts the lease watchdog's looks, so a test can wait until it has looked at a clock it
    just moved (a deadline on a condition, not a sleep)."""

    def __init__(self, worker: Worker) -> None:
        self.n = 0
        check = worker._check_heartbeats

        def counted() -> None:
            check()
            self.n += 1

        worker._check_heartbeats = counted

    async def twice_more(self) -> None:
        # Twice: the first look may have read the clock before the test moved it.
        target = self.n + 2
        await wait_until(lambda: self.n >= target, 5, "the watchdog to look twice")


async def _gated_setup(env: Env) -> list[str]:
    ids = await env.setup()
    for rid in ids:
        exec_targets.RECORDED.pop(rid, None)  # run ids are derived: another test may have used them
    return ids


async def _gated_runs(env: Env, ids: list[str]) -> dict:
    """Wait until every run executes (blocked on GATE), and return what the worker holds."""
    await wait_until(lambda: all(r in exec_targets.RECORDED for r in ids), 5, "every run to start")
    assert set(env.worker.held) == set(ids)
    return dict(env.worker.held)


async def _release_gated(task: asyncio.Task, ids: list[str]) -> None:
    await stop(task)
    exec_targets.GATE.set()  # the abandoned threads return
    await wait_until(lambda: all(any(r["kind"] == "finished" for r in exec_targets.RECORDED[i]) for i in ids),
                     5, "the gated threads to return")
    exec_targets.GATE.clear()


@pytest.mark.parametrize("failure", ["unavailable", "hang"])
def test_no_heartbeat_succeeding_for_a_whole_ttl_kills_every_run_the_worker_holds(failure):
    """docs/design.md, Leases: "A watchdog ... kills each run whose lease was not renewed for a
    whole TTL by the worker's monotonic clock, counted per lease from when the last successful
    heartbeat that named it was sent (or from its grant ...)" (docs/fencing.md). Heartbeats
    are refused at once, or hang until their timeout; the clock is moved by hand."""
    async def t():
        exec_targets.GATE.clear()
        clock = FakeClock()
        env = Env(f"watched-{failure}", "exec_targets:gate", runs=3, slots=3, clock=clock, lease_ttl_ms=1000)
        ids = await _gated_setup(env)
        env.raft.failing["heartbeat"] = failure
        task = asyncio.create_task(env.worker.run())
        looks = _Looks(env.worker)
        held = await _gated_runs(env, ids)
        clock.advance(999)  # a TTL since the acquire, less a millisecond
        await looks.twice_more()
        assert not any(h.cancel.is_set() for h in held.values())
        clock.advance(2)
        await wait_until(lambda: all(h.cancel.is_set() for h in held.values()), 5, "every run killed")
        assert env.raft.ops("heartbeat") == []  # none got through: the kill is the watchdog's
        await _release_gated(task, ids)
    run(t())


def test_the_watchdog_kills_an_apps_thread_handlers_and_the_worker_goes_on(tmp_path, monkeypatch):
    """An ``--app`` worker's plain handler runs in a thread, started by callbacks: killing it
    (its cancel event) ends its run at once, on the loop, and the run's lease is forgotten then,
    inside the watchdog's look over the leases held. That look raised "dictionary changed size
    during iteration", and the worker stopped (exit 1), after any pause longer than a lease TTL
    (a SIGSTOP, a frozen VM, every node down for a TTL: found by an SDK walk). Now every run is
    killed and the worker goes on leasing."""
    import sdk_worker_app
    from raftsched.sdk.worker import AppExecutors
    monkeypatch.setenv("SDK_WORKER_TEST_DIR", str(tmp_path))

    async def t():
        clock = FakeClock()
        lookup = AppExecutors(sdk_worker_app.app, "sdk_worker_app:app")
        env = Env("watched-app", "sdk_worker_app:stuck", runs=3, slots=3, clock=clock, lease_ttl_ms=1000)
        env.worker.executor_lookup = lookup  # (what ``raftsched worker --app`` gives its lease loop)
        ids = await env.setup()
        env.raft.failing["heartbeat"] = "unavailable"
        task = asyncio.create_task(env.worker.run())
        looks = _Looks(env.worker)
        await wait_until(lambda: set(env.worker.held) == set(ids) and all(
            os.path.exists(sdk_worker_app.path_of(r, "started")) for r in ids), 10, "every handler to start")
        held = dict(env.worker.held)
        clock.advance(1001)
        await wait_until(lambda: all(h.cancel.is_set() for h in held.values()), 5, "every run killed")
        await looks.twice_more()
        assert not task.done(), task.exception() if task.done() else None
        assert not env.worker.held  # forgotten: the leases expire, lost attempts
        for r in ids:
            open(sdk_worker_app.path_of(r, "release"), "w").close()  # the abandoned threads return
        await stop(task)
    run(t())


def test_runs_the_watchdog_killed_are_not_reported_failed_when_the_cluster_answers_again():
    """The cluster loses its quorum for longer than a lease TTL: no heartbeat succeeds, and the
    watchdog kills the runs (their leases may be expired and handed on meanwhile). Their kill's
    "lease lost" was reported once the cluster answered again, with the runs' valid tokens (no
    leader had expired them): a failed attempt, so a job of the default max_attempts 1 went to
    the dead-letter queue (found by a fail-over walk: two of three nodes killed for 16 s),
    where docs/operations.md says such runs run again when a leader is back. Not reported now:
    the leases expire, a lost attempt, and the runs go again."""
    async def t():
        clock = FakeClock()
        env = Env("watchdog-killed", "exec_targets:slow_async", runs=2, slots=2, clock=clock, lease_ttl_ms=1000)
        ids = await env.setup()
        for rid in ids:
            exec_targets.RECORDED.pop(rid, None)
            exec_targets.STARTED[rid] = asyncio.Event()
        env.raft.failing["heartbeat"] = "unavailable"
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: all(any(r["kind"] == "started" for r in exec_targets.RECORDED.get(i, ()))
                                     for i in ids), 5, "both runs to start")
        clock.advance(1001)  # a whole TTL without a heartbeat
        await wait_until(lambda: all(any(r["kind"] == "cancelled" for r in exec_targets.RECORDED[i]) for i in ids),
                         5, "the watchdog to kill both runs")
        del env.raft.failing["heartbeat"]  # the cluster answers again
        await wait_until(lambda: not env.worker.held, 5, "the killed runs to be let go")
        await stop(task)
        _not_reported_and_leases_left_to_expire(env, ids)
    run(t())


def test_a_heartbeat_that_succeeds_within_the_ttl_keeps_the_runs_and_restarts_the_count():
    """The same sentence, from the other side: the TTL is counted from the last successful
    heartbeat, so a success before the TTL keeps every run, and only a whole TTL after it
    without another kills them."""
    async def t():
        exec_targets.GATE.clear()
        clock = FakeClock()
        env = Env("kept", "exec_targets:gate", runs=2, slots=2, clock=clock, lease_ttl_ms=1000)
        ids = await _gated_setup(env)
        env.raft.failing["heartbeat"] = "unavailable"
        task = asyncio.create_task(env.worker.run())
        looks = _Looks(env.worker)
        held = await _gated_runs(env, ids)
        clock.advance(600)
        del env.raft.failing["heartbeat"]
        await wait_until(lambda: env.raft.ops("heartbeat"), 5, "a heartbeat to succeed")
        env.raft.failing["heartbeat"] = "unavailable"
        clock.advance(600)  # 1.2 TTL since the acquire, 0.6 since the heartbeat
        await looks.twice_more()
        assert not any(h.cancel.is_set() for h in held.values())
        assert set(env.worker.held) == set(ids)
        clock.advance(401)  # a whole TTL since the heartbeat
        await wait_until(lambda: all(h.cancel.is_set() for h in held.values()), 5, "every run killed")
        await _release_gated(task, ids)
    run(t())


@pytest.mark.parametrize("task_name", ["lease watchdog", "heartbeat loop"])
def test_a_failed_watchdog_or_heartbeat_loop_stops_the_worker_loudly_and_gives_its_runs_back(task_name, caplog):
    """The lease loop, the heartbeat loop and the lease watchdog run in one task group: when the
    watchdog or the heartbeat loop raises, the worker does not lease on unsupervised. run()
    raises WorkerFailed after a logged error, and every run it held, running or granted ahead
    of a slot, is given back with ``release`` (queued again, no attempt spent)."""
    async def t():
        exec_targets.GATE.clear()
        env = Env(f"supervised-{task_name.split()[0]}", "exec_targets:gate", runs=2, slots=1, lease_ttl_ms=1500)
        ids = await _gated_setup(env)
        # As if short runs and a slow log had been measured: one run executes, one waits for the slot.
        env.worker._exec_s, env.worker._acquire_rtt_s = 0.001, 1.0
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: len(env.worker.held) == 2 and len(env.worker._waiting) == 1, 5,
                         "a run executing and one granted ahead of the slot")
        await wait_until(lambda: any(r in exec_targets.RECORDED for r in ids), 5, "the first run to start")

        def broken(*args, **kwargs):
            raise RuntimeError(f"a bug in the {task_name}")
        if task_name == "lease watchdog":
            env.worker._check_heartbeats = broken
        else:
            env.worker.channel.heartbeat = broken  # not a RaftschedError: the loop itself fails
        with pytest.raises(WorkerFailed) as failed:
            await asyncio.wait_for(task, 10)
        assert failed.value.task == task_name and f"a bug in the {task_name}" in str(failed.value)
        assert isinstance(failed.value.__cause__, RuntimeError)
        assert any(r.levelname == "ERROR" and r.name == "raftsched.worker" and task_name in r.getMessage()
                   for r in caplog.records)
        assert not env.worker.held and env.worker.released == 2
        released = [lease[0] for c in env.raft.ops("release") for lease in c["leases"]]
        assert sorted(released) == sorted(ids)
        for rid in ids:
            r = env.state.runs[rid]
            assert r["state"] == "queued" and r.get("failures", 0) == 0, r
            assert r["attempts"][-1]["released"] is True and task_name in r["attempts"][-1]["error"]
        await _release_gated(task, [r for r in ids if r in exec_targets.RECORDED])
    run(t())


class _SlotLooks:
    """Counts the looks a worker takes at its clock for a run's slot (``_early_ms``), so a test
    can wait until a waiting run has seen a clock it just moved."""

    def __init__(self, worker: Worker) -> None:
        self.n = 0
        early = worker._early_ms

        def counted(g):
            self.n += 1
            return early(g)

        worker._early_ms = counted

    async def twice_more(self) -> None:
        target = self.n + 2
        await wait_until(lambda: self.n >= target, 5, "the waiting run to look at the clock twice")


async def _granted_early(env: Env, ahead_ms: int) -> str:
    """A manual run triggered through a node whose clock is ``ahead_ms`` fast: state time moves
    ahead of the worker's clock, and the run's slot with it. Another run, due by the worker's
    clock, makes the worker ask (it asks only when its clock shows ready work); state time
    grants it both."""
    spec = {"schedule": {"every_s": 3600}, "executor": {"type": "python", "target": env.target},
            "history": 1000, "misfire": {"policy": "skip"}}
    await env.service.put_job(env.job, spec, None)
    await env.service.put_job(env.job + "-now", spec, None)
    await env.service.trigger_job(env.job + "-now", None)
    fast = Service(env.raft, FakeClock(env.clock.now_ms() + ahead_ms), "node-2")
    rid = (await fast.trigger_job(env.job, None))["run"]
    exec_targets.RECORDED.pop(rid, None)
    return rid


def test_a_run_granted_before_its_slot_waits_for_the_slot_by_the_workers_clock():
    """docs/design.md I27: a worker starts no run before its slot by its clock (a node's and a
    remote worker's is the cluster's), whatever state time says. A command from a node 3 s fast
    moved state time ahead, so the run is granted at once; it starts when the clock reaches its
    slot, holding a slot and its lease meanwhile."""
    async def t():
        clock = FakeClock()
        env = Env("early", "exec_targets:record_sync", runs=0, slots=3, clock=clock)
        rid = await _granted_early(env, 3000)
        slot = env.state.runs[rid]["slot"]
        assert slot == clock.now_ms() + 3000
        looks = _SlotLooks(env.worker)
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: rid in env.worker.held and env.worker.waited_for_slot == 1, 5, "the run granted")
        await wait_until(lambda: env.worker.completed == 1, 5, "the other run, due, to run at once")
        assert env.worker._executing == 1  # the early one holds a slot meanwhile
        clock.advance(2999)
        await looks.twice_more()
        assert rid not in exec_targets.RECORDED, "started before its slot"
        clock.advance(1)
        await wait_until(lambda: env.worker.completed == 2, 5, "the run to run at its slot")
        assert env.state.runs[rid]["state"] == "succeeded" and len(exec_targets.RECORDED[rid]) == 1
        await stop(task)
    run(t())


def _late_answers(env: Env, late_ms: int, expire: bool) -> list[str]:
    """Every acquire's answer reaches the worker ``late_ms`` after it applied (a pause of the
    worker, a node catching up); with ``expire``, the leader's reaper expires its leases meanwhile
    (their runs are queued again, attempt + 1). Returns the runs so granted."""
    granted: list[str] = []

    def on_acquire(cmd, res):
        runs = res.get("runs") or []
        if not runs:
            return
        granted.extend(g["id"] for g in runs)
        env.clock.advance(late_ms)
        if expire:
            items = [[g["id"], g["token"], env.state.runs[g["id"]]["renewals"]] for g in runs]
            assert env.state.apply(commands.expire(env.clock.now_ms(), runs=items, locks=[]))["expired"]
        env.raft.on_applied.pop("acquire")  # the next acquires answer in time
    env.raft.on_applied["acquire"] = on_acquire
    return granted


def test_a_grant_that_arrives_after_its_lease_expired_is_not_started():
    """A grant whose answer arrived with less than half its lease left is heartbeated before it
    starts; its lease is gone (expired on the way, its run queued again with attempt 2), so
    attempt 1 never starts (its writes would only be refused by the fencing token), and
    attempt 2 runs, once."""
    async def t():
        clock = FakeClock()
        env = Env("late-gone", "exec_targets:record_sync", runs=1, slots=2, clock=clock)
        (rid,) = await env.setup()
        granted = _late_answers(env, env.worker.lease_ttl_ms + 1000, expire=True)
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: env.worker.completed == 1, 10, "the run's second attempt to complete")
        run_ = env.state.runs[rid]
        assert run_["state"] == "succeeded" and run_["attempt"] == 2
        assert [a["attempt"] for a in exec_targets.RECORDED[rid]] == [2], "attempt 1 started though its lease was gone"
        assert granted[0] == rid and env.worker.late_grants == 1 and env.worker.late_grants_gone == 1
        beat = env.raft.ops("heartbeat")[0]
        assert [rid, run_["attempts"][0]["token"]] in beat["leases"]
        await stop(task)
    run(t())


def test_a_late_grant_whose_lease_holds_is_renewed_and_started():
    """A grant that arrived late but whose lease is still held: the heartbeat renews it, and the
    run starts (once, attempt 1) only after that heartbeat applied."""
    async def t():
        clock = FakeClock()
        env = Env("late-held", "exec_targets:record_sync", runs=1, slots=2, clock=clock)
        (rid,) = await env.setup()
        _late_answers(env, int(env.worker.lease_ttl_ms * 0.6), expire=False)
        await _runs_once_after_a_heartbeat(env, rid)
    run(t())


async def _runs_once_after_a_heartbeat(env: Env, rid: str) -> None:
    """Run the worker until ``rid``'s one late grant ran: confirmed by a heartbeat between its
    acquire and its outcome, attempt 1, once."""
    task = asyncio.create_task(env.worker.run())
    await wait_until(lambda: env.worker.completed == 1, 10, "the run to complete")
    assert env.worker.late_grants == 1 and env.worker.late_grants_gone == 0
    run_ = env.state.runs[rid]
    assert run_["state"] == "succeeded" and run_["attempt"] == 1
    assert [a["attempt"] for a in exec_targets.RECORDED[rid]] == [1]
    order = [c["op"] for g in env.raft.groups for c in g if c["op"] in ("acquire", "heartbeat", "complete_many")]
    assert order[:3] == ["acquire", "heartbeat", "complete_many"], order
    await stop(task)


def test_a_drain_while_late_grants_are_confirmed_gives_them_back():
    """A drain cancels the acquire whose late grants a heartbeat is confirming: the grants are
    the worker's already, so they are given back (queued again, no attempt spent), not dropped
    to wait out their TTL."""
    async def t():
        clock = FakeClock()
        env = Env("late-drain", "exec_targets:record_sync", runs=1, slots=2, clock=clock, lease_ttl_ms=1000)
        (rid,) = await env.setup()
        _late_answers(env, 600, expire=False)
        env.raft.failing["heartbeat"] = "hang"
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: env.worker.late_grants == 1, 5, "the late grant's heartbeat to be sent")
        await env.worker.drain(1.0)
        assert env.state.runs[rid]["state"] == "queued" and env.raft.ops("release"), env.state.runs[rid]["state"]
        assert rid not in exec_targets.RECORDED and not env.worker.held
        await stop(task)
    run(t())


def test_a_run_granted_again_to_its_worker_is_confirmed_by_its_new_token_only():
    """Attempt 1 runs on; the leader expired its lease (the worker looked gone) and granted
    attempt 2 to the same worker, whose answer arrives late. The confirming heartbeat names the
    run with its new token only (the state reports lost leases by run id): attempt 2 starts,
    attempt 1 is killed, and its outcome would be refused."""
    async def t():
        exec_targets.GATE.clear()
        clock = FakeClock()
        env = Env("again", "exec_targets:gate", runs=1, slots=2, clock=clock)
        (rid,) = await env.setup()
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: rid in exec_targets.RECORDED, 5, "attempt 1 to start")
        first = env.worker.held[rid]
        _late_answers(env, int(env.worker.lease_ttl_ms * 0.6), expire=False)
        r = env.state.runs[rid]
        assert env.state.apply(commands.expire(clock.now_ms(), runs=[[rid, r["fencing_token"], r["renewals"]]],
                                               locks=[]))["expired"]
        await wait_until(lambda: [a["attempt"] for a in exec_targets.RECORDED[rid]] == [1, 2], 5, "attempt 2 to start")
        assert first.cancel.is_set() and env.worker.late_grants == 1 and env.worker.late_grants_gone == 0
        exec_targets.GATE.set()
        await wait_until(lambda: env.state.runs[rid]["state"] == "succeeded", 5, "attempt 2 to succeed")
        assert env.state.runs[rid]["attempt"] == 2
        await stop(task)
    run(t())


def test_a_grant_whose_answer_was_long_on_the_way_is_heartbeated_first():
    """A remote worker's clock is anchored on the answers it hears, so an answer held up in the
    network sets it back as much, and the grant's deadline looks far: the answer's time on the
    way (``Grants.transit_ms``, the round trip less the node's ``held_ms``) says it was late."""
    async def t():
        clock = FakeClock()
        env = Env("late-transit", "exec_targets:record_sync", runs=1, slots=2, clock=clock)
        (rid,) = await env.setup()
        acquire = env.worker.channel.acquire

        async def on_the_way(*a, **kw):
            res = await acquire(*a, **kw)
            if res.runs:
                res.transit_ms = env.worker.lease_ttl_ms * 0.6
            return res
        env.worker.channel.acquire = on_the_way
        await _runs_once_after_a_heartbeat(env, rid)
    run(t())


def test_a_grant_in_time_is_started_without_a_heartbeat_first():
    async def t():
        clock = FakeClock()
        env = Env("in-time", "exec_targets:record_sync", runs=1, slots=2, clock=clock)
        (rid,) = await env.setup()
        _late_answers(env, int(env.worker.lease_ttl_ms * 0.4), expire=False)
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: env.worker.completed == 1, 10, "the run to complete")
        assert env.worker.late_grants == 0 and not env.raft.ops("heartbeat")
        await stop(task)
    run(t())


def test_a_run_given_up_while_it_waits_for_its_slot_never_starts_and_is_given_back():
    async def t():
        clock = FakeClock()
        env = Env("early-lost", "exec_targets:record_sync", runs=0, slots=2, clock=clock)
        rid = await _granted_early(env, 60_000)
        task = asyncio.create_task(env.worker.run())
        await wait_until(lambda: rid in env.worker.held and env.worker.waited_for_slot == 1, 5, "the run granted")
        env.worker.held[rid].cancel.set()  # as if its lease were lost, or the worker stopping
        await wait_until(lambda: env.raft.ops("release"), 5, "the lease given back")
        await wait_until(lambda: rid not in env.worker.held and env.worker._executing == 0, 5, "the slots freed")
        assert rid not in exec_targets.RECORDED
        assert env.state.runs[rid]["state"] == "queued"  # queued again, no attempt spent
        await stop(task)
    run(t())
