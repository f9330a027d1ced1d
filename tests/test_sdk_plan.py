"""raftsched.sdk.plan: what ``raftsched sync`` changes, for every case, as a property over
random pairs of declared and existing job sets."""
from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from raftsched.core import model
from raftsched.node.views import spec_view
from raftsched.sdk import APP_LABEL
from raftsched.sdk.plan import Conflict, Plan, Update, diff_fields, owner_of, plan

APP = "reports"
NAMES = st.sampled_from(["a", "b", "c", "d", "e", "f"])


def _view(i: int, owner: str | None) -> dict:
    """Spec variant ``i`` as GET shows it, labelled with ``owner`` (None: no app's)."""
    raw = {"schedule": [{"every_s": 60}, {"cron": "0 2 * * *"}, {"every_s": 60}][i % 3],
           "executor": {"type": "python", "target": "m:f"}, "misfire": {"policy": "skip"},
           "priority": 5 if i < 3 else 7}
    if owner is not None:
        raw["labels"] = {APP_LABEL: owner}
    return json.loads(json.dumps(spec_view(model.validate_job("j", raw))))


VARIANTS = st.integers(0, 5)
OWNERS = st.sampled_from([APP, None, "other", "reports-2"])
DECLARED = st.dictionaries(NAMES, VARIANTS.map(lambda i: _view(i, APP)), max_size=6)
EXISTING = st.dictionaries(NAMES, st.tuples(VARIANTS, OWNERS).map(lambda t: _view(*t)), max_size=6)


def applied(p: Plan, declared: dict, existing: dict) -> dict:
    """The cluster after the plan is applied (the batch puts, then the deletes)."""
    after = dict(existing)
    for name in p.puts():
        after[name] = declared[name]
    for name in p.delete:
        del after[name]
    return after


@settings(max_examples=400, deadline=None)
@given(DECLARED, EXISTING, st.booleans())
def test_the_plan_of_every_pair_of_job_sets(declared, existing, prune):
    p = plan(APP, declared, existing, prune)
    # Every declared job is in exactly one of create / update / unchanged / conflicts.
    groups = [set(p.create), {u.job for u in p.update}, set(p.unchanged), {c.job for c in p.conflicts}]
    assert sum(len(g) for g in groups) == len(declared) and set().union(*groups) == set(declared)
    assert set(p.create) == set(declared) - set(existing)
    for name in set(declared) & set(existing):
        owner = owner_of(existing[name])
        if owner not in (None, APP):
            assert Conflict(name, owner) in p.conflicts
        elif existing[name] == declared[name]:
            assert name in p.unchanged
        else:
            u = next(u for u in p.update if u.job == name)
            assert u.fields and all(f for f in u.fields)
    # Prune deletes exactly this app's undeclared jobs; without it they are listed, kept.
    mine_gone = {n for n, s in existing.items() if n not in declared and owner_of(s) == APP}
    assert set(p.delete) == (mine_gone if prune else set())
    assert set(p.undeclared) == (set() if prune else mine_gone)
    # Never a job without this app's label, nor another app's.
    assert all(owner_of(existing[n]) == APP for n in p.delete)
    # Lists are sorted, for a stable output.
    assert list(p.create) == sorted(p.create) and list(p.delete) == sorted(p.delete)
    assert p.changes == bool(p.create or p.update or p.delete)

    if p.conflicts:
        return  # nothing is applied while there is a conflict
    after = applied(p, declared, existing)
    for name, spec in declared.items():
        assert after[name] == spec
    if prune:
        assert not {n for n, s in after.items() if owner_of(s) == APP} - set(declared)
    # Jobs of other apps and of no app that are not declared are untouched.
    for name, spec in existing.items():
        if name not in declared and owner_of(spec) != APP:
            assert after[name] == spec
    # Idempotent: the plan of the result changes nothing.
    again = plan(APP, declared, after, prune)
    assert not again.changes and set(again.unchanged) == set(declared) and not again.conflicts


def test_update_names_the_fields_that_differ_and_adopts_an_unlabelled_job():
    mine, unlabelled = _view(0, APP), _view(3, None)  # priority 5 -> 7, and no label
    p = plan(APP, {"a": mine}, {"a": unlabelled})
    assert p.update == (Update("a", ("labels", "priority")),)
    moved = _view(1, APP)
    p = plan(APP, {"a": moved}, {"a": mine})
    assert p.update == (Update("a", ("schedule.cron", "schedule.every_s", "schedule.timezone")),)


def test_diff_fields():
    assert diff_fields({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 4}, "e": 5}) == ["b.d", "e"]
    assert diff_fields(1, 2) == ["(spec)"] and diff_fields({"a": [1]}, {"a": [1]}) == []


def test_to_dict_is_json():
    p = plan(APP, {"a": _view(0, APP), "x": _view(0, APP)}, {"a": _view(3, APP), "x": _view(0, "other"),
                                                            "gone": _view(0, APP)}, prune=True)
    assert json.loads(json.dumps(p.to_dict())) == {
        "app": APP, "create": [], "update": [{"job": "a", "fields": ["priority"]}], "unchanged": [],
        "delete": ["gone"], "undeclared": [], "conflicts": [{"job": "x", "owner": "other"}]}
