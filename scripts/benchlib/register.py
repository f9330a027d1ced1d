"""Registering jobs through the API, the one registrar of the benchmark and of
scripts/measure bench-register: the bulk endpoint when the nodes have it (probed once per cluster),
else PUT per job with CONCURRENCY requests in flight; every request with an Idempotency-Key,
503 and 504 retried with it."""
from __future__ import annotations

import asyncio
import json
import sys
import time

from .common import BenchError, summary
from .harness import BenchCluster, check_alive, node_log_excerpt

CONCURRENCY = 32
#: The bulk registration endpoint (body {"jobs": {name: spec}}); absent (404/405) -> PUT per job.
BULK_PATH = "/v1/jobs:batch"
#: A bulk request: well under the endpoint's limits (limits.batch_jobs_max, batch_request_bytes_max).
BULK_BODY_BYTES_MAX = 2 * 1024 * 1024
BULK_JOBS_MAX = 2000
BULK_CONCURRENCY = 4


def _chunks(items: list[tuple[str, dict]], jobs_max: int = BULK_JOBS_MAX) -> list[list[tuple[str, dict]]]:
    """Bulk request bodies: at most ``jobs_max`` jobs and BULK_BODY_BYTES_MAX bytes each."""
    out, cur, size = [], [], 20
    for name, spec in items:
        n = len(json.dumps(spec)) + len(name) + 8
        if cur and (len(cur) >= jobs_max or size + n > BULK_BODY_BYTES_MAX):
            out.append(cur)
            cur, size = [], 20
        cur.append((name, spec))
        size += n
    if cur:
        out.append(cur)
    return out


def _bulk_errors(body) -> list[str]:
    """Per-job refusals in a bulk answer, whatever its exact shape: an "errors" list or mapping,
    or per-job results carrying a status >= 400."""
    if not isinstance(body, dict):
        return []
    errs = body.get("errors")
    if isinstance(errs, dict):
        return [f"{k}: {v}" for k, v in errs.items()]
    if isinstance(errs, list):
        return [str(e)[:300] for e in errs]
    res = body.get("results") or body.get("jobs")
    if isinstance(res, dict):
        return [f"{k}: {v}" for k, v in res.items() if isinstance(v, dict) and int(v.get("status", 200)) >= 400]
    if isinstance(res, list):
        return [str(v)[:300] for v in res if isinstance(v, dict) and int(v.get("status", 200)) >= 400]
    return []


def register_jobs(c: BenchCluster, i: int, items: list[tuple[str, dict]], method: str = "auto",
                  deadline_s: float | None = None, concurrency: int = CONCURRENCY,
                  bulk_concurrency: int = BULK_CONCURRENCY, bulk_jobs_max: int = BULK_JOBS_MAX,
                  key_prefix: str = "bench") -> dict:
    """Register (name, spec) pairs through node i: the one registrar of this script.

    ``method``: "auto" tries the bulk endpoint (BULK_PATH, body {"jobs": {name: spec}}) with the
    first chunk and keeps using it if the node has it; on 404/405 (or any other refusal of the
    probe) it registers with PUT /v1/jobs/{name}, CONCURRENCY requests in flight. "put" forces PUT,
    "bulk" fails without the endpoint. The probe's outcome is remembered on the cluster. Every
    request carries an Idempotency-Key; 503 and 504 are retried with it.

    Returns jobs/s, the slowest and fastest whole second, per-request latency, statuses and errors,
    ``method`` ("bulk" or "put") and ``incomplete`` when ``deadline_s`` passed first.

    ``concurrency`` (PUT) and ``bulk_concurrency`` (bulk) are the requests in flight,
    ``bulk_jobs_max`` the jobs per bulk request, and ``key_prefix`` starts every Idempotency-Key
    (a run that registers the same names twice must use another prefix)."""
    return asyncio.run(_register_async(c, i, items, method, deadline_s, concurrency, bulk_concurrency,
                                       bulk_jobs_max, key_prefix))


async def _register_async(c: BenchCluster, i: int, items, method: str, deadline_s, concurrency: int,
                          bulk_concurrency: int, bulk_jobs_max: int, key_prefix: str) -> dict:
    import aiohttp

    base = c.url(i)
    headers = {"Authorization": f"Bearer {c.token}"}
    lat, done_at, statuses, errors = [], [], {}, []
    retries = 0
    notes = []
    t0 = time.perf_counter()
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    registered = 0

    async def send(session, verb, path, body, key):
        """One request, retried on 503/504 with the same key: (status, parsed body, latency ms)."""
        nonlocal retries
        for attempt in range(6):
            a = time.perf_counter()
            async with session.request(verb, base + path, json=body, headers={**headers, "Idempotency-Key": key}) as r:
                raw = await r.read()
                s = r.status
            statuses[s] = statuses.get(s, 0) + 1
            if s in (503, 504) and attempt < 5:
                retries += 1
                await asyncio.sleep(0.2 * (attempt + 1))  # backoff before a retry with the same key
                continue
            break
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw[:300].decode(errors="replace")
        return s, parsed, (time.perf_counter() - a) * 1000

    def account(n_jobs, s, body, ms, what):
        nonlocal registered
        lat.append(ms)
        done_at.append((time.time(), n_jobs))
        if s not in (200, 201, 207):
            errors.append(f"{what}: {s} {str(body)[:300]}")
            return
        errs = _bulk_errors(body) if n_jobs > 1 else []
        errors.extend(errs[:10])
        registered += n_jobs - len(errs)

    conn = aiohttp.TCPConnector(limit=max(concurrency, bulk_concurrency))
    used = "put"
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        todo = list(items)
        if method in ("auto", "bulk") and c.bulk_path is not False and todo:
            chunks = _chunks(todo, bulk_jobs_max)
            s, body, ms = await send(session, "POST", BULK_PATH, {"jobs": dict(chunks[0])}, f"{key_prefix}-bulk-{chunks[0][0][0]}")
            if s in (200, 201, 207):
                c.bulk_path = BULK_PATH
                used = "bulk"
                account(len(chunks[0]), s, body, ms, f"POST {BULK_PATH}")
                it = iter(chunks[1:])

                async def bulk_worker():
                    for ch in it:
                        if deadline is not None and time.monotonic() > deadline:
                            return
                        s, body, ms = await send(session, "POST", BULK_PATH, {"jobs": dict(ch)}, f"{key_prefix}-bulk-{ch[0][0]}")
                        account(len(ch), s, body, ms, f"POST {BULK_PATH} ({ch[0][0]}..)")

                await asyncio.gather(*(bulk_worker() for _ in range(bulk_concurrency)))
                todo = []
            else:
                c.bulk_path = False
                statuses.clear()  # the probe's status is a note, not a registration outcome
                notes.append(f"POST {BULK_PATH} answered {s}: {str(body)[:200]}; registered with PUT instead")
                if method == "bulk":
                    raise BenchError(notes[-1])
        if todo:
            it2 = iter(todo)

            async def put_worker():
                for name, spec in it2:
                    if deadline is not None and time.monotonic() > deadline:
                        return
                    s, body, ms = await send(session, "PUT", f"/v1/jobs/{name}", spec, f"{key_prefix}-{name}")
                    account(1, s, body, ms, name)

            await asyncio.gather(*(put_worker() for _ in range(concurrency)))
    total = time.perf_counter() - t0
    per_sec: dict[int, int] = {}
    for t, n in done_at:
        per_sec[int(t)] = per_sec.get(int(t), 0) + n
    secs = sorted(per_sec)
    full_secs = [per_sec[s] for s in secs[1:-1]]  # whole seconds only (the first and last are partial)
    return {"method": used, "notes": notes, "n": len(items), "registered": registered,
            "incomplete": registered < len(items) and not errors,
            "seconds": round(total, 2), "jobs_per_s": round(registered / total, 1) if total > 0 else None,
            "per_whole_second": {"min": min(full_secs), "max": max(full_secs)} if full_secs else None,
            "per_second_series": [per_sec[s] for s in secs],
            "requests": len(lat), "latency_ms": summary(lat, 1), "statuses": statuses, "retries_503_504": retries,
            "errors": errors[:10], "error_count": len(errors), "ended_at": time.time()}


def register_checked(c: BenchCluster, i: int, items, what: str, method: str = "auto", deadline_s: float | None = None,
                     expect_jobs: int | None = None) -> dict:
    """register_jobs, then fail the scenario on any error, and check that node i holds
    ``expect_jobs`` jobs (its own replica: a write answers once applied on the node it went to)."""
    t0 = time.monotonic()
    reg = register_jobs(c, i, items, method, deadline_s)
    check_alive(c, range(c.n))
    if reg["error_count"]:
        raise BenchError(f"{what}: {reg['error_count']} registration errors: {reg['errors']}\n" + node_log_excerpt(c, i))
    if reg["incomplete"]:
        raise BenchError(f"{what}: registered {reg['registered']} of {reg['n']} jobs in {deadline_s} s "
                         f"({reg['jobs_per_s']} jobs/s, {reg['method']}); the run's time budget is spent")
    if expect_jobs is not None:
        st = c.status(i) or {}
        if st.get("jobs") is not None and st["jobs"] < expect_jobs:
            raise BenchError(f"{what}: node-{i + 1} holds {st['jobs']} jobs after registration, expected {expect_jobs}")
    print(f"[bench] {what}: registered {len(items)} jobs in {time.monotonic() - t0:.1f} s ({reg['jobs_per_s']} jobs/s, "
          f"{reg['method']}{'; ' + reg['notes'][0] if reg['notes'] else ''})", file=sys.stderr)
    return reg


def bulk_available(c: BenchCluster, i: int) -> bool:
    """Whether node i has the bulk endpoint: probed with an empty request body once per cluster
    (404/405 = absent; any other answer, e.g. 422 for an empty batch, = present)."""
    if c.bulk_path is None:
        s, _ = c.call(i, "POST", BULK_PATH, {"jobs": {}})
        c.bulk_path = False if s in (404, 405) else BULK_PATH
    return bool(c.bulk_path)
