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


@pytest.mark.parametrize("ends", ["inside the stop's grace", "after it"])
async def test_a_run_hung_past_its_grace_in_a_stop_asked_first_says_the_stop_was_asked_not_its_own(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, ends: str
) -> None:
    """A stop (``request_stop``, as SIGTERM) came while a thread ran past its timeout; the run then went past the grace.

    Timeout 1 s, grace 2 s: past the grace at 3 s. Stopped 1 s after the "passed its timeout" line (~2 s), the
    stop's grace ends at ~4 s: a run of 3.5 s ends inside it (judged by its result, exit 0 as any stop whose
    runs all ended), one of 6 s after it (abandoned, redelivered once its thread ended, exit 1).
    Before, every line said the worker stopped for the run
    ("so this worker stops", "after this worker began to stop for it ... as it stopped on its own", "(it
    stopped on its own for job ...)"), and a run the stop's grace abandoned was said to have "ended ...
    judged by its result (its outcome line follows)" with no outcome line after it, its thread still running.
    """
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")
    inside = ends == "inside the stop's grace"

    @app.job("slow", queue="work", timeout="1s")
    def slow(payload: dict[str, str], ctx: JobContext) -> str:
        time.sleep(3.5 if inside else 6)
        return "done"

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    running = asyncio.create_task(worker.run())
    try:
        await app.enqueue("slow", {}, job_id="first")
        while not any("plain-function handler passed its timeout" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        worker.request_stop()  # as SIGTERM does
        code = await asyncio.wait_for(running, 30)
        status = await app.job_status("first")
        left = await depth(broker, "work")
    finally:
        await app.close()
    assert code == (0 if inside else 1)  # the stop's own rule: 1 when a run was still going at its grace's end
    lines = [r.getMessage() for r in caplog.records if "first" in r.getMessage() or "worker stopped" in r.getMessage()]
    hung = [line for line in lines if "still runs 2s past its timeout" in line]
    assert len(hung) == 1, lines
    assert "holds a slot for good; this worker was asked to stop first: its process's stop waits" in hung[0], hung
    ended = [line for line in lines if "its run ended" in line]
    if inside:
        assert (status.state, left) == ("succeeded", 0)  # judged by its result, acked
        assert len(ended) == 1, lines
        assert ended[0].endswith("during this worker's stop (asked first): judged by its result (its outcome "
                                 "line follows)"), ended  # fmt: skip
        assert lines[-1] == "worker stopped: 1 in-flight job(s) finished, 0 abandoned (redelivered); exit 0", lines
    else:
        assert (status.state, left) == ("running", 1)  # abandoned: back in its queue for another worker
        assert ended == [], ended
        assert lines[-1].endswith(
            "0 in-flight job(s) finished, 1 abandoned (redelivered); exit 1 (asked to stop first; job slow id first "
            "went on past its timeout and the grace after it)"
        ), lines[-1]
