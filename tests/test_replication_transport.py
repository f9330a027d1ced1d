"""What goes on the wire between nodes: messages sealed with AES-256-GCM (_crypto.py), sent
uncompressed, and routed through a dial map (_transport.py)."""
from __future__ import annotations

import asyncio
import zlib

import pysyncobj.tcp_connection
import pytest
from cryptography.exceptions import InvalidTag

from raftsched.replication import install
from raftsched.replication._crypto import _AeadEncryptor
from raftsched.replication._transport import _Uncompressed

from replication_helpers import SECRET, Cluster, free_port, incr, run, wait_until


def test_raft_messages_are_sealed_with_aes_gcm_and_refused_when_altered():
    a, b = _AeadEncryptor(SECRET), _AeadEncryptor(SECRET)  # two processes, one secret
    data = b"a pickled message" * 10
    t1, t2 = a.encrypt_at_time(data, 7), a.encrypt_at_time(data, 8)
    assert data not in t1 and t1 != t2  # secret, and a fresh nonce each time
    assert b.extract_timestamp(t1) == 7 and b.extract_timestamp(t2) == 8
    assert b.decrypt(t1) == data and b.decrypt(t2) == data and a.decrypt(t1) == data
    assert b.decrypt(b.encrypt_at_time(b"", 0)) == b""
    # Any altered byte (version, salt, timestamp, nonce, ciphertext, tag) is refused.
    for i in range(len(t1)):
        bad = bytearray(t1)
        bad[i] ^= 0x01
        with pytest.raises((InvalidTag, ValueError)):
            _AeadEncryptor(SECRET).decrypt(bytes(bad))
    with pytest.raises(InvalidTag):
        _AeadEncryptor("another secret").decrypt(t1)
    for junk in (b"", b"\x01" * 20, t1[:-1] + b"", b"\x80" + t1[1:]):
        with pytest.raises((InvalidTag, ValueError)):
            b.decrypt(junk)
    # Nonces come from a counter under a per-process key: distinct processes, distinct keys.
    assert t1[1:17] == t2[1:17] != b.encrypt_at_time(data, 7)[1:17]
    assert int.from_bytes(t2[25:37], "big") == int.from_bytes(t1[25:37], "big") + 1


def test_raft_messages_are_not_compressed_and_old_compressed_ones_still_read():
    install()  # what every RaftNode does
    assert pysyncobj.tcp_connection.zlib is _Uncompressed
    data = b"\x80\x04a pickle"
    assert _Uncompressed.compress(data, 3) == b"\x00" + data
    assert _Uncompressed.decompress(_Uncompressed.compress(data, 3)) == data
    assert _Uncompressed.decompress(zlib.compress(data, 3)) == data


async def _forwarder(target_port: int, stats: dict):
    """A loopback TCP forwarder (what a partition proxy will be): counts connections."""
    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        stats["connections"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:  # the test's loop is shutting down
            pass

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_dial_map_routes_links_through_proxies_and_keeps_peer_ids(tmp_path):
    async def main():
        addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        servers, stats, dial_maps = [], {}, {a: {} for a in addrs}
        try:
            # pysyncobj's rule: of two nodes, the one with the larger address dials.
            for a in addrs:
                for b in addrs:
                    if a > b:
                        stats[(a, b)] = {"connections": 0}
                        server = await _forwarder(int(b.rsplit(":", 1)[1]), stats[(a, b)])
                        servers.append(server)
                        port = server.sockets[0].getsockname()[1]
                        dial_maps[a][b] = f"127.0.0.1:{port}"
            c = Cluster(tmp_path, addrs=addrs, dial_maps=dial_maps)
            try:
                c.start_all()
                leader = await c.agreed_leader()
                follower = next(a for a in addrs if a != leader)
                assert (await c.nodes[follower].propose(incr("p")))["ok"]
                await c.converged({"p": 1})
                assert all(s["connections"] >= 1 for s in stats.values()), stats
                await wait_until(lambda: all(
                    n.status()["peers_connected"] == sorted(set(addrs) - {a})
                    for a, n in c.nodes.items()), 5, "all links up through the proxies")
            finally:
                c.close()
        finally:
            for s in servers:
                s.close()
    run(main)
