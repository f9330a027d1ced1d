"""The fault-injection harness's own moving parts (jepsen-style/): the fenced sink refuses a lower
token per resource and keeps its verdicts across a restart; the link proxy passes, blackholes (and
delivers what it held once healed) and resets; the schedule is a function of the seed."""
from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "jepsen-style"
sys.path.insert(0, str(HERE))

import generator  # noqa: E402
import jepsen_runner  # noqa: E402
from raftsched.testing.procs import free_ports, wait_port  # noqa: E402


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def test_the_sink_refuses_a_lower_token_per_resource_and_remembers_across_a_restart(tmp_path, monkeypatch):
    port = free_ports(1)[0]
    log = tmp_path / "sink.jsonl"
    monkeypatch.setenv("JEPSEN_SINK", f"127.0.0.1:{port}")

    def w(resource, token):
        return jepsen_runner.sink_write({"op": "write", "resource": resource, "token": token})["accepted"]

    p = start([str(HERE / "sink.py"), "--port", str(port), "--log", str(log)])
    try:
        wait_port(port, 10)
        assert [w("r1", 5), w("r1", 7), w("r1", 6), w("r1", 7), w("r2", 1)] == [True, True, False, True, True]
    finally:
        stop(p)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["resource"], r["token"], r["accepted"], r["highest_before"]) for r in recs] == [
        ("r1", 5, True, None), ("r1", 7, True, 5), ("r1", 6, False, 7), ("r1", 7, True, 7), ("r2", 1, True, None)]
    p = start([str(HERE / "sink.py"), "--port", str(port), "--log", str(log)])
    try:
        wait_port(port, 10)
        assert w("r1", 6) is False and w("r1", 8) is True
    finally:
        stop(p)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            while data := self.request.recv(4096):
                self.request.sendall(data)
        except OSError:
            pass


def _control(port: int, link: str, mode: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((json.dumps({"link": link, "mode": mode}) + "\n").encode())
        assert json.loads(s.makefile().readline())["ok"]


def test_the_link_proxy_passes_blackholes_then_delivers_and_resets():
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    echo.daemon_threads = True
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    listen, control = free_ports(2)
    p = start([str(HERE / "proxy.py"), "--control", str(control), "--link", f"l:{listen}:{echo.server_address[1]}"])
    try:
        wait_port(control, 10)
        c = socket.create_connection(("127.0.0.1", listen), timeout=2)
        c.sendall(b"one")
        assert c.recv(10) == b"one"
        _control(control, "l", "blackhole")
        c.sendall(b"two")
        c.settimeout(0.5)
        with pytest.raises(socket.timeout):
            c.recv(10)
        _control(control, "l", "pass")
        c.settimeout(2)
        assert c.recv(10) == b"two"   # held, not lost: delivered once healed
        _control(control, "l", "reset")
        with pytest.raises((ConnectionResetError, ConnectionAbortedError, socket.timeout, OSError)):
            c.sendall(b"x")
            if not c.recv(10):
                raise ConnectionResetError("closed")
        c.close()
        # A new connection is reset at once: the RST may even beat connect()'s
        # return on a loaded machine, so the connect is inside the expectation.
        d = None
        with pytest.raises((ConnectionResetError, OSError)):
            d = socket.create_connection(("127.0.0.1", listen), timeout=2)
            d.sendall(b"y")
            time.sleep(0.1)  # ok-sleep: let the RST arrive
            if not d.recv(10):
                raise ConnectionResetError("closed")
        if d is not None:
            d.close()
        _control(control, "l", "pass")
        e = socket.create_connection(("127.0.0.1", listen), timeout=2)
        e.sendall(b"three")
        assert e.recv(10) == b"three"
        e.close()
    finally:
        stop(p)
        echo.shutdown()
        echo.server_close()


def test_the_schedule_is_a_function_of_the_seed():
    a = generator.generate(42, "ci", None, list(generator.NEMESES))
    assert a == generator.generate(42, "ci", None, list(generator.NEMESES))
    assert a != generator.generate(43, "ci", None, list(generator.NEMESES))
    kinds = [f["kind"] for f in a["faults"]]
    # The CI brief's minimum: several leader kills, a partition of each kind, pauses, both clock
    # jumps, a full restart; one fault at a time, all before the time limit.
    assert sum(f["kind"] == "kill" and f["target"] == "leader" for f in a["faults"]) >= 3
    assert {f.get("mode") for f in a["faults"] if f["kind"] == "partition"} >= {"blackhole", "reset"}
    assert {f.get("offset_ms") for f in a["faults"] if f["kind"] == "clock"} >= {6000, -6000}
    assert "pause" in kinds and "restart-all" in kinds
    ends = [f["at"] + f["duration"] for f in a["faults"]]
    assert all(e <= nxt for e, nxt in zip(ends, [f["at"] for f in a["faults"]][1:]))
    assert ends[-1] <= a["time_limit_s"]
    # Backfills (dry run, then the real one) and bulk requeues run among the faults.
    assert sum(o["f"] == "backfill" for o in a["ops"]) >= 3 and any(o["f"] == "requeue" for o in a["ops"])
    assert all(o["id"] and o["span_s"] > 0 for o in a["ops"] if o["f"] == "backfill")
    jobs = {o["job"] for o in a["ops"] if o["f"] == "create"}
    assert 10 <= sum(o["f"] == "create" and o["at"] < 3 for o in a["ops"]) <= 20
    assert jobs <= set(a["plan"]["jobs"])


@pytest.mark.parametrize("profile", ["ci", "soak"])
def test_every_schedule_isolates_the_leader_under_write_load(profile):
    """Issue 20's scenario: a partition of the leader long enough for a new leader to be elected
    and commit far past the old one's tail, with writers through the isolated node and the
    majority; early enough to fit any CI schedule; its jobs in the plan, owned by no client."""
    for seed in range(40):
        a = generator.generate(seed, profile, None, list(generator.NEMESES))
        bursts = [f for f in a["faults"] if f.get("burst")]
        assert bursts and all(f["kind"] == "partition" and f["target"] == "leader" for f in bursts)
        first = bursts[0]
        assert first["duration"] >= 7 and first["at"] + first["duration"] <= a["time_limit_s"] / 2 + 20
        assert {f.get("mode") for f in a["faults"] if f["kind"] == "partition"} >= {"blackhole", "reset"}
        client_jobs = {o["job"] for o in a["ops"]}
        for f in bursts:
            b = f["burst"]
            assert [w["via"] for w in b["writers"]].count("isolated") == 1
            assert [w["via"] for w in b["writers"]].count("majority") >= 2
            names = [n for w in b["writers"] for n in w["jobs"]]
            assert len(names) == len(set(names)) and not set(names) & client_jobs
            assert set(names) <= set(a["plan"]["jobs"])
            # The majority's puts after an election (~2 s): several 64 KiB append messages.
            majority = sum(w["via"] == "majority" for w in b["writers"])
            assert majority * b["rate_per_s"] * (f["duration"] - 2) * b["pad_bytes"] > 3 * 64 * 1024
    # Without the partition nemesis, no burst.
    assert not any(f.get("burst") for f in generator.generate(3, profile, None, ["kill", "pause"])["faults"])


def test_the_membership_nemesis_replaces_a_killed_member_in_ci_and_does_all_three_in_soak():
    """CI: one replacement of a killed member, early in the schedule (so that it fits), and two
    spare node slots; soak: every membership fault; alone, only them."""
    for seed in range(20):
        a = generator.generate(seed, "ci", None, list(generator.NEMESES))
        kinds = [f["kind"] for f in a["faults"]]
        assert kinds.count("member-replace") == 1 and a["spares"] == generator.MEMBER_SPARES
        soak = generator.generate(seed, "soak", None, list(generator.NEMESES))
        assert set(generator.MEMBER_FAULTS) <= {f["kind"] for f in soak["faults"]}
        grow = next(f for f in soak["faults"] if f["kind"] == "member-grow-shrink")
        assert grow["mode"] in ("blackhole", "reset") and grow["remove"] in ("isolated", "leader")
        alone = generator.generate(seed, "soak", 120, ["membership"])
        assert alone["faults"] and {f["kind"] for f in alone["faults"]} <= set(generator.MEMBER_FAULTS)
    assert generator.generate(3, "ci", None, ["kill", "pause"])["spares"] == 0


def test_a_burst_writer_creates_its_jobs_then_updates_them_keeping_their_schedule():
    f = next(f for f in generator.generate(5, "ci", None, list(generator.NEMESES))["faults"] if f.get("burst"))
    b = f["burst"]
    w = next(w for w in b["writers"] if w["via"] == "majority")
    ops = [generator.burst_op(b, w, k) for k in range(generator.burst_ops_max(f))]
    assert [o["f"] for o in ops[:3]] == ["create", "create", "update"]
    assert ops == [generator.burst_op(b, w, k) for k in range(len(ops))]  # a function of (burst, writer, k)
    for o in ops:
        base = w["jobs"][o["job"]]
        assert o["spec"]["schedule"] == base["schedule"] and o["spec"]["misfire"] == base["misfire"]
        assert len(o["spec"]["payload"]["pad"]) == b["pad_bytes"] <= 8 * 1024
    assert len({o["spec"]["payload"]["pad"] for o in ops}) == len(ops)  # every put is new bytes


def _paged_node(runs: list[dict], trim_once_at: str | None = None):
    """get / get_retry of a node holding ``runs`` (newest first), paging as GET /v1/runs does:
    ``limit`` a page, ``before`` the next of the page before; the first page read after
    ``trim_once_at`` answers 400 once (its cursor trimmed meanwhile)."""
    import urllib.parse
    trimmed = {"done": trim_once_at is None}

    async def get(i, path, timeout_s=10.0):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        limit = int(q["limit"][0])
        start = 0
        if "before" in q:
            if q["before"][0] == trim_once_at and not trimmed["done"]:
                trimmed["done"] = True
                return 400, {"error": {"field": "before"}}
            start = [r["id"] for r in runs].index(q["before"][0]) + 1
        page = runs[start:start + limit]
        more = start + limit < len(runs)
        return 200, {"runs": page, "next": page[-1]["id"] if more else None}

    async def get_retry(i, path, tries=5, timeout_s=10.0):
        return (await get(i, path))[1]
    return get, get_retry


@pytest.mark.parametrize("trim", [False, True])
def test_a_final_read_follows_next_past_the_first_page_of_runs(trim):
    """A soak past ~1 000 s holds more than the 10 000 runs of one page: the final read reads
    them all (before, it read the newest 10 000, and the checker called the older slots lost)."""
    import asyncio
    import run as harness_run
    runs = [{"id": f"j@{n}!x"} for n in range(25_000, 0, -1)]
    r = harness_run.Run.__new__(harness_run.Run)
    r.get, r.get_retry = _paged_node(runs, runs[9_999]["id"] if trim else None)
    got = asyncio.run(r.all_runs(0, "consistent=true"))
    assert [x["id"] for x in got] == [x["id"] for x in runs]
