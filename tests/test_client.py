"""raftsched.client against one real node, and examples/fenced_store.FencedStore (docs/fencing.md)."""
from __future__ import annotations

import importlib.util
import os
import sqlite3
import sys
import threading
import time

import pytest

from procs import REPO, free_ports, running_cluster, wait_for

from raftsched.client import Client, Lease, LockHeld, LockLost
from raftsched.core import limits
from raftsched.core.errors import Conflict, InvalidSpec, NotFound, Unauthorized, Unavailable


def _load_fenced_store():
    spec = importlib.util.spec_from_file_location("fenced_store", REPO / "examples" / "fenced_store.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fenced_store", mod)
    spec.loader.exec_module(mod)
    return mod


fenced_store = _load_fenced_store()
FencedStore, StaleToken = fenced_store.FencedStore, fenced_store.StaleToken

SPEC = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]},
        "misfire": {"policy": "skip"}}


# ---------------------------------------------------------------------- FencedStore (no network)
@pytest.fixture
def store(tmp_path):
    s = FencedStore(tmp_path / "store.db")
    yield s
    s.close()


def test_store_refuses_lower_token(store):
    store.write("r", {"v": 1}, token=5)
    with pytest.raises(StaleToken) as ei:
        store.write("r", {"v": 2}, token=4)
    assert (ei.value.resource, ei.value.token, ei.value.highest) == ("r", 4, 5)
    assert "4" in str(ei.value) and "5" in str(ei.value)
    assert store.read("r") == {"v": 1}
    assert store.highest_token("r") == 5


def test_store_accepts_equal_and_higher_tokens(store):
    store.write("r", "a", token=3)
    store.write("r", "b", token=3)  # the same holder writing again
    assert store.read_with_token("r") == ("b", 3)
    store.write("r", "c", token=9)
    assert store.read_with_token("r") == ("c", 9)
    assert store.read("missing") is None and store.highest_token("missing") is None


def test_store_tokens_are_per_resource(store):
    store.write("a", 1, token=10)
    store.write("b", 2, token=2)  # a lower token is fine for another resource
    with pytest.raises(StaleToken):
        store.write("b", 3, token=1)
    assert store.read("a") == 1 and store.read("b") == 2


def test_store_rejects_non_integer_tokens(store):
    for bad in (None, "3", 1.5, True, -1):
        with pytest.raises(ValueError):
            store.write("r", 1, token=bad)


def test_store_persists_across_connections(tmp_path):
    with FencedStore(tmp_path / "s.db") as s1:
        s1.write("r", "x", token=7)
    with FencedStore(tmp_path / "s.db") as s2:
        assert s2.read_with_token("r") == ("x", 7)
        with pytest.raises(StaleToken):
            s2.write("r", "y", token=6)


def test_store_check_and_write_are_one_transaction(tmp_path):
    """While another connection holds the write lock and raises the fence, a write with a
    lower token waits, then is refused: it cannot check against the old value and write after."""
    path = tmp_path / "s.db"
    s = FencedStore(path)
    s.write("r", "old", token=3)
    other = sqlite3.connect(path, isolation_level=None, timeout=10)
    other.execute("BEGIN IMMEDIATE")  # what a second process's FencedStore.write does first
    result: dict = {}
    done = threading.Event()

    def stale_writer():
        try:
            s.write("r", "stale", token=5)
            result["ok"] = True
        except StaleToken as e:
            result["err"] = e
        finally:
            done.set()

    t = threading.Thread(target=stale_writer)
    t.start()
    try:
        assert not done.wait(0.3), "the write did not wait for the other transaction"
        other.execute("UPDATE fence SET token = 8 WHERE resource = 'r'")
        other.execute("UPDATE kv SET value = '\"new\"', token = 8 WHERE resource = 'r'")
        other.execute("COMMIT")
        assert done.wait(10)
    finally:
        t.join(10)
        other.close()
    assert "ok" not in result and result["err"].highest == 8
    assert s.read_with_token("r") == ("new", 8)
    s.close()


def test_store_concurrent_writers_keep_the_highest(tmp_path):
    """Two connections hammering one resource with interleaved tokens: the stored value is the
    highest token's, and every refusal saw a higher token already accepted."""
    path = tmp_path / "s.db"
    FencedStore(path).close()
    refusals: list = []
    errors: list = []

    def writer(tokens):
        with FencedStore(path) as s:
            for tok in tokens:
                try:
                    s.write("r", {"token": tok}, token=tok)
                except StaleToken as e:
                    refusals.append(e)
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)

    threads = [threading.Thread(target=writer, args=(list(range(start, 200, 2)),)) for start in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert all(e.highest > e.token for e in refusals)
    with FencedStore(path) as s:
        assert s.read_with_token("r") == ({"token": 199}, 199)


# ---------------------------------------------------------------------- against one real node
@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("client"), n=1)


@pytest.fixture
def client(node):
    return Client(node.url(0), token=node.token, timeout_s=10)


def _lock_state(node, name):
    s, b = node.get(0, f"/v1/locks/{name}")
    return b if s == 200 else None


def test_lock_acquire_renew_release(client, node):
    a = client.lock_acquire("l-basic", owner="me", ttl_s=5)
    assert a["lock"] == "l-basic" and a["owner"] == "me" and isinstance(a["token"], int)
    st = _lock_state(node, "l-basic")
    assert st["owner"] == "me" and st["token"] == a["token"]
    r = client.lock_renew("l-basic", a["token"], ttl_s=6)
    assert r["token"] == a["token"] and r["expires_at"] >= a["expires_at"]
    assert client.lock_info("l-basic")["token"] == a["token"]
    assert client.lock_release("l-basic", a["token"])["released"] is True
    assert client.lock_info("l-basic") is None
    with pytest.raises(LockLost) as ei:
        client.lock_release("l-basic", a["token"])
    assert isinstance(ei.value, Conflict) and ei.value.status == 409
    # A later acquire gets a larger token (one counter, only increases).
    b = client.lock_acquire("l-basic", owner="me", ttl_s=5)
    assert b["token"] > a["token"]
    client.lock_release("l-basic", b["token"])


def test_second_owner_gets_lock_held(client):
    a = client.lock_acquire("l-held", owner="alice", ttl_s=10)
    try:
        with pytest.raises(LockHeld) as ei:
            client.lock_acquire("l-held", owner="bob", ttl_s=10)
        e = ei.value
        assert isinstance(e, Conflict) and e.status == 409 and e.code == "conflict"
        assert e.holder == "alice" and isinstance(e.expires_at_ms, int)
        with pytest.raises(LockHeld) as ei2:
            with client.lock("l-held", owner="bob", ttl_s=10):
                pytest.fail("entered a lock someone else holds")
        assert ei2.value.holder == "alice"
        with pytest.raises(LockHeld):  # blocking, but the holder does not let go in time
            client.lock("l-held", owner="bob", ttl_s=10, blocking=True, timeout_s=0.5).acquire()
    finally:
        client.lock_release("l-held", a["token"])


def test_lock_context_manager_renews_past_ttl(client, node):
    name = "l-renew"
    with client.lock(name, owner="me", ttl_s=1.0) as lease:
        assert isinstance(lease, Lease)
        token = lease.token
        first = _lock_state(node, name)
        assert first["token"] == token
        t0 = time.monotonic()
        seen = {"expiry": first["expires_at"]}

        def renewed_past_ttl():
            st = _lock_state(node, name)
            assert st is not None and st["token"] == token, f"lock lost: {st}"
            assert not lease.lost.is_set()
            moved = st["expires_at"] > seen["expiry"]
            seen["expiry"] = max(seen["expiry"], st["expires_at"])
            return moved and time.monotonic() - t0 >= 2.5

        wait_for(renewed_past_ttl, 10, "the lease renewed past 2.5 TTLs")
        assert lease.token == token and lease.renewals >= 2 and lease.valid()
    assert lease.lost.is_set()  # released on exit
    assert _lock_state(node, name) is None


def test_lock_blocking_waits_for_expiry(client):
    old = client.lock_acquire("l-block", owner="old", ttl_s=1.0)  # never renewed
    t0 = time.monotonic()
    with client.lock("l-block", owner="new", ttl_s=2, blocking=True, timeout_s=15) as lease:
        assert lease.token > old["token"]
        assert time.monotonic() - t0 < 10


def test_stale_holder_is_fenced(client, node, tmp_path):
    """A holder that stopped renewing (paused) loses the lock; the new holder writes; the old
    token's late write is refused by the store."""
    name = "l-stale"
    store = FencedStore(tmp_path / "store.db")
    try:
        old = client.lock_acquire(name, owner="paused", ttl_s=1.0)
        store.write("res", "from-old", token=old["token"])

        def new_holder():
            try:
                return client.lock_acquire(name, owner="fresh", ttl_s=10)
            except LockHeld:
                return None

        new = wait_for(new_holder, 15, "another owner acquires the expired lock", interval_s=0.1)
        assert new["token"] > old["token"]
        store.write("res", "from-new", token=new["token"])
        with pytest.raises(StaleToken) as ei:
            store.write("res", "late-from-old", token=old["token"])
        assert (ei.value.token, ei.value.highest) == (old["token"], new["token"])
        assert store.read("res") == "from-new"
        with pytest.raises(LockLost):  # and the old holder learns it lost the lock
            client.lock_renew(name, old["token"])
        client.lock_release(name, new["token"])
    finally:
        store.close()


def test_lock_lost_when_renew_refused(client, node):
    """Someone releases the lease from under the holder: the next renew is refused -> lost."""
    with client.lock("l-lost", owner="me", ttl_s=1.5) as lease:
        client.lock_release("l-lost", lease.token)
        assert lease.lost.wait(5)
        assert not lease.valid()
    # exit: the refused release is logged, not raised


def test_put_get_job(client):
    res = client.put_job("client-job", SPEC)
    assert res["job"] == "client-job" and res["created"] is True
    job = client.get_job("client-job", consistent=True)
    assert job["name"] == "client-job" and job["spec"]["schedule"]["every_s"] == 3600
    assert client.put_job("client-job", SPEC)["created"] is False
    with pytest.raises(Conflict):
        client.put_job("client-job", SPEC, create_only=True)
    assert any(j["name"] == "client-job" for j in client.list_jobs()["jobs"])
    client.pause("client-job")
    assert client.get_job("client-job")["state"]["paused"] is True
    client.resume("client-job")
    run = client.trigger("client-job")
    assert run["job"] == "client-job"
    assert any(r["id"] == run["run"] for r in client.runs("client-job", limit=10)["runs"])
    client.delete_job("client-job")
    with pytest.raises(NotFound) as ei:
        client.get_job("client-job")
    assert ei.value.status == 404


def test_put_jobs(client):
    jobs = {f"client-bulk-{k}": SPEC for k in range(300)}
    res = client.put_jobs(jobs, idempotency_key="client-bulk-1")
    assert res["created"] == 300 and res["commands"] >= 1
    again = client.put_jobs(jobs, idempotency_key="client-bulk-1")
    assert again.get("duplicate") is True and again["jobs"] == res["jobs"]
    res = client.put_jobs({"client-bulk-0": SPEC, "client-bulk-new": SPEC}, create_only=True)
    assert res["jobs"]["client-bulk-0"]["error"]["code"] == "conflict" and res["created"] == 1
    with pytest.raises(InvalidSpec) as ei:
        client.put_jobs({"client-bulk-x": SPEC, "client-bulk-y": {"schedule": {}}})
    assert ei.value.status == 422 and ei.value.extra["job"] == "client-bulk-y" and ei.value.field == "executor"
    with pytest.raises(NotFound):
        client.get_job("client-bulk-x")
    with pytest.raises(ValueError):
        client.put_jobs({f"j{k}": SPEC for k in range(limits.batch_jobs_max + 1)})


def test_typed_errors(client, node):
    with pytest.raises(InvalidSpec) as ei:
        client.put_job("bad-job", {"schedule": {}})
    assert ei.value.status == 422 and ei.value.field
    with pytest.raises(Unauthorized) as ei:
        Client(node.url(0)).put_job("x", SPEC)
    assert ei.value.status == 401
    q = client.put_queue("client-q", max_depth=50, on_full="drop_oldest")
    assert q == {"queue": "client-q", "max_depth": 50, "on_full": "drop_oldest"}
    assert any(x["name"] == "client-q" for x in client.queues()["queues"])
    assert client.put_tenant("client-t", rate_per_s=2.5, burst=5)["burst"] == 5
    assert client.dlq()["runs"] == []


def test_idempotency_key_is_reused_across_retries(client, node):
    """The same key answers a retry with the first result (what the client relies on after 504)."""
    key = "client-test-key-1"
    first = client.request("POST", "/v1/locks/l-idem/acquire", {"owner": "me", "ttl_s": 5}, idempotent_key=key)
    again = client.request("POST", "/v1/locks/l-idem/acquire", {"owner": "me", "ttl_s": 5}, idempotent_key=key)
    assert again["token"] == first["token"] and again.get("duplicate") is True
    client.lock_release("l-idem", first["token"])


def test_failover_from_dead_url(node):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    c = Client([dead, node.url(0)], token=node.token, deadline_s=10)
    assert c.cluster()["node"] == "node-1"
    a = c.lock_acquire("l-failover", owner="me", ttl_s=5)
    c.lock_release("l-failover", a["token"])
    only_dead = Client([dead], token=node.token, deadline_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as ei:
        only_dead.cluster()
    assert ei.value.status is None and time.monotonic() - t0 < 5


def _tree(root):
    return {os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files
            if "__pycache__" not in d}


def test_fenced_store_demo_script_leaves_nothing_behind(node, tmp_path):
    """The demo as examples/README.md runs it (no --db): its temporary store is removed at the
    end, and nothing is added to the tree."""
    import subprocess
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = _tree(REPO / "examples")
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "fenced_store.py"), "demo", "--url", node.url(0),
         "--token-file", str(node.token_file), "--ttl", "1"],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REFUSED" in r.stdout and str(tmp) in r.stdout  # its store was a temporary one
    assert list(tmp.iterdir()) == [] and _tree(REPO / "examples") == before


def test_the_nightly_report_keeps_its_database_out_of_the_tree_and_tmp(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import nightly_report
    finally:
        sys.path.remove(str(REPO / "examples"))
    monkeypatch.delenv("REPORTS_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    nightly_report.connect().close()
    assert (tmp_path / "data" / "raftsched-examples" / "reports.db").is_file()
    monkeypatch.setenv("REPORTS_DB", str(tmp_path / "given.db"))
    nightly_report.connect().close()
    assert (tmp_path / "given.db").is_file()


# ---------------------------------------------------------------------- transport, against a scripted server
class _Scripted:
    """A loopback HTTP server that answers from a script: each entry is (status, body), "drop"
    (close the connection after reading the request), "drip" (headers saying a 100 000-byte body,
    then one byte of it every DRIP_S, DRIP_BYTES of them, then close) or "drip-head" (the status
    line, then header bytes the same way) or "hang" (no answer until the server is closed).
    Records (method, path, Idempotency-Key)."""

    DRIP_S, DRIP_BYTES = 0.2, 100

    def __init__(self, script):
        import http.server
        import json as _json

        self.script = list(script)
        self.seen: list = []
        self.stopping = threading.Event()
        outer = self

        def drip(wfile, head: bytes, byte: bytes) -> None:
            wfile.write(head)
            wfile.flush()
            try:
                for _ in range(outer.DRIP_BYTES):
                    if outer.stopping.wait(outer.DRIP_S):
                        return
                    wfile.write(byte)
                    wfile.flush()
            except OSError:
                pass  # the client gave up and closed the connection

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                outer.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                step = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                if step == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if step == "drip":
                    self.close_connection = True
                    drip(self.wfile, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: 100000\r\n\r\n", b" ")
                    return
                if step == "hang":
                    self.close_connection = True
                    outer.stopping.wait(60)
                    return
                if step == "drip-head":
                    self.close_connection = True
                    drip(self.wfile, b"HTTP/1.1 200 OK\r\nX-Slow: ", b"x")
                    return
                status, body = step
                raw = _json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if status == 503:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(*script):
        s = _Scripted(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def _err(code, status, **extra):
    return (status, {"error": dict({"code": code, "message": code, "field": None}, **extra)})


def test_503_moves_to_next_node_and_504_retries_with_same_key(scripted):
    a = scripted(_err("unavailable", 503))
    b = scripted(_err("indeterminate", 504), "drop", (200, {"lock": "x", "token": 7, "expires_at": "t"}))
    c = Client([a.url, b.url], token="t", deadline_s=10)
    assert c.lock_acquire("x", "me", 5)["token"] == 7
    keys = {k for _, _, k in a.seen + b.seen}
    assert len(keys) == 1 and None not in keys  # one logical call, one key on every attempt
    assert len(b.seen) == 3 and a.seen


def test_unknown_outcome_is_never_reported_as_definite(scripted):
    a = scripted(_err("indeterminate", 504), _err("unavailable", 503))
    c = Client([a.url], token="t", deadline_s=1.0)
    from raftsched.core.errors import Indeterminate
    with pytest.raises(Indeterminate) as ei:
        c.trigger("job")
    assert ei.value.definite is False
    assert len({k for _, _, k in a.seen}) == 1


def test_lease_lost_when_no_renew_succeeds_for_a_ttl(scripted):
    s = scripted((200, {"lock": "x", "owner": "me", "token": 3, "expires_at": "t"}), _err("unavailable", 503))
    c = Client([s.url], token="t", timeout_s=2)
    lk = c.lock("x", owner="me", ttl_s=1.0)
    lease = lk.acquire()
    t0 = time.monotonic()
    try:
        assert lease.lost.wait(5)
        assert 0.5 < time.monotonic() - t0 < 2.5
    finally:
        lk.release()  # the release gets 503s too: logged, not raised


@pytest.mark.parametrize("step", ["drip", "drip-head"])
def test_an_answer_that_trickles_in_ends_the_attempt_at_its_timeout(scripted, step):
    # http.client's timeout bounds each socket read, and every byte restarts it: the attempt's
    # timeout must bound the whole answer, so that the call ends by its deadline.
    from raftsched.core.errors import Indeterminate
    s = scripted(step)
    c = Client([s.url], token="t", timeout_s=1, deadline_s=2)
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as ei:
        c.get_job("x")  # a read: no answer is only no answer
    assert time.monotonic() - t0 < 2 + 5  # the deadline, with slack for a loaded machine
    assert not isinstance(ei.value, Indeterminate)
    t0 = time.monotonic()
    with pytest.raises(Indeterminate) as ei:
        c.trigger("x")  # a mutation: it may have applied, as after a read timeout
    assert time.monotonic() - t0 < 2 + 5
    assert ei.value.definite is False
    triggers = [k for m, _, k in s.seen if m == "POST"]
    assert len(triggers) >= 2 and len(set(triggers)) == 1  # retried with the same key


def test_connecting_gives_every_address_only_what_is_left_of_the_attempt(monkeypatch):
    """socket.create_connection gives each address a host name resolves to the whole timeout (a
    dead IPv6 route, then IPv4: two timeouts, and the TLS handshake a third): each address now
    gets what is left of the one attempt. Addresses that never answer, with a clock of the test's."""
    import socket as socket_module

    from raftsched.client import blocking

    now = [100.0]
    monkeypatch.setattr(blocking.time, "monotonic", lambda: now[0])
    tried = []

    class Silent:
        def __init__(self, *a):
            self.timeout = None

        def settimeout(self, t):
            self.timeout = t

        def connect(self, addr):
            tried.append((addr, self.timeout))
            now[0] += self.timeout  # waits out its timeout, as to an address that never answers
            raise socket_module.timeout("timed out")

        def close(self):
            pass

    addrs = [(socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", (f"10.0.0.{i}", 80)) for i in (1, 2, 3)]
    monkeypatch.setattr(blocking.socket, "getaddrinfo", lambda *a, **k: addrs)
    monkeypatch.setattr(blocking.socket, "socket", Silent)
    with pytest.raises(OSError):
        blocking._connect_by(101.0)(("h", 80))
    assert tried == [(("10.0.0.1", 80), 1.0)] and now[0] == 101.0, tried


def test_a_name_the_resolver_never_answers_is_bounded_by_the_attempt(monkeypatch):
    """The blocking client's timeout bounds the whole attempt, name resolution included: a resolver
    that hangs (a dead DNS server) gives the attempt up when its time is spent, not when the
    resolver's own timeouts end."""
    import threading as threading_module

    from raftsched.client import blocking
    from raftsched.client.core import NotSentError

    release = threading_module.Event()
    asked = []

    def hanging(host, *a, **k):
        asked.append(host)
        release.wait(30)
        raise OSError("released")
    monkeypatch.setattr(blocking.socket, "getaddrinfo", hanging)
    try:
        with pytest.raises(TimeoutError):
            blocking._connect_by(time.monotonic() + 0.2)(("nodes.example", 80))
        assert not release.is_set() and asked == ["nodes.example"], "it returned while the resolver still hung"
        c = blocking.Client(["http://nodes.example:8701"], timeout_s=0.2)
        with pytest.raises(NotSentError):
            c._once(c._nodes[0], "GET", "/v1/status", None, {}, 0.2)
        assert not release.is_set()
    finally:
        release.set()


def test_an_address_whose_socket_cannot_be_made_passes_to_the_next(monkeypatch):
    """A host with IPv6 off: localhost's ::1 cannot even have a socket; 127.0.0.1 is tried."""
    import socket as socket_module

    from raftsched.client import blocking

    real = socket_module.socket
    made = []

    def socket(family, *a):
        if family == socket_module.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        made.append(family)
        return real(family, *a)
    srv = real(socket_module.AF_INET, socket_module.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        port = srv.getsockname()[1]
        addrs = [(socket_module.AF_INET6, socket_module.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                 (socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        monkeypatch.setattr(blocking.socket, "getaddrinfo", lambda *a, **k: addrs)
        monkeypatch.setattr(blocking.socket, "socket", socket)
        sock = blocking._connect_by(time.monotonic() + 5)(("localhost", port))
        sock.close()
        assert made == [socket_module.AF_INET]
    finally:
        srv.close()
