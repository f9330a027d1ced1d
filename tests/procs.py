"""Real node processes for integration tests, under the names the test files import: the harness
itself is the package's (raftsched/testing/), shared with jepsen-style/ and the benchmark."""
from __future__ import annotations

from pathlib import Path

from raftsched.testing.cluster import LocalCluster as Cluster, http
from raftsched.testing.procs import free_ports, wait_for

REPO = Path(__file__).resolve().parent.parent

__all__ = ["REPO", "Cluster", "free_ports", "http", "wait_for"]
