"""Broker URL lists: redaction, splitting, and parsing the nodes of one cluster.

A cluster is given as a comma-separated list of AMQP URLs, one per node
(``amqp://u:p@node1:5672/v,amqp://u:p@node2:5672/v``). All nodes share one vhost, one user and one password (one
cluster has one user database), and one scheme: a list mixing ``amqps://`` and ``amqp://`` would let a client fall
back to plain AMQP, so it is refused. A comma inside a password must be %-encoded (``%2C``), as every reserved
character of a URL's userinfo (RFC 3986 §3.2.1; RabbitMQ "URI Specification").

Everything printed or logged about a URL goes through :func:`redact`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from amqpjobs.errors import ConfigurationError
from amqpjobs.printable import invisible_at
from amqpjobs.redaction import redact_text as redact_text  # re-exported: the one rule lives there
from amqpjobs.text import ascii_digits, url_text_problem
from amqpjobs.topology.naming import vhost_problem
from amqpjobs.wire.tls import TLS_OPTIONS

#: Query options an AMQP URL may have: RabbitMQ's TLS options (``wire/tls.py``) and those aio-pika /
#: aiormq read (``heartbeat`` seconds, ``timeout`` connect seconds, connection ``name``, ``auth``
#: mechanism, ``reconnect_interval`` seconds, ``fail_fast``).
URL_OPTIONS = (*TLS_OPTIONS, "heartbeat", "timeout", "name", "auth", "reconnect_interval", "fail_fast")

#: How to fix a refused login: the one wording, over AMQP ("refused the credentials") and the management API (401).
CREDENTIALS_FIX = "check the user and password in the URL"
#: The largest TCP port.
MAX_PORT = 65535
_SCHEMES = ("amqp://", "amqps://", "http://", "https://")
_COMMA_HINT = "items are separated by commas, so a comma inside a password must be %-encoded as %2C"
#: parse_bool of aiormq takes these as true; anything else it reads as false.
_TRUE = frozenset({"true", "yes", "y", "enable", "on", "enabled", "1"})
_FALSE = frozenset({"false", "no", "n", "disable", "off", "disabled", "0"})


def _whole(text: str, low: int, high: int) -> bool:
    return ascii_digits(text) and low <= int(text) <= high


def _seconds(text: str) -> bool:
    try:
        return 0 <= float(text) < math.inf
    except ValueError:
        return False


#: A value aiormq / aio-pika would misread (its parsers turn what they can't read into 0 or
#: false: ``heartbeat=abc`` is heartbeats off, ``reconnect_interval=x`` reconnects at once):
#: option -> (the test of its value, what it must be).
_VALUES: dict[str, tuple[Callable[[str], bool], str]] = {
    "heartbeat": (lambda v: _whole(v, 0, 65534), "a whole number of seconds 0-65534 (0 turns heartbeats off)"),
    "timeout": (lambda v: _whole(v, 1, 10**6), "a whole number of seconds of at least 1"),
    "auth": (
        lambda v: v.lower() in ("plain", "external"),
        "a mechanism amqpjobs speaks: use auth=plain (the default) or auth=external",
    ),
    "reconnect_interval": (_seconds, "a number of seconds of at least 0"),
    "fail_fast": (lambda v: v.lower() in _TRUE | _FALSE, "true or false (1/0, yes/no, on/off)"),
    # shown by the management UI and written into the broker's log: a line feed there forges a line
    "name": (
        lambda v: 0 < len(v.encode("utf-8", "surrogatepass")) <= 255 and invisible_at(v) is None,
        "a connection name of 1-255 bytes without control or invisible characters",
    ),
}
_BARE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")  # a "%" that starts no %-escape (RFC 3986 2.1)
_ENCODE_HINT = "a password's reserved characters must be %-encoded: # as %23, / as %2F, ? as %3F, , as %2C"
_BRACKET_HINT = "an IPv6 host takes both brackets ([::1]); a '[' or ']' in a password must be %-encoded (%5B, %5D)"
#: A URL of a scheme of no broker's (``ftp://``), blanks-free up to ``://``.
_OTHER_SCHEME = re.compile(r"(?i)[a-z][a-z0-9+.\-]*://")
#: What marks a "URL" that is really several URLs run together (a list separated by blanks or ``;``).
_RUN_TOGETHER = re.compile(r"(?i)[\s;]|[a-z]://")


def _redact_one(url: str, alone: bool = False) -> str:
    url = url.strip()
    if _RUN_TOGETHER.search(url.split("://", 1)[-1]):
        return f"{url.split('://', 1)[0]}://<unparseable URL>" if "://" in url else "<not a URL>"
    if not url.lower().startswith(_SCHEMES):
        if alone and _OTHER_SCHEME.match(url):  # another scheme (ftp://): shown, so its error says what was given
            return redact_text(url)
        # no scheme, or a piece of a list: maybe the tail of a password cut at a comma; show nothing of it
        return "<not a URL>" if url else ""
    try:
        parts = urlsplit(url)
        if "@" not in parts.netloc or port_problem(url) is None:  # a port after the userinfo is never a password
            parts.port  # noqa: B018  (raises on a password cut at a comma: "amqp://u:pa")
    except ValueError:
        return f"{url.split('://', 1)[0]}://<unparseable URL>"
    if "@" not in parts.netloc:
        # an "@" after the netloc: a password holding an unencoded "#", "/" or "?" ended the netloc early
        return f"{parts.scheme}://<unparseable URL>" if "@" in url else url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    if ":" not in userinfo:
        return url
    return urlunsplit((parts.scheme, f"{user}:***@{hostport}", parts.path, parts.query, parts.fragment))


def port_problem(url: str) -> str | None:
    """What is wrong with the port of ``url`` (one URL): a number out of 1-65535; None otherwise.

    The one port rule of every URL option (AMQP and management). Only a port that is surely a
    port is named: one after the userinfo's ``@``, or in a URL without any ``@``. Anything else (a
    port that is no number, or digits before a misplaced ``@``, which are a piece of a password)
    is left to the URL's own parse, which never shows it.

    Args:
        url: One URL, as given (with credentials).

    Returns:
        ``"port N is out of range; a port must be 1-65535"``, ``"port 'x' is not a number; ..."`` (only
        after a userinfo's ``@``: without one, the text after a ``:`` may be a password), or None.
    """
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return None
    if "@" in url and "@" not in netloc:
        return None
    hostport = netloc.rpartition("@")[2]
    port = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    text = port.rpartition(":")[2] if ":" in port else ""
    if ascii_digits(text) and not 1 <= int(text) <= MAX_PORT:
        return f"port {text} is out of range; a port must be 1-{MAX_PORT}"
    if text and not ascii_digits(text) and "@" in netloc:  # after the userinfo: no piece of a password
        return f"port {text!r} is not a number; a port must be 1-{MAX_PORT}"
    return None


_HOST_HINT = "give the node's DNS name or IP address (an IPv6 address in brackets: [::1])"


def host_problem(host: str) -> str | None:
    """Why ``host`` is no name a connect could use (as socket and ssl encode it: IDNA), or None.

    The one host rule of every URL (AMQP nodes, management URLs) and of
    ``server_name_indication``: an IP address, or a name whose labels IDNA can encode (1-63
    characters each, no blank or control character; a trailing dot is allowed), as ``getaddrinfo``
    and ``ssl`` need it (they raise ``UnicodeError`` or ``TypeError`` at connect otherwise).

    Returns:
        The reason (``"label empty or too long"``...), or None for a usable host.

    """
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    if not host:
        return "it is empty"
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in host):
        return "it holds a blank or a control character"
    try:
        host.encode("idna")
    except UnicodeError as exc:
        return str(exc.__cause__ or exc)
    return None


def netloc_problem(netloc: str, hostname: str) -> str | None:
    """What is wrong with the host of a URL (its ``netloc`` and ``hostname`` as urlsplit gives them), or None.

    An IPv6 address in brackets followed by anything but a port (``[::1]x``), or a host
    :func:`host_problem` refuses; the message names the host (never the userinfo) and the fix.
    """
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        if (rest := hostport.partition("]")[2]) and not rest.startswith(":"):
            return f"{hostport!r} is not an IPv6 address in brackets with an optional port ([::1]:5672)"
        return None
    if why := host_problem(hostname):
        return f"host {hostname!r} is not a host name: {why}; {_HOST_HINT}"
    return None


def redact(url: str) -> str:
    """Return ``url`` with every password replaced by ``***`` (safe to print or log).

    ``url`` may be a comma-separated list of URLs (a cluster): each is redacted. A piece that is
    not a URL (say, the tail of a password holding an unencoded comma) is shown as ``<not a URL>``.
    Whatever is left, every ``scheme://user:password@`` in it is redacted (:func:`redact_text`).
    """
    if "," not in url:
        one = _redact_one(url, alone=True)
        return redact_text("<unparseable URL>" if one.endswith("<unparseable URL>") else one)
    return redact_text(",".join(_redact_one(piece) for piece in url.split(",")))


def bracketed(host: str) -> str:
    """``host`` as written in a URL: an IPv6 address in brackets (RFC 3986 §3.2.2), anything else as is."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


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
    verify: str = "verify_peer"


def parse_node(url: str, position: int, count: int) -> NodeURL:
    """Parse one node URL of a list of ``count`` (``position`` counts from 1).

    Raises:
        ConfigurationError: not an ``amqp://``/``amqps://`` URL (several URLs run together with
            blanks or ``;``, an unencoded reserved character in the password), no host, a host no
            connect could use (:func:`netloc_problem`: ``a..b``, ``[::1]x``), a port
            out of 1-65535 (:func:`port_problem`), a ``server_name_indication`` that is empty or
            no host name, a query option not in :data:`URL_OPTIONS` or a
            value of one aiormq would misread as 0 or false (``heartbeat=abc``: heartbeats off), or a
            vhost with control characters (:func:`~amqpjobs.topology.naming.vhost_problem`); the
            message names the item and never shows a password (nor a piece of a list that may hold one).

    """
    where = f"broker URL {position} of {count}" if count > 1 else "broker URL"
    if not url.lower().startswith(("amqp://", "amqps://")):
        shown = redact(url) if count == 1 else "<not shown: it may hold part of a password>"
        hint = f"; {_COMMA_HINT}" if count > 1 else ""
        raise ConfigurationError(f"bad {where} {shown}: expected amqp://user:pass@host:port/vhost{hint}")
    if _RUN_TOGETHER.search(url.split("://", 1)[1]):
        raise ConfigurationError(
            f"bad {where} <not shown: it may hold a password>: it holds a blank, ';' or a second '://', as "
            f"several URLs run together would: separate the nodes of a cluster with commas (or repeat --url); "
            f"a blank or ';' inside a password must be %-encoded (%20, %3B)"
        )
    if (problem := port_problem(url)) and ("@" in url or count == 1):  # else: maybe a password cut at a comma
        raise ConfigurationError(f"bad {where} {redact(url) if '@' in url else url}: {problem}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        # the error's text may quote a piece of a password ("Port could not be cast ... 'pa'"): never shown
        port_hint = f"a port must be a number 1-{MAX_PORT}; " if "Port" in str(exc) else ""  # or a password's piece
        hint = _COMMA_HINT if count > 1 else _BRACKET_HINT if "IPv6" in str(exc) else port_hint + _ENCODE_HINT
        raise ConfigurationError(f"bad {where} {redact(url)}: not a URL ({hint})") from None
    if "@" in url and "@" not in parts.netloc:
        raise ConfigurationError(f"bad {where} {redact(url)}: not a URL ({_ENCODE_HINT})")
    if not parts.hostname:
        raise ConfigurationError(f"bad {where} {redact(url)}: expected amqp://user:pass@host:port/vhost")
    if problem := netloc_problem(parts.netloc, parts.hostname):
        raise ConfigurationError(f"bad {where} {redact(url)}: {problem}")
    if problem := url_text_problem(url):  # urlsplit drops tabs and line feeds: checked on the text as given
        raise ConfigurationError(f"bad {where} <not shown: it may hold a password>: {problem}")
    if "#" in url:  # urlsplit drops it and what follows: the vhost cut there is another one
        raise ConfigurationError(f"bad {where} {redact(url)}: it holds a '#', where the URL would end (an AMQP URL "
                                 "has no fragment): a '#' in the vhost must be %-encoded as %23")  # fmt: skip
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    options = dict(pairs)
    unknown = sorted(set(options) - set(URL_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"bad {where} {redact(url)}: unknown query option {', '.join(map(repr, unknown))}; "
            f"known ones: {', '.join(URL_OPTIONS)}"
        )
    if problem := _options_problem(parts.scheme.lower(), pairs, options):
        raise ConfigurationError(f"bad {where} {redact(url)}: {problem}")
    # a bare "%" first (in "%C3%ZZ" it is what breaks the %C3 too); then aiormq reads a %-escape that is no
    # UTF-8 as written ("%FF"), unquote as "\ufffd": one reading only
    texts = {"the vhost (the path)": parts.path, "the user": parts.username, "the password": parts.password}
    if part := next((k for k, v in texts.items() if v and _BARE_PERCENT.search(v)), None):  # unquote keeps "%ZZ"
        raise ConfigurationError(f"bad {where} {redact(url)}: {part} holds a '%' starting no %-escape: write % as %25")
    if part := next((k for k, v in texts.items() if v and unquote(v) != unquote(v, errors="surrogateescape")), None):
        raise ConfigurationError(
            f"bad {where} {redact(url)}: {part} holds a %-escape that is no UTF-8 (such as %FF): "
            f"%-encode each byte of its UTF-8 (é is %C3%A9)"
        )
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    if problem := vhost_problem(vhost):
        raise ConfigurationError(f"bad {where} {redact(url)}: {problem}")
    user = unquote(parts.username or "guest")
    password = unquote(parts.password or "guest")
    verify = options.get("verify", "verify_peer")
    return NodeURL(parts.scheme.lower(), user, password, vhost, port, parts.hostname, verify)


def _options_problem(scheme: str, pairs: list[tuple[str, str]], options: dict[str, str]) -> str | None:
    """What is wrong with a URL's known query options, or None.

    aiormq reads the first of a repeated option (we the last); its parsers read what they can't
    as 0 or false (:data:`_VALUES`); aio-pika's ``fail_fast=false`` waits forever for a connect
    the broker refuses; TLS options on ``amqp://`` are ignored; ``auth=external`` logs in with a
    TLS client certificate (RabbitMQ "Authentication, Authorisation, Access Control" -> x509).
    """
    if len(options) < len(pairs):
        twice = next(name for name in options if sum(1 for key, _ in pairs if key == name) > 1)
        return f"option {twice!r} is given twice; give it once"
    for option, (good, must_be) in _VALUES.items():
        if option in options and not good(options[option]):
            return f"{option}={options[option]!r} is not {must_be}"
    if options.get("fail_fast", "1").lower() in _FALSE:
        return (
            f"fail_fast={options['fail_fast']} would make a refused connect wait forever; amqpjobs retries a connect "
            "itself (up to its connect wait): leave fail_fast out"
        )
    if options.get("auth", "").lower() == "external" and (scheme != "amqps" or "certfile" not in options):
        return (
            "auth=external is a TLS client certificate login: it needs amqps:// with certfile and keyfile (and the "
            "broker's rabbitmq_auth_mechanism_ssl plugin)"
        )
    if scheme == "amqp" and (tls := next((o for o in TLS_OPTIONS if o in options), None)):
        return f"{tls} is a TLS option and this URL is amqp:// (no TLS): use amqps://"
    sni = options.get("server_name_indication")
    if sni == "":
        return "server_name_indication is empty: give the host name the certificate names, or disable (send none)"
    if sni is not None and sni != "disable" and (why := host_problem(sni)):
        return f"server_name_indication {sni!r} is not a host name: {why}; give the host name the certificate names"
    return None


def same_cluster(nodes: list[str], parsed: list[NodeURL]) -> None:
    """Refuse a list naming a node twice, or whose nodes differ in scheme, TLS ``verify``, vhost, user or password.

    Raises:
        ConfigurationError: naming the item and what differs (never a password).

    """
    first = parsed[0]
    seen: dict[str, int] = {}
    for i, url in enumerate(nodes, start=1):
        j = seen.setdefault(node_address(url), i)
        if j != i:
            raise ConfigurationError(
                f"broker URL {i} ({redact(url)}) names the same node as broker URL {j}: give each node once"
            )
    for i, one in enumerate(parsed[1:], start=2):
        node = f"broker URL {i} ({redact(nodes[i - 1])})"
        if one.scheme != first.scheme:
            raise ConfigurationError(
                f"{node} is {one.scheme}:// but broker URL 1 is {first.scheme}://: the nodes of one cluster are "
                f"all reached the same way (mixing them would let a connection fall back to plain AMQP)"
            )
        if one.verify != first.verify:
            raise ConfigurationError(
                f"{node} has verify={one.verify} but broker URL 1 has verify={first.verify}: one cluster has one "
                f"certificate verification policy; give every URL the same verify option"
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


def node_address(url: str) -> str:
    """``host:port`` of an AMQP URL, one text per node: the same for every way of writing it.

    No port: the scheme's (5672, ``amqps``: 5671); a name lowercased, without a trailing dot; an
    IP address in its compressed form (``[0:0::1]`` and ``[::1]`` are one), IPv6 in brackets.
    """
    parts = urlsplit(url)
    port = parts.port or (5671 if parts.scheme.lower() == "amqps" else 5672)
    host = (parts.hostname or "").lower()
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        host = host.rstrip(".") or host
    return f"{bracketed(host)}:{port}"


def management_base(url: str) -> str:
    """``scheme://host:port/path`` of a management URL: credentials, query and trailing ``/`` dropped."""
    mparts = urlsplit(url)
    netloc = bracketed(mparts.hostname or "") + (f":{mparts.port}" if mparts.port else "")
    return urlunsplit((mparts.scheme, netloc, mparts.path.rstrip("/"), "", ""))
