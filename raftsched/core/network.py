"""Where an http run may connect: a tenant's network policy (docs/security.md, "Tenant policy").

A policy is ``{"allow": [network, ...]}``: the run may connect to any public (globally routed)
address, and to the networks ``allow`` lists; any other address (loopback, link-local and the
cloud metadata service in it, private networks, shared address space, multicast, unspecified,
reserved) is refused. The proposer validates an admin's list (``check_allow``: InvalidSpec
naming the field); the worker checks every address a run's host resolves to before it connects
(worker/executors/http.py: ``refusal``), and connects only to the addresses it checked.

Pure: the standard library's ``ipaddress`` only, no resolution here.
"""
from __future__ import annotations

import ipaddress
from typing import TypeAlias

from . import limits
from .errors import InvalidSpec

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The cloud metadata services (AWS, GCP, Azure, ...: 169.254.169.254; AWS over IPv6:
#: fd00:ec2::254). Both are in networks refused anyway; named so a refusal says what it was.
METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
#: The IPv6 prefix that carries an IPv4 address in its last 32 bits and reaches it (NAT64's
#: well-known prefix, RFC 6052): 64:ff9b::a9fe:a9fe is the metadata service behind a NAT64 gateway.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: IPv6 networks refused as private whatever this Python's ``is_global`` says (its tables vary by
#: version): NAT64's local-use prefix (RFC 8215: which IPv4 address an address reaches depends on
#: the operator's layout, so none can be checked) and the deprecated site-local fec0::/10.
_PRIVATE_V6 = (ipaddress.ip_network("64:ff9b:1::/48"), ipaddress.ip_network("fec0::/10"))


def check_allow(raw: object, field: str) -> list[str]:
    """A policy's ``allow``: a list of at most tenant_network_allow_max networks (CIDR, or one
    address), returned normalised (``10.1.2.0/24``), distinct and sorted, so equal policies
    store equal bytes. :raises InvalidSpec: naming the field and the item."""
    n = limits.tenant_network_allow_max
    if not isinstance(raw, list) or len(raw) > n:
        raise InvalidSpec(f"must be a list of at most {n} networks, e.g. [\"10.1.2.0/24\"]", field=field)
    out: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, str) or len(item) > 64:
            raise InvalidSpec("must be a network such as 10.1.2.0/24 or fd00::/8, or one address",
                              field=f"{field}[{i}]")
        try:
            net = ipaddress.ip_network(item, strict=True)
        except ValueError as e:
            raise InvalidSpec(f"is not a network: {e}", field=f"{field}[{i}]") from None
        out.add(str(net))
    return sorted(out, key=_sort_key)


def _sort_key(text: str) -> tuple[int, str]:
    return (4 if ":" not in text else 6, text)


def _embedded_v4(addr: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (v4-mapped ``::ffff:a.b.c.d``, NAT64's well-known
    prefix, or 6to4 ``2002:aabb:ccdd::``, which a relay routes to a.b.c.d), else None."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr in _NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        if addr.sixtofour is not None:
            return addr.sixtofour
    return None


def kind(addr: Address) -> str | None:
    """Why ``addr`` is not a public address (``"loopback"``, ``"cloud metadata"``,
    ``"link-local"``, ``"private"``, ...), or None when it is one."""
    v4 = _embedded_v4(addr)
    if v4 is not None:
        return kind(v4)
    if addr in METADATA:
        return "cloud metadata"
    if any(addr in net for net in _PRIVATE_V6 if addr.version == net.version):
        return "private"
    for what, test in (("loopback", addr.is_loopback), ("unspecified", addr.is_unspecified),
                       ("link-local", addr.is_link_local), ("multicast", addr.is_multicast),
                       ("reserved", addr.is_reserved)):
        if test:
            return what
    if not addr.is_global:
        return "private"
    return None


def refused_as(address: str, allow: list[str]) -> str | None:
    """None when a run may connect to ``address`` under a policy allowing ``allow``, else what
    it is (``"loopback"``, ``"not an IP address"``...)."""
    try:
        addr = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is not part of it
    except ValueError:
        return "not an IP address"
    v4 = _embedded_v4(addr)
    for text in allow:
        net = ipaddress.ip_network(text)
        if addr in net or (v4 is not None and v4 in net):
            return None
    return kind(addr)


def refusal(address: str, allow: list[str]) -> str | None:
    """None when a run may connect to ``address`` under a policy allowing ``allow``, else why
    not (``"127.0.0.1 is loopback"``). An address that does not parse is refused."""
    why = refused_as(address, allow)
    return None if why is None else f"{address} is {why}"
