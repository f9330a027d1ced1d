"""Typed errors. Each carries the HTTP status it maps to and whether its outcome is definite.

``definite=False`` means the command may still apply (Jepsen's ``:info``): a client should retry with
the same request id, which the state machine deduplicates.
"""
from __future__ import annotations


class RaftschedError(Exception):
    http_status = 500
    code = "internal"
    definite = True

    def __init__(self, message: str, field: str | None = None, **extra):
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra

    def to_dict(self) -> dict:
        body = {"code": self.code, "message": self.message, "field": self.field}
        body.update(self.extra)
        return body

    @classmethod
    def from_dict(cls, d: dict) -> "RaftschedError":
        code = d.get("code")
        klass = _BY_CODE.get(code, RaftschedError)
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
    fired ahead meanwhile): refused, changing nothing; sending it again plans from a newer view."""


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


_BY_CODE = {
    k.code: k
    for k in (
        BadRequest, Unauthorized, NotFound, Conflict, InvalidSpec, InvalidCommand,
        LimitExceeded, Unavailable, Indeterminate, Forbidden, TooManyRequests,
    )
}
