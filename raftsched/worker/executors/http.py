"""The http executor: one POST of the payload with the run's identity headers, redirects not followed.

``{"type": "http", "url": "...", "headers"?: {...}}``; the package docstring gives the contract.

A run its tenant's policy holds comes with ``network`` (``{"allow": [networks]}``, from its grant:
core/tenants.py): before connecting, the URL's host is resolved here and every address it
resolves to is checked (core/network.py: public addresses, and the allowed networks); one that
is not allowed fails the run, saying which and why. The connection then goes to the addresses
checked, and to no other (a resolver that answers with them only), so a name that resolves
elsewhere a moment later (DNS rebinding) cannot move it; the Host header and TLS still name the
URL's host. Headers that frame the request (Host, Content-Length, Transfer-Encoding, Connection)
are the executor's: a job that sets one (the API refuses them; a job stored before that did
not) fails without sending anything.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from multidict import CIMultiDict
from yarl import URL

from ...core import limits as core_limits, network as net_policy
from ...core.model import FRAMING_HEADERS
from .. import limits
from ._context import RunContext, Result
from ._deadline import run_task, stopped, timed_out
from ..masking import mask, secret_values
from ..results import parse_result
from ._output import OUTPUT_BYTES_MAX, exc_reason, short, tail_bytes

log = logging.getLogger("raftsched.executors")


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


class _Pinned(AbstractResolver):
    """A resolver that answers with addresses checked already, whatever it is asked."""

    def __init__(self, addrs: list[tuple[int, str]]) -> None:
        self._addrs = addrs

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [{"hostname": host, "host": a, "port": port, "family": f, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}
                for f, a in self._addrs if family in (socket.AF_UNSPEC, f)]

    async def close(self) -> None:
        return None


async def checked_addresses(url: str, allow: list[str],
                            tenant: str = "?") -> tuple[list[tuple[int, str]] | None, str | None]:
    """``(addresses, None)``: the addresses ``url``'s host resolves to, every one allowed by a
    network policy allowing ``allow`` (core/network.py; of ``tenant``, for the message); or
    ``(None, why)``: the run may not connect (an address is refused, or the host does not resolve)."""
    u = URL(url)
    host, port = u.raw_host, u.port
    if not host or port is None:
        return None, f"{url!r} names no host"
    if host.endswith(".."):
        host = host.rstrip(".") + "."
    try:
        literal: Any = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        literal = None
    if literal is not None:
        found = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, host)]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            return None, f"cannot resolve {host}: {e}"
        found = []
        for fam, _type, _proto, _canon, sockaddr in infos:
            if fam in (socket.AF_INET, socket.AF_INET6) and (fam, sockaddr[0]) not in found:
                found.append((fam, str(sockaddr[0])))
        if not found:
            return None, f"{host} resolves to no IP address"
    for _fam, addr in found:
        what = net_policy.refused_as(addr, allow)
        if what is not None:
            shown = f"{addr} is {what}" if literal is not None else f"{host} resolves to {addr}, which is {what}"
            return None, (f"refused by the network policy of tenant {tenant!r}: {shown}; an admin may allow "
                          f"the network (network.allow in PUT /v1/tenants/{tenant})")
    return found, None


async def _http_post(ex: dict, ctx: RunContext, timeout_s: float,
                     session: aiohttp.ClientSession | None, network: dict | None = None) -> Result:
    framing = sorted(k for k in (ex.get("headers") or {}) if k.lower() in FRAMING_HEADERS)
    if framing:
        return False, f"header {framing[0]} frames the request: the executor sets it, a job cannot", ""
    own = session is None or network is not None
    masked = secret_values(ex, ctx.secrets)
    if network is not None:
        addrs, why = await checked_addresses(ex["url"], list(network.get("allow") or ()),
                                             str(network.get("tenant") or "?"))
        if addrs is None:
            return False, short(why or "refused by the tenant's network policy"), ""
        # A session of its own, connecting to the checked addresses only.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=_Pinned(addrs),
                                                                       use_dns_cache=False))
    elif session is None:
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
            return False, short(exc_reason(e), masked=masked), ""
    finally:
        if own:
            await session.close()
    head = f"HTTP {status}\n"
    if location is not None and 300 <= status < 400:
        head += f"Location: {location}\n"
    head = mask(head, masked) or ""
    note = ""
    if 200 <= status < 300 and ex.get("result"):
        # Asked for (pipelines): the JSON response body is the run's result, for its children.
        if cut:
            why: str | None = f"is larger than {core_limits.result_bytes_max} bytes"
        else:
            ctx.result, why = parse_result(data)
        if why is not None:  # said in the run's output, as a result file's is (docs/pipelines.md)
            log.warning("http executor: the response body of run %s %s; no result kept", ctx.run_id, why)
            note = f"\nraftsched: the response body {why}; no result kept (docs/pipelines.md, \"Results\")\n"
    room = max(0, OUTPUT_BYTES_MAX - len(head.encode()) - len(note.encode()))
    output = head + tail_bytes(data, room, cut=cut, masked=masked) + note
    if 200 <= status < 300:
        return True, None, output
    return False, f"HTTP {status}", output


async def run_http(ex: dict, ctx: RunContext, timeout_s: float, cancel: asyncio.Event | None,
                   session: aiohttp.ClientSession | None, network: dict | None = None) -> Result:
    # aiohttp's total timeout covers the request; the race adds the cancel event (and is a
    # backstop should the client's timeout not fire).
    how, result = await run_task(_http_post(ex, ctx, timeout_s, session, network), timeout_s, cancel)
    return result if how == "done" else stopped(how, timeout_s)

