"""Secrets at rest, for an admin: which keys hold the stored secret values, and the rotation
that moves them all to another key (docs/operations.md, "Key files"; raftsched/sealing.py).

``GET /v1/secrets`` (``raftsched secrets status``): the key the cluster seals new values under,
the keys this node's ring holds, and how many stored values are sealed under each key (or still
in clear, from a journal written before sealing). A key may be retired (its file deleted from
every node) once no value is sealed under it.

``POST /v1/secrets:rotate {"key": ID}`` (``raftsched secrets rotate-key ID``): the node that
receives it reads its ring again, and must hold ``ID``. It reads every stored secret value, and
each one not sealed under ``ID`` it unseals (with the key it is sealed under, which it must
hold too) and seals again under ``ID``, keeping the fingerprint it was sealed with (so reads show
the same redaction before and after); it proposes them in ``reseal`` commands that also name
``ID`` as the key new values are sealed under, from their commit on, by every node; a
notification sink's values, in ``sink_reseal`` commands. Each item of either applies only to
what the rotation read (a job's generation; a sink's secrets exactly as they were stored): a job
or sink deleted or written meanwhile is left as that write made it (``stale``), never restored.
A write proposed by a node that read the state before that commit may still land sealed under
the old key: the rotation reads again (after a barrier) and repeats until a pass finds nothing
left to re-seal (at most reseal_passes_max passes). Values it cannot unseal (their key is in no
ring of this node, or they are damaged) are counted in the answer, never dropped.
"""
from __future__ import annotations

import asyncio
import collections

import msgpack
from aiohttp import web

from ..core import commands, limits, queries
from ..core.errors import BadRequest, InvalidSpec
from ..core.seal_keys import MAP_PATHS
from .. import sealing
from . import limits as node_limits
from .http import SERVICE, json_body, json_response
from .routes import CONSISTENT, STALE, Route, Tenancy


def status(svc) -> dict:
    """What ``GET /v1/secrets`` answers (see the module docstring)."""
    ring = svc.keyring
    ring.reload()
    counts: collections.Counter = collections.Counter()
    clear = malformed = 0
    sinks = [{"secrets": spec["secrets"]} for _, spec in _sink_specs(svc) if spec.get("secrets")]
    for maps in [m for _, _, m in svc.read(queries.secret_maps)] + sinks:
        for vals in maps.values():
            for v in vals.values():
                try:
                    kid = sealing.key_of(v)
                except sealing.SealError:
                    malformed += 1
                    continue
                if kid is None:
                    clear += 1
                else:
                    counts[kid] += 1
    held = ring.ids()
    return {"node": svc.node_id, "key": svc.read(queries.seal_key),
            "ring": {"dir": ring.directory, "keys": held},
            "values": dict(sorted(counts.items())), "clear": clear, "malformed": malformed,
            "missing": sorted(k for k in counts if k not in held)}


def _resealed(svc, key: str, v: str, where: bytes, unreadable: collections.Counter) -> str | None:
    """``v`` (a stored secret of ``where``) sealed under ``key``, or None: it is sealed under it
    already, or it cannot be unsealed (counted in ``unreadable`` by key id, or ``"malformed"``)."""
    try:
        kid = sealing.key_of(v)
    except sealing.SealError:
        unreadable["malformed"] += 1
        return None
    if kid == key:
        return None
    if kid is None:  # in clear, from a journal written before sealing
        clear, fp = v, svc.fingerprint.digest(v)
    else:
        try:
            clear = svc.keyring.unseal(v, where)
        except sealing.SealError:
            unreadable[kid] += 1
            return None
        fp = sealing.fingerprint_of(v)
    return svc.keyring.seal(key, clear, fp, where)


async def _pass(svc, key: str, unreadable: collections.Counter) -> list[list]:
    """The reseal items of one pass: every stored value not sealed under ``key``, sealed again
    under it. Values that cannot be unsealed are counted in ``unreadable`` by key id (or
    ``"malformed"``)."""
    items: list[list] = []
    done = 0
    for name, gen, maps in svc.read(queries.secret_maps):
        out: dict = {}
        for m, vals in maps.items():
            path = MAP_PATHS[m]
            for n, v in vals.items():
                sealed = _resealed(svc, key, v, sealing.place(name, path, n), unreadable)
                if sealed is None:
                    continue
                out.setdefault(m, {})[n] = sealed
                done += 1
                if done % node_limits.reseal_step == 0:
                    await asyncio.sleep(0)  # a yield, not a wait: other requests, the trigger
        if out:
            items.append([name, gen, out])
    return items


def _chunks(items: list[list], most: int = limits.reseal_jobs_max) -> list[list[list]]:
    """``items`` cut into commands of at most command_bytes_max and ``most`` items (one item
    alone may be refused as too large: a key id longer than the old one grows every value)."""
    budget = limits.command_bytes_max - node_limits.put_jobs_envelope_bytes
    chunks: list[list[list]] = [[]]
    size = 0
    for item in items:
        n = len(msgpack.packb(item, use_bin_type=True))
        if chunks[-1] and (size + n > budget or len(chunks[-1]) >= most):
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += n
    return chunks


def _sink_specs(svc) -> list[tuple[str, dict]]:
    """(name, spec) of every notification sink (node/notify.py): their secrets are sealed too."""
    from ..core import notify as core_notify
    out = []
    for name in svc.read(core_notify.sink_names):
        rec = svc.read(core_notify.sink_record, name)
        if rec is not None:
            out.append((name, rec["spec"]))
    return out


def _sink_pass(svc, key: str, unreadable: collections.Counter) -> list[list]:
    """The sink_reseal items of one pass: ``[name, secrets read, {name: sealed again}]`` for
    every sink holding a value not sealed under ``key``. Apply replaces the values only if the
    sink still holds exactly the secrets read (core/notify.py apply_sink_reseal): a sink deleted
    or written meanwhile is left as that write made it, and read again by the next pass."""
    items: list[list] = []
    for name, spec in _sink_specs(svc):
        vals = dict(spec.get("secrets") or {})
        new = {}
        for n, v in vals.items():
            sealed = _resealed(svc, key, v, sealing.place("sink:" + name, ("secrets",), n), unreadable)
            if sealed is not None:
                new[n] = sealed
        if new:
            items.append([name, vals, new])
    return items


async def rotate(svc, body) -> dict:
    """``POST /v1/secrets:rotate`` (see the module docstring). :raises InvalidSpec: no key id,
    or one this node's ring does not hold."""
    if not isinstance(body, dict) or set(body) != {"key"}:
        raise BadRequest('send {"key": "<key id>"}: the key to seal every secret value under', field="key")
    try:
        key = sealing.check_key_id(body["key"])
    except ValueError as e:
        raise InvalidSpec(str(e), field="key") from None
    ring = svc.keyring
    ring.reload()
    if key not in ring.ids():
        where = ring.directory or "its key ring"
        raise InvalidSpec(f"node {svc.node_id} holds no key {key!r} in {where}: write the key file into every "
                          "node's key ring first (raftsched secrets new-key)", field="key")
    resealed = stale = passes = 0
    unreadable: collections.Counter = collections.Counter()
    while passes < node_limits.reseal_passes_max:
        passes += 1
        await svc.raft.barrier(timeout_s=svc.propose_timeout_s)
        unreadable.clear()
        items = await _pass(svc, key, unreadable)
        sinks = _sink_pass(svc, key, unreadable)
        if not items and not sinks and svc.read(queries.seal_key) == key:
            break
        for chunk in _chunks(items):  # (first: the key every node seals new values under)
            res = await svc.propose(commands.reseal(svc.clock.now_ms(), None, key=key, jobs=chunk))
            resealed += res["resealed"]
            stale += len(res["stale"])
        for chunk in _chunks(sinks, limits.sinks_max) if sinks else ():
            res = await svc.propose(commands.sink_reseal(svc.clock.now_ms(), None, items=chunk))
            resealed += res["resealed"]
            stale += len(res["stale"])
    after = status(svc)
    left = sum(n for k, n in after["values"].items() if k != key) + after["clear"]
    return {"key": key, "resealed": resealed, "stale": stale, "passes": passes,
            "complete": left == 0 and after["malformed"] == 0, "unreadable": dict(sorted(unreadable.items())),
            "values": after["values"], "clear": after["clear"], "malformed": after["malformed"]}


async def secrets_status(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(status(svc))


async def secrets_rotate(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return json_response(await rotate(svc, await json_body(request)))


#: The rows of the route table (node/routes.py): an admin's.
SECRETS_ROUTES = (
    Route("GET", "/v1/secrets", secrets_status, "admin", Tenancy.REFUSED,
          "which keys the stored secret values are sealed under", params=(STALE, CONSISTENT), response="secrets"),
    Route("POST", "/v1/secrets:rotate", secrets_rotate, "admin", Tenancy.REFUSED,
          "seal every stored secret value under another key", body="secrets_rotate", errors=(422,), response="secrets_rotated"),
)
