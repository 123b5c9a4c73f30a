"""A loopback port that accepts connections and never answers: a management API (or broker) that hangs."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that accepts connections and never answers (a management API that hangs); and its accepted."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1]), accepted
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        for conn in accepted:
            conn.close()
