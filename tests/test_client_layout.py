"""raftsched/client/: both transports have the same endpoint methods, written in their own class
bodies, each handing its endpoint's request description to the transport; the descriptions
themselves; and one request's steps (core.Exchange), all without I/O.

The routes each method reaches, and that both clients answer alike, are
tests/test_client_coverage.py's (against an in-process node).
"""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap

import pytest

from raftsched.client import Client, Lock, LockHeld, LockLost, asynchronous, blocking, core, endpoints
from raftsched.client.asynchronous import AsyncClient, AsyncLock
from raftsched.client.core import Done, Exchange, LostAfterSendError, NotSentError, Request, TlsFailedError, Try, Wait
from raftsched.core import limits
from raftsched.core.errors import Conflict, Indeterminate, NotFound, RaftschedError, Unavailable

from procs import REPO

NAMES = sorted(endpoints.ENDPOINTS)
#: public methods that are not one endpoint each: the generic request, the lock, the poll
MORE_THAN_ONE_CALL = {"request", "lock", "wait_backfill"}


def _public(cls) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


# ---------------------------------------------------------------------- the two classes
def test_both_clients_have_the_same_public_methods():
    assert _public(AsyncClient) - _public(Client) == {"close"}
    assert _public(Client) - _public(AsyncClient) == set()
    assert _public(Client) == set(NAMES) | MORE_THAN_ONE_CALL | {"urls"}


@pytest.mark.parametrize("name", NAMES)
def test_an_endpoint_method_is_written_in_each_class_with_the_endpoints_signature(name):
    sync_fn, async_fn = vars(Client).get(name), vars(AsyncClient).get(name)
    assert inspect.isfunction(sync_fn) and not inspect.iscoroutinefunction(sync_fn), f"Client.{name}"
    assert inspect.iscoroutinefunction(async_fn), f"AsyncClient.{name} is not a coroutine function of its class"
    # Written in the module's class body, not set at import by another module.
    assert async_fn.__qualname__ == f"AsyncClient.{name}" and async_fn.__module__ == asynchronous.__name__
    assert sync_fn.__qualname__ == f"Client.{name}" and sync_fn.__module__ == blocking.__name__
    assert inspect.signature(sync_fn) == inspect.signature(async_fn)
    assert sync_fn.__doc__ and sync_fn.__doc__ == async_fn.__doc__ and "\n" not in sync_fn.__doc__
    ours = list(inspect.signature(sync_fn).parameters.values())[1:]  # without self
    assert ours == list(inspect.signature(endpoints.ENDPOINTS[name]).parameters.values())


def test_the_other_methods_have_the_same_signatures_but_what_they_return():
    for name in MORE_THAN_ONE_CALL:
        s, a = inspect.signature(getattr(Client, name)), inspect.signature(getattr(AsyncClient, name))
        assert list(s.parameters.values()) == list(a.parameters.values()), name
    assert inspect.iscoroutinefunction(AsyncClient.wait_backfill) and inspect.iscoroutinefunction(AsyncClient.request)
    assert not inspect.iscoroutinefunction(AsyncClient.lock)  # `async with c.lock(...)`
    sync_init, async_init = inspect.signature(Client.__init__), inspect.signature(AsyncClient.__init__)
    assert set(async_init.parameters) - set(sync_init.parameters) == {"session"}
    assert all(async_init.parameters[n] == p for n, p in sync_init.parameters.items())


def _methods(cls) -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    (klass,) = tree.body
    return {n.name: n for n in klass.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_an_endpoint_methods_body_only_hands_its_request_to_the_transport(cls):
    """``return self._send(endpoints.NAME(args...))`` (awaited in AsyncClient), each parameter
    passed through as it came: whatever an endpoint does is endpoints.py's, written once."""
    methods = _methods(cls)
    for name in NAMES:
        fn = methods[name]
        doc, ret = fn.body
        assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), name
        assert isinstance(ret, ast.Return), name
        call = ret.value
        if cls is AsyncClient:
            assert isinstance(call, ast.Await), name
            call = call.value
        assert ast.unparse(call.func) == "self._send" and len(call.args) == 1 and not call.keywords, name
        inner = call.args[0]
        assert ast.unparse(inner.func) == f"endpoints.{name}", name
        a = fn.args
        assert [ast.unparse(x) for x in inner.args] == [p.arg for p in (a.posonlyargs + a.args)[1:]], name
        assert [(k.arg, ast.unparse(k.value)) for k in inner.keywords] == [(p.arg, p.arg) for p in a.kwonlyargs], name


def test_the_lock_classes_share_one_policy():
    from raftsched.client.policy import LockPolicy
    assert issubclass(Lock, LockPolicy) and issubclass(AsyncLock, LockPolicy)
    own = {n for n, v in vars(Lock).items() if callable(v) and not n.startswith("__")}
    assert own == {"acquire", "release", "_renew_loop"}, "a decision belongs in LockPolicy"
    assert {n for n, v in vars(AsyncLock).items() if callable(v) and not n.startswith("__")} == own


def test_the_client_imports_no_node_module_and_its_core_no_io():
    code = ("import sys, raftsched.client, raftsched.client.asynchronous, raftsched.async_client, "
            "raftsched.client_rules; "
            "print(sorted(m for m in sys.modules if m.startswith('raftsched.node')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    io = {"socket", "ssl", "http", "asyncio", "aiohttp", "yarl", "time", "urllib.request", "subprocess"}
    for mod in ("core", "endpoints", "policy"):
        tree = ast.parse((REPO / "raftsched" / "client" / f"{mod}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert not {m.split(".")[0] for m in imported} & io and not imported & io, (mod, imported & io)


# ---------------------------------------------------------------------- request descriptions
def test_endpoint_descriptions():
    r = endpoints.put_job("a b/c", {"x": 1}, create_only=True)
    assert (r.method, r.target, r.body, r.headers, r.mutating) == (
        "PUT", "/v1/jobs/a%20b%2Fc", {"x": 1}, {"If-None-Match": "*"}, True)
    assert endpoints.put_job("a", {}).headers is None
    assert endpoints.list_jobs(labels={"k": "v", "z": "1"}).target == "/v1/jobs?limit=100&label=k%3Dv&label=z%3D1"
    assert endpoints.list_jobs(5, after="j", consistent=True).target == "/v1/jobs?limit=5&after=j&consistent=true"
    assert endpoints.preview_spec({"s": 1}, 2).target == "/v1/preview?count=2"
    assert endpoints.resume("j").target == "/v1/jobs/j/resume"
    assert endpoints.resume("j", catch_up=True).target == "/v1/jobs/j/resume?catch_up=true"
    assert endpoints.trigger("j").body is None
    assert endpoints.trigger("j", payload=None).body == {"payload": None}  # None is a payload
    assert endpoints.put_queue("q").body == {}
    assert endpoints.healthz().accept == (503,) and not endpoints.healthz().mutating
    assert endpoints.put_jobs({}, idempotency_key="k", deadline_s=3).idempotency_key == "k"
    w = endpoints.worker_complete("w/1", [], idempotent_key="k2", timeout_s=2)
    assert (w.target, w.idempotency_key, w.timeout_s, w.deadline_s) == ("/v1/workers/w%2F1/complete", "k2", 2, None)
    b = endpoints.backfill("j", "f", "t", max_slots=3, dry_run=True, backfill_id="b1")
    assert b.body == {"from": "f", "to": "t", "max_slots": 3, "id": "b1", "dry_run": True}
    assert endpoints.dlq_purge_matching(job="j", op_id="o").body == {"job": "j", "id": "o"}
    with pytest.raises(ValueError):
        endpoints.put_jobs({f"j{k}": {} for k in range(limits.batch_jobs_max + 1)})


def _error(cls, status, **extra):
    return core.with_status(cls("m", **extra), status)


def test_recovery_of_the_lock_endpoints():
    acquire = endpoints.lock_acquire("l", "me", 5).recover
    with pytest.raises(LockHeld) as ei:
        acquire(_error(Conflict, 409, holder="o", expires_at_ms=7))
    assert ei.value.holder == "o" and ei.value.expires_at_ms == 7 and ei.value.status == 409
    plain = _error(Conflict, 409)  # the cluster's lock limit: not about a holder
    with pytest.raises(Conflict) as ei:
        acquire(plain)
    assert ei.value is plain
    reused = core.with_status(Conflict("m", "Idempotency-Key", holder="o"), 409)
    with pytest.raises(Conflict) as ei:
        endpoints.lock_renew("l", 3).recover(reused)
    assert ei.value is reused
    with pytest.raises(LockLost):
        endpoints.lock_release("l", 3).recover(_error(Conflict, 409))
    with pytest.raises(Unavailable):
        endpoints.lock_release("l", 3).recover(_error(Unavailable, 503))
    info = endpoints.lock_info("l").recover
    assert info(_error(NotFound, 404)) is None
    with pytest.raises(Unavailable):
        info(_error(Unavailable, None))


# ---------------------------------------------------------------------- one request's steps
def _exchange(request: Request, n: int = 2, deadline_s: float = 10.0) -> Exchange:
    return Exchange(request, [f"http://n{i}" for i in range(n)], token="t", start=1, timeout_s=3,
                    deadline_s=deadline_s, now_s=100.0, uniform=lambda a, b: b)


def test_an_exchange_encodes_once_and_keeps_one_key():
    ex = _exchange(endpoints.put_job("j", {"a": 1}))
    assert ex.method == "PUT" and ex.target == "/v1/jobs/j" and ex.data == b'{"a": 1}'
    key = ex.headers["Idempotency-Key"]
    assert len(key) == 32 and ex.headers["Authorization"] == "Bearer t"
    assert ex.next(100.0) == Try(1, 3)
    ex.failed(1, LostAfterSendError("reset"))
    assert ex.next(100.1) == Try(0, 3)
    ex.answered(0, 200, {}, {"ok": True})
    assert ex.next(100.2) is None and ex.answered_by == 0 and ex.result() == {"ok": True}
    assert ex.headers["Idempotency-Key"] == key
    assert "Idempotency-Key" not in _exchange(endpoints.get_job("j")).headers


def test_on_answer_hears_how_long_the_answering_attempt_took():
    """Only the attempt that ended the call counts: a 503 before it, and the wait after the 503,
    are left out; an answer given no clock reading calls nothing."""
    took: list[float] = []
    ex = _exchange(endpoints.worker_lease("w", max_runs=1, wait_s=0, ttl_ms=1000, on_answer=took.append), n=1)
    assert isinstance(ex.next(100.0), Try)
    ex.answered(0, 503, {"retry-after": "0.5"}, {"error": {"code": "unavailable", "message": "no leader"}}, 103.0)
    assert took == [] and isinstance(ex.next(103.0), Wait)
    assert isinstance(ex.next(103.5), Try)
    ex.answered(0, 200, {}, {"runs": []}, 103.75)
    assert took == [0.25] and ex.next(103.8) is None
    ex = _exchange(endpoints.worker_lease("w", max_runs=1, wait_s=0, ttl_ms=1000, on_answer=took.append), n=1)
    ex.next(100.0)
    ex.answered(0, 200, {}, {"runs": []})
    assert took == [0.25] and ex.result() == {"runs": []}
    # A callback that raises does not take the answer away (a lease's grants would be lost).
    def boom(_s):
        raise RuntimeError("boom")
    ex = _exchange(endpoints.worker_lease("w", max_runs=1, wait_s=0, ttl_ms=1000, on_answer=boom), n=1)
    ex.next(100.0)
    ex.answered(0, 200, {}, {"runs": ["g"]}, 100.1)
    assert ex.next(100.2) is None and ex.result() == {"runs": ["g"]}


def test_an_exchange_that_gives_up_after_an_unknown_outcome_is_indeterminate():
    ex = _exchange(endpoints.trigger("j"), n=1, deadline_s=1.0)
    ex.next(100.0)
    ex.failed(0, LostAfterSendError("reset"))
    assert isinstance(ex.next(100.1), Wait)
    ex.next(100.5)
    ex.failed(0, NotSentError("refused"))
    assert ex.next(101.5) is None and ex.answered_by is None
    with pytest.raises(Indeterminate) as ei:
        ex.result()
    assert ei.value.definite is False


def test_a_tls_failure_ends_an_exchange_at_once_and_recover_sees_every_end():
    ex = _exchange(endpoints.lock_info("l"))
    ex.next(100.0)
    ex.failed(1, TlsFailedError("bad certificate"))
    assert ex.next(100.0) is None
    with pytest.raises(Unavailable) as ei:
        ex.result()
    assert ei.value.status is None and "bad certificate" in ei.value.message
    ex = _exchange(endpoints.lock_info("l"))
    ex.next(100.0)
    ex.answered(1, 404, {}, {"error": {"code": "not_found", "message": "no lock"}})
    assert ex.next(100.1) is None and ex.answered_by == 1 and ex.result() is None


def test_an_error_answer_is_the_typed_error_with_its_status_and_body():
    ex = _exchange(endpoints.get_job("j"))
    ex.next(100.0)
    body = {"error": {"code": "not_found", "message": "no job", "field": "name"}}
    ex.answered(1, 404, {}, body)
    with pytest.raises(NotFound) as ei:
        ex.result()
    assert (ei.value.status, ei.value.body, ei.value.field) == (404, body, "name")
    assert isinstance(ei.value, RaftschedError)


def test_a_client_starts_its_next_call_at_the_node_that_answered_last():
    c = Client(["http://n0", "http://n1", "http://n2"])
    ex = c._exchange(endpoints.cluster(), 100.0)
    assert ex.next(100.0) == Try(0, c.timeout_s)
    ex.failed(0, NotSentError("refused"))
    assert ex.next(100.0) == Try(1, c.timeout_s)
    ex.answered(1, 200, {}, {"node": "n1"})
    assert ex.next(100.0) is None and ex.end == Done(1, {"node": "n1"})
    assert c._finish(ex) == {"node": "n1"}
    assert c._exchange(endpoints.cluster(), 101.0).next(101.0) == Try(1, c.timeout_s)


@pytest.mark.parametrize("status, code", [(502, None), (500, "internal"), (429, "too_many_requests"),
                                          (403, "forbidden")])
def test_an_answer_that_does_not_say_after_a_lost_attempt_is_indeterminate(status, code):
    """A write lost on one node (it may have applied), then answered by another with something
    that does not judge the request (a proxy's 502, a 500, a 429 before it was read, a 403 of a
    token revoked since): the outcome is unknown, never "definitely not"."""
    ex = _exchange(endpoints.pause("j"))
    ex.next(100.0)
    ex.failed(1, LostAfterSendError("reset"))
    ex.next(100.1)
    body = {"error": {"code": code, "message": "nope"}} if code else "<html>Bad Gateway</html>"
    ex.answered(0, status, {}, body)
    assert ex.next(100.2) is None
    with pytest.raises(Indeterminate) as ei:
        ex.result()
    assert ei.value.definite is False and ei.value.status is None and ei.value.body == body
    assert "may have applied" in ei.value.message and isinstance(ei.value.__cause__, RaftschedError)


def test_an_answer_that_judges_the_request_stays_definite_after_a_lost_attempt():
    ex = _exchange(endpoints.pause("j"))
    ex.next(100.0)
    ex.failed(1, LostAfterSendError("reset"))
    ex.next(100.1)
    ex.answered(0, 404, {}, {"error": {"code": "not_found", "message": "no job j"}})
    with pytest.raises(NotFound):
        ex.result()


def test_a_tls_failure_after_a_lost_attempt_is_indeterminate():
    ex = _exchange(endpoints.pause("j"))
    ex.next(100.0)
    ex.failed(1, LostAfterSendError("reset"))
    ex.next(100.1)
    ex.failed(0, TlsFailedError("the node expects TLS"))
    assert ex.next(100.2) is None
    with pytest.raises(Indeterminate) as ei:
        ex.result()
    assert "expects TLS" in ei.value.message
