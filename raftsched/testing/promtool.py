"""Prometheus's ``promtool``, for the tests that check ``/metrics`` and the alert rules in
docs/operations.md (``promtool check metrics``, ``promtool check rules``).

Found on ``PATH`` or in the virtualenv's ``bin`` (``sys.prefix``); otherwise taken from Debian's
``prometheus`` package: ``apt-get download prometheus`` into a temporary directory, ``dpkg -x``,
and only ``usr/bin/promtool`` copied into the virtualenv's ``bin``. The Prometheus service is
never installed nor started. scripts/test.sh fetches it before the tests run
(``python -m raftsched.testing.promtool``); a test run alone fetches it the same way.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The Debian package that holds promtool.
PACKAGE = "prometheus"


def _venv_bin() -> Path:
    return Path(sys.prefix) / "bin"


def find() -> str | None:
    """promtool's path when it is already here, else None."""
    on_path = shutil.which("promtool")
    if on_path:
        return on_path
    local = _venv_bin() / "promtool"
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


def fetch(timeout_s: float = 300.0) -> tuple[str | None, str]:
    """promtool's path, fetched from Debian's package when it is not here yet, and what was
    done; ``(None, why)`` when it cannot be had (no apt-get or dpkg, the download failed)."""
    found = find()
    if found:
        return found, f"found at {found}"
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            return None, f"promtool is not installed and there is no {tool} to fetch Debian's {PACKAGE} package"
    with tempfile.TemporaryDirectory(prefix="raftsched-promtool-") as tmp:
        # apt-get download runs as the user _apt where it can: the directory must be its to write.
        os.chmod(tmp, 0o777)
        p = subprocess.run(["apt-get", "download", "-q", PACKAGE], cwd=tmp, capture_output=True, text=True,
                           timeout=timeout_s)
        debs = sorted(Path(tmp).glob(f"{PACKAGE}_*.deb"))
        if p.returncode != 0 or not debs:
            return None, f"apt-get download {PACKAGE} failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}"
        out = Path(tmp) / "x"
        p = subprocess.run(["dpkg", "-x", str(debs[0]), str(out)], capture_output=True, text=True, timeout=timeout_s)
        binary = out / "usr" / "bin" / "promtool"
        if p.returncode != 0 or not binary.is_file():
            return None, f"dpkg -x {debs[0].name} gave no usr/bin/promtool: {p.stderr.strip()[-400:]}"
        dest = _venv_bin() / "promtool"
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name("promtool.part")
        shutil.copyfile(binary, part)
        os.chmod(part, 0o755)
        os.replace(part, dest)  # atomic: a parallel run sees the whole binary or none
    return str(dest), f"extracted from Debian's {PACKAGE} package ({debs[0].name}) into {dest}"


def run(args: list[str], stdin: str | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """``promtool ARGS`` (fetched first if needed). :raises RuntimeError: no promtool."""
    path, why = fetch()
    if path is None:
        raise RuntimeError(why)
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=timeout_s)


if __name__ == "__main__":
    got, what = fetch()
    print(f"promtool: {what}")
    sys.exit(0 if got else 1)
