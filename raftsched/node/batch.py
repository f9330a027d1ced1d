"""``POST /v1/jobs:batch`` (docs/api.md) as put_jobs commands: the proposer's algorithm.

1. Validate the body (BadRequest, 400), then every job as PUT does. If any job is invalid, raise
   InvalidSpec (422) naming the first one and its field, with up to 100 in ``errors``, and
   propose nothing (``validate_all``).
2. Cut the jobs, sorted by name, into put_jobs commands of at most command_bytes_max (``cut``).
   The cut depends on the names, specs and create_only alone (each item is sized with its times
   at their largest encoding), so the same body always gives the same commands; each command's
   request id is ``jb-`` and a BLAKE2b of the Idempotency-Key, its index and its items sized so.
   Sending the same body with the same key again therefore applies each command at most once.
3. The service proposes the commands concurrently, put_jobs_in_flight_max at a time, and
   ``merge`` turns their results into one answer, or into the worst failure carrying which jobs
   are committed, which are not, and which are unknown.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Callable

import msgpack

from ..core import commands, limits, model, schedule
from ..core.records import is_int
from ..core.errors import BadRequest, InvalidSpec, RaftschedError, Unavailable
from . import limits as node_limits

#: Stands for a time while sizing a put_jobs item: encodes as long as any time can (9 bytes).
_TIME_WIDEST = 2**63 - 1
#: Room for an item's ``was`` (queries.position_digest), should its position need one.
_WAS_ROOM = len(msgpack.packb({"was": _TIME_WIDEST}, use_bin_type=True))


def parse_body(body) -> tuple[dict, bool, bool, bool]:
    """``{"jobs": {name: spec, ...}, "create_only": bool, "paused": bool, "dry_run": bool}`` ->
    (jobs, create_only, paused, dry_run). :raises BadRequest:"""
    if not isinstance(body, dict):
        raise BadRequest('send {"jobs": {"<name>": <job spec>, ...}}', field=None)
    for k in body:
        if k not in ("jobs", "create_only", "paused", "dry_run"):
            raise BadRequest("unknown field; allowed: create_only, dry_run, jobs, paused", field=str(k))
    jobs = body.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        raise BadRequest('must be a non-empty object {"<name>": <job spec>, ...}', field="jobs")
    if len(jobs) > limits.batch_jobs_max:
        raise BadRequest(f"holds {len(jobs)} jobs; at most {limits.batch_jobs_max} per request", field="jobs")
    create_only = body.get("create_only", False)
    if not isinstance(create_only, bool):
        raise BadRequest("must be true or false", field="create_only")
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        raise BadRequest("must be true or false", field="paused")
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadRequest("must be true or false", field="dry_run")
    return jobs, create_only, paused, dry_run


async def validate_all(jobs_raw: dict, now_ms: int | None = None) -> dict[str, dict]:
    """Every job's spec (model.validate_job, at the proposer's ``now_ms``), yielding to the event loop every
    batch_validate_step jobs. :raises InvalidSpec: naming the first invalid job and listing up
    to node_limits.batch_errors_listed_max of them."""
    step = node_limits.batch_validate_step
    specs: dict[str, dict] = {}
    invalid: list[dict] = []
    for k, (name, raw) in enumerate(jobs_raw.items()):
        if k and k % step == 0:
            await asyncio.sleep(0)  # a yield, not a wait: other requests, the trigger, heartbeats
        try:
            specs[name] = model.validate_job(name, raw, now_ms)
        except InvalidSpec as e:
            invalid.append({"job": name, "field": e.field, "message": e.message})
    if invalid:
        first = invalid[0]
        raise InvalidSpec(f"job {first['job']!r}: {first['message']}", field=first["field"], job=first["job"],
                          invalid=len(invalid), errors=invalid[:node_limits.batch_errors_listed_max])
    return specs


async def cut(specs: dict[str, dict], create_only: bool, key: str, now: int,
              position: Callable[[str, dict], tuple[int, int, int | None, int | None]],
              claims: dict[str, str | None] | None = None,
              in_order: bool = False, paused: bool = False,
              by: str | None = None) -> tuple[list[list[dict]], list[bytes]]:
    """The put_jobs commands for ``specs``: their items (``chunks``) and their encodings.
    ``position(name, schedule)`` gives each job's ``(cursor, anchor, next, was)``
    (Service._position; ``was`` written only when not None); ``claims`` each
    job's put_job ``claim`` (node/tenancy.py), when it has one: it depends on the token and the
    spec only, so a retry cuts the same commands. The items go by name, or in the order of
    ``specs`` with ``in_order`` (pipelines: parents first, so that a child is checked against
    its parent as stored when the parent's item is refused). ``paused``: every item pauses its job
    (jobs.put_job), ``by`` the token id that asked."""
    step = node_limits.batch_validate_step
    chunks: list[list[dict]] = []  # put_jobs items
    hashes: list = []
    budget = limits.command_bytes_max - node_limits.put_jobs_envelope_bytes
    cur: list[dict] = []
    cur_bytes = 0
    h = None
    for k, name in enumerate(specs if in_order else sorted(specs)):
        if k and k % step == 0:
            await asyncio.sleep(0)
        spec = specs[name]
        claim = claims.get(name) if claims else None
        # The item at its largest: the times it will carry encode in at most 9 bytes each.
        item = {"name": name, "spec": spec, "next": _TIME_WIDEST, "cursor": _TIME_WIDEST,
                "anchor": _TIME_WIDEST, "create_only": create_only}
        if claim is not None:
            item["claim"] = claim
        if paused:
            item["paused"] = True
            if by is not None:
                item["by"] = by
        widest = msgpack.packb(item, use_bin_type=True)
        # (a job with a schedule may need a ``was``: Service._position; the room is the same
        # whatever the state, so that a retry cuts the same commands)
        size = len(widest) + (_WAS_ROOM if "schedule" in spec else 0)
        if cur and (cur_bytes + size > budget or len(cur) >= limits.put_jobs_items_max):
            chunks.append(cur)
            hashes.append(h)
            cur, cur_bytes = [], 0
        if not cur:
            h = hashlib.blake2b(key.encode("utf-8", "backslashreplace") + b"\0%d\0" % len(chunks), digest_size=20)
        h.update(widest)
        cursor, anchor, nxt, was = position(name, spec.get("schedule"))
        item.update(next=nxt, cursor=cursor, anchor=anchor)
        if was is not None:
            item["was"] = was
        cur.append(item)
        cur_bytes += size
    chunks.append(cur)
    hashes.append(h)
    datas = [commands.encode(commands.put_jobs(now, "jb-" + hh.hexdigest(), jobs=chunk))
             for chunk, hh in zip(chunks, hashes)]
    return chunks, datas


def stale_items(chunks: list[list[dict]], results: list) -> list[str]:
    """The names of the items the commands' results refused as stale (put_jobs ``stale``)."""
    out = []
    for chunk, res in zip(chunks, results):
        if isinstance(res, dict):
            out.extend(chunk[i]["name"] for i in res.get("stale") or () if is_index(i, chunk))
    return out


def is_index(i: object, seq: list) -> bool:
    return is_int(i) and 0 <= i < len(seq)


def merge(jobs_raw: dict, chunks: list[list[dict]], results: list, key: str) -> dict:
    """One answer from the commands' results (a result, or the exception its proposal raised).

    :returns: ``{"jobs": {name: result}, "created", "replaced", "conflicts", "commands"}``.
    :raises RaftschedError: when a command failed: the type of the worst failure
        (Indeterminate, then Unavailable, then the first other), carrying which jobs are
        committed (their results), which are not, and which are unknown."""
    done: dict[str, dict] = {}
    not_committed: list[str] = []
    unknown: list[str] = []
    failures: list[RaftschedError] = []
    duplicates = 0
    isos: dict = {}  # next slot -> ISO text (many jobs share one: ~7 us a strftime)
    for chunk, res in zip(chunks, results):
        names = [item["name"] for item in chunk]
        if isinstance(res, BaseException):
            if not isinstance(res, RaftschedError):
                raise res  # a bug: the middleware logs it (500)
            failures.append(res)
            for name in names:  # (a stale item planned again: its last command's outcome stands)
                done.pop(name, None)
            (not_committed if res.definite else unknown).extend(names)
            continue
        gens, created, conflicts = res.get("gen"), res.get("created"), set(res.get("conflicts") or ())
        stale = set(res.get("stale") or ())
        invalid = {i: why for i, why in res.get("invalid") or ()}
        if not isinstance(gens, list) or len(gens) != len(chunk):
            # Only if the derived request id had served another request (a hash collision).
            failures.append(RaftschedError("a derived request id answered for another request", field="Idempotency-Key"))
            unknown.extend(names)
            continue
        duplicates += bool(res.get("duplicate"))
        for i, item in enumerate(chunk):
            name = item["name"]
            if i in conflicts:
                done[name] = {"error": {"code": "conflict", "message": f"job {name!r} exists", "field": "name"}}
            elif i in invalid:
                # its edges, against a job another item of the batch was refused to replace
                done[name] = {"error": {"code": "invalid", "field": "after", "message": invalid[i]}}
            elif i in stale:
                done[name] = {"error": {"code": "conflict", "field": "name", "stale": True, "message": (
                    f"job {name!r} fired ahead while this replace was planned from an older view; send it again")}}
            else:
                nxt = item["next"]
                if nxt not in isos:
                    isos[nxt] = schedule.iso(nxt)
                done[name] = {"created": bool(created[i]), "gen": gens[i], "next_slot": isos[nxt]}
    ordered = {name: done[name] for name in jobs_raw if name in done}
    if failures:
        worst = (next((e for e in failures if not e.definite), None)
                 or next((e for e in failures if isinstance(e, Unavailable)), None) or failures[0])
        extra = {k: v for k, v in worst.extra.items() if k in ("leader", "reason")}
        n = len(jobs_raw)
        raise type(worst)(
            f"{len(ordered)} of {n} jobs committed, {len(not_committed)} not, {len(unknown)} unknown: "
            f"{len(failures)} of {len(chunks)} commands failed ({worst.message}). Sending the same body "
            f"again with Idempotency-Key {key!r} applies each command at most once",
            field=worst.field, **extra, idempotency_key=key, commands=len(chunks),
            commands_failed=len(failures), jobs=ordered, not_committed=not_committed, unknown=unknown)
    out = {"jobs": ordered, "created": sum(1 for r in ordered.values() if r.get("created")),
           "replaced": sum(1 for r in ordered.values() if r.get("created") is False),
           "conflicts": sum(1 for r in ordered.values() if "error" in r), "commands": len(chunks)}
    if duplicates == len(chunks):
        out["duplicate"] = True
    return out
