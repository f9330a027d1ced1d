"""raftsched sync when the cluster changes under it, a request fails part-way, the node refuses
a job inside a batch's answer, the app is large, or its import fails (sdk/sync.py)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap
import types

import pytest

from procs import running_cluster
from raftsched.client import Client
from raftsched.core.errors import Conflict, NotFound
from raftsched.sdk import sync as S


def write_app(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop(name, None)
    return f"{name}:app"


def run_sync(client, ref: str, *, prune=False, dry_run=False, as_json=True):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = S.run(types.SimpleNamespace(app=ref, dry_run=dry_run, prune=prune, json=as_json), client)
    return rc, out.getvalue(), err.getvalue()


def first_json(text: str) -> dict:
    return json.JSONDecoder().raw_decode(text.lstrip())[0]


# ------------------------------------------------------------------ without a cluster
class StubClient:
    """What raftsched sync calls of a Client, answering as a node does."""
    urls = ["http://stub"]

    def __init__(self, jobs: dict, batch_errors: dict | None = None, delete_error=None):
        self.jobs, self.batch_errors, self.delete_error = jobs, batch_errors or {}, delete_error
        self.put = []

    def list_jobs(self, limit=None, after=None, consistent=None, labels=None):
        want = (labels or {}).items()
        return {"jobs": [{"name": n, "spec": s} for n, s in sorted(self.jobs.items())
                         if all((s.get("labels") or {}).get(k) == v for k, v in want)], "next": None}

    def get_job(self, name):
        if name not in self.jobs:
            raise NotFound(f"no job named {name!r}", field="name")
        return {"name": name, "spec": self.jobs[name]}

    def put_jobs(self, jobs, create_only=False):
        res = {}
        for n in jobs:
            if n in self.batch_errors:  # per-job refusal inside a 200 answer (node/batch.py merge)
                res[n] = {"error": {"code": "conflict", "field": "name", "message": self.batch_errors[n]}}
            else:
                self.put.append(n)
                res[n] = {"created": n not in self.jobs, "gen": 1, "next_slot": None}
        return {"jobs": res, "created": 0, "replaced": 0, "conflicts": len(self.batch_errors), "commands": 1}

    def workers(self):
        """One live worker of every app, that says nothing of its handlers: takes any run."""
        apps = {(s.get("labels") or {}).get("raftsched.app") for s in self.jobs.values()} - {None}
        return {"workers": [{"id": f"w-{a}", "status": "active", "labels": {"raftsched.app": a}, "targets": None}
                            for a in sorted(apps)] or [{"id": "w", "status": "active", "labels": {}, "targets": None}]}

    def graph(self, name):
        """The edges of the stored jobs' ``after``, as GET /v1/jobs/{name}/graph has them."""
        if name not in self.jobs:
            raise NotFound(f"no job named {name!r}", field="name")
        edges = [{"from": (e["job"] if isinstance(e, dict) else e), "to": child, "on": "success"}
                 for child, s in sorted(self.jobs.items()) for e in s.get("after") or ()]
        return {"job": name, "edges": [e for e in edges if name in (e["from"], e["to"])]}

    def delete_job(self, name):
        if self.delete_error:
            raise self.delete_error
        self.jobs.pop(name)
        return {"job": name, "deleted": True}


APP_V2 = """
    from raftsched import App
    app = App("stubapp", misfire="skip")
    @app.job("stub-a", every_s=120)
    def a(ctx): pass
"""


def _cluster_view(ref):
    from raftsched.sdk import load_app
    return load_app(ref)


def test_a_sync_that_fails_midway_says_what_it_applied(tmp_path, monkeypatch):
    ref = write_app(tmp_path, monkeypatch, "stubapp", APP_V2)
    app = _cluster_view(ref)
    old = dict(app.views()["stub-a"], schedule={"every_s": 60})           # stub-a: to update
    gone = dict(old, executor={"type": "python", "target": "stubapp:b"})  # stub-b: to prune
    c = StubClient({"stub-a": old, "stub-b": gone},
                   delete_error=Conflict("job 'stub-b' has dependents: x", field="name"))
    rc, out, err = run_sync(c, ref, prune=True)
    assert rc == 1 and c.put == ["stub-a"]          # the update WAS applied, then the delete failed
    res = first_json(out)
    # What went through before the failure is said (it stays applied).
    assert res["applied"] is not None and res["applied"]["updated"] == ["stub-a"], (res["applied"], err)


def test_a_refusal_is_said_once(tmp_path, monkeypatch):
    """An SDK walk: a sync with a worker token printed the refusal's message, then the same
    error again as the answer's JSON body."""
    from raftsched.core.errors import Forbidden
    ref = write_app(tmp_path, monkeypatch, "stubapp", APP_V2)

    class Refusing(StubClient):
        def list_jobs(self, **kw):
            e = Forbidden("this token lacks scope read", field=None)
            e.body = {"error": {"code": "forbidden", "message": e.message, "field": None}}
            raise e
    rc, out, err = run_sync(Refusing({}), ref)
    assert rc == 1 and err.count("lacks scope read") == 1, err


def test_a_job_the_batch_refused_is_not_reported_applied(tmp_path, monkeypatch):
    ref = write_app(tmp_path, monkeypatch, "stubapp", APP_V2)
    app = _cluster_view(ref)
    old = dict(app.views()["stub-a"], schedule={"every_s": 60})
    c = StubClient({"stub-a": old}, batch_errors={
        "stub-a": "job 'stub-a' fired ahead while this replace was planned from an older view; send it again"})
    rc, out, err = run_sync(c, ref)
    res = first_json(out)
    # A job the node refused inside a 200 answer is not applied, and the sync says so.
    assert rc != 0 and "stub-a" not in (res["applied"] or {}).get("updated", []), (rc, res["applied"])


def test_an_app_whose_import_fails_exits_2_without_a_traceback(tmp_path, monkeypatch):
    write_app(tmp_path, monkeypatch, "brokenimp", "import not_installed_dependency_xyz\n")
    p = subprocess.run([sys.executable, "-m", "raftsched.cli", "sync", "brokenimp:app", "--dry-run",
                        "--url", "http://127.0.0.1:9"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin", "RAFTSCHED_TOKEN": "x" * 32})
    # docs/sdk.md: "2 when the app cannot be loaded", one line, no traceback.
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-300:])


# ------------------------------------------------------------------ against a node
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("sdk-e"), n=1, node_args=["--slots", "0"])


@pytest.fixture
def client(cluster):
    return Client([cluster.url(0)], token=cluster.token)


OTHER = {"schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["their-work"]},
         "misfire": {"policy": "skip"}}


def test_sync_never_replaces_a_job_another_app_created_meanwhile(client, tmp_path, monkeypatch):
    ref = write_app(tmp_path, monkeypatch, "race_a", """
        from raftsched import App
        app = App("race-a", misfire="skip")
        @app.job("race-shared", every_s=3600)
        def shared(ctx): pass
    """)
    real = client.put_jobs

    def put_jobs(jobs, *a, **kw):  # app race-b's sync creates the name between this sync's read and its batch
        client.put_job("race-shared", dict(OTHER, labels={"raftsched.app": "race-b"}))
        return real(jobs, *a, **kw)
    monkeypatch.setattr(client, "put_jobs", put_jobs)
    rc, out, err = run_sync(client, ref)
    # Created with create_only: the other app's job is left as it is, and the sync says to run again.
    assert rc == 1, (rc, out)
    assert client.get_job("race-shared")["spec"]["labels"] == {"raftsched.app": "race-b"}, (rc, out)


PRUNE_APP = """
    import os
    from raftsched import App
    app = App("prune-a", misfire="skip")
    @app.job("pa-kept", every_s=3600)
    def kept(ctx): pass
    if os.environ.get("V") == "1":
        @app.job("pa-old1", every_s=3600)
        def old1(ctx): pass
        @app.job("pa-old2", every_s=3600)
        def old2(ctx): pass
"""


def _prune_setup(client, tmp_path, monkeypatch, mod):
    # (jobs named after the app: the tests share one cluster)
    ref = write_app(tmp_path, monkeypatch, mod, PRUNE_APP.replace("prune-a", mod.replace("_", "-"))
                    .replace('"pa-', f'"{mod.replace("_", "-")}-'))
    monkeypatch.setenv("V", "1")
    assert run_sync(client, ref)[0] == 0
    monkeypatch.delenv("V")
    sys.modules.pop(mod, None)
    return ref


def test_prune_never_deletes_a_job_that_another_app_holds_by_then(client, tmp_path, monkeypatch):
    ref = _prune_setup(client, tmp_path, monkeypatch, "prune_b")
    real = S.existing_jobs

    def existing_jobs(c, app):  # prune-b-old2 is handed to another app after the read
        out = real(c, app)
        client.put_job("prune-b-old2", dict(OTHER, labels={"raftsched.app": "someone-else"}))
        return out
    monkeypatch.setattr(S, "existing_jobs", existing_jobs)
    rc, out, err = run_sync(client, ref, prune=True)
    # Read again before its delete: no longer this app's, so left as it is.
    assert client.get_job("prune-b-old2")["spec"]["labels"] == {"raftsched.app": "someone-else"}, (rc, out)


def test_prune_of_a_job_already_gone_is_not_an_error(client, tmp_path, monkeypatch):
    ref = _prune_setup(client, tmp_path, monkeypatch, "prune_c")
    real = S.existing_jobs

    def existing_jobs(c, app):  # a concurrent sync --prune of the same app deletes prune-c-old1 first
        out = real(c, app)
        client.delete_job("prune-c-old1")
        return out
    monkeypatch.setattr(S, "existing_jobs", existing_jobs)
    rc, out, err = run_sync(client, ref, prune=True)
    # Gone already: what prune wanted, not an error; the other one is deleted.
    assert rc == 0, err
    with pytest.raises(NotFound):
        client.get_job("prune-c-old2")


def test_a_dry_run_fails_when_the_sync_would(client, tmp_path, monkeypatch):
    ref = write_app(tmp_path, monkeypatch, "pipe_typo", """
        from raftsched import App
        app = App("pipe-typo", misfire="skip")
        @app.job("pt-load", after=["pt-extract-typo"])
        def load(ctx): pass
    """)
    rc_dry, _, _ = run_sync(client, ref, dry_run=True)
    rc, _, err = run_sync(client, ref)
    assert rc == 1 and "runs after pt-extract-typo, which the app does not declare" in err, err
    assert rc_dry == 1, "the dry run fails as the sync would"


def test_sync_splits_a_large_app_into_requests_the_node_accepts(tmp_path, monkeypatch):
    from raftsched.core import limits
    ref = write_app(tmp_path, monkeypatch, "bigapp", """
        from raftsched import App
        app = App("big", misfire="skip", payload={"blob": "x" * 8000})
        def h(ctx): pass
        for i in range(2100):
            app.job(f"big-{i:04d}", every_s=3600)(h)
    """)
    sizes = []

    class SizeCheckingStub(StubClient):
        def put_jobs(self, jobs, create_only=False):
            sizes.append(len(json.dumps({"jobs": jobs}).encode()))
            return super().put_jobs(jobs, create_only)
    c = SizeCheckingStub({})
    run_sync(c, ref)
    # ~17 MB of jobs: cut into requests the node accepts (it answers a larger body 413).
    assert max(sizes) <= limits.batch_request_bytes_max, sizes


def test_job_batches_cut_by_count_and_by_encoded_size():
    from raftsched.client.endpoints import BATCH_BODY_BYTES, job_batches
    from raftsched.core import limits
    small = {f"j{i}": {"x": 1} for i in range(limits.batch_jobs_max + 5)}
    parts = job_batches(list(small), small)
    assert [len(p) for p in parts] == [limits.batch_jobs_max, 5] and sum(parts, []) == list(small)
    big = {f"b{i}": {"blob": "x" * 100_000} for i in range(400)}  # ~40 MB
    parts = job_batches(list(big), big)
    assert sum(parts, []) == list(big) and len(parts) >= 3
    assert all(len(json.dumps({n: big[n] for n in p}).encode()) <= BATCH_BODY_BYTES for p in parts)
    assert job_batches([], {}) == []


def test_what_the_node_says_of_a_job_it_wrote_is_printed(tmp_path, monkeypatch):
    """A walk: the batch's per-job warnings (a route to no sink, a placement no worker has, a
    replace job without a success deadline) reached `raftsched apply` users but not `raftsched
    sync`'s, whose jobs were written without a word."""
    ref = write_app(tmp_path, monkeypatch, "stubapp", APP_V2)

    class Warning_(StubClient):
        def put_jobs(self, jobs, create_only=False):
            res = super().put_jobs(jobs, create_only)
            res["jobs"]["stub-a"]["warnings"] = ["notify: no sink named 'opz' (yet): ..."]
            return res
    rc, out, err = run_sync(Warning_({}), ref, as_json=False)
    assert rc == 0 and "raftsched sync: warning: job stub-a: notify: no sink named 'opz'" in err, (out, err)
    rc, out, err = run_sync(Warning_({}), ref)
    assert first_json(out)["applied"]["warnings"] == {"stub-a": ["notify: no sink named 'opz' (yet): ..."]}


def test_one_warning_of_many_jobs_is_one_line():
    lines = S._warning_lines({f"j{i}": ["placement: no live worker ..."] for i in range(7)}
                             | {"k": ["notify: no sink named 'opz' (yet)", "placement: no live worker ..."]})
    assert lines == ["raftsched sync: warning: jobs j0, j1, j2, j3, j4 and 3 more: placement: no live worker ...",
                     "raftsched sync: warning: job k: notify: no sink named 'opz' (yet)"], lines
