"""The console's server-sent events (``/events``): one broker subscription at most, gone with its readers.

A user found that each ``/events`` client left a connection named ``amqpjobs-quarantine``
(and its exclusive queue) open after it left: 10 ``curl -m1`` left 10. And with the broker
down, each request logged a traceback instead of answering 503 as the other pages do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import aio_pika
import httpx
import pytest

from amqpjobs.jobs.events import OutcomeEvent
from amqpjobs.runtime.outcome_feed import BACKLOG, OutcomeHub
from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.console_env import client, free_port, serve_console
from tests.integration.helpers import raw_channel
from tests.integration.test_reconnect import connections, force_close
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

NAME = "amqpjobs-quarantine"


def wait_count(broker: BrokerSettings, predicate: object, seconds: float = 10) -> int:
    """Poll the management API until the number of ``NAME`` connections on the test's vhost satisfies ``predicate``."""
    deadline = time.monotonic() + seconds
    while True:
        n = len(connections(broker, NAME))
        if predicate(n) or time.monotonic() > deadline:  # type: ignore[operator]
            return n
        time.sleep(0.25)


def test_sse_clients_that_leave_leave_no_connection_behind(broker: BrokerSettings, tmp_path: Path):
    asyncio.run(make_app(broker, tmp_path))  # the events exchange exists
    with serve_console(broker, tmp_path) as base:
        before = len(connections(broker, NAME))
        with httpx.Client(base_url=base, timeout=5) as http:
            streams = [http.stream("GET", "/events") for _ in range(5)]
            responses = [s.__enter__() for s in streams]
            assert [r.status_code for r in responses] == [200] * 5
            assert all(r.headers["content-type"].startswith("text/event-stream") for r in responses)
            during = wait_count(broker, lambda n: n > before)
            for s in streams:
                s.__exit__(None, None, None)
        after = wait_count(broker, lambda n: n == before)
        log = (tmp_path / "console.log").read_text()
    assert before == 0
    assert after == 0, f"{after} connection(s) named {NAME} left open after the clients left"
    assert during == 1  # one subscription shared by the five readers
    assert "Traceback" not in log, log


def test_events_with_the_broker_down_is_a_503_without_a_traceback(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    port = free_port()  # nothing listens there
    down = broker_settings(f"amqp://ops:pw-sekret@127.0.0.1:{port}/", f"http://ops:pw-sekret@127.0.0.1:{port}")
    with caplog.at_level(logging.ERROR), client(down, tmp_path) as c:
        answer = c.get("/events")
    assert answer.status_code == 503
    assert f"127.0.0.1:{port}" in answer.text
    assert "pw-sekret" not in answer.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_events_with_the_broker_down_fail_fast(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """Each new ``/events`` waited out the whole connect timeout (30 s) before its 503.

    The subscription tries for a short while (its 503 says so), and a failure just seen is
    answered again for a few seconds without trying: the second request makes no attempt.
    """
    port = free_port()  # nothing listens there
    down = broker_settings(f"amqp://ops:pw@127.0.0.1:{port}/", f"http://ops:pw@127.0.0.1:{port}")
    assert down.connect_timeout == 30
    with caplog.at_level(logging.WARNING, logger="amqpjobs.wire"), client(down, tmp_path) as c:
        first = c.get("/events")
        attempts = len(caplog.records)
        second = c.get("/events")
    assert (first.status_code, second.status_code) == (503, 503)
    assert "unreachable after 2s" in first.text, first.text
    assert "unreachable after 2s" in second.text, second.text
    assert attempts >= 1
    assert len(caplog.records) == attempts, caplog.text  # the second one tried nothing


def _publish_events(broker: BrokerSettings, stop: threading.Event) -> None:
    """Publish an outcome event every 0.3 s until ``stop``."""

    async def run() -> None:
        async with raw_channel(broker) as channel:
            exchange = await channel.get_exchange(EVENTS_EXCHANGE)
            n = 0
            while not stop.is_set():
                n += 1
                event = OutcomeEvent("mail", f"e-{n}", 1, "succeeded", "", "", "work")
                await exchange.publish(aio_pika.Message(event.encode()), routing_key="work.succeeded")
                await asyncio.sleep(0.3)

    asyncio.run(run())


def test_events_go_on_after_the_broker_closed_the_subscription(broker: BrokerSettings, tmp_path: Path):
    """The shared subscription's connection closed from the broker side: a connected client hears new events."""
    asyncio.run(make_app(broker, tmp_path))  # the events exchange exists
    with serve_console(broker, tmp_path) as base, httpx.Client(base_url=base, timeout=10) as http:
        with http.stream("GET", "/events") as stream:
            assert stream.status_code == 200
            assert wait_count(broker, lambda n: n == 1) == 1
            asyncio.run(force_close(broker, NAME))
            assert wait_count(broker, lambda n: n == 0) == 0
            stop = threading.Event()
            publisher = threading.Thread(target=_publish_events, args=(broker, stop), daemon=True)
            publisher.start()
            try:
                seen = ""
                deadline = time.monotonic() + 30
                for line in stream.iter_lines():
                    if line.startswith("data:") or time.monotonic() > deadline:
                        seen = line
                        break
            finally:
                stop.set()
                publisher.join(10)
        log = (tmp_path / "console.log").read_text()
    assert seen.startswith("data:"), f"no event after the connection was closed; console log:\n{log}"
    assert json.loads(seen.removeprefix("data:")) == {"queue": "work", "outcome": "succeeded"}
    assert "Traceback" not in log, log


async def _publish_bodies(broker: BrokerSettings, bodies: list[bytes]) -> None:
    async with raw_channel(broker) as channel:
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        for body in bodies:
            await exchange.publish(aio_pika.Message(body), routing_key="work.succeeded")


def _event(n: int) -> bytes:
    return OutcomeEvent("mail", f"e-{n}", 1, "succeeded", "", "", "work").encode()


def test_a_slow_reader_keeps_the_newest_events_and_no_body_that_is_no_event(broker: BrokerSettings, tmp_path: Path):
    """A reader that never reads keeps the last BACKLOG events; a body that is no event reaches nobody."""

    async def run() -> list[str]:
        await make_app(broker, tmp_path)  # the events exchange exists
        hub = OutcomeHub(broker)
        reader = await hub.join()
        try:
            await _publish_bodies(broker, [b"not an event", b'{"no": "outcome"}'])
            await _publish_bodies(broker, [_event(n) for n in range(BACKLOG + 5)])
            deadline = time.monotonic() + 10
            while reader.qsize() < BACKLOG and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(1)  # the last few deliveries, if any, drop the oldest in turn
            return [reader.get_nowait().id for _ in range(reader.qsize())]
        finally:
            await hub.close()

    ids = asyncio.run(run())
    assert len(ids) == BACKLOG
    assert (ids[0], ids[-1]) == ("e-5", f"e-{BACKLOG + 4}")


def test_closing_the_hub_with_a_reader_left_closes_its_connection(broker: BrokerSettings, tmp_path: Path):
    """The console shutting down while a client still reads: the subscription's connection goes at once."""

    async def run() -> tuple[int, int, bool]:
        await make_app(broker, tmp_path)
        hub = OutcomeHub(broker)
        reader = await hub.join()
        during = await asyncio.to_thread(wait_count, broker, lambda n: n == 1)
        await hub.close()
        after = await asyncio.to_thread(wait_count, broker, lambda n: n == 0)
        hub.leave(reader)  # the reader's own leave, after the close, changes nothing
        again = await hub.join()  # and a new reader opens a new subscription
        opened = await asyncio.to_thread(wait_count, broker, lambda n: n == 1) == 1
        hub.leave(again)
        return during, after, opened

    assert asyncio.run(run()) == (1, 0, True)
