"""The HA peers, side by side (issue 27 sections 1 and 2): APScheduler 4 with three scheduler
processes on one PostgreSQL database, Celery beat with RedBeat (three beat processes competing for
its Redis lock), and raftsched's three nodes, on the same work, counted the same way.

The benchmark installs what the peers need when this scenario runs: PostgreSQL and Redis from
Debian's packages (apt-get, when their programs are missing; the benchmark runs as root) and the
peers' Python packages (pyproject.toml's ``peers`` extra) into a venv of their own, kept between
runs under ~/.cache/raftsched-bench/. It starts PostgreSQL (as the ``postgres`` user, which Debian's
package makes) and Redis in the scenario's temporary directory on free loopback ports, and stops
them, like every peer process, by PID. A peer that cannot be installed or started is reported as
"not run: why", and the others still run.

Per system (raftsched; each peer with its defaults and tuned):

* throughput: N interval jobs every 1 s, staggered over the second, three scheduler processes;
  fires per second over a window, fire lag p50/p99 (raftsched: the sweep scenario's code);
* an HA session with J jobs every 1 s: K ``kill -9`` of the active scheduler, each restarted after
  5 s; a SIGSTOP of the active one for longer than the peers' lock/lease timeouts, then SIGCONT;
  then every process killed for 30 s and restarted. The sink (scripts/benchlib/sink.py) is counted
  per phase: slots lost, slots fired twice, time to the next fire and until every job fired again.

"The active scheduler": raftsched's leader; for a peer, the process that wrote the most fires in
the last 1.5 s (APScheduler 4's scheduler holding the most schedules; RedBeat's lock holder).
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from raftsched.testing.procs import Procs, free_ports, wait_for

from ..common import PY_NOOP, REPO, iso, iso_ms, wall_ms
from ..harness import leader_checked, put_ok, start_cluster
from ..sink import count_window, first_fire_after, phases, read_sink, throughput
from .sweep import PHI, sweep

BASELINES = REPO / "scripts" / "baselines"
EVERY_MS = 1000
RESTART_AFTER_S = 5.0  # a killed scheduler is restarted this long after the kill
SETTLE_S = 3.0  # after a restart, before the next kill
DOWN_S = 30.0  # the whole-set restart: every process down this long
RESTART_WATCH_S = 60.0  # after the whole-set restart: how long to wait for every job to fire again
ACTIVE_LOOKBACK_MS = 1500
PEER_CONFIGS = (("apscheduler4", False), ("apscheduler4", True), ("redbeat", False), ("redbeat", True))


class NotRun(Exception):
    """A peer that cannot be installed or started: reported as "not run: why"."""


# ------------------------------------------------------------------ installing and starting peers
def _run(argv: list[str], timeout_s: float, what: str, **kw) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NotRun(f"{what}: {e}") from None
    if r.returncode != 0:
        raise NotRun(f"{what}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.stdout


def peer_requirements() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"]["optional-dependencies"]["peers"])


def peers_venv() -> str:
    """The peers' venv (pyproject.toml's ``peers`` extra), made on first use and kept, keyed by the
    pins: its python's path."""
    reqs = peer_requirements()
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raftsched-bench" / f"peers-{key}"
    py = root / "bin" / "python"
    if (root / ".complete").exists() and py.exists():
        return str(py)
    shutil.rmtree(root, ignore_errors=True)
    print(f"[bench] peers: installing {' '.join(reqs)} into {root}", file=sys.stderr)
    _run([sys.executable, "-m", "venv", str(root)], 120, "python -m venv")
    _run([str(py), "-m", "pip", "install", "-q", *reqs], 900, "pip install of the peers extra")
    (root / ".complete").write_text("\n".join(reqs) + "\n")
    return str(py)


def _pg_bin() -> Path | None:
    base = Path("/usr/lib/postgresql")
    for d in sorted(base.glob("*/bin"), reverse=True) if base.exists() else []:
        if (d / "initdb").exists() and (d / "postgres").exists():
            return d
    return None


def ensure_services() -> dict:
    """PostgreSQL's and Redis's programs, from Debian's packages when missing."""
    missing = [pkg for pkg, ok in (("postgresql", _pg_bin() is not None), ("redis-server", shutil.which("redis-server") is not None))
               if not ok]
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise NotRun(f"{', '.join(missing)} missing and cannot be installed here (needs root and apt-get)")
        print(f"[bench] peers: apt-get install {' '.join(missing)}", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], 600, "apt-get update", env=env)
        _run(["apt-get", "install", "-y", "-qq", *missing], 900, f"apt-get install {' '.join(missing)}", env=env)
    pg = _pg_bin()
    if pg is None or not shutil.which("redis-server"):
        raise NotRun("postgresql or redis-server still missing after apt-get install")
    return {"pg_bin": str(pg), "redis_server": shutil.which("redis-server")}


class Services:
    """PostgreSQL and Redis in ``tmp``, on free loopback ports, stopped by PID."""

    def __init__(self, tmp: Path, procs: Procs, bins: dict) -> None:
        self.tmp, self.procs, self.bins = tmp, procs, bins
        self.pg_port, self.redis_port = free_ports(2)
        self.n_db = 0
        self.pg_dir: Path | None = None

    def start_postgres(self) -> None:
        pg = Path(self.bins["pg_bin"])
        # A directory of its own, owned by the server's user: the benchmark's temporary directory
        # is private to root. Removed by stop().
        d = self.pg_dir = Path(tempfile.mkdtemp(prefix="raftsched-bench-pg-"))
        user = "postgres"
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise NotRun("no 'postgres' user (Debian's postgresql package makes it)") from None
        os.chown(d, pw.pw_uid, pw.pw_gid)
        as_pg = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"] if os.geteuid() == 0 else []
        _run(as_pg + [str(pg / "initdb"), "-D", str(d / "data"), "-A", "trust", "-U", "bench"], 120, "initdb")
        self.procs.start("postgres", as_pg + [str(pg / "postgres"), "-D", str(d / "data"), "-p", str(self.pg_port), "-k", str(d),
                                              "-c", "listen_addresses=127.0.0.1"], self.tmp / "postgres.log")

        def ready():
            r = subprocess.run([str(pg / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port)], capture_output=True)
            return r.returncode == 0
        try:
            wait_for(ready, 60, "PostgreSQL to accept connections", interval_s=0.2)
        except AssertionError as e:
            raise NotRun(f"PostgreSQL did not start: {e}: {self.procs.log_tail('postgres', 5)}") from None

    def stop(self) -> None:
        for name in ("postgres", "redis"):
            self.procs.stop(name)
        if self.pg_dir is not None:
            shutil.rmtree(self.pg_dir, ignore_errors=True)

    def new_db(self) -> str:
        """A fresh database: its DSN."""
        self.n_db += 1
        name = f"bench{self.n_db}"
        _run([str(Path(self.bins["pg_bin"]) / "createdb"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "bench", name], 60, "createdb")
        return f"postgresql://bench@127.0.0.1:{self.pg_port}/{name}"

    def start_redis(self) -> None:
        self.procs.start("redis", [self.bins["redis_server"], "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--dir", str(self.tmp)], self.tmp / "redis.log")
        try:
            wait_for(lambda: self.redis_cli("PING").strip() == "PONG", 30, "Redis to answer", interval_s=0.1)
        except AssertionError as e:
            raise NotRun(f"Redis did not start: {e}: {self.procs.log_tail('redis', 5)}") from None

    def redis_cli(self, *cmd: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.redis_port), *cmd], capture_output=True, text=True, timeout=10).stdout

    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"


# ------------------------------------------------------------------ the systems under test
class PeerSet:
    """Three processes of one peer (one config) on a fresh database or key space."""

    def __init__(self, tmp: Path, procs: Procs, svc: Services, py: str, kind: str, tuned: bool, label: str) -> None:
        self.tmp, self.procs, self.svc, self.py, self.kind, self.tuned = tmp, procs, svc, py, kind, tuned
        self.label = label
        self.dir = tmp / label
        self.dir.mkdir(parents=True)
        if kind == "apscheduler4":
            self.script = str(BASELINES / "aps4_peer.py")
            self.conn = ["--dsn", svc.new_db()]
        else:
            self.script = str(BASELINES / "redbeat_peer.py")
            svc.redis_cli("FLUSHALL")
            self.conn = ["--redis", svc.redis_url()]
        self.n = 3

    def name(self, i: int) -> str:
        return f"{self.label}-{i + 1}"

    def sink(self, i: int) -> Path:
        return self.dir / f"sink-{i + 1}.jsonl"

    def setup(self, jobs: int, base_ms: int) -> float:
        t0 = time.monotonic()
        _run([self.py, self.script, "setup", *self.conn, "--jobs", str(jobs), "--base-ms", str(base_ms)]
             + (["--tuned"] if self.tuned else []), 900, f"{self.label} setup")
        return time.monotonic() - t0

    def start(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(self.n)):
            self.procs.start(self.name(j), [self.py, self.script, "run", *self.conn, "--sink", str(self.sink(j)), "--name",
                                            self.name(j)] + (["--tuned"] if self.tuned else []),
                             self.dir / f"{self.name(j)}.log", cwd=BASELINES)

    def signal(self, i: int, sig: int) -> None:
        self.procs.signal(self.name(i), sig)
        if sig == signal.SIGKILL:
            p = self.procs.procs.get(self.name(i))
            if p is not None:
                p.wait(timeout=15)

    def stop(self) -> None:
        for i in range(self.n):
            self.procs.stop(self.name(i))

    def fires(self) -> list[dict]:
        return read_sink([self.sink(i) for i in range(self.n)])

    def active(self) -> int:
        fires = self.fires()
        if not fires:
            return 0
        t_last = max(float(f["t"]) for f in fires)
        counts: dict[str, int] = {}
        for f in fires:
            if float(f["t"]) > t_last - ACTIVE_LOOKBACK_MS:
                counts[f["w"]] = counts.get(f["w"], 0) + 1
        best = max(counts, key=lambda w: counts[w])
        return int(best.rsplit("-", 1)[1]) - 1

    def alive_fires_after(self, t_ms: float, jobs: list[str]) -> bool:
        return first_fire_after(self.fires(), t_ms, jobs)["all_jobs_fired_ms"] is not None


class RaftSet:
    """raftsched's three nodes, through the benchmark's harness."""

    def __init__(self, tmp: Path, clusters: list, jobs: list[str], base_ms: int) -> None:
        self.c = start_cluster(tmp, "peers-raftsched", clusters)
        self.label = "raftsched"
        self.n = self.c.n
        self.jobs = jobs
        leader, _ = leader_checked(self.c)
        for k, j in enumerate(jobs):
            phase = int((k * PHI) % 1 * 1000)
            put_ok(self.c, leader, j, {"schedule": {"every_s": 1, "start_at": iso(base_ms + phase)}, "executor": PY_NOOP,
                                       "misfire": {"policy": "fire_all"}, "history": 1000})

    def start(self, i: int | None = None) -> None:
        self.c.start(i)

    def signal(self, i: int, sig: int) -> None:
        self.c.kill(i, sig)
        if sig == signal.SIGKILL:
            self.c.procs[i].wait(timeout=15)

    def stop(self) -> None:
        self.c.stop()

    def active(self) -> int:
        return leader_checked(self.c)[0]

    def fires(self) -> list[dict]:
        out = []
        lead = self.c.wait_leader(60)
        for j in self.jobs:
            s, b = self.c.get(lead, f"/v1/jobs/{j}/runs?limit=100000&consistent=true")
            if s != 200:
                raise NotRun(f"GET /v1/jobs/{j}/runs: {s} {b}")
            for r in b["runs"]:
                if r.get("kind") == "manual" or r["state"] in ("skipped", "coalesced") or not r.get("fired_at"):
                    continue
                out.append({"j": j, "s": r["slot_ms"], "t": iso_ms(r["fired_at"]), "w": "raftsched"})
        return out

    def alive_fires_after(self, t_ms: float, jobs: list[str]) -> bool:
        lead = self.c.leader()
        if lead is None:
            return False
        s, b = self.c.get(lead, f"/v1/runs?limit={4 * len(jobs)}")
        return s == 200 and {r["job"] for r in b["runs"] if iso_ms(r["fired_at"]) > t_ms} >= set(jobs)


def ok_sleep(seconds: float) -> None:
    time.sleep(seconds)  # ok-sleep: a duration the scenario imposes (down time, pause, settle)


def ha_session(s, jobs: list[str], kills: int, pause_s: float, down_s: float, log) -> dict:
    """Fail-over, pause and whole-set restart on one running set ``s``; the sink counted per phase."""
    t_start = wall_ms()
    try:
        wait_for(lambda: s.alive_fires_after(t_start, jobs), 60, f"{s.label}: every job firing", interval_s=0.5)
        warm_ok = True
    except AssertionError:
        warm_ok = False
    t_warm = wall_ms()
    ok_sleep(SETTLE_S)
    trials = []
    for k in range(kills):
        i = s.active()
        s.signal(i, signal.SIGKILL)
        t_kill = wall_ms()
        ok_sleep(RESTART_AFTER_S)
        s.start(i)
        t_restart = wall_ms()
        ok_sleep(SETTLE_S)
        trials.append({"killed": i + 1, "t_kill": t_kill, "t_restart": t_restart})
        log(f"{s.label}: kill {k + 1}/{kills} of process {i + 1}")
    t_pause_phase = wall_ms()
    i = s.active()
    s.signal(i, signal.SIGSTOP)
    t_stop = wall_ms()
    ok_sleep(pause_s)
    s.signal(i, signal.SIGCONT)
    t_cont = wall_ms()
    ok_sleep(RESTART_AFTER_S)
    log(f"{s.label}: paused process {i + 1} for {pause_s} s")
    t_down = wall_ms()
    for j in range(s.n):
        s.signal(j, signal.SIGKILL)
    ok_sleep(down_s)
    s.start()
    t_up = wall_ms()
    # Watch until every job has fired again (at most RESTART_WATCH_S), then 5 s more: a system
    # whose processes take long to come back is not charged with slots it has not had time for.
    try:
        wait_for(lambda: s.alive_fires_after(t_up, jobs), RESTART_WATCH_S, f"{s.label}: every job firing after the restart",
                 interval_s=0.5)
    except AssertionError:
        pass
    ok_sleep(5.0)
    t_end = wall_ms()
    log(f"{s.label}: whole set down for {down_s} s and restarted")
    fires = s.fires()
    ph = phases(fires, EVERY_MS)
    for t in trials:
        t.update(first_fire_after(fires, t["t_kill"], jobs))
        t["kill_at"] = iso(t["t_kill"])
    first_kill = trials[0]["t_kill"] if trials else t_pause_phase
    cw = lambda lo, hi: count_window(fires, jobs, EVERY_MS, lo, hi, ph)  # noqa: E731
    out = {
        "jobs": len(jobs), "warm": warm_ok,
        "steady": cw(t_warm, first_kill),
        "failover": {**cw(first_kill, t_pause_phase), "kills": len(trials), "trials": trials,
                     "next_fire_ms": [t["next_fire_ms"] for t in trials],
                     "all_jobs_fired_ms": [t["all_jobs_fired_ms"] for t in trials]},
        "pause": {**cw(t_stop, t_down), "paused": i + 1, "pause_s": pause_s, **first_fire_after(fires, t_stop, jobs),
                  "fired_by_paused_after_cont": sum(1 for f in fires if f.get("w", "").endswith(f"-{i + 1}") and float(f["t"]) > t_cont
                                                    and int(f["s"]) < t_cont)},
        "restart": {"missed_window": cw(t_down, t_up), "after": cw(t_up, t_end - 2000), "down_s": down_s,
                    **first_fire_after(fires, t_up, jobs)},
    }
    return out


def run_peer_throughput(tmp: Path, procs: Procs, svc: Services, py: str, kind: str, tuned: bool, n: int, window_s: float,
                        warmup_s: float) -> dict:
    label = f"{'aps4' if kind == 'apscheduler4' else 'redbeat'}-{'tuned' if tuned else 'default'}-n{n}"
    s = PeerSet(tmp, procs, svc, py, kind, tuned, label)
    jobs = [f"j{k}" for k in range(n)]
    # The first slot leaves time for the setup (APScheduler 4 adds ~35 ms a schedule on a loaded
    # machine, RedBeat ~1 ms) and for three processes to start (several seconds on a loaded
    # machine). Should the setup overrun that, the window starts later: 8 s after the processes
    # started, so no slot of the window fell due before they ran.
    per_job_ms = 50 if kind == "apscheduler4" else 5
    base_ms = (int(wall_ms()) // 1000 + 10 + (per_job_ms * n) // 1000) * 1000
    setup_s = s.setup(n, base_ms)
    s.start()
    lo = max(base_ms + warmup_s * 1000, (int(wall_ms()) // 1000 + 8) * 1000)
    hi = lo + window_s * 1000
    try:
        ok_sleep(max(0.0, (hi - wall_ms()) / 1000 + 3.0))  # the window, then 3 s for its late fires
    finally:
        s.stop()
    out = throughput(s.fires(), jobs, EVERY_MS, lo, hi)
    out["setup_s"] = round(setup_s, 1)
    out["window_starts_after_first_slot_s"] = round((lo - base_ms) / 1000, 1)
    out["fell_behind"] = out["fired_slots"] < 0.95 * out["expected"] or (out["lag_ms"]["p99"] or 0) > 1000
    return out


def peers(tmp: Path, p: dict, clusters: list, fire_log_ok: bool, register_budget_s: float, log=None) -> dict:
    """The scenario: every system's throughput, then every system's HA session, one at a time."""
    def say(msg: str) -> None:
        print(f"[bench] peers: {msg}", file=sys.stderr)
    log = log or say
    ns, jobs_n, kills = p["peers_ns"], p["peers_jobs"], p["peers_kills"]
    pause_s, down_s, window_s, warmup_s = p["peers_pause_s"], p["peers_down_s"], p["peers_window_s"], p["peers_warmup_s"]
    res: dict = {"params": {"ns": ns, "jobs": jobs_n, "kills": kills, "pause_s": pause_s, "down_s": down_s,
                            "restart_after_s": RESTART_AFTER_S, "window_s": window_s}, "systems": {}}
    jobs = [f"j{k}" for k in range(jobs_n)]
    # raftsched first: its throughput through the sweep's code, then its HA session.
    ours: dict = {"throughput": {}}
    res["systems"]["raftsched"] = ours
    sw: dict = {}
    sweep(tmp / "peers-sweep", ns, window_s, warmup_s, clusters, fire_log_ok, register_budget_s, sw)
    for st in sw.get("steps", []):
        ours["throughput"][str(st["n"])] = {"fires_per_s": st.get("slots_per_s"), "lag_ms": st.get("lag_ms"),
                                            "fell_behind": st.get("fell_behind")}
    from ..harness import stop_clusters
    stop_clusters(clusters)
    base_ms = (int(wall_ms()) // 1000 - 5) * 1000
    rs = RaftSet(tmp / "peers-ha", clusters, jobs, base_ms)
    try:
        ours["ha"] = ha_session(rs, jobs, kills, pause_s, down_s, log)
    finally:
        stop_clusters(clusters)
    # The peers.
    procs = Procs(new_session=True)
    svc = None
    try:
        cannot: dict[str, str] = {}
        try:
            bins = ensure_services()
            py = peers_venv()
            (tmp / "peers-svc").mkdir()
            svc = Services(tmp / "peers-svc", procs, bins)
        except NotRun as e:
            cannot = {"apscheduler4": str(e), "redbeat": str(e)}
        if svc is not None:
            for kind, start in (("apscheduler4", svc.start_postgres), ("redbeat", svc.start_redis)):
                try:
                    start()
                except NotRun as e:
                    cannot[kind] = str(e)
            res["versions"] = _run([py, "-m", "pip", "freeze"], 60, "pip freeze").split()
        for kind, tuned in PEER_CONFIGS:
            key = f"{kind}-{'tuned' if tuned else 'default'}"
            r: dict = {"throughput": {}}
            res["systems"][key] = r
            if kind in cannot:
                r["not_run"] = cannot[kind]
                continue
            try:
                for n in ns:
                    log(f"{key}: throughput, N = {n}")
                    r["throughput"][str(n)] = run_peer_throughput(tmp / "peers-svc", procs, svc, py, kind, tuned, n, window_s, warmup_s)
                    if r["throughput"][str(n)]["fell_behind"]:
                        break
                s = PeerSet(tmp / "peers-svc", procs, svc, py, kind, tuned, f"{'aps4' if kind == 'apscheduler4' else 'redbeat'}-"
                            f"{'tuned' if tuned else 'default'}-ha")
                s.setup(jobs_n, (int(wall_ms()) // 1000 + 3) * 1000)
                s.start()
                try:
                    r["ha"] = ha_session(s, jobs, kills, pause_s, down_s, log)
                finally:
                    s.stop()
            except NotRun as e:
                r["not_run"] = str(e)
            except Exception as e:  # one peer's failure is reported; the others still run
                r["not_run"] = f"{type(e).__name__}: {e}"
            log(f"{key}: {json.dumps({k: v for k, v in r.items() if k != 'ha'})[:300]}")
    finally:
        procs.stop_all()
        if svc is not None:
            svc.stop()
    return res
