"""Outcomes carried by a lease request (node/fleet.py ``lease_changed``, worker/remote.py
``RemoteChannel``): a remote worker that reports a batch and asks for runs in one turn of its
event loop sends one request instead of two, and whatever goes wrong with that request, the
batch is reported through ``complete`` with the same key, acting once. In process: the node's app
over FakeRaft, or a stand-in node answering by path. Every wait has a deadline."""
from __future__ import annotations

import asyncio
import collections
import json

from aiohttp import web

import test_remote

from raftsched.clock import SystemClock
from raftsched.worker import limits as worker_limits
from raftsched.worker.remote import RemoteChannel, WorkerConfig, run_worker

from test_fleet import AUTH, TOKEN, lease_body, path, post, put_job, run, trigger
from test_fleet import Env

ITEM = {"run": "r", "token": 3, "success": True, "error": None, "output": None}


# ---------------------------------------------------------------------------- the node's side
def test_a_lease_request_carries_outcomes_which_apply_once_under_its_key():
    async def t(env, c):
        await put_job(env, "j")
        a, b = await trigger(env, "j"), await trigger(env, "j")
        grants = {g["id"]: g for g in (await post(c, path("w1", "lease"), lease_body(wait_s=5, max=2)))["runs"]}
        assert set(grants) == {a, b}
        results = [{"run": a, "token": grants[a]["token"], "success": True, "output": "hi"},
                   {"run": b, "token": grants[b]["token"] + 7, "success": True}]
        key = {"Idempotency-Key": "batch-1", **AUTH}
        res = await post(c, path("w1", "lease"), lease_body(wait_s=0, results=results), headers=key)
        assert res["runs"] == [] and res["draining"] is False and "duplicate" not in res
        assert res["results"][0]["ok"] and res["results"][0]["state"] == "succeeded"
        assert res["results"][1]["error"]["code"] == "conflict"  # judged alone: a stale token
        assert env.state.runs[a]["state"] == "succeeded" and env.state.runs[b]["state"] == "running"
        # The same batch again, on a lease request or alone, acts once: the same answers.
        before = dict(env.state.runs[a])
        again = await post(c, path("w1", "lease"), lease_body(wait_s=0, results=results), headers=key)
        assert again["duplicate"] is True and again["results"] == res["results"]
        alone = await post(c, path("w1", "complete"), {"results": results}, headers=key)
        assert alone["duplicate"] is True and alone["results"] == res["results"]
        assert env.state.runs[a] == before
        # The key again with other outcomes: not answered as the first batch's (its runs are
        # other ones), so results_error, and the runs asked for still come.
        other = [{"run": b, "token": grants[b]["token"], "success": True}]
        reused = await post(c, path("w1", "lease"), lease_body(wait_s=0, results=other), headers=key)
        assert "results" not in reused and reused["results_error"]["field"] == "Idempotency-Key"
        assert env.state.runs[b]["state"] == "running"
        # The runs the request asks for come in the same answer.
        d = await trigger(env, "j")
        more = await post(c, path("w1", "lease"), lease_body(wait_s=5, results=[
            {"run": b, "token": grants[b]["token"], "success": False, "error": "boom"}]),
            headers={"Idempotency-Key": "batch-2", **AUTH})
        assert [g["id"] for g in more["runs"]] == [d] and more["results"][0]["ok"]
        assert env.state.runs[b]["state"] == "dead" and env.state.runs[b]["error"] == "boom"  # no retries: the DLQ
    run(t)


def test_a_short_wait_joining_a_group_that_looked_idle_is_looked_at_now():
    """A lease request that carries outcomes waits 50 ms. A newcomer to a group whose last look
    found nothing waits for the next apply or full look (up to a second), so such a request was
    answered empty with runs ready (a review saw three); a short wait is looked at at once."""
    from raftsched.node.dispatch import Dispatcher, LeaseRequest

    async def t():
        env = Env()
        d = Dispatcher(env.raft, env.clock, env.fleet.propose, env.fleet.release_grants)
        wakes = []
        d._wake.set = lambda: wakes.append(1)  # the dispatcher's loop is not running: count its wake-ups

        def request(wid):
            return LeaseRequest(wid, None, {}, None, 4, 10_000)
        key = request("w0").key
        d._groups[key] = collections.deque([request("w0")])  # one waits already,
        d._quiet.add(key)  # and the group's last look found no work for it
        d._dirty = False
        long_poll = asyncio.ensure_future(d.lease(request("w1"), 5.0))
        await asyncio.sleep(0)  # ok-sleep: one turn, for it to join
        assert wakes == [] and not d._dirty  # a long poll joins quietly
        await d.lease(request("w2"), worker_limits.carried_lease_wait_s)
        assert wakes == [1] and d._dirty  # a short wait wakes a look
        long_poll.cancel()
        await asyncio.gather(long_poll, return_exceptions=True)
    asyncio.run(asyncio.wait_for(t(), 10))


def test_bad_outcomes_on_a_lease_request_name_the_field_and_change_nothing():
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        proposed = len(env.raft.proposed)
        bad = [({"results": []}, "results"), ({"results": [{"run": rid, "success": True}]}, "results[0].token"),
               ({"results": [{"run": rid, "token": 1, "success": "yes"}]}, "results[0].success"),
               ({"results": [{"run": rid, "token": 1, "success": True, "x": 1}]}, "results[0].x")]
        for extra, field in bad:
            r = await c.post(path("w1", "lease"), data=json.dumps(lease_body(wait_s=0, **extra)), headers=AUTH)
            assert r.status in (400, 422), await r.text()
            assert (await r.json())["error"]["field"] == field
        assert len(env.raft.proposed) == proposed  # not even a hello
        assert env.state.runs[rid]["state"] == "queued"
    run(t)


def test_a_draining_worker_still_has_its_carried_outcomes_applied():
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        g = (await post(c, path("w1", "lease"), lease_body(wait_s=5)))["runs"][0]
        await post(c, path("w1", "drain"), {})
        res = await post(c, path("w1", "lease"), lease_body(wait_s=5, results=[
            {"run": rid, "token": g["token"], "success": True}]), headers={"Idempotency-Key": "k", **AUTH})
        assert res["draining"] is True and res["runs"] == [] and res["results"][0]["ok"]
        assert env.state.runs[rid]["state"] == "succeeded"
    run(t)


def test_a_lease_request_that_only_carried_outcomes_is_audited(tmp_path):
    from raftsched.node.audit import AuditLog
    audit = AuditLog(str(tmp_path / "audit.jsonl"), "node-1")

    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        g = (await post(c, path("w1", "lease"), lease_body(wait_s=5)))["runs"][0]
        await post(c, path("w1", "lease"), lease_body(wait_s=0))  # idle: not recorded
        await post(c, path("w1", "lease"), lease_body(wait_s=0, results=[
            {"run": rid, "token": g["token"], "success": True}]))
    run(t, audit)
    audit.close()
    recs = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len([r for r in recs if r["route"] == "/v1/workers/{id}/lease"]) == 2, recs


# ---------------------------------------------------------------------------- the worker's side
class Node(test_remote.Node):
    """A stand-in node answering each path (``lease``, ``complete``) with the next of its
    answers (status, body), recording every request (path, Idempotency-Key, body)."""

    def __init__(self, **answers: list) -> None:
        super().__init__([])
        self.answers = {k: list(v) for k, v in answers.items()}  # type: ignore[assignment]
        #: path -> seconds its answers wait (a lease request waiting at the node for runs)
        self.delay: dict[str, float] = {}
        self.requests: list[tuple[str, str, dict]] = []  # type: ignore[assignment]

    async def handle(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        self.requests.append((what, request.headers.get("Idempotency-Key"), await request.json()))
        queue = self.answers.get(what) or []
        status, body = queue.pop(0) if queue else (200, {"runs": [], "draining": False})
        if self.delay.get(what):
            await asyncio.sleep(self.delay[what])  # ok-sleep: a node that answers that late
        return web.json_response(body, status=status)

    async def channel(self) -> RemoteChannel:
        return RemoteChannel(WorkerConfig(urls=[await self.start()], token=TOKEN, worker_id="w1"), SystemClock())

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.requests]

    def keys(self) -> set:
        return {k for p, k, b in self.requests if p == "complete" or "results" in b}


def aio(coro_fn, node: Node):
    async def main():
        ch = await node.channel()
        try:
            await asyncio.wait_for(coro_fn(ch), 20)
        finally:
            await ch.close()
            await node.server.close()
    asyncio.run(main())


async def report_and_ask(ch: RemoteChannel):
    """What the lease loop's pump does: a report and an acquire started in one turn."""
    rep = asyncio.create_task(ch.complete([ITEM]))
    acq = asyncio.create_task(ch.acquire(4, 10_000, None))
    return await rep, await acq


def test_a_report_and_an_acquire_of_one_turn_travel_as_one_lease_request():
    node = Node(lease=[(200, {"runs": [], "draining": False, "results": [{"ok": True, "run": "r"}]})])

    async def t(ch):
        results, grants = await report_and_ask(ch)
        assert results == [{"ok": True, "run": "r"}] and grants.runs == []
        assert node.paths() == ["lease"]
        body = node.requests[0][2]
        assert body["results"] == [ITEM] and body["wait_s"] == worker_limits.carried_lease_wait_s  # a short wait
        assert grants.retry_after_s == 0.0  # none ready: the next lease request goes at once, and waits
        # A report with no acquire in its turn goes alone.
        node.answers["complete"] = [(200, {"results": [{"ok": True, "run": "r"}]})]
        assert await ch.complete([ITEM]) == [{"ok": True, "run": "r"}]
        assert node.paths() == ["lease", "complete"]
        await ch.acquire(1, 10_000, None)
        assert node.paths()[-1] == "lease" and "results" not in node.requests[-1][2]
    aio(t, node)


def test_outcomes_the_lease_answer_does_not_apply_go_alone_with_the_same_key():
    err = {"code": "indeterminate", "message": "timed out", "field": None}
    node = Node(lease=[(200, {"runs": [], "draining": False, "results_error": err})],
                complete=[(200, {"results": [{"ok": True, "run": "r"}]})])

    async def t(ch):
        results, _ = await report_and_ask(ch)
        assert results == [{"ok": True, "run": "r"}]
        assert sorted(node.paths()) == ["complete", "lease"] and len(node.keys()) == 1
    aio(t, node)


def test_outcomes_of_a_failed_lease_request_go_alone_with_the_same_key():
    denied = {"error": {"code": "unauthorized", "message": "wrong token", "field": None}}
    node = Node(lease=[(401, denied)], complete=[(200, {"results": [{"ok": True, "run": "r"}]})])

    async def t(ch):
        results, grants = await report_and_ask(ch)
        assert results == [{"ok": True, "run": "r"}]
        assert grants.retry_after_s == worker_limits.lease_refused_pause_s
        assert sorted(node.paths()) == ["complete", "lease"] and len(node.keys()) == 1
    aio(t, node)


def test_a_node_that_refuses_carried_outcomes_gets_them_alone_for_a_while():
    """A node of a version before this protocol refuses the unknown field: the lease is asked
    again without it, the batch goes alone, and so do the next ones for the pause."""
    refused = {"error": {"code": "invalid", "message": "unknown field", "field": "results"}}
    done = (200, {"results": [{"ok": True, "run": "r"}]})
    node = Node(lease=[(400, refused), (200, {"runs": [], "draining": False})], complete=[done, done])

    async def t(ch):
        results, grants = await report_and_ask(ch)
        assert results == [{"ok": True, "run": "r"}] and grants.runs == []
        assert sorted(node.paths()) == ["complete", "lease", "lease"]
        assert [("results" in b) for p, _, b in node.requests if p == "lease"] == [True, False]
        assert len(node.keys()) == 1
        await report_and_ask(ch)
        assert [("results" in b) for p, _, b in node.requests if p == "lease"] == [True, False, False]
        assert node.paths().count("complete") == 2
    aio(t, node)


def test_a_large_batch_is_not_carried():
    node = Node(complete=[(200, {"results": [{"ok": True, "run": "r"}]})])
    big = dict(ITEM, output="x" * (worker_limits.carried_results_bytes_max + 1))

    async def t(ch):
        rep = asyncio.create_task(ch.complete([big]))
        acq = asyncio.create_task(ch.acquire(4, 10_000, None))
        await rep
        await acq
        assert sorted(node.paths()) == ["complete", "lease"]
        assert all("results" not in b for p, _, b in node.requests if p == "lease")
    aio(t, node)


def test_a_remote_worker_reports_most_batches_on_its_lease_requests():
    """Through the node's app: every run succeeds, and the outcomes rode on lease requests."""
    async def t(env, c):
        seen: list[tuple[str, bool]] = []
        real = env.fleet.lease_changed

        async def lease_changed(wid, body, *a, **kw):
            seen.append(("lease", "results" in body))
            return await real(wid, body, *a, **kw)
        env.fleet.lease_changed = lease_changed
        real_complete = env.fleet.complete

        async def complete(*a, **kw):
            seen.append(("complete", True))
            return await real_complete(*a, **kw)
        env.fleet.complete = complete
        server = c.server
        stop = asyncio.Event()
        cfg = WorkerConfig(urls=[f"http://127.0.0.1:{server.port}"], token=TOKEN, worker_id="w/1", slots=2,
                           wait_s=2.0)
        worker = asyncio.create_task(run_worker(cfg, SystemClock(), stop))
        try:
            await put_job(env, "j")
            rids = [await trigger(env, "j") for _ in range(20)]
            deadline = asyncio.get_running_loop().time() + 15
            while not all(env.state.runs[r]["state"] == "succeeded" for r in rids):
                assert asyncio.get_running_loop().time() < deadline, [env.state.runs[r]["state"] for r in rids]
                await asyncio.sleep(0.02)  # ok-sleep: polling interval inside a deadline loop
            stop.set()
            assert await asyncio.wait_for(worker, 10) == 0
        finally:
            stop.set()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        carried = sum(1 for what, has in seen if what == "lease" and has)
        alone = sum(1 for what, _ in seen if what == "complete")
        assert carried >= 1 and carried >= alone, seen
    run(t)


def test_outcomes_are_not_held_while_the_queue_is_empty():
    """A lease request that carries outcomes waits for runs 50 ms at most, so a burst's last
    outcomes are answered then rather than when the next runs come (a review measured ~0.7 s of
    delay when they waited 1 s with the request); the next lease request then waits as usual,
    without them."""
    async def t(env, c):
        await put_job(env, "j")
        rid = await trigger(env, "j")
        ch = RemoteChannel(WorkerConfig(urls=[f"http://127.0.0.1:{c.server.port}"], token=TOKEN, worker_id="w1",
                                        wait_s=5.0), SystemClock())
        try:
            g = (await ch.acquire(1, 10_000, None)).runs[0]
            item = dict(ITEM, run=rid, token=g["token"])
            rep = asyncio.create_task(ch.complete([item]))
            acq = asyncio.create_task(ch.acquire(1, 10_000, None))
            # Answered well within the 5 s the worker's lease requests wait otherwise.
            assert (await asyncio.wait_for(rep, 2.5))[0]["ok"] and env.state.runs[rid]["state"] == "succeeded"
            grants = await asyncio.wait_for(acq, 2.5)
            assert grants.runs == [] and grants.retry_after_s == 0.0
        finally:
            await ch.close()
    run(t)


def test_a_reporter_that_stops_waiting_does_not_break_the_lease_request_that_carries_its_batch():
    node = Node(lease=[(200, {"runs": [{"id": "x"}], "draining": False, "results": [{"ok": True, "run": "r"}]})])

    async def t(ch):
        rep = asyncio.create_task(ch.complete([ITEM]))
        acq = asyncio.create_task(ch.acquire(4, 10_000, None))
        await asyncio.sleep(0)  # ok-sleep: one turn: the acquire has taken the batch
        rep.cancel()
        grants = await acq
        assert [g["id"] for g in grants.runs] == ["x"]
        assert ch._carry == []
    aio(t, node)


def test_a_release_of_runs_never_begun_goes_again_without_not_started_to_an_older_node():
    """A node of a version before ``not_started`` refuses the field (422 naming it): the release
    goes again without it (the runs are queued again, as before), not left to expire."""
    refused = {"error": {"code": "invalid", "message": "unknown field; allowed: leases, reason",
                         "field": "not_started"}}
    node = Node(release=[(422, refused), (200, {"released": ["a@1"], "lost": []})])

    async def go(ch):
        await ch.release([["a@1", 7]], "draining", not_started=True)
    aio(go, node)
    bodies = [b for p, _, b in node.requests if p == "release"]
    assert [b.get("not_started") for b in bodies] == [True, None], bodies
    assert all(b["leases"] == [["a@1", 7]] for b in bodies)
