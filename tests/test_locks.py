"""Named locks with fencing tokens (raftsched/core/locks.py): acquire, renew, release, and
expiry by the leader's reaper."""
from __future__ import annotations

import pytest

from raftsched.core import commands

from core_helpers import SEC, T0, new_state
from exec_helpers import TTL, acq, do, jspec, reap, refused, trig


# ============================================================================ locks
def test_lock_acquire_returns_a_token_and_a_second_owner_gets_a_conflict_naming_the_holder():
    s = new_state()
    res = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)
    assert res == {"ok": True, "lock": "L", "owner": "o1", "token": 1, "deadline": T0 + 5 * SEC}
    err = refused(s, commands.make("lock_acquire", T0 + 5 * SEC, None, name="L", owner="o2", ttl=5 * SEC), "conflict")
    assert err["error"]["holder"] == "o1" and err["error"]["expires_at_ms"] == T0 + 5 * SEC
    # the holder itself cannot take it twice either
    refused(s, commands.make("lock_acquire", T0 + 5 * SEC, None, name="L", owner="o1", ttl=5 * SEC), "conflict")


def test_lock_renew_with_its_token_extends_and_stale_tokens_conflict():
    s = new_state()
    tok = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)["token"]
    res = do(s, "lock_renew", T0 + 4 * SEC, name="L", token=tok, ttl=10 * SEC)
    assert res == {"ok": True, "lock": "L", "token": tok, "deadline": T0 + 14 * SEC}
    assert do(s, "lock_renew", T0 + 5 * SEC, name="L", token=tok)["deadline"] == T0 + 15 * SEC
    # A shorter TTL brings the deadline in: the leader expires the lock that long after this renew.
    assert do(s, "lock_renew", T0 + 6 * SEC, name="L", token=tok, ttl=2 * SEC)["deadline"] == T0 + 8 * SEC
    assert s.locks["L"]["deadline"] == T0 + 8 * SEC and s.locks["L"]["ttl"] == 2 * SEC
    for op in ("lock_renew", "lock_release"):
        err = refused(s, commands.make(op, T0 + 5 * SEC, None, name="L", token=tok - 1), "conflict")
        assert err["error"]["holder"] == "o1"
        refused(s, commands.make(op, T0 + 5 * SEC, None, name="M", token=tok), "conflict")
    assert do(s, "lock_release", T0 + 5 * SEC, name="L", token=tok)["released"] is True
    assert s.locks == {}
    refused(s, commands.make("lock_release", T0 + 5 * SEC, None, name="L", token=tok), "conflict")


def test_an_expired_lock_goes_to_another_owner_with_a_higher_token():
    s = new_state(("a", jspec()))
    t1 = do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)["token"]
    trig(s, "a", T0)
    (g,) = acq(s, T0)
    # Past its deadline the lock is still held until the reaper releases it: a command's now may
    # come from a node whose clock runs fast, so it does not decide.
    err = refused(s, commands.make("lock_acquire", T0 + 5 * SEC + 1, None, name="L", owner="o2", ttl=5 * SEC),
                  "conflict")
    assert err["error"]["holder"] == "o1"
    assert reap(s, T0 + 5 * SEC + 1)["released"] == ["L"]
    res = do(s, "lock_acquire", T0 + 5 * SEC + 1, name="L", owner="o2", ttl=5 * SEC)
    assert res["ok"] and res["owner"] == "o2" and res["token"] > g["token"] > t1
    # the old owner's token no longer holds it
    refused(s, commands.make("lock_renew", T0 + 5 * SEC + 1, None, name="L", token=t1), "conflict")
    refused(s, commands.make("lock_release", T0 + 5 * SEC + 1, None, name="L", token=t1), "conflict")
    assert s.locks["L"]["owner"] == "o2"


@pytest.mark.parametrize("op,fields", [
    ("lock_acquire", {"name": "L", "owner": "o"}),
    ("lock_acquire", {"name": "", "owner": "o", "ttl": TTL}),
    ("lock_acquire", {"name": "L", "owner": "", "ttl": TTL}),
    ("lock_acquire", {"name": "L", "owner": "o", "ttl": 1}),
    ("lock_renew", {"name": 5, "token": 1}),
    ("lock_renew", {"name": "L", "token": 1, "ttl": 10 ** 9}),
])
def test_lock_malformed_is_refused(op, fields):
    s = new_state()
    do(s, "lock_acquire", T0, name="L", owner="o1", ttl=5 * SEC)
    refused(s, commands.make(op, T0, None, **fields), "invalid_command")


@pytest.mark.parametrize("body,message", [
    ({}, "is required"),
    ({"token": 2**64}, "must be the fencing token acquire returned"),
    ({"token": 0}, "must be the fencing token acquire returned"),
    ({"token": "7"}, "must be the fencing token acquire returned"),
    ({"token": True}, "must be the fencing token acquire returned"),
])
def test_a_release_or_renew_token_given_wrong_says_so_not_that_it_is_missing(body, message):
    """A token out of range was refused as "is required", though the body held one."""
    from raftsched.core import bodies
    from raftsched.core.errors import InvalidSpec
    for validate in (bodies.validate_lock_release, bodies.validate_lock_renew):
        b = dict(body, ttl_s=5) if validate is bodies.validate_lock_renew else body
        with pytest.raises(InvalidSpec) as ei:
            validate("l", b)
        assert ei.value.field == "token" and ei.value.message.startswith(message), ei.value.message
