"""Slot computation: cron (5 and 6 fields, seconds first), time zones and DST, intervals, one-shots."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings, strategies as st

from raftsched.core import limits, schedule
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


# ----------------------------------------------------------------------------- the cron dialect
@pytest.mark.parametrize("expr,expected", [
    # A range with equal ends is that one value (croniter 6.x/7.x read it as '*': daily, hourly).
    ("0 9 * * MON-MON", ["2026-12-07T09:00:00Z", "2026-12-14T09:00:00Z", "2026-12-21T09:00:00Z"]),
    ("0 9 * * 1-1", ["2026-12-07T09:00:00Z", "2026-12-14T09:00:00Z", "2026-12-21T09:00:00Z"]),
    ("0 10-10 * * *", ["2026-12-01T10:00:00Z", "2026-12-02T10:00:00Z", "2026-12-03T10:00:00Z"]),
    ("0 9 1-1 * *", ["2026-12-01T09:00:00Z", "2027-01-01T09:00:00Z", "2027-02-01T09:00:00Z"]),
    ("0 9 * * MON,WED-WED", ["2026-12-02T09:00:00Z", "2026-12-07T09:00:00Z", "2026-12-09T09:00:00Z"]),
    ("0 10-10/5 * * *", ["2026-12-01T10:00:00Z", "2026-12-02T10:00:00Z", "2026-12-03T10:00:00Z"]),
    # Names, either case; 0 and 7 are Sunday.
    ("0 0 * * sun", ["2026-12-06T00:00:00Z", "2026-12-13T00:00:00Z", "2026-12-20T00:00:00Z"]),
    ("0 0 * * 7", ["2026-12-06T00:00:00Z", "2026-12-13T00:00:00Z", "2026-12-20T00:00:00Z"]),
    ("0 0 1 jan,Jul *", ["2027-01-01T00:00:00Z", "2027-07-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
    # Steps: from the start of the range, or from a value to the end of the field.
    ("0 5/8 * * *", ["2026-12-01T05:00:00Z", "2026-12-01T13:00:00Z", "2026-12-01T21:00:00Z"]),
    ("0 0 1-10/4 * *", ["2026-12-05T00:00:00Z", "2026-12-09T00:00:00Z", "2027-01-01T00:00:00Z"]),
    # L: the last day of the month; LW its last weekday; 5L the last Friday; FRI#2 the second.
    ("0 0 L * *", ["2026-12-31T00:00:00Z", "2027-01-31T00:00:00Z", "2027-02-28T00:00:00Z"]),
    ("0 0 LW * *", ["2026-12-31T00:00:00Z", "2027-01-29T00:00:00Z", "2027-02-26T00:00:00Z"]),
    ("0 0 * * 5L", ["2026-12-25T00:00:00Z", "2027-01-29T00:00:00Z", "2027-02-26T00:00:00Z"]),
    ("0 0 * * FRI#2", ["2026-12-11T00:00:00Z", "2027-01-08T00:00:00Z", "2027-02-12T00:00:00Z"]),
    # Day of month and day of week both restricted: either matches (Vixie cron).
    ("0 0 13 * FRI", ["2026-12-04T00:00:00Z", "2026-12-11T00:00:00Z", "2026-12-13T00:00:00Z"]),
    # ... but when one of them starts with '*' both must (a '*/n' too, as in Vixie cron).
    ("0 0 */10 * MON", ["2026-12-21T00:00:00Z", "2027-01-11T00:00:00Z", "2027-02-01T00:00:00Z"]),
    # Aliases.
    ("@hourly", ["2026-12-01T01:00:00Z", "2026-12-01T02:00:00Z", "2026-12-01T03:00:00Z"]),
    ("@daily", ["2026-12-02T00:00:00Z", "2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z"]),
    ("@midnight", ["2026-12-02T00:00:00Z", "2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z"]),
    ("@weekly", ["2026-12-06T00:00:00Z", "2026-12-13T00:00:00Z", "2026-12-20T00:00:00Z"]),
    ("@monthly", ["2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"]),
    ("@yearly", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z"]),
    ("@annually", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z"]),
    # Matches rarely (leap days), but matches: accepted, its next slots computed.
    ("0 0 29 2 *", ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z", "2036-02-29T00:00:00Z"]),
])
def test_cron_dialect(expr, expected):
    schedule.check_cron(expr, ms("2026-12-01T00:30:00Z"))
    got = [schedule.iso(x) for x in schedule.iter_slots(cron(expr), ms("2026-12-01T00:30:00Z"), 2**62, 0, 3)]
    assert got == expected


@pytest.mark.parametrize("expr,words", [
    ("@reboot", "a cluster has no boot"),
    ("@fortnightly", "unknown cron alias"),
    # W (nearest weekday), Quartz's '?' and year field are not supported, and the message says so
    ("0 0 15W * *", "'15W' (the weekday nearest a day of the month) is not supported; LW"),
    ("0 0 1,15w * *", "'15w' (the weekday nearest"),
    ("0 0 ? * *", "'?' (Quartz's \"no specific value\") is not supported: write '*'"),
    ("0 0 * * ?", "'?'"),
    ("0 0 0 1 1 ? 2027", "Quartz's year field is not supported"),
    ("0 0 * * FRI-MON", "day-of-week"),  # a range may not wrap around
    # ... and the message says what to write instead (Vixie cron refuses it too).
    ("0 0 * * SAT-SUN", "day-of-week range SAT-SUN runs past Saturday, which cron does not allow: use SAT,SUN or 6-7"),
    ("0 0 * * fri-mon", "use FRI,SAT,SUN,MON or 5-7,1"),
    ("0 0 0 * * 6-0", "use SAT,SUN or 6-7"),
    ("0 0 * * SAT-SUN/2", "list the days"),
    ("0 0 30 2 *", "day-of-month"),    # 30 February never exists
    ("H * * * *", "not allowed"),
    ("0 0 L/2 * *", "L takes no step"),
    # A crontab line's zone prefix (cronie, a Kubernetes CronJob): said as such, not as "L takes no
    # step" (the L of Berlin, the / of its zone) or "Bad second" (read as six fields).
    ("CRON_TZ=Europe/Berlin 0 2 * * *", "a CRON_TZ= prefix is not part of the expression; write the zone as "
                                        "schedule.timezone ('Europe/Berlin')"),
    ("CRON_TZ=UTC 0 2 * * *", "CRON_TZ= prefix"),
    ("TZ=America/New_York 30 6 * * 1-5", "a TZ= prefix"),
    ("0 0 L/2 * *", "invalid cron expression '0 0 L/2 * *': L takes no step"),
    # Digits that are not ASCII ("²".isdigit() is true, int("²") raises): refused, not a 500.
    ("0 9 * * 1-⁵", "day-of-week"),
    ("0 0 * * ²", "day-of-week"),
    ("0 9 * * 1-٥", "day-of-week"),
])
def test_check_cron_refuses_what_the_dialect_does_not_have(expr, words):
    with pytest.raises(InvalidSpec) as ei:
        schedule.check_cron(expr)
    assert ei.value.field == "schedule.cron" and words in ei.value.message, ei.value.message


def test_check_cron_refuses_an_expression_that_never_matches_again_from_now():
    # Cron has no year field, so "never again" means no match left before the calendar ends (the
    # last leap day datetime can hold is 9996-02-29) or within the search bound. The check starts
    # at the now it is given, not at a fixed year: the same expression passes the day before.
    expr = "0 0 29 2 *"
    schedule.check_cron(expr, ms("9996-02-28T00:00:00Z"))
    with pytest.raises(InvalidSpec) as ei:
        schedule.check_cron(expr, ms("9996-03-01T00:00:00Z"))
    assert "never matches after 9996-03-01T00:00:00Z" in ei.value.message


def test_dst_chatham_fall_back_crosses_an_hour_boundary():
    # Pacific/Chatham, 2026-04-05: 03:45 CHADT (+13:45) -> 02:45 CHAST (+12:45), at 14:00Z, so local
    # 02:45-03:44 happens twice. A wildcard hour fires through both passes, the 02:45-02:59 minutes
    # of the second pass included; fall_back twice makes a fixed hour do the same.
    got = isos(cron("*/5 * * * *", "Pacific/Chatham"), "2026-04-04T13:50:00Z", "2026-04-04T14:10:00Z")
    assert got == ["2026-04-04T13:55:00Z", "2026-04-04T14:00:00Z", "2026-04-04T14:05:00Z", "2026-04-04T14:10:00Z"]
    twice = dict(cron("50 2,3 * * *", "Pacific/Chatham"), dst={"fall_back": "twice"})
    assert isos(twice, "2026-04-04T12:00:00Z", "2026-04-04T16:00:00Z") == [
        "2026-04-04T13:05:00Z",  # 02:50 CHADT, first pass
        "2026-04-04T14:05:00Z",  # 02:50 CHAST, second pass (02:45-02:59 was missed before)
        "2026-04-04T15:05:00Z",  # 03:50 CHAST: after the repeated span, once
    ]
    once = cron("50 2,3 * * *", "Pacific/Chatham")
    assert isos(once, "2026-04-04T12:00:00Z", "2026-04-04T16:00:00Z") == [
        "2026-04-04T13:05:00Z", "2026-04-04T15:05:00Z"]


def test_dst_lord_howe_half_hour_shifts():
    # Australia/Lord_Howe: 2026-04-05 02:00 (+11) -> 01:30 (+10:30) at 15:00Z on 04-04, so
    # 01:30-01:59 repeats; 2026-10-04 02:00 (+10:30) -> 02:30 (+11) at 15:30Z on 10-03.
    assert isos(cron("45 1 * * *", "Australia/Lord_Howe"), "2026-04-04T12:00:00Z", "2026-04-05T12:00:00Z") == [
        "2026-04-04T14:45:00Z"]
    twice = dict(cron("45 1 * * *", "Australia/Lord_Howe"), dst={"fall_back": "twice"})
    assert isos(twice, "2026-04-04T12:00:00Z", "2026-04-05T12:00:00Z") == [
        "2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"]
    # 02:15 does not exist on 10-04: it fires at 02:30 (+11), the first instant after the gap.
    assert isos(cron("15 2 * * *", "Australia/Lord_Howe"), "2026-10-02T12:00:00Z", "2026-10-04T18:00:00Z") == [
        "2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]
    skip = dict(cron("15 2 * * *", "Australia/Lord_Howe"), dst={"spring_forward": "skip"})
    assert isos(skip, "2026-10-02T12:00:00Z", "2026-10-04T18:00:00Z") == [
        "2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"]


def test_dst_spring_forward_wildcard_hour_has_no_slot_in_the_gap_unless_asked():
    # America/New_York, 2026-03-08: 02:00 EST -> 03:00 EDT at 07:00Z. "30 */2" names 02:30, which
    # does not exist: a wildcard hour lets it go by (as every hour goes by); run_after_gap fires it.
    sched = cron("30 */2 * * *", NY)
    assert isos(sched, "2026-03-08T05:00:00Z", "2026-03-08T09:00:00Z") == ["2026-03-08T05:30:00Z", "2026-03-08T08:30:00Z"]
    sched["dst"] = {"spring_forward": "run_after_gap"}
    assert isos(sched, "2026-03-08T05:00:00Z", "2026-03-08T09:00:00Z") == [
        "2026-03-08T05:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:30:00Z"]


# ----------------------------------------------------------------------------- intervals
def test_every_s_slots_are_anchor_plus_multiples():
    """From k = 1 (the first slot one interval after the anchor), or from k = 0 with start_at
    (its phase, a slot itself), whatever the search starts from."""
    s = {"every_s": 10}
    anchor = T0 + 500
    assert schedule.next_slot_after(s, T0, anchor) == anchor + 10 * SEC
    assert schedule.next_slot_after(s, anchor - 1, anchor) == anchor + 10 * SEC
    phased = {"every_s": 10, "start_at": anchor}
    assert schedule.next_slot_after(phased, T0, anchor) == anchor
    assert schedule.next_slot_after(phased, anchor - 1, anchor) == anchor
    assert schedule.next_slot_after(phased, anchor, anchor) == anchor + 10 * SEC
    assert schedule.next_slot_after(s, anchor, anchor) == anchor + 10 * SEC
    assert schedule.next_slot_after(s, anchor + 15 * SEC, anchor) == anchor + 20 * SEC
    assert schedule.next_slot_after(s, anchor + 20 * SEC, anchor) == anchor + 30 * SEC


@settings(max_examples=200, deadline=None)
@given(every=st.integers(1, 366 * 24 * 3600), anchor=st.integers(0, 2 * T0), delta=st.integers(-10 * DAY, 400 * DAY))
def test_every_s_next_slot_property(every, anchor, delta):
    after = max(0, anchor + delta)
    for sched, first in (({"every_s": every}, anchor + every * 1000),  # from one interval after
                         ({"every_s": every, "start_at": anchor}, anchor)):  # the phase is a slot
        nxt = schedule.next_slot_after(sched, after, anchor)
        assert nxt > after
        assert nxt >= first and (nxt - anchor) % (every * 1000) == 0
        assert nxt == first or nxt - every * 1000 <= after


def test_a_jittered_interval_jobs_first_slot_is_one_interval_after_its_anchor():
    """A jittered slot's search looks back by the jitter, and found the anchor itself as a slot
    (a run before the documented first slot, and an extra one beside it) whenever its offset
    was above 0. Jitter only moves slots later."""
    anchor = T0 + 500
    for k in range(40):
        sched = {"every_s": 20, "jitter_ms": 19_000, "jitter_key": f"jx{k}"}
        first = schedule.next_slot_after(sched, anchor, anchor)
        assert anchor + 20 * SEC <= first < anchor + 39 * SEC, (k, first - anchor)
        assert list(schedule.iter_slots(sched, anchor - 5 * SEC, anchor + 20 * SEC - 1, anchor, 5)) == []


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
    # (a NUL ends datetime's parse: "...Z\x00" was the time before it, a walk; "\x00" inside too)
    for bad in ("2026-06-01T12:00:00", "not a time", "", None, 5, "2026-06-01T10:00:00Z\x00",
                "2026-06-01T10:00:00\x00Z", "2026-06-01T10:00:00Z\x7f", "2026-06-01T10:00:00Z\u00a0"):
        with pytest.raises(InvalidSpec) as ei:
            schedule.parse_iso_ms(bad, "schedule.at")
        assert ei.value.field == "schedule.at"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, limits.time_ms_max))
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


def test_dst_a_two_hour_gap_does_not_stop_a_seconds_cron():
    # Antarctica/Troll, 2026-03-29 01:00Z: +00 -> +02, local 01:00-02:59:59 does not exist. A
    # wildcard-hour seconds cron has 7 200 missing times there; the next slot after the gap is
    # still found (it once ran out of its search budget and answered "no more slots").
    got = isos(cron("* * * * * *", "Antarctica/Troll"), "2026-03-29T00:59:58Z", "2026-03-29T01:00:02Z")
    assert got == ["2026-03-29T00:59:59Z", "2026-03-29T01:00:00Z", "2026-03-29T01:00:01Z", "2026-03-29T01:00:02Z"]
    # Hours 1 and 2 are all missing that day: skipped, the next slot is the next day's 01:00 (+02).
    skip_all = dict(cron("*/30 * 1,2 * * *", "Antarctica/Troll"), dst={"spring_forward": "skip"})
    assert isos(skip_all, "2026-03-29T00:00:00Z", "2026-03-30T01:01:00Z")[:2] == [
        "2026-03-29T23:00:00Z", "2026-03-29T23:00:30Z"]


def _iso_by_datetime(x: int) -> str | None:
    """iso as it was before its seconds were cached: one datetime and strftime a call."""
    from datetime import datetime, timedelta, timezone
    try:
        dt = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=x)
    except OverflowError:
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{x % 1000:03d}Z" if x % 1000 else dt.strftime("%Y-%m-%dT%H:%M:%SZ")


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.integers(min_value=-62_135_596_800_001, max_value=253_402_300_800_000),
                 st.integers(), st.sampled_from([0, -1, -999, -1000, -1001, 999, 1000, limits.time_ms_max,
                                                 limits.time_ms_max + 1])))
def test_iso_renders_any_millisecond_as_datetime_does(x):
    assert schedule.iso(float("inf")) is None and schedule.iso(float("nan")) is None
    assert schedule.iso(x) == _iso_by_datetime(x)
    assert schedule.iso(x) == schedule.iso(x)  # the second call comes from the cache
    if 0 <= x <= limits.time_ms_max:
        assert schedule.parse_iso_ms(schedule.iso(x), "t") == x
