"""A replace that changes only a job's jitter_s (queries.rejitter_position, jobs.put_job's
``was``): each nominal slot a run or a record exactly once, the grid kept, and apply computing
no slot. Found by a review of the first version, which computed the position in apply (a zone
a replica does not know refused there, other zone rules another cursor), lost a slot the
trigger had fired ahead past, and could move the cursor a day ahead."""
from __future__ import annotations

import asyncio
import copy
from zoneinfo import ZoneInfo

import pytest

from raftsched.core import commands, model
from raftsched.core import schedule as sch
from raftsched.node.service import Service

from core_helpers import T0, apply, new_state, spec_of
from test_stale_replan import _batch_setup
from test_trigger import setup, spec

MIN = 60_000


def covered(st, name):
    """(slot, slot_to, state, kind) of every run/record of job ``name``."""
    out = []
    for r in st.runs.values():
        if r["job"] == name:
            out.append((r["slot"], r.get("slot_to"), r["state"], r.get("kind")))
    return sorted(out)


def nominal_counts(st, name, anchor, every):
    """How many runs/records cover each nominal slot (index k of anchor + k*every)."""
    c = {}
    for slot, to, _state, _kind in covered(st, name):
        lo = (slot - anchor) // every
        hi = lo if to is None else (to - anchor) // every
        for k in range(lo, hi + 1):
            c[k] = c.get(k, 0) + 1
    return c


@pytest.mark.parametrize("at_ms", range(0, 10_000, 500))
def test_fired_ahead_cursor_past_next_nominal_then_lower_jitter(at_ms):
    """every_s=10, jitter_s=9, fires ahead (overlap allow): change to jitter_s=1 at various
    instants; each nominal slot must be a run or a record exactly once."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=10, pol="skip"), jitter_s=9)
    asyncio.run(svc.put_job("j0", raw, None))
    anchor = st.jobs["j0"]["anchor"]
    for _ in range(300):  # 30 s
        asyncio.run(trig.tick())
        clock.advance(100)
    clock.advance(at_ms)
    before = dict(st.jobs["j0"])
    asyncio.run(svc.put_job("j0", dict(raw, jitter_s=1), None))
    after = st.jobs["j0"]
    for _ in range(300):
        asyncio.run(trig.tick())
        clock.advance(100)
    c = nominal_counts(st, "j0", anchor, 10_000)
    ks = sorted(c)
    missing = [k for k in range(ks[0], ks[-1] + 1) if k not in c]
    dup = [k for k in ks if c[k] > 1]
    assert not missing and not dup, (missing, dup, "cursor", before["cursor"] - anchor, "old next",
                                     before["next"] - anchor, "new cursor", after["cursor"] - anchor,
                                     "new next", after["next"] - anchor)


@pytest.mark.parametrize("new_j", [None, 1])
def test_a_slot_the_trigger_fired_ahead_past_still_fires_at_its_new_offset(new_j):
    """every_s=10, jitter_s=9 (overlap allow: fires ahead). Once a fire's cursor (now + look-ahead)
    lies past the next slot's nominal instant but before its old instant, a replace that lowers
    (or removes) jitter_s gives the slot a new instant at or before the cursor: the cursor moves
    back to just before it (no slot before it lies later), and it fires once (the first version
    walked on from the cursor, and the slot was neither run nor recorded)."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=10, pol="fire_all", grace_s=3600), jitter_s=9)
    asyncio.run(svc.put_job("j0", raw, None))
    a = st.jobs["j0"]["anchor"]
    E = 10_000
    for _ in range(5000):
        asyncio.run(trig.tick())
        j = st.jobs["j0"]
        if j["cursor"] >= (j["next"] - a) // E * E + a:
            break
        clock.advance(100)
    else:
        pytest.skip("never reached")
    j = dict(st.jobs["j0"])
    nom = (j["next"] - a) // E * E + a
    new = dict(raw)
    new.pop("jitter_s")
    if new_j:
        new["jitter_s"] = new_j
    asyncio.run(svc.put_job("j0", new, None))
    for _ in range(300):
        asyncio.run(trig.tick())
        clock.advance(100)
    c = nominal_counts(st, "j0", a, E)
    kn = (nom - a) // E
    assert c.get(kn, 0) == 1, ("nominal slot", nom - a, "covered", c.get(kn, 0), sorted(c.items())[-6:])


# ------------------------------------------------------------------ apply computes no slot (I4)


def _cron_job(jitter_s):
    return spec_of({"cron": "0 9 * * *", "timezone": "America/Sao_Paulo"}, "skip", jitter_s=jitter_s)


def test_apply_of_a_jitter_change_computes_no_slot_even_in_a_zone_it_does_not_know():
    """I4 (docs/design.md): apply computes no schedule (tests/test_core_jobs.py stores a cron and a
    zone no library knows): a jitter-only replace of such a job applies with the proposer's
    position (the first version ran _cron_next in apply, and a replica without the zone refused
    it)."""
    s = new_state()
    spec = copy.deepcopy(_cron_job(600))
    spec["schedule"]["timezone"] = "Mars/Olympus"
    assert apply(s, commands.make("put_job", T0, None, name="odd", spec=spec, next=T0 + 7, cursor=T0, anchor=T0))["ok"]
    spec2 = copy.deepcopy(spec)
    spec2["schedule"]["jitter_ms"] = 1_200_000
    res = apply(s, commands.make("put_job", T0 + 1, None, name="odd", spec=spec2, next=T0 + 9, cursor=T0, anchor=T0))
    assert res["ok"], res


def test_replicas_with_different_zone_rules_store_the_same_position(monkeypatch):
    """Replica A's tzdata has America/Sao_Paulo's DST ending 2018-02-18; replica B's (emulated:
    Etc/GMT+3, the zone's offset after that day) has no DST there. The same committed
    jitter-only put_job stores the same position on both (the first version computed it in
    apply: B moved the cursor and A did not, and the leader's next fire applied on A only)."""
    from raftsched.core import schedule as sch
    sp = lambda j: spec_of({"cron": "0 9 * * *", "timezone": "America/Sao_Paulo"}, "skip", jitter_s=j)
    old, new = sp(3000), sp(600)
    n = sch.parse_iso_ms("2018-02-18T12:00:00Z", "t")
    c = sch.parse_iso_ms("2018-02-17T11:40:00Z", "t")  # m fired (at its old offset) by A's trigger
    nxt = n + sch.jitter_offset_ms(old["schedule"]["jitter_key"], n, 3_000_000)
    cmd1 = commands.make("put_job", c, None, name="j", spec=old, next=nxt, cursor=c, anchor=c)
    cmd2 = commands.make("put_job", c + 1000, None, name="j", spec=new, next=nxt, cursor=c, anchor=c)
    a, b = new_state(), new_state()
    assert apply(a, cmd1)["ok"] and apply(a, cmd2)["ok"]
    real = sch.zone
    monkeypatch.setattr(sch, "zone", lambda name: ZoneInfo("Etc/GMT+3") if name == "America/Sao_Paulo" else real(name))
    assert apply(b, cmd1)["ok"] and apply(b, cmd2)["ok"]
    pa = (a.jobs["j"]["cursor"], a.jobs["j"]["next"])
    pb = (b.jobs["j"]["cursor"], b.jobs["j"]["next"])
    assert pa == pb, ("A", [sch.iso(x) for x in pa], "B", [sch.iso(x) for x in pb])


def test_a_schedule_change_soon_after_a_jitter_change_still_fires_todays_new_slot():
    """Daily cron 09:00 UTC, jitter_s 600 -> 3000 after today's slot fired at its old offset,
    its new offset later: the cursor moves up over today's slot at its new offset (at most a
    jitter ahead), not to tomorrow. A replace to "0 12 * * *" minutes later (a changed schedule:
    starts from the PUT or the cursor when ahead) fires today's 12:00 (the first version moved
    the cursor to tomorrow 08:59:59.999, and today's 12:00 never fired nor was recorded)."""
    from raftsched.core import schedule as sch
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    D = 86_400_000
    base = dict(spec(every_s=3600, pol="fire_all", grace_s=3600))
    base["schedule"] = {"cron": "0 9 * * *"}
    # find a day whose 09:00 has old offset < new offset (name "j0")
    day0 = (clock.now_ms() // D + 1) * D
    for d in range(50):
        n9 = day0 + d * D + 9 * 3600_000
        if sch.jitter_offset_ms("j0", n9, 600_000) + 60_000 < sch.jitter_offset_ms("j0", n9, 3_000_000):
            break
    clock.advance(n9 - 3600_000 - clock.now_ms())  # 08:00
    asyncio.run(svc.put_job("j0", dict(base, jitter_s=600), None))
    while clock.now_ms() < n9 + sch.jitter_offset_ms("j0", n9, 600_000) + 20_000:
        asyncio.run(trig.tick())
        clock.advance(1000)
    assert any(r["job"] == "j0" for r in st.runs.values()), "today's 09:00 fired"
    asyncio.run(svc.put_job("j0", dict(base, jitter_s=3000), None))
    other = dict(base, schedule={"cron": "0 12 * * *"})
    asyncio.run(svc.put_job("j0", other, None))
    noon = n9 + 3 * 3600_000
    clock.advance(noon + 60_000 - clock.now_ms())
    asyncio.run(trig.tick())
    slots = sorted(r["slot"] for r in st.runs.values() if r["job"] == "j0")
    assert noon in slots, [sch.iso(x) for x in slots]


def test_jitter_on_a_parent_with_a_same_slot_child_is_still_refused():
    from raftsched.core.errors import InvalidSpec
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    phased = {"every_s": 60, "start_at": "2030-01-01T00:00:00Z"}
    par = dict(spec(), schedule=phased)
    asyncio.run(svc.put_job("p", par, None))
    asyncio.run(svc.put_job("k", dict(spec(), schedule=phased, after=["p"]), None))
    with pytest.raises(InvalidSpec):
        asyncio.run(svc.put_job("p", dict(par, jitter_s=5), None))
    # batch path too
    with pytest.raises(InvalidSpec, match="never meet"):
        asyncio.run(svc.put_jobs({"jobs": {"p": dict(par, jitter_s=5)}}, None))
    assert "jitter_ms" not in st.jobs["p"]["spec"]["schedule"]


@pytest.mark.parametrize("catch_up", [False, True])
@pytest.mark.parametrize("old_j, new_j, at_min", [(600, 3000, 20), (3000, 600, 20), (3000, 600, 55), (0, 3000, 30)])
def test_paused_job_jitter_change_then_resume(catch_up, old_j, new_j, at_min):
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    H = 3600 * 1000
    raw = dict(spec(every_s=3600, pol="fire_all", grace_s=3600), **({"jitter_s": old_j} if old_j else {}))
    raw["schedule"] = {"cron": "0 * * * *"}
    clock.advance(H // 2)
    asyncio.run(svc.put_job("j0", raw, None))
    first = st.jobs["j0"]["next"] // H
    clock.advance(first * H - clock.now_ms())
    for _ in range(at_min * 6):
        asyncio.run(trig.tick())
        clock.advance(10_000)
    asyncio.run(svc.pause_job("j0", None))
    new = dict(raw)
    new.pop("jitter_s", None)
    if new_j:
        new["jitter_s"] = new_j
    asyncio.run(svc.put_job("j0", new, None))
    for _ in range(30):
        asyncio.run(trig.tick())
        clock.advance(10_000)
    asyncio.run(svc.resume_job("j0", None, catch_up=catch_up))
    while clock.now_ms() < (first + 4) * H:
        asyncio.run(trig.tick())
        clock.advance(10_000)
    c = {}
    for r in st.runs.values():
        if r["job"] == "j0":
            lo = r["slot"] // H
            hi = (r.get("slot_to") or r["slot"]) // H
            for h in range(lo, hi + 1):
                c.setdefault(h - first, []).append((r["state"], r.get("reason")))
    assert sorted(c) == list(range(4)) and all(len(v) == 1 for v in c.values()), c


def test_after_an_outage_a_jitter_change_leaves_no_slot_unrecorded():
    """Hourly cron, jitter_s 3000, overlap forbid (fires at the slot: cursor = now). The leader is
    down from h-1:00 to h:10; the catch-up tick at h:10 (slot h-1 missed) leaves cursor = h:10
    with next = h + off_old(h) (> h:10). A replace to jitter_s 600 where off_new(h) < 10 min:
    slot h's new instant is behind the cursor; it is late, and its misfire policy decides it
    (the first version walked on from the cursor: neither fired nor recorded, I5)."""
    from raftsched.core import schedule as sch
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    H, M = 3600_000, 60_000
    raw = dict(spec(every_s=3600, pol="skip", grace_s=60), jitter_s=3000, overlap={"policy": "forbid"})
    raw["schedule"] = {"cron": "0 * * * *"}
    h0 = (clock.now_ms() // H + 1) * H
    for k in range(2, 200):
        h = h0 + k * H
        if sch.jitter_offset_ms("j0", h, 3_000_000) > 12 * M and sch.jitter_offset_ms("j0", h, 600_000) < 9 * M:
            break
    clock.advance(h - 2 * H - clock.now_ms())
    asyncio.run(svc.put_job("j0", raw, None))
    while clock.now_ms() < h - H:  # up to h-1:00
        asyncio.run(trig.tick())
        clock.advance(10_000)
    clock.advance(h + 10 * M - clock.now_ms())  # the leader was down until h:10
    asyncio.run(trig.tick())
    clock.advance(2 * M)
    asyncio.run(svc.put_job("j0", dict(raw, jitter_s=600), None))
    while clock.now_ms() < h + 2 * H:
        asyncio.run(trig.tick())
        clock.advance(10_000)
    hours = {}
    for r in st.runs.values():
        if r["job"] == "j0":
            for x in range(r["slot"] // H, (r.get("slot_to") or r["slot"]) // H + 1):
                hours.setdefault(x * H, []).append(r["state"])
    assert h in hours, {sch.iso(k): v for k, v in sorted(hours.items())}


def _planned_then_fired(rid):
    """j0 (every minute, jitter_s 30), a change to jitter_s 50 planned (its put_job command,
    request id ``rid``), then the job fires before that command commits."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = dict(spec(every_s=60, pol="fire_all", grace_s=3600), jitter_s=30)
    asyncio.run(svc.put_job("j0", raw, None))
    new = dict(raw, jitter_s=50)
    spec_new = model.validate_job("j0", new, clock.now_ms())
    cursor, anchor, nxt, was = svc._position("j0", spec_new["schedule"], clock.now_ms())
    assert was is not None
    clock.advance(st.jobs["j0"]["next"] + 1 - clock.now_ms())
    asyncio.run(trig.tick())  # the job fires: its cursor and next move
    cmd = commands.put_job(clock.now_ms(), rid, name="j0", spec=spec_new, next=nxt, cursor=cursor, anchor=anchor,
                           create_only=False, was=was)
    return st, raft, clock, trig, svc, new, cmd


def test_a_jitter_change_planned_before_a_fire_is_refused_as_stale_and_changes_nothing():
    """The proposer plans the position from the job as it reads it; a fire committed before the
    put (the trigger fired the job meanwhile) makes that position stale: apply refuses it (409,
    send it again), computing nothing, and the job is as the fire left it. Sent again, it
    applies."""
    st, raft, clock, trig, svc, new, cmd = _planned_then_fired(None)
    fired = dict(st.jobs["j0"])
    res = apply(st, cmd)
    assert not res["ok"] and res["error"]["code"] == "conflict" and "send it again" in res["error"]["message"], res
    assert st.jobs["j0"] == fired
    asyncio.run(svc.put_job("j0", new, None))
    assert st.jobs["j0"]["spec"]["schedule"]["jitter_ms"] == 50_000 and st.jobs["j0"]["cursor"] >= fired["cursor"]


# ------------------------------------------------------------------ a second review: ids, retries
def _ticks(trig, clock, until, step=100):
    while clock.now_ms() < until:
        asyncio.run(trig.tick())
        clock.advance(step)


def _first_minute(clock, want):
    m0 = (clock.now_ms() // MIN + 2) * MIN
    for k in range(500):
        M = m0 + k * MIN
        if want(M):
            return M
    raise AssertionError("no minute found")


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-another-job"])
def test_a_clamp_back_onto_the_id_of_a_run_an_older_schedule_made_leaves_that_run_the_slots(beside):
    """A (every 10 s, on the minute grid) fired slot M. At M+5 s a replace to B = "* * * * *"
    jitter_s 50 (a changed schedule: starts after A's cursor; next = M + off(M)). Then a replace
    dropping jitter_s (jitter-only) would clamp the cursor back to M-1 with next M: the id j0@M
    of A's run. That run is the slot's: the job goes on (the first version's fire failed I2 on
    every tick), and so does an unrelated job k whose fires rode in the same fire command."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    M = _first_minute(clock, lambda M: sch.jitter_offset_ms("j0", M, 50_000) >= 25_000)
    start = sch.iso(M - 10 * MIN)
    a = dict(spec(every_s=10, pol="fire_all", grace_s=3600), schedule={"every_s": 10, "start_at": start})
    clock.advance(M - 2 * MIN - clock.now_ms())
    asyncio.run(svc.put_job("j0", a, None))
    if beside:
        asyncio.run(svc.put_job("k", dict(spec(every_s=60), schedule={"cron": "* * * * *"}), None))
    _ticks(trig, clock, M + 5000)
    assert f"j0@{M}" in st.runs and st.runs[f"j0@{M}"]["kind"] == "scheduled"
    b = dict(spec(every_s=60, pol="fire_all", grace_s=3600), schedule={"cron": "* * * * *"}, jitter_s=50)
    asyncio.run(svc.put_job("j0", b, None))
    b2 = dict(b)
    b2.pop("jitter_s")
    asyncio.run(svc.put_job("j0", b2, None))
    _ticks(trig, clock, M + 5 * MIN)
    assert st.jobs["j0"]["cursor"] > M + 3 * MIN, "the job is stuck: its fire of slot M is refused"
    if beside:
        k_slots = sorted((r["slot"] - M) // MIN for r in st.runs.values() if r["job"] == "k")
        assert k_slots[-1] >= 4, ("k's slots (minutes from M)", k_slots)


def test_a_clamp_back_onto_a_slot_triggered_by_hand_leaves_that_run_the_slots():
    """A "* * * * *" jitter_s 50 job made at M+5 s (its first slot is M at M+off(M)); someone
    triggers the run for slot M (allowed: M <= cursor). Dropping jitter_s clamps the cursor back
    to M-1 with next M: the fire of slot M meets the id j0@M."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    M = _first_minute(clock, lambda M: sch.jitter_offset_ms("j0", M, 50_000) >= 25_000)
    clock.advance(M + 5000 - clock.now_ms())
    b = dict(spec(every_s=60, pol="fire_all", grace_s=3600), schedule={"cron": "* * * * *"}, jitter_s=50)
    asyncio.run(svc.put_job("j0", b, None))
    res = asyncio.run(raft.propose(commands.encode(commands.trigger_job(clock.now_ms(), None, name="j0",
                                                                        extra={"slot": M}))))
    assert res["ok"], res
    b2 = dict(b)
    b2.pop("jitter_s")
    asyncio.run(svc.put_job("j0", b2, None))
    _ticks(trig, clock, M + 3 * MIN)
    assert st.jobs["j0"]["cursor"] > M + MIN, ("stuck", st.jobs["j0"]["cursor"] - M, trig.last_fire_error)


def test_a_stale_jitter_replace_sent_again_with_its_idempotency_key_applies():
    """A jitter change refused as stale, sent again with the same Idempotency-Key (the
    documented way to retry a write): the remembered refusal is skipped, and the change planned
    afresh applies (the state machine replayed the refusal for good before)."""
    st, raft, clock, trig, svc, new, cmd = _planned_then_fired("put-j0-1")
    res = asyncio.run(raft.propose(commands.encode(cmd)))
    assert not res["ok"]
    out = asyncio.run(svc.put_job("j0", new, "put-j0-1"))
    assert st.jobs["j0"]["spec"]["schedule"]["jitter_ms"] == 50_000, out


def test_a_batch_item_refused_as_stale_is_planned_again_within_the_request():
    """POST /v1/jobs:batch changing jitter_s of j0 and j1; j0 fires between the cut and the
    commit (an item 'stale'): the node plans it again within the request, and the same request
    sent again replays the answer."""
    st, raft, clock, trig, svc, raw = _batch_setup()
    real = raft.propose
    fired = []

    async def propose(data, timeout_s=5.0):
        if commands.decode(data)["op"] == "put_jobs" and not fired:
            fired.append(1)
            clock.advance(6000)
            await trig.tick()  # a fire commits while the batch is in flight
        return await real(data, timeout_s)
    raft.propose = propose
    body = {"jobs": {"j0": dict(raw, jitter_s=50), "j1": dict(raw, jitter_s=50)}}
    out1 = asyncio.run(svc.put_jobs(body, "sync-1"))
    assert fired and all("error" not in v for v in out1["jobs"].values()), out1
    assert all(st.jobs[n]["spec"]["schedule"]["jitter_ms"] == 50_000 for n in ("j0", "j1"))
    again = asyncio.run(svc.put_jobs(body, "sync-1"))  # the same request again: replayed
    assert again.pop("duplicate") and again == out1


def test_a_former_pipeline_child_given_a_schedule_keeps_its_triggered_run_the_slots():
    """c ran after p ("* * * * *") and has the run c@M of p's slot M. At M+5 s c gets its own
    schedule "* * * * *" jitter_s 50 (a changed schedule: starts after M, its history's floor; next
    M + off(M)). Dropping the jitter then clamps c's cursor back to M-1, next M: c@M again."""
    from raftsched.core import queries
    from core_helpers import put_cmd, tick as core_tick
    from pipeline_helpers import T0, apply, chain_state, finish, job_raw, lease
    from raftsched.core import model
    M = T0 - T0 % MIN + MIN
    while sch.jitter_offset_ms("c", M, 50_000) < 25_000:
        M += MIN
    s = chain_state(("p", job_raw(schedule={"cron": "* * * * *"})), ("c", job_raw(after=["p"])))
    core_tick(s, M)
    for g in lease(s, M):
        finish(s, g, M + 1000, True)
    assert f"c@{M}" in s.runs
    raw = job_raw(schedule={"cron": "* * * * *"}, jitter_s=50)
    spec1 = model.validate_job("c", raw, M + 5000)
    assert apply(s, put_cmd(s, "c", spec1, M + 5000))["ok"]
    raw2 = job_raw(schedule={"cron": "* * * * *"})
    spec2 = model.validate_job("c", raw2, M + 6000)
    cursor, anchor, nxt, was = queries.rejitter_position(s, "c", spec2["schedule"])
    res = apply(s, commands.put_job(M + 6000, None, name="c", spec=spec2, next=nxt, cursor=cursor, anchor=anchor,
                                    create_only=False, was=was))
    assert res["ok"], res
    assert s.jobs["c"]["next"] > M  # c@M is the slot's run
    _cmd, res = core_tick(s, M + MIN + 1000)
    assert res is not None and res["ok"], res


# ------------------------------------------------------------------ any jitter change, at any moment
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st_  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st_.sampled_from(["cron", "every"]), period_min=st_.sampled_from([10, 60]), old_f=st_.floats(0, 1),
       new_f=st_.floats(0, 1), at_f=st_.floats(0, 1), pol=st_.sampled_from(["fire_all", "skip"]),
       overlap=st_.sampled_from(["allow", "forbid"]))
def test_any_jitter_change_at_any_moment_leaves_each_slot_one_run_or_record(kind, period_min, old_f, new_f, at_f, pol,
                                                                           overlap):
    """A job every 10 or 60 minutes, its jitter_s changed once (to anything below the period,
    none included) at any moment of a period: every slot of the grid from its first on is a run
    or a record exactly once (the misfire policy may record the one whose new instant had
    passed; nothing is fired twice, nothing is silent)."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    P = period_min * MIN
    old_j, new_j = int(old_f * (period_min * 60 - 1)), int(new_f * (period_min * 60 - 1))
    raw = dict(spec(every_s=period_min * 60, pol=pol, grace_s=60), overlap={"policy": overlap},
               **({"jitter_s": old_j} if old_j else {}))
    if kind == "cron":
        raw["schedule"] = {"cron": f"*/{period_min} * * * *" if period_min < 60 else "0 * * * *"}
    clock.advance(P // 2)
    asyncio.run(svc.put_job("j0", raw, None))
    anchor = st.jobs["j0"]["anchor"]
    base = anchor if kind == "every" else 0
    first = (st.jobs["j0"]["next"] - base) // P
    while clock.now_ms() < base + first * P + int(at_f * P):
        asyncio.run(trig.tick())
        clock.advance(P // 180)
    new = {k: v for k, v in raw.items() if k != "jitter_s"}
    if new_j:
        new["jitter_s"] = new_j
    asyncio.run(svc.put_job("j0", new, None))
    while clock.now_ms() < base + (first + 3) * P:
        asyncio.run(trig.tick())
        clock.advance(P // 180)
    slots: dict[int, int] = {}
    for r in st.runs.values():
        if r["job"] == "j0":
            for k in range((r["slot"] - base) // P, ((r.get("slot_to") or r["slot"]) - base) // P + 1):
                slots[k] = slots.get(k, 0) + 1
    assert slots.get(first, 0) == 1 and slots.get(first + 1, 0) == 1 and all(n == 1 for n in slots.values()), \
        (sorted(slots.items()), st.jobs["j0"]["cursor"] - base, st.jobs["j0"]["next"] - base)
