"""Tenant rate limits (raftsched/core/tenants.py): a token bucket per tenant, in integer
arithmetic, checked when acquire hands runs out."""
from __future__ import annotations

import msgpack

from raftsched.core import commands, limits, queries, tenants

from core_helpers import HOUR, T0, apply, new_state, put_cmd, restored, spec_of
from exec_helpers import TTL, acq, do, jspec, refused, trig


# ============================================================================ tenants
def test_tenant_bucket_allows_burst_then_one_run_per_second():
    s = new_state(("a", jspec(tenant="t")))
    assert do(s, "put_tenant", T0, name="t", rate_milli=1000, burst=2)["ok"]
    for _i in range(6):
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


# ============================================================================ policies (issue 22)
HTTP_EX = {"type": "http", "url": "https://example.com/hook"}
SHELL_EX = {"type": "shell", "argv": ["true"]}


def limited(spec: dict) -> dict:
    """``spec`` as a token limited to tenants writes it (node/service.py marks it)."""
    return dict(spec, **{tenants.LIMITED: True})


def policy(s, now, name, executors=("http",), labels=None, allow=()):
    res = do(s, "put_tenant_policy", now, name=name, executors=list(executors), labels=labels or {}, allow=list(allow))
    assert res["ok"], res
    return res


def test_a_state_without_policies_or_queue_owners_snapshots_as_before():
    """The two new sections are written only when they hold something: a state that uses
    neither snapshots to the bytes it always did (version 3 here)."""
    s = new_state(("a", jspec(tenant="t")))
    assert msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)["v"] == 3
    policy(s, T0, "t")
    do(s, "delete_tenant", T0, name="t")
    assert msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)["v"] == 3


def test_policies_and_queue_owners_are_replicated_state():
    s = new_state()
    policy(s, T0, "t", ["shell", "http"], {"tenant": "t"}, ["10.0.0.0/8"])
    do(s, "put_queue", T0, name="q", max_depth=5, on_full="reject", tenants=["b", "a"])
    assert s.tenant_policies["t"] == {"executors": ["http", "shell"], "labels": {"tenant": "t"}, "allow": ["10.0.0.0/8"]}
    assert s.queue_owners == {"q": ["a", "b"]}
    r = restored(s)
    assert r.tenant_policies == s.tenant_policies and r.queue_owners == s.queue_owners
    assert r.state_hash() == s.state_hash()
    # put_queue without tenants leaves the owners; with null removes them.
    do(s, "put_queue", T0, name="q", max_depth=6, on_full="reject")
    assert s.queue_owners == {"q": ["a", "b"]}
    do(s, "put_queue", T0, name="q", max_depth=6, on_full="reject", tenants=None)
    assert s.queue_owners == {}


def test_malformed_policy_commands_are_refused_and_change_nothing():
    s = new_state(("a", jspec(tenant="t")))
    for fields in ({"name": "t", "executors": ["bash"], "labels": {}, "allow": []},
                   {"name": "t", "executors": ["http", "http"], "labels": {}, "allow": []},
                   {"name": "t", "executors": "http", "labels": {}, "allow": []},
                   {"name": "t", "executors": [], "labels": {"a": 1}, "allow": []},
                   {"name": "t", "executors": [], "labels": {}, "allow": [5]},
                   {"name": 5, "executors": [], "labels": {}, "allow": []},
                   {"name": "t", "executors": [], "labels": {}}):
        refused(s, commands.make("put_tenant_policy", T0, None, **fields), "invalid_command")
    refused(s, commands.make("put_queue", T0, None, name="q", max_depth=5, on_full="reject", tenants=[]),
            "invalid_command")
    refused(s, commands.make("put_queue", T0, None, name="q", max_depth=5, on_full="reject", tenants=[["a"]]),
            "invalid_command")
    cmd = put_cmd(s, "x", dict(jspec(tenant="t"), limited=1), T0)
    refused(s, cmd, "invalid_command")
    cmd = put_cmd(s, "x", jspec(tenant="t"), T0)
    cmd["claim"] = ["t"]
    refused(s, cmd, "invalid_command")
    refused(s, commands.make("delete_tenant", T0, None, name="t"), "not_found")


def test_a_run_its_policy_refuses_is_recorded_skipped_never_handed_out():
    """At dispatch, whichever path made the run (a slot, a trigger): a job its tenant's policy
    no longer allows never runs. Its run is recorded skipped, reason policy, naming the rule;
    jobs of other tenants go on, and a replica restored from a snapshot decides alike."""
    for fast in (True, False):  # one heap and nothing held back (acquire's fast path), and the general loop
        s = new_state(("sh", spec_of({"every_s": 3600}, "skip", executor=SHELL_EX, tenant="t")),
                      ("ok", spec_of({"every_s": 3600}, "skip", executor=HTTP_EX, tenant="t")),
                      ("other", spec_of({"every_s": 3600}, "skip", executor=SHELL_EX, tenant="u")))
        if not fast:
            do(s, "put_tenant", T0, name="u", rate_milli=1_000_000, burst=100)
        policy(s, T0, "t", ["http"])
        runs = [trig(s, j, T0) for j in ("sh", "ok", "other")]
        r = restored(s)
        for st in (s, r):
            res = do(st, "acquire", T0, worker="w1", queues=None, max=10, ttl=TTL)
            assert sorted(g["id"] for g in res["runs"]) == sorted(runs[1:]) and res["refused"] == 1, res
            run = st.runs[runs[0]]
            assert run["state"] == "skipped" and run["reason"] == "policy"
            assert run["error"] == ("refused by policy: the policy of tenant 't' does not allow executor type "
                                    "'shell' (it allows: http)")
            assert queries.queue_depth(st, "default") == 0
        assert s.state_hash() == r.state_hash()


def test_placement_a_policy_requires_holds_at_dispatch():
    s = new_state(("p", spec_of({"every_s": 3600}, "skip", executor=HTTP_EX, tenant="t",
                                placement={"labels": {"tenant": "t"}})),
                  ("np", spec_of({"every_s": 3600}, "skip", executor=HTTP_EX, tenant="t")))
    policy(s, T0, "t", ["http"], {"tenant": "t"})
    assert do(s, "worker_hello", T0, worker="tw", kind="remote", labels={"tenant": "t"}, slots=1,
              executors=["http"], queues=None, version="1", instance="i")["ok"]
    p, np_ = trig(s, "p", T0), trig(s, "np", T0)
    assert acq(s, T0, worker="plain") == [], "placed runs wait for the tenant's workers"
    assert s.runs[np_]["state"] == "skipped" and "requires placement on the labels tenant=t" in s.runs[np_]["error"]
    assert [g["id"] for g in acq(s, T0, worker="tw")] == [p]


def test_a_limited_tokens_job_without_a_policy_is_held_to_the_default_one():
    """No policy: a job an unlimited token wrote is held to nothing, one a limited token wrote to
    DEFAULT_POLICY (http, public addresses), which its grant carries."""
    s = new_state(("lim", limited(spec_of({"every_s": 3600}, "skip", executor=HTTP_EX, tenant="t"))),
                  ("adm", spec_of({"every_s": 3600}, "skip", executor=HTTP_EX, tenant="t")),
                  ("lim-sh", limited(spec_of({"every_s": 3600}, "skip", executor=SHELL_EX, tenant="t"))),
                  ("adm-sh", spec_of({"every_s": 3600}, "skip", executor=SHELL_EX, tenant="t")))
    rid = {j: trig(s, j, T0) for j in ("lim", "adm", "lim-sh", "adm-sh")}
    grants = {g["job"]: g for g in acq(s, T0)}
    assert set(grants) == {"lim", "adm", "adm-sh"}, "a limited token's shell job runs under no default"
    assert s.runs[rid["lim-sh"]]["reason"] == "policy"
    assert grants["lim"]["network"] == {"allow": [], "tenant": "t"} and "network" not in grants["adm"]
    policy(s, T0, "t", ["http", "shell"], allow=["10.0.0.0/8"])
    trig(s, "adm", T0)
    assert acq(s, T0)[0]["network"] == {"allow": ["10.0.0.0/8"], "tenant": "t"}, "a policy holds every writer's jobs"


def test_a_job_moved_to_another_tenant_leaves_its_history_in_the_old_one():
    """Hole 3: recorded slots carry no tenant of their own; a replace into another tenant gives
    them the old one before the job moves, so every read attributes them as when they were made."""
    s = new_state(("m", jspec(tenant="a", queue="q1")))
    do(s, "put_queue", T0, name="q1", max_depth=1, on_full="reject")
    old = trig(s, "m", T0)
    rec = trig(s, "m", T0 + 1)  # the queue is full: recorded skipped, without a tenant of its own
    assert s.runs[rec]["state"] == "skipped" and s.runs[rec].get("tenant") is None
    assert queries.run_tenant(s, rec) == "a"
    res = apply(s, put_cmd(s, "m", jspec(tenant="b", queue="q2"), T0 + 2))
    assert res["ok"], res
    new = trig(s, "m", T0 + 3)
    assert queries.run_tenant(s, rec) == "a" and queries.run_tenant(s, old) == "a"
    assert queries.run_tenant(s, new) == "b"
    assert [r["id"] for r in queries.job_runs(s, "m", 10, tenants={"b"})["runs"]] == [new]
    assert {r["id"] for r in queries.job_runs(s, "m", 10, tenants={"a"})["runs"]} == {old, rec}
    assert [r["id"] for r in queries.runs_in(s, {"b"}, None, 10)] == [new]


def test_a_put_claims_its_queue_once():
    s = new_state()
    cmd = put_cmd(s, "a", jspec(tenant="t", queue="q"), T0)
    cmd["claim"] = "t"
    assert apply(s, cmd)["ok"]
    assert s.queue_owners == {"q": ["t"]}
    cmd = put_cmd(s, "b", jspec(tenant="u", queue="q"), T0)
    cmd["claim"] = "u"
    assert apply(s, cmd)["ok"]
    assert s.queue_owners == {"q": ["t"]}, "a queue with owners keeps them (the proposer refuses such a put)"
    assert queries.queues_of(s, {"t"}) == {"q"} and queries.queues_of(s, {"u"}) == set()
    assert queries.queue_access(s, "q", "b") == (["t"], set()), "an owned queue's users are not walked"
    for name, tenant in (("c", "t"), ("d", "u"), ("e", "u")):
        assert apply(s, put_cmd(s, name, jspec(tenant=tenant, queue="free"), T0))["ok"]
    assert queries.queue_access(s, "free") == (None, {"t", "u"})
    assert queries.queue_access(s, "free", "c") == (None, {"u"})
    assert queries.queues_access(s, ["free", "q", "none"], {"d", "e"}) == {
        "free": (None, {"t"}), "q": (["t"], set()), "none": (None, set())}


def test_a_limited_token_cannot_bring_a_tenant_past_its_share_of_the_jobs(monkeypatch):
    """A red-team walk: a tenant's operator could fill the cluster's 2 000 000 jobs, and no other
    tenant could then create one. Tokens limited to tenants bring a tenant to at most
    jobs_per_tenant_max jobs (created, or moved into it); an admin's import is not held by it;
    a replace within the tenant, or a delete, always goes; a batch past it is refused whole."""
    from test_state_put_jobs import item, put_jobs_cmd
    monkeypatch.setattr(limits, "jobs_per_tenant_max", 3)
    s = new_state()
    for i in range(3):
        apply(s, put_cmd(s, f"a{i}", limited(jspec(tenant="t")), T0))
    res = refused(s, put_cmd(s, "a3", limited(jspec(tenant="t")), T0), "limit_exceeded")
    assert res["error"]["field"] == "tenant" and "'t' past 3 jobs" in res["error"]["message"], res
    apply(s, put_cmd(s, "a0", limited(jspec(tenant="t", priority=7)), T0))  # a replace: no new job
    assert s.jobs["a0"]["spec"]["priority"] == 7
    apply(s, put_cmd(s, "o0", limited(jspec(tenant="other")), T0))  # another tenant has its own room
    refused(s, put_cmd(s, "o0", limited(jspec(tenant="t")), T0), "limit_exceeded")  # moved into t
    apply(s, put_cmd(s, "admin", jspec(tenant="t"), T0))  # an admin's put: jobs_max alone holds it
    assert sorted(n for n, j in s.jobs.items() if j["spec"]["tenant"] == "t") == ["a0", "a1", "a2", "admin"]
    do(s, "delete_job", T0, name="admin")
    do(s, "delete_job", T0, name="a2")
    apply(s, put_cmd(s, "a3", limited(jspec(tenant="t")), T0))  # room again
    # A batch: refused whole when its limited items would take a tenant past it.
    do(s, "delete_job", T0, name="a3")
    cmd = put_jobs_cmd([item(s, "b0", limited(jspec(tenant="other")), T0),
                        item(s, "b1", limited(jspec(tenant="t")), T0), item(s, "b2", limited(jspec(tenant="t")), T0)], T0)
    res = refused(s, cmd, "limit_exceeded")
    assert "2 new jobs would take tenant 't' past 3" in res["error"]["message"], res
    apply(s, put_jobs_cmd([item(s, "b1", limited(jspec(tenant="t")), T0)], T0))
    # A replica restored from a snapshot counts alike.
    r = restored(s)
    refused(r, put_cmd(r, "c0", limited(jspec(tenant="t")), T0), "limit_exceeded")
    apply(r, put_cmd(r, "c0", limited(jspec(tenant="u")), T0))
