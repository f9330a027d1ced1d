"""The outcomes a worker reports (``results`` of POST /v1/workers/{id}/complete, and carried by a
lease request): node/fleet.py reads a plain outcome on a short path, and must accept exactly
what its field-by-field checks (``_result_checked``) accept, build the same item, and leave every
other item to them, so that a bad one is refused with the same field and message."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core.errors import InvalidSpec
from raftsched.node.fleet import RESULT_FIELDS, _result_checked, _results

# Values JSON gives, and some it does not (a bool where an int goes, a str subclass, a float, an
# int past 63 bits), for every field a result may have, and one it may not.
_STR = st.one_of(st.text(max_size=4), st.builds(type("Text", (str,), {}), st.text(max_size=3)))
_INT = st.one_of(st.integers(min_value=-2, max_value=3), st.sampled_from([2**63 - 1, 2**63, -(2**63)]))
_ANY = st.one_of(st.none(), st.booleans(), _INT, st.floats(allow_nan=True), _STR,
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
_FIELD = {
    "run": st.one_of(_STR, _ANY),
    "token": st.one_of(_INT, _ANY),
    "success": st.one_of(st.booleans(), _ANY),
    "error": st.one_of(st.none(), _STR, _ANY),
    "output": st.one_of(st.none(), _STR, _ANY),
    "result": st.one_of(st.none(), _ANY),
    "extra": _ANY,
}


@st.composite
def _item(draw):
    if draw(st.integers(0, 9)) == 0:
        return draw(_ANY)  # not an object at all
    keys = draw(st.sets(st.sampled_from(sorted(_FIELD)), max_size=len(_FIELD)))
    if draw(st.booleans()):  # mostly plain outcomes, the short path's case
        keys |= {"run", "token", "success"}
        keys.discard("extra")
    return {k: draw(_FIELD[k]) for k in sorted(keys)}


def _checked(items):
    out = []
    for k, it in enumerate(items):
        out.append(_result_checked(k, it))
    return out


def _outcome(fn, items):
    try:
        return "ok", fn(items)
    except InvalidSpec as e:
        return "refused", (e.field, str(e))


@settings(max_examples=400, deadline=None)
@given(st.lists(_item(), min_size=1, max_size=5))
def test_the_short_path_accepts_and_builds_exactly_what_the_checks_do(items):
    assert _outcome(_results, items) == _outcome(_checked, items)


def test_a_plain_outcome_takes_the_short_path_and_its_item_is_the_checks_item():
    plain = [{"run": "r1", "token": 7, "success": True},
             {"run": "r2", "token": 2**63 - 1, "success": False, "error": "boom", "output": None}]
    assert _results(plain) == _checked(plain)
    assert _results(plain)[0] == {"run": "r1", "token": 7, "success": True, "error": None, "output": None}
    assert set(_results(plain)[1]) < RESULT_FIELDS


@pytest.mark.parametrize("item, field", [
    ({"run": "r", "token": True, "success": True}, "results[1].token"),
    ({"run": "r", "token": 2**63, "success": True}, "results[1].token"),
    ({"run": "", "token": 1, "success": True}, "results[1].run"),
    ({"run": "r", "token": 1, "success": 1}, "results[1].success"),
    ({"run": "r", "token": 1, "success": True, "error": 3}, "results[1].error"),
    ({"run": "r", "token": 1, "success": True, "colour": "red"}, "results[1].colour"),
    ({"run": "r", "token": 1, "success": True, "result": float("nan")}, "results[1].result"),
    ("r", "results[1]"),
])
def test_a_bad_item_is_refused_naming_its_field(item, field):
    with pytest.raises(InvalidSpec) as e:
        _results([{"run": "ok", "token": 1, "success": True}, item])
    assert e.value.field == field
