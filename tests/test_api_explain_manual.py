"""``POST /v1/jobs/{name}/explain {"slot": ISO}`` for the instant of a manual run finds that run,
as ``GET /v1/jobs/{name}/runs?slot=`` does (node/service.py explain_slot). A user opened a
heartbeat job's slot by hand (``backup@<ms>!manual-2``), pinged it to success, and asked explain
about that instant: it answered ``run: null`` and "no slot of the job's schedule falls at that
instant", while the runs of that slot showed the manual run succeeded. Manual runs have no
deadline record (deadlines are judged for the slots the schedule fires), and the answer says so."""
from __future__ import annotations

import json

from test_api import put, run

BACKUP = {"schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, "executor": {"type": "heartbeat"},
          "misfire": {"policy": "skip"}, "deadline": {"start_within_s": 600, "succeed_by": "04:00"}}


def test_explain_of_a_manual_runs_instant_finds_the_run_and_says_it_has_no_deadline_record():
    async def t(env, c):
        assert (await put(c, "backup", BACKUP)).status == 201
        r = await c.post("/v1/jobs/backup/trigger")
        assert r.status in (200, 201), await r.text()
        rid = (await r.json())["run"]
        assert "!manual-" in rid, rid
        env.clock.advance(1_000)
        for status in ("start", "success"):
            r = await c.post("/v1/jobs/backup/ping", data=json.dumps({"status": status}))
            assert r.status == 200, await r.text()
        manual = await (await c.get(f"/v1/runs/{rid}")).json()
        assert manual["state"] == "succeeded", manual
        listed = (await (await c.get(f"/v1/jobs/backup/runs?slot={manual['slot']}")).json())["runs"]
        assert [x["id"] for x in listed] == [rid]
        body = await (await c.post("/v1/jobs/backup/explain", data=json.dumps({"slot": manual["slot"]}))).json()
        assert body["run"] is not None and body["run"]["id"] == rid and body["run"]["state"] == "succeeded", body
        assert [x["id"] for x in body["runs"]] == [rid], body
        assert body["deadline"] is None, body
        assert "no slot of the job's schedule falls" not in body["why"].split(";")[0], body
        assert "manual run" in body["why"] and "no deadline record" in body["why"], body
    run(t)


def test_explain_of_a_scheduled_slot_lists_its_run_and_an_instant_with_nothing_says_so():
    """The other answers keep their shape, with ``runs`` beside ``run``."""
    async def t(env, c):
        spec = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                "misfire": {"policy": "fire_all"}, "deadline": {"start_within_s": 5}}
        assert (await put(c, "a", spec)).status == 201
        env.clock.advance(10_000)
        assert await env.trigger.tick() >= 1
        (first,) = [x for x in (await (await c.get("/v1/jobs/a/runs")).json())["runs"] if x["slot_ms"] <= env.clock.now_ms()]
        body = await (await c.post("/v1/jobs/a/explain", data=json.dumps({"slot": first["slot"]}))).json()
        assert body["run"]["id"] == first["id"] and [x["id"] for x in body["runs"]] == [first["id"]], body
        assert body["deadline"] is not None and body["deadline"]["state"] == "pending", body
        body = await (await c.post("/v1/jobs/a/explain", data=json.dumps({"slot": "2031-03-01T01:00:41Z"}))).json()
        assert body["run"] is None and body["runs"] == [] and "no slot of the job's schedule" in body["why"], body
    run(t)


def test_explain_of_an_instant_inside_a_recorded_range_that_is_no_slot_says_so():
    """A walk: an instant inside a range of slots recorded skipped, but no slot itself, was told
    the slot was past the range's first ones, or the job had no deadline then."""
    from raftsched.core.schedule import iso

    async def t(env, c):
        spec = {"schedule": {"every_s": 30}, "executor": {"type": "shell", "argv": ["true"]},
                "misfire": {"policy": "skip", "grace_s": 0}, "deadline": {"start_within_s": 5}}
        assert (await put(c, "dl", spec)).status == 201
        first = env.state.jobs["dl"]["next"]
        env.clock.advance(first + 5 * 30_000 - env.clock.now_ms())
        await env.trigger.tick()  # (the first five slots missed: recorded as one range)
        body = await (await c.post("/v1/jobs/dl/explain", data=json.dumps({"slot": iso(first + 40_000)}))).json()
        assert body["why"].startswith("no slot of the job's schedule falls at that instant"), body
        assert "it falls inside" in body["why"] and "skipped (misfire)" in body["why"], body
    run(t)


def test_explain_of_a_slot_of_a_job_without_a_deadline_says_it_plainly():
    """A walk asked explain about a slot of a job with no deadline whose run had ended: the answer
    guessed three ways (no deadline then, not fired, given up)."""
    async def t(env, c):
        spec = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]},
                "misfire": {"policy": "fire_all"}}
        assert (await put(c, "plain", spec)).status == 201
        env.clock.advance(10_000)
        assert await env.trigger.tick() >= 1
        (first,) = [x for x in (await (await c.get("/v1/jobs/plain/runs")).json())["runs"]
                    if x["slot_ms"] <= env.clock.now_ms()]
        body = await (await c.post("/v1/jobs/plain/explain", data=json.dumps({"slot": first["slot"]}))).json()
        assert body["why"] == f"the job has no deadline: none of its slots is judged (PUT it with deadline, " \
                              f"docs/notifications.md); its run {first['id']} is queued", body
    run(t)
