"""Secrets at rest: a job's secret values sealed with a key kept outside the data directory
(docs/security.md, "Secrets at rest"; docs/operations.md, "Key files").

A job's secrets are the values of its executor's ``headers`` (http) and ``env`` (shell), and of
its ``secrets`` map. The node that receives a write seals each value (``seal_spec``) before it
proposes the command, so the journal, the dumps and every replica's state hold only sealed
bytes; the node that hands a run to a worker unseals them (``unseal_grant``), and nothing else
does: reads show the fingerprint a value was sealed with (node/redact.py).

A sealed value is bytes::

    0x01 | len(key id) | key id | fingerprint (4 bytes) | nonce (12) | AES-256-GCM ciphertext and tag

authenticated together with the header and its place (the job's name, the map and the name in
it), so a sealed value moved to another job or field does not open. The nonce is synthetic
(HMAC-SHA256 of the header, the place and the value under a second key, cut to 96 bits): the
same value sealed at the same place under the same key gives the same bytes, so a retried
request makes the same command (a batch's request ids are hashes of its commands), and two
different values never share a nonce short of a 96-bit collision, the bound random nonces have too.

The key ring is a directory of ``<key id>.key`` files, each 32 random bytes in base64, readable
by the node's user only. Which key new values are sealed under is in the replicated state (the
``reseal`` command, core/seal_keys.py), so every node seals under the same one; the others stay
readable until no value is sealed under them (``raftsched secrets status``).

Here, not in node/, because a node's embedded worker (worker/loop.py) unseals its grants with the
node's ring, and worker/ imports nothing of node/. The core never sees a key: a sealed value is
opaque bytes there.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .config import ConfigError

log = logging.getLogger("raftsched.sealing")

#: A key id: the name of its file without ``.key``; short, since every sealed value carries it.
KEY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,16}")
KEY_FILE_SUFFIX = ".key"
KEY_BYTES = 32
#: The format byte of a sealed value.
VERSION = 1
FINGERPRINT_BYTES = 4
NONCE_BYTES = 12
TAG_BYTES = 16
#: The most a sealed value adds to its value's bytes (a key id of 16 characters).
OVERHEAD_BYTES_MAX = 2 + 16 + FINGERPRINT_BYTES + NONCE_BYTES + TAG_BYTES
#: A ring asked for a key it does not hold reads its directory again at most this often.
RELOAD_MIN_S = 1.0

#: Where a spec (and a grant) holds secrets: the path of each map.
SECRET_MAPS: tuple[tuple[str, ...], ...] = (("executor", "headers"), ("executor", "env"), ("secrets",))


class SealError(Exception):
    """A value that cannot be unsealed here; the message says why, never the value."""


class KeyMissing(SealError):
    """A value sealed under a key this node's ring does not hold (``key``): the node's
    configuration (a key file not copied to it), not the value's fault; another node, or this
    one once the file is there, unseals it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def check_key_id(kid: object) -> str:
    """``kid`` if it is a key id (letters, digits, ``_``, ``-``; 1-16). :raises ValueError:"""
    if not isinstance(kid, str) or not KEY_ID_RE.fullmatch(kid):
        raise ValueError("a key id is 1-16 letters, digits, '_' or '-'")
    return kid


# ------------------------------------------------------------------ the format
def parse(sealed: object) -> tuple[str, bytes]:
    """The key id and fingerprint a sealed value names (no key needed). :raises SealError:"""
    if not isinstance(sealed, bytes) or len(sealed) < 2 or sealed[0] != VERSION:
        raise SealError("it is not a sealed value this version reads")
    n = sealed[1]
    end = 2 + n + FINGERPRINT_BYTES
    if not 1 <= n <= 16 or len(sealed) < end + NONCE_BYTES + TAG_BYTES:
        raise SealError("it is a truncated sealed value")
    try:
        kid = sealed[2:2 + n].decode("ascii")
    except UnicodeDecodeError:
        raise SealError("its key id is not text") from None
    if not KEY_ID_RE.fullmatch(kid):
        raise SealError("its key id is malformed")
    return kid, sealed[2 + n:end]


def key_of(value: object) -> str | None:
    """The key id a stored value is sealed under, None for a value in clear (a string, from a
    journal written before sealing); :raises SealError: for anything else."""
    if isinstance(value, str):
        return None
    return parse(value)[0]


def fingerprint_of(value: object) -> bytes | None:
    """The fingerprint a sealed value carries, or None when ``value`` is not one."""
    try:
        return parse(value)[1]
    except SealError:
        return None


def place(job: str, path: tuple[str, ...], name: str) -> bytes:
    """What a sealed value is bound to: its job, its map and its name there."""
    return f"{job}\x00{'.'.join(path)}.{name}".encode("utf-8", "surrogatepass")


class _Key:
    __slots__ = ("aead", "nonce_key")

    def __init__(self, raw: bytes) -> None:
        def derive(info: bytes) -> bytes:
            return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(raw)
        self.aead = AESGCM(derive(b"raftsched sealed secrets v1: encryption"))
        self.nonce_key = derive(b"raftsched sealed secrets v1: synthetic nonce")


# ------------------------------------------------------------------ the ring
def _decode_key(text: str) -> bytes:
    t = text.strip()
    try:
        raw = base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    return raw


def read_key_dir(directory: str) -> dict[str, bytes]:
    """The keys in ``directory`` (``<id>.key`` files; other files are not keys), or {} when it
    does not exist. :raises ConfigError: the directory or a key file is readable by others, a
    key file is not 32 bytes in base64, or its name is not a key id."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"key ring {directory}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"key ring {directory} is not a directory")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"key ring {directory} is open to others (mode {oct(st.st_mode & 0o777)}): chmod 700 it")
    out: dict[str, bytes] = {}
    for entry in sorted(os.listdir(directory)):
        if not entry.endswith(KEY_FILE_SUFFIX):
            continue
        path = os.path.join(directory, entry)
        kid = entry[:-len(KEY_FILE_SUFFIX)]
        if not KEY_ID_RE.fullmatch(kid):
            raise ConfigError(f"key file {path}: its name must be <id>.key, the id 1-16 letters, digits, '_' or '-'")
        try:
            fst = os.stat(path)
            if fst.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(f"key file {path} is readable by others (mode {oct(fst.st_mode & 0o777)}): "
                                  "chmod 600 it")
            with open(path) as f:
                raw = _decode_key(f.read(1024))
        except OSError as e:
            raise ConfigError(f"key file {path}: {e.strerror}") from None
        if len(raw) != KEY_BYTES:
            raise ConfigError(f"key file {path} must hold {KEY_BYTES} random bytes in base64 "
                              "(raftsched secrets new-key writes one)")
        out[kid] = raw
    return out


class KeyRing:
    """The keys a node seals and unseals secrets with, by id.

    :param keys: id -> 32 raw bytes.
    :param directory: where they were read from (None: an in-memory ring); a ring with a
        directory reads it again when asked for a key it does not hold (at most every
        RELOAD_MIN_S), so a key file copied in is picked up without a restart.
    """

    def __init__(self, keys: Mapping[str, bytes] | None = None, directory: str | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._monotonic = monotonic
        self._keys: dict[str, _Key] = {}
        self._set(keys or {})
        self._loaded_at = monotonic()

    def _set(self, keys: Mapping[str, bytes]) -> None:
        for kid, raw in keys.items():
            check_key_id(kid)
            if len(raw) != KEY_BYTES:
                raise ValueError(f"key {kid!r} must be {KEY_BYTES} bytes")
        self._keys = {kid: _Key(raw) for kid, raw in sorted(keys.items())}

    @classmethod
    def load(cls, directory: str) -> "KeyRing":
        """The ring in ``directory`` (empty when it does not exist). :raises ConfigError:"""
        return cls(read_key_dir(directory), directory)

    @classmethod
    def ephemeral(cls) -> "KeyRing":
        """One random key, ``process``, in memory: for an API made without a ring (tests); what
        it seals is unreadable to any other process."""
        return cls({"process": os.urandom(KEY_BYTES)})

    def ids(self) -> list[str]:
        return list(self._keys)

    def reload(self) -> None:
        """Read the directory again: keys added are held, keys removed dropped. A directory
        that cannot be read as a ring leaves the ring as it was (logged)."""
        self._loaded_at = self._monotonic()
        if self.directory is None:
            return
        try:
            keys = read_key_dir(self.directory)
        except ConfigError as e:
            log.error("key ring not reloaded: %s", e)
            return
        if set(keys) != set(self._keys):
            log.info("key ring %s: keys %s", self.directory, ", ".join(sorted(keys)) or "none")
        self._set(keys)

    def holds(self, kid: str) -> bool:
        """Whether the ring holds ``kid``, reading its directory again first if it does not."""
        if kid not in self._keys and self.directory is not None \
                and self._monotonic() - self._loaded_at >= RELOAD_MIN_S:
            self.reload()
        return kid in self._keys

    def seal(self, kid: str, value: str, fp: bytes, where: bytes) -> bytes:
        """``value`` sealed under key ``kid`` at ``where`` (``place``), carrying fingerprint
        ``fp``. :raises KeyError: the ring does not hold ``kid``."""
        key = self._keys[kid]
        k = kid.encode("ascii")
        header = bytes((VERSION, len(k))) + k + fp[:FINGERPRINT_BYTES].ljust(FINGERPRINT_BYTES, b"\0")
        data = value.encode("utf-8", "surrogatepass")
        aad = header + b"\0" + where
        nonce = hmac.new(key.nonce_key, aad + b"\0" + data, hashlib.sha256).digest()[:NONCE_BYTES]
        return header + nonce + key.aead.encrypt(nonce, data, aad)

    def unseal(self, sealed: object, where: bytes) -> str:
        """The value ``sealed`` holds, if it was sealed at ``where``. :raises SealError: saying
        why not (never the value)."""
        kid, _ = parse(sealed)
        assert isinstance(sealed, bytes)  # parse checked it
        if not self.holds(kid):
            raise KeyMissing(f"it is sealed under key {kid!r}, which this node's key ring does not hold", kid)
        start = 2 + len(kid) + FINGERPRINT_BYTES
        nonce = sealed[start:start + NONCE_BYTES]
        try:
            data = self._keys[kid].aead.decrypt(nonce, sealed[start + NONCE_BYTES:], sealed[:start] + b"\0" + where)
        except InvalidTag:
            raise SealError(f"its seal does not verify under key {kid!r} (a damaged value, a value moved from "
                            "another job or field, or a key file of that id holding another key)") from None
        return data.decode("utf-8", "surrogatepass")


#: The ring of an API or a worker made without one (tests): one key in memory, so what it seals
#: is unreadable to any other process. A node always passes the ring of its --keys-dir.
PROCESS_RING = KeyRing.ephemeral()


def new_key_file(directory: str, kid: str | None = None) -> tuple[str, str]:
    """Write a new key, 32 random bytes, to ``directory/<kid>.key`` (mode 0600; the directory
    made 0700 if missing). ``kid`` defaults to 8 random hex digits. Returns (kid, path).
    :raises ConfigError: a bad id, or a key of that id exists."""
    kid = kid if kid is not None else secrets.token_hex(4)
    try:
        check_key_id(kid)
    except ValueError as e:
        raise ConfigError(f"--id {kid!r}: {e}") from None
    old = os.umask(0o077)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, kid + KEY_FILE_SUFFIX)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise ConfigError(f"{path} exists: a key is never overwritten (values sealed under it would be lost)") \
                from None
        with os.fdopen(fd, "w") as f:
            f.write(base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii").rstrip("=") + "\n")
    finally:
        os.umask(old)
    return kid, path


# ------------------------------------------------------------------ specs and grants
def _map(obj: Mapping, path: tuple[str, ...]) -> dict | None:
    v: object = obj
    for k in path:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v if isinstance(v, dict) else None


def _with_map(obj: dict, path: tuple[str, ...], m: dict) -> dict:
    """A copy of ``obj`` with the map at ``path`` replaced by ``m`` (``obj`` is not changed)."""
    out = dict(obj)
    if len(path) == 1:
        out[path[0]] = m
    else:
        out[path[0]] = _with_map(out[path[0]], path[1:], m)
    return out


def values(spec: Mapping) -> list[tuple[tuple[str, ...], str, object]]:
    """Every secret value a spec (or a grant) holds: (map path, name, value)."""
    out = []
    for path in SECRET_MAPS:
        m = _map(spec, path)
        if m:
            out.extend((path, n, v) for n, v in m.items())
    return out


def has_clear(spec: Mapping) -> bool:
    """Whether ``spec`` holds a secret value in clear (a string)."""
    return any(isinstance(v, str) for _, _, v in values(spec))


def seal_spec(spec: dict, job: str, ring: KeyRing, kid: str, fingerprint: Callable[[str], bytes]) -> dict:
    """A copy of ``spec`` with every secret value in clear sealed under ``kid`` (values sealed
    already, restored from the stored spec, are kept as they are). :raises KeyError: the ring
    does not hold ``kid``."""
    out = spec
    for path in SECRET_MAPS:
        m = _map(spec, path)
        if not m or not any(isinstance(v, str) for v in m.values()):
            continue
        sealed = {n: ring.seal(kid, v, fingerprint(v), place(job, path, n)) if isinstance(v, str) else v
                  for n, v in m.items()}
        out = _with_map(out, path, sealed)
    return out


#: A grant's key (unseal_grant) naming the key this node lacks to unseal it (the node reports it).
KEY_MISSING = "secrets_key_missing"


def ring_of(unseal: Callable[[dict], dict]) -> KeyRing:
    """The ring an ``unseal_grant`` partial reads (PROCESS_RING for any other callable)."""
    ring = (getattr(unseal, "keywords", None) or {}).get("ring")
    return ring if isinstance(ring, KeyRing) else PROCESS_RING


def note_keys_missing(grants: list[dict], missing: set[str], where: str) -> None:
    """Note in ``missing`` the keys ``grants`` could not be unsealed for (KEY_MISSING): a node
    whose ring lacks a key its jobs' secrets are sealed under (a key file not copied to it), the
    fleet's and the embedded worker's, one set a node. The runs fail on it as they did, their
    error naming the node and the key (a run given back would come straight back to the same
    node, and a node that refused every lease would stop every job of the cluster for one value
    no ring can open); the node says so (node/fleet.py: the condition node.keys_missing, the
    gauge raftsched_node_keys_missing). Logged once a key."""
    keys = {g[KEY_MISSING] for g in grants if KEY_MISSING in g}
    if keys and not missing.issuperset(keys):
        log.error("%s: its key ring lacks key(s) %s that job secrets are sealed under: their runs fail here until "
                  "the key files are in its ring (docs/operations.md, \"Key files\")", where, ", ".join(sorted(keys)))
    missing.update(keys)


def unseal_grant(grant: dict, ring: KeyRing, where: str = "this node") -> dict:
    """The grant a worker gets: its executor's and its ``secrets``' sealed values in clear (a
    copy; values in clear from an older journal are passed as they are). A value that cannot be
    unsealed gives the grant without its executor or secrets and with ``secrets_error``, the
    reason, which the worker reports as the attempt's error: the run fails, recorded, and
    never runs without its secrets."""
    ex = grant.get("executor")
    if not grant.get("secrets") and (type(ex) is not dict or not (ex.get("headers") or ex.get("env"))):
        return grant  # no secret map (nearly every grant): what values() finds empty, without its lists
    found = values(grant)
    if not found or all(isinstance(v, str) for _, _, v in found):
        return grant
    out = grant
    try:
        for path in SECRET_MAPS:
            m = _map(grant, path)
            if not m:
                continue
            clear = {}
            for n, v in m.items():
                if isinstance(v, str):
                    clear[n] = v
                elif isinstance(v, bytes):
                    clear[n] = ring.unseal(v, place(str(grant.get("job")), path, n))
                else:
                    raise SealError("it is neither a sealed value nor text")
            out = _with_map(out, path, clear)
    except SealError as e:
        field = ".".join(path) + "." + str(n)
        bad = dict(grant, executor=None, secrets_error=f"{where} cannot unseal {field} of job {grant.get('job')!r}: "
                                                       f"{e} (docs/operations.md, \"Key files\")")
        bad.pop("secrets", None)
        if isinstance(e, KeyMissing):
            # The node's configuration, not the value: the node says so (note_keys_missing). The
            # worker fails the run with secrets_error all the same, and ignores this key.
            bad[KEY_MISSING] = e.key
        return bad
    return out
