"""The OpenAPI 3.1 document of the API (``GET /openapi.json``, ``GET /v1/openapi.json``), made
from the route table and nothing else beside it: every row of ``ROUTES`` (node/api.py) is one
operation, with its parameters (``Route.params``; path parameters from the path), its request
body (``Route.body``, a schema of ``BODIES`` below, built from the validators' bounds in
core/limits.py and their field sets in core/model.py, core/bodies.py, core/backfill_model.py,
node/fleet.py and node/auth.py), its answers (``Route.ok``, ``also_ok``, ``response``) and its
errors (the ones every route may answer, ``Route.errors``), each ``{"error": {"code",
"message", "field"}}`` with the codes its status carries (core/errors.py). The security
scheme is the bearer token; each operation names the scope it needs and the roles that have it
(node/auth.py ``ROLE_SCOPES``).

tests/test_openapi.py checks the document against the OpenAPI 3.1 specification, and that its
operations and the app's routes are the same both ways; scripts/fuzz_api.py runs schemathesis
against a real node with it.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ..core import deadlines, errors, limits
from ..core.backfill_model import DLQ_BULK_FILTERS
from ..core.backfill_plan import MODES, ORDERS, OVERLAPS
from ..core.bodies import POLICY_FIELDS
from ..core.notify_model import CLUSTER_KINDS, JOB_KINDS, SINK_RETRY_FIELDS, SINK_TYPES
from ..core.pipeline_model import GRAPH_KINDS, MATCH_VALUES, ON_VALUES
from ..core.model import (EXECUTOR_TYPES, MISFIRE_POLICIES, OVERLAP_POLICIES, RUN_STATES, SCHEDULE_FIELDS,
                          SPEC_FIELDS)
from ..core.tokens import ROLES
from ..worker import limits as worker_limits
from . import limits as node_limits
from .auth import ROLE_SCOPES
from .dashboard import FILES as UI_FILES
from .routes import OPEN, Route

Schema = dict[str, Any]

#: The statuses every route may answer with an error, beyond its row's ``errors`` (node/routes.py).
COMMON_ERRORS = (400, 401, 403, 429, 503, 504)
#: What an open route (no token) may answer beyond its row's.
OPEN_ERRORS = (400, 503)
#: Error codes the API's middleware answers by itself (node/api.py errors_middleware), beside the
#: typed errors' (core/errors.py).
_MIDDLEWARE_CODES = {400: ("http_error",), 404: ("not_found",), 405: ("method_not_allowed",),
                     413: ("too_large",)}


def error_codes(status: int) -> list[str]:
    """The ``error.code`` values an answer of ``status`` may carry."""
    codes = {k.code for k in errors._BY_CODE.values() if k.http_status == status}
    codes.update(_MIDDLEWARE_CODES.get(status, ()))
    return sorted(codes)


# ------------------------------------------------------------------ small schema builders
def _str(lo: int = 0, hi: int | None = None, pattern: str | None = None, **kw: Any) -> Schema:
    s: Schema = {"type": "string"}
    if lo:
        s["minLength"] = lo
    if hi is not None:
        s["maxLength"] = hi
    if pattern is not None:
        s["pattern"] = pattern
    s.update(kw)
    return s


def _int(lo: int, hi: int, **kw: Any) -> Schema:
    return {"type": "integer", "minimum": lo, "maximum": hi, **kw}


def _num(lo: float, hi: float, **kw: Any) -> Schema:
    return {"type": "number", "minimum": lo, "maximum": hi, **kw}


def _obj(props: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True, **kw: Any) -> Schema:
    s: Schema = {"type": "object", "properties": props}
    if required:
        s["required"] = list(required)
    if closed:
        s["additionalProperties"] = False
    s.update(kw)
    return s


def _nullable(s: Schema) -> Schema:
    return {"anyOf": [s, {"type": "null"}]}


#: A name (core/model.py NAME_RE) of at most ``n`` characters.
def _name(n: int) -> Schema:
    return _str(1, n, r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


#: An ISO-8601 time with its zone (core/schedule.py parse_iso_ms).
TIME = _str(1, 64, description="ISO-8601 with a zone, e.g. 2026-11-22T02:00:00Z")
#: A time in ms since the epoch, or ISO-8601.
TIME_OR_MS = {"anyOf": [TIME, _int(0, limits.time_ms_max)]}
_BOOL: Schema = {"type": "boolean"}
_JSON: Schema = {"description": "any JSON value"}
_LABELS = {"type": "object", "maxProperties": limits.job_labels_max,
           "propertyNames": _str(1, limits.label_key_chars_max,
                                 r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$"),
           "additionalProperties": _str(0, limits.label_value_chars_max)}
_WORKER_LABELS = {"type": "object", "maxProperties": limits.worker_labels_max,
                  "additionalProperties": _str(0, limits.worker_label_chars_max)}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


# ------------------------------------------------------------------ request bodies
#: A job's or a tenant's notify routes (core/notify_model.py validate_routes).
_NOTIFY = {"type": "array", "maxItems": limits.notify_routes_max, "items": _obj({
    "sink": _name(limits.queue_name_chars_max),
    "on": {"type": "array", "items": {"enum": list(JOB_KINDS)}, "minItems": 1},
    "after_consecutive": _int(1, limits.consecutive_max),
    "repeat_every_s": _int(0, limits.repeat_every_s_max),
    "backfills": _BOOL}, ("sink",)),
    "description": "which of the job's events go to which sink, and the noise control (docs/notifications.md)"}


def _sink() -> Schema:
    out: Schema
    secrets = {"type": "object", "additionalProperties": _str(1, 4096),
               "description": "by type: webhook signing_key; slack url; email username, password; "
                              "pagerduty routing_key (sealed at rest, redacted on read)"}
    out = _obj({
        "type": {"enum": list(SINK_TYPES)},
        "url": _str(1, 2048, pattern=r"^https?://", description="webhook and pagerduty (default: PagerDuty's)"),
        "tenant": _name(limits.tenant_name_chars_max),
        "subscribe": {"type": "array", "items": {"enum": list(CLUSTER_KINDS)}},
        "retry": _obj({"max_attempts": _int(1, limits.sink_attempts_max), "backoff_s": _int(0, 3600),
                       "backoff_max_s": _int(0, 86_400),
                       "outage_s": _int(0, limits.sink_outage_s_max, default=limits.sink_outage_s_default,
                                        description="how long past its attempts an event is retried while the "
                                                    "sink cannot be reached (docs/notifications.md, Delivery)")}),
        "secrets": secrets,
        "smtp": _obj({"host": _str(1, 253), "port": _int(1, 65535), "starttls": _BOOL, "from": _str(3, 254),
                      "to": {"type": "array", "items": _str(3, 254), "minItems": 1,
                             "maxItems": limits.sink_email_to_max}}, ("host", "from", "to")),
        "link": _str(1, 2048, pattern=r"^https?://"),
    }, ("type",), description="a notification sink (docs/notifications.md, Sinks)")
    assert set(out["properties"]["retry"]["properties"]) == SINK_RETRY_FIELDS
    return out


def _job_spec() -> Schema:
    dst = _obj({"spring_forward": {"enum": ["skip", "run_after_gap"]}, "fall_back": {"enum": ["once", "twice"]}})
    sched = {"oneOf": [
        _obj({"cron": _str(1, limits.cron_chars_max, description="5 fields, or 6 with seconds first"),
              "timezone": _str(1, 64, description="an IANA zone name, e.g. Europe/Berlin (default UTC)"),
              "dst": dst}, ("cron",)),
        _obj({"every_s": _int(limits.every_s_min, limits.every_s_max), "start_at": TIME_OR_MS}, ("every_s",)),
        _obj({"at": TIME_OR_MS}, ("at",)),
    ], "description": "exactly one of cron, every_s or at (docs/api.md, The job spec)"}
    assert set().union(*(v["properties"] for v in sched["oneOf"])) == SCHEDULE_FIELDS
    executor = {"oneOf": [
        _obj({"type": {"const": "shell"},
              "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                       "maxItems": limits.argv_items_max},
              "env": dict(_STR_MAP, maxProperties=limits.executor_env_max), "cwd": _str(1)}, ("type", "argv")),
        _obj({"type": {"const": "http"}, "url": _str(8, pattern=r"^https?://[^\s/]+"),
              "headers": dict(_STR_MAP, maxProperties=limits.executor_headers_max),
              "result": {"type": "boolean", "description": "the JSON response body is the run's result, "
                         "handed to its children (docs/pipelines.md)"}}, ("type", "url")),
        _obj({"type": {"const": "python"},
              "target": _str(3, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")}, ("type", "target")),
        _obj({"type": {"const": "heartbeat", "description": "runs nothing: POST /v1/jobs/{name}/ping reports "
                       "each slot (docs/notifications.md, Deadlines)"}}, ("type",)),
    ]}
    props = {
        "schedule": sched,
        "executor": executor,
        "misfire": _obj({"policy": {"enum": list(MISFIRE_POLICIES)},
                         "grace_s": _int(0, limits.grace_s_max, default=limits.grace_s_default),
                         "max_catchup": _int(0, limits.max_catchup_max, default=limits.max_catchup_default)},
                        ("policy",)),
        "payload": _JSON,
        "timeout_s": _int(1, limits.timeout_s_max, default=limits.timeout_s_default),
        "retry": _obj({"max_attempts": _int(1, limits.retry_attempts_max),
                       "backoff_s": _num(0, limits.retry_backoff_s_max),
                       "backoff_multiplier": _num(1, limits.retry_backoff_multiplier_max),
                       "backoff_max_s": _num(0, limits.retry_backoff_s_max), "jitter": _num(0, 1)}),
        "queue": _name(limits.queue_name_chars_max),
        "priority": _int(0, limits.priority_max, default=limits.priority_default),
        "tenant": _name(limits.tenant_name_chars_max),
        "history": _int(1, limits.history_per_job_max, default=limits.history_per_job_default),
        "description": _str(0, limits.description_chars_max),
        "overlap": _obj({"policy": {"enum": list(OVERLAP_POLICIES)},
                         "max_concurrent": _int(1, limits.overlap_concurrent_max)}),
        "jitter_s": _int(0, limits.jitter_s_max),
        "secrets": {"type": "object", "maxProperties": limits.secrets_max,
                    "propertyNames": _str(1, limits.secret_name_chars_max, r"^[A-Za-z_][A-Za-z0-9_]*$"),
                    "additionalProperties": _str(1, limits.secret_value_chars_max)},
        "keep_output": _BOOL,
        "labels": _LABELS,
        "placement": _obj({"labels": dict(_WORKER_LABELS, minProperties=1)}, ("labels",)),
        "notify": _NOTIFY,
        "pause_on_failure": _obj({"after_consecutive": _int(1, limits.consecutive_max)}, ("after_consecutive",)),
        "metrics": _BOOL,
        "deadline": _obj({"start_within_s": _int(1, limits.deadline_s_max),
                          "succeed_within_s": _int(1, limits.deadline_s_max),
                          "succeed_by": _str(5, 5, r"^([01][0-9]|2[0-3]):[0-5][0-9]$",
                                             description="a local time HH:MM in the job's time zone"),
                          "max_since_success_s": _int(1, limits.deadline_s_max),
                          "late_start": {"enum": list(deadlines.LATE_START)}}, minProperties=1,
                         description="when each slot must be done (docs/notifications.md, Deadlines); "
                                     "late_start skip: a run not started by start_within_s is withdrawn "
                                     "(recorded skipped, reason late_start), where run (the default) lets it start late"),
        "after": {"type": "array", "minItems": 1, "maxItems": limits.after_parents_max,
                  "items": {"anyOf": [_name(limits.job_name_chars_max),
                                      _obj({"job": _name(limits.job_name_chars_max), "on": {"enum": list(ON_VALUES)}},
                                           ("job",))]},
                  "description": "the jobs it runs after (docs/pipelines.md): names, or {job, on}; "
                                 "without a schedule the job is triggered by them"},
        "match": {"enum": list(MATCH_VALUES), "default": "same_slot",
                  "description": "a gated job's rule (schedule and after)"},
        "max_wait_s": _int(1, limits.max_wait_s_max, default=limits.max_wait_s_default,
                           description="how long a slot waits for its parents (after only)"),
    }
    assert set(props) == SPEC_FIELDS, set(props) ^ SPEC_FIELDS
    return _obj(props, ("executor",),
                # a scheduled job names its misfire policy; a triggered one (after, no schedule) need not
                anyOf=[{"required": ["schedule", "misfire"]},
                       {"required": ["after"], "properties": {"schedule": {"type": "null"}}}],
                description="a job spec (docs/api.md, The job spec); core/model.py validate_job. schedule and "
                            "misfire are required, unless after is given (a triggered job has neither)",
                examples=[{"schedule": {"every_s": 60}, "executor": {"type": "http", "url": "https://example.com/hook"},
                           "misfire": {"policy": "skip"}, "tenant": "fuzz"},
                          {"schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
                           "executor": {"type": "shell", "argv": ["echo", "hello"]},
                           "misfire": {"policy": "fire_once", "grace_s": 5}}])


def _nulls_absent(s: Schema) -> Schema:
    """A job spec's schema as validate_job reads a body (core/model.py _nulls_absent): every
    optional field of an object may be null (its default), and a branch of a oneOf takes the
    other branches' fields as null; maps' values (labels, env, headers, secrets) may not."""
    if s.get("type") == "object" and "properties" in s:
        req = set(s.get("required", ()))
        props = {}
        for k, v in s["properties"].items():
            v = _nulls_absent(v)
            props[k] = v if k in req else _nullable(v)
        out = {**s, "properties": props}
        if "anyOf" in s:  # required in some combination (schedule and misfire, or after): not null there
            out["anyOf"] = [{**c, "properties": {**c.get("properties", {}),
                                                 **{k: {"not": {"type": "null"}} for k in c["required"]}}}
                            for c in s["anyOf"]]
        if "minProperties" in s:  # at least that many given, nulls not counted (one: the only case)
            assert s["minProperties"] == 1 and "anyOf" not in s
            del out["minProperties"]
            out["anyOf"] = [{"required": [k], "properties": {k: {"not": {"type": "null"}}}} for k in props]
        return out
    for key in ("oneOf", "anyOf"):
        if key in s:
            branches = [_nulls_absent(b) for b in s[key]]
            names = set().union(*(b.get("properties", {}) for b in branches))
            for b in branches:
                if b.get("additionalProperties") is False:
                    b["properties"].update({n: {"type": "null"} for n in sorted(names - set(b["properties"]))})
            return {**s, key: branches}
    if s.get("type") == "array" and isinstance(s.get("items"), dict):
        return {**s, "items": _nulls_absent(s["items"])}
    return s


def _bodies() -> dict[str, Schema]:
    spec = {"$ref": "#/components/schemas/job_spec"}
    lease_pair = {"type": "array", "prefixItems": [_str(1), _int(0, 2**63 - 1)], "minItems": 2, "maxItems": 2}
    leases = {"type": "array", "items": lease_pair, "maxItems": limits.heartbeat_leases_max}
    ttl = _int(limits.lease_ttl_ms_min, limits.lease_ttl_ms_max)
    tenants = {"type": "array", "items": _name(limits.tenant_name_chars_max), "minItems": 1,
               "maxItems": limits.token_tenants_max}
    outcomes = {"type": "array", "minItems": 1, "maxItems": limits.complete_batch_max,
                "items": _obj({"run": _str(1), "token": _int(0, 2**63 - 1), "success": _BOOL,
                               "error": _nullable({"type": "string"}), "output": _nullable({"type": "string"}),
                               "result": {"description": "JSON the run hands its children (pipelines)"}},
                              ("run", "token", "success"))}
    return {
        "job_spec": _nulls_absent(_job_spec()),
        "jobs_batch": _obj({"jobs": {"type": "object", "minProperties": 1, "maxProperties": limits.batch_jobs_max,
                                     "propertyNames": _name(limits.job_name_chars_max),
                                     "additionalProperties": spec},
                            "create_only": _BOOL, "paused": _BOOL, "dry_run": _BOOL}, ("jobs",),
                           description="paused: every job is paused in the same command (created paused: it fires "
                                       "nothing until resumed); dry_run: change nothing, answer what each job would "
                                       "become (create, replace with its changes, unchanged, conflict)"),
        "pause": _obj({"note": _nullable(_str(1, limits.pause_note_chars_max))},
                      description="note: why, in your words; GET /v1/jobs/{name} shows it with since and by"),
        "cancel": _obj({"reason": _nullable(_str(1, limits.cancel_reason_chars_max))},
                       description="reason: why, in your words; the run's error shows it (the node's audit log "
                                   "names the token that asked)"),
        "cancel_job": _obj({"reason": _nullable(_str(1, limits.cancel_reason_chars_max)),
                            "running": {"type": "boolean", "default": False},
                            "after": _nullable(_str(1, limits.run_id_chars_max))},
                           description="reason: why, in your words (each run's error shows it); running: the "
                                       "running runs too (ended failed, their workers stop them), not only the "
                                       "queued; after: the next of the answer before (where to go on)"),
        "trigger": _obj({"payload": _JSON, "slot": _nullable(TIME),
                         "propagate": {"type": "boolean", "description": "its outcome reaches the job's children "
                                       "(pipelines)"},
                         "rerun": {"type": "boolean", "description": "with slot: run the slot again though its run "
                                   "ended (not a dead one: requeue that)"},
                         "downstream": {"type": "boolean", "description": "with rerun: the jobs after it that ran "
                                        "for the slot run again after it, down the graph (propagate implied)"}}),
        "explain": {"oneOf": [_obj({"down_from": TIME, "down_to": TIME}, ("down_from", "down_to")),
                              _obj({"slot": TIME}, ("slot",)), _obj({})],
                    "description": "an outage window, or one slot (why it met or missed its deadline), or, "
                                   "for a triggered job only, nothing (what it runs after, its waiting slots)"},
        "ping": _obj({"status": {"enum": ["start", "success", "fail"], "default": "success"},
                      "slot": _nullable(TIME_OR_MS)}),
        "backfill": _obj({
            "from": TIME, "to": TIME, "reprocess": {"enum": list(MODES)}, "order": {"enum": list(ORDERS)},
            "max_concurrent": _nullable(_int(1, limits.backfill_concurrent_max)),
            "rate_per_s": _nullable(_num(limits.backfill_rate_per_s_min, limits.backfill_rate_per_s_max)),
            "max_slots": _nullable(_int(1, limits.backfill_slots_max)), "payload": _JSON,
            "overlap": {"anyOf": [{"enum": list(OVERLAPS) + [None]},
                                  _obj({"policy": {"enum": list(OVERLAPS)}}, ("policy",))]},
            "dry_run": _BOOL, "id": _nullable(_name(limits.backfill_id_chars_max)),
            "cascade": {"enum": ["none", "children"], "default": "none",
                        "description": "children: each backfilled run's outcome reaches the job's children"},
            "upstream": {"enum": ["wait", "ignore"], "default": "wait",
                         "description": "ignore: a job with after runs these slots whatever its parents did "
                                        "(without it, such a backfill is refused)"}},
            ("from", "to")),
        "dlq_bulk": _obj({
            "queue": _nullable(_name(limits.queue_name_chars_max)),
            "job": _nullable(_name(limits.job_name_chars_max)),
            "error": _nullable(_str(1, limits.dlq_error_filter_chars_max)),
            "dead_from": _nullable(TIME), "dead_to": _nullable(TIME),
            "max_count": _nullable(_int(1, limits.dlq_bulk_count_max)),
            "max_concurrent": _nullable(_int(1, limits.backfill_concurrent_max)),
            "rate_per_s": _nullable(_num(limits.backfill_rate_per_s_min, limits.backfill_rate_per_s_max)),
            "dry_run": _BOOL, "id": _nullable(_name(limits.backfill_id_chars_max)),
            "all": {"type": "boolean", "default": False,
                    "description": "true: every dead run is meant; required when no filter is given"}},
            description="at least one filter (queue, job, error, dead_from, dead_to), or all: true",
            anyOf=[{"required": [f], "properties": {f: {"not": {"type": "null"}}}} for f in DLQ_BULK_FILTERS]
            + [{"required": ["all"], "properties": {"all": {"const": True}}}]),
        "queue": _obj({"max_depth": _int(1, limits.queue_depth_max), "on_full": {"enum": ["reject", "drop_oldest"]},
                       "tenants": _nullable(tenants)}),
        "tenant": _obj({"rate_per_s": _num(limits.tenant_rate_per_s_min, limits.tenant_rate_per_s_max),
                        "burst": _int(1, limits.tenant_burst_max),
                        "executors": {"type": "array", "items": {"enum": list(EXECUTOR_TYPES)}, "uniqueItems": True},
                        "placement": _obj({"labels": _WORKER_LABELS}, ("labels",)),
                        "network": _obj({"allow": {"type": "array", "items": _str(1),
                                                   "maxItems": limits.tenant_network_allow_max}}),
                        "notify": _NOTIFY},
                       description="rate_per_s, or a policy (executors, placement, network), or default routes "
                                   "(notify), or any of them together",
                       anyOf=[{"required": ["rate_per_s"]}, {"required": ["notify"]}]
                       + [{"required": [f]} for f in sorted(POLICY_FIELDS)]),
        "lock_acquire": _obj({"owner": _str(1, limits.lock_owner_chars_max),
                              "ttl_s": _num(limits.lease_ttl_ms_min / 1000, limits.lease_ttl_ms_max / 1000)},
                             ("owner", "ttl_s")),
        "lock_token": _obj({"token": _int(1, 2**63 - 1),
                            "ttl_s": _num(limits.lease_ttl_ms_min / 1000, limits.lease_ttl_ms_max / 1000)},
                           ("token",)),
        "token": _obj({"role": {"enum": list(ROLES)}, "tenants": _nullable(tenants),
                       "workers": _nullable({"type": "array", "items": _str(1, limits.worker_id_chars_max),
                                             "minItems": 1, "maxItems": limits.token_workers_max}),
                       "jobs": _nullable({"type": "array", "items": _name(limits.job_name_chars_max),
                                          "minItems": 1, "maxItems": limits.token_workers_max,
                                          "description": "a ping token's jobs (role ping only)"}),
                       "expires": _nullable(TIME_OR_MS), "note": _nullable(_str(0, limits.token_note_chars_max))},
                      ("role",)),
        "lease": _obj({"slots": _int(1, limits.worker_slots_max),
                       "executors": {"type": "array", "items": {"enum": list(EXECUTOR_TYPES)}},
                       "queues": _nullable({"type": "array", "items": _name(limits.queue_name_chars_max),
                                            "maxItems": limits.worker_queues_max}),
                       "labels": _WORKER_LABELS, "version": _nullable(_str(0, limits.worker_version_chars_max)),
                       "instance": _nullable(_str(0, limits.worker_version_chars_max)),
                       "max": _int(1, limits.acquire_runs_max),
                       "wait_s": _num(0, worker_limits.lease_wait_s_max, description="how long to wait for runs "
                                      "(a long-poll)"),
                       "ttl_ms": ttl,
                       "dedicated": _nullable({"type": "array", "items": _str(1),
                                               "description": "names of its labels it is dedicated to"}),
                       "targets": _nullable({"type": "array", "minItems": 1, "maxItems": limits.worker_targets_max,
                                             "items": _str(3, limits.worker_target_chars_max,
                                                           r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"),
                                             "description": "the python targets it has handlers for: it is "
                                                            "granted no python run of another (null: any)"}),
                       "results": dict(outcomes, description="outcomes to report, as a complete's; the "
                                       "request's Idempotency-Key is their request id")},
                      ("slots", "executors", "max")),
        "heartbeat": _obj({"leases": leases, "ttl_ms": ttl}, ("leases",)),
        "complete": _obj({"results": outcomes}, ("results",)),
        "release": _obj({"leases": leases, "reason": _nullable(_str(0, 200)),
                         "not_started": {"type": "boolean", "description": "the worker never began these runs: one "
                                         "of a job with late_start skip given back past its start_by is withdrawn"}},
                        ("leases",)),
        "leave": _obj({"instance": _str(1, 64), "reason": _nullable(_str(0, 200))}, ("instance",)),
        "secrets_rotate": _obj({"key": _str(1, limits.seal_key_id_chars_max)}, ("key",)),
        "sink": _sink(),
        "sink_requeue": _obj({"events": {"type": "array", "items": _str(1, 32), "maxItems": 1000}}),
        "member": _obj({"addr": _str(1, description="the new node's Raft address, HOST:PORT")}, ("addr",)),
        "fencing_floor": _obj({"at_least": _int(1, 2**52)}, ("at_least",)),
    }


BODIES: dict[str, Schema] = _bodies()


# ------------------------------------------------------------------ answers
def _error_schema() -> Schema:
    return _obj({
        "error": _obj({
            "code": {"type": "string"},
            "message": {"type": "string"},
            "field": {"type": ["string", "null"], "description": "the field or parameter at fault, if one is"},
        }, ("code", "message", "field"), closed=False,
            description="more keys where the error has more to say (scope, tenant, retry_after_s, ...)"),
    }, ("error",))


def _open(props: dict[str, Schema], required: tuple[str, ...] = (), **kw: Any) -> Schema:
    """An answer: the keys the handler always sends are required, more may come."""
    return _obj(props, required, closed=False, **kw)


def _more_responses() -> dict[str, Schema]:
    s, i, n = {"type": "string"}, {"type": "integer"}, {"type": "number"}
    s_or_null, i_or_null = {"type": ["string", "null"]}, {"type": ["integer", "null"]}
    # a batch's dry run (POST /v1/jobs:batch with dry_run, POST /v1/jobs:plan)
    planned = _open({"dry_run": {"const": True}, "jobs": {"type": "object", "additionalProperties": _open({
        "action": {"enum": ["create", "replace", "unchanged", "conflict"]},
        "changes": {"type": "array", "items": _open({"field": s, "from": {}, "to": {}, "from_bytes": i,
                                                     "to_bytes": i}, ("field",))},
        "pauses": _BOOL, "paused_in_cluster": _BOOL, "next_slot": s_or_null}, ("action",))},
        "create": i, "replace": i, "unchanged": i, "conflicts": i, "values_left_out": _BOOL},
        ("dry_run", "jobs", "create", "replace", "unchanged", "conflicts"),
        description="a dry run: what each job would become; nothing changed")
    arr, obj = {"type": "array"}, {"type": "object"}
    objs = {"type": "array", "items": obj}
    # A slot's deadline record (node/views.py deadline_view). A max_since_success_s miss is the
    # job's, not a slot's: its run_id, slot and slot_ms are null; a pending record has no
    # deadline, cause, instant or judgement yet.
    deadline = _open({"run_id": s_or_null, "job": s, "tenant": s, "slot": s_or_null, "slot_ms": i_or_null,
                      "state": {"enum": list(deadlines.OUTCOMES)},
                      "deadline": {"enum": [*deadlines.FIELDS, None]},
                      "cause": s_or_null, "instant": s_or_null, "judged_at": s_or_null,
                      "instants": {"type": "object", "additionalProperties": s}, "why": s_or_null},
                     ("run_id", "job", "tenant", "slot", "slot_ms", "state", "deadline", "cause", "instant",
                      "judged_at", "instants", "why"))
    slot = _open({"slot": s, "slot_ms": i, "local": s, "timezone": s, "utc_offset": s,
                  "dst": {"enum": ["spring_forward", "fall_back"]}, "dst_skipped": {"type": "array", "items": s},
                  "ambiguous_local_time": _BOOL},
                 ("slot", "slot_ms", "local", "timezone", "utc_offset"))
    backfill = _open({"id": s, "kind": s, "job": s_or_null, "state": s, "reason": s_or_null,
                      "created_at": s_or_null, "updated_at": s_or_null, "finished_at": s_or_null,
                      "request": obj, "created": _BOOL, "waiting_for": s},
                     ("id", "kind", "job", "state", "reason", "created_at", "updated_at", "finished_at", "request"),
                     description="a backfill or bulk DLQ operation (node/backfills.py backfill_view)")
    policy = _open({"executors": arr, "placement": obj, "network": obj}, ("executors", "placement", "network"))
    token = _open({"id": s, "role": {"enum": list(ROLES)}, "tenants": {"type": ["array", "null"]},
                   "workers": {"type": ["array", "null"]}, "state": {"enum": ["active", "expired", "revoked"]},
                   "created_at": s_or_null, "expires_at": s_or_null, "revoked_at": s_or_null,
                   "note": s_or_null}, ("id", "role", "tenants", "workers", "state"))
    sink = _open({"name": s, "spec": obj, "cursor": {}, "behind": i, "dead": i, "requeued": {}},
                 ("name", "spec", "cursor", "behind", "dead", "requeued"))
    sealed = {"values": obj, "clear": {}, "malformed": {}}
    return {
        "fencing": _open({"fencing_token": i}, ("fencing_token",)),
        "fencing_raised": _open({"fencing_token": i, "raised": _BOOL}, ("fencing_token", "raised")),
        "member_changed": _open({"addr": s, "state": {"enum": ["voter", "learner", "removed"]}, "changed": _BOOL,
                                 "members": {}}, ("addr", "state", "changed")),
        "jobs_batch_written": {"anyOf": [
            _open({"jobs": {"type": "object", "additionalProperties": obj}, "created": i,
                   "replaced": i, "conflicts": i, "commands": i},
                  ("jobs", "created", "replaced", "conflicts", "commands")), planned]},
        "jobs_planned": planned,
        "slots": _open({"job": s, "slots": {"type": "array", "items": slot}}, ("slots",),
                       description="the next slots, local time and offset with DST changes marked"),
        "explained": {"anyOf": [
            _open({"job": s, "down_from": s, "down_to": s, "policy": s, "grace_s": i, "max_catchup": i,
                   "fired_ahead": arr, "runs": arr, "recorded": arr, "slots_due": i,
                   "slots_due_exact": {"type": "boolean"}, "next_slot": s_or_null, "waiting": arr,
                   "upstream_missed": i,
                   "overlap": _open({"policy": s, "max_concurrent": i, "runs": i_or_null, "assumes": s},
                                    ("policy", "runs"))},
                  ("job", "down_from", "down_to", "policy", "runs", "recorded", "slots_due", "next_slot")),
            _open({"job": s, "slot": s, "run": {"type": ["object", "null"]}, "runs": objs,
                   "deadline": {"type": ["object", "null"]}, "why": s},
                  ("job", "slot", "run", "runs", "deadline", "why")),
            _open({"job": s, "triggered_by": arr, "summary": s, "waiting": arr},
                  ("job", "triggered_by", "summary", "waiting"))],
            "description": "what an outage window would do, or why one slot met or missed its deadline, or a "
                           "triggered job's parents and waiting slots"},
        "backfill": backfill,
        "backfill_created": {"anyOf": [
            _open({"dry_run": {"const": True}, "job": s, "reprocess": s, "order": s, "planned": i,
                   "slots": {"type": "array", "items": s}, "left_out": objs},
                  ("dry_run", "job", "planned", "slots", "left_out")), backfill]},
        "dlq_bulk_started": {"anyOf": [
            _open({"dry_run": {"const": True}, "action": {"enum": ["requeue", "purge"]},
                   "runs": {"type": "array", "items": s}, "total": i,
                   "left_out_reasons": {"type": "object", "additionalProperties": i}},
                  ("dry_run", "action", "runs", "total", "left_out_reasons")),
            backfill]},
        "backfill_controlled": _open({"id": s, "state": s, "withdrawn": {}}, ("id",)),
        "backfills": _open({"backfills": {"type": "array", "items": backfill}}, ("backfills",)),
        "queue_written": _open({"queue": s, "max_depth": i, "on_full": s, "tenants": {"type": ["array", "null"]}},
                               ("queue",), description="tenants null: the queue is open to every tenant"),
        "tenant": _open({"name": s, "rate_per_s": {"type": ["number", "null"]}, "burst": i_or_null,
                         "tokens": {"type": ["number", "null"]}, "policy": _nullable(policy),
                         "effective_policy": policy, "notify": arr},
                        ("name", "rate_per_s", "burst", "tokens", "policy", "effective_policy", "notify")),
        "tenant_written": _open({"tenant": s, "rate_per_s": n, "burst": i, "policy": policy, "notify": arr},
                                ("tenant",)),
        "tenant_deleted": _open({"tenant": s, "deleted": _BOOL}, ("tenant", "deleted")),
        "dlq_requeued": _open({"run": s, "state": {"enum": list(RUN_STATES)}, "attempt": i_or_null},
                              ("run", "state", "attempt")),
        "run_deleted": _open({"run": s, "deleted": _BOOL}, ("run", "deleted")),
        "job_runs_cancelled": _open({"job": s, "cancelled": i, "runs": {"type": "array", "items": s},
                                     "passed": {"type": "array", "items": _open({"run": s, "state": s_or_null},
                                                                                ("run", "state"))},
                                     "more": _BOOL, "next": s, "duplicate": _BOOL},
                                    ("job", "cancelled", "runs", "passed", "more")),
        "run_cancelled": _open({"run": s, "state": {"enum": ["skipped", "failed"]},
                                "was": {"enum": ["queued", "running"]}, "worker": s, "token": i},
                               ("run", "state", "was")),
        "lock": _open({"lock": s, "owner": s, "token": i, "expires_at": s_or_null, "since": s_or_null},
                      ("lock", "owner", "token", "expires_at", "since")),
        "lock_held": _open({"lock": s, "owner": s, "token": i, "expires_at": s_or_null},
                           ("lock", "token", "expires_at")),
        "lock_released": _open({"lock": s, "released": _BOOL}, ("lock", "released")),
        "pinged": _open({"job": s, "run": s, "state": s}, ("job", "run", "state")),
        "deadlines": _open({"deadlines": {"type": "array", "items": deadline}}, ("deadlines",)),
        "leased": _open({"runs": objs, "draining": _BOOL, "cluster_ms": i, "held_ms": i, "results": arr,
                         "results_error": obj, "duplicate": _BOOL,
                         "next_wait_s": _num(0, worker_limits.lease_wait_s_max,
                                             description="in an idle answer, the wait to ask for next time "
                                                         "(the node has many workers waiting)"),
                         "warnings": {"type": "array", "items": s,
                                      "description": "what the node warns the worker of (another process "
                                                     "under its id); the worker logs them"}},
                        ("runs", "draining", "held_ms")),
        "heartbeat": _open({"extended": i, "lost": {"type": "array", "items": s}, "draining": _BOOL, "cluster_ms": i,
                            "ended": {"type": "object", "additionalProperties": s,
                                      "description": "lost leases whose run the cluster ended while they held it "
                                                     "(a cancel, an overlap replace): run id -> its error"},
                            "next_heartbeat_s": _num(0, limits.lease_ttl_ms_max / 1000,
                                                     description="the interval to heartbeat at next (the node has "
                                                                 "many workers heartbeating), longer than the "
                                                                 "worker's own and at most a quarter of the lease "
                                                                 "TTL")},
                           ("extended", "lost", "draining")),
        "completed": _open({"results": arr}, ("results",)),
        "released": _open({"released": {}, "lost": arr}, ("released", "lost")),
        "workers": _open({"workers": objs, "total": i}, ("workers", "total")),
        "worker": _open({"status": s, "labels": obj, "runs": objs}, ("status", "labels")),
        "worker_drained": _open({"worker": s, "state": s, "held": {}}, ("worker", "state", "held")),
        "worker_left": _open({"worker": s, "state": s, "changed": _BOOL}, ("worker", "state", "changed")),
        "whoami": _open({"id": s, "role": {"enum": list(ROLES)}, "tenants": {"type": ["array", "null"]},
                         "scopes": {"type": "array", "items": s}}, ("id", "role", "tenants", "scopes")),
        "token_created": _open({"id": s, "token": s_or_null, "role": {"enum": list(ROLES)},
                                "tenants": {"type": ["array", "null"]}, "workers": {"type": ["array", "null"]},
                                "jobs": {"type": ["array", "null"]}, "expires_at": s_or_null, "note": s_or_null},
                               ("id", "token", "role", "tenants", "workers", "jobs", "expires_at", "note"),
                               description="the token's secret is shown here only: an answer to a request id "
                                           "sent again (duplicate) has token null"),
        "tokens": _open({"tokens": {"type": "array", "items": token}}, ("tokens",)),
        "token_revoked": _open({"id": s, "revoked_at": s_or_null}, ("id", "revoked_at")),
        "secrets": _open({"node": s, "key": {}, "ring": obj, "missing": arr, **sealed},
                         ("node", "key", "ring", "values", "clear", "malformed", "missing")),
        "secrets_rotated": _open({"key": s, "resealed": {}, "stale": {}, "passes": i, "complete": _BOOL,
                                  "unreadable": obj, **sealed},
                                 ("key", "resealed", "stale", "passes", "complete", "unreadable", "values", "clear",
                                  "malformed")),
        "sinks": _open({"sinks": {"type": "array", "items": sink}}, ("sinks",)),
        "sink": sink,
        "sink_written": _open({"name": s, "spec": obj, "warnings": {"type": "array", "items": s}}, ("name",)),
        "sink_deleted": _open({"sink": s, "deleted": _BOOL}, ("sink", "deleted")),
        "sink_dead": _open({"sink": s, "dead": {"type": "array", "items": _open(
            {"event": obj, "error": {}, "attempts": i, "at": {}}, ("event", "error", "attempts", "at"))}},
            ("sink", "dead")),
        "sink_requeued": _open({"sink": s, "requeued": i}, ("sink", "requeued")),
    }


#: A run or a recorded slot in a list.
_RUN_ITEM = {"type": "object", "properties": {"state": {"enum": list(RUN_STATES)}}, "required": ["state"]}
#: Success answers' schemas, named by ``Route.response`` (every row names one: tests/test_openapi.py).
RESPONSES: dict[str, Schema] = {
    "health": _obj({"ok": _BOOL, "role": {"type": ["string", "null"]}, "leader": {"type": ["string", "null"]},
                    "member": {"const": False, "description": "present when this node is not a member"}},
                   ("ok", "role", "leader"), closed=False),
    "metrics": {"type": "string", "description": "Prometheus text format 0.0.4"},
    "html": {"type": "string", "description": "an HTML page"},
    "static": {"type": "string", "description": "a file of the dashboard (script, style, icon)"},
    "redirect": {"type": "string", "description": "a redirect (Location names the target)"},
    "openapi": _obj({"openapi": {"type": "string"}, "paths": {"type": "object"}}, ("openapi", "paths"),
                    closed=False),
    "cluster": _obj({"node": {"type": "string"}, "role": {"type": ["string", "null"]},
                     "leader": {"type": ["string", "null"]}, "term": {"type": ["integer", "null"]},
                     "members": {"type": ["array", "null"]}, "jobs": {"type": "integer"}, "runs": {"type": "integer"},
                     "conditions": {"type": "array"}}, ("node", "role", "leader", "jobs", "runs", "conditions"),
                    closed=False),
    "job": _obj({"name": {"type": "string"}, "spec": {"type": "object"}, "state": {"type": "object"}},
                ("name", "spec", "state"), closed=False),
    "job_written": _obj({"job": {"type": "string"}, "created": _BOOL, "next_slot": {"type": ["string", "null"]},
                         "paused": {"const": True}, "warnings": {"type": "array", "items": {"type": "string"}}},
                        ("job", "created"), closed=False),
    "triggered": _obj({"job": {"type": "string"}, "run": {"type": "string"}, "state": {"enum": list(RUN_STATES)},
                       "warnings": {"type": "array", "items": {"type": "string"}}},
                      ("job", "run", "state"), closed=False),
    "job_graph": _obj({"job": {"type": "string"}, "parents": {"type": "array", "items": {"type": "string"}},
                       "children": {"type": "array", "items": {"type": "string"}},
                       "nodes": {"type": "array", "items": _obj({"job": {"type": "string"}, "kind": {"enum": list(GRAPH_KINDS)}},
                                                                ("job", "kind"), closed=False)},
                       "edges": {"type": "array", "items": _obj({"from": {"type": "string"}, "to": {"type": "string"},
                                                                 "on": {"enum": list(ON_VALUES)}},
                                                                ("from", "to", "on"))},
                       "not_shown": {"type": "integer", "minimum": 1}},
                      ("job", "parents", "children", "nodes", "edges"), closed=False),
    "job_deleted": _obj({"job": {"type": "string"}, "deleted": _BOOL,
                         "runs_ended": _obj({k: {"type": "integer", "minimum": 0} for k in ("queued", "running", "dead")},
                                            ("queued", "running", "dead")),
                         "warnings": {"type": "array", "items": {"type": "string"}}},
                        ("job", "deleted"), closed=False),
    "job_paused": _obj({"job": {"type": "string"}, "paused": _BOOL, "held": {"type": "integer", "minimum": 0},
                        "released": {"type": "integer", "minimum": 0}, "skipped": {"type": "integer", "minimum": 0},
                        "recorded": {"type": "integer", "minimum": 0}},
                       ("job", "paused"), closed=False),
    "jobs_page": _obj({"jobs": {"type": "array", "items": {"type": "object"}}, "next": {"type": ["string", "null"]},
                       "total": {"type": "integer"}}, ("jobs", "next"), closed=False),
    "run": _obj({"id": {"type": "string"}, "job": {"type": "string"}, "state": {"enum": list(RUN_STATES)},
                 "slot": {"type": ["string", "null"]}, "slot_ms": {"type": ["integer", "null"]},
                 "attempt": {"type": "integer"}, "fencing_token": {"type": ["integer", "null"]},
                 "worker": {"type": ["string", "null"]}, "queue": {"type": "string"}, "tenant": {"type": "string"},
                 "error": {"type": ["string", "null"]}, "output": {"type": ["string", "null"]},
                 "attempts": {"type": "array"}}, ("id", "job", "state"), closed=False),
    "runs_page": _obj({"runs": {"type": "array", "items": _RUN_ITEM}}, ("runs",), closed=False),
    "job_runs": _obj({"job": {"type": "string"}, "runs": {"type": "array", "items": _RUN_ITEM},
                      "history_max": {"type": "integer"}, "why": {"type": "string"}}, ("job", "runs"), closed=False),
    "dlq_page": _obj({"runs": {"type": "array", "items": {"type": "object"}}, "total": {"type": "integer"}},
                     ("runs",), closed=False),
    "queues": _obj({"queues": {"type": "array", "items": {"type": "object"}}}, ("queues",), closed=False),
    "tenants": _obj({"tenants": {"type": "array", "items": {"type": "object"}}}, ("tenants",), closed=False),
    **_more_responses(),
}


# ------------------------------------------------------------------ path parameters
#: A path parameter's schema by (the path segment before it, its name): the names a collection
#: takes (core/model.py check_name's bounds). tests/test_openapi.py checks every route's are here.
PATH_PARAMS: dict[tuple[str, str], Schema] = {
    ("jobs", "name"): _name(limits.job_name_chars_max),
    ("queues", "name"): _name(limits.queue_name_chars_max),
    ("tenants", "name"): _name(limits.tenant_name_chars_max),
    ("locks", "name"): _name(limits.lock_name_chars_max),
    ("dlq", "run"): _str(3, limits.run_id_chars_max, r"^[A-Za-z0-9][A-Za-z0-9._-]*@[!-~]+$"),
    ("runs", "run"): _str(3, limits.run_id_chars_max, r"^[A-Za-z0-9][A-Za-z0-9._-]*@[!-~]+$"),
    ("backfills", "id"): _name(limits.backfill_id_chars_max),
    ("workers", "id"): _str(1, limits.worker_id_chars_max, r"^[!-~]+$"),
    ("tokens", "id"): _str(1, 32, r"^[!-~]+$"),
    ("members", "addr"): _str(1, 300, r"^[!-~]+$"),
    ("sinks", "name"): _name(limits.queue_name_chars_max),
    ("ui", "file"): {"enum": sorted(UI_FILES)},
}
_VAR = re.compile(r"\{(\w+)(?::([^}]*))?\}")
_ALTERNATION = re.compile(r"\w+(\|\w+)*")


def path_parameters(path: str) -> list[Schema]:
    """The path's parameters, each with its schema: ``{action:a|b}`` is an enum; ``{name}`` takes
    its collection's (PATH_PARAMS). :raises KeyError: a parameter PATH_PARAMS lacks."""
    out = []
    parts = path.split("/")
    for i, part in enumerate(parts):
        m = _VAR.fullmatch(part)
        if m is None:
            continue
        name, regex = m.group(1), m.group(2)
        if regex is not None and _ALTERNATION.fullmatch(regex):
            schema: Schema = {"type": "string", "enum": regex.split("|")}
        else:
            schema = PATH_PARAMS[(parts[i - 1], name)]
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def _query(p: Any) -> Schema:
    if p.kind == "boolean":
        s: Schema = {"type": "boolean"}
    elif p.kind == "integer":
        s = _int(p.lo, p.hi)
    elif p.kind == "enum":
        s = {"type": "string", "enum": list(p.choices)}
    elif p.kind == "time":
        s = TIME
    elif p.kind == "job":
        s = _name(limits.job_name_chars_max)
    elif p.kind == "queue":
        s = _name(limits.queue_name_chars_max)
    else:
        s = {"type": "string"}
    if p.default is not None:
        s = dict(s, default=p.default)
    if p.repeated:
        s = {"type": "array", "items": s, "maxItems": limits.job_labels_max}
    out = {"name": p.name, "in": "query", "required": False, "description": p.doc, "schema": s}
    if p.repeated:
        out.update(style="form", explode=True)
    return out


# ------------------------------------------------------------------ the document
def operation_ids(rows: list[Route]) -> dict[tuple[str, str], str]:
    """Each row's operationId: its handler's name, and the path's words after it when another row
    has the handler too."""
    out: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for r in rows:
        oid = r.handler.__name__.lstrip("_")
        if oid in taken:
            oid += "_" + "_".join(re.findall(r"[A-Za-z0-9]+", r.path))
        taken.add(oid)
        out[r.key] = oid
    return out


def _roles_with(scope: str) -> list[str]:
    return [r for r in ROLES if scope in ROLE_SCOPES[r]]


def _error_response(status: int) -> Schema:
    codes = error_codes(status)
    desc = {400: "a malformed request: the field or parameter is named",
            401: "no token, or an unknown, expired or revoked one",
            403: "the token's role lacks the scope (named in scope), or the tenant is not the token's",
            404: "no such object", 405: "method not allowed", 409: "a conflict with the state",
            408: f"the body did not arrive whole within {node_limits.request_body_s:g} s: nothing was done",
            413: f"a body larger than {node_limits.request_bytes_max} bytes",
            422: "a value refused: the field is named", 429: "too many refused tokens from this address",
            503: "no leader, or a bound reached: nothing happened; retry",
            504: "the outcome is unknown: retry with the same Idempotency-Key"}.get(status, "an error")
    headers = {}
    if status in (429, 503):
        headers["Retry-After"] = {"schema": {"type": "string"}, "description": "seconds"}
    if status == 401:
        headers["WWW-Authenticate"] = {"schema": {"type": "string"}}
    schema = {"allOf": [{"$ref": "#/components/schemas/error"},
                        {"properties": {"error": {"properties": {"code": {"enum": codes}}}}}]}
    out: Schema = {"description": desc, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def _operation(route: Route, oid: str, open_: bool) -> Schema:
    op: Schema = {"operationId": oid, "summary": route.summary,
                  "tags": [route.path.split("/")[2 if route.path.startswith("/v1/") else 1].split(":")[0]
                           or "root"]}
    params = path_parameters(route.path) + [_query(p) for p in route.params]
    if route.mutates:
        params.append({"name": "Idempotency-Key", "in": "header", "required": False,
                       "description": "a retried request with the same key applies once (docs/api.md)",
                       "schema": _str(1, limits.request_id_chars_max)})
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": not route.body_optional, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{route.body}"}}}}
    if route.response == "metrics":
        ok_content = {"text/plain": {"schema": RESPONSES["metrics"]}}
    elif route.response == "redirect":  # the dashboard's bare /ui
        ok_content = None
    elif route.response == "html":
        ok_content = {"text/html": {"schema": {"type": "string"}}}
    elif route.response == "static":  # the dashboard's files (node/dashboard.py FILES)
        ok_content = {t.split(";")[0]: {"schema": {"type": "string"}} for t in sorted(set(UI_FILES.values()))}
    else:
        schema = ({"$ref": f"#/components/schemas/{route.response}"} if route.response is not None
                  else {"type": "object"})
        ok_content = {"application/json": {"schema": schema}}
    responses: Schema = {}
    for status in (route.ok,) + route.also_ok:
        responses[str(status)] = {"description": "done" if status == route.ok else "also answered"}
        if ok_content is not None:
            responses[str(status)]["content"] = ok_content
        if route.path == "/v1/cluster" or any(p.name == "stale" for p in route.params):
            # A read of this node's replica as it is (node/reads.py) says so.
            responses[str(status)]["headers"] = {"X-Raftsched-Stale": {
                "description": "true when the answer was read from this node's replica without the read "
                               "barrier (?stale=true; /v1/cluster unless ?consistent=true)",
                "schema": {"type": "string", "enum": ["true"]}}}
    statuses = set(route.errors) | set(OPEN_ERRORS if open_ else COMMON_ERRORS)
    # A body too large, too slow to arrive, or refused: a route that takes none reads one sent to
    # it as well, to refuse it (node/api.py _no_body), so every route may answer these.
    statuses |= {408, 413, 422}
    if "{" in route.path:  # a path parameter that is no valid name, id or address
        statuses.add(422)
    if route.mutates:  # an Idempotency-Key used before for another request
        statuses.add(409)
    for status in sorted(statuses - {route.ok, *route.also_ok}):
        if status == 413 and route.body_bytes_max is not None:  # (a batch's larger bound)
            responses["413"] = dict(_error_response(413), description=f"a body larger than {route.body_bytes_max} bytes")
            continue
        responses[str(status)] = {"$ref": f"#/components/responses/error_{status}"}
    op["responses"] = responses
    if open_:
        op["security"] = []
    else:
        op["security"] = [{"bearer": [route.scope]}]
        op["x-raftsched-scope"] = route.scope
        op["x-raftsched-roles"] = _roles_with(route.scope)
    op["x-raftsched-tenancy"] = route.tenancy.value
    return op


def _links(rows: list[Route], ops: dict[str, dict[str, Schema]], ids: dict[tuple[str, str], str]) -> None:
    """Stateful links (schemathesis follows them): a PUT that creates ``/x/{p}`` leads to every
    other operation on ``/x/{p}`` and below it, with ``p`` as the PUT's."""
    for r in rows:
        if r.method != "PUT" or not r.path.endswith("}"):
            continue
        names = [p["name"] for p in path_parameters(r.path)]
        links = {}
        for o in rows:
            if o is r or not (o.path == r.path or o.path.startswith(r.path + "/")):
                continue
            if [p["name"] for p in path_parameters(o.path)] != names:
                continue
            links[ids[o.key]] = {"operationId": ids[o.key],
                                      "parameters": {n: f"$request.path.{n}" for n in names}}
        if links:
            for status in (r.ok,) + r.also_ok:
                ops[r.path][r.method.lower()]["responses"][str(status)]["links"] = links
    # A write's answer naming an object (a trigger's "run") leads to the reads of that object
    # (GET /v1/runs/{run}, GET /v1/dlq/{run}); "id" names too many kinds of object to follow.
    for r in rows:
        props = RESPONSES.get(r.response or "", {}).get("properties", {}) if r.mutates else {}
        props = {k: v for k, v in props.items() if k != "id"}
        links = {}
        for o in rows:
            names = [p["name"] for p in path_parameters(o.path)]
            if o.method == "GET" and names and len(names) == 1 and names[0] in props and o.path.endswith("}"):
                links[ids[o.key]] = {"operationId": ids[o.key],
                                     "parameters": {names[0]: f"$response.body#/{names[0]}"}}
        if links:
            for status in (r.ok,) + r.also_ok:
                resp = ops[r.path][r.method.lower()]["responses"][str(status)]
                resp["links"] = {**resp.get("links", {}), **links}


def document(routes: Any, version: str = "", is_open: Callable[[Route], bool] | None = None) -> Schema:
    """The OpenAPI 3.1 document of ``routes`` (the app's route table: ``Route`` rows).

    :param is_open: whether a route needs no token on this node (node/auth.py ``Auth.is_open``:
        an OPEN row, or ``GET /metrics`` on a node started with ``--metrics-open``); by default,
        whether its row is OPEN. An open operation has no security and no 401 or 403."""
    rows = list(routes.values()) if isinstance(routes, dict) else list(routes)
    paths: dict[str, dict[str, Schema]] = {}
    ids = operation_ids(rows)
    for r in rows:
        open_ = is_open(r) if is_open is not None else r.scope == OPEN
        paths.setdefault(r.key[1], {})[r.method.lower()] = _operation(r, ids[r.key], open_)
    _links(rows, {r.path: paths[r.key[1]] for r in rows}, ids)
    used = {r.body for r in rows if r.body is not None}
    schemas: dict[str, Schema] = {"error": _error_schema()}
    schemas.update({k: v for k, v in BODIES.items() if k in used or k == "job_spec"})
    schemas.update({k: v for k, v in RESPONSES.items() if k != "metrics"})
    statuses = {int(st) for ops in paths.values() for op in ops.values() for st, resp in op["responses"].items()
                if "$ref" in resp}
    roles = "; ".join(f"{role}: {', '.join(sorted(ROLE_SCOPES[role]))}" for role in ROLES)
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftsched admin API", "version": version or "1",
                 "description": "A Raft-replicated distributed cron. docs/api.md describes every operation; this "
                                "document is generated from the route table (raftsched/node/api.py ROUTES)."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {f"error_{st}": _error_response(st) for st in sorted(statuses)},
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "a token (docs/security.md): the bootstrap token, or one made by POST /v1/tokens. "
                               "Each operation lists the scope it needs; the roles' scopes are " + roles +
                               ". A token limited to tenants sees and changes only theirs "
                               "(x-raftsched-tenancy)."}},
        },
        "security": [{"bearer": []}],
    }
