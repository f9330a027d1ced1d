"""Leased execution in the replicated state: queues, leases, fencing tokens, retries, the
dead-letter queue, tenant rate limits and locks (DESIGN.md sections 3 and 5).

A mixin of :class:`raftsched.core.state.SchedulerState`; every method here runs under the state
lock inside ``apply``, is deterministic, and takes its time from the command (``now``).

Lifecycle of a run::

    queued --acquire--> running --complete ok--> succeeded
       ^                   |--complete failed--> failures < max_attempts: queued, due = now + backoff
       |                   |                     else dead (the queue's DLQ)
       |                   |--expire (lease lost)--> lost <= lease_losses_max: queued, due = now
       |                   |                         else dead
       |                   \\--overlap replace--> failed (revoked)
       +---- dlq_requeue (fresh budgets) <---- dead

Every grant of a lease takes a new token from one global counter that only increases (I13); a
``heartbeat`` or ``complete`` carrying any other token than the run's current one is refused, so
a worker that was paused past its lease can never overwrite the newer attempt's outcome (I14).

Derived indexes (not in the snapshot, rebuilt by ``_rebuild_execution``): per queue and priority
a heap of the queued runs ordered by (due, id), whose heads are the runs whose due has come (an
acquire merges the heads by (-priority, due, id)); per queue the dead runs oldest first, by
(finished_at, id); per queue whose ``drop_oldest`` had to drop a run, a heap of its queued runs
by (slot, id), built when first needed and kept from then on (``_drop_oldest_queued``). A heap's
entries go stale when a run leaves the queue another way than by being popped; stale entries are
skipped when popped, and a heap that holds more than twice its queue's depth in entries is
compacted (``limits.queue_index_stale_slack``). (No lease index: the reaper reads ``lease_snapshot``, and an index nothing
pops would grow with every heartbeat.) Keys are unique
(they end with the run id), so the order in which runs are handed out is the same on every
replica, whether a replica built its heaps incrementally or from a snapshot.
"""
from __future__ import annotations

import hashlib
import heapq
from collections import deque

from . import limits
from .errors import Conflict, InvalidCommand, NotFound


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _s(v, n: int) -> str | None:
    """Bound a text field: its last ``n`` characters (the end of an error says the most)."""
    if v is None:
        return None
    v = str(v)
    return v if len(v) <= n else "…" + v[-(n - 1):]


def backoff_ms(retry: dict, run_id: str, attempt: int) -> int:
    """Delay before attempt ``attempt + 1`` after attempt ``attempt`` failed.

    ``backoff_s * backoff_multiplier ** (attempt - 1)``, capped at ``backoff_max_s``, then spread by
    ``jitter`` (a fraction: 0.1 = +-10 %) using a hash of the run id and attempt, never a random
    generator, so every replica computes the same delay.
    """
    base = min(retry["backoff_max_s"], retry["backoff_s"] * retry["backoff_multiplier"] ** (attempt - 1))
    h = hashlib.blake2b(f"{run_id}#{attempt}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "big") / 2**64  # [0, 1)
    factor = 1 + retry["jitter"] * (2 * u - 1)
    return max(0, int(base * factor * 1000))


class ExecutionMixin:
    # -------------------------------------------------------------- state and indexes
    def _reset_execution(self) -> None:
        #: tenant -> {"rate_milli": tokens per 1000 s, "burst": int, "tokens_micro": int, "last_ms": int}
        self.tenants: dict[str, dict] = {}
        #: lock name -> {"owner", "token", "deadline", "ttl", "since"}
        self.locks: dict[str, dict] = {}
        #: queue -> priority -> heap of (due, run id) of its queued runs; ready once due has come
        self._queued: dict[str, dict[int, list]] = {}
        #: queue -> heap of (slot, run id) of its queued runs (drop_oldest's index; built lazily)
        self._by_slot: dict[str, list] = {}
        self._dead: dict[str, deque] = {}
        self._running_count: dict[str, int] = {}
        #: ids of running runs, in grant order: what the reaper watches
        self._running_ids: dict[str, None] = {}

    def _rebuild_execution(self) -> None:
        self._queued, self._dead, self._running_count = {}, {}, {}
        self._by_slot = {}
        self._running_ids = {}
        self._queue_depth = {}
        dead = []
        for run in self.runs.values():
            st = run["state"]
            if st == "queued":
                self._enqueue(run)
            elif st == "running":
                self._running_count[run["queue"]] = self._running_count.get(run["queue"], 0) + 1
                self._running_ids[run["id"]] = None
            elif st == "dead":
                dead.append(run)
        for run in sorted(dead, key=lambda r: (r["finished_at"], r["id"])):
            self._dead.setdefault(run["queue"], deque()).append(run["id"])

    def _enqueue(self, run: dict) -> None:
        """Put a queued run into its queue's indexes."""
        q = run["queue"]
        depth = self._queue_depth[q] = self._queue_depth.get(q, 0) + 1
        prios = self._queued.get(q)
        if prios is None:
            prios = self._queued[q] = {}
        p = run["priority"]
        h = prios.get(p)
        if h is None:
            h = prios[p] = []
        heapq.heappush(h, (run.get("due", run["slot"]), run["id"]))
        if len(h) > 2 * depth + limits.queue_index_stale_slack:
            self._compact_queued(q, p, h)
        bs = self._by_slot.get(q)
        if bs is not None:
            heapq.heappush(bs, (run["slot"], run["id"]))
            if len(bs) > 2 * depth + limits.queue_index_stale_slack:
                del self._by_slot[q]  # mostly stale: rebuilt when next needed

    def _compact_queued(self, q: str, p: int, h: list) -> None:
        """Keep only the live entries of queue ``q``'s priority ``p`` heap, in place (callers
        hold it). Which entries a heap holds beside the live ones changes nothing any replica
        decides: acquire skips stale ones, and every queued run has a live one."""
        runs, seen, keep = self.runs, set(), []
        for e in h:
            due, rid = e
            run = runs.get(rid)
            if run is not None and rid not in seen and run["state"] == "queued" and run["queue"] == q \
                    and run["priority"] == p and run.get("due", run["slot"]) == due:
                seen.add(rid)
                keep.append(e)
        heapq.heapify(keep)
        h[:] = keep

    def _drop_oldest_queued(self, qname: str, now: int) -> None:
        """Mark the queued run of ``qname`` with the oldest slot (the smallest id among equal
        slots) skipped: on_full=drop_oldest. O(log n) from the queue's by-slot heap, which is
        built from the queue's acquire heaps the first time a drop is needed."""
        bs = self._by_slot.get(qname)
        if bs is None:
            bs = self._by_slot[qname] = self._queued_by_slot(qname)
        runs, pop = self.runs, heapq.heappop
        while bs:
            slot, rid = pop(bs)
            run = runs.get(rid)
            if run is not None and run["state"] == "queued" and run["queue"] == qname and run["slot"] == slot:
                run["state"] = "skipped"
                run["reason"] = "queue_full"
                run["finished_at"] = now
                self._queue_depth[qname] -= 1
                return

    def _queued_by_slot(self, qname: str) -> list:
        """A heap of (slot, id) of every queued run of ``qname``, from its acquire heaps (every
        queued run has an entry there)."""
        runs, seen, out = self.runs, set(), []
        for h in self._queued.get(qname, {}).values():
            for _, rid in h:
                run = runs.get(rid)
                if run is not None and rid not in seen and run["state"] == "queued" and run["queue"] == qname:
                    seen.add(rid)
                    out.append((run["slot"], rid))
        heapq.heapify(out)
        return out

    def _unqueue_count(self, run: dict) -> None:
        q = run["queue"]
        self._queue_depth[q] = self._queue_depth.get(q, 1) - 1

    # -------------------------------------------------------------- tenants
    def _apply_put_tenant(self, cmd, now):
        name, rate, burst = cmd.get("name"), cmd.get("rate_milli"), cmd.get("burst")
        if not isinstance(name, str) or not _is_int(rate) or not _is_int(burst) or rate < 0 or burst < 1:
            raise InvalidCommand("put_tenant needs name, rate_milli >= 0, burst >= 1")
        old = self.tenants.get(name)
        self.tenants[name] = {"rate_milli": rate, "burst": burst,
                              "tokens_micro": min(old["tokens_micro"], burst * 1_000_000) if old else burst * 1_000_000,
                              "last_ms": old["last_ms"] if old else now}
        return {"ok": True, "tenant": name}

    def _apply_delete_tenant(self, cmd, now):
        name = cmd.get("name")
        if self.tenants.pop(name, None) is None:
            raise NotFound(f"no tenant {name!r} has a rate limit", field="name")
        return {"ok": True, "tenant": name, "deleted": True}

    def _tenant_take(self, tenant: str, now: int) -> bool:
        """Take one token from the tenant's bucket, refilled from ``now``. Integer arithmetic:
        micro-tokens, and rates in tokens per 1000 s, so every replica agrees exactly."""
        t = self.tenants.get(tenant)
        if t is None:
            return True
        elapsed = max(0, now - t["last_ms"])
        t["tokens_micro"] = min(t["burst"] * 1_000_000, t["tokens_micro"] + elapsed * t["rate_milli"])
        t["last_ms"] = max(t["last_ms"], now)
        if t["tokens_micro"] >= 1_000_000:
            t["tokens_micro"] -= 1_000_000
            return True
        return False

    # -------------------------------------------------------------- acquire
    def _apply_acquire(self, cmd, now):
        worker, queues, n, ttl = cmd.get("worker"), cmd.get("queues"), cmd.get("max"), cmd.get("ttl")
        if not isinstance(worker, str) or not worker:
            raise InvalidCommand("acquire needs worker")
        if queues is not None and (not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)):
            raise InvalidCommand("acquire.queues must be a list of names or nil")
        if not _is_int(n) or not 1 <= n <= limits.acquire_runs_max:
            raise InvalidCommand(f"acquire.max must be 1..{limits.acquire_runs_max}")
        if not _is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max:
            raise InvalidCommand("acquire.ttl out of range")
        types = cmd.get("types")
        if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
            raise InvalidCommand("acquire.types must be a list of executor types or nil")
        names = sorted(set(queues)) if queues is not None else sorted(self._queued)
        granted: list[dict] = []
        held_back: list[tuple[list, tuple]] = []
        scanned = 0
        runs, pop = self.runs, heapq.heappop
        # The served queues' heaps, highest priority first. Handed out by the key (-priority,
        # due, run id) among the runs whose due has come: a merge of the heaps' heads.
        # An entry is live when its run is queued in this heap's queue, at this priority and
        # due: a run id can come back in another queue (a job deleted and put again in another
        # queue re-creates its ids), and the old queue's entry must not hand it out; a replica
        # restored from a snapshot has no such entry.
        heaps = sorted(((q, p, h) for q in names for p, h in self._queued.get(q, {}).items() if h),
                       key=lambda qph: -qph[1])
        if len(heaps) == 1 and types is None and not self.tenants:
            # One heap and nothing to hold back (no executor types asked for, no tenant rate
            # limits): the loop below, reduced to popping that heap in key order.
            q, p, h = heaps[0]
            while len(granted) < n and scanned < limits.acquire_scan_max and h and h[0][0] <= now:
                due, rid = pop(h)
                run = runs.get(rid)
                if run is None or run["state"] != "queued" or run["priority"] != p \
                        or run.get("due", run["slot"]) != due or run["queue"] != q:
                    continue  # stale index entry
                scanned += 1
                granted.append(self._grant(run, worker, ttl, now))
            return {"ok": True, "runs": granted}
        while len(granted) < n and scanned < limits.acquire_scan_max:
            best, best_h = None, None
            for q, p, h in heaps:
                if best is not None and -p > best[0]:
                    break  # lower priorities than the best found so far
                while h and h[0][0] <= now:
                    due, rid = h[0]
                    run = runs.get(rid)
                    if run is None or run["state"] != "queued" or run["priority"] != p \
                            or run.get("due", run["slot"]) != due or run["queue"] != q:
                        pop(h)  # stale index entry
                        continue
                    if best is None or (-p, due, rid) < best:
                        best, best_h = (-p, due, rid), h
                    break
            if best is None:
                break
            entry = pop(best_h)
            scanned += 1
            run = runs[best[2]]
            if types is not None:
                job = self.jobs.get(run["job"])
                if job is not None and job["spec"]["executor"]["type"] not in types:
                    held_back.append((best_h, entry))  # another node runs this executor type
                    continue
            if not self._tenant_take(run["tenant"], now):
                held_back.append((best_h, entry))  # over its rate: wait; others go ahead
                continue
            granted.append(self._grant(run, worker, ttl, now))
        for h, entry in held_back:
            heapq.heappush(h, entry)
        return {"ok": True, "runs": granted}

    def _grant(self, run: dict, worker: str, ttl: int, now: int) -> dict:
        self.fencing_token = tok = self.fencing_token + 1  # I13: one counter, only increases
        rid, q, deadline = run["id"], run["queue"], now + ttl
        self._queue_depth[q] = self._queue_depth.get(q, 1) - 1
        run["state"] = "running"
        run["fencing_token"] = tok
        run["worker"] = worker
        run["started_at"] = now
        run["deadline"] = deadline
        run["ttl"] = ttl
        run["finished_at"] = None
        run["renewals"] = 0
        self._running_ids[rid] = None
        self._running_count[q] = self._running_count.get(q, 0) + 1
        job = self.jobs.get(run["job"])
        if job is None:
            executor = payload = None
            timeout_s = limits.timeout_s_default
        else:
            spec = job["spec"]
            executor, payload, timeout_s = spec["executor"], spec["payload"], spec["timeout_s"]
        return {
            "id": rid, "job": run["job"], "slot": run["slot"], "attempt": run["attempt"],
            "token": tok, "deadline": deadline, "queue": q,
            "executor": executor, "payload": payload, "timeout_s": timeout_s,
        }

    # -------------------------------------------------------------- heartbeat / complete
    def _live(self, rid, tok) -> dict | None:
        run = self.runs.get(rid) if isinstance(rid, str) else None
        if run is None or run["state"] != "running" or run.get("fencing_token") != tok:
            return None
        return run

    def _apply_heartbeat(self, cmd, now):
        worker, leases, ttl = cmd.get("worker"), cmd.get("leases"), cmd.get("ttl")
        if not isinstance(worker, str) or not isinstance(leases, list) or len(leases) > limits.heartbeat_leases_max:
            raise InvalidCommand("heartbeat needs worker and a bounded list of leases")
        if not _is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max:
            raise InvalidCommand("heartbeat.ttl out of range")
        lost, extended = [], 0
        for item in leases:
            if not (isinstance(item, list) and len(item) == 2 and _is_int(item[1])):
                raise InvalidCommand("heartbeat lease must be [run_id, token]")
        for rid, tok in leases:
            run = self._live(rid, tok)
            if run is None or run["worker"] != worker:
                lost.append(rid)
                continue
            run["deadline"] = max(run["deadline"], now + ttl)
            run["ttl"] = ttl
            # The reaper identifies a lease by its renewal count, not its deadline: a deadline
            # may not move (state time ahead of this worker's clock) while the lease is renewed.
            run["renewals"] = run.get("renewals", 0) + 1
            extended += 1
        return {"ok": True, "extended": extended, "lost": lost}

    def _apply_complete(self, cmd, now):
        rid, tok, ok = cmd.get("run"), cmd.get("token"), cmd.get("success")
        if not isinstance(rid, str) or not _is_int(tok) or not isinstance(ok, bool):
            raise InvalidCommand("complete needs run, token, success")
        run = self.runs.get(rid)
        if run is None:
            raise NotFound(f"no run {rid!r}", field="run")
        if run["state"] != "running" or run.get("fencing_token") != tok:  # not _live(rid, tok)
            raise Conflict(
                f"token {tok} is stale for run {rid}: its current token is {run.get('fencing_token')} "
                f"and its state {run['state']}", field="token", code_detail="stale_token",
            )
        error = _s(cmd.get("error"), limits.error_chars_max)
        output = _s(cmd.get("output"), limits.output_bytes_max)
        self._finish_attempt(run, now, ok, error, output)
        return {"ok": True, "run": rid, "state": run["state"], "attempt": run["attempt"]}

    def _apply_complete_many(self, cmd, now):
        """Several outcomes in one command (a worker batches the completions of a few ms): each
        item is judged like ``complete``, alone; a stale item is refused without affecting the
        others. Returns one result per item, in order."""
        items = cmd.get("results")
        if not isinstance(items, list) or not 1 <= len(items) <= limits.complete_batch_max:
            raise InvalidCommand(f"complete_many needs 1..{limits.complete_batch_max} results")
        for it in items:
            if not (isinstance(it, dict) and isinstance(it.get("run"), str) and _is_int(it.get("token"))
                    and isinstance(it.get("success"), bool)):
                raise InvalidCommand("each result needs run, token, success")
        out = []
        fast = self._fast_paths
        runs = self.runs
        for it in items:
            rid = it["run"]
            run = runs.get(rid)
            if fast and it["success"] and run is not None and run["state"] == "running" \
                    and run.get("fencing_token") == it["token"]:
                # A success of the current attempt (nearly every item): _apply_complete and
                # _finish_attempt inline, the same changes in the same order.
                error, output = it.get("error"), it.get("output")
                if error is not None:
                    error = _s(error, limits.error_chars_max)
                if output is not None:
                    output = _s(output, limits.output_bytes_max)
                self._close_attempt(run, now, True, error, output)
                run["state"] = "succeeded"
                out.append({"ok": True, "run": rid, "state": "succeeded", "attempt": run["attempt"]})
                continue
            try:
                out.append(self._apply_complete(it, now))
            except (Conflict, NotFound) as e:
                out.append({"ok": False, "run": it["run"], "error": e.to_dict()})
        return {"ok": True, "results": out}

    def _close_attempt(self, run: dict, now: int, ok: bool, error: str | None,
                       output: str | None) -> None:
        """End the current attempt's lease and record it in ``run["attempts"]`` (the last
        ``attempts_kept_max``); the caller decides the run's next state."""
        q = run["queue"]
        self._running_count[q] = self._running_count.get(q, 1) - 1
        self._running_ids.pop(run["id"], None)
        attempts = run.setdefault("attempts", [])
        attempts.append({"attempt": run["attempt"], "token": run["fencing_token"], "worker": run["worker"],
                         "started_at": run["started_at"], "finished_at": now,
                         "ok": ok, "error": _s(error, limits.attempt_error_chars_max)})
        if len(attempts) > limits.attempts_kept_max:
            del attempts[0]
        run["finished_at"] = now
        run["error"] = error
        run["output"] = output
        run["deadline"] = None

    def _finish_attempt(self, run: dict, now: int, ok: bool, error: str | None, output: str | None,
                        lost: bool = False) -> None:
        """Close the current attempt: success, a retry, or the dead-letter queue.

        Two budgets: attempts that ran and failed count against the job's ``max_attempts`` (and
        set the backoff); attempts lost with their worker (``lost``: the lease expired) are not
        the handler's failure and are retried at once, up to ``lease_losses_max`` times, so a run
        whose worker dies is run again even with ``max_attempts: 1`` (the README's promise).
        """
        self._close_attempt(run, now, ok, error, output)
        if ok:
            run["state"] = "succeeded"
            return
        job = self.jobs.get(run["job"])
        if lost:
            run["lost"] = run.get("lost", 0) + 1
            retry = job is not None and run["lost"] <= limits.lease_losses_max
            delay = 0
        else:
            run["failures"] = run.get("failures", 0) + 1
            retry = job is not None and run["failures"] < job["spec"]["retry"]["max_attempts"]
            delay = backoff_ms(job["spec"]["retry"], run["id"], run["failures"]) if retry else 0
        if retry:
            run["attempt"] += 1
            run["state"] = "queued"
            run["due"] = now + delay
            run["worker"] = None
            self._enqueue(run)
            return
        run["state"] = "dead"
        dq = self._dead.setdefault(run["queue"], deque())
        # Oldest first by (finished_at, id), the order _rebuild_execution restores: runs that
        # die at the same now in another order than their ids must be purged alike on a replica
        # restored from a snapshot. (finished_at only grows, so this looks at the tail only.)
        i = len(dq)
        while i > 0:
            prev = self.runs.get(dq[i - 1])
            if prev is None or (prev["finished_at"], prev["id"]) < (now, run["id"]):
                break
            i -= 1
        dq.insert(i, run["id"])
        while len(dq) > limits.dlq_per_queue_max:
            old = self.runs.get(dq.popleft())
            if old is not None and old["state"] == "dead":
                self._drop_entry(old)

    def _drop_entry(self, run: dict) -> None:
        self.runs.pop(run["id"], None)
        hist = self.history.get(run["job"])
        if hist is not None:
            try:
                hist.remove(run["id"])
            except ValueError:
                pass

    # -------------------------------------------------------------- expiry and takeover
    def _apply_expire(self, cmd, now):
        """The leader's reaper: leases and locks it saw unrenewed for a whole TTL by its own
        monotonic clock (node/trigger.py). Items are ``[id, token, renewals]``: one is applied only
        if the lease still has that token and that renewal count, i.e. nothing renewed or
        re-granted it since the reaper looked. No wall clock is compared here: a node whose clock runs fast
        cannot make a live lease expire (I15)."""
        runs, locks = cmd.get("runs", []), cmd.get("locks", [])
        if not isinstance(runs, list) or not isinstance(locks, list) or len(runs) + len(locks) > limits.expire_items_max:
            raise InvalidCommand("expire needs bounded lists runs and locks")
        for item in runs + locks:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and _is_int(item[1]) and _is_int(item[2])):
                raise InvalidCommand("expire items are [id, token, renewals]")
        expired, ignored = [], 0
        for rid, tok, renewals in runs:
            run = self._live(rid, tok)
            if run is None or run.get("renewals", 0) != renewals:
                ignored += 1
                continue
            self._finish_attempt(run, now, False, f"lease expired (worker {run['worker']} stopped heartbeating)",
                                 run.get("output"), lost=True)
            expired.append(rid)
        released = []
        for name, tok, renewals in locks:
            lk = self.locks.get(name)
            if lk is None or lk["token"] != tok or lk.get("renewals", 0) != renewals:
                ignored += 1
                continue
            del self.locks[name]
            released.append(name)
        return {"ok": True, "expired": expired, "released": released, "ignored": ignored}

    def _takeover_leases(self, now: int) -> int:
        """A new leader's clock may be ahead of its predecessor's: give every live lease and lock
        one full TTL from this leader's ``now`` before anything can expire (I15)."""
        n = 0
        for rid in self._running_ids:
            run = self.runs[rid]
            run["deadline"] = max(run["deadline"], now + run["ttl"])
            run["renewals"] = run.get("renewals", 0) + 1
            n += 1
        for lk in self.locks.values():
            lk["deadline"] = max(lk["deadline"], now + lk["ttl"])
            lk["renewals"] = lk.get("renewals", 0) + 1
            n += 1
        return n

    def has_ready_work(self, queues: list[str] | None, now_ms: int) -> bool:
        """Whether an acquire could hand out something (a cheap local check; it may say yes for
        index entries that turn out stale or rate-limited, never no when work is ready)."""
        with self.lock:
            names = queues if queues is not None else list(self._queued)
            for q in names:
                for h in self._queued.get(q, {}).values():
                    if h and h[0][0] <= now_ms:
                        return True
        return False

    def lease_snapshot(self) -> list[tuple]:
        """Every live lease and lock as ``(kind, id, token, renewals, ttl_ms)``: what the leader's
        reaper watches. Linear in running runs (bounded by the workers' slots) and held locks."""
        with self.lock:
            out = []
            for rid in self._running_ids:
                r = self.runs[rid]
                out.append(("run", rid, r["fencing_token"], r.get("renewals", 0), r["ttl"]))
            out.extend(("lock", n, lk["token"], lk.get("renewals", 0), lk["ttl"]) for n, lk in self.locks.items())
            # Canonical order: a replica restored from a snapshot rebuilds _running_ids in
            # another order than the grants happened, and the reaper's command must not differ.
            out.sort()
            return out

    # -------------------------------------------------------------- dead-letter queue
    def _apply_dlq_requeue(self, cmd, now):
        run = self._dead_run(cmd)
        job = self.jobs.get(run["job"])
        if job is None:
            raise Conflict(f"job {run['job']!r} no longer exists; the run cannot be requeued", field="run")
        self._remove_dead(run)
        run["attempt"] += 1
        run["failures"] = 0  # a fresh budget: max_attempts more failures, and backoff from the start
        run["lost"] = 0
        run.update(state="queued", due=now, worker=None, deadline=None, finished_at=None)
        self._enqueue(run)
        return {"ok": True, "run": run["id"], "state": "queued", "attempt": run["attempt"]}

    def _apply_dlq_delete(self, cmd, now):
        run = self._dead_run(cmd)
        self._remove_dead(run)
        self._drop_entry(run)
        return {"ok": True, "run": run["id"], "deleted": True}

    def _dead_run(self, cmd) -> dict:
        rid = cmd.get("run")
        if not isinstance(rid, str):
            raise InvalidCommand(f"{cmd['op']} needs run")
        run = self.runs.get(rid)
        if run is None or run["state"] != "dead":
            raise NotFound(f"no run {rid!r} in a dead-letter queue", field="run")
        return run

    def _remove_dead(self, run: dict) -> None:
        dq = self._dead.get(run["queue"])
        if dq is not None:
            try:
                dq.remove(run["id"])
            except ValueError:
                pass

    # -------------------------------------------------------------- locks
    def _lock_args(self, cmd, need_owner: bool):
        name, ttl = cmd.get("name"), cmd.get("ttl")
        if not isinstance(name, str) or not name:
            raise InvalidCommand("lock command needs name")
        if need_owner and (not isinstance(cmd.get("owner"), str) or not cmd["owner"]):
            raise InvalidCommand("lock_acquire needs owner")
        if ttl is not None and (not _is_int(ttl) or not limits.lease_ttl_ms_min <= ttl <= limits.lease_ttl_ms_max):
            raise InvalidCommand("lock ttl out of range")
        return name, ttl

    def _apply_lock_acquire(self, cmd, now):
        name, ttl = self._lock_args(cmd, True)
        if ttl is None:
            raise InvalidCommand("lock_acquire needs ttl")
        lk = self.locks.get(name)
        if lk is not None:
            # Held until its holder releases it or the leader's reaper expires it: never judged
            # from this command's clock, which may be another node's and run fast.
            raise Conflict(f"lock {name!r} is held by {lk['owner']!r}", field="name",
                           holder=lk["owner"], expires_at_ms=lk["deadline"])
        if lk is None and len(self.locks) >= limits.locks_max:
            raise Conflict(f"the cluster holds {limits.locks_max} locks, its limit", field="name")
        self.fencing_token += 1
        self.locks[name] = {"owner": cmd["owner"], "token": self.fencing_token, "deadline": now + ttl,
                            "ttl": ttl, "since": now, "renewals": 0}
        return {"ok": True, "lock": name, "owner": cmd["owner"], "token": self.fencing_token, "deadline": now + ttl}

    def _held(self, cmd, now) -> tuple[str, dict]:
        name, _ = self._lock_args(cmd, False)
        tok = cmd.get("token")
        lk = self.locks.get(name)
        if lk is None or lk["token"] != tok:
            raise Conflict(f"token {tok} does not hold lock {name!r}", field="token",
                           holder=lk["owner"] if lk else None,
                           expires_at_ms=lk["deadline"] if lk else None)
        return name, lk

    def _apply_lock_renew(self, cmd, now):
        name, lk = self._held(cmd, now)
        ttl = cmd.get("ttl") or lk["ttl"]
        lk["deadline"] = max(lk["deadline"], now + ttl)
        lk["ttl"] = ttl
        lk["renewals"] = lk.get("renewals", 0) + 1
        return {"ok": True, "lock": name, "token": lk["token"], "deadline": lk["deadline"]}

    def _apply_lock_release(self, cmd, now):
        name, lk = self._held(cmd, now)
        del self.locks[name]
        return {"ok": True, "lock": name, "released": True}
