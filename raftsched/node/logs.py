"""The node's log (docs/operations.md, "Logs"): bounded in rate and, written to a file, in size.

- ``RepeatLimiter``: at most ``log_repeats_burst`` lines of one kind (logger, level, message
  template) every ``log_repeats_window_s``; the others are counted, and the next line of that
  kind let through says how many were left out. A client that sends malformed requests (each
  logged by aiohttp) or anything else that logs a line per request cannot grow the log faster
  than that.
- ``log_file_handler``: ``--log-file PATH`` (``scripts/cluster.sh`` passes the node's
  ``node.log``): a ``RotatingFileHandler`` rotated at ``log_file_bytes_max`` into ``PATH.1`` (the
  newest) ... ``PATH.<log_files_kept>``. When the process's stdout or stderr is that same file
  (cluster.sh appends both to it, for what bypasses logging: a crash before logging starts, a
  fatal error's dump), each rotation points them at the new file too.
"""
from __future__ import annotations

import collections
import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Callable

from . import limits


class RepeatLimiter(logging.Filter):
    """Lets through at most ``burst`` records of one kind every ``window_s`` seconds (of
    ``clock``, monotonic). Kinds are remembered for at most ``kinds_max`` (the least recently
    seen forgotten)."""

    def __init__(self, burst: int = limits.log_repeats_burst, window_s: float = limits.log_repeats_window_s,
                 clock: Callable[[], float] = time.monotonic, kinds_max: int = 1000) -> None:
        super().__init__()
        self.burst, self.window_s, self.clock, self.kinds_max = burst, window_s, clock, kinds_max
        #: kind -> [window start, lines let through in it, lines left out since the last one let through]
        self._kinds: collections.OrderedDict[tuple, list] = collections.OrderedDict()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        k = self._kinds.get(kind)
        if k is None:
            k = self._kinds[kind] = [now, 0, 0]
            while len(self._kinds) > self.kinds_max:
                self._kinds.popitem(last=False)
        self._kinds.move_to_end(kind)
        if now - k[0] >= self.window_s:
            k[0], k[1] = now, 0
        if k[1] >= self.burst:
            k[2] += 1
            self.suppressed += 1
            return False
        k[1] += 1
        if k[2]:
            record.msg = f"{record.getMessage()} [{k[2]} more like this not logged: at most {self.burst} every " \
                         f"{self.window_s:g} s]"
            record.args = ()
            k[2] = 0
        return True


class _RotatingLog(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler that, after each rotation, points this process's stdout and stderr
    at the new file when they were writing to the log file it opened (``follow``)."""

    def __init__(self, path: str, max_bytes: int, keep: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=keep, encoding="utf-8")
        self.follow = [fd for fd in (1, 2) if _same_file(fd, path)]

    def doRollover(self) -> None:
        super().doRollover()
        if self.stream is not None:
            for fd in self.follow:
                try:
                    sys.stdout.flush() if fd == 1 else sys.stderr.flush()
                    os.dup2(self.stream.fileno(), fd)
                except (OSError, ValueError):
                    pass


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def log_file_handler(path: str, max_bytes: int = limits.log_file_bytes_max,
                     keep: int = limits.log_files_kept) -> logging.Handler:
    """The handler of ``--log-file PATH`` (module docstring). :raises OSError: it cannot be opened."""
    return _RotatingLog(path, max_bytes, keep)
