"""``raftsched apply`` against a scripted loopback node: a 504 is sent again with the same
Idempotency-Key until ``--deadline-s``, an outcome still unknown then names the key to send the
file again with (``--idempotency-key``), and ``-o json`` prints one JSON document however many
requests the file took."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from raftsched import cli
from raftsched.core import limits


class ScriptedNode:
    """A loopback HTTP server that answers each request with the next (status, body) of its
    script (the last one again once the script is used up), and records (path, Idempotency-Key,
    decoded body) of each. With ``auto_plan``, a dry run (the comparison ``apply`` makes first) is
    answered apart, every job ``create`` unless ``unchanged`` names it, and recorded in ``plans``."""

    def __init__(self, *script, unchanged=(), auto_plan=True) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, str | None, object]] = []
        self.plans: list[object] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = json.loads(raw or b"null")
                if auto_plan and isinstance(req, dict) and (req.get("dry_run") or self.path == "/v1/jobs:plan"):
                    outer.plans.append(req)
                    acts = {n: "unchanged" if n in unchanged else "create" for n in req["jobs"]}
                    status, body = 200, {"dry_run": True, "jobs": {n: {"action": a, "next_slot": None}
                                                                   for n, a in acts.items()},
                                         "create": sum(a == "create" for a in acts.values()), "replace": 0,
                                         "unchanged": sum(a == "unchanged" for a in acts.values()), "conflicts": 0}
                else:
                    outer.seen.append((self.path, self.headers.get("Idempotency-Key"), req))
                    status, body = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def node():
    nodes = []

    def make(*script, unchanged=(), auto_plan=True):
        n = ScriptedNode(*script, unchanged=unchanged, auto_plan=auto_plan)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.close()


@pytest.fixture
def jobs_file(tmp_path):
    def make(*names):
        path = tmp_path / "jobs.json"
        path.write_text(json.dumps({"jobs": {n: {"schedule": {"every_s": 60}} for n in names}}))
        return str(path)
    return make


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("0123456789abcdef0123")
    path.chmod(0o600)
    return str(path)


def _ok(*names):
    return 200, {"jobs": {n: {"created": True, "gen": i + 1, "next_slot": None} for i, n in enumerate(names)},
                 "created": len(names), "replaced": 0, "conflicts": 0, "commands": 1}


def _504(committed=(), unknown=()):
    return 504, {"error": {"code": "indeterminate", "message": "1 of 1 commands failed (no result within 5 s)",
                           "field": None, "idempotency_key": "whatever", "commands": 1, "commands_failed": 1,
                           "jobs": {n: {"created": True} for n in committed}, "not_committed": [],
                           "unknown": list(unknown)}}


def _apply(n, path, token_file, *extra):
    return cli.main(["apply", path, "--url", n.url, "--token-file", token_file, "-o", "json", *extra])


def test_a_504_is_sent_again_with_the_same_key_until_an_answer(node, jobs_file, token_file, capsys):
    n = node(_504(unknown=["a"]), _ok("a"))
    assert _apply(n, jobs_file("a"), token_file, "--deadline-s", "20") == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["jobs"]["a"]["created"] is True
    keys = [k for _, k, _ in n.seen]
    assert len(keys) == 2 and keys[0] and len(set(keys)) == 1


def test_an_outcome_still_unknown_names_the_key_and_a_retry_with_it_sends_it(node, jobs_file, token_file, capsys):
    n = node(_504(committed=["a"], unknown=["b"]))
    path = jobs_file("a", "b")
    assert _apply(n, path, token_file, "--deadline-s", "1") == 1
    out = capsys.readouterr()
    keys = {k for _, k, _ in n.seen}
    assert len(n.seen) >= 2 and len(keys) == 1  # retried, with one key
    key, = keys
    assert "the outcome is unknown" in out.err and f"--idempotency-key {key}" in out.err
    doc = json.loads(out.out)  # the node's account of which jobs committed, on stdout
    assert doc["error"]["unknown"] == ["b"] and list(doc["error"]["jobs"]) == ["a"]
    # The same file again with that key: the same key on the wire.
    n.script[:] = [_ok("a", "b")]
    assert _apply(n, path, token_file, "--idempotency-key", key) == 0
    assert n.seen[-1][1] == key and json.loads(capsys.readouterr().out)["created"] == 2


def test_the_retry_it_names_says_create_only_as_the_first_did_and_quotes_the_file(node, tmp_path, token_file, capsys):
    """create_only is part of each command's id: a retry without it would apply again."""
    n = node(_504(unknown=["a"]))
    path = tmp_path / "my jobs.json"
    path.write_text(json.dumps({"jobs": {"a": {"schedule": {"every_s": 60},
                                                 "executor": {"type": "shell", "argv": ["true"]}}}}))
    assert _apply(n, str(path), token_file, "--deadline-s", "1", "--create-only") == 1
    err = capsys.readouterr().err
    assert "--create-only" in err.split("Idempotency-Key was", 1)[1] and f"'{path}'" in err, err


@pytest.mark.parametrize("key", ["", "x" * 65, "a b", "caf\u00e9", "a\nb"])
def test_a_bad_idempotency_key_is_a_usage_error(node, jobs_file, token_file, capsys, key):
    n = node(_ok("a"))
    assert _apply(n, jobs_file("a"), token_file, "--idempotency-key", key) == 2
    assert "--idempotency-key" in capsys.readouterr().err and not n.seen


def test_json_output_is_one_document_however_many_requests(node, jobs_file, token_file, capsys, monkeypatch):
    monkeypatch.setattr(limits, "batch_jobs_max", 2)
    path = jobs_file("a", "b", "c")
    n = node(_ok("a", "b"), _ok("c"))
    assert _apply(n, path, token_file) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"jobs": {"a": {"created": True, "gen": 1, "next_slot": None},
                            "b": {"created": True, "gen": 2, "next_slot": None},
                            "c": {"created": True, "gen": 1, "next_slot": None}},
                   "created": 3, "replaced": 0, "conflicts": 0, "commands": 2, "requests": 2, "unchanged": 0}
    assert [sorted(b["jobs"]) for _, _, b in n.seen] == [["a", "b"], ["c"]]
    assert len({k for _, k, _ in n.seen}) == 1  # one key for the file: a retry with it dedupes each part
    # A later request refused: what applied, and the node's error, in one document; exit 1.
    err = {"error": {"code": "invalid", "message": "job 'c': bad", "field": "schedule", "job": "c"}}
    n = node(_ok("a", "b"), (422, err))
    assert _apply(n, path, token_file) == 1
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["jobs"]) == ["a", "b"] and doc["error"] == err["error"] and doc["requests"] == 1
    # A first request refused: the node's error body as it sent it, as before.
    n = node((422, err))
    assert _apply(n, path, token_file) == 1
    assert json.loads(capsys.readouterr().out) == err


def _plan(**jobs):
    counts = {"create": 0, "replace": 0, "unchanged": 0, "conflicts": 0}
    for res in jobs.values():
        counts["conflicts" if res["action"] == "conflict" else res["action"]] += 1
    return 200, {"dry_run": True, "jobs": jobs, **counts}


def test_a_dry_run_asks_the_node_and_prints_the_plan(node, jobs_file, token_file, capsys):
    n = node(_plan(a={"action": "create", "next_slot": "2030-01-01T00:01:00Z"},
                   b={"action": "replace", "next_slot": "2030-01-01T00:05:00Z",
                      "changes": [{"field": "schedule.every_s", "from": 300, "to": 60},
                                  {"field": "retry", "from": {"max_attempts": 3}}]},
                   c={"action": "unchanged", "next_slot": None}), auto_plan=False)
    path = jobs_file("a", "b", "c")
    assert cli.main(["apply", path, "--url", n.url, "--token-file", token_file, "-o", "table", "--dry-run"]) == 0
    out = capsys.readouterr().out
    (path_, _, body), = n.seen
    # (POST /v1/jobs:plan: a token that may only read may ask it)
    assert path_ == "/v1/jobs:plan" and "dry_run" not in body and set(body["jobs"]) == {"a", "b", "c"}
    assert "+ create    a" in out and "~ replace   b" in out and "unchanged c" not in out
    assert "schedule.every_s: 300 -> 60" in out and 'retry: {"max_attempts":3} -> (absent)' in out
    assert "3 jobs: 1 to create, 1 to replace, 1 unchanged, 0 conflicts (dry run: nothing changed)" in out
    # -o json: the answer; --exit-code: 3 when something would change, 0 when nothing would.
    assert _apply(n, path, token_file, "--dry-run", "--exit-code") == 3
    assert json.loads(capsys.readouterr().out)["replace"] == 1
    n.script[:] = [_plan(a={"action": "unchanged", "next_slot": None})]
    assert _apply(n, jobs_file("a"), token_file, "--dry-run", "--exit-code") == 0
    capsys.readouterr()
    n.script[:] = [_plan(a={"action": "unchanged", "next_slot": None, "pauses": True})]  # a pause is a change
    assert _apply(n, jobs_file("a"), token_file, "--dry-run", "--exit-code", "--paused") == 3
    n.script[:] = [_plan(a={"action": "unchanged", "next_slot": None, "warnings": ["deadline: a heartbeat job ..."]},
                         b={"action": "replace", "changes": [{"field": "payload", "from_bytes": 9000, "to": 1}]})]
    n.script[0][1]["values_left_out"] = True
    assert cli.main(["apply", jobs_file("a", "b"), "--url", n.url, "--token-file", token_file, "-o", "table",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "= unchanged a" in out and "warning: deadline: a heartbeat job" in out  # unchanged, but a warning
    assert "payload: (9000 bytes) -> 1" in out and "shown by their size" in out
    n.script[:] = [_plan(a={"action": "unchanged", "next_slot": None, "paused_in_cluster": True},
                         b={"action": "create", "next_slot": None, "pauses": True})]
    assert cli.main(["apply", jobs_file("a", "b"), "--url", n.url, "--token-file", token_file, "-o", "table",
                     "--dry-run", "--paused"]) == 0
    out = capsys.readouterr().out
    assert "= unchanged a  [paused in the cluster" in out and ", 1 to pause, 1 paused in the cluster (dry" in out
    n.script[:] = [_plan(a={"action": "conflict", "error": {"code": "conflict", "message": "job 'a' exists"}})]
    assert _apply(n, jobs_file("a"), token_file, "--dry-run", "--create-only") == 1
    assert n.seen[-1][2]["create_only"] is True


def test_apply_leaves_out_the_jobs_the_cluster_holds_as_they_are(node, jobs_file, token_file, capsys):
    """A GitOps loop applying one file every few minutes rewrote every job each time: a new
    generation, an audit line and a command a job, for nothing. apply compares first (a dry run)
    and writes only what differs; --all writes every job; a node that cannot compare (of a
    version before the dry run) gets every job, as before."""
    path = jobs_file("a", "b", "c")
    n = node(_ok("a", "c"), unchanged=("b",))
    assert _apply(n, path, token_file) == 0
    doc = json.loads(capsys.readouterr().out)
    (plan,) = n.plans
    assert set(plan["jobs"]) == {"a", "b", "c"}
    (_, _, body), = n.seen
    assert set(body["jobs"]) == {"a", "c"} and "dry_run" not in body
    assert doc["jobs"]["b"] == {"unchanged": True, "next_slot": None} and doc["unchanged"] == 1
    assert doc["created"] == 2 and set(doc["jobs"]) == {"a", "b", "c"}
    # Nothing differs: nothing written.
    n = node(_ok(), unchanged=("a", "b", "c"))
    assert _apply(n, path, token_file) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not n.seen and len(n.plans) == 1 and doc["unchanged"] == 3 and doc["created"] == 0
    # --all: no comparison, every job written.
    n = node(_ok("a", "b", "c"), unchanged=("b",))
    assert _apply(n, path, token_file, "--all") == 0
    capsys.readouterr()
    assert not n.plans and set(n.seen[0][2]["jobs"]) == {"a", "b", "c"}
    # A node that refuses the dry run (400 naming it): every job written, and said on stderr.
    old = {"error": {"code": "bad_request", "message": "unknown field", "field": "dry_run"}}
    n = node((400, old), _ok("a", "b", "c"), auto_plan=False)
    assert _apply(n, path, token_file) == 0
    cap = capsys.readouterr()
    assert "could not compare the file with the cluster" in cap.err and "writing every job" in cap.err
    assert [set(b["jobs"]) for _, _, b in n.seen] == [{"a", "b", "c"}] * 2 and "dry_run" not in n.seen[1][2]
    # The comparison refused (an invalid job): that is the answer, and nothing is written.
    bad = {"error": {"code": "invalid", "message": "job 'b': every_s must be >= 1", "field": "schedule.every_s",
                     "job": "b"}}
    n = node((422, bad), _ok("a", "b", "c"), auto_plan=False)
    assert _apply(n, path, token_file) == 1
    cap = capsys.readouterr()
    assert json.loads(cap.out) == bad and "nothing was written" in cap.err and len(n.seen) == 1


def test_a_split_file_writes_whole_a_request_the_node_cannot_compare_alone(node, jobs_file, token_file, capsys,
                                                                           monkeypatch):
    """A file of several requests whose later one names a new job of an earlier one in `after`:
    its dry run alone is refused, and its jobs are written (the earlier request's first)."""
    monkeypatch.setattr(limits, "batch_jobs_max", 2)
    path = jobs_file("a", "b", "c")
    plan = (200, {"dry_run": True, "jobs": {"a": {"action": "create"}, "b": {"action": "unchanged"}},
                  "create": 1, "replace": 0, "unchanged": 1, "conflicts": 0})
    after = (422, {"error": {"code": "invalid", "message": "job 'c': after names no job 'a'", "field": "after",
                             "job": "c"}})
    n = node(plan, after, _ok("a", "c"), auto_plan=False)
    assert _apply(n, path, token_file) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [set(b["jobs"]) for _, _, b in n.seen] == [{"a", "b"}, {"c"}, {"a", "c"}]
    assert doc["unchanged"] == 1 and doc["jobs"]["b"]["unchanged"] is True and doc["created"] == 2


def test_exit_code_without_dry_run_is_a_usage_error(node, jobs_file, token_file, capsys):
    n = node(_ok("a"))
    assert _apply(n, jobs_file("a"), token_file, "--exit-code") == 2
    assert "--exit-code goes with --dry-run" in capsys.readouterr().err and not n.seen
    assert _apply(n, "/nonexistent/jobs.json", token_file, "--exit-code") == 2  # (before the file is read)


def test_a_terminal_shows_a_nodes_error_whole_with_every_invalid_job(node, jobs_file, token_file, capsys):
    """A walk: on a terminal a batch's 422 was a table of cells cut at 48 characters, its four
    invalid jobs one cut cell. The error is printed whole, each invalid job on a line of its own."""
    long = "cron needs 5 fields (m h dom mon dow) or 6 with seconds first; got 4"
    errors = [{"job": "typo", "field": "schedule.cron", "message": long},
              {"job": "badtz", "field": "schedule.timezone", "message": "unknown time zone 'Mars/Olympus'"}]
    n = node((422, {"error": {"code": "invalid", "message": f"job 'typo': {long}", "field": "schedule.cron",
                              "job": "typo", "invalid": 2, "errors": errors}}), auto_plan=False)
    rc = cli.main(["apply", jobs_file("typo", "badtz"), "--url", n.url, "--token-file", token_file, "-o", "table",
                   "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1 and f"error: invalid: job 'typo': {long}" in out, out
    assert f"    typo  schedule.cron  {long}" in out and "    badtz  schedule.timezone  unknown time zone" in out
    assert "…" not in out


def test_a_queued_runs_reason_in_a_table_is_what_it_waits_for():
    from raftsched import cli_output
    runs = {"runs": [{"id": "j@1", "state": "queued", "slot": "x", "attempt": 1, "reason": None,
                      "waiting_for": "no worker has a handler for its target"},
                     {"id": "j@2", "state": "skipped", "slot": "y", "attempt": None, "reason": "misfire"}]}
    text = cli_output.table(runs)
    assert "no worker has a handler" in text and "misfire" in text


def test_a_key_value_table_shows_each_value_whole():
    """A walk: a PUT's warning, an explain's why and a backfill dry run's slots were cut at 48
    characters in a terminal's key/value table, the very fields those commands exist for."""
    from raftsched import cli_output
    why = "it succeeded after its succeed_within_s deadline of 600 s: it ended 612 s after its slot"
    out = cli_output.table({"job": "j", "why": why, "warnings": ["deadline: a heartbeat job " + "x" * 80, "second"],
                            "slots": ["2026-10-29T05:30:00Z"], "runs": [{"id": "r" * 80, "state": "queued"}]})
    assert why in out and "deadline: a heartbeat job " + "x" * 80 in out, out
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("warnings"))
    assert lines[i + 1].strip() == "second"  # (one per line)
    # A list of one text is that text too (a walk: a PUT's one warning showed as an escaped JSON list).
    assert '["2026-10-29T05:30:00Z"]' not in out and any(
        line.split() == ["slots", "2026-10-29T05:30:00Z"] for line in lines), out
    one = cli_output.table({"warnings": ['placement: no live worker ... carries the labels {"pool": "gpu"}']})
    assert one.splitlines()[1].split(None, 1) == ["warnings", 'placement: no live worker ... carries the labels '
                                                              '{"pool": "gpu"}'], one
    assert "r" * 80 not in out  # (a list of objects is a table, its cells cut still)



def test_a_dry_run_against_a_node_without_the_plan_route_sends_the_batchs_dry_run(node, jobs_file, token_file, capsys):
    """A node of a version before POST /v1/jobs:plan answers it 404 (no field): the dry run goes
    as the batch's own dry_run, as before."""
    gone = (404, {"error": {"code": "not_found", "message": "Not Found", "field": None}})
    n = node(gone, _plan(a={"action": "create", "next_slot": None}), auto_plan=False)
    assert cli.main(["apply", jobs_file("a"), "--url", n.url, "--token-file", token_file, "--dry-run"]) == 0
    assert [(p, b.get("dry_run")) for p, _, b in n.seen] == [("/v1/jobs:plan", None), ("/v1/jobs:batch", True)]
    assert json.loads(capsys.readouterr().out)["create"] == 1
