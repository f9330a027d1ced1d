"""The clients of the raftsched admin API: :class:`Client` (blocking, standard library only)
and :class:`AsyncClient` (asyncio, aiohttp), with the same methods, one per endpoint.

    from raftsched.client import Client

    c = Client(["http://127.0.0.1:8701", "http://127.0.0.1:8702", "http://127.0.0.1:8703"],
               token=open(".raftsched/token").read().strip())
    c.put_job("nightly", {"schedule": {"cron": "30 2 * * *"}, ...})
    with c.lock("reindex", owner="host-a", ttl_s=10) as lease:
        store.write("index", data, token=lease.token)   # pass the token to EVERY downstream write

The package, from the bottom up (nothing here imports raftsched.node):

- ``core.py``: one call, without I/O: the :class:`~raftsched.client.core.Request` an endpoint
  sends, its encoding (JSON, the token, one Idempotency-Key for all its attempts), how it is
  routed and retried across the nodes (``Call``, ``Exchange``), and how an answer becomes a
  result or a typed error. Its docstring states the rules.
- ``endpoints.py``: every endpoint, as a function from a method's arguments to its Request.
- ``policy.py``: the lock's renewal policy and ``wait_backfill``'s, with an injectable clock.
- ``blocking.py`` (:class:`Client`, :class:`Lock`: http.client and a thread) and
  ``asynchronous.py`` (:class:`AsyncClient`, :class:`AsyncLock`: aiohttp and a task): the two
  transports. Each endpoint method is written in its class, and only hands the endpoint's
  Request to the transport.
- ``tls.py``: the TLS context of both.

Reads
-----
Every read sees every write acknowledged before it began, whichever node answers: the node
waits for a read barrier first (docs/api.md, "Consistent reads"). ``stale=True`` on a read
method reads the answering node's replica as it is (``?stale=true``): no barrier, an answer with
no leader too, possibly behind. ``consistent=``, which read methods still accept, is what every
read is by default now and changes nothing, except on ``cluster()``: that read is this node's
own view, stale unless ``consistent=True``.

Locks, honestly
---------------
A lock here is a lease: unless renewed, the leader expires it once it has seen no renewal for
``ttl_s`` (by its own monotonic clock). Holding it does NOT make you safe by itself: your process
can be paused (GC, SIGSTOP, a VM migration, a slow disk) for longer than the TTL, the lock passes
to someone else, and then your process wakes up and writes, believing it still holds it. The
only protection is the fencing token: every acquire returns a token that is larger than every
token handed out before, cluster-wide, and the system you write to must refuse a write that
carries a lower token than one it has already accepted (see ``examples/fenced_store.py`` and
``docs/fencing.md``). Pass ``lease.token`` to every downstream write.
"""
from __future__ import annotations

import importlib
from typing import Any

from .blocking import Client, Lock
from .core import LockHeld, LockLost
from .policy import Lease

# The other names of raftsched/client.py before it was a package, re-exported for code written
# against them (the ``X as X`` form says so to linters and type checkers).
from .core import LostAfterSendError as LostAfterSendError, NotSentError as NotSentError
from .core import TlsFailedError as TlsFailedError, prepare as prepare
from .policy import lock_poll_pause as lock_poll_pause
from .tls import client_tls_context as client_tls_context

__all__ = ["Client", "Lock", "Lease", "LockHeld", "LockLost"]

#: The asyncio client, imported on first use (aiohttp is not needed by the blocking one).
_LAZY = {"AsyncClient": ".asynchronous", "AsyncLock": ".asynchronous"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raftsched.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
