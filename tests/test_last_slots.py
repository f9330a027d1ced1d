"""schedule.last_slots_until: the last slots before a time, however the slots are spread, found
without stepping through every slot of a wide window (the trigger's plan after an outage, a
resume, preview and explain call it)."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st

from raftsched.core import limits, policy, preview, schedule

from core_helpers import DAY, HOUR, MIN, SEC, ms

#: Every second of January: from February, the first window holding a slot holds millions.
JAN = {"cron": "* * * * 1 *"}


def cron(expr, tz="UTC", **extra):
    return {"cron": expr, "timezone": tz, **extra}


class StepBudget:
    """Counts the slot steps (next_slot_after calls, which iter_slots makes one per slot) and
    fails as soon as they pass ``budget``, so the old window walk fails fast instead of slowly."""

    def __init__(self, monkeypatch, budget: int) -> None:
        self.steps = 0
        self.budget = budget
        real = schedule.next_slot_after

        def counted(*args):
            self.steps += 1
            if self.steps > self.budget:
                raise AssertionError(f"more than {self.budget} slot steps")
            return real(*args)

        monkeypatch.setattr(schedule, "next_slot_after", counted)


def test_the_last_slot_of_january_seen_from_february(monkeypatch):
    steps = StepBudget(monkeypatch, 5_000)
    got = schedule.last_slots_until(JAN, ms("2027-01-01T00:00:00Z"), ms("2027-02-05T00:00:00Z"), 0, 1)
    assert got == [ms("2027-01-31T23:59:59Z")]
    got = schedule.last_slots_until(JAN, ms("2027-01-01T00:00:00Z"), ms("2027-02-05T00:00:00Z"), 0, 3)
    assert got == [ms("2027-01-31T23:59:57Z"), ms("2027-01-31T23:59:58Z"), ms("2027-01-31T23:59:59Z")]
    assert steps.steps < 5_000  # (the window walk stepped through a million slots for each)


@pytest.mark.parametrize("count", [1, 2, 7, 64, 1001])
def test_steps_per_call_are_bounded_by_the_count_not_the_window(monkeypatch, count):
    # At most 17 widenings (60 s x 8**16 is past limits.time_ms_max) and 48 halvings, each
    # stepping through at most 8 * count + 65 slots.
    steps = StepBudget(monkeypatch, 65 * (8 * count + 65))
    got = schedule.last_slots_until(JAN, ms("2027-01-12T00:00:00Z"), ms("2027-02-05T00:00:00Z"), 0, count)
    last = ms("2027-01-31T23:59:59Z")
    assert got == list(range(last - (count - 1) * SEC, last + 1, SEC))
    assert steps.steps > 0


def test_fire_once_after_an_outage_runs_the_latest_missed_slot(monkeypatch):
    StepBudget(monkeypatch, 100_000)
    spec = {"schedule": JAN, "misfire": {"policy": "fire_once", "grace_s": 5, "max_catchup": 100}}
    cursor, now = ms("2027-01-12T00:00:00Z"), ms("2027-02-05T00:00:00Z")
    plan = policy.plan_fire(spec, 0, cursor, now, 1, "j")
    assert plan is not None
    assert plan["runs"] == [ms("2027-01-31T23:59:59Z")]
    # Every other due slot is recorded, from the first after the cursor to the one before the run
    # (too many to count: count None).
    assert plan["rec"] == [["coalesced", "misfire", cursor + SEC, ms("2027-01-31T23:59:58Z"), None]]
    assert plan["upto"] == now and plan["next"] == ms("2028-01-01T00:00:00Z")


def test_explain_and_resume_see_the_last_slot_of_january(monkeypatch):
    StepBudget(monkeypatch, 100_000)
    spec = {"schedule": JAN, "misfire": {"policy": "fire_once", "grace_s": 5, "max_catchup": 100}}
    out = preview.explain(spec, 0, ms("2027-01-12T00:00:00Z"), ms("2027-02-05T00:00:00Z"))
    assert [r["slot"] for r in out["runs"]] == ["2027-01-31T23:59:59Z"]
    assert out["recorded"][0]["to"] == "2027-01-31T23:59:58Z"
    res = policy.plan_resume(spec, 0, ms("2027-01-30T00:00:00Z"), ms("2027-02-05T00:00:00Z"))
    assert res["rec"] == [["skipped", "paused", ms("2027-01-30T00:00:01Z"), ms("2027-01-31T23:59:59Z"), None]]
    # A preview from February marks the first slot of the next January against the last of this one.
    slots = preview.preview(spec, 0, ms("2027-02-05T00:00:00Z"), 2)
    assert [s["slot"] for s in slots] == ["2028-01-01T00:00:00Z", "2028-01-01T00:00:01Z"]


# --------------------------------------------------------------- against the slots stepped through
NY = "America/New_York"
#: (schedule, how far back from ``until`` its slots are looked at): spread evenly, bunched into
#: an hour of a day or a month (the windows widen past them: the start is bisected), across DST
#: transitions of several zones, sparse, jittered, one-shot.
SCHEDULES = st.sampled_from([
    ({"every_s": 7}, 2 * DAY),
    ({"every_s": 3600, "jitter_ms": 3_599_000, "jitter_key": "job"}, 200 * DAY),
    (cron("* * * * *"), 3 * DAY),
    (cron("*/5 * 3 * * *"), 3 * DAY),
    (cron("*/5 * 3 * * *", NY), 3 * DAY),
    (cron("*/10 * 1-2 * * *", NY, dst={"fall_back": "twice"}), 3 * DAY),
    (cron("*/10 * 1-2 * * *", NY, dst={"spring_forward": "skip"}), 3 * DAY),
    (cron("*/20 * * * * *", "Australia/Lord_Howe"), DAY),
    (cron("0 30 2 * * *", "Europe/Berlin"), 400 * DAY),
    (cron("*/30 * 2 * * *", "Europe/Berlin", dst={"spring_forward": "run_after_gap"}), 10 * DAY),
    (cron("0 */10 * 1 *", "Asia/Kolkata"), 800 * DAY),
    (cron("0 */5 * 3,11 *", NY), 400 * DAY),
    (cron("0 0 29 2 *"), 3000 * DAY),
    ({"at": ms("2026-11-01T05:30:00Z")}, 800 * DAY),
])


@settings(max_examples=120, deadline=None)
@given(pick=SCHEDULES, until=st.integers(ms("2026-01-01T00:00:00Z"), ms("2027-12-31T00:00:00Z")),
       back=st.floats(0, 1), count=st.integers(0, 40), anchor=st.integers(0, DAY))
def test_last_slots_are_the_last_of_every_slot_stepped_through(pick, until, back, count, anchor):
    sched, span = pick
    after = until - int(span * back)
    everything = list(schedule.iter_slots(sched, after, until, anchor, 20_001))
    assume(len(everything) <= 20_000)
    assert everything == sorted(set(everything))
    assert schedule.last_slots_until(sched, after, until, anchor, count) == (everything[-count:] if count else [])


@pytest.mark.parametrize("after,until", [
    # fall back in New York (2026-11-01): 01:xx happens twice and fires twice
    ("2026-10-31T00:00:00Z", "2026-11-01T06:00:00Z"), ("2026-10-31T00:00:00Z", "2026-11-01T05:45:00Z"),
    ("2026-10-31T00:00:00Z", "2026-11-01T05:00:00Z"), ("2026-10-31T00:00:00Z", "2026-11-01T06:10:00Z"),
    # spring forward (2026-03-08): 02:xx does not exist
    ("2026-03-07T00:00:00Z", "2026-03-08T08:00:00Z"), ("2026-03-07T00:00:00Z", "2026-03-08T07:00:01Z"),
])
@pytest.mark.parametrize("sched", [
    cron("*/10 * 1-2 * * *", NY, dst={"fall_back": "twice"}), cron("*/10 * 1-2 * * *", NY),
    cron("*/10 * 2 * * *", NY, dst={"spring_forward": "run_after_gap"}), cron("0 */20 * * * *", NY),
])
def test_last_slots_around_dst_transitions(sched, after, until):
    lo, hi = ms(after), ms(until)
    everything = list(schedule.iter_slots(sched, lo, hi, 0, 100_000))
    for count in (1, 2, 5, 13, 60, 400, len(everything) + 1):
        assert schedule.last_slots_until(sched, lo, hi, 0, count) == everything[-count:], count


def test_windows_wider_than_the_range_and_empty_ranges():
    s = cron("*/5 * 3 * * *")
    t = ms("2026-06-02T12:00:00Z")
    assert schedule.last_slots_until(s, t, t, 0, 3) == []
    assert schedule.last_slots_until(s, t - HOUR, t, 0, 3) == []  # no slot after 03:00 that day
    all_of_it = list(schedule.iter_slots(s, t - DAY, t, 0, 10_000))
    assert len(all_of_it) == 720
    assert schedule.last_slots_until(s, t - DAY, t, 0, 1000) == all_of_it  # fewer than asked
    assert schedule.last_slots_until(s, t - DAY, t, 0, 720) == all_of_it
    assert schedule.last_slots_until(s, t - DAY, t, 0, 719) == all_of_it[1:]
    one = {"at": t - 10 * MIN}
    assert schedule.last_slots_until(one, 0, t, 0, 5) == [t - 10 * MIN]
    assert schedule.last_slots_until(one, t - 10 * MIN, t, 0, 5) == []
    assert schedule.last_slots_until(one, 0, t - 10 * MIN - 1, 0, 5) == []


def test_the_search_reaches_back_to_the_oldest_possible_time():
    # One slot a year, the range the widest a client may give: the windows widen to its start.
    s = cron("0 0 29 2 *")
    got = schedule.last_slots_until(s, 0, limits.time_ms_max, 0, 2)
    assert [schedule.iso(x) for x in got] == ["9992-02-29T00:00:00Z", "9996-02-29T00:00:00Z"]
    assert schedule.last_slots_until(s, 0, ms("1970-03-01T00:00:00Z"), 0, 1) == []
    assert [schedule.iso(x) for x in schedule.last_slots_until(s, 0, ms("1972-03-01T00:00:00Z"), 0, 4)] == [
        "1972-02-29T00:00:00Z"]
