"""Prometheus metrics (``GET /metrics``), read from the node's own replica and loops at scrape time.

One registry per node (not the process-global one), so tests and several nodes in one process do
not collide. Gauges are computed on each scrape from the local replica: a follower's view may lag
the leader's by the replication delay. Counters (``*_total``) count what this node did: fires it
proposed while leading, runs its worker completed.
"""
from __future__ import annotations

import gc
from bisect import bisect_left

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from ..core import deadlines, events, queries
from . import build

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: fire lag buckets (seconds): from a normal tick (tens of ms) to a catch-up after an outage
FIRE_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
#: The methods the API request counter names (any other is "other": a client picks the method).
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: read barrier buckets (seconds): a round is a commit through the leader (an fsync or two)
READ_BARRIER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


#: The recorded slots' (state, reason) the alert rule SlotsMissed reads (docs/operations.md):
#: exported at 0 before their first, so the first one is an increase.
RECORDED_ALERTED = (("skipped", "misfire"), ("coalesced", "misfire"), ("skipped", "catchup_limit"),
                    ("skipped", "queue_full"), ("skipped", "policy"))


class _StateCollector:
    def __init__(self, raft, trigger, worker) -> None:
        self.raft, self.trigger, self.worker = raft, trigger, worker

    def collect(self):
        st = self.raft.status()
        yield GaugeMetricFamily("raftsched_raft_is_leader", "1 if this node leads", value=1 if st.get("is_leader") else 0)
        yield GaugeMetricFamily("raftsched_raft_term", "current Raft term", value=st.get("term") or 0)
        yield GaugeMetricFamily("raftsched_raft_commit_index", "Raft commit index", value=st.get("commit_index") or 0)
        repl = st.get("replication")
        if repl is not None:
            yield GaugeMetricFamily(
                "raftsched_raft_commit_stalled_seconds",
                "how long this node's commit index has not advanced while the leader's was ahead",
                value=repl["commit_stalled_s"])
            lag = GaugeMetricFamily("raftsched_raft_follower_lag_entries",
                                    "on the leader: entries of its log a follower does not hold yet",
                                    labels=["peer"])
            stalled = GaugeMetricFamily("raftsched_raft_follower_stalled_seconds",
                                        "on the leader: how long a follower's match index has been "
                                        "behind the commit index without advancing", labels=["peer"])
            rejected = CounterMetricFamily("raftsched_raft_follower_rejections",
                                           "on the leader, this term: a follower's answers that "
                                           "moved its next index back", labels=["peer"])
            for peer, f in sorted(repl["followers"].items()):
                lag.add_metric([peer], f["lag_entries"])
                stalled.add_metric([peer], f["stalled_s"])
                rejected.add_metric([peer], f["rejections"])
            yield lag
            yield stalled
            yield rejected
            yield GaugeMetricFamily("raftsched_cluster_conditions",
                                    "conditions this node reports (cluster.follower_stalled, ...)",
                                    value=len(repl["conditions"]))
        clock = st.get("clock")
        if clock is not None:
            off = clock.get("offset_ms")
            yield GaugeMetricFamily("raftsched_clock_offset_seconds",
                                    "this node's wall clock minus the cluster's (the median of the members'), "
                                    "NaN when unknown", value=float("nan") if off is None else off / 1000)
            yield GaugeMetricFamily("raftsched_clock_disagrees",
                                    "1 if this node's wall clock is further than the bound from the cluster's "
                                    "(a leader then fires nothing and hands over)",
                                    value=1 if clock.get("state") == "disagrees" else 0)
            peers = GaugeMetricFamily("raftsched_clock_peer_offset_seconds",
                                      "on the leader: each member's wall clock minus the cluster's", labels=["peer"])
            for peer, p in sorted((clock.get("peers") or {}).items()):
                peers.add_metric([peer], p["offset_ms"] / 1000)
            yield peers
        runs = GaugeMetricFamily("raftsched_runs", "runs queued, running and dead now (the state's counters; finished "
                                 "runs: raftsched_runs_finished_total, recorded slots: raftsched_slots_recorded_total)",
                                 labels=["state"])
        depth = GaugeMetricFamily("raftsched_queue_depth", "runs waiting in the queue", labels=["queue"])
        running = GaugeMetricFamily("raftsched_queue_running", "runs leased and running", labels=["queue"])
        dead = GaugeMetricFamily("raftsched_dlq_runs", "runs in the queue's dead-letter queue", labels=["queue"])
        g = self.raft.read(queries.gauges)
        yield GaugeMetricFamily("raftsched_jobs", "registered jobs", value=g["jobs"])
        yield GaugeMetricFamily("raftsched_jobs_paused", "paused jobs", value=g["jobs_paused"])
        yield GaugeMetricFamily("raftsched_locks_held", "locks held", value=g["locks"])
        yield GaugeMetricFamily("raftsched_fencing_token", "highest fencing token granted", value=g["fencing_token"])
        code = build.code()
        info = GaugeMetricFamily("raftsched_build_info", "the code this node runs: its version and the digest of its "
                                 "source (1)", labels=["version", "digest"])
        info.add_metric([code["version"], code["digest"]], 1)
        yield info
        for s, n in g["runs_by_state"].items():
            runs.add_metric([s], n)
        yield runs
        for q, (a, b, c) in sorted(g["queues"].items()):
            depth.add_metric([q], a)
            running.add_metric([q], b)
            dead.add_metric([q], c)
        yield depth
        yield running
        yield dead
        t = self.trigger.stats()
        yield CounterMetricFamily("raftsched_slots_fired", "slots this node fired as runs while leading", value=t["slots_fired"])
        yield CounterMetricFamily("raftsched_fire_commands", "fire commands this node proposed while leading", value=t["fires_proposed"])
        yield CounterMetricFamily("raftsched_leases_expired", "leases this node's reaper expired", value=t["leases_expired"])
        yield CounterMetricFamily("raftsched_trigger_ticks_held_by_clock",
                                  "trigger ticks this node skipped while leading, its clock disagreeing or unknown",
                                  value=t.get("ticks_held_by_clock", 0))
        w = self.worker.stats()
        yield CounterMetricFamily("raftsched_worker_runs_completed", "attempts this node's worker reported", value=w["completed"])
        yield CounterMetricFamily("raftsched_worker_completions_refused", "reports refused for a stale token", value=w["refused"])
        yield GaugeMetricFamily("raftsched_worker_runs_running", "leases this node's worker holds: runs executing, prefetched to start next, or finished with the outcome on its way", value=w["running"])
        # Its slots that take runs: 0 while it runs nothing: its node leads a cluster of several
        # (the worker registry says 0 too: LeaseLoop.facts), or it drains (the registry keeps its
        # slots and says draining).
        yield GaugeMetricFamily("raftsched_worker_slots", "run slots of this node's worker that take runs now "
                                "(0 while its node leads a cluster of several, or while it drains)",
                                value=w["slots"] if w["executes"] else 0)


class _FireLag:
    """The fire lag histogram, observed a batch of slots at a time.

    prometheus_client's Histogram.observe takes a lock and walks the buckets for each value:
    ~1 us a slot, 3.6 % of a sweep leader's samples at 30k slots/s (py-spy). Here a slot is one
    bisect into the bounds (in ms, as lags are) and an add; the same series (``_bucket``,
    ``_count``, ``_sum``) are exposed at scrape time. Updated on the event loop and read by a
    scrape in the walks' thread (node/walks.py): a scrape in the middle of a batch may show its
    buckets ahead of its count by that batch (never an error; the next scrape is whole).
    """

    def __init__(self, name: str, doc: str, buckets) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(buckets)
        self._bounds_ms = [b * 1000 for b in self.bounds]
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum_ms = 0

    def observe_ms(self, lags_ms) -> None:
        counts, bounds = self.counts, self._bounds_ms
        total = 0
        for lag in lags_ms:
            if lag < 0:
                lag = 0
            counts[bisect_left(bounds, lag)] += 1
            total += lag
        self.sum_ms += total

    def collect(self):
        cumulative, acc = [], 0
        for bound, n in zip(self.bounds + (float("inf"),), self.counts):
            acc += n
            cumulative.append((floatToGoString(bound), acc))
        yield HistogramMetricFamily(self.name, self.doc, buckets=cumulative, sum_value=self.sum_ms / 1000)


class _GcCollector:
    """The collector's pauses as gcpolicy.GcPauses times them, and its freezes.

    The collections are CPython's own counts (``gc.get_stats()``), since the process started:
    with the node's young threshold (node/limits.py ``gc_gen0_threshold``) an idle node collects
    rarely, and the callback's count, which starts when the node serves, read 0 for long stretches.
    The pauses are timed from then on."""

    def __init__(self, gc_pauses) -> None:
        self.gc = gc_pauses

    def collect(self):
        g = self.gc
        stats = gc.get_stats()
        n = CounterMetricFamily("raftsched_gc_collections", "garbage collections by generation since the process "
                                "started (CPython's count)", labels=["generation"])
        t = CounterMetricFamily("raftsched_gc_pause_seconds", "time spent in garbage collections (the GIL held) "
                                "since the node started serving", labels=["generation"])
        m = GaugeMetricFamily("raftsched_gc_pause_seconds_max", "the longest garbage collection since the node started",
                              labels=["generation"])
        for gen in range(3):
            n.add_metric([str(gen)], stats[gen]["collections"])
            t.add_metric([str(gen)], g.pause_s_total[gen])
            m.add_metric([str(gen)], g.pause_s_max[gen])
        yield n
        yield t
        yield m
        yield CounterMetricFamily("raftsched_gc_freezes", "gc.freeze calls (raftsched/gcpolicy.py)", value=g.freezes)


class _RaftPortCollector:
    """What this node's Raft port refused (RaftNode.status()["connections_dropped"])."""

    def __init__(self, raft) -> None:
        self.raft = raft

    def collect(self):
        dropped = self.raft.status().get("connections_dropped")
        if dropped is None:  # a replicator without a Raft port (tests' FakeRaft)
            return
        m = CounterMetricFamily("raftsched_raft_connections_dropped",
                                "connections this node's Raft port dropped, by reason (frame_too_large, "
                                "auth_failed, auth_timeout, bad_message, closed_before_auth; docs/security.md)",
                                labels=["reason"])
        for reason, n in sorted(dropped.items()):
            m.add_metric([reason], n)
        yield m


class _ApplyCollector:
    """What this replica counted as it applied (core/stats.py, read as a copy under the replica's
    lock), and each queue's longest-waiting ready run: counters and heap tops, no walk of the runs."""

    def __init__(self, raft, clock) -> None:
        self.raft, self.clock = raft, clock

    def collect(self):
        st = self.raft.read(queries.apply_stats)
        rec = CounterMetricFamily("raftsched_slots_recorded", "slots that did not become runs, by state (skipped, "
                                  "coalesced) and reason (misfire, catchup_limit, overlap, queue_full, paused, policy, "
                                  "cancelled, late_start, not_pinged, heartbeat_job), as this replica applied them", labels=["state", "reason"])
        # (from the first scrape, at 0: the series SlotsMissed reads, as below for the runs)
        for (state, reason), n in sorted((dict.fromkeys(RECORDED_ALERTED, 0) | st["recorded"]).items()):
            rec.add_metric([state, reason], n)
        yield rec
        fin = CounterMetricFamily("raftsched_runs_finished", "runs that ended, by state (succeeded, failed, dead; heartbeat jobs' pinged ends too), "
                                  "as this replica applied them", labels=["state"])
        # Every series an alert reads exists from the first scrape, at 0: a series that first
        # appears at 1 has no increase() in PromQL, and its first event would alert nobody.
        for state, n in sorted((dict.fromkeys(("dead", "failed", "succeeded"), 0) | st["finished"]).items()):
            fin.add_metric([state], n)
        yield fin
        dl = CounterMetricFamily("raftsched_deadlines_judged", "slots' deadlines judged missed (with the cause: "
                                 "never_started, still_running, failed, skipped, paused, untracked, upstream, no_slot) or late, by "
                                 "deadline, as this replica applied them", labels=["outcome", "deadline", "cause"])
        known = {("missed", which, cause): 0 for which in deadlines.FIELDS for cause in deadlines.CAUSES}
        known |= {("late", which, "none"): 0 for which in deadlines.WHICH}
        for (outcome, which, cause), n in sorted((known | st["deadlines"]).items()):
            dl.add_metric([outcome, which, cause], n)
        yield dl
        held = CounterMetricFamily("raftsched_events_held_back", "events a route's repeat_every_s did not send to its "
                                   "sink (one of that kind of the job was sent within it), by kind, as this replica "
                                   "applied them", labels=["kind"])
        # (every kind a route may hold back from the first scrape, at 0: a series that first appears
        # at 1 has no increase())
        for kind, n in sorted((dict.fromkeys(sorted(set(events.KINDS) - events.CLUSTER_KINDS), 0)
                               | st["held_back"]).items()):
            held.add_metric([kind], n)
        yield held
        for key, name, doc in (
                ("slot_to_start", "raftsched_slot_to_start_seconds",
                 "scheduled runs: from the slot to the first attempt's lease"),
                ("slot_to_completion", "raftsched_slot_to_completion_seconds",
                 "scheduled runs: from the slot to the end of the attempt that succeeded")):
            bounds_ms, counts, sum_ms = st[key]
            yield _histogram(name, doc, [b / 1000 for b in bounds_ms], counts, sum_ms / 1000)
        now = self.clock.now_ms() if self.clock is not None else None
        oldest = GaugeMetricFamily("raftsched_queue_oldest_ready_seconds",
                                   "how long the queue's longest-waiting ready run has waited (queues with one)",
                                   labels=["queue"])
        if now is not None:
            # The heaps of a queue whose top is stale are walked outside the replica's lock.
            for q, age in sorted(queries.oldest_ready_walk(self.raft.read(queries.oldest_ready_inputs, now)).items()):
                oldest.add_metric([q], age / 1000)
        yield oldest


def _histogram(name: str, doc: str, bounds, counts, sum_value: float) -> HistogramMetricFamily:
    """A histogram family from per-bucket counts (the last: above every bound)."""
    cumulative, acc = [], 0
    for bound, n in zip(tuple(bounds) + (float("inf"),), counts):
        acc += n
        cumulative.append((floatToGoString(bound), acc))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=sum_value)


class _RaftEventsCollector:
    """This node's leadership changes with their cause, and its proposals by outcome."""

    def __init__(self, raft, propose_latency: _FireLag) -> None:
        self.raft = raft
        self.propose_latency = propose_latency
        #: outcome -> proposals (ok, unavailable, indeterminate, error)
        self.proposals: dict[str, int] = {}

    def observe_propose(self, seconds: float, outcome: str) -> None:
        self.proposals[outcome] = self.proposals.get(outcome, 0) + 1
        self.propose_latency.observe_ms((seconds * 1000,))

    def collect(self):
        changes = getattr(self.raft, "leadership_changes", None)
        if changes is not None:
            m = CounterMetricFamily("raftsched_raft_leadership_changes",
                                    "this node gained or lost the leadership, and why (gained: election_timeout, "
                                    "transfer; lost: higher_term, quorum_lost, transfer, clock_step_down)",
                                    labels=["change", "cause"])
            for (change, cause), n in sorted(dict(changes).items()):
                m.add_metric([change, cause], n)
            yield m
        p = CounterMetricFamily("raftsched_proposals", "commands this node proposed (barriers included), by outcome",
                                labels=["outcome"])
        for outcome, n in sorted(dict(self.proposals).items()):  # a copy first: scrapes run in a thread
            p.add_metric([outcome], n)
        yield p


class _RequestsCollector:
    """API requests by method, route template and status (counted by the API's outermost middleware)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}

    def collect(self):
        m = CounterMetricFamily("raftsched_api_requests", "API requests answered, by method, route (the route "
                                "table's template; unmatched for none) and status", labels=["method", "route", "status"])
        for key, n in sorted(dict(self.counts).items()):  # a copy first: scrapes run in a thread (node/walks.py)
            m.add_metric(list(key), n)
        yield m


class _ReadsCollector:
    def __init__(self, reads) -> None:
        self.reads = reads

    def collect(self):
        yield CounterMetricFamily("raftsched_read_barrier_rounds", "read barrier rounds this node started",
                                  value=self.reads.rounds)
        yield CounterMetricFamily("raftsched_read_barrier_reads", "consistent reads that waited at this node, "
                                  "each for one round (those of a failed round included)", value=self.reads.reads)


class NodeMetrics:
    def __init__(self, raft, trigger, worker, gc_pauses=None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # The process's own (process_start_time_seconds, process_cpu_seconds_total,
        # process_resident_memory_bytes, ...): the counters below restart with the process, and
        # count again the journal tail a restarted node re-applies, which an alert on their
        # increase leaves out by the start time (docs/operations.md, "Alert rules").
        ProcessCollector(registry=self.registry)
        self.registry.register(_StateCollector(raft, trigger, worker))
        self.registry.register(_RaftPortCollector(raft))
        self.registry.register(_ApplyCollector(raft, getattr(trigger, "clock", None)))
        propose_latency = _FireLag("raftsched_propose_seconds",
                                   "how long this node's proposals took, from propose to applied here (barriers included)",
                                   READ_BARRIER_BUCKETS)
        self.registry.register(propose_latency)
        self.raft_events = _RaftEventsCollector(raft, propose_latency)
        self.registry.register(self.raft_events)
        if hasattr(raft, "propose_observer"):
            raft.propose_observer = self.raft_events.observe_propose
        self.requests = _RequestsCollector()
        self.registry.register(self.requests)
        if gc_pauses is not None:
            self.registry.register(_GcCollector(gc_pauses))
        self.fire_lag = _FireLag(
            "raftsched_fire_lag_seconds", "how late each slot was fired versus its scheduled time (leader)",
            FIRE_LAG_BUCKETS)
        self.registry.register(self.fire_lag)

    def watch_reads(self, reads) -> None:
        """The read barrier's rounds (node/reads.py): their latency, how many, the reads served."""
        hist = _FireLag("raftsched_read_barrier_seconds",
                        "how long each read barrier round took (one round serves every read waiting when it started)",
                        READ_BARRIER_BUCKETS)
        reads.observe = lambda s: hist.observe_ms((s * 1000,))
        self.registry.register(hist)
        self.registry.register(_ReadsCollector(reads))

    def count_request(self, method: str, route: str | None, status: int | None) -> None:
        """One API request answered (``route``: the route table's template, None when none matched)."""
        key = (method if method in _METHODS else "other", route or "unmatched", str(status or 500))
        c = self.requests.counts
        c[key] = c.get(key, 0) + 1

    def observe_fire_lags(self, lags_ms) -> None:
        self.fire_lag.observe_ms(lags_ms)

    def render(self) -> bytes:
        return generate_latest(self.registry)
