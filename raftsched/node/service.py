"""The operations the API offers, as the proposer sees them.

A write is validated here (on whichever node received it), completed with what only the proposer
may compute (slots, via core.schedule, from this node's clock), encoded and proposed through the
replication layer. Reads come from the local replica, optionally after a barrier (a consistent
read). Nothing here knows HTTP or pysyncobj.
"""
from __future__ import annotations

import uuid

from ..clock import Clock
from ..core import commands, limits, model, preview, schedule
from ..core.errors import InvalidSpec, NotFound, RaftschedError, BadRequest
from ..core.model import check_name


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
        data = commands.encode(cmd)
        res = await self.raft.propose(data, timeout_s=self.propose_timeout_s)
        if not res.get("ok"):
            raise RaftschedError.from_dict(res.get("error") or {"code": "internal", "message": "refused"})
        return res

    async def read_barrier(self, consistent: bool) -> None:
        if consistent:
            await self.raft.barrier(timeout_s=self.propose_timeout_s)

    # ------------------------------------------------------------------ jobs
    async def put_job(self, name: str, raw, rid: str | None, create_only: bool = False) -> dict:
        spec = model.validate_job(name, raw)
        now = self.clock.now_ms()
        anchor = now - now % 1000 + (1000 if now % 1000 else 0)  # interval slots on whole seconds
        sched = spec["schedule"]
        cursor = now
        if "at" in sched and sched["at"] <= now:
            # A one-shot time already past: its slot is due now and the misfire policy decides.
            cursor = sched["at"] - 1
        with self.state.lock:
            old = self.state.jobs.get(name)
            if old is not None and old["spec"]["schedule"] == sched:
                cursor, anchor = old["cursor"], old["anchor"]
        nxt = schedule.next_slot_after(sched, cursor, anchor)
        cmd = commands.make("put_job", now, rid or new_request_id(), name=name, spec=spec,
                            next=nxt, cursor=cursor, anchor=anchor, create_only=create_only)
        res = await self.propose(cmd)
        return {"job": name, "created": res.get("created", False), "next_slot": schedule.iso(nxt)}

    async def delete_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        await self.propose(commands.make("delete_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return {"job": name, "deleted": True}

    async def pause_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        await self.propose(commands.make("pause_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return {"job": name, "paused": True}

    async def resume_job(self, name: str, rid: str | None, catch_up: bool = False) -> dict:
        """Resume a paused job. By default the slots that fell due while it was paused are
        recorded as skipped (reason ``paused``) and it resumes from now; with ``catch_up`` its
        misfire policy decides for them instead."""
        check_name(name)
        now = self.clock.now_ms()
        with self.state.lock:
            job = self.state.jobs.get(name)
            if job is None:
                raise NotFound(f"no job named {name!r}", field="name")
            spec, cursor, anchor, gen = job["spec"], job["cursor"], job["anchor"], job["gen"]
        fields = {"name": name, "catch_up": catch_up}
        if not catch_up:
            upto = max(now, cursor)
            rec = []
            n = schedule.count_slots(spec["schedule"], cursor, upto, anchor, 100_000)
            if n != 0:
                first = schedule.next_slot_after(spec["schedule"], cursor, anchor)
                last = schedule.last_slots_until(spec["schedule"], cursor, upto, anchor, 1)
                rec = [["skipped", "paused", first, last[-1] if last else first, n]]
            fields.update(gen=gen, after=cursor, upto=upto, rec=rec,
                          next=schedule.next_slot_after(spec["schedule"], upto, anchor))
        await self.propose(commands.make("resume_job", now, rid or new_request_id(), **fields))
        return {"job": name, "paused": False}

    async def trigger_job(self, name: str, rid: str | None) -> dict:
        check_name(name)
        res = await self.propose(commands.make("trigger_job", self.clock.now_ms(), rid or new_request_id(), name=name))
        return {"job": name, "run": res["run"], "state": res["state"]}

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
        anchor = now - now % 1000 + (1000 if now % 1000 else 0)
        return {"slots": preview.preview(spec, anchor, now, count)}

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
        st = job["stats"]
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


def _spec_view(spec: dict) -> dict:
    out = dict(spec)
    sched = dict(spec["schedule"])
    if "at" in sched:
        sched["at"] = schedule.iso(sched["at"])
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
