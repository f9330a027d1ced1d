"""The http executor (DESIGN.md section 6): the request a run makes and how its response ends it.

A real HTTP server on 127.0.0.1; no fixed sleeps: every wait is for an event, under a deadline.
"""
from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from executor_helpers import PAYLOAD, ctx, run
from raftsched.worker.executors import OUTPUT_BYTES_MAX, execute
from raftsched.testing.procs import free_port


class Hook:
    """A webhook receiver on 127.0.0.1 that records requests and can hold them open."""

    def __init__(self):
        self.requests: list[dict] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/ok", self.ok)
        app.router.add_post("/fail", self.fail)
        app.router.add_post("/slow", self.slow)
        app.router.add_post("/big", self.big)
        app.router.add_post("/redirect", self.redirect)
        self.server = TestServer(app, host="127.0.0.1")

    async def __aenter__(self):
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc):
        self.release.set()  # let held handlers finish before the server closes
        await self.server.close()

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def ok(self, request):
        self.requests.append({"headers": dict(request.headers), "body": await request.read()})
        return web.Response(status=202, text="accepted")

    async def fail(self, request):
        return web.Response(status=500, text="boom: database down")

    async def slow(self, request):
        self.entered.set()
        await self.release.wait()
        return web.Response(text="too late")

    async def big(self, request):
        return web.Response(body=b"a" * 200_000 + b"<end>")

    async def redirect(self, request):
        raise web.HTTPFound("/ok")


def test_http_posts_payload_and_identity_headers():
    async def t():
        async with Hook() as hook:
            spec = {"type": "http", "url": hook.url("/ok"),
                    "headers": {"Authorization": "Bearer s3cret", "x-raftsched-run-id": "spoofed"}}
            out = await execute(spec, ctx(), 10)
            assert out.ok and out.error is None, out
            assert out.output == "HTTP 202\naccepted"
            [req] = hook.requests
            assert json.loads(req["body"]) == PAYLOAD
            h = req["headers"]
            assert h["Content-Type"] == "application/json"
            assert h["Authorization"] == "Bearer s3cret"
            for name, value in ctx().headers().items():
                assert h[name] == value, name
            assert [k for k in h if k.lower() == "x-raftsched-run-id"] == ["X-Raftsched-Run-Id"]
    run(t())


def test_an_http_runs_json_body_is_its_result_when_asked():
    async def t():
        app = web.Application()

        async def answer(request):
            return web.json_response({"rows": 42})

        async def text(request):
            return web.Response(text="rows: 42")
        async def deep(request):  # (a red-team walk: RecursionError out of the reader made the run dead)
            return web.Response(text="[" * 2048 + "]" * 2048, content_type="application/json")

        async def nested(request):  # parses, but deeper than a payload may be
            return web.Response(text="[" * 40 + "]" * 40, content_type="application/json")

        async def huge_int(request):
            return web.Response(text='{"n": %d}' % 2**70, content_type="application/json")
        app.router.add_post("/json", answer)
        app.router.add_post("/text", text)
        app.router.add_post("/deep", deep)
        app.router.add_post("/nested", nested)
        app.router.add_post("/huge", huge_int)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            url = str(server.make_url("/json"))
            c = ctx()
            assert (await execute({"type": "http", "url": url, "result": True}, c, 10)).ok
            assert c.result == {"rows": 42}
            c = ctx()
            assert (await execute({"type": "http", "url": url}, c, 10)).ok
            assert c.result is None  # not asked: the body is output only
            # Asked, but the body is no JSON: the run still succeeds, and its output says why
            # its children get no result (else they would only see a null).
            c = ctx()
            out = await execute({"type": "http", "url": str(server.make_url("/text")), "result": True}, c, 10)
            assert out.ok and c.result is None
            assert out.output.startswith("HTTP 200\n") and out.output.rstrip().endswith(
                'the response body is not JSON; no result kept (docs/pipelines.md, "Results")'), out.output
            for path, why in (("/deep", "is nested more than 32 levels deep"),
                              ("/nested", "is nested more than 32 levels deep"),
                              ("/huge", "holds a value a command cannot carry (an integer beyond 64 bits)")):
                c = ctx()
                out = await execute({"type": "http", "url": str(server.make_url(path)), "result": True}, c, 10)
                assert out.ok and c.result is None and out.error is None, (path, out)
                assert out.output.rstrip().endswith(f'the response body {why}; no result kept '
                                                    '(docs/pipelines.md, "Results")'), (path, out.output[-200:])
        finally:
            await server.close()
    run(t())


def test_http_error_status_redirect_and_bounded_body():
    async def t():
        async with Hook() as hook:
            out = await execute({"type": "http", "url": hook.url("/fail")}, ctx(), 10)
            assert (out.ok, out.error, out.output) == (False, "HTTP 500", "HTTP 500\nboom: database down")
            # A redirect is not followed (it would turn the POST into a GET without the payload).
            out = await execute({"type": "http", "url": hook.url("/redirect")}, ctx(), 10)
            assert (out.ok, out.error) == (False, "HTTP 302")
            assert out.output.startswith("HTTP 302\nLocation: /ok\n")
            assert hook.requests == []
            out = await execute({"type": "http", "url": hook.url("/big")}, ctx(), 10)
            assert out.ok and out.output.startswith("HTTP 200\na")
            assert len(out.output.encode()) == OUTPUT_BYTES_MAX
    run(t())


def test_http_timeout_and_cancel():
    async def t():
        async with Hook() as hook:
            out = await execute({"type": "http", "url": hook.url("/slow")}, ctx(), 0.3)
            assert (out.ok, out.error) == (False, "timed out after 0.3s")
            assert hook.entered.is_set()
            hook.entered.clear()
            cancel = asyncio.Event()
            task = asyncio.create_task(execute({"type": "http", "url": hook.url("/slow")}, ctx(), 30, cancel=cancel))
            await asyncio.wait_for(hook.entered.wait(), 5)
            cancel.set()
            out = await asyncio.wait_for(task, 5)
            assert (out.ok, out.error) == (False, "lease lost")
    run(t())


def test_http_connection_refused_and_shared_session():
    async def t():
        out = await execute({"type": "http", "url": f"http://127.0.0.1:{free_port()}/hook"}, ctx(), 5)
        assert not out.ok and out.error.startswith("ClientConnectorError: "), out
        async with Hook() as hook, aiohttp.ClientSession() as session:
            for _ in range(2):
                out = await execute({"type": "http", "url": hook.url("/ok")}, ctx(), 5, http_session=session)
                assert out.ok, out
            assert not session.closed  # a caller's session is the caller's to close
            assert len(hook.requests) == 2
    run(t())


# ------------------------------------------------------------------ a tenant's network policy (issue 22)
def _fake_dns(loop, answers: list[list[str]]):
    """Replace the loop's getaddrinfo: each call answers the next list of addresses (the last one
    again once they run out); returns the list of names it was asked."""
    asked: list[str] = []

    async def getaddrinfo(host, port, *, family=0, type=0, proto=0, flags=0):
        asked.append(host)
        addrs = answers[min(len(asked), len(answers)) - 1]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port, 0, 0) if ":" in a else (a, port)) for a in addrs]
    loop.getaddrinfo = getaddrinfo
    return asked


def test_a_run_a_network_policy_holds_reaches_only_what_it_allows():
    """Every address the host resolves to is checked before anything is sent: loopback (by address
    or by a name), and a name that resolves to a refused address among allowed ones, fail the run
    saying why; an allowed network is reached. No policy (an admin's job): anywhere, as before."""
    async def t():
        async with Hook() as hook:
            port = hook.server.port
            for url, why in ((hook.url("/ok"), "127.0.0.1 is loopback"),
                             (f"http://localhost:{port}/ok", "localhost resolves to"),
                             ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is cloud metadata"),
                             ("http://[::ffff:127.0.0.1]:9/", "is loopback"),
                             ("http://10.1.2.3:9/", "10.1.2.3 is private")):
                out = await execute({"type": "http", "url": url}, ctx(), 10, network={"allow": [], "tenant": "t"})
                assert not out.ok and "refused by the network policy of tenant" in out.error and why in out.error, (url, out)
            asked = _fake_dns(asyncio.get_running_loop(), [["93.184.215.14", "127.0.0.1"]])
            out = await execute({"type": "http", "url": f"http://mixed.test:{port}/ok"}, ctx(), 10,
                                network={"allow": [], "tenant": "t"})
            assert not out.ok and "mixed.test resolves to 127.0.0.1, which is loopback" in out.error, out
            assert hook.requests == [], "nothing was sent"
            out = await execute({"type": "http", "url": hook.url("/ok")}, ctx(), 10, network={"allow": ["127.0.0.0/8"]})
            assert out.ok, out
            out = await execute({"type": "http", "url": hook.url("/ok")}, ctx(), 10)
            assert out.ok and len(hook.requests) == 2 and asked == ["mixed.test"]
    run(t())


def test_a_name_that_resolves_elsewhere_later_cannot_move_the_connection():
    """DNS rebinding: the run connects to the addresses it checked, never to what a second look-up
    says; the request still names the URL's host."""
    async def t():
        async with Hook() as hook:
            port = hook.server.port
            asked = _fake_dns(asyncio.get_running_loop(), [["127.0.0.1"], ["10.9.9.9"]])
            out = await execute({"type": "http", "url": f"http://rebind.test:{port}/ok"}, ctx(), 10,
                                network={"allow": ["127.0.0.1/32"]})
            assert out.ok, out
            assert asked == ["rebind.test"], "resolved once, by the check"
            assert hook.requests[0]["headers"]["Host"] == f"rebind.test:{port}"
            out = await execute({"type": "http", "url": f"http://rebind.test:{port}/ok"}, ctx(), 10,
                                network={"allow": ["127.0.0.1/32"]})
            assert not out.ok and "10.9.9.9, which is private" in out.error, "the next run checks the new answer"
    run(t())


def test_framing_headers_of_a_stored_job_fail_its_run_without_sending():
    async def t():
        async with Hook() as hook:
            for h in ({"Host": "metadata.internal"}, {"transfer-encoding": "chunked"}):
                out = await execute({"type": "http", "url": hook.url("/ok"), "headers": h}, ctx(), 10)
                assert not out.ok and "frames the request" in out.error and next(iter(h)) in out.error, out
            assert hook.requests == []
    run(t())


def test_the_address_rule():
    from raftsched.core import network
    from raftsched.core.errors import InvalidSpec
    for addr, why in (("127.0.0.1", "loopback"), ("::1", "loopback"), ("169.254.169.254", "cloud metadata"),
                      ("fd00:ec2::254", "cloud metadata"), ("169.254.1.1", "link-local"), ("fe80::1%eth0", "link-local"),
                      ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
                      ("100.64.0.1", "private"), ("fc00::1", "private"), ("0.0.0.0", "unspecified"),
                      ("224.0.0.1", "multicast"), ("::ffff:127.0.0.1", "loopback"),
                      ("64:ff9b::a9fe:a9fe", "cloud metadata"), ("nonsense", "not an IP address"),
                      # (6to4 to loopback and to the metadata service; NAT64's local-use prefix,
                      # whose layout hides which IPv4 address it reaches; site-local)
                      ("2002:7f00:1::1", "loopback"), ("2002:a9fe:a9fe::1", "cloud metadata"),
                      ("64:ff9b:1:7f00:0:100:5db8:d70e", "private"), ("fec0::1", "private")):
        assert why in (network.refusal(addr, []) or ""), addr
    for addr in ("93.184.215.14", "2606:2800:220:1::1"):
        assert network.refusal(addr, []) is None, addr
    assert network.refusal("10.1.2.3", ["10.1.2.0/24"]) is None
    assert network.refusal("::ffff:10.1.2.3", ["10.1.2.0/24"]) is None
    assert network.check_allow(["fd00::/8", "10.1.2.3", "10.0.0.0/8", "10.0.0.0/8"], "a") == [
        "10.0.0.0/8", "10.1.2.3/32", "fd00::/8"]
    for bad in (["10.0.0.1/8"], ["x"], [5], "10.0.0.0/8", ["10.0.0.0/33"]):
        try:
            network.check_allow(bad, "network.allow")
        except InvalidSpec as e:
            assert e.field.startswith("network.allow"), e
        else:
            raise AssertionError(bad)
