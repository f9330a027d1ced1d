"""Backfills and bulk dead-letter operations in the replicated core (core/backfills.py,
core/backfill_plan.py; docs/backfill.md): planning as properties over every reprocess mode, order
and bound, idempotent ids, pause, resume and cancel, stale steps, queue backpressure, the trigger
with a slot, bulk requeue and purge, bounded state and the snapshot section."""
from __future__ import annotations

from collections import Counter

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from raftsched.core import backfill_plan, commands, limits, schedule
from raftsched.core.state import SchedulerState

from backfill_helpers import backfill_cmd, backfill_runs, finish_runs, range_slots, step, step_cmd
from core_helpers import DAY, MIN, SEC, T0, apply, new_state, put_cmd, restored, spec_of, tick
from exec_helpers import acq, complete, do

RETRY1 = {"max_attempts": 1}


def job_state(name="j", sched=None, **extra):
    spec = spec_of(sched or {"every_s": 60}, "skip", grace_s=5, retry=RETRY1, **extra)
    return new_state((name, spec), now=T0)


class Follower:
    """A follower of a state: every command applied to the state from now on is applied to
    ``self.state`` too, and must give the same result; ``restart`` replaces it by a replica
    restored from its own snapshot."""

    def __init__(self, s: SchedulerState) -> None:
        self.state = restored(s)
        lead = s.apply_bytes

        def both(data):
            res = lead(data)
            assert self.state.apply_bytes(data) == res, "the follower answered differently"
            return res
        s.apply_bytes = both

    def restart(self) -> None:
        self.state = restored(self.state)

    def snapshot(self) -> bytes:
        return self.state.snapshot()


def paired(s: SchedulerState) -> Follower:
    return Follower(s)


def history_of(s, slots_fates, manual=()):
    """Fire job ``j`` (every 60 s from T0) slot by slot: a fate ``missed`` lets the slot pass
    (recorded skipped / misfire), ``succeeded``, ``dead`` and ``running`` make its run end so
    (or hold its lease). ``manual`` slots get a manual run too (trigger with a slot). Returns
    the time after the last slot."""
    anchor = s.jobs["j"]["anchor"]
    n = len(slots_fates)
    for k, fate in enumerate(slots_fates, start=1):
        if fate != "missed":
            tick(s, anchor + k * MIN)
    end = anchor + n * MIN + MIN
    tick(s, end)
    for k in manual:
        if 1 <= k <= n:
            res = do(s, "trigger_job", end, name="j", slot=anchor + k * MIN)
            assert res["ok"], res
    fates = {f"j@{anchor + k * MIN}": f for k, f in enumerate(slots_fates, start=1)}
    while True:
        got = acq(s, end, n=1)
        if not got:
            break
        g = got[0]
        fate = fates.get(g["id"], "succeeded")
        if fate == "running":
            continue
        res = complete(s, end, g["id"], g["token"], ok=fate != "dead", error=None if fate != "dead" else "boom")
        assert res["ok"], res
    return end


# ============================================================================ planning, as properties
FATES = st.sampled_from(["missed", "succeeded", "succeeded", "dead", "running"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fates=st.lists(FATES, min_size=4, max_size=30), manual=st.lists(st.integers(1, 30), max_size=4),
       history=st.sampled_from([5, 12, 100]), mode=st.sampled_from(backfill_plan.MODES),
       order=st.sampled_from(backfill_plan.ORDERS), max_concurrent=st.integers(1, 4),
       rate=st.sampled_from([None, None, 700, 2500, 20_000]), data=st.data(),
       offs=st.tuples(st.sampled_from([0, 0, 0, 1, -1]), st.sampled_from([0, 0, 0, 1, -1])), dt=st.sampled_from([97, 450, 2100]),
       restore_at=st.integers(0, 40))
def test_a_backfill_runs_exactly_its_dry_run_once_each_within_its_bounds(
        fates, manual, history, mode, order, max_concurrent, rate, data, offs, dt, restore_at):
    """Every slot of the range is run once by the backfill or left out with a reason, exactly as
    its dry run said (the history does not change meanwhile but for the backfill's own runs); a
    backfill of missing never makes a run for a slot that had one; runs are made in its order,
    never more than max_concurrent queued or running, never faster than its rate; a follower
    (restored from a snapshot part-way) ends identical."""
    s = job_state(history=history)
    end = history_of(s, fates, manual)
    anchor = s.jobs["j"]["anchor"]
    n = len(fates)
    first = data.draw(st.integers(-1, n - 1), label="first slot")  # sometimes before the first slot
    last = data.draw(st.integers(first + 1, n + 2), label="last slot")  # sometimes past the cursor
    lo, hi = anchor + first * MIN + offs[0], anchor + last * MIN + offs[1]
    now = max(end, hi) + MIN
    slots = range_slots(s, "j", lo, hi, order)
    dry = backfill_plan.dry_run_backfill(s, "j", slots, mode)
    had_run = set(backfill_plan.latest_by_slot(s, "j"))
    follower = paired(s)
    res = apply(s, backfill_cmd(s, "j", lo, hi, now, "bf", reprocess=mode, order=order,
                                max_concurrent=max_concurrent, rate_milli=rate))
    assert res["ok"] and res["created"], res
    t0, made, seen = now, [], set()
    for i in range(5000):
        if s.backfills["bf"]["state"] == "done":
            break
        if i == restore_at:
            follower.restart()
        step(s, "bf", now)
        for r in backfill_runs(s, "bf"):
            if r["id"] not in seen:
                seen.add(r["id"])
                made.append(r["slot"])
        active = backfill_plan.live_active(s, s.backfills["bf"]["active"])
        assert active <= max_concurrent, (active, max_concurrent)
        if rate is not None:
            assert len(made) * 1_000_000 <= 1_000_000 + (now - t0) * rate, ("faster than the rate", len(made), now - t0)
        finish_runs(s, now)
        now += dt
    bf = s.backfills["bf"]
    event(f"mode {mode}")
    event(f"runs made: {'0' if not made else '1-3' if len(made) < 4 else '4+'}")
    for why in bf["left_out"]:
        event(f"left out: {why}")
    assert bf["state"] == "done", bf
    assert made == dry["slots"], "the backfill ran other slots than its dry run listed, or in another order"
    assert len(set(made)) == len(made)
    if mode == "missing":
        assert not set(made) & had_run, "a backfill of missing ran a slot that had a run"
    assert bf["created"] == len(made) and bf["planned"] == len(slots)
    assert bf["left_out"] == dict(Counter(why for _, why in dry["left_out"]))
    assert bf["created"] + sum(bf["left_out"].values()) == bf["planned"]
    assert backfill_plan.progress(s, bf)["succeeded"] + bf["finished"].get("forgotten", 0) == len(made)
    for r in backfill_runs(s, "bf"):
        assert r["kind"] == "backfill" and r["id"] in (f"j@{r['slot']}", f"j@{r['slot']}#bbf")
    assert follower.snapshot() == s.snapshot()
    again = restored(s)
    assert again.snapshot() == s.snapshot()


def test_a_slot_that_never_ran_gets_the_id_its_scheduled_run_would_have_had():
    s = job_state()
    end = history_of(s, ["succeeded", "missed", "missed", "dead"])
    anchor = s.jobs["j"]["anchor"]
    now = end + MIN
    # A missed slot gets job@slot; one whose id a record has (a record's first slot), or whose
    # failed run has it, gets the backfill's suffix.
    apply(s, backfill_cmd(s, "j", anchor, anchor + 5 * MIN, now, "bf", reprocess="failed", max_concurrent=5))
    step(s, "bf", now)
    ids = sorted(r["id"] for r in backfill_runs(s, "bf"))
    rec = s.runs[f"j@{anchor + 2 * MIN}"]
    assert rec["kind"] == "recorded" and rec["count"] == 2
    assert ids == sorted([f"j@{anchor + 2 * MIN}#bbf", f"j@{anchor + 3 * MIN}", f"j@{anchor + 4 * MIN}#bbf"])
    assert s.backfills["bf"]["left_out"] == {"succeeded": 1}


# ============================================================================ the request and its id
def test_the_same_id_again_is_the_same_backfill_and_another_request_under_it_is_refused():
    s = job_state()
    end = history_of(s, ["succeeded"] * 3)
    anchor = s.jobs["j"]["anchor"]
    cmd = backfill_cmd(s, "j", anchor, anchor + 3 * MIN, end, "bf", reprocess="all")
    assert apply(s, cmd)["created"] is True
    again = apply(s, backfill_cmd(s, "j", anchor, anchor + 3 * MIN, end + 5000, "bf", reprocess="all"))
    assert again["ok"] and again["created"] is False
    other = apply(s, backfill_cmd(s, "j", anchor, anchor + 4 * MIN, end, "bf", reprocess="all"))
    assert not other["ok"] and other["error"]["code"] == "conflict" and other["error"]["field"] == "id"
    assert len(s.backfills) == 1


def test_a_backfill_planned_with_another_schedule_is_refused_and_the_job_must_exist():
    s = job_state()
    end = history_of(s, ["succeeded"] * 3)
    anchor = s.jobs["j"]["anchor"]
    cmd = backfill_cmd(s, "j", anchor, anchor + 3 * MIN, end, "bf")
    apply(s, put_cmd(s, "j", spec_of({"every_s": 30}, "skip"), end))
    res = apply(s, cmd)
    assert not res["ok"] and res["error"]["code"] == "conflict", res
    cmd["job"] = "nope"
    assert apply(s, cmd)["error"]["code"] == "not_found"
    assert s.backfills == {}


@pytest.mark.parametrize("field,value", [
    ("from", None), ("to", 0), ("reprocess", "some"), ("order", "random"), ("overlap", "replace"),
    ("max_concurrent", 0), ("max_concurrent", limits.backfill_concurrent_max + 1), ("rate_milli", 0),
    ("max_slots", limits.backfill_slots_max + 1), ("planned", -1), ("schedule", "0 * * * *"), ("anchor", None),
    ("payload", b"bytes"), ("name", "has space"), ("name", "x" * 65),
])
def test_a_malformed_backfill_is_refused_and_changes_nothing(field, value):
    s = job_state()
    end = history_of(s, ["succeeded"] * 2)
    anchor = s.jobs["j"]["anchor"]
    cmd = backfill_cmd(s, "j", anchor, anchor + 2 * MIN, end, "bf")
    cmd[field] = value
    before = s.snapshot()
    res = s.apply_bytes(msgpack.packb(cmd, use_bin_type=True))
    assert not res["ok"] and res["error"]["code"] == "invalid_command", res
    s.applied -= 1
    assert s.snapshot() == before


def test_active_backfills_are_bounded_and_finished_ones_kept_up_to_the_limit(monkeypatch):
    monkeypatch.setattr(limits, "backfills_active_max", 3)
    monkeypatch.setattr(limits, "backfills_kept_max", 2)
    s = job_state()
    end = history_of(s, ["succeeded"] * 3)
    anchor = s.jobs["j"]["anchor"]
    for k in range(3):
        assert apply(s, backfill_cmd(s, "j", anchor, anchor + 2 * MIN, end, f"b{k}"))["ok"]
    res = apply(s, backfill_cmd(s, "j", anchor, anchor + 2 * MIN, end, "b3"))
    assert res["error"]["code"] == "limit_exceeded", res
    for k in range(3):
        assert do(s, "backfill_control", end + k, name=f"b{k}", action="cancel")["ok"]
    # Three finished, two kept: the oldest finished (b0) is forgotten.
    assert list(s.backfills) == ["b1", "b2"]


# ============================================================================ steps
def test_a_stale_step_is_dropped_whole_and_a_replayed_one_creates_nothing():
    s = job_state()
    end = history_of(s, ["missed"] * 6)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 7 * MIN, end, "bf", max_concurrent=2))
    cmd = step_cmd(s, "bf", end)
    data = commands.encode(cmd)
    assert s.apply_bytes(data)["created"] == 2
    before = dict(s.runs)
    res = s.apply_bytes(data)  # proposed twice, or by a second leader from the same view
    assert res["ok"] and res["stale"] is True
    assert s.runs.keys() == before.keys()
    # A step from a view that lagged behind (an older cursor): also dropped.
    cmd2 = dict(cmd, after=cmd["after"])
    assert apply(s, cmd2)["stale"] is True
    # One whose slots go back behind the cursor, or leave the range: refused as malformed.
    bad = dict(step_cmd(s, "bf", end) or dict(cmd, after=s.backfills["bf"]["cursor"]), slots=[anchor])
    assert apply(s, bad)["error"]["code"] == "invalid_command"
    bad["slots"] = [anchor + 9 * MIN]
    assert apply(s, bad)["error"]["code"] == "invalid_command"


def test_a_slot_after_the_jobs_cursor_is_left_out_as_not_yet_due():
    s = job_state()
    end = history_of(s, ["succeeded"] * 2)
    anchor = s.jobs["j"]["anchor"]
    apply(s, commands.make("pause_job", end, None, name="j"))
    cursor = s.jobs["j"]["cursor"]
    later = cursor + 10 * MIN
    res = backfill_plan.dry_run_backfill(s, "j", range_slots(s, "j", anchor, later), "all")
    assert [x for x, _ in res["left_out"]] == [x for x in range_slots(s, "j", anchor, later) if x > cursor]
    assert {why for _, why in res["left_out"]} == {"not_yet_due"}
    # ... and for good: when the job's cursor passes them later, the backfill still leaves them out.
    apply(s, backfill_cmd(s, "j", anchor, later, end, "bf", reprocess="all", max_concurrent=100))
    apply(s, commands.make("resume_job", later + MIN, None, name="j", catch_up=True))
    tick(s, later + MIN)
    while s.backfills["bf"]["state"] != "done":
        step(s, "bf", later + MIN)
        finish_runs(s, later + MIN)
    assert sorted(r["slot"] for r in backfill_runs(s, "bf")) == res["slots"]


def test_pause_stops_steps_resume_goes_on_and_cancel_withdraws_queued_runs():
    s = job_state()
    end = history_of(s, ["missed"] * 8)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 9 * MIN, end, "bf", max_concurrent=2))
    assert step(s, "bf", end)["created"] == 2
    assert do(s, "backfill_control", end, name="bf", action="pause")["state"] == "paused"
    finish_runs(s, end)
    assert step_cmd(s, "bf", end) is None, "the stepper proposes nothing for a paused backfill"
    # A step planned before the pause is dropped.
    s2 = s.backfills["bf"]
    res = apply(s, commands.make("backfill_step", end, None, name="bf", after=s2["cursor"],
                                 slots=[s2["cursor"] + MIN], exhausted=False))
    assert res["stale"] is True
    assert do(s, "backfill_control", end, name="bf", action="resume")["state"] == "running"
    assert step(s, "bf", end)["created"] == 2
    res = do(s, "backfill_control", end, name="bf", action="cancel")
    assert res["state"] == "cancelled" and res["withdrawn"] == 2
    assert [r["state"] for r in backfill_runs(s, "bf")][-2:] == ["skipped", "skipped"]
    assert {r.get("reason") for r in backfill_runs(s, "bf") if r["state"] == "skipped"} == {"cancelled"}
    assert s._queue_depth["default"] == 0
    again = do(s, "backfill_control", end, name="bf", action="resume")
    assert again["error"]["code"] == "conflict"
    assert do(s, "backfill_control", end, name="nope", action="pause")["error"]["code"] == "not_found"


def test_a_full_queue_pauses_the_backfill_and_room_resumes_it():
    s = job_state()
    apply(s, commands.make("put_queue", T0, None, name="default", max_depth=2, on_full="reject"))
    end = history_of(s, ["missed"] * 6)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 7 * MIN, end, "bf", max_concurrent=10))
    res = step(s, "bf", end)
    assert res["created"] == 2 and res["state"] == "paused"
    bf = s.backfills["bf"]
    assert bf["paused_by"] == "queue_full" and "full" in bf["reason"]
    assert step_cmd(s, "bf", end) is None  # still full: nothing to propose, nothing dropped
    finish_runs(s, end)
    res = step(s, "bf", end)
    assert res["state"] == "paused" and res["created"] == 2  # resumed, filled it again
    while s.backfills["bf"]["state"] != "done":
        finish_runs(s, end)
        step(s, "bf", end)
    assert len(backfill_runs(s, "bf")) == 6


def test_overlap_forbid_waits_for_the_jobs_other_runs():
    s = job_state()
    end = history_of(s, ["missed", "missed", "running"])
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 3 * MIN, end, "bf", overlap="forbid", max_concurrent=5))
    assert step(s, "bf", end) is None, "a run of the job is running: the backfill waits"
    g = next(r for r in s.runs.values() if r["state"] == "running")
    assert complete(s, end, g["id"], g["fencing_token"])["ok"]
    assert step(s, "bf", end)["created"] == 1  # one at a time: its own run is one of the job's
    assert step(s, "bf", end) is None


def test_a_deleted_job_cancels_its_backfill():
    s = job_state()
    end = history_of(s, ["missed"] * 3)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 4 * MIN, end, "bf"))
    apply(s, commands.make("delete_job", end, None, name="j"))
    assert s.backfills["bf"]["state"] == "cancelled" and "deleted" in s.backfills["bf"]["reason"]
    apply(s, put_cmd(s, "j", spec_of({"every_s": 60}, "skip"), end + 1))  # the same name again
    assert step(s, "bf", end + 2) is None, "nothing left to step"
    assert s.backfills["bf"]["state"] == "cancelled"


@pytest.mark.parametrize("paused", [False, True])
def test_a_deleted_jobs_backfill_is_cancelled_at_once_with_its_runs_counted(paused):
    """A backfill paused by request stayed paused for good when its job was deleted (its steps
    are dropped, and the next step was what cancelled it), holding one of the active places; and
    the delete took its runs uncounted: succeeded 3 became 2, running 3 became nothing. The
    delete cancels it now, its finished runs' outcomes counted and its active ones forgotten."""
    s = job_state()
    follower = paired(s)
    end = history_of(s, ["missed"] * 5)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 6 * MIN, end, "bf", max_concurrent=5))
    step(s, "bf", end)
    made = backfill_runs(s, "bf")
    assert len(made) == 5
    two = {r["id"] for r in made[:2]}
    res = apply(s, commands.make("acquire", end, None, worker="w1", queues=None, max=100, ttl=10_000))
    assert len(res["runs"]) == 5, res  # 2 succeed, 3 stay running
    assert apply(s, commands.make("complete_many", end, None, results=[
        {"run": g["id"], "token": g["token"], "success": True} for g in res["runs"] if g["id"] in two]))["ok"]
    if paused:
        assert apply(s, commands.backfill_control(end, None, name="bf", action="pause"))["ok"]
        assert s.backfills["bf"]["state"] == "paused"
    assert apply(s, commands.make("delete_job", end + SEC, None, name="j"))["ok"]
    bf = s.backfills["bf"]
    assert bf["state"] == "cancelled" and "deleted" in bf["reason"], bf
    assert bf["finished"] == {"succeeded": 2, "forgotten": 3}, bf["finished"]
    assert bf["active"] == []
    assert follower.snapshot() == s.snapshot()


def test_newest_first_runs_the_latest_slot_first():
    s = job_state()
    end = history_of(s, ["missed"] * 5)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 6 * MIN, end, "bf", order="newest", max_concurrent=2))
    step(s, "bf", end)
    assert [r["slot"] for r in backfill_runs(s, "bf")] == [anchor + 5 * MIN, anchor + 4 * MIN]


def test_the_payload_override_reaches_the_worker():
    s = job_state()
    end = history_of(s, ["missed"])
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 2 * MIN, end, "bf", payload={"full": True}))
    step(s, "bf", end)
    [g] = acq(s, end)
    assert g["payload"] == {"full": True} and g["slot"] == anchor + MIN


def test_a_cron_backfill_follows_the_zone_nine_missed_nightly_reports_oldest_first_two_at_a_time():
    """The worked example of docs/backfill.md: the nightly report of 02:00 Europe/Berlin failed
    nine nights running; a backfill of failed runs them oldest first, two at a time."""
    spec = spec_of({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, "skip", retry=RETRY1, queue="reports")
    start = schedule.parse_iso_ms("2026-11-20T12:00:00Z", "t")
    s = new_state(("report", spec), now=start)
    now = start
    for day in range(12):
        now = schedule.parse_iso_ms("2026-11-21T01:00:05Z", "t") + day * DAY
        tick(s, now)
        for g in acq(s, now):
            bad = 2 <= day <= 10  # the warehouse was down: nine nights failed
            complete(s, now, g["id"], g["token"], ok=not bad, error="warehouse unreachable" if bad else None)
    lo, hi = schedule.parse_iso_ms("2026-11-21T00:00:00Z", "t"), schedule.parse_iso_ms("2026-12-03T00:00:00Z", "t")
    slots = range_slots(s, "report", lo, hi)
    dry = backfill_plan.dry_run_backfill(s, "report", slots, "failed")
    assert [schedule.iso(x) for x in dry["slots"]] == [f"2026-11-{d:02d}T01:00:00Z" for d in range(23, 31)] + [
        "2026-12-01T01:00:00Z"]
    assert [why for _, why in dry["left_out"]] == ["succeeded"] * 2 + ["succeeded"]
    apply(s, backfill_cmd(s, "report", lo, hi, now, "nine", reprocess="failed", max_concurrent=2))
    waves = []
    while s.backfills["nine"]["state"] != "done":
        step(s, "nine", now)
        waves.append(sorted(r["slot"] for r in backfill_runs(s, "nine") if r["state"] == "queued"))
        finish_runs(s, now)
        now += SEC
    assert [len(w) for w in waves if w] == [2, 2, 2, 2, 1]
    assert waves[0] == dry["slots"][:2]
    assert all(r["id"].endswith("#bnine") for r in backfill_runs(s, "nine"))  # each slot's failed run has job@slot


# ============================================================================ trigger with a slot
def test_a_trigger_for_a_slot_that_ran_answers_with_its_run():
    s = job_state()
    end = history_of(s, ["succeeded", "missed"])
    anchor = s.jobs["j"]["anchor"]
    res = do(s, "trigger_job", end, name="j", slot=anchor + MIN)
    assert res["ok"] and res["created"] is False and res["run"] == f"j@{anchor + MIN}"
    # A recorded slot gets a run of its own, once.
    first = do(s, "trigger_job", end, name="j", slot=anchor + 2 * MIN, payload={"x": 1})
    assert first["created"] is True and first["run"] == f"j@{anchor + 2 * MIN}#manual"
    again = do(s, "trigger_job", end + 1, name="j", slot=anchor + 2 * MIN)
    assert again["created"] is False and again["run"] == first["run"]
    [g] = acq(s, end + 1)
    assert g["id"] == first["run"] and g["payload"] == {"x": 1}
    # A slot after the cursor: its scheduled run is still to come.
    later = do(s, "trigger_job", end, name="j", slot=s.jobs["j"]["cursor"] + MIN)
    assert later["error"]["code"] == "conflict" and later["error"]["field"] == "slot"
    # Without a slot, a payload override on the manual run it always was.
    plain = do(s, "trigger_job", end, name="j", payload=[1, 2])
    assert "!manual-" in plain["run"] and s.runs[plain["run"]]["payload"] == [1, 2]


def test_trigger_without_slot_or_payload_keeps_its_bytes():
    s = job_state()
    res = do(s, "trigger_job", T0, name="j")
    assert set(res) == {"ok", "job", "run", "state"}
    assert "payload" not in s.runs[res["run"]]
    res = do(s, "trigger_job", T0, name="j", slot=None)  # a nil slot is no slot, and no payload
    assert res["ok"] and "payload" not in s.runs[res["run"]]


# ============================================================================ bulk DLQ operations
def dead_state(n=6):
    s = new_state(("j", spec_of({"every_s": 3600}, "skip", retry=RETRY1)),
                  ("k", spec_of({"every_s": 3600}, "skip", retry=RETRY1, queue="other")), now=T0)
    t = T0
    for i in range(n):
        for job in ("j", "k"):
            do(s, "trigger_job", t, name=job)
        for g in acq(s, t):
            complete(s, t, g["id"], g["token"], ok=False, error="disk full" if i % 2 else "timeout")
        t += SEC
    return s, t


def bulk_cmd(s, now, bf_id="q1", action="requeue", **f):
    fields = {"queue": None, "job": None, "error": None, "dead_from": None, "dead_to": now, "max_count": None,
              "max_concurrent": 1000 if action == "requeue" else None, "rate_milli": None}
    fields.update(f)
    return commands.make("dlq_bulk", now, None, name=bf_id, action=action, **fields)


@settings(max_examples=60, deadline=None)
@given(queue=st.sampled_from([None, "default", "other"]), job=st.sampled_from([None, "j", "k"]),
       error=st.sampled_from([None, "disk", "time", "nope"]), max_count=st.sampled_from([None, 1, 3, 100]),
       rate=st.sampled_from([None, 1500]), action=st.sampled_from(["requeue", "purge"]))
def test_a_bulk_operation_acts_on_exactly_the_matching_dead_runs_once(queue, job, error, max_count, rate, action):
    s, now = dead_state()
    filters = {"queue": queue, "job": job, "error": error, "dead_from": None, "dead_to": now}
    keys = backfill_plan.dead_matching(s, filters)
    expect = [k[1] for k in (keys if max_count is None else keys[:max_count])]
    follower = paired(s)
    assert apply(s, bulk_cmd(s, now, action=action, max_count=max_count, rate_milli=rate, **{
        k: v for k, v in filters.items() if k != "dead_to"}))["ok"]
    t0 = now
    for _ in range(500):
        if s.backfills["q1"]["state"] == "done":
            break
        step(s, "q1", now)
        if action == "requeue":
            if rate is not None:
                made = len([r for r in s.runs.values() if r.get("requeue") == "q1"])
                assert made * 1_000_000 <= 1_000_000 + (now - t0) * rate, "faster than the rate"
            finish_runs(s, now)  # they fail again: dead after the op's cutoff, never picked twice
        now += 300
    bf = s.backfills["q1"]
    assert bf["state"] == "done" and bf["created"] == len(expect) and bf["planned"] == len(expect)
    if action == "requeue":
        again = sorted(r["id"] for r in s.runs.values() if r.get("requeue") == "q1")
        assert again == sorted(expect)
        assert all(s.runs[rid]["attempt"] == 2 for rid in expect), "each requeued exactly once"
    else:
        assert not set(expect) & set(s.runs)
    assert follower.snapshot() == s.snapshot()


@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_a_bulk_operations_runs_deleted_with_their_job_are_counted_left_out(action):
    """A bulk requeue whose job was deleted mid-way ended done with planned 6, requeued 1,
    left out 0: the job's dead runs left the DLQ index with it, so the cursor never came to them
    and no count or reason said where they went. They are left out as ``gone`` once the range is
    handled: created + left_out = planned."""
    s, now = dead_state()
    follower = paired(s)
    assert apply(s, bulk_cmd(s, now, action=action, job="j", rate_milli=1000))["ok"]
    assert s.backfills["q1"]["planned"] == 6
    step(s, "q1", now)
    assert s.backfills["q1"]["created"] == 1
    assert do(s, "delete_job", now, name="j")["ok"]
    for k in range(1, 20):
        if s.backfills["q1"]["state"] == "done":
            break
        step(s, "q1", now + k * SEC)
    bf = s.backfills["q1"]
    assert bf["state"] == "done", bf
    assert bf["created"] + sum(bf["left_out"].values()) == bf["planned"] == 6, bf
    assert bf["left_out"] == {"gone": 5}, bf
    assert follower.snapshot() == s.snapshot()


def test_a_full_queue_pauses_a_requeue_and_room_resumes_it():
    s, now = dead_state(4)
    apply(s, commands.make("put_queue", now, None, name="default", max_depth=1, on_full="reject"))
    apply(s, bulk_cmd(s, now, queue="default"))
    res = step(s, "q1", now)
    assert res["acted"] == 1 and s.backfills["q1"]["paused_by"] == "queue_full"
    assert step_cmd(s, "q1", now) is None, "still full: the stepper proposes nothing"
    finish_runs(s, now)
    assert step(s, "q1", now)["acted"] == 1


# ============================================================================ the snapshot section
def test_backfills_make_a_version_4_snapshot_that_round_trips_and_without_them_none():
    s = job_state()
    end = history_of(s, ["missed"] * 3)
    plain = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    # (the job's runs' outcomes give it health, a section of version 4: core/notify.py)
    assert "backfills" not in plain.get("ext", {})
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 4 * MIN, end, "bf"))
    step(s, "bf", end)
    data = s.snapshot()
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert obj["v"] == 4 and [b["id"] for b in obj["ext"]["backfills"]] == ["bf"]
    r = restored(s)
    assert r.snapshot() == data
    # The restored replica goes on as the original does.
    for x in (s, r):
        finish_runs(x, end)
        step(x, "bf", end + SEC)
    assert r.snapshot() == s.snapshot()


def test_reads_share_nothing_with_the_state():
    s = job_state()
    end = history_of(s, ["missed"] * 3)
    anchor = s.jobs["j"]["anchor"]
    apply(s, backfill_cmd(s, "j", anchor, anchor + 4 * MIN, end, "bf"))
    step(s, "bf", end)
    before = s.snapshot()
    v = backfill_plan.view(s, "bf")
    v["req"]["from"] = 0
    v["active"].append("x")
    v["left_out"]["x"] = 1
    for w in backfill_plan.views(s):
        w["finished"]["x"] = 1
    assert s.snapshot() == before
    assert backfill_plan.views(s, kind="requeue") == [] and len(backfill_plan.views(s, job="j", state="running")) == 1


def test_history_trimmed_before_the_backfill_is_beyond_history():
    s = job_state(history=5)
    anchor = s.jobs["j"]["anchor"]
    for k in range(1, 13):
        tick(s, anchor + k * MIN)
        finish_runs(s, anchor + k * MIN)
    end = anchor + 12 * MIN
    res = backfill_plan.dry_run_backfill(s, "j", range_slots(s, "j", anchor, anchor + 13 * MIN), "missing")
    reasons = dict((x, why) for x, why in res["left_out"])
    assert reasons[anchor + MIN] == "beyond_history" and reasons[anchor + 12 * MIN] == "succeeded"
    assert res["slots"] == [] and end == anchor + 12 * MIN


def test_a_paused_jobs_backfill_goes_on_making_and_handing_out_runs():
    """docs/backfill.md: pausing a job holds its scheduled slots only; its backfill is a request
    of its own (often to fill in what the pause skipped), so it keeps making runs and workers are
    handed them, until the backfill itself is paused."""
    s = job_state()
    for k in range(1, 11):  # slots 1..10 min fired and run (a backfill reruns what the cursor passed)
        tick(s, T0 + k * MIN + 1)
        for g in acq(s, T0 + k * MIN + 2, n=10):
            assert complete(s, T0 + k * MIN + 3, g["id"], g["token"])["ok"]
    now = T0 + 10 * MIN + 30 * SEC
    assert do(s, "pause_job", now, name="j")["paused"] is True
    assert apply(s, backfill_cmd(s, "j", T0 + MIN, T0 + 10 * MIN, now, reprocess="all", max_concurrent=3))["ok"]
    assert step(s, "b1", now)["created"] == 3
    got = acq(s, now + 1, n=10)
    assert len(got) == 3 and all(s.runs[g["id"]]["kind"] == "backfill" for g in got), got
    assert not any(r["kind"] == "scheduled" and r["state"] == "queued" for r in s.runs.values())
    assert do(s, "backfill_control", now + 2, name="b1", action="pause")["state"] == "paused"
    for g in got:
        assert complete(s, now + 3, g["id"], g["token"])["ok"]
    res = step(s, "b1", now + 4)
    assert res is None or not res.get("created"), res


def _reprocess_first_slot(s, end: int) -> None:
    """A backfill b1 of job j's first slot, reprocess failed, run to its end, its runs succeeding."""
    anchor = s.jobs["j"]["anchor"]
    assert apply(s, backfill_cmd(s, "j", anchor + MIN, anchor + MIN + 1, end, reprocess="failed"))["ok"]
    for k in range(20):
        if s.backfills["b1"]["state"] == "done":
            break
        step(s, "b1", end + k)
        finish_runs(s, end + k)


def test_a_bulk_requeue_leaves_out_a_dead_run_whose_slot_succeeded_since():
    """A user's walk: a backfill with reprocess: failed ran a dead slot again and it succeeded
    (its children too), and the dead run stayed in the dead-letter queue (documented): a bulk
    requeue then ran the slot a third time. A dead run whose slot a later run of its job
    succeeded (a backfill's, one by hand) is left out, reason ``slot_succeeded``; one by hand
    (``POST /v1/dlq/{run}/requeue``) is still the operator's to make."""
    s = job_state()
    end = history_of(s, ["dead", "dead"])
    anchor = s.jobs["j"]["anchor"]
    first, second = f"j@{anchor + MIN}", f"j@{anchor + 2 * MIN}"
    assert s.runs[first]["state"] == s.runs[second]["state"] == "dead"
    follower = paired(s)
    _reprocess_first_slot(s, end)
    assert [(r["slot"], r["state"]) for r in backfill_runs(s, "b1")] == [(anchor + MIN, "succeeded")]
    end += MIN
    keys = backfill_plan.dead_matching(s, {"queue": None, "job": "j", "error": None, "dead_from": None, "dead_to": end})
    kept, left = backfill_plan.dry_run_requeue(s, keys)  # what the dry run answers
    assert [k[1] for k in kept] == [second] and left == {"slot_succeeded": 1}
    assert apply(s, bulk_cmd(s, end, job="j"))["ok"]
    for k in range(20):
        if s.backfills["q1"]["state"] == "done":
            break
        step(s, "q1", end + k * SEC)
        finish_runs(s, end + k * SEC)
    bf = s.backfills["q1"]
    assert bf["state"] == "done" and bf["planned"] == 2 and bf["created"] == 1, bf
    assert bf["left_out"] == {"slot_succeeded": 1}, bf
    assert s.runs[first]["state"] == "dead" and s.runs[second]["state"] == "succeeded"
    assert do(s, "dlq_requeue", end + 30 * SEC, run=first)["ok"]  # by hand: as asked
    assert follower.state.snapshot() == s.snapshot()


def test_a_parents_dead_run_whose_slot_succeeded_without_its_children_is_still_requeued():
    """A review: a dead run of a job with children whose slot a backfill without cascade ran
    again (its children left upstream_failed) was left out as slot_succeeded, and the children
    never ran: the requeue is what re-arms them. Only a success the children followed counts."""
    from pipeline_helpers import job_raw, put
    s = job_state()
    assert put(s, "c", job_raw(after=["j"]))["ok"]
    end = history_of(s, ["dead"])
    anchor = s.jobs["j"]["anchor"]
    dead = f"j@{anchor + MIN}"
    assert s.runs[f"c@{anchor + MIN}"]["reason"] == "upstream_failed"
    _reprocess_first_slot(s, end)
    assert [r["state"] for r in backfill_runs(s, "b1")] == ["succeeded"]
    end += MIN
    keys = backfill_plan.dead_matching(s, {"queue": None, "job": "j", "error": None, "dead_from": None, "dead_to": end})
    kept, left = backfill_plan.dry_run_requeue(s, keys)
    assert [k[1] for k in kept] == [dead] and left == {}
