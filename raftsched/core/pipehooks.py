"""Calls from the handlers of fire.py and queues.py into core/pipelines.py, bound late.

pipelines.py makes runs and records with fire.py's functions, and fire.py (a slot recorded, a
run revoked, a gated job's slot) and queues.py (a dead run requeued) must call back into it: the
calls go through these names, which pipelines.py binds when it is imported (state.py imports it,
so every state has them bound). An import of pipelines.py from fire.py would be a cycle.
"""
from __future__ import annotations

from typing import Any, Callable


def _unbound(*args: Any) -> Any:
    raise RuntimeError("core.pipelines is not imported: import raftsched.core.state")


#: pipelines.notify(state, run, now): a run or record of a job with children reached its final outcome
notify: Callable[..., None] = _unbound
#: pipelines.own_slot(state, job, slot, now): a gated job's slot fell due
own_slot: Callable[..., None] = _unbound
#: pipelines.drop_joins(state, job_name, lo, hi): a gated job's own slots were recorded
drop_joins: Callable[..., None] = _unbound
#: pipelines.rearm(state, run, now) -> re-armed ids: a dead run of a job with children was requeued
rearm: Callable[..., list[str]] = _unbound
