"""What ``raftsched sync`` changes: a pure function of the declared jobs and the cluster's.

Jobs are compared as the API shows them (``GET /v1/jobs/{name}``'s ``spec``, every default
filled in), so a declaration that the cluster already holds is "unchanged", whatever defaults
it left out. A job is this app's when its ``labels`` carry ``raftsched.app: <app name>``:

- declared, not in the cluster: **create**;
- declared, in the cluster with the same spec: **unchanged**;
- declared, in the cluster with another spec, and the job is this app's or no app's: **update**
  (a job that no app marked is taken over, and marked);
- declared, in the cluster and another app's: a **conflict**; nothing is applied while there is
  one (two apps would otherwise take the job from each other at every sync);
- this app's, in the cluster, no longer declared: **delete** with ``prune``, else listed as
  **undeclared** and kept. A job without this app's label is never deleted.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..core import specdiff
from .app import APP_LABEL


@dataclasses.dataclass(frozen=True)
class Update:
    """A declared job whose spec differs from the cluster's: ``fields`` are the dotted paths
    that differ (``schedule.cron``, ``retry.max_attempts``, ``labels.raftsched.app``)."""

    job: str
    fields: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Conflict:
    """A declared job that another app (``owner``) holds in the cluster."""

    job: str
    owner: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """The difference between an app's declarations and the cluster; every list by name."""

    app: str
    create: tuple[str, ...] = ()
    update: tuple[Update, ...] = ()
    unchanged: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    undeclared: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()

    @property
    def changes(self) -> bool:
        """Anything to apply (creates, updates or deletes)."""
        return bool(self.create or self.update or self.delete)

    def puts(self) -> list[str]:
        """The jobs the batch sends: created and updated, by name."""
        return sorted(list(self.create) + [u.job for u in self.update])

    def to_dict(self) -> dict:
        return {"app": self.app, "create": list(self.create),
                "update": [{"job": u.job, "fields": list(u.fields)} for u in self.update],
                "unchanged": list(self.unchanged), "delete": list(self.delete),
                "undeclared": list(self.undeclared),
                "conflicts": [{"job": c.job, "owner": c.owner} for c in self.conflicts]}


def owner_of(spec: Mapping[str, Any]) -> str | None:
    """The app that created a job (its ``raftsched.app`` label), or None."""
    labels = spec.get("labels")
    return labels.get(APP_LABEL) if isinstance(labels, Mapping) else None


def diff_fields(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted paths at which two JSON values differ, sorted (``[""]``-free: the top level
    of two different non-objects is ``prefix`` itself)."""
    return [path for path, _, _ in specdiff.changes(a, b, prefix)]


def plan(app: str, declared: Mapping[str, dict], existing: Mapping[str, dict], prune: bool = False) -> Plan:
    """The plan that makes ``existing`` hold ``declared``.

    :param app: the app's name.
    :param declared: the app's jobs, ``{name: spec}`` in the API's form (App.views()).
    :param existing: the cluster's jobs, ``{name: spec}`` as ``GET`` shows them: at least every
        declared name the cluster has and every job labelled with this app.
    :param prune: delete this app's jobs that are no longer declared.
    """
    create, unchanged, update, conflicts = [], [], [], []
    for name in sorted(declared):
        want = declared[name]
        have = existing.get(name)
        if have is None:
            create.append(name)
            continue
        owner = owner_of(have)
        if owner is not None and owner != app:
            conflicts.append(Conflict(name, owner))
        elif have == want:
            unchanged.append(name)
        else:
            update.append(Update(name, tuple(diff_fields(have, want))))
    gone = sorted(n for n, spec in existing.items() if n not in declared and owner_of(spec) == app)
    return Plan(app=app, create=tuple(create), update=tuple(update), unchanged=tuple(unchanged),
                delete=tuple(gone) if prune else (), undeclared=() if prune else tuple(gone),
                conflicts=tuple(conflicts))
