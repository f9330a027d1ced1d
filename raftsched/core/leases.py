"""Leased execution: acquire, heartbeat, complete, expire and takeover (DESIGN.md section 3).

Every handler here is deterministic and takes its time from the command (``now``).

Lifecycle of a run::

    queued --acquire--> running --complete ok--> succeeded
       ^                   |--complete failed--> failures < max_attempts: queued, due = now + backoff
       |                   |                     else dead (the queue's DLQ)
       |                   |--expire (lease lost)--> lost <= lease_losses_max: queued, due = now
       |                   |                         else dead
       |                   |--overlap replace--> failed (revoked)
       |                   \\--cancel_run--> failed (core/cancel.py; a queued run: skipped, cancelled)
       +---- dlq_requeue (fresh budgets) <---- dead

Every grant of a lease takes a new token from one global counter that only increases (I13); a
``heartbeat`` or ``complete`` carrying any other token than the run's current one is refused, so
a worker that was paused past its lease can never overwrite the newer attempt's outcome (I14).
The queues a run waits in, and the dead-letter queue, are queues.py's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import deadlines, limits, pipelines
from .errors import Conflict, InvalidCommand, NotFound
from .locks import count_tenants
from .placement import placement_ok
from .events import CONSECUTIVE, LAST_SLOT, LAST_SUCCESS, emit
from .notify import RUN_OUTCOMES, on_attempt_failed, on_dead, on_slot_recorded, on_success
from .policy import backoff_ms
from .queues import add_dead, enqueue, unqueue_count
from .ready import ReadyIndex
from .deadlines import on_finish
from .records import HANDLER_WAITED, NONE_KEPT, Record, Result, bound_text, is_int, kept_attempts, ok, run_ids_digest
from .tenants import LIMITED, dispatch_refusal, network_of, tenant_take

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState


# -------------------------------------------------------------- acquire
def apply_acquire(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``acquire {worker, queues, max, ttl, types?, tenants?}``: lease up to ``max`` runs of ``queues``
    (None: every queue) to ``worker`` for ``ttl`` ms, highest priority first, then earliest due,
    then run id, among the runs whose due has come. With ``types``, runs of other executor
    types stay queued for another worker; with ``tenants`` (the worker's token is limited to
    them: node/fleet.py), runs of other tenants stay queued likewise (I23); a run whose tenant
    is over its rate stays queued too. At most ``limits.acquire_scan_max`` runs are looked at. Each grant carries a new
    fencing token and what the worker needs to run it (executor, payload, timeout).

    A run whose job breaks the policy that holds it (tenants.policy_of: a policy narrowed after
    the job was written) is never handed out: it is recorded skipped, reason ``policy``, its
    error naming the rule (``refused`` counts them in the result, when there are some).

    The worker fleet (workers.py): a run whose job has a placement goes only to a worker
    whose registered labels satisfy it (I18; an unregistered worker has no labels), and is held
    back for another one otherwise; a worker dedicated to some of its labels is granted only
    runs placed on them; a draining worker is granted nothing (the result says
    ``draining``); a registered worker is seen at ``now`` and counts its grants.

    ``by``, the node that proposed it (commands.acquire): a replica whose ``answers_for`` is
    another node's name leases the same runs and builds no grants (``runs`` is empty): only the
    proposer's answer is read, and an acquire's is remembered nowhere (it has no request id).
    Building a grant was a sixth of an acquire's instructions a run, on every replica.

    :raises InvalidCommand: no worker, ``max`` outside 1..acquire_runs_max, ``ttl`` outside
        the lease range, or queues / types / tenants that are not lists of names."""
    worker, queues, n, ttl = cmd.get("worker"), cmd.get("queues"), cmd.get("max"), cmd.get("ttl")
    if not isinstance(worker, str) or not worker:
        raise InvalidCommand("acquire needs worker")
    if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)):
        raise InvalidCommand("acquire.queues must be a list of names or nil")
    if not is_int(n) or not 1 <= n <= limits.acquire_runs_max:
        raise InvalidCommand(f"acquire.max must be 1..{limits.acquire_runs_max}")
    if not is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max:
        raise InvalidCommand("acquire.ttl out of range")
    types = cmd.get("types")
    if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
        raise InvalidCommand("acquire.types must be a list of executor types or nil")
    handler_wait = limits.handler_wait_ms
    only = tenants_field(cmd, "acquire")
    by, mine = cmd.get("by"), s.answers_for
    answer = mine is None or type(by) is not str or by == mine
    w = s.workers.get(worker)
    if w is not None:
        if now > w["last_seen"]:
            w["last_seen"] = now
        if w["state"] == "draining":
            return {"ok": True, "runs": [], "draining": True}
        labels = w["labels"]
        dedicated = w.get("dedicated", ())  # (a record holds the key only when it is not empty)
        # The python targets it has handlers for (workers.TARGETS), or None: any. A run of
        # another executor type has no target: _NO_TARGET, which the set holds, passes. A run due
        # limits.handler_wait_ms ago or more passes too, and is marked (HANDLER_WAITED): the
        # worker refuses it, visibly, and its retries wait no more (a DLQ requeue clears it).
        has = w.get("targets")
        targets = None if has is None else frozenset(has).union((_NO_TARGET,))
    else:
        labels, dedicated, targets = _NO_LABELS, (), None
    queued = s._queued
    names = sorted(set(queues)) if queues is not None else sorted(queued)
    held_back: list[tuple[ReadyIndex, tuple[int, str]]] = []
    # The ids held back: a second entry of one of them is stale (a job deleted and put again
    # re-creates its run ids, and its old entries look live again on a replica that kept them,
    # where a restored one has one entry a run), passed over uncounted, as any stale entry.
    held: set[str] = set()
    scanned = 0
    runs = s.runs
    # The served queues' indexes (heaps, in what they hand out: ready.py), highest priority
    # first. Handed out by the key (-priority, due, run id) among the runs whose due has come:
    # a merge of the indexes' heads.
    # An entry is live when its run is queued in this heap's queue, at this priority and
    # due: a run id can come back in another queue (a job deleted and put again in another
    # queue re-creates its ids), and the old queue's entry must not hand it out; a replica
    # restored from a snapshot has no such entry.
    heaps = sorted(((q, p, h) for q in names for p, h in queued.get(q, {}).items() if h),
                   key=lambda qph: -qph[1])
    policed = bool(s.tenant_policies)  # else only a job written by a limited token is held
    refused = 0
    if len(heaps) == 1 and only is None and not s.tenants and s._fast_paths:
        # One heap, no tenants asked for and no tenant rate limits: the loop below, reduced to
        # popping that heap in key order (tests/test_state_fast_paths.py compares the two).
        # Executor types and placement are looked at per run, in the loop's order: a worker of
        # some executors only (raftsched worker --executors, --app) takes this path too.
        q, p, h = heaps[0]
        jobs = s.jobs
        peek, drop = h.peek_due_by, h.drop_first
        # Whether this worker's labels satisfy a placement, by the placement's object: specs share
        # their parts (records.SHARED_PARTS), so a fleet's jobs are read once a command, not once a
        # run. The answer depends on the placement, the labels and dedicated only, and every
        # placement object stays alive (its spec holds it) while the command applies.
        placed: dict[int, bool] = {}
        # The index is read a due's worth at a time, never more than the grants and the scan
        # have room for (so exactly the entries the pops would take: an entry adds one at most to
        # each count), and the entries looked at are taken out after: the index is as the pops
        # leave it whenever anything else may read it (a refusal's bookkeeping, which may queue
        # runs: the index is read again after it). _grant's writes to the run are inline, in its
        # order; the token, the queue's two counts and the starts' histogram are settled once,
        # and before a refusal; the grants are built once the state has moved (the proposer's
        # replica only builds them: a bug there fails its answer, not its state).
        tok = s.fencing_token
        deadline = now + ttl
        running_ids = s._running_ids
        scan_max = limits.acquire_scan_max
        started: list[Record] = []  # leased, not yet settled
        leased: list[tuple[Record, Record | None]] = []  # leased, with their jobs: the grants
        count = due = looked = dropped = 0  # (of the due read: the entries looked at, taken out)
        try:
            while count < n and scanned < scan_max:
                got = peek(now, min(n - count, scan_max - scanned))
                if got is None:
                    break
                due, rids = got
                looked = dropped = 0
                for rid in rids:
                    looked += 1
                    run = runs.get(rid)
                    if run is None or run["state"] != "queued" or run["priority"] != p \
                            or run.get("due", run["slot"]) != due or run["queue"] != q or rid in held:
                        continue  # stale index entry
                    scanned += 1
                    lacks = False
                    job = jobs.get(run["job"])
                    if job is not None:
                        spec = job["spec"]
                        if types is not None and spec["executor"]["type"] not in types:
                            held_back.append((h, (due, rid)))  # another worker runs this executor type
                            held.add(rid)
                            continue
                        if targets is not None and spec["executor"].get("target", _NO_TARGET) not in targets:
                            if HANDLER_WAITED not in run and now - due < handler_wait:
                                held_back.append((h, (due, rid)))  # a worker with its handler takes it
                                held.add(rid)
                                continue
                            lacks = True
                        if policed or LIMITED in spec:
                            why = dispatch_refusal(s, spec)
                            if why is not None:
                                j, dropped = looked - dropped, looked
                                drop(due, j)
                                s.fencing_token = tok
                                done, started = started, []
                                _settle(s, q, done, now)
                                _refuse(s, run, why, now)
                                refused += 1
                                break  # (the index is read again)
                        if "placement" in spec or dedicated:
                            key = id(spec.get("placement"))
                            fits = placed.get(key)
                            if fits is None:
                                fits = placed[key] = placement_ok(spec, labels, dedicated)
                            if not fits:
                                held_back.append((h, (due, rid)))  # I18: another worker's labels satisfy it
                                held.add(rid)
                                continue
                    tok += 1  # I13: one counter, only increases
                    if lacks:
                        run[HANDLER_WAITED] = True
                    run["state"] = "running"
                    run["fencing_token"] = tok
                    run["worker"] = worker
                    run["started_at"] = now
                    run["deadline"] = deadline
                    run["ttl"] = ttl
                    run["finished_at"] = None
                    run["renewals"] = 0
                    running_ids[rid] = None
                    started.append(run)
                    if answer:
                        leased.append((run, job))
                    count += 1
                j, dropped = looked - dropped, looked
                drop(due, j)
        except Exception:
            # A bug (state.py refuses the command as a value): the entries looked at are out of
            # the index, the one at hand included, as the pops would have left them.
            j, dropped = looked - dropped, looked
            drop(due, j)
            raise
        finally:  # (whatever happens: the counts stay true to the leases made)
            s.fencing_token = tok
            _settle(s, q, started, now)
        _put_back(held_back)
        if w is not None:
            w["grants"] += count
        return _acquired([_grant_map(s, run, job, run["fencing_token"], deadline) for run, job in leased], refused)
    leases_made: list[tuple[Record, Record | None]] = []
    while len(leases_made) < n and scanned < limits.acquire_scan_max:
        best: tuple[int, int, str] | None = None  # (-priority, due, run id) of the next grant
        best_h: ReadyIndex | None = None  # and its index
        for q, p, h in heaps:
            if best is not None and -p > best[0]:
                break  # lower priorities than the best found so far
            while True:
                top = h.head()
                if top is None or top[0] > now:
                    break
                due, rid = top
                run = runs.get(rid)
                if run is None or run["state"] != "queued" or run["priority"] != p \
                        or run.get("due", run["slot"]) != due or run["queue"] != q:
                    h.pop()  # stale index entry
                    continue
                if best is None or (-p, due, rid) < best:
                    best, best_h = (-p, due, rid), h
                break
        if best is None or best_h is None:  # (both set together)
            break
        entry = best_h.pop()
        if entry[1] in held:
            continue  # a second entry of a run held back: stale (above)
        scanned += 1
        run = runs[best[2]]
        job = s.jobs.get(run["job"])
        if types is not None:
            if job is not None and job["spec"]["executor"]["type"] not in types:
                held_back.append((best_h, entry))  # another node runs this executor type
                held.add(entry[1])
                continue
        lacks = targets is not None and job is not None \
            and job["spec"]["executor"].get("target", _NO_TARGET) not in targets
        if lacks and HANDLER_WAITED not in run and now - entry[0] < handler_wait:
            held_back.append((best_h, entry))  # a worker with its handler takes it
            held.add(entry[1])
            continue
        if only is not None and run["tenant"] not in only:
            held_back.append((best_h, entry))  # I23: a worker of its tenant takes it
            held.add(entry[1])
            continue
        if job is not None and (policed or LIMITED in job["spec"]) and _refused(s, run, job, now):
            refused += 1
            continue
        if job is not None and ("placement" in job["spec"] or dedicated) \
                and not placement_ok(job["spec"], labels, dedicated):
            held_back.append((best_h, entry))  # I18: another worker's labels satisfy it
            held.add(entry[1])
            continue
        if not tenant_take(s, run["tenant"], now):
            held_back.append((best_h, entry))  # over its rate: wait; others go ahead
            held.add(entry[1])
            continue
        if lacks:
            run[HANDLER_WAITED] = True
        _grant(s, run, worker, ttl, now)
        leases_made.append((run, job))
    _put_back(held_back)
    if w is not None:
        w["grants"] += len(leases_made)
    # The grants once the state has moved (the proposer's replica only: a bug there fails its
    # answer, not its state, which stays the other replicas').
    return _acquired([_grant_map(s, run, job, run["fencing_token"], run["deadline"]) for run, job in leases_made]
                     if answer else [], refused)


def _put_back(held_back: list[tuple[ReadyIndex, tuple[int, str]]]) -> None:
    """Put the entries an acquire passed over back in their indexes, last taken first: each
    index handed its own out smallest first, so each goes back in front of the rest and a
    sorted bucket stays sorted (ready.py)."""
    for h, (due, rid) in reversed(held_back):
        h.push(due, rid)


def _acquired(granted: list[dict[str, Any]], refused: int) -> Result:
    if refused:  # only then: a result without it is the one it always was
        return {"ok": True, "runs": granted, "refused": refused}
    return {"ok": True, "runs": granted}


def _refused(s: SchedulerState, run: Record, job: Record, now: int) -> bool:
    """Whether the policy holding ``job`` refuses its queued ``run`` (out of its queue's index
    already): then the run is recorded skipped, reason ``policy``, and nothing runs."""
    why = dispatch_refusal(s, job["spec"])
    if why is None:
        return False
    _refuse(s, run, why, now)
    return True


def _refuse(s: SchedulerState, run: Record, why: str, now: int) -> None:
    """Record ``run`` skipped, reason ``policy``, its error ``why`` (dispatch_refusal's)."""
    unqueue_count(s, run)
    run.update(state="skipped", reason="policy", error=why, finished_at=now)
    s.stats.on_recorded("skipped", "policy")
    # A final outcome like any recorded slot's (fire.dropped): told, its deadline judged.
    on_slot_recorded(s, run, now)
    on_finish(s, run, now)
    if run["job"] in s.pipes.children:
        pipelines.notify(s, run, now)


#: the labels of an unregistered worker (never changed)
_NO_LABELS: dict[str, str] = {}
#: The target of a run whose executor has none (not python), for a worker's targets (apply_acquire):
#: no python target is empty (model.TARGET_RE).
_NO_TARGET = ""

#: the spec a grant reads when its run's job is gone (never changed)
_NO_SPEC: Record = {}


def _grant(s: SchedulerState, run: Record, worker: str, ttl: int, now: int) -> None:
    """Lease a queued run (out of its queue's index already) to ``worker`` (its grant, the
    answer, is ``_grant_map``'s, built once the command's state has moved)."""
    s.fencing_token = tok = s.fencing_token + 1  # I13: one counter, only increases
    rid, q = run["id"], run["queue"]
    s._queue_depth[q] = s._queue_depth.get(q, 1) - 1
    s.stats.on_start(run, now)
    run["state"] = "running"
    run["fencing_token"] = tok
    run["worker"] = worker
    run["started_at"] = now
    run["deadline"] = now + ttl
    run["ttl"] = ttl
    run["finished_at"] = None
    run["renewals"] = 0
    s._running_ids[rid] = None
    s._running_count[q] = s._running_count.get(q, 0) + 1


def _settle(s: SchedulerState, q: str, started: list[Record], now: int) -> None:
    """The counts of ``started``, runs of queue ``q`` leased by apply_acquire's one-heap loop, as
    _grant writes them a run (stats.on_start reads a run's kind, attempts and slot, which a lease
    does not change, so it may see the run leased)."""
    c = len(started)
    if c:
        s._queue_depth[q] = s._queue_depth.get(q, 1) - c
        s._running_count[q] = s._running_count.get(q, 0) + c
        s.stats.on_starts(started, now)


def _grant_map(s: SchedulerState, run: Record, job: Record | None, tok: int, deadline: int) -> dict[str, Any]:
    """A grant: what the worker needs to run ``run``, just leased with token ``tok``."""
    if job is None:
        executor = payload = None
        timeout_s = limits.timeout_s_default
        spec = _NO_SPEC
    else:
        spec = job["spec"]
        executor, payload, timeout_s = spec["executor"], spec["payload"], spec["timeout_s"]
    if "payload" in run:  # a trigger's or a backfill's override
        payload = run["payload"]
    g = {
        "id": run["id"], "job": run["job"], "slot": run["slot"], "attempt": run["attempt"],
        "token": tok, "deadline": deadline, "queue": run["queue"],
        "executor": executor, "payload": payload, "timeout_s": timeout_s,
    }
    if "upstream" in run:  # pipelines: what its parents ended with (RAFTSCHED_UPSTREAM)
        g["upstream"] = run["upstream"]
    if job is not None and "deadline" in spec:
        start_by = deadlines.late_start_by(spec, run)
        if start_by is not None:  # late_start skip: the worker starts it by then or gives it back
            g["start_by"] = start_by
    if job is not None and executor is not None and executor.get("type") == "http" \
            and (s.tenant_policies or LIMITED in spec):
        allow = network_of(s, spec)
        if allow is not None:  # the worker checks where the run connects (core/network.py)
            g["network"] = {"allow": allow, "tenant": spec["tenant"]}
    if job is not None and ("secrets" in spec or "keep_output" in spec):
        # What only a job that declares them has: the secrets its run is given (as environment
        # or headers), and whether its output is kept (the worker drops it before reporting).
        for k in ("secrets", "keep_output"):
            if k in spec:
                g[k] = spec[k]
    return g


def tenants_field(cmd: Command, op: str) -> frozenset[str] | None:
    """A command's ``tenants``: those of the token of the worker it speaks for (node/fleet.py),
    or None (absent: every tenant). The worker protocol's commands that carry it act only on
    runs of those tenants (I23). :raises InvalidCommand: not a list of names."""
    only = cmd.get("tenants")
    if only is None:
        return None
    if not isinstance(only, list) or not all(isinstance(t, str) for t in only):
        raise InvalidCommand(f"{op}.tenants must be a list of tenant names or nil")
    return frozenset(only)


def outside(run: Record, only: frozenset[str] | None) -> bool:
    """Whether ``run`` is not one of the tenants ``only`` (None: every tenant) allows."""
    return only is not None and run.get("tenant") not in only


# -------------------------------------------------------------- heartbeat / complete
def live(s: SchedulerState, rid: object, tok: object) -> Record | None:
    """The run ``rid`` if it is running under token ``tok``, else None."""
    run = s.runs.get(rid) if isinstance(rid, str) else None
    if run is None or run["state"] != "running" or run.get("fencing_token") != tok:
        return None
    return run


def apply_heartbeat(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``heartbeat {worker, leases: [[run_id, token], ...], ttl, tenants?}``: extend each lease
    the worker still holds to ``now + ttl`` (never shorten it) and count a renewal. The result
    lists the leases it no longer holds (``lost``): their worker must stop them; and says
    ``draining`` when the worker is registered and draining (workers.py). With ``tenants``, a
    lease of a run of another tenant is ``lost`` (I23).

    :raises InvalidCommand: no worker, more than heartbeat_leases_max leases, a malformed
        lease, a ttl out of range, or tenants that are not a list of names."""
    worker, leases, ttl = cmd.get("worker"), cmd.get("leases"), cmd.get("ttl")
    if not isinstance(worker, str) or not isinstance(leases, list) or len(leases) > limits.heartbeat_leases_max:
        raise InvalidCommand("heartbeat needs worker and a bounded list of leases")
    if not is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max:
        raise InvalidCommand("heartbeat.ttl out of range")
    only = tenants_field(cmd, "heartbeat")
    lost, extended = [], 0
    for item in leases:
        if not (isinstance(item, list) and len(item) == 2 and is_int(item[1])):
            raise InvalidCommand("heartbeat lease must be [run_id, token]")
    w = s.workers.get(worker)
    if w is not None and now > w["last_seen"]:
        w["last_seen"] = now  # a registered worker is seen (workers.py)
    for rid, tok in leases:
        run = live(s, rid, tok)
        if run is None or run["worker"] != worker or outside(run, only):
            lost.append(rid)
            continue
        run["deadline"] = max(run["deadline"], now + ttl)
        run["ttl"] = ttl
        # The reaper identifies a lease by its renewal count, not its deadline: a deadline
        # may not move (state time ahead of this worker's clock) while the lease is renewed.
        run["renewals"] = run.get("renewals", 0) + 1
        extended += 1
    if w is not None and w["state"] == "draining":
        return {"ok": True, "extended": extended, "lost": lost, "draining": True}
    return {"ok": True, "extended": extended, "lost": lost}


def apply_complete(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``complete {run, token, success, error?, output?, result?}``: the outcome of the run's current
    attempt (error and output bounded to their last characters; a ``result`` is kept with a
    success when it fits result_bytes_max and the job has children, to be handed to them: pipelines). A success ends the run; a
    failure retries it after its backoff or sends it to the DLQ (``finish_attempt``). The
    outcome of an attempt the cluster ended while it ran (``killed_output``), sent by the worker
    that held it (``worker``, which complete_many passes), changes nothing but the run's output,
    once: answered with ``"kept": "output"``.

    :raises InvalidCommand: run, token or success missing. :raises NotFound: no such run.
    :raises Conflict: ``token`` is not the run's current one (a stale worker: I14)."""
    rid, tok, success = cmd.get("run"), cmd.get("token"), cmd.get("success")
    if not isinstance(rid, str) or not is_int(tok) or not isinstance(success, bool):
        raise InvalidCommand("complete needs run, token, success")
    run = s.runs.get(rid)
    if run is None:
        raise NotFound(f"no run {rid!r}", field="run")
    if run["state"] != "running" or run.get("fencing_token") != tok:  # not live(s, rid, tok)
        worker = cmd.get("worker")
        if killed_output(run, tok) and worker is not None and worker == run["worker"]:
            # The cluster ended this attempt (a cancel, a replace) and its worker killed it: the
            # run keeps its outcome; the output of what ran is kept, once.
            output = bound_text(cmd.get("output"), limits.output_bytes_max)
            run["output"] = output if isinstance(output, str) else ""
            return {"ok": True, "run": rid, "state": run["state"], "attempt": run["attempt"], "kept": "output"}
        raise Conflict(_stale_message(run, rid, tok), field="token", code_detail="stale_token")
    error = bound_text(cmd.get("error"), limits.error_chars_max)
    output = bound_text(cmd.get("output"), limits.output_bytes_max)
    if success and cmd.get("result") is not None and run["job"] in s.pipes.children:
        run["result"] = pipelines.check_result(cmd["result"])  # kept for its children only
    finish_attempt(s, run, now, success, error, output)
    return {"ok": True, "run": rid, "state": run["state"], "attempt": run["attempt"]}


def killed_output(run: Record, tok: object) -> bool:
    """Whether an outcome under ``tok`` is that of an attempt the cluster ended while it ran
    (deadlines.end_lease: a cancel, an overlap replace, a heartbeat job's fail ping) and whose
    output is not kept yet: its worker killed it and reports what it wrote; the run keeps the
    outcome the cluster gave it."""
    if run["state"] != "failed" or run.get("output") is not None or run.get("fencing_token") != tok:
        return False
    kept = run.get("attempts")
    if type(kept) is not list or not kept:
        return False
    last = kept[-1]
    return type(last) is dict and last.get("killed") is True and last.get("token") == tok


def _stale_message(run: Record, rid: str, tok: object) -> str:
    """Why an outcome under token ``tok`` is refused: another attempt's token, or this
    attempt's, once it is no longer running (reported already, or its lease lost)."""
    cur = run.get("fencing_token")
    if cur == tok:
        return (f"token {tok} is stale for run {rid}: that attempt is no longer running (the run "
                f"is {run['state']}: its outcome was reported already, or its lease was lost)")
    return f"token {tok} is stale for run {rid}: its current token is {cur} and its state {run['state']}"


def apply_complete_many(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``complete_many {rows: [[run, token, success, error, output, result?], ...], worker?, own?,
    tenants?}``: several outcomes in one command (a worker batches the completions of a few
    ms): each item is judged like ``complete``, alone; a stale item is refused without affecting
    the others. Returns ``{"ok": true, "judged": [...], "ids": digest}``, one item per outcome,
    in order, in short: a success's attempt number, or the outcome's whole answer
    (records.outcome_results reads it, with the run ids of the request's outcomes). The outcomes are rows, not maps, since
    2026-12-05 (commands.complete_many): a map's five keys were five strings decoded and hashed
    on every replica, most of the command's decode. ``results: [{run, token, success, error?,
    output?, result?}, ...]``, as older nodes wrote it, is applied the same (journals and dumps
    of older versions replay); a command holds one of the two.

    What a remote worker's completions carry (node/fleet.py): with ``own: true``, an outcome for
    a running run that another worker than ``worker`` holds is refused as stale, whatever its
    token (a token is a counter's value, not a secret); with ``tenants``, an outcome for a run
    of another tenant is refused as for a run that does not exist (I23).

    :raises InvalidCommand: no outcomes or both forms, more than complete_batch_max, an item
        without run, token and success, a row of another length, ``own`` not a boolean, or
        malformed tenants (then none applies)."""
    rows = cmd.get("rows")
    if rows is not None:
        if "results" in cmd or not isinstance(rows, list) or not 1 <= len(rows) <= limits.complete_batch_max:
            raise InvalidCommand(f"complete_many needs 1..{limits.complete_batch_max} rows, and no results")
        for row in rows:
            if not (type(row) is list and 5 <= len(row) <= 6 and isinstance(row[0], str)
                    and (type(tok := row[1]) is int or is_int(tok)) and isinstance(row[2], bool)):
                raise InvalidCommand("each row is [run, token, success, error, output] or with a result")
    else:
        items = cmd.get("results")
        if not isinstance(items, list) or not 1 <= len(items) <= limits.complete_batch_max:
            raise InvalidCommand(f"complete_many needs 1..{limits.complete_batch_max} results")
        for it in items:
            if not (isinstance(it, dict) and isinstance(it.get("run"), str)
                    and (type(tok := it.get("token")) is int or is_int(tok)) and isinstance(it.get("success"), bool)):
                raise InvalidCommand("each result needs run, token, success")
        rows = [[it["run"], it["token"], it["success"], it.get("error"), it.get("output"), it.get("result")]
                for it in items]
    worker = cmd.get("worker")
    own = cmd.get("own", False)
    if not isinstance(own, bool) or (own and not isinstance(worker, str)):
        raise InvalidCommand("complete_many.own must be a boolean, and needs worker")
    only = tenants_field(cmd, "complete_many")
    w = s.workers.get(worker) if isinstance(worker, str) else None
    if w is not None and now > w["last_seen"]:
        w["last_seen"] = now  # a registered worker is seen (workers.py)
    out = []
    accepted = 0  # the outcomes applied (the worker's count)
    fast = s._fast_paths
    runs = s.runs
    deadline_book = s.deadlines
    running_count, running_ids, healths, children = s._running_count, s._running_ids, s.health, s.pipes.children
    succeeded: list[Record] = []  # the fast path's, for the stats (once, after the loop)
    try:
        for row in rows:
            rid = row[0]
            run = runs.get(rid)
            if run is not None and (own or only is not None):
                if only is not None and run.get("tenant") not in only:  # outside(run, only), inline
                    out.append({"ok": False, "run": rid, "error": NotFound(f"no run {rid!r}", field="run").to_dict()})
                    continue
                if own and run["state"] == "running" and run["worker"] != worker:
                    out.append({"ok": False, "run": rid, "error": Conflict(
                        f"run {rid} is held by another worker than {worker}", field="token",
                        code_detail="stale_token").to_dict()})
                    continue
            if fast and row[2] and run is not None and run["state"] == "running" \
                    and run.get("fencing_token") == row[1]:
                # A success of the current attempt (nearly every item): apply_complete and
                # finish_attempt inline (close_attempt's success, and notify.on_success's job health
                # of a job with no consecutive failures, so no open incident, and no sinks), the same
                # changes in the same order.
                error, output = row[3], row[4]
                if error is not None:
                    error = bound_text(error, limits.error_chars_max)
                if output is not None:
                    output = bound_text(output, limits.output_bytes_max)
                q = run["queue"]
                running_count[q] = running_count.get(q, 1) - 1
                running_ids.pop(run["id"], None)
                kept = run.get("attempts")
                if kept is None:
                    run["attempts"] = NONE_KEPT  # (close_attempt says why)
                elif len(kept) >= limits.attempts_kept_max:
                    del kept[0]
                run["finished_at"] = now
                run["error"] = error
                run["output"] = output
                run["deadline"] = None
                succeeded.append(run)
                run["state"] = "succeeded"
                if deadline_book.slots or deadline_book.since:
                    on_finish(s, run, now)
                name = run["job"]
                h = healths.get(name)
                if h is None or h[CONSECUTIVE] or s.sinks or run.get("kind") == "backfill" or "backfill" in run:
                    on_success(s, run, now)
                else:
                    h[LAST_SUCCESS] = now
                    last = h[LAST_SLOT]  # (not notify.older_than_last, inline)
                    if last is None or last[1] not in RUN_OUTCOMES or type(last[0]) is not int \
                            or type(run["slot"]) is not int or run["slot"] >= last[0]:
                        h[LAST_SLOT] = [run["slot"], "succeeded", None]
                if name in children:
                    if len(row) > 5 and row[5] is not None:  # kept for its children only
                        run["result"] = pipelines.check_result(row[5])
                    pipelines.notify(s, run, now)
                out.append(run["attempt"])  # (records.outcome_results: a success, in short)
                accepted += 1
                continue
            try:
                r = apply_complete(s, {"run": rid, "token": row[1], "success": row[2], "error": row[3], "output": row[4],
                                       "result": row[5] if len(row) > 5 else None,
                                       "worker": worker if isinstance(worker, str) else None}, now)
            except (Conflict, NotFound) as e:
                out.append({"ok": False, "run": rid, "error": e.to_dict()})
                continue
            if r["ok"] and "kept" not in r:  # (a killed attempt's output is no outcome)
                accepted += 1
                if r["state"] == "succeeded":
                    out.append(r["attempt"])  # in short, as the fast path's
                    continue
            out.append(r)
    finally:  # (apply keeps what a command that raises did: the stats count it too)
        if succeeded:
            s.stats.on_successes(succeeded, now)
    if w is not None:
        w["completed"] += accepted  # the worker's accepted outcomes
    return {"ok": True, "judged": out, "ids": run_ids_digest([row[0] for row in rows])}


def close_attempt(s: SchedulerState, run: Record, now: int, success: bool, error: str | None,
                  output: str | None) -> None:
    """End the current attempt's lease and record it in ``run["attempts"]`` (the last
    ``attempts_kept_max``), but a success's (records.attempts_of); the caller decides the run's
    next state: ``succeeded`` after a success, always."""
    q = run["queue"]
    s._running_count[q] = s._running_count.get(q, 1) - 1
    s._running_ids.pop(run["id"], None)
    if success:
        # Not stored: a succeeded run's last attempt is its own fields (records.attempts_of, and
        # the snapshot writes it as it always did). A map and a list less on every replica for
        # nearly every run, ~360 of ~700 bytes a finished run's records hold (docs/design.md).
        # What is kept makes room for it as if it were.
        kept = run.get("attempts")
        if kept is None:
            run["attempts"] = NONE_KEPT  # the key where the record's list would be: snapshot.py
        elif len(kept) >= limits.attempts_kept_max:
            del kept[0]
    else:
        attempts = kept_attempts(run)
        attempts.append({"attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
                         "started_at": run["started_at"], "finished_at": now,
                         "ok": False, "error": bound_text(error, limits.attempt_error_chars_max)})
        if len(attempts) > limits.attempts_kept_max:
            del attempts[0]
    run["finished_at"] = now
    run["error"] = error
    run["output"] = output
    run["deadline"] = None
    if success:
        s.stats.on_success(run, now)


def finish_attempt(s: SchedulerState, run: Record, now: int, success: bool, error: str | None, output: str | None,
                   lost: bool = False) -> None:
    """Close the current attempt: success, a retry, or the dead-letter queue.

    Two budgets: attempts that ran and failed count against the job's ``max_attempts`` (and
    set the backoff); attempts lost with their worker (``lost``: the lease expired) are not
    the handler's failure and are retried at once, up to ``lease_losses_max`` times, so a run
    whose worker dies is run again even with ``max_attempts: 1`` (the README's promise).
    """
    close_attempt(s, run, now, success, error, output)
    if success:
        run["state"] = "succeeded"
        on_finish(s, run, now)
        on_success(s, run, now)
        if run["job"] in s.pipes.children:
            pipelines.notify(s, run, now)
        return
    job = s.jobs.get(run["job"])
    if job is not None and job["spec"]["executor"]["type"] == "heartbeat":
        job = None  # leased before its job became a heartbeat job: no worker would run a retry
    if lost:
        run["lost"] = run.get("lost", 0) + 1
        retry = job is not None and run["lost"] <= limits.lease_losses_max
        delay = 0
    else:
        run["failures"] = run.get("failures", 0) + 1
        retry = job is not None and run["failures"] < job["spec"]["retry"]["max_attempts"]
        delay = backoff_ms(job["spec"]["retry"], run["id"], run["failures"]) if retry and job is not None else 0
    if retry:
        if not lost:
            on_attempt_failed(s, run, now, error)
        run["attempt"] += 1
        run["state"] = "queued"
        run["due"] = now + delay
        run["worker"] = None
        enqueue(s, run)
        return
    run["state"] = "dead"
    s.stats.on_finished("dead")
    add_dead(s, run, now)
    on_finish(s, run, now)  # a dead run misses its deadline at once
    on_dead(s, run, now, error)
    if run["job"] in s.pipes.children:
        pipelines.notify(s, run, now)


# -------------------------------------------------------------- expiry and takeover
def apply_expire(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``expire {runs: [[id, token, renewals], ...], locks: [[name, token, renewals], ...]}``:
    the leader's reaper, for leases and locks it saw unrenewed for a whole TTL by its own
    monotonic clock (node/trigger.py). An item is applied only if the lease still has that
    token and that renewal count, i.e. nothing renewed or re-granted it since the reaper looked;
    the others are counted as ``ignored``. An expired lease is a lost attempt
    (``finish_attempt(lost=True)``); an expired lock is released. No wall clock is compared
    here: a node whose clock runs fast cannot make a live lease expire (I15).

    :raises InvalidCommand: lists missing, longer than expire_items_max together, or an item
        that is not ``[id, token, renewals]``."""
    runs, locks = cmd.get("runs", []), cmd.get("locks", [])
    if not isinstance(runs, list) or not isinstance(locks, list) or len(runs) + len(locks) > limits.expire_items_max:
        raise InvalidCommand("expire needs bounded lists runs and locks")
    for item in runs + locks:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and is_int(item[1]) and is_int(item[2])):
            raise InvalidCommand("expire items are [id, token, renewals]")
    expired, ignored = [], 0
    lost_by: dict[str, list[str]] = {}
    for rid, tok, renewals in runs:
        run = live(s, rid, tok)
        if run is None or run.get("renewals", 0) != renewals:
            ignored += 1
            continue
        lost_by.setdefault(run["worker"], []).append(rid)
        w = s.workers.get(run["worker"])
        if w is not None:
            w["losses"] += 1  # the worker fleet's per-worker count (workers.py)
        finish_attempt(s, run, now, False, f"lease expired (worker {run['worker']} stopped heartbeating)",
                       run.get("output"), lost=True)
        expired.append(rid)
    released = []
    for name, tok, renewals in locks:
        lk = s.locks.get(name)
        if lk is None or lk["token"] != tok or lk.get("renewals", 0) != renewals:
            ignored += 1
            continue
        del s.locks[name]
        count_tenants(s, lk.get("tenants"), -1)
        released.append(name)
    if s.sinks:
        for worker in sorted(lost_by):  # one event a worker whose leases expired
            emit(s, "worker.lost", now, reason="stopped heartbeating", worker=worker, runs=lost_by[worker])
    return {"ok": True, "expired": expired, "released": released, "ignored": ignored}


def apply_takeover(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``takeover {node, seen?}``: a new leader's first command. It records the leader and gives every
    live lease and lock one full TTL from this leader's ``now`` (``extended`` counts them). Events:
    ``cluster.leader_changed`` when another node led before; ``cluster.no_leader`` when ``seen``
    (the state time the new leader had applied up to) is more than ``limits.no_leader_report_ms``
    before ``now``, with the gap.

    :raises InvalidCommand: no node, or a seen that is not an integer."""
    node, seen = cmd.get("node"), cmd.get("seen")
    if not isinstance(node, str):
        raise InvalidCommand("takeover needs node")
    if seen is not None and not is_int(seen):
        raise InvalidCommand("takeover.seen must be an integer")
    prev = s.leader
    if s.sinks:
        if seen is not None and now - seen > limits.no_leader_report_ms:
            emit(s, "cluster.no_leader", now, reason="no leader committed anything", gap_ms=now - seen,
                 since=seen, node=node, previous=prev["node"] if prev else None)
        if prev is not None and prev["node"] != node:
            emit(s, "cluster.leader_changed", now, node=node, previous=prev["node"])
    s.leader = {"node": node, "since": now}
    return ok(extended=takeover_leases(s, now))


def takeover_leases(s: SchedulerState, now: int) -> int:
    """A new leader's clock may be ahead of its predecessor's: give every live lease and lock
    one full TTL from this leader's ``now`` before anything can expire (I15)."""
    n = 0
    for rid in s._running_ids:
        run = s.runs[rid]
        run["deadline"] = max(run["deadline"], now + run["ttl"])
        run["renewals"] = run.get("renewals", 0) + 1
        n += 1
    for lk in s.locks.values():
        lk["deadline"] = max(lk["deadline"], now + lk["ttl"])
        lk["renewals"] = lk.get("renewals", 0) + 1
        n += 1
    return n
