"""The leader's trigger loop over an in-process replica: no sockets, no clock, no sleeps."""
from __future__ import annotations

import asyncio

import pytest

from raftsched.clock import FakeClock
from raftsched.core import commands, due, limits, queries, schedule
from raftsched.core.state import SchedulerState
from raftsched.node import limits as node_limits
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger

from fakes import FakeRaft


def spec(every_s=10, pol="fire_all", **kw):
    raw = {"schedule": {"every_s": every_s}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": pol, **kw}, "history": 1000}
    return raw


def setup(n_jobs=1, **kw):
    st = SchedulerState()
    raft = FakeRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    trig = Trigger(raft, clock, "n1")
    trig.take_due_index()  # as _lead does on gaining leadership
    for i in range(n_jobs):
        asyncio.run(svc.put_job(f"j{i}", spec(**kw), None))
    return st, raft, clock, trig


def scheduled_slots(st, job):
    return [r["slot"] for r in st.runs.values() if r["job"] == job and r["kind"] == "scheduled"]


def tick_for(raft, clock, trig, ticks: int) -> list:
    """Tick every 100 ms ``ticks`` times; the fire entries proposed meanwhile, in order."""
    n = len(raft.proposed)
    for _ in range(ticks):
        asyncio.run(trig.tick())
        clock.advance(100)
    cmds = [commands.decode(d) for d in raft.proposed[n:]]
    return [e for c in cmds if c["op"] == "fire" for e in c["entries"]]


def test_tick_fires_each_due_slot_once():
    st, raft, clock, trig = setup()
    for _ in range(10):
        clock.advance(10_000)
        asyncio.run(trig.tick())
    slots = scheduled_slots(st, "j0")
    assert len(slots) == 10 and len(set(slots)) == 10
    assert all(b - a == 10_000 for a, b in zip(slots, slots[1:]))


def test_a_job_popped_for_a_slot_its_schedule_has_not_is_moved_to_its_next_not_popped_each_tick():
    """A jittered interval job put by the version whose grid made its anchor a slot stores that
    next slot (anchor + offset); the planner now finds none due there, and pushed the job back at
    the same slot, so it was popped again every tick (2 ms) until its real first slot, an
    interval later. The trigger proposes an entry that moves no slot and sets the job's next."""
    st, raft, clock, trig = setup(n_jobs=0)
    raw = dict(spec(every_s=3600), jitter_s=600)
    asyncio.run(Service(raft, clock, "n1").put_job("j0", raw, None))
    job = st.jobs["j0"]
    assert job["cursor"] == job["anchor"] and job["next"] > job["anchor"] + 3600 * 1000
    real = job["next"]
    old = job["anchor"] + 1000  # what the older grid stored: the anchor, moved by its offset
    job["next"] = old
    due.repush(st, ["j0"])
    clock.advance(old - clock.now_ms())
    n = len(raft.proposed)
    asyncio.run(trig.tick())
    cmds = [commands.decode(d) for d in raft.proposed[n:]]
    assert [c["op"] for c in cmds] == ["fire"] and cmds[0]["entries"][0][4:] == [real, [], []], cmds
    assert st.jobs["j0"]["next"] == real and not st.runs
    n = len(raft.proposed)
    for _ in range(20):
        clock.advance(7)
        asyncio.run(trig.tick())
    assert len(raft.proposed) == n, "not popped again before its real slot"


def test_nothing_due_proposes_nothing():
    st, raft, clock, trig = setup()
    n = len(raft.proposed)
    clock.advance(5_000)
    assert asyncio.run(trig.tick()) == 0
    assert len(raft.proposed) == n


def test_one_fire_command_carries_every_due_job_within_size_limit():
    st, raft, clock, trig = setup(n_jobs=500)
    n = len(raft.proposed)
    clock.advance(10_000)
    asyncio.run(trig.tick())
    fires = raft.proposed[n:]
    assert 1 <= len(fires) <= 500 // limits.fire_entries_max + 2
    assert all(len(f) <= limits.command_bytes_max for f in fires)
    assert sum(len(scheduled_slots(st, f"j{i}")) for i in range(500)) == 500


def test_failed_proposal_pushes_jobs_back_and_next_tick_fires_them():
    st, raft, clock, trig = setup()
    clock.advance(10_000)
    raft.fail = "unavailable"
    asyncio.run(trig.tick())
    assert scheduled_slots(st, "j0") == []
    raft.fail = None
    asyncio.run(trig.tick())
    assert len(scheduled_slots(st, "j0")) == 1


def test_indeterminate_fire_that_applied_is_not_fired_twice():
    st, raft, clock, trig = setup()
    clock.advance(10_000)
    raft.fail = "indeterminate_applied"
    asyncio.run(trig.tick())
    raft.fail = None
    asyncio.run(trig.tick())
    assert len(scheduled_slots(st, "j0")) == 1, "I2: the re-planned fire was a no-op"


def test_a_second_leader_replaying_an_old_fire_creates_nothing():
    st, raft, clock, trig = setup()
    clock.advance(10_000)
    asyncio.run(trig.tick())
    old_fire = raft.proposed[-1]
    clock.advance(10_000)
    asyncio.run(trig.tick())
    res = st.apply_bytes(old_fire)
    assert res["ok"] and res["stale"] == 1 and res["fired"] == 0
    assert len(scheduled_slots(st, "j0")) == 2


def test_leader_outage_follows_policy_fire_once():
    st, raft, clock, trig = setup(pol="fire_once", grace_s=5)
    clock.advance(10_000)
    asyncio.run(trig.tick())
    clock.advance(95_000)  # the leader was away for 95 s: 9 slots due, one on time
    asyncio.run(trig.tick())
    runs = [r for r in st.runs.values() if r["job"] == "j0"]
    sched = [r for r in runs if r["kind"] == "scheduled"]
    recs = [r for r in runs if r["kind"] == "recorded"]
    # slots 20..100 s: 100 is 5 s late (on time); 90 is the latest missed; 20..80 coalesced.
    assert [r["slot"] - sched[0]["slot"] for r in sched] == [0, 80_000, 90_000]
    assert len(recs) == 1 and recs[0]["state"] == "coalesced" and recs[0]["count"] == 7


def test_takeover_barrier_then_fires_missed_slots():
    st, raft, clock, trig = setup(pol="skip", grace_s=1)
    clock.advance(60_000)

    async def lead_once():
        raft.leader = True
        task = asyncio.create_task(trig._lead())
        for _ in range(100):
            await asyncio.sleep(0)  # ok-sleep: yields to the task under test, bounded by the loop
            if st.leader is not None and any(r["state"] == "skipped" for r in st.runs.values()):
                break
        raft.leader = False
        await asyncio.wait_for(task, 5)

    asyncio.run(lead_once())
    assert st.leader == {"node": "n1", "since": clock.now_ms()}
    recs = [r for r in st.runs.values() if r["state"] == "skipped"]
    # Slots at 10..60 s: 60 s is on time (fired at once), 10..50 s were missed and are recorded.
    assert len(recs) == 1 and recs[0]["count"] == 5 and recs[0]["reason"] == "misfire"
    assert [s - clock.now_ms() for s in scheduled_slots(st, "j0")] == [0]


def test_the_due_index_is_the_leading_triggers_and_goes_with_the_leadership():
    """The state holds a due index only while its trigger leads (core/due.py): made fresh from
    the jobs when the trigger takes over, fed by apply meanwhile, taken back when it stops."""
    st, raft, clock, trig = setup(n_jobs=3)
    trig.drop_due_index()
    assert st.due is None
    seen = []

    async def lead_once():
        raft.leader = True
        task = asyncio.create_task(trig._lead())
        for _ in range(100):
            await asyncio.sleep(0)  # ok-sleep: yields to the task under test, bounded by the loop
            if st.due is not None:
                seen.append(sorted(n for b in st.due.now.at.values() for n in b[::2]) +
                            sorted(n for b in st.due.ahead.at.values() for n in b[::2]))
                break
        raft.leader = False
        await asyncio.wait_for(task, 5)

    asyncio.run(lead_once())
    assert seen == [["j0", "j1", "j2"]], "built from the jobs on leading"
    assert st.due is None, "taken back when leadership ends"
    # Without one, apply feeds nothing and the trigger pops nothing.
    clock.advance(60_000)
    assert asyncio.run(trig.tick()) == 0


def test_at_job_in_the_past_follows_misfire_policy():
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    at = schedule.iso(clock.now_ms() - 3_600_000)
    raw = {"schedule": {"at": at}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "fire_once"}}
    asyncio.run(svc.put_job("once", raw, None))
    asyncio.run(trig.tick())
    assert len(scheduled_slots(st, "once")) == 1
    clock.advance(3_600_000)
    asyncio.run(trig.tick())
    assert len(scheduled_slots(st, "once")) == 1, "a one-shot fires once"
    assert st.jobs["once"]["next"] is None


# ----------------------------------------------------------------------------- firing ahead
def test_allow_jobs_fire_ahead_and_their_runs_wait_for_the_slot():
    st, raft, clock, trig = setup()
    slot = st.jobs["j0"]["next"]
    clock.advance(slot - limits.fire_ahead_ms - 1 - clock.now_ms())
    asyncio.run(trig.tick())
    assert scheduled_slots(st, "j0") == [], "not before fire_ahead_ms"
    clock.advance(slot - limits.fire_ahead_ms + 10 - clock.now_ms())
    asyncio.run(trig.tick())
    assert scheduled_slots(st, "j0") == [slot]
    run = st.runs[f"j0@{slot}"]
    assert run["state"] == "queued" and run["fired_at"] < slot
    early = st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None, max=10, ttl=30_000))
    assert early["ok"] and early["runs"] == [], "no worker may start it before its slot"
    at_slot = st.apply(commands.make("acquire", slot, None, worker="w", queues=None, max=10, ttl=30_000))
    assert [r["id"] for r in at_slot["runs"]] == [f"j0@{slot}"]
    assert st.jobs["j0"]["stats"][2] == 0  # lag_ms_last (records.STATS_FIELDS)
    # the next tick does not fire the same slot again
    clock.advance(slot - clock.now_ms())
    asyncio.run(trig.tick())
    assert scheduled_slots(st, "j0") == [slot]


@pytest.mark.parametrize("span_ms", [1000, 3000])
def test_a_job_taken_up_ahead_has_the_next_span_of_its_slots_planned_with_it(monkeypatch, span_ms):
    """An every_s: 1 job is planned with span_ms / 1 s + 1 slots an entry (limits.fire_ahead_span_ms:
    four by default), after a first entry that may carry fewer (it starts the job's block,
    policy.phased_ahead_ms); an every_s: 2 job with half as many. Every slot fires once, in
    order, none earlier than fire_ahead_ms + fire_ahead_span_ms before it, and each entry's first
    slot no earlier than fire_ahead_ms before it."""
    monkeypatch.setattr(limits, "fire_ahead_span_ms", span_ms)
    for every_s in (1, 2):
        per_entry = span_ms // (every_s * 1000) + 1
        st, raft, clock, trig = setup(every_s=every_s)
        first = st.jobs["j0"]["next"]
        clock.advance(first - limits.fire_ahead_ms - clock.now_ms())
        entries = tick_for(raft, clock, trig, 160)
        assert len(entries) >= 4 and len(entries[0][5]) <= per_entry, (every_s, entries)
        assert all(len(e[5]) == per_entry for e in entries[1:]), (every_s, entries)
        slots = scheduled_slots(st, "j0")
        assert slots == sorted(set(slots)) == list(range(first, first + len(slots) * every_s * 1000, every_s * 1000))
        for r in (st.runs[f"j0@{s_}"] for s_ in slots):
            assert r["slot"] - r["fired_at"] <= limits.fire_ahead_ms + limits.fire_ahead_span_ms
        for e in entries:
            fired_at = st.runs[f"j0@{e[5][0]}"]["fired_at"]
            assert e[5][0] - fired_at <= limits.fire_ahead_ms


@pytest.mark.parametrize("span_ms", [1000, 3000])
def test_jobs_registered_at_once_are_taken_up_spread_over_their_block(monkeypatch, span_ms):
    """400 jobs every second, all with the same slots: each is planned once a block of span_ms +
    1 s, and the blocks' phases (a hash of the name) spread the take-ups, so each second of a
    block plans about a quarter (span 3 s) or a half (1 s) of them, not all of them every
    block's first second and none in the others."""
    monkeypatch.setattr(limits, "fire_ahead_span_ms", span_ms)
    n, k = 400, span_ms // 1000 + 1
    st, raft, clock, trig = setup(n_jobs=n, every_s=1)
    first = st.jobs["j0"]["next"]
    clock.advance(first - limits.fire_ahead_ms - clock.now_ms())
    tick_for(raft, clock, trig, 10 * k)  # past every job's first, shorter, entry
    per_second = []
    for _ in range(2 * k):
        entries = tick_for(raft, clock, trig, 10)
        per_second.append(len(entries))
        assert {len(e[5]) for e in entries} == {k}
    assert sum(per_second) == 2 * n
    assert all(0.7 * n / k <= c <= 1.3 * n / k for c in per_second), per_second


def test_a_trigger_that_fires_at_the_slot_plans_no_span():
    st, raft, clock, trig = setup(every_s=1)
    trig.fire_ahead_ms = 0
    first = st.jobs["j0"]["next"]
    clock.advance(first - clock.now_ms())
    entries = tick_for(raft, clock, trig, 40)
    assert entries and all(len(e[5]) == 1 for e in entries)
    assert all(r["fired_at"] >= r["slot"] for r in st.runs.values() if r["job"] == "j0")


def test_jobs_whose_overlap_policy_reads_other_runs_fire_at_their_slot():
    st = SchedulerState()
    raft = FakeRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    trig = Trigger(raft, clock, "n1")
    trig.take_due_index()  # as _lead does on gaining leadership
    for pol in ("forbid", "queue_one", "replace"):
        asyncio.run(svc.put_job(pol, {**spec(), "overlap": {"policy": pol}}, None))
    slot = st.jobs["forbid"]["next"]
    clock.advance(slot - 1 - clock.now_ms())
    asyncio.run(trig.tick())
    assert [r for r in st.runs.values() if r["kind"] == "scheduled"] == []
    clock.advance(slot - clock.now_ms())
    asyncio.run(trig.tick())
    assert sorted(r["job"] for r in st.runs.values() if r["kind"] == "scheduled") == ["forbid", "queue_one", "replace"]


def test_pausing_holds_runs_fired_ahead_and_resuming_before_their_slot_releases_them():
    st, raft, clock, trig = setup()
    slot = st.jobs["j0"]["next"]
    clock.advance(slot - 100 - clock.now_ms())
    asyncio.run(trig.tick())
    assert queries.queue_depth(st, "default") == 1
    svc = Service(raft, clock, "n1")
    assert asyncio.run(svc.pause_job("j0", None)) == {"job": "j0", "paused": True, "held": 1}
    run = st.runs[f"j0@{slot}"]
    assert (run["state"], run["due"]) == ("queued", None)
    view = svc.get_run(f"j0@{slot}")
    assert view["waiting_for"] == "its job to be resumed" and view["due"] is None
    # Resumed before its slot: queued again, handed out at its slot.
    clock.advance(50)
    assert asyncio.run(svc.resume_job("j0", None)) == {"job": "j0", "paused": False, "released": 1, "skipped": 0,
                                                         "recorded": 0}
    res = st.apply(commands.make("acquire", slot, None, worker="w", queues=None, max=10, ttl=30_000))
    assert [g["id"] for g in res["runs"]] == [f"j0@{slot}"]


def test_a_held_heartbeat_slot_says_it_waits_for_the_resume_not_for_a_ping():
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    raw = spec()
    raw["executor"] = {"type": "heartbeat"}
    asyncio.run(svc.put_job("hb", raw, None))
    slot = st.jobs["hb"]["next"]
    clock.advance(slot - 100 - clock.now_ms())
    asyncio.run(trig.tick())
    assert svc.get_run(f"hb@{slot}")["waiting_for"] == "a ping: POST /v1/jobs/hb/ping"
    assert asyncio.run(svc.pause_job("hb", None))["held"] == 1
    view = svc.get_run(f"hb@{slot}")
    assert (view["state"], view["waiting_for"]) == ("waiting", "its job to be resumed")


def _fired_ahead_then_paused():
    """j0's next slot fired 100 ms ahead, then j0 paused (the run held). :returns: (state,
    clock, service, slot)."""
    st, raft, clock, trig = setup()
    slot = st.jobs["j0"]["next"]
    clock.advance(slot - 100 - clock.now_ms())
    asyncio.run(trig.tick())
    svc = Service(raft, clock, "n1")
    assert asyncio.run(svc.pause_job("j0", None))["held"] == 1
    return st, clock, svc, slot


def test_a_resume_after_the_held_runs_slot_records_it_skipped_paused():
    st, clock, svc, slot = _fired_ahead_then_paused()
    clock.advance(1_000)
    assert asyncio.run(svc.resume_job("j0", None))["skipped"] == 1
    run = st.runs[f"j0@{slot}"]
    assert (run["state"], run["reason"]) == ("skipped", "paused")
    assert queries.queue_depth(st, "default") == 0


@pytest.mark.parametrize("catch_up", [False, True])
def test_a_job_replaced_by_a_triggered_one_while_paused_skips_its_held_run_unless_caught_up(catch_up):
    """The service plans nothing for a triggered job's resume but sends its catch_up as given:
    the held run whose slot came is skipped (it used to force catch_up, and the run ran late),
    or, caught up, queued again."""
    st, clock, svc, slot = _fired_ahead_then_paused()
    asyncio.run(svc.put_job("p", spec(), None))
    asyncio.run(svc.put_job("j0", {k: v for k, v in spec().items() if k != "schedule"} | {"after": ["p"]}, None))
    assert st.jobs["j0"]["paused"] and "schedule" not in st.jobs["j0"]["spec"]
    clock.advance(1_000)
    assert asyncio.run(svc.resume_job("j0", None, catch_up=catch_up)) == {
        "job": "j0", "paused": False, "released": int(catch_up), "skipped": int(not catch_up), "recorded": 0}
    run = st.runs[f"j0@{slot}"]
    assert (run["state"], run.get("reason")) == (("queued", None) if catch_up else ("skipped", "paused"))


def test_the_fire_log_is_buffered_and_flushed_on_its_period_or_when_forced(tmp_path):
    """The fire log (benchmarks, ``fire_log_path``): one JSON line per committed fire command,
    written through a buffer flushed at most every ``fire_log_flush_s`` (node/limits.py) while
    firing and whenever forced (the loop forces it before it idles and when it stops leading)."""
    import json

    path = tmp_path / "fire.log"
    st, raft, clock, _ = setup(n_jobs=2)
    trig = Trigger(raft, clock, "n1", fire_log_path=str(path))
    clock.advance(10_000)
    trig._fire_log_flushed = clock.monotonic_s()  # flushed just now; the fake clock stands still
    asyncio.run(trig.tick())
    assert path.read_text() == ""  # in the buffer
    trig._flush_fire_log(force=True)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(s for x in lines for s in x["s"]) == sorted(scheduled_slots(st, "j0") + scheduled_slots(st, "j1"))
    assert all(x["c"] >= x["p"] for x in lines)

    clock.advance(10_000)  # every write of this tick is past the flush period
    asyncio.run(trig.tick())
    assert len(path.read_text().splitlines()) > len(lines)


async def _wait(cond, what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # ok-sleep: the poll interval of a deadline-bounded wait


def test_a_leader_whose_clock_disagrees_or_is_unknown_fires_and_expires_nothing():
    """The clock guard (docs/design.md, I27): while the replication layer judges the leader's
    clock off the cluster's, or cannot judge it, the trigger neither fires nor expires; it
    resumes when the clock agrees (or is unchecked: peers of another version)."""
    st, raft, clock, trig = setup(every_s=10)
    clock.advance(10_000)
    asyncio.run(trig.tick())  # one run fired, and leased below
    got = st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None, max=1, ttl=1_000))
    assert len(got["runs"]) == 1

    def ops():
        return [commands.decode(d)["op"] for d in raft.proposed]

    n0 = len(raft.proposed)

    async def lead(states):
        raft.leader = True
        task = asyncio.create_task(trig._lead())
        try:
            for state in states:
                raft.clock = dict(raft.clock, state=state, offset_ms=6000)
                held = trig.ticks_held_by_clock
                await _wait(lambda h=held: trig.ticks_held_by_clock >= h + 3, f"ticks held ({state})")
                assert trig.held_by_clock == state and trig.stats()["held_by_clock"] == state
                clock.advance(30_000)  # slots due, and the lease unrenewed for 30 TTLs
            n = len(raft.proposed)
            assert ops()[n0:] == ["takeover"], "nothing fired nor expired meanwhile"
            raft.clock = dict(raft.clock, state="agrees", offset_ms=0)
            await _wait(lambda: "fire" in ops()[n:], "a fire once the clock agrees")
            assert trig.held_by_clock is None
            clock.advance(2_000)
            await _wait(lambda: "expire" in ops(), "the reaper once the clock agrees")
        finally:
            raft.leader = False
            await asyncio.wait_for(task, 5)

    before = len(scheduled_slots(st, "j0"))
    asyncio.run(lead(["disagrees", "unknown"]))
    assert len(scheduled_slots(st, "j0")) > before


def test_a_leader_whose_peers_do_not_measure_clocks_fires_as_before():
    st, raft, clock, trig = setup(every_s=10)
    raft.clock = dict(raft.clock, state="unchecked", offset_ms=None)
    assert not trig.clock_holds()
    raft.clock = dict(raft.clock, state="disagrees", offset_ms=5000)
    assert trig.clock_holds() and trig.held_by_clock == "disagrees"


def test_the_trigger_commits_deadline_instants_with_the_fire_and_sweeps_them_by_its_clock():
    """A job with a deadline: its fire carries the slots' instants (computed here, not by apply),
    and the first tick after an instant proposes deadline_judge; a failed sweep is proposed again
    by the next tick. A job without one adds nothing to its fire and proposes no sweep."""
    st, raft, clock, trig = setup(n_jobs=1, pol="skip")
    asyncio.run(Service(raft, clock, "n1").put_job("d", dict(spec(pol="skip"), deadline={"succeed_within_s": 3}),
                                                   None))
    n = len(raft.proposed)
    clock.advance(10_000)
    asyncio.run(trig.tick())
    fires = [commands.decode(d) for d in raft.proposed[n:]]
    (fire,) = [c for c in fires if c["op"] == "fire"]
    (slot,) = scheduled_slots(st, "d")
    assert fire["dl"] == [["d", st.jobs["d"]["gen"], slot, None, slot + 3000, None]]
    clock.advance(3_100)
    raft.fail = "unavailable"
    asyncio.run(trig.tick())
    assert st.deadlines.slots[f"d@{slot}"]["state"] == "pending"
    raft.fail = None
    n = len(raft.proposed)
    asyncio.run(trig.tick())
    ops = [commands.decode(d)["op"] for d in raft.proposed[n:]]
    assert ops == ["deadline_judge"] and st.deadlines.slots[f"d@{slot}"]["state"] == "missed"
    n = len(raft.proposed)
    asyncio.run(trig.tick())
    assert raft.proposed[n:] == []  # nothing more to judge: no command


def test_a_deadline_sweep_cancelled_in_flight_puts_its_slots_back():
    """The sweep takes its slots out of the leader's index before it proposes; a proposal
    cancelled on the way (the trigger stopped as the leadership ended) put none back, so the
    slot waited for the index's next rebuild. Now it is judged by the next sweep."""
    st, raft, clock, trig = setup(n_jobs=1, pol="skip")
    asyncio.run(Service(raft, clock, "n1").put_job("d", dict(spec(pol="skip"), deadline={"succeed_within_s": 3}),
                                                   None))
    clock.advance(10_000)
    asyncio.run(trig.tick())
    (slot,) = scheduled_slots(st, "d")
    clock.advance(3_100)
    real = trig.proposer.propose

    async def cancelled(data, **kw):
        raise asyncio.CancelledError()
    trig.proposer.propose = cancelled
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(trig.judge_deadlines(clock.now_ms()))
    trig.proposer.propose = real
    assert asyncio.run(trig.judge_deadlines(clock.now_ms())) == 1
    assert st.deadlines.slots[f"d@{slot}"]["state"] == "missed"


def test_a_leadership_lost_and_won_again_within_a_tick_starts_a_new_term():
    """Two elections while a tick awaited leave ``is_leader`` true throughout: the term led is
    still a new one, and must start with its own barrier and takeover, and lease observations
    afresh (I15), not go on with the old term's."""
    st, raft, clock, trig = setup(pol="skip", grace_s=1)

    async def lead():
        raft.leader = True
        trig.on_role_change(True)
        task = asyncio.create_task(trig._lead())
        for _ in range(200):
            await asyncio.sleep(0)  # ok-sleep: yields to the task under test, bounded by the loop
            if st.leader is not None:
                break
        assert st.leader is not None, "took over"
        trig._lease_seen[("a-run", 0)] = 1.0  # an observation of this term's
        takeovers = sum(1 for d in raft.proposed if commands.decode(d)["op"] == "takeover")
        trig.on_role_change(False)  # lost and won again, while is_leader() stayed true
        trig.on_role_change(True)
        await asyncio.wait_for(task, 5)  # the term it led is over
        assert trig.raft.is_leader()
        task = asyncio.create_task(trig._lead())  # what run() does next
        for _ in range(200):
            await asyncio.sleep(0)  # ok-sleep: yields to the task under test, bounded by the loop
            if sum(1 for d in raft.proposed if commands.decode(d)["op"] == "takeover") > takeovers:
                break
        assert sum(1 for d in raft.proposed if commands.decode(d)["op"] == "takeover") == takeovers + 1
        assert trig._lease_seen == {}, "the new term observes leases afresh"
        raft.leader = False
        await asyncio.wait_for(task, 5)

    asyncio.run(lead())


def test_the_reaper_reads_the_leases_at_most_every_interval_and_expires_a_ttl_after_it_saw_them():
    """A busy leader ticks hundreds of times a second: the reaper reads every lease at most every
    reap_interval_s, and a lease left unrenewed is expired once the reaper has seen it unchanged for
    its TTL: no earlier than its TTL, and at most two intervals (and ticks) later, one to be seen
    and one to be seen again past its TTL."""
    st, raft, clock, trig = setup(every_s=10)
    reads = []
    real_read = raft.read

    def read(fn, *args, **kw):
        if fn in (queries.lease_sweep, queries.lease_views):
            reads.append(clock.monotonic_s())
        return real_read(fn, *args, **kw)

    raft.read = read
    slot = st.jobs["j0"]["next"]
    clock.advance(slot - clock.now_ms())
    asyncio.run(trig.tick())
    granted = st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None, max=1, ttl=1_000))
    [run_id] = [g["id"] for g in granted["runs"]]
    start = clock.monotonic_s()
    while st.runs[run_id]["state"] == "running":
        assert clock.monotonic_s() - start < 2, "expired a TTL after it was seen"
        asyncio.run(trig.tick())
        clock.advance(7)  # a tick every 7 ms
    expired_after = clock.monotonic_s() - start
    assert 1.0 <= expired_after <= 1.0 + 2 * (node_limits.reap_interval_s + 0.007) + 0.007, expired_after
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert len(reads) >= 10 and min(gaps) >= node_limits.reap_interval_s - 1e-9, gaps
    assert max(gaps) < node_limits.reap_interval_s + 0.007 + 1e-9, gaps


def test_a_backlog_of_expired_leases_goes_an_expire_a_tick_not_an_expire_an_interval():
    """A worker host holding hundreds of leases dies: one expire carries run_refs_per_command of
    them, and the reaper reads again at the next tick while more are due, not a reap interval
    later (which would take seconds for a few thousand)."""
    st, raft, clock, trig = setup(n_jobs=300, every_s=10)
    slot = min(j["next"] for j in st.jobs.values())
    clock.advance(max(j["next"] for j in st.jobs.values()) - clock.now_ms())
    asyncio.run(trig.tick())
    held = []
    while len(held) < 300:
        got = st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None, max=100, ttl=1_000))
        assert got["runs"], (len(held), slot)
        held += [g["id"] for g in got["runs"]]
    start = clock.monotonic_s()
    while any(st.runs[r]["state"] == "running" for r in held):
        assert clock.monotonic_s() - start < 3, "all expired soon after their TTL"
        asyncio.run(trig.tick())
        clock.advance(7)
    assert 300 > limits.run_refs_per_command  # (several expires' worth)
    ticks_past_ttl = (clock.monotonic_s() - start - 1.0) / 0.007
    assert clock.monotonic_s() - start <= 1.0 + 2 * (node_limits.reap_interval_s + 0.007) + 4 * 0.007, ticks_past_ttl


def test_beyond_a_reads_worth_of_leases_the_reaper_sweeps_them_a_part_a_read(monkeypatch):
    """At 100 000 live leases a read of them all held the replica's lock 60 ms and the reaper
    took more than a core, every interval: a read takes at most reap_leases_per_read of them,
    a sweep reads them all, and a lease left unrenewed is still expired no earlier than its TTL
    and at most three sweeps later. Renewed leases are never expired, nor a lease granted
    while a sweep goes; what ended is forgotten when a sweep ends."""
    monkeypatch.setattr(node_limits, "reap_leases_per_read", 7)
    st, raft, clock, trig = setup(n_jobs=40, every_s=10)
    clock.advance(max(j["next"] for j in st.jobs.values()) - clock.now_ms())
    asyncio.run(trig.tick())
    reads = []
    real_read = raft.read

    def read(fn, *args):
        out = real_read(fn, *args)
        if fn is queries.lease_sweep:
            reads.append(len(out[2]))
        elif fn is queries.lease_views:
            reads.append(len(out))
        return out

    raft.read = read
    held = [g["id"] for g in st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None,
                                                    max=30, ttl=1_000))["runs"]]
    lock = st.apply(commands.make("lock_acquire", clock.now_ms(), None, name="L", owner="svc", ttl=1_000))
    assert len(held) == 30 and lock["ok"], lock
    sweep_s = -(-31 // 7) * (node_limits.reap_interval_s + 0.007)  # five reads, an interval (and a tick) apart
    alive, dead = held[:20], held[20:]
    start = clock.monotonic_s()
    late = None
    ended = {}
    while clock.monotonic_s() - start < 1.0 + 3 * sweep_s + 0.5:
        now = clock.now_ms()
        if int((clock.monotonic_s() - start) / 0.3) != int((clock.monotonic_s() - start - 0.007) / 0.3):
            # every 300 ms the live holders heartbeat theirs, and the lock's holder renews it
            res = st.apply(commands.make("heartbeat", now, None, worker="w", ttl=1_000,
                                         leases=[[r, st.runs[r]["fencing_token"]] for r in alive]))
            assert res["ok"], res
            res = st.apply(commands.make("lock_renew", now, None, name="L", token=lock["token"], ttl=1_000))
            assert res["ok"], res
        if late is None and clock.monotonic_s() - start >= 0.5:
            # granted mid-sweep, never renewed
            [late] = [g["id"] for g in st.apply(commands.make("acquire", now, None, worker="w2", queues=None,
                                                               max=1, ttl=1_000))["runs"]]
            late_at = clock.monotonic_s()
        asyncio.run(trig.tick())
        for r in dead + ([late] if late else []):
            if r not in ended and st.runs[r]["state"] != "running":
                ended[r] = clock.monotonic_s()
        clock.advance(7)
    assert all(st.runs[r]["state"] == "running" for r in alive), "a renewed lease was expired"
    assert "L" in st.locks, "a renewed lock was released"
    assert set(ended) == set(dead) | {late}, "every unrenewed lease expired"
    for r in dead:
        assert 1.0 <= ended[r] - start <= 1.0 + 3 * sweep_s, (r, ended[r] - start, sweep_s)
    assert 1.0 <= ended[late] - late_at <= 1.0 + 3 * sweep_s, (ended[late] - late_at, sweep_s)
    assert reads and max(reads) <= 7, reads
    assert len(reads) > 10, "the sweeps went on"
    # The expired are forgotten once a whole sweep has gone by without them.
    for _ in range(int(2 * sweep_s / 0.007) + 2):
        asyncio.run(trig.tick())
        clock.advance(7)
    assert {ident for _, ident in trig._lease_seen} <= set(alive) | {"L"}, trig._lease_seen


def test_a_lock_due_behind_a_backlog_of_expired_leases_goes_in_the_first_expire():
    """A worker host holding hundreds of leases dies while another service's lock runs out: the
    lock is released in the first expire (locks go first, up to half of one), not after every
    expire the leases' backlog takes; and the runs still fill the rest of it."""
    st, raft, clock, trig = setup(n_jobs=300, every_s=10)
    clock.advance(max(j["next"] for j in st.jobs.values()) - clock.now_ms())
    asyncio.run(trig.tick())
    held = []
    while len(held) < 300:
        got = st.apply(commands.make("acquire", clock.now_ms(), None, worker="w", queues=None, max=100, ttl=1_000))
        assert got["runs"], len(held)
        held += [g["id"] for g in got["runs"]]
    for k in range(3):
        res = st.apply(commands.make("lock_acquire", clock.now_ms(), None, name=f"lk{k}", owner="svc", ttl=1_000))
        assert res["ok"], res
    start = clock.monotonic_s()
    while st.locks:
        assert clock.monotonic_s() - start < 3, "the locks expired soon after their TTL"
        asyncio.run(trig.tick())
        clock.advance(7)
    expires = [commands.decode(d) for d in raft.proposed]
    expires = [c for c in expires if c["op"] == "expire"]
    assert expires and len(expires[0]["locks"]) == 3, [len(c["locks"]) for c in expires]
    assert len(expires[0]["runs"]) == limits.run_refs_per_command - 3
    assert 300 > limits.run_refs_per_command  # (several expires' worth of leases)


# ------------------------------------------------------------------ a change of jitter_s alone
@pytest.mark.parametrize("kind", ["cron", "every"])
@pytest.mark.parametrize("old_j, new_j, at_min", [(600, 3000, 20), (3000, 600, 20), (3000, 600, 55),
                                                   (600, 0, 5), (0, 3000, 30), (1200, 1800, 45)])
def test_changing_only_jitter_s_fires_every_hour_once_on_the_same_grid(kind, old_j, new_j, at_min):
    """An hourly job whose jitter_s changes mid-hour: each hour's slot fires exactly once, at its
    offset of the jitter in force when it fires, and an interval job keeps its anchor. Before,
    the change was a new schedule planned from the PUT's time: an interval job's grid moved to
    it, a slot fired at its old offset came again at a later new one, and one still to come at
    its old offset, already past at the new one, was never fired."""
    st, raft, clock, trig = setup(n_jobs=0)
    svc = Service(raft, clock, "n1")
    H = 3600 * 1000
    raw = dict(spec(every_s=3600, pol="fire_all", grace_s=3600), **({"jitter_s": old_j} if old_j else {}))
    if kind == "cron":
        raw["schedule"] = {"cron": "0 * * * *"}
    clock.advance(H // 2)  # made inside an hour
    asyncio.run(svc.put_job("j0", raw, None))
    anchor = st.jobs["j0"]["anchor"]
    base = anchor if kind == "every" else 0
    first = (st.jobs["j0"]["next"] - base) // H
    clock.advance(base + first * H - clock.now_ms())  # the first slot's hour
    for _ in range(at_min * 6):
        asyncio.run(trig.tick())
        clock.advance(10_000)
    new = dict(raw)
    new.pop("jitter_s", None)
    if new_j:
        new["jitter_s"] = new_j
    asyncio.run(svc.put_job("j0", new, None))
    assert st.jobs["j0"]["anchor"] == anchor
    while clock.now_ms() < base + (first + 4) * H:  # to the end of the fourth hour, a tick each 10 s
        asyncio.run(trig.tick())
        clock.advance(10_000)
    slots = sorted(r["slot"] for r in st.runs.values() if r["job"] == "j0")
    hours = [(x - base) // H for x in slots]
    assert hours == list(range(first, first + 4)), [(h, (x - base) % H // 1000) for h, x in zip(hours, slots)]
