"""Leased execution (raftsched/core/leases.py, queues.py, tenants.py, locks.py): acquire, heartbeat, complete, expire, takeover,
retries and backoff, the dead-letter queue, queue bounds, tenant rate limits, locks, and
determinism of the derived heaps across snapshot/restore.

Every command is encoded and applied as replication does (core_helpers.apply). Refusals are
values and change nothing: compared as snapshot contents minus the ``applied`` counter.
"""
from __future__ import annotations

from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, queries, limits, policy
from raftsched.core.policy import backoff_ms
from raftsched.core.state import SchedulerState

from core_helpers import (HOUR, MIN, SEC, T0, apply, new_state, plan_tick, put_cmd, queued_count, restored,
    snap_obj, snapshot_v2_obj, spec_of)

TTL = 10 * SEC
RETRY3 = {"max_attempts": 3, "backoff_s": 2, "backoff_multiplier": 2, "backoff_max_s": 60, "jitter": 0.1}


def jspec(**extra) -> dict:
    """A job that never falls due within a test (hourly): its runs come from trigger_job."""
    return spec_of({"every_s": 3600}, "skip", grace_s=0, **extra)


def do(s: SchedulerState, op: str, now: int, rid=None, **fields) -> dict:
    return apply(s, commands.make(op, now, rid, **fields))


def trig(s: SchedulerState, job: str, now: int) -> str:
    res = do(s, "trigger_job", now, name=job)
    assert res["ok"], res
    return res["run"]


def acq(s, now, worker="w1", queues=None, n=10, ttl=TTL) -> list[dict]:
    res = do(s, "acquire", now, worker=worker, queues=queues, max=n, ttl=ttl)
    assert res["ok"], res
    return res["runs"]


def hb(s, now, worker, leases, ttl=TTL) -> dict:
    res = do(s, "heartbeat", now, worker=worker, leases=[list(x) for x in leases], ttl=ttl)
    assert res["ok"], res
    return res


def complete(s, now, run, token, ok=True, error=None) -> dict:
    return do(s, "complete", now, run=run, token=token, success=ok, error=error)


def expire(s, now, runs=(), locks=()) -> dict:
    """An expire naming ``[id, token, renewals]`` items, as the leader's reaper proposes it."""
    res = do(s, "expire", now, runs=[list(x) for x in runs], locks=[list(x) for x in locks])
    assert res["ok"], res
    return res


def lease(s, rid) -> list:
    """The run's lease as the reaper names it: [id, token, renewals]."""
    run = s.runs[rid]
    assert run["state"] == "running", run
    return [rid, run["fencing_token"], run["renewals"]]


def lock_item(s, name) -> list:
    lk = s.locks[name]
    return [name, lk["token"], lk["renewals"]]


def overdue(s, now) -> tuple[list, list]:
    """Leases and locks whose deadline is before ``now`` in state time, as ``[id, token,
    renewals]``, from ``lease_snapshot``. (The node's reaper picks the leases it has seen
    unrenewed for a TTL by its monotonic clock; apply only checks that an item still names the
    lease as it is, so any selection will do for these tests.)"""
    runs, locks = [], []
    for kind, ident, tok, renewals, _ttl in queries.lease_snapshot(s):
        deadline = (s.runs[ident] if kind == "run" else s.locks[ident])["deadline"]
        if deadline < now:
            (runs if kind == "run" else locks).append([ident, tok, renewals])
    return sorted(runs, key=lambda x: (s.runs[x[0]]["deadline"], x[0])), sorted(locks)


def refused(s: SchedulerState, cmd: dict, code: str) -> dict:
    """Apply a command that must be refused with ``code`` and must change nothing: the snapshot
    is the same but for ``applied`` (every command counts) and, when the command's now is later,
    state time (which apply advances before the handler runs, by design)."""
    drop = ("applied",) if cmd["now"] <= s.now_ms else ("applied", "now_ms")
    before = snap_obj(s, drop)
    res = apply(s, cmd)
    assert res["ok"] is False, res
    assert res["error"]["code"] == code, res
    assert snap_obj(s, drop) == before, "a refused command changed the state"
    return res


def reap(s, now) -> dict:
    """A reaper tick: expire everything overdue at ``now`` in one command."""
    runs, locks = overdue(s, now)
    n = limits.expire_items_max
    return expire(s, now, runs[:n], locks[:max(0, n - len(runs))])


# ============================================================================ acquire
def test_acquire_hands_out_higher_priority_first_then_earlier_due():
    s = new_state(("lo", jspec(priority=1)), ("hi", jspec(priority=9)), ("mid", jspec(priority=5)))
    lo1 = trig(s, "lo", T0)
    mid1 = trig(s, "mid", T0 + 1)
    hi1 = trig(s, "hi", T0 + 2)
    hi2 = trig(s, "hi", T0 + 3)
    lo2 = trig(s, "lo", T0 + 4)
    got = [g["id"] for g in acq(s, T0 + 5, n=1)] + [g["id"] for g in acq(s, T0 + 5, n=2)] + \
        [g["id"] for g in acq(s, T0 + 5, n=10)]
    assert got == [hi1, hi2, mid1, lo1, lo2]


def test_acquire_breaks_equal_priority_by_due_time_then_run_id():
    # Scheduled runs are due at their slot: fire both jobs' slots in one tick, then acquire.
    s = new_state(("b", spec_of({"every_s": 15}, "fire_all", grace_s=100, max_catchup=5, priority=4)),
                  ("a", spec_of({"every_s": 10}, "fire_all", grace_s=100, max_catchup=5, priority=4)))
    cmd, _ = plan_tick(s, T0 + 31 * SEC)
    assert apply(s, cmd)["ok"]
    got = [g["id"] for g in acq(s, T0 + 31 * SEC, n=2)] + [g["id"] for g in acq(s, T0 + 31 * SEC, n=10)]
    slots = [10, 15, 20, 30, 30]
    assert got == [f"{j}@{T0 + k * SEC}" for j, k in zip("abaab", slots)]


def test_a_run_not_yet_due_waits_without_holding_back_lower_priorities():
    # hi's retry (due after its backoff) sits at the head of the highest priority's heap: the
    # lower priorities' due runs go first, and hi goes first again once due, on any replica.
    s = new_state(("hi", jspec(priority=9, retry=RETRY3)), ("lo", jspec(priority=1)), ("mid", jspec(priority=5)))
    hi = trig(s, "hi", T0)
    (g,) = acq(s, T0)
    complete(s, T0, hi, g["token"], ok=False)
    due = s.runs[hi]["due"]
    assert due > T0 + SEC
    lo1, mid1, lo2, mid2 = trig(s, "lo", T0 + 1), trig(s, "mid", T0 + 2), trig(s, "lo", T0 + 3), trig(s, "mid", T0 + 4)
    assert [r["id"] for r in acq(s, T0 + 5, n=2)] == [mid1, mid2]
    assert [r["id"] for r in acq(s, due - 1, n=1)] == [lo1]
    r2 = restored(s)
    assert queries.has_ready_work(s, None, due - 1) and queries.has_ready_work(r2, None, due - 1)  # lo2
    assert [r["id"] for r in acq(s, due, n=5)] == [hi, lo2]
    assert [r["id"] for r in acq(r2, due, n=5)] == [hi, lo2]  # a restored replica: the same order
    assert not queries.has_ready_work(s, None, due + HOUR) and queries.queue_depth(s, "default") == 0


def test_acquire_serves_only_the_queues_asked_for():
    s = new_state(("a", jspec(queue="qa")), ("b", jspec(queue="qb")), ("c", jspec(queue="qc", priority=9)))
    ra, rb, rc = trig(s, "a", T0), trig(s, "b", T0), trig(s, "c", T0)
    assert acq(s, T0, queues=["qb"]) and s.runs[rb]["state"] == "running"
    assert s.runs[ra]["state"] == s.runs[rc]["state"] == "queued"
    assert acq(s, T0, queues=["nosuch"]) == []
    assert acq(s, T0, queues=[]) == []
    got = acq(s, T0, queues=["qa", "qc", "qa"])
    assert [g["id"] for g in got] == [rc, ra]


def test_acquire_never_hands_out_more_than_max():
    s = new_state(("a", jspec()))
    ids = [trig(s, "a", T0 + i) for i in range(7)]
    assert len(acq(s, T0 + 10, n=3)) == 3
    assert len(acq(s, T0 + 10, n=1)) == 1
    assert [g["id"] for g in acq(s, T0 + 10, n=100)] == ids[4:]
    assert acq(s, T0 + 10, n=5) == []
    assert queries.queue_depth(s, "default") == 0


def test_acquire_grants_lease_deadline_now_plus_ttl_and_tokens_from_one_increasing_counter():
    s = new_state(("a", jspec()))
    for i in range(4):
        trig(s, "a", T0 + i)
    tokens = []
    g1 = acq(s, T0 + 100, n=2, ttl=5 * SEC)
    assert [g["deadline"] for g in g1] == [T0 + 100 + 5 * SEC] * 2
    tokens += [g["token"] for g in g1]
    lk = do(s, "lock_acquire", T0 + 200, name="L", owner="o", ttl=5 * SEC)
    tokens.append(lk["token"])
    g2 = acq(s, T0 + 300, worker="w2", n=2, ttl=7 * SEC)
    assert [g["deadline"] for g in g2] == [T0 + 300 + 7 * SEC] * 2
    tokens += [g["token"] for g in g2]
    assert tokens == sorted(set(tokens)) and len(tokens) == 5, tokens
    assert s.fencing_token == tokens[-1]
    for g in g1 + g2:
        run = s.runs[g["id"]]
        assert run["fencing_token"] == g["token"] and run["deadline"] == g["deadline"]
        assert run["started_at"] + run["ttl"] == run["deadline"]
    # The grant carries what the executor needs.
    g = g1[0]
    assert g["executor"] == s.jobs["a"]["spec"]["executor"] and g["attempt"] == 1 and g["job"] == "a"


def test_run_in_retry_backoff_is_not_handed_out_before_its_due_time():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    assert complete(s, T0 + SEC, rid, g["token"], ok=False, error="boom")["state"] == "queued"
    due = s.runs[rid]["due"]
    assert due == T0 + SEC + backoff_ms(s.jobs["a"]["spec"]["retry"], rid, 1) and due > T0 + SEC
    assert acq(s, T0 + SEC) == []
    assert acq(s, due - 1) == []
    # a fresh run due now goes ahead of the one still backing off
    other = trig(s, "a", due - 1)
    assert [x["id"] for x in acq(s, due - 1)] == [other]
    (g2,) = acq(s, due)
    assert g2["id"] == rid and g2["attempt"] == 2 and g2["token"] > g["token"]


def test_restored_replica_also_holds_back_a_run_in_backoff():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    complete(s, T0 + SEC, rid, g["token"], ok=False)
    due = s.runs[rid]["due"]
    r = restored(s)
    assert acq(r, due - 1) == [] and [x["id"] for x in acq(r, due)] == [rid]


@pytest.mark.parametrize("fields", [
    {"queues": None, "max": 1, "ttl": TTL},                       # no worker
    {"worker": "", "queues": None, "max": 1, "ttl": TTL},
    {"worker": 3, "queues": None, "max": 1, "ttl": TTL},
    {"worker": "w", "queues": "default", "max": 1, "ttl": TTL},
    {"worker": "w", "queues": ["default", 1], "max": 1, "ttl": TTL},
    {"worker": "w", "queues": None, "max": 0, "ttl": TTL},
    {"worker": "w", "queues": None, "max": limits.acquire_runs_max + 1, "ttl": TTL},
    {"worker": "w", "queues": None, "max": True, "ttl": TTL},
    {"worker": "w", "queues": None, "max": "1", "ttl": TTL},
    {"worker": "w", "queues": None, "max": 1},
    {"worker": "w", "queues": None, "max": 1, "ttl": limits.lease_ttl_ms_min - 1},
    {"worker": "w", "queues": None, "max": 1, "ttl": limits.lease_ttl_ms_max + 1},
    {"worker": "w", "queues": None, "max": 1, "ttl": 1.5e4},
])
def test_acquire_validation_errors_are_refused_as_values_and_change_nothing(fields):
    s = new_state(("a", jspec()), ("t", jspec(tenant="t1")))
    do(s, "put_tenant", T0, name="t1", rate_milli=0, burst=1)
    trig(s, "a", T0)
    trig(s, "t", T0)
    trig(s, "t", T0)
    before = s.snapshot()
    refused(s, commands.make("acquire", T0, None, **fields), "invalid_command")
    # snapshot bytes are equal except the applied counter: compare the derived behaviour too
    assert restored(s).snapshot() == s.snapshot()
    assert s.fencing_token == 0 and queries.queue_depth(s, "default") == 3
    # the tenant's bucket (burst 1, no refill) was not touched by the refusal
    assert len(acq(s, T0)) == 2 and acq(s, T0) == []
    assert before != s.snapshot()


def test_has_ready_work_is_never_no_when_an_acquire_would_grant():
    s = new_state(("a", jspec(retry=RETRY3, queue="q")))
    assert not queries.has_ready_work(s, None, T0) and not queries.has_ready_work(s, ["q"], T0)
    rid = trig(s, "a", T0)
    assert queries.has_ready_work(s, ["q"], T0) and queries.has_ready_work(s, None, T0)
    assert not queries.has_ready_work(s, ["other"], T0)
    (g,) = acq(s, T0)
    complete(s, T0, rid, g["token"], ok=False)
    due = s.runs[rid]["due"]
    assert queries.has_ready_work(s, ["q"], due) and queries.has_ready_work(restored(s), ["q"], due)


# ============================================================================ heartbeat
def test_heartbeat_extends_the_workers_live_leases():
    s = new_state(("a", jspec()))
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0 + 1)
    g = acq(s, T0 + 2, n=2)
    res = hb(s, T0 + 4 * SEC, "w1", [[x["id"], x["token"]] for x in g], ttl=20 * SEC)
    assert res == {"ok": True, "extended": 2, "lost": []}
    assert s.runs[r1]["deadline"] == s.runs[r2]["deadline"] == T0 + 24 * SEC
    # A heartbeat never shortens a lease (a smaller ttl keeps the later deadline).
    hb(s, T0 + 5 * SEC, "w1", [[r1, g[0]["token"]]], ttl=1 * SEC)
    assert s.runs[r1]["deadline"] == T0 + 24 * SEC
    # An expire naming the lease as it was before the heartbeat is ignored.
    res = expire(s, T0 + 2 + TTL + 1, [[x["id"], x["token"], 0] for x in g])
    assert res["expired"] == [] and res["ignored"] == 2
    assert s.runs[r1]["state"] == s.runs[r2]["state"] == "running"


def test_heartbeat_reports_stale_and_foreign_leases_as_lost():
    s = new_state(("a", jspec(retry=RETRY3)))
    r1, r2, r3 = trig(s, "a", T0), trig(s, "a", T0 + 1), trig(s, "a", T0 + 2)
    g1 = {g["id"]: g["token"] for g in acq(s, T0 + 3, worker="w1", n=2)}
    g2 = {g["id"]: g["token"] for g in acq(s, T0 + 3, worker="w2", n=1)}
    assert set(g1) == {r1, r2} and set(g2) == {r3}
    before_r3 = dict(s.runs[r3])
    res = hb(s, T0 + SEC, "w1", [[r1, g1[r1]], [r2, g1[r2] - 100], [r3, g2[r3]], ["nosuch@1", 5]])
    assert res["extended"] == 1 and res["lost"] == [r2, r3, "nosuch@1"]
    assert s.runs[r3] == before_r3, "another worker's lease is not touched"
    assert s.runs[r2]["deadline"] == T0 + 3 + TTL
    # After an expire and a re-grant, the old token is lost even for the same worker.
    assert expire(s, T0 + 3 + TTL + 1, [lease(s, r2)])["expired"] == [r2]
    (again,) = acq(s, s.runs[r2]["due"], worker="w1", n=1)
    assert again["id"] == r2
    res = hb(s, s.now_ms, "w1", [[r2, g1[r2]], [r2, again["token"]]])
    assert res["lost"] == [r2] and res["extended"] == 1


@pytest.mark.parametrize("fields", [
    {"leases": [], "ttl": TTL},
    {"worker": "w1", "leases": "x", "ttl": TTL},
    {"worker": "w1", "leases": [["a", "1"]], "ttl": TTL},
    {"worker": "w1", "leases": [["a", 1, 2]], "ttl": TTL},
    {"worker": "w1", "leases": [["a", 1]] * (limits.heartbeat_leases_max + 1), "ttl": TTL},
    {"worker": "w1", "leases": [], "ttl": 10},
])
def test_heartbeat_malformed_is_refused_and_changes_nothing(fields):
    s = new_state(("a", jspec()))
    trig(s, "a", T0)
    (g,) = acq(s, T0)
    if "leases" in fields and isinstance(fields["leases"], list) and fields["leases"][:1] == [["a", "1"]]:
        fields = dict(fields, leases=[[g["id"], g["token"]], ["a", "1"]])  # a good item first
    refused(s, commands.make("heartbeat", T0, None, **fields), "invalid_command")


# ============================================================================ complete
def test_complete_with_the_current_token_succeeds():
    s = new_state(("a", jspec()))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    res = complete(s, T0 + 3 * SEC, rid, g["token"], ok=True)
    assert res == {"ok": True, "run": rid, "state": "succeeded", "attempt": 1}
    run = s.runs[rid]
    assert run["finished_at"] == T0 + 3 * SEC and run["deadline"] is None
    assert run["attempts"] == [{"attempt": 1, "token": g["token"], "worker": "w1", "started_at": T0,
                                "finished_at": T0 + 3 * SEC, "ok": True, "error": None}]
    # A second completion with the same token is refused: the lease is gone.
    refused(s, commands.make("complete", T0 + 3 * SEC, None, run=rid, token=g["token"], success=True), "conflict")
    assert queries.lease_snapshot(s) == [], "a finished run holds no lease"
    assert hb(s, T0 + 3 * SEC, "w1", [[rid, g["token"]]])["lost"] == [rid]


def test_complete_with_a_stale_token_is_a_conflict_and_keeps_the_newer_attempt():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    (old,) = acq(s, T0, worker="w1")
    # w1 pauses past its lease: the reaper expires it, w2 takes the retry.
    assert reap(s, T0 + TTL + 1)["expired"] == [rid]
    assert s.runs[rid]["state"] == "queued" and s.runs[rid]["attempt"] == 2
    assert s.runs[rid]["due"] == T0 + TTL + 1, "a lost lease is retried at once"
    (new,) = acq(s, s.runs[rid]["due"], worker="w2")
    assert new["id"] == rid and new["token"] > old["token"]
    newer = dict(s.runs[rid])
    for ok in (True, False):
        res = refused(s, commands.make("complete", s.now_ms, None, run=rid, token=old["token"], success=ok,
                                       error="late"), "conflict")
        assert res["error"]["field"] == "token"
    assert s.runs[rid] == newer and s.runs[rid]["worker"] == "w2"
    assert complete(s, s.now_ms, rid, new["token"], ok=True)["state"] == "succeeded"
    assert [a["token"] for a in s.runs[rid]["attempts"]] == [old["token"], new["token"]]
    # and after success, the old token is still refused
    refused(s, commands.make("complete", s.now_ms, None, run=rid, token=old["token"], success=True), "conflict")


def test_complete_of_an_unknown_run_is_not_found():
    s = new_state(("a", jspec()))
    refused(s, commands.make("complete", T0, None, run="a@123", token=1, success=True), "not_found")


@pytest.mark.parametrize("fields", [
    {"token": 1, "success": True}, {"run": 5, "token": 1, "success": True},
    {"run": "a@1", "token": "1", "success": True}, {"run": "a@1", "token": 1, "success": 1},
    {"run": "a@1", "token": True, "success": True},
])
def test_complete_malformed_is_refused(fields):
    s = new_state(("a", jspec()))
    refused(s, commands.make("complete", T0, None, **fields), "invalid_command")


# ============================================================================ retries and backoff
def test_failure_with_attempts_left_requeues_with_next_attempt_and_backoff_due():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    res = complete(s, T0 + 5 * SEC, rid, g["token"], ok=False, error="exit 1")
    assert res == {"ok": True, "run": rid, "state": "queued", "attempt": 2}
    run = s.runs[rid]
    assert run["due"] == T0 + 5 * SEC + backoff_ms(RETRY3, rid, 1)
    assert run["worker"] is None and run["deadline"] is None
    assert queries.queue_depth(s, "default") == 1 == queued_count(s, "default")
    assert run["attempts"][0]["error"] == "exit 1" and run["attempts"][0]["ok"] is False


def test_failure_when_the_budget_is_spent_goes_dead_with_every_attempts_error():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    errors = []
    for n in range(1, 4):
        (g,) = acq(s, s.runs[rid]["due"] if n > 1 else T0)
        assert g["attempt"] == n
        errors.append(f"failure {n}")
        res = complete(s, s.now_ms + 10, rid, g["token"], ok=False, error=errors[-1])
        assert res["state"] == ("queued" if n < 3 else "dead")
    run = s.runs[rid]
    assert run["state"] == "dead" and run["attempt"] == 3
    assert [a["error"] for a in run["attempts"]] == errors
    assert [a["attempt"] for a in run["attempts"]] == [1, 2, 3]
    assert len({a["token"] for a in run["attempts"]}) == 3
    assert queries.queue_depth(s, "default") == 0 and acq(s, s.now_ms + HOUR // 2) == []


def test_lost_lease_is_retried_at_once_without_spending_max_attempts():
    """A run whose worker dies runs again (at least once), even with max_attempts 1: an expired
    lease counts against lease_losses_max, not against the job's retry budget."""
    s = new_state(("a", jspec(retry={"max_attempts": 1})))
    rid = trig(s, "a", T0)
    now = T0
    for n in range(1, limits.lease_losses_max + 2):
        (g,) = acq(s, now)
        assert g["attempt"] == n
        now += TTL + 1
        assert reap(s, now)["expired"] == [rid]
        run = s.runs[rid]
        if n <= limits.lease_losses_max:
            assert (run["state"], run["attempt"], run["due"]) == ("queued", n + 1, now)
    run = s.runs[rid]
    assert run["state"] == "dead", "beyond lease_losses_max lost leases the run is dead"
    assert len(run["attempts"]) == limits.lease_losses_max + 1
    assert all("lease expired" in a["error"] and a["ok"] is False for a in run["attempts"])


def test_lost_leases_and_failures_have_separate_budgets():
    s = new_state(("a", jspec(retry=dict(RETRY3, backoff_s=0, backoff_max_s=0))))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    complete(s, T0 + 1, rid, g["token"], ok=False)          # failure 1
    acq(s, T0 + 1)
    reap(s, T0 + 1 + TTL + 1)                               # lost 1: not a failure
    (g,) = acq(s, s.now_ms)
    complete(s, s.now_ms, rid, g["token"], ok=False)        # failure 2
    (g,) = acq(s, s.now_ms)
    assert g["attempt"] == 4
    assert complete(s, s.now_ms, rid, g["token"], ok=False)["state"] == "dead"  # failure 3 of 3


RETRIES = st.builds(
    lambda b, m, cap_extra, j, n: {"max_attempts": n, "backoff_s": b, "backoff_multiplier": m,
                                   "backoff_max_s": b + cap_extra, "jitter": j},
    st.sampled_from([0, 0.5, 1, 2, 30]), st.sampled_from([1, 1.5, 2, 10]),
    st.sampled_from([0, 1, 100, 3600]), st.sampled_from([0, 0.1, 0.5, 1]), st.integers(1, 100))


@settings(max_examples=300, deadline=None)
@given(retry=RETRIES, attempt=st.integers(1, 100), run_id=st.text(min_size=1, max_size=20))
def test_backoff_ms_is_capped_exponential_within_the_jitter_fraction(retry, attempt, run_id):
    d = backoff_ms(retry, run_id, attempt)
    assert isinstance(d, int) and d >= 0
    base = min(retry["backoff_max_s"], retry["backoff_s"] * retry["backoff_multiplier"] ** (attempt - 1)) * 1000
    j = retry["jitter"]
    assert base * (1 - j) - 1 <= d <= base * (1 + j), (base, d)
    assert d <= retry["backoff_max_s"] * 1000 * (1 + j)
    assert backoff_ms(retry, run_id, attempt) == d  # deterministic


def test_backoff_ms_grows_by_the_multiplier_until_the_cap():
    r = {"max_attempts": 10, "backoff_s": 1, "backoff_multiplier": 2, "backoff_max_s": 10, "jitter": 0}
    assert [backoff_ms(r, "j@1", n) for n in range(1, 7)] == [1000, 2000, 4000, 8000, 10000, 10000]


def test_backoff_jitter_is_a_hash_of_run_and_attempt():
    r = {"max_attempts": 10, "backoff_s": 100, "backoff_multiplier": 1, "backoff_max_s": 100, "jitter": 0.5}
    same = [backoff_ms(r, "job@1780000000000", 3) for _ in range(5)]
    assert len(set(same)) == 1
    across_attempts = {backoff_ms(r, "job@1780000000000", n) for n in range(1, 21)}
    across_runs = {backoff_ms(r, f"job@{T0 + i * 1000}", 1) for i in range(20)}
    assert len(across_attempts) >= 15 and len(across_runs) >= 15
    spread = across_attempts | across_runs
    assert min(spread) < 100_000 < max(spread), "jitter goes both ways"


# ============================================================================ expire
def test_expire_applies_only_to_the_lease_it_names_by_token_and_renewals():
    s = new_state(("a", jspec(retry=RETRY3)))
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0)
    (g1,) = acq(s, T0, n=1)
    (g2,) = acq(s, T0 + 5 * SEC, n=1)
    assert g1["id"] == r1 and g2["id"] == r2
    l1, l2 = lease(s, r1), lease(s, r2)
    before = dict(s.runs[r1]), dict(s.runs[r2])
    res = expire(s, T0 + TTL + 1, [[r1, g1["token"] + 1000, l1[2]], [r2, g2["token"], l2[2] + 1],
                                   ["nosuch@1", 1, 1]])
    assert res == {"ok": True, "expired": [], "released": [], "ignored": 3}
    assert (s.runs[r1], s.runs[r2]) == before
    res = expire(s, T0 + TTL + 1, [l1])
    assert res["expired"] == [r1] and res["ignored"] == 0
    run = s.runs[r1]
    assert run["state"] == "queued" and run["attempt"] == 2 and run["deadline"] is None
    assert s.runs[r2]["state"] == "running"
    assert [x[1] for x in queries.lease_snapshot(s)] == [r2]
    # The same expire again (a re-proposal, or a deposed leader's) is ignored.
    assert expire(s, T0 + TTL + 2, [l1])["ignored"] == 1
    assert s.runs[r1]["attempt"] == 2
    # ... and so is it after the run was granted again with a new token
    (g3,) = acq(s, T0 + TTL + 2, n=1)
    assert g3["id"] == r1 and expire(s, T0 + TTL + 3, [l1])["expired"] == []
    assert s.runs[r1]["state"] == "running" and s.runs[r1]["fencing_token"] == g3["token"]


def test_expire_ignores_a_lease_renewed_after_the_reaper_read_it():
    s = new_state(("a", jspec(retry=RETRY3)))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    runs, _ = overdue(s, T0 + TTL + 1)
    assert runs == [[rid, g["token"], 0]]
    hb(s, T0 + TTL + 1, "w1", [[rid, g["token"]]])  # the heartbeat commits first
    res = expire(s, T0 + TTL + 2, runs)
    assert res["expired"] == [] and res["ignored"] == 1
    assert s.runs[rid]["state"] == "running" and s.runs[rid]["fencing_token"] == g["token"]


def test_expire_ignores_a_renewal_even_while_state_time_is_ahead_of_the_workers_clock():
    """The reaper names a lease by (token, renewals): a renewal must change what it names, or a
    heartbeat that raced the expire loses. State time is the highest ``now`` seen, so once any
    node whose clock runs fast has proposed a command, a heartbeat from a worker with a correct
    clock computes ``max(deadline, now + ttl)`` from that same state time again and again."""
    s = new_state(("a", jspec()))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    do(s, "noop", T0 + HOUR)  # a node whose clock is an hour fast proposes anything
    assert hb(s, T0 + 3 * SEC, "w1", [[rid, g["token"]]])["extended"] == 1
    read = lease(s, rid)  # the reaper looks...
    assert hb(s, T0 + 6 * SEC, "w1", [[rid, g["token"]]])["extended"] == 1  # ...the worker renews...
    res = expire(s, T0 + 13 * SEC, [read])  # ...and the reaper's expire commits after the renewal
    assert res["expired"] == [], "an accepted heartbeat did not change the lease the reaper names"
    assert s.runs[rid]["state"] == "running"


def test_the_reapers_view_survives_clock_skew_in_both_directions():
    """State time is the highest ``now`` any command carried. A node whose clock is an hour fast
    pushes it ahead of every correct clock; after that, commands from correct (that is, slow
    by comparison) clocks must still renew what the reaper sees, and commands from the fast
    clock must not take a lease or a lock away from a live holder. Only the reaper's expire,
    naming the lease's current token and renewal count, or the holder's release ends one."""
    s = new_state(("a", jspec()))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0, worker="w1")
    a_lock = do(s, "lock_acquire", T0, name="L", owner="A", ttl=5 * SEC)
    a_other = do(s, "lock_acquire", T0, name="M", owner="A", ttl=5 * SEC)
    do(s, "noop", T0 + HOUR)  # a node whose clock is an hour fast proposes anything
    assert s.now_ms == T0 + HOUR

    # A worker with a correct clock, an hour behind state time, keeps heartbeating. Its deadline
    # is computed from state time, so after the first renewal it stops moving; the renewal
    # count moves on every accepted heartbeat.
    read_before = lease(s, rid)
    assert read_before == [rid, g["token"], 0]
    deadlines = []
    for i in range(1, 4):
        assert hb(s, T0 + i * 3 * SEC, "w1", [[rid, g["token"]]])["extended"] == 1
        assert lease(s, rid) == [rid, g["token"], i]
        deadlines.append(s.runs[rid]["deadline"])
    assert deadlines == [T0 + HOUR + TTL] * 3, "the deadline no longer tells renewals apart"
    # Expires read before any of those heartbeats, or between them, are ignored, whether
    # proposed with a fast clock's now or a slow one's.
    for now in (T0 + 12 * SEC, T0 + 2 * HOUR):
        res = expire(s, now, [read_before, [rid, g["token"], 1], [rid, g["token"], 2]])
        assert res["expired"] == [] and res["ignored"] == 3
    assert s.runs[rid]["state"] == "running" and s.runs[rid]["fencing_token"] == g["token"]
    assert queries.lease_snapshot(restored(s)) == queries.lease_snapshot(s)

    # A's locks: B's lock_acquire carrying a far-future now finds them held (past their
    # deadlines by that now, but a command's clock does not decide).
    for name in ("L", "M"):
        err = refused(s, commands.make("lock_acquire", T0 + 10 * HOUR, None, name=name, owner="B", ttl=5 * SEC),
                      "conflict")
        assert err["error"]["holder"] == "A"
    assert s.now_ms == T0 + 10 * HOUR
    assert {n: (lk["owner"], lk["token"]) for n, lk in s.locks.items()} == \
        {"L": ("A", a_lock["token"]), "M": ("A", a_other["token"])}
    # A, with its correct clock now ten hours behind state time, renews L: the reaper's read
    # from before the renewal is stale, even though the deadline moved from state time.
    read_l = lock_item(s, "L")
    assert read_l == ["L", a_lock["token"], 0]
    res = do(s, "lock_renew", T0 + 4 * SEC, name="L", token=a_lock["token"])
    assert res["ok"] and res["deadline"] == T0 + 10 * HOUR + 5 * SEC
    assert lock_item(s, "L") == ["L", a_lock["token"], 1]
    assert expire(s, T0 + 11 * HOUR, locks=[read_l])["released"] == []
    refused(s, commands.make("lock_acquire", T0 + 12 * HOUR, None, name="L", owner="B", ttl=5 * SEC), "conflict")
    # M ends with its holder's release, from A's correct clock; then B gets it.
    assert do(s, "lock_release", T0 + 5 * SEC, name="M", token=a_other["token"])["released"] is True
    b_other = do(s, "lock_acquire", T0 + 12 * HOUR, name="M", owner="B", ttl=5 * SEC)
    assert b_other["ok"] and b_other["token"] > a_other["token"]
    # L ends with an expire naming its current renewals, even one proposed with a clock far
    # behind state time and before the lock's deadline: apply compares no clock.
    assert expire(s, T0, locks=[lock_item(s, "L")])["released"] == ["L"]
    b_lock = do(s, "lock_acquire", T0 + 12 * HOUR, name="L", owner="B", ttl=5 * SEC)
    assert b_lock["ok"] and b_lock["owner"] == "B" and b_lock["token"] > b_other["token"]
    refused(s, commands.make("lock_renew", T0 + 12 * HOUR, None, name="L", token=a_lock["token"]), "conflict")
    # Likewise a worker that stopped heartbeating loses its lease to the reaper's expire naming
    # it as it is, whatever the expire's now and the lease's deadline.
    assert s.runs[rid]["deadline"] > T0
    assert expire(s, T0, [lease(s, rid)])["expired"] == [rid]
    assert s.runs[rid]["state"] == "queued"


def test_expire_releases_only_locks_it_names_by_token_and_renewals():
    s = new_state()
    a = do(s, "lock_acquire", T0, name="A", owner="o1", ttl=5 * SEC)
    b = do(s, "lock_acquire", T0, name="B", owner="o2", ttl=20 * SEC)
    assert overdue(s, T0 + 5 * SEC + 1) == ([], [["A", a["token"], 0]])
    res = expire(s, T0 + 5 * SEC + 1, locks=[["A", a["token"] + 1, 0], ["B", b["token"], 1],
                                             ["C", 1, 1]])
    assert res["released"] == [] and res["ignored"] == 3 and set(s.locks) == {"A", "B"}
    res = expire(s, T0 + 5 * SEC + 1, locks=[lock_item(s, "A")])
    assert res["released"] == ["A"] and set(s.locks) == {"B"}
    # a renewed lock is not released by an item read before the renewal
    read = lock_item(s, "B")
    do(s, "lock_renew", T0 + 6 * SEC, name="B", token=b["token"], ttl=30 * SEC)
    assert expire(s, T0 + 6 * SEC, locks=[read])["released"] == []


def test_lease_snapshot_lists_every_live_lease_and_lock():
    s = new_state(("a", jspec()))
    r1, r2, r3 = trig(s, "a", T0), trig(s, "a", T0), trig(s, "a", T0)
    g = {x["id"]: x for x in acq(s, T0, n=2, ttl=4 * SEC)}
    lk = do(s, "lock_acquire", T0, name="L", owner="o", ttl=3 * SEC)
    complete(s, T0, r1, g[r1]["token"])
    # (kind, id, token, renewals, ttl_ms), in canonical (sorted) order; no deadline: the reaper
    # names a lease by its token and renewal count.
    assert queries.lease_snapshot(s) == [
        ("lock", "L", lk["token"], 0, 3 * SEC), ("run", r2, g[r2]["token"], 0, 4 * SEC)]
    assert r3 not in {x[1] for x in queries.lease_snapshot(s)}
    assert queries.lease_snapshot(restored(s)) == queries.lease_snapshot(s)
    # Every accepted heartbeat and renew counts, and so does a takeover, for every live lease
    # and lock; a refused one does not. The ttl is the latest asked for.
    hb(s, T0 + SEC, "w1", [[r2, g[r2]["token"]], [r2, g[r2]["token"]]], ttl=6 * SEC)
    hb(s, T0 + SEC, "w1", [[r2, g[r2]["token"] - 1], [r1, g[r1]["token"]]])
    hb(s, T0 + SEC, "w2", [[r2, g[r2]["token"]]])
    do(s, "lock_renew", T0 + SEC, name="L", token=lk["token"], ttl=2 * SEC)
    assert not do(s, "lock_renew", T0 + SEC, name="L", token=lk["token"] - 1)["ok"]
    assert queries.lease_snapshot(s) == [
        ("lock", "L", lk["token"], 1, 2 * SEC), ("run", r2, g[r2]["token"], 2, 6 * SEC)]
    do(s, "takeover", T0 + 2 * SEC, node="n2")
    assert queries.lease_snapshot(s) == [
        ("lock", "L", lk["token"], 2, 2 * SEC), ("run", r2, g[r2]["token"], 3, 6 * SEC)]
    assert queries.lease_snapshot(restored(s)) == queries.lease_snapshot(s)
    # a new grant of the same run starts again from 0
    assert expire(s, T0 + 2 * SEC, [lease(s, r2)])["expired"] == [r2]
    again = {x["id"]: x for x in acq(s, T0 + 2 * SEC, worker="w2", n=2, ttl=5 * SEC)}
    assert set(again) == {r2, r3}
    assert queries.lease_snapshot(s) == [
        ("lock", "L", lk["token"], 2, 2 * SEC), ("run", r2, again[r2]["token"], 0, 5 * SEC),
        ("run", r3, again[r3]["token"], 0, 5 * SEC)]


def test_heartbeats_do_not_grow_the_derived_indexes_without_bound():
    """Derived indexes are rebuilt from the runs on restore; what apply adds to them must also
    leave them, or a replica's memory grows with every heartbeat for as long as it runs."""
    s = new_state(("a", jspec()))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0)
    for i in range(1, 2001):
        hb(s, T0 + i * SEC, "w1", [[rid, g["token"]]])
    sizes = {name: len(v) for name, v in vars(s).items() if name.startswith("_") and isinstance(v, list)}
    assert all(n <= 100 for n in sizes.values()), sizes


@pytest.mark.parametrize("fields", [
    {"runs": "x"}, {"runs": [["a", "1", 1]]}, {"runs": [[1, 1, 1]]}, {"locks": [["a", 1]]},
    {"runs": [["a@1", 1]]}, {"runs": [["a@1", 1, "later"]]}, {"runs": [["a@1", 1, 1, 1]]},
    {"runs": [["a@1", 1, 1]] * (limits.expire_items_max + 1)},
    {"runs": [["a@1", 1, 1]] * (limits.expire_items_max // 2 + 1), "locks": [["L", 1, 1]] * (limits.expire_items_max // 2)},
])
def test_expire_malformed_is_refused(fields):
    s = new_state(("a", jspec()))
    trig(s, "a", T0)
    acq(s, T0)
    refused(s, commands.make("expire", T0, None, **fields), "invalid_command")


# ============================================================================ takeover
def test_takeover_gives_every_live_lease_a_full_ttl_from_the_new_leaders_now():
    s = new_state(("a", jspec(retry=RETRY3)))
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0)
    (g1,) = acq(s, T0, n=1, ttl=5 * SEC)
    hb(s, T0 + 3 * SEC, "w1", [[r1, g1["token"]]], ttl=5 * SEC)  # deadline T0 + 8 s
    (g2,) = acq(s, T0 + 3 * SEC, worker="w2", n=1, ttl=20 * SEC)  # deadline T0 + 23 s
    lk = do(s, "lock_acquire", T0 + 3 * SEC, name="L", owner="o", ttl=2 * SEC)
    # the old leader's reaper reads them (r1 once renewed, r2 and L never)
    before_r1, before_r2, before_l = lease(s, r1), lease(s, r2), lock_item(s, "L")
    assert (before_r1[2], before_r2[2], before_l[2]) == (1, 0, 0)
    # The new leader's clock is an hour ahead of the old one's.
    now = T0 + HOUR
    res = do(s, "takeover", now, node="n2")
    assert res["ok"] and res["extended"] == 3
    assert s.runs[r1]["deadline"] == now + 5 * SEC
    assert s.runs[r2]["deadline"] == now + 20 * SEC
    assert s.locks["L"]["deadline"] == now + 2 * SEC
    # The takeover counts as a renewal of every live lease and lock.
    assert (lease(s, r1), lease(s, r2), lock_item(s, "L")) == \
        ([r1, g1["token"], 2], [r2, g2["token"], 1], ["L", lk["token"], 1])
    # Nothing is overdue by the new leader's clock, and an expire read before the takeover
    # (from the old leader's reaper) is ignored.
    assert overdue(s, now + 1) == ([], [])
    res = expire(s, now + 1, [before_r1, before_r2], [before_l])
    assert res["ignored"] == 3 and s.runs[r1]["state"] == s.runs[r2]["state"] == "running" and "L" in s.locks
    # once a full TTL passes without a heartbeat, they are overdue
    assert overdue(s, now + 5 * SEC + 1)[0] == [lease(s, r1)]


def test_takeover_never_shortens_a_lease():
    s = new_state(("a", jspec()))
    rid = trig(s, "a", T0)
    (g,) = acq(s, T0, ttl=limits.lease_ttl_ms_max)
    deadline = s.runs[rid]["deadline"]
    # the worker's last heartbeat asked for a short TTL: the long deadline stands
    hb(s, T0 + SEC, "w1", [[rid, g["token"]]], ttl=limits.lease_ttl_ms_min)
    assert s.runs[rid]["deadline"] == deadline
    do(s, "takeover", T0 + 2 * SEC, node="n2")
    assert s.runs[rid]["deadline"] == deadline
    r = restored(s)
    do(r, "takeover", T0 + 3 * SEC, node="n3")
    assert r.runs[rid]["deadline"] == deadline


# ============================================================================ dead-letter queue
def _dead_run(s, job, now, worker="w1"):
    rid = trig(s, job, now)
    (g,) = [x for x in acq(s, now, worker=worker, n=100) if x["id"] == rid]
    res = complete(s, now, rid, g["token"], ok=False, error="dead")
    assert res["state"] == "dead", res
    return rid


def test_dlq_requeue_gives_a_fresh_budget():
    s = new_state(("a", jspec(retry=dict(RETRY3, backoff_s=0, backoff_max_s=0))))
    rid = trig(s, "a", T0)
    for _ in range(3):
        (g,) = acq(s, s.now_ms)
        complete(s, s.now_ms, rid, g["token"], ok=False)
    assert s.runs[rid]["state"] == "dead"
    res = do(s, "dlq_requeue", T0 + MIN, run=rid)
    assert res == {"ok": True, "run": rid, "state": "queued", "attempt": 4}
    assert queries.queue_depth(s, "default") == 1 and s.runs[rid]["due"] == T0 + MIN
    states = []
    for n in (4, 5, 6):
        (g,) = acq(s, s.now_ms)
        assert g["attempt"] == n
        states.append(complete(s, s.now_ms, rid, g["token"], ok=False)["state"])
    assert states == ["queued", "queued", "dead"], "max_attempts more attempts, then dead again"
    assert len(s.runs[rid]["attempts"]) == 6


def test_dlq_requeue_of_a_run_that_is_not_dead_is_not_found():
    s = new_state(("a", jspec(retry=RETRY3)))
    done, running, queued = trig(s, "a", T0), trig(s, "a", T0), trig(s, "a", T0)
    grants = {g["id"]: g for g in acq(s, T0, n=2)}
    assert set(grants) == {done, running}
    complete(s, T0, done, grants[done]["token"])
    assert [s.runs[r]["state"] for r in (done, running, queued)] == ["succeeded", "running", "queued"]
    for rid in (queued, running, done, "a@1", "nosuch"):
        for op in ("dlq_requeue", "dlq_delete"):
            refused(s, commands.make(op, T0, None, run=rid), "not_found")
    refused(s, commands.make("dlq_requeue", T0, None), "invalid_command")


def test_dlq_delete_removes_the_dead_run():
    s = new_state(("a", jspec()))
    rid = _dead_run(s, "a", T0)
    keep = _dead_run(s, "a", T0 + 1)
    res = do(s, "dlq_delete", T0 + 2, run=rid)
    assert res == {"ok": True, "run": rid, "deleted": True}
    assert rid not in s.runs and rid not in s.history.get("a", []) and keep in s.runs
    refused(s, commands.make("dlq_delete", T0 + 2, None, run=rid), "not_found")
    assert restored(s).snapshot() == s.snapshot()


def test_dlq_requeue_of_a_run_whose_job_is_gone_is_a_conflict():
    """delete_job drops the job's runs, dead ones included, so through commands the requeue is
    not_found; a state holding a dead run of a job that no longer exists (an older snapshot
    layout) must refuse it as a conflict and change nothing."""
    s = new_state(("a", jspec()))
    rid = _dead_run(s, "a", T0)
    do(s, "delete_job", T0 + 1, name="a")
    refused(s, commands.make("dlq_requeue", T0 + 1, None, run=rid), "not_found")

    s = new_state(("a", jspec()), ("b", jspec()))
    rid = _dead_run(s, "a", T0)
    obj = snapshot_v2_obj(s)
    del obj["jobs"]["a"]
    s2 = new_state()
    s2.restore(msgpack.packb(obj, use_bin_type=True))
    assert restored(s2).snapshot() == s2.snapshot(), "a history without its job round-trips (version 3)"
    res = refused(s2, commands.make("dlq_requeue", T0, None, run=rid), "conflict")
    assert res["error"]["field"] == "run"
    assert s2.runs[rid]["state"] == "dead"


def test_dead_runs_are_not_trimmed_by_the_jobs_history_bound():
    s = new_state(("a", jspec(history=2)))
    dead = [_dead_run(s, "a", T0 + i) for i in range(3)]
    ok = []
    for i in range(40):
        rid = trig(s, "a", T0 + 10 + i)
        (g,) = acq(s, T0 + 10 + i)
        complete(s, T0 + 10 + i, rid, g["token"])
        ok.append(rid)
        # Behind the dead runs, finished entries go in steps of fire.TRIM_SCAN_SLACK.
        assert len(s.history.get("a", [])) <= 3 + 2 + 15
    new = trig(s, "a", T0 + 60)
    assert all(s.runs[r]["state"] == "dead" for r in dead)
    kept = [r for r in ok if r in s.runs]
    assert kept == ok[len(ok) - len(kept):], "the oldest succeeded runs go first"
    assert len(kept) < 2 + 15, "succeeded runs beyond the bound are trimmed"
    assert s.history.get("a", []) == dead + kept + [new]


def test_dlq_bound_purges_the_oldest_dead_run(monkeypatch):
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec(queue="other")))
    d = [_dead_run(s, "a", T0 + i) for i in range(3)]
    other = _dead_run(s, "b", T0 + 5)
    assert d[0] not in s.runs and d[0] not in s.history.get("a", [])
    assert s.runs[d[1]]["state"] == s.runs[d[2]]["state"] == s.runs[other]["state"] == "dead"
    # a requeued run leaves the DLQ: it does not count, and its return counts as newest
    do(s, "dlq_requeue", T0 + 6, run=d[1])
    (g,) = acq(s, T0 + 6)
    assert g["id"] == d[1]
    d3 = _dead_run(s, "a", T0 + 7)
    assert {d[2], d3} <= set(s.runs)
    complete(s, T0 + 8, d[1], g["token"], ok=False)
    assert s.runs[d[1]]["state"] == "dead" and d[2] not in s.runs and d3 in s.runs


def test_dlq_bound_purges_the_same_run_on_a_restored_replica(monkeypatch):
    """Runs that die at the same ``now`` in another order than their ids: a replica restored
    from a snapshot in between must purge the same one as the replica that saw them die."""
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec()), ("c", jspec()))
    rb, ra = trig(s, "b", T0), trig(s, "a", T0 + 1)
    grants = {g["id"]: g["token"] for g in acq(s, T0 + 2, n=2)}
    complete(s, T0 + 3, rb, grants[rb], ok=False)
    complete(s, T0 + 3, ra, grants[ra], ok=False)  # same now: b died first
    r = restored(s)
    assert r.snapshot() == s.snapshot()
    for st_ in (s, r):
        _dead_run(st_, "c", T0 + 4)
    assert r.snapshot() == s.snapshot(), "replicas purged different dead runs"
    assert (ra in s.runs) != (rb in s.runs), "exactly one of the two oldest was purged"


def test_delete_job_takes_its_dead_runs_out_of_the_dlq_bound(monkeypatch):
    monkeypatch.setattr(limits, "dlq_per_queue_max", 2)
    s = new_state(("a", jspec()), ("b", jspec()))
    b1 = _dead_run(s, "b", T0)
    _dead_run(s, "a", T0 + 1)
    do(s, "delete_job", T0 + 2, name="a")
    r = restored(s)
    b2 = _dead_run(s, "b", T0 + 3)
    _dead_run(r, "b", T0 + 3)
    assert s.runs[b1]["state"] == s.runs[b2]["state"] == "dead", "the DLQ holds 2, within its bound"
    assert r.snapshot() == s.snapshot()


# ============================================================================ queues
def test_queue_full_reject_records_a_skipped_queue_full_entry():
    s = new_state(("a", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="reject")
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0 + 1)
    res = do(s, "trigger_job", T0 + 2, name="a")
    assert res["state"] == "skipped"
    e = s.runs[res["run"]]
    assert (e["state"], e["reason"], e["queue"]) == ("skipped", "queue_full", "q")
    assert queries.queue_depth(s, "q") == 2
    assert [g["id"] for g in acq(s, T0 + 3)] == [r1, r2]
    # a running run does not count against the depth
    assert trig(s, "a", T0 + 4) and s.runs[s.history.get("a", [])[-1]]["state"] == "queued"


def test_queue_full_drop_oldest_drops_the_oldest_queued_run():
    s = new_state(("a", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="drop_oldest")
    r1, r2 = trig(s, "a", T0), trig(s, "a", T0 + 1)
    r3 = trig(s, "a", T0 + 2)
    assert (s.runs[r1]["state"], s.runs[r1]["reason"]) == ("skipped", "queue_full")
    assert s.runs[r3]["state"] == "queued" and queries.queue_depth(s, "q") == 2 == queued_count(s, "q")
    assert [g["id"] for g in acq(s, T0 + 3)] == [r2, r3]
    assert queries.queue_depth(s, "q") == 0


def test_drop_oldest_breaks_equal_slots_by_run_id_not_by_creation_order():
    s = new_state(("b", jspec(queue="q")), ("a", jspec(queue="q")), ("c", jspec(queue="q")))
    do(s, "put_queue", T0, name="q", max_depth=2, on_full="drop_oldest")
    rb, ra = trig(s, "b", T0), trig(s, "a", T0)  # the same slot; b's run is created first
    assert ra < rb
    trig(s, "c", T0 + 1)
    assert (s.runs[ra]["state"], s.runs[ra]["reason"]) == ("skipped", "queue_full")
    assert s.runs[rb]["state"] == "queued"


def _oldest_queued(s: SchedulerState, q: str) -> str | None:
    live = [(r["slot"], r["id"]) for r in s.runs.values() if r["state"] == "queued" and r["queue"] == q]
    return min(live)[1] if live else None


def test_drop_oldest_drops_what_a_scan_would_and_its_heaps_stay_bounded_when_nothing_acquires():
    """A drop_oldest queue at its bound with no worker: every new run drops one. The heaps behind
    acquire and drop_oldest get a stale entry a drop; they must be compacted, not grow with every
    fire. Retries (a new due), pauses and deletes make stale entries of other kinds."""
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=1000, max_catchup=5, queue="q",
                   retry={"max_attempts": 3, "backoff_s": 1, "backoff_max_s": 1})
    s = new_state(("a", spec), ("b", spec), ("c", spec))
    do(s, "put_queue", T0, name="q", max_depth=4, on_full="drop_oldest")
    now, dropped = T0, 0
    with mock.patch.object(limits, "queue_index_stale_slack", 8):
        for step in range(400):
            now += SEC + step % 3 * 700
            expect = _oldest_queued(s, "q")
            before = {rid for rid, r in s.runs.items() if r["state"] == "queued"}
            cmd, _ = plan_tick(s, now)
            if cmd is not None:
                assert apply(s, cmd)["ok"]
            gone = [s.runs[rid] for rid in before if rid in s.runs and s.runs[rid].get("reason") == "queue_full"]
            if gone:  # the first drop took the oldest; any later one, runs at least as old
                assert min((r["slot"], r["id"]) for r in gone)[1] == expect, (step, gone, expect)
                dropped += len(gone)
            if step % 11 == 5:
                for g in acq(s, now, n=1):
                    complete(s, now, g["id"], g["token"], ok=False)  # queued again, with a new due
            if step % 37 == 20:
                do(s, "pause_job", now, name="b")
                do(s, "resume_job", now, name="b")
            if step % 53 == 30:
                do(s, "delete_job", now, name="c")
                apply(s, put_cmd(s, "c", spec, now))
            assert queries.queue_depth(s, "q") == queued_count(s, "q") <= 4
            bound = 2 * queries.queue_depth(s, "q") + 8 + 5 * 3  # + one fire command's slots
            sizes = [len(h) for h in s._queued.get("q", {}).values()] + [len(s._by_slot.get("q", ()))]
            assert max(sizes) <= bound, (step, sizes)
    assert dropped > 300


def test_a_run_id_that_comes_back_in_another_queue_is_not_handed_out_from_the_old_one():
    """A job deleted while runs fired ahead are queued, then put again in another queue,
    re-creates the same run ids there. The old queue's index entry for such an id must not hand
    the new run out: a replica restored from a snapshot has no such entry, and the two replicas
    would give different answers (found in review; reproduced on 4949ed6 with start_at)."""
    a = new_state()
    apply(a, put_cmd(a, "a", spec_of({"every_s": 1}, queue="q1"), T0 + 100))

    def fire(now):
        j = a.jobs["a"]
        e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "a", 2000)
        assert apply(a, commands.make("fire", now, None, entries=[e]))["ok"]
        return e[5]

    first = fire(T0 + 1100)
    do(a, "delete_job", T0 + 1200, name="a")
    apply(a, put_cmd(a, "a", spec_of({"every_s": 1}, queue="q2"), T0 + 1300))
    again = fire(T0 + 1400)
    assert set(first) & set(again), "the scenario needs an id re-created in the other queue"
    b = restored(a)
    for s in (a, b):
        res = do(s, "acquire", T0 + 3000, worker="w", queues=["q1"], max=5, ttl=TTL)
        assert res == {"ok": True, "runs": []}
    assert a.snapshot() == b.snapshot()
    assert [g["queue"] for g in acq(a, T0 + 3000, queues=["q2"])] == ["q2"] * len(again)


def test_queue_depth_never_goes_negative_over_fire_acquire_complete_and_delete():
    spec = spec_of({"every_s": 1}, "fire_all", grace_s=1000, max_catchup=5, queue="q",
                   retry={"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0})
    s = new_state(("a", spec), ("b", spec))
    do(s, "put_queue", T0, name="q", max_depth=6, on_full="drop_oldest")
    now = T0
    held: dict[str, int] = {}
    for step in range(30):
        now += 3 * SEC
        cmd, _ = plan_tick(s, now)
        if cmd is not None:
            assert apply(s, cmd)["ok"]
        for g in acq(s, now, n=2 + step % 3):
            held[g["id"]] = g["token"]
        for rid in list(held)[: step % 4]:
            complete(s, now, rid, held.pop(rid), ok=step % 2 == 0)
        if step % 7 == 3:
            victim = "a" if step % 2 else "b"
            do(s, "delete_job", now, name=victim)
            held = {k: v for k, v in held.items() if k in s.runs}
            apply(s, put_cmd(s, victim, spec, now))
        if step % 9 == 8:
            reap(s, now + TTL + 1)
        assert queries.queue_depth(s, "q") == queued_count(s, "q") >= 0
        assert queries.queue_depth(restored(s), "q") == queries.queue_depth(s, "q")


# ============================================================================ tenants
def test_tenant_bucket_allows_burst_then_one_run_per_second():
    s = new_state(("a", jspec(tenant="t")))
    assert do(s, "put_tenant", T0, name="t", rate_milli=1000, burst=2)["ok"]
    for i in range(6):
        trig(s, "a", T0)
    assert len(acq(s, T0)) == 2
    assert acq(s, T0 + 999) == []
    assert len(acq(s, T0 + 1000)) == 1
    assert acq(s, T0 + 1500) == []
    assert len(acq(s, T0 + 2000)) == 1
    # a long quiet spell refills at most the burst
    assert len(acq(s, T0 + HOUR)) == 2
    assert s.tenants["t"]["tokens_micro"] == 0


def test_a_throttled_tenant_does_not_block_another_tenants_lower_priority_runs():
    s = new_state(("hot", jspec(tenant="t1", priority=9)), ("cold", jspec(tenant="t2", priority=1)))
    do(s, "put_tenant", T0, name="t1", rate_milli=1000, burst=1)
    hot = [trig(s, "hot", T0) for _ in range(3)]
    cold = [trig(s, "cold", T0) for _ in range(2)]
    got = [g["id"] for g in acq(s, T0, n=10)]
    assert got == [hot[0]] + cold
    assert [g["id"] for g in acq(s, T0 + 1000, n=10)] == [hot[1]]
    # the held-back runs kept their place: the same on a restored replica
    r = restored(s)
    assert [g["id"] for g in acq(r, T0 + 2000, n=10)] == [g["id"] for g in acq(s, T0 + 2000, n=10)] == [hot[2]]


def test_tenant_bucket_uses_integer_arithmetic_only():
    s = new_state(("a", jspec(tenant="t")))
    do(s, "put_tenant", T0, name="t", rate_milli=333, burst=3)  # 0.333 runs per second
    for _ in range(5):
        trig(s, "a", T0)
    assert len(acq(s, T0)) == 3
    t = s.tenants["t"]
    assert type(t["tokens_micro"]) is int and type(t["last_ms"]) is int
    # 1 token takes 1_000_000 / 333 = 3003.003 ms
    assert acq(s, T0 + 3003) == []
    assert len(acq(s, T0 + 3004)) == 1
    assert type(s.tenants["t"]["tokens_micro"]) is int
    assert s.tenants["t"]["tokens_micro"] == 3004 * 333 - 1_000_000


def test_put_tenant_updates_keep_tokens_within_the_new_burst_and_delete_lifts_the_limit():
    s = new_state(("a", jspec(tenant="t")))
    do(s, "put_tenant", T0, name="t", rate_milli=0, burst=5)
    do(s, "put_tenant", T0, name="t", rate_milli=0, burst=2)
    assert s.tenants["t"]["tokens_micro"] == 2_000_000
    for _ in range(4):
        trig(s, "a", T0)
    assert len(acq(s, T0)) == 2 and acq(s, T0 + HOUR) == []
    assert do(s, "delete_tenant", T0 + HOUR, name="t")["deleted"] is True
    assert len(acq(s, T0 + HOUR)) == 2
    refused(s, commands.make("delete_tenant", T0 + HOUR, None, name="t"), "not_found")
    for fields in ({"name": "t", "rate_milli": -1, "burst": 1}, {"name": "t", "rate_milli": 1, "burst": 0},
                   {"name": "t", "rate_milli": 1.5, "burst": 1}, {"name": 1, "rate_milli": 1, "burst": 1}):
        refused(s, commands.make("put_tenant", T0 + HOUR, None, **fields), "invalid_command")


# ============================================================================ locks
def test_lock_acquire_returns_a_token_and_a_second_owner_gets_a_conflict_naming_the_holder():
    s = new_state()
    res = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)
    assert res == {"ok": True, "lock": "L", "owner": "o1", "token": 1, "deadline": T0 + 5 * SEC}
    err = refused(s, commands.make("lock_acquire", T0 + 5 * SEC, None, name="L", owner="o2", ttl=5 * SEC), "conflict")
    assert err["error"]["holder"] == "o1" and err["error"]["expires_at_ms"] == T0 + 5 * SEC
    # the holder itself cannot take it twice either
    refused(s, commands.make("lock_acquire", T0 + 5 * SEC, None, name="L", owner="o1", ttl=5 * SEC), "conflict")


def test_lock_renew_with_its_token_extends_and_stale_tokens_conflict():
    s = new_state()
    tok = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)["token"]
    res = do(s, "lock_renew", T0 + 4 * SEC, name="L", token=tok, ttl=10 * SEC)
    assert res == {"ok": True, "lock": "L", "token": tok, "deadline": T0 + 14 * SEC}
    assert do(s, "lock_renew", T0 + 5 * SEC, name="L", token=tok)["deadline"] == T0 + 15 * SEC
    for op in ("lock_renew", "lock_release"):
        err = refused(s, commands.make(op, T0 + 5 * SEC, None, name="L", token=tok - 1), "conflict")
        assert err["error"]["holder"] == "o1"
        refused(s, commands.make(op, T0 + 5 * SEC, None, name="M", token=tok), "conflict")
    assert do(s, "lock_release", T0 + 5 * SEC, name="L", token=tok)["released"] is True
    assert s.locks == {}
    refused(s, commands.make("lock_release", T0 + 5 * SEC, None, name="L", token=tok), "conflict")


def test_an_expired_lock_goes_to_another_owner_with_a_higher_token():
    s = new_state(("a", jspec()))
    t1 = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)["token"]
    trig(s, "a", T0)
    (g,) = acq(s, T0)
    # Past its deadline the lock is still held until the reaper releases it: a command's now may
    # come from a node whose clock runs fast, so it does not decide.
    err = refused(s, commands.make("lock_acquire", T0 + 5 * SEC + 1, None, name="L", owner="o2", ttl=5 * SEC),
                  "conflict")
    assert err["error"]["holder"] == "o1"
    assert reap(s, T0 + 5 * SEC + 1)["released"] == ["L"]
    res = do(s, "lock_acquire", T0 + 5 * SEC + 1, name="L", owner="o2", ttl=5 * SEC)
    assert res["ok"] and res["owner"] == "o2" and res["token"] > g["token"] > t1
    # the old owner's token no longer holds it
    refused(s, commands.make("lock_renew", T0 + 5 * SEC + 1, None, name="L", token=t1), "conflict")
    refused(s, commands.make("lock_release", T0 + 5 * SEC + 1, None, name="L", token=t1), "conflict")
    assert s.locks["L"]["owner"] == "o2"


@pytest.mark.parametrize("op,fields", [
    ("lock_acquire", {"name": "L", "owner": "o"}),
    ("lock_acquire", {"name": "", "owner": "o", "ttl": TTL}),
    ("lock_acquire", {"name": "L", "owner": "", "ttl": TTL}),
    ("lock_acquire", {"name": "L", "owner": "o", "ttl": 1}),
    ("lock_renew", {"name": 5, "token": 1}),
    ("lock_renew", {"name": "L", "token": 1, "ttl": 10 ** 9}),
])
def test_lock_malformed_is_refused(op, fields):
    s = new_state()
    do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)
    refused(s, commands.make(op, T0, None, **fields), "invalid_command")


# ============================================================================ determinism
SPECS = {
    0: spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=2, queue="q1", priority=5, tenant="t1",
               history=3, retry={"max_attempts": 2, "backoff_s": 1, "backoff_max_s": 4, "jitter": 0.5}),
    1: spec_of({"every_s": 7}, "fire_once", grace_s=0, queue="q2", priority=1, tenant="t2", history=4),
    2: spec_of({"cron": "*/10 * * * * *"}, "skip", grace_s=5, queue="q1", priority=9, tenant="t2", history=2,
               retry={"max_attempts": 3, "backoff_s": 0, "backoff_max_s": 0, "jitter": 0}),
    3: spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=2, queue="q2", priority=7, tenant="t1",
               history=5, retry={"max_attempts": 3, "backoff_s": 2, "backoff_max_s": 8, "jitter": 0.2}),
}
JOBS = ("a", "b", "c")
WORKERS = ("w1", "w2", "w3")
DT = st.sampled_from([0, 0, 1, 500, 1000, 2000, 5000, 11_000, 61_000])
TTLS = st.sampled_from([1000, 3000, 20_000])
def _acquire_s():
    return st.tuples(st.just("acquire"), st.sampled_from(WORKERS),
                     st.sampled_from([None, None, ["q1"], ["q2"], ["q2", "q1"]]), st.integers(1, 4), TTLS, DT)


def _complete_s():
    return st.tuples(st.just("complete"), st.integers(0, 20), st.booleans(), st.sampled_from([0, 0, 0, 1, 2]))


def _trigger_s():
    return st.tuples(st.just("trigger"), st.sampled_from(JOBS))


def _cycle_s():
    """trigger a job, and one worker takes one run of its queue and fails it"""
    return st.tuples(st.just("cycle"), st.sampled_from(JOBS), st.sampled_from(WORKERS), DT)


#: weighted towards what makes leases, retries and dead runs: triggers, acquires, completions
#: (hypothesis draws one_of's branches about evenly; repeated branches weigh more)
EXEC_ACTIONS = st.one_of(
    _trigger_s(), _trigger_s(), _trigger_s(),
    _cycle_s(), _cycle_s(), _cycle_s(),
    st.tuples(st.just("fail_all"), DT, st.booleans()),
    _acquire_s(), _acquire_s(), _acquire_s(), _acquire_s(),
    _complete_s(), _complete_s(), _complete_s(), _complete_s(),
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.sampled_from(sorted(SPECS))),
    st.tuples(st.just("delete"), st.sampled_from(JOBS)),
    st.tuples(st.just("tick"), DT),
    st.tuples(st.just("advance"), DT),
    st.tuples(st.just("heartbeat"), st.sampled_from(WORKERS), TTLS, st.booleans()),
    st.tuples(st.just("reap"), DT),
    st.tuples(st.just("expire_raw"), st.integers(0, 20)),
    st.tuples(st.just("takeover"), st.sampled_from([0, 1000, 60_000, 3_600_000])),
    st.tuples(st.just("requeue"), st.integers(0, 20)),
    st.tuples(st.just("dlq_delete"), st.integers(0, 20)),
    st.tuples(st.just("tenant"), st.sampled_from(["t1", "t2"]), st.sampled_from([0, 333, 1000, 100_000]),
              st.integers(1, 3)),
    st.tuples(st.just("del_tenant"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("lock"), st.sampled_from(["L1", "L2"]), st.sampled_from(["o1", "o2"]), TTLS),
    st.tuples(st.just("lock_renew"), st.sampled_from(["L1", "L2"]), st.booleans()),
    st.tuples(st.just("lock_release"), st.sampled_from(["L1", "L2"]), st.booleans()),
    st.tuples(st.just("queue"), st.sampled_from(["q1", "q2"]), st.integers(1, 6),
              st.sampled_from(["reject", "drop_oldest"])),
    st.tuples(st.just("snapshot"),),
)
#: the three jobs first, then anything
EXEC_SEQUENCES = st.tuples(
    st.tuples(*[st.tuples(st.just("put"), st.just(j), st.sampled_from(sorted(SPECS))) for j in JOBS]),
    st.lists(EXEC_ACTIONS, min_size=10, max_size=45),
).map(lambda t: list(t[0]) + t[1])


class ExecDriver:
    """Proposes commands as the cluster does: built from the leader's view (replica 0), encoded
    once, applied to every replica; every result must be equal on every replica."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.now = T0
        self.tokens: list[int] = []  # every token handed out, in order
        self.acquires = 0

    @property
    def L(self) -> SchedulerState:
        return self.replicas[0]

    def propose(self, cmd: dict) -> dict:
        data = commands.encode(cmd)
        results = [r.apply_bytes(data) for r in self.replicas]
        assert all(res == results[0] for res in results), (cmd, results)
        return results[0]

    def cmd(self, op, **fields) -> dict:
        return self.propose(commands.make(op, self.now, None, **fields))

    def running(self):
        return sorted((r for r in self.L.runs.values() if r["state"] == "running"), key=lambda r: r["id"])

    def dead(self):
        return sorted((r for r in self.L.runs.values() if r["state"] == "dead"), key=lambda r: r["id"])

    def run(self, a, on_snapshot):
        kind, L = a[0], self.L
        if kind == "put":
            c = put_cmd(L, a[1], SPECS[a[2]], self.now)
            self.propose(c)
        elif kind == "delete":
            self.cmd("delete_job", name=a[1])
        elif kind == "trigger":
            self.cmd("trigger_job", name=a[1])
        elif kind == "tick":
            self.now += a[1]
            cmd, _ = plan_tick(L, self.now)
            if cmd is not None:
                res = self.propose(cmd)
                assert res["ok"] and res["stale"] == 0, res
        elif kind == "advance":
            self.now += a[1]
            self.cmd("noop")
        elif kind == "acquire":
            _, worker, queues, n, ttl, dt = a
            self.now += dt
            could = queries.has_ready_work(L, queues, self.now)
            res = self.cmd("acquire", worker=worker, queues=queues, max=n, ttl=ttl)
            assert res["ok"] and len(res["runs"]) <= n
            assert could or not res["runs"], "has_ready_work said no while work was ready"
            self.tokens += [g["token"] for g in res["runs"]]
            self.acquires += 1
        elif kind == "cycle":
            _, job, worker, dt = a
            self.now += dt
            self.cmd("trigger_job", name=job)
            spec = L.jobs[job]["spec"] if job in L.jobs else SPECS[0]
            res = self.cmd("acquire", worker=worker, queues=[spec["queue"]], max=1, ttl=3000)
            self.tokens += [g["token"] for g in res["runs"]]
            for g in res["runs"]:
                assert self.cmd("complete", run=g["id"], token=g["token"], success=False, error="x")["ok"]
        elif kind == "fail_all":
            # several attempts end at the same now, in id order or against it
            self.now += a[1]
            for r in sorted(self.running(), key=lambda r: r["id"], reverse=a[2]):
                assert self.cmd("complete", run=r["id"], token=r["fencing_token"], success=False)["ok"]
        elif kind == "heartbeat":
            _, worker, ttl, stale = a
            leases = [[r["id"], r["fencing_token"]] for r in self.running() if r["worker"] == worker]
            if stale and leases:
                leases[0][1] -= 1
            res = self.cmd("heartbeat", worker=worker, leases=leases, ttl=ttl)
            assert res["ok"] and res["extended"] + len(res["lost"]) == len(leases)
        elif kind == "complete":
            _, k, ok, mode = a
            runs = self.running() or sorted(L.runs.values(), key=lambda r: r["id"])
            if not runs:
                res = self.cmd("complete", run="nosuch@1", token=1, success=ok)
                assert res["error"]["code"] == "not_found"
                return
            run = runs[k % len(runs)]
            tok = (run.get("fencing_token") or 0) - (0 if mode == 0 else mode)
            before = dict(run)
            res = self.cmd("complete", run=run["id"], token=tok, success=ok, error="e")
            if not res["ok"]:
                assert res["error"]["code"] == "conflict"
                assert L.runs.get(run["id"]) == before, "a refused completion changed the run"
        elif kind == "reap":
            self.now += a[1]
            reads = [queries.lease_snapshot(r) for r in self.replicas]
            assert all(x == reads[0] for x in reads), "replicas see different leases"
            runs, locks = overdue(L, self.now)
            runs = runs[:limits.expire_items_max]
            locks = locks[:limits.expire_items_max - len(runs)]
            res = self.cmd("expire", runs=runs, locks=locks)
            assert res["ok"] and len(res["expired"]) == len(runs) and len(res["released"]) == len(locks)
        elif kind == "expire_raw":
            # an expire for any live lease or lock, named as it is now (it applies, whatever its
            # deadline: apply compares no clock), as it was before its last renewal, or by an
            # older token (both ignored, and change nothing but state time)
            items = [("run", r["id"], r["fencing_token"], r["renewals"]) for r in self.running()]
            items += [("lock", n, lk["token"], lk["renewals"]) for n, lk in sorted(L.locks.items())]
            if items:
                k, ident, tok, renewals = items[a[1] % len(items)]
                mode = a[1] // len(items) % 3
                item = [ident, tok - (mode == 2), renewals - (mode == 1)]
                before = snap_obj(L, ("applied", "now_ms"))
                res = self.cmd("expire", runs=[item] if k == "run" else [], locks=[item] if k == "lock" else [])
                if mode == 0:
                    assert res == {"ok": True, "expired": [ident] if k == "run" else [],
                                   "released": [ident] if k == "lock" else [], "ignored": 0}, (item, res)
                else:
                    assert res == {"ok": True, "expired": [], "released": [], "ignored": 1}, (item, res)
                    assert snap_obj(L, ("applied", "now_ms")) == before, "an ignored expire changed the state"
        elif kind == "takeover":
            self.now += a[1]
            self.cmd("takeover", node="n2")
        elif kind in ("requeue", "dlq_delete"):
            dead = self.dead()
            rid = dead[a[1] % len(dead)]["id"] if dead else "nosuch@1"
            self.cmd("dlq_requeue" if kind == "requeue" else "dlq_delete", run=rid)
        elif kind == "tenant":
            self.cmd("put_tenant", name=a[1], rate_milli=a[2], burst=a[3])
        elif kind == "del_tenant":
            self.cmd("delete_tenant", name=a[1])
        elif kind == "lock":
            res = self.cmd("lock_acquire", name=a[1], owner=a[2], ttl=a[3])
            if res["ok"]:
                self.tokens.append(res["token"])
        elif kind in ("lock_renew", "lock_release"):
            lk = L.locks.get(a[1])
            tok = (lk["token"] if lk else 1) - (1 if a[2] else 0)
            self.cmd(kind, name=a[1], token=tok)
        elif kind == "queue":
            self.cmd("put_queue", name=a[1], max_depth=a[2], on_full=a[3])
        elif kind == "snapshot":
            on_snapshot()


def _exec_invariants(s: SchedulerState):
    for q in ("q1", "q2"):
        assert queries.queue_depth(s, q) == queued_count(s, q) >= 0
    # Every queued run is in its queue's indexes, under its current key.
    for r in s.runs.values():
        if r["state"] == "queued":
            assert (r.get("due", r["slot"]), r["id"]) in s._queued[r["queue"]][r["priority"]]
            if r["queue"] in s._by_slot:
                assert (r["slot"], r["id"]) in s._by_slot[r["queue"]]
    toks = [r["fencing_token"] for r in s.runs.values() if r.get("state") == "running"]
    toks += [lk["token"] for lk in s.locks.values()]
    assert len(toks) == len(set(toks)), "two live leases share a token"
    assert all(t <= s.fencing_token for t in toks)
    for r in s.runs.values():
        if r["state"] == "running":
            assert r["deadline"] >= r["started_at"] and r["worker"]
            assert type(r["renewals"]) is int and r["renewals"] >= 0
        else:
            assert r.get("deadline") is None
    for lk in s.locks.values():
        assert type(lk["renewals"]) is int and lk["renewals"] >= 0 and lk["deadline"] >= lk["since"]
    snap = queries.lease_snapshot(s)
    assert snap == sorted(snap), "lease_snapshot is not in canonical order"
    for t in s.tenants.values():
        assert type(t["tokens_micro"]) is int and 0 <= t["tokens_micro"] <= t["burst"] * 1_000_000
    dead_by_q: dict[str, int] = {}
    for r in s.runs.values():
        if r["state"] == "dead":
            dead_by_q[r["queue"]] = dead_by_q.get(r["queue"], 0) + 1
    assert all(n <= limits.dlq_per_queue_max for n in dead_by_q.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=EXEC_SEQUENCES, restore_at=st.sets(st.integers(0, 48), max_size=12))
def test_replicas_restored_from_snapshots_stay_identical_and_hand_out_runs_in_the_same_order(actions, restore_at):
    with mock.patch.object(limits, "dlq_per_queue_max", 2):
        a, b = new_state(), new_state()
        d = ExecDriver([a, b])

        def snapshot_restore():
            data = d.replicas[1].snapshot()
            fresh = new_state()
            fresh.restore(data)
            assert fresh.snapshot() == data
            d.replicas[1] = fresh

        for i, act in enumerate(actions):
            if i in restore_at:
                snapshot_restore()
            d.run(act, snapshot_restore)
            assert a.snapshot() == d.replicas[1].snapshot(), f"diverged after {act}"
            _exec_invariants(a)
            _exec_invariants(d.replicas[1])
        assert d.tokens == sorted(set(d.tokens)), "tokens repeated or went backwards"
        # A replica restored at the very end hands out the remaining runs in the same order, and
        # its dead-letter queues purge the same runs as the others'.
        d.replicas.append(restored(a))
        for i in range(3):
            d.run(("acquire", "w9", None, 4, 3000, 30 * SEC), snapshot_restore)
            d.run(("fail_all", 0, i % 2 == 0), snapshot_restore)
            snapshot_restore()
            for j in JOBS:
                d.run(("trigger", j), snapshot_restore)
        assert a.snapshot() == d.replicas[1].snapshot() == d.replicas[2].snapshot()
