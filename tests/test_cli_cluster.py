"""``raftsched cluster`` and ``raftsched members list`` say whether the leader hears each member
(cli_cluster.py): read from the leader's own /v1/cluster, asked at one of the nodes given, and
"unknown" with the reason when it cannot be asked."""
from __future__ import annotations

import json
import logging

import pytest

from raftsched.core.errors import Unavailable

N1, N2, N3 = "127.0.0.1:9701", "127.0.0.1:9702", "127.0.0.1:9703"
U1, U2, U3 = "http://127.0.0.1:8701", "http://127.0.0.1:8702", "http://127.0.0.1:8703"
URLS = {N1: U1, N2: U2, N3: U3}


def _body(node, raft, role, leader=N2, followers=None, conditions=()):
    return {"node": node, "role": role, "leader": leader, "raft": raft, "term": 3, "members": [N1, N2, N3],
            "learners": [], "member_urls": dict(URLS),
            "replication": {"commit_stalled_s": 0.0, "leader_commit_index": 40, "followers": followers or {}},
            "conditions": list(conditions)}


FOLLOWERS = {N1: {"match_index": 40, "next_index": 41, "lag_entries": 0, "state": "replicate",
                  "last_ack_age_s": 12.0, "last_heard_s": 0.06, "stalled_s": 0.0},
             N3: {"match_index": 12, "next_index": 13, "lag_entries": 28, "state": "probe",
                  "last_ack_age_s": 42.3, "last_heard_s": 42.3, "stalled_s": 41.9}}
STALLED = {"type": "cluster.follower_stalled", "node": N3, "for_s": 41.9}
FOLLOWER_1 = _body("node-1", N1, "follower")
LEADER_2 = _body("node-2", N2, "leader", followers=FOLLOWERS, conditions=[STALLED])


@pytest.fixture
def run(monkeypatch):
    """``run(argv, answers)``: cli.main with the Client replaced: a Client made for URLs asks
    ``answers[url]`` for GET /v1/cluster (a dict, or an exception raised); returns (exit
    status, the URLs each cluster() call was sent to)."""
    from raftsched import cli as cli_mod

    def go(argv, answers, urls=(U1, U2, U3)):
        asked: list = []

        class Fake:
            def __init__(self, urls, **kw):
                self.urls, self.kw = list(urls), kw
                assert kw["token"] == "t"

            def cluster(self, consistent=False):
                url = self.urls[0]  # (the command's own Client: the first answers, as a follower did)
                asked.append(url)
                got = answers[url]
                if isinstance(got, Exception):
                    raise got
                return got
        monkeypatch.setattr(cli_mod, "Client", Fake)
        monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
        monkeypatch.setattr(logging.getLogger("raftsched.client"), "level",
                            logging.getLogger("raftsched.client").level)
        monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
        return cli_mod.main(argv + ["-o", "json", "--url", ",".join(urls)]), asked
    return go


def test_cluster_asks_the_leader_and_says_which_member_it_does_not_hear(run, capsys):
    rc, asked = run(["cluster"], {U1: FOLLOWER_1, U2: LEADER_2})
    out = capsys.readouterr()
    assert rc == 0 and out.err == "", out.err
    assert asked == [U1, U2]  # the node that answered, then the leader at its announced URL
    got = json.loads(out.out)
    assert got["node"] == "node-1" and got["role"] == "follower"  # the answering node's view, as before
    rows = {r["member"]: r for r in got["members_heard"]}
    assert rows[N2]["role"] == "leader" and rows[N2]["heard"] == "the leader (answered)"
    assert rows[N1]["heard"] == "last heard 0.1 s ago" and rows[N1]["lag_entries"] == 0
    assert rows[N3]["heard"] == "not heard for 42 s" and rows[N3]["state"] == "probe"
    assert rows[N3]["lag_entries"] == 28 and rows[N3]["stalled_s"] == 41.9 and rows[N3]["url"] == U3
    assert got["leader_conditions"] == [STALLED] and got["leader_view"] == f"read from the leader, node-2 at {U2}"


def test_the_table_shows_the_heard_column_and_the_conditions(run, capsys):
    from raftsched import cli_output
    text = cli_output.table(_printed(run, capsys))
    assert "MEMBERS_HEARD (3)" in text and "LEADER_CONDITIONS (1)" in text, text
    line = next(x for x in text.splitlines() if x.startswith(N3))
    assert "not heard for 42 s" in line, text
    assert "cluster.follower_stalled" in text


def _printed(run, capsys):
    rc, _ = run(["cluster"], {U1: FOLLOWER_1, U2: LEADER_2})
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_the_leader_answering_is_not_asked_twice(run, capsys):
    rc, asked = run(["cluster"], {U2: LEADER_2}, urls=(U2, U1))
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and asked == [U2]
    assert got["leader_view"] == "node-2 is the leader" and "leader_conditions" not in got
    assert got["conditions"] == [STALLED]
    assert [r["heard"] for r in got["members_heard"]] == ["last heard 0.1 s ago", "the leader (answered)",
                                                          "not heard for 42 s"]


@pytest.mark.parametrize("answers,urls,said", [
    # the leader's node is down: every member unknown, not fine
    ({U1: FOLLOWER_1, U2: Unavailable("node unreachable: connection refused"), U3: _body("node-3", N3, "follower")},
     (U1, U2, U3), "the leader 127.0.0.1:9702 (it announced http://127.0.0.1:8702) could not be asked; asked: "
                   "http://127.0.0.1:8702: node unreachable: connection refused; http://127.0.0.1:8703: follower"),
    # its URL is not one of the nodes given: not sent the token
    ({U1: FOLLOWER_1}, (U1,), "the leader 127.0.0.1:9702's API (it announced http://127.0.0.1:8702) is not one of "
                              "the nodes given: add it to --url (the token is sent only to those)"),
    # no leader at all
    ({U1: _body("node-1", N1, "follower", leader=None)}, (U1, U2), "node-1 knows no leader"),
])
def test_without_the_leaders_view_every_member_is_unknown_and_stderr_says_why(run, capsys, answers, urls, said):
    rc, asked = run(["cluster"], answers, urls=urls)
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert rc == 0
    assert out.err == f"raftsched: cannot tell which members are up: {said}\n", out.err
    assert got["leader_view"] == f"not read: {said}"
    assert {r["heard"] for r in got["members_heard"]} == {f"unknown: {said}"}
    assert not any("last heard" in r["heard"] for r in got["members_heard"])
    assert U2 not in asked or U2 in urls  # a leader URL only the cluster announced is never sent the token


def test_members_list_says_which_members_the_leader_hears_and_its_conditions(run, capsys):
    rc, asked = run(["members", "list"], {U1: FOLLOWER_1, U2: LEADER_2})
    got = json.loads(capsys.readouterr().out)
    assert rc == 0 and asked == [U1, U2]
    assert got["voters"] == [N1, N2, N3] and got["leader"] == N2
    assert {r["member"]: r["heard"] for r in got["members_heard"]} == {
        N1: "last heard 0.1 s ago", N2: "the leader (answered)", N3: "not heard for 42 s"}
    assert got["conditions"] == [] and got["leader_conditions"] == [STALLED]


def test_heard_in_words():
    """From last_heard_s; last_ack_age_s (the last acknowledgement that moved the match index)
    grows on a live follower of an idle cluster, and says nothing of it."""
    from raftsched.cli_cluster import heard
    assert heard({"last_heard_s": 0.04, "last_ack_age_s": 300.0}) == "last heard 0.0 s ago"
    assert heard({"last_heard_s": 2.0}) == "last heard 2.0 s ago"
    assert heard({"last_heard_s": 2.6}) == "not heard for 3 s"
    assert heard(None) == "not heard (the leader has no answer of it)"
    assert heard({"last_ack_age_s": 0.1}).startswith("unknown (the leader does not say")
    # (a review) None: no answer since this leader's election (a learner added while it is down,
    # a dead voter after a fail-over), not an older version
    assert heard({"last_heard_s": None}) == "not heard since this leader was elected"


def test_the_leaders_view_ages_last_heard_when_read_and_an_election_stamp_is_no_answer(monkeypatch):
    """A review: the age was taken on the tick thread and cached (a held-up tick thread showed every
    follower freshly heard), and pysyncobj's stamps at an election (a dead node's too) counted as
    answers: a dead voter read "last heard 0.x s ago" after a fail-over."""
    from raftsched.replication import _watch
    from raftsched.replication._watch import ReplicationWatch

    now = [1000.0]
    monkeypatch.setattr(_watch, "monotonic", lambda: now[0])

    class Sync:
        raftCommitIndex = 5
        _SyncObj__leaderCommitIndex = 5

        def _SyncObj__getCurrentLogIndex(self):
            return 5

        def progress(self):
            return {"b": {"match_index": 5, "next_index": 6, "state": "replicate", "heard_at": 999.5},
                    "c": {"match_index": 5, "next_index": 6, "state": "replicate", "heard_at": None}}

        def _getLeader(self):
            return object()

        def members_view(self):
            return {"self": "voter"}

    w = ReplicationWatch(Sync())
    now[0] += 0.2
    w.tick()
    now[0] += 30  # the tick thread held up: no look since
    f = w.view()["followers"]
    assert f["b"]["last_heard_s"] == 30.7 and "heard_at" not in f["b"]
    assert f["c"]["last_heard_s"] is None


def test_a_killed_member_is_shown_not_heard_by_a_real_cluster(tmp_path):
    """Three real nodes, one follower killed: ``raftsched cluster`` asked at another follower
    reads the leader's view and shows the dead member "not heard for N s", the live ones heard
    (the dead one used to be listed like a live one)."""
    import subprocess
    import sys

    from procs import Cluster, REPO, wait_for
    c = Cluster(tmp_path, n=3)
    c.start()
    try:
        leader = c.wait_leader(30)
        f1, f2 = [i for i in range(3) if i != leader]
        wait_for(lambda: all((c.status(i) or {}).get("member_urls", {}).keys() >= set(c.members) for i in range(3)),
                 30, "every member's URL announced")
        token = tmp_path / "client-token"
        token.write_text(c.token)
        token.chmod(0o600)
        c.kill(f2)
        dead = c.raft_addr(f2)

        def rows():
            p = subprocess.run([sys.executable, "-m", "raftsched.cli", "cluster", "-o", "json", "--url",
                                ",".join([c.url(f1), c.url(leader), c.url(f2)]), "--token-file", str(token)],
                               capture_output=True, text=True, timeout=60, cwd=REPO)
            assert p.returncode == 0, p.stdout + p.stderr
            return {r["member"]: r["heard"] for r in json.loads(p.stdout)["members_heard"]}

        wait_for(lambda: rows()[dead].startswith("not heard for"), 30, "the dead member not heard")
        got = rows()
        assert got[c.raft_addr(leader)] == "the leader (answered)", got
        assert got[c.raft_addr(f1)].startswith("last heard "), got
        assert got[dead].startswith("not heard for "), got
    finally:
        c.stop()
