"""Many enqueues at once on one App: those that find the connection's write queue full wait their turn.

aiormq's connection has a write queue of 10 frames; ``asyncio.gather`` of 2,000 enqueues
(the README's batched enqueue) fills it at once. A publish that finds it full must not be
queued behind a close it could cross (``wire/publish.py`` ``heard_close``), so it waits for
room itself. Waiting is in turn: the publish first in line is woken when the writer has taken
the queue's frames, the others sleep behind it. Before, every waiting publish polled every
millisecond: about 15 loop timers per publish for 2,000 gathered (150,000 for 10,000), the
CPU the batched enqueue of ``bench/`` lost against raw aio-pika (0.73x there).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
"""
N = 2_000


async def test_gathered_enqueues_wait_for_room_in_turn_not_by_polling(broker: BrokerSettings, tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App("room", topology=load_topology(path).topology, url=broker.url)
    app.job("one", queue="work")(lambda p, c: None)
    await app.enqueue("one", {"i": -1}, job_id="warm-up")  # connection, channel and exchange check done
    loop = asyncio.get_running_loop()
    timers = 0
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return call_at(when, callback, *args, context=context)

    loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
    try:
        await asyncio.gather(*(app.enqueue("one", {"i": i}, job_id=f"j{i}") for i in range(N)))
    finally:
        del loop.call_at  # the instance attribute: the class's method again
        await app.close()
    stored = [str(m.message_id) for m in await drain(broker, "work")]
    assert len(stored) == N + 1
    assert sorted(stored) == sorted(["warm-up", *(f"j{i}" for i in range(N))])
    # aiormq arms one timer per publish (its confirm timeout); waiting for room adds at most a few per batch
    assert timers < 1.5 * N, f"{timers} loop timers for {N} publishes: waiting publishes poll"
