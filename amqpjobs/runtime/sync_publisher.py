"""Enqueueing from synchronous code: :class:`SyncPublisher` (``App.sync_publisher()``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from amqpjobs.errors import BrokerBlockedError, BrokerError, PublisherClosedError, PublishError, QueueFullError
from amqpjobs.jobs.results import JobStatus
from amqpjobs.runtime.sending import REFUSED
from amqpjobs.runtime.sync_fast import FastPath
from amqpjobs.wire.held_publishes import HELD_WAIT

if TYPE_CHECKING:  # the app makes these (App.sync_publisher): no import of app at run time
    from amqpjobs.runtime.app import App, JobRef

T = TypeVar("T")


def _call_on(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float,
    refusal: Sequence[BaseException] = (),
) -> T:  # fmt: skip
    """Run ``coro`` as a task on ``loop`` (another thread's) and return its result, waiting ``timeout`` seconds.

    What ``asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)`` does, with one lock
    instead of a ``concurrent.futures.Future`` (its condition variable and chained callbacks):
    a sync enqueue pays this hand-off once per job. Once ``refusal`` holds an exception, a
    ``coro`` not yet started when the loop comes to it is closed unrun and that exception raised.

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
            if refusal:  # the publisher is closing: this call never started, so nothing was sent
                coro.close()
                raise refusal[0]
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


_CLOSED = (
    "this SyncPublisher is closed (its with block ended, or close() was called): nothing was sent; "
    "make the calls inside the with block, or create another with app.sync_publisher()"
)


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop and wait for them: a loop stopped with tasks pending logs each."""
    this = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not this]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class SyncPublisher:
    """Enqueue from synchronous code: from the calling thread where it can, else on a private event loop thread.

    Once its first call connected the app and read the broker's alarms, ``enqueue`` publishes
    from the calling thread on pooled blocking connections (:class:`~amqpjobs.runtime.sync_fast.FastPath`,
    which says when it steps aside); else it runs ``App.enqueue`` on the publisher's loop thread.

    Thread-safe; use as a context manager or call :meth:`close`. ``enqueue`` takes the same
    arguments and raises the same errors as :meth:`App.enqueue`; every call after :meth:`close`
    begins (the ``with`` block's end) raises :class:`~amqpjobs.errors.PublisherClosedError` at
    once, with nothing sent. Calls already in flight when it begins finish first (README
    "Enqueueing"): :meth:`close` waits for them, up to its ``timeout``.

    When ``app`` routes its enqueues to a publisher on a given loop (``App.use_publisher(...,
    loop=...)``, as :class:`amqpjobs.testing.TestBroker` does), it is a blocking facade over
    ``app.enqueue`` run on that loop: nothing connects, ``url`` is ignored.
    """

    def __init__(self, app: App, url: str | None = None) -> None:
        routed = app._publisher_loop
        self._owned = routed is None
        self._closed = False  # set first thing in close(): no call is admitted after it
        self._in_flight = 0  # calls admitted and not yet answered; close() waits for none
        self._lock = threading.Lock()  # guards the two above
        self._idle = threading.Condition(self._lock)
        self._refusal: list[BaseException] = []  # once set, a call the loop had not started is refused unrun
        self._cut: float | None = None  # close()'s wait, when it ran out with calls still in flight
        self._fast: FastPath | None = None  # publishing from the calling thread (runtime/sync_fast.py)
        if routed is not None:
            self._app, self._loop = app, routed
            self._thread: threading.Thread | None = None
            return
        self._app = app.for_another_loop(url)
        self._loop = asyncio.new_event_loop()
        self._fast = FastPath(self._app, self._loop)
        self._thread = thread = threading.Thread(
            target=self._loop.run_forever, name="amqpjobs-sync-publisher", daemon=True
        )
        thread.start()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
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
        try:
            self._admit()
        except PublisherClosedError:
            coro.close()
            raise
        try:
            return _call_on(self._loop, coro, timeout, self._refusal)
        except RuntimeError:
            if not self._loop.is_closed():
                raise
            coro.close()  # the loop never got it: nothing was sent
            raise PublisherClosedError(_CLOSED) from None
        finally:
            self._done()

    def _admit(self) -> None:
        """Count a call in flight (:meth:`close` waits for it); PublisherClosedError once close began."""
        with self._lock:
            if self._closed and self._owned:
                raise PublisherClosedError(_CLOSED)
            self._in_flight += 1

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._closed and not self._in_flight:
                self._idle.notify_all()

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
        """Blocking :meth:`App.enqueue`; returns the job id once the broker confirmed.

        Raises:
            PublisherClosedError: :meth:`close` had begun (nothing sent).
            PublishError: besides :meth:`App.enqueue`'s: no answer within its own waits plus 60 s,
                or :meth:`close` ran out of time and closed the connection under it; either way
                it may or may not be stored.
            (Else the errors of :meth:`App.enqueue`.)
        """
        waits = self._app.blocked_timeout + self._app.queue_full_wait  # the enqueue's own waits come first
        limit = 60.0 + waits
        try:
            if self._fast is not None:
                self._admit()
                try:
                    sent = self._fast.enqueue(job, payload, job_id, priority, tenant, headers)
                finally:
                    self._done()
                if sent is not None:
                    return sent
            return self._run(
                self._app.enqueue(job, payload, job_id=job_id, priority=priority, tenant=tenant, headers=headers),
                limit,
            )
        except TimeoutError as exc:
            raise PublishError(f"{_job(job_id)} got no answer within {limit:g}s; it may or may not be stored") from exc
        except (BrokerError, PublishError, concurrent.futures.CancelledError) as exc:
            if self._cut is None or isinstance(exc, (REFUSED, BrokerBlockedError, QueueFullError)):
                raise
            raise PublishError(
                f"this SyncPublisher closed before the broker confirmed {_job(job_id)}: close() waited "
                f"{self._cut:g}s for the calls in flight, then closed the connection; it may or may not be stored"
            ) from exc

    def job_status(self, job_id: str) -> JobStatus:
        """Blocking :meth:`App.job_status` (same answers and errors)."""
        return self._run(self._app.job_status(job_id))

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new calls, wait for those in flight, then close the connection and stop the loop thread.

        From its first line every new call raises :class:`~amqpjobs.errors.PublisherClosedError`
        (nothing sent). Calls in flight get their answers; after ``timeout`` seconds (default
        30, the publisher confirm's own wait) the connection is closed under those still
        waiting, and each raises ``PublishError`` saying the job may or may not be stored.
        While a resource alarm blocks the app's connection, the app's rule applies (``App.close``:
        up to 5 s for it to clear, then a reset and a WARNING naming the jobs it held).
        Closing it again does nothing; a facade over another loop (``amqpjobs.testing``) has
        nothing to close.

        Raises:
            BrokerError: the app's close had no outcome within 35 s (never seen; the words say what to check).
        """
        with self._lock:
            if not self._owned or self._closed:
                return
            self._closed = True
            if not self._idle.wait_for(lambda: not self._in_flight, timeout):
                self._cut = timeout
        self._refusal.append(PublisherClosedError(_CLOSED))  # an admitted call the loop has not started: never sent
        if self._fast is not None:
            self._fast.close(cut=self._cut is not None)
        try:
            _call_on(self._loop, self._app.close(), HELD_WAIT + 30.0)  # bounded under an alarm: App.close's rule
        except TimeoutError as exc:
            raise BrokerError(
                f"this SyncPublisher's close: the app's close (its `queued` records, stores and connection) had no "
                f"outcome within {HELD_WAIT + 30.0:g}s, so its connection was left to the process's exit; a job whose "
                "enqueue raised PublishError may or may not be stored: enqueue it again only if a 2nd copy is harmless"
            ) from exc
        finally:
            with contextlib.suppress(Exception):  # whatever is left: answered (cancelled), not left pending
                _call_on(self._loop, _cancel_the_rest(), 10.0)
            with self._lock:
                self._idle.wait_for(lambda: not self._in_flight, 5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _job(job_id: str | None) -> str:
    return "the job" if job_id is None else f"job {job_id!r}"
