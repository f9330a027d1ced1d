"""A backfill or bulk dead-letter command holds only numbers a snapshot can write: apply refuses
a time outside 0..limits.time_ms_max and a rate past the API's (1000 runs a second). Before, a
``from`` of -2**63 (its cursor one below) or a huge ``rate_milli`` (its bucket's tokens) was
stored, and every later snapshot of the replica failed with OverflowError."""
from __future__ import annotations

import msgpack
import pytest

from raftsched.core import commands, limits
from raftsched.core.backfills import RATE_MILLI_MAX

from backfill_helpers import backfill_cmd, step
from core_helpers import DAY, MIN, SEC, T0, apply, new_state, restored, snap_obj, spec_of, tick
from exec_helpers import acq, complete, do

I64 = 2 ** 63


def fired_state():
    s = new_state(("j", spec_of({"every_s": 60}, "skip", grace_s=5, retry={"max_attempts": 1})), now=T0)
    for k in range(1, 6):
        tick(s, T0 + k * MIN)
    return s


def refused_cleanly(s, cmd) -> None:
    before = snap_obj(s, ("applied", "now_ms"))  # (a refused command still moves the state's time)
    res = s.apply_bytes(msgpack.packb(cmd, use_bin_type=True))
    assert not res["ok"] and res["error"]["code"] == "invalid_command", res
    assert snap_obj(s, ("applied", "now_ms")) == before


def test_the_api_bound_on_the_rate_is_apply_bound():
    assert RATE_MILLI_MAX == round(limits.backfill_rate_per_s_max * 1000)


@pytest.mark.parametrize("field,value", [
    ("from", -I64), ("from", -1), ("to", limits.time_ms_max + 1), ("to", I64 - 1),
    ("rate_milli", I64 - 1), ("rate_milli", RATE_MILLI_MAX + 1),
])
def test_a_backfill_out_of_the_bounds_is_refused_and_the_state_still_snapshots(field, value):
    s = fired_state()
    now = T0 + 6 * MIN
    cmd = backfill_cmd(s, "j", T0, now, now, "bf", reprocess="all")
    cmd[field] = value
    refused_cleanly(s, cmd)


@pytest.mark.parametrize("field,value", [
    ("dead_from", -I64), ("dead_from", limits.time_ms_max + 1), ("dead_to", -1), ("dead_to", I64 - 1),
    ("rate_milli", I64 - 1), ("rate_milli", RATE_MILLI_MAX + 1),
])
def test_a_bulk_operation_out_of_the_bounds_is_refused_and_the_state_still_snapshots(field, value):
    s = fired_state()
    now = T0 + 6 * MIN
    fields = {"queue": None, "job": None, "error": None, "dead_from": None, "dead_to": now, "max_count": None,
              "max_concurrent": 1000, "rate_milli": None}
    fields[field] = value
    refused_cleanly(s, commands.make("dlq_bulk", now, None, name="q1", action="requeue", **fields))


def test_the_widest_backfill_and_fastest_rate_the_api_allows_snapshot_after_a_long_idle():
    s = fired_state()
    now = T0 + 6 * MIN
    res = apply(s, backfill_cmd(s, "j", T0 + MIN, now, now, "bf", reprocess="all", rate_milli=RATE_MILLI_MAX,
                                max_concurrent=2))
    assert res["ok"], res
    later = now + 3650 * DAY
    assert step(s, "bf", later)["created"] == 2
    for g in acq(s, later + SEC):
        assert complete(s, later + SEC, g["id"], g["token"])["ok"]
    step(s, "bf", later + 2 * SEC)
    for g in acq(s, later + 3 * SEC):
        assert complete(s, later + 3 * SEC, g["id"], g["token"], ok=False, error="boom")["ok"]
    res = do(s, "dlq_bulk", later + 4 * SEC, name="q1", action="requeue", queue=None, job=None, error=None,
             dead_from=0, dead_to=limits.time_ms_max, max_count=None, max_concurrent=1000,
             rate_milli=RATE_MILLI_MAX)
    assert res["ok"], res
    assert step(s, "q1", later + 365 * DAY)["ok"]
    assert snap_obj(restored(s)) == snap_obj(s)
