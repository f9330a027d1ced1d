"""The ``raftsched`` command: ``raftsched node ...`` starts a node, ``raftsched worker ...`` a
worker (raftsched/worker/remote.py); the other subcommands are a thin client of the admin API
(see docs/api.md). The server (node/node.py, and with it the API and the trigger) is imported by
``raftsched node`` only, and ``raftsched worker`` imports no node module at all
(tests/test_worker_imports.py)."""
from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import json
import logging
import math
import os
import re
import shlex
import ssl
import sys
import time
import uuid
from typing import Callable, NoReturn

from . import backfill_cli, cli_cluster, lock_cli
from .backfill_cli import UsageError, json_arg, read_text
from .cli_output import FORMATS, Progress, output_format, print_error, set_format, show
from .cli_target import Target, resolve
from .client import Client
from .client.core import BATCH_TIMEOUT_S, DEADLINE_S_DEFAULT
from .client.endpoints import PREVIEW_COUNT_DEFAULT, job_batches
from .config import ConfigError, check_token, read_secret_file
from .core import limits
from .core.bodies import json_loads
from .core.errors import BadRequest, RaftschedError, Unavailable
from .core.model import EXECUTOR_TYPES, RUN_STATES
from .core.tokens import ROLES
from .worker import limits as worker_limits


class _LogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d} {record.levelname.lower()} {record.name}: {record.getMessage()}"
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


def _setup_logging(level: str, h: logging.Handler | None = None) -> logging.Handler:
    h = h or logging.StreamHandler(sys.stderr)
    h.setFormatter(_LogFormatter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[h])
    return h


def _tls_client_args(p: argparse.ArgumentParser, whose: str) -> None:
    """--ca-file, --client-cert and --client-key, for a command that calls the API over HTTPS."""
    p.add_argument("--ca-file", default=os.environ.get("RAFTSCHED_CA_FILE", ""),
                   help="https: the CA (PEM) the nodes' certificates chain to (default $RAFTSCHED_CA_FILE, "
                        "else the system's)")
    p.add_argument("--client-cert", default=os.environ.get("RAFTSCHED_CLIENT_CERT", ""),
                   help=f"mutual TLS: {whose} certificate (PEM; default $RAFTSCHED_CLIENT_CERT)")
    p.add_argument("--client-key", default=os.environ.get("RAFTSCHED_CLIENT_KEY", ""),
                   help="the key of --client-cert, when not in it (default $RAFTSCHED_CLIENT_KEY)")


def _target_args(p: argparse.ArgumentParser, whose: str) -> None:
    """--url, --context, --token, --token-file, -v and the TLS files: how a command that calls
    the API finds the nodes and its token (cli_target.py; docs/api.md, "The command line")."""
    p.add_argument("--url", default="",
                   help="the API of one node, or of several, comma-separated (tried in turn; default: "
                        "$RAFTSCHED_URL, else the config file's context, else the cluster recorded in .raftsched/)")
    p.add_argument("--context", help="the context of ~/.config/raftsched/config.toml to use (default: "
                                     "$RAFTSCHED_CONTEXT, else its current-context)")
    p.add_argument("--token", help="the API token (visible to other users in ps: prefer --token-file)")
    p.add_argument("--token-file", help="a file holding the API token (without it and --token: the token in "
                                        "$RAFTSCHED_TOKEN, else the context's token_file, else the recorded "
                                        "cluster's .raftsched/token)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say on stderr which nodes, token and CA are used, and where each came from")
    _tls_client_args(p, whose)


def parse_dial_map(text: str) -> dict[str, str] | None:
    """``--dial-map PEER=ADDR,PEER=ADDR`` (a test hook): dial each named peer's Raft address at
    another address, a TCP proxy of the jepsen-style harness. :raises ConfigError:"""
    from .node.node import parse_hostport
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        peer, sep, addr = item.partition("=")
        if not sep:
            raise ConfigError(f"--dial-map: expected PEER=HOST:PORT, got {item!r}")
        parse_hostport(peer, "--dial-map")
        parse_hostport(addr, "--dial-map")
    return dict(item.split("=", 1) for item in items) or None


def parse_labels(text: str, what: str = "--labels") -> dict[str, str]:
    """``--labels k=v,k=v`` (docs/workers.md): a worker's labels. :raises ConfigError:"""
    from .core.errors import InvalidSpec
    from .core.workers import check_labels
    out = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"{what}: expected NAME=VALUE, got {item!r}")
        if k.strip() in out:
            raise ConfigError(f"{what}: label {k.strip()!r} given twice")
        out[k.strip()] = v.strip()
    try:
        return check_labels(out, what)
    except InvalidSpec as e:
        raise ConfigError(f"{e.field}: {e.message}") from None


def _run_uids(args, slots: int, claim: bool = False) -> range | None:
    """``--run-uids LO-HI``: each shell and python run as a uid of its own (worker/sandbox.py);
    None without it. With ``claim``, the range is this process's on this host from now on
    (sandbox.claim_run_uids). :raises ConfigError:"""
    if not args.run_uids:
        return None
    from .worker.sandbox import claim_run_uids, parse_run_uids
    if args.run_as:
        raise ConfigError("--run-uids: not with --run-as: each run is a user of its own")
    uids = parse_run_uids(args.run_uids, slots)
    if claim:
        claim_run_uids(uids)
    return uids


def _run_user(args, types: frozenset):
    """``--run-as``, ``--allow-root-jobs``, ``--pass-env``: who a worker's shell and python runs
    execute as (None when it runs neither), and which names of its environment they get besides
    PATH, LANG and TZ (worker/sandbox.py). :raises ConfigError:"""
    from .worker.sandbox import CODE_TYPES, check_pass_env, pool_user, resolve_run_user
    pass_env = check_pass_env([n.strip() for n in args.pass_env.split(",") if n.strip()])
    if not types & CODE_TYPES:
        return None, pass_env
    uids = _run_uids(args, args.slots)
    if uids is not None:
        return pool_user(uids), pass_env  # (the files' checks: no run's uid may own them)
    return resolve_run_user(args.run_as or None, args.allow_root_jobs), pass_env


def _runs_dir(args, data_dir: str | None) -> str | None:
    """``--runs-dir``: an existing directory, outside the data directory. :raises ConfigError:"""
    if not args.runs_dir:
        return None
    path = os.path.realpath(args.runs_dir)
    if not os.path.isdir(path):
        raise ConfigError(f"--runs-dir {args.runs_dir}: not a directory")
    if data_dir is not None:
        data = os.path.realpath(data_dir)
        if path == data or path.startswith(data + os.sep):
            raise ConfigError(f"--runs-dir {args.runs_dir} is inside the data directory: runs must not reach it")
    return path


def _isolation_args(p: argparse.ArgumentParser, who: str) -> None:
    """--run-as, --run-uids, --allow-root-jobs, --pass-env and --runs-dir: where a worker's shell
    and python runs execute (worker/sandbox.py, docs/security.md)."""
    p.add_argument("--run-as", default="", metavar="USER",
                   help=f"the user {who}'s shell and python runs execute as (default: as root, the system user "
                        "raftsched-run if it exists, else nobody; otherwise this process's own user)")
    p.add_argument("--run-uids", default="", metavar="LO-HI",
                   help=f"as root: each of {who}'s shell and python runs as a uid of its own from LO to HI (ids no "
                        "user or group has, at least one a slot; not shared with another worker), its processes "
                        "killed when it ends; instead of --run-as")
    p.add_argument("--allow-root-jobs", action="store_true",
                   help="allow --run-as root: without it, shell and python jobs never run as root")
    p.add_argument("--pass-env", default="", metavar="NAME,...",
                   help="names of this process's environment variables runs get besides PATH, LANG and TZ")
    p.add_argument("--runs-dir", default="", metavar="DIR",
                   help="where each run's working directory is made (default: the system's temporary directory)")


def cmd_node(args) -> int:
    from .node import limits as node_limits
    from .node.logs import RepeatLimiter, log_file_handler
    from .node.node import LoopFailed, NodeConfig, ensure_token, is_loopback, parse_hostport, run_node, tls_context
    from .worker.sandbox import check_private
    from .replication.powerloss import ENV_VAR as POWER_LOSS_ENV

    try:  # node/logs.py: rotated when written to a file, and at most so many lines of a kind a minute
        _setup_logging(args.log_level, log_file_handler(args.log_file) if args.log_file else None) \
            .addFilter(RepeatLimiter())
    except OSError as e:
        print(f"raftsched node: --log-file: {e}", file=sys.stderr)
        return 2
    # Their defaults are the node's limits, read here: building the parser imports no node module.
    if args.auth_failures_burst is None:
        args.auth_failures_burst = node_limits.auth_failures_burst
    if args.auth_failures_per_s is None:
        args.auth_failures_per_s = node_limits.auth_failures_per_s
    if args.metrics_workers_max is None:
        args.metrics_workers_max = node_limits.metrics_workers_max_default
    try:
        api_host, api_port = parse_hostport(args.api, "--api")
        raft_host, raft_port = parse_hostport(args.raft, "--raft")
        peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
        for p in peers:
            parse_hostport(p, "--peers")
        if f"{raft_host}:{raft_port}" in peers:
            raise ConfigError("--peers must not contain this node's own --raft address")
        if args.join and not peers:
            raise ConfigError("--join needs --peers: the Raft addresses of the running cluster's members")
        if not args.cluster_secret_file:
            raise ConfigError("--cluster-secret-file is required: the Raft port speaks pickle, and the secret "
                              "authenticates every message before it is unpickled")
        secret = read_secret_file(args.cluster_secret_file, "cluster secret file")
        if not is_loopback(raft_host) and not args.allow_remote_raft:
            raise ConfigError(f"--raft {args.raft} is not a loopback address; pass --allow-remote-raft to bind it "
                              "(the cluster secret protects it; see docs/operations.md)")
        os.makedirs(args.data_dir, mode=0o700, exist_ok=True)
        from .replication import data_dir_refusal  # (RaftNode.start checks it again, and claims it)
        why = data_dir_refusal(args.data_dir, args.id)
        if why is not None:  # before anything (a generated token) is written there
            print(f"raftsched node: {why}", file=sys.stderr)
            return 1
        token = (check_token(read_secret_file(args.token_file, "token file"), f"--token-file {args.token_file}")
                 if args.token_file else ensure_token(args.data_dir))
        # Beside the cluster secret by default, never in the data directory (docs/operations.md).
        keys_dir = args.keys_dir or os.path.join(os.path.dirname(os.path.abspath(args.cluster_secret_file)), "keys")
        data = os.path.realpath(args.data_dir)
        if os.path.commonpath([data, os.path.realpath(keys_dir)]) == data:
            raise ConfigError(f"--keys-dir {keys_dir} is inside --data-dir: a copy of the data would carry its key")
        from .sealing import KeyRing
        KeyRing.load(keys_dir)  # a key file others may read, or a bad one: refused before anything starts
    except ConfigError as e:
        print(f"raftsched node: {e}", file=sys.stderr)
        return 2
    types = frozenset(t.strip() for t in args.executors.split(",") if t.strip())
    bad = types - set(EXECUTOR_TYPES)
    if bad:
        print(f"raftsched node: --executors: unknown type(s) {', '.join(sorted(bad))}; choose from {', '.join(EXECUTOR_TYPES)}", file=sys.stderr)
        return 2
    if not 0 <= args.slots <= limits.worker_slots_max:
        print(f"raftsched node: --slots must be 0..{limits.worker_slots_max}", file=sys.stderr)
        return 2
    ttl_ms = int(args.lease_ttl_s * 1000)
    if not limits.lease_ttl_ms_min <= ttl_ms <= limits.lease_ttl_ms_max:
        print(f"raftsched node: --lease-ttl-s must be {limits.lease_ttl_ms_min / 1000}..{limits.lease_ttl_ms_max / 1000}", file=sys.stderr)
        return 2
    if not 0 <= args.metrics_workers_max <= 1_000_000:
        print("raftsched node: --metrics-workers-max must be 0..1000000", file=sys.stderr)
        return 2
    if args.workers_seen_interval_s is not None and not 0 < args.workers_seen_interval_s <= 86_400:
        print("raftsched node: --workers-seen-interval-s must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    try:
        run_user, pass_env = _run_user(args, types if args.slots > 0 else frozenset())
        run_uids = _run_uids(args, args.slots, claim=True)
        # Nothing a job's code could read may hold the keys to the cluster (docs/security.md).
        check_private(args.cluster_secret_file, "cluster secret file", run_user)
        check_private(args.token_file or os.path.join(args.data_dir, "token"), "token file", run_user)
        if args.tls_key:
            check_private(args.tls_key, "TLS key file", run_user)
        check_private(args.data_dir, "data directory", run_user)
        runs_dir = _runs_dir(args, args.data_dir)
        dial_map = parse_dial_map(args.dial_map)
        labels = parse_labels(args.labels)
        if queues:
            # The worker registers them (core/workers.py): a name the registry refuses would
            # leave this node's worker unregistered.
            from .core.errors import InvalidSpec
            from .core.workers import check_queues
            try:
                check_queues(queues, "--queues")
            except InvalidSpec as e:
                raise ConfigError(f"{e.field}: {e.message}") from None
    except ConfigError as e:
        print(f"raftsched node: {e}", file=sys.stderr)
        return 2
    if args.simulate_power_loss and os.environ.get(POWER_LOSS_ENV) != "1":
        print(f"raftsched node: --simulate-power-loss is a test hook; it is refused unless "
              f"{POWER_LOSS_ENV}=1 is set", file=sys.stderr)
        return 2
    cfg = NodeConfig(
        node_id=args.id, api_host=api_host, api_port=api_port, raft_addr=f"{raft_host}:{raft_port}",
        peers=peers, data_dir=args.data_dir, secret=secret, token=token, join=args.join,
        worker_slots=args.slots, worker_queues=queues, executor_types=types,
        execute_on_leader=args.execute_on_leader, lease_ttl_ms=ttl_ms, worker_labels=labels,
        dial_map=dial_map, clock_offset_file=args.clock_offset_file or None,
        fire_log_path=args.fire_log or None, workers_seen_interval_s=args.workers_seen_interval_s,
        metrics_open=args.metrics_open, metrics_workers_max=args.metrics_workers_max,
        tls_cert=args.tls_cert or None, tls_key=args.tls_key or None,
        tls_client_ca=args.tls_client_ca or None,
        auth_failures_burst=args.auth_failures_burst, auth_failures_per_s=args.auth_failures_per_s,
        keys_dir=keys_dir,
        run_user=run_user, pass_env=pass_env, runs_dir=runs_dir, run_uids=run_uids,
        fsync=args.fsync, simulate_power_loss=args.simulate_power_loss,
    )
    try:
        tls_context(cfg)  # refuse a bad certificate or key before anything starts
        if args.auth_failures_burst < 1 or args.auth_failures_per_s <= 0:
            raise ConfigError("--auth-failures-burst must be at least 1 and --auth-failures-per-s above 0")
    except ConfigError as e:
        print(f"raftsched node: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run_node(cfg))
    except LoopFailed as e:
        # Logged with its traceback already; a supervisor sees a failure, not a clean stop.
        print(f"raftsched node: {e}; stopped", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as e:
        # A port in use, or the data directory locked by another node or claimed by another one.
        print(f"raftsched node: {e}", file=sys.stderr)
        return 1
    return 0


def _new_key(args) -> int:
    from .sealing import new_key_file
    try:
        kid, path = new_key_file(args.keys_dir, args.id)
    except (ConfigError, OSError) as e:
        print(f"raftsched secrets new-key: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"key": kid, "file": path}))
    return 0


# ---------------------------------------------------------------------------- worker
def _worker_app(args, labels: dict):
    """``raftsched worker --app MODULE:ATTR [--isolation ...]``: import the App, add its label to
    ``labels``, and return the lease loop's executor lookup for it (sdk/worker.py); None without
    ``--app``. :raises ConfigError: the App cannot be loaded, or a flag does not go with it."""
    if not args.app:
        if args.isolation is not None:
            raise ConfigError("--isolation is for --app: how the app's plain handlers run")
        return None
    from .sdk import APP_LABEL, DeclarationError, load_app
    from .sdk.loader import AppLoadError
    from .sdk.worker import AppExecutors
    if args.executors is not None and args.executors.strip() != "python":
        raise ConfigError("--app runs the app's python handlers and nothing else: leave --executors out")
    for flag, given in (("--run-as", args.run_as), ("--run-uids", args.run_uids)):
        if given:
            # They were taken and ignored: the handlers ran as the worker's user (root, say).
            raise ConfigError(f"{flag} is not for --app: the app's handlers run in this process, or a child of it "
                              "(--isolation subprocess), as the user that starts the worker; start it as the user "
                              "they should run as")
    if os.geteuid() == 0 and not args.allow_root_jobs:
        # As a worker of built-in executors refuses to run jobs as root without it: the app's
        # module is imported, and its handlers run, as this process's user.
        raise ConfigError("--app as root would import the app and run its handlers as root: start the worker as the "
                          "user they should run as (the systemd example's User=), or say --allow-root-jobs")
    try:
        app = load_app(args.app)
    except (AppLoadError, DeclarationError) as e:
        raise ConfigError(f"--app {args.app}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the app's own import failed: one line, not a traceback
        from .sdk.sync import import_error
        raise ConfigError(f"--app {args.app}: cannot import it: {import_error(e)}") from None
    if labels.get(APP_LABEL, app.name) != app.name:
        raise ConfigError(f"--labels: {APP_LABEL} is the app's name ({app.name}) with --app")
    labels[APP_LABEL] = app.name
    from .core.errors import InvalidSpec
    from .core.workers import check_labels
    try:
        check_labels(labels, "--labels")
    except InvalidSpec as e:
        raise ConfigError(f"--app {args.app}: the app's name is not a worker label value ({e.message})") from None
    return AppExecutors(app, args.app, isolation=args.isolation or "thread")


def _chosen_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser ``argv`` names, the deepest: ``runs``'s for ``runs NAME --bogus``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for i, tok in enumerate(argv):
                if tok in action.choices:
                    return _chosen_parser(action.choices[tok], argv[i + 1:])
    return parser


def _graph(args, client) -> int:
    """``raftsched graph NAME``: one line an edge, ``parent -> child (on)``, the job's own marked."""
    g = client.graph(args.name)
    if args.json:
        print(json.dumps(g, indent=2))
        return 0
    if output_format() != "table":  # -o json|yaml, or a pipe: the answer, as every command's
        return show(g)
    kinds = {n["job"]: n["kind"] for n in g["nodes"]}
    hidden = g.get("not_shown")
    print(f"{g['job']} ({kinds.get(g['job'])}): {len(g['parents'])} upstream, {len(g['children'])} downstream"
          + (f" ({hidden} job(s) of its graph not shown: other tenants' jobs, and what is reached only through them)"
             if hidden else ""))
    def mark(j: str) -> str:
        # (a parent that does not exist, deleted or not made yet, says so: a walk read a deleted
        # parent's edge as a live one)
        return (f"[{j}]" if j == g["job"] else j) + (" (missing: no such job)" if kinds.get(j) == "missing" else "")
    for e in g["edges"]:
        print(f"  {mark(e['from'])} -> {mark(e['to'])}  (on {e['on']}; {e['to']} is {kinds.get(e['to'])})")
    return 0


def cmd_worker(args) -> int:
    """``raftsched worker``: a worker process outside the Raft quorum (worker/remote.py)."""
    from .core.errors import InvalidSpec
    from .core.workers import check_queues, check_worker_id
    from .worker.remote import WorkerConfig, default_worker_id, run_worker
    from .worker.sandbox import check_private

    _setup_logging(args.log_level)
    try:
        # The nodes and the token are found as every client subcommand finds them (cli_target.py).
        target = _target(args)
        urls, token = target.urls, target.token
        wid = args.id or default_worker_id()
        queues = [q.strip() for q in args.queues.split(",") if q.strip()] or None
        try:
            check_worker_id(wid, "--id")
            queues = check_queues(queues, "--queues")
        except InvalidSpec as e:
            raise ConfigError(f"{e.field}: {e.message}") from None
        labels = parse_labels(args.labels)
        app_executors = _worker_app(args, labels)
    except ConfigError as e:
        print(f"raftsched worker: {e}", file=sys.stderr)
        return 2
    executors = args.executors if args.executors is not None else ",".join(EXECUTOR_TYPES)
    if app_executors is not None:
        executors = "python"  # the app's handlers, and nothing else
    types = frozenset(t.strip() for t in executors.split(",") if t.strip())
    bad = types - set(EXECUTOR_TYPES)
    if bad or not types:
        print(f"raftsched worker: --executors: unknown type(s) {', '.join(sorted(bad)) or '(none given)'}; "
              f"choose from {', '.join(EXECUTOR_TYPES)}", file=sys.stderr)
        return 2
    if not 1 <= args.slots <= limits.worker_slots_max:
        print(f"raftsched worker: --slots must be 1..{limits.worker_slots_max}", file=sys.stderr)
        return 2
    ttl_ms = int(args.lease_ttl_s * 1000)
    if not limits.lease_ttl_ms_min <= ttl_ms <= limits.lease_ttl_ms_max:
        print(f"raftsched worker: --lease-ttl-s must be {limits.lease_ttl_ms_min / 1000}..{limits.lease_ttl_ms_max / 1000}",
              file=sys.stderr)
        return 2
    if not 0 <= args.wait_s <= worker_limits.lease_wait_s_max:
        print(f"raftsched worker: --wait-s must be 0..{worker_limits.lease_wait_s_max:g}", file=sys.stderr)
        return 2
    if not 0 <= args.drain_s <= 24 * 3600:
        print("raftsched worker: --drain-s must be 0..86400", file=sys.stderr)
        return 2
    try:
        # An --app worker runs its app's handlers, its own code, in its own process.
        run_user, pass_env = _run_user(args, frozenset() if app_executors is not None else types)
        run_uids = _run_uids(args, args.slots, claim=True)
        if target.token_file:
            check_private(target.token_file, "token file", run_user)
        runs_dir = _runs_dir(args, None)
    except ConfigError as e:
        print(f"raftsched worker: {e}", file=sys.stderr)
        return 2
    cfg = WorkerConfig(urls=urls, token=token, worker_id=wid, queues=queues, labels=labels, slots=args.slots,
                       executors=types, drain_s=args.drain_s, lease_ttl_ms=ttl_ms, wait_s=args.wait_s,
                       ca_file=target.ca_file, cert_file=target.client_cert,
                       key_file=target.client_key, run_user=run_user, pass_env=pass_env, runs_dir=runs_dir,
                       run_uids=run_uids)
    if app_executors is not None:
        from .sdk import APP_LABEL
        cfg.executor_lookup = app_executors
        cfg.dedicated = [APP_LABEL]
        cfg.describe = app_executors.describe()
        cfg.targets = app_executors.targets()
        if cfg.targets is None and app_executors.app.jobs:
            logging.getLogger("raftsched.sdk.worker").warning(
                "app %r has more than %d handlers, or one whose target is longer than %d characters: this worker "
                "does not say which it has, and takes any run of the app (one of a job this version does not "
                "declare fails on it)", app_executors.app.name, limits.worker_targets_max,
                limits.worker_target_chars_max)
        for name in app_executors.unplaced():
            logging.getLogger("raftsched.sdk.worker").warning(
                "job %r is declared with placement=None: this worker never takes its runs (other workers may)", name)
    try:
        return asyncio.run(run_worker(cfg))
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------------- client
#: Runs ``raftsched runs`` shows unless told otherwise: a screenful (the API's page is longer).
RUNS_SHOWN_DEFAULT = 20
#: How long ``raftsched members add`` waits for the new node to become a voter, and how often
#: it looks (a node catching up a large snapshot can take a while: docs/operations.md).
MEMBER_WAIT_S_DEFAULT = 120.0
MEMBER_POLL_S = 0.5


def _target(a) -> Target:
    """The nodes, token and TLS files of a client subcommand or a worker (cli_target.py: flags,
    environment, a config file's context, the recorded cluster); ``-v`` says which on stderr.
    :raises ConfigError: none found (saying where it looked), or a file that cannot be used."""
    token = getattr(a, "token", None)
    if token:
        print("raftsched: warning: --token shows the token to every user of this machine (ps, /proc); "
              "use --token-file or RAFTSCHED_TOKEN", file=sys.stderr)
    t = resolve(url=a.url, context=getattr(a, "context", None), token=token, token_file=a.token_file,
                ca_file=a.ca_file, client_cert=a.client_cert, client_key=a.client_key,
                env=dict(os.environ), cwd=os.getcwd(), home=os.path.expanduser("~"))
    if getattr(a, "verbose", False):  # (the description ends with the notes)
        print("raftsched: " + t.describe().replace("\n", "\nraftsched: "), file=sys.stderr)
    else:
        for note in t.notes:
            print(f"raftsched: {note}", file=sys.stderr)
    return t


def _slot_arg(text: str | None) -> str | int | None:
    """A ``--slot``: ms since the epoch when it is digits only (a run id's ``NAME@MS``), else the
    ISO time as given (the node says what is wrong with it)."""
    return int(text) if text is not None and text.isascii() and text.isdigit() else text


def _time_arg(text: str | None, flag: str) -> str | None:
    """A time flag of a query that takes ISO-8601 times (``runs --slot/--since/--until``): the
    ISO time as given (the node says what is wrong with it), or, when it is digits only, ms
    since the epoch as in a run id (``NAME@MS``), sent as the ISO time it is.
    :raises UsageError: ms out of the API's range."""
    if text is None or not (text.isascii() and text.isdigit()):
        return text
    from .core.schedule import iso
    ms = int(text)
    if ms > limits.time_ms_max:
        raise UsageError(f"{flag}: {text} ms since the epoch is after {iso(limits.time_ms_max)}, the latest "
                          "time the API takes")
    return iso(ms)


def _trigger(a, c: Client) -> int:
    """``raftsched trigger NAME [--slot T [--rerun [--downstream]]] [--payload JSON|@FILE]
    [--propagate]``: POST /v1/jobs/NAME/trigger, with a body only when a flag asks for one (a
    heartbeat job's trigger without a body opens a slot that waits for its ping). The answer's
    warnings go to stderr too (a slot whose run ended runs nothing without --rerun)."""
    kw = {} if a.payload is None else {"payload": json_arg(a.payload, "--payload")}
    if (a.rerun or a.downstream) and a.slot is None:
        raise UsageError("--rerun needs --slot: the slot to run again")
    if a.downstream and not a.rerun:
        raise UsageError("--downstream needs --rerun: the jobs after it run again after the slot runs again")
    if a.rerun:
        kw["rerun"] = True
    if a.downstream:
        kw["downstream"] = True
    res = c.trigger(a.name, slot=_time_arg(a.slot, "--slot"), propagate=a.propagate, **kw)
    for w in res.get("warnings") or () if isinstance(res, dict) else ():
        print(f"warning: {w}", file=sys.stderr)
    return show(res)


def _member_remove(a, c: Client) -> int:
    """``raftsched members remove HOST:PORT``: the answer, and its warning (a name no member or
    learner has: nothing was removed) on stderr too."""
    res = c.remove_member(a.addr)
    for w in res.get("warnings") or () if isinstance(res, dict) else ():
        print(f"warning: {w}", file=sys.stderr)
    return show(res)


def _preview(a, c: Client) -> int:
    """``raftsched preview NAME [--count N] [--after T]`` (GET /v1/jobs/NAME/preview), or
    ``raftsched preview --spec FILE [NAME] [--count N] [--after T]`` (POST /v1/preview: the spec
    is validated as a PUT's and nothing is stored)."""
    after = _time_arg(a.after, "--after")
    if a.spec is None:
        if a.name is None:
            raise UsageError("give the job's NAME, or --spec FILE to preview a spec without creating its job")
        return show(c.preview(a.name, a.count, **({} if after is None else {"after": after})))
    if a.stale:
        raise UsageError("--stale is for a job's preview: POST /v1/preview (--spec) reads no stored job's slots")
    body = _read_json(a.spec)
    if body is None:
        return 1
    return show(c.preview_spec(body, a.count, a.name, **({} if after is None else {"after": after})))


def _runs(a, c: Client) -> int:
    """``raftsched runs NAME [--state S] [--slot T] [--since T] [--until T] [--limit N]``: the
    job's runs and recorded slots (GET /v1/jobs/NAME/runs), filtered as the API filters them."""
    kw = {"before": a.before} if a.before else {}
    return show(c.runs(a.name, limit=a.limit, state=a.state, slot=_time_arg(a.slot, "--slot"),
                       since=_time_arg(a.since, "--since"), until=_time_arg(a.until, "--until"), **kw))


#: ``raftsched cancel --job``: requests at most (1 000 runs each: a million-run backlog)
CANCEL_JOB_REQUESTS_MAX = 1_000


def _cancel(a, c: Client) -> int:
    """``raftsched cancel RUN [--reason R]`` (POST /v1/runs/RUN/cancel), or ``raftsched cancel
    --job NAME [--running] [--reason R]``: POST /v1/jobs/NAME/cancel again while it says
    ``more`` (each request ends up to 1 000 runs), printing one answer: the runs ended, those
    passed over (started or ended meanwhile), and how many requests it took."""
    if a.id is not None and a.job is not None:
        raise UsageError("give a RUN id or --job NAME, not both")
    if a.id is None and a.job is None:
        raise UsageError("give a RUN id (NAME@MS...), or --job NAME for every queued run of a job")
    if a.job is None:
        if a.running:
            raise UsageError("--running goes with --job (a RUN is cancelled queued or running)")
        return show(c.cancel_run(a.id, a.reason))
    runs: list[str] = []
    passed: list[dict] = []
    more, requests, after = True, 0, None
    try:
        while more and requests < CANCEL_JOB_REQUESTS_MAX:
            res = c.cancel_job_runs(a.job, a.reason, a.running, after)
            requests += 1
            runs += res["runs"]
            passed += res["passed"]
            more, nxt = res["more"], res.get("next")
            if more and (nxt is None or nxt == after):
                break  # (no cursor to go on from: a node of another version; said below)
            after = nxt
    except RaftschedError:
        if runs:  # what the requests before the failure ended, then the failure (printed by the caller)
            show({"job": a.job, "cancelled": len(runs), "runs": runs, "passed": passed, "more": True,
                  "requests": requests})
        raise
    show({"job": a.job, "cancelled": len(runs), "runs": runs, "passed": passed, "more": more, "requests": requests})
    if more:
        print(f"raftsched cancel: runs of job {a.job} may be left (the node gave no place to go on from, or "
              f"{CANCEL_JOB_REQUESTS_MAX} requests were sent): run it again", file=sys.stderr)
        return 1
    return 0


def _jobs(a, c: Client):
    """``raftsched jobs [--limit N] [--after NAME] [--label K=V ...]``: a page of GET /v1/jobs."""
    labels = {}
    for text in a.label:
        k, eq, v = text.partition("=")
        if not eq or not k:
            raise UsageError(f"--label: {text!r} is not KEY=VALUE")
        labels[k] = v
    kw: dict = {"labels": labels} if labels else {}
    if a.after:
        kw["after"] = a.after
    return c.list_jobs(a.limit, **kw)


def _read_json(path: str):
    """The JSON value of a file (- for stdin), or None after printing why not."""
    try:
        text = read_text(path)
    except OSError as e:
        print(f"raftsched: {path}: {e.strerror}", file=sys.stderr)
        return None
    except UnicodeDecodeError:
        print(f"raftsched: {path}: not UTF-8 text (give a JSON file)", file=sys.stderr)
        return None
    try:
        return json_loads(text)
    except BadRequest as e:  # (a key twice: the message says malformed JSON)
        print(f"raftsched: {path}: {e.message}", file=sys.stderr)
        return None
    except (ValueError, RecursionError) as e:
        first_line = text.lstrip().split("\n", 1)[0]
        yaml_like = first_line.startswith("---") or re.match(r"[A-Za-z_][\w.-]*\s*:", first_line) is not None
        hint = " (this reads JSON only: a YAML file is not read; convert it)" if yaml_like else ""
        print(f"raftsched: {path}: malformed JSON: {e}{hint}", file=sys.stderr)
        return None


def _explain(a, c) -> int:
    """explain NAME FROM TO, or explain NAME --slot T: one of the two, whole (a usage error, exit
    2, before any request: a window without its end was sent and answered 400 naming down_to);
    explain NAME alone: a triggered job's parents and its slots waiting for them."""
    if a.from_flag is not None or a.to_flag is not None:
        print("raftsched explain: FROM and TO are positional: raftsched explain NAME FROM TO "
              "(ISO times), or raftsched explain NAME --slot T", file=sys.stderr)
        return 2
    window = a.down_from is not None or a.down_to is not None
    if a.slot is not None and window:
        print("raftsched explain: give FROM TO (an outage window) or --slot T (one slot), not both", file=sys.stderr)
        return 2
    if a.slot is None and (a.down_from is None) != (a.down_to is None):
        print("raftsched explain: give FROM and TO (the outage window, ISO times), or --slot T", file=sys.stderr)
        return 2
    # (neither: a triggered job's parents and waiting slots; a scheduled job's node says FROM is needed)
    return show(c.explain(a.name, a.down_from, a.down_to, slot=a.slot))


def _put(a, c: Client) -> int:
    body = _read_json(a.spec_file)
    if body is None:
        return 1
    return show(c.put_job(a.name, body, **({"paused": True} if a.paused else {})))


def _put_sink(a, c: Client) -> int:
    body = _read_json(a.spec_file)
    if body is None:
        return 1
    return show(c.put_sink(a.name, body))


#: What ``--idempotency-key`` may be: what the API takes (1-64 characters), of the visible ASCII
#: characters a header carries as they are.
_KEY_CHARS = frozenset(chr(i) for i in range(0x21, 0x7f))


def _merge_batches(answers: list[dict], split: bool) -> dict:
    """The answers of the requests of one ``apply``, as one answer of the same shape: every
    job's result, the counts summed, ``requests`` (how many were answered) when the file was
    ``split`` into several, and ``duplicate`` when every request was a replay."""
    merged: dict = {"jobs": {}, "created": 0, "replaced": 0, "conflicts": 0, "commands": 0}
    for res in answers:
        merged["jobs"].update(res.get("jobs") or {})
        for k in ("created", "replaced", "conflicts", "commands"):
            merged[k] += res.get(k) or 0
    if split:
        merged["requests"] = len(answers)
    if answers and all(res.get("duplicate") for res in answers):
        merged["duplicate"] = True
    if answers and all(res.get("paused") for res in answers):
        merged["paused"] = True  # (every job paused in the command that wrote it)
    return merged


def _apply(a, c: Client) -> int:
    """POST /v1/jobs:batch with the jobs of a file, at most batch_jobs_max per request (each
    request is validated whole before it changes anything; a file of more is sent as several),
    every request with the same Idempotency-Key (``--idempotency-key``, else a new one): each
    command's request id is derived from the key and the command's jobs, so the same file sent
    again with the same key applies each command at most once. What it prints is one answer
    (:func:`_merge_batches`), with the node's ``error`` when a request failed."""
    if a.exit_code and not a.dry_run:
        print("raftsched: --exit-code goes with --dry-run", file=sys.stderr)
        return 2
    key = a.idempotency_key
    if key is not None and not (0 < len(key) <= limits.request_id_chars_max and set(key) <= _KEY_CHARS):
        print(f"raftsched: --idempotency-key: 1-{limits.request_id_chars_max} visible ASCII characters, "
              "no spaces", file=sys.stderr)
        return 2
    key = key or uuid.uuid4().hex
    body = _read_json(a.file)
    if body is None:
        return 1
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), dict) \
            or set(body) - {"jobs", "create_only", "paused"}:
        found = f" (found: {', '.join(sorted(map(str, body))[:8])})" if isinstance(body, dict) and body else ""
        print(f'raftsched: {a.file}: expected {{"jobs": {{"NAME": SPEC, ...}}}} (and optionally "create_only", '
              f'"paused"){found}', file=sys.stderr)
        return 1
    names = list(body["jobs"])
    create_only = bool(body.get("create_only")) or a.create_only
    paused = bool(body.get("paused")) or a.paused
    parts = job_batches(names, body["jobs"]) or [[]]
    if len(parts) > 1:
        print(f"raftsched: {len(names)} jobs: sending {len(parts)} requests (at most {limits.batch_jobs_max} jobs "
              f"and {limits.batch_request_bytes_max // 2**20} MiB each); each is validated on its own", file=sys.stderr)
    if a.dry_run:
        if len(parts) > 1:
            print("raftsched: a dry run checks each request against the cluster as it is, not as the requests "
                  "before it would leave it (a job whose `after` names a new job of an earlier request, and the "
                  "bounds, are judged without them)", file=sys.stderr)
        return _apply_dry_run(a, c, body["jobs"], parts, create_only, paused)
    # Compared first (but with --all): a retry after an unknown outcome too, whose jobs that
    # applied then compare unchanged now and are left out.
    same: dict = {}
    if not a.all:
        same, refused = _unchanged(c, body["jobs"], parts, create_only, paused)
        if refused is not None:
            err_body = getattr(refused, "body", None)
            err = err_body.get("error") if isinstance(err_body, dict) else None
            if isinstance(err, dict):
                show({"error": err})
            else:
                print(f"raftsched: {refused.message}", file=sys.stderr)
            print("raftsched: nothing was written (comparing the file with the cluster failed)", file=sys.stderr)
            return 1
    if same:
        names = [n for n in names if n not in same]
        parts = job_batches(names, body["jobs"]) if names else []
    bar = Progress(len(names), "apply")
    answers: list[dict] = []
    failed: RaftschedError | None = None
    try:
        sent = 0
        for names_part in parts:
            part = {n: body["jobs"][n] for n in names_part}
            res = c.put_jobs(part, create_only, idempotency_key=key, **({"paused": True} if paused else {}))
            answers.append(res if isinstance(res, dict) else {})
            sent += len(names_part)
            bar.update(sent)
    except RaftschedError as e:
        failed = e  # the requests before it stay applied: they are printed with it
    finally:
        bar.close()  # the bar's line ends before anything is printed
    out: dict | None = _merge_batches(answers, len(parts) > 1) if answers else None
    if not a.all and (same or failed is None):  # (a first request refused, alone: its error alone)
        out = out or _merge_batches([], False)
        for n, r in same.items():  # (in the answer, after the jobs written; with a write's warnings)
            out["jobs"][n] = {"unchanged": True, "next_slot": r.get("next_slot"),
                              **({"warnings": r["warnings"]} if r.get("warnings") else {})}
        out["unchanged"] = len(same)
    if failed is not None:
        err_body = getattr(failed, "body", None)
        err = err_body.get("error") if isinstance(err_body, dict) else None
        if getattr(failed, "status", None) is None or not isinstance(err, dict):
            # No node's answer to print as such (unreachable, no leader, an unknown outcome):
            # why, on stderr; a 504's account of which jobs committed is printed all the same.
            print(f"raftsched: {failed.message}", file=sys.stderr)
        if not failed.definite:
            # (create_only is part of each command's id: the retry must say it as this one did)
            again = ["raftsched", "apply", a.file, "--idempotency-key", key] + (["--create-only"] if create_only else []) \
                + (["--paused"] if paused else []) + (["--all"] if a.all else [])
            print(f"raftsched: the Idempotency-Key was {key}: {shlex.join(again)} (with the same token) sends the "
                  "jobs again" + (" (those that still differ: the ones that applied compare unchanged)"
                                  if not a.all else "") + " and applies each command at most once",
                  file=sys.stderr)
        if isinstance(err, dict):
            out = dict(out or {}, error=err)
        if out is not None:
            show(out)
        return 1
    show(out)
    conflicts = out.get("conflicts", 0) if out else 0
    if conflicts:
        # The file and the cluster differ: say why, by kind (each job's error is in the answer).
        errors = [r["error"] for r in (out or {}).get("jobs", {}).values() if isinstance(r, dict) and "error" in r]
        stale = sum(1 for e in errors if e.get("stale"))
        refused = sum(1 for e in errors if e.get("code") != "conflict")
        exists = conflicts - stale - refused
        if exists > 0:
            print(f"raftsched: {exists} job(s) exist already and were left as they are (--create-only)",
                  file=sys.stderr)
        if stale:
            print(f"raftsched: {stale} job(s) fired while their replace was planned, again and again, and were left "
                  "as they are: send the file again", file=sys.stderr)
        if refused:
            print(f"raftsched: {refused} job(s) refused (their `after`, checked against a job of the file that was "
                  "not replaced): see their errors", file=sys.stderr)
        return 1
    return 0


def _apply_dry_run(a, c: Client, jobs: dict, parts: list[list[str]], create_only: bool, paused: bool) -> int:
    """``apply --dry-run``: each request with ``dry_run`` (the node checks every job as the
    apply would and changes nothing), the answers as one: on a terminal (``-o table``) a plan, a
    line a job created or replaced with its changed fields under it, a line a conflict, a
    count; else the answer. Exit 1 for conflicts (as the apply would), else 3 with
    ``--exit-code`` when anything would change (a job created, replaced or paused: a drift
    check; not 2, which is a usage error's), else 0."""
    merged = _plan(c, jobs, parts, create_only, paused, "dry run")
    if output_format() == "table":
        print(_plan_text(merged))
    else:
        show(merged)
    if merged["conflicts"]:
        return 1
    changes = merged["create"] or merged["replace"] or any(r.get("pauses") for r in merged["jobs"].values())
    return DRIFT_EXIT if a.exit_code and changes else 0


def _plan(c: Client, jobs: dict, parts: list[list[str]], create_only: bool, paused: bool, what: str) -> dict:
    """The dry runs of ``parts`` of ``jobs``, their answers as one. :raises RaftschedError:"""
    from .sdk.sync import dry_run_jobs
    merged: dict = {"dry_run": True, "jobs": {}, "create": 0, "replace": 0, "unchanged": 0, "conflicts": 0}
    bar = Progress(len(jobs), what)
    try:
        sent = 0
        for names_part in parts:
            res = dry_run_jobs(c, {n: jobs[n] for n in names_part}, create_only, paused)
            res = res if isinstance(res, dict) else {}
            merged["jobs"].update(res.get("jobs") or {})
            for k in ("create", "replace", "unchanged", "conflicts"):
                merged[k] += res.get(k) or 0
            if res.get("values_left_out"):
                merged["values_left_out"] = True
            sent += len(names_part)
            bar.update(sent)
    finally:
        bar.close()
    if paused:
        merged["paused"] = True
    return merged


def _unchanged(c: Client, jobs: dict, parts: list[list[str]], create_only: bool,
               paused: bool) -> tuple[dict, RaftschedError | None]:
    """The jobs of the file the cluster holds as they are (a dry run's ``unchanged``, that
    ``paused`` would not pause): (name -> that answer, None). Writing them would change nothing
    but their generation (and add an audit line and a command each), so ``apply`` leaves them
    out. A node of a version without the dry run: ({}, None), every job written, as before (said
    on stderr). A request of a file split into several that the node refuses (an ``after``
    naming a job of an earlier request, not written yet): its jobs are all written, and its
    refusal, if real, is the write's answer. Else a refusal, or no node's answer: ({}, the
    error), which is the apply's answer (nothing written; the write would have answered the
    same, after as long again)."""
    same: dict = {}
    bar = Progress(len(jobs), "compare")
    try:
        done = 0
        for names_part in parts:
            try:
                res = c.put_jobs({n: jobs[n] for n in names_part}, create_only, dry_run=True,
                                 **({"paused": True} if paused else {}))
            except RaftschedError as e:
                if e.code == "bad_request" and e.field == "dry_run":
                    bar.close()
                    print("raftsched: could not compare the file with the cluster (a node of a version before the "
                          "dry run); writing every job", file=sys.stderr)
                    return {}, None
                if len(parts) == 1 or getattr(e, "status", None) is None or e.code == "unavailable":
                    return {}, e
                continue
            for n, r in ((res.get("jobs") or {}) if isinstance(res, dict) else {}).items():
                if isinstance(r, dict) and r.get("action") == "unchanged" and not r.get("pauses"):
                    same[n] = r
            done += len(names_part)
            bar.update(done)
    finally:
        bar.close()
    return same, None


#: ``apply --dry-run --exit-code``'s status when the file would change something (2 is argparse's,
#: and this CLI's, for a usage error; 1 an error's).
DRIFT_EXIT = 3


def _plan_text(plan: dict) -> str:
    """A dry run's answer as a terminal shows it: ``+`` create, ``~`` replace (each changed field
    under it, ``from -> to``, ``(absent)`` for a side without it), ``!`` conflict; unchanged
    jobs only counted."""
    def val(change: dict, side: str) -> str:
        if side in change:
            return json.dumps(change[side], separators=(",", ":"))
        return f"({change[side + '_bytes']} bytes)" if side + "_bytes" in change else "(absent)"
    lines = []
    for name, res in plan["jobs"].items():
        action = res.get("action")
        if action == "unchanged" and not res.get("pauses") and not res.get("warnings") \
                and not res.get("paused_in_cluster"):
            continue
        mark = {"create": "+", "replace": "~", "conflict": "!", "unchanged": "="}.get(action, "?")
        head = f"{mark} {action:<9} {name}"
        if action == "conflict":
            head += f": {(res.get('error') or {}).get('message', '')}"
        elif res.get("next_slot"):
            head += f"  (next slot {res['next_slot']})"
        if res.get("pauses"):
            head += "  [paused]"
        elif res.get("paused_in_cluster"):
            head += "  [paused in the cluster: the apply leaves it so]"
        lines.append(head)
        lines.extend(f"      {ch['field']}: {val(ch, 'from')} -> {val(ch, 'to')}" for ch in res.get("changes") or ())
        lines.extend(f"      warning: {w}" for w in res.get("warnings") or ())
    n = len(plan["jobs"])
    pauses = sum(1 for r in plan["jobs"].values() if r.get("pauses"))
    held = sum(1 for r in plan["jobs"].values() if r.get("paused_in_cluster"))
    lines.append(f"{n} job{'s' if n != 1 else ''}: {plan['create']} to create, {plan['replace']} to replace, "
                 f"{plan['unchanged']} unchanged, {plan['conflicts']} conflict{'s' if plan['conflicts'] != 1 else ''}"
                 + (f", {pauses} to pause" if pauses else "") + (f", {held} paused in the cluster" if held else "")
                 + " (dry run: nothing changed)")
    if plan.get("values_left_out"):
        lines.append("(the answer's values reached their bound: later ones are shown by their size; -o json has "
                     "the same)")
    return "\n".join(lines)


#: The longest ``raftsched cluster`` and ``members list`` wait for the leader's own view
#: (each node given is asked once).
LEADER_VIEW_DEADLINE_S = 5.0


def _ask_cluster(a) -> Callable[[str], dict]:
    """``url -> GET /v1/cluster`` of that node alone, with the command's token and TLS files."""
    t: Target = a.target

    def ask(url: str) -> dict:
        one = Client([url], token=t.token, timeout_s=LEADER_VIEW_DEADLINE_S,
                     deadline_s=min(a.deadline_s, LEADER_VIEW_DEADLINE_S), ca_file=t.ca_file,
                     cert_file=t.client_cert, key_file=t.client_key, fail_fast=True)
        return one.cluster()
    return ask


def _with_leader_view(a, out: dict, body: dict) -> int:
    """Print ``out`` with which members the leader hears (cli_cluster.py), saying on stderr
    when that could not be told."""
    why = cli_cluster.add_leader_view(out, body, a.target.urls, _ask_cluster(a))
    if why is not None:
        print(f"raftsched: cannot tell which members are up: {why}", file=sys.stderr)
    return show(out)


def _cluster(a, c: Client) -> int:
    """``raftsched cluster``: the answering node's view (GET /v1/cluster), with whether the leader
    hears each member and the leader's conditions."""
    body = c.cluster()
    return _with_leader_view(a, dict(body), body)


def _members(a, c: Client) -> int:
    """``raftsched members``: the committed configuration, the change in progress, the leader,
    whether the leader hears each member, and the conditions."""
    st = c.cluster(consistent=True)
    out = {"leader": st.get("leader"), "voters": st.get("members"), "learners": st.get("learners", []),
           "pending": (st.get("membership") or {}).get("pending"), "conditions": st.get("conditions", [])}
    return _with_leader_view(a, out, st)


def _member_add(a, c: Client) -> int:
    """``raftsched members add HOST:PORT``: add the node (started with ``raftsched node --join``),
    then wait until the leader has made it a voter (it first catches up as a learner)."""
    res = c.add_member(a.addr)
    if res.get("state") != "learner" or a.no_wait:
        return show(res)
    print(f"raftsched: {a.addr} is a learner: it catches up with the log, then the leader makes it a voter "
          f"(waiting up to {a.wait_s:g} s)", file=sys.stderr)
    deadline = time.monotonic() + a.wait_s
    while time.monotonic() < deadline:
        time.sleep(MEMBER_POLL_S)
        try:
            st = c.cluster(consistent=True)
        except Unavailable as e:  # a leader change while the member is added: look again
            print(f"raftsched: {e.message}; still waiting", file=sys.stderr)
            continue
        if a.addr in (st.get("members") or []):
            return show(dict(res, state="voter", members={"voters": st.get("members"),
                                                          "learners": st.get("learners", [])}))
        if a.addr not in (st.get("learners") or []):
            print(f"raftsched: {a.addr} is no longer a member (removed meanwhile)", file=sys.stderr)
            return 1
    print(f"raftsched: {a.addr} is still a learner after {a.wait_s:g} s: is it running (raftsched node --join "
          f"--peers ...) and can it reach the others? It becomes a voter once it holds the log; "
          f"'raftsched members remove {a.addr}' takes it out", file=sys.stderr)
    return 1


def _sync(a, c: Client) -> int:
    """``raftsched sync``: raftsched/sdk/sync.py (imported here: no other subcommand needs it)."""
    from .sdk import sync
    if a.exit_code and not a.dry_run:
        print("raftsched sync: --exit-code goes with --dry-run", file=sys.stderr)
        return 2
    a.json = a.json or a.output == "json"  # -o json is --json here; the plan is text otherwise
    return sync.run(a, c)


class _StaleReads:
    """The Client with ``stale=True`` on every method that takes it (``--stale``)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if callable(attr) and "stale" in inspect.signature(attr).parameters:
            return functools.partial(attr, stale=True)
        return attr


def _with_client(a) -> int:
    """Run a client subcommand: a Client over every node of --url (comma-separated), which it
    fails over between, and the attempt timeout of a batch (``apply`` sends thousands of jobs
    in one request). Routing and retries are the Client's: other nodes of --url, Retry-After,
    the same Idempotency-Key after an unknown outcome, one deadline. A call that fails ends the
    command: its error is printed (cli_output.print_error) and the exit status is 1."""
    set_format(a.output)
    if not (a.deadline_s > 0 and math.isfinite(a.deadline_s)):
        print(f"raftsched: --deadline-s must be a number of seconds above 0, got {a.deadline_s:g}", file=sys.stderr)
        return 2
    try:
        t = _target(a)
    except ConfigError as e:
        print(f"raftsched: {e}", file=sys.stderr)
        return 2
    try:
        # fail_fast: every node once, then what each said (a node waits its propose timeout
        # for a leader before it answers 503; going round again would only repeat it), unless
        # a node answered a change 504: that is sent again, same key, until the deadline.
        c = Client(t.urls, token=t.token, timeout_s=BATCH_TIMEOUT_S, deadline_s=a.deadline_s,
                   ca_file=t.ca_file, cert_file=t.client_cert, key_file=t.client_key, fail_fast=True)
    except ValueError as e:
        print(f"raftsched: --url: {e}", file=sys.stderr)
        return 2
    except (OSError, ssl.SSLError) as e:
        print(f"raftsched: --ca-file/--client-cert: {e}", file=sys.stderr)
        return 2
    a.target = t
    # What went wrong is said once, by the call's final error (core.Call.round_error), not by a
    # log line per attempt as well.
    _setup_logging("warning")
    try:
        return a.client_run(a, _StaleReads(c) if getattr(a, "stale", False) else c)
    except RaftschedError as e:
        return print_error(e, a)
    except UsageError as e:
        print(f"raftsched {a.cmd}: {e}", file=sys.stderr)
        return 2


class _Parser(argparse.ArgumentParser):
    """Every parser of the command, subcommands' included (argparse makes them of the parent's
    class): no abbreviated options. With them, a flag a subcommand lacks could be taken for one
    it has (``raftsched explain --to ...``: "ambiguous option: --to could match --token"), and
    a new flag could change what an abbreviation in a script meant."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


class _Help(argparse.HelpFormatter):
    """Every option's help says its default when it is a number and the help does not say it
    already (a walk: --wait-s, --limit, --deadline-s, --slots showed none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        h = action.help
        d = action.default
        if h and "default" not in h and type(d) in (int, float) and action.option_strings:
            return f"{h} (default: %(default)g)"
        return h


def _group(sub, name: str, help: str):
    """A command group (``raftsched sinks``, ``tokens`` ...): its subcommands' parsers. Without a
    subcommand, its help on stderr and a line naming them, exit 2 (argparse said only "the
    following arguments are required: sinks_cmd")."""
    g = sub.add_parser(name, help=help, description=help)
    cmds = g.add_subparsers(dest=f"{name}_cmd", metavar="COMMAND", title="commands")

    def no_command(a) -> int:
        g.print_help(sys.stderr)
        print(f"\nraftsched {name}: give a command: {', '.join(cmds.choices)} "
              f"(raftsched {name} COMMAND --help says more)", file=sys.stderr)
        return 2
    g.set_defaults(func=no_command)
    return cmds


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="raftsched", description="A distributed job scheduler on Raft.")
    p.add_argument("--version", action="version", version=f"raftsched {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    n = sub.add_parser("node", help="start a node")
    n.add_argument("--id", required=True)
    n.add_argument("--api", required=True, help="HOST:PORT of the admin API")
    n.add_argument("--raft", required=True, help="HOST:PORT of the Raft port (loopback unless --allow-remote-raft)")
    n.add_argument("--peers", default="", help="the other members' Raft HOST:PORT, comma-separated; none = a one-node cluster "
                                               "(the first start only: once the members changed online, the node's "
                                               "log says who they are)")
    n.add_argument("--join", action="store_true",
                   help="join the running cluster of --peers: no vote until 'raftsched members add' adds this node "
                        "and it holds the log (docs/operations.md)")
    n.add_argument("--data-dir", required=True)
    n.add_argument("--cluster-secret-file", required=False)
    n.add_argument("--token-file", help="the bootstrap (admin) API token; without it the node generates DATA_DIR/token")
    n.add_argument("--keys-dir", help="the key ring job secrets are sealed with (<id>.key files, mode 0600); "
                                      "default: keys/ beside --cluster-secret-file")
    n.add_argument("--allow-remote-raft", action="store_true")
    n.add_argument("--slots", type=int, default=worker_limits.slots_default,
                   help="runs this node executes at once (0: none)")
    n.add_argument("--queues", default="", help="queues this node's worker serves, comma-separated (default: all)")
    n.add_argument("--executors", default=",".join(EXECUTOR_TYPES),
                   help="executor types this node runs (shell runs commands: code execution by design)")
    n.add_argument("--execute-on-leader", action="store_true",
                   help="let the leader execute runs too (by default only followers do, unless the cluster has one node)")
    n.add_argument("--lease-ttl-s", type=float, default=worker_limits.lease_ttl_ms_default / 1000,
                   help="lease TTL this node's worker asks for")
    n.add_argument("--labels", default="", help="this node's worker's labels, NAME=VALUE,... (none by default): "
                                                "jobs placed on labels run only on workers that carry them")
    n.add_argument("--log-level", default="info")
    n.add_argument("--log-file", default="", help="write the log to this file, rotated at 16 MiB, 4 old files kept "
                                                  "(default: stderr)")
    n.add_argument("--tls-cert", default="", help="serve the API over TLS with this certificate chain (PEM)")
    n.add_argument("--tls-key", default="", help="the private key of --tls-cert (PEM)")
    n.add_argument("--tls-client-ca", default="", help="mutual TLS: clients must present a certificate this CA (PEM) signed")
    n.add_argument("--metrics-open", action="store_true", help="GET /metrics needs no token")
    n.add_argument("--metrics-workers-max", type=int, default=None,
                   help="registered workers up to which GET /metrics has series per worker; past it only the "
                        "fleet's totals (default 1000; 0: never per worker)")
    _isolation_args(n, "this node")
    n.add_argument("--auth-failures-burst", type=float, default=None,
                   help="refused tokens one source address may send before it is answered 429")
    n.add_argument("--auth-failures-per-s", type=float, default=None,
                   help="refused tokens a second a source address gets back")
    n.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                   help="sync the journal before acknowledging (default); --no-fsync: a power loss "
                        "of a majority can lose acknowledged writes (docs/operations.md, Durability)")
    # Test and benchmark hooks (NodeConfig), hidden from --help: a production node needs none.
    n.add_argument("--simulate-power-loss", action="store_true", help=argparse.SUPPRESS)
    n.add_argument("--dial-map", default="", help=argparse.SUPPRESS)
    n.add_argument("--clock-offset-file", default="", help=argparse.SUPPRESS)
    n.add_argument("--fire-log", default="", help=argparse.SUPPRESS)
    n.add_argument("--workers-seen-interval-s", type=float, default=None, help=argparse.SUPPRESS)
    n.set_defaults(func=cmd_node)

    w = sub.add_parser("worker", help="run a worker outside the Raft quorum: leases runs from the nodes over the API")
    _target_args(w, "this worker's")
    w.add_argument("--id", help="this worker's id (default: HOST/PID); keep it stable to recognise a machine")
    w.add_argument("--queues", default="", help="queues to serve, comma-separated (default: all)")
    w.add_argument("--labels", default="", help="NAME=VALUE,...: jobs placed on labels run only on workers carrying them")
    w.add_argument("--slots", type=int, default=worker_limits.slots_default, help="runs executed at once")
    w.add_argument("--executors", default=None,
                   help=f"executor types this worker runs (default: {','.join(EXECUTOR_TYPES)})")
    w.add_argument("--app", default="", metavar="MODULE:ATTR",
                   help="run this SDK App's handlers, and only them (docs/sdk.md): the worker takes the runs "
                        "of the app's jobs and no other")
    w.add_argument("--isolation", choices=("thread", "subprocess"), default=None,
                   help="with --app: run each plain handler's run in a thread (default) or in a child "
                        "process that is killed at its timeout")
    w.add_argument("--drain-s", type=float, default=worker_limits.drain_s_default,
                   help="on SIGTERM, how long running runs may finish before they are given back")
    w.add_argument("--lease-ttl-s", type=float, default=worker_limits.lease_ttl_ms_default / 1000,
                   help="lease TTL this worker asks for")
    w.add_argument("--wait-s", type=float, default=worker_limits.lease_wait_s_default,
                   help="how long one lease request waits at a node for work")
    _isolation_args(w, "this worker")
    w.add_argument("--log-level", default="info")
    w.set_defaults(func=cmd_worker)

    def client(name: str, help_: str, call=None, *, run=None, parent=None, read=False) -> argparse.ArgumentParser:
        """A client subcommand (of ``parent``, default the top level). ``call(args, client)``
        makes the Client call whose answer is printed (``cli_output.show``); ``run(args, client)``
        does its own and returns the exit status. A RaftschedError either raises is printed by
        ``_with_client``. A ``read`` takes ``--stale``."""
        c = (parent or sub).add_parser(name, help=help_, description=help_)
        _target_args(c, "this client's")
        c.add_argument("-o", "--output", choices=FORMATS, default=None,
                       help="how answers are printed (default: table on a terminal, json when piped)")
        c.add_argument("--deadline-s", type=float, default=DEADLINE_S_DEFAULT,
                       help="the longest one call may take: each node of --url is tried once, then the "
                            "command says what each answered (a change answered 504 is sent again until then)")
        if read:
            c.add_argument("--stale", action="store_true",
                           help="read the answering node's replica as it is: no read barrier, an answer with "
                                "no leader too, possibly behind (docs/api.md, \"Consistent reads\")")
        c.set_defaults(func=_with_client, client_run=run or (lambda a, cl: show(call(a, cl))))
        return c

    client("cluster", "show the cluster as the node asked sees it, whether the leader hears each member, and "
                      "the conditions", run=_cluster)
    c = client("jobs", "list jobs, a page at a time (its 'next' is the next page's --after)", _jobs, read=True)
    c.add_argument("--limit", type=int, default=100, help="jobs a page (1-1000, default 100)")
    c.add_argument("--after", metavar="NAME", help="the jobs after this name: the 'next' of the page before")
    c.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="only the jobs with this label (repeat it: every one)")
    client("get", "show a job", lambda a, c: c.get_job(a.name), read=True).add_argument("name")
    c = client("put", "create or replace a job from a JSON spec file (- for stdin)", run=_put)
    c.add_argument("name")
    c.add_argument("spec_file")
    c.add_argument("--paused", action="store_true",
                   help="pause the job in the same command: created paused, it fires nothing until 'resume'")
    c = client("apply", "create or replace many jobs from a JSON file (- for stdin): "
                        '{"jobs": {"NAME": SPEC, ...}}', run=_apply)
    c.add_argument("file")
    c.add_argument("--create-only", action="store_true", help="never replace: existing jobs are reported as conflicts")
    c.add_argument("--paused", action="store_true",
                   help="pause every job in the same command (an import ahead of a cut-over): each fires nothing "
                        "until 'resume'")
    c.add_argument("--idempotency-key", metavar="KEY",
                   help="the Idempotency-Key of its requests (default: a new one): to send a file again after "
                        "an unknown outcome, with the key that command printed, so that what applied is not "
                        "applied twice")
    c.add_argument("--dry-run", action="store_true",
                   help="change nothing: the nodes check every job as the apply would and say what it would do "
                        "(create, replace with the fields that change, unchanged, conflict)")
    c.add_argument("--all", action="store_true",
                   help="write every job of the file, those the cluster holds as they are too (each a new "
                        "generation); by default they are compared first and left out")
    c.add_argument("--exit-code", action="store_true",
                   help="with --dry-run: exit 3 when a job would be created, replaced or paused (a drift check), "
                        "0 when none would")
    c = client("pause", "pause a job", lambda a, c: c.pause(a.name, a.note))
    c.add_argument("name")
    c.add_argument("--note", help="why, in your words: kept with when and by which token, shown by 'get' until "
                                  "the resume")
    c = client("resume", "resume a job", lambda a, c: c.resume(a.name, catch_up=a.catch_up))
    c.add_argument("name")
    c.add_argument("--catch-up", action="store_true",
                   help="the slots that fell due while it was paused stay due, for its misfire policy to decide "
                        "(without it they are recorded skipped, reason paused)")
    c = client("trigger", "trigger a job: one manual run now (or the run of --slot)", run=_trigger)
    c.add_argument("name")
    c.add_argument("--slot", metavar="T", help="the run of this scheduled time, deduplicated: a slot that has a run "
                                               "already answers it (created false); an ISO time, or ms since the "
                                               "epoch as in a run id (NAME@MS)")
    c.add_argument("--payload", metavar="JSON|@FILE", help="this run's payload instead of the job's: JSON text, "
                                                           "or @FILE (@- for stdin)")
    c.add_argument("--propagate", action="store_true", help="its outcome reaches the jobs that run after it")
    c.add_argument("--rerun", action="store_true", help="with --slot: run the slot again though its run ended "
                                                        "(a dead run: requeue it instead)")
    c.add_argument("--downstream", action="store_true", help="with --rerun: the jobs after it that ran for the slot "
                                                             "run again after it, down the graph (implies --propagate)")
    c = client("delete", "delete a job", lambda a, c: c.delete_job(a.name, force=a.force))
    c.add_argument("name")
    c.add_argument("--force", action="store_true", help="though other jobs run after it (their waiting slots are "
                                                       "recorded dependency_missing)")
    c = client("graph", "the jobs a job runs after and that run after it, transitively", run=_graph, read=True)
    c.add_argument("name")
    c.add_argument("--json", action="store_true", help="print the graph as JSON")
    c = client("runs", "a job's runs and recorded slots, newest first (a recorded range of missed slots is one "
                       "entry: its SLOTS are FIRST..LAST (COUNT))", run=_runs, read=True)
    c.add_argument("name")
    c.add_argument("--limit", type=int, default=RUNS_SHOWN_DEFAULT, help="entries shown")
    c.add_argument("--state", choices=RUN_STATES, help="only entries in this state")
    c.add_argument("--slot", metavar="T", help="only the entry of this slot (\"did my 02:00 run happen?\"): its "
                                               "run, or the record whose range holds it; an ISO time, or ms since "
                                               "the epoch as in a run id (NAME@MS)")
    c.add_argument("--since", metavar="T", help="only entries whose slot is at or after T (ISO time, or ms)")
    c.add_argument("--until", metavar="T", help="only entries whose slot is before T (ISO time, or ms)")
    c.add_argument("--before", metavar="CURSOR", help="the page after the one whose 'next' this is (the entries before it)")

    client("run", "show one run or recorded slot by its id (NAME@MS...): its attempts, and what a queued run "
                  "waits for", lambda a, c: c.get_run(a.id), read=True).add_argument("id")
    c = client("cancel", "cancel a queued or running run by its id (NAME@MS...), or with --job every queued run of "
                         "a job: a queued one is recorded skipped (reason cancelled), a running one ends failed and "
                         "its worker stops it at its next heartbeat; neither is retried", run=_cancel)
    c.add_argument("id", nargs="?", help="the run's id (NAME@MS..., as raftsched runs NAME lists it)")
    c.add_argument("--job", metavar="NAME", help="every queued run of this job (an outage's backlog), oldest first, "
                                                 "in requests of up to 1 000 until none is left")
    c.add_argument("--running", action="store_true", help="with --job: its running runs too")
    c.add_argument("--reason", type=lambda v: v.strip() or None,
                   help="why, in your words: the run's error shows it (the node's audit log names the token that "
                        "asked); an empty one is none")
    c = client("dlq", "list dead runs, newest first (optionally of one queue)",
               lambda a, c: c.dlq(a.queue, a.limit), read=True)
    c.add_argument("--queue")
    c.add_argument("--limit", type=int, default=100, help="dead runs shown (1-10000, default 100)")
    # requeue and purge (one run, or --all-matching), backfill, backfills, backfill-cancel ...
    backfill_cli.add_commands(client)
    lock_cli.add_commands(client)
    client("queues", "queues: depth, running, oldest waiting, dead", lambda a, c: c.queues(), read=True)
    client("workers", "the worker fleet: every worker, or one with the runs it holds (--id)",
           lambda a, c: c.worker(a.id) if a.id else c.workers(), read=True).add_argument("--id")
    client("drain", "drain a worker: no more runs for it; it finishes what it runs and stops",
           lambda a, c: c.drain_worker(a.worker)).add_argument("worker")
    c = client("explain", "what an outage window would do to a job's slots, or (--slot) why a slot missed its deadline",
               run=_explain)
    c.description = ("raftsched explain NAME FROM TO: what an outage from FROM to TO would do to the job's slots, "
                     "by its misfire policy (POST /v1/jobs/NAME/explain; FROM and TO are positional, not --from/--to). "
                     "raftsched explain NAME --slot T: why that slot met or missed its deadline.")
    c.add_argument("name", metavar="NAME", help="the job")
    c.add_argument("down_from", nargs="?", metavar="FROM",
                   help="when the outage began: an ISO time, e.g. 2026-12-01T01:58:45Z (with TO; not with --slot)")
    c.add_argument("down_to", nargs="?", metavar="TO",
                   help="when it ended (a leader fired again): an ISO time after FROM, at most 366 days later")
    c.add_argument("--slot", metavar="T", help="instead of FROM TO: the ISO time of one slot, to say why it met "
                                               "or missed its deadline")
    # backfill's range is --from/--to: here they are said to be positional, not taken as unknown.
    c.add_argument("--from", dest="from_flag", help=argparse.SUPPRESS)
    c.add_argument("--to", dest="to_flag", help=argparse.SUPPRESS)
    c = client("deadlines", "slots' deadline outcomes, newest first (docs/notifications.md, \"Deadlines\")",
               lambda a, c: c.list_deadlines(a.state, a.job, a.since, a.limit), read=True)
    c.add_argument("--state", choices=("pending", "met", "late", "missed"))
    c.add_argument("--job")
    c.add_argument("--since", help="ISO time: only slots at or after it")
    c.add_argument("--limit", type=int, default=RUNS_SHOWN_DEFAULT, help="slots shown")
    c = client("ping", "report a heartbeat job's start, success or fail (default success)",
               lambda a, c: c.ping(a.name, a.status, slot=_slot_arg(a.slot)))
    c.add_argument("name")
    c.add_argument("--status", choices=("start", "success", "fail"), default="success")
    c.add_argument("--slot", help="the slot it reports: an ISO time, or ms since the epoch as in a run id "
                                  "(NAME@MS); default: the newest still open")
    c = client("preview", "a job's next slots, with DST marks; or (--spec FILE) a spec's, without creating the job",
               run=_preview, read=True)
    c.add_argument("name", nargs="?", metavar="NAME",
                   help="the job; with --spec, the name it would have (a jitter_s offset is a hash of it; "
                        "default preview)")
    c.add_argument("--count", type=int, default=PREVIEW_COUNT_DEFAULT, help="how many slots (1-1000)")
    c.add_argument("--after", metavar="T", help="the slots after T (ISO time, or ms; default now; with --spec, the "
                                                "job as if made now: none before now)")
    c.add_argument("--spec", metavar="FILE", help="preview this JSON spec file (- for stdin) as PUT would take it, "
                                                  "proposing nothing (POST /v1/preview): a time zone's DST days show "
                                                  "as dst marks")

    c = client("sync", "make the cluster's jobs match an app's declarations (docs/sdk.md)", run=_sync)
    c.add_argument("app", help="MODULE:ATTR of the raftsched.App, e.g. myproject.jobs:app (MODULE is imported "
                               "from the current directory first)")
    c.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    c.add_argument("--exit-code", action="store_true",
                   help="with --dry-run: exit 3 when the sync would create, update or delete a job (a drift check), "
                        "0 when it would not")
    c.add_argument("--prune", action="store_true", help="delete this app's jobs that are no longer declared")
    c.add_argument("--json", action="store_true", help="print the plan (and what was applied) as JSON")

    # Membership (admin): list, add, remove (docs/operations.md, "Changing the members").
    ms = _group(sub, "members", help="the cluster's members: list, add (a node started with --join), remove")
    client("list", "the voters, the learners catching up, a change in progress, whether the leader hears "
                   "each, the conditions", run=_members, parent=ms)
    mc = client("add", "add a node by its Raft HOST:PORT and wait until it is a voter", run=_member_add, parent=ms)
    mc.add_argument("addr", metavar="HOST:PORT")
    wait = mc.add_mutually_exclusive_group()
    wait.add_argument("--wait-s", type=float, default=MEMBER_WAIT_S_DEFAULT,
                      help="how long to wait for it to catch up and become a voter")
    wait.add_argument("--no-wait", action="store_true", help="return once it is a learner")
    client("remove", "remove a node by its Raft HOST:PORT (a leader hands its leadership over first)",
           run=_member_remove, parent=ms).add_argument("addr", metavar="HOST:PORT")

    # The fencing counter: read it, or raise it after a restore from copies (docs/fencing.md).
    fc = client("fencing", "the highest fencing token granted; --at-least N raises the counter to N (admin; after a "
                           "restore from copies, above every token granted before; never lowers it)",
                lambda a, c: c.fencing() if a.at_least is None else c.raise_fencing(a.at_least))
    fc.add_argument("--at-least", type=int, metavar="N", help="raise the counter to N when it is below")

    # API tokens (admin): create, list, revoke.
    ts = _group(sub, "tokens", help="API tokens: create (the secret is shown once), list, revoke")
    tc = client("create", "create a token; its secret is printed this once",
                lambda a, c: c.create_token(a.role, a.tenants, a.expires, a.note, a.workers, a.jobs), parent=ts)
    tc.add_argument("--role", required=True, choices=ROLES)
    tc.add_argument("--tenant", action="append", dest="tenants",
                    help="limit it to this tenant (repeat for several); default: every tenant")
    tc.add_argument("--expires", help="ISO-8601 time after which it is refused, e.g. 2027-01-01T00:00:00Z")
    tc.add_argument("--note", help="who or what it is for")
    tc.add_argument("--worker", action="append", dest="workers",
                    help="a worker token: the worker id it may speak for (repeat for several); default: any id")
    tc.add_argument("--job", action="append", dest="jobs",
                    help="a ping token (--role ping): a heartbeat job it may ping (repeat for several)")
    client("list", "every token, without secrets", lambda a, c: c.tokens(), parent=ts, read=True)
    client("revoke", "revoke a token: every node refuses it once the revocation is committed",
           lambda a, c: c.revoke_token(a.id), parent=ts).add_argument("id")

    # Notification sinks (docs/notifications.md).
    ns = _group(sub, "sinks", help="notification sinks: list, put, get, delete, dead, requeue")
    client("list", "every sink (secrets redacted), its cursor and dead events", lambda a, c: c.sinks(), parent=ns, read=True)
    nc = client("put", "create or replace a sink from a JSON file (- for stdin)", run=_put_sink, parent=ns)
    nc.add_argument("name")
    nc.add_argument("spec_file")
    client("get", "show a sink", lambda a, c: c.get_sink(a.name), parent=ns, read=True).add_argument("name")
    client("delete", "delete a sink", lambda a, c: c.delete_sink(a.name), parent=ns).add_argument("name")
    nc = client("dead", "the events a sink refused past its retry budget, newest first",
                lambda a, c: c.sink_dead(a.name, a.limit), parent=ns, read=True)
    nc.add_argument("name")
    nc.add_argument("--limit", type=int, default=RUNS_SHOWN_DEFAULT, help="events shown")
    nc = client("requeue", "deliver a sink's dead events again (all, or --event ID ...)",
                lambda a, c: c.sink_requeue(a.name, a.events), parent=ns)
    nc.add_argument("name")
    nc.add_argument("--event", action="append", dest="events", help="an event id (repeat for several)")

    # Secrets at rest (docs/operations.md, "Key files"): the keys, and the rotation (admin).
    ss = _group(sub, "secrets", help="job secrets at rest: new-key, status, rotate-key")
    nk = ss.add_parser("new-key", help="write a new key file into a key ring (copy it to every node's)")
    nk.add_argument("--keys-dir", default=".raftsched/keys", help="the key ring (default: .raftsched/keys)")
    nk.add_argument("--id", help="the key's id (default: 8 random hex digits)")
    nk.set_defaults(func=_new_key)
    client("status", "the key new secrets are sealed under, and how many stored values each key holds",
           lambda a, c: c.secrets_status(), parent=ss, read=True)
    client("rotate-key", "seal every stored secret value under KEY (every node's ring must hold it)",
           lambda a, c: c.rotate_seal_key(a.key), parent=ss).add_argument("key")

    comp = sub.add_parser("completion", help="print a shell completion script: "
                                             "eval \"$(raftsched completion bash)\" (or zsh)")
    comp.add_argument("shell", choices=("bash", "zsh"))
    comp.set_defaults(func=lambda a: _completion(p, a.shell))

    argv, command = lock_cli.split_command(sys.argv[1:] if argv is None else list(argv))
    top_error = p.error

    def error(message: str) -> NoReturn:
        # Arguments no parser took are the subcommand's to refuse, with its usage: a walk's
        # mistyped flag (`runs NAME --bogus`) printed the forty commands' usage instead.
        chosen = _chosen_parser(p, argv)
        if message.startswith("unrecognized arguments") and chosen is not p:
            chosen.error(message)
        top_error(message)
    p.error = error  # type: ignore[method-assign]
    args = p.parse_args(argv)
    if args.cmd == "lock":
        args.command = command
    try:
        rc = args.func(args)
        sys.stdout.flush()  # inside the try: a closed pipe is found here for a short answer
        return rc
    except BrokenPipeError:
        # The reader went away (raftsched runs X | head -1): what it did not read is dropped;
        # stdout is pointed at /dev/null so that the interpreter's final flush says nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended


def _version() -> str:
    from . import __version__
    return __version__


def _completion(parser: argparse.ArgumentParser, shell: str) -> int:
    """``raftsched completion bash|zsh``: shtab's completion script of the whole parser."""
    import shtab
    print(shtab.complete(parser, shell=shell))
    return 0


if __name__ == "__main__":
    sys.exit(main())
