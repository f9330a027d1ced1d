"""One raftsched node: the replicated state, the Raft adapter, the trigger loop and the API,
wired together and run until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import ipaddress
import logging
import os
import secrets
import signal
import stat

from aiohttp import web

from ..clock import Clock, clock_from_env
from ..core.state import SchedulerState
from .. import replication
from .api import make_app
from .service import Service
from .trigger import Trigger
from .gcpause import GcPauses
from .metrics import NodeMetrics
from .worker import Worker

log = logging.getLogger("raftsched.node")


class ConfigError(Exception):
    pass


@dataclasses.dataclass
class NodeConfig:
    node_id: str
    api_host: str
    api_port: int
    raft_addr: str
    peers: list[str]
    data_dir: str
    secret: str
    token: str
    conf_overrides: dict = dataclasses.field(default_factory=dict)
    #: run slots of this node's worker (0: this node executes nothing)
    worker_slots: int = 4
    #: queues this node's worker serves (None: all)
    worker_queues: list[str] | None = None
    #: executor types this node runs
    executor_types: frozenset = frozenset({"shell", "http", "python"})
    execute_on_leader: bool = False
    lease_ttl_ms: int = 10_000


def parse_hostport(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what}: expected HOST:PORT, got {text!r}")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{what}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ConfigError(f"{what}: port {p} out of range")
    return host, p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_secret_file(path: str, what: str) -> str:
    """Read a secret from a file readable by its owner only. :raises ConfigError:"""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} {path} is readable by others (mode {oct(st.st_mode & 0o777)}): chmod 600 it")
    with open(path) as f:
        value = f.read().strip()
    if len(value) < 16:
        raise ConfigError(f"{what} {path} holds fewer than 16 characters")
    return value


def ensure_token(data_dir: str) -> str:
    """A node started without --token-file makes its own token (never an open API)."""
    path = os.path.join(data_dir, "token")
    if not os.path.exists(path):
        old = os.umask(0o077)
        try:
            with open(path, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        finally:
            os.umask(old)
        log.warning("no --token-file: generated an API token at %s", path)
    return read_secret_file(path, "token file")


#: gen0 threshold of the garbage collector: allocations between young collections. CPython's
#: default is 700; one 400-entry fire command allocates thousands of containers, and with the
#: default, young collections cost as much as planning the fire itself (scripts/profile_fire.py:
#: planning 23 -> 5 us a slot at 20 000). gen1/gen2 stay at their defaults, and CPython runs a
#: full collection only when a quarter of the long-lived objects are new. That is still too often
#: for a large state (a full walk of 1M jobs holds the GIL ~1.2 s): node/gcpause.py freezes the
#: long-lived state as it grows, not on a timer (a periodic gc.freeze, tried earlier, leaks any
#: cyclic garbage alive at each freeze, and the node runs for months).
GC_GEN0_THRESHOLD = 20_000


async def _poll_gc(gc_pauses: GcPauses) -> None:
    """Let ``GcPauses`` freeze the long-lived state when it asks to (node/gcpause.py)."""
    while True:
        try:
            gc_pauses.poll()
        except Exception:  # a bug here must not stop the node (run_node ends when a loop does)
            log.exception("gc poll failed")
        await asyncio.sleep(GC_POLL_S)


#: How often the node checks whether to freeze its long-lived objects (node/gcpause.py).
GC_POLL_S = 1.0


async def run_node(cfg: NodeConfig, clock: Clock | None = None, stop: asyncio.Event | None = None) -> None:
    clock = clock or clock_from_env()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    # The journal and dump hold job specs (env, headers): private to the node's user.
    os.umask(0o077)
    os.makedirs(cfg.data_dir, exist_ok=True)
    state = SchedulerState()  # no due index: the trigger attaches one while this node leads
    trigger_box: list[Trigger] = []

    def on_role_change(is_leader: bool) -> None:
        log.info("role: %s", "leader" if is_leader else "not leader")
        if trigger_box:
            trigger_box[0].on_role_change(is_leader)

    dial_map = None
    dial_env = os.environ.get("RAFTSCHED_DIAL_MAP")
    if dial_env:
        # Test-only: "peer=proxy,peer=proxy" makes this node dial its peers through TCP proxies
        # (the jepsen-style nemesis cuts links there).
        dial_map = dict(item.split("=", 1) for item in dial_env.split(",") if item)
    raft = replication.RaftNode(
        self_addr=cfg.raft_addr, peers=cfg.peers, data_dir=cfg.data_dir, secret=cfg.secret,
        state=state, on_role_change=on_role_change, dial_map=dial_map,
        conf_overrides=cfg.conf_overrides or None,
    )
    trigger = Trigger(state, raft, clock, cfg.node_id)
    trigger_box.append(trigger)
    worker = Worker(state, raft, clock, cfg.node_id, slots=cfg.worker_slots, queues=cfg.worker_queues,
                    allowed_types=cfg.executor_types, lease_ttl_ms=cfg.lease_ttl_ms,
                    execute_on_leader=cfg.execute_on_leader, single_node=not cfg.peers)
    service = Service(state, raft, clock, cfg.node_id)
    gc_pauses = GcPauses(lambda: state.jobs)
    metrics = NodeMetrics(state, raft, trigger, worker, gc_pauses)
    trigger.lag_observer = metrics.observe_fire_lags
    app = make_app(service, cfg.token, {"trigger": trigger, "worker": worker, "metrics": metrics})
    gc_pauses.install()
    try:
        await _serve(cfg, raft, loop, app, trigger, worker, stop, gc_pauses)
    finally:
        gc_pauses.uninstall()  # its callback holds the state: never left behind by a failed start


async def _serve(cfg: NodeConfig, raft, loop, app, trigger, worker, stop, gc_pauses: GcPauses) -> None:
    raft.start(loop)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.api_host, cfg.api_port, reuse_address=True)
    try:
        await site.start()
        log.info("node %s: api http://%s:%d raft %s peers %s data %s pid %d", cfg.node_id,
                 cfg.api_host, cfg.api_port, cfg.raft_addr, ",".join(cfg.peers) or "-", cfg.data_dir, os.getpid())
        tasks = {asyncio.create_task(trigger.run(), name="trigger"),
                 asyncio.create_task(_poll_gc(gc_pauses), name="gc")}
        if cfg.worker_slots > 0:
            tasks.add(asyncio.create_task(worker.run(), name="worker"))
        stop_task = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait(tasks | {stop_task}, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stop_task and not t.cancelled() and t.exception() is not None:
                log.error("%s loop failed: %r", t.get_name(), t.exception())
        for t in tasks | {stop_task}:
            t.cancel()
        await asyncio.gather(*tasks, stop_task, return_exceptions=True)
    finally:
        log.info("node %s: stopping", cfg.node_id)
        await runner.cleanup()
        raft.stop()
