"""The worker's pure rules about a failed or unfinished delivery (README "Workers", "Retries").

How a handler's exception is classified, what a crashed job's error says, the headers of
the copies the worker republishes (retry tier, suspects queue / hand-back, quarantine) and
the failure record quarantine evidence is built from. No I/O: the worker
(:mod:`amqpjobs.runtime.deliveries`) carries them out.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Mapping
from typing import Any

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import crash, envelope
from amqpjobs.jobs.copy_headers import copy_headers
from amqpjobs.jobs.evidence import DEFAULT_BUDGET, Failure, evidence_headers
from amqpjobs.jobs.header_values import COUNT_MAX, read_text
from amqpjobs.jobs.outcome import Register, Reject, Retry, RetryLater, Skipped
from amqpjobs.jobs.quarantine import header_text
from amqpjobs.jobs.retry import FailureKind
from amqpjobs.redaction import redact_text
from amqpjobs.text import encodable

#: (error type, message, traceback) of no failure.
NO_ERROR: tuple[str, str, str] = ("", "", "")


def classify(permanent: tuple[type[BaseException], ...], exc: BaseException) -> FailureKind:
    """What kind of failure ``exc`` is, for a job whose ``RetryPolicy.permanent`` is ``permanent``.

    An exception group (an ``asyncio.TaskGroup``'s) is judged by the exceptions in it, at any
    depth: ``reject`` when one is a :class:`Reject`, else ``permanent`` when one is permanent,
    else ``timeout`` when all are timeouts, else ``error`` (unless the group's own class is
    listed in ``permanent``).
    """
    if isinstance(exc, BaseExceptionGroup) and not (permanent and isinstance(exc, permanent)):
        kinds = {classify(permanent, inner) for inner in exc.exceptions}
        final = next((kind for kind in ("reject", "permanent") if kind in kinds), None)
        return final or ("timeout" if kinds == {"timeout"} else "error")
    if isinstance(exc, Reject):
        return "reject"
    if isinstance(exc, Retry):
        return "retry"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConfigurationError):  # a misuse of ours (e.g. ctx.transaction()): no retry can fix it
        return "permanent"
    if permanent and isinstance(exc, permanent):
        return "permanent"
    return "error"


def framework_word(exc: BaseException, *, guarded: bool, found_done: bool) -> str | None:
    """What amqpjobs itself made of a run that raised ``exc``: ``skipped``, ``duplicate``, or None (README "Jobs").

    The one rule for the two exceptions of ours that are no failure. Only where amqpjobs
    speaks do they count: a :class:`~amqpjobs.jobs.outcome.Skipped` the overlap guard raised
    before its handler ran (``guarded``: the job's handler is the guard; ``exc.unrun``), and a
    ``DuplicateJobError`` the run's ``ctx.transaction()`` got from the ledger (``found_done``:
    the effect rolled back, whatever the handler raised with it, bare or in an exception group).
    The same classes raised by the handler itself (its own raise, a guarded function it
    awaited, a task of its ``asyncio.TaskGroup``, at any depth of a group) are its job's
    failure, judged by :func:`classify` as any other: an exception group is never a skip.

    Args:
        exc: What the run raised.
        guarded: The job's handler is the overlap guard (``overlap="skip"``).
        found_done: The run's ``ctx.transaction()`` found the job done by another run.

    Returns:
        ``"duplicate"``, ``"skipped"``, or None: a failure (or the run's stop, :func:`stops_the_run`).
    """
    if found_done:
        return "duplicate"
    if guarded and isinstance(exc, Skipped) and exc.unrun:
        return "skipped"
    return None


def qualname(exc: BaseException) -> str:
    """The exception's class as evidence names it: ``ValueError``, ``myapp.errors.Gone``."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def stops_the_run(exc: BaseException, cancelling: int, sigint_may_raise: bool) -> bool:
    """Whether ``exc``, out of a handler's run, ends the run instead of failing its job (README "Jobs").

    Only two things do: a ``CancelledError`` while the run's task is being cancelled
    (``cancelling``: its ``task.cancelling()``, above 0 when the worker cancels it at its
    grace's end), and a ``KeyboardInterrupt`` that may be a real Ctrl-C (``sigint_may_raise``:
    an async handler's, on a loop under Python's own SIGINT handler). Anything else the
    handler raises, of any class (``SystemExit``, ``GeneratorExit``, a ``CancelledError`` of
    its own, a library's ``BaseException`` subclass), is a failure of its job: retried, then
    quarantined, and the worker goes on.
    """
    if isinstance(exc, asyncio.CancelledError):
        return cancelling > 0
    return isinstance(exc, KeyboardInterrupt) and sigint_may_raise


def _rendered(exc: BaseException, how: str) -> str:
    """``how`` (``str`` or ``traceback``) of ``exc``, or a note saying why it could not be rendered."""
    try:
        return "".join(traceback.format_exception(exc)) if how == "traceback" else str(exc)
    except Exception as err:  # a __str__ or an argument's __repr__ that raises
        try:
            why = f"{qualname(err)}: {err}"
        except Exception:
            why = qualname(err)
        if how == "str":
            return f"(the message could not be rendered: str() raised {why})"
        return f"(the traceback could not be rendered: {why})"


def describe(exc: BaseException, by: str = "the handler") -> tuple[str, str, str]:
    """(error type, message, traceback) of a handler's exception, as every record of the failure shows them.

    Never raises: a message whose ``str()`` raises (the exception's ``__str__``, or the
    ``__repr__`` of one of its arguments) is a note saying so. A ``BaseException`` that is
    no ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, ...) says it was
    raised ``by`` that app code (the handler, or its payload model's validation).
    All three are :func:`amqpjobs.text.encodable` (a lone surrogate as ``?``), the one rule for
    evidence, events, logs, results and spans, and hold no URL's password
    (:func:`amqpjobs.redaction.redact_text`: an app's ``postgres://app:s3cret@db`` in its
    exception reads ``postgres://app:***@db`` in every record).

    Args:
        exc: The exception the handler raised (or that ended its run).
        by: Whose raise it was, in its message (``"its payload model's validation"``).

    Returns:
        ``("ValueError", "bad address", "Traceback (most recent call last): ...")``.

    """
    message = message_of(exc)
    if not isinstance(exc, Exception):
        message = (
            f"{type(exc).__name__}({message}) raised by {by}, not a signal to the worker: a failure of "
            "this job (the worker went on)"
        )
    return encodable(qualname(exc)), message, redact_text(encodable(_rendered(exc, "traceback")))


def message_of(exc: BaseException) -> str:
    """``str(exc)``, :func:`amqpjobs.text.encodable` and passwords redacted; never raises (a note if ``str()`` does)."""
    return redact_text(encodable(_rendered(exc, "str")))


def crash_error(job_queue: str, max_redeliveries: int, starts: int, headers: Mapping[str, Any]) -> tuple[str, str, str]:
    """The error of a job quarantined as ``crashed``: started ``starts`` times without an outcome."""
    last = (
        f"; the last start was registered by {header_text(headers.get(crash.LAST_START_HOST))} pid "
        f"{header_text(headers.get(crash.LAST_START_PID))} at {header_text(headers.get(crash.LAST_START_AT))}"
        if crash.LAST_START_HOST in headers
        else ""
    )
    why = (
        f"started {starts} time(s) without an outcome (job queue {job_queue!r} allows max_redeliveries "
        f"{max_redeliveries}): each time the worker died or was killed, its event loop was blocked "
        f"past the heartbeat timeout, its channel or connection closed before the ack, or the worker was "
        f"stopped (SIGTERM, a deploy) with the run still going past its --grace{last}"
    )
    return ("WorkerLostError", why, "")


def retry_headers(
    received: Mapping[str, Any],
    decision: RetryLater,
    runs: int,
    exchange: str,
    routing_key: str,
    now: str,
    *,
    timestamp: Any,
    job_id: str = "",
    key: bytes | None = None,
) -> dict[str, Any]:
    """Headers of the copy that goes to a retry tier (``attempt`` + 1, or the same attempt when it waits).

    ``timestamp``: the received ``timestamp`` property (:func:`~amqpjobs.jobs.copy_headers.copy_headers`).
    ``job_id`` and ``key`` (the ledger's): a waiting suspect's :data:`~amqpjobs.jobs.crash.WAITING_START`
    is sealed with them (:func:`~amqpjobs.jobs.crash.seal_waiting_start`).
    """
    headers = copy_headers(received, timestamp)
    if not decision.wait:  # an outcome was reached: the start count begins again
        for name in crash.START_HEADERS:
            headers.pop(name, None)
    headers.pop(crash.WAITING_START, None)
    if decision.wait and decision.start > 1:  # a suspect waits: registered again when it comes back
        headers[crash.WAITING_START] = crash.seal_waiting_start(key, job_id, decision.start)
    headers[envelope.ATTEMPT] = decision.next_attempt
    headers[envelope.RUNS] = runs
    if not decision.wait:
        headers.setdefault(envelope.FIRST_FAILURE_AT, now)
    # the copy comes back from the tier via the default exchange: keep where it first came from
    headers.setdefault(envelope.ORIGINAL_EXCHANGE, exchange)
    headers.setdefault(envelope.ORIGINAL_ROUTING_KEY, routing_key)
    return headers


def unstarted_headers(
    received: Mapping[str, Any],
    register: Register | None,
    work_queue: str,
    exchange: str,
    routing_key: str,
    host: str,
    pid: int,
    now: str,
    *,
    timestamp: Any,
) -> dict[str, Any]:
    """Headers of an unstarted copy: registered for its next start (``register``), or handed back.

    ``timestamp``: the received ``timestamp`` property (:func:`~amqpjobs.jobs.copy_headers.copy_headers`).
    """
    headers = copy_headers(received, timestamp)
    if register is not None:
        headers.pop(crash.WAITING_START, None)  # registered now: a suspect like any other
        headers[crash.STARTS] = register.start
        headers[crash.LAST_START_HOST] = host
        headers[crash.LAST_START_PID] = pid
        headers[crash.LAST_START_AT] = now
        headers[crash.WORK_QUEUE] = work_queue
        headers.setdefault(envelope.FIRST_FAILURE_AT, now)
    headers.setdefault(envelope.ORIGINAL_EXCHANGE, exchange)
    headers.setdefault(envelope.ORIGINAL_ROUTING_KEY, routing_key)
    return headers


def _text(value: Any, default: str) -> str:
    """A provenance header of ours as text (a byte array decoded); ``default`` when missing or of another type."""
    text = read_text(value)
    return default if text is None else text


def quarantine_headers(
    received: Mapping[str, Any],
    reason: str,
    error: tuple[str, str, str],
    runs: int,
    *,
    queue: str,
    exchange: str,
    routing_key: str,
    job: str,
    job_id: str,
    host: str,
    pid: int,
    version: str,
    app_version: str,
    now: str,
    timestamp: Any,
    budget: int = DEFAULT_BUDGET,
    counters: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Headers of the copy that goes to quarantine: the received ones plus the failure's evidence.

    ``runs`` is the handler runs so far; for ``crashed`` the starts without an outcome are
    counted in too. ``timestamp``: the received ``timestamp`` property
    (:func:`~amqpjobs.jobs.copy_headers.copy_headers`). ``budget``: the evidence's bytes
    (:func:`~amqpjobs.jobs.evidence.evidence_headers`). ``counters``: the broker's counters of the
    delivery (:func:`~amqpjobs.jobs.evidence.broker_counters`); None: it wrote none (both 0).
    """
    if reason == "crashed":  # every start of this attempt ended without an outcome
        runs = min(envelope.parse_runs(received) + crash.starts_of(received), COUNT_MAX)  # an AMQP integer
    error_type, error_message, tb = error
    failure = Failure(
        reason=reason,
        error_type=error_type,
        error_message=error_message,
        traceback=tb,
        attempts=runs,
        first_failure_at=_text(received.get(envelope.FIRST_FAILURE_AT), now) or now,  # text only: never a repr
        last_failure_at=now,
        host=host,
        pid=pid,
        version=version,
        app_version=app_version,
        exchange=_text(received.get(envelope.ORIGINAL_EXCHANGE), exchange),
        queue=queue,
        routing_key=_text(received.get(envelope.ORIGINAL_ROUTING_KEY), routing_key),
        job=job,
        job_id=job_id,
        tenant=envelope.tenant_in(received) or "",
        delivery_count=(counters or {}).get("delivery_count", 0),
        acquired_count=(counters or {}).get("acquired_count", 0),
    )
    headers = copy_headers(received, timestamp)
    headers[envelope.RUNS] = runs
    headers.update(evidence_headers(failure, budget))
    return headers
