"""What a handler declared with ``@app.job`` is called with: :class:`Context`."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from ..core.schedule import iso

#: The parent of every job's logger: ``raftsched.job.<job name>``.
JOB_LOGGER = "raftsched.job"


@dataclasses.dataclass(frozen=True)
class Context:
    """One run of a job, as its handler sees it.

    :param run_id: the run's id (``job@slot``, or a manual or requeued run's own).
    :param job: the job's name.
    :param slot_ms: the scheduled slot, epoch milliseconds UTC (:attr:`slot` as a datetime).
    :param attempt: 1 for the first attempt, then 2, 3, ... on retries.
    :param fencing_token: the lease's fencing token: pass it to every write the handler makes
        downstream, and have the downstream refuse a lower token than one it has seen (a stale
        runner, whose lease was lost, then cannot overwrite a newer one's work).
    :param payload: the job's payload (JSON).
    :param worker: the id of the worker running the attempt, when it is known (None when the
        executor that called the handler did not say).
    :param upstream: for a job that runs after others (pipelines), its parents' outcomes for
        this slot: ``[{"job", "run", "outcome", "token", "result"}, ...]``; None otherwise.
    :param secrets: the job's ``secrets`` in clear, by name (read-only; empty for a job without
        any). Never shown by the Context's repr, nor in :meth:`env`; what the run prints or
        raises is masked of them.
    """

    run_id: str
    job: str
    slot_ms: int
    attempt: int
    fencing_token: int
    payload: Any = None
    worker: str | None = None
    upstream: Any = None
    #: the executor's run context this Context was made of: a handler's return value is set on it
    #: as the run's result (pipelines); not part of the Context's value
    result_sink: Any = dataclasses.field(default=None, compare=False, repr=False)
    secrets: Mapping[str, str] = dataclasses.field(default_factory=lambda: _NO_SECRETS, compare=False, repr=False)

    @property
    def slot(self) -> datetime:
        """The scheduled slot as an aware UTC datetime."""
        return datetime.fromtimestamp(self.slot_ms / 1000, tz=timezone.utc)

    @property
    def slot_iso(self) -> str:
        """The slot as ISO-8601 UTC with a Z, milliseconds only when non-zero (the API's form)."""
        return iso(self.slot_ms)

    @property
    def log(self) -> logging.Logger:
        """A logger named after the job: ``raftsched.job.<job>``."""
        return logging.getLogger(f"{JOB_LOGGER}.{self.job}")

    def env(self) -> dict[str, str]:
        """The ``RAFTSCHED_*`` variables a shell run of the same attempt would see."""
        return self._run_context().env()

    def headers(self) -> dict[str, str]:
        """The ``X-Raftsched-*`` headers an http run of the same attempt would send."""
        return self._run_context().headers()

    def _run_context(self):
        from ..worker.executors import RunContext
        return RunContext(run_id=self.run_id, job=self.job, slot_ms=self.slot_ms, attempt=self.attempt,
                          fencing_token=self.fencing_token, payload=self.payload, worker_id=self.worker,
                          upstream=self.upstream)

    # ------------------------------------------------------------------ building one
    @classmethod
    def of(cls, ctx: Any, worker: str | None = None) -> Context:
        """The Context of a run from what an executor passes: a Context (returned as it is), or
        any object with ``run_id``, ``job``, ``slot_ms``, ``attempt``, ``fencing_token`` and
        ``payload`` (the python executor's :class:`raftsched.worker.executors.RunContext`). The
        worker is ``worker``, else the object's ``worker`` or ``worker_id``.

        :raises TypeError: ``ctx`` has none of that."""
        if isinstance(ctx, cls):
            return ctx
        try:
            return cls(run_id=ctx.run_id, job=ctx.job, slot_ms=ctx.slot_ms, attempt=ctx.attempt,
                       fencing_token=ctx.fencing_token, payload=getattr(ctx, "payload", None),
                       worker=worker if worker is not None else
                       (getattr(ctx, "worker", None) or getattr(ctx, "worker_id", None)),
                       upstream=getattr(ctx, "upstream", None),
                       result_sink=ctx if hasattr(ctx, "result") else None,
                       secrets=_secrets_of(getattr(ctx, "secrets", None)))
        except AttributeError as e:
            raise TypeError(f"a handler is called with a run context (run_id, job, slot_ms, attempt, "
                            f"fencing_token, payload); got {type(ctx).__name__}: {e}") from None

    @classmethod
    def from_grant(cls, grant: dict, worker: str | None = None) -> Context:
        """The Context of a run a worker was granted: the acquire result's items
        (``{"id", "job", "slot", "attempt", "token", "payload", ...}``, as
        raftsched.worker.loop reads them)."""
        return cls(run_id=grant["id"], job=grant["job"], slot_ms=grant["slot"], attempt=grant["attempt"],
                   fencing_token=grant["token"], payload=grant.get("payload"), worker=worker,
                   upstream=grant.get("upstream"), secrets=_secrets_of(grant.get("secrets")))


_NO_SECRETS: Mapping[str, str] = MappingProxyType({})


def _secrets_of(values: Any) -> Mapping[str, str]:
    """A read-only copy of a run's secrets (a map of strings), or the empty one."""
    if not isinstance(values, Mapping) or not values:
        return _NO_SECRETS
    return MappingProxyType({k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, str)})
