"""Commands the node never sends but a replica must still judge the same way everywhere (docs/
design.md, "A malformed command"): refused whole with a clear reason, never applied half-way,
never leaving a state that cannot be dumped. And two ways a live replica and one restored from a
dump could hold different bytes. No clock, no network."""
from __future__ import annotations

import msgpack
import pytest

from raftsched.core import commands, limits
from raftsched.core.state import SchedulerState

from core_helpers import T0, apply, complete_many, new_state, put_cmd, restored, snap_obj, spec_of
from exec_helpers import acq, do, jspec, trig


def _dumps(s: SchedulerState) -> None:
    r = SchedulerState()
    r.restore(s.snapshot())
    assert r.snapshot() == s.snapshot()


def test_a_payload_of_minus_zero_is_not_taken_for_zero_by_the_shared_parts():
    """Spec parts are shared by content. A live replica's table keeps the parts of a deleted
    job, a restored one does not: with -0.0 == 0.0 as a key, the same put stored the deleted
    job's -0.0 on one replica and 0.0 on the other."""
    def spec(x):
        return spec_of({"every_s": 3600}, "skip", grace_s=0, payload={"x": x, "y": [x]})
    s = new_state()
    assert apply(s, put_cmd(s, "a", spec(-0.0), T0))["ok"]
    assert apply(s, commands.make("delete_job", T0, None, name="a"))["ok"]
    r = restored(s)
    for state in (s, r):
        assert apply(state, put_cmd(state, "b", spec(0.0), T0 + 1000))["ok"]
        assert repr(state.jobs["b"]["spec"]["payload"]) == "{'x': 0.0, 'y': [0.0]}"
    assert r.snapshot() == s.snapshot()


def test_a_worker_record_from_a_dump_before_it_counted_outcomes_takes_a_complete():
    """A dump written before the registry counted each worker's accepted outcomes has records
    without ``completed``: a complete_many naming such a worker applied its outcomes and then
    failed (an internal error, half-applied), on every try."""
    s = new_state(("a", jspec()))
    do(s, "worker_hello", T0, worker="w1", kind="remote", labels={}, slots=4,
       executors=["python", "http", "shell"], queues=None, version="1", instance="i1")
    trig(s, "a", T0)
    (g,) = acq(s, T0, "w1")
    obj = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    for _wid, rec in obj["ext"]["workers"]:
        del rec["completed"]
    r = SchedulerState()
    r.restore(msgpack.packb(obj, use_bin_type=True))
    assert list(r.workers["w1"]) == list(s.workers["w1"])  # the field in its place: the same bytes
    for state in (s, r):
        res, each = complete_many(state, commands.complete_many(
            T0 + 1000, "req-1", worker="w1", own=True, results=[{"run": g["id"], "token": g["token"], "success": True}]))
        assert res["ok"] and each[0]["ok"], res
        assert state.workers["w1"]["completed"] == 1
    assert r.snapshot() == s.snapshot()


def test_a_tenant_rate_or_burst_beyond_the_apis_bounds_is_refused():
    """A burst of 2**45 filled a bucket past 64 bits: every replica then failed to dump."""
    s = new_state(("a", jspec(tenant="t")))
    for rate, burst in ((1000, 2**45), (1000, limits.tenant_burst_max + 1), (10**12, 10), (-1, 10), (1000, 0)):
        res = do(s, "put_tenant", T0, name="t", rate_milli=rate, burst=burst)
        assert res["error"]["code"] == "invalid_command", res
        assert "t" not in s.tenants
    assert do(s, "put_tenant", T0, name="t", rate_milli=round(limits.tenant_rate_per_s_max * 1000),
              burst=limits.tenant_burst_max)["ok"]
    _dumps(s)


def test_a_command_time_past_the_last_time_a_client_may_give_is_refused():
    """A lock taken at a state time near 2**64 had a deadline past 64 bits: no dump after it."""
    s = SchedulerState()
    for now in (2**64 - 1000, limits.time_ms_max + 1):
        res = apply(s, {"v": limits.command_version, "op": "lock_acquire", "now": now, "rid": None,
                        "name": "L", "owner": "o", "ttl": 60_000})
        assert res["error"]["code"] == "invalid_command" and "now" in res["error"]["message"], res
    assert s.locks == {}
    assert do(s, "lock_acquire", limits.time_ms_max, name="L", owner="o", ttl=60_000)["ok"]
    _dumps(s)


def test_a_token_hash_naming_its_algorithm_with_a_list_is_refused_as_invalid():
    s = SchedulerState()
    h = {"alg": ["hmac-sha256"], "salt": b"s" * 16, "digest": b"d" * 32}
    res = do(s, "token_create", T0, id="0123456789abcdef", role="reader", tenants=None, expires=None, hash=h)
    assert res["error"]["code"] == "invalid_command" and "hash.alg" in res["error"]["message"], res


def test_only_the_integer_token_renews_or_releases_a_lock():
    """``True`` and ``1.0`` equal fencing token 1 in Python; a lock's token is an integer."""
    s = SchedulerState()
    tok = do(s, "lock_acquire", T0, name="L", owner="o", ttl=5000)["token"]
    assert tok == 1
    for bad in (1.0, True):
        assert do(s, "lock_renew", T0 + 1, name="L", token=bad)["error"]["code"] == "conflict"
        assert do(s, "lock_release", T0 + 1, name="L", token=bad)["error"]["code"] == "conflict"
    assert s.locks["L"]["renewals"] == 0
    assert do(s, "lock_release", T0 + 1, name="L", token=tok)["ok"] and s.locks == {}


#: What every applied command moves, refused or not: the log's count and the state's time.
_CLOCKS = ("applied", "now_ms")


def _bent(spec: dict, **parts) -> dict:
    """``spec`` with parts replaced by what model.validate_job never makes."""
    out = dict(spec)
    for k, v in parts.items():
        if k.startswith("schedule_"):
            out["schedule"] = dict(out["schedule"], **{k[len("schedule_"):]: v})
        else:
            out[k] = v
    return out


def test_a_stored_spec_apply_would_fail_on_later_is_refused_at_put():
    """A put_job whose spec passed the old shape check but not validate_job's bounds was stored;
    later commands then failed after changing the state: a failed complete with an empty
    ``retry`` (its lease closed on live replicas only), every fire holding an executor with no
    ``type`` (the entries before it applied), a replace to a history under 1 (entries deleted,
    then an IndexError). Each is refused at the put, changing nothing."""
    good = spec_of({"every_s": 10}, "fire_all", grace_s=5, max_catchup=3)
    bad = {
        "retry": _bent(good, retry={}),
        "retry_nan": _bent(good, retry=dict(good["retry"], backoff_s=float("nan"))),
        "retry_bool": _bent(good, retry=dict(good["retry"], max_attempts=True)),
        "executor": _bent(good, executor={}),
        "history": _bent(good, history=-1),
        "timeout": _bent(good, timeout_s=0),
        "every_s": _bent(good, schedule_every_s=0),
        "every_s_and_cron": _bent(good, schedule_every_s="10", schedule_cron="* * * * *"),
        "grace": _bent(good, misfire=dict(good["misfire"], grace_s=-1)),
    }
    s = new_state(("a", good))
    before = snap_obj(s, drop=_CLOCKS)
    for what, spec in bad.items():
        for name in ("a", "new"):  # a replace, and a new job
            cmd = put_cmd(s, name, good, T0 + 1000)  # (planned from the good spec: every_s 0 has no slots)
            res = apply(s, dict(cmd, spec=spec))
            assert res["error"]["code"] == "invalid_command", (what, res)
            assert snap_obj(s, drop=_CLOCKS) == before, what
    assert apply(s, put_cmd(s, "a", good, T0 + 1000))["ok"]


def test_pausing_a_paused_job_changes_nothing():
    """docs/api.md: pausing a job that is paused does nothing (its ``updated`` time too)."""
    s = new_state(("j", spec_of({"every_s": 10}, "skip")))
    assert do(s, "pause_job", T0 + 1000, name="j")["ok"] and s.jobs["j"]["updated"] == T0 + 1000
    before = snap_obj(s, drop=_CLOCKS)
    assert do(s, "pause_job", T0 + 50_000, name="j")["ok"]
    assert s.jobs["j"]["updated"] == T0 + 1000
    assert snap_obj(s, drop=_CLOCKS) == before


def test_a_resume_whose_next_slot_is_not_after_its_cursor_or_whose_record_counts_nothing_is_refused():
    """``next`` at or before ``upto`` would have the next fire look at slots already handled;
    a record of 0 slots (or fewer) would take from the job's counters."""
    s = new_state(("j", spec_of({"every_s": 10}, "skip")))
    assert do(s, "pause_job", T0 + 1000, name="j")["ok"]
    job = s.jobs["j"]
    upto = T0 + 60_000
    base = dict(name="j", catch_up=False, gen=job["gen"], after=job["cursor"], upto=upto)
    before = snap_obj(s, drop=_CLOCKS)
    for bad in (dict(next=upto), dict(next=upto - 10_000),
                dict(next=upto + 10_000, rec=[["skipped", "paused", upto - 10_000, upto, 0]]),
                dict(next=upto + 10_000, rec=[["skipped", "paused", upto - 10_000, upto, -5]])):
        res = do(s, "resume_job", upto, **base, **bad)
        assert res["error"]["code"] == "invalid_command", (bad, res)
        assert snap_obj(s, drop=_CLOCKS) == before
    res = do(s, "resume_job", upto, **base, next=upto + 10_000, rec=[["skipped", "paused", upto - 10_000, upto, 2]])
    assert res["ok"] and s.jobs["j"]["next"] == upto + 10_000


@pytest.mark.parametrize("first, second", [
    ({"x": 1}, {"x": 1.0}), ({"x": 1}, {"x": True}), ({"x": 0}, {"x": False}),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}), ({"x": [1, 2]}, {"x": [1, 2.0]}), ({"x": ""}, {"x": None}),
    ({"x": {"y": 1}}, {"x": {"y": 1.0}}),
])
def test_shared_parts_are_keyed_by_their_bytes(first, second):
    """Parts that compare equal in Python but encode differently (an int and a float or a bool,
    the same items in another order) are never one shared object: each job keeps what it was
    put with, on a live replica and on one restored after the first job is deleted."""
    def spec(p):
        return spec_of({"every_s": 3600}, "skip", grace_s=0, payload=p)
    s = new_state()
    assert apply(s, put_cmd(s, "a", spec(first), T0))["ok"]
    assert apply(s, put_cmd(s, "b", spec(second), T0))["ok"]
    assert repr(s.jobs["b"]["spec"]["payload"]) == repr(second)
    assert repr(s.jobs["a"]["spec"]["payload"]) == repr(first)
    assert apply(s, commands.make("delete_job", T0, None, name="a"))["ok"]
    r = restored(s)
    for state in (s, r):
        assert apply(state, put_cmd(state, "c", spec(second), T0 + 1000))["ok"]
        assert repr(state.jobs["c"]["spec"]["payload"]) == repr(second)
    assert r.snapshot() == s.snapshot()
    # Equal bytes share one object.
    assert apply(s, put_cmd(s, "d", spec(second), T0 + 2000))["ok"]
    assert s.jobs["d"]["spec"]["payload"] is s.jobs["b"]["spec"]["payload"]
