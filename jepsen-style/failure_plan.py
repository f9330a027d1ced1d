"""The deterministic failure plan, shared by the runner (which obeys it) and the checker (which
computes from it what each run's attempts and final place must be).

Whether an attempt fails, and how long it works, is a hash of the run id and the attempt number:
no random generator, no state, the same answer in every process and on every replay.
"""
from __future__ import annotations

import hashlib

#: The text a planned failure's exception carries; the checker finds it in the attempt's error.
PLANNED_FAILURE = "planned failure"
#: The text of a failure because the sink refused the write (a stale token).
FENCED = "fenced by the sink"


def _u(run_id: str, attempt: int, salt: str) -> int:
    h = hashlib.blake2b(f"{salt}|{run_id}#{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big")


def attempt_fails(run_id: str, attempt: int, fail_pct: int) -> bool:
    """Whether attempt ``attempt`` of ``run_id`` is planned to fail (``fail_pct`` in 0..100)."""
    return _u(run_id, attempt, "fail") % 100 < fail_pct


def work_ms(run_id: str, attempt: int, lo: int, hi: int) -> int:
    """How long the attempt works between its two sink writes, in [lo, hi] ms."""
    return lo + _u(run_id, attempt, "work") % (max(hi, lo) - lo + 1)


def expected_outcome(run_id: str, fail_pct: int, max_attempts: int) -> tuple[str, int]:
    """With no fault: ("succeeded", n) for the first planned success n <= max_attempts, or
    ("dead", max_attempts) when every attempt is planned to fail."""
    for n in range(1, max_attempts + 1):
        if not attempt_fails(run_id, n, fail_pct):
            return "succeeded", n
    return "dead", max_attempts
