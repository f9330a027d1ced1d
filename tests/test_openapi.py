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
