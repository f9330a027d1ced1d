"""SchedulerState.put_jobs: several put_job payloads in one command (POST /v1/jobs:batch).

The command is checked whole before anything changes (a malformed item refuses it as a value,
I3); applied, it is the same as the put_job commands it holds, applied one after the other
(compared as snapshots); replicas that apply it, with restores in between, end byte-identical (I1).
"""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, limits
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, apply, new_state, pop_due, put_cmd, restored, snap_obj, spec_of, tick

EVERY10 = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)
EVERY7 = spec_of({"every_s": 7}, "skip")
CRON = spec_of({"cron": "*/5 * * * *", "timezone": "Europe/Berlin"}, "fire_once")
AT = spec_of({"at": T0 + 3600 * SEC}, "skip")
SPECS = [EVERY10, EVERY7, CRON, AT]


def item(state, name, spec, now, create_only=False) -> dict:
    """One put_jobs item: exactly the fields of the put_job command the proposer would make."""
    cmd = put_cmd(state, name, spec, now, create_only=create_only)
    return {k: cmd[k] for k in ("name", "spec", "next", "cursor", "anchor", "create_only")}


def put_jobs_cmd(items, now, rid=None) -> dict:
    return commands.make("put_jobs", now, rid, jobs=items)


def refused(s: SchedulerState, cmd, code: str) -> dict:
    """Apply a command that must be refused with ``code`` and must change nothing (its ``now``
    must not be ahead of state time: state time moves with every command, I6)."""
    before = snap_obj(s)
    res = s.apply_bytes(commands.encode(cmd))
    assert res["ok"] is False and res["error"]["code"] == code, res
    assert snap_obj(s) == before, "a refused command changed the state"
    return res


def test_put_jobs_creates_every_job_in_order_with_consecutive_generations():
    s = new_state()
    items = [item(s, n, spec, T0) for n, spec in (("b", EVERY10), ("a", CRON), ("c", AT))]
    res = apply(s, put_jobs_cmd(items, T0))
    assert res == {"ok": True, "gen": [1, 2, 3], "created": [True, True, True], "conflicts": []}
    assert [s.jobs[n]["gen"] for n in ("b", "a", "c")] == [1, 2, 3]
    assert s.jobs["b"]["next"] == T0 + 10 * SEC
    assert [j["name"] for j in pop_due(s, T0 + 10 * SEC, 10)] == ["b"]


def test_put_jobs_is_the_put_jobs_it_holds_applied_one_by_one():
    """Creates, replaces with the same and with another schedule, and one create_only conflict:
    the state after one put_jobs equals the state after the same put_job commands in order."""
    one, many = new_state(), new_state()
    for s in (one, many):
        assert apply(s, put_cmd(s, "old-same", EVERY10, T0))["ok"]
        assert apply(s, put_cmd(s, "old-other", EVERY10, T0))["ok"]
        assert apply(s, put_cmd(s, "kept", EVERY10, T0))["ok"]
        tick(s, T0 + 20 * SEC)
    now = T0 + 25 * SEC
    plan = [("new-1", CRON, False), ("old-same", spec_of({"every_s": 10}, "skip", priority=1), False),
            ("old-other", EVERY7, False), ("kept", EVERY10, True), ("new-2", AT, True)]
    items = [item(many, n, spec, now, co) for n, spec, co in plan]
    res = apply(many, put_jobs_cmd(items, now))
    singles = []
    for n, spec, co in plan:
        r = apply(one, put_cmd(one, n, spec, now, create_only=co))
        singles.append(r)
    assert snap_obj(one) == snap_obj(many)
    assert res["conflicts"] == [3] and singles[3]["error"]["code"] == "conflict"
    assert res["gen"] == [r.get("gen") for r in singles]
    assert res["created"] == [r.get("created", False) for r in singles]
    # The same schedule kept the cursor; the due jobs are the same on both.
    assert many.jobs["old-same"]["cursor"] == T0 + 20 * SEC
    assert [j["name"] for j in pop_due(one, now + 60 * SEC, 100)] == [j["name"] for j in pop_due(many, now + 60 * SEC, 100)]


def test_create_only_conflicts_are_per_job_and_the_others_apply():
    s = new_state()
    assert apply(s, put_cmd(s, "x", EVERY10, T0))["ok"]
    spec_x = s.jobs["x"]["spec"]
    items = [item(s, "a", EVERY7, T0, True), item(s, "x", EVERY7, T0, True), item(s, "b", EVERY7, T0, True)]
    res = apply(s, put_jobs_cmd(items, T0 + 1))
    assert res["ok"] and res["conflicts"] == [1]
    assert res["gen"] == [2, None, 3] and res["created"] == [True, False, True]
    assert s.jobs["x"]["spec"] is spec_x and s.jobs["x"]["gen"] == 1, "the conflicting job is untouched"
    assert set(s.jobs) == {"x", "a", "b"}


def _mutations():
    """Ways to break one item (those put_job refuses) or the list itself."""
    item_mutations = [
        lambda c: c.pop("name"),
        lambda c: c.update(name=""),
        lambda c: c.update(name=5),
        lambda c: c.update(spec="spec"),
        lambda c: c.update(spec={**c["spec"], "schedule": {}}),
        lambda c: c.update(spec={**c["spec"], "misfire": {"policy": "sometimes", "grace_s": 5, "max_catchup": 1}}),
        lambda c: c.update(spec={**c["spec"], "history": None}),
        lambda c: c.update(next="soon"),
        lambda c: c.pop("cursor"),
        lambda c: c.update(anchor=1.5),
    ]
    return item_mutations


@pytest.mark.parametrize("mutate", _mutations())
@pytest.mark.parametrize("where", [0, 2, 4])
def test_one_malformed_item_refuses_the_whole_command_and_changes_nothing(mutate, where):
    s = new_state()
    assert apply(s, put_cmd(s, "x", EVERY10, T0))["ok"]
    items = [item(s, f"j{i}", SPECS[i % 4], T0) for i in range(5)]
    mutate(items[where])
    res = refused(s, put_jobs_cmd(items, T0), "invalid_command")
    assert f"put_jobs.jobs[{where}]" in res["error"]["message"]
    assert set(s.jobs) == {"x"} and s.gen == 1


@pytest.mark.parametrize("jobs", [None, "jobs", {}, [], [5], ["x"]])
def test_malformed_lists_are_refused(jobs):
    s = new_state()
    assert apply(s, put_cmd(s, "x", EVERY10, T0))["ok"]
    cmd = commands.make("put_jobs", T0, None)
    if jobs is not None:
        cmd["jobs"] = jobs
    refused(s, cmd, "invalid_command")


def test_more_items_than_the_bound_are_refused(monkeypatch):
    monkeypatch.setattr(limits, "put_jobs_items_max", 3)
    s = new_state()
    assert apply(s, put_cmd(s, "x", EVERY10, T0))["ok"]
    items = [item(s, f"j{i}", AT, T0) for i in range(4)]
    refused(s, put_jobs_cmd(items, T0), "invalid_command")
    assert apply(s, put_jobs_cmd(items[:3], T0))["ok"]


def test_jobs_limit_is_checked_for_the_whole_command_first(monkeypatch):
    monkeypatch.setattr(limits, "jobs_max", 3)
    s = new_state()
    assert apply(s, put_cmd(s, "x", EVERY10, T0))["ok"]
    # Two new jobs and a replace fit; three new ones do not, and then none is created.
    too_many = [item(s, n, AT, T0) for n in ("x", "a", "b", "c")]
    res = refused(s, put_jobs_cmd(too_many, T0), "limit_exceeded")
    assert res["error"]["field"] == "jobs"
    fits = [item(s, n, AT, T0) for n in ("x", "a", "b", "a")]  # a twice: one new job
    assert apply(s, put_jobs_cmd(fits, T0 + 1))["created"] == [False, True, True, False]
    assert len(s.jobs) == 3


def test_a_retried_request_id_returns_the_first_result_and_applies_once():
    s = new_state()
    items = [item(s, n, EVERY10, T0) for n in ("a", "b")]
    first = apply(s, put_jobs_cmd(items, T0, rid="jb-1"))
    snap = snap_obj(s)
    again = apply(s, put_jobs_cmd(items, T0 + 5, rid="jb-1"))
    assert again == dict(first, duplicate=True)
    assert snap_obj(s) == snap


def test_a_full_size_command_fits_and_round_trips():
    """What the API packs: as many items as fit in command_bytes_max."""
    s = new_state()
    items, size = [], 0
    while True:
        it = item(s, f"job-{len(items):05d}", CRON, T0)
        n = len(msgpack.packb(it, use_bin_type=True))
        if size + n > limits.command_bytes_max - 256:
            break
        items.append(it)
        size += n
    data = commands.encode(put_jobs_cmd(items, T0, rid="r" * 64))
    assert len(data) <= limits.command_bytes_max and len(items) <= limits.put_jobs_items_max
    res = s.apply_bytes(data)
    assert res["ok"] and len(res["gen"]) == len(items) == len(s.jobs)


# --------------------------------------------------------------------------- replicas (I1)
NAMES = st.sampled_from([f"j{i}" for i in range(8)])
ITEM = st.tuples(NAMES, st.integers(0, len(SPECS) - 1), st.booleans())
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("put_jobs"), st.lists(ITEM, min_size=1, max_size=6), st.integers(0, 30)),
    st.tuples(st.just("put_job"), ITEM, st.integers(0, 30)),
    st.tuples(st.just("delete"), NAMES, st.integers(0, 30)),
    st.tuples(st.just("tick"), st.none(), st.integers(0, 30)),
    st.tuples(st.just("garbage"), st.integers(0, 4), st.integers(0, 30)),
), min_size=1, max_size=25)


def _command(s: SchedulerState, action, now):
    kind, arg, _ = action
    if kind == "put_jobs":
        items = [item(s, n, SPECS[k], now, co) for n, k, co in arg]
        return put_jobs_cmd(items, now)
    if kind == "put_job":
        n, k, co = arg
        return put_cmd(s, n, SPECS[k], now, create_only=co)
    if kind == "delete":
        return commands.make("delete_job", now, None, name=arg)
    if kind == "garbage":
        items = [item(s, "g", AT, now)]
        broken = [lambda i: i.update(cursor=None), lambda i: i.update(spec=[]), lambda i: i.pop("name"),
                  lambda i: i.update(next=1.5), lambda i: None][arg]
        broken(items[0])
        return put_jobs_cmd(items if arg != 4 else "nope", now)
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, restore_at=st.sets(st.integers(0, 25), max_size=3))
def test_replicas_applying_the_same_commands_end_byte_identical(actions, restore_at):
    """The proposer (replica a) plans every command from its own view; replica b applies the
    same bytes, and is rebuilt from its own snapshot now and then."""
    a, b = new_state(), new_state()
    now = T0
    for k, action in enumerate(actions):
        now += action[2] * SEC
        if action[0] == "tick":
            cmd, _ = tick(a, now)
            if cmd is not None:
                b.apply_bytes(commands.encode(cmd))
        else:
            data = commands.encode(_command(a, action, now))
            ra, rb = a.apply_bytes(data), b.apply_bytes(data)
            assert ra == rb
        if k in restore_at:
            b = restored(b)
        assert a.snapshot() == b.snapshot()
    assert a.snapshot() == restored(a).snapshot()
