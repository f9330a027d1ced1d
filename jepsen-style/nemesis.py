"""The nemesis: runs the fault schedule against the live cluster and records every fault in the
history (``invoke`` when it starts, ``info`` when it is in place, again when healed), with the
node it actually hit. ``heal`` undoes everything at once.

A partition with a ``burst`` (generator.burst_op) also drives writes while it is in place: one
writer puts jobs through the isolated node, two through the majority, each an ordinary client
operation in the history (process ``client-burst<fault id>-<writer>``), so the checkers judge
them as any other.

The membership faults (``member-*``, nemesis ``membership``) change the cluster's members while
a node is killed or cut off: a killed member replaced by a new node at other ports, a node
added while another is partitioned and one removed after the heal, the leader removed (it hands
its leadership over) and a new node added. Each request and its answer are in the history
(``f``: ``member-add``, ``member-remove``); ``cp.members`` follows what the cluster committed,
and every other fault and the clients aim at the members of the moment."""
from __future__ import annotations

import asyncio
import signal
import time
import urllib.parse

import aiohttp

from raftsched.testing.cluster import agreed_leader

import generator
from client import History, perform
from processes import ClusterProcs

#: How long a fault aimed at the leader waits for an agreed leader before it falls back to its
#: pre-drawn node; longer for a burst, whose point is a deposed leader.
LEADER_WAIT_S = 5.0
BURST_LEADER_WAIT_S = 10.0
#: How long a membership request is tried (through each live member in turn, while there is no
#: leader or the answer is unknown), and how long a node added may take to become a voter.
MEMBER_TRY_S = 20.0
MEMBER_VOTER_S = 30.0


class Nemesis:
    def __init__(self, cp: ClusterProcs, history: History, session: aiohttp.ClientSession,
                 plan: dict | None = None) -> None:
        self.cp = cp
        #: jobs whose attempts work long (>= 0.8 s): a worker paused while running one is paused
        #: between its two sink writes, and its late "end" write is the stale write fencing refuses
        self.long_jobs = {j for j, p in ((plan or {}).get("jobs") or {}).items() if p["work_ms"][0] >= 800}
        self.history = history
        self.session = session
        self.down: set[int] = set()          # killed, not restarted yet
        self.paused: set[int] = set()
        self.cut: set[str] = set()           # links not in pass mode
        self.shifted: set[int] = set()       # nodes with a clock offset
        self.workers_down: set[str] = set()  # remote workers killed, not restarted yet
        self.workers_paused: set[str] = set()
        self.workers_cut: set[str] = set()
        #: fault intervals as they happened, for the checkers and the timeline
        self.log: list[dict] = []
        #: how the last resolved target was found: "leader", "worker", or "pre-drawn"
        self.resolved_as = "pre-drawn"
        #: write bursts under way or done (task, the event that ends it), awaited by ``drain``
        self.bursts: list[tuple[asyncio.Task, asyncio.Event]] = []
        #: the log entry of the fault under way
        self.entry: dict = {}

    async def status(self, i: int, timeout_s: float = 1.0) -> dict | None:
        try:
            async with self.session.get(self.cp.nodes[i].url + "/v1/cluster",
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return await r.json() if r.status == 200 else None
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None

    async def leader(self, wait_s: float = 5.0) -> int | None:
        """The agreed leader among the live nodes (``agreed_leader``: it says it leads and a
        majority of the cluster names it; not every node, since another one may be down or cut
        off right now), waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        while True:
            live = self.live()
            sts = await asyncio.gather(*(self.status(i) for i in live))
            i = agreed_leader(dict(zip(live, sts)), self.addrs(), voters=self.voter_addrs())
            if i is not None:
                return i
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.2)

    def live(self) -> list[int]:
        """The members that are neither killed nor paused (by this nemesis)."""
        return [i for i in self.cp.members if i not in self.down and i not in self.paused]

    def addrs(self) -> dict[int, str]:
        return {i: n.raft for i, n in enumerate(self.cp.nodes)}

    def voter_addrs(self) -> list[str]:
        return [self.cp.nodes[i].raft for i in self.cp.members]

    def member(self, k: int) -> int:
        """The pre-drawn node ``k`` (0-2) of a fault, as one of the members of the moment."""
        members = sorted(self.cp.members)
        return members[k % len(members)]

    async def worker_with_leases(self, long_only: bool = False) -> int | None:
        """The follower whose worker holds the most leases (running runs) right now; with
        ``long_only``, counting only runs of long-working jobs."""
        for i in list(self.cp.members):
            if i in self.down or i in self.paused:
                continue
            try:
                async with self.session.get(self.cp.nodes[i].url + "/v1/runs?state=running&limit=1000&stale=true",
                                            timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status != 200:
                        continue
                    runs = (await r.json())["runs"]
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError):
                continue
            count: dict[int, int] = {}
            for run in runs:
                if long_only and run.get("job") not in self.long_jobs:
                    continue
                w = run.get("worker") or ""
                try:
                    n = int(w.split("/")[0].split("-")[1]) - 1
                except (IndexError, ValueError):
                    continue
                count[n] = count.get(n, 0) + 1
            best = sorted((c, n) for n, c in count.items()
                          if n not in self.down and n not in self.paused and n in self.cp.members)
            if best:
                return best[-1][1]
            return None
        return None

    async def remote_worker(self, f: dict) -> str:
        """The remote worker holding the most leases now (of long-working jobs when there are),
        among those that run and are neither paused nor cut off; else the pre-drawn one."""
        ok = [w for w in self.cp.remote_workers
              if w not in self.workers_down and w not in self.workers_paused and w not in self.workers_cut]
        for k in range(25):
            for i in list(self.cp.members):
                if i in self.down or i in self.paused:
                    continue
                try:
                    async with self.session.get(self.cp.nodes[i].url + "/v1/runs?state=running&limit=1000&stale=true",
                                                timeout=aiohttp.ClientTimeout(total=2)) as r:
                        runs = (await r.json())["runs"] if r.status == 200 else None
                except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError):
                    runs = None
                if runs is None:
                    continue
                count: dict[str, int] = {}
                for run in runs:
                    if run.get("worker") in ok and (k >= 20 or run.get("job") in self.long_jobs):
                        count[run["worker"]] = count.get(run["worker"], 0) + 1
                if count:
                    return max(sorted(count), key=count.get)
                break
            await asyncio.sleep(0.15)
        return f["worker"] if f["worker"] in ok or not ok else ok[0]

    async def resolve(self, f: dict) -> int:
        target = f.get("target")
        if target == "leader":
            i = await self.leader(BURST_LEADER_WAIT_S if f.get("burst") else LEADER_WAIT_S)
        elif target == "worker":
            i = None
            for k in range(25):  # a moment when a worker is inside a long attempt, else any lease
                i = await self.worker_with_leases(long_only=k < 20)
                if i is not None:
                    break
                await asyncio.sleep(0.15)
        else:
            i = None
        self.resolved_as = "pre-drawn" if i is None else target
        return self.member(f["node"]) if i is None else i

    def _rec(self, f: dict, type_: str, what: str, **kw) -> None:
        self.history.add({"process": "nemesis", "type": type_, "f": what, "fault": f, **kw})

    async def run(self, faults: list[dict], t0: float) -> None:
        for f in faults:
            delay = t0 + f["at"] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            entry = {"id": f["id"], "kind": f["kind"], "start_ms": time.time_ns() // 1_000_000, "fault": f}
            self.log.append(entry)
            self.entry = entry
            hit = await self.start(f)
            entry["workers" if f["kind"].startswith("worker-") else "nodes"] = hit
            entry.setdefault("in_place_ms", time.time_ns() // 1_000_000)
            if not f["kind"].startswith("worker-") and f["kind"] not in ("restart-all", "power"):
                entry["resolved"] = self.resolved_as
            done = asyncio.Event()
            if f.get("burst") and f["kind"] == "partition":
                self.bursts.append((asyncio.create_task(self.burst(f, hit[0], entry, done), name=f"burst-{f['id']}"), done))
            await asyncio.sleep(max(0.0, f["duration"] - (time.monotonic() - (t0 + f["at"]))))
            done.set()
            await self.stop(f, hit)
            entry["end_ms"] = time.time_ns() // 1_000_000
        await self.drain()

    async def drain(self, timeout_s: float = 20.0) -> None:
        """End every burst (also one whose fault was cut short) and wait for its last requests (a
        put sent to an isolated node may wait for its deadline), then cancel what is left: its
        invoke stays in the history without a completion, which the checkers count as info."""
        for _, done in self.bursts:
            done.set()
        tasks = [t for t, _ in self.bursts]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def burst(self, f: dict, isolated: int, entry: dict, done: asyncio.Event) -> None:
        """Writes while partition ``f`` cuts off node ``isolated`` (the leader it resolved): each
        writer makes its puts (generator.burst_op) one at a time, at the burst's rate, through the
        isolated node or the two others in turn, until the partition ends. What it did goes into
        the fault's log entry (``burst``) and is printed."""
        b = f["burst"]
        majority = [j for j in self.cp.members if j != isolated]
        stats = {"writes": 0, "ok": 0, "fail": 0, "info": 0, "bytes_ok": 0, "isolated": isolated + 1,
                 "resolved": entry.get("resolved")}
        entry["burst"] = stats
        print(f"nemesis: fault {f['id']}: node-{isolated + 1} ({entry.get('resolved')}) cut off ({f['mode']}) for "
              f"{f['duration']:.1f} s under write load: {len(b['writers'])} writers at {b['rate_per_s']}/s, "
              f"{b['pad_bytes']} B payloads", flush=True)

        async def writer(w: int, spec: dict) -> None:
            nodes = [isolated] if spec["via"] == "isolated" else majority
            t_start = time.monotonic()
            for k in range(generator.burst_ops_max(f)):
                delay = t_start + k / b["rate_per_s"] - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(done.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                if done.is_set():
                    return
                op = dict(generator.burst_op(b, spec, k), node=nodes[k % len(nodes)])
                rec = await perform(self.session, self.cp.nodes[op["node"]].url, self.cp.token, op, self.history,
                                    f"client-burst{f['id']}-{w}", f"burst{f['id']}-{w}-{k}-{op['f']}-{op['job']}")
                stats["writes"] += 1
                stats[rec["type"]] = stats.get(rec["type"], 0) + 1
                if rec["type"] == "ok":
                    stats["bytes_ok"] += len(op["spec"]["payload"]["pad"])

        await asyncio.gather(*(writer(w, spec) for w, spec in enumerate(b["writers"])))
        print(f"nemesis: fault {f['id']}: burst done: {stats['writes']} puts, {stats['ok']} ok "
              f"(~{stats['bytes_ok'] // 1024} KiB of payload committed), {stats['fail']} fail, {stats['info']} info",
              flush=True)

    async def start(self, f: dict) -> list:
        """Start fault ``f``; returns what it hit: node indexes, or remote worker ids for the
        worker-* kinds."""
        self._rec(f, "invoke", "start")
        kind = f["kind"]
        if kind.startswith("member-"):
            nodes = await self.membership_start(f)
            self._rec(f, "info", "start", nodes=nodes)
            return nodes
        if kind == "restart-all":
            nodes = sorted(self.cp.members)
            for i in nodes:
                self.cp.signal_node(i, signal.SIGKILL)
                self.down.add(i)
                self.paused.discard(i)
        elif kind == "power":
            # A majority (the agreed leader and the pre-drawn node, or another) or all three
            # members, killed together, then each data dir cut to what its disk synced.
            members = sorted(self.cp.members)
            if f.get("target") == "all":
                nodes = members
            else:
                lead = await self.leader(LEADER_WAIT_S)
                pre = self.member(f["node"])
                lead = pre if lead is None else lead
                other = pre if pre != lead else next(m for m in members if m != lead)
                nodes = sorted({lead, other})
            for i in nodes:
                self.cp.power_kill(i)
            cuts = {}
            for i in nodes:
                cuts[f"node-{i + 1}"] = await asyncio.to_thread(self.cp.power_cut, i)
                self.down.add(i)
                self.paused.discard(i)
            lost = {n: c["reverted"] + [f"{d} (gone)" for d in c["dropped"]] for n, c in cuts.items()}
            print(f"nemesis: fault {f['id']}: power cut on {', '.join(cuts)}; files reverted to what was synced: "
                  f"{lost}", flush=True)
            self._rec(f, "info", "start", nodes=nodes, power_cut=cuts)
            return nodes
        elif kind.startswith("worker-"):
            w = await self.remote_worker(f)
            if kind == "worker-kill":
                self.cp.signal_worker(w, signal.SIGKILL)
                self.workers_down.add(w)
            elif kind == "worker-pause":
                self.cp.signal_worker(w, signal.SIGSTOP)
                self.workers_paused.add(w)
            else:
                self.cp.set_worker_links(w, f["mode"])
                self.workers_cut.add(w)
            self._rec(f, "info", "start", workers=[w])
            return [w]
        else:
            i = await self.resolve(f)
            nodes = [i]
            if kind == "kill":
                self.cp.signal_node(i, signal.SIGKILL)
                self.down.add(i)
                self.paused.discard(i)
            elif kind == "pause":
                if i not in self.down:
                    self.cp.signal_node(i, signal.SIGSTOP)
                    self.paused.add(i)
            elif kind == "partition":
                self.isolate(i, f["mode"])
            elif kind == "clock":
                self.cp.set_clock(i, f["offset_ms"])
                self.shifted.add(i)
        self._rec(f, "info", "start", nodes=nodes)
        return nodes

    async def stop(self, f: dict, nodes: list) -> None:
        kind = f["kind"]
        if kind.startswith("worker-"):
            self._rec(f, "invoke", "stop", workers=nodes)
            for w in nodes:
                if kind == "worker-kill" and w in self.workers_down:
                    self.cp.start_worker(w)  # the same --id: a new process, with none of the old leases
                    self.workers_down.discard(w)
                elif kind == "worker-pause" and w in self.workers_paused:
                    self.cp.signal_worker(w, signal.SIGCONT)
                    self.workers_paused.discard(w)
                elif kind == "worker-partition" and w in self.workers_cut:
                    self.cp.set_worker_links(w, "pass")
                    self.workers_cut.discard(w)
            self._rec(f, "info", "stop", workers=nodes)
            return
        self._rec(f, "invoke", "stop", nodes=nodes)
        if kind.startswith("member-"):
            await self.membership_stop(f, nodes)
            self._rec(f, "info", "stop", nodes=nodes)
            return
        for i in nodes:
            if kind in ("kill", "restart-all", "power") and i in self.down:
                self.cp.start_node(i)
                self.down.discard(i)
            elif kind == "pause" and i in self.paused:
                self.cp.signal_node(i, signal.SIGCONT)
                self.paused.discard(i)
            elif kind == "partition":
                self.isolate(i, "pass")
            elif kind == "clock":
                self.cp.set_clock(i, 0)
                self.shifted.discard(i)
        self._rec(f, "info", "stop", nodes=nodes)

    def isolate(self, i: int, mode: str) -> None:
        """Cut node i off from every other node (``pass``: reconnect it)."""
        for j in range(len(self.cp.nodes)):
            if j != i:
                name = self.cp.link_between(i, j)
                self.cp.set_link(name, mode)
                if mode == "pass":
                    self.cut.discard(name)
                else:
                    self.cut.add(name)

    # -------------------------------------------------------------------------------- membership
    async def member_request(self, what: str, method: str, path: str, body=None, avoid: int | None = None) -> dict:
        """One membership request, through each live member in turn (any forwards it to the
        leader) until a definite answer or MEMBER_TRY_S: a 503 (no leader), a 504 or a lost
        connection is tried again (the request is declarative: asking again is safe). Returns
        its record in the history."""
        f = self.entry["fault"]
        self._rec(f, "invoke", what, path=path)
        deadline = time.monotonic() + MEMBER_TRY_S
        k, last = 0, None
        while True:
            via = [i for i in self.live() if i != avoid] or self.live()
            i = via[k % len(via)] if via else None
            k += 1
            if i is not None:
                try:
                    async with self.session.request(method, self.cp.nodes[i].url + path, json=body,
                                                    timeout=aiohttp.ClientTimeout(total=12)) as r:
                        last = {"status": r.status, "value": await r.json(content_type=None), "via": i}
                except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
                    last = {"status": None, "error": repr(e), "via": i}
                if last["status"] is not None and last["status"] not in (503, 504):
                    break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        ok = last is not None and last["status"] in (200, 202)
        self.history.add({"process": "nemesis", "type": "ok" if ok else "fail", "f": what, "fault": f, **(last or {})})
        print(f"nemesis: fault {f['id']}: {what} {path} -> {(last or {}).get('status')} "
              f"{str((last or {}).get('value') or (last or {}).get('error'))[:160]}", flush=True)
        return dict(last or {}, ok=ok)

    async def wait_voter(self, i: int) -> bool:
        """Until node i is a voter of the committed configuration, as the agreed leader says."""
        addr = self.cp.nodes[i].raft
        deadline = time.monotonic() + MEMBER_VOTER_S
        while time.monotonic() < deadline:
            ld = await self.leader(2.0)
            st = await self.status(ld) if ld is not None else None
            if st and addr in (st.get("members") or []):
                return True
            await asyncio.sleep(0.3)
        return False

    async def add_spare(self) -> int | None:
        """Start a spare slot as a new node (other ports, a fresh data directory), add it, and
        wait until it is a voter. A node that does not become one is removed again and stopped."""
        i = self.cp.spare()
        if i is None:
            return None
        self.cp.start_spare(i)
        got = await self.member_request("member-add", "POST", "/v1/cluster/members", {"addr": self.cp.nodes[i].raft})
        if got["ok"] and await self.wait_voter(i):
            self.cp.members.append(i)
            self.cp.cluster.voters.add(i)
            return i
        await self.member_request("member-remove", "DELETE", "/v1/cluster/members/" + urllib.parse.quote(
            self.cp.nodes[i].raft, safe=""))
        self.cp.signal_node(i, signal.SIGKILL)
        return None

    async def remove(self, i: int) -> bool:
        """Remove member i (through another member when it can), then stop its process."""
        got = await self.member_request("member-remove", "DELETE", "/v1/cluster/members/" + urllib.parse.quote(
            self.cp.nodes[i].raft, safe=""), avoid=i)
        if not got["ok"]:
            return False
        if i in self.cp.members:
            self.cp.members.remove(i)
        self.cp.cluster.voters.discard(i)
        if self.cp.node_paused(i):
            self.cp.signal_node(i, signal.SIGCONT)
        self.cp.signal_node(i, signal.SIGKILL)
        self.down.discard(i)
        self.paused.discard(i)
        return True

    def in_place(self, nodes: list[int]) -> None:
        """The membership fault's disruption is in place now (its changes follow)."""
        self.entry["in_place_ms"] = time.time_ns() // 1_000_000
        self.entry["nodes"] = list(nodes)

    async def membership_start(self, f: dict) -> list[int]:
        """The first half of a membership fault; returns the nodes it touched."""
        kind = f["kind"]
        if kind == "member-replace":
            # A member killed for good (the leader, or any), a new node in its place.
            victim = await self.resolve(f)
            self.cp.signal_node(victim, signal.SIGKILL)
            self.down.add(victim)
            self.in_place([victim])
            new = await self.add_spare()
            if await self.remove(victim):
                f["removed"] = victim
            return [victim] + ([new] if new is not None else [])
        if kind == "member-grow-shrink":
            # A member cut off; a fourth added meanwhile (three of four reach each other).
            cut = await self.resolve(f)
            self.isolate(cut, f["mode"])
            self.in_place([cut])
            new = await self.add_spare()
            return [cut] + ([new] if new is not None else [])
        # member-remove-leader: the leader removed (it hands its leadership over), then a new node.
        victim = await self.resolve(f)
        self.in_place([victim])
        removed = await self.remove(victim)
        new = await self.add_spare() if removed else None
        return [victim] + ([new] if new is not None else [])

    async def membership_stop(self, f: dict, nodes: list[int]) -> None:
        """The second half: heal what the first left in place, and come back to three members."""
        kind = f["kind"]
        if kind == "member-replace":
            victim = nodes[0]
            if victim in self.cp.members and victim in self.down:  # its removal was refused
                self.cp.start_node(victim)
                self.down.discard(victim)
        elif kind == "member-grow-shrink":
            cut = nodes[0]
            self.isolate(cut, "pass")
            if len(self.cp.members) > 3:
                # One goes: the node that was cut off, or the leader (a hand-over), as drawn.
                out = cut if f.get("remove") == "isolated" else (await self.leader(LEADER_WAIT_S))
                if out is None or out not in self.cp.members:
                    out = cut
                await self.remove(out)
                if out not in nodes:
                    nodes.append(out)
        while len(self.cp.members) < 3 and await self.add_spare() is not None:
            pass

    def heal(self) -> None:
        """Undo every fault still in place (the schedule may have been cut short)."""
        for i in sorted(self.paused):
            self.cp.signal_node(i, signal.SIGCONT)
        self.paused.clear()
        for name in sorted(self.cut):
            self.cp.set_link(name, "pass")
        self.cut.clear()
        for i in range(len(self.cp.nodes)):
            self.cp.set_clock(i, 0)
        self.shifted.clear()
        for i in self.cp.members:
            if not self.cp.node_alive(i):
                self.cp.start_node(i)
        self.down.clear()
        for w in self.cp.remote_workers:
            if w in self.workers_paused:
                self.cp.signal_worker(w, signal.SIGCONT)
            if w in self.workers_cut:
                self.cp.set_worker_links(w, "pass")
            if not self.cp.worker_alive(w):
                self.cp.start_worker(w)
        self.workers_down.clear()
        self.workers_paused.clear()
        self.workers_cut.clear()
        for e in self.log:
            e.setdefault("end_ms", time.time_ns() // 1_000_000)
        self.history.add({"process": "nemesis", "type": "info", "f": "heal"})
