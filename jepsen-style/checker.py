"""Checkers: pure functions from a run's data to a verdict per property, Jepsen-style.

Each checker returns ``{"valid": "valid"|"invalid"|"unknown", "counterexamples": [...],
"stats": {...}, "note": str}``; the first counterexample is the one verdict.txt shows. Verdicts
combine as Jepsen's do: invalid > unknown > valid. A property that the run did not exercise is
"unknown", never "valid".

The input (``data``) is what run.py collected; tests/test_jepsen_checkers.py builds small ones by
hand. Keys (all optional except where a checker needs them):

- ``schedule``: generator output (``ops``, ``plan``: {"jobs": {name: {"fail_pct", "work_ms"}}}, ...)
- ``history``: client and nemesis operations (client.History records)
- ``sink``: the fenced sink's log, in arrival order
- ``reads``: {"final"|"restart": {node: read}}; ``periodic``: [read]; a read has ``t_start_ms``,
  ``jobs`` (name, spec, paused, cursor, ...) and ``runs`` (compact run records, times in ms)
- ``hashes``: {phase: [{"node", "applied", "hash"}]}; ``monitor``: every node's ``/v1/cluster``
  sampled together every MONITOR_PERIOD_S (run.py), one record per node and round, all of a round
  with the same ``t_ms``: ``up``, ``alive``, ``paused``, ``role``, ``leader``, ``term``, ``commit``
  (and the product's own ``stalled_s`` and ``conditions`` when it reports them)
- ``faults``: the nemesis log; ``times``: t0_ms, heal_ms, ...; ``settle``: what stayed pending
"""
from __future__ import annotations

import datetime as dt
import itertools
import json
import re

import failure_plan

VALID, UNKNOWN, INVALID = "valid", "unknown", "invalid"
_RANK = {VALID: 0, UNKNOWN: 1, INVALID: 2}

#: Slots due this long before a final read must be handled by then (the trigger ticks every
#: 50 ms and a fire commits in milliseconds once the cluster is healthy; the rest is slack).
DUE_SLACK_MS = 3000
#: After the last fault is healed, every unpaused job fires again within its interval plus this.
RESUME_BOUND_MS = 15000
#: Fewer client operations or sink writes than this, or no leader change: "unknown".
MIN_CLIENT_OK = 10
MIN_SINK_WRITES = 30
#: Counterexamples kept per checker.
EXAMPLES_MAX = 20

try:  # the product's bounds the checkers read (an older product states none: its values then)
    from raftsched.core import limits as _limits
    #: a job's ``history`` when its spec gives none
    HISTORY_DEFAULT = _limits.history_per_job_default
    #: finished backfills (and bulk operations) the state keeps; beyond it the oldest are forgotten
    BACKFILLS_KEPT_MAX = _limits.backfills_kept_max
    #: how long before its slot the trigger may fire it: fire_ahead_ms, and a later slot of the
    #: same entry fire_ahead_span_ms more (a storm, thousands of slots in one second, which this
    #: workload never makes, is taken up earlier)
    FIRE_AHEAD_MAX_MS = _limits.fire_ahead_ms + _limits.fire_ahead_span_ms
except (ImportError, AttributeError):  # pragma: no cover
    HISTORY_DEFAULT, BACKFILLS_KEPT_MAX, FIRE_AHEAD_MAX_MS = 100, 100, 2000
#: The states in which a job's history trim drops its oldest entries beyond its ``history``
#: (core/fire.py TRIMMABLE: finished, but not dead; queued and running ones stay).
TRIMMABLE = frozenset({"succeeded", "failed", "skipped", "coalesced"})


def combine(*verdicts: str) -> str:
    return max(verdicts, key=lambda v: _RANK[v]) if verdicts else VALID


def _result(valid: str, examples: list, stats: dict | None = None, note: str = "") -> dict:
    return {"valid": valid, "counterexamples": examples[:EXAMPLES_MAX], "counterexample_count": len(examples),
            "stats": stats or {}, "note": note}


# ---------------------------------------------------------------------------------------------
# Shared views of the data
# ---------------------------------------------------------------------------------------------

def _all_reads(data: dict, phases=("final", "restart")) -> list[dict]:
    out = []
    for ph in phases:
        for _, r in sorted((data.get("reads") or {}).get(ph, {}).items()):
            if r.get("runs") is not None:
                out.append(r)
    return out


def client_ops(data: dict) -> list[dict]:
    """Completed client operations: each invoke paired with its completion (type ok/fail/info);
    an invoke without a completion counts as info."""
    pending: dict[str, dict] = {}
    done = []
    for rec in data.get("history", []):
        if not str(rec.get("process", "")).startswith("client"):
            continue
        if rec["type"] == "invoke":
            pending[rec["key"]] = rec
        else:
            inv = pending.pop(rec["key"], None)
            done.append(dict(rec, invoke_t_ms=inv["t_ms"] if inv else rec["t_ms"], invoke_index=inv["index"] if inv else rec["index"]))
    for inv in pending.values():
        done.append(dict(inv, type="info", error="no completion recorded", invoke_t_ms=inv["t_ms"], invoke_index=inv["index"]))
    done.sort(key=lambda o: o["invoke_index"])
    return done


def spec_versions(data: dict) -> dict[str, list[dict]]:
    """Every spec a client may have given each job (ok and info puts; a failed put did not
    happen)."""
    out: dict[str, list[dict]] = {}
    for op in client_ops(data):
        if op["f"] in ("create", "update") and op["type"] in ("ok", "info"):
            out.setdefault(op["job"], []).append(op["spec"])
    return out


def paused_ever(data: dict) -> set[str]:
    return {op["job"] for op in client_ops(data) if op["f"] == "pause" and op["type"] in ("ok", "info")}


def grid_ms(schedule: dict) -> tuple[int, int | None] | None:
    """(every_ms, phase_ms or None when it comes from the job's anchor) for schedules whose slots
    form a uniform grid; None otherwise (and for a pipeline's triggered job, which has none)."""
    if schedule is None:
        return None
    if "every_s" in schedule:
        return schedule["every_s"] * 1000, None
    m = re.fullmatch(r"\*/(\d+) \* \* \* \* \*", schedule.get("cron", ""))
    if m and 60 % int(m.group(1)) == 0:
        return int(m.group(1)) * 1000, 0
    return None


def _allowed_records(specs: list[dict], paused: bool) -> set[tuple[str, str]]:
    allowed = set()
    for s in specs:
        p = s.get("misfire", {}).get("policy")
        allowed.add({"skip": ("skipped", "misfire"), "fire_once": ("coalesced", "misfire"),
                     "fire_all": ("skipped", "catchup_limit")}.get(p, ("?", "?")))
        ov = s.get("overlap") or {"policy": "allow"}
        if ov.get("policy") == "forbid" or (ov.get("policy") == "allow" and "max_concurrent" in ov):
            allowed.add(("skipped", "overlap"))
        elif ov.get("policy") == "queue_one":
            allowed.add(("coalesced", "overlap"))
    if paused:
        allowed.add(("skipped", "paused"))
    return allowed


def _spans(runs: list[dict]) -> list[tuple[int, int, dict]]:
    """The slots each scheduled run or record covers. Manual runs and a backfill's runs are not
    the schedule's (a backfill may run a slot again: check_backfills judges those)."""
    out = []
    for r in runs:
        if r.get("kind") in ("manual", "backfill"):
            continue
        lo = r["slot_ms"]
        hi = r.get("slot_to") if r.get("slot_to") is not None else lo
        out.append((lo, hi, r))
    out.sort(key=lambda s: (s[0], s[1]))
    return out


def _ceil_s(ms: int) -> int:
    return ms - ms % 1000 + (1000 if ms % 1000 else 0)


def _clock_fault_during(data: dict, t_lo: int, t_hi: int) -> bool:
    for f in data.get("faults", []):
        if f.get("kind") == "clock" and f.get("start_ms", 0) <= t_hi and f.get("end_ms", 1 << 62) >= t_lo:
            return True
    return False


def _sink_end_ok(data: dict) -> set[tuple[str, int]]:
    return {(w["resource"], w["token"]) for w in data.get("sink", [])
            if w.get("accepted") and w.get("phase") == "end" and w.get("ok")}


def _short(x, n: int = 400) -> str:
    s = x if isinstance(x, str) else json.dumps(x, sort_keys=True, default=str)
    return s if len(s) <= n else s[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# 1. No lost slot
# ---------------------------------------------------------------------------------------------

def _first_slot_after(schedule: dict, t_ms: int) -> int | None:
    """The first slot of a job created at ``t_ms`` (the proposer's clock), for the schedules
    grid_ms knows: an interval's slots start one interval after the creation time rounded up to
    a whole second (core/policy.py initial_position); a seconds-step cron's (``*/N``, N dividing
    60: the epoch's N-second grid) at the first point of its grid strictly after it. None for a
    schedule with ``start_at`` or ``jitter_ms`` (the workload gives none) or another one."""
    g = grid_ms(schedule)
    if g is None or schedule.get("start_at") is not None or schedule.get("jitter_ms"):
        return None
    every, phase = g
    if phase is None:
        return _ceil_s(t_ms) + every
    return (t_ms - phase) // every * every + phase + every


def _history_bound(specs: list[dict]) -> int:
    """The smallest ``history`` (entries a job keeps) of these specs."""
    return min(s.get("history", HISTORY_DEFAULT) for s in specs)


def _slot_ordered(spec: dict) -> bool:
    """Whether a job's scheduled entries and records join its history in slot order: those of a
    job with a schedule of its own, not gated by parents (a pipeline's child makes its runs and
    records as its parents' runs end, in any order)."""
    return spec.get("schedule") is not None and not spec.get("after")


def _trim_cutoff(entries: list[dict], slot_ordered: bool = True) -> float:
    """A job's history keeps at most ``history`` entries: trim drops the oldest ones in a
    TRIMMABLE state beyond it (core/fire.py trim), wherever they are behind queued, running or
    dead ones, so a trim leaves a gap only where every older entry still there was not
    trimmable when the gap's entries went. Given the job's entries in a read, this is the slot
    from which a missing entry cannot have been trimmed: a missing range of slots from ``g``
    may be a trim's only while ``g`` is below it. An entry still there rules out the missing
    ones after it when it was trimmable before they were made: a record of an earlier slot
    (always trimmable; ``slot_ordered``: the job's scheduled entries join its history in slot
    order, _slot_ordered), or any entry
    recorded, or run that finished in a TRIMMABLE state, more than FIRE_AHEAD_MAX_MS (the
    earliest a run or record is made before its slot) plus a second of slack before the
    range's first slot. The times are the state's (fired_at, finished_at), which never run
    backwards in log order (I6); a run left TRIMMABLE only by a requeue (dead), which resets
    its finished_at."""
    margin = FIRE_AHEAD_MAX_MS + 1000
    cut = float("inf")
    for y in entries:
        if y.get("kind") == "recorded":
            b = y["slot_ms"] + 1 if slot_ordered else float("inf")
            if isinstance(y.get("fired_at"), int):
                b = min(b, y["fired_at"] + margin + 1)
        elif y.get("state") in TRIMMABLE and isinstance(y.get("finished_at"), int):
            b = y["finished_at"] + margin + 1
        else:
            continue
        cut = min(cut, b)
    return cut


def check_lost_slots(data: dict) -> dict:
    """Every slot of every job present in a final read, from its first slot up to the read time
    minus DUE_SLACK_MS (or up to its cursor while paused), is a run or inside a record whose
    state/reason one of the job's misfire policies (or a pause) allows; records count their slots
    exactly; and every run that succeeded reached the sink (an accepted "end" write, ok, with its
    final token). The first slot is where the job's creation puts it: no earlier than the
    create's invocation allows and no later than its acknowledgement does, or, for a create
    whose answer was lost (info) or made during a clock fault, no later than the read's creation
    time (the state's time when the put applied) allows and, without a clock fault, no earlier
    than the first put's invocation does; a job with no entry at all is checked from there too. A job
    whose history is at its bound (``history`` entries or more) may have had its oldest
    finished entries trimmed: missing slots that a trim may have dropped (_trim_cutoff) are
    counted, not reported."""
    examples, checked_slots, jobs_checked, trimmed = [], 0, 0, 0
    versions = spec_versions(data)
    paused = paused_ever(data)
    creates = {op["job"]: op for op in client_ops(data) if op["f"] == "create" and op["type"] == "ok"}
    # The earliest invocation of a put that may have created each job (an update creates a job
    # its lost create did not).
    first_put: dict[str, int] = {}
    for op in client_ops(data):
        if op["f"] in ("create", "update") and op["type"] in ("ok", "info"):
            first_put[op["job"]] = min(first_put.get(op["job"], op["invoke_t_ms"]), op["invoke_t_ms"])
    sink_ok = _sink_end_ok(data)
    reads = _all_reads(data)
    seen = set()

    def ex(key, text):
        if key not in seen:
            seen.add(key)
            examples.append(text)

    for read in reads:
        node = read["node"]
        by_job: dict[str, list] = {}
        for r in read["runs"]:
            by_job.setdefault(r["job"], []).append(r)
        for job in read.get("jobs", []):
            name = job["name"]
            sched = job["spec"].get("schedule")
            g = grid_ms(sched)
            if g is None:
                continue
            every, phase = g
            mine = by_job.get(name, [])
            spans = _spans(mine)
            specs = versions.get(name) or [job["spec"]]
            allowed = _allowed_records(specs, name in paused)
            covered = set()
            jobs_checked += 1
            for lo, hi, r in spans:
                if phase is None:
                    phase = lo % every
                if (lo - phase) % every or (hi - phase) % every:
                    ex(("offgrid", r["id"]), f"node-{node + 1} {read['phase']}: {r['id']} covers {lo}..{hi}, off the job's {every} ms grid (phase {phase})")
                    continue
                n = (hi - lo) // every + 1
                if r["state"] in ("skipped", "coalesced") and r.get("kind") == "recorded":
                    if (r["state"], r.get("reason")) not in allowed:
                        ex(("policy", r["id"]), f"node-{node + 1} {read['phase']}: job {name} recorded {r['state']}/{r.get('reason')} for {n} slot(s) from {lo}, which none of its misfire policies {sorted({s['misfire']['policy'] for s in specs})} allows")
                    if r.get("count") is not None and r["count"] != n and r.get("slot_to") is not None:
                        ex(("count", r["id"]), f"node-{node + 1} {read['phase']}: record {r['id']} says {r['count']} slots in {lo}..{hi}, the grid has {n}")
                for s in range(lo, hi + 1, every):
                    covered.add(s)
            # The first slot: between the first slots of a job created at the create's invocation
            # and at its acknowledgement. Else (an info create, or a clock fault around it) no
            # later than the first slot of a job created at the state's creation time: that is
            # the state's time when the put applied, and the put's own time (the proposer's
            # clock, from which its slots start) is no later, as state time never runs backwards
            # (I6); and, without a clock fault, no earlier than the first put's invocation.
            op = creates.get(name)
            created = job.get("created")
            if op is not None and not _clock_fault_during(data, op["invoke_t_ms"] - 10_000, op["t_ms"] + 10_000):
                earliest_first, latest_first = _first_slot_after(sched, op["invoke_t_ms"]), _first_slot_after(sched, op["t_ms"])
                how = f"created (ok) at {op['t_ms']}"
            elif isinstance(created, int) and not isinstance(created, bool):
                latest_first = _first_slot_after(sched, created)
                lo_t = first_put.get(name)
                earliest_first = _first_slot_after(sched, lo_t) if lo_t is not None and lo_t <= created \
                    and not _clock_fault_during(data, lo_t - 10_000, created + 10_000) else None
                how = f"created by {created} (the state's creation time)"
            else:
                earliest_first = latest_first = None
            start = None  # the slot from which every slot must be handled
            if latest_first is not None:
                if phase is None and earliest_first == latest_first:
                    phase = latest_first % every
                # The grid's last point at or before latest_first: the first slot, or after it.
                start = latest_first if phase is None else latest_first - (latest_first - phase) % every
                if earliest_first is not None and start < earliest_first:
                    start = None  # no point of the job's grid is a possible first slot: off-grid's
            if covered:
                first, last = min(covered), max(covered)
                if earliest_first is not None and first < earliest_first:
                    ex(("early", name), f"node-{node + 1} {read['phase']}: job {name} has slot {first}, before it could be due ({how}: its first slot is at {earliest_first} or later)")
                if start is None or start > first:
                    start = first
            elif start is None:
                continue
            else:
                first, last = None, start - every
            # The end: due slots handled by the read (an unpaused job), else up to the cursor.
            if job.get("paused"):
                end = job.get("cursor")
                if end is None:
                    end = last
            else:
                end = read["t_start_ms"] - DUE_SLACK_MS
            at_bound = len(mine) >= _history_bound(specs + [job["spec"]])
            cut = _trim_cutoff(mine, all(_slot_ordered(s) for s in specs + [job["spec"]])) if at_bound else None
            gap_from = None
            for s in range(start, max(last, end) + 1, every):
                if s > end and s > last:
                    break
                checked_slots += 1
                if s in covered:
                    gap_from = None
                    continue
                if gap_from is None:
                    gap_from = s
                if cut is not None and gap_from < cut:
                    trimmed += 1  # (counted per read)
                elif first is None:
                    ex(("lost", name, s), f"node-{node + 1} {read['phase']}: job {name} slot {s} lost: {how}, the job has no run nor record at all "
                                          f"(read at {read['t_start_ms']}, paused={job.get('paused')}, cursor {job.get('cursor')})")
                elif s < first:
                    ex(("lost", name, s), f"node-{node + 1} {read['phase']}: job {name} slot {s} lost: {how}, its first entry is slot {first}")
                else:
                    ex(("lost", name, s), f"node-{node + 1} {read['phase']}: job {name} slot {s} is neither a run nor recorded "
                                          f"(entries {first}..{last}, read at {read['t_start_ms']}, paused={job.get('paused')})")
            for r in mine:
                if r["state"] == "succeeded" and (r["id"], r.get("fencing_token")) not in sink_ok:
                    ex(("sink", r["id"]), f"node-{node + 1} {read['phase']}: run {r['id']} succeeded with token {r.get('fencing_token')} but the sink has no accepted ok end write with that token")
    if not reads:
        return _result(UNKNOWN, [], note="no final read succeeded")
    stats = {"jobs_checked": jobs_checked, "slots_checked": checked_slots, "slots_trimmed": trimmed}
    # A run begun before its slot is no-early-start's (below); lateness is the fire lag.
    if examples:
        return _result(INVALID, examples, stats)
    if checked_slots == 0:
        return _result(UNKNOWN, [], stats, "no slot was due")
    return _result(VALID, [], stats)


# ---------------------------------------------------------------------------------------------
# 1b. No early start
# ---------------------------------------------------------------------------------------------

try:  # the product's bound on a member's clock, which is also its promise on early starts
    from raftsched.core.limits import clock_skew_ms_max as CLOCK_SKEW_MS_MAX
except ImportError:  # pragma: no cover - an older product, which states none: a second
    CLOCK_SKEW_MS_MAX = 1000


def check_early_starts(data: dict) -> dict:
    """No attempt begins more than the product's clock bound (core/limits.py clock_skew_ms_max)
    before its run's slot, by the sink's clock, whatever a node's clock says (docs/design.md
    I27: a leader whose clock lies fires nothing, and a worker waits for a slot by the cluster's
    clock). An attempt's "begin" write reaches the sink after the attempt began, so an early
    start shows here no earlier than it was: the check errs towards valid by the write's
    latency (milliseconds). Exercised by the ``clock`` nemesis; judged on every run."""
    bound = CLOCK_SKEW_MS_MAX
    begins = [w for w in data.get("sink", []) if w.get("phase") == "begin" and isinstance(w.get("slot"), int)
              and not isinstance(w.get("slot"), bool) and isinstance(w.get("t_ms"), int)]
    early = sorted(((w["slot"] - w["t_ms"], w) for w in begins if w["t_ms"] < w["slot"]),
                   key=lambda dw: (-dw[0], dw[1].get("seq", 0)))
    examples = []
    for d, w in early:
        if d <= bound:
            break
        clocks = [f"{f['kind']} {f.get('offset_ms', (f.get('fault') or {}).get('offset_ms'))} ms on node-"
                  f"{','.join(str(n + 1) for n in f.get('nodes') or [])}" for f in data.get("faults", [])
                  if f.get("kind") == "clock" and f.get("start_ms", 0) - 10_000 <= w["t_ms"] <= (f.get("end_ms") or 1 << 62) + 10_000]
        examples.append(f"run {w.get('run')} attempt {w.get('attempt')} (job {w.get('job')}, worker {w.get('worker')}) "
                        f"began {d} ms before its slot {w['slot']} (sink time {w['t_ms']}), more than the bound "
                        f"{bound} ms" + (f"; clock fault(s) then: {'; '.join(clocks)}" if clocks else ""))
    stats = {"bound_ms": bound, "begins_checked": len(begins),
             "runs_begun_before_their_slot": sum(1 for _, w in early if w.get("attempt") == 1),
             "earliest_begin_before_slot_ms": early[0][0] if early else 0,
             "clock_faults": sum(1 for f in data.get("faults", []) if f.get("kind") == "clock")}
    if examples:
        return _result(INVALID, examples, stats)
    if not begins:
        return _result(UNKNOWN, [], stats, "no attempt began")
    return _result(VALID, [], stats, "" if stats["clock_faults"] else "no clock fault ran: not exercised by one")


# ---------------------------------------------------------------------------------------------
# 2. No duplicate
# ---------------------------------------------------------------------------------------------

#: The reasons a pipeline child's record has that a requeue (or a propagating run) of a parent
#: takes back (docs/pipelines.md, "Re-drive"): the slot is decided again, once.
UPSTREAM_REASONS = ("upstream_failed", "upstream_missed", "upstream_timeout", "dependency_missing")


def _rearmed(a: dict | None, b: dict) -> bool:
    """Whether two entries of one run id are a pipeline child's record taken back and the slot
    decided again (the record first: fired earlier), not a slot fired twice."""
    if a is None or a["slot_ms"] != b["slot_ms"]:
        return False
    first, then = (a, b) if (a.get("fired_at") or 0) <= (b.get("fired_at") or 0) else (b, a)
    return first.get("kind") == "recorded" and first.get("reason") in UPSTREAM_REASONS \
        and (then.get("fired_at") or 0) >= (first.get("fired_at") or 0)


def check_duplicates(data: dict) -> dict:
    """No slot is two runs (or a run and a record) in any node's state at any read; a run id keeps
    its identity across reads (the same slot and fire time: it was created once), but for a
    pipeline child's upstream record taken back by a re-arm and its slot decided again; an attempt of a
    run is granted once (one token per attempt, in the states and at the sink); a token belongs to
    one attempt of one run."""
    examples = []
    reads = _all_reads(data) + list(data.get("periodic") or [])
    identity: dict[str, tuple] = {}
    seen_as: dict[tuple, dict] = {}  # (run id, identity) -> the entry seen so
    attempt_token: dict[tuple[str, int], int] = {}
    token_owner: dict[int, tuple[str, int]] = {}

    def note_grant(where: str, rid: str, attempt, token) -> None:
        if attempt is None or token is None:
            return
        k = (rid, attempt)
        if attempt_token.setdefault(k, token) != token:
            examples.append(f"{where}: attempt {attempt} of {rid} has token {token} and also {attempt_token[k]}: granted twice")
        if token_owner.setdefault(token, k) != k:
            examples.append(f"{where}: token {token} belongs to {k} and to {token_owner[token]}")

    for read in reads:
        where = f"node-{read['node'] + 1} {read.get('phase')} read at {read.get('t_start_ms')}"
        ids = [r["id"] for r in read["runs"]]
        if len(ids) != len(set(ids)):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            examples.append(f"{where}: run id(s) listed twice: {dup[:5]}")
        by_job: dict[str, list] = {}
        for r in read["runs"]:
            by_job.setdefault(r["job"], []).append(r)
            ident = (r["slot_ms"], r.get("kind"), r.get("fired_at"))
            old = identity.setdefault(r["id"], ident)
            if old != ident:
                was = seen_as.get((r["id"], old))
                if _rearmed(was, r):
                    if (r.get("fired_at") or 0) > (old[2] or 0):
                        identity[r["id"]] = ident  # the later of the two
                else:
                    examples.append(f"{where}: run {r['id']} was (slot, kind, fired_at) {old} and is now {ident}: fired twice")
            seen_as.setdefault((r["id"], ident), r)
            for a in r.get("attempts") or []:
                note_grant(where, r["id"], a.get("attempt"), a.get("token"))
            if r.get("state") == "running":
                note_grant(where, r["id"], r.get("attempt"), r.get("fencing_token"))
        for job, runs in by_job.items():
            spans = _spans(runs)
            for (_lo1, hi1, r1), (lo2, _hi2, r2) in zip(spans, spans[1:]):
                if lo2 <= hi1:
                    examples.append(f"{where}: job {job} slot {lo2} is both {r1['id']} ({r1['state']}) and {r2['id']} ({r2['state']})")
    for w in data.get("sink", []):
        if w.get("accepted") or w.get("token") is not None:
            note_grant(f"sink seq {w.get('seq')}", w.get("run") or w["resource"], w.get("attempt"), w.get("token"))
    stats = {"reads": len(reads), "runs_seen": len(identity), "grants_seen": len(token_owner)}
    if not reads:
        return _result(UNKNOWN, [], stats, "no read")
    return _result(INVALID if examples else VALID, examples, stats)


# ---------------------------------------------------------------------------------------------
# 3. Fencing
# ---------------------------------------------------------------------------------------------

def check_fencing(data: dict) -> dict:
    """At the sink, in arrival order, no accepted write carries a token lower than one already
    accepted for its resource. Tokens granted (in the states and at the sink) are unique, grow with
    the attempt within a run, and grow with grant time. If a pause ran and the sink refused
    nothing, the property was not exercised: unknown."""
    examples = []
    highest: dict[str, int] = {}
    accepted = refused = 0
    for w in sorted(data.get("sink", []), key=lambda w: w.get("seq", 0)):
        res, tok = w["resource"], w["token"]
        if w.get("accepted"):
            accepted += 1
            if res in highest and tok < highest[res]:
                examples.append(f"sink seq {w.get('seq')}: accepted token {tok} for {res} after token {highest[res]} was accepted")
            highest[res] = max(highest.get(res, tok), tok)
        else:
            refused += 1
            if res not in highest or tok >= highest[res]:
                examples.append(f"sink seq {w.get('seq')}: refused token {tok} for {res} though the highest accepted was {highest.get(res)}")
    grants: dict[int, dict] = {}
    for read in _all_reads(data) + list(data.get("periodic") or []):
        for r in read["runs"]:
            prev = None
            for a in r.get("attempts") or []:
                if a.get("token") is None:
                    continue
                grants.setdefault(a["token"], {"run": r["id"], "attempt": a["attempt"], "started_at": a.get("started_at")})
                if prev is not None and not (a["attempt"] > prev["attempt"] and a["token"] > prev["token"]):
                    examples.append(f"run {r['id']}: attempt {a['attempt']} has token {a['token']} after attempt {prev['attempt']} had {prev['token']}")
                prev = a
            if r.get("state") == "running" and r.get("fencing_token") is not None:
                grants.setdefault(r["fencing_token"], {"run": r["id"], "attempt": r.get("attempt"), "started_at": r.get("started_at")})
    ordered = sorted((t, g) for t, g in grants.items() if g.get("started_at") is not None)
    for (t1, g1), (t2, g2) in zip(ordered, ordered[1:]):
        if g2["started_at"] < g1["started_at"]:
            examples.append(f"token {t2} ({g2['run']} attempt {g2['attempt']}) was granted at {g2['started_at']}, before token {t1} ({g1['run']}) at {g1['started_at']}: tokens do not grow with grant time")
    pauses = [f for f in data.get("faults", []) if f.get("kind") == "pause"]
    remote = tuple(f"{w}/" for w in data.get("remote_workers") or [])
    stats = {"sink_accepted": accepted, "sink_refused": refused, "grants": len(grants), "pauses": len(pauses),
             # writes of attempts that ran on remote workers (raftsched worker processes)
             "sink_accepted_remote": sum(1 for w in data.get("sink", []) if w.get("accepted")
                                         and remote and str(w.get("worker") or "").startswith(remote)),
             "sink_refused_remote": sum(1 for w in data.get("sink", []) if not w.get("accepted")
                                        and remote and str(w.get("worker") or "").startswith(remote))}
    if examples:
        return _result(INVALID, examples, stats)
    if accepted == 0:
        return _result(UNKNOWN, [], stats, "the sink accepted nothing")
    if pauses and refused == 0:
        return _result(UNKNOWN, [], stats, "not exercised: pauses ran but the sink refused no stale write")
    return _result(VALID, [], stats)


# ---------------------------------------------------------------------------------------------
# 4. Durability (Jepsen's set-full, per job, with a small search over unknown outcomes)
# ---------------------------------------------------------------------------------------------

def _spec_matches(sent: dict, stored: dict) -> bool:
    """Whether the stored (normalised) spec holds every field the client sent."""
    for k, v in sent.items():
        if k not in stored:
            return False
        if isinstance(v, dict):
            if not isinstance(stored[k], dict) or not _spec_matches(v, stored[k]):
                return False
        elif stored[k] != v:
            return False
    return True


def _apply_op(state: tuple, op: dict) -> tuple | None:
    """The job's model (exists, spec index, paused) after ``op``; None if ``op`` cannot have done
    what its ok answer says."""
    exists, spec, paused = state
    f = op["f"]
    if f not in JOB_OPS:
        return state  # a backfill or a bulk requeue changes no job
    if f in ("create", "update"):
        if op["type"] == "ok" and isinstance(op.get("value"), dict) and "created" in op["value"] \
                and op["value"]["created"] != (not exists):
            return None
        return (True, op["invoke_index"], paused if exists else False)
    if not exists:
        return None if op["type"] == "ok" else state
    if f == "pause":
        return (True, spec, True)
    if f == "resume":
        return (True, spec, False)
    if f == "delete":
        return (False, None, False)
    return state


#: The client operations that change a job (durability's model).
JOB_OPS = ("create", "update", "pause", "resume", "delete")


def job_models(ops: list[dict], budget: int = 200_000) -> tuple[set | None, dict | None]:
    """Every final model of one job its operations allow: ok operations happened, in order (one
    client owns a job, so they never overlap); fail ones did not (a 404 says the job did not
    exist); each info one happened at any point after its invocation, or never.

    :returns: (set of (exists, spec invoke index, paused), None), or (None, the first op no
        placement explains), or (None, None) when the search ran out of ``budget``.
    """
    configs = {((False, None, False), frozenset())}
    spent = 0

    def closure(cfgs):
        nonlocal spent
        out, todo = set(cfgs), list(cfgs)
        while todo:
            state, pend = todo.pop()
            for idx in pend:
                spent += 1
                op = by_index[idx]
                ns = _apply_op(state, op)
                for nxt in ((ns if ns is not None else state, pend - {idx}),):
                    if nxt not in out:
                        out.add(nxt)
                        todo.append(nxt)
        return out

    by_index = {op["invoke_index"]: op for op in ops}
    for op in ops:
        if op["type"] == "info":
            configs = {(s, p | {op["invoke_index"]}) for s, p in configs}
            continue
        configs = closure(configs)
        if spent > budget:
            return None, None
        if op["type"] == "ok":
            new = set()
            for s, p in configs:
                ns = _apply_op(s, op)
                if ns is not None:
                    new.add((ns, p))
            if not new:
                return None, op
            configs = new
        elif op.get("status") == 404 and op["f"] in JOB_OPS + ("backfill",):
            configs = {(s, p) for s, p in configs if not s[0]}
            if not configs:
                return None, op
    configs = closure(configs)
    if spent > budget:
        return None, None
    return {s for s, _ in configs}, None


def _trimmed_between(before: dict, after: dict, gone: list[dict], versions: dict[str, list[dict]]) -> set[str]:
    """The ids of ``gone`` (entries of read ``before`` missing from the later read ``after`` of the
    same node) that the job's history trim may have dropped in between (core/fire.py trim: the
    oldest TRIMMABLE entries beyond ``history``): the job holds at least ``history`` entries
    after, and none of its entries read in both was TRIMMABLE before while it precedes the gone
    one in the history (appended earlier: an earlier fired_at, the state's time, which never
    runs backwards, or an earlier slot among the scheduled entries and records of a job that
    makes them in slot order, _slot_ordered), as trim would have dropped that one first."""
    if not gone:
        return set()
    specs = {j["name"]: j["spec"] for j in after.get("jobs", [])}
    count: dict[str, int] = {}
    for r in after["runs"]:
        count[r["job"]] = count.get(r["job"], 0) + 1
    after_ids = {r["id"] for r in after["runs"]}
    inf = float("inf")
    # Per job: the earliest fired_at, and the earliest slot of a scheduled entry or record, among
    # its entries that were TRIMMABLE before and are still there after.
    first_fired: dict[str, float] = {}
    first_slot: dict[str, float] = {}
    for y in before["runs"]:
        if y["id"] in after_ids and y.get("state") in TRIMMABLE:
            if isinstance(y.get("fired_at"), int):
                first_fired[y["job"]] = min(first_fired.get(y["job"], inf), y["fired_at"])
            if y.get("kind") in ("scheduled", "recorded") and y["job"] in specs and _slot_ordered(specs[y["job"]]):
                first_slot[y["job"]] = min(first_slot.get(y["job"], inf), y["slot_ms"])
    out = set()
    for r in gone:
        name = r["job"]
        if name not in specs or count.get(name, 0) < _history_bound((versions.get(name) or []) + [specs[name]]):
            continue
        if first_fired.get(name, inf) < (r["fired_at"] if isinstance(r.get("fired_at"), int) else inf):
            continue
        if r.get("kind") in ("scheduled", "recorded") and first_slot.get(name, inf) < r["slot_ms"]:
            continue
        out.add(r["id"])
    return out


def check_durability(data: dict) -> dict:
    """Every acknowledged client write is in the final state, before and after the full restart,
    and nothing is there that no client asked for (per job: the final job, absent or present with
    its spec and paused flag, is one that some placement of the info operations explains). Info
    writes that appear are counted as recovered. Across the restart, the jobs and every run read
    before it are still there, but for runs its history trim may have dropped in between
    (_trimmed_between)."""
    examples = []
    ops = client_ops(data)
    per_job: dict[str, list] = {}
    for op in ops:
        per_job.setdefault(op["job"], []).append(op)
    by_index = {op["invoke_index"]: op for op in ops}
    models: dict[str, set] = {}
    unknown_jobs = []
    for job, jops in per_job.items():
        m, bad = job_models(jops)
        if m is None and bad is not None:
            examples.append(f"job {job}: client op #{bad['invoke_index']} {bad['f']} answered {bad['type']} {bad.get('status')} "
                            f"{_short(bad.get('value'), 120)}, which no order of the job's earlier operations explains")
        elif m is None:
            unknown_jobs.append(job)
        else:
            models[job] = m
    reads = _all_reads(data)
    recovered = set()
    for read in reads:
        where = f"node-{read['node'] + 1} {read['phase']} read"
        present = {j["name"]: j for j in read.get("jobs", [])}
        for name in present:
            if name not in per_job:
                examples.append(f"{where}: job {name} exists, but no client ever asked for it")
        for job, m in models.items():
            j = present.get(job)
            ok = False
            for exists, spec_idx, paused in m:
                if not exists and j is None:
                    ok = True
                elif exists and j is not None and bool(j.get("paused")) == paused \
                        and _spec_matches(by_index[spec_idx]["spec"], j["spec"]):
                    ok = True
                    if by_index[spec_idx]["type"] == "info":
                        recovered.add((job, spec_idx))
                if ok:
                    break
            if not ok:
                acked = [o for o in per_job[job] if o["type"] == "ok"]
                last = acked[-1] if acked else None
                examples.append(f"{where}: job {job} is {'absent' if j is None else 'paused=%s %s' % (j.get('paused'), j['spec'].get('description'))}; "
                                f"the client history allows only {sorted((e, by_index[i]['spec'].get('description') if i is not None else None, p) for e, i, p in m)}"
                                + (f" (last ok op: #{last['invoke_index']} {last['f']})" if last else ""))
    final = (data.get("reads") or {}).get("final", {})
    restart = (data.get("reads") or {}).get("restart", {})
    for node, before in final.items():
        after = restart.get(node)
        if not after or after.get("runs") is None or before.get("runs") is None:
            continue
        after_ids = {r["id"] for r in after["runs"]}
        lost = [r for r in before["runs"] if r["id"] not in after_ids]
        trimmed = _trimmed_between(before, after, lost, spec_versions(data))
        lost = [r["id"] for r in lost if r["id"] not in trimmed]
        if lost:
            examples.append(f"node-{int(node) + 1}: {len(lost)} run(s) read before the full restart are gone after it, e.g. {lost[:3]}")
        bj = {j["name"]: (j["paused"], json.dumps(j["spec"], sort_keys=True)) for j in before.get("jobs", [])}
        aj = {j["name"]: (j["paused"], json.dumps(j["spec"], sort_keys=True)) for j in after.get("jobs", [])}
        if bj != aj:
            diff = sorted(set(bj.items()) ^ set(aj.items()))[:2]
            examples.append(f"node-{int(node) + 1}: jobs differ across the full restart: {_short(diff, 300)}")
    stats = {"client_ops": len(ops), "ok": sum(o["type"] == "ok" for o in ops),
             "fail": sum(o["type"] == "fail" for o in ops), "info": sum(o["type"] == "info" for o in ops),
             "info_recovered": len(recovered), "jobs": len(per_job), "reads": len(reads)}
    if examples:
        return _result(INVALID, examples, stats)
    if not reads or "restart" not in (data.get("reads") or {}):
        return _result(UNKNOWN, [], stats, "missing final or post-restart reads")
    if unknown_jobs:
        return _result(UNKNOWN, [], stats, f"search budget exhausted for {unknown_jobs[:5]}")
    return _result(VALID, [], stats)


# ---------------------------------------------------------------------------------------------
# 5. Retries and dead letters
# ---------------------------------------------------------------------------------------------

def backoff_bounds_ms(retry: dict, attempt: int) -> tuple[float, float]:
    """The delay before attempt ``attempt + 1`` may start, without and with full jitter spread."""
    base = min(retry["backoff_max_s"], retry["backoff_s"] * retry["backoff_multiplier"] ** (attempt - 1)) * 1000
    j = retry.get("jitter", 0)
    return base * (1 - j), base * (1 + j)


#: Faults that excuse a lease expiry: they stop a worker, or cut it off (a partition isolates one
#: node from both others). A clock jump is not among them: a lease must not expire because some
#: node's wall clock moved (I15's rule, applied to a leader whose clock jumps).
_WORKER_FAULTS = ("kill", "pause", "partition", "restart-all", "power", "member-replace", "member-grow-shrink",
                  "member-remove-leader")
def _takes_the_quorum(f: dict) -> bool:
    """Whether fault ``f`` stops or cuts off the leader or a majority (no heartbeat commits)."""
    return (f.get("fault") or {}).get("target") in ("leader", "majority") or len(f.get("nodes") or []) >= 2


#: State time runs ahead of wall time by up to the largest forward clock jump; faults are matched
#: against attempts with this much slack on both sides.
_STATE_TIME_SLACK_MS = 8000


def spurious_expiries(data: dict, runs: list[dict], windows: list[dict] | None = None) -> list[str]:
    """Attempts that failed "lease expired" although no fault stopped or cut off their worker's
    node while the lease was held (from one lease TTL before the grant to the expiry). For each,
    ``windows`` (when given) gets the wall-time span to read the logs in (``log_context``): from
    the grant (state time, or the begin when earlier) to the expiry."""
    ttl_ms = int(((data.get("schedule") or {}).get("lease_ttl_s") or 2) * 1000)
    nodes = {n["id"]: i for i, n in enumerate(data.get("nodes") or [])} or {f"node-{i + 1}": i for i in range(3)}
    # The lease's start in wall time: the earlier of its grant (state time: the cluster's clock,
    # the median of the members') and its attempt's first sink write. A worker can begin an
    # attempt well after its grant (the answer waited behind a pause, a node catching up, an
    # election): the lease was held from the grant, and a fault since then explains its expiry.
    # Without a sink write, the grant with slack (state time can run ahead of or behind wall
    # time by a clock jump not yet caught).
    begin_wall = {}
    for w in data.get("sink", []):
        if w.get("phase") == "begin":
            begin_wall.setdefault((w.get("run"), w.get("attempt")), w["t_ms"])
    remote = set(data.get("remote_workers") or [])
    out = []
    for r in runs:
        for a in r.get("attempts") or []:
            if a.get("ok") or "lease expired" not in (a.get("error") or "") or a.get("started_at") is None:
                continue
            worker = str(a.get("worker") or "")
            node = nodes.get(worker.split("/")[0])
            held_ms = (a.get("finished_at") or a["started_at"]) - a["started_at"]
            began = begin_wall.get((r["id"], a["attempt"]))
            if began is not None:
                # (bounded: state time lagging wall time must not reach back to unrelated faults)
                lo = max(min(began, a["started_at"]) - 500, began - ttl_ms - _STATE_TIME_SLACK_MS)
                hi = began + held_ms + _STATE_TIME_SLACK_MS
            else:
                lo = a["started_at"] - ttl_ms - _STATE_TIME_SLACK_MS
                hi = a["started_at"] + held_ms + _STATE_TIME_SLACK_MS
            if worker in remote:
                # A remote worker talks to any node: a fault that stops or cuts off any node, or
                # one of its own (killed, paused, cut off), excuses its lease's expiry.
                excused = any(f.get("start_ms", 0) <= hi and (f.get("end_ms") or 1 << 62) >= lo
                              and (f.get("kind") in _WORKER_FAULTS
                                   or (f.get("kind", "").startswith("worker-") and worker in (f.get("workers") or [])))
                              for f in data.get("faults", []))
            else:
                # A node's own worker: a fault of its node, or one that leaves the cluster without
                # a leader for a while (the leader's, a majority's): its heartbeats are committed
                # through a leader and a majority (seed 4697: a majority's power cut expired the
                # leases of the one node left up, the nemesis named no fault of it).
                excused = any(f.get("kind") in _WORKER_FAULTS
                              and (node in (f.get("nodes") or [node]) or _takes_the_quorum(f))
                              and f.get("start_ms", 0) <= hi and (f.get("end_ms") or 1 << 62) >= lo
                              for f in data.get("faults", []))
            if not excused:
                skew = (f"; it began {began - a['started_at']:+d} ms after its grant by state time (a late answer, "
                        f"or state time off wall time)" if began is not None else "")
                clocks = [f"{f['fault'].get('offset_ms'):+d} ms on node-{f['nodes'][0] + 1}" for f in data.get("faults", [])
                          if f.get("kind") == "clock" and f.get("start_ms", 0) <= hi and (f.get("end_ms") or 1 << 62) >= lo]
                whose = "that worker or any node" if worker in remote else "that worker's node"
                out.append(f"run {r['id']} attempt {a['attempt']}: its lease (worker {a.get('worker')}) expired at {a.get('finished_at')} "
                           f"though no fault stopped or cut off {whose}{skew}" + (f"; clock jump(s) at the time: {', '.join(clocks)}" if clocks else ""))
                if windows is not None:
                    start = a["started_at"] if began is None else min(began, a["started_at"])
                    end = max(a.get("finished_at") or a["started_at"], (began or a["started_at"]) + held_ms)
                    windows.append({"run": r["id"], "attempt": a["attempt"], "worker": a.get("worker"),
                                    "from_ms": start - 2000, "to_ms": end + 1000})
    return out


#: The error of an attempt the leader's reaper ended (its worker stopped heartbeating).
LOST_PREFIX = "lease expired"
try:  # the product's bound on retried worker losses
    from raftsched.core.limits import lease_losses_max as LEASE_LOSSES_MAX
except ImportError:  # pragma: no cover - an older product
    LEASE_LOSSES_MAX = 5


def check_retries(data: dict) -> dict:
    """Each run's attempts and final place match the failure plan and the two retry budgets
    (core/leases.py): attempts are numbered 1..n; an attempt the plan fails never succeeds, one
    it lets succeed never fails with the planned error (other failures are the faults': lease
    expired or lost, fenced); a succeeded run's last attempt succeeded; an attempt lost with its
    worker ("lease expired") is retried at once, at most lease_losses_max times; any other failure
    counts against max_attempts and is retried, while some spec version's max_attempts allows it,
    no earlier than backoff(failures so far) after it ended (state time); a dead run spent one of
    those budgets; and no lease expires while its worker's node is healthy and connected
    (``spurious_expiries``)."""
    examples = []
    plan = (data.get("schedule") or {}).get("plan", {}).get("jobs", {})
    versions = spec_versions(data)
    counts = {"runs": 0, "succeeded": 0, "dead": 0, "retried": 0, "planned_failures": 0, "fault_failures": 0,
              "matches_plan_exactly": 0}
    seen = set()
    for read in _all_reads(data):
        where = f"node-{read['node'] + 1} {read['phase']}"
        for r in read["runs"]:
            if r.get("kind") not in ("scheduled", "manual", "backfill") or r["job"] not in plan:
                continue
            if r.get("requeue"):
                # A bulk requeue gave it fresh budgets part-way (check_backfills judges it).
                counts["requeued_not_judged"] = counts.get("requeued_not_judged", 0) + (r["id"] not in seen)
                seen.add(r["id"])
                continue
            specs = versions.get(r["job"]) or []
            if not specs:
                continue
            budgets = sorted({s["retry"]["max_attempts"] for s in specs})
            fail_pct = plan[r["job"]]["fail_pct"]
            atts = r.get("attempts") or []
            first_read = r["id"] not in seen
            seen.add(r["id"])
            if first_read:
                counts["runs"] += 1
            nums = [a["attempt"] for a in atts]
            if nums != list(range(1, len(nums) + 1)):
                examples.append(f"{where}: run {r['id']} attempts are numbered {nums}")
                continue
            # Two budgets (core/leases.py): an attempt lost with its worker (the reaper's
            # "lease expired") is retried at once, up to lease_losses_max times; any other failure
            # counts against max_attempts and is retried after backoff(failures so far).
            failures = lost = fault_caused = 0
            steps = []  # (attempt, lost?, failures, lost) after each failed attempt
            for a in atts:
                planned_fail = failure_plan.attempt_fails(r["id"], a["attempt"], fail_pct)
                err = a.get("error") or ""
                if a.get("released"):
                    # Given back by its worker (a remote worker draining, or a lease answer that
                    # could not be delivered): queued again at once, spending neither budget (I19).
                    fault_caused += 1
                    if first_read:
                        counts["fault_failures"] += 1
                        counts["released"] = counts.get("released", 0) + 1
                    steps.append((a, None, failures, lost))
                    continue
                if a.get("ok"):
                    if planned_fail:
                        examples.append(f"{where}: run {r['id']} attempt {a['attempt']} succeeded, but the plan fails it")
                    if a is not atts[-1]:
                        examples.append(f"{where}: run {r['id']} was attempted again after attempt {a['attempt']} succeeded")
                    continue
                if failure_plan.PLANNED_FAILURE in err:
                    if not planned_fail:
                        examples.append(f"{where}: run {r['id']} attempt {a['attempt']} failed as planned, but the plan lets it succeed")
                    elif first_read:
                        counts["planned_failures"] += 1
                else:
                    fault_caused += 1
                    if first_read:
                        counts["fault_failures"] += 1
                is_lost = err.startswith(LOST_PREFIX)
                if is_lost:
                    lost += 1
                else:
                    failures += 1
                steps.append((a, is_lost, failures, lost))
            st = r["state"]
            if st == "succeeded":
                if not atts or not atts[-1].get("ok"):
                    examples.append(f"{where}: run {r['id']} is succeeded but its last attempt {atts[-1] if atts else None} did not succeed")
                counts["succeeded"] += first_read
            elif st == "dead":
                if any(a.get("ok") for a in atts):
                    examples.append(f"{where}: run {r['id']} is dead though an attempt succeeded")
                elif steps and steps[-1][1] is not None:  # (a release of a deleted job's run ends it dead)
                    _, last_lost, f, l = steps[-1]
                    if last_lost and l <= LEASE_LOSSES_MAX:
                        examples.append(f"{where}: run {r['id']} is dead after losing its worker {l} time(s); up to {LEASE_LOSSES_MAX} losses are retried")
                    if not last_lost and not budgets[0] <= f <= budgets[-1]:
                        examples.append(f"{where}: run {r['id']} is dead after {f} failed attempt(s); its max_attempts were {budgets}")
                counts["dead"] += first_read
            elif st in ("queued", "running") and atts:
                if atts[-1].get("ok"):
                    examples.append(f"{where}: run {r['id']} is {st} again after a success")
            elif st == "failed":
                # Only the overlap policy "replace" ends a run as failed (a newer slot's run
                # revoked it); a failure of the handler retries or dead-letters.
                if not any((sp.get("overlap") or {}).get("policy") == "replace" for sp in specs):
                    examples.append(f"{where}: run {r['id']} is failed ({_short(r.get('error'), 80)}) but no spec of job {r['job']} has overlap policy replace")
                elif "replaced by run" not in (r.get("error") or ""):
                    examples.append(f"{where}: run {r['id']} is failed for another reason than its replacement: {_short(r.get('error'), 80)}")
                counts["replaced"] = counts.get("replaced", 0) + first_read
            # Each retry was allowed, and started no earlier than its delay (state time).
            nxt_start = {a["attempt"]: a.get("started_at") for a in atts}
            if st == "running":
                nxt_start[r.get("attempt")] = r.get("started_at")
            for a, is_lost, f, l in steps:
                start = nxt_start.get(a["attempt"] + 1)
                if is_lost is None:
                    continue  # released: retried at once, whatever the budgets
                if start is None and not (st == "queued" and a is atts[-1]):
                    continue
                if is_lost and l > LEASE_LOSSES_MAX:
                    examples.append(f"{where}: run {r['id']} was retried after losing its worker {l} times (at most {LEASE_LOSSES_MAX})")
                if not is_lost and f >= budgets[-1]:
                    examples.append(f"{where}: run {r['id']} was retried after {f} failed attempt(s); its max_attempts were {budgets}")
                if start is None or is_lost or a.get("finished_at") is None:
                    continue
                lo = min(backoff_bounds_ms(sp["retry"], f)[0] for sp in specs)
                if start < a["finished_at"] + lo - 1:
                    examples.append(f"{where}: run {r['id']} attempt {a['attempt'] + 1} started {start - a['finished_at']} ms after attempt {a['attempt']} failed; its backoff is at least {lo:.0f} ms")
            if len(atts) > 1:
                counts["retried"] += first_read
            if st in ("succeeded", "dead") and fault_caused == 0 and len(budgets) == 1 and first_read:
                exp = failure_plan.expected_outcome(r["id"], fail_pct, budgets[0])
                if (st, len(atts)) != exp:
                    examples.append(f"{where}: run {r['id']} ended {st} after {len(atts)} attempt(s) with no fault; the plan says {exp}")
                else:
                    counts["matches_plan_exactly"] += 1
    latest = {}
    for read in _all_reads(data):
        for r in read["runs"]:
            latest[r["id"]] = r
    windows: list[dict] = []
    spurious = spurious_expiries(data, list(latest.values()), windows)
    counts["spurious_expiries"] = len(spurious)
    examples += spurious
    if not seen:
        return _result(UNKNOWN, [], counts, "no run read")
    if examples:
        res = _result(INVALID, examples, counts)
        if windows:
            res["log_windows"] = windows[:EXAMPLES_MAX]  # run.py prints the logs of the first (log_context)
        return res
    if counts["retried"] == 0 or counts["dead"] == 0:
        return _result(UNKNOWN, [], counts, "not exercised: no retry or no dead letter")
    return _result(VALID, [], counts)


# ---------------------------------------------------------------------------------------------
# 6. Convergence and liveness
# ---------------------------------------------------------------------------------------------

def check_convergence(data: dict) -> dict:
    """After healing: every node serves consistent reads; nodes at the same applied count have the
    same state hash (each pair compared at least once per phase); the jobs read through each node
    agree; runs fired before the heal finished while the harness waited; and every unpaused job
    fired (a run or a record) for a slot after the heal within its interval + RESUME_BOUND_MS."""
    examples, unknowns = [], []
    stats: dict = {}
    for phase, samples in (data.get("hashes") or {}).items():
        by_applied: dict[int, dict[int, str]] = {}
        for s in samples:
            by_applied.setdefault(s["applied"], {})
            prev = by_applied[s["applied"]].setdefault(s["node"], s["hash"])
            if prev != s["hash"]:
                examples.append(f"{phase}: node-{s['node'] + 1} gave two hashes at applied {s['applied']}")
        pairs = set()
        for applied, hs in sorted(by_applied.items()):
            for a, b in itertools.combinations(sorted(hs), 2):
                pairs.add((a, b))
                if hs[a] != hs[b]:
                    examples.append(f"{phase}: at applied {applied}, node-{a + 1} state hash {hs[a][:12]} != node-{b + 1} {hs[b][:12]}")
        stats[f"{phase}_pairs_compared"] = len(pairs)
        if len(pairs) < 3:
            unknowns.append(f"{phase}: only node pairs {sorted(pairs)} were sampled at a common applied count")
    if not data.get("hashes"):
        unknowns.append("no state hash was sampled")
    for phase in ("final", "restart"):
        reads = (data.get("reads") or {}).get(phase, {})
        for node, r in sorted(reads.items()):
            if r.get("runs") is None:
                examples.append(f"{phase}: node-{int(node) + 1} served no consistent read after healing: {_short(r.get('error'), 200)}")
        jobs_by_node = {n: {j["name"]: (j["paused"], json.dumps(j["spec"], sort_keys=True)) for j in r.get("jobs", [])}
                        for n, r in reads.items() if r.get("runs") is not None}
        views = list(jobs_by_node.items())
        for (n1, v1), (n2, v2) in zip(views, views[1:]):
            if v1 != v2:
                examples.append(f"{phase}: jobs read through node-{int(n1) + 1} and node-{int(n2) + 1} differ: {_short(sorted(set(v1.items()) ^ set(v2.items()))[:2], 200)}")
    settle = data.get("settle") or {}
    for what in settle.get("no_leader") or []:
        examples.append(f"liveness: no leader agreed by all three nodes {what}")
    if settle.get("pending_count"):
        examples.append(f"liveness: {settle['pending_count']} run(s) fired before the heal were still queued or running "
                        f"{settle.get('waited_s')} s after it, e.g. {settle.get('pending_at_end', [])[:3]}")
    heal = (data.get("times") or {}).get("heal_ms")
    final = (data.get("reads") or {}).get("final", {})
    held = settle.get("held_at_end") or []
    if held:
        # Held by a pause (due null): only a job paused at the end may hold a run.
        read = next((r for _, r in sorted(final.items()) if r.get("runs") is not None), None)
        paused = {j["name"] for j in read.get("jobs", []) if j.get("paused")} if read is not None else None
        if paused is not None:
            for rid in held:
                if rid.split("@", 1)[0] not in paused:
                    examples.append(f"liveness: run {rid} was held (due null) {settle.get('waited_s')} s after the heal, "
                                    f"but its job is not paused in the final read")
                    break
        stats["held_by_pause_at_end"] = len(held)
    resumed = []
    if heal is not None and final:
        read = next((r for _, r in sorted(final.items()) if r.get("runs") is not None), None)
        if read is not None:
            for job in read.get("jobs", []):
                if job.get("paused") or "after" in job["spec"]:
                    continue  # a pipeline's child runs when its parents allow (check_pipeline)
                g = grid_ms(job["spec"]["schedule"])
                every = g[0] if g else 60_000
                after = [r.get("fired_at") for r in read["runs"] if r["job"] == job["name"] and r["slot_ms"] > heal
                         and r.get("fired_at") is not None]
                if read["t_start_ms"] - heal < every + DUE_SLACK_MS:
                    continue  # not enough time has passed to judge
                if not after:
                    examples.append(f"liveness: job {job['name']} fired nothing for slots after the heal at {heal} (read at {read['t_start_ms']})")
                else:
                    lag = min(after) - heal
                    resumed.append(lag)
                    if lag > every + RESUME_BOUND_MS:
                        examples.append(f"liveness: job {job['name']} fired first {lag} ms after the heal (bound {every + RESUME_BOUND_MS} ms)")
    stats["resume_after_heal_ms_max"] = max(resumed) if resumed else None
    # A figure, not a verdict: after each fault ended, how long until the sink saw a run begin.
    begins = sorted(w["t_ms"] for w in data.get("sink", []) if w.get("phase") == "begin" and w.get("accepted"))
    recovery: dict[str, int] = {}
    for f in data.get("faults", []):
        end = f.get("end_ms")
        if end is None or (f.get("fault") or {}).get("harness"):
            continue
        nxt = next((t for t in begins if t >= end), None)
        if nxt is not None:
            recovery[f["kind"]] = max(recovery.get(f["kind"], 0), nxt - end)
    stats["first_run_after_fault_ms_max"] = recovery
    if examples:
        return _result(INVALID, examples, stats)
    if unknowns:
        return _result(UNKNOWN, unknowns, stats, unknowns[0])
    return _result(VALID, [], stats)


# ---------------------------------------------------------------------------------------------
# 6b. Commit progress: no follower's commit index frozen while the cluster's advances
# ---------------------------------------------------------------------------------------------

#: A node that is up and under no fault, whose commit index stays at one value below the highest
#: commit index of the cluster for longer than this while that highest index advances, is a
#: stalled follower (issue 20: a deposed leader frozen for 27 s, 76 s, 2.5 min). A healthy node's
#: commit index moves with every heartbeat that carries a new one (appendEntriesPeriod 0.1 s), and
#: the cluster commits every second or so (fires, leases, client writes). The longest a healthy,
#: unfaulted node can lag without moving is a lost link's detection and redial (connectionTimeout
#: 2 s, then every 0.25 s), an election (0.5-1 s timeouts), and a snapshot sent to a node that fell
#: behind the leader's compacted log (a few MB here: 1-3 s on two loaded cores): about 5 s. Three
#: times that leaves room for a GC pause or a starved process on the 2-core machine, and still
#: catches the bug's stalls, which last until the leader compacts its log (5 000 entries or
#: 300 s). The checker's figure ``longest_freeze_ms`` is a run's actual margin.
COMMIT_STALL_MS = 15_000
#: A node is not judged while a fault that stops it or cuts it off is in place, nor for this long
#: after it heals: the links' reconnection (a blackholed connection is dropped after 2 s of
#: silence and redialled) and an election. A stall is then reported at the latest
#: COMMIT_GRACE_MS + COMMIT_STALL_MS (20 s) after the heal.
COMMIT_GRACE_MS = 5_000
#: The faults that excuse a node's frozen commit index: they stop the node or cut it off, or (the
#: membership faults) start it anew, catching up from nothing. A clock jump does not
#: (replication does not follow the wall clock); the remote workers' faults touch no node.
_COMMIT_FAULTS = ("kill", "pause", "partition", "restart-all", "power", "member-replace", "member-grow-shrink",
                  "member-remove-leader")


def excused_nodes(faults: list[dict], t_ms: int, grace_ms: int | None = None) -> set[int]:
    """The nodes that a fault stopping them or cutting them off covers at ``t_ms``: from the time
    it was in place (the nemesis log's ``in_place_ms``, else ``start_ms``) to its end plus
    ``grace_ms``; a fault not ended yet (the live monitor) covers them until it is. A fault with
    no node recorded was not in place yet."""
    grace = COMMIT_GRACE_MS if grace_ms is None else grace_ms
    out: set[int] = set()
    for f in faults:
        if f.get("kind") not in _COMMIT_FAULTS or not f.get("nodes"):
            continue
        start = f.get("in_place_ms", f.get("start_ms"))
        end = f.get("end_ms")
        if start is not None and start <= t_ms and (end is None or t_ms <= end + grace):
            out.update(f["nodes"])
    return out


class CommitWatch:
    """Spans in which a node's commit index stayed at one value below the cluster's highest,
    fed one monitor round at a time: by run.py's monitor while the run goes on (a stall is
    printed as soon as it is seen) and by :func:`check_commit_progress` on the stored samples.

    A span starts at the first round in which a judged node (up, under no fault) is behind the
    highest commit index sampled in that round, and ends when its commit index moves, it is no
    longer behind, or a fault covers it (a round without its sample neither extends nor ends it).
    A span is a stall when it lasted more than ``stall_ms`` and the highest commit index advanced
    during it."""

    def __init__(self, stall_ms: int | None = None) -> None:
        self.stall_ms = COMMIT_STALL_MS if stall_ms is None else stall_ms
        self.open: dict[int, dict] = {}
        self.stalls: list[dict] = []
        self.rounds = 0
        self.judged = 0
        #: the longest span in which the highest commit index advanced (a stall or not)
        self.longest: dict | None = None

    @staticmethod
    def _leader(up: dict[int, dict]) -> tuple[int, int] | None:
        leaders = [(s.get("term") or 0, n) for n, s in up.items() if s.get("role") == "leader"]
        if not leaders:
            return None
        n = max(leaders)[1]
        return n, up[n]["commit"]

    def stalled(self, sp: dict) -> bool:
        return sp["to_ms"] - sp["from_ms"] > self.stall_ms and sp["top_to"] > sp["top_from"]

    def _close(self, n: int) -> None:
        sp = self.open.pop(n, None)
        if sp is None:
            return
        if sp["top_to"] > sp["top_from"] and (self.longest is None or
                                              sp["to_ms"] - sp["from_ms"] > self.longest["to_ms"] - self.longest["from_ms"]):
            self.longest = dict(sp)
        if self.stalled(sp):
            self.stalls.append(dict(sp))

    def feed(self, t_ms: int, samples: dict[int, dict], excused: set[int]) -> list[dict]:
        """One round: ``samples`` {node: monitor record} (``commit`` None or absent when it did not
        answer). Returns the spans that became stalls in this round (each once)."""
        self.rounds += 1
        up = {n: s for n, s in samples.items() if s.get("commit") is not None}
        if not up:
            return []
        top = max(s["commit"] for s in up.values())
        leader = self._leader(up)
        new = []
        for n in sorted(set(samples) | set(self.open)):
            if n in excused:
                self._close(n)
                continue
            s = up.get(n)
            if s is None:
                continue
            self.judged += 1
            c = s["commit"]
            sp = self.open.get(n)
            if sp is not None and sp["commit"] != c:
                self._close(n)
                sp = None
            if c >= top:
                self._close(n)
                continue
            if sp is None:
                sp = self.open[n] = {"node": n, "commit": c, "from_ms": t_ms, "to_ms": t_ms, "top_from": top,
                                     "top_to": top, "leader_from": leader, "leader_to": leader, "live": False}
            else:
                sp.update(to_ms=t_ms, top_to=top, leader_to=leader)
            if not sp["live"] and self.stalled(sp):
                sp["live"] = True
                new.append(dict(sp))
        return new

    def finish(self) -> list[dict]:
        """Close the spans still open (the end of the samples); returns every stall."""
        for n in list(self.open):
            self._close(n)
        return self.stalls


def describe_stall(sp: dict, t0_ms: int | None = None) -> str:
    """A stall as a counterexample: the node, from-to (ms, and seconds into the run), its commit
    index, the cluster's highest and the leader's then."""
    def at(ms):
        return f"{ms}" + (f" (+{(ms - t0_ms) / 1000:.1f} s)" if t0_ms is not None else "")

    def leader(ld):
        return f"node-{ld[0] + 1} at {ld[1]}" if ld else "none agreed"
    return (f"node-{sp['node'] + 1} stalled: its commit index stayed at {sp['commit']} from {at(sp['from_ms'])} to "
            f"{at(sp['to_ms'])}, {(sp['to_ms'] - sp['from_ms']) / 1000:.1f} s, while it was up and under no fault; the "
            f"highest commit index went {sp['top_from']} -> {sp['top_to']} (leader: {leader(sp.get('leader_from'))} -> "
            f"{leader(sp.get('leader_to'))})")


def monitor_rounds(monitor: list[dict]) -> list[tuple[int, dict[int, dict]]]:
    """The monitor's records grouped by round (one ``t_ms`` per round), in time order."""
    rounds: dict[int, dict[int, dict]] = {}
    for s in monitor:
        rounds.setdefault(s["t_ms"], {})[s["node"]] = s
    return sorted(rounds.items())


def check_commit_progress(data: dict) -> dict:
    """No node that is up and under no fault (kill, pause, partition, restart-all, and
    COMMIT_GRACE_MS after each) keeps its commit index frozen below the cluster's highest for more
    than COMMIT_STALL_MS while that highest index advances (CommitWatch), judged on the monitor's
    samples from the start of the workload to the end of the run (the final full restart
    included). Also the figures of the partitions of the leader under write load (bursts)."""
    watch = CommitWatch()
    faults = data.get("faults") or []
    for t, samples in monitor_rounds(data.get("monitor") or []):
        watch.feed(t, samples, excused_nodes(faults, t))
    stalls = watch.finish()
    t0 = (data.get("times") or {}).get("t0_ms")
    longest = watch.longest
    stats = {"rounds": watch.rounds, "judged": watch.judged, "stalls": len(stalls),
             "longest_freeze_ms": (longest["to_ms"] - longest["from_ms"]) if longest else 0,
             "longest_freeze_node": f"node-{longest['node'] + 1}" if longest else None,
             "bound_ms": COMMIT_STALL_MS, "grace_ms": COMMIT_GRACE_MS}
    # The product's own view (/v1/cluster replication.commit_stalled_s and conditions), as figures:
    # the harness judges the commit indexes, not the product's report of them.
    own = [s["stalled_s"] for s in data.get("monitor") or [] if isinstance(s.get("stalled_s"), (int, float))]
    if own:
        stats["product_stalled_s_max"] = max(own)
        stats["product_follower_stalled_samples"] = sum("cluster.follower_stalled" in (s.get("conditions") or ())
                                                        for s in data.get("monitor") or [])
    bursts = [f for f in faults if (f.get("fault") or {}).get("burst")]
    if bursts:
        b = [f.get("burst") or {} for f in bursts]
        stats.update(bursts=len(bursts), bursts_on_leader=sum(x.get("resolved") == "leader" for x in b),
                     burst_puts_ok=sum(x.get("ok", 0) for x in b),
                     burst_kib_ok=sum(x.get("bytes_ok", 0) for x in b) // 1024)
    examples = [describe_stall(sp, t0) for sp in stalls]
    res = _result(INVALID if stalls else VALID, examples, stats)
    res["stalls"] = stalls
    if not stalls and not watch.judged:
        return dict(_result(UNKNOWN, [], stats, "no commit index of a node under no fault was sampled"), stalls=[])
    return res


# ---------------------------------------------------------------------------------------------
# 7. Backfills and bulk requeues
# ---------------------------------------------------------------------------------------------

def _iso_ms(text) -> int | None:
    """An ISO-8601 UTC time as the API writes it -> integer ms (run.py's iso_ms)."""
    if text is None:
        return None
    d = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((d - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) / dt.timedelta(milliseconds=1))


def _trimmed_since(data: dict, read: dict, job: str, t_ms: int) -> bool:
    """Whether job's history trim may have dropped, by ``read``, entries made at state time
    ``t_ms`` or later (a backfill's runs): the job holds at least ``history`` entries (the
    smallest of its specs') and none of its entries still there was trimmable (a record, or a
    run finished, not dead: core/fire.py TRIMMABLE) before ``t_ms``, as trim drops the oldest
    trimmable entries first."""
    spec = next((j["spec"] for j in read.get("jobs", []) if j["name"] == job), None)
    mine = [r for r in read["runs"] if r["job"] == job]
    if spec is None or len(mine) < _history_bound((spec_versions(data).get(job) or []) + [spec]):
        return False
    for y in mine:
        since = y.get("fired_at") if y.get("kind") == "recorded" else \
            y.get("finished_at") if y.get("state") in TRIMMABLE else None
        if isinstance(since, int) and since < t_ms:
            return False
    return True


def check_backfills(data: dict) -> dict:
    """Each backfill ran exactly the slots its dry run listed, each once: in every read, its runs
    (``backfill`` naming it) are of distinct slots its dry run listed, or left out as not yet due
    then (the schedule may have reached them in the milliseconds before the backfill was made);
    once it is done, every listed slot has its run, unless another backfill of the same slots ran
    beside it (a slot it ran first is then left out here, rightly), the job was deleted since
    (with its runs) or its history trim may have dropped them (_trimmed_since the backfill's
    invocation, less the clock bound and any clock fault's offset: the state's time then). An acknowledged backfill is in every final and post-restart read that holds
    fewer than BACKFILLS_KEPT_MAX finished ones (the state forgets the oldest beyond that). A
    backfill that definitely did not happen has no run. A bulk requeue requeued at most ``max_count`` runs, of its job only,
    each once (one attempt after it died, not two)."""
    examples, stats = [], {"backfills": 0, "backfills_done": 0, "backfill_runs": 0, "requeues": 0, "requeued": 0}
    ops = [op for op in client_ops(data) if op["f"] in ("backfill", "requeue")]
    reads = _all_reads(data) + [r for r in data.get("periodic") or [] if r.get("runs") is not None]
    listed: dict[str, set] = {}
    # What a backfill may run: its dry run's slots, and those it left out as not yet due (the
    # schedule may reach them before it is made: then it runs them too).
    may_run: dict[str, set] = {}
    # A backfill's runs are made at state time no earlier than its invocation less this.
    skew = CLOCK_SKEW_MS_MAX + 1000 + max([abs(f.get("offset_ms", (f.get("fault") or {}).get("offset_ms")) or 0)
                                           for f in data.get("faults", []) if f.get("kind") == "clock"] or [0])
    def _map(x: object) -> dict:  # a malformed op's body or value is not a crash
        return x if isinstance(x, dict) else {}
    for op in ops:
        dry = _map(op.get("value")).get("dry")
        if op["f"] == "backfill" and isinstance(dry, dict) and isinstance(dry.get("slots"), list):
            listed[op["id"]] = {_iso_ms(x) for x in dry["slots"]}
            may_run[op["id"]] = listed[op["id"]] | {_iso_ms(x["slot"]) for x in dry.get("left_out") or []
                                                    if isinstance(x, dict) and x.get("reason") == "not_yet_due"}
    for op in ops:
        bf_id, value = op["id"], _map(op.get("value"))
        dry = value.get("dry") if isinstance(value.get("dry"), dict) else None
        if op["f"] == "requeue":
            stats["requeues"] += 1
            cap = _map(op.get("body")).get("max_count")
            only = _map(op.get("body")).get("job")
            for read in reads:
                where = f"node-{read['node'] + 1} {read.get('phase')} read"
                mine = [r for r in read["runs"] if r.get("requeue") == bf_id]
                if op["type"] == "fail" and mine:
                    examples.append(f"{where}: bulk requeue {bf_id} definitely did not happen, but requeued {len(mine)} run(s)")
                if cap is not None and len(mine) > cap:
                    examples.append(f"{where}: bulk requeue {bf_id} requeued {len(mine)} runs, more than max_count {cap}")
                for r in mine:
                    if only is not None and r["job"] != only:
                        examples.append(f"{where}: bulk requeue {bf_id} of job {only} requeued {r['id']} of job {r['job']}")
                if read.get("phase") in ("final", "restart"):
                    stats["requeued"] = max(stats["requeued"], len(mine))
            continue
        if dry is None or bf_id not in listed:
            continue  # the dry run failed (no answer, or an error's): nothing was asked for
        stats["backfills"] += 1
        slots = listed[bf_id]
        not_yet = {_iso_ms(x["slot"]) for x in dry.get("left_out", []) if x.get("reason") == "not_yet_due"}
        # (seed 4699: a backfill ran a slot its dry run had left out as not yet due; a second one,
        # whose dry run listed it, found it running and left it out)
        beside = any(other != bf_id and slots & s2 for other, s2 in may_run.items()
                     if next((o["job"] for o in ops if o["id"] == other), None) == op["job"])
        # Deleting the job deletes its runs (and a backfill's with them).
        deleted = any(o["f"] == "delete" and o["job"] == op["job"] and o["type"] in ("ok", "info")
                      and o["invoke_index"] > op["invoke_index"] for o in client_ops(data))
        done_seen, runs_final = False, 0
        for read in reads:
            where = f"node-{read['node'] + 1} {read.get('phase')} read"
            mine = [r for r in read["runs"] if r.get("backfill") == bf_id]
            if op["type"] == "fail" and mine:
                examples.append(f"{where}: backfill {bf_id} definitely did not happen, but has {len(mine)} run(s)")
                continue
            got = [r["slot_ms"] for r in mine]
            dup = sorted({s for s in got if got.count(s) > 1})
            if dup:
                examples.append(f"{where}: backfill {bf_id} made two runs for slot(s) {dup[:3]}")
            extra = sorted(set(got) - slots - not_yet)
            if extra:
                examples.append(f"{where}: backfill {bf_id} ran slot(s) {extra[:3]} its dry run did not list")
            for r in mine:
                if r.get("kind") != "backfill" or r["id"] not in (f"{r['job']}@{r['slot_ms']}",
                                                                  f"{r['job']}@{r['slot_ms']}#b{bf_id}"):
                    examples.append(f"{where}: run {r['id']} of backfill {bf_id} has kind {r.get('kind')} and an id "
                                    f"that is neither its slot's nor the backfill's")
            view = next((b for b in read.get("backfills") or [] if b["id"] == bf_id), None)
            if view is None and op["type"] == "ok" and read.get("phase") in ("final", "restart") \
                    and isinstance(read.get("backfills"), list) \
                    and sum(b.get("state") in ("done", "cancelled") for b in read["backfills"]) < BACKFILLS_KEPT_MAX:
                # Acknowledged, so in the state from then on: a backfill leaves it only when more
                # than backfills_kept_max finished ones (done or cancelled, of any kind) are kept,
                # the oldest first (core/backfills.py); a deleted job's are cancelled, not removed.
                examples.append(f"{where}: backfill {bf_id} was acknowledged ({op.get('status')}, {len(slots)} slot(s) "
                                f"listed) but is not in the state, which holds "
                                f"{sum(b.get('state') in ('done', 'cancelled') for b in read['backfills'])} finished ones")
            if view is not None and view["state"] == "done" and read.get("phase") in ("final", "restart"):
                done_seen = True
                missing = sorted(slots - set(got))
                if missing and not beside and not deleted \
                        and not _trimmed_since(data, read, op["job"], op["invoke_t_ms"] - skew):
                    examples.append(f"{where}: backfill {bf_id} is done, but slot(s) {missing[:3]} its dry run "
                                    f"listed have no run of it (left out: {view['progress'].get('left_out_reasons')})")
            if read.get("phase") == "final":
                runs_final = max(runs_final, len(mine))
        stats["backfills_done"] += done_seen
        stats["backfill_runs"] += runs_final
    if examples:
        return _result(INVALID, examples, stats)
    if stats["backfills_done"] == 0:
        return _result(UNKNOWN, [], stats, "no backfill was done by the final read")
    return _result(VALID, [], stats)


# ---------------------------------------------------------------------------------------------
# 8. Was the run stressed at all?
# ---------------------------------------------------------------------------------------------

def leader_changes(data: dict) -> int:
    """Leader changes the monitor saw while the workload ran (from t0 to the heal): each new
    (node, term) in which a node said it leads, after the first."""
    seen = []
    times = data.get("times") or {}
    # An unfinished run (recheck.py of a run cut short) has no heal: None, as much as absent.
    lo = times.get("t0_ms") or 0
    hi = times.get("heal_ms") or (1 << 62)
    for s in sorted(data.get("monitor", []), key=lambda s: (s["t_ms"], s["node"])):
        if not lo <= s["t_ms"] <= hi:
            continue
        if s.get("role") == "leader":
            key = (s["node"], s.get("term"))
            if not seen or seen[-1] != key:
                if key not in seen:
                    seen.append(key)
    return max(0, len(seen) - 1)


def check_stress(data: dict) -> dict:
    """A run with too few operations, too few sink writes, or no leader change proves nothing:
    unknown. Faults that were scheduled but did not run are listed."""
    ops = client_ops(data)
    ok = sum(o["type"] == "ok" for o in ops)
    writes = sum(1 for w in data.get("sink", []) if w.get("accepted"))
    changes = leader_changes(data)
    ran = sum(1 for f in data.get("faults", []) if not (f.get("fault") or {}).get("harness"))
    scheduled = len((data.get("schedule") or {}).get("faults", []))
    stats = {"client_ok": ok, "sink_accepted": writes, "leader_changes": changes, "faults_run": ran,
             "faults_scheduled": scheduled}
    why = []
    if ok < MIN_CLIENT_OK:
        why.append(f"only {ok} client operations succeeded (< {MIN_CLIENT_OK})")
    if writes < MIN_SINK_WRITES:
        why.append(f"only {writes} sink writes were accepted (< {MIN_SINK_WRITES})")
    if changes < 1:
        why.append("no leader change was observed")
    if ran < scheduled:
        why.append(f"only {ran} of {scheduled} scheduled faults ran")
    remote = tuple(f"{w}/" for w in data.get("remote_workers") or [])
    if remote:
        stats["sink_accepted_remote"] = sum(1 for w in data.get("sink", []) if w.get("accepted")
                                            and str(w.get("worker") or "").startswith(remote))
        if not stats["sink_accepted_remote"]:
            why.append("no run executed on a remote worker reached the sink")
    return _result(UNKNOWN if why else VALID, why, stats, "; ".join(why))


# ---------------------------------------------------------------------------------------------
# Power cuts (nemesis "power")
# ---------------------------------------------------------------------------------------------

def check_power_loss(data: dict) -> dict | None:
    """Across every power cut (a majority or all nodes killed, each losing what it had not
    synced): no fencing token is granted twice (at the sink, a token belongs to one attempt of
    one run), a grant made after a cut (by its attempt's state time and its first sink write,
    whichever is earlier) carries a token above every token granted before it (the counter did
    not go back), and no slot fires twice (a run, ``job@slot``, keeps the time it
    was fired at in every read, and each of its attempts its one token). That no acknowledged
    write is lost is the durability checker's verdict, which the cuts face too. None (not
    judged) when the run had no power nemesis; unknown when a cut ran but no grant followed
    one, or none ran."""
    if "power" not in ((data.get("schedule") or {}).get("nemeses") or []):
        return None
    examples: list[str] = []
    cuts = [f for f in data.get("faults", []) if f.get("kind") == "power" and f.get("nodes")]
    sink = sorted(data.get("sink", []), key=lambda w: w.get("seq", 0))
    owner: dict[int, tuple] = {}
    attempt_token: dict[tuple, int] = {}
    first_begin: dict[tuple, dict] = {}
    for w in sink:
        tok, k = w.get("token"), (w.get("run"), w.get("attempt"))
        if tok is None or k[0] is None:
            continue
        if owner.setdefault(tok, k) != k:
            examples.append(f"sink seq {w.get('seq')}: token {tok} was granted to {owner[tok]} and again to {k}")
        if attempt_token.setdefault(k, tok) != tok:
            examples.append(f"sink seq {w.get('seq')}: {k[0]} attempt {k[1]} ran with token {attempt_token[k]} "
                            f"and again with token {tok}: its slot fired twice")
        if w.get("phase") == "begin":
            first_begin.setdefault(k, w)
    # When each grant was made: its attempt's state time (started_at, in any read), or its first
    # write at the sink if earlier. A worker may begin late: a lease granted before a cut whose
    # first write comes after it was not granted after it.
    granted_at = {k: w.get("t_ms", 0) for k, w in first_begin.items()}
    for read in _all_reads(data) + list(data.get("periodic") or []):
        for r in read["runs"]:
            for a in r.get("attempts") or []:
                k = (r["id"], a.get("attempt"))
                if k in granted_at and a.get("started_at") is not None:
                    granted_at[k] = min(granted_at[k], a["started_at"])
    grants_after = 0
    for f in cuts:
        start, end = f.get("start_ms", 0), f.get("end_ms") or f.get("in_place_ms") or f.get("start_ms", 0)
        before = [w["token"] for k, w in first_begin.items() if granted_at[k] < start]
        after = [w for k, w in first_begin.items() if granted_at[k] > end]
        grants_after += len(after)
        if before:
            high = max(before)
            for w in after:
                if w["token"] <= high:
                    examples.append(f"power cut {f.get('id')} ({', '.join(f'node-{i + 1}' for i in f['nodes'])}): "
                                    f"{w.get('run')} attempt {w.get('attempt')} was granted token {w['token']} after it, "
                                    f"not above token {high} granted before it")
    fired: dict[str, tuple] = {}
    for read in _all_reads(data) + list(data.get("periodic") or []):
        for r in read["runs"]:
            if r.get("kind") not in (None, "scheduled") or r.get("fired_at") is None:
                continue
            seen = fired.setdefault(r["id"], (r["fired_at"], read.get("phase"), read.get("t_start_ms")))
            if seen[0] != r["fired_at"]:
                examples.append(f"node-{read['node'] + 1} {read.get('phase')} read at {read.get('t_start_ms')}: run "
                                f"{r['id']} was fired at {r['fired_at']}, but at {seen[0]} in the {seen[1]} read at "
                                f"{seen[2]}: its slot fired twice")
    stats = {"power_cuts": len(cuts), "nodes_cut": sum(len(f["nodes"]) for f in cuts), "grants_after_cuts": grants_after,
             "tokens_at_sink": len(owner), "runs_seen": len(fired)}
    if examples:
        return _result(INVALID, examples, stats)
    if not cuts:
        return _result(UNKNOWN, [], stats, "no power cut ran")
    if grants_after == 0:
        return _result(UNKNOWN, [], stats, "no fencing token was granted after a power cut")
    return _result(VALID, [], stats)


#: Kinds of run whose outcome reaches a pipeline's children without being asked to.
_PROPAGATING = ("scheduled", "triggered", "recorded")


def _meets(state: str, on: str) -> bool:
    if state in ("skipped", "coalesced"):
        return False
    return on == "finished" or (state == "succeeded") == (on == "success")


#: The states of the entries trim drops (core/fire.py TRIMMABLE: finished, not dead).
_TRIMMABLE = ("succeeded", "failed", "skipped", "coalesced")


def check_pipeline(data: dict) -> dict:
    """The pipeline workload (generator.PIPELINE_JOBS, docs/pipelines.md), in every final read:
    no child's run without every parent's run of the same slot having ended as its edge asks
    (the runs it names in ``upstream``, of that slot); no child slot twice; no slot silent: once
    every parent's entry for a slot is final (a run that ended, or a record), the child has an
    entry for it (a run, or a record with its reason), unless the slot is within DUE_SLACK_MS of
    the read.

    On a run longer than a job's ``history`` (a soak), trimming takes a job's oldest finished
    entries (the oldest made first; queued, running and dead ones stay): a parent's entry or a
    child's that is missing is trimmed, not lost, when that job's history is full and the entry
    would have been made before every finished entry it kept (``fired_at``). A child's run is
    made as its last parent's entry ends, so that parent's entry was made before it (the run
    must still name it in ``upstream``); a child's entry for a slot is made as its parents' last
    one ends (true of the workload's triggered children; a fan-out deferred to a later command,
    or a scheduled child's own slot, comes later). The read cannot tell trimmed from never made
    while a history holds exactly its bound and nothing was trimmed yet: for that moment of a
    long run an entry older than all it kept is excused too."""
    examples, checked, children, trimmed = [], 0, 0, 0
    final = ("succeeded", "failed", "dead", "skipped", "coalesced")
    for read in _all_reads(data):
        if read.get("runs") is None:
            continue
        specs = {j["name"]: j["spec"] for j in read.get("jobs", [])}
        by_job: dict[str, list] = {}
        for r in read["runs"]:
            by_job.setdefault(r["job"], []).append(r)

        def entry(job: str, slot: int, runs=by_job) -> dict | None:
            for r in runs.get(job, ()):
                hi = r.get("slot_to") or r["slot_ms"]
                if r["slot_ms"] <= slot <= hi and r.get("kind") in _PROPAGATING:
                    return r
            return None

        def kept_since(job: str, runs=by_job, specs=specs) -> float:
            """When the oldest finished entry ``job`` kept was made, if its history is full
            (older finished ones were trimmed); else -inf (none was)."""
            mine, bound = runs.get(job, []), specs.get(job, {}).get("history")
            if not isinstance(bound, int) or len(mine) < bound:
                return float("-inf")
            return min((r["fired_at"] for r in mine if isinstance(r.get("fired_at"), int) and r["state"] in _TRIMMABLE),
                       default=float("-inf"))

        where = f"node-{read['node'] + 1} {read['phase']}"
        for name, spec in specs.items():
            after = spec.get("after")
            if not after:
                continue
            children += 1
            mine = by_job.get(name, [])
            slots = [r["slot_ms"] for r in mine if r.get("kind") in _PROPAGATING]
            dup = sorted({s for s in slots if slots.count(s) > 1})
            if dup:
                examples.append(f"{where}: {name} has slot {dup[0]} twice")
            for r in mine:
                if r.get("kind") == "recorded" or r.get("kind") not in _PROPAGATING:
                    continue
                checked += 1
                named = set(r.get("upstream") or [])
                for e in after:
                    p = entry(e["job"], r["slot_ms"])
                    if p is None and f"{e['job']}@{r['slot_ms']}" in named and isinstance(r.get("fired_at"), int) \
                            and r["fired_at"] < kept_since(e["job"]):
                        trimmed += 1  # the parent's run it names was made before every one its parent kept
                        continue
                    if p is None or p["id"] not in named or not _meets(p["state"], e["on"]):
                        examples.append(f"{where}: {r['id']} ran, but {e['job']}'s run of its slot is "
                                        f"{_short(p, 200)} (edge {e['on']}; upstream {sorted(named)})")
            parent_slots = set()
            for e in after:
                parent_slots |= {r["slot_ms"] for r in by_job.get(e["job"], ()) if r.get("kind") in _PROPAGATING
                                 and r.get("slot_to") is None}
            for slot in sorted(parent_slots):
                if slot > read["t_start_ms"] - DUE_SLACK_MS:
                    continue
                ps = [entry(e["job"], slot) for e in after]
                if any(p is None or p["state"] not in final for p in ps):
                    continue
                if any(p.get("finished_at") and p["finished_at"] > read["t_start_ms"] - DUE_SLACK_MS for p in ps):
                    continue
                if entry(name, slot) is None and max(
                        (p.get("finished_at") or p.get("fired_at") or 0 for p in ps), default=0) < kept_since(name):
                    trimmed += 1  # its entry would have been made before every one it kept: trimmed
                    continue
                checked += 1
                if entry(name, slot) is None:
                    examples.append(f"{where}: {name} is silent for slot {slot}: its parents ended "
                                    f"{[(p['id'], p['state']) for p in ps]}")
    if not children:
        return _result(VALID, [], {"children": 0}, "no pipeline in this run")
    return _result(VALID if not examples else INVALID, examples,
                   {"children": children, "checked": checked, "trimmed": trimmed})


# ---------------------------------------------------------------------------------------------
# Notifications (docs/notifications.md)
# ---------------------------------------------------------------------------------------------

#: How long after an event's commit (the cluster's clock) a read (the harness's clock) must begin
#: to count against it: twice the clock guard's bound (core/limits.py clock_skew_ms_max).
_EVENT_READ_MARGIN_MS = 2000


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_notifications(data: dict) -> dict | None:
    """The webhook receiver's log (``events``: {t_ms, signed, event, idempotency_key}, duplicates
    included) against the state. Invalid when: a delivery's signature does not verify or its
    Idempotency-Key is not its event id; two deliveries of one event_id differ; an event the
    sink's committed cursor passed (the final reads' ``sink``) never arrived, or the sink gave one
    up (its dead count); a run.dead event names a run that the reads show and never show dead
    (every read of that attempt after the event: a requeue makes its attempt one higher); a job whose final read holds a dead run it was never paused
    around has no run.dead event at all (one a failing incident: docs/notifications.md). Unknown
    when the run made no event and no dead run, or no final read shows the sink."""
    got = data.get("events")
    if got is None:
        return None  # a run of a harness without the receiver
    examples: list = []
    stats: dict = {"deliveries": len(got), "events": 0, "duplicates": 0, "run_dead": 0, "dead_runs_final": 0}
    by_id: dict[str, dict] = {}
    for rec in got:
        ev = rec.get("event")
        if not isinstance(ev, dict) or not rec.get("signed"):
            examples.append(f"a delivery whose signature does not verify: {_short(rec)}")
            continue
        if rec.get("idempotency_key") != ev.get("event_id"):
            examples.append(f"Idempotency-Key {rec.get('idempotency_key')!r} is not the event id: {_short(ev)}")
        old = by_id.setdefault(ev["event_id"], ev)
        if old is not ev:
            stats["duplicates"] += 1
            if old != ev:
                examples.append(f"event {ev['event_id']} delivered twice with different bodies: {_short(old)} / {_short(ev)}")
    stats["events"] = len(by_id)
    seqs = {e["seq"] for e in by_id.values() if isinstance(e.get("seq"), int)}
    sinks = [r["sink"] for r in _all_reads(data) if isinstance(r.get("sink"), dict)]
    if sinks:
        cursor = max(s["cursor"] for s in sinks)
        stats["cursor"] = cursor
        missing = sorted(set(range(1, cursor + 1)) - seqs)
        if missing:
            examples.append(f"the sink's committed cursor is {cursor} but events {missing[:10]} never arrived "
                            f"({len(missing)} missing)")
        gave_up = max(s.get("dead", 0) for s in sinks)
        if gave_up:
            examples.append(f"the sink gave up {gave_up} events (its receiver answers every signed one)")
    # No event for something that did not happen.
    # A read can contradict an event only if it began after the event was committed: the final
    # reads may be taken moments before a run dies (the event's ``at`` is the cluster's time, the
    # read's the harness's: the margin covers the clock guard's bound between them). And only a
    # consistent read: a stale one (half the periodic reads) shows its replica as it is, which
    # may be seconds behind (a follower cut off, catching up).
    # A requeue gives a dead run its attempt number one higher (core/queues.py apply_dlq_requeue,
    # a bulk requeue's too): a read of the run at a higher attempt than the event's is after a
    # requeue, and contradicts nothing (no run.requeued is sent while its job is paused, so the
    # events cannot say; soak seed 602). Only a read of the same attempt can contradict it.
    seen_state: dict[str, list[tuple[int | None, str, int | None]]] = {}
    for r in _all_reads(data) + list(data.get("periodic") or []):
        if r.get("consistent") is False:
            continue
        t = r.get("t_start_ms", r.get("t_ms"))
        for run in r.get("runs") if isinstance(r.get("runs"), list) else []:
            if isinstance(run, dict):
                att = run.get("attempt")
                seen_state.setdefault(run.get("id"), []).append((t, run.get("state"), att if _is_int(att) else None))
    # Without attempt numbers (a store of an older harness): a run.requeued event for the run, a
    # requeue op naming its job, or a read showing a bulk requeue's id on it excuses it.
    requeued_runs = {e.get("run_id") for e in by_id.values() if e.get("kind") == "run.requeued"}
    for r in _all_reads(data) + list(data.get("periodic") or []):
        for run in r.get("runs") if isinstance(r.get("runs"), list) else []:
            if isinstance(run, dict) and run.get("requeue"):
                requeued_runs.add(run.get("id"))
    requeued_jobs: set = set()
    for op in client_ops(data):
        if op["f"] != "requeue" or op["type"] == "fail":
            continue
        body = op.get("body") if isinstance(op.get("body"), dict) else {}
        requeued_jobs.update(x for x in (op.get("job"), body.get("job")) if x)
    told_jobs: set[str] = set()
    for e in by_id.values():
        if e.get("kind") != "run.dead":
            continue
        stats["run_dead"] += 1
        told_jobs.add(e.get("job"))
        at = e.get("at") if isinstance(e.get("at"), int) else 0
        attempt = e.get("attempt") if _is_int(e.get("attempt")) else None
        seen = [(st, att) for t, st, att in seen_state.get(e.get("run_id"), ())
                if isinstance(t, int) and t >= at + _EVENT_READ_MARGIN_MS]
        if attempt is not None and all(att is not None for _, att in seen):
            states = {st for st, att in seen if att == attempt}
            excused = False
        else:
            states = {st for st, _ in seen}
            excused = e.get("job") in requeued_jobs or e.get("run_id") in requeued_runs
        if states and "dead" not in states and not excused:
            examples.append(f"run.dead for {e.get('run_id')} (attempt {attempt}), which every read of that attempt "
                            f"shows {sorted(states)}: {_short(e)}")
    # Every failing job is told (at least its first dead run; nothing while it is paused).
    paused = paused_ever(data)
    final = [r for _, r in sorted(((data.get("reads") or {}).get("final") or {}).items()) if r.get("runs") is not None]
    if final:
        dead_jobs = {run["job"] for run in final[0]["runs"] if run.get("state") == "dead" and run.get("kind") != "backfill"}
        stats["dead_runs_final"] = sum(1 for run in final[0]["runs"] if run.get("state") == "dead")
        for job in sorted(dead_jobs - paused - told_jobs):
            examples.append(f"job {job} has dead runs in the final read and no run.dead event arrived")
    if examples:
        return _result(INVALID, examples, stats)
    if not by_id and not stats["dead_runs_final"]:
        return _result(UNKNOWN, [], stats, "no event and no dead run: notifications not exercised")
    if not sinks:
        return _result(UNKNOWN, [], stats, "no final read shows the sink: delivery not judged")
    return _result(VALID, [], stats)


CHECKERS = {
    "no-lost-slot": check_lost_slots,
    "no-early-start": check_early_starts,
    "no-duplicate": check_duplicates,
    "fencing": check_fencing,
    "durability": check_durability,
    "retries": check_retries,
    "convergence": check_convergence,
    "commit-progress": check_commit_progress,
    "backfills": check_backfills,
    "stress": check_stress,
    "power-loss": check_power_loss,
    "notifications": check_notifications,
    "pipeline": check_pipeline,
}


#: What log_context keeps of the nodes' and workers' logs: roles, clocks, leases, heartbeats,
#: and every warning or error.
_CONTEXT_RE = re.compile(r" (warning|error) |replication\.role|clock\.|lease|heartbeat|reaper|takeover|leader")
_CONTEXT_LINES_MAX = 80


def log_context(results: dict, logs_dir) -> list[str]:
    """The log lines around a counterexample that names a wall-time window (``log_windows``,
    the retries checker's spurious expiries): every node's and worker's lines of interest in the
    first window, oldest first, each prefixed with its file's name; so that a failure in CI, whose
    store is gone with the machine, says what the processes saw."""
    from pathlib import Path
    for name, r in results.get("checkers", {}).items():
        windows = r.get("log_windows")
        if not windows:
            continue
        w = windows[0]
        lines = []
        for f in sorted(Path(logs_dir).glob("*.log")):
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    t = dt.datetime.fromisoformat(line[:23]).timestamp() * 1000
                except ValueError:
                    continue
                if w["from_ms"] <= t <= w["to_ms"] and _CONTEXT_RE.search(line):
                    lines.append((line[:23], f"{f.stem}: {line[24:][:240]}"))
        lines.sort()
        head = (f"logs around {name}'s first unexplained lease expiry (run {w.get('run')} attempt {w.get('attempt')}, "
                f"worker {w.get('worker')}; wall {w['from_ms']}..{w['to_ms']} ms):")
        shown = [f"  {ts[11:]} {text}" for ts, text in lines]
        if len(shown) > _CONTEXT_LINES_MAX:
            half = _CONTEXT_LINES_MAX // 2
            shown = shown[:half] + [f"  ... {len(shown) - 2 * half} lines ..."] + shown[-half:]
        return [head] + (shown or ["  (no line of interest in that window)"])
    return []


def check_all(data: dict) -> dict:
    results = {}
    for name, fn in CHECKERS.items():
        try:
            r = fn(data)
            if r is None:  # not judged in this run (its nemesis did not run)
                continue
            results[name] = r
        except Exception as e:  # a checker crash is not a pass
            import traceback
            results[name] = _result(UNKNOWN, [f"checker crashed: {e!r}"], note=traceback.format_exc()[-2000:])
    return {"valid": combine(*(r["valid"] for r in results.values())), "checkers": results}


def render_verdict(results: dict, data: dict, run_dir=None) -> str:
    """One screen: the overall verdict, each checker's with its first counterexample, the faults."""
    sched = data.get("schedule") or {}
    lines = [f"raftsched jepsen-style run: seed {sched.get('seed')}, profile {sched.get('profile')}, "
             f"time limit {sched.get('time_limit_s')} s, nemesis {','.join(sched.get('nemeses', [])) or 'none'}"]
    if run_dir is not None:
        lines.append(f"store: {run_dir}")
    kinds: dict[str, int] = {}
    for f in data.get("faults", []):
        if (f.get("fault") or {}).get("harness"):
            continue
        k = f["kind"] + (f"/{f['fault'].get('mode')}" if f["kind"] == "partition" else "") + \
            (f"/{f['fault'].get('offset_ms'):+d}ms" if f["kind"] == "clock" else "") + \
            ("+burst" if (f.get("fault") or {}).get("burst") else "")
        kinds[k] = kinds.get(k, 0) + 1
    lines.append("faults: " + (", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"))
    lines.append("")
    lines.append(f"OVERALL: {results['valid'].upper()}")
    for name, r in results["checkers"].items():
        stats = ", ".join(f"{k}={v}" for k, v in r.get("stats", {}).items())
        lines.append(f"  {name:<15} {r['valid']:<8} {stats}")
        if r["counterexamples"]:
            more = r.get("counterexample_count", len(r["counterexamples"])) - 1
            lines.append(f"      first: {_short(r['counterexamples'][0], 300)}" + (f" (+{more} more in results.json)" if more > 0 else ""))
        elif r.get("note"):
            lines.append(f"      note: {_short(r['note'], 300)}")
    if data.get("notes"):
        lines.append("")
        lines += [f"harness: {n}" for n in data["notes"][:5]]
    lines.append("")
    lines.append(f"replay: .venv/bin/python jepsen-style/run.py --profile {sched.get('profile')} --seed {sched.get('seed')} "
                 f"--time-limit {sched.get('time_limit_s'):g} --nemesis {','.join(sched.get('nemeses', [])) or 'none'}"
                 + ("" if sched.get("fsync", True) else " --no-fsync")
                 if sched.get("time_limit_s") is not None else "")
    if run_dir is not None:
        lines.append(f"replay this schedule exactly (also after generator.py changed): .venv/bin/python jepsen-style/run.py "
                     f"--replay {run_dir}/schedule.json")
    return "\n".join(lines) + "\n"
