"""Clients: each operation through the admin API is recorded as ``invoke``, then ``ok``, ``fail``
(it did not happen) or ``info`` (unknown: it may have happened, now or later), as in Jepsen.

Mapping: 2xx ok; 503 (Unavailable: no leader, queue full) fail; 504 (Indeterminate) info; other
4xx fail (a definite refusal, e.g. 404 for a job already deleted); 5xx other than 503/504 info;
a connection that could not be opened fail (the request never left); a lost connection or a
timeout info.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp


class History:
    """The run's history, appended to history.jsonl as it happens (a crash keeps what was seen)."""

    def __init__(self, path) -> None:
        self.ops: list[dict] = []
        self._f = open(path, "a")

    def add(self, rec: dict) -> dict:
        rec = dict(rec, index=len(self.ops), t_ms=time.time_ns() // 1_000_000)
        self.ops.append(rec)
        self._f.write(json.dumps(rec, sort_keys=True) + "\n")
        self._f.flush()
        return rec

    def close(self) -> None:
        self._f.close()


def _request(op: dict) -> tuple[str, str, dict | None]:
    job, f = op["job"], op["f"]
    if f in ("create", "update"):
        return "PUT", f"/v1/jobs/{job}", op["spec"]
    if f == "delete":
        return "DELETE", f"/v1/jobs/{job}", None
    if f in ("pause", "resume"):
        return "POST", f"/v1/jobs/{job}/{f}", None
    raise ValueError(f"unknown op {f!r}")


async def perform(session: aiohttp.ClientSession, url: str, token: str, op: dict, history: History,
                  process: str, key: str, timeout_s: float = 12.0) -> dict:
    """Run one client operation against ``url`` and record it. Returns the completion record."""
    method, path, body = _request(op)
    base = {"process": process, "f": op["f"], "job": op["job"], "node": op["node"], "key": key}
    if "spec" in op:
        base["spec"] = op["spec"]
    history.add(dict(base, type="invoke"))
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    try:
        async with session.request(method, url + path, json=body, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            status = r.status
            try:
                value = await r.json(content_type=None)
            except (ValueError, aiohttp.ContentTypeError):
                value = {"text": (await r.text())[:500]}
    except aiohttp.ClientConnectorError as e:
        return history.add(dict(base, type="fail", error=f"connect: {e.os_error!r}"))
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as e:
        return history.add(dict(base, type="info", error=f"{type(e).__name__}: {e}"))
    if 200 <= status < 300:
        kind = "ok"
    elif status == 504 or status >= 500 and status != 503:
        kind = "info"
    else:
        kind = "fail"
    return history.add(dict(base, type=kind, status=status, value=value))


async def client_loop(name: str, ops: list[dict], t0: float, nodes, token: str, history: History,
                      session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
    """Perform ``ops`` (this client's, in order), each no earlier than ``t0 + op["at"]``. One
    operation at a time: a job is owned by one client, so its operations never overlap."""
    for k, op in enumerate(ops):
        delay = t0 + op["at"] - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except asyncio.TimeoutError:
                pass
        if stop.is_set():
            return
        key = f"{name}-{k}-{op['f']}-{op['job']}"
        await perform(session, nodes[op["node"]].url, token, op, history, name, key)
