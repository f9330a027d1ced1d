"""A data directory names the node whose log it holds (replication/_identity.py): a node never
starts on another node's log."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from raftsched.replication import RaftNode
from raftsched.replication._disk import Disk
from raftsched.replication._identity import FILE, DataDirOfAnotherNode, claim

from replication_helpers import SECRET, Cluster, FakeState, incr, run


def _files(d) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file() and p.name != "raft.lock"}


def test_a_fresh_directory_is_claimed_by_its_first_member_and_refused_to_another(tmp_path):
    disk = Disk(fsync=False)
    claim(str(tmp_path), "node-1", disk)
    assert json.loads((tmp_path / FILE).read_text()) == {"node": "node-1"}
    claim(str(tmp_path), "node-1", disk)  # its own: starts
    with pytest.raises(DataDirOfAnotherNode) as e:
        claim(str(tmp_path), "node-2", disk)
    assert "'node-1', not of 'node-2'" in str(e.value) and '{"node": "node-2"}' in str(e.value)  # how, if it is
    assert json.loads((tmp_path / FILE).read_text()) == {"node": "node-1"}  # unchanged


@pytest.mark.parametrize("empty", [False, True])
def test_a_directory_written_before_identities_is_adopted(tmp_path, empty):
    """Also one whose identity is empty: renamed but not synced before a crash (no fsync)."""
    (tmp_path / "raft.journal").write_bytes(b"an older node's journal")
    if empty:
        (tmp_path / FILE).write_bytes(b"")
    claim(str(tmp_path), "node-1", Disk(fsync=False))
    assert json.loads((tmp_path / FILE).read_text()) == {"node": "node-1"}
    assert (tmp_path / "raft.journal").read_bytes() == b"an older node's journal"


@pytest.mark.parametrize("content", [b" ", b"{", b"[]", b'{"node": 7}', b'{"node": ""}', b'{"who": "x"}',
                                     b"\xff\xfe"])
def test_an_identity_that_cannot_be_read_refuses_the_start(tmp_path, content):
    (tmp_path / FILE).write_bytes(content)
    with pytest.raises(DataDirOfAnotherNode, match="cannot be read"):
        claim(str(tmp_path), "node-1", Disk(fsync=False))
    assert (tmp_path / FILE).read_bytes() == content


def test_a_node_started_on_another_nodes_directory_is_refused_before_it_reads_the_log(tmp_path):
    """Two members' directories swapped: each start is refused, their files stay as they were
    (no journal read, rewritten or compacted), the lock is let go, and each member then starts
    on its own directory with everything the cluster committed. (A bare RaftNode's name is its
    address; the node's is its --id: test_node.py.)"""
    async def main():
        c = Cluster(tmp_path)
        try:
            c.start_all()
            leader = await c.agreed_leader()
            for _ in range(3):
                await c.nodes[leader].propose(incr("r"))
            await c.converged({"r": 3})
            a, b = (x for x in c.addrs if x != leader)
            c.stop(a)
            c.stop(b)
            before = {x: _files(c.dirs[x]) for x in (a, b)}
            for who, on in ((a, b), (b, a)):
                node = RaftNode(self_addr=who, peers=c.addrs, data_dir=c.dirs[on], secret=SECRET, state=FakeState())
                with pytest.raises(DataDirOfAnotherNode, match=f"holds the log of node '{on}', not of '{who}'"):
                    node.start(asyncio.get_running_loop())
                node.stop()
            assert {x: _files(c.dirs[x]) for x in (a, b)} == before
            c.start(a)
            c.start(b)
            await c.converged({"r": 3}, timeout_s=20)
            assert (await c.nodes[await c.agreed_leader()].propose(incr("r")))["value"] == 4
        finally:
            c.close()
    run(main)
