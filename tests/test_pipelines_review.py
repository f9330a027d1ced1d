"""Pipelines and the review of 2026-12-06: a parent deleted with ?force=true while its run had
no final outcome, a ``match: latest`` child of a deleted parent, and a child's slot that had a
manual run already. Each slot is decided once, and none waits for good."""
from __future__ import annotations

from raftsched.core import commands

from core_helpers import restored
from backfill_helpers import backfill_cmd, step
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, put, tick

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
    while calls < 10:
        calls += 1
        items, after = pipelines.unreported(s, S1 + 2 * SEC, 10, after, 1)
        found += items
        if after is None:
            break
    assert sorted(found) == [[f"c{i}", S1, S1] for i in range(3)] and after is None and calls >= 3


# ------------------------------------------------------------------ a review of the sweep's read
def _sweep(s, now):
    """The leader's expire_joins: overdue joins, then slots no parent has reported yet."""
    from raftsched.core import pipelines
    items = pipelines.overdue(s, now, 100)
    more, _ = pipelines.unreported(s, now, 100, None, 8192)
    items += more
    return apply(s, commands.join_expire(now, joins=items)) if items else None


def test_a_manual_parent_run_of_an_old_slot_is_no_slot_of_its_children():
    """A manual run of a for a past slot (no propagate) has the id a@slot when the slot has no
    entry: the first cut of the sweep recorded t's slot upstream_timeout for it."""
    s = chain_state(("a", job_raw(every_s=10)), ("t", job_raw(after=["a"], max_wait_s=5)))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, True)
    lease(s, S1 + 2)
    res = apply(s, commands.trigger_job(S1 + 3, None, name="a", extra={"slot": T0}))
    assert res["ok"] and res["run"] == f"a@{T0}", res
    _sweep(s, S1 + 4)
    assert f"t@{T0}" not in s.runs, s.runs[f"t@{T0}"]


def test_a_propagating_manual_run_of_an_old_slot_starts_its_childs_wait_when_it_reports():
    """docs/pipelines.md: a manual run's children wait from when it reports. The first cut of
    the sweep recorded t@old, and a's outcome then took the record back and ran t: twice decided."""
    s = chain_state(("a", job_raw(every_s=10)), ("t", job_raw(after=["a"], max_wait_s=5)))
    tick(s, S1)
    res = apply(s, commands.trigger_job(S1 + 3, None, name="a", extra={"slot": T0, "propagate": True}))
    assert res["ok"] and res["run"] == f"a@{T0}", res
    _sweep(s, S1 + 4)
    assert f"t@{T0}" not in s.runs
    (g,) = [g for g in lease(s, S1 + 5) if g["id"] == f"a@{T0}"]
    finish(s, g, S1 + 6, True)
    assert _state(s, f"t@{T0}") == ("queued", None)


def test_a_backfills_parent_runs_are_no_slots_for_the_sweep():
    s = chain_state(("a", job_raw(every_s=10)), ("t", job_raw(after=["a"], max_wait_s=5)))
    now = S1 + 100 * SEC
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, True)
    lease(s, S1 + 2)
    assert apply(s, backfill_cmd(s, "a", T0 - 100 * SEC, T0, now, bf_id="bf", max_concurrent=4))["ok"]
    step(s, "bf", now + 1)
    _sweep(s, now + 2)
    assert [r["id"] for r in s.runs.values() if r["job"] == "t" and r["state"] == "skipped"] == []


def test_a_grandchild_waits_from_its_triggered_parents_report_not_from_the_slot():
    s = chain_state(("g", job_raw(every_s=10)), ("p", job_raw(after=["g"])),
                    ("c", job_raw(after=["p"], max_wait_s=30)))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 25 * SEC, True)  # g@S1 took 25 s: p@S1 queued
    (gp,) = lease(s, S1 + 26 * SEC)
    _sweep(s, S1 + 31 * SEC)  # p has run 5 s: c's wait counts from p's report, to come
    assert f"c@{S1}" not in s.runs
    finish(s, gp, S1 + 35 * SEC, True)
    assert _state(s, f"c@{S1}") == ("queued", None)


def test_a_slot_inside_a_childs_recorded_range_is_not_proposed_again_and_again():
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(every_s=10)), ("c", job_raw(after=["a", "b"], max_wait_s=1)))
    from raftsched.core import pipelines
    tick(s, T0 + 45 * SEC)  # a's four slots recorded as one range, c's too; b's runs queued
    assert s.runs[f"c@{S1}"].get("slot_to") == T0 + 40 * SEC
    for k in range(3):
        items, _ = pipelines.unreported(s, T0 + (50 + k) * SEC, 100, None, 8192)
        assert items == [], items


def test_a_slot_run_by_hand_keeps_its_record_and_its_children_are_not_left_waiting():
    """d@S1 recorded (a failed), run by hand as d@S1#manual; b's slot S1 run by hand with
    propagate: the rearm took d@S1's record back (and e's), _create then made nothing (the slot
    had its run), and e waited for a report of d that never comes. The slot run by hand keeps its
    record, and nothing below it is re-armed."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("d", job_raw(after=["b"])),
                    ("e", job_raw(after=["d"])))
    tick(s, S1)
    finish(s, lease(s, S1)[0], S1 + 1, False)
    made = apply(s, commands.trigger_job(S1 + 2, None, name="d", extra={"slot": S1}))
    assert made["run"] == f"d@{S1}#manual"
    (gd,) = lease(s, S1 + 3)
    finish(s, gd, S1 + 4, True)
    again = apply(s, commands.trigger_job(S1 + 5, None, name="b", extra={"slot": S1, "propagate": True}))
    (gb,) = [g for g in lease(s, S1 + 6) if g["id"] == again["run"]]
    finish(s, gb, S1 + 7, True)
    assert _state(s, f"d@{S1}")[0] == "skipped" and _state(s, f"e@{S1}")[0] == "skipped"
    assert s.pipes.joins == {}
    assert restored(s).snapshot() == s.snapshot()


def test_a_held_childs_view_of_a_slot_from_before_it_existed():
    """A cascade holds a child's slots from before the child was created (no join): its view
    says so, where the first cut of the waiting-view rule answered 404."""
    from raftsched.core import pipelines
    from test_pipelines_cascade import _four_dead_slots
    s = chain_state(("a", job_raw(every_s=10)))
    now = _four_dead_slots(s) + 60 * SEC
    assert put(s, "late", job_raw(after=["a"]), now)["ok"]
    now += SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=1, cascade="children"))["ok"]
    held: list = []
    for _ in range(5):
        now += SEC
        step(s, "bf", now)
        for g in lease(s, now):
            finish(s, g, now, True)
        held = sorted(s.pipes.held)
        if held:
            break
    assert held and s.runs.get(held[0]) is None
    view = pipelines.waiting_run(s, held[0])
    assert view is not None and "held by backfill" in pipelines.waiting_text(view["waiting_on"]), view


def test_explain_lists_a_slot_no_parent_has_reported_yet_as_waiting():
    """explain's ``waiting`` (pipelines.pending) read joins only: rd@S1, waiting on a's run still
    running, was missing from it while GET /v1/runs/rd@S1 said waiting."""
    from raftsched.core import pipelines
    s = chain_state(("a", job_raw(every_s=10)), ("rd", job_raw(after=["a"])))
    tick(s, S1)
    (g,) = lease(s, S1)
    (w,) = pipelines.pending(s, "rd", 20)
    assert w["run"] == f"rd@{S1}" and w["waiting_on"][0]["state"] == "running", w
    assert pipelines.waiting_run(s, f"rd@{S1}")["state"] == "waiting"
    finish(s, g, S1 + 1, True)
    assert pipelines.pending(s, "rd", 20) == []


def test_a_forced_delete_of_a_parent_with_a_backlog_records_each_childs_slots_as_ranges():
    """a's 40 slots queued (no worker), b and d after it, c after b; b ran one slot by hand. A
    forced delete of a records each child's slots dependency_missing as ranges around what the
    child decided itself (one record a slot made 40 records a child, and a backlog of 10 000
    with 16 children 160 000 in one command), and c follows b's ranges."""
    from raftsched.core import limits
    from raftsched.core.records import RECORDED
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("d", job_raw(after=["a"])),
                    ("c", job_raw(after=["b"])))
    last = T0 + 400 * SEC
    tick(s, last)
    slots = sorted(s.runs[r]["slot"] for r in s.history["a"])
    assert len(slots) == 40 > limits.delete_slots_recorded_one_by_one
    mid = slots[20]
    assert apply(s, commands.trigger_job(last, None, name="b", extra={"slot": mid}))["ok"]
    assert apply(s, commands.delete_job(last + 1, None, name="a", force=True))["ok"]

    def entries(job):
        return [(s.runs[r]["slot"], s.runs[r].get("slot_to"), s.runs[r].get("count"), s.runs[r].get("reason"))
                for r in s.history[job] if s.runs[r]["kind"] == "recorded"]
    assert entries("d") == [(slots[0], slots[-1], 40, "dependency_missing")]
    assert entries("b") == [(slots[0], slots[19], 20, "dependency_missing"), (slots[21], slots[-1], 19, "dependency_missing")]
    assert s.jobs["b"]["stats"][RECORDED] == 39 and s.jobs["d"]["stats"][RECORDED] == 40
    assert sorted((x[0], x[1], x[3]) for x in entries("c")) == [(slots[0], slots[19], "upstream_missed"),
                                                        (slots[21], slots[-1], "upstream_missed")]
    assert restored(s).snapshot() == s.snapshot()
