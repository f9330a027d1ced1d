"""API tokens in the replicated state (core/tokens.py): what token_create and token_revoke
store, what they refuse (changing nothing), the bound on the table, and the snapshot section."""
from __future__ import annotations

import msgpack
import pytest

from raftsched.core import commands, limits, queries
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, new_state, put_cmd, spec_of

SALT, DIGEST = b"s" * 16, b"d" * 32
HASH = {"alg": "hmac-sha256", "salt": SALT, "digest": DIGEST}


def create(s, tid="0123456789abcdef", now=T0, rid=None, **fields):
    f = {"id": tid, "role": "operator", "tenants": None, "expires": None, "hash": HASH}
    f.update(fields)
    return s.apply_bytes(commands.encode(commands.make("token_create", now, rid, **f)))


def revoke(s, tid, now=T0):
    return s.apply_bytes(commands.encode(commands.make("token_revoke", now, None, id=tid)))


def test_create_stores_the_hash_and_never_a_secret_and_lists_without_it():
    s = new_state()
    res = create(s, tenants=["billing", "app"], expires=T0 + 60 * SEC, note="ci")
    assert res == {"ok": True, "id": "0123456789abcdef"}
    assert s.tokens["0123456789abcdef"] == {
        "role": "operator", "tenants": ["app", "billing"], "created": T0, "expires": T0 + 60 * SEC,
        "hash": HASH, "revoked": None, "note": "ci"}
    listed = queries.token_list(s)
    assert listed == [{"id": "0123456789abcdef", "role": "operator", "tenants": ["app", "billing"], "workers": None,
                       "jobs": None, "created": T0, "expires": T0 + 60 * SEC, "revoked": None, "note": "ci"}]
    assert queries.token_auth(s, "0123456789abcdef") == ("operator", ("app", "billing"), T0 + 60 * SEC, HASH, None)
    assert queries.token_auth(s, "ffffffffffffffff") is None


def test_revoke_drops_the_hash_and_is_refused_by_token_auth_everywhere():
    s = new_state()
    create(s)
    assert revoke(s, "0123456789abcdef", T0 + SEC) == {"ok": True, "id": "0123456789abcdef", "revoked": T0 + SEC}
    assert s.tokens["0123456789abcdef"]["hash"] is None
    assert queries.token_auth(s, "0123456789abcdef") is None
    assert queries.token_list(s)[0]["revoked"] == T0 + SEC
    # Again: nothing changes (the first revocation time stays).
    assert revoke(s, "0123456789abcdef", T0 + 2 * SEC)["revoked"] == T0 + SEC
    res = revoke(s, "ffffffffffffffff")
    assert res["ok"] is False and res["error"]["code"] == "not_found"


@pytest.mark.parametrize("fields", [
    {"id": "short"}, {"id": "0123456789ABCDEF"}, {"id": 5}, {"id": None},
    {"role": "root"}, {"role": None},
    {"tenants": "billing"}, {"tenants": []}, {"tenants": ["a", "a"]}, {"tenants": ["../x"]},
    {"tenants": [1]}, {"tenants": ["x" * 65]}, {"tenants": [f"t{i}" for i in range(limits.token_tenants_max + 1)]},
    {"role": "admin", "tenants": ["billing"]},
    {"role": "operator", "workers": ["w1"]}, {"role": "admin", "workers": ["w1"]},
    {"role": "worker", "workers": []}, {"role": "worker", "workers": "w1"}, {"role": "worker", "workers": ["w1", "w1"]},
    {"role": "worker", "workers": ["-bad"]}, {"role": "worker", "workers": [7]},
    {"role": "worker", "workers": [f"w{i}" for i in range(limits.token_workers_max + 1)]},
    {"tenants": [["billing"]]}, {"role": "worker", "workers": [["w1"]]}, {"role": "worker", "workers": [{}]},
    {"expires": -1}, {"expires": "tomorrow"}, {"expires": True},
    {"note": 5}, {"note": "x" * (limits.token_note_chars_max + 1)},
    {"hash": None}, {"hash": {"alg": "md5", "salt": SALT, "digest": DIGEST}},
    {"hash": {"alg": "hmac-sha256", "salt": SALT[:4], "digest": DIGEST}},
    {"hash": {"alg": "hmac-sha256", "salt": "s" * 16, "digest": DIGEST}},
    {"hash": {"alg": "hmac-sha256", "salt": SALT, "digest": DIGEST, "secret": "x"}},
])
def test_malformed_creates_are_refused_and_change_nothing(fields):
    s = new_state()
    s.apply_bytes(commands.encode(commands.make("noop", T0)))
    before = s.snapshot()
    res = create(s, **fields)
    assert res["ok"] is False and res["error"]["code"] == "invalid_command", res
    assert "could not be applied" not in res["error"]["message"], "refused by the check, not by a crash"
    s.applied -= 1  # the refusal is counted; nothing else changed
    assert s.snapshot() == before


def test_an_existing_id_is_refused():
    s = new_state()
    create(s)
    res = create(s, role="admin")
    assert res["ok"] is False and s.tokens["0123456789abcdef"]["role"] == "operator"


def test_a_full_table_gives_up_the_oldest_revoked_then_the_oldest_expired_else_refuses(monkeypatch):
    monkeypatch.setattr(limits, "tokens_max", 3)
    s = new_state()
    create(s, f"{1:016x}", expires=T0 + 5 * SEC)
    create(s, f"{2:016x}", expires=T0 + 2 * SEC)
    create(s, f"{3:016x}")
    # Full, every token live: refused.
    res = create(s, f"{4:016x}", now=T0 + SEC)
    assert res["error"]["code"] == "limit_exceeded"
    # Two expired by state time: the one that expired first goes.
    assert create(s, f"{4:016x}", now=T0 + 10 * SEC)["ok"]
    assert sorted(s.tokens) == [f"{i:016x}" for i in (1, 3, 4)]
    # A revoked one goes before an expired one.
    revoke(s, f"{3:016x}", T0 + 11 * SEC)
    assert create(s, f"{5:016x}", now=T0 + 12 * SEC)["ok"]
    assert sorted(s.tokens) == [f"{i:016x}" for i in (1, 4, 5)]


def test_tokens_snapshot_as_a_version_4_section_and_replicas_agree():
    a, b = new_state(("j", spec_of({"every_s": 10}, "skip"))), new_state(("j", spec_of({"every_s": 10}, "skip")))
    assert msgpack.unpackb(a.snapshot(), raw=False, strict_map_key=False)["v"] == 3, "no tokens: version 3 bytes"
    # The same commands, in another insertion order of nothing: the section is sorted by id.
    for s in (a, b):
        create(s, f"{9:016x}", rid="r9")
        create(s, f"{2:016x}", role="reader", tenants=["x"], rid="r2")
        revoke(s, f"{9:016x}", T0 + SEC)
    data = a.snapshot()
    assert data == b.snapshot()
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert obj["v"] == 4 and [row[0] for row in obj["ext"]["tokens"]] == [f"{2:016x}", f"{9:016x}"]
    r = SchedulerState()
    r.restore(data)
    assert r.tokens == a.tokens and r.snapshot() == data
    # Further commands give the same state on the restored replica and the original.
    for s in (a, r):
        create(s, f"{3:016x}", now=T0 + 2 * SEC)
        s.apply_bytes(commands.encode(put_cmd(s, "k", spec_of({"every_s": 5}, "skip"), T0 + 2 * SEC)))
    assert a.snapshot() == r.snapshot()


def test_a_worker_token_may_be_limited_to_tenants_and_bound_to_worker_ids():
    s = new_state()
    assert create(s, role="worker", tenants=["billing"], workers=["w2", "w1"])["ok"]
    rec = s.tokens["0123456789abcdef"]
    assert rec["tenants"] == ["billing"] and rec["workers"] == ["w1", "w2"]
    assert queries.token_auth(s, "0123456789abcdef") == ("worker", ("billing",), None, HASH, ("w1", "w2"))
    assert queries.token_list(s)[0]["workers"] == ["w1", "w2"]


def test_bound_tokens_snapshot_their_ids_and_unbound_ones_snapshot_as_before():
    a = new_state()
    create(a, f"{1:016x}", role="reader")
    before = msgpack.unpackb(a.snapshot(), raw=False, strict_map_key=False)["ext"]["tokens"]
    assert len(before[0]) == 8, "an unbound token's row: the id and the seven fields of before"
    create(a, f"{2:016x}", role="worker", workers=["w1"])
    data = a.snapshot()
    rows = msgpack.unpackb(data, raw=False, strict_map_key=False)["ext"]["tokens"]
    assert rows[0] == before[0] and rows[1][-1] == ["w1"]
    r = SchedulerState()
    r.restore(data)
    assert r.tokens == a.tokens and "workers" not in r.tokens[f"{1:016x}"] and r.snapshot() == data


def test_a_ping_token_is_bound_to_jobs_and_its_binding_survives_a_snapshot():
    s = new_state()
    assert create(s, role="ping", jobs=["nightly", "backup"])["ok"]
    assert queries.token_auth_jobs(s, "0123456789abcdef")[5] == ("backup", "nightly")
    for bad in ({"role": "ping"}, {"role": "operator", "jobs": ["a"]}, {"role": "ping", "jobs": ["a", "a"]},
                {"role": "ping", "jobs": []}):
        res = create(s, tid="fedcba9876543210", **bad)
        assert not res["ok"] and res["error"]["code"] == "invalid_command", bad
    r = SchedulerState()
    r.restore(s.snapshot())
    assert r.tokens == s.tokens and r.snapshot() == s.snapshot()
