"""An async handler cancelled at the stop's grace end that does not end: the worker does not wait for it forever.

``amqpjobs consume`` gives it :data:`~amqpjobs.runtime.stopping.CANCEL_BOUND` (1 s) after
its cancellation, then ends the process as for a stuck thread (exit 1, its delivery
unacked: redelivered); a :class:`Worker` awaited in-process keeps its connection (the
delivery unacked) until it ends. The stop lines count what became of each job cancelled
at the grace's end: redelivered, or settled by its own end (README "Workers").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.test_grace_threads import ended, log_of, worker
from tests.integration.test_worker_process import exit_code, publisher, read_record, wait_until
from tests.integration.test_worker_processes import wait_until_depth
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

STUCK_ENDS = (
    "1 async handler(s) still running 1s after their cancellation: the process ends at once, before its "
    "connection closes, so that none finishes beside its redelivery"
)


@pytest.mark.serial  # a wall-clock bound: A gone within grace + 1 s + a margin
@pytest.mark.timeout(120)
async def test_an_async_handler_ignoring_its_cancellation_ends_the_process_1s_after_the_grace(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: A logged the grace warning, then stayed up until the handler ended by itself (30 s here)."""
    app = await publisher(broker, tmp_path)
    app.job("stubborn", queue="work")(lambda p, c: None)  # same name as procapp's: only to publish
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "1", "--grace", "1s") as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("stubborn", {"seconds": 30}, job_id="deaf")
        await wait_until(lambda: any(r[0] == "start" for r in read_record(record)), 30, "run 1 to start")
        a.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await wait_until(lambda: ended(a.pid), 10, "A's process to end")
        gone = time.monotonic() - sent
        code = await exit_code(a)
    out = log_of(tmp_path, "a")
    assert code == 1, out
    assert gone < 1 + 1 + 0.8, f"A took {gone:.2f}s after the SIGTERM (grace 1s, bound 1s)"
    assert "1 job(s) still running after the grace period; they will be redelivered" in out, out
    assert STUCK_ENDS in out, out
    assert "worker stopped: 0 in-flight job(s) finished, 1 abandoned (redelivered); exit 1" in out, out
    assert [r for r in read_record(record) if r[0] == "cancelled"] == [["cancelled", "deaf", str(a.pid)]]
    await wait_until_depth(broker, "work", 1)  # back, unacked, with the connection
    with worker(broker, tmp_path, "b", "--concurrency", "1") as b:
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "done") == 1, 30, "run 2 to end")
        await asyncio.sleep(0.5)  # nothing more comes
        b.send_signal(signal.SIGTERM)
        assert await exit_code(b) == 0, log_of(tmp_path, "b")
    await app.close()
    runs = read_record(record)
    assert [r[:4] for r in runs if r[0] == "start"] == [["start", "deaf", "1", "0"], ["start", "deaf", "1", "1"]]
    assert [r for r in runs if r[0] == "done"] == [["done", "deaf", str(b.pid)]], runs  # run 1 died with A
    assert await depth(broker, "work") == 0


@pytest.mark.timeout(90)
async def test_the_stop_lines_count_a_cancelled_job_that_raised_as_retried_not_redelivered(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: "2 job(s) ...; they will be redelivered" and "2 abandoned (redelivered)", though the raiser's
    delivery was settled (a retry copy published, the original acked): only the sleeper's came back."""
    app = await publisher(broker, tmp_path)
    app.job("raiser", queue="work")(lambda p, c: None)
    record = tmp_path / "record.txt"
    with worker(broker, tmp_path, "a", "--concurrency", "2", "--grace", "1s") as a:
        await wait_until(lambda: "worker consuming" in log_of(tmp_path, "a"), 30, "A consuming")
        await app.enqueue("sleep", {"seconds": 30}, job_id="sleeper")
        await app.enqueue("raiser", {"seconds": 30}, job_id="raiser")
        await wait_until(lambda: sum(1 for r in read_record(record) if r[0] == "start") == 2, 30, "two starts")
        a.send_signal(signal.SIGTERM)
        code = await exit_code(a)
    await app.close()
    out = log_of(tmp_path, "a")
    assert code == 1, out
    assert "draining 2 in-flight job(s), grace 1s" in out, out
    assert ("2 job(s) still running after the grace period; cancelled: 1 will be redelivered, 1 ended anyway "
            "(1 retried)") in out, out  # fmt: skip
    assert "job=raiser id=raiser attempt=1" in out, out
    assert "outcome=retried next_attempt=2" in out, out
    assert ("worker stopped: 0 in-flight job(s) finished, 1 abandoned (redelivered), 1 ended after its "
            "cancellation (1 retried); exit 1") in out, out  # fmt: skip
    await wait_until_depth(broker, "work", 2)  # the sleeper's delivery, and the raiser's retry copy (200 ms tier)


@pytest.mark.timeout(60)
async def test_an_awaited_worker_keeps_the_delivery_of_an_async_handler_ignoring_its_cancellation_until_it_ends(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process (no hard exit), as for a thread: the connection stays open, the delivery unacked, until the
    run ends; then its own outcome is carried out (it ran to its end). Before: the same wait, but no line said so."""
    app = await make_app(broker, tmp_path)
    started, release = asyncio.Event(), asyncio.Event()
    ends: list[str] = []

    @app.job("deaf", queue="work")
    async def deaf(payload: dict[str, Any], ctx: JobContext) -> None:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        ends.append(ctx.job_id)

    caplog.set_level(logging.INFO, logger="amqpjobs")
    embedded = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=0.5))
    await embedded.start()
    await app.enqueue("deaf", {}, job_id="d1")
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.create_task(embedded.shutdown())
    try:
        await asyncio.sleep(2.5)  # the grace and the bound after the cancellation are over; the run goes on
        assert not stopping.done(), "the worker closed while the cancelled handler still ran"
        assert await depth(broker, "work") == 0  # unacked on the open connection: not back
        release.set()
        assert await asyncio.wait_for(stopping, 10) == 1
    finally:
        release.set()
        await app.close()
    assert ends == ["d1"]
    await asyncio.sleep(0.3)
    assert await depth(broker, "work") == 0  # it ended: its own outcome (succeeded) was carried out
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("amqpjobs")]
    assert "1 job(s) still running after the grace period; cancelled: 1 goes on regardless" in lines, lines
    assert (
        "1 async handler(s) still running 1s after their cancellation: the worker keeps its connection "
        "(their deliveries unacked) until they end, so that none finishes beside its redelivery"
    ) in lines, lines
    assert ("worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 ended after its "
            "cancellation (1 succeeded); exit 1") in lines, lines  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "thread"])
async def test_immediate_retries_never_run_a_job_again_after_its_cancellation_at_the_grace_end(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, is_async: bool
) -> None:
    """The stop's cancellation ends the run: no in-process retry (``immediate_retries``) starts it again.

    Before (helper-176): tenacity took the cancellation for a failure of the run and ran the
    handler again, after the stop: 2 starts; an async one held the stop 5.5 s, not 0.5 s, and
    its second run was acked "succeeded"; a thread's second run started when the first ended.
    """
    app = await make_app(broker, tmp_path)
    starts: list[str] = []

    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        starts.append(ctx.job_id)
        await asyncio.sleep(2)

    def slow_in_thread(payload: dict[str, Any], ctx: JobContext) -> None:
        starts.append(ctx.job_id)
        time.sleep(2)

    blips = RetryPolicy(immediate_retries=2, immediate_wait=0.01)
    app.job("slow", queue="work", retry=blips)(slow if is_async else slow_in_thread)
    caplog.set_level(logging.INFO, logger="amqpjobs")
    embedded = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=0.5))
    await embedded.start()
    try:
        await app.enqueue("slow", {}, job_id="s1")
        await wait_until(lambda: len(starts) == 1, 20, "the first start")
        sent = time.monotonic()
        await embedded.shutdown()
        took = time.monotonic() - sent
        await asyncio.sleep(2.5)  # a thread's run is over: a retry in process would have started by now
    finally:
        await app.close()
    assert starts == ["s1"]
    if is_async:
        assert took < 1.5, f"the stop took {took:.2f}s (grace 0.5s)"
    await wait_until_depth(broker, "work", 1)  # its delivery, back for another worker
    assert "outcome=succeeded" not in caplog.text
