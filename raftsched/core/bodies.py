"""Request bodies other than a job spec's: the bodies of ``PUT /v1/queues/{name}``, ``PUT
/v1/tenants/{name}`` and ``POST /v1/locks/{name}/...``, each validated on the proposer and turned
into its command's fields (the job spec is core/model.py's). :raises InvalidSpec: naming the field.
"""
from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from . import limits
from .errors import InvalidSpec
from .model import check_name


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
    """``{"max_depth"?, "on_full"?}`` -> the put_queue command's ``{"max_depth", "on_full"}``.

    :raises InvalidSpec: naming the field."""
    check_name(name, "queue", limits.queue_name_chars_max)
    b = check_body(body, {"max_depth", "on_full"})
    depth = _int_only(b.get("max_depth", limits.queue_depth_default), "max_depth", 1, limits.queue_depth_max)
    on_full = b.get("on_full", "reject")
    if on_full not in ("reject", "drop_oldest"):
        raise InvalidSpec("must be reject or drop_oldest", field="on_full")
    return {"max_depth": depth, "on_full": on_full}


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
    t = b.get("token")
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t < 2**63:
        raise InvalidSpec("is required: the fencing token acquire returned", field="token")
    return t


def validate_lock_acquire(name: object, body: object) -> dict[str, Any]:
    """``{"owner", "ttl_s"}`` -> the lock_acquire command's ``{"owner", "ttl"}`` (ttl in ms).

    :raises InvalidSpec: naming the field."""
    b = _lock_body(name, body, {"owner", "ttl_s"})
    owner = b.get("owner")
    n = limits.lock_owner_chars_max
    if not isinstance(owner, str) or not owner or len(owner) > n:
        raise InvalidSpec(f"is required: a string of 1-{n} characters naming the holder", field="owner")
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
