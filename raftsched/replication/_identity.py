"""``raft.identity``: which node a data directory's log belongs to.

pysyncobj keeps no record in its files of whose they are: a node started
on another member's data directory (two directories swapped between machines, a volume mounted
on the wrong node, a copy restored to the wrong place) would take that member's log, term and
vote for its own. Raft's promises rest on each member's log and vote being its own: the member
that lost its directory forgets what it acknowledged and whom it voted for, and the one that
took it answers for entries it never received; a committed entry (a fire, a fencing token's
grant) can be lost, or a term get two leaders.

So a data directory names its node: the first start on a directory writes ``raft.identity``
(the node's name, ``raftsched node --id``; a bare RaftNode's is its address), durably, and a
start under another name is refused before anything of the log is read. A directory written
before this file existed is adopted by the first start that finds it without one. The name is
the node's id, not its Raft address, so that a stopped cluster can be started on other ports
(scripts/cluster.sh) while a swapped directory is still told apart.
"""
from __future__ import annotations

import json
import os

from ._disk import Disk

FILE = "raft.identity"


class DataDirOfAnotherNode(RuntimeError):
    """The data directory holds another node's log, or an identity that cannot be read."""


def refusal(data_dir: str, name: str) -> str | None:
    """Why the node ``name`` may not start on ``data_dir`` (another node's, or an identity that
    cannot be read: it is written atomically and synced, so that is damage or a hand's edit, and
    nothing is guessed), or None. Reads only."""
    path = os.path.join(data_dir, FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if not raw:
        # Renamed into place but not synced when the machine went down, which only a node running
        # without fsync can leave (its first start, seconds before): claimed again.
        return None
    try:
        owner = json.loads(raw)["node"]
        if not isinstance(owner, str) or not owner:
            raise ValueError(owner)
    except (ValueError, KeyError, TypeError):
        return (f"{path} cannot be read (it should be {{\"node\": \"<the node's --id>\"}}); the node does not "
                "start on a log it cannot tell is its own")
    if owner != name:
        return (f"data dir {data_dir} holds the log of node {owner!r}, not of {name!r}: start {owner!r} on it, or "
                f"give {name!r} a data directory of its own (a node never takes another's log). If it is "
                f"{owner!r}'s own log under a new --id, write {json.dumps({'node': name})} to {path}")
    return None


def claim(data_dir: str, name: str, disk: Disk) -> None:
    """Check that ``data_dir`` belongs to the node ``name`` (``refusal``), writing its identity
    when it has none. :raises DataDirOfAnotherNode: with the refusal."""
    why = refusal(data_dir, name)
    if why is not None:
        raise DataDirOfAnotherNode(why)
    path = os.path.join(data_dir, FILE)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        disk.write_file(path, json.dumps({"node": name}).encode())
