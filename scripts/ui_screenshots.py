#!/usr/bin/env python3
"""Remake the dashboard's screenshots in docs/ui.md: a three-node cluster on free loopback ports,
a few jobs (one paused then resumed, one failing into the dead-letter queue, one backfilled), and
headless chromium (Debian's, /usr/bin/chromium; Playwright never downloads one) photographing each
page. Every process started is stopped by its PID.

    .venv/bin/python scripts/ui_screenshots.py [--out docs/ui]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftsched.core.schedule import iso  # noqa: E402
from raftsched.testing.cluster import LocalCluster, http  # noqa: E402
from raftsched.testing.procs import wait_for  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
PAGES = [("cluster", "#/cluster", "#strip-leader"), ("jobs", "#/jobs", "tr[data-job]"),
         ("job", "#/job/ticker", "#timeline .cell"), ("runs", "#/runs", "table"),
         ("dlq", "#/dlq", "tr[data-run]"), ("backfills", "#/backfills", "table"), ("at", "#/at", "#at-form")]


def populate(c: LocalCluster, leader: int) -> None:
    url, tok = c.url(leader), c.token

    def put(name: str, spec: dict) -> None:
        s, b = http("PUT", f"{url}/v1/jobs/{name}", spec, tok)
        assert s in (200, 201), b

    shell = {"type": "shell", "argv": ["sh", "-c", "echo ok"]}
    put("nightly-report", {"schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, "executor": shell,
                           "misfire": {"policy": "skip"}, "labels": {"team": "billing"}})
    put("ticker", {"schedule": {"every_s": 1}, "executor": shell, "misfire": {"policy": "fire_once", "grace_s": 1},
                   "deadline": {"start_within_s": 1},
                   "labels": {"team": "ops"}})
    put("flaky", {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["sh", "-c", "echo no >&2; exit 3"]},
                  "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}})
    wait_for(lambda: len(http("GET", f"{url}/v1/jobs/ticker/runs", None, tok)[1]["runs"]) >= 6, 30, "ticker runs")
    assert http("POST", f"{url}/v1/jobs/ticker/pause", None, tok)[0] == 200
    now = http("GET", f"{url}/v1/cluster", None, tok)[1]["state_now_ms"]
    wait_for(lambda: http("GET", f"{url}/v1/cluster", None, tok)[1]["state_now_ms"] > now + 3000, 10, "a pause")
    assert http("POST", f"{url}/v1/jobs/ticker/resume", None, tok)[0] == 200
    run = http("POST", f"{url}/v1/jobs/flaky/trigger", None, tok)[1]["run"]
    wait_for(lambda: http("GET", f"{url}/v1/runs/{run}", None, tok)[1]["state"] == "dead", 30, "a dead run")
    now = http("GET", f"{url}/v1/cluster", None, tok)[1]["state_now_ms"]
    s, b = http("POST", f"{url}/v1/jobs/nightly-report/backfills",
                {"from": iso(now - 5 * 86_400_000), "to": iso(now), "id": "report-outage", "max_concurrent": 1}, tok)
    assert s in (200, 201), b
    wait_for(lambda: len(http("GET", f"{url}/v1/jobs/ticker/runs", None, tok)[1]["runs"]) >= 20, 30, "more runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "ui"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright
    tmp = Path(tempfile.mkdtemp(prefix="raftsched-ui-shots-"))
    try:
        (tmp / "cluster").mkdir()
        with LocalCluster(tmp / "cluster") as c:
            c.start()
            leader = c.wait_leader(60)
            populate(c, leader)
            with sync_playwright() as p:
                ctx = p.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=args.chromium,
                                                           headless=True, args=FLAGS,
                                                           viewport={"width": 1200, "height": 720})
                try:
                    page = ctx.new_page()
                    page.goto(c.url((leader + 1) % 3) + "/ui/")
                    page.fill("#token", c.token)
                    page.click("#login button[type=submit]")
                    page.wait_for_selector("#who:not(:empty)")
                    for name, frag, ready in PAGES:
                        page.goto(c.url((leader + 1) % 3) + "/ui/" + frag)
                        page.wait_for_selector(ready)
                        if name == "at":
                            page.fill("#at-job", "ticker")
                            first = http("GET", c.url(leader) + "/v1/jobs/ticker/runs?state=skipped", None, c.token)[1]["runs"]
                            page.fill("#at-time", _local(page, first[0]["slot"]) if first else "2030-01-01T00:00:00")
                            page.click("#at-form button")
                            page.wait_for_selector("#at-out table, #at-out p")
                        page.wait_for_timeout(300)  # let a refresh that is under way finish drawing
                        _save_small(page.screenshot(), out / f"{name}.png")
                        print(f"{out / (name + '.png')}: {(out / (name + '.png')).stat().st_size} bytes")
                finally:
                    ctx.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _save_small(png: bytes, path: Path) -> None:
    """The screenshot in at most 256 colours (Pillow, which matplotlib brings): a third of the
    bytes, the text as sharp."""
    import io

    from PIL import Image
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


def _local(page, iso_text: str) -> str:
    """``iso_text`` as a datetime-local input's value in the browser's zone."""
    return page.evaluate("""t => { const d = new Date(t); const p = n => String(n).padStart(2, "0");
        return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`; }""",
                         iso_text)


if __name__ == "__main__":
    sys.exit(main())
