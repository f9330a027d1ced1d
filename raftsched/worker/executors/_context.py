"""The executor contract's records: the run's identity as a job sees it, and how a run ended."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...core.model import EXECUTOR_TYPES
from ...core.schedule import iso

#: the executor types a node runs unless configured otherwise: all that a job may name.
ALL_TYPES = frozenset(EXECUTOR_TYPES)


@dataclasses.dataclass
class RunContext:
    """The identity of one run, as the executor shows it to the job.

    :param run_id: the run's id.
    :param job: the job's name.
    :param slot_ms: the scheduled slot, epoch milliseconds UTC.
    :param attempt: 1 for the first attempt, then 2, 3, ... on retries.
    :param fencing_token: the lease's fencing token; a downstream system that records the
        highest token it has seen can refuse writes from a stale worker.
    :param payload: the job's JSON-able payload.
    :param worker_id: the id of the worker that holds the run's lease (an embedded worker's
        ``node-id/pid``, or a ``raftsched worker``'s ``--id``), or None when not known.
    :param secrets: the job's ``secrets`` (name -> value; worker/masking.py): a shell run has them
        in its environment and an http run as headers already; a python function reads them here.
    :param upstream: a pipeline child's parents (docs/pipelines.md): ``[{"job", "run", "outcome",
        "token", "result"}, ...]``, or None for a run no parent made.
    :param result: what the run returns to its children (JSON, at most 4 KiB): a python function's
        return value, or a shell run's ``$RAFTSCHED_RESULT_FILE``, set when the run ends.
    """

    run_id: str
    job: str
    slot_ms: int
    attempt: int
    fencing_token: int
    payload: Any
    worker_id: str | None = None
    secrets: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    upstream: Any = None
    result: Any = dataclasses.field(default=None, repr=False)

    @property
    def slot_iso(self) -> str:
        """The slot as ISO-8601 UTC with a Z, milliseconds only when non-zero."""
        return iso(self.slot_ms)

    def payload_json(self) -> str:
        """The payload as compact JSON (ASCII-only, so it is safe in any environment)."""
        return json.dumps(self.payload, separators=(",", ":"))

    def env(self) -> dict[str, str]:
        """The ``RAFTSCHED_*`` environment variables of the run (shell and python executors)."""
        return {
            "RAFTSCHED_RUN_ID": self.run_id,
            "RAFTSCHED_JOB": self.job,
            "RAFTSCHED_SLOT": self.slot_iso,
            "RAFTSCHED_ATTEMPT": str(self.attempt),
            "RAFTSCHED_FENCING_TOKEN": str(self.fencing_token),
            "RAFTSCHED_PAYLOAD": self.payload_json(),
            **({} if self.worker_id is None else {"RAFTSCHED_WORKER_ID": self.worker_id}),
            **({} if self.upstream is None else {"RAFTSCHED_UPSTREAM": json.dumps(self.upstream,
                                                                                  separators=(",", ":"))}),
        }

    def headers(self) -> dict[str, str]:
        """The ``X-Raftsched-*`` request headers of the run (http executor; the payload is the body)."""
        return {
            "X-Raftsched-Run-Id": self.run_id,
            "X-Raftsched-Job": self.job,
            "X-Raftsched-Slot": self.slot_iso,
            "X-Raftsched-Attempt": str(self.attempt),
            "X-Raftsched-Fencing-Token": str(self.fencing_token),
            **({} if self.worker_id is None else {"X-Raftsched-Worker": self.worker_id}),
        }


@dataclasses.dataclass
class Outcome:
    """How a run ended.

    :param ok: True when the run succeeded (exit status 0, HTTP 2xx, or the function returned).
    :param error: a short reason when not ok ("exit status 3", "timed out after 5s", "HTTP 500",
        "lease lost", "ImportError: ..."), None when ok.
    :param output: the bounded tail of what the run produced: the last :data:`OUTPUT_BYTES_MAX`
        bytes of stdout+stderr (shell), "HTTP <status>\\n<body tail>" (http), or the repr of the
        return value / the traceback tail (python). Decoded as UTF-8, invalid bytes replaced.
    :param duration_ms: wall time of the whole execution, kill and cleanup included.
    :param linger: set when the run is over but what ran it is not: a plain python function
        that could not be stopped at its timeout or lease loss, still running in its thread (a
        run that asked for it: ``run_function(..., linger=True)``). The future is done when the
        thread really ends; a worker keeps the run's slot taken until then.
    """

    ok: bool
    error: str | None
    output: str
    duration_ms: int
    linger: Any = None


# A runner's result before the duration is added: (ok, error, output).
Result = tuple[bool, "str | None", str]

