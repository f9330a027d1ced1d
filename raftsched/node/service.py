"""The operations the API offers, as the proposer sees them.

A write is validated here (on whichever node received it), completed with what only the proposer
may compute (slots, via core.schedule, from this node's clock), encoded and proposed through the
replication layer. Reads come from the local replica through core.queries, optionally after a
barrier (a consistent read), and are shaped for the API by node/views.py. Nothing here knows HTTP
or pysyncobj, nor how the state stores its records.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import ipaddress
import logging
import re
import uuid
from urllib.parse import urlsplit

import msgpack

from ..clock import Clock
from .walks import SingleFlight, off_loop
from ..core import (bodies, commands, deadlines, limits, model, network, pipelines, policy, preview, queries, schedule,
                   specdiff)
from ..core.errors import (BadRequest, Conflict, Forbidden, InvalidSpec, LimitExceeded, NotFound, RaftschedError,
                           Unavailable)
from ..core.jobs import tenant_full, tenant_overflow
from ..core.model import check_name
from ..core.notify_model import validate_routes
from ..core.tenants import DEFAULT_POLICY, LIMITED
from .. import sealing
from . import batch, tenancy
from ..proposer import Proposer
from .reads import ReadBarrier
from . import limits as node_limits
from .redact import PROCESS_DEFAULT, Fingerprint, restore_redacted
from .views import deadline_view, job_view, lock_view, policy_view, run_view, spec_view, tenant_view

log = logging.getLogger("raftsched.api")


#: How many runs of one instant ``explain`` with a slot lists (GET /v1/jobs/{name}/runs?slot= lists
#: up to its ``limit``): the slot's own, its runs by hand, a backfill's, a range covering it.
_EXPLAIN_RUNS_MAX = 20
#: ``waiting_for`` of a run fired ahead and held by its job's pause (its ``due`` null: core/notify.py)
HELD_BY_PAUSE = "its job to be resumed"


def new_request_id() -> str:
    return uuid.uuid4().hex


def _preview_spec(raw, count: int, now: int, name: str | None = None, after_ms: int | None = None) -> dict:
    """``POST /v1/preview``'s answer: the slots of a job named ``name`` (default ``preview``)
    made from ``raw`` at ``now`` (pure), after ``after_ms`` when that is later than its first
    (the job made now has no slot before). The name matters: a jitter offset is a hash of it,
    and the spec's ``after`` (its parents) may not name it."""
    spec = model.validate_job(name or PREVIEW_NAME, raw, now)
    if "schedule" not in spec:
        return {"slots": [], "triggered_by": spec["after"]}
    anchor, cursor = policy.initial_position(spec["schedule"], now)
    return {"slots": preview.preview(spec, anchor, cursor if after_ms is None else max(cursor, after_ms), count)}


#: The job name POST /v1/preview validates a spec under when it is given none.
PREVIEW_NAME = "preview"


#: A run id's slot written as an ISO time (what waiting_for and explain show: ``NAME@2026-12-02T02:00:00Z``,
#: ``...Z!manual-3``), not its milliseconds.
_ISO_IN_ID = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:\d{2})")


def run_id_of(run_id: str) -> str:
    """``run_id`` with a slot written as an ISO time (the readable form the waiting texts show)
    turned into the milliseconds every run id holds; any other id as it is."""
    name, at, rest = run_id.partition("@")
    m = _ISO_IN_ID.match(rest) if at else None
    if m is None:
        return run_id
    try:
        ms = schedule.parse_iso_ms(m.group(0), "run")
    except InvalidSpec:
        return run_id
    return f"{name}@{ms}{rest[m.end():]}"


class Service:
    """The proposer side of every write the API offers, and its reads of the local replica.

    :param raft: the replication adapter (``propose``, ``barrier``, ``read``).
    :param clock: the proposer's clock: every command's ``now``, and the first slots of a job.
    :param fingerprint: how reads show secrets (node/redact.py); the node's is keyed by the
        cluster secret, so every node shows the same fingerprints.
    :param keyring: the keys this node seals secrets with before it proposes them
        (raftsched/sealing.py); the node's is read from its --keys-dir.
    """

    def __init__(self, raft, clock: Clock, node_id: str,
                 propose_timeout_s: float = node_limits.propose_timeout_s_default,
                 fingerprint: Fingerprint = PROCESS_DEFAULT,
                 keyring: sealing.KeyRing = sealing.PROCESS_RING) -> None:
        self.raft = raft
        self.clock = clock
        self.node_id = node_id
        self.propose_timeout_s = propose_timeout_s
        self.fingerprint = fingerprint
        self.keyring = keyring
        #: The one way this node's API writes go out (raftsched/proposer.py).
        self.proposer = Proposer(raft, propose_timeout_s)
        #: GET /v1/queues's counts of ready and unplaceable runs: one walk for the polls that
        #: arrive together
        self._queue_walk = SingleFlight()
        #: (monotonic time, the live workers) read last for a PUT's warnings (``_live_workers``)
        self._live_read: tuple[float, list] | None = None
        #: Every consistent read of this node's API waits on this (node/reads.py).
        self.reads = ReadBarrier(raft, propose_timeout_s)

    # ------------------------------------------------------------------ plumbing
    async def propose(self, cmd: dict) -> dict:
        """``Proposer.propose`` (raftsched/proposer.py): the replay rule, the proposal, the error."""
        return await self.proposer.propose(cmd)

    async def propose_data(self, data: bytes) -> dict:
        """``propose`` for a command already encoded."""
        return await self.proposer.propose_encoded(data)

    _out = staticmethod(Proposer.out)

    def read(self, query, *args):
        """``query(state, *args)`` (a core.queries function) on the local replica, under the
        lock applies take (``raft.read``)."""
        return self.raft.read(query, *args)

    async def read_barrier(self, consistent: bool = True) -> None:
        """Wait until this replica has applied every write acknowledged before the call (one
        barrier round for every read waiting at once: node/reads.py); the API's read routes
        wait in its read middleware already. :raises Unavailable:"""
        if consistent:
            await self.reads.wait()

    # ------------------------------------------------------------------ jobs
    def _position(self, name: str, sched: dict | None, now: int,
                  memo: dict | None = None) -> tuple[int, int, int | None, int | None]:
        """The proposer's part of a put_job: ``(cursor, anchor, next, was)``. A replace with the
        same schedule keeps the job's cursor and anchor (queries.kept_position: apply keeps them
        whatever the command says); one that changes only the schedule's jitter keeps its place
        on its grid (queries.rejitter_position: ``was``, what apply checks the job against; else
        None). ``memo`` caches cron next slots within one batch (20-40 us a
        call). A triggered job (pipelines: ``after`` and no schedule) has no slot of its own."""
        if sched is None:
            return now, now, None, None
        anchor, cursor = policy.initial_position(sched, now)
        kept, moved = self.read(queries.replace_position, name, sched)
        if kept is not None:
            cursor, anchor, _ = kept
        elif moved is not None:
            return moved
        else:
            # Another schedule starts after the old one's cursor when that is ahead (it fired
            # ahead of now): apply keeps the larger, so the next slot is computed from it too.
            floor = self.read(queries.cursor_floor, name)
            if floor is not None and floor > cursor:
                cursor = floor
        if memo is None or "cron" not in sched:
            return cursor, anchor, schedule.next_slot_after(sched, cursor, anchor), None
        key = (repr(sched), cursor, anchor)
        if key not in memo:
            memo[key] = schedule.next_slot_after(sched, cursor, anchor)
        return cursor, anchor, memo[key], None

    def unredact(self, name: str, raw, tenants: frozenset | None = None):
        """``raw`` with the redacted values a read showed of job ``name``'s stored secrets put
        back (node/redact.py); for a token limited to ``tenants``, only from a job of theirs (for
        another tenant's, as for a name nobody uses). :raises InvalidSpec: a redacted value that
        matches none."""
        if not isinstance(raw, dict) or not isinstance(name, str):
            return raw

        def stored():
            old = self.read(queries.job, name)
            if old is None or (tenants is not None and old["spec"]["tenant"] not in tenants):
                return None
            return old["spec"]
        return restore_redacted(raw, stored, self.fingerprint)

    def check_write(self, name: str, spec: dict, tenants: frozenset | None, access: dict | None = None) -> str | None:
        """Hold a validated ``spec`` of job ``name`` to its tenant's policy and, for a token
        limited to ``tenants``, to them (node/tenancy.py); such a token's spec is marked written by
        it (``limited``: its tenant's policy, or the default one, holds it for good).

        :returns: the put's ``claim`` (tenancy.check_job). :raises Forbidden, Conflict:"""
        claim = tenancy.check_job(self, tenants, name, spec, access)
        if tenants is not None:
            spec[LIMITED] = True
        return claim

    def job_view(self, job: dict, tenants: frozenset | None = None) -> dict:
        """``job`` (queries.job) as the API shows it, secrets redacted. For a token limited to
        ``tenants``: a last run, or a health incident's run, of another tenant (the job was
        moved between tenants) is not shown."""
        out = job_view(job, self.fingerprint)
        if tenants is not None:
            last = out["state"].get("last_run")
            if last is not None and not self._run_visible(last["id"], tenants):
                out["state"]["last_run"] = None
            h = out.get("health")
            if h is not None:
                if h.get("incident") and h["incident"].get("run") and not self._run_visible(h["incident"]["run"], tenants):
                    h["incident"] = None
                slot = h.get("last_slot_outcome")
                if slot is not None and out["state"]["last_run"] is None and last is not None:
                    h["last_slot_outcome"] = None
        return out

    def _run_visible(self, run_id: str, tenants: frozenset) -> bool:
        """Whether a token limited to ``tenants`` may see run ``run_id`` (gone: not)."""
        t = self.read(queries.run_tenant, run_id)
        return t is not None and t in tenants

    def visible_jobs(self, names, tenants: frozenset | None) -> list:
        """``names`` without the jobs a token limited to ``tenants`` may not see (in order)."""
        if tenants is None:
            return list(names)
        return [n for n in names if self.read(queries.job_tenant, n) in tenants]

    # ------------------------------------------------------------------ secrets at rest
    async def seal_key(self) -> str:
        """The key this node seals new secret values under: the one the state names
        (core/seal_keys.py). When it names none yet (a new cluster, or one whose journal predates
        sealing), this node's ring must hold exactly one key, which it names first with a
        reseal of no jobs, so that a key added to the rings later changes nothing until
        ``raftsched secrets rotate-key`` names it.

        :raises Unavailable: this node cannot seal (no key, or not the one named): the request
            is refused rather than stored in clear; another node may take it."""
        kid, named = self.seal_key_now()
        if not named:
            kid = (await self.propose(commands.reseal(self.clock.now_ms(), None, key=kid, jobs=[])))["key"]
            self._holds(kid)
        return kid

    def seal_key_now(self) -> tuple[str, bool]:
        """``(key id, named)``: the key :meth:`seal_key` would seal under, proposing nothing
        (``named`` False: the state names none yet, and this node's only key would be named
        first). :raises Unavailable: as seal_key."""
        kid = self.read(queries.seal_key)
        if kid is None:
            ids = self.keyring.ids()
            if len(ids) != 1:
                raise Unavailable(
                    f"node {self.node_id} cannot seal secrets: {self._ring_where()} holds "
                    + (f"{len(ids)} keys and the cluster names none; name one with raftsched secrets rotate-key"
                       if ids else "no key (raftsched secrets new-key; docs/operations.md, \"Key files\")"),
                    field="secrets")
            return ids[0], False
        self._holds(kid)
        return kid, True

    def _ring_where(self) -> str:
        ring = self.keyring
        return f"its key ring ({ring.directory})" if ring.directory else "its key ring"

    def _holds(self, kid: str) -> None:
        if not self.keyring.holds(kid):
            raise Unavailable(f"node {self.node_id} cannot seal secrets: they are sealed under key {kid!r}, which "
                              f"{self._ring_where()} does not hold; give it that key file, or send the request to "
                              "another node", field="secrets")

    def seal_with(self, kid: str, name: str, spec: dict) -> dict:
        """``spec`` with its secret values in clear sealed under ``kid`` (raftsched/sealing.py).
        :raises InvalidSpec: the sealed spec would not fit in a command."""
        out = sealing.seal_spec(spec, name, self.keyring, kid, self.fingerprint.digest)
        if out is not spec:
            size = len(msgpack.packb(out, use_bin_type=True))
            if size > limits.command_bytes_max - 1024:
                raise InvalidSpec(f"spec is {size} bytes encoded with its secret values sealed (each adds up to "
                                  f"{sealing.OVERHEAD_BYTES_MAX} bytes); the limit is "
                                  f"{limits.command_bytes_max - 1024}", field=None)
        return out

    async def seal(self, name: str, spec: dict, tenants: frozenset | None = None) -> dict:
        """A validated ``spec`` as it is proposed: the redacted values a read showed put back
        (their stored, sealed values; for a token limited to ``tenants``, only from a job of
        theirs), every value in clear sealed. Nothing is stored in clear: a node that cannot seal
        refuses (``seal_key``)."""
        spec = self.unredact(name, spec, tenants)
        if not sealing.has_clear(spec):
            return spec
        return self.seal_with(await self.seal_key(), name, spec)

    async def put_job(self, name: str, raw, rid: str | None, create_only: bool = False,
                      tenants: frozenset | None = None, paused: bool = False, by: str | None = None) -> dict:
        """Create or replace job ``name``: the body is validated first, then held to its
        tenant's policy and to the token's ``tenants`` (check_write), then sealed, then proposed;
        ``paused``: paused by the same command (created paused: it fires nothing until resumed),
        ``by`` the token id that asked."""
        now = self.clock.now_ms()
        # Validated as sent (a redacted value is text that passes), its redacted values put back
        # (their stored, sealed bytes: a 422 for one that matches none of this token's jobs, as
        # for a free name), held to the rules, then its values in clear sealed.
        spec = self.unredact(name, model.validate_job(name, raw, now), tenants)
        claim = self.check_write(name, spec, tenants)
        self.check_edges(name, spec, tenants)  # (before sealing: a first seal may name the cluster's key)
        spec = await self.seal(name, spec, tenants)
        before = self.read(queries.job, name)
        # (a past one-shot at is warned of when this write made the job or gave it that schedule)
        new_schedule = before is None or before["spec"].get("schedule") != spec.get("schedule")
        rid = rid or new_request_id()
        # A replace refused as stale (the job fired while this was planned: a change of its
        # schedule, or of its jitter) is planned again from the newer view, under request ids
        # derived from the first; a request sent again skips the tries its state remembers
        # refused so, and replays the one that applied.
        attempt = fresh = 0
        while True:
            cursor, anchor, nxt, was = self._position(name, spec.get("schedule"), now)
            self.check_slots_meet(name, spec, anchor, tenants)
            cmd = commands.put_job(now, rid if not attempt else f"{rid}~{attempt}", name=name, spec=spec, next=nxt,
                                   cursor=cursor, anchor=anchor, create_only=create_only, claim=claim, was=was,
                                   paused=paused, by=by)
            seen = self.read(queries.replayed, cmd)
            attempt += 1
            if seen is not None and not seen.get("ok") and (seen.get("error") or {}).get("stale"):
                continue  # an earlier try's stale refusal: not counted
            try:
                res = await self.propose(cmd)
                break
            except Conflict as e:
                fresh += 1
                if not e.extra.get("stale") or fresh > node_limits.stale_replans_max:
                    raise
        out = self._out(res, {"job": name, "created": res.get("created", False), "next_slot": schedule.iso(nxt)})
        if res.get("paused"):  # (this put paused it: a job paused already is not said to be)
            out["paused"] = True
        warnings = self._told_after_write([spec], tenants, [bool(res.get("created")) or new_schedule])[0]
        if warnings:
            # Accepted (a sink may be put after its jobs), but a typo would silently tell no one.
            out["warnings"] = warnings
        return out

    def _told_after_write(self, specs: list[dict], tenants: frozenset | None,
                          created: list[bool] | None = None) -> list[list[str]]:
        """The warnings of each of ``specs``, just written (``created``: which the write made, or
        gave a new schedule, as a past one-shot ``at`` is judged): a
        bug reading them must not answer an error for a write that was applied (the client would
        take it for not applied), so it is logged and the answer has none."""
        try:
            live = self._live_workers()
            made = created if created is not None else [False] * len(specs)
            return [self._warnings(spec, tenants, why, live, new)
                    for spec, why, new in zip(specs, queries.waits_for_worker(live, specs), made)]
        except Exception:
            log.exception("api: the warnings of %d written job(s) could not be read; answered without them",
                          len(specs))
            return [[] for _ in specs]

    def _warnings(self, spec: dict, tenants: frozenset | None, waits: str | None = None,
                  live: list | None = None, created: bool = False) -> list[str]:
        """What a PUT of ``spec`` accepts but says: routes that reach no sink, a URL its runs
        may not call, no live worker that may take its runs (``waits``: queries.waits_for_worker's
        answer for it), settings that do nothing (a past one-shot ``at`` of a job ``created``)."""
        return (self._route_warnings(spec, tenants) + self._network_warnings(spec, tenants)
                + _heartbeat_warnings(spec) + _replace_warnings(spec) + _worker_warnings(spec, waits, live)
                + _idle_setting_warnings(spec, self.clock.now_ms() if created else None))

    def _live_workers(self) -> list:
        """The live workers as a PUT's warning judges them (queries.live_workers), read at most once
        every node_limits.live_workers_reuse_s: a walk of the registry (10 000 workers: ~10 ms
        under the replica's lock) once a PUT would cost a registration by PUTs that much each; a
        warning a second behind the registry is as good."""
        mono = self.clock.monotonic_s()
        held = self._live_read
        if held is None or mono - held[0] >= node_limits.live_workers_reuse_s:
            held = self._live_read = (mono, self.read(queries.live_workers, self.clock.now_ms()))
        return held[1]

    def _network_warnings(self, spec: dict, tenants: frozenset | None) -> list[str]:
        """For a job written by a token limited to ``tenants`` (its tenant's network policy holds
        its runs: docs/security.md, "Tenant policy"), a line when its http executor's URL names,
        as an IP address literal, an address that policy refuses: every run would be refused and
        end dead. A host name is not resolved here (each run's addresses are checked when it
        calls), and the policy may change before a run, so this warns, it does not refuse."""
        ex = spec.get("executor") or {}
        if tenants is None or ex.get("type") != "http" or not isinstance(ex.get("url"), str):
            return []
        try:
            host = urlsplit(ex["url"]).hostname
            ipaddress.ip_address((host or "").split("%", 1)[0])
        except ValueError:
            return []
        tenant = spec.get("tenant")
        allow = self.read(lambda s: list((s.tenant_policies.get(tenant) or DEFAULT_POLICY).get("allow") or ()))
        what = network.refused_as(host, allow)
        if what is None:
            return []
        return [f"executor.url: {host} is {what}, which the network policy of tenant {tenant!r} refuses: every run "
                f"will be refused (and end dead); an admin may allow the network (network.allow in PUT "
                f"/v1/tenants/{tenant})"]

    def _route_warnings(self, spec: dict, tenants: frozenset | None) -> list[str]:
        """A ``warnings`` line for each sink the spec's ``notify`` routes name that its events
        will not reach (events.route's rule), sorted by name: one that does not exist, or, for a
        token limited to ``tenants``, one it cannot see (another tenant's, or the cluster's: the
        same line, so the answer says nothing of them); one it can see (or any, for another
        token) limited to another tenant than the job's, or (for a limited token) to none."""
        names = {r["sink"] for r in spec.get("notify") or () if isinstance(r, dict) and isinstance(r.get("sink"), str)}
        if not names:
            return []
        held = self.read(lambda s: {n: s.sinks[n]["spec"].get("tenant") for n in names if n in s.sinks})
        job_tenant = spec.get("tenant")
        out = []
        for n in sorted(names):
            if n in held and tenants is not None and held[n] not in tenants:
                del held[n]  # (not this token's to see: as for no sink)
            if n not in held:
                out.append(f"notify: no sink named {n!r} (yet): nothing is told through it until one is put "
                           f"(PUT /v1/sinks/{n})")
            elif held[n] is not None and held[n] != job_tenant:
                out.append(f"notify: sink {n!r} is limited to tenant {held[n]!r}: it is told nothing of a job of "
                           f"tenant {job_tenant!r}")
        return out

    async def put_jobs(self, body, key: str | None, tenants: frozenset | None = None,
                       scope=None, by: str | None = None, writer: bool = True) -> dict:
        """Create or replace many jobs: ``POST /v1/jobs:batch`` (node/batch.py: validate every
        job, hold each to its tenant's policy and the token's ``tenants`` as a PUT is, cut them
        into put_jobs commands with request ids derived from ``key`` (``scope(key)``: the
        caller's, node/http.py), propose the commands concurrently, merge their results).

        ``writer`` False (a plan, ``POST /v1/jobs:plan``, by a token that may not write jobs): a
        secret value in clear is refused, 403 (a dry run compares it with the stored one,
        ``unchanged``, and shows its fingerprint, which would let a reader test guesses of values
        it may not read), and a job's ``limited`` mark is not compared (a write by this token
        would set it, but it writes nothing: a drift check by a limited reader of jobs another
        token wrote would always find that change).

        :returns: ``{"jobs": {name: result}, "created", "replaced", "conflicts", "commands"}``.
        :raises RaftschedError: as batch.merge, when a command failed; Forbidden or Conflict
            naming the first job a check refused (nothing is proposed then).
        """
        jobs_raw, create_only, paused, dry_run = batch.parse_body(body)
        key = key or new_request_id()
        if dry_run:
            # Checked against the log's view, not a lagging replica's: a diff against a follower
            # behind it would show changes the cluster has already made. (A read's barrier: a 503
            # when it cannot be had, never a 504, since nothing is proposed.)
            await self.read_barrier()
        now = self.clock.now_ms()
        specs = await batch.validate_all(jobs_raw, now)
        for name, spec in specs.items():
            try:
                specs[name] = self.unredact(name, spec, tenants)
            except InvalidSpec as e:
                raise InvalidSpec(f"job {name!r}: {e.message}", field=e.field, job=name, invalid=1,
                                  errors=[{"job": name, "field": e.field, "message": e.message}]) from None
            if not writer and sealing.has_clear(specs[name]):
                path = next(".".join((*p, n)) for p, n, v in sealing.values(specs[name]) if isinstance(v, str))
                raise Forbidden(f"job {name!r}: a token that may not write jobs may not send a secret value to "
                                "compare (it would learn whether a guess is right): send the redacted value a read "
                                "shows (***:...), or plan with a token that may write jobs", field=path, job=name)
        claims = {}
        access = None
        if tenants is not None:  # whose queues they are: one walk of the jobs for the whole batch
            access = self.read(queries.queues_access, {s["queue"] for s in specs.values()}, set(specs))
        refused: list[tuple[str, Forbidden | Conflict]] = []
        for name, spec in specs.items():
            try:
                claims[name] = self.check_write(name, spec, tenants, access)
            except (Forbidden, Conflict) as e:
                refused.append((name, e))
        if refused:
            # Every job refused is listed (a walk fixed them one request at a time), the first
            # named, with its status: nothing is proposed.
            name, e = refused[0]
            errors = [{"job": n, "field": x.field, "message": x.message, "status": x.http_status}
                      for n, x in refused[:node_limits.batch_errors_listed_max]]
            raise type(e)(f"job {name!r}: {e.message}", field=e.field, job=name,
                          **{k: v for k, v in e.extra.items() if k == "tenant"},
                          **({"refused": len(refused), "errors": errors} if len(refused) > 1 else {})) from None
        if tenants is not None:
            self._check_tenant_room(specs)
        piped = any("after" in spec for spec in specs.values())
        if piped:  # pipelines: edges checked against the state and the batch, parents put first
            for name, spec in specs.items():
                try:
                    self.check_edges(name, spec, tenants, specs)
                except InvalidSpec as e:
                    raise InvalidSpec(f"job {name!r}: {e.message}", field=e.field, job=name, invalid=1,
                                      errors=[{"job": name, "field": e.field, "message": e.message}]) from None
            specs = {n: specs[n] for n in pipelines.parents_first({n: specs[n] for n in sorted(specs)})}
        # Gated children whose slots would never meet a parent's (in the batch or stored), either
        # way: each job's anchor as the cut below computes it.
        anchors: dict[str, int] = {}
        parents = self.read(pipelines.with_dependents, list(specs))  # (one read, however large the batch)

        def anchor_of(n: str) -> int:
            if n not in anchors:
                anchors[n] = self._position(n, specs[n]["schedule"], now)[1]
            return anchors[n]
        # The batch's jobs as the check reads them, each anchor computed when read (a triggered job
        # has none: it runs at its parents' slots).
        pos = _Pending(specs, lambda n: anchor_of(n) if "schedule" in specs[n] else 0)
        for name, spec in specs.items():
            gated = "after" in spec and spec.get("match", "same_slot") == "same_slot"
            if not gated and not ("schedule" in spec and name in parents):
                continue
            try:
                self.check_slots_meet(name, spec, anchor_of(name) if "schedule" in spec else 0, tenants, pos)
            except InvalidSpec as e:
                raise InvalidSpec(f"job {name!r}: {e.message}", field=e.field, job=name, invalid=1,
                                  errors=[{"job": name, "field": e.field, "message": e.message}]) from None
        if dry_run:
            return await self._batch_dry_run(jobs_raw, specs, create_only, paused, tenants, now, writer)
        kid = None
        for k, (name, spec) in enumerate(specs.items()):
            if k and k % node_limits.batch_validate_step == 0:
                await asyncio.sleep(0)  # a yield, not a wait (sealing costs ~10 us a value)
            try:
                if sealing.has_clear(spec):
                    kid = kid or await self.seal_key()
                    spec = self.seal_with(kid, name, spec)
            except InvalidSpec as e:
                raise InvalidSpec(f"job {name!r}: {e.message}", field=e.field, job=name, invalid=1,
                                  errors=[{"job": name, "field": e.field, "message": e.message}]) from None
            specs[name] = spec
        memo: dict = {}
        chunks, datas = await batch.cut(specs, create_only, scope(key) if scope is not None else key, now,
                                        lambda name, sched: self._position(name, sched, now, memo), claims, piped,
                                        paused, by)

        # A batch with pipelines goes one command at a time, in order: a chunk's parents are in
        # the state (or its own chunk) when it applies.
        window = asyncio.Semaphore(1 if piped else node_limits.put_jobs_in_flight_max)

        async def one(data: bytes) -> dict:
            async with window:
                return await self.propose_data(data)

        results = await asyncio.gather(*(one(d) for d in datas), return_exceptions=True)
        last = (chunks, results)
        for attempt in range(1, node_limits.stale_replans_max + 1):
            # Items refused as stale (their job fired while the batch was planned) are planned
            # again from the newer view, under a key derived from the request's (a retried
            # request replays each attempt).
            again = {name: specs[name] for name in batch.stale_items(*last)}
            if not again:
                break
            more, datas = await batch.cut(again, create_only, f"{scope(key) if scope is not None else key}~{attempt}",
                                          now, lambda name, sched: self._position(name, sched, now, memo), claims,
                                          piped, paused, by)
            last = (more, await asyncio.gather(*(one(d) for d in datas), return_exceptions=True))
            chunks, results = chunks + more, results + last[1]
        out = batch.merge(jobs_raw, chunks, results, key)
        if paused:
            out["paused"] = True  # (every job of the batch is paused, created or replaced)
        written = [name for name, res in out["jobs"].items() if "error" not in res and name in specs]
        for name, warnings in zip(written, self._told_after_write(
                [specs[name] for name in written], tenants, [bool(out["jobs"][name].get("created")) for name in written])):
            # As a PUT says it: a route to a sink its events will not reach is accepted (a sink
            # may be put after its jobs), with a warning on that job's result.
            if warnings:
                out["jobs"][name]["warnings"] = warnings
        return out

    def _check_tenant_room(self, specs: dict[str, dict]) -> None:
        """A limited token's batch that would take a tenant past jobs_per_tenant_max is refused
        whole, before any command (apply refuses each command that would: core/jobs.py).
        :raises LimitExceeded:"""
        full = self.read(tenant_overflow, list(specs.items()))  # (check_write marked them LIMITED)
        if full is not None:
            raise LimitExceeded(tenant_full(*full), field="jobs")

    async def _batch_dry_run(self, jobs_raw: dict, specs: dict[str, dict], create_only: bool, paused: bool,
                             tenants: frozenset | None, now: int, writer: bool = True) -> dict:
        """``POST /v1/jobs:batch`` with ``dry_run``: what the batch would do to each job, proposing
        nothing. ``specs`` passed every check the batch makes before it seals (validation,
        tenancy, edges, slots); the sealing is checked too (this node can seal, and each sealed
        spec fits a command), under the key it would use, without naming one.

        Each job's result: ``action`` ``create``, ``replace`` (with ``changes``: ``field``, and
        ``from`` and ``to`` as a read shows them, each left out where the field is absent),
        ``unchanged`` (its spec as stored), or ``conflict`` (``create_only`` and it exists, with
        the ``error`` the batch would answer); ``pauses`` when ``paused`` would pause it,
        ``paused_in_cluster`` when it is paused (and stays so); its
        ``next_slot`` as the batch would store it; its ``warnings``."""
        fp = self.fingerprint
        kid = None
        memo: dict = {}
        out: dict[str, dict] = {}
        counts = {"create": 0, "replace": 0, "unchanged": 0, "conflict": 0}
        budget = [node_limits.dry_run_values_bytes_max]  # the values the answer still shows
        told: list[tuple[dict, dict]] = []  # (result, spec) of the jobs whose warnings it says
        for k, name in enumerate(jobs_raw):
            if k and k % node_limits.batch_validate_step == 0:
                await asyncio.sleep(0)  # a yield, not a wait
            spec = specs[name]
            try:
                if sealing.has_clear(spec):
                    kid = kid or self.seal_key_now()[0]
                    self.seal_with(kid, name, spec)  # (its size; the sealed copy is not kept)
            except InvalidSpec as e:
                raise InvalidSpec(f"job {name!r}: {e.message}", field=e.field, job=name, invalid=1,
                                  errors=[{"job": name, "field": e.field, "message": e.message}]) from None
            old = self.read(queries.job, name)
            res: dict = {}
            if old is None:
                res["action"] = "create"
            elif create_only:
                res["action"] = "conflict"
                res["error"] = {"code": "conflict", "message": f"job {name!r} exists", "field": "name"}
            else:
                diff = [_change(path, a, b, budget)
                        for path, a, b in specdiff.changes(spec_view(old["spec"], fp), spec_view(spec, fp))]
                was, will = bool(old["spec"].get(LIMITED)), bool(spec.get(LIMITED))
                if was != will and writer:  # (docs/security.md: a limited token's job stays held to its tenant's policy)
                    diff.append({"field": "limited", "from": was, "to": will})
                res["action"] = "replace" if diff else "unchanged"
                if diff:
                    res["changes"] = diff
            counts[res["action"]] += 1
            if res["action"] != "conflict":
                if paused and (old is None or not old["paused"]):
                    res["pauses"] = True
                elif old is not None and old["paused"]:
                    res["paused_in_cluster"] = True  # (the batch leaves it paused: a drift to see)
                res["next_slot"] = schedule.iso(self._position(name, spec.get("schedule"), now, memo)[2])
                told.append((res, spec))
            out[name] = res
        # The warnings the batch would answer (the live workers read once for them all).
        live = self._live_workers()
        for (res, spec), why in zip(told, queries.waits_for_worker(live, [sp for _, sp in told])):
            # (a past one-shot at: of a job made, or whose schedule the write changes)
            moved = res["action"] == "create" or any(c["field"].startswith("schedule") for c in res.get("changes", ()))
            warnings = self._warnings(spec, tenants, why, live, moved)
            if warnings:
                res["warnings"] = warnings
        answer = {"dry_run": True, "jobs": out, "create": counts["create"], "replace": counts["replace"],
                  "unchanged": counts["unchanged"], "conflicts": counts["conflict"]}
        if budget[0] < 0:
            answer["values_left_out"] = True
        if paused:
            answer["paused"] = True
        return answer

    def check_edges(self, name: str, spec: dict, tenants: frozenset | None,
                    pending: dict | None = None) -> None:
        """A job's ``after`` against this replica (apply checks the same against its own, so a
        race cannot store a cycle): unknown parents and cycles are 422 naming the edge, and so
        is a parent in a tenant the token may not see (a token limited to tenants)."""
        if "after" not in spec:
            return
        try:
            self.read(pipelines.check_edges, name, spec, pending)
        except InvalidSpec as e:
            if tenants is None or not e.message.startswith("makes a cycle"):
                raise
            # (the jobs on the cycle's path may be other tenants': not named to this token)
            raise InvalidSpec(f"makes a cycle: {name} -> ... -> {name}", field=e.field) from None
        if tenants is None:
            return
        for i, e in enumerate(spec["after"]):
            sp = (pending or {}).get(e["job"])
            if sp is None:
                job = self.read(queries.job, e["job"])
                sp = job["spec"] if job is not None else None
            if sp is not None and sp["tenant"] not in tenants:
                # The same answer as for a job that does not exist: a token limited to tenants
                # learns nothing of others' jobs.
                raise InvalidSpec(f"names no job: {e['job']} -> {name} (create {e['job']} first)",
                                  field=f"after[{i}].job")

    def check_slots_meet(self, name: str, spec: dict, anchor: int, tenants: frozenset | None,
                         pending: "dict[str, tuple[dict, int]] | _Pending | None" = None) -> None:
        """A gated job (``match: same_slot``) waits, slot by slot, for its parents' runs of the
        same slot: one whose slots can never be a parent's would record every slot
        ``upstream_timeout``, a day later by default, and say nothing before (pipelines.slots_never_meet
        tells the sure cases). Refused (422) as the child (``after[i].job``), and as a parent
        whose new schedule would part it from such a child (``schedule``). ``pending``: jobs of
        the same batch, name -> (spec, anchor). A job without a schedule of its own (triggered:
        it runs at its parents' slots) passes its parents' slots on: a gated child of it is held
        to them, and a triggered job's new parents to its gated children."""

        def stored(n: str) -> tuple[dict, int] | None:
            got = (pending or {}).get(n)
            if got is None:
                job = self.read(queries.job, n)
                got = None if job is None else (job["spec"], job["anchor"])
            return got

        def named(n: str) -> str:
            return n if self.visible_jobs([n], tenants) else "a job of another tenant"

        was = self.read(queries.job, name)
        if "schedule" not in spec:
            if "after" not in spec or spec.get("match", "same_slot") != "same_slot" \
                    or (was is not None and "schedule" not in was["spec"] and was["spec"].get("after") == spec["after"]
                        and was["spec"].get("match") == spec.get("match")):
                return  # (a triggered job that was one, with the same parents: nothing moves)
            takers = self._slot_takers(name, stored)
            for i, e in enumerate(spec["after"] if takers else ()):
                for via, root in self._slot_sources(e["job"], stored):
                    for kid, child in takers:
                        why = pipelines.slots_never_meet(child[0], child[1], root[0], root[1])
                        if why is not None:
                            raise InvalidSpec(
                                f"{named(kid)} waits slot by slot for this job, which has no schedule of its own and "
                                f"would run at the slots of {named(via)}: they never meet: {why}",
                                field=f"after[{i}].job")
            return
        # Only what this put changes: a pair stored before the check (or by a batch that made
        # it together) does not block other edits of either job.
        same_slots = was is not None and was["spec"].get("schedule") == spec["schedule"] and was["anchor"] == anchor
        same_edges = same_slots and was["spec"].get("after") == spec.get("after") \
            and was["spec"].get("match") == spec.get("match")
        for i, e in enumerate(() if same_edges else spec.get("after", ())):
            # A parent without a schedule of its own (triggered) runs at its own parents' slots:
            # the child is held to the scheduled jobs it takes its slots from, through it.
            for via, root in self._slot_sources(e["job"], stored):
                why = pipelines.slots_never_meet(spec, anchor, root[0], root[1])
                if why is not None:
                    through = "" if via == e["job"] else \
                        f" ({e['job']} has no schedule of its own: it runs at the slots of {named(via)})"
                    raise InvalidSpec(f"its slots never meet those of {e['job']}, which it waits for slot by slot "
                                      f"(match same_slot){through}: {why}", field=f"after[{i}].job")
        for kid, child in () if same_slots else self._slot_takers(name, stored):
            why = pipelines.slots_never_meet(child[0], child[1], spec, anchor)
            if why is not None:
                raise InvalidSpec(f"its slots would never meet those of {named(kid)}, which waits for it slot by "
                                  f"slot (match same_slot): {why}", field="schedule")

    #: How many jobs the walks through triggered jobs (no schedule of their own) look at, at most.
    _SLOT_WALK_MAX = 256

    def _slot_sources(self, parent: str, stored) -> list[tuple[str, tuple[dict, int]]]:
        """The scheduled jobs whose slots ``parent``'s runs take: itself when it has a schedule,
        else, through each job of its ``after`` that has none either and waits slot by slot
        (match same_slot), the scheduled ones it reaches. (name, (spec, anchor)) each."""
        return self._slot_walk([parent], stored, lambda n, spec: [e["job"] for e in spec.get("after", ())])

    def _slot_takers(self, parent: str, stored) -> list[tuple[str, tuple[dict, int]]]:
        """The scheduled jobs that wait slot by slot for ``parent``'s runs: its dependents with a
        schedule, and through each dependent without one (triggered, match same_slot: it runs
        at ``parent``'s slots), theirs. (name, (spec, anchor)) each."""
        return self._slot_walk(self.read(pipelines.dependents, parent), stored,
                               lambda n, spec: self.read(pipelines.dependents, n), seen={parent})

    def _slot_walk(self, start: list[str], stored, onward, seen: set[str] | None = None) -> list[tuple[str, tuple[dict, int]]]:
        """From the jobs ``start``, through those without a schedule that wait slot by slot
        (``onward(name, spec)``: the jobs to go on to from one), the scheduled jobs reached,
        (name, (spec, anchor)) each. A job not (yet) stored, or a walk past _SLOT_WALK_MAX jobs,
        adds nothing (not told for sure)."""
        out: list[tuple[str, tuple[dict, int]]] = []
        seen = set(seen or ()) | set(start)
        todo = list(start)
        while todo and len(seen) <= self._SLOT_WALK_MAX:
            n = todo.pop()
            got = stored(n)
            if got is None:
                continue
            if "schedule" in got[0]:
                out.append((n, got))
            elif got[0].get("match", "same_slot") == "same_slot":
                for m in onward(n, got[0]):
                    if m not in seen:
                        seen.add(m)
                        todo.append(m)
        return out

    async def delete_job(self, name: str, rid: str | None, force: bool = False,
                         tenants: frozenset | None = None) -> dict:
        check_name(name)
        replayed = tenants is not None and self.read(queries.request_was, rid, f"delete_job:{name}")
        if tenants is not None and not replayed:
            if self.read(queries.foreign_runs, name, tenants):
                # A job moved here from another tenant keeps that tenant's runs in its history
                # (their dead runs too): a delete would take them along.
                raise Forbidden(f"job {name!r} holds runs of another tenant, made before it moved to this one, "
                                "which a delete would remove: an admin deletes it", field="name", tenant=None)
        if tenants is not None and not force and not replayed:
            # The same refusal apply gives (pipelines.check_delete), naming only this token's
            # tenants' jobs among the dependents.
            kids = self.read(pipelines.dependents, name)
            if kids:
                shown = self.visible_jobs(kids, tenants)
                hidden = len(kids) - len(shown)
                named = ", ".join(shown[:20]) + (" ..." if len(shown) > 20 else "")
                raise Conflict(f"job {name!r} has dependents: {named or ''}"
                               f"{' and ' if named and hidden else ''}{f'{hidden} of other tenants' if hidden else ''}; "
                               "delete them first, or delete with ?force=true (their slots are then recorded "
                               "dependency_missing)", field="name", dependents=shown[:100])
        res = await self.propose(commands.delete_job(self.clock.now_ms(), rid or new_request_id(), name=name,
                                                     force=force))
        body: dict = {"job": name, "deleted": True}
        ended = res.get("runs_ended")
        if ended:
            body["runs_ended"] = ended
            if ended.get("running"):
                body["warnings"] = [f"{ended['running']} running run(s) lost their lease with the job: each one's worker "
                                    "stops it (a shell, python or http run is killed) and it is not run again; its "
                                    "record went with the job's history"]
        return self._out(res, body)

    async def pause_job(self, name: str, rid: str | None, by: str | None = None, note: str | None = None) -> dict:
        """Pause a job; ``by`` (the token id) and ``note`` are kept as why, shown by GET."""
        check_name(name)
        res = await self.propose(commands.pause_job(self.clock.now_ms(), rid or new_request_id(), name=name,
                                                    by=by, note=note))
        return self._out(res, {"job": name, "paused": True, "held": res.get("held", 0)})

    async def resume_job(self, name: str, rid: str | None, catch_up: bool = False) -> dict:
        """Resume a paused job. By default the slots that fell due while it was paused are
        recorded as skipped (reason ``paused``) and it resumes from now; with ``catch_up`` its
        misfire policy decides for them instead. The runs the pause held are released (those
        whose slot came meanwhile: skipped, unless ``catch_up``)."""
        check_name(name)
        # The plan is made from this replica's view of the job, which may lag the log (a follower
        # behind, a node replaying its journal after a restart): without the barrier, a resume
        # sent there answered a definite 404 for a job that existed (fault-injection seed
        # 16325040, after a whole-cluster restart).
        await self.raft.barrier(timeout_s=self.propose_timeout_s)
        now = self.clock.now_ms()
        job = self.read(queries.job, name)
        if job is None:
            raise NotFound(f"no job named {name!r}", field="name")
        spec, cursor, anchor, gen = job["spec"], job["cursor"], job["anchor"], job["gen"]
        # A triggered job (pipelines) has no slot of its own to record: its slots while paused
        # were recorded paused as its parents ended, so there is nothing to plan; ``catch_up``
        # still decides the runs its pause held (a job replaced by a triggered one while paused
        # may hold runs its schedule fired ahead).
        plan = None
        if not catch_up and "schedule" in spec:
            plan = dict(gen=gen, **policy.plan_resume(spec, anchor, cursor, now))
        res = await self.propose(commands.resume_job(now, rid or new_request_id(), name=name, catch_up=catch_up,
                                                     plan=plan))
        return self._out(res, {"job": name, "paused": False, "released": res.get("released", 0),
                               "skipped": res.get("skipped", 0), "recorded": res.get("recorded", 0)})

    async def trigger_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        res = await self.propose(commands.trigger_job(self.clock.now_ms(), rid or new_request_id(), name=name))
        return self.with_upstream_warning(name, res["run"],
                                          self._out(res, {"job": name, "run": res["run"], "state": res["state"]}))

    def with_upstream_warning(self, name: str, run_id: str, body: dict) -> dict:
        """``body``, with a warning when the run of a job that runs after others (pipelines) has
        no parents' outcomes: a run by hand, which its handler reads as ``ctx.upstream`` None
        (``RAFTSCHED_UPSTREAM`` unset), where a handler written for its parents' results fails."""
        job = self.read(queries.job, name)
        if job is None or "after" not in job["spec"]:
            return body
        run = self.read(queries.run, run_id)
        if run is not None and run.get("upstream") is None:
            parents = ", ".join(e["job"] for e in job["spec"]["after"])
            body["warnings"] = [f"{name} runs after {parents}: this run has no parents' outcomes (ctx.upstream is "
                                "None, RAFTSCHED_UPSTREAM unset); to run the chain for a slot, trigger "
                                f"{parents} with it (--slot S --propagate, and --rerun --downstream for a slot that "
                                "ran), or backfill them (--cascade children)"]
        return body

    async def ping(self, name: str, body, rid: str | None) -> dict:
        """A heartbeat job's ping: ``{"status": "start"|"success"|"fail", "slot": ISO time or ms,
        optional}`` (core/deadlines.py apply_ping)."""
        check_name(name)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise InvalidSpec("the body must be a JSON object: {\"status\": \"start\"|\"success\"|\"fail\"}", field=None)
        for k in body:
            if k not in ("status", "slot"):
                raise InvalidSpec("unknown field; allowed: slot, status", field=str(k))
        status = body.get("status", "success")
        if status not in deadlines.PING_STATUSES:
            raise InvalidSpec(f"must be one of {', '.join(deadlines.PING_STATUSES)}", field="status")
        slot = body.get("slot")
        if slot is not None:
            if isinstance(slot, str):
                slot = schedule.parse_iso_ms(slot, "slot")
            elif isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot <= limits.time_ms_max:
                raise InvalidSpec("must be an ISO-8601 time or ms since the epoch", field="slot")
        rid = rid or new_request_id()
        if slot is None:
            try:
                slot = await self._ping_slot(name, status)
            except Conflict:
                # The slot at hand ended: a ping sent twice, or a retry of one whose answer was
                # lost (its Idempotency-Key): that one gets the first answer, as every retried
                # request does (the request log's, which the proposer reads first).
                again = commands.ping(self.clock.now_ms(), rid, name=name, status=status, slot=None)
                seen = self.read(queries.replayed, again)
                if seen is None:
                    raise
                res = Proposer.result(seen, again)  # (the first answer's error, raised, when it was one)
                return self._out(res, {"job": name, "run": res["run"], "state": res["state"]})
        try:
            res = await self.propose(commands.ping(self.clock.now_ms(), rid, name=name,
                                                   status=status, slot=slot))
        except NotFound as e:
            if e.field != "slot" or slot is None:
                raise
            # (apply's text says the slot in ms, and stays so: it is in the replicated answers)
            raise NotFound(f"job {name} has no run for slot {schedule.iso(slot)}", field="slot") from None
        return self._out(res, {"job": name, "run": res["run"], "state": res["state"]})

    async def _ping_slot(self, name: str, status: str) -> int | None:
        """The slot a ping without one is for (deadlines.ping_target), after waiting, at most
        PING_AHEAD_MS and a second, for a slot due within PING_AHEAD_MS to be committed: a
        reporter whose clock runs a little ahead of the cluster's pings its slot early. None:
        apply's own rule decides (and says why no run takes the ping)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadlines.PING_AHEAD_MS / 1000 + 1.0
        while True:
            slot, wait = self.read(deadlines.ping_target, name, status, self.clock.now_ms())
            if not wait or loop.time() >= give_up:
                return slot
            await asyncio.sleep(0.02)  # ok-sleep: the slot is committed within about a second

    def list_deadlines(self, state: str | None, job: str | None, since: int | None, limit: int,
                       tenants: frozenset | None = None) -> dict:
        """Slots' deadline records, newest first (core/deadlines.py listing)."""
        if job is not None:
            check_name(job, "job")
        rows = self.read(deadlines.listing, state, job, since, tenants, limit)
        return {"deadlines": [deadline_view(d) for d in rows]}

    # ------------------------------------------------------------------ queues and tenants
    async def put_queue(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> dict:
        """Configure queue ``name``; a token limited to ``tenants`` configures only theirs, and a
        queue it configures becomes theirs (tenancy.check_queue)."""
        q = bodies.validate_queue(name, body)
        if tenants is not None:
            tenancy.check_queue(self, tenants, name, q)
        res = await self.propose(commands.put_queue(self.clock.now_ms(), rid or new_request_id(), name=name,
                                                    fields=q))
        out = {"queue": name, **q}
        owners = self.read(queries.queue_access, name, None)[0]
        if owners is not None:
            out["tenants"] = owners
        return self._out(res, out)

    async def queue_walks(self) -> tuple[dict[str, tuple[int, int | None]], dict[str, int]]:
        """What ``GET /v1/queues`` counts by walking the queues' heaps: queue -> (ready runs,
        the oldest one's wait), and queue -> runs no live worker may take for their placement
        (docs/workers.md). The heaps are copied under the replica's lock and walked outside it
        and off the loop, one walk for the callers that arrive while it runs (node/walks.py)."""
        return await self._queue_walk.run(self._queue_walk_now)

    def _queue_walk_now(self) -> tuple[dict[str, tuple[int, int | None]], dict[str, int]]:
        """In the walks' thread: the copy under the lock, then the walk outside it."""
        return queries.queue_walk(self.read(queries.queue_walk_inputs, self.clock.now_ms()))

    def list_queues(self, tenants: frozenset | None,
                    walked: tuple[dict[str, tuple[int, int | None]], dict[str, int]]) -> dict:
        """Every queue's figures; with ``tenants``, of the queues their jobs use only.
        ``walked``: :meth:`queue_walks`, taken first (off the loop)."""
        ready, unplaceable = walked
        qs = self.read(queries.queue_stats, self.clock.now_ms(), ready)
        if tenants is not None:
            mine = self.read(queries.queues_of, tenants)
            qs = [q for q in qs if q["name"] in mine]
        for q in qs:
            q["unplaceable"] = unplaceable.get(q["name"], 0)
        return {"queues": qs}

    async def put_tenant(self, name: str, body, rid: str | None) -> dict:
        """Set a tenant's rate limit, policy and/or default routes: one command each
        (``put_tenant``, ``put_tenant_policy``, ``put_tenant_notify``). The request id is the
        first present of the rate's, the policy's and the routes' own; the others' are derived
        from it, so a retry of the same request applies each once. Before anything is proposed,
        every part's id is looked up: a key used before for another request (another route, or
        this route with other parts) is refused whole, changing nothing. The policy goes first:
        it is the one a valid body can still have refused (a new policy past
        tenant_policies_max), and a refused request must have changed nothing."""
        routes = None
        if isinstance(body, dict) and "notify" in body:  # its jobs' default routes (node/notify.py)
            check_name(name, "tenant", limits.tenant_name_chars_max)
            bodies.check_body(body, bodies.TENANT_FIELDS)  # (an unknown field first, as without notify)
            body = dict(body)
            routes = validate_routes(body.pop("notify"))
        rate, pol = bodies.validate_tenant_body(name, body) if body or routes is None else (None, None)
        rid = rid or new_request_id()

        def part_rid(prefix: str, owner: bool) -> str:
            return rid if owner else prefix + hashlib.blake2b(rid.encode("utf-8", "backslashreplace"),
                                                              digest_size=16).hexdigest()
        now = self.clock.now_ms()
        parts: list[tuple[dict, dict]] = []  # (command, what its success adds to the answer)
        if pol is not None:
            parts.append((commands.put_tenant_policy(now, part_rid("tp-", rate is None), name=name, fields=pol),
                          {"policy": policy_view(pol)}))
        if routes is not None:
            parts.append((commands.put_tenant_notify(now, part_rid("tn-", rate is None and pol is None), name=name,
                                                     notify=routes), {"notify": routes}))
        if rate is not None:
            parts.append((commands.put_tenant(now, rid, name=name, fields=rate),
                          {"rate_per_s": rate["rate_milli"] / 1000, "burst": rate["burst"]}))
        for cmd, _ in parts:
            seen = self.raft.read(queries.replayed, cmd)
            if seen is not None and not seen.get("ok"):
                Proposer.result(seen, cmd)  # raises: the key is another request's
        out: dict = {}
        for cmd, adds in parts:
            out = self._out(await self.propose(cmd), dict(out, **adds))
        return {"tenant": name, **{k: out[k] for k in ("notify", "rate_per_s", "burst", "policy", "duplicate") if k in out}}

    async def delete_tenant(self, name: str, rid: str | None) -> dict:
        check_name(name, "tenant", limits.tenant_name_chars_max)
        res = await self.propose(commands.delete_tenant(self.clock.now_ms(), rid or new_request_id(), name=name))
        return self._out(res, {"tenant": name, "deleted": True})

    def list_tenants(self, tenants: frozenset | None = None) -> dict:
        """Every tenant with a rate limit, a policy or default routes (of ``tenants`` only, when given)."""
        now = self.clock.now_ms()
        return {"tenants": [tenant_view(t, now) for t in self.read(queries.tenant_configs)
                            if tenants is None or t["name"] in tenants]}

    def get_tenant(self, name: str) -> dict:
        """Tenant ``name``'s rate limit, policy and the policy its limited tokens' jobs are held to."""
        check_name(name, "tenant", limits.tenant_name_chars_max)
        t = self.read(queries.tenant_config, name)
        return dict(tenant_view(t, self.clock.now_ms()), effective_policy=policy_view(t["effective"]))

    # ------------------------------------------------------------------ dead-letter queue
    def list_dlq(self, queue: str | None, limit: int, tenants: frozenset | None = None) -> dict:
        out = [run_view(r) for r in self.read(queries.dead_runs, queue)
               if tenants is None or r.get("tenant") in tenants]
        # Newest first by the finished_at text the API shows, as this list always was (the text
        # of a whole second sorts after that second's ms: an order to revisit, not here).
        out.sort(key=lambda r: (r["finished_at"] or "", r["id"]), reverse=True)
        return {"runs": out[:limit], "total": len(out)}

    def get_dlq(self, run_id: str) -> dict:
        run = self.read(queries.dead_run, run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r} in a dead-letter queue", field="run")
        return run_view(run)

    async def dlq_requeue(self, run_id: str, rid: str | None, tenants: frozenset | None = None) -> dict:
        model.check_run_id(run_id)
        res = await self.propose(commands.dlq_requeue(self.clock.now_ms(), rid or new_request_id(), run=run_id))
        out = {"run": run_id, "state": res["state"], "attempt": res["attempt"]}
        rearmed = res.get("rearmed") or []  # pipelines: the children's slots that wait for it again
        if tenants is not None:  # (a child job of another tenant's is not named)
            shown = set(self.visible_jobs({r.rpartition("@")[0] for r in rearmed}, tenants))
            rearmed = [r for r in rearmed if r.rpartition("@")[0] in shown]
        if rearmed:
            out["rearmed"] = rearmed
        return self._out(res, out)

    async def dlq_delete(self, run_id: str, rid: str | None) -> dict:
        model.check_run_id(run_id)
        res = await self.propose(commands.dlq_delete(self.clock.now_ms(), rid or new_request_id(), run=run_id))
        return self._out(res, {"run": run_id, "deleted": True})

    # ------------------------------------------------------------------ a run cancelled
    async def cancel_run(self, run_id: str, rid: str | None, reason: str | None = None) -> dict:
        """``POST /v1/runs/{id}/cancel``: end a queued run (recorded skipped, reason
        ``cancelled``) or a running one (failed; its lease ends, so its worker stops it at its
        next heartbeat): core/cancel.py. ``reason``: why, in the words of who asked (the audit
        log names the token).

        :raises NotFound: no such run. :raises Conflict: it ended already (``state``), is dead,
            or is a heartbeat job's slot waiting for its ping."""
        model.check_run_id(run_id)
        res = await self.propose(commands.cancel_run(self.clock.now_ms(), rid or new_request_id(), run=run_id,
                                                     reason=reason))
        out = {"run": run_id, "state": res["state"], "was": res["was"]}
        if "token" in res:  # a worker's lease ended (a heartbeat job's run a ping started holds none)
            out.update(worker=res["worker"], token=res["token"])
        return self._out(res, out)

    async def cancel_job_runs(self, name: str, rid: str | None, reason: str | None = None, running: bool = False,
                              tenants: frozenset | None = None, after: str | None = None) -> dict:
        """``POST /v1/jobs/{name}/cancel``: end the job's queued runs (and with ``running`` its
        running ones), oldest first, after run ``after`` in its history (the ``next`` of the
        answer before), at most node_limits.cancel_job_runs_max: each as ``POST
        /v1/runs/{id}/cancel`` ends one (core/cancel.py apply_cancel_runs), in commands of
        limits.run_refs_per_command. A run that started (without ``running``) or ended between
        this node's read and the command is passed over. With ``tenants`` (a limited token), the
        runs of those tenants only.

        Applied twice, a command passes over what it ended, so only the first command carries
        the request id (``rid``, the client's key; a million-run cancel's nine thousand commands
        had pushed every other out of the request log), with the newest entry of the job's
        history this node read (``upto``); it is committed before the others are proposed. A
        retry that finds the key remembered (before proposing, or as the answer to its own first
        command: the first attempt's got there first) walks the history no further than
        ``upto``, ends what the first attempt left (its other commands failed, or it was cut
        short), and says ``duplicate``: the runs fired or triggered since are not the retried
        request's. A first attempt that found nothing to cancel proposed nothing, and its retry
        is a new request.

        :returns: ``{"job", "cancelled": n, "runs": [ids], "passed": [{"run", "state"}], "more",
            "next"}``, ``more`` (with ``next``, the cursor to send as ``after``) when the walk of
            the job's history stopped before its end; ``duplicate`` on a retry (above).
        :raises NotFound: no such job. :raises RaftschedError: a command's failure (the ones
            applied beside it stay: asking again cancels the rest)."""
        if after is not None and not after.startswith(f"{name}@"):
            # A cursor is a run id of this job (an answer's next): another's, or none at all, would
            # start the walk from the oldest run and cancel what the requests before left alone.
            raise InvalidSpec(f"is not a run id of job {name!r} ({name}@...): send the next of the answer before",
                              field="after")
        await self.read_barrier()  # (the runs queued up to now, not a lagging replica's view)
        walk = (name, running, tenants, node_limits.cancel_job_runs_max, node_limits.cancel_job_scan_max, after)
        upto: tuple[str | None, int | None] = (None, None)
        duplicate = False
        if rid is not None:
            seen = self.read(queries.replayed, commands.cancel_runs(0, rid, runs=[name], name=name))
            if seen is not None:
                upto, duplicate = self._cancel_remembered(seen, name, rid)
                rid = None
        ids, nxt, newest, newest_at = self.read(queries.cancel_walk, *walk, *upto)
        now, step = self.clock.now_ms(), limits.run_refs_per_command

        def cut(ids: list[str]) -> list[list[str]]:
            return [ids[k:k + step] for k in range(0, len(ids), step)]
        parts = cut(ids)
        first: list[object] = []
        if rid is not None and parts:
            # The key's command, committed alone first: a retry then finds it whenever any of
            # this attempt applied (a first part that failed while others applied left nothing
            # to find).
            cmd = commands.cancel_runs(now, rid, runs=parts[0], reason=reason, running=running, name=name,
                                       upto=newest, upto_at=newest_at)
            res = await self.propose(cmd)
            if res.get("duplicate"):
                # Another attempt of this request got there first (the client's retry overlapped
                # it): this one is the retry, walked to that attempt's newest entry.
                upto, duplicate = self._cancel_remembered(res, name, rid)
                ids, nxt, _, _ = self.read(queries.cancel_walk, *walk, *upto)
                parts = cut(ids)
            else:
                first = [res]
        results = first + list(await asyncio.gather(*(
            self.propose(commands.cancel_runs(now, None, runs=part, reason=reason, running=running))
            for part in parts[len(first):]), return_exceptions=True))
        done: list[str] = []
        passed: list[dict] = []
        failed = None
        for part, res in zip(parts, results):
            if isinstance(res, BaseException):
                failed = failed or res
                continue
            assert isinstance(res, dict)
            over = {r for r, _st in res["passed"]}
            done += [r for r in part if r not in over]
            passed += [{"run": r, "state": st} for r, st in res["passed"]]
        if failed is not None:
            if not done or not isinstance(failed, RaftschedError):
                raise failed
            # Some parts applied: said with the error (asking again ends what is left).
            raise type(failed)(f"{failed.message} ({len(done)} run(s) of job {name!r} were cancelled beside it: "
                               "ask again to cancel the rest)", failed.field, **{**failed.extra, "cancelled": len(done)})
        out = {"job": name, "cancelled": len(done), "runs": done, "passed": passed, "more": nxt is not None}
        if nxt is not None:
            out["next"] = nxt
        if duplicate:
            out["duplicate"] = True
        return out

    @staticmethod
    def _cancel_remembered(seen: dict, name: str, rid: str) -> tuple[tuple[str | None, int | None], bool]:
        """What a job's cancel retried with its key reads from the first attempt's answer
        (``seen``, from the request log): ``((upto, upto_at), True)``; the first answer's refusal
        (or the key used for another request) raised. An answer of a node before 2026-12-08 holds
        no ``upto``: ``((None, None), False)``, a new request (as such a node made of every retry)."""
        Proposer.result(seen, {"op": "cancel_runs", "rid": rid, "name": name})  # raises a refusal
        if "upto" not in seen:
            return (None, None), False
        upto, at = seen["upto"], seen.get("upto_at")
        return ((upto if isinstance(upto, str) else ""), at if type(at) is int else None), True

    # ------------------------------------------------------------------ the fencing counter
    def fencing(self) -> dict:
        """``GET /v1/cluster/fencing``: the highest token granted (the next is above it)."""
        return {"fencing_token": self.read(queries.fencing_token)}

    async def fencing_floor(self, body, rid: str | None) -> dict:
        """``POST /v1/cluster/fencing``: the counter raised to at least ``at_least``."""
        at_least = bodies.validate_fencing_floor(body)
        res = await self.propose(commands.fencing_floor(self.clock.now_ms(), rid or new_request_id(), at_least=at_least))
        return self._out(res, {"fencing_token": res["fencing_token"], "raised": res["raised"]})

    # ------------------------------------------------------------------ locks
    async def lock_acquire(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> dict:
        f = bodies.validate_lock_acquire(name, body)
        if tenants is not None:
            f = dict(f, tenants=sorted(tenants))
        res = await self.propose(commands.lock_command("lock_acquire", self.clock.now_ms(), rid or new_request_id(),
                                                       name=name, fields=f))
        return self._out(res, {"lock": name, "owner": f["owner"], "token": res["token"],
                               "expires_at": schedule.iso(res["deadline"])})

    def _lock_tenancy(self, name: str, f: dict, tenants: frozenset | None) -> None:
        """A token limited to ``tenants`` renews or releases only a lock a token of its tenants
        took: a lock's fencing token is shown to every reader (and tokens are one counter), so the
        token alone proves nothing. Refused as a token that does not hold it (409), which says
        nothing of whose it is. A lock changes hands only with a new token, which apply checks."""
        if tenants is None:
            return
        lk = self.read(queries.lock, name)
        if lk is not None and not set(lk.get("tenants") or ("\0",)) <= tenants:
            raise Conflict(f"token {f.get('token')} does not hold lock {name!r}", field="token",
                           holder=lk["owner"], expires_at_ms=lk["deadline"])

    async def lock_renew(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> dict:
        f = bodies.validate_lock_renew(name, body)
        self._lock_tenancy(name, f, tenants)
        if tenants is not None:
            f = dict(f, tenants=sorted(tenants))  # (apply checks it too: this replica may lag)
        res = await self.propose(commands.lock_command("lock_renew", self.clock.now_ms(), rid or new_request_id(),
                                                       name=name, fields=f))
        return self._out(res, {"lock": name, "token": res["token"], "expires_at": schedule.iso(res["deadline"])})

    async def lock_release(self, name: str, body, rid: str | None, tenants: frozenset | None = None) -> dict:
        f = bodies.validate_lock_release(name, body)
        self._lock_tenancy(name, f, tenants)
        if tenants is not None:
            f = dict(f, tenants=sorted(tenants))
        res = await self.propose(commands.lock_command("lock_release", self.clock.now_ms(), rid or new_request_id(),
                                                       name=name, fields=f))
        return self._out(res, {"lock": name, "released": True})

    def get_lock(self, name: str) -> dict:
        check_name(name, "name", limits.lock_name_chars_max)
        lk = self.read(queries.lock, name)
        if lk is None:  # held until released or expired by the leader's reaper
            raise NotFound(f"lock {name!r} is not held", field="name")
        return lock_view(name, lk)

    # ------------------------------------------------------------------ preview / explain
    def _job_spec(self, name: str) -> tuple[dict, int]:
        check_name(name)
        job = self.read(queries.job, name)
        if job is None:
            raise NotFound(f"no job named {name!r}", field="name")
        return job["spec"], job["anchor"]

    # Previews and explains compute slots (core.schedule), which a read-scope request should not do
    # on the event loop: however a schedule's slots are spread, the loop keeps serving the API,
    # the trigger and the lease renewals meanwhile. Like a backfill's slots (node/backfills.py),
    # in the loop's default executor: the walks' one thread (node/walks.py) is for walks of the
    # replica, which a burst of previews should not queue behind.
    async def preview_job(self, name: str, count: int, after_ms: int | None) -> dict:
        spec, anchor = self._job_spec(name)
        if "schedule" not in spec:  # a triggered job: its parents' outcomes make its slots
            return {"job": name, "slots": [], "triggered_by": spec["after"]}
        after = self.clock.now_ms() if after_ms is None else after_ms
        return {"job": name, "slots": await asyncio.to_thread(preview.preview, spec, anchor, after, count)}

    async def preview_spec(self, raw, count: int, name: str | None = None, after_ms: int | None = None) -> dict:
        return await asyncio.to_thread(_preview_spec, raw, count, self.clock.now_ms(), name, after_ms)

    async def explain_job(self, name: str, body, tenants: frozenset | None = None) -> dict:
        spec, anchor = self._job_spec(name)
        if not isinstance(body, dict):
            raise BadRequest("send {\"down_from\": ISO time, \"down_to\": ISO time} or {\"slot\": ISO time}")
        unknown = next((k for k in body if k not in ("down_from", "down_to", "slot")), None)
        if unknown is not None:  # a misspelt field is refused, not ignored
            raise BadRequest("unknown field; allowed: down_from, down_to, slot", field=str(unknown)[:64])
        window = [k for k in ("down_from", "down_to") if k in body]
        if "slot" in body and window:
            # (one question or the other: the window's answer said nothing of the slot)
            raise BadRequest("give slot (why that slot met or missed its deadline) or down_from and down_to (an "
                             "outage window), not both", field="slot")
        if "slot" in body:
            return self.explain_slot(name, body["slot"], tenants)
        if not window and "schedule" not in spec:
            # A triggered job has no slot of its own for an outage to miss: what it runs after, and
            # its slots waiting for them, asked without a window made up for it (a walk)
            return self._explain_triggered(name, spec)
        got = []
        for k in ("down_from", "down_to"):  # (each in turn: the first wrong one is named)
            if k not in body:
                raise BadRequest("is required: the outage window is down_from and down_to (ISO times); or give "
                                 "slot alone", field=k)
            try:
                got.append(schedule.parse_iso_ms(body[k], k))
            except InvalidSpec as e:
                raise BadRequest(e.message, field=e.field) from None
        lo, hi = got
        if hi <= lo:
            raise BadRequest("must be after down_from", field="down_to")
        if hi - lo > 366 * 86_400_000:
            raise BadRequest("an outage window is at most 366 days", field="down_to")
        if "schedule" not in spec:  # a triggered job: no slot of its own for an outage to miss
            return self._explain_triggered(name, spec)
        out = dict(job=name, **await asyncio.to_thread(preview.explain, spec, anchor, lo, hi, name))
        if "after" in spec:
            out["waiting"] = self._waiting(name)
            await self._upstream_in_outage(spec, out, lo, hi, tenants)
        return out

    async def _upstream_in_outage(self, spec: dict, out: dict, lo: int, hi: int, tenants: frozenset | None) -> None:
        """A gated job's explain (``match: same_slot``): each of its slots that a scheduled parent's
        own misfire policy records in the same outage (skipped, coalesced) gets ``upstream``: its
        slot is then recorded ``upstream_missed``, not run (a walk: explain said RUN for three slots
        its ``skip`` parent skipped). Parents without a schedule (triggered by others) are not
        followed, nor a parent another tenant's token may not read; ``upstream_missed`` counts them."""
        if spec.get("match", "same_slot") != "same_slot":
            return
        ranges: list[tuple[int, int, str, dict]] = []
        for edge in spec["after"]:
            parent = edge["job"] if isinstance(edge, dict) else edge
            job = self.read(queries.job, parent)
            if job is None or "schedule" not in job["spec"] or (
                    tenants is not None and job["spec"].get("tenant") not in tenants):
                continue
            pexp = await asyncio.to_thread(preview.explain, job["spec"], job["anchor"], lo, hi, parent)
            for rec in pexp["recorded"]:
                ranges.append((schedule.parse_iso_ms(rec["from"], "from"), schedule.parse_iso_ms(rec["to"], "to"),
                               parent, rec))
            for r in pexp["fired_ahead"] + pexp["runs"]:
                if r.get("withdrawn"):  # (late_start: skip: the parent's slot is recorded skipped)
                    ranges.append((r["slot_ms"], r["slot_ms"], parent,
                                   {"state": "skipped", "reason": "late_start", "why": r["why"]}))
        missed = 0
        for r in out["fired_ahead"] + out["runs"]:
            hit = next(((p, rec) for a, b, p, rec in ranges if a <= r["slot_ms"] <= b), None)
            if hit is None:
                continue
            p, rec = hit
            r["upstream"] = {"job": p, "state": rec["state"], "reason": rec["reason"],
                             "why": f"{p} records this slot {rec['state']} ({rec['reason']}: {rec['why']}): this job's "
                                    "slot is then recorded skipped, reason upstream_missed, not run"}
            missed += 1
        out["upstream_missed"] = missed

    def _explain_triggered(self, name: str, spec: dict) -> dict:
        """explain of a triggered job (``after``, no schedule), with or without a window."""
        return {"job": name, "triggered_by": spec["after"],
                "summary": f"{name} runs after {', '.join(e['job'] for e in spec['after'])}: an outage "
                           "delays its parents' slots, and their outcomes decide its own",
                "waiting": self._waiting(name)}

    def _waiting(self, name: str) -> list[dict]:
        """Child ``name``'s slots waiting for its parents (explain), each slot as every answer gives
        one: ISO, and slot_ms."""
        return [dict(w, slot=schedule.iso(w["slot"]), slot_ms=w["slot"]) for w in self.read(pipelines.pending, name, 20)]

    def explain_slot(self, name: str, slot, tenants: frozenset | None = None) -> dict:
        """Why a slot met or missed its deadline: its run (or record) and its deadline block
        (for a token limited to ``tenants``, neither when the run is another tenant's: the job
        was moved between tenants; nor the block when its record is another tenant's, its run
        trimmed since). ``runs``: every run and record of that instant, as ``GET
        /v1/jobs/{name}/runs?slot=`` lists them (a manual run ``NAME@T!manual-N``, a run of the
        slot by hand or a backfill's, a recorded range that covers it); ``run`` is the slot's
        own (``NAME@SLOT``), else the newest of them. Only the slots the job's schedule fires
        (and a pipeline child's slots) have a deadline record: a run by hand has none."""
        try:
            slot_ms = schedule.parse_iso_ms(slot, "slot") if isinstance(slot, str) else None
        except InvalidSpec as e:
            raise BadRequest(e.message, field=e.field) from None
        if slot_ms is None:
            raise BadRequest("must be an ISO-8601 time", field="slot")
        rid = f"{name}@{slot_ms}"
        run = self.read(queries.run, rid)
        block = self.read(deadlines.slot_views, [rid]).get(rid)
        if tenants is not None and run is not None and not self._run_visible(rid, tenants):
            run = block = None
        if tenants is not None and block is not None and block["tenant"] not in tenants:
            block = None  # its run trimmed since: the record names the tenant the slot was judged for
        # The instant's runs as runs?slot= finds them (its tenants' only): before, a manual run's
        # instant answered run null and "no slot ... falls at that instant" beside that list.
        found = self.read(queries.job_runs, name, _EXPLAIN_RUNS_MAX, None, slot_ms, tenants)["runs"]
        if run is None and found:
            run = found[0]
        views = self._views(found)
        out: dict = {"job": name, "slot": schedule.iso(slot_ms),
                     "run": None if run is None else next((v for v in views if v["id"] == run["id"]), None)
                     or self._views([run])[0],
                     "runs": views, "deadline": None}
        near = None if block is not None else self._not_a_slot(name, slot_ms)
        if block is not None:
            out["deadline"] = deadline_view(block)
            out["why"] = out["deadline"]["why"]
        elif run is not None and run.get("kind") == "recorded" and "slot_to" in run and near is not None:
            # (an instant inside a recorded range that is no slot: a walk was told the slot was
            # past the range's first ones, for an instant that was never a slot)
            out["why"] = (f"{near}; it falls inside {run['id']}, which records the slots from "
                          f"{schedule.iso(run['slot'])} to {schedule.iso(run['slot_to'])} {run['state']} "
                          f"({run.get('reason')})")
        elif run is not None and run.get("kind") == "recorded" and "slot_to" in run:
            out["why"] = (f"{run['id']} records the slots from {schedule.iso(run['slot'])} to "
                          f"{schedule.iso(run['slot_to'])} {run['state']} ({run.get('reason')}); that slot has no "
                          "deadline record of its own: the job had no deadline then, the slot is past the first "
                          f"{limits.deadline_range_slots_max} of the range, or its record was given up "
                          "(limits.deadlines_kept_max)")
        elif run is not None and (run["id"] != rid or run.get("kind") in ("manual", "backfill")):
            what = {"manual": "a manual run", "backfill": "a backfill's run"}.get(run.get("kind") or "", "a run")
            out["why"] = (f"{run['id']} is {what} ({run['state']}) at that instant, and has no deadline record: "
                          "deadlines are judged for the slots the job's schedule fires (and a pipeline child's "
                          "slots), not for manual or backfill runs"
                          + (f"; {near}" if near is not None else ""))
        elif run is None and near is not None:
            out["why"] = near
        elif (job := self.read(queries.job, name)) is not None and "deadline" not in job["spec"]:
            # (a walk read the three-way guess below for a job that plainly has none)
            out["why"] = ("the job has no deadline: none of its slots is judged (PUT it with deadline, "
                          "docs/notifications.md)" + ("" if run is None else f"; its run {run['id']} is {run['state']}"))
        else:
            out["why"] = ("the slot has no deadline record: the job had no deadline when it fired, the slot "
                          "has not fired, or its record was given up (limits.deadlines_kept_max)")
        return out

    def _not_a_slot(self, name: str, slot_ms: int) -> str | None:
        """Why ``slot_ms`` is no slot of job ``name``'s schedule as it is now (naming the next
        one), or None when it is one, or when that cannot be told (no such job, a triggered
        job). A jittered schedule's slots are its jittered instants (schedule.next_slot_after)."""
        job = self.read(queries.job, name)
        sched = None if job is None else job["spec"].get("schedule")
        if sched is None:
            return None
        nxt = schedule.next_slot_after(sched, slot_ms - 1, job["anchor"])
        if nxt == slot_ms:
            return None
        return ("no slot of the job's schedule falls at that instant"
                + (f": the next one after it is {schedule.iso(nxt)}" if nxt is not None else ""))

    # ------------------------------------------------------------------ reads
    def get_job(self, name: str, tenants: frozenset | None = None) -> dict:
        check_name(name)
        job = self.read(queries.job, name)
        if job is None:
            raise NotFound(f"no job named {name!r}", field="name")
        return self.job_view(job, tenants)

    async def list_jobs(self, limit: int, after: str | None, labels: dict | None = None,
                        tenants: frozenset | None = None) -> dict:
        """A page of jobs by name; with ``labels``, of the jobs that carry all of them; with
        ``tenants``, of their jobs only (``total`` counts those). Without labels a page is a
        range of the names kept in order; with them every job (of the tenants) is looked at,
        outside the replica's lock and off the loop (queries.labelled_walk)."""
        if labels:
            inputs = self.read(queries.labelled_inputs, tenants)
            names, more, total = await off_loop(queries.labelled_walk, inputs, labels, limit, after)
            jobs = self.read(queries.jobs_named, names, tenants)
            page = {"jobs": jobs, "next": names[-1] if more else None, "total": total}
        elif tenants is not None:
            page = self.read(queries.jobs_page_in, tenants, limit, after)
        else:
            page = self.read(queries.jobs_page, limit, after)
        page["jobs"] = [self.job_view(j, tenants) for j in page["jobs"]]
        return page

    def job_runs(self, name: str, limit: int, state_filter: str | None, slot_ms: int | None,
                 tenants: frozenset | None = None, window: queries.RunWindow | None = None) -> dict:
        """Job ``name``'s runs; with ``tenants``, those of these tenants only (a run belongs to
        the tenant its job had when the run was made); with ``window``, in its time window,
        after its cursor."""
        check_name(name)
        out = self.read(queries.job_runs, name, limit, state_filter, slot_ms, tenants, window)
        out["runs"] = self._views(out["runs"])
        if slot_ms is not None:
            # pipelines: the slot's runs across the job's graph, and what a waiting child waits for
            chain = self.read(pipelines.slot_runs, name, slot_ms)
            # (runs of other jobs only: a job of no pipeline with a slot's scheduled record and its
            # backfill's run showed them again as a "pipeline", a walk found)
            if any(r["job"] != name for r in chain):
                if tenants is not None:
                    chain = [r for r in chain if self._tenant_of(r) in tenants]
                out["pipeline"] = self._views(chain)
            if not out["runs"]:
                out["why"] = self._why_no_run(name, slot_ms)
            elif all(r["slot_ms"] != slot_ms and r.get("slot_to") for r in out["runs"]):
                # Only recorded ranges that hold the instant past their first slot: say when it is
                # no slot of the schedule (a walk read "your 00:52:23 run was skipped" for a job
                # firing at :21 and :26).
                near = self._not_a_slot(name, slot_ms)
                if near is not None:
                    out["why"] = near + " (it falls inside the range of slots the entry listed records)"
        return out

    def _why_no_run(self, name: str, slot_ms: int) -> str | None:
        """Why a slot's answer is empty, in a sentence (docs/api.md, "Did my 02:00 run
        happen?"): before the job existed, no slot of its schedule, not due yet or held by a
        pause, or older than what its history holds. None: none of these (not said)."""
        got = self.read(queries.slot_unanswered, name, slot_ms)
        if got is None:
            return None
        if slot_ms < got["created"]:
            return (f"the job was made at {schedule.iso(got['created'])}, after that instant: it had no slot "
                    "then (a backfill runs a job for past slots: docs/backfill.md)")
        near = self._not_a_slot(name, slot_ms)
        if near is not None:
            return near
        if slot_ms > got["cursor"]:
            return ("the job is paused: its slots wait for the resume, which records them skipped (reason "
                    "paused), or runs them with catch_up" if got["paused"] else
                    "not fired yet: the slot is after the job's cursor (it fires when it is due)")
        oldest = got["oldest_entry"]
        if oldest is None or slot_ms < oldest:
            return (f"older than what the job's history holds (its last {got['history']} entries"
                    + (f", the oldest for {schedule.iso(oldest)}" if oldest is not None else "")
                    + "): its entry was dropped by the history bound")
        return None

    def _tenant_of(self, run: dict) -> str | None:
        if run.get("tenant") is not None:
            return run["tenant"]
        job = self.read(queries.job, run["job"])
        return job["spec"]["tenant"] if job is not None else None

    def job_graph(self, name: str, tenants: frozenset | None = None) -> dict:
        """``GET /v1/jobs/{name}/graph``: the job's parents and children, transitively, with
        each edge's condition (a token limited to tenants sees its tenants' jobs only)."""
        check_name(name)
        g = self.read(pipelines.graph, name)
        if g is None:
            raise NotFound(f"no job named {name!r}", field="name")
        if tenants is not None:
            # Its tenants' jobs, and the walk through them only: a job of theirs reached through
            # another tenant's (an admin's edge) was listed upstream with no edge to it. How many
            # are left out is said, as a refused delete says its dependents of other tenants.
            # (a missing parent, deleted with force, is shown: the child's own after names it, and
            # it explains the child's dependency_missing slots)
            seen = {n["job"] for n in g["nodes"] if n["kind"] == "missing" or (
                (j := self.read(queries.job, n["job"])) is not None and j["spec"]["tenant"] in tenants)}
            edges = [e for e in g["edges"] if e["from"] in seen and e["to"] in seen]
            up, down = _reach(name, edges, "to", "from"), _reach(name, edges, "from", "to")
            kept = up | down | {name}
            others = len(g["nodes"]) - len(kept)
            g["nodes"] = [n for n in g["nodes"] if n["job"] in kept]
            g["edges"] = [e for e in edges if e["from"] in kept and e["to"] in kept]
            g["parents"], g["children"] = sorted(up), sorted(down)
            if others:
                g["not_shown"] = others
        return g

    def list_runs(self, state_filter: str | None, limit: int, tenants: frozenset | None = None,
                  window: queries.RunWindow | None = None) -> dict:
        """The newest runs (in ``state_filter``; of ``tenants``' jobs only, when given; in
        ``window``, after its cursor): ``{"runs", "next"}``."""
        out = self.read(queries.runs_page, state_filter, limit, tenants, window)
        out["runs"] = self._views(out["runs"])
        return out

    def get_run(self, run_id: str) -> dict:
        run_id = run_id_of(run_id)
        run = self.read(queries.run, run_id)
        if run is None:  # an instant inside a recorded range answers the range (its id, its first slot)
            run = self.read(queries.covering_record, run_id)
        if run is None:
            # pipelines: a child's run its parents have not made yet says what it waits for,
            # when its slot is one of the child's; another instant is none, and says why
            got = self.read(pipelines.waiting_run_or_why, run_id)
            if isinstance(got, str):
                raise NotFound(f"no run {run_id!r}: {got}", field="run")
            run = got
        if run is None:
            raise NotFound(f"no run {run_id!r}", field="run")
        view = self._views([run])[0]
        if run.get("kind") != "waiting" and isinstance(run.get("slot"), int):
            again = self.read(pipelines.rerun_waiting, run["job"], run["slot"])
            if again is not None:  # (its slot runs again below a rerun: what for, docs/pipelines.md)
                view["rerun_waiting_for"] = again
        return view

    def _views(self, runs: list[dict]) -> list[dict]:
        """run_view of each, and ``waiting_for`` on a queued run held by its job's pause, or that
        waits for a worker (its placement, its handler, no live worker of its queue, every one
        that may take it busy) or for its tenant's rate limit (queries.why_queued_many)."""
        out = [run_view(r) for r in runs]
        blocks = self.read(deadlines.slot_views, [r["id"] for r in runs])
        if blocks:
            for v in out:
                if v["id"] in blocks:
                    v["deadline"] = deadline_view(blocks[v["id"]])
        queued = []
        for r, v in zip(runs, out):
            if r["state"] in ("queued", "waiting") and r.get("due", 0) is None:
                v["waiting_for"] = HELD_BY_PAUSE  # fired ahead, held by its job's pause (core/notify.py)
            elif v["state"] == "waiting" and "waiting_for" not in v:
                # a heartbeat job's slot (docs/notifications.md); a pipeline child's slot waiting
                # for its parents says for what already (core/pipelines.py waiting_run)
                v["waiting_for"] = f"a ping: POST /v1/jobs/{r['job']}/ping"
            elif r["state"] == "queued":
                queued.append(r["id"])
        if queued:
            why = self.read(queries.why_queued_many, queued, self.clock.now_ms())
            for v in out:
                if v["id"] in why:
                    v["waiting_for"] = why[v["id"]]
        return out


def _reach(name: str, edges: list[dict], here: str, there: str) -> set[str]:
    """The jobs reached from ``name`` along ``edges`` (each ``{"from", "to"}``), from ``here`` to
    ``there`` (``to``, ``from``: its parents, transitively; ``from``, ``to``: its children)."""
    out: set[str] = set()
    todo = [name]
    while todo:
        j = todo.pop()
        for e in edges:
            if e[here] == j and e[there] not in out and e[there] != name:
                out.add(e[there])
                todo.append(e[there])
    return out


def _worker_warnings(spec: dict, waits: str | None, live: list | None = None) -> list[str]:
    """A line when no live worker may take the runs of a job of ``spec`` now (``waits``: what a
    queued run's ``waiting_for`` would say, queries.waits_for_worker): accepted (the worker may
    register after its jobs are put), but its runs wait queued until one does, and
    ``run.unplaceable`` tells of one only once it waited limits.unplaceable_report_ms. With the
    ``live`` workers, it names the labels of the placement none of them carries (a typo's)."""
    if waits is None:
        return []
    tenant = spec["tenant"]
    if waits == queries.NO_LIVE_WORKER:
        # (not reported by run.unplaceable: a run's view says it, and the fleet's metrics)
        return [f"queue: no live worker serves queue {spec['queue']!r} for {spec['executor']['type']} runs (none "
                f"registered, or each one gone, draining, of 0 slots or of other queues): its runs wait queued until "
                f"one registers; GET /v1/workers lists the workers"]
    later = (f"run.unplaceable tells of a run that waited {limits.unplaceable_report_ms // 1000} s; "
             "GET /v1/workers lists the live workers and their labels")
    if waits == queries.NO_HANDLER:
        return [f"executor.target: no live worker has a handler for {spec['executor'].get('target')!r} (the "
                f"workers of its app run a version without it): its runs wait for one, for "
                f"{limits.handler_wait_ms // 60_000} minutes from their due; {later}"]
    labels = (spec.get("placement") or {}).get("labels")
    nobody = queries.labels_none_carries(live, spec) if labels and live is not None else []
    what = (f"carries the labels {json.dumps(labels, sort_keys=True)}"
            + (f" (none carries {', '.join(nobody)})" if nobody else "") if labels
            else "takes runs without a placement (the live ones are dedicated to their labels, limited to tenants "
                 "or to their app's handlers)")
    return [f"{'placement' if labels else 'queue'}: no live worker serving queue {spec['queue']!r} "
            f"for {spec['executor']['type']} runs{'' if tenant == 'default' else f' of tenant {tenant!r}'} "
            f"{what}: its runs wait queued until one registers; {later}"]


def _replace_warnings(spec: dict) -> list[str]:
    """A job of overlap ``replace`` without ``deadline.max_since_success_s``: accepted, but a
    run killed by the next slot's is no death (no consecutive_failures, no incident, no
    run.dead: docs/notifications.md, "Job health"), so a job whose runs never get to end is told
    by nothing."""
    if (spec.get("overlap") or {}).get("policy") != "replace" or "max_since_success_s" in (spec.get("deadline") or {}):
        return []
    return ["deadline: with overlap replace, a run still going when the next slot fires is killed, which is no "
            "failure (no incident, no run.dead): a job whose runs never get to end is told by nothing unless it has "
            "one; give it max_since_success_s (for example \"deadline\": {\"max_since_success_s\": 3600})"]


def _idle_setting_warnings(spec: dict, now: int | None) -> list[str]:
    """Settings a PUT accepts that do nothing for this job (a walk: each was taken silently): a
    retry on a heartbeat job (its slot ends with its ping: a fail ping is final), a
    ``max_catchup`` beside a policy other than ``fire_all`` (the only one that reads it), and,
    for a job made now (``now``; None: a replace, whose slot may be handled already), a one-shot
    ``at`` already past (its one slot runs at once, late, or with ``skip`` never)."""
    out = []
    retry, misfire, sched = spec.get("retry") or {}, spec.get("misfire") or {}, spec.get("schedule") or {}
    if spec["executor"]["type"] == "heartbeat" and retry.get("max_attempts", 1) > 1:
        out.append("retry: a heartbeat job's slot ends with its ping (a fail ping is final, and no worker runs it): "
                   "retry does nothing for it")
    if misfire.get("policy") in ("skip", "fire_once") and misfire.get("max_catchup", limits.max_catchup_default) \
            != limits.max_catchup_default:
        out.append(f"misfire.max_catchup: only fire_all reads it; with {misfire['policy']} it does nothing")
    at = sched.get("at")
    if now is not None and type(at) is int and at < now - max(misfire.get("grace_s", 0) * 1000, limits.grace_ms_floor):
        late = schedule.iso(at)
        out.append(f"schedule.at: {late} has passed: " + (
            "with misfire skip its one slot is recorded skipped, and never runs" if misfire.get("policy") == "skip"
            else "its one slot is fired now, and its run starts late by that much"))
    return out


def _heartbeat_warnings(spec: dict) -> list[str]:
    """A heartbeat job without a ``deadline``: accepted, but a slot nobody pings is told only
    when it is closed, heartbeat_open_max slots later, and a start never finished by nothing
    (docs/notifications.md, "Heartbeat jobs")."""
    if spec["executor"]["type"] != "heartbeat" or "deadline" in spec:
        return []
    return [f"deadline: a heartbeat job without one is told of a slot nobody pinged only when it is closed, "
            f"{limits.heartbeat_open_max} slots later, and of a start that never reports success by nothing; "
            f"give it a deadline (for example \"deadline\": {{\"succeed_within_s\": 900}})"]


def _change(path: str, a, b, budget: list[int]) -> dict:
    """One field of a dry run's ``changes``: ``from`` and ``to`` as a read shows them, a side
    whose field is absent left out. A value longer than dry_run_value_bytes_max encoded (a
    payload, an argv) is shown by its size (``from_bytes``, ``to_bytes``), and once the answer has
    shown dry_run_values_bytes_max of values, none more (``budget``, below 0 then): the answer
    stays near the size of its request, whatever the stored specs hold."""
    out: dict = {"field": path}
    for side, v in (("from", a), ("to", b)):
        if v is specdiff.ABSENT:
            continue
        n = len(json.dumps(v, separators=(",", ":")))
        if n > node_limits.dry_run_value_bytes_max or budget[0] - n < 0:
            out[side + "_bytes"] = n
            if n <= node_limits.dry_run_value_bytes_max:
                budget[0] = -1  # (a value left out for the budget: the answer says so)
        else:
            out[side] = v
            budget[0] -= n
    return out


class _Pending:
    """A batch's jobs as ``check_slots_meet`` reads them: ``get(name)`` -> (spec, anchor) or None,
    the anchor computed on first read (a batch of 10 000 jobs computes those of its pipelines'
    jobs only)."""

    def __init__(self, specs: dict[str, dict], anchor_of) -> None:
        self._specs = specs
        self._anchor_of = anchor_of

    def get(self, name: str) -> tuple[dict, int] | None:
        spec = self._specs.get(name)
        return None if spec is None else (spec, self._anchor_of(name))
