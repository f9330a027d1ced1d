"""The API's JSON shapes of what core.queries returns: times as ISO-8601 UTC text, counters by
name. Presentation only: the reads themselves, in storage units, are core/queries.py's."""
from __future__ import annotations

from ..core import deadlines, schedule
from ..core.tenants import LIMITED, tokens_at
from .redact import PROCESS_DEFAULT, Fingerprint, redact_spec


def job_view(job: dict, fp: Fingerprint = PROCESS_DEFAULT) -> dict:
    """A job (queries.job) as ``GET /v1/jobs/{name}`` shows it, its secrets redacted by ``fp``."""
    st = job["stats"]
    n = st["runs"]
    out = {
        "name": job["name"],
        "spec": spec_view(job["spec"], fp),
        "state": {
            "paused": job["paused"],
            # Why it is paused: since when, manual or pause_on_failure, by which token, a note
            # (null when not paused, or paused by a version that kept none).
            "pause": _pause_view(job.get("pause")),
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
    last = job.get("last")
    # The newest run or recorded slot (its outcome, for a list of jobs), or null: none yet.
    out["state"]["last_run"] = None if last is None else {
        "id": last["id"], "slot": schedule.iso(last["slot"]), "state": last["state"], "reason": last.get("reason")}
    if job["spec"].get(LIMITED):  # written by a token limited to tenants: its tenant's policy holds it
        out["limited"] = True
    if "health" in job:  # docs/notifications.md, "Health"
        out["health"] = health_view(job["health"])
    return out


def _pause_view(p: dict | None) -> dict | None:
    """Why a job is paused (core/notify.py PAUSE_FIELDS), its time as ISO text."""
    return None if p is None else dict(p, since=schedule.iso(p["since"]))


def health_view(h: dict) -> dict:
    """A job's health (core/notify.py view_health) with its times as ISO text."""
    last, inc = h["last_slot_outcome"], h["incident"]
    return {"last_success_at": schedule.iso(h["last_success_at"]), "last_failure_at": schedule.iso(h["last_failure_at"]),
            "consecutive_failures": h["consecutive_failures"],
            "last_slot_outcome": None if last is None else dict(last, slot=schedule.iso(last["slot"])),
            "incident": None if inc is None else dict(inc, since=schedule.iso(inc["since"]))}


def spec_view(spec: dict, fp: Fingerprint = PROCESS_DEFAULT) -> dict:
    """A stored spec with its schedule's times (``at``, ``start_at``) as ISO text, its secrets
    redacted (node/redact.py) and ``keep_output`` filled in: the spec as a client writes it, so
    that what GET shows can be PUT back. A jitter is stored in the schedule (``jitter_ms`` and
    its hash key, the job's name: core/model.py _add_jitter) and shown as the ``jitter_s`` it
    was written as."""
    out = redact_spec(spec, fp)
    out.pop(LIMITED, None)  # not the client's: shown beside the spec (job_view)
    out.setdefault("keep_output", True)
    if "schedule" not in spec:  # a triggered job (pipelines): its parents make its runs
        out["schedule"] = None
        return out
    sched = dict(spec["schedule"])
    for k in ("at", "start_at"):
        if k in sched:
            sched[k] = schedule.iso(sched[k])
    sched.pop("jitter_key", None)
    jitter_ms = sched.pop("jitter_ms", None)
    if jitter_ms:
        out["jitter_s"] = jitter_ms // 1000
    out["schedule"] = sched
    return out


def run_view(run: dict) -> dict:
    """A run or recorded slot (queries.run) as ``GET /v1/runs/{id}`` shows it. Its ``started_at``
    is null when its latest attempt is one its worker gave back unbegun (``unstarted``: the
    lease's time is no start; the attempt keeps it), unless a lease is held now."""
    atts = run.get("attempts")
    started = run.get("started_at")
    if atts and run["state"] != "running" and atts[-1].get("unstarted"):
        started = None
    v = {
        "id": run["id"], "job": run["job"], "slot": schedule.iso(run["slot"]), "slot_ms": run["slot"],
        "state": run["state"], "kind": run.get("kind"),
        "attempt": run.get("attempt"), "fencing_token": run.get("fencing_token"),
        "worker": run.get("worker"), "queue": run.get("queue"), "tenant": run.get("tenant"),
        "fired_at": schedule.iso(run.get("fired_at")), "started_at": schedule.iso(started),
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
    for k in ("backfill", "requeue", "payload", "result", "propagate"):  # a backfill's run, a bulk requeue's, an override
        if k in run:
            v[k] = run[k]
    if "upstream" in run:  # pipelines: what its parents ended with
        up = run["upstream"]
        if isinstance(up, dict):  # a record keeps the reports it had, by parent
            up = [{"job": p, "run": r[1], "outcome": r[0], "token": r[2]} for p, r in sorted(up.items())]
        v["upstream"] = up
    if "waiting_on" in run:  # a child's slot waiting for its parents (pipelines.slot_runs)
        v["waiting_for"] = run["waiting_for"]
        v["waiting_on"] = run["waiting_on"]
    if run["state"] in ("skipped", "coalesced"):
        v["reason"] = run.get("reason")
        if "slot_to" in run:
            v["slot_to"] = schedule.iso(run["slot_to"])
            v["count"] = run.get("count")
    elif run.get("kind") == "backfill":
        v["fire_lag_ms"] = None  # a past slot run on request: no lag of the trigger's
    else:
        # 0 for a run fired ahead of its slot (committed early: docs/design.md, "Firing ahead"),
        # as the job's state.fire_lag_ms counts it.
        v["fire_lag_ms"] = max(0, run["fired_at"] - run["slot"]) if run.get("fired_at") is not None else None
    return v


def tenant_view(t: dict, now_ms: int) -> dict:
    """A tenant (queries.tenant_config): its limit in runs per second and whole tokens, as its
    bucket holds them at ``now_ms`` (null when it has none), its policy (policy_view; null when
    it has none) and its default routes (``notify``; [] when it has none)."""
    lim = t["limit"]
    return {"name": t["name"],
            "rate_per_s": None if lim is None else lim["rate_milli"] / 1000,
            "burst": None if lim is None else lim["burst"],
            # refilled up to now (a walk: the value the last hand-out or refused take left read as a
            # bucket filling on its own between reads)
            "tokens": None if lim is None else round(tokens_at(lim, now_ms) / 1_000_000, 4),
            "policy": None if t["policy"] is None else policy_view(t["policy"]),
            "notify": t["notify"]}


def policy_view(p: dict) -> dict:
    """A tenant's policy (core/tenants.py) in the shape ``PUT /v1/tenants/{name}`` takes it."""
    return {"executors": list(p["executors"]), "placement": {"labels": dict(p["labels"])},
            "network": {"allow": list(p["allow"])}}


def lock_view(name: str, lk: dict) -> dict:
    """A held lock (queries.lock) as ``GET /v1/locks/{name}`` shows it."""
    return {"lock": name, "owner": lk["owner"], "token": lk["token"],
            "expires_at": schedule.iso(lk["deadline"]), "since": schedule.iso(lk["since"])}


def worker_view(w: dict) -> dict:
    """A worker (queries.workers / queries.worker) as ``GET /v1/workers`` shows it: its times as
    ISO text, and the runs it holds (``GET /v1/workers/{id}``) with theirs."""
    out = dict(w)
    for k in ("first_seen", "last_seen"):
        if k in out:
            out[k] = schedule.iso(out[k])
    if "runs" in out:
        out["runs"] = [dict(r, started_at=schedule.iso(r["started_at"]), lease_deadline=schedule.iso(r.pop("deadline")))
                       for r in (dict(x) for x in out["runs"])]
    return out


def deadline_view(d: dict) -> dict:
    """A slot's deadline record (core.deadlines' view) as the API shows it: its instants as ISO
    text and ``why``, a sentence."""
    out = dict(d, slot=schedule.iso(d["slot"]), slot_ms=d["slot"], instant=schedule.iso(d["instant"]),
               judged_at=schedule.iso(d["judged_at"]),
               instants={k: schedule.iso(v) for k, v in d["instants"].items() if v is not None})
    out["why"] = deadlines.explain(d)
    out.pop(deadlines.PARENTS_KEY, None)  # (what explain reads of an upstream miss: said in ``why``)
    return out
