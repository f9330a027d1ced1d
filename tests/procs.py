"""Real node processes for integration tests, under the names the test files import: the harness
itself is the package's (raftsched/testing/), shared with jepsen-style/ and the benchmark."""
from __future__ import annotations

from pathlib import Path

from raftsched.testing.cluster import LocalCluster as Cluster, http
from raftsched.testing.procs import free_ports, wait_for

REPO = Path(__file__).resolve().parent.parent


def running_cluster(tmp, **kw):
    """A started Cluster that has a leader, stopped by its PIDs when the generator is closed:
    the body of a module-scoped fixture, ``yield from running_cluster(tmp, n=1)``."""
    c = Cluster(tmp, **kw)
    c.start()
    try:
        c.wait_leader(30)
        yield c
    finally:
        c.stop()


__all__ = ["REPO", "Cluster", "free_ports", "http", "running_cluster", "wait_for"]
