"""The CLI's backfill and bulk dead-letter subcommands (``raftsched backfill``, ``backfills``,
``backfill-cancel`` ..., ``requeue --all-matching``, ``purge --all-matching``): the Client's calls,
and with ``--wait`` a progress bar on stderr (a terminal only) until the operation ends, then a
final table. A
call's error ends the command; cli._with_client prints it (cli_output.print_error)."""
from __future__ import annotations

import sys

from .cli_output import output_format, show
from .client import Client
from .core.bodies import json_loads
from .core.errors import BadRequest
from .core import limits
from .core.errors import RaftschedError

BAR_WIDTH = 30
#: Runs of a job read for the final table: every run it has (the API's bound on ``limit``).
JOB_RUNS_ALL = limits.history_per_job_max + limits.queue_depth_max


class UsageError(Exception):
    """A flag's value the command cannot use: said on stderr, exit status 2 (docs/api.md)."""


def read_text(path: str) -> str:
    """A file's text, or stdin's for ``-``. :raises OSError: :raises UnicodeDecodeError:"""
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def json_arg(text: str, flag: str):
    """A JSON flag's value (``--payload``): JSON text, or ``@FILE`` for a file's (``@-``: stdin),
    refused when an object names a key twice (as a spec file is: core/bodies.py).
    :raises UsageError: naming the flag (and the file)."""
    where = flag
    if text.startswith("@"):  # (no JSON text starts with @)
        path = text[1:]
        where = f"{flag} {text}"
        try:
            text = read_text(path)
        except OSError as e:
            raise UsageError(f"{where}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{where}: not UTF-8 text (give a JSON file)") from None
    try:
        return json_loads(text)
    except BadRequest as e:  # (a key twice: the message says malformed JSON)
        raise UsageError(f"{where}: {e.message}") from None
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{where}: malformed JSON: {e}") from None


def progress_line(v: dict) -> str:
    """One line of progress: a bar of the slots (dead runs) handled, and the runs' counts."""
    p = v["progress"]
    made = p.get("created", p.get("requeued", p.get("purged", 0)))
    handled = made + p["left_out"]
    total = max(p["planned"], handled, 1)
    filled = round(BAR_WIDTH * handled / total)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    if v["kind"] == "purge":
        counts = f"purged {made}"
    else:
        done = p.get("succeeded", 0)
        failed = p.get("failed", 0) + p.get("dead", 0)
        counts = f"created {made} running {p.get('running', 0) + p.get('queued', 0)} done {done} failed {failed}"
    state = v["state"] + (f"; {v['waiting_for']}" if v.get("waiting_for") else "")  # (no worker may take its run)
    return f"{v['id']} [{bar}] {handled}/{p['planned']} {counts} left out {p['left_out']} ({state})"


def final_table(v: dict, runs: list[dict]) -> str:
    """The table printed when a waited-for operation ends: its counts, and a backfill's runs."""
    p = v["progress"]
    lines = [f"{v['kind']} {v['id']}" + (f" of job {v['job']}" if v["job"] else "") + f": {v['state']}"
             + (f" ({v['reason']})" if v.get("reason") else "")]
    if runs:
        lines.append(f"{'slot':<26}{'state':<11}{'attempt':<9}run")
        for r in sorted(runs, key=lambda r: r["slot_ms"]):
            lines.append(f"{r['slot']:<26}{r['state']:<11}{str(r.get('attempt')):<9}{r['id']}")
    counts = {k: v2 for k, v2 in p.items() if k not in ("left_out_reasons",) and v2}
    lines.append("counts: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    if p["left_out_reasons"]:
        lines.append("left out: " + ", ".join(f"{k} {n}" for k, n in p["left_out_reasons"].items()))
    return "\n".join(lines)


def _wait(c: Client, view: dict) -> int:
    """Poll until the operation ends, with a progress bar on stderr when it is a terminal (a
    pipe or a log gets none: the final table says how it ended)."""
    tty = sys.stderr.isatty()
    last = [""]
    paused = [False]

    def progress(v):
        if v["state"] == "paused" and not paused[0]:
            # It makes no new run until it is resumed: say so once (a pipe or a log too), or a
            # pause by hand would look like a command that hangs.
            if tty and last[0]:
                sys.stderr.write("\n")
            print(f"raftsched: {v['id']} is paused ({v.get('reason') or 'no reason given'}): it makes no new run "
                  f"until it is resumed ('raftsched backfill-resume {v['id']}'; a pause for a full queue ends by "
                  "itself); still waiting (interrupting stops the wait, not the operation)", file=sys.stderr)
        paused[0] = v["state"] == "paused"
        if not tty:
            return
        line = progress_line(v)
        sys.stderr.write("\r" + line.ljust(len(last[0])))
        sys.stderr.flush()
        last[0] = line
    end = c.wait_backfill(view["id"], on_progress=progress)
    if tty:
        sys.stderr.write("\n")
    runs = []
    if end["kind"] == "backfill":
        try:
            hist = c.runs(end["job"], limit=JOB_RUNS_ALL)["runs"]
            runs = [r for r in hist if r.get("backfill") == end["id"]]
        except RaftschedError:
            pass  # the job is gone: the counts say what happened
    if output_format() == "table":
        print(final_table(end, runs))
    else:  # -o json / yaml, or a pipe: the operation as it ended, and a backfill's runs
        show(dict(end, runs=runs) if end["kind"] == "backfill" else end)
    return 0 if end["state"] == "done" else 1


def _backfill(a, c: Client) -> int:
    try:
        payload = {} if a.payload is None else {"payload": json_arg(a.payload, "--payload")}
    except UsageError as e:
        print(f"raftsched: {e}", file=sys.stderr)
        return 2
    res = c.backfill(a.job, a.from_, a.to, reprocess=a.reprocess, order=a.order,
                     max_concurrent=a.max_concurrent, rate_per_s=a.rate, max_slots=a.max_slots,
                     overlap=a.overlap, dry_run=a.dry_run, backfill_id=a.id, cascade=a.cascade,
                     upstream=a.upstream, **payload)
    if a.dry_run or not a.wait:
        return show(res)
    return _wait(c, res)


def _bulk(action: str):
    def run(a, c: Client) -> int:
        if not a.all_matching and not a.all:
            if not a.run:
                print(f"raftsched {action}: give a RUN, --all-matching with filters, or --all", file=sys.stderr)
                return 2
            call = c.dlq_requeue if action == "requeue" else c.dlq_delete
            return show(call(a.run))
        if a.run:
            what = "--all takes every dead run" if a.all else "--all-matching selects by filters"
            print(f"raftsched {action}: {what}; give no RUN", file=sys.stderr)
            return 2
        if not a.all and all(v is None for v in (a.queue, a.job, a.error, a.dead_from, a.dead_to)):
            print(f"raftsched {action}: no filter would take every dead run of every queue; give one (--queue, "
                  "--job, --error, --dead-from, --dead-to), or --all to mean that", file=sys.stderr)
            return 2
        kw = dict(queue=a.queue, job=a.job, error=a.error, dead_from=a.dead_from, dead_to=a.dead_to,
                  max_count=a.max, rate_per_s=a.rate, dry_run=a.dry_run, op_id=a.id, all_runs=a.all)
        if action == "requeue":
            res = c.dlq_requeue_matching(max_concurrent=a.max_concurrent, **kw)
        else:
            res = c.dlq_purge_matching(**kw)
        if a.dry_run or not a.wait:
            return show(res)
        return _wait(c, res)
    return run


def _backfills(a, c: Client) -> int:
    return show(c.get_backfill(a.id) if a.id else c.backfills(a.kind, a.job, a.state))


def add_commands(client) -> None:
    """Add the subcommands through cli.main's ``client(name, help, call, run=)``."""
    b = client("backfill", "run a job for the slots of a past range (docs/backfill.md)", run=_backfill)
    b.add_argument("job")
    b.add_argument("--from", dest="from_", metavar="FROM", required=True, help="ISO time: the range is [FROM, TO)")
    b.add_argument("--to", required=True, help="ISO time, not after now")
    b.add_argument("--reprocess", choices=("missing", "failed", "all"), help="which slots (default: missing)")
    b.add_argument("--order", choices=("oldest", "newest"), help="default: oldest")
    b.add_argument("--max-concurrent", type=int,
                   help=f"its runs queued or running at once (default {limits.backfill_concurrent_default})")
    b.add_argument("--rate", type=float, help="runs it starts per second at most")
    b.add_argument("--max-slots", type=int,
                   help=f"refuse a range of more slots (default {limits.backfill_max_slots_default})")
    b.add_argument("--overlap", choices=("allow", "forbid"), help="forbid: wait while another run of the job is active")
    b.add_argument("--cascade", choices=("none", "children"),
                   help="children: the jobs that run after it (pipelines) follow each slot, as its runs "
                        "(default none)")
    b.add_argument("--upstream", choices=("wait", "ignore"),
                   help="ignore: a job that runs after others (pipelines) runs these slots whatever its parents "
                        "did for them; without it, such a backfill is refused (backfill the parents with "
                        "--cascade children)")
    b.add_argument("--payload", metavar="JSON|@FILE",
                   help="a JSON payload for its runs, instead of the job's: JSON text, or @FILE (@- for stdin)")
    b.add_argument("--id", help="a backfill id: the same id again is the same backfill")
    b.add_argument("--dry-run", action="store_true", help="list the slots it would run and why others are left out")
    b.add_argument("--wait", action="store_true", help="a progress bar on stderr until it ends, then a table")
    s = client("backfills", "list backfills and bulk DLQ operations, or show one", run=_backfills, read=True)
    s.add_argument("id", nargs="?")
    s.add_argument("--kind", choices=("backfill", "requeue", "purge"))
    s.add_argument("--job")
    s.add_argument("--state", choices=("running", "paused", "done", "cancelled"))
    for verb in ("cancel", "pause", "resume"):
        call = {"cancel": Client.cancel_backfill, "pause": Client.pause_backfill, "resume": Client.resume_backfill}[verb]
        client(f"backfill-{verb}", f"{verb} a backfill or bulk DLQ operation",
               (lambda f: lambda a, cl: f(cl, a.id))(call)).add_argument("id")
    for action, what in (("requeue", "requeue a dead run with a fresh attempt budget"),
                         ("purge", "delete a dead run from its dead-letter queue")):
        r = client(action, f"{what}; --all-matching: every dead run that matches the filters (--all: every one)",
                   run=_bulk(action))
        r.add_argument("run", nargs="?")
        r.add_argument("--all-matching", action="store_true", help="act on every dead run matching the filters")
        r.add_argument("--all", action="store_true",
                       help="act on every dead run of every queue (filters, if any, still apply); without a "
                            "filter --all-matching is refused unless --all says so")
        r.add_argument("--queue")
        r.add_argument("--job")
        r.add_argument("--error", help="a substring of the run's error")
        r.add_argument("--dead-from", help="ISO time: dead at or after")
        r.add_argument("--dead-to", help="ISO time: dead at or before (default: now)")
        r.add_argument("--max", type=int, help="at most this many")
        r.add_argument("--rate", type=float, help="per second at most" + (
            f" (default {limits.dlq_requeue_rate_per_s_default})" if action == "requeue" else ""))
        if action == "requeue":
            r.add_argument("--max-concurrent", type=int, help="requeued runs queued or running at once")
        r.add_argument("--id", help="an operation id: the same id again is the same operation")
        r.add_argument("--dry-run", action="store_true", help="list the runs it would act on")
        r.add_argument("--wait", action="store_true", help="a progress bar on stderr until it ends")
