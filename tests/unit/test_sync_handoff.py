"""The sync publisher's hand-off (:func:`~amqpjobs.runtime.sync_publisher._call_on`) answers as before.

Its callers (``SyncPublisher.enqueue``, ``job_status``, ``close``) relied on
``asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)``: the coroutine's result or
exception in the calling thread, ``TimeoutError`` past the timeout, and a cancelled task as
``concurrent.futures.CancelledError`` (an ``Exception``, unlike asyncio's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from amqpjobs.runtime.sync_publisher import _call_on


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, name="loop-thread", daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def test_the_result_and_the_exception_reach_the_calling_thread(loop: asyncio.AbstractEventLoop) -> None:
    async def where() -> str:
        return threading.current_thread().name

    async def fail() -> None:
        raise KeyError("job")

    assert _call_on(loop, where(), 5) == "loop-thread"
    with pytest.raises(KeyError, match="job"):
        _call_on(loop, fail(), 5)


def test_past_the_timeout_it_raises_timeout_error(loop: asyncio.AbstractEventLoop) -> None:
    went_on = threading.Event()

    async def slow() -> None:
        await asyncio.sleep(0.2)
        went_on.set()

    with pytest.raises(TimeoutError, match=r"no outcome within 0\.05s"):
        _call_on(loop, slow(), 0.05)
    assert went_on.wait(5)  # the task goes on, as run_coroutine_threadsafe's did


def test_a_cancelled_task_is_a_concurrent_futures_cancelled_error(loop: asyncio.AbstractEventLoop) -> None:
    async def cancelled() -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        await asyncio.sleep(1)

    with pytest.raises(concurrent.futures.CancelledError) as caught:
        _call_on(loop, cancelled(), 5)
    assert isinstance(caught.value, Exception)  # an except Exception in the caller's code still catches it


def test_once_refused_a_call_the_loop_had_not_started_is_closed_unrun(loop: asyncio.AbstractEventLoop) -> None:
    ran = threading.Event()

    async def send() -> None:
        ran.set()

    refusal: list[BaseException] = [LookupError("closing: nothing was sent")]
    with pytest.raises(LookupError, match="closing: nothing was sent"):
        _call_on(loop, send(), 5, refusal)
    assert not ran.is_set()  # and no "coroutine was never awaited": it was closed
