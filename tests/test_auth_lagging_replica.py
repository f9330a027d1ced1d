"""A token this replica does not hold yet: a node that just started (replaying its log) or one
behind the leader answered a valid token 401 "unknown or revoked token", and a remote worker,
taking the 401 as final, dropped a batch of outcomes (their runs ran again). The node now waits
until it has applied what it knows the leader committed before it refuses a token it has no
record of (node/api.py auth_middleware, node/reads.py ReadBarrier.caught_up): 401 only if it
is still unknown then, 503 when no leader can say; and without an entry through the log, so a
client sending made-up tokens makes no commit. A revoked token or a wrong secret is refused at
once."""
from __future__ import annotations

from raftsched.core.state import SchedulerState
from raftsched.node.http import AUTH as AUTH_KEY

from fakes import FakeRaft
from test_reads import AUTH, run_api


class CatchingUp(FakeRaft):
    """A replica that holds the writes it has "not applied yet" aside (``behind``: token id ->
    record): its status says it is behind the leader's commit index, and the next look after
    that finds them applied, as a node catching up does. Counts barrier rounds (commits)."""

    def __init__(self) -> None:
        super().__init__(SchedulerState())
        self.behind: dict = {}
        self.barriers = 0
        self.looks = 0

    async def barrier(self, timeout_s: float = 5.0) -> None:
        self.barriers += 1

    def status(self) -> dict:
        st = super().status()
        if self.behind:
            self.looks += 1
            if self.looks > 1:  # applied meanwhile
                self.state.tokens.update(self.behind)
                self.behind.clear()
            else:
                st = dict(st, last_applied=st["last_applied"] - 1)
        return st


async def _reader_token(raft: CatchingUp, client) -> tuple[str, str]:
    r = await client.post("/v1/tokens", json={"role": "reader"})
    assert r.status == 201, await r.text()
    body = await r.json()
    raft.behind[body["id"]] = raft.state.tokens.pop(body["id"])  # the replica has not applied it
    return body["id"], body["token"]


def test_a_token_the_replica_has_not_applied_yet_is_accepted_once_it_has_caught_up():
    raft = CatchingUp()

    async def t(r, service, client):
        _, tok = await _reader_token(raft, client)
        before = raft.barriers
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status == 200, await resp.text()
        assert raft.looks >= 2, "it waited for the replica to catch up"
        assert raft.barriers == before, "no entry through the log"
        assert client.app[AUTH_KEY].refused == 0, "not counted as a refused token"
    run_api(t, raft)


def test_a_follower_waits_for_the_leaders_commit_index_it_heard():
    raft = CatchingUp()

    async def t(r, service, client):
        _, tok = await _reader_token(raft, client)  # (made through the leader)
        raft.leader = False
        base = CatchingUp.status

        def follower():
            st = base(raft)
            # It has committed what it applied; the leader's last message said one more.
            return dict(st, leader="127.0.0.1:9", is_leader=False, commit_index=st["last_applied"])
        r.status = follower
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status == 200, await resp.text()
        assert raft.looks >= 2 and raft.barriers == 0
    run_api(t, raft)


def test_a_token_still_unknown_once_caught_up_is_refused_and_counted_once():
    raft = CatchingUp()

    async def t(r, service, client):
        _, tok = await _reader_token(raft, client)
        raft.behind.clear()  # never applied: an unknown token
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status == 401 and (await resp.json())["error"]["message"] == "unknown or revoked token"
        assert client.app[AUTH_KEY].refused == 1 and raft.barriers == 0
    run_api(t, raft)


def test_a_revoked_token_is_refused_at_once():
    raft = CatchingUp()

    async def t(r, service, client):
        r1 = await client.post("/v1/tokens", json={"role": "reader"})
        body = await r1.json()
        assert (await client.delete(f"/v1/tokens/{body['id']}")).status == 200
        looks = raft.looks
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {body['token']}"})
        assert resp.status == 401 and raft.looks == looks
    run_api(t, raft)


def test_a_token_unknown_here_while_no_leader_can_say_is_a_503_not_a_401():
    raft = CatchingUp()

    async def t(r, service, client):
        _, tok = await _reader_token(raft, client)
        raft.leader = False  # (FakeRaft: no leader known)
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        body = await resp.json()
        assert resp.status == 503, body
        assert "cannot tell whether this token is known" in body["error"]["message"]
    run_api(t, raft)


def test_the_bootstrap_token_needs_no_wait():
    raft = CatchingUp()

    async def t(r, service, client):
        resp = await client.get("/v1/jobs?stale=true", headers=AUTH)
        assert resp.status == 200 and raft.looks == 0 and raft.barriers == 0
    run_api(t, raft)
