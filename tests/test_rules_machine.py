"""A rule-based model of the whole state machine, for the misfire, overlap, pause and DST rules
(issue 4, section 2: "the rules are also checked on a stateful model").

Jobs of several schedule kinds (intervals, 5- and 6-field cron in DST zones, jitter, a one-shot)
and policies (misfire and overlap) are put, replaced, deleted, paused, resumed and triggered; time
advances by small steps or by outages; the leader fires (pop_due + policy.plan_fire); old fires are
re-proposed and a lagging leader fires from an old view; workers acquire, complete and lose runs;
the state is snapshotted and restored. Every command also goes to a follower replica.

The model is a dict of jobs (gen, cursor, paused, anchor) and, per job, the slots handled so far:
run slots and recorded spans. Checked: no (job, slot) is two runs; every slot of an unpaused job up
to its cursor is a run or in a record (checked exactly at each fire and resume, for the slots it
hands); each record's state and reason are allowed by the job's policies at that time; each
overlap decision is the policy applied to the job's active runs; and the active runs respect the
overlap policy (forbid: one; queue_one: one fresh waiting run; allow + max_concurrent N: N;
replace: one).
"""
from __future__ import annotations

from hypothesis import HealthCheck, event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from long_tests import examples

from raftsched.core import commands, queries, policy, schedule

from core_helpers import HOUR, MIN, SEC, T0, new_state, plan_tick, put_cmd, resume_cmd, spec_of

NAMES = ("a", "b", "c")
#: 2026-11-01T05:00:00Z: 01:00 EDT in New York, an hour before its fall-back.
NY_FALL = schedule.parse_iso_ms("2026-11-01T05:00:00Z", "t")
#: 2026-03-29T00:30:00Z: 30 min before Berlin's and London's spring-forward.
EU_SPRING = schedule.parse_iso_ms("2026-03-29T00:30:00Z", "t")
STARTS = [T0, NY_FALL, EU_SPRING]

SPECS = [
    spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=3, history=1000),
    spec_of({"every_s": 5}, "fire_once", grace_s=0, history=1000, overlap={"policy": "forbid"}),  # same schedule as 0
    spec_of({"every_s": 20}, "skip", grace_s=5, history=1000, overlap={"policy": "queue_one"}, jitter_s=10),
    spec_of({"cron": "*/20 * * * * *", "timezone": "America/New_York"}, "fire_all", grace_s=5, max_catchup=2,
            history=1000, overlap={"policy": "replace"}),
    spec_of({"cron": "0,30 1,2 * * *", "timezone": "America/New_York", "dst": {"fall_back": "twice"}}, "fire_once",
            grace_s=60, history=1000, overlap={"policy": "allow", "max_concurrent": 2}),
    spec_of({"cron": "*/2 * * * *", "timezone": "Europe/London", "dst": {"spring_forward": "skip"}}, "skip",
            grace_s=30, history=1000, overlap={"policy": "allow", "max_concurrent": 1}),
    spec_of({"cron": "15 */5 * * * *", "timezone": "Australia/Sydney"}, "fire_once", grace_s=5, history=1000,
            overlap={"policy": "queue_one"}, jitter_s=30),
    spec_of({"cron": "30 2 * * *", "timezone": "Europe/Berlin"}, "fire_all", grace_s=5, history=1000,
            overlap={"policy": "forbid"}),
]
TTL = 10 * SEC

#: (misfire policy, state) -> the reasons a record may give
MISFIRE_RECORDS = {"fire_all": ("skipped", "catchup_limit"), "fire_once": ("coalesced", "misfire"),
                   "skip": ("skipped", "misfire")}


#: every (state, reason) a record may have (which one a given job may have is checked at each fire)
ALLOWED_RECORDS = {("skipped", "misfire"), ("coalesced", "misfire"), ("skipped", "catchup_limit"),
                   ("skipped", "overlap"), ("coalesced", "overlap"), ("skipped", "paused")}


def overlap_record_state(ov: dict) -> str | None:
    """The state an overlap-blocked slot is recorded as under this policy (None: never blocked)."""
    if ov["policy"] == "allow":
        return "skipped" if "max_concurrent" in ov else None
    return {"forbid": "skipped", "queue_one": "coalesced", "replace": None}[ov["policy"]]


class RulesMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.state = new_state()
        self.follower = new_state()
        self.now = T0
        self.gen = 0
        #: name -> {"spec", "gen", "cursor", "paused", "anchor"}
        self.jobs: dict[str, dict] = {}
        #: name -> run slots (scheduled runs), recorded spans [(lo, hi)], history ids seen
        self.run_slots: dict[str, set[int]] = {}
        self.spans: dict[str, list[tuple[int, int]]] = {}
        self.seen: dict[str, set[str]] = {}
        #: name -> ids of scheduled runs created under the job's current overlap policy
        self.post_epoch: dict[str, set[str]] = {}
        self.old_fires: list[bytes] = []
        self.views: list[bytes] = []
        self.grants: list[tuple[str, int]] = []

    @initialize(start=st.sampled_from(STARTS), first=st.lists(st.integers(0, len(SPECS) - 1), min_size=2, max_size=2))
    def start_with_two_jobs(self, start, first):
        self.now = start
        for name, i in zip(NAMES, first):
            self.put_job(name, i)

    # ------------------------------------------------------------------ plumbing
    def propose(self, cmd: dict) -> dict:
        data = commands.encode(cmd)
        res = self.state.apply_bytes(data)
        assert self.follower.apply_bytes(data) == res, "the follower answered differently"
        assert res["ok"] or res["error"]["code"] != "invalid_command", res  # never an internal failure
        return res

    def _active(self, name: str) -> list[dict]:
        return [self.state.runs[r] for r in self.state.history.get(name, ())
                if self.state.runs[r]["state"] in ("queued", "running")]

    def _new_entries(self, name: str) -> list[dict]:
        out = []
        for rid in self.state.history.get(name, ()):
            if rid not in self.seen[name]:
                self.seen[name].add(rid)
                out.append(self.state.runs[rid])
        return out

    def _ledger(self, name: str, entries: list[dict]) -> None:
        """No slot becomes two runs, nor a run and recorded, nor recorded twice."""
        for e in entries:
            if e["kind"] == "scheduled":
                assert e["slot"] not in self.run_slots[name], f"{e['id']}: a slot became two runs"
                assert not any(lo <= e["slot"] <= hi for lo, hi in self.spans[name]), f"{e['id']}: run and recorded"
                self.run_slots[name].add(e["slot"])
            elif e["kind"] == "recorded":
                lo, hi = e["slot"], e.get("slot_to", e["slot"])
                assert not any(lo <= s <= hi for s in self.run_slots[name]), f"{e['id']}: recorded and a run"
                assert not any(a <= hi and lo <= b for a, b in self.spans[name]), f"{e['id']}: recorded twice"
                self.spans[name].append((lo, hi))

    def _fire(self, cmd: dict) -> dict:
        """Apply a fire; predict which entries are stale, and for the fresh ones what the overlap
        policy makes of each planned run, from the job's active runs just before."""
        predicted = {}
        stale = 0
        for e in cmd["entries"]:
            m = self.jobs.get(e["job"])
            if m is None or m["gen"] != e["gen"] or m["cursor"] != e["after"] or m["paused"]:
                stale += 1
                continue
            ov = m["spec"]["overlap"]
            active = [{"id": r["id"], "state": r["state"]} for r in self._active(e["job"])]
            runs, blocked, revoked = [], {}, []
            for slot in e["runs"]:
                rid = f"{e['job']}@{slot}"
                n, queued = len(active), any(r["state"] == "queued" for r in active)
                if ((ov["policy"] == "allow" and "max_concurrent" in ov and n >= ov["max_concurrent"])
                        or (ov["policy"] == "forbid" and n) or (ov["policy"] == "queue_one" and queued)):
                    blocked[slot] = overlap_record_state(ov)
                    continue
                if ov["policy"] == "replace":
                    revoked += [(r["id"], rid) for r in active]
                    active = []
                runs.append(slot)
                active.append({"id": rid, "state": "queued"})
            predicted[e["job"]] = (e, runs, blocked, revoked)
        res = self.propose(cmd)
        assert res["ok"], res
        assert res["stale"] == stale, (res, stale)
        assert res["fired"] == sum(len(p[1]) for p in predicted.values())
        assert res["recorded"] == sum(len(p[2]) + len(p[0]["rec"]) for p in predicted.values())
        event(f"fire: {len(predicted)} fresh, {stale} stale")
        for name, (e, runs, blocked, revoked) in predicted.items():
            m = self.jobs[name]
            spec = m["spec"]
            new = self._new_entries(name)
            self._ledger(name, new)
            assert [x["slot"] for x in new if x["kind"] == "scheduled"] == runs
            assert {x["slot"]: x["state"] for x in new if x.get("reason") == "overlap"} == blocked
            if blocked:
                event(f"overlap {spec['overlap']['policy']}: slot recorded")
            for x in new:
                if x["kind"] == "recorded" and x["reason"] != "overlap":
                    assert (x["state"], x["reason"]) == MISFIRE_RECORDS[spec["misfire"]["policy"]], x
            for old, by in revoked:
                r = self.state.runs.get(old)
                if r is not None:
                    assert r["state"] == "failed" and r["error"] == f"replaced by run {by} (overlap policy replace)"
                    event("overlap replace: a run revoked")
            # every slot the entry hands over, (after, upto], is now a run or in a record, once
            due = schedule.count_slots(spec["schedule"], e["after"], e["upto"], m["anchor"], 10**5)
            recorded = [x.get("count", 1) for x in new if x["kind"] == "recorded"]
            if due is not None and None not in recorded:
                assert len(runs) + sum(recorded) == due, f"{name}: a due slot was lost"
            self.post_epoch[name] |= {f"{name}@{s}" for s in runs}
            m["cursor"] = e["upto"]
        return res

    # ------------------------------------------------------------------ rules: jobs
    @rule(name=st.sampled_from(NAMES), i=st.integers(0, len(SPECS) - 1))
    def put_job(self, name, i):
        spec = SPECS[i]
        cmd = put_cmd(self.state, name, spec, self.now)
        res = self.propose(cmd)
        assert res["ok"], res
        self.gen += 1
        old = self.jobs.get(name)
        if old is None:
            self.jobs[name] = {"spec": spec, "gen": self.gen, "cursor": cmd["cursor"], "paused": False,
                               "anchor": cmd["anchor"]}
            self.run_slots[name], self.spans[name], self.seen[name] = set(), [], set()
            self.post_epoch[name] = set()
            return
        if old["spec"]["overlap"] != spec["overlap"]:
            self.post_epoch[name] = set()
        if old["spec"]["schedule"] == spec["schedule"]:
            old.update(spec=spec, gen=self.gen)
        else:
            old.update(spec=spec, gen=self.gen, cursor=max(cmd["cursor"], old["cursor"]), anchor=cmd["anchor"])

    @rule(name=st.sampled_from(NAMES))
    def delete_job(self, name):
        res = self.propose(commands.make("delete_job", self.now, None, name=name))
        assert res["ok"] is (name in self.jobs)
        if name in self.jobs:
            for d in (self.jobs, self.run_slots, self.spans, self.seen, self.post_epoch):
                del d[name]

    @rule(name=st.sampled_from(NAMES))
    def pause_job(self, name):
        res = self.propose(commands.make("pause_job", self.now, None, name=name))
        assert res["ok"] is (name in self.jobs)
        if name in self.jobs:
            self.jobs[name]["paused"] = True

    @rule(name=st.sampled_from(NAMES), catch_up=st.booleans())
    def resume_job(self, name, catch_up):
        if name not in self.jobs:
            return
        m = self.jobs[name]
        cmd = resume_cmd(self.state, name, self.now, catch_up=catch_up)
        res = self.propose(cmd)
        assert res["ok"], res
        new = self._new_entries(name)
        self._ledger(name, new)
        if m["paused"] and not catch_up:
            # slots due while paused: one record, skipped (paused), covering all of them
            assert [(x["state"], x["reason"]) for x in new] == [("skipped", "paused")] * len(cmd["rec"])
            due = schedule.count_slots(m["spec"]["schedule"], m["cursor"], cmd["upto"], m["anchor"], 10**5)
            assert sum(x.get("count", 1) for x in new) == due
            m["cursor"] = max(m["cursor"], cmd["upto"])
            event(f"resume: {len(new)} paused record(s)")
        else:
            assert not new
        m["paused"] = False

    @rule(name=st.sampled_from(NAMES), dt=st.sampled_from([30 * SEC, 10 * MIN]), catch_up=st.booleans())
    def pause_a_while_then_resume(self, name, dt, catch_up):
        self.pause_job(name)
        self.tick(dt)
        self.resume_job(name, catch_up)

    @rule(name=st.sampled_from(NAMES))
    def trigger_job(self, name):
        res = self.propose(commands.make("trigger_job", self.now, None, name=name))
        assert res["ok"] is (name in self.jobs)
        if name in self.jobs:
            new = self._new_entries(name)
            assert [x["kind"] for x in new] == ["manual"]

    # ------------------------------------------------------------------ rules: the leader
    @rule(dt=st.sampled_from([1, 999, 2 * SEC, 5 * SEC, 21 * SEC, 61 * SEC]))
    def tick(self, dt):
        """Time passes a little and the leader fires what is due."""
        self.now += dt
        self.fire()

    @rule(dt=st.sampled_from([1, 3 * SEC, 10 * SEC, 30 * SEC, 2 * MIN]))
    def tick_again(self, dt):
        self.now += dt
        self.fire()

    @rule(dt=st.sampled_from([61 * SEC, 10 * MIN, 2 * HOUR]))
    def outage(self, dt):
        """No leader for a while: nothing fires until the next tick, which fires the backlog."""
        self.now += dt

    @rule()
    def fire(self):
        """The leader's tick: pop due jobs, plan each with policy.plan_fire, propose one fire."""
        self.views.append(self.state.snapshot())
        del self.views[:-6]
        cmd, names = plan_tick(self.state, self.now)
        if cmd is not None:
            self.old_fires.append(commands.encode(cmd))
            del self.old_fires[:-8]
            res = self._fire(cmd)
            assert res["stale"] == 0
        for name, m in self.jobs.items():
            if not m["paused"]:
                nxt = self.state.jobs[name]["next"]
                assert nxt == schedule.next_slot_after(m["spec"]["schedule"], m["cursor"], m["anchor"])
                assert nxt is None or nxt > self.now, f"{name}: a due slot was not fired"

    @precondition(lambda self: self.old_fires)
    @rule(k=st.integers(0, 7))
    def repropose_old_fire(self, k):
        self._fire(commands.decode(self.old_fires[max(0, len(self.old_fires) - 1 - k)]))

    @precondition(lambda self: self.views)
    @rule(k=st.integers(0, 5), ahead=st.sampled_from([0, 1, 5 * SEC, 61 * SEC]))
    def lagging_leader_fires_from_old_view(self, k, ahead):
        view = new_state()
        view.restore(self.views[max(0, len(self.views) - 1 - k)])
        now = self.now + ahead
        entries = [policy.plan_fire(j["spec"], j["anchor"], j["cursor"], now, j["gen"], n)
                   for n, j in view.jobs.items() if not j["paused"] and j["next"] is not None and j["next"] <= now]
        entries = [e for e in entries if e is not None]
        if entries:
            self._fire(commands.make("fire", now, None, entries=entries))
            self.now = now

    # ------------------------------------------------------------------ rules: workers
    @rule(n=st.integers(1, 3))
    def acquire(self, n):
        res = self.propose(commands.make("acquire", self.now, None, worker="w", queues=None, max=n, ttl=TTL))
        self.grants += [(g["id"], g["token"]) for g in res["runs"]]

    def _leases(self):
        return sorted(x for x in queries.lease_snapshot(self.state) if x[0] == "run")

    @precondition(lambda self: self.grants)
    @rule(k=st.integers(0, 5), ok=st.booleans())
    def complete(self, k, ok):
        rid, tok = self.grants[k % len(self.grants)]
        run = self.state.runs.get(rid)
        live = run is not None and run["state"] == "running" and run["fencing_token"] == tok
        res = self.propose(commands.make("complete", self.now, None, run=rid, token=tok, success=ok))
        assert res["ok"] is live, (res, run)
        if not live and run is not None:
            assert res["error"]["code"] == "conflict"
            if run["state"] == "failed" and run.get("error", "").startswith("replaced by"):
                event("complete with a replaced run's token: refused")

    @rule(k=st.integers(0, 5))
    def expire_lease(self, k):
        leases = self._leases()
        if leases:
            _, rid, tok, renewals, _ = leases[k % len(leases)]
            res = self.propose(commands.make("expire", self.now, None, runs=[[rid, tok, renewals]], locks=[]))
            assert res["expired"] == [rid]

    @rule()
    def snapshot_and_restore(self):
        data = self.state.snapshot()
        self.state = new_state()
        self.state.restore(data)
        assert self.state.snapshot() == data

    # ------------------------------------------------------------------ invariants
    @invariant()
    def replicas_agree_and_jobs_match_the_model(self):
        assert self.state.state_hash() == self.follower.state_hash()
        assert set(self.state.jobs) == set(self.jobs)
        for name, m in self.jobs.items():
            job = self.state.jobs[name]
            assert (job["gen"], job["cursor"], job["paused"]) == (m["gen"], m["cursor"], m["paused"])

    @invariant()
    def every_entry_is_in_the_ledger(self):
        """Entries appear only through fires, resumes and triggers, each checked when it happens."""
        for name in self.jobs:
            assert not self._new_entries(name)

    @invariant()
    def active_runs_respect_the_overlap_policy(self):
        for name, m in self.jobs.items():
            ov = m["spec"]["overlap"]
            active = [r for r in self._active(name) if r["kind"] == "scheduled"]
            if not any(r["id"] in self.post_epoch[name] for r in active):
                continue  # only runs of earlier policies (or none) are active
            if ov["policy"] in ("forbid", "replace"):
                assert len(active) == 1, (name, ov, active)
            elif ov["policy"] == "queue_one":
                # one slot waiting to start (a failed or lost run waiting for its retry is the
                # same slot running again: it is queued too, and the policy does not apply to it)
                fresh = [r for r in active if r["state"] == "queued" and r["attempt"] == 1 and r["started_at"] is None]
                assert len(fresh) <= 1, (name, fresh)
            elif "max_concurrent" in ov:
                assert len(active) <= ov["max_concurrent"], (name, ov, active)

    @invariant()
    def records_are_allowed_by_the_policies(self):
        for name, _m in self.jobs.items():
            for rid in self.state.history.get(name, []):
                e = self.state.runs[rid]
                if e["kind"] == "recorded":
                    assert (e["state"], e["reason"]) in ALLOWED_RECORDS, e


RulesMachine.TestCase.settings = settings(
    max_examples=examples(100), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRulesMachine = RulesMachine.TestCase
