"""One raftsched node: the replicated state, the Raft adapter, the trigger loop and the API,
wired together and run until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import logging
import os
import secrets
import signal
import ssl
from collections.abc import Awaitable

from aiohttp import web

from ..clock import Clock, ClusterClock, SystemClock
from ..core.model import EXECUTOR_TYPES
from ..core.state import SchedulerState
from .. import gcpolicy, replication, sealing
from ..config import ConfigError, read_secret_file
from . import announce, build, limits as node_limits
from ..worker import limits as worker_limits
from .api import AUDIT, make_app
from .backfills import BackfillStepper
from .fleet import Fleet
from .audit import AuditLog, install_log_redaction
from .auth import Auth, FailureLimiter
from .redact import Fingerprint
from .service import Service
from .trigger import Trigger
from .metrics import NodeMetrics
from .notify import Notifier
from ..worker.loop import Worker
from ..worker.sandbox import CODE_TYPES, RunUser, Sandbox, resolve_run_user

log = logging.getLogger("raftsched.node")


class LoopFailed(Exception):
    """One of the node's loops (trigger, worker, gc) ended with an error, or ended at all: the
    node stopped. ``loop`` names it; the cause is chained."""

    def __init__(self, loop: str, reason: str) -> None:
        super().__init__(f"the {loop} loop failed: {reason}")
        self.loop = loop


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
    #: this node joins a running cluster (``peers`` are its members): no vote until it is added
    #: (``raftsched members add``) and holds the log
    join: bool = False
    conf_overrides: dict = dataclasses.field(default_factory=dict)
    #: run slots of this node's worker (0: this node executes nothing)
    worker_slots: int = worker_limits.slots_default
    #: queues this node's worker serves (None: all)
    worker_queues: list[str] | None = None
    #: executor types this node runs
    executor_types: frozenset = frozenset(EXECUTOR_TYPES)
    execute_on_leader: bool = False
    lease_ttl_ms: int = node_limits.lease_ttl_ms_default
    #: this node's worker's labels (``--labels``): which placed jobs it may run (docs/workers.md)
    worker_labels: dict = dataclasses.field(default_factory=dict)
    # Test and benchmark hooks, set by hidden flags of ``raftsched node``: a production node
    # leaves them unset.
    #: peer Raft address -> the address to dial it at: the jepsen-style harness puts a TCP proxy
    #: on every link, where its nemesis cuts them (None: dial the peers themselves)
    dial_map: dict[str, str] | None = None
    #: a file whose integer content (ms) shifts this node's wall clock: the jepsen-style
    #: nemesis writes skews there (None: the system clock as it is)
    clock_offset_file: str | None = None
    #: a file to which the leading trigger appends a line per committed fire command, read by
    #: scripts/bench.py for fire lag (None: no fire log)
    fire_log_path: str | None = None
    #: seconds between the node's workers_seen reports (node/fleet.py; None: node/limits.py's):
    #: the hostile-input suite makes it long, so that its state hash moves only by its requests
    workers_seen_interval_s: float | None = None
    #: sync the journal, its meta and the dumps before acknowledging (``raftsched node
    #: --no-fsync`` turns it off: docs/operations.md, "Durability")
    fsync: bool = True
    #: test-only (``--simulate-power-loss``, refused unless RAFTSCHED_TEST_POWER_LOSS=1): write
    #: through replication.powerloss.ShadowDisk, which keeps what a power loss would leave, for
    #: the fault harness's ``power`` nemesis
    simulate_power_loss: bool = False
    # Security (docs/security.md).
    #: GET /metrics needs no token (a Prometheus that scrapes without one)
    metrics_open: bool = False
    #: registered workers up to which GET /metrics has series per worker (``--metrics-workers-max``)
    metrics_workers_max: int = node_limits.metrics_workers_max_default
    #: the API's TLS certificate chain and key (PEM files); None: plain HTTP
    tls_cert: str | None = None
    tls_key: str | None = None
    #: a CA (PEM) whose certificates clients must present: mutual TLS (None: no client certificate asked)
    tls_client_ca: str | None = None
    #: refused tokens one source may send in a burst, and get back a second (node/limits.py)
    auth_failures_burst: float = node_limits.auth_failures_burst
    auth_failures_per_s: float = node_limits.auth_failures_per_s
    #: the key ring secrets are sealed with (raftsched/sealing.py): ``<id>.key`` files, outside
    #: the data directory (None: none; the node then refuses writes that carry secrets)
    keys_dir: str | None = None
    #: who this node's shell and python runs execute as (``--run-as``, worker/sandbox.py), and
    #: with which names of its environment besides PATH, LANG and TZ (``--pass-env``), their
    #: directories made where (``--runs-dir``; None: the system's temporary directory). None: the
    #: default for this process, resolved at start (cli.py resolves it, and checks the files
    #: against it, before anything starts)
    run_user: RunUser | None = None
    pass_env: tuple = ()
    runs_dir: str | None = None
    #: per-run users (``--run-uids``, worker/sandbox.py): each run as a uid of its own of these;
    #: None: every run as ``run_user``
    run_uids: range | None = None


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


def tls_context(cfg: NodeConfig) -> ssl.SSLContext | None:
    """The API's server TLS context, or None for plain HTTP. TLS 1.2 at least; with
    ``tls_client_ca``, a client must present a certificate that CA signed.

    :raises ConfigError: a file that cannot be read, a key that does not match its certificate."""
    if not cfg.tls_cert and not cfg.tls_key and not cfg.tls_client_ca:
        return None
    if not cfg.tls_cert or not cfg.tls_key:
        raise ConfigError("--tls-cert and --tls-key go together (and --tls-client-ca needs both)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        if cfg.tls_client_ca:
            ctx.load_verify_locations(cfg.tls_client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS: {e}") from None
    return ctx


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


async def _supervised(name: str, loop: Awaitable) -> None:
    """Run one of the node's loops, which run until cancelled: an error, or an end, is a
    failure of the node. Logs which loop failed and why, and raises :class:`LoopFailed`."""
    try:
        await loop
    except Exception as e:
        log.error("%s loop failed: %r; stopping the node", name, e, exc_info=True)
        raise LoopFailed(name, repr(e)) from e
    log.error("%s loop ended; stopping the node", name)
    raise LoopFailed(name, "it returned")


async def run_node(cfg: NodeConfig, clock: Clock | None = None, stop: asyncio.Event | None = None) -> None:
    """Run one node until ``stop`` is set (SIGTERM and SIGINT set it), then stop it cleanly.

    :raises LoopFailed: a loop of the node failed; every other loop was stopped with it, and
        the failure was logged with its traceback.
    :raises OSError: the API port could not be bound.
    """
    # The node's own clock (its wall clock is measured against the others' by the replication
    # layer) and the cluster's, which everything else stamps and judges by.
    local = clock or SystemClock(cfg.clock_offset_file)
    gcpolicy.set_young_threshold(node_limits.gc_gen0_threshold)
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
    # Secrets at rest: read (and refused if others may read it) before anything starts.
    keyring = sealing.KeyRing.load(cfg.keys_dir) if cfg.keys_dir else sealing.KeyRing()
    if not keyring.ids():
        log.warning("no key in the key ring %s: this node refuses writes that carry secrets, and fails the runs "
                    "that need them (docs/operations.md, \"Key files\")", cfg.keys_dir or "(no --keys-dir)")
    unseal = functools.partial(sealing.unseal_grant, ring=keyring, where=f"node {cfg.node_id}")
    state = SchedulerState()  # no due index: the trigger attaches one while this node leads
    # Another node's acquire builds no grants here (core/leases.py apply_acquire): the node's
    # dispatcher and embedded worker write the same name into theirs (Fleet, Worker).
    state.answers_for = cfg.node_id
    trigger_box: list[Trigger] = []

    def on_role_change(is_leader: bool) -> None:
        log.info("role: %s", "leader" if is_leader else "not leader")
        if trigger_box:
            trigger_box[0].on_role_change(is_leader)

    disk = None
    if cfg.simulate_power_loss:
        from ..replication.powerloss import ShadowDisk
        disk = ShadowDisk(cfg.data_dir, fsync=cfg.fsync)
        log.warning("simulating power loss (test-only): the data dir keeps a durable shadow")
    if not cfg.fsync:
        log.warning("fsync is off: a power loss or a kernel crash of a majority can lose "
                    "acknowledged writes and repeat fencing tokens (docs/operations.md)")
    raft = replication.RaftNode(
        self_addr=cfg.raft_addr, peers=cfg.peers, data_dir=cfg.data_dir, secret=cfg.secret,
        state=state, on_role_change=on_role_change, dial_map=cfg.dial_map or None,
        conf_overrides=cfg.conf_overrides or None, wall_ms=local.now_ms, fsync=cfg.fsync, disk=disk,
        join=cfg.join, name=cfg.node_id,
    )
    clock = ClusterClock(local, raft.cluster_ms)
    trigger = Trigger(raft, clock, cfg.node_id, fire_log_path=cfg.fire_log_path)
    trigger.leader_tasks.append(BackfillStepper(raft, clock).run_while_leading)
    notifier = Notifier(raft, clock, keyring, trigger.proposer)  # delivery while leading (node/notify.py)
    trigger.leader_tasks.append(notifier.run_while_leading)
    trigger_box.append(trigger)
    sandbox = None
    if cfg.worker_slots > 0 and cfg.executor_types & CODE_TYPES:
        sandbox = Sandbox(cfg.run_user or resolve_run_user(None), pass_env=tuple(cfg.pass_env), name=cfg.node_id,
                          runs_parent=cfg.runs_dir, run_uids=cfg.run_uids)
    worker = Worker(raft, clock, cfg.node_id, sandbox=sandbox, slots=cfg.worker_slots, queues=cfg.worker_queues,
                    allowed_types=cfg.executor_types, lease_ttl_ms=cfg.lease_ttl_ms,
                    execute_on_leader=cfg.execute_on_leader,
                    labels=cfg.worker_labels, unseal=unseal)
    service = Service(raft, clock, cfg.node_id, fingerprint=Fingerprint.from_cluster_secret(cfg.secret),
                      keyring=keyring)
    fleet = Fleet(raft, clock, cfg.node_id, embedded_id=worker.worker_id if cfg.worker_slots > 0 else None,
                  seen_interval_s=cfg.workers_seen_interval_s, unseal=unseal,
                  metrics_workers_max=cfg.metrics_workers_max)
    # One set of the keys this node found missing, its embedded worker's and the fleet's: the
    # condition, the metric and the workers sent elsewhere say the same.
    worker.channel.keys_missing = fleet.keys_missing
    gc_pauses = gcpolicy.GcPauses(lambda: state.jobs, freeze_pause_s=node_limits.gc_freeze_pause_s,
                                  freeze_growth_records=node_limits.gc_freeze_growth_records,
                                  runs=lambda: len(state.runs), written=lambda: state.gen,
                                  log_pause_s=node_limits.gc_log_pause_s)
    metrics = NodeMetrics(raft, trigger, worker, gc_pauses)
    metrics.registry.register(fleet.collector())
    metrics.registry.register(notifier.collector())
    audit = AuditLog(os.path.join(cfg.data_dir, "audit.jsonl"), cfg.node_id)
    metrics.registry.register(audit.collector())
    trigger.lag_observer = metrics.observe_fire_lags
    auth = Auth(cfg.token, raft.read, clock, metrics_open=cfg.metrics_open,
                limiter=FailureLimiter(cfg.auth_failures_burst, cfg.auth_failures_per_s))
    install_log_redaction()  # aiohttp's parser errors quote the request: never a token in the log
    app = make_app(service, cfg.token, trigger=trigger, worker=worker, metrics=metrics, fleet=fleet,
                   auth=auth, audit=audit)
    gc_pauses.install()
    try:
        await _serve(cfg, raft, loop, app, trigger, worker, stop, gc_pauses, fleet)
    finally:
        gc_pauses.uninstall()  # its callback holds the state: never left behind by a failed start
        audit.close(clock.now_ms())


def api_runner(app: web.Application) -> web.AppRunner:
    """The runner that serves the API. Its cleanup (a graceful stop) answers nothing new and
    gives the requests in flight node_limits.api_stop_grace_s, then cancels them: aiohttp's
    default waited 60 s for them, so a client that sent part of a body and kept its connection
    open held the stop until the supervisor killed the node (no dump written)."""
    return web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=node_limits.api_stop_grace_s)


async def _serve(cfg: NodeConfig, raft, loop, app, trigger, worker, stop, gc_pauses: gcpolicy.GcPauses,
                 fleet: Fleet) -> None:
    ssl_ctx = tls_context(cfg)
    raft.start(loop)
    runner = api_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, cfg.api_host, cfg.api_port, reuse_address=True, ssl_context=ssl_ctx)
    try:
        await site.start()
        log.info("node %s: api %s://%s:%d%s raft %s peers %s data %s pid %d code %s %s", cfg.node_id,
                 "https" if ssl_ctx else "http", cfg.api_host, cfg.api_port,
                 " (client certificates required)" if cfg.tls_client_ca else "",
                 cfg.raft_addr, ",".join(cfg.peers) or "-", cfg.data_dir, os.getpid(),
                 build.code()["version"], build.code()["digest"])
        loops = {"trigger": trigger.run(), "gc": gcpolicy.poll_forever(gc_pauses, node_limits.gc_poll_s), "fleet": fleet.run(),
                 "audit": app[AUDIT].run(trigger.clock)}
        url = announce.api_url(cfg.api_host, cfg.api_port, ssl_ctx is not None)
        if url is not None:  # where this node's API is, for GET /v1/cluster on the others
            loops["announce"] = announce.announce_loop(raft, trigger.clock, cfg.raft_addr, url)
        if cfg.worker_slots > 0:
            loops["worker"] = worker.run()
        # One task group: a loop that fails cancels the others and the wait for ``stop``, and
        # its error leaves run_node (trio's "exceptions always propagate"), so the process
        # exits non-zero rather than looking like a clean stop to its supervisor.
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(_supervised(name, coro), name=name) for name, coro in loops.items()]
                await stop.wait()
                for t in tasks:
                    t.cancel()
        except BaseExceptionGroup as eg:
            failed = [e for e in eg.exceptions if isinstance(e, LoopFailed)]
            if len(failed) == len(eg.exceptions):
                raise failed[0] from failed[0].__cause__
            raise
    finally:
        log.info("node %s: stopping", cfg.node_id)
        if stop.is_set():
            # A leader hands over first, while its API still answers (a write in flight is
            # forwarded to the new leader): a stop is then not an election timeout of 503s.
            try:
                await raft.hand_over(node_limits.hand_over_on_stop_s)
            except Exception:  # (never at the cost of the stop: the API, the dump and Raft below)
                log.exception("node %s: the hand-over of its leadership failed; stopping all the same", cfg.node_id)
        await runner.cleanup()
        # A dump of what this node applied, its journal trimmed to it: it restarts without
        # replaying the journal, and the nodes of a cluster stopped together each hold a dump
        # of what they applied (docs/operations.md, Upgrading). Not when a loop failed: the
        # state may be what failed.
        if stop.is_set():
            await asyncio.to_thread(raft.dump_before_stop, node_limits.dump_on_stop_timeout_s)
        raft.stop()
