"""The admin API over an in-process replica (FakeRaft, FakeClock): every error path returns its
status and body; nothing a client sends gives a 500 (I11)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core import commands, schedule
from raftsched.core.state import SchedulerState
from raftsched.node.api import make_app
from raftsched.node.metrics import NodeMetrics
from raftsched.node.service import Service
from raftsched.node.trigger import Trigger
from raftsched.worker.loop import Worker

from fakes import FakeRaft
from core_helpers import live_worker

TOKEN = "x" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "fire_all"}}


class Env:
    """An app over one replica, with a trigger; ``metrics`` adds a worker and the metrics."""

    def __init__(self, metrics: bool = False):
        self.state = SchedulerState()
        self.raft = FakeRaft(self.state)
        self.clock = FakeClock()
        self.service = Service(self.raft, self.clock, "node-1")
        self.trigger = Trigger(self.raft, self.clock, "node-1")
        self.trigger.take_due_index()  # as it does on leading
        self.worker = self.metrics = None
        if metrics:
            self.worker = Worker(self.raft, self.clock, "node-1", sandbox=None, slots=0)
            self.metrics = NodeMetrics(self.raft, self.trigger, self.worker)
            self.trigger.lag_observer = self.metrics.observe_fire_lags
        self.app = make_app(self.service, TOKEN, trigger=self.trigger, worker=self.worker, metrics=self.metrics)


def run(coro_fn, **env_kw):
    async def main():
        env = Env(**env_kw)
        # Every request needs a token, reads included: the client sends the bootstrap token.
        async with TestClient(TestServer(env.app, host="127.0.0.1"), headers=AUTH) as client:
            await coro_fn(env, client)
    asyncio.run(main())


async def put(client, name, spec=SPEC, headers=AUTH):
    return await client.put(f"/v1/jobs/{name}", data=json.dumps(spec), headers=headers)


async def err(resp, status, code, field="__any__"):
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["error"]["code"] == code, body
    assert "message" in body["error"] and body["error"]["message"]
    if field != "__any__":
        assert body["error"]["field"] == field, body
    return body


def test_put_get_list_delete_job():
    async def t(env, c):
        r = await put(c, "a")
        assert r.status == 201
        assert (await r.json())["next_slot"].endswith("Z")
        r = await put(c, "a")
        assert r.status == 200, "a replace is 200"
        r = await c.get("/v1/jobs/a")
        body = await r.json()
        assert body["spec"]["misfire"]["policy"] == "fire_all"
        assert body["state"]["next_slot"] is not None
        r = await c.get("/v1/jobs")
        assert [j["name"] for j in (await r.json())["jobs"]] == ["a"]
        r = await c.delete("/v1/jobs/a", headers=AUTH)
        assert r.status == 200
        await err(await c.get("/v1/jobs/a"), 404, "not_found")
        await err(await c.delete("/v1/jobs/a", headers=AUTH), 404, "not_found")
    run(t)


def test_runs_appear_after_trigger_tick_with_lag_and_history():
    async def t(env, c):
        await put(c, "a")
        env.clock.advance(35_000)
        assert await env.trigger.tick() == 1
        r = await c.get("/v1/jobs/a/runs")
        runs = (await r.json())["runs"]
        assert [x["state"] for x in runs] == ["queued"] * 3
        assert runs[0]["slot"] > runs[-1]["slot"], "newest first"
        assert all(x["fire_lag_ms"] >= 0 for x in runs)
        r = await c.get("/v1/runs?state=queued")
        assert len((await r.json())["runs"]) == 3
        r = await c.get("/v1/runs/" + runs[0]["id"])
        assert (await r.json())["id"] == runs[0]["id"]
        job = await (await c.get("/v1/jobs/a")).json()
        assert job["state"]["runs_fired"] == 3
        assert job["state"]["fire_lag_ms"]["max"] >= 5000
    run(t)


def test_a_run_fired_ahead_of_its_slot_shows_no_negative_lag():
    """A run the leader committed ahead of its slot (docs/design.md, "Firing ahead") has
    ``fired_at`` before ``slot``: its view's fire_lag_ms is 0, as the job's state counts it
    (docs/api.md), not minus the time it was early."""
    async def t(env, c):
        await put(c, "a")
        nxt = (await (await c.get("/v1/jobs/a")).json())["state"]["next_slot"]
        env.clock.advance(10_000 - 600)  # 0.6 s before the first slot (every_s 10 from the put)
        assert await env.trigger.tick() == 1
        runs = (await (await c.get("/v1/jobs/a/runs")).json())["runs"]
        assert len(runs) == 1 and runs[0]["slot"] == nxt and runs[0]["fired_at"] < runs[0]["slot"], runs
        assert runs[0]["fire_lag_ms"] == 0, runs[0]
        one = await (await c.get("/v1/runs/" + runs[0]["id"])).json()
        assert one["fire_lag_ms"] == 0, one
        job = await (await c.get("/v1/jobs/a")).json()
        assert job["state"]["fire_lag_ms"] == {"last": 0, "max": 0, "mean": 0.0}, job["state"]
    run(t)


def test_did_my_slot_run_and_if_not_why():
    async def t(env, c):
        await put(c, "s", dict(SPEC, misfire={"policy": "skip", "grace_s": 1}))
        env.clock.advance(95_000)  # nine slots due, the last 5 s late: all missed
        await env.trigger.tick()
        runs = (await (await c.get("/v1/jobs/s/runs")).json())["runs"]
        rec = [r for r in runs if r["state"] == "skipped"]
        assert len(rec) == 1 and rec[0]["reason"] == "misfire" and rec[0]["count"] == 9
        slot = rec[0]["slot"]
        found = (await (await c.get(f"/v1/jobs/s/runs?slot={slot}")).json())["runs"]
        assert found and found[0]["state"] == "skipped"
        # An instant inside the range that is no slot of the schedule: the range is listed, and
        # why says it is no slot (a walk read it as "your run at that instant was skipped").
        from raftsched.core.schedule import iso as iso_of
        inside = rec[0]["slot_ms"] + 10_000 + 3_000
        body = await (await c.get(f"/v1/jobs/s/runs?slot={iso_of(inside)}")).json()
        assert body["runs"] and "no slot of the job's schedule falls at that instant" in body["why"], body
        assert "why" not in await (await c.get(f"/v1/jobs/s/runs?slot={iso_of(inside - 3_000)}")).json()
        # An offset's + unescaped reads as a space: the error says how to write it.
        got = await err(await c.get("/v1/jobs/s/runs?slot=2026-12-08T00:00:00+01:00"), 400, "bad_request", "slot")
        assert "write '2026-12-08T00:00:00%2B01:00'" in got["error"]["message"], got
        got = await err(await c.get("/v1/jobs/s/runs?slot=yesterday"), 400, "bad_request", "slot")
        assert "%2B" not in got["error"]["message"], got
    run(t)


def test_pause_resume_trigger():
    async def t(env, c):
        await put(c, "p")
        assert (await c.post("/v1/jobs/p/pause", headers=AUTH)).status == 200
        env.clock.advance(30_000)
        assert await env.trigger.tick() == 0, "a paused job does not fire"
        assert (await c.post("/v1/jobs/p/resume", headers=AUTH)).status == 200
        runs = (await (await c.get("/v1/jobs/p/runs")).json())["runs"]
        assert runs and runs[0]["state"] == "skipped" and runs[0]["reason"] == "paused"
        r = await c.post("/v1/jobs/p/trigger", headers=AUTH)
        assert r.status == 201
        assert "manual" in (await r.json())["run"]
    run(t)


def test_a_route_that_takes_no_body_refuses_one_rather_than_ignore_it():
    """A resume sent {"catch_up": true} resumed without catching up (the missed slots recorded
    skipped for good), and a misspelt explain field was ignored: a body such a route does not
    take is refused, naming the field (and saying when it is a query parameter), and changes
    nothing; none, an empty one or {} is served as before."""
    async def t(env, c):
        await put(c, "p")
        await put(c, "q")
        assert (await c.post("/v1/jobs/p/pause", headers=AUTH)).status == 200
        body = await err(await c.post("/v1/jobs/p/resume", json={"catch_up": True}, headers=AUTH),
                         422, "invalid", "catch_up")
        assert "query parameter" in body["error"]["message"], body
        assert env.state.jobs["p"]["paused"], "refused, so still paused"
        await err(await c.post("/v1/jobs/q/pause", json={"bogus": 1}, headers=AUTH), 422, "invalid", "bogus")
        await err(await c.delete("/v1/jobs/q", data=b"[1]", headers=AUTH), 400, "bad_request")
        await err(await c.delete("/v1/jobs/q", data=b"not json", headers=AUTH), 400, "bad_request")
        assert not env.state.jobs["q"]["paused"] and "q" in env.state.jobs
        for data in (b"", b"  ", b"{}", b" { } "):
            assert (await c.post("/v1/jobs/q/pause", data=data, headers=AUTH)).status == 200, data
            assert (await c.post("/v1/jobs/q/resume", data=data, headers=AUTH)).status == 200, data
        assert (await c.post("/v1/jobs/p/resume?catch_up=true", headers=AUTH)).status == 200
        await err(await c.post("/v1/jobs/p/explain", json={"down_fro": "2026-01-01T00:00:00Z",
                                                           "down_to": "2026-01-01T01:00:00Z"}, headers=AUTH),
                  400, "bad_request", "down_fro")
    run(t)


def test_a_start_at_still_ahead_corrected_by_a_replace_does_not_hold_the_new_schedule_back():
    """A start_at a year ahead (a typo), corrected by a PUT to one a minute ahead: the job's cursor
    was start_at - 1, where the old grid begins, and a replace with another schedule never
    moves a cursor back, so the corrected job was silent until the typo's date, its slots neither
    run nor recorded. A cursor that marks no slot handled counts up to now only."""
    from datetime import datetime, timezone

    def iso(ms):
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    async def t(env, c):
        now = env.clock.now_ms()
        near, far = now - now % 1000 + 60_000, now - now % 1000 + 365 * 86_400_000
        spec = dict(SPEC, schedule={"every_s": 60, "start_at": iso(far)})
        assert (await (await put(c, "typo", spec)).json())["next_slot"] == iso(far).replace(".000Z", "Z")
        spec = dict(SPEC, schedule={"every_s": 60, "start_at": iso(near)})
        assert (await (await put(c, "typo", spec)).json())["next_slot"] == iso(near).replace(".000Z", "Z")
        env.clock.advance(near - now)
        await env.trigger.tick()
        assert f"typo@{near}" in env.state.runs, "the corrected slot fired"
        # the same from a start_at still ahead to a cron schedule
        spec = dict(SPEC, schedule={"every_s": 60, "start_at": iso(far)})
        await put(c, "typo2", spec)
        body = await (await put(c, "typo2", dict(SPEC, schedule={"cron": "* * * * *"}))).json()
        assert body["next_slot"] <= iso(near + 60_000).replace(".000Z", "Z"), body
        # a start_at that fired keeps its cursor: a replace never re-fires a slot it handled
        await put(c, "fired", dict(SPEC, schedule={"every_s": 60, "start_at": iso(near - 120_000)}))
        env.clock.advance(1)
        await env.trigger.tick()
        cursor = env.state.jobs["fired"]["cursor"]
        await put(c, "fired", dict(SPEC, schedule={"every_s": 30}))
        assert env.state.jobs["fired"]["cursor"] >= cursor
    run(t)


def test_a_ping_up_to_2_s_before_its_slot_waits_for_the_slot_to_be_committed():
    """The first slot of an entry is committed at most fire_ahead_ms (1 s) ahead, so a start ping
    1.5 s early (a reporter whose clock runs ahead of the cluster's) was a 409, though a ping up
    to 2 s before a slot is documented as that slot's. The node waits for the slot's fire."""
    hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
          "deadline": {"start_within_s": 30}}

    async def t(env, c):
        assert (await put(c, "hb", hb)).status == 201
        slot = env.state.jobs["hb"]["next"]
        env.clock.advance(slot - 1500 - env.clock.now_ms())
        await env.trigger.tick()
        assert f"hb@{slot}" not in env.state.runs, "not committed 1.5 s ahead"
        ping = asyncio.ensure_future(c.post("/v1/jobs/hb/ping", json={"status": "start"}, headers=AUTH))
        await asyncio.sleep(0.1)  # ok-sleep: the ping waits at the node meanwhile
        assert not ping.done()
        env.clock.advance(600)
        await env.trigger.tick()  # 0.9 s ahead: committed
        r = await asyncio.wait_for(ping, 5)
        assert r.status == 200, await r.text()
        assert (await r.json())["run"] == f"hb@{slot}" and env.state.runs[f"hb@{slot}"]["state"] == "running"
    run(t)


def test_the_readmes_heartbeat_example_pings_a_slot_opened_by_hand():
    """README "Deadlines": a trigger without a body opens a slot, then a start ping and a success
    ping move it. Both pings were 404 (the node proposed the slot it resolved, and apply looked
    it up as NAME@SLOT; the run is NAME@SLOT!manual-N)."""
    hb = dict(SPEC, schedule={"cron": "0 2 * * *"}, executor={"type": "heartbeat"},
              deadline={"start_within_s": 600})

    async def t(env, c):
        assert (await put(c, "backup", hb)).status == 201
        r = await c.post("/v1/jobs/backup/trigger", headers=AUTH)
        opened = await r.json()
        assert r.status == 201 and opened["state"] == "waiting", opened
        r = await c.post("/v1/jobs/backup/ping", json={"status": "start"}, headers=AUTH)
        assert r.status == 200 and (await r.json())["run"] == opened["run"], await r.text()
        r = await c.post("/v1/jobs/backup/ping", headers=AUTH)
        assert r.status == 200, await r.text()
        assert env.state.runs[opened["run"]]["state"] == "succeeded"
    run(t)


def test_a_ping_naming_a_slot_without_a_run_says_the_slot_as_it_was_sent():
    """A user's walk: a ping naming a slot (ISO) with no run answered 404 naming it in ms. It is
    said as an ISO time; and a ping sent twice is 409 (the slot at hand ended), not an older slot."""
    hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"}}

    async def t(env, c):
        from raftsched.core.schedule import iso
        assert (await put(c, "hb", hb)).status == 201
        slot = env.state.jobs["hb"]["next"]
        r = await c.post("/v1/jobs/hb/ping", json={"slot": iso(slot + 1000)}, headers=AUTH)
        body = await r.json()
        assert r.status == 404 and body["error"]["field"] == "slot", body
        assert iso(slot + 1000) in body["error"]["message"] and str(slot + 1000) not in body["error"]["message"], body
        env.clock.advance(slot + 500 - env.clock.now_ms())
        await env.trigger.tick()
        assert (await c.post("/v1/jobs/hb/ping", headers=AUTH)).status == 200
        r = await c.post("/v1/jobs/hb/ping", headers=AUTH)
        assert r.status == 409 and "ended already" in (await r.json())["error"]["message"]
    run(t)


def test_a_retried_end_ping_gets_its_first_answer():
    """A walk: a success or fail ping retried with its Idempotency-Key (curl --retry after a lost
    answer) was 409 "ended already" (the node's look for the slot found it ended, before the
    request log), where a retried start got the first answer. Both get it now; a second ping
    without the key is still 409."""
    hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"}}

    async def t(env, c):
        assert (await put(c, "hb", hb)).status == 201
        slot = env.state.jobs["hb"]["next"]
        env.clock.advance(slot + 500 - env.clock.now_ms())
        await env.trigger.tick()
        for status, key in (("start", "k-start"), ("fail", "k-fail")):
            headers = dict(AUTH, **{"Idempotency-Key": key})
            first = await c.post("/v1/jobs/hb/ping", json={"status": status}, headers=headers)
            body = await first.json()
            assert first.status == 200, body
            again = await c.post("/v1/jobs/hb/ping", json={"status": status}, headers=headers)
            assert again.status == 200 and await again.json() == dict(body, duplicate=True), await again.text()
        assert env.state.runs[f"hb@{slot}"]["state"] in ("failed", "dead")
        r = await c.post("/v1/jobs/hb/ping", json={"status": "fail"}, headers=AUTH)
        assert r.status == 409 and "ended already" in (await r.json())["error"]["message"]
    run(t)


def test_a_gated_child_of_a_triggered_job_is_held_to_the_slots_that_job_runs_at():
    """A walk: a gated child (schedule + after) of a triggered job (no schedule: it runs at its
    own parents' slots) was never checked, and each of its slots waited a day for a run the
    triggered job could never have. It is held to the scheduled jobs the triggered one takes its
    slots from (through any depth), by PUT and by batch, and so is a triggered job's change of
    parents that would part it from its gated children."""
    from raftsched.core.schedule import iso as schedule_iso
    ext = dict(SPEC, schedule={"every_s": 60})

    def trig(*after):
        return {"executor": SPEC["executor"], "after": list(after)}

    async def t(env, c):
        assert (await put(c, "extract", ext)).status == 201
        assert (await put(c, "transform", trig("extract"))).status == 201
        assert (await put(c, "load", trig("transform"))).status == 201
        env.clock.advance(1500)  # (a child made now: its grid is not extract's)
        body = await err(await put(c, "report", dict(ext, after=["load"])), 422, "invalid", "after[0].job")
        msg = body["error"]["message"]
        assert "never meet those of load" in msg and "runs at the slots of extract" in msg, msg
        assert "report" not in env.state.jobs
        # made on extract's grid: accepted; a second scheduled source of load that parts them: refused
        start = schedule_iso(env.state.jobs["extract"]["anchor"])
        aligned = dict(ext, schedule={"every_s": 60, "start_at": start}, after=["load"])
        r = await put(c, "report", aligned)
        assert r.status == 201, await r.text()
        assert (await put(c, "other", dict(SPEC, schedule={"every_s": 60}))).status == 201  # (another grid)
        body = await err(await put(c, "load", trig("transform", "other")), 422, "invalid", "after[1].job")
        assert "report waits slot by slot for this job" in body["error"]["message"], body
        assert [e["job"] for e in env.state.jobs["load"]["spec"]["after"]] == ["transform"], "refused: unchanged"
        # a batch: the same check, the triggered job and the child in one request
        env.clock.advance(1500)
        r = await c.post("/v1/jobs:batch", json={"jobs": {
            "t2": trig("extract"), "r2": dict(ext, after=["t2"])}}, headers=AUTH)
        body = await err(r, 422, "invalid", "after[0].job")
        assert body["error"]["job"] == "r2" and "runs at the slots of extract" in body["error"]["message"], body
        # match latest is not held to slots
        assert (await put(c, "r3", dict(ext, after=["load"], match="latest"))).status == 201
        # A scheduled job made triggered, its parents as they were: it runs at their slots now,
        # and a gated child on its own grid would never meet them (a review: passed unchecked).
        # p2 every 120 s, mid every 60 s on its grid, kid every 120 s between p2's slots: kid meets
        # mid, and mid's every other slot is p2's; made triggered, mid runs at p2's slots only.
        a = env.state.jobs["extract"]["anchor"]
        assert (await put(c, "p2", dict(ext, schedule={"every_s": 120, "start_at": schedule_iso(a)}))).status == 201
        assert (await put(c, "mid", dict(ext, schedule={"every_s": 60, "start_at": schedule_iso(a)},
                                         after=["p2"]))).status == 201
        r = await put(c, "kid", dict(ext, schedule={"every_s": 120, "start_at": schedule_iso(a + 60_000)}, after=["mid"]))
        assert r.status == 201, await r.text()
        await err(await put(c, "mid", trig("p2")), 422, "invalid", "after[0].job")
    run(t)


def test_a_run_by_hand_of_a_pipeline_child_warns_it_has_no_upstream():
    """A walk: `raftsched trigger load` (a job that runs after others) made a run whose handler
    read ctx.upstream as None and died with a TypeError; nothing said so. The answer warns, with
    or without a slot; a job without parents gets no warning."""
    async def t(env, c):
        assert (await put(c, "extract", SPEC)).status == 201
        assert (await put(c, "load", {"executor": SPEC["executor"], "after": ["extract"]})).status == 201
        for body in (None, {"payload": {"x": 1}}):
            r = await c.post("/v1/jobs/load/trigger", headers=AUTH, **({} if body is None else {"json": body}))
            got = await r.json()
            assert r.status == 201, got
            (w,) = got["warnings"]
            assert "load runs after extract" in w and "ctx.upstream is None" in w, w
        r = await c.post("/v1/jobs/extract/trigger", headers=AUTH)
        assert r.status == 201 and "warnings" not in await r.json()
    run(t)


def test_a_slots_runs_of_a_job_of_no_pipeline_have_no_pipeline_section():
    """A walk: a job of no pipeline whose slot was recorded skipped, then run by hand for that
    slot, answered ?slot= with a "pipeline" of its own two entries (docs/api.md: only for a job
    of a pipeline), and the CLI printed a second, very wide table."""
    from raftsched.core.schedule import iso

    async def t(env, c):
        assert (await put(c, "solo", dict(SPEC, schedule={"every_s": 60},
                                          misfire={"policy": "skip", "grace_s": 0}))).status == 201
        slot = env.state.jobs["solo"]["next"]
        env.clock.advance(slot + 5000 - env.clock.now_ms())
        await env.trigger.tick()  # (5 s late: recorded skipped)
        r = await c.post("/v1/jobs/solo/trigger", json={"slot": iso(slot)}, headers=AUTH)
        assert r.status == 201, await r.text()
        body = await (await c.get(f"/v1/jobs/solo/runs?slot={iso(slot)}", headers=AUTH)).json()
        assert len(body["runs"]) == 2 and "pipeline" not in body, body
    run(t)


def test_an_empty_answer_for_a_slot_says_why():
    """A walk: "did my 02:00 run happen" answered [] for a slot before the job existed, one not
    due yet, and one whose entry the history bound dropped alike, and the CLI printed an empty
    table: the reader had to work out which. `why` says it."""
    from raftsched.core import limits
    from raftsched.core.schedule import iso

    async def t(env, c):
        # (its slots recorded skipped, 5 s late: finished entries, which the history bound drops)
        spec = dict(SPEC, schedule={"every_s": 60}, history=2, misfire={"policy": "skip", "grace_s": 0})
        assert (await put(c, "h", spec)).status == 201
        made = env.state.jobs["h"]["created"]
        first = env.state.jobs["h"]["next"]

        async def why(ms):
            body = await (await c.get(f"/v1/jobs/h/runs?slot={iso(ms)}", headers=AUTH)).json()
            assert body["runs"] == [], body
            return body["why"]
        assert "made at" in await why(made - 3_600_000)
        assert "not fired yet" in await why(first + 60_000)
        assert (await why(first + 1000)).startswith("no slot of the job's schedule")
        for k in range(limits.history_trim_scan_slack + 4):  # (a history is trimmed by so many at once)
            env.clock.advance(first + k * 60_000 + 5000 - env.clock.now_ms())
            await env.trigger.tick()
        assert "dropped by the history bound" in await why(first)
        assert (await c.post("/v1/jobs/h/pause", headers=AUTH)).status == 200
        assert "paused" in await why(first + (limits.history_trim_scan_slack + 10) * 60_000)
        newest = first + (limits.history_trim_scan_slack + 3) * 60_000
        body = await (await c.get(f"/v1/jobs/h/runs?slot={iso(newest)}", headers=AUTH)).json()
        assert body["runs"] and "why" not in body
    run(t)


def test_a_gated_child_whose_slots_never_meet_its_parents_is_refused_naming_the_edge():
    """A gated child (schedule + after, match same_slot) made a second after its parent, both
    every 3 s, never shared a slot with it (each interval grid is anchored where its job was
    made): the PUT was accepted and every slot recorded upstream_timeout, a day later by
    default. Refused now, as the child and as a parent whose new schedule would part them; the
    same start_at, a batch made at once, or match latest are accepted."""
    par = dict(SPEC, schedule={"every_s": 3})
    kid = dict(SPEC, schedule={"every_s": 3}, after=["par"])

    async def t(env, c):
        assert (await put(c, "par", par)).status == 201
        env.clock.advance(1500)
        body = await err(await put(c, "kid", kid), 422, "invalid", "after[0].job")
        assert "never meet" in body["error"]["message"] and "start_at" in body["error"]["message"]
        assert "kid" not in env.state.jobs
        assert (await put(c, "kid", dict(kid, match="latest"))).status == 201
        await err(await put(c, "kid2", dict(kid, jitter_s=1)), 422, "invalid", "after[0].job")
        # the same phase: accepted; then a parent's new interval would part them
        phased = {"every_s": 3, "start_at": "2030-01-01T00:00:00Z"}
        assert (await put(c, "p2", dict(SPEC, schedule=phased))).status == 201
        assert (await put(c, "k2", dict(SPEC, schedule=dict(phased, every_s=6), after=["p2"]))).status == 201
        await err(await put(c, "p2", dict(SPEC, schedule={"every_s": 3})), 422, "invalid", "schedule")
        assert env.state.jobs["p2"]["spec"]["schedule"].get("start_at") is not None, "refused: unchanged"
        # a batch makes them at one instant: aligned
        r = await c.post("/v1/jobs:batch", json={"jobs": {"bp": par, "bk": dict(kid, after=["bp"])}}, headers=AUTH)
        assert r.status in (200, 201), await r.text()
        env.clock.advance(1500)
        r = await c.post("/v1/jobs:batch", json={"jobs": {"bk2": dict(kid, after=["bp"])}}, headers=AUTH)
        body = await err(r, 422, "invalid", "after[0].job")
        assert body["error"]["job"] == "bk2"
        # a pair stored before the check does not block the edits that part neither of them
        from raftsched.core import pipelines
        real = pipelines.slots_never_meet
        pipelines.slots_never_meet = lambda *a: None
        env.clock.advance(1000)
        try:
            assert (await put(c, "old", dict(kid, after=["par"]))).status == 201
        finally:
            pipelines.slots_never_meet = real
        assert (env.state.jobs["old"]["anchor"] - env.state.jobs["par"]["anchor"]) % 3000, "misaligned"
        assert (await put(c, "old", dict(kid, after=["par"], description="edited"))).status == 200
        assert (await put(c, "par", dict(par, description="edited"))).status == 200
        env.clock.advance(1000)
        await err(await put(c, "par", dict(par, schedule={"every_s": 6})), 422, "invalid", "schedule")
    run(t)


def test_a_gated_pair_of_a_cron_and_an_interval_off_the_minute_is_refused():
    """A cron's slots are whole minutes (whole seconds with a seconds field); an interval job's
    are where it was made (rounded up to the second) plus its every_s: an hourly job made at
    hh:mm:07.250 beside "0 * * * *", child or parent, never met a slot and timed out every one.
    Refused either way; made on the minute, with a start_at on one, or with match latest,
    accepted; a seconds cron asks for a whole second only."""
    hourly = dict(SPEC, schedule={"every_s": 3600})
    cron = dict(SPEC, schedule={"cron": "0 * * * *"})

    async def t(env, c):
        env.clock.advance(60_000 - env.clock.now_ms() % 60_000 + 7250)  # hh:mm:07.250
        assert (await put(c, "ip", hourly)).status == 201
        body = await err(await put(c, "ck", dict(cron, after=["ip"])), 422, "invalid", "after[0].job")
        assert "whole minutes" in body["error"]["message"] and "start_at" in body["error"]["message"], body
        assert (await put(c, "ck", dict(cron, after=["ip"], match="latest"))).status == 201
        sec = dict(SPEC, schedule={"cron": "* * * * * *"})  # seconds first: every whole second
        assert (await put(c, "cs", dict(sec, after=["ip"]))).status == 201
        assert (await put(c, "cp", cron)).status == 201
        await err(await put(c, "ik", dict(hourly, after=["cp"])), 422, "invalid", "after[0].job")
        started = {"every_s": 3600, "start_at": "2031-01-01T00:00:00Z"}
        assert (await put(c, "ik", dict(SPEC, schedule=started, after=["cp"]))).status == 201
        # a parent's new schedule that would part it from a gated cron child: refused as the parent
        assert (await put(c, "ip2", dict(SPEC, schedule=started))).status == 201
        assert (await put(c, "ck2", dict(cron, after=["ip2"]))).status == 201
        await err(await put(c, "ip2", hourly), 422, "invalid", "schedule")
        env.clock.advance(3_600_000 - env.clock.now_ms() % 3_600_000)  # on the hour
        assert (await put(c, "ip3", hourly)).status == 201
        assert (await put(c, "ck3", dict(cron, after=["ip3"]))).status == 201
        # On the minute is not enough: the minutes of the hour must meet too (a walk: an hourly
        # parent at :00 and "30 * * * *", or "0 * * * *" in Asia/Kathmandu, at :15 UTC, were
        # accepted, every slot to time out a day later).
        for sched in ({"cron": "30 * * * *"}, {"cron": "0 * * * *", "timezone": "Asia/Kathmandu"}):
            body = await err(await put(c, "ck4", dict(SPEC, schedule=sched, after=["ip3"])), 422, "invalid",
                             "after[0].job")
            assert "the interval job on minute(s) :00:" in body["error"]["message"], body
        for sched in ({"cron": "*/15 * * * *"}, {"cron": "30 * * * *", "timezone": "Australia/Lord_Howe"},
                      {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}):
            assert (await put(c, "ck5", dict(SPEC, schedule=sched, after=["ip3"]))).status in (200, 201), sched
        env.clock.advance(37 * 60_000)  # an hourly job made at :37: no "0 * * * *" slot is one of its
        assert (await put(c, "ip4", hourly)).status == 201
        await err(await put(c, "ck6", dict(cron, after=["ip4"])), 422, "invalid", "after[0].job")
        assert (await put(c, "ip5", dict(SPEC, schedule={"every_s": 900}))).status == 201  # :37, :52, :07, :22
        await err(await put(c, "ck7", dict(SPEC, schedule={"cron": "0,30 * * * *"}, after=["ip5"])), 422,
                  "invalid", "after[0].job")
        assert (await put(c, "ck8", dict(SPEC, schedule={"cron": "7 * * * *"}, after=["ip5"]))).status == 201
    run(t)


def test_malformed_json_is_400():
    async def t(env, c):
        r = await c.put("/v1/jobs/a", data=b"{not json", headers=AUTH)
        await err(r, 400, "bad_request")
        r = await c.put("/v1/jobs/a", data=b"", headers=AUTH)
        await err(r, 400, "bad_request")
        r = await c.put("/v1/jobs/a", data=b"\xff\xfe", headers=AUTH)
        await err(r, 400, "bad_request")
    run(t)


def test_a_body_naming_a_key_twice_is_refused_and_changes_nothing():
    """JSON leaves a key named twice in one object to the reader (Python's keeps the last, other
    parsers the first): a spec whose schedule a client's tooling reads as hourly and the node as
    every minute is refused, naming the key, at any depth, and no job is written."""
    async def t(env, c):
        body = json.dumps(SPEC)[:-1] + ', "priority": 1, "priority": 9}'
        got = await err(await c.put("/v1/jobs/a", data=body.encode(), headers=AUTH), 400, "bad_request", "priority")
        assert "twice" in got["error"]["message"], got
        inner = json.dumps(dict(SPEC, schedule={"cron": "0 * * * *"})).replace(
            '{"cron": "0 * * * *"}', '{"cron": "0 * * * *", "cron": "* * * * *"}')
        # Named by its path, as every other field (a walk read "every_s" for schedule.every_s).
        await err(await c.put("/v1/jobs/a", data=inner.encode(), headers=AUTH), 400, "bad_request", "schedule.cron")
        deep = json.dumps(dict(SPEC, payload={"steps": [{"k": 1}, {"a": 1}]})).replace('{"a": 1}', '{"a": 1, "a": 2}')
        got = await err(await c.put("/v1/jobs/a", data=deep.encode(), headers=AUTH), 400, "bad_request",
                        "payload.steps[1].a")
        assert "the key 'a' appears twice" in got["error"]["message"], got
        # Malformed past the key: the first read's error stands (the key, unnamed by path).
        await err(await c.put("/v1/jobs/a", data=(inner[:-1] + ', "x": [}').encode(), headers=AUTH), 400,
                  "bad_request", "cron")
        assert (await c.get("/v1/jobs/a", headers=AUTH)).status == 404
        # The same key in two objects is not a duplicate.
        ok = json.dumps(dict(SPEC, payload={"priority": 1}))
        assert (await c.put("/v1/jobs/a", data=ok.encode(), headers=AUTH)).status in (200, 201)
    run(t)


@pytest.mark.parametrize("spec,field", [
    ({k: v for k, v in SPEC.items() if k != "misfire"}, "misfire"),
    (dict(SPEC, misfire={"policy": "sometimes"}), "misfire.policy"),
    (dict(SPEC, schedule={"cron": "61 * * * *"}), "schedule.cron"),
    (dict(SPEC, schedule={"cron": "0 * * * *", "timezone": "Mars/Olympus"}), "schedule.timezone"),
    (dict(SPEC, schedule={"every_s": 0}), "schedule.every_s"),
    (dict(SPEC, executor={"type": "ftp"}), "executor.type"),
    (dict(SPEC, priority=11), "priority"),
    (dict(SPEC, surprise=1), "surprise"),
    ([1, 2], None),
])
def test_invalid_spec_is_422_naming_the_field(spec, field):
    async def t(env, c):
        before = env.state.snapshot()
        body = await err(await put(c, "a", spec), 422, "invalid", field)
        assert env.state.snapshot() == before, "a refused request changes nothing"
        if field == "misfire":
            assert "fire_all" in body["error"]["message"] and "skip" in body["error"]["message"]
    run(t)


def test_bad_names_and_params():
    async def t(env, c):
        await err(await put(c, "bad name!"), 422, "invalid", "name")
        await err(await c.get("/v1/jobs?limit=abc"), 400, "bad_request", "limit")
        await err(await c.get("/v1/jobs?limit=0"), 400, "bad_request", "limit")
        await err(await c.get("/v1/runs?state=exploded"), 400, "bad_request", "state")
        await put(c, "a")
        await err(await c.get("/v1/jobs/a/runs?slot=yesterday"), 400, "bad_request", "slot")
        await err(await c.get("/v1/jobs/a?consistent=maybe"), 400, "bad_request", "consistent")
        await err(await c.get("/v1/nowhere"), 404, "not_found")
        await err(await c.post("/v1/jobs", headers=AUTH), 405, "method_not_allowed")
        r = await c.put("/v1/jobs/a", data=b"[" + b"1," * 40000 + b"1]", headers=AUTH)
        await err(r, 413, "too_large")
    run(t)


async def anon(c, method, path, headers=None, **kw):
    """A request without the client's default token (``headers`` instead)."""
    async with aiohttp.ClientSession() as s:
        async with s.request(method, c.make_url(path), headers=headers or {}, **kw) as r:
            return r.status, await r.json()


def test_every_request_needs_the_token_reads_included():
    async def t(env, c):
        for method, path in (("PUT", "/v1/jobs/a"), ("POST", "/v1/jobs/a/pause"), ("GET", "/v1/jobs"),
                             ("GET", "/v1/jobs/a"), ("POST", "/v1/preview"), ("GET", "/v1/nowhere")):
            for h in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
                status, body = await anon(c, method, path, h, data=json.dumps(SPEC))
                assert status == 401 and body["error"]["code"] == "unauthorized", (method, path, h, body)
        assert "a" not in env.state.jobs
        status, _ = await anon(c, "GET", "/healthz")
        assert status == 200, "/healthz needs no token"
    run(t)


def test_no_leader_is_503_with_retry_after():
    async def t(env, c):
        env.raft.fail = "unavailable"
        r = await put(c, "a")
        await err(r, 503, "unavailable")
        assert r.headers["Retry-After"] == "1"
        await err(await c.get("/v1/jobs?consistent=true"), 503, "unavailable")
    run(t)


def test_unknown_outcome_is_504_and_retry_with_same_key_is_safe():
    async def t(env, c):
        await put(c, "a")
        env.raft.fail = "indeterminate_applied"  # applied, but the caller hears a timeout
        h = dict(AUTH, **{"Idempotency-Key": "req-2"})
        await err(await c.post("/v1/jobs/a/trigger", headers=h), 504, "indeterminate")
        env.raft.fail = None
        r = await c.post("/v1/jobs/a/trigger", headers=h)
        assert r.status == 201
        manual = [x for x in env.state.runs.values() if x["kind"] == "manual"]
        assert len(manual) == 1, "the retried request did not act twice"
        await err(await c.post("/v1/jobs/a/trigger", headers=dict(AUTH, **{"Idempotency-Key": "x" * 65})), 400, "bad_request")
    run(t)


def test_a_key_sent_again_replays_and_a_key_reused_for_another_request_is_409_naming_it():
    """docs/api.md, "Idempotent requests": the same request under the same key gets the first
    answer with ``"duplicate": true``; a different request under it is a 409 that leads with
    the key the client sent (not only the request id the node hashed it into), changing nothing."""
    async def t(env, c):
        await put(c, "a")
        await put(c, "b")
        h = dict(AUTH, **{"Idempotency-Key": "my-key-1"})
        r = await c.post("/v1/jobs/a/trigger", headers=h)
        assert r.status == 201, await r.text()
        first = await r.json()
        r = await c.post("/v1/jobs/a/trigger", headers=h)
        again = await r.json()
        assert r.status == 201 and again.pop("duplicate") is True and again == first, (first, again)
        runs = len(env.state.runs)
        body = await err(await c.post("/v1/jobs/b/trigger", headers=h), 409, "conflict", field="Idempotency-Key")
        msg = body["error"]["message"]
        assert msg.startswith("Idempotency-Key 'my-key-1' "), msg
        assert "different request" in msg and "trigger_job:a" in msg, msg
        assert len(env.state.runs) == runs
        # X-Request-Id is a proxy's correlation id, passed on to every call made for one incoming
        # request: two triggers carrying it are two triggers, and other mutations go through.
        h = dict(AUTH, **{"X-Request-Id": "mesh-trace-2"})
        runs = len(env.state.runs)
        one = await c.post("/v1/jobs/a/trigger", headers=h)
        two = await c.post("/v1/jobs/a/trigger", headers=h)
        assert one.status == two.status == 201, (await one.text(), await two.text())
        assert "duplicate" not in await two.json() and (await one.json())["run"] != (await two.json())["run"]
        assert (await c.post("/v1/jobs/b/trigger", headers=h)).status == 201
        assert len(env.state.runs) == runs + 3
    run(t)


def test_the_get_job_example_of_docs_api_md_has_the_fields_the_answer_has():
    """docs/api.md's ``GET /v1/jobs/{name}`` example shows every field of the answer (it lacked
    ``health``), at the top, in ``state`` and in ``health``."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    section = text.split("### GET /v1/jobs/{name}\n", 1)[1]
    doc = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))

    async def t(env, c):
        spec = dict(doc["spec"], executor={"type": "shell", "argv": ["true"]})
        assert (await put(c, doc["name"], spec)).status == 201
        assert (await c.post(f"/v1/jobs/{doc['name']}/trigger")).status == 201
        got = await (await c.get(f"/v1/jobs/{doc['name']}")).json()
        assert set(got) == set(doc), (set(got) ^ set(doc))
        for part in ("spec", "state", "health"):
            assert set(got[part]) == set(doc[part]), (part, set(got[part]) ^ set(doc[part]))
        assert set(got["state"]["last_run"]) == set(doc["state"]["last_run"])
        assert set(got["state"]["fire_lag_ms"]) == set(doc["state"]["fire_lag_ms"])
    run(t)


def test_a_job_runs_limit_out_of_bounds_names_the_documented_bound_and_why():
    """GET /v1/jobs/{name}/runs?limit=: 1 to node limits.job_runs_page_max (a job's kept history
    plus a queue's queued runs), the bound docs/api.md states; the 400 says what it is."""
    import pathlib
    import re

    from raftsched.core import limits

    hi = limits.history_per_job_max + limits.queue_depth_max
    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    section = text.split("### GET /v1/jobs/{name}/runs\n", 1)[1].split("\n### ", 1)[0]
    documented = re.search(r"- `limit`: 1-([0-9 ]+), default 100", section)
    assert documented is not None and int(documented.group(1).replace(" ", "")) == hi

    async def t(env, c):
        await put(c, "a")
        for bad in ("0", str(hi + 1), "x"):
            body = await err(await c.get(f"/v1/jobs/a/runs?limit={bad}"), 400, "bad_request", "limit")
            msg = body["error"]["message"]
            assert f"between 1 and {hi} (a job's whole history: at most {limits.history_per_job_max} kept" in msg, msg
        assert (await c.get(f"/v1/jobs/a/runs?limit={hi}")).status == 200
    run(t)


def test_an_integer_too_long_to_read_is_a_400_naming_the_number_and_its_field():
    """An integer of more digits than Python reads (4300) was a 400 quoting the interpreter's
    advice (sys.set_int_max_str_digits()): it says the number is too large, and where."""
    huge = "9" * 5000

    async def t(env, c):
        spec = json.dumps(dict(SPEC, payload={"n": [1, 2]})).replace("2]", huge + "]")
        body = await err(await c.put("/v1/jobs/a", data=spec), 400, "bad_request", "payload.n[1]")
        msg = body["error"]["message"]
        assert "too large" in msg and "5000 digits" in msg and "sys." not in msg, msg
        assert "a" not in env.state.jobs
        await put(c, "a")
        for path, data, field in [
                ("/v1/jobs/a/trigger", '{"payload": -%s}' % huge, "payload"),
                ("/v1/jobs/a/trigger", huge, None),
                ("/v1/jobs/a/trigger", '{"payload": %s, ' % huge, None),  # malformed after it too
                ("/v1/workers/w1/complete", '{"results": [{"run": "a@1", "token": %s}]}' % huge, "results[0].token")]:
            body = await err(await c.post(path, data=data), 400, "bad_request", field)
            msg = body["error"]["message"]
            assert "too large" in msg and "sys." not in msg and "digits" in msg, (path, msg)
        assert not env.state.runs
    run(t)


def test_explain_says_which_runs_the_overlap_policy_then_records_skipped_as_docs_api_md_says():
    """docs/api.md, explain: each run it lists says what the overlap policy makes of it. A fire_all
    + forbid job's outage: the fire makes the first slot a run and records the rest skipped,
    reason overlap, and explain says so (it listed six runs, and nothing of the policy)."""
    from raftsched.core import schedule

    async def t(env, c):
        spec = dict(SPEC, overlap={"policy": "forbid"}, misfire={"policy": "fire_all", "grace_s": 0})
        assert (await put(c, "f", spec)).status == 201
        await env.trigger.tick()
        down_from = env.clock.now_ms()
        env.clock.advance(65_000)
        now = env.clock.now_ms()
        r = await c.post("/v1/jobs/f/explain", data=json.dumps({"down_from": schedule.iso(down_from),
                                                                 "down_to": schedule.iso(now)}))
        predicted = await r.json()
        assert r.status == 200 and len(predicted["runs"]) == 6 and predicted["recorded"] == [], predicted
        assert predicted["overlap"]["policy"] == "forbid" and predicted["overlap"]["runs"] == 1
        assert "assumes" in predicted["overlap"]
        fates = {x["slot"]: x["overlap"] and (x["overlap"]["state"], x["overlap"]["reason"]) for x in predicted["runs"]}
        await env.trigger.tick()
        runs = (await (await c.get("/v1/jobs/f/runs")).json())["runs"]
        assert sorted((x["state"], x.get("reason")) for x in runs) == [("queued", None)] + [("skipped", "overlap")] * 5
        assert {x["slot"]: None if x["state"] == "queued" else (x["state"], x["reason"]) for x in runs} == fates
    run(t)


def test_create_only_conflict_is_409():
    async def t(env, c):
        assert (await put(c, "a")).status == 201
        r = await put(c, "a", headers=dict(AUTH, **{"If-None-Match": "*"}))
        await err(r, 409, "conflict")
    run(t)


def test_cluster_and_healthz():
    async def t(env, c):
        body = await (await c.get("/v1/cluster")).json()
        for k in ("node", "role", "leader", "term", "commit_index", "members", "pid"):
            assert k in body
        assert body["role"] == "leader"
        assert (await c.get("/healthz")).status == 200
        env.raft.leader = False
        assert (await c.get("/healthz")).status == 503
    run(t)


def test_healthz_of_a_node_that_is_no_member_is_503_and_says_so():
    """A node removed from the members while it still runs saw the leader and answered /healthz
    200 (its reads all 503): a load balancer kept sending it requests."""
    async def t(env, c):
        status = env.raft.status

        def removed():
            st = status()
            return dict(st, role="follower", membership=dict(st["membership"], self="none"))
        env.raft.status = removed
        r = await c.get("/healthz")
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert await r.json() == {"ok": False, "role": "follower", "leader": "127.0.0.1:1", "member": False}
    run(t)


def test_members_are_added_and_removed_by_raft_address_and_bad_requests_say_which_field():
    """POST /v1/cluster/members and DELETE /v1/cluster/members/{addr} hand the change to the
    replication layer (RaftNode.change_members, tests/test_replication_membership.py); the API
    refuses what is not a request for one, naming the field, and maps a refusal to 409."""
    async def t(env, c):
        r = await c.post("/v1/cluster/members", data=json.dumps({"addr": "127.0.0.1:9704"}))
        assert r.status == 200, await r.text()  # the fake makes a voter at once (a learner: 202)
        body = await r.json()
        assert body["state"] == "voter" and body["changed"] and "127.0.0.1:9704" in body["members"]["voters"]
        cl = await (await c.get("/v1/cluster")).json()
        assert "127.0.0.1:9704" in cl["members"] and cl["learners"] == [] and cl["membership"]["pending"] is None
        r = await c.delete("/v1/cluster/members/127.0.0.1:9704")
        assert r.status == 200 and (await r.json())["state"] == "removed"
        gone = await (await c.delete("/v1/cluster/members/127.0.0.1:9704")).json()
        assert gone["changed"] is False and gone["warnings"] == [
            "addr: 127.0.0.1:9704 is not a member nor a learner of this cluster (its members: 127.0.0.1:1): "
            "nothing was removed"], gone
        # A member under another name (a walk: "removed", exit 0, and it stayed a voter): refused.
        assert (await c.post("/v1/cluster/members", data=json.dumps({"addr": "127.0.0.1:9706"}))).status == 200
        body = await err(await c.delete("/v1/cluster/members/localhost:9706"), 409, "conflict", "addr")
        assert "is member 127.0.0.1:9706 under another name" in body["error"]["message"], body
        assert "127.0.0.1:9706" in env.raft.voters
        # Its own name: removed, no warning.
        r = await (await c.delete("/v1/cluster/members/127.0.0.1:9706")).json()
        assert r["changed"] is True and "warnings" not in r, r
        for body, field in (([], None), ({}, "addr"), ({"addr": 5}, "addr"), ({"addr": "h:1", "why": 1}, "why"),
                            ({"addr": "no-port"}, "addr")):
            await err(await c.post("/v1/cluster/members", data=json.dumps(body)), 422, "invalid", field)
        await err(await c.post("/v1/cluster/members", data=b"{"), 400, "bad_request")
        await err(await c.delete("/v1/cluster/members/no-port"), 422, "invalid", "addr")
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": ["127.0.0.1:9"]})),
                         422, "invalid", "addr")
        assert "must be a string" in body["error"]["message"], body
        # Another name of a member, or a name that resolves to nothing, was a learner nobody
        # answered for, a member slot taken until removed: refused, and nothing changes.
        voters = list(env.raft.voters)  # the fake's leader is 127.0.0.1:1
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "localhost:1"})),
                         409, "conflict", "addr")
        assert "is member 127.0.0.1:1 under another name" in body["error"]["message"], body
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "no-such-host.invalid:9799"})),
                         422, "invalid", "addr")
        assert "resolve" in body["error"]["message"], body
        # A wildcard address dialled is this host: 0.0.0.0:1 was member 127.0.0.1:1 counted twice
        # (a disaster-recovery walk: one node's death then cost the quorum). And a host with a
        # colon is no host (it was "'127.0.0.1:9' does not resolve").
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "[::ffff:127.0.0.1]:1"})),
                         409, "conflict", "addr")  # (an IPv4-mapped address is the IPv4 one)
        assert "is member 127.0.0.1:1 under another name" in body["error"]["message"], body
        for addr in ("0.0.0.0:1", "0:1", "[::]:1", "[::ffff:0.0.0.0]:1"):
            body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": addr})), 422, "invalid", "addr")
            assert "is a wildcard address" in body["error"]["message"], (addr, body)
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "127.0.0.1:9:1"})),
                         422, "invalid", "addr")
        assert "is not HOST:PORT" in body["error"]["message"], body
        assert env.raft.voters == voters
        env.raft.refuse = "a membership change is in progress"
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "127.0.0.1:9705"})),
                         409, "conflict", "addr")
        assert "in progress" in body["error"]["message"]
    run(t)


def test_cluster_and_metrics_say_which_code_the_node_runs(tmp_path, monkeypatch):
    """A disaster-recovery walk: the upgrade notes are dated by change, and a node said only
    "raftsched 0.1.0" anywhere, so an operator could not tell which nodes a rolling upgrade had
    reached. /v1/cluster's ``code`` (and raftsched_build_info) name a digest of the source; a
    changed file changes it."""
    from raftsched.node import build
    async def t(env, c):
        body = await (await c.get("/v1/cluster")).json()
        assert set(body["code"]) == {"version", "digest"} and len(body["code"]["digest"]) == build.DIGEST_HEX
        assert body["code"] == build.code()
    run(t)
    # The digest is of the files: a copy of the package with one byte changed has another.
    import shutil
    copy = tmp_path / "raftsched"
    shutil.copytree(build._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = build.code()
    monkeypatch.setattr(build, "_PACKAGE", str(copy))
    build.code.cache_clear()
    try:
        assert build.code() == before
        (copy / "core" / "limits.py").write_text((copy / "core" / "limits.py").read_text() + "\n# changed\n")
        build.code.cache_clear()
        assert build.code()["digest"] != before["digest"]
    finally:
        build.code.cache_clear()


def test_the_fencing_counter_is_read_and_raised_after_a_restore_never_lowered():
    """A cluster restored from copies of its data directories went back to the copy's fencing
    counter and granted again the tokens granted since (a disaster-recovery walk: 196-217 twice;
    docs/fencing.md said a restore "continues from the same value"), with no way to move it on.
    POST /v1/cluster/fencing raises it (never lowers it), and the next grant is above it."""
    from raftsched.core import commands
    async def t(env, c):
        assert (await (await c.get("/v1/cluster/fencing")).json()) == {"fencing_token": 0}
        r = await c.post("/v1/cluster/fencing", data=json.dumps({"at_least": 5000}))
        assert r.status == 200 and await r.json() == {"fencing_token": 5000, "raised": True}
        r = await c.post("/v1/cluster/fencing", data=json.dumps({"at_least": 10}))
        assert r.status == 200 and await r.json() == {"fencing_token": 5000, "raised": False}
        for body, field in (({}, "at_least"), ({"at_least": 0}, "at_least"), ({"at_least": 2**52 + 1}, "at_least"),
                            ({"at_least": "9"}, "at_least"), ({"at_least": 1.0}, "at_least"),
                            ({"at_least": 9, "x": 1}, "x")):
            await err(await c.post("/v1/cluster/fencing", data=json.dumps(body)), 422, "invalid", field)
        assert env.state.fencing_token == 5000
        await put(c, "a")
        assert (await c.post("/v1/jobs/a/trigger")).status == 201
        got = env.state.apply(commands.acquire(env.clock.now_ms(), worker="w", queues=None, max=1, ttl=30_000,
                                               types=None))["runs"]
        assert [g["token"] for g in got] == [5001]
        assert (await (await c.get("/v1/cluster/fencing")).json()) == {"fencing_token": 5001}
    run(t)


def test_cluster_shows_the_trigger_and_worker_counters_and_metrics_need_metrics():
    async def t(env, c):
        await put(c, "a")
        env.clock.advance(35_000)
        await env.trigger.tick()
        body = await (await c.get("/v1/cluster")).json()
        assert body["trigger"] == {"fires_proposed": 1, "slots_fired": 3, "held_by_clock": None}
        assert "worker" not in body  # this app was given no worker
        await err(await c.get("/metrics"), 404, "not_found")
    run(t)

    async def with_worker(env, c):
        body = await (await c.get("/v1/cluster")).json()
        # The worker's stats, in this order; a worker without slots never executes.
        assert list(body["worker"].items()) == [("id", env.worker.worker_id), ("slots", 0), ("running", 0),
                                                ("completed", 0), ("refused", 0), ("released", 0),
                                                ("waited_for_slot", 0), ("late_grants", 0), ("late_grants_gone", 0),
                                                ("draining", False), ("executes", False)]
        assert (await c.get("/metrics")).status == 200

        async def slots_metric():
            text = await (await c.get("/metrics")).text()
            return [ln for ln in text.splitlines() if ln.startswith("raftsched_worker_slots ")]
        # A worker of 3 slots counts them only while it takes runs (not while its node leads a
        # cluster of several: the registry says 0 then, and so does the metric).
        env.worker.slots = 3
        env.worker.channel.executes = lambda: False
        assert await slots_metric() == ["raftsched_worker_slots 0.0"]
        env.worker.channel.executes = lambda: True
        assert await slots_metric() == ["raftsched_worker_slots 3.0"]
    run(with_worker, metrics=True)


def test_preview_and_explain_endpoints():
    async def t(env, c):
        await put(c, "a", dict(SPEC, schedule={"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, misfire={"policy": "skip"}))
        body = await (await c.get("/v1/jobs/a/preview?count=3")).json()
        assert len(body["slots"]) == 3 and body["slots"][0]["local"].endswith("02:00:00+01:00")
        r = await c.post("/v1/preview?count=2", data=json.dumps(dict(SPEC, schedule={"every_s": 60})))
        assert r.status == 200 and len((await r.json())["slots"]) == 2
        await err(await c.post("/v1/preview", data=json.dumps({"schedule": {"every_s": 60}})), 422, "invalid", "executor")
        # A jitter offset is a hash of the job's name: with ?name= the preview is the stored
        # job's, as PUT would make it (without, the name "preview" gave other slots), and an
        # after naming another job is no self-edge.
        jit = dict(SPEC, schedule={"cron": "0 * * * *"}, jitter_s=600, misfire={"policy": "skip"})
        await put(c, "hourly-report", jit)
        stored = (await (await c.get("/v1/jobs/hourly-report/preview?count=3")).json())["slots"]
        named = (await (await c.post("/v1/preview?count=3&name=hourly-report", data=json.dumps(jit))).json())["slots"]
        assert [x["slot"] for x in named] == [x["slot"] for x in stored]
        # ?after= (a migrating user's walk: the DST days of an every-5-minutes cron were out of
        # reach of 1 000 slots from now): the next transition of New York's offset, from the
        # node's clock, whatever the date.
        from datetime import datetime, timedelta, timezone
        from zoneinfo import ZoneInfo
        ny = ZoneInfo("America/New_York")
        t = datetime.fromtimestamp(env.clock.now_ms() / 1000, timezone.utc).replace(minute=0, second=0, microsecond=0)
        while (t + timedelta(hours=1)).astimezone(ny).utcoffset() == t.astimezone(ny).utcoffset():
            t += timedelta(hours=1)
        assert t - datetime.fromtimestamp(env.clock.now_ms() / 1000, timezone.utc) > timedelta(days=3)
        five = dict(SPEC, schedule={"cron": "*/5 * * * *", "timezone": "America/New_York"}, misfire={"policy": "skip"})
        after = (t - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        r = await c.post("/v1/preview", params={"count": "60", "after": after}, data=json.dumps(five))
        got = (await r.json())["slots"]
        assert r.status == 200 and got[0]["slot"] > after and len(got) == 60, got[:2]
        assert len([x for x in got if "dst" in x]) == 1, [x for x in got if "dst" in x]
        now_first = (await (await c.post("/v1/preview?count=1", data=json.dumps(five))).json())["slots"]
        past = (await (await c.post("/v1/preview", params={"count": "1", "after": "2000-01-01T00:00:00Z"},
                                    data=json.dumps(five))).json())["slots"]
        assert past == now_first  # the job as if made now has no slot before now
        await err(await c.post("/v1/preview", params={"after": "soon"}, data=json.dumps(five)), 400, "bad_request", "after")
        r = await c.post("/v1/preview", data=json.dumps({"executor": SPEC["executor"], "after": ["preview"]}))
        await err(r, 422, "invalid", "after[0].job")  # the default name: itself
        r = await c.post("/v1/preview?name=child", data=json.dumps({"executor": SPEC["executor"], "after": ["preview"]}))
        assert r.status == 200 and (await r.json())["triggered_by"][0]["job"] == "preview", await r.text()
        await err(await c.post("/v1/preview?name=a%20b", data=json.dumps(jit)), 400, "bad_request", "name")
        r = await c.post("/v1/jobs/a/explain", data=json.dumps({"down_from": "2026-12-01T00:00:00Z", "down_to": "2026-12-01T02:00:30Z"}))
        body = await r.json()
        assert r.status == 200, body
        assert body["runs"] == [] and body["recorded"][0]["from"] == "2026-12-01T01:00:00Z"
        await err(await c.post("/v1/jobs/a/explain", data=json.dumps({"down_from": "x"})), 400, "bad_request", "down_from")
        # (a walk: a window without its end said down_to "must be an ISO-8601 string"; and a slot
        # given with a window was ignored without a word)
        body = await err(await c.post("/v1/jobs/a/explain", data=json.dumps({"down_from": "2026-12-01T00:00:00Z"})),
                         400, "bad_request", "down_to")
        assert body["error"]["message"].startswith("is required"), body
        await err(await c.post("/v1/jobs/a/explain", data=json.dumps({"down_from": "2026-12-01T00:00:00Z",
                                                                        "down_to": "2026-12-01T02:00:30Z",
                                                                        "slot": "2026-12-01T01:00:00Z"})),
                  400, "bad_request", "slot")
        await err(await c.post("/v1/jobs/a/explain", data=json.dumps({"down_from": "2026-12-01T02:00:00Z", "down_to": "2026-12-01T01:00:00Z"})), 400, "bad_request", "down_to")
        await err(await c.post("/v1/jobs/nope/explain", data=json.dumps({})), 404, "not_found")
        await err(await c.get("/v1/jobs/a/preview?count=0"), 400, "bad_request", "count")
        # explain of one slot: an instant that is no slot of the job says so, naming the next one
        # (it answered "the slot has no deadline record", as for a slot not fired yet)
        r = await c.post("/v1/jobs/a/explain", data=json.dumps({"slot": "2031-03-01T01:00:41Z"}))
        body = await r.json()
        assert r.status == 200 and "no slot of the job's schedule" in body["why"], body
        assert "2031-03-02T01:00:00Z" in body["why"], body
        r = await c.post("/v1/jobs/a/explain", data=json.dumps({"slot": "2031-03-02T01:00:00Z"}))
        body = await r.json()  # (a slot of a job without a deadline: said plainly, as a walk asked)
        assert r.status == 200 and body["why"].startswith("the job has no deadline: none of its slots"), body
    run(t)


def test_cluster_state_hash_is_opt_in_and_matches_the_replica():
    """GET /v1/cluster?hash=true (the fault-injection harness's convergence check, docs/testing.md)."""
    async def t(env, c):
        assert (await put(c, "a")).status == 201
        plain = await (await c.get("/v1/cluster")).json()
        assert "state_hash" not in plain and "state_applied" not in plain
        body = await (await c.get("/v1/cluster?hash=true")).json()
        assert body["state_hash"] == env.state.state_hash()
        assert body["state_applied"] == env.state.applied
        await err(await c.get("/v1/cluster?hash=maybe"), 400, "bad_request", "hash")
    run(t)


def test_metrics_endpoint_exposes_state_and_fire_lag():
    async def t(env, c):
        await put(c, "a")
        env.clock.advance(35_000)
        await env.trigger.tick()
        r = await c.get("/metrics")
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
        assert "raftsched_jobs 1.0" in text
        assert 'raftsched_runs{state="queued"} 3.0' in text
        assert 'raftsched_queue_depth{queue="default"} 3.0' in text
        assert "raftsched_fire_lag_seconds_count 3.0" in text
        # Slots at 10, 20 and 30 s fired at 35 s: lags 25, 15 and 5 s, cumulative buckets.
        assert 'raftsched_fire_lag_seconds_bucket{le="2.5"} 0.0' in text
        assert 'raftsched_fire_lag_seconds_bucket{le="5.0"} 1.0' in text
        assert 'raftsched_fire_lag_seconds_bucket{le="10.0"} 1.0' in text
        assert 'raftsched_fire_lag_seconds_bucket{le="30.0"} 3.0' in text
        assert 'raftsched_fire_lag_seconds_bucket{le="+Inf"} 3.0' in text
        assert "raftsched_fire_lag_seconds_sum 45.0" in text
        assert "raftsched_slots_fired_total 3.0" in text
        assert "raftsched_raft_is_leader 1.0" in text
    run(t, metrics=True)


def test_cluster_and_metrics_show_how_each_follower_keeps_up():
    """/v1/cluster and /metrics carry the replication view (RaftNode's ReplicationWatch): each
    follower's match index and lag as the leader sees it, this node's own commit stall, and the
    cluster.follower_stalled condition."""
    async def t(env, c):
        body = await (await c.get("/v1/cluster")).json()
        assert body["conditions"] == [] and body["replication"]["followers"] == {}
        follower = {"match_index": 7, "next_index": 8, "state": "probe", "inflight_bytes": 0,
                    "last_ack_age_s": 12.5, "rejections": 3, "stale_answers": 40,
                    "lag_entries": 93, "stalled_s": 12.5}
        stalled = [{"type": "cluster.follower_stalled", "node": "127.0.0.1:2", "for_s": 12.5,
                    "match_index": 7}]
        env.raft.replication = {"commit_stalled_s": 0.0, "leader_commit_index": 100,
                                "followers": {"127.0.0.1:2": follower}, "conditions": stalled}
        body = await (await c.get("/v1/cluster")).json()
        assert body["replication"]["followers"]["127.0.0.1:2"] == follower
        assert body["conditions"] == stalled
        text = await (await c.get("/metrics")).text()
        assert 'raftsched_raft_follower_lag_entries{peer="127.0.0.1:2"} 93.0' in text
        assert 'raftsched_raft_follower_stalled_seconds{peer="127.0.0.1:2"} 12.5' in text
        assert 'raftsched_raft_follower_rejections_total{peer="127.0.0.1:2"} 3.0' in text
        assert "raftsched_raft_commit_stalled_seconds 0.0" in text
        assert "raftsched_cluster_conditions 1.0" in text
    run(t, metrics=True)


def test_a_command_handler_that_raises_is_an_internal_error_logged_with_its_command(monkeypatch, caplog):
    """A bug inside a command handler: every replica refuses the command alike (the state does
    not change), the caller gets a 500 ``internal`` it can see (not a 422 that blames its
    request), the node logs it with the command's op, and a retry with the same key gets the
    same answer without proposing again (the replay rule)."""
    import logging

    from raftsched.core import state as state_module

    def broken(s, cmd, now):
        raise KeyError("a bug")
    monkeypatch.setitem(state_module.HANDLERS, "pause_job", broken)

    async def t(env, c):
        await put(c, "a")
        proposed = len(env.raft.proposed)
        with caplog.at_level(logging.ERROR, logger="raftsched.proposer"):
            r = await c.post("/v1/jobs/a/pause", headers=dict(AUTH, **{"Idempotency-Key": "k-1"}))
        body = await r.json()
        assert r.status == 500 and body["error"]["code"] == "internal", body
        assert "pause_job could not be applied" in body["error"]["message"]
        assert "pause_job" in caplog.text and "a bug" in caplog.text
        assert not env.state.jobs["a"]["paused"]
        assert len(env.raft.proposed) == proposed + 1
        r = await c.post("/v1/jobs/a/pause", headers=dict(AUTH, **{"Idempotency-Key": "k-1"}))
        assert r.status == 500 and len(env.raft.proposed) == proposed + 1, "answered from the replica"
    run(t)


def test_cluster_and_metrics_show_the_clocks():
    """/v1/cluster's ``clock`` (RaftNode.clock_status: this node's wall clock against the
    cluster's, each member's on the leader), its cluster.clock_disagrees conditions, whether
    the trigger holds its fires, and the raftsched_clock_* metrics."""
    async def t(env, c):
        body = await (await c.get("/v1/cluster")).json()
        assert body["clock"]["state"] == "agrees" and body["conditions"] == []
        assert body["trigger"]["held_by_clock"] is None
        cond = {"type": "cluster.clock_disagrees", "node": "self", "offset_ms": 6003, "error_ms": 2, "bound_ms": 1000}
        env.raft.clock = dict(env.raft.clock, state="disagrees", offset_ms=6003, error_ms=2,
                              peers={"127.0.0.1:2": {"offset_ms": -2, "error_ms": 1}}, conditions=[cond])
        env.trigger.clock_holds()
        body = await (await c.get("/v1/cluster")).json()
        assert body["clock"]["offset_ms"] == 6003 and "conditions" not in body["clock"]
        assert body["conditions"] == [cond]
        assert body["trigger"]["held_by_clock"] == "disagrees"
        text = await (await c.get("/metrics")).text()
        assert "raftsched_clock_offset_seconds 6.003" in text
        assert "raftsched_clock_disagrees 1.0" in text
        assert 'raftsched_clock_peer_offset_seconds{peer="127.0.0.1:2"} -0.002' in text
        assert "raftsched_trigger_ticks_held_by_clock_total 1.0" in text
        assert "raftsched_cluster_conditions 1.0" in text
    run(t, metrics=True)


def test_a_jittered_jobs_spec_reads_as_written_and_can_be_put_back():
    """A user's walk (migrating with get, edit, put): a job with jitter_s read back with
    schedule.jitter_ms and schedule.jitter_key, the state's own fields, and no jitter_s; PUT
    back, it was refused (unknown field schedule.jitter_ms). GET shows the spec as written."""
    async def t(env, c):
        spec = dict(SPEC, schedule={"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, jitter_s=7)
        assert (await put(c, "jit", spec)).status == 201
        got = (await (await c.get("/v1/jobs/jit")).json())["spec"]
        assert got["jitter_s"] == 7 and got["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, got
        r = await put(c, "jit", got)
        assert r.status == 200, await r.text()
        assert (await (await c.get("/v1/jobs/jit")).json())["spec"] == got, "the same spec, put back"
        assert env.state.jobs["jit"]["spec"]["schedule"]["jitter_ms"] == 7000
        assert (await put(c, "plain", SPEC)).status == 201
        assert "jitter_s" not in (await (await c.get("/v1/jobs/plain")).json())["spec"]
    run(t)


def test_a_dead_run_requeued_by_hand_into_a_full_queue_is_refused_and_stays_dead():
    """A user's walk: queue tiny (max_depth 1, reject) refused a new slot, yet two requeues by
    hand queued their dead runs over its bound (depth 3). A requeue by hand respects it: 409
    naming the queue, the run stays dead; once the queue has room it is taken."""
    from raftsched.core import commands

    async def t(env, c):
        assert (await c.put("/v1/queues/tiny", data=json.dumps({"max_depth": 1, "on_full": "reject"}))).status in (200, 201)
        spec = dict(SPEC, queue="tiny", retry={"max_attempts": 1})
        assert (await put(c, "f", spec)).status == 201
        run_id = (await (await c.post("/v1/jobs/f/trigger")).json())["run"]
        now = env.clock.now_ms()
        g = env.state.apply(commands.acquire(now, worker="w", queues=None, max=1, ttl=30_000, types=None))["runs"][0]
        env.state.apply(commands.complete_many(now, None, results=[{"run": g["id"], "token": g["token"],
                                                                    "success": False, "error": "boom"}], worker="w"))
        assert env.state.runs[run_id]["state"] == "dead"
        assert (await c.post("/v1/jobs/f/trigger")).status == 201  # the queue's one place taken
        body = await err(await c.post(f"/v1/dlq/{run_id}/requeue"), 409, "conflict", "run")
        assert "queue 'tiny' is full (1 of 1 queued): the run stays dead" in body["error"]["message"], body
        assert env.state.runs[run_id]["state"] == "dead"
        now = env.clock.now_ms()
        g = env.state.apply(commands.acquire(now, worker="w", queues=None, max=1, ttl=30_000, types=None))["runs"][0]
        assert g["id"] != run_id  # the queued one leaves the queue: room
        r = await c.post(f"/v1/dlq/{run_id}/requeue")
        assert r.status == 200 and (await r.json())["state"] == "queued", await r.text()
    run(t)


def test_a_member_add_whose_names_resolve_slowly_is_refused_within_one_deadline(monkeypatch):
    """A review: each address had its own 3 s (ten of them, 30 s, past the clients' 10 s), and a
    resolver's timeout was caught as an OSError with an empty reason."""
    import time as time_mod

    from raftsched.node import api as api_mod
    from raftsched.node import limits as node_limits

    async def slow(addr):
        await asyncio.sleep(5)  # ok-sleep: a resolver that does not answer
        return set()
    monkeypatch.setattr(api_mod, "_resolved", slow)
    monkeypatch.setattr(node_limits, "member_resolve_s", 0.2)

    async def t(env, c):
        t0 = time_mod.monotonic()
        body = await err(await c.post("/v1/cluster/members", data=json.dumps({"addr": "slow.example:9700"})),
                         422, "invalid", "addr")
        assert time_mod.monotonic() - t0 < 3, "one deadline for every address"
        assert "did not resolve within 0.2 s" in body["error"]["message"], body
    run(t)


def test_a_heartbeat_job_without_a_deadline_is_accepted_with_a_warning():
    """An on-call walk: a heartbeat job without a deadline looked healthy while nothing pinged it
    (a slot nobody pinged is told only when closed, 16 slots later). PUT and a batch say so."""
    hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"}}

    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        r = await put(c, "hb", hb)
        body = await r.json()
        assert r.status == 201 and any(w.startswith("deadline: a heartbeat job without one") for w in body["warnings"])
        assert "16 slots later" in body["warnings"][-1], body
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"hb2": hb}}))
        assert (await r.json())["jobs"]["hb2"]["warnings"][0].startswith("deadline:")
        r = await put(c, "hb", dict(hb, deadline={"start_within_s": 60}))
        assert r.status == 200 and "warnings" not in await r.json()
        r = await put(c, "plain", SPEC)
        assert "warnings" not in await r.json()
    run(t)


def test_a_replace_job_without_a_success_deadline_is_accepted_with_a_warning():
    """A walk: a job of overlap replace whose runs took longer than its period was killed at
    every slot and never succeeded, and nothing said so (a replaced run is no death). PUT says
    how to be told: max_since_success_s."""
    replace = dict(SPEC, overlap={"policy": "replace"})

    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        r = await put(c, "r", replace)
        body = await r.json()
        assert r.status == 201 and body["warnings"][0].startswith("deadline: with overlap replace"), body
        assert "max_since_success_s" in body["warnings"][0]
        r = await put(c, "r", dict(replace, deadline={"max_since_success_s": 3600}))
        assert "warnings" not in await r.json()
        r = await put(c, "r", dict(replace, deadline={"start_within_s": 60}))  # a start deadline says nothing of it
        assert (await r.json())["warnings"][0].startswith("deadline: with overlap replace")
        r = await put(c, "f", dict(SPEC, overlap={"policy": "forbid"}))
        assert "warnings" not in await r.json()
    run(t)


def test_a_jobs_queued_runs_are_cancelled_oldest_first_a_bounded_number_a_request(monkeypatch):
    """POST /v1/jobs/{name}/cancel: an outage's backlog ended in requests of at most
    cancel_job_runs_max runs (``more`` while some are left); a running run only when asked; a
    job's own runs only; nothing for an unknown job."""
    from raftsched.core import commands
    from raftsched.node import limits as node_limits
    monkeypatch.setattr(node_limits, "cancel_job_runs_max", 2)

    async def t(env, c):
        await put(c, "p")
        await put(c, "other")
        ids = []
        for _ in range(4):
            ids.append((await (await c.post("/v1/jobs/p/trigger")).json())["run"])
            env.clock.advance(1_000)
        grant = env.state.apply_bytes(commands.encode(commands.acquire(
            env.clock.now_ms(), worker="w", queues=None, max=1, ttl=30_000, types=None)))["runs"][0]
        leased = grant["id"]
        assert leased == ids[0]  # the oldest due
        theirs = (await (await c.post("/v1/jobs/other/trigger")).json())["run"]
        first = await (await c.post("/v1/jobs/p/cancel", json={"reason": "backlog"})).json()
        assert first == {"job": "p", "cancelled": 2, "runs": ids[1:3], "passed": [], "more": True,
                         "next": ids[2]}, first
        assert env.state.runs[ids[1]]["error"] == "cancelled by request: backlog"
        rest = await (await c.post("/v1/jobs/p/cancel", json={"after": first["next"]})).json()
        assert rest == {"job": "p", "cancelled": 1, "runs": ids[3:], "passed": [], "more": False}, rest
        await err(await c.post("/v1/jobs/p/cancel", json={"after": 7}), 422, "invalid", "after")
        # A cursor that is no run id of this job (garbage, another job's run) would start from the
        # oldest and cancel what was left alone (a walk): refused, changing nothing.
        for bad in ("!!!", theirs, "pp@1"):
            await err(await c.post("/v1/jobs/p/cancel", json={"running": True, "after": bad}), 422, "invalid", "after")
        # The running run stays unless asked; another job's run stays.
        assert env.state.runs[leased]["state"] == "running" and env.state.runs[theirs]["state"] == "queued"
        done = await (await c.post("/v1/jobs/p/cancel", json={"running": True})).json()
        assert done["runs"] == [leased] and env.state.runs[leased]["state"] == "failed", done
        assert (await (await c.post("/v1/jobs/p/cancel")).json())["cancelled"] == 0
        assert env.state.runs[theirs]["state"] == "queued"
        await err(await c.post("/v1/jobs/nosuch/cancel"), 404, "not_found", "name")
    run(t)


def _second_cancel_command_fails(env, monkeypatch):
    """The node's second cancel_runs command of a request fails (no answer); returns the real
    propose, to put back."""
    from raftsched.core.errors import Indeterminate
    real, calls = env.service.propose, []

    async def second_fails(cmd):
        calls.append(cmd["op"])
        if cmd["op"] == "cancel_runs" and calls.count("cancel_runs") == 2:
            raise Indeterminate("no answer in 5 s")
        return await real(cmd)
    monkeypatch.setattr(env.service, "propose", second_fails)
    return real


def test_a_job_cancel_sent_again_with_its_key_ends_what_the_first_left_and_not_the_runs_fired_since(monkeypatch):
    """A client sends a job's cancel again with its Idempotency-Key when it saw no answer (a
    timeout, a leader change): the retry is the same request. It ends what the first attempt
    left (a command that failed part-way), says ``duplicate``, and passes over the runs fired
    after the first attempt (they were not the backlog it was asked to end: the retry had ended
    the next slot's run). The key names the job's cancel: used for another job's, a conflict."""
    from raftsched.core import limits, queries
    monkeypatch.setattr(limits, "run_refs_per_command", 2)

    async def t(env, c):
        await put(c, "p")
        await put(c, "q")
        ids = []
        for _ in range(4):
            ids.append((await (await c.post("/v1/jobs/p/trigger")).json())["run"])
            env.clock.advance(1_000)
        first = await (await c.post("/v1/runs/" + ids[0] + "/cancel")).json()
        assert first["state"] == "skipped"
        real = _second_cancel_command_fails(env, monkeypatch)
        key = {"Idempotency-Key": "cancel-p-1"}
        r = await c.post("/v1/jobs/p/cancel", headers=key)
        assert r.status == 504 and (await r.json())["error"]["cancelled"] == 2
        monkeypatch.setattr(env.service, "propose", real)
        assert [env.state.runs[x]["state"] for x in ids[1:]] == ["skipped", "skipped", "queued"]
        env.clock.advance(1_000)
        later = [(await (await c.post("/v1/jobs/p/trigger")).json())["run"] for _ in range(2)]
        b = await (await c.post("/v1/jobs/p/cancel", headers=key)).json()
        assert (b["runs"], b.get("duplicate")) == (ids[3:], True), b
        assert [env.state.runs[x]["state"] for x in later] == ["queued", "queued"], "a retry ended runs fired since"
        again = await (await c.post("/v1/jobs/p/cancel", headers=key)).json()
        assert (again["cancelled"], again.get("duplicate")) == (0, True), again
        # A retry that read before the first attempt's command applied (they overlap): its own
        # first command is answered from the request log, and it goes on as the retry.
        real_read = env.service.read
        unseen: list = []

        def unseen_once(fn, *args):
            if fn is queries.replayed and not unseen:
                unseen.append(1)
                return None
            return real_read(fn, *args)
        monkeypatch.setattr(env.service, "read", unseen_once)
        late = (await (await c.post("/v1/jobs/p/trigger")).json())["run"]
        over = await (await c.post("/v1/jobs/p/cancel", headers=key)).json()
        assert unseen and (over["cancelled"], over.get("duplicate")) == (0, True), over
        assert env.state.runs[late]["state"] == "queued"
        monkeypatch.setattr(env.service, "read", real_read)
        later.append(late)
        # The same key for another job's cancel: another request, refused.
        await err(await c.post("/v1/jobs/q/cancel", headers=key), 409, "conflict", "Idempotency-Key")
        # Without the key (or with a new one), a new request: it ends them.
        fresh = await (await c.post("/v1/jobs/p/cancel", headers={"Idempotency-Key": "cancel-p-2"})).json()
        assert fresh["runs"] == later and "duplicate" not in fresh, fresh
    run(t)


def test_a_job_cancel_whose_command_fails_says_what_the_others_ended(monkeypatch):
    from raftsched.core import limits
    monkeypatch.setattr(limits, "run_refs_per_command", 2)

    async def t(env, c):
        await put(c, "p")
        for _ in range(3):
            await c.post("/v1/jobs/p/trigger")
            env.clock.advance(1_000)
        real = _second_cancel_command_fails(env, monkeypatch)
        r = await c.post("/v1/jobs/p/cancel")
        body = await r.json()
        assert r.status == 504 and body["error"]["cancelled"] == 2, body
        assert "2 run(s) of job 'p' were cancelled beside it" in body["error"]["message"], body
        monkeypatch.setattr(env.service, "propose", real)
        again = await (await c.post("/v1/jobs/p/cancel")).json()
        assert again["cancelled"] == 1 and again["more"] is False, again  # asked again: the rest
    run(t)


def test_a_put_says_when_no_live_worker_serves_its_queue_and_not_once_one_does():
    """Nodes of --slots 0 and no worker process yet (or each one gone): a plain job's runs wait
    queued, and nothing said so at its PUT; its runs' views now say it too (why_queued_many)."""
    async def t(env, c):
        want = ("queue: no live worker serves queue 'default' for shell runs (none registered, or each one gone, "
                "draining, of 0 slots or of other queues): its runs wait queued until one registers; GET /v1/workers "
                "lists the workers")
        r = await put(c, "plain", SPEC)
        assert r.status == 201 and (await r.json())["warnings"] == [want]
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"b1": SPEC, "b2": SPEC}}))
        assert [j["warnings"] for j in (await r.json())["jobs"].values()] == [[want], [want]]
        hb = dict(SPEC, executor={"type": "heartbeat"}, deadline={"start_within_s": 60})
        r = await put(c, "beat", hb)  # pinged, not leased: no worker to wait for
        assert r.status == 201 and "warnings" not in await r.json()
        live_worker(env.state, env.clock.now_ms())
        env.clock.advance(1_100)  # (the node reads the workers for this at most once a second)
        r = await put(c, "plain", SPEC)
        assert r.status == 200 and "warnings" not in await r.json()
    run(t)


def test_a_delete_says_what_runs_went_with_the_job_and_warns_of_a_running_one():
    """A walk: DELETE of a job whose run was running answered {"job", "deleted": true}; the run
    was killed by its worker and its record was gone, and nothing had said so."""
    async def t(env, c):
        assert (await put(c, "j", SPEC)).status == 201
        for _ in range(2):
            assert (await c.post("/v1/jobs/j/trigger")).status in (200, 201)
        now = env.clock.now_ms()
        got = env.state.apply(commands.acquire(now, worker="t", queues=None, max=1, ttl=30_000, types=None))["runs"]
        assert len(got) == 1
        r = await c.delete("/v1/jobs/j", headers=dict(AUTH, **{"Idempotency-Key": "del-1"}))
        body = await r.json()
        assert r.status == 200 and body["runs_ended"] == {"queued": 1, "running": 1, "dead": 0}, body
        assert body["warnings"][0].startswith("1 running run(s) lost their lease with the job"), body
        again = await (await c.delete("/v1/jobs/j", headers=dict(AUTH, **{"Idempotency-Key": "del-1"}))).json()
        assert again["runs_ended"] == body["runs_ended"] and again["duplicate"] is True, again
        assert (await put(c, "k", SPEC)).status == 201
        r = await c.delete("/v1/jobs/k")
        assert await r.json() == {"job": "k", "deleted": True}
    run(t)


def test_a_tenants_tokens_are_its_bucket_as_of_the_read():
    """A walk: tokens read 0.51 2.5 s after a hand-out at 0.2 a second: the bucket as the last
    take, granted or refused, left it, which reads as a bucket filling between reads. Now the
    bucket at the time of the read, refilled up to it (tenants.tokens_at)."""
    async def t(env, c):
        r = await c.put("/v1/tenants/t1", data=json.dumps({"rate_per_s": 0.5, "burst": 2}))
        assert r.status == 200, await r.text()
        assert (await put(c, "j", dict(SPEC, tenant="t1"))).status == 201
        for _ in range(2):
            assert (await c.post("/v1/jobs/j/trigger")).status in (200, 201)
        now = env.clock.now_ms()
        got = env.state.apply(commands.acquire(now, worker="t", queues=None, max=5, ttl=30_000, types=None))["runs"]
        assert len(got) == 2  # the bucket's two tokens
        tokens = lambda b: b["tokens"]  # noqa: E731
        assert tokens(await (await c.get("/v1/tenants/t1")).json()) == 0
        env.clock.advance(1_000)
        assert tokens(await (await c.get("/v1/tenants/t1")).json()) == 0.5
        env.clock.advance(10_000)  # full: at most its burst
        listed = (await (await c.get("/v1/tenants")).json())["tenants"]
        assert [tokens(x) for x in listed if x["name"] == "t1"] == [2.0]
    run(t)


def test_a_put_says_which_of_its_settings_do_nothing():
    """A walk: a retry on a heartbeat job, a max_catchup beside skip or fire_once, and a one-shot
    ``at`` years past (it ran at once, fire_lag 6.9 years) were all taken silently."""
    async def t(env, c):
        async def said(name, spec):
            r = await put(c, name, spec)
            assert r.status in (200, 201), await r.text()
            return " | ".join((await r.json()).get("warnings") or [])
        hb = {"schedule": {"every_s": 60}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
              "deadline": {"succeed_within_s": 90}}
        assert "retry does nothing" in await said("hb", dict(hb, retry={"max_attempts": 3}))
        assert "retry" not in await said("hb2", hb)
        for policy in ("skip", "fire_once"):
            got = await said("mc", dict(SPEC, misfire={"policy": policy, "max_catchup": 5}))
            assert f"only fire_all reads it; with {policy}" in got, got
        assert "max_catchup" not in await said("mc", dict(SPEC, misfire={"policy": "fire_all", "max_catchup": 5}))
        past = schedule.iso(env.clock.now_ms() - 86_400_000)
        got = await said("once", dict(SPEC, schedule={"at": past}))
        assert f"schedule.at: {past} has passed: its one slot is fired now" in got, got
        got = await said("once2", dict(SPEC, schedule={"at": past}, misfire={"policy": "skip"}))
        assert "recorded skipped, and never runs" in got, got
        assert "schedule.at" not in await said("once", dict(SPEC, schedule={"at": past}, description="edited"))
        # A replace that gives a job that schedule (a walk: silent, and the job never ran), and a
        # dry run of a new one (a walk: the apply warned, the dry run did not), say it too.
        assert "schedule.at" in await said("mc", dict(SPEC, schedule={"at": past}))
        r = await c.post("/v1/jobs:batch", json={"dry_run": True, "jobs": {"once9": dict(SPEC, schedule={"at": past}),
                                                                           "once": dict(SPEC, schedule={"at": past})}})
        plan = (await r.json())["jobs"]
        assert "schedule.at" in " ".join(plan["once9"].get("warnings", [])), plan
        assert "schedule.at" not in " ".join(plan["once"].get("warnings", [])), plan
        soon = schedule.iso(env.clock.now_ms() + 60_000)
        assert "schedule.at" not in await said("once3", dict(SPEC, schedule={"at": soon}))
    run(t)
