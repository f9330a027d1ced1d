"""The audit log: one JSON line for every request a token was checked for and that mutated or
was refused, and counts of the requests refused without one (docs/security.md, "The audit log").

Two files, each with its own rotation budget, so that requests without a valid token, which
anyone can send, can never push out the records of requests that had one:

- ``DATA_DIR/audit.jsonl``: one record a request whose token was valid (its principal is
  known): every mutation, accepted or refused, and every request refused for its role or
  tenants (403). Rotated at ``audit_file_bytes_max`` into ``audit.jsonl.1`` (the newest) ...
  ``audit.jsonl.N``. A record::

    {"ts": "2026-12-01T10:00:00.123Z", "node": "node-1", "source": "127.0.0.1",
     "token": "3f9c0a1b2c3d4e5f", "role": "operator", "method": "PUT", "route": "/v1/jobs/{name}",
     "target": {"name": "nightly"}, "status": 201, "auth": "allowed", "request_id": "...",
     "agent": "raftsched-client/0.1"}

- ``DATA_DIR/audit-refused.jsonl``: requests refused before a token was accepted (401: no token,
  or an unknown, revoked, expired one; 429: a source slowed for its refused tokens), counted, not
  recorded one by one: one summary a (reason, source address) an interval
  (``audit_refused_interval_s``), for at most ``audit_refused_sources_max`` sources an interval
  (the others are counted together under ``"source": "other"``), each with the first and last
  time, the count, and the most frequent routes, claimed token ids and user agents (the rest
  counted as ``other``). Rotated at ``audit_refused_file_bytes_max``, ``audit_refused_files_kept``
  kept. A summary::

    {"ts": "...", "node": "node-1", "kind": "refused", "reason": "unauthenticated", "status": 401,
     "source": "203.0.113.7", "count": 118212, "first": "...", "last": "...",
     "routes": {"GET /v1/jobs": 118000, "other": 212}, "tokens": {"0123456789abcdef": 3},
     "agents": {"curl/8.5.0": 118212}}

Every field that comes from the client is cut at a bound (``audit_field_chars_max``; the request
id at ``request_id_chars_max``), its last character then a marker (``…``). ``token`` is a
token's id (``bootstrap`` for the --token-file token), never its secret: the Authorization
header, the body and the query string are never written. Each node writes the requests it
received; a write forwarded to the leader is in the log of the node the client asked. Writes are
synchronous appends (a line, then a flush): a few microseconds each.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily

from ..core import limits as core_limits
from ..core import schedule
from . import limits

log = logging.getLogger("raftsched.audit")

#: The reasons a request is refused before any token is accepted (audit-refused.jsonl).
REFUSED_REASONS = ("unauthenticated", "throttled")


def bound(v, n: int = limits.audit_field_chars_max):
    """``v`` in at most ``n`` characters: cut, the last one a marker (``…``)."""
    if isinstance(v, str) and len(v) > n:
        return v[:n - 1] + "…"
    return v


class _Jsonl:
    """Appends JSON lines to ``path``, rotating it when it grows past ``max_bytes`` into
    ``path.1`` (the newest) ... ``path.keep``. Never raises: a full disk must not turn a
    request into a 500 (``failed`` counts the lines lost, logged once in a while)."""

    def __init__(self, path: str, max_bytes: int, keep: int) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
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

    def write(self, rec: dict) -> None:
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


class _TopCounts:
    """Counts of at most ``n`` distinct keys (the first seen); the others count under ``other``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counts: dict[str, int] = {}

    def add(self, key: str | None) -> None:
        if key is None:
            return
        if key not in self.counts and len(self.counts) >= self.n:
            key = "other"
        self.counts[key] = self.counts.get(key, 0) + 1

    def view(self) -> dict[str, int]:
        return dict(sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class _Summary:
    status: int | None
    first_ms: int
    last_ms: int
    count: int = 0
    routes: _TopCounts = field(default_factory=lambda: _TopCounts(limits.audit_refused_keys_max))
    tokens: _TopCounts = field(default_factory=lambda: _TopCounts(limits.audit_refused_keys_max))
    agents: _TopCounts = field(default_factory=lambda: _TopCounts(limits.audit_refused_agents_max))


class AuditLog:
    """The node's audit log (module docstring): ``record`` for requests with a valid token,
    ``refused`` for those without one, ``flush`` (called by ``run`` every few seconds, and by
    ``close``) to write the summaries of an interval that has ended.

    :param path: the log of requests with a token (created under the node's umask, 077); the
        refused requests' summaries go beside it (``audit-refused.jsonl`` for ``audit.jsonl``).
    :param max_bytes: the size past which ``path`` is rotated; ``keep`` rotated files kept.
    """

    def __init__(self, path: str, node_id: str, *, max_bytes: int = limits.audit_file_bytes_max,
                 keep: int = limits.audit_files_kept, refused_path: str | None = None,
                 refused_max_bytes: int = limits.audit_refused_file_bytes_max,
                 refused_keep: int = limits.audit_refused_files_kept,
                 interval_ms: int = limits.audit_refused_interval_s * 1000,
                 sources_max: int = limits.audit_refused_sources_max) -> None:
        self.path = path
        self.node_id = node_id
        self._main = _Jsonl(path, max_bytes, keep)
        base, ext = os.path.splitext(path)
        self.refused_path = refused_path or f"{base}-refused{ext or '.jsonl'}"
        self._refused = _Jsonl(self.refused_path, refused_max_bytes, refused_keep)
        self.interval_ms = interval_ms
        self.sources_max = sources_max
        #: (reason, source) -> the current interval's summary
        self._window: dict[tuple[str, str], _Summary] = {}
        self._window_start: int | None = None
        #: requests refused without a token, by reason (the metric)
        self.refused_requests: collections.Counter[str] = collections.Counter()

    @property
    def written(self) -> int:
        return self._main.written

    @property
    def failed(self) -> int:
        return self._main.failed + self._refused.failed

    def record(self, *, now_ms: int, source: str | None, token: str | None, role: str | None,
               method: str, route: str, target: dict, status: int | None, auth: str,
               request_id: str | None, agent: str | None = None) -> None:
        """Append the record of one request whose token was valid. Never raises."""
        rec = {"ts": schedule.iso(now_ms), "node": self.node_id, "source": bound(source), "token": bound(token),
               "role": role, "method": bound(method, 16), "route": bound(route),
               "target": {bound(str(k)): bound(str(v)) for k, v in list(target.items())[:8]},
               "status": status, "auth": auth, "request_id": bound(request_id, core_limits.request_id_chars_max),
               "agent": bound(agent, limits.audit_agent_chars_max)}
        self._main.write(rec)
        self.flush(now_ms)

    def refused(self, *, now_ms: int, reason: str, source: str | None, token: str | None, method: str,
                route: str, status: int | None, agent: str | None = None) -> None:
        """Count one request refused before a token was accepted (``reason``, one of
        REFUSED_REASONS) in its source's summary of the current interval. Never raises."""
        self.refused_requests[reason] += 1
        self.flush(now_ms)
        if self._window_start is None:
            self._window_start = now_ms
        src = bound(source or "?", 64)
        key = (reason, src)
        s = self._window.get(key)
        if s is None:
            if len(self._window) >= self.sources_max:
                key = (reason, "other")
                s = self._window.get(key)
            if s is None:
                s = self._window[key] = _Summary(status, now_ms, now_ms)
        s.count += 1
        s.last_ms = max(s.last_ms, now_ms)
        s.routes.add(f"{bound(method, 16)} {bound(route)}")
        s.tokens.add(bound(token, 64))
        s.agents.add(bound(agent, limits.audit_agent_chars_max) if agent else None)

    def flush(self, now_ms: int, force: bool = False) -> int:
        """Write the summaries of the current interval if it has ended (or ``force``); returns
        how many were written."""
        if self._window_start is None or (not force and now_ms < self._window_start + self.interval_ms):
            return 0
        window, self._window, self._window_start = self._window, {}, None
        for (reason, source), s in window.items():
            self._refused.write({
                "ts": schedule.iso(now_ms), "node": self.node_id, "kind": "refused", "reason": reason,
                "status": s.status, "source": source, "count": s.count, "first": schedule.iso(s.first_ms),
                "last": schedule.iso(s.last_ms), "routes": s.routes.view(), "tokens": s.tokens.view(),
                "agents": s.agents.view()})
        return len(window)

    async def run(self, clock) -> None:
        """Flush ended intervals every few seconds, until cancelled (the node's ``audit`` loop),
        so that a burst's summary is written without waiting for the next refused request."""
        while True:
            await asyncio.sleep(limits.audit_flush_poll_s)
            self.flush(clock.now_ms())

    def close(self, now_ms: int | None = None) -> None:
        """Write what the current interval counted, and close the files."""
        if self._window_start is not None:
            self.flush(now_ms if now_ms is not None else self._window_start, force=True)
        self._main.close()
        self._refused.close()

    def collector(self) -> "AuditCollector":
        return AuditCollector(self)


class AuditCollector:
    """The audit log's metrics (``GET /metrics``): records written, requests refused without a
    token by reason (counted, not recorded one by one), and records lost (a full disk)."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    def collect(self):
        a = self.audit
        yield CounterMetricFamily("raftsched_audit_records", "records written to audit.jsonl (requests with a "
                                  "valid token)", value=a.written)
        c = CounterMetricFamily("raftsched_audit_refused_requests", "requests refused before a token was accepted, "
                                "counted in audit-refused.jsonl's summaries", labels=["reason"])
        for reason in REFUSED_REASONS:
            c.add_metric([reason], a.refused_requests.get(reason, 0))
        yield c
        yield CounterMetricFamily("raftsched_audit_records_lost", "audit records that could not be written",
                                  value=a.failed)


class RedactBadRequests(logging.Filter):
    """aiohttp logs a request its HTTP parser refuses with the parser's error, which quotes the
    offending line as it came: an ``Authorization`` header with a stray character in it would put
    the caller's token into the node's log. This filter (on the ``aiohttp.server`` logger) keeps
    the line and the error's class and status, and drops the quote. Installed by run_node.

    aiohttp logs it at ERROR (but a first request's bad method, at DEBUG): a client's malformed
    request is the client's fault, not the node's, and is logged at INFO here, as the API's own
    400s are (an error in a node's log is something for its operator to act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        from aiohttp.http_exceptions import HttpProcessingError
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} {exc.code} (the request is not shown: it may hold a token)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            if exc.code < 500 and record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
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
