"""The pipeline fields of a job spec (docs/pipelines.md): ``after``, ``match``, ``max_wait_s``.

Their validation on the proposer (``validate_after``, called by model.validate_job with its name
check) and apply's shape check of a stored spec (``check_stored_after``). What needs the state
(parents that exist, cycles) is core/pipelines.py's ``check_edges``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import limits
from .errors import InvalidCommand, InvalidSpec
from .records import Record, is_int

ON_VALUES = ("success", "failure", "finished")
MATCH_VALUES = ("same_slot", "latest")
#: A node's ``kind`` in ``GET /v1/jobs/{name}/graph`` (pipelines.graph): no ``after``, ``after``
#: without a schedule, both, or a parent a child's ``after`` names that is gone (deleted with
#: ``?force=true``).
GRAPH_KINDS = ("scheduled", "triggered", "gated", "missing")


# ------------------------------------------------------------------ spec validation (proposer)
def validate_after(raw: dict[str, Any], name: str, has_schedule: bool, check_name: Callable[[object, str], str]) -> Record:
    """The pipeline fields of a job body (``after``, ``match``, ``max_wait_s``), normalised.
    Only the shape: which parents exist, cycles and tenants are checked against the state
    (``check_edges``). ``check_name``: model.check_name. :raises InvalidSpec: naming the field."""
    out: Record = {}
    if "after" not in raw:
        for k in ("match", "max_wait_s"):
            if k in raw:
                raise InvalidSpec("applies to a job with after only", field=k)
        return out
    after = raw["after"]
    if not isinstance(after, list) or not after:
        raise InvalidSpec("must be a non-empty list of parents, e.g. [{\"job\": \"extract\"}]", field="after")
    if len(after) > limits.after_parents_max:
        raise InvalidSpec(f"names more than {limits.after_parents_max} parents", field="after")
    edges: list[Record] = []
    seen: set[str] = set()
    for i, e in enumerate(after):
        f = f"after[{i}]"
        if isinstance(e, str):
            e = {"job": e}
        if not isinstance(e, dict):
            raise InvalidSpec("must be a job name or {\"job\": NAME, \"on\": success|failure|finished}", field=f)
        for k in e:
            if k not in ("job", "on"):
                raise InvalidSpec("unknown field; allowed: job, on", field=f"{f}.{k}")
        parent = check_name(e.get("job"), f"{f}.job")
        if parent == name:
            raise InvalidSpec(f"a job cannot run after itself ({name} -> {name})", field=f"{f}.job")
        if parent in seen:
            raise InvalidSpec(f"names {parent} twice", field=f"{f}.job")
        seen.add(parent)
        on = e.get("on", "success")
        if on not in ON_VALUES:
            raise InvalidSpec(f"must be one of {', '.join(ON_VALUES)}", field=f"{f}.on")
        edges.append({"job": parent, "on": on})
    out["after"] = edges
    if "match" in raw:
        if not has_schedule:
            raise InvalidSpec("applies to a job with a schedule and after (a gated job) only", field="match")
        if raw["match"] not in MATCH_VALUES:
            raise InvalidSpec(f"must be one of {', '.join(MATCH_VALUES)}", field="match")
        if raw["match"] == "latest":
            if any(e["on"] != "success" for e in edges):
                raise InvalidSpec("match latest waits for successes: every edge's on must be success", field="match")
            out["match"] = "latest"
    if "max_wait_s" in raw:
        v = raw["max_wait_s"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limits.max_wait_s_max:
            raise InvalidSpec(f"must be an integer between 1 and {limits.max_wait_s_max}", field="max_wait_s")
        out["max_wait_s"] = v
    return out


def check_stored_after(spec: Record) -> None:
    """Apply's guard on the pipeline fields of a stored spec (shape only, I4)."""
    after = spec.get("after")
    if after is None:
        if "schedule" not in spec:
            raise InvalidCommand("spec.schedule is malformed")
        return
    if not (isinstance(after, list) and 0 < len(after) <= limits.after_parents_max
            and all(isinstance(e, dict) and isinstance(e.get("job"), str) and e.get("on") in ON_VALUES
                    for e in after)):
        raise InvalidCommand("spec.after is malformed")
    if spec.get("match", "same_slot") not in MATCH_VALUES:
        raise InvalidCommand("spec.match is malformed")
    if "max_wait_s" in spec and not is_int(spec["max_wait_s"]):
        raise InvalidCommand("spec.max_wait_s is malformed")
