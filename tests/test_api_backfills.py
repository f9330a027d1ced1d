"""The backfill and bulk dead-letter endpoints over an in-process replica (FakeRaft, FakeClock),
with the leader's stepper (node/backfills.py): answers, errors (which field, why), idempotent
ids, and the trigger's payload and slot."""
from __future__ import annotations

import json
from urllib.parse import quote

from raftsched.core import commands, limits, schedule
from raftsched.node.backfills import BackfillStepper

from test_api import AUTH, err, put, run

DAY_MS = 86_400_000
NIGHTLY = {"schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
           "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}


async def post(c, path, body=None, headers=AUTH):
    return await c.post(path, data=None if body is None else json.dumps(body), headers=headers)


async def nightly_for_days(env, c, days=12):
    """Job ``nightly`` fired for ``days`` nights (every night recorded skipped: the trigger
    ticks once a day, after the grace)."""
    r = await put(c, "nightly", NIGHTLY)
    assert r.status == 201
    for _ in range(days):
        env.clock.advance(DAY_MS)
        await env.trigger.tick()
    return env.clock.now_ms()


def rng(now, days=10):
    return {"from": schedule.iso(now - days * DAY_MS), "to": schedule.iso(now)}


def test_a_dry_run_lists_the_slots_and_proposes_nothing_then_the_backfill_runs_them():
    async def t(env, c):
        now = await nightly_for_days(env, c)
        before = env.raft.index
        r = await post(c, "/v1/jobs/nightly/backfills", dict(rng(now), dry_run=True))
        assert r.status == 200
        dry = await r.json()
        assert dry["dry_run"] is True and dry["planned"] == 10 and len(dry["slots"]) == 10 and dry["left_out"] == []
        assert env.raft.index == before, "a dry run proposed a command"
        r = await post(c, "/v1/jobs/nightly/backfills", dict(rng(now), id="nine", max_concurrent=2))
        assert r.status == 201
        v = await r.json()
        assert (v["id"], v["kind"], v["job"], v["state"], v["created"]) == ("nine", "backfill", "nightly", "running", True)
        assert v["progress"]["planned"] == 10 and v["request"]["max_concurrent"] == 2 and v["cursor"] is None
        stepper = BackfillStepper(env.raft, env.clock)
        assert await stepper.tick() == 1
        assert await stepper.tick() == 0, "two queued: max_concurrent holds the rest"
        r = await c.get("/v1/backfills/nine")
        v = await r.json()
        assert v["progress"]["created"] == 2 and v["progress"]["queued"] == 2
        runs = (await (await c.get("/v1/jobs/nightly/runs?state=queued")).json())["runs"]
        assert {x["slot"] for x in runs} == set(dry["slots"][:2]) and {x["backfill"] for x in runs} == {"nine"}
        assert {x["kind"] for x in runs} == {"backfill"}
        # The same id again: the same backfill, 200.
        r = await post(c, "/v1/jobs/nightly/backfills", dict(rng(now), id="nine", max_concurrent=2))
        assert r.status == 200 and (await r.json())["created"] is False
        await err(await post(c, "/v1/jobs/nightly/backfills", dict(rng(now), id="nine")), 409, "conflict", "id")
        r = await post(c, "/v1/backfills/nine/pause")
        assert r.status == 200 and (await r.json())["state"] == "paused"
        r = await post(c, "/v1/backfills/nine/cancel")
        body = await r.json()
        assert body["state"] == "cancelled" and body["withdrawn"] == 2
        await err(await post(c, "/v1/backfills/nine/resume"), 409, "conflict", "id")
        lst = (await (await c.get("/v1/backfills?kind=backfill&state=cancelled")).json())["backfills"]
        assert [b["id"] for b in lst] == ["nine"]
        # The eight slots it never came to are counted: created + left_out = planned.
        p = lst[0]["progress"]
        assert (p["planned"], p["created"], p["left_out"], p["left_out_reasons"]) == (10, 2, 8, {"cancelled": 8})
        assert p["skipped"] == 2, p  # the two withdrawn
    run(t)


def test_backfill_requests_that_fail_say_which_field_and_why():
    async def t(env, c):
        now = await nightly_for_days(env, c, 3)
        p = "/v1/jobs/nightly/backfills"
        await err(await post(c, "/v1/jobs/nope/backfills", rng(now)), 404, "not_found", "name")
        await err(await c.post(p, data=b"{nope", headers=AUTH), 400, "bad_request")
        await err(await post(c, p, {"to": rng(now)["to"]}), 422, "invalid", "from")
        await err(await post(c, p, dict(rng(now), to=rng(now)["from"])), 422, "invalid", "to")
        await err(await post(c, p, dict(rng(now), to=schedule.iso(now + 60_000))), 422, "invalid", "to")
        await err(await post(c, p, dict(rng(now), reprocess="some")), 422, "invalid", "reprocess")
        await err(await post(c, p, dict(rng(now), order="random")), 422, "invalid", "order")
        await err(await post(c, p, dict(rng(now), max_concurrent=0)), 422, "invalid", "max_concurrent")
        await err(await post(c, p, dict(rng(now), rate_per_s=0)), 422, "invalid", "rate_per_s")
        await err(await post(c, p, dict(rng(now), overlap="replace")), 422, "invalid", "overlap")
        await err(await post(c, p, dict(rng(now), id="has space")), 422, "invalid", "id")
        await err(await post(c, p, dict(rng(now), colour="red")), 422, "invalid", "colour")
        body = await err(await post(c, p, dict(rng(now, 400), max_slots=100)), 422, "invalid", "max_slots")
        assert body["error"]["slots"] == 400 and "400 slots" in body["error"]["message"] and "(100)" in body["error"]["message"]
        await err(await c.post(p, data=json.dumps(rng(now)), headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
        await err(await c.get("/v1/backfills/nope"), 404, "not_found", "id")
        await err(await c.get("/v1/backfills?kind=other"), 400, "bad_request", "kind")
        await err(await post(c, "/v1/backfills/nope/pause"), 404, "not_found", "id")
        r = await post(c, "/v1/backfills/x/explode")
        assert r.status == 404
    run(t)


def test_the_trigger_takes_a_payload_and_a_slot_deduplicated():
    async def t(env, c):
        now = await nightly_for_days(env, c, 3)
        slot = schedule.iso(schedule.next_slot_after(NIGHTLY["schedule"], now - 2 * DAY_MS, 0))
        r = await post(c, "/v1/jobs/nightly/trigger", {"slot": slot, "payload": {"day": 1}})
        assert r.status == 201
        first = await r.json()
        assert first["created"] is True and "@" in first["run"]
        r = await post(c, "/v1/jobs/nightly/trigger", {"slot": slot})
        assert r.status == 200 and (await r.json())["run"] == first["run"]
        run_view = await (await c.get(f"/v1/runs/{quote(first['run'], safe='')}")).json()  # '#' is %23
        assert run_view["payload"] == {"day": 1} and run_view["kind"] == "manual" and run_view["slot"] == slot
        await err(await post(c, "/v1/jobs/nightly/trigger", {"slot": schedule.iso(now - DAY_MS + 1)}),
                  422, "invalid", "slot")
        later = schedule.iso(schedule.next_slot_after(NIGHTLY["schedule"], now, 0))
        await err(await post(c, "/v1/jobs/nightly/trigger", {"slot": later}), 409, "conflict", "slot")
        await err(await post(c, "/v1/jobs/nightly/trigger", {"x": 1}), 422, "invalid", "x")
        r = await post(c, "/v1/jobs/nightly/trigger", {"payload": [1]})
        assert r.status == 201 and "!manual-" in (await r.json())["run"]
        r = await c.post("/v1/jobs/nightly/trigger", headers=AUTH)  # no body: as it always was
        assert r.status == 201 and set(await r.json()) == {"job", "run", "state"}
    run(t)


def test_a_heartbeat_job_takes_no_backfill_nor_a_trigger_with_a_slot_or_payload():
    """No worker runs a heartbeat job's slots (pings close them): a backfill or a trigger for a
    slot would queue a run every worker fails, so each is refused naming the field."""
    async def t(env, c):
        r = await put(c, "beat", dict(NIGHTLY, executor={"type": "heartbeat"}))
        assert r.status == 201, await r.text()
        for _ in range(3):
            env.clock.advance(DAY_MS)
            await env.trigger.tick()
        now = env.clock.now_ms()
        before = env.raft.index
        body = await err(await post(c, "/v1/jobs/beat/backfills", dict(rng(now, 2), reprocess="all")),
                         422, "invalid", "name")
        assert "heartbeat" in body["error"]["message"]
        await err(await post(c, "/v1/jobs/beat/backfills", dict(rng(now, 2), dry_run=True)), 422, "invalid", "name")
        slot = schedule.iso(schedule.next_slot_after(NIGHTLY["schedule"], now - 2 * DAY_MS, 0))
        await err(await post(c, "/v1/jobs/beat/trigger", {"slot": slot}), 422, "invalid", "slot")
        await err(await post(c, "/v1/jobs/beat/trigger", {"payload": {"x": 1}}), 422, "invalid", "payload")
        assert env.raft.index == before, "a refused request proposed a command"
        r = await c.post("/v1/jobs/beat/trigger", headers=AUTH)  # no body: a slot waiting for a ping
        assert r.status == 201 and (await r.json())["state"] == "waiting"
    run(t)


def test_a_payload_override_too_deep_or_with_an_integer_past_64_bits_is_refused_naming_payload():
    """As a job's own payload is: before, the trigger and the backfill proposed such a payload,
    and the answer was a 422 naming no field (an integer msgpack cannot hold) or an
    invalid_command from apply (nested deeper than apply takes)."""
    async def t(env, c):
        now = await nightly_for_days(env, c, 3)
        deep: object = 1
        for _ in range(limits.payload_depth_max + 1):
            deep = [deep]
        ok_deep: object = 1
        for _ in range(limits.payload_depth_max):
            ok_deep = [ok_deep]
        before = env.raft.index
        for bad in ({"x": 2 ** 70}, {"x": -(2 ** 64)}, deep):
            await err(await post(c, "/v1/jobs/nightly/trigger", {"payload": bad}), 422, "invalid", "payload")
            await err(await post(c, "/v1/jobs/nightly/backfills", dict(rng(now, 2), payload=bad)),
                      422, "invalid", "payload")
        assert env.raft.index == before, "a refused request proposed a command"
        r = await post(c, "/v1/jobs/nightly/trigger", {"payload": ok_deep})
        assert r.status == 201, await r.text()
        r = await post(c, "/v1/jobs/nightly/backfills", dict(rng(now, 2), payload=[2 ** 63 - 1, ok_deep[0]]))
        assert r.status == 201, await r.text()
    run(t)


def test_a_bulk_requeue_dry_runs_then_requeues_the_matching_dead_runs_and_a_purge_deletes():
    async def t(env, c):
        spec = {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["false"]},
                "misfire": {"policy": "skip"}}
        assert (await put(c, "flaky", spec)).status == 201
        assert (await put(c, "other", dict(spec, queue="q2"))).status == 201
        for job in ("flaky", "flaky", "other"):
            assert (await c.post(f"/v1/jobs/{job}/trigger", headers=AUTH)).status == 201
        env.clock.advance(10)
        res = await env.service.propose(commands.make("acquire", env.clock.now_ms(), None, worker="w", queues=None,
                                                      max=10, ttl=10_000))
        for g in res["runs"]:
            await env.service.propose(commands.make("complete", env.clock.now_ms(), None, run=g["id"], token=g["token"],
                                                    success=False, error="disk full" if g["job"] == "flaky" else "nope"))
        r = await post(c, "/v1/dlq:requeue", {"dry_run": True, "error": "disk"})
        dry = await r.json()
        assert r.status == 200 and dry["total"] == 2 and len(dry["runs"]) == 2
        r = await post(c, "/v1/dlq:requeue", {"error": "disk", "id": "redrive-1", "rate_per_s": 100})
        v = await r.json()
        assert r.status == 201 and v["kind"] == "requeue" and v["progress"]["planned"] == 2
        stepper = BackfillStepper(env.raft, env.clock)
        assert await stepper.tick() == 1  # the bucket starts with one token
        env.clock.advance(10)
        assert await stepper.tick() == 1  # and gains one every 10 ms at 100/s
        v = await (await c.get("/v1/backfills/redrive-1")).json()
        assert v["progress"]["requeued"] == 2 and v["progress"]["queued"] == 2
        dlq = await (await c.get("/v1/dlq")).json()
        assert [x["job"] for x in dlq["runs"]] == ["other"]
        queued = (await (await c.get("/v1/jobs/flaky/runs?state=queued")).json())["runs"]
        assert {x["requeue"] for x in queued} == {"redrive-1"} and {x["attempt"] for x in queued} == {2}
        await err(await post(c, "/v1/dlq:purge", {"max_concurrent": 3}), 422, "invalid", "max_concurrent")
        await err(await post(c, "/v1/dlq:requeue", {"dead_to": "yesterday"}), 422, "invalid", "dead_to")
        r = await post(c, "/v1/dlq:purge", {"queue": "q2"})
        assert r.status == 201
        await BackfillStepper(env.raft, env.clock).tick()
        assert (await (await c.get("/v1/dlq")).json())["total"] == 0
    run(t)


def test_a_bulk_dlq_filter_no_queue_or_job_could_have_is_refused_naming_it_and_nothing_is_stored():
    """The queue and job filters of POST /v1/dlq:requeue and :purge are names as everywhere else
    (model.check_name): a NUL, a time given as a job or an empty name is a 422 naming the field,
    not an operation planning no run. The error filter is text, 1-256 characters."""
    async def t(env, c):
        bad = [({"queue": "\u0000"}, "queue"), ({"queue": ""}, "queue"), ({"queue": "q" * 65}, "queue"),
               ({"queue": "-q"}, "queue"), ({"queue": 7}, "queue"),
               ({"job": "2026-12-06T20:00:00Z"}, "job"), ({"job": "a b"}, "job"), ({"job": "j" * 129}, "job"),
               ({"job": ["a"]}, "job"), ({"error": ""}, "error"), ({"error": "e" * 257}, "error"),
               ({"dead_from": "\u0000"}, "dead_from"), ({"dead_to": 5}, "dead_to")]
        for action in ("requeue", "purge"):
            for body, field in bad:
                for dry in (False, True):
                    proposed = len(env.raft.proposed)
                    r = await c.post(f"/v1/dlq:{action}", data=json.dumps(dict(body, dry_run=dry)), headers=AUTH)
                    await err(r, 422, "invalid", field)
                    assert len(env.raft.proposed) == proposed, (action, body)
        assert (await (await c.get("/v1/backfills")).json())["backfills"] == []
        r = await post(c, "/v1/dlq:purge", {"queue": "q-2", "job": "nightly.v2", "error": "\u0000 x"})
        assert r.status == 201, await r.text()
    run(t)


def test_a_bulk_dlq_request_with_no_filter_is_refused_unless_it_says_all_and_changes_nothing():
    """An empty body (or one holding only bounds: max_count, a rate, an id) would take every
    dead run of every queue: a script whose filter came out empty must not purge the whole
    DLQ. It is a 422 naming ``all``, for a dry run too (it tells what the real request does),
    and nothing is proposed; ``"all": true`` says every dead run is meant."""
    async def t(env, c):
        for action in ("requeue", "purge"):
            for body in (None, {}, {"dry_run": True}, {"max_count": 5}, {"id": "x", "rate_per_s": 1},
                         {"all": False}, {"job": None, "queue": None}):
                proposed = len(env.raft.proposed)
                kw = {} if body is None else {"data": json.dumps(body)}
                r = await c.post(f"/v1/dlq:{action}", headers=AUTH, **kw)
                e = await err(r, 422, "invalid", "all")
                assert "every dead run" in e["error"]["message"] and '"all": true' in e["error"]["message"], e
                assert len(env.raft.proposed) == proposed, (action, body)
            await err(await post(c, f"/v1/dlq:{action}", {"all": "yes"}), 422, "invalid", "all")
            r = await post(c, f"/v1/dlq:{action}", {"all": True, "dry_run": True})
            assert r.status == 200 and (await r.json())["total"] == 0, await r.text()
        assert (await (await c.get("/v1/backfills")).json())["backfills"] == []
        r = await post(c, "/v1/dlq:purge", {"all": True, "id": "everything"})
        assert r.status == 201, await r.text()
        r = await post(c, "/v1/dlq:requeue", {"dead_from": "2020-01-01T00:00:00Z"})
        assert r.status == 201, await r.text()
    run(t)


def test_a_bulk_dlq_request_sent_again_under_its_id_is_the_same_operation_though_dead_to_defaulted():
    """A user's walk: POST /v1/dlq:requeue {"job": ..., "id": "same"} sent twice a second apart
    (a retry; the CLI run again) answered 409 "already used by another request": dead_to, left
    to default, was now, and the two nows differ. The same body under its id is the same
    operation (200, created false); another body under it still a 409."""
    async def t(env, c):
        for action in ("requeue", "purge"):
            body = {"job": "nightly", "id": f"same-{action}"}
            r = await post(c, f"/v1/dlq:{action}", body)
            assert r.status == 201, await r.text()
            first = await r.json()
            env.clock.advance(1500)
            r = await post(c, f"/v1/dlq:{action}", body)
            assert r.status == 200, await r.text()
            again = await r.json()
            assert again["created"] is False and again["request"] == first["request"], again
            await err(await post(c, f"/v1/dlq:{action}", dict(body, job="other")), 409, "conflict", "id")
            r = await post(c, f"/v1/dlq:{action}", dict(body, dead_to="2030-01-01T00:00:00Z"))
            await err(r, 409, "conflict", "id")  # a dead_to of its own is another request
    run(t)


def test_the_longest_run_id_of_each_kind_is_read_requeued_and_purged_through_the_api():
    """Run ids as long as the state makes them (a 128-character job, 15-digit times, a manual
    run's 20-digit N, a 64-character backfill id): each dead one answers GET, and is requeued
    and purged, as the API's own description of the path parameter allows
    (limits.run_id_chars_max, which check_run_id applies)."""
    from raftsched.core import limits
    from raftsched.node import openapi

    async def t(env, c):
        env.clock.jump(250_000_000_000_000 - env.clock.now_ms())  # times of 15 digits
        name = "j" * limits.job_name_chars_max
        spec = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["false"]},
                "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}}
        assert (await put(c, name, spec)).status == 201
        env.clock.advance(3_600_000)
        await env.trigger.tick()  # its scheduled run, job@slot
        env.state.manual_seq = 10 ** (limits.manual_seq_digits_max - 1)  # the next N has 20 digits
        assert (await c.post(f"/v1/jobs/{name}/trigger", headers=AUTH)).status == 201

        async def fail_all():
            res = await env.service.propose(commands.make("acquire", env.clock.now_ms(), None, worker="w",
                                                          queues=None, max=10, ttl=10_000))
            for g in res["runs"]:
                await env.service.propose(commands.make("complete", env.clock.now_ms(), None, run=g["id"],
                                                        token=g["token"], success=False, error="no"))
            return [g["id"] for g in res["runs"]]
        scheduled, manual = sorted(await fail_all(), key=len)
        slot = env.state.runs[scheduled]["slot"]
        bf_id = "b" * limits.backfill_id_chars_max
        env.clock.advance(1000)
        r = await post(c, f"/v1/jobs/{name}/backfills", {"from": schedule.iso(slot), "to": schedule.iso(slot + 1),
                                                         "id": bf_id, "reprocess": "all"})
        assert r.status == 201, await r.text()
        await BackfillStepper(env.raft, env.clock).tick()
        [backfilled] = await fail_all()
        assert (scheduled, backfilled) == (f"{name}@{slot}", f"{name}@{slot}#b{bf_id}")
        assert "!manual-" in manual and len(manual) == len(name) + 1 + 15 + 8 + 20
        assert len(backfilled) == limits.run_id_chars_max
        param = openapi.PATH_PARAMS[("dlq", "run")]
        for rid in (scheduled, manual, backfilled):
            path = f"/v1/dlq/{quote(rid, safe='')}"
            assert (await c.get(path)).status == 200
            r = await c.post(path + "/requeue", headers=AUTH)
            assert r.status == 200, (rid, await r.text())
            assert await fail_all() == [rid]
            r = await c.delete(path, headers=AUTH)
            assert r.status == 200, (rid, await r.text())
            assert rid not in env.state.runs
            assert len(rid) <= param["maxLength"] and openapi.PATH_PARAMS[("runs", "run")] == param
    run(t)
