"""Events: the replicated outbox that notifications are delivered from (docs/notifications.md).

An event is appended by the same apply that makes the state change it reports (a run dead, a slot
recorded missed, a deadline judged), so a fail-over can neither lose one nor invent one: the event
exists exactly when the change does, on every replica. Delivery (by the leader, outside apply)
reads the outbox from a committed cursor per sink.

Pure and deterministic like the rest of the core: ``emit`` reads no clock (``now`` is the command's)
and its ids come from a replicated counter, so replicas hold byte-identical outboxes.

The outbox is bounded (``limits.outbox_events_max``): the oldest events give way first. Each event
is a flat record:

- ``event_id``: ``"ev-<seq>"``, ``seq`` the outbox's only-increasing counter (unique for the life of
  the cluster; the delivery's idempotency key);
- ``seq``, ``kind`` (one of ``KINDS``), ``at`` (the command's ``now``, ms);
- ``job``, ``tenant``, ``slot``, ``run_id``, ``attempt``, ``reason`` (None where the kind has none);
- what the kind needs besides, in ``detail`` (a map).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from . import limits, snapshot
from .records import Record

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
)
_KIND_SET = frozenset(KINDS)

#: The fields every event has, in this order (the snapshot writes them as a row).
FIELDS = ("seq", "kind", "at", "job", "tenant", "slot", "run_id", "attempt", "reason", "detail")


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


def event_id(seq: int) -> str:
    return f"ev-{seq}"


def emit(s: SchedulerState, kind: str, now: int, *, job: str | None = None, tenant: str | None = None,
         slot: int | None = None, run_id: str | None = None, attempt: int | None = None,
         reason: str | None = None, **detail: Any) -> Record:
    """Append one event to the outbox (inside an apply, beside the change it reports) and return
    it. Values must be plain msgpack data. :raises ValueError: an unknown kind (a bug in the caller,
    which apply refuses as a value)."""
    if kind not in _KIND_SET:
        raise ValueError(f"unknown event kind {kind!r}")
    box: Outbox = s.outbox
    box.seq += 1
    ev: Record = {"seq": box.seq, "kind": kind, "at": now, "job": job, "tenant": tenant, "slot": slot,
                  "run_id": run_id, "attempt": attempt, "reason": reason, "detail": dict(detail)}
    box.events.append(ev)
    while len(box.events) > limits.outbox_events_max:
        box.events.popleft()
    return ev


def view(ev: Record) -> Record:
    """An event as the API and the sinks show it (its documented JSON body)."""
    out = {"event_id": event_id(ev["seq"])}
    out.update((k, ev[k]) for k in FIELDS if k != "detail")
    out.update(ev["detail"])
    return out


# ------------------------------------------------------------------ snapshot section
def _encode(box: Outbox) -> list[Any] | None:
    if box.seq == 0:
        return None
    return [box.seq, [[ev[f] for f in FIELDS] for ev in box.events]]


def _decode(data: list[Any]) -> Outbox:
    box = Outbox()
    box.seq = int(data[0])
    box.events.extend(dict(zip(FIELDS, row)) for row in data[1])
    return box


EXTENSION = snapshot.register(snapshot.Extension(name="outbox", new=Outbox, encode=_encode, decode=_decode))
