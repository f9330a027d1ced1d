"""policy.plan_fire: the misfire rules of DESIGN.md section 4, pinned down by examples and properties."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import limits, policy, schedule

from core_helpers import DAY, HOUR, MIN, SEC, T0, spec_of
from raftsched.core.policy import backoff_ms

POLICIES = ("fire_all", "fire_once", "skip")


def plan(spec, cursor, now, anchor=T0, gen=7, name="j"):
    return policy.plan_fire(spec, anchor, cursor, now, gen, name)


def rec_total(p) -> int:
    return sum(r[4] for r in p["rec"])


def check_shape(p, spec, anchor, cursor, now):
    """Rules every plan obeys, whatever the policy."""
    runs = p["runs"]
    assert runs == sorted(set(runs))
    assert all(cursor < s <= now for s in runs)
    assert p["after"] == cursor and p["upto"] == now
    nxt = schedule.next_slot_after(spec["schedule"], now, anchor)
    assert p["next"] == nxt and (nxt is None or nxt > now)
    for state, reason, lo, hi, _count in p["rec"]:
        assert state in ("skipped", "coalesced") and isinstance(reason, str)
        assert cursor < lo <= hi <= now
        assert not any(lo <= s <= hi for s in runs), "a slot is both a run and recorded"
    los = sorted((r[2], r[3]) for r in p["rec"])
    assert all(a[1] < b[0] for a, b in zip(los, los[1:])), "records overlap"


# ----------------------------------------------------------------------------- on time
def test_nothing_due_plans_nothing():
    spec = spec_of({"every_s": 10})
    assert plan(spec, T0, T0 + 9 * SEC) is None
    assert plan(spec, T0 + 10 * SEC, T0 + 10 * SEC) is None


@pytest.mark.parametrize("pol", POLICIES)
def test_on_time_slot_runs_without_records(pol):
    spec = spec_of({"every_s": 10}, pol)
    p = plan(spec, T0, T0 + 10 * SEC + 40)
    assert p == {"job": "j", "gen": 7, "after": T0, "runs": [T0 + 10 * SEC], "rec": [],
                 "next": T0 + 20 * SEC, "upto": T0 + 10 * SEC + 40}


@pytest.mark.parametrize("pol", POLICIES)
def test_slots_within_grace_all_run_no_records(pol):
    spec = spec_of({"every_s": 10}, pol, grace_s=60)
    p = plan(spec, T0, T0 + 60 * SEC)
    assert p["runs"] == [T0 + k * 10 * SEC for k in range(1, 7)] and p["rec"] == []


@pytest.mark.parametrize("pol", POLICIES)
def test_grace_boundary_is_inclusive(pol):
    spec = spec_of({"every_s": 60}, pol, grace_s=5, max_catchup=0)
    slot = T0 + MIN
    assert plan(spec, T0, slot + 5 * SEC)["runs"] == [slot]
    late = plan(spec, T0, slot + 5 * SEC + 1)
    if pol == "fire_once":
        assert late["runs"] == [slot] and late["rec"] == []
    else:
        assert late["runs"] == [] and late["rec"] == [["skipped", "catchup_limit" if pol == "fire_all" else "misfire", slot, slot, 1]]


def test_cron_on_time_in_timezone():
    spec = spec_of({"cron": "0 9 * * *", "timezone": "Asia/Tokyo"})
    slot = schedule.parse_iso_ms("2026-06-01T00:00:00Z", "t")
    p = plan(spec, slot - HOUR, slot + 2 * SEC, anchor=0)
    assert p["runs"] == [slot] and p["rec"] == [] and p["next"] == slot + DAY


# ----------------------------------------------------------------------------- outages
# every 10 s, grace 5 s, 102 s after the cursor: slots +10..+100 are due; only +100 is on time.
OUTAGE_NOW = T0 + 102 * SEC
MISSED = [T0 + k * 10 * SEC for k in range(1, 10)]
ON_TIME = [T0 + 100 * SEC]


def test_fire_all_runs_oldest_max_catchup_and_records_the_rest():
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)
    p = plan(spec, T0, OUTAGE_NOW)
    assert p["runs"] == MISSED[:3] + ON_TIME
    assert p["rec"] == [["skipped", "catchup_limit", MISSED[3], MISSED[-1], 6]]
    assert len(p["runs"]) + rec_total(p) == 10
    check_shape(p, spec, T0, T0, OUTAGE_NOW)


def test_fire_all_within_max_catchup_runs_everything():
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=100)
    p = plan(spec, T0, OUTAGE_NOW)
    assert p["runs"] == MISSED + ON_TIME and p["rec"] == []


def test_fire_once_runs_latest_missed_and_coalesces_the_others():
    spec = spec_of({"every_s": 10}, "fire_once", grace_s=5, max_catchup=3)
    p = plan(spec, T0, OUTAGE_NOW)
    assert p["runs"] == [MISSED[-1]] + ON_TIME
    assert p["rec"] == [["coalesced", "misfire", MISSED[0], MISSED[-2], 8]]
    check_shape(p, spec, T0, T0, OUTAGE_NOW)


def test_fire_once_with_one_missed_slot_records_nothing():
    spec = spec_of({"every_s": 10}, "fire_once", grace_s=5)
    p = plan(spec, T0, T0 + 17 * SEC)
    assert p["runs"] == [T0 + 10 * SEC] and p["rec"] == []


def test_skip_runs_no_missed_slot_and_records_them():
    spec = spec_of({"every_s": 10}, "skip", grace_s=5)
    p = plan(spec, T0, OUTAGE_NOW)
    assert p["runs"] == ON_TIME
    assert p["rec"] == [["skipped", "misfire", MISSED[0], MISSED[-1], 9]]


def test_docs_worked_example_leader_down_90s():
    # DESIGN.md section 4: the leader was down 90 s and three jobs were due.
    now = T0 + 90 * SEC
    every_min = spec_of({"every_s": 60}, "fire_all", grace_s=5)
    every_10 = spec_of({"every_s": 10}, "fire_once", grace_s=5)
    every_30 = spec_of({"every_s": 30}, "skip", grace_s=5)
    a, b, c = plan(every_min, T0, now), plan(every_10, T0, now), plan(every_30, T0, now)
    assert a["runs"] == [T0 + MIN] and a["rec"] == []
    assert b["runs"] == [T0 + 80 * SEC, T0 + 90 * SEC]
    assert b["rec"] == [["coalesced", "misfire", T0 + 10 * SEC, T0 + 70 * SEC, 7]]
    assert c["runs"] == [T0 + 90 * SEC] and c["rec"] == [["skipped", "misfire", T0 + 30 * SEC, T0 + 60 * SEC, 2]]


@pytest.mark.parametrize("pol", POLICIES)
def test_very_long_outage_every_second_30_days_is_bounded_and_counted_exactly(pol):
    spec = spec_of({"every_s": 1}, pol, grace_s=5, max_catchup=limits.max_catchup_default)
    now = T0 + 30 * DAY
    p = plan(spec, T0, now)
    check_shape(p, spec, T0, T0, now)
    on_time = 6  # now-5s .. now
    assert len(p["runs"]) <= limits.max_catchup_default + on_time
    assert p["runs"][-on_time:] == [now - k * SEC for k in range(on_time - 1, -1, -1)]
    assert len(p["runs"]) + rec_total(p) == 30 * 24 * 3600
    assert len(p["rec"]) == 1


def test_very_long_outage_with_on_time_beyond_the_cap_runs_at_most_cap():
    spec = spec_of({"every_s": 1}, "skip", grace_s=3 * 3600, max_catchup=0)
    now = T0 + 30 * DAY
    p = plan(spec, T0, now)
    check_shape(p, spec, T0, T0, now)
    assert len(p["runs"]) == limits.max_catchup_max
    assert len(p["runs"]) + rec_total(p) == 30 * 24 * 3600


def test_seconds_cron_outage_beyond_the_count_bound_records_null_count():
    # A day of a 6-second cron is 14 400 slots: more than cron_slots_counted_max are between the
    # enumerated head and tail, so the record says "more than" (count null) instead of counting
    # for seconds on the leader's loop.
    spec = spec_of({"cron": "*/6 * * * * *"}, "skip", grace_s=6, max_catchup=50)
    start = T0 - T0 % MIN
    now = start + DAY
    p = plan(spec, start, now, anchor=0)
    # grace 6 s: the last two slots are on time and run; everything older is one record.
    assert p["runs"] == [now - 6 * SEC, now]
    assert len(p["rec"]) == 1 and p["rec"][0][4] is None
    assert p["rec"][0][2] == start + 6 * SEC and p["rec"][0][3] == now - 12 * SEC


@pytest.mark.parametrize("pol,span", [("fire_all", 3 * HOUR), ("fire_once", 3 * HOUR), ("skip", 3 * HOUR)])
def test_seconds_cron_long_outage_is_bounded_and_counted(pol, span):
    # (a day of a 6-second cron is 14 400 slots; each policy over a day costs seconds of croniter)
    spec = spec_of({"cron": "*/6 * * * * *"}, pol, grace_s=6, max_catchup=50)
    start = T0 - T0 % MIN
    now = start + span
    p = plan(spec, start, now, anchor=0)
    check_shape(p, spec, 0, start, now)
    assert len(p["runs"]) <= 50 + 2
    assert p["runs"][-2:] == [now - 6 * SEC, now]
    assert len(p["runs"]) + rec_total(p) == span // (6 * SEC)
    assert len(p["rec"]) == 1
    assert p["next"] == now + 6 * SEC


@pytest.mark.parametrize("slots_due", [1000, 1001, 1002, 1003, 1006, 2001, 2002, 2003, 2005])
@pytest.mark.parametrize("pol", POLICIES)
def test_on_time_slots_run_at_the_enumeration_boundaries(slots_due, pol):
    # every_s 1, grace 5 s: the newest 6 slots are on time, however many are due. Around
    # fire_slots_enumerated_max (1001) due slots some of them sit in the enumerated head.
    spec = spec_of({"every_s": 1}, pol, grace_s=5, max_catchup=10)
    now = T0 + slots_due * SEC
    p = plan(spec, T0, now)
    check_shape(p, spec, T0, T0, now)
    on_time = [now - k * SEC for k in range(5, -1, -1)]
    assert p["runs"][-6:] == on_time
    missed = slots_due - 6
    expected_runs = {"fire_all": min(10, missed), "fire_once": 1, "skip": 0}[pol] + 6
    assert len(p["runs"]) == expected_runs
    assert len(p["runs"]) + rec_total(p) == slots_due


def test_at_job_in_the_past_is_due_once_and_then_done():
    at = T0 - HOUR
    for pol, runs in (("fire_all", [at]), ("fire_once", [at]), ("skip", [])):
        spec = spec_of({"at": at}, pol)
        p = plan(spec, at - 1, T0)
        assert p["runs"] == runs and p["next"] is None
        assert len(p["runs"]) + rec_total(p) == 1


def test_explain_outage_uses_the_same_plan():
    spec = spec_of({"every_s": 10}, "fire_once", grace_s=5)
    e = policy.explain_outage(spec, T0, T0, OUTAGE_NOW)
    assert e["runs"] == plan(spec, T0, OUTAGE_NOW)["runs"]
    quiet = policy.explain_outage(spec, T0, T0, T0 + 5 * SEC)
    assert quiet["runs"] == [] and quiet["next"] == T0 + 10 * SEC


# ----------------------------------------------------------------------------- properties
@settings(max_examples=250, deadline=None)
@given(
    every=st.one_of(st.integers(1, 5), st.integers(1, 600)),
    grace=st.one_of(st.integers(0, 120), st.sampled_from([5, 30, 120])),
    max_catchup=st.integers(0, 30),
    pol=st.sampled_from(POLICIES),
    anchor_off=st.integers(-10**7, 10**7),
    cursor_off=st.integers(0, 10**7),
    n_slots=st.one_of(st.integers(0, 3000), st.integers(995, 1030), st.integers(1995, 2010)),
    extra=st.floats(0, 1),
)
def test_plan_fire_interval_property(every, grace, max_catchup, pol, anchor_off, cursor_off, n_slots, extra):
    e = every * 1000
    anchor = T0 + anchor_off
    cursor = T0 + cursor_off
    now = cursor + n_slots * e + int(extra * (e - 1))
    spec = spec_of({"every_s": every}, pol, grace_s=grace, max_catchup=max_catchup)
    sched = spec["schedule"]
    p = plan(spec, cursor, now, anchor=anchor)
    due = schedule.count_slots(sched, cursor, now, anchor, 0)
    if due == 0:
        assert p is None
        return
    check_shape(p, spec, anchor, cursor, now)
    first = schedule.next_slot_after(sched, cursor, anchor)
    slot = lambda i: first + i * e  # noqa: E731
    g = max(grace * 1000, limits.grace_ms_floor)  # (the trigger's own lateness is no misfire)
    on_time = [slot(i) for i in range(due) if now - slot(i) <= g] if due < 5000 else \
        [s for s in range(anchor + ((now - anchor) // e) * e, now - g - 1, -e)][::-1]
    on_time = [s for s in on_time if s > cursor]
    m = due - len(on_time)
    assert len(p["runs"]) + rec_total(p) == due, "every due slot is a run or recorded, exactly once"
    assert p["runs"][len(p["runs"]) - len(on_time):] == on_time, "on-time slots all run"
    missed_runs = p["runs"][:len(p["runs"]) - len(on_time)]
    if pol == "fire_all":
        k = min(max_catchup, m)
        assert missed_runs == [slot(i) for i in range(k)]
        expected_rec = [["skipped", "catchup_limit", slot(k), slot(m - 1), m - k]] if m > k else []
    elif pol == "fire_once":
        assert missed_runs == ([slot(m - 1)] if m else [])
        expected_rec = [["coalesced", "misfire", slot(0), slot(m - 2), m - 1]] if m > 1 else []
    else:
        assert missed_runs == []
        expected_rec = [["skipped", "misfire", slot(0), slot(m - 1), m]] if m else []
    assert p["rec"] == expected_rec
    assert len(p["runs"]) <= max_catchup + len(on_time) + (1 if pol == "fire_once" else 0)


CRONS = st.sampled_from([
    {"cron": "* * * * *", "timezone": "UTC"},
    {"cron": "*/20 * * * * *", "timezone": "UTC"},
    {"cron": "0 * * * *", "timezone": "America/New_York"},
    {"cron": "30 1 * * *", "timezone": "America/New_York"},
])


@settings(max_examples=60, deadline=None)
@given(
    sched=CRONS, grace=st.integers(0, 300), max_catchup=st.integers(0, 5), pol=st.sampled_from(POLICIES),
    cursor=st.integers(schedule.parse_iso_ms("2026-10-31T00:00:00Z", "t"), schedule.parse_iso_ms("2026-11-02T00:00:00Z", "t")),
    span=st.integers(0, 6 * HOUR), jitter=st.sampled_from([0, 0, 15]),
)
def test_plan_fire_cron_property(sched, grace, max_catchup, pol, cursor, span, jitter):
    extra = {"jitter_s": jitter} if jitter and "*/20" not in sched["cron"] else {}
    spec = spec_of(sched, pol, grace_s=grace, max_catchup=max_catchup, **extra)
    sched = spec["schedule"]
    now = cursor + span
    due = list(schedule.iter_slots(sched, cursor, now, 0, 10**6))
    p = plan(spec, cursor, now, anchor=0)
    if not due:
        assert p is None
        return
    check_shape(p, spec, 0, cursor, now)
    g = max(grace * 1000, limits.grace_ms_floor)  # (the trigger's own lateness is no misfire)
    on_time = [s for s in due if now - s <= g]
    missed = [s for s in due if now - s > g]
    assert set(p["runs"]) <= set(due)
    assert p["runs"][len(p["runs"]) - len(on_time):] == on_time
    assert len(p["runs"]) + rec_total(p) == len(due)
    runs_missed = [s for s in p["runs"] if s in missed]
    if pol == "fire_all":
        assert runs_missed == missed[:max_catchup]
    elif pol == "fire_once":
        assert runs_missed == missed[-1:]
    else:
        assert runs_missed == []
    for _, _, lo, hi, count in p["rec"]:
        assert count == len([s for s in due if lo <= s <= hi])


# ----------------------------------------------------------------------------- wire form
@settings(max_examples=400, deadline=None)
@given(
    every=st.one_of(st.integers(1, 5), st.integers(1, 600)),
    grace=st.integers(0, 10),
    pol=st.sampled_from(POLICIES),
    anchor_off=st.integers(-10**6, 10**6),
    cursor_off=st.integers(-10**6, 10**6),
    now_off=st.integers(-2000, 30_000),
    jitter=st.booleans(),
    ahead=st.one_of(st.just(0), st.just(limits.fire_ahead_ms), st.integers(0, 3000)),
)
def test_plan_fire_compact_is_plan_fire_in_wire_form(every, grace, pol, anchor_off, cursor_off, now_off, jitter, ahead):
    """The trigger's fast path (interval slots all on time) plans exactly what plan_fire plans."""
    extra = {"jitter_s": 1} if jitter and every >= 2 else {}
    spec = spec_of({"every_s": every}, pol, grace_s=grace, **extra)
    anchor, cursor = T0 + anchor_off, T0 + cursor_off
    now = max(cursor, anchor) + now_off
    full = policy.plan_fire(spec, anchor, cursor, now, 7, "j", ahead)
    fast = policy.plan_fire_compact(spec, anchor, cursor, now, 7, "j", ahead)
    assert fast == (None if full is None else policy.compact_entry(full))


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(1, 120),
    grace=st.integers(0, 60),
    pol=st.sampled_from(POLICIES),
    cursor_off=st.integers(0, 10**6),
    late=st.integers(0, 200_000),
    ahead=st.integers(1, 3000),
)
def test_firing_ahead_adds_only_future_slots_and_judges_lateness_by_now(every, grace, pol, cursor_off, late, ahead):
    """Planning ahead fires the same past slots, with the same records, as planning at now;
    what it adds are the slots in (now, now + ahead], all as runs."""
    spec = spec_of({"every_s": every}, pol, grace_s=grace, max_catchup=3)
    cursor = T0 + cursor_off
    now = cursor + late
    at_now = policy.plan_fire(spec, T0, cursor, now, 1, "j")
    ahead_plan = policy.plan_fire(spec, T0, cursor, now, 1, "j", ahead)
    future = [s for s in schedule.iter_slots(spec["schedule"], now, now + ahead, T0, 10**6)]
    past_runs = [] if at_now is None else at_now["runs"]
    assert (ahead_plan or {"runs": []})["runs"] == past_runs + future
    assert (ahead_plan or {"rec": []})["rec"] == ([] if at_now is None else at_now["rec"])
    if ahead_plan is not None:
        assert ahead_plan["upto"] == now + ahead and (ahead_plan["next"] is None or ahead_plan["next"] > now + ahead)


def test_plan_fire_compact_for_cron_falls_back_to_plan_fire():
    spec = spec_of({"cron": "*/5 * * * *", "timezone": "UTC"}, "skip")
    full = policy.plan_fire(spec, T0, T0, T0 + HOUR, 3, "c")
    assert policy.plan_fire_compact(spec, T0, T0, T0 + HOUR, 3, "c") == policy.compact_entry(full)


# ----------------------------------------------------------------------------- start_at
def test_interval_start_at_in_the_future_is_the_first_slot():
    sched = {"every_s": 10, "start_at": T0 + 437}
    anchor, cursor = policy.initial_position(sched, T0 - 5 * SEC)
    assert anchor == T0 + 437
    assert schedule.next_slot_after(sched, cursor, anchor) == T0 + 437
    assert list(schedule.iter_slots(sched, cursor, T0 + 25 * SEC, anchor, 10)) == [T0 + 437, T0 + 10_437, T0 + 20_437]


def test_interval_start_at_in_the_past_keeps_its_phase_and_fires_nothing_before_creation():
    sched = {"every_s": 10, "start_at": T0 + 437}
    anchor, cursor = policy.initial_position(sched, T0 + HOUR + 3 * SEC)
    assert cursor == T0 + HOUR + 3 * SEC
    assert schedule.next_slot_after(sched, cursor, anchor) == T0 + HOUR + 10_437


# ----------------------------------------------------------------------------- retry backoff
RETRIES = st.builds(
    lambda b, m, cap_extra, j, n: {"max_attempts": n, "backoff_s": b, "backoff_multiplier": m,
                                   "backoff_max_s": b + cap_extra, "jitter": j},
    st.sampled_from([0, 0.5, 1, 2, 30]), st.sampled_from([1, 1.5, 2, 10]),
    st.sampled_from([0, 1, 100, 3600]), st.sampled_from([0, 0.1, 0.5, 1]), st.integers(1, 100))


@settings(max_examples=300, deadline=None)
@given(retry=RETRIES, attempt=st.integers(1, 100), run_id=st.text(min_size=1, max_size=20))
def test_backoff_ms_is_capped_exponential_within_the_jitter_fraction(retry, attempt, run_id):
    d = backoff_ms(retry, run_id, attempt)
    assert isinstance(d, int) and d >= 0
    base = min(retry["backoff_max_s"], retry["backoff_s"] * retry["backoff_multiplier"] ** (attempt - 1)) * 1000
    j = retry["jitter"]
    assert base * (1 - j) - 1 <= d <= base * (1 + j), (base, d)
    assert d <= retry["backoff_max_s"] * 1000 * (1 + j)
    assert backoff_ms(retry, run_id, attempt) == d  # deterministic


def test_backoff_ms_grows_by_the_multiplier_until_the_cap():
    r = {"max_attempts": 10, "backoff_s": 1, "backoff_multiplier": 2, "backoff_max_s": 10, "jitter": 0}
    assert [backoff_ms(r, "j@1", n) for n in range(1, 7)] == [1000, 2000, 4000, 8000, 10000, 10000]


def test_backoff_jitter_is_a_hash_of_run_and_attempt():
    r = {"max_attempts": 10, "backoff_s": 100, "backoff_multiplier": 1, "backoff_max_s": 100, "jitter": 0.5}
    same = [backoff_ms(r, "job@1780000000000", 3) for _ in range(5)]
    assert len(set(same)) == 1
    across_attempts = {backoff_ms(r, "job@1780000000000", n) for n in range(1, 21)}
    across_runs = {backoff_ms(r, f"job@{T0 + i * 1000}", 1) for i in range(20)}
    assert len(across_attempts) >= 15 and len(across_runs) >= 15
    spread = across_attempts | across_runs
    assert min(spread) < 100_000 < max(spread), "jitter goes both ways"


# ----------------------------------------------------------------------------- phased take-ups
@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40), st.integers(0, 2**45), st.integers(0, 5_000), st.integers(0, 10_000))
def test_a_phased_horizon_is_never_shorter_than_the_look_ahead_nor_longer_than_its_span(name, now, ahead, span):
    got = policy.phased_ahead_ms(name, now, ahead, span)
    assert ahead <= got <= ahead + span


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=40), st.integers(0, 2**40), st.sampled_from([1000, 2000, 3000]))
def test_a_job_every_second_settles_into_its_own_block_whenever_it_starts(name, start, span):
    """Taken up fire_ahead_ms before each next slot, an every-second job's entries carry
    span / 1 s + 1 slots after the first, which ends where the job's block (its phase) ends."""
    ahead, slot, sizes, ends = 1000, start - start % 1000, [], []
    for _ in range(6):
        now = slot - ahead
        upto = now + policy.phased_ahead_ms(name, now, ahead, span)
        n = (upto - slot) // 1000 + 1
        sizes.append(n)
        ends.append(upto)
        slot += n * 1000
    assert 1 <= sizes[0] <= span // 1000 + 1 and set(sizes[1:]) == {span // 1000 + 1}
    assert len({(e - ends[1]) % (span + 1000) for e in ends[1:]}) == 1, "the same phase every block"


@pytest.mark.parametrize("grace_s", [0, 1])
def test_the_triggers_own_lateness_is_no_misfire_whatever_grace_s(grace_s):
    """``grace_s: 0`` with a job that does not fire ahead (overlap other than allow): its slots
    are fired by the tick after them, a few ms late, and one in four was recorded missed (a
    user's walk). A slot fired within limits.grace_ms_floor is on time; one later is missed."""
    spec = spec_of({"every_s": 10}, "skip", grace_s=grace_s)
    slot = T0 + 10 * SEC
    for late_ms in (1, 50, limits.grace_ms_floor):
        p = plan(spec, T0, slot + late_ms)
        assert p["runs"] == [slot] and p["rec"] == [], late_ms
        assert policy.plan_fire_compact(spec, T0, T0, slot + late_ms, 7, "j")[5] == [slot], late_ms
    p = plan(spec, T0, slot + max(grace_s * 1000, limits.grace_ms_floor) + 1)
    assert p["runs"] == [] and p["rec"] == [["skipped", "misfire", slot, slot, 1]]
