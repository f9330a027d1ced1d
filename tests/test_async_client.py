"""raftsched.AsyncClient's routing and retries, against scripted servers (the sync Client's
tests in test_client.py, made with the async client), and client_rules.Call on its own."""
from __future__ import annotations

import asyncio
import time

import pytest

from raftsched import AsyncClient
from raftsched.client import LockHeld, LockLost
from raftsched.client_rules import Call, Done, Fail, Try, Wait
from raftsched.core.errors import Conflict, Indeterminate, NotFound, Unavailable

from procs import free_ports
from test_client import _err, scripted  # noqa: F401  (the fixture)


# ---------------------------------------------------------------------- Call, without I/O
def _call(n=2, mutating=True, budget_s=10.0, start=0):
    return Call([f"http://n{i}" for i in range(n)], "POST", "/x", mutating, start=start, timeout_s=3,
                budget_s=budget_s, now_s=100.0, uniform=lambda a, b: b)


def test_call_tries_each_node_from_the_preferred_one_then_waits_by_retry_after():
    c = _call(n=3, start=1)
    assert c.next(100.0) == Try(1, 3)
    assert c.answered(1, 503, {"retry-after": "0.5"}, {"error": {"code": "unavailable", "message": "m"}}) is None
    assert c.next(100.1) == Try(2, 3)
    c.not_sent(2, "refused")
    assert c.next(100.2) == Try(0, 3)
    assert c.answered(0, 503, {}, None) is None
    assert c.next(100.3) == Wait(0.5)  # the longest Retry-After of the round, within [0.05, 1]
    assert c.next(100.8) == Try(1, 3)  # the next round starts where the first did
    assert c.answered(1, 200, {}, {"ok": 1}) == Done(1, {"ok": 1})


def test_call_ends_with_the_error_of_a_definite_answer_and_names_the_node():
    c = _call()
    c.next(100.0)
    end = c.answered(0, 404, {}, {"error": {"code": "not_found", "message": "no job", "field": "name"}})
    assert isinstance(end, Fail) and end.node == 0
    assert isinstance(end.error, NotFound) and end.error.status == 404 and end.error.field == "name"


def test_an_unknown_outcome_of_a_mutation_is_never_reported_as_definite():
    c = _call(n=1, budget_s=1.0)
    c.next(100.0)
    assert c.answered(0, 504, {}, {"error": {"code": "indeterminate", "message": "m"}}) is None
    assert isinstance(c.next(100.1), Wait)
    c.next(100.5)
    c.answered(0, 503, {}, {"error": {"code": "unavailable", "message": "m"}})
    end = c.next(101.5)
    assert isinstance(end, Fail) and isinstance(end.error, Indeterminate) and end.error.definite is False


def test_a_read_that_lost_its_connection_is_unavailable_not_indeterminate():
    c = _call(n=1, mutating=False, budget_s=0.5)
    c.next(100.0)
    c.not_sent(0, "refused")
    end = c.next(100.6)
    assert isinstance(end, Fail) and isinstance(end.error, Unavailable)
    assert "no node reachable" in end.error.message


def test_the_first_attempt_is_made_even_with_no_time_left_and_accepted_statuses_are_answers():
    c = Call(["http://n"], "GET", "/healthz", False, start=0, timeout_s=3, budget_s=0, now_s=5.0, accept=(503,))
    step = c.next(6.0)
    assert isinstance(step, Try) and step.timeout_s == 0.05
    assert c.answered(0, 503, {}, {"ok": False}) == Done(0, {"ok": False})


def test_a_read_whose_connection_dropped_is_unanswered_not_may_have_applied():
    """A GET changes nothing: a connection lost after it left ends Unavailable, not
    Indeterminate; the same loss of a POST may have applied."""
    for mutating, want in ((False, Unavailable), (True, Indeterminate)):
        c = Call(["http://n"], "GET" if not mutating else "POST", "/x", mutating, start=0, timeout_s=3,
                 budget_s=1.0, now_s=100.0, uniform=lambda a, b: b)
        assert c.next(100.0) == Try(0, 1.0)
        c.lost(0, "reset by peer")
        assert isinstance(c.next(100.1), Wait)
        step = c.next(101.5)
        assert isinstance(step, Fail) and type(step.error) is want, step.error


# ---------------------------------------------------------------------- against scripted servers
def test_async_503_moves_to_next_node_and_504_retries_with_same_key(scripted):  # noqa: F811
    a = scripted(_err("unavailable", 503))
    b = scripted(_err("indeterminate", 504), "drop", (200, {"lock": "x", "token": 7, "expires_at": "t"}))

    async def main():
        async with AsyncClient([a.url, b.url], token="t", deadline_s=10) as c:
            return await c.lock_acquire("x", "me", 5)

    assert asyncio.run(main())["token"] == 7
    keys = {k for _, _, k in a.seen + b.seen}
    assert len(keys) == 1 and None not in keys  # one logical call, one key on every attempt
    assert len(b.seen) == 3 and a.seen


def test_async_unknown_outcome_is_never_reported_as_definite(scripted):  # noqa: F811
    a = scripted(_err("indeterminate", 504), _err("unavailable", 503))

    async def main():
        async with AsyncClient([a.url], token="t", deadline_s=1.0) as c:
            await c.trigger("job")

    with pytest.raises(Indeterminate) as ei:
        asyncio.run(main())
    assert ei.value.definite is False
    assert len({k for _, _, k in a.seen}) == 1


def test_async_unreachable_nodes_are_unavailable_and_typed_errors_keep_their_class(scripted):  # noqa: F811
    port, = free_ports(1)
    held = scripted(_err("conflict", 409, holder="other", expires_at_ms=1))
    lost = scripted(_err("conflict", 409))
    missing = scripted(_err("not_found", 404))

    async def main():
        async with AsyncClient(f"http://127.0.0.1:{port}", deadline_s=0.5) as c:
            with pytest.raises(Unavailable) as ei:
                await c.cluster()
            assert "no node reachable" in ei.value.message
        async with AsyncClient(held.url, token="t") as c:
            with pytest.raises(LockHeld) as ei:
                await c.lock_acquire("x", "me", 5)
            assert ei.value.holder == "other" and ei.value.status == 409
        async with AsyncClient(lost.url, token="t") as c:
            with pytest.raises(LockLost):
                await c.lock_renew("x", 3)
            with pytest.raises(Conflict):
                await c.put_job("x", {}, create_only=True)
        async with AsyncClient(missing.url) as c:
            assert await c.lock_info("x") is None

    asyncio.run(main())


def test_async_lease_lost_when_no_renew_succeeds_for_a_ttl(scripted):  # noqa: F811
    s = scripted((200, {"lock": "x", "owner": "me", "token": 3, "expires_at": "t"}), _err("unavailable", 503))

    async def main():
        async with AsyncClient([s.url], token="t", timeout_s=2) as c:
            lk = c.lock("x", owner="me", ttl_s=1.0)
            lease = await lk.acquire()
            t0 = time.monotonic()
            try:
                while not lease.lost.is_set() and time.monotonic() - t0 < 5:
                    await asyncio.sleep(0.02)  # ok-sleep: polling interval inside a deadline loop
                assert lease.lost.is_set()
                assert 0.5 < time.monotonic() - t0 < 2.5
            finally:
                await lk.release()  # the release gets 503s too: logged, not raised

    asyncio.run(main())


def test_cancelling_a_release_cancels_the_renewal_and_propagates(scripted):  # noqa: F811
    # The renewal hangs at the node; the task awaiting release() (which waits for the renewal
    # to end) is cancelled: it must end cancelled, not return as if the release were done.
    s = scripted((200, {"lock": "x", "owner": "me", "token": 3, "expires_at": "t"}), "hang",
                 (200, {"released": True}))

    async def until(cond, what):
        t0 = time.monotonic()
        while not cond():
            assert time.monotonic() - t0 < 10, what
            await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop

    async def main():
        async with AsyncClient([s.url], token="t", timeout_s=5, deadline_s=5) as c:
            lk = c.lock("x", owner="me", ttl_s=0.9)
            lease = await lk.acquire()
            renewal = lk._task
            await until(lambda: any(p.endswith("/renew") for _, p, _ in s.seen), "the renewal was sent")
            releasing = asyncio.create_task(lk.release())
            await until(lk._stop.is_set, "release() started")
            releasing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await releasing
            assert releasing.cancelled() and renewal.done() and lease.lost.is_set() and lk.lease is None
            # The release was sent before the cancellation reached the caller, with the client
            # still open (a task of its own ran after the `async with` had closed it, or never).
            assert any(p.endswith("/release") for _, p, _ in s.seen), s.seen

    asyncio.run(main())


def test_the_clients_connections_probe_a_quiet_peer_with_tcp_keepalive():
    """A remote worker's long-poll waits up to 60 s; a node whose host vanished (no reset) is
    noticed by the keepalive probes (~25 s), not at the end of the request's timeout."""
    import socket

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from raftsched.client import asynchronous

    done = asyncio.Event()

    async def long_poll(request):  # the answer's body comes later: the connection stays in use
        resp = web.StreamResponse()
        await resp.prepare(request)
        await done.wait()
        await resp.write(b"{}")
        return resp

    async def main():
        app = web.Application()
        app.router.add_get("/ping", long_poll)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        client = AsyncClient([f"http://127.0.0.1:{server.port}"], token="t" * 32)
        try:
            async with client._http().get(f"http://127.0.0.1:{server.port}/ping") as r:
                assert r.status == 200
                sock = r.connection.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                if hasattr(socket, "TCP_KEEPIDLE"):
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == asynchronous.KEEPALIVE_IDLE_S
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == asynchronous.KEEPALIVE_INTERVAL_S
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == asynchronous.KEEPALIVE_PROBES
                done.set()
                await r.read()
        finally:
            done.set()
            await client.close()
            await server.close()
    asyncio.run(asyncio.wait_for(main(), 30))
