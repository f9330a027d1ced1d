"""The checks that make a run fail, and the analysis they need: the slot audit (lost and
duplicated slots in one job's history), replicas that agree, error lines in the nodes' logs, where
the sweep falls behind, and the list of invariant failures."""
from __future__ import annotations

import json
import time

from raftsched.testing.cluster import LocalCluster

from .common import BenchError, iso, iso_ms
from .scenarios.pipeline import problems as pipeline_problems

def slot_audit(runs: list[dict], every_ms: int) -> dict:
    """Lost and duplicated slots in one job's history (runs and records, any order).

    lost: slots on the job's grid between the first and the last slot that are neither a run nor
    inside a record. duplicated: slots that are two runs, or a run and a record, or two records.
    """
    count: dict[int, int] = {}
    for r in runs:
        if r.get("kind") == "manual":
            continue
        lo = r["slot_ms"]
        hi = iso_ms(r["slot_to"]) if r["state"] in ("skipped", "coalesced") and "slot_to" in r else lo
        for s in range(lo, hi + 1, every_ms):
            count[s] = count.get(s, 0) + 1
    if not count:
        return {"slots": 0, "first": None, "last": None, "last_ms": None, "lost": 0, "duplicated": 0,
                "off_grid": 0, "records": 0, "lost_examples": [], "duplicated_examples": []}
    lo, hi = min(count), max(count)
    lost = [s for s in range(lo, hi + 1, every_ms) if s not in count]
    dup = [s for s, n in count.items() if n > 1]
    return {
        "slots": len(count), "first": iso(lo), "last": iso(hi), "last_ms": hi,
        "lost": len(lost), "duplicated": len(dup), "off_grid": sum(1 for s in count if (s - lo) % every_ms),
        "records": sum(1 for r in runs if r["state"] in ("skipped", "coalesced")),
        "lost_examples": [iso(s) for s in lost[:5]], "duplicated_examples": [iso(s) for s in dup[:5]],
    }


def job_pages(c: LocalCluster, i: int, consistent: bool, limit: int = 1000):
    """Every job's view from node i, a page (``limit`` views, in name order) at a time; the first
    page after a barrier when ``consistent``, else every page from the replica as it is
    (``stale=true``: a page needs no barrier through the leader, and a leader change while a
    million are paged fails none)."""
    after = ""
    while True:
        q = f"/v1/jobs?limit={limit}" + (f"&after={after}" if after else "") + (
            ("&consistent=true" if not after else "") if consistent else "&stale=true")
        s, b = c.get(i, q)
        if s != 200:
            raise BenchError(f"GET {q} on node-{i + 1}: {s} {b}")
        yield b["jobs"]
        if not b.get("next"):
            return
        after = b["next"]


def all_jobs(c: LocalCluster, i: int, consistent: bool, keep=None) -> list:
    """Every job's view from node i (``keep(view)`` of each instead, where not None, when given)."""
    out: list = []
    for page in job_pages(c, i, consistent):
        out += page if keep is None else [k for k in map(keep, page) if k is not None]
    return out


def replica_agreement(c: LocalCluster, kept_out: dict | None = None, keep=None) -> dict:
    """Once the cluster is quiet (the same last_applied on every node, twice, 200 ms apart), the
    three replicas must hold the same jobs (every job's full view: cursor, next slot, generation,
    counters), the same number of runs and the same queue depths: compared as a SHA-256 of what
    the API returns. The nodes' views are paged from all of them at once (a thread each), one page
    of each at a time, hashed and dropped: at 1 000 000 jobs, three replicas' views held whole
    took ~17 GB of the benchmark's memory. ``keep(view)`` (None: nothing) of every view is handed
    to the caller in ``kept_out`` ({node index: [kept]}) when it gives one: read once the cluster
    is quiet, the leader's are what a read after a barrier returns."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    def applied():
        sts = [c.status(i) for i in range(c.n)]
        if any(x is None for x in sts):
            return None
        return tuple(x["last_applied"] for x in sts), tuple(x["commit_index"] for x in sts)

    prev = None
    t0 = time.monotonic()
    trace = []
    while True:
        cur = applied()
        trace.append([round(time.monotonic() - t0, 1), cur and list(cur[0])])
        if cur is not None and cur == prev and len(set(cur[0])) == 1:
            break
        if time.monotonic() - t0 > 60:
            raise BenchError(f"replicas did not settle within 60 s (last_applied, commit_index): first "
                             f"{trace[0]}, last {trace[-1]}, {len(trace)} samples")
        prev = cur
        time.sleep(0.2)  # ok-sleep: settle interval inside a deadline loop
    out = {"last_applied": cur[0][0], "settled_after_s": trace[-1][0]}

    def digest(i: int) -> tuple[int, str, list]:
        h = hashlib.sha256()
        n, kept = 0, []
        for page in job_pages(c, i, consistent=False):
            n += len(page)
            for j in page:
                h.update(json.dumps(j, sort_keys=True).encode())
            if keep is not None:
                kept += [k for k in map(keep, page) if k is not None]
        return n, h.hexdigest(), kept

    with ThreadPoolExecutor(c.n) as pool:
        every = list(pool.map(digest, range(c.n)))
    if kept_out is not None:
        kept_out.update((i, kept) for i, (_, _, kept) in enumerate(every))
    digests = {}
    for i in range(c.n):
        n, jobs_hex, _ = every[i]
        h = hashlib.sha256(jobs_hex.encode())
        s_, q = c.get(i, "/v1/queues")
        if s_ != 200:
            raise BenchError(f"replica check: GET /v1/queues on node-{i + 1}: {s_} {q}")
        depths = sorted((x["name"], x["depth"], x["running"], x["dead"]) for x in q["queues"])
        h.update(json.dumps(depths).encode())
        st = c.status(i)
        digests[f"node-{i + 1}"] = {"jobs": n, "runs_total": st["runs"], "queues": depths, "sha256": h.hexdigest()[:16]}
    out["nodes"] = digests
    out["agree"] = len({(d["jobs"], d["runs_total"], d["sha256"]) for d in digests.values()}) == 1
    if not out["agree"]:
        raise BenchError(f"replicas disagree after the burst: {digests}")
    return out


def raft_log_warnings(c: LocalCluster) -> dict:
    """Counts of critical/error lines in each node's log (pysyncobj's 'truncating already-applied
    log entries' among them), with the first example of each kind."""
    out = {}
    for i in range(c.n):
        try:
            text = (c.data_dir(i) / "node.log").read_text(errors="replace")
        except OSError:
            continue
        kinds: dict[str, dict] = {}
        for line in text.splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 4 or parts[1] not in ("critical", "error"):
                continue
            key = parts[3][:40]
            k = kinds.setdefault(key, {"count": 0, "first": line[:300]})
            k["count"] += 1
        if kinds:
            out[f"node-{i + 1}"] = kinds
    return out


def falls_behind_at(ns: list[int], flags: list) -> dict:
    """The smallest N that fell behind, or None with the largest N tested that kept up."""
    for n, f in zip(ns, flags):
        if f:
            return {"n": n, "kept_up_to": max([m for m, g in zip(ns, flags) if m < n and g is False], default=None)}
    tested = [n for n, f in zip(ns, flags) if f is False]
    return {"n": None, "kept_up_to": max(tested, default=None)}


def invariant_failures(res: dict, fire_log_ok: bool) -> list[str]:
    """What makes the run fail besides a scenario error: a lost or duplicated slot, replicas that
    disagree, and a fire log that the code has but that stayed empty."""
    failed = []
    f = res.get("failover") or {}
    b = (res.get("storm") or {}).get("ours") or {}
    if f.get("slots_lost") or f.get("slots_duplicated") or f.get("problems"):
        failed.append("fail-over audit: " + "; ".join(f.get("problems") or []))
    if b.get("replicas") and not b["replicas"].get("agree"):
        failed.append(f"storm: replicas: {b['replicas'].get('error') or 'disagree'}")
    if b.get("lost") or b.get("duplicated") or b.get("jobs_not_past_slot"):
        failed.append(f"storm: lost {b.get('lost')}, duplicated {b.get('duplicated')}, jobs whose cursor did not pass "
                      f"the slot {b.get('jobs_not_past_slot')}")
    failed += pipeline_problems(res.get("pipeline") or {})
    if fire_log_ok:
        if (b.get("fire_log") or {}).get("problem"):
            failed.append("storm fire log: " + b["fire_log"]["problem"])
        for st in ((res.get("sweep") or {}).get("ours") or {}).get("steps", []):
            if not st.get("slots_committed"):
                failed.append(f"sweep N={st['n']}: the fire logs hold no record committed in the window")
    return failed
