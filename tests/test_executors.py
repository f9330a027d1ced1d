"""The executor contract (DESIGN.md section 6) whatever the type: what a run sees of its
identity, and specs that cannot run. tests/test_executors_shell.py, _http.py and _python.py hold
each executor's own tests.
"""
from __future__ import annotations

import json

import exec_targets
from executor_helpers import PAYLOAD, SLOT_MS, ctx, py, run
from raftsched.worker.executors import ALL_TYPES, Outcome, RunContext, execute


def test_slot_iso_env_and_headers():
    c = ctx()
    assert c.slot_iso == "2026-12-01T02:00:00Z"
    assert RunContext("r", "j", SLOT_MS + 250, 1, 1, None).slot_iso == "2026-12-01T02:00:00.250Z"
    assert c.env() == {
        "RAFTSCHED_RUN_ID": "r-1", "RAFTSCHED_JOB": "nightly-report",
        "RAFTSCHED_SLOT": "2026-12-01T02:00:00Z", "RAFTSCHED_ATTEMPT": "2",
        "RAFTSCHED_FENCING_TOKEN": "17", "RAFTSCHED_PAYLOAD": c.env()["RAFTSCHED_PAYLOAD"],
    }
    assert json.loads(c.env()["RAFTSCHED_PAYLOAD"]) == PAYLOAD
    assert c.headers() == {
        "X-Raftsched-Run-Id": "r-1", "X-Raftsched-Job": "nightly-report",
        "X-Raftsched-Slot": "2026-12-01T02:00:00Z", "X-Raftsched-Attempt": "2",
        "X-Raftsched-Fencing-Token": "17",
    }


def test_the_worker_that_holds_the_lease_is_named_when_known():
    c = RunContext("r", "j", SLOT_MS, 1, 5, None, worker_id="gpu-7/4242")
    assert c.env()["RAFTSCHED_WORKER_ID"] == "gpu-7/4242"
    assert c.headers()["X-Raftsched-Worker"] == "gpu-7/4242"
    assert "RAFTSCHED_WORKER_ID" not in ctx().env() and "X-Raftsched-Worker" not in ctx().headers()


def test_disallowed_type_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    out = run(execute({"type": "shell", "argv": ["touch", str(marker)]}, ctx(), 10,
                      allowed_types=frozenset({"http", "python"})))
    assert out == Outcome(ok=False, error="executor type 'shell' is not allowed on this worker",
                          output="", duration_ms=out.duration_ms)
    assert not marker.exists()
    out = run(execute(py("record_sync"), ctx("py-refused"), 10, allowed_types=frozenset({"shell"})))
    assert (out.ok, out.error) == (False, "executor type 'python' is not allowed on this worker")
    assert "py-refused" not in exec_targets.RECORDED


def test_malformed_specs_fail_without_raising():
    for spec in (None, {}, {"type": "ftp"}, {"type": "shell"}, {"type": "shell", "argv": []},
                 {"type": "http"}, {"type": "http", "url": "not a url"}, {"type": "python"}):
        out = run(execute(spec, ctx(), 5, allowed_types=frozenset({"shell", "http", "python", "ftp"})))
        assert isinstance(out, Outcome) and not out.ok and out.error, (spec, out)


def test_all_types_are_the_types_a_job_may_name():
    from raftsched.core.model import EXECUTOR_TYPES

    assert ALL_TYPES == frozenset(EXECUTOR_TYPES) == frozenset({"shell", "http", "python"})
