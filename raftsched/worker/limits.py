"""Every bound of one worker process, in one place: the lease loop, its HTTP channel (``raftsched
worker``) and the executors. A node's embedded worker is such a worker too; the node's own bounds
(the trigger, the API, the node's side of the worker protocol) are ``node/limits.py``'s.

The bounds of the replicated state and of what a command may carry are ``core/limits.py``; a
worker uses those where it means the same thing (an executor keeps ``output_bytes_max`` bytes of
a run's output because the state keeps that much). Each constant here says what it bounds, units
go last in names, and relations with the core's bounds are asserted at import.
"""
from ..core import limits as core

# Proposals ----------------------------------------------------------------------------------
#: How long a proposal waits for its command to be applied, unless the caller says otherwise
#: (raftsched/proposer.py: the embedded worker's commands, and the node's, which names this value
#: in node/limits.py).
propose_timeout_s_default = 5.0
#: The lease TTL a worker asks for unless told otherwise (core lease_ttl_ms_min..max bound what
#: an acquire may carry).
lease_ttl_ms_default = 10_000
#: Runs a worker executes at once unless told otherwise (``--slots``, a node's embedded worker too).
slots_default = 4
#: Weight of the newest sample in a worker's moving averages of run and acquire times.
ewma_weight = 0.1
#: The shortest secret value masked out of a run's output (worker/masking.py): a shorter one
#: would mask every occurrence of a common string.
mask_chars_min = 4

assert core.lease_ttl_ms_min <= lease_ttl_ms_default <= core.lease_ttl_ms_max

# Executors ----------------------------------------------------------------------------------
#: Characters of an executor's error reason ("exit status 3", "ValueError: ..."): one short
#: line, the detail is in the output. Below the core's attempt_error_chars_max, so an attempt's
#: record keeps the reason whole.
outcome_error_chars_max = 300
#: Bytes of an HTTP response body an http run reads at most; the rest is never read. Of what is
#: read, the run's output keeps the tail (core output_bytes_max).
http_body_read_bytes_max = 64 * 1024
#: How long a shell run's process group has between SIGTERM and SIGKILL, and a cancelled python
#: coroutine to finish before it is abandoned, unless the caller says otherwise.
kill_grace_s_default = 5.0
#: Bytes of the outcome a child process of ``raftsched worker --app --isolation subprocess``
#: writes that the worker reads at most: its output is one core output_bytes_max tail, which
#: JSON may escape to six times its size, and a short error. A longer file is no outcome.
child_result_bytes_max = 6 * core.output_bytes_max + core.result_bytes_max + 4096
#: While a shell run's process group is being killed, how often it is looked at: first after
#: kill_poll_s_min, then twice as long each time, up to kill_poll_s_max (there is no event for
#: "the last process of a group exited").
kill_poll_s_min = 0.01
kill_poll_s_max = 0.1
#: After a shell run's process group is gone, how long to wait for its pipe's end-of-file. Only
#: a process that left the group (setsid) while keeping stdout can hold it open; then the pipe
#: is closed.
shell_drain_s_max = 1.0
#: After SIGKILL, how long to wait for a shell run's main process to be reaped (a process stuck
#: in the kernel can outlive SIGKILL for a while; the child watcher still reaps it later).
shell_reap_s_max = 5.0
#: How long a cancelled HTTP request gets to finish its cleanup before it is abandoned (a job's
#: coroutine gets the kill grace, like a process).
http_cancel_grace_s = 1.0
#: The run server (worker/runserver.py): how long it may take to start (an interpreter and its
#: imports) and to stop once told; after it failed to start, how long runs fail at once with that
#: failure before the next run tries again.
run_server_start_s = 30.0
run_server_stop_s = 5.0
run_server_restart_s = 1.0
#: How long the run server may take to answer a run (it answers at once: a spawn or a fork).
#: Past it the server is taken for stopped (a run may SIGSTOP it: the same user) and killed.
run_server_answer_s = 10.0
#: Seconds an idle python run thread waits for another run before it exits.
run_thread_idle_s = 30.0
#: The repr of a python run's return value: generous but bounded, so that a huge value does not
#: cost a huge repr. Levels of nesting shown, and items shown of each container (strings and
#: numbers are cut at core output_bytes_max, the most the output keeps anyway).
python_repr_levels_max = 6
python_repr_items_max = 100

assert outcome_error_chars_max <= core.attempt_error_chars_max <= core.error_chars_max
assert http_body_read_bytes_max >= core.output_bytes_max
assert 0 < kill_poll_s_min <= kill_poll_s_max

# The lease loop -----------------------------------------------------------------------------
#: Acquires one worker keeps in flight at once. The next one goes out while the runs of the last
#: still execute, once 1/this of the slots are free, so slots do not wait a log round trip idle.
acquires_in_flight_max = 2
#: complete_many commands one worker keeps in flight at once.
reports_in_flight_max = 2
#: How long an outcome waits for the runs still executing, so that they share one command.
outcome_coalesce_s = 0.002
#: Encoded outcomes per complete_many, leaving room for the envelope under command_bytes_max.
complete_batch_bytes_max = core.command_bytes_max - 4096
#: How often an idle worker looks at its replica for ready work, unless told otherwise; after a
#: failed acquire it waits as long before the next.
worker_poll_s_default = 0.1
#: After an acquire that granted nothing (its ready entries were stale or rate-limited), the
#: worker waits this many poll intervals before the next, rather than spin on the log.
empty_acquire_backoff_polls = 5
#: Heartbeats per lease TTL: with three, a lease survives two lost heartbeats.
heartbeats_per_lease_ttl = 3
#: ... and never further apart than this, whatever the TTL.
heartbeat_interval_s_max = 1.0
#: A heartbeat is given up after this share of the lease TTL: one that takes longer is of no use,
#: and the lease watchdog must not wait behind it.
heartbeat_timeout_lease_ttl_share = 0.5
#: The longest interval a node may ask for (``next_heartbeat_s``), as a share of the lease TTL:
#: two intervals and a heartbeat given up between them stay under a TTL, so a lease survives a
#: heartbeat that timed out (a third of the TTL, the worker's own cadence, would not).
heartbeat_asked_ttl_share_max = (1 - heartbeat_timeout_lease_ttl_share) / 2
#: A grant that reaches the worker with less than this share of its lease TTL left (its
#: ``deadline`` against the worker's clock, the cluster's) arrived late: its answer waited behind
#: a pause of the worker, a node catching up or an election, and the lease may be gone already.
#: The worker heartbeats it before it starts the run, and starts only what the heartbeat kept.
grant_late_ttl_share = 0.5
#: How often the lease watchdog looks whether no heartbeat has succeeded for a whole TTL
#: (docs/design.md, "A watchdog checks every 100 ms").
lease_watchdog_interval_s = 0.1
#: A run granted before its slot (by the cluster's clock, the worker's ``clock``) waits for it,
#: looking at that clock this often: cluster time can move under it (a new estimate).
slot_wait_poll_s = 0.05
#: A wait for a slot at least this long is logged (shorter ones are the clocks' noise).
slot_wait_logged_ms = 100
#: A run held for a slot (prefetched) that has waited this long, and this many acquire round
#: trips, while every slot stays taken is given back for another worker to start (its worker's
#: runs turned long after it was prefetched). A prefetched run normally waits less than a round
#: trip: prefetching is on only while runs end faster than one.
prefetch_wait_s_min = 1.0
prefetch_wait_rtts = 4
#: ... but never more than this, whatever the round trips measured.
prefetch_wait_s_max = 5.0
#: How long a stopping worker waits, beyond the kill grace of its runs, for them to end and for
#: their reports to be answered.
stop_report_grace_s = 2.0
#: How long a worker retries a complete_many that found no leader or whose outcome is unknown
#: (with the same request id); then it gives up, and the leases expire and the runs are retried.
report_deadline_s = 60.0
#: The pause between two tries of such a report.
report_retry_s = 0.2

assert complete_batch_bytes_max > 0
assert heartbeats_per_lease_ttl >= 2  # a lease survives a lost heartbeat
assert 2 * heartbeat_asked_ttl_share_max + heartbeat_timeout_lease_ttl_share <= 1
assert 0 < heartbeat_timeout_lease_ttl_share < 1
assert 0 < grant_late_ttl_share < 1
assert lease_watchdog_interval_s < core.lease_ttl_ms_min / 1000

# The worker protocol over HTTP (worker/remote.py; the node's side: node/fleet.py) ------------
#: The longest a lease request may wait at a node for work (its ``wait_s``; a node refuses a
#: longer one), and what ``raftsched worker`` asks for unless told otherwise.
lease_wait_s_max = 60.0
lease_wait_s_default = 20.0
#: A lease request's HTTP timeout is its wait_s plus this: the node may first propose the
#: worker's hello (at most a propose timeout), and answers at wait_s at the latest, then waits
#: for the acquire in flight for it (at most a propose timeout and a second); two seconds more.
lease_request_slack_s = 2 * propose_timeout_s_default + 3.0
#: One completion or release request's timeout, and how long a worker keeps retrying a release.
worker_request_timeout_s = 10.0
release_deadline_s = 15.0
#: How long a worker stopped by a signal keeps trying to tell the cluster it leaves (its drain
#: goes on meanwhile; not told, its record shows it active until unseen for worker_gone_ms).
leave_deadline_s = 5.0
#: After a node refused a lease request for good (a wrong token, a full registry), the pause
#: before the worker asks again.
lease_refused_pause_s = 5.0
#: a worker whose lease requests go unanswered (no node reachable, no leader) says so once that
#: has lasted unanswered_warn_after_s (longer than an election), then every unanswered_log_every_s
#: while it lasts (worker/loop.py); a remote worker's request tries every node for longer than
#: that (lease_request_slack_s and more), so its first failure is said at once
unanswered_warn_after_s = 10.0
#: At its start a worker asks its nodes' /healthz once, for at most this long, and says at once
#: when none answers (a wrong --url, nodes not started): its first lease request, a long-poll,
#: fails only after its whole deadline (~33 s), and said nothing until then (a walk).
first_contact_s = 5.0
unanswered_log_every_s = 60.0
#: Outcomes ride on a lease request sent in the same turn of the event loop (one request a
#: batch instead of two) when they encode to at most this many bytes of JSON, well under the
#: node's 64 KiB request body with the worker's facts beside them; larger ones go alone.
carried_results_bytes_max = 32 * 1024
#: The longest such a lease request waits at the node for runs: long enough for the node's
#: dispatcher to look (a follower leaves a fresh run to the leader's for lease_follower_grace),
#: short enough that the outcomes' answer, which comes with it, is never held for long (a wait
#: of 1 s held a burst's last outcomes that long, and the lease loop's report slots with them).
carried_lease_wait_s = 0.05
#: After a node refused outcomes on a lease request (a node of an older version), how long the
#: worker sends them alone before it tries again; likewise its handlers' targets.
carried_refused_pause_s = 300.0
#: How long a draining ``raftsched worker`` lets its runs finish before it gives them back,
#: unless told otherwise (``--drain-s``).
drain_s_default = 30.0

assert lease_wait_s_default <= lease_wait_s_max
