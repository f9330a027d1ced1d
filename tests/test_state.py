"""SchedulerState: apply for every op (and its refusals), firing rules, dedupe, bounds, snapshots.

Refusals are values: apply_bytes never raises, and a refused command leaves the state as it was
(compared as snapshot bytes, minus the ``applied`` counter every command increments by design).
"""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from raftsched.core import commands, queries, limits, policy
from raftsched.core import fire as fire_mod, records as records_mod, snapshot as snapshot_mod
from raftsched.core.state import SchedulerState

from core_helpers import (DAY, HOUR, MIN, SEC, T0, apply, new_state, next_due_ms, plan_tick, pop_due,
    put_cmd, queued_count, repush, restored, resume_cmd, runs_of, snap_obj, snapshot_v1_obj, spec_of, tick)

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)


def refused(s: SchedulerState, cmd, code: str) -> dict:
    """Apply a command that must be refused with ``code`` and must change nothing."""
    before = snap_obj(s)
    data = cmd if isinstance(cmd, (bytes, bytearray)) else commands.encode(cmd)
    res = s.apply_bytes(data)
    assert res["ok"] is False, res
    assert res["error"]["code"] == code, res
    assert snap_obj(s) == before, "a refused command changed the state"
    return res


def fire_entry(job, gen, after, upto, runs=(), rec=(), nxt=None):
    return {"job": job, "gen": gen, "after": after, "upto": upto, "runs": list(runs),
            "rec": [list(r) for r in rec], "next": nxt}


# ----------------------------------------------------------------------------- put_job
def test_put_job_creates_job_with_proposer_fields():
    s = new_state()
    res = apply(s, put_cmd(s, "a", EVERY10, T0))
    assert res == {"ok": True, "job": "a", "gen": 1, "created": True}
    job = s.jobs["a"]
    assert (job["cursor"], job["anchor"], job["next"], job["paused"]) == (T0, T0, T0 + 10 * SEC, False)
    assert pop_due(s, T0 + 9999, 10) == []
    assert [j["name"] for j in pop_due(s, T0 + 10 * SEC, 10)] == ["a"]


def test_put_job_replace_with_same_schedule_keeps_cursor_and_next():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    cursor, nxt = s.jobs["a"]["cursor"], s.jobs["a"]["next"]
    new_spec = spec_of({"every_s": 10}, "skip", priority=1)
    # Even a command carrying other cursor/next values (a proposer with a stale view) keeps them.
    cmd = commands.make("put_job", T0 + 12 * SEC, None, name="a", spec=new_spec, next=T0 + 99 * SEC,
                        cursor=T0 + 12 * SEC, anchor=T0 + 3)
    res = apply(s, cmd)
    assert res["ok"] and res["created"] is False and res["gen"] == 2
    job = s.jobs["a"]
    assert (job["cursor"], job["next"], job["anchor"]) == (cursor, nxt, T0)
    assert job["spec"]["misfire"]["policy"] == "skip"
    # The slot already fired is not fired again.
    cmd2, res2 = tick(s, T0 + 20 * SEC)
    assert res2["fired"] == 1 and s.runs.get(f"a@{T0 + 20 * SEC}")
    assert len(runs_of(s, "a", "scheduled")) == 2


def test_put_job_replace_with_new_schedule_never_moves_cursor_back():
    """A new schedule starts after the old one's cursor (no new slot may take the id of a run
    the old one made, I2), and its next slot is computed from there: a replace planned from an
    older view, whose next slot is not after the cursor, is refused and changes nothing."""
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    stale = commands.make("put_job", T0 + 5 * SEC, None, name="a", spec=spec_of({"every_s": 7}),
                          next=T0 + 12 * SEC, cursor=T0 + 5 * SEC, anchor=T0 + 5 * SEC)
    res = refused(s, stale, "conflict")
    assert "send it again" in res["error"]["message"]
    # Planned from the current view, as the proposer does (queries.cursor_floor): accepted.
    assert apply(s, put_cmd(s, "a", spec_of({"every_s": 7}), T0 + 5 * SEC))["ok"]
    job = s.jobs["a"]
    assert job["cursor"] == T0 + 30 * SEC and job["next"] > job["cursor"]


def test_put_job_replace_after_firing_ahead_plans_from_the_fired_cursor():
    """An every-second job fires up to 4 s ahead; a replace with a cron schedule at that moment
    keeps the cursor where the old schedule fired to, and its next slot is the first cron slot
    after it (the proposer's floor), not one before it."""
    s = new_state(("a", spec_of({"every_s": 20}, "skip")))
    tick(s, T0 + 61 * SEC)  # fires 20, 40, 60
    fired_to = s.jobs["a"]["cursor"]
    assert fired_to >= T0 + 60 * SEC
    cron = spec_of({"cron": "* * * * * *"}, "skip")
    cmd = put_cmd(s, "a", cron, T0 + 59 * SEC)  # the proposer's clock is behind the fire
    first = (fired_to // SEC + 1) * SEC
    assert cmd["cursor"] == fired_to and cmd["next"] == first
    assert apply(s, cmd)["ok"]
    assert (s.jobs["a"]["cursor"], s.jobs["a"]["next"]) == (fired_to, first)


def test_put_job_create_only_conflicts_with_existing_job():
    s = new_state(("a", EVERY10))
    res = refused(s, put_cmd(s, "a", EVERY10, T0, create_only=True), "conflict")
    assert res["error"]["field"] == "name"
    assert apply(s, put_cmd(s, "b", EVERY10, T0, create_only=True))["ok"]


@pytest.mark.parametrize("mutate", [
    lambda c: c.pop("name"),
    lambda c: c.update(name=""),
    lambda c: c.update(name=5),
    lambda c: c.update(spec="spec"),
    lambda c: c.update(spec={**c["spec"], "schedule": {"every_s": "10"}}),
    lambda c: c.update(spec={**c["spec"], "schedule": {}}),
    lambda c: c.update(spec={**c["spec"], "misfire": {"policy": "sometimes", "grace_s": 5, "max_catchup": 1}}),
    lambda c: c.update(spec={**c["spec"], "misfire": {"policy": "skip", "grace_s": "5", "max_catchup": 1}}),
    lambda c: c.update(spec={**c["spec"], "queue": 5}),
    lambda c: c.update(spec={**c["spec"], "history": None}),
    lambda c: c.update(spec={k: v for k, v in c["spec"].items() if k != "executor"}),
    lambda c: c.update(next="soon"),
    lambda c: c.update(next=True),
    lambda c: c.pop("cursor"),
    lambda c: c.update(anchor=1.5),
])
def test_put_job_malformed_fields_are_refused_and_change_nothing(mutate):
    s = new_state(("a", EVERY10))
    cmd = put_cmd(None, "b", EVERY10, T0)
    mutate(cmd)
    refused(s, cmd, "invalid_command")
    assert "b" not in s.jobs and s.gen == 1


# ----------------------------------------------------------------------------- delete / not found
@pytest.mark.parametrize("op", ["delete_job", "pause_job", "resume_job", "trigger_job"])
def test_unknown_job_is_not_found(op):
    s = new_state(("a", EVERY10))
    res = refused(s, commands.make(op, T0, None, name="nope"), "not_found")
    assert res["error"]["field"] == "name"


@pytest.mark.parametrize("op", ["delete_job", "pause_job", "resume_job", "trigger_job"])
def test_job_ops_without_name_are_invalid(op):
    s = new_state(("a", EVERY10))
    refused(s, commands.make(op, T0, None), "invalid_command")
    refused(s, commands.make(op, T0, None, name=["a"]), "invalid_command")


def test_delete_job_removes_job_history_runs_and_queue_depth():
    other = spec_of({"every_s": 10}, "fire_all", grace_s=5)
    s = new_state(("a", EVERY10), ("b", other))
    tick(s, T0 + 30 * SEC)
    assert queries.queue_depth(s, "default") == 6
    res = apply(s, commands.make("delete_job", T0 + 31 * SEC, None, name="a"))
    assert res == {"ok": True, "job": "a", "deleted": True, "runs_ended": {"queued": 3, "running": 0, "dead": 0}}
    assert "a" not in s.jobs and "a" not in s.history
    assert not any(r["job"] == "a" for r in s.runs.values())
    assert queries.queue_depth(s, "default") == 3 == queued_count(s, "default")
    assert [j["name"] for j in pop_due(s, T0 + HOUR, 10)] == ["b"]
    # a stale fire for the deleted job changes nothing
    cmd = commands.make("fire", T0 + 40 * SEC, None, entries=[fire_entry("a", 1, T0 + 30 * SEC, T0 + 40 * SEC, [T0 + 40 * SEC], nxt=T0 + 50 * SEC)])
    assert apply(s, cmd)["stale"] == 1 and "a" not in s.history


def test_recreated_job_after_delete_starts_fresh():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    apply(s, commands.make("delete_job", T0 + 11 * SEC, None, name="a"))
    res = apply(s, put_cmd(s, "a", EVERY10, T0))
    assert res["created"] is True and res["gen"] == 2
    assert not s.history.get("a") and s.jobs["a"]["stats"][0] == 0  # runs (records.STATS_FIELDS)


# ----------------------------------------------------------------------------- pause / resume
def test_paused_job_is_not_due_and_its_fires_are_dropped():
    s = new_state(("a", EVERY10))
    fire, _ = plan_tick(s, T0 + 10 * SEC)  # planned before the pause applies
    assert apply(s, commands.make("pause_job", T0 + 10 * SEC, None, name="a"))["paused"] is True
    assert apply(s, fire) == {"ok": True, "fired": 0, "recorded": 0, "stale": 1, "stale_jobs": ["a"]}
    repush(s, ["a"])
    assert pop_due(s, T0 + HOUR, 10) == []
    assert next_due_ms(s) is None


def test_resume_records_paused_slots_and_resumes_from_now():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    apply(s, commands.make("pause_job", T0 + 11 * SEC, None, name="a"))
    now = T0 + 65 * SEC
    res = apply(s, resume_cmd(s, "a", now))
    assert res == {"ok": True, "job": "a", "paused": False, "released": 0, "skipped": 0, "recorded": 5}
    recs = [r for r in runs_of(s, "a") if r["kind"] == "recorded"]
    assert len(recs) == 1
    r = recs[0]
    assert (r["state"], r["reason"], r["slot"], r["slot_to"], r["count"]) == ("skipped", "paused", T0 + 20 * SEC, T0 + 60 * SEC, 5)
    job = s.jobs["a"]
    assert job["cursor"] == now and job["next"] == T0 + 70 * SEC and not job["paused"]
    assert pop_due(s, now, 10) == []
    assert [j["name"] for j in pop_due(s, T0 + 70 * SEC, 10)] == ["a"]


def test_resume_with_catch_up_lets_the_misfire_policy_decide():
    s = new_state(("a", EVERY10))
    apply(s, commands.make("pause_job", T0 + 1, None, name="a"))
    assert apply(s, resume_cmd(s, "a", T0 + 102 * SEC, catch_up=True))["ok"]
    assert s.jobs["a"]["cursor"] == T0
    _, res = tick(s, T0 + 102 * SEC)
    assert res["fired"] == 4 and res["recorded"] == 1  # max_catchup 3 + the on-time slot


def test_resume_of_running_job_is_a_no_op():
    s = new_state(("a", EVERY10))
    before = snap_obj(s)
    assert apply(s, resume_cmd(s, "a", T0))["paused"] is False
    assert snap_obj(s) == before


def test_resume_from_stale_view_conflicts():
    s = new_state(("a", EVERY10))
    apply(s, commands.make("pause_job", T0 + 1, None, name="a"))
    cmd = resume_cmd(s, "a", T0 + 65 * SEC)
    apply(s, put_cmd(s, "a", spec_of({"every_s": 10}, "skip"), T0 + 65 * SEC))  # new gen
    refused(s, cmd, "conflict")
    assert s.jobs["a"]["paused"]


@pytest.mark.parametrize("mutate", [
    lambda c: c.update(upto="later"),
    lambda c: c.update(rec=[["skipped", "paused", T0 + 10 * SEC, T0 + 10 * SEC, 1], "garbage"]),
    lambda c: c.update(rec=[["skipped", "paused", T0 + 10 * SEC, T0 + 10 * SEC, 1], ["skipped", "paused", T0 + 20 * SEC]]),
    lambda c: c.update(rec="nope"),
    lambda c: c.update(rec=[["skipped", "paused", T0 - 10 * SEC, T0 + 10 * SEC, 3]]),  # before the cursor
    lambda c: c.update(rec=[["skipped", "paused", T0 + 10 * SEC, T0 + 999 * SEC, 3]]),  # after upto
    lambda c: c.update(rec=[["queued", "paused", T0 + 10 * SEC, T0 + 10 * SEC, 1]]),
    lambda c: c.update(next="x"),
])
def test_resume_malformed_fields_are_refused_and_change_nothing(mutate):
    s = new_state(("a", EVERY10))
    apply(s, commands.make("pause_job", T0, None, name="a"))
    cmd = resume_cmd(s, "a", T0)  # same now: the state's time does not move either
    cmd["upto"] = T0 + 60 * SEC
    mutate(cmd)
    refused(s, cmd, "invalid_command")
    assert s.jobs["a"]["paused"]


# ----------------------------------------------------------------------------- trigger
def test_trigger_job_makes_manual_runs_with_distinct_ids():
    s = new_state(("a", EVERY10))
    r1 = apply(s, commands.make("trigger_job", T0 + 5, None, name="a"))
    r2 = apply(s, commands.make("trigger_job", T0 + 5, None, name="a"))
    assert r1["ok"] and r2["ok"] and r1["run"] != r2["run"] and r1["state"] == "queued"
    manual = runs_of(s, "a", "manual")
    assert [m["id"] for m in manual] == [r1["run"], r2["run"]]
    assert all(m["slot"] == T0 + 5 for m in manual)
    # a manual run does not move the schedule
    assert s.jobs["a"]["cursor"] == T0 and s.jobs["a"]["next"] == T0 + 10 * SEC
    _, res = tick(s, T0 + 10 * SEC)
    assert res["fired"] == 1


def test_trigger_of_paused_job_still_runs_once():
    s = new_state(("a", EVERY10))
    apply(s, commands.make("pause_job", T0, None, name="a"))
    assert apply(s, commands.make("trigger_job", T0 + 1, None, name="a"))["state"] == "queued"


# ----------------------------------------------------------------------------- fire
def test_fire_creates_runs_and_moves_cursor_and_next():
    s = new_state(("a", EVERY10))
    cmd, res = tick(s, T0 + 10 * SEC + 200)
    assert res == {"ok": True, "fired": 1, "recorded": 0, "stale": 0}
    run = s.runs[f"a@{T0 + 10 * SEC}"]
    assert (run["state"], run["kind"], run["attempt"], run["fired_at"]) == ("queued", "scheduled", 1, T0 + 10 * SEC + 200)
    assert s.jobs["a"]["cursor"] == T0 + 10 * SEC + 200 and s.jobs["a"]["next"] == T0 + 20 * SEC
    assert s.jobs["a"]["stats"][2] == 200  # lag_ms_last


def test_same_fire_twice_is_stale_and_adds_no_run():
    s = new_state(("a", EVERY10))
    cmd, _ = plan_tick(s, T0 + 102 * SEC)
    first = apply(s, cmd)
    assert first["fired"] == 4 and first["recorded"] == 1
    before = len(s.runs)
    again = apply(s, cmd)
    assert again == {"ok": True, "fired": 0, "recorded": 0, "stale": 1, "stale_jobs": ["a"]}
    assert len(s.runs) == before


def test_fire_planned_from_an_old_cursor_is_dropped_whole():
    s = new_state(("a", EVERY10))
    old_view = restored(s)
    tick(s, T0 + 10 * SEC)
    stale_cmd, _ = plan_tick(old_view, T0 + 20 * SEC)  # after=T0: the cursor has moved since
    before = snap_obj(s, drop=("applied", "now_ms"))
    assert apply(s, stale_cmd)["stale"] == 1
    assert snap_obj(s, drop=("applied", "now_ms")) == before


def test_fire_planned_from_an_old_gen_is_dropped_whole():
    s = new_state(("a", EVERY10))
    stale_cmd, _ = plan_tick(restored(s), T0 + 10 * SEC)
    apply(s, put_cmd(s, "a", spec_of({"every_s": 10}, "skip"), T0 + 1))  # same schedule, new gen
    before = snap_obj(s, drop=("applied", "now_ms"))
    assert apply(s, stale_cmd)["stale"] == 1
    assert snap_obj(s, drop=("applied", "now_ms")) == before


def test_fire_batch_applies_fresh_entries_and_drops_stale_ones():
    s = new_state(("a", EVERY10), ("b", EVERY10))
    p_a = policy.plan_fire(EVERY10, T0, T0, T0 + 10 * SEC, s.jobs["a"]["gen"], "a")
    p_b_stale = policy.plan_fire(EVERY10, T0, T0, T0 + 10 * SEC, 99, "b")
    res = apply(s, commands.make("fire", T0 + 10 * SEC, None, entries=[p_a, p_b_stale]))
    assert res == {"ok": True, "fired": 1, "recorded": 0, "stale": 1, "stale_jobs": ["b"]}
    assert s.jobs["b"]["cursor"] == T0


MALFORMED_FIRE_ENTRIES = [
    None, "x", [1], [{}],
    [{"job": "a"}],
    [fire_entry("a", 1, T0, T0 + 20 * SEC, [T0 + 20 * SEC, T0 + 10 * SEC])],           # not ascending
    [fire_entry("a", 1, T0, T0 + 20 * SEC, [T0 + 10 * SEC, T0 + 10 * SEC])],           # duplicate
    [fire_entry("a", 1, T0, T0 + 20 * SEC, [T0])],                                     # not after cursor
    [fire_entry("a", 1, T0, T0 + 20 * SEC, [T0 + 30 * SEC])],                          # past upto
    [fire_entry("a", 1, T0, T0 + 20 * SEC, [True])],
    [fire_entry("a", 1, T0, T0 + 20 * SEC, nxt=T0 + 20 * SEC)],                        # next not after upto
    [fire_entry("a", 1, T0, T0 + 20 * SEC, rec=[["queued", "x", T0 + 10 * SEC, T0 + 10 * SEC, 1]])],
    [fire_entry("a", 1, T0, T0 + 20 * SEC, rec=[["skipped", "x", T0 + 10 * SEC, T0 + 5 * SEC, 1]])],
    [fire_entry("a", 1, T0, T0 + 20 * SEC, rec=[["skipped", "x", T0 + 10 * SEC]])],
    [fire_entry("a", 1, T0, T0 + 20 * SEC, rec=[["skipped", "x", T0 + 10 * SEC, T0 + 10 * SEC, 1]] * 5)],
    [fire_entry("a", 1, T0, T0 + 20 * SEC)] * (limits.fire_entries_max + 1),
    [{**fire_entry("a", 1, T0, T0 + 20 * SEC), "rec": None}],
    # a slot both a run and recorded
    [fire_entry("a", 1, T0, T0 + 30 * SEC, [T0 + 10 * SEC], rec=[["skipped", "x", T0 + 10 * SEC, T0 + 20 * SEC, 2]], nxt=T0 + 40 * SEC)],
    [fire_entry("a", 1, T0, T0 + 30 * SEC, [T0 + 20 * SEC], rec=[["skipped", "x", T0 + 10 * SEC, T0 + 30 * SEC, 3]], nxt=T0 + 40 * SEC)],
    # two records over the same slots
    [fire_entry("a", 1, T0, T0 + 30 * SEC, rec=[["skipped", "x", T0 + 10 * SEC, T0 + 20 * SEC, 2], ["coalesced", "y", T0 + 20 * SEC, T0 + 30 * SEC, 2]], nxt=T0 + 40 * SEC)],
    # upto before after: the cursor would run backwards
    [fire_entry("a", 1, T0, T0 - HOUR)],
]


def _compact(entries):
    """The same entries in the trigger's wire form (policy.compact_entry), where they have it."""
    if not isinstance(entries, list):
        return entries
    return [[e.get("job"), e.get("gen"), e.get("after"), e.get("upto"), e.get("next"), e.get("runs"), e.get("rec")]
            if isinstance(e, dict) else e for e in entries]


@pytest.mark.parametrize("entries", MALFORMED_FIRE_ENTRIES + [_compact(e) for e in MALFORMED_FIRE_ENTRIES] + [
    [["a", 1, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC]]],                     # 6 items
    [["a", 1, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC], [], "extra"]],         # 8 items
    [["a", True, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC], []]],               # bool gen
    [["a", 1, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC], None]],                # rec not a list
    [["a", 1, T0, T0 + 20 * SEC, None, [float(T0 + 10 * SEC)], []]],           # float slot
    [["a", 1, T0, T0 + 20 * SEC, "x", [T0 + 10 * SEC], []]],                   # next not an integer
    [["a", 1, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC], []], "x"],             # a good one, then junk
    # several slots (the fast path's own check of an entry without records)
    [["a", 1, T0, T0 + 30 * SEC, None, [T0 + 20 * SEC, T0 + 10 * SEC], []]],   # descending
    [["a", 1, T0, T0 + 30 * SEC, None, [T0 + 10 * SEC, T0 + 10 * SEC], []]],   # twice the same slot
    [["a", 1, T0, T0 + 30 * SEC, None, [T0 + 10 * SEC, True], []]],            # bool slot
    [["a", 1, T0, T0 + 20 * SEC, None, [T0 + 10 * SEC, T0 + 30 * SEC], []]],   # past upto
    [["a", 1, T0, T0 + 30 * SEC, T0 + 30 * SEC, [T0 + 10 * SEC, T0 + 20 * SEC], []]],  # next not after upto
    [["a", 1, T0, T0 + 30 * SEC, None, [T0 + 10 * SEC] * 500, []]],            # more slots than any plan
])
def test_fire_malformed_entries_are_refused_and_change_nothing(entries):
    s = new_state(("a", EVERY10), now=T0 + 30 * SEC)
    s.jobs["a"]["cursor"] = T0  # as if created at T0 (keep the state's now at T0+30s)
    s.jobs["a"]["next"] = T0 + 10 * SEC
    s.due.rebuild(s.jobs)
    refused(s, commands.make("fire", T0 + 30 * SEC, None, entries=entries), "invalid_command")


def test_fire_wire_form_and_map_form_apply_alike():
    """The trigger proposes lists (policy.compact_entry); a map entry (older logs, plan_fire's own
    form) must give the same state, byte for byte."""
    a, b = new_state(("a", EVERY10), ("b", EVERY10)), new_state(("a", EVERY10), ("b", EVERY10))
    for now in (T0 + 10 * SEC, T0 + 20 * SEC, T0 + 95 * SEC):
        plans = [policy.plan_fire(x.get("spec"), x["anchor"], x["cursor"], now, x["gen"], x["name"])
                 for x in pop_due(a, now, 10)]
        pop_due(b, now, 10)
        apply(a, commands.make("fire", now, None, entries=plans))
        apply(b, commands.make("fire", now, None, entries=[policy.compact_entry(p) for p in plans]))
    assert a.snapshot() == b.snapshot() and len(a.runs) > 4


def test_fire_cursor_never_runs_backwards():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    c = s.jobs["a"]["cursor"]
    apply(s, commands.make("fire", T0 + 30 * SEC, None, entries=[fire_entry("a", 1, c, c - HOUR)]))
    assert s.jobs["a"]["cursor"] >= c
    # and so no slot is fired twice afterwards
    tick(s, T0 + 40 * SEC)
    slots = [r["slot"] for r in runs_of(s, "a", "scheduled")]
    assert len(slots) == len(set(slots)) == 4


# ----------------------------------------------------------------------------- request ids
def test_request_id_dedupe_returns_first_result_and_applies_once():
    s = new_state()
    cmd = put_cmd(s, "a", EVERY10, T0, rid="req-1")
    first = apply(s, cmd)
    again = apply(s, put_cmd(s, "a", EVERY10, T0 + 5, rid="req-1"))
    assert first["ok"] and "duplicate" not in first
    assert again == {**first, "duplicate": True}
    assert s.gen == 1 and s.jobs["a"]["updated"] == T0


def test_request_id_dedupe_of_a_refusal_returns_the_refusal():
    s = new_state(("a", EVERY10))
    cmd = commands.make("trigger_job", T0, "req-2", name="zzz")
    first = apply(s, cmd)
    assert first["ok"] is False
    apply(s, put_cmd(s, "zzz", EVERY10, T0))
    again = apply(s, cmd)
    assert again["duplicate"] is True and again["ok"] is False
    assert runs_of(s, "zzz", "manual") == []


def test_trigger_with_request_id_runs_once():
    s = new_state(("a", EVERY10))
    cmd = commands.make("trigger_job", T0, "req-3", name="a")
    r1, r2 = apply(s, cmd), apply(s, cmd)
    assert r1["run"] == r2["run"] and len(runs_of(s, "a", "manual")) == 1


def test_request_id_table_is_bounded_fifo(monkeypatch):
    monkeypatch.setattr(limits, "request_ids_max", 3)
    s = new_state(("a", EVERY10))
    for i in range(5):
        apply(s, commands.make("trigger_job", T0, f"r{i}", name="a"))
    assert list(s.requests) == ["r2", "r3", "r4"]
    # r0 was forgotten: a retry applies again (the documented cost of a bounded table)
    assert "duplicate" not in apply(s, commands.make("trigger_job", T0, "r0", name="a"))
    assert apply(s, commands.make("trigger_job", T0, "r4", name="a"))["duplicate"] is True


def test_a_clients_keys_are_not_pushed_out_by_requests_without_a_key_nor_by_a_fleets(monkeypatch):
    """A red-team walk: another tenant's ~20 000 lock writes without a key pushed a client's
    Idempotency-Key out of the one log of 10 000 ids in seconds, and its retry triggered a second
    run (a fleet's keyed completions did the same at 9 000 runs a second within two minutes).
    The ids of clients' keys (k-), of worker tokens' keys (w-) and the ids nodes make up are
    remembered apart, each as many; a snapshot keeps the three."""
    monkeypatch.setattr(limits, "request_ids_max", 3)
    s = new_state(("a", EVERY10))
    first = apply(s, commands.make("trigger_job", T0, "k-deploy", name="a"))
    for i in range(10):
        apply(s, commands.make("trigger_job", T0, f"{i:032x}", name="a"))  # no key: the node's ids
        apply(s, commands.make("trigger_job", T0, f"w-{i}", name="a"))  # a worker token's keys
    again = apply(s, commands.make("trigger_job", T0, "k-deploy", name="a"))
    assert again["duplicate"] is True and again["run"] == first["run"]
    assert list(s.requests) == ["k-deploy", "w-7", "w-8", "w-9", f"{7:032x}", f"{8:032x}", f"{9:032x}"]
    r = restored(s)
    assert r.requests == s.requests and r.snapshot() == s.snapshot()
    # An older snapshot's one list is sorted back by prefix, each log bounded.
    from raftsched.core.records import RequestLog
    old = RequestLog([("w-1", ["x", {}]), ("k-1", ["x", {}]), ("a", ["x", {}]), ("k-2", ["x", {}]),
                      ("k-3", ["x", {}]), ("k-4", ["x", {}])])
    assert list(old) == ["k-2", "k-3", "k-4", "w-1", "a"] and len(old) == 5 and "k-1" not in old


# ----------------------------------------------------------------------------- bounds
def test_history_bound_trims_oldest_terminal_entries_but_never_queued_ones():
    spec = spec_of({"every_s": 10}, "skip", grace_s=5, history=3)
    s = new_state(("a", spec))
    now = T0
    for _ in range(6):  # each tick: one recorded (skipped) range + one queued on-time run
        now += 35 * SEC
        tick(s, now)
    hist = runs_of(s, "a")
    queued = [r for r in hist if r["state"] == "queued"]
    terminal = [r for r in hist if r["state"] != "queued"]
    assert len(queued) == 6, "queued runs are never trimmed"
    # Behind a queued oldest entry, finished ones go in steps of fire.TRIM_SCAN_SLACK (docs/api.md).
    assert len(terminal) <= 3 + 15, "terminal entries beyond the bound are trimmed"
    assert all(rid in s.runs for rid in s.history.get("a", []))
    for _ in range(20):
        now += 35 * SEC
        tick(s, now)
    hist = runs_of(s, "a")
    assert len([r for r in hist if r["state"] == "queued"]) == 26
    assert len([r for r in hist if r["state"] != "queued"]) <= 3 + 15


def test_history_bound_is_exact_when_the_oldest_entry_is_finished():
    spec = spec_of({"every_s": 10}, "skip", grace_s=5, history=3)
    s = new_state(("a", spec))
    now = T0
    for _ in range(10):  # only records: every entry is finished
        now += 35 * SEC
        tick(s, now)
        for r in runs_of(s, "a"):
            if r["state"] == "queued":
                s.runs[r["id"]]["state"] = "succeeded"  # as if run (the bound is what is tested)
    assert len(s.history.get("a", [])) <= 3 + 1


def test_history_bound_keeps_newest_terminal_entries():
    spec = spec_of({"every_s": 10}, "skip", grace_s=0, history=3)
    s = new_state(("a", spec))
    apply(s, commands.make("put_queue", T0, None, name="default", max_depth=0, on_full="reject"))
    now, created = T0, []
    for _ in range(5):  # every run is refused (queue full) or recorded: all terminal
        now += 25 * SEC
        before = set(s.runs)
        tick(s, now)
        created += [s.runs[r]["slot"] for r in set(s.runs) - before]
    hist = runs_of(s, "a")
    assert len(hist) == 3 and all(r["state"] in ("skipped", "coalesced") for r in hist)
    assert sorted(r["slot"] for r in hist) == sorted(created)[-3:]


def test_queue_full_reject_records_the_slot_as_skipped():
    s = new_state(("a", EVERY10))
    apply(s, commands.make("put_queue", T0, None, name="default", max_depth=2, on_full="reject"))
    _, res = tick(s, T0 + 30 * SEC + 1)
    assert res["fired"] == 3
    states = [(r["slot"], r["state"], r.get("reason")) for r in runs_of(s, "a", "scheduled")]
    assert states == [(T0 + 10 * SEC, "queued", None), (T0 + 20 * SEC, "queued", None),
                      (T0 + 30 * SEC, "skipped", "queue_full")]
    assert queries.queue_depth(s, "default") == 2 == queued_count(s, "default")
    assert apply(s, commands.make("trigger_job", T0 + 31 * SEC, None, name="a"))["state"] == "skipped"


def test_queue_full_drop_oldest_keeps_the_newest():
    s = new_state(("a", EVERY10))
    apply(s, commands.make("put_queue", T0, None, name="default", max_depth=2, on_full="drop_oldest"))
    tick(s, T0 + 30 * SEC + 1)
    states = {r["slot"]: (r["state"], r.get("reason")) for r in runs_of(s, "a", "scheduled")}
    assert states == {T0 + 10 * SEC: ("skipped", "queue_full"), T0 + 20 * SEC: ("queued", None),
                      T0 + 30 * SEC: ("queued", None)}
    assert queries.queue_depth(s, "default") == 2 == queued_count(s, "default")


def test_put_queue_malformed_is_refused():
    s = new_state(("a", EVERY10))
    for fields in ({"name": "q", "max_depth": 1}, {"name": "q", "max_depth": "1", "on_full": "reject"},
                   {"name": 1, "max_depth": 1, "on_full": "reject"}, {"name": "q", "max_depth": 1, "on_full": "block"}):
        refused(s, commands.make("put_queue", T0, None, **fields), "invalid_command")


def test_state_time_never_runs_backwards():
    s = new_state(("a", EVERY10), now=T0 + HOUR)
    assert s.now_ms == T0 + HOUR
    apply(s, commands.make("noop", T0, None))
    assert s.now_ms == T0 + HOUR
    res = apply(s, commands.make("trigger_job", T0 + 5, None, name="a"))
    assert s.runs[res["run"]]["fired_at"] == T0 + HOUR
    apply(s, commands.make("noop", T0 + 2 * HOUR, None))
    assert s.now_ms == T0 + 2 * HOUR


def test_noop_and_takeover():
    s = new_state()
    assert apply(s, commands.make("noop", T0, None)) == {"ok": True, "now": T0}
    assert apply(s, commands.make("takeover", T0 + 1, None, node="n2"))["ok"]
    assert s.leader == {"node": "n2", "since": T0 + 1}
    refused(s, commands.make("takeover", T0, None, node=7), "invalid_command")


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", msgpack.packb([1, 2]), msgpack.packb({"v": 1, "op": "rm_rf", "now": T0, "rid": None}),
    msgpack.packb({"v": 99, "op": "noop", "now": T0, "rid": None}), msgpack.packb({"v": 1, "op": "noop", "now": -5, "rid": None}),
])
def test_apply_bytes_refuses_garbage_as_a_value(data):
    s = new_state(("a", EVERY10))
    refused(s, data, "invalid_command")


# ----------------------------------------------------------------------------- snapshot
def test_snapshot_restore_is_byte_identical_and_rebuilds_derived_indexes():
    s = new_state(("a", EVERY10), ("b", spec_of({"cron": "*/15 * * * * *"})))
    apply(s, commands.make("pause_job", T0, "p", name="b"))
    tick(s, T0 + 30 * SEC)
    r = restored(s)
    assert r.snapshot() == s.snapshot() and r.state_hash() == s.state_hash()
    assert queries.queue_depth(r, "default") == queries.queue_depth(s, "default") == 3
    assert [j["name"] for j in pop_due(r, T0 + HOUR, 10)] == ["a"]
    # both continue identically
    for st_ in (s, r):
        repush(st_, ["a"])
        tick(st_, T0 + 50 * SEC)
    assert r.snapshot() == s.snapshot()


def test_restore_refuses_other_versions():
    s = new_state()
    obj = msgpack.unpackb(s.snapshot(), raw=False)
    obj["v"] = snapshot_mod.SNAPSHOT_VERSION_EXT + 1
    with pytest.raises(ValueError):
        new_state().restore(msgpack.packb(obj))


def test_restore_reads_version_1_snapshots():
    """Version 1 wrote each job's spec whole; a node upgraded over such a dump restores it."""
    s = new_state(("a", EVERY10), ("b", spec_of({"every_s": 10}, "skip", name="b", payload={"k": [1]})))
    tick(s, T0 + 30 * SEC)
    obj = snapshot_v1_obj(s)
    assert obj["v"] == 1 and isinstance(obj["jobs"]["a"]["stats"], dict)
    r = new_state()
    r.restore(msgpack.packb(obj, use_bin_type=True))
    assert r.snapshot() == s.snapshot()
    assert r.jobs["a"]["spec"]["retry"] is r.jobs["b"]["spec"]["retry"]


# ----------------------------------------------------------------------------- properties
JOBS = ("a", "b", "c")
SPECS = [
    spec_of({"every_s": 1}, "fire_all", grace_s=2, max_catchup=3, history=5),
    spec_of({"every_s": 7}, "fire_once", grace_s=0, history=4),
    spec_of({"every_s": 60}, "skip", grace_s=5, history=1000),
    spec_of({"cron": "*/10 * * * * *"}, "fire_all", grace_s=5, max_catchup=2, history=3, queue="q"),
    spec_of({"cron": "0 * * * *", "timezone": "America/New_York"}, "fire_once", grace_s=30, queue="q"),
    spec_of({"at": T0 + 90 * SEC}, "fire_all"),
    # SPECS[1] managed by an app (labels): a replace between the two keeps the position.
    spec_of({"every_s": 7}, "fire_once", grace_s=0, history=4, labels={"raftsched.app": "reports"}),
    # Notifications (core/notify.py): missed slots and manual changes become events when the sink exists.
    spec_of({"every_s": 7}, "skip", grace_s=0, history=4,
            notify=[{"sink": "ops", "on": ["slot.missed", "job.paused", "job.resumed", "job.triggered"],
                     "repeat_every_s": 10}]),
]
DTS = st.sampled_from([0, 1, 999, 3 * SEC, 10 * SEC, 61 * SEC, 15 * MIN, 2 * HOUR, 30 * HOUR])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**62) | st.text(max_size=6),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                       max_leaves=6)

TOKEN_ROLES = ("admin", "operator", "reader", "worker")
TOKEN_TENANTS = (None, ["billing"], ["b", "a"], [])

ACTIONS = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.integers(0, len(SPECS) - 1), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(JOBS)),
    st.tuples(st.just("pause"), st.sampled_from(JOBS)),
    st.tuples(st.just("resume"), st.sampled_from(JOBS), st.booleans()),
    st.tuples(st.just("trigger"), st.sampled_from(JOBS)),
    st.tuples(st.just("queue"), st.sampled_from(["default", "q"]), st.integers(0, 4), st.sampled_from(["reject", "drop_oldest"])),
    st.tuples(st.just("tick"), DTS),
    st.tuples(st.just("tick"), DTS),
    st.tuples(st.just("stale_tick"), st.integers(0, 10), DTS),
    st.tuples(st.just("refire"), st.integers(0, 10)),
    st.tuples(st.just("skew"), st.integers(1, 5000)),
    st.tuples(st.just("garbage"), st.binary(max_size=24)),
    st.tuples(st.just("raw"), st.sampled_from(list(commands.OPS) + ["bogus"]), st.dictionaries(
        st.sampled_from(["name", "spec", "next", "cursor", "anchor", "entries", "gen", "after", "upto", "rec",
                         "catch_up", "node", "max_depth", "on_full", "create_only", "items", "runs", "notify",
                         "seen"]), JSONISH, max_size=5)),
    st.tuples(st.just("dup_rid"), st.integers(0, 10)),
    st.tuples(st.just("snapshot"),),
    st.tuples(st.just("bad_fire"), st.integers(0, 5), DTS),
    st.tuples(st.just("bad_resume"), st.sampled_from(JOBS), st.integers(0, 4)),
    # API tokens (core/tokens.py): created, revoked, a table that fills and gives up its oldest
    st.tuples(st.just("token"), st.integers(0, 5), st.sampled_from(TOKEN_ROLES), st.sampled_from(TOKEN_TENANTS),
              st.sampled_from([None, T0 + 30 * SEC])),
    st.tuples(st.just("revoke"), st.integers(0, 6)),
    # Notifications: the sink the routes above name comes and goes; a delivery cursor moves.
    st.tuples(st.just("sink"), st.booleans()),
    st.tuples(st.just("sink_progress"), st.integers(0, 50)),
)

#: sequences aimed at refusals: jobs that fall due, pauses, and malformed proposals
REFUSAL_ACTIONS = st.one_of(
    st.tuples(st.just("tick"), DTS),
    st.tuples(st.just("pause"), st.sampled_from(JOBS)),
    st.tuples(st.just("resume"), st.sampled_from(JOBS), st.booleans()),
    st.tuples(st.just("bad_fire"), st.integers(0, 5), DTS),
    st.tuples(st.just("bad_fire"), st.integers(0, 5), st.sampled_from([10 * SEC, 2 * HOUR])),
    st.tuples(st.just("bad_resume"), st.sampled_from(JOBS), st.integers(0, 4)),
    st.tuples(st.just("bad_resume"), st.sampled_from(JOBS), st.integers(0, 4)),
    ACTIONS,
)
PUTS = st.lists(st.tuples(st.just("put"), st.sampled_from(JOBS), st.integers(0, len(SPECS) - 1), st.just(False)),
                min_size=1, max_size=3)
#: a few jobs first, then anything (so that most sequences have jobs to fire, pause, break)
SEQUENCES = st.tuples(PUTS, st.lists(ACTIONS, min_size=1, max_size=35)).map(lambda t: t[0] + t[1])
REFUSAL_SEQUENCES = st.tuples(PUTS, st.lists(REFUSAL_ACTIONS, min_size=1, max_size=30)).map(lambda t: t[0] + t[1])


def _mutate_fire_entry(e: dict, how: int) -> dict:
    """A plausible but malformed fire entry, derived from a real plan (a buggy or hostile proposer)."""
    e = {**e, "runs": list(e["runs"]), "rec": [list(r) for r in e["rec"]]}
    if how == 0:  # the cursor would move back
        e.update(upto=e["after"] - 1000, runs=[], rec=[], next=None)
    elif how == 1 and e["runs"]:  # a slot both run and recorded
        e["rec"] = [["skipped", "x", e["runs"][-1], e["runs"][-1], 1]] + e["rec"]
        e["rec"].sort(key=lambda r: r[2])
    elif how == 2:  # the same slots recorded twice
        e["rec"] = e["rec"] + e["rec"] if e["rec"] else [["skipped", "x", e["upto"], e["upto"], 1]] * 2
    elif how == 3:  # a garbage record after a valid one
        e["rec"] = e["rec"] + [["skipped", "x", e["upto"]]]
    elif how == 4:
        e["runs"] = e["runs"][::-1] + [e["after"]]
    else:
        e["next"] = e["upto"]
    return e


def _mutate_resume(c: dict, how: int) -> dict:
    c = dict(c)
    first = c.get("rec") or [["skipped", "paused", c["upto"], c["upto"], 1]]
    if how == 0:
        c["upto"] = "later"
    elif how == 1:
        c["rec"] = first + ["garbage"]
    elif how == 2:
        c["rec"] = first + first
    elif how == 3:
        c["rec"] = [["skipped", "paused", c["after"] - 5000, c["upto"], 2]]
    else:
        c["rec"] = [["running", "paused", c["upto"], c["upto"], 1]]
    return c


class Driver:
    """Runs actions as the cluster would: proposals are encoded once and applied to every replica."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.leader = replicas[0]
        self.now = T0
        self.views = [self.leader.snapshot()]  # old views of the state, for stale proposals
        self.fires: list[bytes] = []
        self.rids: list[bytes] = []
        self.n = 0

    def propose(self, data: bytes):
        results = [r.apply_bytes(data) for r in self.replicas]
        assert all(res == results[0] for res in results), "replicas answered differently"
        return results[0]

    def cmd(self, op, now=None, rid=True, **fields):
        self.n += 1
        rid_value = f"rid-{self.n}" if rid else None
        data = commands.encode(commands.make(op, self.now if now is None else now, rid_value, **fields))
        if rid:
            self.rids.append(data)
        return self.propose(data)

    def run(self, action, on_snapshot=None):
        kind = action[0]
        L = self.leader
        if kind == "put":
            _, name, i, create_only = action
            self.cmd("put_job", rid=True, **{k: v for k, v in put_cmd(L, name, SPECS[i], self.now, create_only=create_only).items()
                                           if k not in ("v", "op", "now", "rid")})
        elif kind in ("delete", "pause", "trigger"):
            self.cmd({"delete": "delete_job", "pause": "pause_job", "trigger": "trigger_job"}[kind], name=action[1])
        elif kind == "resume":
            _, name, catch_up = action
            if name in L.jobs:
                c = resume_cmd(L, name, self.now, catch_up=catch_up)
                self.cmd("resume_job", **{k: v for k, v in c.items() if k not in ("v", "op", "now", "rid")})
            else:
                self.cmd("resume_job", name=name)
        elif kind == "queue":
            self.cmd("put_queue", name=action[1], max_depth=action[2], on_full=action[3])
        elif kind == "tick":
            self.now += action[1]
            cmd, names = plan_tick(L, self.now)
            if cmd is not None:
                data = commands.encode(cmd)
                self.fires.append(data)
                res = self.propose(data)
                assert res["ok"], res
                assert res["stale"] == 0, "a plan from the current view is never stale"
        elif kind == "stale_tick":
            _, back, dt = action
            view = new_state()
            view.restore(self.views[max(0, len(self.views) - 1 - back)])
            # another leader, whose view lags and whose clock may run ahead
            cmd, _ = plan_tick(view, self.now + dt)
            if cmd is not None:
                res = self.propose(commands.encode(cmd))
                assert res["ok"], res
        elif kind == "refire":
            if self.fires:
                res = self.propose(self.fires[max(0, len(self.fires) - 1 - action[1])])
                assert res["ok"] and res["fired"] == 0 and res["recorded"] == 0
        elif kind == "skew":
            self.cmd("noop", now=max(0, self.now - action[1]), rid=False)
        elif kind == "garbage":
            res = self.propose(action[1])
            assert res["ok"] in (True, False)
        elif kind == "raw":
            _, op, fields = action
            data = msgpack.packb({"v": 1, "op": op, "now": self.now, "rid": None, **fields}, use_bin_type=True)
            self.propose(data)
        elif kind == "dup_rid":
            if self.rids:
                res = self.propose(self.rids[max(0, len(self.rids) - 1 - action[1])])
                assert res.get("duplicate") is True
        elif kind == "snapshot" and on_snapshot is not None:
            on_snapshot()
        elif kind == "bad_fire":
            _, how, dt = action
            view = restored(L)
            at = self.now + dt
            nxt = next_due_ms(view)
            if nxt is not None and nxt > at and nxt - at <= DAY:
                at = nxt  # plan when something is due, so that there is an entry to break
            cmd, _ = plan_tick(view, at)
            dt = at - self.now
            if cmd is not None:
                entries = [_mutate_fire_entry(e, how) for e in cmd["entries"]]
                res = self.propose(commands.encode(commands.make("fire", self.now + dt, None, entries=entries)))
                event(f"bad_fire {how}: {'ok' if res['ok'] else res['error']['code']}")
        elif kind == "token":
            # What the proposer draws (id, salt, digest) is in the command; apply draws nothing.
            _, i, role, tenants, expires = action
            tid = f"{i:016x}"
            self.cmd("token_create", id=tid, role=role, tenants=tenants, expires=expires,
                     hash={"alg": "hmac-sha256", "salt": bytes([i]) * 16, "digest": bytes([i + 1]) * 32})
        elif kind == "revoke":
            self.cmd("token_revoke", id=f"{action[1]:016x}")
        elif kind == "sink":
            if action[1]:
                self.cmd("put_sink", name="ops", spec={"type": "webhook", "url": "http://127.0.0.1:9/",
                                                       "subscribe": ["cluster.leader_changed"],
                                                       "secrets": {"signing_key": "k"},
                                                       "retry": {"max_attempts": 1, "backoff_s": 0, "backoff_max_s": 0}})
            else:
                self.cmd("delete_sink", name="ops")
        elif kind == "sink_progress":
            self.cmd("sink_progress", rid=False, items=[{"sink": "ops", "cursor": action[1]}])
        elif kind == "bad_resume":
            _, name, how = action
            if name in L.jobs and L.jobs[name]["paused"]:
                c = _mutate_resume(resume_cmd(L, name, self.now), how)
                res = self.propose(commands.encode(c))
                event(f"bad_resume {how}: {'ok' if res['ok'] else res['error']['code']}")
        self.views.append(L.snapshot())
        del self.views[:-12]


def _invariants(s: SchedulerState):
    for q in set(r["queue"] for r in s.runs.values() if "queue" in r) | {"default", "q"}:
        assert queries.queue_depth(s, q) == queued_count(s, q), "derived queue depth drifted"
    for name, job in s.jobs.items():
        assert job["cursor"] <= s.now_ms or job["cursor"] == job["anchor"] < s.now_ms + 1000
        hist = s.history.get(name, [])
        queued = sum(1 for rid in hist if s.runs[rid]["state"] == "queued")
        # Finished entries behind a queued oldest one are trimmed in steps (fire.TRIM_SCAN_SLACK);
        # a run dropped by on_full=drop_oldest finishes after it was added, so it may wait longer.
        dropped = sum(1 for rid in hist if s.runs[rid].get("reason") == "queue_full")
        slack = 0 if not hist or s.runs[hist[0]]["state"] != "queued" else fire_mod.TRIM_SCAN_SLACK - 1
        assert len(hist) <= job["spec"]["history"] + queued + slack + dropped
    assert set(s.runs) == {rid for h in s.history.values() for rid in h}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=SEQUENCES, restore_at=st.sets(st.integers(0, 40), max_size=4))
def test_replicas_applying_the_same_commands_end_byte_identical(actions, restore_at):
    a, b = new_state(), new_state()
    d = Driver([a, b])

    def snapshot_restore():
        nonlocal b
        data = b.snapshot()
        fresh = new_state()
        fresh.restore(data)
        assert fresh.snapshot() == data
        b = fresh
        d.replicas[1] = b

    for i, act in enumerate(actions):
        if i in restore_at:
            snapshot_restore()
        d.run(act, on_snapshot=snapshot_restore)
        assert a.snapshot() == b.snapshot()
        _invariants(a)
    _invariants(a)
    _invariants(b)
    r = restored(a)
    assert r.snapshot() == a.snapshot()
    assert queries.queue_depth(r, "default") == queries.queue_depth(a, "default")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=REFUSAL_SEQUENCES)
def test_refused_commands_change_nothing(actions):
    s = new_state()
    d = Driver([s])
    orig = d.propose

    def checked(data):
        before = snap_obj(s, drop=("applied", "now_ms", "requests"))
        res = orig(data)
        if not res["ok"] and not res.get("duplicate"):
            assert snap_obj(s, drop=("applied", "now_ms", "requests")) == before, res
        return res

    d.propose = checked
    for act in actions:
        d.run(act)
    _invariants(s)


@settings(max_examples=60, deadline=None)
@given(actions=SEQUENCES)
def test_restore_of_snapshot_is_byte_identical(actions):
    s = new_state()
    d = Driver([s])
    for act in actions:
        d.run(act)
    data = s.snapshot()
    r = new_state()
    r.restore(data)
    assert r.snapshot() == data
    r2 = new_state()
    r2.restore(r.snapshot())
    assert r2.snapshot() == data


FIRE_ACTIONS = st.one_of(
    st.tuples(st.just("bad_fire"), st.integers(0, 5), DTS),
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.sampled_from([0, 1, 2]), st.just(False)),
    st.tuples(st.just("tick"), DTS),
    st.tuples(st.just("tick"), DTS),
    st.tuples(st.just("stale_tick"), st.integers(0, 10), DTS),
    st.tuples(st.just("refire"), st.integers(0, 10)),
    st.tuples(st.just("pause"), st.sampled_from(JOBS)),
    st.tuples(st.just("resume"), st.sampled_from(JOBS), st.booleans()),
    st.tuples(st.just("trigger"), st.sampled_from(JOBS)),
)
BIG_HISTORY = [dict(sp, history=1000) for sp in SPECS[:3]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(FIRE_ACTIONS, min_size=1, max_size=40))
def test_no_run_id_twice_and_no_slot_both_run_and_recorded(actions):
    s = new_state()
    d = Driver([s])
    seen_ids: dict[str, set] = {}
    run_slots: dict[str, list] = {}
    ranges: dict[str, list] = {}
    for act in actions:
        if act[0] == "put":
            act = ("put", act[1], act[2], False)
            spec = BIG_HISTORY[act[2]]
            # put with a big-history spec so that no entry is trimmed while we watch
            d.cmd("put_job", **{k: v for k, v in put_cmd(s, act[1], spec, d.now).items() if k not in ("v", "op", "now", "rid")})
            d.views.append(s.snapshot())
            continue
        before = set(s.runs)
        d.run(act)
        for rid in set(s.runs) - before:
            e = s.runs[rid]
            j = e["job"]
            assert rid not in seen_ids.setdefault(j, set()), f"run id {rid} appeared twice"
            seen_ids[j].add(rid)
            if e["kind"] == "scheduled":
                run_slots.setdefault(j, []).append(e["slot"])
            elif e["kind"] == "recorded":
                ranges.setdefault(j, []).append((e["slot"], e.get("slot_to", e["slot"])))
        assert set(s.runs) >= before, "an entry vanished (history is large enough not to trim)"
    for j, slots in run_slots.items():
        assert len(slots) == len(set(slots)), f"{j}: a slot became two runs"
        for lo, hi in ranges.get(j, []):
            assert not any(lo <= x <= hi for x in slots), f"{j}: slot both a run and recorded"
        rs = sorted(ranges.get(j, []))
        assert all(p[1] < q[0] for p, q in zip(rs, rs[1:])), f"{j}: records overlap"


def test_replace_that_lowers_the_history_bound_trims_at_once():
    from raftsched.core import model as _model
    s = new_state()
    raw = {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "skip"}, "history": 5}
    spec = _model.validate_job("h", raw)
    assert apply(s, put_cmd(s, "h", spec, T0))["ok"]
    for k in range(1, 6):
        assert apply(s, commands.make("trigger_job", T0 + k, None, name="h"))["ok"]
    for rid in list(s.history.get("h", [])):
        s.runs[rid]["state"] = "succeeded"  # finished runs, so the bound may drop them
    smaller = _model.validate_job("h", dict(raw, history=2))
    assert apply(s, put_cmd(s, "h", smaller, T0 + 10))["ok"]
    assert len(s.history.get("h", [])) == 2
    assert all(rid in s.runs for rid in s.history.get("h", []))


# ----------------------------------------------------------------------------- shared spec parts
def test_jobs_share_identical_spec_parts_without_changing_the_snapshot():
    a = spec_of({"every_s": 10}, "skip", name="a")
    b = spec_of({"every_s": 10}, "skip", name="b", payload={"x": [1, {"y": 2}]})
    c = spec_of({"every_s": 10}, "skip", name="c", payload={"x": [1, {"y": 2}]})
    s = new_state(("a", a), ("b", b), ("c", c))
    ja, jb, jc = (s.jobs[n]["spec"] for n in "abc")
    assert ja["misfire"] is jb["misfire"] is jc["misfire"] and ja["retry"] is jc["retry"]
    assert jb["payload"] is jc["payload"], "nested parts are shared too"
    r = restored(s)
    assert r.snapshot() == s.snapshot()
    assert r.jobs["a"]["spec"]["retry"] is r.jobs["c"]["spec"]["retry"], "a restored replica shares them"


def test_shared_parts_never_conflate_values_that_encode_differently():
    s = new_state()
    one = spec_of({"every_s": 10}, "skip", name="a", payload={"v": 1})
    true = spec_of({"every_s": 10}, "skip", name="b", payload={"v": True})
    apply(s, put_cmd(s, "a", one, T0))
    apply(s, put_cmd(s, "b", true, T0))
    assert type(s.jobs["a"]["spec"]["payload"]["v"]) is int and s.jobs["b"]["spec"]["payload"]["v"] is True
    twin = new_state()
    apply(twin, put_cmd(twin, "b", true, T0))
    apply(twin, put_cmd(twin, "a", one, T0))
    snap = msgpack.unpackb(s.snapshot())
    cols = snap["jobs"]
    payload = {name: snap["parts"][snap["specs"][ti]["payload"]] for name, ti in zip(cols["name"], cols["spec"])}
    assert payload["b"] == {"v": True} and payload["a"] == {"v": 1}


@pytest.mark.skipif(__import__("platform").python_implementation() != "CPython",
                    reason="key-sharing dictionaries are CPython's")
def test_job_spec_and_run_records_share_their_key_tables(monkeypatch):
    """The records are plain dicts, equal to maps of their own, but hold a row of values against
    a key table shared by their kind (records.shared_keys): measured as the memory 2 000 of them
    take against the same records as maps of their own, which cost at least a key table more
    (Python 3.11: job 177 against 280 bytes, spec 560 against 656 with its executor map, run 336
    against 472). Specs are measured on a key table of their own: the process's one holds every
    optional field a spec made earlier in this process had (placement, notify, ...), and its rows
    are that much longer (8 bytes a key), which says nothing of the sharing."""
    import gc
    import tracemalloc

    monkeypatch.setattr(records_mod, "SpecKeys", type("SpecKeys", (), {}))
    s = new_state()
    raw = spec_of({"every_s": 60}, "skip")
    # Everything a record holds is made before the measure: it counts the records' own maps.
    names = [f"j{i}" for i in range(2000)]
    share = lambda spec: records_mod.share_spec(spec, s._parts, s._ints)  # noqa: E731
    specs = [share(dict(raw, executor={"type": "shell", "argv": [str(i)]})) for i in range(2000)]
    kinds = {  # kind: (make a record, the same as a map of its own), over its inputs
        "job": (lambda n: records_mod.job_record(n, None, 1, 1, 2, 3, 4, 5, False, None), dict, names),
        # share_spec makes each spec's executor map anew: so does its twin
        "spec": (share, lambda r: dict(r, executor=dict(r["executor"])), specs),
        "run": (lambda n: records_mod.RUN_TEMPLATE.copy(), dict, names),
    }

    def per_record(make, inputs):
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = list(map(make, inputs))
            return (tracemalloc.get_traced_memory()[0] - before) / len(inputs), kept
        finally:
            tracemalloc.stop()

    for kind, (make, own_map, inputs) in kinds.items():
        shared, records = per_record(make, inputs)
        own, copies = per_record(own_map, records)
        assert copies == records and [list(c) for c in copies] == [list(r) for r in records]
        assert type(records[0]) is dict
        assert shared <= own - 64, (kind, shared, own)


def test_a_proposer_answers_a_replayed_request_id_as_apply_would():
    """queries.replayed: what apply answers a command whose request id it has seen, which the
    proposer answers itself (node/service.py) without adding an entry to the log."""
    s = new_state(("a", spec_of({"every_s": 10}, "skip")))
    first = s.apply(commands.make("pause_job", T0, "k1", name="a"))
    same = commands.make("pause_job", T0 + 1, "k1", name="a")
    other = commands.make("delete_job", T0 + 1, "k1", name="a")
    assert queries.replayed(s, commands.make("pause_job", T0, "k2", name="a")) is None
    for cmd in (same, other):
        predicted = queries.replayed(s, cmd)
        assert predicted == s.apply(cmd)
    assert queries.replayed(s, same) == dict(first, duplicate=True)
    assert queries.replayed(s, other)["error"]["code"] == "conflict"
