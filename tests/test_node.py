"""One node's lifetime (node/node.py): a failed loop stops the node with an error; a stop request
(SIGTERM, SIGINT) stops it cleanly. run_node runs in this process, on free loopback ports, with
a real Raft adapter; the failing loop is a stand-in worker whose run() raises."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import subprocess

import pytest

from raftsched import cli
from raftsched.node import node as node_mod
from raftsched.node.node import LoopFailed, NodeConfig, run_node
from raftsched.worker.loop import WorkerFailed

from procs import Cluster, free_ports, http


@pytest.fixture
def node_cfg(tmp_path):
    """A one-node cluster's config; run_node's process-wide settings (umask, gc thresholds) are
    put back afterwards."""
    api, raft = free_ports(2)
    umask = os.umask(0o022)
    os.umask(umask)
    threshold = gc.get_threshold()
    yield NodeConfig(node_id="node-1", api_host="127.0.0.1", api_port=api, raft_addr=f"127.0.0.1:{raft}",
                     peers=[], data_dir=str(tmp_path / "node-1"), secret="s" * 32, token="t" * 32)
    os.umask(umask)
    gc.set_threshold(*threshold)


class _FailingWorker(node_mod.Worker):
    async def run(self) -> None:
        await asyncio.sleep(0)  # ok-sleep: one turn, so the node is up when it fails
        raise RuntimeError("disk on fire")


def test_a_failed_loop_stops_the_node_with_an_error_naming_the_loop(node_cfg, monkeypatch, caplog):
    monkeypatch.setattr(node_mod, "Worker", _FailingWorker)
    caplog.set_level(logging.ERROR, logger="raftsched.node")
    with pytest.raises(LoopFailed) as e:
        asyncio.run(asyncio.wait_for(run_node(node_cfg), 30))
    assert e.value.loop == "worker" and "disk on fire" in str(e.value)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert any("worker loop failed" in r.getMessage() and "disk on fire" in r.getMessage() for r in caplog.records)
    # The API went down with it: its port is free again.
    with pytest.raises(OSError):
        http("GET", f"http://127.0.0.1:{node_cfg.api_port}/healthz", timeout=2)


class _BrokenWatchdogWorker(node_mod.Worker):
    def _check_heartbeats(self) -> None:
        raise RuntimeError("a bug in the watchdog")


def test_a_failed_lease_watchdog_of_the_embedded_worker_stops_the_node(node_cfg, monkeypatch):
    """The embedded worker's watchdog runs in the worker's task group: its failure ends the
    worker's loop, and so the node (never a node whose worker leases on unwatched)."""
    monkeypatch.setattr(node_mod, "Worker", _BrokenWatchdogWorker)
    with pytest.raises(LoopFailed) as e:
        asyncio.run(asyncio.wait_for(run_node(node_cfg), 30))
    assert e.value.loop == "worker" and "lease watchdog" in str(e.value) and "a bug in the watchdog" in str(e.value)
    assert isinstance(e.value.__cause__, WorkerFailed) and e.value.__cause__.task == "lease watchdog"


def test_a_stop_request_stops_every_loop_and_returns(node_cfg):
    async def t():
        stop = asyncio.Event()
        node = asyncio.create_task(run_node(node_cfg, stop=stop))
        url = f"http://127.0.0.1:{node_cfg.api_port}/healthz"
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # the node answers, and leads (a one-node cluster)
            try:
                status, _ = await asyncio.to_thread(http, "GET", url, timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "the node never led"
            await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop
        stop.set()
        await asyncio.wait_for(node, 30)  # returns: no error
    asyncio.run(t())


def test_raftsched_node_exits_1_when_a_loop_fails(monkeypatch, capsys, tmp_path):
    async def failing(cfg):
        raise LoopFailed("worker", "RuntimeError('disk on fire')")

    monkeypatch.setattr(node_mod, "run_node", failing)  # cmd_node imports it when it runs
    argv = Cluster(tmp_path, n=1).argv(0)[3:]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "the worker loop failed" in err and "disk on fire" in err


def test_raftsched_node_exits_1_on_another_nodes_data_dir(capsys, tmp_path):
    """A data directory claimed by another node id (replication/_identity.py): the node says
    whose it is and how to fix it, and exits 1 before anything of the log is read."""
    c = Cluster(tmp_path, n=1)
    d = c.data_dir(0)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    (d / "raft.identity").write_text('{"node": "node-9"}')
    argv = c.argv(0)[3:]
    k = argv.index("--token-file")
    del argv[k:k + 2]  # (without one, a node writes a token into its data dir: not into another's)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "holds the log of node 'node-9', not of 'node-1'" in err, err
    assert [p.name for p in d.iterdir()] == ["raft.identity"]  # nothing written there
    assert (d / "raft.identity").read_text() == '{"node": "node-9"}'


def test_raftsched_node_exits_0_on_sigterm(tmp_path):
    c = Cluster(tmp_path, n=1)
    c.start()
    try:
        c.wait_leader(30)
        p = c.procs[0]
        os.kill(p.pid, signal.SIGTERM)
        try:
            assert p.wait(timeout=30) == 0, c.log_tail(0)
        except subprocess.TimeoutExpired:
            pytest.fail("the node did not stop within 30 s of SIGTERM")
        assert "stopping" in c.log_tail(0)
    finally:
        c.stop()
