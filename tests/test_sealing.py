"""Secrets at rest (raftsched/sealing.py, core/seal_keys.py, node/rotation.py; docs/security.md,
"Secrets at rest"): a job's secret values are sealed by the node that receives the write, so
the commands, the state and its snapshots hold none in clear; they are opened only where a run
is handed to a worker (the embedded worker's grants, the lease response); a rotation seals every
stored value under another key; a node without the key refuses to seal and fails the runs that
need it, saying why; a malformed sealed value never crashes anything; and a node's whole data
directory, journal and dump included, holds no secret in clear."""
from __future__ import annotations

import asyncio
import base64
import functools
import gc
import gzip
import hashlib
import json
import os
import secrets

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched import sealing
from raftsched.clock import FakeClock, SystemClock
from raftsched.config import ConfigError
from raftsched.core import commands, model, queries
from raftsched.core.errors import Unavailable
from raftsched.core.state import SchedulerState
from raftsched.node.api import make_app
from raftsched import cli
from raftsched.node.fleet import Fleet
from raftsched.node.node import NodeConfig, run_node
from raftsched.node.redact import Fingerprint
from raftsched.node.service import Service
from raftsched.sealing import KeyRing, SealError, new_key_file, place
from raftsched.worker.loop import Worker
from raftsched.worker.remote import WorkerConfig, run_worker

from fakes import FakeRaft
from procs import Cluster, free_ports, http
from test_worker import GroupRaft, stop, wait_until

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FP = Fingerprint.from_cluster_secret("c" * 32)
SECRET = "s3cret-value-hunter2"
PASSWORD = "pw-98765"
# The run succeeds only if its environment holds both values in clear (compared by their SHA-256:
# argv is no place for a secret, not even in a test).
CHECK = (f'test "$(printf %s "$API_KEY:$DB_PASSWORD" | sha256sum | cut -c1-64)" = '
         f'"{hashlib.sha256(f"{SECRET}:{PASSWORD}".encode()).hexdigest()}"')
JOB = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
       "executor": {"type": "shell", "argv": ["sh", "-c", CHECK], "env": {"DB_PASSWORD": PASSWORD}},
       "secrets": {"API_KEY": SECRET}}


class Raft(GroupRaft):
    """GroupRaft (a log round trip per turn of the loop) with the barrier a rotation waits on."""

    async def barrier(self, timeout_s: float = 5.0) -> None:
        pass


def ring_in(tmp_path, *kids) -> KeyRing:
    for kid in kids:
        new_key_file(str(tmp_path / "keys"), kid)
    return KeyRing.load(str(tmp_path / "keys"))


def stored_keys(state) -> set:
    """The key ids of every stored secret value (None: in clear)."""
    return {sealing.key_of(v) for _, _, maps in queries.secret_maps(state) for m in maps.values() for v in m.values()}


# ---------------------------------------------------------------------------- the format and the ring
def test_a_sealed_value_opens_only_with_its_key_at_its_place_and_sealing_is_deterministic(tmp_path):
    ring = ring_in(tmp_path, "k1", "k2")
    where = place("job", ("secrets",), "API_KEY")
    a = ring.seal("k1", SECRET, b"\x01\x02\x03\x04", where)
    assert SECRET.encode() not in a and sealing.parse(a) == ("k1", b"\x01\x02\x03\x04")
    assert ring.unseal(a, where) == SECRET
    assert ring.seal("k1", SECRET, b"\x01\x02\x03\x04", where) == a, "same key, place and value: same bytes"
    assert ring.seal("k2", SECRET, b"\x01\x02\x03\x04", where) != a
    assert ring.seal("k1", SECRET + "x", b"\x01\x02\x03\x04", where)[:-16] != a[:-16]
    for moved in (place("other", ("secrets",), "API_KEY"), place("job", ("executor", "env"), "API_KEY"),
                  place("job", ("secrets",), "OTHER")):
        with pytest.raises(SealError, match="does not verify"):
            ring.unseal(a, moved)
    tampered = a[:-1] + bytes([a[-1] ^ 1])
    with pytest.raises(SealError, match="does not verify"):
        ring.unseal(tampered, where)
    for bad in (b"", b"\x02xx", b"\x01\x02k1", b"\x01\x00" + b"x" * 40, b"\x01\x02\xff\xfe" + b"x" * 40, "text", 7, None):
        with pytest.raises(SealError) as e:
            ring.unseal(bad, where)
        assert SECRET not in str(e.value)
    with pytest.raises(SealError, match="'k9'.*does not hold"):
        ring.unseal(KeyRing({"k9": os.urandom(32)}).seal("k9", "v", b"0000", where), where)


def test_key_files_are_refused_when_others_may_read_them_or_they_are_not_keys(tmp_path):
    d = tmp_path / "keys"
    kid, path = new_key_file(str(d), "k1")
    assert (kid, path) == ("k1", str(d / "k1.key"))
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(d).st_mode & 0o777 == 0o700
    assert len(base64.urlsafe_b64decode(open(path).read().strip() + "=")) == 32
    with pytest.raises(ConfigError, match="exists"):
        new_key_file(str(d), "k1")
    with pytest.raises(ConfigError, match="--id"):
        new_key_file(str(d), "k1\n")
    assert KeyRing.load(str(d)).ids() == ["k1"]
    assert KeyRing.load(str(tmp_path / "none")).ids() == [], "a missing ring is empty (the node says so)"
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="k1.key is readable by others"):
        KeyRing.load(str(d))
    os.chmod(path, 0o600)
    os.chmod(d, 0o755)
    with pytest.raises(ConfigError, match="open to others"):
        KeyRing.load(str(d))
    os.chmod(d, 0o700)
    (d / "short.key").write_text("abcd\n")
    os.chmod(d / "short.key", 0o600)
    with pytest.raises(ConfigError, match="short.key must hold 32 random bytes"):
        KeyRing.load(str(d))
    os.remove(d / "short.key")
    (d / "bad id!.key").write_text(open(path).read())
    os.chmod(d / "bad id!.key", 0o600)
    with pytest.raises(ConfigError, match="its name must be"):
        KeyRing.load(str(d))


def test_a_ring_reads_its_directory_again_for_a_key_it_does_not_hold(tmp_path):
    now = [0.0]
    new_key_file(str(tmp_path / "keys"), "k1")
    ring = KeyRing(sealing.read_key_dir(str(tmp_path / "keys")), str(tmp_path / "keys"), monotonic=lambda: now[0])
    new_key_file(str(tmp_path / "keys"), "k2")
    assert not ring.holds("k2"), "read again at most every RELOAD_MIN_S"
    now[0] += sealing.RELOAD_MIN_S
    assert ring.holds("k2") and ring.ids() == ["k1", "k2"]
    os.chmod(tmp_path / "keys" / "k2.key", 0o644)
    ring.reload()  # a ring that became unreadable is kept as it was, and logged
    assert ring.ids() == ["k1", "k2"]


# ---------------------------------------------------------------------------- sealing on put
def run_api(coro_fn, ring: KeyRing, clock=None):
    async def main():
        state = SchedulerState()
        raft = FakeRaft(state)
        svc = Service(raft, clock or FakeClock(), "n1", fingerprint=FP, keyring=ring)
        async with TestClient(TestServer(make_app(svc, TOKEN), host="127.0.0.1"), headers=AUTH) as c:
            await coro_fn(state, raft, svc, c)
    asyncio.run(main())


async def put(c, name, spec):
    r = await c.put(f"/v1/jobs/{name}", data=json.dumps(spec))
    return r.status, await r.json()


def test_secrets_are_sealed_before_they_are_proposed_and_reads_show_the_fingerprint_sealed_with(tmp_path):
    ring = ring_in(tmp_path, "k1")

    async def t(state, raft, svc, c):
        assert (await put(c, "a", JOB))[0] == 201
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"b": JOB, "c": JOB}}))
        assert r.status == 200, await r.text()
        # No command, no record, no snapshot holds a value in clear.
        for blob in (*raft.proposed, state.snapshot()):
            assert SECRET.encode() not in blob and PASSWORD.encode() not in blob
        assert stored_keys(state) == {"k1"} and svc.read(queries.seal_key) == "k1"
        a = state.jobs["a"]["spec"]
        assert ring.unseal(a["secrets"]["API_KEY"], place("a", ("secrets",), "API_KEY")) == SECRET
        assert a["secrets"] != state.jobs["b"]["spec"]["secrets"], "bound to its job"
        # Reads show the fingerprint the value was sealed with: the one of the value in clear.
        spec = (await (await c.get("/v1/jobs/a")).json())["spec"]
        assert spec["secrets"] == {"API_KEY": FP(SECRET)} and spec["executor"]["env"] == {"DB_PASSWORD": FP(PASSWORD)}
        # GET, modify, PUT keeps the sealed bytes; the same request sealed again gives the same command.
        before = dict(a["secrets"])
        assert (await put(c, "a", dict(spec, description="x")))[0] == 200
        assert state.jobs["a"]["spec"]["secrets"] == before
        n = len(raft.proposed)
        assert (await put(c, "d", JOB))[0] == 201 and (await put(c, "d", JOB))[0] == 200
        first, second = (commands.decode(p)["spec"] for p in raft.proposed[n:n + 2])
        assert first == second, "deterministic: the same write sealed again gives the same bytes"
    run_api(t, ring)


def test_a_node_without_the_key_refuses_to_seal_and_stores_nothing_in_clear(tmp_path):
    async def t(state, raft, svc, c):
        s, e = await put(c, "a", JOB)
        assert s == 503 and e["error"]["field"] == "secrets" and "no key" in e["error"]["message"]
        r = await c.post("/v1/jobs:batch", data=json.dumps({"jobs": {"b": JOB}}))
        assert r.status == 503
        assert state.jobs == {} and not any(SECRET.encode() in p for p in raft.proposed)
        plain = dict(JOB, executor={"type": "shell", "argv": ["true"]})
        del plain["secrets"]
        assert (await put(c, "plain", plain))[0] == 201, "a job without secrets needs no key"
    run_api(t, KeyRing(directory=str(tmp_path / "none")))

    # Several keys and none named by the cluster: which one is not this node's to choose.
    async def t2(state, raft, svc, c):
        s, e = await put(c, "a", JOB)
        assert s == 503 and "rotate-key" in e["error"]["message"]
    run_api(t2, ring_in(tmp_path, "k1", "k2"))


def test_a_node_whose_ring_lacks_the_named_key_refuses_and_picks_the_key_file_up_when_it_arrives(tmp_path):
    clock = FakeClock()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ring_a, ring_b = ring_in(tmp_path / "a", "k1"), KeyRing.load(str(tmp_path / "b" / "keys"))

    async def t(state, raft, svc, c):
        assert (await put(c, "a", JOB))[0] == 201
        other = Service(raft, clock, "n2", fingerprint=FP, keyring=ring_b)
        with pytest.raises(Unavailable) as e:
            await other.put_job("b", JOB, None)
        assert "'k1'" in e.value.message and "does not hold" in e.value.message and e.value.field == "secrets"
        os.makedirs(tmp_path / "b" / "keys", mode=0o700)
        os.link(tmp_path / "a" / "keys" / "k1.key", tmp_path / "b" / "keys" / "k1.key")  # the file, copied
        ring_b.reload()
        await other.put_job("b", JOB, None)
        assert stored_keys(state) == {"k1"}
    run_api(t, ring_a, clock)


# ---------------------------------------------------------------------------- unsealing where runs are handed out
def test_the_embedded_worker_gets_its_secrets_in_clear_and_a_node_without_the_key_fails_the_run_saying_why(tmp_path):
    """A node whose ring lacks the key (a walk: a replacement node started without the key
    files): the run fails naming the node and the key, and the node notes the key missing (its
    condition); a node that holds the key runs the job's next run."""
    async def t():
        state = SchedulerState()
        raft = Raft(state)
        clock = SystemClock()
        ring = ring_in(tmp_path, "k1")
        svc = Service(raft, clock, "n1", fingerprint=FP, keyring=ring)
        await svc.put_job("j", dict(JOB, retry={"max_attempts": 1}), None)
        ok = (await svc.trigger_job("j", None))["run"]
        worker = Worker(raft, clock, "n1", sandbox=None, slots=1, single_node=True, poll_interval_s=0.01,
                        unseal=lambda g: sealing.unseal_grant(g, ring, "node n1"))
        task = asyncio.create_task(worker.run())
        await wait_until(lambda: state.runs[ok]["state"] == "succeeded", 20, "the run with its secrets")
        await stop(task)
        # A node whose ring lacks k1: the run fails, recorded with the reason; nothing crashes;
        # the key is noted missing (the node's condition reads the set).
        bad = (await svc.trigger_job("j", None))["run"]
        empty = KeyRing()
        worker = Worker(raft, clock, "n2", sandbox=None, slots=1, single_node=True, poll_interval_s=0.01,
                        unseal=functools.partial(sealing.unseal_grant, ring=empty, where="node n2"))
        task = asyncio.create_task(worker.run())
        await wait_until(lambda: state.runs[bad]["state"] == "dead", 20, "the run to fail")
        await stop(task)
        err = state.runs[bad]["attempts"][-1]["error"]
        assert "node n2 cannot unseal" in err and "'k1'" in err and "does not hold" in err, err
        assert SECRET not in json.dumps(state.runs[bad]) and task.done()
        assert worker.channel.keys_missing == {"k1"}
    asyncio.run(asyncio.wait_for(t(), 60))


def test_a_remote_worker_gets_its_secrets_in_clear_from_the_lease_response_and_never_sealed_bytes(tmp_path):
    async def t():
        state = SchedulerState()
        raft = FakeRaft(state)
        clock = SystemClock()
        ring = ring_in(tmp_path, "k1")
        svc = Service(raft, clock, "node-1", fingerprint=FP, keyring=ring)
        fleet = Fleet(raft, clock, "node-1", unseal=lambda g: sealing.unseal_grant(g, ring, "node node-1"))
        fleet_task = asyncio.create_task(fleet.run())
        server = TestServer(make_app(svc, TOKEN, fleet=fleet), host="127.0.0.1")
        await server.start_server()
        stop_ev = asyncio.Event()
        cfg = WorkerConfig(urls=[f"http://127.0.0.1:{server.port}"], token=TOKEN, worker_id="far/1", slots=1,
                           wait_s=1.0)
        worker = asyncio.create_task(run_worker(cfg, clock, stop_ev))
        try:
            await svc.put_job("j", dict(JOB, retry={"max_attempts": 1}), None)
            rid = (await svc.trigger_job("j", None))["run"]
            await wait_until(lambda: state.runs[rid]["state"] in ("succeeded", "dead"), 20, "the remote run")
            assert state.runs[rid]["state"] == "succeeded", state.runs[rid]
            assert state.runs[rid]["worker"] == "far/1"
            # A node that lacks the key (its ring as a replacement node's without the key files):
            # the run fails with the reason, and no sealed bytes; /v1/cluster says why (a walk:
            # /healthz and the conditions said all was well) until the key is in its ring.
            empty = KeyRing()
            fleet.unseal = functools.partial(sealing.unseal_grant, ring=empty, where="node node-2")
            fleet.keyring = empty
            rid = (await svc.trigger_job("j", None))["run"]
            await wait_until(lambda: state.runs[rid]["state"] == "dead", 20, "the run to fail")
            assert "node node-2 cannot unseal" in state.runs[rid]["attempts"][-1]["error"]
            base, auth = f"http://127.0.0.1:{server.port}", {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession() as c:  # (a TestClient would close the server after it)
                cond = (await (await c.get(f"{base}/v1/cluster", headers=auth)).json())
                assert [x["keys"] for x in cond["conditions"] if x["type"] == "node.keys_missing"] == [["k1"]], cond
                gauge = next(m for m in fleet.collector().collect() if m.name == "raftsched_node_keys_missing")
                assert gauge.samples[0].value == 1
                fleet.keyring = ring  # (the key file copied in)
                cond = (await (await c.get(f"{base}/v1/cluster", headers=auth)).json())
                assert not [x for x in cond["conditions"] if x["type"] == "node.keys_missing"], cond
            assert not fleet.keys_missing
            stop_ev.set()
            assert await asyncio.wait_for(worker, 10) == 0
        finally:
            stop_ev.set()
            worker.cancel()
            fleet_task.cancel()
            await asyncio.gather(worker, fleet_task, return_exceptions=True)
            await server.close()
    asyncio.run(asyncio.wait_for(t(), 60))


def test_unseal_grant_opens_every_map_passes_values_in_clear_and_never_hands_out_a_bad_one(tmp_path):
    ring = ring_in(tmp_path, "k1")
    spec = model.validate_job("j", dict(JOB, executor={"type": "http", "url": "http://h/x",
                                                       "headers": {"Authorization": "Bearer " + SECRET}}), 0)
    sealed = sealing.seal_spec(spec, "j", ring, "k1", FP.digest)
    grant = {"id": "j@1", "job": "j", "executor": sealed["executor"], "secrets": sealed["secrets"]}
    out = sealing.unseal_grant(grant, ring)
    assert out["executor"]["headers"] == {"Authorization": "Bearer " + SECRET} and out["secrets"] == {"API_KEY": SECRET}
    assert isinstance(grant["secrets"]["API_KEY"], bytes), "the grant given is not changed"
    legacy = {"id": "j@2", "job": "j", "executor": {"type": "shell", "argv": ["x"], "env": {"A": "clear"}}}
    assert sealing.unseal_grant(legacy, ring) is legacy
    for bad in (b"garbage", 5, ring.seal("k1", "v", b"0000", place("other", ("secrets",), "API_KEY"))):
        out = sealing.unseal_grant(dict(grant, secrets={"API_KEY": bad}), ring, "node x")
        assert out["executor"] is None and "secrets" not in out
        assert out["secrets_error"].startswith("node x cannot unseal secrets.API_KEY of job 'j'")
        assert sealing.KEY_MISSING not in out  # (the value's fault: the run fails, saying why)
        json.dumps(out)  # nothing sealed left in it: a lease response can carry it
    # A key the ring lacks is the node's fault: marked, for the node to give the run back.
    out = sealing.unseal_grant(grant, KeyRing(), "node x")
    assert out[sealing.KEY_MISSING] == "k1" and out["executor"] is None and "secrets" not in out
    from raftsched.node import notify
    sink = {"secrets": {"signing_key": ring.seal("k1", "s", b"0000", notify._place("s", "signing_key"))}}
    assert notify.clear_secrets(ring, "s", sink) == {"signing_key": "s"}
    why = notify.clear_secrets(KeyRing(), "s", sink)
    assert isinstance(why, notify.Unreachable) and "does not hold" in why  # (its events wait, not dead)
    # A grant with no secret map is handed out as it is (most grants: no list of values built);
    # a sealed map of either kind is opened without the other.
    for plain in ({"id": "j@3", "job": "j", "executor": {"type": "python", "target": "m:f"}},
                  {"id": "j@4", "job": "j", "executor": {"type": "http", "headers": {}, "env": None}, "secrets": {}},
                  {"id": "j@5", "job": "j", "executor": None}):
        assert sealing.unseal_grant(plain, ring) is plain
    only_headers = {k: v for k, v in grant.items() if k != "secrets"}
    assert sealing.unseal_grant(only_headers, ring)["executor"]["headers"] == {"Authorization": "Bearer " + SECRET}
    only_secrets = dict(grant, executor={"type": "shell", "argv": ["x"]})
    assert sealing.unseal_grant(only_secrets, ring)["secrets"] == {"API_KEY": SECRET}


# ---------------------------------------------------------------------------- rotation
def test_rotation_seals_every_stored_value_under_the_new_key_keeps_fingerprints_and_old_runs_get_their_secrets(tmp_path):
    async def t():
        state = SchedulerState()
        raft = Raft(state)
        clock = SystemClock()
        ring = ring_in(tmp_path, "k1")
        svc = Service(raft, clock, "n1", fingerprint=FP, keyring=ring)
        app = make_app(svc, TOKEN)
        async with TestClient(TestServer(app, host="127.0.0.1"), headers=AUTH) as c:
            for name in ("a", "b"):
                await svc.put_job(name, dict(JOB, retry={"max_attempts": 1}), None)
            # A job from a journal written before sealing: its values in clear.
            legacy = model.validate_job("legacy", JOB, clock.now_ms())
            await svc.propose(commands.put_job(clock.now_ms(), None, name="legacy", spec=legacy, next=None,
                                               cursor=clock.now_ms(), anchor=clock.now_ms(), create_only=False))
            views = {n: (await (await c.get(f"/v1/jobs/{n}")).json())["spec"] for n in ("a", "b", "legacy")}
            assert views["legacy"]["secrets"] == views["a"]["secrets"] == {"API_KEY": FP(SECRET)}
            queued = (await svc.trigger_job("a", None))["run"]  # queued before the rotation
            # A notification sink's secret is sealed alike (node/notify.py), and rotated with the jobs'.
            r = await c.put("/v1/sinks/s", data=json.dumps({"type": "webhook", "url": "http://127.0.0.1:9/",
                                                             "secrets": {"signing_key": SECRET}}))
            assert r.status == 201, await r.text()
            sink_view = (await r.json())["spec"]
            status = await (await c.get("/v1/secrets")).json()
            assert status["key"] == "k1" and status["values"] == {"k1": 5} and status["clear"] == 2
            assert status["ring"]["keys"] == ["k1"] and status["missing"] == []

            r = await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))
            assert r.status == 422 and (await r.json())["error"]["field"] == "key", "no such key in the ring yet"
            new_key_file(str(tmp_path / "keys"), "k2")
            r = await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))
            body = await r.json()
            assert r.status == 200, body
            assert body["complete"] is True and body["resealed"] == 4 and body["values"] == {"k2": 7}
            assert body["clear"] == 0 and body["unreadable"] == {}
            # No stored value under the old key (nor in clear) remains; new ones go under k2.
            assert stored_keys(state) == {"k2"} and svc.read(queries.seal_key) == "k2"
            await svc.put_job("c", JOB, None)
            assert stored_keys(state) == {"k2"}
            assert SECRET.encode() not in state.snapshot()
            for n in ("a", "b", "legacy"):
                assert (await (await c.get(f"/v1/jobs/{n}")).json())["spec"] == views[n], "same redaction"
            assert sealing.key_of(state.sinks["s"]["spec"]["secrets"]["signing_key"]) == "k2"
            assert (await (await c.get("/v1/sinks/s")).json())["spec"] == sink_view, "same redaction"
            # Rotating again to the same key finds nothing to do.
            again = await (await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))).json()
            assert again["resealed"] == 0 and again["passes"] == 1
            # The old key retired: the run queued before the rotation still gets its secrets.
            os.remove(tmp_path / "keys" / "k1.key")
            ring.reload()
            assert ring.ids() == ["k2"]
            worker = Worker(raft, clock, "n1", sandbox=None, slots=2, single_node=True, poll_interval_s=0.01,
                            unseal=lambda g: sealing.unseal_grant(g, ring, "node n1"))
            task = asyncio.create_task(worker.run())
            later = (await svc.trigger_job("legacy", None))["run"]
            await wait_until(lambda: {state.runs[queued]["state"], state.runs[later]["state"]} <= {"succeeded", "dead"},
                             20, "both runs")
            await stop(task)
            assert state.runs[queued]["state"] == state.runs[later]["state"] == "succeeded", \
                (state.runs[queued], state.runs[later])
    asyncio.run(asyncio.wait_for(t(), 60))


def test_rotation_counts_what_it_cannot_open_and_a_write_sealed_under_the_old_key_is_caught_next_time(tmp_path):
    async def t(state, raft, svc, c):
        await svc.put_job("a", JOB, None)
        # A write proposed by a node that read the state before the key changed: sealed under k1.
        late = sealing.seal_spec(model.validate_job("late", JOB, 0), "late", svc.keyring, "k1", FP.digest)
        new_key_file(str(tmp_path / "keys"), "k2")
        body = await (await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))).json()
        assert body["complete"] and stored_keys(state) == {"k2"}
        await svc.propose(commands.put_job(1, None, name="late", spec=late, next=None, cursor=0, anchor=0,
                                           create_only=False))
        assert (await (await c.get("/v1/secrets")).json())["values"] == {"k1": 2, "k2": 2}
        # A value sealed under a key no ring here holds, and one that is not a sealed value.
        foreign = KeyRing({"k9": os.urandom(32)}).seal("k9", "x", b"0000", place("f", ("secrets",), "A"))
        spec = dict(model.validate_job("f", dict(JOB, secrets={"A": "x", "B": "y"}), 0))
        spec["secrets"] = {"A": foreign, "B": b"\x07not sealed"}
        del spec["executor"]["env"]
        res = await svc.propose(commands.put_job(1, None, name="f", spec=spec, next=None, cursor=0, anchor=0,
                                                 create_only=False))
        assert res["ok"], "apply takes sealed values as opaque bytes"
        view = (await (await c.get("/v1/jobs/f")).json())["spec"]["secrets"]
        assert view == {"A": "***:30303030", "B": "***"}
        body = await (await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))).json()
        assert body["resealed"] == 1 and body["unreadable"] == {"k9": 1, "malformed": 1}
        assert body["complete"] is False and body["values"] == {"k2": 4, "k9": 1} and body["malformed"] == 1
        status = await (await c.get("/v1/secrets")).json()
        assert status["missing"] == ["k9"] and status["malformed"] == 1
    run_api(t, ring_in(tmp_path, "k1"))


class WritesMeanwhile(FakeRaft):
    """FakeRaft that, armed with ``meanwhile``, runs it just before the next proposal of a sink's
    secrets sealed again applies: writes that land between the rotation's read and its commit."""

    meanwhile = None

    async def propose(self, data: bytes, timeout_s: float = 5.0) -> dict:
        if self.meanwhile is not None and commands.decode(data)["op"] in ("put_sink", "sink_reseal"):
            fn, self.meanwhile = self.meanwhile, None
            await fn()
        return await super().propose(data, timeout_s)


def test_a_rotation_never_brings_back_a_deleted_sink_nor_reverts_one_written_meanwhile(tmp_path):
    ring = ring_in(tmp_path, "k1")
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/old", "secrets": {"signing_key": SECRET}}
    names = [f"s{i:02d}" for i in range(6)]

    async def main():
        state = SchedulerState()
        raft = WritesMeanwhile(state)
        svc = Service(raft, FakeClock(), "n1", fingerprint=FP, keyring=ring)
        async with TestClient(TestServer(make_app(svc, TOKEN), host="127.0.0.1"), headers=AUTH) as c:
            for n in names:
                assert (await c.put(f"/v1/sinks/{n}", data=json.dumps(hook))).status == 201
            before = {n: state.sinks[n]["spec"]["secrets"]["signing_key"] for n in names}
            late = sealing.seal_spec(dict(state.sinks["s05"]["spec"], url="http://127.0.0.1:9/late",
                                          secrets={"signing_key": "late-key"}),
                                     "sink:s05", ring, "k1", FP.digest)

            async def meanwhile():
                r = await c.delete("/v1/sinks/s03")
                assert r.status == 200, await r.text()
                r = await c.put("/v1/sinks/s04", data=json.dumps(dict(hook, url="http://127.0.0.1:9/new",
                                                                      secrets={"signing_key": "new-key"})))
                assert r.status == 200, await r.text()
                # A write by a node that read the key before the rotation named k2: sealed under k1.
                res = await svc.propose(commands.put_sink(1, None, name="s05", spec=late))
                assert res["ok"], res
            raft.meanwhile = meanwhile
            new_key_file(str(tmp_path / "keys"), "k2")
            r = await c.post("/v1/secrets:rotate", data=json.dumps({"key": "k2"}))
            body = await r.json()
            assert r.status == 200, body
            assert raft.meanwhile is None, "the writes landed during the rotation"
            assert "s03" not in state.sinks, "a sink deleted meanwhile stays deleted"
            assert sorted(state.sinks) == [n for n in names if n != "s03"]
            s04, s05 = state.sinks["s04"]["spec"], state.sinks["s05"]["spec"]
            assert s04["url"] == "http://127.0.0.1:9/new" and s05["url"] == "http://127.0.0.1:9/late"
            for n, want in (("s04", "new-key"), ("s05", "late-key"), ("s00", SECRET)):
                v = state.sinks[n]["spec"]["secrets"]["signing_key"]
                assert sealing.key_of(v) == "k2" and ring.unseal(v, place("sink:" + n, ("secrets",), "signing_key")) == want
            # Nothing else of a sink changed: its fingerprint reads the same.
            assert all(sealing.fingerprint_of(state.sinks[n]["spec"]["secrets"]["signing_key"])
                       == sealing.fingerprint_of(before[n]) for n in ("s00", "s01", "s02"))
            assert body["complete"] is True and body["values"] == {"k2": 5}, body
            # s00-s02 in the first pass (s03-s05 stale), s05 sealed under k1 again in the second.
            assert body["stale"] == 3 and body["resealed"] == 4 and body["passes"] == 3, body
            restored = SchedulerState()
            restored.restore(state.snapshot())
            assert restored.snapshot() == state.snapshot() and restored.sinks == state.sinks
    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("body, status, field", [
    ({}, 400, "key"), ({"key": "k2", "x": 1}, 400, "key"), ({"key": 5}, 422, "key"),
    ({"key": "k2\n"}, 422, "key"), ({"key": "x" * 17}, 422, "key"), ({"key": "../k1"}, 422, "key"),
])
def test_a_rotation_request_is_checked_naming_the_field(tmp_path, body, status, field):
    async def t(state, raft, svc, c):
        r = await c.post("/v1/secrets:rotate", data=json.dumps(body))
        assert r.status == status and (await r.json())["error"]["field"] == field
        assert state.seal == {}
    run_api(t, ring_in(tmp_path, "k1"))


# ---------------------------------------------------------------------------- the replicas
@pytest.mark.parametrize("bad", [
    {"key": 5, "jobs": []}, {"key": "", "jobs": []}, {"key": "k" * 17, "jobs": []}, {"key": "k2", "jobs": "x"},
    {"key": "k2", "jobs": [["a", 1]]}, {"key": "k2", "jobs": [["a", "1", {"secrets": {"A": b"x"}}]]},
    {"key": "k2", "jobs": [["a", 1, {"secrets": {"A": "clear"}}]]}, {"key": "k2", "jobs": [["a", 1, {"argv": {"A": b"x"}}]]},
    {"key": "k2", "jobs": [["a", 1, {}]]}, {"key": "k2", "jobs": [["a", 1, {"secrets": {}}]]},
    {"key": "k2", "jobs": [["a", 1, {"secrets": {"A": b"x"}}]] + [["b", 1, {"secrets": 3}]]},
])
def test_a_malformed_reseal_is_refused_as_a_value_and_changes_nothing(bad):
    s = SchedulerState()
    s.apply(commands.put_job(1, None, name="a", spec=model.validate_job("a", JOB, 0), next=None, cursor=0, anchor=0,
                             create_only=False))
    spec = s.jobs["a"]["spec"]
    res = s.apply_bytes(commands.encode(commands.make("reseal", 2, None, **bad)))
    assert res["ok"] is False and res["error"]["code"] == "invalid_command"
    assert s.seal == {} and s.jobs["a"]["spec"] is spec and spec["secrets"] == {"API_KEY": SECRET}


def test_reseal_replaces_only_a_job_of_the_generation_read_and_replicas_agree():
    def replica():
        s = SchedulerState()
        s.apply(commands.put_job(1, None, name="a", spec=model.validate_job("a", JOB, 0), next=None, cursor=0,
                                 anchor=0, create_only=False))
        return s
    one, two = replica(), replica()
    gen = one.jobs["a"]["gen"]
    cmds = [commands.reseal(2, None, key="k2", jobs=[["a", gen, {"secrets": {"API_KEY": b"\x01sealed"},
                                                                 "env": {"DB_PASSWORD": b"\x01pw"}}],
                                                     ["gone", 1, {"secrets": {"A": b"x"}}]]),
            commands.reseal(3, None, key="k2", jobs=[["a", gen + 1, {"secrets": {"API_KEY": b"\x01newer"}}],
                                                     ["a", gen, {"secrets": {"NOT_THERE": b"x"}}]])]
    results = [[s.apply_bytes(commands.encode(c)) for c in cmds] for s in (one, two)]
    assert results[0] == results[1]
    assert results[0][0]["resealed"] == 1 and results[0][0]["stale"] == ["gone"]
    assert results[0][1]["resealed"] == 0 and results[0][1]["stale"] == ["a", "a"]
    spec = one.jobs["a"]["spec"]
    assert spec["secrets"] == {"API_KEY": b"\x01sealed"} and spec["executor"]["env"] == {"DB_PASSWORD": b"\x01pw"}
    assert one.jobs["a"]["gen"] == gen and one.seal == {"key": "k2"}
    assert one.snapshot() == two.snapshot()
    restored = SchedulerState()
    restored.restore(one.snapshot())
    assert restored.seal == {"key": "k2"} and restored.snapshot() == one.snapshot()


def _sink_state(*names):
    s = SchedulerState()
    for n in names:
        spec = {"type": "webhook", "url": "http://127.0.0.1:9/", "retry": {"max_attempts": 1, "backoff_s": 1, "backoff_max_s": 1},
                "secrets": {"signing_key": b"\x01old-" + n.encode()}}
        assert s.apply(commands.put_sink(1, None, name=n, spec=spec))["ok"]
    return s


@pytest.mark.parametrize("bad", [
    {}, {"items": []}, {"items": "x"}, {"items": [["a"]]}, {"items": [["", {"k": b"x"}, {"k": b"y"}]]},
    {"items": [["a", {"signing_key": b"\x01old-a"}, {}]]},
    {"items": [["a", {"signing_key": b"\x01old-a"}, {"signing_key": "clear"}]]},
    {"items": [["a", {"signing_key": b"\x01old-a"}, {"other": b"y"}]]},
    {"items": [["a", {"signing_key": 5}, {"signing_key": b"y"}]]},
    {"items": [["a", [], {"signing_key": b"y"}]]},
    {"items": [["a", {"signing_key": b"\x01old-a"}, {"signing_key": b"y"}], ["b", {}, {"k": b"y"}]]},
    {"items": [["a", {"signing_key": b"\x01old-a"}, {"signing_key": b"y"}]] * 101},
])
def test_a_malformed_sink_reseal_is_refused_as_a_value_and_changes_nothing(bad):
    s = _sink_state("a")
    spec = s.sinks["a"]["spec"]
    res = s.apply_bytes(commands.encode(commands.make("sink_reseal", 2, None, **bad)))
    assert res["ok"] is False and res["error"]["code"] == "invalid_command"
    assert s.sinks["a"]["spec"] is spec and spec["secrets"] == {"signing_key": b"\x01old-a"}


def test_sink_reseal_replaces_only_the_secrets_read_never_makes_a_sink_and_replicas_agree():
    def replica():
        s = _sink_state("a", "b", "c")
        s.sinks["a"]["dead"].append({"event": {"seq": 1}, "error": None, "attempts": 1, "at": 1})
        # Written after the rotation read them: b with another url and key, c deleted.
        s.apply(commands.put_sink(2, None, name="b", spec=dict(s.sinks["b"]["spec"], url="http://h/new",
                                                              secrets={"signing_key": b"\x01new-b"})))
        s.apply(commands.delete_sink(2, None, name="c"))
        return s
    one, two = replica(), replica()
    cmd = commands.sink_reseal(3, None, items=[
        ["a", {"signing_key": b"\x01old-a"}, {"signing_key": b"\x02k2-a"}],
        ["b", {"signing_key": b"\x01old-b"}, {"signing_key": b"\x02k2-b"}],
        ["c", {"signing_key": b"\x01old-c"}, {"signing_key": b"\x02k2-c"}],
    ])
    results = [s.apply_bytes(commands.encode(cmd)) for s in (one, two)]
    assert results[0] == results[1] and results[0]["resealed"] == 1 and results[0]["stale"] == ["b", "c"]
    assert one.sinks["a"]["spec"]["secrets"] == {"signing_key": b"\x02k2-a"} and len(one.sinks["a"]["dead"]) == 1
    assert one.sinks["b"]["spec"]["url"] == "http://h/new"
    assert one.sinks["b"]["spec"]["secrets"] == {"signing_key": b"\x01new-b"}, "a write meanwhile is kept"
    assert "c" not in one.sinks, "a sink deleted meanwhile is not made again"
    assert one.snapshot() == two.snapshot()
    restored = SchedulerState()
    restored.restore(one.snapshot())
    assert restored.snapshot() == one.snapshot() and restored.sinks == one.sinks


# ---------------------------------------------------------------------------- a node's files
def _files_hold(root, needle: bytes) -> list[str]:
    """The files under ``root`` that hold ``needle``, as they are or gunzipped (the dumps)."""
    found = []
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                data = f.read()
            if data[:2] == b"\x1f\x8b":
                try:
                    data += gzip.decompress(data)
                except (OSError, EOFError):
                    pass
            if needle in data:
                found.append(os.path.join(d, n))
    return found


def test_a_copy_of_a_nodes_data_directory_holds_no_secret_in_clear(tmp_path):
    """A one-node cluster, in this process, compacting its log after 20 commands: jobs with
    secrets, a run that needs them (executed by the embedded worker), enough writes for a dump.
    No file under the data directory, the dump gunzipped, holds a secret or the key."""
    api, raft = free_ports(2)
    _, key_file = new_key_file(str(tmp_path / "keys"), "k1")
    marker = "MARK-" + secrets.token_hex(8)
    cfg = NodeConfig(node_id="node-1", api_host="127.0.0.1", api_port=api, raft_addr=f"127.0.0.1:{raft}", peers=[],
                     data_dir=str(tmp_path / "node-1"), secret="s" * 32, token=TOKEN, keys_dir=str(tmp_path / "keys"),
                     conf_overrides={"logCompactionMinEntries": 20})
    want = hashlib.sha256(f"{marker}:{marker}-env".encode()).hexdigest()
    spec = {"schedule": {"every_s": 3600}, "misfire": {"policy": "skip"},
            "executor": {"type": "shell", "env": {"E": marker + "-env"},
                         "argv": ["sh", "-c", f'test "$(printf %s "$S:$E" | sha256sum | cut -c1-64)" = "{want}"']},
            "secrets": {"S": marker}}
    base = f"http://127.0.0.1:{api}"
    umask, threshold = os.umask(0o022), gc.get_threshold()
    os.umask(umask)

    async def call(method, path, body=None):
        return await asyncio.to_thread(http, method, base + path, body, TOKEN, timeout=5)

    async def until(cond, what):
        deadline = asyncio.get_running_loop().time() + 30
        while not await cond():
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)  # ok-sleep: polling interval inside a deadline loop

    async def t():
        stop_ev = asyncio.Event()
        node = asyncio.create_task(run_node(cfg, stop=stop_ev))

        async def up():
            try:
                return (await call("GET", "/healthz"))[0] == 200
            except OSError:
                return False
        try:
            await until(up, "the node to lead")
            for name in ("a", "b"):
                assert (await call("PUT", f"/v1/jobs/{name}", spec))[0] == 201
            s, body = await call("POST", "/v1/jobs/a/trigger")
            assert s == 201, body

            async def done():
                return (await call("GET", f"/v1/runs/{body['run']}"))[1]["state"] in ("succeeded", "failed", "dead")
            await until(done, "the run")
            run = (await call("GET", f"/v1/runs/{body['run']}"))[1]
            assert run["state"] == "succeeded", run  # the embedded worker had both values in clear
            for i in range(30):  # past logCompactionMinEntries: the log is compacted into a dump
                assert (await call("PUT", f"/v1/jobs/f{i}", dict(spec, secrets={"S": marker})))[0] == 201

            async def dumped():
                return os.path.exists(os.path.join(cfg.data_dir, "raft.dump"))
            await until(dumped, "a dump")
        finally:
            stop_ev.set()
            await asyncio.wait_for(node, 30)
    try:
        asyncio.run(t())
    finally:
        os.umask(umask)
        gc.set_threshold(*threshold)
    with open(key_file, "rb") as f:
        key_text = f.read().strip()
    assert _files_hold(cfg.data_dir, marker.encode()) == [], "a secret in clear"
    assert _files_hold(cfg.data_dir, key_text) == [] and _files_hold(cfg.data_dir, base64.urlsafe_b64decode(
        key_text + b"=" * (-len(key_text) % 4))) == [], "the key"
    assert os.listdir(cfg.data_dir) and os.path.getsize(os.path.join(cfg.data_dir, "raft.dump")) > 0


def test_raftsched_node_refuses_a_key_ring_others_may_read_or_one_inside_its_data_directory(tmp_path, capsys):
    c = Cluster(tmp_path, n=1)
    argv = c.argv(0)[3:]
    os.chmod(c.keys_dir / "k1.key", 0o644)
    assert cli.main(argv) == 2
    assert "k1.key is readable by others" in capsys.readouterr().err
    os.chmod(c.keys_dir / "k1.key", 0o600)
    inside = str(c.data_dir(0) / "keys")
    assert cli.main([*argv, "--keys-dir", inside]) == 2
    assert "is inside --data-dir" in capsys.readouterr().err


def test_raftsched_secrets_new_key_writes_a_private_key_file(tmp_path, capsys):
    d = tmp_path / "ring"
    assert cli.main(["secrets", "new-key", "--keys-dir", str(d), "--id", "k7"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"key": "k7", "file": str(d / "k7.key")} and KeyRing.load(str(d)).ids() == ["k7"]
    assert cli.main(["secrets", "new-key", "--keys-dir", str(d), "--id", "k7"]) == 2
    assert "exists" in capsys.readouterr().err
