"""A heartbeat job's runs go to no worker (core/deadlines.py, docs/notifications.md "Heartbeat
jobs"): a backfill or a trigger with a slot or a payload is refused, a job replaced by a
heartbeat job withdraws its queued runs, and a run leased before the replace is not retried.
Before, each of these queued a run with executor ``heartbeat``, which every worker that leased
it failed ("unknown executor type") until it was dead."""
from __future__ import annotations

import copy

from raftsched.core import commands, model

from backfill_helpers import backfill_cmd, step
from core_helpers import MIN, T0, apply, new_state, put_cmd, raw_job, restored, snap_obj, tick
from exec_helpers import acq, complete, do

HB = {"type": "heartbeat"}
DROP = ("applied", "now_ms")  # (a refused command still moves the state's time)


def job_spec(executor: dict | None = None, **extra) -> dict:
    raw = raw_job({"every_s": 60}, "fire_all", history=50, **extra)
    if executor is not None:
        raw["executor"] = executor
    return model.validate_job("j", raw)


def grants(s, now: int) -> list[dict]:
    return acq(s, now, n=50)


def test_a_backfill_and_a_trigger_with_a_slot_or_payload_of_a_heartbeat_job_are_refused():
    s = new_state(("j", job_spec(HB)), now=T0)
    for k in range(1, 6):
        tick(s, T0 + k * MIN + 1)
    now = T0 + 10 * MIN
    before = snap_obj(s, DROP)
    res = apply(s, backfill_cmd(s, "j", T0, T0 + 5 * MIN, now, reprocess="all"))
    assert res["error"]["code"] == "invalid" and res["error"]["field"] == "name", res
    res = do(s, "trigger_job", now, name="j", slot=T0 + 2 * MIN)
    assert res["error"]["code"] == "invalid" and res["error"]["field"] == "slot", res
    res = do(s, "trigger_job", now, name="j", payload={"x": 1})
    assert res["error"]["code"] == "invalid" and res["error"]["field"] == "payload", res
    assert snap_obj(s, DROP) == before
    # A plain trigger opens a slot waiting for a ping, as before.
    res = do(s, "trigger_job", now, name="j")
    assert res["ok"] and res["state"] == "waiting", res
    assert grants(s, now + 1) == []


def test_a_job_made_a_heartbeat_job_withdraws_its_queued_runs_and_cancels_its_backfill():
    s = new_state(("j", job_spec()), now=T0)
    for k in range(1, 4):
        tick(s, T0 + k * MIN + 1)                       # j@T0+1..3min queued for a worker
    now = T0 + 4 * MIN
    assert apply(s, backfill_cmd(s, "j", T0 + MIN, T0 + 3 * MIN, now, reprocess="all", max_concurrent=2))["ok"]
    assert step(s, "b1", now)["created"] == 2
    manual = do(s, "trigger_job", now, name="j", slot=T0 + MIN)
    assert manual["ok"]
    queued = [rid for rid, r in s.runs.items() if r["state"] == "queued"]
    assert len(queued) == 5
    assert apply(s, put_cmd(s, "j", job_spec(HB), now + 1))["ok"]
    for rid in queued:
        r = s.runs[rid]
        assert (r["state"], r["reason"], r["finished_at"]) == ("skipped", "heartbeat_job", now + 1), r
    assert s._queue_depth.get("default", 0) == 0
    assert grants(s, now + 2) == []
    res = step(s, "b1", now + 3)
    assert res is not None and res["state"] == "cancelled", res
    assert "heartbeat" in s.backfills["b1"]["reason"]
    assert snap_obj(restored(s)) == snap_obj(s)


def test_a_run_leased_before_its_job_became_a_heartbeat_job_is_not_run_again():
    s = new_state(("j", job_spec(retry={"max_attempts": 5})), now=T0)
    tick(s, T0 + MIN + 1)
    tick(s, T0 + 2 * MIN + 1)
    a, b = grants(s, T0 + 2 * MIN + 2)
    assert apply(s, put_cmd(s, "j", job_spec(HB, retry={"max_attempts": 5}), T0 + 2 * MIN + 3))["ok"]
    # One fails, the other is given back by its worker: neither goes back to a queue.
    assert complete(s, T0 + 2 * MIN + 4, a["id"], a["token"], ok=False, error="boom")["ok"]
    res = apply(s, commands.make("release", T0 + 2 * MIN + 5, None, worker="w1", leases=[[b["id"], b["token"]]]))
    assert res["ok"] and res["released"] == [b["id"]], res
    assert s.runs[a["id"]]["state"] == "dead" and s.runs[b["id"]]["state"] == "dead"
    assert grants(s, T0 + 2 * MIN + 6) == []
    # Nor does a requeue from the dead-letter queue queue it.
    before = snap_obj(s, DROP)
    res = do(s, "dlq_requeue", T0 + 2 * MIN + 7, run=a["id"])
    assert res["error"]["code"] == "conflict" and res["error"]["field"] == "run", res
    assert snap_obj(s, DROP) == before
    res = apply(s, commands.make("dlq_bulk", T0 + 2 * MIN + 8, None, name="r1", action="requeue", queue=None,
                                 job="j", error=None, dead_from=None, dead_to=T0 + 2 * MIN + 8, max_count=None,
                                 max_concurrent=10, rate_milli=None))
    assert res["ok"], res
    res = step(s, "r1", T0 + 2 * MIN + 9)
    assert res["ok"] and res.get("requeued", 0) == 0, res
    assert s.backfills["r1"]["left_out"] == {"heartbeat_job": 2}
    assert grants(s, T0 + 2 * MIN + 10) == []


def test_a_slot_closed_unpinged_or_withdrawn_is_told_and_counted_as_any_skipped_slot():
    """A heartbeat job's slot closed with nobody's ping (past the open bound, or because the job
    stopped being a heartbeat job) and a run withdrawn because its job became one are slots
    recorded skipped instead of running: each raises ``slot.missed`` with its reason and is
    counted among the recorded outcomes, as a misfire's or a full queue's slot is. Before, only
    a deadline, when the job had one, said anything: a heartbeat job without one was silent."""
    from raftsched.core import events, limits
    from raftsched.core.notify_model import validate_sink
    sink = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook", "secrets": {"signing_key": "k"}})
    route = [{"sink": "ops", "on": ["slot.missed"]}]
    s = new_state(now=T0)
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=sink))["ok"]
    assert apply(s, put_cmd(s, "j", job_spec(HB, notify=route), T0))["ok"]
    n = limits.heartbeat_open_max + 3
    for k in range(1, n + 1):
        tick(s, T0 + k * MIN + 1)
    missed = [events.view(e) for e in s.outbox.events if e["kind"] == "slot.missed"]
    closed = sorted(r["id"] for r in s.runs.values() if r.get("reason") == "not_pinged")
    assert len(closed) == n - limits.heartbeat_open_max, closed
    assert sorted(e["run_id"] for e in missed) == closed
    assert {(e["reason"], e["state"]) for e in missed} == {("not_pinged", "skipped")}
    assert s.stats.recorded[("skipped", "not_pinged")] == len(closed)
    # No longer a heartbeat job: every slot still waiting closes at once, told the same way.
    now = T0 + (n + 1) * MIN
    waiting = sorted(rid for rid, r in s.runs.items() if r["state"] == "waiting")
    assert apply(s, put_cmd(s, "j", job_spec(notify=route), now))["ok"]
    missed = [events.view(e) for e in s.outbox.events if e["kind"] == "slot.missed"]
    assert sorted(e["run_id"] for e in missed) == sorted(closed + waiting)
    # And back: the runs queued for a worker are withdrawn, told with reason heartbeat_job. The
    # job's health (made by a run a worker ran) is not moved by them, as pings never move it.
    tick(s, now + MIN + 1)
    ran = grants(s, now + MIN + 2)[0]
    assert complete(s, now + MIN + 3, ran["id"], ran["token"])["ok"]
    tick(s, now + 2 * MIN + 1)
    health = copy.deepcopy(s.health["j"])
    queued = [rid for rid, r in s.runs.items() if r["state"] == "queued"]
    assert queued
    told = len(s.outbox.events)
    assert apply(s, put_cmd(s, "j", job_spec(HB, notify=route), now + 2 * MIN + 2))["ok"]
    late = [events.view(e) for e in list(s.outbox.events)[told:]]
    assert sorted(e["run_id"] for e in late if e["kind"] == "slot.missed") == sorted(queued)
    assert {e["reason"] for e in late if e["kind"] == "slot.missed"} == {"heartbeat_job"}
    for k in range(3, limits.heartbeat_open_max + 6):  # unpinged slots closed again, as a heartbeat job
        tick(s, now + k * MIN + 1)
    assert any(e["reason"] == "not_pinged" for e in map(events.view, list(s.outbox.events)[told:]))
    # (SENT, the routes' record of what they were told, moves with every event told)
    assert [v for k, v in enumerate(s.health["j"]) if k != events.SENT] == \
        [v for k, v in enumerate(health) if k != events.SENT]
    assert snap_obj(restored(s)) == snap_obj(s)


def test_a_heartbeat_jobs_pinged_end_and_a_started_slot_closed_count_as_finished_runs():
    """``raftsched_runs_finished_total`` (stats.finished) counts a heartbeat job's slot ended by a
    ``success`` or ``fail`` ping, and a started slot closed past the open bound, as the runs a
    worker ends are counted: an alert on failed runs sees a heartbeat job's. Before, none of
    them was counted (only the skipped slots were, as recorded slots)."""
    from raftsched.core import limits
    s = new_state(now=T0)
    assert apply(s, put_cmd(s, "j", job_spec(HB), T0))["ok"]
    tick(s, T0 + MIN + 1)
    before = dict(s.stats.finished)
    assert apply(s, commands.ping(T0 + MIN + 2, None, name="j", status="success", slot=None))["ok"]
    tick(s, T0 + 2 * MIN + 1)
    assert apply(s, commands.ping(T0 + 2 * MIN + 2, None, name="j", status="fail", slot=None))["ok"]
    assert s.stats.finished.get("succeeded", 0) == before.get("succeeded", 0) + 1, s.stats.finished
    assert s.stats.finished.get("failed", 0) == before.get("failed", 0) + 1, s.stats.finished
    # A started slot, then enough later slots that it is closed as failed.
    tick(s, T0 + 3 * MIN + 1)
    assert apply(s, commands.ping(T0 + 3 * MIN + 2, None, name="j", status="start", slot=None))["ok"]
    for k in range(4, 4 + limits.heartbeat_open_max + 1):
        tick(s, T0 + k * MIN + 1)
    started = [r for r in s.runs.values() if r["state"] == "failed" and r.get("error") != "a fail ping"]
    assert len(started) == 1, started
    assert s.stats.finished["failed"] == before.get("failed", 0) + 2, s.stats.finished
