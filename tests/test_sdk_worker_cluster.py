"""``raftsched worker --app`` on real processes (docs/sdk.md, "Running the handlers"): three
nodes that only schedule (``--slots 0``: they never import the apps' code), the apps made real
by ``raftsched sync``, and three workers, one cluster for the module:

- ``w-app``: ``--app sdk_worker_app:app`` (tests/sdk_worker_app.py), plain handlers in threads;
- ``w-iso``: ``--app sdk_worker_app:iso --isolation subprocess``, plain handlers in child processes;
- ``w-reports``: ``--app nightly_report:app``, the example of docs/sdk.md.

Sync and async handlers run with their Context; a handler that raises is retried per its
policy and is dead, in the DLQ, with its traceback; handlers past their timeout are cancelled
(async), failed and said to be still running (a thread), or killed (a child process); a run of
another app's job, or of a plain job, is never taken by these workers, and a job this app's
version does not declare fails visibly, naming the handler."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import sdk_worker_app
from procs import REPO, Cluster, wait_for
from raftsched.testing.cluster import NODE_COMMAND

from raftsched.testing.procs import Procs

pytestmark = pytest.mark.cluster

#: An --app worker started as root (CI's) says it means to run the app's handlers as root.
ROOT_OK = ["--allow-root-jobs"] if os.geteuid() == 0 else []

TESTS = REPO / "tests"
EXAMPLES = REPO / "examples"
#: worker id -> (its --app, its working directory, more flags)
WORKERS = {
    "w-app": ("sdk_worker_app:app", TESTS, ["--slots", "2"]),
    "w-iso": ("sdk_worker_app:iso", TESTS, ["--slots", "2", "--isolation", "subprocess"]),
    "w-reports": ("nightly_report:app", EXAMPLES, ["--slots", "1"]),
}


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.c = Cluster(tmp, node_args=["--slots", "0"])
        self.w = Procs()
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.db = tmp / "reports.db"

    def urls(self) -> str:
        return ",".join(self.c.url(i) for i in range(self.c.n))

    def sync(self, ref: str, cwd: Path) -> str:
        p = subprocess.run([sys.executable, "-m", "raftsched.cli", "sync", ref, "--url", self.urls(),
                            "--token", self.c.token], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (p.stdout, p.stderr)
        return p.stdout

    def start_worker(self, wid: str) -> None:
        ref, cwd, extra = WORKERS[wid]
        self.w.start(wid, [*NODE_COMMAND, "worker", "--url", self.urls(), "--token-file", str(self.c.token_file),
                           "--id", wid, "--app", ref, "--wait-s", "5", "--drain-s", "1", *ROOT_OK, *extra],
                     self.tmp / f"{wid}.log", cwd=cwd,
                     env={"SDK_WORKER_TEST_DIR": str(self.marks), "REPORTS_DB": str(self.db)})

    def workers(self) -> dict:
        s, b = self.c.get(self.c.alive()[0], "/v1/workers")
        assert s == 200, b
        return {w["id"]: w for w in b["workers"]}

    def put(self, name: str, spec: dict) -> None:
        s, b = self.c.call(self.c.wait_leader(30), "PUT", f"/v1/jobs/{name}", spec)
        assert s in (200, 201), b

    def trigger(self, name: str) -> str:
        s, b = self.c.call(self.c.wait_leader(30), "POST", f"/v1/jobs/{name}/trigger")
        assert s == 201, b
        return b["run"]

    def run(self, rid: str) -> dict | None:
        s, b = self.c.get(self.c.alive()[0], f"/v1/runs/{rid}")
        return b if s == 200 else None

    def ended(self, rid: str, state: str = "succeeded", timeout_s: float = 30) -> dict:
        def done():
            r = self.run(rid)
            return r if r and r["state"] in ("succeeded", "dead") else None
        r = wait_for(done, timeout_s, f"run {rid} to end")
        assert r["state"] == state, r
        return r

    def log(self, wid: str) -> str:
        return (self.tmp / f"{wid}.log").read_text(errors="replace")

    def release(self, rid: str) -> None:
        open(os.path.join(self.marks, os.path.basename(sdk_worker_app.path_of(rid, "release"))), "w").close()

    def mark(self, rid: str, event: str) -> Path:
        return self.marks / os.path.basename(sdk_worker_app.path_of(rid, event))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = Env(tmp_path_factory.mktemp("sdk-worker"))
    e.c.start()
    try:
        e.c.wait_leader(30)
        assert "applied: 5 created" in e.sync("sdk_worker_app:app", TESTS)
        assert "applied: 4 created" in e.sync("sdk_worker_app:iso", TESTS)
        assert "applied: 2 created" in e.sync("nightly_report:app", EXAMPLES)
        for wid in WORKERS:
            e.start_worker(wid)
        wait_for(lambda: all(e.workers().get(w, {}).get("status") == "active" for w in WORKERS)
                 and all(e.w.alive(w) for w in WORKERS), 30, "the three workers registered")
        yield e
    finally:
        for f in e.marks.glob("*.pid"):  # child processes of the subprocess isolation, if any survived
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, OSError):
                pass
        e.w.stop_all()
        e.c.stop()


def test_the_workers_run_their_apps_sync_and_async_handlers_with_their_context(env):
    ws = env.workers()
    for wid, (_ref, _, _) in WORKERS.items():
        assert ws[wid]["dedicated"] == ["raftsched.app"] and ws[wid]["executors"] == ["python"], ws[wid]
    assert ws["w-app"]["labels"] == {"raftsched.app": "sdk-worker-test"}
    assert "app 'sdk-worker-test' (sdk_worker_app:app): 5 handler(s) for 5 job(s), 2 async" in env.log("w-app")

    rids = {job: env.trigger(job) for job in ("sw-sync", "sw-async", "si-sync")}
    runs = {job: env.ended(rid) for job, rid in rids.items()}
    sync, asyn, child = (eval(runs[j]["output"].splitlines()[-1]) for j in ("sw-sync", "sw-async", "si-sync"))
    assert runs["sw-sync"]["worker"] == runs["sw-async"]["worker"] == "w-app" and runs["si-sync"]["worker"] == "w-iso"
    assert sync == {"run": rids["sw-sync"], "job": "sw-sync", "attempt": 1, "token": runs["sw-sync"]["fencing_token"],
                    "worker": "w-app", "payload": {"k": "v"}, "logger": "raftsched.job.sw-sync",
                    "pid": env.w.pid("w-app"), "upstream": None}
    assert asyn["worker"] == "w-app" and asyn["pid"] == env.w.pid("w-app") and asyn["loop"].endswith("EventLoop")
    # --isolation subprocess: the handler ran in a child of the worker, and what it printed is kept.
    assert child["worker"] == "w-iso" and child["pid"] != env.w.pid("w-iso")
    assert f"hello from {child['pid']}" in runs["si-sync"]["output"]

    # The example of docs/sdk.md: its handler writes the day's report with the run's fencing token.
    rid = env.trigger("nightly-report")
    run = env.ended(rid)
    assert run["worker"] == "w-reports" and "'kept': True" in run["output"], run
    db = sqlite3.connect(env.db)
    try:
        rows = db.execute("SELECT token, run_id FROM reports").fetchall()
    finally:
        db.close()
    assert rows == [(run["fencing_token"], rid)]
    run = env.ended(env.trigger("refresh-dashboard"))
    assert run["worker"] == "w-reports" and f"'refreshed_for': '{run['slot']}'" in run["output"], run


def test_a_raising_handler_is_retried_per_its_policy_then_dead_with_its_traceback(env):
    rid = env.trigger("sw-boom")  # max_attempts 2, no backoff
    run = env.ended(rid, "dead")
    assert run["attempt"] == 2 and [a["error"] for a in run["attempts"]] == \
           ["RuntimeError: boom on attempt 1", "RuntimeError: boom on attempt 2"], run
    assert run["output"].startswith("Traceback") and "in boom" in run["output"]
    s, dlq = env.c.get(env.c.alive()[0], "/v1/dlq")
    assert rid in [r["id"] for r in dlq["runs"]]


def test_handlers_past_their_timeout_are_cancelled_said_to_run_on_or_killed(env):
    # async: cancelled on the worker's loop
    rid = env.trigger("sw-astuck")
    run = env.ended(rid, "dead")
    assert run["error"] == "timed out after 1s" and env.mark(rid, "cancelled").exists(), run
    # a plain handler in a thread: the attempt fails saying so; the thread runs on, in its slot
    rid = env.trigger("sw-stuck")
    run = env.ended(rid, "dead")
    assert run["error"] == "timed out after 1s; the handler's thread could not be stopped and is still running", run
    assert env.mark(rid, "started").exists() and not env.mark(rid, "finished").exists()
    wait_for(lambda: "its slot stays taken until it returns" in env.log("w-app"), 10, "the worker to say so")
    env.release(rid)
    wait_for(lambda: env.mark(rid, "finished").exists(), 10, "the stuck handler to return")
    wait_for(lambda: "its slot is free" in env.log("w-app"), 10, "the worker to free its slot")
    # a plain handler in a child process: killed
    rid = env.trigger("si-stuck")
    run = env.ended(rid, "dead")
    assert run["error"] == "timed out after 1s; the handler's process was killed", run
    pid = int(env.mark(rid, "pid").read_text())
    wait_for(lambda: not _alive(pid), 10, "the child to be gone")
    assert not env.mark(rid, "finished").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_of_another_apps_job_or_a_plain_job_is_never_taken(env):
    """The app workers are dedicated to their label: another app's job (placed on its own
    label) and a job without placement wait for other workers, and say so; so does a job placed
    on this app whose handler this app's version does not declare (the worker said which it has:
    it used to take such a run and fail it, and its retries, a walk's rolling deploy)."""
    py = {"type": "python", "target": "sdk_worker_app:hello"}
    env.put("other-app", {"schedule": {"every_s": 3600}, "executor": py, "misfire": {"policy": "skip"},
                          "placement": {"labels": {"raftsched.app": "someone-else"}}})
    env.put("plain", {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]},
                      "misfire": {"policy": "skip"}})
    env.put("sw-newer", {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
                         "executor": {"type": "python", "target": "sdk_worker_app:declared_later"},
                         "retry": {"max_attempts": 2, "backoff_s": 0},
                         "placement": {"labels": {"raftsched.app": "sdk-worker-test"}}})
    other, plain = env.trigger("other-app"), env.trigger("plain")
    newer, ok = env.trigger("sw-newer"), env.trigger("sw-sync")
    assert env.ended(ok)["worker"] == "w-app"
    # The other three were queued before the app's runs were leased, and are still queued.
    for rid in (other, plain):
        r = env.run(rid)
        assert r["state"] == "queued" and r["waiting_for"] == "no worker matches its placement", r
    r = env.run(newer)
    assert r["state"] == "queued" and r["attempt"] == 1 and r["attempts"] == [], r
    assert r["waiting_for"].startswith("no worker has a handler for its target"), r
    s, q = env.c.get(env.c.alive()[0], "/v1/queues")
    assert {x["name"]: x for x in q["queues"]}["default"]["unplaceable"] >= 3, q
    s, w = env.c.get(env.c.alive()[0], "/v1/workers/w-app")
    assert "sdk_worker_app:hello" in w["targets"] and "sdk_worker_app:declared_later" not in w["targets"], w
