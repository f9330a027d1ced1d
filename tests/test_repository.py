"""The repository itself (issue 21): no large file is tracked, and what the README's flows leave in
the tree is ignored.

A file over 1 MiB in git is paid for by every clone for ever, even after it is deleted; a binary
that a script needs comes from its package index instead (py-spy, for example: ``pip install
py-spy``, see docs/benchmarks.md). Run from a git checkout; skipped, saying why, where there is
no git (an unpacked sdist, a container without the binary).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The largest file git may track.
TRACKED_BYTES_MAX = 1 << 20


def git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], input=stdin, capture_output=True, check=True,
                          timeout=60).stdout


@pytest.fixture(scope="module")
def tracked() -> dict[str, int]:
    """Every path in git's index and the size of its blob, in bytes (what a commit would hold,
    whatever the working tree has)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    try:
        inside = git("rev-parse", "--is-inside-work-tree").strip() == b"true"
    except subprocess.CalledProcessError:
        inside = False
    if not inside:
        pytest.skip(f"{ROOT} is not a git checkout: no tracked files to check")
    entries = []  # (blob id, path); "<mode> <id> <stage>\t<path>", NUL-terminated
    for rec in git("ls-files", "--stage", "-z").split(b"\0"):
        if rec:
            meta, path = rec.split(b"\t", 1)
            mode, oid, _ = meta.split(b" ")
            if mode != b"160000":  # a submodule's commit is not a blob of this repository
                entries.append((oid, path.decode("utf-8", "surrogateescape")))
    assert entries, "git ls-files listed nothing"
    sizes = git("cat-file", "--batch-check=%(objectsize)", stdin=b"".join(o + b"\n" for o, _ in entries)).split()
    assert len(sizes) == len(entries)
    return {path: int(size) for (_, path), size in zip(entries, sizes)}


def test_no_tracked_file_over_1_mib(tracked):
    big = {path: size for path, size in tracked.items() if size > TRACKED_BYTES_MAX}
    assert not big, (f"files over {TRACKED_BYTES_MAX} bytes are tracked: {big}; "
                     "take them out of git (git rm --cached) and fetch them from where they come from")


#: What the README's flows and the default outputs of the scripts leave in the tree, which git must
#: not offer to commit: scripts/cluster.sh's state, the SDK flow's database (examples/nightly_report.py
#: run from examples/, with SQLite's side files), the fault harness's store and the benchmarks' results.
LEFT_BEHIND = (".raftsched/token", ".raftsched/node-1/node.log", "examples/reports.db", "examples/reports.db-journal",
               "examples/reports.db-wal", "examples/reports.db-shm", "store/20261201T000000-7/verdict.txt",
               "bench-results.json", "bench-results.png", "bench-raft-crypto.json", "examples/__pycache__/x.pyc")


def test_what_the_flows_leave_behind_is_ignored(tracked):
    out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin", "-z"],
                         input="\0".join(LEFT_BEHIND).encode(), capture_output=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr.decode()
    ignored = set(out.stdout.decode().split("\0")) - {""}
    assert ignored == set(LEFT_BEHIND), f"not ignored by .gitignore: {sorted(set(LEFT_BEHIND) - ignored)}"
