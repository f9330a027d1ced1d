"""``python -m raftsched``: the ``raftsched`` command (raftsched/cli.py)."""
import sys

from .cli import main

sys.exit(main())
