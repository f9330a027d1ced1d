"""One TCP proxy per node-to-node link, all in one process, each link switchable between
``pass``, ``blackhole`` and ``reset``.

    python proxy.py --control PORT --link NAME:LISTEN_PORT:TARGET_PORT [--link ...]

The nodes dial their peers through these ports (``raftsched node --dial-map``). pysyncobj dials a link from
the node with the larger "host:port" only, and that node announces its own address first, so one
proxy listening for the dialler and forwarding to the other node carries the whole link.

Modes:
- ``pass``: bytes flow both ways.
- ``blackhole``: the proxy stops reading from both sides of every connection of the link, and holds
  new connections without connecting them onward. Nothing is lost by the proxy: what was sent
  stays in socket buffers, as it would in TCP retransmission queues during a real partition, and
  flows again after healing if the nodes still hold the connection (they drop it after their
  connectionTimeout). This is the accept-and-hold partition of the notes.
- ``reset``: every connection of the link is closed with a TCP RST, and new ones are reset at once.

Control: JSON lines on 127.0.0.1:PORT: ``{"link": NAME, "mode": MODE}`` -> ``{"ok": true}``;
``{"op": "status"}`` -> every link's mode and connection count.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import struct
import time


def _ts() -> str:
    return time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


class Link:
    def __init__(self, name: str, listen_port: int, target_port: int) -> None:
        self.name = name
        self.listen_port = listen_port
        self.target_port = target_port
        self.mode = "pass"
        self.passing = asyncio.Event()
        self.passing.set()
        #: live connections: (client writer, upstream writer or None)
        self.conns: set[tuple] = set()
        self.accepted = 0

    def set_mode(self, mode: str) -> None:
        if mode not in ("pass", "blackhole", "reset"):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        if mode == "pass":
            self.passing.set()
        else:
            self.passing.clear()
        if mode == "reset":
            for pair in list(self.conns):
                for w in pair:
                    if w is not None:
                        _rst(w)
            self.conns.clear()
        print(f"{_ts()} proxy: link {self.name} -> {mode}", flush=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reset":
            _rst(writer)
            return
        pair = [writer, None]
        key = None
        try:
            await self.passing.wait()  # blackhole: hold the new connection, unconnected
            if self.mode == "reset":
                _rst(writer)
                return
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                _rst(writer)
                return
            pair[1] = up_w
            key = (writer, up_w)
            self.conns.add(key)
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # The proxy is stopping. Not re-raised: Python 3.11's stream server logs a traceback
            # for every connection handler that ends cancelled.
            pass
        finally:
            if key is not None:
                self.conns.discard(key)
            for w in pair:
                if w is not None and not w.is_closing():
                    w.transport.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.passing.wait()
                data = await src.read(65536)
                if not data:
                    break
                await self.passing.wait()  # read just before a blackhole: held until healed
                if dst.is_closing():
                    break
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not dst.is_closing():
                dst.transport.abort()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--control", type=int, required=True)
    ap.add_argument("--link", action="append", default=[], help="NAME:LISTEN_PORT:TARGET_PORT")
    args = ap.parse_args()
    links: dict[str, Link] = {}
    servers = []
    for spec in args.link:
        name, lp, tp = spec.rsplit(":", 2)
        link = Link(name, int(lp), int(tp))
        links[name] = link
        servers.append(await asyncio.start_server(link.handle, "127.0.0.1", int(lp)))

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    if req.get("op") == "status":
                        ans = {"ok": True, "links": {n: {"mode": l.mode, "conns": len(l.conns), "accepted": l.accepted}
                                                     for n, l in links.items()}}
                    else:
                        links[req["link"]].set_mode(req["mode"])
                        ans = {"ok": True}
                except (ValueError, KeyError) as e:
                    ans = {"ok": False, "error": repr(e)}
                writer.write((json.dumps(ans) + "\n").encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    servers.append(await asyncio.start_server(control, "127.0.0.1", args.control))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{_ts()} proxy: control 127.0.0.1:{args.control}; links " +
          ", ".join(f"{l.name} :{l.listen_port}->:{l.target_port}" for l in links.values()), flush=True)
    await stop.wait()
    for s in servers:
        s.close()


if __name__ == "__main__":
    asyncio.run(main())
