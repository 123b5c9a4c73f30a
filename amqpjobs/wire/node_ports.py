"""Whether a broker's AMQP ports refuse connections: a broker down is not a wrong management URL.

When the management API derived from the AMQP URL (same host, port + 10000) can't be reached, the
error sends the user to ``--management-url``; with the AMQP port refusing too, the broker is not
running there (or the AMQP URL is wrong), which the error then says (README "Commands").
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

#: Seconds one look at a port may take (a refusal is immediate; a silent host is not "refusing").
LOOK_FOR = 1.0


def amqp_refused(nodes: tuple[str, ...]) -> str:
    """``; the broker's AMQP port h:p refuses connections too: ...`` when every node's AMQP port refuses, else ``""``.

    Args:
        nodes: The AMQP URL of each node (credentials are not read, nor shown).
    """
    ports = []
    for node in nodes:
        try:
            parts = urlsplit(node)
            host, port = parts.hostname or "localhost", parts.port or (5671 if parts.scheme == "amqps" else 5672)
        except ValueError:
            return ""
        try:
            with socket.create_connection((host, port), timeout=LOOK_FOR):
                return ""  # it answers: the management URL is what is wrong
        except ConnectionRefusedError:
            ports.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        except OSError:
            return ""  # silent, unresolvable ...: not known to be down
    if not ports:
        return ""
    which = f"port {ports[0]} refuses" if len(ports) == 1 else f"ports {', '.join(ports)} refuse"
    return (
        f"; the broker's AMQP {which} connections too: is the broker running there (or is the AMQP URL's host or "
        "port wrong)?"
    )
