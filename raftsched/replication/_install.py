"""``install``: put raftsched's stand-ins into pysyncobj's module globals, once, and only into a
pysyncobj whose internals are the ones they were written against.

pysyncobj is used from the outside, but five of its parts can only be replaced where its
modules look them up: ``zlib`` in ``pysyncobj.tcp_connection`` (``_Uncompressed``),
``createJournal`` in ``pysyncobj.syncobj`` (``create_journal``: the durable journal),
``gzip`` and ``atomicReplace`` in ``pysyncobj.serializer`` (``_FastGzip``, ``durable_replace``),
the pickle protocol of ``pysyncobj.pickle`` (``PICKLE_PROTOCOL``); and one of ``_SyncObj``'s
corrections silences a
warning of pysyncobj's logger (``HELD_ENTRIES_LOG_FILTER``). These are process-wide, so they are
made by an explicit call (``RaftNode`` makes it), not as a side effect of importing the package:
a process that imports ``raftsched.replication`` without building a node keeps pysyncobj as it is.
"""
from __future__ import annotations

import logging
import threading

from pysyncobj import SyncObj
from pysyncobj import pickle as _pysyncobj_pickle
from pysyncobj import serializer as _pysyncobj_serializer
from pysyncobj import syncobj as _pysyncobj_syncobj
from pysyncobj import tcp_connection as _pysyncobj_tcp_connection

from ._connection import missing_internals as _connection_missing_internals
from ._clockguard import RELIED_ON
from ._storage import _FastGzip, create_journal, durable_replace
from ._syncobj import _OVERRIDDEN, HELD_ENTRIES_LOG_FILTER, PYSYNCOBJ_LOGGER
from ._transport import _Uncompressed

_install_lock = threading.Lock()

#: The pickle protocol a member writes its Raft messages, log entries (a replicated call around
#: its command's bytes) and dumps with. pysyncobj's is 2, which has no opcode for ``bytes``: each
#: ``bytes`` object (every command, every group of commands, the whole snapshot in a dump) went
#: as ``codecs.encode(<latin-1 str>, 'latin1')``, decoded to a str and stored in UTF-8 (up to
#: twice its length: msgpack's type bytes are mostly >= 0x80), and was encoded back when read:
#: an append_entries of four 3 KB entries took ~35 us to pickle and ~33 us to unpickle, against
#: ~2 us each at protocol 4 (docs/benchmarks.md, "Raft messages at pickle protocol 4"). Every
#: Python since 3.4 reads protocol 4, and ``pickle.loads`` takes either, so a member of an older
#: version and one of this version read each other's messages, journals and dumps.
PICKLE_PROTOCOL = 4


def missing_internals() -> list[str]:
    """The pysyncobj internals that raftsched overrides or replaces and this pysyncobj lacks
    (empty for the 0.3.x it was written against). An override of a renamed internal would
    silently stop applying, so ``install`` refuses to run rather than run without it."""
    missing = [n for n in _OVERRIDDEN + RELIED_ON if not hasattr(SyncObj, n)]
    if "__protocol" not in vars(_pysyncobj_pickle):  # PICKLE_PROTOCOL stands in for it
        missing.append("pickle.__protocol")
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
    """Put the stand-ins in place: messages sent uncompressed, everything pickled at
    ``PICKLE_PROTOCOL``, the durable journal, dumps at gzip level 1 and renamed durably, and the
    held-entries warning filtered. Idempotent and
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
        # A module global, read by pysyncobj.pickle's dump and dumps at each call (not a class
        # attribute: the name is not mangled).
        setattr(_pysyncobj_pickle, "__protocol", PICKLE_PROTOCOL)
        _pysyncobj_syncobj.createJournal = create_journal
        _pysyncobj_serializer.gzip = _FastGzip
        _pysyncobj_serializer.atomicReplace = durable_replace
        # One filter instance: Logger.addFilter adds it only if it is not there yet.
        logging.getLogger(PYSYNCOBJ_LOGGER).addFilter(HELD_ENTRIES_LOG_FILTER)
