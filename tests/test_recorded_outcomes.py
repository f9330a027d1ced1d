"""Outcomes that end a run outside a worker's report (a heartbeat job's pings and closes, a
tenant policy's refusal, a fire's own trims, a backfill's withdrawals): every replica, live or
restored from a snapshot, holds the same leases, and each outcome is told and judged as a
worker's would be (docs/notifications.md, docs/design.md I28). Each test failed on the code
before its fix."""
from __future__ import annotations

from backfill_helpers import backfill_cmd, step
from core_helpers import MIN, SEC, T0, apply, new_state, put_cmd, raw_job, spec_of, tick

import test_core_deadlines as td
from raftsched.core import commands, deadlines, limits, model, policy, queries
from raftsched.core.notify import view_health
from raftsched.core.notify_model import validate_routes, validate_sink
from raftsched.core.state import SchedulerState

SINK = {"type": "webhook", "url": "https://example.com/h", "secrets": {"signing_key": "k"}}


def _restored(s: SchedulerState) -> SchedulerState:
    r = SchedulerState()
    r.restore(s.snapshot())
    return r


def _counts(s: SchedulerState) -> dict:
    """The running counts a replica holds (a queue whose leases all ended may keep a 0)."""
    return {q: n for q, n in s._running_count.items() if n}


def _fire(s: SchedulerState, name: str, now: int) -> dict:
    j = s.jobs[name]
    e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], name)
    assert e is not None
    return apply(s, commands.make("fire", now, None, entries=[e]))


def _with_sink(s: SchedulerState, on: list[str], **route) -> list:
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=validate_sink("ops", SINK)))["ok"]
    return validate_routes([{"sink": "ops", "on": on, **route}])


def test_a_started_heartbeat_run_is_no_lease_on_a_restored_replica():
    s = new_state()
    raw = raw_job({"every_s": 60}, "fire_all", grace_s=3600)
    raw["executor"] = {"type": "heartbeat"}
    assert apply(s, put_cmd(s, "hb", model.validate_job("hb", raw, T0), T0))["ok"]
    now = T0 + MIN
    assert _fire(s, "hb", now)["ok"]
    res = apply(s, commands.make("ping", now, None, name="hb", status="start", slot=None))
    assert res["ok"] and res["state"] == "running"
    r = _restored(s)
    assert list(s._running_ids) == list(r._running_ids) == []
    assert _counts(s) == _counts(r)
    assert queries.lease_snapshot(r) == []
    takeover = commands.make("takeover", now + SEC, None, node="n2")
    assert apply(s, takeover) == apply(r, takeover)
    assert s.snapshot() == r.snapshot()
    # and later fires, which close the open runs past the bound, agree too
    for k in range(2, 4 + limits.heartbeat_open_max):
        t = T0 + k * MIN
        assert _fire(s, "hb", t) == _fire(r, "hb", t)
    assert s.state_hash() == r.state_hash()


def test_a_ping_ends_the_lease_of_a_run_a_worker_held():
    s = new_state()
    raw = raw_job({"every_s": 1}, "fire_all", grace_s=3600, history=100)
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, T0), T0))["ok"]
    now = T0 + SEC
    assert _fire(s, "j", now)["ok"]
    g = apply(s, commands.make("acquire", now, None, worker="w", queues=None, max=1, ttl=600_000))["runs"][0]
    raw["executor"] = {"type": "heartbeat"}
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, now), now))["ok"]
    res = apply(s, commands.make("ping", now, None, name="j", status="success", slot=s.runs[g["id"]]["slot"]))
    assert res["ok"] and res["state"] == "succeeded"
    assert g["id"] not in s._running_ids and not s._running_count.get(s.runs[g["id"]]["queue"])
    att = s.runs[g["id"]]["attempts"]
    assert att[-1]["token"] == g["token"] and att[-1]["worker"] == "w" and att[-1]["ok"] is True
    r = _restored(s)
    assert list(r._running_ids) == list(s._running_ids) == []
    assert _counts(r) == _counts(s) == {}
    # once the run is trimmed, the reaper's read and a takeover still work on every replica
    raw["history"] = 1
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, now), now))["ok"]
    for k in range(2, 8):
        _fire(s, "j", T0 + k * SEC)
    assert g["id"] not in s.runs
    assert queries.lease_snapshot(s) == []
    assert apply(s, commands.make("takeover", now + 10 * SEC, None, node="n2"))["ok"]


def test_a_run_refused_by_its_tenant_policy_is_told_and_judged():
    s = new_state()
    routes = _with_sink(s, ["deadline.missed", "slot.missed"])
    raw = raw_job({"every_s": 60}, "fire_all", grace_s=3600, deadline={"start_within_s": 30},
                  executor={"type": "shell", "argv": ["true"]}, tenant="t", notify=routes)
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, T0), T0))["ok"]
    assert apply(s, commands.make("put_tenant_policy", T0, None, name="t", executors=["http"], labels={},
                                  allow=[]))["ok"]
    now = T0 + MIN
    td.tick(s, now)
    rid = f"j@{now}"
    res = apply(s, commands.acquire(now + 1, worker="w", queues=None, max=10, ttl=30_000, types=None))
    assert res["runs"] == [] and res["refused"] == 1
    assert s.runs[rid]["state"] == "skipped" and s.runs[rid]["reason"] == "policy"
    view = deadlines.slot_view(s, rid)
    assert view is not None and view["state"] == "missed"
    assert s.deadlines.pending == 0
    got = [(e["kind"], e["run_id"], e["reason"]) for e in s.outbox.events]
    assert ("slot.missed", rid, "policy") in got and ("deadline.missed", rid, "skipped") in got
    # The event says which rule refused it, as the record's error does (a user's walk: the email
    # said only "policy").
    (missed,) = [e for e in s.outbox.events if e["kind"] == "slot.missed"]
    assert missed["detail"]["error"] == s.runs[rid]["error"] and "executor" in missed["detail"]["error"], missed


def test_a_recorded_range_trimmed_by_its_own_fire_misses_each_slot():
    def missed(history: int) -> list[str]:
        s = new_state()
        routes = _with_sink(s, ["deadline.missed"])
        raw = raw_job({"every_s": 60}, "fire_once", grace_s=1, deadline={"succeed_within_s": 30},
                      notify=routes, history=history)
        assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, T0), T0))["ok"]
        td.tick(s, T0 + 4 * MIN + 1)  # four slots due: fire_once coalesces three, runs the last
        return sorted(e["run_id"] for e in s.outbox.events if e["kind"] == "deadline.missed")

    want = [f"j@{T0 + k * MIN}" for k in (1, 2, 3)]
    assert missed(100) == want
    assert missed(1) == want  # the range's record was trimmed by the run's add in the same fire


def test_a_record_of_the_general_path_trimmed_in_its_own_fire_is_judged():
    # overlap forbid with an unfinished head and history 1: a blocked slot's record is trimmed
    # by its own add (the case of a4aee12), and its deadline is still judged
    s = new_state()
    routes = _with_sink(s, ["deadline.missed"])
    raw = raw_job({"every_s": 60}, "fire_all", grace_s=3600, deadline={"start_within_s": 30},
                  notify=routes, history=1, overlap={"policy": "forbid"})
    assert apply(s, put_cmd(s, "j", model.validate_job("j", raw, T0), T0))["ok"]
    td.tick(s, T0 + MIN)
    assert apply(s, commands.acquire(T0 + MIN, worker="w", queues=None, max=1, ttl=600_000, types=None))["runs"]
    trimmed_at_once = 0
    for k in range(2, 40):
        td.tick(s, T0 + k * MIN)
        blocked = f"j@{T0 + k * MIN}"
        trimmed_at_once += blocked not in s.runs  # dropped by the scan its own add made
        view = deadlines.slot_view(s, blocked)
        assert view is not None and view["state"] == "missed", (k, view)
    assert trimmed_at_once > 0
    told = {e["run_id"] for e in s.outbox.events if e["kind"] == "deadline.missed"}
    assert all(f"j@{T0 + k * MIN}" in told for k in range(2, 40))


def test_repeat_every_s_holds_for_a_job_without_outcomes():
    s = new_state()
    routes = _with_sink(s, ["slot.missed"], repeat_every_s=3600)
    assert apply(s, commands.make("put_queue", T0, None, name="q0", max_depth=0, on_full="reject"))["ok"]
    assert apply(s, put_cmd(s, "j", spec_of({"every_s": 10}, "fire_all", name="j", queue="q0", notify=routes),
                            T0))["ok"]
    now = T0
    for _ in range(5):
        now += 10 * SEC
        tick(s, now)
    assert [e["kind"] for e in s.outbox.events] == ["slot.missed"]
    r = _restored(s)
    assert r.state_hash() == s.state_hash()


def test_a_backfills_withdrawn_runs_stay_out_of_the_jobs_health():
    s = new_state()
    assert apply(s, put_cmd(s, "j", spec_of({"every_s": 60}, "fire_all", name="j"), T0))["ok"]
    now = T0
    for _ in range(5):
        now += MIN
        tick(s, now)
        for g in apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))["runs"]:
            apply(s, commands.complete_many(now, None, worker="w",
                                            results=[{"run": g["id"], "token": g["token"], "success": True}]))
    before = view_health(s.health["j"])["last_slot_outcome"]
    assert before["outcome"] == "succeeded"
    assert apply(s, backfill_cmd(s, "j", T0, now, now, reprocess="all", max_concurrent=3))["ok"]
    step(s, "b1", now)
    assert apply(s, commands.make("backfill_control", now, None, name="b1", action="cancel"))["withdrawn"] > 0
    assert view_health(s.health["j"])["last_slot_outcome"] == before


def test_a_job_no_longer_a_heartbeat_job_closes_the_runs_pings_were_to_end():
    s = new_state()
    raw = raw_job({"every_s": 60}, "fire_all", grace_s=3600)
    raw["executor"] = {"type": "heartbeat"}
    assert apply(s, put_cmd(s, "hb", model.validate_job("hb", raw, T0), T0))["ok"]
    for k in (1, 2):
        assert _fire(s, "hb", T0 + k * MIN)["ok"]
    assert apply(s, commands.make("ping", T0 + 2 * MIN, None, name="hb", status="start", slot=None))["ok"]
    raw2 = raw_job({"every_s": 60}, "fire_all", grace_s=3600, overlap={"policy": "forbid"})
    now = T0 + 2 * MIN + 1
    assert apply(s, put_cmd(s, "hb", model.validate_job("hb", raw2, now), now))["ok"]
    states = {rid: (s.runs[rid]["state"], s.runs[rid].get("reason")) for rid in s.history["hb"]}
    assert states == {f"hb@{T0 + MIN}": ("skipped", "not_pinged"), f"hb@{T0 + 2 * MIN}": ("failed", None)}
    assert _fire(s, "hb", T0 + 3 * MIN)["ok"]
    assert s.runs[f"hb@{T0 + 3 * MIN}"]["state"] == "queued"  # forbid sees no run of the old kind
    assert s.snapshot() == _restored(s).snapshot()
