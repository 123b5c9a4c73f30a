"""A small job app over a fast topology, and a worker running in the test's event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.worker import Outcome, Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings

FAST_TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
max_priority = 5
retry_tiers = ["200ms", "400ms", "600ms"]

[[job_queue]]
name = "ghost"
exchange = "jobs"
"""
# "ghost" is in the topology the app reads, but tests apply only "work" (see below), so
# enqueueing to it meets a broker without that queue.
APPLIED_TOPOLOGY = FAST_TOPOLOGY.split('[[job_queue]]\nname = "ghost"')[0]


async def make_app(broker: BrokerSettings, tmp_path: Path, tracing: bool = False) -> App:
    """Apply the fast topology to the test vhost and return an App reading it (``tracing``: ``App(tracing=)``)."""
    applied = tmp_path / "applied.toml"
    applied.write_text(APPLIED_TOPOLOGY)
    await apply_topology(applied, broker)
    full = tmp_path / "app.toml"
    full.write_text(FAST_TOPOLOGY)
    return App("test", topology=load_topology(full).topology, app_version="9.9.9", url=broker.url, tracing=tracing)


@dataclass
class Recorder:
    """Collects worker outcomes so tests can wait for counts."""

    outcomes: list[Outcome] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.changed.set()

    async def wait_for(self, predicate: Callable[[list[Outcome]], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.outcomes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met; outcomes so far: {len(self.outcomes)}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                continue


@asynccontextmanager
async def running_worker(
    app: App, broker: BrokerSettings, concurrency: int = 1, queues: tuple[str, ...] = ("work",)
) -> AsyncIterator[tuple[Worker, Recorder]]:
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=queues, concurrency=concurrency, grace=10), recorder)
    await worker.start()
    try:
        yield worker, recorder
    finally:
        await worker.shutdown()
