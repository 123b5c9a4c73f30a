"""Where the broker is: the AMQP URL, its vhost, and the management API URL.

Settings are read when asked for (never at import time). Credentials stay inside these
objects: everything printed or logged goes through :func:`redact`.
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


def redact(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (safe to print or log)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{hostport}", parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class BrokerSettings:
    """How to reach one vhost of a broker.

    Attributes:
        url: AMQP URL (``amqp://user:password@host:port/vhost``), with credentials.
        management_url: Management API base URL (``http://host:15672``), without credentials.
        username: User for the management API (from the AMQP URL).
        password: Password for the management API (from the AMQP URL). Never printed.
        vhost: Virtual host from the URL path (``/`` when the path is empty).
        connect_timeout: Seconds to keep retrying a refused first connect (README
            "Workers": 30 s for a broker still starting; the CLI's one-shot commands 5 s).
        management_derived: True when ``management_url`` was derived from the AMQP URL
            (not given), so an error about it can say so and how to set it.

    """

    url: str
    management_url: str
    username: str
    password: str
    vhost: str
    connect_timeout: float = 30.0
    management_derived: bool = False

    @property
    def safe_url(self) -> str:
        """The AMQP URL with its password redacted."""
        return redact(self.url)

    def with_vhost(self, vhost: str) -> BrokerSettings:
        """The same broker, another vhost."""
        parts = urlsplit(self.url)
        url = urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, ""))
        return replace(self, url=url, vhost=vhost)

    def with_connect_timeout(self, seconds: float) -> BrokerSettings:
        """The same broker, retrying a refused first connect for ``seconds``."""
        return replace(self, connect_timeout=seconds)

    @property
    def management_hint(self) -> str:
        """Where the management URL came from and how to set it (for error messages)."""
        if not self.management_derived:
            return ""
        return (
            f" (derived from the AMQP URL: its host, port + {MANAGEMENT_PORT_OFFSET}; give the right one with "
            f"--management-url or ${MANAGEMENT_URL_ENV})"
        )


def broker_settings(url: str | None = None, management_url: str | None = None) -> BrokerSettings:
    """Build settings from arguments, falling back to ``AMQPJOBS_URL`` / ``AMQPJOBS_MANAGEMENT_URL``.

    Args:
        url: AMQP URL; default ``$AMQPJOBS_URL``.
        management_url: Management API URL; default ``$AMQPJOBS_MANAGEMENT_URL``, else
            derived from ``url``: same host, port + 10000 (5672 → 15672), ``http``
            (``https`` for ``amqps``). Credentials in it are ignored; the AMQP URL's are used.

    Raises:
        ConfigurationError: no URL given, or the URL is not an ``amqp://``/``amqps://`` URL.

    """
    url = url or os.environ.get(URL_ENV)
    if not url:
        raise ConfigurationError(f"no broker URL: pass --url or set {URL_ENV} (amqp://user:pass@host:5672/vhost)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"bad broker URL {redact(url)}: {exc}") from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ConfigurationError(f"bad broker URL {redact(url)}: expected amqp://user:pass@host:port/vhost")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    management_url = management_url or os.environ.get(MANAGEMENT_URL_ENV)
    derived = not management_url
    if not management_url:
        amqp_port = port or (5671 if parts.scheme == "amqps" else 5672)
        scheme = "https" if parts.scheme == "amqps" else "http"
        management_url = f"{scheme}://{parts.hostname}:{amqp_port + MANAGEMENT_PORT_OFFSET}"
    mparts = urlsplit(management_url)
    mhost = mparts.hostname or ""
    management_url = urlunsplit(
        (mparts.scheme, mhost + (f":{mparts.port}" if mparts.port else ""), mparts.path.rstrip("/"), "", "")
    )
    return BrokerSettings(
        url=url,
        management_url=management_url,
        username=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=vhost,
        management_derived=derived,
    )
