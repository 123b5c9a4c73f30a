"""The worker's pure rules (amqpjobs.jobs.failure, amqpjobs.jobs.retry.retry_window), as tables."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs import crash, envelope, evidence
from amqpjobs.jobs.failure import (
    classify,
    crash_error,
    describe,
    qualname,
    quarantine_headers,
    retry_headers,
    stops_the_run,
    unstarted_headers,
)
from amqpjobs.jobs.outcome import Register, Reject, Retry, RetryLater, handed_back_note
from amqpjobs.jobs.retry import FailureKind, retry_window


class Gone(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "permanent", "kind"),
    [
        (Reject("no"), (), "reject"),
        (Retry(), (), "retry"),
        (TimeoutError(), (), "timeout"),
        (ConfigurationError("misuse"), (), "permanent"),
        (Gone(), (Gone,), "permanent"),
        (Gone(), (KeyError,), "error"),
        (ValueError(), (), "error"),
        (Reject("first"), (Reject,), "reject"),
        # an asyncio.TaskGroup's ExceptionGroup: judged by what is in it (helper-176: always "error")
        (ExceptionGroup("g", [ValueError(), Reject("no")]), (), "reject"),
        (ExceptionGroup("g", [ValueError(), ExceptionGroup("inner", [Gone()])]), (Gone,), "permanent"),
        (ExceptionGroup("g", [Gone(), Reject("no")]), (Gone,), "reject"),
        (ExceptionGroup("g", [TimeoutError(), TimeoutError()]), (), "timeout"),
        (ExceptionGroup("g", [TimeoutError(), Retry()]), (), "error"),
        (ExceptionGroup("g", [ValueError()]), (ExceptionGroup,), "permanent"),
        (BaseExceptionGroup("g", [KeyboardInterrupt(), ConfigurationError("misuse")]), (), "permanent"),
    ],
)
def test_classify(exc: BaseException, permanent: tuple[type[BaseException], ...], kind: FailureKind) -> None:
    assert classify(permanent, exc) == kind


def test_qualname() -> None:
    assert qualname(ValueError()) == "ValueError"
    assert qualname(Gone()) == f"{__name__}.Gone"


@pytest.mark.parametrize(
    ("tiers", "attempts", "window"),
    [((), 1, 0), ((5.0,), 1, 0), ((5.0,), 3, 10.0), ((1.0, 10.0, 60.0), 4, 71.0), ((1.0, 10.0), 5, 31.0)],
)
def test_retry_window(tiers: tuple[float, ...], attempts: int, window: float) -> None:
    assert retry_window(tiers, attempts) == window


def test_crash_error_names_the_last_start() -> None:
    headers = {crash.LAST_START_HOST: b"host-a", crash.LAST_START_PID: 42, crash.LAST_START_AT: "2026-11-30T10:00:00Z"}
    kind, why, tb = crash_error("work", 2, 3, headers)
    assert (kind, tb) == ("WorkerLostError", "")
    assert why.startswith("started 3 time(s) without an outcome (job queue 'work' allows max_redeliveries 2)")
    assert why.endswith("; the last start was registered by host-a pid 42 at 2026-11-30T10:00:00Z")
    assert "registered by" not in crash_error("work", 2, 3, {})[1]
    # helper-231: a run abandoned at the end of a stop's grace counts too; the evidence names that cause
    assert "or the worker was stopped (SIGTERM, a deploy) with the run still going past its --grace" in why


RECEIVED: dict[str, Any] = {
    "x-death": [{}],
    "x-first-death-queue": "w",
    crash.STARTS: 2,
    crash.WORK_QUEUE: "w.s1",
    envelope.TENANT: "acme",
}


@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        (
            RetryLater(next_attempt=2, tier=0, delay=5.0),
            {envelope.ATTEMPT: 2, envelope.RUNS: 1, envelope.FIRST_FAILURE_AT: "NOW", envelope.TENANT: "acme"},
        ),
        (
            RetryLater(next_attempt=1, tier=0, delay=5.0, wait=True),  # waits for a claim: starts kept
            {envelope.ATTEMPT: 1, envelope.RUNS: 1, crash.STARTS: 2, crash.WORK_QUEUE: "w.s1", envelope.TENANT: "acme"},
        ),
    ],
)
def test_retry_headers(decision: RetryLater, expected: dict[str, Any]) -> None:
    headers = retry_headers(RECEIVED, decision, 1, "jobs", "rk", "NOW", timestamp=None)
    assert headers == {**expected, envelope.ORIGINAL_EXCHANGE: "jobs", envelope.ORIGINAL_ROUTING_KEY: "rk"}


def test_unstarted_headers() -> None:
    handed_back = unstarted_headers(RECEIVED, None, "w.s1", "jobs", "rk", "h", 7, "NOW", timestamp=None)
    assert handed_back == {
        crash.STARTS: 2, crash.WORK_QUEUE: "w.s1", envelope.TENANT: "acme",
        envelope.ORIGINAL_EXCHANGE: "jobs", envelope.ORIGINAL_ROUTING_KEY: "rk",
    }  # fmt: skip
    registered = unstarted_headers(RECEIVED, Register(3), "w.s0", "jobs", "rk", "h", 7, "NOW", timestamp=None)
    assert registered == {
        crash.STARTS: 3, crash.LAST_START_HOST: "h", crash.LAST_START_PID: 7, crash.LAST_START_AT: "NOW",
        crash.WORK_QUEUE: "w.s0", envelope.FIRST_FAILURE_AT: "NOW", envelope.TENANT: "acme",
        envelope.ORIGINAL_EXCHANGE: "jobs", envelope.ORIGINAL_ROUTING_KEY: "rk",
    }  # fmt: skip


@pytest.mark.parametrize(("reason", "runs"), [("exhausted", 3), ("crashed", 0 + 2)])
def test_quarantine_headers(reason: str, runs: int) -> None:
    headers = quarantine_headers(
        RECEIVED, reason, ("ValueError", "bad", "tb"), 3, queue="w", exchange="jobs", routing_key="rk",
        job="send", job_id="id-1", host="h", pid=7, version="0.1.0", app_version="", now="NOW", timestamp=None,
    )  # fmt: skip
    assert "x-death" not in headers
    assert headers[envelope.RUNS] == runs
    assert headers[evidence.REASON] == reason
    assert headers[evidence.ERROR_TYPE] == "ValueError"
    assert headers[evidence.ATTEMPTS] == runs
    assert headers[evidence.ORIGINAL_QUEUE] == "w"
    assert headers[envelope.FIRST_FAILURE_AT] == "NOW"
    assert headers[envelope.TENANT] == "acme"


@pytest.mark.parametrize(
    ("handed", "waiting", "note"),
    [
        (0, 0, ""),
        (1, 1, ", 1 waiting for a token handed back unstarted"),
        (3, 0, ", 3 handed back unstarted"),
        (2, 1, ", 2 handed back unstarted (1 waiting for a token)"),
    ],
)
def test_the_stop_line_counts_deliveries_handed_back_apart_from_jobs(handed: int, waiting: int, note: str) -> None:
    assert handed_back_note(handed, waiting) == note


@pytest.mark.parametrize(
    ("headers", "runs"),
    [
        ({}, 0),
        ({envelope.RUNS: 2, envelope.ATTEMPT: 3}, 2),  # as the worker writes it: one run per attempt moved
        ({envelope.RUNS: 99}, 0),  # another publisher's count on a first attempt
        ({envelope.RUNS: 99, envelope.ATTEMPT: 2}, 1),
        ({envelope.RUNS: 1, envelope.ATTEMPT: 4}, 1),  # fewer runs than attempts: a store error moved it on
        ({envelope.RUNS: -3, envelope.ATTEMPT: 4}, 0),
        ({envelope.RUNS: "x", envelope.ATTEMPT: 4}, 0),
    ],
)
def test_a_runs_count_is_believed_up_to_the_attempt_less_one(headers: dict[str, Any], runs: int) -> None:
    assert envelope.parse_runs(headers) == runs


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(("exc", "expected"), [
    (ValueError("bad address"), ("ValueError", "bad address")),
    (Gone("gone"), (f"{__name__}.Gone", "gone")),
    (BadStr("x"), (f"{__name__}.BadStr", "(the message could not be rendered: str() raised RuntimeError: no text)")),
    (ValueError(Unprintable(), 2),
     ("ValueError", "(the message could not be rendered: str() raised RuntimeError: no repr)")),
    (ValueError("/data/\udcff.csv"), ("ValueError", "/data/?.csv")),
    (SystemExit(3), ("SystemExit", "SystemExit(3) raised by the handler, not a signal to the worker: a failure of this "
                                   "job (the worker went on)")),
    (KeyboardInterrupt(), ("KeyboardInterrupt", "KeyboardInterrupt() raised by the handler, not a signal to the "
                                                "worker: a failure of this job (the worker went on)")),
], ids=["plain", "own-class", "raising-str", "raising-repr", "surrogate", "sysexit", "interrupt"])  # fmt: skip
def test_describe_never_raises_and_gives_encodable_text(exc: BaseException, expected: tuple[str, str]) -> None:
    try:
        raise exc
    except BaseException as raised:  # with a traceback, as a handler's exception has one
        error_type, message, tb = describe(raised)
    assert (error_type, message) == expected
    assert tb.startswith("Traceback (most recent call last):")
    tb.encode("utf-8")  # every part can go on the wire
    assert classify((), exc) == "error" or isinstance(exc, ValueError | Gone)


class Unwind(BaseException):
    pass


@pytest.mark.parametrize(
    ("exc", "cancelling", "sigint_may_raise", "stops"),
    [
        (asyncio.CancelledError(), 1, False, True),  # the worker's cancel at its grace's end
        (asyncio.CancelledError(), 0, False, False),  # the handler's own raise (helper-176: it wedged the slot)
        (KeyboardInterrupt(), 0, True, True),  # maybe a real Ctrl-C (embedded, Python's own SIGINT handler)
        (KeyboardInterrupt(), 0, False, False),
        (GeneratorExit(), 1, True, False),
        (SystemExit(3), 1, True, False),
        (Unwind(), 0, True, False),
        (ValueError("x"), 1, True, False),
    ],
)
def test_only_the_workers_cancel_or_a_maybe_real_ctrl_c_stops_a_run(
    exc: BaseException, cancelling: int, sigint_may_raise: bool, stops: bool
) -> None:
    assert stops_the_run(exc, cancelling, sigint_may_raise) is stops
