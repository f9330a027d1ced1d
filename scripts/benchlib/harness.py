"""The benchmark's clusters, on top of the package's process harness (raftsched.testing): a
LocalCluster started from the nodes' code directory with the fire-commit log on, persistent HTTP
connections for timed requests, the fire-log reader, measurement windows aligned to whole
seconds, and the baselines run as subprocesses. Every process started is stopped by its PID."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raftsched.testing.cluster import LocalCluster

from . import common
from .common import BenchError, HOST, REPO, file_tail, venv_python, wall_ms
from .probes import cluster_cpu_s

#: --slots 0: no worker on any node, so firing is measured alone (runs stay queued).
NO_WORKER = ("--slots", "0")


class Conn:
    """One persistent HTTP/1.1 connection to a node's API (http.client), so that a timed request
    measures the request only, not a TCP handshake."""

    def __init__(self, port: int, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.port = port
        self.token = token
        self.timeout_s = timeout_s
        self.c: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def _conn(self) -> http.client.HTTPConnection:
        if self.c is None:
            self.c = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout_s)
            self.c.connect()
            self.reconnects += 1
        return self.c

    def request(self, method: str, path: str, body=None, headers: dict | None = None, retry: bool = True):
        """Returns (status, parsed JSON or text). Retries once on a dropped keep-alive connection
        when ``retry`` (reads only: never for a timed write)."""
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            try:
                c = self._conn()
                c.request(method, path, body=data, headers=hdrs)
                r = c.getresponse()
                raw = r.read()
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt or not retry:
                    raise
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode(errors="replace")

    def get(self, path: str):
        return self.request("GET", path)

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


def node_log_excerpt(c: LocalCluster, i: int, n: int = 30) -> str:
    return f"--- node-{i + 1} ({c.data_dir(i) / 'node.log'}), last {n} lines ---\n{c.log_tail(i, n)}"


def check_alive(c: LocalCluster, expected) -> None:
    dead = [i for i in expected if i not in c.alive()]
    if dead:
        raise BenchError("node(s) died: " + ", ".join(f"node-{i + 1} (exit {c.procs[i].returncode})" for i in dead)
                         + "\n" + "\n".join(node_log_excerpt(c, i) for i in dead))


class BenchCluster(LocalCluster):
    """The harness's LocalCluster with extra arguments for every node (e.g. ``--slots 0``),
    started from common.CODE_DIR (cwd and PYTHONPATH), so a benchmark can run a fixed commit while
    the tree changes. With ``fire_log``, node i writes its fire-commit log to ``fire_log_path(i)``."""

    def __init__(self, tmp: Path, extra_args: tuple = (), fire_log: bool = False, **kw) -> None:
        how = common.fire_log_how() if fire_log else None
        args = list(extra_args)
        super().__init__(tmp, env={"PYTHONPATH": str(common.CODE_DIR)}, cwd=common.CODE_DIR,
                         node_args=(lambda i: args + ["--fire-log", str(self.fire_log_path(i))]) if how == "flag" else args,
                         node_env=(lambda i: {"RAFTSCHED_FIRE_LOG": str(self.fire_log_path(i))}) if how == "env" else None, **kw)
        self.extra_args = list(extra_args)
        self.fire_log = fire_log
        #: the bulk endpoint: None until probed, then its path or False (see register_jobs)
        self.bulk_path: str | bool | None = None

    def fire_log_path(self, i: int) -> Path:
        return self.data_dir(i) / "fire.log"


def start_cluster(tmp: Path, name: str, clusters: list, extra_args: tuple = (), fire_log: bool = False) -> BenchCluster:
    (tmp / name).mkdir(parents=True)
    c = BenchCluster(tmp / name, extra_args, fire_log=fire_log)
    clusters.append(c)  # registered before start: the finally block stops whatever started
    t0 = time.monotonic()
    c.start()
    try:
        c.wait_leader(30)
    except AssertionError as e:
        raise BenchError(f"{name}: no leader within 30 s: {e}\n" + "\n".join(node_log_excerpt(c, i) for i in range(c.n))) from None
    print(f"[bench] {name}: 3 nodes up, leader elected in {time.monotonic() - t0:.1f} s "
          f"(API ports {c.api_ports}; extra node args {list(extra_args)}{'; fire log on' if fire_log else ''})", file=sys.stderr)
    return c


def leader_checked(c: LocalCluster, timeout_s: float = 30) -> tuple[int, dict]:
    """The agreed leader and its /v1/cluster body; its reported pid must be the one we started."""
    try:
        i = c.wait_leader(timeout_s)
    except AssertionError as e:
        raise BenchError(f"no agreed leader: {e}") from None
    st = c.status(i)
    if st is None or st.get("pid") != c.procs[i].pid:
        raise BenchError(f"node-{i + 1} reports pid {st and st.get('pid')} but we started pid {c.procs[i].pid}")
    return i, st


def put_ok(c: LocalCluster, i: int, name: str, spec: dict) -> None:
    s, b = c.call(i, "PUT", f"/v1/jobs/{name}", spec)
    if s not in (200, 201):
        raise BenchError(f"PUT /v1/jobs/{name} on node-{i + 1}: {s} {b}")


def put_queue(c: LocalCluster, i: int, name: str, max_depth: int, on_full: str) -> None:
    s, b = c.call(i, "PUT", f"/v1/queues/{name}", {"max_depth": max_depth, "on_full": on_full})
    if s not in (200, 201):
        raise BenchError(f"PUT /v1/queues/{name}: {s} {b}")


class FireLogs:
    """Reads the three nodes' fire-commit logs incrementally (each node writes only while it
    leads, and leadership may move). A record is (commit_ms, plan_ms, [slot_ms, ...], node).

    Only complete lines are read; a line cut by ``skip_to_end`` or a half-written last line is
    left for later or dropped, never misread."""

    def __init__(self, c: BenchCluster) -> None:
        self.paths = {i: c.fire_log_path(i) for i in range(c.n)}
        self.offsets = {i: 0 for i in self.paths}
        self.resync = {i: False for i in self.paths}  # offset set blindly: drop up to the next newline
        self.bad_lines = 0
        self.max_commit_ms = 0.0

    def skip_to_end(self) -> None:
        """Forget everything written so far (e.g. the registration's fires)."""
        for i, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size > self.offsets[i]:
                        f.seek(size - 1)
                        # At a line boundary nothing is cut; otherwise drop the rest of that line.
                        self.resync[i] = f.read(1) != b"\n"
                        self.offsets[i] = size
            except OSError:
                continue

    def read_new(self) -> list[tuple]:
        out = []
        for i, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    if os.fstat(f.fileno()).st_size < self.offsets[i]:
                        self.offsets[i] = 0  # truncated or replaced (a restarted node reopened it): from the top
                        self.resync[i] = False
                    f.seek(self.offsets[i])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            start = 0
            if self.resync[i]:
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                start = nl + 1
                self.resync[i] = False
            end = data.rfind(b"\n")
            if end < start:
                self.offsets[i] += start
                continue
            for line in data[start:end].split(b"\n"):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    rec = (float(r["c"]), float(r.get("p", r["c"])), [int(s) for s in r["s"]], i)
                except (ValueError, KeyError, TypeError):
                    self.bad_lines += 1
                    continue
                self.max_commit_ms = max(self.max_commit_ms, rec[0])
                out.append(rec)
            self.offsets[i] += end + 1
        return out

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths.values() if p.exists())


def wait_fire_log_past(logs: FireLogs, t_ms: float, timeout_s: float, keep: list) -> bool:
    """Read the logs into ``keep`` until one record was committed at or after t_ms (so every record
    committed before t_ms has been written), or the deadline passes. Returns whether it got there."""
    deadline = time.monotonic() + timeout_s
    while True:
        keep += logs.read_new()
        if logs.max_commit_ms >= t_ms:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop


def measurement_window(window_s: int, c=None) -> tuple[float, float] | tuple[float, float, float | None]:
    """Wait out a window of ``window_s`` whole seconds that starts on the next whole second and
    return its bounds (wall ms). Interval slots fall on whole seconds, so a window aligned to them
    holds whole seconds' commits: one that started mid-burst would cut a second's slots in two.
    With a cluster ``c``, also the CPU seconds its node processes used in the window."""
    w0 = (wall_ms() // 1000 + 1) * 1000
    w1 = w0 + int(window_s) * 1000
    marks = []
    for t in (w0, w1):
        time.sleep(max(0.0, (t - wall_ms()) / 1000))  # ok-sleep: measurement window
        if c is not None:
            marks.append(cluster_cpu_s(c))
    if c is None:
        return w0, w1
    return w0, w1, None if None in marks else marks[1] - marks[0]


def run_baseline(tmp: Path, script: str, args: list[str], label: str, timeout_s: float) -> dict:
    """Run scripts/baselines/<script> with the venv's Python and parse the JSON it writes to --out.

    Never raises: a missing script, a non-zero exit, a timeout or unreadable JSON is recorded as
    {"not_run": "<why>"}. The script runs in its own session; on a timeout its process group (whose
    id is the PID we started) is killed, so its children go too."""
    path = REPO / "scripts" / "baselines" / script
    if not path.exists():
        return {"not_run": f"scripts/baselines/{script} does not exist"}
    out = tmp / "baselines" / f"{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".log")
    argv = [venv_python(), str(path), *args, "--out", str(out)]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"not_run": f"timed out after {timeout_s:.0f} s", "argv": argv[1:], "log_tail": file_tail(log_path)}
    finally:
        if p.poll() is None:
            # Its own session: the group id is the PID we started. SIGTERM first, so that it can
            # stop its children and remove its files; SIGKILL the group after 5 s.
            for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
    elapsed = round(time.monotonic() - t0, 1)
    if rc != 0:
        return {"not_run": f"exit status {rc}", "argv": argv[1:], "log_tail": file_tail(log_path), "elapsed_s": elapsed}
    try:
        res = json.loads(out.read_text())
    except (OSError, ValueError) as e:
        return {"not_run": f"no JSON in --out ({e})", "argv": argv[1:], "log_tail": file_tail(log_path), "elapsed_s": elapsed}
    if not isinstance(res, dict):
        return {"not_run": "its JSON is not an object", "argv": argv[1:]}
    res["argv"] = argv[1:]
    res["elapsed_s"] = elapsed
    print(f"[bench] baseline {label}: done in {elapsed} s", file=sys.stderr)
    return res


def stop_clusters(clusters: list) -> None:
    for c in clusters:
        try:
            c.stop()
        except Exception as e:  # keep stopping the others
            print(f"[bench] stopping a cluster: {e!r}", file=sys.stderr)


def stop_probe(c: BenchCluster, tmp: Path, keep: bool) -> None:
    """A measure probe's end (in its ``finally``): its cluster stopped by PID, and its temporary
    directory removed, or kept and said on stderr (``keep``: the run failed, or ``--keep``)."""
    c.stop()
    if keep:
        print(f"data dirs and node logs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def probe_cluster(args, name: str) -> tuple[Path, str, BenchCluster]:
    """A measure probe's temporary directory, the code its nodes run (``args.code_dir`` or
    ``args.git_ref``: common.add_code_args) and a three-node cluster without a worker there, not
    started yet."""
    tmp = Path(tempfile.mkdtemp(prefix=f"raftsched-{name}-"))
    code = common.choose_code(args.code_dir, args.git_ref, tmp)
    (tmp / "cluster").mkdir()
    return tmp, code, BenchCluster(tmp / "cluster", NO_WORKER)
