"""The raftsched command: node flag errors, and the client subcommands against one real node."""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from procs import Cluster, REPO, free_ports, wait_for


def iso(t_s: int) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cli(*args, env=None, stdin=None, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "raftsched.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, input=stdin, env=env)


@pytest.mark.parametrize("extra,msg", [
    (["--executors", "shell,ftp"], "unknown type(s) ftp"),
    (["--slots", "1000"], "--slots must be"),
    (["--lease-ttl-s", "0.1"], "--lease-ttl-s must be"),
    (["--metrics-workers-max", "-1"], "--metrics-workers-max must be"),
    (["--raft", "10.1.2.3:9000"], "not a loopback address"),
    (["--api", "nohost"], "expected HOST:PORT"),
    (["--labels", "pool"], "expected NAME=VALUE"),
    (["--labels", "pool=a b"], "label values are"),
    (["--queues", "a b"], "--queues"),
    (["--join", None], "--join needs --peers"),
])
def test_node_flag_errors_are_one_line_and_exit_2(tmp_path, extra, msg):
    c = Cluster(tmp_path, n=1)
    argv = c.argv(0)[3:]  # drop python -m raftsched.cli
    for flag, value in zip(extra[::2], extra[1::2]):
        if value is None:  # a switch
            argv.append(flag)
        elif flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    p = cli(*argv)
    assert p.returncode == 2, p.stderr
    assert msg in p.stderr and "Traceback" not in p.stderr


def test_the_power_loss_model_is_refused_without_its_test_variable(tmp_path):
    """--simulate-power-loss (the fault harness's disk model) is a test hook: a node refuses it
    unless RAFTSCHED_TEST_POWER_LOSS=1."""
    import os
    c = Cluster(tmp_path, n=1)
    env = {k: v for k, v in os.environ.items() if k != "RAFTSCHED_TEST_POWER_LOSS"}
    p = cli(*c.argv(0)[3:], "--simulate-power-loss", env=env)
    assert p.returncode == 2, p.stderr
    assert "RAFTSCHED_TEST_POWER_LOSS=1" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "node-1" / ".powerloss").exists()


@pytest.mark.parametrize("extra,msg", [
    ([], "no cluster to talk to"),
    (["--url", "ftp://x"], "is not an http"),
    (["--url", "http://127.0.0.1:9", "--slots", "0"], "--slots must be"),
    (["--url", "http://127.0.0.1:9", "--executors", "shell,ftp"], "unknown type(s) ftp"),
    (["--url", "http://127.0.0.1:9", "--labels", "pool"], "expected NAME=VALUE"),
    (["--url", "http://127.0.0.1:9", "--id", "a b"], "--id"),
    (["--url", "http://127.0.0.1:9", "--queues", "a b"], "--queues"),
    (["--url", "http://127.0.0.1:9", "--lease-ttl-s", "0.1"], "--lease-ttl-s must be"),
    (["--url", "http://127.0.0.1:9", "--wait-s", "600"], "--wait-s must be"),
    (["--url", "http://127.0.0.1:9", "--isolation", "subprocess"], "--isolation is for --app"),
    (["--url", "http://127.0.0.1:9", "--app", "no_such_module:app"], "no module 'no_such_module'"),
    (["--url", "http://127.0.0.1:9", "--app", "examples.nightly_report:nope"], "has no 'nope'"),
    (["--url", "http://127.0.0.1:9", "--app", "examples.nightly_report:app", "--executors", "shell"],
     "leave --executors out"),
    # (taken and ignored before: the handlers ran as root, the walk's worker being root)
    (["--url", "http://127.0.0.1:9", "--app", "examples.nightly_report:app", "--run-as", "nobody"],
     "--run-as is not for --app"),
    (["--url", "http://127.0.0.1:9", "--app", "examples.nightly_report:app", "--run-uids", "1900000000-1900000099"],
     "--run-uids is not for --app"),
    (["--url", "http://127.0.0.1:9", "--app", "examples.nightly_report:app", "--labels", "raftsched.app=x"],
     "raftsched.app is the app's name (reports)"),
])
def test_worker_flag_errors_are_one_line_and_exit_2(tmp_path, extra, msg):
    if "--app" in extra and os.geteuid() == 0:
        extra = [*extra, "--allow-root-jobs"]  # (as root: its own refusal, the next test)
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    # Away from the checkout and the caller's config: a cluster started there by scripts/cluster.sh
    # (README's first command) would otherwise be the one the flagless worker finds.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTSCHED_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    p = cli("worker", *extra, "--token-file", str(token), env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert msg in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_an_app_worker_as_root_is_refused_unless_it_allows_root_jobs(tmp_path, monkeypatch):
    """A review: a root ``--app`` worker imported the app and ran its handlers as root, where a
    worker of built-in executors refuses to run jobs as root without --allow-root-jobs."""
    from raftsched import cli as cli_mod
    from raftsched.config import ConfigError
    import argparse
    monkeypatch.setattr(cli_mod.os, "geteuid", lambda: 0)
    monkeypatch.chdir(REPO)

    def args(allow: bool) -> argparse.Namespace:
        return argparse.Namespace(app="examples.nightly_report:app", isolation=None, executors=None, run_as="",
                                  run_uids="", allow_root_jobs=allow)
    with pytest.raises(ConfigError, match="^--app as root would import the app and run its handlers as root"):
        cli_mod._worker_app(args(False), {})
    assert cli_mod._worker_app(args(True), {}) is not None


def test_client_subcommands(tmp_path):
    c = Cluster(tmp_path, n=1)
    c.start()
    try:
        c.wait_leader(30)
        token_file = tmp_path / "client-token"
        token_file.write_text(c.token)
        token_file.chmod(0o600)
        base = ["--url", c.url(0), "--token-file", str(token_file)]
        spec = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["false"]},
                "misfire": {"policy": "skip"}}
        p = cli("put", "cj", "-", *base, stdin=json.dumps(spec))
        assert p.returncode == 0, p.stdout + p.stderr
        assert json.loads(p.stdout)["created"] is True
        p = cli("trigger", "cj", *base)
        assert p.returncode == 0, p.stdout
        run = json.loads(p.stdout)["run"]
        wait_for(lambda: run in [r["id"] for r in json.loads(cli("dlq", *base).stdout)["runs"]], 30, "run dead")
        p = cli("requeue", run, *base)
        assert p.returncode == 0 and json.loads(p.stdout)["attempt"] == 2, p.stdout
        p = cli("run", run, *base)  # one run by its id (a walk found no command for it)
        assert p.returncode == 0 and json.loads(p.stdout)["id"] == run and json.loads(p.stdout)["attempts"], p.stdout
        assert cli("run", "cj@1", *base).returncode == 1
        p = cli("get", "nope", *base)
        assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "not_found"
        p = cli("put", "cj", "-", "--url", c.url(0), "--token", "wrong" * 8, stdin=json.dumps(spec))
        assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "unauthorized"
        # An outage window after the job exists, relative to now (a fixed date would fall before
        # the job's creation once it is past, and explain would rightly find no slot in it).
        lo = int(time.time()) + 600
        p = cli("explain", "cj", iso(lo), iso(lo + 3 * 3600), *base)
        assert p.returncode == 0 and json.loads(p.stdout)["slots_due"] == 3, p.stdout
        # apply: many jobs from one file; with --create-only the existing one is a conflict.
        # The file and the cluster differ: the command says so, and its status is not 0.
        p = cli("apply", "-", "--create-only", *base, stdin=json.dumps({"jobs": {"cj": spec, "cj-2": spec, "cj-3": spec}}))
        assert p.returncode == 1 and "1 job(s) exist already" in p.stderr, p.stdout + p.stderr
        out = json.loads(p.stdout)
        assert (out["created"], out["conflicts"]) == (2, 1) and out["jobs"]["cj"]["error"]["code"] == "conflict"
        p = cli("apply", "-", "--create-only", *base, stdin=json.dumps({"jobs": {"cj-7": spec}}))
        assert p.returncode == 0 and json.loads(p.stdout)["conflicts"] == 0, p.stdout + p.stderr
        # The same file again: compared, and nothing written (no new generation); --all writes it.
        gen = json.loads(cli("get", "cj-7", *base).stdout)["state"]["generation"]
        p = cli("apply", "-", *base, stdin=json.dumps({"jobs": {"cj-7": spec}}))
        out = json.loads(p.stdout)
        assert p.returncode == 0 and out["unchanged"] == 1 and out["jobs"]["cj-7"]["unchanged"] is True, p.stdout
        assert json.loads(cli("get", "cj-7", *base).stdout)["state"]["generation"] == gen
        p = cli("apply", "-", "--all", *base, stdin=json.dumps({"jobs": {"cj-7": spec}}))
        assert p.returncode == 0 and json.loads(p.stdout)["replaced"] == 1, p.stdout
        assert json.loads(cli("get", "cj-7", *base).stdout)["state"]["generation"] > gen
        p = cli("apply", "-", *base, stdin=json.dumps({"jobs": {"cj-4": spec, "cj-5": {"schedule": {"every_s": 0}}}}))
        assert p.returncode == 1 and json.loads(p.stdout)["error"]["job"] == "cj-5"
        p = cli("apply", "-", *base, stdin=json.dumps({"cj-6": spec}))
        assert p.returncode == 1 and "expected" in p.stderr
        assert cli("get", "cj-4", *base).returncode == 1, "an invalid batch changes nothing"
        # Several URLs: a node that is down is skipped for the next (the Client's failover).
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        t0 = time.monotonic()
        p = cli("get", "cj", "--url", f"{dead},{c.url(0)}", "--token", c.token)
        assert p.returncode == 0 and json.loads(p.stdout)["name"] == "cj", p.stdout + p.stderr
        assert time.monotonic() - t0 < 10, "a stopped node among others is skipped at once"
        # A stopped node alone: one line saying so and what to do, at once (no retries to a deadline).
        t0 = time.monotonic()
        p = cli("trigger", "cj", "--url", dead, "--token", c.token)
        assert p.returncode == 1 and p.stdout == "" and "node unreachable" in p.stderr, p.stderr
        assert "scripts/cluster.sh status" in p.stderr and len(p.stderr.strip().splitlines()) == 2, p.stderr
        assert time.monotonic() - t0 < 10, "a stopped node is reported at once, not after the 30 s deadline"
        assert cli("get", "cj", "--url", "ftp://x", "--token", c.token).returncode == 2
        # The fleet: the node's embedded worker is registered; drain it.
        ws = json.loads(cli("workers", *base).stdout)["workers"]
        assert [w["kind"] for w in ws] == ["embedded"]
        p = cli("workers", "--id", ws[0]["id"], *base)
        assert p.returncode == 0 and json.loads(p.stdout)["runs"] == []
        p = cli("drain", ws[0]["id"], *base)
        assert p.returncode == 0 and json.loads(p.stdout)["state"] == "draining", p.stdout
        assert cli("drain", "nobody", *base).returncode == 1
    finally:
        c.stop()


def test_hidden_test_hooks_reach_the_node_config_and_stay_out_of_help(tmp_path, monkeypatch):
    """The dial map, the clock-offset file and the fire log are NodeConfig fields set by hidden
    flags (run_node reads no environment variable); --help does not list them."""
    from raftsched import cli as cli_mod
    from raftsched.node import node as node_mod

    seen = []

    async def fake_run_node(cfg):
        seen.append(cfg)

    monkeypatch.setattr(node_mod, "run_node", fake_run_node)  # cmd_node imports it when it runs
    c = Cluster(tmp_path, n=1)
    argv = c.argv(0)[3:]
    rc = cli_mod.main(argv + ["--dial-map", "127.0.0.1:9001=127.0.0.1:9101,127.0.0.1:9002=127.0.0.1:9102",
                              "--clock-offset-file", str(tmp_path / "clock"), "--fire-log", str(tmp_path / "fire.log")])
    assert rc == 0 and len(seen) == 1
    cfg = seen[0]
    assert cfg.dial_map == {"127.0.0.1:9001": "127.0.0.1:9101", "127.0.0.1:9002": "127.0.0.1:9102"}
    assert (cfg.clock_offset_file, cfg.fire_log_path) == (str(tmp_path / "clock"), str(tmp_path / "fire.log"))
    assert cli_mod.main(argv) == 0
    assert (seen[1].dial_map, seen[1].clock_offset_file, seen[1].fire_log_path) == (None, None, None)
    assert cli_mod.main(argv + ["--dial-map", "nohost"]) == 2
    help_text = cli("node", "--help").stdout
    assert "--id" in help_text and not any(f in help_text for f in ("--dial-map", "--clock-offset-file", "--fire-log"))


# ---------------------------------------------------------------------- the client subcommands, in process
class _FakeClient:
    """Stands in for raftsched.client.Client in cli._with_client: each call raises ``error``, or
    answers with its name and arguments."""

    error = None

    def __init__(self, urls, **kw):
        self.urls, self.kw = urls, kw

    def __getattr__(self, name):
        def call(*args, **kw):
            if self.error is not None:
                raise self.error
            return {"called": name, "args": list(args)}
        return call


def _run(monkeypatch, argv, error=None, token_args=None):
    from raftsched import cli as cli_mod
    made = []

    class Fake(_FakeClient):
        def __init__(self, urls, **kw):
            super().__init__(urls, **kw)
            made.append(self)

    Fake.error = error
    monkeypatch.setattr(cli_mod, "Client", Fake)
    monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)  # the session's logging stays
    monkeypatch.setattr(logging.getLogger("raftsched.client"), "level", logging.getLogger("raftsched.client").level)
    if token_args is None:
        monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
        token_args = []
    return cli_mod.main(argv + ["--url", "http://127.0.0.1:9"] + token_args), made


def test_the_token_comes_from_a_file_or_the_environment_and_on_the_command_line_is_warned_of(
        monkeypatch, capsys, tmp_path):
    """--token is visible to every user of the machine (ps): it works, with a warning on stderr;
    --token-file and RAFTSCHED_TOKEN do not warn. A token file others may read is refused."""
    monkeypatch.delenv("RAFTSCHED_TOKEN", raising=False)
    rc, (c,) = _run(monkeypatch, ["get", "j"], token_args=["--token", "on-the-line"])
    err = capsys.readouterr().err
    assert rc == 0 and c.kw["token"] == "on-the-line" and "--token shows the token" in err and "--token-file" in err
    f = tmp_path / "token"
    f.write_text("from-a-file-0123456789\n")
    f.chmod(0o600)
    rc, (c,) = _run(monkeypatch, ["get", "j"], token_args=["--token-file", str(f)])
    assert rc == 0 and c.kw["token"] == "from-a-file-0123456789" and capsys.readouterr().err == ""
    rc, (c,) = _run(monkeypatch, ["get", "j"])
    assert rc == 0 and c.kw["token"] == "t" and capsys.readouterr().err == ""
    f.chmod(0o644)
    rc, made = _run(monkeypatch, ["get", "j"], token_args=["--token-file", str(f)])
    assert rc == 2 and made == [] and "readable by others" in capsys.readouterr().err


def test_client_subcommands_take_their_defaults_from_the_client(monkeypatch, capsys):
    from raftsched.client.core import BATCH_TIMEOUT_S, DEADLINE_S_DEFAULT
    from raftsched.client.endpoints import PREVIEW_COUNT_DEFAULT
    rc, (c,) = _run(monkeypatch, ["preview", "j"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out) == {"called": "preview", "args": ["j", PREVIEW_COUNT_DEFAULT]}
    assert c.kw["deadline_s"] == DEADLINE_S_DEFAULT and c.kw["timeout_s"] == BATCH_TIMEOUT_S


def test_the_deadline_subcommands_call_the_client(monkeypatch, capsys):
    rc, _ = _run(monkeypatch, ["deadlines", "--state", "missed", "--job", "j", "--since", "2026-12-01T00:00:00Z"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {
        "called": "list_deadlines", "args": ["missed", "j", "2026-12-01T00:00:00Z", 20]}
    rc, _ = _run(monkeypatch, ["ping", "j", "--status", "start"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {"called": "ping", "args": ["j", "start"]}
    # --slot as a run id names it (ms) or as an ISO time: sent as an integer or as given.
    from raftsched import cli as cli_mod
    sent = []
    monkeypatch.setattr(_FakeClient, "ping", lambda self, name, status, slot=None: sent.append(slot) or {}, raising=False)
    for given, want in (("1796173200000", 1796173200000), ("2026-12-02T01:00:00Z", "2026-12-02T01:00:00Z"),
                        ("17961732e3", "17961732e3"), ("１２３", "１２３")):
        rc, _ = _run(monkeypatch, ["ping", "j", "--slot", given])
        assert rc == 0 and sent.pop() == want and type(want) is type(cli_mod._slot_arg(given)), given
    capsys.readouterr()
    rc, _ = _run(monkeypatch, ["explain", "j", "--slot", "2026-12-02T01:00:00Z"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {"called": "explain", "args": ["j", None, None]}
    # a window without its end, or both forms: a usage error, nothing sent (it was a 400 from the node);
    # neither is a triggered job's question (its parents and waiting slots): sent, the node answers
    for argv in (["explain", "j", "2026-12-02T01:00:00Z"],
                 ["explain", "j", "2026-12-02T01:00:00Z", "2026-12-02T02:00:00Z", "--slot", "2026-12-02T01:00:00Z"]):
        rc, _ = _run(monkeypatch, argv)
        out = capsys.readouterr()
        assert rc == 2 and "called" not in out.out and "raftsched explain: give" in out.err, (argv, rc, out)


def test_cancel_calls_the_client_with_its_reason(monkeypatch, capsys):
    rc, _ = _run(monkeypatch, ["cancel", "j@1796173200000", "--reason", "bad input"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {
        "called": "cancel_run", "args": ["j@1796173200000", "bad input"]}
    rc, _ = _run(monkeypatch, ["cancel", "j@1796173200000"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == {"called": "cancel_run", "args": ["j@1796173200000", None]}
    rc, _ = _run(monkeypatch, ["cancel", "j@1796173200000", "--reason", "  "])  # (a walk: an empty one was a 422)
    assert rc == 0 and json.loads(capsys.readouterr().out)["args"] == ["j@1796173200000", None]


def test_cancel_job_asks_again_while_runs_are_left_and_prints_one_answer(monkeypatch, capsys):
    answers = [{"job": "j", "cancelled": 2, "runs": ["j@1", "j@2"], "passed": [], "more": True, "next": "j@2"},
               {"job": "j", "cancelled": 1, "runs": ["j@3"], "passed": [{"run": "j@4", "state": "running"}],
                "more": False}]
    calls = []

    def cancel_job_runs(self, name, reason=None, running=False, after=None):
        calls.append((name, reason, running, after))
        return answers[len(calls) - 1]
    monkeypatch.setattr(_FakeClient, "cancel_job_runs", cancel_job_runs, raising=False)
    rc, _ = _run(monkeypatch, ["cancel", "--job", "j", "--reason", "backlog", "--running"])
    assert rc == 0 and calls == [("j", "backlog", True, None), ("j", "backlog", True, "j@2")]
    assert json.loads(capsys.readouterr().out) == {"job": "j", "cancelled": 3, "runs": ["j@1", "j@2", "j@3"],
                                                   "passed": [{"run": "j@4", "state": "running"}], "more": False,
                                                   "requests": 2}
    # An answer with more but no cursor (a node of another version) ends the loop, more said,
    # and the exit status says runs may be left.
    answers[:] = [{"job": "j", "cancelled": 0, "runs": [], "passed": [{"run": "j@5", "state": "running"}],
                   "more": True}]
    calls.clear()
    rc, _ = _run(monkeypatch, ["cancel", "--job", "j"])
    out = capsys.readouterr()
    assert rc == 1 and len(calls) == 1 and json.loads(out.out)["more"] is True and "may be left" in out.err
    # A failure after a request that ended runs: what was ended is printed, then the error.
    from raftsched.core.errors import Unavailable
    answers[:] = [{"job": "j", "cancelled": 1, "runs": ["j@6"], "passed": [], "more": True, "next": "j@6"}]
    calls.clear()

    def failing_second(self, name, reason=None, running=False, after=None):
        calls.append(name)
        if len(calls) == 2:
            raise Unavailable("no leader")
        return answers[0]
    monkeypatch.setattr(_FakeClient, "cancel_job_runs", failing_second, raising=False)
    rc, _ = _run(monkeypatch, ["cancel", "--job", "j"])
    out = capsys.readouterr()
    assert rc != 0 and json.loads(out.out)["runs"] == ["j@6"] and "no leader" in out.err, (rc, out)
    monkeypatch.setattr(_FakeClient, "cancel_job_runs", cancel_job_runs, raising=False)
    # One of RUN and --job, and --running only with --job: usage errors, nothing sent.
    calls.clear()
    for argv, said in ((["cancel"], "give a RUN id (NAME@MS...), or --job NAME"),
                       (["cancel", "j@1", "--job", "j"], "not both"), (["cancel", "j@1", "--running"], "--running goes")):
        rc, _ = _run(monkeypatch, argv)
        out = capsys.readouterr()
        assert rc == 2 and not calls and "called" not in out.out and said in out.err, (argv, out)


@pytest.mark.parametrize("argv", [["get", "j"], ["backfills"], ["requeue", "r@1"], ["cancel", "r@1"],
                                  ["backfill", "j", "--from", "a", "--to", "b"]])
def test_one_path_prints_a_client_error_for_every_subcommand(monkeypatch, capsys, argv):
    from raftsched.client.core import error_of, with_status
    from raftsched.core.errors import Unavailable
    body = {"error": {"code": "not_found", "message": "no such thing", "field": "name"}}
    rc, _ = _run(monkeypatch, argv, error=error_of(404, body))
    out = capsys.readouterr()
    assert rc == 1 and json.loads(out.out) == body and out.err == ""  # a node's answer, as it sent it
    rc, _ = _run(monkeypatch, argv, error=with_status(Unavailable("no node reachable within 30 s"), None))
    out = capsys.readouterr()
    assert rc == 1 and out.out == "" and out.err == "raftsched: no node reachable within 30 s\n"


def test_the_sinks_subcommands_call_the_client(monkeypatch, capsys, tmp_path):
    spec = tmp_path / "sink.json"
    spec.write_text(json.dumps({"type": "slack", "secrets": {"url": "https://hooks.example/x"}}))
    for argv, called, args in ((["sinks", "list"], "sinks", []), (["sinks", "get", "ops"], "get_sink", ["ops"]),
                               (["sinks", "put", "ops", str(spec)], "put_sink",
                                ["ops", {"type": "slack", "secrets": {"url": "https://hooks.example/x"}}]),
                               (["sinks", "delete", "ops"], "delete_sink", ["ops"]),
                               (["sinks", "dead", "ops", "--limit", "5"], "sink_dead", ["ops", 5]),
                               (["sinks", "requeue", "ops", "--event", "ev-3"], "sink_requeue", ["ops", ["ev-3"]])):
        rc, _ = _run(monkeypatch, argv)
        assert rc == 0 and json.loads(capsys.readouterr().out) == {"called": called, "args": args}, argv
    spec.write_text("{not json")
    rc, made = _run(monkeypatch, ["sinks", "put", "ops", str(spec)])
    assert rc == 1 and "malformed JSON" in capsys.readouterr().err
    # A key named twice is refused before any request, naming it (the node refuses it too).
    spec.write_text('{"type": "slack", "type": "webhook"}')
    rc, made = _run(monkeypatch, ["sinks", "put", "ops", str(spec)])
    err = capsys.readouterr().err
    assert rc == 1 and err == f"raftsched: {spec}: malformed JSON: the key 'type' appears twice in one object\n", err


#: The read subcommands, and the client method each calls.
STALE_READS = [(["jobs"], "list_jobs"), (["get", "j"], "get_job"), (["runs", "j"], "runs"), (["dlq"], "dlq"),
               (["queues"], "queues"), (["workers"], "workers"), (["workers", "--id", "w"], "worker"),
               (["deadlines"], "list_deadlines"), (["preview", "j"], "preview"), (["backfills"], "backfills"),
               (["backfills", "b1"], "get_backfill"), (["tokens", "list"], "tokens"), (["sinks", "list"], "sinks"),
               (["sinks", "get", "s"], "get_sink"), (["sinks", "dead", "s"], "sink_dead"),
               (["secrets", "status"], "secrets_status")]


def test_stale_reads_the_replica_on_every_read_subcommand_and_is_no_flag_of_a_write(monkeypatch, capsys):
    """``--stale`` passes ``stale=True`` to the read the subcommand makes (the Client's own
    signature says which methods take it); without it nothing is passed: reads are consistent."""
    from raftsched.client import Client
    calls: list = []

    def method(name):
        sig = inspect.signature(getattr(Client, name))

        def call(*args, **kw):
            calls.append((name, kw))
            return {"called": name}
        call.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
        return call

    class Recording(_FakeClient):
        def __getattr__(self, name):
            return method(name)
    from raftsched import cli as cli_mod
    monkeypatch.setattr(cli_mod, "Client", Recording)
    monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
    monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
    parsers = []  # cli.main's parser, built once (building it is most of a subcommand's time)
    parse = argparse.ArgumentParser.parse_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args",
                        lambda self, *a, **kw: (parsers.append(self), parse(self, *a, **kw))[1])
    assert cli_mod.main(["queues", "--stale", "--url", "http://127.0.0.1:9"]) == 0
    top = parsers[0]
    for argv, name in STALE_READS:
        for flag in ([], ["--stale"]):
            calls.clear()
            args = top.parse_args(argv + flag + ["--url", "http://127.0.0.1:9"])
            assert args.func(args) == 0, argv
            assert [c[0] for c in calls] == [name], argv
            assert calls[0][1].get("stale", False) is bool(flag), (argv, flag, calls)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:  # a write has no --stale
        top.parse_args(["trigger", "j", "--stale", "--url", "http://127.0.0.1:9"])
    assert ei.value.code == 2 and "--stale" in capsys.readouterr().err


def test_a_malformed_payload_is_a_usage_error(monkeypatch, capsys):
    rc, made = _run(monkeypatch, ["backfill", "j", "--from", "a", "--to", "b", "--payload", "{not json"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("raftsched: --payload: malformed JSON") and err.count("\n") == 1
    rc, made = _run(monkeypatch, ["backfill", "j", "--from", "a", "--to", "b", "--payload", '{"a": 1, "a": 2}'])
    err = capsys.readouterr().err
    assert rc == 2 and err == "raftsched: --payload: malformed JSON: the key 'a' appears twice in one object\n", err


def test_waiting_for_an_operation_says_once_when_it_is_paused(monkeypatch, capsys):
    from raftsched import backfill_cli

    def view(state, reason=None, purged=0):
        return {"id": "op", "kind": "purge", "job": None, "state": state, "reason": reason,
                "progress": {"planned": 2, "purged": purged, "left_out": 0, "left_out_reasons": {}}}
    views = [view("running"), view("paused", "paused by request"), view("paused", "paused by request"),
             view("running", purged=1), view("paused", "queue q is full"), view("done", purged=2)]

    class Fake:
        def wait_backfill(self, op_id, on_progress):
            for v in views:
                on_progress(v)
            return views[-1]

    assert backfill_cli._wait(Fake(), view("running")) == 0
    out = capsys.readouterr()
    notes = [line for line in out.err.splitlines() if "is paused" in line]
    assert len(notes) == 2 and "(paused by request)" in notes[0] and "raftsched backfill-resume op" in notes[0]
    # (piped, as here: the operation as it ended, in JSON; on a terminal or with -o table, the table)
    assert "(queue q is full)" in notes[1] and json.loads(out.out)["state"] == "done", out.out
    from raftsched import cli_output
    cli_output.set_format("table")
    try:
        assert backfill_cli._wait(Fake(), view("running")) == 0
        assert capsys.readouterr().out.startswith("purge op: done")
    finally:
        cli_output.set_format(None)


def test_resume_takes_catch_up_and_an_error_naming_a_query_parameter_says_its_flag(monkeypatch, capsys):
    """`raftsched resume NAME --catch-up` sends ?catch_up=true (the API had it, the command line
    did not). A node's error that advises a query parameter (`delete with ?force=true`) is printed
    as the node sent it, and stderr names the command line's flag for it."""
    from raftsched import cli as cli_mod
    from raftsched.core.errors import Conflict
    calls = []

    class Fake(_FakeClient):
        def resume(self, name, catch_up=False):
            calls.append((name, catch_up))
            return {"job": name, "paused": False}

    monkeypatch.setattr(cli_mod, "Client", Fake)
    monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
    monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
    for extra, want in (([], False), (["--catch-up"], True)):
        assert cli_mod.main(["resume", "j", *extra, "--url", "http://127.0.0.1:9"]) == 0
        assert calls.pop() == ("j", want)
    capsys.readouterr()
    e = Conflict("job j has jobs that run after it: k; delete them first, or delete with ?force=true "
                 "(their waiting slots are then recorded dependency_missing)", field="name")
    e.status, e.body = 409, {"error": {"code": "conflict", "message": e.message, "field": "name"}}
    rc, _ = _run(monkeypatch, ["delete", "j"], error=e)
    out = capsys.readouterr()
    assert rc == 1 and json.loads(out.out) == e.body
    assert out.err == "raftsched: (?force=true is --force here)\n", out.err
    e2 = Conflict("job j: no such thing", field="name")
    e2.status, e2.body = 409, {"error": {"code": "conflict", "message": e2.message, "field": "name"}}
    rc, _ = _run(monkeypatch, ["delete", "j"], error=e2)
    assert rc == 1 and capsys.readouterr().err == ""
    # No node answered for good (no status): the reason is on stderr, and so is the flag, for a
    # command that has it (a read); a command without it is told nothing of a flag it lacks.
    from raftsched.core.errors import Unavailable
    e3 = Unavailable("node-1: no leader; retry, or read its replica as it is with ?stale=true")
    for argv, hint in ((["jobs"], True), (["graph", "j"], True), (["trigger", "j"], False)):
        rc, _ = _run(monkeypatch, argv, error=e3)
        err = capsys.readouterr().err
        assert rc == 1 and err.startswith("raftsched: node-1: no leader"), (argv, err)
        assert ("(?stale=true is --stale here)" in err) is hint, (argv, err)


def test_backfill_takes_cascade(monkeypatch, capsys):
    """`raftsched backfill JOB ... --cascade children` sends cascade (the API had it, the command
    line did not: a cascade needed curl); without it, none is sent (the node's default)."""
    from raftsched import cli as cli_mod
    sent = []

    class Fake(_FakeClient):
        def backfill(self, job, from_, to, **kw):
            sent.append(kw.get("cascade") if kw.get("upstream") is None else ("upstream", kw["upstream"]))
            return {"id": "b1"}

    monkeypatch.setattr(cli_mod, "Client", Fake)
    monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
    monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
    base = ["backfill", "j", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"]
    for extra, want in (([], None), (["--cascade", "children"], "children"), (["--cascade", "none"], "none"),
                        (["--upstream", "ignore"], ("upstream", "ignore"))):
        assert cli_mod.main(base + extra + ["--url", "http://127.0.0.1:9"]) == 0
        assert sent.pop() == want
    capsys.readouterr()
