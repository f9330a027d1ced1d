"""The TLS context of both clients (and of ``raftsched worker``, through the AsyncClient)."""
from __future__ import annotations

import ssl


def client_tls_context(ca_file: str | None = None, cert_file: str | None = None,
                       key_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and host name: against
    ``ca_file`` when given, else the system's CAs; with a client certificate when ``cert_file``
    is given (mutual TLS). :raises OSError, ssl.SSLError: a file that cannot be used."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def probe_context() -> ssl.SSLContext:
    """A context that verifies nothing, for one question only: does this port complete a TLS
    handshake (a node that dropped a plain HTTP request serves HTTPS)? Nothing is sent over it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
