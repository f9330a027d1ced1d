"""The scale scenario's in-process figures: one SchedulerState holding N jobs, built through
apply in a subprocess of its own (``python -m benchlib.scenarios.state_machine N``, the nodes'
code first on PYTHONPATH); its memory, snapshot and restore times.

The child imports nothing of this package but what is stdlib-only (common, probes), so it runs
against an exported --git-ref commit that has no raftsched.testing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .. import common
from ..common import BenchError, file_tail, fleet_spec, pct, summary, venv_python
from ..probes import rss_kib

#: The in-process state-machine measurement's repeats: snapshot and restore are timed this many
#: times up to STATE_REPEAT_MAX_N jobs (median and spread), once above.
STATE_REPEATS = 3
STATE_REPEAT_MAX_N = 100_000


def state_machine_child(n: int) -> dict:
    """Runs in a subprocess of its own (``python -m benchlib.scenarios.state_machine N``), with the nodes' code
    (common.CODE_DIR) on PYTHONPATH: builds a SchedulerState holding N jobs the way a node's replica
    does (put_jobs commands of at most command_bytes_max, encoded with core.commands and applied
    with apply_bytes; each job validated with model.validate_job and positioned with
    policy.initial_position, as the API's bulk path does), then times state.snapshot() (what a
    node's dump writer encodes) and SchedulerState().restore(bytes) (what a node loads from its
    dump at start), and reads this process's VmRSS."""
    import gc

    import msgpack

    import raftsched
    from raftsched.core import commands, limits, model, policy, schedule
    from raftsched.core.state import SchedulerState
    gen0 = None
    try:  # the node's garbage collector setting (raftsched/node/limits.py), when the code has one
        from raftsched.node.limits import gc_gen0_threshold as gen0
    except (ImportError, AttributeError):
        try:  # where older code kept it: raftsched/gcpolicy.py, before that raftsched/node/node.py
            from raftsched.gcpolicy import GC_GEN0_THRESHOLD as gen0
        except (ImportError, AttributeError):
            try:
                from raftsched.node.node import GC_GEN0_THRESHOLD as gen0
            except (ImportError, AttributeError):
                pass
    if gen0:
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(gen0, g1, g2)
    pid = os.getpid()
    rss_start = rss_kib(pid)
    state = SchedulerState()
    now = int(time.time() * 1000)
    budget = limits.command_bytes_max - 1024  # the put_jobs envelope
    items_max = getattr(limits, "put_jobs_items_max", 500)
    t_apply = 0.0
    n_cmds = 0
    cmd_bytes = 0

    def flush(items):
        nonlocal t_apply, n_cmds, cmd_bytes
        data = commands.encode(commands.make("put_jobs", now, f"sm-{n_cmds}", jobs=items))
        t = time.perf_counter()
        r = state.apply_bytes(data)
        t_apply += time.perf_counter() - t
        if not r.get("ok"):
            raise RuntimeError(f"put_jobs command {n_cmds} refused: {r}")
        n_cmds += 1
        cmd_bytes += len(data)

    t0 = time.perf_counter()
    items, size = [], 0
    for k in range(n):
        name = f"s-{k}"
        spec = model.validate_job(name, fleet_spec(k))
        anchor, cursor = policy.initial_position(spec["schedule"], now)
        item = {"name": name, "spec": spec, "next": schedule.next_slot_after(spec["schedule"], cursor, anchor),
                "cursor": cursor, "anchor": anchor, "create_only": False}
        isz = len(msgpack.packb(item, use_bin_type=True))
        if items and (size + isz > budget or len(items) >= items_max):
            flush(items)
            items, size = [], 0
        items.append(item)
        size += isz
    if items:
        flush(items)
    del items
    build_s = time.perf_counter() - t0
    rss_built = rss_kib(pid)
    if len(state.jobs) != n:
        raise RuntimeError(f"the state holds {len(state.jobs)} jobs, not {n}")
    repeats = STATE_REPEATS if n <= STATE_REPEAT_MAX_N else 1
    snap_s, restore_s = [], []
    data = b""
    for _ in range(repeats):
        data = b""
        t = time.perf_counter()
        data = state.snapshot()
        snap_s.append(time.perf_counter() - t)
    identical = None
    for r in range(repeats):
        s2 = SchedulerState()
        t = time.perf_counter()
        s2.restore(data)
        restore_s.append(time.perf_counter() - t)
        if r == repeats - 1:
            if len(s2.jobs) != n:
                raise RuntimeError(f"the restored state holds {len(s2.jobs)} jobs, not {n}")
            identical = s2.snapshot() == data
        del s2
    rss_end = rss_kib(pid)
    return {"n": n, "code": str(Path(raftsched.__file__).resolve().parent), "gc_gen0_threshold": gc.get_threshold()[0],
            "due_index": getattr(state, "due_index", None), "job_spec_0": fleet_spec(0),
            "build_s": round(build_s, 2), "apply_s": round(t_apply, 2), "put_jobs_commands": n_cmds, "command_bytes": cmd_bytes,
            "rss_kib_start": rss_start.get("VmRSS"), "rss_kib_built": rss_built.get("VmRSS"),
            "rss_mib_built": round(rss_built.get("VmRSS", 0) / 1024, 1),
            "state_mib": round((rss_built.get("VmRSS", 0) - rss_start.get("VmRSS", 0)) / 1024, 1),
            "peak_mib": round(rss_end.get("VmHWM", 0) / 1024, 1),
            "snapshot_bytes": len(data), "repeats": repeats,
            "snapshot_s": summary(snap_s, 3), "restore_s": summary(restore_s, 3),
            "snapshot_plus_restore_s": round(pct(snap_s, 50) + pct(restore_s, 50), 3),
            "round_trip_identical": identical}


def state_machine(tmp: Path, n: int, timeout_s: float) -> dict:
    """state_machine_child(n) in a subprocess (this module run with the venv's Python, the nodes'
    code first on PYTHONPATH), stopped by its PID on a timeout. Raises BenchError when it fails."""
    argv = [venv_python(), "-m", "benchlib.scenarios.state_machine", str(n)]
    # The nodes' code first, so the child measures it (also an exported --git-ref commit); then
    # this package, which imports nothing of raftsched but what the child asks for.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(common.CODE_DIR), str(common.REPO / "scripts")]))
    log = tmp / f"state-machine-{n}.log"
    t0 = time.monotonic()
    with open(log, "wb") as err:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, cwd=common.CODE_DIR, env=env)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"state machine N={n}: not done after {timeout_s:.0f} s\n{file_tail(log)}") from None
    finally:
        if p.poll() is None:
            p.kill()  # by its PID (Popen.kill)
            p.wait(timeout=10)
    if p.returncode != 0:
        raise BenchError(f"state machine N={n}: exit status {p.returncode}\n{file_tail(log)}")
    try:
        res = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise BenchError(f"state machine N={n}: no JSON on stdout ({e})\n{file_tail(log)}") from None
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print(f"[bench] state machine N={n}: built in {res['build_s']} s, RSS {res['rss_mib_built']} MiB "
          f"(+{res['state_mib']} MiB), snapshot {res['snapshot_bytes']:,} B in {res['snapshot_s']['p50']} s, "
          f"restore {res['restore_s']['p50']} s, round trip identical: {res['round_trip_identical']}", file=sys.stderr)
    return res


if __name__ == "__main__":  # the child of state_machine(): one JSON line on stdout
    print(json.dumps(state_machine_child(int(sys.argv[1]))))
