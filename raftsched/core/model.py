"""Job specs: validation and normalisation, and the policy enums.

``validate_job`` turns what a client sent into the normalised spec stored in the state, or raises
``InvalidSpec`` naming the field and why. It is pure and deterministic; it runs on the node that
receives the request (the proposer) only: apply checks a stored spec's shape alone
(jobs.check_stored_spec), never its content, so that no replica depends on its own library
versions (I4). Request bodies other than a job's are core/bodies.py's, worker labels and the
placement rule core/placement.py's.
"""
from __future__ import annotations

import enum
import json
import math
import re
import urllib.parse
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta, timezone
from typing import Any, TypeGuard

import msgpack

from . import limits, schedule
from .pipeline_model import validate_after
from .deadlines import KEYS as DEADLINE_KEYS, validate as validate_deadline
from .errors import InvalidSpec
from .notify_model import ROUTE_FIELDS, add_job_fields
from .placement import validate_worker_labels
from .records import LAYOUT_CHARS, LAYOUT_CHARS_SAID, Record


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
    #: a heartbeat job's slot, fired, waiting for its ping (core/deadlines.py)
    WAITING = "waiting"


#: The policy names, in declaration order (built once: iterating an Enum costs microseconds).
MISFIRE_POLICIES = tuple(p.value for p in MisfirePolicy)
#: Every state a run or recorded slot can be in, in declaration order.
RUN_STATES = tuple(s.value for s in RunState)

TERMINAL_STATES = frozenset({"succeeded", "failed", "dead", "skipped", "coalesced"})
#: States of a run that ran or will run (the others, skipped and coalesced, never ran); a
#: heartbeat job's slot ``waiting`` for its ping is one too.
REAL_STATES = frozenset({"queued", "waiting", "running", "succeeded", "failed", "dead"})
EXECUTOR_TYPES = ("shell", "http", "python")
#: What a job's executor may be: a worker's types, and ``heartbeat`` (runs nothing: something
#: outside reports each slot by POST /v1/jobs/{name}/ping; core/deadlines.py).
JOB_EXECUTOR_TYPES = EXECUTOR_TYPES + ("heartbeat",)

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: An HTTP header name (RFC 9110 token), and a value with no control character but tab: a CR or
#: LF in a value would start another header (header injection).
HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: Headers that frame an HTTP request: the http executor sets them, a job may not (a Host of its
#: choosing would reach another virtual host than the URL names; the others smuggle requests).
FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
#: A secret's name: an environment variable name (also sent as a header name to an http run).
SECRET_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What follows the ``@`` of a run id (``1780000000000``, ``...!manual-3``, ``...#bID``).
_RUN_REST_RE = re.compile(r"[!-~]+")
TARGET_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")

_TOP_FIELDS = {
    "schedule", "executor", "payload", "timeout_s", "misfire", "retry", "queue", "priority",
    "tenant", "history", "description", "overlap", "jitter_s", "secrets", "keep_output",
    "labels",
    "placement",
    "deadline",
    "notify", "pause_on_failure", "metrics",
    "after", "match", "max_wait_s",  # pipelines (core/pipelines.py)
}
#: The top-level fields of a job spec (what PUT /v1/jobs/{name} accepts).
SPEC_FIELDS = frozenset(_TOP_FIELDS)
#: The fields of a spec's ``schedule``.
SCHEDULE_FIELDS = frozenset({"cron", "timezone", "every_s", "at", "dst", "start_at"})

OVERLAP_POLICIES = ("allow", "forbid", "queue_one", "replace")


def is_name(v: object) -> TypeGuard[str]:
    """Whether ``v`` is a name by its characters (NAME_RE, matched whole: a final newline is no
    part of a name), whatever its length. Apply's check of a name a command carries: the rule
    has not changed since the first version, so every journal's names keep their decision."""
    return isinstance(v, str) and NAME_RE.fullmatch(v) is not None


def _json_type(v: object) -> str:
    """What JSON calls ``v``'s type, for a message: null, a boolean, a number, an object..."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def check_name(name: object, field: str = "name", max_chars: int = limits.job_name_chars_max) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidSpec("must be a non-empty string", field=field)
    if len(name) > max_chars:
        raise InvalidSpec(f"is longer than {max_chars} characters", field=field)
    if not NAME_RE.fullmatch(name):
        raise InvalidSpec(
            "may contain only ASCII letters and digits (a-z, A-Z, 0-9), '.', '_' and '-', and must start with a "
            "letter or digit",
            field=field,
        )
    return name


def slot_id(run_id: str) -> tuple[str, int] | None:
    """``(job, slot)`` of a scheduled slot's id, ``JOB@<ms>`` (ms as run ids are made: ASCII
    digits, no leading zero, at most 19 of them), else None (a run by hand, a backfill's, no id)."""
    name, _, rest = run_id.partition("@")
    if not (rest.isascii() and rest.isdigit()) or len(rest) > 19 or rest != str(int(rest)):
        return None
    return name, int(rest)


def check_run_id(run_id: object, field: str = "run") -> str:
    """A run id's shape: ``job@...``, the job part a valid job name, at most the longest id apply
    makes (``limits.run_id_chars_max``: ``job@slot_ms``, ``job@now!manual-N``, ``job@slot#b<backfill>``
    ...). Refused before anything is proposed.

    :raises InvalidSpec:"""
    if not isinstance(run_id, str) or "@" not in run_id or len(run_id) > limits.run_id_chars_max:
        raise InvalidSpec("must be a run id, JOB@...", field=field)
    job, _, rest = run_id.partition("@")
    check_name(job, field)
    if not _RUN_REST_RE.fullmatch(rest):
        raise InvalidSpec("must be a run id, JOB@...: printable ASCII without spaces after the @", field=field)
    return run_id


def _int(value: object, field: str, lo: int, hi: int) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=field)
    value = int(value)
    if not lo <= value <= hi:
        got = str(value) if abs(value) < 10 ** 24 else f"a number of {len(str(abs(value)))} digits"
        raise InvalidSpec(f"must be between {lo} and {hi}; got {got}", field=field)
    return value


def _num(value: object, field: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidSpec(f"must be a number between {lo} and {hi}", field=field)
    if not lo <= value <= hi:
        raise InvalidSpec(f"must be between {lo} and {hi}; got {value}", field=field)
    return value


def _obj(value: object, field: str, allowed: AbstractSet[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidSpec("must be an object", field=field)
    for k in value:
        if k not in allowed:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(allowed))}", field=f"{field}.{k}")
    return value


def validate_schedule(raw: object, now_ms: int | None = None) -> Record:
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
        if tz in HOST_ZONE_NAMES or tz.startswith(("posix/", "right/")):
            # Names of the host's zone files that are no IANA zone: "localtime" is each machine's
            # own /etc/localtime (a job's slots would move with the leader), "right/" zones count
            # leap seconds, "posixrules" and "Factory" are no place's time.
            raise InvalidSpec(f"{tz!r} is not an IANA zone name (it names a file of this host's zone "
                              "database); name the zone, such as Europe/Berlin", field="schedule.timezone")
        schedule.zone(tz)
        expr = sched["cron"]
        schedule.check_cron(expr, now_ms, tz)
        out: Record = {"cron": " ".join(expr.split()), "timezone": tz}
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


def _time_ms(v: object, field: str) -> int:
    """An ISO-8601 time with a zone, or integer milliseconds since the epoch, as milliseconds."""
    if isinstance(v, str):
        return schedule.parse_iso_ms(v, field)  # the same range as the integer form
    return _int(v, field, 0, limits.time_ms_max)


#: Zone files of a host's zone database that name no IANA zone (schedule.timezone refuses them).
HOST_ZONE_NAMES = frozenset({"localtime", "posixrules", "Factory"})


def validate_executor(raw: object) -> Record:
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object with a type", field="executor")
    t = raw.get("type")
    if t == "heartbeat":
        _obj(raw, "executor", {"type"})
        return {"type": "heartbeat"}
    if t not in EXECUTOR_TYPES:
        raise InvalidSpec(f"type must be one of {', '.join(JOB_EXECUTOR_TYPES)}", field="executor.type")
    if t == "shell":
        ex = _obj(raw, "executor", {"type", "argv", "env", "cwd"})
        argv = ex.get("argv")
        if not isinstance(argv, list) or not argv:
            raise InvalidSpec("must be a non-empty list of strings (use [\"sh\", \"-c\", \"...\"] for a shell line)", field="executor.argv")
        if len(argv) > limits.argv_items_max:
            raise InvalidSpec(f"has more than {limits.argv_items_max} items", field="executor.argv")
        for i, a in enumerate(argv):  # (an item is named, whatever is wrong with it)
            if not isinstance(a, str):
                raise InvalidSpec(f"must be a string, not {_json_type(a)} (argv is a list of strings)",
                                  field=f"executor.argv[{i}]")
            if "\x00" in a:  # execve(2) takes NUL-terminated strings
                raise InvalidSpec("holds a NUL character", field=f"executor.argv[{i}]")
        out: Record = {"type": "shell", "argv": list(argv)}
        if "env" in ex:
            env = ex["env"]
            if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
                raise InvalidSpec("must be an object of string values", field="executor.env")
            if len(env) > limits.executor_env_max:
                raise InvalidSpec(f"has more than {limits.executor_env_max} variables", field="executor.env")
            for k, v in env.items():
                # execve(2) takes NAME=VALUE strings ending in NUL: neither may hold a NUL, nor
                # the name an "=".
                if not k or "=" in k or "\x00" in k or len(k) > limits.secret_name_chars_max:
                    raise InvalidSpec(f"a variable name is 1-{limits.secret_name_chars_max} characters, "
                                      "without '=' or NUL", field="executor.env")
                if not isinstance(v, str):
                    raise InvalidSpec(f"must be a string, not {_json_type(v)}", field=f"executor.env.{k}")
                if "\x00" in v:
                    raise InvalidSpec("holds a NUL character (the value is not shown)", field=f"executor.env.{k}")
            out["env"] = dict(env)
        if "cwd" in ex:
            if not isinstance(ex["cwd"], str) or not ex["cwd"]:
                raise InvalidSpec("must be a non-empty string", field="executor.cwd")
            if "\x00" in ex["cwd"]:
                raise InvalidSpec("holds a NUL character", field="executor.cwd")
            out["cwd"] = ex["cwd"]
        return out
    if t == "http":
        ex = _obj(raw, "executor", {"type", "url", "headers", "result"})
        url = ex.get("url")
        if not isinstance(url, str) or not re.match(r"https?://[^\s/]+", url) or re.search(r"[\s\x00-\x1f\x7f]", url):
            raise InvalidSpec("must be an http:// or https:// URL (no spaces or control characters)", field="executor.url")
        if not LAYOUT_CHARS.isdisjoint(url):
            raise InvalidSpec(f"must be an http:// or https:// URL without {LAYOUT_CHARS_SAID}", field="executor.url")
        try:
            parts = urllib.parse.urlsplit(url)
            netloc = parts.netloc
        except ValueError:  # "http://]x": an unbalanced IPv6 bracket, and other hosts urllib refuses
            raise InvalidSpec("must be an http:// or https:// URL with a valid host", field="executor.url") from None
        try:
            port = parts.port  # (raises for a port that is not a number, or past 65535)
        except ValueError:
            port = 0
        if port == 0:
            raise InvalidSpec("has a port that is not 1-65535", field="executor.url")
        if "@" in netloc:
            # Every read would show it: credentials go in headers (shown redacted) or secrets.
            raise InvalidSpec("must not hold user:password@; send credentials in executor.headers "
                              "(Authorization) or secrets, which reads show redacted", field="executor.url")
        out = {"type": "http", "url": url}
        if "headers" in ex:
            h = ex["headers"]
            if not isinstance(h, dict) or not all(isinstance(k, str) for k in h):
                raise InvalidSpec("must be an object of string values", field="executor.headers")
            if len(h) > limits.executor_headers_max:
                raise InvalidSpec(f"has more than {limits.executor_headers_max} headers", field="executor.headers")
            for k, v in h.items():
                if not HEADER_NAME_RE.fullmatch(k) or len(k) > limits.secret_name_chars_max:
                    raise InvalidSpec(f"a header name is 1-{limits.secret_name_chars_max} token characters "
                                      "(letters, digits, !#$%&'*+.^_`|~-)", field="executor.headers")
                if not isinstance(v, str):
                    raise InvalidSpec(f"must be a string, not {_json_type(v)}", field=f"executor.headers.{k}")
                if _CONTROL_RE.search(v):
                    raise InvalidSpec("holds a control character such as CR or LF, which would end the "
                                      "header (the value is not shown)", field=f"executor.headers.{k}")
                if k.lower() in FRAMING_HEADERS:
                    raise InvalidSpec(f"{k} frames the request: the executor sets it, a job cannot",
                                      field=f"executor.headers.{k}")
            out["headers"] = dict(h)
        if "result" in ex:  # pipelines: the JSON response body is the run's result, for its children
            if not isinstance(ex["result"], bool):
                raise InvalidSpec("must be true or false", field="executor.result")
            if ex["result"]:
                out["result"] = True
        return out
    ex = _obj(raw, "executor", {"type", "target"})
    target = ex.get("target")
    if not isinstance(target, str) or not TARGET_RE.fullmatch(target):
        raise InvalidSpec("must be 'module:function', e.g. 'myapp.jobs:nightly'", field="executor.target")
    return {"type": "python", "target": target}


def validate_misfire(raw: object) -> Record:
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


#: The misfire block a triggered job (pipelines) that gives none has: it has no slot of its own.
_TRIGGERED_MISFIRE = {"policy": "skip"}

#: The retry block of a spec that has none (checked against validate_retry at import).
RETRY_DEFAULT = {"max_attempts": 1, "backoff_s": 1, "backoff_multiplier": 2, "backoff_max_s": 300, "jitter": 0.1}


def validate_retry(raw: object) -> Record:
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


def validate_overlap(raw: object) -> Record:
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

    def off(ms: int) -> timedelta | None:
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


def _add_jitter(name: str, sched: Record, jitter_s: object) -> None:
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


def _depth(v: object) -> int:
    """Nesting levels of arrays and objects in ``v`` (0 for a scalar), without recursion."""
    deepest, todo = 0, [(v, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, dict):
            x = list(x.values())
        elif not isinstance(x, list):
            continue
        deepest = max(deepest, d)
        if d > limits.payload_depth_max:
            break
        todo.extend((y, d + 1) for y in x)
    return deepest


def validate_secrets(raw: object) -> dict[str, str]:
    """A job's ``secrets``: names (environment variable names) to values, given to its runs as
    environment variables (shell), headers (http) or ``ctx.secrets`` (python), and shown
    redacted by every read. Error messages never hold a value.

    :raises InvalidSpec: naming the field."""
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object of names to string values", field="secrets")
    if len(raw) > limits.secrets_max:
        raise InvalidSpec(f"has more than {limits.secrets_max} secrets", field="secrets")
    out = {}
    for k, v in raw.items():
        if not SECRET_NAME_RE.fullmatch(k) or len(k) > limits.secret_name_chars_max:
            raise InvalidSpec(f"a secret's name is 1-{limits.secret_name_chars_max} letters, digits and '_', "
                              "not starting with a digit", field="secrets")
        if k.upper().startswith("RAFTSCHED_"):
            raise InvalidSpec("RAFTSCHED_ names are the run's identity", field=f"secrets.{k}")
        if not isinstance(v, str) or not 1 <= len(v) <= limits.secret_value_chars_max:
            raise InvalidSpec(f"must be a string of 1-{limits.secret_value_chars_max} characters", field=f"secrets.{k}")
        if _CONTROL_RE.search(v):
            raise InvalidSpec("holds a control character such as NUL, CR or LF (the value is not shown)",
                              field=f"secrets.{k}")
        out[k] = v
    return out


LABEL_KEY_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?")


def check_label_key(key: object, field: str) -> str:
    """A label key (``raftsched.app``, ``team``). :raises InvalidSpec: naming ``field``."""
    n = limits.label_key_chars_max
    if not isinstance(key, str) or not key or len(key) > n or not LABEL_KEY_RE.fullmatch(key):
        raise InvalidSpec(f"a label key is 1-{n} letters, digits, '.', '_', '/' and '-', starting and "
                          "ending with a letter or digit", field=field)
    return key


def check_label_value(value: object, field: str) -> str:
    """A label value: printable text of at most label_value_chars_max characters, '' included.
    :raises InvalidSpec: naming ``field``."""
    n = limits.label_value_chars_max
    if not isinstance(value, str) or len(value) > n or not value.isprintable():
        raise InvalidSpec(f"a label value is printable text of at most {n} characters", field=field)
    return value


def validate_labels(raw: object) -> dict[str, str]:
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


#: The fields of each object of a job body whose null is the field left out, by the key that
#: holds the object (the top level's is ""; a list's objects, ``after`` and ``notify``, by the
#: list's key). A null anywhere else is a value: the payload's, a map's (labels, executor env
#: and headers, secrets: refused naming its key), or an unknown field's (refused as unknown).
_NULLABLE: dict[str, frozenset[str]] = {
    "": frozenset(_TOP_FIELDS - {"payload"}),
    "schedule": SCHEDULE_FIELDS,
    "dst": frozenset({"spring_forward", "fall_back"}),
    "executor": frozenset({"type", "argv", "env", "cwd", "url", "headers", "result", "target"}),
    "misfire": frozenset({"policy", "grace_s", "max_catchup"}),
    "retry": frozenset({"max_attempts", "backoff_s", "backoff_multiplier", "backoff_max_s", "jitter"}),
    "overlap": frozenset({"policy", "max_concurrent"}),
    "placement": frozenset({"labels"}),
    "deadline": frozenset(DEADLINE_KEYS),
    "pause_on_failure": frozenset({"after_consecutive"}),
    "after": frozenset({"job", "on"}),
    "notify": ROUTE_FIELDS,
}
#: The objects whose fields are read as _NULLABLE says, by the key that holds them, and the key
#: of the object that holds that key ("dst" is the schedule's; "labels" is no such object).
_NULLABLE_IN = {"schedule": "", "executor": "", "misfire": "", "retry": "", "overlap": "", "placement": "",
                "deadline": "", "pause_on_failure": "", "after": "", "notify": "", "dst": "schedule"}


def _has_nulls(v: Any, at: str) -> bool:
    """Whether ``v`` (the object held by key ``at``, or a list of them) has a null _NULLABLE
    leaves out."""
    if isinstance(v, list):
        return any(type(x) is dict and _has_nulls(x, at) for x in v)
    fields = _NULLABLE[at]
    for k, x in v.items():
        if x is None:
            if k in fields:
                return True
        elif (type(x) is dict or type(x) is list) and _NULLABLE_IN.get(k) == at and _has_nulls(x, k):
            return True
    return False


def _nulls_absent(v: Any, at: str) -> Any:
    """A job body with every field given as null left out: an optional field's null is its
    default, at every level (a required one's is "is required"), as clients that write every
    field of a model send them. Lists keep their null items (refused as items); the payload and
    the maps keep their nulls, and an unknown field given null is refused as unknown. Before
    2026-12-06 (a later sitting) only retry, overlap and pause_on_failure took null, the other
    fields refused it. A body without such nulls is returned as it is (read once, not copied:
    bulk registrations validate many)."""
    if isinstance(v, list):
        return [_nulls_absent(x, at) if type(x) is dict else x for x in v]
    fields = _NULLABLE[at]
    return {k: _nulls_absent(x, k) if (type(x) is dict or type(x) is list) and _NULLABLE_IN.get(k) == at else x
            for k, x in v.items() if x is not None or k not in fields}


def validate_job(name: str, raw: object, now_ms: int | None = None) -> Record:
    """Validate a job spec and return its normalised form.

    :param now_ms: the proposer's now: a cron expression that never matches after it is
        refused (None: not checked, for tools that validate specs outside a node)

    :raises InvalidSpec: naming the first offending field and why.
    """
    check_name(name)
    if isinstance(raw, dict) and _has_nulls(raw, ""):
        raw = _nulls_absent(raw, "")
    if not isinstance(raw, dict):
        raise InvalidSpec("the job spec must be a JSON object", field=None)
    for k in raw:
        if k not in _TOP_FIELDS:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(_TOP_FIELDS))}", field=str(k))
    if "schedule" not in raw and "after" not in raw:
        raise InvalidSpec("is required: {\"cron\": ...}, {\"every_s\": ...} or {\"at\": ...} "
                          "(or \"after\": the jobs it runs after)", field="schedule")
    if "executor" not in raw:
        raise InvalidSpec("is required: {\"type\": \"shell\"|\"http\"|\"python\", ...}", field="executor")
    # An absent field takes its default as is: the defaults are valid constants (checked at
    # import), not re-validated for every job of a bulk registration.
    spec = {
        "schedule": validate_schedule(raw["schedule"], now_ms) if "schedule" in raw else None,
        "executor": validate_executor(raw["executor"]),
        "payload": raw.get("payload", {}),
        "timeout_s": (_int(raw["timeout_s"], "timeout_s", 1, limits.timeout_s_max)
                      if "timeout_s" in raw else limits.timeout_s_default),
        # A triggered job (after, no schedule) has no slots of its own to miss: skip, unless given.
        "misfire": validate_misfire(raw.get("misfire", None if "schedule" in raw else _TRIGGERED_MISFIRE)),
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
    if spec["schedule"] is None:  # a triggered job: its parents' outcomes make its runs
        del spec["schedule"]
        if "jitter_s" in raw:
            raise InvalidSpec("a triggered job (after, no schedule) has no slots of its own to spread",
                              field="jitter_s")
    if "after" in raw or "match" in raw or "max_wait_s" in raw:
        spec.update(validate_after(raw, name, "schedule" in spec, check_name))
    if "jitter_s" in raw:
        _add_jitter(name, spec["schedule"], raw["jitter_s"])
    if "secrets" in raw:
        spec["secrets"] = validate_secrets(raw["secrets"])
        for k in spec["secrets"]:  # an http run gets them as headers
            if spec["executor"]["type"] == "http" and k.lower() in FRAMING_HEADERS:
                raise InvalidSpec(f"{k} frames the request: an http job's secrets are sent as headers, and "
                                  "the executor sets this one", field=f"secrets.{k}")
    if "keep_output" in raw:
        if not isinstance(raw["keep_output"], bool):
            raise InvalidSpec("must be true or false", field="keep_output")
        if raw["keep_output"] is False:  # true is the default, not stored
            spec["keep_output"] = False
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
    if "deadline" in raw:
        # A pipeline child's per-slot deadlines are carried by the fire of the scheduled job whose
        # slot it is (core/deadlines.py child_items), judged like any job's.
        spec["deadline"] = validate_deadline(raw["deadline"])
    if spec["executor"]["type"] == "heartbeat":
        if spec["overlap"]["policy"] != "allow" or "max_concurrent" in spec["overlap"]:
            raise InvalidSpec("a heartbeat job's overlap must be allow without max_concurrent (its runs are "
                              "only what pings report)", field="overlap")
        if "placement" in spec:
            raise InvalidSpec("a heartbeat job runs on no worker: leave placement out", field="placement")
        if "after" in spec:
            raise InvalidSpec("a heartbeat job's runs are what pings report: it cannot run after other jobs",
                              field="after")
        if "late_start" in spec.get("deadline", {}):
            raise InvalidSpec("a heartbeat job's slots wait for a ping, not a worker: nothing starts late or is "
                              "withdrawn (leave late_start out)", field="deadline.late_start")
    add_job_fields(raw, spec)  # notify, pause_on_failure, metrics (core/notify_model.py)
    payload = spec["payload"]
    if "payload" in raw:  # the default, {}, is valid
        if _depth(payload) > limits.payload_depth_max:
            raise InvalidSpec(f"is nested more than {limits.payload_depth_max} levels deep", field="payload")
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
def validate_placement(raw: object) -> Record:
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


# The defaults validate_job takes as they are, without validating them per job.
assert validate_retry({}) == RETRY_DEFAULT
assert validate_overlap({}) == {"policy": "allow"}
assert check_name("default", "queue", limits.queue_name_chars_max) == "default"
assert check_name("default", "tenant", limits.tenant_name_chars_max) == "default"
assert 1 <= limits.timeout_s_default <= limits.timeout_s_max and 0 <= limits.priority_default <= limits.priority_max
assert 1 <= limits.history_per_job_default <= limits.history_per_job_max
assert 0 <= limits.grace_s_default <= limits.grace_s_max and 0 <= limits.max_catchup_default <= limits.max_catchup_max
