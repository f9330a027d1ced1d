"""Bugs that type-checking raftsched/core found (issue 21: mypy on the core), each pinned here by
a test that fails without its fix."""
from __future__ import annotations

from raftsched.core.errors import NotFound, RaftschedError


def test_an_error_answer_whose_code_is_not_a_string_is_an_unknown_error_not_a_type_error():
    # from_dict reads what the other side sent (client_rules.error_of): a list as the code made
    # the look-up of its class raise TypeError (unhashable) instead of giving an error.
    e = RaftschedError.from_dict({"code": ["not_found"], "message": "odd", "field": "x"})
    assert type(e) is RaftschedError and e.message == "odd" and e.field == "x"
    e = RaftschedError.from_dict({"code": {"a": 1}, "message": "odd"})
    assert type(e) is RaftschedError
    # Codes that are strings (known or not) and a missing code are read as before.
    assert type(RaftschedError.from_dict({"code": "not_found", "message": "m"})) is NotFound
    assert type(RaftschedError.from_dict({"code": "nope", "message": "m"})) is RaftschedError
    assert type(RaftschedError.from_dict({"message": "m"})) is RaftschedError
