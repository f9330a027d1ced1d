"""How many examples a property test runs: its CI count times ``LONG_TESTS`` (default 1, as in
``scripts/test.sh``; ``LONG_TESTS=10`` by hand for a long run: docs/testing.md, "Long runs")."""
from __future__ import annotations

import os

SCALE = max(1, int(os.environ.get("LONG_TESTS", "1") or "1"))


def examples(n: int) -> int:
    """``n`` (the count CI runs) times the scale."""
    return n * SCALE
