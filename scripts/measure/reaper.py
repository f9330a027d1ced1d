"""The leader's lease reaper at N live leases, in one process: what it costs the leader and how
late it expires a lease that stopped being renewed:

    .venv/bin/python scripts/measure reaper [CODE_DIR] [N] [SECONDS]

N (default 100,000) jobs each fire one slot into a queue deep enough for all of them, and
acquires of 100 runs lease every one of them (N live leases, as N worker slots of long runs
hold). The first 1,000 are leased with a TTL of 5 s, the rest with 600 s. Then the node's own
``Trigger.reap`` runs on the ticks of a leader that ticks every 7 ms (a fake monotonic clock),
for SECONDS (default 10) of that clock, with the expires it proposes applied at once. It prints:

- the reaper's CPU as a share of one core: its CPU time over the fake clock's seconds (the share
  of the leader's event loop it takes), and the longest single call (what it holds the loop for);
- the longest read of the replica it made (what it holds the replica's lock for: apply waits);
- when the 1,000 short leases were expired: how long after their TTL the first and the last.

The collector is off while it measures (a node freezes its long-lived state,
raftsched/gcpolicy.py). CODE_DIR (default: this checkout) is put first on sys.path, to measure
another checkout.
"""
import asyncio
import gc
import time

from measure import Smoke, code_first

SMOKE = [Smoke(("3000", "6"), "short leases expired")]

SHORT = 1_000
SHORT_TTL_MS = 5_000
LONG_TTL_MS = 600_000
TICK_MS = 7


def main(argv: list[str]) -> int:
    args = code_first(argv)
    if args is None:
        print(__doc__)
        return 0
    from raftsched.clock import FakeClock  # noqa: E402
    from raftsched.core import commands as C, model, policy  # noqa: E402
    from raftsched.core.state import SchedulerState  # noqa: E402
    from raftsched.node.trigger import Trigger  # noqa: E402
    from raftsched.testing.fakes import FakeRaft  # noqa: E402
    n = int(args[0]) if args else 100_000
    seconds = float(args[1]) if len(args) > 1 else 10.0
    short = min(SHORT, n)

    gc.disable()
    st = SchedulerState()
    clock = FakeClock()
    now = clock.now_ms()
    st.apply(C.make("put_queue", now, None, name="q", max_depth=n + 1000, on_full="reject"))
    slot = (now // 1000 + 2) * 1000
    spec = model.validate_job("j", {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"},
                                    "queue": "q", "executor": {"type": "shell", "argv": ["true"]}})
    per_cmd = 80
    for i in range(0, n, per_cmd):
        items = [{"name": f"j{k:07d}", "spec": spec, "next": slot, "cursor": now, "anchor": slot - 86_400_000, "create_only": False}  # (its first slot: one interval after)
                 for k in range(i, min(n, i + per_cmd))]
        res = st.apply(C.put_jobs(now, None, jobs=items))
        if not res.get("ok"):
            raise SystemExit(f"put_jobs refused: {res}")
    clock.advance(slot - now)
    now = clock.now_ms()
    jobs = [st.jobs[nm] for nm in sorted(st.jobs)]
    plans = [policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], now, j["gen"], j["name"]) for j in jobs]
    for i in range(0, n, 400):
        res = st.apply(C.fire(now, entries=plans[i:i + 400]))
        if not res.get("ok"):
            raise SystemExit(f"fire refused: {res}")
    leased = 0
    while leased < n:
        ttl = SHORT_TTL_MS if leased < short else LONG_TTL_MS
        want = min(100, (short if leased < short else n) - leased)
        res = st.apply(C.make("acquire", now, None, worker=f"w{leased // 100}", queues=None, max=want, ttl=ttl))
        got = len(res.get("runs") or ())
        if not got:
            raise SystemExit(f"acquire granted nothing at {leased} leased: {res}")
        leased += got
    short_ids = {r for r in st._running_ids if st.runs[r]["ttl"] == SHORT_TTL_MS}
    print(f"{n} live leases ({len(short_ids)} with a TTL of {SHORT_TTL_MS // 1000} s)")
    gc.collect()
    gc.freeze()

    raft = FakeRaft(st)
    longest_read = 0.0
    real_read = raft.read

    def read(fn, *a):
        nonlocal longest_read
        t = time.perf_counter()
        try:
            return real_read(fn, *a)
        finally:
            longest_read = max(longest_read, time.perf_counter() - t)

    raft.read = read
    trig = Trigger(raft, clock, "n1")
    expired_at: dict[str, float] = {}
    start = clock.monotonic_s()
    cpu = longest = 0.0

    async def run() -> None:
        nonlocal cpu, longest
        while clock.monotonic_s() - start < seconds:
            t, c = time.perf_counter(), time.process_time()
            await trig.reap(clock.now_ms())
            cpu += time.process_time() - c
            longest = max(longest, time.perf_counter() - t)
            for r in list(short_ids):
                if st.runs[r]["state"] != "running":
                    expired_at[r] = clock.monotonic_s() - start
                    short_ids.discard(r)
            clock.advance(TICK_MS)

    asyncio.run(run())
    print(f"reaper: {100 * cpu / seconds:.1f} % of one core over {seconds:g} s of a leader ticking every "
          f"{TICK_MS} ms; longest call {1000 * longest:.1f} ms; longest read of the replica {1000 * longest_read:.1f} ms")
    if expired_at:
        late = sorted(expired_at.values())
        print(f"short leases expired: {len(late)} of {len(late) + len(short_ids)}, "
              f"{late[0] - SHORT_TTL_MS / 1000:.2f} s to {late[-1] - SHORT_TTL_MS / 1000:.2f} s after their TTL")
    else:
        print(f"short leases expired: none of {len(short_ids)} in {seconds:g} s")
    return 0
