"""The node's JSON answers (node/http.py dumps): orjson's text, read back as the same values as
json's; what orjson refuses goes to json."""
from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from raftsched.node.http import dumps

_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_an_answer_reads_back_as_json_would_have_written_it(v):
    assert json.loads(dumps(v)) == json.loads(json.dumps(v))


def test_what_orjson_refuses_is_json_text_as_before():
    for v in ({"big": 2**70}, {"small": -(2**63) - 1}, {1: "a"}, [{"k": 10**30}]):
        assert dumps(v) == json.dumps(v)
    assert dumps({"a": (1, 2)}) == '{"a":[1,2]}'  # a tuple is a list, as in json
