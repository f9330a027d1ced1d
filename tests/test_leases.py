"""Leased execution (raftsched/core/leases.py): acquire, heartbeat, complete, retries, expire
and takeover; fencing tokens (I13, I14) and the reaper's rules (I15).

Every command is encoded and applied as replication does (core_helpers.apply). Refusals are
values and change nothing: compared as snapshot contents minus the ``applied`` counter.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import commands, limits, queries, records
from raftsched.core.policy import backoff_ms

from core_helpers import HOUR, SEC, T0, apply, new_state, plan_tick, queued_count, restored, spec_of
from exec_helpers import (RETRY3, TTL, acq, complete, do, expire, hb, jspec, lease, lock_item, overdue, reap,
                          refused, trig)


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


def test_only_the_proposers_replica_builds_an_acquires_grants_and_every_replica_leases_the_same():
    """An acquire carries the proposing node's name (``by``): a replica of another node leases
    the same runs under the same tokens and builds no grants (nobody reads them there), on the
    one-heap path and the general one (two queues); an acquire without ``by``, or a replica that
    names no node, builds them as before."""
    for queues in (["q1"], None):
        replicas = {name: new_state(("a", jspec(queue="q1")), ("b", jspec(queue="q2"))) for name in ("n1", "n2", None)}
        for name, s in replicas.items():
            s.answers_for = name
            for k in range(3):
                trig(s, "a", T0 + k)
                trig(s, "b", T0 + k)
        cmd = commands.acquire(T0 + 5, worker="w", queues=queues, max=4, ttl=TTL, types=None, by="n1")
        out = {name: apply(s, cmd) for name, s in replicas.items()}
        assert len(out["n1"]["runs"]) == (3 if queues else 4) and out["n1"] == out[None]
        assert out["n2"] == {"ok": True, "runs": []}
        snaps = {s.snapshot() for s in replicas.values()}
        assert len(snaps) == 1, "every replica leased the same runs"
        plain = commands.acquire(T0 + 6, worker="w", queues=None, max=1, ttl=TTL, types=None)
        assert "by" not in plain
        assert all(len(apply(s, plain)["runs"]) == 1 for s in replicas.values())
        assert len({s.snapshot() for s in replicas.values()}) == 1


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
    {"worker": "w", "queues": None, "max": 1, "ttl": TTL, "tenants": "t1"},
    {"worker": "w", "queues": None, "max": 1, "ttl": TTL, "tenants": [1]},
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9), st.sampled_from(["q1", "q2"])),
                min_size=1, max_size=12),
       st.frozensets(st.sampled_from(["a", "b", "c"]), min_size=1), st.booleans(), st.integers(1, 6))
def test_acquire_with_tenants_grants_only_their_runs_in_the_order_it_would_grant_them(runs, only, rated, n):
    """I23: an acquire limited to tenants grants exactly what an acquire would grant if the other
    tenants' runs were not there, and leaves those queued."""
    jobs = [(f"{t}{p}{q}", jspec(tenant=t, priority=p, queue=q)) for t, p, q in set(runs)]
    s, twin = new_state(*jobs), new_state(*jobs)  # twin: the same without the other tenants' runs
    for x in (s, twin):
        if rated:
            do(x, "put_tenant", T0, name="a", rate_milli=0, burst=2)
    for k, (t, p, q) in enumerate(runs):
        trig(s, f"{t}{p}{q}", T0 + k)
        if t in only:
            trig(twin, f"{t}{p}{q}", T0 + k)
    res = do(s, "acquire", T0 + 100, worker="w1", queues=None, max=n, ttl=TTL, tenants=sorted(only))
    assert res["ok"], res
    got = [(g["job"], g["slot"]) for g in res["runs"]]
    want = [(g["job"], g["slot"]) for g in acq(twin, T0 + 100, n=n)]
    assert got == want
    got = [g["id"] for g in res["runs"]]
    assert all(s.runs[r]["tenant"] in only for r in got)
    others = [r for r, run in s.runs.items() if run["tenant"] not in only]
    assert all(s.runs[r]["state"] == "queued" for r in others)
    counted = queries.ready_count(s, None, {}, None, T0 + 100, 10_000, 10_000, (), only)
    left = [g["id"] for g in acq(restored(s), T0 + 100, n=limits.acquire_runs_max)]
    assert counted >= sum(1 for r in left if s.runs[r]["tenant"] in only)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([None, {"zone": "a"}, {"zone": "b"}, {"zone": "a", "disk": "ssd"}]),
                min_size=1, max_size=10),
       st.sampled_from([{"zone": "a"}, {"zone": "a", "disk": "ssd"}, {"zone": "b"}]), st.booleans(),
       st.integers(1, 3))
def test_ready_count_counts_what_the_workers_acquire_grants_across_placements(placements, labels, dedicated,
                                                                            runs_each):
    """A dispatcher's count (queries.ready_count) and an acquire agree on which runs a worker's
    labels (dedicated to its zone, or not) may take, however the queue mixes placements: both
    read a placement once a command, by its object (jobs share equal parts)."""
    jobs = [(f"j{k}", jspec(**({} if pl is None else {"placement": {"labels": pl}})))
            for k, pl in enumerate(placements)]
    s = new_state(*jobs)
    res = do(s, "worker_hello", T0, worker="wz", kind="remote", labels=labels, slots=100, executors=["python"],
             queues=None, dedicated=["zone"] if dedicated else [])
    assert res["ok"], res
    for k in range(runs_each):
        for name, _ in jobs:
            trig(s, name, T0 + k)
    counted = queries.ready_count(s, None, labels, None, T0 + 100, 10_000, 10_000, ("zone",) if dedicated else ())
    fits = [name for name, spec in jobs
            if (spec.get("placement") or {}).get("labels", {}).items() <= labels.items()
            and (not dedicated or "placement" in spec)]
    granted = acq(s, T0 + 100, worker="wz", n=limits.acquire_runs_max)
    assert counted == len(granted) == runs_each * len(fits)
    assert sorted({g["job"] for g in granted}) == sorted(fits)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, {"zone": "a"}, {"zone": "b"}]), st.integers(1, 4)),
                min_size=1, max_size=8),
       st.integers(0, 30), st.integers(1, 40), st.integers(1, 40))
def test_ready_scan_passes_over_its_skip_and_says_whether_it_read_only_takeable_runs(jobs_runs, skip, limit,
                                                                                   scan_max):
    """The dispatcher's scan with acquires in flight (queries.ready_scan): the first ``skip``
    entries unread, then ready_count's count. Where every entry is one the worker can take, it
    is ready_count's count less the skip, so a dispatcher that passes over its acquires' share
    counts what it counted when it subtracted it; it says clean exactly when it read an entry
    and every entry it read was such a run."""
    jobs = [(f"j{k}", jspec(**({} if pl is None else {"placement": {"labels": pl}})))
            for k, (pl, _) in enumerate(jobs_runs)]
    s = new_state(*jobs)
    for (name, _), (_, n) in zip(jobs, jobs_runs):
        for k in range(n):
            trig(s, name, T0 + k)
    labels = {"zone": "a"}
    got, clean = queries.ready_scan(s, None, labels, None, T0 + 100, scan_max, limit, (), None, None, skip)
    assert queries.ready_scan(s, None, labels, None, T0 + 100, scan_max, limit)[0] \
        == queries.ready_count(s, None, labels, None, T0 + 100, scan_max, limit)
    order = [rid for _, b in next(iter(s._queued["default"].values())).ready_buckets(T0 + 100)
             for rid in ((b,) if isinstance(b, str) else reversed(b))]
    takeable = [s.jobs[s.runs[r]["job"]]["spec"].get("placement", {"labels": {}})["labels"].items() <= labels.items()
                for r in order]
    read = takeable[skip:scan_max]
    # it reads until it has found limit runs, or to the end of its scan
    stop = next((i + 1 for i in range(len(read)) if sum(read[:i + 1]) >= limit), len(read))
    assert got == sum(read[:stop])
    assert clean == (stop > 0 and all(read[:stop]))  # read something, and only takeable runs
    if all(takeable):
        full = queries.ready_count(s, None, labels, None, T0 + 100, scan_max, limit + skip)
        assert got == max(0, full - skip)


def test_heartbeat_and_release_with_tenants_treat_another_tenants_lease_as_lost():
    s = new_state(("a", jspec()), ("b", jspec(tenant="billing")))
    ra, rb = trig(s, "a", T0), trig(s, "b", T0)
    g = {x["id"]: x for x in acq(s, T0 + 1, n=2)}
    leases = [[ra, g[ra]["token"]], [rb, g[rb]["token"]]]
    res = do(s, "heartbeat", T0 + 2, worker="w1", leases=leases, ttl=TTL, tenants=["billing"])
    assert res["ok"] and res["extended"] == 1 and res["lost"] == [ra]
    assert s.runs[ra]["renewals"] == 0 and s.runs[rb]["renewals"] == 1
    res = do(s, "release", T0 + 3, worker="w1", leases=leases, tenants=["billing"])
    assert res["ok"] and res["released"] == [rb] and res["lost"] == [ra]
    assert s.runs[ra]["state"] == "running" and s.runs[rb]["state"] == "queued"
    for op, extra in (("heartbeat", {"ttl": TTL}), ("release", {})):
        refused(s, commands.make(op, T0 + 4, None, worker="w1", leases=leases[:1], tenants="billing", **extra),
                "invalid_command")


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
    assert queries.run(s, rid)["attempts"] == [{"attempt": 1, "token": g["token"], "worker": "w1", "started_at": T0,
                                               "finished_at": T0 + 3 * SEC, "ok": True, "error": None}]
    assert run["attempts"] is records.NONE_KEPT, "a success's attempt is the run's own fields, not a record"
    # A second completion with the same token is refused: the lease is gone.
    again = refused(s, commands.make("complete", T0 + 3 * SEC, None, run=rid, token=g["token"], success=True),
                    "conflict")
    # ...saying so, not that its current token is the one it was sent
    assert "no longer running (the run is succeeded" in again["error"]["message"]
    assert "current token" not in again["error"]["message"]
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
    assert [a["token"] for a in queries.run(s, rid)["attempts"]] == [old["token"], new["token"]]
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
