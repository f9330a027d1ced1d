"""The dashboard (/ui/, docs/ui.md) in a real headless browser against a real three-node cluster:
Playwright for Python driving Debian's chromium (never a browser Playwright downloads: set
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 when installing it; scripts/test.sh installs chromium with
apt-get when it is missing). The page loads with no console error (a violation of its
Content-Security-Policy would be one), the cluster strip shows the agreed leader, a job created
through the API appears, pausing it from the page shows skipped slots in its timeline, a dead run
is requeued from the page, a failing job's health shows, a pipeline's graph shows on its jobs'
pages, a heartbeat job's waiting slots are coloured and filtered, a link with a query string
opens the page, a reader token sees no action at all, a token limited to a tenant sees
only its tenant's, and the page says when its node has lost the leader."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from urllib.parse import quote

import pytest

from raftsched.core.schedule import iso, parse_iso_ms as iso_ms

from procs import http, running_cluster, wait_for

CHROMIUM = os.environ.get("RAFTSCHED_CHROMIUM", "/usr/bin/chromium")
#: Flags for a browser that talks to nothing but the cluster (no updates, no sync, no telemetry);
#: --no-sandbox because the tests run as root.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
TIMEOUT_MS = 15_000
#: An ISO time as a datetime-local input's value, in the browser's zone (whole seconds).
LOCAL_INPUT = """t => { const d = new Date(t); const p = n => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`; }"""

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("ui"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: apt-get install chromium (scripts/test.sh does)")
    from playwright.sync_api import sync_playwright
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                   viewport={"width": 1280, "height": 800})
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


def _open(browser, url: str, token: str):
    """A new tab on the dashboard, logged in with ``token``; its console errors are collected."""
    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url + "/ui/")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#who:not(:empty)")
    return page


def _paused(url: str, token: str) -> dict | None:
    job = http("GET", url + "/v1/jobs/ui-tick", None, token)[1]
    return job if job["state"]["paused"] else None


def test_the_dashboard_in_a_browser(cluster, browser):
    token = cluster.token
    leader = cluster.wait_leader(30)
    via = (leader + 1) % 3  # a follower serves the page: reads are its replica's, writes forwarded
    url = cluster.url(via)
    page = _open(browser, url, token)

    # The strip names the agreed leader (asked again each time: a loaded machine may see an
    # election meanwhile).
    wait_for(lambda: cluster.raft_addr(cluster.wait_leader(10)) in (page.text_content("#strip-leader") or ""), 30,
             "the strip naming the agreed leader")
    assert page.evaluate("() => sessionStorage.getItem('raftsched.token')") == token
    assert token not in page.url and not page.context.cookies()
    # The cluster page links every member's API, as the members announced it (GET /v1/cluster).
    for i in range(3):
        page.wait_for_selector(f"a[href='{cluster.url(i)}/ui/']")

    # A job created through the API appears without a reload.
    spec = {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    assert http("PUT", cluster.url(leader) + "/v1/jobs/ui-tick", spec, token)[0] == 201
    page.goto(url + "/ui/#/jobs")
    page.wait_for_selector("tr[data-job='ui-tick']")

    # Paused from the page (confirmed first), and resumed from the job's page once a slot fell in
    # the pause: the timeline shows that slot skipped, with its reason.
    page.once("dialog", lambda d: d.accept())
    page.click("tr[data-job='ui-tick'] button[data-action='pause']")
    job = wait_for(lambda: _paused(url, token), 10, "the job paused")
    next_ms = iso_ms(job["state"]["next_slot"], "next_slot")
    wait_for(lambda: http("GET", url + "/v1/cluster", None, token)[1]["state_now_ms"] > next_ms + 1000, 10,
             "a slot falling due while paused")
    page.goto(url + "/ui/#/job/ui-tick")
    why = page.wait_for_selector("#pause-why").inner_text()  # since when, and which token paused it
    assert why == f"since {job['state']['pause']['since']} by token {job['state']['pause']['by']}", why
    page.once("dialog", lambda d: d.accept())
    page.click("button[data-action='resume']")
    cell = page.wait_for_selector("#timeline .cell.skipped[title*='paused']")
    assert "skipped" in cell.get_attribute("title")

    # The explain form, for an outage of 10 s from that slot: what each slot would become.
    slot = cell.get_attribute("title").split(" ")[0].rstrip(":")
    page.fill("#x-from", page.evaluate(LOCAL_INPUT, slot))
    page.fill("#x-to", page.evaluate(LOCAL_INPUT, iso(iso_ms(slot, "slot") + 10_000)))
    page.click("#explain button")
    page.wait_for_selector("#explain-out p:has-text('slots due')")

    # "What happened at T?" with that slot's time: the record, and why.
    page.goto(url + "/ui/#/at")
    page.fill("#at-job", "ui-tick")
    page.fill("#at-time", page.evaluate(LOCAL_INPUT, slot))
    page.click("#at-form button")
    page.wait_for_selector("#at-out td:has-text('paused')")
    # A job whose runs no worker may take (its placement's labels are nobody's) misses its start
    # deadline: its timeline outlines the slot and says why, and the cluster page lists the miss.
    late = dict(spec, placement={"labels": {"pool": "nobody"}}, deadline={"start_within_s": 1})
    assert http("PUT", cluster.url(leader) + "/v1/jobs/ui-late", late, token)[0] == 201
    page.goto(url + "/ui/#/job/ui-late")
    page.wait_for_selector("#timeline .cell.queued.deadline_missed[title*='deadline missed']")
    page.goto(url + "/ui/#/cluster")
    page.wait_for_selector("#data td:has-text('ui-late')")
    # Its queued run, cancelled from the run's page with a reason: recorded skipped, and the page
    # says why.
    queued = [r["id"] for r in http("GET", url + "/v1/jobs/ui-late/runs", None, token)[1]["runs"]
              if r["state"] == "queued"][0]
    page.goto(url + "/ui/#/run/" + quote(queued, safe=""))
    page.once("dialog", lambda d: d.accept("  no worker has that pool  "))
    page.click("button[data-action='cancel']")
    wait_for(lambda: http("GET", url + "/v1/runs/" + quote(queued, safe=""), None, token)[1]["state"] == "skipped",
             10, "the run cancelled")
    assert page.wait_for_selector("#run-why").inner_text() == "cancelled: cancelled by request: no worker has that pool"
    page.wait_for_selector("#banner:not([hidden]):has-text('cancelled: queued -> skipped')")
    # The slot run again from the same page (its run ended: skipped): a new run by hand of it.
    page.once("dialog", lambda d: d.accept())
    page.click("button[data-action='run again']")
    page.wait_for_selector(f"#banner:not([hidden]):has-text('{queued}#manual queued')")
    assert http("GET", url + "/v1/runs/" + quote(queued + "#manual", safe=""), None, token)[1]["kind"] == "manual"
    # Its backlog at once, from the job's page: two runs by hand, both queued (no worker has the pool).
    backlog = [http("POST", cluster.url(leader) + "/v1/jobs/ui-late/trigger", None, token)[1]["run"] for _ in range(2)]
    page.goto(url + "/ui/#/job/ui-late")
    page.once("dialog", lambda d: d.accept("drop the backlog"))
    page.click("button[data-action='cancel queued']")
    wait_for(lambda: all(http("GET", url + "/v1/runs/" + quote(r, safe=""), None, token)[1]["error"]
                         == "cancelled by request: drop the backlog" for r in backlog), 10, "the backlog cancelled")
    page.wait_for_selector("#banner:not([hidden]):has-text('queued run(s) of ui-late cancelled')")

    # A dead run, requeued from the page: it runs again (a second attempt).
    failing = {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["sh", "-c", "exit 3"]},
               "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}}
    assert http("PUT", cluster.url(leader) + "/v1/jobs/ui-dead", failing, token)[0] == 201
    s, trig = http("POST", cluster.url(leader) + "/v1/jobs/ui-dead/trigger", None, token)
    assert s == 201, trig
    run = trig["run"]
    wait_for(lambda: http("GET", url + "/v1/runs/" + run, None, token)[1]["state"] == "dead", 20, "the run dead")
    # Its health, as the API reports it: failing on the cluster page, one failure in a row on its own.
    page.goto(url + "/ui/#/cluster")
    page.wait_for_selector("#health tr[data-job='ui-dead']")
    page.goto(url + "/ui/#/job/ui-dead")
    page.wait_for_selector("#job-health tr[data-job='ui-dead'] td:nth-child(2):has-text('1')")
    page.goto(url + "/ui/#/dlq")
    page.once("dialog", lambda d: d.accept())
    page.click(f"tr[data-run='{run}'] button[data-action='requeue']")
    wait_for(lambda: len(http("GET", url + "/v1/runs/" + run, None, token)[1]["attempts"]) >= 2, 20,
             "the requeued run's second attempt")
    # A pipeline: the child's page shows what it runs after (a link to the parent's page), the
    # parent's what runs after it.
    child = {"after": [{"job": "ui-tick", "on": "success"}], "executor": {"type": "shell", "argv": ["true"]}}
    assert http("PUT", cluster.url(leader) + "/v1/jobs/ui-child", child, token)[0] == 201
    page.goto(url + "/ui/#/job/ui-child")
    page.wait_for_selector("#graph td:has-text('success')")
    page.wait_for_selector("#graph a[href='#/job/ui-tick']")
    page.goto(url + "/ui/#/job/ui-tick")
    page.wait_for_selector("#graph a[href='#/job/ui-child']")
    page.goto(url + "/ui/#/job/ui-dead")
    page.wait_for_selector("#graph p:has-text('runs after no job')")
    # A heartbeat job's slots wait for a ping: "waiting", coloured and a filter of the runs page.
    beat = {"schedule": {"every_s": 1}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
            "overlap": {"policy": "allow"}}
    assert http("PUT", cluster.url(leader) + "/v1/jobs/ui-beat", beat, token)[0] == 201
    page.goto(url + "/ui/#/job/ui-beat")
    cell = page.wait_for_selector("#timeline .cell.waiting")
    assert cell.evaluate("c => getComputedStyle(c).backgroundColor") != page.eval_on_selector(
        ".legend .cell.skipped", "c => getComputedStyle(c).backgroundColor"), "waiting has a colour of its own"
    page.goto(url + "/ui/#/runs")
    page.select_option("#r-state", "waiting")
    page.click("form.filters button[type=submit]")
    page.wait_for_selector("#data td .pill.waiting")
    # A link to the page with a query string (a bookmark's, a tracker's) opens it.
    page.goto(url + "/ui/?from=a-link#/jobs")
    page.wait_for_selector("tr[data-job='ui-beat']")
    # (The list shows a pipeline child, which has no schedule, too.)
    page.wait_for_selector("tr[data-job='ui-child'] td:has-text('after ui-tick')")
    assert not page.errors, page.errors

    # A reader sees the same pages and no action.
    s, b = http("POST", url + "/v1/tokens", {"role": "reader"}, token)
    assert s == 201, b
    reader = _open(browser, url, b["token"])
    reader.goto(url + "/ui/#/jobs")
    reader.wait_for_selector("tr[data-job='ui-tick']")
    assert reader.locator("button[data-action]").count() == 0
    assert "read-only" in reader.text_content("#who")
    assert not reader.errors, reader.errors
    reader.close()

    # A token limited to a tenant sees that tenant's jobs and backfills only (here none).
    s, b = http("POST", url + "/v1/tokens", {"role": "operator", "tenants": ["elsewhere"]}, token)
    assert s == 201, b
    limited = _open(browser, url, b["token"])
    assert "elsewhere" in limited.text_content("#who")
    limited.goto(url + "/ui/#/jobs")
    limited.wait_for_selector("#data p:has-text('0 of 0 jobs')")
    assert limited.locator("tr[data-job]").count() == 0
    limited.goto(url + "/ui/#/backfills")
    limited.wait_for_selector("#data p:has-text('no backfill')")
    limited.close()

    # The node the page talks to loses the leader (the two others stopped): the page says so,
    # and stops saying so once they are back and a leader is known again. A tab on a node that
    # follows now (leadership may have moved since the start).
    page.close()
    lead = cluster.wait_leader(30)
    via = (lead + 1) % 3
    page = _open(browser, cluster.url(via), token)
    others = [i for i in range(3) if i != via]
    try:
        for i in others:
            cluster.kill(i, signal.SIGSTOP)
        page.wait_for_selector("#banner:has-text('lost the leader')")
        page.wait_for_selector("#strip-leader:has-text('none')")
    finally:
        for i in others:
            cluster.kill(i, signal.SIGCONT)
    page.wait_for_selector("#banner", state="hidden")
    page.wait_for_selector("#strip-leader:not(:has-text('none'))")
