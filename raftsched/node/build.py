"""Which code a node runs: its version and a digest of the package's source, so that an operator
can tell, node by node, whether a rolling upgrade has reached it (docs/operations.md,
"Upgrading"). The version alone says little: it moves with releases, and the notes of
docs/operations.md are dated by change. The digest is of every ``.py`` file and the dashboard's
files of the installed package, by relative path, so two nodes with the same digest run the same
code wherever they were installed."""
from __future__ import annotations

import functools
import hashlib
import os

#: The package's directory (raftsched/).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: How many hex digits of the digest are shown (48 bits: two versions never collide in practice).
DIGEST_HEX = 12


@functools.lru_cache(maxsize=1)
def code() -> dict[str, str]:
    """``{"version", "digest"}`` of the code this process runs (computed once, ~10 ms)."""
    from .. import __version__
    h = hashlib.sha256()
    for root, dirs, files in os.walk(_PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith((".py", ".js", ".css", ".html")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, _PACKAGE).replace(os.sep, "/")
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return {"version": __version__, "digest": h.hexdigest()[:DIGEST_HEX]}
