"""The SDK's declarations (raftsched/sdk): every option of ``@app.job`` is the spec field the
API validates, a bad declaration raises where it is made naming the field, and a handler is
called with a Context whatever runs it."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import shutil
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

import sdk_targets
from raftsched import App, Context
from raftsched.core import model
from raftsched.core.errors import InvalidSpec
from raftsched.worker.executors import RunContext
from raftsched.sdk import APP_LABEL, OPTIONS, DeclarationError, load_app
from raftsched.sdk.loader import AppLoadError

TARGET = {"type": "python", "target": "sdk_targets:report"}
BASE = {"every_s": 60}
SKIP = {"policy": "skip"}

#: option -> (the options given to @app.job, the spec a client would PUT for the same job, by
#: hand). Every option is here: a spec field added to the API without an option here fails
#: test_the_table_covers_every_option.
CASES = {
    "cron": ({"cron": "0 2 * * *", "misfire": "skip"},
             {"schedule": {"cron": "0 2 * * *"}, "misfire": SKIP}),
    "timezone": ({"cron": "0 2 * * *", "timezone": "Europe/Berlin", "misfire": "skip"},
                 {"schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, "misfire": SKIP}),
    "dst": ({"cron": "30 2 * * *", "dst": {"spring_forward": "skip"}, "misfire": "skip"},
            {"schedule": {"cron": "30 2 * * *", "dst": {"spring_forward": "skip"}}, "misfire": SKIP}),
    "every_s": ({"every_s": 90, "misfire": "skip"}, {"schedule": {"every_s": 90}, "misfire": SKIP}),
    "start_at": ({"every_s": 90, "start_at": "2027-01-01T00:00:00Z", "misfire": "skip"},
                 {"schedule": {"every_s": 90, "start_at": "2027-01-01T00:00:00Z"}, "misfire": SKIP}),
    "at": ({"at": "2027-01-01T00:00:00Z", "misfire": "skip"},
           {"schedule": {"at": "2027-01-01T00:00:00Z"}, "misfire": SKIP}),
    "misfire": ({"every_s": 60, "misfire": {"policy": "fire_all", "max_catchup": 3, "grace_s": 9}},
                {"schedule": BASE, "misfire": {"policy": "fire_all", "max_catchup": 3, "grace_s": 9}}),
    "overlap": ({"every_s": 60, "misfire": "skip", "overlap": "queue_one"},
                {"schedule": BASE, "misfire": SKIP, "overlap": {"policy": "queue_one"}}),
    "retry": ({"every_s": 60, "misfire": "skip", "retry": {"max_attempts": 4, "backoff_s": 2}},
              {"schedule": BASE, "misfire": SKIP, "retry": {"max_attempts": 4, "backoff_s": 2}}),
    "timeout_s": ({"every_s": 60, "misfire": "skip", "timeout_s": 30},
                  {"schedule": BASE, "misfire": SKIP, "timeout_s": 30}),
    "priority": ({"every_s": 60, "misfire": "skip", "priority": 9},
                 {"schedule": BASE, "misfire": SKIP, "priority": 9}),
    "payload": ({"every_s": 60, "misfire": "skip", "payload": {"k": [1, "two"]}},
                {"schedule": BASE, "misfire": SKIP, "payload": {"k": [1, "two"]}}),
    "jitter_s": ({"every_s": 60, "misfire": "skip", "jitter_s": 7},
                 {"schedule": BASE, "misfire": SKIP, "jitter_s": 7}),
    "queue": ({"every_s": 60, "misfire": "skip", "queue": "reports"},
              {"schedule": BASE, "misfire": SKIP, "queue": "reports"}),
    "tenant": ({"every_s": 60, "misfire": "skip", "tenant": "acme"},
               {"schedule": BASE, "misfire": SKIP, "tenant": "acme"}),
    "history": ({"every_s": 60, "misfire": "skip", "history": 7},
                {"schedule": BASE, "misfire": SKIP, "history": 7}),
    "description": ({"every_s": 60, "misfire": "skip", "description": "what it does"},
                    {"schedule": BASE, "misfire": SKIP, "description": "what it does"}),
    "labels": ({"every_s": 60, "misfire": "skip", "labels": {"team": "billing"}},
               {"schedule": BASE, "misfire": SKIP, "labels": {"team": "billing"}}),
    # placement: merged with the App's own label (below); None leaves the job unplaced
    "placement": ({"every_s": 60, "misfire": "skip", "placement": {"labels": {"pool": "gpu"}}},
                  {"schedule": BASE, "misfire": SKIP, "placement": {"labels": {"pool": "gpu"}}}),
    "secrets": ({"every_s": 60, "misfire": "skip", "secrets": {"API_KEY": "from-the-environment"}},
                {"schedule": BASE, "misfire": SKIP, "secrets": {"API_KEY": "from-the-environment"}}),
    "keep_output": ({"every_s": 60, "misfire": "skip", "keep_output": False},
                    {"schedule": BASE, "misfire": SKIP, "keep_output": False}),
    "deadline": ({"every_s": 60, "misfire": "skip", "deadline": {"succeed_within_s": 30, "succeed_by": "03:00"}},
                 {"schedule": BASE, "misfire": SKIP, "deadline": {"succeed_within_s": 30, "succeed_by": "03:00"}}),
    "notify": ({"every_s": 60, "misfire": "skip", "notify": [{"sink": "ops", "on": ["run.dead"]}]},
               {"schedule": BASE, "misfire": SKIP, "notify": [{"sink": "ops", "on": ["run.dead"]}]}),
    "pause_on_failure": ({"every_s": 60, "misfire": "skip", "pause_on_failure": {"after_consecutive": 3}},
                         {"schedule": BASE, "misfire": SKIP, "pause_on_failure": {"after_consecutive": 3}}),
    "metrics": ({"every_s": 60, "misfire": "skip", "metrics": True},
                {"schedule": BASE, "misfire": SKIP, "metrics": True}),
    # pipelines: a job with after and no schedule is triggered by its parents
    "after": ({"after": ["extract"], "misfire": "skip"}, {"misfire": SKIP, "after": ["extract"]}),
    "match": ({"every_s": 60, "misfire": "skip", "after": ["extract"], "match": "latest"},
              {"schedule": BASE, "misfire": SKIP, "after": ["extract"], "match": "latest"}),
    "max_wait_s": ({"after": ["extract"], "misfire": "skip", "max_wait_s": 600},
                   {"misfire": SKIP, "after": ["extract"], "max_wait_s": 600}),
}


def test_the_table_covers_every_option():
    assert set(CASES) == set(OPTIONS)
    # and every option is a spec field or a schedule field, as the nodes define them
    assert OPTIONS == (model.SPEC_FIELDS - {"schedule", "executor"}) | model.SCHEDULE_FIELDS


@pytest.mark.parametrize("option", sorted(CASES))
def test_every_option_is_the_spec_field_the_api_validates(option):
    options, by_hand = CASES[option]
    app = App("billing")
    app.job("j", **options)(sdk_targets.report)
    decl = app.jobs["j"]
    sent = dict(by_hand, executor=TARGET)
    sent["labels"] = dict(by_hand.get("labels", {}), **{APP_LABEL: "billing"})
    # Every job is placed on the App's workers (raftsched worker --app), with any labels it adds.
    sent["placement"] = {"labels": dict(by_hand.get("placement", {}).get("labels", {}), **{APP_LABEL: "billing"})}
    assert decl.raw == sent
    assert decl.spec == model.validate_job("j", sent)
    assert decl.target == "sdk_targets:report" and decl.spec["executor"] == TARGET
    assert decl.spec["labels"][APP_LABEL] == "billing"


def test_the_view_is_what_get_shows():
    app = App("billing")
    app.job("j", at="2027-01-01T00:00:00+01:00", misfire="skip")(sdk_targets.report)
    view = app.views()["j"]
    assert view["schedule"] == {"at": "2026-12-31T23:00:00Z"}
    assert view["retry"] == model.RETRY_DEFAULT and view["misfire"]["grace_s"] == 5


# ------------------------------------------------------------------ refusals, at once
@pytest.mark.parametrize("options, field", [
    ({"every_s": 60, "misfire": "skip", "retries": 3}, "retries"),
    ({"every_s": 60, "misfire": "skip", "executor": {"type": "shell", "argv": ["x"]}}, "executor"),
    ({"every_s": 60, "misfire": "skip", "schedule": {"every_s": 5}}, "schedule"),
])
def test_an_unknown_option_is_refused_when_declared_naming_it(options, field):
    app = App("billing")
    with pytest.raises(DeclarationError) as ei:
        app.job("j", **options)
    assert ei.value.field == field and field in ei.value.message
    assert "the options are" in ei.value.message
    assert isinstance(ei.value, InvalidSpec)  # the API's own error type, 422 "invalid"


@pytest.mark.parametrize("options, field", [
    ({"cron": "0 2 * *", "misfire": "skip"}, "schedule.cron"),
    ({"cron": "0 2 * * *", "timezone": "Mars/Olympus", "misfire": "skip"}, "schedule.timezone"),
    ({"every_s": 60}, "misfire"),
    ({"every_s": 60, "misfire": "sometimes"}, "misfire.policy"),
    ({"every_s": 60, "cron": "* * * * *", "misfire": "skip"}, "schedule"),
    ({"misfire": "skip"}, "schedule"),
    ({"every_s": 60, "misfire": "skip", "retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ({"every_s": 60, "misfire": "skip", "priority": 10}, "priority"),
    ({"every_s": 60, "misfire": "skip", "jitter_s": 60}, "jitter_s"),
    ({"every_s": 60, "misfire": "skip", "overlap": "sometimes"}, "overlap.policy"),
    ({"every_s": 60, "misfire": "skip", "payload": {"x": float("nan")}}, "payload"),
    ({"every_s": 60, "misfire": "skip", "labels": {"k": 1}}, "labels.k"),
    ({"every_s": 60, "misfire": "skip", "labels": "team=x"}, "labels"),
    ({"every_s": 60, "misfire": "skip", "labels": {APP_LABEL: "other"}}, f"labels.{APP_LABEL}"),
    ({"every_s": 60, "misfire": "skip", "timezone": "UTC"}, "schedule.timezone"),
    ({"every_s": 60, "misfire": "skip", "placement": {"labels": {APP_LABEL: "other"}}}, f"placement.labels.{APP_LABEL}"),
    ({"every_s": 60, "misfire": "skip", "placement": {"labels": {"pool": ""}}}, "placement.labels.pool"),
    ({"every_s": 60, "misfire": "skip", "placement": "gpu"}, "placement"),
    ({"every_s": 60, "misfire": "skip", "deadline": {"succeed_by": "25:00"}}, "deadline.succeed_by"),
])
def test_a_value_the_api_would_refuse_is_refused_when_declared_naming_the_field(options, field):
    app = App("billing")
    with pytest.raises(DeclarationError) as ei:
        app.job("j", **options)(sdk_targets.report)
    e = ei.value
    assert e.field == field, e.message
    assert e.extra["job"] == "j" and e.message.startswith("@app.job('j')")
    assert not app.jobs  # nothing declared


def test_bad_names_and_handlers_are_refused():
    app = App("billing")
    with pytest.raises(DeclarationError) as ei:
        app.job("bad name", every_s=60, misfire="skip")(sdk_targets.report)
    assert ei.value.field == "name"

    def nested(ctx):
        return None
    with pytest.raises(DeclarationError) as ei:
        app.job("n", every_s=60, misfire="skip")(nested)
    assert ei.value.field == "executor.target" and "module-level function" in ei.value.message
    assert "(option executor)" not in ei.value.message and ": the handler: " in ei.value.message, ei.value.message

    with pytest.raises(DeclarationError) as ei:
        app.job("g", every_s=60, misfire="skip")(sdk_targets.gen)
    assert ei.value.field == "executor.target" and "generator" in ei.value.message

    def script_fn(ctx):
        return None
    script_fn.__module__, script_fn.__qualname__ = "__main__", "script_fn"
    with pytest.raises(DeclarationError) as ei:
        app.job("m", every_s=60, misfire="skip")(script_fn)
    assert "__main__" in ei.value.message

    with pytest.raises(DeclarationError) as ei:
        app.job(sdk_targets.report)  # @app.job without its parentheses
    assert "parentheses" in ei.value.message

    app.job("twice", every_s=60, misfire="skip")(sdk_targets.report)
    with pytest.raises(DeclarationError) as ei:
        app.job("twice", every_s=60, misfire="skip")(sdk_targets.other)
    assert ei.value.field == "name" and "declared twice" in ei.value.message


def test_a_bad_declaration_fails_the_import_of_its_module(tmp_path, monkeypatch):
    (tmp_path / "bad_jobs.py").write_text(textwrap.dedent("""
        from raftsched import App
        app = App("bad")

        @app.job("nightly", cron="0 2 * * *", misfire="fire_once", retry={"max_attempts": 0})
        def nightly(ctx):
            pass
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(DeclarationError) as ei:
        load_app("bad_jobs:app")
    assert ei.value.field == "retry.max_attempts" and "bad_jobs:nightly" in ei.value.message
    sys.modules.pop("bad_jobs", None)


def test_load_app_finds_the_app_and_says_what_is_wrong(tmp_path, monkeypatch):
    (tmp_path / "good_jobs.py").write_text("from raftsched import App\napp = App()\nother = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        app = load_app("good_jobs")  # ATTR defaults to app
        assert app.name == "good_jobs"  # an App without a name takes its module's
        assert load_app("good_jobs:app") is app
        for ref, says in (("good_jobs:other", "not a raftsched App"), ("good_jobs:nope", "has no"),
                          ("no_such_module:app", "no module"), ("not a ref", "MODULE:ATTR")):
            with pytest.raises(AppLoadError) as ei:
                load_app(ref)
            assert says in str(ei.value)
    finally:
        sys.modules.pop("good_jobs", None)


def test_loading_an_app_leaves_no_bytecode_in_its_tree(tmp_path, monkeypatch):
    """``raftsched sync`` / ``worker --app`` run from examples/ (the README's SDK flow) must leave
    no __pycache__ there: the app, and a package of the project it imports, load without it."""
    shutil.copy(Path(__file__).parent.parent / "examples" / "nightly_report.py", tmp_path / "nightly_report_bc.py")
    (tmp_path / "helpers_bc").mkdir()
    (tmp_path / "helpers_bc" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "jobs_bc.py").write_text("import helpers_bc\nfrom raftsched import App\napp = App()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as a plain `raftsched` process starts
    try:
        assert load_app("nightly_report_bc:app").jobs
        assert load_app("jobs_bc").name == "jobs_bc"
        assert sys.dont_write_bytecode is False  # put back after the import
        left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "__pycache__" in p.parts)
        assert not left, left
    finally:
        for m in ("nightly_report_bc", "jobs_bc", "helpers_bc"):
            sys.modules.pop(m, None)


# ------------------------------------------------------------------ app defaults
def test_app_defaults_apply_to_every_job_and_a_job_option_replaces_them():
    app = App("billing", queue="billing", misfire="fire_once", timezone="Europe/Berlin",
              retry={"max_attempts": 3}, labels={"team": "payments"})
    app.job("cronjob", cron="0 2 * * *")(sdk_targets.report)
    app.job("interval", every_s=60, retry={"backoff_s": 5}, labels={"tier": "1"})(sdk_targets.other)
    cron, interval = app.jobs["cronjob"].spec, app.jobs["interval"].spec
    assert cron["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert interval["schedule"] == {"every_s": 60}  # timezone is for cron jobs only
    assert cron["queue"] == interval["queue"] == "billing"
    assert cron["misfire"]["policy"] == interval["misfire"]["policy"] == "fire_once"
    assert cron["retry"]["max_attempts"] == 3
    assert interval["retry"] == model.validate_retry({"backoff_s": 5})  # replaced, not merged
    assert cron["labels"] == {"team": "payments", APP_LABEL: "billing"}
    assert interval["labels"] == {"team": "payments", "tier": "1", APP_LABEL: "billing"}


@pytest.mark.parametrize("defaults, field", [
    ({"retries": 3}, "retries"), ({"cron": "0 2 * * *"}, "cron"), ({"every_s": 5}, "every_s"),
    ({"queue": "bad queue"}, "queue"), ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ({"timezone": "Mars/Olympus"}, "schedule.timezone"), ({"labels": {APP_LABEL: "x"}}, f"labels.{APP_LABEL}"),
])
def test_a_bad_app_default_is_refused_when_the_app_is_made(defaults, field):
    with pytest.raises(DeclarationError) as ei:
        App("billing", **defaults)
    assert ei.value.field == field


def test_app_names_follow_the_job_name_rules():
    with pytest.raises(DeclarationError) as ei:
        App("no spaces")
    assert ei.value.field == "name"
    # A name is also the value of the worker label its jobs are placed on: at most 63 characters,
    # unless its jobs are not placed.
    with pytest.raises(DeclarationError) as ei:
        App("a" * 64)
    assert ei.value.field == "name" and "placement=None" in ei.value.message
    assert App("a" * 64, placement=None).name == "a" * 64


def test_placement_is_the_apps_label_with_what_a_job_adds_and_none_opts_out():
    app = App("billing", placement={"labels": {"region": "eu"}})
    app.job("placed", every_s=60, misfire="skip")(sdk_targets.report)
    app.job("gpu", every_s=60, misfire="skip", placement={"labels": {"pool": "gpu"}})(sdk_targets.other)
    app.job("anywhere", every_s=60, misfire="skip", placement=None)(sdk_targets.areport)
    specs = {n: d.spec for n, d in app.jobs.items()}
    assert specs["placed"]["placement"] == {"labels": {APP_LABEL: "billing", "region": "eu"}}
    assert specs["gpu"]["placement"] == {"labels": {APP_LABEL: "billing", "pool": "gpu"}}  # replaces the default
    assert "placement" not in specs["anywhere"] and "placement" not in app.jobs["anywhere"].raw
    assert specs["anywhere"]["labels"] == {APP_LABEL: "billing"}  # still this app's job (sync --prune)
    plain = App("plain", placement=None)
    plain.job("j", every_s=60, misfire="skip")(sdk_targets.report)
    assert "placement" not in plain.jobs["j"].spec


# ------------------------------------------------------------------ handlers and Context
SLOT_MS = 1_800_000_000_000


def _run_context(job="j", attempt=1):
    return RunContext(run_id=f"{job}@{SLOT_MS}", job=job, slot_ms=SLOT_MS, attempt=attempt, fencing_token=42,
                      payload={"p": 1})


def test_a_sync_handler_gets_a_context_from_the_python_executors_run_context():
    app = App("billing")
    handler = app.job("j", every_s=60, misfire="skip")(sdk_targets.report)
    decl = app.jobs["j"]
    assert decl.is_async is False and decl.function is sdk_targets.report
    assert handler.__wrapped__ is sdk_targets.report and handler.__qualname__ == "report"
    assert not inspect.iscoroutinefunction(handler)
    out = handler(_run_context())
    assert out == {"job": "j", "slot": "2027-01-15T08:00:00Z", "token": 42, "logger": "raftsched.job.j"}
    assert app.handler_for("sdk_targets:report") is handler
    assert app.run(_run_context()) == out
    with pytest.raises(KeyError):
        app.handler_for("sdk_targets:nope")
    with pytest.raises(KeyError):
        app.run(_run_context(job="other-job"))


def test_an_async_handler_stays_a_coroutine_function_and_is_recorded_as_async():
    app = App("billing")
    handler = app.job("a", every_s=60, misfire="skip")(sdk_targets.areport)
    assert app.jobs["a"].is_async is True
    assert inspect.iscoroutinefunction(handler)
    assert asyncio.run(handler(_run_context(job="a", attempt=3))) == {"job": "a", "attempt": 3, "worker": None}
    assert asyncio.run(app.run(_run_context(job="a"), worker="w-1")) == {"job": "a", "attempt": 1, "worker": "w-1"}


def test_context_fields_and_builders():
    grant = {"id": "j@1", "job": "j", "slot": SLOT_MS, "attempt": 2, "token": 9, "payload": [1], "queue": "q"}
    ctx = Context.from_grant(grant, worker="w-7")
    assert (ctx.run_id, ctx.job, ctx.attempt, ctx.fencing_token, ctx.payload, ctx.worker) == \
           ("j@1", "j", 2, 9, [1], "w-7")
    assert ctx.slot == datetime(2027, 1, 15, 8, 0, tzinfo=timezone.utc) and ctx.slot.tzinfo is not None
    assert ctx.slot_iso == "2027-01-15T08:00:00Z" and ctx.log.name == "raftsched.job.j"
    rc = _run_context()
    assert Context.of(rc).env() == rc.env() and Context.of(rc).headers() == rc.headers()
    rc.worker_id = "w-9"  # the python executor's RunContext names the worker too
    assert Context.of(rc).worker == "w-9" and Context.of(rc).env()["RAFTSCHED_WORKER_ID"] == "w-9"
    assert Context.of(ctx) is ctx
    with pytest.raises(TypeError):
        Context.of(object())


def test_the_example_app_declares_its_jobs():
    sys.path.insert(0, str(__import__("procs").REPO / "examples"))
    try:
        mod = importlib.import_module("nightly_report")
    finally:
        sys.path.pop(0)
    app = mod.app
    assert app.name == "reports" and list(app.jobs) == ["nightly-report", "refresh-dashboard"]
    nightly, dash = app.jobs["nightly-report"], app.jobs["refresh-dashboard"]
    assert nightly.spec["misfire"] == {"policy": "fire_all", "grace_s": 300, "max_catchup": 7}
    assert nightly.spec["retry"]["max_attempts"] == 3 and nightly.target == "nightly_report:nightly_report"
    assert dash.is_async and dash.spec["overlap"] == {"policy": "forbid"}


def test_the_nightly_pipeline_example_declares_its_deadlines_and_who_is_told():
    """examples/nightly_pipeline.py is the pipeline the README points at: three steps in order,
    deadlines on the scheduled step and on the last (a child: counted from its night), and every step
    routed to the sink ``ops`` (valid specs: the declaration is validated as the API would)."""
    from raftsched.core import pipelines
    app = load_app("examples.nightly_pipeline:app")
    views = app.views()
    assert pipelines.parents_first(app.specs()) == ["extract", "transform", "report"]
    assert views["extract"]["deadline"] == {"start_within_s": 900, "succeed_within_s": 7200}
    assert views["report"]["deadline"] == {"succeed_by": "06:00", "max_since_success_s": 26 * 3600}
    for name in ("extract", "transform", "report"):
        (route,) = views[name]["notify"]
        assert route["sink"] == "ops" and {"run.dead", "slot.missed", "deadline.missed"} <= set(route["on"])
