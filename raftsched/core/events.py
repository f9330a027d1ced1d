"""Events: the replicated outbox that notifications are delivered from (docs/notifications.md).

An event is appended by the same apply that makes the state change it reports (a run dead, a slot
recorded missed, a deadline judged), so a fail-over can neither lose one nor invent one: the event
exists exactly when the change does, on every replica. Delivery (by the leader, outside apply)
reads the outbox from a committed cursor per sink.

Pure and deterministic like the rest of the core: ``emit`` reads no clock (``now`` is the command's)
and its ids come from a replicated counter, so replicas hold byte-identical outboxes.

Only what some sink will be sent is kept (``route``): an event no route or subscription names is
not appended, so a sweep that records a million slots missed costs nothing where nobody listens.
Routing is decided here, at apply time, from replicated state only (the sinks, the job's or its
tenant's ``notify`` routes, the job's health and its routes' noise state), so every replica keeps
the same events with the same ``to``; delivery only reads it.

The outbox is bounded (``limits.outbox_events_max``): the oldest events give way first. Each event
is a flat record:

- ``event_id``: ``"ev-<seq>"``, ``seq`` the outbox's only-increasing counter (unique for the life of
  the cluster; the delivery's idempotency key);
- ``seq``, ``kind`` (one of ``KINDS``), ``at`` (the command's ``now``, ms);
- ``job``, ``tenant``, ``slot``, ``run_id``, ``attempt``, ``reason`` (None where the kind has none);
- what the kind needs besides, in ``detail`` (a map);
- ``to``: the sinks it is for, in the order of the routes (not part of its JSON body).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from . import limits, snapshot
from .records import LIMITED, Record

if TYPE_CHECKING:  # pragma: no cover
    from .state import SchedulerState

#: Every kind of event (docs/notifications.md says what each one's ``detail`` holds).
KINDS = (
    "run.dead",              # retries spent: the run is in the dead-letter queue
    "run.failed",            # one attempt failed (opt-in)
    "run.succeeded",         # (opt-in)
    "job.recovered",         # the first success after failures
    "slot.missed",           # a slot recorded skipped, coalesced or past the catch-up limit
    "deadline.missed",
    "deadline.late",
    "run.unplaceable",       # waiting longer than a bound for a worker that matches
    "worker.lost",
    "cluster.leader_changed",
    "cluster.no_leader",     # reported by the next leader, with the gap
    "job.paused",            # manual changes are events too
    "job.resumed",
    "job.triggered",
    "run.requeued",
    "run.cancelled",         # a queued or running run ended by request (core/cancel.py)
)
_KIND_SET = frozenset(KINDS)

#: The fields every event has, in this order (the snapshot writes them as a row).
FIELDS = ("seq", "kind", "at", "job", "tenant", "slot", "run_id", "attempt", "reason", "detail", "to")
#: What an event's JSON body shows of FIELDS (``detail`` is spread into it).
_BODY = FIELDS[:-2]
#: Kinds about the cluster, sent to the sinks that subscribe to them.
CLUSTER_KINDS = frozenset(("worker.lost", "cluster.leader_changed", "cluster.no_leader"))
#: Kinds sent even while their job is paused: the pause and the resume, the close of an
#: incident (a manual run's success while paused closes it, and nothing would tell it later), and
#: a run cancelled by request (a stuck run is often cancelled once its job is paused).
_WHILE_PAUSED = frozenset(("job.paused", "job.resumed", "job.recovered", "run.cancelled"))
#: A job's health record (core/notify.py keeps it): a list, these indexes. ``sent`` maps
#: ``"<sink>|<kind>"`` to when a route last sent that kind (noise control), or is None.
LAST_SUCCESS, LAST_FAILURE, CONSECUTIVE, LAST_SLOT, INCIDENT, SENT = range(6)


class Outbox:
    """The events not yet given up (oldest first) and the counter their ids come from."""

    __slots__ = ("seq", "events")

    def __init__(self) -> None:
        self.seq = 0
        self.events: deque[Record] = deque()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outbox) and self.seq == other.seq and list(self.events) == list(other.events)

    def first_seq(self) -> int:
        """The seq of the oldest event held (seq + 1 when there is none)."""
        return self.events[0]["seq"] if self.events else self.seq + 1


def new_health() -> list[Any]:
    """A job's health before its first outcome (the fields above)."""
    return [None, None, 0, None, None, None]


def event_id(seq: int) -> str:
    return f"ev-{seq}"


def emit(s: SchedulerState, kind: str, now: int, *, job: str | None = None, tenant: str | None = None,
         slot: int | None = None, run_id: str | None = None, attempt: int | None = None,
         reason: str | None = None, while_paused: bool = False, **detail: Any) -> Record:
    """Append one event to the outbox (inside an apply, beside the change it reports) and return
    it, if some sink is to be sent it (``route``); else return it unkept, with ``seq`` 0 and
    ``to`` empty. ``tenant`` defaults to the job's. Values must be plain msgpack data.
    ``while_paused``: sent while its job is paused too (a ``max_since_success_s`` miss).
    :raises ValueError: an unknown kind (a bug in the caller, which apply refuses as a value)."""
    return emit_for(s, kind, now, False, job=job, tenant=tenant, slot=slot, run_id=run_id, attempt=attempt,
                    reason=reason, while_paused=while_paused, **detail)


def emit_for(s: SchedulerState, kind: str, now: int, backfill: bool, *, job: str | None = None,
             tenant: str | None = None, slot: int | None = None, run_id: str | None = None,
             attempt: int | None = None, reason: str | None = None, while_paused: bool = False,
             **detail: Any) -> Record:
    """``emit``, saying whether the event is about a backfill's run (sent only to routes that
    ask for ``backfills``)."""
    if kind not in _KIND_SET:
        raise ValueError(f"unknown event kind {kind!r}")
    if tenant is None and job is not None:
        j = s.jobs.get(job)
        if j is not None:
            tenant = j["spec"]["tenant"]
    to = route(s, kind, now, job, tenant, backfill, while_paused) if s.sinks else []
    ev: Record = {"seq": 0, "kind": kind, "at": now, "job": job, "tenant": tenant, "slot": slot,
                  "run_id": run_id, "attempt": attempt, "reason": reason, "detail": dict(detail), "to": to}
    if not to:
        return ev
    box: Outbox = s.outbox
    box.seq += 1
    ev["seq"] = box.seq
    box.events.append(ev)
    while len(box.events) > limits.outbox_events_max:
        box.events.popleft()
    return ev


def route(s: SchedulerState, kind: str, now: int, job: str | None, tenant: str | None,
          backfill: bool = False, while_paused: bool = False) -> list[str]:
    """The sinks an event is for, decided from replicated state only (every replica the same):

    - a cluster kind: the sinks whose ``subscribe`` lists it;
    - a job's kind: the job's ``notify`` routes, or, when its spec has none, its tenant's
      default routes; a route counts when its sink exists, its ``on`` lists the kind, the sink is
      not limited to another tenant (and, for a job's own routes written by a token limited to
      tenants, its spec ``limited``, is limited to the job's tenant: such a token cannot send
      into a sink for the whole cluster), and (for a backfill's run) it asks for ``backfills`` (then
      each is sent: no noise control, as they are outside the job's incidents); nothing
      while the job is paused (but the pause and the resume themselves, ``job.recovered``, and
      what is emitted ``while_paused``: a ``max_since_success_s`` miss);
    - noise control, per route and job: ``run.dead`` only once the job's consecutive failures
      reach ``after_consecutive``, once per incident, again every ``repeat_every_s`` if set;
      ``job.recovered`` only to a route that was sent the incident's ``run.dead``; any other kind
      at most every ``repeat_every_s`` when set.

    Records when each route was sent what (the job's health ``sent``), so it changes the state:
    call it only from ``emit``."""
    sinks: dict[str, Record] = s.sinks
    if kind in CLUSTER_KINDS:
        # sorted: a restored replica's map is in its snapshot's order, a live one's in creation order
        return [n for n in sorted(sinks) if kind in sinks[n]["spec"].get("subscribe", ())]
    j = s.jobs.get(job) if job is not None else None
    routes = None
    own_tenant = None  # the only sinks' tenant the routes may name (limited routes only)
    if j is not None:
        if j["paused"] and kind not in _WHILE_PAUSED and not while_paused:
            return []
        routes = j["spec"].get("notify")
        if routes is not None and j["spec"].get(LIMITED) is True:
            # Routes a token limited to tenants wrote: only its job's tenant's sinks, never a
            # sink for the whole cluster (an admin's, which that token cannot see).
            own_tenant = j["spec"]["tenant"]
    if routes is None and tenant is not None:
        routes = s.tenant_notify.get(tenant)
    if not routes:
        return []
    h = s.health.get(job) if job is not None else None
    out = []
    for r in routes:
        name = r["sink"]
        sk = sinks.get(name)
        if sk is None or kind not in r["on"]:
            continue
        limited = sk["spec"].get("tenant")
        if limited is not None and limited != tenant:
            continue
        if own_tenant is not None and limited != own_tenant:
            continue
        if backfill and not r.get("backfills"):
            continue
        # (a backfill's runs are outside the job's health and incidents: each is told)
        if not backfill:
            if h is None and r["repeat_every_s"] and j is not None:
                # Noise control needs the job's health, which a job that has only recorded
                # slots or missed deadlines has not made yet (notify.health's, made here).
                h = s.health[job] = new_health()  # type: ignore[index]
            if h is not None and not _quiet_enough(h, r, name, kind, now):
                if kind != "job.recovered" and (kind != "run.dead" or h[CONSECUTIVE] >= r["after_consecutive"]):
                    s.stats.on_held_back(kind)  # (repeat_every_s held it back: counted, not silent)
                continue
        out.append(name)
    return out


def _quiet_enough(h: list[Any], r: Record, sink: str, kind: str, now: int) -> bool:
    """Noise control for one route (``route``), recording the send in the health's ``sent``."""
    sent: dict[str, int] | None = h[SENT]
    if sent is None:  # made by the first send that needs one (a job's health costs less without)
        sent = h[SENT] = {}
    key = sink + "|" + kind
    repeat_ms = r["repeat_every_s"] * 1000
    if kind == "job.recovered":
        return (sink + "|run.dead") in sent
    last = sent.get(key)
    if kind == "run.dead":
        if h[CONSECUTIVE] < r["after_consecutive"]:
            return False
        if last is not None and (not repeat_ms or now - last < repeat_ms):
            return False
    elif repeat_ms:
        if last is not None and now - last < repeat_ms:
            return False
    else:
        return True
    sent[key] = now
    return True


def is_event(ev: object) -> bool:
    """Whether ``ev`` has an event's shape (FIELDS, as ``emit`` makes them): what ``view``, the
    dead list's reads and delivery read of one that a command carries (a sink's dead event).
    (Loose where a value is only shown, so that no event ``emit`` made is ever refused.)"""
    if not (isinstance(ev, dict) and _is_int(ev.get("seq")) and isinstance(ev.get("kind"), str)
            and ev["kind"] in _KIND_SET
            and _is_int(ev.get("at")) and all(f in ev for f in _BODY)):
        return False
    detail, to = ev.get("detail"), ev.get("to", [])
    return (isinstance(detail, dict) and all(isinstance(k, str) for k in detail)
            and isinstance(to, list) and all(isinstance(x, str) for x in to))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def view(ev: Record) -> Record:
    """An event as the API and the sinks show it (its documented JSON body)."""
    out = {"event_id": event_id(ev["seq"])}
    out.update((k, ev[k]) for k in _BODY)
    out.update(ev["detail"])
    return out


def pending(box: Outbox, after: int, sink: str, n: int) -> tuple[list[Record], int]:
    """The first ``n`` events for ``sink`` after seq ``after`` (oldest first), and the seq its
    cursor may move to once they are all handled: the last one's when ``n`` were found, else the
    last seq written. The outbox's seqs are consecutive, so the start is found by arithmetic."""
    events = box.events
    out: list[Record] = []
    if events:
        i = max(0, after + 1 - events[0]["seq"])
        while i < len(events):
            ev = events[i]
            if sink in ev["to"]:
                out.append(ev)
                if len(out) == n:
                    return out, int(ev["seq"])
            i += 1
    return out, max(after, box.seq)


# ------------------------------------------------------------------ snapshot section
def _encode(box: Outbox) -> list[Any] | None:
    if box.seq == 0:
        return None
    return [box.seq, [[ev[f] for f in FIELDS] for ev in box.events]]


def _decode(data: list[Any]) -> Outbox:
    box = Outbox()
    box.seq = int(data[0])
    for row in data[1]:
        ev = dict(zip(FIELDS, row))
        ev.setdefault("to", [])  # (an outbox written before routing)
        box.events.append(ev)
    return box


EXTENSION = snapshot.register(snapshot.Extension(name="outbox", new=Outbox, encode=_encode, decode=_decode))
