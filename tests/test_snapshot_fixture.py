"""A version 3 snapshot taken by the code of December 2026, checked in as bytes
(tests/fixtures/snapshot_v3.msgpack), and what today's code must do with it.

The state it holds was built by ``build()`` below through ``apply_bytes`` alone, from commands
written out in full (specs as stored, fire entries as the trigger proposes them), so it depends
on no proposer code: jobs of every schedule kind (cron with a zone, every_s with start_at and
jitter, at), a fleet sharing spec parts, every overlap policy, paused jobs, runs in every state
(queued, running with leases, succeeded, failed by a replace, dead in the dead-letter queue,
skipped, coalesced), recorded ranges, a manual run, a drop_oldest queue and a reject one,
tenants, locks, request ids (with a refusal and a retried request) and histories.

What must hold (I1 in docs/design.md): the fixture restores and snapshots again to the very same
bytes; building it again today writes the same bytes; and the commands of ``further()`` applied
to the restored state give the state hash recorded when the fixture was taken. A restructuring of
the core that changes any of these changed a byte of the snapshot or of what apply does.

Remake the fixture (only for a deliberate change of the snapshot format, with a new version):
``.venv/bin/python tests/test_snapshot_fixture.py --write``.
"""
from __future__ import annotations

import hashlib
import os
import sys

import msgpack

from raftsched.core import commands
from raftsched.core.queues import unqueue_count
from raftsched.core.state import SchedulerState

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "snapshot_v3.msgpack")
#: sha256 of the fixture's bytes, and the state hash after further() (recorded at bb3d269).
FIXTURE_SHA256 = "cf747a1fd90857ea1ee375411d6ecff25b75d7d25f7f18277cf2f518173d021d"
FURTHER_SHA256 = "d777f02591c47f78fa3f9689db2256543fbb2ce20b1bfe4546f07cb60503c4ff"

#: 2027-01-15T08:00:00Z; every time of the workload is an offset from it.
T = 1_800_000_000_000
S = 1000
H = 3600 * S

_RETRY = {"max_attempts": 1, "backoff_s": 1, "backoff_multiplier": 2, "backoff_max_s": 300, "jitter": 0.1}


def spec(schedule: dict, executor: dict | None = None, *, misfire=("fire_all", 60, 10), retry=None,
         queue="default", priority=0, tenant="default", history=20, overlap=None, payload=None,
         timeout_s=3600, description=None) -> dict:
    """A spec as the proposer stores it (model.validate_job's keys and order)."""
    out = {
        "schedule": schedule,
        "executor": executor or {"type": "python", "target": "app.jobs:run"},
        "payload": {} if payload is None else payload,
        "timeout_s": timeout_s,
        "misfire": {"policy": misfire[0], "grace_s": misfire[1], "max_catchup": misfire[2]},
        "retry": dict(_RETRY) if retry is None else retry,
        "queue": queue, "priority": priority, "tenant": tenant, "history": history,
        "overlap": {"policy": "allow"} if overlap is None else overlap,
    }
    if description is not None:
        out["description"] = description
    return out


class Log:
    """Applies commands as replication does (encoded, then apply_bytes) and keeps the results."""

    def __init__(self, s: SchedulerState) -> None:
        self.s = s
        self.results: list[dict] = []

    def __call__(self, op: str, now: int, rid: str | None = None, **fields) -> dict:
        res = self.s.apply_bytes(commands.encode(commands.make(op, now, rid, **fields)))
        self.results.append(res)
        return res

    def gen(self, name: str) -> int:
        return self.s.jobs[name]["gen"]


def _entry(log: Log, name: str, after: int, upto: int, nxt: int | None, runs: list, rec=()) -> list:
    """A fire entry as the trigger proposes it (policy.compact_entry)."""
    return [name, log.gen(name), after, upto, nxt, list(runs), [list(r) for r in rec]]


def ok(res: dict) -> dict:
    assert res["ok"], res
    return res


def build() -> SchedulerState:
    s = SchedulerState()
    a = Log(s)
    ok(a("put_queue", T, "rq-bulk", name="bulk", max_depth=3, on_full="drop_oldest"))
    ok(a("put_queue", T, None, name="strict", max_depth=2, on_full="reject"))
    ok(a("put_tenant", T, "rt-acme", name="acme", rate_milli=500, burst=2))
    ok(a("put_tenant", T, None, name="slow", rate_milli=0, burst=1))
    fleet = [{"name": f"f{i}", "spec": spec({"every_s": 10}, {"type": "shell", "argv": ["echo", str(i)]},
                                            misfire=("fire_all", 5, 3), queue="bulk", history=4),
              "next": T + 10 * S, "cursor": T, "anchor": T, "create_only": False} for i in range(4)]
    ok(a("put_jobs", T, "jb-fleet", jobs=fleet))

    def put(name, sp, cursor=T, anchor=T, nxt=None, rid=None, now=T, **kw):
        return ok(a("put_job", now, rid, name=name, spec=sp, next=nxt, cursor=cursor, anchor=anchor,
                    create_only=False, **kw))

    put("cron", spec({"cron": "0 * * * *", "timezone": "Europe/Paris"},
                     {"type": "http", "url": "http://h/hook", "headers": {"X-A": "1"}},
                     misfire=("fire_once", 60, 10),
                     retry={"max_attempts": 3, "backoff_s": 2, "backoff_multiplier": 2, "backoff_max_s": 60,
                            "jitter": 0.25},
                     queue="strict", priority=7, tenant="acme", payload={"k": [1, {"x": 2.5}]},
                     description="hourly, Paris time"),
        cursor=T - 4 * H, anchor=T - 4 * H, nxt=T - 3 * H, rid="rp-cron")
    put("once", spec({"at": T + 60 * S}, misfire=("skip", 0, 0)), nxt=T + 60 * S)
    put("forbid", spec({"every_s": 5}, overlap={"policy": "forbid"}, tenant="slow"), nxt=T + 5 * S)
    put("q1", spec({"every_s": 5}, overlap={"policy": "queue_one"}), nxt=T + 5 * S)
    put("repl", spec({"every_s": 5}, overlap={"policy": "replace"}), nxt=T + 5 * S)
    put("cap", spec({"every_s": 5}, overlap={"policy": "allow", "max_concurrent": 1}), nxt=T + 5 * S)
    put("jit", spec({"every_s": 60, "start_at": T - 5 * 60 * S, "jitter_ms": 5000, "jitter_key": "jit"},
                    misfire=("skip", 10, 0)),
        cursor=T - 300 * S, anchor=T - 300 * S, nxt=T - 240 * S)
    put("ahead", spec({"every_s": 1}, history=10), nxt=T + S)
    put("gone", spec({"every_s": 10}), nxt=T + 10 * S)
    put("dead1", spec({"every_s": 30}, priority=3), nxt=T + 10 * S)

    t = T + 10 * S
    ok(a("fire", t, None, entries=[
        *[_entry(a, f"f{i}", T, t, t + 10 * S, [t]) for i in range(4)],  # 4 runs, depth 3: f0's dropped
        *[_entry(a, n, T, t, t + 5 * S, [T + 5 * S, t]) for n in ("forbid", "q1", "repl", "cap")],
        _entry(a, "cron", T - 4 * H, t, T + H, [T], [("coalesced", "misfire", T - 3 * H, T - H, 3)]),
        _entry(a, "jit", T - 300 * S, t, T + 60 * S, [], [("skipped", "misfire", T - 240 * S, T - 60 * S, 4)]),
        _entry(a, "ahead", T, T + 12 * S, T + 13 * S, [T + 9 * S, t, T + 11 * S, T + 12 * S]),
        _entry(a, "gone", T, t, t + 10 * S, [t]),
        _entry(a, "dead1", T, t, T + 40 * S, [t]),
    ]))
    ok(a("pause_job", T + 10_500, "rp-ahead", name="ahead"))  # holds its runs for slots ahead
    ok(a("pause_job", T + 10_500, None, name="f1"))
    ok(a("trigger_job", T + 11 * S, "rt-once", name="once"))
    g1 = ok(a("acquire", T + 12 * S, "ra-1", worker="w1", queues=None, max=6, ttl=30_000))["runs"]
    g2 = ok(a("acquire", T + 12 * S, None, worker="w2", queues=["default", "bulk"], max=4, ttl=20_000,
              types=["python"]))["runs"]
    by_job = {g["job"]: g for g in g1 + g2}
    assert {"cron", "once", "dead1", "forbid"} <= set(by_job), sorted(by_job)
    ok(a("heartbeat", T + 15 * S, None, worker="w1", ttl=30_000,
         leases=[[g["id"], g["token"]] for g in g1] + [["nope@1", 1]]))
    ok(a("complete", T + 16 * S, "rc-1", run=by_job["forbid"]["id"], token=by_job["forbid"]["token"],
         success=True, output="done"))
    ok(a("complete", T + 16 * S, None, run=by_job["cron"]["id"], token=by_job["cron"]["token"],
         success=False, error="HTTP 503"))  # a retry: queued again, due after its backoff
    ok(a("complete", T + 17 * S, None, run=by_job["dead1"]["id"], token=by_job["dead1"]["token"],
         success=False, error="Traceback ... boom"))  # max_attempts 1: dead
    ok(a("complete_many", T + 17 * S, None, results=[
        {"run": by_job["once"]["id"], "token": by_job["once"]["token"], "success": False, "error": "x" * 40},
        {"run": by_job["forbid"]["id"], "token": by_job["forbid"]["token"], "success": True},  # stale now
    ]))
    rest = [g for g in g1 + g2 if g["job"] not in ("forbid", "cron", "dead1", "once")]
    lost = rest[0]
    ok(a("expire", T + 50 * S, None, runs=[[lost["id"], lost["token"], 1]], locks=[]))
    ok(a("takeover", T + 50 * S, None, node="n2"))
    ok(a("lock_acquire", T + 51 * S, "rl-1", name="l1", owner="o1", ttl=10_000))
    l1 = s.locks["l1"]["token"]
    ok(a("lock_renew", T + 52 * S, None, name="l1", token=l1, ttl=15_000))
    ok(a("lock_acquire", T + 52 * S, None, name="l2", owner="o2", ttl=20_000))
    assert not a("lock_acquire", T + 53 * S, "rl-2", name="l1", owner="o3", ttl=10_000)["ok"]  # held
    assert a("lock_acquire", T + 53 * S, "rl-1", name="l1", owner="o1", ttl=10_000)["duplicate"]
    ok(a("dlq_requeue", T + 54 * S, "rd-1", run=by_job["dead1"]["id"]))
    ok(a("delete_job", T + 55 * S, None, name="gone"))
    ok(a("put_job", T + 56 * S, None, name="f2", spec=fleet[2]["spec"] | {"history": 2},
         next=0, cursor=0, anchor=0, create_only=False))  # same schedule: keeps its cursor
    ok(a("put_job", T + 56 * S, None, name="q1", spec=spec({"every_s": 7}, overlap={"policy": "queue_one"}),
         next=T + 63 * S, cursor=T + 56 * S, anchor=T + 56 * S, create_only=False))
    ok(a("put_jobs", T + 57 * S, "jb-2", jobs=[
        {"name": "f3", "spec": fleet[3]["spec"], "next": 0, "cursor": 0, "anchor": 0, "create_only": True},
        {"name": "new1", "spec": fleet[0]["spec"], "next": T + 60 * S, "cursor": T + 57 * S,
         "anchor": T + 57 * S, "create_only": True}]))
    f1 = s.jobs["f1"]
    ok(a("resume_job", T + 58 * S, None, name="f1", catch_up=False, gen=f1["gen"], after=f1["cursor"],
         upto=T + 58 * S, next=T + 60 * S, rec=[["skipped", "paused", T + 20 * S, T + 50 * S, 4]]))
    t = T + 60 * S
    ok(a("fire", t, None, entries=[
        _entry(a, "f0", T + 10 * S, t, t + 10 * S, [T + 20 * S, T + 30 * S, T + 40 * S, T + 50 * S, t]),
        _entry(a, "f3", T + 10 * S, t, t + 10 * S, [T + 20 * S, T + 30 * S],
               [("skipped", "catchup_limit", T + 40 * S, t, 3)]),
        _entry(a, "new1", T + 57 * S, t, t + 10 * S, [t]),
        _entry(a, "once", T, t, None, [], [("skipped", "misfire", T + 60 * S, T + 60 * S, 1)]),
        ["f2", 1, T, t, t + 10 * S, [t], []],  # stale: f2 was replaced
    ]))
    return s


def further(s: SchedulerState) -> list[dict]:
    """Commands applied to the restored fixture: one of each kind, derived from its content."""
    a = Log(s)
    t = T + 70 * S
    a("fire", t, None, entries=[_entry(a, "f1", T + 58 * S, t, t + 10 * S, [T + 60 * S, t]),
                                _entry(a, "cron", T + 10 * S, t, T + H, [], [])])
    got = a("acquire", t + S, None, worker="w3", queues=None, max=4, ttl=30_000)["runs"]
    if got:
        a("complete_many", t + 2 * S, None, results=[
            {"run": g["id"], "token": g["token"], "success": i % 2 == 0, "error": None if i % 2 == 0 else "no"}
            for i, g in enumerate(got)])
    running = sorted(r for r, run in s.runs.items() if run["state"] == "running")
    a("heartbeat", t + 3 * S, "rh-1", worker="w1", ttl=30_000,
      leases=[[r, s.runs[r]["fencing_token"]] for r in running])
    if running:
        run = s.runs[running[-1]]
        a("expire", t + 4 * S, None, runs=[[run["id"], run["fencing_token"], run.get("renewals", 0)]],
          locks=[["l2", s.locks["l2"]["token"], s.locks["l2"].get("renewals", 0)]])
    a("lock_release", t + 5 * S, None, name="l1", token=s.locks["l1"]["token"])
    a("delete_tenant", t + 5 * S, "rt-2", name="slow")
    dead = sorted(r for r, run in s.runs.items() if run["state"] == "dead")
    if dead:
        a("dlq_delete", t + 6 * S, None, run=dead[0])
    a("resume_job", t + 7 * S, None, name="ahead", catch_up=True)
    a("trigger_job", t + 8 * S, "rt-3", name="cron")
    a("delete_job", t + 9 * S, None, name="f0")
    a("put_queue", t + 9 * S, None, name="bulk", max_depth=5, on_full="reject")
    a("noop", t + 10 * S, None)
    return a.results


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: Sections of the state added after the fixture was taken, which its commands now also write: a
#: job's health, kept on every run outcome, and why a paused job is paused (core/notify.py).
#: Compared without them; everything the fixture knew must be byte for byte the same.
NEWER_SECTIONS = ("health", "pauses")


def _decided_before(s: SchedulerState) -> SchedulerState:
    """``s`` (built today) as the fixture's code left it where apply now decides otherwise, in
    place, each a deliberate change listed in docs/operations.md "Upgrading":

    - 2026-12-04, a pause holds its job's runs fired ahead (queued, ``due`` None, until the
      resume decides them) where the fixture's code recorded them skipped / paused at the pause:
      job ``ahead``'s runs for T+11s and T+12s, paused at T+10.5s; the pause's answer, which
      its request id keeps, counts them ``held`` where it said ``withdrawn``."""
    key, res = s.requests["rp-ahead"]
    s.requests["rp-ahead"] = [key, {("withdrawn" if k == "held" else k): v for k, v in res.items()}]
    for rid in s.history["ahead"]:
        run = s.runs[rid]
        if run["state"] == "queued" and run["due"] is None:
            unqueue_count(s, run)
            run["due"] = run["slot"]
            run.update(state="skipped", reason="paused", finished_at=T + 10_500)
    return s


def _known(data: bytes) -> bytes:
    """A snapshot without NEWER_SECTIONS (version 3 again when no other section is left)."""
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    ext = obj.get("ext")
    if not ext or not any(k in ext for k in NEWER_SECTIONS):
        return data
    for k in NEWER_SECTIONS:
        ext.pop(k, None)
    if not ext:
        del obj["ext"]
        obj["v"] = 3
    return msgpack.packb(obj, use_bin_type=True)


def _known_hash(s: SchedulerState) -> str:
    return _sha(_known(s.snapshot()))


def _fixture() -> bytes:
    with open(FIXTURE, "rb") as f:
        return f.read()


def test_the_fixture_is_the_one_recorded():
    assert _sha(_fixture()) == FIXTURE_SHA256


def test_the_fixture_restores_and_snapshots_to_the_same_bytes():
    data = _fixture()
    s = SchedulerState()
    s.restore(data)
    assert s.snapshot() == data
    again = SchedulerState()
    again.restore(s.snapshot())
    assert again.snapshot() == data


def test_building_the_workload_today_writes_the_fixture():
    s = build()
    held = [r for r in s.history["ahead"] if s.runs[r]["due"] is None]
    assert held == [f"ahead@{T + 11 * S}", f"ahead@{T + 12 * S}"]  # (so _decided_before is needed)
    built = _decided_before(s).snapshot()
    assert _known(built) == _fixture()
    assert msgpack.unpackb(built, raw=False, strict_map_key=False)["ext"]["health"]  # (so the strip is needed)


def test_further_commands_after_a_restore_give_the_recorded_state():
    s = SchedulerState()
    s.restore(_fixture())
    results = further(s)
    assert all(isinstance(r, dict) and "ok" in r for r in results)
    assert _known_hash(s) == FURTHER_SHA256
    # The same commands on the state the fixture was taken from end in the same state.
    built = _decided_before(build())
    assert further(built) == results
    assert _known_hash(built) == FURTHER_SHA256


if __name__ == "__main__":
    s = build()
    data = s.snapshot()
    if "--write" in sys.argv:
        os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
        with open(FIXTURE, "wb") as f:
            f.write(data)
    r = SchedulerState()
    r.restore(data)
    further(r)
    print("fixture", _sha(data), len(data), "bytes")
    print("further", r.state_hash())
