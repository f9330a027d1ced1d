"""Request bodies other than a job spec's: the bodies of ``PUT /v1/queues/{name}``, ``PUT
/v1/tenants/{name}`` and ``POST /v1/locks/{name}/...``, each validated on the proposer and turned
into its command's fields (the job spec is core/model.py's). :raises InvalidSpec: naming the field.
"""
from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from typing import Any

from . import limits, network
from .errors import BadRequest, InvalidSpec
from .model import EXECUTOR_TYPES, check_name
from .placement import validate_worker_labels
from .records import LAYOUT_CHARS, LAYOUT_CHARS_SAID


def json_loads(raw: str | bytes, keys_once: bool = True) -> Any:
    """A request body's or a spec file's JSON, refused when one object names a key twice: JSON
    leaves what that means to the reader (Python keeps the last, other parsers the first, some
    refuse), so a document read one way by the client's tooling and another by the node is
    refused, not guessed at (not checked without ``keys_once``: the worker protocol's bodies).
    An integer with more digits than Python reads (sys.get_int_max_str_digits, 4300 by default)
    is refused naming where it is, rather than with the interpreter's advice.

    :raises BadRequest: a key twice, naming it; an integer too long to read, naming its field
        (``a.b[2]``; none for a body that is that number); :raises ValueError: other malformed
        JSON (json.loads's); :raises RecursionError: nested too deeply."""
    hook = _object if keys_once else None
    try:
        return json.loads(raw, object_pairs_hook=hook)
    except BadRequest as e:
        if e.extra.get(_TWICE_KEY) is None:
            raise
        # A key twice: read again marking the object that holds it, to name its field
        # (schedule.every_s, not every_s).
        e.extra.pop(_TWICE_KEY)
        found = None
        if len(raw) <= _TWICE_PATH_BYTES_MAX:  # (a large batch's is named by its key alone: no second read)
            try:
                found = _find(json.loads(raw, object_pairs_hook=_object_marked), "", lambda x: isinstance(x, _Twice))
            except (ValueError, RecursionError):  # (malformed past it: the first read stopped at the key)
                found = None
        if found is not None and found[0] and len(found[0]) <= _PATH_CHARS_MAX:
            path, twice = found
            e.message = f"malformed JSON: the key {twice.key!r} appears twice in one object"
            e.field = f"{path}.{twice.key}"
        raise
    except ValueError:
        # Malformed, or an integer int() refuses: read again (only then: an int hook costs every
        # integer of the worker protocol's bodies) marking the integers int() refuses.
        huge: list[int] = []

        def parse_int(text: str) -> Any:
            try:
                return int(text)
            except ValueError:  # (the only way int() refuses what JSON's grammar matched)
                huge.append(len(text.lstrip("-")))
                return _HUGE

        try:
            doc = json.loads(raw, object_pairs_hook=hook, parse_int=parse_int)
        except ValueError:
            doc = None  # malformed after the number too: the number is what the first read stopped at
        if not huge:
            raise
    where = _huge_at(doc, "")
    if where is not None and len(where) > _PATH_CHARS_MAX:
        where = where[:_PATH_CHARS_MAX] + "..."
    what = {None: "a number", "": "the body is a number"}.get(where, f"{where}: a number")
    raise BadRequest(f"{what} too large: an integer of {huge[0]} digits (no field takes an integer past 64 bits, "
                     f"20 digits)", field=where or None)


#: What json_loads reads an integer too long for int() as, found afterwards to name its field.
_HUGE = object()


def _huge_at(v: Any, path: str) -> str | None:
    """The field (``a.b[2]``) of ``v`` holding _HUGE, or None."""
    found = _find(v, path, lambda x: x is _HUGE)
    return None if found is None else found[0]


def _find(v: Any, path: str, hit: Any) -> tuple[str, Any] | None:
    """The first field (``a.b[2]``) of ``v``, depth first, whose value ``hit(value)`` is true for,
    with that value; None when none."""
    if hit(v):
        return path, v
    items: Any = (v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ())
    for k, x in items:
        if isinstance(k, int):
            sub = f"{path}[{k}]"
        else:
            name = k[:64].encode("utf-8", "backslashreplace").decode()  # (sent back: printable)
            sub = f"{path}.{name}" if path else name
        found = _find(x, sub, hit)
        if found is not None:
            return found
    return None


#: Bodies up to this size whose key appears twice are read a second time to name its field's path
#: (a spec's, a page of a batch's); a larger one is named by the key alone: the second read and
#: the walk cost 3-10 times a clean read, on the event loop (a review: 3 s for 16 MB).
_TWICE_PATH_BYTES_MAX = 1 << 20
#: The longest field path an error names (deeply nested 64-character keys made 32 KB of one).
_PATH_CHARS_MAX = 256
#: BadRequest.extra's key for the key json_loads found twice (taken out before it is raised on).
_TWICE_KEY = "_twice"


def _twice(pairs: list[tuple[str, Any]]) -> str | None:
    """The first key ``pairs`` hold twice (printable, at most 64 characters), or None."""
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            return k[:64].encode("utf-8", "backslashreplace").decode()  # (sent back: printable)
        seen.add(k)
    return None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        name = _twice(pairs)
        raise BadRequest(f"malformed JSON: the key {name!r} appears twice in one object", field=name,
                         **{_TWICE_KEY: name})
    return d


class _Twice:
    """An object json_loads found a key twice in (its second read, to name the field)."""

    def __init__(self, key: str | None) -> None:
        self.key = key


def _object_marked(pairs: list[tuple[str, Any]]) -> Any:
    d = dict(pairs)
    return _Twice(_twice(pairs)) if len(d) != len(pairs) else d


def _words(body: object, field: str, n: int, others: AbstractSet[str] = frozenset()) -> str | None:
    """An optional body ``{field: text}`` -> its text (None: none given): why, in the operator's
    words, 1-``n`` characters with no control character; ``others``, the body's other fields,
    the caller's to check. :raises InvalidSpec:"""
    text = check_body(body, {field} | others, empty_ok=True).get(field)
    if text is not None and (not isinstance(text, str) or not 1 <= len(text) <= n):
        raise InvalidSpec(f"must be a string of 1-{n} characters, or null", field=field)
    if text is not None and any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in text):
        raise InvalidSpec("holds a control character such as NUL, CR, LF or NEL", field=field)
    if text is not None and not LAYOUT_CHARS.isdisjoint(text):
        raise InvalidSpec(f"holds a character that changes how the text around it reads: {LAYOUT_CHARS_SAID}",
                          field=field)
    return text


def validate_pause(body: object) -> str | None:
    """``POST /v1/jobs/{name}/pause``'s optional body -> its ``note``. :raises InvalidSpec:"""
    return _words(body, "note", limits.pause_note_chars_max)


def validate_cancel(body: object) -> str | None:
    """``POST /v1/runs/{id}/cancel``'s optional body -> its ``reason``. :raises InvalidSpec:"""
    return _words(body, "reason", limits.cancel_reason_chars_max)


def validate_cancel_job(body: object) -> tuple[str | None, bool, str | None]:
    """``POST /v1/jobs/{name}/cancel``'s optional body ``{reason?, running?, after?}`` -> (reason,
    running: the running runs too, not only the queued; after: the ``next`` of the answer
    before, a run id). :raises InvalidSpec:"""
    reason = _words(body, "reason", limits.cancel_reason_chars_max, frozenset({"running", "after"}))
    b = body if isinstance(body, dict) else {}
    running, after = b.get("running", False), b.get("after")
    if type(running) is not bool:
        raise InvalidSpec("must be true or false", field="running")
    if after is not None and not (isinstance(after, str) and 1 <= len(after) <= limits.run_id_chars_max):
        raise InvalidSpec(f"must be a run id of 1-{limits.run_id_chars_max} characters (an answer's next), or "
                          "null", field="after")
    return reason, running, after


def check_body(body: object, fields: AbstractSet[str], empty_ok: bool = False) -> dict[str, Any]:
    """``body`` if it is a JSON object holding only ``fields``. With ``empty_ok``, no body at
    all (None) is an empty one. :raises InvalidSpec: naming the first unknown field."""
    if body is None and empty_ok:
        return {}
    if not isinstance(body, dict):
        raise InvalidSpec("the body must be a JSON object", field=None)
    for k in body:
        if k not in fields:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(fields))}", field=str(k))
    return body


def _int_only(v: object, field: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (an integral float is refused: these fields never took one)."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=field)
    return v


def validate_queue(name: object, body: object) -> dict[str, Any]:
    """``{"max_depth"?, "on_full"?, "tenants"?}`` -> the put_queue command's ``{"max_depth",
    "on_full"}``, and ``"tenants"`` when the body has it: the tenants the queue belongs to
    (distinct names, sorted), or None (it belongs to none).

    :raises InvalidSpec: naming the field."""
    check_name(name, "queue", limits.queue_name_chars_max)
    b = check_body(body, {"max_depth", "on_full", "tenants"})
    depth = _int_only(b.get("max_depth", limits.queue_depth_default), "max_depth", 1, limits.queue_depth_max)
    on_full = b.get("on_full", "reject")
    if on_full not in ("reject", "drop_oldest"):
        raise InvalidSpec("must be reject or drop_oldest", field="on_full")
    out: dict[str, Any] = {"max_depth": depth, "on_full": on_full}
    if "tenants" in b:
        t = b["tenants"]
        n = limits.token_tenants_max
        if t is not None:
            if not isinstance(t, list) or not 1 <= len(t) <= n:
                raise InvalidSpec(f"must be a list of 1-{n} tenant names, or null (the queue belongs to no "
                                  "tenant)", field="tenants")
            for i, x in enumerate(t):
                check_name(x, f"tenants[{i}]", limits.tenant_name_chars_max)
            t = sorted(set(t))
        out["tenants"] = t
    return out


#: The fields of a tenant's policy in ``PUT /v1/tenants/{name}`` (core/tenants.py).
POLICY_FIELDS = frozenset({"executors", "placement", "network"})


#: Every field of ``PUT /v1/tenants/{name}``: a rate limit, a policy, default routes.
TENANT_FIELDS = frozenset({"rate_per_s", "burst", "notify"}) | POLICY_FIELDS


def validate_tenant_body(name: object, body: object) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``{"rate_per_s"?, "burst"?, "executors"?, "placement"?, "network"?}`` -> ``(rate, policy)``:
    the put_tenant command's fields (validate_tenant) when the body sets a rate, and the
    put_tenant_policy command's (validate_policy) when it holds any policy field; at least one.
    The body's ``notify`` (the tenant's default routes, which the caller validates:
    notify_model.validate_routes) is left to the caller, but named by the messages, which list
    every field of ``PUT /v1/tenants/{name}``.

    :raises InvalidSpec: naming the field."""
    check_name(name, "tenant", limits.tenant_name_chars_max)
    b = check_body(body, TENANT_FIELDS)
    has_policy = any(k in b for k in POLICY_FIELDS)
    if not has_policy and "rate_per_s" not in b:
        raise InvalidSpec("is required: runs per second this tenant may start (or send a policy: executors, "
                          "placement, network; or default routes: notify)", field="rate_per_s")
    rate = validate_tenant(name, {k: b[k] for k in ("rate_per_s", "burst") if k in b}) \
        if ("rate_per_s" in b or "burst" in b) else None
    return rate, (validate_policy(b) if has_policy else None)


def validate_policy(b: dict[str, Any]) -> dict[str, Any]:
    """A tenant's policy, whole: ``executors`` (default ``["http"]``), ``placement.labels`` (the
    labels its jobs' placement must ask for; default none) and ``network.allow`` (networks its
    http runs may reach beyond the public addresses; default none) -> the put_tenant_policy
    command's ``{"executors", "labels", "allow"}``. :raises InvalidSpec: naming the field."""
    ex = b.get("executors", ["http"])
    if not isinstance(ex, list) or not all(isinstance(t, str) for t in ex):
        raise InvalidSpec(f"must be a list of executor types ({', '.join(EXECUTOR_TYPES)})", field="executors")
    for i, t in enumerate(ex):
        if t not in EXECUTOR_TYPES:
            raise InvalidSpec(f"must be one of {', '.join(EXECUTOR_TYPES)}", field=f"executors[{i}]")
    if len(set(ex)) != len(ex):
        raise InvalidSpec("names a type twice", field="executors")
    labels: dict[str, str] = {}
    if "placement" in b:
        p = b["placement"]
        if not isinstance(p, dict):
            raise InvalidSpec("must be an object: {\"labels\": {name: value}}", field="placement")
        for k in p:
            if k != "labels":
                raise InvalidSpec("unknown field; allowed: labels", field=f"placement.{k}")
        if "labels" not in p:
            raise InvalidSpec("is required: the labels its jobs' placement must ask for, e.g. "
                              "{\"tenant\": \"billing\"}", field="placement.labels")
        labels = validate_worker_labels(p["labels"], "placement.labels")
    allow: list[str] = []
    if "network" in b:
        n = b["network"]
        if not isinstance(n, dict):
            raise InvalidSpec("must be an object: {\"allow\": [networks]}", field="network")
        for k in n:
            if k != "allow":
                raise InvalidSpec("unknown field; allowed: allow", field=f"network.{k}")
        allow = network.check_allow(n.get("allow", []), "network.allow")
    return {"executors": sorted(ex), "labels": labels, "allow": allow}


def validate_tenant(name: object, body: object) -> dict[str, Any]:
    """``{"rate_per_s", "burst"?}`` -> the put_tenant command's ``{"rate_milli", "burst"}``: the
    rate in tokens per 1000 s, the burst by default the rate (at least 1).

    :raises InvalidSpec: naming the field."""
    check_name(name, "tenant", limits.tenant_name_chars_max)
    b = check_body(body, {"rate_per_s", "burst"})
    if "rate_per_s" not in b:
        raise InvalidSpec("is required: runs per second this tenant may start", field="rate_per_s")
    rate = b["rate_per_s"]
    lo, hi = limits.tenant_rate_per_s_min, limits.tenant_rate_per_s_max
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not lo <= rate <= hi:
        raise InvalidSpec(f"must be a number between {lo:g} and {hi:g}", field="rate_per_s")
    burst = _int_only(b.get("burst", max(1, int(rate))), "burst", 1, limits.tenant_burst_max)
    return {"rate_milli": round(rate * 1000), "burst": burst}


def _lock_body(name: object, body: object, fields: AbstractSet[str]) -> dict[str, Any]:
    check_name(name, "name", limits.lock_name_chars_max)
    return check_body(body, fields)


def _lock_ttl_ms(b: dict[str, Any], required: bool) -> int | None:
    if "ttl_s" not in b:
        if required:
            raise InvalidSpec("is required: seconds the lock is held without a renew", field="ttl_s")
        return None
    v = b["ttl_s"]
    lo, hi = limits.lease_ttl_ms_min / 1000, limits.lease_ttl_ms_max / 1000
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise InvalidSpec(f"must be a number of seconds between {lo:g} and {hi:g}", field="ttl_s")
    return int(v * 1000)


def _lock_token(b: dict[str, Any]) -> int:
    if "token" not in b:
        raise InvalidSpec("is required: the fencing token acquire returned", field="token")
    t = b["token"]
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t < 2**63:
        raise InvalidSpec("must be the fencing token acquire returned: an integer from 1 to 2**63 - 1",
                          field="token")
    return t


def validate_lock_acquire(name: object, body: object) -> dict[str, Any]:
    """``{"owner", "ttl_s"}`` -> the lock_acquire command's ``{"owner", "ttl"}`` (ttl in ms).

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"owner", "ttl_s"})
    owner = b.get("owner")
    n = limits.lock_owner_chars_max
    if not isinstance(owner, str) or not owner or len(owner) > n:
        said = "is required" if owner is None else "must be"  # (given, but not one)
        raise InvalidSpec(f"{said}: a string of 1-{n} characters naming the holder", field="owner")
    return {"owner": owner, "ttl": _lock_ttl_ms(b, True)}


def validate_lock_renew(name: object, body: object) -> dict[str, Any]:
    """``{"token", "ttl_s"?}`` -> the lock_renew command's ``{"token", "ttl"}`` (ttl in ms, or
    None: the lock's own).

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"token", "ttl_s"})
    return {"token": _lock_token(b), "ttl": _lock_ttl_ms(b, False)}


def validate_lock_release(name: object, body: object) -> dict[str, Any]:
    """``{"token"}`` -> the lock_release command's ``{"token"}``.

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"token"})
    return {"token": _lock_token(b)}


def validate_fencing_floor(body: object) -> int:
    """``POST /v1/cluster/fencing``'s ``{"at_least": N}`` -> N. :raises InvalidSpec:"""
    from .locks import FENCING_MAX
    b = check_body(body, {"at_least"})
    if "at_least" not in b:
        raise InvalidSpec("is required: the fencing counter's new floor (the next token granted is above it)",
                          field="at_least")
    return _int_only(b["at_least"], "at_least", 1, FENCING_MAX)
