"""The OpenAPI document (node/openapi.py, served at /openapi.json and /v1/openapi.json): a valid
OpenAPI 3.1 document, generated from the route table so that its operations and the app's routes
are the same both ways, with every answer the in-process app gives here conforming to it.
scripts/fuzz_api.py (scripts/test.sh's schemathesis step) fuzzes a real node with it."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from raftsched.node import api, openapi, routes

from test_auth import BOOT, SPEC, Env, bearer

TABLE = routes.table(api.ROUTES)


def served(app) -> set[tuple[str, str]]:
    out = set()
    for res in app.router.resources():
        for route in res:
            if route.method not in ("HEAD", "*"):
                out.add((route.method, res.canonical))
    return out


async def fetch_doc(c, path="/openapi.json"):
    r = await c.get(path)  # no token: the document is open
    assert r.status == 200, await r.text()
    assert r.content_type == "application/json"
    return json.loads(await r.read())


def test_the_document_is_valid_openapi_3_1_and_needs_no_token():
    async def main():
        env = Env()
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            doc, v1 = await fetch_doc(c), await fetch_doc(c, "/v1/openapi.json")
        return doc, v1
    doc, v1 = asyncio.run(main())
    assert doc == v1
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # openapi-spec-validator: raises naming what is wrong


def test_the_documents_operations_are_the_apps_routes_both_ways():
    env = Env()
    doc = openapi.document(TABLE)
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    app_routes = served(env.app)
    assert documented == app_routes, f"documented only: {documented - app_routes}; served only: {app_routes - documented}"
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operationIds are unique"


def test_every_row_has_what_the_document_needs():
    """A row added by hand must name a body schema, a response schema and path parameters the
    generator knows; the error statuses it lists carry codes of core/errors.py."""
    missing = []
    for r in TABLE.values():
        if r.body is not None and r.body not in openapi.BODIES:
            missing.append(f"{r.method} {r.path}: body {r.body!r} has no schema in node/openapi.py BODIES")
        if r.response is not None and r.response not in openapi.RESPONSES:
            missing.append(f"{r.method} {r.path}: response {r.response!r} is not in node/openapi.py RESPONSES")
        try:
            openapi.path_parameters(r.path)
        except KeyError as e:
            missing.append(f"{r.method} {r.path}: path parameter {e} is not in node/openapi.py PATH_PARAMS")
        for st in r.errors:
            if not openapi.error_codes(st):
                missing.append(f"{r.method} {r.path}: error status {st} carries no code of core/errors.py")
    assert not missing, "\n".join(missing)


def test_a_row_the_generator_cannot_describe_is_named():
    """What the check above catches: a path parameter the generator has no schema for."""
    row = routes.Route("GET", "/v1/widgets/{name}", api.get_job, "read", routes.Tenancy.SHARED, "x")
    with pytest.raises(KeyError):
        openapi.document([row])


def _validator(doc):
    registry = Registry().with_resource("urn:doc", Resource.from_contents(doc, default_specification=DRAFT202012))

    def check(method: str, path: str, status: int, content_type: str, body: bytes) -> str | None:
        op = doc["paths"][path][method.lower()]
        resp = op["responses"].get(str(status))
        if resp is None:
            return f"{method} {path}: status {status} is not documented"
        if "$ref" in resp:
            resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
        media = resp["content"].get(content_type)
        if media is None:
            return f"{method} {path} {status}: content type {content_type} is not documented"
        if content_type != "application/json":
            return None
        schema = {"$ref": "urn:doc#/paths/" + path.replace("~", "~0").replace("/", "~1") + f"/{method.lower()}"
                  f"/responses/{status}/content/application~1json/schema"}
        if "$ref" in op["responses"][str(status)]:
            ref = op["responses"][str(status)]["$ref"].lstrip("#")
            schema = {"$ref": f"urn:doc#{ref}/content/application~1json/schema"}
        v = jsonschema.Draft202012Validator(schema, registry=registry)
        errs = [e.message for e in v.iter_errors(json.loads(body))]
        return f"{method} {path} {status}: {errs[:3]}" if errs else None
    return check


def test_answers_conform_to_the_document():
    """Successes and errors of the main operations, as the app answers them, against the
    document's schema for their status (schemathesis does this for every operation against a
    real node; this is the quick in-process check)."""
    doc = openapi.document(TABLE)
    check = _validator(doc)

    async def main():
        env = Env()
        out = []
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            r = await c.post("/v1/tokens", headers=bearer(BOOT), data=json.dumps({"role": "reader"}))
            reader = (await r.json())["token"]
            cases = [
                ("PUT", "/v1/jobs/a", "/v1/jobs/{name}", BOOT, SPEC),
                ("PUT", "/v1/jobs/a", "/v1/jobs/{name}", BOOT, SPEC),
                ("GET", "/v1/jobs/a", "/v1/jobs/{name}", BOOT, None),
                ("GET", "/v1/jobs", "/v1/jobs", BOOT, None),
                ("POST", "/v1/jobs/a/trigger", "/v1/jobs/{name}/trigger", BOOT, None),
                ("GET", "/v1/jobs/a/runs", "/v1/jobs/{name}/runs", BOOT, None),
                ("GET", "/v1/runs", "/v1/runs", BOOT, None),
                ("GET", "/v1/cluster", "/v1/cluster", BOOT, None),
                ("GET", "/healthz", "/healthz", None, None),
                ("GET", "/v1/dlq", "/v1/dlq", BOOT, None),
                ("GET", "/v1/queues", "/v1/queues", BOOT, None),
                ("GET", "/v1/tenants", "/v1/tenants", BOOT, None),
                ("POST", "/v1/jobs/a/pause", "/v1/jobs/{name}/pause", BOOT, None),
                ("PUT", "/v1/jobs/b", "/v1/jobs/{name}", BOOT, {"schedule": {"every_s": 0}}),
                ("PUT", "/v1/jobs/b", "/v1/jobs/{name}", reader, SPEC),
                ("GET", "/v1/jobs/zz", "/v1/jobs/{name}", BOOT, None),
                ("GET", "/v1/jobs", "/v1/jobs", None, None),
                ("GET", "/v1/jobs?limit=0", "/v1/jobs", BOOT, None),
                ("POST", "/v1/jobs/a/explain", "/v1/jobs/{name}/explain", BOOT, {}),
                ("POST", "/v1/jobs/a/explain", "/v1/jobs/{name}/explain", BOOT,
                 {"down_from": "2026-01-01T00:00:00Z", "down_to": "2026-01-01T01:00:00Z"}),
                # a triggered job: explain needs no window, with one it says the same
                ("PUT", "/v1/jobs/t", "/v1/jobs/{name}", BOOT, {"executor": SPEC["executor"], "after": ["a"]}),
                ("POST", "/v1/jobs/t/explain", "/v1/jobs/{name}/explain", BOOT, {}),
                ("POST", "/v1/jobs/t/explain", "/v1/jobs/{name}/explain", BOOT,
                 {"down_from": "2026-01-01T00:00:00Z", "down_to": "2026-01-01T01:00:00Z"}),
                ("DELETE", "/v1/jobs/t", "/v1/jobs/{name}", BOOT, None),
            ]
            for method, url, path, token, body in cases:
                r = await c.request(method, url, headers=bearer(token) if token else {},
                                    data=None if body is None else json.dumps(body))
                out.append((method, path, r.status, r.content_type, await r.read()))
            r = await c.get("/v1/jobs/a/runs", headers=bearer(BOOT))
            run_id = (await r.json())["runs"][0]["id"]
            r = await c.get(f"/v1/runs/{run_id}", headers=bearer(BOOT))
            out.append(("GET", "/v1/runs/{run}", r.status, r.content_type, await r.read()))
            r = await c.delete("/v1/jobs/a", headers=bearer(BOOT))
            out.append(("DELETE", "/v1/jobs/{name}", r.status, r.content_type, await r.read()))
        return out

    answers = asyncio.run(main())
    statuses = [a[2] for a in answers]
    assert {200, 201, 401, 403, 404, 422} <= set(statuses) | {400}, statuses
    bad = [m for a in answers if (m := check(*a)) is not None]
    assert not bad, "\n".join(bad)
    # and the check can fail: an answer of the wrong shape, an undocumented status
    assert check("GET", "/v1/jobs/{name}", 200, "application/json", b'{"name": 1}') is not None
    assert check("GET", "/v1/jobs/{name}", 404, "application/json", b'{"error": {"code": "x"}}') is not None
    assert check("GET", "/v1/jobs/{name}", 418, "application/json", b"{}") is not None


def test_every_json_route_names_its_answers_schema():
    """No route is described as a bare object: a new row without ``response=`` fails here."""
    bare = [f"{r.method} {r.path}" for r in TABLE.values() if r.response is None]
    assert not bare, f"rows without response= (name a schema of node/openapi.py RESPONSES): {bare}"
    doc = openapi.document(TABLE)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                schema = resp.get("content", {}).get("application/json", {}).get("schema")
                assert schema != {"type": "object"}, f"{method.upper()} {path} {status} is a bare object"
    # what it catches: a row added without one is a bare object in the document
    row = routes.Route("GET", "/v1/widgets", api.get_job, "read", routes.Tenancy.SHARED, "x")
    assert openapi.document([row])["paths"]["/v1/widgets"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"] == {"type": "object"}


SINK = {"type": "webhook", "url": "https://example.com/hook", "secrets": {"signing_key": "k" * 32}}
DAY = "2027-01-14T00:00:00Z"  # before the fake clock's now (1.8e12 ms): a past range, no wall clock


def test_the_other_operations_answers_conform_to_the_document():
    """The rest of the operations' successes, in process, each against its named schema."""
    check = _validator(openapi.document(TABLE))
    lease = {"slots": 1, "executors": ["shell"], "max": 1, "wait_s": 0}

    async def main():
        env = Env()
        out = []
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            async def go(method, url, path, body=None, token=BOOT):
                r = await c.request(method, url, headers=bearer(token),
                                    data=None if body is None else json.dumps(body))
                raw = await r.read()
                out.append((method, path, r.status, r.content_type, raw))
                assert r.status < 300, (method, url, r.status, raw[:300])
                return json.loads(raw)
            await go("PUT", "/v1/jobs/a", "/v1/jobs/{name}", SPEC)
            await go("PUT", "/v1/jobs/hb", "/v1/jobs/{name}", {"schedule": {"every_s": 60}, "executor": {
                     "type": "heartbeat"}, "misfire": {"policy": "skip"}})
            env.clock.advance(61_000)
            await env.trigger.tick()  # hb's first slot opens: a ping reports it
            await go("POST", "/v1/jobs/hb/ping", "/v1/jobs/{name}/ping", {"status": "start"})
            await go("POST", "/v1/jobs:batch", "/v1/jobs:batch", {"jobs": {"c": SPEC, "a": SPEC}, "create_only": True})
            await go("POST", "/v1/jobs:plan", "/v1/jobs:plan", {"jobs": {"c": SPEC, "d": SPEC}})
            await go("POST", "/v1/jobs/a/resume", "/v1/jobs/{name}/resume")
            queued = (await go("POST", "/v1/jobs/a/trigger", "/v1/jobs/{name}/trigger"))["run"]
            await go("POST", f"/v1/runs/{queued}/cancel", "/v1/runs/{run}/cancel", {"reason": "not now"})
            await go("GET", f"/v1/runs/{queued}", "/v1/runs/{run}")  # a run cancelled conforms too
            await go("POST", "/v1/jobs/a/trigger", "/v1/jobs/{name}/trigger")
            await go("POST", "/v1/jobs/a/cancel", "/v1/jobs/{name}/cancel", {"reason": "a backlog", "running": False})
            await go("GET", "/v1/jobs/a/preview", "/v1/jobs/{name}/preview")
            await go("POST", "/v1/preview", "/v1/preview", {"schedule": {"cron": "30 2 * * *", "timezone":
                     "Europe/Berlin"}, "executor": SPEC["executor"], "misfire": SPEC["misfire"]})
            await go("POST", "/v1/jobs/a/explain", "/v1/jobs/{name}/explain",
                     {"down_from": DAY, "down_to": "2027-01-14T00:05:00Z"})
            await go("POST", "/v1/jobs/a/explain", "/v1/jobs/{name}/explain", {"slot": DAY})
            bf = {"from": DAY, "to": "2027-01-14T00:01:00Z"}
            await go("POST", "/v1/jobs/a/backfills", "/v1/jobs/{name}/backfills", dict(bf, dry_run=True))
            made = await go("POST", "/v1/jobs/a/backfills", "/v1/jobs/{name}/backfills", bf)
            await go("GET", "/v1/backfills", "/v1/backfills")
            await go("GET", f"/v1/backfills/{made['id']}", "/v1/backfills/{id}")
            await go("POST", f"/v1/backfills/{made['id']}/pause", "/v1/backfills/{id}/{action}")
            await go("POST", "/v1/dlq:requeue", "/v1/dlq:requeue", {"dry_run": True, "all": True})
            await go("POST", "/v1/dlq:purge", "/v1/dlq:purge", {"all": True})
            await go("PUT", "/v1/queues/q", "/v1/queues/{name}", {"max_depth": 10})
            await go("PUT", "/v1/tenants/t", "/v1/tenants/{name}", {"rate_per_s": 5, "executors": ["shell"]})
            await go("GET", "/v1/tenants/t", "/v1/tenants/{name}")
            await go("DELETE", "/v1/tenants/t", "/v1/tenants/{name}")
            held = await go("POST", "/v1/locks/l/acquire", "/v1/locks/{name}/acquire", {"owner": "o", "ttl_s": 10})
            await go("GET", "/v1/locks/l", "/v1/locks/{name}")
            await go("POST", "/v1/locks/l/renew", "/v1/locks/{name}/renew", {"token": held["token"]})
            await go("POST", "/v1/locks/l/release", "/v1/locks/{name}/release", {"token": held["token"]})
            await go("GET", "/v1/deadlines", "/v1/deadlines")
            await go("POST", "/v1/workers/w1/lease", "/v1/workers/{id}/lease", lease)
            await go("POST", "/v1/workers/w1/heartbeat", "/v1/workers/{id}/heartbeat", {"leases": []})
            await go("POST", "/v1/workers/w1/release", "/v1/workers/{id}/release", {"leases": []})
            await go("POST", "/v1/workers/w1/leave", "/v1/workers/{id}/leave", {"instance": "i1"})
            await go("POST", "/v1/workers/w1/complete", "/v1/workers/{id}/complete",
                     {"results": [{"run": "a@1", "token": 1, "success": True}]})  # refused in its result
            await go("POST", "/v1/cluster/members", "/v1/cluster/members", {"addr": "127.0.0.1:7"})
            await go("DELETE", "/v1/cluster/members/127.0.0.1:7", "/v1/cluster/members/{addr}")
            await go("GET", "/v1/workers", "/v1/workers")
            await go("GET", "/v1/workers/w1", "/v1/workers/{id}")
            await go("POST", "/v1/workers/w1/drain", "/v1/workers/{id}/drain")
            await go("GET", "/v1/whoami", "/v1/whoami")
            tok = await go("POST", "/v1/tokens", "/v1/tokens", {"role": "reader", "note": "n"})
            await go("GET", "/v1/tokens", "/v1/tokens")
            await go("DELETE", f"/v1/tokens/{tok['id']}", "/v1/tokens/{id}")
            await go("GET", "/v1/secrets", "/v1/secrets")
            await go("POST", "/v1/secrets:rotate", "/v1/secrets:rotate", {"key": "process"})
            await go("PUT", "/v1/sinks/s", "/v1/sinks/{name}", SINK)
            await go("GET", "/v1/sinks", "/v1/sinks")
            await go("GET", "/v1/sinks/s", "/v1/sinks/{name}")
            await go("GET", "/v1/sinks/s/dead", "/v1/sinks/{name}/dead")
            await go("POST", "/v1/sinks/s/dead:requeue", "/v1/sinks/{name}/dead:requeue", {})
            await go("DELETE", "/v1/sinks/s", "/v1/sinks/{name}")
        return out

    answers = asyncio.run(main())
    bad = [m for a in answers if (m := check(*a)) is not None]
    assert not bad, "\n".join(bad)


def test_deadline_records_of_every_kind_conform_to_the_document():
    """A slot's record (pending, then missed) and a job's max_since_success_s miss, whose
    run_id, slot and slot_ms are null, as GET /v1/deadlines answers them."""
    check = _validator(openapi.document(TABLE))
    spec = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["true"]},
            "misfire": {"policy": "skip"}, "deadline": {"start_within_s": 30, "max_since_success_s": 60}}

    async def main():
        env = Env()
        out = []
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            r = await c.put("/v1/jobs/d", headers=bearer(BOOT), data=json.dumps(spec))
            assert r.status == 201, await r.text()
            for _ in range(4):
                env.clock.advance(31_000)
                await env.trigger.tick()
                r = await c.get("/v1/deadlines", headers=bearer(BOOT))
                out.append((r.status, r.content_type, await r.read()))
        return out
    answers = asyncio.run(main())
    rows = [d for _, _, body in answers for d in json.loads(body)["deadlines"]]
    assert {d["state"] for d in rows} >= {"pending", "missed"}, rows
    assert any(d["deadline"] == "max_since_success_s" and d["slot"] is None and d["run_id"] is None for d in rows), rows
    bad = [m for a in answers if (m := check("GET", "/v1/deadlines", *a)) is not None]
    assert not bad, "\n".join(bad)


def test_a_deadlines_job_that_is_no_job_name_is_a_400_naming_it_as_the_document_says():
    """As any bad query parameter: 400 naming it (the document lists 400 for every route), and
    the parameter is described as a job's name."""
    doc = openapi.document(TABLE)
    check = _validator(doc)
    [param] = [p for p in doc["paths"]["/v1/deadlines"]["get"]["parameters"] if p["name"] == "job"]
    assert param["schema"]["maxLength"] == 128 and "pattern" in param["schema"]

    async def main():
        env = Env()
        out = []
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            for job in ("-1", "x" * 129, "ok-name"):
                r = await c.get("/v1/deadlines", params={"job": job}, headers=bearer(BOOT))
                out.append((r.status, r.content_type, await r.read()))
        return out
    bad_dash, too_long, fine = asyncio.run(main())
    for status, _, body in (bad_dash, too_long):
        assert status == 400 and json.loads(body)["error"]["field"] == "job", body
    assert fine[0] == 200
    bad = [m for a in (bad_dash, too_long, fine) if (m := check("GET", "/v1/deadlines", *a)) is not None]
    assert not bad, "\n".join(bad)


def test_with_metrics_open_the_served_document_describes_metrics_as_needing_no_token():
    """The document a node serves says what it asks a token for: GET /metrics with no security
    and no 401 or 403 on a node started with --metrics-open, and as any read otherwise."""
    async def served_doc(metrics_open):
        env = Env()
        env.auth.metrics_open = metrics_open
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            doc = await fetch_doc(c)
            r = await c.get("/metrics")  # no token
            return doc, r.status
    closed, closed_status = asyncio.run(served_doc(False))
    opened, open_status = asyncio.run(served_doc(True))
    shut, free = closed["paths"]["/metrics"]["get"], opened["paths"]["/metrics"]["get"]
    assert shut["security"] == [{"bearer": ["read"]}] and {"401", "403"} <= set(shut["responses"])
    assert closed_status == 401
    assert free["security"] == [] and not {"401", "403"} & set(free["responses"]) and "x-raftsched-scope" not in free
    assert open_status == 404, "no metrics in this app, but no token asked"  # 404 is documented
    assert "404" in free["responses"]
    validate(opened)
    assert opened["paths"]["/v1/jobs"] == closed["paths"]["/v1/jobs"], "only /metrics is opened"


def test_the_answers_a_long_fuzz_found_off_the_document_now_conform():
    """What schemathesis's long profile found (scripts/fuzz_api.py, RAFTSCHED_FUZZ_PROFILE=long):
    an empty ``job`` or ``name`` filter served as none (the document says a name, 1+ characters:
    now a 400 naming it), a token created again under its request id answered ``token: null``
    and a queue open to every tenant ``tenants: null`` (the document said a string, an array:
    it says null may be)."""
    doc = openapi.document(TABLE)
    check = _validator(doc)

    async def main():
        env = Env()
        out = []
        async with TestClient(TestServer(env.app, host="127.0.0.1")) as c:
            for url, path, method, body in (("/v1/deadlines?job=", "/v1/deadlines", "GET", None),
                                            ("/v1/preview?name=", "/v1/preview", "POST", SPEC)):
                r = await c.request(method, url, headers=bearer(BOOT), data=None if body is None else json.dumps(body))
                out.append((method, path, r.status, r.content_type, await r.read()))
            r = await c.put("/v1/queues/q1", headers=bearer(BOOT), data=json.dumps({"max_depth": 10, "on_full": "reject", "tenants": None}))
            out.append(("PUT", "/v1/queues/{name}", r.status, r.content_type, await r.read()))
            for _ in range(2):
                r = await c.post("/v1/tokens", headers={**bearer(BOOT), "Idempotency-Key": "k-1"},
                                 data=json.dumps({"role": "reader"}))
                out.append(("POST", "/v1/tokens", r.status, r.content_type, await r.read()))
        return out

    answers = asyncio.run(main())
    (dl, pv, q, t1, t2) = answers
    assert dl[2] == 400 and json.loads(dl[4])["error"]["field"] == "job"
    assert pv[2] == 400 and json.loads(pv[4])["error"]["field"] == "name"
    assert q[2] == 200 and json.loads(q[4])["tenants"] is None
    assert isinstance(json.loads(t1[4])["token"], str) and json.loads(t2[4])["token"] is None
    bad = [m for a in answers if (m := check(*a)) is not None]
    assert not bad, "\n".join(bad)


def test_a_route_that_takes_no_body_answers_a_body_sent_to_it_as_its_document_says():
    """A route without a body reads one sent to it, to refuse it (node/api.py _no_body): too
    large is a 413, a field a 422; both documented for it, as for a route with a body."""
    from raftsched.node import limits as node_limits
    doc = openapi.document(TABLE)
    bodies = (b'{"x": "' + b"a" * (node_limits.request_bytes_max + 10) + b'"}', b'{"catch_up": true}')

    async def answer(c, data: bytes) -> tuple:
        r = await c.get("/v1/jobs", headers=bearer(BOOT), data=data)
        return ("GET", "/v1/jobs", r.status, r.content_type, await r.read())

    async def main():
        async with TestClient(TestServer(Env().app, host="127.0.0.1")) as c:
            return [await answer(c, data) for data in bodies]

    answers = asyncio.run(main())
    assert [a[2] for a in answers] == [413, 422]
    bad = [m for a in answers if (m := _validator(doc)(*a)) is not None]
    assert not bad, "\n".join(bad)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert {"408", "413", "422"} <= set(op["responses"]), f"{method} {path}"


def test_a_413_says_the_bound_of_its_route():
    """A batch reads up to batch_request_bytes_max (16 MiB), every other route 64 KiB: the
    document said 64 KiB for the batch's two routes too, and a client sized its batches by it."""
    from raftsched.core import limits
    from raftsched.node import limits as node_limits
    doc = openapi.document(TABLE)
    for path in ("/v1/jobs:batch", "/v1/jobs:plan"):
        desc = doc["paths"][path]["post"]["responses"]["413"]["description"]
        assert str(limits.batch_request_bytes_max) in desc, (path, desc)
    one = doc["paths"]["/v1/jobs/{name}"]["put"]["responses"]["413"]
    assert doc["components"]["responses"][one["$ref"].rsplit("/", 1)[1]]["description"].endswith(
        f"{node_limits.request_bytes_max} bytes")
