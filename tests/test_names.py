"""Names are matched whole: a final newline is no part of a name (issue 22, section 3, item 7).

``re.match("^...$", "name\\n")`` matches, because ``$`` matches before a final newline. Every
validator of the tree is fed ``name + "\\n"`` (and arbitrary text, by hypothesis) and must refuse
it; every regex of the tree is checked not to rely on ``$``; and a command that carries such a
name (one already in a journal, written by an older version) is refused by apply as a value,
changing nothing.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest
from hypothesis import given, settings, strategies as st

from raftsched.core import backfill_model, bodies, commands, model, placement, tokens, workers
from raftsched.core.errors import InvalidCommand, InvalidSpec
from raftsched.core.state import SchedulerState
from raftsched.node import auth, redact

from core_helpers import T0, apply, put_cmd, spec_of

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHELL = {"type": "shell", "argv": ["true"]}
SPEC = {"schedule": {"every_s": 60}, "executor": SHELL, "misfire": {"policy": "skip"}}
HTTP = {"type": "http", "url": "http://127.0.0.1:9/x"}


def _job(**fields):
    return lambda v: model.validate_job("j", dict(SPEC, **{k: f(v) for k, f in fields.items()}))


#: Every validator of a name (or of a value checked by a regex), with a valid example. Each
#: raises InvalidSpec or InvalidCommand for what it refuses.
VALIDATORS = {
    "job name": (model.check_name, "nightly-report.v2"),
    "job name in a spec": (lambda v: model.validate_job(v, SPEC), "nightly"),
    "run id": (model.check_run_id, "nightly@1780000000000"),
    "queue in a spec": (_job(queue=lambda v: v), "billing"),
    "tenant in a spec": (_job(tenant=lambda v: v), "billing"),
    "header name": (_job(executor=lambda v: dict(HTTP, headers={v: "x"})), "X-Api-Key"),
    "secret name": (_job(secrets=lambda v: {v: "value"}), "API_KEY"),
    "python target": (_job(executor=lambda v: {"type": "python", "target": v}), "app.jobs:nightly"),
    "job label key": (_job(labels=lambda v: {v: "x"}), "raftsched.app"),
    "placement label name": (_job(placement=lambda v: {"labels": {v: "gpu"}}), "pool"),
    "placement label value": (_job(placement=lambda v: {"labels": {"pool": v}}), "gpu"),
    "label key": (lambda v: model.check_label_key(v, "label"), "team"),
    "worker label": (lambda v: placement.validate_worker_labels({v: v}, "labels"), "gpu"),
    "worker id": (workers.check_worker_id, "host-1/1234"),
    "worker queues": (lambda v: workers.check_queues([v]), "billing"),
    "worker tenants": (lambda v: workers.check_tenants([v]), "billing"),
    "queue body": (lambda v: bodies.validate_queue(v, {}), "billing"),
    "tenant body": (lambda v: bodies.validate_tenant(v, {"rate_per_s": 1}), "billing"),
    "lock name": (lambda v: bodies.validate_lock_acquire(v, {"owner": "me", "ttl_s": 5}), "nightly-lock"),
    "backfill id": (lambda v: backfill_model.validate_backfill(
        {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "id": v}, T0), "bf-1"),
    "bulk DLQ id": (lambda v: backfill_model.validate_dlq_bulk({"id": v, "all": True}, "purge", T0), "purge-1"),
    "token body tenants": (lambda v: auth.validate_token_body({"role": "reader", "tenants": [v]}, T0), "billing"),
    "token body workers": (lambda v: auth.validate_token_body({"role": "worker", "workers": [v]}, T0), "gpu-7"),
    # apply's checks, which raise InvalidCommand
    "token tenants (apply)": (lambda v: tokens.check_tenants([v]), "billing"),
    "token workers (apply)": (lambda v: tokens.check_workers([v]), "gpu-7"),
}


def _accepts(fn, v) -> bool:
    try:
        fn(v)
    except (InvalidSpec, InvalidCommand):
        return False
    return True


@pytest.mark.parametrize("what", list(VALIDATORS))
@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\n\n"])
def test_a_name_with_a_final_newline_is_refused(what, suffix):
    fn, good = VALIDATORS[what]
    assert _accepts(fn, good), f"{what}: the example {good!r} must be valid"
    assert not _accepts(fn, good + suffix), f"{what}: {good + suffix!r} was accepted"


#: Text mostly of name characters, with line ends and other controls mixed in.
_TEXT = st.text(alphabet=st.sampled_from("aZ09._-:/@+*\n\r\t\x00 "), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(VALIDATORS)), _TEXT)
def test_no_validator_accepts_a_control_character(what, text):
    fn, _ = VALIDATORS[what]
    if _accepts(fn, text):
        assert not re.search(r"[\x00-\x1f]", text), f"{what} accepted {text!r}"


def test_token_ids_and_redacted_values_are_matched_whole():
    assert auth.parse_token("rst_0123456789abcdef_" + "s" * 43) is not None
    assert tokens.TOKEN_ID_RE.fullmatch("0123456789abcdef") and not tokens.TOKEN_ID_RE.fullmatch("0123456789abcdef\n")
    assert redact.REDACTED_RE.fullmatch("***:0123abcd")
    assert not redact.REDACTED_RE.fullmatch("***:0123abcd\n")


def _regex_literals(tree: ast.AST):
    """Pattern literals given to re.compile/match/search/fullmatch, with their line."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                and node.func.attr in ("compile", "match", "search", "fullmatch") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.func.attr, node.args[0].value


def test_no_regex_of_the_tree_ends_with_a_dollar():
    """``$`` matches before a final newline: a whole match is ``fullmatch`` (or ``\\Z``)."""
    found = []
    for d in ("raftsched", "scripts", "examples", "jepsen-style"):
        for path in sorted((ROOT / d).rglob("*.py")):
            for line, fn, pattern in _regex_literals(ast.parse(path.read_text(encoding="utf-8"))):
                if re.search(r"(?<!\\)\$\)*$", pattern) and "re.M" not in path.read_text().splitlines()[line - 1]:
                    found.append(f"{path.relative_to(ROOT)}:{line}: re.{fn}({pattern!r})")
    assert not found, "use fullmatch (or \\Z), not $:\n" + "\n".join(found)


# ------------------------------------------------------------------ apply
def _commands():
    """Commands carrying a name with a final newline, as an older version could have written
    them to a journal."""
    spec = spec_of({"every_s": 60}, "skip")
    good = put_cmd(None, "j", spec, T0)
    yield "put_job name", dict(good, name="j\n")
    yield "put_job queue", dict(good, spec=dict(spec, queue="q\n"))
    yield "put_job tenant", dict(good, spec=dict(spec, tenant="t\n"))
    item = {k: good[k] for k in ("name", "spec", "next", "cursor", "anchor")}
    yield "put_jobs item", commands.put_jobs(T0, None, jobs=[item, dict(item, name="k\n")])
    yield "put_queue", commands.put_queue(T0, None, name="q\n", fields={"max_depth": 5, "on_full": "reject"})
    yield "put_tenant", commands.put_tenant(T0, None, name="t\n", fields={"rate_milli": 1000, "burst": 1})
    yield "lock_acquire", commands.lock_command("lock_acquire", T0, None, name="l\n",
                                                fields={"owner": "me", "ttl": 5000})
    yield "worker_hello", commands.worker_hello(T0, worker="w\n", facts={
        "kind": "remote", "labels": {}, "slots": 1, "executors": ["shell"], "queues": None,
        "version": None, "instance": None})
    yield "token_create", commands.token_create(
        T0, None, id="0123456789abcdef", hash={"alg": "hmac-sha256", "salt": b"s" * 16, "digest": b"d" * 32},
        fields={"role": "reader", "tenants": ["t\n"], "expires": None, "note": None})


@pytest.mark.parametrize("what,cmd", list(_commands()), ids=[w for w, _ in _commands()])
def test_apply_refuses_a_command_carrying_such_a_name(what, cmd):
    s, same = SchedulerState(), SchedulerState()
    res = apply(s, cmd)
    assert res["ok"] is False and res["error"]["code"] == "invalid_command", (what, res)
    apply(same, commands.noop(cmd["now"]))  # what a refusal moves: the count applied, state time
    assert s.state_hash() == same.state_hash(), what


def test_the_same_commands_without_the_newline_apply():
    """The refusals above are the name's: the commands otherwise apply."""
    s = SchedulerState()
    for what, cmd in _commands():
        fixed = commands.decode(commands.encode(cmd))
        for k, v in list(fixed.items()):
            if isinstance(v, str) and v.endswith("\n"):
                fixed[k] = v.rstrip("\n")
        if what.startswith("put_job "):
            fixed["spec"] = {k: (v.rstrip("\n") if isinstance(v, str) else v) for k, v in fixed["spec"].items()}
        if what == "put_jobs item":
            fixed["jobs"] = [dict(i, name=i["name"].rstrip("\n")) for i in fixed["jobs"]]
        if what == "token_create":
            fixed["tenants"] = ["t"]
        res = apply(s, fixed)
        assert res["ok"] is True, (what, res)
