"""Run queues and the dead-letter queue (raftsched/core/queues.py): requeue, delete and the
DLQ's bound, queue_full's reject and drop_oldest, and the queue indexes' bounds and liveness.

Every command is encoded and applied as replication does (core_helpers.apply). Refusals are
values and change nothing: compared as snapshot contents minus the ``applied`` counter.
"""
from __future__ import annotations

from unittest import mock

import msgpack

from raftsched.core import commands, limits, policy, queries
from raftsched.core.state import SchedulerState

from core_helpers import (MIN, SEC, T0, apply, new_state, plan_tick, put_cmd, queued_count, restored,
                          snapshot_v2_obj, spec_of)
from exec_helpers import RETRY3, TTL, acq, complete, do, jspec, reap, refused, trig


# ============================================================================ dead-letter queue
def _dead_run(s, job, now, worker="w1"):
    rid = trig(s, job, now)
    (g,) = [x for x in acq(s, now, worker=worker, n=100) if x["id"] == rid]
    res = complete(s, now, rid, g["token"], ok=False, error="dead")
    assert res["state"] == "dead", res
    return rid


def test_dlq_requeue_gives_a_fresh_budget():
    s = new_state(("a", jspec(retry=dict(RETRY3, backoff_s=0, backoff_max_s=0))))
    rid = trig(s, "a", T0)
    for _ in range(3):
        (g,) = acq(s, s.now_ms)
        complete(s, s.now_ms, rid, g["token"], ok=False)
    assert s.runs[rid]["state"] == "dead"
    res = do(s, "dlq_requeue", T0 + MIN, run=rid)
    assert res == {"ok": True, "run": rid, "state": "queued", "attempt": 4}
    assert queries.queue_depth(s, "default") == 1 and s.runs[rid]["due"] == T0 + MIN
    states = []
    for n in (4, 5, 6):
        (g,) = acq(s, s.now_ms)
        assert g["attempt"] == n
        states.append(complete(s, s.now_ms, rid, g["token"], ok=False)["state"])
    assert states == ["queued", "queued", "dead"], "max_attempts more attempts, then dead again"
    assert len(s.runs[rid]["attempts"]) == 6


def test_dlq_requeue_of_a_run_that_is_not_dead_is_not_found():
    s = new_state(("a", jspec(retry=RETRY3)))
    done, running, queued = trig(s, "a", T0), trig(s, "a", T0), trig(s, "a", T0)
    grants = {g["id"]: g for g in acq(s, T0, n=2)}
    assert set(grants) == {done, running}
    complete(s, T0, done, grants[done]["token"])
    assert [s.runs[r]["state"] for r in (done, running, queued)] == ["succeeded", "running", "queued"]
    for rid in (queued, running, done, "a@1", "nosuch"):
        for op in ("dlq_requeue", "dlq_delete"):
            refused(s, commands.make(op, T0, None, run=rid), "not_found")
    refused(s, commands.make("dlq_requeue", T0, None), "invalid_command")


def test_dlq_delete_removes_the_dead_run():
    s = new_state(("a", jspec()))
    rid = _dead_run(s, "a", T0)
    keep = _dead_run(s, "a", T0 + 1)
    res = do(s, "dlq_delete", T0 + 2, run=rid)
    assert res == {"ok": True, "run": rid, "deleted": True}
    assert rid not in s.runs and rid not in s.history.get("a", []) and keep in s.runs
    refused(s, commands.make("dlq_delete", T0 + 2, None, run=rid), "not_found")
    assert restored(s).snapshot() == s.snapshot()


def test_dlq_requeue_of_a_run_whose_job_is_gone_is_a_conflict():
    """delete_job drops the job's runs, dead ones included, so through commands the requeue is
    not_found; a state holding a dead run of a job that no longer exists (an older snapshot
    layout) must refuse it as a conflict and change nothing."""
    s = new_state(("a", jspec()))
    rid = _dead_run(s, "a", T0)
    do(s, "delete_job", T0 + 1, name="a")
    refused(s, commands.make("dlq_requeue", T0 + 1, None, run=rid), "not_found")

    s = new_state(("a", jspec()), ("b", jspec()))
    rid = _dead_run(s, "a", T0)
    obj = snapshot_v2_obj(s)
    del obj["jobs"]["a"]
    s2 = new_state()
    s2.restore(msgpack.packb(obj, use_bin_type=True))
    assert restored(s2).snapshot() == s2.snapshot(), "a history without its job round-trips (version 3)"
    res = refused(s2, commands.make("dlq_requeue", T0, None, run=rid), "conflict")
    assert res["error"]["field"] == "run"
    assert s2.runs[rid]["state"] == "dead"


def test_dead_runs_are_not_trimmed_by_the_jobs_history_bound():
    s = new_state(("a", jspec(history=2)))
    dead = [_dead_run(s, "a", T0 + i) for i in range(3)]
    ok = []
    for i in range(40):
        rid = trig(s, "a", T0 + 10 + i)
        (g,) = acq(s, T0 + 10 + i)
        complete(s, T0 + 10 + i, rid, g["token"])
        ok.append(rid)
        # Behind the dead runs, finished entries go in steps of fire.TRIM_SCAN_SLACK.
        assert len(s.history.get("a", [])) <= 3 + 2 + 15
    new = trig(s, "a", T0 + 60)
    assert all(s.runs[r]["state"] == "dead" for r in dead)
    kept = [r for r in ok if r in s.runs]
    assert kept == ok[len(ok) - len(kept):], "the oldest succeeded runs go first"
    assert len(kept) < 2 + 15, "succeeded runs beyond the bound are trimmed"
    assert s.history.get("a", []) == dead + kept + [new]


def test_dlq_bound_purges_the_oldest_dead_run(monkeypatch):
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec(queue="other")))
    d = [_dead_run(s, "a", T0 + i) for i in range(3)]
    other = _dead_run(s, "b", T0 + 5)
    assert d[0] not in s.runs and d[0] not in s.history.get("a", [])
    assert s.runs[d[1]]["state"] == s.runs[d[2]]["state"] == s.runs[other]["state"] == "dead"
    # a requeued run leaves the DLQ: it does not count, and its return counts as newest
    do(s, "dlq_requeue", T0 + 6, run=d[1])
    (g,) = acq(s, T0 + 6)
    assert g["id"] == d[1]
    d3 = _dead_run(s, "a", T0 + 7)
    assert {d[2], d3} <= set(s.runs)
    complete(s, T0 + 8, d[1], g["token"], ok=False)
    assert s.runs[d[1]]["state"] == "dead" and d[2] not in s.runs and d3 in s.runs


def test_dlq_bound_purges_the_same_run_on_a_restored_replica(monkeypatch):
    """Runs that die at the same ``now`` in another order than their ids: a replica restored
    from a snapshot in between must purge the same one as the replica that saw them die."""
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec()), ("c", jspec()))
    rb, ra = trig(s, "b", T0), trig(s, "a", T0 + 1)
    grants = {g["id"]: g["token"] for g in acq(s, T0 + 2, n=2)}
    complete(s, T0 + 3, rb, grants[rb], ok=False)
    complete(s, T0 + 3, ra, grants[ra], ok=False)  # same now: b died first
    r = restored(s)
    assert r.snapshot() == s.snapshot()
    for st_ in (s, r):
        _dead_run(st_, "c", T0 + 4)
    assert r.snapshot() == s.snapshot(), "replicas purged different dead runs"
    assert (ra in s.runs) != (rb in s.runs), "exactly one of the two oldest was purged"


def test_delete_job_takes_its_dead_runs_out_of_the_dlq_bound(monkeypatch):
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec()))
    b1 = _dead_run(s, "b", T0)
    _dead_run(s, "a", T0 + 1)
    do(s, "delete_job", T0 + 2, name="a")
    r = restored(s)
    b2 = _dead_run(s, "b", T0 + 3)
    _dead_run(r, "b", T0 + 3)
    assert s.runs[b1]["state"] == s.runs[b2]["state"] == "dead", "the DLQ holds 2, within its bound"
    assert r.snapshot() == s.snapshot()


# ============================================================================ queues
def test_queue_full_reject_records_a_skipped_queue_full_entry():
    s = new_state(("a", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="reject")
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0 + 1)
    res = do(s, "trigger_job", T0 + 2, name="a")
    assert res["state"] == "skipped"
    e = s.runs[res["run"]]
    assert (e["state"], e["reason"], e["queue"]) == ("skipped", "queue_full", "q")
    assert queries.queue_depth(s, "q") == 2
    assert [g["id"] for g in acq(s, T0 + 3)] == [r1, r2]
    # a running run does not count against the depth
    assert trig(s, "a", T0 + 4) and s.runs[s.history.get("a", [])[-1]]["state"] == "queued"


def test_queue_full_drop_oldest_drops_the_oldest_queued_run():
    s = new_state(("a", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="drop_oldest")
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0 + 1)
    r3 = trig(s, "a", T0 + 2)
    assert (s.runs[r1]["state"], s.runs[r1]["reason"]) == ("skipped", "queue_full")
    assert s.runs[r3]["state"] == "queued" and queries.queue_depth(s, "q") == 2 == queued_count(s, "q")
    assert [g["id"] for g in acq(s, T0 + 3)] == [r2, r3]
    assert queries.queue_depth(s, "q") == 0


def test_drop_oldest_breaks_equal_slots_by_run_id_not_by_creation_order():
    s = new_state(("b", jspec(queue="q")), ("a", jspec(queue="q")), ("c", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="drop_oldest")
    rb, ra = trig(s, "b", T0), trig(s, "a", T0)  # the same slot; b's run is created first
    assert ra < rb
    trig(s, "c", T0 + 1)
    assert (s.runs[ra]["state"], s.runs[ra]["reason"]) == ("skipped", "queue_full")
    assert s.runs[rb]["state"] == "queued"


def _oldest_queued(s: SchedulerState, q: str) -> str | None:
    live = [(r["slot"], r["id"]) for r in s.runs.values() if r["state"] == "queued" and r["queue"] == q]
    return min(live)[1] if live else None


def test_drop_oldest_drops_what_a_scan_would_and_its_heaps_stay_bounded_when_nothing_acquires():
    """A drop_oldest queue at its bound with no worker: every new run drops one. The heaps behind
    acquire and drop_oldest get a stale entry a drop; they must be compacted, not grow with every
    fire. Retries (a new due), pauses and deletes make stale entries of other kinds."""
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=1000, max_catchup=5, queue="q",
                   retry={"max_attempts": 3, "backoff_s": 1, "backoff_max_s": 1})
    s = new_state(("a", spec), ("b", spec), ("c", spec))
    do(s, "put_queue", T0, name="q", max_depth=4, on_full="drop_oldest")
    now, dropped = T0, 0
    with mock.patch.object(limits, "queue_index_stale_slack", 8):
        for step in range(400):
            now += SEC + step % 3 * 700
            expect = _oldest_queued(s, "q")
            before = {rid for rid, r in s.runs.items() if r["state"] == "queued"}
            cmd, _ = plan_tick(s, now)
            if cmd is not None:
                assert apply(s, cmd)["ok"]
            gone = [s.runs[rid] for rid in before if rid in s.runs and s.runs[rid].get("reason") == "queue_full"]
            if gone:  # the first drop took the oldest; any later one, runs at least as old
                assert min((r["slot"], r["id"]) for r in gone)[1] == expect, (step, gone, expect)
                dropped += len(gone)
            if step % 11 == 5:
                for g in acq(s, now, n=1):
                    complete(s, now, g["id"], g["token"], ok=False)  # queued again, with a new due
            if step % 37 == 20:
                do(s, "pause_job", now, name="b")
                do(s, "resume_job", now, name="b")
            if step % 53 == 30:
                do(s, "delete_job", now, name="c")
                apply(s, put_cmd(s, "c", spec, now))
            assert queries.queue_depth(s, "q") == queued_count(s, "q") <= 4
            bound = 2 * queries.queue_depth(s, "q") + 8 + 5 * 3  # + one fire command's slots
            sizes = [len(h) for h in s._queued.get("q", {}).values()] + [len(s._by_slot.get("q", ()))]
            assert max(sizes) <= bound, (step, sizes)
    assert dropped > 300


def test_a_full_drop_oldest_queue_drops_without_reading_the_whole_queue_in_one_apply():
    """At a bound of a million runs, the first drop built drop_oldest's heap from every queued
    run (~1.3 s in one apply, on every replica at once: the leader was lost), and every drop left
    its run's acquire entry stale, so the acquire index was compacted whole every ~million drops.
    Now put_queue makes the heap (from the runs queued then) and it is kept, a restore makes it,
    and a drop takes its run's acquire entry with it: no fire reads the whole queue, and a
    restored replica drops the same runs."""
    from raftsched.core import queues
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=1000, max_catchup=5, queue="q")
    s = new_state(*((f"j{i}", spec) for i in range(6)))
    assert apply(s, plan_tick(s, T0 + SEC)[0])["ok"]
    assert queries.queue_depth(s, "q") == 6  # six runs queued before the queue is bounded
    reads = []
    real = queues._queued_by_slot
    with mock.patch.object(queues, "_queued_by_slot", lambda st, q: reads.append(q) or real(st, q)):
        do(s, "put_queue", T0 + SEC, name="q", max_depth=20, on_full="drop_oldest")
        assert reads == ["q"] and len(s._by_slot["q"]) == 6  # made once, from the six queued
        other = restored(s)
        assert reads == ["q", "q"] and sorted(other._by_slot["q"]) == sorted(s._by_slot["q"])
        now, dropped = T0 + SEC, 0
        for _ in range(60):
            now += SEC
            cmd, _ = plan_tick(s, now)
            for st in (s, other):
                assert apply(st, cmd)["ok"]
            dropped = sum(1 for r in s.runs.values() if r.get("reason") == "queue_full")
            depth = queries.queue_depth(s, "q")
            assert depth == queued_count(s, "q") <= 20
            # One entry a queued run in each index: the drops took theirs with them.
            assert sum(len(h) for h in s._queued["q"].values()) == depth == len(s._by_slot["q"])
        assert reads == ["q", "q"], "no fire made the heap again from the whole queue"
    assert dropped == 6 * 61 - 20
    assert other.state_hash() == s.state_hash()
    # Taken off drop_oldest, the heap goes; put back on, it is made from the runs queued then.
    do(s, "put_queue", now, name="q", max_depth=20, on_full="reject")
    assert "q" not in s._by_slot
    do(s, "put_queue", now, name="q", max_depth=20, on_full="drop_oldest")
    assert len(s._by_slot["q"]) == 20


def test_a_run_id_that_comes_back_in_another_queue_is_not_handed_out_from_the_old_one():
    """A job deleted while runs fired ahead are queued, then put again in another queue,
    re-creates the same run ids there. The old queue's index entry for such an id must not hand
    the new run out: a replica restored from a snapshot has no such entry, and the two replicas
    would give different answers (found in review; reproduced on 4949ed6 with start_at)."""
    a = new_state()
    apply(a, put_cmd(a, "a", spec_of({"every_s": 1}, queue="q1"), T0 + 100))

    def fire(now):
        j = a.jobs["a"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "a", 2000)
        assert apply(a, commands.make("fire", now, None, entries=[e]))["ok"]
        return e[5]

    first = fire(T0 + 1100)
    do(a, "delete_job", T0 + 1200, name="a")
    apply(a, put_cmd(a, "a", spec_of({"every_s": 1}, queue="q2"), T0 + 1300))
    again = fire(T0 + 1400)
    assert set(first) & set(again), "the scenario needs an id re-created in the other queue"
    b = restored(a)
    for s in (a, b):
        res = do(s, "acquire", T0 + 3000, worker="w", queues=["q1"], max=5, ttl=TTL)
        assert res == {"ok": True, "runs": []}
    assert a.snapshot() == b.snapshot()
    assert [g["queue"] for g in acq(a, T0 + 3000, queues=["q2"])] == ["q2"] * len(again)


def test_queue_depth_never_goes_negative_over_fire_acquire_complete_and_delete():
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=1000, max_catchup=5, queue="q",
                   retry={"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0})
    s = new_state(("a", spec), ("b", spec))
    do(s, "put_queue", T0, name="q", max_depth=6, on_full="drop_oldest")
    now = T0
    held: dict[str, int] = {}
    for step in range(30):
        now += 3 * SEC
        cmd, _ = plan_tick(s, now)
        if cmd is not None:
            assert apply(s, cmd)["ok"]
        for g in acq(s, now, n=2 + step % 3):
            held[g["id"]] = g["token"]
        for rid in list(held)[: step % 4]:
            complete(s, now, rid, held.pop(rid), ok=step % 2 == 0)
        if step % 7 == 3:
            victim = "a" if step % 2 else "b"
            do(s, "delete_job", now, name=victim)
            held = {k: v for k, v in held.items() if k in s.runs}
            apply(s, put_cmd(s, victim, spec, now))
        if step % 9 == 8:
            reap(s, now + TTL + 1)
        assert queries.queue_depth(s, "q") == queued_count(s, "q") >= 0
        assert queries.queue_depth(restored(s), "q") == queries.queue_depth(s, "q")
