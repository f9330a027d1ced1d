"""The operations the API offers, as the proposer sees them.

A write is validated here (on whichever node received it), completed with what only the proposer
may compute (slots, via core.schedule, from this node's clock), encoded and proposed through the
replication layer. Reads come from the local replica, optionally after a barrier (a consistent
read). Nothing here knows HTTP or pysyncobj.
"""
from __future__ import annotations

import asyncio
import hashlib
import uuid

import msgpack

from ..clock import Clock
from ..core import commands, limits, model, policy, preview, schedule
from ..core.errors import InvalidSpec, NotFound, RaftschedError, BadRequest, Unavailable
from ..core.model import check_name
from ..core.records import STATS_FIELDS


def new_request_id() -> str:
    return uuid.uuid4().hex


class Service:
    def __init__(self, state, raft, clock: Clock, node_id: str,
                 propose_timeout_s: float = limits.propose_timeout_s_default) -> None:
        self.state = state
        self.raft = raft
        self.clock = clock
        self.node_id = node_id
        self.propose_timeout_s = propose_timeout_s

    # ------------------------------------------------------------------ plumbing
    async def propose(self, cmd: dict) -> dict:
        """Propose and return the applied result. :raises RaftschedError: refusals and
        Unavailable / Indeterminate from replication."""
        return await self.propose_data(commands.encode(cmd))

    async def propose_data(self, data: bytes) -> dict:
        """``propose`` for a command already encoded."""
        res = await self.raft.propose(data, timeout_s=self.propose_timeout_s)
        if not res.get("ok"):
            raise RaftschedError.from_dict(res.get("error") or {"code": "internal", "message": "refused"})
        return res

    @staticmethod
    def _out(res: dict, body: dict) -> dict:
        """The response body, marked when the request id had already been applied."""
        if res.get("duplicate"):
            body["duplicate"] = True
        return body

    async def read_barrier(self, consistent: bool) -> None:
        if consistent:
            await self.raft.barrier(timeout_s=self.propose_timeout_s)

    # ------------------------------------------------------------------ jobs
    def _position(self, name: str, sched: dict, now: int, memo: dict | None = None) -> tuple[int, int, int | None]:
        """The proposer's part of a put_job: ``(cursor, anchor, next)``. A replace with the same
        schedule keeps the job's cursor and anchor (apply keeps them whatever the command says).
        ``memo`` caches cron next slots within one batch (croniter: ~0.1 ms a call)."""
        anchor, cursor = policy.initial_position(sched, now)
        with self.state.lock:
            old = self.state.jobs.get(name)
            if old is not None and old["spec"]["schedule"] == sched:
                cursor, anchor = old["cursor"], old["anchor"]
        if memo is None or "cron" not in sched:
            return cursor, anchor, schedule.next_slot_after(sched, cursor, anchor)
        key = (repr(sched), cursor, anchor)
        if key not in memo:
            memo[key] = schedule.next_slot_after(sched, cursor, anchor)
        return cursor, anchor, memo[key]

    async def put_job(self, name: str, raw, rid: str | None, create_only: bool = False) -> dict:
        spec = model.validate_job(name, raw)
        now = self.clock.now_ms()
        cursor, anchor, nxt = self._position(name, spec["schedule"], now)
        cmd = commands.make("put_job", now, rid or new_request_id(), name=name, spec=spec,
                            next=nxt, cursor=cursor, anchor=anchor, create_only=create_only)
        res = await self.propose(cmd)
        return self._out(res, {"job": name, "created": res.get("created", False), "next_slot": schedule.iso(nxt)})

    async def put_jobs(self, body, key: str | None) -> dict:
        """Create or replace many jobs: ``POST /v1/jobs:batch`` (docs/api.md).

        1. Validate the body (BadRequest, 400), then every job as PUT does. If any job is
           invalid, raise InvalidSpec (422) naming the first one and its field, with up to 100
           in ``errors``, and propose nothing.
        2. Cut the jobs, sorted by name, into put_jobs commands of at most command_bytes_max.
           The cut depends on the names, specs and create_only alone (each item is sized with
           its times at their largest encoding), so the same body always gives the same
           commands; each command's request id is ``jb-`` and a BLAKE2b of the Idempotency-Key,
           its index and its items sized so. Sending the same body with the same key again
           therefore applies each command at most once.
        3. Propose the commands concurrently, put_jobs_in_flight_max at a time.

        :returns: ``{"jobs": {name: result}, "created", "replaced", "conflicts", "commands"}``.
        :raises RaftschedError: when a command failed: the type of the worst failure
            (Indeterminate, then Unavailable, then the first other), carrying which jobs are
            committed (their results), which are not, and which are unknown.
        """
        jobs_raw, create_only = _batch_body(body)
        key = key or new_request_id()
        step = limits.batch_validate_step
        specs: dict[str, dict] = {}
        invalid: list[dict] = []
        for k, (name, raw) in enumerate(jobs_raw.items()):
            if k and k % step == 0:
                await asyncio.sleep(0)  # a yield, not a wait: other requests, the trigger, heartbeats
            try:
                specs[name] = model.validate_job(name, raw)
            except InvalidSpec as e:
                invalid.append({"job": name, "field": e.field, "message": e.message})
        if invalid:
            first = invalid[0]
            raise InvalidSpec(f"job {first['job']!r}: {first['message']}", field=first["field"], job=first["job"],
                              invalid=len(invalid), errors=invalid[:100])

        now = self.clock.now_ms()
        memo: dict = {}
        chunks: list[list[dict]] = []  # put_jobs items
        hashes: list = []
        budget = limits.command_bytes_max - _PUT_JOBS_ENVELOPE_BYTES
        cur: list[dict] = []
        cur_bytes = 0
        h = None
        for k, name in enumerate(sorted(specs)):
            if k and k % step == 0:
                await asyncio.sleep(0)
            spec = specs[name]
            # The item at its largest: the times it will carry encode in at most 9 bytes each.
            widest = msgpack.packb({"name": name, "spec": spec, "next": _TIME_WIDEST, "cursor": _TIME_WIDEST,
                                    "anchor": _TIME_WIDEST, "create_only": create_only}, use_bin_type=True)
            if cur and (cur_bytes + len(widest) > budget or len(cur) >= limits.put_jobs_items_max):
                chunks.append(cur)
                hashes.append(h)
                cur, cur_bytes = [], 0
            if not cur:
                h = hashlib.blake2b(key.encode("utf-8", "backslashreplace") + b"\0%d\0" % len(chunks), digest_size=20)
            h.update(widest)
            cursor, anchor, nxt = self._position(name, spec["schedule"], now, memo)
            cur.append({"name": name, "spec": spec, "next": nxt, "cursor": cursor, "anchor": anchor,
                        "create_only": create_only})
            cur_bytes += len(widest)
        chunks.append(cur)
        hashes.append(h)
        datas = [commands.encode(commands.make("put_jobs", now, "jb-" + hh.hexdigest(), jobs=chunk))
                 for chunk, hh in zip(chunks, hashes)]

        window = asyncio.Semaphore(limits.put_jobs_in_flight_max)

        async def one(data: bytes) -> dict:
            async with window:
                return await self.propose_data(data)

        results = await asyncio.gather(*(one(d) for d in datas), return_exceptions=True)

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
                (not_committed if res.definite else unknown).extend(names)
                continue
            gens, created, conflicts = res.get("gen"), res.get("created"), set(res.get("conflicts") or ())
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

    async def delete_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        res = await self.propose(commands.make("delete_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return self._out(res, {"job": name, "deleted": True})

    async def pause_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        res = await self.propose(commands.make("pause_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return self._out(res, {"job": name, "paused": True})

    async def resume_job(self, name: str, rid: str | None, catch_up: bool = False) -> dict:
        """Resume a paused job. By default the slots that fell due while it was paused are
        recorded as skipped (reason ``paused``) and it resumes from now; with ``catch_up`` its
        misfire policy decides for them instead."""
        check_name(name)
        # The plan is made from this replica's view of the job, which may lag the log (a follower
        # behind, a node replaying its journal after a restart): without the barrier, a resume
        # sent there answered a definite 404 for a job that existed (fault-injection seed
        # 16325040, after a whole-cluster restart).
        await self.raft.barrier(timeout_s=self.propose_timeout_s)
        now = self.clock.now_ms()
        with self.state.lock:
            job = self.state.jobs.get(name)
            if job is None:
                raise NotFound(f"no job named {name!r}", field="name")
            spec, cursor, anchor, gen = job["spec"], job["cursor"], job["anchor"], job["gen"]
        fields = {"name": name, "catch_up": catch_up}
        if not catch_up:
            fields.update(gen=gen, **policy.plan_resume(spec, anchor, cursor, now))
        res = await self.propose(commands.make("resume_job", now, rid or new_request_id(), **fields))
        return self._out(res, {"job": name, "paused": False})

    async def trigger_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        res = await self.propose(commands.make("trigger_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return self._out(res, {"job": name, "run": res["run"], "state": res["state"]})

    # ------------------------------------------------------------------ queues and tenants
    async def put_queue(self, name: str, body, rid: str | None) -> dict:
        check_name(name, "queue", limits.queue_name_chars_max)
        b = _body_obj(body, {"max_depth", "on_full"})
        depth = _int_field(b.get("max_depth", limits.queue_depth_default), "max_depth", 1, limits.queue_depth_max)
        on_full = b.get("on_full", "reject")
        if on_full not in ("reject", "drop_oldest"):
            raise InvalidSpec("must be reject or drop_oldest", field="on_full")
        res = await self.propose(commands.make("put_queue", self.clock.now_ms(), rid or new_request_id(),
                                         name=name, max_depth=depth, on_full=on_full))
        return self._out(res, {"queue": name, "max_depth": depth, "on_full": on_full})

    def list_queues(self) -> dict:
        now = self.clock.now_ms()
        with self.state.lock:
            stats: dict[str, dict] = {}
            def q(name):
                if name not in stats:
                    cfg = self.state.queues.get(name, {"max_depth": limits.queue_depth_default, "on_full": "reject"})
                    stats[name] = {"name": name, "max_depth": cfg["max_depth"], "on_full": cfg["on_full"],
                                   "configured": name in self.state.queues, "depth": 0, "ready": 0,
                                   "running": 0, "dead": 0, "oldest_waiting_age_ms": None}
                return stats[name]
            for name in self.state.queues:
                q(name)
            for run in self.state.runs.values():
                st = run["state"]
                if st == "queued":
                    e = q(run["queue"])
                    e["depth"] += 1
                    due = run.get("due", run["slot"])
                    if due <= now:
                        e["ready"] += 1
                        age = now - due
                        if e["oldest_waiting_age_ms"] is None or age > e["oldest_waiting_age_ms"]:
                            e["oldest_waiting_age_ms"] = age
                elif st == "running":
                    q(run["queue"])["running"] += 1
                elif st == "dead":
                    q(run["queue"])["dead"] += 1
            return {"queues": [stats[k] for k in sorted(stats)]}

    async def put_tenant(self, name: str, body, rid: str | None) -> dict:
        check_name(name, "tenant", limits.tenant_name_chars_max)
        b = _body_obj(body, {"rate_per_s", "burst"})
        if "rate_per_s" not in b:
            raise InvalidSpec("is required: runs per second this tenant may start", field="rate_per_s")
        rate = b["rate_per_s"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.001 <= rate <= 100_000:
            raise InvalidSpec("must be a number between 0.001 and 100000", field="rate_per_s")
        burst = _int_field(b.get("burst", max(1, int(rate))), "burst", 1, 1_000_000)
        res = await self.propose(commands.make("put_tenant", self.clock.now_ms(), rid or new_request_id(),
                                         name=name, rate_milli=round(rate * 1000), burst=burst))
        return self._out(res, {"tenant": name, "rate_per_s": round(rate * 1000) / 1000, "burst": burst})

    async def delete_tenant(self, name: str, rid: str | None) -> dict:
        check_name(name, "tenant", limits.tenant_name_chars_max)
        res = await self.propose(commands.make("delete_tenant", self.clock.now_ms(), rid or new_request_id(), name=name))
        return self._out(res, {"tenant": name, "deleted": True})

    def list_tenants(self) -> dict:
        with self.state.lock:
            return {"tenants": [
                {"name": n, "rate_per_s": t["rate_milli"] / 1000, "burst": t["burst"],
                 "tokens": t["tokens_micro"] / 1_000_000}
                for n, t in sorted(self.state.tenants.items())
            ]}

    # ------------------------------------------------------------------ dead-letter queue
    def list_dlq(self, queue: str | None, limit: int) -> dict:
        with self.state.lock:
            out = []
            for run in self.state.runs.values():
                if run["state"] == "dead" and (queue is None or run["queue"] == queue):
                    out.append(run_view(run))
            out.sort(key=lambda r: (r["finished_at"] or "", r["id"]), reverse=True)
            return {"runs": out[:limit], "total": len(out)}

    def get_dlq(self, run_id: str) -> dict:
        with self.state.lock:
            run = self.state.runs.get(run_id)
            if run is None or run["state"] != "dead":
                raise NotFound(f"no run {run_id!r} in a dead-letter queue", field="run")
            return run_view(run)

    async def dlq_requeue(self, run_id: str, rid: str | None) -> dict:
        res = await self.propose(commands.make("dlq_requeue", self.clock.now_ms(), rid or new_request_id(), run=run_id))
        return self._out(res, {"run": run_id, "state": res["state"], "attempt": res["attempt"]})

    async def dlq_delete(self, run_id: str, rid: str | None) -> dict:
        res = await self.propose(commands.make("dlq_delete", self.clock.now_ms(), rid or new_request_id(), run=run_id))
        return self._out(res, {"run": run_id, "deleted": True})

    # ------------------------------------------------------------------ locks
    def _lock_body(self, name: str, body, fields: set[str]) -> dict:
        check_name(name, "name", limits.lock_name_chars_max)
        return _body_obj(body, fields)

    def _ttl_ms(self, b: dict, required: bool) -> int | None:
        if "ttl_s" not in b:
            if required:
                raise InvalidSpec("is required: seconds the lock is held without a renew", field="ttl_s")
            return None
        v = b["ttl_s"]
        lo, hi = limits.lease_ttl_ms_min / 1000, limits.lease_ttl_ms_max / 1000
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise InvalidSpec(f"must be a number of seconds between {lo:g} and {hi:g}", field="ttl_s")
        return int(v * 1000)

    def _token(self, b: dict) -> int:
        t = b.get("token")
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise InvalidSpec("is required: the fencing token acquire returned", field="token")
        return t

    async def lock_acquire(self, name: str, body, rid: str | None) -> dict:
        b = self._lock_body(name, body, {"owner", "ttl_s"})
        owner = b.get("owner")
        if not isinstance(owner, str) or not owner or len(owner) > 256:
            raise InvalidSpec("is required: a string of 1-256 characters naming the holder", field="owner")
        res = await self.propose(commands.make("lock_acquire", self.clock.now_ms(), rid or new_request_id(),
                                               name=name, owner=owner, ttl=self._ttl_ms(b, True)))
        return self._out(res, {"lock": name, "owner": owner, "token": res["token"], "expires_at": schedule.iso(res["deadline"])})

    async def lock_renew(self, name: str, body, rid: str | None) -> dict:
        b = self._lock_body(name, body, {"token", "ttl_s"})
        res = await self.propose(commands.make("lock_renew", self.clock.now_ms(), rid or new_request_id(),
                                               name=name, token=self._token(b), ttl=self._ttl_ms(b, False)))
        return self._out(res, {"lock": name, "token": res["token"], "expires_at": schedule.iso(res["deadline"])})

    async def lock_release(self, name: str, body, rid: str | None) -> dict:
        b = self._lock_body(name, body, {"token"})
        res = await self.propose(commands.make("lock_release", self.clock.now_ms(), rid or new_request_id(),
                                         name=name, token=self._token(b)))
        return self._out(res, {"lock": name, "released": True})

    def get_lock(self, name: str) -> dict:
        check_name(name, "name", limits.lock_name_chars_max)
        with self.state.lock:
            lk = self.state.locks.get(name)
            if lk is None:  # held until released or expired by the leader's reaper
                raise NotFound(f"lock {name!r} is not held", field="name")
            return {"lock": name, "owner": lk["owner"], "token": lk["token"],
                    "expires_at": schedule.iso(lk["deadline"]), "since": schedule.iso(lk["since"])}

    # ------------------------------------------------------------------ preview / explain
    def _job_spec(self, name: str) -> tuple[dict, int]:
        check_name(name)
        with self.state.lock:
            job = self.state.jobs.get(name)
            if job is None:
                raise NotFound(f"no job named {name!r}", field="name")
            return job["spec"], job["anchor"]

    def preview_job(self, name: str, count: int, after_ms: int | None) -> dict:
        spec, anchor = self._job_spec(name)
        after = self.clock.now_ms() if after_ms is None else after_ms
        return {"job": name, "slots": preview.preview(spec, anchor, after, count)}

    def preview_spec(self, raw, count: int) -> dict:
        spec = model.validate_job("preview", raw)
        now = self.clock.now_ms()
        anchor, cursor = policy.initial_position(spec["schedule"], now)
        return {"slots": preview.preview(spec, anchor, cursor, count)}

    def explain_job(self, name: str, body) -> dict:
        spec, anchor = self._job_spec(name)
        if not isinstance(body, dict):
            raise BadRequest("send {\"down_from\": ISO time, \"down_to\": ISO time}")
        try:
            lo = schedule.parse_iso_ms(body.get("down_from"), "down_from")
            hi = schedule.parse_iso_ms(body.get("down_to"), "down_to")
        except InvalidSpec as e:
            raise BadRequest(e.message, field=e.field) from None
        if hi <= lo:
            raise BadRequest("must be after down_from", field="down_to")
        if hi - lo > 366 * 86_400_000:
            raise BadRequest("an outage window is at most 366 days", field="down_to")
        return dict(job=name, **preview.explain(spec, anchor, lo, hi))

    # ------------------------------------------------------------------ reads
    def job_view(self, job: dict) -> dict:
        st = dict(zip(STATS_FIELDS, job["stats"]))
        n = st["runs"]
        return {
            "name": job["name"],
            "spec": _spec_view(job["spec"]),
            "state": {
                "paused": job["paused"],
                "next_slot": schedule.iso(job["next"]),
                "cursor": schedule.iso(job["cursor"]),
                "generation": job["gen"],
                "created_at": schedule.iso(job["created"]),
                "updated_at": schedule.iso(job["updated"]),
                "runs_fired": n,
                "slots_recorded": st["recorded"],
                "fire_lag_ms": {
                    "last": st["lag_ms_last"], "max": st["lag_ms_max"],
                    "mean": round(st["lag_ms_sum"] / n, 1) if n else None,
                },
            },
        }

    def get_job(self, name: str) -> dict:
        check_name(name)
        with self.state.lock:
            job = self.state.jobs.get(name)
            if job is None:
                raise NotFound(f"no job named {name!r}", field="name")
            return self.job_view(job)

    def list_jobs(self, limit: int, after: str | None) -> dict:
        with self.state.lock:
            names = sorted(self.state.jobs)
            if after:
                import bisect
                names = names[bisect.bisect_right(names, after):]
            page = names[:limit]
            return {
                "jobs": [self.job_view(self.state.jobs[n]) for n in page],
                "next": page[-1] if len(names) > limit else None,
                "total": len(self.state.jobs),
            }

    def job_runs(self, name: str, limit: int, state_filter: str | None, slot_ms: int | None) -> dict:
        check_name(name)
        with self.state.lock:
            if name not in self.state.jobs:
                raise NotFound(f"no job named {name!r}", field="name")
            out = []
            for rid in reversed(self.state.history.get(name, [])):
                run = self.state.runs[rid]
                if state_filter and run["state"] != state_filter:
                    continue
                if slot_ms is not None and not (run["slot"] <= slot_ms <= run.get("slot_to", run["slot"])):
                    continue
                out.append(run_view(run))
                if len(out) >= limit:
                    break
            return {"job": name, "runs": out, "history_max": self.state.jobs[name]["spec"]["history"]}

    def list_runs(self, state_filter: str | None, limit: int) -> dict:
        with self.state.lock:
            out = []
            for run in reversed(self.state.runs.values()):
                if state_filter and run["state"] != state_filter:
                    continue
                out.append(run_view(run))
                if len(out) >= limit:
                    break
            return {"runs": out}

    def get_run(self, run_id: str) -> dict:
        with self.state.lock:
            run = self.state.runs.get(run_id)
            if run is None:
                raise NotFound(f"no run {run_id!r}", field="run")
            return run_view(run)


#: put_jobs envelope (v, op, now, rid, the jobs key, the list header): bytes kept free in a command.
_PUT_JOBS_ENVELOPE_BYTES = 256
#: Stands for a time while sizing a put_jobs item: encodes as long as any time can (9 bytes).
_TIME_WIDEST = 2**63 - 1


def _batch_body(body) -> tuple[dict, bool]:
    """``{"jobs": {name: spec, ...}, "create_only": bool}`` -> (jobs, create_only). :raises BadRequest:"""
    if not isinstance(body, dict):
        raise BadRequest('send {"jobs": {"<name>": <job spec>, ...}}', field=None)
    for k in body:
        if k not in ("jobs", "create_only"):
            raise BadRequest("unknown field; allowed: create_only, jobs", field=str(k))
    jobs = body.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        raise BadRequest('must be a non-empty object {"<name>": <job spec>, ...}', field="jobs")
    if len(jobs) > limits.batch_jobs_max:
        raise BadRequest(f"holds {len(jobs)} jobs; at most {limits.batch_jobs_max} per request", field="jobs")
    create_only = body.get("create_only", False)
    if not isinstance(create_only, bool):
        raise BadRequest("must be true or false", field="create_only")
    return jobs, create_only


def _body_obj(body, fields: set[str]) -> dict:
    if not isinstance(body, dict):
        raise InvalidSpec("the body must be a JSON object", field=None)
    for k in body:
        if k not in fields:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(fields))}", field=str(k))
    return body


def _int_field(v, field: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=field)
    return v


def _spec_view(spec: dict) -> dict:
    out = dict(spec)
    sched = dict(spec["schedule"])
    for k in ("at", "start_at"):
        if k in sched:
            sched[k] = schedule.iso(sched[k])
    out["schedule"] = sched
    return out


RUN_STATES = ("queued", "running", "succeeded", "failed", "dead", "skipped", "coalesced")


def run_view(run: dict) -> dict:
    v = {
        "id": run["id"], "job": run["job"], "slot": schedule.iso(run["slot"]), "slot_ms": run["slot"],
        "state": run["state"], "kind": run.get("kind"),
        "attempt": run.get("attempt"), "fencing_token": run.get("fencing_token"),
        "worker": run.get("worker"), "queue": run.get("queue"),
        "fired_at": schedule.iso(run.get("fired_at")), "started_at": schedule.iso(run.get("started_at")),
        "finished_at": schedule.iso(run.get("finished_at")), "error": run.get("error"),
    }
    if run.get("kind") != "recorded":
        v["due"] = schedule.iso(run.get("due"))
        v["lease_deadline"] = schedule.iso(run.get("deadline"))
        v["output"] = run.get("output")
        v["attempts"] = [
            dict(a, started_at=schedule.iso(a.get("started_at")), finished_at=schedule.iso(a.get("finished_at")))
            for a in run.get("attempts", [])
        ]
    if run["state"] in ("skipped", "coalesced"):
        v["reason"] = run.get("reason")
        if "slot_to" in run:
            v["slot_to"] = schedule.iso(run["slot_to"])
            v["count"] = run.get("count")
    else:
        v["fire_lag_ms"] = (run["fired_at"] - run["slot"]) if run.get("fired_at") is not None else None
    return v


def parse_slot_param(text: str) -> int:
    try:
        return schedule.parse_iso_ms(text, "slot")
    except InvalidSpec as e:
        raise BadRequest(e.message, field="slot") from None
