"""The raw pysyncobj baseline (scripts/baselines/raw_raft.py): commits per second and latency of
the Raft layer alone, three processes with our Raft configuration; the ceiling under raftsched."""
from __future__ import annotations

from pathlib import Path

from ..harness import run_baseline


def raw_raft(tmp: Path, p: dict) -> dict:
    """The baseline with the profile's duration, warm-up and commands in flight; never raises (a
    baseline that cannot run is recorded as not run)."""
    return run_baseline(tmp, "raw_raft.py", ["--seconds", str(p["raw_raft_s"]), "--warmup", str(p["raw_raft_warmup_s"]),
                                             "--in-flight", str(p["raw_raft_in_flight"])],
                        "raw-raft", timeout_s=2 * (p["raw_raft_s"] + p["raw_raft_warmup_s"]) + 90)
