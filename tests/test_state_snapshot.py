"""Snapshot version 3 (columnar jobs, spec templates, histories by position) and the restore of
versions 1 and 2 (raftsched/core/snapshot.py, ``snapshot_obj`` and ``decode``).

What must hold (I1 in docs/design.md): the bytes depend only on the replicated content, never on
which objects a replica shares, the order it holds a spec's keys or its histories in, or whether
it keeps an empty history; a restore writes back the same bytes; a state restored from an older
version writes the bytes the state it was taken from writes."""
from __future__ import annotations

import copy

import msgpack
import pytest

from raftsched.core import commands
from raftsched.core import records, snapshot as snapshot_mod
from raftsched.core.state import SchedulerState

from core_helpers import (SEC, T0, apply, new_state, pack, pop_due, put_cmd, repush, restored,
    snapshot_v1_obj, snapshot_v2_obj, spec_of, tick)

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)


def restored_from(data: bytes) -> SchedulerState:
    r = new_state()
    r.restore(data)
    return r


def _unpack(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _workload() -> SchedulerState:
    """Jobs of a few templates (a fleet with executors of their own, other policies, a
    description, a paused job, a replaced one, a deleted one), some fired, some never."""
    s = new_state()
    for i in range(6):
        spec = dict(EVERY10, executor={"type": "http", "url": f"http://h/{i}"})
        assert apply(s, put_cmd(s, f"f{i}", spec, T0))["ok"]
    other = spec_of({"every_s": 20}, "skip", name="o", payload={"k": [1, {"x": 2.5}]}, priority=7,
                    description="other", overlap={"policy": "forbid"})
    assert apply(s, put_cmd(s, "o", other, T0))["ok"]
    assert apply(s, put_cmd(s, "gone", EVERY10, T0))["ok"]
    assert apply(s, put_cmd(s, "idle", spec_of({"cron": "0 0 1 1 *"}, "skip", name="idle"), T0))["ok"]
    tick(s, T0 + 25 * SEC)
    assert apply(s, commands.make("pause_job", T0 + 26 * SEC, None, name="f1"))["ok"]
    assert apply(s, commands.make("delete_job", T0 + 26 * SEC, None, name="gone"))["ok"]
    assert apply(s, put_cmd(s, "f2", dict(EVERY10, history=2), T0 + 27 * SEC))["ok"]
    assert apply(s, commands.make("trigger_job", T0 + 28 * SEC, "rid-1", name="idle"))["ok"]
    tick(s, T0 + 45 * SEC)
    return s


def _continue(s: SchedulerState) -> None:
    for n in list(s.jobs):
        repush(s, [n])
    tick(s, T0 + 75 * SEC)
    assert apply(s, put_cmd(s, "late", EVERY10, T0 + 76 * SEC))["ok"]
    tick(s, T0 + 95 * SEC)


def test_snapshot_is_version_3_with_job_columns_and_no_empty_history():
    s = _workload()
    assert list(s.pauses) == ["f1"]
    s.pauses.clear()  # (why f1 is paused: a section after version 3, "ext", which makes it version 4)
    obj = _unpack(s.snapshot())
    assert obj["v"] == snapshot_mod.SNAPSHOT_VERSION == 3
    cols = obj["jobs"]
    assert cols["name"] == list(s.jobs)
    assert set(cols) == set(records.JOB_FIELDS) | {"executor"}
    assert all(len(c if isinstance(c, list) else c["index"]) == len(s.jobs) for c in cols.values())
    assert obj["jobs_other"] == []
    # One template for the fleet (f0, f3, f4, f5; f2 has its own history bound): they differ in
    # their executors only, which are in the executor column.
    fleet = [cols["spec"][cols["name"].index(n)] for n in ("f0", "f3", "f4", "f5")]
    assert len(set(fleet)) == 1 and obj["specs"][fleet[0]]["executor"] is None
    assert cols["executor"][cols["name"].index("f3")] == {"type": "http", "url": "http://h/3"}
    assert len(obj["specs"]) < len(s.jobs)
    # Histories by job position; "late" has none yet, the never-fired cron job only its manual run.
    names = [cols["name"][p] for p in obj["history_at"]]
    assert names == [n for n in s.jobs if s.history.get(n)] and all(obj["history"])
    assert "gone" not in names


@pytest.mark.parametrize("old", [snapshot_v1_obj, snapshot_v2_obj], ids=["v1", "v2"])
def test_older_versions_restore_to_the_same_state(old):
    s = _workload()
    s.pauses.clear()  # (versions 1 and 2 hold no "ext": a job paused by their code kept no why)
    obj = old(s)
    assert obj["v"] in (1, 2) and isinstance(obj["jobs"], dict)
    assert set(obj["history"]) >= set(s.jobs), "older versions wrote a history for every job"
    r = new_state()
    r.restore(pack(obj))
    assert r.snapshot() == s.snapshot()
    assert not any(not h for h in r.history.values()), "empty histories are not kept"
    assert r.jobs["f0"]["spec"]["retry"] is r.jobs["o"]["spec"]["retry"], "restored parts are shared"
    _continue(s)
    _continue(r)
    assert r.snapshot() == s.snapshot()


def test_round_trip_is_byte_identical_and_continues_identically():
    s = _workload()
    data = s.snapshot()
    r = new_state()
    r.restore(data)
    assert r.snapshot() == data
    assert restored(r).snapshot() == data
    _continue(s)
    _continue(r)
    assert r.snapshot() == s.snapshot()


def test_restore_shares_templates_parts_and_equal_ints():
    s = _workload()
    r = restored(s)
    a, b = r.jobs["f0"], r.jobs["f3"]
    assert a["spec"] is not b["spec"] and a["spec"]["executor"] != b["spec"]["executor"]
    for k in ("schedule", "misfire", "retry", "overlap", "payload", "timeout_s", "queue"):
        assert a["spec"][k] is b["spec"][k], k
    assert a["anchor"] is b["anchor"] and a["created"] is b["created"]
    assert r.history.get("f0") and "late" not in r.history


def test_restore_shares_a_job_s_name_and_its_runs_common_values():
    """A restored run holds its job's name as the job map's own key object (a look-up of the
    run's job compares by identity), its id as the run map's key, and one object for each state,
    queue, kind and instant runs hold alike: decoding makes one a place each (docs/benchmarks.md,
    "a restored node's memory"). Equal values, the same bytes (the round trip above)."""
    s = _workload()
    r = restored(s)
    keys = {k: k for k in r.jobs}
    for name, job in r.jobs.items():
        assert job["name"] is keys[name], name
    runs = [(rid, run) for rid, run in r.runs.items() if run.get("job") in keys]
    assert len(runs) > 10
    for rid, run in runs:
        assert run["job"] is keys[run["job"]], rid
        assert run["id"] is next(k for k in r.runs if k == rid), rid
    by_value: dict = {}
    for _, run in runs:
        for k in ("state", "queue", "kind", "fired_at", "slot"):
            v = run.get(k)
            if v is not None and (type(v) is str or v > 256):
                assert by_value.setdefault((k, v), v) is v, (k, v)
    assert any(type(v) is int for (_, v) in by_value) and any(type(v) is str for (_, v) in by_value)
    assert r.snapshot() == s.snapshot()


def test_a_replaced_job_s_runs_hold_the_name_its_map_is_keyed_by():
    """A put that replaces a job keeps the name object of the first (the job map keeps its first
    key object): the runs fired after it hold that object, as those fired before."""
    s = _workload()
    key = next(k for k in s.jobs if k == "f2")
    assert s.jobs["f2"]["name"] is key
    tick(s, T0 + 75 * SEC)
    assert [rid for rid in s.history["f2"] if s.runs[rid]["job"] is not key] == []


def test_restore_refuses_bytes_past_the_snapshot_map():
    s = _workload()
    with pytest.raises(ValueError, match="past its map"):
        new_state().restore(s.snapshot() + b"\x00")


@pytest.mark.parametrize("cut", ["empty", "truncated", "a list", "runs a list"])
def test_restore_refuses_a_cut_or_shapeless_snapshot_with_a_value_error(cut):
    s = _workload()
    data = s.snapshot()
    obj = _unpack(data)
    obj["runs"] = [1, 2]
    bad = {"empty": b"", "truncated": data[:-7], "a list": pack([1, 2]), "runs a list": pack(obj)}[cut]
    r = new_state()
    with pytest.raises(ValueError):
        r.restore(bad)
    assert r.snapshot() == new_state().snapshot()


def test_restore_shares_no_value_of_another_type_than_its_key():
    """A run whose id equals its key but is not a string (True == 1), or a job whose name is
    another type than its key, keeps what it held: the bytes written back are the ones read."""
    s = _workload()
    obj = _unpack(s.snapshot())
    final = next(r for r in obj["runs"].values() if r["state"] not in ("queued", "running"))
    for key, other in ((1, True), (2.0, 2)):
        obj["runs"][key] = dict(final, id=other)
    data = pack(obj)
    assert restored_from(data).snapshot() == data


def _unshared(s: SchedulerState) -> SchedulerState:
    """The same content, no object shared between jobs (parts, ints, strings), every spec's keys
    in reverse order and the histories in reverse order."""
    u = restored(s)

    def fresh(v):
        if isinstance(v, dict):
            return {fresh(k): fresh(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fresh(x) for x in v]
        if type(v) is int:
            return int(str(v))
        if type(v) is str:
            return "".join(list(v))
        return copy.copy(v)

    jobs = {}
    for name, job in u.jobs.items():
        job = fresh(job)
        job["spec"] = dict(reversed(list(job["spec"].items())))
        jobs[name] = job
    u.jobs = jobs
    u.history = dict(reversed([(k, list(v)) for k, v in u.history.items()]))
    u.history["idle2"] = []  # an empty history (an older replica kept one) writes nothing
    return u


def test_replicas_sharing_objects_differently_write_the_same_bytes():
    s = _workload()
    u = _unshared(s)
    assert u.jobs["f0"]["spec"]["retry"] is not u.jobs["f3"]["spec"]["retry"]
    assert list(u.jobs["f0"]["spec"])[0] == "overlap"
    assert u.snapshot() == s.snapshot()
    # and a replica restored from either continues as they do
    r = restored(u)
    _continue(s)
    _continue(r)
    assert r.snapshot() == s.snapshot()


def test_a_fleet_interleaved_with_another_still_writes_its_templates_by_content():
    s = new_state()
    a = spec_of({"every_s": 10}, "skip", name="a")
    b = spec_of({"every_s": 10}, "skip", name="b", priority=9)
    for i in range(8):
        assert apply(s, put_cmd(s, f"j{i}", a if i % 2 else b, T0))["ok"]
    obj = _unpack(s.snapshot())
    assert len(obj["specs"]) == 2 and obj["jobs"]["spec"] == [0, 1] * 4
    assert _unshared(s).snapshot() == s.snapshot()


def test_templates_never_conflate_values_that_encode_differently():
    s = new_state()
    base = spec_of({"every_s": 10}, "skip", name="a")
    values = [1, True, 1.0, 0.0, -0.0, "1", None]
    for i, v in enumerate(values):
        assert apply(s, put_cmd(s, f"j{i}", dict(base, description=v), T0))["ok"]
    assert apply(s, put_cmd(s, "k", dict(base, description=1), T0))["ok"]
    obj = _unpack(s.snapshot())
    assert len(obj["specs"]) == len(values), "one template each; k shares j0's"
    r = restored(s)
    for i, v in enumerate(values):
        got = r.jobs[f"j{i}"]["spec"]["description"]
        assert type(got) is type(v) and repr(got) == repr(v)
    assert r.snapshot() == s.snapshot()


def test_a_value_of_another_type_keeps_a_template_a_job_whatever_the_replica_shares():
    """A float (any type but str, int, bool, None) outside the shared parts gives its job a
    template of its own. A replica whose jobs happen to hold one float object must not find
    that template again by the identity of the values, or it would write fewer templates."""
    def build(shared: bool) -> SchedulerState:
        s = new_state()
        base = spec_of({"every_s": 10}, "skip", name="a")
        for i in range(3):
            assert apply(s, put_cmd(s, f"j{i}", dict(base, description=1.5), T0))["ok"]
        one = float("1.5")
        for j in s.jobs.values():
            j["spec"]["description"] = one if shared else float("1.5")
        return s
    a, b = build(False), build(True)
    assert b.jobs["j0"]["spec"]["description"] is b.jobs["j1"]["spec"]["description"]
    assert len(_unpack(a.snapshot())["specs"]) == 3
    assert b.snapshot() == a.snapshot()


def test_job_records_of_another_shape_and_histories_without_a_job_round_trip():
    s = _workload()
    obj = snapshot_v2_obj(s)
    obj["jobs"]["o"]["extra"] = [1, 2]           # a field this code does not know
    del obj["jobs"]["f3"]["spec"]["executor"]     # a spec without an executor
    obj["history"]["ghost"] = ["ghost@1"]         # a history with no job
    obj["runs"]["ghost@1"] = {"id": "ghost@1", "job": "ghost", "slot": 1, "state": "succeeded"}
    r = new_state()
    r.restore(pack(obj))
    data = r.snapshot()
    v3 = _unpack(data)
    assert [(p, n) for p, n, _ in v3["jobs_other"]] == [(list(r.jobs).index("o"), "o")]
    assert "ghost" in v3["history_at"]
    r2 = new_state()
    r2.restore(data)
    assert list(r2.jobs) == list(r.jobs), "jobs keep their order"
    assert r2.jobs["o"]["extra"] == [1, 2] and "executor" not in r2.jobs["f3"]["spec"]
    assert r2.jobs["f4"]["spec"]["executor"] == {"type": "http", "url": "http://h/4"}
    assert r2.history["ghost"] == ["ghost@1"]
    assert r2.snapshot() == data


def test_restore_refuses_columns_of_different_lengths():
    s = _workload()
    obj = _unpack(s.snapshot())
    obj["jobs"]["gen"].pop()
    with pytest.raises(ValueError):
        new_state().restore(pack(obj))


def test_a_put_makes_no_history_and_a_kept_empty_one_changes_no_byte():
    s = new_state()
    assert apply(s, put_cmd(s, "a", EVERY10, T0))["ok"]
    assert "a" not in s.history
    r = restored(s)
    r.history["a"] = []
    assert r.snapshot() == s.snapshot()


def _wheels(s: SchedulerState) -> tuple:
    now, ahead = s.due.now, s.due.ahead
    return ({k: list(v) for k, v in now.at.items()}, {k: list(v) for k, v in ahead.at.items()},
            sorted(now.times), sorted(ahead.times), now.size, ahead.size)


def test_a_version_3_restore_builds_the_due_index_rebuild_due_builds():
    s = _workload()
    assert apply(s, put_cmd(s, "forbid", spec_of({"every_s": 10}, "skip", name="forbid",
                                                 overlap={"policy": "forbid"}), T0 + 46 * SEC))["ok"]
    assert s.jobs["f1"]["paused"]
    r = restored(s)
    built = _wheels(r)
    assert built[1] and built[0], "both wheels hold jobs (forbid and o do not fire ahead)"
    assert "f1" not in sum(built[1].values(), []), "a paused job is not due"
    r.due.rebuild(r.jobs)
    again = _wheels(r)
    assert built == again
    t = T0 + 200 * SEC
    assert [j["name"] for j in pop_due(restored(s), t, 100, 5000)] == [j["name"] for j in pop_due(r, t, 100, 5000)]
    off = new_state()
    off.due = None
    off.restore(s.snapshot())
    assert off.due is None


def test_int_columns_are_indexed_only_when_it_halves_them_and_keep_their_types():
    s = _workload()
    cols = _unpack(s.snapshot())["jobs"]
    assert isinstance(cols["created"], dict) and isinstance(cols["anchor"], dict)
    assert isinstance(cols["gen"], list), "distinct values: as they are"
    assert [cols["created"]["values"][i] for i in cols["created"]["index"]] == [j["created"] for j in s.jobs.values()]
    # A column holding a bool (a crafted older snapshot): equal to 1 but not the same value.
    obj = snapshot_v2_obj(s)
    jobs = list(obj["jobs"].values())
    jobs[0]["created"], jobs[1]["created"], jobs[2]["next"] = 1, True, 1.0
    r = new_state()
    r.restore(pack(obj))
    data = r.snapshot()
    assert isinstance(_unpack(data)["jobs"]["created"], list)
    r2 = new_state()
    r2.restore(data)
    assert [type(j["created"]) for j in list(r2.jobs.values())[:2]] == [int, bool]
    assert type(list(r2.jobs.values())[2]["next"]) is float
    assert r2.snapshot() == data
