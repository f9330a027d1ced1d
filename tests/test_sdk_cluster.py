"""The SDK against three real nodes (one cluster for the module): ``raftsched sync`` of the
example app twice (the second changes nothing), ``--prune`` deleting only this app's removed
jobs, and the AsyncClient calling every endpoint once. tests/test_sdk_worker_cluster.py runs the
apps' handlers with ``raftsched worker --app``."""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
import subprocess
import sys
import textwrap

import pytest

from procs import Cluster, REPO, running_cluster

from raftsched import AsyncClient
from raftsched.client import LockHeld
from raftsched.core.errors import Conflict, NotFound, RaftschedError
from test_client_coverage import CALLS

pytestmark = pytest.mark.cluster

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk")
    # The nodes' workers run the async client's shell job; the apps' handlers are run by their
    # own workers (tests/test_sdk_worker_cluster.py): the nodes never import them.
    yield from running_cluster(tmp, node_args=["--slots", "2"])


def sync(c: Cluster, ref: str, *args: str, cwd=EXAMPLES) -> tuple[int, str, str]:
    urls = ",".join(c.url(i) for i in range(c.n))
    p = subprocess.run([sys.executable, "-m", "raftsched.cli", "sync", ref, "--url", urls, "--token", c.token,
                        *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def job(c: Cluster, name: str) -> dict | None:
    s, b = c.get(c.wait_leader(30), f"/v1/jobs/{name}?consistent=true")
    return b if s == 200 else None


def test_sync_creates_the_jobs_then_a_second_sync_changes_nothing(cluster):
    rc, out, err = sync(cluster, "nightly_report:app", "--dry-run")
    assert rc == 0, err
    assert "create     nightly-report" in out and "(dry run)" in out
    assert job(cluster, "nightly-report") is None  # a dry run changes nothing

    rc, out, err = sync(cluster, "nightly_report:app")
    assert rc == 0, err
    assert "plan: 2 to create, 0 to update, 0 unchanged, 0 to delete" in out
    assert "applied: 2 created, 0 updated, 0 deleted" in out
    nightly = job(cluster, "nightly-report")
    assert nightly["spec"]["labels"] == {"raftsched.app": "reports"}
    assert nightly["spec"]["executor"] == {"type": "python", "target": "nightly_report:nightly_report"}
    assert nightly["spec"]["misfire"] == {"policy": "fire_all", "grace_s": 300, "max_catchup": 7}
    gens = {n: job(cluster, n)["state"]["generation"] for n in ("nightly-report", "refresh-dashboard")}

    rc, out, err = sync(cluster, "nightly_report:app", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["plan"]["unchanged"] == ["nightly-report", "refresh-dashboard"]
    assert not res["plan"]["create"] and not res["plan"]["update"] and res["applied"] is None
    # Nothing was written: a replace would have given the jobs a new generation.
    assert {n: job(cluster, n)["state"]["generation"] for n in gens} == gens
    rc, out, err = sync(cluster, "nightly_report:app")
    assert rc == 0 and "nothing to change" in out, (out, err)


def test_prune_deletes_only_this_apps_undeclared_jobs(cluster, tmp_path):
    mod = tmp_path / "pruned_jobs.py"
    mod.write_text(textwrap.dedent("""
        from raftsched import App
        app = App("pruned", misfire="skip")

        @app.job("pruned-kept", every_s=3600)
        def kept(ctx):
            return None

        @app.job("pruned-dropped", every_s=3600)
        def dropped(ctx):
            return None
    """))
    assert sync(cluster, "pruned_jobs:app", cwd=tmp_path)[0] == 0
    leader = cluster.wait_leader(30)
    base = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    for name, labels in (("pruned-by-hand", None), ("pruned-other-app", {"raftsched.app": "someone-else"})):
        s, b = cluster.call(leader, "PUT", f"/v1/jobs/{name}", dict(base, labels=labels) if labels else base)
        assert s == 201, b

    # "pruned-dropped" is no longer declared.
    mod.write_text(mod.read_text().replace('@app.job("pruned-dropped", every_s=3600)', ""))
    rc, out, err = sync(cluster, "pruned_jobs:app", cwd=tmp_path)
    assert rc == 0, err
    assert "undeclared pruned-dropped" in out and job(cluster, "pruned-dropped") is not None  # kept without --prune

    # A job outside the app runs after it: the node would refuse its delete (409). The dry run
    # said "1 to delete" and exit 0, and the sync then failed part-way: both say so, apply nothing.
    s, b = cluster.call(leader, "PUT", "/v1/jobs/pruned-follower",
                        {"after": ["pruned-dropped"], "executor": {"type": "shell", "argv": ["true"]}})
    assert s == 201, b
    for extra in (("--dry-run",), ("--json",)):
        rc, out, err = sync(cluster, "pruned_jobs:app", "--prune", *extra, cwd=tmp_path)
        assert rc == 1 and "job pruned-follower runs after pruned-dropped, which --prune would delete" in err, (out, err)
        assert job(cluster, "pruned-dropped") is not None
    assert json.loads(out)["blocked_deletes"] == [{"job": "pruned-follower", "runs_after": "pruned-dropped"}]
    assert cluster.call(leader, "DELETE", "/v1/jobs/pruned-follower")[0] == 200

    rc, out, err = sync(cluster, "pruned_jobs:app", "--prune", "--dry-run", cwd=tmp_path)
    assert rc == 0 and "delete     pruned-dropped" in out, (out, err)
    assert job(cluster, "pruned-dropped") is not None

    rc, out, err = sync(cluster, "pruned_jobs:app", "--prune", "--json", cwd=tmp_path)
    assert rc == 0, err
    res = json.loads(out)
    assert res["plan"]["delete"] == ["pruned-dropped"] and res["applied"]["deleted"] == ["pruned-dropped"]
    assert job(cluster, "pruned-dropped") is None
    for name in ("pruned-kept", "pruned-by-hand", "pruned-other-app"):
        assert job(cluster, name) is not None, name
    # the example app's jobs (another app) are untouched too
    rc, out, _ = sync(cluster, "pruned_jobs:app", "--prune", cwd=tmp_path)
    assert rc == 0 and "nothing to change" in out


def test_a_declaration_of_another_apps_job_is_a_conflict_and_applies_nothing(cluster, tmp_path):
    (tmp_path / "thief_jobs.py").write_text(textwrap.dedent("""
        from raftsched import App
        app = App("thief", misfire="skip")

        @app.job("pruned-other-app", every_s=60)
        def steal(ctx):
            return None

        @app.job("thief-new", every_s=60)
        def new(ctx):
            return None
    """))
    leader = cluster.wait_leader(30)
    base = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    cluster.call(leader, "PUT", "/v1/jobs/pruned-other-app", dict(base, labels={"raftsched.app": "someone-else"}))
    rc, out, err = sync(cluster, "thief_jobs:app", cwd=tmp_path)
    assert rc == 1 and "conflict   pruned-other-app" in out and "nothing applied" in err, (out, err)
    assert job(cluster, "thief-new") is None
    assert job(cluster, "pruned-other-app")["spec"]["labels"] == {"raftsched.app": "someone-else"}
    rc, _, err = sync(cluster, "thief_jobs:nope", cwd=tmp_path)
    assert rc == 2 and "has no 'nope'" in err


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_async_client_calls_every_endpoint_of_a_live_cluster(cluster):
    """One call of each endpoint (the names of test_client_coverage.CALLS, which the router's
    routes guard), each answer checked for its shape."""
    urls = [cluster.url(i) for i in range(cluster.n)]
    shell = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["sh", "-c", "exit 3"]},
             "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}}
    called: set[str] = set()

    async def main():
        async with AsyncClient(urls, token=cluster.token, deadline_s=30) as c:
            async def call(name, *args, **kw):
                called.add(name)
                return await getattr(c, name)(*args, **kw)

            h = await call("healthz")
            assert h["ok"] is True and h["role"] in ("leader", "follower") and h["leader"]
            cl = await call("cluster")
            assert cl["leader"] and len(cl["members"]) == 3 and cl["role"] in ("leader", "follower")
            assert (await call("whoami"))["role"] == "admin"
            assert "raftsched_" in await call("metrics")
            assert (await call("openapi"))["openapi"].startswith("3.1")

            assert (await call("put_job", "async-fail", shell))["created"] is True
            planned = await call("plan_jobs", {"async-b": dict(shell, labels={"raftsched.app": "async"})})
            assert planned["dry_run"] is True and planned["jobs"]["async-b"]["action"] == "create", planned
            batch = await call("put_jobs", {"async-b": dict(shell, labels={"raftsched.app": "async"})})
            assert batch["created"] == 1 and batch["jobs"]["async-b"]["created"] is True
            got = await call("get_job", "async-fail", consistent=True)
            assert got["name"] == "async-fail" and got["spec"]["retry"]["max_attempts"] == 1
            page = await call("list_jobs", labels={"raftsched.app": "async"}, consistent=True)
            assert [j["name"] for j in page["jobs"]] == ["async-b"] and page["total"] == 1
            g = await call("graph", "async-fail", consistent=True)
            assert g["job"] == "async-fail" and g["parents"] == g["children"] == []
            pv = await call("preview", "async-fail", 2)
            assert len(pv["slots"]) == 2 and pv["job"] == "async-fail"
            assert len((await call("preview_spec", shell, 3))["slots"]) == 3
            # An outage window after the job exists, from now: any three hours hold three slots of
            # an hourly job (a fixed date would fall before the job once that date is past).
            lo = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=10)
            ex = await call("explain", "async-fail", _iso(lo), _iso(lo + timedelta(hours=3)))
            # an hourly job, skip: three slots fall in a three-hour outage
            assert ex["job"] == "async-fail" and ex["policy"] == "skip" and ex["slots_due"] == 3, ex

            trig = await call("trigger", "async-fail")
            rid = trig["run"]
            assert trig["job"] == "async-fail" and trig["state"] == "queued"
            for _ in range(600):  # the run fails once (max_attempts 1) and is dead: wait for it
                r = await call("get_run", rid)
                if r["state"] == "dead":
                    break
                await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a bounded loop
            assert r["state"] == "dead" and "exit status 3" in (r["error"] or ""), r
            assert any(x["id"] == rid for x in (await call("runs", "async-fail", consistent=True))["runs"])
            assert any(x["id"] == rid for x in (await call("list_runs", state="dead"))["runs"])
            assert rid in [x["id"] for x in (await call("dlq"))["runs"]]
            assert (await call("dlq_get", rid))["state"] == "dead"
            try:  # a dead run is the dead-letter queue's: a cancel says where it is
                await call("cancel_run", rid, "not this one")
                raise AssertionError("a dead run was cancelled")
            except Conflict as e:
                assert e.extra.get("state") == "dead" and "dlq" in e.message, e
            # nor does a job's cancel take it: the job has nothing queued
            assert await call("cancel_job_runs", "async-fail", "nothing queued") == {
                "job": "async-fail", "cancelled": 0, "runs": [], "passed": [], "more": False}
            rq = await call("dlq_requeue", rid)
            assert rq["run"] == rid and rq["state"] == "queued"
            for _ in range(600):
                if (await c.get_run(rid))["state"] == "dead":
                    break
                await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a bounded loop
            assert (await call("dlq_delete", rid))["deleted"] is True
            try:
                await c.dlq_get(rid)
                raise AssertionError("purged run still in the DLQ")
            except NotFound:
                pass

            assert (await call("pause", "async-fail"))["paused"] is True
            assert (await call("resume", "async-fail"))["paused"] is False
            q = await call("put_queue", "async-q", 50, "drop_oldest")
            assert q == {"queue": "async-q", "max_depth": 50, "on_full": "drop_oldest"}
            assert any(x["name"] == "async-q" for x in (await call("queues"))["queues"])
            t = await call("put_tenant", "async-t", 2.5, 3)
            assert t["rate_per_s"] == 2.5 and t["burst"] == 3
            assert any(x["name"] == "async-t" for x in (await call("tenants"))["tenants"])
            t = await call("put_tenant", "async-t", executors=["http", "shell"], placement_labels={"tenant": "t"})
            assert t["policy"]["executors"] == ["http", "shell"]
            assert (await call("tenant", "async-t"))["policy"]["placement"] == {"labels": {"tenant": "t"}}
            assert (await call("delete_tenant", "async-t"))["deleted"] is True

            lk = await call("lock_acquire", "async-lock", "me", 5)
            assert lk["owner"] == "me" and isinstance(lk["token"], int)
            info = await call("lock_info", "async-lock", consistent=True)
            assert info["owner"] == "me" and info["token"] == lk["token"]
            try:
                await c.lock_acquire("async-lock", "someone", 5)
                raise AssertionError("a held lock was acquired twice")
            except LockHeld as e:
                assert e.holder == "me"
            assert (await call("lock_renew", "async-lock", lk["token"], 5))["token"] == lk["token"]
            assert (await call("lock_release", "async-lock", lk["token"]))["released"] is True
            async with c.lock("async-lock", owner="ctx", ttl_s=2) as lease:
                assert lease.token > lk["token"] and not lease.lost.is_set()
            assert await c.lock_info("async-lock", consistent=True) is None

            # Backfills and bulk DLQ operations: dry runs, and the listing.
            past = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
            dry = await call("backfill", "async-fail", _iso(past), _iso(past + timedelta(hours=2)), dry_run=True)
            assert dry["dry_run"] is True and isinstance(dry["slots"], list) and isinstance(dry["left_out"], list)
            assert isinstance((await call("backfills"))["backfills"], list)
            for name in ("get_backfill", "cancel_backfill"):
                try:
                    await call(name, "no-such-backfill")
                    raise AssertionError(f"{name} of an unknown backfill answered")
                except NotFound:
                    pass
            rq = await call("dlq_requeue_matching", job="async-fail", dry_run=True)
            # (the job's dead run was requeued and purged above: nothing matches now)
            assert rq["dry_run"] is True and rq["runs"] == [] and rq["total"] == 0, rq
            pg = await call("dlq_purge_matching", job="async-fail", dry_run=True)
            assert pg["dry_run"] is True

            # The worker protocol, as a worker speaks it, and the fleet's admin routes.
            wid = "sdk-test/1"
            lease = await call("worker_lease", wid, max_runs=1, wait_s=0.05, ttl_ms=10_000,
                               facts={"queues": ["no-such-queue"], "labels": {}, "slots": 1, "executors": ["shell"],
                                      "version": "test", "instance": "sdk-test"})
            assert lease["runs"] == [] and lease["draining"] is False
            hb = await call("worker_heartbeat", wid, [["async-fail@0", 1]], 10_000)
            assert hb["lost"] == ["async-fail@0"]
            done = await call("worker_complete", wid, [{"run": rid, "token": 1, "success": True}])
            assert done["results"][0]["ok"] is False  # not this worker's lease: refused
            await call("worker_release", wid, [[rid, 1]])
            fleet = await call("workers", consistent=True)
            assert wid in [w["id"] for w in fleet["workers"]]
            assert (await call("worker", wid, consistent=True))["id"] == wid
            assert (await call("worker_leave", wid, "another-instance"))["changed"] is False  # (not this process)
            assert (await call("worker_leave", wid, "sdk-test"))["state"] == "draining"
            assert (await call("drain_worker", wid))["state"] == "draining"

            # A heartbeat job: pinged once its first slot has fired (a 1 s interval), then its
            # deadlines listed and the slot explained.
            hb = {"schedule": {"every_s": 1}, "executor": {"type": "heartbeat"}, "misfire": {"policy": "skip"},
                  "deadline": {"succeed_within_s": 30}}
            assert (await call("put_job", "async-hb", hb))["created"] is True
            for _ in range(200):  # until a slot has fired: a conflict before that
                try:
                    p = await call("ping", "async-hb", "success")
                    break
                except RaftschedError as e:
                    assert getattr(e, "status", None) == 409, e
                    await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a bounded loop
            assert p["job"] == "async-hb" and p["state"] == "succeeded", p
            dl = await call("list_deadlines", job="async-hb", consistent=True)
            assert p["run"] in [d["run_id"] for d in dl["deadlines"] if d["state"] == "met"], dl
            slot = (await c.get_run(p["run"]))["slot"]
            assert (await c.explain("async-hb", slot=slot))["why"] == "it met its deadlines"
            assert (await call("delete_job", "async-hb"))["deleted"] is True

            assert (await call("delete_job", "async-b"))["deleted"] is True
            assert (await call("delete_job", "async-fail"))["deleted"] is True

            # Membership: asking for what already holds changes nothing (a voter added again, a
            # stranger removed), so the cluster stays as it is for the rest of the test.
            voter = (await call("cluster"))["members"][0]
            added = await call("add_member", voter)
            assert added["changed"] is False and voter in added["members"]["voters"], added
            gone = await call("remove_member", "127.0.0.1:1")
            assert gone["changed"] is False and "127.0.0.1:1" not in gone["members"]["voters"], gone

            # The fencing counter: read, and a floor below it changes nothing.
            now_at = (await call("fencing"))["fencing_token"]
            assert now_at >= 1 and await call("raise_fencing", 1) == {"fencing_token": now_at, "raised": False}

            st = await call("secrets_status")
            assert isinstance(st, dict), st
            try:
                await call("rotate_seal_key", "no-such-key")
                raise AssertionError("a rotation to a key no ring holds was accepted")
            except RaftschedError as e:
                assert getattr(e, "status", None) == 422 and e.field == "key", e

            sink = {"type": "webhook", "url": "http://127.0.0.1:9/", "secrets": {"signing_key": "k"}}
            made = await call("put_sink", "async-sink", sink)
            assert made["name"] == "async-sink" and made["spec"]["secrets"]["signing_key"].startswith("***:"), made
            assert "async-sink" in [x["name"] for x in (await call("sinks", consistent=True))["sinks"]]
            assert (await call("get_sink", "async-sink"))["cursor"] >= 0
            assert (await call("sink_dead", "async-sink"))["dead"] == []
            assert (await call("sink_requeue", "async-sink"))["requeued"] == 0
            assert (await call("delete_sink", "async-sink"))["deleted"] is True

            made = await call("create_token", "reader", note="async")
            assert made["token"].startswith("rst_" + made["id"]) and made["role"] == "reader"
            assert made["id"] in [t["id"] for t in (await call("tokens"))["tokens"]]
            assert (await call("revoke_token", made["id"]))["revoked_at"]

    asyncio.run(main())
    assert called == {name for _, name, *_ in CALLS}


def test_a_job_with_a_secret_syncs_once_and_a_drift_check_says_so(cluster, tmp_path):
    """A walk: a sync of a job with a secret planned 'update secrets.API_KEY' every time and
    rewrote the job (a read shows a secret as its fingerprint, never the value the app declares),
    so an SDK app had no drift check. The nodes compare it (a batch's dry run); ``--dry-run
    --exit-code`` exits 3 when something would change, 0 when nothing would."""
    mod = tmp_path / "secret_jobs.py"
    mod.write_text(textwrap.dedent("""
        from raftsched import App
        app = App("secretive", misfire="skip")

        @app.job("secretive-sync", every_s=3600, secrets={"API_KEY": "s3cr3t-v1"})
        def sync_it(ctx):
            return None
    """))
    rc, out, err = sync(cluster, "secret_jobs:app", "--dry-run", "--exit-code", cwd=tmp_path)
    assert rc == 3 and "create     secretive-sync" in out, (out, err)
    assert sync(cluster, "secret_jobs:app", cwd=tmp_path)[0] == 0
    gen = job(cluster, "secretive-sync")["state"]["generation"]
    rc, out, err = sync(cluster, "secret_jobs:app", "--dry-run", "--exit-code", cwd=tmp_path)
    assert rc == 0 and "0 to update, 1 unchanged" in out, (out, err)
    rc, out, err = sync(cluster, "secret_jobs:app", cwd=tmp_path)
    assert rc == 0 and "nothing to change" in out, (out, err)
    assert job(cluster, "secretive-sync")["state"]["generation"] == gen
    # Another value: an update, shown by its field only.
    mod.write_text(mod.read_text().replace("s3cr3t-v1", "s3cr3t-v2"))
    rc, out, err = sync(cluster, "secret_jobs:app", "--dry-run", "--exit-code", cwd=tmp_path)
    assert rc == 3 and "secrets.API_KEY" in out and "s3cr3t" not in out, (out, err)
    rc, out, err = sync(cluster, "secret_jobs:app", "--exit-code", cwd=tmp_path)
    assert rc == 2 and "--exit-code goes with --dry-run" in err
