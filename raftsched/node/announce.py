"""A node announces its API URL to the cluster (core/members.py), so that ``GET /v1/cluster`` on
any node lists where every member's API is (the dashboard links the nodes with it).

While the replica does not hold this node's URL, and a leader is known, the node proposes a
``member_url`` every ``announce_retry_s``; once it is there it looks again every
``announce_check_s`` (a snapshot restored from before it, or a URL that changed on restart). A node
listening on a wildcard address (``0.0.0.0``, ``::``) has no one URL, and announces none
(``api_url``: the node then starts no such loop).
"""
from __future__ import annotations

import asyncio
import logging

from ..clock import Clock
from ..core import commands, members
from ..core.errors import RaftschedError
from ..proposer import Proposer

log = logging.getLogger("raftsched.announce")

announce_retry_s = 1.0
announce_check_s = 30.0


def api_url(host: str, port: int, tls: bool) -> str | None:
    """This node's API URL, or None for a wildcard address (no one URL reaches it)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


async def announce_loop(raft, clock: Clock, addr: str, url: str) -> None:
    """Propose this node's ``member_url`` whenever the replica lacks it, until cancelled."""
    proposer = Proposer(raft)
    while True:
        wait = announce_retry_s
        if raft.read(members.member_urls).get(addr) == url:
            wait = announce_check_s
        elif raft.status().get("leader") is not None:
            try:
                await proposer.propose(commands.member_url(clock.now_ms(), addr=addr, url=url))
                wait = announce_check_s
            except RaftschedError as e:  # no leader yet, a fail-over: again shortly
                log.info("announce: %s not announced yet (%s)", url, e)
        await asyncio.sleep(wait)
