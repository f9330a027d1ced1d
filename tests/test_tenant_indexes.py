"""The jobs' tenant and queue indexes (core/queues.py index_job): a tenant's page of
``GET /v1/jobs`` and who may use a queue, read from them instead of a walk of every job (at a
million jobs each walk held the replica's lock ~0.3 s). Held here to what the walks they
replaced say, after every command of random sequences of puts, replaces into other tenants and
queues, and deletes, and after a restore."""
from __future__ import annotations

import heapq

from hypothesis import HealthCheck, given, settings, strategies as st

from raftsched.core import commands, queries
from raftsched.core.state import SchedulerState

from core_helpers import T0, apply, put_cmd, restored, spec_of

NAMES = [f"j{i}" for i in range(8)]
TENANTS = ["default", "a", "b"]
QUEUES = ["default", "q1", "q2"]

ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NAMES), st.sampled_from(TENANTS), st.sampled_from(QUEUES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.none(), st.none()),
    st.tuples(st.just("restore"), st.none(), st.none(), st.none()),
), max_size=40)


def page_by_walk(s: SchedulerState, tenants, limit, after, labels=None) -> dict:
    want = labels.items() if labels else None
    names = sorted(n for n, j in s.jobs.items() if j["spec"]["tenant"] in tenants
                   and (want is None or want <= j["spec"].get("labels", {}).items())
                   and (not after or n > after))
    total = sum(1 for n, j in s.jobs.items() if j["spec"]["tenant"] in tenants
                and (want is None or want <= j["spec"].get("labels", {}).items()))
    page = names[:limit]
    return {"jobs": [queries.job(s, n) for n in page], "next": page[-1] if len(names) > limit else None,
            "total": total}


def access_by_walk(s: SchedulerState, q: str, exclude: set) -> tuple:
    if q in s.queue_owners:
        return list(s.queue_owners[q]), set()
    return None, {j["spec"]["tenant"] for n, j in s.jobs.items() if j["spec"]["queue"] == q and n not in exclude}


def queues_of_by_walk(s: SchedulerState, tenants) -> set:
    owners = s.queue_owners
    out = {q for q, ts in owners.items() if any(t in tenants for t in ts)}
    users: dict[str, set] = {}
    for j in s.jobs.values():
        if j["spec"]["queue"] not in owners:
            users.setdefault(j["spec"]["queue"], set()).add(j["spec"]["tenant"])
    return out | {q for q, ts in users.items() if ts <= set(tenants)}


def check(s: SchedulerState) -> None:
    for tenants in ([], ["a"], ["a", "b"], TENANTS, ["nosuch"]):
        for limit, after in ((1, None), (3, None), (2, "j3"), (100, "j0"), (5, "j9")):
            assert queries.jobs_page_in(s, tenants, limit, after) == page_by_walk(s, tenants, limit, after)
            assert queries.jobs_page_in(s, tenants, limit, after, {"k": "v"}) \
                == page_by_walk(s, tenants, limit, after, {"k": "v"})
        assert queries.queues_of(s, tenants) == queues_of_by_walk(s, tenants)
    # The labelled page as GET /v1/jobs takes it: names walked outside the lock, then the jobs.
    for tenants in (None, ["a"], ["a", "b"], ["nosuch"]):
        for limit, after in ((1, None), (3, None), (2, "j3"), (100, "j0")):
            names, more, total = queries.labelled_walk(queries.labelled_inputs(s, tenants), {"k": "v"}, limit, after)
            got = {"jobs": queries.jobs_named(s, names, tenants), "next": names[-1] if more else None, "total": total}
            want = (queries.jobs_labelled_page(s, {"k": "v"}, limit, after) if tenants is None
                    else page_by_walk(s, tenants, limit, after, {"k": "v"}))
            assert got == want
    for q in QUEUES + ["nosuch"]:
        assert queries.queue_tenants(s, q) == access_by_walk(s, q, set())[1]
        for exclude in (set(), {"j1"}, set(NAMES[:4]), set(NAMES)):
            assert queries.queues_access(s, [q], exclude)[q] == access_by_walk(s, q, exclude)
        assert queries.queue_access(s, q, "j2") == access_by_walk(s, q, {"j2"})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS)
def test_tenant_pages_and_queue_users_agree_with_a_walk_of_every_job(actions):
    s = SchedulerState()
    now = T0
    for k, (what, name, tenant, queue) in enumerate(actions):
        now += 1000
        if what == "put":
            extra = {"labels": {"k": "v"}} if k % 2 else {}
            spec = spec_of({"every_s": 60}, name=name, tenant=tenant, queue=queue, **extra)
            assert apply(s, put_cmd(s, name, spec, now))["ok"]
        elif what == "delete":
            apply(s, commands.make("delete_job", now, None, name=name))
        else:
            s = restored(s)
        check(s)


def test_a_tenants_page_reads_only_its_range_of_names():
    """No walk: a page of a tenant with few jobs among many reads its own names only."""
    s = SchedulerState()
    for i in range(300):
        tenant = "small" if i % 100 == 0 else "big"
        assert apply(s, put_cmd(s, f"j{i:03d}", spec_of({"every_s": 60}, name=f"j{i:03d}", tenant=tenant), T0))["ok"]
    seen = []

    class Spy(dict):
        def items(self):
            seen.append("walk")
            return super().items()
    s.jobs = Spy(s.jobs)
    page = queries.jobs_page_in(s, ["small"], 2, None)
    assert [j["name"] for j in page["jobs"]] == ["j000", "j100"] and page["next"] == "j100" and page["total"] == 3
    assert queries.jobs_page_in(s, ["small"], 2, "j100")["jobs"][0]["name"] == "j200"
    assert seen == []
    assert list(heapq.merge([1, 3], [2])) == [1, 2, 3]  # (the merge the page relies on)


def test_a_page_by_labels_walks_the_jobs_outside_the_replicas_lock(monkeypatch):
    from test_fleet import put_job as put, run, under_lock

    async def t(env, c):
        for i in range(5):
            await put(env, f"j{i}", {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
                                     "executor": {"type": "python", "target": "builtins:id"},
                                     "labels": {"k": "v" if i % 2 else "w"}})
        walked = under_lock(env, monkeypatch, "labelled_walk")["labelled_walk"]
        page = await env.service.list_jobs(1, None, {"k": "v"})
        assert [j["name"] for j in page["jobs"]] == ["j1"] and page["next"] == "j1" and page["total"] == 2
        page = await env.service.list_jobs(5, "j1", {"k": "v"}, frozenset({"default"}))
        assert [j["name"] for j in page["jobs"]] == ["j3"] and page["next"] is None and page["total"] == 2
        assert walked == [False, False]
    run(t)


def test_a_job_that_moves_to_another_tenant_mid_walk_is_not_shown_to_the_first():
    """The names are picked outside the lock, the jobs read under it again: one that moved to
    another tenant (or was deleted and put again by another) in between is left out."""
    s = SchedulerState()
    for name, tenant in (("j1", "a"), ("j2", "a")):
        assert apply(s, put_cmd(s, name, spec_of({"every_s": 60}, name=name, tenant=tenant, labels={"k": "v"}), T0))["ok"]
    inputs = queries.labelled_inputs(s, ["a"])
    assert apply(s, put_cmd(s, "j1", spec_of({"every_s": 60}, name="j1", tenant="b", labels={"k": "v"}), T0))["ok"]
    names, more, total = queries.labelled_walk(inputs, {"k": "v"}, 10, None)
    assert names == ["j2"] and total == 1 and not more
    assert [j["name"] for j in queries.jobs_named(s, ["j1", "j2"], ["a"])] == ["j2"]


def test_the_users_of_many_queues_less_a_large_batch_take_one_pass_over_the_batch():
    """A batch puts jobs each in a queue of its own: queues_access reads each excluded job once,
    not once a queue (that was quadratic under the replica's lock)."""
    s = SchedulerState()
    n = 300
    for i in range(n):
        spec = spec_of({"every_s": 60}, name=f"j{i}", tenant="a" if i % 2 else "b", queue=f"q{i}")
        assert apply(s, put_cmd(s, f"j{i}", spec, T0))["ok"]
    looked: list[str] = []

    class Spy(dict):
        def get(self, k, default=None):
            looked.append(k)
            return super().get(k, default)
    s.jobs = Spy(s.jobs)
    out = queries.queues_access(s, [f"q{i}" for i in range(n)], {f"j{i}" for i in range(0, n, 3)})
    assert len(looked) == len(range(0, n, 3))
    assert out["q0"] == (None, set()) and out["q1"] == (None, {"a"}) and out["q2"] == (None, {"b"})
