"""What checking a token costs a node on every request (node/auth.py; docs/security.md).

Usage: .venv/bin/python scripts/measure bench-auth [--tokens 10000] [--n 20000]

In-process, no HTTP: ``Auth.authenticate`` of the bootstrap token, of a token made by
token_create (a state holding ``--tokens`` of them, read through a lock as RaftNode.read does),
of a forged token with a real id, and of an unknown one; and the redaction of a job spec with a
header, an env value and a secret (node/redact.py, done on every read of a job). Medians of 5
rounds of ``--n`` calls, in microseconds a call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from measure import ROOT, Smoke

ARGPARSE = True
SMOKE = [Smoke(("--tokens", "20", "--n", "200"), "us a call")]


def median_us(fn, n: int) -> float:
    out = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(out), 2)


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    from raftsched.clock import SystemClock  # noqa: E402
    from raftsched.core import commands, model  # noqa: E402
    from raftsched.core.state import SchedulerState  # noqa: E402
    from raftsched.node.auth import Auth, new_token  # noqa: E402
    from raftsched.node.redact import Fingerprint, redact_spec  # noqa: E402

    ap = argparse.ArgumentParser(prog="scripts/measure bench-auth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args(argv)
    s = SchedulerState()
    token = None
    for i in range(args.tokens):
        tid, token, h = new_token()
        s.apply(commands.make("token_create", 1000 + i, None, id=tid, role="operator", tenants=None, expires=None, hash=h))
    lock = threading.Lock()

    def read(fn, *a):
        with lock:
            return fn(s, *a)
    boot = "b" * 43
    auth = Auth(boot, read, SystemClock())
    forged = token[:-4] + "AAAA"
    unknown = "rst_0123456789abcdef_" + "A" * 43
    rows = {
        "bootstrap token": lambda: auth.authenticate("Bearer " + boot),
        f"a token of the state ({args.tokens} tokens)": lambda: auth.authenticate("Bearer " + token),
    }

    def refused(t):
        def f():
            try:
                auth.authenticate("Bearer " + t)
            except Exception:
                pass
        return f
    rows["a forged secret for a real id (401)"] = refused(forged)
    rows["an unknown id (401)"] = refused(unknown)
    spec = model.validate_job("j", {"schedule": {"every_s": 5}, "misfire": {"policy": "skip"},
                                    "executor": {"type": "http", "url": "http://h/x", "headers": {"Authorization": "Bearer x" * 4}},
                                    "secrets": {"API": "v" * 40}}, 0)
    fp = Fingerprint.from_cluster_secret("c" * 32)
    rows["redacting a spec (1 header, 1 secret)"] = lambda: redact_spec(spec, fp)
    print("| what | us a call |")
    print("|---|---|")
    for name, fn in rows.items():
        print(f"| {name} | {median_us(fn, args.n)} |")
    return 0
