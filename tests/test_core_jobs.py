"""raftsched/core/jobs.py, the job registry's handlers: put_job, put_jobs, delete_job, pause_job,
resume_job and trigger_job, driven through apply as a replica applies them (pure: no network, no
clock; every time is an offset from core_helpers.T0).

What each handler promises: a refusal names what it refuses and changes nothing (I3); apply checks
the shape of a spec only, never computes a schedule (I4); a replace keeps what it must (position,
counters, pause) and never moves a cursor back (I2); a delete, a pause and a resume leave the
queue indexes as a replica rebuilding them from the runs would (``counters``); a slot's manual run
is made once. tests/test_state.py and tests/test_state_put_jobs.py hold the older cases of the
same handlers (create, same-schedule replace, create_only, not found, the paused slots' record).
"""
from __future__ import annotations

import copy

import pytest

from raftsched.core import commands, limits
from raftsched.core.records import LAG_LAST, RECORDED, RUNS

from core_helpers import (MIN, SEC, T0, apply, counters, new_state, pop_due, put_cmd, refused, restored,
                          resume_cmd, runs_of, snap_obj, spec_of, tick)

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)


def make(op: str, now: int, **fields) -> dict:
    return commands.make(op, now, None, **fields)


def acquire(s, now: int, n: int = 10) -> list[dict]:
    return apply(s, make("acquire", now, worker="w", queues=None, max=n, ttl=30_000))["runs"]


def fail(s, now: int, grant: dict) -> dict:
    """A failed attempt of a run with max_attempts 1: it dies (the dead-letter queue)."""
    return apply(s, make("complete_many", now, results=[
        {"run": grant["id"], "token": grant["token"], "success": False, "error": "boom"}]))


def put_spec(spec_mutation) -> dict:
    """A put_job of job ``b`` whose spec ``spec_mutation`` changed (in place, on a copy)."""
    cmd = put_cmd(None, "b", EVERY10, T0)
    cmd["spec"] = copy.deepcopy(cmd["spec"])
    spec_mutation(cmd["spec"])
    return cmd


def _set(key, value):
    return lambda spec: spec.__setitem__(key, value)


def _drop(key):
    return lambda spec: spec.pop(key)


# ----------------------------------------------------------------------------- the spec's shape (I4)
#: (a change to a valid spec, the field the refusal must name)
MALFORMED_SPECS = [
    (_set("schedule", "every 10 s"), "spec.schedule"),
    (_set("schedule", {}), "spec.schedule"),
    (_set("schedule", {"every_s": "10"}), "spec.schedule"),
    (_set("schedule", {"at": 1.5}), "spec.schedule"),
    (_set("schedule", {"every_s": 10, "jitter_ms": 500}), "spec.schedule jitter"),        # no jitter_key
    (_set("schedule", {"every_s": 10, "jitter_ms": "5", "jitter_key": "k"}), "spec.schedule jitter"),
    (_drop("executor"), "spec.executor"),
    (_set("executor", "shell"), "spec.executor"),
    (_set("misfire", None), "spec.misfire"),
    (_set("misfire", {"policy": "sometimes", "grace_s": 5, "max_catchup": 1}), "spec.misfire"),
    (_set("misfire", {"policy": "skip", "grace_s": "5", "max_catchup": 1}), "spec.misfire"),
    (_set("misfire", {"policy": "skip", "grace_s": 5}), "spec.misfire"),
    (_set("retry", []), "spec.retry"),
    (_set("queue", 5), "spec.queue"),
    (_drop("tenant"), "spec.tenant"),
    (_set("priority", "5"), "spec.priority"),
    (_set("timeout_s", 1.5), "spec.timeout_s"),
    (_set("history", True), "spec.history"),
    (_set("overlap", "forbid"), "spec.overlap"),
    (_set("overlap", {"policy": "sometimes"}), "spec.overlap"),
    (_set("overlap", {"policy": "allow", "max_concurrent": "2"}), "spec.overlap"),
    (_set("secrets", {"API_KEY": 1}), "spec.secrets"),
    (_set("secrets", "API_KEY=x"), "spec.secrets"),
    (_set("keep_output", "yes"), "spec.keep_output"),
    (_set("labels", {"team": 1}), "spec.labels"),
    (_set("labels", ["team"]), "spec.labels"),
    (_set("labels", {f"k{i}": "v" for i in range(limits.job_labels_max + 1)}), "spec.labels"),
    (_set("placement", {"labels": {"pool": 1}}), "spec.placement"),
    (_set("placement", {"pool": "gpu"}), "spec.placement"),
    (_set("placement", "gpu"), "spec.placement"),
]


@pytest.mark.parametrize("mutation,field", MALFORMED_SPECS)
def test_a_malformed_spec_is_refused_naming_its_field_and_changes_nothing(mutation, field):
    s = new_state(("a", EVERY10))
    res = refused(s, put_spec(mutation), "invalid_command")
    assert res["error"]["message"] == f"put_job: {field} is malformed", res
    assert "b" not in s.jobs


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c.pop("name"), "put_job needs name"),
    (lambda c: c.update(name=""), "put_job needs name"),
    (lambda c: c.update(name=["b"]), "put_job needs name"),
    (lambda c: c.update(next="soon"), "put_job.next must be an integer or nil"),
    (lambda c: c.update(next=True), "put_job.next must be an integer or nil"),
    (lambda c: c.pop("cursor"), "put_job needs cursor and anchor"),
    (lambda c: c.update(anchor=1.5), "put_job needs cursor and anchor"),
])
def test_malformed_command_fields_are_refused_naming_them(mutate, message):
    s = new_state(("a", EVERY10))
    cmd = put_cmd(None, "b", EVERY10, T0)
    mutate(cmd)
    assert refused(s, cmd, "invalid_command")["error"]["message"] == message


def test_apply_checks_the_shape_only_and_computes_no_schedule():
    """I4: a cron expression and a zone are the proposer's to check (its libraries); apply stores
    them as given and takes the next slot from the command, so replicas with other library
    versions cannot disagree."""
    s = new_state()
    spec = copy.deepcopy(spec_of({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, "skip"))
    spec["schedule"] = {"cron": "not a cron at all", "timezone": "Mars/Olympus"}
    cmd = make("put_job", T0, name="odd", spec=spec, next=T0 + 7, cursor=T0, anchor=T0)
    assert apply(s, cmd)["ok"]
    job = s.jobs["odd"]
    assert job["spec"]["schedule"] == {"cron": "not a cron at all", "timezone": "Mars/Olympus"}
    assert (job["cursor"], job["next"]) == (T0, T0 + 7)
    assert [j["name"] for j in pop_due(s, T0 + 7, 10)] == ["odd"]


# ----------------------------------------------------------------------------- put_job
def test_a_new_job_gets_the_next_generation_fresh_counters_and_a_place_in_the_due_index():
    s = new_state(("a", EVERY10))
    res = apply(s, put_cmd(s, "b", EVERY10, T0 + 3 * SEC))
    assert res == {"ok": True, "job": "b", "gen": 2, "created": True}
    job = s.jobs["b"]
    assert (job["gen"], job["created"], job["updated"], job["paused"]) == (2, T0 + 3 * SEC, T0 + 3 * SEC, False)
    assert job["stats"] == [0, 0, None, 0, 0]
    assert "b" not in s.history  # made by its first entry, not here
    assert sorted(j["name"] for j in pop_due(s, job["next"], 10)) == ["a", "b"]


def test_a_replace_keeps_the_jobs_counters_pause_and_creation_time():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    apply(s, make("pause_job", T0 + 11 * SEC, name="a"))
    stats = list(s.jobs["a"]["stats"])
    assert stats[RUNS] == 1
    res = apply(s, put_cmd(s, "a", spec_of({"every_s": 10}, "skip", priority=1), T0 + 12 * SEC))
    assert res == {"ok": True, "job": "a", "gen": 2, "created": False}
    job = s.jobs["a"]
    assert (job["paused"], job["created"], job["updated"], job["stats"]) == (True, T0, T0 + 12 * SEC, stats)
    assert job["spec"]["priority"] == 1


def test_a_job_put_paused_fires_nothing_until_resumed_and_a_replace_paused_holds_its_runs():
    """A migrating user's walk: a job could not be created paused (CronJob's suspend), so a put
    then a pause let a slot fire in between. put_job ``paused`` pauses it in the same command."""
    s = new_state(("a", EVERY10))
    cmd = put_cmd(s, "b", EVERY10, T0)
    cmd["paused"] = True
    res = apply(s, cmd)
    assert res == {"ok": True, "job": "b", "gen": 2, "created": True, "paused": True}
    assert s.jobs["b"]["paused"] and s.pauses["b"][1] == "manual" and s._paused_count == 1
    tick(s, T0 + 30 * SEC)
    assert runs_of(s, "b") == [] and len(runs_of(s, "a")) == 3
    res = apply(s, resume_cmd(s, "b", T0 + 31 * SEC))
    assert res["ok"] and not s.jobs["b"]["paused"]
    assert [r["state"] for r in runs_of(s, "b")] == ["skipped"]  # the slots while paused, recorded
    tick(s, T0 + 40 * SEC)
    assert runs_of(s, "b")[-1]["state"] == "queued"
    assert restored(s).snapshot() == s.snapshot()
    # A replace with paused pauses the job in the same command, and holds its runs fired ahead.
    cmd = put_cmd(s, "a", EVERY10, T0 + 41 * SEC)
    cmd["paused"] = True
    assert apply(s, cmd)["paused"] is True and s.jobs["a"]["paused"] and s._paused_count == 1
    # (paused already: nothing more, and the answer says nothing of it)
    cmd = put_cmd(s, "a", EVERY10, T0 + 42 * SEC)
    cmd["paused"] = True
    assert "paused" not in apply(s, cmd)
    for bad in (False, 1, "yes"):
        cmd = put_cmd(s, "c", EVERY10, T0)
        cmd["paused"] = bad
        assert refused(s, cmd, "invalid_command")["error"]["message"] == "put_job.paused must be true or nil"


def test_a_replace_with_another_schedule_starts_after_the_old_cursor():
    """A replace planned from a view older than the job's cursor (the job fired since) starts
    from that cursor, so that no slot of the new schedule can take the id of a run the old one
    made (I2); its next slot, after that cursor, is kept."""
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    cmd = make("put_job", T0 + 5 * SEC, name="a", spec=spec_of({"every_s": 7}), next=T0 + 35 * SEC,
               cursor=T0 + 5 * SEC, anchor=T0 + 5 * SEC)
    assert apply(s, cmd)["ok"]
    job = s.jobs["a"]
    assert (job["cursor"], job["next"], job["anchor"]) == (T0 + 30 * SEC, T0 + 35 * SEC, T0 + 5 * SEC)


def test_a_replace_whose_next_slot_is_not_after_the_cursor_is_a_stale_replace():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    cmd = make("put_job", T0 + 5 * SEC, name="a", spec=spec_of({"every_s": 7}), next=T0 + 30 * SEC,
               cursor=T0 + 5 * SEC, anchor=T0 + 5 * SEC)
    res = refused(s, cmd, "conflict")
    assert res["error"]["field"] == "name" and "send it again" in res["error"]["message"]


def test_a_replace_that_lowers_the_history_bound_trims_at_once():
    s = new_state(("a", EVERY10))
    for k in range(1, 5):
        tick(s, T0 + 10 * k * SEC)
    grants = acquire(s, T0 + 41 * SEC)
    apply(s, make("complete_many", T0 + 42 * SEC, results=[
        {"run": g["id"], "token": g["token"], "success": True} for g in grants]))
    assert len(s.history["a"]) == 4
    apply(s, put_cmd(s, "a", spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, history=2), T0 + 43 * SEC))
    assert [s.runs[r]["slot"] for r in s.history["a"]] == [T0 + 30 * SEC, T0 + 40 * SEC]
    assert set(s.runs) == set(s.history["a"])


def test_a_new_job_beyond_the_jobs_limit_is_refused_but_a_replace_is_not(monkeypatch):
    s = new_state(("a", EVERY10), ("b", EVERY10))
    monkeypatch.setattr(limits, "jobs_max", 2)
    res = refused(s, put_cmd(s, "c", EVERY10, T0), "limit_exceeded")
    assert res["error"]["field"] == "name"
    assert apply(s, put_cmd(s, "b", spec_of({"every_s": 10}, "skip"), T0))["ok"]


def test_create_only_refuses_an_existing_job_and_changes_nothing():
    s = new_state(("a", EVERY10))
    res = refused(s, put_cmd(s, "a", spec_of({"every_s": 5}), T0, create_only=True), "conflict")
    assert res["error"]["field"] == "name"


# ----------------------------------------------------------------------------- put_jobs
def test_put_jobs_names_the_malformed_items_index_and_field_and_applies_none():
    s = new_state(("a", EVERY10))
    bad = put_spec(_set("queue", 5))
    items = [{k: v for k, v in put_cmd(None, "c", EVERY10, T0).items() if k not in ("v", "op", "now", "rid")},
             {k: v for k, v in bad.items() if k not in ("v", "op", "now", "rid")}]
    res = refused(s, make("put_jobs", T0, jobs=items), "invalid_command")
    assert res["error"]["message"] == "put_jobs.jobs[1]: spec.queue is malformed"
    res = refused(s, make("put_jobs", T0, jobs=[items[0], "c"]), "invalid_command")
    assert res["error"]["message"] == "put_jobs.jobs[1] is not a map"


def _item(state, name, spec, now, **extra) -> dict:
    cmd = put_cmd(state, name, spec, now)
    return {k: v for k, v in cmd.items() if k not in ("v", "op", "now", "rid")} | extra


def test_put_jobs_lists_a_stale_replace_by_index_and_applies_the_others():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    stale = {"name": "a", "spec": spec_of({"every_s": 7}), "next": T0 + 12 * SEC, "cursor": T0 + 5 * SEC,
             "anchor": T0 + 5 * SEC}
    res = apply(s, make("put_jobs", T0 + 31 * SEC, jobs=[_item(s, "b", EVERY10, T0 + 31 * SEC), stale,
                                                         _item(s, "c", EVERY10, T0 + 31 * SEC)]))
    assert res == {"ok": True, "gen": [2, None, 3], "created": [True, False, True], "conflicts": [], "stale": [1]}
    assert s.jobs["a"]["gen"] == 1 and s.jobs["a"]["spec"]["schedule"] == {"every_s": 10}
    # Without a stale item the answer has no "stale" key: the bytes it always had.
    res = apply(s, make("put_jobs", T0 + 32 * SEC, jobs=[_item(s, "d", EVERY10, T0 + 32 * SEC)]))
    assert res == {"ok": True, "gen": [4], "created": [True], "conflicts": []}


def test_put_jobs_counts_only_new_jobs_against_the_limit(monkeypatch):
    s = new_state(("a", EVERY10))
    monkeypatch.setattr(limits, "jobs_max", 2)
    res = refused(s, make("put_jobs", T0, jobs=[_item(s, "b", EVERY10, T0), _item(s, "c", EVERY10, T0)]),
                  "limit_exceeded")
    assert res["error"]["field"] == "jobs"
    res = apply(s, make("put_jobs", T0, jobs=[_item(s, "a", EVERY10, T0), _item(s, "b", EVERY10, T0)]))
    assert res["created"] == [False, True]


# ----------------------------------------------------------------------------- delete_job
def test_delete_takes_every_run_of_the_job_out_of_its_indexes():
    """Queued, running, dead and finished runs go with their job, and the queue depth, the
    running leases and the dead-letter queue say so, as a replica rebuilding them would."""
    one_try = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, retry={"max_attempts": 1})
    s = new_state(("a", one_try), ("other", EVERY10))
    tick(s, T0 + 10 * SEC)
    g1 = acquire(s, T0 + 10 * SEC, 2)
    other = next(g for g in g1 if g["job"] == "other")
    mine = next(g for g in g1 if g["job"] == "a")
    fail(s, T0 + 11 * SEC, mine)                                          # a's first run: dead
    tick(s, T0 + 20 * SEC)
    g2 = [g for g in acquire(s, T0 + 20 * SEC, 10) if g["job"] == "a"]    # a's second: running
    tick(s, T0 + 30 * SEC)                                                # a's third: queued
    assert {r["state"] for r in runs_of(s, "a")} == {"dead", "running", "queued"} and g2
    assert counters(s)["dead"] and counters(s)["running"]
    res = apply(s, make("delete_job", T0 + 31 * SEC, name="a"))
    # (what went with it, for its answer: a walk saw a running run killed and nothing said so)
    assert res == {"ok": True, "job": "a", "deleted": True, "runs_ended": {"queued": 1, "running": 1, "dead": 1}}
    assert "a" not in s.jobs and "a" not in s.history
    assert not [r for r in s.runs.values() if r["job"] == "a"]
    assert counters(s) == counters(restored(s))
    assert counters(s)["dead"] == {} and other["id"] in counters(s)["running_ids"]
    assert all(rid.startswith("other@") for rid in counters(s)["running_ids"])
    assert s.runs[other["id"]]["state"] == "running"


def test_delete_without_a_name_says_so():
    s = new_state(("a", EVERY10))
    assert refused(s, make("delete_job", T0), "invalid_command")["error"]["message"] == "delete_job needs name"
    assert refused(s, make("delete_job", T0, name="b"), "not_found")["error"]["field"] == "name"


# ----------------------------------------------------------------------------- pause_job
def _fired_ahead_then_paused(pause_at: int = T0 + 19_600):
    """Job a: its T0+10s run due and queued, a manual run, its T0+20s run fired ahead at
    T0+19.5s, then paused at ``pause_at``. :returns: (state, the manual run's id, the pause's answer)."""
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)                                     # a@T0+10s: due, queued
    manual = apply(s, make("trigger_job", T0 + 12 * SEC, name="a"))["run"]
    # A fire committed ahead of its slot (limits.fire_ahead_ms): the run exists, queued, not due.
    ahead = [["a", 1, T0 + 10 * SEC, T0 + 20 * SEC, T0 + 30 * SEC, [T0 + 20 * SEC], []]]
    assert apply(s, make("fire", T0 + 19_500, entries=ahead))["fired"] == 1
    return s, manual, apply(s, make("pause_job", pause_at, name="a"))


def test_pause_holds_the_runs_fired_ahead_and_only_those():
    s, manual, res = _fired_ahead_then_paused()
    assert res == {"ok": True, "job": "a", "paused": True, "held": 1}
    held = s.runs[f"a@{T0 + 20 * SEC}"]
    assert (held["state"], held["due"], held["finished_at"]) == ("queued", None, None)
    assert s.runs[f"a@{T0 + 10 * SEC}"]["state"] == "queued" and s.runs[manual]["state"] == "queued"
    # Counted in its queue (it is queued), on every replica alike, but handed to no worker, even
    # once its slot has come, on this replica and on one restored from a snapshot.
    assert counters(s) == counters(restored(s)) and counters(s)["depth"] == {"default": 3}
    assert (s.jobs["a"]["paused"], s.jobs["a"]["updated"]) == (True, T0 + 19_600)
    for replica in (s, restored(s)):
        got = sorted(g["id"] for g in acquire(replica, T0 + 25 * SEC))
        assert got == sorted([f"a@{T0 + 10 * SEC}", manual]), "a held run is never handed out"
    assert apply(s, make("pause_job", T0 + 19_700, name="a")) == {"ok": True, "job": "a", "paused": True}


def test_a_resume_before_the_slot_releases_the_held_run_and_it_runs_at_its_slot():
    """A pause and a resume within the time runs are fired ahead lose no slot (a one-shot job's
    included): the held run is queued again, due at its slot, on every replica."""
    s, manual, _ = _fired_ahead_then_paused()
    res = apply(s, resume_cmd(s, "a", T0 + 19_800))
    assert res == {"ok": True, "job": "a", "paused": False, "released": 1, "skipped": 0}
    rid = f"a@{T0 + 20 * SEC}"
    assert (s.runs[rid]["state"], s.runs[rid]["due"]) == ("queued", T0 + 20 * SEC)
    r = restored(s)
    assert counters(s) == counters(r)
    for replica in (s, r):
        assert rid not in [g["id"] for g in acquire(replica, T0 + 19_900)], "not before its slot"
        assert rid in [g["id"] for g in acquire(replica, T0 + 20 * SEC)]
    assert s.jobs["a"]["cursor"] == T0 + 20 * SEC, "the slot is not fired again (I2)"


def test_a_resume_after_the_slot_records_the_held_run_skipped_paused():
    s, _, _ = _fired_ahead_then_paused()
    res = apply(s, resume_cmd(s, "a", T0 + 25 * SEC))
    assert res == {"ok": True, "job": "a", "paused": False, "released": 0, "skipped": 1}
    run = s.runs[f"a@{T0 + 20 * SEC}"]
    assert (run["state"], run["reason"], run["finished_at"]) == ("skipped", "paused", T0 + 25 * SEC)
    assert counters(s) == counters(restored(s)) and counters(s)["depth"] == {"default": 2}
    assert f"a@{T0 + 20 * SEC}" not in [g["id"] for g in acquire(s, T0 + 26 * SEC)]


def test_a_catch_up_resume_after_the_slot_releases_the_held_run_late():
    s, _, _ = _fired_ahead_then_paused()
    res = apply(s, resume_cmd(s, "a", T0 + 25 * SEC, catch_up=True))
    assert res == {"ok": True, "job": "a", "paused": False, "released": 1, "skipped": 0}
    assert counters(s) == counters(restored(s))
    assert f"a@{T0 + 20 * SEC}" in [g["id"] for g in acquire(s, T0 + 26 * SEC)]


@pytest.mark.parametrize("catch_up", [False, True])
def test_a_job_replaced_by_a_triggered_one_while_paused_keeps_the_resumes_catch_up(catch_up):
    """A triggered job (after, no schedule) has no slot to plan on a resume, but its runs held by
    the pause (fired ahead while it had a schedule) are decided as any job's: skipped / paused once
    their slot came, unless ``catch_up``. (The proposer used to force catch_up for such a job, and
    the held run then ran late.)"""
    from pipeline_helpers import job_raw, put
    s, _, _ = _fired_ahead_then_paused()
    assert put(s, "p", job_raw(every_s=60))["ok"]
    assert put(s, "a", job_raw(after=["p"]), T0 + 21 * SEC)["ok"]
    assert s.jobs["a"]["paused"] and "schedule" not in s.jobs["a"]["spec"]
    cmd = resume_cmd(s, "a", T0 + 25 * SEC, catch_up=catch_up)
    assert "gen" not in cmd, "nothing planned for a triggered job"
    res = apply(s, cmd)
    assert res == {"ok": True, "job": "a", "paused": False, "released": int(catch_up), "skipped": int(not catch_up)}
    run = s.runs[f"a@{T0 + 20 * SEC}"]
    assert (run["state"], run.get("reason")) == (("queued", None) if catch_up else ("skipped", "paused"))
    assert counters(s) == counters(restored(s))
    assert (f"a@{T0 + 20 * SEC}" in [g["id"] for g in acquire(s, T0 + 26 * SEC)]) == catch_up


def test_a_full_drop_oldest_queue_never_drops_a_held_run_on_any_replica():
    """drop_oldest passes over a held run on every replica alike, whether its by-slot index
    holds the held run's entry (this one: built by a drop before the pause) or not (one restored
    from a snapshot after it)."""
    s = new_state(("a", EVERY10), ("b", EVERY10))
    apply(s, make("put_queue", T0, name="default", max_depth=2, on_full="drop_oldest"))
    b1 = apply(s, make("trigger_job", T0 + 9_000, name="b"))["run"]
    b2 = apply(s, make("trigger_job", T0 + 9_100, name="b"))["run"]
    ahead = [["a", 1, T0, T0 + 10 * SEC, T0 + 20 * SEC, [T0 + 10 * SEC], []]]
    apply(s, make("fire", T0 + 9_500, entries=ahead))            # full: b1 dropped, a@10s queued
    assert s.runs[b1]["reason"] == "queue_full"
    apply(s, make("pause_job", T0 + 9_600, name="a"))
    assert [g["id"] for g in acquire(s, T0 + 9_800)] == [b2]
    apply(s, make("trigger_job", T0 + 11 * SEC, name="b"))        # the queue: a's held run, b3
    r = restored(s)
    for replica in (s, r):
        apply(replica, make("trigger_job", T0 + 12 * SEC, name="b"))  # full: b3 goes, not a's older held run
    assert [(x["id"], x["state"]) for x in runs_of(s, "b")] == [(x["id"], x["state"]) for x in runs_of(r, "b")]
    assert [x["state"] for x in runs_of(s, "b")] == ["skipped", "running", "skipped", "queued"]
    assert s.runs[f"a@{T0 + 10 * SEC}"]["state"] == "queued" and counters(s) == counters(r)


def test_a_run_whose_slot_is_the_pause_time_is_not_held():
    s = new_state(("a", EVERY10))
    ahead = [["a", 1, T0, T0 + 10 * SEC, T0 + 20 * SEC, [T0 + 10 * SEC], []]]
    apply(s, make("fire", T0 + 9 * SEC, entries=ahead))
    assert apply(s, make("pause_job", T0 + 10 * SEC, name="a")) == {"ok": True, "job": "a", "paused": True}
    assert s.runs[f"a@{T0 + 10 * SEC}"]["state"] == "queued"


def test_a_pause_with_nothing_to_hold_says_nothing_of_it():
    s = new_state(("a", EVERY10))
    assert apply(s, make("pause_job", T0 + SEC, name="a")) == {"ok": True, "job": "a", "paused": True}


# ----------------------------------------------------------------------------- resume_job
def test_resuming_a_job_that_is_not_paused_changes_nothing():
    s = new_state(("a", EVERY10))
    before = snap_obj(s, drop=("applied", "now_ms"))
    assert apply(s, make("resume_job", T0 + SEC, name="a")) == {"ok": True, "job": "a", "paused": False}
    assert snap_obj(s, drop=("applied", "now_ms")) == before


def test_resume_records_the_paused_slots_and_moves_the_cursor_to_upto():
    s = new_state(("a", EVERY10))
    apply(s, make("pause_job", T0 + SEC, name="a"))
    res = apply(s, resume_cmd(s, "a", T0 + 35 * SEC))
    # the three slots that fell due while it was paused, recorded skipped (paused), say so
    assert res == {"ok": True, "job": "a", "paused": False, "released": 0, "skipped": 0, "recorded": 3}
    job = s.jobs["a"]
    assert (job["paused"], job["cursor"], job["next"]) == (False, T0 + 35 * SEC, T0 + 40 * SEC)
    rec = s.runs[f"a@{T0 + 10 * SEC}"]
    assert (rec["state"], rec["reason"], rec["slot_to"], rec["count"]) == ("skipped", "paused", T0 + 30 * SEC, 3)
    assert job["stats"][RECORDED] == 3
    assert [j["name"] for j in pop_due(s, T0 + 40 * SEC, 10)] == ["a"]


def test_a_resume_whose_upto_is_behind_the_cursor_never_moves_it_back():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 20 * SEC)
    apply(s, make("pause_job", T0 + 21 * SEC, name="a"))
    job = s.jobs["a"]
    res = apply(s, make("resume_job", T0 + 21 * SEC, name="a", gen=job["gen"], after=job["cursor"], upto=T0,
                        next=T0 + 30 * SEC, rec=[]))
    assert res["ok"] and (job["cursor"], job["next"]) == (T0 + 20 * SEC, T0 + 30 * SEC)


def test_catch_up_leaves_the_slots_due_and_needs_no_view():
    """With catch_up the misfire policy decides at the next fire: nothing is recorded, the
    cursor stays, and the proposer's view (gen, after) is not asked for."""
    s = new_state(("a", EVERY10))
    apply(s, make("pause_job", T0 + SEC, name="a"))
    assert apply(s, make("resume_job", T0 + 35 * SEC, name="a", catch_up=True, gen=99, after=0))["ok"]
    job = s.jobs["a"]
    assert (job["paused"], job["cursor"], job["next"]) == (False, T0, T0 + 10 * SEC)
    assert "a" not in s.history
    _, res = tick(s, T0 + 35 * SEC)
    assert res["fired"] == 3  # fire_all, max_catchup 3


@pytest.mark.parametrize("fields,code,message", [
    ({"gen": 2}, "conflict", "the job changed while resuming; retry"),
    ({"after": T0 - 1}, "conflict", "the job changed while resuming; retry"),
    ({"next": "later"}, "invalid_command", "resume_job.next must be an integer or nil"),
    ({"upto": "now"}, "invalid_command", "resume_job.upto must be an integer"),
    ({"rec": [["skipped", "paused", T0, T0 + 10 * SEC, 2]]}, "invalid_command", "record malformed"),   # from the cursor
    ({"rec": [["skipped", "paused", T0 + 10 * SEC, T0 + 40 * SEC, 4]]}, "invalid_command", "record malformed"),  # past upto
    ({"rec": [["ran", "paused", T0 + 10 * SEC, T0 + 10 * SEC, 1]]}, "invalid_command", "record malformed"),
    ({"rec": [["skipped", "x", T0 + 10 * SEC, T0 + 20 * SEC, 2], ["skipped", "y", T0 + 20 * SEC, T0 + 30 * SEC, 2]]},
     "invalid_command", "runs and records overlap"),
])
def test_a_refused_resume_names_why_and_records_nothing(fields, code, message):
    s = new_state(("a", EVERY10))
    apply(s, make("pause_job", T0 + SEC, name="a"))
    cmd = resume_cmd(s, "a", T0 + 35 * SEC)
    cmd.update(fields)
    res = refused(s, cmd, code)
    assert res["error"]["message"] == message
    if code == "conflict":
        assert res["error"]["field"] == "name"
    assert s.jobs["a"]["paused"]


# ----------------------------------------------------------------------------- trigger_job
def test_a_manual_run_gets_its_own_id_and_no_fire_lag():
    s = new_state(("a", EVERY10))
    r1 = apply(s, make("trigger_job", T0 + 5 * SEC, name="a"))
    r2 = apply(s, make("trigger_job", T0 + 5 * SEC, name="a"))
    assert (r1["run"], r2["run"]) == (f"a@{T0 + 5 * SEC}!manual-1", f"a@{T0 + 5 * SEC}!manual-2")
    assert r1["state"] == r2["state"] == "queued" and s.manual_seq == 2
    run = s.runs[r1["run"]]
    assert (run["kind"], run["slot"], run["due"]) == ("manual", T0 + 5 * SEC, T0 + 5 * SEC)
    assert s.jobs["a"]["stats"][RUNS] == 0 and s.jobs["a"]["stats"][LAG_LAST] is None


def test_a_manual_run_into_a_full_rejecting_queue_is_recorded_skipped():
    s = new_state(("a", EVERY10))
    apply(s, make("put_queue", T0, name="default", max_depth=1, on_full="reject"))
    assert apply(s, make("trigger_job", T0 + SEC, name="a"))["state"] == "queued"
    res = apply(s, make("trigger_job", T0 + 2 * SEC, name="a"))
    assert res["state"] == "skipped"
    rec = s.runs[res["run"]]
    assert (rec["reason"], rec["kind"]) == ("queue_full", "manual")
    assert counters(s)["depth"] == {"default": 1}


def test_a_slots_manual_run_is_made_once():
    """I2 for manual runs of a slot: a second trigger of the same slot answers the first run."""
    s = new_state(("a", EVERY10))
    apply(s, make("pause_job", T0 + SEC, name="a"))
    apply(s, resume_cmd(s, "a", T0 + 25 * SEC))          # a@T0+10s and +20s recorded, not run
    first = apply(s, make("trigger_job", T0 + 26 * SEC, name="a", slot=T0 + 10 * SEC))
    again = apply(s, make("trigger_job", T0 + 27 * SEC, name="a", slot=T0 + 10 * SEC))
    assert first["created"] is True and again["created"] is False and again["run"] == first["run"]
    assert len([r for r in runs_of(s, "a") if r["kind"] == "manual"]) == 1
    res = refused(s, make("trigger_job", T0 + 27 * SEC, name="a", slot=T0 + MIN), "conflict")
    assert res["error"]["field"] == "slot"


def test_a_manual_run_with_a_payload_carries_it():
    s = new_state(("a", EVERY10))
    res = apply(s, make("trigger_job", T0 + SEC, name="a", payload={"day": "2026-05-27"}))
    assert s.runs[res["run"]]["payload"] == {"day": "2026-05-27"}
    assert refused(s, make("trigger_job", T0 + SEC, name="a", payload=b"\x00 not JSON"),
                   "invalid_command")["error"]["message"] == "trigger_job.payload must be JSON data"
