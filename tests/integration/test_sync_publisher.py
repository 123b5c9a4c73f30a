"""What ``App.sync_publisher()`` promises on the real broker: thread-safe, and every enqueue error as ``App.enqueue``'s.

README "Enqueueing" (from synchronous code). The sync publisher hands each call to its
private event loop thread; these tests hold that hand-off to the async enqueue's promises:
a confirmed job id per call from many threads at once, and the same errors (returned,
missing exchange, too large, nacked at ``max_length``) raised in the calling thread.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from amqpjobs import App
from amqpjobs.errors import MessageTooLargeError, PublisherClosedError, QueueFullError, UnroutableError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"

[[job_queue]]
name = "capped"
exchange = "jobs"
max_length = 1
"""
UNAPPLIED = '\n[[exchange]]\nname = "later"\n\n[[job_queue]]\nname = "unapplied"\nexchange = "later"\n'


async def make(broker: BrokerSettings, tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    full = tmp_path / "app.toml"
    full.write_text(TOPOLOGY + UNAPPLIED)
    app = App("sync", topology=load_topology(full).topology, url=broker.url)
    app.job("work", queue="work")(lambda p, c: None)
    app.job("cap", queue="capped")(lambda p, c: None)
    app.job("early", queue="unapplied")(lambda p, c: None)
    return app


async def test_many_threads_enqueue_at_once_each_job_confirmed_once(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)
    ids: list[str] = []
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def publish_from_threads() -> None:
        with app.sync_publisher() as pub:

            def one_thread(t: int) -> None:
                start.wait()
                try:
                    ids.extend(pub.enqueue("work", {"t": t, "i": i}, job_id=f"t{t}-{i}") for i in range(25))
                except BaseException as exc:  # the test's assertion names it
                    failures.append(exc)

            threads = [threading.Thread(target=one_thread, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)

    await asyncio.to_thread(publish_from_threads)
    assert failures == []
    assert sorted(ids) == sorted(f"t{t}-{i}" for t in range(4) for i in range(25))
    assert sorted(str(m.message_id) for m in await drain(broker, "work")) == sorted(ids)


async def test_the_enqueue_errors_reach_the_calling_thread(broker: BrokerSettings, tmp_path: Path):
    app = await make(broker, tmp_path)

    def publish() -> list[str]:
        seen = []
        with app.sync_publisher() as pub:
            with pytest.raises(UnroutableError, match="exchange 'later' does not exist: apply the topology"):
                pub.enqueue("early", {})
            with pytest.raises(MessageTooLargeError, match="over the connection's frame_max of 131072 bytes"):
                pub.enqueue("work", {}, headers={"note": "x" * 140_000})
            seen.append(pub.enqueue("cap", {}, job_id="first"))  # the channel the 404 closed was replaced
            with pytest.raises(QueueFullError, match="work queue 'capped' is full: the broker nacked job 'second'"):
                pub.enqueue("cap", {}, job_id="second")
            seen.append(pub.enqueue("work", {}, job_id="after"))
        with pytest.raises(PublisherClosedError):
            pub.enqueue("work", {})
        return seen

    assert await asyncio.to_thread(publish) == ["first", "after"]
    assert await depth(broker, "capped") == 1
    assert [m.message_id for m in await drain(broker, "work")] == ["after"]
