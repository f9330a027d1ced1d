"""acquire hands a worker only runs of the executor types its node runs (``--executors``)."""
from __future__ import annotations

from raftsched.core import commands

from core_helpers import T0, apply, new_state, put_cmd, spec_of

TTL = 10_000


def job(executor: dict) -> dict:
    spec = spec_of({"every_s": 3600}, "skip", grace_s=0)
    spec["executor"] = executor
    return spec


def do(s, op, now, **fields):
    return apply(s, commands.make(op, now, None, **fields))


def test_acquire_with_types_leaves_other_executor_types_queued_for_other_nodes():
    s = new_state()
    assert apply(s, put_cmd(s, "sh", job({"type": "shell", "argv": ["true"]}), T0))["ok"]
    assert apply(s, put_cmd(s, "web", job({"type": "http", "url": "http://127.0.0.1:1/x"}), T0))["ok"]
    shell_run = do(s, "trigger_job", T0, name="sh")["run"]
    http_run = do(s, "trigger_job", T0 + 1, name="web")["run"]
    got = do(s, "acquire", T0 + 2, worker="http-only", queues=None, max=10, ttl=TTL, types=["http", "python"])
    assert [g["id"] for g in got["runs"]] == [http_run]
    assert s.runs[shell_run]["state"] == "queued", "the shell run waits for a node that runs shell"
    got = do(s, "acquire", T0 + 3, worker="any", queues=None, max=10, ttl=TTL)
    assert [g["id"] for g in got["runs"]] == [shell_run]


def test_acquire_types_must_be_a_list_of_names():
    s = new_state()
    assert apply(s, put_cmd(s, "sh", job({"type": "shell", "argv": ["true"]}), T0))["ok"]
    rid = do(s, "trigger_job", T0, name="sh")["run"]
    token_before = s.fencing_token
    res = do(s, "acquire", T0, worker="w", queues=None, max=1, ttl=TTL, types="shell")
    assert res["ok"] is False and res["error"]["code"] == "invalid_command"
    assert s.runs[rid]["state"] == "queued" and s.fencing_token == token_before
