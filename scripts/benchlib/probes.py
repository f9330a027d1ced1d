"""What the benchmark reads about a node process and its files, from /proc and the data
directory: resident memory, CPU seconds, file sizes, and the records in a pysyncobj journal.
Standard library only (the state-machine child uses it too)."""
from __future__ import annotations

import os
from pathlib import Path

def rss_kib(pid: int) -> dict:
    """VmRSS and VmHWM (peak) of a process, KiB, from /proc/PID/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return out


def dir_sizes(d: Path) -> dict:
    """Bytes of each file in a node's data dir (journal, dump, logs)."""
    out = {}
    try:
        for p in sorted(d.iterdir()):
            if p.is_file():
                out[p.name] = p.stat().st_size
    except OSError:
        pass
    return out


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int, children: bool = True) -> float | None:
    """CPU seconds a process has used (user + system, its waited-for children included unless
    ``children`` is false), from /proc/PID/stat; None if it cannot be read. CPU per unit of work
    holds on a shared machine where rates do not: a competing process slows the cluster down, it
    does not make a slot or a run cost more CPU (to a first approximation: caches and frequency
    are shared too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime stime, then cutime cstime
        return sum(int(x) for x in fields[11:15 if children else 13]) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == str(pid):
                out.append(int(d))
    return out


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of a node or worker process and of its live children: the run server that
    starts its shell and python runs, whose CPU includes theirs once it has reaped them (None
    if the process is unreadable)."""
    own = cpu_s(pid)
    if own is None:
        return None
    return own + sum(cpu_s(k) or 0.0 for k in children(pid))


def cluster_cpu_s(c) -> float | None:
    """CPU seconds used so far by every node process of cluster ``c`` and its run server, runs
    included (None if one is unreadable)."""
    vals = [tree_cpu_s(p.pid) for p in c.procs.values()]
    return None if any(v is None for v in vals) else sum(vals)


def journal_info(path: Path) -> dict:
    """A pysyncobj journal file (raft.journal): its size on disk, and the records it holds (what
    a node replays at start, on top of its last full dump): their bytes, count and first/last
    index. The live part ends at the last-record offset in its header (pysyncobj/journal.py's
    format 1, or raftsched's with a checksum a record: raftsched/replication/_storage.py); a node cuts the file back to it at each compaction, and code before that let the
    file only grow (its size then a high-water mark)."""
    import mmap
    out: dict = {"file_bytes": None}
    try:
        f = open(path, "rb")
    except OSError:
        return out
    with f:
        size = os.fstat(f.fileno()).st_size
        out["file_bytes"] = size
        if size < 40:
            return out
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as raw:
            _journal_records(raw, out)
    return out


def _journal_records(raw, out: dict) -> None:
    import struct
    try:
        # Header: name (24 bytes), version (8), format (uint32), last-record offset (uint32).
        (version,) = struct.unpack_from("<I", raw, 32)
        (last,) = struct.unpack_from("<I", raw, 36)
        first = 40
        if version not in (1, 0x52530002) or not first <= last <= len(raw):
            return
        off, count, idx0, idx1 = first, 0, None, None
        while off < last:
            (size,) = struct.unpack_from("<I", raw, off)
            idx, _term = struct.unpack_from("<QQ", raw, off + 4)
            idx0 = idx if idx0 is None else idx0
            idx1 = idx
            count += 1
            off += size + 8
        out.update({"records_bytes": last - first, "records": count, "first_index": idx0, "last_index": idx1})
    except struct.error:
        pass
