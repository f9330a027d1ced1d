"""The fenced sink: a separate process with an append-only, fsynced log.

    python sink.py --port P --log FILE

Protocol: one JSON object per line over TCP on 127.0.0.1, one answer line per request.
``{"op": "write", "resource", "token", ...}`` is accepted when ``token`` is not lower than the
highest token the sink has accepted for ``resource``, and refused otherwise. Every request, accepted
or refused, is appended to the log (with the arrival time, a sequence number, the highest token
before it and the verdict) and fsynced *before* the answer is sent, so the log is the sink's truth
even if it is killed. On start, the highest tokens are rebuilt from an existing log.

The resource is the run id (see docs/testing.md): a fencing token is granted per lease, and a
lease is per run, so "a lower token than one already accepted" means exactly "an attempt whose
lease was superseded by a newer attempt of the same run wrote after that newer attempt did".
Two runs of one job are different resources: they may legitimately run at the same time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time


class Sink:
    def __init__(self, log_path: str) -> None:
        self.highest: dict[str, int] = {}
        self.seq = 0
        if os.path.exists(log_path):
            with open(log_path) as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue  # a torn last line
                    self.seq = max(self.seq, r.get("seq", 0))
                    if r.get("accepted"):
                        self.highest[r["resource"]] = max(self.highest.get(r["resource"], r["token"]), r["token"])
        self.fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = asyncio.Lock()

    async def write(self, req: dict) -> dict:
        res, tok = req.get("resource"), req.get("token")
        if not isinstance(res, str) or not isinstance(tok, int) or isinstance(tok, bool):
            return {"accepted": False, "error": "write needs resource (str) and token (int)"}
        async with self.lock:
            highest = self.highest.get(res)
            accepted = highest is None or tok >= highest
            self.seq += 1
            rec = dict(req, seq=self.seq, t_ms=time.time_ns() // 1_000_000, highest_before=highest,
                       accepted=accepted)
            rec.pop("op", None)
            os.write(self.fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
            os.fsync(self.fd)  # on disk before the writer hears "accepted"
            if accepted:
                self.highest[res] = tok
        return {"accepted": accepted, "highest": highest, "seq": rec["seq"]}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    req = json.loads(line)
                except ValueError:
                    ans = {"accepted": False, "error": "malformed JSON"}
                else:
                    if req.get("op") == "write":
                        ans = await self.write(req)
                    elif req.get("op") == "ping":
                        ans = {"ok": True, "seq": self.seq}
                    else:
                        ans = {"accepted": False, "error": "unknown op"}
                writer.write((json.dumps(ans) + "\n").encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    sink = Sink(args.log)
    server = await asyncio.start_server(sink.handle, "127.0.0.1", args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sink: listening on 127.0.0.1:{args.port}, log {args.log}", flush=True)
    async with server:
        await stop.wait()
    os.close(sink.fd)


if __name__ == "__main__":
    asyncio.run(main())
