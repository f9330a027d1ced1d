"""Backfills and tokens limited to tenants (docs/security.md, "Tenants"; docs/backfill.md): such a
token sees, pauses, resumes and cancels the backfills of its tenants' jobs, and another tenant's
backfill is not there for it (404, as an id nobody uses); its tenant may have at most
limits.backfills_tenant_active_max backfills active, so it cannot take the cluster's every active
slot (which bulk DLQ operations share); and a cascade it asks for holds and counts only its
tenants' children."""
from __future__ import annotations

import asyncio
import json
import time

from raftsched.core import backfill_plan, commands, limits, schedule

from backfill_helpers import backfill_cmd, step
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, tick
from test_auth import call, new_token, run
from raftsched.node.backfills import BackfillStepper

HOOK = {"executor": {"type": "http", "url": "https://example.com/"}, "misfire": {"policy": "skip"}}


async def _two_tenants(env, c):
    """Jobs acme-sync (tenant acme) and bill-sync (billing), an hour of minutes behind them, and
    an operator token for each tenant."""
    for name, tenant, q in (("acme-sync", "acme", "qa"), ("bill-sync", "billing", "qb")):
        s, b = await call(c, "PUT", f"/v1/jobs/{name}", body=dict(HOOK, schedule={"every_s": 60}, tenant=tenant, queue=q))
        assert s == 201, b
    env.clock.advance(3_600_000)
    acm = (await new_token(c, "operator", tenants=["acme"]))["token"]
    bil = (await new_token(c, "operator", tenants=["billing"]))["token"]
    now = env.clock.now_ms()
    rng = {"from": schedule.iso(now - 1_800_000), "to": schedule.iso(now - 600_000), "reprocess": "all"}
    return acm, bil, rng


def test_a_limited_token_sees_and_controls_its_tenants_backfills_and_no_other():
    async def t(env, c):
        acm, bil, rng = await _two_tenants(env, c)
        s, b = await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(rng, id="a1"))
        assert s == 201, b
        s, b = await call(c, "POST", "/v1/jobs/bill-sync/backfills", bil, body=dict(rng, id="b1"))
        assert s == 201, b
        assert (await call(c, "POST", "/v1/jobs/bill-sync/backfills", body=dict(rng, id="adm")))[0] == 201
        s, b = await call(c, "GET", "/v1/backfills/a1", acm)
        assert s == 200 and b["id"] == "a1" and b["job"] == "acme-sync", b
        s, b = await call(c, "GET", "/v1/backfills", acm)
        assert s == 200 and [x["id"] for x in b["backfills"]] == ["a1"], b
        s, b = await call(c, "GET", "/v1/backfills", bil)
        assert s == 200 and [x["id"] for x in b["backfills"]] == ["b1", "adm"], b
        # another tenant's backfill answers as one nobody made, to a read and to every action
        for path in ("/v1/backfills/b1", "/v1/backfills/nope"):
            s, e = await call(c, "GET", path, acm)
            assert s == 404 and e["error"] == {"code": "not_found", "message": f"no backfill {path[14:]!r}",
                                               "field": "id"}, e
            for action in ("pause", "resume", "cancel"):
                s, e2 = await call(c, "POST", f"{path}/{action}", acm)
                assert (s, e2) == (404, e), (action, e2)
        assert env.state.backfills["b1"]["state"] == "running"
        for action, state in (("pause", "paused"), ("resume", "running"), ("cancel", "cancelled")):
            s, b = await call(c, "POST", f"/v1/backfills/a1/{action}", acm)
            assert s == 200 and b["state"] == state, b
        # a malformed id is refused naming it, as to any token
        s, e = await call(c, "GET", "/v1/backfills/" + "x" * 65, acm)
        assert s == 422 and e["error"]["field"] == "id", e
        # bulk DLQ operations stay the admin's
        assert (await call(c, "POST", "/v1/dlq:requeue", acm, body={"dry_run": True}))[0] == 403
    run(t)


def test_a_limited_tokens_tenant_cannot_take_every_active_backfill():
    """63 backfills of one tenant's job at a snail's pace took the cluster's bound of 64: every
    team's backfill, and the admin's bulk requeue, were refused limit_exceeded, and the token
    could not cancel its own (GET and cancel were refused to it)."""
    async def t(env, c):
        acm, bil, rng = await _two_tenants(env, c)
        slow = dict(rng, rate_per_s=0.001)
        for i in range(limits.backfills_tenant_active_max):
            s, b = await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(slow, id=f"dos-{i}"))
            assert s == 201, (i, b)
        s, e = await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(slow, id="dos-x"))
        assert s == 422 and e["error"]["code"] == "limit_exceeded" and e["error"]["field"] == "id", e
        assert "backfills_tenant_active_max" in e["error"]["message"] and "'acme'" in e["error"]["message"], e
        assert "dos-x" not in env.state.backfills
        # the other tenant, and the admin's bulk operations, still have room
        assert (await call(c, "POST", "/v1/jobs/bill-sync/backfills", bil, body=dict(slow, id="b1")))[0] == 201
        assert (await call(c, "POST", "/v1/dlq:requeue", body={"id": "redrive", "all": True}))[0] == 201
        # the token cancels one of its own, and has room again
        assert (await call(c, "POST", "/v1/backfills/dos-0/cancel", acm))[0] == 200
        assert (await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(slow, id="dos-x")))[0] == 201
    run(t)


def test_tokens_limited_to_tenants_together_leave_room_for_the_others(monkeypatch):
    """A review: the per-tenant bound alone let a token limited to four tenants (or four tenants'
    tokens) hold 4 x 16 = every active backfill. All limited tokens' backfills together are
    bounded too (backfills_limited_active_max), and the rest stays the admin's."""
    monkeypatch.setattr(limits, "backfills_tenant_active_max", 2)
    monkeypatch.setattr(limits, "backfills_limited_active_max", 3)

    async def t(env, c):
        acm, bil, rng = await _two_tenants(env, c)
        slow = dict(rng, rate_per_s=0.001)
        for tok, job, ids in ((acm, "acme-sync", ("a0", "a1")), (bil, "bill-sync", ("b0",))):
            for i in ids:
                s, b = await call(c, "POST", f"/v1/jobs/{job}/backfills", tok, body=dict(slow, id=i))
                assert s == 201, (i, b)
        s, e = await call(c, "POST", "/v1/jobs/bill-sync/backfills", bil, body=dict(slow, id="b1"))
        assert s == 422 and "backfills_limited_active_max" in e["error"]["message"] and e["error"]["limit"] == 3, e
        assert (await call(c, "POST", "/v1/jobs/bill-sync/backfills", body=dict(slow, id="adm")))[0] == 201
        assert (await call(c, "POST", "/v1/dlq:requeue", body={"id": "redrive", "all": True}))[0] == 201
    run(t)


def test_a_backfill_that_kept_no_tenant_is_shown_to_tokens_without_tenants_only():
    """A review: a backfill made by an older version kept no tenant, and was given its job's
    tenant now, whatever job has that name now: a job deleted and put again under the name by
    another tenant showed that tenant the old backfill (its payload, its progress)."""
    async def t(env, c):
        acm, bil, rng = await _two_tenants(env, c)
        assert (await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(rng, id="old")))[0] == 201
        del env.state.backfills["old"]["tenant"]  # as an older version made it
        assert backfill_plan.tenant_of(env.state, env.state.backfills["old"]) is None
        assert (await call(c, "GET", "/v1/backfills/old", acm))[0] == 404
        assert (await call(c, "GET", "/v1/backfills/old"))[0] == 200
    run(t)


def test_a_limited_token_learns_nothing_of_an_admins_cascade_on_its_job():
    """An admin's cascade may hold and count another tenant's children (an admin's edge): it is
    the admin's, not listed to a limited token of the job's tenant, and 404 by id."""
    async def t(env, c):
        acm, bil, rng = await _two_tenants(env, c)
        s, b = await call(c, "POST", "/v1/jobs/acme-sync/backfills", body=dict(rng, id="adm", cascade="children"))
        assert s == 201, b
        assert (await call(c, "GET", "/v1/backfills/adm", acm))[0] == 404
        assert (await call(c, "GET", "/v1/backfills", acm))[1]["backfills"] == []
        s, b = await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(rng, id="own", cascade="children"))
        assert s == 201, b
        assert [x["id"] for x in (await call(c, "GET", "/v1/backfills", acm))[1]["backfills"]] == ["own"]
        # the admin's body again from the limited token is another request, not the admin's backfill's view
        s, e = await call(c, "POST", "/v1/jobs/acme-sync/backfills", acm, body=dict(rng, id="adm", cascade="children"))
        assert s == 409 and e["error"]["field"] == "id", e
    run(t)


def test_a_limited_tokens_cascade_holds_and_counts_only_its_tenants_children():
    """a (acme) -> b (billing, an admin's edge), a -> d (acme). A cascade the acme token asked for
    waited forever for b's run, which no worker of acme's may take, and its progress counted
    billing's runs (children_queued). b follows the backfill's runs as it follows any of a's, on
    its own."""
    s = chain_state(("a", job_raw(every_s=10, tenant="acme", queue="qa")),
                    ("b", job_raw(after=["a"], tenant="billing", queue="qb")),
                    ("d", job_raw(after=["a"], tenant="acme", queue="qa")))
    s1 = T0 + 10 * SEC
    for i in range(3):  # a's first three slots fired and dead: b and d record them
        now = s1 + i * 10 * SEC
        tick(s, now)
        for g in lease(s, now):
            finish(s, g, now, False)
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", s1, s1 + 30 * SEC, now, bf_id="bf", reprocess="failed", max_concurrent=1,
                                 cascade="children", tenants=["acme"]))["ok"]
    for _ in range(100):
        now += SEC
        step(s, "bf", now)
        for g in lease(s, now):
            if s.runs[g["id"]]["tenant"] == "acme":  # (billing's runs: no worker here takes them)
                finish(s, g, now, True)
        if s.backfills["bf"]["state"] == "done":
            break
    bf = s.backfills["bf"]
    assert bf["state"] == "done", bf
    assert bf["created"] == 3 and bf["cascaded"] == 3 and bf["finished"] == {"succeeded": 6}, bf
    assert not any(r.startswith("b@") for r in bf["active"])
    # b's runs were made all the same, as for any run of a: queued, not the backfill's
    b_runs = [r for r in s.runs.values() if r["job"] == "b" and r["kind"] != "recorded"]
    assert len(b_runs) == 3 and all("backfill" not in r and r["state"] in ("queued", "running") for r in b_runs)


def test_a_backfill_made_by_a_limited_token_names_a_job_of_its_tenants_in_the_command():
    """The command carries the token's tenants: apply refuses another tenant's job (a job moved
    between the proposer's check and apply) as no such job."""
    s = chain_state(("a", job_raw(every_s=10, tenant="billing", queue="qb")))
    res = apply(s, backfill_cmd(s, "a", T0 + 10 * SEC, T0 + 40 * SEC, T0 + 100 * SEC, bf_id="x", tenants=["acme"]))
    assert not res["ok"] and res["error"]["code"] == "not_found" and "x" not in s.backfills, res
    assert backfill_plan.tenant_active(s, "billing") == 0


def test_a_backfill_whose_run_no_worker_may_take_says_what_it_waits_for():
    """It showed ``state: running, reason: null`` for as long as no worker matched its run's
    placement; the run's own view said why."""
    async def t(env, c):
        spec = dict(HOOK, schedule={"every_s": 60}, tenant="acme", queue="qa", placement={"labels": {"pool": "gpu"}})
        assert (await call(c, "PUT", "/v1/jobs/placed", body=spec))[0] == 201
        env.clock.advance(3_600_000)
        await env.trigger.tick()  # (its cursor moves past the range: its slots are due)
        now = env.clock.now_ms()
        body = {"from": schedule.iso(now - 1_800_000), "to": schedule.iso(now - 600_000), "reprocess": "all", "id": "p1"}
        s, b = await call(c, "POST", "/v1/jobs/placed/backfills", body=body)
        assert s == 201 and "waiting_for" not in b, b
        assert await BackfillStepper(env.raft, env.clock).tick() == 1
        rid = env.state.backfills["p1"]["active"][0]
        s, b = await call(c, "GET", "/v1/backfills/p1")
        assert s == 200 and b["state"] == "running" and b["reason"] is None, b
        assert b["waiting_for"] == f"its run {rid}: no worker matches its placement", b
        assert (await call(c, "GET", "/v1/backfills"))[1]["backfills"][0]["waiting_for"] == b["waiting_for"]
        # (a review) its job moved to another tenant: the runs it makes are that tenant's, and the
        # view, which a token of the backfill's tenant reads, names none of them
        env.state.runs[rid]["tenant"] = "billing"
        s, b = await call(c, "GET", "/v1/backfills/p1")
        assert s == 200 and "waiting_for" not in b, b
    run(t)


def test_the_cli_waits_for_a_backfill_with_a_token_limited_to_tenants(tmp_path, capsys):
    """`raftsched backfill JOB ... --id X --wait --token-file limited.tok` printed the 403 of
    GET /v1/backfills/X and exited 1 while the backfill ran."""
    from aiohttp.test_utils import TestServer

    from raftsched import cli
    from test_auth import Env

    async def main():
        env = Env()
        server = TestServer(env.app, host="127.0.0.1")
        await server.start_server()
        try:
            async with __import__("aiohttp").ClientSession() as session:
                class C:  # test_auth.call's client: the session under the server's root
                    async def request(self, method, path, **kw):
                        return await session.request(method, str(server.make_url(path)), **kw)
                c = C()
                s, b = await call(c, "PUT", "/v1/jobs/acme-sync", body=dict(HOOK, schedule={"every_s": 60},
                                                                            tenant="acme", queue="qa"))
                assert s == 201, b
                env.clock.advance(3_600_000)
                await env.trigger.tick()
                tok = (await new_token(c, "operator", tenants=["acme"]))["token"]
            f = tmp_path / "limited.tok"
            f.write_text(tok + "\n")
            f.chmod(0o600)
            now = env.clock.now_ms()
            argv = ["backfill", "acme-sync", "--url", str(server.make_url("/")).rstrip("/"), "--token-file", str(f),
                    "--from", schedule.iso(now - 600_000), "--to", schedule.iso(now - 300_000),
                    "--reprocess", "all", "--id", "X", "--wait"]
            stepper = BackfillStepper(env.raft, env.clock)
            waited = asyncio.ensure_future(asyncio.to_thread(cli.main, argv))
            deadline = time.monotonic() + 60
            while not waited.done():  # the leader's stepper, and a worker that succeeds every run
                assert time.monotonic() < deadline, "the CLI did not end within 60 s"
                await stepper.tick()
                for g in lease(env.state, env.clock.now_ms()):
                    await env.service.propose(commands.complete_many(env.clock.now_ms(), None, worker="w",
                                              results=[{"run": g["id"], "token": g["token"], "success": True}]))
                await asyncio.sleep(0.05)  # ok-sleep: the stepper's interval, inside a deadline loop
            return await waited, env
        finally:
            await server.close()

    rc, env = asyncio.run(main())
    out = capsys.readouterr()
    assert rc == 0 and env.state.backfills["X"]["state"] == "done", (out.out, out.err)
    end = json.loads(out.out)  # (not a terminal: the backfill as it ended, and its runs)
    assert end["state"] == "done" and end["progress"]["succeeded"] == 5 and len(end["runs"]) == 5, end


def test_the_cli_progress_line_says_what_a_backfill_waits_for():
    from raftsched.backfill_cli import progress_line
    v = {"id": "p1", "kind": "backfill", "state": "running", "progress": {"planned": 3, "created": 1, "left_out": 0,
                                                                         "queued": 1}}
    assert progress_line(v).endswith("(running)")
    v["waiting_for"] = "its run placed@1: no worker matches its placement"
    assert progress_line(v).endswith("(running; its run placed@1: no worker matches its placement)")
