"""The max_since_success_s index (core/deadlines.py, Book._since_heap) stays bounded: each put of
a job with the deadline, each success, each fire that starts a watch and each sweep's put-back
pushes an entry, and a follower never sweeps, so without a rebuild the entries a push replaced
stayed for good (config management re-putting the same spec grew it on every replica)."""
from __future__ import annotations

from raftsched.core import commands, deadlines, limits

from core_helpers import HOUR, SEC, T0, apply, new_state, put_cmd, restored
from test_core_deadlines import acquire, complete, spec, tick

BOUND = 2 + limits.queue_index_stale_slack  # 2 * one watched job + the slack


def test_re_putting_a_watched_job_keeps_its_index_bounded_and_its_sweep_on_time():
    sp = spec({"every_s": 3600}, {"max_since_success_s": 3600})
    s = new_state(("j", sp))
    for i in range(3000):
        assert apply(s, put_cmd(s, "j", sp, T0 + i * SEC))["ok"]
    assert len(s.deadlines._since_heap) <= BOUND
    # Watched from the first put: the sweep an hour later names it, on this replica and a restored one.
    late = T0 + HOUR + SEC
    assert deadlines.due(s, late, 10)[1] == ["j"]
    assert deadlines.due(restored(s), late, 10)[1] == ["j"]


def test_successes_and_put_backs_keep_the_index_bounded():
    sp = spec({"every_s": 60}, {"max_since_success_s": 3600})
    s = new_state(("j", sp))
    now = T0
    for _ in range(1500):
        now += 60 * SEC
        tick(s, now)
        for g in acquire(s, now + 1):
            complete(s, now + 2, g, True)
        assert len(s.deadlines._since_heap) <= BOUND
    rids, names = deadlines.due(s, now + 2 * HOUR, 10)
    assert names == ["j"]
    for _ in range(3000):  # a leader whose judge never commits puts the job back every sweep
        deadlines.repush(s, rids, names)
    assert len(s.deadlines._since_heap) <= BOUND
    res = apply(s, commands.deadline_judge(now + 2 * HOUR, runs=[], jobs=deadlines.due(s, now + 2 * HOUR, 10)[1]))
    assert res["ok"], res
