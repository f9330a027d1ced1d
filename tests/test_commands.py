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
    now=st.integers(0, 2**63 - 1),
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
