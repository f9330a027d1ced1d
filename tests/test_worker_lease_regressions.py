"""A worker's leases, each judged by its own attempt (worker/loop.py): found by a review, each
with a channel that answers as a node would at the wrong moment. The worker runs python targets
in its own process (no sandbox); waits are on conditions with deadlines."""
from __future__ import annotations

import asyncio
import sys
import types

from raftsched.clock import SystemClock
from raftsched.core.errors import Unavailable
from raftsched.worker.loop import Grants, LeaseLoop

from executor_helpers import run, wait_until

TTL_MS = 1000

# The targets: a module of their own, importable by name (the python executor's "module:function").
targets = types.ModuleType("lease_regression_targets")
targets.RUNNING = {}  # type: ignore[attr-defined]
targets.STARTS = []  # type: ignore[attr-defined]
targets.KILLED = []  # type: ignore[attr-defined]


async def _long(ctx):
    targets.STARTS.append((ctx.run_id, ctx.fencing_token))
    targets.RUNNING[ctx.run_id] = targets.RUNNING.get(ctx.run_id, 0) + 1
    try:
        await asyncio.sleep(60)  # ok-sleep: a run that waits to be killed
    except asyncio.CancelledError:
        targets.KILLED.append((ctx.run_id, ctx.fencing_token))
        raise
    finally:
        targets.RUNNING[ctx.run_id] -= 1


def _quick(ctx):
    return 1


targets.long = _long  # type: ignore[attr-defined]
targets.quick = _quick  # type: ignore[attr-defined]
sys.modules[targets.__name__] = targets


def _reset() -> None:
    targets.RUNNING.clear()
    targets.STARTS.clear()
    targets.KILLED.clear()


def _grant(clock, rid: str, fn: str, token: int = 7, attempt: int = 1) -> dict:
    return {"id": rid, "job": "j", "slot": clock.now_ms() - 10, "attempt": attempt, "token": token,
            "executor": {"type": "python", "target": f"{targets.__name__}:{fn}"}, "timeout_s": 60,
            "deadline": clock.now_ms() + TTL_MS}


class _Channel:
    """A node that answers each acquire from ``answers`` (then nothing), and heartbeats with
    ``heartbeat``."""
    kind = "remote"
    worker_id = "w1"

    def __init__(self, clock, answers, heartbeat=None, first_complete_s: float = 0.0) -> None:
        self.clock, self.answers, self.hb = clock, list(answers), []
        self._heartbeat = heartbeat
        self.first_complete_s = first_complete_s
        self.completes: list[dict] = []
        self.acquires = 0

    async def hello(self) -> None:
        pass

    def registered(self) -> bool:
        return True

    def may_acquire(self) -> bool:
        return True

    def executes(self) -> bool:
        return True

    async def acquire(self, n, ttl_ms, types):
        self.acquires += 1
        if not self.answers:
            await asyncio.sleep(0.05)  # ok-sleep: an idle long-poll, briefly
            return Grants([], False, 0.0, 1.0)
        delay, grants = self.answers.pop(0)
        if delay:
            await asyncio.sleep(delay)  # ok-sleep: the node holds the request this long
        return Grants(grants(self.clock), False, 0.0, 1.0)

    def heartbeat_interval_s(self, own_s, longest_s):
        return own_s

    async def heartbeat(self, leases, ttl_ms, timeout_s):
        self.hb.append([list(x) for x in leases])
        if self._heartbeat is None:
            return [], False
        return await self._heartbeat(self, leases)

    async def complete(self, items):
        first = not self.completes
        self.completes.extend(items)
        if first and self.first_complete_s:
            await asyncio.sleep(self.first_complete_s)  # ok-sleep: the first report is slow to answer
        return [{"ok": True, "run": it["run"]} for it in items]

    async def release(self, leases, reason) -> None:
        pass

    async def close(self) -> None:
        pass


def _loop(ch) -> LeaseLoop:
    return LeaseLoop(ch, ch.clock, sandbox=None, slots=3, allowed_types={"python"}, lease_ttl_ms=TTL_MS,
                     poll_interval_s=0.05)


async def _failing(_ch, _leases):
    raise Unavailable("heartbeat: node unavailable")


def test_fresh_grants_do_not_renew_the_lease_of_a_run_no_heartbeat_renewed():
    """Every heartbeat fails, while lease requests keep granting other runs: each grant renews
    its own lease only. The run whose lease nothing renewed is killed a TTL after its grant
    (before: any grant reset the watchdog of every lease, and it ran on after the leader had
    expired its lease and handed it on)."""
    async def t():
        _reset()
        clock = SystemClock()
        answers = [(0, lambda c: [_grant(c, "A", "long")])]
        answers += [(0.2, lambda c, k=k: [_grant(c, f"B{k}", "quick")]) for k in range(30)]
        ch = _Channel(clock, answers, _failing)
        loop = _loop(ch)
        task = asyncio.create_task(loop.run())
        try:
            # (within the grants: they come for 6 s, and a whole TTL of them left A running before)
            await wait_until(lambda: ("A", 7) in targets.KILLED, 4, "run A killed by the watchdog")
            assert ch.acquires >= 3, "grants kept coming meanwhile"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    run(t(), 30)


def test_a_run_granted_again_to_its_worker_runs_once_and_its_earlier_attempt_is_killed():
    """Heartbeats fail, the leader expires run A's lease and grants A again (attempt 2) to the
    same worker, in an answer in time: the earlier attempt is killed, and a stop finds nothing
    left running (before: both ran at once, and the earlier one outlived the worker)."""
    async def t():
        _reset()
        clock = SystemClock()
        answers = [(0, lambda c: [_grant(c, "A", "long")]),
                   (0.2, lambda c: [_grant(c, "A", "long", token=9, attempt=2)])]
        ch = _Channel(clock, answers, _failing)
        loop = _loop(ch)
        task = asyncio.create_task(loop.run())
        try:
            await wait_until(lambda: ("A", 9) in targets.STARTS, 10, "attempt 2 to start")
            await wait_until(lambda: ("A", 7) in targets.KILLED, 10, "attempt 1 to be killed")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await wait_until(lambda: targets.RUNNING.get("A") == 0, 10, "nothing of A left running")
    run(t(), 30)


def test_a_lost_lease_answer_for_an_earlier_attempt_leaves_the_new_attempt_alone():
    """A heartbeat for [A, 7] is on its way when the worker is granted A again (token 9); its
    answer says A is lost. That names the attempt it was sent for: attempt 2 runs on, renewed
    by the next heartbeats (before: it was killed and reported failed with its valid token,
    spending an attempt)."""
    async def slow_first(ch, leases):
        if len(ch.hb) == 1:
            await asyncio.sleep(0.4)  # ok-sleep: the answer is held up while A is granted again
            return (["A"] if ["A", 7] in [list(x) for x in leases] else []), False
        return [], False

    async def t():
        _reset()
        clock = SystemClock()
        answers = [(0, lambda c: [_grant(c, "A", "quick")]),
                   (0.35, lambda c: [_grant(c, "A", "long", token=9, attempt=2)])]
        ch = _Channel(clock, answers, slow_first, first_complete_s=1.0)
        loop = _loop(ch)
        task = asyncio.create_task(loop.run())
        try:
            await wait_until(lambda: len(ch.hb) >= 3 and ["A", 9] in ch.hb[-1], 10, "attempt 2 heartbeated")
            assert targets.RUNNING.get("A") == 1 and ("A", 9) not in targets.KILLED
            assert not [it for it in ch.completes if it["token"] == 9], ch.completes
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    run(t(), 30)


def test_an_outcome_no_command_can_carry_is_reported_as_a_failure_and_never_dropped():
    """An outcome whose error or output cannot be encoded (a lone surrogate from a handler of
    the worker's own) is reported with them made text; one that still cannot is reported as a
    failure of its own. None is dropped: a dropped outcome's lease, renewed while it is being
    reported, would never end."""
    from raftsched.worker.loop import _Held

    async def t():
        clock = SystemClock()
        ch = _Channel(clock, [])
        loop = _loop(ch)
        for rid, item in (("r1", {"output": "ok \udc80", "error": None}),
                          ("r2", {"output": "", "error": None, "result": {"n": 2**70}, "odd": {1, 2}})):
            g = _grant(clock, rid, "quick")
            h = _Held(g)
            loop.held[rid] = h
            loop._outbox.append(({"run": rid, "token": g["token"], "success": True, **item}, h))
        loop._flush()
        await asyncio.gather(*loop._reporting)
        by_run = {it["run"]: it for it in ch.completes}
        assert by_run["r1"]["success"] and by_run["r1"]["output"] == "ok ?", by_run
        assert not by_run["r2"]["success"] and "could not be encoded" in by_run["r2"]["error"], by_run
        assert loop.held == {}
    run(t(), 30)


class _Unreachable(_Channel):
    """Lease requests fail while ``down`` (with ``error``: every node tried until the request's
    deadline, by default)."""

    def __init__(self, clock) -> None:
        super().__init__(clock, [])
        self.down = True
        self.error: Exception = Unavailable("no node reachable within 18 s (127.0.0.1:9701, 127.0.0.1:9702)")

    async def acquire(self, n, ttl_ms, types):
        self.acquires += 1
        if self.down:
            await asyncio.sleep(0.01)  # ok-sleep: the client's tries, briefly
            raise self.error
        return await super().acquire(n, ttl_ms, types)


def test_a_worker_whose_lease_requests_go_unanswered_says_so_once_it_lasts_then_now_and_then(caplog, monkeypatch):
    """A worker pointed only at nodes that are gone logged nothing (its failed acquires were
    debug lines) and looked idle. Once no request has been answered for unanswered_warn_after_s
    it says so, naming why, again every unanswered_log_every_s while it lasts (not at every
    retry), and once when answered again. A refusal is an answer: never said."""
    from raftsched.core.errors import Conflict
    from raftsched.worker import limits as worker_limits
    monkeypatch.setattr(worker_limits, "unanswered_warn_after_s", 0.3)
    monkeypatch.setattr(worker_limits, "unanswered_log_every_s", 0.6)

    def said(part: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and part in r.getMessage()]

    async def t():
        ch = _Unreachable(SystemClock())
        ch.error = Conflict("refused by the node")
        loop = _loop(ch)
        task = asyncio.create_task(loop.run())
        try:
            await wait_until(lambda: ch.acquires >= 15, 10, "refused lease requests")
            assert said("no lease request answered") == [], "a refusal said as no answer"
            ch.error = Unavailable("no node reachable within 18 s (127.0.0.1:9701, 127.0.0.1:9702)")
            k = ch.acquires
            await wait_until(lambda: said("no lease request answered"), 5, "the first warning")
            assert ch.acquires >= k + 3, "said before it lasted"
            assert "no node reachable" in said("no lease request answered")[0]
            await wait_until(lambda: len(said("no lease request answered")) >= 2, 5, "the warning again")
            tried, warned = ch.acquires - k, len(said("no lease request answered"))
            assert tried >= warned + 4, f"said at every retry ({tried} requests, {warned} warnings)"
            ch.down = False
            await wait_until(lambda: said("answered again"), 5, "the recovery said")
            n, k = len(said("no lease request answered")), ch.acquires
            await wait_until(lambda: ch.acquires >= k + 3, 5, "more (answered) lease requests")
            assert len(said("no lease request answered")) == n and len(said("answered again")) == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    with caplog.at_level("DEBUG", logger="raftsched"):
        run(t(), 30)


def test_a_worker_whose_url_cannot_work_with_the_nodes_tls_says_so_at_once(caplog, monkeypatch):
    """An operator's walk: `raftsched worker --url http://...` for a node serving TLS said
    nothing for 10 s, then "no lease request answered ... still asking", though docs/security.md
    says such a URL fails at once: no outage will end it. A TLS failure (the client's
    TlsFailedError: the node expects TLS, a certificate that does not verify) is said at once,
    naming the fix, and again only every unanswered_log_every_s."""
    from raftsched.worker import limits as worker_limits
    monkeypatch.setattr(worker_limits, "unanswered_warn_after_s", 60.0)
    monkeypatch.setattr(worker_limits, "unanswered_log_every_s", 60.0)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "--ca-file" in r.getMessage()]

    async def t():
        ch = _Unreachable(SystemClock())
        ch.error = Unavailable("http://127.0.0.1:9701: the node expects TLS: use https://127.0.0.1:9701 (and a CA "
                               "file)", tls_failed=True)
        loop = _loop(ch)
        task = asyncio.create_task(loop.run())
        try:
            await wait_until(said, 5, "the TLS failure said")
            assert "the node expects TLS: use https://" in said()[0], said()
            k = ch.acquires
            await wait_until(lambda: ch.acquires >= k + 5, 10, "more lease requests")
            assert len(said()) == 1, "said once, not at every retry"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    with caplog.at_level("DEBUG", logger="raftsched"):
        run(t(), 30)
