"""The jepsen-style checkers on histories the first cut of them judged wrongly: real faults they
called valid (first slots lost after an indeterminate create or of a cron job, a job that never
fired, an acknowledged backfill gone) and correct runs they called invalid (entries the job's
history bound trimmed). Built on test_jepsen_checkers' known-good run."""
from __future__ import annotations

import random

from test_jepsen_checkers import low_thresholds  # noqa: F401  (its autouse fixture; puts jepsen-style on sys.path)
from test_jepsen_checkers import SPEC_A, T0, _ops, each_read, good, iso, stored, verdict

import checker  # noqa: E402  (jepsen-style, on sys.path)
import generator  # noqa: E402
from raftsched.core import fire, limits, model, policy, schedule


def _drop_scheduled(d, job, keep):
    """Remove job's scheduled runs whose slot ``keep(slot)`` refuses, from every read and the sink."""
    gone = set()
    for r in each_read(d):
        runs = []
        for x in r["runs"]:
            if x["job"] == job and x.get("kind") == "scheduled" and not keep(x["slot_ms"]):
                gone.add(x["id"])
            else:
                runs.append(x)
        r["runs"] = runs
    d["sink"] = [w for w in d["sink"] if w["resource"] not in gone]


def _set_spec(d, job, spec):
    for o in d["history"]:
        if o.get("job") == job and "spec" in o:
            o["spec"] = spec
    for r in each_read(d):
        for j in r["jobs"]:
            if j["name"] == job:
                j["spec"] = stored(spec)


def _backfill_runs_at_their_time(d):
    """good()'s backfill runs finish when the backfill ran them (T0 + 12 s), not at their slots."""
    for r in each_read(d):
        for x in r["runs"]:
            if x.get("kind") == "backfill":
                x.update(started_at=T0 + 12_200, finished_at=T0 + 12_400)


def _make_info(d, job):
    for o in d["history"]:
        if o.get("job") == job and o["f"] == "create" and o["type"] == "ok":
            o.update(type="info", status=504)
            o.pop("value", None)


# ------------------------------------------------------------------------------- the first slot

def test_first_slots_lost_after_an_indeterminate_create_are_reported():
    # Job a's create answered 504 (info) but applied: the read shows it, created at T0+60 (first
    # slot T0+2 s). Its first five slots were never fired.
    d = good()
    _make_info(d, "a")
    _drop_scheduled(d, "a", lambda s: s >= T0 + 7000)
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 2000} lost" in ex[0] and "state's creation time" in ex[0], (v, ex)


def test_an_indeterminate_create_is_judged_between_its_invocation_and_the_states_creation_time():
    d = good()
    _make_info(d, "a")
    assert verdict(d, "no-lost-slot")[0] == "valid"
    # Applied late: the state's creation time is its time when the put applied (T0+1.5 s), the
    # put's own (the proposer's clock, from which the slots count) may be as early as the
    # invocation (T0+50 ms). Its first slot, T0+2 s, is in that window.
    for r in each_read(d):
        r["jobs"][0]["created"] = T0 + 1500
    assert verdict(d, "no-lost-slot")[0] == "valid"
    # Created by T0+60 ms, first due at T0+2 s: a run of T0+1 s is before it could be due.
    d = good()
    _make_info(d, "a")
    early = dict(next(x for x in d["reads"]["final"]["0"]["runs"] if x["id"] == f"a@{T0 + 2000}"),
                 id=f"a@{T0 + 1000}", slot_ms=T0 + 1000, state="failed")
    for r in each_read(d):
        r["runs"].append(dict(early))
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 1000}, before it could be due" in ex[0], (v, ex)


def _cron_a(d, created_ms):
    """Job a on the cron grid of every second, its create acknowledged at ``created_ms``: its
    first slot is the next whole second (good()'s runs start at T0+2 s)."""
    _set_spec(d, "a", dict(SPEC_A, schedule={"cron": "*/1 * * * * *"}))
    for o in d["history"]:
        if o.get("job") == "a" and o["f"] == "create":
            o["t_ms"] = created_ms - 50 if o["type"] == "invoke" else created_ms


def test_first_slots_lost_of_a_cron_job_are_reported():
    d = good()
    _cron_a(d, T0 + 1100)
    assert verdict(d, "no-lost-slot")[0] == "valid"
    _drop_scheduled(d, "a", lambda s: s >= T0 + 7000)
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 2000} lost" in ex[0], (v, ex)


def test_a_cron_jobs_first_slot_is_the_first_point_of_its_grid_after_the_create():
    d = good()
    _cron_a(d, T0 + 100)           # created before T0+1 s: the slot of T0+1 s is its first
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 1000} lost" in ex[0], (v, ex)


def test_the_first_slot_bound_is_the_products_for_every_schedule_the_generator_draws():
    # checker._first_slot_after is arithmetic; the product's first slot is policy.initial_position
    # then schedule.next_slot_after. They agree for every schedule the workload can make, created
    # at any millisecond.
    rng = random.Random(7)
    drawn = {}
    for _ in range(400):
        spec = generator.job_spec(rng, 0.5, 1)
        drawn[repr(spec["schedule"])] = spec
    assert len(drawn) == 6, sorted(drawn)     # every_s 1, 2, 3 and */1, */2, */3 seconds crons
    for spec in drawn.values():
        for t in [T0, T0 + 1, T0 + 999, T0 + 1000, T0 + 1001, T0 + 2999] + [T0 + rng.randrange(10_000) for _ in range(50)]:
            sched = model.validate_job("j", spec, t)["schedule"]
            anchor, cursor = policy.initial_position(sched, t)
            assert checker._first_slot_after(spec["schedule"], t) == schedule.next_slot_after(sched, cursor, anchor), (spec["schedule"], t)


# ------------------------------------------------------------------------------- a job with no entry

def test_a_paused_job_with_no_entry_up_to_its_cursor_is_reported():
    # Job a created (ok) at T0, paused later; its cursor says slots up to T0+15 s were handled,
    # yet not one of them is a run or a record.
    d = good()
    d["history"] += _ops([("pause", "a", "ok", None, 200, {"paused": True})], start=len(d["history"]))
    for r in each_read(d):
        r["jobs"][0].update(paused=True, cursor=T0 + 15_000)
        r["runs"] = [x for x in r["runs"] if x["job"] != "a" or x.get("kind") == "backfill"]
    d["sink"] = [w for w in d["sink"] if w.get("job") != "a" or "#b" in w["resource"]]
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 2000} lost" in ex[0] and "no run nor record" in ex[0], (v, ex)
    # Paused before its first slot came (its cursor still at its anchor): nothing was due.
    for r in each_read(d):
        r["jobs"][0]["cursor"] = T0 + 1000
    assert verdict(d, "no-lost-slot")[0] == "valid"


# ------------------------------------------------------------------------------- backfills

def _second_backfill(d):
    slots = [T0 + 3000, T0 + 5000]
    n = len(d["history"])
    base = {"process": "client-0", "f": "backfill", "job": "b", "node": 0, "key": "kb9", "id": "bf-0-9"}
    d["history"] += [dict(base, type="invoke", index=n, t_ms=T0 + 13_000),
                     dict(base, type="ok", status=201, index=n + 1, t_ms=T0 + 13_050,
                          value={"dry": {"dry_run": True, "slots": [iso(x) for x in slots], "left_out": []},
                                 "res": {"id": "bf-0-9", "state": "running"}})]


def test_an_acknowledged_backfill_missing_from_the_state_is_reported():
    # A backfill of job b answered 201 with its dry run's slots; the final and the post-restart
    # states have neither the backfill nor any run of it.
    d = good()
    _second_backfill(d)
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "bf-0-9 was acknowledged" in ex[0] and "not in the state" in ex[0], (v, ex)


def test_a_backfill_the_state_may_have_forgotten_is_not_reported():
    # With backfills_kept_max finished ones kept, the oldest finished ones are forgotten.
    d = good()
    _second_backfill(d)
    for r in each_read(d):
        r["backfills"] += [{"id": f"old-{k}", "kind": "requeue", "job": None, "state": "done", "reason": None,
                            "progress": {}} for k in range(checker.BACKFILLS_KEPT_MAX - 1)]
    assert verdict(d, "backfills")[0] == "valid"


# ------------------------------------------------------------------------------- the history bound

def _history(d, bound):
    _set_spec(d, "a", dict(SPEC_A, history=bound))
    _backfill_runs_at_their_time(d)


def test_runs_the_jobs_history_bound_trimmed_are_not_lost_slots():
    # Job a keeps at most `history` entries: with 15, of its 20 slots and 3 backfill runs, the
    # oldest finished ones go (core/fire.py trim). The product did nothing wrong.
    d = good()
    _history(d, 15)
    for r in each_read(d):
        mine = sorted((x for x in r["runs"] if x["job"] == "a"), key=lambda x: x["fired_at"])
        trimmed = {x["id"] for x in mine[: len(mine) - 15]}
        r["runs"] = [x for x in r["runs"] if x["id"] not in trimmed]
    v, ex = verdict(d, "no-lost-slot")
    assert v == "valid", (v, ex)
    # Below its bound, a history is not trimmed: the same reads lose slots.
    _set_spec(d, "a", dict(SPEC_A, history=16))
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 2000} lost" in ex[0], (v, ex)


def _first_runs_of_a_died(d: dict) -> None:
    """a's runs of slots up to T0+4 s died, in every read (the dead-letter queue: never trimmed)."""
    for r in each_read(d):
        for x in r["runs"]:
            if x["job"] == "a" and x["kind"] == "scheduled" and x["slot_ms"] <= T0 + 4000:
                x["state"] = "dead"


def test_a_trim_behind_dead_runs_is_not_a_lost_slot():
    # a's first three runs died (the dead-letter queue: never trimmed); the five finished runs
    # behind them went when the history reached its bound.
    d = good()
    _history(d, 15)
    _first_runs_of_a_died(d)
    _drop_scheduled(d, "a", lambda s: not T0 + 5000 <= s <= T0 + 9000)
    assert verdict(d, "no-lost-slot")[0] == "valid"


def test_a_gap_behind_entries_trim_would_have_dropped_first_is_lost():
    # At its bound, but the runs before the gap finished long before it: trim drops the oldest
    # finished entries first, so it cannot have made this gap.
    d = good()
    _history(d, 15)
    _drop_scheduled(d, "a", lambda s: not T0 + 12_000 <= s <= T0 + 16_000)
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 12_000} is neither" in ex[0], (v, ex)
    # Nor behind a record (always trimmable), even with dead runs around it.
    d = good()
    _history(d, 15)
    _first_runs_of_a_died(d)
    for r in each_read(d):
        rec = next(x for x in r["runs"] if x["id"] == f"a@{T0 + 3000}")
        rec.clear()
        rec.update(id=f"a@{T0 + 3000}", job="a", slot_ms=T0 + 3000, slot_to=None, count=None, state="skipped",
                   reason="misfire", kind="recorded", fired_at=T0 + 4500)
    _drop_scheduled(d, "a", lambda s: not T0 + 5000 <= s <= T0 + 9000)
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 5000} is neither" in ex[0], (v, ex)


def test_runs_trimmed_between_the_final_and_the_restart_reads_are_not_lost():
    d = good()
    _history(d, 15)
    for r in d["reads"]["restart"].values():
        mine = sorted((x for x in r["runs"] if x["job"] == "a"), key=lambda x: x["fired_at"])
        trimmed = {x["id"] for x in mine[: len(mine) - 15]}
        r["runs"] = [x for x in r["runs"] if x["id"] not in trimmed]
    v, ex = verdict(d, "durability")
    assert v == "valid", (v, ex)


def test_a_run_gone_across_the_restart_that_trim_would_not_drop_is_lost():
    # At its bound after the restart, but older finished entries are still there: trim would
    # have dropped those first.
    d = good()
    _history(d, 15)
    gone = {f"a@{T0 + 1000 * k}" for k in (10, 11, 12)}
    for r in d["reads"]["restart"].values():
        r["runs"] = [x for x in r["runs"] if x["id"] not in gone]
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "gone after it" in ex[0], (v, ex)


def test_the_checkers_copy_of_the_products_trim_rule_is_the_products():
    assert checker.TRIMMABLE == fire.TRIMMABLE
    assert checker.HISTORY_DEFAULT == limits.history_per_job_default
    assert checker.BACKFILLS_KEPT_MAX == limits.backfills_kept_max


def _keep_newest(d, job, n):
    for r in each_read(d):
        mine = sorted((x for x in r["runs"] if x["job"] == job), key=lambda x: (x["fired_at"], x["slot_ms"]))
        trimmed = {x["id"] for x in mine[: len(mine) - n]}
        r["runs"] = [x for x in r["runs"] if x["id"] not in trimmed]


def test_a_done_backfills_runs_its_jobs_history_trimmed_are_not_missing():
    # Job a keeps 9 entries: its backfill's runs (made at T0+12.1 s) went with the slots fired
    # before them, behind the runs of T0+13 s on.
    d = good()
    _history(d, 9)
    _keep_newest(d, "a", 9)
    assert not any(x.get("backfill") for r in each_read(d) for x in r["runs"])
    v, ex = verdict(d, "backfills")
    assert v == "valid", (v, ex)
    assert verdict(d, "no-lost-slot")[0] == "valid"


def test_a_done_backfills_runs_gone_behind_older_finished_entries_are_missing():
    # At its bound, but the run of T0+2 s, finished long before the backfill, is still there:
    # trim would have dropped it first.
    d = good()
    _history(d, 9)
    _keep_newest(d, "a", 8)
    for r, r0 in zip(each_read(d), each_read(good())):
        r["runs"].append(next(x for x in r0["runs"] if x["id"] == f"a@{T0 + 2000}"))
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "bf-0-1 is done, but slot(s)" in ex[0], (v, ex)


def test_a_pipeline_childs_entries_are_trimmed_in_the_order_they_were_made_not_by_slot():
    # A child makes its runs and records as its parents' runs end: its run of T0+4 s may join
    # its history before its record of T0+2 s, and go first.
    spec = {"after": [{"job": "pa", "on": "success"}], "history": 1}
    rec = {"id": f"pc@{T0 + 2000}", "job": "pc", "slot_ms": T0 + 2000, "kind": "recorded", "state": "skipped",
           "fired_at": T0 + 6000}
    run = {"id": f"pc@{T0 + 4000}", "job": "pc", "slot_ms": T0 + 4000, "kind": "triggered", "state": "succeeded",
           "fired_at": T0 + 5000, "finished_at": T0 + 5200}
    before = {"jobs": [{"name": "pc", "spec": spec}], "runs": [rec, run]}
    after = {"jobs": [{"name": "pc", "spec": spec}], "runs": [rec]}
    assert checker._trimmed_between(before, after, [run], {}) == {run["id"]}
    # A scheduled job makes them in slot order: its record of T0+2 s went first.
    sched = {"schedule": {"every_s": 2}, "history": 1}
    before["jobs"] = after["jobs"] = [{"name": "pc", "spec": sched}]
    assert checker._trimmed_between(before, after, [dict(run, kind="scheduled")], {}) == set()
