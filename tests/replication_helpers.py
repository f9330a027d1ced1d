"""Shared by the tests of raftsched.replication: a fake state, and three real RaftNodes in this
process on free loopback ports (pysyncobj, one tick thread each), with a fake state (counters in
a dict, msgpack snapshots). The tests wait on conditions with deadlines, never on fixed sleeps,
and stop every node they start.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import msgpack

from raftsched.core.errors import RaftschedError, Unavailable
from raftsched.replication import RaftNode
from raftsched.testing.procs import free_port, free_ports  # noqa: F401  (free_port: re-exported to the replication tests)

SECRET = "test-cluster-secret"
#: Small compaction threshold so a few dozen commands force a full dump (and its restore path).
COMPACT = {"logCompactionMinEntries": 20}


class FakeState:
    """The SchedulerState interface over a dict of counters.

    It has no lock and relies on the replica's alone, as the core's state does.
    """

    def __init__(self):
        self._guard = contextlib.nullcontext()
        self.counters: dict[str, int] = {}
        self.restores = 0
        #: the replay's starts and ends (SchedulerState.replaying), and the increments applied in one
        self.replays: list[bool] = []
        self.replayed = 0

    def apply_bytes(self, data: bytes) -> dict:
        with self._guard:
            try:
                cmd = msgpack.unpackb(data, raw=False)
            except Exception as e:  # apply_bytes never raises...
                return {"ok": False, "error": {"code": "invalid_command", "message": str(e),
                                               "field": None}}
            if cmd.get("op") == "raise":  # ...except this one, to test the adapter's guard
                raise RuntimeError("apply bug")
            if cmd.get("op") == "incr":
                key = cmd["key"]
                self.counters[key] = self.counters.get(key, 0) + 1
                if self.replays and self.replays[-1]:
                    self.replayed += 1
                return {"ok": True, "value": self.counters[key]}
            return {"ok": True}

    def replaying(self, on: bool) -> None:
        self.replays.append(on)

    def snapshot(self) -> bytes:
        with self._guard:
            return msgpack.packb({"counters": self.counters}, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        with self._guard:
            self.counters = dict(msgpack.unpackb(data, raw=False)["counters"])
            self.restores += 1

    def read(self) -> dict:
        with self._guard:
            return dict(self.counters)


def free_elsewhere(lock) -> bool:
    """Whether a thread other than this one can take ``lock`` now (it gives it back at once).
    Asking from this thread would prove nothing: an RLock it holds, it may take again."""
    got = []

    def take():
        if lock.acquire(blocking=False):
            got.append(True)
            lock.release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return bool(got)


def incr(key: str = "k") -> bytes:
    return msgpack.packb({"op": "incr", "key": key})


async def wait_until(cond, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)  # ok-sleep: the poll interval of a deadline-bounded wait


async def propose_retrying(node, data: bytes, timeout_s: float = 10.0) -> dict:
    """Propose, retrying only definite failures (Unavailable: the command did not happen), for
    steps where a fail-over may be under way. An Indeterminate is not retried: a retried
    increment could count twice, and the tests count."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await node.propose(data, timeout_s=2.0)
        except Unavailable:
            if time.monotonic() > deadline:
                raise


class Cluster:
    """Three RaftNodes on loopback; every node started here is stopped in close(). States are
compared through ``RaftNode.read``."""

    def __init__(self, tmp_path, addrs=None, conf_overrides=None, dial_maps=None):
        self.addrs = addrs or [f"127.0.0.1:{p}" for p in free_ports(3)]
        self.dirs = {a: str(tmp_path / f"node{i}") for i, a in enumerate(self.addrs)}
        self.conf_overrides = conf_overrides
        self.dial_maps = dial_maps or {}
        self.nodes: dict[str, RaftNode] = {}
        self.states: dict[str, FakeState] = {}
        self.roles: dict[str, list[bool]] = {}
        self._all: list[RaftNode] = []

    def start(self, addr: str) -> RaftNode:
        loop = asyncio.get_running_loop()
        state = FakeState()
        events = self.roles.setdefault(addr, [])
        node = RaftNode(self_addr=addr, peers=self.addrs, data_dir=self.dirs[addr], secret=SECRET,
                        state=state, on_role_change=events.append,
                        dial_map=self.dial_maps.get(addr), conf_overrides=self.conf_overrides)
        self._all.append(node)
        node.start(loop)
        self.nodes[addr], self.states[addr] = node, state
        return node

    def start_all(self):
        for a in self.addrs:
            self.start(a)

    def stop(self, addr: str):
        self.nodes.pop(addr).stop()

    def close(self):
        for node in self._all:
            node.stop()

    async def agreed_leader(self, timeout_s: float = 10.0) -> str:
        """Wait until exactly one running node leads and every running node names it."""
        def agreed():
            leaders = [a for a, n in self.nodes.items() if n.is_leader()]
            if len(leaders) != 1:
                return None
            named = {n.status()["leader"] for n in self.nodes.values()}
            return leaders[0] if named == {leaders[0]} else None
        return await wait_until(agreed, timeout_s, "one agreed leader")

    async def converged(self, expected: dict, timeout_s: float = 10.0):
        """Barrier on every node, then compare its state. A barrier is a no-op, so retrying one
        after any failure is safe (a restarted node may still force one election: no pre-vote)."""
        deadline = time.monotonic() + timeout_s
        for addr, node in self.nodes.items():
            while True:
                try:
                    await node.barrier(timeout_s=2.0)
                    break
                except RaftschedError:
                    if time.monotonic() > deadline:
                        raise
            got = node.read(FakeState.read)
            assert got == expected, (addr, got, expected, node.status())


async def started_and_counted(c: Cluster, n: int) -> str:
    """Start every node of ``c``, then ``n`` increments of "r" through the agreed leader,
    converged on every node. :returns: the leader."""
    c.start_all()
    leader = await c.agreed_leader()
    for _ in range(n):
        await c.nodes[leader].propose(incr("r"))
    await c.converged({"r": n})
    return leader


async def incr_until_every_node_dumped(c: Cluster, leader: str, n: int) -> None:
    """``n`` increments of "r" (more than COMPACT's threshold), converged on every node, then
    wait until every node has written a full dump."""
    for _ in range(n):
        await c.nodes[leader].propose(incr("r"))
    await c.converged({"r": n})
    await wait_until(lambda: all(os.path.exists(os.path.join(d, "raft.dump"))
                                 for d in c.dirs.values()), 10, "dump files")


async def restart_all_and_count_on(c: Cluster, r: int) -> None:
    """Stop every running node and start each again on its data dir with a fresh state: every
    node comes back to {"r": r} through its dump, and the cluster counts on from there."""
    for a in list(c.nodes):
        c.stop(a)
    c.start_all()
    leader = await c.agreed_leader()
    await c.converged({"r": r})
    assert all(s.restores >= 1 for s in c.states.values())  # the dump path ran
    assert (await propose_retrying(c.nodes[leader], incr("r")))["value"] == r + 1


def run(coro_fn, *args):
    return asyncio.run(coro_fn(*args))
