"""``python scripts/measure ...``: see this package's docstring (scripts/measure/__init__.py)."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCRIPTS = os.path.dirname(_HERE)
_ROOT = os.path.dirname(_SCRIPTS)
# Run as a directory, this directory is sys.path[0]: its modules are the package's, not top-level
# ones. What goes first instead: scripts/ (this package, and benchlib for bench-register), then
# the checkout this file is in (its raftsched ahead of an installed one).
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    del sys.path[0]
for _p in (_ROOT, _SCRIPTS):
    while _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)

from measure import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
