"""recheck.py keeps what run.py recorded of a failed harness: a run whose harness failed proves
nothing valid, however its checkers judge what was collected."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-style"))

import recheck  # noqa: E402


def test_a_recheck_keeps_the_runs_harness_error_and_its_verdict_at_best_unknown(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"valid": "unknown", "harness_error": "Traceback: boom"}))
    results = {"valid": "valid", "checkers": {}}
    assert recheck.carry_harness_error(results, tmp_path) == "Traceback: boom"
    assert results["valid"] == "unknown" and results["harness_error"] == "Traceback: boom"
    results = {"valid": "invalid", "checkers": {}}
    recheck.carry_harness_error(results, tmp_path)
    assert results["valid"] == "invalid", "an invalid verdict stays invalid"
    (tmp_path / "results.json").write_text(json.dumps({"valid": "valid"}))
    results = {"valid": "valid", "checkers": {}}
    assert recheck.carry_harness_error(results, tmp_path) is None and results == {"valid": "valid", "checkers": {}}
    (tmp_path / "results.json").unlink()
    assert recheck.carry_harness_error(results, tmp_path) is None
