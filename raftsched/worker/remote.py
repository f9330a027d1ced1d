"""``raftsched worker``: a worker process outside the Raft quorum (docs/workers.md).

It is the same lease loop as a node's embedded worker (worker/loop.py) over a
:class:`RemoteChannel`: the worker protocol over HTTP (docs/api.md, "The worker protocol") to
whichever node of ``--url`` answers. It is not a Raft member and holds no state of the
cluster's: what it knows is the leases it holds.

Routing: the requests go through :class:`raftsched.AsyncClient`, so they follow the same rules
as every client of the API (raftsched/client_rules.py): the nodes of ``--url`` are tried in turn,
starting with the one that answered last (a worker's first pick is spread by its id, so a fleet
does not all start on the first node); a connection error, a timeout, a 503 or 504 moves to the
next node, rounds of failures are separated by jittered pauses, until the call's deadline; an
unknown outcome is never reported as "definitely not". Any other error answer (4xx) is final.

- Lease: one long-poll at a time while idle (the node answers when it has granted runs, or
  with none after ``wait_s``); while busy, two, as the embedded worker pipelines its acquires.
  A node with many workers waiting at it asks for longer waits in its idle answers
  (``next_wait_s``): the worker waits that long next time (spread over its last fifth), never
  less than its own ``wait_s``.
- Heartbeat: one request per interval for all its leases, given up after half a TTL; the
  watchdog kills every run when none succeeded for a whole TTL.
- Clock: lease and heartbeat answers carry the node's cluster time (``cluster_ms``); the worker
  keeps it on its monotonic clock (core/clocksync.py ``observe``) and runs on it
  (raftsched/clock.py ``ClusterClock``): it starts no run before its slot by the cluster's
  clock, whatever its own says. A node that does not send it (another version) leaves the
  worker on its own clock, as before.
- Completions: batched, each batch with one Idempotency-Key for all its retries (another node
  after a lost connection or a 504), so a batch acts once. A batch reported in the same turn of
  the event loop as a lease request rides on it (``results``, with the batch's key as the
  request's Idempotency-Key): one request instead of two. Such a request waits at the node for
  runs at most ``carried_lease_wait_s`` (50 ms), so that its answer (which answers the outcomes
  too) is never held for long; an empty answer to it is followed at once by a lease request as
  usual. When that request fails, or its answer says the outcomes failed, or
  the node is of a version that refuses them, the batch goes alone to ``complete`` with the same
  key, which acts at most once.
- SIGTERM (or SIGINT, or the cluster's ``draining``): drain for up to ``--drain-s``, then exit 0.
  A second signal stops at once (runs are killed; their leases expire).
- A failure of the lease loop, its heartbeat loop or its watchdog (``WorkerFailed``): the runs
  held are given back, the error is logged, and the process exits 1.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import signal
import socket
import uuid
import zlib

from ..async_client import AsyncClient
from ..clock import Clock, ClusterClock, SystemClock
from ..config import ConfigError
from ..core import clocksync
from ..core.errors import Indeterminate, RaftschedError, Unavailable
from . import limits as worker_limits
from .executors import ALL_TYPES
from .loop import VERSION, ExecutorLookup, Grants, LeaseLoop
from .sandbox import CODE_TYPES, RunUser, Sandbox, resolve_run_user

log = logging.getLogger("raftsched.remote")


def default_worker_id() -> str:
    """``host/pid``: stable for the life of the process, and another one's after a restart."""
    host = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in socket.gethostname()) or "worker"
    if not host[0].isalnum():
        host = "w" + host
    return f"{host[:100]}/{os.getpid()}"


@dataclasses.dataclass
class WorkerConfig:
    """What ``raftsched worker`` was started with (cli.py validates each field)."""

    urls: list[str]
    token: str | None
    worker_id: str
    queues: list[str] | None = None
    labels: dict = dataclasses.field(default_factory=dict)
    slots: int = worker_limits.slots_default
    executors: frozenset = ALL_TYPES
    drain_s: float = worker_limits.drain_s_default
    lease_ttl_ms: int = worker_limits.lease_ttl_ms_default
    wait_s: float = worker_limits.lease_wait_s_default
    #: the seam for ``--app`` (worker/loop.py ExecutorLookup); None: the built-in executors
    executor_lookup: ExecutorLookup | None = None
    #: https: the CA the nodes' certificates chain to (None: the system's), and this worker's
    #: certificate and key for mutual TLS (docs/security.md)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: names of its labels the worker is dedicated to (core/workers.py): ``--app`` sets
    #: ``["raftsched.app"]``, so it is granted only runs placed on its app's label
    dedicated: list = dataclasses.field(default_factory=list)
    #: the python targets it has handlers for (``--app``: its app's, sdk/worker.py), so that it is
    #: granted no run of a job its version of the app does not declare; None: any
    targets: list | None = None
    #: what the worker runs, for its start's log line (``--app``: the app and its handlers)
    describe: str | None = None
    #: who shell and python runs execute as (``--run-as``; worker/sandbox.py), None: the default
    #: for this process (resolved at start), the names of this process's environment they get
    #: besides PATH, LANG and TZ (``--pass-env``), and where their directories are made
    #: (``--runs-dir``; None: the system's temporary directory)
    run_user: RunUser | None = None
    pass_env: tuple = ()
    runs_dir: str | None = None
    #: per-run users (``--run-uids``, worker/sandbox.py): each run as a uid of its own of these;
    #: None: every run as ``run_user``
    run_uids: range | None = None
    #: A test hook: shell and python runs in this process, no sandbox (the lease loop's tests
    #: watch their targets run). A real worker never sets it.
    in_process: bool = False


class _Carried:
    """A batch of outcomes that may ride on a lease request (``RemoteChannel.complete``):
    ``answer`` is set to the results of its outcomes, or to None (then it goes alone, with the
    same ``key``)."""

    __slots__ = ("items", "key", "answer")

    def __init__(self, items: list[dict], key: str) -> None:
        self.items = items
        self.key = key
        self.answer: asyncio.Future[list[dict] | None] = asyncio.get_running_loop().create_future()


def _answer(carried: _Carried, results: list[dict] | None) -> None:
    """Answer a carried batch, unless it was answered already, or its reporter stopped waiting
    (cancelled)."""
    if not carried.answer.done():
        carried.answer.set_result(results)


class RemoteChannel:
    """The worker protocol over HTTP, through :class:`raftsched.AsyncClient` (one retry
    semantics for every client of the API: raftsched/client_rules.py), with failover between
    the nodes of ``urls``."""

    kind = "remote"

    def __init__(self, cfg: WorkerConfig, clock: Clock) -> None:
        if not cfg.urls:
            raise ValueError("give at least one node URL")
        self.cfg = cfg
        self.clock = clock
        self.worker_id = cfg.worker_id
        #: why the cluster ended runs whose leases a heartbeat found lost (its answer's ``ended``)
        self.lost_why: dict[str, str] = {}
        urls = [u.rstrip("/") for u in cfg.urls]
        # A worker's first pick is spread by its id, so that a fleet does not all start on the
        # first node of the list; afterwards the client sticks to the node that answered last.
        k = zlib.crc32(cfg.worker_id.encode()) % len(urls)
        self.urls = urls[k:] + urls[:k]
        self.client = AsyncClient(self.urls, token=cfg.token, timeout_s=worker_limits.worker_request_timeout_s,
                                  deadline_s=worker_limits.report_deadline_s, ca_file=cfg.ca_file,
                                  cert_file=cfg.cert_file, key_file=cfg.key_file)
        #: this process, as its lease requests describe it (the node says hello for it)
        self.facts = {"queues": cfg.queues, "labels": dict(sorted(cfg.labels.items())), "slots": cfg.slots,
                      "executors": sorted(cfg.executors), "version": VERSION, "instance": uuid.uuid4().hex[:16]}
        if cfg.dedicated:  # only when set: a node of an older version refuses the field
            self.facts["dedicated"] = sorted(cfg.dedicated)
        if cfg.targets is not None:  # (likewise)
            self.facts["targets"] = sorted(cfg.targets)
        #: no targets sent before this monotonic time (a node refused the field)
        self._targets_after = 0.0
        #: what a node warned of in a lease answer -> when it was last logged (_warned)
        self._warnings_said: dict[str, float] = {}
        #: cluster time as the nodes' answers told it, on this process's monotonic clock
        self._anchor: clocksync.Anchor | None = None
        #: the wait the last idle answer asked for (its ``next_wait_s``), when longer than
        #: ``cfg.wait_s``: a node with many workers waiting at it asks them to come back less often
        self._asked_wait_s: float | None = None
        #: the heartbeat interval the last heartbeat's answer asked for (``next_heartbeat_s``),
        #: when it asked: a node with many workers heartbeating at it asks them to come less often
        self._asked_heartbeat_s: float | None = None
        self._rng = random.Random()
        #: outcome batches reported in this turn of the event loop, waiting for a lease request
        #: of the same turn to carry them (``complete``, ``acquire``)
        self._carry: list[_Carried] = []
        #: no outcomes carried before this monotonic time (a node refused them)
        self._carry_after = 0.0

    def cluster_ms(self) -> int | None:
        """Cluster time now as the last answers told it (None: no node said, or too long ago)."""
        t = clocksync.anchor_now(self._anchor, self.clock.monotonic_s() * 1000)
        return None if t is None else int(t)

    def _heard(self, answer) -> None:
        """Note the cluster time an answer carries (a lower bound of it now: it was true when the
        node answered)."""
        if isinstance(answer, dict) and "cluster_ms" in answer:
            self._anchor = clocksync.observe(self._anchor, answer["cluster_ms"], self.clock.monotonic_s() * 1000,
                                             None, "cluster")

    def _warned(self, answer) -> None:
        """Log what a node warns of in a lease answer (``warnings``: another process under this
        worker's id), each text at most once a minute."""
        texts = answer.get("warnings") if isinstance(answer, dict) else None
        if not isinstance(texts, list):
            return
        now = self.clock.monotonic_s()
        for text in texts[:5]:
            if isinstance(text, str) and now - self._warnings_said.get(text, float("-inf")) >= 60.0:
                if len(self._warnings_said) >= 64:
                    self._warnings_said.clear()
                self._warnings_said[text] = now
                log.warning("worker %s: the node warns: %s", self.worker_id, text[:500])

    # ------------------------------------------------------------------ the Channel
    async def hello(self) -> None:
        """Nothing to send: every lease request carries the facts, and the node says hello for
        the worker when its replica does not hold them."""

    def registered(self) -> bool:
        return True

    def may_acquire(self) -> bool:
        return True  # the lease request itself waits at the node for work

    def executes(self) -> bool:
        return True

    def lease_wait_s(self) -> float:
        """This lease request's wait: ``cfg.wait_s``, or what the node's last idle answer asked
        for (``next_wait_s``), spread over its last fifth so that a fleet started at once does not
        come back at once, never under ``cfg.wait_s`` nor over lease_wait_s_max."""
        asked = self._asked_wait_s
        if asked is None:
            return self.cfg.wait_s
        return round(max(self.cfg.wait_s, asked * self._rng.uniform(0.8, 1.0)), 3)

    def _asked(self, answer: dict) -> None:
        hint = answer.get("next_wait_s")
        ok = isinstance(hint, (int, float)) and not isinstance(hint, bool) and hint > self.cfg.wait_s
        self._asked_wait_s = min(float(hint), worker_limits.lease_wait_s_max) if ok else None

    async def acquire(self, n: int, ttl_ms: int, types: list[str] | None) -> Grants:
        carried = self._carry.pop(0) if self._carry else None
        try:
            return await self._acquire(n, ttl_ms, carried)
        finally:
            if carried is not None:
                _answer(carried, None)  # unless answered: the batch goes alone

    async def _acquire(self, n: int, ttl_ms: int, carried: "_Carried | None") -> Grants:
        # A request that carries outcomes waits for runs only briefly: its answer answers them too.
        wait_s = self.lease_wait_s() if carried is None else worker_limits.carried_lease_wait_s
        attempt = wait_s + worker_limits.lease_request_slack_s
        t0 = self.clock.monotonic_s()
        took: list[float] = []  # how long the attempt that answered took (not the call's earlier ones)
        try:
            facts = self.facts
            if "targets" in facts and self.clock.monotonic_s() < self._targets_after:
                facts = {k: v for k, v in facts.items() if k != "targets"}
            res = await self.client.worker_lease(self.worker_id, max_runs=n, wait_s=wait_s, ttl_ms=ttl_ms,
                                                 facts=facts, timeout_s=attempt, deadline_s=attempt,
                                                 results=None if carried is None else carried.items,
                                                 idempotent_key=None if carried is None else carried.key,
                                                 on_answer=took.append)
        except RaftschedError as e:
            status = getattr(e, "status", None) or 0
            if carried is not None and 400 <= status < 500 and (getattr(e, "field", None) or "").startswith("results"):
                # A node of a version before outcomes rode on lease requests (or one that
                # refuses these): they go alone for a while, and this request again without them.
                log.info("worker %s: the node refuses outcomes on lease requests (%s); sending them alone",
                         self.worker_id, e.message)
                self._carry_after = self.clock.monotonic_s() + worker_limits.carried_refused_pause_s
                _answer(carried, None)
                return await self._acquire(n, ttl_ms, None)
            if 400 <= status < 500 and getattr(e, "field", None) == "targets" and "targets" in self.facts \
                    and (e.message or "").startswith("unknown field"):
                # A node of a version before workers said which handlers they have: this worker
                # then takes any run of its app, and refuses those it has no handler for; for a
                # while (the node may be upgraded, or the next request go to another node).
                log.warning("worker %s: the node does not take the handlers it has (%s); leasing without them for "
                            "%g s: a run of a job this version of the app does not declare fails on it",
                            self.worker_id, e.message, worker_limits.carried_refused_pause_s)
                self._targets_after = self.clock.monotonic_s() + worker_limits.carried_refused_pause_s
                return await self._acquire(n, ttl_ms, carried)
            if 400 <= status < 500:
                # Final: a wrong token (401), a full registry (422), a body this node refuses
                # (another version): said once a pause, not ten times a second.
                log.error("worker %s: the node refuses its lease requests (HTTP %s %s: %s); asking again in %g s",
                          self.worker_id, status, e.code, e.message, worker_limits.lease_refused_pause_s)
                return Grants([], False, worker_limits.lease_refused_pause_s)
            raise
        self._heard(res)
        self._warned(res)
        if carried is not None:
            results = res.get("results")
            if isinstance(results, list) and len(results) == len(carried.items):
                _answer(carried, results)
            else:  # results_error: the batch goes alone, with the same key
                log.info("worker %s: outcomes carried by a lease request not applied (%s); sending them alone",
                         self.worker_id, (res.get("results_error") or {}).get("message", "no results"))
        runs, draining = res.get("runs") or [], bool(res.get("draining"))
        if not runs:
            self._asked(res)
        # An empty answer well before wait_s (a node that answers at once) is not a long-poll:
        # the loop's own pause applies, so the worker does not spin on it. One that carried
        # outcomes waited only briefly: the next request goes at once, and waits.
        rtt_s = self.clock.monotonic_s() - t0
        quick = not runs and carried is None and rtt_s < wait_s / 2
        held = res.get("held_ms")
        # The time on the way is the answering attempt's, less what the node held it: an earlier
        # attempt of the call (a 503 from a node with no leader, a dropped connection) granted
        # nothing, so its time is not the grants'. (A node of a version before held_ms: None, and
        # the loop judges by the clock alone.)
        answer_ms = (took[-1] if took else rtt_s) * 1000
        transit_ms = (max(0.0, answer_ms - held) if isinstance(held, (int, float)) and not isinstance(held, bool)
                      else None)
        return Grants(runs, draining, None if quick else 0.0, transit_ms)

    async def heartbeat(self, leases: list[list], ttl_ms: int, timeout_s: float) -> tuple[list[str], bool]:
        self._asked_heartbeat_s = None  # a heartbeat that fails: the next one at the worker's own interval
        res = await self.client.worker_heartbeat(self.worker_id, leases, ttl_ms,
                                                 timeout_s=max(0.2, timeout_s / 2), deadline_s=timeout_s)
        self._heard(res)
        hint = res.get("next_heartbeat_s")
        ok = isinstance(hint, (int, float)) and not isinstance(hint, bool) and hint > 0
        self._asked_heartbeat_s = float(hint) if ok else None
        ended = res.get("ended")
        if isinstance(ended, dict):  # (a node of a version before it: none)
            self.lost_why.update({k: v for k, v in ended.items() if isinstance(k, str) and isinstance(v, str)})
        return res.get("lost", []), bool(res.get("draining"))

    def heartbeat_interval_s(self, own_s: float, longest_s: float) -> float:
        """``own_s``, or what the last heartbeat's answer asked for (``next_heartbeat_s``), spread
        over its last fifth so that workers asked at once do not come back at once; never over
        ``longest_s`` (a quarter of the lease TTL: a lease survives a heartbeat that timed out).
        After a heartbeat that failed, its own."""
        asked = self._asked_heartbeat_s
        if asked is None or asked <= own_s:
            return own_s
        return round(min(longest_s, max(own_s, asked * self._rng.uniform(0.8, 1.0))), 3)

    async def complete(self, items: list[dict]) -> list[dict] | None:
        key = uuid.uuid4().hex
        if self.clock.monotonic_s() >= self._carry_after \
                and len(json.dumps(items, separators=(",", ":"))) <= worker_limits.carried_results_bytes_max:
            # A lease request of this turn carries the batch (``acquire``); if none goes out in
            # it, or that request does not answer the outcomes, the batch goes alone.
            carried = _Carried(items, key)
            self._carry.append(carried)
            asyncio.get_running_loop().call_soon(self._not_carried, carried)
            results = await carried.answer
            if results is not None:
                return results
        try:
            res = await self.client.worker_complete(self.worker_id, items, idempotent_key=key,
                                                    deadline_s=worker_limits.report_deadline_s)
        except (Indeterminate, Unavailable) as e:
            log.warning("worker: giving up reporting %d outcomes: %s (their leases will expire)", len(items), e.message)
            return None
        except RaftschedError as e:
            log.error("worker: outcomes refused as a whole: %s", e.message)
            return None
        return res.get("results")

    def _not_carried(self, carried: "_Carried") -> None:
        """The turn a batch was reported in is over: if no lease request took it, it goes alone."""
        if carried in self._carry:
            self._carry.remove(carried)
            _answer(carried, None)

    async def release(self, leases: list[list], reason: str, not_started: bool = False) -> None:
        """Give leases back (``not_started``: this worker never began them). A node of a version
        before the field refuses it (422 naming it): the same release goes again without it, as
        the older protocol's (the runs are queued again, counted as begun)."""
        try:
            await self.client.worker_release(self.worker_id, leases, reason[:200], idempotent_key=uuid.uuid4().hex,
                                             deadline_s=worker_limits.release_deadline_s,
                                             **({"not_started": True} if not_started else {}))
        except RaftschedError as e:
            if not not_started or getattr(e, "field", None) != "not_started":
                raise
            await self.client.worker_release(self.worker_id, leases, reason[:200], idempotent_key=uuid.uuid4().hex,
                                             deadline_s=worker_limits.release_deadline_s)

    async def leave(self, reason: str) -> None:
        """Tell the cluster this process is going away (``POST /v1/workers/{id}/leave``): its
        record shows it draining at once, where it showed it active until unseen for
        ``worker_gone_ms``. Never raises: a node of a version without the route, a worker never
        registered, or no node in time leave the record to go gone, as before."""
        try:
            await self.client.worker_leave(self.worker_id, self.facts["instance"], reason[:200],
                                           idempotent_key=uuid.uuid4().hex, deadline_s=worker_limits.leave_deadline_s)
        except RaftschedError as e:
            log.info("worker %s: the cluster was not told it leaves (%s); its record goes to gone once it is unseen",
                     self.worker_id, e.message)

    async def close(self) -> None:
        await self.client.close()


async def _first_contact(channel: RemoteChannel, cfg: WorkerConfig) -> None:
    """Ask the nodes' /healthz once at the start, for at most worker_limits.first_contact_s, and
    say at once when none answers; the lease loop keeps asking either way (and says an outage
    that lasts: loop.py ``_unanswered``). With several URLs each is asked on its own, so each one
    that does not answer is named with what it met (a walk: of an http URL to a TLS node and an
    https one without its CA, only the last one tried was said), as is one that fails while
    others answer (the worker uses those; it would not reach that node after a fail-over)."""
    urls = list(channel.urls)
    if len(urls) == 1:
        why = await _probe(channel.client)
        if why is not None and why.startswith(_ANSWERED):
            log.warning("worker %s: its first look at the nodes was %s", cfg.worker_id, why)
        elif why is not None:
            log.warning("worker %s: no node of its --url (%s) answered yet: %s; check --url and that the nodes are "
                        "up (the worker keeps asking)", cfg.worker_id, urls[0], why)
        return
    whys = await asyncio.gather(*(_probe_one(url, cfg) for url in urls))
    failed = [f"{url}: {why}" for url, why in zip(urls, whys) if why is not None]
    if len(failed) == len(urls):
        log.warning("worker %s: no node of its --url answered yet: %s; check --url and that the nodes are up "
                    "(the worker keeps asking)", cfg.worker_id, "; ".join(failed))
    elif failed:
        log.warning("worker %s: some nodes of its --url did not answer (it uses the others): %s", cfg.worker_id,
                    "; ".join(failed))


async def _probe_one(url: str, cfg: WorkerConfig) -> str | None:
    """:func:`_probe` of ``url`` alone, with a client of its own (closed after)."""
    try:
        client = AsyncClient([url], token=cfg.token, timeout_s=worker_limits.first_contact_s,
                             deadline_s=worker_limits.first_contact_s, ca_file=cfg.ca_file,
                             cert_file=cfg.cert_file, key_file=cfg.key_file)
    except (ValueError, OSError) as e:  # (a URL or a TLS file its own client would refuse too)
        return str(e)
    try:
        return await _probe(client)
    finally:
        await client.close()


async def _probe(client: AsyncClient) -> str | None:
    """Why ``client``'s nodes did not answer ``GET /healthz`` within first_contact_s (what the
    last try met: "Connect call failed", a TLS error), or the error one answered; None when one
    answered."""
    try:
        # (the client's own deadline, whose error names what the last try met)
        await asyncio.wait_for(client.healthz(deadline_s=worker_limits.first_contact_s),
                               worker_limits.first_contact_s + 5)
    except asyncio.CancelledError:
        raise
    except (Unavailable, Indeterminate, asyncio.TimeoutError) as e:
        return e.message if isinstance(e, RaftschedError) else f"no answer within {worker_limits.first_contact_s:g} s"
    except Exception as e:  # noqa: BLE001 - an answer, not an outage: said as it is
        return _ANSWERED + (e.message if isinstance(e, RaftschedError) else repr(e))
    return None


_ANSWERED = "answered with an error: "


async def run_worker(cfg: WorkerConfig, clock: Clock | None = None, stop: asyncio.Event | None = None) -> int:
    """Run a remote worker until SIGTERM/SIGINT (or ``stop``) or the cluster's ``draining``;
    then drain (up to ``cfg.drain_s``) and return 0. A second signal stops at once. Returns 1
    when the worker failed (``WorkerFailed``: a task of its lease loop failed, and the runs it
    held were given back, or its sandbox could not start), 2 when no run user could be chosen."""
    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):
            pass
    sandbox = None
    if not cfg.in_process and cfg.executor_lookup is None and cfg.executors & CODE_TYPES:
        try:
            user = cfg.run_user or resolve_run_user(None)
        except ConfigError as e:
            log.error("worker %s: %s", cfg.worker_id, e)
            return 2
        sandbox = Sandbox(user, pass_env=tuple(cfg.pass_env), name=cfg.worker_id, runs_parent=cfg.runs_dir,
                          run_uids=cfg.run_uids)
    channel = RemoteChannel(cfg, clock)
    # The lease loop runs on the cluster's clock where the nodes tell it (its grants' slots).
    lease_loop = LeaseLoop(channel, ClusterClock(clock, channel.cluster_ms), sandbox=sandbox, slots=cfg.slots,
                           allowed_types=cfg.executors,
                           lease_ttl_ms=cfg.lease_ttl_ms, executor_lookup=cfg.executor_lookup)
    log.info("worker %s: %d slots, executors %s, queues %s, labels %s; nodes %s; pid %d", cfg.worker_id, cfg.slots,
             ",".join(sorted(cfg.executors)), ",".join(cfg.queues) if cfg.queues else "all",
             ",".join(f"{k}={v}" for k, v in sorted(cfg.labels.items())) or "none", ",".join(cfg.urls), os.getpid())
    if cfg.describe:
        log.info("worker %s: %s; dedicated to label(s) %s", cfg.worker_id, cfg.describe,
                 ",".join(cfg.dedicated) or "none")
    task = asyncio.create_task(lease_loop.run(), name="lease loop")
    probe = asyncio.create_task(_first_contact(channel, cfg), name="first contact")
    stop_w = asyncio.create_task(stop.wait())
    drain_w = asyncio.create_task(lease_loop.drain_requested.wait())
    leaving: asyncio.Task | None = None
    try:
        await asyncio.wait({task, stop_w, drain_w}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            why = "SIGTERM" if stop.is_set() else "the cluster drains this worker"
            log.info("worker %s: draining (%s)", cfg.worker_id, why)
            drain = asyncio.create_task(lease_loop.drain(cfg.drain_s))
            if stop.is_set():  # (the cluster's drain has said so already)
                leaving = asyncio.create_task(channel.leave("stopping (a signal, or stop): draining its runs"))
            force_w = asyncio.create_task(force.wait())
            # The lease loop may fail while it drains: then it has given its runs back itself.
            await asyncio.wait({drain, force_w, task}, return_when=asyncio.FIRST_COMPLETED)
            if not drain.done():
                if not task.done():
                    log.warning("worker %s: second signal: stopping now (runs killed, their leases expire)",
                                cfg.worker_id)
                drain.cancel()
            force_w.cancel()
            await asyncio.gather(drain, return_exceptions=True)
    finally:
        for t in (stop_w, drain_w, probe):
            t.cancel()
        task.cancel()
        await asyncio.gather(task, stop_w, drain_w, probe, return_exceptions=True)
        if leaving is not None:
            # The leave's answer, for up to its deadline (~5 s), unless a second signal says stop now.
            forced = asyncio.create_task(force.wait())
            try:
                await asyncio.wait({leaving, forced}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                forced.cancel()
                leaving.cancel()
                await asyncio.gather(leaving, forced, return_exceptions=True)
        await channel.close()
        no_handler = getattr(cfg.executor_lookup, "refused", 0)  # (--app: runs it had no handler for)
        log.info("worker %s: stopped (%d completed, %d outcomes refused as stale, %d given back%s%s)", cfg.worker_id,
                 lease_loop.completed, lease_loop.refused, lease_loop.released,
                 f", {no_handler} run(s) failed for want of a handler" if no_handler else "",
                 f"; {lease_loop.lingering} handler thread(s) still running, abandoned" if lease_loop.lingering else "")
    failure = None if task.cancelled() else task.exception()
    if failure is not None:
        # Logged with its traceback by the lease loop; a supervisor sees a failure, not a clean stop.
        log.error("worker %s: stopped after a failure: %s", cfg.worker_id, failure)
        return 1
    return 0
