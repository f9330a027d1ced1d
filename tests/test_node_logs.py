"""The node's log is bounded (issue 22, section 3, item 9; node/logs.py): at most so many lines
of one kind a minute, however many malformed requests a client sends, and with ``--log-file`` a
rotated file whose size is bounded, stdout and stderr following it."""
from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

from raftsched.node import limits
from raftsched.node.logs import RepeatLimiter, log_file_handler

from procs import REPO, Cluster, wait_for


def _record(msg: str, *args, name: str = "aiohttp.server", level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_at_most_a_burst_of_one_kind_a_window_and_the_next_says_how_many_were_left_out():
    now = [0.0]
    f = RepeatLimiter(burst=3, window_s=60, clock=lambda: now[0])
    passed = [f.filter(_record("Error handling request: %s", i)) for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert f.filter(_record("another kind"))  # kinds are counted apart
    assert f.filter(_record("Error handling request: %s", 0, level=logging.WARNING))
    now[0] = 60.0
    r = _record("Error handling request: %s", 10)
    assert f.filter(r)
    assert r.getMessage() == "Error handling request: 10 [7 more like this not logged: at most 3 every 60 s]"
    r = _record("Error handling request: %s", 11)
    assert f.filter(r) and r.getMessage() == "Error handling request: 11"
    assert f.suppressed == 7


def test_the_kinds_remembered_are_bounded():
    f = RepeatLimiter(burst=1, window_s=60, clock=lambda: 0.0, kinds_max=5)
    for i in range(100):
        assert f.filter(_record(f"line {i}"))
    assert len(f._kinds) == 5


def test_a_log_file_is_rotated_and_bounded(tmp_path):
    path = tmp_path / "node.log"
    h = log_file_handler(str(path), max_bytes=2000, keep=2)
    lg = logging.getLogger("test_node_logs.rotation")
    lg.propagate = False
    lg.addHandler(h)
    try:
        for i in range(500):
            lg.warning("line %d %s", i, "x" * 50)
    finally:
        lg.removeHandler(h)
        h.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.log", "node.log.1", "node.log.2"]
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    assert "line 499" in path.read_text()


_CHILD = """
import logging, sys
from raftsched.node.logs import log_file_handler
h = log_file_handler(sys.argv[1], max_bytes=2000, keep=1)
logging.basicConfig(level=logging.INFO, handlers=[h])
for i in range(200):
    logging.getLogger("x").info("line %d %s", i, "y" * 50)
print("stray stdout after the rotations", flush=True)
print("stray stderr after the rotations", file=sys.stderr, flush=True)
"""


def test_stdout_and_stderr_follow_the_log_file_when_they_were_it(tmp_path):
    """As cluster.sh starts a node (both appended to node.log, and --log-file node.log): what
    bypasses logging (a traceback before logging starts, a fatal error's dump) lands in the
    current file, not in a rotated one."""
    path = tmp_path / "node.log"
    with open(path, "ab") as out:
        p = subprocess.run([sys.executable, "-c", _CHILD, str(path)], stdout=out, stderr=out, cwd=REPO, timeout=60)
    assert p.returncode == 0
    text = path.read_text()
    assert "stray stdout after the rotations" in text and "stray stderr after the rotations" in text
    assert "stray" not in (tmp_path / "node.log.1").read_text()


def test_a_node_logs_a_bounded_number_of_lines_however_many_malformed_requests_it_gets(tmp_path):
    """300 requests the HTTP parser refuses, each of which aiohttp logs: the node's log has at
    most a burst of them (two, if the test straddles a window)."""
    c = Cluster(tmp_path, n=1)
    c.start()
    try:
        c.wait_leader(30)
        t0 = time.monotonic()
        for _ in range(300):
            with socket.create_connection(("127.0.0.1", c.api_ports[0]), timeout=10) as s:
                s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
                assert s.recv(100).split(b" ")[1] == b"400"
        wait_for(lambda: "more like this not logged" in c.log_path(0).read_text(errors="replace")
                 or c.log_path(0).read_text(errors="replace").count("BadHttpMessage") >= limits.log_repeats_burst,
                 10, "the node to log the first refusals")
        windows = 1 + int((time.monotonic() - t0) // limits.log_repeats_window_s) + 1
        lines = [line for line in c.log_path(0).read_text(errors="replace").splitlines() if "BadHttpMessage" in line]
        assert limits.log_repeats_burst <= len(lines) <= windows * limits.log_repeats_burst, len(lines)
    finally:
        c.stop()
