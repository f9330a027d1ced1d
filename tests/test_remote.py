"""The remote worker, in process (worker/remote.py): its channel's failover between nodes, the
lease loop's drain (worker/loop.py, shared by both kinds of worker), and a whole
``run_worker`` against a node's app. Every wait has a deadline."""
from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import exec_targets
from raftsched.clock import ClusterClock, SystemClock
from raftsched.core.errors import Indeterminate, RaftschedError, Unavailable
from raftsched.core.state import SchedulerState
from raftsched.worker import limits as worker_limits
from raftsched.node.api import make_app
from raftsched.node.fleet import Fleet
from raftsched.worker.remote import RemoteChannel, WorkerConfig, default_worker_id, run_worker
from raftsched.node.service import Service
from raftsched.worker.loop import EmbeddedChannel, LeaseLoop
from raftsched.testing.fakes import FakeRaft
from raftsched.testing.procs import free_ports

TOKEN = "t" * 32


def run(coro, timeout_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def until(cond, timeout_s=5.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop


class Node:
    """A stand-in node: answers each worker-protocol request with the next of its ``answers``
    (a status and a body, or "hang"), recording the requests."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, dict, dict]] = []
        self.server: TestServer | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.raw_path, dict(request.headers), await request.json()))
        ans = self.answers.pop(0) if self.answers else (200, {})
        if ans == "hang":
            await asyncio.sleep(30)  # ok-sleep: a node that never answers (the client times out)
        if ans[0] == "slow":  # ("slow", seconds, answer): an answer that takes that long to come
            await asyncio.sleep(ans[1])  # ok-sleep: the delay is what is measured
            ans = ans[2]
        status, body = ans
        return web.json_response(body, status=status)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/workers/{id}/{what}", self.handle)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}"

    async def close(self) -> None:
        await self.server.close()


def test_a_worker_fails_over_on_connection_errors_503_and_timeouts():
    async def t():
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        hang, busy, good = Node(["hang"]), Node([]), Node([(200, {"extended": 1, "lost": [], "draining": False})] * 3)
        busy.answers = [(503, {"error": {"code": "unavailable", "message": "no leader", "field": None}})]
        urls = [dead, await hang.start(), await busy.start(), await good.start()]
        ch = RemoteChannel(WorkerConfig(urls=urls, token=TOKEN, worker_id="w/1"), SystemClock())
        ch.client._preferred = ch.urls.index(dead)  # start at the dead node, whatever the id's spread
        try:
            lost, draining = await ch.heartbeat([["r", 1]], 10_000, timeout_s=3.0)
            assert (lost, draining) == ([], False)
            # dead refused, hang timed out, busy said 503, good answered.
            assert [r[0] for r in hang.requests + busy.requests + good.requests] == ["/v1/workers/w%2F1/heartbeat"] * 3
            assert good.requests[0][1]["Authorization"] == f"Bearer {TOKEN}"
        finally:
            await ch.close()
            for n in (hang, busy, good):
                await n.close()
    run(t())


def test_a_completion_is_retried_with_the_same_idempotency_key_until_a_node_answers():
    async def t():
        a = Node([(504, {"error": {"code": "indeterminate", "message": "timed out", "field": None}})])
        b = Node([(200, {"results": [{"ok": True, "run": "r"}]})])
        a_url = await a.start()
        ch = RemoteChannel(WorkerConfig(urls=[a_url, await b.start()], token=TOKEN, worker_id="w1"),
                           SystemClock())
        ch.client._preferred = ch.urls.index(sorted(ch.urls, key=lambda u: u != a_url)[0])
        try:
            res = await ch.complete([{"run": "r", "token": 3, "success": True, "error": None, "output": None}])
            assert res == [{"ok": True, "run": "r"}]
            keys = {r[1]["Idempotency-Key"] for r in a.requests + b.requests}
            assert len(keys) == 1 and len(a.requests) == len(b.requests) == 1
        finally:
            await ch.close()
            await a.close()
            await b.close()
    run(t())


def test_when_no_node_answers_the_call_gives_up_at_its_deadline():
    async def t():
        urls = [f"http://127.0.0.1:{p}" for p in free_ports(2)]
        ch = RemoteChannel(WorkerConfig(urls=urls, token=TOKEN, worker_id="w1"), SystemClock())
        t0 = time.monotonic()
        try:
            await ch.heartbeat([["r", 1]], 10_000, timeout_s=1.0)
            raise AssertionError("no node answers: the heartbeat must fail")
        except (Unavailable, Indeterminate):  # refused, or (on a loaded machine) timed out
            pass
        finally:
            await ch.close()
        assert 0.9 <= time.monotonic() - t0 < 6
    run(t())


def test_a_lease_request_refused_for_good_pauses_the_worker_instead_of_spinning():
    async def t():
        n = Node([(401, {"error": {"code": "unauthorized", "message": "wrong token", "field": None}})])
        ch = RemoteChannel(WorkerConfig(urls=[await n.start()], token="wrong" * 8, worker_id="w1"), SystemClock())
        try:
            g = await ch.acquire(4, 10_000, None)
            assert (g.runs, g.retry_after_s) == ([], worker_limits.lease_refused_pause_s) and len(n.requests) == 1
        finally:
            await ch.close()
            await n.close()
    run(t())


def test_a_worker_waits_as_long_as_the_nodes_idle_answer_asks_never_less_than_its_own_wait():
    async def t():
        idle = {"runs": [], "draining": False}
        n = Node([(200, dict(idle, next_wait_s=45)), (200, dict(idle, next_wait_s=45)), (200, dict(idle, next_wait_s=500)),
                  (200, dict(idle, next_wait_s="60")), (200, dict(idle, next_wait_s=True)), (200, dict(idle, next_wait_s=1)),
                  (200, idle)])
        ch = RemoteChannel(WorkerConfig(urls=[await n.start()], token=TOKEN, worker_id="w1", wait_s=0), SystemClock())
        try:
            ch.cfg.wait_s = 5.0  # what it asks for; the stand-in node answers at once
            ch._rng = random.Random(7)  # the spread, made repeatable
            for _ in range(7):
                await ch.acquire(1, 10_000, None)
            waits = [r[2]["wait_s"] for r in n.requests]
            assert waits[0] == 5.0  # its own, until a node asks for more
            assert 36 <= waits[1] <= 45 and 36 <= waits[2] <= 45 and waits[1] != waits[2]  # spread
            assert 48 <= waits[3] <= worker_limits.lease_wait_s_max  # 500: capped at what a node accepts
            assert waits[4:] == [5.0, 5.0, 5.0]  # not a number, a bool, shorter than its own: its own
            assert ch.lease_wait_s() == 5.0  # an answer without the field: its own again
        finally:
            await ch.close()
            await n.close()
    run(t())


def test_a_worker_heartbeats_as_often_as_the_nodes_answer_asks_within_a_third_of_its_ttl():
    async def t():
        ok = {"extended": 1, "lost": [], "draining": False}
        n = Node([(200, dict(ok, next_heartbeat_s=3)), (200, dict(ok, next_heartbeat_s=60)),
                  (200, dict(ok, next_heartbeat_s="9")), (200, dict(ok, next_heartbeat_s=True)),
                  (200, dict(ok, next_heartbeat_s=0.5)), (200, ok)])
        ch = RemoteChannel(WorkerConfig(urls=[await n.start()], token=TOKEN, worker_id="w1", wait_s=0), SystemClock())
        try:
            ch._rng = random.Random(7)  # the spread, made repeatable
            assert ch.heartbeat_interval_s(1.0, 10.0) == 1.0  # its own, until a node asks for more
            got = []
            for _ in range(6):
                await ch.heartbeat([["r@1", 1]], 30_000, 5.0)
                got.append(ch.heartbeat_interval_s(1.0, 10.0))
            assert 2.4 <= got[0] <= 3.0 and got[0] != ch.heartbeat_interval_s(1.0, 10.0)  # spread over its last fifth
            assert got[1] == 10.0  # never beyond a third of its TTL
            assert got[2:] == [1.0, 1.0, 1.0, 1.0]  # not a number, a bool, shorter than its own, none: its own
            # asked again, then a heartbeat that fails: the next at its own interval
            n.answers[:] = [(200, dict(ok, next_heartbeat_s=3))] + [
                (503, {"error": {"code": "unavailable", "message": "no leader"}})] * 50
            await ch.heartbeat([["r@1", 1]], 30_000, 5.0)
            assert ch.heartbeat_interval_s(1.0, 10.0) > 1.0
            with pytest.raises(RaftschedError):
                await ch.heartbeat([["r@1", 1]], 30_000, 0.5)
            assert ch.heartbeat_interval_s(1.0, 10.0) == 1.0
        finally:
            await ch.close()
            await n.close()
    run(t())


def test_a_leave_never_raises_nor_outlasts_its_deadline(monkeypatch, caplog):
    """A worker stopped by a signal says it leaves: a node of a version without the route (404),
    or one that never answers, leaves it to drain and stop as before, within leave_deadline_s."""
    monkeypatch.setattr(worker_limits, "leave_deadline_s", 0.5)

    async def t():
        old = Node([(404, {"error": {"code": "not_found", "message": "no route", "field": None}})])
        hang = Node(["hang"])
        try:
            instances = []
            for n in (old, hang):
                ch = RemoteChannel(WorkerConfig(urls=[await n.start()], token=TOKEN, worker_id="w/1"), SystemClock())
                instances.append(ch.facts["instance"])
                t0 = time.monotonic()
                await ch.leave("stopping")
                assert time.monotonic() - t0 < 3
                await ch.close()
            (path, _, body), = old.requests
            assert path == "/v1/workers/w%2F1/leave" and body == {"instance": instances[0], "reason": "stopping"}
        finally:
            await old.close()
            await hang.close()
    with caplog.at_level("INFO", logger="raftsched"):
        run(t())
    assert caplog.text.count("the cluster was not told it leaves") == 2


def test_a_default_worker_id_is_host_slash_pid():
    wid = default_worker_id()
    host, _, pid = wid.rpartition("/")
    assert host and pid.isdigit()


# ---------------------------------------------------------------------------- drain
def test_a_drain_lets_running_runs_finish_then_gives_back_the_rest_without_spending_an_attempt():
    async def t():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = SystemClock()
        svc = Service(raft, clock, "node-1")
        base = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"}}
        await svc.put_job("slow", dict(base, executor={"type": "python", "target": "exec_targets:slow_async"}), None)
        await svc.put_job("quick", dict(base, executor={"type": "python", "target": "exec_targets:blocking"}), None)
        slow = (await svc.trigger_job("slow", None))["run"]
        quick = (await svc.trigger_job("quick", None))["run"]
        exec_targets.STARTED[slow] = asyncio.Event()
        exec_targets.RELEASE[quick] = threading.Event()
        exec_targets.RECORDED.pop(quick, None)
        ch = EmbeddedChannel(raft, clock, "w1", slots=2, queues=None, allowed_types={"python"}, single_node=True)
        loop = LeaseLoop(ch, clock, sandbox=None, slots=2, allowed_types={"python"}, poll_interval_s=0.01,
                         kill_grace_s=0.5)  # in this process: the test watches its targets' events
        task = asyncio.create_task(loop.run())
        try:
            await until(lambda: exec_targets.STARTED[slow].is_set() and quick in exec_targets.RECORDED,
                        what="both runs started")
            drain = asyncio.create_task(loop.drain(1.0))
            # The quick one finishes within the drain time: reported as usual.
            exec_targets.RELEASE[quick].set()
            await drain
            assert not loop.held and loop.released == 1 and loop.completed == 1
            assert state.runs[quick]["state"] == "succeeded"
            r = state.runs[slow]
            assert r["state"] == "queued" and r["attempt"] == 2 and r.get("failures", 0) == 0
            assert r["attempts"][-1]["released"] is True and "drain time" in r["attempts"][-1]["error"]
            # Nothing more is leased while draining.
            before = len(raft.proposed)
            await asyncio.sleep(0.1)  # ok-sleep: a window in which a non-draining loop would acquire
            assert not any(b"acquire" in d for d in raft.proposed[before:])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    run(t())


# ---------------------------------------------------------------------------- a whole worker
def test_run_worker_leases_executes_and_reports_through_a_node_then_drains_on_stop():
    async def t():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = SystemClock()
        svc = Service(raft, clock, "node-1")
        fleet = Fleet(raft, clock, "node-1")
        app = make_app(svc, TOKEN, fleet=fleet)
        fleet_task = asyncio.create_task(fleet.run())
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        stop = asyncio.Event()
        cfg = WorkerConfig(urls=[f"http://127.0.0.1:{server.port}"], token=TOKEN, worker_id="gpu/1",
                           labels={"pool": "gpu"}, slots=3, wait_s=2.0)
        worker = asyncio.create_task(run_worker(cfg, clock, stop))
        try:
            spec = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"}, "placement": {"labels": {"pool": "gpu"}},
                    "executor": {"type": "python", "target": "builtins:id"}}
            await svc.put_job("j", spec, None)
            rids = [(await svc.trigger_job("j", None))["run"] for _ in range(5)]
            await until(lambda: all(state.runs[r]["state"] == "succeeded" for r in rids), 10, "every run done")
            assert {state.runs[r]["worker"] for r in rids} == {"gpu/1"}
            assert state.workers["gpu/1"]["labels"] == {"pool": "gpu"} and state.workers["gpu/1"]["kind"] == "remote"
            assert state.workers["gpu/1"]["state"] == "active"
            stop.set()
            assert await asyncio.wait_for(worker, 10) == 0
            # It told the cluster it leaves: draining at once, not active until unseen for 30 s.
            assert state.workers["gpu/1"]["state"] == "draining"
        finally:
            stop.set()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            fleet_task.cancel()
            await asyncio.gather(fleet_task, return_exceptions=True)
            await server.close()
    run(t())


# ---------------------------------------------------------------------------- a failed worker
def test_run_worker_returns_1_and_gives_its_runs_back_when_its_lease_watchdog_fails(monkeypatch, caplog):
    """The lease loop's watchdog raises (a bug) while a run executes: run_worker does not go on
    leasing with the rule "kill a run whose lease is past its TTL" gone. It kills the run, gives
    it back (``release``: queued again, no attempt spent), logs the failure and returns 1."""
    async def t():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = SystemClock()
        svc = Service(raft, clock, "node-1")
        fleet = Fleet(raft, clock, "node-1")
        fleet_task = asyncio.create_task(fleet.run())  # the dispatcher answers lease requests
        server = TestServer(make_app(svc, TOKEN, fleet=fleet), host="127.0.0.1")
        await server.start_server()
        broken = {"on": False}
        look = LeaseLoop._check_heartbeats

        def watchdog_look(self) -> None:
            if broken["on"]:
                raise RuntimeError("a bug in the watchdog")
            look(self)
        monkeypatch.setattr(LeaseLoop, "_check_heartbeats", watchdog_look)
        stop = asyncio.Event()
        cfg = WorkerConfig(urls=[f"http://127.0.0.1:{server.port}"], token=TOKEN, worker_id="w/1", slots=1, wait_s=1.0,
                           in_process=True)  # the test watches its target's events
        worker = asyncio.create_task(run_worker(cfg, clock, stop))
        try:
            spec = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
                    "executor": {"type": "python", "target": "exec_targets:slow_async"}}
            await svc.put_job("j", spec, None)
            rid = (await svc.trigger_job("j", None))["run"]
            exec_targets.STARTED[rid] = asyncio.Event()
            exec_targets.RECORDED.pop(rid, None)
            await asyncio.wait_for(exec_targets.STARTED[rid].wait(), 10)
            broken["on"] = True
            assert await asyncio.wait_for(worker, 10) == 1
            r = state.runs[rid]
            assert r["state"] == "queued" and r.get("failures", 0) == 0, r
            assert r["attempts"][-1]["released"] is True and "lease watchdog" in r["attempts"][-1]["error"]
            assert [x["kind"] for x in exec_targets.RECORDED[rid]] == ["started", "cancelled"]
            errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
            assert any("lease watchdog failed" in m and "a bug in the watchdog" in m for m in errors), errors
        finally:
            stop.set()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            fleet_task.cancel()
            await asyncio.gather(fleet_task, return_exceptions=True)
            await server.close()
    run(t())


def test_the_raftsched_worker_command_exits_non_zero_when_its_lease_watchdog_fails(monkeypatch, tmp_path):
    from raftsched import cli

    def watchdog_look(self) -> None:
        raise RuntimeError("a bug in the watchdog")
    monkeypatch.setattr(LeaseLoop, "_check_heartbeats", watchdog_look)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    t0 = time.monotonic()
    rc = cli.main(["worker", "--url", f"http://127.0.0.1:{free_ports(1)[0]}", "--token-file", str(token),
                   "--id", "w1", "--log-level", "warning"])
    assert rc == 1 and time.monotonic() - t0 < 20


def test_a_lease_answer_says_how_long_it_was_on_the_way():
    """The round trip less the node's ``held_ms`` is the time on the way (``transit_ms``), which
    the lease loop weighs against the lease TTL (late grants, worker/loop.py); without
    ``held_ms`` (a node of another version) it is not known."""
    async def t():
        grant = {"id": "j@1", "token": 7, "deadline": 0}
        node = Node([("slow", 0.3, (200, {"runs": [grant], "draining": False, "held_ms": 0})),
                     ("slow", 0.3, (200, {"runs": [grant], "draining": False, "held_ms": 300})),
                     (200, {"runs": [grant], "draining": False})])
        ch = RemoteChannel(WorkerConfig(urls=[await node.start()], token=TOKEN, worker_id="w/1", wait_s=0),
                           SystemClock())
        try:
            on_the_way = (await ch.acquire(1, 10_000, None)).transit_ms
            assert on_the_way is not None and 290 <= on_the_way < 3000, on_the_way
            assert 0 <= (await ch.acquire(1, 10_000, None)).transit_ms < on_the_way - 150
            assert (await ch.acquire(1, 10_000, None)).transit_ms is None
        finally:
            await ch.close()
            await node.close()
    run(t())


def test_the_time_on_the_way_is_the_answering_attempts_not_the_calls():
    """A lease call whose first attempt met a 503 (a node with no leader, after a while) and
    whose second was granted at once: the grants were on the way for the second attempt's round
    trip, not for the whole call's (which would make good grants look late)."""
    async def t():
        grant = {"id": "j@1", "token": 7, "deadline": 0}
        unavailable = (503, {"error": {"code": "unavailable", "message": "no leader", "field": None}})
        node = Node([("slow", 0.8, unavailable), (200, {"runs": [grant], "draining": False, "held_ms": 0})])
        ch = RemoteChannel(WorkerConfig(urls=[await node.start()], token=TOKEN, worker_id="w/1", wait_s=0),
                           SystemClock())
        try:
            t0 = time.monotonic()
            grants = await ch.acquire(1, 10_000, None)
            assert time.monotonic() - t0 >= 0.8 and len(node.requests) == 2  # the call did take the 503 first
            assert grants.runs == [grant]
            assert grants.transit_ms is not None and 0 <= grants.transit_ms < 500, grants.transit_ms
        finally:
            await ch.close()
            await node.close()
    run(t())


def test_a_remote_worker_runs_on_the_cluster_time_its_nodes_answer_with():
    """Lease and heartbeat answers carry cluster time; the worker keeps it on its monotonic clock
    and its lease loop runs on it (raftsched/clock.py ClusterClock), not on its own wall clock.
    An answer without it (a node of another version) or with a malformed one changes nothing."""
    async def t():
        cluster = time.time_ns() // 1_000_000 + 3_600_000  # the cluster is an hour ahead of this host
        node = Node([(200, {"runs": [], "draining": False}),
                     (200, {"runs": [], "draining": False, "cluster_ms": "soon"}),
                     (200, {"runs": [], "draining": False, "cluster_ms": cluster}),
                     (200, {"extended": 0, "lost": [], "draining": False, "cluster_ms": cluster + 5})])
        ch = RemoteChannel(WorkerConfig(urls=[await node.start()], token=TOKEN, worker_id="w/1", wait_s=0),
                           SystemClock())
        clock = ClusterClock(SystemClock(), ch.cluster_ms)
        try:
            await ch.acquire(1, 10_000, None)
            await ch.acquire(1, 10_000, None)
            assert ch.cluster_ms() is None and abs(clock.now_ms() - time.time_ns() // 1_000_000) < 1000
            await ch.acquire(1, 10_000, None)
            assert 0 <= ch.cluster_ms() - cluster < 1000
            await ch.heartbeat([["r", 1]], 10_000, timeout_s=3.0)
            assert 5 <= ch.cluster_ms() - cluster < 1000
            assert abs(clock.now_ms() - cluster) < 1000
        finally:
            await ch.close()
            await node.close()
    run(t())


def test_the_leaders_embedded_worker_says_it_has_no_slot_while_it_runs_nothing():
    """The leader of a cluster of several runs nothing (EmbeddedChannel.executes): its registry
    record had its slots all the same, so every reader counted it a free worker (a queued run's
    waiting_for never said "a free slot" in a cluster whose nodes have slots)."""
    async def t():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = SystemClock()
        ch = EmbeddedChannel(raft, clock, "node-1/1", slots=4, queues=None, allowed_types={"shell"})
        raft.leader = False
        await ch.hello()
        assert state.workers["node-1/1"]["slots"] == 4 and ch.registered()
        raft.voters = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        raft.leader = True  # leads a cluster of three: says hello again, with no slot
        assert not ch.registered()
        await ch.hello()
        assert state.workers["node-1/1"]["slots"] == 0 and ch.registered()
        raft.voters = ["127.0.0.1:1"]  # the others removed: a lone voter executes
        assert not ch.registered()
        await ch.hello()
        assert state.workers["node-1/1"]["slots"] == 4 and ch.registered()
        lead = EmbeddedChannel(raft, clock, "node-2/1", slots=2, queues=None, allowed_types={"shell"},
                               execute_on_leader=True)
        raft.voters = ["127.0.0.1:1", "127.0.0.1:2"]
        await lead.hello()
        assert state.workers["node-2/1"]["slots"] == 2
    asyncio.run(t())


async def _healthz_server() -> TestServer:
    """A node's /healthz that answers, started (close it)."""
    async def healthz(_r):
        return web.json_response({"ok": True, "role": "leader", "leader": "x"})
    up = web.Application()
    up.router.add_get("/healthz", healthz)
    server = TestServer(up, host="127.0.0.1")
    await server.start_server()
    return server


def test_a_worker_whose_nodes_do_not_answer_says_so_at_its_start_not_after_its_first_long_poll(caplog):
    """A walk: a worker given a wrong --url said nothing for 33 s (its first lease request's
    deadline). Its first look (GET /healthz, first_contact_s) says it at once; a node that
    answers says nothing."""
    from raftsched.worker.remote import _first_contact

    async def t():
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        cfg = WorkerConfig(urls=[dead], token=TOKEN, worker_id="w1")
        ch = RemoteChannel(cfg, SystemClock())
        t0 = time.monotonic()
        try:
            with caplog.at_level("WARNING", logger="raftsched.remote"):
                await _first_contact(ch, cfg)
        finally:
            await ch.close()
        assert time.monotonic() - t0 < worker_limits.first_contact_s + 5
        said = [r.getMessage() for r in caplog.records if "answered yet" in r.getMessage()]
        assert len(said) == 1 and dead in said[0] and "Connect call failed" in said[0], said
        caplog.clear()
        server = await _healthz_server()
        cfg = WorkerConfig(urls=[f"http://127.0.0.1:{server.port}"], token=TOKEN, worker_id="w1")
        ch = RemoteChannel(cfg, SystemClock())
        try:
            with caplog.at_level("WARNING", logger="raftsched.remote"):
                await _first_contact(ch, cfg)
        finally:
            await ch.close()
            await server.close()
        assert not [r for r in caplog.records if r.name == "raftsched.remote"], caplog.records
    run(t())


def test_a_worker_of_several_urls_names_each_that_does_not_answer_at_its_start(caplog):
    """A walk: of two URLs (an http one to a TLS node, an https one without its CA), the worker
    warned of the last one tried only. Each URL is asked on its own: every one that does not
    answer is named, and one that fails beside others that answer is said too."""
    from raftsched.worker.remote import _first_contact

    async def t():
        server = await _healthz_server()
        a, b = (f"http://127.0.0.1:{p}" for p in free_ports(2))
        good = f"http://127.0.0.1:{server.port}"
        try:
            for urls, want, none_of in (([a, b], [a, b, "no node of its --url answered yet"], [good]),
                                        ([good, b], [b, "some nodes of its --url did not answer"], [a, good + ":"])):
                cfg = WorkerConfig(urls=urls, token=TOKEN, worker_id="w1")
                ch = RemoteChannel(cfg, SystemClock())
                caplog.clear()
                try:
                    with caplog.at_level("WARNING", logger="raftsched.remote"):
                        await _first_contact(ch, cfg)
                finally:
                    await ch.close()
                said = [r.getMessage() for r in caplog.records if r.name == "raftsched.remote"]
                assert len(said) == 1 and all(w in said[0] for w in want), (urls, said)
                assert not any(n in said[0] for n in none_of), (urls, said)
                assert said[0].count("Connect call failed") == len(want) - 1, said
        finally:
            await server.close()
    run(t())


def test_a_worker_logs_what_a_lease_answer_warns_of_once_a_minute(caplog):
    async def t():
        ch = RemoteChannel(WorkerConfig(urls=["http://127.0.0.1:9"], token=TOKEN, worker_id="dup"), SystemClock())
        try:
            with caplog.at_level("WARNING", logger="raftsched.remote"):
                for _ in range(3):
                    ch._warned({"runs": [], "warnings": ["worker id 'dup' is used by more than one process: ..."]})
                ch._warned({"runs": [], "warnings": "not a list"})
                ch._warned({"runs": []})
        finally:
            await ch.close()
        said = [r.getMessage() for r in caplog.records if r.name == "raftsched.remote"]
        assert said == ["worker dup: the node warns: worker id 'dup' is used by more than one process: ..."], said
    run(t())
