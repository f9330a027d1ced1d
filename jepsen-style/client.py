"""Clients: each operation through the admin API is recorded as ``invoke``, then ``ok``, ``fail``
(it did not happen) or ``info`` (unknown: it may have happened, now or later), as in Jepsen.

Mapping: 2xx ok; 503 (Unavailable: no leader, queue full) fail; 504 (Indeterminate) info; other
4xx fail (a definite refusal, e.g. 404 for a job already deleted); 5xx other than 503/504 info;
a connection that could not be opened, for every attempt of the request, fail (the request never
left); a lost connection or a timeout info, and so is a connect error once some attempt of the
request had a connection: aiohttp resends a PUT or DELETE by itself, once, on a new connection,
when the first one drops mid-request, and raises the resend's error, so its "connection refused"
can follow a request that left and applied (issue 20). :class:`Attempts` counts the attempts.
"""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone

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


class Attempts:
    """An aiohttp client middleware (aiohttp 3.12 and later) for one request: it wraps each
    attempt, aiohttp's own resend included, and counts those that never got a connection.

    aiohttp has no supported switch for its resend (``ClientSession._retry_connection`` is
    private), and a middleware is the documented hook that sees every attempt. The harness keeps
    its own (raftsched.AsyncClient has the same rule) so that it does not judge the product with
    the product's code. Pass it as the request's ``middlewares`` (it then replaces the session's:
    the harness's session has none)."""

    NO_CONNECTION = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)

    def __init__(self) -> None:
        self.made = 0
        self.not_connected = 0

    @property
    def may_have_left(self) -> bool:
        return self.made > self.not_connected

    async def __call__(self, req, handler):
        self.made += 1
        try:
            return await handler(req)
        except self.NO_CONNECTION:
            self.not_connected += 1
            raise


def _unsent(e: BaseException, attempts: Attempts) -> bool:
    """Whether the request that raised ``e`` provably never left: no attempt had a connection."""
    return isinstance(e, Attempts.NO_CONNECTION) and not attempts.may_have_left


def _error(e: BaseException, attempts: Attempts) -> str:
    if _unsent(e, attempts):
        return f"connect: {getattr(e, 'os_error', e)!r}"
    return f"{type(e).__name__}: {e} ({attempts.made} attempt(s))"


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
    attempts = Attempts()
    try:
        async with session.request(method, url + path, json=body, headers=headers, middlewares=(attempts,),
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            status = r.status
            try:
                value = await r.json(content_type=None)
            except (ValueError, aiohttp.ContentTypeError):
                value = {"text": (await r.text())[:500]}
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as e:
        kind = "fail" if _unsent(e, attempts) else "info"
        return history.add(dict(base, type=kind, error=_error(e, attempts)))
    if 200 <= status < 300:
        kind = "ok"
    elif status == 504 or status >= 500 and status != 503:
        kind = "info"
    else:
        kind = "fail"
    return history.add(dict(base, type=kind, status=status, value=value))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def bulk_body(op: dict, now_ms: int) -> dict:
    """The body of a backfill (a past range from this client's clock, on whole seconds) or a bulk
    requeue (the job's dead runs, or every job's), without dry_run."""
    if op["f"] == "backfill":
        to = (now_ms // 1000 - op["back_s"]) * 1000
        body = {"from": _iso(to - op["span_s"] * 1000), "to": _iso(to), "reprocess": op["reprocess"],
                "order": op["order"], "max_concurrent": op["max_concurrent"], "id": op["id"]}
        if op.get("rate_per_s") is not None:
            body["rate_per_s"] = op["rate_per_s"]
        return body
    body = {"max_count": op["max_count"], "rate_per_s": op["rate_per_s"], "id": op["id"]}
    if op.get("any_job"):
        body["all"] = True  # no filter: the node refuses it unless the body says every dead run is meant
    else:
        body["job"] = op["job"]
    return body


async def perform_bulk(session: aiohttp.ClientSession, url: str, token: str, op: dict, history: History,
                       process: str, key: str, timeout_s: float = 12.0) -> dict:
    """A backfill or bulk requeue: its dry run, then the operation itself with the same body and
    its id (idempotent). Recorded as one operation whose value holds both answers: ``fail`` when
    the dry run or the operation definitely did not happen; ``info`` when the operation's outcome
    is unknown."""
    path = f"/v1/jobs/{op['job']}/backfills" if op["f"] == "backfill" else "/v1/dlq:requeue"
    body = bulk_body(op, time.time_ns() // 1_000_000)
    base = {"process": process, "f": op["f"], "job": op["job"], "node": op["node"], "key": key, "id": op["id"],
            "body": body}
    history.add(dict(base, type="invoke"))
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    value: dict = {}
    for phase, b in (("dry", dict(body, dry_run=True)), ("res", body)):
        attempts = Attempts()
        try:
            async with session.post(url + path, json=b, headers=headers if phase == "res" else
                                    {"Authorization": headers["Authorization"]}, middlewares=(attempts,),
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                status = r.status
                try:
                    value[phase] = await r.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    value[phase] = {"text": (await r.text())[:500]}
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as e:
            # A dry run changed nothing, whatever became of it; the operation may have applied
            # unless it provably never left (aiohttp does not resend a POST today, but the rule
            # does not depend on it).
            kind = "fail" if phase == "dry" or _unsent(e, attempts) else "info"
            return history.add(dict(base, type=kind, error=f"{phase}: {_error(e, attempts)}", value=value))
        if not 200 <= status < 300:
            kind = "info" if phase == "res" and (status == 504 or status >= 500 and status != 503) else "fail"
            return history.add(dict(base, type=kind, status=status, value=value))
    return history.add(dict(base, type="ok", status=status, value=value))


async def client_loop(name: str, ops: list[dict], t0: float, nodes, token: str, history: History,
                      session: aiohttp.ClientSession, stop: asyncio.Event, route=None) -> None:
    """Perform ``ops`` (this client's, in order), each no earlier than ``t0 + op["at"]``. One
    operation at a time: a job is owned by one client, so its operations never overlap.
    ``route(k)`` is the node index the op's pre-drawn node ``k`` stands for now (the members
    change under the membership nemesis); the op records the node it went to."""
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
        if route is not None:
            op = dict(op, node=route(op["node"]))
        if op["f"] in ("backfill", "requeue"):
            await perform_bulk(session, nodes[op["node"]].url, token, op, history, name, key)
        else:
            await perform(session, nodes[op["node"]].url, token, op, history, name, key)
