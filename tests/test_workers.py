"""The worker fleet in the replicated state (core/workers.py; docs/design.md I18, I19): the
registry and its bound, gone and forgotten workers, placement in acquire, release, drain, the
snapshot section, and the reads (core/queries.py) the API and the dispatcher make of it."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, limits, queries, schedule
from raftsched.core.model import EXECUTOR_TYPES, validate_job
from raftsched.core.placement import placement_ok
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, apply, put_cmd, restored
from raftsched.core.records import outcome_results
from exec_helpers import TTL, acq, do, hb, jspec, refused, trig

ALL = list(EXECUTOR_TYPES)


def hello(s, now, worker="w1", *, rid=None, kind="remote", labels=None, slots=4, executors=None, queues=None,
          version="1.0", instance="i1", dedicated=None) -> dict:
    extra = {} if dedicated is None else {"dedicated": dedicated}
    return do(s, "worker_hello", now, rid, worker=worker, kind=kind, labels=labels or {}, slots=slots,
              executors=executors or ALL, queues=queues, version=version, instance=instance, **extra)


def placed(**labels) -> dict:
    return jspec(placement={"labels": labels})


def state_with(*jobs) -> SchedulerState:
    s = SchedulerState()
    for name, spec in jobs:
        assert apply(s, put_cmd(s, name, spec, T0))["ok"]
    return s


# ---------------------------------------------------------------------------- the registry
def test_hello_registers_a_worker_with_its_facts_normalised():
    s = SchedulerState()
    res = hello(s, T0, labels={"zone": "b", "pool": "gpu"}, executors=["shell", "python", "shell"], queues=["q2", "q1"])
    assert res == {"ok": True, "worker": "w1", "created": True, "changed": True, "state": "active"}
    w = s.workers["w1"]
    assert list(w["labels"]) == ["pool", "zone"]  # names in order, whatever order they came in
    assert w["executors"] == ["python", "shell"] and w["queues"] == ["q1", "q2"]
    assert (w["first_seen"], w["last_seen"], w["state"], w["grants"], w["losses"]) == (T0, T0, "active", 0, 0)


def test_the_same_hello_again_changes_only_when_it_was_seen():
    s = SchedulerState()
    hello(s, T0, labels={"pool": "gpu"})
    res = hello(s, T0 + SEC, labels={"pool": "gpu"})
    assert res["created"] is False and res["changed"] is False
    assert s.workers["w1"]["last_seen"] == T0 + SEC and s.workers["w1"]["first_seen"] == T0
    res = hello(s, T0 + 2 * SEC, labels={"pool": "cpu"}, slots=8)
    assert res["changed"] is True and s.workers["w1"]["labels"] == {"pool": "cpu"} and s.workers["w1"]["slots"] == 8


@pytest.mark.parametrize("fields", [
    {"worker": ""}, {"worker": "a b"}, {"worker": "x" * (limits.worker_id_chars_max + 1)}, {"worker": 3},
    {"kind": "cloud"}, {"slots": -1}, {"slots": limits.worker_slots_max + 1}, {"slots": True},
    {"labels": {"pool": ""}}, {"labels": {"": "x"}}, {"labels": {"a b": "x"}}, {"labels": ["pool=gpu"]},
    {"labels": {f"k{i}": "v" for i in range(limits.worker_labels_max + 1)}}, {"labels": {"k": 1}},
    {"executors": []}, {"executors": ["docker"]}, {"executors": "shell"},
    {"queues": []}, {"queues": ["a b"]}, {"queues": [f"q{i}" for i in range(limits.worker_queues_max + 1)]},
    {"version": "v" * (limits.worker_version_chars_max + 1)}, {"instance": 7},
    {"dedicated": ["pool"]}, {"dedicated": "pool"}, {"dedicated": [1]},
    {"labels": {"pool": "gpu"}, "dedicated": ["pool", "zone"]},
    {"tenants": []}, {"tenants": "billing"}, {"tenants": ["a b"]}, {"tenants": [3]},
    {"tenants": [f"t{i}" for i in range(limits.token_tenants_max + 1)]},
])
def test_a_malformed_hello_is_refused_and_changes_nothing(fields):
    s = SchedulerState()
    hello(s, T0, "w0")
    cmd = commands.make("worker_hello", T0, None, worker="w1", kind="remote", labels={}, slots=4, executors=ALL,
                        queues=None, version="1", instance="i")
    cmd.update(fields)
    refused(s, cmd, "invalid_command")


def test_a_full_registry_evicts_the_worker_unseen_the_longest_only_if_it_is_gone(monkeypatch):
    monkeypatch.setattr(limits, "workers_max", 3)
    s = SchedulerState()
    for k, t in enumerate((T0, T0 + SEC, T0 + SEC)):
        hello(s, t, f"w{k}")
    # None is gone yet: the fourth is refused, and nothing changes.
    refused(s, commands.make("worker_hello", T0 + 2 * SEC, None, worker="w3", kind="remote", labels={}, slots=1,
                             executors=ALL, queues=None), "limit_exceeded")
    # w0 is gone (unseen for worker_gone_ms), and the oldest: it makes room.
    later = T0 + limits.worker_gone_ms + 1
    assert hello(s, later, "w3")["created"]
    assert sorted(s.workers) == ["w1", "w2", "w3"]
    # w1 and w2 were seen at the same time: the smaller id goes first.
    assert hello(s, T0 + SEC + limits.worker_gone_ms + 1, "w4")["created"]
    assert sorted(s.workers) == ["w2", "w3", "w4"]


def test_a_worker_is_gone_at_read_time_and_forgotten_only_by_the_leaders_command():
    s = SchedulerState()
    hello(s, T0, "old")
    hello(s, T0, "busy")
    assert [w["status"] for w in queries.workers(s, T0 + limits.worker_gone_ms)] == ["active", "active"]
    gone_at = T0 + limits.worker_gone_ms + 1
    assert {w["id"]: w["status"] for w in queries.workers(s, gone_at)} == {"busy": "gone", "old": "gone"}
    # A node reports "busy" connected: seen again.
    res = do(s, "workers_seen", gone_at, node="node-1", workers=["busy", "nobody"])
    assert res == {"ok": True, "seen": 1, "unknown": ["nobody"]}
    assert {w["id"]: w["status"] for w in queries.workers(s, gone_at)} == {"busy": "active", "old": "gone"}
    forget_at = T0 + limits.worker_forget_ms + 1
    items = queries.workers_to_forget(s, forget_at, 10)
    assert items == [["old", T0]]
    # A forget read before a worker was seen again ignores it (its last_seen moved).
    res = do(s, "forget_workers", forget_at, workers=items + [["busy", T0]])
    assert res == {"ok": True, "forgotten": ["old"], "ignored": 1} and sorted(s.workers) == ["busy"]
    # Not that long gone by the command's now: ignored.
    res = do(s, "forget_workers", forget_at, workers=[["busy", gone_at]])
    assert res["forgotten"] == [] and "busy" in s.workers


def test_commands_that_name_a_worker_see_it():
    s = state_with(("j", jspec()))
    hello(s, T0, "w1")
    trig(s, "j", T0)
    g = acq(s, T0 + SEC, "w1")[0]
    assert s.workers["w1"]["last_seen"] == T0 + SEC and s.workers["w1"]["grants"] == 1
    hb(s, T0 + 2 * SEC, "w1", [[g["id"], g["token"]]])
    assert s.workers["w1"]["last_seen"] == T0 + 2 * SEC
    res = do(s, "complete_many", T0 + 3 * SEC, results=[{"run": g["id"], "token": g["token"], "success": True}],
             worker="w1")
    assert outcome_results(res, [g["id"]])[0]["ok"] and s.workers["w1"]["last_seen"] == T0 + 3 * SEC
    assert s.workers["w1"]["completed"] == 1
    # A refused (stale) outcome does not count.
    do(s, "complete_many", T0 + 3 * SEC, results=[{"run": g["id"], "token": g["token"], "success": True}], worker="w1")
    assert s.workers["w1"]["completed"] == 1


def test_an_expired_lease_counts_as_a_loss_of_its_worker():
    s = state_with(("j", jspec()))
    hello(s, T0, "w1")
    trig(s, "j", T0)
    g = acq(s, T0, "w1")[0]
    res = do(s, "expire", T0 + 60 * SEC, runs=[[g["id"], g["token"], 0]], locks=[])
    assert res["expired"] == [g["id"]] and s.workers["w1"]["losses"] == 1


# ---------------------------------------------------------------------------- drain
def test_a_draining_worker_is_granted_nothing_and_hears_it():
    s = state_with(("j", jspec()))
    hello(s, T0, "w1")
    trig(s, "j", T0)
    g = acq(s, T0, "w1", n=1)[0]
    trig(s, "j", T0)
    res = do(s, "drain_worker", T0, worker="w1")
    assert res == {"ok": True, "worker": "w1", "state": "draining", "changed": True}
    res = do(s, "acquire", T0 + SEC, worker="w1", queues=None, max=5, ttl=TTL)
    assert res == {"ok": True, "runs": [], "draining": True}
    assert hb(s, T0 + SEC, "w1", [[g["id"], g["token"]]]) == {"ok": True, "extended": 1, "lost": [], "draining": True}
    # Another worker takes the queued run.
    assert len(acq(s, T0 + SEC, "w2")) == 1
    assert do(s, "drain_worker", T0, worker="nobody")["error"]["code"] == "not_found"


def test_a_new_process_under_a_drained_id_is_active_again_the_same_one_is_not():
    s = SchedulerState()
    hello(s, T0, "w1", instance="a")
    do(s, "drain_worker", T0, worker="w1")
    assert hello(s, T0 + SEC, "w1", instance="a")["state"] == "draining"
    assert hello(s, T0 + 2 * SEC, "w1", instance="b") == {"ok": True, "worker": "w1", "created": False,
                                                          "changed": True, "state": "active"}


# ---------------------------------------------------------------------------- placement
def test_placement_keeps_runs_off_workers_without_its_labels():
    s = state_with(("gpu", placed(pool="gpu", region="eu")), ("any", jspec()))
    hello(s, T0, "cpu-1", labels={"pool": "cpu", "region": "eu"})
    hello(s, T0, "gpu-1", labels={"pool": "gpu", "region": "eu", "extra": "x"})
    gpu = [trig(s, "gpu", T0) for _ in range(3)]
    plain = trig(s, "any", T0)
    # An unregistered worker has no labels; a worker with other labels neither: only the run
    # without placement goes to either.
    assert [g["id"] for g in acq(s, T0, "stranger")] == [plain]
    assert acq(s, T0, "cpu-1") == []
    assert sorted(g["id"] for g in acq(s, T0, "gpu-1")) == sorted(gpu)


def test_held_back_runs_keep_their_place_in_the_queue():
    s = state_with(("gpu", placed(pool="gpu")), ("any", jspec()))
    hello(s, T0, "gpu-1", labels={"pool": "gpu"})
    first = trig(s, "gpu", T0)
    second = trig(s, "any", T0 + 1)
    third = trig(s, "gpu", T0 + 2)
    assert [g["id"] for g in acq(s, T0 + SEC, "cpu", n=1)] == [second]
    assert [g["id"] for g in acq(s, T0 + SEC, "gpu-1")] == [first, third]


def test_a_dedicated_worker_takes_only_runs_placed_on_its_dedicated_labels():
    """A worker dedicated to its label raftsched.app=a (raftsched worker --app) takes the runs
    placed on it, and neither another app's, nor a job placed on its other labels only, nor a
    job without placement: those go to the other workers, whose labels decide as before."""
    s = state_with(("app-a", placed(**{"raftsched.app": "a"})), ("app-a-gpu", placed(**{"raftsched.app": "a", "pool": "gpu"})),
                   ("app-b", placed(**{"raftsched.app": "b"})), ("gpu", placed(pool="gpu")), ("any", jspec()))
    labels = {"raftsched.app": "a", "pool": "gpu"}
    hello(s, T0, "app-worker", labels=labels, dedicated=["raftsched.app"])
    hello(s, T0, "plain", labels=labels)
    assert s.workers["app-worker"]["dedicated"] == ["raftsched.app"] and "dedicated" not in s.workers["plain"]
    ids = {name: trig(s, name, T0) for name in ("app-a", "app-a-gpu", "app-b", "gpu", "any")}
    assert sorted(g["id"] for g in acq(s, T0, "app-worker")) == sorted([ids["app-a"], ids["app-a-gpu"]])
    assert sorted(g["id"] for g in acq(s, T0, "plain")) == sorted([ids["gpu"], ids["any"]])
    assert s.runs[ids["app-b"]]["state"] == "queued"
    # Both acquire paths (here the general one: executor types named) agree.
    again = {name: trig(s, name, T0) for name in ("app-a", "any")}
    res = do(s, "acquire", T0, worker="app-worker", queues=None, max=10, ttl=TTL, types=ALL)
    assert [g["id"] for g in res["runs"]] == [again["app-a"]]
    # A hello without it makes the worker an ordinary one again.
    hello(s, T0, "app-worker", labels=labels)
    assert "dedicated" not in s.workers["app-worker"]
    assert [g["id"] for g in acq(s, T0, "app-worker")] == [again["any"]]


def test_a_registry_without_dedicated_workers_snapshots_as_before():
    """A record holds ``dedicated`` only while it is not empty: the hello that drops it gives
    back the bytes of a state whose worker never had it."""
    a, b = state_with(("j", jspec())), state_with(("j", jspec()))
    hello(a, T0, labels={"pool": "gpu"})
    hello(b, T0, labels={"pool": "gpu"}, dedicated=["pool"])
    assert a.snapshot() != b.snapshot()
    assert hello(b, T0, labels={"pool": "gpu"}, dedicated=[])["changed"] is True
    assert hello(a, T0, labels={"pool": "gpu"})["changed"] is False  # (as many commands applied)
    assert a.snapshot() == b.snapshot()
    assert queries.worker_record(a, "w1")["dedicated"] == []


def test_a_workers_tenants_are_registered_while_its_token_has_them_and_snapshot_as_before_after():
    """A worker limited to tenants (its token's) is registered with them; a hello without them
    (an unlimited token speaks for the id) drops the key: the bytes of a worker that never had it."""
    a, b = state_with(("j", jspec())), state_with(("j", jspec()))
    hello(a, T0)
    res = do(b, "worker_hello", T0, None, worker="w1", kind="remote", labels={}, slots=4, executors=ALL,
             queues=None, version="1.0", instance="i1", tenants=["billing", "ads", "billing"])
    assert res["created"] and b.workers["w1"]["tenants"] == ["ads", "billing"]
    assert queries.worker_record(b, "w1")["tenants"] == ["ads", "billing"]
    assert queries.worker(b, "w1", T0)["tenants"] == ["ads", "billing"]
    assert queries.worker(a, "w1", T0)["tenants"] is None
    assert a.snapshot() != b.snapshot() and restored(b).snapshot() == b.snapshot()
    assert hello(b, T0)["changed"] is True
    hello(a, T0)  # (as many commands applied)
    assert a.snapshot() == b.snapshot()


def test_a_malformed_placement_in_a_command_is_refused():
    spec = dict(jspec(), placement={"labels": ["pool"]})
    s = SchedulerState()
    refused(s, put_cmd(s, "j", spec, T0), "invalid_command")


@pytest.mark.parametrize("placement, field", [
    ({}, "placement.labels"), ({"labels": {}}, "placement.labels"), ({"labels": {"pool": ""}}, "placement.labels.pool"),
    ({"labels": {"pool": "gpu"}, "nodes": 3}, "placement.nodes"), ("gpu", "placement"),
    ({"labels": {f"k{i}": "v" for i in range(limits.worker_labels_max + 1)}}, "placement.labels"),
])
def test_a_bad_placement_in_a_spec_names_the_field(placement, field):
    from raftsched.core.errors import InvalidSpec
    with pytest.raises(InvalidSpec) as e:
        validate_job("j", dict(jspec_raw(), placement=placement))
    assert e.value.field == field


def jspec_raw() -> dict:
    return {"schedule": {"every_s": 3600}, "executor": {"type": "python", "target": "m:f"}, "misfire": {"policy": "skip"}}


LABELS = st.dictionaries(st.sampled_from(["pool", "zone"]), st.sampled_from(["a", "b"]), max_size=2)
PLACEMENTS = st.dictionaries(st.sampled_from(["pool", "zone"]), st.sampled_from(["a", "b"]), min_size=1, max_size=2)


def dedicated_of(labels: dict, pick: int) -> list:
    """Some of ``labels``' names, chosen by ``pick``'s bits (a worker is dedicated to them)."""
    return [k for i, k in enumerate(sorted(labels)) if pick >> i & 1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements=st.lists(st.one_of(st.none(), PLACEMENTS), min_size=1, max_size=3),
       workers=st.lists(st.one_of(st.none(), st.tuples(LABELS, st.integers(0, 3))), min_size=1, max_size=3),
       steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 4)), max_size=25))
def test_no_run_is_granted_to_a_worker_its_placement_excludes_and_both_acquire_paths_agree(placements, workers, steps):
    """Property (I18): over random jobs, workers (some unregistered, some dedicated to some of
    their labels) and acquires, every grant goes to a worker whose registered labels satisfy its
    job's placement, and whose dedicated labels that placement names; and the fast path (one
    heap, no executor types, no tenants) grants exactly what the general path does (forced here
    by naming every executor type)."""
    jobs = [(f"j{k}", jspec() if p is None else placed(**p)) for k, p in enumerate(placements)]
    states = [state_with(*jobs), state_with(*jobs)]
    for s in states:
        for k, w in enumerate(workers):
            if w is not None:
                hello(s, T0, f"w{k}", labels=w[0], dedicated=dedicated_of(*w))
    now = T0
    for j, k, n in steps:
        now += 1
        got = []
        for s, types in zip(states, (None, ALL)):
            trig(s, jobs[j % len(jobs)][0], now)
            res = do(s, "acquire", now, worker=f"w{k % len(workers)}", queues=None, max=n, ttl=TTL, types=types)
            assert res["ok"]
            got.append([(g["id"], g["token"]) for g in res["runs"]])
            w = s.workers.get(f"w{k % len(workers)}") or {}
            labels, dedicated = w.get("labels", {}), w.get("dedicated", [])
            for g in res["runs"]:
                spec = s.jobs[g["job"]]["spec"]
                assert placement_ok(spec, labels), (g, labels)
                assert all(d in spec.get("placement", {}).get("labels", {}) for d in dedicated), (g, dedicated)
        assert got[0] == got[1]
    assert states[0].snapshot() == states[1].snapshot()


# ---------------------------------------------------------------------------- release
def test_a_released_run_is_queued_again_at_once_without_spending_a_budget():
    s = state_with(("j", jspec()))  # max_attempts 1
    hello(s, T0, "w1")
    rid = trig(s, "j", T0)
    g = acq(s, T0, "w1")[0]
    res = do(s, "release", T0 + SEC, worker="w1", leases=[[rid, g["token"]]], reason="draining")
    assert res == {"ok": True, "released": [rid], "lost": []}
    run = s.runs[rid]
    assert (run["state"], run["attempt"], run["due"], run["worker"]) == ("queued", 2, T0 + SEC, None)
    assert run.get("failures", 0) == 0 and run.get("lost", 0) == 0
    a = run["attempts"][-1]
    assert a["released"] is True and a["worker"] == "w1" and a["token"] == g["token"] and a["ok"] is False
    assert a["error"] == "released by worker w1: draining"
    assert s.workers["w1"]["releases"] == 1
    # Queued again at once: the next worker takes it with a higher token, attempt 2, and can
    # still succeed although max_attempts is 1.
    g2 = acq(s, T0 + SEC, "w2")[0]
    assert g2["id"] == rid and g2["attempt"] == 2 and g2["token"] > g["token"]
    assert do(s, "complete", T0 + 2 * SEC, run=rid, token=g2["token"], success=True)["state"] == "succeeded"


def test_a_release_of_a_lease_the_worker_does_not_hold_changes_nothing():
    s = state_with(("j", jspec()))
    rid = trig(s, "j", T0)
    g = acq(s, T0, "w1")[0]
    for worker, tok in (("w2", g["token"]), ("w1", g["token"] + 1)):
        res = do(s, "release", T0, worker=worker, leases=[[rid, tok]])
        assert res == {"ok": True, "released": [], "lost": [rid]}
    assert s.runs[rid]["state"] == "running" and s.runs[rid]["fencing_token"] == g["token"]
    refused(s, commands.make("release", T0, None, worker="w1", leases=[[rid, "x"]]), "invalid_command")
    refused(s, commands.make("release", T0, None, worker="w1", leases=[[rid, g["token"]]] * (limits.heartbeat_leases_max + 1)),
            "invalid_command")


def test_a_released_run_of_a_deleted_job_is_dead():
    s = state_with(("j", jspec()))
    rid = trig(s, "j", T0)
    g = acq(s, T0, "w1")[0]
    assert do(s, "delete_job", T0, name="j")["ok"]
    if rid in s.runs:
        res = do(s, "release", T0, worker="w1", leases=[[rid, g["token"]]])
        assert res["released"] == [rid] and s.runs[rid]["state"] == "dead"


# ---------------------------------------------------------------------------- snapshot, determinism
def test_the_registry_is_a_snapshot_section_that_round_trips():
    s = state_with(("j", jspec()))
    assert msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)["v"] == 3
    hello(s, T0, "w2", labels={"pool": "gpu"})
    hello(s, T0, "w1", kind="embedded", queues=["q"])
    data = s.snapshot()
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert obj["v"] == 4 and [w for w, _ in obj["ext"]["workers"]] == ["w1", "w2"]
    r = restored(s)
    assert r.workers == s.workers and r.snapshot() == data
    # Forgotten again: the section is empty and the bytes are version 3 once more.
    do(r, "forget_workers", T0 + limits.worker_forget_ms + 1, workers=[["w1", T0], ["w2", T0]])
    assert msgpack.unpackb(r.snapshot(), raw=False, strict_map_key=False)["v"] == 3


FLEET_OPS = st.one_of(
    st.tuples(st.just("hello"), st.integers(0, 3), LABELS, st.sampled_from(["a", "b"]), st.integers(0, 3)),
    st.tuples(st.just("trigger"), st.integers(0, 2)),
    st.tuples(st.just("acquire"), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("drain"), st.integers(0, 3)),
    st.tuples(st.just("seen"), st.integers(0, 3)),
    st.tuples(st.just("forget"),),
    st.tuples(st.just("expire"),),
    st.tuples(st.just("tick"), st.sampled_from([1, SEC, limits.worker_gone_ms, limits.worker_forget_ms])),
    st.tuples(st.just("snapshot"),),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(FLEET_OPS, max_size=40))
def test_replicas_applying_fleet_commands_stay_identical_across_snapshots(ops):
    """I1 with the fleet's commands: one replica applies every command, another is restored
    from a snapshot now and then; their snapshots are the same bytes at the end, and so is
    every command's result."""
    jobs = [("j0", jspec()), ("j1", placed(pool="a")), ("j2", placed(pool="b", zone="a"))]
    a, b = state_with(*jobs), state_with(*jobs)
    now = T0
    for op in ops:
        kind = op[0]
        cmds = []
        if kind == "hello":
            cmds.append(commands.make("worker_hello", now, None, worker=f"w{op[1]}", kind="remote", labels=op[2],
                                      slots=4, executors=ALL, queues=None, version="1", instance=op[3],
                                      dedicated=dedicated_of(op[2], op[4])))
        elif kind == "trigger":
            cmds.append(commands.make("trigger_job", now, None, name=f"j{op[1]}"))
        elif kind == "acquire":
            cmds.append(commands.make("acquire", now, None, worker=f"w{op[1]}", queues=None, max=op[2], ttl=TTL))
        elif kind == "release":
            leases = [[rid, r["fencing_token"]] for rid, r in sorted(a.runs.items())
                      if r["state"] == "running" and r["worker"] == f"w{op[1]}"]
            cmds.append(commands.make("release", now, None, worker=f"w{op[1]}", leases=leases, reason="test"))
        elif kind == "drain":
            cmds.append(commands.make("drain_worker", now, None, worker=f"w{op[1]}"))
        elif kind == "seen":
            cmds.append(commands.make("workers_seen", now, None, node="n1", workers=[f"w{op[1]}", "w9"]))
        elif kind == "forget":
            cmds.append(commands.make("forget_workers", now, None, workers=queries.workers_to_forget(a, now, 10)))
        elif kind == "expire":
            items = [[i, t, r] for k, i, t, r, _ in queries.lease_snapshot(a) if k == "run"]
            cmds.append(commands.make("expire", now, None, runs=items, locks=[]))
        elif kind == "tick":
            now += op[1]
        else:
            b = restored(b)
        for cmd in cmds:
            assert apply(a, cmd) == apply(b, cmd)
    assert a.snapshot() == b.snapshot()


# ---------------------------------------------------------------------------- reads
def test_queues_and_runs_say_when_no_worker_matches_a_placement():
    s = state_with(("gpu", placed(pool="gpu")), ("any", jspec()))
    rid = trig(s, "gpu", T0)
    trig(s, "any", T0)
    assert queries.unplaceable(s, T0) == {"default": 1}
    assert queries.waiting_for(s, rid, T0) == queries.NO_WORKER_MATCHES
    # A worker with the labels that serves another queue, or does not run python, or is
    # draining, or gone: still no match.
    hello(s, T0, "w-q", labels={"pool": "gpu"}, queues=["other"])
    hello(s, T0, "w-shell", labels={"pool": "gpu"}, executors=["shell"])
    hello(s, T0, "w-drain", labels={"pool": "gpu"})
    do(s, "drain_worker", T0, worker="w-drain")
    assert queries.unplaceable(s, T0) == {"default": 1}
    hello(s, T0, "w-gpu", labels={"pool": "gpu"})
    assert queries.unplaceable(s, T0) == {} and queries.waiting_for(s, rid, T0) is None
    later = T0 + limits.worker_gone_ms + 1
    assert queries.unplaceable(s, later) == {"default": 1}
    assert queries.waiting_for_many(s, list(s.runs), later) == {rid: queries.NO_WORKER_MATCHES}
    g = queries.fleet_gauges(s, T0)
    assert g["by_status"] == {"active": 3, "draining": 1, "gone": 0} and queries.unplaceable_walk(g["unplaceable"]) == {}
    assert len(g["workers"]) == 4


def test_a_run_without_placement_that_only_dedicated_workers_serve_is_unplaceable():
    s = state_with(("app", placed(**{"raftsched.app": "a"})), ("any", jspec()))
    plain = trig(s, "any", T0)
    app = trig(s, "app", T0)
    # No worker at all: the run without placement waits for any worker, not for labels.
    assert queries.unplaceable(s, T0) == {"default": 1} and queries.waiting_for(s, plain, T0) is None
    hello(s, T0, "app-worker", labels={"raftsched.app": "a"}, dedicated=["raftsched.app"])
    assert queries.unplaceable(s, T0) == {"default": 1}
    assert queries.waiting_for(s, plain, T0) == queries.NO_WORKER_MATCHES and queries.waiting_for(s, app, T0) is None
    assert queries.waiting_for_many(s, [plain, app], T0) == {plain: queries.NO_WORKER_MATCHES}
    hello(s, T0, "plain-worker")
    assert queries.unplaceable(s, T0) == {} and queries.waiting_for(s, plain, T0) is None


def test_without_placements_or_restricted_workers_no_run_is_looked_at(monkeypatch):
    """The unplaceable count walks every queued run under the replica's lock (a storm's million
    made each metrics scrape 3 s long, and the leader lost its quorum): without a job that has a
    placement, nor a live worker dedicated or limited to tenants, the answer is known without
    the walk. The index of placed jobs follows puts, replaces, deletes and restores."""
    s = state_with(("any", jspec()), ("gpu", placed(pool="gpu")))
    for _ in range(3):
        trig(s, "any", T0)
    assert s._placed_jobs.keys() == {"gpu"} and restored(s)._placed_jobs.keys() == {"gpu"}
    # A replace without placement, then a delete: out of the index.
    assert apply(s, put_cmd(s, "gpu", jspec(), T0))["ok"]
    assert s._placed_jobs == {} and restored(s)._placed_jobs == {}
    assert apply(s, put_cmd(s, "gpu2", placed(pool="gpu"), T0))["ok"] and s._placed_jobs.keys() == {"gpu2"}
    assert do(s, "delete_job", T0, name="gpu2")["ok"] and s._placed_jobs == {}
    # Nothing can wait for placement: the queued runs are not read at all.
    walked = []
    real_get = s.runs.get

    class Spy(dict):
        def get(self, k, d=None):
            walked.append(k)
            return real_get(k, d)
    monkeypatch.setattr(s, "runs", Spy(s.runs))
    assert queries.unplaceable(s, T0) == {} and walked == []
    s.sinks["x"] = {}  # any sink: the leader's unplaceable_overdue looks only then
    from raftsched.core.notify_queries import unplaceable_overdue
    assert unplaceable_overdue(s, T0 + limits.unplaceable_report_ms + 1) == [] and walked == []
    # A dedicated worker: the runs without placement that only it serves count again, walked.
    hello(s, T0, "app-worker", labels={"raftsched.app": "a"}, dedicated=["raftsched.app"])
    assert queries.unplaceable(s, T0) == {"default": 3} and walked


def test_a_worker_view_lists_the_runs_it_holds():
    s = state_with(("j", jspec()))
    hello(s, T0, "w1", labels={"pool": "a"})
    rids = sorted(trig(s, "j", T0) for _ in range(2))
    grants = acq(s, T0, "w1")
    v = queries.worker(s, "w1", T0)
    assert v["registered"] and v["held"] == 2 and sorted(r["id"] for r in v["runs"]) == rids
    assert {r["token"] for r in v["runs"]} == {g["token"] for g in grants}
    assert queries.workers(s, T0)[0]["held"] == 2
    # Runs held by an id that never said hello are still shown.
    trig(s, "j", T0)
    acq(s, T0, "ghost")
    assert queries.worker(s, "ghost", T0)["registered"] is False
    assert queries.worker(s, "nobody", T0) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements=st.lists(st.one_of(st.none(), PLACEMENTS), min_size=1, max_size=3),
       labels=LABELS, pick=st.integers(0, 3), types=st.sampled_from([None, ["python"], ["shell"]]),
       runs=st.lists(st.integers(0, 2), max_size=8))
def test_ready_for_says_yes_exactly_when_an_acquire_would_grant(placements, labels, pick, types, runs):
    """The dispatcher's check (queries.ready_for), with a scan that covers every entry: yes
    when, and only when, an acquire with the same worker facts (dedicated ones too) grants
    something."""
    jobs = [(f"j{k}", jspec() if p is None else placed(**p)) for k, p in enumerate(placements)]
    s = state_with(*jobs)
    dedicated = dedicated_of(labels, pick)
    hello(s, T0, "w", labels=labels, dedicated=dedicated)
    for j in runs:
        trig(s, jobs[j % len(jobs)][0], T0)
    ready = queries.ready_for(s, None, labels, None if types is None else frozenset(types), T0 + 1, 10_000,
                              tuple(dedicated))
    granted = do(s, "acquire", T0 + 1, worker="w", queues=None, max=100, ttl=TTL, types=types)["runs"]
    assert ready == bool(granted)


# ---------------------------------------------------------------------------- why a due run waits
def test_a_due_run_says_it_waits_for_a_worker_when_no_live_worker_serves_its_queue():
    s = state_with(("any", jspec()))
    rid = trig(s, "any", T0)
    want = "a worker: no live worker serves queue 'default' and runs python jobs (GET /v1/workers lists the workers)"
    assert queries.why_queued_many(s, [rid], T0) == {rid: want}
    # run.unplaceable's rule is unchanged: a run without placement is not reported for it
    assert queries.waiting_for_many(s, [rid], T0) == {} and queries.unplaceable(s, T0) == {}
    hello(s, T0, "w-other", queues=["other"])
    hello(s, T0, "w-shell", executors=["shell"])
    hello(s, T0, "w-none", slots=0)
    assert queries.why_queued_many(s, [rid], T0) == {rid: want}
    hello(s, T0, "w1")
    assert queries.why_queued_many(s, [rid], T0) == {}
    later = T0 + limits.worker_gone_ms + 1  # every worker gone: none again
    assert queries.why_queued_many(s, [rid], later) == {rid: want}


def test_a_due_run_says_it_waits_for_a_free_slot_while_every_worker_that_may_take_it_is_busy():
    s = state_with(("any", jspec()), ("gpu", placed(pool="gpu")))
    hello(s, T0, "w1", slots=1)
    first = trig(s, "any", T0)
    assert [g["id"] for g in acq(s, T0, "w1", n=1)] == [first]
    second = trig(s, "any", T0 + 1)
    assert queries.why_queued_many(s, [second], T0 + 1) == {
        second: "a free slot: the live worker that may take it (1) holds 1 run(s) in 1 slot(s)"}
    hello(s, T0 + 1, "w2", slots=2)
    assert queries.why_queued_many(s, [second], T0 + 1) == {}
    assert len(acq(s, T0 + 1, "w2", n=1)) == 1
    third = trig(s, "any", T0 + 2)
    fourth = trig(s, "any", T0 + 2)
    assert len(acq(s, T0 + 2, "w2", n=1)) == 1
    [waits] = [r for r in (third, fourth) if s.runs[r]["state"] == "queued"]
    busy = "a free slot: every live worker that may take it (2) hold 3 run(s) in 3 slot(s)"
    assert queries.why_queued_many(s, [third, fourth], T0 + 2) == {waits: busy}
    # a placement no live worker satisfies says that first, busy or not
    gpu = trig(s, "gpu", T0 + 2)
    assert queries.why_queued_many(s, [gpu], T0 + 2) == {gpu: queries.NO_WORKER_MATCHES}
    # a slot freed: nothing to say
    res = do(s, "complete_many", T0 + 3, results=[{"run": first, "token": s.runs[first]["fencing_token"],
                                                   "success": True}], worker="w1")
    assert outcome_results(res, [first])[0]["ok"]
    left = [r for r in (third, fourth) if s.runs[r]["state"] == "queued"]
    assert queries.why_queued_many(s, left, T0 + 3) == {}


def test_a_run_not_yet_due_or_not_queued_says_nothing_of_workers():
    s = state_with(("any", jspec()))
    rid = trig(s, "any", T0)
    assert queries.why_queued_many(s, [rid], T0 - 1) == {}  # not due yet at that instant
    assert queries.why_queued_many(s, ["any@1", "nope"], T0) == {}


def test_a_due_run_says_it_waits_for_its_tenants_rate_limit_and_until_when():
    s = state_with(("t", jspec(tenant="t1")))
    assert do(s, "put_tenant", T0, name="t1", rate_milli=500, burst=1)["ok"]  # one run every 2 s
    hello(s, T0, "w1", slots=4)
    a = trig(s, "t", T0)
    b = trig(s, "t", T0)
    assert [g["id"] for g in acq(s, T0, "w1", n=4)] == [a]  # the one token taken
    assert queries.why_queued_many(s, [b], T0 + 500) == {
        b: "its tenant's rate limit: tenant 't1' starts at most 0.5 a second, burst 1; its next run may start "
           "at " + schedule.iso(T0 + 2000)}
    assert queries.why_queued_many(s, [b], T0 + 2000) == {}
    assert [g["id"] for g in acq(s, T0 + 2000, "w1", n=4)] == [b]
    c = trig(s, "t", T0 + 2000)
    assert do(s, "put_tenant", T0 + 2000, name="t1", rate_milli=0, burst=1)["ok"]
    assert queries.why_queued_many(s, [c], T0 + 10_000) == {
        c: "its tenant's rate limit: tenant 't1' may start no run (a rate of 0)"}


def test_a_due_run_says_when_the_only_workers_free_to_take_it_have_gone_quiet():
    """A walk: a worker SIGKILLed while its run ran; the lease expired and the run was queued
    again, due, saying nothing for ~18 s, as the dead worker still counted live and free until
    it was gone (30 s unseen)."""
    s = state_with(("any", jspec()))
    hello(s, T0, "w1")
    rid = trig(s, "any", T0)
    assert queries.why_queued_many(s, [rid], T0 + limits.worker_quiet_ms - 1) == {}
    quiet = T0 + limits.worker_quiet_ms
    assert queries.why_queued_many(s, [rid], quiet) == {
        rid: "a worker: the live worker(s) with a free slot that may take it (w1) were not seen for 12 s or more "
             "(a worker unseen for 30 s is gone)"}
    hello(s, quiet, "w2")  # one seen now: nothing keeps it back
    assert queries.why_queued_many(s, [rid], quiet) == {}
    assert queries.why_queued_many(s, [rid], quiet + 5_000) == {}  # (w2 seen 5 s ago)
    assert queries.why_queued_many(s, [rid], quiet + limits.worker_quiet_ms)[rid].startswith(
        "a worker: the live worker(s) with a free slot that may take it (w1, w2) were not seen for 12 s")
