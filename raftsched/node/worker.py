"""The worker: leases runs, executes them, heartbeats, reports (DESIGN.md sections 3 and 6).

Every node runs one. Following the design card, followers execute and the leader executes only
when it is the only member or was told to (``execute_on_leader``), so the leader's event loop
stays free for the trigger loop and the log.

- It asks for work only when its local replica shows runs ready in the queues it serves, and
  never for more runs than it has free run slots (``slots``): a node never holds a lease it
  cannot run.
- One ``heartbeat`` command per interval (a third of the lease TTL, at most 1 s) extends all its leases. A
  lease the state reports lost is killed at once. If no heartbeat has succeeded for a whole TTL,
  by this process's monotonic clock, every run is killed: the leader may already have expired
  the leases and handed the runs to another worker.
- ``complete`` carries the run's fencing token; a refusal (stale token) means another attempt
  owns the run now, and the outcome is dropped. A completion whose outcome is unknown (504) is
  retried with the same request id, which the state machine deduplicates.

The worker id includes the process id, so a restarted node never mistakes its predecessor's
leases for its own: those expire and their runs are executed again, with attempt + 1.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

import aiohttp
import msgpack

from ..clock import Clock
from ..core import commands, limits
from ..core.errors import Conflict, Indeterminate, NotFound, RaftschedError, Unavailable
from .executors import ALL_TYPES, RunContext, execute

log = logging.getLogger("raftsched.worker")

#: encoded outcomes per complete_many, leaving room for the envelope under command_bytes_max
_COMPLETE_BATCH_BYTES_MAX = limits.command_bytes_max - 4096


class _Held:
    __slots__ = ("grant", "cancel", "task", "token", "executing")

    def __init__(self, grant: dict) -> None:
        self.grant = grant
        self.token = grant["token"]
        self.cancel = asyncio.Event()
        self.task: asyncio.Task | None = None
        #: True while the executor runs; False once only its report is pending
        self.executing = True


class Worker:
    def __init__(self, state, raft, clock: Clock, node_id: str, *, slots: int = 4,
                 queues: list[str] | None = None, allowed_types=ALL_TYPES,
                 lease_ttl_ms: int = limits.lease_ttl_ms_default, execute_on_leader: bool = False,
                 single_node: bool = False, poll_interval_s: float = 0.1, kill_grace_s: float = 5.0) -> None:
        self.state = state
        self.raft = raft
        self.clock = clock
        self.worker_id = f"{node_id}/{os.getpid()}"
        self.slots = slots
        self.queues = sorted(set(queues)) if queues else None
        self.allowed_types = frozenset(allowed_types)
        self.lease_ttl_ms = lease_ttl_ms
        self.execute_on_leader = execute_on_leader
        self.single_node = single_node
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self.held: dict[str, _Held] = {}
        self._last_hb_ok = time.monotonic()
        self._session: aiohttp.ClientSession | None = None
        self._outbox: list[tuple[dict, asyncio.Future]] = []
        self._outbox_ready = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self.completed = 0
        self.refused = 0

    # ---------------------------------------------------------------- main loops
    async def run(self) -> None:
        self._session = aiohttp.ClientSession()
        hb = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        watchdog = asyncio.create_task(self._watchdog(), name="lease watchdog")
        flusher = asyncio.create_task(self._flush_loop(), name="outcome flusher")
        try:
            while True:
                # A run slot is taken while its executor runs; a finished run whose report is
                # still on its way keeps its lease (heartbeated) but not a slot.
                free = self.slots - sum(1 for h in self.held.values() if h.executing)
                if free > 0 and self._may_execute() and self.state.has_ready_work(self.queues, self.clock.now_ms()):
                    try:
                        got = await self._acquire(free)
                    except RaftschedError as e:
                        log.debug("worker: acquire failed: %s", e.message)
                        await asyncio.sleep(self.poll_interval_s)
                        continue
                    if got == free:
                        continue  # maybe more is ready
                    if got == 0:
                        # Ready entries were stale or rate-limited: do not spin on the log.
                        await asyncio.sleep(5 * self.poll_interval_s)
                        continue
                # Wake when a slot frees, or poll for new work.
                self._slot_freed.clear()
                try:
                    await asyncio.wait_for(self._slot_freed.wait(), self.poll_interval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            hb.cancel()
            watchdog.cancel()
            for h in list(self.held.values()):
                h.cancel.set()
            tasks = [h.task for h in self.held.values() if h.task]
            if tasks:
                await asyncio.wait(tasks, timeout=self.kill_grace_s + 2)
            flusher.cancel()
            await asyncio.gather(hb, watchdog, flusher, return_exceptions=True)
            await self._session.close()

    def _may_execute(self) -> bool:
        if self.single_node or self.execute_on_leader:
            return True
        return not self.raft.is_leader()

    async def _acquire(self, free: int) -> int:
        n = min(free, limits.acquire_runs_max)
        sent = time.monotonic()  # a fresh lease counts from when it was asked for
        # Only runs of executor types this node runs: a node started with --executors http
        # leaves shell runs to the nodes that take them.
        types = sorted(self.allowed_types) if self.allowed_types != ALL_TYPES else None
        cmd = commands.make("acquire", self.clock.now_ms(), None, worker=self.worker_id,
                            queues=self.queues, max=n, ttl=self.lease_ttl_ms, types=types)
        res = await self._propose(cmd)
        for grant in res.get("runs", []):
            h = _Held(grant)
            self.held[grant["id"]] = h
            # A fresh lease counts as a heartbeat that succeeded when it was asked for.
            self._last_hb_ok = max(self._last_hb_ok, sent)
            h.task = asyncio.create_task(self._execute(h), name=f"run {grant['id']}")
        return len(res.get("runs", []))

    async def _heartbeat_loop(self) -> None:
        # A third of the TTL, and at most a second: a lease survives two lost heartbeats.
        interval = min(self.lease_ttl_ms / 3000, 1.0)
        while True:
            await asyncio.sleep(interval)
            if not self.held:
                self._last_hb_ok = time.monotonic()
                continue
            leases = [[rid, h.token] for rid, h in self.held.items()]
            sent = time.monotonic()
            try:
                # Bounded by half a TTL: a heartbeat that takes longer is of no use, and the
                # watchdog must not wait behind it.
                res = await self._propose(commands.make(
                    "heartbeat", self.clock.now_ms(), None, worker=self.worker_id,
                    leases=leases, ttl=self.lease_ttl_ms), timeout_s=self.lease_ttl_ms / 2000)
                self._last_hb_ok = sent
                for rid in res.get("lost", []):
                    h = self.held.get(rid)
                    if h is not None and not h.cancel.is_set():
                        log.warning("worker: lease on %s lost (heartbeat refused): killing the run", rid)
                        h.cancel.set()
            except RaftschedError as e:
                log.warning("worker: heartbeat failed: %s", e.message)

    async def _watchdog(self) -> None:
        """Kill every run once no heartbeat has succeeded for a whole TTL by this process's
        monotonic clock: the leader may have expired the leases and handed the runs on. The
        leader judges expiry from when it saw the last heartbeat, which is after it was sent,
        so this kill comes first."""
        while True:
            await asyncio.sleep(0.1)
            if self.held and time.monotonic() - self._last_hb_ok > self.lease_ttl_ms / 1000:
                for rid, h in self.held.items():
                    if not h.cancel.is_set():
                        log.warning("worker: no heartbeat for a lease TTL: killing %s", rid)
                        h.cancel.set()

    # ---------------------------------------------------------------- one run
    async def _execute(self, h: _Held) -> None:
        g = h.grant
        try:
            if g.get("executor") is None:
                outcome_ok, error, output = False, "the job was deleted", ""
            else:
                ctx = RunContext(run_id=g["id"], job=g["job"], slot_ms=g["slot"], attempt=g["attempt"],
                                 fencing_token=g["token"], payload=g.get("payload"))
                out = await execute(g["executor"], ctx, g["timeout_s"], cancel=h.cancel,
                                    allowed_types=self.allowed_types, kill_grace_s=self.kill_grace_s,
                                    http_session=self._session)
                outcome_ok, error, output = out.ok, out.error, out.output
            # Reported even when the lease was lost: the state refuses a stale token, and
            # accepts the outcome if the lease survived after all.
            h.executing = False
            self._slot_freed.set()
            await self._complete(g, outcome_ok, error, output)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker: run %s failed unexpectedly", g["id"])
        finally:
            self.held.pop(g["id"], None)

    async def _complete(self, g: dict, ok: bool, error: str | None, output: str | None) -> None:
        """Report one outcome. Outcomes are batched: the flusher sends every outcome that is ready
        in one ``complete_many`` (each judged alone by the state), so a busy worker spends one log
        entry on many runs."""
        item = {"run": g["id"], "token": g["token"], "success": ok, "error": error, "output": output}
        fut = asyncio.get_running_loop().create_future()
        self._outbox.append((item, fut))
        self._outbox_ready.set()
        res = await fut
        if res is None:
            return  # gave up: the lease will expire and the run is retried
        if res.get("ok"):
            self.completed += 1
        elif (res.get("error") or {}).get("code") == "conflict":
            self.refused += 1
            log.warning("worker: completion of %s refused: %s", g["id"], res["error"].get("message"))

    async def _flush_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            await asyncio.sleep(0.002)  # let the outcomes of the same moment join one command
            self._outbox_ready.clear()
            while self._outbox:
                batch, size = [], 0
                while self._outbox and len(batch) < limits.complete_batch_max:
                    item, fut = self._outbox[0]
                    n = len(msgpack.packb(item, use_bin_type=True))
                    if batch and size + n > _COMPLETE_BATCH_BYTES_MAX:
                        break
                    self._outbox.pop(0)
                    batch.append((item, fut))
                    size += n
                results = await self._send_outcomes([it for it, _ in batch])
                for k, (_, fut) in enumerate(batch):
                    if not fut.done():
                        fut.set_result(None if results is None else results[k])

    async def _send_outcomes(self, items: list[dict]) -> list[dict] | None:
        """Propose one complete_many, retrying an unknown outcome with the same request id (the
        state machine deduplicates it). None when it could not be delivered for a minute."""
        rid = uuid.uuid4().hex
        deadline = time.monotonic() + 60
        while True:
            cmd = commands.make("complete_many", self.clock.now_ms(), rid, results=items, worker=self.worker_id)
            try:
                return (await self._propose(cmd))["results"]
            except (Indeterminate, Unavailable) as e:
                if time.monotonic() > deadline:
                    log.warning("worker: giving up reporting %d outcomes: %s (their leases will expire)", len(items), e.message)
                    return None
                await asyncio.sleep(0.2)
            except RaftschedError as e:
                log.error("worker: outcomes refused as a whole: %s", e.message)
                return None

    async def _propose(self, cmd: dict, timeout_s: float = limits.propose_timeout_s_default) -> dict:
        res = await self.raft.propose(commands.encode(cmd), timeout_s=timeout_s)
        if not res.get("ok"):
            raise RaftschedError.from_dict(res.get("error") or {})
        return res
