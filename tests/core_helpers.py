"""Shared helpers for the tests of the pure core (raftsched/core).

They build commands exactly the way the proposer does (node/service.py, node/trigger.py), so the
tests exercise the same command shapes the cluster replicates. Nothing here reads a clock.
"""
from __future__ import annotations

import msgpack

from raftsched.core import queries, commands, due, limits, model, policy, records, schedule
from raftsched.core.due import DueIndex
from raftsched.core.state import SchedulerState

#: 2026-05-28T20:26:40Z, a whole second; every test time is an offset from it.
T0 = 1_780_000_000_000
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR


def ms(text: str) -> int:
    return schedule.parse_iso_ms(text, "t")


def raw_job(sched: dict, policy_name: str = "fire_all", grace_s: int | None = None,
            max_catchup: int | None = None, **extra) -> dict:
    misfire = {"policy": policy_name}
    if grace_s is not None:
        misfire["grace_s"] = grace_s
    if max_catchup is not None:
        misfire["max_catchup"] = max_catchup
    raw = {"schedule": sched, "executor": {"type": "python", "target": "app.jobs:run"},
           "misfire": misfire}
    raw.update(extra)
    return raw


def spec_of(sched: dict, policy_name: str = "fire_all", grace_s: int | None = None,
            max_catchup: int | None = None, name: str = "j", **extra) -> dict:
    return model.validate_job(name, raw_job(sched, policy_name, grace_s, max_catchup, **extra))


def put_cmd(state: SchedulerState | None, name: str, spec: dict, now: int, rid: str | None = None,
            create_only: bool = False, anchor: int | None = None) -> dict:
    """A put_job command as node/service.py proposes it: interval slots fall on whole seconds
    from the creation time rounded up (the anchor), the first one interval after it."""
    sched = spec["schedule"]
    default_anchor, cursor = policy.initial_position(sched, now)
    if anchor is None:
        anchor = default_anchor
    elif "every_s" in sched:
        cursor = anchor
    if state is not None:
        kept = queries.put_position(state, name, sched)
        if kept is not None:
            cursor, anchor, _ = kept
        else:
            floor = queries.cursor_floor(state, name)
            if floor is not None and floor > cursor:
                cursor = floor
    nxt = schedule.next_slot_after(sched, cursor, anchor)
    return commands.make("put_job", now, rid, name=name, spec=spec, next=nxt, cursor=cursor,
                         anchor=anchor, create_only=create_only)


def resume_cmd(state: SchedulerState, name: str, now: int, rid: str | None = None,
               catch_up: bool = False) -> dict:
    """A resume_job command as node/service.py proposes it."""
    job = state.jobs[name]
    spec, cursor, anchor, gen = job["spec"], job["cursor"], job["anchor"], job["gen"]
    fields = {"name": name, "catch_up": catch_up}
    if not catch_up and "schedule" in spec:
        fields.update(gen=gen, **policy.plan_resume(spec, anchor, cursor, now))
    return commands.make("resume_job", now, rid, **fields)


def apply(state: SchedulerState, cmd: dict) -> dict:
    """Encode and apply, as replication does."""
    return state.apply_bytes(commands.encode(cmd))


def outcomes(res: dict, cmd: dict) -> list[dict]:
    """A complete_many's answer of each outcome (records.outcome_results), read against the run
    ids ``cmd`` carried (rows, or maps as older nodes wrote them)."""
    if "rows" in cmd:
        ids = [row[0] for row in cmd["rows"]]
    else:
        ids = [it.get("run") for it in cmd["results"]]
    return records.outcome_results(res, ids)


def complete_many(state: SchedulerState, cmd: dict) -> tuple[dict, list[dict]]:
    """Apply a complete_many: (its answer, the answer of each outcome)."""
    res = apply(state, cmd)
    return res, (outcomes(res, cmd) if res.get("ok") else [])


def plan_tick(state: SchedulerState, now: int, limit: int = limits.fire_entries_max):
    """What the leader's trigger does in one tick: pop due jobs, plan each, build one fire.

    Returns (fire command or None, names popped). Jobs whose plan is None are pushed back.
    """
    jobs = pop_due(state, now, limit)
    entries, names = [], []
    for job in jobs:
        plan = policy.plan_fire(job["spec"], job["anchor"], job["cursor"], now, job["gen"], job["name"])
        if plan is None:
            repush(state, [job["name"]])
            continue
        entries.append(plan)
        names.append(job["name"])
    if not entries:
        return None, names
    return commands.make("fire", now, None, entries=entries), names


def tick(state: SchedulerState, now: int):
    """Plan and apply one tick. Returns (fire command or None, result or None)."""
    cmd, names = plan_tick(state, now)
    if cmd is None:
        return None, None
    res = apply(state, cmd)
    if res.get("ok") and res.get("stale"):
        repush(state, names)
    return cmd, res


def new_state(*jobs: tuple[str, dict], now: int = T0) -> SchedulerState:
    """A replica as its node holds it while leading: with a due index, attached as the trigger
    attaches one (core/due.py; the index is derived: states with and without one snapshot
    alike), holding ``jobs`` (name, spec pairs) put at ``now`` as the proposer puts them."""
    s = SchedulerState()
    due.attach(s, DueIndex())
    for name, spec in jobs:
        res = apply(s, put_cmd(s, name, spec, now))
        assert res["ok"], res
    return s


def pop_due(state: SchedulerState, now: int, limit: int, ahead_ms: int = 0) -> list[dict]:
    """The trigger's pop (due.pop_due), as the job records it names."""
    return [state.jobs[n] for n in due.pop_due(state, now, limit, ahead_ms)]


def repush(state: SchedulerState, names) -> None:
    due.repush(state, names)


def next_due_ms(state: SchedulerState, ahead_ms: int = 0) -> int | None:
    return due.next_due_ms(state, ahead_ms)


def snap_obj(state: SchedulerState, drop=("applied",)) -> dict:
    """The snapshot as a dict, minus the fields every apply changes by design (``applied``)."""
    obj = msgpack.unpackb(state.snapshot(), raw=False, strict_map_key=False)
    for k in drop:
        obj.pop(k, None)
    return obj


def restored(state: SchedulerState) -> SchedulerState:
    """A fresh replica restored from ``state``'s snapshot, with a due index when it has one."""
    s = new_state() if state.due is not None else SchedulerState()
    s.restore(state.snapshot())
    return s


def runs_of(state: SchedulerState, job: str, kind: str | None = None) -> list[dict]:
    out = [state.runs[r] for r in state.history.get(job, [])]
    if kind is not None:
        out = [r for r in out if r["kind"] == kind]
    return out


def queued_count(state: SchedulerState, queue: str) -> int:
    return sum(1 for r in state.runs.values() if r["state"] == "queued" and r["queue"] == queue)


# ----------------------------------------------------------------------------- older snapshots
_SHARED_PARTS_V2 = ("schedule", "misfire", "retry", "overlap", "payload")
_STATS_FIELDS_V1 = ("runs", "recorded", "lag_ms_last", "lag_ms_max", "lag_ms_sum")


def snapshot_v2_obj(state: SchedulerState) -> dict:
    """What snapshot version 2 (code before the columnar version 3) wrote for ``state``: a map a
    job, its spec parts by index into "parts", and a history for every job (that code made one,
    empty, when a job was put), jobs first, in job order. Equal parts are found by encoded bytes
    here (the code used a content key; the result is the same)."""
    parts, index, jobs = [], {}, {}
    for name, job in state.jobs.items():
        flat = dict(job["spec"])
        for k in _SHARED_PARTS_V2:
            if k in flat:
                key = (k, msgpack.packb(flat[k], use_bin_type=True))
                if key not in index:
                    index[key] = len(parts)
                    parts.append(flat[k])
                flat[k] = index[key]
        out = dict(job)
        out["spec"] = flat
        jobs[name] = out
    history = {name: list(state.history.get(name, [])) for name in state.jobs}
    history.update((k, v) for k, v in state.history.items() if k not in history)
    return {
        "v": 2, "parts": parts, "jobs": jobs, "runs": state.runs, "history": history,
        "queues": state.queues, "requests": list(state.requests.items()), "now_ms": state.now_ms,
        "gen": state.gen, "manual_seq": state.manual_seq, "fencing_token": state.fencing_token,
        "applied": state.applied, "leader": state.leader, "tenants": state.tenants, "locks": state.locks,
    }


def snapshot_v1_obj(state: SchedulerState) -> dict:
    """What snapshot version 1 wrote: version 2 with each spec whole and the stats a map."""
    obj = snapshot_v2_obj(state)
    parts = obj.pop("parts")
    for name, job in obj["jobs"].items():
        spec = {k: (parts[v] if k in _SHARED_PARTS_V2 else v) for k, v in job["spec"].items()}
        obj["jobs"][name] = dict(job, spec=spec, stats=dict(zip(_STATS_FIELDS_V1, job["stats"])))
    obj["v"] = 1
    return obj


def pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def refused(state: SchedulerState, cmd, code: str) -> dict:
    """Apply a command (or its bytes) that must be refused with ``code`` and must change nothing
    (compared as snapshots, minus what every command changes by design: the ``applied`` counter,
    and the state's time, which a command's ``now`` moves forward, I6). Returns the refusal."""
    before = snap_obj(state, drop=("applied", "now_ms"))
    data = cmd if isinstance(cmd, (bytes, bytearray)) else commands.encode(cmd)
    res = state.apply_bytes(data)
    assert res["ok"] is False, res
    assert res["error"]["code"] == code, res
    assert snap_obj(state, drop=("applied", "now_ms")) == before, "a refused command changed the state"
    return res


def counters(state: SchedulerState) -> dict:
    """The indexes apply keeps beside the runs (queue depths, running leases, the dead-letter
    queues), as a replica restored from a snapshot rebuilds them from the runs alone: a handler
    that changes a run's state without its index shows here (compare with ``restored``)."""
    return {"depth": {q: n for q, n in state._queue_depth.items() if n},
            "running": {q: n for q, n in state._running_count.items() if n},
            "running_ids": set(state._running_ids),
            "dead": {q: list(d) for q, d in state._dead.items() if d}}


def live_worker(state: SchedulerState, now: int, worker: str = "w-any") -> None:
    """Register a live worker of every queue and executor type, as a node with slots registers
    its embedded one: a PUT's answer then has no "queue: no live worker serves queue" warning
    (node/service.py), for tests of the other warnings on a replica without a worker."""
    res = apply(state, commands.make("worker_hello", now, None, worker=worker, kind="remote", labels={}, slots=4,
                                     executors=list(model.EXECUTOR_TYPES), queues=None, version="1", instance="i1"))
    assert res["ok"], res
