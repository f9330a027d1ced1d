"""A fenced key/value store: a downstream system that refuses writes from a stale lock holder.

A lock lease alone cannot stop a holder that was paused past its TTL (GC, SIGSTOP, VM migration)
from writing after someone else got the lock. The fencing token can, if the system that receives
the write checks it: FencedStore remembers, per resource, the highest token it has accepted and
refuses any write that carries a lower one. The check and the write happen in one SQLite
transaction that takes the write lock first (``BEGIN IMMEDIATE``), so two processes writing at once
cannot both pass the check against the same old value.

    store = FencedStore("data.db")
    with client.lock("report", owner="host-a", ttl_s=10) as lease:
        store.write("report", {"rows": 42}, token=lease.token)   # StaleToken if superseded

Run as a script, it shows a paused holder being fenced off, against a running cluster:

    python examples/fenced_store.py demo --url http://127.0.0.1:8701 --token-file .raftsched/token

See docs/fencing.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (
    resource TEXT PRIMARY KEY,
    token    INTEGER NOT NULL          -- the highest fencing token accepted for the resource
);
CREATE TABLE IF NOT EXISTS kv (
    resource TEXT PRIMARY KEY,
    value    TEXT NOT NULL,            -- JSON
    token    INTEGER NOT NULL,         -- the token of the write that stored this value
    written_at REAL NOT NULL
);
"""


class StaleToken(Exception):
    """A write carried a lower fencing token than one already accepted for its resource."""

    def __init__(self, resource: str, token: int, highest: int) -> None:
        super().__init__(f"write to {resource!r} with fencing token {token} refused: "
                         f"token {highest} was already accepted for it (a newer holder exists)")
        self.resource = resource
        self.token = token
        self.highest = highest


class FencedStore:
    """A SQLite-backed key/value store with a fencing-token check per resource (key).

    Tokens must only grow per resource: a write with a token lower than the highest accepted so
    far is refused with :class:`StaleToken`; an equal token is accepted (the same holder writing
    again). Safe to use from several processes and threads on the same file: each instance has
    its own connection, and each write is one ``BEGIN IMMEDIATE`` transaction.

    :param path: the SQLite database file (created if missing).
    :param busy_timeout_s: how long a write waits for another writer's transaction.
    """

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 30.0) -> None:
        self.path = os.fspath(path)
        # isolation_level=None: no implicit transactions; we issue BEGIN IMMEDIATE ourselves.
        self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        self._mu = threading.Lock()  # one transaction at a time on this connection
        with self._mu:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._mu:
            self._db.close()

    def __enter__(self) -> "FencedStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _check_token(token) -> int:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"a fencing token is a non-negative integer, not {token!r}")
        return token

    def write(self, resource: str, value: Any, token: int) -> None:
        """Store ``value`` (JSON-able) under ``resource`` if ``token`` is not lower than the
        highest token accepted for it; record ``token`` as the new highest.

        :raises StaleToken: a higher token was already accepted (``.token``, ``.highest``).
        """
        token = self._check_token(token)
        text = json.dumps(value)
        with self._mu:
            db = self._db
            # IMMEDIATE takes the database's write lock now, before the read: a concurrent
            # writer waits here, so nobody can slip in between our check and our write.
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
                if row is not None and token < row[0]:
                    raise StaleToken(resource, token, row[0])
                db.execute("INSERT INTO fence (resource, token) VALUES (?, ?) "
                           "ON CONFLICT(resource) DO UPDATE SET token = excluded.token", (resource, token))
                db.execute("INSERT INTO kv (resource, value, token, written_at) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT(resource) DO UPDATE SET value = excluded.value, "
                           "token = excluded.token, written_at = excluded.written_at",
                           (resource, text, token, time.time()))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def read(self, resource: str) -> Any:
        """The value last written to ``resource``, or None."""
        row = self.read_with_token(resource)
        return None if row is None else row[0]

    def read_with_token(self, resource: str) -> tuple[Any, int] | None:
        """``(value, token of the write that stored it)``, or None."""
        with self._mu:
            row = self._db.execute("SELECT value, token FROM kv WHERE resource = ?", (resource,)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def highest_token(self, resource: str) -> int | None:
        """The highest token accepted for ``resource`` so far, or None."""
        with self._mu:
            row = self._db.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
        return None if row is None else row[0]


# ---------------------------------------------------------------------- demo
def _demo(args) -> int:
    # Imported here so that FencedStore itself needs nothing but the standard library.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from raftsched.client import Client

    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    token = token or os.environ.get("RAFTSCHED_TOKEN")
    client = Client(args.url, token=token)
    if args.db:
        return _demo_with(args, client, args.db)
    # No --db: a temporary store, removed when the demo ends.
    with tempfile.TemporaryDirectory(prefix="fenced-store-") as tmp:
        return _demo_with(args, client, os.path.join(tmp, "store.db"))


def _demo_with(args, client, db: str) -> int:
    from raftsched.client import LockLost
    name = args.lock
    ttl = args.ttl
    store_a = FencedStore(db)  # holder A and B could be different processes on different hosts;
    store_b = FencedStore(db)  # each has its own connection here, as they would

    def say(who: str, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {who}: {msg}", flush=True)

    say("setup", f"cluster {', '.join(args.url)}, lock {name!r}, TTL {ttl:g} s, store {db}")
    # Holder A acquires without the background renewer: the pause below freezes it entirely,
    # as a stop-the-world GC or SIGSTOP would freeze a real process with its renew thread.
    a = client.lock_acquire(name, owner="holder-A", ttl_s=ttl)
    say("A", f"acquired the lock, fencing token {a['token']} (expires {a['expires_at']})")
    store_a.write(args.resource, {"written_by": "A", "step": 1}, token=a["token"])
    say("A", f"wrote {args.resource!r} with token {a['token']}")
    say("A", f"... is paused for {ttl + 1:g} s (GC pause / SIGSTOP / VM migration): no renewals ...")

    # While A is frozen, B waits for the lock; it gets it once A's lease has expired.
    t0 = time.monotonic()
    with client.lock(name, owner="holder-B", ttl_s=ttl, blocking=True, timeout_s=ttl * 4 + 10) as lease_b:
        say("B", f"acquired the lock after {time.monotonic() - t0:.1f} s, fencing token {lease_b.token}")
        store_b.write(args.resource, {"written_by": "B", "step": 2}, token=lease_b.token)
        say("B", f"wrote {args.resource!r} with token {lease_b.token}")

        # A wakes up, still believing it holds the lock, and finishes its work.
        rest = ttl + 1 - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
        say("A", "wakes up and writes, believing it still holds the lock")
        refused = False
        try:
            store_a.write(args.resource, {"written_by": "A", "step": 3}, token=a["token"])
            say("A", "write ACCEPTED (this must not happen)")
        except StaleToken as e:
            refused = True
            say("store", f"REFUSED: {e}")
        try:
            client.lock_renew(name, a["token"])
        except LockLost as e:
            say("A", f"its renew is refused too: {e.message}")
    value, tok = store_b.read_with_token(args.resource)
    say("result", f"{args.resource!r} = {value} (token {tok})")
    store_a.close()
    store_b.close()
    return 0 if refused and value is not None and value.get("written_by") == "B" else 1


def _read(args) -> int:
    with FencedStore(args.db) as s:
        row = s.read_with_token(args.resource)
        print(json.dumps(None if row is None else {"value": row[0], "token": row[1]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="a paused lock holder is fenced off by the store")
    d.add_argument("--url", action="append", required=True,
                   help="a node's API URL (repeat for several nodes)")
    d.add_argument("--token-file", help="the API token file (or set RAFTSCHED_TOKEN)")
    d.add_argument("--db", help="SQLite file to keep (default: a temporary one, removed at the end)")
    d.add_argument("--lock", default="fenced-store-demo", help="lock name")
    d.add_argument("--resource", default="report", help="key to write")
    d.add_argument("--ttl", type=float, default=2.0, help="lock TTL in seconds (1-600)")
    d.set_defaults(fn=_demo)
    r = sub.add_parser("read", help="print a resource's value and token")
    r.add_argument("--db", required=True)
    r.add_argument("resource")
    r.set_defaults(fn=_read)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
