"""Suite-wide collection rules.

``wallclock``: tests that read the wall clock or start processes that do (real nodes, the CLI,
the clients). scripts/test.sh runs them a second time with the wall clock moved years ahead
(scripts/anyyear/), so that a test bound to today's date fails at once rather than on the day it
starts to. The mark is given by what a test module uses, so a new module is covered without
anyone remembering to mark it; the pure core tests (FakeClock, FakeRaft) never need it.
"""
from __future__ import annotations

import pytest

#: What in a test module's source means it depends on the wall clock.
_WALL_CLOCK_SIGNS = ("LocalCluster", "Cluster(", "subprocess", "Popen", "SystemClock", "time.time(",
                     "datetime.now(", "datetime.utcnow(", "run_node(", "RaftNode(")


def pytest_collection_modifyitems(config, items):
    seen: dict[str, bool] = {}
    for item in items:
        path = str(item.fspath)
        if path not in seen:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                text = ""
            seen[path] = any(sign in text for sign in _WALL_CLOCK_SIGNS)
        if seen[path]:
            item.add_marker(pytest.mark.wallclock)
