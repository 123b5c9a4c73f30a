"""A node that accepts TCP connections but never answers (half-dead, or traffic dropped on the way).

Every connect attempt is bounded (``amqpjobs.wire.rotation.attempt_timeout``), so such a
node counts as unreachable: the first connect gives up after the connect timeout like a
refused port does, instead of hanging for good; a robust connection's reconnect attempt is
bounded the same way, and so is each management API request (the console's overview). The
silent node is a listener of this test; the tests marked ``broker`` put it beside the real
node (a silent management port) or in front of it (a proxy of this test that goes silent:
the shared node is never restarted).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs import App, BrokerUnavailableError
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import cli_subprocess
from tests.integration.tcp_proxy import TcpProxy

SECRET = "pw-silent"


@asynccontextmanager
async def silent_node() -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A TCP port that accepts connections, reads what comes and never writes: (port, connections)."""
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        for writer in accepted:
            writer.close()
        await server.wait_closed()


async def test_a_first_connect_to_a_silent_node_gives_up_after_the_connect_timeout() -> None:
    async with silent_node() as (port, accepted):
        settings = broker_settings(f"amqp://guest:{SECRET}@127.0.0.1:{port}/").with_connect_timeout(3)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as caught:
            await asyncio.wait_for(connect(settings), 30)  # before: no end (the wait_for's TimeoutError)
        took = time.monotonic() - started
    assert 3 <= took <= 8, took  # one attempt of 3 s (the time left), then no round past the deadline
    assert len(accepted) >= 1  # it did reach the node
    assert f"broker at amqp://guest:***@127.0.0.1:{port}/ unreachable after 3s" in str(caught.value)
    assert re.search(r"no answer within (3|2\.[5-9])s", str(caught.value)), caught.value  # the time left of 3 s
    assert SECRET not in str(caught.value)


async def test_enqueue_through_a_silent_node_raises_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    from amqpjobs.runtime import app as app_module

    shorter = lambda url: broker_settings(url).with_connect_timeout(3)  # noqa: E731  (the App's 30 s, shortened)
    monkeypatch.setattr(app_module, "broker_settings", shorter)
    async with silent_node() as (port, _):
        app = App("silent", url=f"amqp://guest:{SECRET}@127.0.0.1:{port}/")
        app.job("mail", queue="urgent")(lambda p, c: None)  # the project's topology/
        try:
            started = time.monotonic()
            with pytest.raises(BrokerUnavailableError):
                await asyncio.wait_for(app.enqueue("mail", {}), 60)  # before: no end
            assert time.monotonic() - started <= 8
        finally:
            await app.close()


def test_consume_against_a_silent_node_exits_3_after_its_connect_timeout() -> None:
    async def run() -> tuple[int, str, float]:
        async with silent_node() as (port, _):
            down = broker_settings(f"amqp://guest:{SECRET}@127.0.0.1:{port}/", "http://127.0.0.1:9")
            started = time.monotonic()
            args = ("consume", "examples.shop:app", "--connect-timeout", "2s", "--queues", "urgent")
            done = await asyncio.to_thread(cli_subprocess, down, *args, timeout=60)
            return done.returncode, done.stdout + done.stderr, time.monotonic() - started

    code, output, took = asyncio.run(run())
    assert code == 3, output
    assert took <= 20, took  # a process start, one attempt of 2 s
    assert "unreachable after 2s" in output
    assert "no answer within 2s" in output
    assert SECRET not in output


@pytest.mark.broker
@pytest.mark.version_independent
@pytest.mark.serial  # a wall-clock bound
async def test_the_consoles_overview_over_a_silent_management_api_is_a_503_within_its_connect_wait(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """The management API's port accepts and never answers: the overview answers 503 within the console's
    connect wait (CONNECT_WAIT, 2 s a request), as a silent AMQP node is bounded, not after httpx's 10 s."""
    from tests.integration.console_env import client

    async with silent_node() as (port, accepted):
        silent = broker_settings(broker.url, f"http://guest:{SECRET}@127.0.0.1:{port}")
        took: dict[str, float] = {}
        codes: dict[str, int] = {}
        texts: dict[str, str] = {}

        def ask() -> None:
            with client(silent, tmp_path) as c:
                for path in ("/", "/fragments/overview"):
                    started = time.monotonic()
                    page = c.get(path)
                    took[path] = time.monotonic() - started
                    codes[path], texts[path] = page.status_code, page.text

        await asyncio.to_thread(ask)
    assert codes == {"/": 503, "/fragments/overview": 503}
    assert len(accepted) >= 1  # it did reach the silent API
    assert max(took.values()) <= 4.0, took  # one bounded request (2 s) and the page; before: 10 s each
    assert f"management API at http://127.0.0.1:{port} unreachable: no answer within 2s" in texts["/"]
    assert SECRET not in "".join(texts.values())


@pytest.mark.broker
@pytest.mark.serial  # a wall-clock bound
async def test_a_reconnect_to_a_node_gone_silent_is_bounded_by_the_attempt_timeout(broker: BrokerSettings) -> None:
    """The node is lost, and the reconnect meets a node that accepts and never answers: that attempt gives
    up after its bound (attempt_timeout of the connect timeout, 3 s here), and a later one gets through once
    the node answers again, instead of waiting for good on the silent socket."""
    node = urlsplit(broker.url)
    proxy = TcpProxy((node.hostname or "127.0.0.1", node.port or 5672))
    port = await proxy.start()
    via = urlunsplit(node._replace(netloc=f"{node.username}:{node.password}@127.0.0.1:{port}"))
    settings = broker_settings(via, broker.management_url).with_connect_timeout(3)
    connection = await connect(settings, name="through-the-proxy")
    try:
        assert connection.connected.is_set()
        proxy.silent = True
        proxy.cut()  # the connection is lost; its reconnect attempt meets the silent node
        await until_true(lambda: proxy.silent_accepted >= 1, 10)
        assert not connection.connected.is_set()
        cut_at = time.monotonic()
        await asyncio.sleep(1.0)
        proxy.silent = False  # the node answers again (new connections only: the stuck one stays silent)
        await asyncio.wait_for(connection.connected.wait(), 30)  # before: no end
        took = time.monotonic() - cut_at
        assert proxy.silent_closed >= 1  # the silent attempt was given up, not left hanging
        # one attempt of 3 s, aio-pika's reconnect interval (5 s), the next attempt: 8 s and a margin
        assert took <= 12, took
        channel = await connection.channel()  # and it works
        await channel.close()
    finally:
        await connection.close()
        await proxy.stop()


async def until_true(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
