"""A job body's nulls: an optional field given as null takes its default, at every level, as
clients that write every field of their model send it; a required field's null is "is required";
the maps' values (labels, env, headers, secrets) and list items stay refused; the payload keeps
its null. The document's job_spec schema says the same (core/model.py _nulls_absent,
node/openapi.py _nulls_absent)."""
from __future__ import annotations

import copy

import jsonschema
import pytest

from raftsched.core import model
from raftsched.core.errors import InvalidSpec
from raftsched.node import openapi

BASE = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["true"]},
        "misfire": {"policy": "skip"}}
CRON = dict(BASE, schedule={"cron": "0 2 * * *"})
HTTP = dict(BASE, executor={"type": "http", "url": "https://example.com/hook"})

#: Every optional field of a body, as (a body without it, the path to set to null).
OPTIONAL = [
    (BASE, p) for p in (
        "payload.x", "timeout_s", "retry", "retry.max_attempts", "retry.backoff_s", "retry.backoff_multiplier",
        "retry.backoff_max_s", "retry.jitter", "queue", "priority", "tenant", "history", "description", "overlap",
        "overlap.policy", "overlap.max_concurrent", "jitter_s", "secrets", "keep_output", "labels", "placement",
        "deadline", "notify", "pause_on_failure", "metrics", "misfire.grace_s", "misfire.max_catchup",
        "schedule.start_at", "schedule.cron", "schedule.at", "schedule.timezone", "executor.env", "executor.cwd",
        "executor.url", "executor.target")
] + [(CRON, p) for p in ("schedule.timezone", "schedule.dst", "schedule.every_s")] + [
    (HTTP, p) for p in ("executor.headers", "executor.result", "executor.argv")]


def _set(body: dict, path: str, value) -> dict:
    out = copy.deepcopy(body)
    d = out
    *head, last = path.split(".")
    for k in head:
        d = d.setdefault(k, {})
    d[last] = value
    return out


@pytest.fixture(scope="module")
def schema():
    return jsonschema.Draft202012Validator(openapi._bodies()["job_spec"])


@pytest.mark.parametrize("body,path", OPTIONAL, ids=[p for _, p in OPTIONAL])
def test_an_optional_null_is_its_default(body, path, schema):
    with_null = _set(body, path, None)
    if path == "payload.x":  # a null inside the payload is the payload's own
        assert model.validate_job("j", with_null)["payload"] == {"x": None}
    else:
        assert model.validate_job("j", with_null) == model.validate_job("j", body)
    assert not list(schema.iter_errors(with_null)), path


def test_a_null_payload_is_kept_as_a_value(schema):
    assert model.validate_job("j", dict(BASE, payload=None))["payload"] is None
    assert not list(schema.iter_errors(dict(BASE, payload=None)))


@pytest.mark.parametrize("body,path,field", [
    (BASE, "misfire", "misfire"), (BASE, "executor", "executor"), (BASE, "schedule", "schedule"),
    (BASE, "misfire.policy", "misfire.policy"), (BASE, "executor.type", "executor.type"),
    (BASE, "schedule.every_s", "schedule"),  # then no kind is given
    (dict(BASE, placement={"labels": {"a": "b"}}), "placement.labels", "placement.labels"),
])
def test_a_required_null_is_refused_naming_the_field(body, path, field, schema):
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", _set(body, path, None))
    assert ei.value.field == field
    assert list(schema.iter_errors(_set(body, path, None))), path


@pytest.mark.parametrize("path,value", [
    ("labels", {"a": None}), ("secrets", {"S": None}), ("executor.argv", ["true", None]),
    ("notify", [None]), ("after", [None]),
])
def test_a_null_in_a_map_or_a_list_is_refused(path, value, schema):
    body = _set(BASE, path, value)
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", body)
    assert ei.value.field is not None and ei.value.field.startswith(path.split(".")[0])
    assert list(schema.iter_errors(body)), path


def test_nested_nulls_in_a_list_of_objects_are_defaults(schema):
    body = dict(BASE, schedule=None, misfire=None, after=[{"job": "p", "on": None}],
                notify=[{"sink": "ops", "on": None, "after_consecutive": None}])
    spec = model.validate_job("j", body)
    assert spec["after"] == model.validate_job("j", dict(BASE, schedule=None, misfire=None,
                                                         after=["p"]))["after"]
    assert spec["notify"] == model.validate_job("j", dict(BASE, notify=[{"sink": "ops"}]))["notify"]
    assert not list(schema.iter_errors(body))
