"""The bodies of the backfill and bulk dead-letter requests, validated on the proposer (like
bodies.validate_queue and friends): each turns what a client sent into its command's fields, or
raises InvalidSpec naming the field and why."""
from __future__ import annotations

import json
from typing import Any, Literal, overload

import msgpack

from . import limits, schedule
from .backfill_plan import MODES, ORDERS, OVERLAPS
from .bodies import check_body
from .errors import InvalidSpec
from .model import NAME_RE, check_name
from .model import _depth as payload_depth
from .records import Record

BACKFILL_FIELDS = {"from", "to", "reprocess", "order", "max_concurrent", "rate_per_s", "max_slots", "payload",
                   "overlap", "dry_run", "id", "cascade", "upstream"}
DLQ_BULK_FIELDS = {"queue", "job", "error", "dead_from", "dead_to", "max_count", "max_concurrent", "rate_per_s",
                   "dry_run", "id", "all"}
# What selects the dead runs of a bulk DLQ request; without one of them, "all": true must say so.
DLQ_BULK_FILTERS = ("queue", "job", "error", "dead_from", "dead_to")
TRIGGER_FIELDS = {"payload", "slot", "propagate", "rerun", "downstream"}




def _int(b: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v: object = b.get(key, default)
    if v is None and default is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=key)
    return v


def _rate_milli(b: dict[str, Any], default: float | None) -> int | None:
    v: object = b.get("rate_per_s", default)
    if v is None:
        return None
    lo, hi = limits.backfill_rate_per_s_min, limits.backfill_rate_per_s_max
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise InvalidSpec(f"must be a number of runs per second between {lo:g} and {hi:g}, or null", field="rate_per_s")
    return max(1, round(v * 1000))


@overload
def _time(b: dict[str, Any], key: str, required: Literal[True]) -> int: ...


@overload
def _time(b: dict[str, Any], key: str, required: bool) -> int | None: ...


def _time(b: dict[str, Any], key: str, required: bool) -> int | None:
    if key not in b or b[key] is None:
        if required:
            raise InvalidSpec("is required: an ISO-8601 time such as 2026-11-22T00:00:00Z", field=key)
        return None
    return schedule.parse_iso_ms(b[key], key)


def _flag(b: dict[str, Any], key: str) -> bool:
    v = b.get(key, False)
    if not isinstance(v, bool):
        raise InvalidSpec("must be true or false", field=key)
    return v


def _id(b: dict[str, Any]) -> str | None:
    v = b.get("id")
    if v is None:
        return None
    n = limits.backfill_id_chars_max
    if not isinstance(v, str) or not 1 <= len(v) <= n or not NAME_RE.fullmatch(v):
        raise InvalidSpec(f"must be 1-{n} characters: letters, digits, '.', '_', '-', starting with a letter "
                          f"or digit", field="id")
    return v


def check_payload(v: Any, field: str = "payload") -> Any:
    """A payload override: JSON data of at most payload_bytes_max, nested at most
    payload_depth_max levels (apply refuses a deeper one), its integers storable (64 bits), as a
    job's own payload (model.validate_job)."""
    if payload_depth(v) > limits.payload_depth_max:
        raise InvalidSpec(f"is nested more than {limits.payload_depth_max} levels deep", field=field)
    try:
        encoded = json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidSpec("must be JSON-serialisable", field=field) from None
    if len(encoded) > limits.payload_bytes_max:
        raise InvalidSpec(f"is {len(encoded)} bytes as JSON; the limit is {limits.payload_bytes_max}", field=field)
    try:
        msgpack.packb(v, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        raise InvalidSpec("contains a value that cannot be stored (integers must fit in 64 bits)", field=field) from None
    return v


def check_not_heartbeat(job: Record, field: str, what: str) -> None:
    """A heartbeat job runs nothing: a backfill, or a trigger with a slot or a payload (a run for
    a worker), has nothing to run: the proposer's check, and apply's (the job may have
    changed in between). :raises InvalidSpec: naming ``field``."""
    if job["spec"]["executor"]["type"] == "heartbeat":
        raise InvalidSpec(f"job {job['name']!r} is a heartbeat job: no worker runs its slots (pings close them), "
                          f"so a {what} has nothing to run", field=field)


def validate_backfill(body: object, now_ms: int) -> dict[str, Any]:
    """``POST /v1/jobs/{name}/backfills``'s body -> ``{"from", "to" (ms), "reprocess", "order",
    "max_concurrent", "rate_milli" (or None), "max_slots", "overlap" (or None: from the job's
    own policy), "payload"? (only when given), "dry_run", "id" (or None)}``.

    A backfill covers the past: ``to`` may not be after ``now_ms``. :raises InvalidSpec:"""
    b = check_body(body, BACKFILL_FIELDS, empty_ok=True)
    lo, hi = _time(b, "from", True), _time(b, "to", True)
    if hi <= lo:
        raise InvalidSpec("must be after from (the range is [from, to))", field="to")
    if hi > now_ms:
        raise InvalidSpec(f"is after now ({schedule.iso(now_ms)}): a backfill runs slots of the past; the schedule "
                          f"runs the ones to come", field="to")
    out: dict[str, Any] = {"from": lo, "to": hi}
    for key, choices, default in (("reprocess", MODES, "missing"), ("order", ORDERS, "oldest")):
        v = b.get(key, default)
        if v not in choices:
            raise InvalidSpec(f"must be one of {', '.join(choices)}", field=key)
        out[key] = v
    out["max_concurrent"] = _int(b, "max_concurrent", limits.backfill_concurrent_default, 1,
                                 limits.backfill_concurrent_max)
    out["rate_milli"] = _rate_milli(b, None)
    out["max_slots"] = _int(b, "max_slots", limits.backfill_max_slots_default, 1, limits.backfill_slots_max)
    ov = b.get("overlap")
    if isinstance(ov, dict) and set(ov) == {"policy"}:
        ov = ov["policy"]
    if ov is not None and ov not in OVERLAPS:
        raise InvalidSpec(f"must be one of {', '.join(OVERLAPS)} (a backfill never skips nor replaces a run: "
                          f"forbid waits while another run of the job is queued or running)", field="overlap")
    out["overlap"] = ov
    if "payload" in b:
        out["payload"] = check_payload(b["payload"])
    out["dry_run"] = _flag(b, "dry_run")
    out["id"] = _id(b)
    cascade = b.get("cascade", "none")
    if cascade not in ("none", "children"):
        raise InvalidSpec("must be none or children (the jobs that run after it follow each backfilled slot)",
                          field="cascade")
    if cascade == "children":  # pipelines: each backfilled run's outcome reaches the job's children
        out["cascade"] = "children"
    if b.get("upstream", "wait") not in ("wait", "ignore"):
        raise InvalidSpec("must be wait or ignore (ignore: a job that runs after others runs these slots whatever "
                          "its parents did for them)", field="upstream")
    # (the node's check, node/backfills.py: not part of the command, which runs what it is given)
    return out


def overlap_of(job_spec: Record) -> str:
    """A backfill's overlap rule when the request gives none: ``allow`` for a job whose own
    policy is allow (without max_concurrent), else ``forbid``: where the job's policy would skip,
    coalesce or replace a run, the backfill waits instead."""
    ov = job_spec.get("overlap") or {"policy": "allow"}
    return "allow" if ov.get("policy") == "allow" and "max_concurrent" not in ov else "forbid"


def validate_dlq_bulk(body: object, action: str, now_ms: int) -> dict[str, Any]:
    """``POST /v1/dlq:requeue`` / ``:purge``'s body -> the dlq_bulk command's filters and bounds:
    ``{"queue", "job", "error", "dead_from", "dead_to" (ms; now when not given), "max_count",
    "max_concurrent", "rate_milli", "dry_run", "id"}``. A requeue is rate-limited by default
    (limits.dlq_requeue_rate_per_s_default) and keeps at most max_concurrent (default
    backfill_concurrent_max) of its runs queued or running. A request with no filter takes every
    dead run of the cluster, so it must say so (``"all": true``): an empty body, or one whose filter
    a script left out, is refused, not a purge of every queue. :raises InvalidSpec:"""
    b = check_body(body, DLQ_BULK_FIELDS, empty_ok=True)
    out: dict[str, Any] = {}
    # A queue's or a job's name as every other request reads it (model.check_name): one that no
    # queue or job can have is a mistake (a time given as a job), not a filter matching nothing.
    for key, n in (("queue", limits.queue_name_chars_max), ("job", limits.job_name_chars_max)):
        v = b.get(key)
        if v is not None:
            check_name(v, key, n)
        out[key] = v
    v, n = b.get("error"), limits.dlq_error_filter_chars_max
    if v is not None and (not isinstance(v, str) or not 1 <= len(v) <= n):
        raise InvalidSpec(f"must be a string of 1-{n} characters, or null", field="error")
    out["error"] = v
    out["dead_from"] = _time(b, "dead_from", False)
    to = _time(b, "dead_to", False)
    out["dead_to"] = now_ms if to is None else to
    if out["dead_from"] is not None and out["dead_from"] > out["dead_to"]:
        raise InvalidSpec("must not be after dead_to", field="dead_from")
    out["max_count"] = _int(b, "max_count", None, 1, limits.dlq_bulk_count_max)
    if action == "requeue":
        out["max_concurrent"] = _int(b, "max_concurrent", limits.backfill_concurrent_max, 1,
                                     limits.backfill_concurrent_max)
        out["rate_milli"] = _rate_milli(b, limits.dlq_requeue_rate_per_s_default)
    else:
        if b.get("max_concurrent") is not None:
            raise InvalidSpec("a purge runs nothing: max_concurrent is for requeue", field="max_concurrent")
        out["max_concurrent"] = None
        out["rate_milli"] = _rate_milli(b, None)
    out["dry_run"] = _flag(b, "dry_run")
    out["id"] = _id(b)
    if not _flag(b, "all") and all(b.get(k) is None for k in DLQ_BULK_FILTERS):
        raise InvalidSpec(f"no filter ({', '.join(DLQ_BULK_FILTERS)}): the {action} would take every dead "
                          "run of every queue; give a filter, or \"all\": true to mean that", field="all")
    return out


def validate_trigger(body: object) -> dict[str, Any]:
    """``POST /v1/jobs/{name}/trigger``'s optional body -> ``{"payload"? , "slot"? (ms), "propagate"?,
    "rerun"?, "downstream"?}``: ``rerun`` needs a slot; ``downstream`` needs ``rerun`` and makes
    the run propagate."""
    b = check_body(body, TRIGGER_FIELDS, empty_ok=True)
    out: dict[str, Any] = {}
    if "payload" in b:
        out["payload"] = check_payload(b["payload"])
    if b.get("slot") is not None:
        out["slot"] = schedule.parse_iso_ms(b["slot"], "slot")
    if "propagate" in b:  # pipelines: the run's outcome reaches the job's children
        if not isinstance(b["propagate"], bool):
            raise InvalidSpec("must be true or false", field="propagate")
        if b["propagate"]:
            out["propagate"] = True
    for flag in ("rerun", "downstream"):
        if flag in b and not isinstance(b[flag], bool):
            raise InvalidSpec("must be true or false", field=flag)
    if b.get("rerun"):
        if "slot" not in out:
            raise InvalidSpec("needs a slot: the slot to run again (a run without one is new anyway)", field="rerun")
        out["rerun"] = True
    if b.get("downstream"):
        if not b.get("rerun"):
            raise InvalidSpec("needs rerun: the children that ran for the slot run again after it runs again",
                              field="downstream")
        if b.get("propagate") is False:
            raise InvalidSpec("needs propagate: the children run again after the run's outcome reaches them",
                              field="downstream")
        out["propagate"] = True
        out["downstream"] = True
    return out
