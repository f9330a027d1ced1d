"""A nightly report pipeline declared with the raftsched SDK (docs/sdk.md walks through it).

Two jobs of the app ``reports``:

- ``nightly-report``, at 02:00 Berlin time, writes the report of the day that just ended into
  a SQLite database. Its misfire policy is ``fire_all`` with ``max_catchup`` 7: a cluster that
  was down over a weekend makes each missed day's report when it is back, up to a week of them.
  A failed attempt is retried 3 times, a minute apart and then longer. The handler is
  idempotent: the report of a day is one row, and a write carries the run's fencing token, which
  the row keeps; a write with a lower token than the row's is refused by the database itself,
  so a stale runner (one whose lease expired while it was paused, and whose run was given to
  another worker) cannot overwrite the newer attempt's report.
- ``refresh-dashboard``, every 15 minutes, async: only the latest refresh matters, so missed
  slots coalesce into one run (``fire_once``) and a slot is skipped while the previous refresh
  is still queued or running (``overlap="forbid"``).

Make a cluster hold them (from this directory, so that ``nightly_report`` is importable)::

    cd examples
    raftsched sync nightly_report:app --dry-run      # what would change
    raftsched sync nightly_report:app                # apply it; a second run changes nothing

The database is ``$REPORTS_DB``, by default ``reports.db`` in ``$XDG_DATA_HOME/raftsched-examples``
(``~/.local/share/raftsched-examples``): outside the source tree, and not in a temporary
directory that nobody removes.
"""
from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from datetime import timedelta
from zoneinfo import ZoneInfo

from raftsched import App

BERLIN = ZoneInfo("Europe/Berlin")

app = App(
    "reports",
    queue="reports",
    retry={"max_attempts": 3, "backoff_s": 60, "backoff_max_s": 600},
    description="the reports pipeline (examples/nightly_report.py)",
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (day TEXT NOT NULL, amount_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reports (
    day     TEXT PRIMARY KEY,
    body    TEXT NOT NULL,          -- JSON
    token   INTEGER NOT NULL,       -- the fencing token of the write that stored it
    run_id  TEXT NOT NULL
);
"""


def db_path() -> str:
    """``$REPORTS_DB``, else reports.db in the user's data directory (made if missing)."""
    if os.environ.get("REPORTS_DB"):
        return os.environ["REPORTS_DB"]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    d = os.path.join(base, "raftsched-examples")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return os.path.join(d, "reports.db")


def connect() -> sqlite3.Connection:
    db = sqlite3.connect(db_path(), timeout=30, isolation_level=None)
    db.executescript(_SCHEMA)
    return db


def write_report(db: sqlite3.Connection, day: str, body: dict, token: int, run_id: str) -> bool:
    """Store the report of ``day`` unless a write with a higher fencing token stored it already:
    the check and the write are one statement, so two runners cannot both pass the check.
    Returns whether this write was kept."""
    cur = db.execute(
        "INSERT INTO reports (day, body, token, run_id) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (day) DO UPDATE SET body = excluded.body, token = excluded.token, run_id = excluded.run_id "
        "WHERE excluded.token >= reports.token",
        (day, json.dumps(body, sort_keys=True), token, run_id))
    return cur.rowcount == 1


@app.job("nightly-report", cron="0 2 * * *", timezone="Europe/Berlin",
         misfire={"policy": "fire_all", "max_catchup": 7, "grace_s": 300}, timeout_s=1800)
def nightly_report(ctx):
    # The slot, not the clock, says which day: a report made late, or made again, is the same.
    day = (ctx.slot.astimezone(BERLIN) - timedelta(days=1)).date().isoformat()
    db = connect()
    try:
        n, total = db.execute("SELECT count(*), coalesce(sum(amount_cents), 0) FROM orders WHERE day = ?",
                              (day,)).fetchone()
        body = {"day": day, "orders": n, "revenue_cents": total}
        kept = write_report(db, day, body, ctx.fencing_token, ctx.run_id)
    finally:
        db.close()
    if not kept:
        ctx.log.warning("report %s: token %d refused, a newer attempt wrote it", day, ctx.fencing_token)
    ctx.log.info("report %s: %d orders (attempt %d, token %d)", day, n, ctx.attempt, ctx.fencing_token)
    return {"day": day, "kept": kept, **body}


@app.job("refresh-dashboard", every_s=900, misfire="fire_once", overlap="forbid", timeout_s=120, priority=3)
async def refresh_dashboard(ctx):
    await asyncio.sleep(0)  # stands for the awaited calls of a real refresh
    ctx.log.info("dashboard refreshed for %s", ctx.slot_iso)
    return {"refreshed_for": ctx.slot_iso}
