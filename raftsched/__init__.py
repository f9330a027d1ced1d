"""raftsched: a distributed job scheduler on an embedded Raft state machine.

``from raftsched import App, AsyncClient, Client``: the SDK's declarations (raftsched/sdk/) and
the two API clients, imported on first use (and ``raftsched.__version__``, read from the
package's metadata on first use) so that ``import raftsched.core`` (every node, every
tool) does not pay for them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees of the names loaded on first use
    from .client import Client as Client
    from .client.asynchronous import AsyncClient as AsyncClient
    from .sdk import App as App, Context as Context

_LAZY = {
    "App": "raftsched.sdk",
    "Context": "raftsched.sdk",
    "AsyncClient": "raftsched.client.asynchronous",
    "Client": "raftsched.client",
}

__all__ = sorted(_LAZY)  # noqa: PLE0605 - the lazily loaded names, listed once


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, through its metadata)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("raftsched")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raftsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})
