"""Secrets at rest, as the replicated state sees them (docs/security.md, "Secrets at rest").

A job's secret values (its executor's ``headers`` and ``env``, its ``secrets``) are sealed by the
node that proposes the write (raftsched/sealing.py) and stored as opaque bytes: the state never
holds a key, never seals and never unseals. A value stored as a string is one in clear, from a
journal written before sealing; it is read as it is until a ``reseal`` seals it.

What the state does hold is which key new values are sealed under (the snapshot section
``"seal"``: ``{"key": id}``), so that every proposer seals under the same one, and the ``reseal``
command that moves stored values to that key (``raftsched secrets rotate-key``): the proposer
unseals and seals them again, and the command carries the new bytes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import limits, snapshot
from .errors import InvalidCommand
from .records import Record, Result, is_int, ok, share_spec

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: The maps of a spec that hold secrets, as a reseal item names them, and their paths.
MAP_PATHS: dict[str, tuple[str, ...]] = {
    "headers": ("executor", "headers"), "env": ("executor", "env"), "secrets": ("secrets",),
}


def _spec_map(spec: Record, name: str) -> Any:
    path = MAP_PATHS[name]
    return spec["executor"].get(path[1]) if len(path) == 2 else spec.get(path[0])


def _check_items(items: object) -> list[tuple[str, int, dict[str, dict[str, bytes]]]]:
    if not isinstance(items, list) or len(items) > limits.reseal_jobs_max:
        raise InvalidCommand(f"reseal.jobs must be a list of at most {limits.reseal_jobs_max} items")
    out = []
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and is_int(item[1])
                and isinstance(item[2], dict) and item[2]):
            raise InvalidCommand(f"reseal.jobs[{i}] must be [name, gen, {{map: {{name: sealed}}}}]")
        for m, vals in item[2].items():
            if m not in MAP_PATHS or not isinstance(vals, dict) or not vals \
                    or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in vals.items()):
                raise InvalidCommand(f"reseal.jobs[{i}] holds a malformed map {m!r}")
        out.append((item[0], item[1], item[2]))
    return out


def apply_reseal(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``reseal {key, jobs: [[name, gen, {"secrets"|"env"|"headers": {name: sealed}}], ...]}``:
    new values are sealed under ``key`` from now on, and each item's values replace the job's
    values of those names, if the job still has generation ``gen`` and holds every name given
    (else the item is ``stale``: the job changed since the proposer read it; its new values
    were sealed by their own proposer). Nothing else of the job changes: not its generation,
    not its ``updated`` time. ``jobs`` may be empty: the command then only names the key.

    :raises InvalidCommand: a key that is not 1-16 characters, or an item malformed (checked
        before anything changes)."""
    key = cmd.get("key")
    if not isinstance(key, str) or not 1 <= len(key) <= limits.seal_key_id_chars_max:
        raise InvalidCommand(f"reseal.key must be a key id of 1-{limits.seal_key_id_chars_max} characters")
    items = _check_items(cmd.get("jobs"))
    resealed = 0
    stale: list[str] = []
    for name, gen, maps in items:
        job = s.jobs.get(name)
        if job is None or job["gen"] != gen:
            stale.append(name)
            continue
        spec = job["spec"]
        olds = {m: _spec_map(spec, m) for m in maps}
        if not all(isinstance(olds[m], dict) and set(vals) <= set(olds[m]) for m, vals in maps.items()):
            stale.append(name)
            continue
        new = dict(spec)
        for m, vals in maps.items():
            merged = {**olds[m], **vals}
            if m == "secrets":
                new["secrets"] = merged
            else:
                new["executor"] = dict(new["executor"], **{m: merged})
        # Specs are never changed in place (records.SHARED_PARTS): the job gets a new one.
        job["spec"] = share_spec(new, s._parts, s._ints)
        resealed += 1
    s.seal = {"key": key}
    return ok(key=key, resealed=resealed, stale=stale)


# ------------------------------------------------------------------ reads (core/queries.py)
def seal_key(s: SchedulerState) -> str | None:
    """The key new secret values are sealed under, or None when no reseal named one yet."""
    key: str | None = s.seal.get("key")
    return key


def secret_maps(s: SchedulerState) -> list[list[Any]]:
    """``[name, gen, {"secrets"|"env"|"headers": {name: value}}]`` of every job that holds a
    secret value, by name: what a reseal reads (one pass over the jobs). The maps are copies."""
    out: list[list[Any]] = []
    for name, job in s.jobs.items():
        spec = job["spec"]
        maps = {}
        for m in MAP_PATHS:
            v = _spec_map(spec, m)
            if isinstance(v, dict) and v:
                maps[m] = dict(v)
        if maps:
            out.append([name, job["gen"], maps])
    out.sort(key=lambda item: item[0])
    return out


# ------------------------------------------------------------------ snapshot section
def _encode(seal: dict[str, Any]) -> dict[str, Any] | None:
    return dict(seal) if seal else None


def _decode(data: dict[str, Any]) -> dict[str, Any]:
    return dict(data)


EXTENSION = snapshot.register(snapshot.Extension(name="seal", new=dict, encode=_encode, decode=_decode))
