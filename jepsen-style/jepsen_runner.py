"""The workload's executor target (``{"type": "python", "target": "jepsen_runner:attempt"}``).

It runs in a process of its own, as the run user, started by the run server of a node's worker
or of a remote worker (the harness puts jepsen-style/ on their PYTHONPATH; the nemesis pauses a
node's runs with it). Each attempt writes to the fenced sink twice, "begin" and "end", with its
run id, slot, attempt, fencing token and worker, works in between for a time the failure plan
decides, and fails if the plan says so. A write the sink refuses (a stale token) fails the
attempt. A worker paused past its lease wakes up inside ``time.sleep`` and makes its "end" write
with the old token: that is the write fencing must refuse.

Environment (set by run.py on each node and worker, which pass it to their runs: ``--pass-env``):
JEPSEN_SINK ("host:port"), JEPSEN_PLAN (the plan file, ``{"jobs": {name: {"fail_pct", "work_ms":
[lo, hi]}}}``, readable by the run user), JEPSEN_NODE (the node id).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import failure_plan

_plan: dict | None = None
_plan_lock = threading.Lock()


class PlannedFailure(Exception):
    pass


class Fenced(Exception):
    pass


class SinkUnreachable(Exception):
    pass


def _job_plan(job: str) -> dict:
    global _plan
    with _plan_lock:
        if _plan is None or job not in _plan["jobs"]:
            with open(os.environ["JEPSEN_PLAN"]) as f:
                _plan = json.load(f)
        return _plan["jobs"].get(job, {"fail_pct": 0, "work_ms": [50, 200]})


def sink_write(record: dict, timeout_s: float = 5.0) -> dict:
    """One write to the fenced sink; returns its answer ({"accepted": bool, ...})."""
    host, port = os.environ["JEPSEN_SINK"].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
            s.sendall((json.dumps(record) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
    except OSError as e:
        raise SinkUnreachable(f"sink unreachable: {e!r}") from None
    if not buf:
        raise SinkUnreachable("sink closed the connection without an answer")
    return json.loads(buf)


def attempt(ctx):
    plan = _job_plan(ctx.job)
    worker = f"{os.environ.get('JEPSEN_NODE', '?')}/{os.getpid()}"
    base = {"op": "write", "resource": ctx.run_id, "token": ctx.fencing_token, "run": ctx.run_id,
            "job": ctx.job, "slot": ctx.slot_ms, "attempt": ctx.attempt, "worker": worker}
    fails = failure_plan.attempt_fails(ctx.run_id, ctx.attempt, plan["fail_pct"])
    r = sink_write(dict(base, phase="begin", ok=None))
    if not r.get("accepted"):
        raise Fenced(f"{failure_plan.FENCED}: begin token {ctx.fencing_token} < {r.get('highest')}")
    lo, hi = plan["work_ms"]
    time.sleep(failure_plan.work_ms(ctx.run_id, ctx.attempt, lo, hi) / 1000)
    r = sink_write(dict(base, phase="end", ok=not fails))
    if not r.get("accepted"):
        raise Fenced(f"{failure_plan.FENCED}: end token {ctx.fencing_token} < {r.get('highest')}")
    if fails:
        raise PlannedFailure(f"{failure_plan.PLANNED_FAILURE} of attempt {ctx.attempt}")
    return {"run": ctx.run_id, "attempt": ctx.attempt, "token": ctx.fencing_token}
