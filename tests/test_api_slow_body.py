"""A request whose body does not arrive whole (a client that sent less than its Content-Length
and waits, trickles it, or breaks its chunks): the node answers it 408 within its bound
(node/limits.py request_body_s) and changes nothing; a client that gives up mid-body is no
internal error of the node; and such a connection does not hold a graceful stop.

The API is served as the node serves it (node/node.py api_runner: aiohttp's AppRunner, whose
handlers a lost connection does not cancel, unlike aiohttp's TestServer), on a free loopback
port, and spoken to over raw sockets: an HTTP client library sends whole bodies."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import time

import pytest
from aiohttp import http_parser, web, web_protocol, web_request

from raftsched.node import limits as node_limits
from raftsched.node import openapi
from raftsched.node.api import ROUTES
from raftsched.node.node import NodeConfig, api_runner, run_node

from procs import free_ports, http
from test_api import TOKEN, Env

#: How long a test waits for what should take well under a second.
DEADLINE_S = 10.0


@pytest.fixture
def body_reads(monkeypatch):
    """An event set when a handler starts to read its request's body, whatever reads it (the
    code before and after the bound alike): a test sends part of a body, then waits for this
    rather than for a guessed time."""
    started = asyncio.Event()
    original = web_request.BaseRequest.read

    async def read(self):
        started.set()
        return await original(self)

    monkeypatch.setattr(web_request.BaseRequest, "read", read)
    return started


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = api_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


@contextlib.asynccontextmanager
async def _connected(app: web.Application):
    """The app served on a free loopback port, and one raw connection to it: (reader, writer);
    both closed after."""
    runner, port = await _serve(app)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            yield reader, writer
        finally:
            writer.close()
    finally:
        await runner.cleanup()


def _head(method: str, path: str, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict, dict]:
    """The status, headers (lower-case names) and JSON body of one HTTP answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, json.loads(body)


@pytest.mark.parametrize("method,path", [
    ("PUT", "/v1/jobs/slow1"),          # a body read by json_body
    ("POST", "/v1/jobs:batch"),         # its own size bound (a clone of the request)
    ("POST", "/v1/jobs/a/trigger"),     # an optional body
    ("POST", "/v1/jobs/a/pause"),       # a route that takes none is sent one: read to be judged
])
def test_a_body_shorter_than_its_content_length_is_answered_408_within_the_bound(monkeypatch, method, path):
    monkeypatch.setattr(node_limits, "request_body_s", 0.5)

    async def main():
        env = Env()
        async with _connected(env.app) as (reader, writer):
            before = env.state.snapshot()
            t0 = time.monotonic()
            writer.write(_head(method, path, "Content-Length: 100\r\n") + b"{")
            await writer.drain()
            status, headers, body = await asyncio.wait_for(_answer(reader), DEADLINE_S)
            took = time.monotonic() - t0
            assert status == 408, body
            assert body == {"error": {"code": "request_timeout", "field": None,
                                      "message": body["error"]["message"]}}, body
            assert "0.5 s" in body["error"]["message"] and "Content-Length: 100" in body["error"]["message"]
            assert 0.5 <= took < 0.5 + 3, took
            assert headers.get("connection", "").lower() == "close", headers
            assert env.state.snapshot() == before, "a refused request changes nothing"
    asyncio.run(main())


def test_a_broken_chunk_mid_body_is_a_400_not_a_500(monkeypatch, body_reads, caplog):
    """A chunked body whose next chunk size is no number, after the handler started to read it:
    aiohttp's Python parser fails the read (its C parser, the default, leaves it waiting: a 408
    after the bound, as above). Bad input of the client: a 400 in the API's shape."""
    monkeypatch.setattr(web_protocol, "HttpRequestParser", http_parser.HttpRequestParserPy)
    caplog.set_level(logging.DEBUG)

    async def main():
        env = Env()
        async with _connected(env.app) as (reader, writer):
            before = env.state.snapshot()
            writer.write(_head("PUT", "/v1/jobs/c", "Transfer-Encoding: chunked\r\n") + b"1\r\n{\r\n")
            await writer.drain()
            await asyncio.wait_for(body_reads.wait(), DEADLINE_S)
            writer.write(b"zz\r\n1\r\n}\r\n0\r\n\r\n")
            await writer.drain()
            status, _, body = await asyncio.wait_for(_answer(reader), DEADLINE_S)
            assert status == 400 and body["error"]["code"] == "bad_request", body
            assert "malformed request body" in body["error"]["message"], body
            assert env.state.snapshot() == before
    asyncio.run(main())
    # (aiohttp itself logs the broken framing, met again as it reads what is left of the body
    # after the answer: its log, not the node's.)
    errors = [r for r in caplog.records if r.name.startswith("raftsched")
              and (r.levelno >= logging.ERROR or "internal error" in r.getMessage())]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_a_client_gone_mid_body_is_no_internal_error(body_reads, caplog, how):
    caplog.set_level(logging.DEBUG)

    async def main():
        env = Env(metrics=True)
        runner, port = await _serve(env.app)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            before = env.state.snapshot()
            writer.write(_head("PUT", "/v1/jobs/slow1", "Content-Length: 100\r\n") + b"{")
            await writer.drain()
            await asyncio.wait_for(body_reads.wait(), DEADLINE_S)
            if how == "rst":
                writer.transport.abort()
            else:
                writer.close()
            # The handler has ended once the request is counted (audit_middleware, outermost).
            deadline = time.monotonic() + DEADLINE_S
            while not env.metrics.requests.counts:
                assert time.monotonic() < deadline, "the request never ended"
                await asyncio.sleep(0.02)  # ok-sleep: polling interval inside a deadline loop
            assert env.state.snapshot() == before
            assert not [k for k in env.metrics.requests.counts if k[2] == "500"], env.metrics.requests.counts
        finally:
            await runner.cleanup()
    asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or "internal error" in r.getMessage()]
    assert not errors, [r.getMessage() for r in errors]
    gone = [r for r in caplog.records if r.name == "raftsched.api" and "/v1/jobs/slow1" in r.getMessage()]
    assert gone and all(r.levelno <= logging.INFO for r in gone), [(r.levelname, r.getMessage()) for r in gone]


def test_every_route_that_takes_a_body_documents_408():
    doc = openapi.document(ROUTES)
    assert openapi.error_codes(408) == ["request_timeout"]
    for r in ROUTES:
        if r.body is not None:
            assert "408" in doc["paths"][r.path][r.method.lower()]["responses"], (r.method, r.path)


@pytest.fixture
def node_cfg(tmp_path):
    """A one-node cluster's config (as tests/test_node.py's); run_node's process-wide settings
    (umask, gc thresholds) are put back afterwards."""
    api, raft = free_ports(2)
    umask = os.umask(0o022)
    os.umask(umask)
    threshold = gc.get_threshold()
    yield NodeConfig(node_id="node-1", api_host="127.0.0.1", api_port=api, raft_addr=f"127.0.0.1:{raft}",
                     peers=[], data_dir=str(tmp_path / "node-1"), secret="s" * 32, token=TOKEN)
    os.umask(umask)
    gc.set_threshold(*threshold)


def test_a_graceful_stop_is_not_held_by_a_body_that_never_arrives(node_cfg, body_reads):
    """What SIGTERM does (it sets ``stop``), with a request's body stalled at the default bound:
    the node stops within twice node_limits.api_stop_grace_s and a margin, well before a
    supervisor's SIGKILL (10 s: scripts/cluster.sh, the test harness)."""
    bound_s = 2 * node_limits.api_stop_grace_s + 3
    assert bound_s < 10 and node_limits.request_body_s > bound_s  # the stop, not the 408, ends it

    async def main():
        stop = asyncio.Event()
        node = asyncio.create_task(run_node(node_cfg, stop=stop))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:  # the node answers, and leads (a one-node cluster)
            try:
                status, _ = await asyncio.to_thread(http, "GET", f"http://127.0.0.1:{node_cfg.api_port}/healthz",
                                                    timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            assert loop.time() < deadline, "the node never led"
            await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop
        reader, writer = await asyncio.open_connection("127.0.0.1", node_cfg.api_port)
        try:
            writer.write(_head("PUT", "/v1/jobs/slow1", "Content-Length: 100\r\n") + b"{")
            await writer.drain()
            await asyncio.wait_for(body_reads.wait(), DEADLINE_S)
            t0 = loop.time()
            stop.set()
            done, _ = await asyncio.wait({node}, timeout=bound_s)
            took = loop.time() - t0
        finally:
            writer.close()  # (before the bound, this is what let the node stop)
        if not done:
            await asyncio.wait_for(node, 120)
            pytest.fail(f"the node's stop took more than {bound_s} s with a body stalled")
        node.result()  # a clean stop: no error
        assert took < bound_s
    asyncio.run(main())
