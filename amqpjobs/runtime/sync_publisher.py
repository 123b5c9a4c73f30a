"""Enqueueing from synchronous code: :class:`SyncPublisher` (``App.sync_publisher()``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from amqpjobs.errors import PublisherClosedError
from amqpjobs.jobs.results import JobStatus

if TYPE_CHECKING:  # the app makes these (App.sync_publisher): no import of app at run time
    from amqpjobs.runtime.app import App, JobRef

T = TypeVar("T")


def _call_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run ``coro`` as a task on ``loop`` (another thread's) and return its result, waiting ``timeout`` seconds.

    What ``asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)`` does, with one lock
    instead of a ``concurrent.futures.Future`` (its condition variable and chained callbacks):
    a sync enqueue pays this hand-off once per job.

    Raises:
        TimeoutError: no outcome within ``timeout`` (the task goes on, as run_coroutine_threadsafe's would).
        concurrent.futures.CancelledError: the task was cancelled.
        RuntimeError: ``loop`` is closed.
        (Else whatever ``coro`` raised.)
    """
    done = threading.Lock()
    done.acquire()
    outcome: list[asyncio.Future[T]] = []

    def finished(task: asyncio.Future[T]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here: a task that outlived the timeout logs nothing
        outcome.append(task)
        done.release()

    def start() -> None:
        try:
            task: asyncio.Future[T] = loop.create_task(coro)
        except BaseException as exc:  # handed to the caller, as run_coroutine_threadsafe would
            failed: asyncio.Future[T] = loop.create_future()
            failed.set_exception(exc)
            task = failed
        task.add_done_callback(finished)

    loop.call_soon_threadsafe(start)
    if not done.acquire(timeout=timeout):
        raise TimeoutError(f"no outcome within {timeout:g}s")
    if outcome[0].cancelled():  # an Exception, as run_coroutine_threadsafe's future raised (asyncio's is not)
        raise concurrent.futures.CancelledError()
    return outcome[0].result()


class SyncPublisher:
    """Enqueue from synchronous code: runs the app's async publisher on a private event loop thread.

    Thread-safe; use as a context manager or call :meth:`close`. ``enqueue`` takes the same
    arguments and raises the same errors as :meth:`App.enqueue`; every call after :meth:`close`
    (the ``with`` block's end) raises :class:`~amqpjobs.errors.PublisherClosedError`.

    When ``app`` routes its enqueues to a publisher on a given loop (``App.use_publisher(...,
    loop=...)``, as :class:`amqpjobs.testing.TestBroker` does), it is a blocking facade over
    ``app.enqueue`` run on that loop: nothing connects, ``url`` is ignored.
    """

    def __init__(self, app: App, url: str | None = None) -> None:
        routed = app._publisher_loop
        self._owned = routed is None
        self._closed = False
        if routed is not None:
            self._app, self._loop = app, routed
            self._thread: threading.Thread | None = None
            return
        self._app = app.for_another_loop(url)
        self._loop = asyncio.new_event_loop()
        self._thread = thread = threading.Thread(
            target=self._loop.run_forever, name="amqpjobs-sync-publisher", daemon=True
        )
        thread.start()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        if self._closed:
            coro.close()
            raise PublisherClosedError(
                "this SyncPublisher is closed (its with block ended, or close() was called): nothing was sent; "
                "make the calls inside the with block, or create another with app.sync_publisher()"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError(
                "SyncPublisher called from its event loop's own thread would wait for itself forever; "
                "in async code use await app.enqueue(...)"
            )
        return _call_on(self._loop, coro, timeout)

    def enqueue(
        self,
        job: JobRef,
        payload: Any,
        *,
        job_id: str | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> str:
        """Blocking :meth:`App.enqueue`; returns the job id once the broker confirmed."""
        waits = self._app.blocked_timeout + self._app.queue_full_wait  # the enqueue's own waits come first
        return self._run(
            self._app.enqueue(job, payload, job_id=job_id, priority=priority, tenant=tenant, headers=headers),
            60.0 + waits,
        )

    def job_status(self, job_id: str) -> JobStatus:
        """Blocking :meth:`App.job_status` (same answers and errors)."""
        return self._run(self._app.job_status(job_id))

    def close(self) -> None:
        """Close the connection and stop the loop thread (a facade over another loop: nothing to close)."""
        if not self._owned or self._closed:
            return
        self._run(self._app.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
