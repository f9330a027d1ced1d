"""The asyncio client's former module: :class:`AsyncClient` and :class:`AsyncLock` are in
raftsched/client/asynchronous.py (``from raftsched import AsyncClient``)."""
from __future__ import annotations

from .client.asynchronous import AsyncClient, AsyncLock
from .client.asynchronous import _Attempts as _Attempts
from .client.endpoints import ENDPOINTS

__all__ = ["AsyncClient", "AsyncLock", "ENDPOINT_METHODS"]

#: The endpoint methods both clients have, by name (raftsched/client/endpoints.py).
ENDPOINT_METHODS = tuple(ENDPOINTS)
