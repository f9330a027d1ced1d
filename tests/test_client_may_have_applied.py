"""A request that may have applied is never reported as definitely not applied (issue 20, part 2).

aiohttp sends a PUT or DELETE again by itself, once, on a new connection, when the connection
drops mid-request, and raises that resend's error. When the node has meanwhile stopped listening,
the error is "connection refused", although the first attempt's request had left (and, in the
fault run, applied). Both raftsched.AsyncClient and the fault harness's client
(jepsen-style/client.py) must then say "unknown" (Indeterminate / info), and keep "definitely
not" (Unavailable / fail) for a request that never left: a node that is not listening at all.

The servers here are raw asyncio socket servers (not aiohttp's), so the test decides exactly
when a connection closes and when the port stops listening.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from raftsched import AsyncClient
from raftsched.core.errors import Indeterminate, Unavailable
from raftsched.testing.procs import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-style"))
import client as harness  # noqa: E402  (jepsen-style/client.py)

#: bounds every wait here; the clients' own deadlines end the calls well within it
BOUND_S = 20.0


class ScriptedRawServer:
    """A loopback HTTP/1.1 server on a raw asyncio socket server, from a script with one step per
    request: ``"close"`` (read the whole request, head and Content-Length body, then close the
    connection without answering) or ``(status, body)`` (answer with ``Connection: close``).
    After the last step it stops listening before it closes the connection, so every later
    connect is refused. ``requests`` holds (request line, headers, body) of each request read."""

    def __init__(self, *steps) -> None:
        self.steps = list(steps)
        self.requests: list[tuple[str, dict, bytes]] = []
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> ScriptedRawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self._stop_listening()
        for w in list(self._writers):
            w.close()
        for w in list(self._writers):
            try:
                await asyncio.wait_for(w.wait_closed(), BOUND_S)
            except (OSError, asyncio.TimeoutError):
                pass
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), BOUND_S)

    def _stop_listening(self) -> None:
        # Closes the listening socket at once (existing connections stay open): from now on
        # a connect to the port is refused.
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *fields = head.split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((line, headers, body))
            step = self.steps.pop(0) if self.steps else "close"
            last = not self.steps
            if step != "close":
                status, answer = step
                data = json.dumps(answer).encode()
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
                await writer.drain()
            if last:
                self._stop_listening()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)


def _run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, BOUND_S)
    return asyncio.run(bounded())


SPEC = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "command": "true"}}


# ---------------------------------------------------------------------- raftsched.AsyncClient
@pytest.mark.parametrize("call", ["put_job", "delete_job"])
def test_async_client_a_request_that_left_then_met_a_refused_resend_is_indeterminate(call):
    async def main():
        async with ScriptedRawServer("close") as server:
            async with AsyncClient(server.url, token="t", deadline_s=1.0) as c:
                with pytest.raises(Indeterminate) as ei:
                    if call == "put_job":
                        await c.put_job("nightly", SPEC)
                    else:
                        await c.delete_job("nightly")
            return server, ei.value

    server, err = _run(main())
    assert err.definite is False and not isinstance(err, Unavailable)
    assert "may have applied" in err.message
    # The server read the whole request, with its Idempotency-Key, before the connection closed.
    (line, headers, body), = server.requests
    assert line.startswith("PUT " if call == "put_job" else "DELETE ")
    assert headers.get("idempotency-key")
    if call == "put_job":
        assert json.loads(body) == SPEC


def test_async_client_a_mutation_to_a_node_that_is_not_listening_is_unavailable():
    port, = free_ports(1)

    async def main():
        async with AsyncClient(f"http://127.0.0.1:{port}", token="t", deadline_s=0.5) as c:
            with pytest.raises(Unavailable) as ei:
                await c.put_job("nightly", SPEC)
            return ei.value

    err = _run(main())
    assert err.definite is True and not isinstance(err, Indeterminate)
    assert "no node reachable" in err.message


def test_async_client_a_dropped_request_is_sent_again_with_its_key_and_the_answer_returned():
    async def main():
        async with ScriptedRawServer("close", (200, {"name": "nightly", "created": True})) as server:
            async with AsyncClient(server.url, token="t", deadline_s=5.0) as c:
                return server, await c.put_job("nightly", SPEC)

    server, answer = _run(main())
    assert answer == {"name": "nightly", "created": True}
    assert len(server.requests) == 2
    assert len({h.get("idempotency-key") for _, h, _ in server.requests}) == 1  # the same key


# ---------------------------------------------------------------------- the fault harness's client
async def _perform(url: str, tmp_path, op: dict) -> dict:
    history = harness.History(tmp_path / "history.jsonl")
    try:
        # As run.py's session: no keep-alive, which does not stop aiohttp's resend.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            return await harness.perform(session, url, "t", op, history, "client-0", "k-1", timeout_s=5.0)
    finally:
        history.close()


@pytest.mark.parametrize("f", ["update", "delete"])
def test_harness_records_info_for_a_request_that_left_then_met_a_refused_resend(f, tmp_path):
    op = {"f": f, "job": "j1", "node": 0, **({"spec": SPEC} if f == "update" else {})}

    async def main():
        async with ScriptedRawServer("close") as server:
            return server, await _perform(server.url, tmp_path, op)

    server, rec = _run(main())
    assert rec["type"] == "info", rec
    (line, headers, body), = server.requests
    assert line.startswith("PUT " if f == "update" else "DELETE ") and headers.get("idempotency-key") == "k-1"
    recorded = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [r["type"] for r in recorded] == ["invoke", "info"]


def test_harness_records_fail_for_a_node_that_is_not_listening(tmp_path):
    port, = free_ports(1)
    rec = _run(_perform(f"http://127.0.0.1:{port}", tmp_path,
                        {"f": "update", "job": "j1", "node": 0, "spec": SPEC}))
    assert rec["type"] == "fail", rec
    assert rec["error"].startswith("connect: ")


@pytest.mark.parametrize("listening", [True, False])
def test_harness_bulk_operation_is_info_once_it_left_and_fail_when_nothing_listens(listening, tmp_path):
    op = {"f": "backfill", "job": "j1", "node": 0, "id": "bf-1", "back_s": 60, "span_s": 30,
          "reprocess": "failed", "order": "oldest_first", "max_concurrent": 1}

    async def main():
        history = harness.History(tmp_path / "history.jsonl")
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                if not listening:
                    url = f"http://127.0.0.1:{free_ports(1)[0]}"
                    return None, await harness.perform_bulk(session, url, "t", op, history, "client-0", "k-2")
                # The dry run is answered; the operation is read whole, then its connection closes.
                async with ScriptedRawServer((200, {"dry_run": True, "count": 2}), "close") as server:
                    return server, await harness.perform_bulk(session, server.url, "t", op, history, "client-0",
                                                              "k-2", timeout_s=5.0)
        finally:
            history.close()

    server, rec = _run(main())
    if listening:
        assert rec["type"] == "info", rec
        assert [json.loads(b).get("dry_run") for _, _, b in server.requests] == [True, None]
    else:
        assert rec["type"] == "fail", rec
        assert rec["error"].startswith("dry: connect: ")
