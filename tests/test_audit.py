"""The audit log under a flood without a token (issue 22, section 3, item 2; node/audit.py).

Requests refused before a token was accepted (401, 429) are counted in summaries, one a
(reason, source) an interval, in a file of their own budget: however many are sent, the records
of requests with a valid token all stay, and the volume written for the flood is bounded. Every
field taken from the client is cut at its bound.
"""
from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest

from raftsched.clock import FakeClock
from raftsched.core import limits as core_limits
from raftsched.core.state import SchedulerState
from raftsched.node import limits
from raftsched.node.api import make_app
from raftsched.node.audit import AuditLog, bound
from raftsched.node.auth import Auth, FailureLimiter
from raftsched.node.service import Service

from fakes import FakeRaft

BOOT = "b" * 32
SPEC = {"schedule": {"every_s": 10}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
LONG = "x" * 4000


def _lines(paths) -> list[dict]:
    out = []
    for p in paths:
        if p.exists():
            out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


def test_a_flood_without_a_token_never_evicts_the_records_of_requests_with_one(tmp_path):
    """Authenticated writes, then 3 000 requests with no token, a forged one, or throttled (a
    source that failed too often is answered 429), with the longest request id, user agent and
    path a client can send, then more authenticated writes: every authenticated record is
    still in audit.jsonl (a budget of 2 x 64 KiB, which the flood alone would fill eight times
    as records), and the flood is a few summaries."""
    main = tmp_path / "audit.jsonl"
    n_flood = 3000

    async def t():
        clock = FakeClock()
        service = Service(FakeRaft(SchedulerState()), clock, "node-1")
        audit = AuditLog(str(main), "node-1", max_bytes=64 * 1024, keep=1)
        auth = Auth(BOOT, service.read, clock, limiter=FailureLimiter(20, 1.0))
        app = make_app(service, BOOT, auth=auth, audit=audit)
        good = {"Authorization": f"Bearer {BOOT}"}
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            for i in range(10):
                r = await c.put(f"/v1/jobs/before{i}", data=json.dumps(SPEC), headers=good)
                assert r.status == 201
            noise = {"X-Request-Id": LONG, "User-Agent": LONG}
            statuses = []
            for i in range(n_flood):
                h = dict(noise, Authorization="Bearer rst_0123456789abcdef_" + "A" * 43) if i % 2 else noise
                r = await c.put("/v1/jobs/" + "n" * 2000, data=b"{}", headers=h)
                statuses.append(r.status)
            assert set(statuses) == {401, 429}, set(statuses)
            # the source is slowed now, for any token: its writes wait for the bucket
            clock.advance(60_000)
            for i in range(10):
                r = await c.put(f"/v1/jobs/after{i}", data=json.dumps(SPEC), headers=good)
                assert r.status == 201, await r.text()
        audit.close()

    asyncio.run(t())
    recs = _lines([tmp_path / "audit.jsonl.1", main])
    names = [r["target"].get("name") for r in recs if r["status"] == 201]
    assert names == [f"before{i}" for i in range(10)] + [f"after{i}" for i in range(10)]
    assert all(r["token"] == "bootstrap" for r in recs)
    summaries = _lines(sorted(tmp_path.glob("audit-refused.jsonl*")))
    assert sum(s["count"] for s in summaries) == n_flood
    assert {s["reason"] for s in summaries} == {"unauthenticated", "throttled"}
    assert len(summaries) <= 4, summaries
    size = sum(p.stat().st_size for p in tmp_path.glob("audit-refused.jsonl*"))
    assert size < 8 * 1024, f"the flood's summaries take {size} bytes"
    for s in summaries:
        for k in list(s["routes"]) + list(s["agents"]):
            assert len(k) <= limits.audit_field_chars_max + 17, k


def test_summaries_are_one_a_reason_and_source_an_interval_and_their_number_is_bounded(tmp_path):
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n", interval_ms=60_000, sources_max=10)
    t0 = 1_800_000_000_000
    for i in range(1000):
        a.refused(now_ms=t0 + i, reason="unauthenticated", source=f"10.0.{i // 256}.{i % 256}", token=None,
                  method="GET", route="/v1/jobs", status=401, agent="scanner")
    for i in range(5):
        a.refused(now_ms=t0 + 2000 + i, reason="throttled", source="10.0.0.1", token=None, method="GET",
                  route=f"/v1/jobs/j{i}" * 50, status=429, agent=None)
    assert not (tmp_path / "audit-refused.jsonl").exists(), "nothing is written before the interval ends"
    assert a.flush(t0 + 59_999) == 0
    assert a.flush(t0 + 60_000) == 12  # 10 sources, then the rest as "other", one a reason
    first = _lines([tmp_path / "audit-refused.jsonl"])
    by = {(s["reason"], s["source"]): s for s in first}
    assert by[("unauthenticated", "other")]["count"] == 1000 - 10 and ("throttled", "other") in by
    assert sum(s["count"] for s in first) == 1005
    assert by[("unauthenticated", "10.0.0.0")]["agents"] == {"scanner": 1}
    throttled = by[("throttled", "other")]
    assert throttled["count"] == 5 and len(throttled["routes"]) == 5
    # the next interval starts with the next refusal
    a.refused(now_ms=t0 + 70_000, reason="unauthenticated", source="10.0.0.1", token="0123456789abcdef",
              method="GET", route="/v1/jobs", status=401)
    a.close(t0 + 71_000)
    last = _lines([tmp_path / "audit-refused.jsonl"])[len(first):]
    assert [(s["source"], s["count"], s["tokens"]) for s in last] == [("10.0.0.1", 1, {"0123456789abcdef": 1})]
    assert a.refused_requests == {"unauthenticated": 1001, "throttled": 5}


def test_a_summary_counts_at_most_a_few_routes_tokens_and_agents(tmp_path):
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n")
    for i in range(100):
        a.refused(now_ms=i, reason="unauthenticated", source="s", token=f"{i:016x}", method="GET",
                  route=f"/r{i}", status=401, agent=f"agent{i}")
    a.close(100)
    [s] = _lines([tmp_path / "audit-refused.jsonl"])
    assert len(s["routes"]) == limits.audit_refused_keys_max + 1 and s["routes"]["other"] == 100 - 8
    assert len(s["tokens"]) == limits.audit_refused_keys_max + 1
    assert len(s["agents"]) == limits.audit_refused_agents_max + 1 and s["agents"]["other"] == 96


def test_every_field_from_the_client_is_cut_with_a_marker(tmp_path):
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n")
    a.record(now_ms=0, source="127.0.0.1", token="bootstrap", role="admin", method="M" * 100, route="/" + LONG,
             target={"name": LONG, "k" * 999: "v"}, status=201, auth="allowed", request_id=LONG, agent=LONG)
    a.close()
    [r] = _lines([tmp_path / "audit.jsonl"])
    assert r["route"].endswith("…") and len(r["route"]) == limits.audit_field_chars_max
    assert len(r["request_id"]) == core_limits.request_id_chars_max and r["request_id"].endswith("…")
    assert len(r["agent"]) == limits.audit_agent_chars_max and len(r["method"]) == 16
    assert all(len(k) <= limits.audit_field_chars_max and len(v) <= limits.audit_field_chars_max
               for k, v in r["target"].items())
    assert len(json.dumps(r)) < 2048
    assert bound("short") == "short" and bound(None) is None and bound(5) == 5


def test_the_node_writes_an_ended_interval_without_another_request(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "audit_flush_poll_s", 0.01)
    clock = FakeClock()
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n", interval_ms=1000)
    a.refused(now_ms=clock.now_ms(), reason="unauthenticated", source="s", token=None, method="GET",
              route="/v1/jobs", status=401)

    async def t():
        task = asyncio.ensure_future(a.run(clock))
        await asyncio.sleep(0.05)  # ok-sleep: five polls of the flush loop, none may write before the interval ends
        assert not (tmp_path / "audit-refused.jsonl").exists()
        clock.advance(1000)
        for _ in range(200):
            await asyncio.sleep(0.01)  # ok-sleep: polling interval inside a bounded loop
            if (tmp_path / "audit-refused.jsonl").exists():
                break
        task.cancel()
    asyncio.run(t())
    assert [s["count"] for s in _lines([tmp_path / "audit-refused.jsonl"])] == [1]


def test_the_metrics_count_refused_requests_by_reason(tmp_path):
    a = AuditLog(str(tmp_path / "audit.jsonl"), "n")
    for reason in ("unauthenticated", "unauthenticated", "throttled"):
        a.refused(now_ms=0, reason=reason, source="s", token=None, method="GET", route="/", status=401)
    a.record(now_ms=0, source="s", token="bootstrap", role="admin", method="PUT", route="/", target={},
             status=200, auth="allowed", request_id=None)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(a.collector())
    text = generate_latest(registry).decode()
    assert 'raftsched_audit_refused_requests_total{reason="unauthenticated"} 2.0' in text
    assert 'raftsched_audit_refused_requests_total{reason="throttled"} 1.0' in text
    assert "raftsched_audit_records_total 1.0" in text
