"""A worker's handlers (the fact ``targets``, core/workers.py): a worker that says which python
targets it has handlers for is granted no python run of another, so that during a rolling deploy
a worker of an app's older version never takes (and fails) a run of a job only the newer one
declares (a walk saw 8 of 12 slots of a new job go dead, every attempt on the one old worker).
Acquire's two paths, the dispatcher's count, why a run waits, the registry and its snapshot."""
from __future__ import annotations

import pytest

from raftsched.core import commands, events, limits, notify_queries, queries
from raftsched.core.worker_queries import NO_HANDLER, NO_WORKER_MATCHES

from core_helpers import SEC, T0, apply, restored
from exec_helpers import acq, do, jspec, refused, trig
from test_workers import hello, state_with

OLD, NEW = "app.jobs:run", "app.jobs:weekly"


def py(target: str, **extra) -> dict:
    return jspec(executor={"type": "python", "target": target}, **extra)


def with_targets(s, now, targets, worker="w1", **kw) -> dict:
    res = do(s, "worker_hello", now, None, worker=worker, kind="remote", labels=kw.pop("labels", {}), slots=4,
             executors=kw.pop("executors", ["python", "shell"]), queues=None, version="1.0", instance="i1",
             targets=targets, **kw)
    assert res["ok"], res
    return res


def test_a_hello_keeps_the_targets_sorted_and_a_hello_without_them_clears_them():
    s = state_with()
    res = with_targets(s, T0, [NEW, OLD, NEW])
    assert res["changed"] and s.workers["w1"]["targets"] == [OLD, NEW]
    assert not with_targets(s, T0 + SEC, [OLD, NEW])["changed"]
    assert with_targets(s, T0 + SEC, [OLD])["changed"] and s.workers["w1"]["targets"] == [OLD]
    assert queries.worker_record(s, "w1")["targets"] == [OLD]
    assert queries.workers(s, T0 + SEC)[0]["targets"] == [OLD]
    hello(s, T0 + 2 * SEC)  # (no targets: any)
    assert "targets" not in s.workers["w1"] and queries.worker_record(s, "w1")["targets"] is None
    assert queries.workers(s, T0 + 2 * SEC)[0]["targets"] is None


@pytest.mark.parametrize("bad", [[], "app.jobs:run", [1], ["no-colon"], ["a:b", "mod:"], ["m:" + "f" * 200],
                                 [f"m:f{i}" for i in range(limits.worker_targets_max + 1)]])
def test_a_hello_with_malformed_targets_is_refused_and_changes_nothing(bad):
    s = state_with()
    res = refused(s, commands.make("worker_hello", T0, None, worker="w1", kind="remote", labels={}, slots=4,
                                   executors=["python"], queues=None, version=None, instance=None, targets=bad),
                  "invalid_command")
    assert "targets" in res["error"]["message"]


@pytest.mark.parametrize("two_queues", [False, True], ids=["one heap", "the general path"])
def test_a_worker_with_targets_takes_only_the_python_runs_it_has_handlers_for(two_queues):
    q2 = {"queue": "other"} if two_queues else {}
    s = state_with(("old", py(OLD)), ("new", py(NEW, **q2)), ("sh", jspec(executor={"type": "shell", "argv": ["true"]})))
    with_targets(s, T0, [OLD], worker="old-worker")
    hello(s, T0, worker="new-worker")
    for name in ("new", "old", "sh", "new"):
        trig(s, name, T0)
    got = acq(s, T0 + 1, worker="old-worker", n=10)
    assert sorted(g["job"] for g in got) == ["old", "sh"]  # a shell run has no target: not held back
    assert all(r["state"] == "queued" for r in s.runs.values() if r["job"] == "new")
    got = acq(s, T0 + 2, worker="new-worker", n=10)
    assert [g["job"] for g in got] == ["new", "new"]  # held back, not lost: a worker with any handler takes them


def test_why_a_run_waits_says_no_handler_and_the_leader_tells_it_so():
    from test_notify_core import WEBHOOK
    s = state_with(("new", py(NEW, notify=[{"sink": "ops", "on": ["run.unplaceable"]}])))
    assert do(s, "put_sink", T0, name="ops", spec=WEBHOOK)["ok"]
    with_targets(s, T0, [OLD], worker="old-worker")
    rid = trig(s, "new", T0)
    assert acq(s, T0 + 1, worker="old-worker") == []
    assert queries.waiting_for(s, rid, T0 + 1) == NO_HANDLER
    assert queries.waiting_for_many(s, [rid], T0 + 1) == {rid: NO_HANDLER}
    assert queries.unplaceable(s, T0 + 1) == {"default": 1}
    # The leader says which wait for a handler (apply reads no registry for it: its cost would
    # grow with the fleet, on every replica's Raft thread).
    t = T0 + limits.unplaceable_report_ms + 1
    with_targets(s, t, [OLD], worker="old-worker")  # (seen again: not gone)
    late = notify_queries.unplaceable_overdue(s, t)
    assert late == [rid] and notify_queries.for_handler(s, late, t, notify_queries.live_workers(s, t)) == [rid]
    assert apply(s, commands.note_unplaceable(t, runs=late, handler=[rid]))["told"] == 1
    ev = events.view(s.outbox.events[-1])
    assert ev["kind"] == "run.unplaceable" and ev["reason"] == NO_HANDLER, ev
    assert "handler" not in commands.note_unplaceable(T0, runs=[rid])  # (as the code before wrote it)
    refused(s, commands.make("note_unplaceable", t, None, runs=[rid], handler="x"), "invalid_command")
    # A worker of the new version: nothing waits any more.
    with_targets(s, t, [OLD, NEW], worker="new-worker")
    assert queries.waiting_for(s, rid, t) is None and queries.unplaceable(s, t) == {}
    # A run no worker's labels allow is still said so, not "no handler".
    s2 = state_with(("placed", py(NEW, placement={"labels": {"pool": "gpu"}})))
    with_targets(s2, T0, [NEW], worker="w")
    rid2 = trig(s2, "placed", T0)
    assert queries.waiting_for(s2, rid2, T0 + 1) == NO_WORKER_MATCHES


def test_a_run_waits_for_a_handler_only_so_long_then_any_worker_of_its_app_may_take_it():
    """A review: held back for good, the runs of a job whose handler was removed (no prune) piled
    up at the head of the app's queue, one a slot, until acquire's scan (2 000 entries) found
    nothing behind them: the app's other jobs stopped. Past limits.handler_wait_ms since it was
    due, a worker without the handler takes it (and fails it, naming the handler, as before)."""
    s = state_with(("new", py(NEW, retry={"max_attempts": 3, "backoff_s": 1})), ("old", py(OLD)))
    with_targets(s, T0, [OLD], worker="old-worker")
    rid = trig(s, "new", T0)
    due = s.runs[rid]["fired_at"]
    scan = lambda now, t: queries.ready_scan(s, None, {}, None, now, 100, 10, (), None, frozenset([t]))[0]  # noqa: E731
    assert acq(s, due + limits.handler_wait_ms - 1, worker="old-worker") == [] and scan(due + limits.handler_wait_ms - 1, OLD) == 0
    assert scan(due + limits.handler_wait_ms, OLD) == 1
    got = acq(s, due + limits.handler_wait_ms, worker="old-worker")
    assert [g["id"] for g in got] == [rid]
    # Refused (no handler): its retry is not held back another 5 minutes (a walk saw N x 5 min
    # before a run reached the dead-letter queue).
    t = due + limits.handler_wait_ms + 10
    assert do(s, "complete", t, run=rid, token=got[0]["token"], success=False, error="no handler")["ok"]
    assert s.runs[rid]["state"] == "queued" and s.runs[rid]["attempt"] == 2
    r = restored(s)  # (the mark is replicated state: a restored replica decides alike)
    assert r.snapshot() == s.snapshot() and r.runs[rid]["handler_waited"] is True
    again = acq(s, s.runs[rid]["due"], worker="old-worker")
    assert [g["id"] for g in again] == [rid]
    # Dead; a handler deployed since, then requeued by hand: it waits for a worker with it again.
    assert do(s, "complete", t + 5000, run=rid, token=again[0]["token"], success=False, error="no handler")["ok"]
    last = acq(s, s.runs[rid]["due"], worker="old-worker")  # (attempt 3: at once too)
    assert [g["id"] for g in last] == [rid]
    assert do(s, "complete", t + 9000, run=rid, token=last[0]["token"], success=False, error="no handler")["ok"]
    assert s.runs[rid]["state"] == "dead"
    t2 = t + 3600_000
    assert do(s, "dlq_requeue", t2, run=rid)["ok"]
    assert acq(s, t2 + 1, worker="old-worker") == []


def test_a_retry_of_a_run_that_failed_on_a_worker_with_its_handler_waits_for_one_again():
    """A review: counted from when it was made, the wait let any retry made 5 minutes later go
    to a worker without the handler at once (a run that ran 10 minutes and failed for its own
    reasons). Only a run already refused for want of a handler waits no more."""
    s = state_with(("new", py(NEW, retry={"max_attempts": 3, "backoff_s": 1})))
    with_targets(s, T0, [OLD], worker="old-worker")
    with_targets(s, T0, [NEW], worker="new-worker")
    rid = trig(s, "new", T0)
    got = acq(s, T0 + 1, worker="new-worker")
    t = T0 + 10 * 60_000
    with_targets(s, t, [OLD], worker="old-worker")
    assert do(s, "complete", t, run=rid, token=got[0]["token"], success=False, error="its own failure")["ok"]
    assert acq(s, s.runs[rid]["due"], worker="old-worker") == []


def test_the_dispatchers_count_skips_what_the_worker_has_no_handler_for():
    s = state_with(("old", py(OLD)), ("new", py(NEW)))
    for name in ("new", "new", "old"):
        trig(s, name, T0)
    scan = lambda targets: queries.ready_scan(s, None, {}, None, T0 + 1, 100, 10, (), None, targets)  # noqa: E731
    assert scan(frozenset([OLD]))[0] == 1 and scan(frozenset([NEW]))[0] == 2 and scan(None)[0] == 3


def test_targets_survive_a_snapshot():
    s = state_with(("new", py(NEW)))
    with_targets(s, T0, [OLD], worker="old-worker")
    trig(s, "new", T0)
    r = restored(s)
    assert r.workers["old-worker"]["targets"] == [OLD]
    assert acq(r, T0 + 1, worker="old-worker") == []


def test_the_workers_of_one_app_version_hold_one_targets_list_restored_too():
    """Every worker of an app version says the same targets (up to 128 names): each record held
    a list of its own, ~9 KB a worker (90 MB a replica at 10 000 workers). Equal lists are one
    object, after a restore too; the snapshot's bytes do not change."""
    from core_helpers import snap_obj
    s = state_with()
    targets = [f"app.jobs:h{i:03d}" for i in range(128)]
    for i in range(3):
        with_targets(s, T0, list(targets), worker=f"w{i}")
    with_targets(s, T0, [OLD], worker="other")
    w = s.workers
    assert w["w0"]["targets"] is w["w1"]["targets"] is w["w2"]["targets"] and w["w0"]["targets"] == targets
    assert w["other"]["targets"] == [OLD]
    r = restored(s)
    assert r.workers["w0"]["targets"] is r.workers["w1"]["targets"] is r.workers["w2"]["targets"]
    assert r.workers["w2"]["targets"] == targets and r.workers["other"]["targets"] == [OLD]
    assert snap_obj(r) == snap_obj(s)
    with_targets(s, T0 + SEC, targets[:5], worker="w1")  # a new version's: w1 alone changes
    assert w["w1"]["targets"] == targets[:5] and w["w0"]["targets"] == targets == w["w2"]["targets"]


def test_the_shared_targets_lists_are_bounded(monkeypatch):
    """A worker token may change its targets at every lease (each a hello): the table of shared
    lists starts again from empty at its bound, where it kept every list ever said (a review)."""
    monkeypatch.setattr(limits, "shared_target_lists_max", 3)
    s = state_with()
    for i in range(20):
        with_targets(s, T0 + i, [f"app.jobs:v{i}"], worker="flapper")
        assert len(s._target_lists) <= 3
    assert s.workers["flapper"]["targets"] == ["app.jobs:v19"]
    with_targets(s, T0 + 30, [OLD], worker="a")
    with_targets(s, T0 + 30, [OLD], worker="b")  # (shared still, after the table started again)
    assert s.workers["a"]["targets"] is s.workers["b"]["targets"]


# ---------------------------------------------------------------------------- the worker's side
def test_a_worker_of_an_app_says_its_handlers_and_leases_without_them_from_an_older_node():
    """RemoteChannel sends ``targets`` (``raftsched worker --app``: AppExecutors.targets); a node
    of a version before them refuses the field (422 naming it): the lease is asked again without
    them, and so are the next ones."""
    import asyncio

    from raftsched.clock import SystemClock
    from raftsched.worker.remote import RemoteChannel, WorkerConfig
    from test_carried_outcomes import TOKEN, Node

    refused = {"error": {"code": "invalid", "message": "unknown field; allowed: dedicated, ...", "field": "targets"}}
    node = Node(lease=[(422, refused), (200, {"runs": [], "draining": False})])

    async def main():
        url = await node.start()
        ch = RemoteChannel(WorkerConfig(urls=[url], token=TOKEN, worker_id="w1", targets=[NEW, OLD]), SystemClock())
        try:
            grants = await asyncio.wait_for(ch.acquire(4, 10_000, None), 20)
            assert grants.runs == []
            await asyncio.wait_for(ch.acquire(4, 10_000, None), 20)
            ch._targets_after = 0.0  # (the pause over: the node may have been upgraded meanwhile)
            await asyncio.wait_for(ch.acquire(4, 10_000, None), 20)
            assert ch.facts["targets"] == [OLD, NEW]
        finally:
            await ch.close()
            await node.server.close()
    asyncio.run(main())
    bodies = [b for p, _, b in node.requests if p == "lease"]
    assert [b.get("targets") for b in bodies] == [[OLD, NEW], None, None, [OLD, NEW]]


def test_an_apps_targets_are_its_handlers_unless_there_are_too_many(monkeypatch):
    from raftsched.sdk import App
    from raftsched.sdk.worker import AppExecutors

    import sdk_targets
    app = App("reports")
    app.job("a", every_s=60, misfire="skip")(sdk_targets.report)
    app.job("b", every_s=60, misfire="skip")(sdk_targets.other)
    app.job("c", every_s=60, misfire="skip")(sdk_targets.report)  # (one handler, two jobs)
    ex = AppExecutors(app, "tests.x:app")
    assert ex.targets() == sorted({d.target for d in app.jobs.values()}) and len(ex.targets()) == 2
    monkeypatch.setattr(limits, "worker_targets_max", 1)
    assert ex.targets() is None
    assert AppExecutors(App("empty"), "tests.x:app").targets() is None  # ([] is no list of targets)


def test_a_sync_says_when_no_live_worker_of_the_app_has_a_new_jobs_handler():
    """A walk: a sync declared a job no live worker of its app could run, without a word."""
    import sdk_targets
    from raftsched.core.errors import Forbidden
    from raftsched.sdk import App
    from raftsched.sdk.plan import plan
    from raftsched.sdk.sync import handler_warnings

    app = App("reports")
    app.job("old", every_s=60, misfire="skip")(sdk_targets.report)
    app.job("new", every_s=60, misfire="skip")(sdk_targets.other)
    old_target = app.jobs["old"].target
    p = plan("reports", app.views(), {"old": app.views()["old"]})
    assert p.create == ("new",)

    class Workers:
        def __init__(self, ws=None, error=None):
            self.ws, self.error = ws, error

        def workers(self):
            if self.error:
                raise self.error
            return {"workers": self.ws}

    def w(targets, status="active", app_name="reports"):
        return {"id": "w", "status": status, "labels": {"raftsched.app": app_name}, "targets": targets}
    lines = handler_warnings(Workers([w([old_target])]), app, p)
    assert len(lines) == 1 and "has the handler of new" in lines[0] and "deploy the workers first" in lines[0]
    assert handler_warnings(Workers([w([old_target]), w(None)]), app, p) == []  # one takes any
    assert handler_warnings(Workers([w([old_target, app.jobs["new"].target])]), app, p) == []
    assert "no live worker of app 'reports'" in handler_warnings(Workers([w([old_target], status="gone")]), app, p)[0]
    assert handler_warnings(Workers(error=Forbidden("no read")), app, p) == []  # (a token that may not read)


def test_a_busy_worker_with_the_handler_and_a_free_one_without_it_say_what_acquire_does():
    """A review of why_queued_many: once a worker with the handler existed, only those were
    counted, so a run said "a free slot" past handler_wait_ms, when a free worker without the
    handler is granted it (acquire's rule: leases.py)."""
    s = state_with(("new", py(NEW)), ("fill", py(NEW)))

    def seen(now):  # both live at ``now`` (a worker unseen for worker_gone_ms is gone)
        res = do(s, "worker_hello", now, None, worker="has", kind="remote", labels={}, slots=1,
                 executors=["python"], queues=None, version="1.0", instance="i1", targets=[NEW])
        assert res["ok"]
        with_targets(s, now, [OLD], worker="lacks")

    seen(T0)
    busy = trig(s, "fill", T0)
    assert [g["id"] for g in acq(s, T0, worker="has", n=1)] == [busy]
    rid = trig(s, "new", T0)
    due = s.runs[rid]["due"]
    soon = due + limits.handler_wait_ms - 1
    seen(soon)
    assert queries.why_queued_many(s, [rid], soon) == {
        rid: "a free slot: the live worker that may take it (1) holds 1 run(s) in 1 slot(s)"}
    assert acq(s, soon, worker="lacks") == []  # what the view said: it waits for "has"
    later = due + limits.handler_wait_ms
    seen(later)
    assert queries.why_queued_many(s, [rid], later) == {}
    assert [g["id"] for g in acq(s, later, worker="lacks")] == [rid]  # what the view said: nothing keeps it


def test_many_workers_alike_are_judged_as_one_group_with_the_same_answers():
    """why_queued_many groups the live workers by their facts (a fleet of one app's thousand
    workers is one): the answers are what worker-by-worker counting gives."""
    s = state_with(("a", py(NEW)), ("b", py(NEW, tenant="t2")))
    for k in range(50):
        with_targets(s, T0, [NEW], worker=f"w{k:02d}")
    ids = [trig(s, "a", T0) for _ in range(200)]
    got = []
    for k in range(50):
        got += acq(s, T0, worker=f"w{k:02d}", n=4)
    assert len(got) == 200
    more = trig(s, "b", T0 + 1)
    assert queries.why_queued_many(s, [more], T0 + 1) == {
        more: "a free slot: every live worker that may take it (50) hold 200 run(s) in 200 slot(s)"}
    g = got[0]
    res = do(s, "complete_many", T0 + 2, results=[{"run": g["id"], "token": g["token"], "success": True}],
             worker=g["worker"] if "worker" in g else s.runs[g["id"]]["worker"])
    assert res["ok"] and s.runs[ids[0]]["state"] == "succeeded"
    assert queries.why_queued_many(s, [more], T0 + 2) == {}
