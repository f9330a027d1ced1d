"""The nightly report as a pipeline: extract, then transform, then report, each step only after
the one before it succeeded for the same night (docs/pipelines.md).

Declared with the SDK (``app``): ``extract`` runs at 02:00 Berlin time; ``transform`` and
``report`` have no schedule of their own: each runs for a night exactly when its parent
succeeded for that night (``after``), sees its parent's outcome and result in ``ctx.upstream``,
and returns a small result of its own for the next step. A transform that fails all its attempts
records that night's report ``upstream_failed``; requeuing the transform from the dead-letter
queue re-arms the report, which then runs when the transform succeeds.

Being told (docs/notifications.md): each step routes its dead runs, its missed slots (a report
its parents decided will not run is one: ``upstream_failed``), its missed deadlines and its
recovery to the sink ``ops``. Extract must start within 15 minutes of 02:00 and succeed within
two hours. The report must be published by 06:00 (Berlin time, extract's zone: its night is
extract's slot), so a transform still running at 06:00 is a ``deadline.missed`` for the report
at 06:00 (cause ``upstream``); and it must succeed at least every 26 hours, whatever its slots
did. Create the sink first (a route to a sink that does not exist sends nothing)::

    cd examples
    echo '{"type": "webhook", "url": "https://hooks.example.com/raftsched",
           "secrets": {"signing_key": "change-me"}}' | raftsched sinks put ops -
    raftsched sync nightly_pipeline:app          # creates extract, then transform, then report
    raftsched worker --app nightly_pipeline:app --url http://127.0.0.1:8701 --token-file ../.raftsched/token

Run as a script, ``demo`` shows the same chain with shell jobs the nodes' own workers run, against
a running cluster (``./scripts/cluster.sh``): it creates three jobs under a fresh prefix, runs the
chain once (a manual run of the first step, asked to propagate), prints each step's run and the
results handed down, and deletes the jobs again, leaving nothing behind::

    .venv/bin/python examples/nightly_pipeline.py demo --url http://127.0.0.1:8701 --token-file .raftsched/token
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from raftsched import App

if __name__ == "__main__":
    # Run as a script this file is ``__main__``, where the SDK refuses handlers (a worker could not
    # import them): run the same code as the module ``nightly_pipeline`` instead.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import nightly_pipeline

    sys.exit(nightly_pipeline.main())

app = App("nightly-pipeline", retry={"max_attempts": 3, "backoff_s": 60, "backoff_max_s": 600})

#: Who hears of what: one route to the sink ``ops`` for each step, a dead run once an incident.
TOLD = [{"sink": "ops", "on": ["run.dead", "slot.missed", "deadline.missed", "job.recovered"]}]


@app.job("extract", cron="0 2 * * *", timezone="Europe/Berlin", misfire="fire_all", timeout_s=1800,
         deadline={"start_within_s": 900, "succeed_within_s": 2 * 3600}, notify=TOLD)
def extract(ctx):
    """Pull the night's orders; the count is handed to transform."""
    return {"night": ctx.slot_iso, "rows": 42}


def parent_result(ctx) -> dict:
    """The one parent's result for this night: its run for the same slot (``ctx.upstream``: its
    id, outcome, token and result). A run by hand (raftsched trigger) has no parents' outcomes
    (``ctx.upstream`` is None): it fails saying so, not with a TypeError."""
    if ctx.upstream is None:
        raise RuntimeError(f"{ctx.job} runs after its parent: run the night from the top "
                           "(trigger or backfill extract, --cascade children)")
    (up,) = ctx.upstream
    return up["result"]


@app.job("transform", after=["extract"], max_wait_s=6 * 3600, timeout_s=1800, notify=TOLD)
def transform(ctx):
    got = parent_result(ctx)
    return {"night": got["night"], "clean_rows": got["rows"] - 2}


@app.job("report", after=["transform"], max_wait_s=6 * 3600, timeout_s=600,
         deadline={"succeed_by": "06:00", "max_since_success_s": 26 * 3600}, notify=TOLD)
def report(ctx):
    got = parent_result(ctx)
    ctx.log.info("report for %s: %d rows", got["night"], got["clean_rows"])
    return {"published": True}


# ---------------------------------------------------------------------------- the demo
def _shell(script: str) -> dict:
    return {"type": "shell", "argv": ["sh", "-c", script]}


def demo(url: str, token: str, timeout_s: float = 60.0) -> int:
    from raftsched.client import Client

    client = Client([u for u in url.split(",") if u], token=token)
    prefix = f"demo-pipeline-{os.getpid()}-{int(time.time())}"
    ex, tr, rp = f"{prefix}-extract", f"{prefix}-transform", f"{prefix}-report"
    jobs = {
        # A schedule far apart: the demo runs it by hand, asking the run to propagate.
        ex: {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"},
             "executor": _shell('echo extracting; echo \'{"rows": 42}\' > "$RAFTSCHED_RESULT_FILE"')},
        tr: {"after": [ex], "executor": _shell(
            'echo "transform of $RAFTSCHED_SLOT after: $RAFTSCHED_UPSTREAM"; '
            'echo \'{"clean_rows": 40}\' > "$RAFTSCHED_RESULT_FILE"')},
        rp: {"after": [{"job": tr, "on": "success"}],
             "executor": _shell('echo "report of $RAFTSCHED_SLOT from: $RAFTSCHED_UPSTREAM"')},
    }
    try:
        client.put_jobs(jobs)  # one batch: the nodes put parents first
        g = client.graph(rp)
        print("graph:", ", ".join(f"{e['from']} -> {e['to']} ({e['on']})" for e in g["edges"]))
        first = client.trigger(ex, propagate=True)
        slot = client.get_run(first["run"])["slot"]
        print(f"triggered {first['run']} (slot {slot}); waiting for {rp}@{slot}")
        deadline = time.monotonic() + timeout_s
        while True:
            chain = client.runs(rp, slot=slot).get("pipeline", [])
            states = {r["job"]: r["state"] for r in chain}
            if states.get(rp) in ("succeeded", "dead", "skipped") or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # ok-sleep: a poll with a deadline
        for r in sorted(chain, key=lambda r: [ex, tr, rp].index(r["job"])):
            print(f"  {r['id']}: {r['state']}" + (f" ({r.get('waiting_for')})" if r["state"] == "waiting" else ""))
            for u in r.get("upstream") or []:
                print(f"      after {u['run']} {u['outcome']}, token {u['token']}, result {json.dumps(u.get('result'))}")
        ok = states.get(rp) == "succeeded"
        print("the chain ran" if ok else f"the chain did not finish in {timeout_s:g} s: {states}")
        return 0 if ok else 1
    finally:
        for name in (rp, tr, ex):  # children first: a parent with dependents is not deleted without force
            try:
                client.delete_job(name)
            except Exception as e:  # report and go on: the rest still goes
                print(f"could not delete {name}: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the chain once with shell jobs against a running cluster, then delete them")
    d.add_argument("--url", default=os.environ.get("RAFTSCHED_URL", "http://127.0.0.1:8701"))
    d.add_argument("--token-file", default=".raftsched/token")
    d.add_argument("--timeout-s", type=float, default=60.0)
    a = p.parse_args(argv)
    token = os.environ.get("RAFTSCHED_TOKEN") or open(a.token_file).read().strip()
    return demo(a.url, token, a.timeout_s)
