"""Who may call the API: tokens, roles and scopes, one permission table, the tokens endpoints, and
the slowing of sources that keep sending refused tokens (docs/security.md).

Every request needs a token (``Authorization: Bearer ...``) except ``GET /healthz`` and, on a
node started with ``--metrics-open``, ``GET /metrics``. A token is either

- the **bootstrap token**, the node's ``--token-file`` (``scripts/cluster.sh`` writes one): an
  admin token every node knows from its file, not from the state, so a fresh cluster can be used
  (and can create the other tokens); its id is ``bootstrap``; or
- a token made by ``POST /v1/tokens``: ``rst_<id>_<secret>``, whose record (role, tenants, expiry,
  salted hash; core/tokens.py) is in the replicated state. A node checks it against its own
  replica: one dict lookup under the replica's lock and one HMAC-SHA256, a few microseconds, so
  nothing is cached and a revocation applies on a node as soon as that node has applied it.

Each role grants scopes (``ROLE_SCOPES``); each route needs one, named in its row of the route
table (node/routes.py; the rows are in node/api.py, and the tokens endpoints' in
``TOKEN_ROUTES`` here). 401 for no token, an unknown, malformed, expired or revoked one; 403
naming the missing scope. A token limited to tenants is also held to them (node/tenancy.py).

Authorization is the proposer's job, and apply checks no token: a command enters the log only
through a node that authenticated the request, or through the Raft port, which only holders of
the cluster secret can speak to (and who can do anything anyway). docs/security.md says more.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from aiohttp import web

from ..core import commands, limits, queries, schedule
from ..core.errors import Forbidden, InvalidSpec, TooManyRequests, Unauthorized
from ..core.model import check_name
from ..core.workers import check_worker_id
from ..core.tokens import ROLES, TOKEN_ID_RE
from . import limits as node_limits
from .http import CLAIMED, PRINCIPAL, SERVICE, json_body, json_response, rid
from .routes import OPEN, CONSISTENT, STALE, Route, Tenancy

#: The prefix of every token made by POST /v1/tokens: ``rst_<16 hex id>_<secret>``.
TOKEN_PREFIX = "rst_"
#: The id the bootstrap token (the node's --token-file) goes by, in the audit log and GET /v1/tokens.
BOOTSTRAP_ID = "bootstrap"

# ------------------------------------------------------------------ roles, scopes, routes
#: Scopes, each the right to a group of routes.
SCOPES = ("read", "jobs.write", "dlq.write", "queues.write", "locks.write", "tenants.write",
          "tokens", "worker", "admin", "ping")
#: What each role may do. ``admin`` may do everything, also what no table lists.
ROLE_SCOPES = {
    "admin": frozenset(SCOPES),
    "operator": frozenset({"read", "jobs.write", "dlq.write", "queues.write", "locks.write", "ping"}),
    "reader": frozenset({"read"}),
    "worker": frozenset({"worker", "ping"}),
    # a dedicated token for heartbeat jobs' pings, bound to the jobs it may ping
    "ping": frozenset({"ping"}),
}
assert set(ROLE_SCOPES) == set(ROLES)

@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a token's id, its role, its tenants (None: every tenant) and,
    for a worker token bound to worker ids, those ids (None: any worker id)."""

    id: str
    role: str
    tenants: frozenset | None = None
    workers: frozenset | None = None
    #: for a ping token, the jobs it may ping
    jobs: frozenset | None = None

    def allows(self, scope: str) -> bool:
        return scope in ROLE_SCOPES[self.role]


# ------------------------------------------------------------------ tokens
def hash_secret(secret: str, salt: bytes) -> bytes:
    """The stored digest of a token's secret (core.tokens.HASH_ALGS, ``hmac-sha256``)."""
    return hmac.new(salt, secret.encode(), hashlib.sha256).digest()


def parse_token(text: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a token of the ``rst_<id>_<secret>`` shape, or None."""
    if not text.startswith(TOKEN_PREFIX) or len(text) < 22 or text[20] != "_":
        return None
    tid = text[4:20]
    return (tid, text[21:]) if TOKEN_ID_RE.fullmatch(tid) else None


def new_token() -> tuple[str, str, dict]:
    """A new token for a token_create: ``(id, the token to show once, its hash record)``."""
    tid = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    return tid, f"{TOKEN_PREFIX}{tid}_{secret}", {"alg": "hmac-sha256", "salt": salt,
                                                 "digest": hash_secret(secret, salt)}


class FailureLimiter:
    """A token bucket of refused tokens per source address: ``burst`` of them, ``per_s`` more a
    second. Bounded: past ``sources_max`` sources, the least recently failing is forgotten.
    Times are the caller's monotonic clock (``now_s``)."""

    def __init__(self, burst: float = node_limits.auth_failures_burst,
                 per_s: float = node_limits.auth_failures_per_s,
                 sources_max: int = node_limits.auth_sources_max) -> None:
        self.burst = burst
        self.per_s = per_s
        self.sources_max = sources_max
        self._buckets: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    def _level(self, source: str, now_s: float) -> float:
        b = self._buckets.get(source)
        if b is None:
            return self.burst
        level = min(self.burst, b[0] + (now_s - b[1]) * self.per_s)
        b[0], b[1] = level, now_s
        return level

    def retry_after_s(self, source: str, now_s: float) -> float:
        """0 when ``source`` may be heard, else seconds until it may."""
        level = self._level(source, now_s)
        return 0.0 if level >= 1 else (1 - level) / self.per_s

    def failed(self, source: str, now_s: float) -> None:
        level = self._level(source, now_s) - 1
        self._buckets[source] = [level, now_s]
        self._buckets.move_to_end(source)
        while len(self._buckets) > self.sources_max:
            self._buckets.popitem(last=False)


class Auth:
    """Authenticates requests against the bootstrap token and the replica's token records.

    :param bootstrap: the --token-file token (an admin token), or "" for none.
    :param read: ``raft.read`` of the node: ``read(fn, *args)`` runs ``fn(state, *args)``
        under the replica's lock.
    :param clock: the node's clock (token expiry is by its wall clock; the slowing of failing
        sources by its monotonic one).
    :param metrics_open: ``GET /metrics`` needs no token.
    """

    def __init__(self, bootstrap: str, read, clock, *, metrics_open: bool = False,
                 limiter: FailureLimiter | None = None) -> None:
        self._bootstrap = bootstrap.encode()
        self.read = read
        self.clock = clock
        self.metrics_open = metrics_open
        self.limiter = limiter or FailureLimiter()
        self.refused = 0

    def is_open(self, route: Route | None) -> bool:
        """Whether ``route`` needs no token: its row says so, or it is ``GET /metrics`` on a
        node started with ``--metrics-open``."""
        return route is not None and (route.scope == OPEN
                                      or (self.metrics_open and route.key == ("GET", "/metrics")))

    def authenticate(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header. :raises Unauthorized: no bearer token,
        or one that is unknown, malformed, revoked or expired (the message says which, naming
        no secret)."""
        # The scheme is case-insensitive (RFC 9110, section 11.1).
        if not header or header[:7].lower() != "bearer ":
            raise Unauthorized("every request needs 'Authorization: Bearer <token>' (docs/security.md)")
        text = header[7:].strip()
        parsed = parse_token(text)
        if parsed is not None:
            tid, secret = parsed
            rec = self.read(queries.token_auth_jobs, tid)
            if rec is not None:
                role, tenants, expires, h, workers, jobs = rec
                if hmac.compare_digest(hash_secret(secret, h["salt"]), h["digest"]):
                    if expires is not None and self.clock.now_ms() >= expires:
                        raise Unauthorized(f"token {tid} expired at {schedule.iso(expires)}")
                    return Principal(tid, role, None if tenants is None else frozenset(tenants),
                                     None if workers is None else frozenset(workers),
                                     None if jobs is None else frozenset(jobs))
                raise Unauthorized("unknown or revoked token")  # (a wrong secret: no wait makes it right)
            if self.read(queries.token_known, tid):
                raise Unauthorized("unknown or revoked token")  # revoked: final
            raise UnknownToken("unknown or revoked token")
        if self._bootstrap and hmac.compare_digest(text.encode(), self._bootstrap):
            return Principal(BOOTSTRAP_ID, "admin")
        raise Unauthorized("unknown token")


class UnknownToken(Unauthorized):
    """A token of the right form whose id this replica does not hold: unknown, revoked, or made
    by a write this replica has not applied yet (a node that just started and replays its log,
    one behind the leader). The middleware reads again after the read barrier before it says
    401 (node/api.py auth_middleware)."""


# ------------------------------------------------------------------ the middleware's part
# The request keys (PRINCIPAL, CLAIMED) are node/http.py's, imported above for the callers.


def check_request(auth: Auth, request: web.Request, route: Route | None, final: bool = True) -> Principal | None:
    """Authenticate and authorize one request to ``route`` (its row in the route table; None
    when it matched no route: 404, 405, which need a valid token only): the principal, or None
    for an open route. With ``final`` False, an UnknownToken is raised without being counted as
    a refusal: the caller looks again once the replica is known to hold every acknowledged
    write, and calls this again with ``final`` True.

    :raises TooManyRequests: the source sent too many refused tokens lately.
    :raises Unauthorized: see Auth.authenticate (the failure counts against the source).
    :raises Forbidden: the token's role lacks the route's scope (``scope`` names it), or a
        worker token bound to worker ids speaks for another id (``field`` id)."""
    if auth.is_open(route):
        return None
    source = request.remote or "?"
    now_s = auth.clock.monotonic_s()
    wait = auth.limiter.retry_after_s(source, now_s)
    if wait > 0:
        raise TooManyRequests(f"too many refused tokens from {source}; retry in {wait:.1f} s",
                              retry_after_s=round(wait, 1))
    try:
        principal = auth.authenticate(request.headers.get("Authorization"))
    except UnknownToken:
        if not final:
            raise
        _refused(auth, request, source, now_s)
        raise
    except Unauthorized:
        _refused(auth, request, source, now_s)
        raise
    return _authorized(request, route, principal)


def _refused(auth: Auth, request: web.Request, source: str, now_s: float) -> None:
    """Count a refused token against its source, and note the token id it claimed."""
    auth.refused += 1
    auth.limiter.failed(source, now_s)
    note_claimed(request)


def note_claimed(request: web.Request) -> None:
    """Note the token id the request's ``Authorization`` claims (the audit log's ``token`` of a
    request refused before a token was accepted), when it names one."""
    header = request.headers.get("Authorization") or ""
    parsed = parse_token(header[7:].strip()) if header[:7].lower() == "bearer " else None
    if parsed is not None:
        request[CLAIMED] = parsed[0]


def _authorized(request: web.Request, route: Route | None, principal: Principal) -> Principal:
    """``principal`` allowed to call ``route`` (check_request's second half)."""
    request[PRINCIPAL] = principal
    if request.match_info.http_exception is not None or route is None:
        return principal
    scope = route.scope
    if not principal.allows(scope):
        article = "an" if principal.role[:1] in "aeiou" else "a"
        raise Forbidden(f"{article} {principal.role} token may not {request.method} {route.key[1]}: it needs scope {scope}",
                        scope=scope)
    if principal.workers is not None and scope == "worker":
        wid = request.match_info.get("id")
        if wid not in principal.workers:
            shown = ", ".join(sorted(principal.workers)[:5]) + (", ..." if len(principal.workers) > 5 else "")
            raise Forbidden(f"this token speaks only for worker(s) {shown}: not for worker {str(wid)[:128]!r}",
                            field="id", scope=scope)
    if principal.jobs is not None and scope == "ping":
        name = request.match_info.get("name")
        if name not in principal.jobs:
            raise Forbidden(f"this ping token may ping only job(s) {', '.join(sorted(principal.jobs)[:5])}: "
                            f"not {str(name)[:128]!r}", field="name", scope=scope)
    return principal


# ------------------------------------------------------------------ the tokens endpoints
_TOKEN_BODY = {"role", "tenants", "expires", "note", "workers", "jobs"}


def validate_token_body(body, now_ms: int) -> dict:
    """``POST /v1/tokens``'s body -> token_create's ``{role, tenants, expires, note}`` (and
    ``workers``, when the body binds a worker token to worker ids).

    :raises InvalidSpec: naming the field."""
    if not isinstance(body, dict):
        raise InvalidSpec("the body must be a JSON object", field=None)
    for k in body:
        if k not in _TOKEN_BODY:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(_TOKEN_BODY))}", field=str(k))
    role = body.get("role")
    if role is None:
        raise InvalidSpec(f"is required: one of {', '.join(ROLES)}", field="role")
    if role not in ROLES:
        raise InvalidSpec(f"must be one of {', '.join(ROLES)}", field="role")
    tenants = body.get("tenants")
    if tenants is not None:
        if not isinstance(tenants, list) or not 1 <= len(tenants) <= limits.token_tenants_max:
            raise InvalidSpec(f"must be a list of 1-{limits.token_tenants_max} tenant names, or null (every tenant)",
                              field="tenants")
        for i, t in enumerate(tenants):
            check_name(t, f"tenants[{i}]", limits.tenant_name_chars_max)
        if len(set(tenants)) != len(tenants):
            raise InvalidSpec("lists a tenant twice", field="tenants")
        if role == "admin":
            raise InvalidSpec("an admin token cannot be limited to tenants: it can make any token "
                              "(docs/security.md)", field="tenants")
        tenants = sorted(tenants)
    workers = body.get("workers")
    if workers is not None:
        if role != "worker":
            raise InvalidSpec("only a worker token can be bound to worker ids", field="workers")
        if not isinstance(workers, list) or not 1 <= len(workers) <= limits.token_workers_max:
            raise InvalidSpec(f"must be a list of 1-{limits.token_workers_max} worker ids, or null (any id)",
                              field="workers")
        for i, w in enumerate(workers):
            check_worker_id(w, f"workers[{i}]")
        if len(set(workers)) != len(workers):
            raise InvalidSpec("lists a worker id twice", field="workers")
        workers = sorted(workers)
    jobs = body.get("jobs")
    if role == "ping" and jobs is None:
        raise InvalidSpec("is required for a ping token: the heartbeat jobs it may ping", field="jobs")
    if jobs is not None:
        if role != "ping":
            raise InvalidSpec("only a ping token is bound to jobs", field="jobs")
        if not isinstance(jobs, list) or not 1 <= len(jobs) <= limits.token_workers_max:
            raise InvalidSpec(f"must be a list of 1-{limits.token_workers_max} job names", field="jobs")
        for i, j in enumerate(jobs):
            check_name(j, f"jobs[{i}]")
        if len(set(jobs)) != len(jobs):
            raise InvalidSpec("lists a job twice", field="jobs")
        jobs = sorted(jobs)
    expires = body.get("expires")
    if expires is not None:
        if isinstance(expires, str):
            expires = schedule.parse_iso_ms(expires, "expires")
        elif isinstance(expires, bool) or not isinstance(expires, int):
            raise InvalidSpec("must be an ISO-8601 time or ms since the epoch", field="expires")
        if not now_ms < expires <= limits.time_ms_max:
            raise InvalidSpec(f"must be in the future, and before {schedule.iso(limits.time_ms_max)}",
                              field="expires")
    note = body.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > limits.token_note_chars_max):
        raise InvalidSpec(f"must be a string of at most {limits.token_note_chars_max} characters", field="note")
    out = {"role": role, "tenants": tenants, "expires": expires, "note": note}
    if workers is not None:
        out["workers"] = workers
    if jobs is not None:
        out["jobs"] = jobs
    return out


def token_view(t: dict, now_ms: int) -> dict:
    """A token record (queries.token_list) as GET /v1/tokens shows it."""
    state = ("revoked" if t["revoked"] is not None
             else "expired" if t["expires"] is not None and now_ms >= t["expires"] else "active")
    return {"id": t["id"], "role": t["role"], "tenants": t["tenants"], "workers": t["workers"], "jobs": t.get("jobs"), "state": state,
            "created_at": schedule.iso(t["created"]), "expires_at": schedule.iso(t["expires"]),
            "revoked_at": schedule.iso(t["revoked"]), "note": t["note"]}


async def create_token(request: web.Request) -> web.Response:
    """``POST /v1/tokens``: 201 with the token, shown this once."""
    svc = request.app[SERVICE]
    now = svc.clock.now_ms()
    f = validate_token_body(await json_body(request), now)
    if f["role"] == "ping" and f["tenants"] is None:
        # Bound to the tenants of the jobs it names as they are now: a job of that name that
        # another tenant makes later (the first one deleted) is not pinged by it (a review).
        named = f.get("jobs") or ()
        held = sorted(svc.read(lambda s: {s.jobs[j]["spec"]["tenant"] for j in named if j in s.jobs}))
        if held:
            f = dict(f, tenants=held)
    tid, token, h = new_token()
    res = await svc.propose(commands.token_create(now, rid(request) or secrets.token_hex(16), id=tid, hash=h,
                                                  fields=f))
    body = {"id": res["id"], "token": token, "role": f["role"], "tenants": f["tenants"],
            "workers": f.get("workers"), "jobs": f.get("jobs"), "expires_at": schedule.iso(f["expires"]), "note": f["note"]}
    if res.get("duplicate"):
        # The first answer showed the secret; it was never stored, so it cannot be shown again.
        # What the answer describes is the token that request made, as stored (a retry whose
        # body differs, another role say, must not read as a token of that role).
        made = next((t for t in svc.read(queries.token_list) if t["id"] == res["id"]), None)
        if made is not None:
            body.update({k: v for k, v in token_view(made, now).items() if k not in ("id", "created_at")})
        body.update(token=None, duplicate=True,
                    warning="this request id created the token already; its secret was shown once, by "
                            "that answer. If it was lost, revoke the token and create another.")
        return json_response(body, status=200)
    named = f.get("jobs") or ()
    missing = sorted(svc.read(lambda s: [j for j in named if j not in s.jobs])) if named else []
    if missing:
        # Accepted (a job may be put after the token that pings it), but a typo would ping nothing.
        body["warnings"] = [f"jobs: no job named {j!r} (yet): this token's pings of it are refused until one is "
                            f"put" for j in missing]
    return json_response(body, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    """``GET /v1/tokens``: every token, without secrets or hashes, and the bootstrap token."""
    svc = request.app[SERVICE]
    now = svc.clock.now_ms()
    out = [{"id": BOOTSTRAP_ID, "role": "admin", "tenants": None, "workers": None, "state": "active", "created_at": None,
            "expires_at": None, "revoked_at": None, "note": "the nodes' --token-file"}]
    out += [token_view(t, now) for t in svc.read(queries.token_list)]
    return json_response({"tokens": out})


async def revoke_token(request: web.Request) -> web.Response:
    """``DELETE /v1/tokens/{id}``: refused by every node from the moment it has applied it."""
    svc = request.app[SERVICE]
    tid = request.match_info["id"]
    if tid == BOOTSTRAP_ID:
        raise InvalidSpec("the bootstrap token is the nodes' --token-file: write a new file and restart "
                          "the nodes one by one (docs/security.md, \"Rotating\")", field="id")
    if not TOKEN_ID_RE.fullmatch(tid):
        raise InvalidSpec("must be a token id: 16 lowercase hex digits, as GET /v1/tokens lists them", field="id")
    res = await svc.propose(commands.token_revoke(svc.clock.now_ms(), rid(request) or secrets.token_hex(16),
                                                  id=tid))
    return json_response(svc._out(res, {"id": tid, "revoked_at": schedule.iso(res["revoked"])}))


async def whoami(request: web.Request) -> web.Response:
    """The caller's token: its id, role, tenants and scopes (what a dashboard may offer it)."""
    p: Principal = request[PRINCIPAL]
    return json_response({"id": p.id, "role": p.role,
                              "tenants": None if p.tenants is None else sorted(p.tenants),
                              "scopes": sorted(ROLE_SCOPES[p.role])})


#: The tokens endpoints' rows of the route table (node/routes.py): an admin's (scope tokens);
#: and whoami, every reading token's.
TOKEN_ROUTES = (
    Route("GET", "/v1/whoami", whoami, "read", Tenancy.SHARED, "the caller's token: id, role, tenants, scopes", response="whoami"),
    Route("POST", "/v1/tokens", create_token, "tokens", Tenancy.REFUSED,
          "make a token (shown this once)", body="token", ok=201, also_ok=(200,), errors=(422,), response="token_created"),
    Route("GET", "/v1/tokens", list_tokens, "tokens", Tenancy.REFUSED,
          "every token, without secrets", params=(STALE, CONSISTENT), response="tokens"),
    Route("DELETE", "/v1/tokens/{id}", revoke_token, "tokens", Tenancy.REFUSED,
          "revoke a token", errors=(404, 422), response="token_revoked"),
)


