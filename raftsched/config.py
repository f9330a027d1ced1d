"""What the processes' configurations share (``raftsched node``, ``raftsched worker``): the error
a bad one raises, and how a secret is read from its file (a token, the cluster secret). Here, not
in node/, so that a worker reads its token without importing the node."""
from __future__ import annotations

import os
import stat


class ConfigError(Exception):
    """A configuration that cannot work (a flag, a file): the command says why and exits 2."""


def read_secret_file(path: str, what: str) -> str:
    """Read a secret from a file readable by its owner only. :raises ConfigError:"""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} {path} is readable by others (mode {oct(st.st_mode & 0o777)}): chmod 600 it")
    with open(path) as f:
        value = f.read().strip()
    if len(value) < 16:
        raise ConfigError(f"{what} {path} holds fewer than 16 characters")
    return value
