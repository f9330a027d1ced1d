"""The inlined fast paths of apply (SchedulerState._fast_paths: fire's one-slot entry,
acquire's one heap, complete_many's success) against the general code they stand for.

Two replicas apply the same random commands, one with the fast paths and one without; after
every command their answers, their snapshot bytes and their derived indexes (queue heaps and
depths, running leases, due wheels, the fencing counter) must be identical. The commands cover
what makes the fast paths step aside: several slots or records in one entry, overlap policies
that read other runs, full queues (reject and drop_oldest), stale plans, paused jobs, retries,
stale tokens, executor types and tenant limits on acquire.
"""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from long_tests import examples

from raftsched.core import commands, deadlines, due, fire, leases, limits, policy, queries, records
from raftsched.core.due import DueIndex
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, new_state, pop_due, put_cmd, repush, resume_cmd, spec_of

NAMES = ("a", "b", "c", "d")
QUEUES = ("q1", "q2", "default", "default")
#: Mostly the overlap policies of the fast path (the default, allow), then the others.
OVERLAPS = (None, None, None, {"policy": "allow"}, {"policy": "allow"}, {"policy": "allow", "max_concurrent": 1},
            {"policy": "forbid"}, {"policy": "queue_one"}, {"policy": "replace"})

#: Mostly python, the type the acquires below ask for most; a heap then mixes types, and an
#: acquire with types holds some of its runs back (acquire's fast path and the general loop).
EXECUTORS = (None, None, {"type": "shell", "argv": ["true"]}, {"type": "http", "url": "https://example.com/hook"})

#: Mostly none; a deadline makes the fire carry its slots' items (``dl``), which the runs a full
#: drop_oldest queue drops in the same fire must reach on both paths; late_start skip records a
#: slot fired past its start_within_s (a tick of 2 s or more), on both paths alike.
DEADLINES = (None, None, None, {"start_within_s": 1}, {"succeed_within_s": 3},
             {"start_within_s": 1, "late_start": "skip"})

#: Mostly none; a placement the labelled workers below satisfy, or one none does (acquire's
#: fast path reads a placement once a command).
PLACEMENTS = (None, None, {"labels": {"zone": "a"}}, {"labels": {"zone": "b"}})
#: The acquiring workers: unregistered (no labels), registered with zone=a, and registered with
#: zone=a and dedicated to it (only runs placed on zone=a).
WORKERS = ("w", "wa", "wd")

job_specs = st.builds(
    lambda every, ov, hist, prio, q, pol, attempts, ex, dl, pl: spec_of(
        {"every_s": every}, pol, grace_s=1, max_catchup=3, history=hist, priority=prio, queue=q,
        retry={"max_attempts": attempts, "backoff_s": 0},
        **({} if ov is None else {"overlap": ov}), **({} if ex is None else {"executor": ex}),
        **({} if dl is None else {"deadline": dl}), **({} if pl is None else {"placement": pl})),
    st.sampled_from([1, 2]), st.sampled_from(OVERLAPS), st.sampled_from([1, 2, 5]),
    st.sampled_from([0, 1]), st.sampled_from(QUEUES), st.sampled_from(["fire_all", "fire_once", "skip"]),
    st.sampled_from([1, 2]), st.sampled_from(EXECUTORS), st.sampled_from(DEADLINES), st.sampled_from(PLACEMENTS))

ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NAMES), job_specs),
    # Ticks mostly one interval apart (one slot an entry: the fast path), sometimes more.
    st.tuples(st.just("tick"), st.sampled_from([1, 400, 999, 1000, 1000, 1000, 1001, 2000, 3500]),
              st.sampled_from([0, 0, 1000])),
    st.tuples(st.just("tick"), st.sampled_from([1000]), st.just(0)),
    st.tuples(st.just("tick"), st.sampled_from([1000]), st.just(0)),
    st.tuples(st.just("tick"), st.sampled_from([1000]), st.just(1000)),
    st.tuples(st.just("replay"), st.integers(0, 5)),
    st.tuples(st.just("acquire"), st.integers(1, 6), st.sampled_from([None, ["q1"], ["q1", "q2"], ["default"]]),
              st.sampled_from([None, None, ["python"], ["shell"], ["python", "http"]]), st.sampled_from(WORKERS)),
    st.tuples(st.just("acquire"), st.integers(1, 6), st.just(None), st.just(None), st.sampled_from(WORKERS)),
    st.tuples(st.just("acquire"), st.integers(1, 6), st.just(None), st.just(None), st.just("w")),
    # Outcomes; with ``own``, as a remote worker reports them (node/fleet.py): its id, and an
    # outcome for a run another worker holds refused.
    st.tuples(st.just("complete"), st.lists(st.tuples(st.integers(0, 50), st.just(True), st.just(False),
                                                       st.just(None)), min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("complete"), st.lists(st.tuples(st.integers(0, 50), st.booleans(), st.booleans(),
                                                       st.sampled_from([None, "boom", "x" * 3000])),
                                            min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("pause"), st.sampled_from(NAMES)),
    st.tuples(st.just("resume"), st.sampled_from(NAMES)),
    st.tuples(st.just("trigger"), st.sampled_from(NAMES)),
    st.tuples(st.just("expire"), st.integers(0, 50)),
    st.tuples(st.just("tenant"), st.integers(0, 2000)),
)


def _derived(s: SchedulerState):
    for prios in s._queued.values():  # each acquire index holds to its own bookkeeping (core/ready.py)
        for h in prios.values():
            assert h._n == sum(1 for _ in h) and sorted(h._buckets) == sorted(h._dues)
            assert h._multi == {d for d, b in h._buckets.items() if type(b) is list}
            assert h._unsorted <= h._multi and h._heaped <= h._multi
    wheels = [(w.at, sorted(w.times), w.size) for w in ((s.due.now, s.due.ahead) if s.due is not None else ())]
    # The metrics' counters (core/stats.py, never in a snapshot): the fast paths count alike.
    counted = (s.stats.finished, s.stats.recorded, [(b.counts, b.sum_ms) for b in (s.stats.slot_to_start,
                                                                                    s.stats.slot_to_completion)])
    return (s._queued, s._queue_depth, list(s._running_ids), s._running_count, s.fencing_token,
            {q: list(d) for q, d in s._dead.items()}, wheels, counted)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(job_specs, min_size=len(NAMES), max_size=len(NAMES)), st.lists(ops, min_size=15, max_size=80),
       st.booleans())
def test_fast_paths_change_nothing(specs, steps, due_index):
    fast, slow = SchedulerState(), SchedulerState()
    slow._fast_paths = False
    assert fast._fast_paths
    for s in (fast, slow):
        if due_index:
            due.attach(s, DueIndex())
    now = T0
    fires: list[bytes] = []

    def propose(cmd):
        data = commands.encode(cmd)
        a, b = fast.apply_bytes(data), slow.apply_bytes(data)
        assert a == b, (cmd["op"], a, b)
        assert fast.snapshot() == slow.snapshot(), cmd["op"]
        assert _derived(fast) == _derived(slow), cmd["op"]
        return a

    propose(commands.make("put_queue", now, None, name="q1", max_depth=6, on_full="reject"))
    propose(commands.make("put_queue", now, None, name="q2", max_depth=4, on_full="drop_oldest"))
    for wid, dedicated in (("wa", []), ("wd", ["zone"])):
        res = propose(commands.make("worker_hello", now, None, worker=wid, kind="remote", labels={"zone": "a"},
                                    slots=4, executors=["shell", "http", "python"], queues=None,
                                    dedicated=dedicated))
        assert res["ok"], res
    for name, spec in zip(NAMES, specs):
        propose(put_cmd(fast, name, spec, now))
    for op in steps:
        kind = op[0]
        if kind == "put":
            propose(put_cmd(fast, op[1], op[2], now))
        elif kind == "tick":
            now += op[1]
            jobs = (pop_due(fast, now, 500, op[2]) if due_index
                    else [j for j in fast.jobs.values() if j["next"] is not None and not j["paused"]])
            if due_index:
                pop_due(slow, now, 500, op[2])  # keep the second replica's wheels in step
            entries, dl = [], []
            for j in jobs:
                ahead = op[2] if policy.fires_ahead(j["spec"]) else 0
                e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], j["name"], ahead)
                if e is not None:
                    entries.append(e)
                    dl.extend(deadlines.fire_items(j["spec"], e, j["anchor"]))
            if entries:
                cmd = commands.make("fire", now, None, entries=entries, **({"dl": dl} if dl else {}))
                fires.append(commands.encode(cmd))
                res = propose(cmd)
                assert res["ok"], res
            if due_index:
                for s in (fast, slow):
                    repush(s, sorted(fast.jobs))
            rids, names = deadlines.due(fast, now, limits.deadline_judge_items_max)
            if rids or names:  # the sweep that follows, as the trigger proposes it
                propose(commands.deadline_judge(now, runs=rids, jobs=names))
        elif kind == "replay" and fires:
            # A re-proposed or stale fire: every entry must be dropped whole on both.
            propose(commands.decode(fires[max(0, len(fires) - 1 - op[1])]))
        elif kind == "acquire":
            propose(commands.make("acquire", now, None, worker=op[4], queues=op[2], max=op[1], ttl=30_000,
                                  types=op[3]))
        elif kind == "complete":
            running = list(fast._running_ids)
            items = []
            for k, ok, stale_tok, err in op[1]:
                if not running:
                    break
                rid = running[k % len(running)]
                tok = fast.runs[rid]["fencing_token"] + (1 if stale_tok else 0)
                item = {"run": rid, "token": tok, "success": ok}
                if err is not None:
                    item["error"] = err
                    item["output"] = err
                # As the worker does (worker/limits.complete_batch_bytes_max): a batch stays under the
                # command size (six long errors and outputs did not, and the test failed to encode).
                if items and len(msgpack.packb(commands.make("complete_many", now, None, results=items + [item]))) \
                        > limits.command_bytes_max - 1024:
                    break
                items.append(item)
            if items and op[2]:  # the first item's holder reports them all: others' are refused
                # (as rows, as the node writes them; the others as maps, as older nodes did)
                propose(commands.complete_many(now, None, results=items, own=True,
                                               worker=fast.runs[items[0]["run"]]["worker"]))
            elif items:
                propose(commands.make("complete_many", now, None, results=items))
        elif kind == "pause" and op[1] in fast.jobs:
            propose(commands.make("pause_job", now, None, name=op[1]))
        elif kind == "resume" and op[1] in fast.jobs:
            propose(resume_cmd(fast, op[1], now))
        elif kind == "trigger" and op[1] in fast.jobs:
            propose(commands.make("trigger_job", now, None, name=op[1]))
        elif kind == "expire":
            leases = [x for x in queries.lease_snapshot(fast) if x[0] == "run"]
            if leases:
                _, rid, tok, renewals, _ = leases[op[1] % len(leases)]
                propose(commands.make("expire", now, None, runs=[[rid, tok, renewals]], locks=[]))
        elif kind == "tenant":
            propose(commands.make("put_tenant", now, None, name="default", rate_milli=op[1], burst=1))


def test_runs_a_full_drop_oldest_queue_drops_in_their_own_fire_miss_their_deadlines_alike():
    """One fire of three slots into a queue of one that drops its oldest, history 1: the two runs
    it drops (skipped, then trimmed by its own adds) miss their start deadline on both paths.
    Before, the fast path left them untracked (one deadline missed where the general path had
    nine by the later sweep)."""
    fast, slow = SchedulerState(), SchedulerState()
    slow._fast_paths = False
    now = T0

    def propose(cmd):
        data = commands.encode(cmd)
        a, b = fast.apply_bytes(data), slow.apply_bytes(data)
        assert a == b, (cmd["op"], a, b)
        assert fast.snapshot() == slow.snapshot(), cmd["op"]
        return a

    propose(commands.make("put_queue", now, None, name="q", max_depth=1, on_full="drop_oldest"))
    propose(put_cmd(fast, "j", spec_of({"every_s": 60}, "fire_all", queue="q", history=1,
                                       deadline={"start_within_s": 30}), now))

    def tick(t):
        j = fast.jobs["j"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], "j")
        assert e is not None and len(e[5]) >= 3 and not e[6]
        propose(commands.make("fire", t, None, entries=[e], dl=deadlines.fire_items(j["spec"], e, j["anchor"])))
        rids, names = deadlines.due(fast, t, limits.deadline_judge_items_max)
        if rids or names:
            propose(commands.deadline_judge(t, runs=rids, jobs=names))

    tick(T0 + 3 * 60 * SEC + 1)
    tick(T0 + 10 * 60 * SEC)
    missed = [r for r in deadlines.listing(fast, "missed", "j", None, None, 100)]
    assert len(missed) == 9 and {r["cause"] for r in missed} == {"skipped"}


def test_the_fast_paths_are_taken(monkeypatch):
    """The comparison above means something only if the fast paths run: count them."""
    s = new_state()
    spec = spec_of({"every_s": 1}, "fire_all", history=5)
    s.apply_bytes(commands.encode(put_cmd(s, "a", spec, T0)))
    job = s.jobs["a"]
    now = T0 + 5 * SEC
    e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], job["next"], job["gen"], "a")
    assert len(e[5]) == 1 and not e[6]
    calls = []
    # The general paths: must not be reached.
    monkeypatch.setattr(fire, "new_run", lambda *a, **k: calls.append("new_run"))
    monkeypatch.setattr(leases, "apply_complete", lambda *a, **k: calls.append("complete"))
    monkeypatch.setattr(leases, "tenant_take", lambda *a, **k: calls.append("acquire's loop") or True)
    assert s.apply_bytes(commands.encode(commands.make("fire", now, None, entries=[e])))["fired"] == 1
    # A worker of some executor types only (raftsched worker --executors, --app): the fast path too.
    other = s.apply_bytes(commands.encode(commands.make("acquire", now, None, worker="w", queues=None, max=5,
                                                        ttl=30_000, types=["http"])))
    assert other["runs"] == [] and queries.queue_depth(s, "default") == 1
    got = s.apply_bytes(commands.encode(commands.make("acquire", now, None, worker="w", queues=None, max=5, ttl=30_000,
                                                      types=[job["spec"]["executor"]["type"]])))
    assert len(got["runs"]) == 1
    r = got["runs"][0]
    cmd = commands.make("complete_many", now, None, results=[{"run": r["id"], "token": r["token"], "success": True}])
    res = s.apply_bytes(commands.encode(cmd))
    assert records.outcome_results(res, [r["id"]])[0]["state"] == "succeeded"
    assert calls == []


def test_a_success_beyond_the_kept_attempts_drops_the_oldest_alike():
    """complete_many's fast path bounds a run's attempts like _finish_attempt (limits.attempts_kept_max)."""
    states = [new_state(), new_state()]
    states[1]._fast_paths = False
    spec = spec_of({"every_s": 1}, "fire_all", history=5)
    for s in states:
        s.apply_bytes(commands.encode(put_cmd(s, "a", spec, T0)))
        job = s.jobs["a"]
        e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], job["next"], job["gen"], "a")
        s.apply_bytes(commands.encode(commands.make("fire", job["next"], None, entries=[e])))
        r = s.apply_bytes(commands.encode(commands.make("acquire", T0 + 5 * SEC, None, worker="w", queues=None,
                                                        max=5, ttl=30_000)))["runs"][0]
        run = s.runs[r["id"]]
        run["attempts"] = [{"attempt": k, "token": 0, "worker": "w", "started_at": 0, "finished_at": 0,
                            "ok": False, "error": None} for k in range(limits.attempts_kept_max)]
        s.apply_bytes(commands.encode(commands.make("complete_many", T0 + 6 * SEC, None, results=[
            {"run": r["id"], "token": r["token"], "success": True, "error": "e" * 5000, "output": "o" * 9000}])))
        shown = queries.run(s, r["id"])["attempts"]
        assert len(shown) == limits.attempts_kept_max and shown[0]["attempt"] == 1 and shown[-1]["ok"]
        assert len(run["attempts"]) == limits.attempts_kept_max - 1, "the success's is not kept"
    assert states[0].snapshot() == states[1].snapshot()


def test_backlogs_behind_an_unfinished_head_trim_alike():
    """fire.trim's scan cache (the fast path's: entries known unfinished since the last scan
    found nothing) against the full scan, where it matters: histories of bound 1-2 far past
    their bound behind an unfinished head (a dead run, a retry waiting out its backoff, a lost
    lease), runs behind it finishing in any order (successes, failures, expiries, a full
    drop_oldest queue's drops, skips by pause, replace's revocations), stretches of fires alone
    (scan turns with nothing else applied). Long random sequences; the replicas must agree
    after every command."""
    cached = longest = 0
    for seed in range(examples(40)):
        c, n = _backlog_run(seed)
        cached, longest = cached + c, max(longest, n)
    # (the comparison means something only if the cache was there, past several scan turns)
    assert cached > 100 and longest > 3 * fire.TRIM_SCAN_SLACK, (cached, longest)


def _backlog_run(seed: int) -> tuple[int, int]:
    import random
    rng = random.Random(seed)
    fast, slow = SchedulerState(), SchedulerState()
    slow._fast_paths = False
    now = T0
    cached = longest = 0

    def propose(cmd):
        data = commands.encode(cmd)
        a, b = fast.apply_bytes(data), slow.apply_bytes(data)
        assert a == b, (seed, cmd["op"], a, b)
        assert fast.snapshot() == slow.snapshot(), (seed, cmd["op"])
        return a

    depth = rng.choice([3, 8, 40])
    propose(commands.make("put_queue", now, None, name="small", max_depth=depth, on_full="drop_oldest"))
    def a_spec(heartbeat: bool = False) -> dict:
        # (replace revokes the queued run of the slot before: behind a dead head, in the
        # part of a history its last scan read)
        ov = rng.choice([None, None, {"policy": "replace"}, {"policy": "replace"}, {"policy": "queue_one"},
                         {"policy": "forbid"}, {"policy": "allow", "max_concurrent": 1}]) if not heartbeat else None
        return spec_of({"every_s": 1}, "fire_all", history=rng.choice([1, 2]), queue=rng.choice(["default", "small"]),
                       retry={"max_attempts": rng.choice([1, 3]), "backoff_s": rng.choice([5, 60])},
                       **({} if ov is None else {"overlap": ov}),
                       **({"executor": {"type": "heartbeat"}} if heartbeat else {}))
    for name in ("a", "b", "c"):
        propose(put_cmd(fast, name, a_spec(), now))
    quiet = 0  # ticks left in a stretch of fires alone (a sweep's, or workers gone)
    for _ in range(400):
        if not quiet and rng.random() < 0.05:
            quiet = rng.randint(16, 60)
        r = 0.0 if quiet else rng.random()
        quiet = max(0, quiet - 1)
        if r < 0.45:
            now += 1000
            entries = []
            for j in fast.jobs.values():
                if j["next"] is None or j["paused"]:
                    continue
                e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], j["name"],
                                             rng.choice([0, 1000]))
                if e is not None:
                    entries.append(e)
            if entries:
                propose(commands.make("fire", now, None, entries=entries))
        elif r < 0.6:
            propose(commands.make("acquire", now, None, worker="w", queues=None, max=rng.randint(1, 4),
                                  ttl=30_000))
        elif r < 0.85 and fast._running_ids:
            running = list(fast._running_ids)
            rng.shuffle(running)
            items = [{"run": rid, "token": fast.runs[rid]["fencing_token"], "success": rng.random() < 0.7}
                     for rid in running[:rng.randint(1, 3)]]
            propose(commands.complete_many(now, None, results=items, worker="w") if rng.random() < 0.5
                    else commands.make("complete_many", now, None, results=items))
        elif r < 0.9:
            leases = [x for x in queries.lease_snapshot(fast) if x[0] == "run"]
            if leases:
                _, rid, tok, renewals, _ = rng.choice(leases)
                propose(commands.make("expire", now, None, runs=[[rid, tok, renewals]], locks=[]))
        elif r < 0.93:
            name = rng.choice(sorted(fast.jobs))
            if fast.jobs[name]["paused"]:
                propose(resume_cmd(fast, name, now))
            else:
                propose(commands.make("pause_job", now, None, name=name))
        elif r < 0.95:
            propose(commands.make("trigger_job", now, None, name=rng.choice(sorted(fast.jobs))))
        elif r < 0.96:
            # A job replaced (its runs' fates may change: the cache is invalidated), now and
            # then by a heartbeat job (its queued runs withdrawn) and back; or a job created
            # amid a backlog (which touches no run: the cache stays).
            name = rng.choice(sorted(fast.jobs) + [f"n{len(fast.jobs)}"])
            propose(put_cmd(fast, name, a_spec(heartbeat=rng.random() < 0.3), now))
        cached += len(fast._trim_clean)
        longest = max([longest] + [len(h) for h in fast.history.values()])
    return cached, longest


# Where fire.trim's scan cache must not be used (a review found each diverging from the full
# scan): histories whose entries other code finishes in the middle of a command. Each scenario
# puts an unfinished head (dead runs) before a scan turn, then finishes an entry the last scan
# read, by a path that moves no epoch between.
def _pair():
    fast, slow = SchedulerState(), SchedulerState()
    slow._fast_paths = False

    def propose(cmd):
        data = commands.encode(cmd)
        a, b = fast.apply_bytes(data), slow.apply_bytes(data)
        assert a == b, (cmd["op"], a, b)
        assert fast.snapshot() == slow.snapshot(), cmd["op"]
        return a
    return fast, slow, propose


def _fire_upto(fast, propose, name, t, ahead=0):
    j = fast.jobs[name]
    e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], name, ahead)
    if e is not None:
        propose(commands.make("fire", t, None, entries=[e]))


def _dead_head(fast, propose, name, now, n=16):
    for _ in range(n):
        now += 1000
        _fire_upto(fast, propose, name, now)
        g = propose(commands.make("acquire", now, None, worker="w", queues=None, max=1, ttl=30_000))["runs"][0]
        propose(commands.make("complete_many", now, None, results=[{"run": g["id"], "token": g["token"],
                                                                    "success": False}]))
    return now


def test_replace_revoking_what_the_last_scan_read_trims_alike():
    """overlap replace revokes the job's queued run when the next slot fires: one slot an entry
    (fires alone), and twenty in one entry (a leader catching up, a scan turn in its middle)."""
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=3600, history=1, retry={"max_attempts": 1, "backoff_s": 0},
                   overlap={"policy": "replace"})
    for catch_up in (False, True):
        fast, _, propose = _pair()
        now = T0
        propose(put_cmd(fast, "r", spec, now))
        now = _dead_head(fast, propose, "r", now)
        if catch_up:
            _fire_upto(fast, propose, "r", now + 20_000)
        else:
            for _ in range(17):
                now += 1000
                _fire_upto(fast, propose, "r", now)


def test_a_heartbeat_jobs_fire_closing_what_the_last_scan_read_trims_alike():
    """A heartbeat job's fire closes its earlier runs (not pinged), after the entry's trims."""
    import random
    for seed in range(examples(30)):
        rng = random.Random(seed)
        fast, _, propose = _pair()
        now = T0
        spec = spec_of({"every_s": 1}, rng.choice(["skip", "fire_all", "fire_once"]), grace_s=1, max_catchup=2,
                       history=rng.choice([1, 2, 3]), executor={"type": "heartbeat"})
        propose(put_cmd(fast, "h", spec, now))
        for _ in range(150):
            now += rng.choice([1000, 1000, 1000, 4000])
            _fire_upto(fast, propose, "h", now, rng.choice([0, 0, 3000]))
            if rng.random() < 0.1:
                propose(commands.make("ping", now, None, name="h", status=rng.choice(["start", "success", "fail"]),
                                      slot=None))


def test_a_pipeline_childs_runs_finished_within_one_complete_trim_alike():
    """One complete_many: a parent's success makes a child run (its history scanned), a later
    item finishes a child run that scan read."""
    from pipeline_helpers import job_raw, put
    fast2, slow2, both = _pair()
    for state in (fast2, slow2):
        assert put(state, "a", job_raw(every_s=1, history=200, queue="pa"))["ok"]
        assert put(state, "b", job_raw(after=["a"], history=1, queue="pb"))["ok"]
    now = T0 + 40_000
    j = fast2.jobs["a"]
    both(commands.make("fire", now, None,
                       entries=[policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "a")]))
    grants = both(commands.make("acquire", now, None, worker="w", queues=["pa"], max=100, ttl=300_000))["runs"]
    parents = iter((g["id"], g["token"]) for g in grants)

    def item(run, success=True):
        return {"run": run[0], "token": run[1], "success": success}

    def child():
        g = both(commands.make("acquire", now, None, worker="w", queues=["pb"], max=1, ttl=300_000))["runs"][0]
        return g["id"], g["token"]
    for _ in range(15):  # fifteen dead child runs at the head of its history
        both(commands.make("complete_many", now, None, results=[item(next(parents))]))
        both(commands.make("complete_many", now, None, results=[item(child(), success=False)]))
    both(commands.make("complete_many", now, None, results=[item(next(parents))]))
    running = child()
    both(commands.make("complete_many", now, None,
                       results=[item(next(parents)), item(running)] + [item(next(parents)) for _ in range(16)]))


def _scan_turn(fast, propose, name, now):
    """Fire ``name`` one slot a command until its history's next scan turn (fire.trim) has passed."""
    j = fast.jobs[name]
    while True:
        now += 1000
        _fire_upto(fast, propose, name, now)
        excess = len(fast.history[name]) - j["spec"]["history"]
        if excess > 0 and excess % fire.TRIM_SCAN_SLACK == 0:
            return now


def test_a_replace_finishing_runs_of_a_history_known_clean_trims_alike():
    """A history the cache knows clean (a scan turn found nothing behind its dead head), then a
    replace by a heartbeat job (its queued runs withdrawn: skipped, under the new, larger bound,
    so nothing is trimmed then) and back: the skipped runs go at the next scan turn on both."""
    fast, _, propose = _pair()
    now = T0
    propose(put_cmd(fast, "r", spec_of({"every_s": 1}, "fire_all", history=1,
                                       retry={"max_attempts": 1, "backoff_s": 0}), now))
    now = _dead_head(fast, propose, "r", now, n=1)
    now = _scan_turn(fast, propose, "r", now)
    assert fast._trim_clean.get(id(fast.history["r"])) is fast.history["r"]  # known clean
    for heartbeat in (True, False):
        propose(put_cmd(fast, "r", spec_of({"every_s": 1}, "fire_all", history=20,
                                           retry={"max_attempts": 1, "backoff_s": 0},
                                           **({"executor": {"type": "heartbeat"}} if heartbeat else {})), now))
    assert sum(fast.runs[r]["state"] == "skipped" for r in fast.history["r"]) > 1
    now = _scan_turn(fast, propose, "r", now)
    assert not any(fast.runs[r]["state"] == "skipped" for r in fast.history["r"])  # (what a full scan drops)


def test_a_records_general_path_entry_in_a_history_known_clean_trims_alike():
    """A history the cache knows clean, then an entry with a recorded range (a fire after a gap
    longer than the grace: the general path) adds finished entries within the same epoch: they
    go at the next scan turn on both."""
    fast, _, propose = _pair()
    now = T0
    propose(put_cmd(fast, "k", spec_of({"every_s": 1}, "skip", grace_s=1, history=1,
                                       retry={"max_attempts": 1, "backoff_s": 0}), now))
    now = _dead_head(fast, propose, "k", now, n=1)
    now = _scan_turn(fast, propose, "k", now)
    assert fast._trim_clean.get(id(fast.history["k"])) is fast.history["k"]
    now += 10_000
    _fire_upto(fast, propose, "k", now)
    assert any(fast.runs[r]["state"] == "skipped" for r in fast.history["k"])
    now = _scan_turn(fast, propose, "k", now)
    assert not any(fast.runs[r]["state"] == "skipped" for r in fast.history["k"])


class _Unread(dict):
    """A runs map whose reads fail but the head's (trim looks at the oldest entry first): a
    scan's reads."""
    head: str = ""

    def __getitem__(self, rid):
        if rid != self.head:
            raise AssertionError(f"trim read {rid}")
        return super().__getitem__(rid)


def test_a_backlog_known_clean_is_not_read_again():
    """A sweep's backlog (runs queued, history 1): fires alone, from the job's first, leave its
    history known clean, and trim's scan turns read none of it, however long it grows; a
    command that may finish a run (here an acquire granting nothing) makes the next turn read
    it once, and a job created meanwhile (put_job) does not."""
    s = SchedulerState()
    now = T0
    apply = lambda cmd: s.apply_bytes(commands.encode(cmd))  # noqa: E731
    apply(put_cmd(s, "w", spec_of({"every_s": 1}, "fire_all", history=1, queue="q"), now))
    for k in range(3 * fire.TRIM_SCAN_SLACK):
        now += 1000
        j = s.jobs["w"]
        apply(commands.make("fire", now, None, entries=[
            policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "w")]))
        if k == fire.TRIM_SCAN_SLACK:
            apply(put_cmd(s, "other", spec_of({"every_s": 60}, "fire_all"), now))
    hist = s.history["w"]
    assert len(hist) == 3 * fire.TRIM_SCAN_SLACK
    runs, s.runs = s.runs, _Unread(s.runs)
    s.runs.head = hist[0]
    try:
        hist.extend(["w@x"] * (-(len(hist) - 1) % fire.TRIM_SCAN_SLACK))  # up to a scan turn (bound 1)
        fire.trim(s, hist, 1, cached=True)  # a scan turn: nothing read
        apply(commands.make("acquire", now, None, worker="x", queues=["none"], max=1, ttl=30_000))
        with pytest.raises(AssertionError, match="trim read"):
            fire.trim(s, hist, 1, cached=True)
    finally:
        s.runs = runs


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("queues_a_run", [False, True])
def test_refusals_amid_the_runs_one_acquire_takes_alike(n, queues_a_run, monkeypatch):
    """acquire's one-heap path reads a due's entries a batch at a time (ReadyIndex.peek_due_by).
    Runs their tenant's policy refuses (shell jobs under an http-only policy) are recorded
    skipped amid the runs read, alike on both paths. Should a refusal's bookkeeping read the
    counts a grant keeps or the queue's index, it reads them as one pop and one grant at a time
    leave them; should it queue a run in the same queue at the same due (nothing does today: a
    refused parent's children record their slot; here a stand-in triggers job c), that run is
    handed out before the runs read after the refused one, as one pop a run would have found it."""
    from pipeline_helpers import job_raw, put
    from raftsched.core import jobs as jobs_mod
    http, shell = {"type": "http", "url": "https://example.com/hook"}, {"type": "shell", "argv": ["true"]}
    fast, slow, propose = _pair()
    for state in (fast, slow):
        for name, ex in (("a0", http), ("a1", http), ("b", shell), ("d0", http), ("d1", http), ("e", shell),
                         ("c", http)):
            assert put(state, name, job_raw(every_s=3600 if name == "c" else 10, executor=ex, tenant="t"))["ok"]
    propose(commands.make("put_tenant_policy", T0, None, name="t", executors=["http"], labels={}, allow=[]))
    if queues_a_run:
        on_finish = leases.on_finish

        def finishing(s, run, now):
            # What the bookkeeping reads meanwhile is what one grant at a time left
            seen[s is fast].append((s.fencing_token, dict(s._queue_depth), dict(s._running_count),
                                    list(s._running_ids), s.stats.slot_to_start.counts[:],
                                    {q: {p: sorted(h) for p, h in prios.items()} for q, prios in s._queued.items()}))
            on_finish(s, run, now)
            if run["job"] == "b":
                jobs_mod.apply_trigger_job(s, {"op": "trigger_job", "name": "c"}, now)
        monkeypatch.setattr(leases, "on_finish", finishing)
    seen: dict[bool, list] = {True: [], False: []}
    now = T0 + 10_000  # the slot of every scheduled job, and the due of c's manual run
    for name in ("a0", "a1", "b", "d0", "d1", "e"):
        _fire_upto(fast, propose, name, now)
    order, refused = [], 0
    while True:
        res = propose(commands.make("acquire", now, None, worker="w", queues=None, max=n, ttl=30_000))
        if not res["runs"] and not res.get("refused"):
            break
        order += [g["job"] for g in res["runs"]]
        refused += res.get("refused", 0)
    assert order == (["a0", "a1", "c", "d0", "d1"] if queues_a_run else ["a0", "a1", "d0", "d1"])
    assert refused == 2 and [fast.runs[f"{j}@{now}"]["reason"] for j in "be"] == ["policy", "policy"]
    assert fast.fencing_token == slow.fencing_token == len(order)
    assert queries.queue_depth(fast, "default") == queries.queue_depth(slow, "default") == 0
    assert _derived(fast) == _derived(slow)
    assert seen[True] == seen[False]


def test_an_acquire_that_fails_partway_leaves_the_rest_queued_alike(monkeypatch):
    """A bug raising amid an acquire's batch, where every replica runs (a placement's check;
    state.py refuses the command as a value): the runs leased before it stay leased and
    counted, the run at hand is out of its index as a pop leaves it, the runs not looked at
    stay in it, and the next acquire hands them out, on both paths alike."""
    fast, slow, propose = _pair()
    propose(commands.make("worker_hello", T0, None, worker="w", kind="remote", slots=9,
                          labels={k: "1" for k in "abcde"}, executors=["shell", "http", "python"], queues=None))
    for name in ("a", "b", "c", "d", "e"):  # a placement each: each run's is checked
        propose(put_cmd(fast, name, spec_of({"every_s": 10}, "fire_all", placement={"labels": {name: "1"}}), T0))
    now = T0 + 10_000
    for name in ("a", "b", "c", "d", "e"):
        _fire_upto(fast, propose, name, now)
    placement_ok = leases.placement_ok

    def failing(spec, *a):
        if spec["placement"]["labels"] == {"c": "1"}:  # the third run of the acquire
            raise RuntimeError("a bug")
        return placement_ok(spec, *a)
    monkeypatch.setattr(leases, "placement_ok", failing)
    res = propose(commands.make("acquire", now, None, worker="w", queues=None, max=5, ttl=30_000))
    assert not res["ok"] and "a bug" in res["error"]["message"]
    monkeypatch.setattr(leases, "placement_ok", placement_ok)
    assert fast.fencing_token == 2 and queries.queue_depth(fast, "default") == 3
    assert _derived(fast) == _derived(slow)
    res = propose(commands.make("acquire", now, None, worker="w", queues=None, max=5, ttl=30_000))
    assert [g["job"] for g in res["runs"]] == ["d", "e"]  # (c's run, at hand, left its index)
    assert _derived(fast) == _derived(slow)


@pytest.mark.parametrize("fast_paths", [True, False])
def test_a_grant_that_fails_to_build_fails_the_answer_not_the_state(fast_paths, monkeypatch):
    """Only the proposer's replica builds grants (the answer), once the command's state has
    moved: a bug there refuses its answer, and its state is the other replicas' still."""
    proposer, other = SchedulerState(), SchedulerState()
    other.answers_for = "node-2"
    proposer._fast_paths = other._fast_paths = fast_paths
    for s in (proposer, other):
        s.apply_bytes(commands.encode(put_cmd(s, "a", spec_of({"every_s": 1}, "fire_all"), T0)))
    now = T0 + 5_000
    j = proposer.jobs["a"]
    fire_cmd = commands.make("fire", now, None,
                             entries=[policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "a")])
    for s in (proposer, other):
        s.apply_bytes(commands.encode(fire_cmd))

    def failing(*a):
        raise RuntimeError("a bug")
    monkeypatch.setattr(leases, "_grant_map", failing)
    acq = commands.encode(commands.acquire(now, worker="w", queues=None, max=3, ttl=30_000, types=None, by="node-1"))
    assert not proposer.apply_bytes(acq)["ok"]
    assert other.apply_bytes(acq) == {"ok": True, "runs": []}
    assert proposer.snapshot() == other.snapshot() and _derived(proposer) == _derived(other)
    assert proposer.fencing_token == 3


@pytest.mark.parametrize("n", [2, 5])
def test_the_scan_bound_holds_amid_held_back_runs_alike(n, monkeypatch):
    """An acquire looks at no more than acquire_scan_max runs, those it holds back (another
    executor type's) counted: its batches stop there, as one pop a run did."""
    from pipeline_helpers import job_raw, put
    monkeypatch.setattr(limits, "acquire_scan_max", 3)
    fast, slow, propose = _pair()
    shell = {"type": "shell", "argv": ["true"]}
    for state in (fast, slow):
        for name in ("a", "b", "c", "d", "e"):  # b and d: shell runs, held back
            assert put(state, name, job_raw(every_s=10, **({"executor": shell} if name in "bd" else {})))["ok"]
    now = T0 + 10_000
    for name in ("a", "b", "c", "d", "e"):
        _fire_upto(fast, propose, name, now)
    res = propose(commands.make("acquire", now, None, worker="w", queues=None, max=n, ttl=30_000, types=["python"]))
    assert [g["job"] for g in res["runs"]] == ["a", "c"]
    assert _derived(fast) == _derived(slow)
