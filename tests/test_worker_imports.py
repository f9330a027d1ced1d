"""A worker never loads the node (raftsched/worker/__init__.py): importing every module of
``raftsched.worker``, the SDK's worker with an App loaded, or running the ``raftsched worker``
command up to the point where it starts the lease loop, leaves no ``raftsched.node`` module and
no aiohttp server module (``aiohttp.web``) in ``sys.modules``. Each check runs in a fresh
interpreter, so what the test process imported before does not count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")

#: What a worker must not load: the node's modules, and aiohttp's server side.
FORBIDDEN = textwrap.dedent("""
    import sys
    def forbidden():
        return sorted(m for m in sys.modules
                      if m == "raftsched.node" or m.startswith("raftsched.node.")
                      or m == "aiohttp.web" or m.startswith("aiohttp.web_"))
""")


def run_fresh(code: str, cwd: str = TESTS) -> dict:
    """Run ``code`` (which prints one JSON line last) in a fresh interpreter; its answer."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    p = subprocess.run([sys.executable, "-c", FORBIDDEN + textwrap.dedent(code)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_forbidden_check_sees_the_node_when_it_is_imported():
    """The check itself: importing the node's app is seen (else the tests below prove nothing)."""
    out = run_fresh("""
        import json
        import raftsched.node.api
        print(json.dumps(forbidden()))
    """)
    assert "raftsched.node.api" in out and "aiohttp.web" in out


def test_importing_every_module_of_the_worker_package_loads_no_node_module():
    out = run_fresh("""
        import importlib, json, pkgutil
        import raftsched.worker
        names = [m.name for m in pkgutil.walk_packages(raftsched.worker.__path__, "raftsched.worker.")]
        for name in names:
            importlib.import_module(name)
        print(json.dumps({"modules": names, "forbidden": forbidden()}))
    """)
    # The package's parts are all there (a rename would otherwise leave this test checking less).
    assert {"raftsched.worker.loop", "raftsched.worker.remote", "raftsched.worker.masking",
            "raftsched.worker.limits", "raftsched.worker.executors",
            "raftsched.worker.executors.shell"} <= set(out["modules"])
    assert out["forbidden"] == []


def test_the_sdk_worker_with_an_app_loaded_loads_no_node_module():
    """``raftsched worker --app``'s side: the App imported (its declarations validated), its
    executor lookup built and asked for a grant's executor, the child-process entry point
    imported."""
    out = run_fresh("""
        import json
        import raftsched.sdk.child
        from raftsched.sdk import load_app
        from raftsched.sdk.worker import AppExecutors
        app = load_app("sdk_worker_app:app")
        lookup = AppExecutors(app, "sdk_worker_app:app")
        decl = next(iter(app.jobs.values()))
        assert lookup({"id": "r", "job": decl.name, "executor": decl.spec["executor"]}) is not None
        print(json.dumps(forbidden()))
    """)
    assert out == []


@pytest.mark.parametrize("app", [False, True], ids=["builtin-executors", "app"])
def test_the_raftsched_worker_command_loads_no_node_module(app, tmp_path):
    """``raftsched worker`` itself (cli.main), up to the call that would run the lease loop:
    parsing, the token file, ``--app``, the worker's config. run_worker is replaced by one that
    looks at sys.modules and returns 0."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    argv = ["worker", "--url", "http://127.0.0.1:9", "--token-file", str(token), "--id", "w1"]
    if app:
        argv += ["--app", "sdk_worker_app:app"] + (["--allow-root-jobs"] if os.geteuid() == 0 else [])
    out = run_fresh(f"""
        import json
        import raftsched.worker.remote as remote
        seen = {{}}
        async def fake_run_worker(cfg, clock=None, stop=None):
            seen["forbidden"] = forbidden()
            seen["app"] = cfg.executor_lookup is not None
            return 0
        remote.run_worker = fake_run_worker
        from raftsched import cli
        rc = cli.main({argv!r})
        print(json.dumps(dict(seen, rc=rc)))
    """)
    assert out == {"forbidden": [], "app": app, "rc": 0}
