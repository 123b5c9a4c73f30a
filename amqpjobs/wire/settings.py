"""Where the broker is: the AMQP URL (one node, or the nodes of one cluster), vhost, management API.

Settings are read when asked for (never at import time). Credentials stay inside these
objects: everything printed or logged goes through :func:`redact`.

A cluster is given as a comma-separated list of AMQP URLs, one per node
(``amqp://u:p@node1:5672/v,amqp://u:p@node2:5672/v``). All nodes share one vhost, one user
and one password (one cluster has one user database), and one scheme: a list mixing
``amqps://`` and ``amqp://`` would let a client fall back to plain AMQP, so it is refused.
A comma inside a password must be %-encoded (``%2C``), as every reserved character of a URL's
userinfo (RFC 3986 §3.2.1; RabbitMQ "URI Specification").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from amqpjobs.errors import ConfigurationError

#: Environment variable read when no URL is given.
URL_ENV = "AMQPJOBS_URL"
#: Environment variable for the management API URL, when it can't be derived.
MANAGEMENT_URL_ENV = "AMQPJOBS_MANAGEMENT_URL"
#: The management port is the AMQP port plus this (5672 → 15672, RabbitMQ's defaults).
MANAGEMENT_PORT_OFFSET = 10000
_SCHEMES = ("amqp://", "amqps://", "http://", "https://")
_COMMA_HINT = "items are separated by commas, so a comma inside a password must be %-encoded as %2C"


def _redact_one(url: str) -> str:
    url = url.strip()
    if not url.lower().startswith(_SCHEMES):
        # not a URL of ours: maybe the tail of a password cut at a comma; show nothing of it
        return "<not a URL>" if url else ""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a password cut at a comma: "amqp://u:pa")
    except ValueError:
        return f"{url.split('://', 1)[0]}://<unparseable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{hostport}", parts.path, parts.query, parts.fragment))


def redact(url: str) -> str:
    """Return ``url`` with every password replaced by ``***`` (safe to print or log).

    ``url`` may be a comma-separated list of URLs (a cluster): each is redacted. A piece that is
    not a URL (say, the tail of a password holding an unencoded comma) is shown as ``<not a URL>``.
    """
    if "," not in url:
        one = _redact_one(url)
        return "<unparseable URL>" if one.endswith("<unparseable URL>") else one
    return ",".join(_redact_one(piece) for piece in url.split(","))


def split_urls(url: str) -> list[str]:
    """The URLs of a comma-separated list (blanks around items ignored, empty items dropped)."""
    return [piece.strip() for piece in url.split(",") if piece.strip()]


@dataclass(frozen=True)
class BrokerSettings:
    """How to reach one vhost of a broker (one node, or several nodes of one cluster).

    Attributes:
        url: The AMQP URL as given (``amqp://user:password@host:port/vhost``), with credentials;
            a comma-separated list for a cluster. Never printed: use :attr:`safe_url`.
        management_url: Management API base URL (``http://host:15672``), without credentials:
            the first node's (see :attr:`management_urls`).
        username: User for the management API (from the AMQP URL).
        password: Password for the management API (from the AMQP URL). Never printed.
        vhost: Virtual host from the URL path (``/`` when the path is empty).
        nodes: One AMQP URL per node, in the order given (a connection shuffles them).
        management_urls: The management API of each node (derived: same host, AMQP port +
            10000), or the one management URL given.

    """

    url: str
    management_url: str
    username: str
    password: str
    vhost: str
    nodes: tuple[str, ...] = ()
    management_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes:
            object.__setattr__(self, "nodes", tuple(split_urls(self.url)))
        if not self.management_urls:
            object.__setattr__(self, "management_urls", (self.management_url,))

    @property
    def safe_url(self) -> str:
        """The AMQP URL (every node's) with its passwords redacted."""
        return redact(self.url)

    @property
    def tls(self) -> bool:
        """Whether the nodes are reached over TLS (``amqps://``)."""
        return self.nodes[0].lower().startswith("amqps://")

    def with_vhost(self, vhost: str) -> BrokerSettings:
        """The same broker (every node), another vhost."""
        nodes = []
        for node in self.nodes:
            parts = urlsplit(node)
            nodes.append(urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, "")))
        return replace(self, url=",".join(nodes), vhost=vhost, nodes=tuple(nodes))


def _parse_node(url: str, position: int, count: int) -> tuple[str, str, str, str, int | None, str]:
    """Scheme, user, password, vhost, port and host of one node URL (``position`` counts from 1)."""
    where = f"broker URL {position} of {count}" if count > 1 else "broker URL"
    if not url.lower().startswith(("amqp://", "amqps://")):
        shown = redact(url) if count == 1 else "<not shown: it may hold part of a password>"
        hint = f"; {_COMMA_HINT}" if count > 1 else ""
        raise ConfigurationError(f"bad {where} {shown}: expected amqp://user:pass@host:port/vhost{hint}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        # in a list, the error's text may quote the tail of a password cut at a comma ("port 'pa'")
        why = f"not a URL ({_COMMA_HINT})" if count > 1 else str(exc)
        raise ConfigurationError(f"bad {where} {redact(url)}: {why}") from None
    if not parts.hostname:
        raise ConfigurationError(f"bad {where} {redact(url)}: expected amqp://user:pass@host:port/vhost")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    user = unquote(parts.username or "guest")
    password = unquote(parts.password or "guest")
    return parts.scheme.lower(), user, password, vhost, port, parts.hostname


def _same_cluster(nodes: list[str], parsed: list[tuple[str, str, str, str, int | None, str]]) -> None:
    """Refuse a list whose nodes differ in scheme, vhost, user or password (naming which)."""
    first = parsed[0]
    for i, (scheme, user, password, vhost, _, _) in enumerate(parsed[1:], start=2):
        node = f"broker URL {i} ({redact(nodes[i - 1])})"
        if scheme != first[0]:
            raise ConfigurationError(
                f"{node} is {scheme}:// but broker URL 1 is {first[0]}://: the nodes of one cluster are all "
                f"reached the same way (mixing them would let a connection fall back to plain AMQP)"
            )
        if vhost != first[3]:
            raise ConfigurationError(
                f"{node} names vhost {vhost!r} but broker URL 1 names {first[3]!r}: the URLs of a list are the "
                f"nodes of one cluster and one vhost; give every URL the same path"
            )
        if user != first[1]:
            raise ConfigurationError(
                f"{node} has user {user!r} but broker URL 1 has {first[1]!r}: one cluster has one user "
                f"database; give every URL the same credentials"
            )
        if password != first[2]:
            raise ConfigurationError(
                f"{node} has another password than broker URL 1: one cluster has one user database; give every "
                f"URL the same credentials ({_COMMA_HINT})"
            )


def _management_base(url: str) -> str:
    mparts = urlsplit(url)
    mhost = mparts.hostname or ""
    if ":" in mhost:
        mhost = f"[{mhost}]"
    netloc = mhost + (f":{mparts.port}" if mparts.port else "")
    return urlunsplit((mparts.scheme, netloc, mparts.path.rstrip("/"), "", ""))


def broker_settings(url: str | None = None, management_url: str | None = None) -> BrokerSettings:
    """Build settings from arguments, falling back to ``AMQPJOBS_URL`` / ``AMQPJOBS_MANAGEMENT_URL``.

    Args:
        url: AMQP URL, or a comma-separated list of the AMQP URLs of a cluster's nodes;
            default ``$AMQPJOBS_URL``.
        management_url: Management API URL; default ``$AMQPJOBS_MANAGEMENT_URL``, else
            derived from each node's URL: same host, port + 10000 (5672 → 15672), ``http``
            (``https`` for ``amqps``). Credentials in it are ignored; the AMQP URL's are used.

    Raises:
        ConfigurationError: no URL given; an item is not an ``amqp://``/``amqps://`` URL; or
            the items of a list differ in scheme, vhost, user or password (the message names
            which item and which of these; it never shows a password).

    """
    url = url or os.environ.get(URL_ENV)
    if not url or not split_urls(url):
        raise ConfigurationError(f"no broker URL: pass --url or set {URL_ENV} (amqp://user:pass@host:5672/vhost)")
    nodes = split_urls(url)
    parsed = [_parse_node(node, i, len(nodes)) for i, node in enumerate(nodes, start=1)]
    _same_cluster(nodes, parsed)
    scheme, user, password, vhost, _, _ = parsed[0]
    management_url = management_url or os.environ.get(MANAGEMENT_URL_ENV)
    if management_url:
        management_urls = [_management_base(management_url)]
    else:
        management_urls = []
        for _, _, _, _, port, host in parsed:
            amqp_port = port or (5671 if scheme == "amqps" else 5672)
            mscheme = "https" if scheme == "amqps" else "http"
            management_urls.append(_management_base(f"{mscheme}://{host}:{amqp_port + MANAGEMENT_PORT_OFFSET}"))
    return BrokerSettings(
        url=",".join(nodes),
        management_url=management_urls[0],
        username=user,
        password=password,
        vhost=vhost,
        nodes=tuple(nodes),
        management_urls=tuple(dict.fromkeys(management_urls)),
    )
