"""What the client subcommands of ``raftsched`` print (cli.py, backfill_cli.py): an answer, and
the one path that prints an error."""
from __future__ import annotations

import json
import sys
from typing import Any

from .core.errors import RaftschedError


def show(payload: Any) -> int:
    """Print an answer (JSON indented, a text as it is) and return the exit status, 0."""
    if payload is None:
        print("")
    elif isinstance(payload, str):
        print(payload)
    else:
        print(json.dumps(payload, indent=2))
    return 0


def print_error(e: RaftschedError) -> int:
    """Print how a client call failed and return the exit status, 1: a node's error answer is
    printed on stdout as the node sent it (its JSON body); when no node answered (``status``
    None: unreachable, no leader until the deadline, an unknown outcome, a TLS failure), why,
    on stderr."""
    body = getattr(e, "body", None)
    if getattr(e, "status", None) is None or body is None:
        print(f"raftsched: {e.message}", file=sys.stderr)
    else:
        show(body)
    return 1
