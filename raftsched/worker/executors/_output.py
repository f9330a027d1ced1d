"""Output bounding and error reasons, shared by all executor types."""
from __future__ import annotations

import traceback

from ...core import limits as core_limits
from .. import limits

#: bytes of output kept per run (the tail: the end of a log says why a run failed): what the
#: replicated state keeps of a run's output, so the state never cuts it again.
OUTPUT_BYTES_MAX = core_limits.output_bytes_max


def tail_bytes(data: bytes | bytearray, limit: int = OUTPUT_BYTES_MAX, cut: bool = False) -> str:
    """The last ``limit`` bytes of ``data`` as text (UTF-8, invalid bytes replaced).

    :param cut: ``data`` is itself the tail of something longer (so it may start mid-character).
    """
    tail = bytes(data[-limit:]) if limit > 0 else b""
    if cut or len(data) > limit:
        # The cut may fall inside a multi-byte character: drop its continuation bytes rather
        # than show a replacement character for half a character.
        i = 0
        while i < min(3, len(tail)) and 0x80 <= tail[i] <= 0xBF:
            i += 1
        tail = tail[i:]
    return tail.decode("utf-8", "replace")


def tail_str(text: str, limit: int = OUTPUT_BYTES_MAX) -> str:
    return tail_bytes(text.encode("utf-8", "replace"), limit)


def short(text: str, limit: int = limits.outcome_error_chars_max) -> str:
    """An error reason: one line of at most ``limit`` characters."""
    text = " ".join(text.split())  # one line
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exc_reason(e: BaseException) -> str:
    msg = str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def format_tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))



def executor_error(e: BaseException) -> tuple[bool, str, str]:
    """The result of a run that failed by an error of the executor's own, not the job's: the
    contract is an Outcome, whatever went wrong in here."""
    return False, short(f"executor error: {exc_reason(e)}"), tail_str(format_tb(e))
