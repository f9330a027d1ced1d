"""Tenant rate limits (raftsched/core/tenants.py): a token bucket per tenant, in integer
arithmetic, checked when acquire hands runs out."""
from __future__ import annotations

from raftsched.core import commands

from core_helpers import HOUR, T0, new_state, restored
from exec_helpers import acq, do, jspec, refused, trig


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
