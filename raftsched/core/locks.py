"""Named locks with fencing tokens (``POST /v1/locks/{name}``).

A lock is held until its holder releases it or the leader's reaper expires it (``expire``, see
leases.py): never judged from a command's clock, which may be another node's and run fast. Every
acquire takes a new token from the global fencing counter that leases use too (I13), so a
downstream system can reject a holder that lost the lock.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import limits
from .errors import Conflict, InvalidCommand
from .model import is_name
from .records import Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState


def _lock_args(cmd: Command, need_owner: bool) -> tuple[str, int | None]:
    name, ttl = cmd.get("name"), cmd.get("ttl")
    if not is_name(name):
        raise InvalidCommand("lock command needs name")
    if need_owner and (not isinstance(cmd.get("owner"), str) or not cmd["owner"]):
        raise InvalidCommand("lock_acquire needs owner")
    if ttl is not None and (not is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max):
        raise InvalidCommand("lock ttl out of range")
    return name, ttl


def apply_lock_acquire(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``lock_acquire {name, owner, ttl, tenants?}``: take a free lock for ``ttl`` ms, with a new
    fencing token; ``tenants``: those of the token limited to them that took it (kept with it).

    :raises InvalidCommand: no name, no owner, or a ttl out of the lease range.
    :raises Conflict: the lock is held (the error names its holder and deadline), or the
        cluster holds ``limits.locks_max`` locks."""
    name, ttl = _lock_args(cmd, True)
    if ttl is None:
        raise InvalidCommand("lock_acquire needs ttl")
    lk = s.locks.get(name)
    if lk is not None:
        # Held until its holder releases it or the leader's reaper expires it: never judged
        # from this command's clock, which may be another node's and run fast.
        raise Conflict(f"lock {name!r} is held by {lk['owner']!r}", field="name",
                       holder=lk["owner"], expires_at_ms=lk["deadline"])
    if len(s.locks) >= limits.locks_max:  # (a new lock: a held one was refused above)
        raise Conflict(f"the cluster holds {limits.locks_max} locks, its limit", field="name")
    tenants = _tenants(cmd)
    if tenants is not None:
        full = next((t for t in tenants if s._lock_tenants.get(t, 0) >= limits.locks_per_tenant_max), None)
        if full is not None:
            raise Conflict(f"tenant {full!r} holds {limits.locks_per_tenant_max} locks, a tenant's limit: release "
                           "some", field="name")
        count_tenants(s, tenants, 1)
    s.fencing_token += 1
    s.locks[name] = {"owner": cmd["owner"], "token": s.fencing_token, "deadline": now + ttl,
                     "ttl": ttl, "since": now, "renewals": 0}
    if tenants is not None:
        # Taken by a token limited to these tenants: only such a token (or one of every tenant)
        # renews or releases it (node/service.py lock_renew), whoever learnt its token.
        s.locks[name]["tenants"] = tenants
    return {"ok": True, "lock": name, "owner": cmd["owner"], "token": s.fencing_token, "deadline": now + ttl}


def count_tenants(s: SchedulerState, tenants: Any, d: int) -> None:
    """Count a lock of ``tenants`` (a lock's, or None) taken (``d`` 1) or gone (-1) in each of
    them (``SchedulerState._lock_tenants``, derived: queues.rebuild_indexes)."""
    if tenants:
        counts = s._lock_tenants
        for t in tenants:
            n = counts.get(t, 0) + d
            if n > 0:
                counts[t] = n
            else:
                counts.pop(t, None)


def _tenants(cmd: Command) -> list[str] | None:
    """A lock command's ``tenants``: those of the token limited to them that sent it, or nil."""
    tenants = cmd.get("tenants")
    if tenants is not None and (not isinstance(tenants, list) or not tenants
                                or not all(isinstance(t, str) and t for t in tenants) or tenants != sorted(set(tenants))):
        raise InvalidCommand(f"{cmd.get('op')}.tenants must be a sorted list of tenant names or nil")
    return tenants


def _held(s: SchedulerState, cmd: Command, now: int) -> tuple[str, Record]:
    """The lock the command's token holds. A command of a token limited to tenants holds only a
    lock a token of those tenants took (its ``tenants``): the token alone is shown to every
    reader, and the node's own check reads a replica that may lag."""
    name, _ = _lock_args(cmd, False)
    tok = cmd.get("token")
    lk = s.locks.get(name)
    tenants = _tenants(cmd)
    foreign = tenants is not None and lk is not None and not set(lk.get("tenants") or ("\0",)) <= set(tenants)
    if lk is None or foreign or not is_int(tok) or lk["token"] != tok:  # (another's: as a wrong token)
        raise Conflict(f"token {tok} does not hold lock {name!r}", field="token",
                       holder=lk["owner"] if lk else None,
                       expires_at_ms=lk["deadline"] if lk else None)
    return name, lk


def apply_lock_renew(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``lock_renew {name, token, ttl?}``: the held lock's deadline moves to ``now + ttl``;
    without a ttl, by the one it had. A shorter ttl brings the deadline in: the leader expires a
    lock ``ttl`` after its last renewal, whatever the deadline said, and a deadline kept at the
    older, later one told its holder it had 58 s it did not have (a user's walk).

    :raises Conflict: ``token`` does not hold the lock (released, expired or taken again)."""
    name, lk = _held(s, cmd, now)
    ttl = cmd.get("ttl") or lk["ttl"]
    lk["deadline"] = now + ttl
    lk["ttl"] = ttl
    lk["renewals"] = lk.get("renewals", 0) + 1
    return {"ok": True, "lock": name, "token": lk["token"], "deadline": lk["deadline"]}


def apply_lock_release(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``lock_release {name, token}``: free the lock.

    :raises Conflict: ``token`` does not hold the lock."""
    name, lk = _held(s, cmd, now)
    del s.locks[name]
    count_tenants(s, lk.get("tenants"), -1)
    return {"ok": True, "lock": name, "released": True}


# ------------------------------------------------------------------ the fencing counter's floor
#: The highest value ``fencing_floor`` takes: 2^52, half the largest integer a JSON reader in a
#: double holds exactly (a downstream in JavaScript compares tokens as numbers), so that the grants
#: after it stay exact for 4.5e15 more.
FENCING_MAX = 2**52


def apply_fencing_floor(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``fencing_floor {at_least}``: the counter becomes ``at_least`` when it is below it (the
    next grant gets ``at_least + 1``), else stays. An operator's, after a cluster was restored
    from copies of its data directories: the copy's counter is below what was granted since, and
    those tokens would be granted again (docs/fencing.md). It only ever raises the counter (I13).

    :raises InvalidCommand: ``at_least`` not an integer of 1..FENCING_MAX."""
    at_least = cmd.get("at_least")
    if not is_int(at_least) or not 1 <= at_least <= FENCING_MAX:
        raise InvalidCommand(f"fencing_floor.at_least must be an integer of 1..{FENCING_MAX}")
    raised = at_least > s.fencing_token
    if raised:
        s.fencing_token = at_least
    return ok(fencing_token=s.fencing_token, raised=raised)
