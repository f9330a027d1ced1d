"""The notifications receiver: a webhook sink's far end, a separate process with an append-only,
fsynced log.

    python events_receiver.py --port P --log FILE --key KEY

Every POST is one event (docs/notifications.md): its signature is verified with KEY, and the
event, the arrival time and the verdict are appended to the log and fsynced before the answer
(200), so the log is the receiver's truth even if it is killed. Duplicates (an event sent again
after a fail-over) are logged too: the ``notifications`` checker judges them.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--key", required=True)
    args = ap.parse_args()
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    lock = threading.Lock()
    key = args.key.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            data = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            ts = self.headers.get("X-Raftsched-Timestamp", "")
            want = "sha256=" + hmac.new(key, ts.encode() + b"." + data, hashlib.sha256).hexdigest()
            signed = hmac.compare_digest(want, self.headers.get("X-Raftsched-Signature", ""))
            try:
                body = json.loads(data)
            except ValueError:
                body = None
            rec = {"t_ms": time.time_ns() // 1_000_000, "signed": signed, "event": body,
                   "idempotency_key": self.headers.get("Idempotency-Key")}
            with lock:
                os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
                os.fsync(fd)  # on disk before the node hears "accepted"
            self.send_response(200 if signed and body is not None else 400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=server.shutdown, daemon=True).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
