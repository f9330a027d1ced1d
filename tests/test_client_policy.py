"""raftsched/client/policy.py on a FakeClock: when a lock's lease is renewed and when it is lost,
how long a blocking acquire waits between tries, how long a release may take, and when
wait_backfill stops. No real time passes here; the lock classes that drive the policy with real
I/O are tests/test_client.py's and tests/test_async_client.py's."""
from __future__ import annotations

import pytest

from raftsched.client import LockHeld, LockLost
from raftsched.client.policy import (
    LOCK_POLL_S_MAX, LOCK_POLL_S_MIN, BackfillWait, Lease, LockPolicy, lock_poll_pause,
)
from raftsched.core.errors import Unavailable

TTL_S = 3.0


class FakeClock:
    """raftsched.clock.Clock moved by hand in float seconds (raftsched.clock.FakeClock moves by
    whole milliseconds, which cannot reach a float deadline exactly)."""

    def __init__(self) -> None:
        self.mono_s = 1000.0
        self.wall_ms = 1_800_000_000_000

    def monotonic_s(self) -> float:
        return self.mono_s

    def now_ms(self) -> int:
        return round(self.wall_ms)

    def advance(self, s: float) -> None:
        self.mono_s += s
        self.wall_ms += s * 1000


def _policy(clock: FakeClock, **kw) -> LockPolicy:
    return LockPolicy("l", "me", TTL_S, clock=clock, uniform=lambda a, b: b, **kw)


def _held(clock: FakeClock, p: LockPolicy) -> Lease:
    p.acquiring()
    return p.acquired(clock.monotonic_s(), {"token": 7, "expires_at": "t0"})


# ---------------------------------------------------------------------- renewals
def test_renewals_come_every_third_of_the_ttl_and_move_the_local_estimate():
    clock = FakeClock()
    p = _policy(clock)
    lease = _held(clock, p)
    t0 = clock.monotonic_s()
    assert lease.valid_until == t0 + TTL_S and lease.remaining_s() == TTL_S
    for k in range(1, 4):
        assert p.renew_wait_s(lease) == pytest.approx(1.0)
        clock.advance(1.0)
        assert p.renew_deadline_s(lease) == pytest.approx(TTL_S - 1.0)  # what is left of the lease
        sent = clock.monotonic_s()
        assert p.renewed(lease, sent, {"token": 7, "expires_at": f"t{k}"})
        assert lease.valid_until == pytest.approx(sent + TTL_S) and lease.renewals == k
    assert lease.expires_at == "t3" and lease.valid() and not lease.lost.is_set()


def test_a_failed_renewal_is_retried_sooner_and_the_lease_is_lost_after_a_whole_ttl_without_one():
    clock = FakeClock()
    p = _policy(clock)
    lease = _held(clock, p)
    end = lease.valid_until
    clock.advance(p.renew_wait_s(lease))
    waits = []
    for _ in range(100):
        deadline = p.renew_deadline_s(lease)
        if deadline is None:
            break
        assert deadline == pytest.approx(end - clock.monotonic_s())
        assert p.renew_failed(lease, Unavailable("no leader"))
        waits.append(p.renew_wait_s(lease))
        clock.advance(waits[-1])
    assert waits[0] == pytest.approx(0.3)  # TTL_S / 10
    assert max(waits) <= 0.3 + 1e-9
    assert clock.monotonic_s() == pytest.approx(end)  # the last wait stops at the estimate, not after
    assert lease.lost.is_set() and not lease.valid() and lease.remaining_s() == 0


def test_a_success_after_failures_goes_back_to_the_regular_interval():
    clock = FakeClock()
    p = _policy(clock)
    lease = _held(clock, p)
    clock.advance(1.0)
    assert p.renew_failed(lease, Unavailable("no leader"))
    assert p.renew_wait_s(lease) == pytest.approx(0.3)
    clock.advance(0.3)
    assert p.renewed(lease, clock.monotonic_s(), {"token": 7})
    assert p.renew_wait_s(lease) == pytest.approx(1.0)
    assert lease.expires_at == "t0"  # an answer without it keeps the last one


@pytest.mark.parametrize("outcome", [LockLost("refused"), RuntimeError("a bug"), {"token": 8}, "not json"])
def test_a_refused_renewal_an_unexpected_error_or_another_token_loses_the_lease(outcome):
    clock = FakeClock()
    p = _policy(clock)
    lease = _held(clock, p)
    clock.advance(1.0)
    if isinstance(outcome, BaseException):
        assert p.renew_failed(lease, outcome) is False
    else:
        assert p.renewed(lease, clock.monotonic_s(), outcome) is False
    assert lease.lost.is_set() and lease.renewals == 0


def test_a_lease_is_counted_from_when_its_acquire_was_sent():
    clock = FakeClock()
    p = _policy(clock)
    p.acquiring()
    sent = clock.monotonic_s()
    clock.advance(2.5)  # a slow answer
    lease = p.acquired(sent, {"token": 1})
    assert lease.remaining_s() == pytest.approx(0.5)
    assert p.renew_wait_s(lease) == pytest.approx(0.5)  # never waits past the estimate
    with pytest.raises(RuntimeError):
        p.acquiring()  # this object holds it already


# ---------------------------------------------------------------------- blocking acquire
def _held_error(clock: FakeClock, expires_in_ms: int | None) -> LockHeld:
    extra = {} if expires_in_ms is None else {"expires_at_ms": clock.now_ms() + expires_in_ms}
    return LockHeld("held", holder="other", **extra)


def test_an_acquire_that_does_not_block_gives_up_at_once():
    clock = FakeClock()
    p = _policy(clock)
    p.acquiring()
    assert p.pause_after(_held_error(clock, 300)) is None


def test_a_blocking_acquire_polls_right_after_the_holders_lease_ends_within_bounds():
    clock = FakeClock()
    p = _policy(clock, blocking=True)
    p.acquiring()
    assert p.pause_after(_held_error(clock, 300)) == pytest.approx(0.32)
    assert p.pause_after(_held_error(clock, None)) == pytest.approx(0.25)
    assert p.pause_after(_held_error(clock, 60_000)) == LOCK_POLL_S_MAX  # clocks differ: look again
    assert p.pause_after(_held_error(clock, -5_000)) == LOCK_POLL_S_MIN
    # The jitter only shortens a pause.
    e = _held_error(clock, 300)
    assert lock_poll_pause(e, 0.0, None, wall_ms=clock.now_ms(), uniform=lambda a, b: a) == pytest.approx(0.32 * 0.8)


def test_a_blocking_acquire_with_a_timeout_never_waits_past_it():
    clock = FakeClock()
    p = _policy(clock, blocking=True, timeout_s=1.5)
    p.acquiring()
    waited = 0.0
    for _ in range(100):
        pause = p.pause_after(_held_error(clock, 60_000))
        if pause is None:
            break
        waited += pause
        clock.advance(pause)
    assert waited == pytest.approx(1.5)


# ---------------------------------------------------------------------- release
@pytest.mark.parametrize("ttl_s,client_deadline_s,expected", [(10, 30, 10), (0.5, 30, 1.0), (60, 30, 30)])
def test_a_release_has_the_ttl_within_the_clients_deadline_and_at_least_a_second(ttl_s, client_deadline_s, expected):
    p = LockPolicy("l", "me", ttl_s)
    assert p.release_deadline_s(client_deadline_s) == expected
    assert p.stop_wait_s(10.0) == ttl_s + 10.0


# ---------------------------------------------------------------------- wait_backfill
def test_wait_backfill_shows_each_view_and_stops_at_a_final_state():
    seen = []
    w = BackfillWait("b1", poll_s=0.5, on_progress=seen.append, clock=FakeClock())
    assert w.done({"state": "running"}) is False
    assert w.done({"state": "paused"}) is False
    assert w.done({"state": "cancelled"}) is True
    assert [v["state"] for v in seen] == ["running", "paused", "cancelled"] and w.poll_s == 0.5


def test_wait_backfill_times_out_by_its_clock():
    clock = FakeClock()
    w = BackfillWait("b1", timeout_s=2.0, clock=clock)
    clock.advance(1.9)
    assert w.done({"state": "running"}) is False
    clock.advance(0.1)
    with pytest.raises(TimeoutError, match="b1 is still running after 2 s"):
        w.done({"state": "running"})
    assert w.done({"state": "done"}) is True  # a final view is the answer, late or not
