"""The audit log: one JSON line for every mutation a node was asked for, accepted or refused,
and for every request it refused a token for (docs/security.md, "The audit log").

``DATA_DIR/audit.jsonl``, rotated at ``audit_file_bytes_max`` into ``audit.jsonl.1`` (the newest)
... ``audit.jsonl.N``, so a node keeps at most (1 + audit_files_kept) files of it. A record::

    {"ts": "2026-12-01T10:00:00.123Z", "node": "node-1", "source": "127.0.0.1",
     "token": "3f9c0a1b2c3d4e5f", "role": "operator", "method": "PUT", "route": "/v1/jobs/{name}",
     "target": {"name": "nightly"}, "status": 201, "auth": "allowed", "request_id": "..."}

``token`` is the token's id (``bootstrap`` for the --token-file token) and never its secret: the
Authorization header, the body and the query string are never written. For a refused token,
``token`` is the id the caller claimed when it has the shape of one (or null). Each node writes
the requests it received; a write forwarded to the leader is in the log of the node the client
asked. Writes are synchronous appends (a line, then a flush): a few microseconds each.
"""
from __future__ import annotations

import json
import logging
import os

from ..core import schedule
from . import limits

log = logging.getLogger("raftsched.audit")


def _bound(v):
    if isinstance(v, str) and len(v) > limits.audit_field_chars_max:
        return v[:limits.audit_field_chars_max - 1] + "…"
    return v


class AuditLog:
    """Appends audit records to ``path``, rotating it when it grows past ``max_bytes``.

    :param path: the log file (created under the node's umask, 077).
    :param max_bytes: the size past which the file is rotated.
    :param keep: rotated files kept (``path.1`` ... ``path.keep``).
    """

    def __init__(self, path: str, node_id: str, *, max_bytes: int = limits.audit_file_bytes_max,
                 keep: int = limits.audit_files_kept) -> None:
        self.path = path
        self.node_id = node_id
        self.max_bytes = max_bytes
        self.keep = keep
        self._f = None
        self._size = 0
        self.written = 0
        self.failed = 0

    def _open(self) -> None:
        self._f = open(self.path, "a", encoding="utf-8")
        self._size = self._f.tell()

    def _rotate(self) -> None:
        self._f.close()
        self._f = None
        for i in range(self.keep - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        if self.keep > 0:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._open()

    def record(self, *, now_ms: int, source: str | None, token: str | None, role: str | None,
               method: str, route: str, target: dict, status: int | None, auth: str,
               request_id: str | None) -> None:
        """Append one record. Never raises: a full disk must not turn a request into a 500 (it
        is counted in ``failed`` and logged once in a while)."""
        rec = {"ts": schedule.iso(now_ms), "node": self.node_id, "source": _bound(source), "token": _bound(token),
               "role": role, "method": _bound(method), "route": _bound(route),
               "target": {_bound(str(k)): _bound(str(v)) for k, v in list(target.items())[:8]},
               "status": status, "auth": auth, "request_id": _bound(request_id)}
        line = json.dumps(rec, ensure_ascii=True, separators=(",", ":")) + "\n"
        try:
            if self._f is None:
                self._open()
            self._f.write(line)
            self._f.flush()
            self._size += len(line)
            self.written += 1
            if self._size >= self.max_bytes:
                self._rotate()
        except OSError as e:
            self.failed += 1
            if self.failed == 1 or self.failed % 1000 == 0:
                log.error("audit log %s: %s (%d records lost so far)", self.path, e, self.failed)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class RedactBadRequests(logging.Filter):
    """aiohttp logs a request its HTTP parser refuses with the parser's error, which quotes the
    offending line as it came: an ``Authorization`` header with a stray character in it would put
    the caller's token into the node's log. This filter (on the ``aiohttp.server`` logger) keeps
    the line and the error's class and status, and drops the quote. Installed by run_node."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        from aiohttp.http_exceptions import HttpProcessingError
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} {exc.code} (the request is not shown: it may hold a token)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def install_log_redaction() -> RedactBadRequests:
    """Add RedactBadRequests to the ``aiohttp.server`` logger (once)."""
    lg = logging.getLogger("aiohttp.server")
    for f in lg.filters:
        if isinstance(f, RedactBadRequests):
            return f
    f = RedactBadRequests()
    lg.addFilter(f)
    return f
