"""Real node processes for integration tests: free loopback ports, deadlines, stop by PID.

Every process started here is recorded and killed by its PID at teardown, whatever the test did.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (bound together, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def wait_for(cond, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``cond`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # a node not yet listening, etc.
            last_exc = e
        time.sleep(interval_s)  # ok-sleep: polling interval inside a deadline loop
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}" + (f" (last error: {last_exc!r})" if last_exc else ""))


def http(method: str, url: str, body=None, token: str | None = None, headers: dict | None = None, timeout: float = 10.0):
    """Returns (status, json body or text)."""
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
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class Cluster:
    """n raftsched node processes on free loopback ports, each with its own data dir."""

    def __init__(self, tmp: Path, n: int = 3, secret: str | None = "s" * 32, token: str = "t" * 32,
                 env: dict | None = None, node_args: list[str] | None = None,
                 node_env=None, cwd: Path | None = None) -> None:
        """``env`` is added to every node's environment; ``node_env`` to one node's: a mapping
        ``{index: {var: value}}`` or a callable ``index -> {var: value}`` (e.g. a per-node log path,
        which must differ between nodes because leadership moves). ``cwd`` is where the nodes run
        (default: the repository), so ``python -m raftsched.cli`` imports the code found there."""
        self.tmp = Path(tmp)
        self.node_args = list(node_args or [])
        self.n = n
        self.token = token
        self.env = env or {}
        self.node_env = node_env
        self.cwd = Path(cwd) if cwd is not None else REPO
        ports = free_ports(2 * n)
        self.api_ports = ports[:n]
        self.raft_ports = ports[n:]
        self.procs: dict[int, subprocess.Popen] = {}
        self.stopped: set[int] = set()
        self.secret_file = self.tmp / "secret"
        self.token_file = self.tmp / "token"
        old = os.umask(0o077)
        try:
            if secret is not None:
                self.secret_file.write_text(secret + "\n")
            self.token_file.write_text(token + "\n")
        finally:
            os.umask(old)

    def raft_addr(self, i: int) -> str:
        return f"127.0.0.1:{self.raft_ports[i]}"

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.api_ports[i]}"

    def data_dir(self, i: int) -> Path:
        return self.tmp / f"node-{i + 1}"

    def argv(self, i: int) -> list[str]:
        peers = ",".join(self.raft_addr(j) for j in range(self.n) if j != i)
        argv = [sys.executable, "-m", "raftsched.cli", "node", "--id", f"node-{i + 1}",
                "--api", f"127.0.0.1:{self.api_ports[i]}", "--raft", self.raft_addr(i),
                "--data-dir", str(self.data_dir(i)), "--cluster-secret-file", str(self.secret_file),
                "--token-file", str(self.token_file)]
        if peers:
            argv += ["--peers", peers]
        return argv + self.node_args

    def start(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(self.n)):
            self.data_dir(j).mkdir(parents=True, exist_ok=True)
            log = open(self.data_dir(j) / "node.log", "ab")
            self.procs[j] = subprocess.Popen(self.argv(j), stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                             env=self.env_of(j))
            log.close()

    def env_of(self, i: int) -> dict:
        """The environment node i starts with: ours, ``env``, then ``node_env`` for node i."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        extra = self.node_env(i) if callable(self.node_env) else (self.node_env or {}).get(i, {})
        env.update(extra or {})
        return env

    def node_of_worker(self, worker: str) -> int:
        """The index of the node whose worker id ("node-N/pid") is given."""
        return int(worker.split("/")[0].split("-")[1]) - 1

    def alive(self) -> list[int]:
        """Nodes whose process runs and is not stopped by SIGSTOP (a stopped one answers nothing)."""
        return [i for i, p in self.procs.items() if p.poll() is None and i not in self.stopped]

    def kill(self, i: int, sig=signal.SIGKILL) -> None:
        p = self.procs.get(i)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)
            if sig == signal.SIGSTOP:
                self.stopped.add(i)
            elif sig == signal.SIGCONT:
                self.stopped.discard(i)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                p.wait(timeout=15)

    def stop(self) -> None:
        for i, p in list(self.procs.items()):
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

    def get(self, i: int, path: str):
        return http("GET", self.url(i) + path)

    def call(self, i: int, method: str, path: str, body=None, **kw):
        return http(method, self.url(i) + path, body, token=self.token, **kw)

    def status(self, i: int) -> dict | None:
        try:
            s, b = self.get(i, "/v1/cluster")
            return b if s == 200 else None
        except OSError:
            return None

    def leader(self, among=None) -> int | None:
        """The index of the node that all live nodes agree leads, or None."""
        among = self.alive() if among is None else among
        sts = {i: self.status(i) for i in among}
        if any(s is None for s in sts.values()):
            return None
        leaders = {s["leader"] for s in sts.values()}
        if len(leaders) != 1 or None in leaders:
            return None
        addr = leaders.pop()
        for i in among:
            if self.raft_addr(i) == addr and sts[i]["role"] == "leader":
                return i
        return None

    def wait_leader(self, timeout_s: float = 30, among=None) -> int:
        def cond():
            i = self.leader(among)
            return None if i is None else (i,)
        return wait_for(cond, timeout_s, "one agreed leader")[0]

    def log_tail(self, i: int, n: int = 40) -> str:
        try:
            return "\n".join((self.data_dir(i) / "node.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
