"""Where the broker is: the AMQP URL (one node, or the nodes of one cluster), vhost, management API.

Settings are read when asked for (never at import time). Credentials stay inside these
objects: everything printed or logged goes through :func:`~amqpjobs.wire.urls.redact`.
How a list of node URLs is split, checked and redacted lives in :mod:`amqpjobs.wire.urls`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from amqpjobs.errors import ConfigurationError
from amqpjobs.text import url_text_problem
from amqpjobs.wire.urls import (
    MAX_PORT,
    bracketed,
    management_base,
    netloc_problem,
    parse_node,
    port_problem,
    redact,
    same_cluster,
    split_urls,
    with_path,
)

#: Environment variable read when no URL is given.
URL_ENV = "AMQPJOBS_URL"
#: Environment variable for the management API URL, when it can't be derived.
MANAGEMENT_URL_ENV = "AMQPJOBS_MANAGEMENT_URL"
#: Environment variable for the CLI's ``--connect-timeout`` (a duration), when the option is not given.
CONNECT_TIMEOUT_ENV = "AMQPJOBS_CONNECT_TIMEOUT"
#: The management port is the AMQP port plus this (5672 → 15672, RabbitMQ's defaults).
MANAGEMENT_PORT_OFFSET = 10000


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
        connect_timeout: Seconds to keep retrying a refused first connect, over all the nodes
            (README "Workers": 30 s for a broker still starting; the CLI's one-shot commands 5 s).
        management_derived: True when the management URL(s) were derived from the AMQP URL(s)
            (not given), so an error about one can say so and how to set it.
        management_urls: The management API of each node (derived: same host, AMQP port +
            10000), or the one management URL given.
        node_management: When derived, node ``i``'s management API (``management_urls`` in the
            order of ``nodes``, one per node); empty when a management URL is given.

    """

    url: str
    management_url: str
    username: str
    password: str
    vhost: str
    connect_timeout: float = 30.0
    management_derived: bool = False
    management_urls: tuple[str, ...] = ()
    node_management: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # one source of truth: settings copied with another url or management_url (dataclasses.replace)
        # never keep the nodes or management APIs of the old one
        if self.management_url not in self.management_urls:
            object.__setattr__(self, "management_urls", (self.management_url,))
            object.__setattr__(self, "node_management", ())
        if self.node_management and len(self.node_management) != len(self.nodes):
            object.__setattr__(self, "node_management", ())

    @property
    def nodes(self) -> tuple[str, ...]:
        """One AMQP URL per node, in the order given (a connection shuffles them); from :attr:`url`."""
        return tuple(split_urls(self.url))

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
        nodes = tuple(with_path(node, vhost) for node in self.nodes)
        return replace(self, url=",".join(nodes), vhost=vhost)

    def with_connect_timeout(self, seconds: float) -> BrokerSettings:
        """The same broker, retrying a refused first connect for ``seconds`` (over all the nodes)."""
        return replace(self, connect_timeout=seconds)

    @property
    def management_hint(self) -> str:
        """Where the management URL came from and how to set it (for error messages; "" when given)."""
        if not self.management_derived:
            return ""
        source = "each node's AMQP URL" if len(self.nodes) > 1 else "the AMQP URL"
        return (
            f" (derived from {source}: its host, port + {MANAGEMENT_PORT_OFFSET}; give the right one with "
            f"--management-url or ${MANAGEMENT_URL_ENV})"
        )


def broker_settings(url: str | None = None, management_url: str | None = None) -> BrokerSettings:
    """Build settings from arguments, falling back to ``AMQPJOBS_URL`` / ``AMQPJOBS_MANAGEMENT_URL``.

    Args:
        url: AMQP URL, or a comma-separated list of the AMQP URLs of a cluster's nodes;
            default ``$AMQPJOBS_URL``.
        management_url: Management API URL; default ``$AMQPJOBS_MANAGEMENT_URL``, else
            derived from each node's URL: same host, port + 10000 (5672 → 15672), ``http``
            (``https`` for ``amqps``). Credentials in it are ignored; the AMQP URL's are used.

    Raises:
        ConfigurationError: no URL given; an item is empty (a leading, trailing or doubled comma) or
            not an ``amqp://``/``amqps://`` URL; the
            items of a list differ in scheme, vhost, user or password (the message names
            which item and which of these; it never shows a password); the management URL
            is no ``http(s)://host[:port]`` URL; a port is out of 1-65535 (given, or derived:
            AMQP port + 10000 past 65535 asks for the management URL).

    """
    url = url or os.environ.get(URL_ENV)
    if not url or not split_urls(url):
        raise ConfigurationError(f"no broker URL: pass --url or set {URL_ENV} (amqp://user:pass@host:5672/vhost)")
    if any(not piece.strip() for piece in url.split(",")):  # the URLs are not shown: they hold a password
        raise ConfigurationError(
            "the broker URL list (--url, $AMQPJOBS_URL or App(url=...)) has an empty URL (a comma with nothing but "
            "spaces before or after it): separate the nodes' URLs with single commas, e.g. "
            "amqp://node1:5672/jobs,amqp://node2:5672/jobs"
        )
    nodes = split_urls(url)
    parsed = [parse_node(node, i, len(nodes)) for i, node in enumerate(nodes, start=1)]
    same_cluster(nodes, parsed)
    first = parsed[0]
    management_url = management_url or os.environ.get(MANAGEMENT_URL_ENV)
    derived = not management_url
    if management_url:
        management_urls = [management_base(checked_management_url(management_url))]
    else:
        mscheme = "https" if first.scheme == "amqps" else "http"
        default_port = 5671 if first.scheme == "amqps" else 5672
        management_urls = []
        for node, one in zip(nodes, parsed, strict=True):
            port = one.port or default_port
            if port + MANAGEMENT_PORT_OFFSET > MAX_PORT:
                raise ConfigurationError(
                    f"the management port can't be derived from broker URL {redact(node)}: port {port} + "
                    f"{MANAGEMENT_PORT_OFFSET} is out of range (a port must be 1-{MAX_PORT}); give --management-url "
                    f"or {MANAGEMENT_URL_ENV}"
                )
            derived_port = port + MANAGEMENT_PORT_OFFSET
            management_urls.append(management_base(f"{mscheme}://{bracketed(one.host)}:{derived_port}"))
    return BrokerSettings(
        url=",".join(nodes),
        management_url=management_urls[0],
        username=first.user,
        password=first.password,
        vhost=first.vhost,
        management_derived=derived,
        management_urls=tuple(dict.fromkeys(management_urls)),
        node_management=tuple(management_urls) if derived else (),
    )


def checked_management_url(url: str) -> str:
    """``url`` (blanks around it left out) when it is an ``http://`` or ``https://`` URL with a host and a valid port.

    Raises:
        ConfigurationError: it is not, or it holds a blank or a control character
            (:func:`~amqpjobs.text.url_text_problem`); the message names it (password redacted) and
            the form it must have (RabbitMQ "Management Plugin" -> "Usage": port 15672, 15671 with TLS).
    """
    url = url.strip()
    odd = url_text_problem(url)  # a blank in a password also hides it from redact(): then never shown
    shown = "<not shown: it may hold a password>" if odd and "@" in url else repr(redact(url) if "@" in url else url)
    try:
        parts = urlsplit(url)
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        if port_problem(url) is None:
            _ = parts.port  # ValueError when not a number
    except ValueError:
        valid = False
    if valid and (problem := port_problem(url) or netloc_problem(parts.netloc, parts.hostname or "") or odd):
        raise ConfigurationError(f"management URL {shown}: {problem} (--management-url or {MANAGEMENT_URL_ENV})")
    if not valid:
        raise ConfigurationError(
            f"management URL {shown} is not an http(s) URL: give http://host:15672 or https://host:15671 "
            f"(--management-url or {MANAGEMENT_URL_ENV})"
        )
    return url
