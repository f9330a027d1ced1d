"""What the client subcommands of ``raftsched`` print (cli.py, backfill_cli.py): an answer in the
format ``-o`` chose (``json``, ``table``, ``yaml``; by default a table on a terminal and JSON
when piped), the one path that prints an error, and a progress bar on stderr (a terminal only)."""
from __future__ import annotations

import json
import sys
from typing import Any

from .core.errors import RaftschedError

FORMATS = ("json", "table", "yaml")
#: The widest a table cell is printed (longer values end with an ellipsis).
CELL_WIDTH_MAX = 48

_format: str | None = None


def set_format(fmt: str | None) -> None:
    """``-o``: one of FORMATS, or None for the default (table on a terminal, else JSON)."""
    global _format
    _format = fmt


def output_format() -> str:
    return _format or ("table" if sys.stdout.isatty() else "json")


def show(payload: Any) -> int:
    """Print an answer (a text as it is) and return the exit status, 0."""
    if payload is None:
        print("")
    elif isinstance(payload, str):
        print(payload)
    else:
        fmt = output_format()
        if fmt == "yaml":
            import yaml
            print(yaml.safe_dump(payload, sort_keys=False, allow_unicode=True), end="")
        elif fmt == "table":
            print(table(payload))
        else:
            print(json.dumps(payload, indent=2))
    return 0


def _cell(v: Any, whole: bool = False) -> str:
    text = v if isinstance(v, str) else "" if v is None else json.dumps(v, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if whole or len(text) <= CELL_WIDTH_MAX else text[:CELL_WIDTH_MAX - 1] + "…"


def _rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _is_records(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _records(items: list[dict]) -> str:
    header: list[str] = []
    for item in items:
        header += [k for k in item if k not in header]
    return _rows(header, [[_cell(item.get(k)) for k in header] for item in items])


def _get(item: dict, path: str) -> Any:
    """``item``'s value at a dotted ``path`` (None where a part is missing)."""
    v: Any = item
    for part in path.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v


def _iso(ms: Any) -> Any:
    """An event's instant (ms since the epoch, as events carry them) as ISO-8601 text."""
    from .core.schedule import iso
    return iso(ms) if type(ms) is int else ms


def _schedule(job: dict) -> str:
    """A job's schedule in a few words: its cron and zone, its interval, its instant, or the
    jobs it runs after."""
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    sc = spec.get("schedule") if isinstance(spec.get("schedule"), dict) else {}
    if "cron" in sc:
        tz = sc.get("timezone")
        return f"{sc['cron']} {tz}" if tz and tz != "UTC" else str(sc["cron"])
    if "every_s" in sc:
        return f"every {sc['every_s']}s"
    if "at" in sc:
        return f"at {sc['at']}"
    after = spec.get("after")
    if isinstance(after, list) and after:
        return "after " + ",".join(e.get("job", "?") if isinstance(e, dict) else str(e) for e in after)
    return ""


def _slots(run: dict) -> Any:
    """A history entry's slots: its slot, or for a record of a range of missed slots
    ``FIRST..LAST (COUNT)``, LAST without the date FIRST has (``2026-11-29T10:32:47Z..10:32:53Z
    (4)``): a range shown as its first slot alone read as one slot."""
    slot, slot_to = run.get("slot"), run.get("slot_to")
    if not isinstance(slot, str) or not isinstance(slot_to, str) or slot_to == slot:
        return slot
    day, _, _ = slot.partition("T")
    last = slot_to[len(day) + 1:] if slot_to.startswith(day + "T") else slot_to
    count = run.get("count")
    return f"{slot}..{last}" + (f" ({count})" if count is not None else "")


#: The columns of the lists people read most, by the key the answer holds them under (GET
#: /v1/jobs, /v1/workers, a job's or every job's runs): a header and a dotted path (or a
#: function of the item). Other lists, and ``-o json``, show every field.
_VIEWS: dict[str, list[tuple[str, Any]]] = {
    "jobs": [("name", "name"), ("schedule", _schedule), ("next_slot", "state.next_slot"),
             ("paused", "state.paused"), ("last", "health.last_slot_outcome.outcome"),
             ("failures", "health.consecutive_failures"), ("executor", "spec.executor.type"),
             ("queue", "spec.queue")],
    "runs": [("id", "id"), ("state", "state"), ("slots", _slots), ("attempt", "attempt"), ("worker", "worker"),
             ("started_at", "started_at"), ("finished_at", "finished_at"),
             # (a queued run's reason is what it waits for: a worker's placement or handler, a pause)
             ("reason", lambda r: r.get("reason") or r.get("waiting_for")), ("error", "error")],
    # (``runs --slot``'s block of the slot's runs across its pipeline: each job's, as a run list)
    "pipeline": [("id", "id"), ("job", "job"), ("state", "state"), ("attempt", "attempt"),
                 ("finished_at", "finished_at"),
                 ("reason", lambda r: r.get("reason") or r.get("waiting_for") or r.get("rerun_waiting_for")),
                 ("error", "error")],
    "dead": [("event_id", lambda d: _get(d, "event.event_id")), ("kind", lambda d: _get(d, "event.kind")),
             ("job", lambda d: _get(d, "event.job")), ("slot", lambda d: _iso(_get(d, "event.slot"))),
             ("dead_at", lambda d: _iso(d.get("at"))), ("attempts", "attempts"), ("error", "error")],
    "workers": [("id", "id"), ("status", "status"), ("last_seen", "last_seen"), ("slots", "slots"),
                ("held", "held"), ("executors", "executors"), ("queues", "queues"), ("labels", "labels"),
                ("version", "version"), ("targets", lambda w: len(w["targets"]) if w.get("targets") else None)],
}


#: Curated columns printed whole, never cut at CELL_WIDTH_MAX: a range of slots over two days
#: with its count is a little longer, and its end is what says it is a range.
_UNCUT = frozenset({"slots"})


def _viewed(key: str, items: list[dict]) -> str:
    """``items`` (the list under ``key``) in their curated columns when they have them: the
    first column's field is in every item (else every field is shown, as any list)."""
    cols = _VIEWS.get(key)
    if cols is None or not all(isinstance(c[1], str) and c[1] in item or callable(c[1])
                               for item in items for c in cols[:1]):
        return _records(items)
    rows = []
    for item in items:
        row = []
        for _h, how in cols:
            v = how(item) if callable(how) else _get(item, how)
            if isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
                v = ",".join(f"{k}={x}" for k, x in v.items())
            elif isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
                v = ",".join(str(x) for x in v)
            row.append(_cell(v, whole=_h in _UNCUT))
        rows.append(row)
    return _rows([h for h, _ in cols], rows)


def _flat(prefix: str, v: Any, out: list[list[str]], depth: int = 0) -> None:
    """``v``'s scalar fields as rows ``[dotted.key, value]``, objects opened two levels deep.
    A value is shown whole (the last column of a key/value table: nothing to its right to keep
    in line): a walk could not read a warning, an explain's why or a dry run's slots cut at 48
    characters. A list of texts is one per line under its key (one text too: a PUT's one warning
    showed as an escaped JSON list)."""
    if isinstance(v, dict) and v and depth < 2:
        for k, x in v.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), x, out, depth + 1)
    elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        out.append([prefix, _cell(v[0], whole=True)])
        out.extend(["", _cell(x, whole=True)] for x in v[1:])
    else:
        out.append([prefix, _cell(v, whole=True)])


def _error_block(err: dict) -> str:
    """A node's error as a terminal shows it, whole: its code and message, its other fields as
    KEY VALUE, and each of its ``errors`` (a batch's invalid jobs) on a line of its own, never
    cut (a walk saw a batch's four invalid jobs shown as one cell cut at 48 characters)."""
    lines = [f"error: {err.get('code', '?')}: {err.get('message', '')}"]
    for k, v in err.items():
        if k in ("code", "message", "errors") or v is None:
            continue
        lines.append(f"  {k}: {_cell(v, whole=True)}")
    errs = err.get("errors")
    if _is_records(errs):
        lines.append(f"  errors ({len(errs)}):")
        lines += [f"    {e.get('job', '')}  {e.get('field') or ''}  {e.get('message', '')}".rstrip() for e in errs]
    elif errs is not None:
        lines.append(f"  errors: {_cell(errs, whole=True)}")
    return "\n".join(lines)


def table(payload: Any) -> str:
    """A payload as text tables: a list of objects is one table (a column per key: the curated
    columns of jobs, runs and workers); an object is its fields as KEY VALUE rows, nested objects
    opened as dotted keys (``spec.schedule.cron``), then each of its lists of objects as a table
    of its own under its name. A node's ``error`` comes first, whole (:func:`_error_block`)."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        rest = {k: v for k, v in payload.items() if k != "error"}
        return _error_block(payload["error"]) + ("\n\n" + table(rest) if rest else "")
    if _is_records(payload):
        return _records(payload)
    if not isinstance(payload, dict):
        return _cell(payload) if not isinstance(payload, list) else "\n".join(_cell(x) for x in payload)
    # (an empty list of a curated kind too: its columns' header under "RUNS (0)", where a walk
    # read "runs []" as a field)
    lists = {k: v for k, v in payload.items() if _is_records(v) or (v == [] and k in _VIEWS)}
    # A text of several lines (a run's output, its traceback) is a block of its own under its
    # name, as it was written: in a cell its lines ran into one (a walk).
    blocks = {k: v for k, v in payload.items() if isinstance(v, str) and "\n" in v.strip()}
    scalars: list[list[str]] = []
    for k, v in payload.items():
        if k not in lists and k not in blocks:
            _flat(k, v, scalars)
    parts = [_rows(["field", "value"], scalars)] if scalars else []
    for k, v in blocks.items():
        parts.append(f"{k.upper()}\n{v.rstrip()}")
    for k, v in lists.items():
        parts.append(f"{k.upper()} ({len(v)})\n{_viewed(k, v)}")
    return "\n\n".join(parts) if parts else "(empty)"


def print_error(e: RaftschedError, flags: Any = None) -> int:
    """Print how a client call failed and return the exit status, 1: a node's error answer is
    printed on stdout as the node sent it (its JSON body); when no node answered (``status``
    None: unreachable, no leader, an unknown outcome, a TLS failure), why and what to do
    next, once, on stderr. A message that advises one of the API's query parameters gets a line
    on stderr naming this command's flag for it, when ``flags`` (the parsed arguments) has it."""
    body = getattr(e, "body", None)
    if getattr(e, "status", None) is None or body is None:
        print(f"raftsched: {e.message}", file=sys.stderr)
    else:
        show(body)
    said = [f"{param} is {flag} here" for param, flag, attr in API_PARAM_FLAGS
            if param in (e.message or "") and hasattr(flags, attr)]
    if said:
        print(f"raftsched: ({'; '.join(said)})", file=sys.stderr)
    return 1


#: Query parameters a node's error message may advise, the CLI flag that sends each, and the
#: parsed argument a command that has the flag holds.
API_PARAM_FLAGS = (("?force=true", "--force", "force"), ("?stale=true", "--stale", "stale"))


class Progress:
    """A progress bar on stderr, drawn only when stderr is a terminal (a pipe or a log gets
    nothing). ``update(done)`` redraws it; ``close()`` ends its line."""

    WIDTH = 30

    def __init__(self, total: int, label: str, stream: Any = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        if not self.on:
            return
        filled = round(self.WIDTH * min(done, self.total) / self.total)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {done}/{self.total}")
        self.stream.flush()

    def close(self) -> None:
        if self.on:
            self.stream.write("\n")
            self.stream.flush()
