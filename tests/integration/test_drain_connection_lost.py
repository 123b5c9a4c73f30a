"""A stop whose consumer connection is lost during the drain (README "Workers": SIGTERM; a node stopping).

Before, the jobs that finished during the drain but whose channel was gone (``ack_uncertain``:
not acked, the broker redelivers them) were counted as finished and the worker exited 0:
``worker stopped: 2 in-flight job(s) finished, 0 abandoned (redelivered); exit 0``, against
its promise (exit 0: every in-flight handler finished and was acked). Seen with a 3.10 node
stopped during a drain. Now they are named and the exit is 1.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_reconnect import cut_off, fast_reconnect
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker


async def test_jobs_finished_after_their_channel_closed_in_a_drain_are_not_acked_and_exit_1(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, "amqpjobs.worker")
    app = await make_app(broker, tmp_path)
    release = asyncio.Event()
    started: list[str] = []

    @app.job("slow", queue="work")
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        started.append(ctx.job_id)
        await release.wait()

    for i in range(2):
        await app.enqueue("slow", {}, job_id=f"drained-{i}")
    recorder = Recorder()
    worker = Worker(app, fast_reconnect(broker), WorkerOptions(queues=("work",), concurrency=2, grace=20), recorder)
    running = asyncio.create_task(worker.run())
    while len(started) < 2:
        await asyncio.sleep(0.05)
    worker.request_stop()  # the drain waits for both
    await asyncio.sleep(0.3)
    async with cut_off(broker, "test-worker"):  # the consumer connection lost, its reconnects refused
        await asyncio.sleep(0.5)
        release.set()  # both finish now: their channel is gone
        code = await asyncio.wait_for(running, 30)
    await app.close()
    kinds = sorted(o.kind for o in recorder.outcomes)
    assert kinds == ["ack_uncertain", "ack_uncertain"], kinds
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worker stopped")]
    assert stopped == [
        "worker stopped: 2 in-flight job(s) finished, 2 of them not acked (their channel closed: the broker "
        "redelivers them), 0 abandoned (redelivered); exit 1"
    ], stopped
    assert code == 1
    await asyncio.sleep(1)
    assert await depth(broker, "work") == 2  # both back on the queue, nothing lost
