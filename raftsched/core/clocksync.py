"""Clock agreement between the members (docs/design.md, "Clocks"): the arithmetic only. Nothing
here reads a clock; every time is an argument, in milliseconds.

**The cluster's clock** is the median of the members' wall clocks. The leader measures each
follower's wall clock against its own monotonic clock on the Raft traffic that flows anyway
(replication/_clockguard.py): each append_entries carries the leader's monotonic time ``t_s``,
and the follower's answer echoes it with the follower's wall time ``w``, read between the
send and the receipt ``t_r`` of the answer. So

    q = w - (t_s + t_r) / 2        (the follower's wall clock minus the leader's monotonic clock)

is right within ``±(t_r - t_s) / 2``, half the round trip (:func:`sample`). The leader's own
``q`` is its wall clock minus its monotonic clock, read together: exact. Measured against the
leader's monotonic clock, a sample stays true when the leader's wall clock steps; a follower's
step shows as a sample whose error interval misses the older ones', which are then dropped
(:class:`PeerSamples`). Each follower's estimate is its sample with the smallest error among
those of the last ``window_ms`` (NTP's minimum filter).

Cluster time, at leader monotonic time ``t``, is ``t + median(q)`` over the leader and every
follower with a fresh estimate, provided they are a majority of the members and a majority of
the members' clocks are within the bound of that median (:func:`judge`); a leader that hears
from no majority cannot commit anything either. Each member's offset is its ``q`` minus that
median: how far its wall clock is from the cluster's, within the estimates' errors. A median is
moved by no single clock, however wrong: with three members, the one whose clock lies is the one
off the median. With two clocks apart (the third member down) their midpoint is no one's time:
there is no cluster time then, and the members go on with the last one they had (anchored on
their monotonic clocks).

Followers and remote workers learn cluster time from the leader (a node) as a lower bound: the
time a message carries was true when it left, and delivery takes time. :func:`observe` keeps an
:class:`Anchor` on the receiver's monotonic clock (the highest lower bound recently seen, taken
afresh when the source changes, when it is old, or when the source's clock went back), so a
receiver's own wall clock takes no part in it.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from . import limits

#: The states of a judgement. ``unchecked``: too few members speak the protocol (a rolling
#: upgrade from a version without it): the leader acts on its own clock, as before it.
AGREES, DISAGREES, UNKNOWN, UNCHECKED = "agrees", "disagrees", "unknown", "unchecked"

#: A peer's samples are kept this long, and its estimate is the best of them (ms).
SAMPLE_WINDOW_MS = 2_000
#: An estimate counts towards a judgement while it is at most this old (ms): the window, plus
#: the time until the next sample picks the next best (one comes every heartbeat).
ESTIMATE_AGE_MS_MAX = SAMPLE_WINDOW_MS + 1_000
#: Samples kept per peer: 10 a second arrive with the heartbeats, at most 20 under load
#: (replication/_clockguard.py STAMP_EVERY_S), so the window, or a little over a second of it.
SAMPLES_KEPT_MAX = 24
#: A round trip longer than this makes no sample (its error would exceed the bound itself).
SAMPLE_RTT_MS_MAX = 2 * limits.clock_skew_ms_max
#: Two samples of one peer whose error intervals miss each other by more than this (ms) say its
#: clock (or the measurer's monotonic clock) stepped: the older one is dropped. The slack covers
#: the wall clock's whole milliseconds.
SAMPLE_STEP_SLACK_MS = 2.0
#: An anchor is renewed from a new lower bound at least this often (ms), even if it is lower...
ANCHOR_REFRESH_MS = 1_000
#: ...and at once if it is lower than the anchor by more than this (ms): the source's clock went
#: back (another leader, another median), or the anchor was taken from a bad reading.
ANCHOR_JUMP_MS = 250
#: An anchor older than this (ms) tells nothing: the receiver has not heard from a leader for as
#: long (and its monotonic clock may have stopped meanwhile: a suspended machine).
ANCHOR_AGE_MS_MAX = 10_000

assert SAMPLE_RTT_MS_MAX / 2 <= limits.clock_skew_ms_max
assert ANCHOR_JUMP_MS < limits.clock_skew_ms_max


class Sample(NamedTuple):
    """One measurement of a peer's wall clock against the measurer's monotonic clock."""

    #: the peer's wall clock minus the measurer's monotonic clock (ms)
    q_ms: float
    #: half the round trip: ``q_ms`` is right within this (ms)
    err_ms: float
    #: the measurer's monotonic time when it was taken (ms)
    at_ms: float


def finite_number(v: object) -> bool:
    """Whether ``v`` is an int or float (not a bool) and finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def sample(sent_mono_ms: object, recv_mono_ms: float, peer_wall_ms: object,
           rtt_max_ms: float = SAMPLE_RTT_MS_MAX) -> Sample | None:
    """The sample an answer gives: it echoes ``sent_mono_ms`` (the measurer's monotonic time when
    it sent the request) and carries ``peer_wall_ms`` (the peer's wall time when it answered);
    it arrived at ``recv_mono_ms``. None for values that are not finite numbers, a negative
    round trip (not an echo of ours) or one longer than ``rtt_max_ms``: a malformed answer
    never raises."""
    if not (finite_number(sent_mono_ms) and finite_number(peer_wall_ms) and finite_number(recv_mono_ms)):
        return None
    assert isinstance(sent_mono_ms, (int, float)) and isinstance(peer_wall_ms, (int, float))
    rtt = recv_mono_ms - sent_mono_ms
    if not 0 <= rtt <= rtt_max_ms:
        return None
    return Sample(peer_wall_ms - (sent_mono_ms + recv_mono_ms) / 2, rtt / 2, recv_mono_ms)


class PeerSamples:
    """The recent samples of one peer's clock (``window_ms``, at most ``kept_max``), for its
    estimate: the sample with the smallest error among them (:meth:`best`).

    Every true sample's interval ``[q - err, q + err]`` holds the peer's real ``q``, so any two
    of them meet. When a new one misses an older one's by more than ``SAMPLE_STEP_SLACK_MS``,
    a clock stepped between them: the older ones that miss it are dropped (:meth:`add` says
    so), and the estimate follows the step at the next sample."""

    __slots__ = ("window_ms", "kept_max", "_samples")

    def __init__(self, window_ms: float = SAMPLE_WINDOW_MS, kept_max: int = SAMPLES_KEPT_MAX) -> None:
        self.window_ms = window_ms
        self.kept_max = kept_max
        self._samples: deque[Sample] = deque(maxlen=kept_max)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, s: Sample) -> bool:
        """Keep ``s``; drop the samples it outdates (older than the window, or contradicted by
        it). Returns True when it contradicted one: the peer's clock stepped."""
        kept = [o for o in self._samples if s.at_ms - o.at_ms <= self.window_ms]
        fresh = [o for o in kept if abs(o.q_ms - s.q_ms) <= o.err_ms + s.err_ms + SAMPLE_STEP_SLACK_MS]
        self._samples.clear()
        self._samples.extend(fresh)
        self._samples.append(s)
        return len(fresh) < len(kept)

    def best(self, now_ms: float) -> Sample | None:
        """The sample with the smallest error taken within the window before ``now_ms`` (the
        latest of equals), or None."""
        out: Sample | None = None
        for o in self._samples:
            if now_ms - o.at_ms <= self.window_ms and (out is None or o.err_ms <= out.err_ms):
                out = o
        return out


def median(values: Sequence[float]) -> float:
    """The median; of an even count, the mean of the two middle values."""
    if not values:
        raise ValueError("the median of nothing")
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def majority(members: int) -> int:
    return members // 2 + 1


class Judgement(NamedTuple):
    """A member's clock against the cluster's."""

    #: AGREES, DISAGREES (``|offset_ms|`` above the bound), UNKNOWN (no majority of fresh
    #: estimates, no majority of clocks within the bound of their median, or no recent word from
    #: a leader), UNCHECKED (a majority only with members that do not speak the protocol)
    state: str
    #: cluster time at ``mono_ms`` (None when unknown, or when no majority of the members' clocks
    #: is within the bound of the median)
    cluster_ms: float | None
    #: this member's wall clock minus cluster time (None when unknown)
    offset_ms: float | None
    #: the estimates' error: cluster time (and the offset) is right within this much (ms)
    err_ms: float | None
    #: the judging member's monotonic time it speaks of
    mono_ms: float
    #: on the leader: each peer with a fresh estimate -> (its offset from cluster time, error)
    peers: Mapping[str, tuple[float, float]]
    #: the bound it was judged by
    bound_ms: float


def _verdict(offset_ms: float, bound_ms: float) -> str:
    return DISAGREES if abs(offset_ms) > bound_ms else AGREES


def judge(own_wall_ms: float, own_mono_ms: float, bests: Mapping[str, Sample], members: int,
          bound_ms: float = limits.clock_skew_ms_max, window_ms: float = ESTIMATE_AGE_MS_MAX,
          unversed: int = 0, own_err_ms: float = 0.0) -> Judgement:
    """The leader's judgement of its own clock, read now (``own_wall_ms``, ``own_mono_ms``),
    given each peer's best sample (``bests``) among ``members`` (itself included).

    The estimates taken within ``window_ms`` and the leader's own make the median when they
    are a majority of ``members``; else the state is UNKNOWN, or UNCHECKED when ``unversed``
    more (peers that answer without the protocol's fields) would make one. The median is
    cluster time only when a majority of the members' clocks are within ``bound_ms`` of it:
    else (two clocks apart, the others unheard) it is no one's time and nothing says which clock
    lies: the state is UNKNOWN, ``cluster_ms`` None, and the offsets are those from the median.

    ``own_err_ms``: how far apart the two readings of the leader's own clocks may be (half the
    monotonic time that passed while its wall clock was read: :func:`paired_read`)."""
    own_q = own_wall_ms - own_mono_ms
    fresh = {p: s for p, s in bests.items() if own_mono_ms - s.at_ms <= window_ms}
    if 1 + len(fresh) < majority(members):
        state = UNCHECKED if 1 + len(fresh) + unversed >= majority(members) else UNKNOWN
        return Judgement(state, None, None, None, own_mono_ms, {}, bound_ms)
    m = median([own_q] + [s.q_ms for s in fresh.values()])
    err = max([float(own_err_ms)] + [s.err_ms for s in fresh.values()])
    offset = own_q - m
    peers = {p: (s.q_ms - m, s.err_ms) for p, s in sorted(fresh.items())}
    near = (abs(offset) <= bound_ms) + sum(1 for off, _ in peers.values() if abs(off) <= bound_ms)
    if near < majority(members):
        return Judgement(UNKNOWN, None, offset, err, own_mono_ms, peers, bound_ms)
    return Judgement(_verdict(offset, bound_ms), own_mono_ms + m, offset, err, own_mono_ms, peers, bound_ms)


# ---------------------------------------------------------------------------------------------
# The receivers' side: cluster time as a lower bound, anchored on the receiver's monotonic clock
# ---------------------------------------------------------------------------------------------

class Anchor(NamedTuple):
    """Cluster time ``cluster_ms`` was (at least) current when the receiver's monotonic clock
    read ``mono_ms``."""

    cluster_ms: float
    mono_ms: float
    #: the source's stated error, plus what the receiver knows of the delivery (ms)
    err_ms: float
    #: who said it (a leader's id, a node's URL): another source starts afresh
    source: str


def observe(cur: Anchor | None, lower_ms: object, mono_ms: float, err_ms: object, source: str, *,
            refresh_ms: float = ANCHOR_REFRESH_MS, jump_ms: float = ANCHOR_JUMP_MS) -> Anchor | None:
    """The anchor after hearing that cluster time was ``lower_ms`` when a message left
    ``source`` (received at ``mono_ms``, with the source's error ``err_ms``, or None).

    A later message is late by its delivery, never early, so the highest recent lower bound is
    the best one: the current anchor stays unless the new bound is above it (extrapolated to
    ``mono_ms``), it is older than ``refresh_ms``, it comes from another source, or the new
    bound is below it by more than ``jump_ms`` (the source's clock went back). A value that is
    not a finite number changes nothing."""
    if not finite_number(lower_ms):
        return cur
    assert isinstance(lower_ms, (int, float))
    err = float(err_ms) if isinstance(err_ms, (int, float)) and finite_number(err_ms) and err_ms >= 0 else 0.0
    new = Anchor(float(lower_ms), mono_ms, err, source)
    if cur is None or cur.source != source or mono_ms - cur.mono_ms > refresh_ms:
        return new
    extrapolated = cur.cluster_ms + (mono_ms - cur.mono_ms)
    if lower_ms > extrapolated or lower_ms < extrapolated - jump_ms:
        return new
    return cur


def observe_confirmed(cur: Anchor | None, doubt_ms: float | None, lower_ms: object, mono_ms: float, err_ms: object,
                      source: str, *, refresh_ms: float = ANCHOR_REFRESH_MS,
                      jump_ms: float = ANCHOR_JUMP_MS) -> tuple[Anchor | None, float | None]:
    """:func:`observe`, but a bound below the anchor's extrapolation by more than ``jump_ms``
    (from the anchor's source) is taken only once bounds handled at least ``refresh_ms`` apart
    say so: ``(anchor, doubt_ms)``, ``doubt_ms`` the receiver's monotonic time (ms) of the
    first such bound not yet taken (None: none pending; pass it back with the next bound).

    After its thread stalled (a pause, a long collection), a follower first handles the
    messages that waited meanwhile, each low by its age: :func:`observe` took the first as a
    source's clock gone back (or as the refresh of an anchor older than ``refresh_ms``), and the
    node stamped its commands with cluster time behind by the stall until a fresh message came
    (a job put then had its slots start before its creation). Here the anchor stays (its
    extrapolation is still a lower bound) while the bounds that waited are handled, in a burst;
    a source whose clock really went back keeps saying so, and is believed ``refresh_ms`` later.
    Any other bound clears the doubt; a value that is not a finite number changes nothing."""
    if not finite_number(lower_ms):
        return cur, doubt_ms
    assert isinstance(lower_ms, (int, float))
    if cur is not None and cur.source == source:
        if lower_ms < cur.cluster_ms + (mono_ms - cur.mono_ms) - jump_ms:
            if doubt_ms is None:
                return cur, mono_ms
            if mono_ms - doubt_ms < refresh_ms:
                return cur, doubt_ms
            return observe(cur, lower_ms, mono_ms, err_ms, source, refresh_ms=refresh_ms, jump_ms=jump_ms), None
    return observe(cur, lower_ms, mono_ms, err_ms, source, refresh_ms=refresh_ms, jump_ms=jump_ms), None


def anchor_now(a: Anchor | None, mono_ms: float, age_max_ms: float = ANCHOR_AGE_MS_MAX) -> float | None:
    """Cluster time at ``mono_ms`` from anchor ``a``; None without one, or with one older than
    ``age_max_ms`` (or from the future: another monotonic clock)."""
    if a is None or not 0 <= mono_ms - a.mono_ms <= age_max_ms:
        return None
    return a.cluster_ms + (mono_ms - a.mono_ms)


def judge_by_anchor(own_wall_ms: float, own_mono_ms: float, a: Anchor | None,
                    bound_ms: float = limits.clock_skew_ms_max,
                    age_max_ms: float = ANCHOR_AGE_MS_MAX, own_err_ms: float = 0.0) -> Judgement:
    """A follower's judgement of its own clock: its wall clock against cluster time as the
    leader's messages anchored it (UNKNOWN without a recent anchor). ``own_err_ms`` as in
    :func:`judge`."""
    now = anchor_now(a, own_mono_ms, age_max_ms)
    if now is None or a is None:
        return Judgement(UNKNOWN, None, None, None, own_mono_ms, {}, bound_ms)
    offset = own_wall_ms - now
    return Judgement(_verdict(offset, bound_ms), now, offset, a.err_ms + own_err_ms, own_mono_ms, {}, bound_ms)


#: A paired reading of the wall and monotonic clocks (:func:`paired_read`) is taken again when
#: more than this much monotonic time (ms) passed around the wall clock's reading...
PAIR_SLACK_MS = 2.0
#: ...at most this many times; the tightest one is kept.
PAIR_TRIES = 4
#: A member does not act on a judgement whose own reading is looser than this (ms): its thread
#: was stalled (a collection, the GIL held elsewhere) on every try; it judges again at its next
#: look.
PAIR_ERR_MAX_MS = 25.0


def paired_read(mono_ms: Callable[[], float], wall_ms: Callable[[], float],
                slack_ms: float = PAIR_SLACK_MS, tries: int = PAIR_TRIES) -> tuple[float, float, float]:
    """The wall clock and the monotonic clock read together: ``(mono_ms, wall_ms, err_ms)``,
    the monotonic time at the middle of the wall clock's reading and half the monotonic time
    that passed around it. A thread stalled between two readings (a garbage collection, the
    GIL held by another thread: a second or two under memory pressure) would otherwise pair a
    wall time with a monotonic time read a second earlier, and judge its own clock a second
    fast. Read again while looser than ``slack_ms``, ``tries`` times at most; the tightest."""
    best: tuple[float, float, float] | None = None
    for _ in range(max(1, tries)):
        m1 = mono_ms()
        w = wall_ms()
        m2 = mono_ms()
        got = ((m1 + m2) / 2, w, (m2 - m1) / 2)
        if best is None or got[2] < best[2]:
            best = got
        if m2 - m1 <= slack_ms:
            break
    assert best is not None
    return best
