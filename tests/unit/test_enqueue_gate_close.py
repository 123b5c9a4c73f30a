"""The enqueue gate's management API clients end with it, also while a read runs in a thread.

An enqueue cancelled while it waits for the broker's alarms leaves the read going in its
thread (``asyncio.to_thread`` can't stop a thread), and an enqueue that entered an old gate
before a reconnect replaced it may still ask it. Neither may leave an HTTP client open nor
close one under a request (CI once showed an unclosed socket of the management API).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import pytest

from amqpjobs.runtime import shared_clients
from amqpjobs.runtime.backpressure import EnqueueGate
from amqpjobs.wire.settings import broker_settings


class FakeClient:
    """Stands in for ManagementClient: ``alarms()`` waits for ``answer`` and records misuse."""

    made: ClassVar[list[FakeClient]] = []
    answer = threading.Event()
    asking = threading.Event()

    def __init__(self, settings: Any, timeout: float | None = None) -> None:
        self.closed = False
        self.closed_while_asked = False
        self.in_request = False
        FakeClient.made.append(self)

    def alarms(self) -> list[str]:
        self.in_request = True
        FakeClient.asking.set()
        try:
            FakeClient.answer.wait(10)
            if self.closed:
                self.closed_while_asked = True
            return []
        finally:
            self.in_request = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.made = []
    FakeClient.answer = threading.Event()
    FakeClient.asking = threading.Event()
    monkeypatch.setattr(shared_clients, "ManagementClient", FakeClient)
    return FakeClient


def gate() -> EnqueueGate:
    settings = broker_settings("amqp://guest:guest@127.0.0.1:5672/", "http://127.0.0.1:15672")
    return EnqueueGate(settings, blocked_timeout=1.0, full_wait=0.0)


async def until_asked(fake: type[FakeClient]) -> None:
    assert await asyncio.to_thread(fake.asking.wait, 5), "the read never reached the client"


async def test_a_client_in_a_cancelled_read_is_closed_once_its_request_ends(fake: type[FakeClient]):
    the_gate = gate()
    read = asyncio.ensure_future(the_gate.read_ahead(object()))  # type: ignore[arg-type]
    await until_asked(fake)
    read.cancel()  # an enqueue cancelled while it waited for the alarms: the thread goes on
    with pytest.raises(asyncio.CancelledError):
        await read
    await the_gate.aclose()
    (client,) = fake.made
    assert not client.closed  # not under its request
    fake.answer.set()
    for _ in range(100):
        if client.closed:
            break
        await asyncio.sleep(0.02)
    assert client.closed  # by the thread, once it ended
    assert not client.closed_while_asked


async def test_a_closed_gate_asks_no_more_and_makes_no_client(fake: type[FakeClient]):
    the_gate = gate()
    fake.answer.set()
    await the_gate.read_ahead(object())  # type: ignore[arg-type]
    the_gate.close()
    assert [c.closed for c in fake.made] == [True]
    the_gate._alarms = ([], float("-inf"))  # as if REFRESH old: the next enqueue would read
    await the_gate.read_ahead(object())  # type: ignore[arg-type]  # an enqueue that entered before a reconnect
    assert [c.closed for c in fake.made] == [True]  # no new client left open
    assert the_gate.known_alarms()[0] == []
