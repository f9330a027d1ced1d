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
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
    if len(value) < 16:
        raise ConfigError(f"{what} {path} holds fewer than 16 characters")
    return value


def token_flaw(token: str) -> str | None:
    """Why ``token`` cannot go in an ``Authorization`` header (a space, a line break, a control
    or non-ASCII character: a file holding more than the token, say), or None. The reason never
    quotes the token."""
    for i, ch in enumerate(token):
        if not "!" <= ch <= "~":
            kind = ("a space" if ch == " " else "a line break" if ch in "\r\n" else
                    "a control character" if ch.isascii() else "a non-ASCII character")
            return f"it holds {kind} at position {i + 1} (a token is one word of printable ASCII)"
    return None


def check_token(token: str, source: str) -> str:
    """``token`` if a header can carry it. :raises ConfigError: naming ``source``, never the
    token."""
    flaw = token_flaw(token)
    if flaw is not None:
        raise ConfigError(f"the token of {source} cannot be sent: {flaw}")
    return token
