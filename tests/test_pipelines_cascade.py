"""A backfill with ``cascade: children`` (docs/pipelines.md, "Backfill"): the children of the
slots it runs follow under its pace and concurrency. A child is decided in the command that
records its parent's outcome, held by the backfill, and queued by the backfill's next steps
before any new slot of its own, within max_concurrent and the rate. No clock, no network."""
from __future__ import annotations

from raftsched.core import backfill_plan, commands

from backfill_helpers import backfill_cmd, step
from core_helpers import restored
from pipeline_helpers import SEC, T0, apply, chain_state, finish, job_raw, lease, put, tick

S1 = T0 + 10 * SEC  # the first slot of an every_s 10 job put at T0


def _pipeline(**extra):
    """a (every 10 s) -> b -> c, and a -> d: four slots of a fired and dead, so its children
    recorded them (upstream_failed, upstream_missed), and a backfill of the failed slots with
    cascade takes those records back (rearm) and runs the chains again."""
    s = chain_state(("a", job_raw(every_s=10)), ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])),
                    ("d", job_raw(after=["a"])))
    return s, _four_dead_slots(s)


def _four_dead_slots(s) -> int:
    """a's first four slots fired and dead (its children record them); returns the time after."""
    now = S1
    for i in range(4):
        now = S1 + i * 10 * SEC
        tick(s, now)
        for g in lease(s, now):
            finish(s, g, now, False)
    return now


def _active(s, bf_id):
    return [r for r in s.backfills[bf_id]["active"] if s.runs[r]["state"] in ("queued", "running")]


def test_a_cascade_never_runs_more_than_max_concurrent_and_finishes_a_slot_before_the_next():
    s, now = _pipeline()
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=1, cascade="children"))["ok"]
    order, most = [], 0
    for _ in range(200):
        now += SEC
        res = step(s, "bf", now)
        most = max(most, len(_active(s, "bf")))
        for g in lease(s, now):
            order.append((g["job"], g["slot"]))
            most = max(most, len(_active(s, "bf")))
            finish(s, g, now, True)
        if s.backfills["bf"]["state"] == "done":
            break
        assert res is None or res["ok"]
    assert s.backfills["bf"]["state"] == "done" and most == 1
    slots = [S1 + i * 10 * SEC for i in range(4)]
    # each slot's chain (a, then b and d, then c) before the next slot's a
    assert [slot for _job, slot in order] == [x for x in slots for _ in range(4)]
    for x in slots:
        part = [j for j, slot in order if slot == x]
        assert part[0] == "a" and sorted(part[1:3]) == ["b", "d"] and part[3] == "c"
    bf = s.backfills["bf"]
    assert bf["created"] == 4 and bf["cascaded"] == 12 and bf["finished"] == {"succeeded": 16}


def test_a_cascade_spends_the_rate_on_the_children_too():
    s, now = _pipeline()
    now += 60 * SEC
    # one run a second, up to 10 at once: the rate alone sets the pace
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=10, rate_milli=1000, cascade="children"))["ok"]
    made = []
    for i in range(80):
        t = now + i * 250  # four steps a second
        step(s, "bf", t)
        for g in lease(s, t):
            made.append(t)
            finish(s, g, t, True)
        if s.backfills["bf"]["state"] == "done":
            break
    assert len(made) == 16 and s.backfills["bf"]["state"] == "done"
    # never more than one run made in any second (the bucket starts with one token)
    for k in range(len(made) - 1):
        assert made[k + 1] - made[k] >= 1000 - 250, made


def test_a_held_child_is_in_the_state_and_a_new_leader_releases_it_once():
    s, now = _pipeline()
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 10 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=1, cascade="children"))["ok"]
    step(s, "bf", now)
    (g,) = lease(s, now)
    finish(s, g, now, True)
    assert sorted(s.backfills["bf"]["held"]) == [f"b@{S1}", f"d@{S1}"]
    view = backfill_plan.view(s, "bf")
    assert view["held"] == [["b", S1], ["d", S1]]
    r = restored(s)  # a new leader starts from the state: the held children are in it
    assert r.snapshot() == s.snapshot()
    cmd = backfill_plan.plan_backfill_step(r, "bf", r.backfills["bf"]["cursor"], [], True, now + 1)
    assert cmd == {"name": "bf", "after": s.backfills["bf"]["cursor"], "slots": [], "exhausted": False}
    for state in (s, r):
        res = apply(state, commands.make("backfill_step", now + 1, None, **cmd))
        assert res["children_queued"] == 1 and res["children_held"] == 1  # max_concurrent 1
        again = apply(state, commands.make("backfill_step", now + 1, None, **cmd))
        assert again["children_queued"] == 0  # repeated by a new leader: the budget is spent
    assert r.snapshot() == s.snapshot()
    assert [x for x in s.runs if x.startswith(("b@", "d@")) and s.runs[x].get("backfill") == "bf"] == [f"b@{S1}"]


def test_cancelling_a_cascade_records_what_it_held_and_what_it_withdrew():
    s, now = _pipeline()
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 20 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=2, cascade="children"))["ok"]
    step(s, "bf", now)
    (ga,) = lease(s, now, 1)  # the oldest first
    assert (ga["job"], ga["slot"]) == ("a", S1)
    finish(s, ga, now, True)  # b@S1, d@S1 held; a's second backfilled slot is still queued
    queued = [r for r in s.backfills["bf"]["active"] if s.runs[r]["state"] == "queued"]
    assert queued, s.backfills["bf"]
    res = apply(s, commands.make("backfill_control", now + 1, None, name="bf", action="cancel"))
    assert res["ok"] and res["withdrawn"] == len(queued)
    b = s.runs[f"b@{S1}"]
    assert (b["state"], b["reason"]) == ("skipped", "cancelled") and "bf" in b["error"]
    # the record reaches b's own child: c@S1 is recorded, never left waiting
    assert (s.runs[f"c@{S1}"]["state"], s.runs[f"c@{S1}"]["reason"]) == ("skipped", "upstream_missed")
    assert s.backfills["bf"]["held"] == {} and s.pipes.joins == {}


def test_the_leaders_stepper_takes_a_cascade_through_its_held_children_to_done():
    """node/backfills.py BackfillStepper over FakeRaft: the steps that only queue held children
    (the range handled already, or the parent's own overlap rule in the way) are proposed too."""
    import asyncio

    from raftsched.clock import FakeClock
    from raftsched.core import due
    from raftsched.node.backfills import BackfillStepper

    from fakes import FakeRaft

    s, now = _pipeline()
    now += 60 * SEC
    due.detach(s)
    clock = FakeClock(now)
    stepper = BackfillStepper(FakeRaft(s), clock)
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=3, overlap="forbid", cascade="children"))["ok"]

    async def main():
        for _ in range(100):
            await stepper.tick()
            for g in lease(s, clock.now_ms()):
                finish(s, g, clock.now_ms(), True)
            clock.advance(100)
            if s.backfills["bf"]["state"] == "done":
                return

    asyncio.run(main())
    bf = s.backfills["bf"]
    assert bf["state"] == "done" and bf["cascaded"] == 12 and bf["finished"] == {"succeeded": 16}


def test_a_cascade_paused_by_its_jobs_full_queue_still_queues_its_held_children_and_resumes():
    from raftsched.core import commands as c
    s = chain_state(("a", job_raw(every_s=10, queue="qa")), ("b", job_raw(after=["a"])), ("d", job_raw(after=["a"])))
    assert apply(s, c.make("put_queue", T0, None, name="qa", max_depth=2, on_full="reject"))["ok"]
    now = _four_dead_slots(s) + 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=3, cascade="children"))["ok"]
    step(s, "bf", now)
    bf = s.backfills["bf"]
    assert (bf["state"], bf["paused_by"]) == ("paused", "queue_full")  # a's queue holds two
    finish(s, lease(s, now, 1)[0], now, True)  # b@S1, d@S1 held by a paused backfill
    assert len(bf["held"]) == 2
    for _ in range(50):
        now += SEC
        step(s, "bf", now)
        for g in lease(s, now):
            finish(s, g, now, True)
        if bf["state"] == "done":
            break
    assert bf["state"] == "done" and bf["cascaded"] == 8 and bf["finished"] == {"succeeded": 12}


def _first_slot_run_again(max_concurrent: int):
    """_pipeline, then a cascading backfill of a's failed slots whose first slot ran and
    succeeded (its children b and d held): the state and the time."""
    s, now = _pipeline()
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 20 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=max_concurrent, cascade="children"))["ok"]
    step(s, "bf", now)
    finish(s, lease(s, now, 1)[0], now, True)
    return s, now


def test_a_cascade_whose_job_is_deleted_records_the_children_it_held():
    from raftsched.core import commands as c
    s, now = _first_slot_run_again(1)
    assert sorted(s.backfills["bf"]["held"]) == [f"b@{S1}", f"d@{S1}"]
    assert apply(s, c.delete_job(now, None, name="a", force=True))["ok"]
    step(s, "bf", now + SEC)
    bf = s.backfills["bf"]
    assert bf["state"] == "cancelled" and bf["held"] == {} and s.pipes.held == {}
    for rid in (f"b@{S1}", f"d@{S1}"):
        assert (s.runs[rid]["state"], s.runs[rid]["reason"]) == ("skipped", "cancelled")
    assert (s.runs[f"c@{S1}"]["state"], s.runs[f"c@{S1}"]["reason"]) == ("skipped", "upstream_missed")
    assert restored(s).snapshot() == s.snapshot()


def test_a_cascade_whose_job_is_deleted_withdraws_the_children_it_queued():
    """The delete cancels the backfill at once (as a cancel by request would): its children's
    runs it had queued already were left queued, and in its active list uncounted. They are
    withdrawn (skipped, reason cancelled) as a cancel's are."""
    from raftsched.core import commands as c
    s, now = _first_slot_run_again(3)
    step(s, "bf", now + SEC)  # the held children are queued now
    kids = [r for r in s.backfills["bf"]["active"] if s.runs[r]["job"] in ("b", "d") and s.runs[r]["state"] == "queued"]
    assert kids, s.backfills["bf"]
    assert apply(s, c.delete_job(now + 2 * SEC, None, name="a", force=True))["ok"]
    bf = s.backfills["bf"]
    assert bf["state"] == "cancelled", bf
    for rid in kids:
        assert (s.runs[rid]["state"], s.runs[rid]["reason"]) == ("skipped", "cancelled"), s.runs[rid]
    assert not [r for r in bf["active"] if r in s.runs and s.runs[r]["state"] == "queued"]
    assert restored(s).snapshot() == s.snapshot()


def test_a_held_child_whose_job_is_deleted_and_put_again_in_the_same_millisecond_is_not_run():
    """A job is its name and creation time, and a job put again within the millisecond of its
    delete has the same ones: the delete itself lets go of the children held for the old job."""
    from raftsched.core import commands as c
    from pipeline_helpers import put
    s, now = _pipeline()
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 20 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=1, cascade="children"))["ok"]
    step(s, "bf", now)
    (g,) = lease(s, now, 1)
    # d deleted and put again, then held, deleted and put again: all within one millisecond
    assert apply(s, c.delete_job(now, None, name="d"))["ok"] and put(s, "d", job_raw(after=["a"]), now)["ok"]
    finish(s, g, now, True)
    assert sorted(s.backfills["bf"]["held"]) == [f"b@{S1}", f"d@{S1}"]
    assert apply(s, c.delete_job(now, None, name="d"))["ok"]
    assert sorted(s.backfills["bf"]["held"]) == [f"b@{S1}"] and list(s.pipes.held) == [f"b@{S1}"]
    assert put(s, "d", job_raw(after=["a"]), now)["ok"]  # the same name, the same created
    r = restored(s)
    for state in (s, r):
        for i in range(3):
            step(state, "bf", now + (1 + i) * SEC)
            for g in lease(state, now + (1 + i) * SEC):
                finish(state, g, now + (1 + i) * SEC, True)
        assert f"d@{S1}" not in state.runs and state.history.get("d", []) == []
    assert r.snapshot() == s.snapshot()


def test_a_cascades_children_are_told_as_the_backfills_runs_and_leave_the_childs_health_alone():
    """docs/notifications.md: nothing is sent for a backfill's runs unless a route asks
    (`backfills: true`), and they are outside the job's health; a cascade's children are the
    backfill's runs too (docs/backfill.md). They were told to every route (kind triggered) and
    counted in the child's health."""
    from raftsched.core import events
    from raftsched.core.notify_model import validate_sink
    s, now = _pipeline()
    sink = validate_sink("ops", {"type": "webhook", "url": "http://127.0.0.1:9/hook", "secrets": {"signing_key": "k"}})
    assert apply(s, commands.put_sink(now, None, name="ops", spec=sink))["ok"]
    assert apply(s, commands.put_sink(now, None, name="all", spec=sink))["ok"]
    for name in ("b", "c", "d"):
        spec = dict(s.jobs[name]["spec"], notify=[{"sink": "ops", "on": ["run.succeeded"]},
                                                 {"sink": "all", "on": ["run.succeeded"], "backfills": True}])
        raw = {k: v for k, v in spec.items() if k not in ("tenant",)}
        assert put(s, name, raw, now)["ok"]
    before = {n: list(s.health.get(n) or []) for n in ("b", "c", "d")}
    told = len(s.outbox.events)
    now += 60 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", reprocess="failed",
                                 max_concurrent=4, cascade="children"))["ok"]
    for _ in range(200):
        now += SEC
        step(s, "bf", now)
        for g in lease(s, now):
            finish(s, g, now, True)
        if s.backfills["bf"]["state"] == "done":
            break
    assert s.backfills["bf"]["finished"] == {"succeeded": 16}
    evs = [events.view(e) for e in list(s.outbox.events)[told:] if e["kind"] == "run.succeeded"]
    kids = [e for e in evs if e["job"] in ("b", "c", "d")]
    assert len(kids) == 12 and all(e["to"] == ["all"] for e in list(s.outbox.events)[told:]
                                   if e["kind"] == "run.succeeded" and e["job"] in ("b", "c", "d")), kids
    for n in ("b", "c", "d"):
        assert [v for k, v in enumerate(s.health.get(n) or []) if k != events.SENT] == \
            [v for k, v in enumerate(before[n]) if k != events.SENT], n


# ------------------------------------------------------------------ a parent's missed range, backfilled
def _missed_range(*extra_jobs):
    """a (every 10 s, misfire skip) -> b -> c: a's slots S1..S1+30 s missed in one outage,
    recorded as one range by a, and so by b and c (upstream_missed)."""
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])), *extra_jobs)
    tick(s, T0 + 45 * SEC)
    for j in ("b", "c"):
        assert (s.runs[f"{j}@{S1}"]["slot_to"], s.runs[f"{j}@{S1}"]["count"]) == (S1 + 30 * SEC, 4)
    return s, T0 + 46 * SEC


def _drive(s, bf_id, now, steps=100):
    order = []
    for _ in range(steps):
        now += SEC
        step(s, bf_id, now)
        for g in lease(s, now):
            order.append((g["job"], g["slot"]))
            finish(s, g, now, True)
        if s.backfills[bf_id]["state"] == "done":
            break
    return order, now


def _history(s, job):
    return [(s.runs[r]["slot"], s.runs[r]["state"], s.runs[r].get("slot_to"), s.runs[r].get("count"))
            for r in s.history.get(job, ())]


def test_a_cascade_over_a_parents_missed_range_runs_the_children_of_every_slot_it_runs():
    """The use a cascade is for: a parent missed an outage's slots (one recorded range, and so
    its children), and a backfill of them with cascade runs the children's too, slot by slot.
    Before, the children's range stood: the backfill ran a alone (cascaded 0)."""
    s, now = _missed_range()
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    slots = [S1 + i * 10 * SEC for i in range(4)]
    assert order == [(j, x) for x in slots for j in ("a", "b", "c")]
    bf = s.backfills["bf"]
    assert bf["state"] == "done" and bf["cascaded"] == 8 and bf["finished"] == {"succeeded": 12}
    for j in ("b", "c"):  # every slot of the range ran: nothing of it is recorded any more
        assert _history(s, j) == [(x, "succeeded", None, None) for x in slots]
    assert restored(s).snapshot() == s.snapshot()


def test_a_cascade_over_part_of_a_missed_range_leaves_the_rest_recorded_with_its_counts():
    s, now = _missed_range()
    mid = S1 + 10 * SEC
    assert apply(s, backfill_cmd(s, "a", mid, mid + 1, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    assert order == [("a", mid), ("b", mid), ("c", mid)]
    for j in ("b", "c"):
        assert _history(s, j) == [(S1, "skipped", mid - 1, 1), (mid + 10 * SEC, "skipped", S1 + 30 * SEC, 2),
                                  (mid, "succeeded", None, None)]
    # the last slot of what is left, then its first: each part shrinks to nothing, in place
    for x in (S1 + 30 * SEC, S1):
        assert apply(s, backfill_cmd(s, "a", x, x + 1, now, bf_id=f"bf{x}", cascade="children"))["ok"]
        _, now = _drive(s, f"bf{x}", now)
    assert _history(s, "b") == [(S1 + 20 * SEC, "skipped", S1 + 29999, 1), (mid, "succeeded", None, None),
                                (S1 + 30 * SEC, "succeeded", None, None), (S1, "succeeded", None, None)]
    assert restored(s).snapshot() == s.snapshot()


def test_a_cascade_over_a_missed_range_joins_the_other_parents_reports():
    """b also waits for d, which ran every slot of a's outage: the slot cut out of b's range
    starts its join with d's outcome (read from d's history), and runs on a's. A slot d failed
    is not cut out: b cannot run it whatever a does, and it stays recorded."""
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("d", job_raw(every_s=10)), ("b", job_raw(after=["a", "d"])))
    tick(s, T0 + 45 * SEC)  # a records its range; d fires all four slots
    now = T0 + 46 * SEC
    for g in lease(s, now):
        finish(s, g, now, g["slot"] != S1 + 20 * SEC)  # d's third slot fails
    assert _history(s, "b") == [(S1, "skipped", S1 + 30 * SEC, 4)]
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    assert [x for j, x in order if j == "b"] == [S1, S1 + 10 * SEC, S1 + 30 * SEC]
    assert [h for h in _history(s, "b") if h[1] == "skipped"] == [(S1 + 20 * SEC, "skipped", S1 + 30 * SEC - 1, 1)]
    assert restored(s).snapshot() == s.snapshot()


def test_a_cut_next_to_a_slot_run_by_hand_starts_the_part_after_it():
    """b ran S1+10 by hand (id b@S1+10: the slot had no entry of its own, the range is b@S1).
    A cascade over a's whole outage cuts S1 out: the part after it would start at b@S1+10,
    taken, so it starts just after (a first version left the range whole, and b never ran S1).
    A cascade over a's whole outage: the split of S1 wants its after-part at b@S1+10, finds the
    id taken, leaves the range whole; b never runs S1 although a@S1 ran with cascade."""
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"])))
    tick(s, T0 + 45 * SEC)
    assert s.runs[f"b@{S1}"]["slot_to"] == S1 + 30 * SEC
    now = T0 + 46 * SEC
    res = apply(s, commands.trigger_job(now, None, name="b", extra={"slot": S1 + 10 * SEC}))
    assert res["ok"] and res["run"] == f"b@{S1 + 10 * SEC}", res
    for g in lease(s, now):
        finish(s, g, now, True)
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    assert restored(s).snapshot() == s.snapshot()
    assert ("b", S1) in order, "b never ran S1 although a@S1 ran with cascade"


def test_a_cut_slot_waits_for_a_heartbeat_parents_run_still_waiting_for_its_ping():
    """b after [a, h]; h a heartbeat job whose run for the slot still waits for its ping: the
    cut slot's join must wait for it (a first version, and _final_of for gated children, took
    'waiting' for final: b's slot recorded upstream_failed at once). The
    cut slot's join reads h's outcome with _final_of, which takes 'waiting' as final: b's slot
    is recorded upstream_failed at once, and stays so when h's ping succeeds."""
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("h", {"executor": {"type": "heartbeat"}, "schedule": {"every_s": 10},
                           "misfire": {"policy": "fire_all", "grace_s": 3600}}),
                    ("b", job_raw(after=["a", "h"])))
    tick(s, T0 + 45 * SEC)
    now = T0 + 46 * SEC
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 1, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now, steps=5)
    rec = s.runs.get(f"b@{S1}")
    assert not (rec is not None and rec.get("reason") == "upstream_failed"), \
        "b@S1 decided upstream_failed from h's run still waiting for its ping"


def test_a_cut_on_another_grid_than_the_ranges_keeps_every_slot_the_range_held():
    """The parts keep every slot the range held: a grid that is not the range's own (its count
    differs) only starts the part 1 ms after the cut. a every minute (cron) misses an outage (one range, and b's). a's schedule becomes every
    2 minutes; a cascade over the outage (its plan: the new schedule) cuts each even minute out
    of b's range with the after-part starting at the next *even* minute: b's odd minutes, which
    a recorded missed, are in no record of b's any more (nor run)."""
    from pipeline_helpers import put
    s = chain_state(("a", {**job_raw(misfire={"policy": "skip", "grace_s": 0}), "schedule": {"cron": "* * * * *"}}),
                    ("b", job_raw(after=["a"])))
    MIN = 60 * SEC
    tick(s, T0 + 6 * MIN)
    rng = s.runs[s.history["a"][0]]
    lo, hi = rng["slot"], rng["slot_to"]
    now = T0 + 6 * MIN + SEC
    assert put(s, "a", {**job_raw(misfire={"policy": "skip", "grace_s": 0}), "schedule": {"cron": "*/2 * * * *"}},
               now=now)["ok"]
    assert apply(s, backfill_cmd(s, "a", lo, hi + 1, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    assert restored(s).snapshot() == s.snapshot()
    covered = []
    for rid in s.history["b"]:
        r = s.runs[rid]
        covered.append((r["slot"], r.get("slot_to", r["slot"])))
    lost = [x for x in range(lo, hi + 1, MIN) if not any(a <= x <= b for a, b in covered)]
    assert not lost, f"a's missed minutes {lost} are in no record (nor run) of b's"


def test_a_cascade_of_a_parent_whose_partner_missed_the_slot_leaves_the_range_alone():
    """Nothing to decide again: the slot stays in the range, counted once. b after [a, d]: b's range came from a's outage. A cascade of d over one slot would cut the
    slot out of b's range and records it again, upstream_missed (a still missed it): b's one
    range becomes three records, and the slot is counted recorded twice."""
    from raftsched.core.records import RECORDED
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("d", job_raw(every_s=10)), ("b", job_raw(after=["a", "d"])))
    tick(s, T0 + 45 * SEC)
    now = T0 + 46 * SEC
    for g in lease(s, now):
        finish(s, g, now, True)
    before = (_history(s, "b"), s.jobs["b"]["stats"][RECORDED])
    mid = S1 + 10 * SEC
    assert apply(s, backfill_cmd(s, "d", mid, mid + 1, now, bf_id="bf", reprocess="all", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    after = (_history(s, "b"), s.jobs["b"]["stats"][RECORDED])
    assert after == before, "the slot recorded again"


def test_a_propagating_run_by_hand_of_a_middle_job_then_a_cascade_of_the_root_runs_every_slot():
    """Every slot of the outage runs in b and c. a -> b -> c, a's outage recorded as ranges in b and c. b is run by hand for S1+10 with
    propagate (id b@S1+10; c's range is cut around it). A cascade of a over the outage: the cut
    of S1 out of b's range wants its after-part at b@S1+10, taken: b and c never run S1."""
    s = chain_state(("a", job_raw(every_s=10, misfire={"policy": "skip", "grace_s": 0})),
                    ("b", job_raw(after=["a"])), ("c", job_raw(after=["b"])))
    tick(s, T0 + 45 * SEC)
    now = T0 + 46 * SEC
    assert apply(s, commands.trigger_job(now, None, name="b", extra={"slot": S1 + 10 * SEC, "propagate": True}))["ok"]
    for _ in range(3):
        for g in lease(s, now):
            finish(s, g, now, True)
    assert apply(s, backfill_cmd(s, "a", S1, S1 + 40 * SEC, now, bf_id="bf", cascade="children"))["ok"]
    order, now = _drive(s, "bf", now)
    assert ("b", S1) in order and ("c", S1) in order
