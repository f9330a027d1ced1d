"""Per-tenant rate limits: a token bucket per tenant, checked when runs are handed out
(DESIGN.md section 5).

Integer arithmetic only, so every replica agrees exactly: a bucket holds micro-tokens, a rate is
tokens per 1000 s, and it is refilled from the command's ``now``. A tenant without a limit takes
what it is given.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import InvalidCommand, NotFound
from .model import is_name
from .records import Result, is_int

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: Micro-tokens in one token.
_MICRO = 1_000_000


def apply_put_tenant(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_tenant {name, rate_milli, burst}``: set a tenant's rate (tokens per 1000 s) and
    burst (the bucket's size). A new bucket starts full; a changed one keeps its tokens (at
    most the new burst) and its refill time.

    :raises InvalidCommand: no name, a negative rate or a burst under 1."""
    name, rate, burst = cmd.get("name"), cmd.get("rate_milli"), cmd.get("burst")
    if not is_name(name) or not is_int(rate) or not is_int(burst) or rate < 0 or burst < 1:
        raise InvalidCommand("put_tenant needs name, rate_milli >= 0, burst >= 1")
    old = s.tenants.get(name)
    s.tenants[name] = {"rate_milli": rate, "burst": burst,
                       "tokens_micro": min(old["tokens_micro"], burst * _MICRO) if old else burst * _MICRO,
                       "last_ms": old["last_ms"] if old else now}
    return {"ok": True, "tenant": name}


def apply_delete_tenant(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``delete_tenant {name}``: the tenant has no rate limit any more.

    :raises NotFound: it had none."""
    name: Any = cmd.get("name")  # unchecked, as ever: a value that names no tenant is NotFound
    if s.tenants.pop(name, None) is None:
        raise NotFound(f"no tenant {name!r} has a rate limit", field="name")
    return {"ok": True, "tenant": name, "deleted": True}


def tenant_take(s: SchedulerState, tenant: str, now: int) -> bool:
    """Take one token from the tenant's bucket, refilled from ``now``. Integer arithmetic:
    micro-tokens, and rates in tokens per 1000 s, so every replica agrees exactly."""
    t = s.tenants.get(tenant)
    if t is None:
        return True
    elapsed = max(0, now - t["last_ms"])
    t["tokens_micro"] = min(t["burst"] * _MICRO, t["tokens_micro"] + elapsed * t["rate_milli"])
    t["last_ms"] = max(t["last_ms"], now)
    if t["tokens_micro"] >= _MICRO:
        t["tokens_micro"] -= _MICRO
        return True
    return False
