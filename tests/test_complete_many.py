"""complete_many: a worker's batch of outcomes, each judged alone."""
from __future__ import annotations

import pytest

from raftsched.core import commands, limits, records
from raftsched.core.errors import Conflict

from core_helpers import T0, apply, complete_many, new_state, outcomes, put_cmd, restored, spec_of


def do(s, op, now, rid=None, **fields):
    return apply(s, commands.make(op, now, rid, **fields))


def judged(s, now, rid=None, **fields):
    """A complete_many applied, and applied whole: (its answer, the answer of each outcome)."""
    res, each = complete_many(s, commands.make("complete_many", now, rid, **fields))
    assert res["ok"], res
    return res, each


def setup(n):
    s = new_state()
    assert apply(s, put_cmd(s, "a", spec_of({"every_s": 3600}, "skip", grace_s=0), T0))["ok"]
    for k in range(n):
        do(s, "trigger_job", T0 + k, name="a")
    grants = do(s, "acquire", T0 + n, worker="w", queues=None, max=n, ttl=10_000)["runs"]
    return s, grants


def test_each_outcome_is_judged_alone_and_a_stale_one_is_refused_without_the_others():
    s, g = setup(3)
    items = [{"run": g[0]["id"], "token": g[0]["token"], "success": True},
             {"run": g[1]["id"], "token": g[1]["token"] - 100, "success": True},
             {"run": g[2]["id"], "token": g[2]["token"], "success": False, "error": "boom"},
             {"run": "nosuch@1", "token": 1, "success": True}]
    res, r = judged(s, T0 + 10, "batch-1", results=items)
    assert r[0]["ok"] and r[0]["state"] == "succeeded"
    assert not r[1]["ok"] and r[1]["error"]["code"] == "conflict"
    assert s.runs[g[1]["id"]]["state"] == "running", "the stale outcome changed nothing"
    assert r[2]["ok"] and s.runs[g[2]["id"]]["state"] == "dead"
    assert r[3]["error"]["code"] == "not_found"
    # A retried batch (same request id) does not act twice.
    again, r2 = judged(s, T0 + 11, "batch-1", results=items)
    assert again["duplicate"] is True and r2 == r


def test_rows_and_maps_decide_the_same_and_a_malformed_row_is_refused_whole():
    """The node writes outcomes as rows (commands.complete_many); maps, as older nodes wrote
    them, are still applied, alike: the same results and the same state, through the fast path
    and the general one (a failure, a stale token, a missing run, a success with output)."""
    def batch(g):
        return [{"run": g[0]["id"], "token": g[0]["token"], "success": True, "output": "x" * 10},
                {"run": g[1]["id"], "token": g[1]["token"] - 100, "success": True},
                {"run": g[2]["id"], "token": g[2]["token"], "success": False, "error": "boom"},
                {"run": "nosuch@1", "token": 1, "success": True},
                {"run": g[3]["id"], "token": g[3]["token"], "success": True, "error": "warn", "result": [1]}]
    both = []
    for built in (lambda items: commands.complete_many(T0 + 10, "b", results=items, worker="w"),
                  lambda items: commands.make("complete_many", T0 + 10, "b", results=items, worker="w")):
        s, g = setup(4)
        cmd = built(batch(g))
        assert ("rows" in cmd) != ("results" in cmd)
        res = apply(s, cmd)
        both.append((res, outcomes(res, cmd), s.snapshot()))
    assert both[0] == both[1]
    assert [r["ok"] for r in both[0][1]] == [True, False, True, False, True]
    s, g = setup(1)
    row = [g[0]["id"], g[0]["token"], True, None, None]
    for bad in ({"rows": []}, {"rows": [row[:4]]}, {"rows": [row + [None, None]]}, {"rows": [{"run": row[0]}]},
                {"rows": [[1] + row[1:]]}, {"rows": [row[:2] + ["yes"] + row[3:]]}, {"rows": [row], "results": []},
                {"rows": {"0": row}}, {"rows": [row] * (limits.complete_batch_max + 1)}):
        res = do(s, "complete_many", T0 + 5, **bad)
        assert res["ok"] is False and res["error"]["code"] == "invalid_command", bad
    # An item the constructor is given without token or success: a row apply refuses, whole.
    for item in ({"run": g[0]["id"], "success": True}, {"run": g[0]["id"], "token": g[0]["token"]}):
        res = apply(s, commands.complete_many(T0 + 5, None, results=[item], worker="w"))
        assert res["ok"] is False and res["error"]["code"] == "invalid_command", item
    assert s.runs[g[0]["id"]]["state"] == "running"
    assert judged(s, T0 + 5, rows=[row])[1][0]["state"] == "succeeded"


def test_malformed_batches_are_refused_whole():
    s, g = setup(1)
    for bad in ([], [{"run": g[0]["id"]}], [{"run": 1, "token": 1, "success": True}],
                [{"run": g[0]["id"], "token": g[0]["token"], "success": True}] * (limits.complete_batch_max + 1)):
        res = do(s, "complete_many", T0 + 5, results=bad)
        assert res["ok"] is False and res["error"]["code"] == "invalid_command"
    assert s.runs[g[0]["id"]]["state"] == "running"
    ok = [{"run": g[0]["id"], "token": g[0]["token"], "success": True}]
    for extra in ({"own": "yes"}, {"own": True}, {"own": True, "worker": 7}, {"tenants": "default"},
                  {"tenants": [["default"]]}):
        res = do(s, "complete_many", T0 + 5, results=ok, **extra)
        assert res["ok"] is False and res["error"]["code"] == "invalid_command", (extra, res)
    assert s.runs[g[0]["id"]]["state"] == "running"


def test_a_remote_workers_outcome_for_a_run_another_worker_holds_is_refused_whatever_its_token():
    """``own``: fencing tokens come from one counter, so the right one is easy to guess; a
    remote worker's completions (node/fleet.py) may finish only the runs it holds."""
    s, g = setup(2)
    items = [{"run": g[0]["id"], "token": g[0]["token"], "success": False, "error": "forged"},
             {"run": g[1]["id"], "token": g[1]["token"], "success": True}]
    (r,) = judged(s, T0 + 5, "b1", results=items[:1], worker="intruder", own=True)[1]
    assert r["ok"] is False and r["error"]["code_detail"] == "stale_token" and "another worker" in r["error"]["message"]
    assert s.runs[g[0]["id"]]["state"] == "running" and not s.runs[g[0]["id"]].get("attempts")
    # Its holder's outcomes apply.
    r = judged(s, T0 + 6, "b2", results=[items[1]], worker="w", own=True)[1]
    assert r[0]["ok"] and s.runs[g[1]["id"]]["state"] == "succeeded"
    # Without ``own`` (an embedded worker's, or a command of an older log) the token alone decides.
    r = judged(s, T0 + 7, "b3", results=items[:1], worker="intruder")[1]
    assert r[0]["ok"] and s.runs[g[0]["id"]]["state"] != "running"


def test_with_tenants_an_outcome_for_another_tenants_run_is_refused_as_not_found():
    s, g = setup(1)
    item = {"run": g[0]["id"], "token": g[0]["token"], "success": True}
    r = judged(s, T0 + 5, "b1", results=[item], worker="w", own=True, tenants=["billing"])[1]
    assert r == [{"ok": False, "run": g[0]["id"],
                  "error": {"code": "not_found", "message": f"no run {g[0]['id']!r}", "field": "run"}}]
    assert s.runs[g[0]["id"]]["state"] == "running"
    r = judged(s, T0 + 6, "b2", results=[item], worker="w", own=True, tenants=["default"])[1]
    assert r[0]["ok"] and s.runs[g[0]["id"]]["state"] == "succeeded"


def test_the_answer_is_kept_short_and_read_back_against_the_requests_own_runs():
    """The state keeps every answer by its request id (I7): a success is kept as its attempt's
    number, a refusal whole, with a digest of the run ids; ``outcome_results`` reads it back
    with the ids of the request that gets it, and refuses an answer of other runs (a request id
    used again for other outcomes). An answer kept in full (by a version before the short form,
    in a dump or a journal's replay) is read as it is."""
    s, g = setup(3)
    items = [{"run": g[0]["id"], "token": g[0]["token"], "success": True},
             {"run": g[1]["id"], "token": g[1]["token"] - 1, "success": True},
             {"run": g[2]["id"], "token": g[2]["token"], "success": False, "error": "boom"}]
    res, r = judged(s, T0 + 10, "k1", results=items)
    assert res["judged"][0] == 1 and res["judged"][1] == r[1] and res["judged"][2] == r[2]
    assert r[0] == {"ok": True, "run": g[0]["id"], "state": "succeeded", "attempt": 1}
    assert r[2]["state"] == "dead" and s.requests["k1"][1] == res
    ids = [it["run"] for it in items]
    assert records.outcome_results(res, ids) == r
    for other in (ids[:2], ids[::-1], ids[:2] + ["x@1"], ids + ids[:1]):
        with pytest.raises(Conflict) as e:
            records.outcome_results(res, other)
        assert e.value.field == "Idempotency-Key"
    # The same key with other outcomes: apply replays the first answer, and reading it with the
    # second request's runs is refused rather than naming them as the first's.
    again = apply(s, commands.complete_many(T0 + 11, "k1", results=items[:1], worker="w"))
    assert again["duplicate"] is True
    with pytest.raises(Conflict):
        records.outcome_results(again, ids[:1])
    full = {"ok": True, "results": r}  # as older versions kept it: read as it is, for its own runs
    assert records.outcome_results(full, ids) == r
    for other in (ids[:2], ids[::-1], ids[:2] + ["x@1"]):
        with pytest.raises(Conflict):
            records.outcome_results(full, other)
    # Kept in full in a dump an older version wrote, replayed after a restore: the same.
    s.requests["k1"][1] = full
    again = apply(restored(s), commands.complete_many(T0 + 12, "k1", results=items, worker="w"))
    assert again["duplicate"] is True and records.outcome_results(again, ids) == r
