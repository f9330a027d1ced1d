"""The sinks API and the leader's delivery in one process (node/notify.py over FakeRaft): who may
write which sink, secrets redacted and kept, tenant default routes, health on the job view,
delivery to loopback receivers (slack's line, a webhook's signature), the dead list and its
requeue, and the metrics."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json

from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest

from raftsched.core import commands, limits
from raftsched.node.notify import Notifier, one_line, sign

from test_metrics_prom import sample
from test_auth import BOOT, SPEC, call, new_token, run
from core_helpers import live_worker

HOOK = {"type": "webhook", "url": "http://127.0.0.1:9/", "secrets": {"signing_key": "whsec-do-not-show"}}


def test_who_may_write_a_sink_and_what_a_read_shows():
    async def t(env, c):
        op = (await new_token(c, "operator"))["token"]
        billing = (await new_token(c, "operator", tenants=["billing"]))["token"]
        reader = (await new_token(c, "reader"))["token"]
        s, b = await call(c, "PUT", "/v1/sinks/ops", op, HOOK)
        assert s == 403 and b["error"]["field"] == "tenant", b  # a sink for the whole cluster is an admin's
        s, b = await call(c, "PUT", "/v1/sinks/ops", BOOT, HOOK)
        assert s == 201 and b["spec"]["secrets"]["signing_key"].startswith("***:"), b
        s, b = await call(c, "PUT", "/v1/sinks/other", billing, dict(HOOK, tenant="other"))
        assert s == 403, b
        s, b = await call(c, "PUT", "/v1/sinks/bill", billing, dict(HOOK, tenant="billing"))
        assert s == 201, b
        s, b = await call(c, "GET", "/v1/sinks", billing)
        assert [x["name"] for x in b["sinks"]] == ["bill"]
        s, b = await call(c, "GET", "/v1/sinks/ops", billing)
        assert s == 404, b  # as for a name nobody uses
        s, b = await call(c, "DELETE", "/v1/sinks/ops", billing)
        assert s == 404, b
        s, b = await call(c, "PUT", "/v1/sinks/ops", reader, HOOK)
        assert s == 403, b
        s, b = await call(c, "GET", "/v1/sinks/ops", reader)
        assert s == 200 and b["spec"]["secrets"]["signing_key"].startswith("***:") and "do-not-show" not in json.dumps(b)
        # A redacted value sent back keeps the stored secret; one that matches nothing is refused.
        redacted = b["spec"]["secrets"]["signing_key"]
        stored = env.state.sinks["ops"]["spec"]["secrets"]["signing_key"]
        s, b = await call(c, "PUT", "/v1/sinks/ops", BOOT, dict(HOOK, secrets={"signing_key": redacted}))
        assert s == 200 and env.state.sinks["ops"]["spec"]["secrets"]["signing_key"] == stored, b
        assert isinstance(stored, bytes)  # sealed at rest
        s, b = await call(c, "PUT", "/v1/sinks/ops", BOOT, dict(HOOK, secrets={"signing_key": "***:00000000"}))
        assert s == 422 and b["error"]["field"] == "secrets.signing_key", b
        s, b = await call(c, "PUT", "/v1/sinks/ops", BOOT, dict(HOOK, retry={"max_attempts": 99}))
        assert s == 422 and b["error"]["field"] == "retry.max_attempts", b
    run(t)


def test_tenant_default_routes_and_health_on_the_job_view():
    async def t(env, c):
        s, b = await call(c, "PUT", "/v1/tenants/billing", BOOT, {"rate_per_s": 5, "notify": [{"sink": 7}]})
        assert s == 422 and b["error"]["field"] == "notify[0].sink", b
        assert env.state.tenant_notify == {} and "billing" not in env.state.tenants  # nothing changed
        s, b = await call(c, "PUT", "/v1/tenants/billing", BOOT, {"notify": [{"sink": "ops", "on": ["run.dead"]}]})
        assert s == 200 and b["notify"][0]["after_consecutive"] == 1, b
        s, b = await call(c, "GET", "/v1/tenants/billing", BOOT)
        assert b["notify"] == [{"sink": "ops", "on": ["run.dead"], "after_consecutive": 1, "repeat_every_s": 0}], b
        s, b = await call(c, "PUT", "/v1/jobs/j", BOOT, SPEC)
        s, b = await call(c, "GET", "/v1/jobs/j", BOOT)
        assert b["health"] == {"last_success_at": None, "last_failure_at": None, "consecutive_failures": 0,
                               "last_slot_outcome": None, "incident": None}, b
    run(t)


def _receiver(status: list[int]):
    got: list[tuple[dict, bytes]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append((dict(request.headers), await request.read()))
        return web.json_response({}, status=status[0])
    app = web.Application()
    app.router.add_post("/{tail:.*}", hook)
    return app, got


async def _until(cond, what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # ok-sleep: polling inside a bounded loop


def test_an_outage_is_waited_out_in_order_and_a_refusal_is_not(monkeypatch):
    """A sink that cannot take events (HTTP 503, then no one listening) did put each event in
    its dead list after its attempts (8 by default, some four minutes): an outage of half an
    hour lost the events of its first minutes to a dead list nobody re-drives. Past its
    attempts an event whose sink cannot be reached is retried for retry.outage_s, the events
    after it waiting, and all are delivered in order once it answers; the outage is a gauge
    meanwhile. Past outage_s it is dead, as a refusal is after its attempts."""
    monkeypatch.setattr(limits, "sink_outage_wait_s_min", 0.01)

    async def t(env, c):
        status = [503]
        app, got = _receiver(status)
        async with TestServer(app, host="127.0.0.1") as srv:
            s, b = await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{srv.port}/hook", "secrets": {"signing_key": "k"},
                "retry": {"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0, "outage_s": 600}})
            assert s == 201 and b["spec"]["retry"]["outage_s"] == 600, b
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "hook",
                                                                                  "on": ["job.triggered"]}])))[0] == 201
            for _ in range(2):
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            notifier = Notifier(env.raft, env.clock, env.service.keyring)
            reg = CollectorRegistry()
            reg.register(notifier.collector())
            # A node that does not deliver (a follower; the leader after a fail-over) reads the
            # same replicated state: what the sink was not sent, and how long it has waited.
            other = CollectorRegistry()
            other.register(Notifier(env.raft, env.clock, env.service.keyring).collector())
            text = generate_latest(other).decode()
            assert 'raftsched_sink_pending_events{sink="hook"} 2.0' in text, text
            assert 'raftsched_sink_dead_events{sink="hook"} 0.0' in text
            assert 'raftsched_sink_events_given_up_total{sink="hook"} 0.0' in text
            # (an on-call walk: these appeared with their first count, which increase() cannot see)
            assert 'raftsched_event_attempts_failed_total{sink="hook"} 0.0' in text
            assert 'raftsched_events_lost_total{sink="hook"} 0.0' in text
            task = asyncio.ensure_future(notifier.run_while_leading())
            try:
                await _until(lambda: len(got) >= 6, "tries past the attempts")
                assert not env.state.sinks["hook"]["dead"]
                assert {json.loads(b)["event_id"] for _, b in got} == {"ev-1"}  # the second waits behind
                assert 'raftsched_sink_unreachable_seconds{sink="hook"}' in generate_latest(reg).decode()
                env.clock.advance(90_000)
                text = generate_latest(other).decode()
                assert 'raftsched_sink_pending_events{sink="hook"} 2.0' in text
                assert sample(text, "raftsched_sink_oldest_pending_seconds", sink="hook") >= 90, text
                status[0] = 200
                await _until(lambda: env.state.sinks["hook"]["cursor"] == env.state.outbox.seq, "the cursor")
                assert [json.loads(b)["event_id"] for _, b in got if b][-2:] == ["ev-1", "ev-2"]
                assert not env.state.sinks["hook"]["dead"]
                assert "raftsched_sink_unreachable_seconds{" not in generate_latest(reg).decode()
                text = generate_latest(other).decode()
                assert 'raftsched_sink_pending_events{sink="hook"} 0.0' in text
                assert 'raftsched_sink_oldest_pending_seconds{sink="hook"} 0.0' in text
                # An outage longer than outage_s: the event is dead then, with every attempt counted.
                status[0] = 502
                n = len(got)
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
                await _until(lambda: len(got) >= n + 3, "tries past the attempts")
                env.clock.advance(601_000)
                await _until(lambda: env.state.sinks["hook"]["dead"], "the dead event")
                d = env.state.sinks["hook"]["dead"][0]
                assert d["error"] == "HTTP 502" and d["attempts"] >= 3, d
                # The outage is the sink's, not the event's: the next event, the sink still down,
                # is dead after its attempts (not another outage_s), and the gauge goes on.
                n = len(got)
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
                await _until(lambda: len(env.state.sinks["hook"]["dead"]) == 2, "the second dead event")
                assert 'raftsched_sink_dead_events{sink="hook"} 2.0' in generate_latest(other).decode()
                assert 'raftsched_sink_events_given_up_total{sink="hook"} 2.0' in generate_latest(other).decode()
                assert env.state.sinks["hook"]["dead"][1]["attempts"] == 2 and len(got) == n + 2
                assert 'raftsched_sink_unreachable_seconds{sink="hook"} 601' in generate_latest(reg).decode()
                # A refusal is dead after its attempts, outage_s or not.
                status[0] = 403
                n = len(got)
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
                await _until(lambda: len(env.state.sinks["hook"]["dead"]) == 3, "the refused event")
                assert env.state.sinks["hook"]["dead"][2]["attempts"] == 2 and len(got) == n + 2
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    run(t)


def test_what_a_batch_delivered_before_an_outage_is_committed_before_it_is_waited_out(monkeypatch):
    """A batch's cursor was committed at its end only: an outage waited out for a day on its
    third event left the two delivered before it uncommitted, sent again by a new leader. They
    are committed before the wait, and the events after the stuck one wait behind it."""
    monkeypatch.setattr(limits, "sink_outage_wait_s_min", 0.01)

    async def t(env, c):
        got: list[str] = []
        down = {"ev-3"}

        async def hook(request: web.Request) -> web.Response:
            ev = json.loads(await request.read())["event_id"]
            got.append(ev)
            return web.json_response({}, status=503 if ev in down else 200)
        app = web.Application()
        app.router.add_post("/{tail:.*}", hook)
        async with TestServer(app, host="127.0.0.1") as srv:
            assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{srv.port}/", "secrets": {"signing_key": "k"},
                "retry": {"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0}}))[0] == 201
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "hook",
                                                                                  "on": ["job.triggered"]}])))[0] == 201
            for _ in range(4):
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            notifier = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(notifier.run_while_leading())
            try:
                await _until(lambda: got.count("ev-3") >= 4, "tries past the attempts")
                assert env.state.sinks["hook"]["cursor"] == 2 and got[:2] == ["ev-1", "ev-2"]
                assert "ev-4" not in got
                down.clear()
                await _until(lambda: env.state.sinks["hook"]["cursor"] == env.state.outbox.seq, "the cursor")
                assert got.count("ev-1") == 1 and got[-2:] == ["ev-3", "ev-4"]
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    run(t)


def test_a_refusal_ends_an_outage(monkeypatch):
    """A review: only a delivery ended an outage, so a sink that answered with a refusal, and
    hours later was down for a minute, had that minute measured from the old outage: its event
    went dead after its attempts, not waited out."""
    monkeypatch.setattr(limits, "sink_outage_wait_s_min", 0.01)

    async def t(env, c):
        status = [503]
        app, got = _receiver(status)
        async with TestServer(app, host="127.0.0.1") as srv:
            assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{srv.port}/", "secrets": {"signing_key": "k"},
                "retry": {"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0, "outage_s": 3600}}))[0] == 201
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "hook",
                                                                                  "on": ["job.triggered"]}])))[0] == 201
            notifier = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(notifier.run_while_leading())
            try:
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
                await _until(lambda: len(got) >= 1, "the first attempt")
                status[0] = 400  # then it answers: a refusal
                await _until(lambda: env.state.sinks["hook"]["dead"], "the refused event")
                env.clock.advance(7_200_000)  # two hours later, down again
                status[0] = 503
                n = len(got)
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
                await _until(lambda: len(got) >= n + 4, "tries past the attempts")
                assert len(env.state.sinks["hook"]["dead"]) == 1  # waited out, not dead
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    run(t)


def test_delivery_signs_webhooks_formats_slack_and_keeps_what_a_sink_refuses():
    async def t(env, c):
        status = [400]  # a refusal (not an outage: that is waited out, test_an_outage_...)
        app, got = _receiver(status)
        async with TestServer(app, host="127.0.0.1") as srv:
            base = f"http://127.0.0.1:{srv.port}"
            s, b = await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": base + "/hook", "secrets": {"signing_key": "k"},
                "retry": {"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0}})
            assert s == 201, b
            s, b = await call(c, "PUT", "/v1/sinks/chat", BOOT, {
                "type": "slack", "secrets": {"url": base + "/slack"}, "link": "https://rs.example"})
            assert s == 201, b
            job = dict(SPEC, notify=[{"sink": "hook", "on": ["job.triggered"]}, {"sink": "chat", "on": ["job.paused"]}])
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, job))[0] == 201
            assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            notifier = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(notifier.run_while_leading())
            try:
                # The webhook answers 400: two attempts, then the event is in the sink's dead list.
                await _until(lambda: env.state.sinks["hook"]["dead"], "the dead event")
                s, b = await call(c, "GET", "/v1/sinks/hook/dead", BOOT)
                assert s == 200 and b["dead"][0]["error"] == "HTTP 400" and b["dead"][0]["attempts"] == 2, b
                event_id = b["dead"][0]["event"]["event_id"]
                assert len(got) == 2 and {h["Idempotency-Key"] for h, _ in got} == {event_id}
                for h, body in got:
                    want = "sha256=" + hmac.new(b"k", h["X-Raftsched-Timestamp"].encode() + b"." + body,
                                                hashlib.sha256).hexdigest()
                    assert h["X-Raftsched-Signature"] == want == sign("k", h["X-Raftsched-Timestamp"], body)
                status[0] = 200
                s, b = await call(c, "POST", "/v1/sinks/hook/dead:requeue", BOOT, {})
                assert s == 200 and b["requeued"] == 1, b
                await _until(lambda: len(got) == 3 and not env.state.sinks["hook"]["redo"], "the redelivery")
                assert json.loads(got[2][1])["event_id"] == event_id
                assert (await call(c, "POST", "/v1/jobs/j/pause", BOOT))[0] == 200
                await _until(lambda: any(h.get("Content-Type", "").startswith("application/json")
                                         and b"job.paused" in body and b"text" in body for h, body in got), "slack")
                text = json.loads(got[-1][1])["text"]
                assert text.startswith("job.paused: job j (default)") and "<https://rs.example/v1/jobs/j|j>" in text
                await _until(lambda: env.state.sinks["chat"]["cursor"] == env.state.outbox.seq, "the cursor")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            reg = CollectorRegistry()
            reg.register(notifier.collector())
            text = generate_latest(reg).decode()
            assert 'raftsched_events_delivered_total{kind="job.triggered",sink="hook"} 1.0' in text
            assert 'raftsched_events_dead_total{kind="job.triggered",sink="hook"} 1.0' in text
            assert "raftsched_event_delivery_seconds_count 2.0" in text
            assert "raftsched_job_consecutive_failures" in text and 'job="j"' not in text  # not opted in
            assert (await call(c, "PUT", "/v1/jobs/m", BOOT, dict(SPEC, metrics=True)))[0] == 201
            assert 'raftsched_job_consecutive_failures{job="m"} 0.0' in generate_latest(reg).decode()
            # Deleted while this notifier delivers no more (an SRE's walk: a node that had led,
            # a follower now, kept the deleted sink's series until it led again).
            assert (await call(c, "DELETE", "/v1/sinks/hook", BOOT))[0] == 200
            assert 'sink="hook"' not in generate_latest(reg).decode()
    run(t)


def test_one_line_reads_as_a_sentence():
    body = {"kind": "run.dead", "job": "nightly", "tenant": "default", "slot": 1_780_000_000_000, "attempt": 3,
            "reason": "exit status 1", "consecutive_failures": 2}
    assert one_line(body) == ("run.dead: job nightly (default), slot 2026-05-28T20:26:40.000Z, attempt 3, "
                              "consecutive failures 2: exit status 1")
    assert commands.sink_progress(0, items=[])["op"] == "sink_progress"
    # An SRE's walk: a deadline's line did not say which deadline, nor when it was.
    miss = {"kind": "deadline.missed", "job": "stale", "tenant": "default", "slot": None, "reason": "no_slot",
            "deadline": "max_since_success_s", "instant": 1_780_000_000_000, "cause": "no_slot"}
    assert one_line(miss) == ("deadline.missed: job stale (default), its max_since_success_s at "
                              "2026-05-28T20:26:40.000Z: no_slot")




@contextlib.contextmanager
def _mailbox():
    """A local SMTP server (127.0.0.1, a free port) and a function that mails it one event through
    an email sink, with the notifier's clock at ``now_ms``, and returns the message received."""
    import email
    import email.policy

    from aiosmtpd.controller import Controller

    from raftsched.core.notify_model import validate_sink
    from raftsched.testing.procs import free_ports

    mails = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            mails.append(envelope.content)
            return "250 OK"

    port = free_ports(1)[0]
    ctl = Controller(Handler(), hostname="127.0.0.1", port=port)
    ctl.start()
    spec = validate_sink("m", {"type": "email", "retry": {"max_attempts": 1},
                               "smtp": {"host": "127.0.0.1", "port": port, "starttls": False,
                                        "from": "r@example.com", "to": ["o@example.com"]}})

    def mail(reason: str, now_ms: int = 2):
        n = Notifier(raft=None, clock=type("C", (), {"now_ms": staticmethod(lambda: now_ms)})(), keyring=None,
                     proposer=object())
        ev = {"seq": 1, "kind": "run.dead", "at": 1, "job": "j", "tenant": "default", "slot": 1, "run_id": "j@1",
              "attempt": 1, "reason": reason, "detail": {}, "to": ["m"]}
        assert asyncio.run(n._deliver("m", spec, {}, ev)) == (True, None, 1)
        return email.message_from_bytes(mails[-1], policy=email.policy.default)
    try:
        yield mail
    finally:
        ctl.stop()


def test_an_event_whose_reason_has_line_breaks_is_mailed_with_a_one_line_subject():
    """A worker's error is often a traceback: the email's subject (and the other sinks' line)
    is one line, and the body's JSON keeps the reason whole."""
    reason = "Traceback (most recent call last):\r\n  File \"x\", line 1\nValueError: boom\x0b\u2028!"
    with _mailbox() as mail:
        msg = mail(reason)
        assert msg["Subject"].endswith("Traceback (most recent call last): File \"x\", line 1 ValueError: boom !")
        text = msg.get_content()
        assert json.loads(text[text.index("{"):])["reason"] == reason
    assert one_line({"kind": "run.failed", "reason": "a\r\n\tb"}) == "run.failed: a b"
    # A slot refused by its tenant's policy says which rule (a user's walk: the mail said "policy").
    assert one_line({"kind": "slot.missed", "job": "j", "reason": "policy",
                     "error": "executor.type shell is not allowed for tenant acme"}) == \
        "slot.missed: job j: policy (executor.type shell is not allowed for tenant acme)"


def test_a_mailed_event_carries_the_send_time_as_its_date_header():
    """RFC 5322 requires a Date: header, and smtplib adds none: the message carries the time the
    notifier sent it (its clock), in UTC, parseable by a mail reader."""
    from datetime import datetime, timezone
    from email.utils import parsedate_to_datetime

    sent_ms = 1_780_000_000_123  # the event's own time (at) is another: the Date is the send's
    with _mailbox() as mail:
        msg = mail("boom", sent_ms)
        assert len(msg.get_all("Date") or []) == 1, msg
        when = parsedate_to_datetime(str(msg["Date"]))
        assert when == datetime(2026, 5, 28, 20, 26, 40, tzinfo=timezone.utc), msg["Date"]
        assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0, msg["Date"]  # UTC, not local


def test_a_sink_replaced_while_its_batch_is_retried_is_sent_it_with_the_new_spec():
    """The operator moves a failing sink (old host gone, key rotated): the retries of the batch
    under way stop, and its events go to the new URL signed with the new key; the old URL's
    refusals are no dead events of the new sink."""
    async def t(env, c):
        app1, got1 = _receiver([500])
        app2, got2 = _receiver([200])
        async with TestServer(app1, host="127.0.0.1") as s1, TestServer(app2, host="127.0.0.1") as s2:
            retry = {"max_attempts": 4, "backoff_s": 30}
            assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{s1.port}/", "secrets": {"signing_key": "OLD"},
                "retry": retry}))[0] == 201
            job = dict(SPEC, notify=[{"sink": "hook", "on": ["job.triggered"]}])
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, job))[0] == 201
            assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            n = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(n.run_while_leading())
            try:
                await _until(lambda: len(got1) == 1, "the first attempt")
                s, b = await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                    "type": "webhook", "url": f"http://127.0.0.1:{s2.port}/", "secrets": {"signing_key": "NEW"},
                    "retry": retry})
                assert s == 200, b
                await _until(lambda: env.state.sinks["hook"]["cursor"] == env.state.outbox.seq, "the cursor")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            assert len(got1) == 1 and len(got2) == 1 and env.state.sinks["hook"]["dead"] == []
            h, body = got2[0]
            assert h["X-Raftsched-Signature"] == sign("NEW", h["X-Raftsched-Timestamp"], body)
            assert json.loads(body)["kind"] == "job.triggered"
    run(t)


def test_a_key_rotations_reseal_does_not_restart_a_batch_in_delivery(tmp_path):
    """A re-seal changes the sealed bytes (so the sink's generation) but not one value delivery
    sends with: the batch under way goes on, and an event it had delivered is not sent again.
    A change of a value in clear still restarts it (the test above)."""
    from raftsched import sealing
    from raftsched.node.notify import _place

    async def t(env, c):
        statuses = [200, 500]  # the first event accepted, the second refused once, then 200
        got: list[bytes] = []

        async def hook(request: web.Request) -> web.Response:
            got.append(await request.read())
            return web.json_response({}, status=statuses.pop(0) if statuses else 200)
        app = web.Application()
        app.router.add_post("/{tail:.*}", hook)
        sealing.new_key_file(str(tmp_path / "keys"), "k1")
        ring = env.service.keyring = sealing.KeyRing.load(str(tmp_path / "keys"))
        async with TestServer(app, host="127.0.0.1") as srv:
            assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{srv.port}/", "secrets": {"signing_key": "K"},
                "retry": {"max_attempts": 3, "backoff_s": 1}}))[0] == 201
            job = dict(SPEC, notify=[{"sink": "hook", "on": ["job.triggered"]}])
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, job))[0] == 201
            for _ in range(2):
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            n = Notifier(env.raft, env.clock, ring)
            task = asyncio.ensure_future(n.run_while_leading())
            try:
                await _until(lambda: len(got) == 2, "the first event, and the second's refused attempt")
                stored = env.state.sinks["hook"]["spec"]["secrets"]
                sealing.new_key_file(str(tmp_path / "keys"), "k2")
                ring.reload()
                fp = sealing.fingerprint_of(stored["signing_key"])
                resealed = ring.seal("k2", "K", fp, _place("hook", "signing_key"))
                assert resealed != stored["signing_key"]
                r = await env.service.propose(commands.sink_reseal(
                    env.clock.now_ms(), None, items=[["hook", dict(stored), {"signing_key": resealed}]]))
                assert r["resealed"] == 1, r
                await _until(lambda: env.state.sinks["hook"]["cursor"] == env.state.outbox.seq, "the cursor")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            seqs = [json.loads(b)["event_id"] for b in got]
            assert len(seqs) == 3 and seqs[1] == seqs[2] and seqs[0] != seqs[1], seqs
            assert env.state.sinks["hook"]["dead"] == []
    run(t)


def test_a_sink_moved_to_another_tenant_is_sent_none_of_the_old_tenants_events():
    async def t(env, c):
        from raftsched.core.bodies import validate_policy
        for ten in ("a", "b"):
            env.state.tenant_policies[ten] = validate_policy({"executors": ["shell", "http"],
                                                             "network": {"allow": ["127.0.0.0/8"]}})
        app1, got1 = _receiver([500])
        app2, got2 = _receiver([200])
        b_reader = (await new_token(c, "reader", tenants=["b"]))["token"]
        async with TestServer(app1, host="127.0.0.1") as s1, TestServer(app2, host="127.0.0.1") as s2:
            assert (await call(c, "PUT", "/v1/sinks/s", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{s1.port}/", "tenant": "a",
                "secrets": {"signing_key": "k"}, "retry": {"max_attempts": 1, "outage_s": 0}}))[0] == 201
            for ten in ("a", "b"):
                s, b = await call(c, "PUT", f"/v1/jobs/{ten}-job", BOOT,
                                  dict(SPEC, tenant=ten, notify=[{"sink": "s", "on": ["job.triggered"]}]))
                assert s == 201, b
            assert (await call(c, "POST", "/v1/jobs/a-job/trigger", BOOT))[0] == 201
            n = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(n.run_while_leading())
            try:
                await _until(lambda: env.state.sinks["s"]["dead"], "the dead event")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            assert (await call(c, "POST", "/v1/jobs/a-job/trigger", BOOT))[0] == 201  # not delivered yet
            s, b = await call(c, "PUT", "/v1/sinks/s", BOOT, {
                "type": "webhook", "url": f"http://127.0.0.1:{s2.port}/", "tenant": "b", "secrets": {"signing_key": "k2"}})
            assert s == 200, b
            s, b = await call(c, "GET", "/v1/sinks/s/dead", b_reader)
            assert s == 200 and b["dead"] == [], b
            assert (await call(c, "POST", "/v1/jobs/b-job/trigger", BOOT))[0] == 201
            task = asyncio.ensure_future(n.run_while_leading())
            try:
                await _until(lambda: env.state.sinks["s"]["cursor"] == env.state.outbox.seq, "the cursor")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            assert [json.loads(body)["job"] for _, body in got2] == ["b-job"]
    run(t)


def test_the_counters_of_a_deleted_sink_are_dropped_and_refused_attempts_are_exported():
    """A cluster that makes and deletes sinks under new names must not grow the leader's counters
    (and /metrics' series) for good; refused attempts, retried ones included, are a series."""
    names = ["kept"]

    class Raft:
        def read(self, fn, *a):
            return list(names) if fn.__name__ == "sink_names" else None  # (no batch: loops end)
    n = Notifier(raft=Raft(), clock=type("C", (), {"now_ms": staticmethod(lambda: 1)})(), keyring=None)
    for sink in ("kept", "gone"):
        n.delivered[(sink, "run.dead")] += 1
        n.dead[(sink, "run.dead")] += 1
        n.attempts_failed[sink] += 2
        n.lost[sink] += 3
        n._lost_at[sink] = 4

    async def look():
        tasks: dict = {}
        await n._supervise(tasks)
        await asyncio.gather(*tasks.values())
    asyncio.run(look())
    assert set(n.delivered) == set(n.dead) == {("kept", "run.dead")}
    assert set(n.attempts_failed) == set(n.lost) == set(n._lost_at) == {"kept"}
    n.raft = type("R", (), {"read": staticmethod(lambda fn, *a: list(names) if fn.__name__ == "sink_names"
                                                  else {"seq": 0, "held": {}, "sinks": {}, "given_up": {}} if fn.__name__ == "outbox_counts"
                                                  else [])})()
    n.attempts_failed["kept"] += 2
    reg = CollectorRegistry()
    reg.register(n.collector())
    assert 'raftsched_event_attempts_failed_total{sink="kept"} 4.0' in generate_latest(reg).decode()
    names.clear()
    asyncio.run(look())
    assert not (n.delivered or n.dead or n.attempts_failed or n.lost or n._lost_at)
    assert 'sink="kept"' not in generate_latest(reg).decode()


def test_delivery_skips_an_event_of_a_tenant_the_sink_is_not_limited_to():
    """A batch read (or a requeued event kept) from before a sink's tenant changed is not sent."""
    sent = []
    n = Notifier(raft=None, clock=type("C", (), {"now_ms": staticmethod(lambda: 1)})(), keyring=None)
    spec = {"type": "webhook", "url": "http://127.0.0.1:9/", "tenant": "b", "secrets": {"signing_key": "k"},
            "retry": {"max_attempts": 1, "backoff_s": 0, "backoff_max_s": 0}}
    ev = {"seq": 1, "kind": "job.triggered", "at": 1, "job": "a-job", "tenant": "a", "slot": 1, "run_id": "a-job@1",
          "attempt": None, "reason": None, "detail": {}, "to": ["s"]}
    batches = [{"spec": spec, "gen": 1, "redo": [ev], "events": [dict(ev, seq=2)], "upto": 2, "cursor": 0,
                "first": 1}, None]

    class Raft:
        def read(self, fn, *a):
            return batches.pop(0) if fn.__name__ == "sink_batch" else 1

    async def deliver(*a, **k):
        sent.append(a)
        return True, None, 1

    async def commit(*a):
        sent.append(("commit",) + a)
    n.raft, n._deliver, n._commit = Raft(), deliver, commit  # type: ignore[method-assign]
    asyncio.run(n._sink_loop("s"))
    assert sent == [("commit", "s", 2, [1], [], 0, 1)]


def test_a_batch_of_large_dead_events_is_committed_in_commands_that_fit():
    sent = []

    class Proposer:
        async def propose(self, cmd):
            sent.append((len(commands.encode(cmd)), cmd["items"][0]))  # encode refuses a command too large
            return {"ok": True}

    n = Notifier(raft=None, clock=type("C", (), {"now_ms": staticmethod(lambda: 1)})(), keyring=None,
                 proposer=Proposer())
    dead = [{"event": {"seq": k, "kind": "worker.lost", "detail": {"runs": ["x" * 60] * 150}}, "error": "e" * 300,
             "attempts": 8} for k in range(1, 41)]
    dead.append({"event": {"seq": 41, "kind": "run.dead", "detail": {"blob": "y" * 40_000}}, "error": None,
                 "attempts": 8})
    asyncio.run(n._commit("ops", 41, [3], dead, before=0))
    assert len(sent) > 1 and sent[-1][1]["cursor"] == 41 and sent[-1][1]["redo"] == [3]
    assert all(item["cursor"] == 0 for _, item in sent[:-1])  # the cursor moves last
    assert [d["event"]["seq"] for _, item in sent for d in item.get("dead", [])] == list(range(1, 42))


def test_a_tenants_sink_reaches_only_what_its_network_policy_allows(tmp_path, monkeypatch):
    """An email sink limited to a tenant connects to its SMTP server only at an address the
    tenant's policy allows (a real aiosmtpd server with STARTTLS and AUTH on loopback), and a
    webhook the same: loopback is refused by default."""
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    from raftsched.core.bodies import validate_policy
    from raftsched.core.notify_model import validate_sink
    from raftsched.testing.procs import free_ports
    from raftsched.testing.tls import make_demo_pki

    pki = make_demo_pki(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    mails = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            mails.append(envelope.content)
            return "250 OK"

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki.cert), str(pki.key))
    port = free_ports(1)[0]
    smtp = Controller(Handler(), hostname="127.0.0.1", port=port, tls_context=ctx, require_starttls=True,
                      authenticator=lambda *a: AuthResult(success=a[4].password == b"pw"), auth_require_tls=True)
    smtp.start()
    try:
        async def t(env, c):
            n = Notifier(env.raft, env.clock, env.service.keyring)
            mail = validate_sink("m", {"type": "email", "tenant": "billing", "secrets": {"username": "u", "password": "pw"},
                                       "smtp": {"host": "127.0.0.1", "port": port, "from": "r@example.com",
                                                "to": ["o@example.com"]}})
            hook = validate_sink("h", dict(HOOK, tenant="billing"))
            ev = {"seq": 1, "kind": "run.dead", "at": 1, "job": "j", "tenant": "billing", "slot": 1, "run_id": "j@1",
                  "attempt": 1, "reason": "x", "detail": {}, "to": ["m"]}
            secrets = {"username": "u", "password": "pw"}
            why = await n._send("m", mail, secrets, ev)
            assert why is not None and "refused by the network policy of tenant 'billing'" in why and not mails
            why = await n._send("h", hook, {"signing_key": "k"}, ev)
            assert why is not None and "refused by the network policy" in why
            env.state.tenant_policies["billing"] = validate_policy({"network": {"allow": ["127.0.0.0/8"]}})
            assert await n._send("m", mail, secrets, ev) is None and len(mails) == 1
            assert b"Subject: [raftsched] run.dead: job j (billing)" in mails[0]
        run(t)
    finally:
        smtp.stop()


def test_a_sink_further_behind_than_the_outbox_holds_is_told_so(monkeypatch):
    from raftsched.core import limits

    monkeypatch.setattr(limits, "outbox_events_max", 2)

    async def t(env, c):
        app, got = _receiver([200])
        async with TestServer(app, host="127.0.0.1") as srv:
            assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, dict(HOOK, url=f"http://127.0.0.1:{srv.port}/")))[0] == 201
            assert (await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "hook", "on": ["job.triggered"]}])))[0] == 201
            for _ in range(5):
                assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
            n = Notifier(env.raft, env.clock, env.service.keyring)
            task = asyncio.ensure_future(n.run_while_leading())
            try:
                await _until(lambda: len(got) == 2, "the two events the outbox still holds")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            assert n.lost == {"hook": 3} and [json.loads(b)["seq"] for _, b in got] == [4, 5]
    run(t)


SLACK_SECRET = "T0AAAAAAA/B0BBBBBBB/xoxb-do-not-show-0123456789"


def test_a_sink_url_delivery_could_not_parse_is_refused_at_put_naming_the_field():
    async def t(env, c):
        for body, field in (
                (dict(HOOK, url="http://127.0.0.1:99999/"), "url"),
                (dict(HOOK, url="http://127.0.0.1:0/"), "url"),
                (dict(HOOK, url="http://127.1/"), "url"),
                (dict(HOOK, url="http://a..b/"), "url"),
                (dict(HOOK, url="http://h:+80/"), "url"),
                (dict(HOOK, url="https://[::1]@/"), "url"),
                (dict(HOOK, url="http://h\\x/"), "url"),
                (dict(HOOK, link="http://h:70000/"), "link"),
                ({"type": "slack", "secrets": {"url": f"https://hooks.example.com:99999/services/{SLACK_SECRET}"}},
                 "secrets.url"),
                ({"type": "slack", "secrets": {"url": f"https://hooks.example.com:8x/services/{SLACK_SECRET}"}},
                 "secrets.url")):
            s, b = await call(c, "PUT", "/v1/sinks/s", BOOT, body)
            assert s == 422 and b["error"]["field"] == field, (body, b)
            assert SLACK_SECRET not in json.dumps(b), "the message never shows the value"
        assert env.state.sinks == {}, "nothing was stored"
        for ok in ("http://127.0.0.1:65535/x", "http://[::1]:8080/", "https://h.example./p?q=1"):
            s, b = await call(c, "PUT", "/v1/sinks/s", BOOT, dict(HOOK, url=ok))
            assert s in (200, 201), (ok, b)
    run(t)


def test_a_user_or_password_in_a_sink_url_shown_to_readers_is_refused_naming_the_field():
    """A webhook's ``url`` and every sink's ``link`` are read back as they are by anyone who may
    read the sink: credentials in them would be shown to all. Only ``secrets.url`` (sealed, read
    redacted) may carry them."""
    async def t(env, c):
        for body, field in ((dict(HOOK, url="https://bob:hunter2@hooks.example.com/x"), "url"),
                            (dict(HOOK, url="https://bob@hooks.example.com/x"), "url"),
                            (dict(HOOK, link="https://bob:hunter2@ui.example.com"), "link")):
            s, b = await call(c, "PUT", "/v1/sinks/s", BOOT, body)
            assert s == 422 and b["error"]["field"] == field, (body, b)
            assert "hunter2" not in json.dumps(b), "the message never shows the value"
        assert env.state.sinks == {}, "nothing was stored"
        s, b = await call(c, "PUT", "/v1/sinks/chat", BOOT, {
            "type": "slack", "secrets": {"url": f"https://bob:hunter2@hooks.example.com/services/{SLACK_SECRET}"}})
        assert s in (200, 201), b
        s, b = await call(c, "GET", "/v1/sinks/chat", BOOT)
        assert s == 200 and "hunter2" not in json.dumps(b), b
    run(t)


async def _slack_sink_told_of_a_trigger(env, c, url: str, attempts: int) -> None:
    """A slack sink ``chat`` of secret ``url`` (sealed as the API seals it, but put as a command:
    the API would refuse a URL delivery cannot parse), and job j's trigger routed to it."""
    from raftsched import sealing
    spec = {"type": "slack", "retry": {"max_attempts": attempts, "backoff_s": 0, "backoff_max_s": 0},
            "secrets": {"url": url}}
    svc = env.service
    spec = sealing.seal_spec(spec, "sink:chat", svc.keyring, await svc.seal_key(), svc.fingerprint.digest)
    assert (await svc.propose(commands.put_sink(env.clock.now_ms(), None, name="chat", spec=spec)))["ok"]
    job = dict(SPEC, notify=[{"sink": "chat", "on": ["job.triggered"]}])
    assert (await call(c, "PUT", "/v1/jobs/j", BOOT, job))[0] == 201
    assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201


def test_a_delivery_error_never_holds_a_sinks_secret_url_nor_secret_values(caplog):
    """A slack sink stored with a URL delivery cannot parse (by a version that let one through,
    or an apply of a hand-made command): aiohttp's InvalidUrlClientError names the whole URL,
    which is the sink's secret. The dead list (any reader's) and the log show the class and the
    host only."""
    from raftsched.core import limits

    async def t(env, c):
        svc = env.service
        await _slack_sink_told_of_a_trigger(env, c, f"https://hooks.example.com:99999/services/{SLACK_SECRET}", 2)
        notifier = Notifier(env.raft, env.clock, svc.keyring)
        task = asyncio.ensure_future(notifier.run_while_leading())
        try:
            await _until(lambda: env.state.sinks["chat"]["dead"], "the dead event")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        reader = (await new_token(c, "reader"))["token"]
        s, b = await call(c, "GET", "/v1/sinks/chat/dead", reader)
        assert s == 200 and b["dead"][0]["error"] == "InvalidUrlClientError (host hooks.example.com)", b
        assert SLACK_SECRET not in json.dumps(b) and "xoxb" not in caplog.text
        assert "gave up event" in caplog.text and "InvalidUrlClientError (host hooks.example.com)" in caplog.text
        assert limits.sinks_max  # (the module is the one apply reads)
    with caplog.at_level("WARNING", logger="raftsched.notify"):
        run(t)


def test_a_dead_event_stored_with_a_secret_in_its_error_shows_none_of_it_when_read():
    """An older version kept aiohttp's error whole, the slack sink's secret URL in it: the dead
    list masks it again as it is read (it stays in the state until the event is requeued)."""

    async def t(env, c):
        url = f"https://hooks.example.com/services/{SLACK_SECRET}"
        svc = env.service
        await _slack_sink_told_of_a_trigger(env, c, url, 1)
        ev = env.state.outbox.events[-1]
        old = {"event": ev, "error": f"InvalidUrlClientError: {url}", "attempts": 1}
        assert (await svc.propose(commands.sink_progress(env.clock.now_ms(), items=[
            {"sink": "chat", "cursor": ev["seq"], "dead": [old]}])))["ok"]
        reader = (await new_token(c, "reader"))["token"]
        s, b = await call(c, "GET", "/v1/sinks/chat/dead", reader)
        assert s == 200 and b["dead"] and SLACK_SECRET not in json.dumps(b), b
        assert b["dead"][0]["error"].startswith("InvalidUrlClientError: ")
    run(t)


def test_delivery_errors_are_masked_of_the_sinks_secrets_before_they_are_cut():
    from raftsched.node.notify import ERROR_CHARS_MAX, exc_error, scrub

    slack = {"type": "slack"}
    url = f"https://hooks.example.com/services/{SLACK_SECRET}"
    # A message that names the URL as yarl writes it, or only its path, shows neither.
    for shown in (url, url.replace("https://hooks.example.com", "https://hooks.example.com:443"),
                  f"/services/{SLACK_SECRET}", SLACK_SECRET):
        out = scrub(f"OSError: cannot post to {shown}: refused", slack, {"url": url})
        assert "xoxb" not in out and "***" in out, out
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/"}
    key = "whsec-" + "k" * 40
    # A secret that runs across the cut: masked first, so no start of it is left.
    out = scrub("x" * (ERROR_CHARS_MAX - 10) + key, hook, {"signing_key": key})
    assert "whsec" not in out and len(out) <= ERROR_CHARS_MAX
    assert scrub(None, hook, {"signing_key": key}) is None
    assert scrub("HTTP 500", hook, "sink secret signing_key cannot be unsealed") == "HTTP 500"
    # An exception that carries a URL is told by its class and host; others as they are.
    import aiohttp
    from yarl import URL
    assert exc_error(aiohttp.InvalidUrlClientError(url), url) == "InvalidUrlClientError (host hooks.example.com)"
    assert exc_error(aiohttp.NonHttpUrlClientError(URL("ftp://x/" + SLACK_SECRET)), None) == "NonHttpUrlClientError"
    assert exc_error(OSError("connection refused"), url) == "OSError: connection refused"


def test_a_job_routed_to_a_sink_that_does_not_exist_is_accepted_with_a_warning():
    """A user's walk: notify [{sink: "nosuch"}] answered 201 and nothing else, so a typo in a
    sink's name silently turned alerting off. It is still accepted (a sink may be put after its
    jobs), and the answer says which sinks do not exist yet."""
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        s, b = await call(c, "PUT", "/v1/sinks/ops", BOOT, HOOK)
        assert s == 201, b
        s, b = await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "ops"}, {"sink": "opz"}]))
        assert s == 201 and b["warnings"] == [
            "notify: no sink named 'opz' (yet): nothing is told through it until one is put (PUT /v1/sinks/opz)"], b
        s, b = await call(c, "PUT", "/v1/jobs/j", BOOT, dict(SPEC, notify=[{"sink": "ops"}]))
        assert s == 200 and "warnings" not in b, b
        s, b = await call(c, "PUT", "/v1/jobs/k", BOOT, SPEC)
        assert s == 201 and "warnings" not in b, b
    run(t)


def test_a_batch_warns_of_a_route_to_a_sink_that_does_not_exist_on_that_jobs_result():
    """POST /v1/jobs:batch (a crontab import, a sync) said nothing where a PUT of the same job
    warned: a typo in a sink's name turned alerting off for every job of the import. Each job's
    result carries the warnings its PUT would have."""
    async def t(env, c):
        live_worker(env.state, env.clock.now_ms())  # (the warnings here are not the fleet's)
        assert (await call(c, "PUT", "/v1/sinks/ops", BOOT, HOOK))[0] == 201
        jobs = {"a": dict(SPEC, notify=[{"sink": "ops"}, {"sink": "opz"}]), "b": dict(SPEC, notify=[{"sink": "ops"}]),
                "c": SPEC}
        s, b = await call(c, "POST", "/v1/jobs:batch", BOOT, {"jobs": jobs})
        assert s == 200 and b["created"] == 3, b
        assert b["jobs"]["a"]["warnings"] == [
            "notify: no sink named 'opz' (yet): nothing is told through it until one is put (PUT /v1/sinks/opz)"], b
        assert "warnings" not in b["jobs"]["b"] and "warnings" not in b["jobs"]["c"], b
        s, b = await call(c, "POST", "/v1/jobs:batch", BOOT, {"jobs": {"a": jobs["a"]}, "create_only": True})
        assert s == 200 and "warnings" not in b["jobs"]["a"] and b["jobs"]["a"]["error"]["code"] == "conflict", b
    run(t)


def test_a_dead_requeue_names_an_unknown_field_and_refuses_ids_not_dead_in_the_sink():
    """``{"evnts": []}`` is refused naming ``evnts`` (as every body names an unknown field); an id
    that is not one of the sink's dead events is a 404 naming it, whether it was never an event
    or was delivered, and nothing is requeued, not even the dead ids beside it."""
    async def t(env, c):
        svc = env.service
        assert (await call(c, "PUT", "/v1/sinks/hook", BOOT, HOOK))[0] == 201
        job = dict(SPEC, notify=[{"sink": "hook", "on": ["job.triggered"]}])
        assert (await call(c, "PUT", "/v1/jobs/j", BOOT, job))[0] == 201
        for _ in range(2):
            assert (await call(c, "POST", "/v1/jobs/j/trigger", BOOT))[0] == 201
        delivered, dead = list(env.state.outbox.events)[-2:]
        assert (await svc.propose(commands.sink_progress(env.clock.now_ms(), items=[
            {"sink": "hook", "cursor": dead["seq"], "dead": [{"event": dead, "error": "HTTP 500", "attempts": 2}]}])))["ok"]
        dead_id, delivered_id = f"ev-{dead['seq']}", f"ev-{delivered['seq']}"
        before = json.dumps(env.state.sinks["hook"], sort_keys=True, default=repr)
        for body, status, field, named in (
                ({"evnts": []}, 422, "evnts", None),
                ({"events": [dead_id], "force": True}, 422, "force", None),
                ([dead_id], 422, None, None),
                ({"events": ["bogus"]}, 404, "events", "'bogus'"),
                ({"events": [delivered_id]}, 404, "events", repr(delivered_id)),
                ({"events": [dead_id, "ev-999999"]}, 404, "events", "'ev-999999'")):
            s, b = await call(c, "POST", "/v1/sinks/hook/dead:requeue", BOOT, body)
            assert s == status and b["error"]["field"] == field, (body, b)
            assert named is None or named in b["error"]["message"], (body, b)
            assert json.dumps(env.state.sinks["hook"], sort_keys=True, default=repr) == before, "nothing changed"
        s, b = await call(c, "POST", "/v1/sinks/hook/dead:requeue", BOOT, {"events": [dead_id]})
        assert s == 200 and b["requeued"] == 1, b
        s, b = await call(c, "POST", "/v1/sinks/hook/dead:requeue", BOOT, {"events": [dead_id]})
        assert s == 404 and dead_id in b["error"]["message"], b  # requeued: no longer dead
        s, b = await call(c, "POST", "/v1/sinks/hook/dead:requeue", BOOT, {})
        assert s == 200 and b["requeued"] == 0, b  # all of none
    run(t)


def test_sink_fields_that_could_never_work_are_refused_at_put_naming_the_field_and_why():
    """An SMTP host with a port in it (the port is smtp.port) or that is no host name ("-h"), a
    password without the username it logs in with (never sent), a URL host label starting or
    ending with '-': each a 422 naming the field and saying why, and nothing is stored."""
    mail = {"type": "email", "smtp": {"host": "smtp.example.com", "from": "r@example.com", "to": ["o@example.com"]}}

    def with_host(host):
        return dict(mail, smtp=dict(mail["smtp"], host=host))

    async def t(env, c):
        for body, field, why in (
                (with_host("127.0.0.1:25"), "smtp.host", "the port is smtp.port"),
                (with_host("smtp.example.com:587"), "smtp.host", "the port is smtp.port"),
                (with_host("[::1]"), "smtp.host", "brackets"),
                (with_host("-h"), "smtp.host", "not starting or ending with '-'"),
                (with_host("mail-.example.com"), "smtp.host", "not starting or ending with '-'"),
                (with_host("a..example"), "smtp.host", "host name"),
                (with_host("127.1"), "smtp.host", "four numbers"),
                (with_host("fe80::1%eth0"), "smtp.host", "zone"),
                (with_host(""), "smtp.host", "is required"),
                (dict(mail, secrets={"password": "hunter2"}), "secrets.password", "secrets.username"),
                (dict(HOOK, url="https://-a.example/hook"), "url", "not starting or ending with '-'"),
                (dict(HOOK, link="https://ui-.example"), "link", "not starting or ending with '-'")):
            s, b = await call(c, "PUT", "/v1/sinks/s", BOOT, body)
            assert s == 422 and b["error"]["field"] == field and why in b["error"]["message"], (body, b)
            assert "hunter2" not in json.dumps(b)
        assert env.state.sinks == {}, "nothing was stored"
        for i, body in enumerate((with_host("127.0.0.1"), with_host("::1"), with_host("mail_1.example.com."),
                                  with_host("bücher.example"), dict(mail, secrets={"username": "u", "password": "p"}),
                                  dict(mail, secrets={"username": "u"}), dict(HOOK, url="https://a-b.example/hook"))):
            s, b = await call(c, "PUT", f"/v1/sinks/ok{i}", BOOT, body)
            assert s == 201, (body, b)
    run(t)


def test_a_tenants_email_sink_named_by_an_ipv6_address_is_checked_against_its_policy():
    """smtp.host takes an IPv6 address without brackets (as smtplib does); the tenant's network
    check reads it as a URL's host, so it is bracketed there: refused by the policy by default,
    and sent to that address once the policy allows it, never an invalid URL. (No connection is
    made: the address is a literal, and the send itself is replaced.)"""
    from raftsched.core.bodies import validate_policy
    from raftsched.core.notify_model import validate_sink

    async def t(env, c):
        n = Notifier(env.raft, env.clock, env.service.keyring)
        sent = []
        n._send_email = lambda spec, secrets, body, pinned=None: sent.append(pinned)  # type: ignore[method-assign]
        mail = validate_sink("m", {"type": "email", "tenant": "billing", "retry": {"max_attempts": 1},
                                   "smtp": {"host": "::1", "port": 2525, "starttls": False,
                                            "from": "r@example.com", "to": ["o@example.com"]}})
        ev = {"seq": 1, "kind": "run.dead", "at": 1, "job": "j", "tenant": "billing", "slot": 1, "run_id": "j@1",
              "attempt": 1, "reason": "x", "detail": {}, "to": ["m"]}
        why = await n._send("m", mail, {}, ev)
        assert why is not None and "refused by the network policy of tenant 'billing'" in why and not sent, why
        env.state.tenant_policies["billing"] = validate_policy({"network": {"allow": ["::1/128"]}})
        assert await n._send("m", mail, {}, ev) is None and sent == ["::1"]
        # A host stored bracketed (an older check took "[::1]") is not bracketed twice.
        old = dict(mail, smtp=dict(mail["smtp"], host="[::1]"))
        assert await n._send("m", old, {}, ev) is None and sent == ["::1", "::1"], sent
    run(t)


def test_what_an_outage_is_and_what_a_refusal_is():
    """The errors waited out past a sink's attempts (node/notify.py Unreachable): no one
    listening, a 5xx, 408, 429, an SMTP 4xx or a dropped SMTP connection; not a 4xx, an SMTP 5xx,
    a refused recipient or a certificate."""
    import smtplib
    import ssl

    from raftsched.core.notify_model import validate_sink
    from raftsched.node.notify import Unreachable, _smtp_unreachable
    from raftsched.testing.procs import free_port

    async def t(env, c):
        notifier = Notifier(env.raft, env.clock, env.service.keyring)
        spec = validate_sink("s", {"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/",
                                   "secrets": {"signing_key": "k"}})
        ev = {"seq": 1, "kind": "job.triggered", "at": env.clock.now_ms(), "job": "j", "tenant": "default",
              "slot": None, "run_id": None, "attempt": None, "reason": None, "detail": {}, "to": None}
        err = await notifier._send("s", spec, {"signing_key": "k"}, ev)
        assert isinstance(err, Unreachable) and "Connect" in err, err
        for code, down in ((500, True), (503, True), (408, True), (429, True), (400, False), (404, False),
                           (410, False), (501, False), (505, False)):
            app, _ = _receiver([code])
            async with TestServer(app, host="127.0.0.1") as srv:
                err = await notifier._send("s", dict(spec, url=f"http://127.0.0.1:{srv.port}/"), {"signing_key": "k"},
                                           ev)
            assert err == f"HTTP {code}" and isinstance(err, Unreachable) is down, code
    run(t)
    assert _smtp_unreachable(smtplib.SMTPResponseException(451, b"try later"))
    assert _smtp_unreachable(smtplib.SMTPServerDisconnected("gone"))
    assert _smtp_unreachable(ConnectionRefusedError(111, "refused"))
    assert _smtp_unreachable(TimeoutError("timed out"))
    assert _smtp_unreachable(OSError(113, "No route to host"))  # not a ConnectionError
    assert _smtp_unreachable(smtplib.SMTPRecipientsRefused({"a@b": (451, b"4.7.1 greylisted")}))
    assert _smtp_unreachable(ssl.SSLEOFError(8, "EOF in violation of protocol"))
    assert not _smtp_unreachable(smtplib.SMTPResponseException(550, b"no such user"))
    assert not _smtp_unreachable(smtplib.SMTPRecipientsRefused({"a@b": (550, b"no")}))
    assert not _smtp_unreachable(ssl.SSLCertVerificationError("bad certificate"))
    assert not _smtp_unreachable(ValueError("bad header"))


def test_a_sink_stored_without_outage_s_shows_the_default_it_is_delivered_with():
    async def t(env, c):
        s, b = await call(c, "PUT", "/v1/sinks/old", BOOT, {"type": "webhook", "url": "https://example.com/h",
                                                             "secrets": {"signing_key": "k"}})
        assert s == 201 and b["spec"]["retry"]["outage_s"] == limits.sink_outage_s_default, b
        del env.state.sinks["old"]["spec"]["retry"]["outage_s"]  # as an older version stored it
        s, b = await call(c, "GET", "/v1/sinks/old", BOOT)
        assert s == 200 and b["spec"]["retry"]["outage_s"] == limits.sink_outage_s_default, b
    run(t)


def test_a_pagerduty_event_that_reports_no_failure_never_touches_the_failures_incident():
    """An SRE's reading: run.succeeded (or job.paused, job.triggered) routed to a PagerDuty sink
    was a trigger under the job's key, reopening (or adding to) the failure's incident that
    job.recovered resolves. Such an event is an incident of its own kind."""
    from raftsched.node.notify import pagerduty_message
    spec = {"type": "pagerduty", "url": "https://events.example/v2/enqueue"}
    base = {"job": "nightly", "tenant": "t1", "at": 1_780_000_000_000, "slot": 1_780_000_000_000}
    dead = pagerduty_message(spec, "rk", dict(base, kind="run.dead"))
    assert (dead["event_action"], dead["dedup_key"], dead["payload"]["severity"]) == ("trigger", "t1/nightly", "error")
    ok = pagerduty_message(spec, "rk", dict(base, kind="run.succeeded"))
    assert ok["event_action"] == "trigger" and ok["dedup_key"] == "t1/nightly/run.succeeded", ok
    assert ok["payload"]["severity"] == "info"
    assert pagerduty_message(spec, "rk", dict(base, kind="job.recovered")) == {
        "routing_key": "rk", "event_action": "resolve", "dedup_key": "t1/nightly"}


def test_a_pagerduty_worker_lost_is_an_incident_of_its_worker():
    """A walk: every worker.lost was keyed "-/worker.lost", so after the first one (which
    nothing resolves) every other worker's loss folded into that open incident, paging no one."""
    from raftsched.node.notify import pagerduty_message
    spec = {"type": "pagerduty", "url": "https://events.example/v2/enqueue"}
    keys = {pagerduty_message(spec, "rk", {"kind": "worker.lost", "worker": w, "at": 1_780_000_000_000,
                                           "reason": "stopped heartbeating"})["dedup_key"] for w in ("w-1", "w-2")}
    assert keys == {"-/worker.lost/w-1", "-/worker.lost/w-2"}
