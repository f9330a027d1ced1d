"""The repository itself: no large file is tracked (issue 21).

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
