"""The request bodies of notifications (docs/notifications.md): a job's ``notify`` routes, its
``pause_on_failure`` and ``metrics``, a tenant's default routes, and a sink's spec.

Validated by the proposer (InvalidSpec naming the field); apply checks only the shapes it reads
(``check_routes``, ``check_sink_spec``: InvalidCommand), so a hand-made command never crashes a
replica. Imports nothing of the core's handlers (model.py imports it).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

from . import limits
from .errors import InvalidCommand, InvalidSpec
from .records import LAYOUT_CHARS, LAYOUT_CHARS_SAID

#: Kinds about one job, which a job's or a tenant's routes list.
JOB_KINDS = (
    "run.dead", "run.failed", "run.succeeded", "job.recovered", "slot.missed", "deadline.missed",
    "deadline.late", "run.unplaceable", "job.paused", "job.resumed", "job.triggered", "run.requeued", "run.cancelled",
)
#: Kinds about the cluster, which a sink subscribes to (``subscribe``), admin only.
CLUSTER_KINDS = ("worker.lost", "cluster.leader_changed", "cluster.no_leader")
#: What a route is sent when it says no ``on``.
DEFAULT_ON = ("run.dead", "slot.missed", "deadline.missed", "job.recovered")
SINK_TYPES = ("webhook", "slack", "email", "pagerduty")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
#: A sink's ``retry`` fields (``outage_s``: a sink stored before 2026-12-06 (a later sitting) has
#: none, and is delivered with limits.sink_outage_s_default).
SINK_RETRY_FIELDS = frozenset({"max_attempts", "backoff_s", "backoff_max_s", "outage_s"})
ROUTE_FIELDS = frozenset({"sink", "on", "after_consecutive", "repeat_every_s", "backfills"})
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EMAIL_RE = re.compile(r"[^@\s<>,;\"]+@[^@\s<>,;\"]+")
#: A sink's secret fields, by type: required ones first (stored sealed, read redacted).
SINK_SECRETS = {
    "webhook": (("signing_key",), ()),
    "slack": (("url",), ()),
    "email": ((), ("username", "password")),
    "pagerduty": (("routing_key",), ()),
}


def _name(v: object, field: str, n: int = limits.job_name_chars_max) -> str:
    if not isinstance(v, str) or not v or len(v) > n or not _NAME_RE.fullmatch(v):
        raise InvalidSpec(f"must be a name of 1-{n} letters, digits, '.', '_' or '-'", field=field)
    return v


def _int(v: object, field: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidSpec(f"must be an integer from {lo} to {hi}", field=field)
    return v


def _kinds(v: object, field: str, allowed: tuple[str, ...]) -> list[str]:
    if not isinstance(v, list) or not v:
        raise InvalidSpec(f"must be a non-empty list of event kinds ({', '.join(allowed)})", field=field)
    for i, k in enumerate(v):
        if k not in allowed:
            raise InvalidSpec(f"must be one of {', '.join(allowed)}", field=f"{field}[{i}]")
    return sorted(set(v))


def validate_routes(raw: object, field: str = "notify") -> list[dict[str, Any]]:
    """``[{"sink", "on"?, "after_consecutive"?, "repeat_every_s"?, "backfills"?}, ...]`` -> routes
    with every default written (``on``: DEFAULT_ON; ``after_consecutive`` 1; ``repeat_every_s``
    0: never repeated within an incident; ``backfills`` false). :raises InvalidSpec:"""
    if not isinstance(raw, list) or len(raw) > limits.notify_routes_max:
        raise InvalidSpec(f"must be a list of at most {limits.notify_routes_max} routes, e.g. "
                          "[{\"sink\": \"ops\", \"on\": [\"run.dead\"]}]", field=field)
    out = []
    for i, r in enumerate(raw):
        f = f"{field}[{i}]"
        if not isinstance(r, dict):
            raise InvalidSpec("must be an object: {\"sink\": name, \"on\": [kinds]}", field=f)
        for k in r:
            if k not in ROUTE_FIELDS:
                raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(ROUTE_FIELDS))}", field=f"{f}.{k}")
        if "sink" not in r:
            raise InvalidSpec("is required: the sink's name", field=f"{f}.sink")
        route = {
            "sink": _name(r["sink"], f"{f}.sink", limits.queue_name_chars_max),  # (a sink's name, as PUT takes it)
            "on": _kinds(r["on"], f"{f}.on", JOB_KINDS) if "on" in r else list(DEFAULT_ON),
            "after_consecutive": (_int(r["after_consecutive"], f"{f}.after_consecutive", 1, limits.consecutive_max)
                                  if "after_consecutive" in r else 1),
            "repeat_every_s": (_int(r["repeat_every_s"], f"{f}.repeat_every_s", 0, limits.repeat_every_s_max)
                               if "repeat_every_s" in r else 0),
        }
        if "backfills" in r:
            if not isinstance(r["backfills"], bool):
                raise InvalidSpec("must be true or false", field=f"{f}.backfills")
            if r["backfills"]:
                route["backfills"] = True
        out.append(route)
    seen: set[object] = set()
    for i, r in enumerate(out):
        if r["sink"] in seen:  # the second route naming it
            raise InvalidSpec(f"names sink {r['sink']!r} a second time (one route a sink)", field=f"{field}[{i}].sink")
        seen.add(r["sink"])
    return out


def validate_pause_on_failure(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict) or set(raw) != {"after_consecutive"}:
        raise InvalidSpec("must be {\"after_consecutive\": N}", field="pause_on_failure")
    return {"after_consecutive": _int(raw["after_consecutive"], "pause_on_failure.after_consecutive", 1,
                                      limits.consecutive_max)}


def add_job_fields(raw: dict[str, Any], spec: dict[str, Any]) -> None:
    """A job spec's notification fields (``notify``, ``pause_on_failure``, ``metrics``) into the
    validated ``spec``; absent or empty ones are not stored (the same spec as before), but an
    empty ``notify``: a job's own routes, none, where without it its tenant's default routes
    tell its events (events.route). Before, an empty list was dropped, and the tenant's routes
    went on telling a job that had asked for none."""
    if "notify" in raw:
        spec["notify"] = validate_routes(raw["notify"])
    if "pause_on_failure" in raw and raw["pause_on_failure"] is not None:
        spec["pause_on_failure"] = validate_pause_on_failure(raw["pause_on_failure"])
    if "metrics" in raw:
        if not isinstance(raw["metrics"], bool):
            raise InvalidSpec("must be true or false", field="metrics")
        if raw["metrics"]:
            spec["metrics"] = True


#: What no sink URL holds: whitespace, control characters, and a backslash (which yarl, and so
#: delivery's aiohttp, refuses in the authority).
_URL_REFUSED_RE = re.compile(r"[\s\x00-\x1f\x7f\\]")
#: A host of digits and dots only, which must then be an IPv4 address in its canonical form (delivery
#: refuses "127.1" and "1.2.3.4.5" as not canonical).
_NUMERIC_HOST_RE = re.compile(r"[0-9.]+")
#: A label of a host name, IDNA-encoded: letters, digits, '-' and '_' (which resolvers take), 1-63
#: of them, not starting or ending with '-' (RFC 1123: "-h" is no name, and reads as an option).
_LABEL_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
#: What a host name may be, said by the messages refusing one.
_HOST_NAME_RULE = "labels of 1-63 letters, digits, '-' or '_', not starting or ending with '-'"


def _is_host_name(host: str) -> bool:
    """Whether ``host`` is a host name delivery can resolve (a trailing dot allowed)."""
    try:
        name = host.encode("idna").decode("ascii")  # (what delivery resolves; every label 1-63)
    except UnicodeError:
        return False
    labels = (name[:-1] if name.endswith(".") else name).split(".")
    return 0 < len(name) <= 253 and all(_LABEL_RE.fullmatch(label) for label in labels)


def _url(v: object, field: str, secret: bool = False) -> str:
    """An http(s) URL that delivery (aiohttp, yarl) will take as it is: one yarl parses, with a
    host, a port from 1 to 65535 in ASCII digits, an IPv4 host in its canonical form, each label
    of a name 1-63 characters. (Else delivery's error would be the URL's own: aiohttp's
    InvalidUrlClientError names it.) Messages never show the value: ``secrets.url`` is a secret.
    Only a ``secret`` URL (stored sealed, read redacted) may carry a user or password."""
    if not isinstance(v, str):
        raise InvalidSpec("must be an http or https URL (a string)", field=field)
    if len(v) > 2048:
        raise InvalidSpec("must be an http or https URL of at most 2048 characters", field=field)
    if _URL_REFUSED_RE.search(v):
        raise InvalidSpec("must be an http or https URL without spaces, control characters or backslashes",
                          field=field)
    if not LAYOUT_CHARS.isdisjoint(v):
        raise InvalidSpec(f"must be an http or https URL without {LAYOUT_CHARS_SAID}", field=field)
    try:
        u = urlsplit(v)
        host, port = u.hostname, u.port  # (port: ValueError out of 0-65535, or not a number)
    except ValueError:
        raise InvalidSpec("must be an http or https URL with a valid host and a port from 1 to 65535",
                          field=field) from None
    if u.scheme not in ("http", "https") or not host:
        raise InvalidSpec("must be an http or https URL", field=field)
    if "@" in u.netloc and not secret:
        # Every reader of the sink (GET, the dashboard, a limited token of its tenant) sees this
        # field as it is: a user or password in it would be shown to all of them.
        raise InvalidSpec("must not carry a user or password (user:password@host): this field is "
                          "shown to every reader of the sink", field=field)
    try:
        parsed = URL(v)  # (as delivery's aiohttp parses it)
    except Exception:  # ValueError; and yarl 1.25 raises IndexError for some, e.g. "https://[::1]@"
        parsed = None
    if parsed is None or not parsed.raw_host or parsed.port is None:
        raise InvalidSpec("must be an http or https URL with a valid host and a port from 1 to 65535",
                          field=field)
    netloc_port = u.netloc.rpartition("]")[2].rpartition("@")[2].partition(":")[2]
    if port == 0 or (netloc_port and not (netloc_port.isascii() and netloc_port.isdigit())):
        raise InvalidSpec("must be an http or https URL with a port from 1 to 65535", field=field)
    if ":" not in host:  # (a name or an IPv4 address: an IPv6 one urlsplit checked)
        if _NUMERIC_HOST_RE.fullmatch(host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise InvalidSpec("must be an http or https URL whose IPv4 host is four numbers (a.b.c.d)",
                                  field=field) from None
        if not _is_host_name(host):
            raise InvalidSpec(f"must be an http or https URL with a valid host name ({_HOST_NAME_RULE})",
                              field=field)
    return v


def _smtp_host(v: object) -> str:
    """An SMTP server's host: a host name or an IP address (IPv6 without brackets), nothing more:
    its port is ``smtp.port``. :raises InvalidSpec: naming ``smtp.host``."""
    field = "smtp.host"
    if not isinstance(v, str) or not v:
        raise InvalidSpec("is required: the SMTP server's host name or IP address", field=field)
    if len(v) > 253:
        raise InvalidSpec("must be a host name of at most 253 characters or an IP address", field=field)
    if "%" in v:
        raise InvalidSpec("must be a host name or an IP address, without an IPv6 zone (%...)", field=field)
    try:
        ipaddress.ip_address(v)
        return v
    except ValueError:
        pass
    if ":" in v or "[" in v:
        raise InvalidSpec("must be a host name or an IP address, without a port or brackets: the port is "
                          "smtp.port (587 by default)", field=field)
    if _NUMERIC_HOST_RE.fullmatch(v):
        raise InvalidSpec("must be a host name or an IP address; an IPv4 address is four numbers (a.b.c.d)",
                          field=field)
    if not _is_host_name(v):
        raise InvalidSpec(f"must be a host name ({_HOST_NAME_RULE}) or an IP address", field=field)
    return v


_SINK_FIELDS = frozenset({"type", "url", "tenant", "subscribe", "retry", "secrets", "smtp", "link"})
_SMTP_FIELDS = frozenset({"host", "port", "starttls", "from", "to"})


def validate_sink(name: object, raw: object) -> dict[str, Any]:
    """A sink's spec (PUT /v1/sinks/{name}) -> its normalised form. :raises InvalidSpec:"""
    _name(name, "name", limits.queue_name_chars_max)
    if not isinstance(raw, dict):
        raise InvalidSpec("the sink must be a JSON object", field=None)
    for k in raw:
        if k not in _SINK_FIELDS:
            raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(_SINK_FIELDS))}", field=str(k))
    typ = raw.get("type")
    if typ not in SINK_TYPES:
        raise InvalidSpec(f"{'is required' if typ is None else 'is no sink type'}: one of {', '.join(SINK_TYPES)}",
                          field="type")
    spec: dict[str, Any] = {"type": typ}
    if typ in ("webhook", "pagerduty"):
        if "url" in raw:
            spec["url"] = _url(raw["url"], "url")
        elif typ == "webhook":
            raise InvalidSpec("is required: where events are POSTed", field="url")
        else:
            spec["url"] = PAGERDUTY_URL
    elif "url" in raw:
        raise InvalidSpec(f"a {typ} sink takes no url" + (" (its webhook URL is secrets.url)" if typ == "slack" else ""),
                          field="url")
    if typ == "email":
        smtp = raw.get("smtp")
        if not isinstance(smtp, dict):
            raise InvalidSpec("is required: {\"host\", \"port\", \"from\", \"to\": [addresses], \"starttls\"}",
                              field="smtp")
        for k in smtp:
            if k not in _SMTP_FIELDS:
                raise InvalidSpec(f"unknown field; allowed: {', '.join(sorted(_SMTP_FIELDS))}", field=f"smtp.{k}")
        host = _smtp_host(smtp.get("host"))
        to = smtp.get("to")
        if not isinstance(to, list) or not to or len(to) > limits.sink_email_to_max:
            raise InvalidSpec(f"must be a list of 1-{limits.sink_email_to_max} addresses", field="smtp.to")
        for i, a in enumerate(to):
            if not isinstance(a, str) or len(a) > 254 or not _EMAIL_RE.fullmatch(a):
                raise InvalidSpec("is not an email address", field=f"smtp.to[{i}]")
        frm = smtp.get("from")
        if frm is None:
            raise InvalidSpec("is required: the sender's address", field="smtp.from")
        if not isinstance(frm, str) or len(frm) > 254 or not _EMAIL_RE.fullmatch(frm):
            raise InvalidSpec("is not an email address (the sender's: user@host, at most 254 characters)",
                              field="smtp.from")
        starttls = smtp.get("starttls", True)
        if not isinstance(starttls, bool):
            raise InvalidSpec("must be true or false", field="smtp.starttls")
        spec["smtp"] = {"host": host, "port": _int(smtp.get("port", 587), "smtp.port", 1, 65535),
                        "starttls": starttls, "from": frm, "to": list(to)}
    elif "smtp" in raw:
        raise InvalidSpec("only an email sink takes smtp", field="smtp")
    if "tenant" in raw:
        spec["tenant"] = _name(raw["tenant"], "tenant", limits.tenant_name_chars_max)
    if "subscribe" in raw:
        if "tenant" in spec:
            raise InvalidSpec("a sink limited to a tenant hears of its jobs only, not of the cluster",
                              field="subscribe")
        spec["subscribe"] = _kinds(raw["subscribe"], "subscribe", CLUSTER_KINDS)
    if "link" in raw:
        spec["link"] = _url(raw["link"], "link")
        if "?" in spec["link"] or "#" in spec["link"]:
            # Messages append /v1/runs/{run} to it: a query or fragment would end up before it.
            raise InvalidSpec("must be a base URL without a query (?) or fragment (#): messages append "
                              "/v1/runs/{run} to it", field="link")
    retry = raw.get("retry", {})
    if not isinstance(retry, dict) or not set(retry) <= SINK_RETRY_FIELDS:
        raise InvalidSpec("must be an object of " + ", ".join(sorted(SINK_RETRY_FIELDS)), field="retry")
    spec["retry"] = {
        "max_attempts": _int(retry.get("max_attempts", limits.sink_attempts_default), "retry.max_attempts", 1,
                             limits.sink_attempts_max),
        "backoff_s": _int(retry.get("backoff_s", 1), "retry.backoff_s", 0, 3600),
        "backoff_max_s": _int(retry.get("backoff_max_s", 300), "retry.backoff_max_s", 0, 86_400),
        "outage_s": _int(retry.get("outage_s", limits.sink_outage_s_default), "retry.outage_s", 0,
                         limits.sink_outage_s_max),
    }
    if spec["retry"]["backoff_max_s"] < spec["retry"]["backoff_s"]:  # (as a job's retry)
        raise InvalidSpec(f"must be at least backoff_s ({spec['retry']['backoff_s']})", field="retry.backoff_max_s")
    secrets = raw.get("secrets", {})
    if not isinstance(secrets, dict):
        raise InvalidSpec("must be an object of string values", field="secrets")
    required, optional = SINK_SECRETS[typ]
    for k, v in secrets.items():
        if k not in required and k not in optional:
            raise InvalidSpec(f"a {typ} sink's secrets are {', '.join(required + optional)}", field=f"secrets.{k}")
        if not isinstance(v, str) or not v or len(v) > 4096:
            raise InvalidSpec("must be a string of 1-4096 characters", field=f"secrets.{k}")
    for k in required:
        if k not in secrets:
            raise InvalidSpec(f"is required for a {typ} sink", field=f"secrets.{k}")
    if typ == "email" and "password" in secrets and "username" not in secrets:
        raise InvalidSpec("is used only with secrets.username (the SMTP login is sent only when a username "
                          "is given): add the username, or remove the password", field="secrets.password")
    if typ == "slack" and not secrets["url"].startswith("***:"):
        _url(secrets["url"], "secrets.url", secret=True)
    if secrets:
        spec["secrets"] = dict(secrets)
    return spec


# ------------------------------------------------------------------ apply's shape checks
def check_routes(v: object, what: str) -> None:
    """Apply's check of stored routes (their shape only). :raises InvalidCommand:"""
    if not isinstance(v, list) or len(v) > limits.notify_routes_max:
        raise InvalidCommand(f"{what} is malformed")
    for r in v:
        if not (isinstance(r, dict) and isinstance(r.get("sink"), str) and isinstance(r.get("on"), list)
                and all(isinstance(k, str) for k in r["on"])
                and _is_int(r.get("after_consecutive")) and _is_int(r.get("repeat_every_s"))):
            raise InvalidCommand(f"{what} is malformed")


def check_job_fields(spec: dict[str, Any]) -> None:
    if "notify" in spec:
        check_routes(spec["notify"], "spec.notify")
    p = spec.get("pause_on_failure")
    if p is not None and not (isinstance(p, dict) and _is_int(p.get("after_consecutive"))
                              and p["after_consecutive"] >= 1):
        raise InvalidCommand("spec.pause_on_failure is malformed")
    if "metrics" in spec and spec["metrics"] is not True:
        raise InvalidCommand("spec.metrics is malformed")


def check_sink_spec(spec: object) -> None:
    """Apply's check of a sink's stored spec: every shape delivery reads (``validate_sink``'s
    form, secret values sealed). :raises InvalidCommand:"""
    if not (isinstance(spec, dict) and spec.get("type") in SINK_TYPES and isinstance(spec.get("retry"), dict)):
        raise InvalidCommand("sink spec is malformed")
    typ = spec["type"]
    retry = spec["retry"]
    if not (_is_int(retry.get("max_attempts")) and 1 <= retry["max_attempts"] <= limits.sink_attempts_max
            and _is_int(retry.get("backoff_s")) and _is_int(retry.get("backoff_max_s"))
            and ("outage_s" not in retry or (_is_int(retry["outage_s"]) and retry["outage_s"] >= 0))):
        raise InvalidCommand("sink spec.retry is malformed")
    if typ in ("webhook", "pagerduty") and not (isinstance(spec.get("url"), str) and spec["url"]):
        raise InvalidCommand("sink spec.url is malformed")
    if typ == "email":
        smtp = spec.get("smtp")
        if not (isinstance(smtp, dict) and isinstance(smtp.get("host"), str) and smtp["host"]
                and _is_int(smtp.get("port")) and 1 <= smtp["port"] <= 65535 and isinstance(smtp.get("starttls"), bool)
                and _is_address(smtp.get("from")) and isinstance(smtp.get("to"), list) and smtp["to"]
                and all(_is_address(a) for a in smtp["to"])):
            raise InvalidCommand("sink spec.smtp is malformed")
    if "link" in spec and not isinstance(spec["link"], str):
        raise InvalidCommand("sink spec.link is malformed")
    if "subscribe" in spec and not (isinstance(spec["subscribe"], list)
                                    and all(isinstance(k, str) for k in spec["subscribe"])):
        raise InvalidCommand("sink spec.subscribe is malformed")
    if "tenant" in spec and not isinstance(spec["tenant"], str):
        raise InvalidCommand("sink spec.tenant is malformed")
    if "secrets" in spec and not (isinstance(spec["secrets"], dict)
                                  and all(isinstance(v, (str, bytes)) for v in spec["secrets"].values())):
        raise InvalidCommand("sink spec.secrets is malformed")
    if not all(k in spec.get("secrets", ()) for k in SINK_SECRETS[typ][0]):
        raise InvalidCommand(f"sink spec.secrets lacks what a {typ} sink needs")


def _is_address(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 254 and _EMAIL_RE.fullmatch(v) is not None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
