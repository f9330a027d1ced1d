"""Sections of the state added after snapshot version 3 (core/snapshot.py, "Version 4").

A state that uses none of them snapshots to exactly the version 3 bytes (the fixture test checks
those bytes against today's code); a non-empty section makes the snapshot version 4 and round
trips; a snapshot holding a section this code does not know is refused, not half-restored.
"""
from __future__ import annotations

import msgpack
import pytest

from raftsched.core import snapshot
from raftsched.core.state import SchedulerState

from core_helpers import SEC, T0, new_state, spec_of, tick


@pytest.fixture
def section():
    """A registered section "notes": a dict, written sorted, with a derived count."""
    def rebuild(s):
        s.notes_count = len(s.notes)
    ext = snapshot.register(snapshot.Extension(
        name="notes", new=dict, encode=lambda d: sorted(d.items()) or None,
        decode=lambda data: dict(data), rebuild=rebuild))
    try:
        yield ext
    finally:
        del snapshot.EXTENSIONS["notes"]


def _state():
    s = new_state(("a", spec_of({"every_s": 10}, "skip")))
    tick(s, T0 + 10 * SEC)
    return s


def test_an_empty_section_leaves_the_version_3_bytes(section):
    before = SchedulerState()
    without = _state().snapshot()
    del snapshot.EXTENSIONS["notes"]
    try:
        plain = _state().snapshot()
    finally:
        snapshot.EXTENSIONS["notes"] = section
    assert without == plain
    assert msgpack.unpackb(without, raw=False, strict_map_key=False)["v"] == 3
    assert before.notes == {}


def test_a_section_with_data_makes_version_4_and_round_trips(section):
    s = _state()
    s.notes["b"] = 2
    s.notes["a"] = 1
    data = s.snapshot()
    obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert obj["v"] == 4 and obj["ext"] == {"notes": [["a", 1], ["b", 2]]}
    r = SchedulerState()
    r.restore(data)
    assert r.notes == {"a": 1, "b": 2} and r.notes_count == 2
    assert r.snapshot() == data
    # Restoring a snapshot without the section empties it.
    r.restore(_state().snapshot())
    assert r.notes == {} and r.notes_count == 0


def test_a_snapshot_with_an_unknown_section_is_refused_and_changes_nothing(section):
    s = _state()
    s.notes["x"] = 1
    data = s.snapshot()
    del snapshot.EXTENSIONS["notes"]
    try:
        r = _state()
        before = r.snapshot()
        with pytest.raises(ValueError, match="notes"):
            r.restore(data)
        assert r.snapshot() == before
    finally:
        snapshot.EXTENSIONS["notes"] = section


def test_a_section_cannot_shadow_a_field_or_another_section(section):
    with pytest.raises(ValueError):
        snapshot.register(snapshot.Extension(name="jobs", new=dict, encode=lambda d: None, decode=dict))
    with pytest.raises(ValueError):
        snapshot.register(snapshot.Extension(name="notes", new=dict, encode=lambda d: None, decode=dict))
