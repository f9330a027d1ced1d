#!/usr/bin/env python3
"""Raw-pysyncobj baseline (issue #6): the ceiling of the Raft layer under raftsched.

Usage:
    .venv/bin/python scripts/baselines/raw_raft.py --seconds W [--payload 99] [--in-flight 1000]
        [--warmup 2] --out result.json

Three processes on free 127.0.0.1 ports, each a pysyncobj ``SyncObj`` configured as
``raftsched.replication.RaftNode`` configures one: ``RAFT_CONF_DEFAULTS`` through ``make_conf``,
a password (a fresh random secret), journal and full dump files in a temporary directory,
``bindAddress`` = its own 127.0.0.1 address, an ``onStateChanged`` callback, and the same
transport class (``raftsched.replication.RaftTransport``: pysyncobj's TCP transport plus the
0.5 s keepalive; no dial map), and the same stand-ins for pysyncobj's parts
(``raftsched.replication.install``: messages uncompressed, the journal written with pwrite,
dumps at gzip level 1). What differs from RaftNode: the replicated state is a counter whose
one ``@replicated`` method, ``noop(payload)``, only increments it (RaftNode's state decodes and
applies a msgpack command), the client calls the method directly with a pysyncobj callback
(RaftNode goes through an asyncio future and ``call_soon_threadsafe``), and there is no data-dir
lock and no deferred snapshot encoding (the counter's dump is tiny).

The load: a client thread inside one node's process keeps ``--in-flight`` commands outstanding
(pipelined, each a call with a callback; the callback, on pysyncobj's tick thread, frees a slot).
Each command carries the same ``--payload`` random bytes (incompressible, so the wire's zlib gains
nothing). It drives for ``--warmup`` seconds, then ``--seconds`` (W) seconds of measurement, stops
submitting, and waits for the outstanding commands (bounded). Measured in the window:

- ``commits_per_s``: callbacks with FAIL_REASON.SUCCESS that arrived in the window, / W;
- ``latency_ms``: submit -> callback of those same commands, nearest-rank p50 / p99, and max.

Each run also reports: ``commit_index_delta_in_window`` (the driving node's commit index over
the window, a cross-check), ``submitted``/``completed``, ``failures`` by FAIL_REASON name,
``outstanding_after_drain``, the term and leader before and after (``leader_changed``), and
``log_truncations``: how many times a follower logged pysyncobj's CRITICAL "truncating
already-applied log entries" during the run (it drops and re-adds entries after prevLogIdx when
the leader resends from an older nextIndex; the first such line per node is printed, the rest only
counted). ``cluster`` holds the election time, the final counter on every node (they must agree)
and the load average.

First driven on the leader, then (same parameters, same cluster, once every node has applied
everything) on a follower, where pysyncobj forwards each command to the leader.

Prints the result as one JSON line on stdout and writes it (indented) to ``--out``. Exit status 0
when both runs ran (failures of individual commands are reported, not fatal), 1 when the cluster
could not be started or a node failed. Every child process is stopped by its PID (terminate, then
kill after a deadline) and the temporary directory removed, whatever happens.

Internals: the children are this script run with the hidden ``--node`` option; the parent talks to
each through its stdin/stdout (one JSON object a line; the child's stray stdout goes to stderr).
The secret reaches them through the environment, not argv.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from raftsched.testing.procs import free_ports  # noqa: E402  (the harness's: loopback, distinct)

HOST = "127.0.0.1"
N_NODES = 3
SECRET_ENV = "RAW_RAFT_SECRET"

#: Deadlines (seconds).
START_DEADLINE_S = 30.0        # children import and report their pid
LEADER_DEADLINE_S = 30.0       # one leader, seen by all, every link connected
SETTLE_DEADLINE_S = 30.0       # every node has applied every committed entry
DRAIN_DEADLINE_S = 10.0        # outstanding commands after the window
REPLY_SLACK_S = 15.0           # on top of a command's own duration
STATUS_TIMEOUT_S = 5.0
STOP_DEADLINE_S = 5.0          # graceful stop, then terminate; then kill
KILL_DEADLINE_S = 3.0
RMTREE_DEADLINE_S = 5.0
POLL_S = 0.05


class BenchError(Exception):
    """The baseline could not run."""


# =============================================================================================
# Node mode (child process)
# =============================================================================================

def _conf_options(data_dir: str, self_addr: str, secret: str) -> dict:
    """The SyncObjConf options, as RaftNode builds them (minus its onStateChanged callback)."""
    from raftsched.replication import RAFT_CONF_DEFAULTS

    options = dict(RAFT_CONF_DEFAULTS)
    options.update(
        password=secret,
        journalFile=os.path.join(data_dir, "raft.journal"),
        fullDumpFile=os.path.join(data_dir, "raft.dump"),
        bindAddress=self_addr,
    )
    return options


def _pct(sorted_values: list, p: float):
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


class _TruncationFilter(logging.Filter):
    PREFIX = "truncating already-applied log entries"

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if str(record.msg).startswith(self.PREFIX):
                self.count += 1
                if self.count == 1:
                    record.msg = str(record.msg) + " [raw_raft: further ones counted, not printed]"
                    return True
                return False
        except Exception:  # noqa: BLE001 - never break pysyncobj's logging call
            pass
        return True


def node_main(args) -> int:
    # The protocol stream is a private copy of fd 1; fd 1 itself becomes stderr, so that nothing
    # a library prints can corrupt the protocol.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # Ctrl-C goes to the whole process group: the parent does the cleanup.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING,
                        format=f"[raw_raft node {args.self_addr}] %(levelname)s %(name)s: %(message)s")

    # pysyncobj logs CRITICAL "truncating already-applied log entries" whenever a follower
    # receives append_entries whose prevLogIdx is below its last applied entry (the leader resends
    # from an older nextIndex). Under pipelined load that can be hundreds of lines: print the
    # first, count them all (reported in the result).
    truncations = _TruncationFilter()
    logging.getLogger("pysyncobj.syncobj").addFilter(truncations)

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    secret = os.environ.pop(SECRET_ENV, "")
    if not secret:
        reply({"event": "error", "error": f"{SECRET_ENV} is not set"})
        return 2

    from pysyncobj import SyncObj, SyncObjConsumer, replicated
    from pysyncobj.config import FAIL_REASON

    from raftsched.replication import RaftTransport, install, make_conf

    # The stand-ins RaftNode puts into pysyncobj, so that the baseline measures the same Raft
    # layer (importing raftsched.replication does not).
    install()

    reason_names = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}

    class Counter(SyncObjConsumer):
        def __init__(self):
            super().__init__()
            self.count = 0

        @replicated
        def noop(self, payload):
            self.count += 1

    raft_state = {"state": 0, "changes": 0}

    def on_state_changed(old, new):  # tick thread: never raise
        try:
            raft_state["state"] = new
            raft_state["changes"] += 1
        except BaseException:  # noqa: BLE001
            pass

    peers = [p for p in args.peers.split(",") if p and p != args.self_addr]
    options = _conf_options(args.data_dir, args.self_addr, secret)
    if args.crypto == "none":
        options["password"] = None
    conf = make_conf(**options, onStateChanged=on_state_changed)
    counters: dict = {}
    consumer = Counter()
    transport = functools.partial(RaftTransport, dial_map=None, counters=counters)
    sync_class = SyncObj
    if args.crypto == "aead":
        from raftsched.replication._crypto import _AeadEncryptor

        aead = _AeadEncryptor(secret)

        class AeadSyncObj(SyncObj):
            """pysyncobj's SyncObj whose connections are protected by raftsched's AES-GCM."""

            @property
            def encryptor(self):
                return aead
        sync_class = AeadSyncObj
    sync = sync_class(args.self_addr, peers, conf=conf, consumers=[consumer],
                      transportClass=transport)

    shown = {k: v for k, v in options.items()}
    shown["password"] = "<random secret, set>" if options["password"] else None
    shown["crypto"] = args.crypto
    shown["journalFile"] = "<data_dir>/raft.journal"
    shown["fullDumpFile"] = "<data_dir>/raft.dump"
    shown["bindAddress"] = "127.0.0.1:<port>"
    shown["onStateChanged"] = "<callback>"
    reply({"event": "started", "pid": os.getpid(), "conf": shown,
           "transport": f"{RaftTransport.__module__}.{RaftTransport.__qualname__}"})

    def leader_id():
        leader = sync._getLeader()
        return None if leader is None else leader.id

    def status() -> dict:
        return {
            "self": args.self_addr,
            "is_leader": sync._isLeader(),
            "leader": leader_id(),
            "term": sync.raftCurrentTerm,
            "commit_index": sync.raftCommitIndex,
            "last_applied": sync.raftLastApplied,
            "count": consumer.count,
            "connected": sorted(n.id for n in sync.otherNodes if sync.isNodeConnected(n)),
            "ready": sync.isReady(),
            "state_changes": raft_state["changes"],
            "truncations": truncations.count,
            "transport_counters": dict(counters),
        }

    def drive(seconds: float, warmup: float, payload_len: int, in_flight: int,
              drain_s: float) -> dict:
        payload = os.urandom(payload_len)
        sem = threading.Semaphore(in_flight)
        done: list = []          # (t_done, latency_s, reason), appended on the tick thread
        append = done.append
        clock = time.perf_counter

        def make_cb(t_submit):
            def cb(result, reason):
                # pysyncobj's tick thread (or this thread for QUEUE_FULL). Must never raise:
                # pysyncobj would apply the entry again.
                try:
                    t = clock()
                    append((t, t - t_submit, reason))
                    sem.release()
                except BaseException:  # noqa: BLE001
                    pass
            return cb

        submit = consumer.noop
        status_before = status()
        submitted = notify_failed = 0
        t_start = clock()
        t_w0 = t_start + warmup
        t_w1 = t_w0 + seconds
        ci_w0 = None
        while True:
            t = clock()
            if t >= t_w1:
                break
            if ci_w0 is None and t >= t_w0:
                ci_w0 = sync.raftCommitIndex
            if not sem.acquire(timeout=t_w1 - t):
                continue
            t = clock()
            try:
                submit(payload, callback=make_cb(t))
            except OSError:
                # Queued; only the wake-up of the tick thread failed (its pipe is full).
                notify_failed += 1
            submitted += 1
        ci_w1 = sync.raftCommitIndex
        if ci_w0 is None:
            ci_w0 = ci_w1
        # Drain: wait (bounded) until every slot is free again.
        drained = 0
        deadline = clock() + drain_s
        while drained < in_flight:
            remaining = deadline - clock()
            if remaining <= 0 or not sem.acquire(timeout=remaining):
                break
            drained += 1
        drain_time = clock() - t_w1
        status_after = status()

        results = list(done)
        in_window = [r for r in results if t_w0 <= r[0] < t_w1]
        lat = sorted(r[1] * 1000.0 for r in in_window if r[2] == FAIL_REASON.SUCCESS)
        failures: dict = {}
        for r in results:
            if r[2] != FAIL_REASON.SUCCESS:
                name = reason_names.get(r[2], str(r[2]))
                failures[name] = failures.get(name, 0) + 1

        def ms(v):
            return None if v is None else round(v, 3)

        return {
            "node": args.self_addr,
            "role": "leader" if status_before["is_leader"] else "follower",
            "commits_per_s": round(len(lat) / seconds, 1),
            "latency_ms": {"p50": ms(_pct(lat, 50)), "p99": ms(_pct(lat, 99)),
                           "max": ms(lat[-1] if lat else None), "count": len(lat)},
            "commits_in_window": len(lat),
            "commit_index_delta_in_window": ci_w1 - ci_w0,
            "submitted": submitted,
            "completed": len(results),
            "failures": failures,
            "notify_failed": notify_failed,
            "outstanding_after_drain": in_flight - drained,
            "drain_s": round(drain_time, 3),
            "term_before": status_before["term"],
            "term_after": status_after["term"],
            "leader_before": status_before["leader"],
            "leader_after": status_after["leader"],
            "leader_changed": (status_before["term"], status_before["leader"])
                              != (status_after["term"], status_after["leader"]),
        }

    rc = 0
    try:
        while True:
            line = sys.stdin.readline()
            if not line:       # the parent is gone
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            rid = msg.get("id")
            try:
                cmd = msg.get("cmd")
                if cmd == "status":
                    reply({"id": rid, "status": status()})
                elif cmd == "drive":
                    reply({"id": rid, "run": drive(float(msg["seconds"]), float(msg["warmup"]),
                                                   int(msg["payload"]), int(msg["in_flight"]),
                                                   float(msg["drain_s"]))})
                elif cmd == "stop":
                    break
                else:
                    reply({"id": rid, "error": f"unknown command {cmd!r}"})
            except Exception:  # noqa: BLE001
                reply({"id": rid, "error": traceback.format_exc()})
    finally:
        sync.destroy()
        deadline = time.monotonic() + STOP_DEADLINE_S
        while sync.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # ok-sleep: polling interval inside a deadline loop
        if sync.tick_thread_alive():
            rc = 3
        # Reap dump writers forked by pysyncobj (useFork), so none outlives this process.
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)  # ok-sleep: polling interval inside a deadline loop
        try:
            reply({"event": "stopped", "tick_thread_stopped": rc == 0})
        except OSError:
            pass
    return rc


# =============================================================================================
# Parent mode
# =============================================================================================

class Child:
    """One node process and its JSON-lines channel."""

    def __init__(self, index: int, addr: str, proc: subprocess.Popen):
        self.index = index
        self.addr = addr
        self.proc = proc
        self._q: queue.Queue = queue.Queue()
        self._next_id = 0
        self.started: dict | None = None
        t = threading.Thread(target=self._read, name=f"raw_raft-reader-{index}", daemon=True)
        t.start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    self._q.put(json.loads(line))
                except ValueError:
                    sys.stderr.write(f"[raw_raft node {self.addr}] {line}")
        except (OSError, ValueError):
            pass
        finally:
            self._q.put(None)  # EOF

    def _get(self, deadline: float, what: str, accept) -> dict:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"node {self.addr}: no answer to {what} before the deadline")
            try:
                msg = self._q.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                raise BenchError(f"node {self.addr} exited (rc={self.proc.poll()}) during {what}")
            if accept(msg):
                return msg

    def wait_started(self, deadline: float) -> dict:
        msg = self._get(deadline, "start-up", lambda m: "event" in m)
        if msg.get("event") != "started":
            raise BenchError(f"node {self.addr} failed to start: {msg.get('error')}")
        self.started = msg
        return msg

    def request(self, msg: dict, timeout_s: float) -> dict:
        self._next_id += 1
        rid = self._next_id
        try:
            self.proc.stdin.write(json.dumps(dict(msg, id=rid)) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:
            raise BenchError(f"node {self.addr}: cannot send {msg.get('cmd')}: {e!r}") from None
        answer = self._get(time.monotonic() + timeout_s, str(msg.get("cmd")),
                           lambda m: m.get("id") == rid)
        if "error" in answer:
            raise BenchError(f"node {self.addr}: {msg.get('cmd')} failed:\n{answer['error']}")
        return answer

    def status(self) -> dict:
        return self.request({"cmd": "status"}, STATUS_TIMEOUT_S)["status"]

    def send_stop(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass


def wait_until(cond, timeout_s: float, what: str):
    """Poll ``cond`` until it returns a truthy value, or raise BenchError at the deadline."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        v = cond()
        if v:
            return v
        last = v
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}"
                             + (f" (last: {last!r})" if last is not None else ""))
        time.sleep(POLL_S)  # ok-sleep: polling interval inside a deadline loop


def stable_leader(children: list[Child]):
    """Index of the leader when exactly one node leads, all agree on it and on the term, and
    every link is connected; else None."""
    sts = [c.status() for c in children]
    leaders = [i for i, s in enumerate(sts) if s["is_leader"]]
    if len(leaders) != 1:
        return None
    li = leaders[0]
    lead = children[li].addr
    if any(s["leader"] != lead or s["term"] != sts[li]["term"] for s in sts):
        return None
    if any(len(s["connected"]) != len(children) - 1 for s in sts):
        return None
    return li + 1  # truthy


def settled(children: list[Child], leader: int):
    """True when every node has applied every entry the leader has committed."""
    sts = [c.status() for c in children]
    ci = sts[leader]["commit_index"]
    if not sts[leader]["is_leader"]:
        return False
    return all(s["last_applied"] >= ci and s["commit_index"] == ci for s in sts)


def truncation_counts(children: list[Child]) -> list[int]:
    return [c.status()["truncations"] for c in children]


def diff_counts(after: list[int], before: list[int]) -> int:
    """Truncations of already-applied entries across the cluster between two readings."""
    return sum(a - b for a, b in zip(after, before))


def _wait_all(procs: list[subprocess.Popen], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _signal_alive(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass


def stop_children(children: list[Child], procs: list[subprocess.Popen]) -> None:
    """Stop every process started, by PID: ask, then terminate, then kill, each with a deadline."""
    for c in children:
        if c.proc.poll() is None:
            c.send_stop()
    _wait_all(procs, STOP_DEADLINE_S)
    _signal_alive(procs, signal.SIGTERM)
    _wait_all(procs, KILL_DEADLINE_S)
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=KILL_DEADLINE_S)
            except subprocess.TimeoutExpired:
                sys.stderr.write(f"raw_raft: pid {p.pid} survived SIGKILL\n")
    for p in procs:
        for f in (p.stdin, p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def remove_tree(path: str) -> None:
    # A dump writer forked by a node that was killed may still be finishing its file.
    deadline = time.monotonic() + RMTREE_DEADLINE_S
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                sys.stderr.write(f"raw_raft: could not remove {path}: {e!r}\n")
                return
        time.sleep(POLL_S)  # ok-sleep: polling interval inside a deadline loop


def run(args) -> dict:
    tmp = tempfile.mkdtemp(prefix="raw_raft-")
    procs: list[subprocess.Popen] = []
    children: list[Child] = []
    t_mark = time.monotonic()
    phases: dict = {}  # seconds each step took: where a run's time goes

    def mark(name: str) -> None:
        nonlocal t_mark
        now = time.monotonic()
        phases[name] = round(now - t_mark, 3)
        t_mark = now

    try:
        ports = free_ports(N_NODES)
        addrs = [f"{HOST}:{p}" for p in ports]
        env = dict(os.environ)
        env[SECRET_ENV] = secrets.token_urlsafe(32)
        env["PYTHONUNBUFFERED"] = "1"
        for i, addr in enumerate(addrs):
            data_dir = os.path.join(tmp, f"node{i}")
            os.makedirs(data_dir)
            cmd = [sys.executable, os.path.abspath(__file__), "--node", "--self-addr", addr,
                   "--peers", ",".join(addrs), "--data-dir", data_dir, "--crypto", args.crypto]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    env=env, cwd=str(REPO), text=True, bufsize=1,
                                    close_fds=True)
            procs.append(proc)
            children.append(Child(i, addr, proc))

        deadline = time.monotonic() + START_DEADLINE_S
        for c in children:
            c.wait_started(deadline)
        mark("children_started")

        t0 = time.monotonic()
        leader = wait_until(lambda: stable_leader(children), LEADER_DEADLINE_S,
                            "one leader seen by all nodes, every link connected") - 1
        election_s = time.monotonic() - t0
        wait_until(lambda: settled(children, leader), SETTLE_DEADLINE_S, "the nodes to settle")
        mark("elected_and_settled")

        drive = {"cmd": "drive", "seconds": args.seconds, "warmup": args.warmup,
                 "payload": args.payload, "in_flight": args.in_flight,
                 "drain_s": DRAIN_DEADLINE_S}
        reply_timeout = args.warmup + args.seconds + DRAIN_DEADLINE_S + REPLY_SLACK_S

        trunc0 = truncation_counts(children)
        leader_run = children[leader].request(drive, reply_timeout)["run"]
        leader2 = wait_until(lambda: stable_leader(children), LEADER_DEADLINE_S,
                             "a stable leader after the leader run") - 1
        wait_until(lambda: settled(children, leader2), SETTLE_DEADLINE_S,
                   "every node to apply the leader run")
        trunc1 = truncation_counts(children)
        leader_run["log_truncations"] = diff_counts(trunc1, trunc0)
        mark("leader_run_and_settle")

        follower = next(i for i in range(len(children)) if i != leader2)
        follower_run = children[follower].request(drive, reply_timeout)["run"]
        leader3 = wait_until(lambda: stable_leader(children), LEADER_DEADLINE_S,
                             "a stable leader after the follower run") - 1
        wait_until(lambda: settled(children, leader3), SETTLE_DEADLINE_S,
                   "every node to apply the follower run")
        follower_run["log_truncations"] = diff_counts(truncation_counts(children), trunc1)
        mark("follower_run_and_settle")
        final = [c.status() for c in children]
        successes = sum(r["completed"] - sum(r["failures"].values())
                        for r in (leader_run, follower_run))

        started = children[0].started or {}
        return {
            "baseline": "raw_pysyncobj",
            "version": metadata.version("pysyncobj"),
            "payload_bytes": args.payload,
            "in_flight": args.in_flight,
            "window_s": args.seconds,
            "warmup_s": args.warmup,
            "leader": leader_run,
            "follower": follower_run,
            "conf": started.get("conf"),
            "transport": started.get("transport"),
            "cluster": {
                "nodes": addrs,
                "election_s": round(election_s, 3),
                "final_count_per_node": [s["count"] for s in final],
                "final_commit_index_per_node": [s["commit_index"] for s in final],
                "successful_callbacks_total": successes,
                "replicas_agree": len({s["count"] for s in final}) == 1,
                "log_truncations_per_node": [s["truncations"] for s in final],
                "leader_changed_between_runs": leader2 != leader or leader3 != leader2,
            },
            "python": sys.version.split()[0],
            "phases_s": phases,
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
        }
    finally:
        try:
            stop_children(children, procs)
        finally:
            remove_tree(tmp)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, help="measurement window W per run (s)")
    ap.add_argument("--payload", type=int, default=99, help="payload bytes per command")
    ap.add_argument("--in-flight", type=int, default=1000, help="commands kept outstanding")
    ap.add_argument("--warmup", type=float, default=2.0, help="load before the window (s)")
    ap.add_argument("--out", help="write the result JSON here")
    ap.add_argument("--crypto", choices=["fernet", "aead", "none"], default="fernet",
                    help="how Raft messages are protected: pysyncobj's Fernet from the password (the "
                         "default, as this baseline always ran), raftsched's AES-256-GCM "
                         "(replication/_crypto.py, what RaftNode uses), or nothing "
                         "(scripts/measure bench-raft-crypto compares them)")
    # Hidden: node (child) mode.
    ap.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--self-addr", help=argparse.SUPPRESS)
    ap.add_argument("--peers", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.node:
        return node_main(args)

    if args.seconds is None or args.out is None:
        ap.error("--seconds and --out are required")
    if args.seconds <= 0 or args.warmup < 0 or args.payload < 0 or args.in_flight < 1:
        ap.error("need --seconds > 0, --warmup >= 0, --payload >= 0, --in-flight >= 1")

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through run()'s finally: children stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        result = run(args)
    except BenchError as e:
        sys.stderr.write(f"raw_raft: {e}\n")
        return 1
    line = json.dumps(result, sort_keys=False)
    print(line, flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
