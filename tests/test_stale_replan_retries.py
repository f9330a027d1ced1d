"""A stale replace planned again, and what a request sent again with its key gets: the try that
applied, replayed (never applied again over a later writer's change), and a pipelines batch
whose request ids do not depend on the order of the body. From a review of the re-plan."""
from __future__ import annotations

from raftsched.core import commands, limits
from raftsched.core.errors import Indeterminate
from raftsched.core.errors import RaftschedError, Unavailable
from raftsched.node.service import Service
from test_trigger import setup, spec
import asyncio
import pytest



def test_replanned_items_over_several_commands_one_failing(monkeypatch):
    monkeypatch.setattr(limits, "put_jobs_items_max", 1)
    from raftsched.node import limits as nl
    monkeypatch.setattr(nl, "put_jobs_in_flight_max", 1)
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=60, pol="fire_all", grace_s=3600), jitter_s=30)
    for n in ("j0", "j1", "j2"):
        asyncio.run(svc.put_job(n, raw, None))
    clock.advance(max(st.jobs[n]["next"] for n in ("j0", "j1", "j2")) - 5000 - clock.now_ms())
    real = raft.propose
    seen = []

    async def propose(data, timeout_s=5.0):
        cmd = commands.decode(data)
        if cmd["op"] == "put_jobs":
            seen.append((cmd["rid"], [it["name"] for it in cmd["jobs"]]))
            if len(seen) == 1:
                clock.advance(max(st.jobs[n]["next"] for n in ("j0", "j1", "j2")) + 1 - clock.now_ms())
                await trig.tick()
            if len(seen) == 5:
                raise Unavailable("no leader")
        return await real(data, timeout_s)
    raft.propose = propose
    body = {"jobs": {n: dict(raw, jitter_s=50) for n in ("j0", "j1", "j2")}}
    with pytest.raises(RaftschedError) as ei:
        asyncio.run(svc.put_jobs(body, "k"))
    e = ei.value
    assert set(e.extra["jobs"]) | set(e.extra["not_committed"]) == {"j0", "j1", "j2"}
    assert not set(e.extra["jobs"]) & set(e.extra["not_committed"])




def _run(order, create_only=False):
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    base = spec(every_s=60)
    jobs = {"a": base, "b": base, "c": dict(base, after=["a"], match="latest")}
    body1 = {"jobs": {n: jobs[n] for n in ["a", "b", "c"]}, "create_only": create_only}
    body2 = {"jobs": {n: jobs[n] for n in order}, "create_only": create_only}
    out1 = asyncio.run(svc.put_jobs(body1, "k"))
    gens1 = {n: st.jobs[n]["gen"] for n in jobs}
    rids = [commands.decode(d)["rid"] for d in raft.proposed if commands.decode(d)["op"] == "put_jobs"]
    try:
        out2 = asyncio.run(svc.put_jobs(body2, "k"))
    except Exception as e:
        out2 = repr(e)
    rids2 = [commands.decode(d)["rid"] for d in raft.proposed if commands.decode(d)["op"] == "put_jobs"]
    gens2 = {n: st.jobs[n]["gen"] for n in jobs}
    return out1, out2, gens1, gens2, rids, rids2


def test_a_piped_batch_sent_again_in_another_order_is_a_duplicate():
    out1, out2, gens1, gens2, rids, rids2 = _run(["b", "a", "c"])
    assert gens1 == gens2 and out2.get("duplicate"), "the same body in another order applied again"


def test_a_create_only_piped_batch_sent_again_in_another_order_answers_as_first():
    out1, out2, gens1, gens2, rids, rids2 = _run(["b", "a", "c"], create_only=True)
    assert out2["created"] == out1["created"] == 3, out2




def _stale_then_applied_unanswered():
    """j0 (every 10 s, jitter_s 3); a PUT of jitter_s 7 with key key-1: its first try is refused
    as stale (the job fires between plan and commit), its second applies but its answer is lost
    (504). Returns the setup and the change."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=10, pol="fire_all", grace_s=3600), jitter_s=3)
    asyncio.run(svc.put_job("j0", raw, None))
    real = raft.propose
    seen = []

    async def propose(data, timeout_s=5.0):
        cmd = commands.decode(data)
        if cmd["op"] == "put_job" and cmd.get("rid", "").startswith("key-1") and len(seen) < 2:
            seen.append(cmd["rid"])
            if cmd["rid"] == "key-1":
                clock.advance(st.jobs["j0"]["next"] + 1 - clock.now_ms())
                await trig.tick()  # fires between plan and commit: stale
            else:
                res = await real(data, timeout_s)
                assert res["ok"], res
                raise Indeterminate("timed out waiting for the commit")  # committed; answer lost: 504
        return await real(data, timeout_s)
    raft.propose = propose
    mine = dict(raw, jitter_s=7)
    with pytest.raises(Indeterminate):
        asyncio.run(svc.put_job("j0", mine, "key-1"))
    assert st.jobs["j0"]["spec"]["schedule"]["jitter_ms"] == 7000 and seen == ["key-1", "key-1~1"]
    return st, raft, clock, svc, raw, mine


def test_put_retried_with_its_key_after_a_lost_success_does_not_apply_again():
    st, raft, clock, svc, raw, mine = _stale_then_applied_unanswered()
    # another writer changes the job meanwhile
    theirs = dict(raw, jitter_s=3, executor={"type": "shell", "argv": ["echo", "theirs"]})
    asyncio.run(svc.put_job("j0", theirs, "other-key"))
    gen_theirs = st.jobs["j0"]["gen"]
    # the client retries its 504 with the same key: the try that applied answers, replayed
    out = asyncio.run(svc.put_job("j0", mine, "key-1"))
    assert st.jobs["j0"]["spec"]["executor"]["argv"] == ["echo", "theirs"] and st.jobs["j0"]["gen"] == gen_theirs, \
        "the retried request (already applied as key-1~1) was applied again over the other writer's change"
    assert out.get("duplicate") is True, out


def test_put_retried_with_its_key_after_a_lost_success_does_not_recreate_a_deleted_job():
    st, raft, clock, svc, raw, mine = _stale_then_applied_unanswered()
    asyncio.run(raft.propose(commands.encode(commands.delete_job(clock.now_ms(), None, name="j0"))))
    assert "j0" not in st.jobs
    out = asyncio.run(svc.put_job("j0", mine, "key-1"))
    assert "j0" not in st.jobs, "a retry of a PUT that had applied re-created the job deleted since"
    assert out.get("duplicate") is True, out
