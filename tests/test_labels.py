"""The job spec's ``labels``: validated by model.validate_job, guarded by apply, kept by the
snapshot, and filtered on by ``GET /v1/jobs?label=KEY=VALUE`` (queries.jobs_labelled_page)."""
from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import limits, model, queries
from raftsched.core.errors import InvalidSpec

from core_helpers import SEC, T0, apply, new_state, put_cmd, raw_job, restored, spec_of, tick


def _spec(**labels_kw):
    return spec_of({"every_s": 10}, "skip", **labels_kw)


# ------------------------------------------------------------------ validation
def test_labels_normalise_with_sorted_keys_and_empty_means_none():
    spec = _spec(labels={"team": "billing", "raftsched.app": "reports"})
    assert list(spec["labels"]) == ["raftsched.app", "team"]
    assert "labels" not in _spec(labels={})
    assert _spec(labels={}) == _spec()
    assert _spec(labels={"k": ""})["labels"] == {"k": ""}  # an empty value is a value


@pytest.mark.parametrize("labels, field", [
    ([], "labels"), ("a=b", "labels"), ({"": "x"}, "labels"), ({"-a": "x"}, "labels"),
    ({"a-": "x"}, "labels"), ({"a b": "x"}, "labels"), ({"a=b": "x"}, "labels"),
    ({"k" * (limits.label_key_chars_max + 1): "x"}, "labels"),
    ({"k": 1}, "labels.k"), ({"k": None}, "labels.k"), ({"k": "a\nb"}, "labels.k"),
    ({"k": "v" * (limits.label_value_chars_max + 1)}, "labels.k"),
    ({f"k{i}": "v" for i in range(limits.job_labels_max + 1)}, "labels"),
])
def test_bad_labels_are_refused_naming_the_field(labels, field):
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", raw_job({"every_s": 10}, labels=labels))
    assert ei.value.field == field


def test_the_largest_labels_fit_in_a_spec():
    n, kc, vc = limits.job_labels_max, limits.label_key_chars_max, limits.label_value_chars_max
    labels = {f"{i:02d}" + "k" * (kc - 2): "v" * vc for i in range(n)}
    assert len(_spec(labels=labels)["labels"]) == n


# ------------------------------------------------------------------ apply and snapshot
def test_apply_refuses_a_command_whose_labels_are_malformed_and_changes_nothing():
    from test_state import refused

    s = new_state(("a", _spec(labels={"k": "v"})))  # state time is T0 now (I6)
    for bad in ({"k": 1}, ["k"], {1: "v"}, {f"k{i}": "v" for i in range(limits.job_labels_max + 1)}):
        refused(s, put_cmd(s, "a", dict(_spec(), labels=bad), T0), "invalid_command")


def test_labels_survive_a_snapshot_and_a_state_without_them_snapshots_as_before():
    plain = new_state()
    assert apply(plain, put_cmd(plain, "a", _spec(), T0))["ok"]
    with_empty = new_state()
    assert apply(with_empty, put_cmd(with_empty, "a", _spec(labels={}), T0))["ok"]
    assert with_empty.snapshot() == plain.snapshot()

    s = new_state()
    for i in range(4):
        labels = {"raftsched.app": "reports"} if i % 2 else {"team": f"t{i}"}
        assert apply(s, put_cmd(s, f"j{i}", _spec(labels=labels), T0))["ok"]
    tick(s, T0 + 25 * SEC)
    r = restored(s)
    assert r.snapshot() == s.snapshot()
    assert r.jobs["j1"]["spec"]["labels"] == {"raftsched.app": "reports"}
    assert r.jobs["j2"]["spec"]["labels"] == {"team": "t2"}


# ------------------------------------------------------------------ the filter
LABEL_SETS = [{}, {"raftsched.app": "a"}, {"raftsched.app": "b"}, {"raftsched.app": "a", "team": "x"},
              {"team": "x"}]


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-f][0-9]?", fullmatch=True), st.sampled_from(range(len(LABEL_SETS))),
                       max_size=12),
       st.sampled_from(LABEL_SETS[1:] + [{"raftsched.app": "a", "team": "y"}]),
       st.integers(1, 5))
def test_the_label_filter_pages_through_exactly_the_matching_jobs(jobs, want, limit):
    s = new_state()
    for name, k in jobs.items():
        assert apply(s, put_cmd(s, name, _spec(labels=LABEL_SETS[k]), T0))["ok"]
    expected = sorted(n for n, k in jobs.items() if want.items() <= LABEL_SETS[k].items())
    seen, after = [], None
    for _ in range(len(jobs) + 2):
        page = queries.jobs_labelled_page(s, want, limit, after)
        assert page["total"] == len(expected)
        seen += [j["name"] for j in page["jobs"]]
        after = page["next"]
        if after is None:
            break
    assert seen == expected


# ------------------------------------------------------------------ the API
def test_get_jobs_filters_on_labels_and_refuses_a_bad_filter():
    from aiohttp.test_utils import TestClient, TestServer
    from test_api import AUTH, SPEC, Env, err

    async def main():
        env = Env()
        async with TestClient(TestServer(env.app, host="127.0.0.1"), headers=AUTH) as c:  # reads need it too
            for name, labels in (("a", {"raftsched.app": "r"}), ("b", {"raftsched.app": "other"}),
                                 ("c", None), ("d", {"raftsched.app": "r", "team": "x"})):
                spec = dict(SPEC, labels=labels) if labels else SPEC
                r = await c.put(f"/v1/jobs/{name}", data=json.dumps(spec), headers=AUTH)
                assert r.status == 201, await r.text()
            body = await (await c.get("/v1/jobs/d")).json()
            assert body["spec"]["labels"] == {"raftsched.app": "r", "team": "x"}
            assert "labels" not in (await (await c.get("/v1/jobs/c")).json())["spec"]

            async def names(query):
                r = await c.get("/v1/jobs" + query)
                assert r.status == 200, await r.text()
                b = await r.json()
                return [j["name"] for j in b["jobs"]], b["total"]

            assert await names("?label=raftsched.app=r") == (["a", "d"], 2)
            assert await names("?label=raftsched.app=r&label=team=x") == (["d"], 1)
            assert await names("?label=raftsched.app=nobody") == ([], 0)
            assert await names("?label=raftsched.app=r&limit=1") == (["a"], 2)
            assert await names("") == (["a", "b", "c", "d"], 4)
            for bad in ("?label=noequals", "?label==x", "?label=a%20b=x", "?label=k=a&label=k=b",
                        "?" + "&".join(f"label=k{i}=v" for i in range(limits.job_labels_max + 1))):
                await err(await c.get("/v1/jobs" + bad), 400, "bad_request", "label")
            await err(await c.put("/v1/jobs/e", data=json.dumps(dict(SPEC, labels={"k": 5})), headers=AUTH),
                      422, "invalid", "labels.k")

    asyncio.run(main())
