"""raftsched/replication/_install.py: importing the package leaves pysyncobj as it is; install()
puts the stand-ins in place once, refuses an unexpected pysyncobj, and every RaftNode calls it."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import zlib

import pytest
from pysyncobj import SyncObj, serializer, syncobj, tcp_connection, tcp_server

from raftsched.replication import install
from raftsched.replication._storage import _FastGzip, create_journal, durable_replace
from raftsched.replication._syncobj import HELD_ENTRIES_LOG_FILTER, PYSYNCOBJ_LOGGER
from raftsched.replication._transport import _Uncompressed


def stand_ins() -> tuple:
    return (tcp_connection.zlib, syncobj.createJournal, serializer.gzip, serializer.atomicReplace,
            logging.getLogger(PYSYNCOBJ_LOGGER).filters.count(HELD_ENTRIES_LOG_FILTER))


def test_importing_the_package_changes_nothing_in_pysyncobj_and_a_raft_node_installs(tmp_path):
    """In a fresh interpreter (this one may have installed already): pysyncobj's globals and its
    logger's filters are the same objects before and after the import; building a RaftNode (not
    started) puts the stand-ins in place, and a second install changes nothing."""
    script = textwrap.dedent(f"""
        import logging
        from pysyncobj import serializer, syncobj, tcp_connection

        def globals_():
            return (tcp_connection.zlib, syncobj.createJournal, serializer.gzip,
                    serializer.atomicReplace, list(logging.getLogger("pysyncobj.syncobj").filters))

        before = globals_()
        import raftsched.replication as r
        import raftsched.replication.node, raftsched.replication._install  # every module
        after = globals_()
        assert after[:4] == before[:4] and all(a is b for a, b in zip(after[:4], before[:4])), after
        assert after[4] == before[4] == [], after[4]

        r.RaftNode(self_addr="127.0.0.1:7001", peers=[], data_dir={str(tmp_path)!r},
                   secret="a test secret", state=object())
        made = globals_()
        assert [x.__name__ for x in made[:4]] == ["_Uncompressed", "create_journal", "_FastGzip",
                                                  "durable_replace"], made
        assert len(made[4]) == 1, made[4]
        r.install()
        again = globals_()
        assert all(a is b for a, b in zip(again[:4], made[:4])) and again[4] == made[4], again
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_install_is_idempotent():
    install()
    first = stand_ins()
    install()
    assert stand_ins() == first == (_Uncompressed, create_journal, _FastGzip, durable_replace, 1)


@pytest.mark.parametrize("owner, name, missing", [
    (SyncObj, "_SyncObj__deleteEntriesTo", "_SyncObj__deleteEntriesTo"),
    (SyncObj, "_SyncObj__onMessageReceived", "_SyncObj__onMessageReceived"),
    (serializer, "gzip", "serializer.gzip"),
    (syncobj, "createJournal", "syncobj.SyncObj -> createJournal"),
    (serializer, "atomicReplace", "serializer.atomicReplace"),
    (SyncObj, "_onTick", "_onTick"),
    (tcp_connection, "zlib", "tcp_connection.zlib"),
    (tcp_connection.TcpConnection, "_TcpConnection__processParseMessage",
     "TcpConnection._TcpConnection__processParseMessage"),
    (tcp_server.TcpServer, "_TcpServer__onNewConnection", "TcpServer._TcpServer__onNewConnection"),
])
def test_install_refuses_a_pysyncobj_without_an_internal_it_replaces_and_changes_nothing(
        monkeypatch, owner, name, missing):
    monkeypatch.setattr(tcp_connection, "zlib", zlib)  # as before any install
    monkeypatch.delattr(owner, name)
    with pytest.raises(RuntimeError, match="pysyncobj 0.3.x internals") as info:
        install()
    assert missing in str(info.value)
    if owner is not tcp_connection:
        assert tcp_connection.zlib is zlib, "nothing is replaced when one internal is missing"
