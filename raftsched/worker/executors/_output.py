"""Output bounding and error reasons, shared by all executor types.

Each takes the values a run's secrets are (``masked``, worker/masking.py ``secret_values``) and
masks them out before it shapes anything: masked after the output was cut to its tail, a secret
the cut went through would leave its end in it; masked after an error was made one line, a secret
with two spaces or a tab in it would no longer be found.
"""
from __future__ import annotations

import traceback
from collections.abc import Sequence

from ...core import limits as core_limits
from .. import limits
from ..masking import mask

#: bytes of output kept per run (the tail: the end of a log says why a run failed): what the
#: replicated state keeps of a run's output, so the state never cuts it again.
OUTPUT_BYTES_MAX = core_limits.output_bytes_max


def tail_bytes(data: bytes | bytearray, limit: int = OUTPUT_BYTES_MAX, cut: bool = False,
               masked: Sequence[str] = ()) -> str:
    """The last ``limit`` bytes of ``data`` as text (UTF-8, invalid bytes replaced), masked of
    ``masked``: where the cut went through one of them, what is left of it is dropped
    (masking.mask's ``cut``).

    :param cut: ``data`` is itself the tail of something longer (so it may start mid-character,
        or in the middle of a secret).
    """
    tail = bytes(data[-limit:]) if limit > 0 else b""
    cut = cut or len(data) > limit
    if cut:
        # The cut may fall inside a multi-byte character: drop its continuation bytes rather
        # than show a replacement character for half a character.
        i = 0
        while i < min(3, len(tail)) and 0x80 <= tail[i] <= 0xBF:
            i += 1
        tail = tail[i:]
    return mask(tail.decode("utf-8", "replace"), masked, cut) or ""


def tail_str(text: str, limit: int = OUTPUT_BYTES_MAX, masked: Sequence[str] = (), cut: bool = False) -> str:
    """:func:`tail_bytes` of ``text``. :param cut: ``text`` is itself the tail of something longer."""
    return tail_bytes(text.encode("utf-8", "replace"), limit, cut, masked)


def may_be_cut(text: str, limit: int = OUTPUT_BYTES_MAX) -> bool:
    """Whether ``text``, an output another process bounded, may be a tail it cut: it is as long
    as the bound (less the continuation bytes a cut drops)."""
    return len(text) * 4 >= limit - 3 and len(text.encode("utf-8", "replace")) >= limit - 3


def short(text: str, limit: int = limits.outcome_error_chars_max, masked: Sequence[str] = ()) -> str:
    """An error reason: one line of at most ``limit`` characters, masked of ``masked`` first."""
    text = " ".join((mask(text, masked) or "").split())  # one line
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exc_reason(e: BaseException) -> str:
    msg = str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def format_tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))



def executor_error(e: BaseException, masked: Sequence[str] = ()) -> tuple[bool, str, str]:
    """The result of a run that failed by an error of the executor's own, not the job's: the
    contract is an Outcome, whatever went wrong in here."""
    return False, short(f"executor error: {exc_reason(e)}", masked=masked), tail_str(format_tb(e), masked=masked)
