"""The worker fleet in the replicated state: the registry of workers, placement, release.

Every process that leases runs is a **worker**: the embedded worker of a node (``kind``
``embedded``) or a ``raftsched worker`` process outside the Raft quorum (``remote``), which talks
to any node over the API (docs/workers.md). Each registers with a ``worker_hello`` carrying its
facts (labels, slots, executors, queues, version, process instance); the registry
(``s.workers``, a snapshot section of its own) keeps them with when it was first and last seen,
whether it is ``active`` or ``draining``, and how many leases it was granted, lost and gave
back, and how many outcomes it reported that were accepted.

Time is state time only, as everywhere in the core: ``last_seen`` is the ``now`` of the last
command that named the worker (its hello, an acquire, a heartbeat, a completion, a release) or
that a node proposed for the workers connected to it (``workers_seen``, one command per node per
interval, so that a thousand idle long-polling workers cost a few small commands, not a
heartbeat each). Whether a worker is **gone** is judged at read time from ``last_seen``
(``is_gone``: unseen for ``limits.worker_gone_ms``); a worker gone for
``limits.worker_forget_ms`` is forgotten by a ``forget_workers`` command of the leader.

**Placement.** A job may ask for worker labels (``spec.placement.labels``, model.py); a run of
it is granted only to a worker whose registered labels include every one of them
(``placement.placement_ok``, I18). An unregistered worker has no labels, so it takes only runs without
placement. A draining worker is granted nothing.

**Dedicated workers.** A worker may be dedicated to some of its labels (the fact ``dedicated``:
their names): it is then granted only runs whose job's placement names each of them (and so,
by the rule above, with its values). ``raftsched worker --app NAME`` is dedicated to its label
``raftsched.app=NAME``, so it takes the app's jobs (placed on that label by the App) and nothing
else: not another app's, and not a job without placement, which any other worker may take. A
record holds ``dedicated`` only when it is not empty, so a registry without dedicated workers
snapshots to the bytes it did before they existed.

**Tenants.** A worker whose token is limited to tenants (core/tokens.py) is granted only runs of
those tenants: the node puts the token's tenants in every ``acquire`` it proposes for the worker
(leases.py: the command decides, whatever the registry says), and in its hello, so the registry
shows them (the fact ``tenants``, held only when not None) and the reads of which runs no worker
may take count them (worker_queries.py).

**Handlers.** A worker may say which python targets it has handlers for (the fact ``targets``,
held only when not None: ``raftsched worker --app`` sends its app's): it is then granted a python
run only when its job's target is one of them (leases.py), so that during a rolling deploy a
worker of the app's older version never takes a run of a job only the newer one declares. A
worker that says none takes any.

**Release.** A worker may give leases back (``release``, when it drains): the run is queued
again at once with attempt + 1, and the attempt is recorded as released by that worker; it
spends neither the job's ``max_attempts`` nor the lost-lease budget (I19).

Every handler validates every field before it changes anything (I3); the registry is bounded
by ``limits.workers_max``: a hello of a new worker when it is full evicts the worker unseen the
longest if that one is gone, and is refused (``LimitExceeded``) otherwise.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import deadlines, limits, snapshot
from .errors import InvalidCommand, InvalidSpec, LimitExceeded, NotFound
from .leases import close_attempt, live, outside, tenants_field
from .model import EXECUTOR_TYPES, NAME_RE, TARGET_RE
from .placement import validate_worker_labels
from .queues import add_dead, enqueue
from .records import Record, Result, is_int, ok

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

WORKER_KINDS = ("embedded", "remote")
#: a worker's registry state; ``gone`` is not one of them: it is derived at read time
WORKER_STATES = ("active", "draining")
#: what a worker id may hold: a host name, a node id, a slash and a pid, an address...
WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]*")
#: the labels of a worker that has none (and of an unregistered one)
NO_LABELS: dict[str, str] = {}
#: a record's facts: what its worker says of itself in a hello (the rest is the registry's)
FACTS = ("kind", "labels", "slots", "executors", "queues", "version", "instance")
#: a fact a hello may leave out, held by a record only when it is not empty (after the others)
DEDICATED = "dedicated"
#: a fact a hello may leave out, held by a record only when it is not None (after ``dedicated``):
#: the tenants the worker's token is limited to
TENANTS = "tenants"
#: a fact a hello may leave out, held by a record only when it is not None (after ``tenants``): the
#: python targets the worker has handlers for (None: any)
TARGETS = "targets"


# ------------------------------------------------------------------ validation (node and apply)
def check_worker_id(v: object, field: str = "worker") -> str:
    """:raises InvalidSpec: not a worker id."""
    if not isinstance(v, str) or not v:
        raise InvalidSpec("must be a non-empty string", field=field)
    if len(v) > limits.worker_id_chars_max:
        raise InvalidSpec(f"is longer than {limits.worker_id_chars_max} characters", field=field)
    if not WORKER_ID_RE.fullmatch(v):
        raise InvalidSpec("may contain only ASCII letters, digits and . _ : @ / + -, and must start with a letter "
                          "or digit", field=field)
    return v


def check_labels(v: object, field: str = "labels") -> dict[str, str]:
    """A worker's labels, names in order (placement.validate_worker_labels: the rule placements
    follow too). :raises InvalidSpec: naming the label."""
    return validate_worker_labels(v, field)


def check_dedicated(v: object, labels: dict[str, str], field: str = "dedicated") -> list[str]:
    """The names of the worker's labels it is dedicated to, sorted, without repeats ([] for
    None): each must be one of ``labels`` (checked already). :raises InvalidSpec:"""
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(k, str) for k in v):
        raise InvalidSpec("must be a list of names of the worker's labels", field=field)
    names = sorted(set(v))
    for k in names:
        if k not in labels:
            raise InvalidSpec(f"names {k[:80]!r}, which is not one of the worker's labels", field=field)
    return names


def check_tenants(v: object, field: str = "tenants") -> list[str] | None:
    """Tenant names, sorted, without repeats, or None (every tenant). :raises InvalidSpec:"""
    return _names_or_none(v, field, limits.token_tenants_max, limits.tenant_name_chars_max, "every tenant", "tenant")


def check_targets(v: object, field: str = "targets") -> list[str] | None:
    """Python targets (``module:function``), sorted, without repeats, or None (any).
    :raises InvalidSpec:"""
    if v is None:
        return None
    if not isinstance(v, list) or not v or len(v) > limits.worker_targets_max:
        raise InvalidSpec(f"must be null (any target) or a list of 1-{limits.worker_targets_max} python targets",
                          field=field)
    for t in v:
        if not isinstance(t, str) or len(t) > limits.worker_target_chars_max or not TARGET_RE.fullmatch(t):
            raise InvalidSpec(f"python targets are module:function, at most {limits.worker_target_chars_max} "
                              "characters", field=field)
    return sorted(set(v))


def check_executors(v: object, field: str = "executors") -> list[str]:
    """Executor types, sorted, without repeats. :raises InvalidSpec:"""
    if not isinstance(v, list) or not v or not all(isinstance(t, str) for t in v):
        raise InvalidSpec(f"must be a non-empty list of executor types ({', '.join(EXECUTOR_TYPES)})", field=field)
    bad = sorted(set(v) - set(EXECUTOR_TYPES))
    if bad:
        raise InvalidSpec(f"unknown executor type(s) {', '.join(bad)}; choose from {', '.join(EXECUTOR_TYPES)}",
                          field=field)
    return sorted(set(v))


def check_queues(v: object, field: str = "queues") -> list[str] | None:
    """Queue names, sorted, without repeats, or None (every queue). :raises InvalidSpec:"""
    return _names_or_none(v, field, limits.worker_queues_max, limits.queue_name_chars_max, "every queue", "queue")


def _names_or_none(v: object, field: str, max_n: int, chars: int, none_means: str, what: str) -> list[str] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v or len(v) > max_n:
        raise InvalidSpec(f"must be null ({none_means}) or a list of 1-{max_n} {what} names", field=field)
    for q in v:
        if not isinstance(q, str) or not q or len(q) > chars or not NAME_RE.fullmatch(q):
            raise InvalidSpec(f"{what} names are 1-{chars} letters, digits, '.', '_' or '-'", field=field)
    return sorted(set(v))


def _short_text(v: object, field: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limits.worker_version_chars_max:
        raise InvalidSpec(f"must be a string of at most {limits.worker_version_chars_max} characters", field=field)
    return v


def check_facts(cmd: Command) -> dict[str, Any]:
    """The facts of a hello (``FACTS``), normalised. :raises InvalidSpec: naming the field."""
    kind = cmd.get("kind")
    if kind not in WORKER_KINDS:
        raise InvalidSpec(f"must be one of {', '.join(WORKER_KINDS)}", field="kind")
    slots = cmd.get("slots")
    if not is_int(slots) or not 0 <= slots <= limits.worker_slots_max:
        raise InvalidSpec(f"must be an integer between 0 and {limits.worker_slots_max}", field="slots")
    labels = check_labels(cmd.get("labels", {}))
    return {"kind": kind, "labels": labels, "slots": slots,
            "executors": check_executors(cmd.get("executors")), "queues": check_queues(cmd.get("queues")),
            "version": _short_text(cmd.get("version"), "version"),
            "instance": _short_text(cmd.get("instance"), "instance"),
            DEDICATED: check_dedicated(cmd.get(DEDICATED), labels), TENANTS: check_tenants(cmd.get(TENANTS)),
            TARGETS: check_targets(cmd.get(TARGETS))}


def _as_command_error(op: str, e: InvalidSpec) -> InvalidCommand:
    return InvalidCommand(f"{op}.{e.field}: {e.message}" if e.field else f"{op}: {e.message}")


# ------------------------------------------------------------------ pure helpers
def is_gone(w: Record, now_ms: int) -> bool:
    """Whether worker record ``w`` is gone at ``now_ms``: unseen for ``limits.worker_gone_ms``."""
    seen: int = w["last_seen"]
    return now_ms - seen > limits.worker_gone_ms


def share_targets(table: dict[tuple[str, ...], list[str]], targets: list[str]) -> list[str]:
    """``targets``, or an equal list another worker's record holds already (``table``: the
    state's, or a restore's): the workers of one app version say the same list, up to 128 names
    (~9 KB a worker unshared: 137 MiB a replica at 10 000 workers, 11 MiB shared). Never changed
    in place (a hello replaces it). The table starts again from empty at
    ``limits.shared_target_lists_max`` lists, so lists no worker says any more do not stay for
    good. Invisible in the bytes."""
    key = tuple(targets)
    shared = table.get(key)
    if shared is None:
        if len(table) >= limits.shared_target_lists_max:
            table.clear()
        shared = table[key] = targets
    return shared


def touch(s: SchedulerState, worker: object, now: int) -> Record | None:
    """Note that a command named ``worker`` at state time ``now``; its record, or None when it
    is not registered (then nothing changes)."""
    w = s.workers.get(worker) if isinstance(worker, str) else None
    if w is not None and now > w["last_seen"]:
        w["last_seen"] = now
    return w


def _record(facts: dict[str, Any], now: int) -> Record:
    """A new registry record, its fields always in this order (the snapshot writes them so);
    ``dedicated``, ``tenants`` and ``targets`` last, and only when not empty."""
    rec = {"kind": facts["kind"], "labels": facts["labels"], "slots": facts["slots"],
           "executors": facts["executors"], "queues": facts["queues"], "version": facts["version"],
           "instance": facts["instance"], "first_seen": now, "last_seen": now, "state": "active",
           "grants": 0, "losses": 0, "releases": 0, "completed": 0}
    if facts[DEDICATED]:
        rec[DEDICATED] = facts[DEDICATED]
    if facts[TENANTS] is not None:
        rec[TENANTS] = facts[TENANTS]
    if facts[TARGETS] is not None:
        rec[TARGETS] = facts[TARGETS]
    return rec


def _pairs(cmd: Command, key: str, op: str, max_items: int,
           second: Callable[[object], bool] = is_int) -> list[list[Any]]:
    items = cmd.get(key)
    if not isinstance(items, list) or len(items) > max_items:
        raise InvalidCommand(f"{op} needs a list {key} of at most {max_items} items")
    for it in items:
        if not (isinstance(it, list) and len(it) == 2 and isinstance(it[0], str) and second(it[1])):
            raise InvalidCommand(f"{op}.{key} items are [id, integer]")
    return items


# ------------------------------------------------------------------ handlers
def apply_worker_hello(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``worker_hello {worker, kind, labels, slots, executors, queues, version?, instance?,
    dedicated?, tenants?, targets?}``: register a worker or update its facts (idempotent: the same facts again change only
    ``last_seen``). A hello from another process ``instance`` than the record's makes a
    draining worker active again: a drain applies to the process that was asked, not to the
    next one started under its id. When the registry is full, a new worker evicts the one
    unseen the longest if that one is gone.

    :raises InvalidCommand: a field missing or malformed. :raises LimitExceeded: the registry
        holds ``limits.workers_max`` workers and none of them is gone."""
    try:
        worker = check_worker_id(cmd.get("worker"))
        facts = check_facts(cmd)
    except InvalidSpec as e:
        raise _as_command_error("worker_hello", e) from None
    if facts[TARGETS] is not None:  # (the same list object for every worker of an app version)
        facts[TARGETS] = share_targets(s._target_lists, facts[TARGETS])
    reg = s.workers
    w = reg.get(worker)
    if w is None:
        if len(reg) >= limits.workers_max:
            oldest = min(reg.items(), key=lambda kv: (kv[1]["last_seen"], kv[0]))
            if not is_gone(oldest[1], now):
                raise LimitExceeded(f"the cluster holds {limits.workers_max} workers and none is gone; "
                                    "forget or drain some, or reuse worker ids", field="worker")
            del reg[oldest[0]]
        reg[worker] = _record(facts, now)
        return ok(worker=worker, created=True, changed=True, state="active")
    changed = (any(w[k] != facts[k] for k in FACTS) or w.get(DEDICATED, []) != facts[DEDICATED]
               or w.get(TENANTS) != facts[TENANTS] or w.get(TARGETS) != facts[TARGETS])
    if facts["instance"] != w["instance"] and w["state"] == "draining":
        w["state"] = "active"
        changed = True
    for k in FACTS:
        w[k] = facts[k]
    # The optional facts go last, in _record's order, whatever the record held before.
    w.pop(DEDICATED, None)
    w.pop(TENANTS, None)
    w.pop(TARGETS, None)
    if facts[DEDICATED]:
        w[DEDICATED] = facts[DEDICATED]
    if facts[TENANTS] is not None:
        w[TENANTS] = facts[TENANTS]
    if facts[TARGETS] is not None:
        w[TARGETS] = facts[TARGETS]
    if now > w["last_seen"]:
        w["last_seen"] = now
    return ok(worker=worker, created=False, changed=changed, state=w["state"])


def apply_workers_seen(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``workers_seen {node, workers: [id, ...]}``: the workers that contacted ``node`` in its
    last interval (long-polling, heartbeating): each registered one is seen at ``now``; the
    others are listed as ``unknown`` (they say hello with their next lease request).

    :raises InvalidCommand: no node, or not a list of at most workers_seen_ids_max ids."""
    node, ids = cmd.get("node"), cmd.get("workers")
    if not isinstance(node, str) or not isinstance(ids, list) or len(ids) > limits.workers_seen_ids_max \
            or not all(isinstance(i, str) for i in ids):
        raise InvalidCommand(f"workers_seen needs node and a list of at most {limits.workers_seen_ids_max} worker ids")
    reg, unknown, seen = s.workers, [], 0
    for i in ids:
        w = reg.get(i)
        if w is None:
            unknown.append(i)
            continue
        if now > w["last_seen"]:
            w["last_seen"] = now
        seen += 1
    return ok(seen=seen, unknown=unknown)


def apply_drain_worker(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``drain_worker {worker}``: the worker is granted nothing from now on, and hears
    ``draining`` in the answers to its lease requests and heartbeats: it lets its runs finish
    (up to its drain time), gives the rest back (``release``) and stops.

    :raises InvalidCommand: no worker id. :raises NotFound: no such worker."""
    worker = cmd.get("worker")
    if not isinstance(worker, str):
        raise InvalidCommand("drain_worker needs worker")
    w = s.workers.get(worker)
    if w is None:
        raise NotFound(f"no worker {worker!r}", field="worker")
    was = w["state"]
    w["state"] = "draining"
    if was != "draining":
        s.stats.drains += 1
    return ok(worker=worker, state="draining", changed=was != "draining")


def apply_forget_workers(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``forget_workers {workers: [[id, last_seen], ...]}``: the leader's clean-up of workers
    gone for ``limits.worker_forget_ms``. An item is applied only if the worker was not seen
    since (its ``last_seen`` is still the one named) and it is that long gone at ``now``; the
    others are counted as ``ignored``. Its runs keep its name in their records.

    :raises InvalidCommand: not a list of at most forget_workers_max ``[id, last_seen]``."""
    items = _pairs(cmd, "workers", "forget_workers", limits.forget_workers_max)
    reg, forgotten, ignored = s.workers, [], 0
    for wid, seen in items:
        w = reg.get(wid)
        if w is None or w["last_seen"] != seen or now - seen <= limits.worker_forget_ms:
            ignored += 1
            continue
        del reg[wid]
        forgotten.append(wid)
    return ok(forgotten=forgotten, ignored=ignored)


def apply_release(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``release {worker, leases: [[run_id, token], ...], reason?, tenants?}``: the worker gives leases
    back (it drains, or its lease request's answer could not be delivered). Each run it still
    holds with that token is queued again at once (due now) with attempt + 1; the attempt is
    recorded as released by the worker, and counts neither as a failure (``max_attempts``) nor
    as a lost lease (``lease_losses_max``): I19. A run whose job was deleted meanwhile, or
    became a heartbeat job (no worker runs those), is dead. A run of a job with ``late_start:
    skip`` given back ``not_started`` (its worker never began it, its attempt recorded
    ``unstarted``) at or past its start deadline (its grant's ``start_by``: a worker held it for a
    slot that did not free in time) is withdrawn instead (core/cancel.py withdraw_late).
    The others are listed as ``lost`` (not the worker's any more) and change nothing; with
    ``tenants``, so is a lease of a run of another tenant (I23).

    :raises InvalidCommand: no worker, more than heartbeat_leases_max leases, a malformed
        lease, or a reason that is not a short string."""
    worker = cmd.get("worker")
    if not isinstance(worker, str):
        raise InvalidCommand("release needs worker")
    leases = _pairs(cmd, "leases", "release", limits.heartbeat_leases_max)
    reason = cmd.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > limits.attempt_error_chars_max - 64):
        raise InvalidCommand("release.reason must be a short string")
    only = tenants_field(cmd, "release")
    w = touch(s, worker, now)
    released, lost = [], []
    why = f"released by worker {worker}" + (f": {reason}" if reason else "")
    unstarted = cmd.get("not_started") is True
    for rid, tok in leases:
        run = live(s, rid, tok)
        if run is None or run["worker"] != worker or outside(run, only):
            lost.append(rid)
            continue
        close_attempt(s, run, now, False, why, run.get("output"))
        run["attempts"][-1]["released"] = True
        if unstarted:
            run["attempts"][-1]["unstarted"] = True
        if w is not None:
            w["releases"] += 1
        job = s.jobs.get(run["job"])
        if job is None or job["spec"]["executor"]["type"] == "heartbeat":  # no worker would run it again
            run["state"] = "dead"
            s.stats.on_finished("dead")
            add_dead(s, run, now)
        else:
            start_by = deadlines.late_start_by(job["spec"], run) if unstarted and "deadline" in job["spec"] else None
            run["worker"] = None
            if start_by is not None and start_by <= now:
                # late_start skip: given back unstarted at or past its start deadline (a worker held
                # it for a slot that did not free in time): withdrawn, not queued again
                told = deadlines.judge_late_given_back(s, rid, now)
                deadlines.withdraw_late(s, run, now, tell=not told, queued=False)
            else:
                run["attempt"] += 1
                run["state"] = "queued"
                run["due"] = now
                enqueue(s, run)
        released.append(rid)
    return ok(released=released, lost=lost)


# ------------------------------------------------------------------ the snapshot section
def _encode(reg: dict[str, Record]) -> list[list[Any]] | None:
    """The registry as ``[[id, record], ...]`` by id (None when empty: a state without workers
    snapshots to exactly the bytes it did before there were workers)."""
    return [[wid, reg[wid]] for wid in sorted(reg)] or None


def _decode(data: list[list[Any]]) -> dict[str, Record]:
    # Equal targets lists restored as one object, as apply_worker_hello shares them.
    lists: dict[tuple[str, ...], list[str]] = {}
    for _wid, rec in data:
        t = rec.get(TARGETS)
        if type(t) is list and all(type(x) is str for x in t):
            rec[TARGETS] = share_targets(lists, t)
    return {wid: rec if "completed" in rec else _with_completed(rec) for wid, rec in data}


def _with_completed(rec: Record) -> Record:
    """A record of a dump written before the registry counted outcomes (``completed``, added
    2026-12-01): the field, at 0, in its place (complete_many adds to it)."""
    out: Record = {}
    for k, v in rec.items():
        out[k] = v
        if k == "releases":
            out["completed"] = 0
    out.setdefault("completed", 0)
    return out


EXTENSION = snapshot.register(snapshot.Extension(name="workers", new=dict, encode=_encode, decode=_decode))
