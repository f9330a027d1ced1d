"""The http executor (DESIGN.md section 6): the request a run makes and how its response ends it.

A real HTTP server on 127.0.0.1; no fixed sleeps: every wait is for an event, under a deadline.
"""
from __future__ import annotations

import asyncio
import json

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
