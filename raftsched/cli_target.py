"""Where a client subcommand of ``raftsched`` sends its calls, and with which token and TLS files
(docs/api.md, "The command line"). Pure: it reads files and an environment given to it, and
sends nothing.

The nodes, the first of these that gives any:

1. ``--url`` (one URL or several, comma-separated);
2. ``--context NAME``: that context of the config file (``$RAFTSCHED_CONFIG``, else
   ``$XDG_CONFIG_HOME/raftsched/config.toml``, else ``~/.config/raftsched/config.toml``);
3. ``$RAFTSCHED_URL``;
4. the context ``$RAFTSCHED_CONTEXT`` names, else the config file's ``current-context``;
5. the cluster ``scripts/cluster.sh`` recorded in the nearest ``.raftsched/`` of the current
   directory or one above it (``ports``: the API port base and the TLS mode; ``nodes``: the
   members), with its scheme, its CA and, for mutual TLS, its client certificate;
6. ``$RAFTSCHED_API_PORT_BASE`` with no recorded cluster: ``http://127.0.0.1:BASE+1..3``.

Nothing else: with none of them the command stops and says where it looked (there is no
built-in address to send a token to).

The token: ``--token``, ``--token-file``, ``$RAFTSCHED_TOKEN`` (named by the user: sent to the
nodes above, whichever they are); then the context's ``token_file`` (only to that context's
nodes); then the recorded cluster's ``.raftsched/token``, only when every node above is one of
that cluster's recorded addresses. A token is never sent to an address that neither the user
named nor the cluster recorded.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
import urllib.parse

from .config import ConfigError, check_token, read_secret_file

STATE_DIR = ".raftsched"
#: The members cluster.sh starts when ``nodes`` does not list them.
DEFAULT_NODES = (1, 2, 3)
HOST = "127.0.0.1"
CONTEXT_KEYS = ("url", "token_file", "ca_file", "client_cert", "client_key")


@dataclasses.dataclass
class Target:
    """The resolved nodes, token and TLS files, and where each came from (``-v`` prints them)."""

    urls: list[str]
    source: str
    token: str | None = None
    token_source: str = ""
    #: the file the token was read from, if it was
    token_file: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        lines = [f"nodes: {','.join(self.urls)} (from {self.source})",
                 f"token: {self.token_source}" if self.token else "token: none"]
        if self.ca_file:
            lines.append(f"ca file: {self.ca_file}")
        return "\n".join(lines + self.notes)


def config_path(env: dict[str, str], home: str) -> str:
    if env.get("RAFTSCHED_CONFIG"):
        return env["RAFTSCHED_CONFIG"]
    base = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return os.path.join(base, "raftsched", "config.toml")


def split_urls(text: str, what: str) -> list[str]:
    """The URLs of a comma-separated list, each http:// or https://. :raises ConfigError:"""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    for u in urls:
        try:
            parts = urllib.parse.urlsplit(u)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as e:
            raise ConfigError(f"{what}: {u!r} is not a URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{what}: {u!r} is not an http:// or https:// URL")
    if not urls:
        raise ConfigError(f"{what}: no URL given")
    return urls


def load_context(path: str, name: str | None) -> tuple[str, dict] | None:
    """The context ``name`` (else the file's ``current-context``) of the config file at ``path``:
    ``(name, its table)``, None when there is no file or it names no context. Relative file
    names in it are relative to the file. :raises ConfigError: naming the field."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        if name:
            raise ConfigError(f"context {name!r}: no config file {path}") from None
        return None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    unknown = set(doc) - {"current-context", "contexts"}
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} (expected current-context, contexts)")
    contexts = doc.get("contexts", {})
    if not isinstance(contexts, dict):
        raise ConfigError(f"{path}: contexts must be a table of tables")
    name = name or doc.get("current-context")
    if not name:
        return None
    if not isinstance(name, str) or name not in contexts or not isinstance(contexts[name], dict):
        raise ConfigError(f"{path}: no context {name!r} (known: {', '.join(sorted(contexts)) or 'none'})")
    ctx = dict(contexts[name])
    where = f"{path} contexts.{name}"
    for key, value in ctx.items():
        if key not in CONTEXT_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (expected {', '.join(CONTEXT_KEYS)})")
        if key == "url" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            ctx[key] = ",".join(value)
        elif not isinstance(value, str):
            raise ConfigError(f"{where}.{key}: must be a string" + (" or a list of strings" if key == "url" else ""))
        elif key != "url":
            ctx[key] = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.expanduser(value))
    if "url" not in ctx:
        raise ConfigError(f"{where}.url: required")
    return name, ctx


def find_state_dir(cwd: str) -> str | None:
    """The nearest ``.raftsched/`` holding a ``ports`` record, from ``cwd`` upwards."""
    d = os.path.abspath(cwd)
    while True:
        candidate = os.path.join(d, STATE_DIR)
        if os.path.isfile(os.path.join(candidate, "ports")):
            return candidate
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


@dataclasses.dataclass
class Recorded:
    """The cluster cluster.sh recorded in ``state``."""

    state: str
    urls: list[str]
    api_base: int
    tls: str


def read_recorded(state: str) -> Recorded:
    """``ports`` (KEY=VALUE lines) and ``nodes`` of a ``.raftsched/`` (scripts/cluster.sh).
    :raises ConfigError:"""
    rec: dict[str, str] = {}
    path = os.path.join(state, "ports")
    try:
        with open(path) as f:
            for line in f:
                k, sep, v = line.strip().partition("=")
                if sep:
                    rec[k] = v
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    try:
        base = int(rec["RAFTSCHED_API_PORT_BASE"])
    except (KeyError, ValueError):
        raise ConfigError(f"{path}: no valid RAFTSCHED_API_PORT_BASE") from None
    tls = rec.get("RAFTSCHED_TLS", "")
    # The members (scripts/cluster.sh writes them on add and remove), not every node-N directory:
    # a removed node's stays, and its port may be anyone's now (the token would go to it).
    nodes = set(DEFAULT_NODES)
    try:
        with open(os.path.join(state, "nodes")) as f:
            nodes = {int(n) for n in f.read().split()}
    except (OSError, ValueError):
        pass
    scheme = "https" if tls else "http"
    return Recorded(state, [f"{scheme}://{HOST}:{base + n}" for n in sorted(nodes) if 0 < base + n < 65536],
                    base, tls)


def _same(url: str) -> str:
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"


def resolve(*, url: str = "", context: str | None = None, token: str | None = None, token_file: str | None = None,
            ca_file: str = "", client_cert: str = "", client_key: str = "",
            env: dict[str, str], cwd: str, home: str) -> Target:
    """The Target of a client subcommand's flags (module docstring). :raises ConfigError: no
    nodes found, no token found (each says where it looked), or a file that cannot be used."""
    looked: list[str] = []
    ctx: tuple[str, dict] | None = None
    state = find_state_dir(cwd)
    recorded = read_recorded(state) if state else None
    notes: list[str] = []
    path = config_path(env, home)
    if url:
        target = Target(split_urls(url, "--url"), "--url")
    elif not context and env.get("RAFTSCHED_URL", "").strip():
        target = Target(split_urls(env["RAFTSCHED_URL"], "RAFTSCHED_URL"), "RAFTSCHED_URL")
    else:
        # A --context flag is named on this command line: it goes before $RAFTSCHED_URL.
        looked += ["--url", "--context", "RAFTSCHED_URL"]
        ctx = load_context(path, context or env.get("RAFTSCHED_CONTEXT") or None)
        if ctx is not None:
            target = Target(split_urls(ctx[1]["url"], f"{path} contexts.{ctx[0]}.url"),
                            f"context {ctx[0]} of {path}")
        elif recorded is not None:
            target = Target(list(recorded.urls), f"the cluster recorded in {recorded.state}")
            env_base = env.get("RAFTSCHED_API_PORT_BASE", "").strip()
            if env_base and env_base != str(recorded.api_base):
                notes.append(f"RAFTSCHED_API_PORT_BASE={env_base} is ignored: the cluster in {recorded.state} "
                             f"was started with {recorded.api_base}")
        elif env.get("RAFTSCHED_API_PORT_BASE", "").strip():
            b = env["RAFTSCHED_API_PORT_BASE"].strip()
            if not (b.isascii() and b.isdigit()) or not 0 < int(b) + max(DEFAULT_NODES) < 65536:
                raise ConfigError(f"RAFTSCHED_API_PORT_BASE: {b!r} is not a port base")
            target = Target([f"http://{HOST}:{int(b) + n}" for n in DEFAULT_NODES], "RAFTSCHED_API_PORT_BASE")
        else:
            looked += [f"{path} (no file or no current-context)",
                       f"{STATE_DIR}/ports in {os.path.abspath(cwd)} and the directories above it (none)",
                       "RAFTSCHED_API_PORT_BASE"]
            raise ConfigError("no cluster to talk to; looked at " + ", ".join(looked)
                              + ". Give --url, or start one with scripts/cluster.sh")
    target.notes = notes
    # Which of the named nodes the recorded cluster knows: its token and TLS files go to those only.
    recorded_ok = recorded is not None and all(_same(u) in {_same(r) for r in recorded.urls} for u in target.urls)
    from_ctx = ctx[1] if ctx is not None else {}
    target.ca_file = ca_file or from_ctx.get("ca_file") or None
    target.client_cert = client_cert or from_ctx.get("client_cert") or None
    target.client_key = client_key or from_ctx.get("client_key") or None
    if recorded is not None and recorded_ok and recorded.tls and ctx is None:
        tls_dir = os.path.join(recorded.state, "tls")
        target.ca_file = target.ca_file or os.path.join(tls_dir, "ca.pem")
        if recorded.tls == "mutual" and not target.client_cert:
            target.client_cert = os.path.join(tls_dir, "client.pem")
            target.client_key = target.client_key or os.path.join(tls_dir, "client-key.pem")
    # The token.
    tried = ["--token", "--token-file", "RAFTSCHED_TOKEN"]
    if token:
        target.token, target.token_source = token, "--token"
    elif token_file:
        target.token, target.token_source = read_secret_file(token_file, "token file"), f"--token-file {token_file}"
        target.token_file = token_file
    elif env.get("RAFTSCHED_TOKEN", "").strip():
        target.token, target.token_source = env["RAFTSCHED_TOKEN"].strip(), "RAFTSCHED_TOKEN"
    elif from_ctx.get("token_file"):
        target.token = read_secret_file(from_ctx["token_file"], f"contexts.{ctx[0]}.token_file")  # type: ignore[index]
        target.token_source = f"{from_ctx['token_file']} (context {ctx[0]})"  # type: ignore[index]
        target.token_file = from_ctx["token_file"]
    else:
        if ctx is not None:
            tried.append(f"contexts.{ctx[0]}.token_file (not set)")
        rec_token = os.path.join(recorded.state, "token") if recorded is not None else None
        if rec_token is not None and recorded_ok and ctx is None and os.path.exists(rec_token):
            target.token = read_secret_file(rec_token, "token file")
            target.token_source = f"{rec_token} (the recorded cluster's)"
            target.token_file = rec_token
        else:
            if rec_token is None:
                tried.append(f"{STATE_DIR}/token of a recorded cluster (none found from {os.path.abspath(cwd)})")
            elif not os.path.exists(rec_token):
                tried.append(f"{rec_token} (absent)")
            else:
                tried.append(f"{rec_token} (not sent: {', '.join(target.urls)} is not the cluster it records)")
            raise ConfigError("no token found; looked at " + ", ".join(tried))
    check_token(target.token, target.token_source or "the token file")
    return target
