#!/usr/bin/env python3
"""Run one Jepsen-style test of raftsched against real node processes on 127.0.0.1.

    .venv/bin/python jepsen-style/run.py --profile ci --seed 7 [--time-limit 120]
        [--nemesis kill,pause,partition,clock,restart-all,worker,power,membership] [--store store]
        [--replay schedule.json] [--no-fsync]

1. Generate the workload and the fault schedule from the seed (generator.py), save schedule.json.
2. Start the fenced sink, the notifications receiver (events_receiver.py), one proxy per node pair (and one per remote worker and node), three nodes
   (fresh data dirs) dialling each other through the proxies, then the remote workers
   (``raftsched worker``, outside the quorum; the jobs placed on their label run only there).
   With the membership nemesis, two more node slots (ports, proxies) that it adds as new nodes;
   from then on "every node" below is every member of the moment.
3. Run the clients, the nemesis, a monitor (each node's role, term and commit index every 0.5 s,
   judged live for a follower whose commit index is frozen while the cluster's advances:
   checker.CommitWatch) and a reader (a node's whole run table every few seconds) until the time
   limit.
4. Heal everything; wait for the schedule to settle; read the final state through every node with
   ?consistent=true, and sample every node's state hash.
5. kill -9 the whole cluster, restart it on its data, read again.
6. Stop every process (by PID, also on failure), run the checkers (checker.py), write
   store/<time>-<seed>/: schedule.json, history.jsonl, sink.jsonl, events.jsonl, monitor.jsonl, reads.jsonl,
   final-states.json, nodes/*.log, results.json, verdict.txt, timeline.png.

Exit status: 0 when no checker says invalid (valid or unknown), 1 when one does, 2 when the
harness itself failed.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aiohttp  # noqa: E402

import checker  # noqa: E402
import generator  # noqa: E402
from client import History, client_loop  # noqa: E402
from nemesis import Nemesis  # noqa: E402
from processes import ClusterProcs  # noqa: E402
from raftsched.testing.cluster import agreed_leader  # noqa: E402

MONITOR_PERIOD_S = 0.5
#: The sink the notifications checker reads, and the kinds the default tenant's jobs send it.
NOTIFY_SINK = "jepsen"
NOTIFY_KINDS = ("run.dead", "job.recovered", "slot.missed", "job.paused", "job.resumed", "run.requeued",
                "run.unplaceable")
READER_PERIOD_S = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_ms(text):
    """An ISO-8601 UTC time as the API writes it (raftsched.core.schedule.iso) -> integer ms."""
    if text is None:
        return None
    d = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((d - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) / dt.timedelta(milliseconds=1))


def compact_run(r: dict) -> dict:
    """The fields the checkers use, times as integer ms."""
    out = {k: r.get(k) for k in ("id", "job", "slot_ms", "state", "kind", "attempt", "fencing_token",
                                 "worker", "reason", "count", "error", "backfill", "requeue")}
    if r.get("upstream") is not None:  # a pipeline child's parents (checker.check_pipeline)
        out["upstream"] = [u.get("run") for u in r["upstream"]]
    for k in ("fired_at", "started_at", "finished_at", "slot_to", "due"):
        out[k] = iso_ms(r.get(k))
    if r.get("attempts") is not None:
        out["attempts"] = [{"attempt": a.get("attempt"), "token": a.get("token"), "worker": a.get("worker"),
                            "ok": a.get("ok"), "error": a.get("error"), "released": bool(a.get("released")),
                            "started_at": iso_ms(a.get("started_at")), "finished_at": iso_ms(a.get("finished_at"))}
                           for a in r["attempts"]]
    return out


def compact_job(j: dict) -> dict:
    st = j.get("state", {})
    return {"name": j["name"], "spec": j["spec"], "paused": st.get("paused"), "cursor": iso_ms(st.get("cursor")),
            "next": iso_ms(st.get("next_slot")), "created": iso_ms(st.get("created_at")),
            "generation": st.get("generation")}


class Run:
    def __init__(self, args, sched: dict, run_dir: Path, work: Path) -> None:
        self.args = args
        self.sched = sched
        self.run_dir = run_dir
        self.work = work
        self.cp = ClusterProcs(work, sched["lease_ttl_s"], product=Path(args.product),
                               remote_workers=tuple(sched.get("remote_workers") or ()),
                               worker_labels=sched.get("fleet_labels"),
                               power_model=bool(sched.get("power_model")), fsync=sched.get("fsync", True),
                               spares=sched.get("spares", 0))
        self.history = History(run_dir / "history.jsonl")
        self.monitor: list[dict] = []
        self.periodic: list[dict] = []
        self.reads: dict[str, dict] = {}
        self.hashes: dict[str, list] = {}
        self.times: dict[str, int] = {}
        self.settle: dict = {}
        self.notes: list[str] = []
        self.session: aiohttp.ClientSession | None = None
        self.nemesis: Nemesis | None = None
        #: the live view of commit progress (the checker judges the stored samples again)
        self.commit_watch = checker.CommitWatch()
        self._monitor_f = open(run_dir / "monitor.jsonl", "a")
        self._reads_f = open(run_dir / "reads.jsonl", "a")

    # ------------------------------------------------------------------ HTTP helpers
    async def get(self, i: int, path: str, timeout_s: float = 5.0):
        async with self.session.get(self.cp.nodes[i].url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status, await r.json(content_type=None)

    async def get_retry(self, i: int, path: str, tries: int = 5, timeout_s: float = 10.0):
        last = None
        for _ in range(tries):
            try:
                s, b = await self.get(i, path, timeout_s)
                if s == 200:
                    return b
                last = f"HTTP {s}: {b}"
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
                last = repr(e)
            await asyncio.sleep(1.0)
        raise RuntimeError(f"GET {path} on node {i + 1} failed {tries} times: {last}")

    async def wait_leader(self, timeout_s: float) -> int:
        """The agreed leader, named by every member (``agreed_leader``, unanimous): what follows
        reads every member."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            members = list(self.cp.members)
            sts = await asyncio.gather(*(self.nemesis.status(i) for i in members))
            i = agreed_leader(dict(zip(members, sts)), self.nemesis.addrs(), unanimous=True,
                              voters=self.nemesis.voter_addrs())
            if i is not None:
                return i
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no leader agreed by all {len(self.cp.members)} members within {timeout_s}s")

    async def try_wait_leader(self, timeout_s: float, when: str) -> bool:
        """wait_leader, but a cluster that elects no leader is the product's failure (a liveness
        counterexample), not the harness's: record it and carry on to the reads."""
        try:
            await self.wait_leader(timeout_s)
            return True
        except RuntimeError as e:
            self.notes.append(f"{when}: {e}")
            self.settle.setdefault("no_leader", []).append(f"{when}: {e}")
            return False

    # ------------------------------------------------------------------ background tasks
    async def monitor_loop(self) -> None:
        """Every node's ``/v1/cluster`` together, every MONITOR_PERIOD_S, to monitor.jsonl (one
        round: one ``t_ms``); each round also goes to the live commit-progress watch, which
        reports a stalled follower at once (printed, in the history and in the verdict's notes);
        the checker judges the stored rounds again at the end."""
        while True:
            t = now_ms()
            sts = await asyncio.gather(*(self.nemesis.status(i, 0.8) for i in range(len(self.cp.nodes))))
            round_ = {}
            for i, s in enumerate(sts):
                rec = {"t_ms": t, "node": i, "up": s is not None, "alive": self.cp.node_alive(i),
                       "paused": self.cp.node_paused(i)}
                if s:
                    rec.update(role=s.get("role"), leader=s.get("leader"), term=s.get("term"),
                               commit=s.get("commit_index"), running=(s.get("worker") or {}).get("running"))
                    # The product's own view of its commit stall (a figure; the check does not use it).
                    repl = s.get("replication") or {}
                    if repl.get("commit_stalled_s") is not None:
                        rec["stalled_s"] = repl["commit_stalled_s"]
                    if s.get("conditions"):
                        rec["conditions"] = sorted({str(c.get("type")) for c in s["conditions"] if isinstance(c, dict)})
                self.monitor.append(rec)
                round_[i] = rec
                self._monitor_f.write(json.dumps(rec) + "\n")
            self._monitor_f.flush()
            for sp in self.commit_watch.feed(t, round_, checker.excused_nodes(self.nemesis.log, t)):
                text = checker.describe_stall(sp, self.times.get("t0_ms"))
                print(f"run.py: follower stalled (seen live): {text}", flush=True)
                self.history.add({"process": "monitor", "type": "info", "f": "follower-stalled", "stall": sp})
                self.notes.append(f"follower stalled (seen live): {text}")
            await asyncio.sleep(MONITOR_PERIOD_S)

    async def read_node(self, i: int, consistent: bool, phase: str, full: bool = True) -> dict:
        c = "true" if consistent else "false"
        # Reads are consistent unless they ask for the replica as it is (node/reads.py).
        q = "consistent=true" if consistent else "stale=true"
        rec = {"node": i, "phase": phase, "consistent": consistent, "t_start_ms": now_ms()}
        if full:
            rec["cluster"] = await self.get_retry(i, f"/v1/cluster?consistent={c}&hash=true")
            jobs = await self.get_retry(i, f"/v1/jobs?{q}&limit=1000")
            rec["jobs"] = [compact_job(j) for j in jobs["jobs"]]
            bfs = await self.get_retry(i, f"/v1/backfills?{q}")
            rec["backfills"] = [{k: b.get(k) for k in ("id", "kind", "job", "state", "reason", "progress")}
                                for b in bfs["backfills"]]
            s, sink = await self.get(i, f"/v1/sinks/{NOTIFY_SINK}?{q}")
            rec["sink"] = sink if s == 200 else None
            runs = {"runs": await self.all_runs(i, q)}
        else:
            s, runs = await self.get(i, f"/v1/runs?{q}&limit=10000", 5.0)
            if s != 200:
                raise RuntimeError(f"HTTP {s}")
        rec["runs"] = [compact_run(r) for r in runs["runs"]]
        rec["t_end_ms"] = now_ms()
        self._reads_f.write(json.dumps(rec) + "\n")
        self._reads_f.flush()
        return rec

    async def all_runs(self, i: int, q: str, tries: int = 3) -> list[dict]:
        """Every run and record node ``i`` holds, newest first: pages of 10 000, each after the
        ``next`` of the one before (a soak past ~1 000 s holds more than one page). A page whose
        cursor was trimmed meanwhile (400) starts the read again."""
        last = None
        for _ in range(tries):
            out: list[dict] = []
            page = await self.get_retry(i, f"/v1/runs?{q}&limit=10000")
            out.extend(page["runs"])
            while page.get("next"):
                try:
                    s, b = await self.get(i, f"/v1/runs?{q}&limit=10000&before={urllib.parse.quote(page['next'], safe='')}",
                                          10.0)
                except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
                    s, b = None, repr(e)
                if s != 200:
                    last = f"HTTP {s}: {b}"
                    break
                page = b
                out.extend(page["runs"])
            else:
                return out
        raise RuntimeError(f"reading every run of node {i + 1} failed {tries} times: {last}")

    async def reader_loop(self) -> None:
        k = 0
        while True:
            await asyncio.sleep(READER_PERIOD_S)
            members = sorted(self.cp.members)
            i = members[k % len(members)]
            k += 1
            if not self.cp.node_alive(i) or self.cp.node_paused(i):
                continue
            try:
                self.periodic.append(await self.read_node(i, consistent=bool(k % 2), phase="periodic", full=False))
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError, RuntimeError):
                pass  # a read that fails tells nothing

    # ------------------------------------------------------------------ phases
    async def settle_schedule(self, heal_ms: int) -> None:
        """Wait until every run fired before the heal has finished (bounded), and at least long
        enough for every job to have fired again."""
        t_start = time.monotonic()
        every_max = max(((o["spec"].get("schedule") or {}).get("every_s", 3) for o in self.sched["ops"] if "spec" in o),
                        default=3)
        min_wait = every_max + 3
        pending, held = [], []
        while time.monotonic() - t_start < 45:
            try:
                leader = await self.wait_leader(10)
                q = (await self.get(leader, "/v1/runs?state=queued&limit=10000", 5))[1]["runs"]
                r = (await self.get(leader, "/v1/runs?state=running&limit=10000", 5))[1]["runs"]
                # A run fired ahead and held by its job's pause (due null) waits for the resume,
                # not for a worker: the checker holds it to its job being paused at the end.
                held = [x["id"] for x in q if x["slot_ms"] <= heal_ms and x.get("due") is None]
                pending = [x["id"] for x in q + r if x["slot_ms"] <= heal_ms and x["id"] not in held]
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, RuntimeError) as e:
                pending = [f"(read failed: {e!r})"]
            if not pending and time.monotonic() - t_start >= min_wait:
                break
            await asyncio.sleep(1.0)
        self.settle = {"waited_s": round(time.monotonic() - t_start, 1), "pending_at_end": pending[:20],
                       "pending_count": len(pending), "held_at_end": held[:1000]}

    async def sample_hashes(self, phase: str, duration_s: float = 10.0) -> None:
        """Every node's (state_applied, state_hash), sampled together until each pair of nodes
        was seen at the same applied count three times (or the time is up)."""
        samples = []
        seen_pairs: dict[tuple, int] = {}
        members = sorted(self.cp.members)
        npairs = len(members) * (len(members) - 1) // 2
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            t = now_ms()

            async def one(i):
                try:
                    s, b = await self.get(i, "/v1/cluster?hash=true", 2.0)
                    return b if s == 200 else None
                except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError):
                    return None
            sts = await asyncio.gather(*(one(i) for i in members))
            for i, s in zip(members, sts):
                if s and "state_hash" in s:
                    samples.append({"t_ms": t, "node": i, "applied": s["state_applied"], "hash": s["state_hash"]})
            by_applied: dict[int, set] = {}
            for smp in samples:
                by_applied.setdefault(smp["applied"], set()).add(smp["node"])
            seen_pairs = {}
            for nodes in by_applied.values():
                for a in nodes:
                    for b in nodes:
                        if a < b:
                            seen_pairs[(a, b)] = seen_pairs.get((a, b), 0) + 1
            if len(seen_pairs) == npairs and min(seen_pairs.values()) >= 3:
                break
            await asyncio.sleep(0.05)
        self.hashes[phase] = samples

    async def final_reads(self, phase: str) -> None:
        out = {}
        for i in sorted(self.cp.members):
            try:
                out[str(i)] = await self.read_node(i, consistent=True, phase=phase)
            except RuntimeError as e:
                out[str(i)] = {"node": i, "phase": phase, "error": str(e), "t_start_ms": now_ms()}
                self.notes.append(f"{phase} read of node {i + 1} failed: {e}")
        self.reads[phase] = out

    async def subscribe(self) -> None:
        """The notifications under test (checker.check_notifications): a webhook sink to the
        receiver, sent every event of the default tenant's jobs (its default routes: the
        generator's jobs name none) and the cluster's own."""
        sink = {"type": "webhook", "url": f"http://127.0.0.1:{self.cp.events_port}/events",
                "secrets": {"signing_key": self.cp.events_key},
                "subscribe": ["cluster.leader_changed", "cluster.no_leader", "worker.lost"],
                "retry": {"max_attempts": 20, "backoff_s": 1, "backoff_max_s": 5}}
        routes = {"notify": [{"sink": NOTIFY_SINK, "on": list(NOTIFY_KINDS)}]}
        for path, body in ((f"/v1/sinks/{NOTIFY_SINK}", sink), ("/v1/tenants/default", routes)):
            for attempt in range(10):
                try:
                    i = self.nemesis.member(attempt)
                    async with self.session.put(self.cp.nodes[i].url + path, json=body,
                                                timeout=aiohttp.ClientTimeout(total=10)) as r:
                        if r.status in (200, 201):
                            break
                except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
                    pass
                await asyncio.sleep(1.0)
            else:
                self.notes.append(f"PUT {path} failed: notifications not exercised")

    # ------------------------------------------------------------------ main
    async def main(self) -> None:
        sched = self.sched
        cp = self.cp
        cp.plan_file.write_text(json.dumps(sched["plan"]))
        cp.plan_file.chmod(0o644)  # read by the runs, as the run user
        cp.start_sink()
        cp.start_events()
        cp.start_proxy()
        for i in cp.members:
            cp.start_node(i)
        connector = aiohttp.TCPConnector(force_close=True, limit=50)
        # Every request needs a token, reads included (the nodes' bootstrap admin token).
        async with aiohttp.ClientSession(connector=connector,
                                         headers={"Authorization": f"Bearer {cp.token}"}) as session:
            self.session = session
            self.nemesis = Nemesis(cp, self.history, session, sched["plan"])
            await self.wait_leader(60)
            await self.subscribe()
            for w in cp.remote_workers:
                cp.start_worker(w)
            t0 = time.monotonic()
            self.times["t0_ms"] = now_ms()
            self.history.add({"process": "harness", "type": "info", "f": "start"})
            print(f"run.py: cluster up; workload and faults for {sched['time_limit_s']:.0f}s; commit progress watched "
                  f"live (a node under no fault frozen > {checker.COMMIT_STALL_MS / 1000:g} s below the cluster's rising "
                  f"commit index, {checker.COMMIT_GRACE_MS / 1000:g} s grace after its faults)", flush=True)
            stop = asyncio.Event()
            bg = [asyncio.create_task(self.monitor_loop(), name="monitor"),
                  asyncio.create_task(self.reader_loop(), name="reader")]
            clients = []
            for c in range(sched["clients"]):
                ops = [o for o in sched["ops"] if o["client"] == c]
                clients.append(asyncio.create_task(
                    client_loop(f"client-{c}", ops, t0, cp.nodes, cp.token, self.history, session, stop,
                                route=self.nemesis.member)))
            nem = asyncio.create_task(self.nemesis.run(sched["faults"], t0), name="nemesis")
            # The workload runs for the whole time limit, whatever the nemesis does.
            await asyncio.sleep(max(0.0, t0 + sched["time_limit_s"] - time.monotonic()))
            if not nem.done():
                remaining = t0 + sched["time_limit_s"] + 15 - time.monotonic()
                try:
                    await asyncio.wait_for(nem, timeout=max(remaining, 1))
                except asyncio.TimeoutError:
                    self.notes.append("the nemesis overran the time limit; cancelled")
            if nem.done() and not nem.cancelled() and nem.exception():
                raise nem.exception()
            await self.nemesis.drain()  # a burst whose fault was cut short
            stop.set()
            await asyncio.wait(clients, timeout=20)
            for t in clients:
                t.cancel()
            self.nemesis.heal()
            self.times["heal_ms"] = now_ms()
            print("run.py: healed; waiting for the schedule to settle", flush=True)
            if await self.try_wait_leader(60, "after healing"):
                await self.settle_schedule(self.times["heal_ms"])
            self.times["settled_ms"] = now_ms()
            await self.final_reads("final")
            self.times["final_read_ms"] = now_ms()
            await self.sample_hashes("final")
            print("run.py: kill -9 of the whole cluster, restart, read again", flush=True)
            self.history.add({"process": "harness", "type": "invoke", "f": "restart-all"})
            members = sorted(cp.members)
            for i in members:
                cp.signal_node(i, signal.SIGKILL)
            self.times["restart_ms"] = now_ms()
            final_restart = {"id": "final-restart", "kind": "restart-all", "nodes": members,
                             "start_ms": self.times["restart_ms"],
                             "fault": {"kind": "restart-all", "target": "all", "harness": True}}
            self.nemesis.log.append(final_restart)
            for i in members:
                cp.start_node(i)
            final_restart["end_ms"] = now_ms()
            await self.try_wait_leader(60, "after the full restart")
            self.history.add({"process": "harness", "type": "info", "f": "restart-all"})
            # Let the new leader's takeover fire what fell due while the cluster was down, so the
            # read after the restart judges a running schedule, not the first instants of a term.
            await asyncio.sleep(3.0)
            await self.final_reads("restart")
            self.times["restart_read_ms"] = now_ms()
            await self.sample_hashes("restart")
            for t in bg:
                t.cancel()
            await asyncio.gather(*bg, return_exceptions=True)
            self.times["end_ms"] = now_ms()

    def data(self) -> dict:
        sink = []
        try:
            with open(self.run_dir / "sink.jsonl") as f:
                for line in f:
                    try:
                        sink.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        events = []
        try:
            with open(self.run_dir / "events.jsonl") as f:
                for line in f:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return {"schedule": self.sched, "history": self.history.ops, "sink": sink, "reads": self.reads,
                "events": events,
                "periodic": self.periodic, "monitor": self.monitor, "faults": self.nemesis.log if self.nemesis else [],
                "hashes": self.hashes, "times": self.times, "settle": self.settle,
                "nodes": [{"id": n.id, "raft": n.raft} for n in self.cp.nodes], "members": sorted(self.cp.members),
                "remote_workers": list(self.cp.remote_workers), "notes": self.notes}

    def collect(self) -> None:
        (self.run_dir / "nodes").mkdir(exist_ok=True)
        for n in self.cp.nodes:
            if n.log.exists():
                shutil.copy(n.log, self.run_dir / "nodes" / f"{n.id}.log")
        for w in self.cp.remote_workers:
            if self.cp.worker_log(w).exists():
                shutil.copy(self.cp.worker_log(w), self.run_dir / "nodes" / f"{w}.log")
        for name in ("sink.jsonl", "sink.out", "events.jsonl", "events.out", "proxy.log", "plan.json"):
            if (self.work / name).exists():
                shutil.copy(self.work / name, self.run_dir / name)
        self._monitor_f.close()
        self._reads_f.close()
        self.history.close()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(generator.PROFILES), default="ci")
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds of workload and faults (profile default)")
    ap.add_argument("--nemesis", default=",".join(generator.NEMESES),
                    help=f"comma-separated subset of {','.join(generator.NEMESES)} (or 'none')")
    ap.add_argument("--store", default=str(HERE.parent / "store"))
    ap.add_argument("--replay", default=None, help="a saved schedule.json to run exactly (overrides seed, profile, ...)")
    ap.add_argument("--product", default=str(HERE.parent),
                    help="the source tree whose raftsched the nodes run (default: this repository)")
    ap.add_argument("--keep-data", action="store_true", help="keep the nodes' data directories")
    ap.add_argument("--no-fsync", action="store_true",
                    help="run the nodes with --no-fsync (to see the power nemesis find what that loses)")
    ap.add_argument("--no-plot", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replay:
        sched = json.loads(Path(args.replay).read_text())
    else:
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
        nemeses = [] if args.nemesis in ("", "none") else [n.strip() for n in args.nemesis.split(",") if n.strip()]
        bad = set(nemeses) - set(generator.NEMESES)
        if bad:
            print(f"run.py: unknown nemesis {', '.join(sorted(bad))}", file=sys.stderr)
            return 2
        sched = generator.generate(seed, args.profile, args.time_limit, nemeses)
    if args.no_fsync:
        sched["fsync"] = False
    seed = sched["seed"]
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    run_dir = Path(args.store) / f"{stamp}-{seed}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "schedule.json").write_text(json.dumps(sched, indent=1))
    print(f"run.py: seed {seed}, profile {sched['profile']}, {len(sched['faults'])} faults, "
          f"{len(sched['ops'])} client ops; store {run_dir}", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"jepsen-{seed}-"))
    run = Run(args, sched, run_dir, work)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    harness_error = None
    try:
        asyncio.run(run.main())
    except BaseException as e:  # noqa: BLE001 - a harness failure still stops every process
        harness_error = "".join(traceback.format_exception(e))
        print(f"run.py: harness failed: {e!r}", file=sys.stderr)
    finally:
        run.cp.stop_all()
        run.collect()
        if not args.keep_data:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"run.py: data kept in {work}")
    data = run.data()
    results = checker.check_all(data)
    if harness_error:
        results["harness_error"] = harness_error
        results["valid"] = "unknown" if results["valid"] != "invalid" else "invalid"
    (run_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (run_dir / "final-states.json").write_text(json.dumps(run.reads, default=str))
    (run_dir / "run-data.json").write_text(json.dumps({k: data[k] for k in ("faults", "hashes", "times", "settle", "nodes",
                                                                           "members", "remote_workers", "notes")},
                                                      default=str))
    verdict = checker.render_verdict(results, data, run_dir)
    try:
        context = checker.log_context(results, run_dir / "nodes")
    except Exception as e:  # a view of the logs; its failure does not change the verdict
        context = [f"run.py: log context failed: {e!r}"]
    if context:
        verdict += "\n" + "\n".join(context) + "\n"
    (run_dir / "verdict.txt").write_text(verdict)
    if not args.no_plot:
        try:
            import timeline
            timeline.plot(data, results, run_dir / "timeline.png")
        except Exception as e:  # the plot is a view; its failure does not change the verdict
            print(f"run.py: timeline.png failed: {e!r}", file=sys.stderr)
    print(verdict)
    if harness_error:
        return 2
    return 1 if results["valid"] == "invalid" else 0


if __name__ == "__main__":
    sys.exit(main())
