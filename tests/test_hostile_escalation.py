"""The hostile suite's escalation case (issue 22): the way around tokens and tenants that a hostile
review found. An operator token limited to one tenant, allowed to run shell and python jobs,
creates jobs that try to read what would give it the cluster: the bootstrap token file, the
cluster secret, the data directory (whose journal holds every tenant's jobs) and the node's
environment. Their output holds none of it, and says why: they run as another user than the
node (docs/security.md, "What a job can reach").

Only when the tests run as root: a node that does not run as root runs jobs as its own user, who
can read its files (docs/security.md says so, and the node warns at start).
"""
from __future__ import annotations

import os
import secrets
import shutil
import textwrap

import pytest

from raftsched.testing.cluster import ANY_YEAR_ENV

from procs import Cluster, http, jobs_dir, wait_for

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another user only when the node runs as root")]

#: A python job that tries to read what the shell job does (loaded by the node's run server from a
#: directory of the test's, on the node's PYTHONPATH).
TARGET = textwrap.dedent('''
    import os


    def attempt(ctx):
        """What a hostile job would try, each attempt reported with what it got."""
        out = {"uid": os.getuid()}
        for name, path in ctx.payload["files"].items():
            try:
                with open(path, "rb") as f:
                    out[name] = f.read(4096).decode("utf-8", "replace")
            except OSError as e:
                out[name] = f"refused: {type(e).__name__}"
        data = ctx.payload["data_dir"]
        try:
            out["data_dir"] = sorted(os.listdir(data))
        except OSError as e:
            out["data_dir"] = f"refused: {type(e).__name__}"
        hits = []
        for root, _dirs, files in os.walk(data):
            for fn in files:
                try:
                    with open(os.path.join(root, fn), "rb") as f:
                        if ctx.payload["job_canary"].encode() in f.read():
                            hits.append(fn)
                except OSError:
                    pass
        out["data_hits"] = hits
        out["env"] = dict(os.environ)
        environs = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if b"ESCALATION_CANARY" in f.read():
                            environs.append(pid)
                except OSError:
                    pass
        out["environs"] = environs
        return out
''')


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    lib = jobs_dir("escalation")
    (lib / "escalation_target.py").write_text(TARGET)
    os.chmod(lib / "escalation_target.py", 0o644)
    canaries = {"token": secrets.token_hex(20), "secret": secrets.token_hex(20), "env": secrets.token_hex(20),
                "job": "tb-" + secrets.token_hex(12), "tb_secret": secrets.token_hex(20)}
    path = os.pathsep.join([str(lib)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    c = Cluster(tmp_path_factory.mktemp("escalation"), n=1, secret=canaries["secret"], token=canaries["token"],
                env={"ESCALATION_CANARY": canaries["env"], "PYTHONPATH": path}, node_args=["--slots", "2"])
    c.canaries = canaries
    c.start()
    try:
        c.wait_leader(30)
        # Tenant tb's job, with a secret: its name, and its secret unless sealed, are in the journal.
        s, b = c.call(0, "PUT", f"/v1/jobs/{canaries['job']}",
                      {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"}, "tenant": "tb", "queue": "qb",
                       "executor": {"type": "shell", "argv": ["true"]}, "secrets": {"TB_KEY": canaries["tb_secret"]}})
        assert s == 201, b
        # A limited operator may create http jobs only, until an admin allows more to its tenant
        # (docs/security.md, "Tenant policy"): the admin allows shell and python to tenant ta.
        s, b = c.call(0, "PUT", "/v1/tenants/ta", {"executors": ["shell", "python", "http"]})
        assert s == 200, b
        s, b = c.call(0, "POST", "/v1/tokens", {"role": "operator", "tenants": ["ta"]})
        assert s == 201, b
        c.limited = b["token"]
        # A limited operator is refused the tokens it would need to escalate through the API.
        assert http("GET", c.url(0) + "/v1/tokens", token=c.limited)[0] == 403
        yield c
    finally:
        c.stop()
        shutil.rmtree(lib, ignore_errors=True)


def _run_as_limited(c: Cluster, name: str, executor: dict, payload: dict | None = None) -> dict:
    spec = {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"}, "tenant": "ta", "queue": "qa",
            "executor": executor,
            "payload": payload}
    s, b = http("PUT", f"{c.url(0)}/v1/jobs/{name}", spec, token=c.limited)
    assert s == 201, b
    s, b = http("POST", f"{c.url(0)}/v1/jobs/{name}/trigger", token=c.limited)
    assert s == 201, b
    rid = b["run"]

    def finished():
        s, r = http("GET", f"{c.url(0)}/v1/runs/{rid}", token=c.limited)
        return (r,) if s == 200 and r["state"] in ("succeeded", "dead", "failed") else None
    return wait_for(finished, 60, f"run {rid} to finish")[0]


def _assert_holds_none(c: Cluster, output: str) -> None:
    for what, value in c.canaries.items():
        if what != "job":
            assert value not in output, f"the job's output holds the {what}: {output}"


def test_a_limited_operators_shell_job_reads_no_key_no_data_and_no_environment_of_the_node(node):
    c = node
    data = c.data_dir(0)
    script = f"""
        id -u
        for f in '{c.token_file}' '{c.secret_file}' '{data}/token'; do cat "$f" || echo "refused $f"; done
        ls -a '{data}' || echo 'refused data dir'
        grep -r -a -l '{c.canaries["job"]}' '{data}' || echo 'no data hit'
        env
        for p in /proc/[0-9]*; do {{ tr '\\000' '\\n' < "$p/environ"; }} 2>/dev/null | grep -a ESCALATION_CANARY; done
        true
    """
    r = _run_as_limited(c, "esc-shell", {"type": "shell", "argv": ["sh", "-c", textwrap.dedent(script)]})
    out = r["output"]
    assert r["state"] == "succeeded", r
    assert out.split("\n", 1)[0].strip() not in ("", "0"), f"the job ran as root: {out}"
    assert f"refused {c.token_file}" in out and f"refused {c.secret_file}" in out, out
    assert "refused data dir" in out and "no data hit" in out, out
    assert "ESCALATION_CANARY" not in out, out
    _assert_holds_none(c, out)


def test_a_limited_operators_python_job_reads_no_key_no_data_and_no_environment_of_the_node(node):
    c = node
    data = c.data_dir(0)
    payload = {"files": {"token_file": str(c.token_file), "secret_file": str(c.secret_file),
                         "data_token": str(data / "token"), "journal": str(data / "raft.journal")},
               "data_dir": str(data), "job_canary": c.canaries["job"]}
    r = _run_as_limited(c, "esc-python", {"type": "python", "target": "escalation_target:attempt"}, payload)
    assert r["state"] == "succeeded", r
    out = r["output"]
    _assert_holds_none(c, out)
    got = eval(out, {"__builtins__": {}})  # the repr of the dict it returned: literals only
    assert got["uid"] != 0, got
    assert all(str(got[k]).startswith("refused") for k in payload["files"]), got
    assert str(got["data_dir"]).startswith("refused") and got["data_hits"] == [], got
    assert "ESCALATION_CANARY" not in got["env"] and got["environs"] == [], got
    # What it does get: the run contract, the allow-listed names, its own directory as HOME.
    assert got["env"]["RAFTSCHED_JOB"] == "esc-python" and got["env"]["HOME"] == os.path.realpath(got["env"]["HOME"])
    passed = {n for n in ANY_YEAR_ENV if os.environ.get(n)}  # the any-year run's --pass-env (cluster.py)
    assert set(got["env"]) - {"PATH", "LANG", "TZ", "HOME"} - passed <= {k for k in got["env"]
                                                                        if k.startswith("RAFTSCHED_")}, got
