"""A local certificate authority and certificates for a demo or a test cluster, made with
``cryptography`` (no openssl): ``python -m raftsched.testing.tls DIR`` (scripts/cluster.sh runs
it when ``RAFTSCHED_TLS`` is set).

It writes, in DIR (keys mode 600):

- ``ca.pem`` / ``ca-key.pem``: the CA, whose certificate clients trust (``--ca-file``) and nodes
  check client certificates against (``--tls-client-ca``);
- ``node.pem`` / ``node-key.pem``: a server certificate for the hosts given (default
  ``127.0.0.1`` and ``localhost``), for every node of the cluster (``--tls-cert``, ``--tls-key``);
- ``client.pem`` / ``client-key.pem``: a client certificate, for mutual TLS.

For a demo on one machine. In production, use your own CA; docs/security.md says what each
file is for.
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates are valid, from an hour before they are made (clock skew).
VALID_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    """The paths of what :func:`make_demo_pki` wrote."""

    dir: Path
    ca: Path
    ca_key: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path, key) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that was there keeps its mode otherwise: a node refuses a key others may read
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, sans=(), usage=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False,
                                          encipher_only=False, decipher_only=False), critical=True)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        names = []
        for h in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


def make_demo_pki(out: Path | str, hosts=("127.0.0.1", "localhost")) -> TlsFiles:
    """Write a CA, a server certificate for ``hosts`` and a client certificate into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("raftsched demo CA", ca_key, None, None, ca=True)
    files = TlsFiles(out, out / "ca.pem", out / "ca-key.pem", out / "node.pem", out / "node-key.pem",
                     out / "client.pem", out / "client-key.pem")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(files.ca_key, ca_key)
    for cert_path, key_path, name, usage, sans in (
            (files.cert, files.key, "raftsched node", ExtendedKeyUsageOID.SERVER_AUTH, hosts),
            (files.client_cert, files.client_key, "raftsched client", ExtendedKeyUsageOID.CLIENT_AUTH, ())):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, ca.subject, ca_key, ca=False, sans=sans, usage=usage)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raftsched.testing.tls",
                                 description="write a demo CA, a node certificate and a client certificate")
    ap.add_argument("dir")
    ap.add_argument("--hosts", default="127.0.0.1,localhost", help="names and addresses the node certificate is for")
    args = ap.parse_args(argv)
    files = make_demo_pki(args.dir, [h.strip() for h in args.hosts.split(",") if h.strip()])
    print(f"wrote {files.ca}, {files.cert}, {files.client_cert} and their keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
