"""raftsched/replication/_consumer.py: the replicated state as pysyncobj sees it (apply never
raises, a group applies command by command, a dump round-trips, the collector is paused around
both ends)."""
from __future__ import annotations

import gc
import os
import pickle

import msgpack
import pytest

from raftsched.replication import BARRIER_NOOP
from raftsched.replication._consumer import DUMP_WRITER_NICE, _StateConsumer
from raftsched.replication._install import PICKLE_PROTOCOL

from replication_helpers import FakeState, free_elsewhere, incr


def _restore_own_dump(consumer) -> None:
    """What the dump writer and a restart do: the consumer's dump, restored into it (the restored
    state frozen, then unfrozen here so that the test leaves the collector as it found it)."""
    dumped = pickle.dumps(consumer._serialize(), PICKLE_PROTOCOL)
    consumer._release_snapshot_lock()
    try:
        consumer._deserialize(pickle.loads(dumped))
    finally:
        gc.unfreeze()


def test_apply_never_raises_and_the_barrier_never_reaches_the_state():
    state = FakeState()
    consumer = _StateConsumer(state)
    # _doApply=True is how pysyncobj runs a committed entry.
    assert consumer._apply(incr("a"), _doApply=True) == {"ok": True, "value": 1}
    failed = consumer._apply(msgpack.packb({"op": "raise"}), _doApply=True)
    assert failed["ok"] is False and failed["error"]["code"] == "internal"
    assert consumer._apply(BARRIER_NOOP, _doApply=True) == {"ok": True}
    assert state.read() == {"a": 1}


def test_a_group_applies_each_command_in_order_with_its_own_result():
    """Group commit: one log entry holding several commands applies each as if it had its own
    entry; a command that raises or does not decode is refused alone."""
    state = FakeState()
    consumer = _StateConsumer(state)
    group = (incr("a"), msgpack.packb({"op": "raise"}), BARRIER_NOOP, b"\xc1garbage", incr("a"))
    res = consumer._apply(group, _doApply=True)
    assert len(res) == 5
    assert res[0] == {"ok": True, "value": 1} and res[4] == {"ok": True, "value": 2}
    assert res[1]["ok"] is False and res[1]["error"]["code"] == "internal"
    assert res[2] == {"ok": True}
    assert res[3]["ok"] is False and res[3]["error"]["code"] == "invalid_command"
    assert state.read() == {"a": 2}


@pytest.mark.parametrize("protocol", [PICKLE_PROTOCOL, 2], ids=["this version", "pysyncobj's"])
def test_snapshot_roundtrip_through_the_consumer(protocol):
    """What the dump writer pickles at PICKLE_PROTOCOL, and a dump of an older version (pysyncobj's
    protocol 2: the snapshot's bytes as a latin-1 str), both restore."""
    state = FakeState()
    state.apply_bytes(incr("x"))
    consumer = _StateConsumer(state)
    dumped = pickle.dumps(consumer._serialize(), protocol)  # what the dump writer does
    if protocol >= 3:  # the snapshot as bytes, not a str to encode back when read
        assert b"_codecs" not in dumped
    # Held from the serialize to the end of the tick (across the fork of the dump writer).
    assert not free_elsewhere(consumer._lock)
    consumer._release_snapshot_lock()
    assert free_elsewhere(consumer._lock)  # released
    other = FakeState()
    frozen = gc.get_freeze_count()
    try:
        _StateConsumer(other)._deserialize(pickle.loads(dumped))
        # The restored state is frozen out of the collector's walks, and the collector is on again.
        assert gc.get_freeze_count() > frozen and gc.isenabled()
    finally:
        gc.unfreeze()
    assert other.read() == {"x": 1} and other.restores == 1


def test_the_forked_dump_writer_yields_the_cpu_and_the_node_keeps_its_priority():
    """The dump is encoded by a forked child (pysyncobj's useFork): it lowers its own priority
    before encoding, so that the nodes keep the CPU while it runs; a dump encoded in the node's
    own process (no fork) leaves the node's priority as it is."""
    state = FakeState()
    state.apply_bytes(incr("x"))
    consumer = _StateConsumer(state)
    data = consumer._serialize()
    try:
        before = os.nice(0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the dump writer, as pysyncobj's serializer forks it
            code = 1
            try:
                dumped = pickle.dumps(data, PICKLE_PROTOCOL)
                os.write(w, f"{os.nice(0)} {len(dumped)}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child_nice, size = (int(x) for x in said.split())
        assert child_nice == min(before + DUMP_WRITER_NICE, 19) and size > 0
        assert pickle.dumps(data, PICKLE_PROTOCOL) and os.nice(0) == before  # in the node's process: unchanged
    finally:
        consumer._release_snapshot_lock()


def test_the_collector_is_paused_while_a_snapshot_is_encoded_and_while_one_is_restored():
    """Encoding and restoring build the whole state at once: replication pauses the collector
    around both (gcpolicy.paused), whatever the state itself does, and switches it on again."""
    class Watched(FakeState):
        def __init__(self):
            super().__init__()
            self.collector_on: list[tuple[str, bool]] = []

        def snapshot(self):
            self.collector_on.append(("snapshot", gc.isenabled()))
            return super().snapshot()

        def restore(self, data):
            self.collector_on.append(("restore", gc.isenabled()))
            super().restore(data)

    state = Watched()
    state.apply_bytes(incr("x"))
    consumer = _StateConsumer(state)
    dumped = pickle.dumps(consumer._serialize(), PICKLE_PROTOCOL)
    consumer._release_snapshot_lock()
    assert gc.isenabled()
    other = Watched()
    try:
        _StateConsumer(other)._deserialize(pickle.loads(dumped))
    finally:
        gc.unfreeze()
    assert gc.isenabled()
    assert state.collector_on == [("snapshot", False)] and other.collector_on == [("restore", False)]


def test_every_apply_and_restore_holds_the_replicas_lock():
    """Replication owns the lock that keeps applies, snapshots and restores whole (the state
    owns none)."""
    class Watched(FakeState):
        def __init__(self):
            super().__init__()
            self.seen: list[tuple] = []

        def held(self, what):
            mine = ()
            self.seen.append((what, not free_elsewhere(consumer._lock)) + mine)

        def apply_bytes(self, data):
            self.held("apply")
            return super().apply_bytes(data)

        def restore(self, data):
            self.held("restore")
            super().restore(data)

    state = Watched()
    consumer = _StateConsumer(state)
    consumer._apply(incr("a"), _doApply=True)
    consumer._apply((incr("a"), incr("b")), _doApply=True)
    _restore_own_dump(consumer)
    both = (True,)
    assert state.seen == [("apply",) + both] * 3 + [("restore",) + both]
    assert free_elsewhere(consumer._lock) and state.read() == {"a": 2, "b": 1}


def test_an_armed_call_runs_once_after_the_next_entry_or_restore_and_its_failure_wedges_nothing():
    """RaftNode.arm_applied's seam: the call runs after the state moved (a reader woken by it
    sees the entry), once; raised, it is logged, and the entry is applied once all the same
    (an exception out of _apply makes pysyncobj apply the entry again, forever)."""
    state = FakeState()
    consumer = _StateConsumer(state)
    seen = []
    consumer.armed = lambda: seen.append(state.read())
    consumer._apply(incr("a"), _doApply=True)
    consumer._apply(incr("a"), _doApply=True)
    assert seen == [{"a": 1}] and consumer.armed is None  # once, after the first entry applied

    def boom():
        raise TypeError("a bug in the armed call")
    consumer.armed = boom
    assert consumer._apply(incr("a"), _doApply=True) == {"ok": True, "value": 3}
    assert state.read() == {"a": 3} and consumer.armed is None

    consumer.armed = lambda: seen.append("restored")
    _restore_own_dump(consumer)
    assert seen[-1] == "restored"
