"""scripts/measure/: every measurement script is behind the one entry point with a smoke mode, and
every command or script path the docs and the code give for a figure exists.

The smoke runs themselves are scripts/test.sh's measure-smoke step (``scripts/measure smoke``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import measure  # noqa: E402

#: Where commands and script paths are quoted: the docs, the README, the code's comments.
QUOTED_IN = ["README.md", "docs", "scripts", "tests", "raftsched", "examples", "jepsen-style"]
#: Paths quoted on purpose though they are gone, (file, path): a script named as the one an option
#: replaced.
KNOWN_GONE = {("docs/benchmarks.md", "scripts/bench_e2e.py")}


def quoted_files():
    for top in QUOTED_IN:
        p = ROOT / top
        files = [p] if p.is_file() else [f for f in p.rglob("*") if f.suffix in (".md", ".py", ".sh", ".toml")]
        for f in files:
            if "__pycache__" not in f.parts and f != Path(__file__).resolve():
                yield f


def test_every_script_is_a_command_with_a_main_and_a_smoke_mode():
    files = {f.stem for f in (ROOT / "scripts" / "measure").glob("*.py")} - {"__init__", "__main__"}
    assert set(measure.COMMANDS.values()) == files
    for command in measure.COMMANDS:
        mod = measure.module(command)
        assert callable(mod.main), command
        assert mod.SMOKE and all(isinstance(s, measure.Smoke) and s.expect for s in mod.SMOKE), command
        assert measure.summary(command), f"{command} has no docstring"


def test_no_measurement_script_is_left_loose_in_scripts():
    # Not measurements: the benchmark, the schemathesis step's runner and its hooks, the script that
    # makes docs/ui.md's screenshots.
    tools = {"bench.py", "fuzz_api.py", "fuzz_hooks.py", "ui_screenshots.py"}
    loose = sorted(f.name for f in (ROOT / "scripts").glob("*.py") if f.name not in tools)
    assert loose == [], f"put measurement scripts in scripts/measure/ (with a smoke mode): {loose}"


def test_every_quoted_measure_command_exists():
    bad = []
    for f in quoted_files():
        for m in re.finditer(r"scripts/measure ([a-z][\w-]*)", f.read_text(encoding="utf-8", errors="replace")):
            if m.group(1) not in measure.COMMANDS and m.group(1) not in ("smoke", "list"):
                bad.append((str(f.relative_to(ROOT)), m.group(0)))
    assert bad == []


def test_every_quoted_script_path_exists():
    bad = set()
    for f in quoted_files():
        for m in re.finditer(r"\bscripts/[\w./-]+\.(?:py|sh|c)\b", f.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / m.group(0)).exists():
                bad.add((str(f.relative_to(ROOT)), m.group(0)))
    assert bad - KNOWN_GONE == set()


def test_the_list_names_every_command(capsys):
    assert measure.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {command}  " in out for command in measure.COMMANDS), out


def test_help_of_a_script_without_options_prints_its_docstring_and_runs_nothing(capsys):
    """profile-apply reads its arguments by position: --help would otherwise be its CODE_DIR."""
    assert measure.main(["profile-apply", "--help"]) == 0
    assert capsys.readouterr().out.startswith("Apply cost per slot and per run")
