"""The worker fleet on real processes (docs/workers.md; docs/design.md I13, I14, I16, I18, I19):
three nodes that only schedule (``--slots 0``) and two ``raftsched worker`` processes outside
the quorum, sharing one cluster for the module. Runs execute on the workers and see the run
contract; a worker killed with SIGKILL has its run executed again on the other with attempt 2
and a higher token; a worker paused past its lease has its late completion refused; the leader
killed while workers lease grants no run twice and the workers carry on through another node;
SIGTERM drains; placement keeps runs off workers without its labels and says so when none
has them."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from procs import Cluster, jobs_dir, wait_for
from raftsched.testing.cluster import NODE_COMMAND
from raftsched.testing.procs import Procs

pytestmark = pytest.mark.cluster

LEASE_TTL_S = 2
WORKERS = {"w-a": "pool=fleet,side=a", "w-b": "pool=fleet,side=b"}


class Fleet:
    """The module's cluster and its two workers, each stopped by its PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.c = Cluster(tmp, node_args=["--slots", "0", "--lease-ttl-s", str(LEASE_TTL_S)])
        self.w = Procs()
        self.marks = jobs_dir("fleet")

    def start_worker(self, wid: str) -> None:
        urls = ",".join(self.c.url(i) for i in range(self.c.n))
        self.w.start(wid, [*NODE_COMMAND, "worker", "--url", urls, "--token-file", str(self.c.token_file), "--id", wid,
                           "--labels", WORKERS[wid], "--slots", "2", "--lease-ttl-s", str(LEASE_TTL_S),
                           "--wait-s", "5", "--drain-s", "1", "--executors", "shell,python"],
                     self.tmp / f"{wid}.log", cwd=self.c.cwd)

    def workers(self, i: int | None = None) -> dict:
        i = self.c.alive()[0] if i is None else i
        s, b = self.c.get(i, "/v1/workers")
        assert s == 200, b
        return {w["id"]: w for w in b["workers"]}

    def wait_workers_active(self) -> None:
        wait_for(lambda: all(self.workers().get(w, {}).get("status") == "active" for w in WORKERS)
                 and all(self.w.alive(w) for w in WORKERS), 30, "both workers registered and active")

    def put(self, name: str, spec: dict) -> None:
        leader = self.c.wait_leader(30)
        s, b = self.c.call(leader, "PUT", f"/v1/jobs/{name}", spec)
        assert s in (200, 201), b

    def trigger(self, name: str) -> str:
        leader = self.c.wait_leader(30)
        s, b = self.c.call(leader, "POST", f"/v1/jobs/{name}/trigger")
        assert s == 201, b
        return b["run"]

    def run(self, rid: str) -> dict | None:
        i = self.c.alive()[0]
        s, b = self.c.get(i, f"/v1/runs/{rid}")
        return b if s == 200 else None

    def kill_pidfiles(self) -> None:
        """Kill run processes the shell jobs recorded (they outlive a SIGKILLed worker)."""
        for f in os.listdir(self.marks):
            if f.endswith(".pid"):
                try:
                    os.kill(int((self.marks / f).read_text().strip()), signal.SIGKILL)
                except (ValueError, ProcessLookupError, OSError):
                    pass


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    f.c.start()
    try:
        f.c.wait_leader(30)
        for wid in WORKERS:
            f.start_worker(wid)
        f.wait_workers_active()
        yield f
    finally:
        for wid in WORKERS:
            f.w.signal(wid, signal.SIGCONT)
        f.w.stop_all()
        f.c.stop()
        f.kill_pidfiles()
        shutil.rmtree(f.marks, ignore_errors=True)


def shell(script: str, **kw) -> dict:
    spec = {"schedule": {"every_s": 86400}, "executor": {"type": "shell", "argv": ["sh", "-c", script]},
            "misfire": {"policy": "skip"}, "placement": {"labels": {"pool": "fleet"}}}
    spec.update(kw)
    return spec


def done(f: Fleet, rid: str, state: str = "succeeded", attempt: int | None = None):
    r = f.run(rid)
    return r if r and r["state"] == state and (attempt is None or r["attempt"] == attempt) else None


def test_runs_execute_on_the_remote_workers_with_the_run_contract(fleet):
    fleet.put("envjob", shell("env | grep ^RAFTSCHED_", payload={"n": 3}))
    rids = [fleet.trigger("envjob") for _ in range(4)]
    runs = [wait_for(lambda r=r: done(fleet, r), 30, f"{r} succeeded") for r in rids]
    assert {r["worker"] for r in runs} <= set(WORKERS)  # never a node: they run --slots 0
    for r in runs:
        env = dict(line.split("=", 1) for line in r["output"].splitlines())
        assert env["RAFTSCHED_RUN_ID"] == r["id"] and env["RAFTSCHED_WORKER_ID"] == r["worker"]
        assert env["RAFTSCHED_FENCING_TOKEN"] == str(r["fencing_token"]) and json.loads(env["RAFTSCHED_PAYLOAD"]) == {"n": 3}
    ws = fleet.workers()
    assert all(ws[w]["kind"] == "remote" for w in WORKERS)
    assert sum(ws[w]["grants"] for w in WORKERS) >= 4


def test_placement_keeps_runs_off_workers_without_its_labels_and_says_when_none_has_them(fleet):
    fleet.put("side-b", shell("true", placement={"labels": {"side": "b"}}))
    rids = [fleet.trigger("side-b") for _ in range(4)]
    assert {wait_for(lambda r=r: done(fleet, r), 30, f"{r} succeeded")["worker"] for r in rids} == {"w-b"}
    fleet.put("nowhere", shell("true", placement={"labels": {"pool": "gpu"}}))
    rid = fleet.trigger("nowhere")
    i = fleet.c.alive()[0]
    q = wait_for(lambda: next((q for q in fleet.c.get(i, "/v1/queues")[1]["queues"]
                              if q["name"] == "default" and q["unplaceable"] >= 1), None), 10, "an unplaceable run")
    assert q["unplaceable"] >= 1
    r = fleet.run(rid)
    assert r["state"] == "queued" and r["waiting_for"] == "no worker matches its placement"
    s, m = fleet.c.get(i, "/metrics")
    assert 'raftsched_runs_unplaceable{queue="default"}' in m
    s, b = fleet.c.call(fleet.c.wait_leader(30), "DELETE", "/v1/jobs/nowhere")
    assert s == 200


def test_a_killed_workers_run_executes_on_the_other_with_attempt_2_and_a_higher_token(fleet):
    m = fleet.marks
    script = (f'if [ "$RAFTSCHED_ATTEMPT" -ge 2 ]; then exit 0; fi; echo $$ > "{m}/kill.pid"; exec sleep 60')
    fleet.put("killme", shell(script))  # max_attempts 1: a lost worker is not the handler's failure (I16)
    rid = fleet.trigger("killme")
    first = wait_for(lambda: (r := fleet.run(rid)) and r["state"] == "running" and (m / "kill.pid").exists() and r,
                     30, "attempt 1 running")
    victim = first["worker"]
    fleet.w.signal(victim, signal.SIGKILL)
    try:
        final = wait_for(lambda: done(fleet, rid), 40, "executed again and succeeded")
        assert final["attempt"] == 2 and final["fencing_token"] > first["fencing_token"]
        assert final["worker"] != victim and final["worker"] in WORKERS
        a1 = final["attempts"][0]
        assert a1["token"] == first["fencing_token"] and "lease expired" in a1["error"] and a1["worker"] == victim
        assert fleet.workers()[victim]["losses"] >= 1
    finally:
        fleet.kill_pidfiles()
        fleet.start_worker(victim)  # the same --id: a new process, which cannot renew the old leases
        fleet.wait_workers_active()


def test_a_paused_workers_late_completion_is_refused_and_the_newer_attempt_stands(fleet):
    m = fleet.marks
    # Attempt 1 outlives its lease while its worker is stopped, then finishes; attempt 2 is quick.
    script = (f'if [ "$RAFTSCHED_ATTEMPT" -ge 2 ]; then exit 0; fi; echo $$ > "{m}/pause.pid"; exec sleep 4')
    fleet.put("pauseme", shell(script))
    rid = fleet.trigger("pauseme")
    first = wait_for(lambda: (r := fleet.run(rid)) and r["state"] == "running" and (m / "pause.pid").exists() and r,
                     30, "attempt 1 running")
    victim = first["worker"]
    log = fleet.w.logs[victim]
    refused_before = log.read_text().count(f"completion of {rid} refused")
    fleet.w.signal(victim, signal.SIGSTOP)
    try:
        final = wait_for(lambda: done(fleet, rid), 40, "the newer attempt succeeded")
        assert final["fencing_token"] > first["fencing_token"] and final["worker"] != victim
        # Attempt 2 may have gone to the paused worker itself: its lease request still waited
        # at a node over an open connection (docs/workers.md, "A paused worker"); then it too
        # was lost, and the next one ran on the other worker.
        assert final["attempt"] >= 2
        assert all("lease expired" in a["error"] and a["worker"] == victim for a in final["attempts"][:-1])
        pid = int((m / "pause.pid").read_text())
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
                 20, "attempt 1's process exited")
    finally:
        fleet.w.signal(victim, signal.SIGCONT)
    # The woken worker either reports attempt 1 with its stale token, refused (I14); or, when its
    # lease watchdog looks first (no heartbeat for a TTL), kills it and reports nothing (its lease
    # was expired already: a lost attempt). Either way nothing changes.
    wait_for(lambda: log.read_text().count(f"completion of {rid} refused") > refused_before
             or f"killing {rid} (not reported" in log.read_text(), 30, "the stale completion refused, or not reported")
    after = fleet.run(rid)
    assert (after["state"], after["attempt"], after["fencing_token"], after["worker"]) == \
        ("succeeded", final["attempt"], final["fencing_token"], final["worker"])


def test_sigterm_drains_a_worker_whose_runs_are_given_back_and_run_elsewhere(fleet):
    m = fleet.marks
    script = (f'if [ "$RAFTSCHED_ATTEMPT" -ge 2 ]; then exit 0; fi; echo $$ > "{m}/drain.pid"; exec sleep 60')
    fleet.put("drainme", shell(script, retry={"max_attempts": 1}))
    rid = fleet.trigger("drainme")
    first = wait_for(lambda: (r := fleet.run(rid)) and r["state"] == "running" and (m / "drain.pid").exists() and r,
                     30, "attempt 1 running")
    victim = first["worker"]
    t0 = time.monotonic()
    fleet.w.signal(victim, signal.SIGTERM)  # waits for the process to end
    try:
        assert fleet.w.procs[victim].returncode == 0
        assert time.monotonic() - t0 < 15  # --drain-s 1, then the kill and the release
        final = wait_for(lambda: done(fleet, rid), 30, "given back and run elsewhere")
        assert final["attempt"] == 2 and final["worker"] != victim
        a1 = final["attempts"][0]
        assert a1["released"] is True and a1["worker"] == victim and "lease expired" not in (a1["error"] or "")
        assert fleet.workers()[victim]["releases"] >= 1
        # It said it leaves: draining in the registry (it showed active until unseen for 30 s; a
        # replica that reads may be a moment behind the commit).
        wait_for(lambda: fleet.workers()[victim]["status"] == "draining", 10, "the worker shown draining")
    finally:
        fleet.kill_pidfiles()
        fleet.start_worker(victim)
        fleet.wait_workers_active()


def test_killing_the_leader_while_workers_lease_grants_no_run_twice_and_they_carry_on(fleet):
    """A token goes to one attempt of one run, and a run's attempts never overlap, across a
    SIGKILL of the leader; the workers go on through another node and runs complete after it."""
    log = fleet.marks / "leases.log"
    fleet.put("busy", shell(f'echo "$RAFTSCHED_RUN_ID $RAFTSCHED_FENCING_TOKEN" >> "{log}"', schedule={"every_s": 1},
                            misfire={"policy": "fire_all", "grace_s": 10}, history=200))
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, 30, "runs executing")
    leader = fleet.c.wait_leader(30)
    fleet.c.kill(leader, signal.SIGKILL)
    try:
        killed_at = time.time()
        fleet.c.wait_leader(30, among=[i for i in range(fleet.c.n) if i != leader])
        wait_for(lambda: _completed_after(fleet, "busy", killed_at + 1), 40, "runs completing after the leader's death")
    finally:
        fleet.c.start(leader)
        new = fleet.c.wait_leader(30)
    s, b = fleet.c.get(new, "/v1/jobs/busy/runs?limit=200&consistent=true")
    assert s == 200, b
    s, _ = fleet.c.call(new, "DELETE", "/v1/jobs/busy")
    assert s == 200
    owners: dict[str, str] = {}
    for run_id, token in (line.split() for line in log.read_text().splitlines() if line.strip()):
        assert owners.setdefault(token, run_id) == run_id, f"token {token} went to {owners[token]} and {run_id}"
    granted: dict[int, str] = {}
    for r in b["runs"]:
        atts = r.get("attempts") or []
        for a, nxt in zip(atts, atts[1:]):
            assert nxt["token"] > a["token"] and nxt["started_at"] >= a["finished_at"], (r["id"], atts)
        for a in atts:
            assert granted.setdefault(a["token"], r["id"]) == r["id"], f"token {a['token']} granted twice"
    assert all(fleet.w.alive(w) for w in WORKERS)


def _completed_after(f: Fleet, job: str, t_s: float) -> bool:
    i = f.c.alive()[0]
    s, b = f.c.get(i, f"/v1/jobs/{job}/runs?limit=50")
    if s != 200:
        return False
    return any(r["state"] == "succeeded" and r.get("finished_at")
               and datetime.fromisoformat(r["finished_at"].replace("Z", "+00:00")).timestamp() > t_s
               for r in b["runs"])
