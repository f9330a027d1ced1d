"""The process harness itself (raftsched/testing/): free ports, waiting, the node command line,
named children stopped by PID, and the one rule for the agreed leader over canned /v1/cluster
answers (no node processes)."""
from __future__ import annotations

import http.server
import io
import os
import signal
import socket
import sys
import threading
from contextlib import redirect_stdout

import pytest

from raftsched.testing import cluster as tc
from raftsched.testing.cluster import LocalCluster, NodeSpec, agreed_leader, with_any_year_env
from raftsched.testing.procs import Procs, WaitTimeout, free_port, free_ports, wait_for

MEMBERS = ["127.0.0.1:9701", "127.0.0.1:9702", "127.0.0.1:9703"]


def answer(i: int, role: str, leader: int | None, term: int = 3) -> dict:
    """What node i's /v1/cluster says (the fields the rule reads, and a few more)."""
    return {"node": f"node-{i + 1}", "role": role, "leader": None if leader is None else MEMBERS[leader],
            "raft": MEMBERS[i], "term": term, "commit_index": 10, "pid": 1000 + i}


# ------------------------------------------------------------------------------------ free ports

def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    socks = []
    try:
        for p in ports:
            s = socket.socket()
            s.bind(("127.0.0.1", p))  # each is free for the caller to bind
            socks.append(s)
    finally:
        for s in socks:
            s.close()


def test_free_port_is_bindable():
    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


# ------------------------------------------------------------------------------------ wait_for

def test_wait_for_returns_the_first_truthy_value_and_retries_through_errors():
    calls = []

    def cond():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not yet")
        return {"ok": len(calls)}
    assert wait_for(cond, 10, "the third call", interval_s=0.001) == {"ok": 3}


def test_wait_for_names_what_it_waited_for_and_the_last_error():
    def cond():
        raise ConnectionRefusedError("nobody home")
    with pytest.raises(WaitTimeout, match=r"waiting for the moon.*nobody home"):
        wait_for(cond, 0.05, "the moon", interval_s=0.01)
    assert issubclass(WaitTimeout, AssertionError)


# ------------------------------------------------------------------------------------ the rule

def test_a_leader_named_by_every_node_is_agreed():
    answers = {i: answer(i, "leader" if i == 1 else "follower", 1) for i in range(3)}
    assert agreed_leader(answers, MEMBERS) == 1
    assert agreed_leader(answers, MEMBERS, unanimous=True) == 1


def test_a_node_that_says_it_leads_without_a_majority_is_not_agreed():
    # An old leader cut off from the others still says it leads; the other two elected node 2.
    answers = {0: answer(0, "leader", 0, term=3), 1: answer(1, "follower", 2, term=4),
               2: answer(2, "leader", 2, term=4)}
    assert agreed_leader(answers, MEMBERS) == 2
    assert agreed_leader(answers, MEMBERS, unanimous=True) is None
    # Alone, the old leader names itself: one vote of three is no majority.
    assert agreed_leader({0: answers[0]}, MEMBERS) is None
    assert agreed_leader({0: answers[0]}, MEMBERS, unanimous=True) is None


def test_a_majority_that_names_a_node_is_not_enough_when_that_node_does_not_say_it_leads():
    answers = {0: answer(0, "follower", 1), 1: answer(1, "candidate", None), 2: answer(2, "follower", 1)}
    assert agreed_leader(answers, MEMBERS) is None


def test_unanimous_needs_every_node_asked_to_answer_and_agree():
    answers = {0: answer(0, "follower", 1), 1: answer(1, "leader", 1), 2: None}
    assert agreed_leader(answers, MEMBERS) == 1  # two of three: a majority
    assert agreed_leader(answers, MEMBERS, unanimous=True) is None  # node 3 did not answer
    # Asking only the two live nodes (node 3 is down), both agree: agreed, also unanimously.
    live = {0: answers[0], 1: answers[1]}
    assert agreed_leader(live, MEMBERS, unanimous=True) == 1
    # A restarted node that does not know the leader yet breaks unanimity, not the majority.
    answers[2] = answer(2, "follower", None)
    assert agreed_leader(answers, MEMBERS) == 1
    assert agreed_leader(answers, MEMBERS, unanimous=True) is None


def test_the_majority_is_of_the_cluster_not_of_the_nodes_asked():
    five = MEMBERS + ["127.0.0.1:9704", "127.0.0.1:9705"]
    two = {0: {"role": "leader", "leader": five[0]}, 1: {"role": "follower", "leader": five[0]}}
    assert agreed_leader(two, five, unanimous=True) is None  # 2 of 5
    two[2] = {"role": "follower", "leader": five[0]}
    assert agreed_leader(two, five, unanimous=True) == 0  # 3 of 5


def test_only_the_voting_members_answers_count_once_the_members_changed():
    """Node 4 (index 3) is a learner catching up and node 1 was removed: their answers, whatever
    they say, count for nothing; the majority is of the voters."""
    five = MEMBERS + ["127.0.0.1:9704"]
    voters = [five[1], five[2], five[3]]  # node 1 removed, node 4 a voter
    answers = {0: {"role": "leader", "leader": five[0]}, 1: {"role": "follower", "leader": five[2]},
               2: {"role": "leader", "leader": five[2]}, 3: {"role": "follower", "leader": five[0]}}
    # The removed node still says it leads, and node 4 names it: no use, node 3 has 2 of 3 voters.
    assert agreed_leader(answers, five, voters=voters) == 2
    assert agreed_leader(answers, five, unanimous=True, voters=voters) is None
    assert agreed_leader({i: answers[i] for i in (1, 2)}, five, unanimous=True, voters=voters) == 2
    # A learner's word is not a vote: two of four voters are no majority.
    four = [five[0], five[1], five[2], five[3]]
    answers = {0: {"role": "leader", "leader": five[0]}, 1: {"role": "follower", "leader": five[0]},
               3: {"role": "follower", "leader": five[0]}}
    assert agreed_leader(answers, five, voters=four[:2] + [five[2], "127.0.0.1:9709"]) is None
    assert agreed_leader(answers, five, voters=four[:3]) == 0
    # Indexes with gaps, as scripts/cluster.sh numbers its nodes after a removal.
    gaps = {1: five[1], 2: five[2], 3: five[3]}
    assert agreed_leader({1: {"role": "follower", "leader": five[2]}, 2: {"role": "leader", "leader": five[2]}},
                         gaps) == 2


def test_a_one_node_cluster_agrees_with_itself():
    assert agreed_leader({0: {"role": "leader", "leader": MEMBERS[0]}}, MEMBERS[:1], unanimous=True) == 0
    assert agreed_leader({0: None}, MEMBERS[:1]) is None
    assert agreed_leader({}, MEMBERS) is None


# ------------------------------------------------------------------------------------ node argv

def test_node_spec_writes_the_one_node_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SHIFT_WALL_S", raising=False)  # the any-year run adds --pass-env: its own test below
    spec = NodeSpec(id="node-2", api="127.0.0.1:8702", raft="127.0.0.1:9702",
                    peers=("127.0.0.1:9701", "127.0.0.1:9703"), data_dir=tmp_path / "d",
                    secret_file=tmp_path / "s", token_file=tmp_path / "t", extra_args=("--slots", "0"))
    argv = spec.argv(command=["raftsched"])
    assert argv[:2] == ["raftsched", "node"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags == {"--id": "node-2", "--api": "127.0.0.1:8702", "--raft": "127.0.0.1:9702",
                     "--data-dir": str(tmp_path / "d"), "--cluster-secret-file": str(tmp_path / "s"),
                     "--token-file": str(tmp_path / "t"), "--peers": "127.0.0.1:9701,127.0.0.1:9703",
                     "--slots": "0"}
    alone = NodeSpec(id="node-1", api="a:1", raft="a:2", peers=(), data_dir=tmp_path, secret_file=tmp_path,
                     token_file=tmp_path)
    assert "--peers" not in alone.argv()
    assert alone.argv()[:4] == [sys.executable, "-m", "raftsched.cli", "node"]


def test_under_the_any_year_shim_nodes_pass_it_to_their_runs(monkeypatch):
    monkeypatch.setenv("SHIFT_WALL_S", "1")
    monkeypatch.setenv("LD_PRELOAD", "/x.so")
    assert with_any_year_env(["--slots", "0"]) == ["--slots", "0", "--pass-env", "LD_PRELOAD,SHIFT_WALL_S"]
    assert with_any_year_env(["--pass-env", "A,LD_PRELOAD"]) == ["--pass-env", "A,LD_PRELOAD,SHIFT_WALL_S"]
    monkeypatch.delenv("SHIFT_WALL_S")
    assert with_any_year_env(["--slots", "0"]) == ["--slots", "0"]


def test_local_cluster_writes_private_secrets_and_gives_each_node_its_ports(tmp_path, monkeypatch):
    monkeypatch.delenv("SHIFT_WALL_S", raising=False)  # the any-year run adds --pass-env: its own test below
    c = LocalCluster(tmp_path, n=3, node_args=["--slots", "0"], node_env={1: {"X": "1"}})
    for f in (c.secret_file, c.token_file):
        assert os.stat(f).st_mode & 0o077 == 0, f
    assert c.token_file.read_text() == c.token + "\n"
    assert len(set(c.api_ports + c.raft_ports)) == 6
    argv = c.argv(1)
    assert argv[argv.index("--peers") + 1] == f"{c.raft_addr(0)},{c.raft_addr(2)}"
    assert argv[-2:] == ["--slots", "0"]
    assert c.env_of(1)["X"] == "1" and "X" not in c.node_env_of(0)
    assert c.node_of_worker("node-3/1234") == 2
    (tmp_path / "x").mkdir()
    assert LocalCluster(tmp_path / "x", n=1, secret=None).secret_file.exists() is False


# ------------------------------------------------------------------------------------ Procs

def test_procs_stops_children_by_pid_and_tracks_sigstop(tmp_path):
    procs = Procs()
    sleeper = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(600)"]  # ok-sleep: a child that waits to be stopped
    # A child that ignores SIGTERM: the stop must end it with SIGKILL after its deadline.
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(600)"]  # ok-sleep: a child that waits to be stopped
    try:
        a = procs.start("a", sleeper, tmp_path / "a.log")
        b = procs.start("b", stubborn, tmp_path / "b.log")
        with pytest.raises(AssertionError, match="still running"):
            procs.start("a", sleeper, tmp_path / "a.log")
        wait_for(lambda: procs.log_tail("a") == "up" and procs.log_tail("b") == "up", 30, "both children up")
        assert procs.signal("a", signal.SIGSTOP) and procs.paused == {"a"}
        assert procs.signal("a", signal.SIGCONT) and procs.paused == set()
        procs.signal("a", signal.SIGSTOP)
        procs.stop_all(timeout_s=0.5)  # SIGCONT lets the paused one take its SIGTERM
        assert a.returncode == -signal.SIGTERM
        assert b.returncode == -signal.SIGKILL
        assert not procs.alive("a") and not procs.alive("b") and procs.paused == set()
        assert procs.signal("a", signal.SIGTERM) is False  # nothing left to signal
    finally:
        for p in procs.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


# ------------------------------------------------------------------------------------ cluster.sh's probe

class _Canned(http.server.BaseHTTPRequestHandler):
    bodies: dict[int, bytes] = {}

    def do_GET(self):  # noqa: N802 - the http.server API
        body = self.bodies[self.server.server_address[1]]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_cluster_sh_probe_prints_every_node_and_the_agreed_leader():
    """``python -m raftsched.testing.cluster probe`` against three canned /v1/cluster servers on
    consecutive free ports (the script numbers node N's port as base + N)."""
    import json
    base = None
    for _ in range(20):  # three consecutive free ports
        p = free_ports(1)[0]
        try:
            servers = [http.server.ThreadingHTTPServer(("127.0.0.1", p + k), _Canned) for k in range(3)]
            base = p - 1
            break
        except OSError:
            continue
    assert base is not None, "no three consecutive free ports"
    members = [f"127.0.0.1:{9700 + k}" for k in (1, 2, 3)]
    bodies = [{"node": "node-1", "role": "follower", "leader": members[1], "term": 4, "commit_index": 7, "pid": 11},
              {"node": "node-2", "role": "leader", "leader": members[1], "term": 4, "commit_index": 7, "pid": 22},
              {"node": "node-9", "role": "follower", "leader": members[1], "term": 4, "commit_index": 7, "pid": 33}]
    for k, s in enumerate(servers):
        _Canned.bodies[s.server_address[1]] = json.dumps(bodies[k]).encode()
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        def run(*nodes):
            out = io.StringIO()
            with redirect_stdout(out):
                assert tc.main(["probe", "--api-base", str(base), "--raft-base", "9700", *map(str, nodes)]) == 0
            return [line.split("\t") for line in out.getvalue().splitlines()]
        lines = run(1, 2, 3)
        assert lines[0] == ["node", "1", "ok", "follower", members[1], "4", "7", "11"]
        assert lines[1] == ["node", "2", "ok", "leader", members[1], "4", "7", "22"]
        assert lines[2] == ["node", "3", "error", "port answered by 'node-9', not node-3"]
        # Node 3's port answers as another node: no unanimity among the three asked, but the two
        # real ones are a majority of the three members.
        # (the members as the leader says: its canned body has none, hence "-")
        assert lines[3:] == [["leader", "-"], ["majority", "2", members[1], "4", "22"], ["members", "-", "-"]]
        assert run(1, 2)[-3:-1] == [["leader", "2", members[1], "4", "22"], ["majority", "2", members[1], "4", "22"]]
        assert run(2)[-3:] == [["leader", "-"], ["majority", "-"], ["members", "-"]]  # one vote of three
        assert run() == [["leader", "-"], ["majority", "-"], ["members", "-"]]
        # The members changed: nodes 1 and 2 are the voters (with node 7, down); node 3 asked too.
        out = io.StringIO()
        with redirect_stdout(out):
            assert tc.main(["probe", "--api-base", str(base), "--raft-base", "9700", "--members", "1,2,7,",
                            "1", "2"]) == 0
        assert out.getvalue().splitlines()[-3:-1] == ["leader\t2\t" + members[1] + "\t4\t22",
                                                      "majority\t2\t" + members[1] + "\t4\t22"]
        # The leader's members and learners, as it says them (a change made through the API).
        _Canned.bodies[servers[1].server_address[1]] = json.dumps(
            dict(bodies[1], members=members[:2], learners=["127.0.0.1:9707"])).encode()
        assert run(1, 2)[-1] == ["members", ",".join(members[:2]), "127.0.0.1:9707"]
        # Node 1 was removed through the API and still runs: it says its old role, the probe
        # that it is no member (cluster.sh status then says what to do).
        _Canned.bodies[servers[0].server_address[1]] = json.dumps(dict(bodies[0], membership={"self": "none"})).encode()
        assert run(1)[0] == ["node", "1", "ok", "NOT-A-MEMBER", members[1], "4", "7", "11"]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
