"""``max_since_success_s`` is armed again by the job's own successes, not by a backfill's
(core/deadlines.py on_finish): a backfill's runs are outside the job's health (notify.of_backfill),
and a backfill of last week's slots that succeeds says nothing of a schedule that stopped
running today. Before, such a success moved the base, and the streak's miss came late or never."""
from __future__ import annotations

from raftsched.core import commands

from backfill_helpers import backfill_cmd, backfill_runs, finish_runs, step
from core_helpers import SEC, T0, apply
from test_core_deadlines import acquire, complete, run_to, spec, told_state


def _since_misses(s) -> list[dict]:
    return [e for e in s.outbox.events if e["detail"].get("deadline") == "max_since_success_s"]


def test_a_backfills_success_does_not_arm_max_since_success_again() -> None:
    sp = spec({"every_s": 60}, {"max_since_success_s": 300}, policy_name="skip", grace_s=0)
    s = told_state(("j", sp), now=T0)
    # a run by hand succeeds at t1: the base
    t1 = T0 + 10 * SEC
    trig = apply(s, commands.trigger_job(t1, None, name="j"))
    (g,) = acquire(s, t1)
    assert g["id"] == trig["run"]
    complete(s, t1 + SEC, g, True)
    assert s.deadlines.since["j"][0] == t1 + SEC
    # the scheduled slots are skipped (nobody runs them in time: grace 0, the leader away), and a
    # backfill of two old slots succeeds at t2
    t2 = T0 + 200 * SEC
    run_to(s, t2, t2)  # the slots so far: recorded skipped, one range
    assert apply(s, backfill_cmd(s, "j", T0, T0 + 2 * 60 * SEC, t2, "bf", reprocess="all", max_concurrent=5))["ok"]
    step(s, "bf", t2)
    assert backfill_runs(s, "bf")
    assert finish_runs(s, t2 + SEC) >= 1
    assert all(r["state"] == "succeeded" for r in backfill_runs(s, "bf"))
    assert s.deadlines.since["j"][0] == t1 + SEC, "a backfill's success is not the job's"
    # the miss comes at t1 + 300 s, as if no backfill had run
    run_to(s, t2 + 2 * SEC, t1 + 330 * SEC, 10 * SEC)
    (miss,) = _since_misses(s)
    assert miss["detail"]["since"] == t1 + SEC


def test_a_max_since_success_miss_after_a_backfill_says_why_the_jobs_own_slots_did_not_succeed() -> None:
    """A review: the newest entry of the job's history was a backfill's run (succeeded), so the
    miss said no_slot ("no slot fell due"), while the job's own slots had been recorded skipped
    (misfire). The cause reads the newest of the job's own slots: skipped."""
    sp = spec({"every_s": 60}, {"max_since_success_s": 300}, policy_name="skip", grace_s=0)
    s = told_state(("j", sp), now=T0)
    t1 = T0 + 10 * SEC
    apply(s, commands.trigger_job(t1, None, name="j"))
    (g,) = acquire(s, t1)
    complete(s, t1 + SEC, g, True)
    t2 = T0 + 305 * SEC
    run_to(s, t2, t2)  # the leader away: the slots since recorded skipped (misfire)
    assert s.runs[s.history["j"][-1]]["state"] == "skipped"
    assert apply(s, backfill_cmd(s, "j", T0, T0 + 2 * 60 * SEC, t2, "bf", reprocess="all", max_concurrent=5))["ok"]
    step(s, "bf", t2)
    finish_runs(s, t2 + SEC)
    assert s.runs[s.history["j"][-1]].get("backfill") == "bf"
    run_to(s, t2 + 2 * SEC, t1 + 318 * SEC, 2 * SEC)
    causes = [m["detail"].get("cause") for m in _since_misses(s)]
    assert causes == ["skipped"], causes
