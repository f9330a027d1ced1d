#!/usr/bin/env python3
"""Run the checkers again on a stored run: ``recheck.py store/<time>-<seed> [--write]``.

Rebuilds the checkers' input from the files run.py wrote (schedule.json, history.jsonl,
sink.jsonl, reads.jsonl, final-states.json, monitor.jsonl, run-data.json) and prints the verdict;
``--write`` also rewrites results.json, verdict.txt and timeline.png. For working on a checker
without running the cluster again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checker  # noqa: E402


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def load(run_dir: Path) -> dict:
    data = json.loads((run_dir / "run-data.json").read_text()) if (run_dir / "run-data.json").exists() else {}
    data["schedule"] = json.loads((run_dir / "schedule.json").read_text())
    data["history"] = _jsonl(run_dir / "history.jsonl")
    data["sink"] = _jsonl(run_dir / "sink.jsonl")
    if (run_dir / "events.jsonl").exists():  # the notifications receiver's log (older runs have none)
        data["events"] = _jsonl(run_dir / "events.jsonl")
    data["monitor"] = _jsonl(run_dir / "monitor.jsonl")
    data["periodic"] = [r for r in _jsonl(run_dir / "reads.jsonl") if r.get("phase") == "periodic"]
    if "faults" not in data:  # older runs: rebuild the nemesis log from the history
        faults: dict[int, dict] = {}
        for h in data["history"]:
            if h.get("process") == "nemesis" and h.get("fault") and h["type"] == "info":
                f = faults.setdefault(h["fault"]["id"], {"id": h["fault"]["id"], "kind": h["fault"]["kind"], "fault": h["fault"]})
                if h["f"] == "start":
                    f.update(start_ms=h["t_ms"], nodes=h.get("nodes"))
                else:
                    f["end_ms"] = h["t_ms"]
        data["faults"] = sorted(faults.values(), key=lambda f: f["id"])
    if "times" not in data:
        heal = [h["t_ms"] for h in data["history"] if h.get("f") == "heal"]
        start = [h["t_ms"] for h in data["history"] if h.get("process") == "harness" and h.get("f") == "start"]
        data["times"] = {"t0_ms": start[0] if start else None, "heal_ms": heal[0] if heal else None}
    data["reads"] = json.loads((run_dir / "final-states.json").read_text()) if (run_dir / "final-states.json").exists() else {}
    return data


def carry_harness_error(results: dict, run_dir: Path) -> str | None:
    """The harness failure the run recorded (results.json's ``harness_error``), kept in
    ``results`` with the verdict run.py gave it (at best unknown: a run whose harness failed
    proves nothing valid), or None. Rechecking never forgets it, nor ``--write`` overwrites it."""
    try:
        before = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None
    error = before.get("harness_error") if isinstance(before, dict) else None
    if error:
        results["harness_error"] = error
        results["valid"] = "unknown" if results["valid"] != "invalid" else "invalid"
    return error


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    run_dir = Path(argv[0])
    data = load(run_dir)
    results = checker.check_all(data)
    harness_error = carry_harness_error(results, run_dir)
    text = checker.render_verdict(results, data, run_dir)
    if harness_error:
        text += "\nthe run's harness failed (results.json, harness_error): the verdict is at best unknown\n"
    print(text)
    if "--write" in argv:
        (run_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (run_dir / "verdict.txt").write_text(text)
        import timeline
        timeline.plot(data, results, run_dir / "timeline.png")
    if harness_error:
        return 2
    return 1 if results["valid"] == "invalid" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
