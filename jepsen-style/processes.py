"""The processes of one run: three nodes, the fenced sink and the link proxies. Every process is
started through :class:`Procs` and stopped by its PID, whatever happens (``stop_all`` in a
``finally``)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


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


def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")
            time.sleep(0.05)  # ok-sleep: polling inside a deadline


class Procs:
    """Named child processes, each stopped by its PID."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.paused: set[str] = set()

    def start(self, name: str, argv: list[str], log_path: Path, env: dict | None = None,
              cwd: Path = REPO) -> subprocess.Popen:
        old = self.procs.get(name)
        assert old is None or old.poll() is not None, f"{name} is still running"
        log = open(log_path, "ab")
        try:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                 start_new_session=True)
        finally:
            log.close()
        self.procs[name] = p
        self.paused.discard(name)
        return p

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def pid(self, name: str) -> int | None:
        p = self.procs.get(name)
        return p.pid if p is not None else None

    def signal(self, name: str, sig: int) -> bool:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return False
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            return False
        if sig == signal.SIGSTOP:
            self.paused.add(name)
        elif sig in (signal.SIGCONT, signal.SIGKILL):
            self.paused.discard(name)
        if sig == signal.SIGKILL:
            p.wait(timeout=15)
        return True

    def stop(self, name: str, timeout_s: float = 10.0) -> None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        try:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGTERM)
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.paused.discard(name)

    def stop_all(self) -> None:
        for name in list(self.procs):
            try:
                self.stop(name)
            except Exception as e:  # keep stopping the others
                print(f"processes: stopping {name} failed: {e!r}", file=sys.stderr)


class Node:
    def __init__(self, i: int, api_port: int, raft_port: int, work: Path) -> None:
        self.i = i
        self.id = f"node-{i + 1}"
        self.api_port = api_port
        self.raft_port = raft_port
        self.raft = f"127.0.0.1:{raft_port}"
        self.url = f"http://127.0.0.1:{api_port}"
        self.data_dir = work / self.id
        self.log = work / f"{self.id}.log"
        self.clock_file = work / f"{self.id}.clock-offset-ms"


class ClusterProcs:
    """Three nodes dialling each other through one proxy per link, a sink, a proxy process."""

    def __init__(self, work: Path, lease_ttl_s: float, slots: int = 8, product: Path = REPO) -> None:
        self.work = work
        #: the source tree whose raftsched the nodes run (python -m puts its cwd first on sys.path)
        self.product = Path(product).resolve()
        self.procs = Procs()
        ports = free_ports(3 + 3 + 3 + 2)
        self.nodes = [Node(i, ports[i], ports[3 + i], work) for i in range(3)]
        self.link_ports = {}
        self.links: dict[str, dict] = {}
        for k, (a, b) in enumerate(((0, 1), (0, 2), (1, 2))):
            na, nb = self.nodes[a], self.nodes[b]
            # pysyncobj: only the node with the larger "host:port" (as a string) dials.
            dialer, acceptor = (na, nb) if na.raft > nb.raft else (nb, na)
            name = f"n{a + 1}-n{b + 1}"
            self.links[name] = {"nodes": (a, b), "port": ports[6 + k], "dialer": dialer.i, "acceptor": acceptor.i}
        self.sink_port, self.proxy_control = ports[9], ports[10]
        self.sink_log = work / "sink.jsonl"
        self.plan_file = work / "plan.json"
        self.secret_file = work / "secret"
        self.token_file = work / "token"
        self.token = "jepsen-token-" + os.urandom(8).hex()
        self.lease_ttl_s = lease_ttl_s
        # Run slots per worker: enough that one worker alone (the other paused or killed) has a
        # free slot for a retry at once, so a paused worker's stale write meets a newer attempt.
        self.slots = slots
        old = os.umask(0o077)
        try:
            self.secret_file.write_text("jepsen-secret-" + os.urandom(16).hex() + "\n")
            self.token_file.write_text(self.token + "\n")
        finally:
            os.umask(old)
        for n in self.nodes:
            n.clock_file.write_text("0\n")

    def link_between(self, a: int, b: int) -> str:
        for name, l in self.links.items():
            if set(l["nodes"]) == {a, b}:
                return name
        raise KeyError((a, b))

    def start_sink(self) -> None:
        self.procs.start("sink", [sys.executable, str(HERE / "sink.py"), "--port", str(self.sink_port),
                                  "--log", str(self.sink_log)], self.work / "sink.out")
        wait_port(self.sink_port, 15)

    def start_proxy(self) -> None:
        argv = [sys.executable, str(HERE / "proxy.py"), "--control", str(self.proxy_control)]
        for name, l in self.links.items():
            argv += ["--link", f"{name}:{l['port']}:{self.nodes[l['acceptor']].raft_port}"]
        self.procs.start("proxy", argv, self.work / "proxy.log")
        wait_port(self.proxy_control, 15)

    def set_link(self, name: str, mode: str) -> None:
        with socket.create_connection(("127.0.0.1", self.proxy_control), timeout=5) as s:
            s.sendall((json.dumps({"link": name, "mode": mode}) + "\n").encode())
            ans = json.loads(s.makefile().readline())
        if not ans.get("ok"):
            raise RuntimeError(f"proxy refused {name} {mode}: {ans}")

    def node_env(self, n: Node) -> dict:
        path = os.environ.get("PYTHONPATH")
        return {
            "PYTHONPATH": os.pathsep.join([str(self.product), str(HERE)] + ([path] if path else [])),
            "JEPSEN_SINK": f"127.0.0.1:{self.sink_port}",
            "JEPSEN_PLAN": str(self.plan_file),
            "JEPSEN_NODE": n.id,
        }

    def node_argv(self, n: Node) -> list[str]:
        peers = ",".join(m.raft for m in self.nodes if m is not n)
        dial = []
        for l in self.links.values():
            if l["dialer"] == n.i:
                dial.append(f"{self.nodes[l['acceptor']].raft}=127.0.0.1:{l['port']}")
        return [sys.executable, "-m", "raftsched.cli", "node", "--id", n.id,
                "--api", f"127.0.0.1:{n.api_port}", "--raft", n.raft, "--peers", peers,
                "--data-dir", str(n.data_dir), "--cluster-secret-file", str(self.secret_file),
                "--token-file", str(self.token_file), "--slots", str(self.slots),
                "--lease-ttl-s", str(self.lease_ttl_s), "--executors", "python",
                "--dial-map", ",".join(dial), "--clock-offset-file", str(n.clock_file)]

    def start_node(self, i: int) -> None:
        n = self.nodes[i]
        n.data_dir.mkdir(parents=True, exist_ok=True)
        self.procs.start(n.id, self.node_argv(n), n.log, self.node_env(n), cwd=self.product)

    def node_alive(self, i: int) -> bool:
        return self.procs.alive(self.nodes[i].id)

    def node_paused(self, i: int) -> bool:
        return self.nodes[i].id in self.procs.paused

    def signal_node(self, i: int, sig: int) -> bool:
        return self.procs.signal(self.nodes[i].id, sig)

    def set_clock(self, i: int, offset_ms: int) -> None:
        f = self.nodes[i].clock_file
        tmp = f.with_suffix(".tmp")
        tmp.write_text(f"{int(offset_ms)}\n")
        os.replace(tmp, f)
