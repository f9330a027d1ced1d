"""Locks and tenants (a security review, 2026-12-06): a lock's fencing token is shown to every
reader, so a token limited to tenants renewed and released another tenant's lock with it. A
lock remembers the tenants of the limited token that took it; only a token of those tenants
(or one of every tenant) renews or releases it, and the refusal is the one a wrong token gets."""
from __future__ import annotations

from raftsched.core import commands

from core_helpers import T0, apply, new_state, refused
from test_auth import BOOT, call, new_token, run


def test_a_limited_token_renews_and_releases_only_a_lock_its_tenants_took():
    async def t(env, c):
        acme = (await new_token(c, "operator", tenants=["acme"]))["token"]
        globex = (await new_token(c, "operator", tenants=["globex"]))["token"]
        both = (await new_token(c, "operator", tenants=["acme", "globex"]))["token"]
        s, b = await call(c, "POST", "/v1/locks/gx/acquire", globex, {"owner": "gx-1", "ttl_s": 60})
        assert s == 200, b
        tok = b["token"]
        s, shown = await call(c, "GET", "/v1/locks/gx", acme)
        assert s == 200 and shown["token"] == tok  # (every reader sees it: it proves nothing alone)
        for path, body in (("renew", {"token": tok, "ttl_s": 600}), ("release", {"token": tok})):
            s, e = await call(c, "POST", f"/v1/locks/gx/{path}", acme, body)
            assert s == 409 and e["error"]["message"] == f"token {tok} does not hold lock 'gx'", e
        assert env.state.locks["gx"]["token"] == tok and env.state.locks["gx"]["ttl"] == 60_000
        assert env.state.locks["gx"]["tenants"] == ["globex"]
        assert (await call(c, "POST", "/v1/locks/gx/renew", both, {"token": tok}))[0] == 200
        assert (await call(c, "POST", "/v1/locks/gx/release", globex, {"token": tok}))[0] == 200
        # A lock an unlimited token took: no limited token renews or releases it; an admin may
        # release any (to free one whose holder is gone).
        s, b = await call(c, "POST", "/v1/locks/adm/acquire", BOOT, {"owner": "ops", "ttl_s": 60})
        assert s == 200 and "tenants" not in env.state.locks["adm"], b
        assert (await call(c, "POST", "/v1/locks/adm/release", acme, {"token": b["token"]}))[0] == 409
        s, b2 = await call(c, "POST", "/v1/locks/ac/acquire", acme, {"owner": "a-1", "ttl_s": 60})
        assert (await call(c, "POST", "/v1/locks/ac/release", BOOT, {"token": b2["token"]}))[0] == 200
        assert (await call(c, "POST", "/v1/locks/adm/release", BOOT, {"token": b["token"]}))[0] == 200
    run(t)


def test_a_malformed_tenants_field_of_a_lock_acquire_is_refused_and_changes_nothing():
    s = new_state()
    for bad in ("acme", [], ["b", "a"], ["a", "a"], [1], [""]):
        refused(s, commands.lock_command("lock_acquire", T0, None, name="l",
                                         fields={"owner": "o", "ttl": 5000, "tenants": bad}), "invalid_command")
    assert apply(s, commands.lock_command("lock_acquire", T0, None, name="l",
                                          fields={"owner": "o", "ttl": 5000, "tenants": ["a", "b"]}))["ok"]
    assert s.locks["l"]["tenants"] == ["a", "b"]


def test_apply_refuses_a_renew_or_release_of_a_token_limited_to_other_tenants():
    """A review: the node's check reads its replica, which may lag (or the lock change hands
    between the check and the commit): apply checks the command's tenants too."""
    s = new_state()
    take = commands.lock_command("lock_acquire", T0, None, name="l", fields={"owner": "o", "ttl": 5000,
                                                                           "tenants": ["globex"]})
    tok = apply(s, take)["token"]
    for op in ("lock_renew", "lock_release"):
        res = refused(s, commands.lock_command(op, T0 + 1, None, name="l", fields={"token": tok, "tenants": ["acme"]}),
                      "conflict")
        assert res["error"]["message"] == f"token {tok} does not hold lock 'l'", res
    assert apply(s, commands.lock_command("lock_renew", T0 + 2, None, name="l",
                                          fields={"token": tok, "tenants": ["acme", "globex"]}))["ok"]
    assert apply(s, commands.lock_command("lock_release", T0 + 3, None, name="l", fields={"token": tok}))["ok"]


def test_a_tenant_holds_at_most_its_share_of_the_locks_and_gets_it_back_as_they_go(monkeypatch):
    """A red-team walk: an operator token limited to one tenant took all 10 000 locks of the
    cluster in 7 s, and every other tenant's acquire (the admin's too) was refused. A tenant's
    tokens hold at most locks_per_tenant_max (a lock counts for each of its tenants); a release
    or an expiry gives the room back, and a restored replica counts the same."""
    from raftsched.core import limits
    from core_helpers import restored
    monkeypatch.setattr(limits, "locks_per_tenant_max", 2)

    def take(s, name, tenants, now=T0):
        return apply(s, commands.lock_command("lock_acquire", now, None, name=name,
                                              fields={"owner": "o", "ttl": 5000, "tenants": tenants}))
    s = new_state()
    a1, a2 = take(s, "a1", ["acme"]), take(s, "a2", ["acme", "globex"])
    assert a1["ok"] and a2["ok"]
    res = take(s, "a3", ["acme"])
    assert not res["ok"] and res["error"]["code"] == "conflict" and res["error"]["field"] == "name"
    assert res["error"]["message"] == "tenant 'acme' holds 2 locks, a tenant's limit: release some", res
    assert "a3" not in s.locks
    assert take(s, "g2", ["globex", "zeta"])["ok"]  # globex held one (a2's): room for one more
    assert not take(s, "g3", ["globex"])["ok"]
    assert take(s, "z", ["zeta"])["ok"]  # (zeta held one, g2's)
    unlimited = apply(s, commands.lock_command("lock_acquire", T0, None, name="ops", fields={"owner": "o", "ttl": 5000}))
    assert unlimited["ok"]  # a token of every tenant is not counted against any
    assert restored(s)._lock_tenants == s._lock_tenants == {"acme": 2, "globex": 2, "zeta": 2}
    assert apply(s, commands.lock_command("lock_release", T0, None, name="a1", fields={"token": a1["token"]}))["ok"]
    assert take(s, "a3", ["acme"])["ok"]
    # The reaper's expiry gives the room back too.
    reaped = apply(s, commands.expire(T0 + 6000, runs=[], locks=[["a2", a2["token"], 0]]))
    assert reaped["released"] == ["a2"], reaped
    assert s._lock_tenants == {"acme": 1, "globex": 1, "zeta": 2}
    assert take(s, "g3", ["globex"], T0 + 6000)["ok"]
