"""The read door of the core (raftsched/core/queries.py): plain data out of a state, in storage
units, sharing nothing the state changes afterwards.

queue_stats, gauges and dead_runs read the state's counters and indexes instead of walking every
run; here they are held to what a walk of every run says (the way the service and the metrics
computed them before), after every command of the determinism property's random sequences.
"""
from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, limits, queries, records
from raftsched.core.errors import BadRequest, NotFound
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, apply, new_state, put_cmd, restored, spec_of, tick
from test_execution_determinism import EXEC_SEQUENCES, ExecDriver


# ------------------------------------------------------------------ the walks they replace
def queue_stats_by_walk(s: SchedulerState, now: int) -> list[dict]:
    stats: dict[str, dict] = {}

    def q(name):
        if name not in stats:
            cfg = s.queues.get(name, {"max_depth": limits.queue_depth_default, "on_full": "reject"})
            stats[name] = {"name": name, "max_depth": cfg["max_depth"], "on_full": cfg["on_full"],
                           "configured": name in s.queues, "depth": 0, "ready": 0,
                           "running": 0, "dead": 0, "oldest_waiting_age_ms": None,
                           "tenants": list(s.queue_owners[name]) if name in s.queue_owners else None}
        return stats[name]
    for name in list(s.queues) + list(s.queue_owners):
        q(name)
    for run in s.runs.values():
        st_ = run["state"]
        if st_ == "queued":
            e = q(run["queue"])
            e["depth"] += 1
            due = run.get("due", run["slot"])
            if due <= now:
                e["ready"] += 1
                age = now - due
                if e["oldest_waiting_age_ms"] is None or age > e["oldest_waiting_age_ms"]:
                    e["oldest_waiting_age_ms"] = age
        elif st_ == "running":
            q(run["queue"])["running"] += 1
        elif st_ == "dead":
            q(run["queue"])["dead"] += 1
    return [stats[k] for k in sorted(stats)]


def gauges_by_walk(s: SchedulerState) -> dict:
    by_state: dict[str, int] = {}
    per_q: dict[str, tuple] = {}
    for run in s.runs.values():
        st_ = run["state"]
        by_state[st_] = by_state.get(st_, 0) + 1
        if st_ in ("queued", "running", "dead"):
            c = list(per_q.get(run["queue"], (0, 0, 0)))
            c[("queued", "running", "dead").index(st_)] += 1
            per_q[run["queue"]] = tuple(c)
    for q in s.queues:
        per_q.setdefault(q, (0, 0, 0))
    for j in s.jobs.values():  # (a queue a job names: its series from the start, at 0)
        per_q.setdefault(j["spec"]["queue"], (0, 0, 0))
    return {"jobs": len(s.jobs), "jobs_paused": sum(1 for j in s.jobs.values() if j["paused"]),
            "runs_by_state": {st_: by_state.get(st_, 0) for st_ in ("queued", "running", "dead")},
            "queues": per_q,
            "locks": len(s.locks), "fencing_token": s.fencing_token}


def dead_by_walk(s: SchedulerState, queue: str | None) -> list[dict]:
    return [r for r in s.runs.values() if r["state"] == "dead" and (queue is None or r["queue"] == queue)]


def _key(r: dict):
    return r["finished_at"], r["id"]


def check_against_walks(s: SchedulerState, now: int) -> None:
    assert queries.queue_stats(s, now) == queue_stats_by_walk(s, now)
    # The same figures from the walk GET /v1/queues takes outside the replica's lock.
    ready, _ = queries.queue_walk(queries.queue_walk_inputs(s, now))
    assert queries.queue_stats(s, now, ready) == queue_stats_by_walk(s, now)
    # The scrape's oldest ready run a queue (from the heaps' tops, or a walk outside the lock).
    assert queries.oldest_ready(s, now) == {q["name"]: q["oldest_waiting_age_ms"] for q in queue_stats_by_walk(s, now)
                                            if q["oldest_waiting_age_ms"] is not None}
    assert queries.gauges(s) == gauges_by_walk(s)
    for q in (None, "q1", "q2", "nosuch"):
        got = queries.dead_runs(s, q)
        assert sorted(got, key=_key) == sorted(dead_by_walk(s, q), key=_key)
        assert len({r["id"] for r in got}) == len(got), "a dead run listed twice"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=EXEC_SEQUENCES, restore_at=st.sets(st.integers(0, 48), max_size=6))
def test_counter_reads_say_what_a_walk_of_every_run_says(actions, restore_at):
    # A DLQ bound of 2 makes dead runs purge; restores make the indexes from the runs.
    with mock.patch.object(limits, "dlq_per_queue_max", 2):
        d = ExecDriver([new_state()])

        def snapshot_restore():
            fresh = new_state()
            fresh.restore(d.replicas[0].snapshot())
            d.replicas[0] = fresh

        for i, act in enumerate(actions):
            if i in restore_at:
                snapshot_restore()
            d.run(act, snapshot_restore)
            for now in (d.now, d.now + 5 * SEC):
                check_against_walks(d.L, now)


# ------------------------------------------------------------------ examples
EVERY5 = spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=3, queue="q1", history=10)


def _state() -> SchedulerState:
    s = new_state()
    assert apply(s, put_cmd(s, "a", EVERY5, T0))["ok"]
    assert apply(s, put_cmd(s, "b", dict(EVERY5, queue="q2"), T0))["ok"]
    tick(s, T0 + 10 * SEC)
    return s


def test_job_is_a_copy_with_its_counters_by_name():
    s = _state()
    j = queries.job(s, "a")
    assert set(j) == {"name", "spec", "gen", "created", "updated", "anchor", "cursor", "next", "paused", "stats",
                      "health", "last", "pause"}
    assert j["stats"]["runs"] == 2 and set(j["stats"]) == {"runs", "recorded", "lag_ms_last", "lag_ms_max",
                                                            "lag_ms_sum"}
    assert queries.job(s, "nosuch") is None
    tick(s, T0 + 20 * SEC)
    assert j["stats"]["runs"] == 2 and j["cursor"] == T0 + 10 * SEC, "the copy followed the state"
    assert queries.job(s, "a")["stats"]["runs"] == 4


def test_runs_are_copies_that_later_commands_do_not_change():
    s = _state()
    rid = s.history["a"][0]
    before = queries.run(s, rid)
    g = apply(s, commands.make("acquire", T0 + 11 * SEC, None, worker="w", queues=["q1"], max=1, ttl=30_000))["runs"][0]
    assert g["id"] == rid
    assert apply(s, commands.make("complete", T0 + 12 * SEC, None, run=rid, token=g["token"], success=True))["ok"]
    assert before["state"] == "queued" and "attempts" not in before
    after = queries.run(s, rid)
    assert after["state"] == "succeeded" and len(after["attempts"]) == 1
    listed = queries.runs(s, None, 10)
    assert apply(s, commands.make("trigger_job", T0 + 13 * SEC, None, name="a"))["ok"]
    records.kept_attempts(s.runs[rid]).append({"attempt": 9})  # as a later attempt would
    assert len(after["attempts"]) == 1 and all(r["id"] != "x" for r in listed)
    assert queries.run(s, "nosuch") is None


def test_runs_and_job_runs_are_newest_first_filtered_and_bounded():
    s = _state()
    names = [r["id"] for r in queries.runs(s, None, 10)]
    assert names == list(reversed(s.runs))
    assert [r["id"] for r in queries.runs(s, "queued", 1)] == names[:1]
    assert queries.runs(s, "dead", 10) == []
    out = queries.job_runs(s, "a", 10)
    assert [r["id"] for r in out["runs"]] == list(reversed(s.history["a"])) and out["history_max"] == 10
    assert queries.job_runs(s, "a", 10, slot_ms=T0 + 10 * SEC)["runs"][0]["slot"] == T0 + 10 * SEC
    assert queries.job_runs(s, "a", 10, state="running")["runs"] == []
    try:
        queries.job_runs(s, "nosuch", 10)
    except NotFound as e:
        assert e.field == "name"
    else:
        raise AssertionError("no NotFound for a job that does not exist")


def test_run_lists_page_by_cursor_and_filter_by_slot_window():
    s = _state()
    tick(s, T0 + 30 * SEC)
    every = [r["id"] for r in queries.runs(s, None, 100)]
    # Cursor pages walk every run once, newest first, and the last page says no more follow.
    seen, before = [], None
    while True:
        page = queries.runs_page(s, None, 3, None, queries.RunWindow(before=before))
        seen += [r["id"] for r in page["runs"]]
        before = page["next"]
        if before is None:
            break
        assert len(page["runs"]) == 3 and before == page["runs"][-1]["id"]
    assert seen == every
    # A window of slots [since, until): a's slots at 15 s and 20 s only.
    win = queries.RunWindow(since=T0 + 15 * SEC, until=T0 + 25 * SEC)
    got = queries.job_runs(s, "a", 10, window=win)
    assert [r["slot"] for r in got["runs"]] == [T0 + 20 * SEC, T0 + 15 * SEC] and got["next"] is None
    assert {r["slot"] for r in queries.runs_page(s, None, 100, None, win)["runs"]} == {T0 + 15 * SEC, T0 + 20 * SEC}
    first = queries.job_runs(s, "a", 1, window=win)
    assert first["next"] == first["runs"][0]["id"]
    rest = queries.job_runs(s, "a", 1, window=queries.RunWindow(T0 + 15 * SEC, T0 + 25 * SEC, first["next"]))
    assert [r["slot"] for r in rest["runs"]] == [T0 + 15 * SEC]
    # A cursor that is no run of the list is refused, naming it (never an empty page).
    for bad in ("a@1", s.history["b"][0]):
        try:
            queries.job_runs(s, "a", 10, window=queries.RunWindow(before=bad))
        except BadRequest as e:
            assert e.field == "before"
        else:
            raise AssertionError(f"cursor {bad} accepted")
    try:
        queries.runs_page(s, None, 10, None, queries.RunWindow(before="nosuch@1"))
    except BadRequest as e:
        assert e.field == "before"
    else:
        raise AssertionError("an unknown cursor accepted")


def test_job_shows_its_newest_run():
    s = new_state()
    assert apply(s, put_cmd(s, "a", EVERY5, T0))["ok"]
    assert queries.job(s, "a")["last"] is None
    tick(s, T0 + 10 * SEC)
    last = queries.job(s, "a")["last"]
    assert last == {"id": s.history["a"][-1], "slot": T0 + 10 * SEC, "state": "queued"}


def test_jobs_page_walks_the_names_in_order():
    s = _state()
    first = queries.jobs_page(s, 1, None)
    assert [j["name"] for j in first["jobs"]] == ["a"] and first["next"] == "a" and first["total"] == 2
    second = queries.jobs_page(s, 1, first["next"])
    assert [j["name"] for j in second["jobs"]] == ["b"] and second["next"] is None


def test_put_position_is_the_rule_apply_follows():
    s = _state()
    sched = EVERY5["schedule"]
    kept = queries.put_position(s, "a", sched)
    job = s.jobs["a"]
    assert kept == (job["cursor"], job["anchor"], job["next"])
    assert queries.put_position(s, "a", {"every_s": 7}) is None
    assert queries.put_position(s, "nosuch", sched) is None
    # A replace with the same schedule, whatever position the command says, keeps the job's.
    cmd = commands.make("put_job", T0 + 11 * SEC, None, name="a", spec=dict(EVERY5, priority=3), next=1,
                        cursor=1, anchor=1)
    assert apply(s, cmd)["ok"]
    job = s.jobs["a"]
    assert (job["cursor"], job["anchor"], job["next"]) == kept


def test_tenants_locks_and_leases_read_as_data():
    s = _state()
    assert apply(s, commands.make("put_tenant", T0, None, name="t", rate_milli=500, burst=2))["ok"]
    assert queries.tenants(s) == [{"rate_milli": 500, "burst": 2, "tokens_micro": 2_000_000,
                                   "last_ms": T0 + 10 * SEC, "name": "t"}]
    assert queries.lock(s, "L") is None
    res = apply(s, commands.make("lock_acquire", T0 + 11 * SEC, None, name="L", owner="o", ttl=5000))
    lk = queries.lock(s, "L")
    assert lk["token"] == res["token"] and lk["owner"] == "o" and lk["deadline"] == T0 + 16 * SEC
    assert queries.lease_snapshot(s) == [("lock", "L", res["token"], 0, 5000)]
    assert apply(s, commands.make("lock_renew", T0 + 12 * SEC, None, name="L", token=res["token"]))["ok"]
    assert lk["renewals"] == 0, "the copy followed the state"


def test_counts_are_constant_time_and_the_hash_comes_with_applied():
    s = _state()
    c = queries.counts(s)
    assert c == {"jobs": 2, "runs": len(s.runs), "now_ms": s.now_ms, "applied": s.applied}
    h = queries.counts(s, True)
    assert h["state_hash"] == s.state_hash() and h["applied"] == s.applied


def test_has_ready_work_and_queue_depth():
    s = _state()
    assert queries.queue_depth(s, "q1") == 2 and queries.queue_depth(s, "nosuch") == 0
    assert queries.has_ready_work(s, ["q1"], T0 + 10 * SEC)
    assert not queries.has_ready_work(s, ["nosuch"], T0 + 10 * SEC)
    assert not queries.has_ready_work(s, None, T0)


@settings(max_examples=200, deadline=None)
@given(names=st.sets(st.text(min_size=1, max_size=4), max_size=30), limit=st.integers(1, 8),
       after=st.one_of(st.none(), st.text(max_size=4)))
def test_a_page_of_names_is_the_slice_of_the_sorted_names_after_the_cursor(names, limit, after):
    """The page is what sorting every name and cutting after ``after`` gives (what the page did
    before it kept only the smallest ``limit + 1``), and ``more`` says whether names follow."""
    rest = sorted(n for n in names if not after or n > after)
    page, more = queries._names_page(dict.fromkeys(names), limit, after or None)
    assert page == rest[:limit] and more == (len(rest) > limit)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "delete", "restore"]),
                              st.sampled_from(["a", "b", "ab", "b0", "c", "job-1", "job-10", "job-2", "Z"])),
                    max_size=30),
       limit=st.integers(1, 4))
def test_the_job_names_index_follows_puts_deletes_and_restores(ops, limit):
    """jobs_page reads a range of the sorted names index (queues.py ``_names``) instead of
    walking every job: after any puts, replaces, deletes and restores, the index is the sorted
    names, and paging from the start gives every job once, in order."""
    s = new_state()
    for op, name in ops:
        if op == "put":
            assert apply(s, put_cmd(s, name, EVERY5, T0))["ok"]
        elif op == "delete":
            apply(s, commands.make("delete_job", T0, None, name=name))
        else:
            s = restored(s)
        assert list(s._names) == sorted(s.jobs)
    got, after = [], None
    while True:
        page = queries.jobs_page(s, limit, after)
        assert page["total"] == len(s.jobs)
        got += [j["name"] for j in page["jobs"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert got == sorted(s.jobs)


def test_the_scrapes_oldest_ready_walks_a_queue_whose_top_is_stale_outside_the_lock():
    """Runs that leave a queue but by being acquired leave their entries in the acquire heap (a
    deleted job's: here "a"'s, whose ids sort first; until 2026-12-05 every drop of a full
    drop_oldest queue too): every scrape walked such a queue whole under the replica's lock. Its
    heaps are now copied there and walked outside, with the same answer."""
    s = new_state(("a", spec_of({"every_s": 1}, queue="q")), ("j", spec_of({"every_s": 1}, queue="q")))
    now = T0
    for _ in range(8):
        now += SEC
        tick(s, now)
    assert apply(s, commands.make("delete_job", now, None, name="a"))["ok"]
    now_ms, _runs, done, walk = queries.oldest_ready_inputs(s, now)
    assert "q" not in done and [q for q, _ in walk] == ["q"]
    want = {q["name"]: q["oldest_waiting_age_ms"] for q in queries.queue_stats(s, now) if q["oldest_waiting_age_ms"] is not None}
    assert queries.oldest_ready(s, now) == want and want["q"] > 0
