"""Cases a review of leases, queues and backfills found (each test failed on the code before its
fix): a run id made again after its job was deleted is one entry of the acquire index on every
replica; a revocation of a run no worker leases ends no lease; a refused trigger changes nothing;
a backfill knows what a trimmed history forgot, and which job it was made for."""
from __future__ import annotations

import pytest
from backfill_helpers import backfill_cmd, backfill_runs, finish_runs, step
from core_helpers import HOUR, MIN, SEC, T0, apply, counters, new_state, put_cmd, raw_job, restored, spec_of, tick
from exec_helpers import acq, complete, do
from test_backfills import job_state

from raftsched.core import commands, limits, model, policy


def test_a_run_made_again_after_its_job_was_deleted_is_handed_out_alike_everywhere():
    s = new_state()
    gpu = {"placement": {"labels": {"gpu": "1"}}}

    def put(name, raw, t):
        assert apply(s, put_cmd(s, name, model.validate_job(name, raw, t), t))["ok"]

    put("A", raw_job({"every_s": 3600}, "skip", grace_s=0, **gpu), T0)
    put("J", raw_job({"cron": "* * * * *"}, "fire_all", grace_s=3600, **gpu), T0)
    put("P", raw_job({"every_s": 3600}, "skip", grace_s=0), T0)
    for _ in range(limits.acquire_scan_max - 2):  # runs held back for a worker without the label
        assert apply(s, commands.make("trigger_job", T0, None, name="A"))["ok"]
    slot = T0 + 20 * SEC

    def fire_ahead(t):
        j = s.jobs["J"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], "J",
                                     limits.fire_ahead_ms + limits.fire_ahead_span_ms)
        res = apply(s, commands.make("fire", t, None, entries=[e]))
        assert res["ok"] and res["fired"] == 1

    fire_ahead(slot - 900)
    assert apply(s, commands.make("delete_job", slot - 800, None, name="J"))["ok"]
    put("J", raw_job({"cron": "* * * * *"}, "fire_all", grace_s=3600, **gpu), slot - 700)
    fire_ahead(slot - 600)  # J@slot made again: same id, queue and due as the deleted one's
    assert apply(s, commands.make("trigger_job", slot + SEC, None, name="P"))["ok"]
    r = restored(s)
    acq = commands.make("acquire", slot + 2 * SEC, None, worker="w", queues=None, max=1, ttl=30000)
    a, b = apply(s, acq), apply(r, acq)
    assert [g["id"] for g in a["runs"]] == [g["id"] for g in b["runs"]] and len(a["runs"]) == 1
    assert s.state_hash() == r.state_hash()
    # and the general path (a worker limited to tenants takes it) the same
    acq = commands.make("acquire", slot + 3 * SEC, None, worker="w", queues=None, max=1, ttl=30000,
                        tenants=["default"])
    assert apply(s, acq) == apply(r, acq)


def test_replacing_a_started_heartbeat_run_ends_no_lease():
    s = new_state()
    raw = raw_job({"every_s": 60}, "fire_all", grace_s=3600)
    raw["executor"] = {"type": "heartbeat"}
    assert apply(s, put_cmd(s, "hb", model.validate_job("hb", raw, T0), T0))["ok"]
    assert apply(s, put_cmd(s, "other", model.validate_job("other", raw_job({"every_s": 3600}, "skip", grace_s=0),
                                                             T0), T0))["ok"]

    def fire_to(t):
        j = s.jobs["hb"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], "hb")
        assert apply(s, commands.make("fire", t, None, entries=[e]))["ok"]

    now = T0 + MIN
    fire_to(now)
    assert apply(s, commands.make("trigger_job", now, None, name="other"))["ok"]
    assert apply(s, commands.make("acquire", now, None, worker="w", queues=None, max=1, ttl=600000))["runs"]
    assert apply(s, commands.ping(now + SEC, None, name="hb", status="start", slot=None))["ok"]
    raw2 = raw_job({"every_s": 60}, "fire_all", grace_s=3600, overlap={"policy": "replace"})
    assert apply(s, put_cmd(s, "hb", model.validate_job("hb", raw2, now + 2 * SEC), now + 2 * SEC))["ok"]
    fire_to(now + MIN)  # revokes the started heartbeat run
    assert counters(s)["running"] == counters(restored(s))["running"]
    revoked = s.runs[f"hb@{now}"]
    assert revoked["state"] == "failed" and "attempts" not in revoked


def test_a_trigger_refused_for_a_full_queue_changes_nothing():
    s = new_state(("j", spec_of({"every_s": 60}, "skip", grace_s=5, queue="q")), now=T0)
    slot = s.jobs["j"]["anchor"] + MIN
    now = slot + 9 * MIN
    tick(s, now)  # the slot missed: recorded
    depth = s._queue_depth.get("q", 0)
    do(s, "put_queue", now, name="q", max_depth=depth + 1, on_full="drop_oldest")
    do(s, "trigger_job", now, name="j", slot=slot)  # j@slot#manual queued
    do(s, "trigger_job", now, name="j")  # drops it (the oldest slot)
    before = s.manual_seq
    res = do(s, "trigger_job", now, name="j", slot=slot)
    assert not res["ok"] and res["error"]["code"] == "conflict"
    assert s.manual_seq == before  # (the next manual run's number)


@pytest.mark.parametrize("variant", ["purge", "raise"])
def test_a_missing_backfill_does_not_run_slots_a_trimmed_history_forgot(variant):
    # history 5, twelve slots run (the twelfth dead): slots 1-8 trimmed. Then the dead run is
    # purged, or the bound raised: the history is below its bound, and still forgot slots 1-8
    s = job_state(history=5)
    anchor = s.jobs["j"]["anchor"]
    for k in range(1, 13):
        t = anchor + k * MIN
        tick(s, t)
        for g in acq(s, t):
            complete(s, t, g["id"], g["token"], ok=k != 12, error=None if k != 12 else "boom")
    end = anchor + 13 * MIN
    tick(s, end)
    for g in acq(s, end):
        complete(s, end, g["id"], g["token"], ok=True)
    if variant == "purge":
        assert do(s, "dlq_delete", end, run=f"j@{anchor + 12 * MIN}")["ok"]
    else:
        spec = spec_of({"every_s": 60}, "skip", grace_s=5, retry={"max_attempts": 1}, history=50)
        assert apply(s, put_cmd(s, "j", spec, end))["ok"]
    now = end + MIN
    assert apply(s, backfill_cmd(s, "j", anchor + 1, anchor + 12 * MIN + 1, now, "bf", reprocess="missing",
                                 max_concurrent=4))["ok"]
    for _ in range(50):
        if s.backfills["bf"]["state"] == "done":
            break
        step(s, "bf", now)
        finish_runs(s, now)
        now += 1000
    ran = sorted((r["slot"] - anchor) // MIN for r in backfill_runs(s, "bf"))
    assert ran == ([12] if variant == "purge" else [])  # a purged dead run's slot has no run left
    assert s.backfills["bf"]["left_out"]["beyond_history"] == 8


def test_a_backfill_of_a_job_deleted_and_put_again_at_the_same_time_is_cancelled():
    t = T0 + 10 * HOUR
    s = new_state(now=T0)
    assert apply(s, put_cmd(s, "j", spec_of({"cron": "0 * * * *"}, "skip", grace_s=5, history=50), t))["ok"]
    assert apply(s, backfill_cmd(s, "j", t - 5 * HOUR, t, t, "bf", reprocess="all", max_concurrent=2))["ok"]
    step(s, "bf", t)
    assert apply(s, commands.make("delete_job", t, None, name="j"))["ok"]
    spec2 = spec_of({"cron": "30 3 * * *"}, "skip", grace_s=5, history=50, queue="other")
    assert apply(s, put_cmd(s, "j", spec2, t))["ok"]  # the same name and creation time
    step(s, "bf", t + 1000)
    assert s.backfills["bf"]["state"] == "cancelled"
    assert not [r for r in backfill_runs(s, "bf") if r["queue"] == "other"]
