"""Why a paused job is paused: since when, by whom (a token, or its pause_on_failure), a note.

A job paused months ago by someone who left showed ``paused: true`` and nothing else: nobody
could tell whether resuming it was safe. The pause that pauses it keeps why (core/notify.py
PAUSE_FIELDS), in the replicated state and its snapshot; resume and delete drop it.
"""
from __future__ import annotations

import json

from core_helpers import SEC, T0, apply, new_state, refused, restored, resume_cmd, spec_of
from test_api import AUTH, err, put, run
from test_notify_core import job_with, run_once, state_with

from raftsched.core import commands, limits, queries

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)


def pause(s, now, **kw):
    return apply(s, commands.pause_job(now, None, name="a", **kw))


def test_the_pause_that_pauses_a_job_keeps_since_by_and_note_until_the_resume():
    s = new_state(("a", EVERY10))
    assert queries.job(s, "a")["pause"] is None
    assert pause(s, T0 + 5 * SEC, by="0123456789abcdef", note="warehouse migration, ask Ana")["paused"] is True
    want = {"since": T0 + 5 * SEC, "reason": "manual", "by": "0123456789abcdef", "note": "warehouse migration, ask Ana"}
    assert queries.job(s, "a")["pause"] == want
    # A pause of a paused job changes nothing (a retried request, a second operator): the first why stays.
    pause(s, T0 + 9 * SEC, by="fedcba9876543210", note="other")
    assert queries.job(s, "a")["pause"] == want
    assert restored(s).pauses == s.pauses, "the snapshot keeps it"
    assert queries.job(restored(s), "a")["pause"] == want
    assert apply(s, resume_cmd(s, "a", T0 + 20 * SEC))["paused"] is False
    assert queries.job(s, "a")["pause"] is None and s.pauses == {}
    pause(s, T0 + 30 * SEC)  # no token, no note (an older node's command): since and reason
    assert queries.job(s, "a")["pause"] == {"since": T0 + 30 * SEC, "reason": "manual", "by": None, "note": None}
    assert apply(s, commands.make("delete_job", T0 + 31 * SEC, None, name="a"))["ok"]
    assert s.pauses == {}, "a deleted job's why goes with it"


def test_a_malformed_pause_command_is_refused_and_changes_nothing():
    s = new_state(("a", EVERY10))
    for kw in ({"by": 7}, {"by": "x" * (limits.pause_by_chars_max + 1)}, {"note": ""}, {"note": ["x"]},
               {"note": "n" * (limits.pause_note_chars_max + 1)}):
        refused(s, commands.make("pause_job", T0 + SEC, None, name="a", **kw), "invalid_command")
    assert not s.jobs["a"]["paused"] and s.pauses == {}


def test_pause_on_failure_says_it_paused_the_job_and_which_run_ended_the_streak():
    s = state_with(job_with(pause_on_failure={"after_consecutive": 2}))
    run_once(s, T0 + 10 * SEC, False)
    run_once(s, T0 + 20 * SEC, False)
    why = queries.job(s, "j")["pause"]
    assert why["reason"] == "pause_on_failure" and why["by"] is None and why["since"] == T0 + 20 * SEC, why
    assert why["note"].startswith("2 consecutive failures; the last, run j@"), why


def test_the_api_takes_a_note_shows_why_and_refuses_a_bad_note_naming_it():
    async def t(env, c):
        await put(c, "p")
        for body, field in (({"note": ""}, "note"), ({"note": 5}, "note"), ({"note": "a\nb"}, "note"),
                            ({"note": "n" * 257}, "note"), ({"why": "x"}, "why")):
            proposed = len(env.raft.proposed)
            await err(await c.post("/v1/jobs/p/pause", data=json.dumps(body), headers=AUTH), 422, "invalid", field)
            assert len(env.raft.proposed) == proposed and not env.state.jobs["p"]["paused"], body
        got = await (await c.get("/v1/jobs/p")).json()
        assert got["state"]["paused"] is False and got["state"]["pause"] is None
        r = await c.post("/v1/jobs/p/pause", data=json.dumps({"note": "disk full on db-3 — INC-4411"}), headers=AUTH)
        assert r.status == 200, await r.text()
        why = (await (await c.get("/v1/jobs/p")).json())["state"]["pause"]
        assert why["reason"] == "manual" and why["note"] == "disk full on db-3 — INC-4411", why
        assert why["by"] == "bootstrap" and why["since"].endswith("Z"), why
        listed = (await (await c.get("/v1/jobs")).json())["jobs"]
        assert [j["state"]["pause"] for j in listed] == [why]
        assert (await c.post("/v1/jobs/p/resume", headers=AUTH)).status == 200
        assert (await (await c.get("/v1/jobs/p")).json())["state"]["pause"] is None
    run(t)


def test_who_paused_a_job_is_shown_to_an_admin_and_to_that_token_only():
    """A review: state.pause.by showed every reader (a tenant's operator too) the token ids of
    whoever paused a job, which only GET /v1/tokens (admins) lists. The others see since,
    reason and note."""
    from test_auth import BOOT, SPEC as AUTH_SPEC, call, new_token, run as auth_run

    async def t(env, c):
        op = await new_token(c, "operator")
        reader = (await new_token(c, "reader"))["token"]
        assert (await call(c, "PUT", "/v1/jobs/j", BOOT, AUTH_SPEC))[0] == 201
        assert (await call(c, "POST", "/v1/jobs/j/pause", op["token"], {"note": "db maintenance"}))[0] == 200
        for token, shown in ((BOOT, op["id"]), (op["token"], op["id"]), (reader, None)):
            s, job = await call(c, "GET", "/v1/jobs/j", token)
            assert s == 200 and job["state"]["pause"]["note"] == "db maintenance", job
            assert job["state"]["pause"].get("by") == shown, (token, job)
            s, page = await call(c, "GET", "/v1/jobs", token)
            assert page["jobs"][0]["state"]["pause"].get("by") == shown, (token, page)
    auth_run(t)
