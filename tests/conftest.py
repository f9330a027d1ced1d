"""Suite-wide collection rules.

``wallclock``: tests that read the wall clock or start processes that do (real nodes, the CLI,
the clients). scripts/test.sh runs them a second time with the wall clock moved years ahead
(scripts/anyyear/), so that a test bound to today's date fails at once rather than on the day it
starts to. The mark is given by what a test module uses, so a new module is covered without
anyone remembering to mark it; the pure core tests (FakeClock, FakeRaft) never need it.
"""
from __future__ import annotations

import re

import pytest

#: What in a test module's source means it depends on the wall clock: real node processes (the
#: harness's clusters), other processes, the system clock read directly. Not the replication
#: layer's in-process RaftNodes over a FakeState (tests/replication_helpers.py): replication
#: compares the members' wall clocks with each other (message ages, the clock guard), never with
#: a calendar date, and every member's clock moves alike in the any-year run.
_WALL_CLOCK_SIGNS = re.compile(
    r"LocalCluster|running_cluster|from procs import [^\n]*\bCluster\b|subprocess|Popen|SystemClock"
    r"|time\.time\(|datetime\.now\(|datetime\.utcnow\(|run_node\(")


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
            seen[path] = _WALL_CLOCK_SIGNS.search(text) is not None
        if seen[path]:
            item.add_marker(pytest.mark.wallclock)


@pytest.fixture(autouse=True)
def _cli_output_format_reset():
    """The CLI's ``-o`` is a module global (cli_output.set_format), which a test that runs the
    CLI's main() leaves set: reset after every test, so that a later one in the same process
    sees the default (table on a terminal, JSON in a pipe) whatever ran before it."""
    yield
    from raftsched import cli_output
    cli_output.set_format(None)
