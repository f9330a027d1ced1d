"""Slot computation: cron (5 and 6 fields, seconds first), time zones and DST, intervals, one-shots."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st

from raftsched.core import schedule
from raftsched.core.errors import InvalidSpec

from core_helpers import DAY, HOUR, MIN, SEC, T0, ms

NY = "America/New_York"
BERLIN = "Europe/Berlin"


def cron(expr, tz="UTC"):
    return {"cron": expr, "timezone": tz}


def slots(sched, after, until, anchor=0, limit=10_000):
    return list(schedule.iter_slots(sched, after, until, anchor, limit))


def isos(sched, after_iso, until_iso, anchor=0):
    return [schedule.iso(s) for s in slots(sched, ms(after_iso), ms(until_iso), anchor)]


# ----------------------------------------------------------------------------- cron basics
def test_five_field_cron_is_minute_precision():
    assert isos(cron("*/15 * * * *"), "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z") == [
        "2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:45:00Z", "2026-01-01T01:00:00Z"]


def test_six_field_cron_has_seconds_first():
    # "30 * * * * *" is second 30 of every minute, not minute 30 of every hour.
    assert isos(cron("30 * * * * *"), "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z") == [
        "2026-01-01T00:00:30Z", "2026-01-01T00:01:30Z", "2026-01-01T00:02:30Z"]
    # "0 30 2 * * *" is 02:30:00 daily.
    assert isos(cron("0 30 2 * * *"), "2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z") == [
        "2026-01-01T02:30:00Z", "2026-01-02T02:30:00Z"]


def test_cron_slots_are_strictly_after_the_start():
    s = cron("* * * * *")
    t = ms("2026-01-01T00:05:00Z")
    assert schedule.next_slot_after(s, t, 0) == t + MIN
    assert schedule.next_slot_after(s, t - 1, 0) == t


@settings(max_examples=150, deadline=None)
@given(after=st.integers(T0 - 400 * DAY, T0 + 400 * DAY))
def test_six_field_cron_next_slot_is_arithmetic_in_utc(after):
    # Sub-second starting points included: the next slot is the next multiple of 15 s.
    assert schedule.next_slot_after(cron("*/15 * * * * *"), after, 0) == (after // 15_000 + 1) * 15_000
    assert schedule.next_slot_after(cron("* * * * *"), after, 0) == (after // MIN + 1) * MIN


def test_cron_is_evaluated_in_its_timezone():
    assert isos(cron("0 9 * * *", "Asia/Tokyo"), "2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z") == [
        "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]
    assert isos(cron("0 9 * * *", NY), "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z") == ["2026-01-01T14:00:00Z"]
    assert isos(cron("0 9 * * *", NY), "2026-07-01T00:00:00Z", "2026-07-02T00:00:00Z") == ["2026-07-01T13:00:00Z"]


def test_cron_names_for_days_and_months():
    assert isos(cron("0 9 * * FRI"), "2026-05-25T00:00:00Z", "2026-06-01T00:00:00Z") == ["2026-05-29T09:00:00Z"]
    assert isos(cron("0 0 1 MAR *"), "2026-01-01T00:00:00Z", "2026-12-31T00:00:00Z") == ["2026-03-01T00:00:00Z"]


def test_last_slots_until_zero_count_is_empty():
    assert schedule.last_slots_until(cron("* * * * *"), T0, T0 + HOUR, 0, 0) == []
    assert schedule.last_slots_until({"every_s": 60}, T0, T0 + HOUR, T0, 0) == []


def test_check_cron_refuses_random_and_hashed_items():
    for expr in ("R * * * *", "r * * * *", "H * * * *", "0 r(0-5) * * *", "1,r * * * *"):
        with pytest.raises(InvalidSpec) as ei:
            schedule.check_cron(expr)
        assert ei.value.field == "schedule.cron"


def test_zone_refuses_unknown_names():
    with pytest.raises(InvalidSpec) as ei:
        schedule.zone("Nowhere/Land")
    assert ei.value.field == "schedule.timezone"


# ----------------------------------------------------------------------------- DST
def test_dst_fall_back_fixed_hour_fires_once_new_york():
    # 2026-11-01: 02:00 EDT -> 01:00 EST, 01:30 happens twice (05:30Z and 06:30Z).
    got = isos(cron("30 1 * * *", NY), "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z")
    assert got == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_dst_fall_back_next_slot_from_inside_repeated_hour_skips_second_occurrence():
    s = cron("30 1 * * *", NY)
    assert schedule.next_slot_after(s, ms("2026-11-01T05:30:00Z"), 0) == ms("2026-11-02T06:30:00Z")
    assert schedule.next_slot_after(s, ms("2026-11-01T06:00:00Z"), 0) == ms("2026-11-02T06:30:00Z")
    assert schedule.next_slot_after(s, ms("2026-11-01T06:30:00Z") - 1, 0) == ms("2026-11-02T06:30:00Z")


@pytest.mark.parametrize("expr", ["30 2 * * *", "0 30 2 * * *"])
def test_dst_fall_back_fixed_hour_fires_once_berlin(expr):
    # 2026-10-25: 03:00 CEST -> 02:00 CET, 02:30 happens at 00:30Z and at 01:30Z.
    got = isos(cron(expr, BERLIN), "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z")
    assert got == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def test_dst_fall_back_wildcard_hour_keeps_firing_every_real_hour():
    got = slots(cron("0 * * * *", NY), ms("2026-10-31T20:00:00Z"), ms("2026-11-02T00:00:00Z"))
    assert len(got) == 28  # every real hour, the repeated 01:00 local included
    assert all(b - a == HOUR for a, b in zip(got, got[1:]))
    assert ms("2026-11-01T05:00:00Z") in got and ms("2026-11-01T06:00:00Z") in got


def test_dst_fall_back_wildcard_hour_six_field_berlin():
    got = slots(cron("0 0 * * * *", BERLIN), ms("2026-10-24T22:00:00Z"), ms("2026-10-25T04:00:00Z"))
    assert all(b - a == HOUR for a, b in zip(got, got[1:])) and len(got) == 6


def test_dst_fall_back_minute_wildcard_with_fixed_hour_fires_the_hour_once():
    # "* 1 * * *": every minute of 01:xx local, once: 60 slots, not 120.
    got = slots(cron("* 1 * * *", NY), ms("2026-11-01T04:00:00Z"), ms("2026-11-01T08:00:00Z"))
    assert len(got) == 60 and got[0] == ms("2026-11-01T05:00:00Z")


def test_dst_spring_forward_missing_time_fires_once_after_the_gap():
    # 2026-03-08: 02:00 EST -> 03:00 EDT; 02:30 does not exist: fires once at 03:00 EDT (07:00Z).
    got = isos(cron("30 2 * * *", NY), "2026-03-07T00:00:00Z", "2026-03-10T00:00:00Z")
    assert got == ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]


def test_dst_spring_forward_wildcard_hour_skips_nothing_real():
    got = slots(cron("0 * * * *", NY), ms("2026-03-08T00:00:00Z"), ms("2026-03-09T00:00:00Z"))
    assert len(got) == 24 and all(b - a == HOUR for a, b in zip(got, got[1:]))


# ----------------------------------------------------------------------------- intervals
def test_every_s_slots_are_anchor_plus_multiples():
    s = {"every_s": 10}
    anchor = T0 + 500
    assert schedule.next_slot_after(s, T0, anchor) == anchor
    assert schedule.next_slot_after(s, anchor - 1, anchor) == anchor
    assert schedule.next_slot_after(s, anchor, anchor) == anchor + 10 * SEC
    assert schedule.next_slot_after(s, anchor + 15 * SEC, anchor) == anchor + 20 * SEC
    assert schedule.next_slot_after(s, anchor + 20 * SEC, anchor) == anchor + 30 * SEC


@settings(max_examples=200, deadline=None)
@given(every=st.integers(1, 366 * 24 * 3600), anchor=st.integers(0, 2 * T0), delta=st.integers(-10 * DAY, 400 * DAY))
def test_every_s_next_slot_property(every, anchor, delta):
    after = max(0, anchor + delta)
    nxt = schedule.next_slot_after({"every_s": every}, after, anchor)
    assert nxt > after or (after < anchor and nxt == anchor)
    assert nxt >= anchor and (nxt - anchor) % (every * 1000) == 0
    assert nxt == anchor or nxt - every * 1000 <= after


def test_at_is_one_slot():
    s = {"at": T0}
    assert schedule.next_slot_after(s, T0 - 1, 0) == T0
    assert schedule.next_slot_after(s, T0, 0) is None
    assert slots(s, 0, T0 + DAY) == [T0]
    assert slots(s, T0, T0 + DAY) == []
    assert schedule.count_slots(s, T0 - 1, T0, 0, 10) == 1
    assert schedule.last_slots_until(s, 0, T0 + DAY, 0, 5) == [T0]


# ----------------------------------------------------------------------------- iso
def test_iso_formats_utc_with_z_and_ms_only_when_needed():
    assert schedule.iso(T0) == "2026-05-28T20:26:40Z"
    assert schedule.iso(T0 + 7) == "2026-05-28T20:26:40.007Z"
    assert schedule.iso(None) is None
    assert schedule.iso(0) == "1970-01-01T00:00:00Z"


def test_parse_iso_ms_handles_offsets_and_refuses_naive():
    assert ms("2026-06-01T12:00:00+02:00") == ms("2026-06-01T10:00:00Z")
    assert ms("2026-06-01T10:00:00.250z") == ms("2026-06-01T10:00:00Z") + 250
    for bad in ("2026-06-01T12:00:00", "not a time", "", None, 5):
        with pytest.raises(InvalidSpec) as ei:
            schedule.parse_iso_ms(bad, "schedule.at")
        assert ei.value.field == "schedule.at"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 253402300799999))
def test_iso_round_trip(t):
    assert schedule.parse_iso_ms(schedule.iso(t), "x") == t


# ----------------------------------------------------------------------------- counting
def test_count_slots_intervals_exact_and_cron_bounded():
    s = {"every_s": 1}
    assert schedule.count_slots(s, T0, T0 + 30 * DAY, T0, 10) == 30 * 24 * 3600  # arithmetic, no limit
    assert schedule.count_slots(s, T0, T0, T0, 10) == 0
    assert schedule.count_slots(s, T0 + 5, T0, T0, 10) == 0
    c = cron("* * * * *")
    assert schedule.count_slots(c, T0, T0 + HOUR, 0, 1000) == 60
    assert schedule.count_slots(c, T0, T0 + HOUR, 0, 60) == 60
    assert schedule.count_slots(c, T0, T0 + HOUR, 0, 59) is None


def test_iter_slots_respects_limit():
    assert len(slots({"every_s": 1}, T0, T0 + DAY, T0, limit=7)) == 7


INTERVALS = st.integers(1, 7200)
CRONS = st.sampled_from([
    cron("* * * * *"), cron("*/7 * * * *"), cron("*/10 * * * * *"), cron("0 * * * *", NY),
    cron("30 1 * * *", NY), cron("30 2 * * *", BERLIN), cron("15,45 */3 * * *", "Asia/Kolkata"),
    {**cron("*/5 * * * *", NY), "jitter_ms": 120_000, "jitter_key": "job"},
])


@settings(max_examples=150, deadline=None)
@given(every=INTERVALS, anchor=st.integers(T0 - DAY, T0 + DAY), a=st.integers(-2 * DAY, 2 * DAY),
       span=st.integers(0, 200), count=st.integers(0, 50), jitter=st.booleans())
def test_last_slots_until_agrees_with_iter_slots_for_intervals(every, anchor, a, span, count, jitter):
    s = {"every_s": every}
    if jitter and every > 1:  # deterministic per-slot jitter, below the interval (model.validate_job)
        s.update(jitter_ms=(every - 1) * 1000, jitter_key="job")
    after = T0 + a
    until = after + span * every * 1000 // 7 + (a % 1000)
    everything = slots(s, after, until, anchor, limit=10**6)
    assert everything == sorted(set(everything))
    assert schedule.last_slots_until(s, after, until, anchor, count) == (everything[-count:] if count else [])
    assert schedule.count_slots(s, after, until, anchor, 10**6) == len(everything)


@settings(max_examples=40, deadline=None)
@given(s=CRONS, after=st.integers(ms("2026-10-24T00:00:00Z"), ms("2026-11-02T00:00:00Z")),
       span=st.sampled_from([0, 1, 59_999, MIN, 17 * MIN, 2 * HOUR, DAY + 1]), count=st.integers(0, 40))
def test_last_slots_until_agrees_with_iter_slots_for_cron(s, after, span, count):
    until = after + span
    everything = slots(s, after, until)
    assume(len(everything) < 5000)
    assert schedule.last_slots_until(s, after, until, 0, count) == (everything[-count:] if count else [])
    assert schedule.count_slots(s, after, until, 0, 10**6) == len(everything)


@settings(max_examples=40, deadline=None)
@given(s=CRONS, after=st.integers(ms("2026-03-01T00:00:00Z"), ms("2026-11-30T00:00:00Z")))
def test_cron_slots_strictly_increase_and_next_is_first(s, after):
    got = slots(s, after, after + 3 * DAY, limit=50)
    assert got == sorted(set(got)) and all(t > after for t in got)
    if got:
        assert schedule.next_slot_after(s, after, 0) == got[0]
        # no slot between two consecutive ones
        for a, b in zip(got, got[1:]):
            assert schedule.next_slot_after(s, a, 0) == b
