"""Pipelines and the review of 2026-12-06: a parent deleted with ?force=true while its run had
no final outcome, a ``match: latest`` child of a deleted parent, and a child's slot that had a
manual run already. Each slot is decided once, and none waits for good."""
from __future__ import annotations

from raftsched.core import commands

from core_helpers import restored
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, tick

S1 = T0 + 10 * SEC  # the first slot of an every_s 10 job put at T0


def _state(s, rid):
    r = s.runs.get(rid)
    return None if r is None else (r["state"], r.get("reason"))


def test_a_parent_deleted_while_its_run_runs_records_its_only_childs_slot():
    """a@S1 running when a is force-deleted: b (after a alone) had no join for S1, since no
    parent had reported, and its slot was shown waiting for a@S1 for good. It is recorded
    dependency_missing at once, and cascades to b's own child."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, S1)
    (g,) = lease(s, S1)
    assert g["id"] == f"a@{S1}" and f"b@{S1}" not in s.runs
    assert apply(s, commands.delete_job(S1 + 1, None, name="a", force=True))["ok"]
    assert _state(s, f"b@{S1}") == ("skipped", "dependency_missing")
    assert _state(s, f"c@{S1}") == ("skipped", "upstream_missed")
    assert s.pipes.joins == {}
    assert restored(s).snapshot() == s.snapshot()


def test_a_childs_slot_decided_before_the_delete_stays_as_it_is():
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, True)  # b@S1 queued
    tick(s, S1 + 10 * SEC)
    lease(s, S1 + 10 * SEC)  # a@S2 running; b@S1 leased too
    assert apply(s, commands.delete_job(S1 + 10 * SEC + 1, None, name="a", force=True))["ok"]
    assert _state(s, f"b@{S1}")[0] == "running"
    assert _state(s, f"b@{S1 + 10 * SEC}") == ("skipped", "dependency_missing")


def test_a_latest_child_of_a_deleted_parent_records_its_own_slots_as_they_come():
    """g (every 10 s, after a and b, match latest) waited for a's next success for good once a
    was deleted: nothing in its history for any of its slots. Each own slot is now recorded
    dependency_missing, the one waiting at the delete and those after it."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(every_s=10)),
                    ("g", job_raw(every_s=10, after=["a", "b"], match="latest")))
    tick(s, S1)  # g@S1 waits for both
    assert apply(s, commands.delete_job(S1 + 1, None, name="a", force=True))["ok"]
    assert _state(s, f"g@{S1}") == ("skipped", "dependency_missing")
    for k in (2, 3):
        tick(s, T0 + k * 10 * SEC)
        for gr in lease(s, T0 + k * 10 * SEC):
            finish(s, gr, T0 + k * 10 * SEC + 1, True)  # b succeeds each time
        assert _state(s, f"g@{T0 + k * 10 * SEC}") == ("skipped", "dependency_missing"), k
    assert s.pipes.joins == {}
    assert restored(s).snapshot() == s.snapshot()


def test_a_childs_slot_run_by_hand_is_not_run_again_when_its_parents_report():
    """d's slot S1 had a record (b's, itself recorded when a failed), so a trigger of d for S1
    made d@S1#manual, which succeeded; then b's slot S1, triggered by hand with propagate,
    succeeded: d@S1 must not be made and run as well, a second run of the slot."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("d", job_raw(after=["b"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, False)  # a@S1 dead: b@S1 and d@S1 recorded
    assert _state(s, f"b@{S1}")[0] == "skipped" and _state(s, f"d@{S1}")[0] == "skipped"
    made = apply(s, commands.trigger_job(S1 + 2, None, name="d", extra={"slot": S1}))
    assert made["ok"] and made["run"] == f"d@{S1}#manual", made
    (gd,) = lease(s, S1 + 3)
    finish(s, gd, S1 + 4, True)
    again = apply(s, commands.trigger_job(S1 + 5, None, name="b", extra={"slot": S1, "propagate": True}))
    assert again["ok"] and again["created"], again
    (gb,) = [g for g in lease(s, S1 + 6) if g["id"] == again["run"]]
    finish(s, gb, S1 + 7, True)
    assert [g["id"] for g in lease(s, S1 + 8)] == []
    d_runs = [r["id"] for r in s.runs.values() if r["job"] == "d" and r["slot"] == S1 and r["kind"] != "recorded"]
    assert d_runs == [f"d@{S1}#manual"], d_runs


def test_max_wait_s_is_kept_for_a_slot_no_parent_has_reported_yet():
    """t (after a alone, max_wait_s 5): a@S1 runs for 40 s. No join held t@S1, so the leader's
    sweep never saw it, and it was recorded upstream_timeout only when a ended, 35 s late. The
    sweep's unreported read finds it past the wait; join_expire records it then, and a's outcome
    afterwards changes nothing."""
    from raftsched.core import pipelines
    s = chain_state(("a", job_raw(every_s=10)), ("t", job_raw(after=["a"], max_wait_s=5)),
                    ("u", job_raw(after=["a"])))
    tick(s, S1)
    (g,) = lease(s, S1)
    assert pipelines.overdue(s, S1 + 6 * SEC, 10) == []
    assert pipelines.unreported(s, S1 + 4 * SEC, 10, None, 1000) == ([], None)
    items, nxt = pipelines.unreported(s, S1 + 5 * SEC, 10, None, 1000)
    assert items == [["t", S1, S1]] and nxt is None  # u waits up to a day
    res = apply(s, commands.join_expire(S1 + 5 * SEC, joins=items))
    assert res["expired"] == 1, res
    assert _state(s, f"t@{S1}") == ("skipped", "upstream_timeout")
    assert "a@" in s.runs[f"t@{S1}"]["error"] and "max_wait_s" in s.runs[f"t@{S1}"]["error"]
    assert apply(s, commands.join_expire(S1 + 6 * SEC, joins=items))["ignored"] == 1  # once
    assert f"u@{S1}" not in s.runs
    finish(s, g, S1 + 40 * SEC, True)
    assert _state(s, f"t@{S1}") == ("skipped", "upstream_timeout")
    assert _state(s, f"u@{S1}") == ("queued", None)
    # An item for a slot whose parent ended, or that has no parent run, is ignored.
    assert apply(s, commands.join_expire(S1 + 50 * SEC, joins=[["u", S1, S1], ["t", S1 + 10 * SEC, S1 + 10 * SEC]]))[
        "ignored"] == 2
    assert restored(s).snapshot() == s.snapshot()


def test_the_unreported_read_goes_through_the_parents_a_part_at_a_time():
    from raftsched.core import pipelines
    s = chain_state(*[(f"p{i}", job_raw(every_s=10)) for i in range(3)],
                    *[(f"c{i}", job_raw(after=[f"p{i}"], max_wait_s=1)) for i in range(3)])
    tick(s, S1)
    assert len(lease(s, S1)) == 3
    found, after, calls = [], None, 0
    for calls in range(1, 10):
        items, after = pipelines.unreported(s, S1 + 2 * SEC, 10, after, 1)
        found += items
        if after is None:
            break
    assert sorted(found) == [[f"c{i}", S1, S1] for i in range(3)] and after is None and calls >= 3
