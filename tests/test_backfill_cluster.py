"""Backfills on three real node processes (docs/backfill.md): a rate-limited backfill of a past
range takes the time its rate implies and runs exactly the slots its dry run listed; a kill -9 of
the leader part-way loses and duplicates nothing; the CLI's backfill --wait and requeue
--all-matching. One cluster for the module."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from raftsched.client import Client
from raftsched.core import schedule

from procs import Cluster, REPO, running_cluster, wait_for

pytestmark = pytest.mark.cluster

EVERY_SECOND = {"schedule": {"cron": "* * * * * *"}, "executor": {"type": "shell", "argv": ["true"]},
                "misfire": {"policy": "skip"}, "history": 1000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("backfill"))


def client(c: Cluster, nodes=None) -> Client:
    return Client([c.url(i) for i in (nodes if nodes is not None else range(3))], token=c.token,
                  timeout_s=10, deadline_s=30)


def past_range(seconds_back: int, seconds: int) -> tuple[str, str, int]:
    """``[now - back, now - back + seconds)`` on whole seconds: ``seconds`` slots of a
    every-second cron job, all before the job existed (so none ran)."""
    now_s = int(time.time())
    lo = now_s - seconds_back
    return schedule.iso(lo * 1000), schedule.iso((lo + seconds) * 1000), seconds


def backfill_runs(cl: Client, job: str, bf_id: str) -> list[dict]:
    return [r for r in cl.runs(job, limit=5000, consistent=True)["runs"] if r.get("backfill") == bf_id]


def test_a_rate_limited_backfill_takes_the_time_its_rate_implies_and_runs_what_it_dry_ran(cluster):
    cl = client(cluster)
    cl.put_job("bf-rate", EVERY_SECOND)
    lo, hi, n = past_range(30, 10)
    rate = 4.0
    dry = cl.backfill("bf-rate", lo, hi, max_concurrent=n, rate_per_s=rate, dry_run=True)
    assert len(dry["slots"]) == n and dry["left_out"] == [], dry
    t0 = time.monotonic()
    v = cl.backfill("bf-rate", lo, hi, max_concurrent=n, rate_per_s=rate, backfill_id="rate-1")
    assert v["state"] == "running" and v["progress"]["planned"] == n
    end = cl.wait_backfill("rate-1", poll_s=0.2, timeout_s=60)
    wall = time.monotonic() - t0
    assert end["state"] == "done" and end["progress"]["succeeded"] == n, end
    runs = backfill_runs(cl, "bf-rate", "rate-1")
    assert sorted(r["slot"] for r in runs) == dry["slots"], "it ran other slots than its dry run listed"
    assert len({r["slot"] for r in runs}) == n
    # The bucket holds one token at the start and gains `rate` a second: the last of n runs is
    # made no earlier than (n - 1) / rate after the backfill (state time, the leader's clock).
    created = schedule.parse_iso_ms(end["created_at"], "created_at")
    last = max(schedule.parse_iso_ms(r["fired_at"], "fired_at") for r in runs)
    assert last - created >= (n - 1) / rate * 1000 - 1, (last - created)
    assert wall < 45, f"a 10-slot backfill at 4/s took {wall:.1f} s"
    cl.delete_job("bf-rate")


def test_a_leader_killed_during_a_backfill_loses_and_duplicates_nothing(cluster):
    leader = cluster.wait_leader(30)
    cl = client(cluster)
    cl.put_job("bf-kill", EVERY_SECOND)
    lo, hi, n = past_range(40, 15)
    dry = cl.backfill("bf-kill", lo, hi, max_concurrent=n, rate_per_s=3, dry_run=True)
    assert len(dry["slots"]) == n
    cl.backfill("bf-kill", lo, hi, max_concurrent=n, rate_per_s=3, backfill_id="kill-1")
    wait_for(lambda: cl.get_backfill("kill-1")["progress"]["created"] >= 3, 30, "three runs made")
    cluster.kill(leader, signal.SIGKILL)
    survivors = [i for i in range(3) if i != leader]
    try:
        cluster.wait_leader(30, among=survivors)
        cs = client(cluster, survivors)
        end = cs.wait_backfill("kill-1", poll_s=0.3, timeout_s=90)
        assert end["state"] == "done" and end["progress"]["created"] == n, end
        for i in survivors:
            runs = backfill_runs(client(cluster, [i]), "bf-kill", "kill-1")
            slots = [r["slot"] for r in runs]
            assert len(slots) == len(set(slots)), f"node-{i + 1}: a slot of the backfill has two runs"
            assert sorted(slots) == dry["slots"], f"node-{i + 1}: a slot was lost or added"
    finally:
        cluster.start(leader)
        cluster.wait_leader(30)
        wait_for(lambda: cluster.status(leader) is not None and cluster.status(leader).get("leader"), 30,
                 "the restarted node follows")
    client(cluster).delete_job("bf-kill")


def cli(c: Cluster, *args):
    urls = ",".join(c.url(i) for i in range(3))
    return subprocess.run([sys.executable, "-m", "raftsched.cli", *args, "--url", urls, "--token", c.token],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_cli_backfills_with_a_progress_bar_and_requeues_all_matching(cluster):
    cl = client(cluster)
    cl.put_job("bf-cli", EVERY_SECOND)
    lo, hi, n = past_range(20, 3)
    p = cli(cluster, "backfill", "bf-cli", "--from", lo, "--to", hi, "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(json.loads(p.stdout)["slots"]) == n
    p = cli(cluster, "backfill", "bf-cli", "--from", lo, "--to", hi, "--max-concurrent", "2", "--wait")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[" not in p.stderr, p.stderr  # the progress bar is drawn on a terminal only (here: a pipe)
    # piped: JSON, as every answer (it printed the text table whatever -o said)
    end = json.loads(p.stdout)
    assert end["state"] == "done" and sum(r["state"] == "succeeded" for r in end["runs"]) >= n, end
    cl.put_job("bf-dead", {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["false"]},
                           "misfire": {"policy": "skip"}})
    run = cl.trigger("bf-dead")["run"]
    wait_for(lambda: any(r["id"] == run for r in cl.dlq()["runs"]), 30, "the run is dead")
    p = cli(cluster, "requeue", "--all-matching", "--job", "bf-dead", "--dry-run")
    assert p.returncode == 0 and json.loads(p.stdout)["runs"] == [run], p.stdout + p.stderr
    p = cli(cluster, "requeue", "--all-matching", "--job", "bf-dead", "--wait", "-o", "table")
    assert p.returncode == 0 and "requeued 1" in p.stdout, p.stdout + p.stderr  # the table, asked for
    p = cli(cluster, "requeue")
    assert p.returncode == 2 and "--all-matching" in p.stderr
    for argv in (("--all-matching",), ("--all-matching", "--dry-run", "--max", "5")):
        p = cli(cluster, "purge", *argv)  # no filter: every dead run; refused unless --all says so
        assert p.returncode == 2 and "--all to mean that" in p.stderr, p.stdout + p.stderr
    p = cli(cluster, "purge", "--all", "--dry-run")
    assert p.returncode == 0 and json.loads(p.stdout)["dry_run"] is True, p.stdout + p.stderr
    for job in ("bf-cli", "bf-dead"):
        cl.delete_job(job)
