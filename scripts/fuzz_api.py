#!/usr/bin/env python3
"""schemathesis against a real node (scripts/test.sh's ``schemathesis`` step; docs/testing.md).

Starts a one-node cluster on free loopback ports (raftsched.testing.cluster.LocalCluster; its
worker runs nothing: ``--slots 0``), makes a reader, an operator limited to tenant ``fuzz`` and
a worker token, and runs ``schemathesis run`` on the node's ``/openapi.json`` once with each token
and the admin one: every operation, seeded, with the checks below; then stops the node by its
PID. Fails when schemathesis finds anything, or when fewer requests than ``--min-requests`` were
sent in all.

Checks: no 5xx, every status documented, every answer (errors included: ``{"error": {"code",
"message", "field"}}``) conforming to its documented schema and content type, its documented
headers, and invalid data refused with a 4xx. A lower role's 403 is documented on every
operation that needs a token, so a 403 passes the status check only because it is.

Safety: the node and schemathesis run in a network namespace of their own with only loopback
(``unshare``), so nothing a fuzzed job spec, tenant policy or member address names can reach
another host. Without ``unshare`` the run stops (``--allow-network`` runs it anyway).

Budget: ``--profile ci`` (default) is about 1 100 requests and a minute of CPU (printed at the
end, beside the wall time); ``--profile long`` (or ``RAFTSCHED_FUZZ_PROFILE=long``) runs ten
times the examples and schemathesis's coverage phase. ``--seed`` (or
``RAFTSCHED_FUZZ_SEED``) replays a run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftsched.testing.cluster import LocalCluster  # noqa: E402

#: Examples per operation and phases, per role, in each profile.
PROFILES = {
    "ci": {"admin": (8, "examples,fuzzing,stateful"), "jobs": (20, "stateful"), "reader": (4, "fuzzing"),
           "operator": (5, "fuzzing,stateful"), "worker": (3, "fuzzing")},
    "long": {"admin": (100, "examples,coverage,fuzzing,stateful"), "jobs": (250, "stateful"),
             "reader": (30, "coverage,fuzzing"), "operator": (50, "coverage,fuzzing,stateful"),
             "worker": (30, "coverage,fuzzing")},
}
#: A run's token (its role) and the operations it is limited to: "jobs" is the admin token's
#: stateful run over the job operations only, so that its scenarios follow the links from a job
#: created by PUT (read, pause, resume, trigger, its runs, delete) rather than spread over all.
RUNS = {"admin": ("admin", None), "jobs": ("admin", "^/v1/jobs/"), "reader": ("reader", None),
        "operator": ("operator", None), "worker": ("worker", None)}
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection")
_IN_NS = "RAFTSCHED_FUZZ_NETNS"
CONFIG = Path(__file__).with_name("fuzz_api.toml")


def _reexec_in_netns(argv: list[str]) -> int | None:
    """Run this script again in a network namespace with loopback only; None when impossible."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return None
    flags = ["-n"] if os.geteuid() == 0 else ["-r", "-n"]
    inner = f'"{ip}" link set lo up && exec "$0" "$@"'
    cmd = [unshare, *flags, "sh", "-c", inner, sys.executable, __file__, *argv]
    probe = subprocess.run([unshare, *flags, "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    return subprocess.run(cmd, env=dict(os.environ, **{_IN_NS: "1"})).returncode


def run_schemathesis(url: str, token: str, role: str, examples: int, phases: str, seed: int, out: Path,
                     workers: int, paths: str | None = None) -> dict:
    report = out / f"{role}.json"
    cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(CONFIG), "run",
           f"{url}/openapi.json",
           "--header", f"Authorization: Bearer {token}", "--checks", CHECKS, "--phases", phases,
           "--max-examples", str(examples), "--seed", str(seed), "--workers", str(workers),
           "--request-timeout", "10", "--report", "json", "--report-json-path", str(report),
           "--suppress-health-check", "all", "--output-truncate", "true", "--no-color",
           "--generation-database", "none", "--no-shrink"]
    if paths is not None:
        cmd += ["--include-path-regex", paths]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="fuzz_hooks", PYTHONPATH=str(Path(__file__).parent))
    t0, cpu0 = time.monotonic(), _children_cpu()
    proc = subprocess.run(cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    result = {"role": role, "exit": proc.returncode, "s": round(took, 1), "cpu_s": round(cpu, 1), "requests": 0,
              "output": proc.stdout}
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        data = None
    result["requests"] = count_requests(data) if data is not None else 0
    result["report"] = data
    return result


def _children_cpu() -> float:
    """CPU seconds of the children waited for so far (schemathesis's runs: the machine may be
    shared, so the wall time alone says little)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def count_requests(data) -> int:
    """The requests a run's JSON report counts: its generated test cases (one request each; a
    stateful scenario's steps are cases too)."""
    cases = data.get("test_cases") if isinstance(data, dict) else None
    return int(cases.get("generated", 0)) if isinstance(cases, dict) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=sorted(PROFILES), default=os.environ.get("RAFTSCHED_FUZZ_PROFILE", "ci"))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("RAFTSCHED_FUZZ_SEED", "26")))
    ap.add_argument("--min-requests", type=int, default=1000)
    ap.add_argument("--roles", default=",".join(RUNS), help="the runs to make (%(default)s)")
    ap.add_argument("--workers", type=int, default=1,
                    help="schemathesis's concurrent workers (more than one met a race in Hypothesis on Python 3.11)")
    ap.add_argument("--keep", help="keep the reports and the node's log in this directory")
    ap.add_argument("--allow-network", action="store_true",
                    help="run without a network namespace of its own (fuzzed specs may name any address)")
    args = ap.parse_args(argv)
    raw_argv = sys.argv[1:] if argv is None else argv
    if os.environ.get(_IN_NS) != "1" and not args.allow_network:
        rc = _reexec_in_netns(raw_argv)
        if rc is None:
            print("fuzz_api: cannot make a network namespace (unshare -n); --allow-network runs without one",
                  file=sys.stderr)
            return 2
        return rc
    # SIGTERM (a CI timeout, scripts/test.sh interrupted) unwinds like an exception, so the
    # cluster's `with` stops the node it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start, cpu_start = time.monotonic(), _children_cpu()
    profile = PROFILES[args.profile]
    roles = [r for r in args.roles.split(",") if r]
    tmp = Path(tempfile.mkdtemp(prefix="raftsched-fuzz-"))
    results = []
    try:
        with LocalCluster(tmp, n=1, node_args=["--slots", "0"]) as c:
            c.start()
            c.wait_leader(30)
            url = c.url(0)
            tokens = {"admin": c.token}
            for role, body in (("reader", {"role": "reader"}),
                               ("operator", {"role": "operator", "tenants": ["fuzz"]}),
                               ("worker", {"role": "worker"})):
                s, b = c.call(0, "POST", "/v1/tokens", dict(body, note=f"fuzz {role}"))
                if s != 201:
                    print(f"fuzz_api: making the {role} token answered {s}: {b}", file=sys.stderr)
                    return 1
                tokens[role] = b["token"]
            for role in roles:
                examples, phases = profile[role]
                who, paths = RUNS[role]
                r = run_schemathesis(url, tokens[who], role, examples, phases, args.seed, tmp, args.workers, paths)
                results.append(r)
                print(f"fuzz_api: {role}: exit {r['exit']}, {r['requests']} requests, {r['s']} s "
                      f"({r['cpu_s']} s of CPU)", flush=True)
                for line in r["output"].splitlines():
                    if "API Links:" in line or "Scenarios:" in line:
                        print(f"fuzz_api: {role}: {line.strip()}")
                if r["exit"] != 0:
                    print(r["output"][-20000:])
                    if args.keep:
                        (tmp / f"{role}.out").write_text(r["output"])
            alive = c.alive()
            log_tail = c.log_tail(0, 30)
        if not alive:
            print(f"fuzz_api: the node died during the run:\n{log_tail}", file=sys.stderr)
            return 1
    finally:
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(r["requests"] for r in results)
    fuzz_cpu = sum(r["cpu_s"] for r in results)
    print(f"fuzz_api: CPU: schemathesis {fuzz_cpu:.1f} s, the node {_children_cpu() - cpu_start - fuzz_cpu:.1f} s; "
          f"wall {time.monotonic() - t_start:.1f} s")
    failed = [r["role"] for r in results if r["exit"] != 0]
    print(f"fuzz_api: {total} requests in all (seed {args.seed}, profile {args.profile}); "
          f"{'failed: ' + ', '.join(failed) if failed else 'no failure'}")
    if failed:
        return 1
    if total < args.min_requests:
        print(f"fuzz_api: fewer than {args.min_requests} requests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
