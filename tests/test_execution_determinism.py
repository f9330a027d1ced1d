"""Determinism of leased execution across snapshot and restore: replicas that apply the same
random commands (acquires, completions, retries, dead runs, tenants, locks, queue bounds), some
of them restored from snapshots in between, end identical and hand out runs in the same order
(I1). ``ExecDriver`` proposes the commands as the cluster does."""
from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, limits, queries
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, new_state, plan_tick, put_cmd, queued_count, restored, snap_obj, spec_of
from exec_helpers import overdue
from backfill_helpers import backfill_cmd, step_cmd


# ============================================================================ determinism
SPECS = {
    0: spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=2, queue="q1", priority=5, tenant="t1",
               history=3, retry={"max_attempts": 2, "backoff_s": 1, "backoff_max_s": 4, "jitter": 0.5}),
    1: spec_of({"every_s": 7}, "fire_once", grace_s=0, queue="q2", priority=1, tenant="t2", history=4),
    2: spec_of({"cron": "*/10 * * * * *"}, "skip", grace_s=5, queue="q1", priority=9, tenant="t2", history=2,
               retry={"max_attempts": 3, "backoff_s": 0, "backoff_max_s": 0, "jitter": 0}),
    3: spec_of({"every_s": 5}, "fire_all", grace_s=2, max_catchup=2, queue="q2", priority=7, tenant="t1",
               history=5, retry={"max_attempts": 3, "backoff_s": 2, "backoff_max_s": 8, "jitter": 0.2}),
}
JOBS = ("a", "b", "c")
WORKERS = ("w1", "w2", "w3")
DT = st.sampled_from([0, 0, 1, 500, 1000, 2000, 5000, 11_000, 61_000])
TTLS = st.sampled_from([1000, 3000, 20_000])
def _acquire_s():
    return st.tuples(st.just("acquire"), st.sampled_from(WORKERS),
                     st.sampled_from([None, None, ["q1"], ["q2"], ["q2", "q1"]]), st.integers(1, 4), TTLS, DT)


def _complete_s():
    return st.tuples(st.just("complete"), st.integers(0, 20), st.booleans(), st.sampled_from([0, 0, 0, 1, 2]))


def _trigger_s():
    return st.tuples(st.just("trigger"), st.sampled_from(JOBS))


def _cycle_s():
    """trigger a job, and one worker takes one run of its queue and fails it"""
    return st.tuples(st.just("cycle"), st.sampled_from(JOBS), st.sampled_from(WORKERS), DT)


#: weighted towards what makes leases, retries and dead runs: triggers, acquires, completions
#: (hypothesis draws one_of's branches about evenly; repeated branches weigh more)
EXEC_ACTIONS = st.one_of(
    _trigger_s(), _trigger_s(), _trigger_s(),
    _cycle_s(), _cycle_s(), _cycle_s(),
    st.tuples(st.just("fail_all"), DT, st.booleans()),
    _acquire_s(), _acquire_s(), _acquire_s(), _acquire_s(),
    _complete_s(), _complete_s(), _complete_s(), _complete_s(),
    st.tuples(st.just("put"), st.sampled_from(JOBS), st.sampled_from(sorted(SPECS))),
    st.tuples(st.just("delete"), st.sampled_from(JOBS)),
    st.tuples(st.just("tick"), DT),
    st.tuples(st.just("advance"), DT),
    st.tuples(st.just("heartbeat"), st.sampled_from(WORKERS), TTLS, st.booleans()),
    st.tuples(st.just("reap"), DT),
    st.tuples(st.just("expire_raw"), st.integers(0, 20)),
    st.tuples(st.just("takeover"), st.sampled_from([0, 1000, 60_000, 3_600_000])),
    st.tuples(st.just("requeue"), st.integers(0, 20)),
    st.tuples(st.just("dlq_delete"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("cancel_many"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("tenant"), st.sampled_from(["t1", "t2"]), st.sampled_from([0, 333, 1000, 100_000]),
              st.integers(1, 3)),
    st.tuples(st.just("del_tenant"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("lock"), st.sampled_from(["L1", "L2"]), st.sampled_from(["o1", "o2"]), TTLS),
    st.tuples(st.just("lock_renew"), st.sampled_from(["L1", "L2"]), st.booleans()),
    st.tuples(st.just("lock_release"), st.sampled_from(["L1", "L2"]), st.booleans()),
    st.tuples(st.just("queue"), st.sampled_from(["q1", "q2"]), st.integers(1, 6),
              st.sampled_from(["reject", "drop_oldest"])),
    st.tuples(st.just("snapshot"),),
    # backfills and bulk DLQ operations among leases, retries and dead runs (core/backfills.py)
    st.tuples(st.just("backfill"), st.sampled_from(JOBS), st.sampled_from(["missing", "failed", "all"]),
              st.integers(1, 3), st.sampled_from([None, 2000])),
    st.tuples(st.just("bulk"), st.sampled_from(["requeue", "purge"]), st.sampled_from([None, 1, 3])),
    st.tuples(st.just("bf_step"), DT), st.tuples(st.just("bf_step"), DT),
)
#: the three jobs first, then anything
EXEC_SEQUENCES = st.tuples(
    st.tuples(*[st.tuples(st.just("put"), st.just(j), st.sampled_from(sorted(SPECS))) for j in JOBS]),
    st.lists(EXEC_ACTIONS, min_size=10, max_size=45),
).map(lambda t: list(t[0]) + t[1])


class ExecDriver:
    """Proposes commands as the cluster does: built from the leader's view (replica 0), encoded
    once, applied to every replica; every result must be equal on every replica."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.now = T0
        self.tokens: list[int] = []  # every token handed out, in order
        self.acquires = 0

    @property
    def L(self) -> SchedulerState:
        return self.replicas[0]

    def propose(self, cmd: dict) -> dict:
        data = commands.encode(cmd)
        results = [r.apply_bytes(data) for r in self.replicas]
        assert all(res == results[0] for res in results), (cmd, results)
        return results[0]

    def cmd(self, op, **fields) -> dict:
        return self.propose(commands.make(op, self.now, None, **fields))

    def cmd_of(self, cmd: dict) -> dict:
        res = self.propose(cmd)
        assert res["ok"], res
        return res

    def running(self):
        return sorted((r for r in self.L.runs.values() if r["state"] == "running"), key=lambda r: r["id"])

    def dead(self):
        return sorted((r for r in self.L.runs.values() if r["state"] == "dead"), key=lambda r: r["id"])

    def run(self, a, on_snapshot):
        kind, L = a[0], self.L
        if kind == "put":
            c = put_cmd(L, a[1], SPECS[a[2]], self.now)
            self.propose(c)
        elif kind == "delete":
            self.cmd("delete_job", name=a[1])
        elif kind == "trigger":
            self.cmd("trigger_job", name=a[1])
        elif kind == "tick":
            self.now += a[1]
            cmd, _ = plan_tick(L, self.now)
            if cmd is not None:
                res = self.propose(cmd)
                assert res["ok"] and res["stale"] == 0, res
        elif kind == "advance":
            self.now += a[1]
            self.cmd("noop")
        elif kind == "acquire":
            _, worker, queues, n, ttl, dt = a
            self.now += dt
            could = queries.has_ready_work(L, queues, self.now)
            res = self.cmd("acquire", worker=worker, queues=queues, max=n, ttl=ttl)
            assert res["ok"] and len(res["runs"]) <= n
            assert could or not res["runs"], "has_ready_work said no while work was ready"
            self.tokens += [g["token"] for g in res["runs"]]
            self.acquires += 1
        elif kind == "cycle":
            _, job, worker, dt = a
            self.now += dt
            self.cmd("trigger_job", name=job)
            spec = L.jobs[job]["spec"] if job in L.jobs else SPECS[0]
            res = self.cmd("acquire", worker=worker, queues=[spec["queue"]], max=1, ttl=3000)
            self.tokens += [g["token"] for g in res["runs"]]
            for g in res["runs"]:
                assert self.cmd("complete", run=g["id"], token=g["token"], success=False, error="x")["ok"]
        elif kind == "fail_all":
            # several attempts end at the same now, in id order or against it
            self.now += a[1]
            for r in sorted(self.running(), key=lambda r: r["id"], reverse=a[2]):
                assert self.cmd("complete", run=r["id"], token=r["fencing_token"], success=False)["ok"]
        elif kind == "heartbeat":
            _, worker, ttl, stale = a
            leases = [[r["id"], r["fencing_token"]] for r in self.running() if r["worker"] == worker]
            if stale and leases:
                leases[0][1] -= 1
            res = self.cmd("heartbeat", worker=worker, leases=leases, ttl=ttl)
            assert res["ok"] and res["extended"] + len(res["lost"]) == len(leases)
        elif kind == "complete":
            _, k, ok, mode = a
            runs = self.running() or sorted(L.runs.values(), key=lambda r: r["id"])
            if not runs:
                res = self.cmd("complete", run="nosuch@1", token=1, success=ok)
                assert res["error"]["code"] == "not_found"
                return
            run = runs[k % len(runs)]
            tok = (run.get("fencing_token") or 0) - (0 if mode == 0 else mode)
            before = dict(run)
            # Half of them name the run's worker, as complete_many does: an attempt the cluster
            # ended while it ran (a cancel, a replace) keeps that report's output, and only it.
            named = {"worker": run["worker"]} if k % 2 and run.get("worker") is not None else {}
            res = self.cmd("complete", run=run["id"], token=tok, success=ok, error="e", output=f"o{self.now}", **named)
            if not res["ok"]:
                assert res["error"]["code"] == "conflict"
                assert L.runs.get(run["id"]) == before, "a refused completion changed the run"
            elif res.get("kept") == "output":
                assert named and before["output"] is None and before["state"] == "failed", before
                assert dict(L.runs[run["id"]], output=None) == before, "a killed run's report changed more than its output"
        elif kind == "reap":
            self.now += a[1]
            reads = [queries.lease_snapshot(r) for r in self.replicas]
            assert all(x == reads[0] for x in reads), "replicas see different leases"
            runs, locks = overdue(L, self.now)
            runs = runs[:limits.expire_items_max]
            locks = locks[:limits.expire_items_max - len(runs)]
            res = self.cmd("expire", runs=runs, locks=locks)
            assert res["ok"] and len(res["expired"]) == len(runs) and len(res["released"]) == len(locks)
        elif kind == "expire_raw":
            # an expire for any live lease or lock, named as it is now (it applies, whatever its
            # deadline: apply compares no clock), as it was before its last renewal, or by an
            # older token (both ignored, and change nothing but state time)
            items = [("run", r["id"], r["fencing_token"], r["renewals"]) for r in self.running()]
            items += [("lock", n, lk["token"], lk["renewals"]) for n, lk in sorted(L.locks.items())]
            if items:
                k, ident, tok, renewals = items[a[1] % len(items)]
                mode = a[1] // len(items) % 3
                item = [ident, tok - (mode == 2), renewals - (mode == 1)]
                before = snap_obj(L, ("applied", "now_ms"))
                res = self.cmd("expire", runs=[item] if k == "run" else [], locks=[item] if k == "lock" else [])
                if mode == 0:
                    assert res == {"ok": True, "expired": [ident] if k == "run" else [],
                                   "released": [ident] if k == "lock" else [], "ignored": 0}, (item, res)
                else:
                    assert res == {"ok": True, "expired": [], "released": [], "ignored": 1}, (item, res)
                    assert snap_obj(L, ("applied", "now_ms")) == before, "an ignored expire changed the state"
        elif kind == "takeover":
            self.now += a[1]
            self.cmd("takeover", node="n2")
        elif kind in ("requeue", "dlq_delete"):
            dead = self.dead()
            rid = dead[a[1] % len(dead)]["id"] if dead else "nosuch@1"
            self.cmd("dlq_requeue" if kind == "requeue" else "dlq_delete", run=rid)
        elif kind == "cancel":
            # any run, active or not (a refusal must change nothing but state time), by request
            ids = sorted(L.runs)
            rid = ids[a[1] % len(ids)] if ids else "nosuch@1"
            was = L.runs[rid]["state"] if ids else None
            res = self.cmd("cancel_run", run=rid, reason="x" if a[1] % 2 else None)
            assert res["ok"] is (was in ("queued", "running")), (was, res)
        elif kind == "cancel_many":
            # a few runs, any state, and an id of none: the queued (and running, if asked) end
            ids = sorted(L.runs)
            picked = [ids[(a[1] + k * 7) % len(ids)] for k in range(3)] if ids else []
            was = {rid: L.runs[rid]["state"] for rid in picked}
            res = self.cmd("cancel_runs", runs=picked + ["nosuch@1"], running=a[2])
            ended = [r for r in dict.fromkeys(picked) if was[r] == "queued" or (a[2] and was[r] == "running")]
            assert res["ok"] and res["cancelled"] == len(ended), (was, res)
            first, over = set(ended), []
            for r in picked + ["nosuch@1"]:  # each ended once; a repeat, and the rest, passed over
                if r in first:
                    first.discard(r)
                else:
                    over.append(r)
            assert [r for r, _st in res["passed"]] == over, (was, res)
        elif kind == "tenant":
            self.cmd("put_tenant", name=a[1], rate_milli=a[2], burst=a[3])
        elif kind == "del_tenant":
            self.cmd("delete_tenant", name=a[1])
        elif kind == "lock":
            res = self.cmd("lock_acquire", name=a[1], owner=a[2], ttl=a[3])
            if res["ok"]:
                self.tokens.append(res["token"])
        elif kind in ("lock_renew", "lock_release"):
            lk = L.locks.get(a[1])
            tok = (lk["token"] if lk else 1) - (1 if a[2] else 0)
            self.cmd(kind, name=a[1], token=tok)
        elif kind == "queue":
            self.cmd("put_queue", name=a[1], max_depth=a[2], on_full=a[3])
        elif kind == "backfill":
            _, job, mode, mc, rate = a
            if job in L.jobs:
                hi = min(self.now, L.jobs[job]["cursor"] + 1)
                n = len(L.backfills)
                self.cmd_of(backfill_cmd(L, job, hi - 30 * SEC, hi, self.now, f"b{n}", reprocess=mode,
                                         max_concurrent=mc, rate_milli=rate))
        elif kind == "bulk":
            _, action, n = a
            self.cmd("dlq_bulk", name=f"d{len(L.backfills)}", action=action, queue=None, job=None, error=None,
                     dead_from=None, dead_to=self.now, max_count=n,
                     max_concurrent=2 if action == "requeue" else None, rate_milli=None)
        elif kind == "bf_step":
            self.now += a[1]
            for bf_id in list(L.backfills):
                c = step_cmd(L, bf_id, self.now)
                if c is not None:
                    assert self.propose(c)["ok"]
        elif kind == "snapshot":
            on_snapshot()


def _exec_invariants(s: SchedulerState):
    for q in ("q1", "q2"):
        assert queries.queue_depth(s, q) == queued_count(s, q) >= 0
    # Every queued run is in its queue's indexes, under its current key.
    for r in s.runs.values():
        if r["state"] == "queued":
            assert (r.get("due", r["slot"]), r["id"]) in s._queued[r["queue"]][r["priority"]]
            if r["queue"] in s._by_slot:
                assert (r["slot"], r["id"]) in s._by_slot[r["queue"]]
    toks = [r["fencing_token"] for r in s.runs.values() if r.get("state") == "running"]
    toks += [lk["token"] for lk in s.locks.values()]
    assert len(toks) == len(set(toks)), "two live leases share a token"
    assert all(t <= s.fencing_token for t in toks)
    for r in s.runs.values():
        if r["state"] == "running":
            assert r["deadline"] >= r["started_at"] and r["worker"]
            assert type(r["renewals"]) is int and r["renewals"] >= 0
        else:
            assert r.get("deadline") is None
    for lk in s.locks.values():
        assert type(lk["renewals"]) is int and lk["renewals"] >= 0 and lk["deadline"] >= lk["since"]
    snap = queries.lease_snapshot(s)
    assert snap == sorted(snap), "lease_snapshot is not in canonical order"
    for t in s.tenants.values():
        assert type(t["tokens_micro"]) is int and 0 <= t["tokens_micro"] <= t["burst"] * 1_000_000
    dead_by_q: dict[str, int] = {}
    for r in s.runs.values():
        if r["state"] == "dead":
            dead_by_q[r["queue"]] = dead_by_q.get(r["queue"], 0) + 1
    assert all(n <= limits.dlq_per_queue_max for n in dead_by_q.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=EXEC_SEQUENCES, restore_at=st.sets(st.integers(0, 48), max_size=12))
def test_replicas_restored_from_snapshots_stay_identical_and_hand_out_runs_in_the_same_order(actions, restore_at):
    with mock.patch.object(limits, "dlq_per_queue_max", 2):
        a, b = new_state(), new_state()
        d = ExecDriver([a, b])

        def snapshot_restore():
            data = d.replicas[1].snapshot()
            fresh = new_state()
            fresh.restore(data)
            assert fresh.snapshot() == data
            d.replicas[1] = fresh

        for i, act in enumerate(actions):
            if i in restore_at:
                snapshot_restore()
            d.run(act, snapshot_restore)
            assert a.snapshot() == d.replicas[1].snapshot(), f"diverged after {act}"
            _exec_invariants(a)
            _exec_invariants(d.replicas[1])
        assert d.tokens == sorted(set(d.tokens)), "tokens repeated or went backwards"
        # A replica restored at the very end hands out the remaining runs in the same order, and
        # its dead-letter queues purge the same runs as the others'.
        d.replicas.append(restored(a))
        for i in range(3):
            d.run(("acquire", "w9", None, 4, 3000, 30 * SEC), snapshot_restore)
            d.run(("fail_all", 0, i % 2 == 0), snapshot_restore)
            snapshot_restore()
            for j in JOBS:
                d.run(("trigger", j), snapshot_restore)
        assert a.snapshot() == d.replicas[1].snapshot() == d.replicas[2].snapshot()
