"""The members' API URLs in the replicated state (core/members.py): announced by ``member_url``,
refused when malformed without changing anything, bounded, and in the snapshot, so replicas
restored from one stay byte-identical."""
from __future__ import annotations

import pytest

from raftsched.core import commands, members
from raftsched.core.state import SchedulerState

T0 = 1_800_000_000_000


def announce(s: SchedulerState, addr, url) -> dict:
    return s.apply_bytes(commands.encode(commands.make("member_url", T0, None, addr=addr, url=url)))


def test_an_announced_url_is_held_replaced_and_in_the_snapshot():
    s = SchedulerState()
    empty = s.snapshot()
    assert announce(s, "127.0.0.1:9701", "http://127.0.0.1:8701")["ok"]
    assert announce(s, "127.0.0.1:9702", "https://[::1]:8702")["ok"]
    assert announce(s, "127.0.0.1:9701", "http://127.0.0.1:18701")["ok"], "a node that moved announces again"
    assert members.member_urls(s) == {"127.0.0.1:9702": "https://[::1]:8702", "127.0.0.1:9701": "http://127.0.0.1:18701"}
    assert s.snapshot() != empty
    r = SchedulerState()
    r.restore(s.snapshot())
    assert members.member_urls(r) == members.member_urls(s) and r.snapshot() == s.snapshot()


@pytest.mark.parametrize("addr,url", [
    (None, "http://h:1"), ("h:1", None), ("h", "http://h:1"), ("h:1", "ftp://h:1"), ("h:1", "http://h:1/x"),
    ("h:1", "http://u@h:1"), ("h:1", "javascript:alert(1)"), ("h:1", "http://h"), (["h:1"], "http://h:1"),
    ("h:1", "http://" + "h" * 300 + ":1"), ("h 1:1", "http://h:1"), ("h:1", {"u": 1}),
])
def test_a_malformed_announcement_is_refused_and_changes_nothing(addr, url):
    s = SchedulerState()
    assert announce(s, "a:1", "http://a:2")["ok"]
    before = s.snapshot()
    res = announce(s, addr, url)
    assert not res["ok"] and res["error"]["code"] == "invalid_command", res
    assert members.member_urls(s) == {"a:1": "http://a:2"}
    r = SchedulerState()
    r.restore(before)
    r.applied = s.applied
    assert r.snapshot() == s.snapshot(), "only the count of applied commands moved"


def test_the_urls_are_bounded_oldest_announced_first(monkeypatch):
    monkeypatch.setattr("raftsched.core.limits.member_urls_max", 3)
    s = SchedulerState()
    for i in range(5):
        assert announce(s, f"h:{i}", f"http://h:{8000 + i}")["ok"]
    assert list(members.member_urls(s)) == ["h:2", "h:3", "h:4"]
