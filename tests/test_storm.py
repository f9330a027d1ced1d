"""A storm (many slots of one second) taken up early: the due index's counts per second, the
look-ahead computed from them (core/due.py storm_seconds), and the trigger over an in-process
replica taking a storm up and committing it before its slot. No sockets, no real clock."""
from __future__ import annotations

import asyncio

import pytest

from raftsched.clock import FakeClock
from raftsched.core import commands, limits, queries, schedule
from raftsched.core.due import DueIndex, storm_seconds
from raftsched.core.state import SchedulerState
from raftsched.node import limits as node_limits
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger

from fakes import FakeRaft

SHELL = {"type": "shell", "argv": ["true"]}
MISFIRE = {"policy": "fire_all"}


def job(name: str, nxt: int | None, gen: int = 1, overlap: dict | None = None, paused: bool = False) -> dict:
    spec: dict = {"schedule": {"every_s": 3600}}
    if overlap is not None:
        spec["overlap"] = overlap
    return {"name": name, "gen": gen, "next": nxt, "paused": paused, "spec": spec}


# ----------------------------------------------------------------------------- the counts
def test_the_index_counts_its_entries_per_second_as_they_come_and_go():
    jobs = {f"a{i}": job(f"a{i}", 10_000 + i % 3) for i in range(30)}     # second 10, three slots
    jobs.update({f"b{i}": job(f"b{i}", 12_500) for i in range(5)})         # second 12
    jobs["f"] = job("f", 10_000, overlap={"policy": "forbid"})             # not a job that fires ahead
    due = DueIndex()
    for j in jobs.values():
        due.push(j, jobs)
    assert due.counts_ahead(9_000, 5_000) == [(10_000, 30), (12_000, 5)]
    assert due.counts_ahead(11_000, 500) == [], "only the seconds asked for"
    # A replaced job leaves a stale entry, counted until met (an overestimate, never an under one).
    jobs["a0"]["gen"] = 2
    due.push(jobs["a0"], jobs)
    assert due.counts_ahead(9_000, 5_000) == [(10_000, 31), (12_000, 5)]
    # Popping a second's jobs takes their entries, the stale one with them.
    got = due.pop_early(jobs, [10_000], 100)
    assert [(sec, len(js)) for sec, js in got] == [(10_000, 30)]
    assert due.counts_ahead(9_000, 5_000) == [(12_000, 5)]
    # The counts a rebuild makes are those the pushes and pops kept.
    kept = due.counts_ahead(0, 60_000)
    due.rebuild({n: j for n, j in jobs.items() if not n.startswith("a")})
    assert due.counts_ahead(0, 60_000) == kept
    # pop_until and peek uncount what they take or drop.
    due.rebuild(jobs)
    due.pop(jobs, 12_500, 1000)
    assert due.counts_ahead(0, 60_000) == []
    assert due.ahead.per_s == {} and due.now.per_s == {}


def test_pop_early_leaves_the_wheel_consistent_for_the_ordinary_pops():
    jobs = {f"s{i}": job(f"s{i}", 20_000) for i in range(10)}
    jobs["late"] = job("late", 20_400)
    due = DueIndex()
    for j in jobs.values():
        due.push(j, jobs)
    got = due.pop_early(jobs, [20_000], 4)
    assert sum(len(js) for _, js in got) == 4, "at most the limit"
    got += due.pop_early(jobs, [20_000], 100)
    names = [j["name"] for _, js in got for j in js]
    assert sorted(names) == sorted(jobs) and len(set(names)) == len(names)
    # An emptied bucket stays behind for the heap; the ordinary pop and peek step over it.
    assert due.next_ms(jobs) is None
    assert due.pop(jobs, 30_000, 100) == []
    jobs["s0"]["next"] = 20_000
    jobs["s0"]["gen"] = 2
    due.push(jobs["s0"], jobs)  # into the emptied bucket, its time still in the heap
    assert [j["name"] for j in due.pop(jobs, 20_000, 100)] == ["s0"]


def test_jobs_due_now_are_popped_before_any_job_not_yet_due():
    jobs = {f"ahead{i}": job(f"ahead{i}", 5_500) for i in range(5)}
    jobs["forbid"] = job("forbid", 5_000, overlap={"policy": "forbid"})
    due = DueIndex()
    for j in jobs.values():
        due.push(j, jobs)
    assert [j["name"] for j in due.pop(jobs, 5_000, 1, ahead_ms=1_000)] == ["forbid"]


# ----------------------------------------------------------------------------- the look-ahead
ARGS = dict(base_ms=1_000, max_ms=120_000, max_slots=2_000_000, margin=1.5, second_min=2_000)


def test_a_storm_is_taken_up_as_long_before_its_slot_as_committing_it_takes_with_the_margin():
    now = 1_000_000
    storm = [(now + 40_000, 1_000_000)]
    # 1M entries at 30 000/s with the margin 1.5: 50 s, plus the 1 s taken up anyway.
    assert storm_seconds(storm, now, 30_000, **ARGS) == [now + 40_000], "40 s ahead: needs 51"
    assert storm_seconds([(now + 51_000, 1_000_000)], now, 30_000, **ARGS) == [now + 51_000]
    assert storm_seconds([(now + 51_001, 1_000_000)], now, 30_000, **ARGS) == [], "not yet"
    # A faster leader starts later: at 60 000/s, 26 s.
    assert storm_seconds([(now + 30_000, 1_000_000)], now, 60_000, **ARGS) == []
    assert storm_seconds([(now + 26_000, 1_000_000)], now, 60_000, **ARGS) == [now + 26_000]
    # The slots due before it count: they must be committed too.
    before = [(now + 2_000 + k * 1_000, 1_500) for k in range(10)]  # 15 000 light ones (< second_min each)
    # 115 000 entries at 10 000/s with the margin: 17.25 s, plus 1 s.
    assert storm_seconds(before + [(now + 18_000, 100_000)], now, 10_000, **ARGS) == [now + 18_000]
    assert storm_seconds(before + [(now + 19_000, 100_000)], now, 10_000, **ARGS) == []
    assert storm_seconds([(now + 18_000, 100_000)], now, 10_000, **ARGS) == [], "alone it needs 16 s"


def test_the_look_ahead_is_bounded_and_leaves_small_or_near_seconds_alone():
    now = 5_000_000
    # Near seconds are taken up anyway (fire_ahead_ms); small ones are no storm.
    assert storm_seconds([(now + 500, 100_000)], now, 1_000, **ARGS) == []
    assert storm_seconds([(now + 5_000, 1_999)], now, 1, **ARGS) == []
    # At most max_ms ahead, whatever the storm needs; the rest of it comes when it is nearer.
    assert storm_seconds([(now + 121_000, 10_000_000)], now, 1_000, **ARGS) == []
    assert storm_seconds([(now + 120_000, 10_000_000)], now, 1_000, **{**ARGS, "max_slots": 20_000_000}) == [now + 120_000]
    # At most max_slots counted: a second past them waits.
    assert storm_seconds([(now + 10_000, 3_000_000)], now, 1_000, **ARGS) == []
    assert storm_seconds([(now + 10_000, 5_000), (now + 11_000, 5_000)], now, 500,
                         **{**ARGS, "max_slots": 7_000}) == [now + 10_000]
    assert storm_seconds([(now + 10_000, 5_000)], now, 0, **ARGS) == [], "no rate, no guess"


def test_the_slack_starts_a_storm_earlier_and_a_started_second_stays_a_storm_to_its_tail():
    now = 3_000_000
    # 100 000 at 10 000/s with the margin: 15 s, plus the 1 s and the 2 s of slack.
    assert storm_seconds([(now + 18_000, 100_000)], now, 10_000, **ARGS, slack_ms=2_000) == [now + 18_000]
    assert storm_seconds([(now + 18_001, 100_000)], now, 10_000, **ARGS, slack_ms=2_000) == []
    # The last 500 of a storm are no storm by their number, but one begun stays one: its tail is
    # taken up when it needs, not left to the ordinary look-ahead's second.
    tail = [(now + 3_000, 500)]
    assert storm_seconds(tail, now, 10_000, **ARGS, slack_ms=2_000) == []
    assert storm_seconds(tail, now, 10_000, **ARGS, slack_ms=2_000, started={now + 3_000}) == [now + 3_000]
    assert storm_seconds([(now + 3_200, 500)], now, 10_000, **ARGS, slack_ms=2_000, started={now + 3_000}) == []


def test_a_steady_load_is_no_storm():
    """30 000 jobs every second, staggered (their next slots over the next two seconds), at a
    measured 30 000/s: each second alone is committed within the ordinary second ahead, so none
    is taken up early, though all of them together need 1.5 s with the margin."""
    now = 7_000_000
    sweep = [(now, 5_000), (now + 1_000, 15_000), (now + 2_000, 10_000)]
    assert storm_seconds(sweep, now - 400, 30_000, **ARGS) == []
    assert storm_seconds(sweep + [(now + 3_000, 20_000)], now - 400, 30_000, **ARGS) == [now + 3_000], "a storm behind it"


# ----------------------------------------------------------------------------- the trigger
@pytest.fixture
def small_storms(monkeypatch):
    """Storm bounds scaled down, so a few hundred jobs make one."""
    monkeypatch.setattr(node_limits, "storm_second_min", 50)
    monkeypatch.setattr(node_limits, "storm_jobs_per_tick_max", 60)
    monkeypatch.setattr(node_limits, "storm_rate_sample_min", 50)


def storm_setup(n: int, at_ms: int, n_forbid: int = 0):
    st = SchedulerState()
    raft = FakeRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    trig = Trigger(raft, clock, "n1")
    trig.take_due_index()
    trig.commit_rate = 100.0  # entries a second: 200 jobs need 3 s with the margin
    at = schedule.iso(at_ms)
    for i in range(n):
        asyncio.run(svc.put_job(f"s{i}", {"schedule": {"at": at}, "executor": SHELL, "misfire": MISFIRE}, None))
    for i in range(n_forbid):
        asyncio.run(svc.put_job(f"f{i}", {"schedule": {"at": at}, "executor": SHELL, "misfire": MISFIRE, "overlap": {"policy": "forbid"}}, None))
    return st, raft, clock, svc, trig


def runs_of(st, prefix: str) -> list:
    return [r for r in st.runs.values() if r["job"].startswith(prefix) and r["kind"] == "scheduled"]


def test_a_storm_is_committed_before_its_slot_and_its_runs_wait_for_it(small_storms):
    """200 jobs due at T at a rate of 100 entries/s not measured yet: taken up from T - 5 s (1 s +
    2 s of slack + 200 / 100), 60 a tick, the first three pieces back to back (they measure 100/s),
    the rest when it needs by that rate with the margin (T - 3.3 s: 1 s + 2 s + 20 × 1.5 / 100), all
    committed more than 1 s before T; queued with due = T, none handed out or leased before T;
    the forbid jobs of the same second fire at T."""
    clock0 = FakeClock()
    T = (clock0.now_ms() // 1000 + 20) * 1000
    st, raft, clock, svc, trig = storm_setup(200, T, n_forbid=3)
    clock.advance(T - 5_100 - clock.now_ms())
    asyncio.run(trig.tick())
    assert runs_of(st, "s") == [], "not before the storm needs"
    clock.advance(200)
    asyncio.run(trig.tick())
    assert len(runs_of(st, "s")) == 60, "taken up in bounded pieces"
    for k in (2, 3):
        clock.advance(600)  # each piece takes 0.6 s: they measure 100/s
        asyncio.run(trig.tick())
        assert len(runs_of(st, "s")) == 60 * k, "the first pieces back to back, whatever the rate says"
    assert trig.commit_rate == pytest.approx(100.0) and trig.commit_rate_measured
    clock.advance(50)
    asyncio.run(trig.tick())
    assert len(runs_of(st, "s")) == 180, "the rest when it needs"
    while clock.now_ms() < T - 3_300:
        asyncio.run(trig.tick())
        assert len(runs_of(st, "s")) == 180
        clock.advance(50)
    asyncio.run(trig.tick())
    assert len(runs_of(st, "s")) == 200
    # The last 20 are no storm by their number (< storm_second_min), but their second is one begun.
    assert trig.storm_jobs_early == trig.stats()["storm_jobs_early"] == 200
    while clock.now_ms() < T - 1_000:
        clock.advance(50)
        asyncio.run(trig.tick())
    assert runs_of(st, "f") == [], "forbid reads its other runs: judged at the slot"
    assert all(r["state"] == "queued" and r["due"] == T and r["fired_at"] < T for r in runs_of(st, "s"))
    early = st.apply(commands.make("acquire", T - 1, None, worker="w", queues=None, max=100, ttl=30_000))
    assert early["ok"] and early["runs"] == [], ("no worker may start a run before its slot", early)
    assert queries.lease_snapshot(st) == [], "no lease, so no TTL running, before the slot"
    # Nothing more is fired until T; at T the forbid jobs fire, the storm's slots do not again.
    while clock.now_ms() < T:
        asyncio.run(trig.tick())
        clock.advance(100)
    asyncio.run(trig.tick())
    assert len(runs_of(st, "s")) == 200 and len(runs_of(st, "f")) == 3
    assert all(st.jobs[f"s{i}"]["stats"][2] == 0 for i in range(200)), "fire lag 0"
    got = st.apply(commands.make("acquire", T, None, worker="w", queues=None, max=100, ttl=30_000))
    assert len(got["runs"]) == 100
    assert len(queries.lease_snapshot(st)) == 100 and {k for k, *_ in queries.lease_snapshot(st)} == {"run"}  # TTLs start now


def test_a_job_firing_every_second_does_not_march_ahead_behind_a_storm(small_storms):
    T = (FakeClock().now_ms() // 1000 + 20) * 1000
    st, raft, clock, svc, trig = storm_setup(600, T)
    trig.commit_rate = 50.0  # the storm stays pending for several seconds
    asyncio.run(svc.put_job("every", {"schedule": {"every_s": 1}, "executor": SHELL, "misfire": MISFIRE}, None))
    clock.advance(T - 19_000 - clock.now_ms())
    for _ in range(185):
        asyncio.run(trig.tick())
        now = clock.now_ms()
        # Its slot at T is one of the storm's, taken up with it; no other is ahead by more than usual.
        ahead = [r["slot"] - now for r in runs_of(st, "every") if r["slot"] != T]
        assert max(ahead, default=0) <= limits.fire_ahead_ms + limits.fire_ahead_span_ms
        clock.advance(100)
    assert len(runs_of(st, "s")) == 600


def test_a_new_leader_in_the_middle_of_an_early_storm_continues_from_the_cursors(small_storms):
    """Leader A takes up part of a storm and loses leadership; B builds its index from the jobs
    (the committed cursors) and takes up the rest. A's fires replayed afterwards change nothing
    (I2): every slot fires once."""
    T = (FakeClock().now_ms() // 1000 + 30) * 1000
    st, raft, clock, svc, a = storm_setup(300, T)
    clock.advance(T - 5_000 - clock.now_ms())
    n0 = len(raft.proposed)
    asyncio.run(a.tick())
    a_fires = raft.proposed[n0:]
    done_by_a = len(runs_of(st, "s"))
    assert 0 < done_by_a < 300
    a.drop_due_index()
    b = Trigger(raft, clock, "n2")
    b.commit_rate = 100.0
    b.take_due_index()
    assert sum(n for _, n in st.due.counts_ahead(clock.now_ms(), 60_000)) == 300 - done_by_a
    while len(runs_of(st, "s")) < 300 and clock.now_ms() < T:
        asyncio.run(b.tick())
        clock.advance(50)
    assert clock.now_ms() < T and 0 < b.storm_jobs_early <= 300 - done_by_a  # the last piece within fire_ahead_ms
    for f in a_fires:
        res = st.apply_bytes(f)
        assert res["ok"] and res["fired"] == 0 and res["stale"] > 0
    slots = [r["id"] for r in runs_of(st, "s")]
    assert len(slots) == len(set(slots)) == 300
    assert all(st.jobs[f"s{i}"]["stats"][0] == 1 for i in range(300)), "one run each (records.STATS_FIELDS runs)"


def test_the_commit_rate_is_measured_on_large_ticks_only():
    trig = Trigger(FakeRaft(SchedulerState()), FakeClock(), "n1")
    assert trig.commit_rate == node_limits.storm_commit_rate_default and not trig.commit_rate_measured
    trig._measure_rate(node_limits.storm_rate_sample_min - 1, 0.01)
    assert not trig.commit_rate_measured, "a small tick measures the load, not the leader"
    trig._measure_rate(30_000, 1.0)
    assert trig.commit_rate == 30_000 and trig.commit_rate_measured
    trig._measure_rate(10_000, 1.0)
    assert trig.commit_rate == 20_000
    # One fast tick does not carry the rate: entries over seconds, not a mean of rates.
    trig._measure_rate(2_000, 0.1)
    assert trig.commit_rate == 42_000 / 2.1
    for _ in range(node_limits.storm_rate_samples):
        trig._measure_rate(5_000, 1.0)
    assert trig.commit_rate == 5_000, "the last storm_rate_samples only"


def test_a_storm_piece_counts_the_time_since_the_last_piece_and_a_lone_piece_measures_nothing(small_storms, monkeypatch):
    """A storm starts from the default rate, or the lower one the last storm measured (the last
    storm's samples are not this one's). Its first piece is alone and measures nothing; the next,
    back to back, measures from the end of the first: what the loop did between two pieces (here
    2 s of other work) slows the rate the rest is timed by."""
    monkeypatch.setattr(node_limits, "storm_commit_rate_default", 100.0)
    T = (FakeClock().now_ms() // 1000 + 60) * 1000
    st, raft, clock, svc, trig = storm_setup(300, T)
    trig._measure_rate(50_000, 1.0)  # a fast storm measured before this one
    clock.advance(T - 5_500 - clock.now_ms())  # 300 need 6 s at 100/s; at 50 000/s they would wait
    asyncio.run(trig.tick())
    assert trig.storm_jobs_early == 60 and trig._storm_tick_end == clock.monotonic_s()
    assert trig.commit_rate == 100.0 and not trig.commit_rate_measured
    clock.advance(2_000)
    asyncio.run(trig.tick())
    assert trig.storm_jobs_early == 120
    assert trig.commit_rate == 60 / 2.0 and trig.commit_rate_measured, "60 entries over the 2 s since the last piece"


class TimedCommits:
    """Commits that take fake time: ``busy_ms`` an entry, but the first ``lone_n`` entries proposed
    on an idle pipeline (nothing committed in the last 50 ms) ``lone_ms`` each; the commit time of
    every slot."""

    def __init__(self, trig: Trigger, clock: FakeClock, lone_ms: float, busy_ms: float, lone_n: int) -> None:
        self.commits: dict[int, list[int]] = {}
        self.last: float | None = None
        self.sizes: list[int] = []
        propose = trig._propose_fire

        async def timed(now, entries, *rest):
            idle = self.last is None or clock.monotonic_s() - self.last > 0.05
            fast = min(len(entries), lone_n) if idle else 0
            clock.advance(round(fast * lone_ms + (len(entries) - fast) * busy_ms))
            res = await propose(now, entries, *rest)
            self.last = clock.monotonic_s()
            self.sizes.append(len(entries))
            for e in entries:
                for slot in e[5]:
                    self.commits.setdefault(slot, []).append(clock.now_ms())
            return res

        trig._propose_fire = timed


def slow_default_storm(monkeypatch, n: int = 300):
    """``n`` jobs due at T 30 s from now, a default rate of 50/s and a slack of 0.5 s: (T, state,
    clock, trigger)."""
    monkeypatch.setattr(node_limits, "storm_commit_rate_default", 50.0)
    monkeypatch.setattr(node_limits, "storm_commit_slack_ms", 500)
    T = (FakeClock().now_ms() // 1000 + 30) * 1000
    st, raft, clock, svc, trig = storm_setup(n, T)
    trig.commit_rate = node_limits.storm_commit_rate_default
    return T, st, clock, trig


def drive_storm(trig: Trigger, clock: FakeClock, T: int) -> list[float]:
    """Tick from T - 10 s to T + 1 s (a storm's pieces back to back, 50 ms between other ticks);
    the commit rates measured along the way."""
    clock.advance(T - 10_000 - clock.now_ms())
    measured = []
    while clock.now_ms() < T + 1_000:
        asyncio.run(trig.tick())
        if trig.commit_rate_measured:
            measured.append(trig.commit_rate)
        clock.advance(1 if trig._storm_pending else 50)
    return measured


def test_a_lone_fast_first_piece_does_not_make_the_rest_of_the_storm_late(small_storms, monkeypatch):
    """The leader commits 60 entries/s back to back, but a piece alone on an idle pipeline 100
    times faster (as a lone piece of 2 000 did at 12 400/s on a machine doing ~5 000/s). Timed by
    that lone piece, the rest of the storm waited until about a second before its slot and was
    committed seconds late; measured on back-to-back pieces, all 300 are committed before it."""
    T, st, clock, trig = slow_default_storm(monkeypatch)
    timed = TimedCommits(trig, clock, lone_ms=1000 / 6000, busy_ms=1000 / 60, lone_n=60)
    measured = drive_storm(trig, clock, T)
    commits = timed.commits[T]
    assert len(commits) == 300 and len(runs_of(st, "s")) == 300
    assert max(commits) < T, f"the last slot committed {max(commits) - T} ms after its slot"
    assert measured and all(abs(r - 60) < 1 for r in measured), "the rate of the back-to-back pieces only"
    assert trig.commit_rate == 50.0 and not trig.commit_rate_measured, "the next storm starts from the default again"
    assert max(timed.sizes) <= node_limits.storm_fire_entries_max


def test_a_fast_start_does_not_time_the_rest_of_the_storm_later_than_the_default_rate(small_storms, monkeypatch):
    """The first pieces of a storm commit 10 times faster than the rest (as a 1 000 000-slot storm's
    did: ~20 000/s, then 9 000-17 600/s as its runs piled up). Timed by what the first pieces
    measured, the rest waited and was committed after its slot; a measured rate above the default
    (with the margin) is not used, so the storm goes on at the default rate's pace and all of it is
    committed before the slot."""
    T, st, clock, trig = slow_default_storm(monkeypatch)
    done = {"n": 0}
    commits: list[int] = []
    propose = trig._propose_fire

    async def degrading(now, entries, *rest):
        for _ in entries:  # the first 180 entries at 600/s, the rest at 55/s
            clock.advance(round(1000 / 600 if done["n"] < 180 else 1000 / 55))
            done["n"] += 1
        res = await propose(now, entries, *rest)
        commits.extend(clock.now_ms() for e in entries for slot in e[5] if slot == T)
        return res

    trig._propose_fire = degrading
    measured = drive_storm(trig, clock, T)
    assert measured and max(measured) > 300, "the first pieces measured far more than the default"
    assert len(commits) == 300 and len(runs_of(st, "s")) == 300
    assert max(commits) < T, f"the last slot committed {max(commits) - T} ms after its slot"


def test_the_timing_rate_is_the_default_or_a_lower_measured_one_with_the_margin():
    trig = Trigger(FakeRaft(SchedulerState()), FakeClock(), "n1")
    d, m = node_limits.storm_commit_rate_default, node_limits.storm_commit_margin
    assert trig.timing_rate() == (d, 1.0), "not measured: the default, no margin"
    trig._measure_rate(int(d * m * 10), 1.0)
    assert trig.timing_rate() == (d, 1.0), "measured faster: never later than the default"
    for _ in range(node_limits.storm_rate_samples):
        trig._measure_rate(int(d), 1.0)
    assert trig.timing_rate() == (d, m), "measured at the default: with the margin, earlier"


# ----------------------------------------------------------------------------- storm commands are background work
class PipelineRaft(FakeRaft):
    """A FakeRaft whose proposals take ``turns`` turns of the event loop to commit (a write 40),
    in order (a pipeline), each applied when it commits; it records what was in flight whenever
    one started."""

    def __init__(self, state, turns: int = 6) -> None:
        super().__init__(state)
        self.turns = turns
        self.inflight: list[str] = []
        self.started: list[tuple[str, int, list[str]]] = []  # (op, entries, in flight before it)

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        cmd = commands.decode(data)
        op = cmd["op"]
        self.started.append((op, len(cmd.get("entries") or ()), list(self.inflight)))
        self.inflight.append(op)
        for _ in range(self.turns if op == "fire" else 40):
            await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        while self.inflight[0] is not op:  # commits in the order proposed
            await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        self.inflight.pop(0)
        return await super().propose(data, timeout_s)


def test_a_storms_fire_commands_are_small_few_in_flight_and_yield_to_a_lone_write(monkeypatch):
    """A storm piece of 600 jobs goes out as commands of at most storm_fire_entries_max entries, at
    most storm_fire_commands_in_flight_max at once (ordinary fires: 500 and 4); and a lone write
    proposed meanwhile finds at most that many ahead of it, and no storm command is proposed
    while it is in flight."""
    monkeypatch.setattr(node_limits, "storm_second_min", 500)
    monkeypatch.setattr(node_limits, "storm_jobs_per_tick_max", 600)
    monkeypatch.setattr(node_limits, "storm_fire_entries_max", 50)
    monkeypatch.setattr(node_limits, "storm_yield_ms_max", 5_000)  # the write always ends first here
    monkeypatch.setattr(node_limits, "storm_commit_rate_default", 200.0)
    st = SchedulerState()
    raft = PipelineRaft(st)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    T = (clock.now_ms() // 1000 + 60) * 1000
    spec = {"schedule": {"at": schedule.iso(T)}, "executor": SHELL, "misfire": MISFIRE}
    asyncio.run(svc.put_jobs({"jobs": {f"s{i}": spec for i in range(600)}}, None))
    trig = Trigger(raft, clock, "n1")
    trig.take_due_index()
    clock.advance(T - 5_000 - clock.now_ms())  # 600 need 7.5 s at 200/s
    raft.started.clear()

    async def storm_and_a_write():
        tick = asyncio.ensure_future(trig.tick())
        while sum(1 for op, *_ in raft.started if op == "fire") < 3 and not tick.done():
            await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        await svc.put_job("probe", {"schedule": {"every_s": 3600}, "executor": SHELL, "misfire": MISFIRE}, None)
        await tick

    asyncio.run(storm_and_a_write())
    fires = [(n, ahead) for op, n, ahead in raft.started if op == "fire"]
    assert sum(n for n, _ in fires) == 600 and len(runs_of(st, "s")) == 600
    assert max(n for n, _ in fires) <= 50, "small commands"
    assert max(len(ahead) for _, ahead in fires) <= node_limits.storm_fire_commands_in_flight_max
    i = next(k for k, (op, *_) in enumerate(raft.started) if op == "put_job")
    assert len(raft.started[i][2]) <= node_limits.storm_fire_commands_in_flight_max, "the write queues behind few"
    nxt = raft.started[i + 1]
    assert nxt[0] == "fire" and "put_job" not in nxt[2], "no storm command proposed while the write is in flight"


def test_the_proposers_of_one_replication_layer_share_a_lane_and_a_background_wait_is_bounded():
    """A background proposer waits for the foreground proposals of every Proposer over the same
    replication layer (the API's, the workers'), not another layer's; and at most max_s."""
    from raftsched.proposer import Proposer

    class GatedRaft(FakeRaft):
        def __init__(self, state) -> None:
            super().__init__(state)
            self.gate: asyncio.Event | None = None

        async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
            if self.gate is not None:
                await self.gate.wait()
            return await super().propose(data, timeout_s)

    st = SchedulerState()
    raft = GatedRaft(st)
    api, storm, other = Proposer(raft), Proposer(raft), Proposer(GatedRaft(SchedulerState()))
    assert Proposer(None)._lane is not Proposer(None)._lane, "a stand-in with no weak reference gets its own"

    async def scenario():
        raft.gate = asyncio.Event()
        write = asyncio.ensure_future(api.propose(commands.make("takeover", 1, None, node="n1", seen=None)))
        await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        assert not await other.yield_to_foreground(1.0), "another layer's writes are not this one's"
        waiting = asyncio.ensure_future(storm.yield_to_foreground(5.0))
        await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        assert not waiting.done()
        raft.gate.set()
        await write
        assert await waiting, "it waited, and ended when the write did"
        assert not await storm.yield_to_foreground(5.0), "nothing in flight: no wait"
        raft.gate = asyncio.Event()
        stuck = asyncio.ensure_future(api.propose(commands.make("takeover", 2, None, node="n1", seen=None)))
        await asyncio.sleep(0)  # ok-sleep: one turn of the event loop, no wait
        t0 = asyncio.get_running_loop().time()
        assert await storm.yield_to_foreground(0.05)
        assert asyncio.get_running_loop().time() - t0 < 1.0, "bounded"
        raft.gate.set()
        await stuck

    asyncio.run(scenario())


def test_a_steady_load_is_told_from_a_storm_by_what_the_ordinary_ticks_measured(small_storms):
    """Storm pieces alone time a storm, so a steady load's ordinary ticks do not move the storm's
    rate; they measure the steady rate, which is what a second is compared with to be a storm: a
    steady 30 000 a second is no storm before any storm was measured (at the default 2 000/s
    each of its seconds would be one, and lose its two-slot span)."""
    now = 9_000_000
    sweep = [(now, 5_000), (now + 1_000, 15_000), (now + 2_000, 10_000)]
    args = {**ARGS, "margin": 1.0, "slack_ms": 2_000}
    assert storm_seconds(sweep, now - 400, 2_000, **args) != [], "by the default rate alone it would be a storm"
    assert storm_seconds(sweep, now - 400, 2_000, **args, size_rate_per_s=30_000) == []
    assert storm_seconds([(now + 5_000, 100_000)], now, 2_000, **args, size_rate_per_s=30_000) == [now + 5_000]
    st, raft, clock, svc, trig = storm_setup(0, 0)
    for i in range(60):
        asyncio.run(svc.put_job(f"e{i}", {"schedule": {"every_s": 1}, "executor": SHELL, "misfire": MISFIRE}, None))
    TimedCommits(trig, clock, lone_ms=1, busy_ms=1, lone_n=0)
    clock.advance(1_000)
    assert asyncio.run(trig.tick()) == 60
    assert trig.steady_rate == pytest.approx(1_000.0) and trig.stats()["steady_rate_per_s"] == 1_000.0, "60 entries in 60 ms"
    assert trig.commit_rate == 100.0 and not trig.commit_rate_measured, "the storm's rate unmoved"


def test_a_second_no_larger_than_the_load_the_leader_keeps_up_with_is_no_storm():
    """Rates aside, a second holding no more entries than the leader has been taking up a second
    lately (times storm_load_factor, which the trigger applies) is the next second of a steady
    load; a second far above it is still a storm."""
    now = 9_000_000
    sweep = [(now + 1_000, 15_000), (now + 2_000, 30_000), (now + 3_000, 30_000)]
    args = {**ARGS, "margin": 1.0, "slack_ms": 2_000}
    assert storm_seconds(sweep, now, 2_000, **args) == [now + 2_000, now + 3_000], "by the default rate alone"
    assert storm_seconds(sweep, now, 2_000, **args, steady_load=60_000) == []
    assert storm_seconds(sweep + [(now + 4_000, 200_000)], now, 2_000, **args, steady_load=60_000) == [now + 4_000]
    assert storm_seconds(sweep, now, 2_000, **args, steady_load=60_000, started={now + 3_000}) == [now + 3_000], \
        "a second begun as a storm stays one"


def test_a_steady_load_taken_up_as_a_storm_at_first_goes_back_to_the_ordinary_look_ahead(small_storms):
    """A new leader has measured no steady rate: 120 jobs every second are a storm by the rates
    alone, and the first are taken up early, one slot an entry (up to their second's end), so
    every job is due again the next second, and its pieces measure a rate near what that needs:
    before storm_load_factor, they stayed a storm second after second, one slot an entry (the
    bench's sweep at 30 000: 40-51 us a slot instead of 24-26). Once the leader has taken up that
    many a second, their seconds are the load it keeps up with: the rest goes the ordinary way,
    fire_ahead_span_ms / 1 s + 1 slots an entry, and nothing more is taken up early."""
    st, raft, clock, svc, trig = storm_setup(0, 0)
    start = (clock.now_ms() // 1000 + 3) * 1000
    for i in range(120):  # staggered over the second, as the bench's sweep, the first slot 2-3 s ahead
        every = {"every_s": 1, "start_at": schedule.iso(start + i * 8)}
        asyncio.run(svc.put_job(f"e{i}", {"schedule": every, "executor": SHELL, "misfire": MISFIRE}, None))
    # 5 ms an entry: the storm's pieces (one slot an entry) measure ~200 entries a second, near
    # the 120 a second the load needs that way (with the margin, still more than a second ahead).
    TimedCommits(trig, clock, lone_ms=5, busy_ms=5, lone_n=0)
    entries: list = []
    timed = trig._propose_fire

    async def recorded(now, fire_entries, *rest):
        entries.extend(fire_entries)
        return await timed(now, fire_entries, *rest)

    trig._propose_fire = recorded
    early_by_second = []
    for _ in range(12):
        before = trig.storm_jobs_early
        end = clock.now_ms() + 1_000
        while clock.now_ms() < end:
            asyncio.run(trig.tick())
            clock.advance(50)
        early_by_second.append(trig.storm_jobs_early - before)
    assert early_by_second[0] > 0, "a storm by the rates at first"
    assert early_by_second[-6:] == [0] * 6, early_by_second
    k = limits.fire_ahead_span_ms // 1000 + 1
    assert entries and all(len(e[5]) == k for e in entries[-120:]), "span / 1 s + 1 slots an entry, the ordinary way"
    assert trig.load_per_s() > 0


def test_a_storm_over_consecutive_seconds_is_taken_up_early_to_its_last_second(small_storms):
    """Ten consecutive seconds of 100 one-shot jobs each, committing at 100 entries a second
    (10 ms an entry): all of it must be taken up early. What the leader takes up of the storm
    itself must not count as the load its later seconds are measured against (they would fall
    under twice the rate the storm is taken up at and be left to the one-second look-ahead:
    400 of 1 000 late with the first cut of storm_load_factor, which counted every entry taken
    up); only recurring jobs make that load."""
    T = (FakeClock().now_ms() // 1000 + 30) * 1000
    st, raft, clock, svc, trig = storm_setup(0, 0)  # 100 entries a second
    for k in range(10):
        at = schedule.iso(T + k * 1000)
        for i in range(100):
            asyncio.run(svc.put_job(f"s{k}-{i}", {"schedule": {"at": at}, "executor": SHELL, "misfire": MISFIRE}, None))
    timed = TimedCommits(trig, clock, lone_ms=10, busy_ms=10, lone_n=0)
    clock.advance(T - 20_000 - clock.now_ms())
    while clock.now_ms() < T + 10_000:
        asyncio.run(trig.tick())
        clock.advance(1 if trig._storm_pending else 50)
    assert sorted(timed.commits) == [T + k * 1000 for k in range(10)]
    assert sum(len(at) for at in timed.commits.values()) == 1000
    late = sum(1 for slot, at in timed.commits.items() for t in at if t >= slot)
    assert late == 0, f"{late} of 1 000 slots committed at or after their slot"
    assert trig.storm_jobs_early == 1000
