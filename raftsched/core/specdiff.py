"""Where two job specs differ, as the API shows them: the dotted paths, with each side's value.

One walk for both readers of a difference: ``raftsched sync``'s plan (sdk/plan.py, the paths)
and ``POST /v1/jobs:batch`` with ``dry_run`` (node/service.py, the paths and both values).
Objects are walked key by key; anything else (a list, a number, a string) is compared whole.
"""
from __future__ import annotations

from typing import Any, Mapping

#: Stands for the side of a difference where the path does not exist.
ABSENT: Any = object()


def changes(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(path, value in a, value in b)`` for each dotted path at which two JSON values differ,
    sorted by key at each level; :data:`ABSENT` for a side that lacks the path. Two different
    values that are not both objects differ at ``prefix`` itself (``"(spec)"`` at the top)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: list[tuple[str, Any, Any]] = []
        for k in sorted(set(a) | set(b), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                out.append((path, a.get(k, ABSENT), b.get(k, ABSENT)))
            elif a[k] != b[k]:
                out.extend(changes(a[k], b[k], path))
        return out
    return [] if a == b else [(prefix or "(spec)", a, b)]
