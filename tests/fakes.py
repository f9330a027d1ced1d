"""The replication fakes, which ship with the package (raftsched/testing/fakes.py); re-exported
here so that tests keep importing them as ``fakes``."""
from raftsched.testing.fakes import *  # noqa: F401,F403
from raftsched.testing.fakes import FakeRaft  # noqa: F401 - named, for readers and linters
