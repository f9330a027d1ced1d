"""The seeded workload and fault schedule, generated up front (before anything starts), saved as
schedule.json, and replayable: the same seed and profile give the same schedule.

Everything random is drawn from ``random.Random(seed)`` here. What only the running system can
tell (which node leads when a fault starts, which worker holds leases) is resolved by the nemesis
at run time and recorded in the history; the pre-drawn ``node`` of each fault is used when the
target is "random" and as the fallback otherwise.
"""
from __future__ import annotations

import hashlib
import random

NEMESES = ("kill", "pause", "partition", "clock", "restart-all", "worker", "power", "membership")
#: The membership nemesis's faults (nemesis.py): a killed member replaced by a new node at other
#: ports; a node added while a member is cut off, and one removed after the heal; the leader
#: removed (it hands over) and a new node added. Each ends with three voting members.
MEMBER_FAULTS = ("member-replace", "member-grow-shrink", "member-remove-leader")
#: Node slots beyond the first three a run with the membership nemesis has (ports, links,
#: proxies from the start): the new nodes it adds.
MEMBER_SPARES = 2
#: Remote workers (``raftsched worker`` processes, outside the quorum) of every run, and the label
#: they carry: a job placed on it runs only on them, the nodes' own workers carry no label.
REMOTE_WORKERS = ("w1", "w2")
FLEET_LABELS = {"pool": "fleet"}
LEASE_TTL_S = 2
CLOCK_JUMP_MS = 3 * LEASE_TTL_S * 1000  # "several lease TTLs"

PROFILES = {
    # About two minutes of faults on a 2-core machine: 12 jobs, two clients, one fault at a time
    # (140 s since the remote workers' three faults joined the twelve on the nodes).
    # With the membership nemesis, one replacement of a killed member (its kill stands in for the
    # random one), and 145 s with calm gaps of at most 3.5 s (140 and 4 before) for the rest to
    # fit beside the power cuts: 36 of 300 seeds' schedules drop a required fault, against 273 of
    # 300 at 140 s and 4 s without it.
    "ci": {"time_limit_s": 145, "jobs_initial": 12, "jobs_min": 10, "jobs_max": 16, "clients": 2,
           "op_gap_s": (1.5, 3.5), "calm_s": (2.5, 3.5), "cron_share": 0.0, "extra_faults": True,
           "placed_share": 0.4, "burst_share": 0.0, "member_faults": ("member-replace",), "pipeline": True},
    # Longer, more jobs, cron schedules too, longer faults; a share of the extra partitions of the
    # leader also run under write load (``burst_share``; the required one always does).
    "soak": {"time_limit_s": 600, "jobs_initial": 16, "jobs_min": 10, "jobs_max": 20, "clients": 3,
             "op_gap_s": (1.0, 3.0), "calm_s": (2.0, 6.0), "cron_share": 0.3, "extra_faults": True,
             "placed_share": 0.4, "burst_share": 0.3, "member_faults": MEMBER_FAULTS, "pipeline": True},
}

EXECUTOR = {"type": "python", "target": "jepsen_runner:attempt"}


def _misfire(rng: random.Random) -> dict:
    policy = rng.choice(["fire_all", "fire_once", "skip"])
    m = {"policy": policy, "grace_s": rng.choice([1, 2])}
    if policy == "fire_all":
        m["max_catchup"] = rng.choice([1, 2, 3])
    return m


def _retry(rng: random.Random) -> dict:
    return {"max_attempts": rng.choice([1, 2, 3]), "backoff_s": rng.choice([0.2, 0.5, 1.0]),
            "backoff_multiplier": rng.choice([1, 2]), "backoff_max_s": 4, "jitter": 0.1}


def _schedule(rng: random.Random, cron_share: float) -> dict:
    every = rng.choice([1, 2, 3])
    if rng.random() < cron_share:
        # Seconds steps that divide 60 make a uniform grid anchored at the epoch.
        return {"cron": f"*/{every} * * * * *"}
    return {"every_s": every}


def _overlap(rng: random.Random) -> dict:
    policy = rng.choices(["allow", "forbid", "queue_one", "replace"], [50, 20, 15, 15])[0]
    return {"policy": policy}


def job_spec(rng: random.Random, cron_share: float, version: int, placed: bool = False) -> dict:
    spec = {"schedule": _schedule(rng, cron_share), "executor": EXECUTOR, "misfire": _misfire(rng),
            "retry": _retry(rng), "overlap": _overlap(rng), "timeout_s": 30, "history": 1000,
            "description": f"version {version}"}
    if placed:  # runs only on the remote workers (docs/workers.md, placement)
        spec["placement"] = {"labels": dict(FLEET_LABELS)}
    return spec


def updated_spec(rng: random.Random, spec: dict, version: int) -> dict:
    """An update keeps the schedule (so the slot grid stays one grid) and the overlap policy, and
    changes the misfire policy, the retry policy or both."""
    new = dict(spec, description=f"version {version}")
    what = rng.choice(["misfire", "retry", "both"])
    if what in ("misfire", "both"):
        new["misfire"] = _misfire(rng)
    if what in ("retry", "both"):
        new["retry"] = _retry(rng)
    return new


#: A job is backfilled once it is this old (seconds of the workload's clock): its range, which
#: ends a few seconds before the backfill and spans a few, then lies in the job's life.
BACKFILL_AGE_S = 14
#: Bulk requeues start once some runs have had time to die.
REQUEUE_AFTER_S = 20


def bulk_op(rng: random.Random, f: str, at: float, client: int, job: str, node: int, op_id: str) -> dict:
    """A backfill of a past range of ``job`` (the client computes the range from its clock:
    ``[now - back_s - span_s, now - back_s)``), or a bulk requeue of dead runs (the job's, or any
    job's with ``any_job``); each
    dry-runs first, then runs with the id ``op_id`` (the same id on a retry)."""
    op = {"at": at, "client": client, "f": f, "job": job, "node": node, "id": op_id}
    if f == "backfill":
        op.update(back_s=rng.choice([2, 3, 4]), span_s=rng.choice([4, 6, 8]),
                  reprocess=rng.choice(["all", "all", "missing"]),
                  order=rng.choice(["oldest", "newest"]), max_concurrent=rng.choice([1, 2, 3]),
                  rate_per_s=rng.choice([2, 5, None]))
    else:
        # Mostly every queue's dead runs (which jobs die is the failure plan's draw), sometimes
        # only this job's.
        op.update(max_count=rng.choice([1, 3, 5]), rate_per_s=rng.choice([2, 5]), any_job=rng.random() < 0.7)
    return op


def generate_workload(rng: random.Random, prof: dict, time_limit_s: float) -> tuple[list, dict]:
    """Client operations ``{"at", "client", "f", "job", "node", "spec"?}`` in time order per client,
    and the failure plan ``{job: {"fail_pct", "work_ms"}}`` for every job the run may create."""
    nclients = prof["clients"]
    plan: dict[str, dict] = {}
    ops: list[dict] = []
    counter = 0
    live: dict[str, dict] = {}     # name -> {"spec", "paused", "owner", "version"}

    def new_job(at: float, client: int) -> None:
        nonlocal counter
        name = f"j{counter:02d}"
        counter += 1
        spec = job_spec(rng, prof["cron_share"], 1, placed=rng.random() < prof.get("placed_share", 0))
        # A third of the jobs work longer than the lease TTL (2 s), so their leases live on
        # heartbeats: renewals, a pause in mid-attempt, a clock jump during a lease.
        long_work = rng.random() < 0.3
        plan[name] = {"fail_pct": rng.choice([0, 0, 25, 50]),
                      "work_ms": [1000, 4000] if long_work else [50, 300]}
        live[name] = {"spec": spec, "paused": False, "owner": client, "version": 1, "created_at": at}
        ops.append({"at": at, "client": client, "f": "create", "job": name, "node": rng.randrange(3), "spec": spec})

    for k in range(prof["jobs_initial"]):
        new_job(round(0.15 * k, 3), k % nclients)
    for c in range(nclients):
        t = 3.0 + rng.uniform(*prof["op_gap_s"])
        while t < time_limit_s - 2:
            mine = [n for n, j in live.items() if j["owner"] == c]
            choices = []
            if mine:
                choices += [("update", 35), ("pause", 15)]
                if any(live[n]["paused"] for n in mine):
                    choices += [("resume", 25)]
                if len(live) > prof["jobs_min"]:
                    choices += [("delete", 6)]
            if len(live) < prof["jobs_max"]:
                choices += [("create", 8)]
            # A backfill needs a job that has had time to fire over a past range of its life.
            old_enough = [n for n in mine if t - live[n]["created_at"] >= BACKFILL_AGE_S]
            if old_enough:
                choices += [("backfill", 10)]
            if mine and t >= REQUEUE_AFTER_S:
                choices += [("requeue", 3)]
            f = rng.choices([x for x, _ in choices], [w for _, w in choices])[0]
            node = rng.randrange(3)
            at = round(t, 3)
            if f == "create":
                new_job(at, c)
            elif f in ("backfill", "requeue"):
                name = rng.choice(sorted(old_enough if f == "backfill" else mine))
                ops.append(bulk_op(rng, f, at, c, name, node, f"{'bf' if f == 'backfill' else 'rq'}-{c}-{len(ops)}"))
            else:
                if f == "resume":
                    name = rng.choice(sorted(n for n in mine if live[n]["paused"]))
                else:
                    name = rng.choice(sorted(mine))
                op = {"at": at, "client": c, "f": f, "job": name, "node": node}
                j = live[name]
                if f == "update":
                    j["version"] += 1
                    j["spec"] = updated_spec(rng, j["spec"], j["version"])
                    op["spec"] = j["spec"]
                elif f == "pause":
                    j["paused"] = True
                elif f == "resume":
                    j["paused"] = False
                elif f == "delete":
                    del live[name]
                ops.append(op)
            t += rng.uniform(*prof["op_gap_s"])
    ops.sort(key=lambda o: (o["at"], o["client"]))
    return ops, plan


# The leader isolated under write load (issue 20): a deposed leader whose log ends in entries of its
# old term must catch up once the partition heals, however far the new leader's log ran past it.
# pysyncobj 0.3.17 never did when the new leader's log ran more than one 64 KiB append message past
# the old leader's tail. While such a partition is in place, writers put jobs of their own (one
# writer through the isolated node, two through the majority) with a padded payload: at
# BURST_RATE_PER_S puts of ~BURST_PAD_BYTES each per majority writer, the majority's log grows by
# ~50 KiB/s, some 300 KiB over the partition once a new leader is elected.
BURST_RATE_PER_S = 6
BURST_PAD_BYTES = 4000
#: The partition of a burst lasts this long: an election (~1-2 s) and several seconds of writes.
BURST_DURATION_S = (7.0, 9.0)
#: A burst job fires rarely: it is there to be written, not to add runs.
BURST_EVERY_S = (20, 30)


def _burst(rng: random.Random, k: int) -> dict:
    """The writers of burst number ``k``: ``via`` "isolated" (the node the partition cuts off) or
    "majority" (the two others, in turn), each with jobs of its own (named ``b<k>w<writer>j<n>``,
    so no two writers, nor a writer and a client, ever write one job), their base specs and
    failure plans. The puts themselves are :func:`burst_op`."""
    writers, plan = [], {}
    for w, (via, njobs) in enumerate((("isolated", 1), ("majority", 2), ("majority", 2))):
        jobs = {}
        for j in range(njobs):
            name = f"b{k}w{w}j{j}"
            spec = job_spec(rng, 0.0, 1)
            spec["schedule"] = {"every_s": rng.choice(BURST_EVERY_S)}
            jobs[name] = spec
            plan[name] = {"fail_pct": rng.choice([0, 25]), "work_ms": [50, 300]}
        writers.append({"via": via, "jobs": jobs})
    return {"rate_per_s": BURST_RATE_PER_S, "pad_bytes": BURST_PAD_BYTES, "writers": writers, "plan": plan}


def _pad(name: str, version: int, n: int) -> str:
    h = hashlib.blake2b(f"{name}#{version}".encode(), digest_size=16).hexdigest()
    return (h * (n // len(h) + 1))[:n]


def burst_op(burst: dict, writer: dict, k: int) -> dict:
    """The ``k``-th put of a burst writer: its jobs in turn, each first created, then updated with
    a new description and payload (the schedule and the policies stay: one grid per job)."""
    names = sorted(writer["jobs"])
    name = names[k % len(names)]
    version = k // len(names) + 1
    spec = dict(writer["jobs"][name], description=f"burst version {version}",
                payload={"pad": _pad(name, version, burst["pad_bytes"])})
    return {"f": "create" if version == 1 else "update", "job": name, "spec": spec}


def burst_ops_max(fault: dict) -> int:
    """Puts a burst writer makes at most: its rate for the partition's duration."""
    return int(fault["burst"]["rate_per_s"] * fault["duration"]) + 2


def _fault(rng: random.Random, kind: str, **kw) -> dict:
    f = {"kind": kind, "node": rng.randrange(3)}
    if kind == "kill":
        f.update(target=kw.get("target", rng.choice(["leader", "random"])), duration=round(rng.uniform(2.0, 5.0), 2))
    elif kind == "pause":
        # Past the lease TTL, so the leader expires the paused worker's leases and regrants.
        f.update(target=kw.get("target", rng.choice(["worker", "leader"])),
                 duration=round(rng.uniform(2.5, 3.5) * LEASE_TTL_S, 2))
    elif kind == "partition":
        f.update(target=kw.get("target", "leader"), mode=kw.get("mode", rng.choice(["blackhole", "reset"])),
                 duration=round(rng.uniform(*(BURST_DURATION_S if "burst" in kw else (5.0, 9.0))), 2))
        if "burst" in kw:
            f["burst"] = kw["burst"]
    elif kind == "clock":
        f.update(target=kw.get("target", rng.choice(["leader", "random"])),
                 offset_ms=kw.get("offset_ms", rng.choice([CLOCK_JUMP_MS, -CLOCK_JUMP_MS])),
                 duration=round(rng.uniform(6.0, 10.0), 2))
    elif kind == "restart-all":
        f.update(target="all", duration=round(rng.uniform(1.0, 3.0), 2))
    elif kind == "power":
        # A power cut: every node of a majority (the leader and one other) or all three is
        # killed and loses every write it had not synced (replication/powerloss.py), then comes
        # back on what its disk kept.
        f.update(target=kw.get("target", rng.choice(["majority", "all"])), duration=round(rng.uniform(1.0, 3.0), 2))
    elif kind == "member-replace":
        f.update(target=kw.get("target", rng.choice(["leader", "random"])), duration=round(rng.uniform(4.0, 5.5), 2))
    elif kind == "member-grow-shrink":
        f.update(target=kw.get("target", rng.choice(["leader", "random"])), mode=rng.choice(["blackhole", "reset"]),
                 remove=rng.choice(["isolated", "leader"]), duration=round(rng.uniform(6.0, 8.0), 2))
    elif kind == "member-remove-leader":
        f.update(target="leader", duration=round(rng.uniform(6.0, 8.0), 2))
    elif kind in ("worker-kill", "worker-pause", "worker-partition"):
        # A remote worker: the one holding the most leases when the fault starts (the nemesis
        # resolves it), else the pre-drawn one. A pause outlasts the lease TTL, as a node's does.
        f.update(target="remote-worker", worker=rng.choice(REMOTE_WORKERS),
                 duration=round(rng.uniform(2.5, 3.5) * LEASE_TTL_S if kind == "worker-pause" else rng.uniform(3.0, 5.0), 2))
        if kind == "worker-partition":
            f["mode"] = kw.get("mode", rng.choice(["blackhole", "reset"]))
    return f


def generate_faults(rng: random.Random, prof: dict, time_limit_s: float, nemeses: list[str]) -> list[dict]:
    """One fault at a time, each followed by a calm gap. The required faults of the CI brief come
    first (in a seeded order, the full restart in the second half), extra random ones fill the
    remaining time; faults that would not end before the time limit are dropped."""
    required = []
    member_faults = list(prof.get("member_faults", MEMBER_FAULTS)) if "membership" in nemeses else []
    if "kill" in nemeses:
        required += [_fault(rng, "kill", target="leader") for _ in range(3)]
        if "member-replace" not in member_faults:  # a replacement kills a member too
            required += [_fault(rng, "kill", target="random")]
    if "pause" in nemeses:
        # Two pauses of a worker inside a long attempt (the stale write fencing must refuse), one
        # of the leader (a zombie leader wakes up deposed).
        required += [_fault(rng, "pause", target="worker"), _fault(rng, "pause", target="worker"),
                     _fault(rng, "pause", target="leader")]
    bursts = 0
    burst_fault = None
    if "partition" in nemeses:
        # One isolation of the leader in each mode; one of the two (its mode drawn) under write
        # load, placed in the first half so it always fits the time limit.
        mode = rng.choice(["blackhole", "reset"])
        burst_fault = _fault(rng, "partition", mode=mode, burst=_burst(rng, bursts))
        bursts += 1
        required += [_fault(rng, "partition", mode="reset" if mode == "blackhole" else "blackhole")]
    if "clock" in nemeses:
        # On the leader: forward, it fires early and its reaper judges leases by its clock;
        # backward, it fires late (misfires) until its clock catches up with the cursors.
        required += [_fault(rng, "clock", target="leader", offset_ms=CLOCK_JUMP_MS),
                     _fault(rng, "clock", target="leader", offset_ms=-CLOCK_JUMP_MS)]
    if "worker" in nemeses:
        # The remote workers: killed, paused past the lease TTL, cut off from every node.
        required += [_fault(rng, "worker-kill"), _fault(rng, "worker-pause"), _fault(rng, "worker-partition")]
    rng.shuffle(required)
    for f in [_fault(rng, k) for k in member_faults]:
        # In the first half, like the burst: a schedule over its time limit drops its last faults
        required.insert(rng.randrange(1, len(required) // 2 + 2), f)
    if burst_fault is not None:
        required.insert(rng.randrange(1, len(required) // 2 + 2), burst_fault)
    if "restart-all" in nemeses:
        required.insert(len(required) // 2 + rng.randrange(len(required) // 2 + 1), _fault(rng, "restart-all"))
    if "power" in nemeses:
        # One cut of a majority (the leader among it), one of the whole cluster, both after the
        # workload has run a while (so there is something to lose).
        required.insert(min(len(required), 1 + rng.randrange(2)), _fault(rng, "power", target="majority"))
        required.insert(len(required) // 2 + rng.randrange(len(required) // 2 + 1), _fault(rng, "power", target="all"))
    faults = []
    t = 6.0  # let the workload create its jobs and runs start first
    queue = list(required)
    kinds = [k for k in nemeses if k in NEMESES and k not in ("worker", "membership")]
    kinds += ["worker-kill", "worker-pause", "worker-partition"] if "worker" in nemeses else []
    kinds += member_faults
    while kinds:
        extra = not queue
        f = queue.pop(0) if queue else (_fault(rng, rng.choice(kinds)) if prof["extra_faults"] else None)
        if f is None:
            break
        if extra and f["kind"] == "partition" and "burst" not in f and rng.random() < prof.get("burst_share", 0):
            f = _fault(rng, "partition", mode=f["mode"], burst=_burst(rng, bursts))
            bursts += 1
        if t + f["duration"] > time_limit_s - 3:
            if queue:
                continue  # a shorter required fault may still fit
            break
        f["at"] = round(t, 2)
        f["id"] = len(faults)
        faults.append(f)
        t += f["duration"] + rng.uniform(*prof["calm_s"])
    return faults


#: The ``pipeline`` workload (docs/pipelines.md): a chain A -> B -> C and a diamond A -> {B, C} -> D,
#: put by client 0 before anything else, never changed by the clients; the middle steps fail a
#: share of their attempts (``fail_pct``), so children record ``upstream_failed`` too. The
#: ``pipeline`` checker judges them (checker.check_pipeline).
PIPELINE_JOBS = (
    ("pa", {"schedule": {"every_s": 2}}, {"fail_pct": 0, "work_ms": [50, 300]}),
    ("pb", {"after": [{"job": "pa", "on": "success"}]}, {"fail_pct": 25, "work_ms": [50, 300]}),
    ("pc", {"after": [{"job": "pb", "on": "success"}]}, {"fail_pct": 0, "work_ms": [50, 200]}),
    ("da", {"schedule": {"every_s": 3}}, {"fail_pct": 0, "work_ms": [50, 300]}),
    ("db", {"after": [{"job": "da", "on": "success"}]}, {"fail_pct": 25, "work_ms": [50, 300]}),
    ("dc", {"after": [{"job": "da", "on": "finished"}]}, {"fail_pct": 0, "work_ms": [50, 300]}),
    ("dd", {"after": [{"job": "db", "on": "success"}, {"job": "dc", "on": "success"}]},
     {"fail_pct": 0, "work_ms": [50, 200]}),
)


def pipeline_ops() -> tuple[list, dict]:
    """The pipeline workload's create operations (at the start, client 0) and failure plans."""
    ops, plan = [], {}
    for k, (name, part, fp) in enumerate(PIPELINE_JOBS):
        spec = {"executor": EXECUTOR, "retry": {"max_attempts": 2, "backoff_s": 0.2, "backoff_multiplier": 1,
                                                "backoff_max_s": 1, "jitter": 0.1},
                "timeout_s": 30, "history": 1000, **part}
        if "schedule" in part:
            spec["misfire"] = {"policy": "fire_all", "grace_s": 2, "max_catchup": 3}
        ops.append({"at": round(0.001 * k, 3), "client": 0, "f": "create", "job": name, "node": k % 3, "spec": spec,
                    "pipeline": True})
        plan[name] = dict(fp)
    return ops, plan


def generate(seed: int, profile: str, time_limit_s: float | None, nemeses: list[str]) -> dict:
    prof = PROFILES[profile]
    tl = float(time_limit_s if time_limit_s is not None else prof["time_limit_s"])
    rng = random.Random(seed)
    ops, plan = generate_workload(random.Random(rng.random()), prof, tl)
    if prof.get("pipeline"):  # drawn from no generator: the rest of the schedule is as without it
        p_ops, p_plan = pipeline_ops()
        ops = sorted(p_ops + ops, key=lambda o: (o["at"], o["client"]))
        plan.update(p_plan)
    faults = generate_faults(random.Random(rng.random()), prof, tl, nemeses)
    for f in faults:  # the burst writers' jobs, for the runner and the checkers
        plan.update((f.get("burst") or {}).get("plan") or {})
    return {"seed": seed, "profile": profile, "time_limit_s": tl, "nemeses": list(nemeses),
            "spares": MEMBER_SPARES if "membership" in nemeses else 0,
            # the nodes write through the power-loss model (--simulate-power-loss) only when a
            # power cut is in the schedule
            "power_model": "power" in nemeses,
            "lease_ttl_s": LEASE_TTL_S, "clients": prof["clients"], "ops": ops, "plan": {"jobs": plan},
            "faults": faults, "remote_workers": list(REMOTE_WORKERS), "fleet_labels": dict(FLEET_LABELS)}
