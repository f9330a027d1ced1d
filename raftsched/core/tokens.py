"""API tokens: who may call the API, with which role and for which tenants (docs/security.md).

A token record lives in the replicated state (the snapshot section ``"tokens"``), so every node
knows every token and a revocation takes effect on every node once it is committed. The record
holds a salted hash of the token's secret, never the secret: the proposer (node/auth.py) draws
the id, the secret and the salt, computes the hash and proposes ``token_create`` with the hash
only; apply stores what the command carries and draws nothing (I1).

Records: id -> ``{"role", "tenants", "created", "expires", "hash", "revoked", "note", "workers"}``:

- ``role``: one of ROLES; ``tenants``: None (every tenant) or a sorted list of tenant names
  (``operator``, ``reader`` and ``worker`` tokens; a worker token limited to tenants leases only
  their runs);
- ``workers``: None (any worker id) or the sorted worker ids a ``worker`` token may speak for
  (lease, heartbeat, complete and release as; register as). A record holds the key only when it
  is not None, so a table without bound tokens snapshots to the bytes it did before they existed;
- ``created``: the state time of the create; ``expires``: ms since the epoch, or None;
- ``hash``: ``{"alg", "salt", "digest"}`` (HASH_ALGS names the algorithms and their fields, so
  the parameters can change later; a revoked token's hash is dropped: it can never match again);
- ``revoked``: the state time of the revocation, or None; ``note``: free text, or None.

Authorization itself is the proposer's: a node checks the token of every request before it
proposes anything (node/auth.py), and apply needs no token (docs/security.md says why that is
sound here).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import limits, snapshot
from .errors import InvalidCommand, InvalidSpec, LimitExceeded, NotFound
from .model import NAME_RE
from .records import Record, Result, is_int, ok
from .workers import check_worker_id

if TYPE_CHECKING:
    from .commands import Command
    from .state import SchedulerState

#: The roles a token may have (docs/security.md, "Roles"): the node maps each to its scopes.
ROLES = ("admin", "operator", "reader", "worker", "ping")
#: Hash algorithms a record may name, with the length of each byte field. ``hmac-sha256``:
#: digest = HMAC-SHA256(key=salt, msg=secret); the secret is 32 random bytes drawn by a node, so
#: a slow KDF would add nothing against guessing (docs/security.md, "Why not scrypt").
HASH_ALGS = {"hmac-sha256": {"salt": 16, "digest": 32}}
#: A token id: 16 lowercase hex digits (64 random bits, drawn by the proposer).
TOKEN_ID_RE = re.compile(r"[0-9a-f]{16}")

_FIELDS = ("role", "tenants", "created", "expires", "hash", "revoked", "note")
#: a field a record holds only when it is not None, written after the others
WORKERS = "workers"
#: likewise, after it: the jobs a ``ping`` token may ping (POST /v1/jobs/{name}/ping, core/deadlines.py)
JOBS = "jobs"


def _check_hash(h: object) -> dict[str, Any]:
    if not isinstance(h, dict) or set(h) != {"alg", "salt", "digest"}:
        raise InvalidCommand("token_create.hash must be {alg, salt, digest}")
    sizes = HASH_ALGS.get(h["alg"]) if isinstance(h["alg"], str) else None
    if sizes is None:
        raise InvalidCommand(f"token_create.hash.alg must be one of {', '.join(HASH_ALGS)}")
    for k, n in sizes.items():
        if not isinstance(h[k], bytes) or len(h[k]) != n:
            raise InvalidCommand(f"token_create.hash.{k} must be {n} bytes")
    return {"alg": h["alg"], "salt": h["salt"], "digest": h["digest"]}


def _distinct(v: object, what: str, max_n: int, valid: Callable[[str], bool]) -> list[str] | None:
    """None, or a list of 1..max_n distinct strings each ``valid`` (returned sorted); each item
    is checked before the list is made a set, so an unhashable one is refused, not raised.
    :raises InvalidCommand:"""
    if v is None:
        return None
    if not isinstance(v, list) or not 1 <= len(v) <= max_n:
        raise InvalidCommand(f"token {what} must be nil or 1-{max_n} distinct names")
    if not all(isinstance(x, str) and valid(x) for x in v):
        raise InvalidCommand(f"token {what} must be {what[:-1]} names")
    if len(set(v)) != len(v):
        raise InvalidCommand(f"token {what} must be distinct")
    return sorted(v)


def _is_worker_id(v: str) -> bool:
    try:
        check_worker_id(v)
    except InvalidSpec:
        return False
    return True


def check_tenants(tenants: object) -> list[str] | None:
    """None, or a list of 1..tokens_tenants_max distinct valid tenant names (returned sorted).
    :raises InvalidCommand:"""
    return _distinct(tenants, "tenants", limits.token_tenants_max,
                     lambda t: len(t) <= limits.tenant_name_chars_max and NAME_RE.fullmatch(t) is not None)


def check_jobs(jobs: object) -> list[str] | None:
    """None, or a list of 1..token_workers_max distinct job names (returned sorted).
    :raises InvalidCommand:"""
    return _distinct(jobs, "jobs", limits.token_workers_max,
                     lambda j: len(j) <= limits.job_name_chars_max and NAME_RE.fullmatch(j) is not None)


def check_workers(workers: object) -> list[str] | None:
    """None, or a list of 1..token_workers_max distinct worker ids (returned sorted).
    :raises InvalidCommand:"""
    return _distinct(workers, "workers", limits.token_workers_max, _is_worker_id)


def _evictable(s: SchedulerState, now: int) -> str | None:
    """The token a full table gives up for a new one: the one revoked first, else the one that
    expired first (by state time), ties by id; None when every token is live."""
    best: tuple[int, int, str] | None = None
    for tid, t in s.tokens.items():
        if t["revoked"] is not None:
            key = (0, t["revoked"], tid)
        elif t["expires"] is not None and t["expires"] <= now:
            key = (1, t["expires"], tid)
        else:
            continue
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def apply_token_create(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``token_create {id, role, tenants, expires, hash, note?, workers?}``: store a new token. ``hash`` is
    computed by the proposer from the secret it drew (HASH_ALGS); the secret is not in the
    command. A full table (tokens_max) first gives up its oldest revoked or expired token.

    :raises InvalidCommand: a field missing or malformed, an id that exists, an admin token
        limited to tenants, a token of another role than worker bound to worker ids.
    :raises LimitExceeded: tokens_max live tokens."""
    tid, role, expires, note = cmd.get("id"), cmd.get("role"), cmd.get("expires"), cmd.get("note")
    if not isinstance(tid, str) or not TOKEN_ID_RE.fullmatch(tid):
        raise InvalidCommand("token_create.id must be 16 hex digits")
    if role not in ROLES:
        raise InvalidCommand(f"token_create.role must be one of {', '.join(ROLES)}")
    tenants = check_tenants(cmd.get("tenants"))
    if tenants is not None and role == "admin":
        raise InvalidCommand("an admin token cannot be limited to tenants")
    workers = check_workers(cmd.get(WORKERS))
    if workers is not None and role != "worker":
        raise InvalidCommand("only a worker token can be bound to worker ids")
    jobs = check_jobs(cmd.get(JOBS))
    if (jobs is not None) != (role == "ping"):
        raise InvalidCommand("a ping token, and only a ping token, is bound to jobs")
    if expires is not None and (not is_int(expires) or expires < 0):
        raise InvalidCommand("token_create.expires must be ms since the epoch or nil")
    if note is not None and (not isinstance(note, str) or len(note) > limits.token_note_chars_max):
        raise InvalidCommand(f"token_create.note must be at most {limits.token_note_chars_max} characters")
    h = _check_hash(cmd.get("hash"))
    if tid in s.tokens:
        raise InvalidCommand(f"token {tid} exists")
    if len(s.tokens) >= limits.tokens_max:
        gone = _evictable(s, now)
        if gone is None:
            raise LimitExceeded(f"the cluster holds {limits.tokens_max} live tokens, its limit; revoke some")
        del s.tokens[gone]
    rec = {"role": role, "tenants": tenants, "created": now, "expires": expires,
           "hash": h, "revoked": None, "note": note}
    if workers is not None:
        rec[WORKERS] = workers
    if jobs is not None:
        rec[JOBS] = jobs
    s.tokens[tid] = rec
    return ok(id=tid)


def apply_token_revoke(s: SchedulerState, cmd: Command, now: int) -> Result:
    """``token_revoke {id}``: the token is refused from now on, by every node that has applied
    this. The record stays (listed as revoked, without its hash) until a full table gives it up.
    Revoking a revoked token changes nothing.

    :raises NotFound: no such token."""
    tid = cmd.get("id")
    t = s.tokens.get(tid) if isinstance(tid, str) else None
    if t is None:
        raise NotFound(f"no token {tid!r}", field="id")
    if t["revoked"] is None:
        t["revoked"] = now
        t["hash"] = None
    return ok(id=tid, revoked=t["revoked"])


# ------------------------------------------------------------------ snapshot section
def _encode(tokens: dict[str, Record]) -> list[list[Any]] | None:
    """Sorted by id, one list a token (fields in _FIELDS order, then ``workers`` when the record
    holds it); None when there is none."""
    if not tokens:
        return None
    return [[tid] + [t[f] for f in _FIELDS] + ([t.get(WORKERS), t[JOBS]] if JOBS in t
                                                else [t[WORKERS]] if WORKERS in t else [])
            for tid, t in sorted(tokens.items())]


def _decode(data: list[list[Any]]) -> dict[str, Record]:
    out = {}
    for row in data:
        rec = dict(zip(_FIELDS, row[1:]))
        if len(row) > len(_FIELDS) + 1 and row[len(_FIELDS) + 1] is not None:
            rec[WORKERS] = row[len(_FIELDS) + 1]
        if len(row) > len(_FIELDS) + 2:
            rec[JOBS] = row[len(_FIELDS) + 2]
        out[row[0]] = rec
    return out


EXTENSION = snapshot.register(snapshot.Extension(name="tokens", new=dict, encode=_encode, decode=_decode))
