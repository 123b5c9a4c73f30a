"""A plain ``http://`` management API client loads no CA bundle (about 20 ms of CPU each, a worker made four).

Seen on the bench: ``ssl.create_default_context`` took 5% of a 16-slot worker's samples while
it drained a queue, from the clients its start-up checks made in threads.
"""

from __future__ import annotations

import ssl

import pytest

from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings


def test_an_http_api_client_makes_no_default_context_and_shares_one_that_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append((args, kwargs))
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    settings = broker_settings("amqp://u:p@127.0.0.1:5672/", "http://u:p@127.0.0.1:15672/")
    contexts = []
    for _ in range(3):
        with ManagementClient(settings) as mgmt:
            contexts.append(mgmt._http[mgmt.base_url]._transport._pool._ssl_context)  # type: ignore[attr-defined]
    assert made == []
    assert contexts[0] is contexts[1] is contexts[2]
    assert contexts[0].verify_mode == ssl.CERT_REQUIRED
    assert contexts[0].check_hostname is True


def test_an_https_api_client_still_verifies_with_its_urls_tls_options() -> None:
    settings = broker_settings("amqps://u:p@127.0.0.1:5671/", "https://u:p@127.0.0.1:15671/")
    with ManagementClient(settings) as mgmt:
        context = mgmt._http[mgmt.base_url]._transport._pool._ssl_context  # type: ignore[attr-defined]
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.cert_store_stats()["x509_ca"] > 0
