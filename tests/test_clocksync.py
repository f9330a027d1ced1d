"""core/clocksync.py: the clock estimator, on made-up times (no clock is read)."""
from __future__ import annotations

import math
import random

import pytest

from raftsched.core import clocksync as cs
from raftsched.core import limits

BOUND = limits.clock_skew_ms_max


def test_a_sample_is_the_peer_wall_against_the_midpoint_of_the_round_trip():
    # Sent at leader monotonic 1000, answered with wall 5_000_050, back at 1100.
    s = cs.sample(1000, 1100, 5_000_050)
    assert s == cs.Sample(5_000_050 - 1050, 50, 1100)


@pytest.mark.parametrize("sent, recv, wall", [
    ("1000", 1100, 5), (1000, 1100, None), (True, 1100, 5), (1000, 1100, float("nan")),
    (1000, 1100, float("inf")), (1200, 1100, 5),  # a negative round trip: not our echo
    (0, cs.SAMPLE_RTT_MS_MAX + 1, 5), ([1], 1100, 5), ({}, 1100, 5),
])
def test_a_malformed_or_implausible_answer_makes_no_sample(sent, recv, wall):
    assert cs.sample(sent, recv, wall) is None


def test_the_best_sample_is_the_tightest_of_the_window():
    p = cs.PeerSamples(window_ms=2000)
    p.add(cs.Sample(10.0, 5.0, 1000))
    p.add(cs.Sample(12.0, 1.0, 1100))
    p.add(cs.Sample(11.0, 3.0, 1200))
    assert p.best(1300) == cs.Sample(12.0, 1.0, 1100)
    # Out of the window: no longer the best; then nothing at all.
    assert p.best(3150) == cs.Sample(11.0, 3.0, 1200)
    assert p.best(3300) is None


def test_a_stepped_clock_drops_the_samples_it_contradicts():
    p = cs.PeerSamples()
    for k in range(5):
        assert not p.add(cs.Sample(0.0 + k % 2, 1.0, 1000 + 100 * k))
    assert p.add(cs.Sample(6000.0, 4.0, 1600))  # stepped 6 s: every older sample misses it
    assert len(p) == 1 and p.best(1600).q_ms == 6000.0
    # A wide sample that still overlaps keeps the old ones.
    q = cs.PeerSamples()
    q.add(cs.Sample(0.0, 1.0, 1000))
    assert not q.add(cs.Sample(40.0, 45.0, 1100))
    assert len(q) == 2


def test_median():
    assert cs.median([3.0]) == 3.0
    assert cs.median([5.0, 1.0, 3.0]) == 3.0
    assert cs.median([4.0, 0.0]) == 2.0
    with pytest.raises(ValueError):
        cs.median([])


def _bests(**qs: float) -> dict[str, cs.Sample]:
    return {p: cs.Sample(q, 2.0, 10_000) for p, q in qs.items()}


WALL0 = 1_800_000_000_000  # the followers' (right) wall time at leader monotonic 10_000


def test_a_leader_six_seconds_fast_disagrees_and_its_peers_agree():
    bests = _bests(b=WALL0 - 10_000, c=WALL0 - 10_000 + 3)
    j = cs.judge(WALL0 + 6000, 10_000, bests, members=3)
    assert j.state == cs.DISAGREES
    assert j.offset_ms == pytest.approx(6000 - 3)
    assert j.cluster_ms == pytest.approx(WALL0 + 3)  # the median: c's clock
    assert j.peers == {"b": (-3.0, 2.0), "c": (0.0, 2.0)}
    assert j.err_ms == 2.0


def test_a_leader_whose_peer_lies_agrees_and_names_the_liar():
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000 + 6000, c=WALL0 - 10_000 - 20), members=3)
    assert j.state == cs.AGREES and j.offset_ms == 0
    assert j.peers["b"][0] == 6000 and j.cluster_ms == WALL0


def test_the_leader_s_own_step_does_not_move_cluster_time():
    bests = _bests(b=WALL0 - 10_000, c=WALL0 - 10_000)
    before = cs.judge(WALL0, 10_000, bests, members=3)
    after = cs.judge(WALL0 + 100 + 3_600_000, 10_100, bests, members=3)  # an hour ahead, 100 ms on
    assert after.cluster_ms - before.cluster_ms == 100
    assert after.state == cs.DISAGREES and after.offset_ms == 3_600_000


def test_a_judgement_needs_a_majority_of_fresh_estimates():
    j = cs.judge(WALL0, 10_000, {}, members=3)
    assert j.state == cs.UNKNOWN and j.cluster_ms is None
    # Stale estimates do not count.
    stale = {"b": cs.Sample(WALL0 - 10_000, 1.0, 10_000 - cs.ESTIMATE_AGE_MS_MAX - 1)}
    assert cs.judge(WALL0, 10_000, stale, members=3).state == cs.UNKNOWN
    assert cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000), members=5).state == cs.UNKNOWN
    assert cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000), members=5).state == cs.AGREES
    # Peers that answer without the fields (another version) would make a majority: unchecked.
    assert cs.judge(WALL0, 10_000, {}, members=3, unversed=1).state == cs.UNCHECKED
    # A single member judges itself: it is the median.
    alone = cs.judge(WALL0 + 6000, 10_000, {}, members=1)
    assert alone.state == cs.AGREES and alone.offset_ms == 0


def test_two_clocks_that_disagree_leave_the_midpoint_and_both_off_it():
    # Three members, one down: the leader and one follower 3 s apart. Neither can be trusted, and
    # their midpoint is no one's time: no cluster time (the members keep their last one).
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000 + 3000), members=3)
    assert j.state == cs.UNKNOWN and j.offset_ms == -1500 and j.peers["b"][0] == 1500
    assert j.cluster_ms is None
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000 + 1500), members=3)
    assert j.state == cs.AGREES and j.offset_ms == -750 and j.cluster_ms == WALL0 + 750
    # Five members, two down, one liar: two of the three agree with the median, a majority of five
    # would be three: no cluster time either.
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000 + 6000), members=5)
    assert j.state == cs.UNKNOWN and j.cluster_ms is None
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000 + 6000, d=WALL0 - 10_000 + 5),
                 members=5)
    assert j.cluster_ms == pytest.approx(WALL0, abs=5)  # the mean of the middle two of four


def test_an_estimate_counts_until_the_next_sample_can_replace_it():
    """A peer's best sample may be the window's oldest: it still counts a little past the
    window, until the next sample picks the next best (the leader saw every 2 s a blip in which a
    healthy peer was not counted, and the median fell to the midpoint of two others)."""
    s = cs.Sample(WALL0 - 10_000, 1.0, 10_000 - cs.SAMPLE_WINDOW_MS - 500)
    j = cs.judge(WALL0, 10_000, {"b": s, "c": cs.Sample(WALL0 - 10_000 + 6000, 1.0, 10_000)}, members=3)
    assert j.cluster_ms == WALL0 and j.state == cs.AGREES


def test_the_bound_is_inclusive():
    j = cs.judge(WALL0 + BOUND, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000), members=3)
    assert j.state == cs.AGREES
    j = cs.judge(WALL0 + BOUND + 1, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000), members=3)
    assert j.state == cs.DISAGREES


def test_simulated_links_keep_every_estimate_within_its_error():
    """Three members with clocks off by known amounts, messages delayed at random (one way up to
    80 ms, the answer read up to 30 ms after arrival): every peer's estimate is within its stated
    error of the truth, and the judgement names the right clock."""
    rng = random.Random(7)
    for trial in range(200):
        truth = {"b": rng.uniform(-5000, 5000), "c": rng.uniform(-5000, 5000)}
        leader_off = rng.choice([0.0, rng.uniform(-8000, 8000)])
        samples = {p: cs.PeerSamples() for p in truth}
        mono = 50_000.0
        for _ in range(20):
            mono += 100
            for p, off in truth.items():
                out, think, back = rng.uniform(0, 80), rng.uniform(0, 30), rng.uniform(0, 80)
                # The leader's monotonic clock reads mono; true time there is WALL0 + mono.
                peer_wall = round(WALL0 + mono + out + think + off)
                s = cs.sample(mono, mono + out + think + back, peer_wall)
                if s is not None:
                    samples[p].add(s)
        t = mono + 200
        bests = {p: ps.best(t) for p, ps in samples.items()}
        for p, s in bests.items():
            real_q = WALL0 + truth[p]
            assert abs(s.q_ms - real_q) <= s.err_ms + 1, (trial, p)
        j = cs.judge(WALL0 + t + leader_off, t, bests, members=3)
        real = cs.median([leader_off, truth["b"], truth["c"]])
        assert abs(j.offset_ms - (leader_off - real)) <= j.err_ms + 1
        near = sum(abs(x - real) <= BOUND for x in (leader_off, truth["b"], truth["c"]))
        if j.cluster_ms is not None:
            assert j.state in (cs.AGREES, cs.DISAGREES)
            assert abs((j.cluster_ms - t - WALL0) - real) <= j.err_ms + 1
            assert near >= 2 or min(abs(abs(x - real) - BOUND) for x in (leader_off, *truth.values())) <= j.err_ms + 1
        else:
            assert j.state == cs.UNKNOWN
            assert near < 2 or min(abs(abs(x - real) - BOUND) for x in (leader_off, *truth.values())) <= j.err_ms + 1
            continue
        if abs(leader_off - real) > BOUND + j.err_ms + 1:
            assert j.state == cs.DISAGREES
        elif abs(leader_off - real) < BOUND - j.err_ms - 1:
            assert j.state == cs.AGREES


def test_an_anchor_keeps_the_highest_recent_lower_bound():
    a = cs.observe(None, 1000.0, 10.0, 3, "L1")
    assert a == cs.Anchor(1000.0, 10.0, 3.0, "L1")
    # A later message delayed more gives a lower bound below the extrapolation: the anchor stays.
    assert cs.observe(a, 1080.0, 100.0, 3, "L1") is a
    # One delayed less tightens it.
    b = cs.observe(a, 1095.0, 100.0, 3, "L1")
    assert b.cluster_ms == 1095.0
    assert cs.anchor_now(b, 150.0) == 1145.0
    # Another source, or an old anchor, is replaced.
    assert cs.observe(b, 900.0, 101.0, 3, "L2").source == "L2"
    assert cs.observe(b, 900.0, 100.0 + cs.ANCHOR_REFRESH_MS + 1, 3, "L1").cluster_ms == 900.0
    # A source whose clock went back by more than the jump bound is believed at once.
    assert cs.observe(b, 1095.0 + 10 - cs.ANCHOR_JUMP_MS - 1, 110.0, 3, "L1").cluster_ms < 1000


@pytest.mark.parametrize("bad", [None, "12", True, float("nan"), float("-inf"), [1]])
def test_an_anchor_ignores_a_malformed_time(bad):
    a = cs.Anchor(1000.0, 10.0, 0.0, "L1")
    assert cs.observe(a, bad, 20.0, 0, "L1") is a
    assert cs.observe(None, bad, 20.0, 0, "L1") is None
    assert cs.observe(None, 5.0, 20.0, bad, "L1").err_ms == 0.0


def test_an_anchor_ages_out():
    a = cs.Anchor(1000.0, 10.0, 0.0, "L1")
    assert cs.anchor_now(a, 10.0 + cs.ANCHOR_AGE_MS_MAX) == 1000.0 + cs.ANCHOR_AGE_MS_MAX
    assert cs.anchor_now(a, 11.0 + cs.ANCHOR_AGE_MS_MAX) is None
    assert cs.anchor_now(a, 9.0) is None  # another monotonic clock
    assert cs.anchor_now(None, 9.0) is None


def test_a_follower_judges_its_wall_clock_against_its_anchor():
    a = cs.Anchor(WALL0, 10_000.0, 4.0, "L1")
    j = cs.judge_by_anchor(WALL0 + 6100, 10_100.0, a)
    assert j.state == cs.DISAGREES and j.offset_ms == 6000 and j.cluster_ms == WALL0 + 100
    assert cs.judge_by_anchor(WALL0 + 100, 10_100.0, a).state == cs.AGREES
    assert cs.judge_by_anchor(WALL0, 10_000.0 + cs.ANCHOR_AGE_MS_MAX + 1, a).state == cs.UNKNOWN
    assert cs.judge_by_anchor(WALL0, 10_000.0, None).cluster_ms is None
    assert math.isclose(cs.judge_by_anchor(WALL0, 10_000.0, a).err_ms, 4.0)


def test_a_paired_read_is_taken_again_while_a_stall_separates_its_readings():
    """The wall clock is read between two monotonic readings; a pair they show stalled (a
    collection, the GIL elsewhere) is read again, and the tightest one kept."""
    t = [1000.0]
    stalls = [1760.0, 0.0]

    def mono():
        return t[0]

    def wall():
        t[0] += stalls.pop(0) if stalls else 0.5
        return 5_000_000 + t[0]

    m, w, err = cs.paired_read(mono, wall)
    assert w - m == 5_000_000 and err == 0  # the second pair, not the stalled first one
    # A stall on every try: the tightest pair, and its error says how loose it is.
    t[0], stalls[:] = 0.0, [900.0, 300.0, 400.0, 800.0]
    m, w, err = cs.paired_read(mono, wall)
    assert (m, err) == (900 + 150, 150) and abs(w - m - 5_000_000) <= err
    assert err > cs.PAIR_ERR_MAX_MS


def test_the_readings_error_widens_a_judgement():
    j = cs.judge(WALL0, 10_000, _bests(b=WALL0 - 10_000, c=WALL0 - 10_000), members=3, own_err_ms=40)
    assert j.state == cs.AGREES and j.err_ms == 40
    a = cs.Anchor(WALL0, 10_000, 3.0, "n1")
    assert cs.judge_by_anchor(WALL0 + 5, 10_005, a, own_err_ms=2).err_ms == 5


def test_bounds_that_waited_out_a_stall_do_not_pull_the_anchor_back():
    """After a follower's thread stalled (6 s here), the messages that waited are handled first,
    each bound low by its age: the anchor stays (its extrapolation is a lower bound still) while
    they are handled, and a fresh bound takes over. observe alone took the first stale bound, and
    cluster time fell 5.7 s behind (a job put then had slots before its creation)."""
    a = cs.observe(None, 1000.0, 10.0, 3, "L1")
    assert cs.anchor_now(cs.observe(a, 1300.0, 6010.0, 3, "L1"), 6010.0) == 1300.0  # (what it was)
    doubt = None
    for k, mono in enumerate((6010.0, 6011.0, 6012.0)):  # the burst of waiting messages
        b, doubt = cs.observe_confirmed(a, doubt, 1300.0 + 1000 * k, mono, 3, "L1")
        assert b is a and doubt == 6010.0
        assert cs.anchor_now(b, mono) == 1000.0 + mono - 10.0
    for bad in (None, float("nan")):  # not a bound: the doubt stays
        assert cs.observe_confirmed(a, doubt, bad, 6013.0, 3, "L1") == (a, 6010.0)
    b, doubt = cs.observe_confirmed(a, doubt, 7000.0, 6013.0, 3, "L1")  # a fresh one
    assert doubt is None and b.cluster_ms == 7000.0 and b.mono_ms == 6013.0


def test_a_source_whose_clock_went_back_is_believed_once_it_keeps_saying_so():
    """A bound far below the anchor from its source, said again and again (every 50 ms here):
    believed once bounds ANCHOR_REFRESH_MS apart say so; another source is believed at once."""
    a = cs.observe(None, 1000.0, 0.0, 3, "L1")
    doubt = None
    for mono in range(50, 50 + cs.ANCHOR_REFRESH_MS, 50):
        b, doubt = cs.observe_confirmed(a, doubt, 1000.0 + mono - 2000, float(mono), 3, "L1")
        assert b is a and doubt == 50.0
    b, doubt = cs.observe_confirmed(a, doubt, 1000.0 + 1050 - 2000, 1050.0, 3, "L1")
    assert doubt is None and cs.anchor_now(b, 1050.0) == 50.0
    # Another source starts afresh, and a bound near the extrapolation clears a doubt.
    assert cs.observe_confirmed(a, 400.0, 0.0, 500.0, 3, "L2")[0].source == "L2"
    b, doubt = cs.observe_confirmed(a, 400.0, 1490.0, 500.0, 3, "L1")
    assert b is a and doubt is None


def test_the_guard_stamps_cluster_time_from_before_a_stall():
    """The follower's guard (replication/_clockguard.py) keeps its anchor through the messages
    that waited out a stall: cluster time, what its node stamps commands with, stays right."""
    from raftsched.replication._clockguard import ClockGuard
    g = ClockGuard(object())
    g.on_append("L1", [0, 1_000_000.0, 3], 0.010)
    for k in range(5):  # resumed at 6.010 s: the stamps sent in the pause, oldest first
        g.on_append("L1", [0, 1_000_300.0 + 1000 * k, 3], 6.010 + k / 1000)
        assert g.cluster_ms(6.015) == 1_006_005
    g.on_append("L1", [0, 1_006_020.0, 3], 6.020)  # fresh
    assert g.cluster_ms(6.030) == 1_006_030
