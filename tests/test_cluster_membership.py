"""Membership changes online with real node processes (docs/design.md I28, docs/operations.md
"Changing the members"): grow from three to five voters and shrink back under a steady job load,
replace a killed node with a new one at other ports, and scripts/cluster.sh's add and remove;
every job's slots read back afterwards, none lost, none twice."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from procs import REPO, Cluster, wait_for
from test_cluster import assert_slots_accounted

pytestmark = pytest.mark.cluster

EVERY_S = 1
JOBS = ("tick-a", "tick-b", "tick-c")


def _spec(policy: str) -> dict:
    return {"schedule": {"every_s": EVERY_S}, "executor": {"type": "shell", "argv": ["true"]}, "history": 1000,
            "misfire": {"policy": policy, "grace_s": 5}}


POLICIES = dict(zip(JOBS, ("fire_all", "fire_once", "skip")))


class Load:
    """Three jobs firing every second, and a writer that replaces a fourth job's spec a few times
    a second through whichever voter answers: the steady load the changes are made under. The
    writer's failures (no leader during a hand-over) are counted, not raised."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.stop = threading.Event()
        self.writes = {"ok": 0, "failed": 0}
        self.thread = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        i = self.c.wait_leader(30)
        for name, policy in POLICIES.items():
            s, b = self.c.call(i, "PUT", f"/v1/jobs/{name}", _spec(policy))
            assert s in (200, 201), b
        self.thread.start()

    def _write(self) -> None:
        k = 0
        while not self.stop.is_set():
            k += 1
            try:  # the voters change under it (sets copied whole, at C level)
                voters = sorted(set(self.c.voters) & set(self.c.alive()))
                s, _ = self.c.call(voters[k % len(voters)], "PUT", "/v1/jobs/written",
                                   dict(_spec("skip"), description=f"write {k}", schedule={"every_s": 3600}),
                                   timeout=5)
                self.writes["ok" if s in (200, 201) else "failed"] += 1
            except (OSError, RuntimeError, IndexError, ZeroDivisionError):
                self.writes["failed"] += 1
            self.stop.wait(0.2)

    def finish(self) -> int:
        """Stop the writer; returns the time (ms) up to which every slot must be executed."""
        self.stop.set()
        self.thread.join(10)
        assert self.writes["ok"] > 20, self.writes
        return int(time.time() * 1000) - 1000


def runs_of(c: Cluster, i: int, name: str) -> list[dict]:
    s, b = c.get(i, f"/v1/jobs/{name}/runs?limit=5000&consistent=true")
    assert s == 200, b
    return b["runs"]


def check_slots(c: Cluster, i: int, since_s: float, executed_by_ms: int) -> None:
    """Every job's runs, read through node i after a barrier: no slot twice, none missing
    between the first and the last, the last recent, and every scheduled run of a slot up to
    ``executed_by_ms`` executed (a run leased by a node that was killed or removed waits for its
    lease to expire, 10 s, and runs again elsewhere)."""
    now_ms = int(time.time() * 1000)
    for name, policy in POLICIES.items():
        runs = runs_of(c, i, name)
        assert_slots_accounted(runs, EVERY_S * 1000, policy)
        slots = [r["slot_ms"] for r in runs if r["kind"] == "scheduled"]
        assert len(slots) >= since_s * 0.5, (name, len(slots))
        assert max(slots) > now_ms - 5000, (name, "no recent slot")

        left: list[dict] = []

        def executed(name=name, left=left):
            left[:] = [r for r in runs_of(c, i, name) if r["kind"] == "scheduled"
                       and r["slot_ms"] <= executed_by_ms and r["state"] != "succeeded"]
            return not left
        try:
            wait_for(executed, 40, f"{name}'s runs executed")
        except AssertionError as e:
            raise AssertionError(f"{e}; not succeeded: {left[:5]}") from None


def members_of(c: Cluster, i: int) -> list[str]:
    st = c.status(i)
    assert st is not None, f"node {i + 1} does not answer"
    return st["members"]


def stop_node(c: Cluster, i: int) -> None:
    c.kill(i, signal.SIGTERM)
    wait_for(lambda: i not in c.alive(), 20, f"node {i + 1} stopped")


def test_grow_from_three_to_five_and_back_to_three_under_load(tmp_path):
    with Cluster(tmp_path, n=3) as c:
        c.start()
        load = Load(c)
        load.start()
        t0 = time.monotonic()
        for _ in range(2):  # three voters, then four, then five
            i = c.add_node()
            c.add_member(i)
        addrs = sorted(c.raft_addr(i) for i in range(5))
        wait_for(lambda: all(members_of(c, i) == addrs for i in range(5)), 20, "five voters everywhere")
        leader = c.wait_leader(30)
        # The new nodes hold the whole state: their own read of the jobs, without a barrier.
        s, b = c.get(4, "/v1/jobs")
        assert s == 200 and {j["name"] for j in b["jobs"]} >= set(JOBS), b
        time.sleep(3)  # ok-sleep: the load runs on five voters for a while
        # Back to three: a follower first, then the leader itself (it hands its leadership over).
        follower = next(i for i in sorted(c.voters) if i != leader)
        for gone in (follower, leader):
            res = c.remove_member(gone, via=next(i for i in sorted(c.voters) if i != gone))
            assert res["state"] == "removed" and res["changed"], res
            stop_node(c, gone)
        rest = sorted(c.voters)
        assert len(rest) == 3
        want = sorted(c.raft_addr(i) for i in rest)
        wait_for(lambda: all(members_of(c, i) == want for i in rest), 20, "three voters everywhere")
        new_leader = c.wait_leader(30)
        assert new_leader in rest
        time.sleep(3)  # ok-sleep: the load runs on the three left
        end_ms = load.finish()
        for i in rest:
            check_slots(c, i, time.monotonic() - t0, end_ms)
        for gone in (follower, leader):  # the removed ones were told, and left nothing behind
            assert c.raft_addr(gone) not in members_of(c, rest[0])


def test_a_killed_node_is_replaced_by_a_new_one_at_other_ports(tmp_path):
    """The leader is killed for good; a new node on other ports joins, catches up and votes; the
    dead one is removed. The three voters left (the new one among them) keep every slot, and so
    do they after a kill -9 of all of them and a restart with their old command lines."""
    with Cluster(tmp_path, n=3) as c:
        c.start()
        load = Load(c)
        load.start()
        t0 = time.monotonic()
        time.sleep(2)  # ok-sleep: some slots fire before the fault
        dead = c.wait_leader(30)
        c.kill(dead, signal.SIGKILL)
        c.voters.discard(dead)  # for the harness's majority: two of two live voters agree
        c.wait_leader(30)
        c.voters.add(dead)
        new = c.add_node()  # joins the three, the dead one included
        c.add_member(new, via=next(i for i in c.alive() if i != new))
        live = [i for i in sorted(c.voters) if i != dead]
        res = c.remove_member(dead, via=live[0])
        assert res["members"]["voters"] == sorted(c.raft_addr(i) for i in live), res
        assert res["state"] == "removed"
        want = sorted(c.raft_addr(i) for i in live)
        wait_for(lambda: all(members_of(c, i) == want for i in live), 20, "the new three everywhere")
        time.sleep(3)  # ok-sleep: the load runs on the replaced cluster
        end_ms = load.finish()
        for i in live:
            check_slots(c, i, time.monotonic() - t0, end_ms)
        # Every member killed and started again on its data, with the command lines it had (the
        # first two still name the dead node as a peer): the log says who the members are.
        for i in live:
            c.kill(i, signal.SIGKILL)
        wait_for(lambda: not [i for i in live if i in c.alive()], 20, "all killed")
        for i in live:
            c.start(i)
        c.wait_leader(60)
        wait_for(lambda: all(members_of(c, i) == want for i in live), 20, "the members after the restart")
        time.sleep(2)  # ok-sleep: the schedule carries on after the restart
        for i in live:
            check_slots(c, i, time.monotonic() - t0, end_ms)


class _ClusterSh:
    """scripts/cluster.sh in a copy of the tree (its state lives in .raftsched/ beside it), on
    free ports: ``sh(*args)`` runs it; ``stop()`` stops it, and kills by its recorded PID any
    node the script did not stop."""

    def __init__(self, tmp_path, nodes_max: int) -> None:
        self.root = root = tmp_path / "tree"
        self.nodes_max = nodes_max
        (root / "scripts").mkdir(parents=True)
        shutil.copy(REPO / "scripts" / "cluster.sh", root / "scripts" / "cluster.sh")
        os.symlink(REPO / "raftsched", root / "raftsched")
        if sys.prefix != sys.base_prefix:  # the probe's interpreter, as the script looks for it
            os.symlink(sys.prefix, root / ".venv")
        self.api_base, self.raft_base = _two_free_ranges(nodes_max)
        self.env = dict(os.environ, RAFTSCHED_API_PORT_BASE=str(self.api_base),
                        RAFTSCHED_RAFT_PORT_BASE=str(self.raft_base),
                        RAFTSCHED_NODE_CMD=f"{sys.executable} -m raftsched.cli node",
                        RAFTSCHED_CLI_CMD=f"{sys.executable} -m raftsched.cli", PYTHONPATH=str(root))
        self.env.pop("RAFTSCHED_TLS", None)
        self.env.pop("RAFTSCHED_TOKEN", None)

    def sh(self, *args, timeout=180, env=None):
        return subprocess.run(["bash", str(self.root / "scripts" / "cluster.sh"), *args], cwd=self.root,
                              env=self.env if env is None else env, capture_output=True, text=True,
                              timeout=timeout)

    def pid(self, n: int) -> int | None:
        pid_file = self.root / ".raftsched" / f"node-{n}" / "pid"
        try:
            return int(pid_file.read_text())
        except (OSError, ValueError):
            return None

    def alive(self, n: int) -> bool:
        pid = self.pid(n)
        return pid is not None and not _gone(pid)

    def stop(self) -> None:
        self.sh("stop", timeout=120)
        for n in range(1, self.nodes_max + 1):
            pid = self.pid(n)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # (a zombie until its parent, the script's shell long gone, is reaped by init)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_cluster_sh_adds_a_node_on_the_next_ports_and_removes_one(tmp_path):
    """scripts/cluster.sh in a copy of the tree (its state lives in .raftsched/ beside it): add
    starts node 4 on the next ports, makes it a voter and prints 4; remove 1 takes node 1 out and
    stops it; restart accepts member numbers only."""
    c = _ClusterSh(tmp_path, 5)
    root, sh, api_base = c.root, c.sh, c.api_base
    try:
        r = sh("start")
        assert r.returncode == 0, r.stdout + r.stderr
        # The CLI line of start's hint is the CLI this script runs (RAFTSCHED_CLI_CMD here), not
        # .venv/bin/raftsched, which a tree started with RAFTSCHED_NODE_CMD need not have.
        assert f"  {sys.executable} -m raftsched.cli jobs    # from here" in r.stdout, r.stdout
        assert ".venv/bin/raftsched" not in r.stdout, r.stdout
        # what the nodes' workers warned at start about where jobs run is said by start too (a
        # user's python jobs failed for want of a readable library, said only in node.log)
        warned = {line.split(" warning raftsched.sandbox: ", 1)[1]
                  for n in (1, 2, 3) for line in (root / ".raftsched" / f"node-{n}" / "node.log").read_text().splitlines()
                  if " warning raftsched.sandbox: " in line}
        assert ("Warnings about where jobs run" in r.stdout) == bool(warned), r.stdout
        assert all(f"  {w}" in r.stdout.splitlines() for w in warned), (warned, r.stdout)
        r = sh("add")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip().splitlines()[-1] == "4", r.stdout
        assert (root / ".raftsched" / "nodes").read_text().split() == ["1", "2", "3", "4"]
        r = sh("status")
        assert r.returncode == 0 and f"node-4  http://127.0.0.1:{api_base + 4}" in r.stdout, r.stdout
        assert "agreed by every running node" in r.stdout, r.stdout
        r = sh("remove", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "node-1 removed and stopped" in r.stdout
        assert (root / ".raftsched" / "nodes").read_text().split() == ["2", "3", "4"]
        r = sh("status")
        assert "node-1" not in r.stdout and "agreed by every running node" in r.stdout, r.stdout
        assert sh("restart", "1").returncode == 2  # not a member any more
        # a member whose data directory is gone is not started empty (it forgot its vote)
        r = sh("kill-leader")
        assert r.returncode == 0, r.stdout + r.stderr
        killed = r.stdout.split("node-")[1].split()[0]
        data, away = root / ".raftsched" / f"node-{killed}", tmp_path / "away"
        shutil.move(str(data), str(away))
        r = sh("restart", killed)
        assert r.returncode == 1 and "no Raft data" in r.stderr and "remove" in r.stderr, r.stdout + r.stderr
        shutil.rmtree(data, ignore_errors=True)
        shutil.move(str(away), str(data))
        r = sh("restart", killed)
        assert r.returncode == 0 and f"node-{killed} sees leader" in r.stdout, r.stdout + r.stderr
        r = sh("add")  # never reuses node 1's number (its data dir stays)
        assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "5", r.stdout + r.stderr
        # Stopped, the members' Raft addresses stay in their logs: a start on other Raft ports
        # is refused at once, saying why (it waited 30 s for a leader that could not be elected).
        r = sh("stop")
        assert r.returncode == 0, r.stdout + r.stderr
        other_raft = _two_free_ranges(5)[0]
        t0 = time.monotonic()
        r = sh("start", env=dict(c.env, RAFTSCHED_RAFT_PORT_BASE=str(other_raft)))
        assert r.returncode == 1 and f"refusing Raft base {other_raft}" in r.stderr, r.stdout + r.stderr
        assert f"recorded Raft base {c.raft_base}" in r.stderr and "new cluster" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 15 and not [n for n in (2, 3, 4, 5) if c.alive(n)]
        assert f"RAFTSCHED_RAFT_PORT_BASE={c.raft_base}" in (root / ".raftsched" / "ports").read_text()
        # a plain start brings the members back, and its hints name a member (node-1 is gone)
        r = sh("start")
        assert r.returncode == 0, r.stdout + r.stderr
        curl = [line for line in r.stdout.splitlines() if line.lstrip().startswith("curl ")]
        assert len(curl) == 1 and f"127.0.0.1:{api_base + 1}/" not in curl[0], r.stdout
        assert any(f"127.0.0.1:{api_base + n}/v1/jobs" in curl[0] for n in (2, 3, 4, 5)), curl
    finally:
        c.stop()


def test_cluster_sh_restarts_each_node_in_turn_through_a_bootstrap_token_rotation(tmp_path):
    """docs/security.md, "Rotating secrets": the bootstrap token file is rewritten, then each
    node stopped and restarted in turn. Between the first and the last restart the nodes disagree
    on the token: `restart N` asks node N alone (the others' 401s would have failed it, and
    tripped their refused-token limiter for this address), and once every node has restarted the
    whole cluster answers the new token."""
    import secrets
    c = _ClusterSh(tmp_path, 3)
    try:
        r = c.sh("start")
        assert r.returncode == 0, r.stdout + r.stderr
        token_file = c.root / ".raftsched" / "token"
        old = token_file.read_text()
        token_file.write_text(secrets.token_urlsafe(32) + "\n")
        assert token_file.read_text() != old
        for n in (1, 2, 3):
            pid = c.pid(n)
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda pid=pid: _gone(pid), 30, f"node-{n} (pid {pid}) to stop")
            r = c.sh("restart", str(n))
            assert r.returncode == 0 and f"node-{n} sees leader" in r.stdout, r.stdout + r.stderr
        r = c.sh("status")
        assert r.returncode == 0 and "agreed by every running node" in r.stdout, r.stdout + r.stderr
    finally:
        c.stop()


def test_cluster_sh_start_after_stop_keeps_the_recorded_tls_and_ports(tmp_path):
    """A cluster made with RAFTSCHED_TLS=1, stopped, and started again from a shell without the
    port and TLS variables comes back on its recorded ports over TLS (it came back on plain
    HTTP on 8700/9700, and its workers failed with WRONG_VERSION_NUMBER); while it runs, a start
    that asks for another TLS mode is refused. The hints print the CA file's absolute path."""
    c = _ClusterSh(tmp_path, 3)
    ca = c.root / ".raftsched" / "tls" / "ca.pem"
    try:
        r = r_first = c.sh("start", env=dict(c.env, RAFTSCHED_TLS="1"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"https://127.0.0.1:{c.api_base + 1}" in r.stdout, r.stdout
        r = c.sh("stop")
        assert r.returncode == 0 and not [n for n in (1, 2, 3) if c.alive(n)], r.stdout + r.stderr
        bare = {k: v for k, v in c.env.items()
                if k not in ("RAFTSCHED_TLS", "RAFTSCHED_API_PORT_BASE", "RAFTSCHED_RAFT_PORT_BASE")}
        r = c.sh("start", env=bare)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"https://127.0.0.1:{c.api_base + 1}" in r.stdout, r.stdout
        assert (c.root / ".raftsched" / "ports").read_text().split() == [
            f"RAFTSCHED_API_PORT_BASE={c.api_base}", f"RAFTSCHED_RAFT_PORT_BASE={c.raft_base}", "RAFTSCHED_TLS=server"]
        assert "Using the settings recorded in .raftsched/ports" in r.stdout, r.stdout
        r = c.sh("status", env=bare)
        assert r.returncode == 0 and "agreed by every running node" in r.stdout, r.stdout + r.stderr
        r = c.sh("start", env=dict(bare, RAFTSCHED_TLS="0"))
        assert r.returncode == 1 and "already running" in r.stderr, r.stdout + r.stderr
        assert "RAFTSCHED_TLS=server" in (c.root / ".raftsched" / "ports").read_text()
        # the hints' paths are absolute: they are for a shell anywhere
        assert f"export RAFTSCHED_CA_FILE={ca}    #" in r_first.stdout, r_first.stdout
        assert f"--cacert {ca} " in r_first.stdout, r_first.stdout
    finally:
        c.stop()


def test_cluster_sh_start_refuses_a_member_whose_data_is_gone(tmp_path):
    """After a power cut, start is what an operator runs: a member whose data directory lost its
    Raft files is not started (as a voter with no log it could help elect a leader without
    acknowledged writes), with restart's message and fix, while the others are; with a majority
    gone, nothing is started. A new cluster (no node has data) starts."""
    c = _ClusterSh(tmp_path, 3)
    state = c.root / ".raftsched"
    try:
        r = c.sh("start")
        assert r.returncode == 0, r.stdout + r.stderr
        r = c.sh("stop")
        assert r.returncode == 0 and not [n for n in (1, 2, 3) if c.alive(n)], r.stdout + r.stderr
        # The key ring gone while the nodes hold data (a restore that forgot it): a new k1 would
        # seal new secrets under another key than the old ones'. Refused, nothing started or made.
        shutil.move(str(state / "keys"), str(tmp_path / "keys-away"))
        r = c.sh("start")
        assert r.returncode != 0 and "holds no key file" in r.stderr, r.stdout + r.stderr
        assert not list((state / "keys").glob("*.key")) and not [n for n in (1, 2, 3) if c.alive(n)]
        shutil.rmtree(state / "keys", ignore_errors=True)
        shutil.move(str(tmp_path / "keys-away"), str(state / "keys"))
        shutil.move(str(state / "node-2"), str(tmp_path / "away-2"))
        r = c.sh("start")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "node-2 has no Raft data" in r.stderr and "remove 2', then" in r.stderr, r.stderr
        assert not c.alive(2) and c.alive(1) and c.alive(3), r.stdout + r.stderr
        r = c.sh("status")
        assert "agreed by every running node" in r.stdout, r.stdout + r.stderr
        r = c.sh("stop")
        assert r.returncode == 0 and not [n for n in (1, 2, 3) if c.alive(n)], r.stdout + r.stderr
        for f in (state / "node-3").glob("raft.*"):
            f.unlink()
        r = c.sh("start")
        assert r.returncode == 1 and "not starting any node" in r.stderr, r.stdout + r.stderr
        assert "node-3 has no Raft data" in r.stderr, r.stderr
        assert not [n for n in (1, 2, 3) if c.alive(n)], r.stdout + r.stderr
    finally:
        c.stop()


_SLOW_STOP_NODE = """\
import signal, sys, time
def stop(*_):
    time.sleep(float(sys.argv[1]))  # ok-sleep: the dump a node writes as it stops, made slow
    open(sys.argv[2], "w").write("dumped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    signal.pause()
"""


def test_cluster_sh_stop_waits_as_long_as_a_node_s_own_stop(tmp_path):
    """A node stopped gracefully writes a dump, for up to dump_on_stop_timeout_s (60 s): stop
    waits the node's whole stop limit, saying so, before any SIGKILL (it killed every node after
    10 s, so their logs had neither dumped_on_stop nor dump_on_stop_timeout). Here node-1 is a
    stand-in whose stop takes 11 s."""
    import math

    from raftsched.node import limits as node_limits
    from raftsched.worker import limits as worker_limits
    c = _ClusterSh(tmp_path, 3)
    data = c.root / ".raftsched" / "node-1"
    data.mkdir(parents=True)
    script, dumped = tmp_path / "slow_stop_node.py", tmp_path / "dumped"
    script.write_text(_SLOW_STOP_NODE)
    # (its command line names raftsched and node-1, as the script checks before it signals)
    p = subprocess.Popen([sys.executable, str(script), "11", str(dumped), "raftsched", "--id", "node-1"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        (data / "pid").write_text(f"{p.pid}\n")
        r = c.sh("stop")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "SIGKILL" not in r.stdout and p.wait(timeout=30) == 0, r.stdout
        assert dumped.read_text() == "dumped" and "node-1: stopped after" in r.stdout, r.stdout
        limit = math.ceil(worker_limits.kill_grace_s_default + worker_limits.stop_report_grace_s
                          + 2 * node_limits.api_stop_grace_s + node_limits.dump_on_stop_timeout_s + 10)
        assert f"Waiting up to {limit}s for the nodes to stop" in r.stdout, r.stdout
        assert "still waiting for node-1 (10s of" in r.stdout, r.stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _two_free_ranges(k: int) -> tuple[int, int]:
    """Two port bases with base+1..base+k free, for the script's node N on base + N: below the
    ephemeral range (32768 and up on Linux), where outgoing connections take no port while the
    script starts its nodes one after the other."""
    import random
    import socket

    def free_run(start: int) -> bool:
        for p in range(start + 1, start + k + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    return False
        return True
    found: list[int] = []
    for _ in range(200):
        base = random.randrange(20_000, 32_000)
        if free_run(base) and all(abs(base - f) > k for f in found):
            found.append(base)
            if len(found) == 2:
                return found[0], found[1]
    raise RuntimeError("no free port ranges")
