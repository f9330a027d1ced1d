"""Apply cost per slot and per run, in one process, without a network:

    .venv/bin/python scripts/measure profile-apply [CODE_DIR] sweep|e2e N TICKS

Registers N interval jobs (every_s 1) in one SchedulerState with the node's gc threshold and
times, per tick after the first, applying the tick's fire commands (decode included), and in
``e2e`` mode also acquiring every run (acquire, max 32) and completing it (complete_many of 32).
``sweep`` is bench.py's sweep (history 1, staggered slots, runs left queued); ``e2e`` its e2e
(history 43, aligned slots, runs acquired and completed). Prints µs per slot / per run and the
first 16 hex digits of the final state hash. CODE_DIR (default: this checkout) is put first on
sys.path, to compare another checkout (``git worktree add /tmp/base HEAD``) on the same run.
``FAST_PATHS=0`` turns off the apply fast paths (SchedulerState._fast_paths): the hash must not
change. ``QUEUE_DEPTH=n`` bounds the queue (default 1,000,000; ``sweep`` keeps every run queued,
so a depth under N * TICKS makes the later ticks drop their queue's oldest run for every slot).
``AHEAD=ms`` plans each job's slots up to that far past the tick, ticks every 1000 + ms: with
1000, an entry carries two slots, as the trigger's fire_ahead_span_ms made for every_s: 1 jobs
until 2026-12-04 (3000 and four slots since).
Every replica applies every command, so a three-node cluster pays these three times.

``PER_TICK=1`` prints each tick's fire µs per slot to stderr (a history's trim scans come every
limits.history_trim_scan_slack slots: with ``sweep``, at every fourth tick of AHEAD=3000), and the
longest single fire command's apply in it (every replica stalls that long at once).

``OTHER=1`` applies the acquires as a replica of another node than the one that proposed them
(``by``): the same leases, no grants built (docs/benchmarks.md).

``TYPES=python,...`` makes ``e2e``'s acquires those of a worker of these executor types only
(``raftsched worker --executors``, ``--app``), the jobs being python.

``FLEET=1`` makes ``e2e`` what bench.py's fleet_e2e asks of the nodes: the jobs an SDK App's
(labels and a placement on the app's workers), the worker registered with the app's label and
dedicated to it, acquires of up to 100 python runs, and each complete_many a remote worker's
(``own``, 100 outcomes). Every complete_many is built as the node builds it (commands.complete_many,
with ``worker``).

``MEMORY=1`` also prints the resident memory the ticks added, per run the state holds (its map,
attempt records, id, integers, its place in the run map and its history, and its share of the
answers the state keeps by request id, as every complete_many has one; read from
/proc/self/status after a full collection), the seconds the final state's snapshot takes to
encode and to restore, and the resident memory the restored copy adds.

``INSTRUCTIONS=fire|acquire|complete`` counts instead of timing: the script runs itself again
under valgrind's callgrind (``apt-get install valgrind``), which counts the instructions executed
inside that phase's applies only, and prints instructions per slot (fire) or per run. Unlike a
time on a shared machine, the count is the same on every run of the same code and arguments, so
a change of a few per cent shows (docs/benchmarks.md, "CPU per slot and per run"). About 50
times slower than timing: ``sweep 1000 6`` takes ~20 s.
"""
import functools
import gc
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

from measure import ROOT, Smoke

SMOKE = [Smoke(("sweep", "300", "3"), "us/slot", env=(("AHEAD", "1000"), ("QUEUE_DEPTH", "500"))),
         Smoke(("e2e", "200", "3"), "us/run", env=(("FAST_PATHS", "0"),))]


#: The phases INSTRUCTIONS may count, and set in the child run under callgrind.
_PHASES = ("fire", "acquire", "complete")
_CHILD = "RAFTSCHED_PROFILE_APPLY_COUNTED"


def _count_instructions(argv: list[str], phase: str) -> int:
    """Run this script again under callgrind, collecting only inside ``functools.reduce`` (the
    child applies the counted phase's commands through it, and nothing else calls it), and print
    the instructions per slot or run."""
    if phase not in _PHASES:
        print(f"INSTRUCTIONS must be one of {', '.join(_PHASES)}", file=sys.stderr)
        return 2
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("instructions: not counted (valgrind is not installed: apt-get install valgrind)")
        return 0
    entry = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "measure")
    env = dict(os.environ, **{_CHILD: phase})
    p = subprocess.run([valgrind, "--tool=callgrind", "--toggle-collect=functools_reduce",
                        "--callgrind-out-file=/dev/null", sys.executable, entry, "profile-apply", *argv],
                       env=env, capture_output=True, text=True)
    collected = re.search(r"Collected : (\d+)", p.stderr)
    counted = re.search(r"counted (\d+)", p.stdout)
    if p.returncode != 0 or collected is None or counted is None or not int(counted.group(1)):
        print(p.stdout + p.stderr[-2000:], file=sys.stderr)
        return 1
    unit = "slot" if phase == "fire" else "run"
    print(f"{phase} {int(collected.group(1)) / int(counted.group(1)):.0f} instructions/{unit} "
          f"({counted.group(1)} {unit}s counted) {p.stdout.strip()}")
    return 0


def main(argv: list[str]) -> int:
    phase = os.environ.get("INSTRUCTIONS")
    if phase and not os.environ.get(_CHILD):
        return _count_instructions(list(argv), phase)
    counted = os.environ.get(_CHILD)
    # The counted phase's applies go through functools.reduce (callgrind collects inside it only).
    reduce = functools.reduce

    def through(phase_: str, apply, items: list) -> list:
        if counted == phase_:
            return reduce(lambda acc, d: acc + [apply(d)], items, [])
        return [apply(d) for d in items]
    args = list(argv)
    code = args.pop(0) if args and args[0] not in ("sweep", "e2e") else ROOT
    sys.path.insert(0, code)
    from raftsched.core import commands as C, model, policy  # noqa: E402
    from raftsched.core.state import SchedulerState  # noqa: E402

    mode, N, TICKS = (args + ["sweep", "20000", "8"][len(args):])[:3]
    N, TICKS = int(N), int(TICKS)
    AHEAD = int(os.environ.get("AHEAD", 0))
    # Entries a fire command: as many as fit its bytes (an entry carries 1 + AHEAD/1000 slots).
    _CHUNK = 400 if AHEAD < 2000 else 200
    TYPES = os.environ["TYPES"].split(",") if os.environ.get("TYPES") else None
    gc.set_threshold(20_000, *gc.get_threshold()[1:])  # node/limits.py gc_gen0_threshold
    st = SchedulerState()
    try:  # the leader's due index, attached as its trigger does (code before core/due.py kept one built in)
        from raftsched.core.due import DueIndex  # noqa: E402
        st.due = DueIndex()
        pop_due = lambda t, n: st.due.pop(st.jobs, t, n)  # noqa: E731
    except ImportError:
        pop_due = st.pop_due
    if os.environ.get("FAST_PATHS") == "0":
        st._fast_paths = False
    now = 1_800_000_000_000
    sweep = mode == "sweep"
    raw = {"schedule": {"every_s": 1}, "executor": {"type": "python", "target": "builtins:id"},
           "misfire": {"policy": "fire_all"}, "queue": "q", "history": 1 if sweep else 43}
    fleet = os.environ.get("FLEET") == "1" and not sweep
    other = os.environ.get("OTHER") == "1"
    if other:  # this replica is not the acquires' proposer's (core/leases.py apply_acquire: no grants built)
        st.answers_for = "node-2"
    batch = 100 if fleet else 32
    if fleet:  # what an SDK App's job is (benchlib/noop_app.py), and its worker (raftsched worker --app)
        app = {"raftsched.app": "bench-noop"}
        raw.update(labels=app, placement={"labels": app})
        TYPES = ["python"]
        hello = st.apply(C.make("worker_hello", now, None, worker="w", kind="remote", labels=app, slots=100,
                                executors=TYPES, queues=["q"], dedicated=["raftsched.app"]))
        assert hello["ok"], hello
    st.apply(C.make("put_queue", now, None, name="q", max_depth=int(os.environ.get("QUEUE_DEPTH", 10**6)), on_full="drop_oldest" if sweep else "reject"))
    spec = model.validate_job("j", raw)
    for i in range(N):
        off = i * 1000 // N if sweep else 0
        st.apply_bytes(C.encode(C.make("put_job", now, f"r{i}", name=f"j{i}", spec=spec, next=now + 1000 + off,
                                       cursor=now, anchor=now + off)))
    rss0 = _rss_mib() if os.environ.get("MEMORY") else 0.0
    tf = ta = tc = 0.0
    nf = na = nc = nreq = 0
    for k in range(1, TICKS + 1):
        t_ms = now + k * (1000 + AHEAD)
        jobs = pop_due(t_ms, 10**7)
        plans = [policy.plan_fire_compact(j["spec"], j["anchor"], j["cursor"], t_ms, j["gen"], j["name"], AHEAD)
                 for j in jobs]
        datas = [C.encode(C.make("fire", t_ms, None, entries=plans[i:i + _CHUNK])) for i in range(0, len(plans), _CHUNK)]
        t0 = time.perf_counter()
        longest = 0.0
        if counted == "fire" and k > 1:
            through("fire", st.apply_bytes, datas)
        else:
            for d in datas:
                t1 = time.perf_counter()
                st.apply_bytes(d)
                longest = max(longest, time.perf_counter() - t1)
        if os.environ.get("PER_TICK"):
            print(f"tick {k}: fire {1e6 * (time.perf_counter() - t0) / max(1, sum(len(p[5]) for p in plans)):.2f}us/slot,"
                  f" longest command {1e3 * longest:.1f} ms", file=sys.stderr)
        if k > 1:  # the first tick's entries carry two slots (the general path)
            tf += time.perf_counter() - t0
            nf += sum(len(p[5]) for p in plans)
        if sweep:
            continue
        got = []
        acq = C.encode(C.acquire(t_ms + 5, worker="w", queues=None, max=batch, ttl=30_000, types=TYPES, by="node-1")
                       if other else
                       C.make("acquire", t_ms + 5, None, worker="w", queues=None, max=batch, ttl=30_000, types=TYPES))
        while True:
            before = len(st._running_ids)
            t0 = time.perf_counter()
            r = through("acquire", st.apply_bytes, [acq])[0]
            ta += time.perf_counter() - t0
            leased = len(st._running_ids) - before if other else len(r["runs"])
            if not leased:
                break
            na += leased
            got.extend(r["runs"])
        if other:  # the runs it leased, as the proposer's answer named them
            got = [{"id": rid, "token": st.runs[rid]["fencing_token"]} for rid in st._running_ids]
        for i in range(0, len(got), batch):
            results = [{"run": g["id"], "token": g["token"], "success": True} for g in got[i:i + batch]]
            # As the node writes it (commands.complete_many: outcomes as rows since 2026-12-05),
            # with a request id of a uuid's length (the state keeps its answer: I7).
            nreq += 1
            d = C.encode(C.complete_many(t_ms + 10, f"{nreq:032x}", results=results, worker="w", own=fleet))
            t0 = time.perf_counter()
            through("complete", st.apply_bytes, [d])
            tc += time.perf_counter() - t0
        nc += len(got)
    out = f"fire {1e6 * tf / nf:.2f}us/slot"
    if not sweep:
        out += f" acquire {1e6 * ta / max(na, 1):.2f}us/run complete {1e6 * tc / max(nc, 1):.2f}us/run"
    if counted:
        out = f"counted {dict(fire=nf, acquire=na, complete=nc)[counted]}"
    if os.environ.get("MEMORY"):
        gc.collect()
        added = _rss_mib() - rss0
        t0 = time.perf_counter()
        data = st.snapshot()
        t1 = time.perf_counter()
        gc.collect()
        rss1 = _rss_mib()
        again = SchedulerState()
        again.restore(data)
        t2 = time.perf_counter()
        gc.collect()
        restored = _rss_mib() - rss1
        del again
        out += (f" memory +{added:.0f} MiB ({added * 1048576 / max(1, len(st.runs)):.0f} bytes a run)"
                f" snapshot {t1 - t0:.2f} s restore {t2 - t1:.2f} s ({len(data)} bytes),"
                f" the restored state +{restored:.0f} MiB")
    print(out, "runs", len(st.runs), "hash", hashlib.sha256(st.snapshot()).hexdigest()[:16])
    return 0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
