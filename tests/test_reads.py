"""Reads that see every acknowledged write (node/reads.py): one barrier round serves every read
waiting when it starts, never a round that started before the read arrived; no leader fails a
read at once; ``?stale=true`` skips the round and says so. In-process (FakeRaft, FakeClock): a
real cluster's reads are in tests/test_cluster.py."""
from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core.errors import Indeterminate, Unavailable
from raftsched.core.state import SchedulerState
from raftsched.node.api import ROUTES, make_app
from raftsched.node import openapi
from raftsched.node.metrics import NodeMetrics
from raftsched.node.reads import STALE_HEADER, ReadBarrier
from raftsched.node.routes import STALE
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger
from raftsched.worker.loop import Worker

from fakes import FakeRaft

TOKEN = "x" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class GatedRaft(FakeRaft):
    """A FakeRaft whose barrier rounds wait until the test opens them, one gate per round."""

    def __init__(self) -> None:
        super().__init__(SchedulerState())
        self.gates: list[asyncio.Event] = []
        self.barrier_error: Exception | None = None

    async def barrier(self, timeout_s: float = 5.0) -> None:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.barrier_error is not None:
            raise self.barrier_error


async def _until_s(cond, seconds: float) -> None:
    """Wait for ``cond()`` with a deadline (for what polls on wall time: the quorum's grace)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)  # ok-sleep: polling a condition within a deadline


async def _until(cond, turns: int = 100) -> None:
    """Let the loop turn until ``cond()`` (bounded: no wall-clock wait)."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)  # ok-sleep: one turn of the loop, bounded by ``turns``; no wall-clock wait
    raise AssertionError("condition not reached")


def test_a_burst_of_reads_costs_one_round_and_no_read_is_served_by_a_round_begun_before_it():
    async def main():
        raft = GatedRaft()
        rb = ReadBarrier(raft, 5.0)
        first = asyncio.ensure_future(rb.wait())
        await _until(lambda: len(raft.gates) == 1)
        # A burst arrives while round 1 is in flight: round 1 may have been proposed before a
        # write these reads must see, so they wait for the next round, all of them together.
        burst = [asyncio.ensure_future(rb.wait()) for _ in range(50)]
        await _until(lambda: rb.reads == 51)
        raft.gates[0].set()
        await first
        await asyncio.sleep(0)  # ok-sleep: one turn of the loop, so a wrongly served read would be done
        assert not any(t.done() for t in burst), "a read was served by a round that began before it arrived"
        await _until(lambda: len(raft.gates) == 2)
        raft.gates[1].set()
        await asyncio.gather(*burst)
        assert (rb.rounds, len(raft.gates), rb.reads) == (2, 2, 51)
        # Reads that arrive in one turn with no round in flight: one round.
        again = [asyncio.ensure_future(rb.wait()) for _ in range(10)]
        await _until(lambda: len(raft.gates) == 3)
        raft.gates[2].set()
        await asyncio.gather(*again)
        assert rb.rounds == 3
    asyncio.run(main())


def test_no_leader_fails_the_read_at_once_and_an_unknown_barrier_outcome_is_unavailable():
    async def main():
        raft = GatedRaft()
        raft.leader = False
        rb = ReadBarrier(raft, 5.0)
        with pytest.raises(Unavailable, match="no leader"):
            await rb.wait()
        assert raft.gates == [], "no barrier is proposed without a leader"
        raft.leader = True
        raft.barrier_error = Indeterminate("outcome unknown (LEADER_CHANGED)")
        t = asyncio.ensure_future(rb.wait())
        await _until(lambda: len(raft.gates) == 1)
        raft.gates[0].set()
        with pytest.raises(Unavailable, match=r"no quorum confirmed .* \(outcome unknown \(LEADER_CHANGED\)\)") as e:
            await t
        assert "may still apply" not in str(e.value), "a read is no command that may apply"
        # A follower cut off from the leader it knows fails at once too.
        cut = dict(raft.status(), self="127.0.0.1:2", peers_connected=[])
        raft.status = lambda: cut
        with pytest.raises(Unavailable, match="not reachable"):
            await rb.wait()
        # So does a leader that reaches no quorum of its voters (the others killed): it waited
        # out the whole deadline, until it stepped down.
        me = raft.status()["leader"]
        voters = [me, "127.0.0.1:8", "127.0.0.1:9"]
        alone = dict(raft.status(), self=me, members=voters, peers_connected=[])
        raft.status = lambda: alone
        with pytest.raises(Unavailable, match="reaches 1 of the 3 voters, no quorum"):
            await rb.wait()
        # ... but a peer whose connection is being made again within the grace is waited for.
        raft.barrier_error = None
        seen = []

        def reconnecting():
            seen.append(1)
            return alone if len(seen) < 5 else dict(alone, peers_connected=["127.0.0.1:8"])
        raft.status = reconnecting
        t = asyncio.ensure_future(rb.wait())
        await _until_s(lambda: len(raft.gates) == 2, 10)
        raft.gates[1].set()
        await t
        # ... and the voters counted are the latest configuration's: a pending change's.
        pend = dict(alone, peers_connected=[], members=voters,
                    membership={"self": "voter", "pending": {"voters": [me], "learners": []}})
        raft.status = lambda: pend
        t = asyncio.ensure_future(rb.wait())
        await _until(lambda: len(raft.gates) == 3)
        raft.gates[2].set()
        await t
        alone = dict(alone, peers_connected=["127.0.0.1:9"])  # one of two others: a quorum, a round
        # ... and a node removed from the cluster says so, not that a leader is unreachable.
        gone = dict(raft.status(), self="127.0.0.1:5", peers_connected=[], membership={"self": "none"})
        raft.status = lambda: gone
        with pytest.raises(Unavailable, match="not a member of the cluster"):
            await rb.wait()
        assert len(raft.gates) == 3, "no round for a node that is no member"
        # ... and a node that has not read its log yet says that, not that it is no member (a
        # member restarted with --join said "not a member" for a moment).
        raft.status = lambda: dict(gone, membership={"self": "starting"})
        with pytest.raises(Unavailable, match="starting: it has not read its log yet") as e:
            await rb.wait()
        assert "not a member" not in str(e.value)
        assert len(raft.gates) == 3
        raft.status = lambda: alone
        raft.barrier_error = None
        t = asyncio.ensure_future(rb.wait())
        await _until(lambda: len(raft.gates) == 4)
        raft.gates[3].set()
        await t
        del raft.status
        # A reader that went away does not cancel the round the others wait for.
        gone, stays = asyncio.ensure_future(rb.wait()), asyncio.ensure_future(rb.wait())
        await _until(lambda: len(raft.gates) == 5)
        gone.cancel()
        raft.gates[4].set()
        await stays
    asyncio.run(main())


def run_api(coro_fn, raft=None):
    async def main():
        r = raft or FakeRaft(SchedulerState())
        clock = FakeClock()
        service = Service(r, clock, "node-1")
        trigger = Trigger(r, clock, "node-1")
        worker = Worker(r, clock, "node-1", sandbox=None, slots=0)
        metrics = NodeMetrics(r, trigger, worker)
        app = make_app(service, TOKEN, trigger=trigger, worker=worker, metrics=metrics)
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as client:
            await coro_fn(r, service, client)
    asyncio.run(main())


def test_every_read_route_waits_for_a_round_unless_stale_and_a_stale_answer_says_so():
    reads = [r for r in ROUTES if r.method == "GET"]
    # This node's own view, served without a leader: /v1/cluster waits only with ?consistent=true;
    # the OpenAPI document and the dashboard's files read no state; whoami describes the token the
    # node has just checked.
    assert {r.path for r in reads if STALE not in r.params} == {"/healthz", "/metrics", "/v1/cluster",
                                                               "/openapi.json", "/v1/openapi.json", "/ui",
                                                               "/ui/", "/ui/{file}", "/v1/whoami"}

    doc = openapi.document(ROUTES)
    assert "X-Raftsched-Stale" in doc["paths"]["/v1/jobs/{name}"]["get"]["responses"]["200"]["headers"]
    assert "headers" not in doc["paths"]["/v1/jobs/{name}"]["put"]["responses"]["201"]

    async def t(raft, service, c):
        r = await c.get("/v1/jobs/nope")
        assert r.status == 404 and STALE_HEADER not in r.headers
        assert service.reads.rounds == 1
        r = await c.get("/v1/jobs?stale=true")
        assert r.status == 200 and r.headers[STALE_HEADER] == "true"
        r = await c.get("/v1/jobs/nope?stale=true")  # a stale 404 is stale too
        assert r.status == 404 and r.headers[STALE_HEADER] == "true"
        assert service.reads.rounds == 1, "a stale read waits for no round"
        for q in ("stale=maybe", "consistent=maybe"):
            r = await c.get(f"/v1/jobs?{q}")
            body = await r.json()
            assert r.status == 400 and body["error"]["field"] == q.split("=")[0], body
        r = await c.get("/v1/jobs?consistent=true")  # older clients: the same one round
        assert r.status == 200 and service.reads.rounds == 2
        text = await (await c.get("/metrics")).text()
        assert "raftsched_read_barrier_rounds_total 2.0" in text
        assert "raftsched_read_barrier_seconds_count 2.0" in text
        r = await c.get("/v1/cluster")
        assert r.status == 200 and r.headers[STALE_HEADER] == "true" and service.reads.rounds == 2
        r = await c.get("/v1/cluster?consistent=true")
        assert r.status == 200 and STALE_HEADER not in r.headers and service.reads.rounds == 3
        raft.leader = False
        assert (await c.get("/v1/cluster")).status == 200
        r = await c.get("/v1/jobs")
        assert r.status == 503 and r.headers["Retry-After"] == "1", await r.text()
        assert (await c.get("/v1/jobs?stale=true")).status == 200
    run_api(t)
