"""What protecting the Raft port costs (docs/security.md, "The Raft port"; docs/benchmarks.md).

Usage:
    .venv/bin/python scripts/measure bench-raft-crypto [--seconds 5] [--warmup 2] [--rounds 3] [--skip-cluster]
        [--out FILE] [--crypto aead,fernet,none] [--messages N] [--message-rounds 7]

Two measurements:

1. **Per message**, in this process: protecting and opening one message of 200 B, 2 KiB and
   32 KiB (random bytes, as pysyncobj hands the encryptor a pickled, uncompressed message), with
   raftsched's AES-256-GCM (``replication/_crypto.py``, what every node uses), pysyncobj's own
   Fernet (AES-128-CBC + HMAC-SHA256, base64; what a ``password`` alone gives), and nothing. The
   median of 7 rounds (``--message-rounds``) of ``number`` messages each (2 MB worth, at least
   200; ``--messages`` sets it), in microseconds a message.
2. **A cluster**: scripts/baselines/raw_raft.py (three pysyncobj processes on loopback, a client
   keeping 1000 commands in flight) with each protection (``--crypto``), ``--rounds`` times,
   interleaved: the median commits per second and p50 latency, driven on the leader and on a
   follower.

Prints a Markdown table of each and writes the whole result as JSON to ``--out`` (default
bench-raft-crypto.json). Nothing is asserted: the figures are for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import ROOT, Smoke

REPO = Path(ROOT)

SIZES = (200, 2048, 32 * 1024)
CRYPTOS = ("aead", "fernet", "none")

ARGPARSE = True
SMOKE = [Smoke(("--messages", "50", "--message-rounds", "1", "--crypto", "aead", "--rounds", "1", "--seconds", "0.3",
                "--warmup", "0.2", "--out", "{tmp}/bench-raft-crypto.json"), "commits/s")]


def per_message(rounds: int = 7, number: int | None = None) -> list[dict]:
    from pysyncobj.encryptor import getEncryptor

    from raftsched.replication._crypto import _AeadEncryptor

    secret = os.urandom(24).hex()
    aead_tx, aead_rx = _AeadEncryptor(secret), _AeadEncryptor(secret)  # two processes' encryptors
    fernet = getEncryptor(secret)
    schemes = {
        "aes-256-gcm (raftsched)": (aead_tx.encrypt_at_time, aead_rx.decrypt),
        "fernet (pysyncobj)": (fernet.encrypt_at_time, fernet.decrypt),
        "none": (lambda d, t: d, lambda d: d),
    }
    out = []
    for size in SIZES:
        data = os.urandom(size)
        number = number or max(200, 2_000_000 // size)
        row = {"bytes": size, "messages_per_round": number}
        for name, (enc, dec) in schemes.items():
            token = enc(data, int(time.monotonic()))
            assert dec(token) == data
            enc_us, dec_us = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(number):
                    token = enc(data, 1000)
                t1 = time.perf_counter()
                for _ in range(number):
                    dec(token)
                t2 = time.perf_counter()
                enc_us.append((t1 - t0) / number * 1e6)
                dec_us.append((t2 - t1) / number * 1e6)
            row[name] = {"protect_us": round(statistics.median(enc_us), 2),
                         "open_us": round(statistics.median(dec_us), 2),
                         "bytes_on_wire": len(token)}
        out.append(row)
    return out


def _raw_raft(crypto: str, seconds: float, warmup: float) -> dict:
    """One raw_raft run; a run that fails (pysyncobj's own faults, see its docstring) is tried
    once more, and both attempts are kept."""
    errors = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as d:
            res_path = Path(d) / "r.json"
            p = subprocess.run([sys.executable, str(REPO / "scripts/baselines/raw_raft.py"), "--seconds", str(seconds),
                                "--warmup", str(warmup), "--crypto", crypto, "--out", str(res_path)],
                               capture_output=True, text=True, timeout=4 * (seconds + warmup) + 180, cwd=REPO)
            if p.returncode == 0:
                r = json.loads(res_path.read_text())
                return {"leader": r["leader"]["commits_per_s"], "follower": r["follower"]["commits_per_s"],
                        "leader_p50_ms": r["leader"]["latency_ms"]["p50"],
                        "follower_p50_ms": r["follower"]["latency_ms"]["p50"],
                        "loadavg_1m": os.getloadavg()[0], "failed_attempts": errors}
            errors.append(p.stderr[-500:])
    return {"error": errors}


def cluster(seconds: float, warmup: float, rounds: int, cryptos=CRYPTOS) -> dict:
    """``rounds`` runs of each protection, interleaved (the machine's load drifts), and the
    median of each figure."""
    runs: dict[str, list] = {c: [] for c in cryptos}
    for _ in range(rounds):
        for crypto in runs:
            runs[crypto].append(_raw_raft(crypto, seconds, warmup))
    out = {}
    for crypto, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        out[crypto] = {"runs": rs}
        if ok:
            for k in ("leader", "follower", "leader_p50_ms", "follower_p50_ms"):
                vals = [r[k] for r in ok if r[k] is not None]  # a run with no commit has no p50
                out[crypto][k] = statistics.median(vals) if vals else None
    return out


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    ap = argparse.ArgumentParser(prog="scripts/measure bench-raft-crypto", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="raw_raft measurement window per run")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3, help="raw_raft runs of each protection")
    ap.add_argument("--skip-cluster", action="store_true", help="only the per-message figures")
    ap.add_argument("--out", default="bench-raft-crypto.json")
    ap.add_argument("--crypto", default=",".join(CRYPTOS), help="the protections run on a cluster, comma-separated")
    ap.add_argument("--messages", type=int, help="messages a round of the per-message figures (default: 2 MB worth, at least 200)")
    ap.add_argument("--message-rounds", type=int, default=7, help="rounds of the per-message figures (their median)")
    args = ap.parse_args(argv)
    cryptos = tuple(c for c in args.crypto.split(",") if c)
    if not cryptos or set(cryptos) - set(CRYPTOS):
        ap.error(f"--crypto: choose from {','.join(CRYPTOS)}")
    result = {"per_message": per_message(args.message_rounds, args.messages), "cpus": os.cpu_count(),
              "loadavg_1m_at_start": os.getloadavg()[0]}
    print("| message | scheme | protect (us) | open (us) | bytes on the wire |")
    print("|---|---|---|---|---|")
    for row in result["per_message"]:
        for name, v in row.items():
            if isinstance(v, dict):
                print(f"| {row['bytes']} B | {name} | {v['protect_us']} | {v['open_us']} | {v['bytes_on_wire']} |")
    if not args.skip_cluster:
        result["cluster"] = cluster(args.seconds, args.warmup, args.rounds, cryptos)
        print()
        print(f"raw_raft, median of {args.rounds} interleaved runs of {args.seconds:g} s each:")
        print("| protection | on the leader: commits/s, p50 ms | on a follower: commits/s, p50 ms |")
        print("|---|---|---|")
        for crypto, r in result["cluster"].items():
            if "leader" not in r:
                print(f"| {crypto} | failed | see the JSON |")
                continue
            print(f"| {crypto} | {r['leader']:.0f}, {r['leader_p50_ms']} | {r['follower']:.0f}, {r['follower_p50_ms']} |")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0
