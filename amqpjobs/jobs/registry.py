"""The job registry: job definitions declared with a decorator (no I/O)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from amqpjobs.durations import parse_duration
from amqpjobs.errors import ConfigurationError, InvalidPayloadError
from amqpjobs.jobs.app_name import app_name_problem, job_name_problem
from amqpjobs.jobs.breaker import Breaker, breaker_name_problem
from amqpjobs.jobs.json_values import TOO_DEEP
from amqpjobs.jobs.rate import RateLimit, parse_rate_limit
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.printable import listed
from amqpjobs.topology.naming import rate_names_problem

#: An app's name when none is given (``App()``): every app left unnamed in a vhost shares the
#: names keyed by it (its ledger marker, its scheduler's queues).
DEFAULT_APP_NAME = "amqpjobs"


H = TypeVar("H", bound=Callable[..., Any])


def handler_problem(name: str, handler: object) -> str | None:
    """Why the worker can't call ``handler`` as ``handler(payload, ctx)`` (job ``name``), or None when it can.

    The worker calls every handler with two positional arguments (README "Jobs"); a handler that
    can't take them would fail every run (retried, then quarantined ``exhausted``). A callable
    without a signature Python can read (some builtins) is taken as is.
    """
    if not callable(handler):
        return f"job {name!r}: the handler must be callable (got {type(handler).__name__} {handler!r:.60})"
    if isinstance(handler, functools.partial):
        called = f"partial({getattr(handler.func, '__name__', type(handler.func).__name__)}, ...)"
    else:
        called = getattr(handler, "__name__", type(handler).__name__)
    if any(is_(handler) or is_(_call_of(handler)) for is_ in (inspect.isgeneratorfunction, inspect.isasyncgenfunction)):
        return (
            f"job {name!r}: the handler {called} is a generator function (it has a yield): calling it runs none of "
            "its body; fix: return a value instead of yielding it"
        )
    try:  # the signature the worker calls: a decorator's wrapper's own, not the function it wraps
        signature = inspect.signature(handler, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None)
    except TypeError as exc:
        example = called if called.isidentifier() else "handler"
        return (
            f"job {name!r}: the worker calls its handler as handler(payload, ctx), and {called}{signature} can't be "
            f"called so ({exc}); fix: take two parameters, e.g. async def {example}(payload, ctx)"
        )
    return None


def _call_of(handler: object) -> object:
    """The ``__call__`` of a callable object (None for a function or method: theirs is not the code run)."""
    if inspect.isfunction(handler) or inspect.ismethod(handler):
        return None
    return getattr(type(handler), "__call__", None)  # noqa: B004 (its code, not whether it has one)


def is_coroutine_handler(handler: object) -> bool:
    """Whether calling ``handler`` returns a coroutine to await.

    True for an ``async def`` (a partial or bound method of one too) and an object whose ``__call__`` is one.
    """
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(_call_of(handler))


@dataclass(frozen=True)
class JobContext:
    """What a handler knows about the delivery it runs for.

    Attributes:
        job: Job name.
        job_id: Job id (``message_id``; assigned by the worker when the publisher sent none).
        attempt: This run's attempt number (1-based).
        max_attempts: Attempts the job gets before quarantine.
        tenant: Tenant key, or None.
        queue: The work queue the delivery came from.
        redelivered: The broker's ``redelivered`` flag (the delivery may have run before).
        enqueued_at: When the job was first enqueued (UTC), when known.
        headers: The message's headers as received, read-only (a mapping proxy in a worker: the job's
            retry copies and evidence are made of them, so a handler can't change them).

    """

    job: str
    job_id: str
    attempt: int
    max_attempts: int
    tenant: str | None
    queue: str
    redelivered: bool
    enqueued_at: datetime | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    ledger_transaction: Callable[[], AbstractContextManager[Any]] | None = None

    def transaction(self) -> AbstractContextManager[Any]:
        """A transaction of the idempotency ledger's database that also marks this job done.

        Put the side effect in it when it lives in that database (inbox pattern): the
        effect and the done-mark commit together, so a crash can't leave one without the
        other, and a second run's effect is rolled back (``DuplicateJobError``, counted as
        a duplicate). SQLite: a ``sqlite3.Connection``; PostgreSQL: a psycopg connection.
        For plain-function handlers (the connections are synchronous), or code an async
        handler runs in a thread (``asyncio.to_thread``).

        Raises:
            ConfigurationError: the job is not declared ``idempotent=True``; or it is called on
                the event loop (an ``async def`` handler): its database calls would block every
                other job of the worker, and its timeout could not cut it off.
        """
        if self.ledger_transaction is None:
            raise ConfigurationError(f"job {self.job!r}: transaction() needs @app.job(..., idempotent=True)")
        if _on_event_loop():
            raise ConfigurationError(
                f"job {self.job!r}: ctx.transaction() was called on the event loop (an async def handler); its "
                "database calls block, stopping every other job of the worker: make the handler a plain def (it "
                "runs in a thread), or run that part with asyncio.to_thread"
            )
        return self.ledger_transaction()


def _on_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class JobDef:
    """A registered job.

    Attributes:
        name: Job name (the message's ``type``).
        queue: Name of the job queue (from the topology) its messages go to.
        handler: ``async def handler(payload, ctx)`` or a plain function (run in a thread).
        payload_model: Pydantic model the payload is validated against, or None for a
            plain ``dict`` payload.
        retry: Retry policy.
        timeout: Seconds a run may take before it is cancelled (a transient failure with
            reason ``timeout``), or None for no limit.
        idempotent: Gate the effect on the idempotency ledger (claim before, done after).
        key: Derives the job id (the idempotency key) from the validated payload when
            ``enqueue`` gets no ``job_id``.
        lease: Seconds a claim holds before another worker may take it over; None: the
            worker's default (:func:`amqpjobs.runtime.worker_config.default_lease`). Given
            without a ``timeout``, the worker times the job out at half of it.
        breaker: Its circuit breaker (:mod:`amqpjobs.jobs.breaker`), or None.
        rate_limit: At most that many starts per period across the app's workers, or None
            (README "Flow control" -> "Rate limits").

    """

    name: str
    queue: str
    handler: Callable[..., Any]
    payload_model: type[BaseModel] | None
    retry: RetryPolicy
    timeout: float | None
    idempotent: bool = False
    key: Callable[[Any], str] | None = None
    lease: float | None = None
    breaker: Breaker | None = None
    rate_limit: RateLimit | None = None

    @cached_property
    def is_async(self) -> bool:
        """True when the handler is a coroutine function (read once: it is on every job's path)."""
        return is_coroutine_handler(self.handler)

    def validate(self, payload: Any) -> Any:
        """Validate ``payload`` (dict or model instance) into what the handler receives.

        Raises:
            pydantic.ValidationError: the payload does not fit the model.

        """
        if self.payload_model is None:
            if isinstance(payload, BaseModel):
                return payload.model_dump(mode="json")
            return payload
        if isinstance(payload, self.payload_model):
            return payload
        if isinstance(payload, BaseModel):
            payload = payload.model_dump(mode="json")
        return self.payload_model.model_validate(payload)

    def to_json(self, payload: Any) -> dict[str, Any]:
        """Validate ``payload`` and return its JSON-ready dict form."""
        value = self.validate(payload)
        if isinstance(value, BaseModel):
            try:
                return value.model_dump(mode="json")
            except ValueError as exc:  # pydantic-core's recursion guard, past 255 levels
                if "serialization depth" not in str(exc):
                    raise
                raise ConfigurationError(f"job {self.name!r}: {TOO_DEEP}") from None
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"job {self.name!r}: payload must be a dict or a pydantic model (got {type(value).__name__})"
            )
        return value

    def payload_body(self, payload: Any) -> dict[str, Any]:
        """:meth:`to_json` for a publish: a payload that fails the job's model is :class:`InvalidPayloadError`.

        Raises:
            InvalidPayloadError: with pydantic's errors (``errors``, no URLs) and the job's name.
            ConfigurationError: the payload is neither a dict nor a pydantic model.
        """
        try:
            return self.to_json(payload)
        except ValidationError as exc:
            raise InvalidPayloadError(
                self.name,
                [dict(e) for e in exc.errors(include_url=False)],
                f"payload for job {self.name!r} is invalid: {exc}",
            ) from None


class JobRegistry:
    """Holds job definitions by name.

    Args:
        name: The application's name (used in logs and connection names).
        app_version: Your application's version, written into evidence headers.

    Raises:
        ConfigurationError: ``name`` is not one (:func:`app_name_problem`).

    """

    def __init__(self, name: str = DEFAULT_APP_NAME, *, app_version: str = "") -> None:
        if (problem := app_name_problem(name)) is not None:
            raise ConfigurationError(problem)
        self.name = name
        self.app_version = app_version
        self._jobs: dict[str, JobDef] = {}

    def job(
        self,
        name: str,
        *,
        queue: str,
        payload: type[BaseModel] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | str | None = None,
        idempotent: bool = False,
        key: Callable[[Any], str] | None = None,
        lease: float | str | None = None,
        breaker: Breaker | None = None,
        rate_limit: str | None = None,
    ) -> Callable[[H], H]:
        """Register the decorated function as job ``name``.

        Args:
            name: Job name, 1-255 UTF-8 bytes (sent as the AMQP ``type`` property, a shortstr).
            queue: Job queue name from the topology.
            payload: Pydantic model for the payload; None accepts any JSON object.
            retry: Retry policy; default :class:`RetryPolicy` ().
            timeout: Seconds (or a duration string such as ``"30s"``) per run, or None.
            idempotent: Run the effect at most once per job id, through the app's ledger
                (README "Idempotency").
            key: Function of the validated payload giving the job id, e.g.
                ``lambda p: f"charge:{p.order_id}"``.
            lease: How long a claim holds (seconds or duration); default twice the
                timeout, at least the timeout plus twice the worker's grace plus 5 s (a thread
                past its timeout goes on that long), at least 60 s (for a job without
                ``timeout``: from the worker's default timeout, just below ``consumer_timeout``;
                :func:`amqpjobs.runtime.worker_config.default_lease`). Must exceed the run time:
                given without ``timeout``, the job's timeout is half the lease, for a plain
                function at most the lease less twice the grace and 5 s (at most the worker's
                default; :func:`amqpjobs.runtime.worker_config.lease_timeout`), so a claim never
                ends under a run still going.
            breaker: A circuit breaker shared by all the app's workers (README "Flow
                control"), e.g. ``Breaker(failures=20, window="1m", cool_down="30s")``.
            rate_limit: ``"<count>/s"``, ``"/m"`` or ``"/h"``: at most that many starts per
                period across every worker process of the app, at most count + 1 in any
                window of one period (README "Flow control" -> "Rate limits"); None: no limit.

        Returns:
            A decorator that registers the handler and returns it unchanged.

        Raises:
            ConfigurationError: a job of that name exists, or an argument is invalid (``idempotent``
                not a bool included).

        """
        if problem := job_name_problem(name):
            raise ConfigurationError(problem)
        if name in self._jobs:
            raise ConfigurationError(f"job {name!r} is registered twice")
        if not isinstance(idempotent, bool):  # "false" from a config file is true
            raise ConfigurationError(
                f"job {name!r}: idempotent must be True or False (got {type(idempotent).__name__} {idempotent!r})"
            )
        try:
            seconds = None if timeout is None else parse_duration(timeout)
        except ValueError as exc:
            raise ConfigurationError(f"job {name!r}: timeout: {exc}") from None

        try:
            hold = parse_duration(lease) if lease is not None else None  # None: the worker's default_lease
        except ValueError as exc:
            raise ConfigurationError(f"job {name!r}: lease: {exc}") from None
        if seconds is not None and hold is not None and hold <= seconds:
            raise ConfigurationError(f"job {name!r}: lease {hold:g}s must be longer than the timeout {seconds:g}s")
        rate = None if rate_limit is None else parse_rate_limit(rate_limit, name)
        if rate is not None and (problem := rate_names_problem(queue, name)):
            raise ConfigurationError(f"job {name!r}: {problem}")

        if breaker is not None and (problem := breaker_name_problem(queue, name, breaker)):
            raise ConfigurationError(problem)

        def register(handler: H) -> H:
            if problem := handler_problem(name, handler):
                raise ConfigurationError(problem)
            policy = retry or RetryPolicy()
            self._jobs[name] = JobDef(
                name, queue, handler, payload, policy, seconds, idempotent, key, hold, breaker, rate
            )
            return handler

        return register

    def get(self, name: str) -> JobDef | None:
        """The job called ``name``, or None."""
        return self._jobs.get(name)

    def resolve(self, job: str | Callable[..., Any] | JobDef) -> JobDef:
        """Find a job by name, by its handler function, or return a JobDef as is.

        Raises:
            ConfigurationError: no such job.

        """
        if isinstance(job, JobDef):
            return job
        if isinstance(job, str):
            found = self._jobs.get(job)
        else:
            found = next((j for j in self._jobs.values() if j.handler is job), None)
        if found is None:
            raise ConfigurationError(f"no job {job!r} in app {self.name!r}; registered: {listed(self._jobs)}")
        return found

    def __iter__(self) -> Iterator[JobDef]:
        return iter(self._jobs.values())

    def queues(self) -> list[str]:
        """Job queue names used by the registered jobs, sorted."""
        return sorted({j.queue for j in self._jobs.values()})
