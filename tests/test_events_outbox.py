"""The replicated outbox (core/events.py): ids, bound, and its place in the snapshot."""
from __future__ import annotations

import pytest

from raftsched.core import events, limits
from raftsched.core.state import SchedulerState


def test_emit_numbers_events_and_the_snapshot_keeps_them() -> None:
    s = SchedulerState()
    empty = s.snapshot()
    ev = events.emit(s, "run.dead", 1000, job="a", tenant=None, slot=60_000, run_id="a@60000",
                     attempt=3, reason="exit 1", queue="default")
    assert events.view(ev) == {"event_id": "ev-1", "seq": 1, "kind": "run.dead", "at": 1000, "job": "a",
                               "tenant": None, "slot": 60_000, "run_id": "a@60000", "attempt": 3,
                               "reason": "exit 1", "queue": "default"}
    assert s.snapshot() != empty
    r = SchedulerState()
    r.restore(s.snapshot())
    assert r.outbox == s.outbox and r.snapshot() == s.snapshot()


def test_the_outbox_is_bounded_and_ids_never_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "outbox_events_max", 3)
    s = SchedulerState()
    for i in range(5):
        events.emit(s, "slot.missed", i, job="j", reason="skipped")
    assert [e["seq"] for e in s.outbox.events] == [3, 4, 5] and s.outbox.first_seq() == 3
    r = SchedulerState()
    r.restore(s.snapshot())
    events.emit(r, "slot.missed", 9, job="j")
    assert r.outbox.events[-1]["seq"] == 6


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        events.emit(SchedulerState(), "run.exploded", 0)
