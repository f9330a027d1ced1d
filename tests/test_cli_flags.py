"""The client subcommands' flags for what the API takes (runs' filters, a trigger's slot and
payload, a spec file's preview), command groups without their subcommand, and no abbreviated
options: in process, against a recording stand-in for the Client."""
from __future__ import annotations

import argparse
import json
import logging
import re

import pytest

URL = ["--url", "http://127.0.0.1:9"]


class _Recording:
    """Stands in for raftsched.client.Client in cli._with_client: records each call (name,
    positional and keyword arguments) and answers ``answers[name]``, else ``{}``."""

    calls: list = []
    answers: dict = {}

    def __init__(self, urls, **kw):
        self.urls, self.kw = urls, kw

    def __getattr__(self, name):
        def call(*args, **kw):
            type(self).calls.append((name, args, kw))
            answer = type(self).answers.get(name, {})
            return answer(*args, **kw) if callable(answer) else answer
        return call


@pytest.fixture
def run(monkeypatch):
    """``run(argv, answers=None)``: cli.main(argv + --url ...) with the Client recorded; returns
    (exit status, the calls)."""
    from raftsched import cli as cli_mod

    def go(argv, answers=None):
        class Fake(_Recording):
            calls: list = []
        Fake.answers = answers or {}
        monkeypatch.setattr(cli_mod, "Client", Fake)
        monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
        monkeypatch.setattr(logging.getLogger("raftsched.client"), "level",
                            logging.getLogger("raftsched.client").level)
        monkeypatch.setenv("RAFTSCHED_TOKEN", "t")
        try:
            rc = cli_mod.main(argv + URL)
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
        return rc, Fake.calls
    return go


def _parsers():
    """cli.main's parser and every subcommand's, recursively."""
    from raftsched import cli as cli_mod
    seen = []
    parse = argparse.ArgumentParser.parse_args

    def grab(self, *a, **kw):
        seen.append(self)
        raise SystemExit(0)
    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            cli_mod.main(["jobs"])
    finally:
        argparse.ArgumentParser.parse_args = parse  # type: ignore[method-assign]

    def walk(p):
        yield p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    yield from walk(sp)
    return list(walk(seen[0]))


# ---------------------------------------------------------------------------- abbreviations
def test_no_parser_of_the_command_takes_an_abbreviated_option():
    parsers = _parsers()
    assert len(parsers) > 30
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("argv,gone", [
    (["explain", "j", "2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z", "--sl", "2026-12-01T00:00:00Z"], "--sl"),
    (["runs", "j", "--lim", "5"], "--lim"),
    (["trigger", "j", "--prop"], "--prop"),
])
def test_an_abbreviated_option_is_refused_not_taken_for_the_one_it_begins(run, capsys, argv, gone):
    rc, calls = run(argv)
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and f"unrecognized arguments: {gone}" in err, err


def test_explain_says_from_and_to_are_positional_rather_than_matching_token(run, capsys):
    """``raftsched explain NAME --to T`` was "ambiguous option: --to could match --token"
    (argparse's prefix matching); now it says how the window is given, and sends nothing."""
    for argv in (["explain", "j", "--to", "2026-12-01T01:00:00Z"],
                 ["explain", "j", "--from", "2026-12-01T00:00:00Z", "--to", "2026-12-01T01:00:00Z"]):
        rc, calls = run(argv)
        err = capsys.readouterr().err
        assert rc == 2 and calls == [], err
        assert "ambiguous" not in err and "FROM and TO are positional: raftsched explain NAME FROM TO" in err, err
    rc, calls = run(["explain", "j", "2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"])
    assert rc == 0 and calls == [("explain", ("j", "2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"),
                                  {"slot": None})]
    # NAME alone: a triggered job's parents and waiting slots (a walk had to make up a window)
    rc, calls = run(["explain", "j"])
    assert rc == 0 and calls == [("explain", ("j", None, None), {"slot": None})], calls
    rc, calls = run(["explain", "j", "2026-12-01T00:00:00Z"])  # a window without its end
    assert rc == 2 and calls == [] and "give FROM and TO" in capsys.readouterr().err


def test_explains_help_spells_out_its_arguments(capsys):
    from raftsched import cli as cli_mod
    with pytest.raises(SystemExit) as ei:
        cli_mod.main(["explain", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # (argparse wraps it to the terminal's width)
    assert ei.value.code == 0
    assert "NAME [FROM] [TO]" in out and "--slot T" in out
    for words in ("the job", "when the outage began", "when it ended", "FROM and TO are positional",
                  "why it met"):
        assert words in out, (words, out)
    assert "TO_FLAG" not in out and "FROM_FLAG" not in out  # the hidden guards are not offered


# ---------------------------------------------------------------------------- command groups
@pytest.mark.parametrize("group,commands", [
    ("sinks", ["list", "put", "get", "delete", "dead", "requeue"]), ("tokens", ["create", "list", "revoke"]),
    ("members", ["list", "add", "remove"]), ("secrets", ["new-key", "status", "rotate-key"])])
def test_a_command_group_without_its_command_prints_its_help_and_exits_2(capsys, group, commands):
    """``raftsched sinks`` alone was argparse's "the following arguments are required: sinks_cmd":
    now the group's help (its commands, each with what it does) on stderr, a line naming them,
    exit 2, and nothing sent."""
    from raftsched import cli as cli_mod
    assert cli_mod.main([group]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert f"usage: raftsched {group}" in out.err and "_cmd" not in out.err, out.err
    for name in commands:
        assert re.search(rf"\n    {name}\s", out.err), (name, out.err)
    assert out.err.rstrip().endswith(f"raftsched {group}: give a command: {', '.join(commands)} "
                                     f"(raftsched {group} COMMAND --help says more)"), out.err
    with pytest.raises(SystemExit) as ei:  # an unknown command is still argparse's usage error
        cli_mod.main([group, "nope"])
    assert ei.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


# ---------------------------------------------------------------------------- runs
def test_runs_takes_the_filters_of_the_api(run, capsys):
    """``raftsched runs NAME --state S --slot T --since T --until T``: the query GET
    /v1/jobs/NAME/runs takes (the README's "did my 02:00 run happen" was curl-only). A --slot
    (or --since, --until) of digits is ms since the epoch, as in a run id, sent as its ISO time
    (the API's ?slot= takes ISO times); without the flags nothing is filtered."""
    rc, calls = run(["runs", "j"])
    assert rc == 0 and calls == [("runs", ("j",), {"limit": 20, "state": None, "slot": None, "since": None,
                                                   "until": None})]
    rc, calls = run(["runs", "j", "--state", "skipped", "--slot", "2026-11-30T02:00:00+01:00",
                     "--since", "2026-11-29T00:00:00Z", "--until", "2026-12-01T00:00:00Z", "--limit", "5"])
    assert rc == 0 and calls == [("runs", ("j",), {"limit": 5, "state": "skipped", "slot": "2026-11-30T02:00:00+01:00",
                                                   "since": "2026-11-29T00:00:00Z", "until": "2026-12-01T00:00:00Z"})]
    rc, calls = run(["runs", "j", "--slot", "1795948381000", "--since", "0"])
    assert rc == 0 and calls[0][2]["slot"] == "2026-11-29T10:33:01Z" and calls[0][2]["since"] == "1970-01-01T00:00:00Z"
    capsys.readouterr()
    # Bad input: a state that is none, ms past the API's range: usage errors naming the flag, nothing sent.
    rc, calls = run(["runs", "j", "--state", "done"])
    assert rc == 2 and calls == [] and "--state: invalid choice: 'done'" in capsys.readouterr().err
    rc, calls = run(["runs", "j", "--slot", "99999999999999999"])
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and err.startswith("raftsched runs: --slot: 99999999999999999 ms since the epoch "
                                                      "is after 9999-01-01T00:00:00Z"), err


def test_the_runs_table_shows_a_recorded_range_with_its_last_slot_and_count(run, capsys):
    """A record of a range of missed slots (``slot_to``, ``count``) was shown by its first slot
    alone, like one slot: the SLOTS column says FIRST..LAST (COUNT), LAST without FIRST's date
    when it is the same day, whole even past the cell width."""
    from raftsched import cli_output
    runs = [{"id": "hb@1795948391000", "state": "queued", "slot": "2026-11-29T10:33:11Z", "attempt": 1},
            {"id": "hb@1795948381000", "state": "skipped", "slot": "2026-11-29T10:33:01Z", "reason": "misfire",
             "slot_to": "2026-11-29T10:33:07Z", "count": 4},
            {"id": "hb@1795910400000", "state": "coalesced", "slot": "2026-11-28T23:20:00Z", "reason": "misfire",
             "slot_to": "2026-11-29T10:33:00Z", "count": 40381}]
    cli_output.set_format("table")
    try:
        rc, _ = run(["runs", "hb", "-o", "table"], answers={"runs": {"job": "hb", "runs": runs, "next": None}})
    finally:
        cli_output.set_format(None)
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("ID "))
    assert header.split()[:3] == ["ID", "STATE", "SLOTS"], header
    row = {line.split()[0]: line for line in lines if line.startswith("hb@")}
    assert "2026-11-29T10:33:11Z " in row["hb@1795948391000"] and ".." not in row["hb@1795948391000"]
    assert "2026-11-29T10:33:01Z..10:33:07Z (4)" in row["hb@1795948381000"], out
    assert "2026-11-28T23:20:00Z..2026-11-29T10:33:00Z (40381)" in row["hb@1795910400000"], out


def test_an_empty_runs_table_is_its_header_under_a_count_of_none(run, capsys):
    """A walk: `runs NAME -o table` with no runs printed `runs []` as a field."""
    from raftsched import cli_output
    cli_output.set_format("table")
    try:
        rc, _ = run(["runs", "hb", "-o", "table"], answers={"runs": {"job": "hb", "runs": [], "next": None}})
    finally:
        cli_output.set_format(None)
    out = capsys.readouterr().out
    assert rc == 0 and "RUNS (0)\nID " in out and "[]" not in out, out


# ---------------------------------------------------------------------------- trigger
def test_trigger_takes_a_slot_a_payload_and_propagate(run, capsys, tmp_path, monkeypatch):
    """``raftsched trigger NAME --slot T --payload JSON|@FILE --propagate``: the body POST
    /v1/jobs/NAME/trigger takes (the command line had --propagate only). --payload is read as
    backfill's is, JSON text or @FILE, and an object naming a key twice is refused before any
    request; without the flags the trigger has no body (a heartbeat job's then waits for a ping)."""
    rc, calls = run(["trigger", "j"])
    assert rc == 0 and calls == [("trigger", ("j",), {"slot": None, "propagate": False})]
    rc, calls = run(["trigger", "j", "--slot", "2026-12-01T17:29:40Z", "--payload", '{"full": true}', "--propagate"])
    assert rc == 0 and calls == [("trigger", ("j",), {"slot": "2026-12-01T17:29:40Z", "propagate": True,
                                                      "payload": {"full": True}})]
    rc, calls = run(["trigger", "j", "--slot", "1796146180000", "--payload", "null"])  # null is a payload too
    assert rc == 0 and calls == [("trigger", ("j",), {"slot": "2026-12-01T17:29:40Z", "propagate": False,
                                                      "payload": None})]
    f = tmp_path / "payload.json"
    f.write_text('{"rows": [1, 2], "note": "é"}', encoding="utf-8")
    rc, calls = run(["trigger", "j", "--payload", f"@{f}"])
    assert rc == 0 and calls[0][2]["payload"] == {"rows": [1, 2], "note": "é"}
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO('[1, {"a": 2}]'))
    rc, calls = run(["trigger", "j", "--payload", "@-"])
    assert rc == 0 and calls[0][2]["payload"] == [1, {"a": 2}]
    capsys.readouterr()
    f.write_text('{"a": {"b": 1, "b": 2}}')
    for value, said in (('{"a": 1, "a": 2}', "--payload: malformed JSON: the key 'a' appears twice in one object"),
                        (f"@{f}", f"--payload @{f}: malformed JSON: the key 'b' appears twice in one object"),
                        ("{not json", "--payload: malformed JSON: "),
                        (f"@{tmp_path / 'nope.json'}", f"--payload @{tmp_path / 'nope.json'}: No such file")):
        rc, calls = run(["trigger", "j", "--payload", value])
        err = capsys.readouterr().err
        assert rc == 2 and calls == [] and err.startswith(f"raftsched trigger: {said}"), (value, err)
        assert err.count("\n") == 1, err


def test_backfills_payload_takes_a_file_too(run, capsys, tmp_path):
    f = tmp_path / "p.json"
    f.write_text('{"full": true}')
    rc, calls = run(["backfill", "j", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z",
                     "--payload", f"@{f}"])
    assert rc == 0 and calls[0][0] == "backfill" and calls[0][2]["payload"] == {"full": True}


# ---------------------------------------------------------------------------- preview
def test_preview_takes_after_for_a_job_and_for_a_spec_file(run, capsys, tmp_path):
    """``raftsched preview NAME --after T`` sends GET /v1/jobs/NAME/preview's ``after``;
    ``--spec FILE [NAME] [--after T]`` sends the file to POST /v1/preview, with its ``after``
    (a migrating user's walk: a spec's DST days a year ahead were out of reach of 1 000 slots of
    an every-5-minutes cron, and --after was refused with --spec)."""
    rc, calls = run(["preview", "j", "--count", "3", "--after", "2026-10-31T00:00:00Z"])
    assert rc == 0 and calls == [("preview", ("j", 3), {"after": "2026-10-31T00:00:00Z"})]
    spec = {"schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
            "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    rc, calls = run(["preview", "--spec", str(f), "--count", "80"])
    assert rc == 0 and calls == [("preview_spec", (spec, 80, None), {})]
    rc, calls = run(["preview", "nightly", "--spec", str(f)])
    assert rc == 0 and calls == [("preview_spec", (spec, 10, "nightly"), {})]
    capsys.readouterr()
    rc, calls = run(["preview", "--spec", str(f), "--after", "2027-03-01T00:00:00Z"])
    assert rc == 0 and calls == [("preview_spec", (spec, 10, None), {"after": "2027-03-01T00:00:00Z"})]
    rc, calls = run(["preview", "--spec", str(f), "--stale"])
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and err.startswith("raftsched preview: --stale is for a job's preview"), err
    rc, calls = run(["preview"])
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and "give the job's NAME, or --spec FILE" in err, err
    f.write_text('{"schedule": {"every_s": 60}, "schedule": {"every_s": 5}}')
    rc, calls = run(["preview", "--spec", str(f)])
    err = capsys.readouterr().err
    assert rc == 1 and calls == [] and "the key 'schedule' appears twice" in err, err


def test_preview_of_a_spec_file_shows_its_dst_days_and_creates_no_job(tmp_path, monkeypatch, capsys):
    """The whole path, against a node's API in a thread (its clock fixed at 2027-01-15T08:00Z):
    a Europe/Berlin cron previewed from a file lists the spring-forward day with its mark, and
    the cluster still has no job."""
    import asyncio
    import socket
    import threading

    from aiohttp import web

    from raftsched import cli as cli_mod
    from raftsched.clock import FakeClock
    from raftsched.core.state import SchedulerState
    from raftsched.node.api import make_app
    from raftsched.node.service import Service

    from fakes import FakeRaft

    token = "p" * 32
    state = SchedulerState()
    app = make_app(Service(FakeRaft(state), FakeClock(1_800_000_000_000), "node-1"), token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        f = tmp_path / "nightly.json"
        f.write_text(json.dumps({"schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
                                 "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}))
        monkeypatch.setenv("RAFTSCHED_TOKEN", token)
        monkeypatch.setattr(cli_mod, "_setup_logging", lambda level: None)
        rc = cli_mod.main(["preview", "--spec", str(f), "--count", "80", "-o", "json",
                           "--url", f"http://127.0.0.1:{port}"])
        out = capsys.readouterr()
        assert rc == 0, out
        slots = json.loads(out.out)["slots"]
        marked = [s for s in slots if s.get("dst")]
        assert [(s["dst"], s["slot"], s["local"]) for s in marked] == [
            ("spring_forward", "2027-03-28T01:00:00Z", "2027-03-28T03:00:00+02:00")], marked  # right after the gap
        assert all(s["timezone"] == "Europe/Berlin" for s in slots)
        assert state.jobs == {}
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()


def test_the_lists_page_from_the_command_line(run, capsys):
    """A user's walk: past the first page of jobs, dead runs or a job's runs, curl was the only
    way (no --after, --label, --limit on jobs and dlq, no --before on runs)."""
    rc, calls = run(["jobs"])
    assert rc == 0 and calls == [("list_jobs", (100,), {})]
    rc, calls = run(["jobs", "--limit", "5", "--after", "nightly-7", "--label", "team=data", "--label", "tier=1"])
    assert rc == 0 and calls == [("list_jobs", (5,), {"after": "nightly-7", "labels": {"team": "data", "tier": "1"}})]
    capsys.readouterr()
    rc, calls = run(["jobs", "--label", "team"])
    assert rc == 2 and calls == [] and "--label: 'team' is not KEY=VALUE" in capsys.readouterr().err
    rc, calls = run(["dlq", "--queue", "q", "--limit", "500"])
    assert rc == 0 and calls == [("dlq", ("q", 500), {})]
    rc, calls = run(["runs", "j", "--before", "j@1795948381000"])
    assert rc == 0 and calls[0][2]["before"] == "j@1795948381000"


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_a_deadline_that_is_no_time_is_a_usage_error(run, capsys, value):
    """``--deadline-s -5`` ran the command (and exited 0)."""
    rc, calls = run(["jobs", "--deadline-s", value])
    assert rc == 2 and calls == [] and "--deadline-s must be a number of seconds above 0" in capsys.readouterr().err


def test_put_and_apply_take_paused(run, tmp_path):
    """``raftsched put NAME FILE --paused`` and ``raftsched apply FILE --paused`` (or the file's
    ``"paused": true``) pause each job in the command that writes it; without, nothing is sent."""
    spec = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["true"]}}
    f = tmp_path / "j.json"
    f.write_text(json.dumps(spec))
    assert run(["put", "j", str(f), "--paused"]) == (0, [("put_job", ("j", spec), {"paused": True})])
    assert run(["put", "j", str(f)]) == (0, [("put_job", ("j", spec), {})])
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps({"jobs": {"j": spec}}))
    rc, calls = run(["apply", str(jobs), "--paused"])
    # (the comparison first, a dry run, then the write: each says paused)
    assert rc == 0 and [c[0] for c in calls] == ["put_jobs"] * 2 and calls[0][2]["dry_run"] is True, calls
    assert calls[0][2]["paused"] is True and calls[-1][2]["paused"] is True and "dry_run" not in calls[-1][2], calls
    from raftsched.cli import _merge_batches  # (the answer it prints says so: a re-walk)
    assert _merge_batches([{"jobs": {"j": {}}, "created": 1, "paused": True}], False)["paused"] is True
    assert "paused" not in _merge_batches([{"jobs": {"j": {}}, "created": 1}], False)
    jobs.write_text(json.dumps({"jobs": {"j": spec}, "paused": True}))
    rc, calls = run(["apply", str(jobs)])
    assert rc == 0 and calls[-1][2]["paused"] is True, calls
    jobs.write_text(json.dumps({"jobs": {"j": spec}}))
    rc, calls = run(["apply", str(jobs)])
    assert rc == 0 and "paused" not in calls[-1][2], calls


def test_graph_text_says_a_parent_is_missing(run, capsys):
    """A walk: after `delete p1 --force`, `raftsched graph c1` printed `p1 -> [c1]` as a live
    edge; the JSON said the node was missing."""
    g = {"job": "c1", "parents": ["p1"], "children": [],
         "nodes": [{"job": "p1", "kind": "missing"}, {"job": "c1", "kind": "triggered"}],
         "edges": [{"from": "p1", "to": "c1", "on": "success"}]}
    rc, _ = run(["graph", "c1", "-o", "table"], {"graph": g})
    out = capsys.readouterr().out
    assert rc == 0 and "p1 (missing: no such job) -> [c1]" in out, out


def test_graph_text_says_how_many_jobs_of_other_tenants_it_leaves_out(run, capsys):
    g = {"job": "c1", "parents": [], "children": [], "nodes": [{"job": "c1", "kind": "triggered"}], "edges": [],
         "not_shown": 2}
    rc, _ = run(["graph", "c1", "-o", "table"], {"graph": g})
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("c1 (triggered): 0 upstream, 0 downstream (2 job(s) of its graph not shown: "
                                      "other tenants' jobs, and what is reached only through them)"), out


def test_an_unknown_flag_shows_the_commands_usage(capsys):
    """A walk: `raftsched runs NAME --bogus` printed the usage of all forty commands."""
    from raftsched import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["runs", "extract", "--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "raftsched runs: error: unrecognized arguments: --bogus" in err, err
    assert "--slot" in err and "completion" not in err, err
    with pytest.raises(SystemExit):
        cli.main(["secrets", "status", "--bogus"])
    assert "raftsched secrets status: error: unrecognized arguments: --bogus" in capsys.readouterr().err


def test_trigger_reruns_a_slot_and_downstream_and_says_the_answers_warnings(run, capsys):
    """``--rerun`` (with --slot) runs the slot again though its run ended, ``--downstream`` the
    jobs after it that ran for it too; each without what it needs is refused before any request.
    A warning of the answer (a plain trigger of an ended slot runs nothing) goes to stderr."""
    rc, calls = run(["trigger", "j", "--slot", "1796146180000", "--rerun", "--downstream"])
    assert rc == 0 and calls == [("trigger", ("j",), {"slot": "2026-12-01T17:29:40Z", "propagate": False,
                                                      "rerun": True, "downstream": True})]
    capsys.readouterr()
    for argv, said in ((["--rerun"], "--rerun"), (["--downstream"], "--rerun"),
                       (["--slot", "1796146180000", "--downstream"], "--downstream")):
        rc, calls = run(["trigger", "j", *argv])
        out = capsys.readouterr()
        assert rc == 2 and calls == [] and out.err.startswith(f"raftsched trigger: {said}"), (argv, out)
    rc, calls = run(["trigger", "j", "--slot", "1796146180000"], answers={"trigger": {
        "job": "j", "run": "j@1796146180000", "state": "failed", "created": False,
        "warnings": ["slot ... ended failed: nothing new runs; send rerun"]}})
    assert rc == 0 and "warning: slot ... ended failed: nothing new runs; send rerun" in capsys.readouterr().err


def test_a_runs_output_of_several_lines_is_shown_as_written_under_the_table(run, capsys):
    """``raftsched run ID -o table`` ran the output's lines into one cell (a walk): a text of
    several lines is a block of its own under its name; one line stays a cell."""
    from raftsched import cli_output
    view = {"id": "j@1", "state": "failed", "error": "exit status 1", "output": "step 1\nstep 2\n  Traceback\n"}
    cli_output.set_format("table")
    try:
        rc, _ = run(["run", "j@1", "-o", "table"], answers={"get_run": view})
    finally:
        cli_output.set_format(None)
    out = capsys.readouterr().out
    assert rc == 0 and "OUTPUT\nstep 1\nstep 2\n  Traceback" in out, out
    assert "exit status 1" in out and "step 1 step 2" not in out, out


def test_members_remove_of_a_name_no_member_has_says_nothing_was_removed(run, capsys):
    """A walk removed a member by another of its names and read "removed": the node now refuses
    that (409), and for a name no member has it answers a warning, which goes to stderr."""
    rc, calls = run(["members", "remove", "10.0.0.9:9700"], answers={"remove_member": {
        "addr": "10.0.0.9:9700", "state": "removed", "changed": False,
        "warnings": ["addr: 10.0.0.9:9700 is not a member nor a learner of this cluster (its members: "
                     "10.0.0.1:9700): nothing was removed"]}})
    assert rc == 0 and calls == [("remove_member", ("10.0.0.9:9700",), {})]
    assert "warning: addr: 10.0.0.9:9700 is not a member nor a learner" in capsys.readouterr().err


def test_help_says_each_numeric_default_and_members_add_takes_one_of_wait_s_and_no_wait(capsys):
    """A walk read `--wait-s`, `--limit`, `--deadline-s` and a worker's `--slots` with no default
    in --help; and `members add --wait-s 5 --no-wait` was taken (the wait ignored)."""
    from raftsched import cli
    for argv, want in ((["members", "add", "--help"], ["--wait-s WAIT_S", "(default: 120)", "(default: 30)"]),
                       (["runs", "--help"], ["entries shown (default: 20)"]),
                       (["worker", "--help"], ["runs executed at once (default: 4)"])):
        with pytest.raises(SystemExit) as ex:
            cli.main(argv)
        out = " ".join(capsys.readouterr().out.split())
        assert ex.value.code == 0 and all(w in out for w in want), (argv, out)
        assert "(default: None)" not in out and "(default: False)" not in out
    with pytest.raises(SystemExit) as ex:
        cli.main(["members", "add", "h:1", "--wait-s", "5", "--no-wait"])
    assert ex.value.code == 2 and "not allowed with argument --wait-s" in capsys.readouterr().err
