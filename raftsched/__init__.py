"""raftsched: a distributed job scheduler on an embedded Raft state machine.

``from raftsched import App, AsyncClient, Client``: the SDK's declarations (raftsched/sdk/) and
the two API clients, imported on first use so that ``import raftsched.core`` (every node, every
tool) does not pay for them.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "App": "raftsched.sdk",
    "Context": "raftsched.sdk",
    "AsyncClient": "raftsched.client.asynchronous",
    "Client": "raftsched.client",
}

__all__ = sorted(_LAZY)  # noqa: PLE0605 - the lazily loaded names, listed once


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raftsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
