"""A run's secrets at the worker (docs/security.md, "Secrets"): given to its executor
(:func:`deliver`), and masked out of what it reports (:func:`secret_values`, :func:`mask`).

A job's secrets are the values of its executor's ``headers`` (http) and ``env`` (shell), and of
its ``secrets`` map. The worker masks every one of them in a run's output and error before the
outcome is sent, so a job that prints its environment does not put its secrets into the
history. How reads show them (redacted, ``***:<fingerprint>``) is the node's side:
node/redact.py.
"""
from __future__ import annotations

from . import limits as worker_limits


def secret_values(executor: dict | None, secrets: dict | None) -> list[str]:
    """The values a run's output is masked of: the executor's headers and env, and the job's
    secrets, longest first (so a value that contains another is masked whole)."""
    vals = set()
    for m in ((executor or {}).get("headers"), (executor or {}).get("env"), secrets):
        if isinstance(m, dict):
            vals.update(v for v in m.values() if isinstance(v, str) and len(v) >= worker_limits.mask_chars_min)
    return sorted(vals, key=len, reverse=True)


def mask(text: str | None, values: list[str]) -> str | None:
    """``text`` with every occurrence of each of ``values`` replaced by ``***``."""
    if not text or not values:
        return text
    for v in values:
        if v in text:
            text = text.replace(v, "***")
    return text


def deliver(executor: dict, secrets: dict | None) -> dict:
    """The executor a run executes with its job's ``secrets`` given to it: added to a shell
    executor's ``env`` and an http executor's ``headers`` (after the executor's own, before the
    run's identity, which nothing overrides); a python run reads ``ctx.secrets`` instead."""
    if not secrets or not isinstance(executor, dict):
        return executor
    key = {"shell": "env", "http": "headers"}.get(executor.get("type"))
    if key is None:
        return executor
    return dict(executor, **{key: {**(executor.get(key) or {}), **secrets}})
