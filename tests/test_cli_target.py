"""How the command line finds its cluster and its token (raftsched/cli_target.py), what it prints
(cli_output.py), and how a call it makes ends (client/core.py Call with fail_fast): without a
node, except the closed-pipe check, which runs the command in a pipe."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from raftsched import cli_output
from raftsched.cli_target import resolve
from raftsched.client.core import Call, Fail, Try, Wait
from raftsched.config import ConfigError
from raftsched.core.errors import Indeterminate, Unavailable

from procs import REPO

ENV_KEYS = ("RAFTSCHED_URL", "RAFTSCHED_TOKEN", "RAFTSCHED_CONTEXT", "RAFTSCHED_CONFIG", "RAFTSCHED_API_PORT_BASE")


def _private(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return path


def _recorded(root, base=18700, tls="", nodes=None, token="recorded-token-0123456789"):
    """A .raftsched/ as scripts/cluster.sh leaves it."""
    state = root / ".raftsched"
    state.mkdir(mode=0o700)
    (state / "ports").write_text(f"RAFTSCHED_API_PORT_BASE={base}\nRAFTSCHED_RAFT_PORT_BASE=19700\nRAFTSCHED_TLS={tls}\n")
    if nodes is not None:
        (state / "nodes").write_text(" ".join(map(str, nodes)) + "\n")
    if token:
        _private(state / "token", token)
    return state


def _resolve(tmp_path, cwd=None, env=None, **kw):
    env = {"RAFTSCHED_CONFIG": str(tmp_path / "no-config.toml"), **(env or {})}
    return resolve(env=env, cwd=str(cwd or tmp_path), home=str(tmp_path / "home"), **kw)


def test_the_recorded_cluster_is_found_from_a_directory_below_it_with_its_ports_scheme_and_token(tmp_path):
    state = _recorded(tmp_path, base=18700, nodes=[1, 2, 4])
    (tmp_path / "examples").mkdir()
    t = _resolve(tmp_path, cwd=tmp_path / "examples")
    assert t.urls == ["http://127.0.0.1:18701", "http://127.0.0.1:18702", "http://127.0.0.1:18704"]
    assert t.source == f"the cluster recorded in {state}" and t.token == "recorded-token-0123456789"
    assert t.ca_file is None
    # RAFTSCHED_API_PORT_BASE that disagrees with the running cluster: the cluster wins, and it is said.
    t = _resolve(tmp_path, env={"RAFTSCHED_API_PORT_BASE": "8700"})
    assert t.urls[0] == "http://127.0.0.1:18701" and "RAFTSCHED_API_PORT_BASE=8700 is ignored" in t.notes[0]


def test_a_removed_nodes_directory_is_not_a_node_the_token_goes_to(tmp_path):
    """cluster.sh remove 1 leaves .raftsched/node-1 (its data) and lists 2 3 4: the client took
    every node-N directory for a node, and sent the admin token to node-1's port first, which
    anything may hold once the node is gone. The members are the nodes file's."""
    state = _recorded(tmp_path, base=18700, nodes=[2, 3, 4])
    for n in (1, 2, 3, 4):
        (state / f"node-{n}").mkdir()
    assert _resolve(tmp_path).urls == [f"http://127.0.0.1:{18700 + n}" for n in (2, 3, 4)]


def test_a_tls_cluster_is_reached_over_https_with_its_ca_and_client_certificate(tmp_path):
    state = _recorded(tmp_path, base=18700, tls="mutual")
    t = _resolve(tmp_path)
    assert t.urls == [f"https://127.0.0.1:{18700 + n}" for n in (1, 2, 3)]
    assert (t.ca_file, t.client_cert, t.client_key) == (
        str(state / "tls" / "ca.pem"), str(state / "tls" / "client.pem"), str(state / "tls" / "client-key.pem"))


def test_the_order_is_flags_environment_context_recorded_then_the_port_base(tmp_path):
    _recorded(tmp_path)
    cfg = tmp_path / "config.toml"
    _private(tmp_path / "prod-token", "prod-token-0123456789")
    cfg.write_text('current-context = "prod"\n[contexts.prod]\nurl = ["https://a.example:8701", "https://b.example:8701"]\n'
                   'token_file = "prod-token"\nca_file = "ca.pem"\n')
    env = {"RAFTSCHED_CONFIG": str(cfg), "RAFTSCHED_URL": "http://127.0.0.1:18702", "RAFTSCHED_TOKEN": "env-token"}
    t = _resolve(tmp_path, env=env, url="http://127.0.0.1:18703")
    assert (t.urls, t.source, t.token) == (["http://127.0.0.1:18703"], "--url", "env-token")
    t = _resolve(tmp_path, env=env)
    assert (t.urls, t.source) == (["http://127.0.0.1:18702"], "RAFTSCHED_URL")
    t = _resolve(tmp_path, env=env, context="prod")  # a --context flag goes before the environment
    assert t.urls[0] == "https://a.example:8701" and t.token == "env-token"
    del env["RAFTSCHED_URL"], env["RAFTSCHED_TOKEN"]
    t = _resolve(tmp_path, env=env)
    assert t.urls == ["https://a.example:8701", "https://b.example:8701"] and t.source.startswith("context prod")
    assert t.token == "prod-token-0123456789" and t.ca_file == str(tmp_path / "ca.pem")
    # The context's nodes never get the local cluster's token.
    (tmp_path / "prod-token").unlink()
    with pytest.raises(ConfigError, match="no token file|prod-token"):
        _resolve(tmp_path, env=env)
    os.remove(cfg)
    assert _resolve(tmp_path, env=env).urls[0] == "http://127.0.0.1:18701"
    # No record, a port base: the three default nodes on it (and the token must be given).
    os.remove(tmp_path / ".raftsched" / "ports")
    t = _resolve(tmp_path, env={"RAFTSCHED_API_PORT_BASE": "28700", "RAFTSCHED_TOKEN": "x"})
    assert t.urls == [f"http://127.0.0.1:{28700 + n}" for n in (1, 2, 3)] and t.source == "RAFTSCHED_API_PORT_BASE"


def test_with_nothing_found_it_says_where_it_looked_and_has_no_built_in_address(tmp_path):
    with pytest.raises(ConfigError) as ei:
        _resolve(tmp_path, env={"RAFTSCHED_TOKEN": "t"})
    msg = str(ei.value)
    for place in ("--url", "RAFTSCHED_URL", "no-config.toml", ".raftsched/ports", "RAFTSCHED_API_PORT_BASE"):
        assert place in msg, place
    assert "8701" not in msg


def test_the_recorded_token_goes_to_the_recorded_cluster_only(tmp_path):
    _recorded(tmp_path, base=18700)
    # A node of the recorded cluster, named by the user: its token is used.
    assert _resolve(tmp_path, url="http://127.0.0.1:18702").token == "recorded-token-0123456789"
    # Another address (something else owns it): no token is sent; the error says where it looked.
    for url in ("http://127.0.0.1:8701", "http://127.0.0.1:18702,http://10.0.0.9:18701", "https://127.0.0.1:18701"):
        with pytest.raises(ConfigError) as ei:
            _resolve(tmp_path, url=url)
        msg = str(ei.value)
        assert msg.startswith("no token found") and "not the cluster it records" in msg and "RAFTSCHED_TOKEN" in msg


@pytest.mark.parametrize("text,msg", [
    ('current-context = "x"\n', "no context 'x'"),
    ('[contexts.x]\nurl = "ftp://a"\n', "contexts.x.url: 'ftp://a' is not an http"),
    ('[contexts.x]\nurl = 3\n', "contexts.x.url: must be a string or a list of strings"),
    ('[contexts.x]\nurl = "http://a:1"\ntokenfile = "t"\n', "contexts.x.tokenfile: unknown key"),
    ('[contexts.x]\ntoken_file = "t"\n', "contexts.x.url: required"),
    ('contexts = 1\n', "contexts must be a table"),
    ('colour = 1\n', "unknown key 'colour'"),
    ('[contexts.x\n', "config.toml"),
])
def test_a_bad_config_file_is_refused_naming_the_field(tmp_path, text, msg):
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=None) as ei:
        _resolve(tmp_path, env={"RAFTSCHED_CONFIG": str(cfg), "RAFTSCHED_CONTEXT": "x", "RAFTSCHED_TOKEN": "t"})
    assert msg in str(ei.value)


def test_dash_v_says_which_nodes_and_token_and_a_missing_token_is_exit_2(tmp_path, monkeypatch, capsys):
    from raftsched import cli
    _recorded(tmp_path, base=18700)
    monkeypatch.chdir(tmp_path)
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    made = []

    class Fake:
        def __init__(self, urls, **kw):
            made.append((urls, kw))

        def get_job(self, name):
            return {"name": name}
    monkeypatch.setattr(cli, "Client", Fake)
    monkeypatch.setattr(cli, "_setup_logging", lambda level: None)
    assert cli.main(["get", "j", "-v", "-o", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"name": "j"}
    assert "nodes: http://127.0.0.1:18701,http://127.0.0.1:18702,http://127.0.0.1:18703 (from the cluster recorded in" \
        in out.err and ".raftsched/token (the recorded cluster's)" in out.err
    assert made[0][1]["token"] == "recorded-token-0123456789" and made[0][1]["fail_fast"] is True
    # A note (a port base the recorded cluster overrides) is said once, with or without -v.
    monkeypatch.setenv("RAFTSCHED_API_PORT_BASE", "47400")
    for argv in (["get", "j", "-v", "-o", "json"], ["get", "j", "-o", "json"]):
        assert cli.main(argv) == 0
        assert capsys.readouterr().err.count("RAFTSCHED_API_PORT_BASE=47400 is ignored") == 1, argv
    monkeypatch.delenv("RAFTSCHED_API_PORT_BASE")
    assert cli.main(["get", "j", "--url", "http://127.0.0.1:8701"]) == 2
    assert "no token found" in capsys.readouterr().err and len(made) == 3


# ---------------------------------------------------------------------- one round, then what each node said
def _round(answers, mutating=True):
    urls = [f"http://127.0.0.1:{8701 + i}" for i in range(len(answers))]
    call = Call(urls, "POST", "/v1/jobs/j/trigger", mutating, start=0, timeout_s=10, budget_s=30, now_s=0,
                fail_fast=True)
    for i, answer in enumerate(answers):
        step = call.next(0.1)
        assert isinstance(step, Try) and step.node == i
        if answer == "refused":
            call.not_sent(i, f"{urls[i]}: [Errno 111] Connection refused")
        elif answer == "lost":
            call.lost(i, "RemoteDisconnected")
        else:
            end = call.answered(i, answer, {"retry-after": "1"},
                                {"error": {"code": "unavailable", "message": "no leader accepted the command; "
                                                                             "last known leader: none"}})
            assert end is None
    end = call.next(0.2)  # at once: no wait, no second round
    assert isinstance(end, Fail)
    return end.error


def test_fail_fast_reports_one_round_at_once_with_the_next_step():
    e = _round(["refused", "refused"])
    assert isinstance(e, Unavailable) and e.message.startswith("node unreachable: http://127.0.0.1:8701: unreachable "
                                                                "([Errno 111] Connection refused)")
    assert "scripts/cluster.sh status" in e.message
    e = _round(["refused", 503, "refused"])
    assert isinstance(e, Unavailable) and e.message.startswith("no quorum") and "HTTP 503" in e.message
    assert "Nothing was changed" in e.message and "Start the stopped nodes" in e.message
    e = _round(["lost", "refused"])
    assert isinstance(e, Indeterminate) and "may have applied" in e.message and "Look before" in e.message
    # Without fail_fast the call goes round again (the SDK's clients keep their deadline).
    call = Call(["http://a:1"], "GET", "/v1/jobs", False, start=0, timeout_s=10, budget_s=30, now_s=0)
    call.next(0)
    call.not_sent(0, "refused")
    assert not isinstance(call.next(0.1), Fail)


def test_fail_fast_goes_round_again_after_a_504_to_a_mutation_until_the_deadline():
    urls = ["http://127.0.0.1:8701", "http://127.0.0.1:8702"]
    body = {"error": {"code": "indeterminate", "message": "no result within 5 s", "unknown": ["j"]}}

    def call(mutating=True):
        return Call(urls, "POST", "/v1/jobs:batch", mutating, start=0, timeout_s=10, budget_s=30, now_s=0,
                    fail_fast=True)

    c = call()
    assert c.next(0).node == 0 and c.answered(0, 504, {}, body) is None
    assert c.next(5).node == 1
    c.not_sent(1, "refused")
    assert isinstance(c.next(5.1), Wait)  # the leader's node said "unknown": ask it again
    assert c.next(5.3).node == 0 and c.answered(0, 504, {}, body) is None
    assert c.next(10).node == 1
    c.not_sent(1, "refused")
    assert isinstance(c.next(10.1), Wait)
    end = c.next(31)  # the deadline passed: what the last round said, and the last 504's account
    assert isinstance(end, Fail) and isinstance(end.error, Indeterminate)
    assert end.error.message.startswith("the outcome is unknown") and end.error.message.count("HTTP 504") == 1
    assert end.error.body == body and end.error.status is None
    # A round of 503s after the 504 ends it at once, unknown all the same.
    c = call()
    c.next(0)
    c.answered(0, 504, {}, body)
    c.next(5)
    c.not_sent(1, "refused")
    c.next(5.1)
    c.next(5.3)
    c.answered(0, 503, {}, {"error": {"code": "unavailable", "message": "no leader"}})
    c.next(10)
    c.not_sent(1, "refused")
    end = c.next(10.1)
    assert isinstance(end, Fail) and isinstance(end.error, Indeterminate) and end.error.body == body
    # A read is never sent again for a 504 (nothing to be unsure of).
    c = call(mutating=False)
    c.next(0)
    c.answered(0, 504, {}, body)
    c.next(1)
    c.not_sent(1, "refused")
    assert isinstance(c.next(1.1), Fail)


def test_a_fail_fast_read_rides_through_an_election_and_says_no_leader_when_every_node_answers():
    """A node answers a read 503 at once when it has no leader (a write only after waiting 5 s):
    the command line's reads failed 0.16 s into an ordinary election, saying to start the stopped
    nodes. A read goes round again for FAIL_FAST_READ_GRACE_S; past it, or for a write, the
    round's error, which says 'no quorum' only when a node did not answer."""
    from raftsched.client import core
    urls = ["http://127.0.0.1:8701", "http://127.0.0.1:8702", "http://127.0.0.1:8703"]
    no_leader = {"error": {"code": "unavailable", "message": "no leader: the leader 127.0.0.1:9702 is not reachable"}}

    def call(mutating):
        return Call(urls, "GET" if not mutating else "POST", "/v1/jobs/j/runs", mutating, start=0, timeout_s=10,
                    budget_s=30, now_s=0, fail_fast=True)

    c = call(False)
    for t in (0.0, 0.01):
        assert c.answered(c.next(t).node, 503, {"retry-after": "1"}, no_leader) is None
    c.not_sent(c.next(0.02).node, "refused")  # the dead leader's node
    wait = c.next(0.03)
    assert isinstance(wait, Wait), "a read goes round again during an election"
    assert c.next(1.0).node == 0 and c.answered(0, 200, {}, {"runs": []}) is not None
    # past the grace: the round's error; every node answered 503, so not "start the stopped nodes"
    c = call(False)
    now = 0.0
    while True:
        step = c.next(now)
        if isinstance(step, Fail):
            break
        if isinstance(step, Wait):
            now += max(step.seconds, 0.5)
            continue
        c.answered(step.node, 503, {"retry-after": "1"}, no_leader)
    assert now >= core.FAIL_FAST_READ_GRACE_S
    assert step.error.message.startswith("no leader: every node answered") and "Nothing was changed" not in step.error.message
    # a write fails after one round, as before
    c = call(True)
    for t in (0.0, 0.01, 0.02):
        c.answered(c.next(t).node, 503, {}, no_leader)
    end = c.next(0.03)
    assert isinstance(end, Fail) and "Nothing was changed" in end.error.message


# ---------------------------------------------------------------------- output
RUNS = {"job": "j", "runs": [{"id": "j@1", "state": "succeeded", "slot": "2026-01-01T00:00:00Z", "worker": None},
                             {"id": "j@2", "state": "failed", "slot": "2026-01-01T00:01:00Z",
                              "error": "x" * 80}]}


def test_output_formats(monkeypatch, capsys):
    import yaml
    for fmt, check in (("json", lambda out: json.loads(out) == RUNS), ("yaml", lambda out: yaml.safe_load(out) == RUNS)):
        cli_output.set_format(fmt)
        cli_output.show(RUNS)
        assert check(capsys.readouterr().out), fmt
    cli_output.set_format("table")
    cli_output.show(RUNS)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["FIELD", "VALUE"] and out[1].split() == ["job", "j"]
    assert out[3] == "RUNS (2)" and out[4].split() == ["ID", "STATE", "SLOTS", "ATTEMPT", "WORKER", "STARTED_AT",
                                                       "FINISHED_AT", "REASON", "ERROR"]
    assert out[6].endswith("x…") and len(out[6].split()[-1]) == cli_output.CELL_WIDTH_MAX
    # The default: JSON when piped (capsys is no terminal), a table on a terminal.
    cli_output.set_format(None)
    assert cli_output.output_format() == "json"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli_output.output_format() == "table"


def test_the_progress_bar_draws_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    for stream, drawn in ((io.StringIO(), False), (Tty(), True)):
        bar = cli_output.Progress(10, "apply", stream=stream)
        bar.update(5)
        bar.close()
        assert (stream.getvalue() == "\rapply [" + "#" * 15 + "-" * 15 + "] 5/10\n") is drawn
        assert drawn or stream.getvalue() == ""


# ---------------------------------------------------------------------- the command itself
def _run_here(cmd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def test_version_completion_and_a_closed_pipe(capsys):
    import raftsched
    from importlib.metadata import version
    from raftsched import cli
    assert raftsched.__version__ == version("raftsched")
    with pytest.raises(SystemExit) as ei:
        cli.main(["--version"])
    assert ei.value.code == 0 and capsys.readouterr().out == f"raftsched {raftsched.__version__}\n"
    assert cli.main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert "#compdef raftsched" in out and "--token-file" in out
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    if shutil.which("bash"):  # the script completes in bash: "raftsched tok<TAB>" is "tokens"
        p = subprocess.run(["bash", "-c", script + '\nCOMP_WORDS=(raftsched tok); COMP_CWORD=1; COMP_LINE="raftsched tok"; '
                            'COMP_POINT=${#COMP_LINE}; _shtab_raftsched; echo "${COMPREPLY[@]}"'],
                           capture_output=True, text=True, timeout=30)
        assert p.stdout.split() == ["tokens"], p.stdout + p.stderr
    # python -m raftsched, and a reader that closes the pipe early: no traceback, no "Exception ignored".
    p = _run_here(f"{sys.executable} -m raftsched completion bash | head -1")
    assert p.returncode == 0 and p.stdout.startswith("#") and p.stderr == "", p.stderr


def test_a_waited_backfill_draws_its_bar_on_a_terminal_only(monkeypatch, capsys):
    from raftsched import backfill_cli, cli_output
    # The final answer as a table (-o table): without it, stdout here is a pipe, whose answer is
    # JSON (tests/test_cli.py); the format is a module global another test may have left set.
    monkeypatch.setattr(cli_output, "_format", "table")
    views = [{"id": "b1", "kind": "backfill", "job": "j", "state": s, "reason": None,
              "progress": {"planned": 4, "created": c, "left_out": 0, "left_out_reasons": {}, "succeeded": c}}
             for s, c in (("running", 2), ("done", 4))]

    class Fake:
        def wait_backfill(self, bid, on_progress):
            for v in views:
                on_progress(v)
            return views[-1]

        def runs(self, job, limit):
            return {"runs": []}

    class Tty(io.StringIO):
        def isatty(self):
            return True
    for stream, drawn in ((io.StringIO(), False), (Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert backfill_cli._wait(Fake(), views[0]) == 0
        assert ("[###############---------------] 2/4" in stream.getvalue()) is drawn
        assert drawn or stream.getvalue() == ""
        assert "backfill b1 of job j: done" in capsys.readouterr().out


def test_a_worker_without_url_or_token_file_finds_the_recorded_cluster(tmp_path, monkeypatch):
    """``worker --token-file`` defaults like the rest: the recorded cluster's nodes and token."""
    from raftsched import cli
    from raftsched.worker import remote
    _recorded(tmp_path, base=18700)
    monkeypatch.chdir(tmp_path)
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    seen = []

    async def fake_run_worker(cfg):
        seen.append(cfg)
        return 0
    monkeypatch.setattr(remote, "run_worker", fake_run_worker)
    monkeypatch.setattr(cli, "_setup_logging", lambda level: None)
    assert cli.main(["worker", "--executors", "http", "--id", "w1"]) == 0
    assert seen[0].urls == [f"http://127.0.0.1:{18700 + n}" for n in (1, 2, 3)]
    assert seen[0].token == "recorded-token-0123456789"


def test_apply_shows_a_bar_then_what_was_applied_and_fails_on_conflicts(tmp_path, monkeypatch, capsys):
    from raftsched import cli
    from raftsched.client.core import error_of
    from raftsched.core import limits
    monkeypatch.setattr(limits, "batch_jobs_max", 2)
    monkeypatch.setattr(cli, "_setup_logging", lambda level: None)
    monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
    f = tmp_path / "jobs.json"
    f.write_text(json.dumps({"jobs": {f"j{i}": {} for i in range(3)}}))
    fail_second = []
    keys: set = set()

    class Fake:
        def __init__(self, urls, **kw):
            pass

        def put_jobs(self, part, create_only, idempotency_key=None):
            keys.add(idempotency_key)
            if fail_second and "j2" in part:
                raise error_of(422, {"error": {"code": "invalid", "message": "no", "field": "x", "job": "j2"}})
            return {"created": len(part) - ("j0" in part), "conflicts": int("j0" in part)}
    monkeypatch.setattr(cli, "Client", Fake)

    class Tty(io.StringIO):
        def isatty(self):
            return True
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    # (--all: the writes alone; the comparison before them is tests/test_cli_apply.py's)
    argv = ["apply", str(f), "--create-only", "--all", "--url", "http://127.0.0.1:9", "-o", "json"]
    assert cli.main(argv) == 1  # a conflict: the file and the cluster differ
    out = json.loads(capsys.readouterr().out)  # one answer for the two requests
    assert out == {"jobs": {}, "created": 2, "replaced": 0, "conflicts": 1, "commands": 0, "requests": 2}
    assert err.getvalue().startswith("raftsched: 3 jobs: sending 2 requests")
    assert "\rapply [" + "#" * 30 + "] 3/3\n" in err.getvalue() and "1 job(s) exist already" in err.getvalue()
    assert len(keys) == 1 and None not in keys  # one Idempotency-Key for the file
    fail_second.append(True)
    assert cli.main(argv) == 1
    out = json.loads(capsys.readouterr().out)  # what was applied, with the error
    assert out["created"] == 1 and out["requests"] == 1 and out["error"]["job"] == "j2"


@pytest.mark.parametrize("content, why", [
    (b"line1-0123456789ab\nline2-0123456789\n", "a line break at position 19"),
    (b"tok-0123456789 abcdef", "a space at position 15"),
    (b"tok-0123456789\x01abcdef", "a control character"),
    ("tok-0123456789€abcdef".encode(), "a non-ASCII character"),
    (b"\xff\xfe0123456789abcdefgh", "not UTF-8 text"),
])
def test_a_token_a_header_cannot_carry_is_refused_without_showing_it(tmp_path, monkeypatch, capsys, content, why):
    """A token file holding more than the token (the JSON `tokens create` printed, say) is exit 2
    naming the file and why, never a traceback with the token in it."""
    from raftsched import cli
    tok = tmp_path / "tok"
    tok.write_bytes(content)
    tok.chmod(0o600)
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    assert cli.main(["get", "j", "--url", "http://127.0.0.1:9", "--token-file", str(tok)]) == 2
    err = capsys.readouterr().err
    assert why in err and str(tok) in err and "Traceback" not in err
    assert "0123456789" not in err.replace(str(tok), "")
    monkeypatch.setenv("RAFTSCHED_TOKEN", "abc€0123456789abcdef")
    assert cli.main(["get", "j", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "RAFTSCHED_TOKEN" in err and "non-ASCII" in err and "0123456789" not in err


def test_a_token_file_that_is_a_directory_is_exit_2(tmp_path, monkeypatch, capsys):
    from raftsched import cli
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    assert cli.main(["get", "j", "--url", "http://127.0.0.1:9", "--token-file", str(d)]) == 2
    assert "Is a directory" in capsys.readouterr().err


def test_the_client_refuses_a_token_a_header_cannot_carry_without_quoting_it():
    from raftsched.client import Client
    c = Client(["http://127.0.0.1:9"], token="secret-0123456789\nmore")
    with pytest.raises(ValueError) as ei:
        c.get_job("j")
    assert "line break" in str(ei.value) and "secret" not in str(ei.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1"])
def test_a_url_with_a_bad_port_or_host_is_exit_2_naming_it(tmp_path, monkeypatch, capsys, url):
    from raftsched import cli
    _recorded(tmp_path, base=18700)  # (a recorded cluster is compared with the URL given)
    monkeypatch.chdir(tmp_path)
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    assert cli.main(["get", "j", "--url", url]) == 2
    err = capsys.readouterr().err
    assert "--url" in err and url in err and "Traceback" not in err


def test_a_spec_file_that_is_not_text_is_exit_1_naming_it(tmp_path, monkeypatch, capsys):
    from raftsched import cli
    _recorded(tmp_path, base=18700)
    monkeypatch.chdir(tmp_path)
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAFTSCHED_CONFIG", str(tmp_path / "none.toml"))
    spec = tmp_path / "spec.json"
    spec.write_bytes(b"\x7fELF\xff\xfe\x00")
    for argv in (["put", "j", str(spec)], ["apply", str(spec)], ["sinks", "put", "s", str(spec)]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code in (1, 2) and "not UTF-8" in err and str(spec) in err, (argv, err)


def test_apply_says_why_each_job_was_left_as_it_is(tmp_path, monkeypatch, capsys):
    """A job a create-only apply found, one the node refused as stale on every try, and one
    whose `after` was refused are three reasons, each said (before, all three were called
    "exist already (--create-only)")."""
    from raftsched import cli
    monkeypatch.setattr(cli, "_setup_logging", lambda level: None)
    monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
    f = tmp_path / "jobs.json"
    f.write_text(json.dumps({"jobs": {n: {} for n in ("a", "b", "c", "d")}}))

    class Fake:
        def __init__(self, urls, **kw):
            pass

        def put_jobs(self, part, create_only, idempotency_key=None):
            return {"jobs": {"a": {"error": {"code": "conflict", "message": "job 'a' exists"}},
                             "b": {"error": {"code": "conflict", "stale": True, "message": "fired ahead"}},
                             "c": {"error": {"code": "invalid", "field": "after", "message": "makes a cycle"}},
                             "d": {"created": True, "gen": 1}},
                    "created": 1, "replaced": 0, "conflicts": 3, "commands": 1}
    monkeypatch.setattr(cli, "Client", Fake)
    assert cli.main(["apply", str(f), "--all", "--url", "http://127.0.0.1:9", "-o", "json"]) == 1
    err = capsys.readouterr().err
    assert "1 job(s) exist already" in err and "1 job(s) fired while their replace was planned" in err \
        and "1 job(s) refused (their `after`" in err, err


def _health(slot: int, outcome: str) -> dict:
    from raftsched.core import notify
    h = [None] * 8
    h[notify.LAST_SLOT], h[notify.CONSECUTIVE] = [slot, outcome, None], 0
    return notify.view_health(h)


def test_jobs_and_workers_print_the_columns_people_read_and_one_object_its_nested_fields(capsys):
    """A user's walk found `raftsched jobs` printing spec, state and health as JSON cut at 48
    characters (no schedule, next slot or paused to be seen), and `raftsched workers` a STATE
    of active beside a STATUS of gone in its last column."""
    jobs = {"jobs": [
        {"name": "nightly", "spec": {"schedule": {"cron": "0 2 * * *", "timezone": "Europe/Paris"},
                                     "executor": {"type": "shell", "command": "x"}, "queue": "default"},
         "state": {"paused": False, "next_slot": "2026-12-07T01:00:00Z"},
         # the health the API shows (core/notify.py view_health: a test's own shape hid that LAST
         # read a field the view does not have, and was always empty)
         "health": _health(slot=1796000400000, outcome="succeeded")},
        {"name": "report", "spec": {"after": [{"job": "nightly", "on": "success"}], "executor": {"type": "python"},
                                    "queue": "q"},
         "state": {"paused": True, "next_slot": None}, "health": {"last_slot_outcome": None, "consecutive_failures": 2}}],
        "next": None, "total": 2}
    cli_output.set_format("table")
    try:
        cli_output.show(jobs)
        out = capsys.readouterr().out.splitlines()
        head = out.index("JOBS (2)") + 1
        assert out[head].split() == ["NAME", "SCHEDULE", "NEXT_SLOT", "PAUSED", "LAST", "FAILURES", "EXECUTOR", "QUEUE"]
        assert out[head + 1].split() == ["nightly", "0", "2", "*", "*", "*", "Europe/Paris", "2026-12-07T01:00:00Z",
                                         "false", "succeeded", "0", "shell", "default"]
        assert out[head + 2].split() == ["report", "after", "nightly", "true", "2", "python", "q"]
        cli_output.show({"workers": [{"id": "node-1/7", "state": "active", "status": "gone", "slots": 4, "held": 0,
                                      "labels": {"zone": "a"}, "executors": ["shell", "python"]}]})
        out = capsys.readouterr().out.splitlines()
        assert out[1].split()[:3] == ["ID", "STATUS", "LAST_SEEN"] and out[2].split()[:2] == ["node-1/7", "gone"]
        assert "zone=a" in out[2] and "shell,python" in out[2] and "active" not in out[2]
        cli_output.show(jobs["jobs"][0])  # one job: its nested fields as dotted keys
        rows = dict((line.split(None, 1) + [""])[:2] for line in capsys.readouterr().out.splitlines()[1:])
        assert rows["spec.schedule.cron"] == "0 2 * * *" and rows["state.next_slot"] == "2026-12-07T01:00:00Z"
        assert rows["health.last_slot_outcome.outcome"] == "succeeded"
        # a list of another shape shows every field, as before
        cli_output.show({"jobs": [{"x": 1}]})
        assert capsys.readouterr().out.splitlines()[-2:] == ["X", "1"]
    finally:
        cli_output.set_format(None)


def test_a_sinks_dead_list_shows_its_events_times_as_iso_not_ms_and_not_json(capsys):
    """A user's walk: `raftsched sinks dead` printed its AT column in raw milliseconds and each
    event as JSON cut at 48 characters. It shows the event's id, kind, job and slot, when it
    went dead, its attempts and error, times as ISO-8601."""
    dead = {"sink": "hook", "dead": [{"event": {"event_id": "ev-7", "seq": 7, "kind": "run.dead", "at": 1796572053120,
                                                "job": "fail3", "slot": 1796572053000, "run_id": "fail3@1796572053000"},
                                      "error": "HTTP 500", "attempts": 3, "at": 1796572060000}]}
    cli_output.set_format("table")
    try:
        cli_output.show(dead)
        out = capsys.readouterr().out.splitlines()
        head = out.index("DEAD (1)") + 1
        assert out[head].split() == ["EVENT_ID", "KIND", "JOB", "SLOT", "DEAD_AT", "ATTEMPTS", "ERROR"]
        assert out[head + 1].split() == ["ev-7", "run.dead", "fail3", "2026-12-06T15:47:33Z", "2026-12-06T15:47:40Z",
                                         "3", "HTTP", "500"]
    finally:
        cli_output.set_format(None)
