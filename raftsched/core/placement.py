"""Placement (docs/workers.md): the labels a worker carries, and whether they satisfy a job's.

Pure. The worker registry (core/workers.py), acquire (core/leases.py), the reads of which runs no
worker can take (core/queries.py) and a job spec's ``placement`` (core/model.py) all follow the
one rule here (I18).
"""
from __future__ import annotations

import re
from collections.abc import Collection

from . import limits
from .errors import InvalidSpec
from .records import Record

#: what ``waiting_for`` (worker_queries.py) says of a run no live worker may take for its placement
NO_WORKER_MATCHES = "no worker matches its placement"
#: ... and of a python run that a live worker would take, but for its handlers (workers.TARGETS):
#: every worker that may take it runs a version of its app without the job's target
NO_HANDLER = "no worker has a handler for its target (the workers of its app run a version without it)"

#: What a label name or value may hold: letters, digits, '.', '_' and '-', starting with a letter
#: or digit (the job-name rule).
LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def validate_worker_labels(raw: object, field: str) -> dict[str, str]:
    """A map of worker labels, returned with its names in order (a state's bytes must not depend
    on the order a client wrote them in). :raises InvalidSpec: naming the label and why."""
    if not isinstance(raw, dict):
        raise InvalidSpec("must be an object of label: value strings", field=field)
    if len(raw) > limits.worker_labels_max:
        raise InvalidSpec(f"has more than {limits.worker_labels_max} labels", field=field)
    n = limits.worker_label_chars_max
    for k, v in raw.items():
        if not isinstance(k, str) or not k or len(k) > n or not LABEL_RE.fullmatch(k):
            raise InvalidSpec(f"label names are 1-{n} letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit", field=f"{field}.{k}")
        if not isinstance(v, str) or not v or len(v) > n or not LABEL_RE.fullmatch(v):
            raise InvalidSpec(f"label values are 1-{n} letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit", field=f"{field}.{k}")
    return {k: raw[k] for k in sorted(raw)}


def placement_ok(spec: Record, labels: dict[str, str], dedicated: Collection[str] = ()) -> bool:
    """Whether a worker with ``labels`` may run a job of ``spec`` (I18): every label of its
    placement is one of the worker's, with the same value. A spec without placement: any worker.
    A malformed placement (apply's guard refuses one before it is stored) matches no worker.

    :param dedicated: the names of the worker's labels it is dedicated to (core/workers.py): it
        takes only runs whose placement names each of them (a spec without placement: none)."""
    pl = spec.get("placement")
    if pl is None:
        return not dedicated
    want = pl.get("labels") if type(pl) is dict else None
    if type(want) is not dict:
        return False
    for k in dedicated:
        if k not in want:
            return False
    for k, v in want.items():
        if labels.get(k) != v:
            return False
    return True
