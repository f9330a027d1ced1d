"""Typed errors. Each carries the HTTP status it maps to and whether its outcome is definite.

``definite=False`` means the command may still apply (Jepsen's ``:info``): a client should retry with
the same request id, which the state machine deduplicates.
"""
from __future__ import annotations

from typing import Any


class RaftschedError(Exception):
    http_status = 500
    code = "internal"
    definite = True

    def __init__(self, message: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra

    def to_dict(self) -> dict[str, Any]:
        body = {"code": self.code, "message": self.message, "field": self.field}
        body.update(self.extra)
        return body

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RaftschedError:
        code = d.get("code")
        # An answer's code is whatever the other side sent: one that is not a string (a list
        # is not even hashable) is an unknown code, not a TypeError.
        klass: type[RaftschedError] = _BY_CODE.get(code, RaftschedError) if isinstance(code, str) else RaftschedError
        extra = {k: v for k, v in d.items() if k not in ("code", "message", "field")}
        return klass(d.get("message", ""), d.get("field"), **extra)


class BadRequest(RaftschedError, ValueError):
    http_status = 400
    code = "bad_request"


class Unauthorized(RaftschedError):
    http_status = 401
    code = "unauthorized"


class Forbidden(RaftschedError):
    """A valid token without the scope an operation needs (``scope`` names it), or limited to
    tenants the operation is outside of (``tenant`` names it)."""

    http_status = 403
    code = "forbidden"


class RequestTimeout(RaftschedError):
    """A request whose body did not arrive whole within the node's bound for it (a client that
    sent less than its Content-Length, or stalled): refused, changing nothing."""

    http_status = 408
    code = "request_timeout"


class TooManyRequests(RaftschedError):
    """Too many refused tokens from one source: it is slowed down (Retry-After)."""

    http_status = 429
    code = "too_many_requests"


class NotFound(RaftschedError, LookupError):
    http_status = 404
    code = "not_found"


class Conflict(RaftschedError):
    http_status = 409
    code = "conflict"


class StaleReplace(Conflict):
    """A replace of a job's schedule planned from a view older than the job's cursor (the job
    fired ahead meanwhile): refused, changing nothing; sending it again plans from a newer view.
    Its answer says ``"stale": true`` (a Conflict by its code: the node plans it again)."""


class InvalidSpec(RaftschedError, ValueError):
    http_status = 422
    code = "invalid"


class InvalidCommand(RaftschedError, ValueError):
    """A command that cannot be decoded or names no known operation: refused as a value."""

    http_status = 422
    code = "invalid_command"


class LimitExceeded(RaftschedError):
    http_status = 422
    code = "limit_exceeded"


class Unavailable(RaftschedError):
    """No leader, queue full: the command definitely did not happen. Retry later."""

    http_status = 503
    code = "unavailable"


class Indeterminate(RaftschedError):
    """Timeout or leader change: the command may still apply. Retry with the same request id."""

    http_status = 504
    code = "indeterminate"
    definite = False


_BY_CODE: dict[str, type[RaftschedError]] = {
    k.code: k
    for k in (
        BadRequest, Unauthorized, NotFound, Conflict, InvalidSpec, InvalidCommand,
        LimitExceeded, Unavailable, Indeterminate, Forbidden, TooManyRequests, RequestTimeout,
    )
}
