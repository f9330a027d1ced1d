"""``max_since_success_s``'s cause is judged from the latest slot whose time had come at the
deadline's instant, not from the newest entry of the job's history (core/deadlines.py,
apply_deadline_judge). Runs are committed up to ~4 s ahead of their slot (docs/design.md, "Firing
ahead"), so the newest entry is usually a queued run of a slot still to come: a user's job every
2 s that failed each time missed with cause ``never_started`` ("its run had not started") while
the slot before the instant had started and failed."""
from __future__ import annotations

from raftsched.core import commands, deadlines

from core_helpers import SEC, T0, apply
from test_core_deadlines import acquire, complete, spec, tick, told_state


def _since_misses(s) -> list[dict]:
    return [e for e in s.outbox.events if e["kind"] == "deadline.missed"
            and e["detail"].get("deadline") == "max_since_success_s"]


def test_a_failing_job_fired_ahead_misses_max_since_success_with_cause_failed() -> None:
    sp = spec({"every_s": 2}, {"max_since_success_s": 3})
    s = told_state(("j", sp), now=T0)
    first = s.jobs["j"]["next"]
    # The trigger takes the job up 0.9 s before its slot, and commits the slots of its span with it.
    tick(s, first - 900, ahead=True)
    assert len(s.history["j"]) > 1, s.history["j"]  # slots still to come are committed already
    (g,) = acquire(s, first)
    assert g["id"] == f"j@{first}"
    assert complete(s, first + 100, g, False)["ok"]
    assert s.runs[f"j@{first}"]["state"] in ("failed", "dead")
    at = T0 + 3 * SEC
    tick(s, at, ahead=True)
    newest = s.runs[s.history["j"][-1]]
    assert newest["slot"] > at and newest["state"] == "queued", newest  # the fired-ahead run
    (miss,) = _since_misses(s)
    assert miss["detail"]["cause"] == "failed", miss
    (r,) = [x for x in deadlines.listing(s, "missed", "j", None, None, 10) if x["deadline"] == "max_since_success_s"]
    assert r["cause"] == "failed"
    assert "its run had failed" in deadlines.explain(r)


def test_max_since_success_with_only_a_slot_still_to_come_fired_ahead_says_no_slot() -> None:
    """A success, then a window in which no slot came: the run fired ahead for the coming slot
    (queued, its slot after the instant) is not the reason (``never_started``): no slot fell due
    (``no_slot``)."""
    sp = spec({"every_s": 5}, {"max_since_success_s": 3})
    s = told_state(("j", sp), now=T0)
    first = s.jobs["j"]["next"]
    trig = apply(s, commands.trigger_job(first - 4500, None, name="j"))
    (g,) = acquire(s, first - 4500)
    assert g["id"] == trig["run"]
    assert complete(s, first - 4000, g, True)["ok"]  # the window ends at first - 1000
    tick(s, first - 900, ahead=True)  # the next slot is committed ahead, then the sweep judges
    newest = s.runs[s.history["j"][-1]]
    assert newest["slot"] >= first and newest["state"] == "queued", newest
    causes = [m["detail"]["cause"] for m in _since_misses(s)]
    assert causes == ["no_slot"], causes
