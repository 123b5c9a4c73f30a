"""A handler that raises ``asyncio.CancelledError`` itself (not a stopping worker's cancellation) fails its job.

An inner task's cancellation, ``asyncio.timeout`` misused, a library raising it: the worker
took it for its own stop and re-raised it, so the delivery was neither acked nor handed back
and, with concurrency 1, the worker took nothing more.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.version_independent


async def test_a_handlers_own_cancelled_error_is_its_failure_and_the_worker_goes_on(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    app = await make_app(broker, tmp_path)
    runs: list[tuple[str, int]] = []

    @app.job("cancelled", queue="work")
    async def cancelled(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner  # raises CancelledError in this task, which nobody cancelled

    @app.job("ok", queue="work")
    async def ok(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))

    async with running_worker(app, broker) as (_, recorder):
        await app.enqueue("cancelled", {}, job_id="c-1")
        await app.enqueue("ok", {}, job_id="ok-1")
        await recorder.wait_for(lambda o: any(x.job_id == "c-1" and x.kind == "quarantined" for x in o), timeout=30)
        await recorder.wait_for(lambda o: any(x.job_id == "ok-1" for x in o), timeout=10)
    await app.close()
    kinds = [(o.job_id, o.attempt, o.kind) for o in recorder.outcomes]
    assert ("ok-1", 1, "succeeded") in kinds
    assert [k for k in kinds if k[0] == "c-1"][-1][2] == "quarantined"
    failed = next(o for o in recorder.outcomes if o.job_id == "c-1")
    assert failed.failure[0] == "asyncio.exceptions.CancelledError"
    assert await depth(broker, "work.quarantine") == 1
