"""A token this replica does not hold yet: a node that just started (replaying its log) or one
behind the leader answered a valid token 401 "unknown or revoked token", and a remote worker,
taking the 401 as final, dropped a batch of outcomes (their runs ran again). The node now reads
again after the read barrier before it refuses a token it does not know (node/api.py
auth_middleware): 401 only if it is still unknown then, 503 when no leader can say."""
from __future__ import annotations

from raftsched.core.errors import Unavailable
from raftsched.node.http import AUTH as AUTH_KEY

from fakes import FakeRaft
from test_reads import AUTH, run_api
from raftsched.core.state import SchedulerState


class CatchingUp(FakeRaft):
    """A replica that holds the writes it has "not applied yet" aside (``behind``: token id ->
    record) and applies them when a barrier round completes, as a node catching up does."""

    def __init__(self) -> None:
        super().__init__(SchedulerState())
        self.behind: dict = {}
        self.barriers = 0
        self.barrier_error: Exception | None = None

    async def barrier(self, timeout_s: float = 5.0) -> None:
        self.barriers += 1
        if self.barrier_error is not None:
            raise self.barrier_error
        self.state.tokens.update(self.behind)
        self.behind.clear()


async def _reader_token(raft: CatchingUp, client) -> str:
    r = await client.post("/v1/tokens", json={"role": "reader"})
    assert r.status == 201, await r.text()
    body = await r.json()
    raft.behind[body["id"]] = raft.state.tokens.pop(body["id"])  # the replica has not applied it
    return body["token"]


def test_a_token_the_replica_has_not_applied_yet_is_accepted_after_the_barrier():
    raft = CatchingUp()

    async def t(r, service, client):
        tok = await _reader_token(raft, client)
        before = raft.barriers
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status == 200, await resp.text()
        assert raft.barriers == before + 1, "one barrier round, then the token was found"
        assert client.app[AUTH_KEY].refused == 0, "not counted as a refused token"
    run_api(t, raft)


def test_a_token_still_unknown_after_the_barrier_is_refused_and_counted_once():
    raft = CatchingUp()

    async def t(r, service, client):
        tok = await _reader_token(raft, client)
        raft.behind.clear()  # never applied: an unknown (or revoked) token
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status == 401 and (await resp.json())["error"]["message"] == "unknown or revoked token"
        assert client.app[AUTH_KEY].refused == 1
    run_api(t, raft)


def test_a_token_unknown_here_while_no_leader_can_say_is_a_503_not_a_401():
    raft = CatchingUp()

    async def t(r, service, client):
        tok = await _reader_token(raft, client)
        raft.barrier_error = Unavailable("no leader")
        resp = await client.get("/v1/jobs?stale=true", headers={"Authorization": f"Bearer {tok}"})
        body = await resp.json()
        assert resp.status == 503, body
        assert "cannot tell whether this token is known" in body["error"]["message"]
    run_api(t, raft)


def test_the_bootstrap_token_needs_no_barrier():
    raft = CatchingUp()

    async def t(r, service, client):
        before = raft.barriers
        resp = await client.get("/v1/jobs?stale=true", headers=AUTH)
        assert resp.status == 200 and raft.barriers == before
    run_api(t, raft)
