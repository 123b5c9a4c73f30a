"""Broker URL lists: redaction, splitting, and parsing the nodes of one cluster.

A cluster is given as a comma-separated list of AMQP URLs, one per node
(``amqp://u:p@node1:5672/v,amqp://u:p@node2:5672/v``). All nodes share one vhost, one user
and one password (one cluster has one user database), and one scheme: a list mixing
``amqps://`` and ``amqp://`` would let a client fall back to plain AMQP, so it is refused.
A comma inside a password must be %-encoded (``%2C``), as every reserved character of a URL's
userinfo (RFC 3986 §3.2.1; RabbitMQ "URI Specification").

Everything printed or logged about a URL goes through :func:`redact`.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from amqpjobs.errors import ConfigurationError

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
    user = userinfo.split(":", 1)[0]
    if ":" not in userinfo:
        return url
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


class NodeURL(NamedTuple):
    """One node's AMQP URL, parsed (credentials unquoted; never printed)."""

    scheme: str
    user: str
    password: str
    vhost: str
    port: int | None
    host: str


def parse_node(url: str, position: int, count: int) -> NodeURL:
    """Parse one node URL of a list of ``count`` (``position`` counts from 1).

    Raises:
        ConfigurationError: not an ``amqp://``/``amqps://`` URL, or no host; the message names
            the item and never shows a password (nor a piece of a list that may hold one).

    """
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
    return NodeURL(parts.scheme.lower(), user, password, vhost, port, parts.hostname)


def same_cluster(nodes: list[str], parsed: list[NodeURL]) -> None:
    """Refuse a list whose nodes differ in scheme, vhost, user or password (naming which).

    Raises:
        ConfigurationError: naming the item and what differs (never a password).

    """
    first = parsed[0]
    for i, one in enumerate(parsed[1:], start=2):
        node = f"broker URL {i} ({redact(nodes[i - 1])})"
        if one.scheme != first.scheme:
            raise ConfigurationError(
                f"{node} is {one.scheme}:// but broker URL 1 is {first.scheme}://: the nodes of one cluster are "
                f"all reached the same way (mixing them would let a connection fall back to plain AMQP)"
            )
        if one.vhost != first.vhost:
            raise ConfigurationError(
                f"{node} names vhost {one.vhost!r} but broker URL 1 names {first.vhost!r}: the URLs of a list are "
                f"the nodes of one cluster and one vhost; give every URL the same path"
            )
        if one.user != first.user:
            raise ConfigurationError(
                f"{node} has user {one.user!r} but broker URL 1 has {first.user!r}: one cluster has one user "
                f"database; give every URL the same credentials"
            )
        if one.password != first.password:
            raise ConfigurationError(
                f"{node} has another password than broker URL 1: one cluster has one user database; give every "
                f"URL the same credentials ({_COMMA_HINT})"
            )


def with_path(url: str, vhost: str) -> str:
    """``url`` with its path set to ``vhost`` (quoted) and no fragment; the query is kept."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, ""))


def management_base(url: str) -> str:
    """``scheme://host:port/path`` of a management URL: credentials, query and trailing ``/`` dropped."""
    mparts = urlsplit(url)
    mhost = mparts.hostname or ""
    if ":" in mhost:
        mhost = f"[{mhost}]"
    netloc = mhost + (f":{mparts.port}" if mparts.port else "")
    return urlunsplit((mparts.scheme, netloc, mparts.path.rstrip("/"), "", ""))
