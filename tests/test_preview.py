"""Preview and explain use the same pure functions as the trigger loop."""
from __future__ import annotations

from raftsched.core import model, policy, preview
from raftsched.core.schedule import parse_iso_ms


def spec(schedule, pol="skip", **kw):
    return model.validate_job("j", {"schedule": schedule, "executor": {"type": "shell", "argv": ["true"]},
                                    "misfire": {"policy": pol, **kw}})


def t(s):
    return parse_iso_ms(s, "t")


def test_preview_marks_fall_back_ambiguous_and_fires_once():
    sl = preview.preview(spec({"cron": "30 1 * * *", "timezone": "America/New_York"}), 0, t("2026-10-31T00:00:00Z"), 3)
    assert [s["slot"] for s in sl] == ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert sl[1].get("ambiguous_local_time") is True
    assert sl[2]["dst"] == "fall_back" and sl[2]["utc_offset"] == "-05:00"


def test_preview_marks_spring_forward_slot_after_the_gap():
    sl = preview.preview(spec({"cron": "30 2 * * *", "timezone": "America/New_York"}), 0, t("2026-03-07T00:00:00Z"), 3)
    assert sl[1]["slot"] == "2026-03-08T07:00:00Z"
    assert sl[1]["local"].startswith("2026-03-08T03:00:00")
    assert sl[1]["dst"] == "spring_forward"
    assert "dst" not in sl[0] and "dst" not in sl[2]
    assert not any("dst_skipped" in x for x in sl)  # (run after the gap: nothing skipped)


def test_preview_names_the_local_times_a_skipped_gap_took():
    """A walk: with spring_forward skip, a daily 02:30's missing day was simply absent, and the
    mark sat on the next day, which DST did not change."""
    sched = {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "dst": {"spring_forward": "skip"}}
    sl = preview.preview(spec(sched), 0, t("2027-03-26T00:00:00Z"), 3)
    assert [x["local"][:10] for x in sl] == ["2027-03-26", "2027-03-27", "2027-03-29"]
    assert (sl[2]["dst"], sl[2]["dst_skipped"]) == ("spring_forward", ["2027-03-28T02:30:00"])
    assert "dst_skipped" not in sl[0] and "dst_skipped" not in sl[1]
    # A wildcard hour has no slot in the gap by default: every one it took is named, at most 16.
    sl = preview.preview(spec({"cron": "*/20 * * * *", "timezone": "Europe/Berlin"}), 0, t("2027-03-28T00:50:00Z"), 2)
    assert sl[0]["dst_skipped"] == ["2027-03-28T02:00:00", "2027-03-28T02:20:00", "2027-03-28T02:40:00"], sl
    assert sl[0]["local"].startswith("2027-03-28T03:00:00") and "dst_skipped" not in sl[1]
    sl = preview.preview(spec({"cron": "* * * * * *", "timezone": "Europe/Berlin"}), 0, t("2027-03-28T00:59:59Z"), 2)
    assert len(sl[0]["dst_skipped"]) == 16 and sl[0]["dst_skipped"][0] == "2027-03-28T02:00:00", sl
    # The first slot of a preview is judged against the slot before it.
    sl = preview.preview(spec(sched), 0, t("2027-03-28T12:00:00Z"), 1)
    assert sl[0]["dst_skipped"] == ["2027-03-28T02:30:00"], sl


def test_preview_interval_ignores_dst():
    sl = preview.preview(spec({"every_s": 3600}), t("2026-03-08T00:00:00Z"), t("2026-03-08T00:00:00Z"), 5)
    ms = [s["slot_ms"] for s in sl]
    assert all(b - a == 3_600_000 for a, b in zip(ms, ms[1:]))


def test_explain_is_plan_fire():
    sp = spec({"every_s": 30}, "fire_once")
    lo, hi = t("2026-12-01T00:00:00Z"), t("2026-12-01T00:01:30Z")
    e = preview.explain(sp, lo, lo, hi)
    plan = policy.plan_fire(sp, lo, lo, hi, 0, "explain")
    assert [r["slot_ms"] for r in e["runs"]] == plan["runs"]
    assert e["slots_due"] == 3
    assert e["runs"][-1]["why"].startswith("on time")


def test_explain_skip_daily_job_whose_slot_fell_in_the_window():
    sp = spec({"cron": "0 2 * * *"}, "skip")
    e = preview.explain(sp, 0, t("2026-12-01T01:59:00Z"), t("2026-12-01T02:00:30Z"))
    assert e["runs"] == []
    assert e["recorded"] == [{"state": "skipped", "reason": "misfire", "from": "2026-12-01T02:00:00Z",
                              "to": "2026-12-01T02:00:00Z", "count": 1, "count_at_least": 1,
                              "why": e["recorded"][0]["why"]}]
    assert e["slots_due_exact"] is True
    assert e["next_slot"] == "2026-12-02T02:00:00Z"


def test_explain_of_a_range_too_long_to_count_says_at_least_how_many():
    """Half a year of a cron every 15 minutes (~17 500 slots, past cron_slots_counted_max) under
    fire_all with max_catchup 3 answered slots_due 4: the recorded range's count is unknown
    (null) and added nothing. It adds its lower bound now, and says the figure is a lower bound."""
    sp = spec({"cron": "*/15 * * * *", "timezone": "America/New_York"}, "fire_all", max_catchup=3)
    e = preview.explain(sp, 0, t("2026-06-01T00:00:00Z"), t("2026-12-06T00:00:00Z"))
    (rec,) = e["recorded"]
    assert rec["count"] is None and rec["count_at_least"] == 10_001, rec
    assert e["slots_due"] == len(e["runs"]) + 10_001 and e["slots_due_exact"] is False, e["slots_due"]
    short = preview.explain(sp, 0, t("2026-09-01T00:00:00Z"), t("2026-12-06T00:00:00Z"))
    assert short["slots_due_exact"] is True and short["slots_due"] == 9_216, short["slots_due"]


def test_preview_local_time_of_a_slot_with_milliseconds_has_milliseconds():
    """A start_at of .500 showed local ...00:00:00.500000+00:00 beside slot ...00:00:00.500Z."""
    start = t("2031-01-01T00:00:00.500Z")
    sl = preview.preview(spec({"every_s": 60, "start_at": "2031-01-01T00:00:00.500Z"}), start, start - 1, 2)
    assert [x["slot"] for x in sl] == ["2031-01-01T00:00:00.500Z", "2031-01-01T00:01:00.500Z"]
    assert [x["local"] for x in sl] == ["2031-01-01T00:00:00.500+00:00", "2031-01-01T00:01:00.500+00:00"]
    whole = preview.preview(spec({"every_s": 60}), t("2031-01-01T00:00:00Z"), t("2031-01-01T00:00:00Z"), 1)
    assert whole[0]["local"] == "2031-01-01T00:01:00+00:00"


def test_explain_says_why_slots_within_grace_past_the_on_time_cap_did_not_run_as_on_time():
    """At most max_catchup_max (1 000) slots run as on time at once: older slots within grace_s
    count as missed. explain called the 500 skipped of a 1 500 s outage of an every-second job
    with grace_s 3 600 "missed by more than grace_s" (the newest was 1 000 s late), and under
    fire_all called its catch-up runs "on time"."""
    from raftsched.core import limits
    start = t("2027-01-01T00:00:00Z")
    for pol, runs in (("skip", 1000), ("fire_all", 1003), ("fire_once", 1001)):
        sp = model.validate_job("j", {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]},
                                      "misfire": {"policy": pol, "grace_s": 3600, "max_catchup": 3},
                                      "overlap": {"policy": "allow", "max_concurrent": 5000}})
        e = preview.explain(sp, start, start, start + 1_500_000)
        assert len(e["runs"]) == runs
        (rec,) = e["recorded"]
        assert "more than grace_s" not in rec["why"] and f"newest {limits.max_catchup_max}" in rec["why"], rec
        on_time = [r for r in e["runs"] if r["why"] == "on time (within grace_s)"]
        assert len(on_time) == limits.max_catchup_max
        for r in e["runs"][:runs - limits.max_catchup_max]:
            assert "counted as missed" in r["why"] and pol in r["why"], r
    # A range partly beyond grace_s and partly within it (grace_s 1 200 of a 1 500 s outage).
    sp = model.validate_job("j", {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]},
                                  "misfire": {"policy": "skip", "grace_s": 1200},
                                  "overlap": {"policy": "allow", "max_concurrent": 5000}})
    (rec,) = preview.explain(sp, start, start, start + 1_500_000)["recorded"]
    assert rec["why"] == ("missed by more than grace_s; policy skip records them, or within it but older than "
                          "the newest 1000 slots within it, the most that run as on time at once: counted as "
                          "missed"), rec["why"]
