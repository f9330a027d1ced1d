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


@pytest.mark.parametrize("path", ["retyr", "schedule.strat_at", "executor.envv", "misfire.grace", "retry.tries",
                                  "deadline.start_in_s", "schedule.dst.spring", "placement.label",
                                  "pause_on_failure.after", "overlap.max"])
def test_an_unknown_field_given_null_is_refused_as_unknown(path, schema):
    """A typo'd field given null was dropped with the nulls: the job was stored without what
    its writer meant. It is refused naming it, as any unknown field."""
    base = dict(BASE, deadline={"start_within_s": 60}, pause_on_failure={"after_consecutive": 2},
                placement={"labels": {"a": "b"}}, retry={}, overlap={}, schedule={"cron": "0 2 * * *", "dst": {}})
    body = _set(base, path, None)
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", body)
    if path == "pause_on_failure.after":  # its message names the one field it takes
        assert ei.value.field == "pause_on_failure" and "after_consecutive" in ei.value.message, ei.value
    else:
        assert ei.value.field == path and "unknown field" in ei.value.message, ei.value
    assert list(schema.iter_errors(body)), path


@pytest.mark.parametrize("path", ["after[0].retry", "notify[0].sinks"])
def test_an_unknown_field_given_null_in_a_list_item_is_refused(path, schema):
    key, field = path.split("[0].")
    item = {"after": {"job": "p"}, "notify": {"sink": "ops"}}[key]
    body = dict(BASE, **{key: [dict(item, **{field: None})]})
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", body)
    assert ei.value.field == path, ei.value
    assert list(schema.iter_errors(body)), path


def test_the_schema_refuses_what_validate_job_refuses_for_want_of_a_field(schema):
    """A deadline of nulls only names no deadline; a job with a schedule and after needs its
    misfire: both 422, and the schema says both invalid (it let them through)."""
    for body in (dict(BASE, deadline={"start_within_s": None}),
                 {"schedule": {"every_s": 60}, "after": ["p"], "executor": BASE["executor"]}):
        with pytest.raises(InvalidSpec):
            model.validate_job("j", body)
        assert list(schema.iter_errors(body)), body
    ok = {"after": ["p"], "executor": BASE["executor"], "schedule": None}
    model.validate_job("j", ok)
    assert not list(schema.iter_errors(ok))


def handler(ctx):
    return None


def test_an_sdk_job_declared_with_labels_none_keeps_its_apps_mark():
    """labels=None was dropped as a null by validate_job after the App had left its mark out
    (it merges only maps): the job lost the App's label, and sync --prune its owner."""
    from raftsched.sdk import App
    from raftsched.sdk.app import APP_LABEL
    app = App("billing", misfire="skip")
    app.job("x", every_s=60, labels=None)(handler)
    (spec,) = app.specs().values()
    assert spec["labels"] == {APP_LABEL: "billing"}
    assert model.validate_job("x", spec)["labels"] == {APP_LABEL: "billing"}
