"""raftsched/core/cancel.py: a queued or running run ended by request (``cancel_run``). Driven
through apply as a replica applies it (pure: no network, no clock; every time an offset from T0).

What it promises: a queued run leaves its queue, recorded skipped (reason cancelled); a running
one ends failed, its lease with it (its token stale: heartbeat says lost, its outcome is
refused), neither retried nor dead-lettered; the indexes are what a restore rebuilds; the slot's
deadline, its pipeline children and the sinks learn it; a refusal changes nothing.
"""
from __future__ import annotations

import copy

import pytest

from raftsched.core import commands, limits
from raftsched.core.cancel import why

from core_helpers import (SEC, T0, apply, complete_many, new_state, put_cmd, refused, restored, resume_cmd, spec_of,
                          tick)
from test_core_fire import counters

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, retry={"max_attempts": 3})


def cancel(s, now: int, rid: str, **kw) -> dict:
    return apply(s, commands.cancel_run(now, None, run=rid, **kw))


def acquire(s, now: int, n: int = 10) -> list[dict]:
    return apply(s, commands.acquire(now, worker="w", queues=None, max=n, ttl=30_000, types=None))["runs"]


def fired(spec=EVERY10):
    s = new_state(("a", spec))
    tick(s, T0 + 10 * SEC)
    return s, f"a@{T0 + 10 * SEC}"


def test_a_queued_run_is_recorded_skipped_and_no_worker_gets_it():
    s, rid = fired()
    res = cancel(s, T0 + 11 * SEC, rid, reason="bad deploy")
    assert res == {"ok": True, "run": rid, "state": "skipped", "was": "queued"}
    run = s.runs[rid]
    assert (run["state"], run["reason"], run["finished_at"]) == ("skipped", "cancelled", T0 + 11 * SEC)
    assert run["error"] == "cancelled by request: bad deploy"
    assert acquire(s, T0 + 12 * SEC) == []
    assert counters(s) == counters(restored(s)) == {"depth": {}, "running": {}, "running_ids": set(), "dead": {}}
    assert s.stats.recorded[("skipped", "cancelled")] == 1
    from raftsched.core.events import LAST_SLOT  # (a walk: null for a job none of whose runs had ended)
    assert s.health["a"][LAST_SLOT] == [T0 + 10 * SEC, "skipped", "cancelled"]
    assert restored(s).snapshot() == s.snapshot()


def test_a_running_run_ends_failed_its_lease_with_it_and_is_not_retried():
    s, rid = fired()
    grant = acquire(s, T0 + 11 * SEC)[0]
    res = cancel(s, T0 + 12 * SEC, rid)
    assert res == {"ok": True, "run": rid, "state": "failed", "was": "running", "worker": "w",
                   "token": grant["token"]}
    run = s.runs[rid]
    assert (run["state"], run["error"], run["deadline"]) == ("failed", "cancelled by request", None)
    assert run["attempts"][-1]["token"] == grant["token"] and run["attempts"][-1]["ok"] is False
    assert counters(s) == counters(restored(s)) == {"depth": {}, "running": {}, "running_ids": set(), "dead": {}}
    # Its worker is told at its next heartbeat; of the outcome of its kill only the output is kept.
    hb = apply(s, commands.heartbeat(T0 + 13 * SEC, worker="w", leases=[[rid, grant["token"]]], ttl=30_000))
    assert hb["lost"] == [rid]
    _, each = complete_many(s, commands.complete_many(T0 + 14 * SEC, None, worker="w", results=[
        {"run": rid, "token": grant["token"], "success": False, "error": "killed"}]))
    assert each[0]["ok"] is True and each[0]["kept"] == "output", each
    assert (run["state"], run["error"], run["output"]) == ("failed", "cancelled by request", "")
    # Three attempts allowed, one made: still no retry, and nothing in the dead-letter queue.
    assert acquire(s, T0 + 60 * SEC) == [] and s.runs[rid]["state"] == "failed"
    assert restored(s).snapshot() == s.snapshot()


def test_a_killed_attempts_output_is_kept_once_from_its_own_worker_and_token_only():
    """A cancelled running run: its worker kills it and reports what it wrote; the state keeps
    that output (the run keeps its cancel: state, error, attempts, no retry, nothing counted as
    the worker's outcome), once, and only from the attempt's worker under the attempt's token.
    An earlier attempt's output is not shown as the killed one's."""
    s, rid = fired()
    from raftsched.core.model import EXECUTOR_TYPES
    apply(s, commands.make("worker_hello", T0 + 10 * SEC, None, worker="w", kind="remote", labels={}, slots=4,
                           executors=sorted(EXECUTOR_TYPES), queues=None, version="1", instance="i"))
    g1 = acquire(s, T0 + 11 * SEC)[0]
    complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
        {"run": rid, "token": g1["token"], "success": False, "error": "exit 1", "output": "first try"}]))
    g2 = acquire(s, T0 + 20 * SEC)[0]
    assert g2["id"] == rid and s.runs[rid]["output"] == "first try"
    cancel(s, T0 + 21 * SEC, rid, reason="hung")
    run = s.runs[rid]
    assert run["output"] is None and run["attempts"][-1]["killed"] is True
    assert "killed" not in run["attempts"][0]  # (a failure of its own)
    before = copy.deepcopy(run)

    def report(worker, tok, output, own=True, success=False):
        return complete_many(s, commands.complete_many(T0 + 22 * SEC, None, worker=worker, own=own, results=[
            {"run": rid, "token": tok, "success": success, "error": "killed", "output": output}]))[1][0]

    for worker, tok in (("intruder", g2["token"]), ("w", g1["token"]), ("w", g2["token"] + 1)):
        assert report(worker, tok, "forged")["error"]["code"] == "conflict"
    assert report("intruder", g2["token"], "forged", own=False)["ok"] is False  # (a worker named: its own)
    assert run == before  # refusals change nothing
    completed = s.workers["w"]["completed"]
    res = report("w", g2["token"], "x" * (limits.output_bytes_max + 10) + "waiting on the lock", success=True)
    assert res["ok"] is True and res["kept"] == "output" and res["state"] == "failed", res
    assert run["output"].endswith("waiting on the lock") and run["output"].startswith("…")  # cut, as any output
    assert (run["state"], run["error"], len(run["attempts"])) == ("failed", "cancelled by request: hung", 2)
    assert s.workers["w"]["completed"] == completed == 1  # (the first try's outcome only)
    assert report("w", g2["token"], "again")["error"]["code"] == "conflict"  # once
    assert acquire(s, T0 + 60 * SEC) == []
    assert restored(s).snapshot() == s.snapshot()


def test_a_queued_runs_cancel_keeps_no_output_from_anyone():
    s, rid = fired()
    cancel(s, T0 + 11 * SEC, rid)
    _, each = complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
        {"run": rid, "token": 0, "success": False, "output": "forged"}]))
    assert each[0]["ok"] is False and s.runs[rid].get("output") is None


def test_a_retry_waiting_for_its_backoff_is_cancelled_with_its_attempts_kept():
    s, rid = fired()
    grant = acquire(s, T0 + 11 * SEC)[0]
    complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
        {"run": rid, "token": grant["token"], "success": False, "error": "exit 1"}]))
    assert s.runs[rid]["state"] == "queued"
    assert cancel(s, T0 + 13 * SEC, rid)["state"] == "skipped"
    run = s.runs[rid]
    assert run["attempts"][-1]["error"] == "exit 1" and run["reason"] == "cancelled"
    assert acquire(s, T0 + 120 * SEC) == []
    assert counters(s) == counters(restored(s))


def test_a_run_a_pause_holds_is_cancelled_and_the_resume_leaves_it_so():
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    apply(s, commands.pause_job(T0 + 10 * SEC - 1, None, name="a"))
    held = [r for r in s.runs.values() if r["state"] == "queued"]
    assert held
    rid = held[0]["id"]
    assert cancel(s, T0 + 10 * SEC, rid)["state"] == "skipped"
    assert apply(s, resume_cmd(s, "a", T0 + 10 * SEC + 1))["ok"]
    assert s.runs[rid]["state"] == "skipped" and acquire(s, T0 + 12 * SEC) == []
    assert counters(s) == counters(restored(s))


def test_overlap_forbid_lets_the_next_slot_run_once_the_active_one_is_cancelled():
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, overlap={"policy": "forbid"})
    s, rid = fired(spec)
    acquire(s, T0 + 11 * SEC)
    cancel(s, T0 + 12 * SEC, rid)
    tick(s, T0 + 20 * SEC)
    assert s.runs[f"a@{T0 + 20 * SEC}"]["state"] == "queued"


@pytest.mark.parametrize("state", ["succeeded", "dead", "skipped"])
def test_a_run_that_ended_is_refused_and_nothing_changes(state):
    s, rid = fired(spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, retry={"max_attempts": 1}))
    if state == "skipped":
        cancel(s, T0 + 11 * SEC, rid)
    else:
        grant = acquire(s, T0 + 11 * SEC)[0]
        complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
            {"run": rid, "token": grant["token"], "success": state == "succeeded", "error": "exit 1"}]))
    assert s.runs[rid]["state"] == state
    res = refused(s, commands.cancel_run(T0 + 20 * SEC, None, run=rid), "conflict")
    assert res["error"]["field"] == "run" and res["error"]["state"] == state
    if state == "dead":
        assert f"DELETE /v1/dlq/{rid}" in res["error"]["message"]


def test_an_unknown_run_and_malformed_commands_are_refused_and_change_nothing():
    s, rid = fired()
    refused(s, commands.cancel_run(T0 + 11 * SEC, None, run=f"a@{T0 + 20 * SEC}"), "not_found")
    for bad in ({}, {"run": ""}, {"run": 7}, {"run": "x" * (limits.run_id_chars_max + 1)},
                {"run": rid, "reason": ""}, {"run": rid, "reason": ["x"]},
                {"run": rid, "reason": "x" * (limits.cancel_reason_chars_max + 1)}):
        refused(s, commands.make("cancel_run", T0 + 11 * SEC, None, **bad), "invalid_command")
    assert s.runs[rid]["state"] == "queued"


def test_a_heartbeat_jobs_waiting_slot_is_refused():
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, executor={"type": "heartbeat"})
    s, rid = fired(spec)
    assert s.runs[rid]["state"] == "waiting"
    res = refused(s, commands.cancel_run(T0 + 11 * SEC, None, run=rid), "conflict")
    assert "ping" in res["error"]["message"]


def test_the_sinks_are_told_and_the_job_opens_no_incident():
    from test_notify_core import WEBHOOK
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, name="a",
                   notify=[{"sink": "ops", "on": ["run.cancelled", "run.dead", "slot.missed"]}])
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    apply(s, put_cmd(s, "a", spec, T0))
    tick(s, T0 + 10 * SEC)
    rid = f"a@{T0 + 10 * SEC}"
    grant = acquire(s, T0 + 11 * SEC)[0]
    cancel(s, T0 + 12 * SEC, rid, reason="stuck")
    ev = [e for e in s.outbox.events if e["kind"] == "run.cancelled"]
    assert len(ev) == 1 and [e["kind"] for e in s.outbox.events] == ["run.cancelled"]  # no slot.missed, no run.dead
    e = ev[0]
    assert (e["job"], e["slot"], e["run_id"], e["attempt"]) == ("a", T0 + 10 * SEC, rid, 1)
    assert e["reason"] == "cancelled by request: stuck"
    assert e["detail"] == {"was": "running", "state": "failed"}
    h = s.health["a"]
    from raftsched.core.events import CONSECUTIVE, INCIDENT, LAST_SLOT
    assert h[CONSECUTIVE] == 0 and h[INCIDENT] is None and h[LAST_SLOT][:2] == [T0 + 10 * SEC, "failed"]
    assert grant["token"]
    assert restored(s).snapshot() == s.snapshot()


@pytest.mark.parametrize("running", [False, True])
def test_the_slots_deadline_is_judged_at_once(running):
    from test_core_deadlines import acquire as dl_acquire, rec, spec as dl_spec, tick as dl_tick
    s = new_state()
    apply(s, put_cmd(s, "j", dl_spec({"every_s": 10}, {"succeed_within_s": 60}), T0))
    dl_tick(s, T0 + 10 * SEC)
    rid = f"j@{T0 + 10 * SEC}"
    assert rec(s, rid)["state"] == "pending"
    if running:
        dl_acquire(s, T0 + 11 * SEC)
    cancel(s, T0 + 12 * SEC, rid)
    r = rec(s, rid)
    assert (r["state"], r["cause"]) == ("missed", "failed" if running else "skipped"), r


def test_a_pipeline_child_decides_the_slot_when_its_parent_is_cancelled():
    parent = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)
    child = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, after=[{"job": "a"}])
    s = new_state(("a", parent), ("b", child))
    tick(s, T0 + 10 * SEC)
    rid = f"a@{T0 + 10 * SEC}"
    assert s.runs[rid]["state"] == "queued"
    cancel(s, T0 + 11 * SEC, rid)
    tick(s, T0 + 12 * SEC)
    b = s.runs.get(f"b@{T0 + 10 * SEC}")
    assert b is not None and b["state"] == "skipped" and b["reason"].startswith("upstream"), b
    # It says its parent was cancelled, not only that the parent's slot was recorded skipped.
    assert b["error"] == f"{rid} was recorded skipped (cancelled)", b
    assert restored(s).snapshot() == s.snapshot()


def test_why_says_why_and_never_which_token():
    assert why(None) == "cancelled by request"
    assert why("x") == "cancelled by request: x"


def test_cancelling_an_old_slots_retry_leaves_the_newer_slots_outcome_as_the_last():
    # (found by a review: the queued branch wrote last_slot_outcome whatever its slot)
    from raftsched.core.events import LAST_SLOT
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, retry={"max_attempts": 3, "backoff_s": 60})
    s, old = fired(spec)
    g = acquire(s, T0 + 11 * SEC)[0]
    complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
        {"run": old, "token": g["token"], "success": False, "error": "exit 1"}]))  # retry in 60 s
    tick(s, T0 + 20 * SEC)
    new = acquire(s, T0 + 21 * SEC)
    assert [x["id"] for x in new] == [f"a@{T0 + 20 * SEC}"]
    complete_many(s, commands.complete_many(T0 + 22 * SEC, None, worker="w", results=[
        {"run": new[0]["id"], "token": new[0]["token"], "success": True}]))
    assert s.health["a"][LAST_SLOT] == [T0 + 20 * SEC, "succeeded", None]
    cancel(s, T0 + 23 * SEC, old)
    assert s.runs[old]["state"] == "skipped"
    assert s.health["a"][LAST_SLOT] == [T0 + 20 * SEC, "succeeded", None]


def test_run_cancelled_is_told_while_its_job_is_paused():
    from test_notify_core import WEBHOOK
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, name="a",
                   notify=[{"sink": "ops", "on": ["run.cancelled"]}])
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    apply(s, put_cmd(s, "a", spec, T0))
    tick(s, T0 + 10 * SEC)
    rid = f"a@{T0 + 10 * SEC}"
    acquire(s, T0 + 11 * SEC)
    apply(s, commands.pause_job(T0 + 12 * SEC, None, name="a"))  # stuck: pause the job, then cancel its run
    cancel(s, T0 + 13 * SEC, rid)
    assert [(e["kind"], e["run_id"]) for e in s.outbox.events] == [("run.cancelled", rid)]


def test_a_queued_run_by_hand_with_propagate_cancelled_takes_back_no_decision_of_its_children():
    # (found by a review: a cancel of a re-run that never ran re-decided its children's slot)
    from pipeline_helpers import job_raw, put as put_job
    s = new_state()
    put_job(s, "a", job_raw(every_s=10))
    put_job(s, "b", job_raw(after=["a"]))
    tick(s, T0 + 10 * SEC)
    slot = T0 + 10 * SEC
    g = acquire(s, T0 + 11 * SEC)[0]
    complete_many(s, commands.complete_many(T0 + 12 * SEC, None, worker="w", results=[
        {"run": g["id"], "token": g["token"], "success": False, "error": "exit 1"}]))
    assert s.runs[f"a@{slot}"]["state"] == "dead"
    child = dict(s.runs[f"b@{slot}"])
    assert child["reason"] == "upstream_failed"
    apply(s, commands.dlq_delete(T0 + 13 * SEC, None, run=f"a@{slot}"))
    res = apply(s, commands.trigger_job(T0 + 14 * SEC, None, name="a", extra={"slot": slot, "propagate": True}))
    assert res["ok"] and s.runs[f"a@{slot}"]["state"] == "queued", res
    cancel(s, T0 + 15 * SEC, f"a@{slot}")
    assert s.runs[f"b@{slot}"] == child  # as it was: the dead run's outcome decided it
    assert restored(s).snapshot() == s.snapshot()


def test_a_heartbeat_jobs_run_a_ping_started_ends_failed_and_names_no_lease():
    spec = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3, executor={"type": "heartbeat"})
    s, rid = fired(spec)
    assert apply(s, commands.ping(T0 + 10 * SEC, None, name="a", status="start", slot=T0 + 10 * SEC))["ok"]
    assert s.runs[rid]["state"] == "running"
    res = cancel(s, T0 + 11 * SEC, rid, reason="host decommissioned")
    assert res == {"ok": True, "run": rid, "state": "failed", "was": "running"}  # no worker, no token
    assert s.runs[rid]["error"] == "cancelled by request: host decommissioned"
    assert restored(s).snapshot() == s.snapshot()


@pytest.mark.parametrize("running", [False, True])
def test_children_on_each_edge_decide_as_docs_api_md_says(running):
    # A queued run cancelled did not run: every child records upstream_missed. A running one
    # failed: a handler on failure or finished runs, one on success records upstream_failed.
    from pipeline_helpers import job_raw, put as put_job
    s = new_state()
    put_job(s, "a", job_raw(every_s=10))
    for name, on in (("h", "failure"), ("f", "finished"), ("ok", "success")):
        put_job(s, name, job_raw(after=[{"job": "a", "on": on}]))
    tick(s, T0 + 10 * SEC)
    slot = T0 + 10 * SEC
    if running:
        acquire(s, T0 + 11 * SEC, 1)
    cancel(s, T0 + 12 * SEC, f"a@{slot}")
    got = {c: (s.runs[f"{c}@{slot}"]["state"], s.runs[f"{c}@{slot}"].get("reason")) for c in ("h", "f", "ok")}
    if running:
        assert got == {"h": ("queued", None), "f": ("queued", None), "ok": ("skipped", "upstream_failed")}
    else:
        assert got == {c: ("skipped", "upstream_missed") for c in ("h", "f", "ok")}


# ------------------------------------------------------------------ many runs of a job: cancel_runs
def cancel_many(s, now: int, ids: list[str], **kw) -> dict:
    return apply(s, commands.cancel_runs(now, None, runs=ids, **kw))


def backlog():
    """Job a's catch-up after an outage: three slots queued, the oldest leased, one recorded."""
    s = new_state(("a", EVERY10))
    tick(s, T0 + 10 * SEC)
    tick(s, T0 + 40 * SEC)  # (max_catchup 3)
    queued = sorted(r for r, run in s.runs.items() if run["state"] == "queued")
    return s, queued


@pytest.mark.parametrize("running", [False, True])
def test_cancel_runs_ends_the_queued_and_only_with_running_the_running(running):
    s, _ = backlog()
    leased = acquire(s, T0 + 41 * SEC, n=1)[0]["id"]
    queued = sorted(r for r, run in s.runs.items() if run["state"] == "queued")
    ids = queued + ["a@1", leased]
    res = cancel_many(s, T0 + 42 * SEC, ids, reason="outage backlog", running=running)
    want = [r for r in ids if r != "a@1" and (running or r != leased)]
    assert res["ok"] and res["cancelled"] == len(want), res
    assert res["passed"] == [["a@1", None]] + ([] if running else [[leased, "running"]])
    for rid in want:
        run = s.runs[rid]
        assert run["error"] == "cancelled by request: outage backlog"
        assert run["state"] == ("failed" if rid == leased else "skipped")
    assert s.runs[leased]["state"] == ("failed" if running else "running")
    assert counters(s) == counters(restored(s))
    assert restored(s).snapshot() == s.snapshot()
    assert acquire(s, T0 + 43 * SEC) == []  # nothing of the backlog is left to run


def test_cancel_runs_passes_over_what_ended_and_refuses_malformed_commands_changing_nothing():
    s, queued = backlog()
    assert cancel_many(s, T0 + 41 * SEC, queued[:1])["cancelled"] == 1
    again = cancel_many(s, T0 + 42 * SEC, queued)  # the first ended meanwhile: passed over, not refused
    assert again["cancelled"] == len(queued) - 1 and again["passed"] == [[queued[0], "skipped"]]
    s, queued = backlog()
    n = limits.run_refs_per_command
    for bad in ({}, {"runs": []}, {"runs": "a@1"}, {"runs": [7]}, {"runs": [""]}, {"runs": ["a@1"] * (n + 1)},
                {"runs": queued, "running": "yes"}, {"runs": queued, "reason": ""},
                {"runs": queued, "reason": "x" * (limits.cancel_reason_chars_max + 1)}):
        refused(s, commands.make("cancel_runs", T0 + 41 * SEC, None, **bad), "invalid_command")
    assert all(s.runs[r]["state"] == "queued" for r in queued)


def test_cancel_runs_tells_each_run_cancelled():
    from test_notify_core import WEBHOOK
    spec = dict(EVERY10, notify=[{"sink": "ops", "on": ["run.cancelled"]}])
    s = new_state()
    apply(s, commands.put_sink(T0, None, name="ops", spec=WEBHOOK))
    apply(s, put_cmd(s, "a", spec, T0))
    tick(s, T0 + 10 * SEC)
    tick(s, T0 + 40 * SEC)
    queued = sorted(r for r, run in s.runs.items() if run["state"] == "queued")
    cancel_many(s, T0 + 41 * SEC, queued)
    ev = [e for e in s.outbox.events if e["kind"] == "run.cancelled"]
    assert [e["run_id"] for e in ev] == queued and all(e["detail"]["was"] == "queued" for e in ev)


def test_a_jobs_cancel_with_a_key_remembers_how_far_it_read_and_its_retry_walks_no_further():
    """The first command of a job's cancel sent with an Idempotency-Key answers ``upto``, the
    newest entry of the job's history the node read, and ``upto_at``, its fired_at; the retry's
    walk (queries.cancel_walk) ends at that entry, so the runs fired since are not looked at. The
    bound is the state's own order, the same on every replica (not a node's clock)."""
    from raftsched.core import queries
    s = new_state(("a", EVERY10))
    tick(s, T0 + 30 * SEC)
    ids, nxt, newest, newest_at = queries.cancel_walk(s, "a", False, None, 100, 1000)
    assert len(ids) == 3 and nxt is None and newest == ids[-1] and newest_at == s.runs[newest]["fired_at"]
    res = apply(s, commands.cancel_runs(T0 + 31 * SEC, "k-1", runs=ids[:1], name="a", upto=newest,
                                        upto_at=newest_at))
    assert res == {"ok": True, "cancelled": 1, "passed": [], "upto": newest, "upto_at": newest_at}
    tick(s, T0 + 40 * SEC)  # a slot fired since
    fresh = queries.cancel_walk(s, "a", False, None, 100, 1000)[0]
    assert fresh == ids[1:] + [f"a@{T0 + 40 * SEC}"]
    assert queries.cancel_walk(s, "a", False, None, 100, 1000, None, newest, newest_at)[0] == ids[1:]
    assert queries.cancel_walk(s, "a", False, None, 100, 1000, None, "a@gone")[0] == []
    # Sent again, the command is answered from the request log (the key names the job's cancel).
    again = apply(s, commands.cancel_runs(T0 + 41 * SEC, "k-1", runs=ids[1:2], name="a", upto="a@x"))
    assert again["duplicate"] and again["upto"] == newest and s.runs[ids[1]]["state"] == "queued"
    assert not apply(s, commands.cancel_runs(T0 + 41 * SEC, "k-1", runs=ids[1:2], name="b"))["ok"]
    # Without a key: no upto in the answer (nothing to remember); a bad upto changes nothing.
    assert "upto" not in apply(s, commands.cancel_runs(T0 + 42 * SEC, None, runs=ids[1:2]))
    for field, bad in (("upto", 7), ("upto", ""), ("upto", "x" * (limits.run_id_chars_max + 1)),
                       ("upto_at", "1"), ("upto_at", -1), ("upto_at", True)):
        refused(s, commands.make("cancel_runs", T0 + 43 * SEC, None, runs=ids[2:], running=False, **{field: bad}),
                "invalid_command")
    assert s.runs[ids[2]]["state"] == "queued"


def test_a_retrys_bound_outlives_its_entry_trimmed_from_the_history():
    """A review: ``upto`` is the newest entry when the first attempt read, and a finished entry
    is trimmed wherever it is (the older queued ones kept), so the retry found no bound and
    cancelled nothing of what the first attempt left. Its ``fired_at`` bounds the walk then."""
    from raftsched.core import queries
    s = new_state(("a", spec_of({"every_s": 10}, "fire_all", grace_s=3600, history=3)))
    tick(s, T0 + 60 * SEC)  # six queued runs
    ids, _, newest, newest_at = queries.cancel_walk(s, "a", False, None, 100, 1000)
    assert len(ids) == 6 and newest == ids[-1]
    # The first attempt's key command ends the first two and the newest (its other part failed).
    apply(s, commands.cancel_runs(T0 + 61 * SEC, "k-1", runs=ids[:2], name="a", upto=newest, upto_at=newest_at))
    apply(s, commands.cancel_runs(T0 + 61 * SEC, None, runs=ids[4:]))
    for k in range(7, 25):  # later fires trim the finished entries, the newest read among them
        tick(s, T0 + k * 10 * SEC)
    assert newest not in s.history["a"] and ids[2] in s.history["a"]
    left = queries.cancel_walk(s, "a", False, None, 100, 1000, None, newest, newest_at)[0]
    assert left == ids[2:4], left  # not the runs fired since
