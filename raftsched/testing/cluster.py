"""A local cluster of real ``raftsched node`` processes, and the one rule for "the agreed leader".

The same harness serves the integration tests (tests/), the fault harness (jepsen-style/) and the
benchmark (scripts/bench.py); ``scripts/cluster.sh`` asks :func:`main` which node leads, so a
user's script and the tests agree on what "the leader" means.

**The agreed leader** (one rule, :func:`agreed_leader`). Some nodes are asked for
``GET /v1/cluster``. Node L is the agreed leader when

1. L answers, and its answer says ``role: leader``; and
2. a majority of the cluster's voting members (more than half of them, L included) answer
   naming L's Raft address as their ``leader``.

Two nodes can never both pass: two majorities share a member, and a member names one leader.
And a majority following L is what Raft itself needs before L can commit anything, so a node that
only believes it leads (an old leader cut off from the others, until it steps down) is never the
agreed one. With ``unanimous=True`` the rule also asks that every node asked answers and names L:
that is what a caller needs before it talks to each of those nodes (a test that writes through a
follower, the fault harness's final reads, ``cluster.sh restart N`` waiting for node N to know
the leader). The fault harness's nemesis, which must find the leader while another node is down
or cut off, asks the majority only.

The voting members are the caller's to say (``voters``; by default every node of ``members``):
once the members change online (``raftsched members``), a learner catching up, or a node just
removed, answers too, but its word counts for nothing.

Standard library only: ``scripts/cluster.sh`` runs this module with a bare interpreter.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .procs import HOST, Procs, free_ports, wait_for

#: Where the raftsched package the harness imported lives: the nodes run from there by default
#: (``python -m raftsched.cli`` imports the code found in its working directory first), so a
#: test starts the very code it imported.
CODE_ROOT = Path(__file__).resolve().parents[2]
#: The command that runs the CLI, before its ``node`` subcommand: this interpreter.
NODE_COMMAND = (sys.executable, "-m", "raftsched.cli")


# ------------------------------------------------------------------------------------ HTTP

def http(method: str, url: str, body=None, token: str | None = None, headers: dict | None = None,
         timeout: float = 10.0, context=None):
    """One request to a node's API; returns ``(status, JSON body)``, or the text when the body
    is not JSON. An HTTP error status is returned, not raised; a connection error raises
    ``OSError``.

    :param body: JSON-encoded unless already ``bytes``.
    :param token: sent as ``Authorization: Bearer``.
    :param context: an ``ssl.SSLContext`` for ``https://`` URLs (one that trusts the nodes' CA).
    """
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


# ------------------------------------------------------------------------------------ the rule

def majority(members: int) -> int:
    """The smallest number of members that is more than half of ``members``."""
    return members // 2 + 1


def agreed_leader(answers: Mapping[int, dict | None], members: Sequence[str] | Mapping[int, str],
                  unanimous: bool = False, voters: Collection[str] | None = None) -> int | None:
    """The agreed leader among the answers, by the rule in this module's docstring, or None.

    :param answers: the ``/v1/cluster`` bodies of the nodes asked, by their index in
        ``members``; None for a node that did not answer (or answered as someone else).
    :param members: every node's Raft address (``host:port``), by index (a list, or a mapping
        when the indexes have gaps): the whole cluster, whether asked or not, since the
        majority is a majority of the cluster.
    :param unanimous: also require every node asked to answer and to name the leader.
    :param voters: the Raft addresses of the voting members (default: every one of
        ``members``); only their answers count toward the majority, and the leader is one.
    :returns: the leader's index in ``members``.
    """
    addrs = members if isinstance(members, Mapping) else dict(enumerate(members))
    voting = set(addrs.values()) if voters is None else set(voters)
    named = Counter(a.get("leader") for i, a in answers.items() if a and addrs.get(i) in voting)
    for i, a in answers.items():
        if not a or a.get("role") != "leader" or addrs.get(i) not in voting:
            continue
        votes = named.get(addrs[i], 0)
        if votes >= majority(len(voting)) and (
                not unanimous or all(x and x.get("leader") == addrs[i] for x in answers.values())):
            return i
    return None


# ------------------------------------------------------------------------------------ one node

@dataclass(frozen=True)
class NodeSpec:
    """Everything one ``raftsched node`` command line says: the one place it is written.

    :param peers: the other members' Raft addresses; empty for a one-node cluster.
    :param extra_args: more flags, appended (``--slots 0``, ``--lease-ttl-s 2``, ...).
    """

    id: str
    api: str
    raft: str
    peers: tuple[str, ...]
    data_dir: Path
    secret_file: Path
    token_file: Path
    extra_args: tuple[str, ...] = ()

    def argv(self, command: Sequence[str] = NODE_COMMAND) -> list[str]:
        """The command line: ``command`` (default: this interpreter running the CLI), then
        ``node`` and the flags."""
        argv = [*command, "node", "--id", self.id, "--api", self.api, "--raft", self.raft,
                "--data-dir", str(self.data_dir), "--cluster-secret-file", str(self.secret_file),
                "--token-file", str(self.token_file)]
        if self.peers:
            argv += ["--peers", ",".join(self.peers)]
        return argv + with_any_year_env(list(self.extra_args))


#: The any-year run's clock shim (scripts/test.sh, scripts/anyyear/): a run gets a clean
#: environment, so a node started under the shim is told to pass it on, and its runs read the
#: same moved clock as the node that fired them.
ANY_YEAR_ENV = ("LD_PRELOAD", "SHIFT_WALL_S")


def with_any_year_env(args: list[str]) -> list[str]:
    """``args`` with ANY_YEAR_ENV added to its ``--pass-env`` (or a ``--pass-env`` added) when
    this process runs under the any-year shim; ``args`` unchanged otherwise."""
    if not all(os.environ.get(n) for n in ANY_YEAR_ENV):
        return args
    out = list(args)
    if "--pass-env" in out:
        i = out.index("--pass-env") + 1
        names = [n for n in out[i].split(",") if n]
        out[i] = ",".join(dict.fromkeys(names + list(ANY_YEAR_ENV)))
        return out
    return out + ["--pass-env", ",".join(ANY_YEAR_ENV)]


def write_private(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only: created under umask 077, so it is never
    readable by others, not even for a moment (the node refuses a secret others can read)."""
    old = os.umask(0o077)
    try:
        Path(path).write_text(text)
    finally:
        os.umask(old)


# ------------------------------------------------------------------------------------ a cluster

def _with_flags(node_args, flags: list[str]):
    """``node_args`` (a list, a callable ``index -> list`` or None) with ``flags`` added."""
    if callable(node_args):
        return lambda i: [*node_args(i), *flags]
    return [*(node_args or []), *flags]


class LocalCluster:
    """``n`` raftsched node processes on free loopback ports, each with its own data directory
    under ``tmp`` (``node-1``, ``node-2``, ...), its log at ``node-N/node.log``, one shared
    cluster secret file and one shared token file.

    Node ``i`` (0-based) is ``node-{i + 1}``. Every process started is stopped by its PID in
    :meth:`stop` (or on leaving a ``with`` block), whatever happened in between.

    :param secret: the cluster secret, or None to write no secret file (a node then refuses to
        start: a test of that refusal).
    :param env: added to every node's environment.
    :param node_args: flags added to every node's command line: a list, or a callable
        ``index -> list`` for flags that differ between nodes (the jepsen-style harness's dial
        map and clock file).
    :param node_env: added to one node's environment: a mapping ``{index: {var: value}}`` or a
        callable ``index -> {var: value}`` (e.g. a per-node log path, which must differ between
        nodes because leadership moves).
    :param cwd: where the nodes run (default: :data:`CODE_ROOT`), so ``python -m raftsched.cli``
        imports the code found there.
    :param ports: ``(api_ports, raft_ports)`` chosen by the caller (who needs more ports than
        these and allocates them in one :func:`free_ports` call); default: fresh free ports.
    :param new_session: start each node in a session of its own (see :class:`Procs`).
    :param tls: ``"server"``: the nodes serve the API over TLS, with certificates of a CA made
        for the cluster (raftsched.testing.tls, in ``tmp/tls``); ``"mutual"``: clients must also
        present a certificate of that CA. The harness's own requests trust that CA (and present
        its client certificate).

    The members change online: :meth:`add_node` starts one more node that joins (``--join``),
    :meth:`add_member` and :meth:`remove_member` ask the cluster, and ``voters`` (the indexes of
    the voting members, every node at first) follows, for :meth:`leader`'s majority.
    """

    def __init__(self, tmp: Path, n: int = 3, secret: str | None = "s" * 32, token: str = "t" * 32,
                 env: dict | None = None, node_args: Sequence[str] | Callable[[int], Sequence[str]] | None = None,
                 node_env: Mapping[int, dict] | Callable[[int], dict] | None = None, cwd: Path | None = None,
                 ports: tuple[Sequence[int], Sequence[int]] | None = None, new_session: bool = False,
                 tls: str | None = None) -> None:
        self.tmp = Path(tmp)
        self.tls = None
        self.ssl_context = None
        if tls is not None:
            if tls not in ("server", "mutual"):
                raise ValueError(f"tls is 'server' or 'mutual', not {tls!r}")
            from .tls import make_demo_pki  # cryptography: only when asked for
            self.tls = make_demo_pki(self.tmp / "tls")
            self.ssl_context = ssl.create_default_context(cafile=str(self.tls.ca))
            if tls == "mutual":
                self.ssl_context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
            flags = ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
            if tls == "mutual":
                flags += ["--tls-client-ca", str(self.tls.ca)]
            node_args = _with_flags(node_args, flags)
        self.node_args = node_args if callable(node_args) else list(node_args or [])
        self.n = n
        self.token = token
        self.env = env or {}
        self.node_env = node_env
        self.cwd = Path(cwd) if cwd is not None else CODE_ROOT
        if ports is None:
            free = free_ports(2 * n)
            ports = (free[:n], free[n:])
        self.api_ports = list(ports[0])
        self.raft_ports = list(ports[1])
        assert len(self.api_ports) == len(self.raft_ports) == n, "one API and one Raft port per node"
        self.children = Procs(new_session=new_session)
        #: the voting members' indexes; nodes added later join with the peers they were given
        self.voters: set[int] = set(range(n))
        self._joined: dict[int, tuple[str, ...]] = {}
        self.secret_file = self.tmp / "secret"
        self.token_file = self.tmp / "token"
        #: the nodes' key ring (their default --keys-dir, beside the secret): one key, k1
        self.keys_dir = self.tmp / "keys"
        if secret is not None:
            write_private(self.secret_file, secret + "\n")
            if not any(self.keys_dir.glob("*.key")):
                from ..sealing import new_key_file  # cryptography: not for the probe (standard library only)
                new_key_file(str(self.keys_dir), "k1")
        write_private(self.token_file, token + "\n")

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- addresses and files
    @property
    def procs(self) -> dict:
        """The node processes (``subprocess.Popen``) by index: the last one started for each."""
        return self.children.procs

    @property
    def stopped(self) -> set[int]:
        """Indexes of the nodes paused with SIGSTOP (they answer nothing)."""
        return self.children.paused

    @property
    def members(self) -> list[str]:
        """Every node's Raft address, by index."""
        return [self.raft_addr(i) for i in range(self.n)]

    def raft_addr(self, i: int) -> str:
        return f"{HOST}:{self.raft_ports[i]}"

    def url(self, i: int) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.api_ports[i]}"

    def node_id(self, i: int) -> str:
        return f"node-{i + 1}"

    def data_dir(self, i: int) -> Path:
        return self.tmp / self.node_id(i)

    def log_path(self, i: int) -> Path:
        return self.data_dir(i) / "node.log"

    def node_of_worker(self, worker: str) -> int:
        """The index of the node whose worker id ("node-N/pid") is given."""
        return int(worker.split("/")[0].split("-")[1]) - 1

    # -------------------------------------------------------------- processes
    def spec(self, i: int) -> NodeSpec:
        """Node i's command line, as data. A node added later joins (``--join``) the members it
        was given; a first one has the other first ones as peers (once the members changed,
        its log, not its command line, says who they are)."""
        extra = tuple(self.node_args(i) if callable(self.node_args) else self.node_args)
        if i in self._joined:
            peers, extra = self._joined[i], ("--join", *extra)
        else:
            peers = tuple(self.raft_addr(j) for j in range(self.n) if j != i and j not in self._joined)
        return NodeSpec(id=self.node_id(i), api=f"{HOST}:{self.api_ports[i]}", raft=self.raft_addr(i),
                        peers=peers, data_dir=self.data_dir(i), secret_file=self.secret_file,
                        token_file=self.token_file, extra_args=extra)

    def add_node(self, ports: tuple[int, int] | None = None, start: bool = True) -> int:
        """One more node, on fresh ports (or ``(api_port, raft_port)``), that joins the current
        voters (``--join``): a learner once added (:meth:`add_member`). Returns its index."""
        api, raft = ports if ports is not None else free_ports(2)
        i = self.n
        self.api_ports.append(api)
        self.raft_ports.append(raft)
        self.n += 1
        self._joined[i] = tuple(self.raft_addr(j) for j in sorted(self.voters))
        if start:
            self.start(i)
        return i

    def set_joining(self, i: int, members: Sequence[int]) -> None:
        """Node i's next start joins (``--join``) the nodes ``members`` (a slot reused after a
        removal, on a fresh data directory)."""
        self._joined[i] = tuple(self.raft_addr(j) for j in sorted(members))

    def add_member(self, i: int, via: int | None = None, wait_s: float = 60.0) -> dict:
        """Ask the cluster (through node ``via``, default the leader) to add node i, then wait
        until every voter's ``/v1/cluster`` lists it as a voter; ``voters`` then has it."""
        via = self.wait_leader(30) if via is None else via
        s, b = self.call(via, "POST", "/v1/cluster/members", {"addr": self.raft_addr(i)})
        if s not in (200, 202):
            raise RuntimeError(f"adding node {i + 1} failed: {s} {b}")
        addr = self.raft_addr(i)
        wait_for(lambda: addr in ((self.status(via) or {}).get("members") or []), wait_s, f"node {i + 1} a voter")
        self.voters.add(i)
        return b

    def remove_member(self, i: int, via: int | None = None) -> dict:
        """Ask the cluster (through node ``via``, default the leader) to remove node i;
        ``voters`` then has it no more. The process is left running (stop it by its PID)."""
        via = self.wait_leader(30) if via is None else via
        s, b = self.call(via, "DELETE", f"/v1/cluster/members/{self.raft_addr(i)}")
        if s != 200:
            raise RuntimeError(f"removing node {i + 1} failed: {s} {b}")
        self.voters.discard(i)
        return b

    def argv(self, i: int) -> list[str]:
        return self.spec(i).argv()

    def node_env_of(self, i: int) -> dict:
        """What node i's environment adds: ``env``, then ``node_env`` for node i."""
        extra = self.node_env(i) if callable(self.node_env) else (self.node_env or {}).get(i, {})
        return {**self.env, **(extra or {})}

    def env_of(self, i: int) -> dict:
        """The environment node i starts with: ours, ``PYTHONUNBUFFERED``, ``env``, then
        ``node_env`` for node i."""
        return dict(os.environ, PYTHONUNBUFFERED="1", **self.node_env_of(i))

    def start(self, i: int | None = None) -> None:
        """Start node i (default: every node) on its data directory."""
        for j in ([i] if i is not None else range(self.n)):
            # Private to the node's user: a node refuses a data directory others may read.
            self.data_dir(j).mkdir(mode=0o700, parents=True, exist_ok=True)
            self.data_dir(j).chmod(0o700)
            self.children.start(j, self.argv(j), self.log_path(j), env=self.node_env_of(j), cwd=self.cwd)

    def alive(self) -> list[int]:
        """Nodes whose process runs and is not stopped by SIGSTOP (a stopped one answers nothing)."""
        return [i for i, p in self.procs.items() if p.poll() is None and i not in self.stopped]

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to node i by its PID (see :meth:`Procs.signal`)."""
        self.children.signal(i, sig)

    def stop(self) -> None:
        """Stop every node: SIGCONT and SIGTERM, SIGKILL after 10 s."""
        self.children.stop_all()

    def log_tail(self, i: int, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path(i).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -------------------------------------------------------------- the API
    def get(self, i: int, path: str, **kw):
        """A GET with the cluster's token (every request but /healthz needs one), unless
        ``token`` says otherwise."""
        kw.setdefault("token", self.token)
        kw.setdefault("context", self.ssl_context)
        return http("GET", self.url(i) + path, **kw)

    def call(self, i: int, method: str, path: str, body=None, **kw):
        """A request with the cluster's token."""
        kw.setdefault("context", self.ssl_context)
        return http(method, self.url(i) + path, body, token=self.token, **kw)

    def status(self, i: int, timeout_s: float = 10.0) -> dict | None:
        """Node i's ``/v1/cluster``, or None when it does not answer 200."""
        try:
            s, b = self.get(i, "/v1/cluster", timeout=timeout_s)
            return b if s == 200 and isinstance(b, dict) else None
        except OSError:
            return None

    def leader(self, among: Sequence[int] | None = None, unanimous: bool = True) -> int | None:
        """The agreed leader (:func:`agreed_leader`) among the nodes ``among`` (default: the
        live ones), or None. By default every node asked must answer and name it: the caller
        goes on to talk to those nodes."""
        among = [i for i in self.alive() if i in self.voters] if among is None else among
        return agreed_leader({i: self.status(i) for i in among}, self.members, unanimous,
                             voters=[self.raft_addr(i) for i in self.voters])

    def wait_leader(self, timeout_s: float = 30, among: Sequence[int] | None = None) -> int:
        """Wait for :meth:`leader` and return it.

        :raises WaitTimeout: when there is none within ``timeout_s``.
        """
        def cond():
            i = self.leader(among)
            return None if i is None else (i,)
        return wait_for(cond, timeout_s, "one agreed leader")[0]


# ------------------------------------------------------------------------------------ cluster.sh

def probe(urls: Mapping[int, str], members: Sequence[str], token: str | None,
          timeout_s: float, context=None) -> dict[int, dict | str]:
    """Ask each node of ``urls`` (index -> API URL) for ``/v1/cluster`` at once. A node whose
    body names another node id than ``node-{index + 1}`` (another process on its port) counts
    as not answering. Returns each node's body, or the reason it has none."""
    def ask(i: int) -> dict | str:
        try:
            s, b = http("GET", urls[i] + "/v1/cluster", token=token, timeout=timeout_s, context=context)
        except ssl.SSLError as e:
            return f"TLS failed: {e}"
        except OSError as e:
            if isinstance(getattr(e, "reason", None), ssl.SSLError):
                return f"TLS failed: {e.reason}"
            return "no response"
        if not isinstance(b, dict):
            return "no valid JSON from /v1/cluster" if b else "no response"
        if s != 200 or "role" not in b:
            return "unexpected /v1/cluster response: " + json.dumps(b)[:200]
        if b.get("node") != f"node-{i + 1}":
            return f"port answered by {b.get('node')!r}, not node-{i + 1}"
        return b

    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return dict(zip(urls, pool.map(ask, urls)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raftsched.testing.cluster probe N...``: for scripts/cluster.sh, ask nodes
    numbered N (from 1, as the script numbers them; node N serves its API on ``--api-base + N``)
    for ``/v1/cluster`` and print tab-separated lines, ``-`` for an empty field (bash's ``read``
    merges empty fields)::

        node N ok ROLE LEADER TERM COMMIT_INDEX PID
        node N error REASON
        leader N RAFT_ADDRESS TERM PID        (or: leader -)
        majority N RAFT_ADDRESS TERM PID      (or: majority -)
        members VOTERS LEARNERS               (as that leader says, comma-separated; or: members -)

    ``leader`` is the agreed leader named by every node asked (unanimous), ``majority`` the one
    a majority of the cluster names. ``--members`` is how many nodes the cluster has (nodes 1 to
    N), or the numbers of its voting members, comma-separated, once they changed online. Exit
    status 0."""
    ap = argparse.ArgumentParser(prog="python -m raftsched.testing.cluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="ask nodes for /v1/cluster and print the agreed leader")
    p.add_argument("--host", default=HOST)
    p.add_argument("--api-base", type=int, required=True, help="node N serves its API on this + N")
    p.add_argument("--raft-base", type=int, required=True, help="node N's Raft port is this + N")
    p.add_argument("--members", default="3",
                   help="how many nodes the cluster has (1..N), or its voting members' numbers, comma-separated")
    p.add_argument("--token-file", help="sent as a bearer token when readable")
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--ca-file", help="the nodes serve TLS: trust this CA (PEM)")
    p.add_argument("--client-cert", help="present this client certificate (PEM; mutual TLS)")
    p.add_argument("--client-key", help="the key of --client-cert")
    p.add_argument("nodes", type=int, nargs="*", help="the node numbers to ask")
    args = ap.parse_args(argv)
    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip() or None
        except OSError:
            pass
    try:
        numbers = [int(x) for x in args.members.split(",") if x.strip()] if "," in args.members \
            else list(range(1, int(args.members) + 1))
    except ValueError:
        ap.error(f"--members: a count or comma-separated node numbers, not {args.members!r}")
    members = {n - 1: f"{args.host}:{args.raft_base + n}" for n in [*numbers, *args.nodes]}
    voters = [members[n - 1] for n in numbers]
    context = None
    if args.ca_file:
        context = ssl.create_default_context(cafile=args.ca_file)
        if args.client_cert:
            context.load_cert_chain(args.client_cert, args.client_key)
    scheme = "https" if context is not None else "http"
    got = probe({n - 1: f"{scheme}://{args.host}:{args.api_base + n}" for n in args.nodes}, members, token,
                args.timeout_s, context)
    answers = {i: b if isinstance(b, dict) else None for i, b in got.items()}

    def f(v) -> str:
        return "-" if v is None or v == "" else str(v)
    for i, b in got.items():
        if isinstance(b, dict):
            if (b.get("membership") or {}).get("self") == "none":  # removed (or never added): it says its old role
                b = dict(b, role="NOT-A-MEMBER")
            print("\t".join(["node", str(i + 1), "ok"] + [f(b.get(k)) for k in ("role", "leader", "term",
                                                                               "commit_index", "pid")]))
        else:
            print("\t".join(["node", str(i + 1), "error", b.replace("\t", " ")]))
    said = None
    for kind, unanimous in (("leader", True), ("majority", False)):
        i = agreed_leader(answers, members, unanimous, voters=voters) if answers else None
        if i is None:
            print(f"{kind}\t-")
        else:
            print("\t".join([kind, str(i + 1), members[i], f(got[i].get("term")), f(got[i].get("pid"))]))
            said = said if said is not None else got[i]
    # The members as the leader has them: a change made through the API, a learner catching up.
    if isinstance(said, dict):
        print("\t".join(["members", f(",".join(said.get("members") or ())), f(",".join(said.get("learners") or ()))]))
    else:
        print("members\t-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
