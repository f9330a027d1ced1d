"""The node's side of the worker fleet (docs/workers.md): the worker protocol, the admin reads,
the workers_seen reports and the leader's forget_workers.

``Fleet`` is to the worker protocol what ``Service`` is to the admin API: it validates a
request's body (InvalidSpec naming the field, 422), completes it with what only the proposer
knows (the time), proposes its commands and reads the local replica through core.queries. The
HTTP handlers are node/api.py's (the worker protocol's rows of its route table).

- A lease request says who the worker is (its facts: labels, slots, executors, queues, version,
  process instance). When the local replica does not hold those facts for it, the node proposes
  a ``worker_hello`` first: a worker registers on first contact, and again only when something
  changed. Then the request waits in the node's dispatcher (node/dispatch.py).
- A worker whose token is limited to tenants (``tenants``, from the request's principal: never
  from its body) is registered with them, and every command proposed for it carries them: its
  acquires grant only their runs, and its heartbeats, completions and releases of a run of
  another tenant are answered as for a run it does not hold (I23). Apply decides, so a node
  whose replica lags cannot misjudge a run it has not seen yet.
- A remote worker's completions are proposed with ``own``: an outcome for a run another worker
  holds is refused, whatever fencing token it carries.
- Every worker that contacts the node, and every one whose request waits here, is noted; every
  ``workers_seen_interval_s`` the node proposes one ``workers_seen`` for them (so that idle
  long-polling workers are seen without a command each). The node's own embedded worker is
  always in it.
- The leader looks every ``workers_forget_check_s`` for workers gone for core
  ``worker_forget_ms`` and proposes ``forget_workers`` for them.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import threading
import uuid

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..clock import Clock
from ..core import commands, limits, queries
from ..core.bodies import check_body
from ..core.errors import Forbidden, InvalidSpec, NotFound, RaftschedError
from ..core.model import EXECUTOR_TYPES
from ..core.workers import (check_dedicated, check_executors, check_labels, check_queues, check_targets,
                            check_worker_id)
from ..core.records import cut_by, is_int, outcome_results
from ..proposer import Proposer
from .. import sealing
from ..worker import limits as worker_limits
from . import limits as node_limits
from .dispatch import Dispatcher, LeaseRequest
from .reads import ReadBarrier
from .views import worker_view

log = logging.getLogger("raftsched.fleet")

#: the fields of each request body of the worker protocol (docs/api.md)
LEASE_FIELDS = {"queues", "labels", "slots", "executors", "version", "instance", "max", "wait_s", "ttl_ms",
                "dedicated", "results", "targets"}
HEARTBEAT_FIELDS = {"leases", "ttl_ms"}
COMPLETE_FIELDS = {"results"}
RESULT_FIELDS = {"run", "token", "success", "error", "output", "result"}
RELEASE_FIELDS = {"leases", "reason", "not_started"}
LEAVE_FIELDS = {"instance", "reason"}


# ---------------------------------------------------------------------------- request bodies (core/bodies.py: check_body)


def _int_field(b: dict, name: str, lo: int, hi: int, default=None) -> int:
    v = b.get(name, default)
    if not is_int(v) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer between {lo} and {hi}", field=name)
    return v


def _short(b: dict, name: str) -> str | None:
    v = b.get(name)
    if v is not None and (not isinstance(v, str) or len(v) > limits.worker_version_chars_max):
        raise InvalidSpec(f"must be a string of at most {limits.worker_version_chars_max} characters", field=name)
    return v


def _ttl(b: dict) -> int:
    return _int_field(b, "ttl_ms", limits.lease_ttl_ms_min, limits.lease_ttl_ms_max, node_limits.lease_ttl_ms_default)


def _token_ok(v: object) -> bool:
    """A fencing token: an integer of the state's counter, 0 <= token < 2**63."""
    return is_int(v) and 0 <= v < 2**63


def _leases(b: dict) -> list[list]:
    leases = b.get("leases")
    n = limits.heartbeat_leases_max
    if not isinstance(leases, list) or len(leases) > n:
        raise InvalidSpec(f"must be a list of at most {n} [run_id, token] pairs", field="leases")
    for item in leases:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0]
                and _token_ok(item[1])):
            raise InvalidSpec("each lease is [run_id, fencing token] (0 <= token < 2**63)", field="leases")
    return leases


def parse_lease(body) -> tuple[dict, int, float, int, list[dict] | None]:
    """A lease request's body -> (the worker's facts, max runs, wait_s, ttl_ms, the outcomes it
    carries: ``complete_many`` items, or None).

    :raises InvalidSpec: naming the field."""
    b = check_body(body, LEASE_FIELDS)
    carried = _results(b["results"]) if "results" in b else None
    if "slots" not in b:
        raise InvalidSpec("is required: the runs this worker executes at once", field="slots")
    if "executors" not in b:
        raise InvalidSpec("is required: the executor types this worker runs", field="executors")
    labels = check_labels(b.get("labels", {}))
    facts = {"kind": "remote", "labels": labels,
             "slots": _int_field(b, "slots", 1, limits.worker_slots_max),
             "executors": check_executors(b["executors"]), "queues": check_queues(b.get("queues")),
             "version": _short(b, "version"), "instance": _short(b, "instance"),
             "dedicated": check_dedicated(b.get("dedicated"), labels)}
    targets = check_targets(b.get("targets"))
    if targets is not None:  # (else left out: a hello of a worker without it is as it was)
        facts["targets"] = targets
    n = _int_field(b, "max", 1, limits.acquire_runs_max)
    wait = b.get("wait_s", 0)
    # Compared before any conversion: math.isfinite(10**400) raises OverflowError, and NaN fails
    # every comparison.
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) \
            or not 0 <= wait <= worker_limits.lease_wait_s_max:
        raise InvalidSpec(f"must be a number of seconds between 0 and {worker_limits.lease_wait_s_max:g}", field="wait_s")
    return facts, n, float(wait), _ttl(b), carried


def parse_results(body) -> list[dict]:
    """A completion request's results: ``complete_many`` items. :raises InvalidSpec:"""
    b = check_body(body, COMPLETE_FIELDS)
    return _results(b.get("results"))


def _results(items) -> list[dict]:
    """The ``results`` of a completion, or carried by a lease request: ``complete_many`` items.
    :raises InvalidSpec:"""
    if not isinstance(items, list) or not 1 <= len(items) <= limits.complete_batch_max:
        raise InvalidSpec(f"must be a list of 1-{limits.complete_batch_max} outcomes", field="results")
    out = []
    fields = RESULT_FIELDS
    for k, it in enumerate(items):
        # Nearly every item: a plain outcome of JSON's own types, accepted here as
        # _result_checked accepts it (tests/test_fleet_results.py), at a third of its cost.
        # Any other goes there, which says what is wrong with it, or looks at its result.
        if type(it) is dict and it.keys() <= fields and it.get("result") is None:
            rid, tok, ok, err, text = it.get("run"), it.get("token"), it.get("success"), it.get("error"), it.get("output")
            if type(rid) is str and rid and type(tok) is int and 0 <= tok < 2**63 and type(ok) is bool \
                    and (err is None or type(err) is str) and (text is None or type(text) is str):
                out.append({"run": rid, "token": tok, "success": ok, "error": err, "output": text})
                continue
        out.append(_result_checked(k, it))
    return out


def _result_checked(k: int, it) -> dict:
    """Item ``k`` of ``results``, checked field by field: a ``complete_many`` item.
    :raises InvalidSpec: naming the field."""
    f = f"results[{k}]"
    if not isinstance(it, dict):
        raise InvalidSpec("must be an object {run, token, success, error?, output?}", field=f)
    for key in it:
        if key not in RESULT_FIELDS:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(RESULT_FIELDS))}", field=f"{f}.{key}")
    if not isinstance(it.get("run"), str) or not it["run"]:
        raise InvalidSpec("is required: the run id", field=f"{f}.run")
    if not _token_ok(it.get("token")):
        raise InvalidSpec("is required: the lease's fencing token (0 <= token < 2**63)", field=f"{f}.token")
    if not isinstance(it.get("success"), bool):
        raise InvalidSpec("is required: true or false", field=f"{f}.success")
    for key in ("error", "output"):
        if it.get(key) is not None and not isinstance(it[key], str):
            raise InvalidSpec("must be a string or null", field=f"{f}.{key}")
    item = {"run": it["run"], "token": it["token"], "success": it["success"],
            "error": it.get("error"), "output": it.get("output")}
    if it.get("result") is not None:  # pipelines: what the run hands its children
        try:
            size = len(json.dumps(it["result"], separators=(",", ":"), allow_nan=False).encode())
        except ValueError:
            raise InvalidSpec("must be JSON: NaN and infinities are not", field=f"{f}.result") from None
        if size > limits.result_bytes_max:
            raise InvalidSpec(f"is more than {limits.result_bytes_max} bytes as JSON", field=f"{f}.result")
        item["result"] = it["result"]
    return item


def _retrieved(t: asyncio.Future) -> None:
    """A done callback that retrieves a task's exception (it is answered elsewhere, or lost with
    the request that carried it): never "exception was never retrieved"."""
    if not t.cancelled():
        t.exception()


def _worker_id(wid: str) -> str:
    try:
        return check_worker_id(wid, "id")
    except InvalidSpec as e:
        raise InvalidSpec(f"worker id {e.message}", field="id") from None


def _relay(fut: asyncio.Future, t: asyncio.Task) -> None:
    """``t``'s outcome to ``fut``, unless ``fut`` is done (its waiter went away)."""
    if t.cancelled():
        if not fut.done():
            fut.cancel()
        return
    e = t.exception()  # (retrieved either way: no "never retrieved" warning)
    if fut.done():
        return
    if e is not None:
        fut.set_exception(e)
    else:
        fut.set_result(t.result())


# ---------------------------------------------------------------------------- the fleet
class Fleet:
    """The worker fleet as one node serves it.

    :param raft: the replication adapter (``propose``, ``read``, ``is_leader``).
    :param embedded_id: the id of this node's own worker (reported seen with the others), or
        None when the node runs none (``--slots 0``).
    """

    def __init__(self, raft, clock: Clock, node_id: str, *, embedded_id: str | None = None,
                 propose_timeout_s: float = node_limits.propose_timeout_s_default,
                 seen_interval_s: float | None = None, unseal=None,
                 metrics_workers_max: int = node_limits.metrics_workers_max_default) -> None:
        self.raft = raft
        #: registered workers up to which /metrics has series per worker (node/limits.py)
        self.metrics_workers_max = metrics_workers_max
        #: a grant as the worker gets it, its secrets unsealed (raftsched/sealing.py unseal_grant)
        self.unseal = unseal or functools.partial(sealing.unseal_grant, ring=sealing.PROCESS_RING)
        #: the ring ``unseal`` reads (whether a missing key has been copied in since)
        self.keyring = sealing.ring_of(self.unseal)
        #: keys this node found missing when it handed out a run (sealing.KEY_MISSING): reported
        #: (the condition node.keys_missing, a gauge) until its ring holds them
        self.keys_missing: set[str] = set()
        self.clock = clock
        self.node_id = node_id
        self.embedded_id = embedded_id
        self.propose_timeout_s = propose_timeout_s
        self.proposer = Proposer(raft, propose_timeout_s)
        #: the read barrier of a leave (its instance checked against the log's view)
        self.reads = ReadBarrier(raft, propose_timeout_s)
        #: seconds between workers_seen reports (a test hook may make it longer)
        self.seen_interval_s = seen_interval_s or node_limits.workers_seen_interval_s
        self.dispatcher = Dispatcher(raft, clock, self.propose, self.release_grants, by=node_id)
        #: workers that contacted this node since its last workers_seen
        self._seen: set[str] = set()
        #: worker -> its hello in flight (a worker's concurrent requests share one)
        self._hellos: dict[str, asyncio.Task] = {}
        #: releases of runs granted to requests cancelled before their answer (lease_changed)
        self._releasing: set[asyncio.Future] = set()
        self.hellos = 0
        #: worker -> monotonic times a process came back to it here after another had taken its
        #: place, within node_limits.instance_switch_window_s: two processes share the id (_shared_id)
        self._switches: dict[str, list[float]] = {}
        #: worker -> the processes (instances) that asked here for it lately -> when, last
        self._instances: dict[str, dict[str, float]] = {}
        self._shared_said: dict[str, float] = {}
        #: heartbeats held for heartbeat_linger_s, to be proposed in one turn (one log entry)
        self._lingering: list[tuple[dict, asyncio.Future]] = []
        self._linger_handle: asyncio.TimerHandle | None = None
        #: worker -> [monotonic time of its last heartbeat here, the interval it was asked for]:
        #: the workers heartbeating at this node (next_heartbeat_s), oldest heartbeat first
        self._heartbeating: dict[str, list] = {}

    async def propose(self, cmd: dict) -> dict:
        """``Proposer.propose`` (raftsched/proposer.py), without the replay look: the worker
        protocol is the hot path, and apply answers a repeated request id the same way."""
        return await self.proposer.propose(cmd, replay=False)

    def stats(self) -> dict:
        return dict(self.dispatcher.stats(), hellos=self.hellos)

    # ------------------------------------------------------------------ the worker protocol
    async def lease(self, wid: str, body, alive=None, tenants=None, key: str | None = None) -> dict:
        """``POST /v1/workers/{id}/lease``: register the worker if its facts are new, propose the
        outcomes the request carries, then wait for runs (node/dispatch.py). ``{"runs":
        [grant...], "draining": bool}``, and ``results`` (or ``results_error``) when it carried
        outcomes.

        :param alive: whether the client still waits (its connection is open): a request whose
            worker went away is passed over.
        :param tenants: the tenants the request's token is limited to (None: every tenant).
        :param key: the request's Idempotency-Key (scoped to its token): the request id of the
            outcomes it carries, as of a ``complete``'s."""
        return (await self.lease_changed(wid, body, alive, tenants, key))[0]

    async def lease_changed(self, wid: str, body, alive=None, tenants=None,
                            key: str | None = None) -> tuple[dict, bool]:
        """``lease``, and whether it changed something: proposed a hello (registered the worker
        or changed its facts) or carried outcomes. An answer with no runs that changed nothing is
        an idle poll, which the audit log does not record (node/api.py).

        Outcomes carried (``results``, as a ``complete``'s) are proposed first, as one
        ``complete_many`` with ``key`` as its request id, and the wait for runs begins beside
        it. The answer waits for both. Should the
        completion fail (no leader in time, its outcome unknown), the answer still carries the
        runs granted, and ``results_error`` instead of ``results``: the worker sends the same
        outcomes to ``complete`` with the same key, which acts at most once."""
        t0 = self.clock.monotonic_s()
        wid = _worker_id(wid)
        facts, n, wait_s, ttl_ms, items = parse_lease(body)
        facts["tenants"] = None if tenants is None else sorted(tenants)
        if tenants is not None:
            # A worker id registered by a token of other tenants (or of none: every tenant) is
            # not this token's to take: its hello would rewrite that worker's facts and tenants.
            self._own_worker(wid, tenants)
        self._seen.add(wid)
        done = None
        if items is not None:
            done = asyncio.ensure_future(self.propose(commands.complete_many(
                self.clock.now_ms(), key or uuid.uuid4().hex, results=items, worker=wid, own=True, tenants=tenants)))
            # Retrieved here when the lease itself fails and nothing awaits it below.
            done.add_done_callback(_retrieved)
        answer, hello = await self._lease(wid, facts, n, wait_s, ttl_ms, alive)
        if done is not None:
            try:
                res = await asyncio.shield(done)
            except RaftschedError as e:
                answer["results_error"] = e.to_dict()
            except asyncio.CancelledError:
                if answer["runs"]:  # never answered: given back, as an answer not delivered is
                    t = asyncio.ensure_future(self.release_grants(wid, answer["runs"], "the lease answer was not sent"))
                    self._releasing.add(t)
                    t.add_done_callback(self._releasing.discard)
                raise
            except Exception as e:  # a bug of the proposal's: the runs granted are answered still
                log.exception("fleet: outcomes carried by a lease request of %s failed", wid)
                answer["results_error"] = RaftschedError(f"the outcomes could not be proposed: {e!r}").to_dict()
            else:
                try:
                    answer["results"] = outcome_results(res, [it["run"] for it in items])
                except RaftschedError as e:  # a request id used again for other outcomes
                    answer["results_error"] = e.to_dict()
                else:
                    if res.get("duplicate"):
                        answer["duplicate"] = True
        # How long the request was here: the worker takes it from its round trip, and what is
        # left is time on the way, which ages the leases granted (worker/remote.py).
        answer["held_ms"] = round((self.clock.monotonic_s() - t0) * 1000)
        return self._timed(answer), hello or done is not None

    def _own_worker(self, wid: str, tenants) -> dict | None:
        """The replica's record of worker ``wid`` (None: not registered). :raises Forbidden: it
        is registered for other tenants than ``tenants`` (a token limited to them), or for all."""
        rec = self.raft.read(queries.worker_record, wid)
        if tenants is not None and rec is not None \
                and (rec["tenants"] is None or not set(rec["tenants"]) <= set(tenants)):
            raise Forbidden(f"worker id {wid!r} is registered for other tenants than this token's; "
                            "give this worker an id of its own", field="worker")
        return rec

    async def leave(self, wid: str, body, key: str | None, tenants=None) -> dict:
        """``POST /v1/workers/{id}/leave`` ``{"instance", "reason"?}``: the worker process
        ``instance`` is going away (its SIGTERM's drain): the worker is drained (the
        ``drain_worker`` an operator's ``POST /v1/workers/{id}/drain`` proposes), so the registry
        shows it ``draining`` from now on and grants it nothing, where it showed it ``active``
        until unseen for ``worker_gone_ms``. A leave of another instance than the one registered
        (a new process under the id since) changes nothing: ``{"worker", "state", "changed":
        false}``; it is checked after a read barrier, so a registration acknowledged before the
        leave arrived is seen. One that commits while the leave's drain is on its way is drained
        with it (the command names no instance: a replica of an older version would apply it
        regardless): two processes of one id alive at once, which the registry does not support.
        A new instance's hello makes a drained worker active again.

        :raises NotFound: no such worker. :raises InvalidSpec: a bad body."""
        wid = _worker_id(wid)
        b = check_body(body, LEAVE_FIELDS)
        instance = b.get("instance")
        if not isinstance(instance, str) or not 1 <= len(instance) <= 64:
            raise InvalidSpec("is required: the leaving process's instance id (1-64 characters), as its "
                              "lease requests send it", field="instance")
        reason = b.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
            raise InvalidSpec("must be a string of at most 200 characters", field="reason")
        await self.reads.wait()
        rec = self._own_worker(wid, tenants)
        if rec is None:
            raise NotFound(f"no worker {wid!r}", field="worker")
        if rec["instance"] != instance:
            # (another process registered under this id since: it stays as it is)
            return {"worker": wid, "state": rec["state"], "changed": False}
        self._seen.add(wid)
        res = await self.propose(commands.drain_worker(self.clock.now_ms(), key or uuid.uuid4().hex, worker=wid))
        log.info("fleet: worker %s (instance %s) leaves%s", wid, instance, f": {reason}" if reason else "")
        return {"worker": wid, "state": res["state"], "changed": bool(res.get("changed"))}

    def keys_condition(self) -> dict | None:
        """The condition ``node.keys_missing`` while this node lacks keys it found missing
        (``/v1/cluster`` ``conditions``, the dashboard's strip), else None."""
        still = sorted(k for k in self.keys_missing if not self.keyring.holds(k))
        if not still:
            self.keys_missing.clear()  # (the key files are in its ring now)
            return None
        return {"type": "node.keys_missing", "node": "self", "keys": still,
                "message": f"this node's key ring lacks key(s) {', '.join(still)} that job secrets are sealed under: "
                           "their runs fail here until it holds them (docs/operations.md, \"Key files\")"}

    async def _lease(self, wid: str, facts: dict, n: int, wait_s: float, ttl_ms: int, alive) -> tuple[dict, bool]:
        """The hello when the worker's facts are new, then the wait for runs: (answer, hello)."""
        rec = self.raft.read(queries.worker_record, wid)
        hello = rec is None or any(rec[k] != v for k, v in facts.items()) or rec["targets"] != facts.get("targets")
        switched = hello and rec is not None and rec["instance"] != facts["instance"] and facts["instance"] is not None
        registered = rec["instance"] if rec is not None else None
        shared = None
        if hello:
            await self._hello(wid, facts)
            rec = self.raft.read(queries.worker_record, wid)
            if switched:  # (counted once the hello took: a failed one is retried, not a switch)
                shared = self._shared_id(wid, registered, facts["instance"])
        if rec is not None and rec["state"] == "draining":
            return {"runs": [], "draining": True}, hello
        types = None if set(facts["executors"]) == set(EXECUTOR_TYPES) else facts["executors"]
        req = LeaseRequest(wid, facts["queues"], facts["labels"], types, n, ttl_ms, alive, facts["dedicated"],
                           facts["tenants"], facts.get("targets"))
        await self.dispatcher.lease(req, wait_s)
        # Unsealed here, where the run is handed out, and nowhere else (docs/security.md).
        runs = [self.unseal(g) for g in req.grants]
        sealing.note_keys_missing(runs, self.keys_missing, f"node {self.node_id}")
        answer = {"runs": runs, "draining": req.draining}
        if not req.grants and not req.draining:
            longer = self.next_wait_s(wait_s)
            if longer is not None:
                answer["next_wait_s"] = longer
        if shared is not None:
            answer["warnings"] = [shared]
        return answer, hello

    def _shared_id(self, wid: str, registered: str | None, asking: str) -> str | None:
        """A lease request of ``wid`` from process ``asking`` re-registered it where the registry
        held ``registered``: a restart does that, once a process, and a crash loop once each new
        process; two processes under one id (the same --id given twice) take turns at it, so a
        process comes back after another took its place. That return, ``returns_shared`` times
        within node_limits.instance_switch_window_s, is said: the warning (for the lease answer,
        which the worker logs), logged here at most once a window a worker. None: not (yet)."""
        now = self.clock.monotonic_s()
        window = node_limits.instance_switch_window_s
        seen = {i: t for i, t in self._instances.pop(wid, {}).items() if now - t < window}
        returned = asking in seen  # it asked here before, and another took its place since
        seen[asking] = now
        if registered is not None:
            seen.setdefault(registered, now)
        self._instances[wid] = dict(sorted(seen.items(), key=lambda it: it[1])[-8:])  # (re-inserted last)
        times = [t for t in self._switches.pop(wid, ()) if now - t < window]
        if returned:
            times.append(now)
        if times:
            self._switches[wid] = times[-node_limits.instance_returns_shared:]
        for book in (self._instances, self._switches):
            while len(book) > node_limits.instance_switch_workers_max:
                del book[next(iter(book))]
        if len(times) < node_limits.instance_returns_shared:
            return None
        pair = " and ".join(sorted({asking, registered or "?"}))
        text = (f"worker id {wid!r} is used by more than one process: instances {pair} took turns at it within "
                f"{window:g} s; give each process an id of its own (raftsched worker --id), else their leases, "
                "heartbeats and registry record mix")
        said = self._shared_said.get(wid)
        if said is None or now - said >= window:
            self._shared_said[wid] = now
            while len(self._shared_said) > node_limits.instance_switch_workers_max:
                del self._shared_said[next(iter(self._shared_said))]
            log.warning("fleet: %s", text)
        return text

    def next_wait_s(self, wait_s: float) -> float | None:
        """The wait an idle worker should ask for next, when longer than its ``wait_s``: enough
        that the requests waiting here come back at ``lease_idle_answers_per_s`` (node/limits.py),
        at most ``lease_wait_s_max``. None: its own wait is long enough."""
        want = min(worker_limits.lease_wait_s_max,
                   round(self.dispatcher.waiting / node_limits.lease_idle_answers_per_s, 1))
        return want if want > wait_s else None

    def _timed(self, answer: dict) -> dict:
        """``answer`` with ``cluster_ms``, cluster time as this node knows it when it answers
        (absent when it does not): a remote worker starts no run before its slot by that clock,
        whatever its own says (worker/remote.py)."""
        t = self.raft.cluster_ms() if hasattr(self.raft, "cluster_ms") else None
        if t is not None:
            answer["cluster_ms"] = t
        return answer

    async def _hello(self, wid: str, facts: dict) -> None:
        t = self._hellos.get(wid)
        if t is None or t.done():
            cmd = commands.worker_hello(self.clock.now_ms(), worker=wid, facts=facts)
            t = self._hellos[wid] = asyncio.ensure_future(self.propose(cmd))
            t.add_done_callback(lambda _t, w=wid: self._hellos.pop(w, None) if self._hellos.get(w) is _t else None)
            self.hellos += 1
        await asyncio.shield(t)

    async def heartbeat(self, wid: str, body, tenants=None) -> dict:
        """``POST /v1/workers/{id}/heartbeat``: ``{"extended", "lost", "draining"}``, and ``ended``
        (``{run: its error}``) for the lost leases whose run was ended while they held it (a
        cancel by request, an overlap replace: queries.ended_leases). With ``tenants`` (the
        token's), a lease of a run of another tenant is ``lost``."""
        wid = _worker_id(wid)
        b = check_body(body, HEARTBEAT_FIELDS)
        leases, ttl = _leases(b), _ttl(b)
        self._seen.add(wid)
        longer = self.next_heartbeat_s(wid, ttl)
        res = await self._propose_lingering(commands.heartbeat(self.clock.now_ms(), worker=wid, leases=leases,
                                                               ttl=ttl, tenants=tenants))
        answer = {"extended": res["extended"], "lost": res["lost"], "draining": bool(res.get("draining"))}
        if res["lost"]:
            gone = set(res["lost"])
            ended = self.raft.read(queries.ended_leases, wid, [lease for lease in leases if lease[0] in gone], tenants)
            if ended:
                answer["ended"] = ended
        if longer is not None:
            answer["next_heartbeat_s"] = longer
        return self._timed(answer)

    def next_heartbeat_s(self, wid: str, ttl_ms: int) -> float | None:
        """Note worker ``wid``'s heartbeat (of leases of ``ttl_ms``), and return the interval it
        should heartbeat at next, when longer than its own (a third of its TTL, at most
        worker/limits.py heartbeat_interval_s_max): enough that the workers heartbeating here
        come at ``heartbeats_per_s`` (node/limits.py), never longer than a quarter of its TTL
        (heartbeat_asked_ttl_share_max: a lease survives a heartbeat that timed out).
        None: its own is short enough. A worker counts as heartbeating here until twice the
        interval it was asked for (at least heartbeat_seen_s) has passed without one."""
        now = self.clock.monotonic_s()
        seen = self._heartbeating
        seen.pop(wid, None)
        for w, (t, asked) in list(itertools.islice(seen.items(), 8)):  # a few of the oldest, each time
            if now - t <= max(node_limits.heartbeat_seen_s, 2 * asked):
                break
            del seen[w]
        own = min(ttl_ms / 1000 / worker_limits.heartbeats_per_lease_ttl, worker_limits.heartbeat_interval_s_max)
        want = min(ttl_ms / 1000 * worker_limits.heartbeat_asked_ttl_share_max,
                   round((len(seen) + 1) / node_limits.heartbeats_per_s, 1))
        seen[wid] = [now, max(own, want)]
        return want if want > own else None

    async def _propose_lingering(self, cmd: dict) -> dict:
        """``propose``, after up to heartbeat_linger_s: the commands held meanwhile are proposed
        in one turn of the event loop, so that they go out as one log entry."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._lingering.append((cmd, fut))
        if self._linger_handle is None:
            self._linger_handle = loop.call_later(node_limits.heartbeat_linger_s, self._propose_lingered)
        return await fut

    def _propose_lingered(self) -> None:
        self._linger_handle = None
        held, self._lingering = self._lingering, []
        for cmd, fut in held:
            if not fut.done():  # (its request went away meanwhile: nothing to renew for it)
                t = asyncio.ensure_future(self.propose(cmd))
                t.add_done_callback(functools.partial(_relay, fut))

    async def complete(self, wid: str, body, key: str | None, tenants=None) -> dict:
        """``POST /v1/workers/{id}/complete``: one ``complete_many`` with the request's
        Idempotency-Key as its request id (a retry acts once). ``{"results": [...]}``, one per
        outcome: a stale token, or a run another worker holds, is refused for that outcome
        alone. With ``tenants`` (the token's), an outcome for a run of another tenant is refused
        as for a run that does not exist."""
        wid = _worker_id(wid)
        items = parse_results(body)
        self._seen.add(wid)
        res = await self.propose(commands.complete_many(self.clock.now_ms(), key or uuid.uuid4().hex,
                                                        results=items, worker=wid, own=True, tenants=tenants))
        out = {"results": outcome_results(res, [it["run"] for it in items])}
        if res.get("duplicate"):
            out["duplicate"] = True
        return out

    async def release(self, wid: str, body, key: str | None, tenants=None) -> dict:
        """``POST /v1/workers/{id}/release``: ``{"released", "lost"}``. With ``tenants`` (the
        token's), a lease of a run of another tenant is ``lost``."""
        wid = _worker_id(wid)
        b = check_body(body, RELEASE_FIELDS)
        leases = _leases(b)
        reason = b.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
            raise InvalidSpec("must be a string of at most 200 characters", field="reason")
        not_started = b.get("not_started", False)
        if not isinstance(not_started, bool):
            raise InvalidSpec("must be true or false: whether the worker never began these runs", field="not_started")
        self._seen.add(wid)
        res = await self.propose(commands.release(self.clock.now_ms(), key or uuid.uuid4().hex, worker=wid,
                                                  leases=leases, reason=reason, tenants=tenants,
                                                  not_started=not_started))
        return {"released": res["released"], "lost": res["lost"]}

    async def release_grants(self, wid: str, grants: list[dict], reason: str) -> None:
        """Give back runs granted for a request nobody waits for any more. Never raises: a
        release that fails leaves the leases to expire (a lost attempt)."""
        leases = [[g["id"], g["token"]] for g in grants]
        try:
            await self.propose(commands.release(self.clock.now_ms(), uuid.uuid4().hex, worker=wid, leases=leases,
                                                reason=reason, not_started=True))  # (never delivered: never begun)
        except RaftschedError as e:
            log.warning("fleet: could not give back %d runs granted to %s (their leases will expire): %s",
                        len(leases), wid, e.message)

    # ------------------------------------------------------------------ admin
    def list_workers(self) -> dict:
        now = self.clock.now_ms()
        ws = [worker_view(w) for w in self.raft.read(queries.workers, now)]
        return {"workers": ws, "total": len(ws)}

    def get_worker(self, wid: str) -> dict:
        wid = _worker_id(wid)
        w = self.raft.read(queries.worker, wid, self.clock.now_ms())
        if w is None:
            raise NotFound(f"no worker {wid!r}", field="id")
        return worker_view(w)

    async def drain(self, wid: str, rid: str | None) -> dict:
        """``POST /v1/workers/{id}/drain``."""
        wid = _worker_id(wid)
        res = await self.propose(commands.drain_worker(self.clock.now_ms(), rid or uuid.uuid4().hex, worker=wid))
        held = (self.raft.read(queries.worker, wid, self.clock.now_ms()) or {}).get("held", 0)
        out = {"worker": wid, "state": res["state"], "held": held}
        if res.get("duplicate"):
            out["duplicate"] = True
        return out

    # ------------------------------------------------------------------ loops
    async def run(self) -> None:
        """The dispatcher, the workers_seen reports and (while leading) forget_workers, until
        cancelled. A failing part fails the loop (the node stops, node.py)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.dispatcher.run(), name="dispatcher")
            tg.create_task(self._seen_loop(), name="workers seen")
            tg.create_task(self._forget_loop(), name="workers forget")

    async def _seen_loop(self) -> None:
        while True:
            await asyncio.sleep(self.seen_interval_s)
            await self.report_seen()

    async def report_seen(self) -> int:
        """Propose workers_seen for the workers that contacted this node since the last report,
        those waiting at it and its embedded worker, in as many commands as needed; only those
        its replica holds (the others say hello with their next request). Returns how many."""
        ids = self._seen | self.dispatcher.waiting_workers()
        self._seen = set()
        if self.embedded_id is not None:
            ids.add(self.embedded_id)
        known = self.raft.read(_registered, sorted(ids))
        # each command under its bound, in ids and in bytes
        chunks = cut_by(known, lambda wid: len(wid.encode()) + 3, limits.workers_seen_ids_max,
                        limits.command_bytes_max - 1024)
        for chunk in chunks:
            try:
                await self.propose(commands.workers_seen(self.clock.now_ms(), node=self.node_id, workers=chunk))
            except RaftschedError as e:
                log.debug("fleet: workers_seen not applied: %s", e.message)
        return len(known)

    async def _forget_loop(self) -> None:
        while True:
            await asyncio.sleep(node_limits.workers_forget_check_s)
            if self.raft.is_leader():
                await self.forget()

    async def forget(self) -> list[str]:
        """The leader's clean-up: forget_workers for workers gone for core worker_forget_ms."""
        items = self.raft.read(queries.workers_to_forget, self.clock.now_ms(), limits.forget_workers_max)
        if not items:
            return []
        try:
            res = await self.propose(commands.forget_workers(self.clock.now_ms(), workers=items))
        except RaftschedError as e:
            log.warning("fleet: forget_workers failed: %s", e.message)
            return []
        if res["forgotten"]:
            log.info("fleet: forgot %d workers gone for %d s: %s", len(res["forgotten"]),
                     limits.worker_forget_ms // 1000, ", ".join(res["forgotten"][:10]))
        return res["forgotten"]

    # ------------------------------------------------------------------ metrics
    def collector(self) -> "FleetCollector":
        return FleetCollector(self)


def _registered(s, ids: list[str]) -> list[str]:
    """The ids of ``ids`` the replica holds (a read under the replica's lock)."""
    return [i for i in ids if i in s.workers]


class FleetCollector:
    """The fleet's metrics (``GET /metrics``), from the local replica at scrape time: workers by
    status; the runs the fleet holds and its lease grants, losses and releases, in all and, while
    no more than ``Fleet.metrics_workers_max`` workers are registered, per worker; per queue the
    queued runs no live worker may take for their placement."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        # The fleet's counters must not go down when a worker is forgotten (its record leaves
        # the registry after worker_forget_ms: Prometheus would read a reset, and rate() a spike
        # of the whole total). So the grants, losses and releases a forgotten worker had at this
        # node's last scrape stay in its totals (this node's: they reset when it restarts, as a
        # counter does). Scrapes may run at once, in threads (node/api.py): one lock.
        self._lock = threading.Lock()
        self._last: dict[str, tuple[int, int, int]] = {}
        self._gone = (0, 0, 0)

    def _totals(self, workers: dict[str, tuple[int, int, int, int]]) -> tuple[int, int, int]:
        """Grants, losses and releases of the registered workers, plus those forgotten workers
        had when this node last saw them (a record whose counts went down was forgotten and
        registered again under its id: its old counts are kept likewise)."""
        with self._lock:
            gone = list(self._gone)
            now = {wid: v[1:] for wid, v in workers.items()}
            for wid, before in self._last.items():
                after = now.get(wid)
                if after is None or any(a < b for a, b in zip(after, before)):
                    gone = [x + y for x, y in zip(gone, before)]
            self._gone = (gone[0], gone[1], gone[2])
            self._last = now
            return (gone[0] + sum(v[0] for v in now.values()), gone[1] + sum(v[1] for v in now.values()),
                    gone[2] + sum(v[2] for v in now.values()))

    def collect(self):
        f = self.fleet
        cond = f.keys_condition()
        yield GaugeMetricFamily("raftsched_node_keys_missing",
                                "keys job secrets are sealed under that this node's key ring lacks (found when it "
                                "handed out a run: their runs fail here until it holds them)",
                                value=0 if cond is None else len(cond["keys"]))
        g = f.raft.read(queries.fleet_gauges, f.clock.now_ms())
        by = GaugeMetricFamily("raftsched_workers", "registered workers by status (gone: unseen for worker_gone_ms)",
                               labels=["status"])
        for st, n in g["by_status"].items():
            by.add_metric([st], n)
        yield by
        workers = g["workers"]
        h_all = sum(v[0] for v in workers.values())
        g_all, l_all, r_all = self._totals(workers)
        yield GaugeMetricFamily("raftsched_fleet_runs_held", "runs the registered workers hold (leased, running)",
                                value=h_all)
        yield CounterMetricFamily("raftsched_fleet_lease_grants", "leases granted to the workers (those forgotten "
                                  "since this node started included)", value=g_all)
        yield CounterMetricFamily("raftsched_fleet_lease_losses", "leases of the workers that expired (those "
                                  "forgotten since this node started included)", value=l_all)
        yield CounterMetricFamily("raftsched_fleet_lease_releases", "leases the workers gave back (those forgotten "
                                  "since this node started included)", value=r_all)
        per = workers if 0 < f.metrics_workers_max and len(workers) <= f.metrics_workers_max else None
        yield GaugeMetricFamily("raftsched_worker_series", "1 while the per-worker series below are shown, 0 when "
                                "more workers are registered than --metrics-workers-max", value=int(per is not None))
        if per is not None:
            held = GaugeMetricFamily("raftsched_worker_runs_held", "runs the worker holds (leased, running)",
                                     labels=["worker"])
            grants = CounterMetricFamily("raftsched_worker_lease_grants", "leases granted to the worker", labels=["worker"])
            losses = CounterMetricFamily("raftsched_worker_lease_losses", "leases of the worker that expired",
                                         labels=["worker"])
            rel = CounterMetricFamily("raftsched_worker_lease_releases", "leases the worker gave back",
                                      labels=["worker"])
            for wid, (h, gr, lo, re) in sorted(per.items()):
                held.add_metric([wid], h)
                grants.add_metric([wid], gr)
                losses.add_metric([wid], lo)
                rel.add_metric([wid], re)
            yield held
            yield grants
            yield losses
            yield rel
        un = GaugeMetricFamily("raftsched_runs_unplaceable",
                               "queued runs no live worker serving the queue may take (its placement, tenant or handler)",
                               labels=["queue"])
        # The walk of the queued runs, outside the replica's lock (core/worker_queries.py).
        counts = {} if g["unplaceable"] is None else queries.unplaceable_walk(g["unplaceable"])
        for q, n in sorted(counts.items()):
            un.add_metric([q], n)
        yield un
        d = f.dispatcher.stats()
        yield GaugeMetricFamily("raftsched_lease_requests_waiting", "lease requests waiting at this node", value=d["waiting"])
        yield CounterMetricFamily("raftsched_dispatch_acquires", "acquires this node's dispatcher proposed",
                                  value=d["acquires"])
        yield CounterMetricFamily("raftsched_dispatch_acquires_empty", "of those, acquires that granted nothing",
                                  value=d["acquires_empty"])
