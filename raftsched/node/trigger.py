"""The leader's trigger loop: due slots become ``fire`` commands.

Runs on the leader only (Nomad's periodic dispatcher). On gaining leadership it first proposes a
barrier, so its replica has applied everything its predecessor committed, then a ``takeover``
command, then hands the state a due index of its own (core/due.py, built from the jobs) and fires
whatever is due, per each job's misfire policy (the same code path as every tick: a missed slot
is just a due slot older than grace). When it stops leading it takes the index back.

Each tick pops every due job from that index, plans each with ``policy.plan_fire`` and proposes
the plans in as few ``fire`` commands as the size limit allows, concurrently. A job popped from
the index comes back when its fire applies; if the proposal fails, it is pushed back so the next
tick (or the next leader) plans it again. Re-proposing is always safe: apply drops a plan whose
job cursor has moved (I2). Every read of the replica (the index, the jobs' views, the leases)
goes through ``raft.read``, under the lock applies take.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging

from ..clock import Clock
from ..core import commands, deadlines, due, limits, pipelines, policy, queries, schedule
from ..core.due import DueIndex
from ..core.policy import fires_ahead
from ..core.errors import RaftschedError
from . import limits as node_limits
from ..proposer import Proposer
from ..aio import wait_event

log = logging.getLogger("raftsched.trigger")


def _entry_bytes_max(entry: list) -> int:
    """An upper bound of an entry's msgpack size (``policy.compact_entry``): the name, four
    integers of at most 9 bytes, nine per run slot and 64 per record, plus list headers."""
    return len(entry[0].encode()) + 5 + 36 + 5 + 9 * len(entry[5]) + 5 + 64 * len(entry[6]) + 1


class Trigger:
    """The leader's loop: due slots become fire commands, and leases unrenewed for their TTL
    become expire commands.

    :param raft: the replication adapter (``propose``, ``barrier``, ``is_leader``, ``read``).
    :param clock: wall time for the commands' ``now``, monotonic time for the reaper.
    """

    def __init__(self, raft, clock: Clock, node_id: str,
                 interval_ms: int = node_limits.trigger_interval_ms, fire_log_path: str | None = None) -> None:
        """:param fire_log_path: benchmarks only: a file to which the leading trigger appends one
            JSON line per committed fire command, ``{"c": commit_ms, "p": plan_ms, "s": [slot_ms
            of each run]}`` (scripts/bench.py; ``NodeConfig.fire_log_path``)."""
        self.raft = raft
        self.proposer = Proposer(raft)
        self.clock = clock
        self.node_id = node_id
        self.interval_s = interval_ms / 1000
        #: how far ahead of their slots jobs that may fire ahead are committed (docs/design.md)
        self.fire_ahead_ms = limits.fire_ahead_ms
        self._leader_event = asyncio.Event()
        #: leaderships lost, as delivered: a term led is this value from its start to its end
        self._losses = 0
        self.fires_proposed = 0
        self.slots_fired = 0
        self.last_fire_error: str | None = None
        self.leases_expired = 0
        self._joins_checked = 0  # when expire_joins last looked (ms)
        self._unreported_after: str | None = None  # the parent pipelines.unreported goes on after
        #: called with the fire lags (ms) of the runs each committed fire created (metrics)
        self.lag_observer = None
        #: The reaper's view (``reap``): (kind, id) -> [token, renewals, this leader's monotonic
        #: time when it first saw that token and renewal count, the sweep that last read it].
        self._lease_seen: dict[tuple[str, str], list] = {}
        #: this leader's monotonic time of the reaper's last read (node_limits.reap_interval_s)
        self._reaped_at: float | None = None
        self._reap_reset()
        #: fire commands proposed and not yet answered: a bounded pipeline (see limits)
        self._window = asyncio.Semaphore(node_limits.fire_commands_in_flight_max)
        # The fire log (benchmarks) is flushed at most every fire_log_flush_s while firing, and
        # before the trigger idles: a write and a flush per fire command cost a leader at 30k
        # slots/s ~4 % of its time (py-spy). Readers take complete lines only.
        self._fire_log = open(fire_log_path, "a", encoding="utf-8", buffering=1 << 20) if fire_log_path else None
        self._fire_log_dirty = False
        self._fire_log_flushed = 0.0
        #: why this leader fires nothing now: its clock's state when it is not one it may fire
        #: by ("disagrees", "unknown"; docs/operations.md, "Clocks"), else None
        self.held_by_clock: str | None = None
        #: ticks skipped for it, since the process started
        self.ticks_held_by_clock = 0
        #: coroutine functions run beside the firing loop while this node leads, started after
        #: the takeover and cancelled when leadership ends (the backfill stepper:
        #: node/backfills.py)
        self.leader_tasks: list = []
        #: fire entries this leader commits a second, measured on storm pieces taken up back to
        #: back (storms size their look-ahead by it; docs/design.md, "Firing ahead"); each storm
        #: starts from the default (or the lower rate the last one measured)
        self.commit_rate = node_limits.storm_commit_rate_default
        self.commit_rate_measured = False
        #: the last storm_rate_samples (entries, seconds) measured: the rate is their sum over
        #: their sum, so one fast piece does not make the rest of a storm start late
        self._rate_samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=node_limits.storm_rate_samples)
        #: the seconds (their first ms) this leader began to take up early whose slot is still
        #: more than fire_ahead_ms away: a storm in progress (they stay storms to their last job)
        self._storm_secs: set[int] = set()
        #: pieces of the storm in progress still to be taken up back to back whatever the rate
        #: says (the first pieces, which measure the rate: storm_rate_probe_pieces)
        self._probe_left = 0
        #: entries a second the ordinary ticks of storm_rate_sample_min entries or more commit
        #: (entries over seconds of the last storm_rate_samples; None before one): what a second
        #: is compared with to tell a storm from a steady load (a tick alone measures high, which
        #: for that errs on the side of the steady load), never what a storm is timed by
        self.steady_rate: float | None = None
        self._steady_samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=node_limits.storm_rate_samples)
        #: (monotonic s, entries) of recurring jobs (due again within storm_load_window_s of the
        #: entry's last slot) each tick planned, ordinary and storm, over the last
        #: storm_load_window_s: the steady load a second must exceed to be a storm
        #: (storm_load_factor). A one-shot or hourly storm is no part of it, however fast it is
        #: taken up, so its own later seconds are not measured against it.
        self._taken: collections.deque[tuple[float, int]] = collections.deque()
        #: a storm's fire commands in flight (background work: storm_fire_commands_in_flight_max)
        self._storm_window = asyncio.Semaphore(node_limits.storm_fire_commands_in_flight_max)
        #: storm slots taken up before fire_ahead_ms of their slot, since the process started
        self.storm_jobs_early = 0
        #: whether the last tick took up storm jobs (the next comes at once, not after a sleep)
        self._storm_pending = False
        #: monotonic time the last tick ended, when it took up storm jobs: the next storm tick's
        #: rate counts from there, so that what the loop does between two pieces (other tasks,
        #: the collector) slows the rate the rest of the storm is timed by
        self._storm_tick_end: float | None = None

    def stats(self) -> dict:
        """This node's trigger counters: ``fires_proposed`` (fire commands committed while it
        led), ``slots_fired`` (runs they created), ``leases_expired`` (by its reaper) and
        ``last_fire_error`` (the last failed fire's reason, or None). Each counts since the
        process started, across its terms as leader."""
        return {"fires_proposed": self.fires_proposed, "slots_fired": self.slots_fired,
                "leases_expired": self.leases_expired, "last_fire_error": self.last_fire_error,
                "held_by_clock": self.held_by_clock, "ticks_held_by_clock": self.ticks_held_by_clock,
                "commit_rate_per_s": round(self.commit_rate, 1), "commit_rate_measured": self.commit_rate_measured,
                "steady_rate_per_s": None if self.steady_rate is None else round(self.steady_rate, 1),
                "storm_jobs_early": self.storm_jobs_early}

    def on_role_change(self, is_leader: bool) -> None:
        if is_leader:
            self._leader_event.set()
        else:
            self._losses += 1
            self._leader_event.clear()

    async def run(self) -> None:
        while True:
            if not self.raft.is_leader():
                self._leader_event.clear()
                if not await wait_event(self._leader_event, node_limits.leader_wait_s):
                    continue
                if not self.raft.is_leader():
                    continue
            try:
                await self._lead()
            except asyncio.CancelledError:
                raise
            except RaftschedError as e:
                log.warning("trigger: leadership term ended: %s", e.message)
            except Exception:
                log.exception("trigger: unexpected error; retrying")
                await asyncio.sleep(self.interval_s)

    async def _lead(self) -> None:
        log.info("trigger: became leader; barrier then takeover")
        # A leadership lost and won again while a tick awaited (two elections inside one tick)
        # is a new term: it ends this one, so that the next starts with its barrier, takeover
        # and fresh lease observations (I15), not with this term's.
        losses = self._losses
        await self.raft.barrier(timeout_s=node_limits.propose_timeout_s_default)
        # seen: how far the state's time got before this term (cluster.no_leader reports the gap)
        seen = self.raft.read(queries.state_time)
        await self.proposer.propose(commands.takeover(self.clock.now_ms(), node=self.node_id, seen=seen or None))
        await self.fill_due_index()
        self._lease_seen = {}  # a new term starts every lease's TTL afresh (I15)
        self._reaped_at = None
        self._reap_reset()
        log.info("trigger: leading; %d jobs", self.raft.read(queries.counts)["jobs"])
        beside = [asyncio.ensure_future(task()) for task in self.leader_tasks]
        try:
            while self.raft.is_leader() and self._losses == losses:
                if self.clock_holds():
                    await asyncio.sleep(self.interval_s)
                    continue
                await self.tick()
                # Jobs that fire ahead are woken for a batch window after they could first be
                # planned: each tick then plans ~fire_ahead_batch_ms of slots in full commands
                # (staggered slots would otherwise make a tick, and a tiny command, every 2 ms),
                # and they still commit up to fire_ahead_ms - fire_ahead_batch_ms ahead.
                nxt = self.raft.read(due.next_due_ms, max(0, self.fire_ahead_ms - node_limits.fire_ahead_batch_ms))
                now = self.clock.now_ms()
                delay = self.interval_s if nxt is None else min(self.interval_s, max(0.0, (nxt - now) / 1000))
                if self._storm_pending:
                    delay = 0.0  # more of a storm to take up: next tick after the shortest sleep
                if delay >= node_limits.fire_log_flush_s:
                    self._flush_fire_log(force=True)
                await asyncio.sleep(max(delay, node_limits.tick_sleep_s_min))
        finally:
            for task in beside:
                task.cancel()
            if beside:
                await asyncio.gather(*beside, return_exceptions=True)
            # Only a leader reads the due index; the next leadership makes a new one.
            self.drop_due_index()
            self._flush_fire_log(force=True)
            self.held_by_clock = None
        log.info("trigger: no longer leader")

    def clock_holds(self) -> bool:
        """Whether this leader's clock forbids it to tick now: it fires and expires nothing while
        its wall clock is more than limits.clock_skew_ms_max off the cluster's ("disagrees"; the
        replication layer meanwhile hands leadership to a member whose clock agrees), or while
        it cannot tell ("unknown": no fresh estimate from a majority). Its own clock is not what
        it fires by (its ``clock`` is the cluster's), but a leader that needs that much
        correction is on a host whose time is broken. Logs each change."""
        st = self.raft.clock_status() if hasattr(self.raft, "clock_status") else {"state": "agrees"}
        state = st.get("state")
        if state in ("agrees", "unchecked"):
            if self.held_by_clock is not None:
                log.info("trigger: firing again: this node's clock %s the cluster's (offset %s ms)",
                         "agrees with" if state == "agrees" else "is not checked against", st.get("offset_ms"))
                self.held_by_clock = None
            return False
        if self.held_by_clock != state:
            if state == "disagrees":
                log.warning("trigger: firing and expiring nothing: this node's wall clock is %s ms off the "
                            "cluster's (bound %s ms); handing leadership to a member whose clock agrees",
                            st.get("offset_ms"), st.get("bound_ms"))
            else:  # a new term's first heartbeat, or (said by the replication layer) worse
                log.info("trigger: firing and expiring nothing until this leader knows the cluster's "
                         "clock (%s)", state)
        self.held_by_clock = state
        self.ticks_held_by_clock += 1
        return True

    def take_due_index(self) -> None:
        """Give the state a due index of this trigger's, built from its jobs in one read (tests;
        on leading, fill_due_index builds it in steps)."""
        self._forget_storms()
        self.raft.read(due.attach, DueIndex())

    def _forget_storms(self) -> None:
        """A new due index: no storm taken up yet."""
        self._storm_secs, self._probe_left, self._storm_tick_end = set(), 0, None
        self._taken.clear()

    async def fill_due_index(self) -> None:
        """Give the state a due index of this trigger's and fill it from its jobs (on leading),
        node_limits.due_fill_jobs_per_read jobs a read, yielding between reads: at 1M jobs the lock
        applies take is held 10-20 ms at a time (~40 ms to list the jobs), not 0.4 s in one read
        (a new leader's tick thread, and its heartbeats, stalled that long). Apply feeds the index from the first read on, and the
        fill passes over the jobs it pushed (core/due.py attach_empty). The first tick comes
        after the fill. Left attached on an error or cancellation, it is taken away."""
        self._forget_storms()
        index = DueIndex()
        records = self.raft.read(due.attach_empty, index)
        try:
            step = node_limits.due_fill_jobs_per_read
            for i in range(0, len(records), step):
                if not self.raft.read(due.fill, index, records[i:i + step]):
                    break  # a restore rebuilt it whole, or it was taken away
                await asyncio.sleep(0)
            self.raft.read(due.filled, index)
        except BaseException:
            self.drop_due_index()
            raise

    def drop_due_index(self) -> None:
        """Take the due index away (on no longer leading): apply stops feeding it."""
        self.raft.read(due.detach)

    async def tick(self) -> int:
        """Fire everything due now and expire what is past its lease. Returns the number of
        jobs planned.

        Planning is pipelined with replication: each fire command is proposed as soon as it is
        full, and the loop yields between chunks, so the first slots of a large tick commit
        while the rest are still being planned and the API keeps answering."""
        now = self.clock.now_ms()
        await self.reap(now)
        await self.expire_joins(now)
        await self.step_fanouts(now)
        ahead = self.fire_ahead_ms
        span = ahead + limits.fire_ahead_span_ms if ahead > 0 else 0  # a trigger that fires at the slot plans no span
        jobs = self.raft.read(due.pop_due, now, node_limits.jobs_per_tick_max, ahead)
        early = self._pop_storm(now) if ahead > 0 else []
        self._storm_pending = bool(early)
        if not jobs and not early:
            self._storm_tick_end = None
            await self.judge_deadlines(now)
            return 0
        # Only a storm piece back to back with the piece before it measures the commit rate,
        # counted from that piece's end, so that what the loop did between them counts: a piece
        # alone starts on an idle pipeline and commits faster than a storm can be committed.
        t0 = self._storm_tick_end if early else None
        start = self.clock.monotonic_s()
        n = await self._plan_and_fire(now, [(jobs, span, False)] + [(names, sec + 999 - now, True) for sec, names in early])
        end = self.clock.monotonic_s()
        if t0 is not None:
            self._measure_rate(n, end - t0)
        elif not early and n >= node_limits.storm_rate_sample_min and end > start:
            self._steady_samples.append((n, end - start))
            self.steady_rate = sum(x for x, _ in self._steady_samples) / sum(t for _, t in self._steady_samples)
        self._storm_tick_end = end if early else None
        # After the fire: a slot it recorded skipped is judged so by then (max_since_success_s).
        await self.judge_deadlines(now)
        return n

    def _pop_storm(self, now: int) -> list[tuple[int, list[str]]]:
        """Storm seconds to take up early now (core/due.py storm_seconds, at the commit rate),
        popped: ``[(second_ms, [name, ...])]``, at most storm_jobs_per_tick_max jobs.

        A storm starts from the default rate (or the lower one the last storm measured), without
        the margin, its first storm_rate_probe_pieces pieces are taken up back to back to measure
        the rate, and the rest when that rate (with the margin and the slack) says it must be."""
        L = node_limits
        started = self._storm_secs = {t for t in self._storm_secs if t - now > self.fire_ahead_ms}
        if not started:
            self._probe_left = 0
            if self.commit_rate_measured:  # the next storm measures its own
                self.commit_rate = min(self.commit_rate, L.storm_commit_rate_default)
                self.commit_rate_measured = False
                self._rate_samples.clear()
        if self._probe_left > 0:
            self._probe_left -= 1
            seconds = sorted(started)
        else:
            rate, margin = self.timing_rate()
            size_rate = None if self.steady_rate is None else max(self.steady_rate, self.commit_rate)
            seconds = self.raft.read(due.storm_due, now, rate, self.fire_ahead_ms, L.storm_ahead_ms_max,
                                     L.storm_ahead_slots_max, margin, L.storm_second_min, L.storm_commit_slack_ms,
                                     started, size_rate, L.storm_load_factor * self.load_per_s())
        if not seconds:
            return []
        early = self.raft.read(due.pop_storm, seconds, L.storm_jobs_per_tick_max)
        if early and not started:
            self._probe_left = L.storm_rate_probe_pieces - 1
        started.update(sec for sec, _ in early)
        self.storm_jobs_early += sum(len(names) for _, names in early)
        return early

    def _note_recurring(self, n: int) -> None:
        self._taken.append((self.clock.monotonic_s(), n))
        self.load_per_s()  # drops what left the window

    def load_per_s(self) -> float:
        """Entries of recurring jobs this leader planned a second (ordinary ticks and storm
        pieces) over the last storm_load_window_s: the steady load it keeps up with (less while
        it has led for less than the window: errs on the storm's side)."""
        window = node_limits.storm_load_window_s
        since = self.clock.monotonic_s() - window
        taken = self._taken
        while taken and taken[0][0] <= since:
            taken.popleft()
        return sum(n for _, n in taken) / window

    def timing_rate(self) -> tuple[float, float]:
        """The rate and margin the rest of a storm is timed by: the default rate, or the lower
        rate the storm measured, with the margin on a measured one. A measured rate only ever
        makes a storm start earlier than the default would, never later: the first pieces of a
        1 000 000-slot storm measured ~20 000/s, the rest then waited until T - 80 s and went at
        9 000-17 600/s, and 13 % of it committed after its slot (docs/benchmarks.md, Storm).
        Committing early costs only memory held earlier (bounded by storm_ahead_ms_max);
        committing late is what the look-ahead is for."""
        default = node_limits.storm_commit_rate_default
        if not self.commit_rate_measured:
            return self.commit_rate, 1.0  # the default, or the lower rate the last storm measured
        margin = node_limits.storm_commit_margin
        if self.commit_rate / margin >= default:
            return default, 1.0
        return self.commit_rate, margin

    def _measure_rate(self, n: int, elapsed_s: float) -> None:
        """Fold a storm piece's commit rate (``n`` entries committed in ``elapsed_s`` since the
        piece before it ended) into commit_rate (entries over seconds of the last
        storm_rate_samples pieces), when the piece was large enough to measure what the leader
        can do."""
        if n < node_limits.storm_rate_sample_min or elapsed_s <= 0:
            return
        self._rate_samples.append((n, elapsed_s))
        self.commit_rate = sum(x for x, _ in self._rate_samples) / sum(t for _, t in self._rate_samples)
        self.commit_rate_measured = True

    async def _plan_and_fire(self, now: int, groups: list[tuple[list[str], int, bool]]) -> int:
        """Plan each group's jobs, each up to its own look-ahead (``(names, ahead_ms, early)``:
        the jobs due now with the usual span, a storm second's jobs up to that second's end and
        no further), and propose the plans in full fire commands; a storm's (``early``) in
        commands of their own, as background work (``_send``). Returns the jobs planned."""
        plan, phased = policy.plan_fire_compact, policy.phased_ahead_ms
        ahead = self.fire_ahead_ms
        chunk_n = node_limits.plan_jobs_per_yield
        recur_ms = int(node_limits.storm_load_window_s * 1000)
        recurring = 0
        tasks: list[asyncio.Future] = []
        cur: list[list] = []
        cur_names: list[str] = []
        cur_dl: list[list] = []
        cur_bytes = 0
        total = 0
        bg = False
        for jobs, span, early in groups:
            if cur and early != bg:
                await self._send(tasks, now, cur, cur_names, cur_dl, bg)
                cur, cur_names, cur_dl, cur_bytes = [], [], [], 0
            bg = early
            entries_max = node_limits.storm_fire_entries_max if early else limits.fire_entries_max
            total += len(jobs)
            for i in range(0, len(jobs), chunk_n):
                # One consistent view of each job (apply runs on the raft thread): a spec read before
                # a replace and a gen read after it would make a plan that apply cannot tell is stale.
                views = self.raft.read(queries.plan_views, jobs[i:i + chunk_n])
                # pipelines: the per-slot deadlines of the jobs these slots will trigger ({} without any)
                kids = self.raft.read(pipelines.deadline_children, jobs[i:i + chunk_n])
                for spec, anchor, cursor, gen, name in views:
                    try:
                        # (the usual span: up to the end of the job's block, policy.phased_ahead_ms)
                        horizon = (0 if not fires_ahead(spec) else span if early or span <= ahead
                                   else phased(name, now, ahead, span - ahead))
                        entry = plan(spec, anchor, cursor, now, gen, name, horizon)
                    except Exception:
                        log.exception("trigger: cannot plan job %s", name)
                        continue
                    if entry is None:
                        # Popped for a next slot its schedule no longer has (a jittered interval
                        # job put by a version whose grid made its anchor a slot; or a next the
                        # planner disagrees with): index it again at the same slot and it is
                        # popped again at once, every tick. An entry that moves no slot and sets
                        # its next where the schedule says (apply checks it as any plan: I2).
                        nxt = schedule.next_slot_after(spec["schedule"], cursor, anchor) if "schedule" in spec else None
                        if nxt is not None and nxt <= now + horizon:  # (cannot be: plan_fire saw it)
                            self.raft.read(due.repush, [name])
                            continue
                        entry = [name, gen, cursor, cursor, nxt, [], []]
                    size = _entry_bytes_max(entry)
                    # The slots' deadline instants, computed here with the job's schedule rules
                    # (the proposer's work, as the plan is): only for jobs with a deadline.
                    items = deadlines.fire_items(spec, entry, anchor) if "deadline" in spec else None
                    if name in kids:
                        own = sum(len(it[0].encode()) + deadlines.DL_ITEM_BYTES for it in items or ())
                        items = (items or []) + deadlines.child_items(spec, entry, anchor, kids[name], own)
                    if items:
                        size += sum(len(it[0].encode()) + len(it[6].encode() if len(it) > 6 else b"")
                                    + deadlines.DL_ITEM_BYTES for it in items)
                    if cur and (cur_bytes + size > node_limits.fire_entry_bytes_max or len(cur) >= entries_max
                                or (items and len(cur_dl) + len(items) > limits.fire_deadline_items_max)):
                        await self._send(tasks, now, cur, cur_names, cur_dl, bg)
                        cur, cur_names, cur_dl, cur_bytes = [], [], [], 0
                    cur.append(entry)
                    cur_names.append(name)
                    if entry[4] is not None and entry[4] - entry[3] <= recur_ms:  # next - upto: due again soon
                        recurring += 1
                    if items:
                        cur_dl.extend(items)
                    cur_bytes += size
                await asyncio.sleep(0)  # the API and the other tasks get the loop between chunks
        if cur:
            await self._send(tasks, now, cur, cur_names, cur_dl, bg)
        if recurring:
            self._note_recurring(recurring)
        await asyncio.gather(*tasks)
        return total

    async def _send(self, tasks: list, now: int, entries: list[list], names: list[str], dl: list[list],
                    background: bool) -> None:
        """Start proposing one fire command once the pipeline has room for it. A storm's
        (``background``: committed ahead of its slot) also waits for a place among the storm's
        commands in flight and, a bounded while, for the writes in flight (the API's, the
        workers'), so that a lone write queues behind at most storm_fire_commands_in_flight_max
        storm commands and none proposed after it."""
        if background:
            await self._storm_window.acquire()
            try:
                await self.proposer.yield_to_foreground(node_limits.storm_yield_ms_max / 1000)
                await self._window.acquire()
            except BaseException:
                self._storm_window.release()
                raise
        else:
            await self._window.acquire()
        tasks.append(asyncio.ensure_future(self._fire(now, entries, names, dl, background)))

    async def _fire(self, now: int, entries: list[list], names: list[str], dl: list[list] | None = None,
                    background: bool = False) -> None:
        """Propose one fire command and account for its outcome. Never raises (but cancellation):
        a failed proposal pushes its jobs back, so the next tick (or leader) plans them again.
        Releases the window slots its caller acquired."""
        try:
            res = await self._propose_fire(now, entries, dl, background)
        except asyncio.CancelledError:
            self.raft.read(due.repush, names)
            raise
        except Exception as e:  # RaftschedError, or a bug: either way the jobs must come back
            self.last_fire_error = str(e)
            log.warning("trigger: fire of %d jobs failed: %s", len(names), e)
            self.raft.read(due.repush, names)
            return
        finally:
            self._window.release()
            if background:
                self._storm_window.release()
        commit_ms = self.clock.now_ms()
        self.fires_proposed += 1
        self.slots_fired += res.get("fired", 0)
        stale = set(res.get("stale_jobs") or ())
        if self.lag_observer is not None or self._fire_log is not None:
            slots = [slot for e in entries if e[0] not in stale for slot in e[5]]
            if self.lag_observer is not None and slots:
                # Fire lag: the slot's commit (its result came back to the leader), not its plan;
                # 0 for a slot committed ahead of time.
                self.lag_observer([max(0, commit_ms - slot) for slot in slots])
            if self._fire_log is not None and slots:
                self._log_fire(now, commit_ms, slots)
        if res.get("stale"):
            # Some plan was made from a view older than the state: those jobs were already
            # pushed back by the apply that moved them, or need a push now.
            self.raft.read(due.repush, stale or names)

    def _log_fire(self, plan_ms: int, commit_ms: int, slots: list[int]) -> None:
        try:
            self._fire_log.write(json.dumps({"c": commit_ms, "p": plan_ms, "s": slots}, separators=(",", ":")) + "\n")
            self._fire_log_dirty = True
            self._flush_fire_log()
        except (OSError, ValueError) as e:
            self._fire_log_failed(e)

    def _flush_fire_log(self, force: bool = False) -> None:
        if self._fire_log is None or not self._fire_log_dirty:
            return
        t = self.clock.monotonic_s()
        if force or t - self._fire_log_flushed >= node_limits.fire_log_flush_s:
            try:
                self._fire_log.flush()
            except (OSError, ValueError) as e:
                self._fire_log_failed(e)
            self._fire_log_dirty = False
            self._fire_log_flushed = t

    def _fire_log_failed(self, e: Exception) -> None:
        log.warning("trigger: fire log disabled: %s", e)
        self._fire_log = None

    def _reap_reset(self) -> None:
        """A sweep of the reaper's to start afresh (a new term, or a new trigger)."""
        #: the ids of the running runs and the names of the held locks when the sweep began
        self._sweep_runs: list[str] = []
        self._sweep_locks: list[str] = []
        #: how far the sweep has read them (runs, then locks); None: none begun
        self._sweep_at: int | None = None
        self._sweep_no = 0
        #: leases and locks seen due and not yet in an expire: (kind, id) -> [id, token, renewals],
        #: in the order they were seen due
        self._reap_due: dict[str, dict[str, list]] = {"run": {}, "lock": {}}

    async def reap(self, now: int) -> None:
        """The lease reaper (leader only): propose ``expire`` for leases and locks that have not
        been renewed for a whole TTL *as this leader has observed it*, by its monotonic clock.

        Wall clocks take no part: a lease is identified by (id, token, renewals), and each
        accepted heartbeat or renew increments its renewal count, so a lease whose triple this
        leader has seen unchanged for its TTL was not renewed for that long. Clock skew between nodes, or a wall-clock jump
        on any node, can therefore neither expire a live lease early nor keep a dead one alive.
        A new leader starts with an empty view, which gives every live lease one full TTL
        (the takeover rule, I15). Apply expires an item only if its token and renewal count are
        still those the reaper saw, so a renewal that raced the expire wins.

        It reads at most every ``reap_interval_s`` (node/limits.py), and at most
        ``reap_leases_per_read`` leases and locks a read: a sweep reads them all, a part a read
        (the ids listed when it begins; those granted since wait for the next sweep). Up to that
        many, a sweep is one read, and a lease is seen up to an interval later than it could have
        been and seen past its TTL up to another: expired at most two intervals later, never
        earlier. Beyond, each lease is read once a sweep of ceil(leases / reap_leases_per_read)
        intervals, and expired up to three sweeps later, never earlier: the reaper's CPU and the
        replica's lock held for it stay bounded whatever the leases (at 100 000 live leases a
        read of them all took 60 ms under the lock and the reaper 130 % of a core, every 0.1 s).
        What is due waits in ``_reap_due`` and goes an expire a tick (due locks first, up to half
        of it), while the reads go on at their interval.
        """
        mono = self.clock.monotonic_s()
        if self._reaped_at is None or not 0 <= mono - self._reaped_at < node_limits.reap_interval_s:
            self._reaped_at = mono
            self._reap_read(mono)
        due_runs, due_locks = self._reap_due["run"], self._reap_due["lock"]
        if not due_runs and not due_locks:
            return
        n = limits.run_refs_per_command
        # Locks first, up to half an expire (all the room runs leave): a dead worker host's
        # backlog of leases must not hold another service's lock past its TTL for as many
        # expires as the backlog takes, nor a backlog of locks the runs.
        locks = list(itertools.islice(due_locks, max(n // 2, n - len(due_runs))))
        runs = list(itertools.islice(due_runs, n - len(locks)))
        # In canonical order, as lease_snapshot lists them: replicas' reapers that read the
        # same leases propose the same expire.
        expire_runs = sorted(due_runs.pop(k) for k in runs)
        expire_locks = sorted(due_locks.pop(k) for k in locks)
        try:
            res = await self.proposer.propose(commands.expire(now, runs=expire_runs, locks=expire_locks))
            if res.get("expired") or res.get("released"):
                log.info("reaper: expired leases %s, released locks %s", res.get("expired"), res.get("released"))
                self.leases_expired += len(res.get("expired") or [])
        except RaftschedError as e:
            # What it carried is seen due again when the sweep reads it next, if still unrenewed.
            log.warning("reaper: expire failed: %s", e.message)

    def _reap_read(self, mono: float) -> None:
        """One read of the reaper's sweep: the next ``reap_leases_per_read`` leases and locks,
        those seen unchanged for their TTL noted due. The sweep's end forgets the leases it did
        not see (ended, or expired)."""
        k = node_limits.reap_leases_per_read
        at = self._sweep_at
        if at is None:
            self._sweep_runs, self._sweep_locks, views = self.raft.read(queries.lease_sweep, k)
            self._sweep_no += 1
            at = 0
        else:
            runs, locks = self._sweep_runs, self._sweep_locks
            r = len(runs)
            views = self.raft.read(queries.lease_views, runs[at:at + k], locks[max(0, at - r):max(0, at + k - r)])
        at += k
        sweep, seen, due = self._sweep_no, self._lease_seen, self._reap_due
        for kind, ident, tok, renewals, ttl_ms in views:
            key = (kind, ident)
            v = seen.get(key)
            if v is None or v[0] != tok or v[1] != renewals:
                seen[key] = [tok, renewals, mono, sweep]
                due[kind].pop(ident, None)  # renewed since it was seen due (apply would refuse it)
                continue
            v[3] = sweep
            if mono - v[2] >= ttl_ms / 1000:
                due[kind][ident] = [ident, tok, renewals]
        if at < len(self._sweep_runs) + len(self._sweep_locks):
            self._sweep_at = at
            return
        self._sweep_at = None
        self._sweep_runs, self._sweep_locks = [], []
        for key in [key for key, v in seen.items() if v[3] != sweep]:
            del seen[key]
            due[key[0]].pop(key[1], None)

    async def step_fanouts(self, now: int) -> None:
        """Pipelines: propose the next part of each fan-out too large for one command (a few a
        tick; nothing to read when there is none)."""
        pending = self.raft.read(pipelines.pending_fanout, node_limits.fanout_steps_per_tick)
        for key, after in pending:
            try:
                await self.proposer.propose(commands.fanout_step(now, key=key, after=after))
            except RaftschedError as e:
                log.warning("pipelines: fanout_step failed: %s", e.message)
                return

    async def expire_joins(self, now: int) -> None:
        """Pipelines: propose ``join_expire`` for children's slots that waited for their parents
        longer than their max_wait_s (state time; apply checks again). At most once a second,
        and nothing to read when no child waits."""
        if now - self._joins_checked < 1000:
            return
        self._joins_checked = now
        overdue = self.raft.read(pipelines.overdue, now, limits.run_refs_per_command)
        if len(overdue) < limits.run_refs_per_command:
            # Slots no parent reported yet: a part of the parents a second (its own cursor).
            more, self._unreported_after = self.raft.read(
                pipelines.unreported, now, limits.run_refs_per_command - len(overdue), self._unreported_after,
                node_limits.unreported_scan_per_s)
            overdue += more
        if not overdue:
            return
        try:
            res = await self.proposer.propose(commands.join_expire(now, joins=overdue))
            if res.get("expired"):
                log.info("pipelines: %d slots recorded upstream_timeout", res["expired"])
        except RaftschedError as e:
            log.warning("pipelines: join_expire failed: %s", e.message)

    async def _propose_fire(self, now: int, entries: list, dl: list | None = None, background: bool = False) -> dict:
        return await self.proposer.propose(commands.fire(now, entries=entries, dl=dl), background=background)

    async def judge_deadlines(self, now: int) -> int:
        """The deadline sweep (leader only): propose ``deadline_judge`` for the slots whose
        deadline instants passed by ``now`` (the cluster's clock) and the jobs past their
        ``max_since_success_s`` (core/deadlines.py). A slot whose instant fell in a leaderless
        gap is judged by the first sweep of the next leader: the index is rebuilt from the
        replicated records. What does not commit is put back for the next tick. Nothing to do,
        and nothing proposed, when no job has a deadline."""
        rids, names = self.raft.read(deadlines.due, now, limits.deadline_judge_items_max)
        if not rids and not names:
            return 0
        try:
            res = await self.proposer.propose(commands.deadline_judge(now, runs=rids, jobs=names))
        except RaftschedError as e:
            log.warning("trigger: deadline sweep failed: %s", e.message)
            self.raft.read(deadlines.repush, rids, names)
            return 0
        except BaseException:
            # Cancelled (the leadership ended) or a bug: the slots go back as for a failure (a
            # judge that did commit is applied as nothing the second time), never dropped from
            # the index until its next rebuild.
            self.raft.read(deadlines.repush, rids, names)
            raise
        return int(res.get("judged", 0))
