"""What one fdatasync of a journal-sized write costs on a disk: after an append (the file grows,
as raftsched's journal does), after an overwrite inside a region written with zeros and synced
ahead, and inside a region fallocate'd ahead (unwritten extents).

    .venv/bin/python scripts/measure disk-sync [--dir DIR] [--n 500] [--procs 1] [--gap-ms 0]
                                               [--record 575] [--hogs 0] [--stagger-ms 0]

Each iteration writes a record of ``--record`` bytes (575: a job's PUT in the journal) after the
previous one and the 4-byte end offset at the journal header's place (byte 36), then times one
``os.fdatasync``: the three ways interleaved, iteration by iteration, so that a drift of the
machine's load falls on each. ``--procs K`` runs K processes in lockstep (a barrier before each
iteration: a leader and two followers syncing at once on one disk, as a local three-node cluster
does); ``--stagger-ms`` makes all but the first start that much later (followers start their sync
about half a millisecond after the leader started its own), and the first one's syncs and the
others' are then printed apart. ``--gap-ms`` sleeps before each sync (a node syncs every few ms
during lone writes, not back to back, and on a virtual disk that changes what a sync costs).
``--hogs N`` keeps N CPU-bound processes busy beside it (what a busy machine does to a sync: the
thread that waited for the disk waits for a CPU too). Prints the file system, whether it is ext4
with a journal (jbd2) or without one, the load average, and p50/p90/p99/mean of each way in ms.
docs/benchmarks.md ("Durability") quotes its figures. The files are made in a fresh directory
inside ``--dir`` (default: the system's temporary directory; give a node's data directory's
file system to measure that disk) and removed.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

from measure import Smoke

ARGPARSE = True
SMOKE = [Smoke(("--dir", "{tmp}", "--n", "20", "--procs", "2"), "append")]

WAYS = ("append", "overwrite", "fallocate")
#: Where the journal keeps its end offset (pysyncobj's LAST_RECORD_OFFSET_OFFSET).
END_OFFSET_AT = 36
HEADER = 4096


def _fs_of(path: str) -> str:
    """The file system ``path`` is on, from /proc/self/mounts: type, device and, for ext4,
    whether it has a journal (jbd2)."""
    best, found = "", "unknown"
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return found
    real = os.path.realpath(path)
    for dev, mnt, fstype, opts, *_ in mounts:
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, found = mnt, f"{fstype} on {dev} at {mnt} ({opts})"
            if fstype == "ext4":
                try:
                    with open(f"/sys/fs/ext4/{os.path.basename(dev)}/journal_task") as j:
                        task = j.read().strip()
                    found += ", no journal" if task == "<none>" else f", journal ({task})"
                except OSError:
                    pass
    return found


def _open(path: str, way: str, ahead: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.pwrite(fd, b"\0" * HEADER, 0)
    if way == "overwrite":
        chunk = b"\0" * (1 << 20)
        for off in range(HEADER, HEADER + ahead, len(chunk)):
            os.pwrite(fd, chunk, off)
    elif way == "fallocate":
        os.posix_fallocate(fd, HEADER, ahead)
    os.fsync(fd)
    return fd


def _one(d: str, me: int, n: int, record: int, gap_s: float, stagger_s: float, barrier, out) -> None:
    ahead = n * record + (1 << 20)
    fds = {w: _open(os.path.join(d, f"{w}-{me}"), w, ahead) for w in WAYS}
    dfd = os.open(d, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    rec = b"r" * record
    end = HEADER
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for _ in range(n):
        for w in WAYS:
            if barrier is not None:
                barrier.wait()
            if gap_s:
                time.sleep(gap_s)
            if stagger_s and me:
                until = time.perf_counter() + stagger_s
                while time.perf_counter() < until:  # a sleep this short overshoots by more than it
                    pass
            fd = fds[w]
            os.pwrite(fd, rec, end)
            os.pwrite(fd, (end + record).to_bytes(4, "little"), END_OFFSET_AT)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times[w].append((time.perf_counter() - t0) * 1000)
        end += record
    for fd in fds.values():
        os.close(fd)
    out.put((me, times))


def _hog() -> None:
    while True:
        pass


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/measure disk-sync", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="make the files in a fresh directory inside DIR")
    ap.add_argument("--n", type=int, default=500, help="syncs of each way, per process (default 500)")
    ap.add_argument("--procs", type=int, default=1, help="processes syncing in lockstep (default 1)")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="sleep before each sync (default 0)")
    ap.add_argument("--record", type=int, default=575, help="bytes written before each sync (default 575)")
    ap.add_argument("--hogs", type=int, default=0, help="CPU-bound processes running beside it (default 0)")
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="with --procs: every process but the first starts its write this late (default 0)")
    a = ap.parse_args(argv)
    if a.n < 1 or a.procs < 1 or a.record < 1 or a.hogs < 0 or a.gap_ms < 0 or a.stagger_ms < 0:
        ap.error("--n, --procs and --record must be at least 1, --hogs, --gap-ms and --stagger-ms at least 0")
    d = tempfile.mkdtemp(prefix="disk-sync-", dir=a.dir)
    ctx = multiprocessing.get_context("fork")
    hogs = [ctx.Process(target=_hog, daemon=True) for _ in range(a.hogs)]
    try:
        print(f"file system: {_fs_of(d)}")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for h in hogs:
            h.start()
        barrier = ctx.Barrier(a.procs) if a.procs > 1 else None
        q = ctx.Queue()
        procs = [ctx.Process(target=_one, args=(d, i, a.n, a.record, a.gap_ms / 1000, a.stagger_ms / 1000,
                                                barrier, q)) for i in range(a.procs)]
        for p in procs:
            p.start()
        results = [q.get() for _ in procs]
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            print("disk-sync: a process failed", file=sys.stderr)
            return 1
    finally:
        for h in hogs:
            if h.pid is not None:
                h.kill()
                h.join()
        shutil.rmtree(d, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{a.procs} process(es) in lockstep, {a.n} syncs of each way each, {a.record}-byte records, "
          f"gap {a.gap_ms:g} ms, stagger {a.stagger_ms:g} ms, {a.hogs} CPU hog(s); fdatasync, ms:")
    groups = [("", [t for _, t in results])]
    if a.stagger_ms and a.procs > 1:
        groups = [("first: ", [t for me, t in results if me == 0]), ("others: ", [t for me, t in results if me])]
    for label, group in groups:
        for w in WAYS:
            xs = [x for r in group for x in r[w]]
            print(f"  {label}{w:<10} p50 {_pct(xs, .5):7.3f}  p90 {_pct(xs, .9):7.3f}  p99 {_pct(xs, .99):7.3f}  "
                  f"mean {statistics.mean(xs):7.3f}  (n={len(xs)})")
    return 0
