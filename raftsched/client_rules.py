"""How one logical call is routed and retried: the former module of these names, now
raftsched/client/core.py (the client's core, without I/O)."""
from __future__ import annotations

from .client.core import (
    ATTEMPT_TIMEOUT_S_MIN, ROUND_WAIT_S_MAX, ROUND_WAIT_S_MIN, Call, Done, Fail, LostAfterSendError, NotSentError, Try,
    Wait, error_of, with_status,
)

__all__ = ["ATTEMPT_TIMEOUT_S_MIN", "ROUND_WAIT_S_MAX", "ROUND_WAIT_S_MIN", "Call", "Done", "Fail",
           "LostAfterSendError", "NotSentError", "Try", "Wait", "error_of", "with_status"]
