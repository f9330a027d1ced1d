"""pysyncobj's configuration, as raftsched runs it: the tuned defaults with the measurements
behind them, the options a RaftNode sets itself, and ``make_conf``, which refuses what
``SyncObjConf`` would silently accept."""
from __future__ import annotations

import math
from typing import Any

from pysyncobj import SyncObjConf

#: Every option SyncObjConf knows, read from a default instance (its __init__ assigns them all).
_KNOWN_CONF_KEYS = frozenset(vars(SyncObjConf()).keys())

#: Tuned defaults, with the figures behind them (2 vCPU, loopback, password on; "in one process"
#: = three RaftNodes sharing one interpreter, as in tests/replication_helpers.py).
RAFT_CONF_DEFAULTS: dict[str, Any] = {
    # Batching off. With batching on (pysyncobj's default) a lone command waits for the next
    # heartbeat: a lone propose measured p50 103 ms on the leader, 207 ms on a follower (60
    # sequential proposals, in one process); the shared notes: 101.5 ms, i.e. ~10 writes/s. Off,
    # the leader sends append_entries at once: p50 2.7 ms on the leader, 3.7 ms on a follower (in
    # one process, so the three nodes share a GIL; 0.25 ms in the notes' 3-process bench without
    # a password). Throughput comes from batching at the command level (one `fire` for all due
    # slots, one `heartbeat` per worker), which costs less than pysyncobj's batching gives
    # (notes: 11.8k vs 15.8k ops/s).
    "appendEntriesUseBatch": False,
    # Heartbeat. pysyncobj requires raftMinTimeout > 3 x appendEntriesPeriod; 0.1 s lets a
    # follower miss four heartbeats (a ~0.4 s stall of a tick thread: GC, a large apply) before
    # it runs for leader.
    "appendEntriesPeriod": 0.1,
    # Election timeout, drawn uniformly in [min, max]. pysyncobj has no pre-vote: a spurious
    # election deposes a healthy leader, so the floor stays at five heartbeats rather than the
    # 0.3 s that gave the fastest fail-over in the notes (0.41 s). Measured kill -9 of the leader
    # -> first commit on a survivor, 3 processes: medians 0.65, 0.86 and 0.65 s over three runs
    # of 8 kills (range 0.53-1.7 s); 1.0/2.0 measured 1.56 s in the notes. Inside the 5 s misfire
    # grace (limits.grace_s_default) either way.
    "raftMinTimeout": 0.5,
    "raftMaxTimeout": 1.0,
    # A leader cut off from the majority steps down after this long without answers (pysyncobj
    # default 30 s: a zombie leader for 30 s). 1.0 s = raftMaxTimeout, so an old and a new leader
    # both believe they lead for at most ~0.5 s. Nothing may be decided on that belief alone:
    # fires, leases and reads go through the log.
    "leaderFallbackTimeout": 1.0,
    # A connection with nothing received for this long is dropped. pysyncobj requires it to be
    # >= raftMaxTimeout. Every link carries a keepalive every _KEEPALIVE_PERIOD_S (0.5 s) and the
    # leader's links a heartbeat every 0.1 s, so 2.0 s is four lost keepalives: it detects a
    # black-holed or paused peer in 2 s and does not flap on a GC pause.
    "connectionTimeout": 2.0,
    # pysyncobj's dialling side retries a dead peer only every connectionRetryTime (default 5 s).
    # A restarted node runs for leader after 0.5-1.0 s without a heartbeat and, with no pre-vote,
    # deposes the healthy leader: at 0.25 s the leader's reconnect + key exchange + first
    # heartbeat (<= ~0.35 s) lands before the restarted node's earliest election timeout. A
    # connect attempt to a dead peer costs one SYN.
    "connectionRetryTime": 0.25,
    # Fail fast with MISSING_LEADER (definite) instead of queueing commands inside pysyncobj until
    # some leader appears, possibly long after the caller gave up. propose() itself waits for a
    # reachable leader until its deadline, resubmitting only after definite failures.
    "commandsWaitLeader": False,
    # Bound on commands queued for the tick thread: ~1 s of backlog at pysyncobj's ~10k ops/s;
    # beyond that callers get QUEUE_FULL (Unavailable, 503) instead of growing latency.
    "commandsQueueSize": 10_000,
    # Dumps are written by a forked child, which also encodes the state (see _DeferredSnapshot):
    # the tick thread pays for fork() only. In-thread, 200k jobs blocked the tick thread 6-7 s
    # and caused elections (notes).
    "useFork": True,
    "logCompactionMinEntries": 5000,
    "logCompactionMinTime": 300,
    "bindRetryTime": 0.5,
    # pysyncobj's own membership change, off and reserved: its one-change-at-a-time guard is dead
    # code, its dump's member list overrides the log's (its issue 133), and it has no learners.
    # Membership changes through _membership.py's rules instead (RaftNode.change_members).
    "dynamicMembershipChange": False,
}

#: raftsched's own options for the Raft port, given in ``conf_overrides`` beside SyncObjConf's
#: (``RaftNode`` takes them out before ``make_conf``; ``make_port_options`` checks them).
RAFT_PORT_DEFAULTS: dict[str, Any] = {
    # A connection that has not completed the key exchange (proved it holds the secret and, when
    # it dialled us, named itself as a member) this long after it opened is dropped. A member
    # does it in one round trip and two ticks (milliseconds); pysyncobj kept a silent stranger's
    # connection open for as long as it liked (100 of them stayed 12 s and more). 2.0 s =
    # connectionTimeout: a peer whose tick thread stalls that long would be dropped anyway. The
    # time the node's own tick thread was stalled does not count (RaftTransport). (pysyncobj's
    # admin utility, which raftsched does not use, never names itself: it would be dropped too.)
    "authTimeout": 2.0,
}

#: Keys RaftNode sets itself; conf_overrides may not change them.
_RESERVED_CONF_KEYS = frozenset({
    "password", "journalFile", "fullDumpFile", "bindAddress", "onStateChanged", "onReady",
    "dynamicMembershipChange", "serializer", "deserializer", "serializeChecker", "autoTick",
    "useFork",
})


def make_conf(**kwargs: Any) -> SyncObjConf:
    """Build a ``SyncObjConf``, refusing what pysyncobj would silently ignore or assert on.

    :raises ValueError: for a key SyncObjConf does not know (pysyncobj accepts typos as no-ops),
        or for values that break its own invariants.
    """
    unknown = sorted(set(kwargs) - _KNOWN_CONF_KEYS)
    if unknown:
        raise ValueError(f"unknown SyncObjConf option(s): {', '.join(unknown)}")
    conf = SyncObjConf(**kwargs)
    # SyncObjConf.validate() uses bare asserts (gone under -O, and without messages): check the
    # timing relations ourselves, then let validate() catch the rest.
    if not conf.raftMinTimeout > 3 * conf.appendEntriesPeriod:
        raise ValueError("raftMinTimeout must be > 3 x appendEntriesPeriod")
    if not conf.raftMaxTimeout > conf.raftMinTimeout:
        raise ValueError("raftMaxTimeout must be > raftMinTimeout")
    if not conf.connectionTimeout >= conf.raftMaxTimeout:
        raise ValueError("connectionTimeout must be >= raftMaxTimeout")
    if not conf.leaderFallbackTimeout > conf.appendEntriesPeriod:
        raise ValueError("leaderFallbackTimeout must be > appendEntriesPeriod")
    try:
        conf.validate()
    except AssertionError:
        raise ValueError("SyncObjConf.validate() refused the options") from None
    return conf


def make_port_options(**kwargs: Any) -> dict[str, Any]:
    """``RAFT_PORT_DEFAULTS`` with ``kwargs`` over them.

    :raises ValueError: for an unknown key, or an ``authTimeout`` that is not a finite number of
        seconds above 0.
    """
    unknown = sorted(set(kwargs) - set(RAFT_PORT_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown Raft port option(s): {', '.join(unknown)}")
    options = dict(RAFT_PORT_DEFAULTS, **kwargs)
    timeout = options["authTimeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"authTimeout must be a number of seconds above 0, got {timeout!r}")
    return options
