#!/usr/bin/env python3
"""How long ``raftsched sync`` takes for an app of N jobs, against three local nodes.

    .venv/bin/python scripts/sync_timing.py 2000

Writes a module declaring N cron jobs into a temporary directory, starts a three-node
LocalCluster on free loopback ports (no worker slots: nothing runs), and times four runs of the
command as a process (interpreter start and import included): a dry run against an empty
cluster, the sync that creates the jobs, a second sync (nothing to change), and a dry run.
docs/sdk.md quotes its figures.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from raftsched.testing.cluster import LocalCluster  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
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
                                    "--url", urls, "--token", c.token], cwd=tmp, capture_output=True, text=True)
                dt = time.monotonic() - t0
                last = (p.stdout.strip().splitlines() or [""])[-1]
                print(f"{what:<24} {dt:6.2f} s  exit {p.returncode}  {last}")
                if p.returncode:
                    print(p.stderr, file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
