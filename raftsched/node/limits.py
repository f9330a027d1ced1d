"""The bounds of one process: what a node or the command line does outside the
replicated state.

The rule for what is here: a bound that no replica's apply reads, so one process may run with
another value than its peers without the replicas disagreeing: timeouts, poll intervals,
pipelines (commands in flight), buffers, pages of the API, the trigger's tick, executors'
bounds, the garbage collector's policy. Changing one changes how this process behaves, never
what the state accepts. The bounds of the replicated state (what it may hold, what a command may
carry: every replica must agree on those) are ``core/limits.py``; a process uses those where it
means the same thing (an executor keeps ``output_bytes_max`` bytes of a run's output because the
state keeps that much).

Each constant here says what it bounds, units go last in names, and relations with the core's
bounds are asserted at import.
"""
from ..core import limits as core

# Proposals, and what a worker process bounds ----------------------------------------------------
# The executors' and the lease loop's bounds (one worker process, a node's embedded one too) are
# worker/limits.py's: the worker imports no node module. The two a node reads too are named here
# from there, one value each.
from ..worker.limits import lease_ttl_ms_default, propose_timeout_s_default  # noqa: E402,F401

# Trigger ------------------------------------------------------------------------------------
#: The leader's trigger looks for due jobs this often.
trigger_interval_ms = 50
#: The leader plans jobs that fire ahead in batches of this many milliseconds of slots: 10 000
#: jobs staggered over the second made a tick (and a fire command of ~20 entries) every 2 ms,
#: whose fixed costs halved the slots committed per second.
fire_ahead_batch_ms = 100
#: A storm (docs/design.md, "Firing ahead"): a second ahead holding at least storm_second_min
#: slots of jobs that fire ahead is taken up early enough that all slots due by its end are
#: committed before it, at the commit rate the storm measured slowed by storm_commit_margin; but
#: never more than storm_ahead_ms_max before the slot, nor once storm_ahead_slots_max slots
#: are counted from now (those are taken up later: at the latest fire_ahead_ms before their
#: slot, as without a storm, then late if the leader cannot keep up; never lost).
#: 300 s: a top-of-the-hour storm of 1 000 000 slots, at the ~5 000 (loaded) to ~18 600 (quiet)
#: slots/s a storm's back-to-back pieces commit on two cores, needs 55-200 s, and with the margin
#: up to 300 s (at 120 s, three quarters of it would have committed late). The cost is memory held that much earlier: the
#: storm's runs, queued on every replica, which its slot creates anyway.
storm_second_min = 2_000
#: A second is no storm unless it holds more than storm_load_factor times the entries of
#: recurring jobs (due again within storm_load_window_s) the leader planned a second, ordinary
#: ticks and storm pieces, over the last storm_load_window_s: a steady load's next second is as
#: large as the seconds the leader is keeping up with. Without it, 30 000 jobs every second were
#: a storm whenever the ordinary ticks had not measured the steady rate yet (a new leader: the
#: default rate, 2 000/s, says 30 000 need 15 s); taken up as a storm, each job was planned one
#: slot an entry (up to its second's end), every second, and stayed one, since no ordinary tick
#: was left to measure: 40-51 us of the three nodes' CPU a slot, against ~30 the ordinary way
#: (scripts/bench.py --only sweep --sweep-ns 30000, docs/benchmarks.md). Only recurring jobs
#: count: a storm of one-shot (or hourly) jobs over several consecutive seconds, taken up at
#: whatever rate, is never measured against itself (counting every take-up, 400 of 1 000 slots
#: of ten such seconds were left to the one-second look-ahead and committed late: test_storm.py).
#: 2: the seconds of a steady load differ (two slots an entry then: 24 000-36 000 a second committed
#: in the sweep); at 1.5 the sweep flipped between the two ways (2 000-54 000 a second committed, once behind).
storm_load_window_s = 5.0
storm_load_factor = 2.0
storm_ahead_ms_max = 300_000
storm_ahead_slots_max = 2_000_000
#: On a measured rate only, and only when it is below the default (Trigger.timing_rate: a
#: measured rate never makes a storm later than the default would; the default is low already,
#: and used as it is): the first
#: pieces of a 100 000-job storm measured ~7 700/s (as the rest starting at T - 21 s implies),
#: the rest of it then went at ~4 700/s back to back (loaded machine, 2026-12-02), and with 1.5
#: and the slack it ended 1.4 s before its slot.
storm_commit_margin = 1.5
#: Besides the margin, a storm is timed to be committed this long before the ordinary look-ahead
#: would take it up: what the margin does not cover (a collector pause, a piece that waits for
#: the API's writes) and the tail of the storm.
storm_commit_slack_ms = 2_000
#: The commit rate (entries a second) each storm starts from, until it has measured its own (or
#: the lower rate the last storm measured): low (a loaded two-core machine commits ~2 500 a
#: second), so a storm starts early rather than late.
storm_commit_rate_default = 2_000.0
#: A storm's first pieces are taken up back to back, this many of them, whatever the rate says:
#: the first starts on an idle pipeline and measures nothing (a lone piece of 2 000 committed at
#: 12 400/s on a machine doing ~5 000/s back to back, and timed by it, the rest of a 100 000-job
#: storm started too late: 4.3 % after the slot), each next one measures from the end of the one
#: before it; the rest is timed by what they measured.
storm_rate_probe_pieces = 3
#: A storm piece that ran back to back with the piece before it, and committed at least this many
#: entries, measures the commit rate (a piece alone, or a small one, measures the load offered,
#: not what the leader can do). Ordinary ticks measure nothing.
storm_rate_sample_min = 1_000
#: The commit rate is the entries over the seconds of this many of the last such pieces: one
#: piece of 2 000 committed in 98 ms (20 000/s, on a machine doing ~5 700/s) averaged in by
#: halves made the rest of a 100 000-job storm start 13 s ahead instead of ~27 s, and 26 % of it
#: late.
storm_rate_samples = 10
#: A storm's fire commands are background work, committed ahead of their slot: at most this many
#: entries each and this many in flight (the ordinary ones: fire_entries_max, 4 in flight), and
#: each waits up to storm_yield_ms_max for the API's (and the workers') writes in flight to end
#: before it is proposed (Proposer.yield_to_foreground). A lone write then queues behind at most
#: 500 slots of a storm, not 2 000: with four commands of 500 ahead of it, every replica applied
#: 2 000 slots before the write's turn (write p99 200 ms during a 100 000-job storm, loaded).
storm_fire_entries_max = 250
storm_fire_commands_in_flight_max = 2
storm_yield_ms_max = 20
#: Jobs of a storm taken up early per tick: the index is popped under the replica's lock on the
#: event loop (~1 µs a job), so one pop holds the loop a few ms; and a storm taken up in pieces
#: lets the first pieces measure the commit rate the rest is timed by.
storm_jobs_per_tick_max = 2_000
#: Jobs whose views are read (under the replica's lock) and planned between two yields of the
#: event loop: the API answers between them (~30 µs a job to plan a one-shot or cron job).
plan_jobs_per_yield = 128
#: Fire commands the leader keeps proposed and unanswered at once. A pipeline, so planning and
#: replication overlap, but a bounded one: every replica applies all newly committed entries in
#: one pysyncobj tick, and an unbounded burst (25 commands for a 10 000-job storm) held each
#: follower's tick thread for long enough to look like a dead leader.
fire_commands_in_flight_max = 4
#: Bytes of entries per fire command; the envelope and msgpack framing fit in the rest.
fire_entry_bytes_max = core.command_bytes_max - 2048
#: Jobs planned per tick; the rest wait for the next tick (keeps one tick bounded).
jobs_per_tick_max = 50_000
#: Jobs a new leader indexes by next slot per read, yielding between reads (Trigger.fill_due_index):
#: 0.9-1.5 us a job at 1M jobs (a look-up each), so 10-20 ms of the lock applies take; in one
#: read, 1M jobs held it 0.4 s.
due_fill_jobs_per_read = 10_000
#: While firing, the fire log (benchmarks) is flushed at most this often (and always before the
#: trigger idles).
fire_log_flush_s = 0.05
#: How long a trigger that does not lead waits for a leadership event before it asks the Raft
#: adapter again (the event can be missed while the adapter's view settles).
leader_wait_s = 0.5
#: The shortest sleep between two ticks of a leading trigger: other tasks (the API, the worker)
#: get the loop even when slots are due back to back.
tick_sleep_s_min = 0.002
#: How often, at most, the leader's reaper reads the leases and locks (``Trigger.reap``): a busy
#: leader ticks hundreds of times a second. Up to ``reap_leases_per_read`` of them, a lease is
#: expired up to twice this later than a whole TTL after the reaper could first have seen it
#: unchanged (once to see it, once to see it past its TTL), never earlier; a tenth of the
#: shortest TTL.
reap_interval_s = 0.1
#: The leases and locks one read of the reaper's reads (under the replica's lock, ~0.6 us each,
#: and ~0.5 us each of the leader's loop after it): beyond, a sweep of them all takes
#: ceil(n / this) reads, an interval apart, and a lease is expired up to three sweeps after its
#: TTL (at 100 000 live leases a sweep is ~25 reads, ~2.6 s: up to ~7.8 s; docs/design.md "Expiry").
reap_leases_per_read = 4096
assert reap_interval_s <= core.lease_ttl_ms_min / 10_000

# The worker fleet (node/dispatch.py, node/fleet.py) --------------------------
#: How often a node reports, in one workers_seen, the workers that contacted it (and those whose
#: lease requests wait at it): a thousand idle long-polling workers cost a few small commands
#: every interval, not a heartbeat each. Well inside core worker_gone_ms (asserted below).
workers_seen_interval_s = 5.0
#: Registered workers up to which GET /metrics has series per worker (raftsched_worker_*{worker}:
#: four families); past it, only the fleet's totals (raftsched_fleet_*): at 10 000 workers the
#: 40 000 per-worker series cost a scrape 0.4-0.7 s of the node's CPU (docs/benchmarks.md) and a
#: Prometheus as many series a node. ``raftsched node --metrics-workers-max`` changes it.
metrics_workers_max_default = 1000
#: How often the leader looks for workers gone for core worker_forget_ms (forget_workers).
workers_forget_check_s = 60.0
#: Lease requests one node keeps waiting at once; beyond it a request is answered 503 (the
#: worker tries another node, or again after a backoff). Bounds a node's memory per connection.
lease_waiters_max = 20_000
#: Idle lease answers a node aims at, per second: with more requests waiting than their wait
#: times this, an idle answer asks the worker to wait longer next time (``next_wait_s``, at most
#: worker/limits.py lease_wait_s_max), as Nomad's servers stretch their clients' heartbeat TTL
#: (max_heartbeats_per_second). Each idle poll costs the node ~0.9 ms of CPU on the benchmark
#: machine (its answer's send wakes a client asleep on the other vCPU) and ~100 objects
#: that live for the whole wait (aiohttp's request, the handler's coroutines, a timer): at 10 000
#: workers on three nodes and 20 s waits, 167 polls a second a node, 9-12 % of a core and young
#: collections of 20-250 ms (docs/benchmarks.md, "Ten thousand idle workers"). 60 keeps a fleet
#: of up to 1 200 workers a node at its own wait (20 s), and 3 333 a node at ~55 s.
lease_idle_answers_per_s = 60.0
#: How long a node holds a worker's heartbeat before it proposes it, so that the heartbeats of a
#: busy fleet arriving meanwhile go out together: commands proposed in one turn of the event loop
#: are one log entry (replication/node.py, group commit), and a log entry's round of Raft
#: messages, journal writes and syncs on three nodes was most of a heartbeat's cost (~2.4 ms of
#: the three nodes' CPU a heartbeat at 200 a second, each its own entry). A heartbeat renews a
#: lease of a TTL of a second or more, which its worker sends every third of it.
heartbeat_linger_s = 0.05
#: Heartbeats a node aims at, per second: with more workers heartbeating at it than their
#: interval allows at this rate, a heartbeat's answer asks the worker to heartbeat less often
#: (``next_heartbeat_s``), never less often than a quarter of its lease TTL (worker/limits.py
#: heartbeat_asked_ttl_share_max: a lease survives a heartbeat that timed out). As
#: lease_idle_answers_per_s, and Nomad's max_heartbeats_per_second.
heartbeats_per_s = 60.0
#: A worker counts as heartbeating at a node for this long after its last heartbeat there.
heartbeat_seen_s = 10.0
#: While lease requests wait, the most often the dispatcher looks at its replica because it
#: applied entries (the replica wakes it: RaftNode.arm_applied; a replica that cannot, it polls
#: this often); it also wakes at the earliest due time it sees there (a run fired ahead is
#: acquired as it falls due), at once when a request for a group with work arrives or an acquire
#: ends, and once every dispatch_full_look_s. Bounds the time from a run queued due now (a
#: manual trigger, a retry) to its acquire being proposed.
dispatch_poll_s = 0.02
#: A follower's dispatcher acquires a run only once it has been due this long (ms); the
#: leader's, as it falls due. The leader's acquire then usually reaches the followers' replicas
#: first, and a run costs one acquire where it cost one per node (node/dispatch.py).
dispatch_follower_grace_ms = 25
#: After an acquire for a group of waiting requests granted nothing (another node's worker took
#: the runs, or a tenant is over its rate), the group's next acquire waits this long.
dispatch_empty_backoff_s = 0.1
#: Ready queue entries the dispatcher looks at for one group before it says "nothing for them";
#: when the replica still shows ready work, the group gets an acquire this often anyway (the
#: acquire itself looks further: core acquire_scan_max).
dispatch_ready_scan_max = 256
dispatch_retry_s = 1.0
#: While nothing changes (no command applied, no due time reached, no request, no acquire
#: ended), the dispatcher skips its look at the groups, but looks at least this often (a
#: tenant's bucket refills with time alone).
dispatch_full_look_s = 1.0
#: Acquires the dispatcher keeps in flight at once for one group (its oldest requests, as many
#: as cover the ready work it counted), proposed in one turn of the loop: they travel in one log
#: entry, in order, so the oldest request is served first, and a burst of runs falling due
#: together (a fired ahead second) goes out to that many waiting workers in one round trip.
dispatch_batch_max = 32

#: Two processes under one worker id (the same --id given twice) take turns at its registry
#: record, each lease request re-registering its own process (instance): a process coming back
#: after another took its place this many times within the window, at one node, is said (a
#: warning in the lease answer, which the worker logs, and in the node's log). A restart, or a
#: crash loop, never comes back: each process is a new one. Workers followed at most (the
#: oldest forgotten first).
instance_returns_shared = 2
instance_switch_window_s = 60.0
instance_switch_workers_max = 10_000

assert workers_seen_interval_s * 3 * 1000 < core.worker_gone_ms
assert workers_seen_interval_s * 2 * 1000 < core.worker_quiet_ms  # a live worker is never quiet
assert 0 < dispatch_poll_s < dispatch_empty_backoff_s < dispatch_retry_s

# API ----------------------------------------------------------------------------------------
#: How long a membership change request (``POST /v1/cluster/members``, ``DELETE
#: /v1/cluster/members/{addr}``) waits for its commit, below the clients' attempt timeout (10 s):
#: a leader that removes itself hands its leadership over first (an election, ~1 s).
membership_change_timeout_s = 8.0
#: How long a membership add, or a remove of a name no member has, waits for its address (and the
#: members') to resolve (node/api.py). A remove resolves only a name whose change is a no-op.
member_resolve_s = 3.0
#: Largest request body (but ``POST /v1/jobs:batch``, bounded by core batch_request_bytes_max):
#: a job spec is at most job_spec_bytes_max encoded.
request_bytes_max = 64 * 1024
#: How long a handler waits for the whole of its request's body, from the first read of it: one
#: that has not arrived by then (a client that sent less than its Content-Length and waits, or
#: trickles it) is answered 408 and the connection closed, and nothing is done. Without it, such
#: a request held its handler, and a graceful stop, for as long as the client kept the
#: connection open. The same for a batch's body (16 MiB): the client's own attempt at one
#: gives up after 30 s too (client/core.py BATCH_TIMEOUT_S).
request_body_s = 30.0
#: A graceful stop gives the API's requests in flight this long to be answered, then cancels
#: them and waits as long again for their handlers to end (aiohttp's shutdown_timeout): a stop
#: takes at most twice this for the API, whatever its clients do. A write cut this way is
#: like one whose connection was lost: the client retries it under the same Idempotency-Key.
api_stop_grace_s = 2.0
#: Jobs per page of ``GET /v1/jobs`` (``limit``).
jobs_page_max = 1000
#: Runs per answer of ``GET /v1/runs`` and dead runs per answer of ``GET /v1/dlq`` (``limit``).
runs_page_max = 10_000
#: Entries per answer of ``GET /v1/jobs/{name}/runs`` (``limit``, docs/api.md): a job's whole
#: history in one answer, its finished entries (``history``, at most history_per_job_max) beside
#: as many queued runs as a queue holds (queue_depth_max), which the history bound never drops
#: (the benchmarks read histories whole: scripts/benchlib). 1 001 000.
job_runs_page_max = core.history_per_job_max + core.queue_depth_max
#: A bulk registration (``POST /v1/jobs:batch``, node/batch.py; its size is bounded by core
#: batch_jobs_max and batch_request_bytes_max): jobs validated between two yields to the event
#: loop,
batch_validate_step = 256
#: put_jobs commands of one request in flight at once (pipelined through Raft),
put_jobs_in_flight_max = 8
#: A replace refused as stale (the job fired while the node planned it: core StaleReplace) is
#: planned again from the newer view and proposed again, up to this many times, under a request
#: id derived from the first (so a retried request replays each attempt).
stale_replans_max = 3
#: The runs one ``POST /v1/jobs/{name}/cancel`` ends at most (in commands of
#: run_refs_per_command): each tells its own ``run.cancelled`` to the sinks that route it, and
#: the outbox keeps 20 000 events, so one request cannot push many out; the answer's ``more``
#: says when some are left (``raftsched cancel --job`` asks again).
cancel_job_runs_max = 1_000
#: ... and the entries of the job's history it reads at most to find them (under the replica's
#: lock: ~0.1 s; a front of runs that are not queued, running or dead, makes it answer ``more``).
cancel_job_scan_max = 100_000
#: A PUT's (or a batch's) warning that no live worker may take the job's runs reads the live
#: workers at most this often (node/service.py _live_workers): a walk of the registry each PUT
#: would cost a registration by PUTs ~10 ms a job with 10 000 workers.
live_workers_reuse_s = 1.0
#: bytes kept free in a put_jobs command for its envelope (v, op, now, rid, the jobs key, the
#: list header),
put_jobs_envelope_bytes = 256
#: and invalid jobs listed in the error of a refused batch.
batch_errors_listed_max = 100

assert fire_entry_bytes_max > 0
assert jobs_per_tick_max >= core.fire_entries_max
assert storm_ahead_ms_max > core.fire_ahead_ms and storm_commit_margin >= 1 and storm_jobs_per_tick_max <= jobs_per_tick_max
assert storm_rate_probe_pieces >= 2 and storm_jobs_per_tick_max >= storm_rate_sample_min
assert 0 < storm_fire_entries_max <= core.fire_entries_max and 0 < storm_fire_commands_in_flight_max <= fire_commands_in_flight_max
assert request_bytes_max >= core.job_spec_bytes_max and request_bytes_max <= core.batch_request_bytes_max
assert request_body_s > 0 and api_stop_grace_s > 0
assert core.grace_s_default * 1000 > 2 * trigger_interval_ms
assert lease_ttl_ms_default >= 4 * trigger_interval_ms
assert 0 < put_jobs_envelope_bytes < core.command_bytes_max

# Backfills and bulk DLQ operations (node/backfills.py) -------------------------------------
#: How often the leader's stepper looks at the active backfills: a rate is kept to this
#: precision (a bucket holds a second of its rate, so no rate is capped by it), and a backfill
#: whose run finished starts its next one within it.
backfill_tick_s = 0.1
#: Slots the stepper enumerates (cron) at once after a backfill's cursor; later steps take theirs
#: from that list until fewer than backfill_slots_refill_min are left.
backfill_slots_enumerated = 256
backfill_slots_refill_min = 2 * core.backfill_step_runs_max
#: The held children (run ids, oldest first) a cascade's view lists (GET /v1/backfills/{id});
#: ``progress.children_held`` counts them all.
backfill_held_shown = 100

assert backfill_slots_enumerated <= core.backfill_step_slots_max
assert backfill_slots_refill_min < backfill_slots_enumerated
# Authentication and the audit log (node/auth.py, node/audit.py) ------------------------------
#: Refused tokens (401) one source address may send in a burst, and how many a second it gets
#: back: past them, every request from that address is answered 429 (with Retry-After) before
#: its token is even looked at, until the bucket has refilled. Tokens are 256-bit random, so this
#: is not what stops guessing; it keeps a scanner from filling the log and the audit log.
auth_failures_burst = 20
auth_failures_per_s = 1.0
#: Source addresses whose failure buckets a node remembers (least recently failing forgotten).
auth_sources_max = 10_000
#: Size at which the audit log (DATA_DIR/audit.jsonl, requests with a valid token) is rotated,
#: and the rotated files kept (audit.jsonl.1 the newest): at most (1 + kept) x this on disk.
audit_file_bytes_max = 16 * 1024 * 1024
audit_files_kept = 4
#: Characters of one field of an audit record (a path, a name from the URL): a request line
#: is at most 8 KiB (aiohttp), a record stays well under a line a terminal shows whole. A
#: request id is cut at core request_id_chars_max, a user agent at audit_agent_chars_max.
audit_field_chars_max = 256
audit_agent_chars_max = 128
#: Requests refused before a token was accepted (401, 429) are counted, not recorded one by one:
#: one summary a (reason, source address) every interval, in DATA_DIR/audit-refused.jsonl, for
#: at most sources_max sources an interval (the rest counted together), each naming at most
#: keys_max routes and claimed token ids and agents_max user agents (the rest counted as
#: "other"). A summary is at most ~4 KB, so an interval writes at most ~1 MB whatever a flood
#: sends (a few hundred bytes a source, usually), to a file of its own budget: (1 + kept) x
#: bytes_max.
audit_refused_interval_s = 60
audit_refused_sources_max = 256
audit_refused_keys_max = 8
audit_refused_agents_max = 4
audit_refused_file_bytes_max = 4 * 1024 * 1024
audit_refused_files_kept = 2
#: How often the node writes the summaries of an interval that has ended.
audit_flush_poll_s = 5.0

assert auth_failures_burst >= 1 and auth_failures_per_s > 0

# The node's log (node/logs.py) ---------------------------------------------------------------
#: Lines of one kind (logger, level, message template) the node logs in a window; the others
#: are counted, and the next line of that kind says how many were left out.
log_repeats_burst = 20
log_repeats_window_s = 60.0
#: With --log-file: the size at which the file is rotated, and the rotated files kept (PATH.1 the
#: newest): at most (1 + kept) x this on disk.
log_file_bytes_max = 16 * 1024 * 1024
log_files_kept = 4

# Secrets at rest (node/rotation.py) ----------------------------------------------------------
#: Passes a rotate-key makes at most: each reads every secret value, re-seals those under another
#: key and proposes them; a pass finds more only when a write sealed under the old key landed
#: while the previous one was proposed (its proposer read the state before the key changed).
reseal_passes_max = 5
#: Values re-sealed between two yields to the event loop (~20 us each: unseal and seal).
reseal_step = 512

# The command line's attempt timeout is the client's (client/core.py BATCH_TIMEOUT_S): the CLI
# is a thin layer over the client.

# The garbage collector (gcpolicy.py, which takes these from the node) -------------------------
#: gen0 threshold of the garbage collector: allocations between young collections. CPython's
#: default is 700; one 400-entry fire command allocates thousands of containers, and with the
#: default, young collections cost as much as planning the fire itself (scripts/measure profile-fire:
#: planning 23 -> 5 us a slot at 20 000). gen1/gen2 stay at their defaults, and
#: CPython runs a full collection only when a quarter of the long-lived objects are new. That is
#: still too often for a large state (a full walk of 1M jobs holds the GIL ~1.2 s): ``GcPauses``
#: freezes the long-lived state as it grows, not on a timer (a periodic gc.freeze, tried earlier,
#: leaks any cyclic garbage alive at each freeze, and the node runs for months).
gc_gen0_threshold = 20_000
#: A full collection at least this long is followed by a freeze of its survivors.
gc_freeze_pause_s = 0.05
#: Records (jobs and runs together) added to the replica, or jobs written (a put that replaces
#: a job makes a new record), since the last freeze after which the next poll freezes.
gc_freeze_growth_records = 50_000
#: Collections at least this long are logged as warnings.
gc_log_pause_s = 0.2
#: How often the node checks whether to freeze its long-lived objects.
gc_poll_s = 1.0

#: Deferred fan-out steps (core/pipelines.py fanout_step) the trigger proposes a tick: each offers
#: up to core limits.fanout_per_command children.
fanout_steps_per_tick = 4

#: A graceful stop (SIGTERM, SIGINT) waits this long for the node's dump of what it applied
#: (replication.RaftNode.dump_before_stop) before it stops without one. A dump of a 1M-job state
#: takes tens of seconds on a small machine; systemd's default stop timeout is 90 s.
dump_on_stop_timeout_s = 60.0
#: How long a stopping leader waits for another voter to lead once it has handed its leadership
#: over (RaftNode.hand_over): a voter that holds the whole log takes it within an election round.
hand_over_on_stop_s = 3.0

#: Runs of pipeline parents the leader reads a second for their triggered children's slots that
#: no parent has reported yet, past max_wait_s (core/pipelines.py unreported): bounded, so many
#: parents cost a bounded read, the newest 64 runs of a parent a time.
unreported_scan_per_s = 8192

#: A batch's dry run shows a changed field's values (``from``, ``to``) up to this many bytes of
#: JSON each, and up to dry_run_values_bytes_max of them in one answer; longer ones, or past
#: that, by their size: the answer of a request of small specs replacing large stored ones stays
#: small (a review measured a 40 KB request answered with 9.7 MB of the stored payloads).
dry_run_value_bytes_max = 512
dry_run_values_bytes_max = 1024 * 1024
