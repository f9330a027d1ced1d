"""A hostile-input suite against a real node (one node process, shared by the module).

A table of hostile requests (``ROWS``), each with the status a token allowed to make it gets, is
sent with the token of every role (admin, operator, reader, worker, an operator limited to a
tenant, a worker token limited to a tenant and bound to a worker id, and none), and around each row the state's hash (``GET /v1/cluster?hash=true``) proves
that nothing changed. Whatever the role: no 5xx, and no 2xx for an operation the role may not
perform (403 for a missing scope, 401 without a valid token). Rows that fail before any token is
looked at (the HTTP parser's limits) get the same answer for every role.

Rows of the worker protocol (``/v1/workers/{id}/...``) are skipped if a node does not serve
those routes (they are checked to exist first).

Also here, because they need the node to execute: shell metacharacters in argv stay arguments.
"""
from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from raftsched.node import api, routes
from raftsched.node.auth import ROLE_SCOPES

from procs import Cluster, wait_for

pytestmark = pytest.mark.cluster

ROLES = ("admin", "operator", "reader", "worker", "limited", "bound", None)
#: the role each test role's token has: "limited" is an operator limited to tenant billing,
#: "bound" a worker token limited to billing and bound to worker id w-bound (the rows' worker
#: routes name another id: 403)
BASE_ROLE = {"limited": "operator", "bound": "worker"}
SPEC = {"schedule": {"every_s": 86_400}, "executor": {"type": "shell", "argv": ["true"]},
        "misfire": {"policy": "skip"}}
HTTP_SPEC = {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"},
             "executor": {"type": "http", "url": "http://127.0.0.1:9/hook", "headers": {"X-Api-Key": "k-123456"}}}


_TABLE = routes.table(api.ROUTES)


def scope_of(method: str, route: str) -> str:
    """The scope the route table gives ``method route``."""
    return routes.lookup(_TABLE, method, route).scope


@dataclass
class Node:
    cluster: Cluster
    tokens: dict = field(default_factory=dict)
    port: int = 0

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                token: str | None = None, timeout: float = 30.0) -> tuple[int, object]:
        """One request over a fresh connection, sent as given (http.client normalises nothing)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            h = dict(headers or {})
            if token is not None and "Authorization" not in h:
                h["Authorization"] = f"Bearer {token}"
            if body is not None and "Content-Length" not in h:
                h["Content-Length"] = str(len(body))
            conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
            for k, v in h.items():
                conn.putheader(k, v)
            conn.endheaders()
            if body is not None:
                try:
                    conn.send(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the node answered before reading it all: the answer is what counts
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")
        finally:
            conn.close()

    def state_hash(self) -> str:
        s, b = self.request("GET", "/v1/cluster?hash=true", token=self.tokens["admin"])
        assert s == 200, b
        return b["state_hash"]

    def fingerprint(self, what: str):
        """What a row proves unchanged (Row.unchanged)."""
        if what == "state":
            return self.state_hash()
        s, b = self.request("GET", "/v1/runs?limit=10000", token=self.tokens["admin"])
        assert s == 200, b
        return b["runs"]


def _j(v) -> bytes:
    return json.dumps(v).encode()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    # Many forged tokens come from one address here: the failure limiter gets a large bucket.
    c = Cluster(tmp_path_factory.mktemp("hostile"), n=1,
                node_args=["--auth-failures-burst", "1000000", "--slots", "2",
                           # No workers_seen while the rows run: the state hash moves by their requests only.
                           "--workers-seen-interval-s", "3600"])
    c.start()
    try:
        c.wait_leader(30)
        n = Node(c, {"admin": c.token}, c.api_ports[0])
        for role in ("operator", "reader", "worker"):
            s, b = n.request("POST", "/v1/tokens", _j({"role": role}), token=c.token)
            assert s == 201, b
            n.tokens[role] = b["token"]
        s, b = n.request("POST", "/v1/tokens", _j({"role": "operator", "tenants": ["billing"]}), token=c.token)
        n.tokens["limited"] = b["token"]
        s, b = n.request("POST", "/v1/tokens", _j({"role": "worker", "tenants": ["billing"], "workers": ["w-bound"]}),
                         token=c.token)
        assert s == 201, b
        n.tokens["bound"] = b["token"]
        s, b = n.request("POST", "/v1/tokens", _j({"role": "admin"}), token=c.token)
        n.tokens["revoked"] = b["token"]
        assert n.request("DELETE", f"/v1/tokens/{b['id']}", token=c.token)[0] == 200
        soon = int(time.time() * 1000) + 1500
        s, b = n.request("POST", "/v1/tokens", _j({"role": "admin", "expires": soon}), token=c.token)
        n.tokens["expired"] = b["token"]
        for name, spec in (("victim", HTTP_SPEC), ("billjob", dict(SPEC, tenant="billing")),
                           ("rare", dict(SPEC, schedule={"cron": "0 0 0 29 2 *"})),
                           ("everysec", dict(SPEC, schedule={"cron": "* * * * * *", "timezone": "Europe/Berlin"},
                                             overlap={"policy": "forbid"})),
                           ("replay", SPEC)):
            headers = {"Idempotency-Key": "replay-key-1"} if name == "replay" else {}
            s, b = n.request("PUT", f"/v1/jobs/{name}", _j(spec), headers, token=c.token)
            assert s == 201, b
        # The every-second job must not fire while rows run (the hash would move): paused.
        assert n.request("POST", "/v1/jobs/everysec/pause", token=c.token)[0] == 200
        wait_for(lambda: time.time() * 1000 > soon, 10, "the short-lived token to expire")
        yield n
    finally:
        c.stop()


@dataclass(frozen=True)
class Row:
    """A hostile request and the status a token allowed to make it gets.

    :param route: the route it reaches (None: no route, any valid token gets ``status``).
    :param pre_auth: refused by the HTTP layer before any token is looked at: every role,
        even none, gets ``status``.
    :param token: a fixed token (``revoked``, ``expired``, or a literal): the row is sent once.
    :param needs_route: skipped while the node does not serve this route (the worker protocol).
    :param unchanged: what is proved unchanged: ``state`` (its hash), or ``runs`` (every run as
        the API shows it) for a request that may reach the log to be refused there, which
        counts in the state (the worker protocol's stale completions and heartbeats).
    """

    name: str
    method: str
    path: str
    body: bytes | None = None
    headers: tuple = ()
    status: int | tuple = 422
    route: str | None = None
    pre_auth: bool = False
    token: str | None = None
    needs_route: bool = False
    unchanged: str = "state"

    def statuses(self) -> tuple:
        return self.status if isinstance(self.status, tuple) else (self.status,)


def put_row(name: str, spec, status=422, path="/v1/jobs/x", raw: bytes | None = None) -> Row:
    return Row(name, "PUT", path, raw if raw is not None else _j(spec), status=status, route="/v1/jobs/{name}")


def with_field(path: str, value):
    """SPEC (or HTTP_SPEC, for executor.url/headers) with the dotted ``path`` set to ``value``."""
    base = json.loads(json.dumps(HTTP_SPEC if path.startswith(("executor.url", "executor.headers")) else SPEC))
    if path.startswith("retry."):
        base["retry"] = {}
    if path.startswith("overlap."):
        base["overlap"] = {}
    if path.startswith("schedule.cron") or path == "schedule.timezone":
        base["schedule"] = {"cron": "* * * * *"}
    keys = path.split(".")
    d = base
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    return base


#: Fields of a job spec by the kind of value they take; each gets every value of another kind.
FIELDS = {
    "int": ["schedule.every_s", "misfire.grace_s", "misfire.max_catchup", "timeout_s", "priority", "history",
            "retry.max_attempts", "overlap.max_concurrent", "jitter_s"],
    "num": ["retry.backoff_s", "retry.backoff_multiplier", "retry.backoff_max_s", "retry.jitter"],
    "str": ["schedule.cron", "schedule.timezone", "executor.type", "executor.url", "misfire.policy", "queue",
            "tenant", "description", "overlap.policy"],
    "obj": ["schedule", "executor", "misfire", "retry", "overlap", "executor.headers", "executor.env", "secrets"],
    "list": ["executor.argv"],
    "bool": ["keep_output"],
}
WRONG = {
    "int": ["5", True, [5], {"n": 5}, 1.5],
    "num": ["1", True, [1], {"n": 1}],
    "str": [5, True, ["x"], {"s": "x"}],
    "obj": ["x", 5, True, ["x"]],
    "list": ["ls -l", 5, {"0": "ls"}, [1, 2]],
    "bool": ["false", 0, []],  # null is the default (test_job_nulls.py)
}


def _wrong_type_rows() -> list[Row]:
    rows = []
    for kind, paths in FIELDS.items():
        for p in paths:
            for v in WRONG[kind]:
                spec = with_field(p, v)
                if p == "executor.env":
                    spec["executor"] = {"type": "shell", "argv": ["true"], "env": v}
                rows.append(put_row(f"wrong type {p}={json.dumps(v)}", spec))
    return rows


NAME_10K = "j" * 10_000
ROWS: list[Row] = [
    # ---- sizes
    put_row("body over 64 KiB", None, 413, raw=_j(dict(SPEC, description="x" * 70_000))),
    Row("batch body claimed over 16 MiB", "POST", "/v1/jobs:batch", b'{"jobs": {}}',
        (("Content-Length", str(17 * 1024 * 1024)),), status=413, route="/v1/jobs:batch"),
    Row("a 10 KiB header", "GET", "/v1/jobs", None, (("X-Pad", "p" * 10_000),), status=(400, 431), pre_auth=True),
    Row("a 10 KiB Authorization header", "GET", "/v1/jobs", None, (("Authorization", "Bearer " + "t" * 10_000),),
        status=(400, 431), pre_auth=True),
    Row("a 10 000-character job name in the path", "PUT", "/v1/jobs/" + NAME_10K, _j(SPEC), status=(400, 414),
        pre_auth=True),
    put_row("a 129-character job name", SPEC, path="/v1/jobs/" + "n" * 129),
    Row("a 10 000-character job name in a batch", "POST", "/v1/jobs:batch", _j({"jobs": {NAME_10K: SPEC}}),
        route="/v1/jobs:batch"),
    Row("10 001 jobs in a batch", "POST", "/v1/jobs:batch", _j({"jobs": {f"j{i}": {} for i in range(10_001)}}),
        status=400, route="/v1/jobs:batch"),
    put_row("an argv of 257 items", with_field("executor.argv", ["x"] * 257)),
    put_row("33 secrets", dict(SPEC, secrets={f"S{i}": "v" for i in range(33)})),
    put_row("a payload nested 40 levels", dict(SPEC, payload=json.loads("[" * 40 + "]" * 40))),
    put_row("JSON nested 30 000 levels", None, 400, raw=b"[" * 30_000 + b"]" * 30_000),
    Row("JSON nested 500 000 levels in a batch", "POST", "/v1/jobs:batch", b'{"jobs": ' + b"[" * 500_000 + b"]" * 500_000 + b"}",
        status=400, route="/v1/jobs:batch"),
    put_row("a payload of 9 KB", dict(SPEC, payload="p" * 9000)),
    # ---- malformed bodies and requests
    put_row("not JSON", None, 400, raw=b"{nope"),
    put_row("an empty body", None, 400, raw=b""),
    put_row("JSON that is not an object", None, 422, raw=b"[1, 2]"),
    put_row("invalid UTF-8", None, 400, raw=b'{"description": "\xff\xfe"}'),
    put_row("a NUL in the body", None, 400, raw=b'{"schedule": \x00}'),
    Row("Content-Length and Transfer-Encoding both", "PUT", "/v1/jobs/x", b"0\r\n\r\n",
        (("Content-Length", "5"), ("Transfer-Encoding", "chunked")), status=400, pre_auth=True),
    Row("an unknown method", "BREW", "/v1/jobs", status=400, pre_auth=True),
    Row("TRACE", "TRACE", "/v1/jobs", status=405, route=None),
    # ---- NaN, Infinity, huge numbers
    put_row("every_s NaN", None, raw=b'{"schedule": {"every_s": NaN}, "executor": {"type": "shell", "argv": ["true"]}, '
                                     b'"misfire": {"policy": "skip"}}'),
    put_row("timeout_s Infinity", None, raw=_j(SPEC)[:-1] + b', "timeout_s": Infinity}'),
    put_row("backoff_s -Infinity", None, raw=_j(SPEC)[:-1] + b', "retry": {"backoff_s": -Infinity}}'),
    put_row("jitter NaN", None, raw=_j(SPEC)[:-1] + b', "retry": {"jitter": NaN}}'),
    put_row("a payload holding NaN", None, raw=_j(SPEC)[:-1] + b', "payload": {"x": NaN}}'),
    put_row("every_s 10**30", with_field("schedule.every_s", 10**30)),
    put_row("every_s 1e308", with_field("schedule.every_s", 1e308)),
    put_row("timeout_s 2**64", with_field("timeout_s", 2**64)),
    put_row("priority -2**63", with_field("priority", -2**63)),
    put_row("a payload integer of 2**64", dict(SPEC, payload={"n": 2**64})),
    put_row("an at time of 2**60 ms", with_field("schedule", {"at": 2**60})),
    put_row("a start_at of -1", with_field("schedule", {"every_s": 5, "start_at": -1})),
    put_row("a 5000-digit integer", None, 400, raw=_j(SPEC)[:-1] + b', "timeout_s": ' + b"9" * 5000 + b"}"),
    Row("a tenant rate of NaN", "PUT", "/v1/tenants/t", b'{"rate_per_s": NaN}', route="/v1/tenants/{name}"),
    Row("a tenant rate of 1e400", "PUT", "/v1/tenants/t", b'{"rate_per_s": 1e400}', route="/v1/tenants/{name}"),
    Row("a lock TTL of Infinity", "POST", "/v1/locks/l/acquire", b'{"owner": "me", "ttl_s": Infinity}',
        route="/v1/locks/{name}/acquire"),
    Row("a lock token of 2**70", "POST", "/v1/locks/l/renew", _j({"token": 2**70}), route="/v1/locks/{name}/renew"),
    Row("a queue depth of 2**63", "PUT", "/v1/queues/q", _j({"max_depth": 2**63}), route="/v1/queues/{name}"),
    Row("a token expiry of 1e300", "POST", "/v1/tokens", _j({"role": "reader", "expires": 1e300}), route="/v1/tokens"),
    Row("a token role of 5", "POST", "/v1/tokens", _j({"role": 5}), route="/v1/tokens"),
    Row("a token for a tenant given as a string", "POST", "/v1/tokens", _j({"role": "reader", "tenants": "billing"}),
        route="/v1/tokens"),
    # ---- query parameters
    Row("limit=abc", "GET", "/v1/jobs?limit=abc", status=400, route="/v1/jobs"),
    Row("limit=NaN", "GET", "/v1/runs?limit=NaN", status=400, route="/v1/runs"),
    Row("limit=10**20", "GET", "/v1/runs?limit=" + "9" * 20, status=400, route="/v1/runs"),
    Row("limit=-1", "GET", "/v1/dlq?limit=-1", status=400, route="/v1/dlq"),
    Row("state=bogus", "GET", "/v1/runs?state=bogus", status=400, route="/v1/runs"),
    # a name filter left empty (?job=$JOB) or no name: refused, not read as every one
    Row("jobs after= empty", "GET", "/v1/jobs?after=", status=400, route="/v1/jobs"),
    Row("jobs after=%20", "GET", "/v1/jobs?after=%20", status=400, route="/v1/jobs"),
    Row("backfills job= empty", "GET", "/v1/backfills?job=", status=400, route="/v1/backfills"),
    Row("backfills job=nosuch..", "GET", "/v1/backfills?job=.nosuch", status=400, route="/v1/backfills"),
    Row("dlq queue= empty", "GET", "/v1/dlq?queue=", status=400, route="/v1/dlq"),
    Row("dlq queue of 65 characters", "GET", "/v1/dlq?queue=" + "q" * 65, status=400, route="/v1/dlq"),
    Row("slot=yesterday", "GET", "/v1/jobs/victim/runs?slot=yesterday", status=400, route="/v1/jobs/{name}/runs"),
    Row("count=100000", "GET", "/v1/jobs/victim/preview?count=100000", status=400, route="/v1/jobs/{name}/preview"),
    Row("consistent=maybe", "GET", "/v1/jobs?consistent=maybe", status=400, route="/v1/jobs"),
    Row("an Idempotency-Key of 65 characters", "POST", "/v1/jobs/victim/pause", None,
        (("Idempotency-Key", "k" * 65),), status=400, route="/v1/jobs/{name}/pause"),
    # conditional headers a job has no entity tag for: refused, not ignored (a replace)
    Row("If-None-Match with an entity tag", "PUT", "/v1/jobs/victim", _j(SPEC), (("If-None-Match", '"abc"'),),
        status=400, route="/v1/jobs/{name}"),
    Row("If-Match on a job", "PUT", "/v1/jobs/victim", _j(SPEC), (("If-Match", "*"),), status=400,
        route="/v1/jobs/{name}"),
    # ---- membership: what is not a Raft address changes nothing
    Row("a member that is a list", "POST", "/v1/cluster/members", _j([]), route="/v1/cluster/members"),
    Row("a member without addr", "POST", "/v1/cluster/members", _j({}), route="/v1/cluster/members"),
    Row("a member addr of 5", "POST", "/v1/cluster/members", _j({"addr": 5}), route="/v1/cluster/members"),
    Row("a member addr without a port", "POST", "/v1/cluster/members", _j({"addr": "evil"}),
        route="/v1/cluster/members"),
    Row("a member port of 99999", "POST", "/v1/cluster/members", _j({"addr": "127.0.0.1:99999"}),
        route="/v1/cluster/members"),
    Row("CRLF in a member addr", "POST", "/v1/cluster/members", _j({"addr": "a\r\nb:1"}),
        route="/v1/cluster/members"),
    Row("a member addr of 100 KB", "POST", "/v1/cluster/members", _j({"addr": "h" * 60_000 + ":1"}),
        status=(413, 422), route="/v1/cluster/members"),
    Row("an unknown member field", "POST", "/v1/cluster/members", _j({"addr": "127.0.0.1:1", "as": "voter"}),
        route="/v1/cluster/members"),
    Row("traversal in a member to remove", "DELETE", "/v1/cluster/members/..%2F..%2Fx",
        route="/v1/cluster/members/{addr}"),
    Row("a member to remove without a port", "DELETE", "/v1/cluster/members/evil",
        route="/v1/cluster/members/{addr}"),
    # ---- unknown fields
    put_row("an unknown top-level field", dict(SPEC, command="rm -rf /")),
    put_row("an unknown executor field", with_field("executor.shell_line", "rm -rf /")),
    put_row("an unknown misfire field", with_field("misfire.when", "always")),
    put_row("an unknown schedule field", with_field("schedule.tz", "UTC")),
    Row("an unknown queue field", "PUT", "/v1/queues/q", _j({"max_depth": 5, "evil": 1}), route="/v1/queues/{name}"),
    Row("an unknown lock field", "POST", "/v1/locks/l/acquire", _j({"owner": "me", "ttl_s": 5, "steal": True}),
        route="/v1/locks/{name}/acquire"),
    # ---- names: traversal, confusables, control characters
    put_row("traversal in the job name", SPEC, path="/v1/jobs/..%2F..%2Fetc%2Fpasswd"),
    put_row("a job name of '..'", SPEC, path="/v1/jobs/%2E%2E"),
    Row("traversal that the router resolves", "GET", "/v1/jobs/../../etc/passwd", status=404, route=None),
    Row("traversal in a run id", "GET", "/v1/runs/..%2F..%2Fetc%2Fpasswd", status=404, route="/v1/runs/{run}"),
    Row("traversal in a DLQ run id", "DELETE", "/v1/dlq/..%2Fx", route="/v1/dlq/{run}"),
    Row("traversal in a DLQ requeue", "POST", "/v1/dlq/..%2F..%2Fx@1/requeue", route="/v1/dlq/{run}/requeue"),
    Row("traversal in a queue name", "PUT", "/v1/queues/..%2Fx", _j({"max_depth": 5}), route="/v1/queues/{name}"),
    Row("traversal in a token id", "DELETE", "/v1/tokens/..%2F..%2Fx", route="/v1/tokens/{id}"),
    put_row("traversal in the queue", dict(SPEC, queue="../../etc")),
    put_row("traversal in the tenant", dict(SPEC, tenant="../billing")),
    put_row("a cwd that is not a string", with_field("executor.cwd", 5)),
    put_row("a Cyrillic і in the name", SPEC, path="/v1/jobs/v%D1%96ctim"),
    put_row("a fullwidth name", SPEC, path="/v1/jobs/%EF%BD%96%EF%BD%89%EF%BD%83"),
    put_row("a zero-width space in the name", SPEC, path="/v1/jobs/victim%E2%80%8B"),
    put_row("a right-to-left override in the name", SPEC, path="/v1/jobs/%E2%80%AEmitciv"),
    put_row("a Cyrillic tenant", dict(SPEC, tenant="b\u0456lling")),
    put_row("a NUL in the name", SPEC, path="/v1/jobs/victim%00"),
    put_row("a newline in the name", SPEC, path="/v1/jobs/victim%0D%0AX-Injected:%201"),
    put_row("a confusable header name", with_field("executor.headers", {"X-Ap\u0456-Key": "v"})),
    # ---- header injection, URLs, environment
    put_row("CRLF in an executor header", with_field("executor.headers", {"X-A": "v\r\nX-Injected: 1"})),
    put_row("LF in an executor header", with_field("executor.headers", {"X-A": "v\nHost: evil"})),
    put_row("a header name with a colon", with_field("executor.headers", {"X-A: 1\r\nX-B": "v"})),
    put_row("CRLF in the URL", with_field("executor.url", "http://h/x\r\nHost: evil")),
    put_row("credentials in the URL", with_field("executor.url", "http://user:pw@h/x")),
    put_row("a file:// URL", with_field("executor.url", "file:///etc/passwd")),
    put_row("a NUL in an env value", dict(SPEC, executor={"type": "shell", "argv": ["true"], "env": {"A": "x\x00y"}})),
    put_row("a NUL in an argv item", dict(SPEC, executor={"type": "shell", "argv": ["echo", "a\x00b"]})),
    put_row("a NUL in cwd", dict(SPEC, executor={"type": "shell", "argv": ["true"], "cwd": "/tmp\x00x"})),
    put_row("a URL's port past 65535", with_field("executor.url", "http://h:99999/x")),
    put_row("a URL's port 0", with_field("executor.url", "http://h:0/x")),
    put_row("a URL's port not a number", with_field("executor.url", "http://h:8o/x")),
    put_row("'=' in an env name", dict(SPEC, executor={"type": "shell", "argv": ["true"], "env": {"A=B": "x"}})),
    put_row("a secret spoofing the run identity", dict(SPEC, secrets={"RAFTSCHED_FENCING_TOKEN": "999"})),
    put_row("a python target with a path", with_field("executor", {"type": "python", "target": "../../x:f"})),
    put_row("a python target with code", with_field("executor", {"type": "python", "target": "os:system('id')"})),
    # ---- cron and time zones
    put_row("a cron that never matches", with_field("schedule.cron", "0 0 30 2 *")),
    put_row("a cron of 257 characters", with_field("schedule.cron", "0," * 128 + "1 * * * *")),
    put_row("a cron with a random item", with_field("schedule.cron", "R * * * *")),
    put_row("a cron with a hashed item", with_field("schedule.cron", "H * * * *")),
    put_row("a rare cron with jitter scanned for its gaps", dict(with_field("schedule.cron", "0 0 0 29 2 1#5"),
                                                                   jitter_s=10**9)),
    put_row("a cron of wrapped ranges", with_field("schedule.cron", "59-0 23-0 31-1 12-1 6-0")),
    Row("a preview of 1000 leap days", "GET", "/v1/jobs/rare/preview?count=1000", status=200,
        route="/v1/jobs/{name}/preview"),
    Row("an explain of a year of every second", "POST", "/v1/jobs/everysec/explain",
        _j({"down_from": "2030-01-01T00:00:00Z", "down_to": "2031-01-01T00:00:00Z"}), status=200,
        route="/v1/jobs/{name}/explain"),
    Row("an explain of a window over 366 days", "POST", "/v1/jobs/everysec/explain",
        _j({"down_from": "2030-01-01T00:00:00Z", "down_to": "2032-01-03T00:00:00Z"}), status=400,
        route="/v1/jobs/{name}/explain"),
    Row("a preview of a spec that never matches", "POST", "/v1/preview", _j(with_field("schedule.cron", "0 0 31 2 *")),
        route="/v1/preview"),
    put_row("a time zone ../../etc/passwd", with_field("schedule.timezone", "../../etc/passwd")),
    put_row("a time zone /etc/passwd", with_field("schedule.timezone", "/etc/passwd")),
    put_row("a time zone with a NUL", with_field("schedule.timezone", "UTC\x00")),
    put_row("the host's own time zone", with_field("schedule.timezone", "localtime")),
    put_row("a time zone counting leap seconds", with_field("schedule.timezone", "right/UTC")),
    put_row("the zone database's posixrules", with_field("schedule.timezone", "posixrules")),
    put_row("the zone database's Factory", with_field("schedule.timezone", "Factory")),
    put_row("a time zone of 10 000 characters", with_field("schedule.timezone", "Z" * 10_000)),
    put_row("a time zone with a traversal inside", with_field("schedule.timezone", "Europe/../../../etc/passwd")),
    # ---- tokens: stale, forged
    Row("a revoked token", "GET", "/v1/jobs", status=401, token="revoked"),
    Row("a revoked token writing", "PUT", "/v1/jobs/x", _j(SPEC), status=401, token="revoked"),
    Row("an expired token", "GET", "/v1/jobs/victim", status=401, token="expired"),
    Row("an expired token writing", "POST", "/v1/tokens", _j({"role": "admin"}), status=401, token="expired"),
    Row("a forged token of the right shape", "GET", "/v1/jobs", status=401,
        token="rst_0123456789abcdef_" + "A" * 43),
    Row("the bootstrap token with a character more", "GET", "/v1/jobs", status=401, token="<bootstrap>x"),
    Row("a token in the wrong scheme", "GET", "/v1/jobs", None, (("Authorization", "Basic <bootstrap>"),),
        status=401, token="<header>"),
    Row("an empty bearer", "GET", "/v1/jobs", None, (("Authorization", "Bearer "),), status=401, token="<header>"),
    Row("a token with a NUL (the HTTP parser refuses it)", "GET", "/v1/jobs", status=400, token="<bootstrap>\x00"),
    # ---- replayed idempotency keys (the fixture put job "replay" with key replay-key-1, as the
    # bootstrap token: keys are the token's, so only its requests replay; another token's with the
    # same key are other requests: test_idempotency_keys_are_the_tokens)
    Row("a replayed key with another body", "PUT", "/v1/jobs/replay", _j(dict(SPEC, description="other")),
        (("Idempotency-Key", "replay-key-1"),), status=201, route="/v1/jobs/{name}", token="admin"),
    Row("a replayed key on another operation", "POST", "/v1/jobs/replay/pause", None,
        (("Idempotency-Key", "replay-key-1"),), status=409, route="/v1/jobs/{name}/pause", token="admin"),
    Row("a replayed key on another job", "DELETE", "/v1/jobs/victim", None,
        (("Idempotency-Key", "replay-key-1"),), status=409, route="/v1/jobs/{name}", token="admin"),
    # ---- framing headers: the executor sets them
    put_row("a Host header", with_field("executor.headers", {"Host": "metadata.internal"})),
    put_row("a Transfer-Encoding header", with_field("executor.headers", {"Transfer-Encoding": "chunked"})),
    put_row("a Content-Length header", with_field("executor.headers", {"content-length": "0"})),
    put_row("a Connection header", with_field("executor.headers", {"Connection": "keep-alive"})),
    put_row("a secret named Host on an http job", dict(HTTP_SPEC, secrets={"Host": "metadata.internal"})),
    Row("a tenant policy with an unknown executor", "PUT", "/v1/tenants/t", _j({"executors": ["exec"]}),
        route="/v1/tenants/{name}"),
    Row("a tenant policy allowing a malformed network", "PUT", "/v1/tenants/t", _j({"network": {"allow": ["10.0.0.300/8"]}}),
        route="/v1/tenants/{name}"),
    # ---- the worker protocol (issue 14's routes; run once they exist)
    Row("a completion for a run the worker does not hold", "POST", "/v1/workers/w-hostile/complete",
        _j({"results": [{"run": "victim@1", "token": 1, "success": True, "output": "", "error": None}]}),
        status=(200, 404, 409, 422), route="/v1/workers/{id}/complete", needs_route=True, unchanged="runs"),
    Row("a heartbeat with a forged fencing token", "POST", "/v1/workers/w-hostile/heartbeat",
        _j({"leases": [["victim@1", 2**40]]}), status=(200, 404, 409, 422), route="/v1/workers/{id}/heartbeat",
        needs_route=True, unchanged="runs"),
    Row("a lease request for 10**9 runs", "POST", "/v1/workers/w-hostile/lease", _j({"max": 10**9}),
        status=(400, 422), route="/v1/workers/{id}/lease", needs_route=True, unchanged="runs"),
    Row("a release of a run never leased", "POST", "/v1/workers/w-hostile/release",
        _j({"runs": [["victim@1", 1]]}), status=(200, 404, 409, 422), route="/v1/workers/{id}/release",
        needs_route=True, unchanged="runs"),
    # ---- issue 22: names matched whole, every integer bounded
    put_row("a job name with a final newline", SPEC, path="/v1/jobs/victim%0A"),
    put_row("a tenant with a final newline", dict(SPEC, tenant="billing\n")),
    put_row("a queue with a final newline", dict(SPEC, queue="default\n")),
    Row("a queue name with a final newline", "PUT", "/v1/queues/q%0A", _j({"max_depth": 5}), route="/v1/queues/{name}"),
    Row("a lease wait_s of 10**400", "POST", "/v1/workers/w-hostile/lease",
        _j({"slots": 1, "executors": ["shell"], "max": 1, "wait_s": 10**400}), route="/v1/workers/{id}/lease",
        needs_route=True, unchanged="runs"),
    Row("a heartbeat fencing token of 2**64", "POST", "/v1/workers/w-hostile/heartbeat",
        _j({"leases": [["victim@1", 2**64]]}), route="/v1/workers/{id}/heartbeat", needs_route=True,
        unchanged="runs"),
    Row("limit=1_0", "GET", "/v1/runs?limit=1_0", status=400, route="/v1/runs"),
    Row("a slot after the year 9999 in UTC", "GET", "/v1/jobs/victim/runs?slot=9999-12-31T23:59:59-14:00",
        status=400, route="/v1/jobs/{name}/runs"),
    put_row("an at time in the year 10000 in UTC", with_field("schedule", {"at": "9999-12-31T23:59:59-14:00"})),
] + _wrong_type_rows()


def _token(node: Node, row: Row, role):
    """The Authorization to send: the row's fixed token, or the role's."""
    if row.token is None:
        return node.tokens.get(role) if role is not None else None
    if row.token in node.tokens:
        return node.tokens[row.token]
    return row.token.replace("<bootstrap>", node.tokens["admin"])


def _allowed(row: Row, role) -> tuple:
    """The statuses ``role`` may get for ``row``."""
    if row.pre_auth or row.token is not None:
        return row.statuses()
    if role is None:
        return (401,)
    if row.route is None:
        return row.statuses()
    scope = scope_of(row.method, row.route)
    if scope not in ROLE_SCOPES[BASE_ROLE.get(role, role)]:
        return (403,)
    if role == "bound":  # its one worker id is not the rows' (w-hostile)
        return (403,)
    if role == "limited":  # another tenant's job does not exist for it; a spec outside billing is 403
        return row.statuses() + (403, 404)
    return row.statuses()


def _send(node: Node, row: Row, role):
    headers = dict(row.headers)
    if row.token == "<header>":
        headers = {k: v.replace("<bootstrap>", node.tokens["admin"]) for k, v in headers.items()}
        token = None
    else:
        token = _token(node, row, role)
    return node.request(row.method, row.path, row.body, headers, token=token)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_hostile_request_with_every_role_changes_nothing(node, row):
    if row.needs_route:
        s, b = node.request(row.method, row.path, row.body, dict(row.headers), token=node.tokens["admin"])
        if s == 404 and isinstance(b, dict) and b.get("error", {}).get("message") == "Not Found":
            pytest.skip(f"{row.route}: the node does not serve the worker protocol yet")
    before = node.fingerprint(row.unchanged)
    roles = (None,) if row.token is not None else ROLES
    for role in roles:
        status, body = _send(node, row, role)
        assert status < 500, (role, status, body)
        want = _allowed(row, role)
        assert status in want, f"{row.name} as {role}: {status} {str(body)[:300]}; expected one of {want}"
        if 200 <= status < 300:
            fixed = row.token if row.token in ROLE_SCOPES else "reader"  # a row sent with one role's token
            assert row.route is not None and scope_of(row.method, row.route) in ROLE_SCOPES[
                BASE_ROLE.get(role, role or fixed)], (role, row.name)
        if isinstance(body, dict) and "error" in body:
            assert set(body["error"]) >= {"code", "message", "field"}, body
            text = json.dumps(body)
            assert "k-123456" not in text and node.tokens["admin"] not in text, "no secret in an error"
    assert node.fingerprint(row.unchanged) == before, f"{row.name}: the {row.unchanged} changed"


def test_a_replayed_key_left_the_first_spec_in_place(node):
    s, b = node.request("GET", "/v1/jobs/replay", token=node.tokens["admin"])
    assert s == 200 and "description" not in b["spec"]


def test_reads_by_every_role_show_no_secret(node):
    for role in ("admin", "operator", "reader"):
        for path in ("/v1/jobs/victim", "/v1/jobs", "/v1/runs", "/v1/cluster", "/metrics"):
            s, b = node.request("GET", path, token=node.tokens[role])
            assert s == 200, (role, path, b)
            assert "k-123456" not in (b if isinstance(b, str) else json.dumps(b)), (role, path)


def test_a_dead_connection_mid_request_does_not_hurt_the_node(node):
    """Half a request, then the client goes away; then a slowloris-style partial header."""
    for data in (b"PUT /v1/jobs/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"sch",
                 b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthor"):
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:
            s.sendall(data)
    assert node.request("GET", "/healthz")[0] == 200


def test_shell_metacharacters_in_argv_stay_arguments(node, tmp_path):
    """Every item of argv reaches the program as one argument, unexpanded: no shell is involved."""
    marker = tmp_path / "pwned"
    evil = ["$(touch {m})", "`touch {m}`", "; touch {m}", "| touch {m}", "&& touch {m}", "> {m}", "*", "$HOME",
            "'quoted' \"double\"", "\\n\\x00", "-rf /"]
    args = [a.format(m=marker) for a in evil]
    spec = {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"},
            "executor": {"type": "shell", "argv": ["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
                                                   *args]}}
    tok = node.tokens["admin"]
    assert node.request("PUT", "/v1/jobs/metachars", _j(spec), token=tok)[0] == 201
    s, b = node.request("POST", "/v1/jobs/metachars/trigger", token=tok)
    assert s == 201, b
    run = b["run"]

    def done():
        s, r = node.request("GET", f"/v1/runs/{run}", token=tok)
        return (r,) if s == 200 and r["state"] in ("succeeded", "dead", "failed") else None
    r = wait_for(done, 30, "the run to finish")[0]
    assert r["state"] == "succeeded", r
    assert json.loads(r["output"]) == args
    assert not marker.exists()


def test_the_node_log_and_the_audit_log_hold_no_token_or_secret(node):
    """After a request whose token the HTTP parser refuses (a NUL in it) and one with a token of
    the wrong role (and, in a whole run, every row above)."""
    c = node.cluster
    assert node.request("GET", "/v1/jobs", token=node.tokens["admin"] + "\x00")[0] == 400
    assert node.request("PUT", "/v1/jobs/x", _j(SPEC), token=node.tokens["reader"])[0] == 403

    def logged():
        text = c.log_path(0).read_text(errors="replace")
        return (text,) if "BadHttpMessage 400" in text else None
    log_text = wait_for(logged, 10, "the parser's refusal in the node log")[0]
    audit = (c.data_dir(0) / "audit.jsonl").read_text()
    assert '"status":403' in audit
    refused = c.data_dir(0) / "audit-refused.jsonl"  # the forged tokens' counts, once a minute is over
    for text in (log_text, audit, refused.read_text() if refused.exists() else ""):
        for tok in (*node.tokens.values(), "k-123456"):
            secret = tok.split("_", 2)[2] if tok.startswith("rst_") else tok
            assert secret not in text


# ------------------------------------------------------------------ tenants (issue 22)
def _operator_of(node: Node, tenant: str) -> str:
    s, b = node.request("POST", "/v1/tokens", _j({"role": "operator", "tenants": [tenant]}), token=node.tokens["admin"])
    assert s == 201, b
    return b["token"]


def _http_job(tenant: str, queue: str, url: str = "https://example.com/hook") -> dict:
    return {"schedule": {"every_s": 86_400}, "misfire": {"policy": "skip"}, "tenant": tenant, "queue": queue,
            "executor": {"type": "http", "url": url}}


def _finished(node: Node, run: str, token: str) -> dict:
    def done():
        s, r = node.request("GET", f"/v1/runs/{run}", token=token)
        return (r,) if s == 200 and r["state"] in ("succeeded", "dead", "failed", "skipped") else None
    return wait_for(done, 30, f"run {run} to finish")[0]


class _Hits(http.server.BaseHTTPRequestHandler):
    hits: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Hits.hits.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_limited_operator_runs_http_jobs_only_and_only_to_public_addresses(node):
    """Closed by default: a token limited to tenants writes http jobs only, and their runs may not
    reach the node's own host (loopback, by name or address), the link-local network or the cloud
    metadata service: refused after resolution, before anything is sent. An admin's job to the same
    URL still runs (its rights are today's), and so does the limited token's once an admin allows
    the network."""
    tok = node.tokens["limited"]  # billing
    admin = node.tokens["admin"]
    s, e = node.request("PUT", "/v1/jobs/pol-shell", _j(dict(SPEC, tenant="billing", queue="billing-q")), token=tok)
    assert s == 403 and e["error"]["field"] == "executor.type", e
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hits)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        _Hits.hits.clear()
        for name, url, why in (("pol-name", f"http://localhost:{port}/limited", "loopback"),
                               ("pol-addr", f"http://127.0.0.1:{port}/limited", "loopback"),
                               ("pol-meta", "http://169.254.169.254/latest/meta-data/", "cloud metadata")):
            s, b = node.request("PUT", f"/v1/jobs/{name}", _j(_http_job("billing", "billing-q", url)), token=tok)
            assert s == 201, b
            s, b = node.request("POST", f"/v1/jobs/{name}/trigger", token=tok)
            assert s == 201, b
            r = _finished(node, b["run"], tok)
            assert r["state"] == "dead" and "refused by the network policy of tenant" in r["error"], r
            assert why in r["error"], r
        assert _Hits.hits == [], "nothing was sent"
        assert node.request("PUT", "/v1/jobs/pol-admin", _j(_http_job("billing", "billing-q", f"http://127.0.0.1:{port}/admin")),
                            token=admin)[0] == 201
        s, b = node.request("POST", "/v1/jobs/pol-admin/trigger", token=admin)
        assert _finished(node, b["run"], admin)["state"] == "succeeded"
        assert _Hits.hits == ["/admin"]
        s, b = node.request("PUT", "/v1/tenants/billing", _j({"network": {"allow": ["127.0.0.1/32"]}}), token=admin)
        assert s == 200, b
        s, b = node.request("POST", "/v1/jobs/pol-addr/trigger", token=tok)
        assert _finished(node, b["run"], tok)["state"] == "succeeded"
        assert _Hits.hits == ["/admin", "/limited"]
    finally:
        srv.shutdown()
        srv.server_close()
        assert node.request("DELETE", "/v1/tenants/billing", token=admin)[0] == 200
        for name in ("pol-name", "pol-addr", "pol-meta", "pol-admin"):
            node.request("DELETE", f"/v1/jobs/{name}", token=admin)


def test_a_job_moved_to_another_tenant_keeps_its_old_runs_from_the_new_one(node):
    """Hole 3: the new tenant's token saw the old tenant's runs, with their output, in the job's
    run list. A run belongs to the tenant its job had when the run was made, everywhere."""
    admin, tok = node.tokens["admin"], node.tokens["limited"]  # billing
    assert node.request("PUT", "/v1/jobs/mover", _j(_http_job("ops", "ops-q", "http://127.0.0.1:9/")), token=admin)[0] == 201
    s, b = node.request("POST", "/v1/jobs/mover/trigger", token=admin)
    old = b["run"]
    _finished(node, old, admin)
    assert node.request("PUT", "/v1/jobs/mover", _j(_http_job("billing", "ops-q", "http://127.0.0.1:9/")),
                        token=admin)[0] == 200
    s, b = node.request("GET", "/v1/jobs/mover/runs", token=tok)
    assert s == 200 and old not in [r["id"] for r in b["runs"]], "ops's run is not billing's"
    assert node.request("GET", f"/v1/runs/{old}", token=tok)[0] == 404
    s, b = node.request("GET", f"/v1/runs/{old}", token=admin)
    assert s == 200 and b["tenant"] == "ops"
    node.request("DELETE", "/v1/jobs/mover", token=admin)


def test_a_limited_tokens_answer_does_not_say_whether_another_tenant_holds_a_name(node):
    """Hole 4: an invalid PUT into another tenant's job name answered 403, into a free name 422."""
    tok = node.tokens["limited"]
    bad = dict(_http_job("billing", "billing-q"), timeout_s=0)
    answers = []
    for name in ("victim", "nobody-has-this-name"):  # victim is tenant default's
        before = node.state_hash()
        s, e = node.request("PUT", f"/v1/jobs/{name}", _j(bad), token=tok)
        answers.append((s, e["error"]["code"], e["error"]["field"]))
        assert node.state_hash() == before
    assert answers[0] == answers[1] == (422, "invalid", "timeout_s"), answers


def test_idempotency_keys_are_the_tokens(node):
    """Hole 5: another token's key answered 409 naming the request it was used for."""
    admin, tok = node.tokens["admin"], node.tokens["limited"]
    key = {"Idempotency-Key": "hole5-key"}
    s, b = node.request("PUT", "/v1/jobs/hole5-secret-name", _j(_http_job("default", "default")), key, token=admin)
    assert s == 201, b
    s, b = node.request("POST", "/v1/jobs/billjob/pause", None, key, token=tok)
    assert s == 200 and "hole5-secret-name" not in json.dumps(b), b
    assert node.request("POST", "/v1/jobs/billjob/resume", token=tok)[0] == 200
    node.request("DELETE", "/v1/jobs/hole5-secret-name", token=admin)


def test_a_tenant_cannot_squat_another_tenants_queue(node):
    """Hole 6: a tenant put its jobs into another tenant's queue and saw its counts, and the owner
    was then refused (403) changing its own queue."""
    ta, tb = _operator_of(node, "ta"), _operator_of(node, "tb")
    assert node.request("PUT", "/v1/jobs/ta-job", _j(_http_job("ta", "q-ta")), token=ta)[0] == 201
    s, e = node.request("PUT", "/v1/jobs/tb-job", _j(_http_job("tb", "q-ta")), token=tb)
    assert s == 403 and e["error"]["field"] == "queue", e
    s, b = node.request("GET", "/v1/queues", token=tb)
    assert s == 200 and "q-ta" not in [q["name"] for q in b["queues"]]
    s, b = node.request("PUT", "/v1/queues/q-ta", _j({"max_depth": 50}), token=ta)
    assert s == 200, b
    node.request("DELETE", "/v1/jobs/ta-job", token=node.tokens["admin"])
