"""Every integer a client sends is bounded (issue 22, section 3, item 8): a huge, negative,
fractional, boolean, non-finite or textual value in any integer (or number, or time) field of
any body, or in any integer or time query parameter, is answered 4xx naming the field, never 500.

The test walks the route table (``ROUTES`` in node/api.py): every query parameter of kind
``integer``, ``time`` or ``boolean`` of every row, and every numeric field of every request body
a row names (``BODIES`` below, which must cover every body schema of the table, so a new body
cannot be added without its fields here). An in-process app over FakeRaft serves the requests
(the worker protocol's long-poll is never reached: every value sent is refused first).
"""
from __future__ import annotations

import asyncio
import copy
import json
import re

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core.state import SchedulerState
from raftsched.node.api import ROUTES, make_app
from raftsched.node.service import Service

from fakes import FakeRaft

TOKEN = "b" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = FakeClock().now_ms()
SPEC = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
AT_SPEC = {"schedule": {"at": NOW + 3_600_000}, "executor": {"type": "shell", "argv": ["true"]},
           "misfire": {"policy": "skip"}}
LEASE = {"slots": 1, "executors": ["shell"], "max": 1, "wait_s": 0}
DAY = "2026-01-01T00:00:00Z"

#: Values no integer field takes: JSON text (so that 1e400 and NaN reach the parser as such).
BAD_INT = ["1" + "0" * 30, str(2**63), str(2**64), "-1", str(-(2**63)), "9" * 400, "1.5", "1e308", "1e400",
           "-1e400", "NaN", "Infinity", "true", "false", '"5"', "[5]", '{"n": 5}']
#: Values no number field takes (fractions are numbers).
BAD_NUM = ["1" + "0" * 30, str(2**64), "-1", "9" * 400, "1e308", "1e400", "-1e400", "NaN", "Infinity", "true",
           '"5"', "[5]"]
#: Values no time field takes (ISO-8601 text, or ms since the epoch where the field says so).
BAD_TIME = [str(2**64), "9" * 400, "1e400", "NaN", "true", "[1]", '"yesterday"', '"2026-13-01T00:00:00Z"',
            '"2026-01-01T00:00:00"', '"' + "9" * 400 + '"']
#: Times far in the past or future that a field may accept or refuse, but never with a 500.
EDGE_TIME = ['"0001-01-01T00:00:00Z"', '"0001-01-01T00:00:00+14:00"', '"9999-12-31T23:59:59-14:00"',
             '"1969-12-31T23:59:59Z"', "-1", "0", str(2**53 + 1), str(2**62)]

#: Every request body a row of the route table names: a valid body, and its numeric fields as
#: (path in the body, kind, the field the error must name). A path is dotted; an integer part
#: indexes a list.
BODIES: dict[str, tuple[object, list[tuple[str, str, str]]]] = {
    "job_spec": (SPEC, [
        ("schedule.every_s", "int", "schedule.every_s"), ("timeout_s", "int", "timeout_s"),
        ("priority", "int", "priority"), ("history", "int", "history"), ("jitter_s", "int", "jitter_s"),
        ("misfire.grace_s", "int", "misfire.grace_s"), ("misfire.max_catchup", "int", "misfire.max_catchup"),
        ("retry.max_attempts", "int", "retry.max_attempts"), ("retry.backoff_s", "num", "retry.backoff_s"),
        ("retry.backoff_multiplier", "num", "retry.backoff_multiplier"),
        ("retry.backoff_max_s", "num", "retry.backoff_max_s"), ("retry.jitter", "num", "retry.jitter"),
        ("overlap.max_concurrent", "int", "overlap.max_concurrent"),
        ("schedule.start_at", "time", "schedule.start_at"),
        ("pause_on_failure.after_consecutive", "int", "pause_on_failure.after_consecutive"),
    ]),
    "job_spec_at": (AT_SPEC, [("schedule.at", "time", "schedule.at")]),
    "jobs_batch": ({"jobs": {"b": SPEC}}, [("jobs.b.schedule.every_s", "int", "schedule.every_s"),
                                          ("jobs.b.timeout_s", "int", "timeout_s")]),
    "trigger": ({}, [("slot", "time", "slot")]),
    "pause": ({}, []),
    "cancel": ({}, []),
    "cancel_job": ({}, []),
    "ping": ({"status": "start"}, [("slot", "time", "slot")]),
    "explain": ({"down_from": "2030-01-01T00:00:00Z", "down_to": "2030-01-02T00:00:00Z"},
                [("down_from", "time", "down_from"), ("down_to", "time", "down_to")]),
    "backfill": ({"from": DAY, "to": "2026-01-02T00:00:00Z", "dry_run": True},
                 [("from", "time", "from"), ("to", "time", "to"), ("max_concurrent", "int", "max_concurrent"),
                  ("max_slots", "int", "max_slots"), ("rate_per_s", "num", "rate_per_s")]),
    "queue": ({"max_depth": 5}, [("max_depth", "int", "max_depth")]),
    "tenant": ({"rate_per_s": 1}, [("rate_per_s", "num", "rate_per_s"), ("burst", "int", "burst")]),
    "dlq_bulk": ({"dry_run": True}, [("dead_from", "time", "dead_from"), ("dead_to", "time", "dead_to"),
                                     ("max_count", "int", "max_count"), ("rate_per_s", "num", "rate_per_s")]),
    "lock_acquire": ({"owner": "me", "ttl_s": 5}, [("ttl_s", "num", "ttl_s")]),
    "lock_token": ({"token": 1}, [("token", "int", "token"), ("ttl_s", "num", "ttl_s")]),
    "token": ({"role": "reader"}, [("expires", "time", "expires")]),
    "lease": (LEASE, [("slots", "int", "slots"), ("max", "int", "max"), ("wait_s", "num", "wait_s"),
                      ("ttl_ms", "int", "ttl_ms")]),
    "heartbeat": ({"leases": [["j@1", 1]]}, [("leases.0.1", "int", "leases"), ("ttl_ms", "int", "ttl_ms")]),
    "complete": ({"results": [{"run": "j@1", "token": 1, "success": True}]},
                 [("results.0.token", "int", "results[0].token")]),
    "release": ({"leases": [["j@1", 1]]}, [("leases.0.1", "int", "leases")]),
    "leave": ({"instance": "i1"}, []),  # an instance id: no number field
    "secrets_rotate": ({"key": "k2"}, []),  # a key id: no number in it
    "member": ({"addr": "127.0.0.1:1"}, []),  # a Raft address: no number field
    "fencing_floor": ({"at_least": 5}, [("at_least", "int", "at_least")]),
    "sink": ({"type": "webhook", "url": "http://127.0.0.1:9/", "secrets": {"signing_key": "k"}},
             [("retry.max_attempts", "int", "retry.max_attempts"), ("retry.backoff_s", "int", "retry.backoff_s"),
              ("retry.backoff_max_s", "int", "retry.backoff_max_s")]),
    "sink_requeue": ({}, []),  # event ids: no number field
}
#: Body schemas whose fields a route's other schema covers (the same validator).
ALSO = {"job_spec": ("job_spec", "job_spec_at")}
#: The fields where a time in ms since the epoch is valid too (the others take ISO-8601 text only).
MS_TOO = {"schedule.at", "schedule.start_at", "expires"}
_PATH_VALUES = {"name": "j", "run": "j@1", "id": "w1", "action": "pause", "addr": "127.0.0.1:1", "file": "app.js"}


def _path(route) -> str:
    """The route's path with its parameters filled in: job ``j`` exists (the others' target),
    job ``p`` is the one PUT replaces (so that what a PUT accepts does not change ``j``)."""
    values = dict(_PATH_VALUES, name="p") if route.key == ("PUT", "/v1/jobs/{name}") else _PATH_VALUES
    return re.sub(r"\{(\w+)(:[^}]*)?\}", lambda m: values[m.group(1)], route.path)


def _with(body, path: str, raw: str) -> bytes:
    """``body`` as JSON with the value at ``path`` replaced by the JSON text ``raw``."""
    b = copy.deepcopy(body)
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    d = b
    for k in keys[:-1]:
        d = d[k] if isinstance(d, list) else d.setdefault(k, {})
    marker = "__VALUE__"
    d[keys[-1]] = marker
    return json.dumps(b).replace(f'"{marker}"', raw).encode()


def _cases():
    """(case id, method, path, body bytes or None, expected field or None, strict): strict
    cases must be 4xx naming the field; the others only never 5xx."""
    covered = set()
    for r in ROUTES:
        path = _path(r)
        for p in r.params:
            if p.kind in ("integer", "time", "boolean"):
                bad = {"integer": ["9" * 30, "-1", "1.5", "true", "abc", "", "1_0", " 5", "\u0663", "1e3",
                                   "0x10", "9" * 5000],
                       "time": ["yesterday", "9" * 30, "-1", "1e400", "99999-01-01T00:00:00Z", ""],
                       "boolean": ["maybe", "2", ""]}[p.kind]
                body = None
                if r.body is not None and not r.body_optional:
                    body = json.dumps(BODIES[r.body][0]).encode()
                for v in bad:
                    q = v if len(v) < 40 else v[:10] + "..."
                    yield (f"{r.method} {r.path}?{p.name}={q}", r.method, path, {p.name: v}, body, p.name, True)
        if r.body is None:
            continue
        for schema in ALSO.get(r.body, (r.body,)):
            covered.add(schema)
            base, fields = BODIES[schema]
            for fpath, kind, field in fields:
                bad = {"int": BAD_INT, "num": BAD_NUM, "time": BAD_TIME}[kind]
                if kind == "time" and fpath in MS_TOO:
                    bad = [v for v in bad if v not in (str(2**64),)] + [str(2**64), "-1", "1.5"]
                for raw in bad:
                    q = raw if len(raw) < 40 else raw[:10] + "..."
                    yield (f"{r.method} {r.path} {fpath}={q}", r.method, path, None, _with(base, fpath, raw), field,
                           True)
                if kind == "time":
                    for raw in EDGE_TIME:
                        yield (f"{r.method} {r.path} {fpath}={raw} (edge)", r.method, path, None,
                               _with(base, fpath, raw), field, False)
    missing = {r.body for r in ROUTES if r.body is not None} - covered - {"job_spec_at"}
    assert not missing, f"body schemas of the route table without their numeric fields in BODIES: {missing}"


CASES = list(_cases())


def test_every_body_schema_and_numeric_parameter_of_the_route_table_is_walked():
    schemas = {r.body for r in ROUTES if r.body is not None}
    assert schemas <= set(BODIES), schemas - set(BODIES)
    walked = {(c[1], c[2]) for c in CASES}
    for r in ROUTES:
        if (r.body is not None and BODIES[r.body][1]) or any(p.kind in ("integer", "time") for p in r.params):
            assert (r.method, _path(r)) in walked, r.path


def test_bad_numbers_are_refused_naming_the_field():
    async def main():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = FakeClock(NOW)
        app = make_app(Service(raft, clock, "node-1"), TOKEN)
        failures = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH,
                              timeout=ClientTimeout(total=10)) as c:
            r = await c.put("/v1/jobs/j", data=json.dumps(SPEC))
            assert r.status == 201, await r.text()
            for case, method, path, params, body, field, strict in CASES:
                try:
                    r = await c.request(method, path, params=params, data=body)
                    text = await r.text()
                except asyncio.TimeoutError:
                    failures.append(f"{case}: no answer in 10 s (accepted, and waiting?)")
                    continue
                if r.status >= 500:
                    failures.append(f"{case}: {r.status} {text[:200]}")
                    continue
                if not strict:
                    continue
                if not 400 <= r.status < 500:
                    failures.append(f"{case}: {r.status}, expected 4xx: {text[:200]}")
                    continue
                err = json.loads(text)["error"]
                if not err.get("field") or field not in err["field"]:
                    failures.append(f"{case}: {r.status} names field {err.get('field')!r}, expected {field!r}: "
                                    f"{err['message'][:120]}")
        return failures

    failures = asyncio.run(main())
    assert not failures, f"{len(failures)} of {len(CASES)} cases:\n" + "\n".join(failures)


def test_schedules_that_reach_the_latest_time_never_answer_500():
    """Slots at limits.time_ms_max (9999-01-01), and a next slot past the year 9999, which no
    datetime renders: previews stop at the latest time, a next slot past it is shown as null."""
    last = "9999-01-01T00:00:00Z"
    specs = [{"every_s": 366 * 86_400, "start_at": last}, {"at": last},
             {"cron": "0 0 1 1 *", "timezone": "Pacific/Kiritimati"}, {"cron": "59 23 31 12 *", "timezone": "Etc/GMT+12"}]

    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(NOW), "node-1"), TOKEN)
        out = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            for sched in specs:
                spec = dict(SPEC, schedule=sched)
                for method, path, body in (
                        ("POST", "/v1/preview?count=1000", spec), ("PUT", "/v1/jobs/far", spec),
                        ("GET", "/v1/jobs/far", None), ("GET", "/v1/jobs/far/preview?count=1000&after=9998-12-31T00:00:00Z", None),
                        ("POST", "/v1/jobs/far/explain", {"down_from": "9998-06-01T00:00:00Z", "down_to": last}),
                        ("GET", "/v1/jobs/far/runs", None), ("GET", "/v1/jobs", None)):
                    r = await c.request(method, path, data=None if body is None else json.dumps(body))
                    out.append((sched, method, path, r.status, (await r.text())[:200]))
        return out

    bad = [o for o in asyncio.run(main()) if o[3] >= 500]
    assert not bad, bad


def test_run_list_cursors_and_windows_are_refused_naming_the_parameter():
    """The run lists' string cursor (``before``, which the walk above does not cover) and a window
    that ends before it starts: 400 naming the parameter, never a 500 or an empty page."""
    cases = [(path, {"before": v}, "before") for path in ("/v1/runs", "/v1/jobs/j/runs")
             for v in ("", "x", "j@", "j@ 1", "@1", "j@1" + "9" * 400, "nosuch@1", "j@1")]
    cases += [(path, {"since": DAY, "until": DAY}, "until") for path in ("/v1/runs", "/v1/jobs/j/runs")]

    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(NOW), "node-1"), TOKEN)
        out = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            r = await c.put("/v1/jobs/j", data=json.dumps(SPEC))
            assert r.status == 201, await r.text()
            for path, params, field in cases:
                r = await c.get(path, params=params)
                body = await r.json()
                if r.status != 400 or body["error"]["field"] != field:
                    out.append((path, params, r.status, body))
        return out

    bad = asyncio.run(main())
    assert not bad, bad


def test_an_unknown_query_parameter_is_refused_naming_it_on_every_route():
    """A parameter a route does not take is answered 400 naming it, never ignored
    (``POST /v1/preview?after=...`` once answered as if it were not there, before it took one); a declared one is
    still served; and a request without a token learns nothing (401 first)."""
    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(NOW), "node-1"), TOKEN)
        failures = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH,
                              timeout=ClientTimeout(total=10)) as c:
            assert (await c.put("/v1/jobs/j", data=json.dumps(SPEC))).status == 201
            for r in ROUTES:
                if r.any_query:
                    continue  # the dashboard's pages: a link may carry any query (test_dashboard.py)
                body = json.dumps(BODIES[r.body][0]).encode() if r.body is not None else None
                resp = await c.request(r.method, _path(r), params={"no_such_param": "1"}, data=body)
                text = await resp.text()
                err = json.loads(text).get("error", {}) if text.startswith("{") else {}
                if resp.status != 400 or err.get("field") != "no_such_param" or "no_such_param" not in err["message"]:
                    failures.append(f"{r.method} {r.path}: {resp.status} {text[:160]}")
            resp = await c.post("/v1/preview", params={"afterr": DAY}, data=json.dumps(SPEC))
            err = (await resp.json())["error"]
            assert resp.status == 400 and err["field"] == "afterr" and "takes: count" in err["message"], err
            resp = await c.post("/v1/preview", params={"count": "2"}, data=json.dumps(SPEC))
            assert resp.status == 200, await resp.text()
            resp = await c.get("/v1/jobs", params={"no_such_param": "1"}, headers={"Authorization": "Bearer x"})
            assert resp.status == 401
            assert [r.path for r in ROUTES if r.any_query] and all(r.path.startswith("/ui") for r in ROUTES
                                                                     if r.any_query), "only the dashboard's"
        return failures

    failures = asyncio.run(main())
    assert not failures, "\n".join(failures)


def test_stale_on_the_cluster_route_is_refused_saying_it_is_this_nodes_view_already():
    """``GET /v1/cluster?stale=true`` (the README's way out of the read barrier on reads) stays a
    400 naming ``stale``, since the route does not take it (nor does the OpenAPI document list it),
    but its message says why: the route answers this node's own view already, and
    ``?consistent=true`` is the way to wait. Another unknown parameter gets no such note."""
    from raftsched.node.openapi import document

    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(NOW), "node-1"), TOKEN)
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH,
                              timeout=ClientTimeout(total=10)) as c:
            resp = await c.get("/v1/cluster", params={"stale": "true"})
            err = (await resp.json())["error"]
            assert resp.status == 400 and err["field"] == "stale", err
            assert "unknown query parameter 'stale'" in err["message"], err
            assert "/v1/cluster is this node's own view already" in err["message"], err
            assert "?consistent=true waits" in err["message"], err
            resp = await c.get("/v1/cluster", params={"nope": "1"})
            err = (await resp.json())["error"]
            assert resp.status == 400 and "own view" not in err["message"], err
            resp = await c.get("/v1/jobs", params={"stale": "true"})  # a read that takes it: served
            assert resp.status == 200, await resp.text()

    asyncio.run(main())
    cluster = next(r for r in ROUTES if (r.method, r.path) == ("GET", "/v1/cluster"))
    assert sorted(p.name for p in cluster.params) == ["consistent", "hash"]
    doc = document(ROUTES)
    assert "stale" not in [p["name"] for p in doc["paths"]["/v1/cluster"]["get"].get("parameters", [])]


def test_a_query_parameter_given_twice_is_refused_naming_it_on_every_route():
    """``?limit=5&limit=500`` was answered by whichever one the handler read (the first): now a
    400 naming it on every route, for each parameter the route takes, but a repeatable one
    (``label``), which is still served; nothing is proposed."""
    async def main():
        state = SchedulerState()
        app = make_app(Service(FakeRaft(state), FakeClock(NOW), "node-1"), TOKEN)
        failures = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH,
                              timeout=ClientTimeout(total=10)) as c:
            assert (await c.put("/v1/jobs/j", data=json.dumps(SPEC))).status == 201
            applied = state.applied
            checked = 0
            for r in ROUTES:
                body = json.dumps(BODIES[r.body][0]).encode() if r.body is not None else None
                for p in r.params:
                    if p.repeated:
                        continue
                    checked += 1
                    resp = await c.request(r.method, _path(r), params=[(p.name, "1"), (p.name, "2")], data=body)
                    text = await resp.text()
                    err = json.loads(text).get("error", {}) if text.startswith("{") else {}
                    if resp.status != 400 or err.get("field") != p.name or "more than once" not in err["message"]:
                        failures.append(f"{r.method} {r.path} ?{p.name}: {resp.status} {text[:160]}")
            assert checked >= 10, checked
            assert state.applied == applied, "nothing was proposed"
            resp = await c.get("/v1/jobs", params=[("label", "a=b"), ("label", "c=d")])
            assert resp.status == 200, await resp.text()
        return failures

    failures = asyncio.run(main())
    assert not failures, "\n".join(failures)


def test_a_json_null_body_is_refused_where_the_body_is_optional():
    """``null`` is a body, not the absence of one: a route whose body is optional refuses it as it
    refuses any body that is not an object (found by schemathesis: ``POST /v1/dlq:purge`` with
    ``-d null`` started a purge of every dead run), and proposes nothing."""
    async def main():
        state = SchedulerState()
        app = make_app(Service(FakeRaft(state), FakeClock(NOW), "node-1"), TOKEN)
        out = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            r = await c.put("/v1/jobs/j", data=json.dumps(SPEC))
            assert r.status == 201, await r.text()
            applied = state.applied
            for r_ in ROUTES:
                if r_.body is None or not r_.body_optional:
                    continue
                r = await c.request(r_.method, _path(r_), data=b"null")
                out.append((r_.method, r_.path, r.status, await r.json()))
            return out, applied, state.applied

    answers, before, after = asyncio.run(main())
    assert {(m, p) for m, p, _, _ in answers} >= {("POST", "/v1/dlq:purge"), ("POST", "/v1/jobs/{name}/trigger")}
    for method, path, status, body in answers:
        assert status == 422 and body["error"]["code"] == "invalid", (method, path, status, body)
    assert before == after, "nothing was proposed"


def test_a_bad_idempotency_key_is_refused_on_every_route():
    """An empty key, or one longer than request_id_chars_max, is a 400 naming the header on
    every route, whether its handler reads the key or not (found by schemathesis: the worker
    heartbeat, which reads none, answered 200; an empty key was taken as no key)."""
    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(NOW), "node-1"), TOKEN)
        out = []
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            for key in ("", "k" * 65):
                for method, path, body in (("POST", "/v1/workers/w1/heartbeat", {"leases": []}),
                                           ("PUT", "/v1/queues/q", {}), ("GET", "/v1/jobs", None)):
                    r = await c.request(method, path, headers={"Idempotency-Key": key},
                                        data=None if body is None else json.dumps(body))
                    out.append((key[:3], method, path, r.status, (await r.json())["error"]["field"]
                                if r.status >= 400 else None))
        return out

    for key, method, path, status, field in asyncio.run(main()):
        assert (status, field) == (400, "Idempotency-Key"), (key, method, path, status, field)
