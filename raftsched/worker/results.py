"""A run's result (docs/pipelines.md, "Results"): the JSON a run leaves for its children, read
the same way whatever left it (an http response body, a result file, an SDK handler's return).

A result is kept only when a complete can carry it and every later reader can walk it: at most
``result_bytes_max`` bytes, nested at most ``payload_depth_max`` levels (a payload's bound), its
integers within 64 bits. Anything else is no result, with why, and the run keeps its outcome: a
body nested as deep as the parser goes (2 048 levels) raised RecursionError out of the reader and
turned a successful run into a dead one.
"""
from __future__ import annotations

import json
from typing import Any

import msgpack

from ..core import limits
from ..core.model import _depth as depth


def parse_result(data: bytes) -> tuple[Any, str | None]:
    """The result in ``data`` (JSON bytes), and None; or None and why it is not kept ("is not
    JSON", ...), the words that follow "the response body" or "$RAFTSCHED_RESULT_FILE"."""
    if len(data) > limits.result_bytes_max:
        return None, f"is larger than {limits.result_bytes_max} bytes"
    try:
        value = json.loads(data)
    except RecursionError:
        return None, f"is nested more than {limits.payload_depth_max} levels deep"
    except ValueError:
        return None, "is not JSON"
    return check_result(value)


def check_result(value: Any) -> tuple[Any, str | None]:
    """``value`` (JSON data) as a result, and None; or None and why it is not kept."""
    if depth(value) > limits.payload_depth_max:
        return None, f"is nested more than {limits.payload_depth_max} levels deep"
    try:
        msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):
        return None, "holds a value a command cannot carry (an integer beyond 64 bits)"
    return value, None
