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


def _cell(v: Any) -> str:
    text = v if isinstance(v, str) else "" if v is None else json.dumps(v, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= CELL_WIDTH_MAX else text[:CELL_WIDTH_MAX - 1] + "…"


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


def table(payload: Any) -> str:
    """A payload as text tables: a list of objects is one table (a column per key); an object
    is its scalar fields as KEY VALUE rows, then each of its lists of objects as a table of its
    own under its name."""
    if _is_records(payload):
        return _records(payload)
    if not isinstance(payload, dict):
        return _cell(payload) if not isinstance(payload, list) else "\n".join(_cell(x) for x in payload)
    lists = {k: v for k, v in payload.items() if _is_records(v)}
    scalars = [[k, _cell(v)] for k, v in payload.items() if k not in lists]
    parts = [_rows(["field", "value"], scalars)] if scalars else []
    for k, v in lists.items():
        parts.append(f"{k.upper()} ({len(v)})\n{_records(v)}")
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
