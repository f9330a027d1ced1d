"""How the leader walks a follower's next index back to where their logs agree, and how a follower
answers a leader whose previous entry it does not hold: the corrections to pysyncobj that let a
deposed leader's log converge (issue 20; docs/design.md, I24).

pysyncobj's leader pipelines: it moves a follower's next index past each batch it sends (64 KiB a
message) and keeps sending until its log ends or 0.1 s passes, and it applies every "reset" answer
in the order they arrive. A deposed leader's log ends at some index L in entries of its old term.
The first message of a burst names L with the new term, and the follower answers "reset to L";
every later message names an index past L, which it lacks, and it answers "reset to L+1". The
leader applies both, so every round ends at L+1 again: the walk back never passes the stale tail,
the follower's commit index stays frozen (rejections do not carry it), and the leader resends its
whole tail each round. Only a log compaction on the leader (a snapshot) ended it.

Here, as etcd's raft does it (``Progress.MaybeDecrTo``, probe and replicate states) and with the
Raft thesis's conflict hint (§5.3):

- **Every answer** names its term (``term``): the leader drops an answer of another term (one
  held in a link across elections could otherwise set a match index for a log the follower no
  longer has: pysyncobj's answers carried no term).
- **The follower** names, in every answer, the ``prevLogIdx`` it answers (``prev``). Finding a
  different term at ``prevLogIdx``, above its commit index, it truncates its log from there (the
  entry is not in the leader's log, so it is not committed, and nothing after it is) and hints the
  first index of that term above its commit index, so the leader skips a whole stale term in one
  step. Asked about an entry it has compacted away (below its log), it answers success at its
  commit index: every committed entry is in the leader's log.
- **The leader** keeps a ``_Progress`` per follower. In *replicate* it pipelines as pysyncobj
  does, with at most ``INFLIGHT_BYTES_MAX`` sent and not acknowledged. A rejection of an index
  above the follower's match index puts it in *probe*: the next index goes to the follower's hint
  (never below match + 1), one message is in flight at a time, and an answer to anything but that
  message is stale and ignored. A success leaves probe and resumes the pipeline. A success never
  moves the next index back.

Every message keeps pysyncobj's fields and meaning; ``prev`` is an addition a stock pysyncobj
ignores, and an answer without it is handled as pysyncobj does.
"""
from __future__ import annotations

import collections
import logging

from pysyncobj.monotonic import monotonic  # the clock pysyncobj's own timers use

logger = logging.getLogger("raftsched.replication")

#: Bytes of entries the leader sends a follower in replicate before that follower acknowledges
#: any: a follower that stops answering costs at most this much a round, not the whole tail
#: (measured before: 10.9 MB in 2 s to a stuck follower). Far above what loopback or a LAN
#: needs in flight at the benchmark's ~3 MB/s of log (30 000 slots/s).
INFLIGHT_BYTES_MAX = 4 * 1024 * 1024
#: A follower in replicate with entries in flight and no acknowledgement for this long goes back
#: to probe (its answers were lost with a connection, or it restarted).
INFLIGHT_STALL_S = 2.0


class _Progress:
    """The leader's view of one follower beyond pysyncobj's next and match index."""

    __slots__ = ("probing", "probe_sent_at", "inflight", "inflight_bytes", "last_ack",
                 "rejections", "stale_answers")

    def __init__(self) -> None:
        self.probing = False          # replicate until the first rejection (pysyncobj's start)
        self.probe_sent_at: float | None = None
        self.inflight: collections.deque[tuple[int, int]] = collections.deque()  # (last idx, bytes)
        self.inflight_bytes = 0
        self.last_ack = monotonic()
        self.rejections = 0           # valid rejections: steps of the walk back
        self.stale_answers = 0        # answers of an earlier burst, ignored

    def sent(self, last_idx: int, nbytes: int) -> None:
        if not self.inflight:
            # Nothing was waiting: the stall clock starts now (an idle follower has answered
            # everything; it is not late for what it was never sent).
            self.last_ack = monotonic()
        self.inflight.append((last_idx, nbytes))
        self.inflight_bytes += nbytes

    def acked(self, idx: int) -> None:
        self.last_ack = monotonic()
        q = self.inflight
        while q and q[0][0] <= idx:
            self.inflight_bytes -= q.popleft()[1]

    def probe(self) -> None:
        self.probing = True
        self.probe_sent_at = None
        self.inflight.clear()
        self.inflight_bytes = 0

    def view(self) -> dict:
        return {"state": "probe" if self.probing else "replicate",
                "inflight_bytes": self.inflight_bytes,
                "last_ack_age_s": round(monotonic() - self.last_ack, 3)}


def follower_check(log, commit_index: int, prev: int, prev_term) -> tuple[str, int | None]:
    """What a follower does with an append_entries naming ``(prev, prev_term)``, before
    pysyncobj's handler sees it: ``("match", None)``, ``("missing", None)`` (its log ends before
    ``prev``), ``("compacted", None)`` (``prev`` is below its log), or ``("conflict", hint)``:
    the entry at ``prev`` has another term; ``hint`` is the first index of that term above the
    commit index (terms never decrease along a log, so a binary search finds it)."""
    first = log[0][1]
    n = len(log)
    if prev < first:
        return "compacted", None
    if prev > log[n - 1][1]:
        return "missing", None
    term = log[prev - first][2]
    if term == prev_term:
        return "match", None
    lo, hi = max(commit_index + 1, first), prev  # the first index in [lo, hi] whose term is `term`
    while lo < hi:
        mid = (lo + hi) // 2
        if log[mid - first][2] < term:
            lo = mid + 1
        else:
            hi = mid
    return "conflict", lo


def on_success(pr: _Progress, next_idx: int, match_idx: int, idx: int) -> tuple[int, int, bool]:
    """The leader's new (next index, match index, left probe) after a follower said its log
    matches the leader's up to ``idx``. An old success changes nothing; a success never moves
    the next index back."""
    resumed = False
    if idx > match_idx:
        match_idx = idx
        pr.acked(idx)
    if idx == match_idx and pr.probing:
        # The probe found where the logs agree (a follower already up to date answers success
        # at the match index: etcd's ``pr.Match == m.Index && StateProbe``).
        pr.probing, pr.probe_sent_at = False, None
        resumed = True
    return max(next_idx, idx + 1), match_idx, resumed


def on_rejection(pr: _Progress, next_idx: int, match_idx: int, prev: int,
                 hint: int, follower: str = "?") -> tuple[int, int] | None:
    """The leader's new (next index, match index) after a follower rejected the append_entries
    whose previous index was ``prev``, hinting ``hint``, with ``pr`` put in probe; None, and
    nothing changed but a count, when the answer is stale (an earlier message's, overtaken by
    what the leader already knows)."""
    if (prev != next_idx - 1) if pr.probing else (prev <= match_idx):
        # In probe: not the answer to the one probe in flight. In replicate: the follower
        # holds prev already (an old answer).
        pr.stale_answers += 1
        return None
    pr.rejections += 1
    pr.probe()
    if prev <= match_idx:
        # The one probe in flight, at the match index, was refused: the follower no longer holds
        # entries it acknowledged (a lost disk, a restore from an older copy). Raft assumes this
        # never happens; going below the match index is the only way it can catch up again, and
        # what is committed stays committed.
        logger.warning("replication.follower_lost_entries follower=%s match=%d rejected=%d hint=%d",
                       follower, match_idx, prev, hint)
        new_next = max(1, min(prev, hint))
        return new_next, min(match_idx, new_next - 1)
    return max(min(prev, hint), match_idx + 1), match_idx
