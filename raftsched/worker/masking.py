"""A run's secrets at the worker (docs/security.md, "Secrets"): given to its executor
(:func:`deliver`), and masked out of what it reports (:func:`secret_values`, :func:`mask`).

A job's secrets are the values of its executor's ``headers`` (http) and ``env`` (shell), and of
its ``secrets`` map. The worker masks every one of them in a run's output and error before the
outcome is sent, so a job that prints its environment does not put its secrets into the
history: where the output and error are cut and made one line (executors/_output.py), before
that, and once more before the outcome is reported. How reads show them (redacted, ``***:<fingerprint>``) is the node's side:
node/redact.py.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from . import limits as worker_limits


def secret_values(executor: dict | None, secrets: dict | None) -> list[str]:
    """The values a run's output is masked of: the executor's headers and env, and the job's
    secrets, each also as a repr, a bytes repr and JSON write it (a backslash, a quote, a control
    or non-ASCII character escaped: a returned dataclass or bytes, a KeyError's message, a JSON
    line a shell job prints), longest first (so a value that contains another is masked whole)."""
    vals: set[str] = set()
    for m in ((executor or {}).get("headers"), (executor or {}).get("env"), secrets):
        if isinstance(m, dict):
            for v in m.values():
                if isinstance(v, str) and len(v) >= worker_limits.mask_chars_min:
                    vals.update(escaped_forms(v))
    return sorted(vals, key=len, reverse=True)


def escaped_forms(v: str) -> set[str]:
    """``v`` and how Python's repr (of str and of its UTF-8 bytes) and JSON write it, quotes
    left out."""
    # repr picks its quotes by the whole string: in one that also holds a double quote, a single
    # quote of v is written \' (v + '"' makes repr do the same with v alone).
    forms = {v, repr(v)[1:-1], repr(v + '"')[1:-2], json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1]}
    try:
        b = v.encode()
        forms.update((repr(b)[2:-1], repr(b + b'"')[2:-2]))
    except UnicodeEncodeError:  # (a lone surrogate)
        pass
    return forms


def mask(text: str | None, values: Sequence[str], cut: bool = False) -> str | None:
    """``text`` with every occurrence of each of ``values`` replaced by ``***`` (occurrences that
    overlap, of one value or of two, become one ``***``, so no part of either shows).

    :param cut: ``text`` is the end of something longer, cut at an arbitrary point (an output's
        tail): a value the cut went through left only its end at the start of ``text``, which no
        occurrence matches. Whatever ``text`` starts with that is the end of a value (the last
        20 characters of a 40-character secret, or only its last character) is dropped. Not
        masked with ``***``, and with no shortest length: the text starts at an arbitrary point
        anyway, so starting it a few characters later loses nothing a reader could rely on,
        while a shortest length would let that many characters of a secret through (three of
        a four-character one), and a ``***`` for every accidental match of a last character
        would mark outputs that showed no secret.
    """
    if not text or not values:
        return text
    spans = []
    for v in values:
        i = text.find(v)
        while i >= 0:
            spans.append((i, i + len(v), True))
            i = text.find(v, i + 1)
    if cut:
        lead = _cut_through(text, values)
        if lead:
            spans.append((0, lead, False))
    if not spans:
        return text
    spans.sort()
    out, at = [], 0
    start, end, whole = spans[0]
    for s, e, w in spans[1:] + [(len(text) + 1, 0, False)]:
        if s < end:  # overlaps the span so far: one span
            end, whole = max(end, e), whole or w
            continue
        out.append(text[at:start])
        if whole:
            out.append("***")
        at = end
        start, end, whole = s, e, w
    out.append(text[at:])
    return "".join(out)


def _cut_through(text: str, values: Sequence[str]) -> int:
    """The length of the longest start of ``text`` that is the end of one of ``values`` (the
    whole value included), 0 if none."""
    longest = 0
    first = text[0]
    for v in values:
        j = v.find(first, max(0, len(v) - len(text)))
        while j >= 0:
            if len(v) - j <= longest:
                break  # the ends left are shorter than one found already
            if text.startswith(v[j:]):
                longest = len(v) - j
                break
            j = v.find(first, j + 1)
    return longest


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
