"""The measurement scripts behind one entry point: the sources of the figures the docs quote.

    .venv/bin/python scripts/measure                      # what there is: one line each
    .venv/bin/python scripts/measure NAME [ARGS...]       # run one; NAME --help gives its options
    .venv/bin/python scripts/measure smoke [NAME...]      # each (or the named) in its smoke mode

A doc that quotes a figure gives the command that produced it, in this form, so that the figure
can be taken again. ``smoke`` runs every script at tiny sizes (seconds each, each in its own
process, in a temporary directory, never more than one at a time) and fails if one fails or does
not print what it measures: ``scripts/test.sh`` runs it as its ``measure-smoke`` step, so that a
script that rots fails there, not on the day someone needs its figure. Smoke figures mean
nothing; the sizes the docs quote are each script's defaults or are given in the doc.

Why a package and not a subcommand of ``scripts/bench.py``: the benchmark is one fixed run of
scenarios against clusters, with a command line, a JSON result and exit rules that
``scripts/test.sh`` and the docs depend on. These are separate probes, most of them in one
process, each with its own options and output, that the docs cite one by one; a subcommand
would have put as many command lines inside the benchmark's. They share the benchmark's helpers
where they start clusters (``bench-register`` uses ``scripts/benchlib``).

Each module is one script, unchanged in what it measures: ``main(argv) -> int`` and ``SMOKE``,
the runs of its smoke mode. Nothing here imports raftsched: a script imports it when it runs,
after putting the code it measures first on ``sys.path`` (``profile-apply CODE_DIR`` measures
another checkout).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: command -> module, in the order ``smoke`` runs them (the in-process ones first, then the
#: ones that start processes).
COMMANDS = {
    "misfire-walkthrough": "misfire_walkthrough",
    "profile-apply": "profile_apply",
    "profile-fire": "profile_fire",
    "profile-backfill": "profile_backfill",
    "due-stall": "due_stall",
    "reaper": "reaper",
    "gc-pauses": "gc_pauses",
    "pipeline-fanout": "pipeline_fanout",
    "bench-auth": "bench_auth",
    "bench-notify": "bench_notify",
    "cron-libraries": "cron_libraries",
    "bench-raft-crypto": "bench_raft_crypto",
    "sdk-isolation": "sdk_isolation",
    "run-isolation": "run_isolation",
    "disk-sync": "disk_sync",
    "sync-timing": "sync_timing",
    "bench-register": "bench_register",
    "mass-reput": "mass_reput",
    "heartbeats": "heartbeats",
}

#: The longest one smoke run may take before it counts as failed.
SMOKE_RUN_TIMEOUT_S = 180


@dataclasses.dataclass(frozen=True)
class Smoke:
    """One run of a script's smoke mode: its arguments (``{tmp}`` is the smoke's temporary
    directory), extra environment, and a text its output must contain (the figure it measures)."""

    args: tuple[str, ...]
    expect: str
    env: tuple[tuple[str, str], ...] = ()


def module(command: str):
    """The module of ``command``. :raises KeyError: no such command."""
    return importlib.import_module(f"{__name__}.{COMMANDS[command]}")


def code_first(argv: list[str]) -> list[str] | None:
    """An in-process probe's ``[CODE_DIR] ARGS...``: CODE_DIR (its first argument when that is
    not a number; default this checkout) put first on sys.path, to measure another checkout, and
    the rest returned; None for ``-h``/``--help`` (the probe prints its docstring)."""
    args = list(argv)
    if args and args[0] in ("-h", "--help"):
        return None
    sys.path.insert(0, args.pop(0) if args and not args[0].isdigit() else ROOT)
    return args


def summary(command: str, width: int = 100) -> str:
    """The first paragraph of a command's docstring, on one line of at most ``width``
    characters, read without importing it (importing would import raftsched)."""
    path = os.path.join(HERE, COMMANDS[command] + ".py")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find('"""')
    if start < 0:
        return ""
    para = " ".join(text[start + 3:].strip().split("\n\n")[0].split()).rstrip(":")
    return para if len(para) <= width else para[:width - 3].rsplit(" ", 1)[0] + " ..."


def run(command: str, argv: list[str]) -> int:
    """Run one script, in this process. ``-h``/``--help`` prints its docstring, unless it reads
    its options with argparse (``ARGPARSE``), which then lists them."""
    mod = module(command)
    if argv[:1] in (["-h"], ["--help"]) and not getattr(mod, "ARGPARSE", False):
        print(mod.__doc__.strip())
        return 0
    rc = mod.main(argv)
    return 0 if rc is None else rc


def smoke(commands: list[str], out=sys.stdout) -> int:
    """Every smoke run of ``commands``, one after the other, each in its own process with this
    interpreter, in one temporary directory (the working directory of each). Returns 0 when
    all passed: exit status 0 and the expected text in their output."""
    failed = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftsched-measure-smoke-") as tmp:
        for command in commands:
            for _i, sm in enumerate(module(command).SMOKE):
                args = [a.replace("{tmp}", tmp) for a in sm.args]
                env = {**os.environ, **dict(sm.env)}
                label = " ".join([f"{k}={v}" for k, v in sm.env] + [command] + list(sm.args))
                t0 = time.monotonic()
                try:
                    p = subprocess.run([sys.executable, HERE, command, *args], cwd=tmp, env=env, capture_output=True,
                                       text=True, timeout=SMOKE_RUN_TIMEOUT_S)
                    rc, text = p.returncode, p.stdout + p.stderr
                    why = (f"exit {rc}" if rc else
                           None if sm.expect in p.stdout else f"no {sm.expect!r} in its output")
                except subprocess.TimeoutExpired as e:
                    text = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
                    why = f"timed out after {SMOKE_RUN_TIMEOUT_S} s"
                dt = time.monotonic() - t0
                if why is None:
                    print(f"measure smoke: {label}: ok ({dt:.1f} s)", file=out, flush=True)
                else:
                    failed.append(label)
                    print(f"measure smoke: {label}: FAILED, {why} ({dt:.1f} s); its output ends:", file=out)
                    print("\n".join("    " + line for line in text.splitlines()[-40:]), file=out, flush=True)
    total = time.monotonic() - t_all
    if failed:
        print(f"measure smoke: {len(failed)} failed in {total:.1f} s: {'; '.join(failed)}", file=out)
        return 1
    print(f"measure smoke: {len(commands)} scripts passed in {total:.1f} s", file=out)
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.split("\n\n")[1].rstrip())
        print()
        width = max(map(len, COMMANDS))
        for command in COMMANDS:
            print(f"  {command:<{width}}  {summary(command)}")
        return 0
    if argv[0] == "smoke":
        names = argv[1:] or list(COMMANDS)
        unknown = [n for n in names if n not in COMMANDS]
        if unknown:
            print(f"measure: no such script: {', '.join(unknown)} (see: scripts/measure list)", file=sys.stderr)
            return 2
        return smoke(names)
    if argv[0] not in COMMANDS:
        print(f"measure: no such script: {argv[0]} (see: scripts/measure list)", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])
