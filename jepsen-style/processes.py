"""The processes of one run: three nodes (the package's harness, raftsched.testing), two remote
workers (``raftsched worker``, outside the quorum), the fenced sink and the link proxies. What is
this harness's own: the nodes dial each other through one proxy per link, each remote worker
reaches each node's API through a proxy link of its own (so the nemesis can cut a worker off),
each node reads its clock offset from a file, the sink and the proxy run beside them, and every
process runs in a session of its own. Every process is stopped by its PID, whatever happens
(``stop_all`` in a ``finally``).

With ``spares`` (the membership nemesis), there are more node slots than members: every slot has
its ports, links and proxies from the start, and ``members`` says which slots are the cluster's
voters now. A spare joins (``raftsched node --join``) on a fresh data directory when the nemesis
adds it; a removed member is stopped and its slot becomes a spare."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from raftsched.testing.cluster import LocalCluster
from raftsched.replication import powerloss
from raftsched.testing.procs import Procs, free_ports, wait_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: What the workload's runs read of their worker's environment (jepsen_runner.py): passed
#: through to them (``--pass-env``), since a run gets a clean environment.
RUN_ENV = "JEPSEN_SINK,JEPSEN_PLAN,JEPSEN_NODE"


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (a node's or a worker's run server, and the runs it started),
    from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rpartition(b")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def signal_tree(procs: Procs, name, sig: int) -> bool:
    """``procs.signal(name, sig)``, and for SIGSTOP and SIGCONT the same to the process's
    descendants: a paused node (or worker) is a paused machine, whose runs, processes of their own
    started by its run server, pause with it. After SIGKILL, its descendants are continued, so
    that the run server (a paused one too) sees its worker gone and kills the runs."""
    p = procs.procs.get(name)
    pid = p.pid if p is not None and p.poll() is None else None
    below = descendants(pid) if pid is not None and sig in (signal.SIGCONT, signal.SIGKILL) else []
    if sig == signal.SIGCONT:
        _kill_all(below, sig)
    ok = procs.signal(name, sig)
    if pid is not None and sig == signal.SIGSTOP:
        for _ in range(2):  # a run started while the first pass ran is caught by the second
            _kill_all(descendants(pid), sig)
    if sig == signal.SIGKILL:
        _kill_all(below, signal.SIGCONT)
    return ok


def _kill_all(pids: list[int], sig: int) -> None:
    for d in pids:
        try:
            os.kill(d, sig)
        except OSError:
            pass


class Node:
    """One node's addresses and files, as the clients, the nemesis and the run read them."""

    def __init__(self, cluster: LocalCluster, i: int, work: Path) -> None:
        self.i = i
        self.id = cluster.node_id(i)
        self.api_port = cluster.api_ports[i]
        self.raft_port = cluster.raft_ports[i]
        self.raft = cluster.raft_addr(i)
        self.url = cluster.url(i)
        self.data_dir = cluster.data_dir(i)
        self.log = cluster.log_path(i)
        self.clock_file = work / f"{self.id}.clock-offset-ms"


class ClusterProcs:
    """Three nodes dialling each other through one proxy per link, remote workers reaching the
    nodes through proxy links of their own, a sink, a proxy process."""

    def __init__(self, work: Path, lease_ttl_s: float, slots: int = 8, product: Path = REPO,
                 remote_workers: tuple = (), worker_labels: dict | None = None,
                 power_model: bool = False, fsync: bool = True, spares: int = 0) -> None:
        self.work = work
        #: the nodes write through the power-loss model (``power_off``), and sync or not
        self.power_model = power_model
        self.fsync = fsync
        #: the source tree whose raftsched the nodes run (python -m puts its cwd first on sys.path)
        self.product = Path(product).resolve()
        #: the remote workers' ids, and the labels they carry (placed jobs run only on them)
        self.remote_workers = list(remote_workers)
        self.worker_labels = dict(worker_labels or {})
        # Every port of the run in one call, so that none of them can be handed out twice.
        total = 3 + spares
        pairs = [(a, b) for a in range(total) for b in range(a + 1, total)]
        ports = free_ports(2 * total + len(pairs) + 3 + total * len(self.remote_workers))
        self.token = "jepsen-token-" + os.urandom(8).hex()
        self.lease_ttl_s = lease_ttl_s
        # Run slots per worker: enough that one worker alone (the other paused or killed) has a
        # free slot for a retry at once, so a paused worker's stale write meets a newer attempt.
        self.slots = slots
        self.cluster = LocalCluster(
            work, n=3, secret="jepsen-secret-" + os.urandom(16).hex(), token=self.token,
            node_args=self.node_args,
            node_env=lambda i: self.node_env(self.nodes[i]), cwd=self.product,
            ports=(ports[0:3], ports[total:total + 3]), new_session=True)
        for k in range(3, total):  # the spares: slots that join when the nemesis adds them
            self.cluster.add_node(ports=(ports[k], ports[total + k]), start=False)
        self.nodes = [Node(self.cluster, i, work) for i in range(total)]
        #: the cluster's voting members now (slot indexes); the nemesis keeps it up to date
        self.members: list[int] = [0, 1, 2]
        #: the sink and the proxy (the nodes are the cluster's)
        self.procs = Procs(new_session=True)
        self.links: dict[str, dict] = {}
        base = 2 * total
        for k, (a, b) in enumerate(pairs):
            na, nb = self.nodes[a], self.nodes[b]
            # pysyncobj: only the node with the larger "host:port" (as a string) dials.
            dialer, acceptor = (na, nb) if na.raft > nb.raft else (nb, na)
            name = f"n{a + 1}-n{b + 1}"
            self.links[name] = {"nodes": (a, b), "port": ports[base + k], "dialer": dialer.i, "acceptor": acceptor.i}
        base += len(pairs)
        self.sink_port, self.proxy_control, self.events_port = ports[base], ports[base + 1], ports[base + 2]
        base += 3
        #: worker id -> {node index: its proxy link's name}; the worker's --url lists the links
        self.worker_links: dict[str, dict[int, str]] = {}
        for w, wid in enumerate(self.remote_workers):
            self.worker_links[wid] = {}
            for i in range(total):
                name = f"{wid}-n{i + 1}"
                self.links[name] = {"worker": wid, "node": i, "port": ports[base + total * w + i],
                                    "target": self.nodes[i].api_port}
                self.worker_links[wid][i] = name
        #: the remote workers run in this group, apart from the sink and the proxy
        self.workers = Procs(new_session=True)
        self.sink_log = work / "sink.jsonl"
        #: the notifications receiver (events_receiver.py): its log, and the webhook's signing key
        self.events_log = work / "events.jsonl"
        self.events_key = "jepsen-events-" + os.urandom(8).hex()
        self.plan_file = work / "plan.json"
        # The runs (as the run user) open the plan file by name: they may pass through the work
        # directory, not list it; the plan is made readable when written (run.py).
        os.chmod(work, 0o711)
        self.secret_file = self.cluster.secret_file
        self.token_file = self.cluster.token_file
        for n in self.nodes:
            n.clock_file.write_text("0\n")

    def link_between(self, a: int, b: int) -> str:
        for name, l in self.links.items():
            if "nodes" in l and set(l["nodes"]) == {a, b}:
                return name
        raise KeyError((a, b))

    def start_sink(self) -> None:
        self.procs.start("sink", [sys.executable, str(HERE / "sink.py"), "--port", str(self.sink_port),
                                  "--log", str(self.sink_log)], self.work / "sink.out", cwd=REPO)
        wait_port(self.sink_port, 15)

    def start_events(self) -> None:
        self.procs.start("events", [sys.executable, str(HERE / "events_receiver.py"), "--port", str(self.events_port),
                                    "--log", str(self.events_log), "--key", self.events_key],
                         self.work / "events.out", cwd=REPO)
        wait_port(self.events_port, 15)

    def start_proxy(self) -> None:
        argv = [sys.executable, str(HERE / "proxy.py"), "--control", str(self.proxy_control)]
        for name, l in self.links.items():
            target = l["target"] if "worker" in l else self.nodes[l["acceptor"]].raft_port
            argv += ["--link", f"{name}:{l['port']}:{target}"]
        self.procs.start("proxy", argv, self.work / "proxy.log", cwd=REPO)
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
            **({powerloss.ENV_VAR: "1"} if self.power_model else {}),
        }

    def node_args(self, i: int) -> list[str]:
        """Node i's flags: the shared ones, its peers' proxies (the dial map) and its clock file."""
        n = self.nodes[i]
        dial = [f"{self.nodes[l['acceptor']].raft}=127.0.0.1:{l['port']}"
                for l in self.links.values() if l.get("dialer") == n.i]
        return ["--slots", str(self.slots), "--lease-ttl-s", str(self.lease_ttl_s), "--executors", "python",
                "--pass-env", RUN_ENV, "--dial-map", ",".join(dial), "--clock-offset-file", str(n.clock_file)] \
            + (["--simulate-power-loss"] if self.power_model else []) + ([] if self.fsync else ["--no-fsync"])

    def start_node(self, i: int) -> None:
        self.cluster.start(i)

    def start_spare(self, i: int) -> None:
        """Start slot ``i`` as a new node that joins the current members: a fresh data
        directory (a slot used before keeps nothing of it), ``--join`` with the members as
        peers."""
        d = self.cluster.data_dir(i)
        if d.exists():
            shutil.rmtree(d)
        self.cluster.set_joining(i, self.members)
        self.cluster.start(i)

    def spare(self) -> int | None:
        """A slot that is no member and runs no process, or None."""
        for i in range(len(self.nodes)):
            if i not in self.members and not self.node_alive(i):
                return i
        return None

    # ------------------------------------------------------------------ remote workers
    def worker_log(self, wid: str) -> Path:
        return self.work / f"{wid}.log"

    def start_worker(self, wid: str) -> None:
        """Start remote worker ``wid``: ``raftsched worker`` with the fleet's labels, reaching
        the nodes through its proxy links, running the workload's python target."""
        urls = ",".join(f"http://127.0.0.1:{self.links[name]['port']}" for name in self.worker_links[wid].values())
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.worker_labels.items()))
        argv = [sys.executable, "-m", "raftsched.cli", "worker", "--url", urls, "--token-file", str(self.token_file),
                "--id", wid, "--slots", str(self.slots), "--lease-ttl-s", str(self.lease_ttl_s), "--executors", "python",
                "--wait-s", "5", "--drain-s", "1", "--pass-env", RUN_ENV] + (["--labels", labels] if labels else [])
        path = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": os.pathsep.join([str(self.product), str(HERE)] + ([path] if path else [])),
               "JEPSEN_SINK": f"127.0.0.1:{self.sink_port}", "JEPSEN_PLAN": str(self.plan_file), "JEPSEN_NODE": wid}
        self.workers.start(wid, argv, self.worker_log(wid), env=env, cwd=self.product)

    def worker_alive(self, wid: str) -> bool:
        return self.workers.alive(wid)

    def worker_paused(self, wid: str) -> bool:
        return wid in self.workers.paused

    def signal_worker(self, wid: str, sig: int) -> bool:
        return signal_tree(self.workers, wid, sig)

    def set_worker_links(self, wid: str, mode: str) -> None:
        """Cut remote worker ``wid`` off from every node (blackhole, reset), or reconnect it (pass)."""
        for name in self.worker_links[wid].values():
            self.set_link(name, mode)

    def power_kill(self, i: int) -> None:
        """Node i loses power: SIGKILL to its session's process group, so that a forked dump
        writer dies with it, as it would (the group is the node's: it was started in a session
        of its own, and its PID, not reaped yet, is still the group's id), then to the node by
        its PID, which reaps it. ``power_cut`` then makes its data dir what its disk kept."""
        p = self.cluster.children.procs.get(i)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.signal_node(i, signal.SIGKILL)

    def power_cut(self, i: int, timeout_s: float = 15.0) -> dict:
        """Once nothing holds node i's data dir (what the node's own start waits for), make it
        what its disk synced (``powerloss.power_cut``); returns what the cut did. Node i stays
        down until ``start_node``."""
        deadline = time.monotonic() + timeout_s
        data_dir = str(self.nodes[i].data_dir)
        fd = os.open(os.path.join(data_dir, "raft.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node-{i + 1}'s data dir is still held {timeout_s} s after its kill") from None
                    time.sleep(0.02)
            return powerloss.power_cut(data_dir)
        finally:
            os.close(fd)

    def node_alive(self, i: int) -> bool:
        return self.cluster.children.alive(i)

    def node_paused(self, i: int) -> bool:
        return i in self.cluster.stopped

    def signal_node(self, i: int, sig: int) -> bool:
        return signal_tree(self.cluster.children, i, sig)

    def stop_all(self) -> None:
        """Stop the nodes, the sink and the proxy, each by its PID."""
        for group in (self.workers, self.cluster.children, self.procs):
            try:
                group.stop_all()
            except Exception as e:  # keep stopping the others
                print(f"processes: stopping failed: {e!r}", file=sys.stderr)

    def set_clock(self, i: int, offset_ms: int) -> None:
        f = self.nodes[i].clock_file
        tmp = f.with_suffix(".tmp")
        tmp.write_text(f"{int(offset_ms)}\n")
        os.replace(tmp, f)
