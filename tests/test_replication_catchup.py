"""A deposed leader whose log ends in entries of its old term catches up after a heal (issue 20).

The reproduction of the fault run's stall, with three real RaftNodes in this process: a leader
appends a tail of entries it cannot commit while it is cut off, the other two elect a leader and
commit more, the cut heals. pysyncobj's leader pipelined the stale tail's answers into a next
index that oscillated between two values (the follower's last index and the one after it), and
the old leader's commit index stayed frozen until the new leader compacted its log. Here the
follower truncates its conflicting tail and hints where its term begins, and the leader ignores
the stale answers of a burst: the old leader's commit index reaches the new leader's within a few
seconds, with a tail of 64 KiB or 320 KiB, and also when the whole cluster restarts before the
heal.
"""
from __future__ import annotations

import asyncio
import time

import msgpack
import pytest

from raftsched.core.errors import RaftschedError

from replication_helpers import Cluster, incr, propose_retrying, run, wait_until

#: The stale tail's commands: a tail of N KiB is N * 1024 // _TAIL_PAD of them. Small ones, so
#: that the tail is many entries (a walk back one entry a round would take many rounds).
_TAIL_PAD = 500
#: The new leader's commands (the stall needs more than one 64 KiB append_entries batch past
#: the divergence).
_PAD = 4000


def _padded(i: int) -> bytes:
    return msgpack.packb({"op": "noop", "i": i, "pad": "x" * _TAIL_PAD})


def _padded_incr(key: str) -> bytes:
    return msgpack.packb({"op": "incr", "key": key, "pad": "y" * _PAD})


#: What the new leader commits past the divergence: more than the stale tail plus one 64 KiB
#: batch, so that its answers to the old leader come in bursts of several messages.
_AHEAD_KIB = 256


class Cut:
    """Drops every Raft message between ``isolated`` and the other nodes, both ways, at the
    senders (a black hole: the links stay up until their connectionTimeout, as in a real
    partition). Installed on the running nodes' transports; ``heal`` takes it away."""

    def __init__(self, c: Cluster, isolated: str):
        self.c, self.isolated, self.on = c, isolated, True
        for addr, node in c.nodes.items():
            transport = node._sync._SyncObj__transport
            real_send = transport.send

            def send(peer, message, _addr=addr, _real=real_send):
                if self.on and (_addr == self.isolated) != (peer.id == self.isolated):
                    return True  # "sent": lost on the way
                return _real(peer, message)
            transport.send = send

    def heal(self):
        self.on = False


#: The cut-off leader keeps leading (and appending) for 10 s rather than 1 s: on a loaded machine
#: it stepped down before the test had queued its whole tail, which then never reached its log.
_SLOW_FALLBACK = {"leaderFallbackTimeout": 10.0}


def _commit(node) -> int:
    return node.status()["commit_index"]


async def _isolate_leader_with_a_stale_tail(c: Cluster, tail_kib: int) -> tuple[str, str, int]:
    """Cut the leader off right after it appended ``tail_kib`` KiB of entries it cannot commit;
    let the other two elect a leader and commit more (``_AHEAD_KIB`` past the tail). Returns (old leader, new leader, the new
    leader's commit index)."""
    old = await c.agreed_leader()
    for _ in range(5):
        await c.nodes[old].propose(incr("a"))
    cut = Cut(c, old)
    c.cut = cut
    loop = asyncio.get_running_loop()
    # Proposals the cut-off leader appends to its log and can never commit; they end
    # Indeterminate (or Unavailable once it stepped down).
    before = c.nodes[old]._sync._SyncObj__getCurrentLogIndex()
    pending = []
    for i in range(tail_kib * 1024 // _TAIL_PAD):
        pending.append(loop.create_task(c.nodes[old].propose(_padded(i), timeout_s=1.0)))
        await asyncio.sleep(0)  # ok-sleep: one loop turn, so each proposal is an entry of its own
    await asyncio.gather(*pending, return_exceptions=True)
    tail = c.nodes[old]._sync._SyncObj__getCurrentLogIndex() - before
    assert tail >= len(pending) // 2, f"the cut-off leader appended only {tail} entries"
    others = [a for a in c.addrs if a != old]

    def new_leader():
        leaders = [a for a in others if c.nodes[a].is_leader()]
        return leaders[0] if leaders else None
    new = await wait_until(new_leader, 15, "a leader among the two others")
    for _ in range((tail_kib + _AHEAD_KIB) * 1024 // _PAD):
        await propose_retrying(c.nodes[new], _padded_incr("b"))
    assert _commit(c.nodes[old]) < _commit(c.nodes[new])
    return old, new, _commit(c.nodes[new])


async def _caught_up(c: Cluster, old: str, timeout_s: float) -> float:
    """Seconds until the old leader's commit index reaches every other node's and a write
    through it commits; fails after ``timeout_s``."""
    started = time.monotonic()
    others = [a for a in c.addrs if a != old]
    await wait_until(lambda: _commit(c.nodes[old]) >= max(_commit(c.nodes[a]) for a in others),
                     timeout_s, f"{old}'s commit index reaching the leader's")
    took = time.monotonic() - started
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await c.nodes[old].barrier(timeout_s=2.0)
            break
        except RaftschedError:
            if time.monotonic() > deadline:
                raise
    return took


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("tail_kib", [64, 320])
def test_a_deposed_leader_with_a_stale_tail_catches_up_after_the_heal(tmp_path, tail_kib):
    async def main():
        c = Cluster(tmp_path, conf_overrides=_SLOW_FALLBACK)
        try:
            c.start_all()
            old, new, _ = await _isolate_leader_with_a_stale_tail(c, tail_kib)
            # The new leader sees the old one behind (status, /v1/cluster, metrics): its view of
            # the followers is refreshed on a period (replication/_watch.py), so at the next look.
            seen = await wait_until(lambda: c.nodes[new].status()["replication"]["followers"].get(old), 5,
                                    "the new leader's view of the old one")
            assert seen["lag_entries"] > 0 and seen["match_index"] < _commit(c.nodes[new])
            c.cut.heal()
            await _caught_up(c, old, timeout_s=10)
            # ... and then caught up, after walking its next index back.
            await wait_until(lambda: c.nodes[new].status()["replication"]["followers"][old]
                             ["lag_entries"] == 0, 5, "the leader seeing the old leader caught up")
            seen = c.nodes[new].status()["replication"]["followers"][old]
            assert seen["state"] == "replicate" and seen["rejections"] >= 1, seen
            assert c.nodes[new].status()["replication"]["conditions"] == []
            await c.converged({"a": 5, "b": (tail_kib + _AHEAD_KIB) * 1024 // _PAD})
        finally:
            c.close()
    run(main)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_deposed_leader_with_a_stale_tail_catches_up_after_a_full_restart(tmp_path):
    async def main():
        c = Cluster(tmp_path, conf_overrides=_SLOW_FALLBACK)
        try:
            c.start_all()
            tail_kib = 320
            old, new, _ = await _isolate_leader_with_a_stale_tail(c, tail_kib)
            # Every node stops with the stale tail still in the old leader's journal; they come
            # back with no cut between them.
            for a in list(c.nodes):
                c.stop(a)
            c.start_all()
            await c.agreed_leader(timeout_s=15)
            await _caught_up(c, old, timeout_s=10)
            await c.converged({"a": 5, "b": (tail_kib + _AHEAD_KIB) * 1024 // _PAD})
        finally:
            c.close()
    run(main)
