"""``install``: put raftsched's stand-ins into pysyncobj's module globals, once, and only into a
pysyncobj whose internals are the ones they were written against.

pysyncobj is used from the outside, but four of its parts can only be replaced where its
modules look them up: ``zlib`` in ``pysyncobj.tcp_connection`` (``_Uncompressed``),
``createJournal`` in ``pysyncobj.syncobj`` (``create_journal``: the durable journal),
``gzip`` and ``atomicReplace`` in ``pysyncobj.serializer`` (``_FastGzip``, ``durable_replace``);
and one of ``_SyncObj``'s corrections silences a
warning of pysyncobj's logger (``HELD_ENTRIES_LOG_FILTER``). These are process-wide, so they are
made by an explicit call (``RaftNode`` makes it), not as a side effect of importing the package:
a process that imports ``raftsched.replication`` without building a node keeps pysyncobj as it is.
"""
from __future__ import annotations

import logging
import threading

from pysyncobj import SyncObj
from pysyncobj import serializer as _pysyncobj_serializer
from pysyncobj import syncobj as _pysyncobj_syncobj
from pysyncobj import tcp_connection as _pysyncobj_tcp_connection

from ._connection import missing_internals as _connection_missing_internals
from ._clockguard import RELIED_ON
from ._storage import _FastGzip, create_journal, durable_replace
from ._syncobj import _OVERRIDDEN, HELD_ENTRIES_LOG_FILTER, PYSYNCOBJ_LOGGER
from ._transport import _Uncompressed

_install_lock = threading.Lock()


def missing_internals() -> list[str]:
    """The pysyncobj internals that raftsched overrides or replaces and this pysyncobj lacks
    (empty for the 0.3.x it was written against). An override of a renamed internal would
    silently stop applying, so ``install`` refuses to run rather than run without it."""
    missing = [n for n in _OVERRIDDEN + RELIED_ON if not hasattr(SyncObj, n)]
    if not hasattr(_pysyncobj_tcp_connection, "zlib"):  # _Uncompressed stands in for it
        missing.append("tcp_connection.zlib")
    if not hasattr(_pysyncobj_serializer, "gzip"):  # _FastGzip stands in for it
        missing.append("serializer.gzip")
    if not hasattr(_pysyncobj_serializer, "atomicReplace"):  # durable_replace stands in for it
        missing.append("serializer.atomicReplace")
    if not ("createJournal" in SyncObj.__init__.__code__.co_names
            and hasattr(_pysyncobj_syncobj, "createJournal")):  # create_journal stands in for it
        missing.append("syncobj.SyncObj -> createJournal")
    if not hasattr(SyncObj, "_onTick"):  # _SyncObj._onTick flushes the sync gate around it
        missing.append("_onTick")
    missing += _connection_missing_internals()  # RaftTransport's connections and server
    return missing


def install() -> None:
    """Put the stand-ins in place: messages sent uncompressed, the durable journal, dumps at
    gzip level 1 and renamed durably, and the held-entries warning filtered. Idempotent and
    thread-safe; a second call changes nothing.

    :raises RuntimeError: when this pysyncobj lacks an internal that raftsched overrides or
        replaces (``missing_internals``); nothing is changed then.
    """
    with _install_lock:
        missing = missing_internals()
        if missing:
            raise RuntimeError("raftsched.replication needs pysyncobj 0.3.x internals that this "
                               f"pysyncobj lacks: {', '.join(missing)}")
        _pysyncobj_tcp_connection.zlib = _Uncompressed
        _pysyncobj_syncobj.createJournal = create_journal
        _pysyncobj_serializer.gzip = _FastGzip
        _pysyncobj_serializer.atomicReplace = durable_replace
        # One filter instance: Logger.addFilter adds it only if it is not there yet.
        logging.getLogger(PYSYNCOBJ_LOGGER).addFilter(HELD_ENTRIES_LOG_FILTER)
