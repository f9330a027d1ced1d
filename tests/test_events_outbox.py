"""The replicated outbox (core/events.py): ids, bound, and its place in the snapshot."""
from __future__ import annotations

import pytest

from raftsched.core import commands, events, limits
from raftsched.core.notify_model import JOB_KINDS
from raftsched.core.state import SchedulerState


def listening(s: SchedulerState, tenant: str = "t") -> None:
    """A sink ``ops`` that the tenant's jobs send every kind to (an event nobody is sent is not kept)."""
    spec = {"type": "webhook", "url": "http://127.0.0.1:1/", "secrets": {"signing_key": "k"},
            "retry": {"max_attempts": 1, "backoff_s": 0, "backoff_max_s": 0}}
    assert s.apply(commands.put_sink(1, None, name="ops", spec=spec))["ok"]
    route = {"sink": "ops", "on": list(JOB_KINDS), "after_consecutive": 1, "repeat_every_s": 0}
    assert s.apply(commands.put_tenant_notify(1, None, name=tenant, notify=[route]))["ok"]


def test_emit_numbers_events_and_the_snapshot_keeps_them() -> None:
    s = SchedulerState()
    listening(s)
    empty = s.snapshot()
    ev = events.emit(s, "run.dead", 1000, job="a", tenant="t", slot=60_000, run_id="a@60000",
                     attempt=3, reason="exit 1", queue="default")
    assert events.view(ev) == {"event_id": "ev-1", "seq": 1, "kind": "run.dead", "at": 1000, "job": "a",
                               "tenant": "t", "slot": 60_000, "run_id": "a@60000", "attempt": 3,
                               "reason": "exit 1", "queue": "default"}
    assert s.snapshot() != empty
    r = SchedulerState()
    r.restore(s.snapshot())
    assert r.outbox == s.outbox and r.snapshot() == s.snapshot()


def test_the_outbox_is_bounded_and_ids_never_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "outbox_events_max", 3)
    s = SchedulerState()
    listening(s)
    for i in range(5):
        events.emit(s, "slot.missed", i, job="j", tenant="t", reason="skipped")
    assert [e["seq"] for e in s.outbox.events] == [3, 4, 5] and s.outbox.first_seq() == 3
    r = SchedulerState()
    r.restore(s.snapshot())
    events.emit(r, "slot.missed", 9, job="j", tenant="t")
    assert r.outbox.events[-1]["seq"] == 6


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        events.emit(SchedulerState(), "run.exploded", 0)


def test_an_event_no_sink_is_sent_is_not_kept() -> None:
    s = SchedulerState()
    empty = s.snapshot()
    ev = events.emit(s, "run.dead", 1000, job="a", tenant="t")
    assert ev["seq"] == 0 and ev["to"] == [] and s.snapshot() == empty
    listening(s, tenant="other")
    ev = events.emit(s, "run.dead", 1000, job="a", tenant="t")
    assert ev["seq"] == 0 and not s.outbox.events
