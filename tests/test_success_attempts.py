"""A succeeded run's last attempt is not kept as a record of its own (leases.close_attempt): its
own fields say all of it (records.attempts_of). What must not change with that: the attempts
every reader sees, the snapshot's bytes (the code before wrote the record, and any version must
read a snapshot of this one), and a replica restored from such a snapshot."""
from __future__ import annotations

import msgpack
import pytest

from raftsched.core import commands, leases, limits, policy, queries, records, snapshot as snapshot_mod
from raftsched.core.records import bound_text
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, apply, new_state, restored, spec_of
from exec_helpers import RETRY3, TTL, acq, complete, do, expire, jspec, lease, trig


def _close_keeping_every_attempt(s, run, now, success, error, output) -> None:
    """close_attempt as it was before: a success's record kept too (the code a snapshot of this
    one must stay byte-identical to)."""
    q = run["queue"]
    s._running_count[q] = s._running_count.get(q, 1) - 1
    s._running_ids.pop(run["id"], None)
    attempts = run.setdefault("attempts", [])
    attempts.append({"attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
                     "started_at": run["started_at"], "finished_at": now,
                     "ok": success, "error": bound_text(error, limits.attempt_error_chars_max)})
    if len(attempts) > limits.attempts_kept_max:
        del attempts[0]
    run["finished_at"] = now
    run["error"] = error
    run["output"] = output
    run["deadline"] = None
    if success:
        s.stats.on_success(run, now)


def _workload() -> SchedulerState:
    """Successes at the first attempt, after a failure, after a lost lease, after a release, with
    an error text longer than an attempt keeps; a failure that went dead; a heartbeat job's
    success ping (which keeps its record); runs still queued and running."""
    hb = spec_of({"every_s": 600}, "skip", grace_s=0, executor={"type": "heartbeat"})
    s = new_state(("a", jspec(retry=RETRY3)), ("d", jspec(retry={"max_attempts": 1})), ("hb", hb))
    t = T0
    first = trig(s, "a", t)
    (g,) = acq(s, t)
    assert complete(s, t + SEC, first, g["token"], ok=True, error="x" * 5000)["state"] == "succeeded"
    failed_once = trig(s, "a", t + 2 * SEC)
    (g,) = acq(s, t + 2 * SEC)
    assert complete(s, t + 3 * SEC, failed_once, g["token"], ok=False, error="boom")["state"] == "queued"
    (g,) = acq(s, s.runs[failed_once]["due"], worker="w2")
    assert complete(s, s.now_ms + SEC, failed_once, g["token"], ok=True)["state"] == "succeeded"
    lost = trig(s, "a", s.now_ms)
    acq(s, s.now_ms)
    expire(s, s.now_ms + TTL + 1, runs=[lease(s, lost)])
    (g,) = acq(s, s.now_ms)
    assert complete(s, s.now_ms + SEC, lost, g["token"], ok=True)["state"] == "succeeded"
    released = trig(s, "a", s.now_ms)
    (g,) = acq(s, s.now_ms, worker="w3")
    assert do(s, "release", s.now_ms, worker="w3", leases=[[released, g["token"]]], reason="going")["ok"]
    (g,) = acq(s, s.now_ms)
    assert complete(s, s.now_ms + SEC, released, g["token"], ok=True)["state"] == "succeeded"
    dead = trig(s, "d", s.now_ms)
    (g,) = acq(s, s.now_ms)
    assert complete(s, s.now_ms + SEC, dead, g["token"], ok=False, error="no")["state"] == "dead"
    slot = T0 + 600 * SEC
    job = s.jobs["hb"]
    e = policy.plan_fire_compact(job["spec"], job["anchor"], job["cursor"], slot, job["gen"], "hb")
    assert apply(s, commands.fire(slot, entries=[e]))["ok"]
    assert apply(s, commands.ping(slot + SEC, None, name="hb", status="success", slot=None))["state"] == "succeeded"
    trig(s, "a", s.now_ms)  # queued
    running = trig(s, "a", s.now_ms)
    acq(s, s.now_ms, n=1)
    assert s.runs[running]["state"] in ("running", "queued")
    return s


def _shown(s: SchedulerState) -> dict:
    return {rid: queries.run(s, rid).get("attempts") for rid in s.runs}


def test_a_success_keeps_no_record_and_is_shown_and_written_as_when_it_kept_one(monkeypatch) -> None:
    s = _workload()
    succeeded = [r for r in s.runs.values() if r["state"] == "succeeded" and r["job"] == "a"]
    assert len(succeeded) == 4
    for r in succeeded:
        assert not r.get("attempts") or r["attempts"][-1]["ok"] is False, r
        shown = queries.run(s, r["id"])["attempts"]
        assert shown[-1] == {"attempt": r["attempt"], "token": r["fencing_token"], "worker": r["worker"],
                             "started_at": r["started_at"], "finished_at": r["finished_at"], "ok": True,
                             "error": bound_text(r["error"], limits.attempt_error_chars_max)}
    assert [len(queries.run(s, r["id"])["attempts"]) for r in succeeded] == [1, 2, 2, 2]
    assert len(queries.run(s, succeeded[0]["id"])["attempts"][0]["error"]) == limits.attempt_error_chars_max
    monkeypatch.setattr(leases, "close_attempt", _close_keeping_every_attempt)
    before = _workload()
    assert all(r["attempts"][-1]["ok"] for r in before.runs.values() if r["state"] == "succeeded")
    assert _shown(before) == _shown(s)
    assert before.snapshot() == s.snapshot(), "the snapshot is the one the code before wrote"


def test_a_snapshot_restores_to_records_without_the_success_and_writes_the_same_bytes(monkeypatch) -> None:
    monkeypatch.setattr(leases, "close_attempt", _close_keeping_every_attempt)
    older = _workload()  # as the code before held it
    monkeypatch.undo()
    data = older.snapshot()
    r = SchedulerState()
    r.restore(data)
    for run in r.runs.values():
        if run["state"] == "succeeded" and run["job"] == "a":
            assert not run["attempts"] or run["attempts"][-1]["ok"] is False, run
    hb = next(run for run in r.runs.values() if run["job"] == "hb" and run["state"] == "succeeded")
    assert records.attempts_of(hb) == older.runs[hb["id"]]["attempts"]
    assert _shown(r) == _shown(older)
    assert r.snapshot() == data
    # and from there on, the restored replica and the one that applied the commands agree
    live, back = _workload(), restored(_workload())
    for s in (live, back):
        rid = trig(s, "a", s.now_ms + SEC)
        g = next(g for g in acq(s, s.now_ms) if g["id"] == rid)
        assert complete(s, s.now_ms + SEC, rid, g["token"], ok=True)["ok"]
    assert live.snapshot() == back.snapshot() and _shown(live) == _shown(back)


def test_a_restored_record_is_dropped_only_when_the_run_makes_it_back_byte_for_byte(monkeypatch) -> None:
    monkeypatch.setattr(leases, "close_attempt", _close_keeping_every_attempt)
    older = _workload()
    monkeypatch.undo()
    runs = [r for r in older.runs.values() if r["state"] == "succeeded" and r["job"] == "a"]
    renamed, retyped = runs[0], runs[1]
    other = {("tok" if k == "token" else k): v for k, v in renamed["attempts"][-1].items()}
    renamed["attempts"][-1] = other  # the same values, another key
    retyped["attempts"][-1]["started_at"] = float(retyped["started_at"])  # equal, of another type
    data = older.snapshot()
    r = SchedulerState()
    r.restore(data)
    assert r.runs[renamed["id"]]["attempts"][-1] == other and r.runs[retyped["id"]]["attempts"][-1]["ok"]
    assert r.snapshot() == data and _shown(r) == _shown(older)


def test_a_record_of_another_shape_is_kept_and_shown_as_it_is() -> None:
    s = _workload()
    rid = next(r["id"] for r in s.runs.values() if r["state"] == "succeeded" and r["job"] == "a")
    s.runs[rid]["attempts"] = [{"attempt": 1, "note": "older"}]  # no "ok": not one this code wrote
    assert queries.run(s, rid)["attempts"] == [{"attempt": 1, "note": "older"}]
    assert restored(s).runs[rid]["attempts"] == [{"attempt": 1, "note": "older"}]
    odd = {"id": "x@1", "job": "x", "slot": 1, "state": "succeeded"}  # fields missing: shown as it is
    assert records.attempts_of(odd) == [] and not records.success_implied(odd)


@pytest.mark.parametrize("piece", [1, 4, 15, 16, 4096])
def test_the_runs_are_written_a_slice_at_a_time_as_one_map(monkeypatch, piece: int) -> None:
    s = _workload()
    for _ in range(20):  # runs enough for a map 16 header, whole and in slices
        trig(s, "a", s.now_ms + SEC)
    obj = snapshot_mod.snapshot_obj(s)
    obj["runs"] = {rid: dict(r, attempts=records.attempts_of(r)) if records.success_implied(r) else r
                   for rid, r in s.runs.items()}
    monkeypatch.setattr(snapshot_mod, "_RUNS_SLICE", piece)
    assert s.snapshot() == msgpack.packb(obj, use_bin_type=True)
    assert SchedulerState().restore(s.snapshot()) is None


def test_a_success_record_past_the_kept_bound_restores_to_the_same_view_and_bytes() -> None:
    """end_lease (a heartbeat ping that ends a worker's lease) appends without trimming: a run
    may hold attempts_kept_max failures and then its success's record."""
    s = _workload()
    run = next(r for r in s.runs.values() if r["state"] == "succeeded" and r["job"] == "a")
    fails = [{"attempt": k, "token": k, "worker": "w", "started_at": k, "finished_at": k, "ok": False, "error": None}
             for k in range(limits.attempts_kept_max)]
    run["attempts"] = fails + [records.final_attempt(run)]  # as end_lease leaves it
    data = s.snapshot()
    r = SchedulerState()
    r.restore(data)
    assert len(queries.run(r, run["id"])["attempts"]) == limits.attempts_kept_max + 1
    assert _shown(r) == _shown(s) and r.snapshot() == data


def test_a_restored_succeeded_run_whose_attempts_are_not_a_list_is_written_as_it_is() -> None:
    s = _workload()
    ids = [r["id"] for r in s.runs.values() if r["state"] == "succeeded" and r["job"] == "a"]
    obj = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    for rid, odd in zip(ids, ({}, 5, True, "x")):
        obj["runs"][rid]["attempts"] = odd
    data = msgpack.packb(obj, use_bin_type=True)
    r = SchedulerState()
    r.restore(data)
    assert r.snapshot() == data
    assert queries.run(r, ids[0])["attempts"] == []
