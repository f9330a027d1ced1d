"""core/schedule.py cron_utc_minutes: the minutes of the hour (UTC) a five-field cron may fire on,
its zone's offsets taken into account (pipelines.slots_never_meet reads it). No clock: an instant
is given."""
from __future__ import annotations

from raftsched.core import schedule

AROUND = 1_800_000_000_000  # 2027-01-15, an instant of no meaning


def test_a_cron_fires_on_its_minutes_shifted_by_each_offset_of_its_zone_modulo_the_hour():
    assert schedule.cron_utc_minutes("30 * * * *", "UTC", AROUND) == {30}
    assert schedule.cron_utc_minutes("0 2 * * *", "Europe/Berlin", AROUND) == {0}  # (+1, +2: whole hours)
    assert schedule.cron_utc_minutes("0 * * * *", "Asia/Kathmandu", AROUND) == {15}  # +05:45
    assert schedule.cron_utc_minutes("0 * * * *", "Australia/Lord_Howe", AROUND) == {0, 30}  # +10:30 / +11
    assert schedule.cron_utc_minutes("*/20 * * * *", "Asia/Kolkata", AROUND) == {10, 30, 50}  # +05:30


def test_what_cannot_be_told_is_none():
    assert schedule.cron_utc_minutes("0 0 * * * *", "UTC", AROUND) is None  # a seconds field
    assert schedule.cron_utc_minutes("nonsense", "UTC", AROUND) is None
    assert schedule.cron_utc_minutes("0 * * * *", "Mars/Olympus", AROUND) is None
    assert schedule.cron_utc_minutes("0 * * * *", "UTC", 0) == {0}  # near the epoch: offsets before it not read
