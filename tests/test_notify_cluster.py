"""Notifications delivered by real node processes (docs/notifications.md) to real receivers on
loopback: a webhook receiver that verifies every signature, a PagerDuty Events API v2 receiver
that checks the documented schema, and an SMTP server (aiosmtpd) that demands STARTTLS and AUTH.
The leader is killed while events are pending: every event arrives, and an event sent twice
carries the same event_id.

Its own 3-node cluster: the nodes must trust the SMTP server's certificate authority through
their environment (SSL_CERT_FILE), which the shared clusters do not carry.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import signal
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from procs import free_ports, running_cluster, wait_for
from raftsched.testing.tls import make_demo_pki

KEY = "whsec-test-key"
ROUTING_KEY = "r" * 32


class Receiver:
    """A loopback HTTP server recording every POST; ``refuse`` makes it answer 503."""

    def __init__(self, check) -> None:
        self.got: list[tuple[dict, dict]] = []  # (headers, body)
        self.errors: list[str] = []
        self.refuse = False
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                problem = check(headers, data)
                with outer.lock:
                    if problem:
                        outer.errors.append(problem)
                    elif not outer.refuse:
                        outer.got.append((headers, json.loads(data)))
                status = 400 if problem else 503 if outer.refuse else 202
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        with self.lock:
            return [b for _, b in self.got]


def check_webhook(headers: dict, data: bytes) -> str | None:
    """The verification docs/notifications.md shows: HMAC-SHA256 of ``timestamp.body``, and a
    timestamp no older than 5 minutes (a replay is refused)."""
    ts, sig = headers.get("x-raftsched-timestamp", ""), headers.get("x-raftsched-signature", "")
    want = "sha256=" + hmac.new(KEY.encode(), ts.encode() + b"." + data, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(sig, want):
        return f"bad signature {sig!r}"
    if abs(time.time() - int(ts)) > 300:
        return f"stale timestamp {ts}"
    if headers.get("idempotency-key") != json.loads(data)["event_id"]:
        return "Idempotency-Key is not the event id"
    return None


def check_pagerduty(headers: dict, data: bytes) -> str | None:
    """PagerDuty Events API v2 (https://developer.pagerduty.com/docs/events-api-v2/trigger-events/)."""
    m = json.loads(data)
    if m.get("routing_key") != ROUTING_KEY or m.get("event_action") not in ("trigger", "resolve"):
        return f"bad envelope {m}"
    if not isinstance(m.get("dedup_key"), str) or len(m["dedup_key"]) > 255:
        return "bad dedup_key"
    if m["event_action"] == "trigger":
        p = m.get("payload") or {}
        if not (isinstance(p.get("summary"), str) and 0 < len(p["summary"]) <= 1024 and p.get("source")
                and p.get("severity") in ("critical", "error", "warning", "info")):
            return f"bad payload {p}"
    return None


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    tmp = tmp_path_factory.mktemp("notify")
    pki = make_demo_pki(tmp / "smtp-tls")
    mails: list[bytes] = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            mails.append(envelope.content)
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=(auth_data.login, auth_data.password) == (b"notifier", b"pw"))

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki.cert), str(pki.key))
    port = free_ports(1)[0]
    smtp = Controller(Handler(), hostname="127.0.0.1", port=port, tls_context=ctx, require_starttls=True,
                      authenticator=authenticator, auth_require_tls=True)
    smtp.start()
    hook, pd = Receiver(check_webhook), Receiver(check_pagerduty)
    try:
        (tmp / "cluster").mkdir()
        for c in running_cluster(tmp / "cluster", env={"SSL_CERT_FILE": str(pki.ca)}):
            yield c, hook, pd, mails, port
    finally:
        smtp.stop()
        hook.server.shutdown()
        pd.server.shutdown()


def test_webhook_pagerduty_and_email_and_a_leader_killed_with_events_pending(env):
    c, hook, pd, mails, smtp_port = env
    leader = c.wait_leader(30)
    sinks = {
        "hook": {"type": "webhook", "url": hook.url, "secrets": {"signing_key": KEY},
                 "retry": {"max_attempts": 20, "backoff_s": 1, "backoff_max_s": 1}},
        "pager": {"type": "pagerduty", "url": pd.url, "secrets": {"routing_key": ROUTING_KEY},
                  "link": "https://raftsched.example"},
        "mail": {"type": "email", "smtp": {"host": "127.0.0.1", "port": smtp_port, "from": "raftsched@example.com",
                                           "to": ["oncall@example.com"]},
                 "secrets": {"username": "notifier", "password": "pw"}},
    }
    for name, spec in sinks.items():
        s, b = c.call(leader, "PUT", f"/v1/sinks/{name}", spec)
        assert s == 201, b
    s, b = c.get(leader, "/v1/sinks/hook")
    assert s == 200 and b["spec"]["secrets"]["signing_key"].startswith("***:"), b  # redacted on read
    routes = [{"sink": "hook", "on": ["run.dead", "job.recovered", "job.triggered"]},
              {"sink": "pager", "on": ["run.dead", "job.recovered"]},
              {"sink": "mail", "on": ["run.dead"]}]
    job = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["sh", "-c", "exit 3"]},
           "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}, "notify": routes}
    s, b = c.call(leader, "PUT", "/v1/jobs/nightly", job)
    assert s == 201, b
    s, b = c.call(leader, "POST", "/v1/jobs/nightly/trigger")
    assert s == 201, b
    dead_run = b["run"]
    wait_for(lambda: any(m["event_action"] == "trigger" for m in pd.bodies()), 30, "the PagerDuty trigger")
    wait_for(lambda: mails, 30, "the email")
    trig = next(m for m in pd.bodies() if m["event_action"] == "trigger")
    assert trig["dedup_key"] == "default/nightly" and trig["payload"]["custom_details"]["run_id"] == dead_run
    assert b"run.dead" in mails[0] and b"nightly" in mails[0]
    s, b = c.get(leader, "/v1/jobs/nightly")
    assert b["health"]["consecutive_failures"] == 1 and b["health"]["incident"] is not None, b

    # Events pending at the leader (the receiver refuses them), then the leader is killed.
    hook.refuse = True
    triggered = []
    for _ in range(4):
        s, b = c.call(leader, "POST", "/v1/jobs/nightly/trigger")
        assert s == 201, b
        triggered.append(b["run"])
    c.kill(leader, signal.SIGKILL)
    survivors = [j for j in range(3) if j != leader]
    new = c.wait_leader(30, among=survivors)
    hook.refuse = False
    # Each of the four ends dead before the recovering run is triggered: one leased by the killed
    # node's worker is retried (with its own spec, ``exit 3``) only after its lease expires, and a
    # dead outcome that lands after the success would rightly reopen the incident.
    def all_dead():
        states = [c.get(new, "/v1/runs/" + quote(rid, safe=""))[1].get("state") for rid in triggered]
        return all(st == "dead" for st in states) and states
    wait_for(all_dead, 45, "the four triggered runs to end dead")
    job["executor"]["argv"] = ["true"]
    s, b = c.call(new, "PUT", "/v1/jobs/nightly", job)
    assert s == 200, b
    s, b = c.call(new, "POST", "/v1/jobs/nightly/trigger")
    assert s == 201, b

    def told():
        got = hook.bodies()
        runs = {e["run_id"] for e in got if e["kind"] == "job.triggered"}
        return set(triggered) <= runs and any(e["kind"] == "job.recovered" for e in got) and got
    got = wait_for(told, 45, "every triggered event and the recovery at the webhook")
    assert not hook.errors and not pd.errors, (hook.errors, pd.errors)
    ids: dict[str, str] = {}
    for e in got:  # an event sent twice (after the fail-over) is the same event
        key = f"{e['kind']}:{e['run_id']}"
        assert ids.setdefault(key, e["event_id"]) == e["event_id"], (key, e)
    wait_for(lambda: any(m["event_action"] == "resolve" and m["dedup_key"] == "default/nightly"
                         for m in pd.bodies()), 30, "the PagerDuty resolve")
    s, b = c.get(new, "/v1/jobs/nightly?consistent=true")
    assert b["health"]["consecutive_failures"] == 0 and b["health"]["incident"] is None, b
    s, b = c.get(new, "/v1/sinks/hook/dead")
    assert s == 200 and b["dead"] == [], b
