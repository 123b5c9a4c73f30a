"""A kept-alive HTTP connection the management API had closed is retried once on a new one (CI run 14, 4.3)."""

from __future__ import annotations

import socket
import threading

import pytest

from amqpjobs.errors import ManagementApiError
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


def _answer_once(server: socket.socket, status: bytes, body: bytes) -> None:
    conn, _ = server.accept()
    conn.recv(65536)
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    conn.sendall(head + b"Connection: close\r\n\r\n" + body)
    conn.close()


@pytest.mark.parametrize(
    ("status", "body"),
    [(b"500 Internal Server Error", b"\x1b[31mRED\r\nFAKE LOG LINE level=ERROR\x07"),
     (b"401 Unauthorized", b'{"error":"not_authorized","reason":"\\u001b[31mx\\r\\nforged level=ERROR"}')],
)  # fmt: skip
def test_an_error_answer_of_the_management_api_is_quoted_without_its_control_characters(
    status: bytes, body: bytes
) -> None:
    """Its text goes into error messages and log lines: a CR LF or a terminal escape would forge a log line."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(10)
        port = server.getsockname()[1]
        thread = threading.Thread(target=_answer_once, args=(server, status, body), daemon=True)
        thread.start()
        settings = broker_settings("amqp://guest:guest@127.0.0.1:5672/", f"http://127.0.0.1:{port}")
        with ManagementClient(settings) as client, pytest.raises(ManagementApiError) as caught:
            client.request("GET", "/overview")
        thread.join(10)
    text = str(caught.value)
    assert not any(ord(c) < 0x20 or c == "\x7f" for c in text), repr(text)
    if status.startswith(b"500"):  # quoted, escaped (a 401's reason is only compared, never quoted)
        assert "-> 500: \\x1b[31mRED\\r\\nFAKE LOG LINE level=ERROR\\x07" in text
