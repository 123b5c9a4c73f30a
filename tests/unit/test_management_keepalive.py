"""A kept-alive HTTP connection the management API had closed is retried once on a new one (CI run 14, 4.3)."""

from __future__ import annotations

import socket
import threading

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}"


def _serve(server: socket.socket, answered: list[int]) -> None:
    first, _ = server.accept()  # answers one request, then closes when the next one comes on it
    first.recv(65536)
    first.sendall(OK)
    first.recv(65536)
    first.close()
    answered.append(1)
    second, _ = server.accept()  # the retry's new connection
    second.recv(65536)
    second.sendall(OK)
    second.close()
    answered.append(2)


def test_a_closed_kept_alive_connection_is_retried_once_on_a_new_one() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(10)
        port = server.getsockname()[1]
        answered: list[int] = []
        thread = threading.Thread(target=_serve, args=(server, answered), daemon=True)
        thread.start()
        settings = broker_settings("amqp://guest:guest@127.0.0.1:5672/", f"http://127.0.0.1:{port}")
        with ManagementClient(settings) as client:
            assert client.request("GET", "/overview") == {}
            assert client.request("GET", "/overview") == {}  # its kept-alive connection was closed meanwhile
        thread.join(10)
        assert answered == [1, 2]
