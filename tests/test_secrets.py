"""Secrets never leak (node/redact.py, worker/masking.py): every read shows a job's headers, env values and secrets as
``***:fingerprint``; GET-modify-PUT keeps them; a run gets them and its reported output and error
are masked of them; ``keep_output: false`` keeps no output; fields that carry secrets refuse values
that would inject headers, and error messages never show a value."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.clock import FakeClock, SystemClock
from raftsched.core import commands, model
from raftsched.core.errors import InvalidSpec
from raftsched.core.state import SchedulerState
from raftsched.node.api import make_app
from raftsched.node.redact import Fingerprint, REDACTED_RE, redact_spec
from raftsched.node.service import Service
from raftsched.sealing import PROCESS_RING, place
from raftsched.worker.loop import Worker
from raftsched.worker.executors._output import short, tail_bytes
from raftsched.worker.masking import deliver, mask, secret_values
from raftsched.worker.sandbox import Sandbox, resolve_run_user

from fakes import FakeRaft
from test_worker import GroupRaft, stop, wait_until

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "SUPERSECRET-hunter2"
HTTP_JOB = {"schedule": {"every_s": 60}, "misfire": {"policy": "skip"},
            "executor": {"type": "http", "url": "https://example.invalid/hook",
                         "headers": {"Authorization": f"Bearer {SECRET}", "X-Plain": "same"}},
            "secrets": {"API_KEY": SECRET, "OTHER": "same"}}
SHELL_JOB = {"schedule": {"every_s": 60}, "misfire": {"policy": "skip"},
             "executor": {"type": "shell", "argv": ["true"], "env": {"DB_PASSWORD": "pw-1234", "MODE": "x"}}}


def opened(state, job, *path):
    """The map at ``path`` of job ``job``'s stored spec, its sealed values opened (the API and
    its worker share the process's ring)."""
    m = state.jobs[job]["spec"]
    for k in path:
        m = m[k]
    assert all(isinstance(v, bytes) for v in m.values()), "stored sealed"
    return {n: PROCESS_RING.unseal(v, place(job, path, n)) for n, v in m.items()}


def run(coro_fn, fingerprint=None):
    async def main():
        state = SchedulerState()
        svc = Service(FakeRaft(state), FakeClock(), "n1",
                      fingerprint=fingerprint or Fingerprint.from_cluster_secret("c" * 32))
        app = make_app(svc, TOKEN)
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            await coro_fn(state, c)
    asyncio.run(main())


async def put(c, name, spec, **kw):
    r = await c.put(f"/v1/jobs/{name}", data=json.dumps(spec), **kw)
    return r.status, await r.json()


def test_reads_show_every_secret_redacted_with_a_stable_fingerprint():
    async def t(state, c):
        assert (await put(c, "h", HTTP_JOB))[0] == 201
        assert (await put(c, "s", SHELL_JOB))[0] == 201
        for path in ("/v1/jobs/h", "/v1/jobs"):
            r = await c.get(path)
            text = await r.text()
            assert SECRET not in text and "pw-1234" not in text, path
        spec = (await (await c.get("/v1/jobs/h")).json())["spec"]
        h, sec = spec["executor"]["headers"], spec["secrets"]
        assert all(REDACTED_RE.match(v) for v in (*h.values(), *sec.values()))
        assert h["X-Plain"] == sec["OTHER"], "equal secrets look equal"
        assert h["Authorization"] != sec["API_KEY"], "the fingerprint is of the whole value"
        assert spec["keep_output"] is True
        env = (await (await c.get("/v1/jobs/s")).json())["spec"]["executor"]["env"]
        assert set(env) == {"DB_PASSWORD", "MODE"} and all(REDACTED_RE.match(v) for v in env.values())
        # The state keeps them sealed (raftsched/sealing.py); the runs get them opened.
        assert SECRET.encode() not in state.jobs["h"]["spec"]["secrets"]["API_KEY"]
        assert opened(state, "h", "secrets")["API_KEY"] == SECRET
    run(t)


def test_get_modify_put_keeps_the_stored_secrets_and_a_wrong_redaction_is_refused():
    async def t(state, c):
        await put(c, "h", HTTP_JOB)
        spec = (await (await c.get("/v1/jobs/h")).json())["spec"]
        spec["description"] = "changed"
        assert (await put(c, "h", spec))[0] == 200
        sealed = state.jobs["h"]["spec"]["secrets"]
        assert state.jobs["h"]["spec"]["description"] == "changed"
        assert opened(state, "h", "secrets") == HTTP_JOB["secrets"]
        assert opened(state, "h", "executor", "headers") == HTTP_JOB["executor"]["headers"]
        assert (await put(c, "h", spec))[0] == 200
        assert state.jobs["h"]["spec"]["secrets"] == sealed, "kept as stored: not sealed again"
        # A new value replaces it; a redacted value that matches nothing stored is refused.
        spec["secrets"]["API_KEY"] = "rotated-value"
        assert (await put(c, "h", spec))[0] == 200
        assert opened(state, "h", "secrets")["API_KEY"] == "rotated-value"
        bad = dict(spec, secrets={"API_KEY": "***:00000000"})
        s, e = await put(c, "h", bad)
        assert s == 422 and e["error"]["field"] == "secrets.API_KEY"
        s, e = await put(c, "copy", spec)  # a copy made from a read: no stored secret of that name
        assert s == 422 and e["error"]["field"].startswith(("executor.headers.", "secrets."))
        assert "copy" not in state.jobs
        # The batch endpoint restores them the same way.
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"h": dict(spec, description="b")}}))
        assert r.status == 200, await r.text()
        assert opened(state, "h", "executor", "headers") == HTTP_JOB["executor"]["headers"]
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"copy": spec}}))
        body = await r.json()
        assert r.status == 422 and body["error"]["job"] == "copy"
    run(t)


def test_fingerprints_depend_on_the_cluster_secret():
    a, b = Fingerprint.from_cluster_secret("a" * 32), Fingerprint.from_cluster_secret("b" * 32)
    assert a("x") == Fingerprint.from_cluster_secret("a" * 32)("x") != b("x")
    spec = redact_spec(model.validate_job("j", HTTP_JOB, 0), a)
    assert SECRET not in json.dumps(spec)


@pytest.mark.parametrize("executor, field", [
    ({"type": "http", "url": "http://h/x", "headers": {"X-A": "v\r\nX-Injected: 1"}}, "executor.headers.X-A"),
    ({"type": "http", "url": "http://h/x", "headers": {"X-A": "v\nX: 1"}}, "executor.headers.X-A"),
    ({"type": "http", "url": "http://h/x", "headers": {"X-A": "v\x00"}}, "executor.headers.X-A"),
    ({"type": "http", "url": "http://h/x", "headers": {"X A": "v"}}, "executor.headers"),
    ({"type": "http", "url": "http://h/x", "headers": {"X-A\r\nY": "v"}}, "executor.headers"),
    ({"type": "http", "url": "http://h/x", "headers": {"": "v"}}, "executor.headers"),
    ({"type": "http", "url": "http://user:SUPERSECRET@h/x"}, "executor.url"),
    ({"type": "http", "url": "http://h/x\r\nHost: evil"}, "executor.url"),
    ({"type": "shell", "argv": ["x"], "env": {"A=B": "v"}}, "executor.env"),
    ({"type": "shell", "argv": ["x"], "env": {"A": "SUPERSECRET\x00"}}, "executor.env.A"),
])
def test_executor_fields_refuse_header_injection_and_never_echo_the_value(executor, field):
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", {"schedule": {"every_s": 5}, "misfire": {"policy": "skip"}, "executor": executor}, 0)
    assert ei.value.field == field
    assert "SUPERSECRET" not in ei.value.message and "Injected" not in ei.value.message


@pytest.mark.parametrize("secrets, field", [
    ("x", "secrets"), ({"1A": "v"}, "secrets"), ({"A-B": "v"}, "secrets"), ({"A": 5}, "secrets.A"),
    ({"A": ""}, "secrets.A"), ({"A": "SUPERSECRET\r\n"}, "secrets.A"), ({"raftsched_run_id": "v"}, "secrets.raftsched_run_id"),
    ({f"S{i}": "v" for i in range(33)}, "secrets"), ({"A": "x" * 4097}, "secrets.A"),
])
def test_secrets_are_validated_without_echoing_them(secrets, field):
    with pytest.raises(InvalidSpec) as ei:
        model.validate_job("j", dict(SHELL_JOB, secrets=secrets), 0)
    assert ei.value.field == field and "SUPERSECRET" not in ei.value.message


def test_apply_refuses_a_stored_spec_with_malformed_secrets():
    s = SchedulerState()
    spec = model.validate_job("j", SHELL_JOB, 0)
    for bad in ({"secrets": "x"}, {"secrets": {"A": 1}}, {"keep_output": "no"},
                {"executor": dict(spec["executor"], env={"A": 1})}, {"executor": dict(spec["executor"], env=[])}):
        res = s.apply(commands.make("put_job", 1, None, name="j", spec=dict(spec, **bad), next=None, cursor=0, anchor=0))
        assert res["ok"] is False and res["error"]["code"] == "invalid_command", bad
    assert "j" not in s.jobs


def test_delivery_and_masking_helpers():
    sh = {"type": "shell", "argv": ["x"], "env": {"A": "1"}}
    assert deliver(sh, {"B": "2"}) == {"type": "shell", "argv": ["x"], "env": {"A": "1", "B": "2"}}
    assert sh == {"type": "shell", "argv": ["x"], "env": {"A": "1"}}, "the stored executor is not changed"
    assert deliver({"type": "http", "url": "u"}, {"K": "v"})["headers"] == {"K": "v"}
    py = {"type": "python", "target": "m:f"}
    assert deliver(py, {"K": "v"}) is py
    vals = secret_values({"headers": {"A": "abcd"}, "env": {"B": "abcdef", "C": "ab"}}, {"D": "zzzz"})
    assert vals[0] == "abcdef" and set(vals) == {"abcdef", "abcd", "zzzz"}, "longest first; 'ab' is too short"
    assert mask("x abcdef y abcd z ab", vals) == "x *** y *** z ab"


def test_masking_a_tail_drops_what_a_cut_left_of_a_secret_and_a_reason_is_masked_before_it_is_one_line():
    """A tail cut through a secret starts with its end, which no occurrence matches: dropped,
    however short (a shortest length would let that many characters through), and not marked;
    a whole secret there, or one overlapping it, is masked. A reason is masked before its
    whitespace is collapsed and before it is cut."""
    pw = "A" * 20 + "-TAILPART-0123456789"
    assert mask("-TAILPART-0123456789xxx", [pw], cut=True) == "xxx"
    assert mask("9xxx", [pw], cut=True) == "xxx", "a last character alone"
    assert mask("9xxx", [pw]) == "9xxx" and mask("xx9", [pw], cut=True) == "xx9", "not cut, or not at the start"
    assert mask(pw + "x", [pw], cut=True) == "***x"
    assert mask("zabcdef!", ["xyzab", "abcdef"], cut=True) == "***!", "an end overlapping a whole one"
    assert mask("aaaaaa", ["aaaa"]) == "***" and mask("secretsecret", ["secret"]) == "******"
    assert tail_bytes((pw + "x" * 4076).encode(), masked=[pw]) == "x" * 4076
    assert short("login refused for password correct  horse\tbattery", masked=["correct  horse\tbattery"]) == \
        "login refused for password ***"
    long = short("x" * 300 + " correct  horse battery", limit=310, masked=["correct  horse battery"])
    assert long.endswith("***") and "corr" not in long


def _runs_of(jobs: dict[str, dict]) -> list[dict]:
    """One triggered run of each job (hourly, no retry; ``jobs`` gives the rest of each spec),
    run through the lease loop in this process: their run records, in ``jobs``' order."""
    async def t():
        state = SchedulerState()
        raft = GroupRaft(state)
        clock = SystemClock()
        svc = Service(raft, clock, "n1")
        every = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"}, "retry": {"max_attempts": 1}}
        runs = []
        for name, rest in jobs.items():
            await svc.put_job(name, dict(every, **rest), None)
            runs.append((await svc.trigger_job(name, None))["run"])
        worker = Worker(raft, clock, "n1", sandbox=None, slots=len(jobs), single_node=True, poll_interval_s=0.01)
        task = asyncio.create_task(worker.run())
        await wait_until(lambda: worker.completed == len(jobs), 20, "every run to report")
        await stop(task)
        return [state.runs[r] for r in runs]
    return asyncio.run(asyncio.wait_for(t(), 30))


def test_a_worker_reports_a_secret_cut_through_by_the_tail_or_respaced_in_a_reason_masked():
    """Through the lease loop, in this process (shell, python): the output's 4 KB tail starts 20
    characters into a 40-character secret, and a python target's exception holds a secret with
    two spaces."""
    pw = "A" * 20 + "-TAILPART-0123456789"
    ra, rb = _runs_of({
        "cut": {"secrets": {"PW": pw}, "executor": {
            "type": "shell", "argv": ["sh", "-c", 'printf "%s" "$PW"; head -c 4076 /dev/zero | tr "\\000" x']}},
        "spaced": {"secrets": {"PW": "correct  horse battery"},
                   "executor": {"type": "python", "target": "exec_targets:login_refused"}}})
    assert ra["output"] == "x" * 4076, ra["output"][:40]
    assert rb["attempts"][-1]["error"] == "RuntimeError: login refused for password ***", rb["attempts"][-1]
    assert "horse" not in json.dumps([ra, rb]) and "TAILPART" not in json.dumps([ra, rb])


def test_a_secret_a_repr_or_json_escapes_is_masked_too():
    """A backslash, a quote or a non-ASCII character in a secret is escaped where a repr or JSON
    writes it (a returned object's repr, bytes, a KeyError's message, a JSON line printed), and
    the escaped form did not match the value."""
    pw = "pa\\ss-w\u00f6rd-\"123"
    vals = secret_values(None, {"PW": pw})
    for shown in (repr(pw), repr(pw.encode()), json.dumps(pw), json.dumps(pw, ensure_ascii=False)):
        out = mask(f"x {shown} y", vals)
        assert "ss-w" not in out and "***" in out, (shown, out)
    # A single quote, in a string that also holds a double quote: repr writes it \'.
    quoted = "it's-a-secret"
    vals = secret_values(None, {"PW": quoted})
    for shown in (repr(f'x="{quoted}"'), repr(f'pw="{quoted}"'.encode())):
        assert "a-secret" not in mask(shown, vals), shown

    got = _runs_of({name: {"secrets": {"PW": pw}, "keep_output": True,
                           "executor": {"type": "python", "target": f"exec_targets:{target}"}}
                    for name, target in (("ret", "returns_escaped_secret"), ("key", "key_error_of_secret"))})
    assert "ss-w" not in json.dumps(got, ensure_ascii=False) and "ss-w" not in json.dumps(got), got


def test_a_run_gets_its_secrets_and_its_output_is_masked_and_kept_only_when_asked():
    async def t():
        state = SchedulerState()
        raft = GroupRaft(state)
        clock = SystemClock()
        svc = Service(raft, clock, "n1")
        line = 'echo "env=$DB_PASSWORD sec=$API_KEY mode=$MODE"; echo "$API_KEY" >&2; exit 3'
        spec = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
                "executor": {"type": "shell", "argv": ["sh", "-c", line], "env": {"DB_PASSWORD": "pw-1234", "MODE": "x"}},
                "secrets": {"API_KEY": SECRET}}
        await svc.put_job("kept", spec, None)
        await svc.put_job("dropped", dict(spec, keep_output=False), None)
        a = (await svc.trigger_job("kept", None))["run"]
        b = (await svc.trigger_job("dropped", None))["run"]
        worker = Worker(raft, clock, "n1", sandbox=Sandbox(resolve_run_user(None)), slots=2, single_node=True,
                        poll_interval_s=0.01)
        task = asyncio.create_task(worker.run())
        await wait_until(lambda: worker.completed == 2, 20, "both runs to report")
        await stop(task)
        ra, rb = state.runs[a], state.runs[b]
        assert ra["state"] == rb["state"] == "dead"
        assert "env=*** sec=*** mode=x" in ra["output"], ra["output"]  # delivered, then masked
        assert SECRET not in ra["output"] and "pw-1234" not in ra["output"]
        assert rb["output"] == "" and rb["attempts"][-1]["error"] == "exit status 3"
        assert SECRET.encode() not in json.dumps([ra, rb]).encode()
    asyncio.run(asyncio.wait_for(t(), 30))


def test_a_dry_run_of_a_batch_compares_secrets_by_fingerprint_and_never_shows_them():
    """``POST /v1/jobs:batch`` with ``dry_run``: the same secret in clear is unchanged (its
    fingerprint is the stored one's), another one is a change shown as two fingerprints."""
    async def t(state, c):
        assert (await put(c, "s", SHELL_JOB))[0] == 201
        stored = dict(state.jobs["s"]["spec"])

        async def dry(spec):
            r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"s": spec}, "dry_run": True}))
            assert r.status == 200, await r.text()
            text = await r.text()
            assert "pw-1234" not in text and "pw-9999" not in text
            return json.loads(text)["jobs"]["s"]
        assert (await dry(SHELL_JOB))["action"] == "unchanged"
        other = dict(SHELL_JOB, executor=dict(SHELL_JOB["executor"], env={"DB_PASSWORD": "pw-9999", "MODE": "x"}))
        res = await dry(other)
        assert res["action"] == "replace" and [ch["field"] for ch in res["changes"]] == ["executor.env.DB_PASSWORD"]
        ch = res["changes"][0]
        assert REDACTED_RE.fullmatch(ch["from"]) and REDACTED_RE.fullmatch(ch["to"]) and ch["from"] != ch["to"]
        # A read's redacted value sent back is the stored secret: unchanged.
        shown = (await (await c.get("/v1/jobs/s")).json())["spec"]
        assert (await dry(shown))["action"] == "unchanged"
        assert state.jobs["s"]["spec"] == stored
    run(t)
