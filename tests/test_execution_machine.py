"""A stateful test of leases, fencing tokens and retries against a simple model.

The machine drives a SchedulerState the way the cluster does: the leader fires due slots
(pop_due + policy.plan_fire), workers acquire, heartbeat and complete (with their token, or a
stale one; heartbeats and lock renewals may carry a clock behind state time), owners acquire,
renew and release locks, the reaper expires leases named ``[id, token, renewals]`` as
``lease_snapshot`` shows them (or as they were before a renewal, or by an older token), a new
leader takes over with a clock far ahead, runs are requeued from the DLQ, and the state is
snapshotted and restored. Workers register (with labels, from one process instance or
another), are drained and give leases back (release); one job is placed on pool=gpu, so the
model grants its runs only to a worker registered with that label (I18), a worker dedicated to
its label pool is granted only that job's runs, and a released run is
queued again with attempt + 1 and no budget spent (I19).

The model is a dict per run: where it is (queued, running, finished, dead, recorded), its
attempt, failures and lost leases, its due time, and its lease (worker, token, renewals,
deadline, ttl). A lease's renewal count is 0 at its grant and grows by one with every accepted
heartbeat naming it, every lock_renew, and every takeover; deadlines are informational
(``max(deadline, now + ttl)`` on a renewal) and the reaper's selection here uses them, but apply
compares no clock: an expire naming a lease's current token and renewals applies whatever its
deadline. The model predicts exactly which runs an acquire hands out and in which order, which
leases a heartbeat reports lost, every live lease and lock, and what each completion and expiry
does.
"""
from __future__ import annotations

import copy

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftsched.core import commands, queries, limits
from raftsched.core.policy import backoff_ms

from core_helpers import HOUR, MIN, T0, apply, new_state, plan_tick, put_cmd, queued_count, restored, spec_of

SPECS = {
    "a": spec_of({"every_s": 5}, "fire_all", grace_s=3, max_catchup=2, queue="q1", priority=5, history=1000,
                 retry={"max_attempts": 2, "backoff_s": 1, "backoff_max_s": 4, "jitter": 0.5}),
    "b": spec_of({"every_s": 7}, "fire_once", grace_s=0, queue="q2", priority=1, history=1000),
    "c": spec_of({"every_s": 11}, "skip", grace_s=5, queue="q1", priority=9, history=1000,
                 retry={"max_attempts": 2, "backoff_s": 0, "backoff_max_s": 0, "jitter": 0}),
    # The worker fleet: runs only on a worker registered with pool=gpu (I18).
    "d": spec_of({"every_s": 13}, "skip", grace_s=5, queue="q1", priority=3, history=1000,
                 placement={"labels": {"pool": "gpu"}}),
}
PLACEMENT = {"d": {"pool": "gpu"}}
FLEET_LABELS = st.sampled_from([{}, {"pool": "gpu"}, {"pool": "cpu"}, {"pool": "gpu", "zone": "a"}])
WORKERS = ("w1", "w2", "w3")
QUEUES = ("q1", "q2")
TTLS = st.sampled_from([1000, 4000, 15_000])
DTS = st.sampled_from([0, 1, 999, 1000, 3000, 7000, 16_000, 45_000])
#: how far a worker's or lock owner's clock is behind state time (a faster node set it)
LAGS = st.sampled_from([0, 0, 2000, HOUR])
TERMINAL = {"succeeded": "finished", "dead": "dead", "skipped": "recorded", "coalesced": "recorded"}


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = new_state()
        self.now = T0       # the leader's clock (and the clock of every command but a lagging one)
        self.state_time = 0  # the highest now of any command applied: what apply computes from
        for name, spec in SPECS.items():
            assert self.apply(put_cmd(self.s, name, spec, self.now))["ok"]
        assert self.cmd("put_queue", name="q2", max_depth=3, on_full="reject")["ok"]
        self.m: dict[str, dict] = {}          # run id -> model
        self.locks: dict[str, dict] = {}      # lock name -> model
        self.tokens: list[int] = []           # every token granted, in order
        self.old_tokens: dict[str, list[int]] = {}  # run id -> tokens of its earlier leases
        self.old_lock_tokens: dict[str, list[int]] = {}  # lock name -> tokens of its earlier holders
        #: [id, token, renewals] (+ "lock") that no longer name a live lease as it is
        self.old_leases: list[list] = []
        #: the worker registry: worker -> {"labels", "state", "instance"} (unregistered: no labels)
        self.reg: dict[str, dict] = {}

    # ---------------------------------------------------------------- plumbing
    def apply(self, cmd) -> dict:
        self.state_time = max(self.state_time, cmd["now"])
        return apply(self.s, cmd)

    def cmd(self, op, **fields) -> dict:
        return self.apply(commands.make(op, self.now, None, **fields))

    def register_new_runs(self) -> int:
        n = 0
        for rid, run in self.s.runs.items():
            if rid in self.m:
                continue
            n += 1
            if run["state"] == "queued":
                self.m[rid] = {"place": "queued", "queue": run["queue"], "job": run["job"],
                               "priority": SPECS[run["job"]]["priority"], "due": run["slot"], "attempt": 1,
                               "failures": 0, "lost": 0, "lease": None}
            else:
                assert run["state"] in ("skipped", "coalesced"), run
                self.m[rid] = {"place": "recorded", "queue": run.get("queue"), "job": run["job"], "lease": None}
        return n

    def grant_token(self, tok: int) -> None:
        assert not self.tokens or tok > self.tokens[-1], f"token {tok} after {self.tokens[-1]}: not increasing"
        self.tokens.append(tok)

    def live(self, worker=None):
        return sorted(rid for rid, m in self.m.items()
                      if m["place"] == "running" and (worker is None or m["lease"]["worker"] == worker))

    def end_lease(self, rid: str) -> None:
        lease = self.m[rid]["lease"]
        self.old_tokens.setdefault(rid, []).append(lease["token"])
        self.old_leases.append([rid, lease["token"], lease["renewals"]])
        self.m[rid]["lease"] = None

    def end_lock(self, name: str) -> None:
        lk = self.locks.pop(name)
        self.old_lock_tokens.setdefault(name, []).append(lk["token"])
        self.old_leases.append([name, lk["token"], lk["renewals"], "lock"])

    def renew(self, kind: str, ident: str, lease: dict, ttl: int, sets: bool = False) -> None:
        """An accepted renewal (heartbeat, lock_renew, takeover): one more renewal, whether or not
        the deadline moves (it is computed from state time, never from a lagging command's now);
        what the reaper read before is stale."""
        self.old_leases.append([ident, lease["token"], lease["renewals"]] + ([] if kind == "run" else ["lock"]))
        lease["renewals"] += 1
        # A lock's renew sets its deadline (a shorter TTL brings it in: the reaper expires it a
        # TTL after this renewal); a heartbeat or a takeover never shortens a lease's.
        if sets:
            lease["deadline"] = self.state_time + ttl
        else:
            lease["deadline"] = max(lease["deadline"], self.state_time + ttl)
        lease["ttl"] = ttl

    def fail(self, rid: str, lost: bool = False) -> None:
        """Model of a failed attempt: a failure (complete failed) spends the job's max_attempts
        and backs off; a lost lease (expired) is retried at once, up to lease_losses_max times."""
        m = self.m[rid]
        self.end_lease(rid)
        max_attempts = SPECS[m["job"]]["retry"]["max_attempts"]
        if lost:
            m["lost"] += 1
            retry, delay = m["lost"] <= limits.lease_losses_max, 0
        else:
            m["failures"] += 1
            retry = m["failures"] < max_attempts
            delay = backoff_ms(SPECS[m["job"]]["retry"], rid, m["failures"]) if retry else 0
        if retry:
            m["due"] = self.now + delay
            m["attempt"] += 1
            m["place"] = "queued"
        else:
            m["place"] = "dead"

    def overdue(self):
        """Leases and locks past their deadline in state time, named as the reaper names them:
        ``[id, token, renewals]``."""
        runs = sorted([rid, m["lease"]["token"], m["lease"]["renewals"]] for rid, m in self.m.items()
                      if m["place"] == "running" and m["lease"]["deadline"] < self.now)
        locks = sorted([n, lk["token"], lk["renewals"]] for n, lk in self.locks.items() if lk["deadline"] < self.now)
        return runs, locks

    # ---------------------------------------------------------------- the leader
    @rule(dt=DTS)
    def fire(self, dt):
        self.now += dt
        cmd, names = plan_tick(self.s, self.now)
        if cmd is None:
            return
        res = self.apply(cmd)
        assert res["ok"] and res["stale"] == 0, res
        assert self.register_new_runs() == res["fired"] + res["recorded"]

    @rule(job=st.sampled_from(sorted(SPECS)))
    def trigger(self, job):
        assert self.cmd("trigger_job", name=job)["ok"]
        assert self.register_new_runs() == 1

    @rule(dt=DTS)
    def advance(self, dt):
        self.now += dt
        assert self.cmd("noop")["ok"]

    @rule(jump=st.sampled_from([0, 5000, 10 * MIN, HOUR]))
    def takeover(self, jump):
        """A new leader, its clock possibly far ahead: every live lease gets a full TTL."""
        self.now += jump
        res = self.cmd("takeover", node="n2")
        assert res["ok"] and res["extended"] == len(self.live()) + len(self.locks)
        for rid in self.live():
            lease = self.m[rid]["lease"]
            self.renew("run", rid, lease, lease["ttl"])
        for n, lk in self.locks.items():
            self.renew("lock", n, lk, lk["ttl"])
        assert self.overdue() == ([], []), "a lease is overdue right after a takeover"

    @rule()
    def expire(self):
        """The reaper: everything overdue by the leader's clock, in one expire."""
        runs, locks = self.overdue()
        if not runs and not locks:
            return
        res = self.cmd("expire", runs=runs, locks=locks)
        assert res["ok"] and res["ignored"] == 0
        assert sorted(res["expired"]) == [r[0] for r in runs] and sorted(res["released"]) == [n[0] for n in locks]
        for rid, _, _ in runs:
            self.fail(rid, lost=True)
        for n, _, _ in locks:
            self.end_lock(n)

    @rule(pick=st.integers(0, 99), dt=st.sampled_from([0, 1, 45_000]))
    def expire_a_live_lease_as_it_is(self, pick, dt):
        """The leader's reaper saw this lease unrenewed for its TTL by its own monotonic clock:
        apply takes the reaper's word for it, whatever the deadline in state time (it compares no
        clock), provided the item names the lease's current token and renewal count."""
        self.now += dt
        items = [("run", rid, self.m[rid]["lease"]) for rid in self.live()]
        items += [("lock", n, lk) for n, lk in sorted(self.locks.items())]
        if not items:
            return
        kind, ident, lease = items[pick % len(items)]
        item = [ident, lease["token"], lease["renewals"]]
        res = self.cmd("expire", runs=[item] if kind == "run" else [], locks=[item] if kind == "lock" else [])
        assert res == {"ok": True, "expired": [ident] if kind == "run" else [],
                       "released": [ident] if kind == "lock" else [], "ignored": 0}, (item, res)
        if kind == "run":
            self.fail(ident, lost=True)
        else:
            self.end_lock(ident)

    @precondition(lambda self: self.old_leases)
    @rule(pick=st.integers(0, 999), mix=st.booleans())
    def expire_a_stale_lease(self, pick, mix):
        """A late or repeated expire, or one read before a renewal: it names a lease that is no
        longer there as it was (an older renewal count, or an older token), and changes nothing.
        With ``mix``, an older token of a lease that is live again, with its current renewal
        count (a re-granted run starts again from 0 renewals: the token tells them apart)."""
        item = list(self.old_leases[pick % len(self.old_leases)])
        kind = "run" if len(item) == 3 else "lock"
        if mix:
            current = (self.m[item[0]]["lease"] if kind == "run" else self.locks.get(item[0]))
            if current is not None and current["token"] != item[1]:
                assert current["token"] > item[1]
                item[2] = current["renewals"]
        runs, locks = ([item[:3]], []) if kind == "run" else ([], [item[:3]])
        before = copy.deepcopy((self.s.runs, self.s.locks))
        res = self.cmd("expire", runs=runs, locks=locks)
        assert res == {"ok": True, "expired": [], "released": [], "ignored": 1}, (item, res)
        assert (self.s.runs, self.s.locks) == before

    @rule(dt=st.sampled_from([1, 1000, 20_000]))
    def reaper_races_a_heartbeat(self, dt):
        """The reaper reads overdue leases; their workers' heartbeats commit before its expire."""
        self.now += dt
        runs, _ = self.overdue()
        if not runs:
            return
        for rid, tok, _ in runs:
            lease = self.m[rid]["lease"]
            res = self.cmd("heartbeat", worker=lease["worker"], leases=[[rid, tok]], ttl=4000)
            assert res["extended"] == 1
            self.renew("run", rid, lease, 4000)
        res = self.cmd("expire", runs=runs, locks=[])
        assert res["ok"] and res["expired"] == [] and res["ignored"] == len(runs)

    # ---------------------------------------------------------------- workers
    @rule(worker=st.sampled_from(WORKERS), queues=st.sampled_from([None, ["q1"], ["q2"], ["q2", "q1"], ["zz"]]),
          n=st.integers(1, 3), ttl=TTLS)
    def acquire(self, worker, queues, n, ttl):
        served = QUEUES if queues is None else queues
        w = self.reg.get(worker)
        labels = w["labels"] if w else {}

        dedicated = w["dedicated"] if w else []

        def placeable(m):  # I18: every label of the job's placement is one of the worker's, and the
            # placement names every label the worker is dedicated to
            want = PLACEMENT.get(m["job"], {})
            return all(labels.get(k) == v for k, v in want.items()) and all(k in want for k in dedicated)
        ready = sorted((-m["priority"], m["due"], rid) for rid, m in self.m.items()
                       if m["place"] == "queued" and m["queue"] in served and m["due"] <= self.now and placeable(m))
        want = [] if w is not None and w["state"] == "draining" else [rid for _, _, rid in ready[:n]]
        res = self.cmd("acquire", worker=worker, queues=queues, max=n, ttl=ttl)
        assert res["ok"]
        assert res.get("draining", False) == (w is not None and w["state"] == "draining")
        assert [g["id"] for g in res["runs"]] == want, "acquire order: priority, then due time, among placeable runs"
        for g in res["runs"]:
            self.grant_token(g["token"])
            m = self.m[g["id"]]
            assert g["attempt"] == m["attempt"] and g["deadline"] == self.now + ttl
            m["place"] = "running"
            m["lease"] = {"worker": worker, "token": g["token"], "renewals": 0, "deadline": self.now + ttl,
                          "ttl": ttl, "started_at": self.now}

    @rule(worker=st.sampled_from(WORKERS), ttl=TTLS, extra=st.integers(0, 3), pick=st.integers(0, 99),
          lag=LAGS)
    def heartbeat(self, worker, ttl, extra, pick, lag):
        """A worker renews its leases (and maybe a stale or foreign one). Its clock may be
        behind state time (``lag``): apply renews from state time, and every accepted lease's
        renewal count moves even when its deadline does not."""
        leases = [[rid, self.m[rid]["lease"]["token"]] for rid in self.live(worker)]
        if extra == 1 and self.old_tokens:  # a stale token of some run
            rid = sorted(self.old_tokens)[pick % len(self.old_tokens)]
            leases.append([rid, self.old_tokens[rid][-1]])
        elif extra == 2 and self.live():  # another worker's lease (or its own)
            rid = self.live()[pick % len(self.live())]
            leases.append([rid, self.m[rid]["lease"]["token"]])
        mine = {(rid, self.m[rid]["lease"]["token"]) for rid in self.live(worker)}
        want_lost = [rid for rid, tok in leases if (rid, tok) not in mine]
        res = self.apply(commands.make("heartbeat", self.now - lag, None, worker=worker, leases=leases, ttl=ttl))
        assert res["ok"] and res["lost"] == want_lost and res["extended"] == len(leases) - len(want_lost)
        for rid, tok in leases:
            if (rid, tok) in mine:  # a lease named twice is renewed twice
                self.renew("run", rid, self.m[rid]["lease"], ttl)

    # ---------------------------------------------------------------- the worker fleet
    @rule(worker=st.sampled_from(WORKERS), labels=FLEET_LABELS, instance=st.sampled_from(["a", "b"]),
          dedicate=st.booleans())
    def hello(self, worker, labels, instance, dedicate):
        """A worker registers or says its facts changed; a new process under a drained id is
        active again (core/workers.py). One may be dedicated to its label pool: it then takes
        only runs placed on it."""
        dedicated = ["pool"] if dedicate and "pool" in labels else []
        res = self.cmd("worker_hello", worker=worker, kind="remote", labels=labels, slots=4,
                       executors=["http", "python", "shell"], queues=None, version="1", instance=instance,
                       dedicated=dedicated)
        w = self.reg.get(worker)
        state = "active" if w is None or w["instance"] != instance else w["state"]
        self.reg[worker] = {"labels": labels, "state": state, "instance": instance, "dedicated": dedicated}
        assert res["ok"] and res["created"] == (w is None) and res["state"] == state, res

    @rule(worker=st.sampled_from(WORKERS))
    def drain(self, worker):
        res = self.cmd("drain_worker", worker=worker)
        if worker not in self.reg:
            assert not res["ok"] and res["error"]["code"] == "not_found"
            return
        assert res["ok"]
        self.reg[worker]["state"] = "draining"

    @rule(worker=st.sampled_from(WORKERS), holder=st.booleans(), stale=st.booleans(), pick=st.integers(0, 99),
          dt=st.sampled_from([0, 10]))
    def release(self, worker, holder, stale, pick, dt):
        """A worker (with ``holder``, one that holds a lease) gives its leases back, maybe naming
        a stale one too: each run it holds is queued again at once with attempt + 1, spending
        no budget (I19); the rest change nothing."""
        self.now += dt
        if holder and self.live():
            worker = self.m[self.live()[pick % len(self.live())]]["lease"]["worker"]
        leases = [[rid, self.m[rid]["lease"]["token"]] for rid in self.live(worker)]
        if stale and self.old_tokens:
            rid = sorted(self.old_tokens)[pick % len(self.old_tokens)]
            if [rid, self.old_tokens[rid][-1]] not in leases:
                leases.append([rid, self.old_tokens[rid][-1]])
        mine = {(rid, self.m[rid]["lease"]["token"]) for rid in self.live(worker)}
        res = self.cmd("release", worker=worker, leases=leases, reason="drain")
        assert res["ok"]
        assert res["released"] == [rid for rid, tok in leases if (rid, tok) in mine]
        assert res["lost"] == [rid for rid, tok in leases if (rid, tok) not in mine]
        for rid in res["released"]:
            m = self.m[rid]
            self.end_lease(rid)
            m["attempt"] += 1
            m["place"], m["due"] = "queued", self.now
            att = self.s.runs[rid]["attempts"][-1]
            assert att["released"] is True and att["worker"] == worker
        for rid in res["released"]:
            run = self.s.runs[rid]
            assert run.get("failures", 0) == self.m[rid]["failures"] and run.get("lost", 0) == self.m[rid]["lost"]

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 99), ok=st.sampled_from([True, False, False]), dt=st.sampled_from([0, 10, 2000]))
    def complete(self, pick, ok, dt):
        self.now += dt
        rid = self.live()[pick % len(self.live())]
        tok = self.m[rid]["lease"]["token"]
        res = self.cmd("complete", run=rid, token=tok, success=ok, error=None if ok else "boom")
        assert res["ok"], res
        if ok:
            self.end_lease(rid)
            self.m[rid]["place"] = "finished"
        else:
            self.fail(rid)
        assert res["state"] == {"finished": "succeeded"}.get(self.m[rid]["place"], self.m[rid]["place"])
        assert res["attempt"] == self.m[rid]["attempt"]

    @precondition(lambda self: self.old_tokens)
    @rule(pick=st.integers(0, 99), ok=st.booleans(), which=st.integers(0, 5))
    def complete_with_a_stale_token(self, pick, ok, which):
        rid = sorted(self.old_tokens)[pick % len(self.old_tokens)]
        olds = self.old_tokens[rid]
        tok = olds[which % len(olds)]
        before = copy.deepcopy(self.s.runs[rid])
        res = self.cmd("complete", run=rid, token=tok, success=ok, error="late")
        assert not res["ok"] and res["error"]["code"] == "conflict", res
        assert self.s.runs[rid] == before, "a refused stale completion changed the run"

    @rule(pick=st.integers(0, 99), live=st.integers(0, 3))
    def dlq_requeue(self, pick, live):
        dead = sorted(rid for rid, m in self.m.items() if m["place"] == "dead")
        if live == 0 or not dead:
            others = sorted(rid for rid, m in self.m.items() if m["place"] != "dead")
            rid = others[pick % len(others)] if others else "nosuch@1"
            res = self.cmd("dlq_requeue", run=rid)
            assert not res["ok"] and res["error"]["code"] == "not_found", "only a dead run can be requeued"
            return
        rid = dead[pick % len(dead)]
        m = self.m[rid]
        cap = 3 if m["queue"] == "q2" else limits.queue_depth_default
        if sum(1 for o in self.m.values() if o["place"] == "queued" and o["queue"] == m["queue"]) >= cap:
            before = copy.deepcopy(self.s.runs[rid])
            res = self.cmd("dlq_requeue", run=rid)  # never over the queue's bound: it stays dead
            assert not res["ok"] and res["error"]["code"] == "conflict" and "is full" in res["error"]["message"], res
            assert self.s.runs[rid] == before
            return
        res = self.cmd("dlq_requeue", run=rid)
        m["attempt"] += 1
        m["failures"] = m["lost"] = 0  # a fresh budget
        m["place"], m["due"] = "queued", self.now
        assert res == {"ok": True, "run": rid, "state": "queued", "attempt": m["attempt"]}

    @rule(name=st.sampled_from(["L1", "L2"]), owner=st.sampled_from(["o1", "o2"]), ttl=TTLS)
    def lock_acquire(self, name, owner, ttl):
        res = self.cmd("lock_acquire", name=name, owner=owner, ttl=ttl)
        if name in self.locks:  # held until released or expired, even past its deadline
            assert not res["ok"] and res["error"]["code"] == "conflict"
            assert res["error"]["holder"] == self.locks[name]["owner"]
            return
        assert res["ok"], res
        assert res["deadline"] == self.now + ttl
        self.grant_token(res["token"])
        self.locks[name] = {"owner": owner, "token": res["token"], "renewals": 0, "deadline": self.now + ttl,
                            "ttl": ttl, "since": self.now}

    @rule(name=st.sampled_from(["L1", "L2"]), ttl=st.one_of(st.none(), TTLS), stale=st.booleans(),
          pick=st.integers(0, 9), lag=LAGS)
    def lock_renew(self, name, ttl, stale, pick, lag):
        """The holder renews (its clock maybe behind state time), or someone renews with a token
        that does not hold the lock and is refused."""
        lk = self.locks.get(name)
        olds = self.old_lock_tokens.get(name, [])
        if not stale and lk is not None:
            tok = lk["token"]
        elif olds:
            tok = olds[pick % len(olds)]
        else:
            tok = (lk["token"] + 1) if lk is not None else 1
        fields = {"name": name, "token": tok} | ({} if ttl is None else {"ttl": ttl})
        before = copy.deepcopy(self.s.locks)
        res = self.apply(commands.make("lock_renew", self.now - lag, None, **fields))
        if lk is None or tok != lk["token"]:
            assert not res["ok"] and res["error"]["code"] == "conflict", res
            assert res["error"]["holder"] == (lk["owner"] if lk else None)
            assert self.s.locks == before, "a refused renew changed a lock"
            return
        self.renew("lock", name, lk, ttl or lk["ttl"], sets=True)
        assert res == {"ok": True, "lock": name, "token": tok, "deadline": lk["deadline"]}

    @rule(name=st.sampled_from(["L1", "L2"]), stale=st.booleans(), pick=st.integers(0, 9))
    def lock_release(self, name, stale, pick):
        lk = self.locks.get(name)
        olds = self.old_lock_tokens.get(name, [])
        tok = lk["token"] if lk is not None and not stale else (olds[pick % len(olds)] if olds else 1)
        before = copy.deepcopy(self.s.locks)
        res = self.cmd("lock_release", name=name, token=tok)
        if lk is None or tok != lk["token"]:
            assert not res["ok"] and res["error"]["code"] == "conflict", res
            assert self.s.locks == before, "a refused release changed a lock"
            return
        assert res == {"ok": True, "lock": name, "released": True}
        self.end_lock(name)

    @rule()
    def snapshot_restore(self):
        data = self.s.snapshot()
        self.s = restored(self.s)
        assert self.s.snapshot() == data

    # ---------------------------------------------------------------- invariants
    @invariant()
    def runs_are_where_the_model_says(self):
        s = self.s
        assert set(s.runs) == set(self.m), "a run appeared or vanished"
        for rid, m in self.m.items():
            run = s.runs[rid]
            place = {"queued": "queued", "running": "running"}.get(run["state"]) or TERMINAL[run["state"]]
            assert place == m["place"], (rid, run["state"], m["place"])
            if m["place"] in ("queued", "running", "dead", "finished"):
                assert run["attempt"] == m["attempt"]
            if m["place"] == "queued":
                assert run["due"] == m["due"] and run["fencing_token"] in (None, *self.old_tokens.get(rid, []))

    @invariant()
    def at_most_one_live_lease_per_run_and_tokens_unique(self):
        s = self.s
        live = {rid: run for rid, run in s.runs.items() if run["state"] == "running"}
        toks = [run["fencing_token"] for run in live.values()] + [lk["token"] for lk in s.locks.values()]
        assert len(toks) == len(set(toks)), "two leases share a token"
        assert len(self.tokens) == len(set(self.tokens)) and self.tokens == sorted(self.tokens)
        assert s.fencing_token == (self.tokens[-1] if self.tokens else 0)
        for rid, run in live.items():
            lease = self.m[rid]["lease"]
            assert (run["fencing_token"], run["worker"], run["renewals"], run["deadline"], run["ttl"],
                    run["started_at"]) == \
                (lease["token"], lease["worker"], lease["renewals"], lease["deadline"], lease["ttl"],
                 lease["started_at"])
            assert run["deadline"] >= run["started_at"]
            assert run["fencing_token"] not in self.old_tokens.get(rid, [])

    @invariant()
    def lease_snapshot_is_every_live_lease_and_lock(self):
        want = [("run", rid, m["lease"]["token"], m["lease"]["renewals"], m["lease"]["ttl"])
                for rid, m in self.m.items() if m["place"] == "running"]
        want += [("lock", n, lk["token"], lk["renewals"], lk["ttl"]) for n, lk in self.locks.items()]
        assert queries.lease_snapshot(self.s) == sorted(want), "not every live lease, or not in canonical order"

    @invariant()
    def queue_depth_counts_queued_runs(self):
        for q in QUEUES:
            n = sum(1 for m in self.m.values() if m["place"] == "queued" and m["queue"] == q)
            assert queries.queue_depth(self.s, q) == queued_count(self.s, q) == n

    @invariant()
    def locks_are_where_the_model_says(self):
        keys = ("owner", "token", "renewals", "deadline", "ttl", "since")
        assert {n: tuple(lk[k] for k in keys) for n, lk in self.s.locks.items()} == \
            {n: tuple(lk[k] for k in keys) for n, lk in self.locks.items()}
        assert all(lk["deadline"] >= lk["since"] for lk in self.s.locks.values())


LeaseMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_leases_against_a_model = LeaseMachine.TestCase
