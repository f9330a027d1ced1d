"""A replace refused as stale (its job fired while the node planned it) is planned again by the
node, for a PUT and for each such item of a batch: the answer names each job once, a piped
batch keeps parents first (a child is checked against its parent as stored when the parent's
item is refused), and a request sent again with its Idempotency-Key is planned afresh (a stale
refusal is not remembered under its request id). From a review of the re-plan."""
from __future__ import annotations

import asyncio
import pytest
from raftsched.core import commands
from raftsched.core.errors import RaftschedError, Unavailable, Indeterminate
from raftsched.node.service import Service
from test_trigger import setup, spec


def _batch_setup():
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=60, pol="fire_all", grace_s=3600), jitter_s=30)
    asyncio.run(svc.put_job("j0", raw, None))
    asyncio.run(svc.put_job("j1", raw, None))
    clock.advance(min(st.jobs["j0"]["next"], st.jobs["j1"]["next"]) - 5000 - clock.now_ms())
    return st, raft, clock, trig, svc, raw


def _race(raft, clock, trig, then_fail=None):
    real = raft.propose
    n = []

    async def propose(data, timeout_s=5.0):
        if commands.decode(data)["op"] == "put_jobs":
            n.append(1)
            if len(n) == 1:
                clock.advance(6000)
                await trig.tick()  # a fire commits while the batch is in flight
            elif then_fail is not None:
                raise then_fail
        return await real(data, timeout_s)
    raft.propose = propose
    return n


@pytest.mark.parametrize("failure", [Unavailable("no leader"), Indeterminate("timeout")], ids=["unavailable", "indeterminate"])
def test_a_replanned_item_whose_command_fails_is_only_not_committed_or_unknown(failure):
    st, raft, clock, trig, svc, raw = _batch_setup()
    _race(raft, clock, trig, then_fail=failure)
    body = {"jobs": {"j0": dict(raw, jitter_s=50), "j1": dict(raw, jitter_s=50)}}
    with pytest.raises(type(failure)) as ei:
        asyncio.run(svc.put_jobs(body, "k1"))
    e = ei.value
    both = [n for n in e.extra["not_committed"] + e.extra["unknown"] if n in e.extra["jobs"]]
    assert not both, f"{both} both in jobs (as {[e.extra['jobs'][n] for n in both]}) and in not_committed/unknown"
    assert set(e.extra["jobs"]) | set(e.extra["not_committed"]) | set(e.extra["unknown"]) == {"j0", "j1"}


def test_a_piped_batch_whose_parent_item_is_stale_stores_no_cycle():
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    base = spec(every_s=60, pol="fire_all", grace_s=3600)
    asyncio.run(svc.put_job("c", base, None))
    p_old = dict(base, jitter_s=30, after=["c"], match="latest")
    asyncio.run(svc.put_job("p", p_old, None))
    clock.advance(st.jobs["p"]["next"] - 5000 - clock.now_ms())
    seen = []
    real = raft.propose

    async def propose(data, timeout_s=5.0):
        cmd = commands.decode(data)
        if cmd["op"] == "put_jobs":
            seen.append([it["name"] for it in cmd["jobs"]])
            if len(seen) == 1:
                clock.advance(6000)
                await trig.tick()
                res = await real(data, timeout_s)
                # the state right after the first command
                seen.append(("after first command", {n: [e["job"] for e in st.jobs[n]["spec"].get("after", ())] for n in ("c", "p")}, res))
                return res
            raise Unavailable("leader lost")
        return await real(data, timeout_s)
    raft.propose = propose
    body = {"jobs": {"p": dict(base, jitter_s=50), "c": dict(base, after=["p"], match="latest")}}
    try:
        asyncio.run(svc.put_jobs(body, "k"))
    except RaftschedError:
        pass  # (the command with p's new spec is lost: what matters is what was stored)
    edges = {n: [e["job"] for e in st.jobs[n]["spec"].get("after", ())] for n in ("c", "p")}
    assert not ("p" in edges["c"] and "c" in edges["p"]), f"cycle stored: {edges}"


def test_a_put_stale_four_times_sent_again_with_its_key_applies():
    from raftsched.core.errors import Conflict
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=10, pol="fire_all", grace_s=3600), jitter_s=3)
    asyncio.run(svc.put_job("j0", raw, None))
    real = raft.propose
    racing = [True]
    rids = []

    async def propose(data, timeout_s=5.0):
        cmd = commands.decode(data)
        if cmd["op"] == "put_job" and racing[0]:
            rids.append(cmd["rid"])
            clock.advance(st.jobs["j0"]["next"] + 1 - clock.now_ms())
            await trig.tick()  # the job fires between each plan and its commit
        return await real(data, timeout_s)
    raft.propose = propose
    new = dict(raw, jitter_s=7)
    with pytest.raises(Conflict) as e1:
        asyncio.run(svc.put_job("j0", new, "key-1"))
    assert e1.value.extra.get("stale") and rids == ["key-1", "key-1~1", "key-1~2", "key-1~3"], rids
    racing[0] = False  # nothing fires any more
    try:
        out = asyncio.run(svc.put_job("j0", new, "key-1"))
    except Conflict as e:
        pytest.fail(f"sent again with its key, no fire meanwhile: 409 again ({e.message}, {e.extra})")
    assert out["created"] is False and st.jobs["j0"]["spec"]["schedule"]["jitter_ms"] == 7000, out
