"""core/ready.py's ReadyIndex against what it replaced, a heap of (due, run id) tuples: the same
entries handed out in the same order, whatever the pushes, pops, put-backs and compactions.
Pure: no network, no clock."""
from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core.ready import ReadyIndex, entries_of

DUES = st.integers(min_value=0, max_value=6).map(lambda k: 1_000 * k)
RIDS = st.sampled_from([f"j{k}@{s}" for k in (0, 1, 2, 10, 11) for s in ("a", "b", "ü")])
OPS = st.lists(st.one_of(
    st.tuples(st.just("push"), DUES, RIDS),
    st.tuples(st.just("pop"), st.just(0), st.just("")),
    st.tuples(st.just("pop_due_by"), DUES, st.just("")),
    st.tuples(st.just("take_and_put_back"), DUES, st.just("")),
    st.tuples(st.just("peek_drop_all"), DUES, st.integers(1, 6)),
    st.tuples(st.just("peek_drop_some"), DUES, st.integers(1, 6)),
    st.tuples(st.just("keep"), st.integers(0, 3), st.just("")),
), max_size=120)


def live(a: int, due: int, rid: str) -> bool:
    """A compaction's test of an entry: a run is queued under one due at most (the one its id
    names here), and, for a < 3, only runs whose id ends with one letter are still queued."""
    return due == 1_000 * (sum(map(ord, rid)) % 7) and (a == 3 or rid.endswith("ab\u00fc"[a]))


class SmallLists(ReadyIndex):
    """A due's list is a heap past 4 ids (limits.ready_sort_max is 16 384), a list below 2."""

    __slots__ = ()
    sort_max = 4


@settings(max_examples=400, deadline=None)
@given(OPS, st.sampled_from([ReadyIndex, SmallLists]))
def test_hands_out_what_a_heap_of_tuples_does(ops, kind):
    ref: list[tuple[int, str]] = []
    idx = kind()
    for op, a, b in ops:
        if op == "push":
            heapq.heappush(ref, (a, b))
            idx.push(a, b)
        elif op == "pop":
            if ref:
                assert idx.pop() == heapq.heappop(ref)
        elif op == "pop_due_by":
            want = heapq.heappop(ref) if ref and ref[0][0] <= a else None
            assert idx.pop_due_by(a) == want
        elif op.startswith("peek_drop"):
            # An acquire's read of a due (leases.py): the first entries of the smallest due, in
            # the pops' order (one of a heap), then those looked at taken out as pops would
            got = idx.peek_due_by(a, b)
            if not ref or ref[0][0] > a:
                assert got is None
                continue
            due, rids = got
            same = sorted(r for d, r in ref if d == due)
            assert due == ref[0][0] and 1 <= len(rids) <= b
            assert rids == same[:len(rids)]
            assert len(rids) == (1 if due in idx._heaped else min(b, len(same)))
            j = len(rids) if op == "peek_drop_all" else len(rids) // 2
            idx.drop_first(due, j)
            assert [heapq.heappop(ref)[1] for _ in range(j)] == rids[:j]
        elif op == "take_and_put_back":
            # An acquire: takes up to three ready entries, passes over some, puts those back.
            taken = []
            while len(taken) < 3 and ref and ref[0][0] <= a:
                e = heapq.heappop(ref)
                assert idx.pop_due_by(a) == e
                taken.append(e)
            assert len(taken) == 3 or idx.pop_due_by(a) is None
            held = taken[::2]
            for e in held:
                heapq.heappush(ref, e)
            for e in reversed(held):
                idx.push(*e)
        else:  # keep: a compaction (duplicates of a live entry go too)
            seen, kept = set(), []
            for e in ref:
                if live(a, *e) and e[1] not in seen:
                    seen.add(e[1])
                    kept.append(e)
            heapq.heapify(kept)
            ref[:] = kept
            idx.keep_only(lambda due, rid, a=a: live(a, due, rid))
        assert len(idx) == len(ref) and bool(idx) == bool(ref)
        assert sorted(idx) == sorted(ref)
        assert sorted(entries_of(idx.copy_buckets())) == sorted(ref)
        assert idx._multi == {d for d, b in idx._buckets.items() if type(b) is list}
        assert idx._heaped <= idx._multi and idx._unsorted <= idx._multi
        assert all(len(idx._buckets[d]) >= idx.sort_max >> 1 for d in idx._heaped)
        assert idx.peek() == (ref[0] if ref else None)
        assert idx.head() == (ref[0] if ref else None)
        assert idx.head_due() == (ref[0][0] if ref else None)
        for e in ref[:3]:
            assert e in idx
    while ref:  # and it drains in the heap's order
        assert idx.pop() == heapq.heappop(ref)
    assert idx.head() is None and idx.pop_due_by(10**9) is None


def test_ready_buckets_are_those_due_and_a_read_leaves_the_layout():
    idx = ReadyIndex()
    for due, rid in [(3_000, "c"), (1_000, "b"), (1_000, "a"), (1_000, "z"), (2_000, "x"), (5_000, "y")]:
        idx.push(due, rid)
    got = {due: b if type(b) is str else list(b) for due, b in idx.ready_buckets(2_000)}
    assert got == {1_000: ["b", "a", "z"], 2_000: "x"}  # (a due of one run: its id, no list)
    assert idx.peek() == (1_000, "a")
    assert list(dict(idx.ready_buckets(1_000))[1_000]) == ["b", "a", "z"]  # peek sorted nothing
    assert idx.head() == (1_000, "a")  # (head sorts the bucket: the next one is its last)
    assert [idx.pop() for _ in range(3)] == [(1_000, "a"), (1_000, "b"), (1_000, "z")]


def test_equal_is_the_same_entries_whatever_the_layout():
    a, b = ReadyIndex(), ReadyIndex()
    for e in [(1, "x"), (1, "y"), (2, "x"), (1, "x")]:
        a.push(*e)
    for e in [(2, "x"), (1, "x"), (1, "y"), (1, "x")]:
        b.push(*e)
    assert a == b
    b.pop()
    assert a != b


def test_a_storm_sized_list_is_a_heap_not_sorted_in_one_go():
    idx = SmallLists()
    for k in (5, 3, 9, 1, 7, 2):  # past sort_max (4): a heap from the fifth push
        idx.push(1_000, f"r{k}")
    assert 1_000 in idx._heaped
    assert [idx.pop()[1] for _ in range(5)] == ["r1", "r2", "r3", "r5", "r7"]
    assert 1_000 not in idx._heaped and idx._buckets[1_000] == ["r9"]  # under half: a list again


def test_a_sorted_list_past_the_bound_becomes_a_heap_in_order():
    idx = SmallLists()
    for k in (9, 8, 7, 6, 5, 4):  # arriving largest first: sorted all along, then past the bound
        idx.push(1_000, f"r{k}")
    idx.push(1_000, "r0")
    assert 1_000 in idx._heaped and 1_000 not in idx._unsorted
    assert idx.peek() == idx.head() == (1_000, "r0")
    assert [idx.pop()[1] for _ in range(7)] == ["r0", "r4", "r5", "r6", "r7", "r8", "r9"]


def test_a_peek_at_a_heaped_list_reads_one_and_drops_leave_it_as_the_pops_would():
    """peek_due_by at a due's heap: its smallest only (a heap's order is not a slice);
    drop_first takes as pops do, and what is left is a sorted list again once it holds less
    than half the bound; a sorted list's peek is up to k, and a drop of 0 takes nothing."""
    idx = SmallLists()
    for k in (3, 9, 1, 7, 5, 8, 2):
        idx.push(1_000, f"r{k}")
    idx.push(2_000, "s")
    assert 1_000 in idx._heaped
    assert idx.peek_due_by(999, 3) is None
    assert idx.peek_due_by(1_000, 3) == (1_000, ["r1"])
    idx.drop_first(1_000, 3)  # (three pops)
    assert 1_000 in idx._heaped and len(idx) == 5  # four left: half the bound or more
    assert idx.peek_due_by(1_000, 3) == (1_000, ["r5"])
    idx.drop_first(1_000, 2)
    assert 1_000 in idx._heaped and idx._buckets[1_000] == ["r8", "r9"]  # (two: half the bound)
    idx.drop_first(1_000, 0)
    assert len(idx) == 3
    idx.drop_first(1_000, 1)
    assert 1_000 not in idx._heaped and idx._buckets[1_000] == ["r9"]
    assert idx.peek_due_by(5_000, 2) == (1_000, ["r9"])
    idx.drop_first(1_000, 1)
    assert idx.peek_due_by(5_000, 3) == (2_000, ["s"])
    idx.drop_first(2_000, 1)
    assert not idx and idx._buckets == {} and idx._dues == [] and idx._multi == set()
    with pytest.raises(ValueError):
        idx.peek_due_by(5_000, 0)


def test_a_compaction_keeps_a_heaped_list_in_order():
    class Eight(ReadyIndex):
        __slots__ = ()
        sort_max = 8
    ids = [f"r{k}" for k in (3, 9, 1, 7, 0, 5, 2, 8, 6, 4)]
    for drop, heaped in (({"r0", "r1"}, True), ({"r0", "r1", "r2", "r3", "r4", "r5", "r6"}, False)):
        idx = Eight()
        for rid in ids:
            idx.push(1_000, rid)
        assert 1_000 in idx._heaped
        idx.keep_only(lambda due, rid, drop=drop: rid not in drop)
        assert (1_000 in idx._heaped) is heaped  # (under half of sort_max: a sorted list again)
        left = sorted(set(ids) - drop)
        assert [idx.pop()[1] for _ in range(len(left))] == left


def check_index(h: ReadyIndex) -> None:
    """What every ReadyIndex holds to: its count, one due a bucket, its sets exact."""
    assert h._n == sum(1 for _ in h) and sorted(h._buckets) == sorted(h._dues)
    assert h._multi == {d for d, b in h._buckets.items() if type(b) is list}
    assert h._unsorted <= h._multi and h._heaped <= h._multi
    assert all(len(h._buckets[d]) >= h.sort_max >> 1 for d in h._heaped)


def test_a_fire_that_raises_partway_leaves_the_index_counting_what_it_holds():
    """apply refuses a command that raises and keeps what it did before (state.apply): the
    fire fast path's runs queued before the failure must be handed out, as the heap did."""
    from raftsched.core import commands, policy
    from core_helpers import SEC, T0, apply, new_state, put_cmd, spec_of

    s = new_state()
    apply(s, put_cmd(s, "a", spec_of({"every_s": 1}, "fire_all", grace_s=3600, max_catchup=10, history=50), T0))
    j = s.jobs["a"]
    now = T0 + 5 * SEC
    e = policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], "a", 0)
    s.runs[f"a@{e[5][2]}"] = {"id": "x", "state": "succeeded"}  # the third slot's run id taken
    assert not apply(s, commands.make("fire", now, None, entries=[e]))["ok"]
    h = s._queued[j["spec"]["queue"]][j["spec"]["priority"]]
    check_index(h)
    got = apply(s, commands.make("acquire", now, None, worker="w", queues=None, max=10, ttl=30_000, types=None))
    assert [r["id"] for r in got["runs"]] == [f"a@{e[5][0]}", f"a@{e[5][1]}"]


def test_the_fire_fast_path_puts_a_storm_into_a_heaped_list_in_order(monkeypatch):
    from raftsched.core import commands
    from core_helpers import T0, apply, new_state, put_cmd, spec_of

    monkeypatch.setattr(ReadyIndex, "sort_max", 4)  # a storm is 16 385 runs of one due
    s = new_state()
    names = [f"j{k:02d}" for k in (7, 3, 11, 0, 9, 5, 1, 10, 4, 8, 2, 6)]
    for n in names:
        apply(s, put_cmd(s, n, spec_of({"at": T0 + 10_000}), T0))
    res = apply(s, commands.make("fire", T0 + 10_000, None, entries=[
        [n, s.jobs[n]["gen"], s.jobs[n]["cursor"], T0 + 10_000, None, [T0 + 10_000], []] for n in names]))
    assert res["ok"] and res.get("fired") == len(names), res
    h = next(iter(next(iter(s._queued.values())).values()))
    check_index(h)
    assert T0 + 10_000 in h._heaped
    got = apply(s, commands.make("acquire", T0 + 10_000, None, worker="w", queues=None, max=32, ttl=30_000, types=None))
    assert [r["id"] for r in got["runs"]] == sorted(f"{n}@{T0 + 10_000}" for n in names)
    check_index(h)
