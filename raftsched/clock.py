"""The clock is an object passed to the edges (trio's Clock, TigerBeetle's Time).

``now_ms`` is wall time and goes into commands; ``monotonic_s`` is for sleeps and deadlines only.
The core never reads either: time reaches it as a command field.

A node and a remote worker run on a :class:`ClusterClock`: cluster time (the median of the
members' wall clocks, core/clocksync.py) wherever it is known, the local clock otherwise.
"""
from __future__ import annotations

import time
from typing import Callable, Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...
    def monotonic_s(self) -> float: ...


class SystemClock:
    """Wall time, with an optional offset read from a file (a test-only fault-injection hook,
    ``NodeConfig.clock_offset_file``: the jepsen-style nemesis writes a number of milliseconds
    there to shift one node's clock)."""

    def __init__(self, offset_file: str | None = None) -> None:
        self._offset_file = offset_file
        self._offset_ms = 0
        self._checked = 0.0

    def _offset(self) -> int:
        if self._offset_file is None:
            return 0
        t = time.monotonic()
        if t - self._checked > 0.2:
            self._checked = t
            try:
                with open(self._offset_file) as f:
                    self._offset_ms = int(f.read().strip() or 0)
            except (OSError, ValueError):
                self._offset_ms = 0
        return self._offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self._offset()

    def monotonic_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono = 1000.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_s(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        """Both clocks move forward together."""
        self._now_ms += ms
        self._mono += ms / 1000

    def jump(self, ms: int) -> None:
        """Wall time jumps (either way); monotonic time does not."""
        self._now_ms += ms


class ClusterClock:
    """The cluster's clock, for what a node or a worker stamps and judges by: ``now_ms`` is
    ``cluster_ms()`` (cluster time: the median of the members' wall clocks, measured on the Raft
    traffic, docs/design.md "Clocks"), or the ``local`` clock's wall time while that is None
    (a node that has not heard from a leader yet, a worker whose node does not say).
    ``monotonic_s`` is the local clock's.

    So every command a node proposes carries cluster time, whatever its own clock says: state
    time (the highest ``now`` proposed) is not pushed ahead by one fast clock, and an acquire
    grants no run before its due by the cluster's clock."""

    def __init__(self, local: Clock, cluster_ms: Callable[[], int | None]) -> None:
        self.local = local
        self.cluster_ms = cluster_ms

    def now_ms(self) -> int:
        t = self.cluster_ms()
        return self.local.now_ms() if t is None else t

    def monotonic_s(self) -> float:
        return self.local.monotonic_s()
