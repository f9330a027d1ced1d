"""Helpers of the leased-execution tests (test_leases.py, test_queues.py, test_tenants.py,
test_locks.py, test_execution_determinism.py): commands built as the node builds them, encoded and
applied as replication does (core_helpers.apply), and the checks every refusal must pass."""
from __future__ import annotations

from raftsched.core import commands, limits, queries
from raftsched.core.state import SchedulerState

from core_helpers import SEC, apply, snap_obj, spec_of

TTL = 10 * SEC
RETRY3 = {"max_attempts": 3, "backoff_s": 2, "backoff_multiplier": 2, "backoff_max_s": 60, "jitter": 0.1}


def jspec(**extra) -> dict:
    """A job that never falls due within a test (hourly): its runs come from trigger_job."""
    return spec_of({"every_s": 3600}, "skip", grace_s=0, **extra)


def do(s: SchedulerState, op: str, now: int, rid=None, **fields) -> dict:
    return apply(s, commands.make(op, now, rid, **fields))


def trig(s: SchedulerState, job: str, now: int) -> str:
    res = do(s, "trigger_job", now, name=job)
    assert res["ok"], res
    return res["run"]


def acq(s, now, worker="w1", queues=None, n=10, ttl=TTL) -> list[dict]:
    res = do(s, "acquire", now, worker=worker, queues=queues, max=n, ttl=ttl)
    assert res["ok"], res
    return res["runs"]


def hb(s, now, worker, leases, ttl=TTL) -> dict:
    res = do(s, "heartbeat", now, worker=worker, leases=[list(x) for x in leases], ttl=ttl)
    assert res["ok"], res
    return res


def complete(s, now, run, token, ok=True, error=None) -> dict:
    return do(s, "complete", now, run=run, token=token, success=ok, error=error)


def expire(s, now, runs=(), locks=()) -> dict:
    """An expire naming ``[id, token, renewals]`` items, as the leader's reaper proposes it."""
    res = do(s, "expire", now, runs=[list(x) for x in runs], locks=[list(x) for x in locks])
    assert res["ok"], res
    return res


def lease(s, rid) -> list:
    """The run's lease as the reaper names it: [id, token, renewals]."""
    run = s.runs[rid]
    assert run["state"] == "running", run
    return [rid, run["fencing_token"], run["renewals"]]


def lock_item(s, name) -> list:
    lk = s.locks[name]
    return [name, lk["token"], lk["renewals"]]


def overdue(s, now) -> tuple[list, list]:
    """Leases and locks whose deadline is before ``now`` in state time, as ``[id, token,
    renewals]``, from ``lease_snapshot``. (The node's reaper picks the leases it has seen
    unrenewed for a TTL by its monotonic clock; apply only checks that an item still names the
    lease as it is, so any selection will do for these tests.)"""
    runs, locks = [], []
    for kind, ident, tok, renewals, _ttl in queries.lease_snapshot(s):
        deadline = (s.runs[ident] if kind == "run" else s.locks[ident])["deadline"]
        if deadline < now:
            (runs if kind == "run" else locks).append([ident, tok, renewals])
    return sorted(runs, key=lambda x: (s.runs[x[0]]["deadline"], x[0])), sorted(locks)


def refused(s: SchedulerState, cmd: dict, code: str) -> dict:
    """Apply a command that must be refused with ``code`` and must change nothing: the snapshot
    is the same but for ``applied`` (every command counts) and, when the command's now is later,
    state time (which apply advances before the handler runs, by design)."""
    drop = ("applied",) if cmd["now"] <= s.now_ms else ("applied", "now_ms")
    before = snap_obj(s, drop)
    res = apply(s, cmd)
    assert res["ok"] is False, res
    assert res["error"]["code"] == code, res
    assert snap_obj(s, drop) == before, "a refused command changed the state"
    return res


def reap(s, now) -> dict:
    """A reaper tick: expire everything overdue at ``now`` in one command."""
    runs, locks = overdue(s, now)
    n = limits.expire_items_max
    return expire(s, now, runs[:n], locks[:max(0, n - len(runs))])
