"""docs/misfire.md is generated from the code; this fails if it drifted."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    spec = importlib.util.spec_from_file_location("walk", ROOT / "scripts" / "measure" / "misfire_walkthrough.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_doc_matches_generator():
    text = load().render()
    assert (ROOT / "docs" / "misfire.md").read_text() == text, \
        "docs/misfire.md is stale: run .venv/bin/python scripts/measure misfire-walkthrough > docs/misfire.md"


def test_walkthrough_numbers():
    text = load().render()
    # every-30s, fire_all: 01:59:00, 01:59:30, 02:00:00 missed and run, 02:00:00 ... none recorded
    assert "### `every-30s` (fire_all)\n\nSlots due: 3." in text
    # every-minute, fire_once: 01:59 coalesced, 02:00 run
    assert "| 2026-12-01T02:00:00Z | a run | 15 s |" in text
    assert "recorded: 2026-12-01T01:59:00Z (1 slot) as `coalesced`" in text
    # nightly, skip: 02:00 recorded as skipped, next is tomorrow
    assert "recorded: 2026-12-01T02:00:00Z (1 slot) as `skipped`, reason `misfire`" in text
    assert "next slot: 2026-12-02T02:00:00Z." in text
