"""How long ``raftsched sync`` takes for an app of N jobs, against three local nodes.

    .venv/bin/python scripts/measure sync-timing 2000

Writes a module declaring N cron jobs into a temporary directory, starts a three-node
LocalCluster on free loopback ports (no worker slots: nothing runs), and times four runs of the
command as a process (interpreter start and import included): a dry run against an empty
cluster, the sync that creates the jobs, a second sync (nothing to change), and a dry run. The
command runs this checkout's code, as the nodes do (its directory first on PYTHONPATH).
docs/sdk.md quotes its figures.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import ROOT, Smoke

SMOKE = [Smoke(("20",), "second sync")]


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    from raftsched.testing.cluster import LocalCluster  # noqa: E402

    n = int(argv[0]) if argv else 2000
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "many_jobs.py").write_text(
            "from raftsched import App\n"
            'app = App("many", misfire="skip", queue="many")\n\n'
            "def handler(ctx):\n    return None\n\n"
            f"for i in range({n}):\n"
            '    app.job(f"job-{i:05d}", cron=f"{i % 60} * * * *")(handler)\n')
        (tmp / "nodes").mkdir()
        with LocalCluster(tmp / "nodes", node_args=["--slots", "0"]) as c:
            c.start()
            c.wait_leader(30)
            urls = ",".join(c.url(i) for i in range(c.n))
            for what, extra in (("dry run, empty cluster", ["--dry-run"]), ("sync (creates)", []),
                                ("second sync", []), ("dry run", ["--dry-run"])):
                t0 = time.monotonic()
                p = subprocess.run([sys.executable, "-m", "raftsched.cli", "sync", "many_jobs:app", *extra,
                                    "--url", urls, "--token", c.token], cwd=tmp, capture_output=True, text=True, env=env)
                dt = time.monotonic() - t0
                last = (p.stdout.strip().splitlines() or [""])[-1]
                print(f"{what:<24} {dt:6.2f} s  exit {p.returncode}  {last}")
                if p.returncode:
                    print(p.stderr, file=sys.stderr)
                    return 1
    return 0
