"""Tenants: a rate limit and a policy each (docs/security.md, "Tenant policy").

Rate limits: a token bucket per tenant, checked when runs are handed out (DESIGN.md section 5).
Integer arithmetic only, so every replica agrees exactly: a bucket holds micro-tokens, a rate is
tokens per 1000 s, and it is refilled from the command's ``now``. A tenant without a limit takes
what it is given.

Policies (the snapshot section ``tenant_policies``): which executor types a tenant's jobs may
use, the placement labels they must ask for, and the networks their http runs may reach beyond
the public ones (core/network.py). Records: tenant -> ``{"executors": [type, ...] sorted,
"labels": {name: value} sorted, "allow": [network, ...]}``. A policy an admin set holds every
job of its tenant, whoever wrote it; a tenant without one holds only the jobs a token limited to
tenants wrote (their stored spec says ``limited: true``) to ``DEFAULT_POLICY``: http only,
public addresses only. The proposer checks a job against it when it is written (node/tenancy.py);
``acquire`` checks it again when a run is handed out, so a policy narrowed after a job was
written is never run around: the run is recorded skipped, reason ``policy``, with the rule it
broke as its error (``refusal``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import limits, records, snapshot
from .errors import InvalidCommand, LimitExceeded, NotFound
from .model import EXECUTOR_TYPES, is_name
from .records import Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: Micro-tokens in one token.
_MICRO = 1_000_000
#: The highest rate a tenant may have, in tokens per 1000 s (the API's rate_per_s bound).
_RATE_MILLI_MAX = round(limits.tenant_rate_per_s_max * 1000)


def apply_put_tenant(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_tenant {name, rate_milli, burst}``: set a tenant's rate (tokens per 1000 s) and
    burst (the bucket's size). A new bucket starts full; a changed one keeps its tokens (at
    most the new burst) and its refill time.

    :raises InvalidCommand: no name, a rate or a burst out of the API's bounds."""
    name, rate, burst = cmd.get("name"), cmd.get("rate_milli"), cmd.get("burst")
    if not is_name(name) or not is_int(rate) or not is_int(burst) or not 0 <= rate <= _RATE_MILLI_MAX \
            or not 1 <= burst <= limits.tenant_burst_max:
        raise InvalidCommand(f"put_tenant needs name, 0 <= rate_milli <= {_RATE_MILLI_MAX}, "
                             f"1 <= burst <= {limits.tenant_burst_max}")
    old = s.tenants.get(name)
    s.tenants[name] = {"rate_milli": rate, "burst": burst,
                       "tokens_micro": min(old["tokens_micro"], burst * _MICRO) if old else burst * _MICRO,
                       "last_ms": old["last_ms"] if old else now}
    return {"ok": True, "tenant": name}


def apply_delete_tenant(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``delete_tenant {name}``: the tenant has no rate limit, no policy and no default routes
    any more (its jobs written by tokens limited to tenants are held to ``DEFAULT_POLICY``
    again; its jobs without ``notify`` are told through no route). Before 2026-12-06 (evening)
    it left the default routes (core/notify.py's ``tenant_notify``) in place.

    :raises NotFound: it had none of them."""
    name: Any = cmd.get("name")  # unchecked, as ever: a value that names no tenant is NotFound
    if not isinstance(name, str):
        raise NotFound(f"no tenant {name!r} has a rate limit, a policy or default routes", field="name")
    had_limit = s.tenants.pop(name, None) is not None
    had_policy = s.tenant_policies.pop(name, None) is not None
    had_notify = s.tenant_notify.pop(name, None) is not None
    if not (had_limit or had_policy or had_notify):
        raise NotFound(f"no tenant {name!r} has a rate limit, a policy or default routes", field="name")
    out: Result = {"ok": True, "tenant": name, "deleted": True}
    if had_policy:  # only then: a result without it keeps the bytes it always had
        out["policy_deleted"] = True
    if had_notify:
        out["notify_deleted"] = True
    return out


# ------------------------------------------------------------------ policies
#: The stored spec key of a job written by a token limited to tenants (node/tenancy.py): such a
#: job is held to its tenant's policy even when the tenant has none (then to DEFAULT_POLICY), and
#: its own ``notify`` routes reach only its tenant's sinks (events.route).
LIMITED = records.LIMITED
#: The policy of a tenant no admin gave one, for the jobs tokens limited to tenants write: http
#: only, any placement, public addresses only (never changed).
DEFAULT_POLICY: Record = {"executors": ["http"], "labels": {}, "allow": []}


def _check_policy(cmd: Command) -> Record:
    """The policy a put_tenant_policy carries, its shape checked. :raises InvalidCommand:"""
    executors, labels, allow = cmd.get("executors"), cmd.get("labels"), cmd.get("allow")
    if not isinstance(executors, list) or not all(t in EXECUTOR_TYPES for t in executors) \
            or len(set(executors)) != len(executors):
        raise InvalidCommand(f"put_tenant_policy.executors must be distinct types of {', '.join(EXECUTOR_TYPES)}")
    if not isinstance(labels, dict) or len(labels) > limits.worker_labels_max \
            or not all(type(k) is str and type(v) is str for k, v in labels.items()):
        raise InvalidCommand("put_tenant_policy.labels must be a map of label names to values")
    if not isinstance(allow, list) or len(allow) > limits.tenant_network_allow_max \
            or not all(type(a) is str for a in allow):
        raise InvalidCommand("put_tenant_policy.allow must be a list of networks")
    return {"executors": sorted(executors), "labels": {k: labels[k] for k in sorted(labels)},
            "allow": list(allow)}


def apply_put_tenant_policy(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``put_tenant_policy {name, executors, labels, allow}``: set a tenant's policy (all of it:
    node/service.py fills in what the request left out). ``allow``'s networks are validated by
    the proposer (core/network.py); apply stores the strings.

    :raises InvalidCommand: a field missing or malformed.
    :raises LimitExceeded: a new policy beyond tenant_policies_max."""
    name = cmd.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidCommand("put_tenant_policy needs name")
    pol = _check_policy(cmd)
    if name not in s.tenant_policies and len(s.tenant_policies) >= limits.tenant_policies_max:
        raise LimitExceeded(f"the cluster holds {limits.tenant_policies_max} tenant policies, its limit",
                            field="name")
    created = name not in s.tenant_policies
    s.tenant_policies[name] = pol
    return ok(tenant=name, created=created)


def policy_of(s: SchedulerState, spec: Record) -> Record | None:
    """The policy that holds a job of ``spec``: its tenant's, else DEFAULT_POLICY when a token
    limited to tenants wrote it, else None (nothing holds it)."""
    tenant = spec.get("tenant")
    pol = s.tenant_policies.get(tenant) if type(tenant) is str else None
    if pol is not None:
        return pol
    return DEFAULT_POLICY if spec.get(LIMITED) is True else None


def refusal(pol: Record, spec: Record) -> tuple[str, str] | None:
    """``(field, why)`` when a job of ``spec`` breaks policy ``pol`` (its executor type is not
    allowed, or its placement does not ask for every label the policy requires), else None."""
    tenant = spec.get("tenant")
    ex = spec.get("executor")
    t = ex.get("type") if type(ex) is dict else None
    if t == "heartbeat":
        return None  # runs nothing and reaches nothing: no policy has anything to hold back
    if t not in pol["executors"]:
        allowed = ", ".join(pol["executors"]) or "none"
        return "executor.type", (f"the policy of tenant {tenant!r} does not allow executor type {t!r} "
                                 f"(it allows: {allowed})")
    want = pol["labels"]
    if want:
        pl = spec.get("placement")
        have = pl.get("labels") if type(pl) is dict else None
        have = have if type(have) is dict else {}
        missing = {k: v for k, v in want.items() if have.get(k) != v}
        if missing:
            need = ", ".join(f"{k}={v}" for k, v in missing.items())
            return "placement.labels", (f"the policy of tenant {tenant!r} requires placement on the labels "
                                        f"{need}, so that its runs go only to its workers")
    return None


def dispatch_refusal(s: SchedulerState, spec: Record) -> str | None:
    """Why a run of a job of ``spec`` may not be handed out (acquire), or None."""
    pol = policy_of(s, spec)
    if pol is None:
        return None
    r = refusal(pol, spec)
    return None if r is None else f"refused by policy: {r[1]}"


def network_of(s: SchedulerState, spec: Record) -> list[str] | None:
    """The networks an http run of a job of ``spec`` may reach beyond the public ones, or None
    when no policy holds it (then it may reach any address)."""
    pol = policy_of(s, spec)
    return None if pol is None else list(pol["allow"])


def _encode(policies: dict[str, Record]) -> list[list[Any]] | None:
    """Sorted by tenant, ``[name, executors, labels, allow]`` each; None when there is none (a
    state without policies snapshots to exactly the bytes it did before they existed)."""
    if not policies:
        return None
    return [[n, p["executors"], p["labels"], p["allow"]] for n, p in sorted(policies.items())]


def _decode(data: list[list[Any]]) -> dict[str, Record]:
    return {n: {"executors": e, "labels": lb, "allow": a} for n, e, lb, a in data}


EXTENSION = snapshot.register(snapshot.Extension(name="tenant_policies", new=dict, encode=_encode, decode=_decode))


def tokens_at(t: Record, now: int) -> int:
    """The micro-tokens tenant bucket ``t`` holds at ``now``, refilled up to it as
    :func:`tenant_take` would, without taking one. Pure (a read's)."""
    held: int = min(t["burst"] * _MICRO, t["tokens_micro"] + max(0, now - t["last_ms"]) * t["rate_milli"])
    return held


def token_due_ms(t: Record, now: int) -> int | None:
    """When tenant bucket ``t`` (``s.tenants``'s record) next holds a whole token, read at
    ``now`` without taking one (what :func:`tenant_take` would find): None when it holds one now,
    -1 when it never will (a rate of 0). Pure: the views' ``waiting_for`` (worker_queries)."""
    tokens = tokens_at(t, now)
    if tokens >= _MICRO:
        return None
    if t["rate_milli"] <= 0 or t["burst"] < 1:
        return -1
    at: int = max(now, t["last_ms"]) + -(-(_MICRO - tokens) // t["rate_milli"])
    return at


def tenant_take(s: SchedulerState, tenant: str, now: int) -> bool:
    """Take one token from the tenant's bucket, refilled from ``now``. Integer arithmetic:
    micro-tokens, and rates in tokens per 1000 s, so every replica agrees exactly."""
    t = s.tenants.get(tenant)
    if t is None:
        return True
    t["tokens_micro"] = tokens_at(t, now)  # (the refill the reads see too: one formula)
    t["last_ms"] = max(t["last_ms"], now)
    if t["tokens_micro"] >= _MICRO:
        t["tokens_micro"] -= _MICRO
        return True
    return False
