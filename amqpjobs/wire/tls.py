"""TLS for ``amqps://`` URLs and the management API: RabbitMQ's URI query options, verified by default.

RabbitMQ "URI Query Parameters" (``uri-query-parameters.html``) names the TLS options a
client takes in the query of an ``amqps://`` URL; this module turns them into one
:class:`ssl.SSLContext`:

- ``cacertfile``: PEM file of the CA(s) to trust (default: the system's trust store);
- ``certfile`` / ``keyfile``: the client's certificate and key (peer verification by the node);
- ``verify``: ``verify_peer`` (default) or ``verify_none`` (no certificate check at all: only
  when written in the URL, never as a fallback);
- ``server_name_indication``: the host name to send (SNI) and to check the node's certificate
  against, when it is not the URL's host; ``disable`` sends none (and checks none).

An ``amqps://`` URL is never tried as plain AMQP, and a refused certificate is never retried.
"""

from __future__ import annotations

import os
import ssl
import stat
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from amqpjobs.errors import ConfigurationError

#: The TLS options of RabbitMQ's URI specification this module reads from an ``amqps://`` query.
TLS_OPTIONS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")


class _NamedContext(ssl.SSLContext):
    """An SSLContext that sends (and checks) ``server_name`` instead of the host connected to."""

    server_name: str | None = None

    def wrap_socket(
        self,
        sock: Any,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: Any = None,
        session: Any = None,
    ) -> Any:
        return super().wrap_socket(
            sock, server_side, do_handshake_on_connect, suppress_ragged_eofs, self.server_name, session
        )

    def wrap_bio(
        self, incoming: Any, outgoing: Any, server_side: bool = False, server_hostname: Any = None, session: Any = None
    ) -> Any:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name, session)


def split_tls_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without RabbitMQ's TLS query options, and those options (``{name: value}``)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in TLS_OPTIONS}
    rest = [(k, v) for k, v in query if k not in TLS_OPTIONS]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), options


def ssl_context(options: dict[str, str], where: str = "broker URL") -> ssl.SSLContext:
    """The client TLS context for RabbitMQ's URI TLS ``options`` (see the module docstring).

    Args:
        options: Query options of an ``amqps://`` URL (only :data:`TLS_OPTIONS` are read).
        where: What the options came from, for error messages (never with credentials).

    Returns:
        A context that verifies the node's certificate chain and host name unless
        ``verify=verify_none``.

    Raises:
        ConfigurationError: an unknown ``verify`` value, a ``keyfile`` without ``certfile``, a
            file that can't be read, is no regular file (``/dev/zero``, a FIFO), holds a NUL
            or is over 64 MiB, or is not PEM, a key not matching the certificate, or a
            certfile without key and no keyfile (the message names the option and file).

    """
    verify = options.get("verify", "verify_peer")
    if verify not in ("verify_peer", "verify_none"):
        raise ConfigurationError(f"{where}: verify={verify!r} is not a TLS option; use verify_peer or verify_none")
    if "keyfile" in options and "certfile" not in options:
        raise ConfigurationError(f"{where}: keyfile is given without certfile; give both, or neither")
    for option in ("cacertfile", "certfile", "keyfile"):
        if option in options and (why := _file_problem(options[option])):
            raise ConfigurationError(f"{where}: {option}={options[option]!r} {why}")
    sni = options.get("server_name_indication")
    context: ssl.SSLContext = _NamedContext(ssl.PROTOCOL_TLS_CLIENT) if sni else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if sni and isinstance(context, _NamedContext):
        context.server_name = None if sni == "disable" else sni
        if sni == "disable":
            context.check_hostname = False
    if "cacertfile" in options:
        try:
            context.load_verify_locations(cafile=options["cacertfile"])
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"{where}: cacertfile={options['cacertfile']!r} can't be used: {exc}") from exc
    if "certfile" in options:
        _load_client_certificate(context, options["certfile"], options.get("keyfile"), where)
    if "cacertfile" not in options:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if verify == "verify_none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


#: The largest TLS file read (a CA bundle of every public root is about 250 KiB).
_MAX_PEM = 64 * 1024 * 1024


def _file_problem(path: str) -> str | None:
    """Why ``path`` is no TLS file to read (a NUL, a device, a FIFO, too large), or None (missing: the read says).

    A device or a FIFO would be read as it is: ``/dev/zero`` without end, a FIFO's open
    waiting for a writer; a path with a NUL makes ``open`` raise ``ValueError``.
    """
    if "\x00" in path:
        return "holds a NUL character; give the path of a PEM file"
    try:
        st = os.stat(path)
    except OSError:
        return None  # the read says what (no such file, permission denied ...)
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a PEM file's path)"
    if st.st_size > _MAX_PEM:
        return (
            f"is {st.st_size // (1024 * 1024)} MiB: larger than any PEM file ({_MAX_PEM // (1024 * 1024)} MiB at most)"
        )
    return None


def _load_client_certificate(context: ssl.SSLContext, certfile: str, keyfile: str | None, where: str) -> None:
    """Load the client's certificate and key, saying which file is wrong and how.

    Raises:
        ConfigurationError: the certfile (or keyfile) is missing or unreadable, is not PEM, the
            key does not match the certificate, or the certfile holds no key and no keyfile is given.

    """
    pem: dict[str, bytes] = {}
    for option, path in (("certfile", certfile), ("keyfile", keyfile)):
        if path is None:
            continue
        try:
            with open(path, "rb") as f:
                pem[option] = f.read()
        except OSError as exc:
            raise ConfigurationError(f"{where}: {option}={path!r} can't be read: {exc.strerror}") from exc
    why = ""
    if b"-----BEGIN CERTIFICATE-----" not in pem["certfile"]:
        why = f"certfile={certfile!r} holds no PEM certificate"
    elif keyfile is None and b"PRIVATE KEY-----" not in pem["certfile"]:
        why = f"certfile={certfile!r} holds no private key: give keyfile= (the client's PEM key)"
    elif keyfile is not None and b"PRIVATE KEY-----" not in pem["keyfile"]:
        why = f"keyfile={keyfile!r} holds no PEM private key"
    if why:
        raise ConfigurationError(f"{where}: {why}")
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            held = f"keyfile={keyfile!r}" if keyfile else "the key in it"
            why = f"{held} does not match certfile={certfile!r} (not the key of that certificate)"
        else:
            why = f"certfile={certfile!r} / keyfile={keyfile!r} can't be used: {exc}"
        raise ConfigurationError(f"{where}: {why}") from exc


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception reachable from it through ``__cause__``, ``__context__`` and ``args``."""
    seen: dict[int, BaseException] = {}
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen[id(e)] = e
        todo.extend(x for x in (e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException))
    return list(seen.values())


def refused_certificate(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error in ``exc``'s chain (cause/context/args), if any."""
    return next((e for e in exception_chain(exc) if isinstance(e, ssl.SSLCertVerificationError)), None)


def certificate_problem(exc: ssl.SSLCertVerificationError) -> str:
    """Why the node's certificate was refused, in words (``verify_message`` of OpenSSL)."""
    message = exc.verify_message or exc.reason or str(exc)
    if exc.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
        return (
            f"host name mismatch ({message}): the certificate does not name this host; "
            "connect by a name it has, or set server_name_indication"
        )
    if exc.verify_code in (2, 19, 20, 21):  # unknown issuer / self-signed chain
        return (
            f"unknown CA ({message}): the certificate is not signed by a trusted CA; "
            "set cacertfile to the CA that signed it"
        )
    return message
