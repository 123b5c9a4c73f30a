"""What a node's port speaks, asked after a failed connect: TLS, or plain AMQP (a scheme/port mismatch).

An ``amqp://`` URL pointed at a TLS port has its connection reset at once, and an ``amqps://``
URL pointed at a plain port fails its handshake (OpenSSL's ``WRONG_VERSION_NUMBER``); both
look like a node still starting and would be retried for the whole connect timeout. After
such a failure one short probe tells the mismatch apart (RabbitMQ "Networking" → "Ports":
5672 plain AMQP, 5671 AMQP over TLS), so the node is refused at once with the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

#: The AMQP 0-9-1 protocol header a client sends first (AMQP 0-9-1 specification, section 4.2.2).
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
#: Seconds a probe may take.
PROBE_TIMEOUT = 2.0


async def speaks_tls(host: str, port: int) -> bool:
    """True when ``host:port`` completes a TLS handshake (certificate not checked: only the protocol is asked)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), PROBE_TIMEOUT)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


async def speaks_plain_amqp(host: str, port: int) -> bool:
    """True when ``host:port`` answers the AMQP protocol header in plain text (``connection.start``, frame type 1)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(_AMQP_HEADER)
        first = await asyncio.wait_for(reader.read(8), PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return first.startswith((b"AMQP", b"\x01\x00\x00"))


async def mismatch(scheme: str, host: str, port: int) -> str | None:
    """Why ``scheme://host:port`` can't work when the port speaks the other protocol, or None.

    Returns ``"port X speaks TLS: use amqps://"`` for ``amqp`` to a TLS port and
    ``"port X does not speak TLS: use amqp:// or the TLS port"`` for ``amqps`` to a plain one.
    """
    if scheme == "amqp" and await speaks_tls(host, port):
        return f"port {port} speaks TLS: use amqps://"
    if scheme == "amqps" and await speaks_plain_amqp(host, port):
        return f"port {port} does not speak TLS: use amqp:// or the TLS port"
    return None
