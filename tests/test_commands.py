"""The command codec: a versioned msgpack envelope, bounded in size, refusing garbage as a value."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import commands, limits
from raftsched.core.errors import InvalidCommand, LimitExceeded

from core_helpers import T0


def _raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _envelope(**over):
    cmd = {"v": limits.command_version, "op": "noop", "now": T0, "rid": None}
    cmd.update(over)
    return cmd


def test_make_builds_versioned_envelope_with_integer_now():
    cmd = commands.make("pause_job", T0 + 0.0, "rid-1", name="j")
    assert cmd == {"v": limits.command_version, "op": "pause_job", "now": T0, "rid": "rid-1", "name": "j"}
    assert type(cmd["now"]) is int


def test_round_trip_preserves_every_field():
    cmd = commands.make("fire", T0, None, entries=[
        {"job": "a", "gen": 3, "after": T0 - 5000, "upto": T0, "runs": [T0 - 1000, T0],
         "rec": [["skipped", "misfire", T0 - 4000, T0 - 2000, 3]], "next": T0 + 1000},
    ])
    assert commands.decode(commands.encode(cmd)) == cmd


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(commands.OPS),
    now=st.integers(0, limits.time_ms_max),
    rid=st.none() | st.text(max_size=limits.request_id_chars_max),
    fields=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in ("v", "op", "now", "rid")),
        st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                     max_leaves=10),
        max_size=5),
)
def test_round_trip_property(op, now, rid, fields):
    cmd = commands.make(op, now, rid, **fields)
    assert commands.decode(commands.encode(cmd)) == cmd


def test_encode_refuses_command_over_size_limit():
    big = commands.make("noop", T0, None, pad="x" * limits.command_bytes_max)
    with pytest.raises(LimitExceeded) as ei:
        commands.encode(big)
    assert ei.value.code == "limit_exceeded"


def test_encode_accepts_command_exactly_at_size_limit():
    base = len(commands.encode(commands.make("noop", T0, None, pad="")))
    # str8/str16 headers: grow the pad until the encoding is exactly the limit
    pad = limits.command_bytes_max - base
    while len(_raw(commands.make("noop", T0, None, pad="x" * pad))) > limits.command_bytes_max:
        pad -= 1
    data = commands.encode(commands.make("noop", T0, None, pad="x" * pad))
    assert len(data) <= limits.command_bytes_max
    assert commands.decode(data)["pad"] == "x" * pad


def test_decode_refuses_oversize_bytes():
    data = _raw(_envelope(pad="x" * (limits.command_bytes_max + 10)))
    with pytest.raises(InvalidCommand):
        commands.decode(data)


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x92\x01", b"\xde\xad\xbe\xef", b"\x81\xa1v", b"\xdf\xff\xff\xff\xff",
])
def test_decode_refuses_garbage_bytes(data):
    with pytest.raises(InvalidCommand):
        commands.decode(data)


def test_decode_refuses_non_bytes():
    with pytest.raises(InvalidCommand):
        commands.decode("not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("obj", [[1, 2, 3], 5, "noop", None, True])
def test_decode_refuses_non_map(obj):
    with pytest.raises(InvalidCommand, match="not a map"):
        commands.decode(_raw(obj))


def test_decode_refuses_non_string_map_keys():
    with pytest.raises(InvalidCommand):
        commands.decode(_raw({1: "x", "v": 1}))


@pytest.mark.parametrize("v", [0, 2, limits.command_version + 1, "1", None, 1.0 + 0.5])
def test_decode_refuses_wrong_version(v):
    with pytest.raises(InvalidCommand, match="version"):
        commands.decode(_raw(_envelope(v=v)))


def test_decode_refuses_missing_version():
    cmd = _envelope()
    del cmd["v"]
    with pytest.raises(InvalidCommand, match="version"):
        commands.decode(_raw(cmd))


@pytest.mark.parametrize("op", ["drop_tables", "", None, 7, "NOOP", "_apply_noop"])
def test_decode_refuses_unknown_op(op):
    with pytest.raises(InvalidCommand, match="unknown op"):
        commands.decode(_raw(_envelope(op=op)))


@pytest.mark.parametrize("now", [-1, 1.5, float(T0), "123", None, True, False, [T0]])
def test_decode_refuses_bad_now(now):
    with pytest.raises(InvalidCommand, match="now"):
        commands.decode(_raw(_envelope(now=now)))


def test_decode_refuses_missing_now():
    cmd = _envelope()
    del cmd["now"]
    with pytest.raises(InvalidCommand, match="now"):
        commands.decode(_raw(cmd))


@pytest.mark.parametrize("rid", [5, b"bytes-id", ["a"], "x" * (limits.request_id_chars_max + 1)])
def test_decode_refuses_bad_request_id(rid):
    with pytest.raises(InvalidCommand, match="request id"):
        commands.decode(_raw(_envelope(rid=rid)))


def test_decode_accepts_request_id_at_length_limit_and_none():
    assert commands.decode(_raw(_envelope(rid="x" * limits.request_id_chars_max)))["rid"] == "x" * limits.request_id_chars_max
    assert commands.decode(_raw(_envelope(rid=None)))["rid"] is None
    assert commands.decode(_raw(_envelope(now=0)))["now"] == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decode_never_raises_anything_but_invalid_command(data):
    try:
        cmd = commands.decode(data)
    except InvalidCommand:
        return
    assert isinstance(cmd, dict) and cmd["op"] in commands.OPS


def test_invalid_command_is_a_definite_422_refusal():
    e = InvalidCommand("x")
    assert e.definite and e.http_status == 422 and e.to_dict()["code"] == "invalid_command"


def test_every_op_has_one_handler_whose_docstring_is_its_commands_schema():
    """The codec's ops and apply's table are one list (state.py checks it at import too), and
    each handler's docstring opens with its command: ``op {fields}``."""
    from raftsched.core.state import HANDLERS
    assert tuple(HANDLERS) == commands.OPS
    for op, handler in HANDLERS.items():
        assert handler.__name__ == f"apply_{op}", (op, handler)
        assert (handler.__doc__ or "").lstrip().startswith(f"``{op}"), f"{op}: its docstring names no command"


# The typed constructors (issue 21) write each command's fields in the order the node wrote them
# by hand before, so the bytes on the wire, in journals and in snapshots' request tables do not
# change: each is held here against the hand-built command it replaced.
_SPEC = {"schedule": {"every_s": 5}}
CONSTRUCTED = [
    (commands.put_job(T0, "r", name="a", spec=_SPEC, next=1, cursor=2, anchor=3, create_only=False),
     commands.make("put_job", T0, "r", name="a", spec=_SPEC, next=1, cursor=2, anchor=3, create_only=False)),
    (commands.put_jobs(T0, "jb-1", jobs=[["a", _SPEC]]), commands.make("put_jobs", T0, "jb-1", jobs=[["a", _SPEC]])),
    (commands.delete_job(T0, "r", name="a"), commands.make("delete_job", T0, "r", name="a")),
    (commands.pause_job(T0, "r", name="a"), commands.make("pause_job", T0, "r", name="a")),
    (commands.resume_job(T0, "r", name="a", catch_up=True), commands.make("resume_job", T0, "r", name="a", catch_up=True)),
    (commands.resume_job(T0, "r", name="a", catch_up=False, plan={"gen": 1, "next": 5, "cursor": 4}),
     commands.make("resume_job", T0, "r", name="a", catch_up=False, gen=1, next=5, cursor=4)),
    (commands.trigger_job(T0, "r", name="a"), commands.make("trigger_job", T0, "r", name="a")),
    (commands.trigger_job(T0, "r", name="a", extra={"slot": 5, "payload": 1}),
     commands.make("trigger_job", T0, "r", name="a", slot=5, payload=1)),
    (commands.fire(T0, entries=[1]), commands.make("fire", T0, None, entries=[1])),
    (commands.takeover(T0, node="n1"), commands.make("takeover", T0, None, node="n1")),
    (commands.expire(T0, runs=[1], locks=[2]), commands.make("expire", T0, None, runs=[1], locks=[2])),
    (commands.put_queue(T0, "r", name="q", fields={"max_depth": 5, "on_full": "reject"}),
     commands.make("put_queue", T0, "r", name="q", max_depth=5, on_full="reject")),
    (commands.put_tenant(T0, "r", name="t", fields={"rate_milli": 1, "burst": 2}),
     commands.make("put_tenant", T0, "r", name="t", rate_milli=1, burst=2)),
    (commands.put_tenant_policy(T0, "r", name="t", fields={"executors": ["http"], "labels": {}, "allow": []}),
     commands.make("put_tenant_policy", T0, "r", name="t", executors=["http"], labels={}, allow=[])),
    (commands.put_job(T0, "r", name="a", spec=_SPEC, next=1, cursor=2, anchor=3, create_only=False, claim="t"),
     commands.make("put_job", T0, "r", name="a", spec=_SPEC, next=1, cursor=2, anchor=3, create_only=False,
                   claim="t")),
    (commands.put_queue(T0, "r", name="q", fields={"max_depth": 5, "on_full": "reject", "tenants": ["t"]}),
     commands.make("put_queue", T0, "r", name="q", max_depth=5, on_full="reject", tenants=["t"])),
    (commands.delete_tenant(T0, "r", name="t"), commands.make("delete_tenant", T0, "r", name="t")),
    (commands.dlq_requeue(T0, "r", run="x@1"), commands.make("dlq_requeue", T0, "r", run="x@1")),
    (commands.dlq_delete(T0, "r", run="x@1"), commands.make("dlq_delete", T0, "r", run="x@1")),
    (commands.lock_command("lock_acquire", T0, "r", name="l", fields={"owner": "o", "ttl": 5}),
     commands.make("lock_acquire", T0, "r", name="l", owner="o", ttl=5)),
    (commands.backfill(T0, "r", {"name": "b", "job": "a"}), commands.make("backfill", T0, "r", name="b", job="a")),
    (commands.dlq_bulk(T0, "r", {"queue": None, "name": "b"}), commands.make("dlq_bulk", T0, "r", queue=None, name="b")),
    (commands.backfill_control(T0, "r", name="b", action="pause"),
     commands.make("backfill_control", T0, "r", name="b", action="pause")),
    (commands.step("backfill_step", T0, {"name": "b", "slots": [1]}),
     commands.make("backfill_step", T0, None, name="b", slots=[1])),
    (commands.token_create(T0, "r", id="i", hash={"alg": "x"}, fields={"role": "reader", "tenants": None}),
     commands.make("token_create", T0, "r", id="i", hash={"alg": "x"}, role="reader", tenants=None)),
    (commands.token_revoke(T0, "r", id="i"), commands.make("token_revoke", T0, "r", id="i")),
    (commands.reseal(T0, None, key="k", jobs=[]), commands.make("reseal", T0, None, key="k", jobs=[])),
    (commands.worker_hello(T0, worker="w", facts={"labels": {}, "slots": 1}),
     commands.make("worker_hello", T0, None, worker="w", labels={}, slots=1)),
    (commands.acquire(T0, worker="w", queues=None, max=2, ttl=9, types=None),
     commands.make("acquire", T0, None, worker="w", queues=None, max=2, ttl=9, types=None)),
    (commands.acquire(T0, worker="w", queues=None, max=2, ttl=9, types=None, tenants={"b", "a"}),
     commands.make("acquire", T0, None, worker="w", queues=None, max=2, ttl=9, types=None, tenants=["a", "b"])),
    # (the proposing node's name since 2026-12-05, last: core/leases.py apply_acquire)
    (commands.acquire(T0, worker="w", queues=None, max=2, ttl=9, types=None, tenants=["a"], by="node-1"),
     commands.make("acquire", T0, None, worker="w", queues=None, max=2, ttl=9, types=None, tenants=["a"],
                   by="node-1")),
    (commands.heartbeat(T0, worker="w", leases=[], ttl=9), commands.make("heartbeat", T0, None, worker="w", leases=[], ttl=9)),
    # (outcomes as rows since 2026-12-05: core/leases.py apply_complete_many applies both forms)
    (commands.complete_many(T0, "r", results=[{"run": "a@1", "token": 3, "success": True},
                                              {"run": "a@2", "token": 4, "success": False, "error": "e",
                                               "output": "o", "result": None},
                                              {"run": "a@3", "token": 5, "success": True, "result": {"k": 1}}],
                            worker="w"),
     commands.make("complete_many", T0, "r", rows=[["a@1", 3, True, None, None], ["a@2", 4, False, "e", "o"],
                                                   ["a@3", 5, True, None, None, {"k": 1}]], worker="w")),
    (commands.complete_many(T0, "r", results=[], worker="w", own=True, tenants=["a"]),
     commands.make("complete_many", T0, "r", rows=[], worker="w", own=True, tenants=["a"])),
    (commands.release(T0, "r", worker="w", leases=[], reason="x"),
     commands.make("release", T0, "r", worker="w", leases=[], reason="x")),
    (commands.drain_worker(T0, "r", worker="w"), commands.make("drain_worker", T0, "r", worker="w")),
    (commands.workers_seen(T0, node="n", workers=[]), commands.make("workers_seen", T0, None, node="n", workers=[])),
    (commands.forget_workers(T0, workers=[]), commands.make("forget_workers", T0, None, workers=[])),
    (commands.fire(T0, entries=[1], dl=[[2]]), commands.make("fire", T0, None, entries=[1], dl=[[2]])),
    (commands.deadline_judge(T0, runs=["a@1"], jobs=[]),
     commands.make("deadline_judge", T0, None, runs=["a@1"], jobs=[])),
    (commands.ping(T0, "r", name="a", status="start", slot=None),
     commands.make("ping", T0, "r", name="a", status="start", slot=None)),
    (commands.put_sink(T0, "r", name="s", spec={}), commands.make("put_sink", T0, "r", name="s", spec={})),
    (commands.delete_sink(T0, "r", name="s"), commands.make("delete_sink", T0, "r", name="s")),
    (commands.sink_progress(T0, items=[]), commands.make("sink_progress", T0, None, items=[])),
    (commands.sink_requeue(T0, "r", name="s", events=None), commands.make("sink_requeue", T0, "r", name="s", events=None)),
    (commands.put_tenant_notify(T0, "r", name="t", notify=[]),
     commands.make("put_tenant_notify", T0, "r", name="t", notify=[])),
    (commands.takeover(T0, node="n", seen=5), commands.make("takeover", T0, None, node="n", seen=5)),
    (commands.note_unplaceable(T0, runs=[]), commands.make("note_unplaceable", T0, None, runs=[])),
    (commands.sink_reseal(T0, None, items=[]), commands.make("sink_reseal", T0, None, items=[])),
    (commands.member_url(T0, addr="h:1", url="http://h:2"), commands.make("member_url", T0, None, addr="h:1", url="http://h:2")),
    (commands.fencing_floor(T0, "r", at_least=7), commands.make("fencing_floor", T0, "r", at_least=7)),
    (commands.join_expire(T0, joins=[]), commands.make("join_expire", T0, None, joins=[])),
    (commands.fanout_step(T0, key="k", after=None), commands.make("fanout_step", T0, None, key="k", after=None)),
    (commands.cancel_run(T0, "r", run="x@1", reason="why"),
     commands.make("cancel_run", T0, "r", run="x@1", reason="why")),
    (commands.cancel_runs(T0, "r", runs=["x@1"], reason="why", running=True),
     commands.make("cancel_runs", T0, "r", runs=["x@1"], running=True, reason="why")),
]


@pytest.mark.parametrize("built,by_hand", CONSTRUCTED, ids=[b["op"] for b, _ in CONSTRUCTED])
def test_each_typed_constructor_gives_the_bytes_of_the_command_it_replaced(built, by_hand):
    assert list(built) == list(by_hand)
    assert commands.encode(built) == commands.encode(by_hand)


def test_every_op_has_a_typed_constructor():
    # "complete" (one outcome) is applied still, for journals that hold it; the node proposes
    # complete_many.
    assert {b["op"] for b, _ in CONSTRUCTED} | {"noop", "lock_renew", "lock_release", "dlq_bulk_step",
                                               "complete"} == set(commands.OPS)
    with pytest.raises(ValueError):
        commands.lock_command("put_job", T0, None, name="x", fields={})
    with pytest.raises(ValueError):
        commands.step("fire", T0, {})
