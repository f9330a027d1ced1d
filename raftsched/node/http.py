"""What every HTTP handler of the node shares: the application's and the request's keys, and
the request helpers (JSON bodies, request ids, query parameters), each raising ``BadRequest``
naming the field. api.py, auth.py and tenancy.py import them from here, never from each other.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..core import limits, schedule
from ..core.bodies import json_loads
from ..core.errors import BadRequest, InvalidSpec, RequestTimeout
from ..core.model import RUN_STATES, check_label_key, check_label_value, check_name
from ..core.records import CLIENT_KEY_PREFIX, WORKER_KEY_PREFIX
from . import limits as node_limits

#: The application's parts (make_app sets them). An app without the node's loops (tests)
#: leaves TRIGGER, WORKER, METRICS and AUDIT unset.
SERVICE = web.AppKey("service")
TOKEN = web.AppKey("token", str)
TRIGGER = web.AppKey("trigger")
WORKER = web.AppKey("worker")
METRICS = web.AppKey("metrics")
BACKFILLS = web.AppKey("backfills")
#: The worker fleet's side of this node (node/fleet.py): the worker protocol and /v1/workers.
FLEET = web.AppKey("fleet")
#: Who may call what (node/auth.py), and where mutations are recorded (node/audit.py).
AUTH = web.AppKey("auth")
AUDIT = web.AppKey("audit")
#: The route table the app was built from (node/routes.py): (method, route) -> Route.
ROUTE_TABLE = web.AppKey("route_table")

#: Request keys: the principal of an authenticated request, and the token id a refused one
#: claimed (for the audit log; only when it has the shape of an id).
PRINCIPAL = web.RequestKey("principal")
CLAIMED = web.RequestKey("claimed_token", str)
#: Set by a handler whose request changed nothing (a lease long-poll answered with no runs and no
#: registration): not an audit record, however its route is classed (node/api.py record_audit).
UNCHANGED = web.RequestKey("unchanged", bool)
#: Set by a handler of a request that only asked what it would do (``"dry_run": true``): its audit
#: record's target says so (an auditor told a batch's dry run from its apply by nothing).
DRY_RUN = web.RequestKey("dry_run", bool)


def dumps(value: Any) -> str:
    """The JSON text of an answer. orjson's (compact, UTF-8 as it is): the lease answer of 32
    grants encodes in ~10 us where json takes ~110 (docs/benchmarks.md, "A run, measured").
    What orjson refuses (an integer past 64 bits, a key that is not a string) goes to json as
    before. One difference: a float NaN or infinity is null where json wrote the non-JSON
    ``NaN``; none reaches an answer (payloads and run results are refused with one: model.py,
    fleet.py), and the text differs otherwise only in spacing and in non-ASCII characters
    written as UTF-8 rather than escaped, the same values either way."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value)


def json_response(data: Any = None, *, status: int = 200, reason: str | None = None,
                  headers: Any = None, content_type: str = "application/json") -> web.Response:
    """``aiohttp.web.json_response`` with :func:`dumps`: every JSON answer of the node."""
    return web.json_response(data, status=status, reason=reason, headers=headers, content_type=content_type,
                             dumps=dumps)


def tenants_of(request: web.Request) -> frozenset | None:
    """The tenants the request's token is limited to, or None (every tenant)."""
    p = request.get(PRINCIPAL)
    return None if p is None else p.tenants


class ClientGone(Exception):
    """The client closed its connection before its request's body had arrived: there is no one
    to answer, and nothing was done (api.py errors_middleware logs it at debug, not as an error
    of the node)."""


async def read_body(request: web.Request) -> bytes:
    """The request's body, whole, as every handler reads it (aiohttp keeps it: a second call
    returns it again).

    :raises RequestTimeout: it did not arrive within node_limits.request_body_s (408).
    :raises BadRequest: its framing is broken (a bad chunk of a chunked body).
    :raises ClientGone: the connection was lost while it arrived.
    A body larger than the request's client_max_size raises aiohttp's 413 as before."""
    try:
        async with asyncio.timeout(node_limits.request_body_s):
            return await request.read()
    except TimeoutError:
        sent = "" if request.content_length is None else f" (Content-Length: {request.content_length})"
        raise RequestTimeout(f"the request body did not arrive whole{sent} within "
                             f"{node_limits.request_body_s:g} s; nothing was done") from None
    except (web.RequestPayloadError, HttpProcessingError) as e:
        raise BadRequest(f"malformed request body: {e}") from None
    except ConnectionError as e:  # aiohttp's ConnectionResetError("Connection lost") among them
        raise ClientGone(f"the client closed the connection before its body arrived ({e!r})") from None


async def json_body(request: web.Request, strict: bool = True):
    """The request's JSON body. ``strict``: an object naming a key twice is refused (400, the key
    named: core.bodies.json_loads); the worker protocol's routes read theirs without it."""
    raw = await read_body(request)
    if not raw:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        doc = json_loads(raw, keys_once=strict)
    except BadRequest:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    if _SURROGATE_ESCAPE_RE.search(raw):  # (a pair decodes to one character; only then look)
        where = _lone_surrogate(doc, "")
        if where is not None:
            raise InvalidSpec("holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair): not text "
                              "that can be stored or sent on", field=where or None)
    return doc


#: A JSON escape of a UTF-16 surrogate: JSON may pair two into one character, or hold one alone,
#: which Python keeps as a str that no UTF-8 encoder takes (storing, signing or sending it fails).
_SURROGATE_ESCAPE_RE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(v: Any, path: str) -> str | None:
    """The field (``a.b[2]``) of ``v`` holding a string with a lone surrogate, or None."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            name = k.encode("utf-8", "backslashreplace").decode() if isinstance(k, str) else str(k)
            sub = f"{path}.{name}" if path else name  # (the field, printable: it is sent back)
            if _lone_surrogate(k, sub) is not None:
                return sub
            found = _lone_surrogate(x, sub)
            if found is not None:
                return found
    elif isinstance(v, list):
        for i, x in enumerate(v):
            found = _lone_surrogate(x, f"{path}[{i}]")
            if found is not None:
                return found
    return None


async def optional_json_body(request: web.Request, default=None):
    """The JSON body, or ``default`` when the request has none (or only white space, as a route
    that takes no body reads it). A body of JSON ``null`` is not "none": it is refused (422) like
    any other body that is not an object."""
    if not (await read_body(request)).strip():
        return default
    body = await json_body(request)
    if body is None:
        raise InvalidSpec("the body must be a JSON object (or no body at all)", field=None)
    return body


def client_key(request: web.Request) -> str | None:
    """The client's request id (its ``Idempotency-Key``) or None.

    ``X-Request-Id`` is not one: proxies and service meshes make one up per incoming request and
    pass it on to every call made while serving it, so two different mutations would carry the
    same one, and the second would be answered as the first's retry without being applied. It is
    only recorded in the audit log (api.py)."""
    r = request.headers.get("Idempotency-Key")
    if r is not None and (not r or len(r) > limits.request_id_chars_max):
        raise BadRequest(f"Idempotency-Key must be 1-{limits.request_id_chars_max} characters", field="Idempotency-Key")
    return r


#: An integer query parameter: ASCII digits, perhaps a minus, and no more digits than any bound
#: has (int() would also take "1_000", " 5" and other scripts' digits, and 4 300 digits of work).
_INT_PARAM_RE = re.compile(r"-?[0-9]{1,18}")


def rid(request: web.Request) -> str | None:
    """The request id a command carries: the client's key scoped to its token (scope_key), or None."""
    return scope_key(request, client_key(request))


def scope_key(request: web.Request, key: str | None) -> str | None:
    """``key`` as the principal of ``request`` owns it: keys are the token's, so another token's
    request with the same key is another request (neither replays nor conflicts with it), and
    no answer tells one token what another used a key for. A hash of the token id and the key,
    as long as any key may be; a worker token's starts ``w-``, any other's ``k-``: the state
    remembers each kind apart (records.RequestLog), so a fleet's completions never push a
    client's key out."""
    p = request.get(PRINCIPAL)
    if key is None or p is None:
        return key
    h = hashlib.blake2b(f"{p.id}\0{key}".encode("utf-8", "backslashreplace"), digest_size=16)
    return (WORKER_KEY_PREFIX if p.role == "worker" else CLIENT_KEY_PREFIX) + h.hexdigest()


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int, why: str | None = None) -> int:
    """An integer query parameter in ``[lo, hi]``; ``why``: what the bound is, said after it in
    the message. :raises BadRequest: naming ``name``."""
    text = request.query.get(name)
    if text is None:
        return default
    because = "" if why is None else f" ({why})"
    if not _INT_PARAM_RE.fullmatch(text):
        raise BadRequest(f"must be an integer between {lo} and {hi}{because}", field=name)
    v = int(text)
    if not lo <= v <= hi:
        raise BadRequest(f"must be between {lo} and {hi}{because}", field=name)
    return v


def time_param(request: web.Request, name: str) -> int | None:
    """An ISO-8601 time (core.schedule.parse_iso_ms's range) as ms, or None when not given.
    :raises BadRequest: naming ``name``."""
    text = request.query.get(name)
    if text is None:
        return None
    try:
        return schedule.parse_iso_ms(text, name)
    except InvalidSpec as e:
        msg = e.message
        offset = re.search(r" (\d\d(:?\d\d)?)\Z", text)
        if offset is not None:
            # A query string's + is a space (form encoding): an offset's + must be sent as %2B.
            msg += (f" (a + in a query string reads as a space: write "
                    f"{text[:offset.start()] + '%2B' + offset.group(1)!r}, or Z)")
        raise BadRequest(msg, field=name) from None


def job_param(request: web.Request, name: str = "job", max_chars: int = limits.job_name_chars_max) -> str | None:
    """A job's name (core.model.check_name; a queue's with ``max_chars``), or None when not
    given. Given empty, it is refused: a filter left empty by a script (``?job=$JOB``) must not
    read as every job. :raises BadRequest: naming ``name``."""
    text = request.query.get(name)
    if text is not None:
        try:
            check_name(text, name, max_chars)
        except InvalidSpec as e:
            raise BadRequest(e.message, field=name) from None
    return text


def queue_param(request: web.Request, name: str = "queue") -> str | None:
    """A queue's name, as job_param reads a job's. :raises BadRequest: naming ``name``."""
    return job_param(request, name, limits.queue_name_chars_max)


def bool_param(request: web.Request, name: str) -> bool:
    text = request.query.get(name, "false").lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise BadRequest("must be true or false", field=name)
    return text in ("true", "1", "yes")


def choice_param(request: web.Request, name: str, choices: tuple) -> str | None:
    v = request.query.get(name)
    if v is not None and v not in choices:
        raise BadRequest(f"must be one of {', '.join(choices)}", field=name)
    return v


def state_param(request: web.Request) -> str | None:
    return choice_param(request, "state", RUN_STATES)


def label_params(request: web.Request) -> dict:
    """``?label=KEY=VALUE``, repeatable (every one must match): the labels a job list is
    filtered on. :raises BadRequest: naming ``label``."""
    items = request.query.getall("label", [])
    if len(items) > limits.job_labels_max:
        raise BadRequest(f"at most {limits.job_labels_max} label filters", field="label")
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise InvalidSpec("must be KEY=VALUE, e.g. label=raftsched.app=billing", field="label")
            check_label_key(key, "label")
            check_label_value(value, "label")
        except InvalidSpec as e:
            raise BadRequest(e.message, field="label") from None
        if out.get(key, value) != value:
            raise BadRequest(f"label {key!r} is given twice with different values", field="label")
        out[key] = value
    return out
