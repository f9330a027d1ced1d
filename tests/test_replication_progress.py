"""The next-index walk of raftsched/replication/_progress.py, in a model: one leader log, one
follower log that shares a prefix with it and then diverges (a deposed leader's tail of older
terms, or a follower that is simply behind), messages to the follower in order (TCP), and its
answers delivered late, out of order and more than once. The leader's decisions and the
follower's check are the real functions; the rest is Raft's receiver rule, written out.

Invariants at every step: the leader's match index is never past where the logs agree; the
follower never truncates a committed entry; next index stays in (match, leader's last + 1].
After the adversarial prefix, fair rounds (send, deliver everything in order) bring the follower
to the leader's log within a few rounds per distinct stale term.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from long_tests import examples

from raftsched.replication import _progress
from raftsched.replication._progress import _Progress

#: Entries per append_entries (pysyncobj bounds a message by bytes; here by count).
BATCH = 4


class Follower:
    def __init__(self, terms: list[int], first: int, commit: int):
        # entries (command, index, term) from index `first` on, as pysyncobj's journal holds them
        self.log = [(b"", first + k, t) for k, t in enumerate(terms)]
        self.commit = commit
        self.committed = [(e[1], e[2]) for e in self.log if e[1] <= commit]

    def last(self) -> int:
        return self.log[-1][1]

    def term_at(self, idx: int):
        first = self.log[0][1]
        return self.log[idx - first][2] if first <= idx <= self.last() else None

    def receive(self, prev: int, prev_term: int, entries: list[tuple[int, int]]) -> dict:
        found, hint = _progress.follower_check(self.log, self.commit, prev, prev_term)
        if found == "compacted":
            return {"prev": prev, "success": True, "next": self.commit + 1}
        if found == "conflict":
            assert prev > self.commit  # a leader's log holds every committed entry
            del self.log[prev - self.log[0][1]:]
            return {"prev": prev, "success": False, "next": hint}
        if found == "missing":
            return {"prev": prev, "success": False, "next": self.last() + 1}
        for idx, term in entries:  # Raft: skip held entries, cut at the first conflict
            have = self.term_at(idx)
            if have == term:
                continue
            if have is not None:
                assert idx > self.commit
                del self.log[idx - self.log[0][1]:]
            self.log.append((b"", idx, term))
        last_new = entries[-1][0] if entries else prev
        return {"prev": prev, "success": True, "next": last_new + 1}


class Leader:
    def __init__(self, terms: list[int]):
        self.terms = terms  # index i has term terms[i - 1]
        self.next = len(terms) + 1  # optimistic, as a new leader starts
        self.match = 0
        self.pr = _Progress()

    def last(self) -> int:
        return len(self.terms)

    def message(self, nxt: int) -> tuple[int, int, list]:
        entries = [(i, self.terms[i - 1]) for i in range(nxt, min(self.last(), nxt + BATCH - 1) + 1)]
        return nxt - 1, self.terms[nxt - 2] if nxt >= 2 else 0, entries

    def send_round(self, heartbeat_due: bool) -> list:
        """What one call of the sender puts on the wire (``_SyncObj._send_entries``)."""
        pr = self.pr
        if pr.probing:
            if pr.probe_sent_at is not None and not heartbeat_due:
                return []
            pr.probe_sent_at = 1.0
            return [self.message(self.next)]
        out = [self.message(self.next)]
        while out[-1][2]:
            self.next = out[-1][2][-1][0] + 1
            if self.next > self.last():
                break
            out.append(self.message(self.next))
        return out

    def answer(self, a: dict) -> None:
        if a["success"]:
            self.next, self.match, _ = _progress.on_success(self.pr, self.next, self.match,
                                                            a["next"] - 1)
            return
        decided = _progress.on_rejection(self.pr, self.next, self.match, a["prev"], a["next"])
        if decided is not None:
            self.next, self.match = decided


def _agree_up_to(leader: Leader, follower: Follower) -> int:
    k = follower.log[0][1] - 1  # what it compacted was committed: the leader's log holds it
    while k < leader.last() and follower.term_at(k + 1) == leader.terms[k]:
        k += 1
    return k


@st.composite
def divergent_logs(draw):
    common = draw(st.lists(st.integers(1, 3), min_size=1, max_size=12).map(sorted))
    base = common[-1]
    # the follower's tail: older terms than the leader's new ones, possibly several of them
    f_tail = sorted(draw(st.lists(st.integers(base, base + 3), max_size=30)))
    l_tail = sorted(draw(st.lists(st.integers(base + 4, base + 6), max_size=30)))
    # a leader that also holds part of the follower's stale term (it inherited some of it)
    shared = draw(st.integers(0, len(f_tail)))
    leader_terms = common + f_tail[:shared] + l_tail
    follower_terms = common + f_tail
    commit = draw(st.integers(1, len(common)))
    first = draw(st.integers(1, commit))  # the follower may have compacted up to its commit
    if not l_tail:
        leader_terms = leader_terms + [base + 4]  # a new leader's first entry (its no-op)
    return leader_terms, follower_terms[first - 1:], first, commit


@settings(max_examples=examples(150), deadline=None)
@given(logs=divergent_logs(), data=st.data())
def test_the_walk_converges_under_late_reordered_and_repeated_answers(logs, data):
    leader_terms, follower_terms, first, commit = logs
    leader, follower = Leader(leader_terms), Follower(follower_terms, first, commit)
    to_follower: list = []   # in order (TCP)
    answers: list = []       # delivered in any order, any number of times

    def check():
        assert _agree_up_to(leader, follower) >= leader.match
        assert [(i, t) for i, t in ((e[1], e[2]) for e in follower.log) if i <= commit] \
            == follower.committed
        assert leader.match < leader.next <= leader.last() + 1

    for _ in range(data.draw(st.integers(0, 40))):
        action = data.draw(st.sampled_from(["send", "heartbeat", "deliver", "answer", "repeat"]))
        if action in ("send", "heartbeat"):
            to_follower += leader.send_round(heartbeat_due=action == "heartbeat")
        elif action == "deliver" and to_follower:
            answers.append(follower.receive(*to_follower.pop(0)))
        elif action in ("answer", "repeat") and answers:
            k = data.draw(st.integers(0, len(answers) - 1))
            a = answers[k] if action == "repeat" else answers.pop(k)
            leader.answer(a)
        check()
    # Whatever is still in flight arrives late, in any order, after the fair rounds start.
    late = answers
    rounds = 0
    while not (follower.last() == leader.last() and _agree_up_to(leader, follower) == leader.last()
               and leader.match == leader.last()):
        rounds += 1
        assert rounds <= 8 + 2 * len(set(follower_terms) | set(leader_terms)), \
            f"no convergence: next {leader.next} match {leader.match} follower {follower.log}"
        for msg in leader.send_round(heartbeat_due=True) + to_follower:
            answers_now = follower.receive(*msg)
            leader.answer(answers_now)
            check()
        to_follower = []
        if late:
            leader.answer(late.pop(data.draw(st.integers(0, len(late) - 1))))
            check()


def test_a_burst_of_stale_answers_does_not_move_the_next_index_forward_again():
    """The fault run's case, step by step: a follower whose log ends in a stale tail at 10, a
    leader whose burst starts at 10 (it believes the follower has 9): the first answer hints
    where the stale term begins; the burst's later answers ("missing") are ignored."""
    leader = Leader([1] * 5 + [3] * 20)
    follower = Follower([1] * 5 + [2] * 5, first=1, commit=5)
    leader.next = 11
    burst = leader.send_round(heartbeat_due=True)
    assert len(burst) > 2
    answers = [follower.receive(*m) for m in burst]
    assert answers[0] == {"prev": 10, "success": False, "next": 6}  # the term-2 run starts at 6
    assert all(a["next"] == 10 for a in answers[1:])  # truncated from 10: "missing" from 10 on
    for a in answers:
        leader.answer(a)
    assert (leader.next, leader.pr.probing, leader.pr.stale_answers) == (6, True, len(answers) - 1)
    leader.answer(follower.receive(*leader.send_round(heartbeat_due=True)[0]))
    assert not leader.pr.probing and leader.match >= 5
