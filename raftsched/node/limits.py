"""Every bound of the node's own work, in one place: what one node does outside the replicated state.

The bounds of the replicated state and of what a command may carry are ``core/limits.py``; a node
uses those where it means the same thing (an executor keeps ``output_bytes_max`` bytes of a
run's output because the state keeps that much). Each constant here says what it bounds, units
go last in names, and relations with the core's bounds are asserted at import.
"""
from ..core import limits as core

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
