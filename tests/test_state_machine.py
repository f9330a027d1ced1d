"""A stateful test of SchedulerState against a simple model (DESIGN.md section 9).

The machine plays the cluster: proposers build commands exactly as node/service.py and the
trigger loop do (pop_due + plan_fire), every command is applied to the state and to a follower
replica, a second leader re-proposes old fires or plans from a lagging view, and the state is
snapshotted and restored now and then. The model is a dict of jobs and the slots fired/recorded.
"""
from __future__ import annotations

from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raftsched.core import backfill_plan, commands, policy, schedule

from core_helpers import HOUR, MIN, SEC, T0, new_state, plan_tick, put_cmd, resume_cmd, spec_of
from backfill_helpers import backfill_cmd, step_cmd

NAMES = ("a", "b", "c")
SPECS = [
    spec_of({"every_s": 1}, "fire_all", grace_s=2, max_catchup=5, history=4),
    spec_of({"every_s": 10}, "fire_once", grace_s=0, history=3),
    spec_of({"every_s": 45}, "skip", grace_s=5, history=50),
    spec_of({"every_s": 10}, "skip", grace_s=30, history=2),  # same schedule as SPECS[1]
    spec_of({"cron": "*/20 * * * * *"}, "fire_all", grace_s=5, max_catchup=3, history=5),
    spec_of({"cron": "0,30 * * * *", "timezone": "America/New_York"}, "fire_once", grace_s=60, history=10),
    spec_of({"at": T0 + 2 * MIN}, "fire_all", history=5),
    spec_of({"every_s": 45}, "skip", grace_s=5, history=50, labels={"raftsched.app": "reports"}),  # SPECS[2], labelled
]
STEPS = st.sampled_from([1, 999, 5 * SEC, 21 * SEC, 61 * SEC, 10 * MIN, 3 * HOUR])


def _fields(cmd: dict) -> dict:
    return {k: v for k, v in cmd.items() if k not in ("v", "op", "now", "rid")}


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.state = new_state()
        self.follower = new_state()
        self.now = T0
        self.gen = 0
        #: name -> {"spec", "gen", "cursor", "paused", "start", "anchor"}; start: where the
        #: current schedule's coverage begins (creation, or a replace with a new schedule)
        self.jobs: dict[str, dict] = {}
        self.fired: dict[str, set[int]] = {}
        self.recorded: dict[str, list[tuple[int, int, int]]] = {}
        self.manual_ids: set[str] = set()
        self.old_fires: list[bytes] = []
        self.views: list[bytes] = []
        self.last_fire_now = None
        #: backfill id -> {"job", "mode", "lo", "hi", "ran": slots with a run at creation,
        #: "made": slots it made a run for}
        self.backfills: dict[str, dict] = {}
        self.old_steps: list[bytes] = []
        #: whether a worker finished runs (then a history may hold finished entries past its
        #: bound until its next add trims them)
        self.worked = False

    # ------------------------------------------------------------------ plumbing
    def propose(self, cmd: dict) -> dict:
        data = commands.encode(cmd)
        res = self.state.apply_bytes(data)
        assert self.follower.apply_bytes(data) == res, "the follower answered differently"
        return res

    def _apply_fire(self, cmd: dict) -> dict:
        expected_stale = 0
        accepted = []
        for e in cmd["entries"]:
            m = self.jobs.get(e["job"])
            if m is None or m["gen"] != e["gen"] or m["cursor"] != e["after"] or m["paused"]:
                expected_stale += 1
            else:
                accepted.append(e)
        res = self.propose(cmd)
        assert res["ok"], res
        assert res["stale"] == expected_stale, (res, expected_stale)
        event(f"fire: {len(accepted)} accepted, {expected_stale} stale")
        event(f"fire: {'records' if any(e['rec'] for e in accepted) else 'no records'}")
        assert res["fired"] == sum(len(e["runs"]) for e in accepted)
        for e in accepted:
            name = e["job"]
            for slot in e["runs"]:
                assert slot not in self.fired[name], f"slot {slot} of {name} fired twice"
                self.fired[name].add(slot)
            for _state, _reason, lo, hi, count in e["rec"]:
                self.recorded[name].append((lo, hi, count))
            self.jobs[name]["cursor"] = e["upto"]
        return res

    # ------------------------------------------------------------------ rules
    @rule(name=st.sampled_from(NAMES), i=st.integers(0, len(SPECS) - 1), create_only=st.booleans(),
          skew=st.sampled_from([0, 0, 0, 1, 1500, 40 * SEC]))
    def put_job(self, name, i, create_only, skew):
        """skew: the proposing node's clock is behind the leader's."""
        spec = SPECS[i]
        cmd = put_cmd(self.state, name, spec, self.now - skew, create_only=create_only)
        res = self.propose(cmd)
        old = self.jobs.get(name)
        if old is not None and create_only:
            assert not res["ok"] and res["error"]["code"] == "conflict"
            return
        assert res["ok"] and res["created"] is (old is None)
        self.gen += 1
        assert res["gen"] == self.gen
        if old is None:
            self.jobs[name] = {"spec": spec, "gen": self.gen, "cursor": cmd["cursor"], "paused": False,
                               "start": cmd["cursor"], "anchor": cmd["anchor"]}
            self.fired[name], self.recorded[name] = set(), []
        elif old["spec"]["schedule"] == spec["schedule"]:
            old.update(spec=spec, gen=self.gen)
        else:
            cursor = max(cmd["cursor"], old["cursor"])
            old.update(spec=spec, gen=self.gen, cursor=cursor, start=cursor, anchor=cmd["anchor"])

    @rule(name=st.sampled_from(NAMES))
    def delete_job(self, name):
        res = self.propose(commands.make("delete_job", self.now, None, name=name))
        if name in self.jobs:
            assert res["ok"]
            del self.jobs[name]
            del self.fired[name], self.recorded[name]
        else:
            assert res["error"]["code"] == "not_found"

    @rule(name=st.sampled_from(NAMES))
    def pause_job(self, name):
        res = self.propose(commands.make("pause_job", self.now, None, name=name))
        assert res["ok"] is (name in self.jobs)
        if name in self.jobs:
            self.jobs[name]["paused"] = True

    @rule(name=st.sampled_from(NAMES), catch_up=st.booleans())
    def resume_job(self, name, catch_up):
        if name not in self.jobs:
            assert self.propose(commands.make("resume_job", self.now, None, name=name))["error"]["code"] == "not_found"
            return
        m = self.jobs[name]
        cmd = resume_cmd(self.state, name, self.now, catch_up=catch_up)
        res = self.propose(cmd)
        assert res["ok"], res
        if m["paused"] and not catch_up:
            for _s, _r, lo, hi, count in cmd["rec"]:
                assert all(not lo <= s <= hi for s in self.fired[name])
                self.recorded[name].append((lo, hi, count))
            m["cursor"] = max(m["cursor"], cmd["upto"])
        m["paused"] = False

    @rule(name=st.sampled_from(NAMES))
    def trigger_job(self, name):
        res = self.propose(commands.make("trigger_job", self.now, None, name=name))
        if name in self.jobs:
            assert res["ok"] and res["run"] not in self.manual_ids
            self.manual_ids.add(res["run"])
        else:
            assert res["error"]["code"] == "not_found"

    @rule(dt=STEPS)
    def advance_and_fire(self, dt):
        """The leader's tick: pop every due job, plan each, propose one fire."""
        self.now += dt
        self.views.append(self.state.snapshot())
        del self.views[:-8]
        cmd, names = plan_tick(self.state, self.now)
        popped = set(names)
        for name in popped:
            assert not self.jobs[name]["paused"], "pop_due returned a paused job"
        if cmd is not None:
            self.old_fires.append(commands.encode(cmd))
            del self.old_fires[:-10]
            res = self._apply_fire(cmd)
            assert res["stale"] == 0
        self.last_fire_now = self.now
        # Every unpaused job has nothing left due: none was lost from the due heap.
        for name, m in self.jobs.items():
            if not m["paused"]:
                nxt = schedule.next_slot_after(m["spec"]["schedule"], m["cursor"], m["anchor"])
                assert nxt is None or nxt > self.now, f"{name} has a due slot the leader did not fire"

    @precondition(lambda self: self.old_fires)
    @rule(k=st.integers(0, 9))
    def second_leader_reproposes_old_fire(self, k):
        data = self.old_fires[max(0, len(self.old_fires) - 1 - k)]
        cmd = commands.decode(data)
        res = self._apply_fire(cmd)
        assert res["fired"] == 0 and res["recorded"] == 0 and res["stale"] == len(cmd["entries"])

    @precondition(lambda self: self.views)
    @rule(k=st.integers(0, 7), dt=st.sampled_from([0, 1, 5 * SEC, 61 * SEC]))
    def lagging_leader_fires_from_old_view(self, k, dt):
        view = new_state()
        view.restore(self.views[max(0, len(self.views) - 1 - k)])
        now = self.now + dt  # its clock may also run ahead
        entries = []
        for name, job in view.jobs.items():
            if job["paused"] or job["next"] is None or job["next"] > now:
                continue
            plan = policy.plan_fire(job["spec"], job["anchor"], job["cursor"], now, job["gen"], name)
            if plan is not None:
                entries.append(plan)
        if entries:
            self._apply_fire(commands.make("fire", now, None, entries=entries))
            self.now = max(self.now, now)

    # ------------------------------------------------------------------ backfills
    @rule(k=st.integers(0, 2), back=st.sampled_from([0, 1, 5 * SEC, 61 * SEC, 10 * MIN]),
          span=st.sampled_from([1, 10 * SEC, 90 * SEC, 10 * MIN, 2 * HOUR]), mode=st.sampled_from(backfill_plan.MODES),
          order=st.sampled_from(backfill_plan.ORDERS), mc=st.integers(1, 3), rate=st.sampled_from([None, 1500]))
    def start_backfill(self, k, back, span, mode, order, mc, rate):
        """A backfill of a past range of a job that has a history, as BackfillService proposes
        it: a range that ends up to ``back`` before what the job has handled (or after it: those
        slots wait)."""
        names = [n for n in sorted(self.jobs) if self.state.history.get(n)]
        if not names:
            return
        name = names[k % len(names)]
        hi = min(self.now, self.state.jobs[name]["cursor"] + 1) - back
        lo = hi - span
        bf_id = f"bf{len(self.backfills)}"
        ran = {r["slot"] for r in (self.state.runs[x] for x in self.state.history.get(name, ()))
               if r["kind"] != "recorded" and r["state"] in ("queued", "running", "succeeded", "failed", "dead")}
        res = self.propose(backfill_cmd(self.state, name, lo, hi, self.now, bf_id, reprocess=mode, order=order,
                                        max_concurrent=mc, rate_milli=rate))
        assert res["ok"], res
        self.backfills[bf_id] = {"job": name, "mode": mode, "lo": lo, "hi": hi, "ran": ran, "made": set()}

    @precondition(lambda self: self.backfills)
    @rule(k=st.integers(0, 9), dt=st.sampled_from([0, 1, 700, 5 * SEC]))
    def step_backfill(self, k, dt):
        """The leader's stepper: the next step of one backfill."""
        self.now += dt
        bf_id = sorted(self.backfills)[k % len(self.backfills)]
        cmd = step_cmd(self.state, bf_id, self.now)
        if cmd is None:
            return
        self.old_steps.append(commands.encode(cmd))
        del self.old_steps[:-10]
        self._apply_step(bf_id, cmd)

    def _apply_step(self, bf_id, cmd):
        res = self.propose(cmd)
        assert res["ok"], res
        m = self.backfills[bf_id]
        for r in self.state.runs.values():
            if r.get("backfill") == bf_id and r["id"] not in m.setdefault("ids", set()):
                m["ids"].add(r["id"])
                assert r["slot"] not in m["made"], f"backfill {bf_id} made two runs for slot {r['slot']}"
                m["made"].add(r["slot"])
                assert m["lo"] <= r["slot"] < m["hi"]
                if m["mode"] == "missing":
                    assert r["slot"] not in m["ran"], f"backfill {bf_id} of missing ran a slot that had a run"
        event(f"backfill step: {'stale' if res.get('stale') else 'made runs' if res.get('created') else 'no run'}")
        if res.get("left_out"):
            event("backfill step: left slots out")

    @precondition(lambda self: self.old_steps)
    @rule(k=st.integers(0, 9))
    def replay_old_step(self, k):
        """A step proposed again (a retry, a second leader): it creates nothing twice."""
        cmd = commands.decode(self.old_steps[max(0, len(self.old_steps) - 1 - k)])
        if cmd["name"] in self.backfills:
            self._apply_step(cmd["name"], cmd)

    @precondition(lambda self: self.backfills)
    @rule(k=st.integers(0, 9), action=st.sampled_from(["pause", "resume", "cancel"]))
    def control_backfill(self, k, action):
        bf_id = sorted(self.backfills)[k % len(self.backfills)]
        res = self.propose(commands.make("backfill_control", self.now, None, name=bf_id, action=action))
        assert res["ok"] or res["error"]["code"] in ("conflict", "not_found"), res

    @rule(dt=st.sampled_from([0, 1000]), fail=st.booleans(), tenants=st.sampled_from([None, None, ["default"], ["billing"]]))
    def a_worker_finishes_the_ready_runs(self, dt, fail, tenants):
        """A worker takes up to 5 ready runs and reports them (some fail: retried or dead); now
        and then one whose token is limited to tenants (I23)."""
        self.now += dt
        self.worked = True
        cmd = commands.make("acquire", self.now, None, worker="w", queues=None, max=5, ttl=10_000)
        if tenants is not None:
            cmd["tenants"] = tenants
        res = self.propose(cmd)
        assert tenants is None or all(self.state.runs[g["id"]]["tenant"] in tenants for g in res["runs"])
        if res["runs"]:
            results = [{"run": g["id"], "token": g["token"], "success": not (fail and i % 2)}
                       for i, g in enumerate(res["runs"])]
            assert self.propose(commands.make("complete_many", self.now, None, results=results))["ok"]
    @rule(i=st.integers(0, 3), role=st.sampled_from(["admin", "operator", "reader", "worker"]),
          tenants=st.sampled_from([None, ["billing"]]), workers=st.sampled_from([None, None, ["w"]]),
          revoke=st.booleans())
    def token_create_or_revoke(self, i, role, tenants, workers, revoke):
        """API tokens (core/tokens.py) among the rest: replicas agree (the invariant below), and
        a token never touches a job."""
        tid = f"{i:016x}"
        if revoke:
            cmd = commands.make("token_revoke", self.now, None, id=tid)
        else:
            cmd = commands.make("token_create", self.now, None, id=tid, role=role, tenants=tenants, expires=None,
                                hash={"alg": "hmac-sha256", "salt": bytes([i]) * 16, "digest": bytes([i]) * 32})
            if workers is not None:
                cmd["workers"] = workers
        existed = tid in self.state.tokens
        jobs_before = {n: (j["gen"], j["cursor"]) for n, j in self.state.jobs.items()}
        res = self.propose(cmd)
        if revoke:
            assert res["ok"] == existed
            if existed:
                assert self.state.tokens[tid]["revoked"] is not None
        else:
            assert res["ok"] == (not existed and not (tenants is not None and role == "admin")
                                 and not (workers is not None and role != "worker"))
            if res["ok"]:
                assert self.state.tokens[tid]["role"] == role and self.state.tokens[tid]["created"] == self.state.now_ms
        assert {n: (j["gen"], j["cursor"]) for n, j in self.state.jobs.items()} == jobs_before

    @rule()
    def snapshot_and_restore(self):
        data = self.state.snapshot()
        self.state = new_state()
        self.state.restore(data)
        assert self.state.snapshot() == data

    # ------------------------------------------------------------------ invariants
    @invariant()
    def replicas_agree_and_model_matches(self):
        assert self.state.snapshot() == self.follower.snapshot()
        assert set(self.state.jobs) == set(self.jobs)
        assert self.state.gen == self.gen
        for name, m in self.jobs.items():
            job = self.state.jobs[name]
            assert (job["gen"], job["cursor"], job["paused"]) == (m["gen"], m["cursor"], m["paused"])

    @invariant()
    def state_cursor_not_after_state_now(self):
        for job in self.state.jobs.values():
            # An interval job created at a fractional second starts with its cursor at its
            # anchor, the creation time rounded up to a whole second (node/service.py).
            # An interval job's cursor starts at its anchor, the creation time rounded up to a
            # whole second, so it may lead state time by less than a second.
            assert job["cursor"] < self.state.now_ms + 1000, (job, self.state.now_ms)

    @invariant()
    def history_is_bounded(self):
        for name, job in self.state.jobs.items():
            hist = self.state.history.get(name, [])
            # queued, running and dead entries are never trimmed by the bound; finished ones go
            # at once from the front, and in steps behind an active or dead oldest entry
            # (tests/test_state.py and test_execution.py check the steps). This model has no
            # worker: an entry is finished when added (a record) or stays queued. So a history
            # with nothing queued is trimmed exactly at every add.
            kept = sum(1 for rid in hist if self.state.runs[rid]["state"] in ("queued", "running", "dead"))
            if kept == 0 and not self.worked:  # a worker's runs finish between adds: trimmed at the next
                assert len(hist) <= job["spec"]["history"]
            # what the state holds agrees with the model: scheduled runs are fired slots
            for rid in hist:
                run = self.state.runs[rid]
                if run["kind"] == "scheduled":
                    assert run["slot"] in self.fired[name] and rid == f"{name}@{run['slot']}"

    @invariant()
    def no_slot_fired_twice_and_every_due_slot_handled(self):
        for name, m in self.jobs.items():
            sched, anchor = m["spec"]["schedule"], m["anchor"]
            lo, hi = m["start"], m["cursor"]
            fired = sorted(s for s in self.fired[name] if lo < s <= hi)
            ranges = sorted((a, b, c) for a, b, c in self.recorded[name] if lo < a)
            # records are disjoint from each other and from runs
            assert all(p[1] < q[0] for p, q in zip(ranges, ranges[1:])), "records overlap"
            for a, b, c in ranges:
                assert b <= hi
                assert not any(a <= s <= b for s in fired), "a slot both fired and recorded"
                assert c == _count(sched, a - 1, b, anchor), "record count wrong"
            # fired slots are slots of the schedule
            for s in fired:
                assert schedule.next_slot_after(sched, s - 1, anchor) == s
            # and together they are every due slot, once
            due = _count(sched, lo, hi, anchor)
            assert len(fired) + sum(c for _, _, c in ranges) == due, f"{name}: a due slot was lost"


_COUNTS: dict = {}


def _count(sched: dict, after_ms: int, until_ms: int, anchor_ms: int) -> int:
    """count_slots, memoised: the invariants recount the same ranges after every step, and a
    seconds cron over hours costs seconds of croniter (minutes under hypothesis's tracer)."""
    key = (repr(sorted(sched.items())), after_ms, until_ms, anchor_ms)
    if key not in _COUNTS:
        _COUNTS[key] = schedule.count_slots(sched, after_ms, until_ms, anchor_ms, 10**6)
    return _COUNTS[key]


SchedulerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=35, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSchedulerMachine = SchedulerMachine.TestCase


class BackfillMachine(SchedulerMachine):
    """The same machine, starting from jobs that have a history, so that most of its runs
    exercise backfills among the other commands."""

    @initialize(specs=st.lists(st.integers(0, len(SPECS) - 1), min_size=3, max_size=3),
                dts=st.lists(STEPS, min_size=1, max_size=6), finish=st.booleans())
    def jobs_with_a_history(self, specs, dts, finish):
        for name, i in zip(NAMES, specs):
            self.put_job(name, i, False, 0)
        for dt in dts:
            self.advance_and_fire(dt)
            if finish:
                self.a_worker_finishes_the_ready_runs(0, True, None)


BackfillMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBackfillMachine = BackfillMachine.TestCase
