"""The waiting view of a pipeline child's run not made yet (``GET /v1/runs/C@S``,
pipelines.waiting_run): given for an instant that is, or can be, one of the child's slots (a
join, a slot of its parents' schedules, a gated child's own), never invented for any other
instant, and never raising on odd input."""
from __future__ import annotations

from raftsched.core import commands, limits, pipelines, schedule

from core_helpers import ms
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, tick

EVERY = 30 * SEC
S1 = T0 + EVERY  # the first slot of an every_s 30 job put at T0


def _pipeline():
    return chain_state(("pa", job_raw(every_s=30)), ("pd", job_raw(after=["pa"])))


def test_an_instant_that_is_no_slot_of_the_parents_schedule_has_no_waiting_view():
    """pd@<a past instant between pa's slots> and pd@<a far instant off pa's grid> answered
    "waiting for pa@... (its slot has not fired)": runs that never come."""
    s = _pipeline()
    tick(s, S1 + 5 * EVERY)
    for g in lease(s, S1 + 5 * EVERY):
        finish(s, g, S1 + 5 * EVERY + 1, True)
    for slot in (S1 + 1234, S1 + 3 * EVERY - 1, T0 + 10 ** 7 * EVERY + 7):
        assert pipelines.waiting_run(s, f"pd@{slot}") is None, slot
        why = pipelines.waiting_run_or_why(s, f"pd@{slot}")
        assert isinstance(why, str) and "is not a slot of pd or of its parents' schedules" in why, why


def test_a_slot_of_the_parent_not_fired_yet_or_running_is_shown_waiting():
    s = _pipeline()
    tick(s, S1)
    (g,) = lease(s, S1)
    view = pipelines.waiting_run(s, f"pd@{S1}")
    assert view is not None and view["waiting_on"][0]["state"] == "running", view
    future = S1 + 10 ** 7 * EVERY  # a genuine slot of pa, far ahead
    view = pipelines.waiting_run(s, f"pd@{future}")
    assert view is not None and view["state"] == "waiting", view
    assert view["waiting_for"].endswith("(its slot has not fired)"), view
    assert pipelines.waiting_run(s, f"pd@{future + 1}") is None  # its neighbour is none


def test_a_child_of_a_triggered_parent_takes_the_slots_of_its_scheduled_ancestor():
    s = chain_state(("pa", job_raw(every_s=30)), ("pb", job_raw(after=["pa"])), ("pd", job_raw(after=["pb"])))
    assert pipelines.waiting_run(s, f"pd@{S1 + EVERY}") is not None
    assert pipelines.waiting_run(s, f"pd@{S1 + EVERY + 1}") is None


def test_a_gated_child_waits_on_its_own_slots_only():
    """g (every 60 s, after pa every 30 s): pa's slot at 30 s is no slot of g."""
    s = chain_state(("pa", job_raw(every_s=30)), ("g", job_raw(every_s=60, after=["pa"])))
    assert pipelines.waiting_run(s, f"g@{T0 + 60 * SEC}") is not None
    assert pipelines.waiting_run(s, f"g@{S1}") is None
    why = pipelines.waiting_run_or_why(s, f"g@{S1}")
    assert isinstance(why, str) and "is not a slot of g's schedule" in why, why


def test_a_gated_childs_parent_reporting_an_instant_that_is_no_slot_of_the_child_leaves_no_wait():
    """A pipelines walk: pa every 30 s, g every 60 s after it. pa's run of the 30 s instant reported
    to g made a join there, shown "waiting for its own slot" (GET /v1/runs/g@S, and first in
    explain's list, hiding the real waits) until max_wait_s, a day by default, then dropped
    unrecorded; the view of the same instant before the report is a 404. The report is kept
    only for g's own slots now."""
    s = chain_state(("pa", job_raw(every_s=30)), ("g", job_raw(every_s=60, after=["pa"])))
    tick(s, S1)
    (g,) = lease(s, S1)
    finish(s, g, S1 + 1, True)
    assert S1 not in s.pipes.joins.get("g", {})
    assert pipelines.waiting_run(s, f"g@{S1}") is None
    tick(s, S1 + EVERY)  # g's own slot and pa's: the report is kept, the slot runs
    for gr in lease(s, S1 + EVERY):
        finish(s, gr, S1 + EVERY + 1, True)
    assert f"g@{S1 + EVERY}" in s.runs, sorted(s.runs)
    # A slot on g's grid from before g existed (a cascading backfill of pa reports it): not g's.
    from pipeline_helpers import put
    put(s, "g2", job_raw(after=["pa"], schedule={"every_s": 60, "start_at": schedule.iso(T0)}), now=S1 + 2 * EVERY + 5)
    assert s.jobs["g2"]["created"] > S1 + EVERY
    old = [r for r in s.runs.values() if r["job"] == "pa" and r["slot"] == S1 + EVERY][0]
    from raftsched.core import pipelines as pl
    work: list = []
    pl._offer(s, s.jobs["g2"], "pa", S1 + EVERY, [old["state"], old["id"], old["fencing_token"], None],
              S1 + 2 * EVERY + 6, work)
    assert S1 + EVERY not in s.pipes.joins.get("g2", {})


def test_a_cron_parents_slots_follow_its_time_zone_and_dst():
    """pa at 02:30 Berlin time: on 2027-03-28 02:30 does not exist, and the slot is right after
    the gap (03:00 CEST, 01:00Z); the instant 02:30 CET would have been is none."""
    s = chain_state(("pa", job_raw(schedule={"cron": "30 2 * * *", "timezone": "Europe/Berlin"})),
                    ("pd", job_raw(after=["pa"])))
    assert pipelines.waiting_run(s, f"pd@{ms('2027-03-27T01:30:00Z')}") is not None  # 02:30 CET
    assert pipelines.waiting_run(s, f"pd@{ms('2027-03-28T01:00:00Z')}") is not None  # after the gap
    assert pipelines.waiting_run(s, f"pd@{ms('2027-03-28T01:30:00Z')}") is None
    assert pipelines.waiting_run(s, f"pd@{ms('2027-03-29T01:30:00Z')}") is None  # 03:30 CEST


def test_odd_ids_answer_none_and_never_raise():
    s = chain_state(("pa", job_raw(schedule={"cron": "0 * * * *", "timezone": "Pacific/Kiritimati"})),
                    ("pd", job_raw(after=["pa"])))
    top = limits.time_ms_max + limits.every_s_max * 1000
    for rid in ("pd@9999999999999999999", f"pd@{top}", f"pd@{top + 1}", "pd@253402300799999",
                "pd@-5", "pd@", "nope@" + str(S1), "pa@" + str(S1)):
        assert pipelines.waiting_run(s, rid) is None, rid


def test_a_child_of_a_deleted_parent_waits_only_on_what_it_has():
    """pd after pa and pb; pa force-deleted: pb's slots are still pd's, and an instant on no
    remaining parent's grid has no view (nor, with every parent gone, any instant)."""
    s = chain_state(("pa", job_raw(every_s=30)), ("pb", job_raw(every_s=20)),
                    ("pd", job_raw(after=["pa", "pb"])))
    assert apply(s, commands.delete_job(T0 + 1, None, name="pa", force=True))["ok"]
    assert pipelines.waiting_run(s, f"pd@{T0 + 60 * SEC}") is not None  # pb's slot (and was pa's)
    assert pipelines.waiting_run(s, f"pd@{T0 + 90 * SEC}") is None  # pa's only
    assert apply(s, commands.delete_job(T0 + 2, None, name="pb", force=True))["ok"]
    assert pipelines.waiting_run(s, f"pd@{T0 + 60 * SEC}") is None


def test_a_slots_pipeline_lists_a_child_waiting_only_for_one_of_its_slots():
    """GET /v1/jobs/pa/runs?slot=S (pipelines.slot_runs) listed pd waiting for any S too."""
    s = chain_state(("pa", job_raw(every_s=30)), ("pb", job_raw(after=["pa"])), ("pd", job_raw(after=["pb"])),
                    ("g", job_raw(every_s=60, after=["pa"])))
    assert {r["job"] for r in pipelines.slot_runs(s, "pa", S1 + 1234)} == set()
    assert {r["job"] for r in pipelines.slot_runs(s, "pa", S1)} == {"pb", "pd"}
    assert {r["job"] for r in pipelines.slot_runs(s, "pa", S1 + EVERY)} == {"pb", "pd", "g"}


def test_a_child_of_a_parent_run_by_hand_with_propagate_is_shown_waiting_and_listed():
    """A review: a manual run of the parent with propagate (a@T!manual-1) reports to its children
    at T, but the child's view of T answered 404 ("not a slot of b or of its parents'
    schedules") and the slot's pipeline listed nothing. Both show it now."""
    from raftsched.core import commands, pipelines
    from pipeline_helpers import T0, apply, chain_state, finish, job_raw, lease
    s = chain_state(("a", job_raw(every_s=3600)), ("b", job_raw(after=["a"])))
    r = apply(s, commands.trigger_job(T0 + 3, None, name="a", extra={"propagate": True}))
    assert r["ok"] and "!manual-" in r["run"], r
    got = pipelines.waiting_run_or_why(s, f"b@{T0 + 3}")
    assert isinstance(got, dict) and got["state"] == "waiting", got
    assert [(x["id"], x["state"]) for x in pipelines.slot_runs(s, "a", T0 + 3)] == [
        (r["run"], "queued"), (f"b@{T0 + 3}", "waiting")]
    finish(s, lease(s, T0 + 3)[0], T0 + 4, True)
    assert s.runs[f"b@{T0 + 3}"]["state"] == "queued"


def test_a_child_waiting_for_a_manual_run_with_propagate_names_that_run_and_its_state():
    """A user's walk: the parent's run for the slot was a manual run with propagate
    (``P@<ms>!manual-N``), running; the child's view of the slot (``GET /v1/jobs/C/runs?slot=S``)
    said "waiting for P@S (its slot has not fired)", ``waiting_on.state`` ``not_fired``, naming
    ``P@<ms>``, a run that does not exist. It names the manual run, and its state."""
    from raftsched.core import commands, pipelines, schedule
    from pipeline_helpers import T0, apply, chain_state, job_raw, lease
    s = chain_state(("a", job_raw(every_s=3600, retries=2)), ("b", job_raw(after=["a"])))
    t = T0 + 3
    r = apply(s, commands.trigger_job(t, None, name="a", extra={"propagate": True}))
    assert r["ok"] and "!manual-" in r["run"], r
    (g,) = lease(s, t)
    assert g["id"] == r["run"]
    for view in (pipelines.waiting_run(s, f"b@{t}"),
                 next(x for x in pipelines.slot_runs(s, "a", t) if x["job"] == "b")):
        (on,) = view["waiting_on"]
        assert (on["run"], on["state"], on.get("attempt"), on.get("max_attempts")) == (r["run"], "running", 1, 2), on
        suffix = r["run"].partition("!")[2]
        assert view["waiting_for"] == f"waiting for a@{schedule.iso(t)}!{suffix} (running, attempt 1 of 2)", view


def test_a_fan_in_child_made_after_one_parents_run_reads_it_when_the_other_is_requeued():
    """A pipelines walk: q1 and q2 every 30 s; q1@S went dead, q2@S succeeded; then qc was made
    (after q1 and q2) and q1@S requeued by hand. q1's success reported to qc, which waited for
    q2's report, sent before qc existed, until max_wait_s: upstream_timeout, both parents having
    succeeded. A join of a slot older than its child reads its other parents' outcomes back."""
    from pipeline_helpers import put
    s = chain_state(("q1", job_raw(every_s=30)), ("q2", job_raw(every_s=30)))
    tick(s, S1)
    for g in lease(s, S1):
        finish(s, g, S1 + 1, g["job"] == "q2")
    assert s.runs[f"q1@{S1}"]["state"] == "dead" and s.runs[f"q2@{S1}"]["state"] == "succeeded"
    put(s, "qc", job_raw(after=["q1", "q2"], max_wait_s=120), now=S1 + 2)
    assert apply(s, commands.dlq_requeue(S1 + 3, None, run=f"q1@{S1}"))["ok"]
    (g,) = [g for g in lease(s, S1 + 4) if g["job"] == "q1"]
    finish(s, g, S1 + 5, True)
    run = s.runs.get(f"qc@{S1}")
    assert run is not None and run["state"] == "queued", run
    assert sorted(u["job"] for u in run["upstream"]) == ["q1", "q2"], run["upstream"]


def test_a_parent_with_no_run_of_the_slot_says_why():
    """A pipelines walk: "(its slot has not fired)" was said of a triggered parent waiting for its
    own parents, of a paused parent, and of an instant the parent's schedule never reaches."""
    s = chain_state(("pa", job_raw(every_s=30)), ("pb", job_raw(after=["pa"])), ("pz", job_raw(every_s=30)),
                    ("c", job_raw(after=["pb", "pz"])))
    assert apply(s, commands.make("pause_job", T0 + 1, None, name="pz"))["ok"]
    states = {w["job"]: w["state"] for w in pipelines.waiting_run(s, f"c@{S1}")["waiting_on"]}
    assert states == {"pb": "waiting_parents", "pz": "paused"}, states
    text = pipelines.waiting_run(s, f"c@{S1}")["waiting_for"]
    assert "(waiting for its own parents)" in text and "(paused)" in text, text


def test_a_parent_whose_schedule_never_reaches_the_instant_says_so():
    """A fan-in child of a parent run by hand with propagate at an instant off the other parent's
    grid waits for it until max_wait_s: the view says it never comes."""
    s = chain_state(("pa", job_raw(every_s=30)), ("pz", job_raw(every_s=30)), ("c", job_raw(after=["pa", "pz"])))
    r = apply(s, commands.trigger_job(T0 + 1234, None, name="pa", extra={"propagate": True}))
    assert r["ok"], r
    (g,) = [g for g in lease(s, T0 + 1235) if g["id"] == r["run"]]
    finish(s, g, T0 + 1236, True)
    view = pipelines.waiting_run(s, f"c@{T0 + 1234}")
    assert view is not None, sorted(s.pipes.joins.get("c", {}))
    assert [w["state"] for w in view["waiting_on"]] == ["never"], view
    assert "it never runs for this instant" in view["waiting_for"], view


def test_a_childs_run_purged_from_the_dead_letter_queue_is_not_shown_waiting():
    """A walk: after its dead run was purged, GET /v1/runs/pd@S answered "waiting for pa@S
    (succeeded)": the slot was decided, its run is gone. A slot of the parent still to fire, or
    a parent's run of it still going, is waiting as before."""
    s = _pipeline()
    tick(s, S1)
    (g,) = lease(s, S1)
    finish(s, g, S1 + 1, True)  # pa@S1 succeeded: pd@S1 queued
    (d,) = [x for x in lease(s, S1 + 2) if x["id"] == f"pd@{S1}"]
    finish(s, d, S1 + 3, False)  # retries 1: dead
    assert s.runs[f"pd@{S1}"]["state"] == "dead"
    assert apply(s, commands.make("dlq_delete", S1 + 4, None, run=f"pd@{S1}"))["ok"]
    assert f"pd@{S1}" not in s.runs
    why = pipelines.waiting_run_or_why(s, f"pd@{S1}")
    assert isinstance(why, str) and why.startswith(f"pd@{schedule.iso(S1)} waits for nothing: its parents ran"), why
    # the parent's next slot, not fired yet: waiting, as before
    view = pipelines.waiting_run(s, f"pd@{S1 + EVERY}")
    assert view is not None and view["waiting_for"].endswith("(its slot has not fired)"), view


def test_a_child_of_a_triggered_parent_waiting_on_the_parents_join_is_still_waiting():
    """pd after pb after pa and px: pa ran the slot, px not yet; pb's join waits, so does pd."""
    s = chain_state(("pa", job_raw(every_s=30)), ("px", job_raw(every_s=30)),
                    ("pb", job_raw(after=["pa", "px"])), ("pd", job_raw(after=["pb"])))
    tick(s, S1)
    got = {g["job"]: g for g in lease(s, S1)}
    finish(s, got["pa"], S1 + 1, True)  # px@S1 still running
    view = pipelines.waiting_run(s, f"pd@{S1}")
    assert view is not None and view["state"] == "waiting", view


def test_a_triggered_jobs_slot_still_to_come_cannot_be_triggered_by_hand():
    """A walk: POST /v1/jobs/transform/trigger {"slot": "2099-..."} made a run at once, granted and
    held by its worker until 2099 (no run starts before its slot): eight of them took every slot
    of the cluster, and a near slot's run took the id its parents' run would have. Refused now, as
    a scheduled job's slot after its cursor is; a slot that has come runs by hand as before."""
    s = _pipeline()
    tick(s, S1)
    for slot in (S1 + 1, S1 + EVERY, T0 + 10 ** 7 * EVERY):
        res = apply(s, commands.make("trigger_job", S1, None, name="pd", slot=slot))
        assert not res["ok"] and res["error"]["code"] == "conflict" and res["error"]["field"] == "slot", res
        assert "has not come" in res["error"]["message"], res
    assert not [r for r in s.runs if r.startswith("pd@")]
    res = apply(s, commands.make("trigger_job", S1, None, name="pd", slot=S1))
    assert res["ok"] and res["created"] and res["run"] == f"pd@{S1}", res


def test_a_slot_inside_a_parents_recorded_range_shows_that_range_in_the_slots_pipeline():
    """A walk: pa (misfire skip) missed three slots in an outage, recorded as one range from its
    first slot; ``GET /v1/jobs/pa/runs?slot=`` of its second slot answered ``pipeline: []`` and
    pc's the same slot listed only pb, as if pa had done nothing for it. The range is its record."""
    skip = {"policy": "skip", "grace_s": 1}
    s = chain_state(("pa", job_raw(every_s=30, misfire=skip)), ("pb", job_raw(every_s=30)),
                    ("pc", job_raw(after=["pa", "pb"])))
    tick(s, S1 + 2 * EVERY + 10 * SEC)  # three slots of each, ten seconds late: pa's skipped, pb's run
    (rng,) = [r for r in s.runs.values() if r["job"] == "pa"]
    assert (rng["slot"], rng.get("slot_to"), rng["state"]) == (S1, S1 + 2 * EVERY, "skipped"), rng
    for slot in (S1, S1 + EVERY, S1 + 2 * EVERY):
        got = {(r["job"], r["id"]) for r in pipelines.slot_runs(s, "pc", slot)}
        assert ("pa", rng["id"]) in got and ("pb", f"pb@{slot}") in got, (slot, got)
    assert not any(r["job"] == "pa" for r in pipelines.slot_runs(s, "pc", S1 + 3 * EVERY))
