"""The dashboard's serving (node/dashboard.py) over an in-process app: the files need no token,
each has its content type and the strict Content-Security-Policy, nothing but the listed files is
served (no path reaches the file system), the page holds no inline script or style, and
``GET /v1/whoami`` tells the page what the token may do. tests/test_ui_browser.py drives the page
in a real browser against a real cluster."""
from __future__ import annotations

import asyncio
import json
import re
from importlib import resources

from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock
from raftsched.core.model import RUN_STATES
from raftsched.core.state import SchedulerState
from raftsched.node import dashboard
from raftsched.node.api import make_app
from raftsched.node.service import Service

from fakes import FakeRaft

BOOT = "b" * 32


def run(fn):
    async def main():
        app = make_app(Service(FakeRaft(SchedulerState()), FakeClock(), "node-1"), BOOT)
        async with TestClient(TestServer(app, host="127.0.0.1")) as c:
            await fn(c)
    asyncio.run(main())


def test_every_file_is_served_without_a_token_with_its_type_and_the_policy():
    async def t(c):
        for path, ctype in (("/ui/", "text/html"), ("/ui/index.html", "text/html"), ("/ui/app.js", "text/javascript"),
                            ("/ui/app.css", "text/css"), ("/ui/favicon.svg", "image/svg+xml")):
            r = await c.get(path)
            assert r.status == 200, path
            assert r.headers["Content-Type"].split(";")[0] == ctype, path
            csp = r.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp, csp
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert len(await r.read()) > 100
        r = await c.get("/ui", allow_redirects=False)
        assert r.status == 308 and r.headers["Location"] == "/ui/"
    run(t)


def test_only_the_listed_files_are_served():
    async def t(c):
        for path in ("/ui/nosuch.js", "/ui/..%2Fdashboard.py", "/ui/%2E%2E%2Fapi.py", "/ui/../api.py", "/ui/ui",
                     "/ui/app.js%00", "/ui/.%2Fapp.js"):
            r = await c.get(path)
            # 404; or 401 where the client folded the dots and asked for a path outside /ui/.
            assert r.status in (401, 404), (path, r.status)
            body = await r.json()
            assert body["error"]["code"] in ("not_found", "unauthorized") and "import" not in await r.text()
    run(t)


def test_the_page_has_no_inline_script_or_style_and_loads_nothing_from_elsewhere():
    ui = resources.files(dashboard.__package__) / "ui"
    html = (ui / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline script"
    assert "<style" not in html and " style=" not in html and "javascript:" not in html
    for f in dashboard.FILES:
        text = (ui / f).read_text()
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", text), f"{f} loads from another origin"
        assert "innerHTML" not in text and "eval(" not in text and "document.cookie" not in text, f
    js = (ui / "app.js").read_text()
    assert "sessionStorage" in js and "localStorage" not in js, "the token is kept for the tab only"
    assert {p.name for p in ui.iterdir()} == set(dashboard.FILES), "every shipped file is listed, and only those"


def test_whoami_tells_the_role_tenants_and_scopes():
    async def t(c):
        auth = {"Authorization": f"Bearer {BOOT}"}
        r = await c.get("/v1/whoami", headers=auth)
        assert r.status == 200
        me = await r.json()
        assert me["id"] == "bootstrap" and me["role"] == "admin" and me["tenants"] is None and "jobs.write" in me["scopes"]
        for role, body, scopes in (("reader", {}, ["read"]), ("operator", {"tenants": ["billing"]}, None),
                                   ("worker", {}, None)):
            r = await c.post("/v1/tokens", headers=auth, data=json.dumps(dict(role=role, **body)))
            assert r.status == 201, await r.text()
            tok = (await r.json())["token"]
            r = await c.get("/v1/whoami", headers={"Authorization": f"Bearer {tok}"})
            if role == "worker":
                assert r.status == 403, "a worker token reads nothing"
                continue
            me = await r.json()
            assert me["role"] == role
            if scopes is not None:
                assert me["scopes"] == scopes and me["tenants"] is None
            else:
                assert me["tenants"] == ["billing"] and "jobs.write" in me["scopes"] and "tokens" not in me["scopes"]
        assert (await c.get("/v1/whoami")).status == 401
    run(t)


def test_a_query_string_does_not_break_the_dashboard():
    """A link to the page (or a file) with a query string (a cache-buster, a tracker's, a
    bookmark's) is served as without it: the page reads no query parameter, and the API's
    refusal of unknown parameters is for the API's routes."""
    async def t(c):
        for path, ctype in (("/ui/?x=1", "text/html"), ("/ui/?x=1&x=2&y", "text/html"),
                            ("/ui/app.js?v=3", "text/javascript"), ("/ui/app.css?v=3&v=4", "text/css")):
            r = await c.get(path)
            assert r.status == 200, (path, r.status, await r.text())
            assert r.headers["Content-Type"].split(";")[0] == ctype, path
            assert "script-src 'self'" in r.headers["Content-Security-Policy"], path
        r = await c.get("/ui?x=1", allow_redirects=False)
        assert r.status == 308 and r.headers["Location"] == "/ui/"
        assert (await c.get("/ui/nosuch.js?x=1")).status == 404
        # The API still refuses a parameter it does not take.
        r = await c.get("/v1/whoami?x=1", headers={"Authorization": f"Bearer {BOOT}"})
        assert r.status == 400 and (await r.json())["error"]["field"] == "x"
    run(t)


def test_every_run_state_is_coloured_and_filtered_and_no_placeholder_is_left():
    """The page's list of run states (the timeline's colours and legend, the filters) is every
    state the API reports, each with its colour; and the page says nothing will show "once" the
    API has what it already has (health, the pipeline graph)."""
    ui = resources.files(dashboard.__package__) / "ui"
    js, css = (ui / "app.js").read_text(), (ui / "app.css").read_text()
    m = re.search(r"^const STATES = \[([^\]]*)\];", js, re.M)
    assert m, "app.js lists STATES"
    states = re.findall(r'"([a-z_]+)"', m.group(1))
    assert sorted(states) == sorted(RUN_STATES), states
    for st in states:
        assert re.search(rf"\.cell\.{st}\s*{{[^}}]*background", css), f"no colour for a {st} cell"
        assert re.search(rf"\.pill\.{st}\s*{{[^}}]*background", css), f"no colour for a {st} pill"
    assert "once the API" not in js and "once jobs can" not in js and "placeholder" not in js
    assert "/graph`" in js and ".health" in js
    # A cancel's reason is cut where the API's bound is (a longer one was a 422 and "cancel failed").
    from raftsched.core import limits
    m = re.search(r"^const REASON_CHARS_MAX = (\d+);", js, re.M)
    assert m and int(m.group(1)) == limits.cancel_reason_chars_max
