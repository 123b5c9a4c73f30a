"""A plain function that ends past its timeout after its worker began to stop for it: one truth everywhere.

The worker waits the grace for a plain-function run past its timeout (a thread can't be
stopped), then stops: its process's end is what stops such a thread. A run that ends during
that stop's own grace did finish, its effect is done: it is judged by its result, so its
outcome line, its record and its ack all say ``succeeded``. The worker still exits 1: it
stopped on its own, and a supervisor (systemd ``Restart=on-failure``, ``--processes``) must
start another; exit 0 would read as "asked to stop, done".

Before, the three agreed (``outcome=succeeded``, record ``succeeded``, the message acked), but
the words around them did not: the ERROR said "its process's end stops the run, and the start
counts like a crash" (neither happened), and the last line was ``worker stopped: 1 in-flight
job(s) finished, 0 abandoned (redelivered); exit 1``, an exit 1 with no reason given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from amqpjobs import JobContext, SqliteResults, Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_a_plain_function_ending_during_the_stop_it_caused_is_succeeded_everywhere_and_the_exit_1_said(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")

    @app.job("slow", queue="work", timeout="1s")
    def slow(payload: dict[str, str], ctx: JobContext) -> str:
        time.sleep(4)  # 3 s past its timeout: 1 s after the worker stopped for it (grace 2 s), inside the stop's grace
        return "done"

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    running = asyncio.create_task(worker.run())
    try:
        await app.enqueue("slow", {}, job_id="late")
        code = await asyncio.wait_for(running, 30)
        status = await app.job_status("late")
    finally:
        await app.close()
    assert code == 1  # the worker stopped on its own: its supervisor starts another
    assert await depth(broker, "work") == 0  # acked: not redelivered
    assert status.state == "succeeded"
    assert status.value() == "done"
    lines = [r.getMessage() for r in caplog.records if "late" in r.getMessage() or "worker stopped" in r.getMessage()]
    assert lines[1].startswith("job slow id late: plain-function handler still runs 2s past its timeout of 1s")
    assert lines[1].endswith(
        "so this worker stops (exit 1, for its supervisor to start another): its process's stop waits up to its "
        "grace for the other runs only, then ends with this one, whose start counts like a crash; if it ends "
        "before, it is judged by its result"
    )
    assert lines[2].startswith("job slow id late: its run ended 3.0s past its timeout of 1s, after this worker began")
    assert lines[2].endswith(
        "to stop for it: judged by its result (its outcome line follows); the worker still exits 1, as it stopped "
        "on its own"
    )
    assert "outcome=succeeded" in lines[3]
    assert lines[4] == (
        "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered); exit 1 (it stopped on its own "
        "for job slow id late, past its timeout; that run then ended, judged by its result)"
    )


async def test_an_async_run_catching_its_cancellation_and_ending_in_the_stop_it_caused_is_a_timeout_and_said(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")

    @app.job("stubborn", queue="work", timeout="1s")
    async def stubborn(payload: dict[str, str], ctx: JobContext) -> str:
        ends = time.monotonic() + 5  # cancelled at 1 s, counted at 2 s, stops its worker at 4 s (grace 2 s)
        while time.monotonic() < ends:
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue  # swallowed, every time
        return "done"

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    running = asyncio.create_task(worker.run())
    try:
        await app.enqueue("stubborn", {}, job_id="late")
        code = await asyncio.wait_for(running, 30)
        status = await app.job_status("late")
    finally:
        await app.close()
    assert code == 1
    lines = [r.getMessage() for r in caplog.records if "late" in r.getMessage() or "worker stopped" in r.getMessage()]
    ended = [line for line in lines if "its run ended" in line]
    assert len(ended) == 1, lines
    assert "after this worker began to stop for it: a timeout, its result not used" in ended[0]
    outcome = next(line for line in lines if "outcome=" in line)
    assert "outcome=retried" in outcome, lines
    assert "error_type=TimeoutError" in outcome or "timeout" in outcome, outcome
    assert status.state == "retrying", status.state  # the record says what the outcome line says
    assert lines[-1].endswith(
        "exit 1 (it stopped on its own for job stubborn id late, past its timeout; that run then ended, a timeout, "
        "its result not used)"
    )
