"""raftsched/core/fire.py, the fire handler: planned slots become runs and records. Driven through
apply as a replica applies it (pure: no network, no clock; every time is an offset from T0).

What it promises: an entry is checked whole before any applies, and a refusal names what is
wrong and changes nothing (I3); a slot becomes at most one run, however often its fire is
proposed (I2); every slot an entry covers is a run or inside a record (I5); the overlap policies
and a full queue decide as docs/misfire.md says; a job's history stays within its bound, never
dropping an active run; and the inline fast path gives the state the general path gives, byte for
byte, with the same indexes. tests/test_state.py holds the older fire cases (malformed entries in
both forms, the wire and map forms alike, stale plans by generation and cursor), and
tests/test_state_fast_paths.py the random comparison of the two paths.
"""
from __future__ import annotations

import random
import types

import pytest

from raftsched.core import commands, fire, limits, policy
from raftsched.core.model import TERMINAL_STATES
from raftsched.core.records import LAG_LAST, RECORDED, RUNS

from core_helpers import (complete_many, SEC, T0, apply, counters, new_state, next_due_ms, pop_due, put_cmd, refused,
                          repush, restored, runs_of, spec_of)

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)


def make(op: str, now: int, **fields) -> dict:
    return commands.make(op, now, None, **fields)


def entry(job="a", gen=1, after=T0, upto=T0 + 10 * SEC, runs=(T0 + 10 * SEC,), rec=(), nxt=T0 + 20 * SEC) -> dict:
    """A fire entry in its map form (policy.plan_fire's)."""
    return {"job": job, "gen": gen, "after": after, "upto": upto, "next": nxt, "runs": list(runs),
            "rec": [list(r) for r in rec]}


def wire(e: dict) -> list:
    """The same entry in the trigger's wire form (policy.compact_entry)."""
    return [e["job"], e["gen"], e["after"], e["upto"], e["next"], e["runs"], e["rec"]]


def tick_wire(s, now: int, ahead_ms: int = 0):
    """One tick of the trigger as it proposes: the due jobs' plans in wire form, one command."""
    jobs = pop_due(s, now, limits.fire_entries_max, ahead_ms)
    plans = [(j["name"], policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], j["name"],
                                                  ahead_ms)) for j in jobs]
    repush(s, [n for n, p in plans if p is None])
    entries = [p for _, p in plans if p is not None]
    return apply(s, make("fire", now, entries=entries)) if entries else None


def acquire(s, now: int, n: int = 10) -> list[dict]:
    return apply(s, make("acquire", now, worker="w", queues=None, max=n, ttl=30_000))["runs"]


def complete(s, now: int, grants: list[dict]) -> None:
    res, each = complete_many(s, make("complete_many", now, results=[{"run": g["id"], "token": g["token"],
                                                                        "success": True} for g in grants]))
    assert all(r["ok"] for r in each), res


# ----------------------------------------------------------------------------- checks (I3)
def test_fire_needs_a_bounded_list_of_entries():
    s = new_state(("a", EVERY10))
    for entries in ("a", None, ["x"] * (limits.fire_entries_max + 1)):
        res = refused(s, make("fire", T0 + 10 * SEC, entries=entries), "invalid_command")
        assert res["error"]["message"] == "fire needs a bounded list of entries"


#: (an entry, the refusal's message): each check of check_fire_entry, check_records and
#: check_disjoint, for the job "a" (cursor T0, generation 1).
MALFORMED = [
    ("a", "fire entry is not a map or a 7-item list"),
    ({k: v for k, v in entry().items() if k != "gen"}, "fire entry needs job, gen, after, upto"),
    (entry(job=None), "fire entry needs job, gen, after, upto"),
    (entry(gen="1"), "fire entry needs job, gen, after, upto"),
    (entry(gen=True), "fire entry needs job, gen, after, upto"),
    (entry(upto=float(T0 + 10 * SEC)), "fire entry needs job, gen, after, upto"),
    (entry(runs=["x"]), "fire entry runs malformed"),
    (entry(runs=[T0 + 10.0 * SEC]), "fire entry runs malformed"),
    (entry(upto=T0 + 10_000 * SEC, runs=range(T0 + SEC, T0 + (fire.FIRE_ENTRY_RUNS_MAX + 2) * SEC, SEC)),
     "fire entry runs malformed"),
    (entry(upto=T0 + 20 * SEC, runs=[T0 + 20 * SEC, T0 + 10 * SEC]), "fire entry runs must be ascending, unique and inside (after, upto]"),
    (entry(upto=T0 + 20 * SEC, runs=[T0 + 10 * SEC, T0 + 10 * SEC]), "fire entry runs must be ascending, unique and inside (after, upto]"),
    (entry(runs=[T0]), "fire entry runs must be ascending, unique and inside (after, upto]"),
    (entry(runs=[T0 + 11 * SEC]), "fire entry runs must be ascending, unique and inside (after, upto]"),
    (entry(upto=T0 - SEC, runs=()), "fire entry upto must not be before after"),
    (entry(nxt=T0 + 10 * SEC), "fire entry next must be after upto"),
    (entry(nxt="later"), "fire entry next must be after upto"),
    (entry(runs=(), rec=[["skipped", "x", T0 + SEC, T0 + SEC, 1]] * (fire.RECORDS_PER_ENTRY_MAX + 1)), "records malformed"),
    (entry(runs=(), rec=[["ran", "x", T0 + 10 * SEC, T0 + 10 * SEC, 1]]), "record malformed"),
    (entry(runs=(), rec=[["skipped", "x", T0, T0 + 10 * SEC, 2]]), "record malformed"),             # from the cursor
    (entry(runs=(), rec=[["skipped", "x", T0 + 10 * SEC, T0 + 20 * SEC, 2]]), "record malformed"),  # past upto
    (entry(runs=(), rec=[["skipped", "x", T0 + 10 * SEC, T0 + 5 * SEC, 1]]), "record malformed"),   # to before from
    (entry(runs=(), rec=[["skipped", "x", T0 + 10 * SEC, T0 + 10 * SEC, "1"]]), "record malformed"),
    (entry(upto=T0 + 20 * SEC, runs=[T0 + 20 * SEC], rec=[["skipped", "x", T0 + 10 * SEC, T0 + 20 * SEC, 2]], nxt=T0 + 30 * SEC),
     "runs and records overlap"),
]


#: Each in its map form, and in the wire form where it has one: what the inline check of the wire
#: form does not pass goes to the full check, which must name the same fault.
MALFORMED_FORMS = [pytest.param(bad, message, id=f"map-{i}") for i, (bad, message) in enumerate(MALFORMED)] + [
    pytest.param(wire(bad), message, id=f"wire-{i}") for i, (bad, message) in enumerate(MALFORMED)
    if isinstance(bad, dict) and set(bad) == set(entry())]


@pytest.mark.parametrize("bad,message", MALFORMED_FORMS)
def test_a_malformed_entry_is_refused_naming_what_is_wrong_and_changes_nothing(bad, message):
    s = new_state(("a", EVERY10))
    res = refused(s, make("fire", T0 + 10 * SEC, entries=[bad]), "invalid_command")
    assert res["error"]["message"] == message


def test_one_malformed_entry_refuses_the_whole_command():
    s = new_state(("a", EVERY10), ("b", EVERY10))
    good = wire(entry())
    bad = entry(job="b", runs=[T0 + 11 * SEC])
    refused(s, make("fire", T0 + 10 * SEC, entries=[good, bad]), "invalid_command")
    assert s.runs == {} and s.jobs["a"]["cursor"] == T0


def test_records_and_runs_may_touch_without_overlapping():
    s = new_state(("a", EVERY10))
    e = entry(upto=T0 + 30 * SEC, runs=[T0 + 30 * SEC], rec=[["skipped", "misfire", T0 + 10 * SEC, T0 + 20 * SEC, 2]],
              nxt=T0 + 40 * SEC)
    assert apply(s, make("fire", T0 + 30 * SEC, entries=[e])) == {"ok": True, "fired": 1, "recorded": 1, "stale": 0}


# ----------------------------------------------------------------------------- I2: a slot is one run
def test_the_same_fire_applied_twice_makes_one_run():
    s = new_state(("a", EVERY10))
    cmd = make("fire", T0 + 10 * SEC, entries=[wire(entry())])
    assert apply(s, cmd) == {"ok": True, "fired": 1, "recorded": 0, "stale": 0}
    runs = dict(s.runs)
    assert apply(s, cmd) == {"ok": True, "fired": 0, "recorded": 0, "stale": 1, "stale_jobs": ["a"]}
    assert s.runs == runs and list(s.runs) == [f"a@{T0 + 10 * SEC}"]


def test_one_command_carrying_the_entry_twice_makes_one_run():
    s = new_state(("a", EVERY10))
    res = apply(s, make("fire", T0 + 10 * SEC, entries=[wire(entry()), entry()]))
    assert res == {"ok": True, "fired": 1, "recorded": 0, "stale": 1, "stale_jobs": ["a"]}
    assert len(s.runs) == 1


def test_a_retried_fire_with_its_request_id_answers_the_first_result():
    s = new_state(("a", EVERY10))
    cmd = commands.make("fire", T0 + 10 * SEC, "rid-1", entries=[wire(entry())])
    first = apply(s, cmd)
    assert apply(s, cmd) == {**first, "duplicate": True} and len(s.runs) == 1


def test_a_second_leaders_plan_from_an_older_view_creates_nothing():
    """A new leader whose replica lagged plans the slot again from the old cursor: the entry is
    stale and dropped whole, and the slot keeps its one run."""
    s = new_state(("a", EVERY10))
    old_view = (s.jobs["a"]["anchor"], s.jobs["a"]["cursor"], s.jobs["a"]["gen"])
    tick_wire(s, T0 + 10 * SEC)
    plan = policy.plan_fire_compact(EVERY10, old_view[0], old_view[1], T0 + 12 * SEC, old_view[2], "a")
    assert plan[5] == [T0 + 10 * SEC]
    res = apply(s, make("fire", T0 + 12 * SEC, entries=[plan]))
    assert (res["fired"], res["stale"]) == (0, 1) and len(runs_of(s, "a")) == 1


@pytest.mark.parametrize("why", ["paused", "deleted", "replaced", "fired"])
def test_a_stale_entry_is_dropped_whole_and_the_others_apply(why):
    s = new_state(("a", EVERY10), ("b", EVERY10))
    if why == "paused":
        apply(s, make("pause_job", T0 + SEC, name="a"))
    elif why == "deleted":
        apply(s, make("delete_job", T0 + SEC, name="a"))
    elif why == "replaced":  # a new generation
        apply(s, put_cmd(s, "a", spec_of({"every_s": 10}, "skip"), T0 + SEC))
    else:  # the cursor moved
        apply(s, make("fire", T0 + 10 * SEC, entries=[wire(entry())]))
    before = {rid for rid in s.runs if rid.startswith("a@")}
    res = apply(s, make("fire", T0 + 10 * SEC, entries=[wire(entry()), wire(entry(job="b", gen=s.jobs["b"]["gen"]))]))
    assert res == {"ok": True, "fired": 1, "recorded": 0, "stale": 1, "stale_jobs": ["a"]}
    assert {rid for rid in s.runs if rid.startswith("a@")} == before
    assert s.runs[f"b@{T0 + 10 * SEC}"]["state"] == "queued" and s.jobs["b"]["cursor"] == T0 + 10 * SEC


# ----------------------------------------------------------------------------- what an entry makes
def test_an_entry_moves_the_cursor_and_next_and_counts_the_fire_lag():
    s = new_state(("a", EVERY10))
    assert tick_wire(s, T0 + 12 * SEC)["fired"] == 1
    job = s.jobs["a"]
    assert (job["cursor"], job["next"]) == (T0 + 12 * SEC, T0 + 20 * SEC)
    assert (job["stats"][RUNS], job["stats"][LAG_LAST]) == (1, 2 * SEC)
    run = s.runs[f"a@{T0 + 10 * SEC}"]
    assert (run["state"], run["kind"], run["slot"], run["due"], run["fired_at"]) == \
        ("queued", "scheduled", T0 + 10 * SEC, T0 + 10 * SEC, T0 + 12 * SEC)
    assert next_due_ms(s) == T0 + 20 * SEC
    assert counters(s) == counters(restored(s)) == {"depth": {"default": 1}, "running": {}, "running_ids": set(),
                                                    "dead": {}}


def test_every_slot_an_entry_covers_is_a_run_or_inside_a_record():
    """I5, on the leader's own plan of a long outage: fire_all runs the oldest max_catchup missed
    slots and records the rest as one range with its exact count."""
    s = new_state(("a", EVERY10))
    now = T0 + 95 * SEC
    job = s.jobs["a"]
    plan = policy.plan_fire(job["spec"], job["anchor"], job["cursor"], now, job["gen"], "a")
    assert apply(s, make("fire", now, entries=[plan]))["ok"]
    due = set(range(T0 + 10 * SEC, now + 1, 10 * SEC))
    ran = {r["slot"] for r in runs_of(s, "a") if r["kind"] == "scheduled"}
    recs = [r for r in runs_of(s, "a") if r["kind"] == "recorded"]
    covered = set(ran)
    for r in recs:
        span = set(range(r["slot"], r.get("slot_to", r["slot"]) + 1, 10 * SEC))
        assert len(span) == r.get("count", 1) and not span & covered, r
        covered |= span
    # The three oldest missed ones and the one still on time (grace_s 5) run.
    assert covered == due and ran == {T0 + 10 * SEC, T0 + 20 * SEC, T0 + 30 * SEC, T0 + 90 * SEC}
    assert [(r["state"], r["reason"]) for r in recs] == [("skipped", "catchup_limit")]
    # History reads in slot order, runs and records interleaved.
    assert [r["slot"] for r in runs_of(s, "a")] == sorted(r["slot"] for r in runs_of(s, "a"))
    assert s.jobs["a"]["stats"][RECORDED] == len(due) - 4


def test_a_record_of_one_slot_and_of_an_uncounted_range():
    """A record of one slot, counted one, has no range fields; a record whose count is unknown
    (null: more than the proposer counted) keeps them, and counts one in the job's stats."""
    s = new_state(("a", EVERY10))
    e = entry(upto=T0 + 40 * SEC, runs=(), nxt=T0 + 50 * SEC,
              rec=[["coalesced", "misfire", T0 + 10 * SEC, T0 + 10 * SEC, 1],
                   ["skipped", "misfire", T0 + 20 * SEC, T0 + 20 * SEC, None],
                   ["skipped", "misfire", T0 + 30 * SEC, T0 + 40 * SEC, None]])
    assert apply(s, make("fire", T0 + 40 * SEC, entries=[e])) == {"ok": True, "fired": 0, "recorded": 3, "stale": 0}
    one, uncounted, many = (s.runs[f"a@{T0 + k * SEC}"] for k in (10, 20, 30))
    assert "slot_to" not in one and "count" not in one and one["state"] == "coalesced"
    assert (uncounted["slot_to"], uncounted["count"]) == (T0 + 20 * SEC, None)
    assert (many["slot_to"], many["count"], many["kind"]) == (T0 + 40 * SEC, None, "recorded")
    assert s.jobs["a"]["stats"][RECORDED] == 3 and s.jobs["a"]["cursor"] == T0 + 40 * SEC


# ----------------------------------------------------------------------------- overlap
def overlapping(policy_name: str, **ov) -> tuple:
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, overlap={"policy": policy_name, **ov})
    s = new_state(("a", spec))
    tick_wire(s, T0 + 10 * SEC)
    return s, s.runs[f"a@{T0 + 10 * SEC}"]


def test_forbid_records_a_slot_while_a_run_is_active_and_runs_it_after():
    s, first = overlapping("forbid")
    tick_wire(s, T0 + 20 * SEC)
    rec = s.runs[f"a@{T0 + 20 * SEC}"]
    assert (rec["state"], rec["reason"], rec["kind"]) == ("skipped", "overlap", "recorded")
    assert s.jobs["a"]["cursor"] == T0 + 20 * SEC  # the slot is handled
    complete(s, T0 + 21 * SEC, acquire(s, T0 + 21 * SEC))
    tick_wire(s, T0 + 30 * SEC)
    assert s.runs[f"a@{T0 + 30 * SEC}"]["state"] == "queued"


def test_queue_one_coalesces_behind_a_queued_run_but_not_behind_a_running_one():
    s, first = overlapping("queue_one")
    tick_wire(s, T0 + 20 * SEC)
    assert (s.runs[f"a@{T0 + 20 * SEC}"]["state"], s.runs[f"a@{T0 + 20 * SEC}"]["reason"]) == ("coalesced", "overlap")
    acquire(s, T0 + 21 * SEC)  # the first one runs now
    tick_wire(s, T0 + 30 * SEC)
    assert s.runs[f"a@{T0 + 30 * SEC}"]["state"] == "queued"


def test_allow_with_max_concurrent_records_a_slot_once_that_many_are_active():
    s, _ = overlapping("allow", max_concurrent=2)
    tick_wire(s, T0 + 20 * SEC)
    tick_wire(s, T0 + 30 * SEC)
    states = [s.runs[f"a@{T0 + k * SEC}"]["state"] for k in (10, 20, 30)]
    assert states == ["queued", "queued", "skipped"]


def test_replace_revokes_the_active_runs_and_their_leases():
    s, first = overlapping("replace")
    tick_wire(s, T0 + 20 * SEC)
    assert (first["state"], first["error"]) == ("failed", f"replaced by run a@{T0 + 20 * SEC} (overlap policy replace)")
    grant = acquire(s, T0 + 21 * SEC)[0]
    assert grant["id"] == f"a@{T0 + 20 * SEC}"
    tick_wire(s, T0 + 30 * SEC)
    second = s.runs[grant["id"]]
    assert second["state"] == "failed" and second["deadline"] is None
    assert second["attempts"][-1]["token"] == grant["token"] and second["attempts"][-1]["ok"] is False
    assert counters(s) == counters(restored(s)) == {"depth": {"default": 1}, "running": {}, "running_ids": set(),
                                                    "dead": {}}
    # The revoked run's worker's outcome changes nothing but the output: its lease is gone.
    res, each = complete_many(s, make("complete_many", T0 + 31 * SEC, results=[
        {"run": grant["id"], "token": grant["token"], "success": True}]))
    assert each[0]["ok"] is False  # (no worker named)
    res, each = complete_many(s, make("complete_many", T0 + 31 * SEC, worker="w", results=[
        {"run": grant["id"], "token": grant["token"], "success": True, "output": "half done"}]))
    assert each[0]["ok"] is True and each[0]["kept"] == "output", each
    assert (second["state"], second["output"]) == ("failed", "half done")
    assert second["error"] == f"replaced by run a@{T0 + 30 * SEC} (overlap policy replace)"
    res, each = complete_many(s, make("complete_many", T0 + 32 * SEC, worker="w", results=[
        {"run": grant["id"], "token": grant["token"], "success": True}]))
    assert each[0]["ok"] is False  # once


# ----------------------------------------------------------------------------- full queues
def test_a_full_rejecting_queue_records_the_slot():
    s = new_state(("a", EVERY10))
    apply(s, make("put_queue", T0, name="default", max_depth=1, on_full="reject"))
    tick_wire(s, T0 + 10 * SEC)
    tick_wire(s, T0 + 20 * SEC)
    rec = s.runs[f"a@{T0 + 20 * SEC}"]
    assert (rec["state"], rec["reason"], rec["queue"]) == ("skipped", "queue_full", "default")
    assert counters(s)["depth"] == {"default": 1} and s.jobs["a"]["cursor"] == T0 + 20 * SEC


def test_a_full_drop_oldest_queue_drops_its_oldest_run_for_each_new_one():
    s = new_state(("a", EVERY10), ("b", EVERY10))
    apply(s, make("put_queue", T0, name="default", max_depth=2, on_full="drop_oldest"))
    for k in (10, 20):
        tick_wire(s, T0 + k * SEC)
    states = {rid: r["state"] for rid, r in s.runs.items()}
    assert sorted(st for st in states.values()) == ["queued", "queued", "skipped", "skipped"]
    assert {rid for rid, st in states.items() if st == "queued"} == {f"a@{T0 + 20 * SEC}", f"b@{T0 + 20 * SEC}"}
    assert all(s.runs[rid]["reason"] == "queue_full" for rid, st in states.items() if st == "skipped")
    assert counters(s) == counters(restored(s)) and counters(s)["depth"] == {"default": 2}


# ----------------------------------------------------------------------------- history
def test_the_history_keeps_its_bound_dropping_finished_entries_only():
    s = new_state(("a", spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, history=2)))
    for k in range(1, 6):
        tick_wire(s, T0 + 10 * k * SEC)
    # Nothing finished: queued runs are never dropped.
    assert len(s.history["a"]) == 5
    complete(s, T0 + 51 * SEC, acquire(s, T0 + 51 * SEC))
    tick_wire(s, T0 + 60 * SEC)
    assert [s.runs[r]["slot"] for r in s.history["a"]] == [T0 + 50 * SEC, T0 + 60 * SEC]
    assert set(s.runs) == set(s.history["a"])


@pytest.mark.parametrize("overlap", ["allow", "forbid"])  # the fast path's job, and the general path's
def test_a_dead_run_stays_past_the_bound_it_is_the_dead_letter_queue(overlap):
    s = new_state(("a", spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, history=1,
                                retry={"max_attempts": 1}, overlap={"policy": overlap})))
    tick_wire(s, T0 + 10 * SEC)
    g = acquire(s, T0 + 10 * SEC)[0]
    apply(s, make("complete_many", T0 + 11 * SEC, results=[{"run": g["id"], "token": g["token"], "success": False}]))
    assert s.runs[g["id"]]["state"] == "dead"
    for k in (2, 3):
        tick_wire(s, T0 + 10 * k * SEC)
        complete(s, T0 + 10 * k * SEC, acquire(s, T0 + 10 * k * SEC))
    assert s.history["a"][0] == g["id"] and s.runs[g["id"]]["state"] == "dead"
    assert counters(s)["dead"] == {"default": [g["id"]]}


def test_behind_an_active_oldest_entry_the_history_is_scanned_every_trim_scan_slack_adds():
    """The oldest run stays running; the finished ones behind it are dropped on every
    TRIM_SCAN_SLACK-th entry past the bound, not on every add (limits.history_trim_scan_slack)."""
    s = new_state(("a", spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, history=1)))
    tick_wire(s, T0 + 10 * SEC)
    held = acquire(s, T0 + 10 * SEC)[0]
    sizes = []
    for k in range(2, 3 * fire.TRIM_SCAN_SLACK + 2):
        now = T0 + 10 * k * SEC
        tick_wire(s, now)
        sizes.append(len(s.history["a"]))
        complete(s, now, acquire(s, now))
    assert s.history["a"][0] == held["id"]
    # After a scan the history is the held run and the newest; the next scan comes when the
    # entries past the bound are a multiple of TRIM_SCAN_SLACK again.
    assert max(sizes) == 1 + fire.TRIM_SCAN_SLACK - 1
    assert sizes == [2 + i % (fire.TRIM_SCAN_SLACK - 1) for i in range(len(sizes))]


def _trim_reference(runs: dict, hist: list, bound: int, full: bool) -> None:
    """fire.trim as it was written before it looked before rebuilding (the rule it keeps)."""
    excess = len(hist) - bound
    while excess > 0:
        st = runs[hist[0]]["state"]
        if st not in TERMINAL_STATES or st == "dead":
            break
        del runs[hist[0]]
        del hist[0]
        excess -= 1
    if excess <= 0 or (excess % fire.TRIM_SCAN_SLACK and not full):
        return
    keep = []
    for rid in hist:
        st = runs[rid]["state"]
        if excess > 0 and st in TERMINAL_STATES and st != "dead":
            del runs[rid]
            excess -= 1
        else:
            keep.append(rid)
    hist[:] = keep


def test_trim_drops_the_entries_the_rule_drops():
    """Random histories of every state, bounds and scan turns: trim drops exactly the entries
    (and keeps the order) the reference loop does, including when the scan finds nothing."""
    rng = random.Random(27)
    states = ["queued", "running", "dead", "succeeded", "failed", "skipped", "coalesced"]
    for _ in range(3000):
        n = rng.randrange(0, 3 * fire.TRIM_SCAN_SLACK)
        hist = [f"a@{i}" for i in range(n)]
        runs = {rid: {"state": rng.choice(states[:rng.randrange(1, len(states) + 1)])} for rid in hist}
        bound, full = rng.randrange(0, n + 2), rng.random() < 0.2
        want_runs, want_hist = {k: dict(v) for k, v in runs.items()}, list(hist)
        _trim_reference(want_runs, want_hist, bound, full)
        s = types.SimpleNamespace(runs=runs, _fast_paths=False, _trim_clean={})
        fire.trim(s, hist, bound, full)
        assert hist == want_hist and list(runs) == list(want_runs)


def test_trim_with_its_scan_cache_drops_what_a_full_scan_drops():
    """A backlog grows by queued runs, now and then a run finishes or a history loses an entry
    (each moving the epoch, as every command but the fast path's appends does), and trim runs
    with the bound and scan turns of a fire: with the cache of entries known unfinished, it
    drops exactly what the reference loop drops, after every step."""
    rng = random.Random(28)
    states = ["running", "dead", "succeeded", "failed", "skipped", "coalesced"]
    used = 0
    for _ in range(300):
        s = types.SimpleNamespace(runs={}, _fast_paths=True, _trim_epoch=0, _trim_clean_epoch=0, _trim_clean={})
        hist: list[str] = []
        want_runs: dict = {}
        want_hist: list[str] = []
        bound = rng.randrange(0, 8)
        for k in range(rng.randrange(1, 6 * fire.TRIM_SCAN_SLACK)):
            rid = f"a@{k}"
            s.runs[rid] = {"state": "queued"}
            want_runs[rid] = {"state": "queued"}
            hist.append(rid)
            want_hist.append(rid)
            if rng.random() < 0.05 and hist:  # a command finished a run (or changed one)
                x = rng.choice(hist)
                st = rng.choice(states)
                s.runs[x]["state"] = want_runs[x]["state"] = st
                s._trim_epoch += 1
            if rng.random() < 0.02 and hist:  # an entry taken out (a DLQ delete): the last-read check
                i = rng.randrange(len(hist))  # sees the shift, with or without the epoch moving
                x = hist[i]
                del hist[i], want_hist[i]
                del s.runs[x], want_runs[x]
                s._trim_epoch += rng.random() < 0.5
            if len(hist) > bound:
                fire.trim(s, hist, bound, cached=True)
                _trim_reference(want_runs, want_hist, bound, False)
            assert hist == want_hist and s.runs == want_runs, k
        used += bool(s._trim_clean)
    assert used > 100  # the cache was there to be used, not only the full scan


# ----------------------------------------------------------------------------- the fast path
def _on_time(s):
    for k in range(1, 8):
        tick_wire(s, T0 + k * SEC)
        complete(s, T0 + k * SEC, acquire(s, T0 + k * SEC, 2))


def _catching_up(s):
    tick_wire(s, T0 + 3500)                # three slots an entry, no records
    tick_wire(s, T0 + 4000, ahead_ms=1000)  # fired ahead: two slots an entry


def _drop_oldest(s):
    apply(s, make("put_queue", T0, name="default", max_depth=2, on_full="drop_oldest"))
    for k in range(1, 6):
        tick_wire(s, T0 + k * SEC)


def _scan_turns(s):
    tick_wire(s, T0 + SEC)
    acquire(s, T0 + SEC, 2)
    for k in range(2, 2 * fire.TRIM_SCAN_SLACK + 4):
        tick_wire(s, T0 + k * SEC)
        complete(s, T0 + k * SEC, acquire(s, T0 + k * SEC, 2))


def _rejecting(s):
    """A queue that rejects: an entry takes the fast path while its slots fit, exactly too, and
    the general path once they do not (two jobs a tick, room for three: the second tick's
    second entry, then both of the third's)."""
    apply(s, make("put_queue", T0, name="default", max_depth=3, on_full="reject"))
    for k in range(1, 4):
        tick_wire(s, T0 + k * SEC)


@pytest.mark.parametrize("scenario,general", [(_on_time, 0), (_catching_up, 0), (_drop_oldest, 0),
                                              (_scan_turns, 0), (_rejecting, 3)])
def test_the_fast_path_and_the_general_path_agree(monkeypatch, scenario, general):
    """Two replicas apply the same commands, one with the inline fast path and one without:
    their answers, snapshots, indexes and due times are the same; and the fast replica did take
    the fast path wherever it applies (the general path makes runs through new_run: the fast
    replica calls it only for the ``general`` slots that did not fit its rejecting queue)."""
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=5, max_catchup=10, history=3)
    replicas = {"fast": new_state(("a", spec), ("b", spec)), "general": new_state(("a", spec), ("b", spec))}
    replicas["general"]._fast_paths = False
    general_calls = {"fast": 0, "general": 0}
    new_run = fire.new_run

    def counting(s, *a, **k):
        general_calls["fast" if s is replicas["fast"] else "general"] += 1
        return new_run(s, *a, **k)
    monkeypatch.setattr(fire, "new_run", counting)
    answers = {}
    for name, s in replicas.items():
        seen = []
        orig = s.apply_bytes

        def recording(data, orig=orig, seen=seen):
            res = orig(data)
            seen.append(res)
            return res
        s.apply_bytes = recording
        scenario(s)
        answers[name] = seen
    fast_s, general_s = replicas["fast"], replicas["general"]
    assert answers["fast"] == answers["general"]
    assert fast_s.snapshot() == general_s.snapshot()
    assert counters(fast_s) == counters(general_s) == counters(restored(fast_s))
    assert fast_s._queued == general_s._queued
    assert next_due_ms(fast_s, 1000) == next_due_ms(general_s, 1000)
    assert general_calls["general"] > 0
    assert general_calls["fast"] == general


def test_a_pipeline_parents_blocked_slot_trimmed_by_its_own_add_does_not_wedge_the_job():
    """A parent with overlap forbid and history 1 behind a dead head: the record of a blocked
    slot can be dropped by its own add's trim scan. Its children were told from s.runs[rid], a
    KeyError: the fire was refused half-applied (runs made, the cursor not moved), and every
    later fire of the job failed on I2 (found by a review; the code before 2026-12-03)."""
    from raftsched.core import model
    from raftsched.core.state import SchedulerState
    s = SchedulerState()
    ex = {"type": "python", "target": "app.jobs:run"}
    now = T0
    p = model.validate_job("p", {"schedule": {"every_s": 1}, "executor": ex, "history": 1,
                                 "misfire": {"policy": "fire_all", "grace_s": 3600}, "retry": {"max_attempts": 1},
                                 "overlap": {"policy": "forbid"}}, now)
    c = model.validate_job("c", {"executor": ex, "after": [{"job": "p", "on": "success"}]}, now)
    assert apply(s, put_cmd(s, "p", p, now))["ok"]
    assert apply(s, commands.put_job(now, None, name="c", spec=c, next=None, cursor=now, anchor=now,
                                     create_only=False))["ok"]

    def fire_to(t):
        j = s.jobs["p"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t, j["gen"], "p")
        return apply(s, commands.make("fire", t, None, entries=[e]))

    def finish(ok):
        for g in apply(s, commands.make("acquire", now, None, worker="w", queues=None, max=1, ttl=600_000))["runs"]:
            apply(s, commands.make("complete_many", now, None,
                                   results=[{"run": g["id"], "token": g["token"], "success": ok}]))
    now += SEC
    fire_to(now)
    finish(False)  # a dead head
    for _ in range(40):
        now += 2 * SEC  # two slots an entry: a run, then a blocked slot's record
        res = fire_to(now)
        assert res["ok"], res
        finish(True)
    assert s.jobs["p"]["cursor"] == now
