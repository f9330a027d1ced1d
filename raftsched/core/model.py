"""Job specs: validation and normalisation, and the policy enums.

``validate_job`` turns what a client sent into the normalised spec stored in the state, or raises
``InvalidSpec`` naming the field and why. It is pure and deterministic; it is called by the node
that receives the request (the proposer), and again by apply as a guard, so a malformed command
can never put a bad job into any replica.
"""
from __future__ import annotations

import enum
import json
import math
import re
from datetime import datetime, timezone

import msgpack

from . import limits, schedule
from .errors import InvalidSpec


class MisfirePolicy(str, enum.Enum):
    """What happens to slots older than ``grace_s`` when the leader fires them."""

    #: one run for every missed slot, oldest first, at most ``max_catchup``; the rest are
    #: recorded as skipped (reason ``catchup_limit``).
    FIRE_ALL = "fire_all"
    #: one run for the latest missed slot; the others are recorded as coalesced.
    FIRE_ONCE = "fire_once"
    #: no run for missed slots; each is recorded as skipped (reason ``misfire``).
    SKIP = "skip"


class RunState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    #: recorded slots that did not become runs
    SKIPPED = "skipped"
    COALESCED = "coalesced"


#: The policy names, in declaration order (built once: iterating an Enum costs microseconds).
MISFIRE_POLICIES = tuple(p.value for p in MisfirePolicy)
#: Every state a run or recorded slot can be in, in declaration order.
RUN_STATES = tuple(s.value for s in RunState)

TERMINAL_STATES = frozenset({"succeeded", "failed", "dead", "skipped", "coalesced"})
EXECUTOR_TYPES = ("shell", "http", "python")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
TARGET_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")

_TOP_FIELDS = {
    "schedule", "executor", "payload", "timeout_s", "misfire", "retry", "queue", "priority",
    "tenant", "history", "description", "overlap", "jitter_s",
    "labels",
    "placement",
}
#: The top-level fields of a job spec (what PUT /v1/jobs/{name} accepts).
SPEC_FIELDS = frozenset(_TOP_FIELDS)
#: The fields of a spec's ``schedule``.
SCHEDULE_FIELDS = frozenset({"cron", "timezone", "every_s", "at", "dst", "start_at"})

OVERLAP_POLICIES = ("allow", "forbid", "queue_one", "replace")


def check_name(name, field: str = "name", max_chars: int = limits.job_name_chars_max) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidSpec("must be a non-empty string", field=field)
    if len(name) > max_chars:
        raise InvalidSpec(f"is longer than {max_chars} characters", field=field)
    if not NAME_RE.match(name):
        raise InvalidSpec(
            "may contain only letters, digits, '.', '_' and '-', and must start with a letter or digit",
            field=field,
        )
    return name


def _int(value, field: str, lo: int, hi: int) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=field)
    value = int(value)
    if not lo <= value <= hi:
        raise InvalidSpec(f"must be between {lo} and {hi}; got {value}", field=field)
    return value


def _num(value, field: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidSpec(f"must be a number between {lo} and {hi}", field=field)
    if not lo <= value <= hi:
        raise InvalidSpec(f"must be between {lo} and {hi}; got {value}", field=field)
    return value


def _obj(value, field: str, allowed: set[str]) -> dict:
    if not isinstance(value, dict):
        raise InvalidSpec("must be an object", field=field)
    for k in value:
        if k not in allowed:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(allowed))}", field=f"{field}.{k}")
    return value


def validate_schedule(raw, now_ms: int | None = None) -> dict:
    sched = _obj(raw, "schedule", SCHEDULE_FIELDS)
    kinds = [k for k in ("cron", "every_s", "at") if k in sched]
    if len(kinds) != 1:
        raise InvalidSpec("must have exactly one of cron, every_s or at", field="schedule")
    if "timezone" in sched and kinds[0] != "cron":
        raise InvalidSpec("timezone applies to cron schedules only", field="schedule.timezone")
    if "start_at" in sched and kinds[0] != "every_s":
        raise InvalidSpec("start_at applies to every_s schedules only", field="schedule.start_at")
    if "dst" in sched and kinds[0] != "cron":
        raise InvalidSpec("dst applies to cron schedules only (intervals are absolute time)", field="schedule.dst")
    if kinds[0] == "cron":
        tz = sched.get("timezone", "UTC")
        if not isinstance(tz, str) or not tz:
            raise InvalidSpec("must be an IANA zone name such as Europe/Berlin", field="schedule.timezone")
        schedule.zone(tz)
        expr = sched["cron"]
        schedule.check_cron(expr, now_ms, tz)
        out = {"cron": " ".join(expr.split()), "timezone": tz}
        if "dst" in sched:
            dst = _obj(sched["dst"], "schedule.dst", {"spring_forward", "fall_back"})
            norm = {}
            if "spring_forward" in dst:
                if dst["spring_forward"] not in ("skip", "run_after_gap"):
                    raise InvalidSpec("must be skip or run_after_gap", field="schedule.dst.spring_forward")
                norm["spring_forward"] = dst["spring_forward"]
            if "fall_back" in dst:
                if dst["fall_back"] not in ("once", "twice"):
                    raise InvalidSpec("must be once or twice", field="schedule.dst.fall_back")
                norm["fall_back"] = dst["fall_back"]
            if norm:
                out["dst"] = norm
        return out
    if kinds[0] == "every_s":
        out = {"every_s": _int(sched["every_s"], "schedule.every_s", limits.every_s_min, limits.every_s_max)}
        if "start_at" in sched:
            out["start_at"] = _time_ms(sched["start_at"], "schedule.start_at")
        return out
    return {"at": _time_ms(sched["at"], "schedule.at")}


def _time_ms(v, field: str) -> int:
    """An ISO-8601 time with a zone, or integer milliseconds since the epoch, as milliseconds."""
    if isinstance(v, str):
        # The same range as the integer form: an ISO time before the epoch is refused too.
        return _int(schedule.parse_iso_ms(v, field), field, 0, 2**53)
    return _int(v, field, 0, 2**53)


def validate_executor(raw) -> dict:
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object with a type", field="executor")
    t = raw.get("type")
    if t not in EXECUTOR_TYPES:
        raise InvalidSpec(f"type must be one of {', '.join(EXECUTOR_TYPES)}", field="executor.type")
    if t == "shell":
        ex = _obj(raw, "executor", {"type", "argv", "env", "cwd"})
        argv = ex.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidSpec("must be a non-empty list of strings (use [\"sh\", \"-c\", \"...\"] for a shell line)", field="executor.argv")
        if len(argv) > limits.argv_items_max:
            raise InvalidSpec(f"has more than {limits.argv_items_max} items", field="executor.argv")
        out = {"type": "shell", "argv": list(argv)}
        if "env" in ex:
            env = ex["env"]
            if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise InvalidSpec("must be an object of string values", field="executor.env")
            out["env"] = dict(env)
        if "cwd" in ex:
            if not isinstance(ex["cwd"], str) or not ex["cwd"]:
                raise InvalidSpec("must be a non-empty string", field="executor.cwd")
            out["cwd"] = ex["cwd"]
        return out
    if t == "http":
        ex = _obj(raw, "executor", {"type", "url", "headers"})
        url = ex.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
            raise InvalidSpec("must be an http:// or https:// URL", field="executor.url")
        out = {"type": "http", "url": url}
        if "headers" in ex:
            h = ex["headers"]
            if not isinstance(h, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in h.items()):
                raise InvalidSpec("must be an object of string values", field="executor.headers")
            out["headers"] = dict(h)
        return out
    ex = _obj(raw, "executor", {"type", "target"})
    target = ex.get("target")
    if not isinstance(target, str) or not TARGET_RE.match(target):
        raise InvalidSpec("must be 'module:function', e.g. 'myapp.jobs:nightly'", field="executor.target")
    return {"type": "python", "target": target}


def validate_misfire(raw) -> dict:
    if raw is None:
        raise InvalidSpec(
            "is required: choose a policy, one of fire_all, fire_once, skip "
            "(there is no silent default for missed slots)", field="misfire",
        )
    m = _obj(raw, "misfire", {"policy", "grace_s", "max_catchup"})
    policy = m.get("policy")
    if policy not in MISFIRE_POLICIES:
        raise InvalidSpec(f"must be one of {', '.join(MISFIRE_POLICIES)}", field="misfire.policy")
    # An absent field takes its default as is (a constant, not re-validated for every job).
    return {
        "policy": policy,
        "grace_s": (_int(m["grace_s"], "misfire.grace_s", 0, limits.grace_s_max)
                    if "grace_s" in m else limits.grace_s_default),
        "max_catchup": (_int(m["max_catchup"], "misfire.max_catchup", 0, limits.max_catchup_max)
                        if "max_catchup" in m else limits.max_catchup_default),
    }


#: The retry block of a spec that has none (checked against validate_retry at import).
RETRY_DEFAULT = {"max_attempts": 1, "backoff_s": 1, "backoff_multiplier": 2, "backoff_max_s": 300, "jitter": 0.1}


def validate_retry(raw) -> dict:
    if raw is None:
        return dict(RETRY_DEFAULT)
    r = _obj(raw, "retry", {"max_attempts", "backoff_s", "backoff_multiplier", "backoff_max_s", "jitter"})
    d = RETRY_DEFAULT
    out = {
        "max_attempts": _int(r.get("max_attempts", d["max_attempts"]), "retry.max_attempts", 1, limits.retry_attempts_max),
        "backoff_s": _num(r.get("backoff_s", d["backoff_s"]), "retry.backoff_s", 0, limits.retry_backoff_s_max),
        "backoff_multiplier": _num(r.get("backoff_multiplier", d["backoff_multiplier"]), "retry.backoff_multiplier", 1, limits.retry_backoff_multiplier_max),
        "backoff_max_s": _num(r.get("backoff_max_s", d["backoff_max_s"]), "retry.backoff_max_s", 0, limits.retry_backoff_s_max),
        "jitter": _num(r.get("jitter", d["jitter"]), "retry.jitter", 0, 1),
    }
    if out["backoff_max_s"] < out["backoff_s"]:
        raise InvalidSpec("must be at least backoff_s", field="retry.backoff_max_s")
    return out


def validate_overlap(raw) -> dict:
    if raw is None:
        return {"policy": "allow"}
    o = _obj(raw, "overlap", {"policy", "max_concurrent"})
    policy = o.get("policy", "allow")
    if policy not in OVERLAP_POLICIES:
        raise InvalidSpec(f"must be one of {', '.join(OVERLAP_POLICIES)}", field="overlap.policy")
    out = {"policy": policy}
    if "max_concurrent" in o:
        if policy != "allow":
            raise InvalidSpec("applies to policy allow only", field="overlap.max_concurrent")
        out["max_concurrent"] = _int(o["max_concurrent"], "overlap.max_concurrent", 1, limits.overlap_concurrent_max)
    return out


def _offset_changes_ms(tz: str, lo_ms: int, hi_ms: int) -> list[int]:
    """The instants in [lo_ms, hi_ms) where the zone's UTC offset changes (a week's step, then
    bisection to the millisecond)."""
    z = schedule.zone(tz)

    def off(ms: int):
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone(z).utcoffset()

    week = 7 * 86_400_000
    out = []
    for t in range(lo_ms, hi_ms, week):
        if off(t) != off(t + week):
            a, b = t, t + week
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (mid, b) if off(mid) == off(a) else (a, mid)
            out.append(b)
    return out


def _add_jitter(name: str, sched: dict, jitter_s) -> None:
    """Validate ``jitter_s`` and store it in the schedule: below the schedule's shortest interval
    (checked over the next 200 slots for cron, and around the zone's DST transitions), so
    jittered slots keep their order."""
    j = _int(jitter_s, "jitter_s", 0, limits.jitter_s_max)
    if j == 0:
        return
    if "at" in sched:
        raise InvalidSpec("a one-shot schedule has nothing to spread", field="jitter_s")
    if "every_s" in sched:
        gap_s = sched["every_s"]
    else:
        start = schedule.parse_iso_ms("2026-01-01T00:00:00Z", "jitter_s")
        slots = list(schedule.iter_slots(sched, start, 2**62, 0, 200))
        gaps = [b - a for a, b in zip(slots, slots[1:])]
        # A DST transition can bring two slots closer than anywhere else: "59 1,2 * * *" in
        # Australia/Sydney fires at 01:59 and, on 2026-10-04, at 03:00 for the 02:59 that does not
        # exist, a minute later. The 200 slots above need not reach a transition, so look at the
        # slots on either side of each transition of 2026 too (the zone's rules repeat yearly).
        for t in _offset_changes_ms(sched["timezone"], start, start + 366 * 86_400_000):
            near = (schedule.last_slots_until(sched, t - 2 * 86_400_000, t - 1, 0, 2)
                    + list(schedule.iter_slots(sched, t - 1, 2**62, 0, 3)))
            gaps += [b - a for a, b in zip(near, near[1:])]
        gap_s = min(gaps, default=10**9) / 1000
    if j >= gap_s:
        raise InvalidSpec(f"must be less than the schedule's shortest interval ({gap_s:g} s)", field="jitter_s")
    sched["jitter_ms"] = j * 1000
    sched["jitter_key"] = name


LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")


def check_label_key(key, field: str) -> str:
    """A label key (``raftsched.app``, ``team``). :raises InvalidSpec: naming ``field``."""
    n = limits.label_key_chars_max
    if not isinstance(key, str) or not key or len(key) > n or not LABEL_KEY_RE.match(key):
        raise InvalidSpec(f"a label key is 1-{n} letters, digits, '.', '_', '/' and '-', starting and "
                          "ending with a letter or digit", field=field)
    return key


def check_label_value(value, field: str) -> str:
    """A label value: printable text of at most label_value_chars_max characters, '' included.
    :raises InvalidSpec: naming ``field``."""
    n = limits.label_value_chars_max
    if not isinstance(value, str) or len(value) > n or not value.isprintable():
        raise InvalidSpec(f"a label value is printable text of at most {n} characters", field=field)
    return value


def validate_labels(raw) -> dict:
    """A job's ``labels``: a map of at most job_labels_max keys to string values, returned with
    its keys sorted (so equal maps store equal bytes).

    :raises InvalidSpec: naming the field (``labels.<key>`` for a bad value)."""
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object of string values, e.g. {\"team\": \"billing\"}", field="labels")
    if len(raw) > limits.job_labels_max:
        raise InvalidSpec(f"has {len(raw)} labels; at most {limits.job_labels_max}", field="labels")
    for k, v in raw.items():
        check_label_key(k, "labels")
        check_label_value(v, f"labels.{k}")
    return {k: raw[k] for k in sorted(raw)}


def validate_job(name, raw, now_ms: int | None = None) -> dict:
    """Validate a job spec and return its normalised form.

    :param now_ms: the proposer's now: a cron expression that never matches after it is
        refused (None: not checked, for tools that validate specs outside a node)

    :raises InvalidSpec: naming the first offending field and why.
    """
    check_name(name)
    if not isinstance(raw, dict):
        raise InvalidSpec("the job spec must be a JSON object", field=None)
    for k in raw:
        if k not in _TOP_FIELDS:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(_TOP_FIELDS))}", field=str(k))
    if "schedule" not in raw:
        raise InvalidSpec("is required: {\"cron\": ...}, {\"every_s\": ...} or {\"at\": ...}", field="schedule")
    if "executor" not in raw:
        raise InvalidSpec("is required: {\"type\": \"shell\"|\"http\"|\"python\", ...}", field="executor")
    # An absent field takes its default as is: the defaults are valid constants (checked at
    # import), not re-validated for every job of a bulk registration.
    spec = {
        "schedule": validate_schedule(raw["schedule"], now_ms),
        "executor": validate_executor(raw["executor"]),
        "payload": raw.get("payload", {}),
        "timeout_s": (_int(raw["timeout_s"], "timeout_s", 1, limits.timeout_s_max)
                      if "timeout_s" in raw else limits.timeout_s_default),
        "misfire": validate_misfire(raw.get("misfire")),
        "retry": validate_retry(raw.get("retry")),
        "queue": (check_name(raw["queue"], "queue", limits.queue_name_chars_max)
                  if "queue" in raw else "default"),
        "priority": (_int(raw["priority"], "priority", 0, limits.priority_max)
                     if "priority" in raw else limits.priority_default),
        "tenant": (check_name(raw["tenant"], "tenant", limits.tenant_name_chars_max)
                   if "tenant" in raw else "default"),
        "history": (_int(raw["history"], "history", 1, limits.history_per_job_max)
                    if "history" in raw else limits.history_per_job_default),
        "overlap": validate_overlap(raw.get("overlap")),
    }
    if "jitter_s" in raw:
        _add_jitter(name, spec["schedule"], raw["jitter_s"])
    if "description" in raw:
        d = raw["description"]
        if not isinstance(d, str) or len(d) > limits.description_chars_max:
            raise InvalidSpec(f"must be a string of at most {limits.description_chars_max} characters", field="description")
        spec["description"] = d
    if "labels" in raw:
        labels = validate_labels(raw["labels"])
        if labels:  # no labels and {} are the same spec
            spec["labels"] = labels
    if "placement" in raw:
        spec["placement"] = validate_placement(raw["placement"])
    payload = spec["payload"]
    if "payload" in raw:  # the default, {}, is valid
        try:
            encoded = json.dumps(payload, allow_nan=False)
        except (TypeError, ValueError):
            raise InvalidSpec("must be JSON-serialisable", field="payload") from None
        if len(encoded) > limits.payload_bytes_max:
            raise InvalidSpec(f"is {len(encoded)} bytes as JSON; the limit is {limits.payload_bytes_max}", field="payload")
    try:
        size = len(msgpack.packb(spec, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        raise InvalidSpec("contains a value that cannot be stored (integers must fit in 64 bits)", field="payload") from None
    if size > limits.job_spec_bytes_max:
        raise InvalidSpec(f"spec is {size} bytes encoded; the limit is {limits.job_spec_bytes_max}", field=None)
    return spec


# ------------------------------------------------------------------ placement (docs/workers.md)
#: What a label name or value may hold (the worker registry's rule too, core/workers.py).
LABEL_RE = NAME_RE


def validate_worker_labels(raw, field: str) -> dict:
    """A map of worker labels, returned with its names in order (a state's bytes must not depend
    on the order a client wrote them in). :raises InvalidSpec: naming the label and why."""
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object of label: value strings", field=field)
    if len(raw) > limits.worker_labels_max:
        raise InvalidSpec(f"has more than {limits.worker_labels_max} labels", field=field)
    n = limits.worker_label_chars_max
    for k, v in raw.items():
        if not isinstance(k, str) or not k or len(k) > n or not LABEL_RE.match(k):
            raise InvalidSpec(f"label names are 1-{n} letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit", field=f"{field}.{k}")
        if not isinstance(v, str) or not v or len(v) > n or not LABEL_RE.match(v):
            raise InvalidSpec(f"label values are 1-{n} letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit", field=f"{field}.{k}")
    return {k: raw[k] for k in sorted(raw)}


def validate_placement(raw) -> dict:
    """``{"labels": {name: value, ...}}``: the labels a worker must carry, all of them, to run
    the job's runs. :raises InvalidSpec: naming the field."""
    p = _obj(raw, "placement", {"labels"})
    if "labels" not in p:
        raise InvalidSpec("is required: the labels a worker must carry, e.g. {\"pool\": \"gpu\"}",
                          field="placement.labels")
    labels = validate_worker_labels(p["labels"], "placement.labels")
    if not labels:
        raise InvalidSpec("must name at least one label (leave placement out for any worker)",
                          field="placement.labels")
    return {"labels": labels}


def placement_ok(spec: dict, labels: dict, dedicated=()) -> bool:
    """Whether a worker with ``labels`` may run a job of ``spec`` (I18): every label of its
    placement is one of the worker's, with the same value. A spec without placement: any worker.
    A malformed placement (apply's guard refuses one before it is stored) matches no worker.

    :param dedicated: the names of the worker's labels it is dedicated to (core/workers.py): it
        takes only runs whose placement names each of them (a spec without placement: none)."""
    pl = spec.get("placement")
    if pl is None:
        return not dedicated
    want = pl.get("labels") if type(pl) is dict else None
    if type(want) is not dict:
        return False
    for k in dedicated:
        if k not in want:
            return False
    for k, v in want.items():
        if labels.get(k) != v:
            return False
    return True


# The defaults validate_job takes as they are, without validating them per job.
assert validate_retry({}) == RETRY_DEFAULT
assert validate_overlap({}) == {"policy": "allow"}
assert check_name("default", "queue", limits.queue_name_chars_max) == "default"
assert check_name("default", "tenant", limits.tenant_name_chars_max) == "default"
assert 1 <= limits.timeout_s_default <= limits.timeout_s_max and 0 <= limits.priority_default <= limits.priority_max
assert 1 <= limits.history_per_job_default <= limits.history_per_job_max
assert 0 <= limits.grace_s_default <= limits.grace_s_max and 0 <= limits.max_catchup_default <= limits.max_catchup_max


# ------------------------------------------------------------------ queues, tenants, locks
# The bodies of PUT /v1/queues/{name}, PUT /v1/tenants/{name} and POST /v1/locks/{name}/...:
# each validated on the proposer and turned into its command's fields.

def _body(body, fields: set[str]) -> dict:
    if not isinstance(body, dict):
        raise InvalidSpec("the body must be a JSON object", field=None)
    for k in body:
        if k not in fields:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(fields))}", field=str(k))
    return body


def _int_only(v, field: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (an integral float is refused: these fields never took one)."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=field)
    return v


def validate_queue(name, body) -> dict:
    """``{"max_depth"?, "on_full"?}`` -> the put_queue command's ``{"max_depth", "on_full"}``.

    :raises InvalidSpec: naming the field."""
    check_name(name, "queue", limits.queue_name_chars_max)
    b = _body(body, {"max_depth", "on_full"})
    depth = _int_only(b.get("max_depth", limits.queue_depth_default), "max_depth", 1, limits.queue_depth_max)
    on_full = b.get("on_full", "reject")
    if on_full not in ("reject", "drop_oldest"):
        raise InvalidSpec("must be reject or drop_oldest", field="on_full")
    return {"max_depth": depth, "on_full": on_full}


def validate_tenant(name, body) -> dict:
    """``{"rate_per_s", "burst"?}`` -> the put_tenant command's ``{"rate_milli", "burst"}``: the
    rate in tokens per 1000 s, the burst by default the rate (at least 1).

    :raises InvalidSpec: naming the field."""
    check_name(name, "tenant", limits.tenant_name_chars_max)
    b = _body(body, {"rate_per_s", "burst"})
    if "rate_per_s" not in b:
        raise InvalidSpec("is required: runs per second this tenant may start", field="rate_per_s")
    rate = b["rate_per_s"]
    lo, hi = limits.tenant_rate_per_s_min, limits.tenant_rate_per_s_max
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not lo <= rate <= hi:
        raise InvalidSpec(f"must be a number between {lo:g} and {hi:g}", field="rate_per_s")
    burst = _int_only(b.get("burst", max(1, int(rate))), "burst", 1, limits.tenant_burst_max)
    return {"rate_milli": round(rate * 1000), "burst": burst}


def _lock_body(name, body, fields: set[str]) -> dict:
    check_name(name, "name", limits.lock_name_chars_max)
    return _body(body, fields)


def _lock_ttl_ms(b: dict, required: bool) -> int | None:
    if "ttl_s" not in b:
        if required:
            raise InvalidSpec("is required: seconds the lock is held without a renew", field="ttl_s")
        return None
    v = b["ttl_s"]
    lo, hi = limits.lease_ttl_ms_min / 1000, limits.lease_ttl_ms_max / 1000
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise InvalidSpec(f"must be a number of seconds between {lo:g} and {hi:g}", field="ttl_s")
    return int(v * 1000)


def _lock_token(b: dict) -> int:
    t = b.get("token")
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise InvalidSpec("is required: the fencing token acquire returned", field="token")
    return t


def validate_lock_acquire(name, body) -> dict:
    """``{"owner", "ttl_s"}`` -> the lock_acquire command's ``{"owner", "ttl"}`` (ttl in ms).

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"owner", "ttl_s"})
    owner = b.get("owner")
    n = limits.lock_owner_chars_max
    if not isinstance(owner, str) or not owner or len(owner) > n:
        raise InvalidSpec(f"is required: a string of 1-{n} characters naming the holder", field="owner")
    return {"owner": owner, "ttl": _lock_ttl_ms(b, True)}


def validate_lock_renew(name, body) -> dict:
    """``{"token", "ttl_s"?}`` -> the lock_renew command's ``{"token", "ttl"}`` (ttl in ms, or
    None: the lock's own).

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"token", "ttl_s"})
    return {"token": _lock_token(b), "ttl": _lock_ttl_ms(b, False)}


def validate_lock_release(name, body) -> dict:
    """``{"token"}`` -> the lock_release command's ``{"token"}``.

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"token"})
    return {"token": _lock_token(b)}
