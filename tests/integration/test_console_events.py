"""The console's server-sent events (``/events``): one broker subscription at most, gone with its readers.

A user found that each ``/events`` client left a connection named ``amqpjobs-quarantine``
(and its exclusive queue) open after it left: 10 ``curl -m1`` left 10. And with the broker
down, each request logged a traceback instead of answering 503 as the other pages do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
import pytest

from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.console_env import client, free_port, serve_console
from tests.integration.test_reconnect import connections
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
