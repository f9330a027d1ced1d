"""A pipeline child's slot missed with cause ``upstream`` says which of the two it was
(core/deadlines.py explain): its parents had not decided the slot yet when the instant passed,
or their outcome recorded it. Before, the sentence always said "its parents decided it would not
run (... upstream_* or dependency_missing)", also while the parent was still running its second
attempt: nothing was decided yet (docs/notifications.md, "Deadlines")."""
from __future__ import annotations

from raftsched.core import deadlines
from raftsched.node.views import deadline_view

from core_helpers import SEC, T0, new_state
from pipeline_helpers import EXEC, put
from test_core_deadlines import acquire, complete, tick


def _why(s, rid: str) -> str:
    view = deadline_view(deadlines.slot_view(s, rid))
    assert deadlines.PARENTS_KEY not in view, view  # what explain reads is not shown as a field
    return view["why"]


def test_an_upstream_miss_while_the_parent_still_runs_says_not_decided_yet_then_what_was_decided() -> None:
    from raftsched.core import pipelines as _p  # noqa: F401  (binds the hooks)
    s = new_state()
    assert put(s, "a", {"schedule": {"every_s": 60}, "executor": EXEC, "misfire": {"policy": "fire_all"},
                        "retry": {"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0, "jitter": 0}})["ok"]
    assert put(s, "b", {"after": ["a"], "executor": EXEC, "deadline": {"succeed_within_s": 20}})["ok"]
    s1 = T0 + 60 * SEC
    tick(s, s1)
    (g1,) = acquire(s, s1 + SEC)
    assert complete(s, s1 + 2 * SEC, g1, False)["ok"]  # attempt 1 fails: retried
    (g2,) = acquire(s, s1 + 3 * SEC)
    assert (g2["id"], s.runs[g2["id"]]["attempt"], s.runs[g2["id"]]["state"]) == (f"a@{s1}", 2, "running")
    tick(s, s1 + 21 * SEC)  # b's instant passes while a runs its attempt 2 of 2
    r = deadlines.slot_view(s, f"b@{s1}")
    assert (r["state"], r["cause"]) == ("missed", "upstream"), r
    why = _why(s, f"b@{s1}")
    assert "decided it would not run" not in why, why
    assert "its parents had not decided the slot yet" in why, why
    # a dies: b's slot is recorded upstream_failed; the record ends missed, and says so now
    assert complete(s, s1 + 30 * SEC, g2, False)["ok"]
    assert s.runs[f"b@{s1}"]["reason"] == "upstream_failed"
    why = _why(s, f"b@{s1}")
    assert "its parents decided it would not run (its slot was recorded upstream_failed" in why, why


def test_an_upstream_miss_whose_parents_then_let_the_child_run_says_they_had_not_decided_then() -> None:
    from raftsched.core import pipelines as _p  # noqa: F401  (binds the hooks)
    s = new_state()
    assert put(s, "a", {"schedule": {"every_s": 60}, "executor": EXEC, "misfire": {"policy": "fire_all"},
                        "retry": {"max_attempts": 1}})["ok"]
    assert put(s, "b", {"after": ["a"], "executor": EXEC, "deadline": {"succeed_within_s": 20},
                        "retry": {"max_attempts": 1}})["ok"]
    s1 = T0 + 60 * SEC
    tick(s, s1)
    (ga,) = acquire(s, s1 + SEC)
    tick(s, s1 + 21 * SEC)
    assert complete(s, s1 + 30 * SEC, ga, True)["ok"]  # b runs now, and fails: missed for good
    (gb,) = acquire(s, s1 + 31 * SEC)
    assert gb["id"] == f"b@{s1}"
    assert complete(s, s1 + 32 * SEC, gb, False)["ok"]
    r = deadlines.slot_view(s, f"b@{s1}")
    assert (r["state"], r["cause"]) == ("missed", "upstream"), r
    why = _why(s, f"b@{s1}")
    assert "decided it would not run" not in why and "let it run afterwards" in why, why


def test_a_record_alone_says_both_cases() -> None:
    r = {"state": "missed", "deadline": "succeed_within_s", "cause": "upstream", "instant": T0, "judged_at": T0 + SEC}
    why = deadlines.explain(r)
    assert "parents decided it would not run" in why and "had not decided the slot yet" in why, why




def test_the_slots_of_a_range_the_parents_outage_recorded_say_decided_with_its_reason() -> None:
    """A's missed slots (ten minutes without a leader, misfire skip) are one recorded range, and
    so are the child's: each of the child's slots of it says its parents decided it, naming the
    range's reason, in a listing as in one slot's view."""
    from raftsched.core import pipelines as _p  # noqa: F401  (binds the hooks)
    from pipeline_helpers import job_raw
    s = new_state()
    assert put(s, "a", job_raw(every_s=60, misfire={"policy": "skip", "grace_s": 1}))["ok"]
    assert put(s, "b", job_raw(after=["a"], deadline={"succeed_within_s": 20}))["ok"]
    tick(s, T0 + 60 * SEC)
    tick(s, T0 + 11 * 60 * SEC)
    (rng,) = [r for r in s.runs.values() if r["job"] == "b" and "slot_to" in r]
    rows = [d for d in deadlines.listing(s, "missed", "b", None, None, 100)
            if rng["slot"] <= d["slot"] <= rng["slot_to"]]
    assert len(rows) == rng["count"] > 1, rows
    for d in rows:
        why = deadline_view(d)["why"]
        assert f"its parents decided it would not run (its slot was recorded {rng['reason']}" in why, why
    assert _why(s, f"b@{rng['slot_to']}") == deadline_view(rows[0])["why"]
