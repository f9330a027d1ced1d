"""Helpers for the pipeline tests (core/pipelines.py): jobs put and runs driven the way the
proposer and the workers do, without a clock or a network."""
from __future__ import annotations

from raftsched.core import commands, model
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, apply, new_state, outcomes, put_cmd, tick

EXEC = {"type": "python", "target": "app.jobs:run"}


def job_raw(after=None, every_s: int | None = None, retries: int = 1, **extra) -> dict:
    raw: dict = {"executor": EXEC, "misfire": {"policy": "fire_all", "grace_s": 3600},
                 "retry": {"max_attempts": retries, "backoff_s": 0, "backoff_max_s": 0, "jitter": 0}}
    if every_s is not None:
        raw["schedule"] = {"every_s": every_s}
    if after is not None:
        raw["after"] = after
    raw.update(extra)
    return raw


def put(s: SchedulerState, name: str, raw: dict, now: int = T0, **kw) -> dict:
    """Put job ``name`` as the proposer does (a triggered job has no position)."""
    spec = model.validate_job(name, raw, now)
    if "schedule" in spec:
        cmd = put_cmd(s, name, spec, now)
    else:
        cmd = commands.put_job(now, None, name=name, spec=spec, next=None, cursor=now, anchor=now,
                               create_only=False)
    cmd.update(kw)
    return apply(s, cmd)


def chain_state(*jobs: tuple[str, dict]) -> SchedulerState:
    s = new_state()
    for name, raw in jobs:
        res = put(s, name, raw)
        assert res["ok"], res
    return s


def lease(s: SchedulerState, now: int, n: int = 100) -> list[dict]:
    res = apply(s, commands.acquire(now, worker="w", queues=None, max=n, ttl=30 * SEC, types=None))
    assert res["ok"], res
    return res["runs"]


def finish(s: SchedulerState, grant: dict, now: int, success: bool, result=None) -> dict:
    item = {"run": grant["id"], "token": grant["token"], "success": success}
    if result is not None:
        item["result"] = result
    cmd = commands.complete_many(now, None, results=[item], worker="w")
    res = apply(s, cmd)
    assert res["ok"], res
    return outcomes(res, cmd)[0]


__all__ = ["EXEC", "SEC", "T0", "apply", "chain_state", "finish", "job_raw", "lease", "put", "tick"]
