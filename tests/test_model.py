"""model.validate_job: valid specs normalise; every refusal is an InvalidSpec naming its field."""
from __future__ import annotations

import copy
import json

import pytest

from raftsched.core import limits, model
from raftsched.core.errors import InvalidSpec

from core_helpers import T0, raw_job


def _refusal(raw, name="job-1") -> InvalidSpec:
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job(name, raw)
    assert ei.value.code == "invalid" and ei.value.http_status == 422
    return ei.value


def _with(**over):
    raw = raw_job({"every_s": 60})
    raw.update(over)
    return raw


# ----------------------------------------------------------------------------- valid specs
def test_valid_cron_job_normalises_with_defaults():
    spec = model.validate_job("nightly", {
        "schedule": {"cron": "  0   2 * * *  "},
        "executor": {"type": "shell", "argv": ["echo", "hi"]},
        "misfire": {"policy": "fire_once"},
    })
    assert spec["schedule"] == {"cron": "0 2 * * *", "timezone": "UTC"}
    assert spec["executor"] == {"type": "shell", "argv": ["echo", "hi"]}
    assert spec["misfire"] == {"policy": "fire_once", "grace_s": limits.grace_s_default,
                               "max_catchup": limits.max_catchup_default}
    assert spec["retry"] == {"max_attempts": 1, "backoff_s": 1, "backoff_multiplier": 2,
                             "backoff_max_s": 300, "jitter": 0.1}
    assert spec["payload"] == {}
    assert spec["timeout_s"] == limits.timeout_s_default
    assert spec["queue"] == "default" and spec["tenant"] == "default"
    assert spec["priority"] == limits.priority_default
    assert spec["history"] == limits.history_per_job_default
    assert "description" not in spec


def test_valid_six_field_cron_with_timezone_normalises():
    spec = model.validate_job("j", raw_job({"cron": "*/10 * * * * *", "timezone": "Europe/Berlin"}))
    assert spec["schedule"] == {"cron": "*/10 * * * * *", "timezone": "Europe/Berlin"}


def test_valid_interval_job_normalises_float_integral_value():
    spec = model.validate_job("j", raw_job({"every_s": 30.0}, "skip", grace_s=0, max_catchup=0))
    assert spec["schedule"] == {"every_s": 30} and type(spec["schedule"]["every_s"]) is int
    assert spec["misfire"] == {"policy": "skip", "grace_s": 0, "max_catchup": 0}


def test_valid_at_job_accepts_iso_with_offset_and_integer_ms():
    a = model.validate_job("j", raw_job({"at": "2026-06-01T12:00:00+02:00"}))
    assert a["schedule"] == {"at": 1780308000000}
    b = model.validate_job("j", raw_job({"at": T0}))
    assert b["schedule"] == {"at": T0}
    c = model.validate_job("j", raw_job({"at": "2026-06-01T10:00:00Z"}))
    assert c["schedule"] == a["schedule"]


def test_valid_http_job_keeps_headers():
    spec = model.validate_job("hook", {
        "schedule": {"every_s": 5},
        "executor": {"type": "http", "url": "https://example.invalid/hook", "headers": {"X-A": "1"}},
        "misfire": {"policy": "skip"},
        "payload": {"k": [1, 2]}, "priority": 0, "queue": "q.1", "tenant": "t-1", "history": 1,
        "timeout_s": 1, "description": "hello",
        "retry": {"max_attempts": 3, "backoff_s": 2, "backoff_max_s": 2, "jitter": 0},
    })
    assert spec["executor"] == {"type": "http", "url": "https://example.invalid/hook", "headers": {"X-A": "1"}}
    assert spec["payload"] == {"k": [1, 2]} and spec["description"] == "hello"
    assert spec["retry"]["max_attempts"] == 3 and spec["retry"]["backoff_max_s"] == 2


def test_valid_shell_job_keeps_env_and_cwd():
    spec = model.validate_job("sh", {
        "schedule": {"every_s": 5}, "misfire": {"policy": "fire_all"},
        "executor": {"type": "shell", "argv": ["sh", "-c", "true"], "env": {"A": "b"}, "cwd": "/tmp"},
    })
    assert spec["executor"] == {"type": "shell", "argv": ["sh", "-c", "true"], "env": {"A": "b"}, "cwd": "/tmp"}


def test_validate_job_does_not_mutate_input_and_is_deterministic():
    raw = raw_job({"cron": "0 2 * * *", "timezone": "America/New_York"}, payload={"a": 1})
    before = copy.deepcopy(raw)
    a = model.validate_job("j", raw)
    b = model.validate_job("j", raw)
    assert raw == before and a == b


# ----------------------------------------------------------------------------- refusals
def test_missing_misfire_names_field_and_lists_policies():
    raw = raw_job({"every_s": 5})
    del raw["misfire"]
    e = _refusal(raw)
    assert e.field == "misfire"
    for p in ("fire_all", "fire_once", "skip"):
        assert p in e.message


@pytest.mark.parametrize("pol", ["FIRE_ALL", "never", None, 3])
def test_bad_misfire_policy_names_field(pol):
    e = _refusal(_with(misfire={"policy": pol}))
    assert e.field == "misfire.policy"
    assert "fire_all" in e.message


def test_misfire_without_policy_is_refused():
    assert _refusal(_with(misfire={"grace_s": 5})).field == "misfire.policy"


def test_unknown_misfire_field_is_named():
    assert _refusal(_with(misfire={"policy": "skip", "graces": 5})).field == "misfire.graces"


@pytest.mark.parametrize("field,value", [("grace_s", -1), ("grace_s", limits.grace_s_max + 1), ("grace_s", 1.5),
                                         ("max_catchup", limits.max_catchup_max + 1), ("max_catchup", True)])
def test_bad_misfire_numbers_name_field(field, value):
    assert _refusal(_with(misfire={"policy": "skip", field: value})).field == f"misfire.{field}"


def test_unknown_top_level_field_is_named():
    e = _refusal(_with(schedul={"every_s": 5}))
    assert e.field == "schedul"
    assert "schedule" in e.message


def test_missing_schedule_and_executor_are_named():
    raw = _with()
    del raw["schedule"]
    assert _refusal(raw).field == "schedule"
    raw = _with()
    del raw["executor"]
    assert _refusal(raw).field == "executor"


def test_spec_not_an_object_is_refused():
    e = _refusal(["schedule"])
    assert e.field is None


@pytest.mark.parametrize("name", ["", "-lead", "has space", "a/b", "x" * (limits.job_name_chars_max + 1), None, 5])
def test_bad_job_name_is_refused(name):
    assert _refusal(_with(), name=name).field == "name"


@pytest.mark.parametrize("sched", [{}, {"cron": "* * * * *", "every_s": 5}, {"every_s": 5, "at": T0}, "daily"])
def test_schedule_needs_exactly_one_kind(sched):
    assert _refusal(_with(schedule=sched)).field == "schedule"


@pytest.mark.parametrize("expr", ["* * * *", "* * * * * * *", "61 * * * *", "* 25 * * *", "0 0 30 2 *",
                                  "@reboot", "@fortnightly", "15W * * * *", "5-1 * * * *", "", "   ", "a b c d e", 5, "* * * * * " * 60])
def test_bad_cron_is_refused_naming_cron(expr):
    assert _refusal(_with(schedule={"cron": expr})).field == "schedule.cron"


@pytest.mark.parametrize("expr", ["R * * * *", "0 R * * *", "R(0-10) * * * *", "0 R/2 * * *",
                                  "r * * * *", "0 r * * *", "r(0-10) * * * *", "5,r * * * *", "R 0 * * * *"])
def test_random_cron_field_is_refused(expr):
    # croniter draws R (or r) per parsed instance: two leaders would compute different slots.
    e = _refusal(_with(schedule={"cron": expr}))
    assert e.field == "schedule.cron"


@pytest.mark.parametrize("expr", ["0 9 * * FRI", "0 9 * * MON-FRI", "0 0 1 MAR *", "0 0 1 APR,OCT *",
                                  "0 9 * * fri", "0 0 1 mar *"])
def test_cron_month_and_day_names_containing_r_are_valid(expr):
    spec = model.validate_job("j", raw_job({"cron": expr}))
    assert spec["schedule"]["cron"] == expr


def test_unknown_timezone_is_refused_naming_timezone():
    e = _refusal(_with(schedule={"cron": "0 2 * * *", "timezone": "Mars/Olympus_Mons"}))
    assert e.field == "schedule.timezone"
    for tz in ("", "../../etc/passwd", 5):
        assert _refusal(_with(schedule={"cron": "0 2 * * *", "timezone": tz})).field == "schedule.timezone"


@pytest.mark.parametrize("sched", [{"every_s": 5, "timezone": "UTC"}, {"at": T0, "timezone": "UTC"}])
def test_timezone_on_non_cron_schedule_is_refused(sched):
    assert _refusal(_with(schedule=sched)).field == "schedule.timezone"


@pytest.mark.parametrize("every", [0, -1, limits.every_s_max + 1, 1.5, "60", True])
def test_bad_every_s_is_refused(every):
    assert _refusal(_with(schedule={"every_s": every})).field == "schedule.every_s"


@pytest.mark.parametrize("at", ["2026-06-01T12:00:00", "2026-06-01 12:00", "tomorrow", "", -1, 1.5, True, [T0]])
def test_bad_at_is_refused(at):
    e = _refusal(_with(schedule={"at": at}))
    assert e.field == "schedule.at"


def test_at_without_offset_says_so():
    e = _refusal(_with(schedule={"at": "2026-06-01T12:00:00"}))
    assert e.field == "schedule.at" and "offset" in e.message


def test_at_before_epoch_is_refused_in_iso_form_as_in_integer_form():
    assert _refusal(_with(schedule={"at": -1000})).field == "schedule.at"
    assert _refusal(_with(schedule={"at": "1960-01-01T00:00:00Z"})).field == "schedule.at"


@pytest.mark.parametrize("start", ["2026-06-01T12:00:00", "soon", -1, 1.5, True])
def test_bad_interval_start_at_is_refused(start):
    assert _refusal(_with(schedule={"every_s": 5, "start_at": start})).field == "schedule.start_at"


@pytest.mark.parametrize("sched", [{"cron": "* * * * *", "start_at": 0}, {"at": T0, "start_at": 0}])
def test_start_at_belongs_to_intervals_only(sched):
    assert _refusal(_with(schedule=sched)).field == "schedule.start_at"


def test_interval_start_at_is_normalised_to_milliseconds():
    spec = model.validate_job("j", _with(schedule={"every_s": 5, "start_at": "2026-06-01T12:00:00.437Z"}))
    assert spec["schedule"] == {"every_s": 5, "start_at": 1780315200437}


def test_unknown_schedule_field_is_named():
    assert _refusal(_with(schedule={"every_s": 5, "jitter": 1})).field == "schedule.jitter"


@pytest.mark.parametrize("ex", [{"type": "docker"}, {}, {"type": None}, "shell", None])
def test_bad_executor_type_is_refused(ex):
    e = _refusal(_with(executor=ex))
    assert e.field in ("executor", "executor.type")
    if isinstance(ex, dict):
        assert e.field == "executor.type"
        assert "shell" in e.message and "http" in e.message and "python" in e.message


@pytest.mark.parametrize("argv", [[], None, "echo hi", ["x"] * (limits.argv_items_max + 1)])
def test_bad_shell_argv_is_refused(argv):
    assert _refusal(_with(executor={"type": "shell", "argv": argv})).field == "executor.argv"


@pytest.mark.parametrize("argv,field", [(["echo", 5], "executor.argv[1]"), (["echo", None], "executor.argv[1]"),
                                        ([None], "executor.argv[0]"), (["echo", ["x"]], "executor.argv[1]"),
                                        (["echo", "a\x00"], "executor.argv[1]")])
def test_a_bad_argv_item_is_named_by_its_index_whatever_is_wrong_with_it(argv, field):
    """A number or a null in argv named ``executor.argv`` while a NUL named the item: each names it."""
    e = _refusal(_with(executor={"type": "shell", "argv": argv}))
    assert e.field == field, e.field


def test_a_bad_env_or_header_value_is_named_by_its_key():
    assert _refusal(_with(executor={"type": "shell", "argv": ["a"], "env": {"A": 1}})).field == "executor.env.A"
    assert _refusal(_with(executor={"type": "shell", "argv": ["a"], "env": {"A": None}})).field == "executor.env.A"
    assert _refusal(_with(executor={"type": "http", "url": "http://h", "headers": {"X-A": None}})).field == \
        "executor.headers.X-A"


def test_bad_shell_env_and_cwd_are_named():
    assert _refusal(_with(executor={"type": "shell", "argv": ["a"], "env": ["A"]})).field == "executor.env"
    assert _refusal(_with(executor={"type": "shell", "argv": ["a"], "cwd": ""})).field == "executor.cwd"
    assert _refusal(_with(executor={"type": "shell", "argv": ["a"], "url": "x"})).field == "executor.url"


@pytest.mark.parametrize("url", ["ftp://host/x", "example.com", "http://", "http:// space", "", None, 5,
                                 "http://h/\u202eexe.txt"])
def test_bad_http_url_is_refused(url):
    assert _refusal(_with(executor={"type": "http", "url": url})).field == "executor.url"


def test_bad_http_headers_are_named():
    assert _refusal(_with(executor={"type": "http", "url": "http://h", "headers": ["a"]})).field == "executor.headers"


@pytest.mark.parametrize("target", ["module", "mod:", ":fn", "mod:fn()", "1mod:fn", "mod:fn.x", "", None, "a b:c"])
def test_bad_python_target_is_refused(target):
    assert _refusal(_with(executor={"type": "python", "target": target})).field == "executor.target"


@pytest.mark.parametrize("prio", [limits.priority_max + 1, 10, -1, 2.5, "5", True])
def test_bad_priority_is_refused(prio):
    assert _refusal(_with(priority=prio)).field == "priority"


@pytest.mark.parametrize("field,value", [("timeout_s", 0), ("timeout_s", limits.timeout_s_max + 1),
                                         ("history", 0), ("history", limits.history_per_job_max + 1),
                                         ("queue", ""), ("queue", "a b"), ("tenant", "x" * 65),
                                         ("description", "d" * 1025), ("description", 5)])
def test_bad_scalar_fields_are_named(field, value):
    assert _refusal(_with(**{field: value})).field == field


@pytest.mark.parametrize("field", ["timeout_s", "priority", "history"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_refused_as_invalid_spec(field, value):
    # json.loads (and so aiohttp's request.json()) accepts NaN and Infinity.
    assert _refusal(_with(**{field: value})).field == field


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_every_s_and_at_are_refused_as_invalid_spec(value):
    assert _refusal(_with(schedule={"every_s": value})).field == "schedule.every_s"
    assert _refusal(_with(schedule={"at": value})).field == "schedule.at"


def test_payload_too_big_is_refused():
    e = _refusal(_with(payload={"blob": "x" * limits.payload_bytes_max}))
    assert e.field == "payload" and str(limits.payload_bytes_max) in e.message


def test_payload_at_limit_is_accepted():
    pad = limits.payload_bytes_max - len(json.dumps({"blob": ""}))
    spec = model.validate_job("j", _with(payload={"blob": "x" * pad}))
    assert len(json.dumps(spec["payload"])) == limits.payload_bytes_max


@pytest.mark.parametrize("payload", [{"x": float("nan")}, {"x": {1, 2}}, {"x": 2**70}])
def test_payload_not_storable_is_refused(payload):
    assert _refusal(_with(payload=payload)).field == "payload"


def test_retry_backoff_max_below_backoff_is_refused():
    e = _refusal(_with(retry={"backoff_s": 10, "backoff_max_s": 5}))
    assert e.field == "retry.backoff_max_s" and "backoff_s" in e.message


@pytest.mark.parametrize("field,value", [("max_attempts", 0), ("max_attempts", 101), ("backoff_s", -1),
                                         ("backoff_multiplier", 0.5), ("jitter", 1.5), ("jitter", float("nan"))])
def test_bad_retry_numbers_are_named(field, value):
    assert _refusal(_with(retry={field: value})).field == f"retry.{field}"


def test_unknown_retry_field_is_named():
    assert _refusal(_with(retry={"attempts": 3})).field == "retry.attempts"


def test_spec_too_big_overall_is_refused():
    # argv alone can push the encoded spec past job_spec_bytes_max
    argv = ["x" * 100] * 200
    e = _refusal(_with(executor={"type": "shell", "argv": argv}))
    assert e.field is None and str(limits.job_spec_bytes_max) in e.message


@pytest.mark.parametrize("url", ["http://]\u0101", "http://[::1", "https://[x]/a"])
def test_an_http_url_urllib_cannot_split_is_refused_naming_the_field(url):
    """urlsplit raises ValueError on an unbalanced or invalid IPv6 bracket: that was a 500 from
    PUT /v1/jobs/{name} (found by schemathesis); it is a 422 naming executor.url."""
    with pytest.raises(InvalidSpec) as e:
        model.validate_executor({"type": "http", "url": url})
    assert e.value.field == "executor.url"


def test_a_huge_number_out_of_range_is_said_by_its_digits_not_echoed():
    """every_s: 1e308 was answered with its 309 digits in the message."""
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", {"schedule": {"every_s": 1e308}, "executor": {"type": "shell", "command": "true"}})
    assert ei.value.field == "schedule.every_s"
    assert ei.value.message.endswith("got a number of 309 digits"), ei.value.message
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", {"schedule": {"every_s": 0}, "executor": {"type": "shell", "command": "true"}})
    assert ei.value.message.endswith("; got 0"), ei.value.message
