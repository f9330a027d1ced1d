"""The members' API URLs, as the nodes announce them (``GET /v1/cluster``'s ``member_urls``, the
dashboard's links between nodes): the snapshot section ``"member_urls"``, Raft address -> URL.

Each node proposes a ``member_url`` for itself when the state does not hold its URL yet (or holds
another: it moved), so any node can tell a client where the others' APIs are. The replication
layer, not the state, knows who the members are: the section may hold a removed member's
address, which readers leave out by joining it with the current members. It is bounded
(``limits.member_urls_max``): a new address beyond that drops the one announced longest ago.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import limits, snapshot
from .errors import InvalidCommand
from .records import Result, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

_ADDR_RE = re.compile(r"[A-Za-z0-9._\[\]:-]{1,253}:[0-9]{1,5}")
_URL_RE = re.compile(r"https?://[A-Za-z0-9._\[\]:-]{1,253}:[0-9]{1,5}")


def check_member_url(addr: object, url: object) -> tuple[str, str]:
    """A ``member_url`` command's fields: a Raft address ``HOST:PORT`` and an API URL
    ``http(s)://HOST:PORT`` (no path, no user part). :raises InvalidCommand:"""
    if not isinstance(addr, str) or not _ADDR_RE.fullmatch(addr):
        raise InvalidCommand("member_url.addr must be a Raft address HOST:PORT")
    if not isinstance(url, str) or len(url) > limits.member_url_chars_max or not _URL_RE.fullmatch(url):
        raise InvalidCommand("member_url.url must be an API URL http(s)://HOST:PORT")
    return addr, url


def apply_member_url(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``member_url {addr, url}``: the member at Raft address ``addr`` serves its API at ``url``.
    :raises InvalidCommand: a malformed address or URL (nothing changes)."""
    addr, url = check_member_url(cmd.get("addr"), cmd.get("url"))
    urls = s.member_urls
    urls.pop(addr, None)  # re-announced: the newest, so the last to give way
    urls[addr] = url
    while len(urls) > limits.member_urls_max:
        del urls[next(iter(urls))]
    return ok(addr=addr, url=url)


def member_urls(s: SchedulerState) -> dict[str, str]:
    """Raft address -> API URL, as announced (a copy)."""
    return dict(s.member_urls)


def _encode(urls: dict[str, str]) -> Any:
    # In announcement order, which is the same on every replica (the log's).
    return [[a, u] for a, u in urls.items()] if urls else None


def _decode(data: list[list[str]]) -> dict[str, str]:
    return {a: u for a, u in data}


EXTENSION = snapshot.register(snapshot.Extension(name="member_urls", new=dict, encode=_encode, decode=_decode))
