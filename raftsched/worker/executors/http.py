"""The http executor: one POST of the payload with the run's identity headers, redirects not followed.

``{"type": "http", "url": "...", "headers"?: {...}}``; the package docstring gives the contract.
"""
from __future__ import annotations

import asyncio

import aiohttp
from multidict import CIMultiDict

from .. import limits
from ._context import RunContext, Result
from ._deadline import run_task, stopped, timed_out
from ._output import OUTPUT_BYTES_MAX, exc_reason, short, tail_bytes


async def _read_capped(content: aiohttp.StreamReader, cap: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < cap:
        chunk = await content.read(cap - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


async def _http_post(ex: dict, ctx: RunContext, timeout_s: float,
                     session: aiohttp.ClientSession | None) -> Result:
    own = session is None
    if own:
        session = aiohttp.ClientSession()
    try:
        headers: CIMultiDict[str] = CIMultiDict(ex.get("headers") or {})
        # The run identity last, replacing (case-insensitively) any executor header of that name.
        for name, value in ctx.headers().items():
            headers[name] = value
        headers.setdefault("Content-Type", "application/json")
        body = ctx.payload_json().encode()
        try:
            async with session.post(ex["url"], data=body, headers=headers, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                data = await _read_capped(resp.content, limits.http_body_read_bytes_max)
                # Cut at the read cap: the kept tail may then start mid-character.
                cut = len(data) >= limits.http_body_read_bytes_max
                status = resp.status
                location = resp.headers.get("Location")
        except asyncio.TimeoutError:
            return False, timed_out(timeout_s), ""
        except (aiohttp.ClientError, OSError, ValueError) as e:
            # Connection refused, DNS, TLS, a malformed response: the class says which.
            return False, short(exc_reason(e)), ""
    finally:
        if own:
            await session.close()
    head = f"HTTP {status}\n"
    if location is not None and 300 <= status < 400:
        head += f"Location: {location}\n"
    output = head + tail_bytes(data, max(0, OUTPUT_BYTES_MAX - len(head.encode())), cut=cut)
    if 200 <= status < 300:
        return True, None, output
    return False, f"HTTP {status}", output


async def run_http(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                    session: aiohttp.ClientSession | None) -> Result:
    # aiohttp's total timeout covers the request; the race adds the cancel event (and is a
    # backstop should the client's timeout not fire).
    how, result = await run_task(_http_post(ex, ctx, timeout_s, session), timeout_s, cancel)
    return result if how == "done" else stopped(how, timeout_s)

