"""Notifications and tenants (a user's report, 2026-12-06): a token limited to tenant acme (``acm``)
beside an admin. Its routes reach only its tenant's sinks, never an admin's sink for the whole
cluster (not even one put later under a name they already name); the answers it gets about sinks
say nothing of another tenant's (or the cluster's); a tenant's default routes are managed like
the rest of it; a tenant's sink its network policy refuses is told at put (docs/notifications.md,
docs/security.md)."""
from __future__ import annotations

from test_auth import BOOT, call, new_token, run
from core_helpers import live_worker

HOOK = {"type": "webhook", "url": "https://hooks.example.com/x", "secrets": {"signing_key": "k"}}
MAIL = {"type": "email", "smtp": {"host": "smtp.example.com", "port": 25, "from": "r@example.com",
                                  "to": ["o@example.com"]}}


def job(tenant: str = "acme", **more) -> dict:
    return {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"}, "tenant": tenant, "queue": f"{tenant}-q",
            "executor": {"type": "http", "url": "https://example.com/hook"}, **more}


async def _acm(c) -> str:
    return (await new_token(c, "operator", tenants=["acme"]))["token"]


def _told(env, job_name: str) -> list[str]:
    """The sinks the outbox's last event about ``job_name`` is for."""
    evs = [ev for ev in env.state.outbox.events if ev["job"] == job_name]
    return evs[-1]["to"] if evs else []


def test_a_limited_tokens_routes_never_reach_a_sink_for_the_whole_cluster():
    async def t(env, c):
        acm = await _acm(c)
        assert (await call(c, "PUT", "/v1/sinks/adm-mail", BOOT, MAIL))[0] == 201
        assert (await call(c, "PUT", "/v1/sinks/acme-hook", acm, dict(HOOK, tenant="acme")))[0] == 201
        on = ["job.triggered"]
        s, b = await call(c, "PUT", "/v1/jobs/acme-sync2", acm,
                          job(notify=[{"sink": "adm-mail", "on": on}, {"sink": "acme-hook", "on": on},
                                      {"sink": "later", "on": on}]))
        assert s == 201, b
        # A sink for the whole cluster put later under a name the route names: not reached either.
        assert (await call(c, "PUT", "/v1/sinks/later", BOOT, HOOK))[0] == 201
        assert (await call(c, "POST", "/v1/jobs/acme-sync2/trigger", acm))[0] == 201
        assert _told(env, "acme-sync2") == ["acme-hook"]
        # The admin's own routes still reach the admin's sink, for an acme job too.
        s, b = await call(c, "PUT", "/v1/jobs/acme-adm", BOOT,
                          job(notify=[{"sink": "adm-mail", "on": on}, {"sink": "acme-hook", "on": on}]))
        assert s == 201, b
        assert (await call(c, "POST", "/v1/jobs/acme-adm/trigger", BOOT))[0] == 201
        assert _told(env, "acme-adm") == ["adm-mail", "acme-hook"]
        # A tenant's default routes are an admin's (PUT /v1/tenants is refused to acm): they may name it.
        assert (await call(c, "PUT", "/v1/tenants/acme", acm, {"notify": [{"sink": "adm-mail"}]}))[0] == 403
        s, b = await call(c, "PUT", "/v1/tenants/acme", BOOT, {"notify": [{"sink": "adm-mail", "on": on}]})
        assert s == 200, b
        assert (await call(c, "PUT", "/v1/jobs/acme-plain", acm, job()))[0] == 201
        assert (await call(c, "POST", "/v1/jobs/acme-plain/trigger", acm))[0] == 201
        assert _told(env, "acme-plain") == ["adm-mail"]
    run(t)


def test_a_limited_tokens_warning_is_the_same_for_a_sink_it_cannot_see_as_for_none():
    """With acm, a route naming billing's sink (or the admin's) got no warning, and one naming no
    sink got one: the answer told which names another tenant used."""
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        acm = await _acm(c)
        bil = (await new_token(c, "operator", tenants=["billing"]))["token"]
        assert (await call(c, "PUT", "/v1/sinks/bil-mail", bil, dict(MAIL, tenant="billing")))[0] == 201
        assert (await call(c, "PUT", "/v1/sinks/adm-mail", BOOT, MAIL))[0] == 201
        assert (await call(c, "PUT", "/v1/sinks/acme-hook", acm, dict(HOOK, tenant="acme")))[0] == 201
        lines = {}
        for sink in ("bil-mail", "adm-mail", "nosuch-sink", "acme-hook"):
            s, b = await call(c, "PUT", f"/v1/jobs/j-{sink}", acm, job(notify=[{"sink": sink}]))
            assert s == 201, b
            lines[sink] = [w.replace(sink, "X") for w in b.get("warnings", [])]
        assert lines["acme-hook"] == []
        assert lines["bil-mail"] == lines["adm-mail"] == lines["nosuch-sink"] == [
            "notify: no sink named 'X' (yet): nothing is told through it until one is put (PUT /v1/sinks/X)"], lines
        # The same through a batch: each job's result says what its PUT said.
        s, b = await call(c, "POST", "/v1/jobs:batch", acm,
                          {"jobs": {f"b-{sink}": job(notify=[{"sink": sink}]) for sink in lines}})
        assert s == 200, b
        assert {sink: [w.replace(sink, "X") for w in b["jobs"][f"b-{sink}"].get("warnings", [])]
                for sink in lines} == lines, b
        # An admin is told the sink is another tenant's (its events never reach it); not the cluster's.
        s, b = await call(c, "PUT", "/v1/jobs/adm-j", BOOT,
                          job(notify=[{"sink": "bil-mail"}, {"sink": "adm-mail"}]))
        assert s == 201 and b["warnings"] == [
            "notify: sink 'bil-mail' is limited to tenant 'billing': it is told nothing of a job of tenant 'acme'"], b
    run(t)


def test_a_limited_token_putting_a_sink_under_a_name_another_tenant_holds_is_answered_as_for_a_job():
    """acm's create of ``bil-mail`` (billing's) answered 404 "no sink named", where a job's answers
    409 "the job name ... is taken": now the same, after the same checks as a free name's."""
    async def t(env, c):
        acm = await _acm(c)
        bil = (await new_token(c, "operator", tenants=["billing"]))["token"]
        assert (await call(c, "PUT", "/v1/sinks/bil-mail", bil, dict(MAIL, tenant="billing")))[0] == 201
        assert (await call(c, "PUT", "/v1/sinks/adm-mail", BOOT, MAIL))[0] == 201
        before = dict(env.state.sinks)
        for name in ("bil-mail", "adm-mail"):
            s, b = await call(c, "PUT", f"/v1/sinks/{name}", acm, dict(MAIL, tenant="acme"))
            assert s == 409 and b["error"]["message"] == f"the sink name {name!r} is taken" \
                and b["error"]["field"] == "name", b
            # What comes before the name is answered as for a free name: the body, the token's rules.
            for body in (dict(MAIL, tenant="acme", retry={"max_attempts": 99}), dict(MAIL, tenant="billing"), MAIL):
                got = await call(c, "PUT", f"/v1/sinks/{name}", acm, body)
                free = await call(c, "PUT", "/v1/sinks/free-name", acm, body)
                assert got[0] == free[0] in (403, 422) and got[1]["error"]["field"] == free[1]["error"]["field"], \
                    (got, free)
            assert (await call(c, "GET", f"/v1/sinks/{name}", acm))[0] == 404
        assert env.state.sinks == before and "free-name" not in env.state.sinks
        s, b = await call(c, "PUT", "/v1/jobs/bil-job", bil, job("billing"))
        assert s == 201, b
        s, b = await call(c, "PUT", "/v1/jobs/bil-job", acm, job())
        assert s == 409 and b["error"]["message"] == "the job name 'bil-job' is taken", b
    run(t)


def test_a_tenants_default_routes_are_listed_shown_deleted_and_named_like_its_other_fields():
    """A user's walk: DELETE of a tenant with only routes answered 404 "no tenant 't1' has a rate
    limit"; with a rate limit too, "deleted" while GET still showed the routes; GET /v1/tenants
    listed neither; the messages of PUT never named ``notify``."""
    async def t(env, c):
        routes = [{"sink": "ops", "on": ["run.dead"]}]
        assert (await call(c, "PUT", "/v1/tenants/t1", BOOT, {"notify": routes}))[0] == 200
        assert (await call(c, "PUT", "/v1/tenants/t2", BOOT, {"rate_per_s": 5, "notify": routes}))[0] == 200
        shown = [{"sink": "ops", "on": ["run.dead"], "after_consecutive": 1, "repeat_every_s": 0}]
        s, b = await call(c, "GET", "/v1/tenants", BOOT)
        assert s == 200 and [(x["name"], x["notify"]) for x in b["tenants"]] == [("t1", shown), ("t2", shown)], b
        s, b = await call(c, "GET", "/v1/tenants/t2", BOOT)
        assert b["notify"] == shown and b["rate_per_s"] == 5, b
        for name in ("t1", "t2"):
            s, b = await call(c, "DELETE", f"/v1/tenants/{name}", BOOT)
            assert s == 200 and b["deleted"] is True, b
            s, b = await call(c, "GET", f"/v1/tenants/{name}", BOOT)
            assert s == 200 and b["notify"] == [] and b["rate_per_s"] is None, b
        assert env.state.tenant_notify == {} and (await call(c, "GET", "/v1/tenants", BOOT))[1]["tenants"] == []
        s, b = await call(c, "DELETE", "/v1/tenants/t1", BOOT)
        assert s == 404 and b["error"]["message"] == "no tenant 't1' has a rate limit, a policy or default routes", b
        for body in ({"bogus": 1}, {"bogus": 1, "notify": routes}):
            s, b = await call(c, "PUT", "/v1/tenants/t1", BOOT, body)
            assert s == 422 and b["error"]["field"] == "bogus" and "notify" in b["error"]["message"] \
                and "rate_per_s" in b["error"]["message"], b
        s, b = await call(c, "PUT", "/v1/tenants/t1", BOOT, {})
        assert s == 422 and "notify" in b["error"]["message"], b
        assert env.state.tenant_notify == {}
    run(t)


def test_a_tenants_sink_at_an_address_its_network_policy_refuses_is_put_with_a_warning():
    """A user's walk: an email sink of acme at 127.0.0.1 was accepted and every event then died
    ("127.0.0.1 is loopback"). An address literal is checked at put now (a host name is left to
    delivery, which resolves it); the policy may change before delivery, so it is a warning."""
    async def t(env, c):
        acm = await _acm(c)
        s, b = await call(c, "PUT", "/v1/sinks/m", acm, {
            "type": "email", "tenant": "acme", "smtp": dict(MAIL["smtp"], host="127.0.0.1")})
        assert s == 201 and b["warnings"] == [
            "smtp.host: 127.0.0.1 is loopback, which the network policy of tenant 'acme' refuses: delivery will "
            "refuse every event (dead: refused by the network policy); an admin may allow the network "
            "(network.allow in PUT /v1/tenants/acme)"], b
        s, b = await call(c, "PUT", "/v1/sinks/h", acm, dict(HOOK, tenant="acme", url="http://10.1.2.3:8080/x"))
        assert s == 201 and [w.split(",")[0] for w in b["warnings"]] == ["url: 10.1.2.3 is private"], b
        s, b = await call(c, "PUT", "/v1/sinks/h6", acm, dict(HOOK, tenant="acme", url="http://[::1]:8080/x"))
        assert s == 201 and [w.split(",")[0] for w in b["warnings"]] == ["url: ::1 is loopback"], b
        s, b = await call(c, "PUT", "/v1/sinks/sl", acm, {"type": "slack", "tenant": "acme",
                                                          "secrets": {"url": "https://127.0.0.1/services/T0/B0/xyz"}})
        assert s == 201 and [w.split(",")[0] for w in b["warnings"]] == ["secrets.url: its address is loopback"], b
        assert "xyz" not in str(b["warnings"])
        for name, body in (("n", dict(HOOK, tenant="acme")), ("adm", dict(HOOK, url="http://127.0.0.1:9/"))):
            s, b = await call(c, "PUT", f"/v1/sinks/{name}", BOOT, body)  # a name; a sink of no tenant
            assert s == 201 and "warnings" not in b, b
        assert (await call(c, "PUT", "/v1/tenants/acme", BOOT, {"network": {"allow": ["127.0.0.0/8"]}}))[0] == 200
        s, b = await call(c, "PUT", "/v1/sinks/m", acm, {
            "type": "email", "tenant": "acme", "smtp": dict(MAIL["smtp"], host="127.0.0.1")})
        assert s == 200 and "warnings" not in b, b
    run(t)


def test_a_limited_tokens_http_job_at_an_address_its_network_policy_refuses_is_put_with_a_warning():
    """An operator's walk: a token limited to a tenant wrote an http job calling
    http://127.0.0.1:9/x, answered 201, and every run then died ("127.0.0.1 is loopback"): the
    README reads as if such a write were checked. An address literal its tenant's policy
    refuses is said at put (PUT and batch alike); a host name is left to the run, which resolves
    it; an admin's job is held to no policy."""
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        acm = await _acm(c)
        ex = {"type": "http", "url": "http://127.0.0.1:9/x"}
        s, b = await call(c, "PUT", "/v1/jobs/loop", acm, job(executor=ex))
        assert s == 201 and b["warnings"] == [
            "executor.url: 127.0.0.1 is loopback, which the network policy of tenant 'acme' refuses: every run will "
            "be refused (and end dead); an admin may allow the network (network.allow in PUT /v1/tenants/acme)"], b
        s, b = await call(c, "PUT", "/v1/jobs/v6", acm, job(executor={"type": "http", "url": "http://[::1]:8080/"}))
        assert s == 201 and [w.split(",")[0] for w in b["warnings"]] == ["executor.url: ::1 is loopback"], b
        s, b = await call(c, "POST", "/v1/jobs:batch", acm, {"jobs": {"b-loop": job(executor=ex), "b-pub": job()}})
        assert s == 200 and [w.split(",")[0] for w in b["jobs"]["b-loop"]["warnings"]] == [
            "executor.url: 127.0.0.1 is loopback"] and "warnings" not in b["jobs"]["b-pub"], b
        for who, name, body in ((acm, "named", job(executor={"type": "http", "url": "http://localhost:9/x"})),
                                (acm, "pub", job()), (BOOT, "adm", job(executor=ex))):
            s, b = await call(c, "PUT", f"/v1/jobs/{name}", who, body)
            assert s == 201 and "warnings" not in b, (name, b)
        assert (await call(c, "PUT", "/v1/tenants/acme", BOOT, {"network": {"allow": ["127.0.0.0/8"]}}))[0] == 200
        s, b = await call(c, "PUT", "/v1/jobs/loop", acm, job(executor=ex))
        assert s == 200 and "warnings" not in b, b
    run(t)
