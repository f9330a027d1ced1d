"""The leader's due index at N jobs, in one process: how long a new leader's index takes to build
and the longest single hold of the replica's lock that takes, then the longest single apply while
every job is put again ROUNDS times (a deploy that puts every job):

    .venv/bin/python scripts/measure due-stall [CODE_DIR] [N] [ROUNDS]

N (default 1,000,000) jobs on ``0 * * * *`` (one slot, one bucket of the index: its worst case),
registered through ``put_jobs`` commands as the bulk endpoint proposes them; then the index built
as the trigger builds it on leading (``Trigger.fill_due_index``: ``due.attach_empty`` and reads of
``node/limits.py due_fill_jobs_per_read`` jobs; code without it: ``due.attach`` in one read);
then ROUNDS (default 3) re-puts of every job (the longest apply, and the apply CPU time a job),
each pushing an entry and leaving one stale. Until the stale entries were swept a push at a time
(core/due.py ``DueWheel.compact``), the apply that crossed the bound rebuilt the index from every
job. The collector is off while it measures (a node
freezes its long-lived state, raftsched/gcpolicy.py; a collection's pause is not the index's).
CODE_DIR (default: this checkout) is put first on sys.path, to measure another checkout.
"""
import gc
import sys
import time

from measure import Smoke, code_first

SMOKE = [Smoke(("2000", "3"), "longest apply")]


def main(argv: list[str]) -> int:
    args = code_first(argv)
    if args is None:
        print(__doc__)
        return 0
    from raftsched.core import commands as C, due, model  # noqa: E402
    from raftsched.core.due import DueIndex  # noqa: E402
    from raftsched.core.state import SchedulerState  # noqa: E402
    try:
        from raftsched.node import limits as node_limits  # noqa: E402
        step = getattr(node_limits, "due_fill_jobs_per_read", None)
    except ImportError:
        step = None
    n = int(args[0]) if args else 1_000_000
    rounds = int(args[1]) if len(args) > 1 else 3
    st = SchedulerState()
    now = 1_800_000_000_000
    nxt = (now // 3_600_000 + 1) * 3_600_000
    spec = model.validate_job("j", {"schedule": {"cron": "0 * * * *"}, "misfire": {"policy": "skip"},
                                    "executor": {"type": "python", "target": "builtins:id"}})
    per_cmd = 80  # what fits a command's bytes with this spec

    def put_all(tag: str) -> tuple[float, float]:
        """The longest apply of a round, and the apply CPU time a job (seconds)."""
        longest = cpu = 0.0
        for i in range(0, n, per_cmd):
            items = [{"name": f"j{k}", "spec": spec, "next": nxt, "cursor": now, "anchor": now, "create_only": False}
                     for k in range(i, min(n, i + per_cmd))]
            data = C.encode(C.put_jobs(now, f"{tag}-{i}", jobs=items))
            t, c = time.perf_counter(), time.process_time()
            res = st.apply_bytes(data)
            longest = max(longest, time.perf_counter() - t)
            cpu += time.process_time() - c
            if not res.get("ok"):
                raise SystemExit(f"put_jobs refused: {res}")
        return longest, cpu / n

    gc.disable()
    _, per_job = put_all("create")
    print(f"{n} jobs put: {1e6 * per_job:.1f} us of apply CPU a job")
    gc.collect()
    gc.freeze()
    index = DueIndex()
    t0 = time.perf_counter()
    if step is not None and hasattr(due, "attach_empty"):
        t = time.perf_counter()
        jobs = due.attach_empty(st, index)  # the records (their names before 2026-12-05)
        longest = time.perf_counter() - t
        for i in range(0, len(jobs), step):
            t = time.perf_counter()
            due.fill(st, index, jobs[i:i + step])
            longest = max(longest, time.perf_counter() - t)
        due.filled(st, index)
        how = f"in reads of {step} jobs"
    else:
        due.attach(st, index)
        longest = time.perf_counter() - t0
        how = "in one read"
    total = time.perf_counter() - t0
    print(f"{n} jobs: index built {how} in {1e3 * total:.0f} ms, the longest hold of the lock {1e3 * longest:.1f} ms")
    for r in range(1, rounds + 1):
        worst, per_job = put_all(f"round{r}")
        size = index.now.size + index.ahead.size
        print(f"re-put {r}: longest apply {1e3 * worst:.1f} ms, {1e6 * per_job:.1f} us of apply CPU a job"
              f" (index entries {size}, {size / n:.2f} a job)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
