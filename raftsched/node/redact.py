"""Secrets are write-only: every read shows them as ``***:<fingerprint>`` (docs/security.md,
"Secrets").

A job's secrets are the values of its executor's ``headers`` (http) and ``env`` (shell), and of
its ``secrets`` map. Reads (the API, and so the CLI and anything built on them) show each as
``"***:" + 8 hex digits``, the start of HMAC-SHA256(fingerprint key, value): equal values look
equal, so a user can tell two apart or see that a secret changed, and a reader cannot test
guesses offline, since the key is derived from the cluster secret, which readers do not have.
A value is stored sealed (raftsched/sealing.py) with the fingerprint it had when it was sealed,
and a read shows that one: reads never unseal.

A write that sends back a redacted value unchanged (GET, modify something else, PUT) keeps the
stored secret; a redacted value that matches no stored secret under that key is refused (422),
so a copy of a job made from a read never runs with ``***:...`` as its password.

The worker masks the same values in what a run reports (its output and error) before anything
is sent, so a job that prints its environment does not put its secrets into the history
(worker/masking.py).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re

from ..core.errors import InvalidSpec
from ..sealing import fingerprint_of

#: What a redacted value looks like.
REDACTED_RE = re.compile(r"\*\*\*:[0-9a-f]{8}")
#: Where secrets are in a spec: (path of the map, the field names a message uses).
SECRET_MAPS = (("executor", "headers"), ("executor", "env"), ("secrets",))


class Fingerprint:
    """``fp(value) -> "***:xxxxxxxx"``, keyed (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_cluster_secret(cls, secret: str) -> "Fingerprint":
        return cls(hmac.new(secret.encode(), b"raftsched secret fingerprint key v1", hashlib.sha256).digest())

    def digest(self, value: str) -> bytes:
        """The 4 bytes a redacted value shows (in hex), which a sealed value carries."""
        return hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()[:4]

    def __call__(self, value: str) -> str:
        return "***:" + self.digest(value).hex()

    def of_stored(self, value: object) -> str:
        """How a read shows a stored value: a sealed one by the fingerprint it carries, one in
        clear (from a journal written before sealing) by its own; anything else as ``***``."""
        if isinstance(value, str):
            return self(value)
        fp = fingerprint_of(value)
        return "***" if fp is None else "***:" + fp.hex()


#: For an API without a cluster secret (tests): fingerprints stable within the process only.
PROCESS_DEFAULT = Fingerprint(os.urandom(32))


def _get(spec: dict, path: tuple):
    v = spec
    for k in path:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v if isinstance(v, dict) else None


def redact_spec(spec: dict, fp: Fingerprint) -> dict:
    """A copy of a stored spec with every secret value redacted (the spec is not changed)."""
    out = dict(spec)
    ex = spec.get("executor")
    if isinstance(ex, dict) and ("headers" in ex or "env" in ex):
        ex = dict(ex)
        for k in ("headers", "env"):
            if isinstance(ex.get(k), dict):
                ex[k] = {n: fp.of_stored(v) for n, v in ex[k].items()}
        out["executor"] = ex
    if isinstance(spec.get("secrets"), dict):
        out["secrets"] = {n: fp.of_stored(v) for n, v in spec["secrets"].items()}
    return out


def restore_redacted(raw, load_old, fp: Fingerprint):
    """``raw`` (a spec as a client sent it, or as validated), with each redacted value that the
    stored spec holds under the same name replaced by the stored value (sealed: the proposer
    seals only the values in clear). ``load_old()`` gives the stored spec (or None), and is
    called only when ``raw`` holds a redacted value. Returns ``raw`` itself when it holds none.

    :raises InvalidSpec: a redacted value that matches no stored secret of that name."""
    if not isinstance(raw, dict):
        return raw
    out = None
    old_spec = loaded = None
    for path in SECRET_MAPS:
        given = _get(raw, path)
        if not given:
            continue
        fixed = None
        for name, v in given.items():
            if not (isinstance(v, str) and REDACTED_RE.fullmatch(v)):
                continue
            if not loaded:
                old_spec, loaded = load_old(), True
            stored = _get(old_spec, path) if old_spec is not None else None
            old = stored.get(name) if stored is not None else None
            if not isinstance(old, (str, bytes)) or not hmac.compare_digest(fp.of_stored(old), v):
                raise InvalidSpec("is a redacted value that matches no stored secret of this name: send the "
                                  "secret itself (a read shows secrets as ***:fingerprint)",
                                  field=".".join(path + (str(name),)))
            if fixed is None:
                fixed = dict(given)
            fixed[name] = old
        if fixed is not None:
            if out is None:
                out = dict(raw)
            if len(path) == 2:
                out[path[0]] = dict(out[path[0]], **{path[1]: fixed})
            else:
                out[path[0]] = fixed
    return raw if out is None else out
