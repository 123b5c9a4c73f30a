"""Broker URLs a fresh user gets wrong, through the CLI and against the real broker (issue 23 review)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.connection import connect
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from amqpjobs.wire.urls import redact
from tests.integration.test_broker_urls import run
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

PW = "Pw9-secret"


def with_netloc(broker: BrokerSettings, netloc: str) -> str:
    return urlunsplit(urlsplit(broker.nodes[0])._replace(netloc=netloc))


@pytest.fixture
def user(broker: BrokerSettings) -> Iterator[str]:
    """A user whose password is :data:`PW`, with every permission on the test's vhost (so no 401 comes first)."""
    name = f"review-{uuid.uuid4().hex[:8]}"
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/users/{name}", json={"password": PW, "tags": "management"})
        try:
            mgmt.request(
                "PUT",
                f"/permissions/{quote(broker.vhost, safe='')}/{name}",
                json=dict.fromkeys(("configure", "write", "read"), ".*"),
            )
            yield name
        finally:
            mgmt.request("DELETE", f"/users/{name}", allow_404=True)


@pytest.mark.timeout(240)  # 35 CLI processes
def test_no_failing_cli_path_prints_the_password_of_a_list_run_together(
    broker: BrokerSettings, user: str, tmp_path: Path
):
    topo = tmp_path / "t.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    port = urlsplit(broker.nodes[0]).port
    one = with_netloc(broker, f"{user}:{PW}@127.0.0.1:{port}")
    commands = [
        ["topology", "plan", str(topo)],
        ["topology", "apply", str(topo)],
        ["status", str(topo)],
        ["quarantine", "list", "jobs.quarantine"],
        ["replay", "jobs.quarantine"],
        ["schedule", "list", "tests.integration.worker_env:app"],
        ["consume", "tests.integration.worker_env:app"],
    ]
    hashed = with_netloc(broker, f"{user}:{PW}#x@127.0.0.1:{port}")  # an unencoded '#' in a single URL's password
    urls = [f"{one} {one}", f"{one}; {one}", hashed]  # (more separators: tests/unit/test_broker_url_review.py)
    runs: list[tuple[list[str], str | None]] = []
    for args in commands:
        runs += [([*args, "--url", url], None) for url in urls]
        runs.append((["-v", *args, "--url", urls[1]], None))  # with tracebacks
        runs.append((args, f"{one};{one}"))  # from $AMQPJOBS_URL
    with ThreadPoolExecutor(4) as pool:  # 35 CLI processes, mostly python start-up: 4 at a time
        outs = list(pool.map(lambda r: run(r[0], url=r[1]), runs))
    leaks = [(argv[:3], out.stdout + out.stderr) for (argv, _), out in zip(runs, outs, strict=True)
             if "Pw9" in out.stdout + out.stderr]  # fmt: skip
    codes = [out.returncode for out in outs]
    checked = len(outs)
    assert leaks == []
    assert codes == [2] * checked
    assert checked == len(commands) * 5


def test_an_empty_url_option_is_refused_not_taken_from_the_environment(broker: BrokerSettings, tmp_path: Path):
    topo = tmp_path / "t.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    out = run(["topology", "plan", str(topo), "--url", ""], url=broker.url)
    assert out.returncode == 2
    assert "--url is empty" in out.stderr


def test_an_ipv6_host_is_tried_not_a_crash(tmp_path: Path):
    topo = tmp_path / "t.toml"
    topo.write_text(APPLIED_TOPOLOGY)
    out = run(["topology", "plan", str(topo), "--url", "amqp://u:p@[::1]:5682/v", "--connect-timeout", "1s"])
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    assert "ValueError" not in out.stderr
    assert "management API at http://[::1]:15682 (derived from the AMQP URL" in out.stderr


async def test_amqps_to_a_plain_port_fails_at_once_saying_so(broker: BrokerSettings):
    port = urlsplit(broker.nodes[0]).port
    tls = broker_settings(with_netloc(broker, f"guest:guest@127.0.0.1:{port}").replace("amqp://", "amqps://", 1))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as err:
        await connect(tls, wait=20)
    took = time.monotonic() - started
    assert f"port {port} does not speak TLS: use amqp:// or the TLS port" in str(err.value)
    assert took < 5, took  # refused at the first attempt, not retried for the 20 s connect timeout


async def test_the_management_client_follows_the_node_the_connection_is_on(broker: BrokerSettings):
    """Two addresses of one node (127.0.0.1, localhost): whichever the connection lands on, the API used is its."""
    port = urlsplit(broker.nodes[0]).port or 5672
    nodes = [with_netloc(broker, f"guest:guest@{host}:{port}") for host in ("127.0.0.1", "localhost")]
    settings = broker_settings(",".join(nodes))
    connection = await connect(settings, wait=5)
    try:
        assert isinstance(connection, ClusterConnection)
        host = connection.node.address.rpartition(":")[0]
        with ManagementClient(settings) as mgmt:
            assert mgmt.base_url == f"http://{host}:{port + 10000}"
            assert mgmt.overview()["rabbitmq_version"]
        # a second connection of this process lands on the same node (one shuffled order per process)
        again = await connect(settings, wait=5)
        assert isinstance(again, ClusterConnection)
        assert again.node.address == connection.node.address
        await again.close()
    finally:
        await connection.close()


async def test_a_lost_connection_is_one_line_of_ours_then_connected_to_the_next_node(
    broker: BrokerSettings, caplog: pytest.LogCaptureFixture
):
    port = urlsplit(broker.nodes[0]).port or 5672
    nodes = [with_netloc(broker, f"guest:guest@{host}:{port}") for host in ("127.0.0.1", "localhost")]
    name = f"review-{uuid.uuid4().hex[:8]}"
    connection = await connect(broker_settings(",".join(nodes)), wait=5, name=name)
    try:
        assert isinstance(connection, ClusterConnection)
        lost, other = connection.node.safe_url, ({*nodes} - {connection.node.url}).pop()
        channel = await connection.channel()
        queue = await channel.declare_queue("", exclusive=True)
        await queue.consume(ignore)
        await connection.channel()
        caplog.clear()
        with ManagementClient(broker) as mgmt:
            deadline = time.monotonic() + 10
            while not (mine := [c for c in mgmt.request("GET", "/connections") if named(c, name)]):
                assert time.monotonic() < deadline, "the broker never listed the connection"
                await asyncio.sleep(0.2)
            caplog.set_level(logging.INFO)
            mgmt.request("DELETE", f"/connections/{quote(mine[0]['name'], safe='')}")
        deadline = time.monotonic() + 20
        while not any("connected to" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "never reconnected"
            await asyncio.sleep(0.1)
        lines = [
            (r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith(("aio", "amqpjobs"))
        ]
        assert lines == [
            ("amqpjobs.wire", "WARNING", f"connection {name} lost {lost} ([Errno 320] CONNECTION_FORCED - Closed via "
             f"management plugin): next attempt goes to {redact(other)}"),
            ("amqpjobs.wire", "INFO", f"connection {name} connected to {redact(other)}"),
        ]  # fmt: skip
    finally:
        await connection.close()


async def ignore(message: object) -> None:
    """A consumer's callback (the test only needs the consumer to exist)."""


def named(connection: dict[str, object], name: str) -> bool:
    return bool((connection.get("client_properties") or {}).get("connection_name") == name)  # type: ignore[attr-defined]
