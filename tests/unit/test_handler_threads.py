"""HandlerThreads: which plain-function handler threads run, and the stop's rule for those past the grace."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from amqpjobs.runtime import handler_threads
from amqpjobs.runtime.handler_threads import HandlerThreads


class Ended(Exception):
    """Stands for os._exit in these tests."""


async def test_a_cancelled_runs_thread_counts_until_it_returns() -> None:
    threads = HandlerThreads()
    threads.open(2, "t")
    go = threading.Event()
    future = threads.run(go.wait, 10)
    assert threads.running == 1
    future.cancel()  # the task awaiting it was cancelled: the thread runs on
    await asyncio.sleep(0.05)
    assert threads.running == 1
    go.set()
    for _ in range(100):
        if threads.running == 0:
            break
        await asyncio.sleep(0.01)
    assert threads.running == 0
    threads.close()


async def test_before_close_in_process_returns_once_the_threads_ended(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    threads = HandlerThreads()
    threads.open(1, "t")
    go = threading.Event()
    threads.run(go.wait, 10).cancel()
    closing = asyncio.create_task(threads.before_close(False, "worker stopped: ...; exit 1"))
    await asyncio.sleep(0.2)
    assert not closing.done()  # the thread runs: the connection must stay open
    go.set()
    await asyncio.wait_for(closing, 5)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "1 plain-function handler thread(s) still running can't be stopped: the worker keeps its connection "
        "(their deliveries unacked) until they end, so that none finishes beside its redelivery"
    )
    assert lines[1].startswith("the handler thread(s) ended after 0.")
    assert len(lines) == 2  # the stopped line is the worker's to log, after it closed
    threads.close()


async def test_before_close_with_no_thread_running_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(code: int) -> None:
        raise AssertionError("ended the process with no thread running")

    monkeypatch.setattr(handler_threads, "end_process", never)
    threads = HandlerThreads()
    threads.open(1, "t")
    assert await threads.run(lambda: 7) == 7
    await asyncio.wait_for(threads.before_close(True, "worker stopped"), 1)
    threads.close()


async def test_before_close_owning_the_process_logs_the_stop_lines_then_ends_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="amqpjobs")
    codes: list[int] = []

    def end(code: int) -> None:
        codes.append(code)
        raise Ended

    monkeypatch.setattr(handler_threads, "end_process", end)
    threads = HandlerThreads()
    threads.open(1, "t")
    go = threading.Event()
    threads.run(go.wait, 10).cancel()
    try:
        with pytest.raises(Ended):
            await threads.before_close(True, "worker stopped: 0 in-flight job(s) finished, 1 abandoned; exit 1")
    finally:
        go.set()
        threads.close()
    assert codes == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "1 plain-function handler thread(s) still running can't be stopped: the process ends at once, before its "
        "connection closes, so that no abandoned thread finishes beside its redelivery",
        "worker stopped: 0 in-flight job(s) finished, 1 abandoned; exit 1",
    ]


def test_a_run_before_open_is_refused() -> None:
    with pytest.raises(RuntimeError, match="the worker has not started"):
        HandlerThreads().run(print)
