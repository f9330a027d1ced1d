"""The API over mutual TLS, against one real node (a CA made for the test, raftsched.testing.tls):
clients verify the node's certificate and present their own; one that does not present one is
refused, and one that trusts another CA refuses the node at once (no retry until the deadline).
The tokens CLI runs over it too."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from raftsched.client import AsyncClient, Client
from raftsched.core.errors import Forbidden, Indeterminate, Unavailable
from raftsched.testing.cluster import write_private
from raftsched.testing.procs import Procs
from raftsched.testing.tls import make_demo_pki

from procs import REPO, running_cluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from running_cluster(tmp_path_factory.mktemp("tls"), n=1, tls="mutual")


def cli(c, *args):
    tls = ["--ca-file", str(c.tls.ca), "--client-cert", str(c.tls.client_cert), "--client-key", str(c.tls.client_key)]
    p = subprocess.run([sys.executable, "-m", "raftsched.cli", *args, "--url", c.url(0), "--token", c.token, *tls],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    return p.returncode, p.stdout, p.stderr


def test_a_client_that_trusts_the_ca_and_shows_its_certificate_is_served(node):
    assert node.url(0).startswith("https://")
    c = Client(node.url(0), token=node.token, ca_file=str(node.tls.ca), cert_file=str(node.tls.client_cert),
               key_file=str(node.tls.client_key))
    assert c.cluster()["role"] == "leader"
    spec = {"schedule": {"every_s": 3600}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}}
    assert c.put_job("over-tls", spec)["created"] is True


def test_a_client_without_a_certificate_is_refused(node):
    # TLS 1.3: the node refuses after the client's side of the handshake is done, by closing the
    # connection, so the client sees a connection lost (and retries within its deadline).
    c = Client(node.url(0), token=node.token, deadline_s=1, ca_file=str(node.tls.ca))
    with pytest.raises((Unavailable, Indeterminate)) as ei:
        c.cluster()
    # That close looks like any lost connection: the message says what a certificate would do (a
    # worker without one logged "connection lost ... may have applied" for a minute).
    assert "requires a client certificate" in ei.value.message and "--client-cert" in ei.value.message

    async def async_call():
        ac = AsyncClient(node.url(0), token=node.token, deadline_s=1, ca_file=str(node.tls.ca))
        try:
            await ac.cluster()
        finally:
            await ac.close()
    with pytest.raises((Unavailable, Indeterminate)) as ei:
        asyncio.run(async_call())
    assert "requires a client certificate" in ei.value.message


@pytest.mark.parametrize("how", ["another CA", "the system's CAs"])
def test_a_client_that_does_not_trust_the_node_is_refused_at_once(node, tmp_path, how):
    if how == "another CA":
        other = make_demo_pki(tmp_path / "other")
        kw = {"ca_file": str(other.ca), "cert_file": str(other.client_cert), "key_file": str(other.client_key)}
    elif how == "the system's CAs":
        kw = {"cert_file": str(node.tls.client_cert), "key_file": str(node.tls.client_key)}
    c = Client(node.url(0), token=node.token, deadline_s=20, **kw)
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as ei:
        c.cluster()
    assert "TLS" in ei.value.message or "SSL" in ei.value.message, ei.value.message
    assert time.monotonic() - t0 < 10, "a TLS failure is not retried until the deadline"


def test_plain_http_to_the_tls_port_says_tls_is_expected_at_once(node):
    """The node cannot read plain HTTP: nothing happened, and the client says to use https://
    instead of retrying a "connection lost" until its deadline."""
    http_url = node.url(0).replace("https://", "http://")
    for mutate in (False, True):
        c = Client(http_url, token=node.token, deadline_s=20)
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as ei:
            c.trigger("nope") if mutate else c.cluster()
        assert "the node expects TLS: use https://" in ei.value.message, ei.value.message
        assert time.monotonic() - t0 < 10
    # The asyncio client (and so raftsched worker) alike.
    import asyncio
    from raftsched.client.asynchronous import AsyncClient

    async def via_asyncio():
        async with AsyncClient(http_url, token=node.token, deadline_s=20) as ac:
            t0 = time.monotonic()
            with pytest.raises(Unavailable) as ei:
                await ac.trigger("nope")
            assert "the node expects TLS: use https://" in ei.value.message, ei.value.message
            assert time.monotonic() - t0 < 10
    asyncio.run(via_asyncio())
    # The command line: one line, with the next step.
    p = subprocess.run([sys.executable, "-m", "raftsched.cli", "trigger", "j", "--url", http_url, "--token", node.token],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 1 and p.stderr.count("expects TLS") == 1 and len(p.stderr.splitlines()) <= 2, p.stderr


def test_tokens_cli_create_list_revoke(node):
    rc, out, err = cli(node, "tokens", "create", "--role", "reader", "--note", "cli")
    assert rc == 0, out + err
    made = json.loads(out)
    assert made["token"].startswith("rst_" + made["id"])
    reader = Client(node.url(0), token=made["token"], ca_file=str(node.tls.ca),
                    cert_file=str(node.tls.client_cert), key_file=str(node.tls.client_key))
    assert reader.list_jobs()["total"] >= 0
    rc, out, _ = cli(node, "tokens", "list")
    assert rc == 0 and made["id"] in out and made["token"] not in out
    rc, out, _ = cli(node, "tokens", "revoke", made["id"])
    assert rc == 0 and json.loads(out)["revoked_at"]
    rc, out, _ = cli(node, "tokens", "create", "--role", "admin", "--tenant", "billing")
    assert rc == 1 and json.loads(out)["error"]["field"] == "tenants"
    rc, out, _ = cli(node, "tokens", "create", "--role", "operator", "--tenant", "billing", "--tenant", "ops")
    assert rc == 0 and json.loads(out)["tenants"] == ["billing", "ops"]


def test_a_remote_worker_with_a_worker_token_runs_its_jobs_over_mutual_tls_and_can_do_nothing_else(node, tmp_path):
    """`raftsched worker` over https with the CA, its own certificate and a worker-role token
    bound to its id and limited to tenant tls: it takes the run placed on its label in its
    tenant, not one of another tenant placed there too; the same token may not create a job nor
    speak for another worker id (403)."""
    tls = {"ca_file": str(node.tls.ca), "cert_file": str(node.tls.client_cert), "key_file": str(node.tls.client_key)}
    admin = Client(node.url(0), token=node.token, **tls)
    rc, out, _ = cli(node, "tokens", "create", "--role", "worker", "--worker", "tls-worker", "--tenant", "tls",
                     "--note", "tls worker")
    made = json.loads(out)
    assert rc == 0 and made["workers"] == ["tls-worker"] and made["tenants"] == ["tls"], out
    token_file = tmp_path / "worker-token"
    write_private(token_file, made["token"] + "\n")
    procs = Procs()
    try:
        procs.start("w", [sys.executable, "-m", "raftsched.cli", "worker", "--url", node.url(0),
                          "--token-file", str(token_file), "--id", "tls-worker", "--labels", "pool=tls",
                          "--slots", "1", "--executors", "shell", "--wait-s", "2",
                          "--ca-file", tls["ca_file"], "--client-cert", tls["cert_file"],
                          "--client-key", tls["key_file"]], tmp_path / "worker.log", cwd=REPO)
        placed = {"schedule": {"every_s": 1}, "executor": {"type": "shell", "argv": ["true"]},
                  "misfire": {"policy": "skip"}, "placement": {"labels": {"pool": "tls"}}}
        admin.put_job("tls-other", placed)  # tenant default: not the worker's
        admin.put_job("tls-placed", dict(placed, tenant="tls"))

        def ran():
            return [r for r in admin.runs("tls-placed")["runs"]
                    if r["state"] == "succeeded" and r["worker"] == "tls-worker"]
        wait_for(ran, 30, "a run of the placed job succeeded on the remote worker")
        others = admin.runs("tls-other")["runs"]
        assert others and all(r["state"] == "queued" and r["waiting_for"] == "no worker matches its placement"
                              for r in others), others
        assert admin.worker("tls-worker")["tenants"] == ["tls"]
        with pytest.raises(Forbidden) as e:
            Client(node.url(0), token=made["token"], **tls).worker_heartbeat("another-worker", [], 10_000)
        assert e.value.field == "id"
        with pytest.raises(Forbidden):
            Client(node.url(0), token=made["token"], **tls).put_job("by-a-worker", {
                "schedule": {"every_s": 60}, "executor": {"type": "shell", "argv": ["true"]}, "misfire": {"policy": "skip"}})
    finally:
        procs.stop_all()
        admin.delete_job("tls-placed")
        admin.delete_job("tls-other")
