"""The leader's due index without a stall: stale entries swept out a few at a push (DueWheel.compact)
instead of a rebuild from every job in the apply that crossed the bound, and a new leader's index
filled in steps while apply feeds it (due.attach_empty, fill, filled; Trigger.fill_due_index)
instead of in one read. At 1M jobs either held the lock applies take for 0.4-0.7 s: the leader's
tick thread, and its heartbeats, with it. No sockets, no real clock."""
from __future__ import annotations

import asyncio
import copy

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.clock import FakeClock
from raftsched.core import commands, due
from raftsched.core.due import DueIndex, DueWheel
from raftsched.core.policy import fires_ahead
from raftsched.core.state import SchedulerState
from raftsched.node import limits as node_limits
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger

from core_helpers import T0, apply, put_cmd, resume_cmd, spec_of, tick
from fakes import FakeRaft

FORBID = {"policy": "forbid"}  # a job that does not fire ahead: the index's other wheel


def job(name: str, nxt: int | None, gen: int = 1, forbid: bool = False, paused: bool = False) -> dict:
    spec: dict = {"schedule": {"every_s": 3600}}
    if forbid:
        spec["overlap"] = FORBID
    return {"name": name, "gen": gen, "next": nxt, "paused": paused, "spec": spec}


def wheels(index: DueIndex) -> tuple[DueWheel, DueWheel]:
    return index.now, index.ahead


def check_counts(index: DueIndex) -> None:
    """Each wheel's size and counts a second are its buckets'."""
    for w in wheels(index):
        assert w.size == sum(len(b) for b in w.at.values()) // 2
        per_s: dict[int, int] = {}
        for t, b in w.at.items():
            if b:
                per_s[t // 1000] = per_s.get(t // 1000, 0) + len(b) // 2
        assert w.per_s == per_s


def valid_entries(index: DueIndex, jobs: dict) -> list[tuple[str, int]]:
    """Every entry that stands for its job's next slot, in the wheel the job belongs to."""
    out = []
    for ahead, w in ((False, index.now), (True, index.ahead)):
        for t, b in w.at.items():
            for name, gen in zip(b[::2], b[1::2]):
                j = jobs.get(name)
                if j is not None and j["gen"] == gen and j["next"] == t and not j["paused"] \
                        and fires_ahead(j["spec"]) == ahead:
                    out.append((name, t))
    return out


def plannable(jobs: dict) -> set[tuple[str, int]]:
    return {(n, j["next"]) for n, j in jobs.items() if j["next"] is not None and not j["paused"]}


def check_complete(index: DueIndex, jobs: dict) -> None:
    """Every job that is due some time has an entry that stands for it (what pop finds)."""
    assert set(valid_entries(index, jobs)) == plannable(jobs)


# ----------------------------------------------------------------------------- the sweep
NAMES = [f"j{i}" for i in range(6)]
TIMES = [10_000, 10_500, 11_000, 20_000]
OPS = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NAMES), st.sampled_from(TIMES), st.booleans()),
    st.tuples(st.just("pause"), st.sampled_from(NAMES)),
    st.tuples(st.just("resume"), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("pop"), st.sampled_from(TIMES), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("early"), st.sampled_from(TIMES), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("peek"),),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=80), step=st.integers(1, 3))
def test_a_sweep_spread_over_pushes_keeps_every_due_job_and_drops_what_stands_for_none(ops, step):
    """Against the jobs as they are after each operation: the counts are the buckets', every job
    due some time has an entry that stands for it (so a pop finds it), whatever pushes, pops,
    peeks and early pops came between a sweep's steps; and a sweep run to its end leaves exactly
    one entry a due job. The bound is 0 and a step looks at 1-3 entries, so sweeps run through
    most operations and are cut into by pops."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(due, "_REBUILD_SLACK", 0)
        mp.setattr(due, "_COMPACT_STEP", step)
        run_ops(ops)


def run_ops(ops: list) -> None:
    jobs: dict[str, dict] = {}
    gens = 0
    index = DueIndex()
    for op in ops:
        kind = op[0]
        if kind == "put":
            _, name, t, forbid = op
            old = jobs.get(name)
            gens += 1  # the state's one counter: a put's gen is never used again (core/jobs.py)
            jobs[name] = job(name, t, gen=gens, forbid=forbid, paused=bool(old and old["paused"]))
            index.push(jobs[name], jobs)
        elif kind == "pause" and name_in(op, jobs):
            jobs[op[1]]["paused"] = True
        elif kind == "resume" and name_in(op, jobs):
            jobs[op[1]]["paused"] = False
            index.push(jobs[op[1]], jobs)
        elif kind == "delete":
            jobs.pop(op[1], None)
        elif kind in ("pop", "early"):
            _, until, limit, fired = op
            if kind == "pop":
                got = index.pop(jobs, until, limit)
            else:
                got = [j for _, js in index.pop_early(jobs, [until // 1000 * 1000], limit) for j in js]
            names = [j["name"] for j in got]
            assert len(names) == len(set(names)), "a pop names a job once"
            assert all(not j["paused"] and j["next"] is not None for j in got)
            for j in got:
                if fired:  # its fire applied: the next slot, pushed by apply
                    j["next"] += 60_000
                    index.push(j, jobs)
                else:  # its plan did not commit
                    index.repush(jobs, [j["name"]])
        elif kind == "peek":
            nxt = index.next_ms(jobs)
            due_at = [t for _, t in plannable(jobs)]
            assert nxt == (min(due_at) if due_at else None)
        check_counts(index)
        check_complete(index, jobs)
    for w in wheels(index):  # a sweep to its end, nothing pushed meanwhile
        w.compact(due._validator(jobs), 10**6)
        w.compact(due._validator(jobs), 10**6)
        assert not w.sweeping()
    check_counts(index)
    kept = valid_entries(index, jobs)
    assert len(kept) == sum(w.size for w in wheels(index)), "nothing stale left"
    assert sorted(kept) == sorted(plannable(jobs)), "one entry a due job"


def name_in(op: tuple, jobs: dict) -> bool:
    return op[1] in jobs


def test_a_mass_re_put_sweeps_a_few_entries_a_push_never_the_whole_index(monkeypatch):
    """5 000 jobs on one slot put again three times (a deploy that puts every job): each push
    past the bound looks at no more than _COMPACT_STEP entries, nothing rebuilds the index from
    the jobs, the wheel stays near twice the jobs, and every job is popped once at its slot."""
    n = 5_000
    jobs = {f"j{i}": job(f"j{i}", 3_600_000) for i in range(n)}
    index = DueIndex()
    index.rebuild(jobs)

    def no_rebuild(*a, **k):
        raise AssertionError("rebuilt from the jobs in an apply")
    monkeypatch.setattr(DueIndex, "rebuild", no_rebuild)
    looked = [0]
    real = due._validator

    def counting(js):
        v = real(js)

        def valid(name, gen, t):
            looked[0] += 1
            return v(name, gen, t)
        return valid
    monkeypatch.setattr(due, "_validator", counting)
    most, largest = 0, 0
    for _ in range(3):
        for i in range(n):
            j = jobs[f"j{i}"]
            j["gen"] += 1
            looked[0] = 0
            index.push(j, jobs)
            most = max(most, looked[0])
            largest = max(largest, index.ahead.size)
    assert 0 < most <= due._COMPACT_STEP
    # A sweep that starts at the bound reads what is pushed behind it too: it ends once it
    # has read bound * step / (step - 1) entries, the most the wheel holds.
    bound = 2 * n + due._REBUILD_SLACK + 1
    assert largest <= bound + bound // (due._COMPACT_STEP - 1) + 1
    check_counts(index)
    got = index.pop(jobs, 3_600_000, 10 * n)
    assert sorted(j["name"] for j in got) == sorted(jobs)


def test_a_sweep_step_of_a_large_bucket_is_bounded_and_its_end_keeps_later_pushes():
    """A bucket of 40 000 entries, half stale, swept a step at a time: each step looks at its
    budget, a job pushed into the bucket mid-sweep is kept, and one taken by a pop mid-sweep
    leaves the bucket as the pop left it (the sweep moves on)."""
    n = 20_000
    jobs = {f"j{i}": job(f"j{i}", 5_000) for i in range(n)}
    w = DueWheel()
    for i in range(n):
        w.push(5_000, f"j{i}", 0)  # stale: another gen
        w.push(5_000, f"j{i}", 1)
    valid = due._validator(jobs)
    w.compact(valid, 100)
    assert w.sweeping() and w.size == 2 * n, "a step drops nothing before its bucket's end"
    jobs["late"] = job("late", 5_000)
    w.push(5_000, "late", 1)
    while w.sweeping():
        w.compact(valid, 1000)
    assert w.size == n + 1 and w.per_s == {5: n + 1}
    assert sorted(w.at[5_000][::2]) == sorted(jobs)
    # Cut into by a pop: the sweep leaves the bucket to the pop.
    for i in range(n):
        w.push(5_000, f"j{i}", 0)
    w.compact(valid, 10)
    out: list = []
    w.pop_until(5_000, 5, valid, jobs, out, set())
    assert len(out) == 5 and all(j["next"] == 5_000 for j in out)
    while w.sweeping():
        w.compact(valid, 1000)
    check_wheel_counts(w)
    left: list = []
    w.pop_until(5_000, 10 * n, valid, jobs, left, {j["name"] for j in out})
    assert sorted(j["name"] for j in out + left) == sorted(jobs)


def test_a_peek_that_drops_what_the_sweep_looked_at_leaves_the_bucket_to_later_pushes():
    """The sweep has looked at most of a bucket when a peek drops its stale tail, past where the
    sweep got to; a job then pushed into the bucket lands below that point. Swept on from there,
    the bucket would become what the sweep kept, without that job: never planned."""
    jobs = {f"j{i}": job(f"j{i}", 5_000) for i in range(10)}
    w = DueWheel()
    for i in range(10):
        w.push(5_000, f"j{i}", 1)
    valid = due._validator(jobs)
    w.compact(valid, 9)  # looked at j0-j8
    for i in range(5, 10):  # j5-j9 move to a later slot: their entries here go stale
        jobs[f"j{i}"]["gen"] = 2
        jobs[f"j{i}"]["next"] = 9_000
        w.push(9_000, f"j{i}", 2)
    assert w.peek(valid) == 5_000  # drops j9-j5 from the bucket's end
    jobs["x"] = job("x", 5_000)
    w.push(5_000, "x", 1)
    while w.sweeping():
        w.compact(valid, 1)
    check_wheel_counts(w)
    out: list = []
    w.pop_until(10_000, 100, valid, jobs, out, set())
    assert sorted(j["name"] for j in out) == sorted(jobs)


def test_a_pop_that_takes_the_bucket_being_swept_is_left_to_it():
    """A storm's pop (pop_second) empties the bucket the sweep is in: the jobs it took are not
    in the index again until apply or repush puts them back (the sweep's copy of the bucket
    must not bring them back), and a pop that takes a bucket whole and drops it does not break
    the sweep's next step (an error there is an apply's)."""
    jobs = {f"j{i}": job(f"j{i}", 5_000) for i in range(10)}
    jobs.update({f"k{i}": job(f"k{i}", 7_000) for i in range(10)})
    w = DueWheel()
    for name, j in jobs.items():
        w.push(j["next"], name, 1)
    valid = due._validator(jobs)
    w.compact(valid, 3)  # part way into one of the buckets
    cur = w._cur
    assert cur in (5_000, 7_000)
    out: list = []
    w.pop_second(cur // 1000, 100, valid, jobs, out, set())
    assert len(out) == 10
    while w.sweeping():
        w.compact(valid, 2)
    check_wheel_counts(w)
    left: list = []
    w.pop_until(10_000, 100, valid, jobs, left, set())
    assert sorted(j["name"] for j in out + left) == sorted(jobs), "each once"
    # Taken whole and dropped by pop_until, then swept on.
    for name, j in jobs.items():
        w.push(j["next"], name, 1)
    w.compact(valid, 3)
    cur = w._cur
    taken: list = []
    w.pop_until(cur, 100, valid, jobs, taken, set())
    assert cur not in w.at
    while w.sweeping():
        w.compact(valid, 2)
    check_wheel_counts(w)


def check_wheel_counts(w: DueWheel) -> None:
    assert w.size == sum(len(b) for b in w.at.values()) // 2
    assert sum(w.per_s.values()) == w.size


# ----------------------------------------------------------------------------- the fill
def put_many(s: SchedulerState, names, every_s: int = 60, now: int = T0) -> None:
    for n in names:
        res = apply(s, put_cmd(s, n, spec_of({"every_s": every_s}, name=n), now))
        assert res["ok"], res


def test_a_fill_in_steps_with_applies_between_indexes_each_due_job_once():
    """Puts, re-puts, a pause and a resume, a delete applied between the steps of a fill (the
    event loop runs between them): at its end every due job has one entry that stands for it,
    none twice (the fill passes over the jobs apply pushed meanwhile), as a rebuild from the
    jobs would have it; and the first tick fires each job once."""
    s = SchedulerState()
    put_many(s, [f"a{i}" for i in range(40)])
    index = DueIndex()
    records = due.attach_empty(s, index)
    assert records == list(s.jobs.values()) and s.due is index and index.filling == set()
    between = [  # after the fill's first step (a0-a6), its second (a7-a13), ...
        lambda: put_many(s, [f"a{i}" for i in range(0, 40, 3)], every_s=30),  # re-puts: new gens
        lambda: apply(s, commands.make("pause_job", T0, None, name="a31")),
        lambda: apply(s, resume_cmd(s, "a31", T0 + 1)),  # pushed before the fill gets to it
        lambda: put_many(s, [f"b{i}" for i in range(5)]),  # new jobs
        lambda: apply(s, commands.make("delete_job", T0, None, name="a38")),
    ]
    for k, i in enumerate(range(0, len(records), 7)):
        assert due.fill(s, index, records[i:i + 7])
        if k < len(between):
            between[k]()
        check_counts(index)
    due.filled(s, index)
    assert index.filling is None
    entries = valid_entries(index, s.jobs)
    assert len(entries) == len(set(entries)), "no job indexed twice"
    assert set(entries) == plannable(s.jobs) and len(entries) == 44
    _, res = tick(s, T0 + 60_000)
    assert res["ok"] and not res.get("stale")
    slots: dict[str, list[int]] = {}
    for r in s.runs.values():
        slots.setdefault(r["job"], []).append(r["slot"])
    assert sorted(slots) == sorted(s.jobs), "every job fired"
    # every 30 s (the re-put ones): two slots by then; the others one
    assert {n: len(v) for n, v in slots.items()} == {n: 2 if n[0] == "a" and int(n[1:]) % 3 == 0 else 1
                                                     for n in s.jobs}


def test_a_restore_during_a_fill_rebuilds_the_index_whole_and_ends_the_fill():
    s = SchedulerState()
    put_many(s, [f"a{i}" for i in range(20)])
    other = copy.deepcopy(s)
    put_many(other, [f"b{i}" for i in range(5)])
    index = DueIndex()
    records = due.attach_empty(s, index)
    assert due.fill(s, index, records[:5])
    s.restore(other.snapshot())
    assert index.filling is None
    assert not due.fill(s, index, records[5:]), "the fill stops"
    check_counts(index)
    assert set(valid_entries(index, s.jobs)) == plannable(s.jobs)
    assert len(valid_entries(index, s.jobs)) == len(plannable(s.jobs))


def test_a_fill_counts_each_wheel_and_second_apart():
    """The fill counts runs of jobs of one second at once: jobs of the two wheels (one fires
    ahead, one does not) and of other seconds, interleaved, are each counted where they are."""
    s = SchedulerState()
    for i in range(30):
        ov = {"policy": "allow"} if i % 3 else {"policy": "forbid"}
        spec = spec_of({"every_s": 60 if i % 5 else 120}, name=f"m{i}", overlap=ov)
        assert apply(s, put_cmd(s, f"m{i}", spec, T0))["ok"]
    index = DueIndex()
    records = due.attach_empty(s, index)
    for i in range(0, len(records), 4):
        assert due.fill(s, index, records[i:i + 4])
    due.filled(s, index)
    check_counts(index)
    assert index.now.size == 10 and index.ahead.size == 20
    assert set(valid_entries(index, s.jobs)) == plannable(s.jobs)


def test_the_trigger_fills_its_index_a_bounded_step_a_read_and_yields_between(monkeypatch):
    """Trigger.fill_due_index: each read indexes at most due_fill_jobs_per_read jobs, the event
    loop runs between reads (a put proposed meanwhile is indexed once), and the first tick
    after it fires every job's slot once."""
    monkeypatch.setattr(node_limits, "due_fill_jobs_per_read", 4)
    s = SchedulerState()
    raft = FakeRaft(s)
    clock = FakeClock()
    svc = Service(raft, clock, "n1")
    trig = Trigger(raft, clock, "n1")
    raw = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "fire_all"}}
    for i in range(15):
        asyncio.run(svc.put_job(f"j{i}", raw, None))
    steps: list[int] = []
    real_fill = due.fill

    def fill(state, index, records):
        steps.append(len(records))
        return real_fill(state, index, records)
    monkeypatch.setattr(due, "fill", fill)

    async def lead():
        async def meanwhile():
            await asyncio.sleep(0)  # ok-sleep: runs between the fill's reads
            await svc.put_job("late", raw, None)
            await svc.put_job("j0", {**raw, "schedule": {"every_s": 20}}, None)
        other = asyncio.ensure_future(meanwhile())
        await trig.fill_due_index()
        await other
    asyncio.run(lead())
    assert steps == [4, 4, 4, 3] and s.due is not None and s.due.filling is None
    entries = valid_entries(s.due, s.jobs)
    assert len(entries) == len(set(entries)) == 16
    clock.advance(20_000)
    asyncio.run(trig.tick())
    slots: dict[str, list[int]] = {}
    for r in s.runs.values():
        if r["kind"] == "scheduled":
            slots.setdefault(r["job"], []).append(r["slot"])
    assert sorted(slots) == sorted(s.jobs), "every job fired"
    assert all(len(v) == len(set(v)) for v in slots.values()), "no slot fired twice"


def test_a_fill_cut_short_takes_the_index_away(monkeypatch):
    monkeypatch.setattr(node_limits, "due_fill_jobs_per_read", 2)
    s = SchedulerState()
    raft = FakeRaft(s)
    trig = Trigger(raft, FakeClock(), "n1")
    put_many(s, [f"a{i}" for i in range(10)])

    async def cut():
        task = asyncio.ensure_future(trig.fill_due_index())
        await asyncio.sleep(0)  # ok-sleep: lets the fill take its first steps
        assert s.due is not None and s.due.filling is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(cut())
    assert s.due is None
