"""Verified TLS against a dedicated local node with a TLS listener and a CA made by the test (issue 23).

The node is a scripts/broker.sh node of Debian's rabbitmq-server with its own name, ports,
data dir and config (``AMQPJOBS_BROKER_EXTRA_CONF`` adds the TLS listeners): a TLS listener
needs its certificates at boot, so the shared test broker can't serve. It is stopped at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.connection import broker_info, connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import applied_app, drain
from tests.integration.own_node import free_ports, own_node

# always the host's 3.10 node; one xdist worker runs the module, so the TLS node starts once
pytestmark = [pytest.mark.broker, pytest.mark.version_independent, pytest.mark.xdist_group("tls")]


TOPOLOGY = '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "work"\nexchange = "jobs"\n'


@dataclass(frozen=True)
class TlsNode:
    """The dedicated node: AMQPS on ``port``, management HTTPS on ``port + 10000``; the CA's PEM file."""

    port: int
    ca_file: Path
    other_ca_file: Path


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    d = tmp_path_factory.mktemp("tls")
    ca, other_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    other_ca.cert_pem.write_to_path(str(d / "other-ca.pem"))
    server = ca.issue_cert("localhost")  # not 127.0.0.1: connecting by IP is a host name mismatch
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    tls_port, amqp_port, dist_port = free_ports(3)
    conf = (
        f"listeners.ssl.default = 127.0.0.1:{tls_port}\n"
        f"ssl_options.cacertfile = {d / 'ca.pem'}\n"
        f"ssl_options.certfile = {d / 'server.pem'}\n"
        f"ssl_options.keyfile = {d / 'server.pem'}\n"
        "ssl_options.verify = verify_none\n"
        "ssl_options.fail_if_no_peer_cert = false\n"
        "management.ssl.ip = 127.0.0.1\n"
        f"management.ssl.port = {tls_port + 10000}\n"
        f"management.ssl.cacertfile = {d / 'ca.pem'}\n"
        f"management.ssl.certfile = {d / 'server.pem'}\n"
        f"management.ssl.keyfile = {d / 'server.pem'}\n"
    )
    with own_node(d, "tls", conf, ports=(amqp_port, dist_port)):
        yield TlsNode(tls_port, d / "ca.pem", d / "other-ca.pem")


def named(connection: dict[str, Any], name: str) -> bool:
    return bool((connection.get("client_properties") or {}).get("connection_name") == name)


def url(node: TlsNode, host: str = "localhost", **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"amqps://guest:guest@{host}:{node.port}/?{query}"


async def test_a_verified_tls_connection_works_for_amqp_and_the_management_api(tls_node: TlsNode):
    settings = broker_settings(url(tls_node, cacertfile=str(tls_node.ca_file)))
    assert settings.management_url == f"https://localhost:{tls_node.port + 10000}"
    connection = await connect(settings, wait=5, name="tls")
    try:
        assert broker_info(connection).product == "RabbitMQ"
        with ManagementClient(settings) as mgmt:
            assert mgmt.broker_version()[:1] == (3,)
            deadline = time.monotonic() + 10
            while not (mine := [c for c in mgmt.request("GET", "/connections") if named(c, "tls")]):
                assert time.monotonic() < deadline, "the broker never listed the connection"
                await asyncio.sleep(0.2)
        assert [(c["ssl"], c["port"]) for c in mine] == [(True, tls_node.port)]
    finally:
        await connection.close()
    # by IP address, naming the certificate's host for SNI and verification
    by_ip = broker_settings(
        url(tls_node, "127.0.0.1", cacertfile=str(tls_node.ca_file), server_name_indication="localhost")
    )
    connection = await connect(by_ip, wait=5, name="tls-sni")
    await connection.close()
    with ManagementClient(by_ip) as mgmt:
        assert mgmt.base_url == f"https://127.0.0.1:{tls_node.port + 10000}"
        assert mgmt.broker_version()[:1] == (3,)


async def test_a_wrong_ca_is_refused_naming_the_cause(tls_node: TlsNode):
    settings = broker_settings(url(tls_node, cacertfile=str(tls_node.other_ca_file)))
    with pytest.raises(BrokerUnavailableError, match=r"TLS: amqps://guest:\*\*\*@localhost:\d+/.* refused: unknown CA"):
        await connect(settings, wait=5)
    with (
        ManagementClient(settings) as mgmt,
        pytest.raises(
            BrokerUnavailableError, match=r"TLS: management API at https://localhost:\d+ refused: unknown CA"
        ),
    ):
        mgmt.overview()
    # no cacertfile: the system's trust store, which does not know the test's CA either
    with pytest.raises(BrokerUnavailableError, match="refused: unknown CA"):
        await connect(broker_settings(url(tls_node)), wait=5)


async def test_a_host_name_the_certificate_does_not_name_is_refused(tls_node: TlsNode):
    settings = broker_settings(url(tls_node, "127.0.0.1", cacertfile=str(tls_node.ca_file)))
    with pytest.raises(BrokerUnavailableError, match=r"refused: host name mismatch .*127\.0\.0\.1"):
        await connect(settings, wait=5)
    with ManagementClient(settings) as mgmt, pytest.raises(BrokerUnavailableError, match="refused: host name mismatch"):
        mgmt.overview()
    # a name (sent as SNI, checked against the certificate) that the certificate does not have
    named_wrong = broker_settings(
        url(tls_node, "127.0.0.1", cacertfile=str(tls_node.ca_file), server_name_indication="elsewhere.test")
    )
    with pytest.raises(BrokerUnavailableError, match=r"refused: host name mismatch .*'elsewhere\.test'"):
        await connect(named_wrong, wait=5)


async def test_verify_none_is_taken_only_when_written(tls_node: TlsNode):
    settings = broker_settings(url(tls_node, "127.0.0.1", verify="verify_none"))
    connection = await connect(settings, wait=5, name="tls-unverified")
    await connection.close()


@pytest.fixture
def fixed_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node list is tried in the order given (no shuffle), with a fresh per-process order cache."""
    monkeypatch.setattr("amqpjobs.wire.cluster._ORDERS", {}, raising=False)
    monkeypatch.setattr("random.shuffle", lambda order: None)


async def test_one_node_refusing_its_certificate_leaves_the_other_nodes_to_try(tls_node: TlsNode, fixed_order: None):
    ca = str(tls_node.ca_file)
    good, bad = url(tls_node, cacertfile=ca), url(tls_node, "127.0.0.1", cacertfile=ca)  # bad: host name mismatch
    for listed in (f"{bad},{good}", f"{good},{bad}"):
        connection = await connect(broker_settings(listed), wait=5)
        try:
            assert isinstance(connection, ClusterConnection)
            assert connection.node.address == f"localhost:{tls_node.port}"
        finally:
            await connection.close()
    # every node refused: one error naming each refusal, at once (not retried for the connect timeout)
    wrong_ca = url(tls_node, cacertfile=str(tls_node.other_ca_file))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as err:
        await connect(broker_settings(f"{bad},{wrong_ca}"), wait=20)
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert message.startswith("each of the 2 nodes refused: TLS: amqps://guest:***@127.0.0.1:")
    assert "refused: host name mismatch" in message
    assert f"TLS: amqps://guest:***@localhost:{tls_node.port}/" in message
    assert "refused: unknown CA" in message


async def test_each_node_s_management_api_uses_that_node_s_tls_options(tls_node: TlsNode, fixed_order: None):
    ca = str(tls_node.ca_file)
    (dead,) = free_ports(1)
    first = f"amqps://guest:guest@localhost:{dead}/?cacertfile={ca}"  # no node there: node 2's API answers
    second = url(tls_node, "127.0.0.1", cacertfile=ca, server_name_indication="localhost")
    with ManagementClient(broker_settings(f"{first},{second}")) as mgmt:
        assert mgmt.broker_version()[:1] == (3,)
        assert mgmt.base_url == f"https://127.0.0.1:{tls_node.port + 10000}"


async def test_amqp_to_the_tls_port_fails_at_once_saying_so(tls_node: TlsNode):
    settings = broker_settings(f"amqp://guest:guest@localhost:{tls_node.port}/")
    started = time.monotonic()
    with pytest.raises(
        BrokerUnavailableError, match=rf"localhost:{tls_node.port}/: port {tls_node.port} speaks TLS: use"
    ):
        await connect(settings, wait=20)
    assert time.monotonic() - started < 5


async def test_the_sync_publisher_publishes_from_the_calling_thread_over_verified_tls(
    tls_node: TlsNode, tmp_path: Path
):
    """The sync publisher's blocking connections (wire/blocking.py) verify the node as aio-pika does and carry jobs."""
    settings = broker_settings(url(tls_node, cacertfile=str(tls_node.ca_file)))
    app = await applied_app(settings, tmp_path, TOPOLOGY, "tls-sync")
    app.job("work", queue="work")(lambda p, c: None)
    names = "tls-sync-sync-publisher"

    def publish() -> tuple[int, list[int]]:
        with app.sync_publisher() as pub:
            pub.enqueue("work", {"n": 0}, job_id="warm")  # connects the app (the async path)
            for n in range(1, 31):
                pub.enqueue("work", {"n": n}, job_id=f"j-{n}")
            assert pub._fast is not None
            opened = [one.connects for one in pub._fast.connections()]
            with ManagementClient(settings) as mgmt:
                deadline = time.monotonic() + 10
                while not (mine := [c for c in mgmt.request("GET", "/connections") if named(c, names)]):
                    assert time.monotonic() < deadline, "the broker never listed the blocking connection"
                    time.sleep(0.2)
                assert [(c["ssl"], c["port"]) for c in mine] == [(True, tls_node.port)]
            return pub._fast.calls, opened

    try:
        calls, opened = await asyncio.to_thread(publish)
    finally:
        await app.close()
    assert (calls, opened) == (30, [1])
    got = await drain(settings, "work")
    assert [m.message_id for m in got] == ["warm", *(f"j-{n}" for n in range(1, 31))]
    assert [m.body for m in got[1:3]] == [b'{"n":1}', b'{"n":2}']
