"""complete_many: a worker's batch of outcomes, each judged alone."""
from __future__ import annotations

from raftsched.core import commands, limits

from core_helpers import T0, apply, new_state, put_cmd, spec_of


def do(s, op, now, rid=None, **fields):
    return apply(s, commands.make(op, now, rid, **fields))


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
    res = do(s, "complete_many", T0 + 10, "batch-1", results=items)
    assert res["ok"]
    r = res["results"]
    assert r[0]["ok"] and r[0]["state"] == "succeeded"
    assert not r[1]["ok"] and r[1]["error"]["code"] == "conflict"
    assert s.runs[g[1]["id"]]["state"] == "running", "the stale outcome changed nothing"
    assert r[2]["ok"] and s.runs[g[2]["id"]]["state"] == "dead"
    assert r[3]["error"]["code"] == "not_found"
    # A retried batch (same request id) does not act twice.
    again = do(s, "complete_many", T0 + 11, "batch-1", results=items)
    assert again["duplicate"] is True and again["results"] == r


def test_malformed_batches_are_refused_whole():
    s, g = setup(1)
    for bad in ([], [{"run": g[0]["id"]}], [{"run": 1, "token": 1, "success": True}],
                [{"run": g[0]["id"], "token": g[0]["token"], "success": True}] * (limits.complete_batch_max + 1)):
        res = do(s, "complete_many", T0 + 5, results=bad)
        assert res["ok"] is False and res["error"]["code"] == "invalid_command"
    assert s.runs[g[0]["id"]]["state"] == "running"
