"""An ``https`` management URL (derived from ``amqps://``) at a port that answers plain HTTP is named so.

helper-194: ``amqpjobs status --url amqps://guest:guest@127.0.0.1:5682/`` (a plain node) said
``management API at https://127.0.0.1:15682 (derived from the AMQP URL ...) unreachable:
ConnectError: [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)``: OpenSSL's words,
not what was wrong (the port speaks plain HTTP) nor the fix.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings


class _Plain(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("given", [True, False], ids=["management-url", "derived"])
def test_https_to_a_plain_http_port_says_it_does_not_speak_tls(given: bool) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Plain)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        if given:
            settings = broker_settings("amqps://guest:guest@127.0.0.1:5671/", f"https://127.0.0.1:{port}")
        else:  # the AMQP port + 10000 is the plain HTTP server's
            settings = broker_settings(f"amqps://guest:guest@127.0.0.1:{port - 10000}/")
        with ManagementClient(settings) as client, pytest.raises(BrokerUnavailableError) as caught:
            client.request("GET", "/overview")
    finally:
        server.shutdown()
        server.server_close()
    message = str(caught.value)
    assert f"https://127.0.0.1:{port}" in message, message
    assert f"port {port} does not speak TLS (it answers plain HTTP)" in message, message
    assert "WRONG_VERSION_NUMBER" not in message, message
    fix = (
        "use amqp:// when the broker has no TLS, else give --management-url http://... "
        "(or $AMQPJOBS_MANAGEMENT_URL), or the management API's TLS port"
    )
    assert message.endswith(fix), message
