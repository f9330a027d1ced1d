"""The executors moved to :mod:`raftsched.worker.executors`; this name is kept for code that
imports ``RunContext`` (or ``Outcome``, ``CancelEvent``, ...) from where earlier versions of
docs/api.md named it. New code imports ``raftsched.worker.executors``."""
from __future__ import annotations

from ..worker.executors import (  # noqa: F401
    ALL_TYPES, OUTPUT_BYTES_MAX, CancelEvent, Outcome, Result, RunContext, execute, execute_soon, run_function,
)
