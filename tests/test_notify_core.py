"""Notifications in the core (core/notify.py, core/events.py routing): no network, no clock.

Each event is appended by the apply of the change it reports; replicas stay byte-identical; a
job's health and incident are kept on every outcome; routes and noise control decide at apply.
"""
from __future__ import annotations

import pytest

from core_helpers import SEC, T0, apply, complete_many, new_state, put_cmd, refused, restored, resume_cmd, spec_of, tick
import types

from raftsched.core import commands, events, model, notify_queries
from raftsched.node import notify as node_notify
from raftsched.testing.fakes import FakeRaft
from raftsched.core.errors import InvalidSpec
from raftsched.core.notify import sink_gen, view_health
from raftsched.core.notify_model import validate_routes, validate_sink
from raftsched.core.state import SchedulerState

WEBHOOK = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook",
                                "secrets": {"signing_key": "k"}, "retry": {"max_attempts": 2}})


def job_with(notify=None, **extra):
    raw = {"retry": {"max_attempts": 1}}
    if notify is not None:
        raw["notify"] = notify
    raw.update(extra)
    return spec_of({"every_s": 10}, "fire_all", name="j", **raw)


def state_with(spec, sinks=("ops",)) -> SchedulerState:
    s = new_state()
    for name in sinks:
        assert apply(s, commands.put_sink(T0, None, name=name, spec=WEBHOOK))["ok"]
    assert apply(s, put_cmd(s, "j", spec, T0))["ok"]
    return s


def run_once(s: SchedulerState, now: int, success: bool) -> dict:
    """Fire the next slot(s) and run each to an outcome (one attempt)."""
    tick(s, now)
    res = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))
    for g in res["runs"]:
        out, each = complete_many(s, commands.complete_many(now, None, results=[
            {"run": g["id"], "token": g["token"], "success": success, "error": None if success else "exit 1"}],
            worker="w"))
        assert each[0]["ok"], out
    return res


def kinds(s: SchedulerState) -> list[str]:
    return [e["kind"] for e in s.outbox.events]


def test_an_event_is_appended_by_the_apply_of_its_change_and_replicas_stay_identical() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered", "run.succeeded"]}]))
    now = T0
    for ok_ in (False, False, True):
        now += 10 * SEC
        before = len(s.outbox.events)
        tick(s, now)
        assert len(s.outbox.events) == before  # a fire of a run is no event
        run_once(s, now, ok_)
    assert kinds(s) == ["run.dead", "job.recovered", "run.succeeded"]
    dead, recovered, _ = (events.view(e) for e in s.outbox.events)
    assert dead["run_id"] == "j@" + str(T0 + 10 * SEC) and dead["consecutive_failures"] == 1
    assert dead["reason"] == "exit 1" and dead["tenant"] == "default" and dead["event_id"] == "ev-1"
    assert recovered["failures"] == 2 and recovered["incident_since"] == T0 + 10 * SEC
    assert "to" not in recovered
    assert restored(s).snapshot() == s.snapshot()


def test_replicas_fed_the_same_log_hold_byte_identical_outboxes() -> None:
    log: list[bytes] = []
    a = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered", "slot.missed"]}]))
    b = restored(a)
    now = T0
    for ok_ in (False, True, False):
        now += 10 * SEC
        cmd, _ = tick(a, now)
        log.append(commands.encode(cmd))
        res = apply(a, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))
        log.append(commands.encode(commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None)))
        c = commands.complete_many(now, None, results=[{"run": g["id"], "token": g["token"], "success": ok_}
                                                       for g in res["runs"]], worker="w")
        apply(a, c)
        log.append(commands.encode(c))
    for data in log:
        b.apply_bytes(data)
    assert a.outbox == b.outbox and a.snapshot() == b.snapshot()


def test_health_and_one_incident_per_job() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"]}]))
    assert view_health(s.health.get("j"))["incident"] is None
    now = T0
    for _ in range(3):
        now += 10 * SEC
        run_once(s, now, False)
    h = view_health(s.health["j"])
    assert h["consecutive_failures"] == 3 and h["last_failure_at"] == now and h["last_success_at"] is None
    assert h["incident"] == {"since": T0 + 10 * SEC, "run": f"j@{T0 + 10 * SEC}"}
    assert h["last_slot_outcome"] == {"slot": now, "outcome": "dead", "reason": "exit 1"}
    # One message for the incident, not one a failed run (repeat_every_s 0: never again).
    assert kinds(s) == ["run.dead"]
    now += 10 * SEC
    run_once(s, now, True)
    h = view_health(s.health["j"])
    assert h["consecutive_failures"] == 0 and h["incident"] is None and h["last_success_at"] == now
    assert kinds(s) == ["run.dead", "job.recovered"]
    # The next incident is told again.
    now += 10 * SEC
    run_once(s, now, False)
    assert kinds(s) == ["run.dead", "job.recovered", "run.dead"]


@pytest.mark.parametrize("sinks", [("ops",), ()])
def test_a_run_replaced_by_the_overlap_policy_is_the_jobs_last_outcome_but_no_death(sinks) -> None:
    """A migrating user's walk: a `replace` job whose every run was replaced before it ended
    showed `last_slot_outcome: null` and no failure at all, where the docs say it is the last
    run's outcome. It is `failed` with why now; it opens no incident and sends no run.dead (a
    deadline's max_since_success_s tells of a job that never succeeds)."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"]}] if sinks else None,
                            overlap={"policy": "replace"}), sinks=sinks)
    now = T0 + 10 * SEC
    tick(s, now)
    first = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))["runs"]
    assert [g["id"] for g in first] == [f"j@{now}"]
    now += 10 * SEC
    tick(s, now)  # the next slot replaces the run still running
    assert s.runs[f"j@{now - 10 * SEC}"]["state"] == "failed"
    h = view_health(s.health.get("j"))
    assert h["last_slot_outcome"] == {"slot": now - 10 * SEC, "outcome": "failed",
                                      "reason": f"replaced by run j@{now} (overlap policy replace)"}, h
    assert h["consecutive_failures"] == 0 and h["incident"] is None and h["last_failure_at"] is None
    assert kinds(s) == []
    # The replacing run succeeds: the last outcome; an older slot's cannot come after it.
    res = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))
    out, each = complete_many(s, commands.complete_many(now, None, results=[
        {"run": g["id"], "token": g["token"], "success": True, "error": None} for g in res["runs"]], worker="w"))
    assert view_health(s.health["j"])["last_slot_outcome"] == {"slot": now, "outcome": "succeeded", "reason": None}
    assert restored(s).snapshot() == s.snapshot()


def _requeue_and_succeed(s: SchedulerState, rid: str, now: int) -> None:
    assert apply(s, commands.dlq_requeue(now, None, run=rid))["ok"]
    res = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=30_000, types=None))
    (g,) = [g for g in res["runs"] if g["id"] == rid]
    out, each = complete_many(s, commands.complete_many(now, None, results=[
        {"run": rid, "token": g["token"], "success": True, "error": None}], worker="w"))
    assert each[0]["ok"], out


@pytest.mark.parametrize("sinks", [("ops",), ()])
def test_an_older_slot_requeued_and_succeeding_does_not_close_an_incident_newer_deaths_keep_open(sinks) -> None:
    """A user's walk: four runs died, the oldest was requeued from the DLQ once fixed and
    succeeded: job.recovered was told and the health said healthy, last outcome the old slot,
    with the three newer slots still dead. A success of a slot older than the last outcome
    now says nothing of the job's health but its last success (with or without sinks: the
    complete's fast path, none, keeps the same health as on_success); a success of the newest
    closes the incident."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"]}] if sinks else None), sinks=sinks)
    now = T0
    slots = []
    for _ in range(3):
        now += 10 * SEC
        run_once(s, now, False)
        slots.append(now)
    now += SEC
    _requeue_and_succeed(s, f"j@{slots[0]}", now)
    h = view_health(s.health["j"])
    assert h["consecutive_failures"] == 3 and h["incident"] is not None and h["last_success_at"] == now
    assert h["last_slot_outcome"] == {"slot": slots[-1], "outcome": "dead", "reason": "exit 1"}
    assert "job.recovered" not in kinds(s)
    now += SEC
    _requeue_and_succeed(s, f"j@{slots[-1]}", now)
    h = view_health(s.health["j"])
    assert h["consecutive_failures"] == 0 and h["incident"] is None
    assert h["last_slot_outcome"] == {"slot": slots[-1], "outcome": "succeeded", "reason": None}
    if sinks:
        assert kinds(s) == ["run.dead", "job.recovered"]
    # Once healthy, an older slot's success leaves the last outcome where it is, as the newest's.
    now += SEC
    _requeue_and_succeed(s, f"j@{slots[1]}", now)
    assert view_health(s.health["j"])["last_slot_outcome"]["slot"] == slots[-1]


def test_an_older_slot_requeued_and_dead_again_is_not_the_last_outcome() -> None:
    """A user's walk: last_slot_outcome went back to an older slot when a requeued old run died
    again, while a newer slot had succeeded (a success of an older slot already left it alone)."""
    s = state_with(job_with(None))
    now = T0 + 10 * SEC
    run_once(s, now, False)
    old = now
    now += 10 * SEC
    run_once(s, now, True)
    assert view_health(s.health["j"])["last_slot_outcome"] == {"slot": now, "outcome": "succeeded", "reason": None}
    assert apply(s, commands.dlq_requeue(now + 1, None, run=f"j@{old}"))["ok"]
    res = apply(s, commands.acquire(now + 2, worker="w", queues=None, max=10, ttl=30_000, types=None))
    (g,) = [g for g in res["runs"] if g["id"] == f"j@{old}"]
    complete_many(s, commands.complete_many(now + 3, None, results=[
        {"run": g["id"], "token": g["token"], "success": False, "error": "exit 1"}], worker="w"))
    assert s.runs[f"j@{old}"]["state"] == "dead"
    h = view_health(s.health["j"])
    assert h["last_slot_outcome"] == {"slot": now, "outcome": "succeeded", "reason": None}
    assert h["consecutive_failures"] == 1  # (still counted, and told)


def test_a_success_outlasting_its_next_slot_recorded_skipped_still_closes_the_incident() -> None:
    """A review: a run that outlasts its next slot under overlap forbid (the slot recorded
    skipped, the job's last outcome) was taken for an older slot's success once it succeeded: no
    job.recovered, the failures kept counting, and pause_on_failure paused a job that had
    recovered. Only a run's outcome (succeeded, dead) makes a later slot's success older."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"]}], overlap={"policy": "forbid"},
                            pause_on_failure={"after_consecutive": 3}))
    now = T0
    for _ in range(2):
        now += 10 * SEC
        run_once(s, now, False)
    now += 10 * SEC
    tick(s, now)
    (g,) = apply(s, commands.acquire(now, worker="w", queues=None, max=10, ttl=300_000, types=None))["runs"]
    now += 10 * SEC
    tick(s, now)  # the next slot: recorded skipped (overlap), the last outcome
    assert view_health(s.health["j"])["last_slot_outcome"]["outcome"] == "skipped"
    out, each = complete_many(s, commands.complete_many(now + 2 * SEC, None, results=[
        {"run": g["id"], "token": g["token"], "success": True, "error": None}], worker="w"))
    assert each[0]["ok"], out
    h = view_health(s.health["j"])
    assert h["consecutive_failures"] == 0 and h["incident"] is None and "job.recovered" in kinds(s)
    now += 20 * SEC
    run_once(s, now, False)
    assert view_health(s.health["j"])["consecutive_failures"] == 1 and not s.jobs["j"]["paused"]


def test_after_consecutive_and_repeat_every_s() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"], "after_consecutive": 2,
                              "repeat_every_s": 25}]))
    now = T0
    now += 10 * SEC
    run_once(s, now, False)
    assert kinds(s) == []  # one failure: below after_consecutive
    now += 10 * SEC
    run_once(s, now, False)
    assert kinds(s) == ["run.dead"]
    now += 10 * SEC
    run_once(s, now, False)
    assert kinds(s) == ["run.dead"]  # 10 s later: inside repeat_every_s
    now += 10 * SEC
    run_once(s, now, False)
    now += 10 * SEC
    run_once(s, now, False)
    assert kinds(s) == ["run.dead", "run.dead"]  # 30 s after the first: repeated once
    assert s.outbox.events[-1]["detail"]["consecutive_failures"] == 5
    # What repeat_every_s held back is counted (an on-call walk: a second slot's run.dead and
    # deadline.missed within the window went nowhere, and nothing said so); the first failure,
    # below after_consecutive, is not held back but not due.
    assert s.stats.held_back == {"run.dead": 2}


def test_recovered_goes_only_to_a_route_told_of_the_incident() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"], "after_consecutive": 3}]))
    run_once(s, T0 + 10 * SEC, False)
    run_once(s, T0 + 20 * SEC, True)
    assert kinds(s) == []


def test_nothing_while_paused_and_manual_changes_are_events() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.paused", "job.resumed", "job.triggered",
                                                    "run.requeued", "slot.missed"]}]))
    assert apply(s, commands.trigger_job(T0 + SEC, None, name="j"))["ok"]
    assert apply(s, commands.pause_job(T0 + 2 * SEC, None, name="j"))["ok"]
    run_once(s, T0 + 3 * SEC, False)  # the manual run dies while paused: nothing said
    assert kinds(s) == ["job.triggered", "job.paused"]
    assert view_health(s.health["j"])["consecutive_failures"] == 1  # health is kept all the same
    assert apply(s, resume_cmd(s, "j", T0 + 60 * SEC))["ok"]  # slots of the pause: skipped, no event
    assert kinds(s) == ["job.triggered", "job.paused", "job.resumed"]
    dead = next(r for r in s.runs.values() if r["state"] == "dead")
    assert apply(s, commands.dlq_requeue(T0 + 61 * SEC, None, run=dead["id"]))["ok"]
    assert kinds(s)[-1] == "run.requeued" and s.outbox.events[-1]["run_id"] == dead["id"]


def test_slot_missed_with_its_reason_and_opt_in_kinds() -> None:
    spec = spec_of({"every_s": 10}, "skip", name="j",
                   notify=[{"sink": "ops", "on": ["slot.missed"]}])
    s = state_with(spec)
    tick(s, T0 + 55 * SEC)  # slots missed past their grace: recorded skipped, one range
    evs = [events.view(e) for e in s.outbox.events]
    assert [e["kind"] for e in evs] == ["slot.missed"]
    assert evs[0]["reason"] == "misfire" and evs[0]["state"] == "skipped"
    # run.failed and run.succeeded are opt-in: the default route has neither.
    assert "run.succeeded" not in validate_routes([{"sink": "ops"}])[0]["on"]


def test_an_incident_closed_while_the_job_is_paused_is_told() -> None:
    """pause_on_failure pauses, the operator fixes the cause and checks it with a manual run:
    that success closes the incident, and the route told of it hears job.recovered (PagerDuty's
    resolve), which nothing would send later."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered", "run.succeeded"]}],
                            pause_on_failure={"after_consecutive": 1}))
    run_once(s, T0 + 10 * SEC, False)
    assert s.jobs["j"]["paused"] and kinds(s) == ["run.dead"]
    assert apply(s, commands.trigger_job(T0 + 20 * SEC, None, name="j"))["ok"]
    run_once(s, T0 + 20 * SEC, True)
    assert kinds(s) == ["run.dead", "job.recovered"]  # (run.succeeded is not sent while paused)
    assert view_health(s.health["j"])["incident"] is None
    assert restored(s).snapshot() == s.snapshot()


def test_tenant_defaults_and_a_sink_limited_to_a_tenant() -> None:
    s = state_with(job_with())
    route = validate_routes([{"sink": "ops", "on": ["run.dead"]}])
    assert apply(s, commands.put_tenant_notify(T0, None, name="default", notify=route))["ok"]
    run_once(s, T0 + 10 * SEC, False)
    assert kinds(s) == ["run.dead"]
    other = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/", "tenant": "billing",
                                  "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=other))["ok"]
    run_once(s, T0 + 20 * SEC, True)
    assert kinds(s) == ["run.dead"]  # the sink hears of billing's jobs only


def test_a_tenant_holds_at_most_its_share_of_the_sinks(monkeypatch) -> None:
    """A red-team walk: an operator limited to one tenant made the cluster's 100 sinks, after which
    every other tenant's sink, and the admin's, was refused. A tenant holds at most
    sinks_per_tenant_max (by its spec's tenant): a new one, or one moved to it, is refused naming
    the field; its own replaced, another tenant's and a cluster-wide one go on."""
    from raftsched.core import limits
    monkeypatch.setattr(limits, "sinks_per_tenant_max", 2)
    s = new_state()

    def sink(name, tenant):
        raw = {"type": "webhook", "url": "http://127.0.0.1:9/", "secrets": {"signing_key": "k"}}
        if tenant is not None:
            raw["tenant"] = tenant
        return apply(s, commands.put_sink(T0, None, name=name, spec=validate_sink(name, raw)))
    assert sink("b1", "billing")["ok"] and sink("b2", "billing")["ok"]
    res = sink("b3", "billing")
    assert not res["ok"] and res["error"]["code"] == "limit_exceeded" and res["error"]["field"] == "tenant", res
    assert res["error"]["message"] == "tenant 'billing' holds 2 sinks, a tenant's limit" and "b3" not in s.sinks
    assert sink("b2", "billing")["ok"]  # its own, replaced
    assert sink("s1", "search")["ok"] and sink("ops", None)["ok"]
    assert not sink("s1", "billing")["ok"] and s.sinks["s1"]["spec"]["tenant"] == "search"  # moved to a full one
    assert apply(s, commands.delete_sink(T0, None, name="b1"))["ok"]
    assert sink("s1", "billing")["ok"]


def test_a_job_with_an_empty_notify_has_no_routes_not_its_tenants() -> None:
    """A user's walk: a job put with "notify": [] under a tenant with default routes was still
    told by them (the empty list was dropped as absent). It is the job's own routes: none."""
    quiet = job_with([])
    assert quiet["notify"] == []
    s = state_with(quiet)
    route = validate_routes([{"sink": "ops", "on": ["run.dead"]}])
    assert apply(s, commands.put_tenant_notify(T0, None, name="default", notify=route))["ok"]
    run_once(s, T0 + 10 * SEC, False)
    assert kinds(s) == []
    assert apply(s, put_cmd(s, "j", job_with(), T0 + 11 * SEC))["ok"]  # without notify: the tenant's
    run_once(s, T0 + 20 * SEC, False)
    assert kinds(s) == ["run.dead"]


def test_pause_on_failure_pauses_through_apply_and_says_so() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.paused"]}],
                            pause_on_failure={"after_consecutive": 2}))
    run_once(s, T0 + 10 * SEC, False)
    assert not s.jobs["j"]["paused"]
    run_once(s, T0 + 20 * SEC, False)
    assert s.jobs["j"]["paused"]
    assert kinds(s) == ["run.dead", "job.paused"]
    assert s.outbox.events[-1]["reason"] == "pause_on_failure"


def test_cluster_kinds_go_to_subscribed_sinks() -> None:
    sub = validate_sink("pager", {"type": "pagerduty", "secrets": {"routing_key": "r"},
                                  "subscribe": ["cluster.leader_changed", "cluster.no_leader", "worker.lost"]})
    s = new_state()
    assert apply(s, commands.put_sink(T0, None, name="pager", spec=sub))["ok"]
    assert apply(s, commands.takeover(T0, node="a"))["ok"]
    assert kinds(s) == []  # the first leader: nobody led before
    assert apply(s, commands.takeover(T0 + 20 * SEC, node="b", seen=T0 + SEC))["ok"]
    assert kinds(s) == ["cluster.no_leader", "cluster.leader_changed"]
    assert s.outbox.events[0]["detail"]["gap_ms"] == 19 * SEC
    assert apply(s, put_cmd(s, "j", job_with(), T0 + 20 * SEC))["ok"]
    tick(s, T0 + 30 * SEC)
    g = apply(s, commands.acquire(T0 + 30 * SEC, worker="w1", queues=None, max=1, ttl=5_000, types=None))["runs"][0]
    assert apply(s, commands.expire(T0 + 40 * SEC, runs=[[g["id"], g["token"], 0]], locks=[]))["ok"]
    ev = events.view(s.outbox.events[-1])
    assert ev["kind"] == "worker.lost" and ev["worker"] == "w1" and ev["runs"] == [g["id"]]


def test_sink_progress_cursor_dead_list_and_requeue() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead"], "repeat_every_s": 1}]))
    run_once(s, T0 + 10 * SEC, False)
    run_once(s, T0 + 20 * SEC, False)
    assert s.sinks["ops"]["cursor"] == 0
    first, second = s.outbox.events
    box, upto = events.pending(s.outbox, 0, "ops", 10)
    assert [e["seq"] for e in box] == [1, 2] and upto == 2
    assert apply(s, commands.sink_progress(T0, items=[{"sink": "ops", "cursor": 2, "dead": [
        {"event": second, "error": "HTTP 500", "attempts": 2}]}]))["ok"]
    assert s.sinks["ops"]["cursor"] == 2 and [d["event"]["seq"] for d in s.sinks["ops"]["dead"]] == [2]
    # never backwards
    assert apply(s, commands.sink_progress(T0, items=[{"sink": "ops", "cursor": 1}]))["ok"]
    assert s.sinks["ops"]["cursor"] == 2
    assert apply(s, commands.sink_requeue(T0, None, name="ops", events=["ev-2"]))["requeued"] == 1
    assert s.sinks["ops"]["dead"] == [] and [e["seq"] for e in s.sinks["ops"]["redo"]] == [2]
    assert apply(s, commands.sink_progress(T0, items=[{"sink": "ops", "cursor": 2, "redo": [2]}]))["ok"]
    assert s.sinks["ops"]["redo"] == []
    assert restored(s).snapshot() == s.snapshot()
    assert first["seq"] == 1


def test_a_requeue_naming_an_event_that_is_not_dead_in_that_sink_changes_nothing() -> None:
    """Every id a requeue names must be one of the sink's dead events: an unknown one, one of
    the outbox that was delivered, or one dead in another sink is refused as not found, naming
    it, and nothing is requeued, not even the ids that are dead. Replicas refuse alike."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead"], "repeat_every_s": 1}]), sinks=("ops", "other"))
    run_once(s, T0 + 10 * SEC, False)
    run_once(s, T0 + 20 * SEC, False)
    first, second = s.outbox.events
    assert apply(s, commands.sink_progress(T0, items=[
        {"sink": "ops", "cursor": 2, "dead": [{"event": second, "error": "HTTP 500", "attempts": 2}]},
        {"sink": "other", "cursor": 2, "dead": [{"event": first, "error": "HTTP 500", "attempts": 2}]}]))["ok"]
    for ids, named in ((["bogus"], "'bogus'"), (["ev-1"], "'ev-1'"), (["ev-2", "ev-99"], "'ev-99'"),
                       (["ev-2", "x", "x", "y"], "'x', 'y'")):
        replica = restored(s)
        res = refused(s, commands.sink_requeue(T0, None, name="ops", events=ids), "not_found")
        assert res["error"]["field"] == "events" and named in res["error"]["message"], res
        assert "'ev-2'" not in res["error"]["message"], res  # the dead one is not named
        assert replica.apply(commands.sink_requeue(T0, None, name="ops", events=ids)) == res
    res = refused(s, commands.sink_requeue(T0, None, name="ops", events=[f"e{i}" for i in range(25)]), "not_found")
    assert "'e9'" in res["error"]["message"] and "'e10'" not in res["error"]["message"], res
    assert "and 15 more" in res["error"]["message"], res  # a refusal stays small
    assert [d["event"]["seq"] for d in s.sinks["ops"]["dead"]] == [2] and s.sinks["ops"]["redo"] == []
    assert apply(s, commands.sink_requeue(T0, None, name="ops", events=["ev-2", "ev-2"]))["requeued"] == 1
    assert apply(s, commands.sink_requeue(T0, None, name="other", events=[]))["requeued"] == 0  # names none


def test_a_replaced_sinks_progress_of_a_batch_read_before_is_ignored() -> None:
    """A put_sink that changes the spec changes the sink's generation; sink_progress names the
    generation its batch was read with, and one of an older generation changes nothing (its dead
    events were the old URL's refusals): delivery reads the batch again with the new spec."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead"], "repeat_every_s": 1}]))
    run_once(s, T0 + 10 * SEC, False)
    old = sink_gen(s, "ops")
    moved = dict(WEBHOOK, url="http://127.0.0.1:10/hook")
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=moved))["ok"]  # (an earlier time: still moves)
    new = sink_gen(s, "ops")
    assert new != old
    ev = s.outbox.events[0]
    before = (s.sinks["ops"]["cursor"], list(s.sinks["ops"]["dead"]))
    assert apply(s, commands.sink_progress(T0 + 11 * SEC, items=[{"sink": "ops", "cursor": 1, "gen": old, "dead": [
        {"event": ev, "error": "HTTP 500", "attempts": 8}]}]))["ok"]
    assert (s.sinks["ops"]["cursor"], s.sinks["ops"]["dead"]) == before
    assert apply(s, commands.sink_progress(T0 + 12 * SEC, items=[{"sink": "ops", "cursor": 1, "gen": new}]))["ok"]
    assert s.sinks["ops"]["cursor"] == 1
    assert restored(s).snapshot() == s.snapshot() and restored(s).sinks == s.sinks
    # A dump of the code that stored a generation (the put's time) loads with the one a replica
    # replaying the put derives: its spec's.
    s.sinks["ops"]["gen"] = 1780000000000
    assert sink_gen(restored(s), "ops") == new and "gen" not in restored(s).sinks["ops"]
    del s.sinks["ops"]["gen"]
    refused(restored(s), commands.make("sink_progress", T0, None, items=[{"sink": "ops", "cursor": 1, "gen": "x"}]),
            "invalid_command")


def test_the_same_spec_put_again_keeps_the_generation_and_a_batch_in_flight() -> None:
    """Configuration management puts the same spec every minute: a generation per put made
    every batch in flight start over, and an event failing for longer than the puts' interval
    never reached the dead list while the ones before it were sent again and again."""
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead"], "repeat_every_s": 1}]))
    run_once(s, T0 + 10 * SEC, False)
    gen = sink_gen(s, "ops")
    assert apply(s, commands.put_sink(T0 + 11 * SEC, None, name="ops", spec=dict(s.sinks["ops"]["spec"])))["ok"]
    assert sink_gen(s, "ops") == gen
    assert apply(s, commands.sink_progress(T0 + 12 * SEC, items=[{"sink": "ops", "cursor": 1, "gen": gen}]))["ok"]
    assert s.sinks["ops"]["cursor"] == 1


def test_a_dead_event_of_a_kind_that_is_no_string_is_refused_as_a_value() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead"]}]))
    run_once(s, T0 + 10 * SEC, False)
    ev = dict(s.outbox.events[0], kind=["run.dead"])
    refused(s, commands.sink_progress(T0, items=[{"sink": "ops", "cursor": 1, "dead": [
        {"event": ev, "error": "x", "attempts": 1}]}]), "invalid_command")


def test_a_sink_moved_to_another_tenant_keeps_nothing_of_the_old_one() -> None:
    """Its dead and requeued events, and the events routed to it and not yet delivered, were the
    old tenant's: a put that changes the tenant drops them and starts it at the outbox's end."""
    a = validate_sink("ops", dict(WEBHOOK, tenant="a"))
    s = new_state()
    assert apply(s, commands.put_sink(T0, None, name="ops", spec=a))["ok"]
    assert apply(s, put_cmd(s, "j", dict(job_with([{"sink": "ops", "on": ["job.triggered"]}]), tenant="a"), T0))["ok"]
    for k in (1, 2, 3):
        assert apply(s, commands.trigger_job(T0 + k * SEC, None, name="j"))["ok"]
    first, second, _ = s.outbox.events
    assert apply(s, commands.sink_progress(T0 + 4 * SEC, items=[{"sink": "ops", "cursor": 2, "dead": [
        {"event": first, "error": "HTTP 500", "attempts": 1}, {"event": second, "error": "HTTP 500", "attempts": 1}]}]))["ok"]
    assert apply(s, commands.sink_requeue(T0 + 5 * SEC, None, name="ops", events=["ev-1"]))["requeued"] == 1
    assert apply(s, commands.put_sink(T0 + 6 * SEC, None, name="ops", spec=dict(a, url="http://127.0.0.1:10/")))["ok"]
    assert (s.sinks["ops"]["cursor"], len(s.sinks["ops"]["dead"]), len(s.sinks["ops"]["redo"])) == (2, 1, 1)  # same tenant
    b = validate_sink("ops", dict(WEBHOOK, tenant="b"))
    assert apply(s, commands.put_sink(T0 + 7 * SEC, None, name="ops", spec=b))["ok"]
    sk = s.sinks["ops"]
    assert (sk["cursor"], sk["dead"], sk["redo"]) == (s.outbox.seq, [], [])
    assert events.pending(s.outbox, sk["cursor"], "ops", 10)[0] == []
    assert restored(s).snapshot() == s.snapshot()


def test_a_run_waiting_too_long_for_a_worker_is_reported_once() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["run.unplaceable"]}], placement={"labels": {"pool": "gpu"}}))
    tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    assert notify_queries.unplaceable_overdue(s, T0 + 60 * SEC) == []  # not waited long enough
    late = notify_queries.unplaceable_overdue(s, T0 + 71 * SEC)
    assert late == [rid]
    assert apply(s, commands.note_unplaceable(T0 + 71 * SEC, runs=late))["told"] == 1
    ev = events.view(s.outbox.events[-1])
    assert ev["kind"] == "run.unplaceable" and ev["run_id"] == rid and ev["waited_ms"] == 61 * SEC
    assert notify_queries.unplaceable_overdue(s, T0 + 200 * SEC) == []
    assert apply(s, commands.note_unplaceable(T0 + 200 * SEC, runs=late))["told"] == 0
    assert kinds(s) == ["run.unplaceable"]


def test_the_leaders_look_for_unplaceable_runs_decided_a_slice_at_a_time_finds_the_same(monkeypatch) -> None:
    """The leader walks every queued run for run.unplaceable: it copies the heaps under the
    replica's lock, picks the candidates outside it, and decides them a slice under the lock at a
    time, stopping once it has enough (node/notify.py): the same runs as one walk under the lock."""
    from raftsched.core import limits, worker_queries
    monkeypatch.setattr(limits, "unplaceable_runs_max", 7)
    s = state_with(job_with([{"sink": "ops", "on": ["run.unplaceable"]}], placement={"labels": {"pool": "gpu"}}))
    assert apply(s, commands.make("put_queue", T0, None, name="default", max_depth=100_000, on_full="reject"))["ok"]
    spec = job_with(placement={"labels": {"pool": "gpu"}})
    for k in range(40):
        assert apply(s, put_cmd(s, f"p{k:02d}", spec, T0))["ok"]
        assert apply(s, commands.make("trigger_job", T0, None, name=f"p{k:02d}"))["ok"]
    now = T0 + limits.unplaceable_report_ms + SEC
    whole = notify_queries.unplaceable_overdue(s, now)
    assert len(whole) == 7 and whole == sorted(whole)
    inputs = notify_queries.overdue_inputs(s, now)
    assert inputs is not None
    cand = notify_queries.overdue_candidates(inputs, now)
    assert len(cand) == 40 and cand == sorted(cand)
    decided: list[int] = []
    real = notify_queries.waiting_for_many
    monkeypatch.setattr(notify_queries, "waiting_for_many", lambda st, ids, *a: decided.append(len(ids)) or real(st, ids, *a))
    monkeypatch.setattr(node_notify, "OVERDUE_SLICE", 3)
    sliced, handler = node_notify.Notifier._unplaceable_overdue(types.SimpleNamespace(raft=FakeRaft(s)), now)  # type: ignore[arg-type]
    # Three slices of three: it stopped there; then the reasons of the ones it keeps.
    assert sliced == whole and handler == [] and decided == [3, 3, 3, len(whole)]
    assert worker_queries.waiting_for_many is real



@pytest.mark.parametrize("cmd", [
    commands.make("sink_progress", T0, None, items=[{"sink": "ops"}]),
    commands.make("sink_progress", T0, None, items=[{"sink": "ops", "cursor": 1, "dead": [{"event": 3}]}]),
    commands.make("sink_progress", T0, None, items="x"),
    commands.make("put_sink", T0, None, name="x", spec={"type": "carrier-pigeon"}),
    # what delivery reads: a retry without its numbers, a webhook without its URL or key, an
    # email sink without its server, a bad address
    commands.make("put_sink", T0, None, name="x", spec={"type": "webhook", "retry": {}}),
    commands.make("put_sink", T0, None, name="x", spec=dict(WEBHOOK, retry=dict(WEBHOOK["retry"], max_attempts=0))),
    commands.make("put_sink", T0, None, name="x", spec={k: v for k, v in WEBHOOK.items() if k != "url"}),
    commands.make("put_sink", T0, None, name="x", spec={k: v for k, v in WEBHOOK.items() if k != "secrets"}),
    commands.make("put_sink", T0, None, name="x", spec={"type": "email", "retry": WEBHOOK["retry"]}),
    commands.make("put_sink", T0, None, name="x", spec={"type": "email", "retry": WEBHOOK["retry"], "smtp": {
        "host": "h", "port": 25, "starttls": False, "from": "a@b\nBcc: c@d", "to": ["o@example.com"]}}),
    commands.make("put_sink", T0, None, name="x", spec=dict(WEBHOOK, link=7)),
    # a dead event that reads of it (its view, a requeue's delivery) would fail on
    commands.make("sink_progress", T0, None, items=[{"sink": "ops", "cursor": 0, "dead": [
        {"event": {"seq": 1}, "error": None, "attempts": 1}]}]),
    commands.make("sink_progress", T0, None, items=[{"sink": "ops", "cursor": 0, "dead": [
        {"event": {"seq": 1, "kind": "run.dead", "at": 1, "job": "j", "tenant": None, "slot": None, "run_id": None,
                   "attempt": None, "reason": None, "detail": [], "to": []}, "error": None, "attempts": 1}]}]),
    commands.make("put_tenant_notify", T0, None, name="t", notify=[{"sink": 1}]),
    commands.make("takeover", T0, None, node="n", seen="yesterday"),
    commands.make("sink_requeue", T0, None, name="ops", events=[1]),
    commands.make("note_unplaceable", T0, None, runs="j@1"),
])
def test_a_malformed_command_is_refused_and_changes_nothing(cmd) -> None:
    s = state_with(job_with([{"sink": "ops"}]))
    refused(s, cmd, "invalid_command")


def test_a_well_formed_email_sink_and_dead_event_are_applied() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["job.triggered"]}]))
    mail = validate_sink("m", {"type": "email", "smtp": {"host": "h", "from": "r@example.com", "to": ["o@example.com"]}})
    assert apply(s, commands.put_sink(T0, None, name="m", spec=mail))["ok"]
    assert apply(s, commands.trigger_job(T0 + SEC, None, name="j"))["ok"]
    ev = s.outbox.events[-1]
    assert events.is_event(ev)
    assert apply(s, commands.sink_progress(T0 + SEC, items=[{"sink": "ops", "cursor": 0, "dead": [
        {"event": ev, "error": "HTTP 500", "attempts": 1}]}]))["ok"]
    assert events.view(s.sinks["ops"]["dead"][0]["event"])["kind"] == "job.triggered"


def test_a_job_whose_stored_notify_is_malformed_is_refused_at_apply() -> None:
    s = new_state()
    spec = dict(job_with(), notify=[{"sink": "ops", "on": "run.dead"}])
    refused(s, put_cmd(s, "j", spec, T0), "invalid_command")


@pytest.mark.parametrize("raw,field", [
    ({"notify": [{"sink": "ops", "on": ["run.exploded"]}]}, "notify[0].on[0]"),
    ({"notify": [{"sink": "ops", "after_consecutive": 0}]}, "notify[0].after_consecutive"),
    ({"notify": [{"sink": "ops"}, {"sink": "ops"}]}, "notify[1].sink"),
    ({"notify": [{"on": ["run.dead"]}]}, "notify[0].sink"),
    ({"pause_on_failure": {"after": 3}}, "pause_on_failure"),
    ({"metrics": "yes"}, "metrics"),
])
def test_bad_notification_fields_name_the_field(raw, field) -> None:
    with pytest.raises(InvalidSpec) as e:
        model.validate_job("j", dict({"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                                      "misfire": {"policy": "skip"}},
                                     **raw))
    assert e.value.field == field


@pytest.mark.parametrize("raw,field", [
    ({"type": "fax"}, "type"),
    ({"type": "webhook", "secrets": {"signing_key": "k"}}, "url"),
    ({"type": "webhook", "url": "ftp://x/", "secrets": {"signing_key": "k"}}, "url"),
    ({"type": "webhook", "url": "http://x/"}, "secrets.signing_key"),
    # a direction override: shown raw by every read, it reorders the URL around it (a walk)
    ({"type": "webhook", "url": "http://127.0.0.1:8/\u202eevents", "secrets": {"signing_key": "k"}}, "url"),
    ({"type": "webhook", "url": "http://x/", "link": "http://ui/\u2066x", "secrets": {"signing_key": "k"}}, "link"),
    ({"type": "slack", "secrets": {"url": "not a url"}}, "secrets.url"),
    ({"type": "email", "smtp": {"host": "h", "from": "a@b", "to": []}}, "smtp.to"),
    ({"type": "pagerduty", "secrets": {"routing_key": "r"}, "subscribe": ["run.dead"]}, "subscribe[0]"),
    ({"type": "pagerduty", "secrets": {"routing_key": "r"}, "tenant": "t", "subscribe": ["worker.lost"]},
     "subscribe"),
    # a cap below the first backoff, refused as a job's retry refuses it
    ({"type": "webhook", "url": "http://x/", "secrets": {"signing_key": "k"}, "retry": {"backoff_s": 10, "backoff_max_s": 5}},
     "retry.backoff_max_s"),
])
def test_bad_sinks_name_the_field(raw, field) -> None:
    with pytest.raises(InvalidSpec) as e:
        validate_sink("s", raw)
    assert e.value.field == field


def test_a_sink_type_given_but_unknown_is_not_said_to_be_missing() -> None:
    for raw, words in (({"type": "sms"}, "is no sink type"), ({}, "is required")):
        with pytest.raises(InvalidSpec) as e:
            validate_sink("s", raw)
        assert e.value.field == "type" and e.value.message.startswith(words), e.value.message


def test_a_trigger_that_finds_its_slots_run_is_no_event() -> None:
    s = state_with(job_with([{"sink": "ops", "on": ["job.triggered"]}]))
    slot = T0 + 10 * SEC
    tick(s, T0 + 10 * SEC)  # the slot's run exists
    res = apply(s, commands.trigger_job(T0 + 11 * SEC, None, name="j", extra={"slot": slot}))
    assert res["ok"] and res["created"] is False, res
    assert kinds(s) == []
    assert apply(s, commands.trigger_job(T0 + 12 * SEC, None, name="j"))["ok"]
    assert kinds(s) == ["job.triggered"]


@pytest.mark.parametrize("backfills", [False, True])
def test_a_backfills_runs_say_nothing_unless_a_route_asks_and_leave_health_alone(backfills) -> None:
    from backfill_helpers import backfill_cmd, backfill_runs, finish_runs, step
    route = {"sink": "ops", "on": ["run.dead"], "backfills": True} if backfills else {"sink": "ops", "on": ["run.dead"]}
    s = state_with(job_with([route]))
    tick(s, T0 + 100 * SEC)
    finish_runs(s, T0 + 100 * SEC)  # the scheduled runs succeed
    healthy = view_health(s.health["j"])
    assert apply(s, backfill_cmd(s, "j", T0 + 10 * SEC, T0 + 50 * SEC, T0 + 101 * SEC, reprocess="all"))["ok"]
    step(s, "b1", T0 + 101 * SEC)
    assert backfill_runs(s, "b1")
    finish_runs(s, T0 + 102 * SEC, ok_fn=lambda rid: False)
    assert any(r["state"] == "dead" for r in backfill_runs(s, "b1"))
    assert kinds(s) == (["run.dead"] if backfills else [])
    assert view_health(s.health["j"]) == healthy


def test_the_per_job_gauges_jobs_are_kept_as_jobs_change_so_a_scrape_walks_only_them() -> None:
    from raftsched.core.notify import metric_jobs
    s = new_state(("a", job_with(metrics=True)), ("b", job_with()), ("c", job_with(metrics=True)))
    assert [n for n, _ in metric_jobs(s)] == ["a", "c"] and s._metric_jobs.keys() == {"a", "c"}
    assert apply(s, put_cmd(s, "a", job_with(), T0 + SEC))["ok"]           # replaced without
    assert apply(s, put_cmd(s, "b", job_with(metrics=True), T0 + SEC))["ok"]  # replaced with
    assert apply(s, commands.delete_job(T0 + 2 * SEC, None, name="c"))["ok"]
    assert [n for n, _ in metric_jobs(s)] == ["b"]
    assert [n for n, _ in metric_jobs(restored(s))] == ["b"]


@pytest.mark.parametrize("raw,field,words", [
    ({"type": "email", "smtp": {"host": "smtp.example.com", "to": ["o@example.com"], "from": "notanemail"}},
     "smtp.from", "is not an email address"),
    ({"type": "email", "smtp": {"host": "smtp.example.com", "to": ["o@example.com"], "from": "a@b\r\nBcc: x@y"}},
     "smtp.from", "is not an email address"),
    ({"type": "email", "smtp": {"host": "smtp.example.com", "to": ["o@example.com"]}}, "smtp.from", "is required"),
    ({"type": "webhook", "url": "https://h.example/x", "secrets": {"signing_key": "k" * 4097}},
     "secrets.signing_key", "1-4096 characters"),
    ({"type": "webhook", "url": "https://h.example/" + "x" * 2100, "secrets": {"signing_key": "k"}},
     "url", "at most 2048 characters"),
    ({"type": "webhook", "url": 123, "secrets": {"signing_key": "k"}}, "url", "(a string)"),
    ({"type": "webhook", "url": "https://h.example/x", "secrets": {"signing_key": "k"}, "link": "http://h/?a=b#c"},
     "link", "without a query (?) or fragment (#)"),
])
def test_a_sinks_bad_field_is_named_with_the_reason_it_has(raw, field, words):
    """An SRE's walk: a sender that was given but is not an address read "is required", a
    signing key one over its bound "must be a non-empty string", a URL over 2048 characters
    or a number "must be an http or https URL"."""
    with pytest.raises(InvalidSpec) as e:
        validate_sink("s", raw)
    assert e.value.field == field and words in e.value.message, (e.value.field, e.value.message)


def test_a_route_names_a_sink_as_a_sink_can_be_named():
    """A route to a 100-character sink name was taken (with "nothing is told through it until one
    is put"), and no such sink can be put: names are 1-64 characters."""
    with pytest.raises(InvalidSpec) as e:
        validate_routes([{"sink": "s" * 65}])
    assert e.value.field == "notify[0].sink" and "1-64" in e.value.message
    assert validate_routes([{"sink": "s" * 64}])[0]["sink"] == "s" * 64


def test_a_sinks_pending_events_age_from_after_its_cursor_and_what_it_gave_up_is_counted() -> None:
    """The gauges of every node (node/notify.py, from core.notify.outbox_counts): what a sink was
    not sent yet, the age of the oldest after its cursor, its dead list, and a count of what it
    gave up. A review: an event requeued an hour after it was emitted counted as an hour-old
    pending event, and the NotificationsStuck rule paged at the requeue."""
    from raftsched.core.notify import outbox_counts
    s = state_with(job_with([{"sink": "ops", "on": ["run.dead", "job.recovered"]}]))
    run_once(s, T0 + 10 * SEC, False)  # ev-1, run.dead
    counts = outbox_counts(s)
    assert counts["sinks"]["ops"] == [1, T0 + 10 * SEC, 0] and counts["given_up"] == {}
    ev = s.outbox.events[0]
    assert apply(s, commands.sink_progress(T0 + 20 * SEC, items=[
        {"sink": "ops", "cursor": ev["seq"], "dead": [{"event": ev, "error": "HTTP 400", "attempts": 2}]}]))["ok"]
    counts = outbox_counts(s)
    assert counts["sinks"]["ops"] == [0, None, 1] and counts["given_up"] == {"ops": 1}
    assert apply(s, commands.sink_requeue(T0 + 3600 * SEC, None, name="ops", events=None))["requeued"] == 1
    # pending again, waiting since its requeue, not since 3600 s before (a re-walk: with no age at
    # all, requeued events a sink never took could not page)
    assert outbox_counts(s)["sinks"]["ops"] == [1, T0 + 3600 * SEC, 0]
    run_once(s, T0 + 3610 * SEC, True)  # job.recovered: after the cursor, its own time is later
    assert outbox_counts(s)["sinks"]["ops"] == [2, T0 + 3600 * SEC, 0]
    assert restored(s).snapshot() == s.snapshot()
