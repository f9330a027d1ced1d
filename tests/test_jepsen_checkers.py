"""The jepsen-style checkers (jepsen-style/checker.py) on known-good and known-bad histories.

Each test starts from one small, hand-built run that every checker judges valid (``good()``), breaks
exactly one property, and checks that the matching checker says invalid (or unknown where the
property was not exercised) and names the counterexample.
"""
from __future__ import annotations

import copy
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jepsen-style"))

import checker  # noqa: E402
import failure_plan  # noqa: E402

T0 = 1_800_000_000_000  # a whole second
EXEC = {"type": "python", "target": "jepsen_runner:attempt"}
SPEC_A = {"schedule": {"every_s": 1}, "executor": EXEC, "misfire": {"policy": "skip", "grace_s": 1},
          "retry": {"max_attempts": 1, "backoff_s": 0.5, "backoff_multiplier": 1, "backoff_max_s": 4, "jitter": 0.1},
          "timeout_s": 30, "history": 1000, "description": "version 1"}
SPEC_B = {"schedule": {"every_s": 2}, "executor": EXEC, "misfire": {"policy": "fire_once", "grace_s": 1},
          "retry": {"max_attempts": 2, "backoff_s": 0.5, "backoff_multiplier": 1, "backoff_max_s": 4, "jitter": 0.1},
          "timeout_s": 30, "history": 1000, "description": "version 1"}
READ_AT = T0 + 24_000
HEAL = T0 + 15_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{ms % 1000:03d}Z" if ms % 1000 else "Z")


def stored(spec: dict) -> dict:
    """The spec as the API returns it: the client's fields plus the defaults it filled in."""
    s = copy.deepcopy(spec)
    s["misfire"].setdefault("max_catchup", 100)
    s.update(payload={}, queue="default", priority=5, tenant="default")
    return s


class Builder:
    def __init__(self) -> None:
        self.history: list[dict] = []
        self.sink: list[dict] = []
        self.runs: list[dict] = []
        self.token = 0
        self.seq = 0
        self.t = T0

    def op(self, f: str, job: str, type_: str, spec=None, status=None, value=None, inv_ms=None, done_ms=None):
        key = f"k{len(self.history)}"
        inv = {"process": "client-0", "type": "invoke", "f": f, "job": job, "node": 0, "key": key,
               "index": len(self.history), "t_ms": inv_ms if inv_ms is not None else T0 + 50}
        if spec is not None:
            inv["spec"] = spec
        self.history.append(inv)
        done = dict(inv, type=type_, index=len(self.history), t_ms=done_ms if done_ms is not None else inv["t_ms"] + 50)
        if status is not None:
            done["status"] = status
        if value is not None:
            done["value"] = value
        self.history.append(done)

    def write(self, rid, job, slot, attempt, token, phase, ok, accepted=True, t=None):
        self.seq += 1
        self.sink.append({"seq": self.seq, "resource": rid, "run": rid, "job": job, "slot": slot, "attempt": attempt,
                          "token": token, "phase": phase, "ok": ok, "accepted": accepted, "worker": "node-2/1",
                          "t_ms": t or slot + 100})

    def run(self, job: str, slot: int, spec: dict, fail_pct: int, fault_first: bool = False,
            backfill: str | None = None) -> dict:
        """A scheduled run that follows the failure plan (attempt 1 lost to a lease expiry when
        ``fault_first``), with its attempts in the state and its writes at the sink; with
        ``backfill``, that backfill's run of the slot (its id suffixed: the slot ran already)."""
        rid = f"{job}@{slot}" if backfill is None else f"{job}@{slot}#b{backfill}"
        attempts, t = [], slot + 50
        budget = spec["retry"]["max_attempts"]
        n = 0
        while n < budget:
            n += 1
            self.token += 1
            tok = self.token
            fault = fault_first and n == 1
            ok = not fault and not failure_plan.attempt_fails(rid, n, fail_pct)
            self.write(rid, job, slot, n, tok, "begin", None, t=t)
            if not fault:
                self.write(rid, job, slot, n, tok, "end", ok, t=t + 100)
            attempts.append({"attempt": n, "token": tok, "worker": "node-2/1", "ok": ok, "started_at": t, "finished_at": t + 200,
                             "error": None if ok else ("lease expired (worker node-2/1 stopped heartbeating)" if fault
                                                      else f"PlannedFailure: {failure_plan.PLANNED_FAILURE} of attempt {n}")})
            t += 200 + 600  # the backoff (0.5 s +- 10 %) and a little more
            if ok:
                break
        state = "succeeded" if attempts[-1]["ok"] else "dead"
        if fault_first and n == 1:
            # The stale attempt wakes up and writes after attempt 2 did: refused.
            pass
        r = {"id": rid, "job": job, "slot_ms": slot, "state": state, "kind": "scheduled" if backfill is None else "backfill",
             "backfill": backfill, "requeue": None, "attempt": n,
             "fencing_token": attempts[-1]["token"], "worker": "node-2/1", "fired_at": slot + 20,
             "started_at": attempts[-1]["started_at"], "finished_at": attempts[-1]["finished_at"],
             "slot_to": None, "count": None, "reason": None, "attempts": attempts}
        self.runs.append(r)
        return r


def good() -> dict:
    b = Builder()
    b.op("create", "a", "ok", SPEC_A, 201, {"created": True})
    b.op("create", "b", "ok", SPEC_B, 201, {"created": True})
    plan = {"a": {"fail_pct": 0, "work_ms": [50, 300]}, "b": {"fail_pct": 50, "work_ms": [50, 300]}}
    for k in range(2, 22):                       # a: every 1 s, first slot one interval after the anchor
        b.run("a", T0 + 1000 * k, SPEC_A, 0)
    faulted = None
    for k in range(10):                          # b: every 2 s
        slot = T0 + 3000 + 2000 * k
        if faulted is None and not failure_plan.attempt_fails(f"b@{slot}", 2, 50):
            faulted = b.run("b", slot, SPEC_B, 50, fault_first=True)
            a1 = faulted["attempts"][0]
            b.write(faulted["id"], "b", slot, 1, a1["token"], "end", True, accepted=False, t=slot + 5000)
        else:
            b.run("b", slot, SPEC_B, 50)
    # A backfill of job a, reprocess all, over three of its slots (they ran: their runs get the
    # backfill's suffix), dry-run first.
    bf_slots = [T0 + 3000, T0 + 4000, T0 + 5000]
    b.op("backfill", "a", "ok", value={"dry": {"dry_run": True, "slots": [iso(x) for x in bf_slots], "left_out": []},
                                        "res": {"id": "bf-0-1", "state": "running"}}, inv_ms=T0 + 12_000)
    b.history[-1]["id"] = b.history[-2]["id"] = "bf-0-1"
    for slot in bf_slots:
        b.run("a", slot, SPEC_A, 0, backfill="bf-0-1")
        b.runs[-1]["fired_at"] = T0 + 12_100
    # Tokens come from one counter in grant order, and the sink sees writes in time order.
    atts = sorted((a for r in b.runs for a in r["attempts"]), key=lambda a: (a["started_at"], a["token"]))
    renum = {a["token"]: k + 1 for k, a in enumerate(atts)}
    for r in b.runs:
        for a in r["attempts"]:
            a["token"] = renum[a["token"]]
        r["fencing_token"] = r["attempts"][-1]["token"]
    b.sink.sort(key=lambda w: (w["t_ms"], w["seq"]))
    for k, w in enumerate(b.sink):
        w.update(token=renum[w["token"]], seq=k + 1)
    outcomes = {r["state"] for r in b.runs if r["job"] == "b"}
    assert outcomes == {"succeeded", "dead"}, "the plan must give both outcomes for job b"
    jobs = [{"name": "a", "spec": stored(SPEC_A), "paused": False, "cursor": READ_AT, "created": T0 + 60},
            {"name": "b", "spec": stored(SPEC_B), "paused": False, "cursor": READ_AT, "created": T0 + 60}]

    backfills = [{"id": "bf-0-1", "kind": "backfill", "job": "a", "state": "done", "reason": None,
                  "progress": {"planned": 3, "created": 3, "left_out": 0, "left_out_reasons": {}}}]

    def read(node, phase):
        return {"node": node, "phase": phase, "consistent": True, "t_start_ms": READ_AT,
                "jobs": copy.deepcopy(jobs), "runs": copy.deepcopy(b.runs), "backfills": copy.deepcopy(backfills),
                "sink": {"name": "jepsen", "cursor": 1, "behind": 0, "dead": 0}}
    # The notifications receiver: job b's first dead run told once (its incident), delivered twice.
    first_dead = min((r for r in b.runs if r["state"] == "dead"), key=lambda r: r["slot_ms"])
    ev = {"event_id": "ev-1", "seq": 1, "kind": "run.dead", "at": first_dead["finished_at"], "job": "b",
          "tenant": "default", "slot": first_dead["slot_ms"], "run_id": first_dead["id"], "attempt": 2,
          "reason": "exit status 1", "queue": "default", "consecutive_failures": 1}
    events = [{"t_ms": first_dead["finished_at"] + 50 * k, "signed": True, "event": dict(ev),
               "idempotency_key": "ev-1"} for k in (1, 2)]
    # The monitor: every node's role and commit index once a second; node-1 leads in term 1, node-3
    # from 9 s in term 2; node-2 is paused from 5 s to 11 s (no answer); the commit index rises.
    monitor = []
    for k in range(1, 24):
        for i in range(3):
            rec = {"t_ms": T0 + 1000 * k, "node": i, "up": True, "alive": True, "paused": False}
            if i == 1 and 5 <= k <= 11:
                rec.update(up=False, paused=True)
            else:
                lead = (i == 0) if k < 9 else (i == 2)
                rec.update(role="leader" if lead else "follower", term=1 if k < 9 else 2, commit=100 + 10 * k)
            monitor.append(rec)
    hashes = [{"node": i, "applied": 100, "hash": "h100"} for i in range(3)]
    return {
        "schedule": {"seed": 1, "profile": "ci", "time_limit_s": 20, "nemeses": ["pause"], "plan": {"jobs": plan},
                     "faults": [{"kind": "pause"}]},
        "history": b.history, "sink": b.sink, "events": events,
        "reads": {"final": {str(i): read(i, "final") for i in range(3)},
                  "restart": {str(i): read(i, "restart") for i in range(3)}},
        "periodic": [], "monitor": monitor,
        "faults": [{"kind": "pause", "start_ms": T0 + 5000, "end_ms": T0 + 11000, "nodes": [1], "fault": {"kind": "pause"}}],
        "hashes": {"final": hashes, "restart": copy.deepcopy(hashes)},
        "times": {"t0_ms": T0, "heal_ms": HEAL},
        "settle": {"pending_count": 0},
    }


@pytest.fixture(autouse=True)
def low_thresholds(monkeypatch):
    monkeypatch.setattr(checker, "MIN_CLIENT_OK", 2)
    monkeypatch.setattr(checker, "MIN_SINK_WRITES", 10)


def each_read(data):
    for phase in ("final", "restart"):
        yield from data["reads"][phase].values()


def verdict(data, name):
    r = checker.CHECKERS[name](data)
    return r["valid"], r["counterexamples"]


# ------------------------------------------------------------------------------- the good run

def test_the_good_run_is_valid_for_every_checker():
    res = checker.check_all(good())
    # power-loss judges only runs with the power nemesis (test_power_loss_is_not_judged_...)
    assert {n: r["valid"] for n, r in res["checkers"].items()} == {n: "valid" for n in checker.CHECKERS
                                                                  if n != "power-loss"}, res
    assert res["valid"] == "valid"
    text = checker.render_verdict(res, good())
    assert "OVERALL: VALID" in text and "replay:" in text


def test_verdicts_combine_invalid_over_unknown_over_valid():
    assert checker.combine("valid", "unknown") == "unknown"
    assert checker.combine("unknown", "invalid", "valid") == "invalid"
    assert checker.combine("valid", "valid") == "valid"


# ------------------------------------------------------------------------------- no lost slot

def test_a_slot_neither_run_nor_recorded_is_lost():
    d = good()
    for r in each_read(d):
        r["runs"] = [x for x in r["runs"] if x["id"] != f"a@{T0 + 7000}"]
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 7000}" in ex[0]


def test_slots_due_before_the_read_must_be_handled():
    d = good()
    for r in each_read(d):
        r["t_start_ms"] = READ_AT + 5000   # slots up to READ_AT + 2000 were due: a stalled schedule
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and "neither a run nor recorded" in ex[0]


def test_a_record_its_policy_allows_covers_slots():
    d = good()
    for r in each_read(d):
        keep = [x for x in r["runs"] if not (x["job"] == "a" and T0 + 5000 <= x["slot_ms"] <= T0 + 8000)]
        keep.append({"id": f"a@{T0 + 5000}", "job": "a", "slot_ms": T0 + 5000, "slot_to": T0 + 8000, "count": 4,
                     "state": "skipped", "reason": "misfire", "kind": "recorded", "fired_at": T0 + 9000})
        r["runs"] = keep
    assert verdict(d, "no-lost-slot")[0] == "valid"


def test_a_record_its_policy_forbids_is_invalid():
    d = good()
    for r in each_read(d):
        keep = [x for x in r["runs"] if x["id"] != f"a@{T0 + 5000}"]
        keep.append({"id": f"a@{T0 + 5000}", "job": "a", "slot_ms": T0 + 5000, "slot_to": None, "count": None,
                     "state": "coalesced", "reason": "misfire", "kind": "recorded", "fired_at": T0 + 9000})
        r["runs"] = keep
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and "coalesced/misfire" in ex[0] and "skip" in ex[0]


def test_a_record_that_miscounts_its_slots_is_invalid():
    d = good()
    for r in each_read(d):
        keep = [x for x in r["runs"] if not (x["job"] == "a" and T0 + 5000 <= x["slot_ms"] <= T0 + 6000)]
        keep.append({"id": f"a@{T0 + 5000}", "job": "a", "slot_ms": T0 + 5000, "slot_to": T0 + 6000, "count": 5,
                     "state": "skipped", "reason": "misfire", "kind": "recorded", "fired_at": T0 + 9000})
        r["runs"] = keep
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and "says 5 slots" in ex[0]


def test_the_first_slot_after_an_acknowledged_create_is_not_lost():
    d = good()
    for r in each_read(d):
        r["runs"] = [x for x in r["runs"] if x["id"] != f"a@{T0 + 2000}"]
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and f"slot {T0 + 2000} lost" in ex[0]


def test_a_succeeded_run_must_have_reached_the_sink():
    d = good()
    rid = f"a@{T0 + 4000}"
    d["sink"] = [w for w in d["sink"] if not (w["resource"] == rid and w["phase"] == "end")]
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and rid in ex[0] and "sink" in ex[0]


def test_a_paused_job_is_checked_up_to_its_cursor():
    d = good()
    for r in each_read(d):
        r["jobs"][0]["paused"] = True
        r["jobs"][0]["cursor"] = T0 + 15_000
        r["runs"] = [x for x in r["runs"] if not (x["job"] == "a" and x["slot_ms"] > T0 + 15_000)]
    assert verdict(d, "no-lost-slot")[0] == "valid"


# ------------------------------------------------------------------------------- no early start

def _begin_of(d, rid):
    return next(w for w in d["sink"] if w["resource"] == rid and w["phase"] == "begin")


def _leader_clock_fault(d, offset_ms=6000):
    d["faults"].append({"kind": "clock", "start_ms": T0 + 5500, "end_ms": T0 + 12_000, "nodes": [0],
                        "fault": {"kind": "clock", "offset_ms": offset_ms}})


def test_a_run_begun_before_its_slot_by_more_than_the_bound_is_invalid():
    """The issue's soak run: a leader stepped 6 s fast, and runs began seconds before their slot
    by the sink's clock. Now a verdict, not a figure."""
    d = good()
    _leader_clock_fault(d)
    rid = f"a@{T0 + 9000}"
    _begin_of(d, rid)["t_ms"] = T0 + 9000 - checker.CLOCK_SKEW_MS_MAX - 1960
    v, ex = verdict(d, "no-early-start")
    assert v == "invalid" and len(ex) == 1
    assert rid in ex[0] and f"began {checker.CLOCK_SKEW_MS_MAX + 1960} ms before its slot" in ex[0]
    assert "clock 6000 ms on node-1" in ex[0]
    stats = checker.check_early_starts(d)["stats"]
    assert stats["runs_begun_before_their_slot"] == 1
    assert stats["earliest_begin_before_slot_ms"] == checker.CLOCK_SKEW_MS_MAX + 1960
    assert checker.check_all(d)["valid"] == "invalid"


def test_a_run_begun_before_its_slot_within_the_bound_is_valid_and_counted():
    d = good()
    _leader_clock_fault(d, -6000)
    rid = f"a@{T0 + 9000}"
    _begin_of(d, rid)["t_ms"] = T0 + 9000 - checker.CLOCK_SKEW_MS_MAX  # the bound itself
    r = checker.check_early_starts(d)
    assert r["valid"] == "valid" and r["counterexamples"] == []
    assert r["stats"]["runs_begun_before_their_slot"] == 1
    assert r["stats"]["earliest_begin_before_slot_ms"] == checker.CLOCK_SKEW_MS_MAX
    assert r["stats"]["clock_faults"] == 1 and r["note"] == ""


def test_no_early_start_is_unknown_when_no_attempt_began_and_notes_a_run_without_clock_faults():
    d = good()
    assert checker.check_early_starts(d)["valid"] == "valid"
    assert "no clock fault" in checker.check_early_starts(d)["note"]
    d["sink"] = [w for w in d["sink"] if w["phase"] != "begin"]
    assert verdict(d, "no-early-start")[0] == "unknown"


def test_the_bound_is_the_products():
    from raftsched.core import limits
    assert checker.CLOCK_SKEW_MS_MAX == limits.clock_skew_ms_max


# ------------------------------------------------------------------------------- no duplicate

def test_a_slot_that_is_a_run_and_a_record_is_a_duplicate():
    d = good()
    r = d["reads"]["final"]["1"]
    r["runs"].append({"id": f"a@{T0 + 3000}x", "job": "a", "slot_ms": T0 + 3000, "slot_to": T0 + 4000, "count": 2,
                      "state": "skipped", "reason": "misfire", "kind": "recorded", "fired_at": T0 + 9000})
    v, ex = verdict(d, "no-duplicate")
    assert v == "invalid" and f"slot {T0 + 3000}" in ex[0] and "node-2" in ex[0]


def test_a_run_created_twice_changes_its_fire_time_between_reads():
    d = good()
    periodic = copy.deepcopy(d["reads"]["final"]["0"])
    periodic.update(phase="periodic", t_start_ms=T0 + 10_000)
    periodic["runs"][3]["fired_at"] += 777
    d["periodic"] = [periodic]
    v, ex = verdict(d, "no-duplicate")
    assert v == "invalid" and "fired twice" in ex[0]


def test_one_attempt_granted_twice_at_the_sink_is_a_duplicate():
    d = good()
    w = next(w for w in d["sink"] if w["resource"] == f"a@{T0 + 6000}" and w["phase"] == "begin")
    d["sink"].append(dict(w, seq=9999, token=10_000))
    v, ex = verdict(d, "no-duplicate")
    assert v == "invalid" and "granted twice" in ex[0]


def test_a_token_given_to_two_runs_is_a_duplicate():
    d = good()
    w = next(w for w in d["sink"] if w["resource"] == f"a@{T0 + 6000}" and w["phase"] == "begin")
    d["sink"].append(dict(w, seq=9999, resource=f"a@{T0 + 99000}", run=f"a@{T0 + 99000}"))
    v, ex = verdict(d, "no-duplicate")
    assert v == "invalid" and f"token {w['token']}" in ex[0]


# ------------------------------------------------------------------------------- fencing

def test_the_sink_accepting_a_lower_token_is_invalid():
    d = good()
    w = next(w for w in d["sink"] if not w["accepted"])
    w["accepted"] = True
    v, ex = verdict(d, "fencing")
    assert v == "invalid" and f"accepted token {w['token']}" in ex[0]


def test_pauses_without_a_refused_write_are_not_exercised():
    d = good()
    d["sink"] = [w for w in d["sink"] if w["accepted"]]
    r = checker.check_fencing(d)
    assert r["valid"] == "unknown" and "not exercised" in r["note"]


def test_no_pause_and_no_refusal_is_valid():
    d = good()
    d["sink"] = [w for w in d["sink"] if w["accepted"]]
    d["faults"] = []
    assert verdict(d, "fencing")[0] == "valid"


def test_tokens_must_grow_with_grant_time():
    d = good()
    r = d["reads"]["final"]["0"]["runs"][5]
    r["attempts"][0]["started_at"] = T0 - 50_000
    v, ex = verdict(d, "fencing")
    assert v == "invalid" and "do not grow with grant time" in ex[0]


# ------------------------------------------------------------------------------- durability

def test_an_acknowledged_create_missing_from_the_final_state_is_lost():
    d = good()
    for r in each_read(d):
        r["jobs"] = [j for j in r["jobs"] if j["name"] != "b"]
        r["runs"] = [x for x in r["runs"] if x["job"] != "b"]
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "job b is absent" in ex[0]


def test_a_job_no_client_asked_for_is_invalid():
    d = good()
    for r in each_read(d):
        r["jobs"].append({"name": "ghost", "spec": stored(SPEC_A), "paused": False, "cursor": READ_AT})
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "ghost" in ex[0]


def test_an_unknown_create_may_or_may_not_appear_and_is_counted_recovered():
    d = good()
    d["history"].extend(_ops([("create", "c", "info", SPEC_A, 504, None)], start=len(d["history"])))
    assert verdict(d, "durability")[0] == "valid"
    for r in each_read(d):
        r["jobs"].append({"name": "c", "spec": stored(SPEC_A), "paused": False, "cursor": READ_AT})
    res = checker.check_durability(d)
    assert res["valid"] == "valid" and res["stats"]["info_recovered"] == 1


def test_an_acknowledged_delete_of_a_job_still_present_is_invalid():
    d = good()
    d["history"].extend(_ops([("delete", "b", "ok", None, 200, {"deleted": True})], start=len(d["history"])))
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "job b" in ex[0]


def test_an_acknowledged_pause_must_show_in_the_final_state():
    d = good()
    d["history"].extend(_ops([("pause", "a", "ok", None, 200, {"paused": True})], start=len(d["history"])))
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "job a" in ex[0]
    # An unknown resume after it may have applied, or not: both final states are explained.
    d["history"].extend(_ops([("resume", "a", "info", None, 504, None)], start=len(d["history"])))
    assert verdict(d, "durability")[0] == "valid"


def test_an_unknown_update_may_apply_after_a_later_acknowledged_one():
    d = good()
    v2 = dict(SPEC_A, description="version 2")
    v3 = dict(SPEC_A, description="version 3")
    d["history"].extend(_ops([("update", "a", "info", v2, 504, None), ("update", "a", "ok", v3, 200, {"created": False})],
                             start=len(d["history"])))
    for r in each_read(d):
        r["jobs"][0]["spec"] = stored(v2)   # the unknown write landed last
    assert verdict(d, "durability")[0] == "valid"


def test_an_ok_answer_no_order_explains_is_invalid():
    d = good()
    # "created": true for a job an earlier acknowledged create had already created.
    d["history"].extend(_ops([("update", "a", "ok", SPEC_A, 201, {"created": True})], start=len(d["history"])))
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "no order" in ex[0]


def test_a_run_lost_across_the_full_restart_is_invalid():
    d = good()
    d["reads"]["restart"]["2"]["runs"].pop(4)
    v, ex = verdict(d, "durability")
    assert v == "invalid" and "node-3" in ex[0] and "gone after" in ex[0]


def _ops(specs, start):
    out = []
    for k, (f, job, type_, spec, status, value) in enumerate(specs):
        key = f"x{start + 2 * k}"
        inv = {"process": "client-1", "type": "invoke", "f": f, "job": job, "node": 1, "key": key,
               "index": start + 2 * k, "t_ms": T0 + 20_000 + k}
        if spec is not None:
            inv["spec"] = spec
        done = dict(inv, type=type_, index=start + 2 * k + 1, status=status)
        if value is not None:
            done["value"] = value
        out += [inv, done]
    return out


# ------------------------------------------------------------------------------- retries

def _b_run(d, pred):
    return next(r for r in d["reads"]["final"]["0"]["runs"] if r["job"] == "b" and pred(r))


def test_an_attempt_the_plan_fails_must_not_succeed():
    d = good()
    r = _b_run(d, lambda r: r["state"] == "dead")
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][0].update(ok=True, error=None)
        x["attempts"] = x["attempts"][:1]
        x["state"] = "succeeded"
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "the plan fails it" in ex[0]


def test_a_dead_run_that_had_budget_left_is_invalid():
    d = good()
    r = _b_run(d, lambda r: r["state"] == "dead")
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"] = x["attempts"][:1]
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "dead after 1 failed attempt" in ex[0]


def test_a_retry_before_its_backoff_is_invalid():
    d = good()
    r = _b_run(d, lambda r: len(r["attempts"]) == 2 and "planned" in (r["attempts"][0]["error"] or ""))
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][1]["started_at"] = x["attempts"][0]["finished_at"] + 100
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "backoff" in ex[0]


def test_an_attempt_lost_with_its_worker_is_retried_at_once_and_spends_no_budget():
    d = good()
    r = _b_run(d, lambda r: "lease expired" in (r["attempts"][0]["error"] or ""))
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][1]["started_at"] = x["attempts"][0]["finished_at"] + 1   # no backoff after a loss
    assert verdict(d, "retries")[0] == "valid"
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"] = x["attempts"][:1]
        x["state"] = "dead"   # dead after one loss: losses up to lease_losses_max are retried
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "losing its worker 1 time" in ex[0]


def test_a_retry_after_max_attempts_failures_is_invalid():
    d = good()
    r = _b_run(d, lambda r: r["state"] == "dead")
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["state"] = "queued"   # a third attempt for a job with max_attempts 2
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "retried after 2 failed attempt(s)" in ex[0]


def test_no_dead_letter_means_retries_were_not_exercised():
    d = good()
    d["schedule"]["plan"]["jobs"]["b"]["fail_pct"] = 0
    for read in each_read(d):
        read["runs"] = [x for x in read["runs"] if x["job"] != "b"]
    assert checker.check_retries(d)["valid"] == "unknown"


# ------------------------------------------------------------------------------- convergence

def test_different_hashes_at_the_same_applied_count_diverge():
    d = good()
    d["hashes"]["final"][2]["hash"] = "other"
    v, ex = verdict(d, "convergence")
    assert v == "invalid" and "node-1" in ex[0] and "node-3" in ex[0]


def test_nodes_never_sampled_together_is_unknown():
    d = good()
    d["hashes"]["final"] = [{"node": 0, "applied": 100, "hash": "h"}, {"node": 1, "applied": 101, "hash": "h2"}]
    assert checker.check_convergence(d)["valid"] == "unknown"


def test_a_job_that_fires_nothing_after_the_heal_is_a_liveness_failure():
    d = good()
    for read in each_read(d):
        read["runs"] = [x for x in read["runs"] if not (x["job"] == "a" and x["slot_ms"] > HEAL)]
    v, ex = verdict(d, "convergence")
    assert v == "invalid" and "job a fired nothing" in ex[0]


def test_runs_stuck_after_the_heal_are_a_liveness_failure():
    d = good()
    d["settle"] = {"pending_count": 2, "waited_s": 45, "pending_at_end": ["a@1", "b@2"]}
    v, ex = verdict(d, "convergence")
    assert v == "invalid" and "still queued or running" in ex[0]


def test_runs_held_by_a_pause_may_stay_queued_only_while_their_job_is_paused():
    """A pause holds its job's runs fired ahead (queued, due null) until the resume: the harness
    leaves them out of the runs that must finish after the heal, and the checker holds each to
    its job being paused in the final read."""
    d = good()
    d["settle"] = {"pending_count": 0, "waited_s": 8, "pending_at_end": [], "held_at_end": ["a@1", "a@2"]}
    v, ex = verdict(d, "convergence")
    assert v == "invalid" and "run a@1 was held" in ex[0] and "not paused" in ex[0]
    for read in each_read(d):
        for j in read["jobs"]:
            j["paused"] = j["paused"] or j["name"] == "a"
    res = checker.check_convergence(d)
    assert res["valid"] == "valid" and res["stats"]["held_by_pause_at_end"] == 2, res


def test_a_node_without_a_consistent_read_after_healing_is_invalid():
    d = good()
    d["reads"]["final"]["1"] = {"node": 1, "phase": "final", "error": "GET failed 5 times: HTTP 503"}
    v, ex = verdict(d, "convergence")
    assert v == "invalid" and "node-2 served no consistent read" in ex[0]


# ------------------------------------------------------------------------------- commit progress

def commit_run(commit, seconds=45, faults=()):
    """A run's monitor alone: a round a second for ``seconds``; ``commit(node, k)`` is the node's
    commit index in round k (None: it did not answer); node-1 leads."""
    monitor = []
    for k in range(seconds):
        for i in range(3):
            c = commit(i, k)
            rec = {"t_ms": T0 + 1000 * k, "node": i, "up": c is not None, "alive": True, "paused": False}
            if c is not None:
                rec.update(role="leader" if i == 0 else "follower", term=1, commit=c)
            monitor.append(rec)
    return {"monitor": monitor, "faults": list(faults), "times": {"t0_ms": T0}}


def frozen_from_10(i, k):
    """node-3's commit index stops at 110 in round 10; the others' go on rising."""
    return 100 + (min(k, 10) if i == 2 else k)


def fault_on(kind, node, start_s, end_s):
    nodes = [0, 1, 2] if kind == "restart-all" else [node]
    return {"kind": kind, "start_ms": T0 + 1000 * start_s - 300, "in_place_ms": T0 + 1000 * start_s,
            "end_ms": T0 + 1000 * end_s, "nodes": nodes, "fault": {"kind": kind}}


def test_a_follower_frozen_while_the_leader_advances_is_a_stall():
    r = checker.check_commit_progress(commit_run(frozen_from_10))
    assert r["valid"] == "invalid" and r["stats"]["stalls"] == 1
    ex = r["counterexamples"][0]
    # the node, from-to (behind from round 11 to the end), its commit index, the leader's
    assert "node-3 stalled" in ex and "stayed at 110" in ex
    assert f"from {T0 + 11_000} (+11.0 s) to {T0 + 44_000} (+44.0 s), 33.0 s" in ex
    assert "111 -> 144" in ex and "leader: node-1 at 111 -> node-1 at 144" in ex
    assert r["stalls"][0]["node"] == 2
    assert "product_stalled_s_max" not in r["stats"]  # a product that does not report its own view
    # The product's own report is a figure, recorded beside the samples; it does not judge.
    d = commit_run(frozen_from_10)
    for rec in d["monitor"]:
        if rec["node"] == 2 and rec["t_ms"] >= T0 + 21_000:
            rec.update(stalled_s=(rec["t_ms"] - T0 - 11_000) / 1000, conditions=["cluster.follower_stalled"])
    r = checker.check_commit_progress(d)
    assert r["stats"]["product_stalled_s_max"] == 33.0 and r["stats"]["product_follower_stalled_samples"] == 24
    assert checker.check_all(commit_run(frozen_from_10))["checkers"]["commit-progress"]["valid"] == "invalid"


@pytest.mark.parametrize("kind", ["partition", "pause", "kill", "restart-all"])
def test_the_same_freeze_while_the_node_is_under_a_fault_is_not_a_stall(kind):
    d = commit_run(frozen_from_10, faults=[fault_on(kind, 2, 9, 41)])  # healed 41 s; grace to 46 s
    r = checker.check_commit_progress(d)
    assert r["valid"] == "valid", r["counterexamples"]


def test_a_clock_jump_or_a_fault_on_another_node_excuses_nothing():
    for f in (fault_on("clock", 2, 9, 41), fault_on("partition", 1, 9, 41), fault_on("worker-kill", 2, 9, 41)):
        assert checker.check_commit_progress(commit_run(frozen_from_10, faults=[f]))["valid"] == "invalid", f


def test_a_node_still_frozen_past_the_grace_after_its_fault_healed_is_a_stall():
    # Partitioned from 9 s to 20 s: judged again from 25 s (grace 5 s); frozen to 44 s: 19 s.
    r = checker.check_commit_progress(commit_run(frozen_from_10, faults=[fault_on("partition", 2, 9, 20)]))
    assert r["valid"] == "invalid" and f"from {T0 + 26_000} (+26.0 s)" in r["counterexamples"][0]
    # ... but one that catches up within the bound after the grace is not.

    def catches_up_at_38(i, k):
        return 100 + k if i != 2 or k >= 38 else 110
    r = checker.check_commit_progress(commit_run(catches_up_at_38, faults=[fault_on("partition", 2, 9, 20)]))
    assert r["valid"] == "valid" and r["stats"]["longest_freeze_ms"] == 11_000


def test_a_freeze_while_the_leader_does_not_advance_either_is_not_a_stall():
    # Idle: every node at 150 for the whole run; or node-3 one entry behind a leader that never
    # moves again: the highest commit index did not advance during the freeze.
    assert checker.check_commit_progress(commit_run(lambda i, k: 150))["valid"] == "valid"
    r = checker.check_commit_progress(commit_run(lambda i, k: min(100 + k, 150 if i == 2 else 151), seconds=90))
    assert r["valid"] == "valid" and r["stats"]["stalls"] == 0


def test_a_follower_that_lags_but_moves_is_not_a_stall():
    r = checker.check_commit_progress(commit_run(lambda i, k: 100 + k - (3 if i == 2 else 0)))
    assert r["valid"] == "valid" and r["stats"]["longest_freeze_ms"] == 0


def test_a_round_without_the_nodes_answer_neither_extends_nor_ends_its_freeze():
    r = checker.check_commit_progress(commit_run(lambda i, k: None if i == 2 and 20 <= k < 30 else frozen_from_10(i, k)))
    assert r["valid"] == "invalid" and "33.0 s" in r["counterexamples"][0]


def test_the_live_watch_reports_a_stall_once_as_soon_as_it_passes_the_bound():
    d = commit_run(frozen_from_10)
    watch, seen = checker.CommitWatch(), []
    for t, samples in checker.monitor_rounds(d["monitor"]):
        seen += [(t, sp["node"]) for sp in watch.feed(t, samples, checker.excused_nodes(d["faults"], t))]
    # behind from 11 s: more than 15 s frozen at 27 s
    assert seen == [(T0 + 27_000, 2)]
    assert len(watch.finish()) == 1


def test_the_live_watch_excuses_a_fault_not_ended_yet():
    f = {"kind": "partition", "start_ms": T0 + 8_700, "in_place_ms": T0 + 9_000, "nodes": [2]}
    assert checker.excused_nodes([f], T0 + 40_000) == {2}
    assert checker.excused_nodes([f], T0 + 8_800) == set()          # not in place yet
    assert checker.excused_nodes([dict(f, end_ms=T0 + 20_000)], T0 + 25_000) == {2}   # the grace
    assert checker.excused_nodes([dict(f, end_ms=T0 + 20_000)], T0 + 25_001) == set()
    assert checker.excused_nodes([{"kind": "kill", "start_ms": T0}], T0 + 1) == set()  # no node yet


def test_no_commit_index_sampled_is_unknown():
    d = commit_run(lambda i, k: None)
    assert checker.check_commit_progress(d)["valid"] == "unknown"


# ------------------------------------------------------------------------------- stress

def test_a_run_without_a_leader_change_is_unknown_never_valid():
    d = good()
    d["monitor"] = [m for m in d["monitor"] if m["node"] == 0]
    r = checker.check_stress(d)
    assert r["valid"] == "unknown" and "no leader change" in r["note"]
    assert checker.check_all(d)["valid"] == "unknown"


def test_a_run_with_too_few_operations_is_unknown(monkeypatch):
    monkeypatch.setattr(checker, "MIN_CLIENT_OK", 50)
    r = checker.check_stress(good())
    assert r["valid"] == "unknown" and "client operations" in r["note"]


def test_a_crashing_checker_is_unknown_not_valid(monkeypatch):
    def boom(data):
        raise KeyError("x")
    monkeypatch.setitem(checker.CHECKERS, "fencing", boom)
    res = checker.check_all(good())
    assert res["checkers"]["fencing"]["valid"] == "unknown" and res["valid"] == "unknown"


def test_a_lease_expiring_while_its_worker_was_healthy_is_invalid():
    d = good()
    # The faulted run's expiry (worker node-2) is excused by the pause of node-2 ...
    assert verdict(d, "retries")[0] == "valid"
    # ... but not when the only fault at the time was a clock jump.
    d["faults"] = [{"kind": "clock", "start_ms": T0, "end_ms": T0 + 30_000, "nodes": [0],
                    "fault": {"kind": "clock", "offset_ms": 6000}}]
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "expired" in ex[0] and "+6000 ms on node-1" in ex[0]


def test_a_nodes_own_workers_lease_expiry_is_excused_by_a_fault_that_takes_the_leader_or_a_majority():
    """Seed 4697: a power cut of two nodes of three left the third, its worker healthy, without a
    leader for 4 s: no heartbeat could commit, and its leases expired. A fault of one other node
    that is not the leader still excuses nothing."""
    d = good()
    pause = next(f for f in d["faults"] if f["kind"] == "pause")  # (of node-2, the faulted run's worker's)
    d["faults"] = [dict(pause, kind="power", nodes=[0, 2], fault={"kind": "power", "target": "majority"})]
    assert verdict(d, "retries")[0] == "valid"
    d["faults"] = [dict(pause, kind="kill", nodes=[0], fault={"kind": "kill", "target": "leader"})]
    assert verdict(d, "retries")[0] == "valid"
    d["faults"] = [dict(pause, kind="kill", nodes=[0], fault={"kind": "kill", "target": "follower"})]
    assert verdict(d, "retries")[0] == "invalid"


def test_a_lease_expiring_on_a_node_a_membership_fault_removed_or_cut_off_is_excused():
    """A membership fault kills, cuts off or removes (and stops) the nodes it names: their
    workers' leases expire, as under a kill; a node it does not name is judged as ever."""
    d = good()
    pause = next(f for f in d["faults"] if f["kind"] == "pause")
    for kind in ("member-replace", "member-grow-shrink", "member-remove-leader"):
        d["faults"] = [dict(pause, kind=kind, fault={"kind": kind})]
        assert verdict(d, "retries")[0] == "valid", kind
        d["faults"] = [dict(pause, kind=kind, nodes=[0], fault={"kind": kind})]
        assert verdict(d, "retries")[0] == "invalid", kind
    assert 1 in checker.excused_nodes([dict(pause, kind="member-replace")], pause["start_ms"] + 1)


def test_a_released_attempt_is_retried_at_once_and_spends_no_budget():
    """A remote worker that gives a lease back (release, docs/workers.md): its attempt is neither a
    failure against max_attempts nor a lost lease, and the next one may start at once."""
    d = good()
    r = _b_run(d, lambda r: "lease expired" in (r["attempts"][0]["error"] or ""))
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        a1 = x["attempts"][0]
        a1.update(error="released by worker w1: draining", released=True, worker="w1")
        x["attempts"][1]["started_at"] = a1["finished_at"]
    assert verdict(d, "retries")[0] == "valid"


def test_a_remote_workers_lease_expiry_is_excused_by_its_own_fault_or_any_nodes():
    d = good()
    d["remote_workers"] = ["w1", "w2"]
    r = _b_run(d, lambda r: "lease expired" in (r["attempts"][0]["error"] or ""))
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][0]["worker"] = "w1"
    t_lo, t_hi = r["attempts"][0]["started_at"] - 1000, r["attempts"][0]["finished_at"] + 1000
    # The pause of node-2 in good() overlaps: a remote worker may have talked through it.
    assert verdict(d, "retries")[0] == "valid"
    d["faults"] = [{"kind": "worker-pause", "start_ms": t_lo, "end_ms": t_hi, "workers": ["w2"], "fault": {}}]
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "that worker or any node" in ex[0], "another worker's fault excuses nothing"
    d["faults"][0]["workers"] = ["w1"]
    assert verdict(d, "retries")[0] == "valid"


def test_a_lease_expiry_counts_from_its_grant_when_its_attempt_began_late():
    """A worker can begin an attempt seconds after its grant (its answer waited behind a node
    catching up after a pause): a fault between the grant and the begin explains the expiry."""
    d = good()
    d["remote_workers"] = ["w1"]
    r = _b_run(d, lambda r: "lease expired" in (r["attempts"][0]["error"] or ""))
    a = r["attempts"][0]
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][0]["worker"] = "w1"
    d["sink"] = [w for w in d["sink"] if not (w.get("run") == r["id"] and w.get("attempt") == 1)]
    d["sink"].append({"run": r["id"], "attempt": 1, "phase": "begin", "t_ms": a["started_at"] + 3000})
    d["faults"] = [{"kind": "pause", "start_ms": a["started_at"] - 5000, "end_ms": a["started_at"] + 1000,
                    "nodes": [1], "fault": {"kind": "pause"}}]
    assert verdict(d, "retries")[0] == "valid"
    d["faults"][0]["end_ms"] = a["started_at"] - 1000  # over before the grant: it explains nothing
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "began +3000 ms after its grant" in ex[0], ex


def test_a_spurious_expiry_prints_the_logs_of_its_window(tmp_path):
    """An unexcused lease expiry names its wall-time window, and run.py prints the processes'
    lines of interest in it (log_context): in CI the store goes with the machine."""
    d = good()
    d["remote_workers"] = ["w1"]
    r = _b_run(d, lambda r: "lease expired" in (r["attempts"][0]["error"] or ""))
    for read in each_read(d):
        x = next(x for x in read["runs"] if x["id"] == r["id"])
        x["attempts"][0]["worker"] = "w1"
    d["faults"] = []
    res = checker.check_all(d)
    assert res["checkers"]["retries"]["valid"] == "invalid"
    w = res["checkers"]["retries"]["log_windows"][0]
    a = r["attempts"][0]
    assert w["worker"] == "w1" and w["from_ms"] <= a["started_at"] - 2000 and w["to_ms"] >= a["finished_at"] + 1000

    def stamp(ms):
        return datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds")
    (tmp_path / "w1.log").write_text(
        f"{stamp(a['started_at'])} warning raftsched.worker: worker: heartbeat failed: timeout\n"
        f"{stamp(a['started_at'] + 10)} info raftsched.worker: nothing of interest\n"
        f"{stamp(a['finished_at'] + 60_000)} warning raftsched.worker: worker: heartbeat failed: later\n"
        "not a log line\n")
    (tmp_path / "node-1.log").write_text(
        f"{stamp(a['started_at'] + 5)} info raftsched.replication: replication.role role=leader\n")
    lines = checker.log_context(res, tmp_path)
    assert r["id"] in lines[0] and len(lines) == 3, lines
    assert "w1: warning" in lines[1] and "heartbeat failed: timeout" in lines[1] and "node-1: info" in lines[2]
    assert checker.log_context(checker.check_all(good()), tmp_path) == []


def test_a_run_with_remote_workers_none_of_which_ran_anything_is_unknown():
    d = good()
    d["remote_workers"] = ["w1"]
    r = checker.check_stress(d)
    assert r["valid"] == "unknown" and "remote worker" in r["note"]
    for w in d["sink"][:5]:
        w["worker"] = "w1/77"
    assert checker.check_stress(d)["stats"]["sink_accepted_remote"] == 5


def test_overlap_records_and_replaced_runs_follow_the_overlap_policy():
    d = good()
    rid = f"a@{T0 + 9000}"
    for r in each_read(d):
        x = next(x for x in r["runs"] if x["id"] == rid)
        x.clear()
        x.update(id=rid, job="a", slot_ms=T0 + 9000, slot_to=None, count=None, state="skipped", reason="overlap",
                 kind="recorded", fired_at=T0 + 9010)
    v, ex = verdict(d, "no-lost-slot")
    assert v == "invalid" and "skipped/overlap" in ex[0]      # job a allows overlap
    forbid = dict(SPEC_A, overlap={"policy": "forbid"})
    for op in d["history"]:
        if op.get("job") == "a" and "spec" in op:
            op["spec"] = forbid
    assert verdict(d, "no-lost-slot")[0] == "valid"
    # A run ended "failed" by a replacement: only with overlap policy replace.
    rid = f"a@{T0 + 11000}"
    for r in each_read(d):
        x = next(x for x in r["runs"] if x["id"] == rid)
        x["state"], x["error"] = "failed", f"replaced by run a@{T0 + 12000} (overlap policy replace)"
        x["attempts"][-1].update(ok=False, error=x["error"])
    v, ex = verdict(d, "retries")
    assert v == "invalid" and "overlap policy replace" in ex[0]
    for op in d["history"]:
        if op.get("job") == "a" and "spec" in op:
            op["spec"] = dict(SPEC_A, overlap={"policy": "replace"})
    assert verdict(d, "retries")[0] == "valid"


# ------------------------------------------------------------------------------- backfills

def _backfill_runs(data):
    for r in each_read(data):
        yield r, [x for x in r["runs"] if x.get("backfill") == "bf-0-1"]


def test_a_backfill_that_ran_a_slot_its_dry_run_did_not_list_is_invalid():
    d = good()
    for read, mine in _backfill_runs(d):
        extra = dict(mine[0], id=f"a@{T0 + 9000}#bbf-0-1", slot_ms=T0 + 9000)
        read["runs"].append(extra)
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "did not list" in ex[0], ex


def test_a_backfill_with_two_runs_for_one_slot_is_invalid():
    d = good()
    for read, mine in _backfill_runs(d):
        read["runs"].append(dict(mine[0], id=f"a@{mine[0]['slot_ms']}"))
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "two runs" in ex[0], ex


def test_a_done_backfill_missing_a_listed_slot_is_invalid_but_one_still_running_is_not():
    d = good()
    for read, mine in _backfill_runs(d):
        read["runs"].remove(mine[-1])
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "have no run of it" in ex[0], ex
    for read in each_read(d):
        read["backfills"][0]["state"] = "running"
    assert verdict(d, "backfills")[0] == "unknown"  # nothing done to judge: not exercised


def test_a_slot_not_yet_due_at_the_dry_run_may_have_run_by_the_time_the_backfill_was_made():
    d = good()
    late = T0 + 9000
    op = next(o for o in d["history"] if o.get("f") == "backfill" and o["type"] == "ok")
    op["value"]["dry"]["left_out"] = [{"slot": iso(late), "reason": "not_yet_due"}]
    for read, mine in _backfill_runs(d):
        read["runs"].append(dict(mine[0], id=f"a@{late}#bbf-0-1", slot_ms=late))
    assert verdict(d, "backfills")[0] == "valid"


def test_a_slot_another_backfill_ran_after_leaving_it_out_as_not_yet_due_is_excused():
    """Seed 4699: backfill 1's dry run left a slot out as not yet due, and it ran it all the same
    (due by the time it was made); backfill 2's dry run listed that slot, then found it running and
    left it out. Backfill 2 is done without a run of that slot, rightly."""
    import copy
    d = good()
    late = T0 + 9000
    inv = next(o for o in d["history"] if o.get("f") == "backfill" and o["type"] == "invoke")
    op = next(o for o in d["history"] if o.get("f") == "backfill" and o["type"] == "ok")
    op["value"]["dry"]["left_out"] = [{"slot": iso(late), "reason": "not_yet_due"}]
    for read, mine in _backfill_runs(d):
        read["runs"].append(dict(mine[0], id=f"a@{late}#bbf-0-1", slot_ms=late))
    inv2, op2 = copy.deepcopy(inv), copy.deepcopy(op)
    for o in (inv2, op2):
        o.update(id="bf-0-2", key=o["key"] + "-2", index=o["index"] + 10_000)
    op2["value"]["dry"] = dict(op["value"]["dry"], slots=[iso(late)], left_out=[])
    d["history"] += [inv2, op2]
    for read in each_read(d):
        read["backfills"].append(dict(read["backfills"][0], id="bf-0-2"))
    assert verdict(d, "backfills")[0] == "valid"
    op["value"]["dry"]["left_out"] = []  # backfill 1 could not have run it: backfill 2 missed it
    for read in each_read(d):
        read["runs"] = [x for x in read["runs"] if x["id"] != f"a@{late}#bbf-0-1"]
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "bf-0-2 is done, but slot(s)" in ex[0], ex


def test_a_backfill_that_definitely_did_not_happen_has_no_run():
    d = good()
    op = next(o for o in d["history"] if o.get("f") == "backfill" and o["type"] == "ok")
    op.update(type="fail", status=503)
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "definitely did not happen" in ex[0], ex


def test_a_bulk_requeue_beyond_max_count_or_of_another_job_is_invalid():
    d = good()
    d["history"] += [
        {"process": "client-0", "type": "invoke", "f": "requeue", "job": "b", "node": 0, "key": "rq", "id": "rq-0-9",
         "body": {"job": "b", "max_count": 1}, "index": len(d["history"]), "t_ms": T0 + 13_000},
        {"process": "client-0", "type": "ok", "f": "requeue", "job": "b", "node": 0, "key": "rq", "id": "rq-0-9",
         "body": {"job": "b", "max_count": 1}, "index": len(d["history"]) + 1, "t_ms": T0 + 13_050,
         "value": {"dry": {"runs": []}, "res": {"id": "rq-0-9"}}}]
    assert verdict(d, "backfills")[0] == "valid"
    for read in each_read(d):
        for r in [r for r in read["runs"] if r["job"] == "b"][:2]:
            r["requeue"] = "rq-0-9"
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "more than max_count" in ex[0], ex
    for read in each_read(d):
        for r in read["runs"]:
            if r.get("requeue") == "rq-0-9":
                r["requeue"] = None
        next(r for r in read["runs"] if r["job"] == "a")["requeue"] = "rq-0-9"
    v, ex = verdict(d, "backfills")
    assert v == "invalid" and "of job a" in ex[0], ex


def test_a_done_backfill_whose_job_was_deleted_since_has_lost_its_runs_with_the_job():
    d = good()
    for read, mine in _backfill_runs(d):
        for r in mine:
            read["runs"].remove(r)
    assert verdict(d, "backfills")[0] == "invalid"
    inv = len(d["history"])
    d["history"] += [
        {"process": "client-0", "type": "invoke", "f": "delete", "job": "a", "node": 0, "key": "del", "index": inv,
         "t_ms": T0 + 20_000},
        {"process": "client-0", "type": "ok", "f": "delete", "job": "a", "node": 0, "key": "del", "index": inv + 1,
         "t_ms": T0 + 20_050, "status": 200}]
    assert verdict(d, "backfills")[0] == "valid"


def test_a_run_cut_short_before_its_heal_is_still_checked():
    """recheck.py of a run that ended before the heal writes ``heal_ms: None`` (and perhaps
    ``t0_ms: None``): the checkers judge it (up to the last record) instead of crashing."""
    data = good()
    data["times"] = {"t0_ms": None, "heal_ms": None}
    res = checker.check_all(data)
    assert res["checkers"]["stress"]["stats"]["leader_changes"] == checker.leader_changes(good())


# ------------------------------------------------------------------------------- power cuts

def _with_power_cut(d: dict, at_ms: int) -> dict:
    d["schedule"]["nemeses"] = ["pause", "power"]
    d["faults"].append({"kind": "power", "id": 9, "start_ms": at_ms, "end_ms": at_ms + 500, "nodes": [0, 1],
                        "fault": {"kind": "power", "target": "majority"}})
    return d


def test_power_loss_is_not_judged_without_the_power_nemesis_and_valid_across_a_clean_cut():
    d = good()
    assert checker.check_power_loss(d) is None and "power-loss" not in checker.check_all(d)["checkers"]
    d = _with_power_cut(good(), T0 + 7000)
    assert verdict(d, "power-loss")[0] == "valid"
    assert checker.check_all(d)["checkers"]["power-loss"]["stats"]["grants_after_cuts"] > 0


def test_a_token_granted_again_after_a_power_cut_is_invalid():
    """The fencing counter went back: a grant after the cut reuses a token granted before it."""
    d = _with_power_cut(good(), T0 + 7000)
    first = min((w for w in d["sink"] if w["phase"] == "begin"), key=lambda w: w["seq"])
    later = max((w for w in d["sink"] if w["phase"] == "begin"), key=lambda w: w["seq"])
    for w in d["sink"]:
        if (w["run"], w["attempt"]) == (later["run"], later["attempt"]):
            w["token"] = first["token"]
    v, ex = verdict(d, "power-loss")
    assert v == "invalid" and f"token {first['token']} was granted to" in ex[0], ex
    assert any("not above token" in e for e in ex), ex


def test_a_slot_fired_again_after_a_power_cut_is_invalid():
    """The run of a slot came back with another fire time (and its attempt with another token)."""
    d = _with_power_cut(good(), T0 + 7000)
    rid = f"a@{T0 + 6000}"
    for r in list(each_read(d))[-1]["runs"]:
        if r["id"] == rid:
            r["fired_at"] += 1500
    v, ex = verdict(d, "power-loss")
    assert v == "invalid" and rid in ex[0] and "fired twice" in ex[0], ex
    d = _with_power_cut(good(), T0 + 7000)
    w = next(w for w in d["sink"] if w["run"] == rid and w["phase"] == "begin")
    d["sink"].append(dict(w, seq=9999, token=10_000, t_ms=T0 + 8000))
    v, ex = verdict(d, "power-loss")
    assert v == "invalid" and "fired twice" in " ".join(ex), ex


def test_a_lease_granted_before_a_cut_whose_worker_begins_after_it_is_not_a_grant_after_it():
    """A remote worker may write its first "begin" after the cut for a lease granted before it
    (seen in a power run: token 490 granted 0.4 s before the cut, begun 0.5 s after it): its
    attempt's state time says when it was granted."""
    d = _with_power_cut(good(), T0 + 7000)
    first = min((w for w in d["sink"] if w["phase"] == "begin"), key=lambda w: w["seq"])
    for w in d["sink"]:
        if (w["run"], w["attempt"]) == (first["run"], first["attempt"]):
            w["t_ms"] = T0 + 7600  # its first write lands after the cut
    assert verdict(d, "power-loss")[0] == "valid"
    for read in each_read(d):  # without its state time, it looks granted after the cut
        for r in read["runs"]:
            for a in r.get("attempts") or []:
                if (r["id"], a["attempt"]) == (first["run"], first["attempt"]):
                    a["started_at"] = None
    assert verdict(d, "power-loss")[0] == "invalid"


# ------------------------------------------------------------------------------- pipeline

def _pipe_read(runs: list[dict]) -> dict:
    jobs = [{"name": "pa", "spec": {"schedule": {"every_s": 2}}},
            {"name": "pb", "spec": {"after": [{"job": "pa", "on": "success"}]}},
            {"name": "pd", "spec": {"after": [{"job": "pa", "on": "success"}, {"job": "pb", "on": "finished"}]}}]
    return {"reads": {"final": {"0": {"node": 0, "phase": "final", "t_start_ms": READ_AT, "jobs": jobs,
                                      "runs": runs}}}}


def _r(job, slot, state, kind="scheduled", upstream=None, **kw):
    r = {"id": f"{job}@{slot}", "job": job, "slot_ms": slot, "state": state, "kind": kind,
         "finished_at": slot + 500, **kw}
    if upstream is not None:
        r["upstream"] = upstream
    return r


def test_pipeline_a_chain_slot_by_slot_is_valid_and_its_records_count():
    s1, s2 = T0 + 2000, T0 + 4000
    runs = [_r("pa", s1, "succeeded"), _r("pb", s1, "succeeded", "triggered", [f"pa@{s1}"]),
            _r("pd", s1, "succeeded", "triggered", [f"pa@{s1}", f"pb@{s1}"]),
            _r("pa", s2, "dead"), _r("pb", s2, "skipped", "recorded", reason="upstream_failed"),
            _r("pd", s2, "skipped", "recorded", reason="upstream_failed")]
    assert verdict(_pipe_read(runs), "pipeline") == ("valid", [])
    assert checker.check_all(good())["checkers"]["pipeline"]["valid"] == "valid"  # no pipeline: nothing to judge


@pytest.mark.parametrize("change,why", [
    (lambda rs: rs[0].update(state="dead"), "ran, but pa's run"),             # a child after a dead parent
    (lambda rs: rs[1].update(upstream=[]), "ran, but pa's run"),              # a run its parents did not make
    (lambda rs: rs.append(dict(rs[1], id=rs[1]["id"] + "x")), "twice"),       # a slot twice
    (lambda rs: rs.remove(rs[2]), "silent"),                                  # a slot silent
])
def test_pipeline_counterexamples(change, why):
    s1 = T0 + 2000
    runs = [_r("pa", s1, "succeeded"), _r("pb", s1, "succeeded", "triggered", [f"pa@{s1}"]),
            _r("pd", s1, "succeeded", "triggered", [f"pa@{s1}", f"pb@{s1}"])]
    change(runs)
    valid, examples = verdict(_pipe_read(runs), "pipeline")
    assert valid == "invalid" and any(why in e for e in examples), examples


def _trimmed_read(runs: list[dict], history: dict) -> dict:
    d = _pipe_read(runs)
    for j in d["reads"]["final"]["0"]["jobs"]:
        j["spec"]["history"] = history[j["name"]]
    return d


@pytest.mark.parametrize("full", [True, False])
def test_pipeline_entries_trimmed_on_a_long_run_are_not_lost(full):
    """A soak longer than the jobs' history: a child's run whose parent entry was trimmed (made
    before every entry the full parent kept), and its parents' slot whose child entry was trimmed
    (it would have been made before every entry the full child kept), are trimmed, not lost; the
    same entries missing while the histories are not full are."""
    s1, s2, s3 = T0 + 2000, T0 + 4000, T0 + 6000
    pa = [_r("pa", s, "succeeded", fired_at=s + 100) for s in (s2, s3)]  # pa@s1 trimmed
    pb = [_r("pb", s, "succeeded", "triggered", [f"pa@{s}"], fired_at=s + 500) for s in (s1, s2, s3)]
    pd = [_r("pd", s, "succeeded", "triggered", [f"pa@{s}", f"pb@{s}"], fired_at=s + 1000) for s in (s2, s3)]
    bounds = {"pa": 2, "pb": 3, "pd": 2} if full else {"pa": 3, "pb": 3, "pd": 3}
    valid, examples = verdict(_trimmed_read(pa + pb + pd, bounds), "pipeline")
    if full:
        assert (valid, examples) == ("valid", [])
    else:
        assert valid == "invalid" and any("pb@" in e and "ran, but pa's run" in e for e in examples), examples
    # The child's side: every parent entry of s1 there (pa's history larger), pd's s1 trimmed.
    pa1 = [_r("pa", s1, "succeeded", fired_at=s1 + 100)] + pa
    bounds = {"pa": 3, "pb": 3, "pd": 2} if full else {"pa": 3, "pb": 3, "pd": 3}
    d = _trimmed_read(pa1 + pb + pd, bounds)
    valid, examples = verdict(d, "pipeline")
    if full:
        assert (valid, examples) == ("valid", [])
        assert checker.check_pipeline(d)["stats"]["trimmed"] == 1  # pd's slot s1
    else:
        assert valid == "invalid" and any("pd is silent for slot" in e for e in examples), examples


def test_pipeline_trimmed_parents_still_judge_what_the_child_names_and_dead_entries_do_not_count():
    """A child run whose parent entry was trimmed must still name it in upstream; and a dead
    entry trim keeps (the DLQ) does not hold back when the kept entries were made."""
    s0, s1, s2, s3 = T0, T0 + 2000, T0 + 4000, T0 + 6000
    pa = [_r("pa", s2, "succeeded", fired_at=s2 + 100), _r("pa", s3, "succeeded", fired_at=s3 + 100)]
    pb = [_r("pb", s, "succeeded", "triggered", [f"pa@{s}"], fired_at=s + 500) for s in (s2, s3)]
    unnamed = _r("pb", s1, "succeeded", "triggered", [], fired_at=s1 + 500)  # names no parent run
    valid, examples = verdict(_trimmed_read(pa + pb + [unnamed], {"pa": 2, "pb": 3, "pd": 3}), "pipeline")
    assert valid == "invalid" and any(f"pb@{s1} ran, but pa's run" in e for e in examples), examples
    # pa@s0 dead (kept), pa@s1 trimmed: the oldest finished entry kept is pa@s2's.
    dead = _r("pa", s0, "dead", fired_at=s0 + 100)
    rec = _r("pb", s0, "skipped", "recorded", reason="upstream_failed", fired_at=s0 + 500)
    named = _r("pb", s1, "succeeded", "triggered", [f"pa@{s1}"], fired_at=s1 + 500)
    pd = [_r("pd", s0, "skipped", "recorded", reason="upstream_failed", fired_at=s0 + 600)] + [
        _r("pd", s, "succeeded", "triggered", [f"pa@{s}", f"pb@{s}"], fired_at=s + 1000) for s in (s2, s3)]
    d = _trimmed_read([dead] + pa + pb + [rec, named] + pd, {"pa": 3, "pb": 4, "pd": 3})
    assert verdict(d, "pipeline") == ("valid", [])
    assert checker.check_pipeline(d)["stats"]["trimmed"] == 1


def test_a_childs_upstream_record_taken_back_and_run_later_is_no_duplicate_but_a_run_fired_twice_is():
    s1 = T0 + 2000
    rec = _r("pb", s1, "skipped", "recorded", reason="upstream_failed")
    rec["fired_at"] = s1 + 600
    run = _r("pb", s1, "succeeded", "triggered", [f"pa@{s1}"])
    run["fired_at"] = s1 + 9000
    data = _pipe_read([_r("pa", s1, "succeeded"), run])
    data["periodic"] = [{"node": 1, "phase": "periodic", "t_start_ms": s1 + 700, "runs": [rec]}]
    assert verdict(data, "no-duplicate")[0] == "valid"
    twice = dict(run, fired_at=s1 + 100, kind="triggered")
    data["periodic"][0]["runs"] = [twice]
    valid, examples = verdict(data, "no-duplicate")
    assert valid == "invalid" and "fired twice" in examples[0]


# ------------------------------------------------------------------------------- notifications
def test_notifications_every_event_the_cursor_passed_arrived_once_or_alike():
    assert verdict(good(), "notifications")[0] == "valid"
    d = good()
    for r in each_read(d):
        r["sink"]["cursor"] = 3
    v, ex = verdict(d, "notifications")
    assert v == "invalid" and "events [2, 3] never arrived" in ex[0], ex
    d = good()
    d["events"][1]["event"]["reason"] = "something else"
    v, ex = verdict(d, "notifications")
    assert v == "invalid" and "delivered twice with different bodies" in ex[0], ex
    d = good()
    d["events"][0]["signed"] = False
    assert verdict(d, "notifications")[0] == "invalid"
    d = good()
    for r in each_read(d):
        r["sink"]["dead"] = 1
    assert verdict(d, "notifications")[0] == "invalid"


def test_notifications_no_event_for_what_did_not_happen_and_every_failing_job_told():
    d = good()
    ok_run = next(r for r in list(each_read(d))[0]["runs"] if r["state"] == "succeeded" and r["job"] == "b")
    for e in d["events"]:
        e["event"]["run_id"] = ok_run["id"]
        e["event"]["at"] = READ_AT - 10_000  # long before the reads that show it succeeded
    v, ex = verdict(d, "notifications")
    assert v == "invalid" and "every read of that attempt shows ['succeeded']" in ex[0], ex
    # A stale read (a periodic read of a replica as it is: soak seed 502 read a cut-off follower
    # seconds behind) contradicts nothing.
    stale = copy.deepcopy(d)
    for r in each_read(stale):
        r["consistent"] = False
    assert not [x for x in verdict(stale, "notifications")[1] if "every read of that attempt" in x]
    # Requeued, then succeeded: its run.dead was true when sent, and every read after it shows
    # the run at the next attempt (a requeue's +1). Soak seeds 41318 and 602 judged such runs
    # invalid: a bulk requeue names no job, and sends no run.requeued while the job is paused.
    dead = d["events"][0]["event"]
    again = copy.deepcopy(d)
    for r in each_read(again):
        for run in r["runs"]:
            if run["id"] == dead["run_id"]:
                run["attempt"] = dead["attempt"] + 1
    assert verdict(again, "notifications")[0] == "valid", verdict(again, "notifications")
    # Of the same attempt, nothing excuses it: not a run.requeued event, a requeue op (known or
    # not, its dry run listing the run or not), nor a bulk requeue's id on the run.
    excuses = copy.deepcopy(d)
    excuses["events"].append({"event": {**dead, "event_id": "ev-requeued", "kind": "run.requeued", "seq": 99,
                                        "reason": "manual", "attempt": dead["attempt"]},
                              "idempotency_key": "ev-requeued", "signed": True, "t_ms": dead["at"] + 1})
    excuses["history"].extend(_ops([("requeue", "b", "info", None, None, None)], start=len(excuses["history"])))
    excuses["history"].extend(_ops([("requeue", "zz", "ok", None, 201, {"dry": {"runs": [dead["run_id"]]}})],
                                   start=len(excuses["history"])))
    for r in each_read(excuses):
        for run in r["runs"]:
            if run["id"] == dead["run_id"]:
                run["requeue"] = "rq-0-1"
    assert verdict(excuses, "notifications")[0] == "invalid"
    # A store without attempt numbers (an older harness) is judged by those excuses, as before.
    old = copy.deepcopy(excuses)
    for r in each_read(old):
        for run in r["runs"]:
            run.pop("attempt", None)
    assert verdict(old, "notifications")[0] == "valid", verdict(old, "notifications")
    # A malformed op is not a crash (an UNKNOWN verdict would hide what it judges).
    odd = copy.deepcopy(again)
    odd["history"].extend(_ops([("requeue", "zz", "ok", None, 201, None)], start=len(odd["history"])))
    for rec in odd["history"][-2:]:
        rec.update(id="rq-odd", body=["not", "a", "dict"])
    odd["history"][-1]["value"] = "neither"
    assert verdict(odd, "notifications")[0] == "valid", verdict(odd, "notifications")
    verdict(odd, "backfills")  # judged, not crashed (check_all would call that UNKNOWN)
    # A read that began before the event was committed (a final read moments before the run died)
    # cannot contradict it.
    reads = list(each_read(d))
    for e in d["events"]:
        e["event"]["at"] = max(r.get("t_start_ms", r.get("t_ms", 0)) for r in reads) + 1
    assert verdict(d, "notifications")[0] == "valid"
    d = good()
    d["events"] = []
    for r in each_read(d):
        r["sink"]["cursor"] = 0
    v, ex = verdict(d, "notifications")
    assert v == "invalid" and ex == ["job b has dead runs in the final read and no run.dead event arrived"], ex
    d = good()
    del d["events"]
    assert checker.check_notifications(d) is None  # a harness without the receiver: not judged
