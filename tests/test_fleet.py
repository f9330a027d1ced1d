"""The node's side of the worker fleet, in process (node/fleet.py, node/dispatch.py, the worker
protocol's routes in node/api.py): an app over one replica behind FakeRaft, its fleet loop
running, and real HTTP clients. Every wait has a deadline; long-polls are given short waits."""
from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.parse

from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock, SystemClock
from raftsched.core import commands, limits
from raftsched.core.model import EXECUTOR_TYPES
from raftsched.core.state import SchedulerState
from raftsched.node import limits as node_limits
from raftsched.node.api import make_app
from raftsched.node.audit import AuditLog
from raftsched.node.dispatch import Dispatcher, LeaseRequest
from raftsched.node.fleet import Fleet
from raftsched.node.service import Service
from raftsched.testing.fakes import FakeRaft

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALL = list(EXECUTOR_TYPES)
SPEC = {"schedule": {"every_s": 3600}, "executor": {"type": "python", "target": "builtins:id"},
        "misfire": {"policy": "skip"}}


class Env:
    def __init__(self, audit: AuditLog | None = None, clock=None) -> None:
        self.state = SchedulerState()
        self.raft = FakeRaft(self.state)
        self.clock = clock or SystemClock()
        self.service = Service(self.raft, self.clock, "node-1")
        self.fleet = Fleet(self.raft, self.clock, "node-1")
        self.app = make_app(self.service, TOKEN, fleet=self.fleet, audit=audit)

    def ops(self, op: str) -> list[dict]:
        return [c for c in map(commands.decode, self.raft.proposed) if c["op"] == op]


def run(coro_fn, audit: AuditLog | None = None, clock=None):
    async def main():
        env = Env(audit, clock)
        loop_task = env.loop_task = asyncio.create_task(env.fleet.run())
        try:
            async with TestClient(TestServer(env.app, host="127.0.0.1")) as client:
                await asyncio.wait_for(coro_fn(env, client), 30)
        finally:
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
    asyncio.run(main())


def path(wid: str, what: str = "") -> str:
    return "/v1/workers/" + urllib.parse.quote(wid, safe="") + (f"/{what}" if what else "")


def lease_body(**kw) -> dict:
    body = {"slots": 4, "executors": ALL, "labels": {}, "queues": None, "version": "1", "instance": "i1",
            "max": 4, "wait_s": 0.2, "ttl_ms": 10_000}
    body.update(kw)
    return body


async def lease(c, wid, **kw):
    """The answer, less ``held_ms`` (checked: how long the node held the request)."""
    r = await c.post(path(wid, "lease"), data=json.dumps(lease_body(**kw)), headers=AUTH)
    assert r.status == 200, await r.text()
    body = await r.json()
    held = body.pop("held_ms")
    assert isinstance(held, int) and 0 <= held <= 1000 * max(1.0, 2 * kw.get("wait_s", 0) + 5), held
    return body


async def post(c, p, body, status=200, headers=AUTH):
    r = await c.post(p, data=json.dumps(body), headers=headers)
    assert r.status == status, await r.text()
    return await r.json()


async def put_job(env, name, spec=SPEC) -> None:
    await env.service.put_job(name, spec, None)


async def trigger(env, name) -> str:
    return (await env.service.trigger_job(name, None))["run"]


async def until(cond, timeout_s=5.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop


def under_lock(env, monkeypatch, *names: str) -> dict[str, list[bool]]:
    """From now on, each call of one of ``names`` (functions of raftsched.core.queries) records
    whether it ran inside a read of env's replica (under its lock): name -> one bool a call.
    Per thread: the fleet's loop may read while a walk runs in the walks' thread."""
    from raftsched.core import queries
    inside = threading.local()
    real_read = env.raft.read

    def read(fn, *args):
        inside.on = True
        try:
            return real_read(fn, *args)
        finally:
            inside.on = False
    env.raft.read = read
    calls: dict[str, list[bool]] = {}
    for name in names:
        real, seen = getattr(queries, name), calls.setdefault(name, [])

        def spy(*args, _real=real, _seen=seen):
            _seen.append(getattr(inside, "on", False))
            return _real(*args)
        monkeypatch.setattr(queries, name, spy)
    return calls


def count_reads(env) -> tuple[list, object]:
    """From now on, the name of every function read on env's replica goes into the list; returns
    it and the real read, to put back."""
    reads: list[str] = []
    real = env.raft.read

    def counted(fn, *args):
        reads.append(fn.__name__)
        return real(fn, *args)
    env.raft.read = counted
    return reads, real


# ---------------------------------------------------------------------------- bad input
def test_bad_requests_name_the_field_and_change_nothing():
    async def t(env, c):
        before = env.state.snapshot()
        for body, field in (({"executors": ALL, "max": 1}, "slots"), (lease_body(max=0), "max"),
                            (lease_body(max=limits.acquire_runs_max + 1), "max"), (lease_body(wait_s=-1), "wait_s"),
                            (lease_body(wait_s=3600), "wait_s"), (lease_body(ttl_ms=5), "ttl_ms"),
                            (lease_body(labels={"pool": ""}), "labels.pool"), (lease_body(executors=["docker"]), "executors"),
                            (lease_body(queues=[]), "queues"), (lease_body(nodes=3), "nodes"), ([1, 2], None),
                            (lease_body(dedicated=["pool"]), "dedicated"), (lease_body(dedicated="pool"), "dedicated")):
            r = await c.post(path("w1", "lease"), data=json.dumps(body), headers=AUTH)
            assert r.status == 422, (body, await r.text())
            assert (await r.json())["error"]["field"] == field
        r = await c.post(path("bad id!", "lease"), data=json.dumps(lease_body()), headers=AUTH)
        assert r.status == 422 and (await r.json())["error"]["field"] == "id"
        r = await c.post(path("w1", "lease"), data="{not json", headers=AUTH)
        assert r.status == 400
        for what, body, field in (("heartbeat", {"leases": [["r", "x"]]}, "leases"), ("heartbeat", {"leases": "r"}, "leases"),
                                  ("complete", {"results": []}, "results"),
                                  ("complete", {"results": [{"run": "r", "token": 1}]}, "results[0].success"),
                                  ("complete", {"results": [{"run": "r", "token": 1, "success": True, "x": 1}]}, "results[0].x"),
                                  # (json.dumps writes NaN, which the node's json reads: not JSON, refused)
                                  ("complete", {"results": [{"run": "r", "token": 1, "success": True,
                                                             "result": {"v": float("nan")}}]}, "results[0].result"),
                                  ("release", {"leases": [["r", 1]], "reason": 5}, "reason")):
            r = await c.post(path("w1", what), data=json.dumps(body), headers=AUTH)
            assert r.status == 422, (what, body, await r.text())
            assert (await r.json())["error"]["field"] == field
        # Without the token: refused, like every mutation.
        r = await c.post(path("w1", "lease"), data=json.dumps(lease_body()))
        assert r.status == 401
        assert env.state.snapshot() == before
        assert not [w for w in env.state.workers]
    run(t)


# ---------------------------------------------------------------------------- lease
def test_a_lease_answer_says_how_long_the_node_held_the_request():
    """``held_ms``: the worker takes it from its round trip, and what is left was on the way
    (worker/remote.py: a grant that spent half its lease on the way is heartbeated first)."""
    async def t(env, c):
        r = await c.post(path("held", "lease"), data=json.dumps(lease_body(wait_s=0.3)), headers=AUTH)
        body = await r.json()
        assert r.status == 200 and body["runs"] == [] and 250 <= body["held_ms"] <= 5000, body
    run(t)


def test_a_worker_says_hello_on_first_contact_and_again_only_when_its_facts_change():
    async def t(env, c):
        assert await lease(c, "h/1", wait_s=0) == {"runs": [], "draining": False}
        assert env.state.workers["h/1"]["kind"] == "remote" and len(env.ops("worker_hello")) == 1
        await lease(c, "h/1", wait_s=0)
        assert len(env.ops("worker_hello")) == 1
        await lease(c, "h/1", wait_s=0, labels={"pool": "gpu"})
        assert len(env.ops("worker_hello")) == 2 and env.state.workers["h/1"]["labels"] == {"pool": "gpu"}
        # Its id holds a "/": the admin routes take it percent-encoded too.
        r = await c.get(path("h/1"), headers=AUTH)
        assert r.status == 200 and (await r.json())["labels"] == {"pool": "gpu"}
    run(t)


def test_a_long_poll_is_answered_when_work_comes_and_empty_when_its_wait_runs_out():
    async def t(env, c):
        await put_job(env, "j")
        t0 = time.monotonic()
        assert (await lease(c, "w1", wait_s=0.3))["runs"] == []
        assert 0.25 <= time.monotonic() - t0 < 3
        poll = asyncio.ensure_future(lease(c, "w1", wait_s=10))
        await until(lambda: env.fleet.dispatcher.waiting == 1, what="the request to wait")
        rid = await trigger(env, "j")
        res = await poll
        assert [g["id"] for g in res["runs"]] == [rid] and res["runs"][0]["token"] > 0
        assert env.state.runs[rid]["worker"] == "w1" and env.state.runs[rid]["state"] == "running"
    run(t)


def test_a_stopping_node_answers_its_waiting_long_polls_at_once_and_new_ones_empty():
    """When the node stops (the fleet's loop is cancelled), a worker waiting out a 20 s long-poll
    is answered at once, with no runs: the API's cleanup waits for its handlers, and a node sent
    SIGTERM once waited out the wait and was killed by cluster.sh stop."""
    async def t(env, c):
        await put_job(env, "j")
        poll = asyncio.ensure_future(lease(c, "w1", wait_s=20))
        await until(lambda: env.fleet.dispatcher.waiting == 1, what="the request to wait")
        t0 = time.monotonic()
        env.loop_task.cancel()
        res = await poll
        assert res["runs"] == [] and time.monotonic() - t0 < 5
        assert env.fleet.dispatcher.waiting == 0
        assert (await lease(c, "w2", wait_s=20))["runs"] == [] and time.monotonic() - t0 < 5
    run(t)


def test_waiting_requests_are_served_oldest_first_with_one_acquire_each():
    """Fair and herd-free: three workers wait; each run that comes goes to the oldest request
    still waiting, with one acquire for it, not one per waiting worker."""
    async def t(env, c):
        await put_job(env, "j")
        polls = []
        for k in range(3):
            polls.append(asyncio.ensure_future(lease(c, f"w{k}", wait_s=10, max=1)))
            await until(lambda: env.fleet.dispatcher.waiting == k + 1, what=f"request {k} waiting")  # noqa: B023 - called in this iteration
        acquires0 = len(env.ops("acquire"))
        got = []
        for k in range(3):
            rid = await trigger(env, "j")
            res = await polls[k]
            assert [g["id"] for g in res["runs"]] == [rid], (k, res)
            got.append(rid)
            assert all(not p.done() for p in polls[k + 1:]), "a later request was answered first"
        assert len(env.ops("acquire")) - acquires0 == 3
        assert [env.state.runs[r]["worker"] for r in got] == ["w0", "w1", "w2"]
    run(t)


def test_a_burst_of_runs_goes_to_as_many_of_the_oldest_requests_as_it_needs():
    async def t(env, c):
        await put_job(env, "j")
        polls = []
        for k in range(5):
            polls.append(asyncio.ensure_future(lease(c, f"w{k}", wait_s=10, max=2)))
            await until(lambda: env.fleet.dispatcher.waiting == k + 1, what=f"request {k} waiting")  # noqa: B023 - called in this iteration
        acquires0 = len(env.ops("acquire"))
        for _ in range(5):
            await trigger(env, "j")
        done = [await p for p in polls[:3]]
        assert [len(d["runs"]) for d in done] == [2, 2, 1]
        assert len(env.ops("acquire")) - acquires0 == 3  # three requests cover five runs
        assert not polls[3].done() and not polls[4].done()
        for p in polls[3:]:
            p.cancel()
        await asyncio.gather(*polls[3:], return_exceptions=True)
    run(t)


def test_idle_requests_of_many_groups_cost_no_reads_while_nothing_changes_but_a_full_look_a_second():
    """The dispatcher does not poll the replica while requests wait: it sleeps until the replica
    applies an entry (RaftNode.arm_applied), a due time comes or a request arrives, and looks at
    every group once a second (a tenant's bucket refills with time alone)."""
    async def t(env, c):
        polls = [asyncio.ensure_future(lease(c, f"w{k}", wait_s=10, labels={"host": f"h{k}"})) for k in range(40)]
        await until(lambda: env.fleet.dispatcher.waiting == 40, what="40 requests waiting")
        await asyncio.sleep(0.2)  # ok-sleep: lets the hellos' looks pass
        reads, real = count_reads(env)
        await asyncio.sleep(2.3)  # ok-sleep: the window whose reads are counted
        env.raft.read = real
        full = reads.count("ready_scan") // 40
        # Two or three full looks (one a second: at most three reads a group each, and a few of
        # the loop's own); polling every dispatch_poll_s read the replica ~100 times in this window.
        assert 2 <= full <= 3, (full, reads[:20])
        assert reads.count("applied_count") <= 2 * full + 2, reads
        assert len(reads) <= full * (3 * 40 + 4) + 4, (len(reads), full, collections.Counter(reads))
        # an entry applied wakes the dispatcher at once: a run for one of them is granted
        await put_job(env, "j", dict(SPEC, placement={"labels": {"host": "h7"}}))
        rid = await trigger(env, "j")
        assert [g["id"] for g in (await asyncio.wait_for(polls[7], 5))["runs"]] == [rid]
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    run(t)


def test_a_request_joining_a_group_with_no_work_costs_no_look_but_one_with_work_is_served_at_once():
    """An idle fleet's polls come back one by one: each used to wake the dispatcher for a full
    look (reads of the replica, a timer) that could not change anything for its group."""
    async def t(env, c):
        polls = [asyncio.ensure_future(lease(c, f"w{k}", wait_s=10, instance=f"i{k}")) for k in range(5)]
        await until(lambda: env.fleet.dispatcher.waiting == 5, what="5 requests waiting")
        await asyncio.sleep(0.2)  # ok-sleep: lets the hellos' looks pass
        reads, real = count_reads(env)
        # w0 comes back (its facts unchanged: no hello) into the quiet group
        again = asyncio.ensure_future(lease(c, "w0", wait_s=10, instance="i0"))
        await until(lambda: env.fleet.dispatcher.waiting == 6, what="the sixth request waiting")
        await asyncio.sleep(0.05)  # ok-sleep: the dispatcher would have looked by now
        env.raft.read = real
        assert "ready_scan" not in reads, reads  # no look: only the handler's own read
        # work for the group: the oldest request gets it at once, the newcomer after it
        await put_job(env, "j")
        rid = await trigger(env, "j")
        assert [g["id"] for g in (await asyncio.wait_for(polls[0], 5))["runs"]] == [rid]
        rid2 = await trigger(env, "j")
        assert [g["id"] for g in (await asyncio.wait_for(polls[1], 5))["runs"]] == [rid2]
        for p in polls[2:] + [again]:
            p.cancel()
        await asyncio.gather(*polls[2:], again, return_exceptions=True)
    run(t)


def test_a_look_reads_as_many_waiting_requests_as_a_scan_covers_not_every_one():
    """Thousands of idle workers in one group: a full look counts the runs its requests want
    only as far as a scan reads (dispatch_ready_scan_max), so its cost does not grow with the
    requests waiting (it summed all of them, and a look follows every new request)."""
    read_n = []

    class Counted(LeaseRequest):
        @property
        def n(self) -> int:
            read_n.append(1)
            return self._n

        @n.setter
        def n(self, v: int) -> None:
            self._n = v

    async def t():
        d = Dispatcher(FakeRaft(SchedulerState()), SystemClock(), None, None)  # type: ignore[arg-type]
        reqs = [Counted(f"w{k}", ["q"], {}, None, 1, 10_000) for k in range(2_000)]
        d._groups[reqs[0].key] = collections.deque(reqs)
        d._look()
        assert 0 < len(read_n) <= node_limits.dispatch_ready_scan_max
    asyncio.run(t())


def test_a_look_counts_no_ready_runs_for_a_group_whose_every_request_has_an_acquire_in_flight():
    """Under load a worker's requests mostly wait for their acquire's commit, and every apply and
    every acquire's end wakes the dispatcher: each look scanned up to the runs they want
    (placement checked run by run) to find that the acquires in flight cover them. A group with
    no request free to serve is passed over; one free request and it is counted again."""
    async def t():
        d = Dispatcher(FakeRaft(SchedulerState()), SystemClock(), None, None)  # type: ignore[arg-type]
        reads: list[str] = []
        real = d.raft.read

        def counted(fn, *args):
            reads.append(fn.__name__)
            return real(fn, *args)
        d.raft.read = counted  # type: ignore[method-assign]
        reqs = [LeaseRequest(f"w{k}", ["q"], {}, None, 32, 10_000) for k in range(2)]
        for r in reqs:
            r.in_flight = True
        key = reqs[0].key
        d._groups[key] = collections.deque(reqs)
        d._busy[key], d._cover[key] = 2, 64
        d._look()
        assert "ready_scan" not in reads
        d._groups[key].append(LeaseRequest("w2", ["q"], {}, None, 32, 10_000))
        d._dirty = True
        d._look()
        assert "ready_scan" in reads
    asyncio.run(t())


async def _dispatcher_over_queued_runs(service: Service, raft: FakeRaft, clock, n: int):
    """``n`` jobs of queue q, a run of each queued, and a dispatcher whose acquires are proposed
    (the workers' names in the list returned) and never answered (cancel its tasks at the end)."""
    for k in range(n):
        await service.put_job(f"j{k}", {**SPEC, "queue": "q"}, None)
        await service.trigger_job(f"j{k}", None)
    proposed: list[str] = []

    async def propose(cmd):
        proposed.append(cmd["worker"])
        await asyncio.Event().wait()
    return Dispatcher(raft, clock, propose, None), proposed  # type: ignore[arg-type]


def test_a_count_with_acquires_in_flight_passes_over_their_share_once_a_count_read_only_takeable_runs():
    """Under load a worker's request comes back while another's acquire is in flight: its count
    read the runs that acquire covers, then subtracted them (every run read about twice). Of the
    share in flight, what the group's counts found from the head, all runs its workers can take,
    is passed over unread, and each count reads on from there; a count that meets another's run
    (a placement here) counts from the head again."""
    async def t(placed_first: bool):
        clock = FakeClock()
        raft, service = _service(clock)
        if placed_first:  # runs of another worker's placement at the head of the queue
            await service.put_job("other", {**SPEC, "queue": "q", "placement": {"labels": {"zone": "b"}}}, None)
            for _ in range(10):
                await service.trigger_job("other", None)
            clock.advance(10)  # due before the others, whatever the run ids: first in the scan
        d, proposed = await _dispatcher_over_queued_runs(service, raft, clock, 100)
        clock.advance(10)
        scans: list[tuple[int, int, bool]] = []  # (skip, count, clean)
        real = raft.read

        def read(fn, *args):
            out = real(fn, *args)
            if fn.__name__ == "ready_scan":
                scans.append((args[-1], out[0], out[1]))
            return out
        raft.read = read  # type: ignore[method-assign]
        group: collections.deque = collections.deque()
        for k, w in enumerate("abc"):
            req = LeaseRequest(w, ["q"], {}, None, 32, 10_000)
            d._groups[req.key] = group
            group.append(req)
            d._dirty = True
            d._look()
            await until(lambda k=k: len(proposed) == k + 1, 2.0, f"request {w}'s acquire, the others' in flight")
        assert proposed == ["a", "b", "c"]
        if placed_first:  # from the head each time: the 10 others, the share in flight, and one more
            assert scans == [(0, 1, False), (0, 33, False), (0, 65, False)]
        else:  # one run is enough for a; then what was found is passed over, the rest read once
            assert scans == [(0, 1, True), (1, 32, True), (33, 32, True)]
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
    asyncio.run(t(False))
    asyncio.run(t(True))


def test_a_count_passes_over_only_what_counts_found_so_no_acquire_goes_out_for_runs_of_another_placement():
    """A count that stopped at the one run its request needed vouches for that run only: the
    next, with that acquire in flight, reads the rest of the share itself, and finds the runs of
    another placement among them (the first cut passed the 64 over unread, and sent an acquire
    that granted nothing: an entry in the log and a backoff, found by a review)."""
    async def t():
        clock = FakeClock()
        raft, service = _service(clock)
        d, proposed = await _dispatcher_over_queued_runs(service, raft, clock, 1)
        clock.advance(10)
        await service.put_job("other", {**SPEC, "queue": "q", "placement": {"labels": {"zone": "b"}}}, None)
        for _ in range(10):
            await service.trigger_job("other", None)
        clock.advance(10)
        for k in range(1, 64):
            await service.put_job(f"j{k}", {**SPEC, "queue": "q"}, None)
            await service.trigger_job(f"j{k}", None)
        clock.advance(10)
        a = LeaseRequest("a", ["q"], {}, None, 64, 10_000)
        d._groups[a.key] = collections.deque([a])
        d._look()
        await until(lambda: proposed == ["a"], 2.0, "a's acquire")
        d._groups[a.key].append(LeaseRequest("b", ["q"], {}, None, 64, 10_000))
        d._dirty = True
        d._look()
        assert [r.worker for r in d._groups[a.key] if r.in_flight] == ["a"]  # 64 ready for it: a's
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
    asyncio.run(t())


def _service(clock) -> tuple[FakeRaft, Service]:
    """A replica of its own (FakeRaft over a new state) and the service that writes to it."""
    raft = FakeRaft(SchedulerState())
    return raft, Service(raft, clock, "node-1")


def test_a_count_reads_as_far_as_the_picks_need_and_picks_as_a_full_count_would():
    """A group's count decides how many of its free requests get an acquire: as many of the
    oldest as cover it. It reads no further than what takes all of them (their n but the last
    one's, and one more; it read up to their whole want, each entry a run and a job looked up),
    and the picks are those a count of every ready run would make."""
    async def t(ready: int) -> tuple[list[str], list[int]]:
        state = SchedulerState()
        raft = FakeRaft(state)
        service = Service(raft, FakeClock(), "node-1")
        d, proposed = await _dispatcher_over_queued_runs(service, raft, service.clock, ready)
        service.clock.advance(10)
        found: list[int] = []
        real = raft.read

        def read(fn, *args):
            out = real(fn, *args)
            if fn.__name__ == "ready_scan":
                found.append(out[0])
            return out
        raft.read = read  # type: ignore[method-assign]
        reqs = [LeaseRequest(w, ["q"], {}, None, n, 10_000) for w, n in (("a", 10), ("b", 20), ("c", 30))]
        d._groups[reqs[0].key] = collections.deque(reqs)
        d._look()
        await until(lambda: len(d._tasks) == 0 or len(proposed) == len(d._tasks), 2.0, "the acquires proposed")
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
        return proposed, found
    for ready, picks, read in ((5, "a", 5), (10, "a", 10), (11, "ab", 11), (30, "ab", 30), (31, "abc", 31),
                               (100, "abc", 31)):
        proposed, found = asyncio.run(t(ready))
        assert (proposed, found) == (list(picks), [read]), ready


def test_an_acquire_that_grants_nothing_makes_its_group_count_from_the_head_again():
    """A count that passed over the share in flight counts runs another placement's that fell
    due among them (the entries passed over are not read): the acquire it sends then grants
    nothing, and the group's next count reads from the head, where those runs are."""
    async def t():
        clock = FakeClock()
        raft, service = _service(clock)
        await service.put_job("other", {**SPEC, "queue": "q", "placement": {"labels": {"zone": "b"}}}, None)
        await service.put_job("j", {**SPEC, "queue": "q"}, None)
        for _ in range(64):
            await service.trigger_job("other", None)
        clock.advance(10)  # the five after them in the scan
        for _ in range(5):
            await service.trigger_job("j", None)
        clock.advance(10)

        async def propose(cmd):
            return {"ok": True, "runs": []}  # what acquire grants: another worker took the five
        d = Dispatcher(raft, clock, propose, None)  # type: ignore[arg-type]
        scans: list[int] = []
        real = raft.read

        def read(fn, *args):
            if fn.__name__ == "ready_scan":
                scans.append(args[-1])
            return real(fn, *args)
        raft.read = read  # type: ignore[method-assign]
        head = LeaseRequest("a", ["q"], {}, None, 64, 10_000)
        head.in_flight = True
        free = LeaseRequest("b", ["q"], {}, None, 64, 10_000)
        key = head.key
        d._groups[key] = collections.deque([head, free])
        d._busy[key], d._cover[key] = 1, 64
        d._known[key] = 64  # as counts of the share in flight left it, before the others fell due
        d._look()
        assert scans == [64]  # passed over the 64 (all "other"'s), counted the five past them
        await until(lambda: d.stats()["acquires_empty"] == 1, 2.0, "the free request's empty acquire")
        assert key not in d._known
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
    asyncio.run(t())


def test_requests_gone_behind_one_in_flight_do_not_hide_a_free_request_beyond_the_scan():
    """The counted prefix can hold requests whose client went away (not yet unlinked: only a gone
    head is) and none free, while a free request waits beyond it: their runs are not covered by
    any acquire, so the look counts, and serves the free request now rather than after the acquire
    in flight ends (a review found the first cut passed the group over)."""
    async def t():
        clock = SystemClock()
        raft, service = _service(clock)
        d, proposed = await _dispatcher_over_queued_runs(service, raft, clock, 200)
        head = LeaseRequest("a", ["q"], {}, None, limits.acquire_runs_max, 10_000)
        head.in_flight = True
        gone = [LeaseRequest(f"g{k}", ["q"], {}, None, limits.acquire_runs_max, 10_000, alive=lambda: False)
                for k in range(2)]
        free = LeaseRequest("c", ["q"], {}, None, 10, 10_000)
        key = head.key
        d._groups[key] = collections.deque([head, *gone, free])
        d._busy[key], d._cover[key] = 1, head.n
        d._look()
        await until(lambda: proposed == ["c"], 2.0, "the free request's acquire")
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
    asyncio.run(t())


def test_free_requests_past_gone_ones_get_as_many_acquires_in_one_look_as_a_full_count_gives():
    """Requests gone but not yet unlinked fill the count's want: the free ones past them are
    picked as a count of every ready run would pick them, two here, in one look (the first cut
    looked at the first free one only, and served one a look: found by a review)."""
    async def t():
        clock = SystemClock()
        raft, service = _service(clock)
        d, proposed = await _dispatcher_over_queued_runs(service, raft, clock, 300)
        head = LeaseRequest("h", ["q"], {}, None, 100, 10_000)
        head.in_flight = True
        gone = [LeaseRequest(f"g{k}", ["q"], {}, None, 100, 10_000, alive=lambda: False) for k in range(2)]
        free = [LeaseRequest(f"f{k}", ["q"], {}, None, 100, 10_000) for k in range(3)]
        key = head.key
        d._groups[key] = collections.deque([head, *gone, *free])
        d._busy[key], d._cover[key] = 1, head.n
        d._look()
        assert [r.worker for r in d._groups[key] if r.in_flight] == ["h", "f0", "f1"]
        for task in list(d._tasks):
            task.cancel()
        await asyncio.gather(*d._tasks, return_exceptions=True)
    asyncio.run(t())


def test_an_idle_long_poll_leaves_no_audit_record_but_a_registration_and_a_grant_do(tmp_path):
    """Ten thousand idle workers poll 500 times a second (wait_s 20): one audit record each
    pushed an admin's records out of the audit log's 80 MiB within the hour, and cost the node
    more than any other part of a poll. A poll answered with no runs that registered nothing
    changed nothing and is not recorded; the first one (a hello) and one granted a run are."""
    audit = AuditLog(str(tmp_path / "audit.jsonl"), "node-1")

    async def t(env, c):
        await put_job(env, "j")
        for _ in range(3):
            assert (await lease(c, "w1", wait_s=0))["runs"] == []
        rid = await trigger(env, "j")
        assert [g["id"] for g in (await lease(c, "w1", wait_s=5))["runs"]] == [rid]
        r = await c.post(path("w1", "lease"), data=json.dumps(lease_body(max=0)), headers=AUTH)
        assert r.status == 422
    run(t, audit)
    audit.close()
    recs = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    leases = [r["status"] for r in recs if r["route"] == "/v1/workers/{id}/lease"]
    assert leases == [200, 200, 422], recs  # the hello, the grant, the refusal; not the two idle polls


def test_placement_sends_a_run_to_the_request_whose_labels_fit_even_if_it_came_later():
    async def t(env, c):
        await put_job(env, "gpu", dict(SPEC, placement={"labels": {"pool": "gpu"}}))
        cpu = asyncio.ensure_future(lease(c, "cpu-1", wait_s=1.0, labels={"pool": "cpu"}))
        await until(lambda: env.fleet.dispatcher.waiting == 1)
        gpu = asyncio.ensure_future(lease(c, "gpu-1", wait_s=10, labels={"pool": "gpu"}))
        await until(lambda: env.fleet.dispatcher.waiting == 2)
        rid = await trigger(env, "gpu")
        assert [g["id"] for g in (await gpu)["runs"]] == [rid]
        assert (await cpu)["runs"] == []
        # No acquire was wasted on the worker whose labels do not fit.
        assert {a["worker"] for a in env.ops("acquire")} == {"gpu-1"}
    run(t)


def test_a_dedicated_workers_request_waits_for_a_run_placed_on_it_and_takes_no_other():
    async def t(env, c):
        app = {"raftsched.app": "reports"}
        await put_job(env, "report", dict(SPEC, placement={"labels": app}))
        await put_job(env, "plain")
        plain = await trigger(env, "plain")
        ded = asyncio.ensure_future(lease(c, "app-1", wait_s=10, labels=app, dedicated=["raftsched.app"]))
        await until(lambda: env.fleet.dispatcher.waiting == 1)
        assert env.state.workers["app-1"]["dedicated"] == ["raftsched.app"]
        rid = await trigger(env, "report")
        assert [g["id"] for g in (await ded)["runs"]] == [rid]
        # The run without placement was never offered to it; an ordinary worker takes it.
        assert env.state.runs[plain]["state"] == "queued"
        assert [g["id"] for g in (await lease(c, "any-1", wait_s=1.0))["runs"]] == [plain]
        assert {a["worker"] for a in env.ops("acquire")} == {"app-1", "any-1"}
        r = await c.get(path("app-1"), headers=AUTH)
        assert (await r.json())["dedicated"] == ["raftsched.app"]
    run(t)


def test_a_draining_worker_hears_it_at_once_from_lease_and_heartbeat():
    async def t(env, c):
        await put_job(env, "j")
        await trigger(env, "j")
        g = (await lease(c, "w1", wait_s=5))["runs"][0]
        assert (await post(c, path("w1", "drain"), {}))["state"] == "draining"
        t0 = time.monotonic()
        assert await lease(c, "w1", wait_s=10) == {"runs": [], "draining": True}
        assert time.monotonic() - t0 < 2
        hb = await post(c, path("w1", "heartbeat"), {"leases": [[g["id"], g["token"]]], "ttl_ms": 10_000})
        assert hb == {"extended": 1, "lost": [], "draining": True}
        r = await c.post(path("nobody", "drain"), headers=AUTH)
        assert r.status == 404
    run(t)


def test_a_worker_that_leaves_is_draining_at_once_and_its_next_instance_is_active_again():
    """A worker stopped cleanly (SIGTERM) showed active in the registry until unseen for
    worker_gone_ms (30 s), its runs placed nowhere else said nothing of it meanwhile. Its leave
    drains it (the command an operator's drain proposes), for the instance that leaves only;
    another instance's hello makes it active again. Bad bodies name their field, an unknown
    worker is 404, and a token of other tenants may not drain it."""
    async def t(env, c):
        await lease(c, "w1", wait_s=0)  # registered, instance i1
        for body, field in (({}, "instance"), ({"instance": ""}, "instance"), ({"instance": 5}, "instance"),
                            ({"instance": "i1", "reason": 7}, "reason"), ({"instance": "i1", "why": "x"}, "why")):
            e = await post(c, path("w1", "leave"), body, status=422)
            assert e["error"]["field"] == field, (body, e)
        assert env.state.workers["w1"]["state"] == "active" and not env.ops("drain_worker")
        e = await post(c, path("nobody", "leave"), {"instance": "i1"}, status=404)
        assert e["error"]["field"] == "worker"
        # another process under the id since: nothing changes
        assert await post(c, path("w1", "leave"), {"instance": "i0"}) == {"worker": "w1", "state": "active",
                                                                           "changed": False}
        assert env.state.workers["w1"]["state"] == "active" and not env.ops("drain_worker")
        billing = bearer((await worker_token(c, tenants=["billing"]))["token"])
        e = await post(c, path("w1", "leave"), {"instance": "i1"}, status=403, headers=billing)
        assert e["error"]["field"] == "worker" and env.state.workers["w1"]["state"] == "active"
        assert await post(c, path("w1", "leave"), {"instance": "i1", "reason": "SIGTERM"}) == \
            {"worker": "w1", "state": "draining", "changed": True}
        assert env.state.workers["w1"]["state"] == "draining"
        assert await lease(c, "w1", wait_s=0) == {"runs": [], "draining": True}
        r = await c.get(path("w1"), headers=AUTH)
        assert (await r.json())["state"] == "draining"
        assert (await post(c, path("w1", "leave"), {"instance": "i1"}))["changed"] is False  # again: nothing new
        await lease(c, "w1", wait_s=0, instance="i2")  # the worker started again
        assert env.state.workers["w1"]["state"] == "active"
    run(t)


def test_a_drain_reaches_a_waiting_idle_worker_at_once_and_no_other():
    async def t(env, c):
        w1 = asyncio.ensure_future(lease(c, "w1", wait_s=30))
        w2 = asyncio.ensure_future(lease(c, "w2", wait_s=30, instance="i2"))
        await until(lambda: env.fleet.dispatcher.waiting == 2, what="both requests to wait")
        t0 = time.monotonic()
        assert (await post(c, path("w1", "drain"), {}))["state"] == "draining"
        assert await asyncio.wait_for(w1, 5) == {"runs": [], "draining": True}
        assert time.monotonic() - t0 < 3  # not at the end of its 30 s wait
        assert not w2.done() and env.fleet.dispatcher.waiting == 1
        # a run now goes to w2, not to the drained w1
        await put_job(env, "j")
        rid = await trigger(env, "j")
        assert [g["id"] for g in (await asyncio.wait_for(w2, 5))["runs"]] == [rid]
    run(t)


def test_a_node_with_many_workers_waiting_asks_idle_ones_to_wait_longer(monkeypatch):
    # 2 idle answers a second: five requests waiting 0.3 s each would be ~17 a second
    monkeypatch.setattr(node_limits, "lease_idle_answers_per_s", 2.0)

    async def t(env, c):
        answers = await asyncio.gather(*(lease(c, f"w{k}", wait_s=0.3, instance=f"i{k}") for k in range(5)))
        hints = [a.get("next_wait_s") for a in answers]
        assert all(h is not None for h in hints[:3]), hints  # at least 3 still waited behind each of these
        assert max(h for h in hints if h is not None) >= 1.5 and all(h is None or h <= 60 for h in hints)
        # one worker alone waits as it asked
        assert "next_wait_s" not in await lease(c, "w0", wait_s=0.3, instance="i0")
        # never beyond what a node accepts
        monkeypatch.setattr(node_limits, "lease_idle_answers_per_s", 0.001)
        answers = await asyncio.gather(*(lease(c, f"w{k}", wait_s=0.3, instance=f"i{k}") for k in range(3)))
        assert max(a.get("next_wait_s") or 0 for a in answers) == 60
        # an answer with runs, or a drain, carries no hint
        await put_job(env, "j")
        await trigger(env, "j")
        got = await lease(c, "w0", wait_s=5, instance="i0")
        assert got["runs"] and "next_wait_s" not in got
    run(t)


def test_heartbeats_arriving_together_are_proposed_together_after_the_linger(monkeypatch):
    """A busy fleet's heartbeats were each a log entry of their own (a round of Raft messages,
    journal writes and syncs on three nodes: ~2.4 ms of node CPU a heartbeat at 200 a second).
    A node holds each up to heartbeat_linger_s and proposes those held in one turn of the event
    loop, which the replication layer commits as one entry; each still gets its own answer."""
    monkeypatch.setattr(node_limits, "heartbeat_linger_s", 1.0)

    async def t(env, c):
        await put_job(env, "j")
        for _ in range(3):
            await trigger(env, "j")
        grants = (await lease(c, "w1", wait_s=5, max=3))["runs"]
        assert len(grants) == 3
        proposed_at = []
        real = env.raft.propose

        async def propose(data, timeout_s=5.0):
            if commands.decode(data)["op"] == "heartbeat":
                proposed_at.append(asyncio.get_running_loop().time())
            return await real(data, timeout_s)

        env.raft.propose = propose
        flushes = []
        real_flush = env.fleet._propose_lingered

        def flush():
            flushes.append(len(env.fleet._lingering))
            real_flush()

        env.fleet._propose_lingered = flush
        t0 = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(post(c, path("w1", "heartbeat"), {"leases": [[g["id"], g["token"]]],
                                                                           "ttl_ms": 5000}) for g in grants))
        assert all(a["extended"] == 1 and a["lost"] == [] for a in answers), answers
        assert len(proposed_at) == 3
        assert min(proposed_at) >= t0 + 1.0 - 0.01, "held for the linger, not proposed on arrival"
        assert flushes == [3], "proposed together, in one turn"
        assert all(env.state.runs[g["id"]]["renewals"] == 1 for g in grants)
    run(t)


def test_a_node_with_many_workers_heartbeating_asks_them_to_heartbeat_less_often(monkeypatch):
    """As Nomad's servers stretch their clients' heartbeat TTL: past heartbeats_per_s at their
    intervals, a heartbeat's answer asks for a longer one (``next_heartbeat_s``), never longer
    than a quarter of the lease TTL (a lease survives a heartbeat that timed out); a worker that
    stopped heartbeating stops counting."""
    monkeypatch.setattr(node_limits, "heartbeats_per_s", 10.0)
    clock = FakeClock()
    fleet = Fleet(FakeRaft(SchedulerState()), clock, "node-1")
    hints = [fleet.next_heartbeat_s(f"w{k}", 30_000) for k in range(25)]
    assert hints[:10] == [None] * 10, hints  # up to 10 workers at 1 s: their own
    assert hints[10:] == [round((k + 1) / 10, 1) for k in range(10, 25)], hints
    assert fleet.next_heartbeat_s("w0", 30_000) == 2.5  # a worker already counted is counted once
    assert fleet.next_heartbeat_s("short", 3_000) is None  # a third of its TTL is 1 s: never longer
    assert fleet.next_heartbeat_s("mid", 6_000) == 1.5  # capped at a quarter of its TTL
    clock.advance(1000 * (node_limits.heartbeat_seen_s + 6))  # past twice every interval asked (2.7 s)
    for _ in range(4):  # each heartbeat forgets up to 8 of the oldest that went quiet
        fleet.next_heartbeat_s("w0", 30_000)
    assert fleet.next_heartbeat_s("w0", 30_000) is None and len(fleet._heartbeating) == 1

    async def t(env, c):
        await put_job(env, "j")
        await trigger(env, "j")
        [g] = (await lease(c, "w1", wait_s=5))["runs"]
        body = {"leases": [[g["id"], g["token"]]], "ttl_ms": 30_000}
        assert "next_heartbeat_s" not in await post(c, path("w1", "heartbeat"), body)
        for k in range(30):
            env.fleet.next_heartbeat_s(f"other{k}", 30_000)
        assert (await post(c, path("w1", "heartbeat"), body))["next_heartbeat_s"] == 3.1
    run(t)


def test_a_run_due_while_an_acquire_is_in_flight_gets_its_own_at_once():
    """Runs falling due every 20 ms among idle workers: the next run's acquire is proposed while
    the previous one's is still on its way through the log, not after it (under load a commit
    takes tens of ms, and runs queued behind each other's commits)."""
    async def t(env, c):
        await put_job(env, "j")
        gate = asyncio.Event()
        real = env.raft.propose

        async def slow(data, timeout_s=5.0):
            if commands.decode(data)["op"] == "acquire":
                await gate.wait()
            return await real(data, timeout_s)
        env.raft.propose = slow
        polls = []
        for k in range(2):
            polls.append(asyncio.ensure_future(lease(c, f"w{k}", wait_s=10, max=1)))
            await until(lambda: env.fleet.dispatcher.waiting == k + 1, what=f"request {k} waiting")  # noqa: B023 - called in this iteration
        first = await trigger(env, "j")
        await until(lambda: env.fleet.dispatcher.stats()["acquires"] == 1, what="the first acquire")
        second = await trigger(env, "j")
        await until(lambda: env.fleet.dispatcher.stats()["acquires"] == 2, 2.0, "the second acquire, while the first waits")
        gate.set()
        assert [[g["id"] for g in (await p)["runs"]] for p in polls] == [[first], [second]]
    run(t)


def test_a_followers_dispatcher_leaves_a_run_to_the_leaders_for_the_grace_then_acquires_it():
    """One acquire a run, not one per node: a follower's dispatcher counts a run only once it has
    been due for dispatch_follower_grace_ms (the leader's acquire usually reaches its replica
    first); after that it acquires it, for a run only its workers wait for."""
    clock = FakeClock()

    async def t(env, c):
        env.raft.leader = False
        await put_job(env, "j")
        poll = asyncio.ensure_future(lease(c, "w1", wait_s=10))
        await until(lambda: env.fleet.dispatcher.waiting == 1, what="the request to wait")
        rid = await trigger(env, "j")  # due now, by the (stopped) clock
        await asyncio.sleep(0.3)  # ok-sleep: ~15 looks of the dispatcher, by real time, none of which may acquire
        assert env.fleet.dispatcher.stats()["acquires"] == 0
        clock.advance(node_limits.dispatch_follower_grace_ms)
        assert [g["id"] for g in (await poll)["runs"]] == [rid]
    run(t, clock=clock)


def test_a_request_given_up_while_its_acquire_is_in_flight_gives_its_runs_back():
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        gate = asyncio.Event()
        real = env.raft.propose

        async def slow(data, timeout_s=5.0):
            if commands.decode(data)["op"] == "acquire":
                await gate.wait()
            return await real(data, timeout_s)
        env.raft.propose = slow
        poll = asyncio.ensure_future(lease(c, "w1", wait_s=5))
        await until(lambda: env.fleet.dispatcher.stats()["acquires"] == 1, what="the acquire to be proposed")
        poll.cancel()  # the client goes away while the acquire is in flight
        await asyncio.gather(poll, return_exceptions=True)
        await asyncio.sleep(0.1)  # ok-sleep: lets the server notice the closed connection
        gate.set()
        await until(lambda: env.ops("release"), what="the runs to be given back")
        run_ = env.state.runs[rid]
        assert run_["state"] == "queued" and run_["attempt"] == 2 and run_["attempts"][-1]["released"]
    run(t)


# ---------------------------------------------------------------------------- heartbeat, complete, release
def test_heartbeat_complete_and_release_judge_each_lease_by_its_token():
    async def t(env, c):
        await put_job(env, "j")
        ids = [await trigger(env, "j") for _ in range(3)]
        grants = {g["id"]: g for g in (await lease(c, "w1", wait_s=5, max=3))["runs"]}
        assert set(grants) == set(ids)
        a, b, d = ids
        hb = await post(c, path("w1", "heartbeat"), {"leases": [[a, grants[a]["token"]], [b, grants[b]["token"] + 99]],
                                                     "ttl_ms": 5000})
        assert hb == {"extended": 1, "lost": [b], "draining": False}
        key = {"Idempotency-Key": "batch-1", **AUTH}
        results = [{"run": a, "token": grants[a]["token"], "success": True},
                   {"run": b, "token": grants[b]["token"] - 1, "success": True}]
        res = await post(c, path("w1", "complete"), {"results": results}, headers=key)
        assert res["results"][0]["ok"] and not res["results"][1]["ok"]
        assert res["results"][1]["error"]["code"] == "conflict"
        # A retry of the same batch acts once.
        again = await post(c, path("w1", "complete"), {"results": results}, headers=key)
        assert again["duplicate"] is True and again["results"] == res["results"]
        # The same key with other outcomes: refused, not answered with the first batch's runs.
        other = [{"run": d, "token": grants[d]["token"], "success": True}]
        reused = await post(c, path("w1", "complete"), {"results": other}, status=409, headers=key)
        assert reused["error"]["field"] == "Idempotency-Key"
        assert env.state.runs[a]["state"] == "succeeded" and env.state.runs[b]["state"] == "running"
        assert env.state.runs[d]["state"] == "running"
        rel = await post(c, path("w1", "release"), {"leases": [[d, grants[d]["token"]], [a, grants[a]["token"]]],
                                                    "reason": "draining"})
        assert rel == {"released": [d], "lost": [a]}
        assert env.state.runs[d]["state"] == "queued" and env.state.runs[d]["attempt"] == 2
        assert "unstarted" not in env.state.runs[d]["attempts"][-1]
        bad = await post(c, path("w1", "release"), {"leases": [], "not_started": "yes"}, status=422)
        assert bad["error"]["field"] == "not_started"
        g2 = (await lease(c, "w1", wait_s=5))["runs"][0]
        rel = await post(c, path("w1", "release"), {"leases": [[g2["id"], g2["token"]]], "not_started": True})
        assert rel["released"] == [g2["id"]] and env.state.runs[g2["id"]]["attempts"][-1]["unstarted"] is True
    run(t)


# ---------------------------------------------------------------------------- admin, seen, forget
def test_workers_are_listed_with_the_runs_they_hold():
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        g = (await lease(c, "w1", wait_s=5))["runs"][0]
        assert (await lease(c, "w2", wait_s=0, labels={"pool": "a"}))["runs"] == []
        body = await (await c.get("/v1/workers", headers=AUTH)).json()
        assert [w["id"] for w in body["workers"]] == ["w1", "w2"] and body["total"] == 2
        w1 = body["workers"][0]
        assert (w1["status"], w1["held"], w1["grants"], w1["kind"]) == ("active", 1, 1, "remote")
        assert w1["last_seen"].endswith("Z")
        one = await (await c.get(path("w1"), headers=AUTH)).json()
        assert [r["id"] for r in one["runs"]] == [rid] and one["runs"][0]["token"] == g["token"]
        assert one["runs"][0]["lease_deadline"].endswith("Z")
        assert (await c.get(path("nobody"), headers=AUTH)).status == 404
        q = (await (await c.get("/v1/queues", headers=AUTH)).json())["queues"][0]
        assert q["unplaceable"] == 0
        m = env.fleet.collector()
        fams = {fam.name: fam for fam in m.collect()}
        assert {"raftsched_workers", "raftsched_worker_runs_held", "raftsched_runs_unplaceable"} <= set(fams)

        def values(name):
            return {tuple(sm.labels.values()): sm.value for sm in fams[name].samples}
        assert values("raftsched_worker_lease_grants") == {("w1",): 1, ("w2",): 0}
        assert values("raftsched_fleet_lease_grants") == {(): 1} and values("raftsched_fleet_runs_held") == {(): 1}
        assert values("raftsched_worker_series") == {(): 1}
        # A fleet larger than --metrics-workers-max: the fleet's totals, no series per worker.
        env.fleet.metrics_workers_max = 1
        fams = {fam.name: fam for fam in m.collect()}
        assert "raftsched_worker_lease_grants" not in fams and "raftsched_worker_runs_held" not in fams
        assert values("raftsched_fleet_lease_grants") == {(): 1} and values("raftsched_worker_series") == {(): 0}
        # A worker forgotten (its record gone from the registry): its grants stay in the total, which
        # never goes down (Prometheus would read a reset, and rate() the whole total at once).
        del env.state.workers["w1"]
        fams = {fam.name: fam for fam in m.collect()}
        assert values("raftsched_fleet_lease_grants") == {(): 1}
        env.fleet.metrics_workers_max = 0  # 0: never per worker, however few
        fams = {fam.name: fam for fam in m.collect()}
        assert values("raftsched_worker_series") == {(): 0} and "raftsched_worker_lease_grants" not in fams
    run(t)


def test_the_walk_of_unplaceable_runs_runs_outside_the_replicas_lock_for_metrics_and_queues(monkeypatch):
    """Counting the queued runs no live worker may take walks every queued run when placements
    are in use (an SDK app's jobs always have one): under the replica's lock, a scrape of a node
    holding a million queued runs held the Raft thread for seconds. The scrape and GET /v1/queues
    now take the heaps under the lock and walk them outside it (and off the event loop); so does
    GET /v1/queues's count of ready runs, which walked every queued run whose due had come."""

    async def t(env, c):
        await put_job(env, "gpu", dict(SPEC, placement={"labels": {"pool": "gpu"}}))
        await trigger(env, "gpu")
        await lease(c, "w1", wait_s=0)  # a live worker without the label: the run is unplaceable
        calls = under_lock(env, monkeypatch, "unplaceable_walk", "_ready_in")
        walked, ready_walked = calls["unplaceable_walk"], calls["_ready_in"]
        fams = {fam.name: fam for fam in env.fleet.collector().collect()}
        assert [(sm.labels, sm.value) for sm in fams["raftsched_runs_unplaceable"].samples] == [({"queue": "default"}, 1)]
        q = (await (await c.get("/v1/queues", headers=AUTH)).json())["queues"][0]
        assert q["unplaceable"] == 1 and q["ready"] == 1 and q["oldest_waiting_age_ms"] is not None
        assert walked == [False, False] and ready_walked == [False]
    run(t)


def test_a_node_reports_the_workers_that_contacted_it_or_wait_at_it():
    async def t(env, c):
        await lease(c, "w1", wait_s=0)
        poll = asyncio.ensure_future(lease(c, "w2", wait_s=10))
        await until(lambda: env.fleet.dispatcher.waiting == 1)
        assert await env.fleet.report_seen() == 2
        seen = env.ops("workers_seen")[-1]
        assert seen["workers"] == ["w1", "w2"] and seen["node"] == "node-1"
        # w1 did not come back; w2 still waits: only it is reported next time.
        assert await env.fleet.report_seen() == 1 and env.ops("workers_seen")[-1]["workers"] == ["w2"]
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
    run(t)


def test_the_leader_forgets_workers_gone_long_enough():
    async def t(env, c):
        await lease(c, "old", wait_s=0)
        assert await env.fleet.forget() == []
        env.state.workers["old"]["last_seen"] -= limits.worker_forget_ms + 1  # as if an hour passed
        assert await env.fleet.forget() == ["old"] and "old" not in env.state.workers
    run(t)


# ---------------------------------------------------------------------------- worker tokens: bound, limited
async def worker_token(c, **body) -> dict:
    return await post(c, "/v1/tokens", dict(role="worker", **body), status=201)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_a_worker_token_bound_to_ids_speaks_for_those_ids_only():
    async def t(env, c):
        tok = await worker_token(c, workers=["w1", "w2"])
        assert tok["workers"] == ["w1", "w2"]
        h = bearer(tok["token"])
        await put_job(env, "j")
        rid = await trigger(env, "j")
        g = (await post(c, path("w1", "lease"), lease_body(wait_s=5), headers=h))["runs"][0]
        assert g["id"] == rid
        before = env.state.snapshot()
        for what, body in (("lease", lease_body(wait_s=0)), ("heartbeat", {"leases": [[rid, g["token"]]]}),
                           ("complete", {"results": [{"run": rid, "token": g["token"], "success": True}]}),
                           ("release", {"leases": [[rid, g["token"]]]})):
            e = await post(c, path("w3", what), body, status=403, headers=h)
            assert e["error"]["field"] == "id" and "w3" in e["error"]["message"] and "w1, w2" in e["error"]["message"]
        assert env.state.snapshot() == before, "a refused request proposes nothing"
        assert "w3" not in env.state.workers and env.state.runs[rid]["state"] == "running"
        # Nor can it finish another worker's run with that run's fencing token (a counter's value).
        await put_job(env, "k")
        other = await trigger(env, "k")
        og = (await lease(c, "elsewhere", wait_s=5))["runs"][0]
        res = await post(c, path("w1", "complete"), {"results": [{"run": other, "token": og["token"], "success": False}]},
                         headers=h)
        assert res["results"][0]["error"]["code_detail"] == "stale_token"
        assert env.state.runs[other]["state"] == "running" and env.state.runs[other]["worker"] == "elsewhere"
        # For its own ids it does everything the worker protocol allows.
        done = await post(c, path("w1", "complete"), {"results": [{"run": rid, "token": g["token"], "success": True}]},
                          headers=h)
        assert done["results"][0]["ok"] and env.state.runs[rid]["state"] == "succeeded"
        listed = {t["id"]: t for t in (await (await c.get("/v1/tokens", headers=AUTH)).json())["tokens"]}
        assert listed[tok["id"]]["workers"] == ["w1", "w2"] and listed["bootstrap"]["workers"] is None
    run(t)


def test_a_worker_token_limited_to_tenants_is_granted_their_runs_only_and_reports_only_on_them():
    async def t(env, c):
        await put_job(env, "bill", dict(SPEC, tenant="billing"))
        await put_job(env, "ads", dict(SPEC, tenant="ads"))
        ads = await trigger(env, "ads")
        bill = await trigger(env, "bill")
        tok = await worker_token(c, tenants=["billing"])
        h = bearer(tok["token"])
        # The ads run is the older: an unlimited worker would be granted it first.
        got = (await post(c, path("wb", "lease"), lease_body(wait_s=5, max=4), headers=h))["runs"]
        assert [g["id"] for g in got] == [bill]
        assert env.state.runs[ads]["state"] == "queued"
        assert all(a["tenants"] == ["billing"] for a in env.ops("acquire"))
        assert env.state.workers["wb"]["tenants"] == ["billing"]
        # Nothing else is ready for it: its long-poll waits, proposing no acquire for the ads run.
        n = len(env.ops("acquire"))
        assert (await post(c, path("wb", "lease"), lease_body(wait_s=0.3), headers=h))["runs"] == []
        assert len(env.ops("acquire")) == n
        # The registry and the queue say why the ads run waits: no live worker takes its tenant.
        w = await (await c.get(path("wb"), headers=AUTH)).json()
        assert w["tenants"] == ["billing"]
        run_view = await (await c.get(f"/v1/runs/{ads}", headers=AUTH)).json()
        assert run_view["waiting_for"] == "no worker matches its placement"
        q = (await (await c.get("/v1/queues", headers=AUTH)).json())["queues"][0]
        assert q["unplaceable"] == 1
        # Reports on a run of another tenant are answered as for a run it does not hold, and
        # change nothing, even with the run's right fencing token.
        ads_g = (await lease(c, "any", wait_s=5))["runs"][0]
        assert ads_g["id"] == ads
        hb = await post(c, path("wb", "heartbeat"), {"leases": [[ads, ads_g["token"]]]}, headers=h)
        assert hb["lost"] == [ads] and hb["extended"] == 0
        res = await post(c, path("wb", "complete"), {"results": [{"run": ads, "token": ads_g["token"], "success": True}]},
                         headers=h)
        assert res["results"] == [{"ok": False, "run": ads, "error": {"code": "not_found", "message": f"no run {ads!r}",
                                                                      "field": "run"}}]
        rel = await post(c, path("wb", "release"), {"leases": [[ads, ads_g["token"]]]}, headers=h)
        assert rel == {"released": [], "lost": [ads]}
        assert env.state.runs[ads]["state"] == "running" and env.state.runs[ads]["worker"] == "any"
        # Its own run, in one batch with the other tenant's: judged each alone, in order.
        mixed = [{"run": ads, "token": ads_g["token"], "success": True},
                 {"run": bill, "token": got[0]["token"], "success": True}]
        res = await post(c, path("wb", "complete"), {"results": mixed}, headers=h)
        assert [r["ok"] for r in res["results"]] == [False, True] and res["results"][1]["run"] == bill
        assert env.state.runs[bill]["state"] == "succeeded" and env.state.runs[ads]["state"] == "running"
        # The same worker id spoken for by an unlimited token: registered again without tenants.
        await lease(c, "wb", wait_s=0)
        assert "tenants" not in env.state.workers["wb"]
    run(t)


def test_lease_and_heartbeat_answers_carry_the_nodes_cluster_time_when_it_knows_it():
    """A remote worker starts no run before its slot by the cluster's clock, which it learns from
    these answers (worker/remote.py); a node that does not know it (FakeRaft: no Raft traffic)
    says nothing, as a node of an earlier version does."""
    async def t(env, c):
        await put_job(env, "j")
        await trigger(env, "j")
        g = (await lease(c, "w1", wait_s=5))["runs"][0]
        assert "cluster_ms" not in await lease(c, "w1", wait_s=0)
        env.raft.cluster_ms = lambda: 1_800_000_123_456
        assert (await lease(c, "w1", wait_s=0))["cluster_ms"] == 1_800_000_123_456
        hb = await post(c, path("w1", "heartbeat"), {"leases": [[g["id"], g["token"]]], "ttl_ms": 10_000})
        assert hb["cluster_ms"] == 1_800_000_123_456 and hb["extended"] == 1
    run(t)


def test_a_worker_token_limited_to_tenants_cannot_take_the_id_of_a_worker_of_other_tenants():
    """A lease request says hello for its worker id: from a token limited to tenants, for an id
    registered by a token of others (or of every tenant), it would rewrite that worker's facts and
    tenants, and make a drained one active again. It is refused, changing nothing; a token of the
    same tenants may speak for the id."""
    async def t(env, c):
        await lease(c, "shared-w", wait_s=0)  # an unlimited worker
        before = dict(env.state.workers["shared-w"])
        billing = bearer((await worker_token(c, tenants=["billing"]))["token"])
        e = await post(c, path("shared-w", "lease"), lease_body(wait_s=0, instance="i9"), status=403, headers=billing)
        assert e["error"]["field"] == "worker", e
        assert env.state.workers["shared-w"] == before
        await post(c, path("bill-w", "lease"), lease_body(wait_s=0), headers=billing)
        ads = bearer((await worker_token(c, tenants=["ads"]))["token"])
        await post(c, path("bill-w", "lease"), lease_body(wait_s=0), status=403, headers=ads)
        both = bearer((await worker_token(c, tenants=["billing", "ads"]))["token"])
        await post(c, path("bill-w", "lease"), lease_body(wait_s=0), headers=both)
        again = bearer((await worker_token(c, tenants=["billing"]))["token"])
        await post(c, path("bill-w", "lease"), lease_body(wait_s=0), status=403, headers=again)  # now of both
    run(t)


def test_a_worker_that_says_its_handlers_is_granted_only_their_runs_and_a_long_poll_waits_past_others():
    """A rolling deploy (docs/sdk.md, "Versions"): a worker of the app's older version says the
    targets it has handlers for, and a run of a job only the newer version declares waits for a
    worker that has it instead of failing on the old one. Its long poll is not woken for it."""
    old, new = "app.jobs:run", "app.jobs:weekly"

    async def t(env, c):
        for field, bad in (("targets", []), ("targets", ["no colon"]), ("targets", "app.jobs:run")):
            r = await c.post(path("w1", "lease"), data=json.dumps(lease_body(targets=bad)), headers=AUTH)
            assert r.status == 422 and (await r.json())["error"]["field"] == field, await r.text()
        await put_job(env, "old", dict(SPEC, executor={"type": "python", "target": old}))
        await put_job(env, "new", dict(SPEC, executor={"type": "python", "target": new}))
        rid_new = await trigger(env, "new")
        rid_old = await trigger(env, "old")
        got = await lease(c, "old/1", targets=[old], wait_s=0.3)
        assert [g["id"] for g in got["runs"]] == [rid_old] and env.state.workers["old/1"]["targets"] == [old]
        acquires = len(env.ops("acquire"))
        got = await lease(c, "old/1", targets=[old], wait_s=0.3)
        # Not woken for the new job's run (at most the dispatcher's look past its scan, once a second).
        assert got["runs"] == [] and len(env.ops("acquire")) - acquires <= 1
        assert env.state.runs[rid_new]["state"] == "queued"
        r = await c.get("/v1/runs/" + urllib.parse.quote(rid_new, safe=""), headers=AUTH)
        assert (await r.json()).get("waiting_for", "").startswith("no worker has a handler"), await r.text()
        got = await lease(c, "new/1", targets=[old, new], wait_s=0.3)
        assert [g["id"] for g in got["runs"]] == [rid_new]
        # A hello without them again: any target (it may now take anything).
        await lease(c, "old/1", wait_s=0)
        assert "targets" not in env.state.workers["old/1"]
    run(t)


def test_a_dry_runs_audit_record_says_it_was_one(tmp_path):
    """A walk: the audit log told a batch's dry run from its apply by nothing (both POST, 200)."""
    audit = AuditLog(str(tmp_path / "audit.jsonl"), "node-1")

    async def t(env, c):
        for dry in (True, False):
            r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"j": SPEC}, "dry_run": dry}), headers=AUTH)
            assert r.status == 200, await r.text()
        await put_job(env, "k")
        r = await c.post("/v1/jobs/k/backfills", headers=AUTH, data=json.dumps(
            {"from": "2020-01-01T00:00:00Z", "to": "2020-01-01T03:00:00Z", "dry_run": True}))
        assert r.status in (200, 422), await r.text()
    run(t, audit)
    audit.close()
    recs = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    batch = [r["target"] for r in recs if r["route"] == "/v1/jobs:batch"]
    assert batch == [{"dry_run": "true"}, {}], recs
    assert [r["target"] for r in recs if r["route"].endswith("/backfills")] == [{"name": "k", "dry_run": "true"}]


def test_a_put_says_at_once_when_no_live_worker_may_take_its_jobs_runs():
    """A walk: a job put with a placement no live worker carried (a typo in a label) was told of
    only when its first run had waited a minute (run.unplaceable). The PUT and the batch now
    answer with a warning naming the field when a queued run of the job would show waiting_for
    now; the job is written all the same (its worker may register after it)."""
    async def t(env, c):
        await lease(c, "eu-1", wait_s=0, labels={"region": "eu"}, queues=["default"],
                    targets=["builtins:id", "app:report"])

        async def put(name, spec):
            r = await c.put(f"/v1/jobs/{name}", data=json.dumps(spec), headers=AUTH)
            assert r.status in (200, 201), await r.text()
            return await r.json()

        typo = await put("typo", dict(SPEC, placement={"labels": {"region": "ue"}}))
        (line,) = typo["warnings"]
        assert line.startswith("placement: no live worker serving queue 'default' for python runs") \
            and '{"region": "ue"}' in line and "run.unplaceable" in line, line
        assert "(none carries region=ue)" in line, line  # (a walk: which label of it is the typo)
        both = await put("both", dict(SPEC, placement={"labels": {"region": "eu", "pool": "gpu"}}))
        assert "(none carries pool=gpu)" in both["warnings"][0] and "region=eu" not in both["warnings"][0].split(
            "none carries")[1], both
        assert "typo" in env.state.jobs  # written all the same
        assert "warnings" not in await put("fits", dict(SPEC, placement={"labels": {"region": "eu"}}))
        assert "warnings" not in await put("plain", SPEC)  # no placement, no restricted worker: any worker
        other_q = await put("other-q", dict(SPEC, queue="gpu", placement={"labels": {"region": "eu"}}))
        assert "queue 'gpu'" in other_q["warnings"][0]
        beat = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
                "deadline": {"succeed_within_s": 120}}
        # (a live worker limited to its handlers' targets judges jobs without placement too)
        assert "warnings" not in await put("beat", beat)  # pinged, never leased
        # A target the live worker of its app has no handler for.
        old_app = dict(SPEC, executor={"type": "python", "target": "app:new_report"},
                       placement={"labels": {"region": "eu"}})
        assert (await put("new", old_app))["warnings"][0].startswith(
            "executor.target: no live worker has a handler for 'app:new_report'")
        # The batch says it on the job it concerns, and nothing on the others.
        b = await post(c, "/v1/jobs:batch", {"jobs": {"b-typo": dict(SPEC, placement={"labels": {"region": "ue"}}),
                                                      "b-fits": dict(SPEC, placement={"labels": {"region": "eu"}})}})
        assert b["jobs"]["b-typo"]["warnings"][0].startswith("placement: no live worker") \
            and "warnings" not in b["jobs"]["b-fits"], b
        dry = await post(c, "/v1/jobs:batch", {"dry_run": True, "jobs": {
            "b-typo": dict(SPEC, placement={"labels": {"region": "ue"}}), "plain": SPEC}})
        assert dry["jobs"]["b-typo"]["warnings"][0].startswith("placement: no live worker") \
            and "warnings" not in dry["jobs"]["plain"], dry
        # Once a worker with the labels is live, the same PUT says nothing (the node reads the
        # live workers again at most once a second for these warnings).
        await lease(c, "ue-1", wait_s=0, labels={"region": "ue"})
        deadline = time.monotonic() + 5
        while "warnings" in await put("typo", dict(SPEC, placement={"labels": {"region": "ue"}})):
            assert time.monotonic() < deadline, "the warning outlived the worker's registration"
            await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop
    run(t)


def test_a_put_whose_warnings_cannot_be_read_answers_the_applied_write_without_them(monkeypatch, caplog):
    """The warnings are read after the job was written: a failure there answered 500 for an
    applied write, which a client takes for not applied."""
    from raftsched.core import queries

    def broken(live, specs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(queries, "waits_for_worker", broken)

    async def t(env, c):
        r = await c.put("/v1/jobs/j", data=json.dumps(dict(SPEC, placement={"labels": {"region": "ue"}})),
                        headers=AUTH)
        assert r.status == 201, await r.text()
        assert "warnings" not in await r.json() and "j" in env.state.jobs
        b = await post(c, "/v1/jobs:batch", {"jobs": {"k": SPEC}})
        assert b["jobs"]["k"]["created"] is True and "warnings" not in b["jobs"]["k"], b
    run(t)
    assert "could not be read" in caplog.text


def test_a_heartbeat_says_why_the_cluster_ended_a_run_whose_lease_it_lost():
    """A walk: a cancelled running run's worker logged a lost lease, then a stale-token refusal of
    its report, and an on-call went looking for a network fault. The heartbeat's answer says
    which lost leases' runs were ended, and why; a lease lost otherwise says nothing more."""
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        other = await trigger(env, "j")
        got = {g["id"]: g for g in (await lease(c, "w1", wait_s=5, max=2))["runs"]}
        await env.service.cancel_run(rid, None, reason="wrong input")
        hb = await post(c, path("w1", "heartbeat"), {"leases": [[rid, got[rid]["token"]],
                                                                [other, got[other]["token"] + 1000]]})
        assert sorted(hb["lost"]) == sorted([rid, other]), hb
        assert hb["ended"] == {rid: "cancelled by request: wrong input"}, hb  # not the wrong token's
        # Another worker sending the same id and token learns nothing of it (a review).
        other_hb = await post(c, path("w2", "heartbeat"), {"leases": [[rid, got[rid]["token"]]]})
        assert other_hb["lost"] == [rid] and "ended" not in other_hb, other_hb
    run(t)


def test_a_due_runs_view_says_it_waits_for_a_worker_then_for_a_free_slot():
    """The answer to "why does nothing run": no live worker serves its queue, then the one that
    does holds a run in each of its slots; a free slot says nothing (core/worker_queries.py)."""
    async def t(env, c):
        await put_job(env, "k", SPEC)
        first = await trigger(env, "k")
        view = await (await c.get(f"/v1/runs/{first}", headers=AUTH)).json()
        assert view["waiting_for"] == ("a worker: no live worker serves queue 'default' and runs python jobs "
                                       "(GET /v1/workers lists the workers)"), view
        listed = (await (await c.get("/v1/jobs/k/runs", headers=AUTH)).json())["runs"]
        assert [r.get("waiting_for") for r in listed] == [view["waiting_for"]]
        got = (await lease(c, "w1", slots=1, max=1, wait_s=5))["runs"]
        assert [g["id"] for g in got] == [first]
        second = await trigger(env, "k")
        view = await (await c.get(f"/v1/runs/{second}", headers=AUTH)).json()
        assert view["waiting_for"] == "a free slot: the live worker that may take it (1) holds 1 run(s) in 1 slot(s)"
        await post(c, path("w1", "complete"), {"results": [{"run": first, "token": got[0]["token"], "success": True}]})
        view = await (await c.get(f"/v1/runs/{second}", headers=AUTH)).json()
        assert view["state"] == "queued" and "waiting_for" not in view, view
    run(t)


def test_two_processes_under_one_worker_id_are_told_so_a_restart_is_not(caplog):
    """A walk: two `raftsched worker --id dup` ran side by side, each lease request re-registering
    its own process, and nothing said so. A restart, or a crash loop, brings a new process each
    time; two processes take turns, each coming back after the other took its place: said at
    the second return within a minute, in the lease answer (the worker logs it) and the node's log."""
    async def t(env, c):
        for inst in ("a1", "a2", "a3", "a4", "a5"):  # a crash loop: a new process each time
            assert "warnings" not in await lease(c, "loop", wait_s=0, instance=inst)
        with caplog.at_level("WARNING", logger="raftsched.fleet"):
            answers = [await lease(c, "dup", wait_s=0, instance=inst) for inst in ("i1", "i2", "i1", "i2", "i1")]
        assert ["warnings" in a for a in answers] == [False, False, False, True, True], answers
        want = ["worker id 'dup' is used by more than one process: instances i1 and i2 took turns at it within 60 s; "
                "give each process an id of its own (raftsched worker --id), else their leases, heartbeats and "
                "registry record mix"]
        assert answers[3]["warnings"] == answers[4]["warnings"] == want, answers
        logged = [r for r in caplog.records if "used by more than one process" in r.getMessage()]
        assert len(logged) == 1, logged  # once a window a worker, in the node's log
        assert "warnings" not in await lease(c, "solo", wait_s=0, instance="s1")
        assert "warnings" not in await lease(c, "solo", wait_s=0, instance="s1")
    run(t)
