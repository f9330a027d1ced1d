"""Leased execution on real node processes (docs/design.md I13-I16): runs execute on followers
and see the executor contract; a killed or paused worker's run is executed again elsewhere with a
higher token, and a late completion from the old token is refused."""
from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from procs import Cluster, jobs_dir, wait_for

pytestmark = pytest.mark.cluster

LEASE_TTL_S = 2


def kill_pidfiles(d):
    """Kill run processes the tests' shell jobs recorded (they outlive a SIGKILLed node)."""
    for f in os.listdir(d):
        if f.endswith(".pid"):
            try:
                os.kill(int(open(os.path.join(d, f)).read().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, OSError):
                pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workers")
    c = Cluster(tmp, node_args=["--lease-ttl-s", str(LEASE_TTL_S), "--slots", "2"])
    c.marks = jobs_dir("workers")
    c.start()
    try:
        c.wait_leader(30)
        yield c
    finally:
        for i in range(3):
            c.kill(i, signal.SIGCONT)
        c.stop()
        kill_pidfiles(c.marks)
        shutil.rmtree(c.marks, ignore_errors=True)


def run_of(c: Cluster, job: str, run_id: str | None = None) -> dict | None:
    i = c.alive()[0]
    s, b = c.get(i, f"/v1/jobs/{job}/runs?limit=50")
    assert s == 200, b
    runs = [r for r in b["runs"] if r["kind"] != "recorded" and (run_id is None or r["id"] == run_id)]
    return runs[0] if runs else None


def put(c: Cluster, name: str, spec: dict) -> None:
    leader = c.wait_leader(30)
    s, b = c.call(leader, "PUT", f"/v1/jobs/{name}", spec)
    assert s in (200, 201), b


def manual(c: Cluster, name: str) -> str:
    leader = c.wait_leader(30)
    s, b = c.call(leader, "POST", f"/v1/jobs/{name}/trigger")
    assert s == 201, b
    return b["run"]


def shell(script: str, **kw) -> dict:
    spec = {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["sh", "-c", script]},
            "misfire": {"policy": "skip"}}
    spec.update(kw)
    return spec


def test_runs_execute_on_followers_with_the_environment_contract(cluster):
    put(cluster, "envjob", shell("env | grep ^RAFTSCHED_", payload={"db": "orders", "n": 3}))
    rid = manual(cluster, "envjob")
    run = wait_for(lambda: (r := run_of(cluster, "envjob", rid)) and r["state"] == "succeeded" and r, 30, "run succeeded")
    leader = cluster.wait_leader(30)
    assert cluster.node_of_worker(run["worker"]) != leader, "followers execute, not the leader"
    env = dict(line.split("=", 1) for line in run["output"].splitlines())
    assert env["RAFTSCHED_RUN_ID"] == rid
    assert env["RAFTSCHED_JOB"] == "envjob"
    assert env["RAFTSCHED_SLOT"] == run["slot"]
    assert env["RAFTSCHED_ATTEMPT"] == "1"
    assert env["RAFTSCHED_FENCING_TOKEN"] == str(run["fencing_token"])
    assert json.loads(env["RAFTSCHED_PAYLOAD"]) == {"db": "orders", "n": 3}


def test_killed_worker_run_executes_elsewhere_with_higher_token(cluster):
    m = cluster.marks
    # Attempt 1 hangs (and records its pid so the test can clean it up); later attempts succeed.
    script = (f'echo "$RAFTSCHED_ATTEMPT $RAFTSCHED_FENCING_TOKEN" >> "{m}/kill.attempts"; '
              f'if [ "$RAFTSCHED_ATTEMPT" -ge 2 ]; then exit 0; fi; echo $$ > "{m}/kill.pid"; exec sleep 60')
    put(cluster, "killme", shell(script, retry={"max_attempts": 3, "backoff_s": 0}))
    rid = manual(cluster, "killme")
    first = wait_for(lambda: (r := run_of(cluster, "killme", rid)) and r["state"] == "running" and (m / "kill.pid").exists() and r, 30, "attempt 1 running")
    victim = cluster.node_of_worker(first["worker"])
    cluster.kill(victim, signal.SIGKILL)
    try:
        final = wait_for(lambda: (r := run_of(cluster, "killme", rid)) and r["state"] == "succeeded" and r, 40, "re-executed and succeeded")
        assert final["attempt"] == 2
        assert final["fencing_token"] > first["fencing_token"]
        assert cluster.node_of_worker(final["worker"]) != victim
        a1 = final["attempts"][0]
        assert a1["attempt"] == 1 and a1["token"] == first["fencing_token"] and "lease expired" in a1["error"]
    finally:
        kill_pidfiles(m)
        cluster.start(victim)
        cluster.wait_leader(30)


def test_paused_worker_completion_is_refused_and_newer_attempt_wins(cluster):
    m = cluster.marks
    # Attempt 1 outlives its lease while its node is stopped, then finishes; attempt 2 is quick.
    script = (f'echo "$RAFTSCHED_ATTEMPT $RAFTSCHED_FENCING_TOKEN" >> "{m}/pause.attempts"; '
              f'if [ "$RAFTSCHED_ATTEMPT" -ge 2 ]; then exit 0; fi; echo $$ > "{m}/pause.pid"; exec sleep 4')
    put(cluster, "pauseme", shell(script, retry={"max_attempts": 3, "backoff_s": 0}))
    rid = manual(cluster, "pauseme")
    first = wait_for(lambda: (r := run_of(cluster, "pauseme", rid)) and r["state"] == "running" and (m / "pause.pid").exists() and r, 30, "attempt 1 running")
    victim = cluster.node_of_worker(first["worker"])
    refused_before = cluster.status(victim)["worker"]["refused"]
    cluster.kill(victim, signal.SIGSTOP)
    try:
        final = wait_for(lambda: (r := run_of(cluster, "pauseme", rid)) and r["state"] == "succeeded" and r, 40, "newer attempt succeeded")
        assert final["attempt"] == 2 and final["fencing_token"] > first["fencing_token"]
        # Let attempt 1's process finish while its node is still stopped.
        pid = int((m / "pause.pid").read_text())
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", 20, "attempt 1 process exited")
    finally:
        cluster.kill(victim, signal.SIGCONT)
    # The woken worker either reports attempt 1 with its stale token, refused; or, when its lease
    # watchdog looks first (no heartbeat for a TTL), kills it and reports nothing (its lease was
    # expired already: a lost attempt). Either way nothing changes.
    log = cluster.log_path(victim)
    wait_for(lambda: (cluster.status(victim) or {}).get("worker", {}).get("refused", 0) > refused_before
             or f"killing {rid} (not reported" in log.read_text(errors="replace"), 30,
             "the stale completion refused, or not reported")
    # (the woken node may not know the leader again yet: its reads answer 503 until it does)
    after = wait_for(lambda: run_of(cluster, "pauseme", rid), 30, "a node that answers the run")
    assert after["state"] == "succeeded" and after["attempt"] == 2
    assert after["fencing_token"] == final["fencing_token"] and after["worker"] == final["worker"]


def test_run_past_timeout_is_killed_and_fails(cluster):
    m = cluster.marks
    script = f'echo $$ > "{m}/timeout.pid"; exec sleep 60'
    put(cluster, "slow", shell(script, timeout_s=1))
    rid = manual(cluster, "slow")
    final = wait_for(lambda: (r := run_of(cluster, "slow", rid)) and r["state"] == "dead" and r, 30, "timed out")
    assert "timed out" in final["error"]
    pid = int((m / "timeout.pid").read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", 15, "killed")


def test_failing_job_ends_in_dlq_after_max_attempts_and_can_be_requeued(cluster):
    put(cluster, "fails", shell("echo nope >&2; exit 3", retry={"max_attempts": 3, "backoff_s": 0.1, "jitter": 0}))
    rid = manual(cluster, "fails")
    dead = wait_for(lambda: (r := run_of(cluster, "fails", rid)) and r["state"] == "dead" and r, 30, "dead")
    assert dead["attempt"] == 3 and len(dead["attempts"]) == 3
    assert all(a["error"] == "exit status 3" for a in dead["attempts"])
    assert "nope" in dead["output"]
    tokens = [a["token"] for a in dead["attempts"]]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    leader = cluster.wait_leader(30)
    s, b = cluster.get(leader, "/v1/dlq?queue=default")
    assert s == 200 and rid in [r["id"] for r in b["runs"]]
    s, b = cluster.call(leader, "POST", f"/v1/dlq/{rid}/requeue")
    assert s == 200 and b["attempt"] == 4, b
    again = wait_for(lambda: (r := run_of(cluster, "fails", rid)) and r["state"] == "dead" and r["attempt"] == 6 and r, 30, "fresh budget spent")
    assert len(again["attempts"]) == 6
    s, b = cluster.call(leader, "DELETE", f"/v1/dlq/{rid}")
    assert s == 200
    s, b = cluster.get(leader, f"/v1/dlq/{rid}")
    assert s == 404


def _runs(c: Cluster, job: str) -> list[dict]:
    i = c.wait_leader(30)
    s, b = c.get(i, f"/v1/jobs/{job}/runs?limit=500&consistent=true")
    assert s == 200, b
    return b["runs"]


def test_a_three_step_chain_under_a_leader_kill_with_a_failing_middle_step_and_a_requeue(cluster):
    """Pipelines (docs/pipelines.md) on real nodes: a -> b -> c every 2 s; b fails while a marker
    file is missing, so c records those slots upstream_failed; the leader is killed meanwhile.
    For every slot: c ran only after a and b succeeded for it, at most once, and otherwise has
    its record; requeuing a dead b re-arms c for that slot, which then runs."""
    m = cluster.marks
    ok = m / "pipe-ok"
    a = {"schedule": {"every_s": 2}, "misfire": {"policy": "fire_all", "grace_s": 30},
         "executor": {"type": "shell", "argv": ["sh", "-c", 'echo \'{"n": 1}\' > "$RAFTSCHED_RESULT_FILE"']}}
    b = {"after": ["pipe-a"], "retry": {"max_attempts": 1},
         "executor": {"type": "shell", "argv": ["sh", "-c", f'test -e "{ok}" || exit 7; echo "$RAFTSCHED_UPSTREAM"']}}
    c = {"after": [{"job": "pipe-b", "on": "success"}],
         "executor": {"type": "shell", "argv": ["sh", "-c", 'echo "$RAFTSCHED_UPSTREAM"']}}
    leader = cluster.wait_leader(30)
    s, body = cluster.call(leader, "POST", "/v1/jobs:batch", {"jobs": {"pipe-c": c, "pipe-b": b, "pipe-a": a}})
    assert s == 200, body
    wait_for(lambda: any(r["state"] == "skipped" and r.get("reason") == "upstream_failed"
                         for r in _runs(cluster, "pipe-c")), 30, "a failed middle step recorded downstream")
    cluster.kill(leader, signal.SIGKILL)
    cluster.wait_leader(30, among=[j for j in range(3) if j != leader])
    ok.write_text("")
    os.chmod(ok, 0o644)
    wait_for(lambda: any(r["state"] == "succeeded" for r in _runs(cluster, "pipe-c")), 40, "c runs again")
    dead = [r for r in _runs(cluster, "pipe-b") if r["state"] == "dead"]
    assert dead
    i = cluster.wait_leader(30)
    s, body = cluster.call(i, "POST", f"/v1/dlq/{dead[-1]['id']}/requeue")
    assert s == 200 and body["rearmed"] == [dead[-1]["id"].replace("pipe-b@", "pipe-c@")], body
    wait_for(lambda: any(r["id"] == body["rearmed"][0] and r["state"] == "succeeded"
                         for r in _runs(cluster, "pipe-c")), 30, "the re-armed child runs")
    s, _ = cluster.call(i, "POST", "/v1/jobs/pipe-a/pause")
    assert s == 200
    cluster.start(leader)
    runs = {job: {r["slot_ms"]: r for r in _runs(cluster, job)} for job in ("pipe-a", "pipe-b", "pipe-c")}
    for job in runs:
        ids = [r["id"] for r in _runs(cluster, job)]
        assert len(ids) == len(set(ids)), f"{job}: a run twice"
    for slot, rc in runs["pipe-c"].items():
        ra, rb = runs["pipe-a"].get(slot), runs["pipe-b"].get(slot)
        if rc["state"] in ("queued", "running", "succeeded", "failed", "dead"):
            assert ra and rb and ra["state"] == rb["state"] == "succeeded", (slot, ra, rb, rc)
            assert [u["run"] for u in rc["upstream"]] == [rb["id"]]
        else:
            assert rc["reason"] in ("upstream_failed", "upstream_missed"), rc
    for slot, rb in runs["pipe-b"].items():
        if rb["state"] == "dead":
            assert runs["pipe-c"][slot]["reason"] == "upstream_failed"
        if rb["state"] == "succeeded":
            assert slot in runs["pipe-c"], f"c silent for slot {slot}"
    for job in ("pipe-c", "pipe-b", "pipe-a"):
        s, _ = cluster.call(cluster.wait_leader(30), "DELETE", f"/v1/jobs/{job}")
        assert s == 200


def test_the_nightly_pipeline_example_runs_and_leaves_nothing_behind(cluster, capsys):
    import sys as _sys
    from procs import REPO
    _sys.path.insert(0, str(REPO / "examples"))
    try:
        import nightly_pipeline
    finally:
        _sys.path.remove(str(REPO / "examples"))
    urls = ",".join(cluster.url(i) for i in cluster.alive())
    assert nightly_pipeline.demo(urls, cluster.token, timeout_s=30) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "the chain ran" in out and '"clean_rows": 40' in out
    s, page = cluster.get(cluster.wait_leader(30), "/v1/jobs?limit=1000&consistent=true")
    assert s == 200 and not [j for j in page["jobs"] if j["name"].startswith("demo-pipeline-")]
