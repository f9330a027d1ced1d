"""The bounds of the replicated state: what the state may hold, what a command may carry, and the
defaults a spec gets.

The rule for what is here: a bound that a replica's apply, or the core's pure functions whose
result is proposed (validation, planning), reads. These values are part of the replicas'
contract: changing one changes what apply accepts or what it does, so every replica of a cluster
must agree on it (a change ships as one version of the code, and must keep the entries already in
the log and the snapshots valid). A bound of one process (a timeout, a buffer, a pipeline, a
page, an executor's bound, the trigger's tick) is not here but in ``node/limits.py``, which reads
these where it means the same thing. Two exceptions, marked where they stand: the two bounds of
``POST /v1/jobs:batch``, which clients read too and a client does not import the node; and the
bound on a member's clock, which the replication layer reads and every member must share.

Each constant says what it bounds. Relations between them are asserted at import, so a change
that breaks one fails at once rather than in production (TigerBeetle's constants.zig).
Units go last in names: ``command_bytes_max``, ``grace_s_default``.
"""

# Commands -----------------------------------------------------------------------------------
#: Largest encoded command. pysyncobj 0.3.17 mis-handles messages above 64 KiB (its chunking
#: path), and pickling inflates bytes ~1.7x on the wire, so commands stay well under 40 KB.
command_bytes_max = 32 * 1024
#: Current version of the command envelope. Older versions are refused as values.
command_version = 1
#: Request ids remembered for idempotent retries, of each kind (clients' keys, worker tokens' keys, ids the
#: nodes make up: records.RequestLog), cluster-wide, FIFO eviction.
request_ids_max = 10_000
#: Longest request id a client may send.
request_id_chars_max = 64
#: The latest time a client may give (an ISO-8601 time, or ms since the epoch; the earliest is the
#: epoch): 9999-01-01T00:00:00Z, a year before the end of what datetime renders, so that a slot an
#: interval (every_s_max) after it, and a time zone's offset, still render.
time_ms_max = 253_370_764_800_000

# Jobs ---------------------------------------------------------------------------------------
jobs_max = 2_000_000
#: Jobs of one tenant that tokens limited to tenants may bring it to (a job they create, or move
#: into it): a tenant's operator cannot take all of jobs_max from the others (a red-team walk).
#: Tokens without tenants (an admin's import) are held by jobs_max alone.
jobs_per_tenant_max = 200_000
job_name_chars_max = 128
#: Encoded spec size bound (argv, payload, url together): keeps a put_job far below
#: command_bytes_max.
job_spec_bytes_max = 16 * 1024
payload_bytes_max = 8 * 1024
argv_items_max = 256
timeout_s_max = 7 * 24 * 3600
timeout_s_default = 600
priority_max = 9
priority_default = 5
queue_name_chars_max = 64
tenant_name_chars_max = 64
every_s_min = 1
every_s_max = 366 * 24 * 3600
#: A job's description (free text, shown by the API).
description_chars_max = 1024
#: Secrets a job may declare (its ``secrets`` map, given to its runs as environment variables or
#: headers), the longest name and the longest value.
secrets_max = 32
secret_name_chars_max = 64
secret_value_chars_max = 4096
#: Headers of an http executor, and variables of a shell executor's ``env``.
executor_headers_max = 64
executor_env_max = 256
#: Nesting levels of a payload (arrays and objects). JSON as deep as the parser takes (~1000)
#: would overflow the stack of code that walks it later, at a deeper stack: the view's encoder,
#: a run's RAFTSCHED_PAYLOAD.
payload_depth_max = 32
#: retry: failed attempts after which a run is dead, and the delays' ranges (seconds, the
#: multiplier applied once a failure).
retry_attempts_max = 100
retry_backoff_s_max = 24 * 3600
retry_backoff_multiplier_max = 10
#: overlap allow's max_concurrent: runs of one job queued or running at once.
overlap_concurrent_max = 10_000
#: jitter_s: the most a slot may be moved later (it must also stay below the shortest interval).
jitter_s_max = 3600
#: Slots one preview answers (GET /v1/jobs/{name}/preview, POST /v1/preview).
preview_count_max = 1000

# Misfire ------------------------------------------------------------------------------------
#: A slot fired within grace_s of its time is on time. 5 s covers a normal fail-over
#: (measured ~0.4-1.5 s) plus a trigger tick, so a leader change alone never turns a slot into a
#: misfire; a real outage (the cluster down for minutes) does.
grace_s_default = 5
grace_s_max = 24 * 3600
#: A slot fired within this of its time is on time whatever its ``grace_s`` (policy.grace_ms):
#: the trigger's own lateness (a tick, 50 ms; a busy leader's loop) is never a misfire. With
#: ``grace_s: 0`` a job that does not fire ahead (an overlap policy other than allow) had one
#: slot in four recorded missed, fired 1 ms late.
grace_ms_floor = 1000
#: fire_all runs at most max_catchup missed slots; the rest are recorded as skipped.
#: 100 bounds the burst a long outage can release on the workers.
max_catchup_default = 100
max_catchup_max = 1000

# Firing -------------------------------------------------------------------------------------
#: Job entries in one fire command (an on-time interval entry is ~55-75 bytes encoded; the
#: command size limit usually binds first).
fire_entries_max = 500
#: How long before its next slot the leader may take a job up and commit its fire (docs/design.md,
#: "Firing ahead"; with fire_ahead_span_ms, a later slot of the same entry up to 4 s before): the run
#: exists, queued, but no worker may start it before its slot. Committing a 10 000-slot storm
#: takes ~0.5-1 s on two cores; firing ahead makes it ready when the slot comes. Only for jobs whose
#: fire decision does not depend on their other runs (policy.fires_ahead).
fire_ahead_ms = 1000
#: Distinct spec parts (schedule, misfire, retry, overlap, payload) a replica keeps one shared
#: copy of (records.share_spec); past this, new distinct parts are simply not shared.
shared_spec_parts_max = 100_000
#: A job that fires ahead, once taken up (at most fire_ahead_ms before its next slot), has its
#: slots of this many more milliseconds planned in the same entry (up to the end of its block:
#: policy.phased_ahead_ms). An every_s: 1 job is then planned every 4 s with four slots, not
#: every second with one: per job planned, the leader plans, encodes and replicates an entry and
#: every replica checks it, looks the job up and moves its cursor, about half of what a one-slot
#: entry costs (scripts/measure profile-apply, AHEAD). 1 s (two slots) until 2026-12-04: 3 s
#: took a quarter off the CPU a slot of the 30 000-job sweep (docs/benchmarks.md).
fire_ahead_span_ms = 3000
#: Slots the proposer enumerates for one job in one fire (beyond that, slots are counted as a
#: recorded range, not listed one by one).
fire_slots_enumerated_max = max_catchup_max + 1
#: How far ahead a cron expression's next match is searched (cronsim's own bound, not a setting:
#: it gives up after 50 years). An expression with no match that far ahead is refused (422).
cron_years_between_matches_max = 50
#: The longest cron expression accepted (the longest useful one, a list of every minute, is 170).
cron_chars_max = 256

# History ------------------------------------------------------------------------------------
#: Entries (runs and recorded slots) kept per job, newest first; older finished entries are
#: dropped. Queued or running runs are never dropped by this bound.
history_per_job_default = 100
history_per_job_max = 1000
#: Runs waiting in one queue before its on_full policy applies.
queue_depth_default = 10_000
queue_depth_max = 1_000_000
#: Entries past twice a queue's depth after which one of its derived heaps (the per-priority
#: heaps acquire pops, the by-slot heap drop_oldest pops) is compacted or dropped. Their entries
#: go stale when a run leaves the queue by any other way than being popped (dropped, revoked,
#: paused, deleted, retried with a new due); without a bound a queue nothing acquires from would
#: grow its heaps by one entry a fire, forever. Twice the depth makes the work amortised O(1).
queue_index_stale_slack = 1024
#: A due's list of queued run ids in an acquire index (core/ready.py) is sorted once, when first
#: read, while it holds at most this many; beyond it, it is a heap (no sort of a storm's million
#: ids in one apply: ~1 s, the Raft thread waiting), and back to a sorted list below half of it.
ready_sort_max = 16_384
#: How far past its bound a job's history may grow while its oldest entry is still active
#: (queued, running or dead) before trimming scans behind it (fire.trim): scanning on every add
#: cost 30 % of a follower's time with 50 queued runs a job.
history_trim_scan_slack = 16
#: Records (skipped or coalesced ranges) one fire entry or one resume may carry. Plans make at
#: most one (policy.plan_fire, policy.plan_resume); the bound apply checks has always been 4.
fire_entry_records_max = 4
#: Distinct ints the state's interning table keeps before it starts again from empty
#: (records.share_int), and the longest string it interns (records.intern_str).
shared_ints_max = 4096
interned_str_chars_max = 64
#: Distinct worker targets lists the state keeps one shared copy of (workers.share_targets)
#: before it starts again from empty: a list is ~38 KB at most (128 names of 120 characters),
#: and a worker token that changes its targets at every lease must not grow the table for good.
shared_target_lists_max = 256
error_chars_max = 2048
output_bytes_max = 4096

assert command_bytes_max < 40 * 1024
assert fire_slots_enumerated_max > max_catchup_max
assert job_spec_bytes_max + 1024 < command_bytes_max
assert payload_bytes_max < job_spec_bytes_max
assert max_catchup_default <= max_catchup_max
assert history_per_job_default <= history_per_job_max

# Execution: leases, retries, dead letters, locks ---------------------------------------------
#: Runs one acquire may hand out (a worker asks for at most its free run slots).
acquire_runs_max = 100
#: Queue entries one acquire may look at (runs held back by a tenant's rate limit included).
acquire_scan_max = 2_000
lease_ttl_ms_min = 1_000
lease_ttl_ms_max = 600_000
#: Leases one heartbeat may carry (a worker holds at most its run slots, <= worker_slots_max).
#: An item is a run id (job name <= 128 chars + "@" + ms) and a token: <= ~160 bytes encoded.
heartbeat_leases_max = 150
#: Leases and locks one expire command may carry (the reaper sends more in later ticks).
expire_items_max = 150
worker_slots_max = 100
#: Outcomes one complete_many may carry (the worker also keeps it under the command size).
complete_batch_max = 100
#: Attempts whose record (token, worker, times, error) a run keeps; max_attempts is at most 100.
attempts_kept_max = 100
attempt_error_chars_max = 512
#: Dead runs kept per queue; beyond it the oldest is purged (counted in the queue's stats).
dlq_per_queue_max = 10_000
#: Locks held at once (the reaper looks at every held lock each tick).
locks_max = 10_000
#: Locks held at once by the tokens limited to one tenant (a lock counts for each of its tenants):
#: one tenant cannot take every lock of a cluster it shares (a red-team walk filled it in 7 s).
locks_per_tenant_max = 1_000
#: Attempts of one run lost with their worker (lease expired) that are retried on top of
#: max_attempts: losing a worker is not the handler's failure.
lease_losses_max = 5
lock_name_chars_max = 128
#: Longest name a lock holder gives itself (``owner``).
lock_owner_chars_max = 256
#: A pause's note (POST /v1/jobs/{name}/pause {"note"}): why, in the operator's words.
pause_note_chars_max = 256
#: Who paused it: a token's id (16 hex digits, or ``bootstrap``).
pause_by_chars_max = 64
#: A run's cancel (POST /v1/runs/{id}/cancel {"reason"}): why, in the operator's words.
cancel_reason_chars_max = 256
#: The rates a tenant may be given, in runs per second. A rate is stored in tokens per 1000 s
#: (core/tenants.py), so the smallest is one token; the largest is far above what a cluster starts.
tenant_rate_per_s_min = 0.001
tenant_rate_per_s_max = 100_000
#: Largest burst (the size of a tenant's token bucket).
tenant_burst_max = 1_000_000
#: Tenants with a policy (core/tenants.py: executors, placement, network), and the networks
#: one policy may allow its http runs to reach beyond the public ones.
tenant_policies_max = 10_000
tenant_network_allow_max = 64

assert acquire_runs_max <= heartbeat_leases_max
assert worker_slots_max <= heartbeat_leases_max
assert heartbeat_leases_max * 160 < command_bytes_max and expire_items_max * 160 < command_bytes_max
assert attempts_kept_max >= 100  # every attempt of the largest max_attempts is kept
assert round(tenant_rate_per_s_min * 1000) >= 1  # the smallest rate is not stored as zero

#: Cron slots counted one by one to give a skipped range an exact count (a cron step costs
#: 20-60 us, so this bounds one plan to well under a second); beyond it the record's
#: count is null ("more than this many"). Intervals are always counted exactly, by arithmetic.
cron_slots_counted_max = 10_000

# Bulk registration (POST /v1/jobs:batch, the put_jobs command) ------------------------------
#: Items in one put_jobs command. The command size (command_bytes_max) binds first: an item
#: is at least ~150 bytes encoded, so a command holds at most ~220.
put_jobs_items_max = 500
#: The exception to this file's rule: bounds of one POST /v1/jobs:batch request, which apply
#: never reads (it reads put_jobs_items_max). They are here because clients read them too (the
#: client, the CLI and the SDK split a large import into requests of batch_jobs_max) and a
#: client does not import the node; the node's handling of a batch is bounded in node/limits.py.
#: Jobs in one POST /v1/jobs:batch request. The node validates them all before proposing any,
#: on its event loop (yielding every node/limits.py batch_validate_step jobs), so this bounds
#: that work.
batch_jobs_max = 10_000
#: Largest POST /v1/jobs:batch body (other requests keep the API's 64 KiB).
batch_request_bytes_max = 16 * 1024 * 1024

assert batch_jobs_max * 160 < batch_request_bytes_max
assert put_jobs_items_max * 100 > command_bytes_max  # an item is >= ~150 bytes: bytes bind first

# Clocks (core/clocksync.py) ------------------------------------------------------------------
#: How far a member's wall clock may be from the cluster's (the median of the members' clocks,
#: measured on the Raft traffic) before it counts as lying: a leader further off fires nothing,
#: expires nothing and hands its leadership to a member within it, and a member further off
#: does not stand for election while it knows. It is also the promise the fault harness checks:
#: no run begins more than this before its slot. The second exception to this file's rule: apply
#: never reads it, but every member's replication layer does (which imports only the core), and
#: the members must judge by one bound, or a leader could keep firing on a clock its peers refuse.
#: NTP keeps clocks within milliseconds; a second is far above that and far below what a
#: stepped or stopped clock does.
clock_skew_ms_max = 1000

# API tokens (core/tokens.py) -----------------------------------------------------------------
#: Tokens the state holds, revoked and expired ones included until a new token needs their place
#: (the oldest revoked, then the oldest expired, is given up first). Each is ~150 bytes; every
#: node reads the table on every request, by id.
tokens_max = 10_000
#: Tenants one token may be limited to.
token_tenants_max = 64
#: A token's note (who or what it is for), free text shown by GET /v1/tokens.
token_note_chars_max = 256
#: Worker ids a worker token may be bound to (it then speaks for those ids only).
token_workers_max = 64

assert token_tenants_max * (tenant_name_chars_max + 2) + token_note_chars_max + 512 < command_bytes_max

# Secrets at rest (core/seal_keys.py, raftsched/sealing.py) -------------------------------------
#: A key id (the name of its file in a node's key ring): every sealed value carries it.
seal_key_id_chars_max = 16
#: Jobs one reseal command re-seals; the command's size (command_bytes_max) binds first, since an
#: item carries at least one sealed value (~60 bytes).
reseal_jobs_max = 2_000

assert reseal_jobs_max * 60 > command_bytes_max

# Labels (the job spec's ``labels``) ---------------------------------------------------------
#: Labels on one job: a small map saying who manages the job (the SDK's ``raftsched.app``, a
#: team), which ``GET /v1/jobs?label=k=v`` filters on. Metadata beyond that belongs in the
#: payload or the description.
job_labels_max = 16
#: A label key: letters, digits, ``.``, ``_``, ``/`` and ``-``, starting and ending with a letter
#: or digit (``raftsched.app``, ``team``).
label_key_chars_max = 128
#: A label value (any printable text, the empty string included).
label_value_chars_max = 256

assert job_labels_max * (label_key_chars_max + label_value_chars_max) + 1024 < job_spec_bytes_max
# Backfills and bulk dead-letter operations (core/backfills.py) -------------------------------
#: Backfills and bulk DLQ operations running or paused at once, cluster-wide: the leader's
#: stepper looks at each of them on every one of its ticks (node/backfills.py).
backfills_active_max = 64
#: Backfills of one tenant's jobs running or paused at once, for a backfill a token limited to
#: tenants asks for (apply counts them: core/backfills.py): a quarter of the cluster's bound, so
#: one tenant's token cannot take every active slot from the other tenants and the admin's bulk
#: DLQ operations, which share backfills_active_max (docs/backfill.md, "Bounds").
backfills_tenant_active_max = backfills_active_max // 4
#: Backfills running or paused at once that tokens limited to tenants started, all tenants
#: together: a token limited to several tenants (or several tenants' tokens) cannot hold every one
#: of backfills_active_max either; the rest is kept for tokens without tenants (an admin's bulk
#: DLQ operations among them).
backfills_limited_active_max = backfills_active_max - backfills_active_max // 4
#: Finished ones (done or cancelled) kept for GET /v1/backfills; beyond it the oldest finished
#: one is forgotten (its runs stay in their jobs' histories, naming it).
backfills_kept_max = 100
#: Slots one backfill may cover (the ceiling of its max_slots): the proposer enumerates them with
#: cron for the dry run and to count them, so this is cron_slots_counted_max.
backfill_slots_max = 10_000
#: max_slots when the request gives none.
backfill_max_slots_default = 1000
#: A backfill's (or a bulk requeue's) runs queued or running at once: its list of active runs
#: is kept in the state, so this bounds it.
backfill_concurrent_max = 1000
#: max_concurrent of a backfill that gives none: one at a time, oldest first, unless asked.
backfill_concurrent_default = 1
#: The rates a backfill or bulk operation may be given, in runs per second (stored like a
#: tenant's: tokens per 1000 s).
backfill_rate_per_s_min = 0.001
backfill_rate_per_s_max = 1000
#: The rate of a bulk requeue that gives none (runs per second): a re-drive of thousands of dead
#: runs should not land on the workers at once.
dlq_requeue_rate_per_s_default = 10
#: Slots one backfill_step command may carry (9 bytes each at most) and runs it may create.
backfill_step_slots_max = 1000
backfill_step_runs_max = 100
#: Dead runs one dlq_bulk_step may carry (the leader plans run_refs_per_command).
dlq_bulk_step_runs_max = 150
#: Longest backfill id (a client-given one; generated ones are 10 characters).
backfill_id_chars_max = 64
#: Digits of a time in ms a run id is made of (a slot; the now of a manual run): up to
#: time_ms_max, and a slot an interval after it.
time_ms_digits_max = 15
#: Digits of the N of a manual run's id: a count the state keeps, which a snapshot encodes as an
#: unsigned 64-bit integer at most.
manual_seq_digits_max = 20
#: The longest run id the state makes, which every check of a run id a client sends allows
#: (core/model.py check_run_id, the API's run path parameters): the longest of ``job@slot`` (a
#: scheduled run, a pipeline's child, a slot triggered), ``job@now!manual-N`` (a job triggered),
#: ``job@slot#manual`` and ``job@slot#manual-N`` (a slot triggered again) and
#: ``job@slot#b<backfill id>`` (a backfilled slot whose ``job@slot`` is taken), which is that.
run_id_chars_max = job_name_chars_max + 1 + time_ms_digits_max + max(
    len("#b") + backfill_id_chars_max, len("!manual-") + manual_seq_digits_max, len("#manual-") + manual_seq_digits_max)
assert len(str(time_ms_max + every_s_max * 1000)) <= time_ms_digits_max
#: Run references (a run id and a token or a key, ~run_id_chars_max + 24 bytes each) the node and
#: the worker put in one command they send: heartbeats, releases, expiries, a bulk DLQ step.
#: Apply still takes up to the larger maxima above (heartbeat_leases_max, expire_items_max,
#: dlq_bulk_step_runs_max: what older senders send), which run ids of the longest kind would
#: take past command_bytes_max.
run_refs_per_command = 110
# (a limited worker's commands carry its token's tenants too)
assert (run_refs_per_command * (run_id_chars_max + 24) + token_tenants_max * (tenant_name_chars_max + 2)
        + 1024 < command_bytes_max)
assert run_refs_per_command <= min(heartbeat_leases_max, expire_items_max, dlq_bulk_step_runs_max)
#: Longest error substring a bulk DLQ operation filters on.
dlq_error_filter_chars_max = 256
#: The most dead runs one bulk operation may act on (max_count's ceiling).
dlq_bulk_count_max = 1_000_000

assert backfill_slots_max <= cron_slots_counted_max
assert backfill_step_runs_max <= backfill_step_slots_max and backfill_step_runs_max <= backfill_concurrent_max
assert backfill_step_slots_max * 9 + 1024 < command_bytes_max
assert backfill_concurrent_default <= backfill_concurrent_max
assert backfill_max_slots_default <= backfill_slots_max
assert round(backfill_rate_per_s_min * 1000) >= 1
# The worker fleet (core/workers.py) -------------------------------------------------------
#: Workers the registry holds, embedded and remote together. A hello of one more when it is full
#: evicts the worker unseen the longest if that one is gone, and is refused otherwise: a flood of
#: worker ids cannot grow the state without limit.
workers_max = 10_000
#: Longest worker id ("host/pid", a node id and a pid, an address).
worker_id_chars_max = 128
#: Labels one worker may carry, and labels one job's placement may ask for.
worker_labels_max = 16
#: Longest label name and value (the bound Kubernetes puts on a label's name).
worker_label_chars_max = 63
#: Queues one worker may name (a worker that serves more serves every queue: it names none).
worker_queues_max = 64
#: Longest version string, and process instance id, a worker reports of itself.
worker_version_chars_max = 64
#: Python targets (``module:function``) a worker may say it has handlers for (the fact
#: ``targets``: ``raftsched worker --app``), and the longest one: an app of more handlers says none,
#: and its worker takes every run of the app (refusing those it has no handler for).
worker_targets_max = 128
worker_target_chars_max = 120
#: How long a python run waits, once due, for a worker that said it has its handler (the fact
#: ``targets``: leases.apply_acquire) before a worker of its app without it may take it (and fail
#: it, naming the handler it lacks; its retries then wait no more, leases.HANDLER_WAITED):
#: a rolling deploy's minutes, not the hours a handler removed without a prune would pile its runs
#: up in front of the app's other jobs.
handler_wait_ms = 300_000
assert (worker_targets_max * (worker_target_chars_max + 2) + worker_labels_max * 2 * (worker_label_chars_max + 2)
        + 64 * (64 + 2) + 2048 < 32 * 1024)  # a hello fits a command (token_tenants_max of tenants)
#: A worker unseen this long (no hello, lease, heartbeat, completion or release of its own reached
#: the state, and no node reported it connected in a workers_seen) is gone: read time against its
#: last_seen, in state time. Nodes report their connected workers every few seconds
#: (node/limits.py workers_seen_interval_s), so only a worker that stopped is ever gone.
worker_gone_ms = 30_000
#: A worker unseen this long, though not gone yet, is no free worker to a queued run's
#: ``waiting_for`` (core/worker_queries.py why_queued_many): a live worker is seen every few
#: seconds (its lease requests and heartbeats, or a node's report of it), so one quiet this long
#: has most likely stopped, and a run it could take says so rather than nothing until it is gone.
worker_quiet_ms = 12_000
#: A worker gone this long is forgotten (the leader's forget_workers): operators see a dead worker
#: for an hour, and a fleet whose ids change with every restart keeps the registry small.
worker_forget_ms = 3_600_000
#: Worker ids one workers_seen command may carry (a node sends more in several), and items one
#: forget_workers may carry.
workers_seen_ids_max = 1000
forget_workers_max = 500

assert worker_forget_ms > worker_gone_ms > 2 * lease_ttl_ms_min
assert worker_gone_ms > worker_quiet_ms
assert worker_labels_max * 2 * (worker_label_chars_max + 2) < job_spec_bytes_max // 4
assert (token_tenants_max * (tenant_name_chars_max + 2) + token_workers_max * (worker_id_chars_max + 2)
        + token_note_chars_max + 512 < command_bytes_max)

#: Events held in the replicated outbox (core/events.py): the oldest give way first. A sink that
#: falls further behind than this loses the oldest events it had not been sent (counted).
outbox_events_max = 20_000

# Deadlines (core/deadlines.py) ---------------------------------------------------------------
#: Longest deadline a job may give (seconds): start_within_s, succeed_within_s, max_since_success_s.
deadline_s_max = 400 * 86_400
#: Slots whose deadlines are not judged yet that the state keeps: past it, the oldest is judged
#: at once, missed with cause ``untracked`` (an alert rather than silence).
deadlines_pending_max = 100_000
#: Judged deadline records kept for GET /v1/deadlines and the run views: the oldest go first.
deadlines_kept_max = 20_000
#: Deadline items one fire command may carry (one per slot it makes a run or record of).
fire_deadline_items_max = 2_000
#: Bytes of deadline items one fire entry may carry (an entry of the most runs, 2 001 slots of 9
#: bytes, and these still fit a command): a catch-up past it tracks its newest slots. Its own
#: items first, then its pipeline descendants' (deadlines.child_items) in what is left.
fire_entry_deadline_bytes_max = 8 * 1024
#: Run ids (and jobs) one deadline_judge command may carry.
deadline_judge_items_max = 64
#: Slots of one recorded range (skipped, coalesced) whose deadlines are judged one by one: the
#: first this many (a three-day outage of a job every minute would otherwise be 4 320 records and
#: events); the rest of the range are in its one record, with its count.
deadline_range_slots_max = 16
#: Runs a heartbeat job keeps open (waiting for a ping, or started): past it the oldest are closed.
heartbeat_open_max = 16

assert deadlines_kept_max >= 1 and deadlines_pending_max >= 1 and heartbeat_open_max >= 1
assert (2 * max_catchup_max + 1) * 9 + fire_entry_deadline_bytes_max + job_name_chars_max + 64 < command_bytes_max - 2048
assert fire_entry_deadline_bytes_max // 57 <= fire_deadline_items_max
assert 2 * deadline_judge_items_max * (job_name_chars_max + 64) < command_bytes_max
# Notifications (core/notify.py, node/notify.py: docs/notifications.md)
#: Sinks the cluster holds, and the routes a job's or a tenant's ``notify`` may list.
sinks_max = 100
#: Sinks of one tenant (``"tenant"`` in its spec): one tenant cannot take every sink of the cluster.
sinks_per_tenant_max = 10
notify_routes_max = 8
#: Events a sink's dead list keeps (the oldest give way), and events a requeue moves at once.
sink_dead_max = 1000
sink_redo_max = 1000
#: A sink's delivery attempts per event (its ``retry.max_attempts``): default and bound.
sink_attempts_default = 8
sink_attempts_max = 20
#: How long past its attempts an event is retried while its sink cannot be reached (its
#: ``retry.outage_s``): default (a day) and bound (a week); and the least wait between two such
#: tries, whatever the backoff says.
sink_outage_s_default = 86_400
sink_outage_s_max = 604_800
sink_outage_wait_s_min = 1
#: Items of one sink_progress command (one a sink) and dead events it may carry.
sink_progress_items_max = sinks_max
sink_progress_dead_max = 200
#: Recipients of an email sink.
sink_email_to_max = 20
#: A takeover reports ``cluster.no_leader`` when the state time it read before proposing is this
#: much older than its own now (the gap without a leader that committed anything).
no_leader_report_ms = 15_000
#: ``pause_on_failure.after_consecutive`` and a route's ``after_consecutive``: bounds.
consecutive_max = 1000
repeat_every_s_max = 30 * 86_400
#: A queued run no live worker may take (its placement, its tenant) for this long is reported
#: once, ``run.unplaceable`` (the leader looks every ``unplaceable_check_s``, node/notify.py).
unplaceable_report_ms = 60_000
unplaceable_runs_max = 500

#: Members' API URLs held (core/members.py; far more than any cluster has members, removed ones
#: included), and the length of one.
member_urls_max = 256
member_url_chars_max = 300

# ------------------------------------------------------------------ pipelines (core/pipelines.py)
#: Parents one job may name in ``after``.
after_parents_max = 16
#: Jobs that may name one job as a parent: a parent's final outcome creates or records all of
#: them in the one command that records it (docs/pipelines.md, "Fan-out").
children_per_job_max = 10_000
#: Children one command offers a final outcome to: a parent with more (or a cascade that reaches
#: more) has the rest offered by the leader's fanout_step commands, this many each, so that no
#: apply holds a replica for long (docs/pipelines.md, "Fan-out").
fanout_per_command = 500
#: Jobs below a rerun with ``downstream`` (all of them, eligible or not): a trigger whose job has
#: more is refused; the rerun's end opens at most this many (pipelines.open_downstream reads each
#: one's history for the slot, in one command: bounded as a fan-out is).
downstream_jobs_max = 500
#: A forced delete of a parent records each of its unfinished runs' slots dependency_missing in
#: each triggered child: one record a slot up to this many, ranges beyond (pipelines.on_delete).
delete_slots_recorded_one_by_one = 16
#: Slots of one child waiting for their parents at once; a new one beyond it records the oldest
#: ``upstream_timeout``.
joins_per_child_max = 1_000
#: Longest wait of a child's slot for its parents (max_wait_s), and its default.
max_wait_s_max = 30 * 86_400
max_wait_s_default = 86_400
#: Largest result a run may return (msgpack-encoded), handed to its children.
result_bytes_max = 4096
