"""Handler failures that are odd but still handler failures (real broker).

An exception whose text can't be rendered, text UTF-8 can't encode, a handler that
swallows its timeout's cancellation: each is a failure of that job like any other (retry
tiers, then quarantine with evidence), recorded everywhere with the same text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from pydantic import BaseModel, field_validator

from amqpjobs.jobs import evidence
from amqpjobs.jobs.failure import qualname
from amqpjobs.jobs.outcome import Reject
from amqpjobs.jobs.registry import JobContext
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel, until
from tests.integration.test_outcome_levels import listening
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


class BadStr(Exception):
    """Its ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Unprintable:
    """An argument whose ``repr()`` raises: a two-argument exception's ``str()`` fails on it."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


def bad_repr() -> Exception:
    return ValueError(Unprintable(), "row 7")


@pytest.mark.parametrize(("make", "error_type", "message"), [
    (lambda: BadStr("x"), f"{__name__}.BadStr",
     "(the message could not be rendered: str() raised RuntimeError: no text for you)"),
    (bad_repr, "ValueError", "(the message could not be rendered: str() raised RuntimeError: no repr for you)"),
], ids=["raising-str", "raising-repr"])  # fmt: skip
async def test_an_exception_whose_text_cant_be_rendered_is_a_handler_failure_like_any_other(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Any, error_type: str, message: str
):
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("odd", queue="work", retry=RetryPolicy(max_attempts=3))
    async def odd(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise make()

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("odd", {"n": 1}, job_id="odd-1")
        await rec.wait_for(lambda o: any(x.kind == "quarantined" for x in o))
    await app.close()
    assert runs == [1, 2, 3]
    assert [o.kind for o in rec.outcomes] == ["retried", "retried", "quarantined"]
    (msg,) = await drain(broker, "work.quarantine")
    h = msg.headers
    assert (h[evidence.REASON], h[evidence.ERROR_TYPE], h[evidence.ATTEMPTS]) == ("exhausted", error_type, 3)
    assert h[evidence.ERROR_MESSAGE] == message
    assert "Traceback (most recent call last)" in str(h[evidence.TRACEBACK])
    assert rec.outcomes[-1].error == f"{error_type}: {message}"
    assert "failed inside the worker" not in caplog.text


SURROGATES = b"\xff\xfe".decode("utf-8", "surrogateescape")  # "\udcff\udcfe": what os.fsdecode makes of bad bytes


async def test_text_utf8_cant_encode_reaches_every_record_made_encodable_by_one_rule(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The event is sent; evidence, event, log line and results record carry the same text ('?' for each)."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)
    app.results = SqliteResults(tmp_path / "results.db")

    @app.job("fs", queue="work", retry=RetryPolicy(max_attempts=1))
    async def fs(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError(f"can't read /data/{SURROGATES}.csv")

    async with listening(broker) as events, running_worker(app, broker) as (_, rec):
        await app.enqueue("fs", {"n": 1}, job_id="fs-1")
        await rec.wait_for(lambda o: len(o) == 1)
        await until(lambda: len(events) >= 1)
    try:
        expected = "ValueError: can't read /data/??.csv"
        assert [(e.id, e.outcome, e.reason, e.error) for e in events] == [
            ("fs-1", "quarantined", "exhausted", expected)
        ]
        (msg,) = await drain(broker, "work.quarantine")
        assert msg.headers[evidence.ERROR_MESSAGE] == "can't read /data/??.csv"
        assert str(msg.headers[evidence.TRACEBACK]).rstrip().endswith(expected)
        assert rec.outcomes[0].error == expected
        lines = [r.getMessage() for r in caplog.records if "outcome=" in r.getMessage()]
        assert len(lines) == 1
        assert lines[0].endswith(f'outcome=quarantined reason=exhausted error="{expected}"')
        status = await app.job_status("fs-1")
        assert (status.state, status.current.error if status.current else None) == ("quarantined", expected)
        assert "Task exception was never retrieved" not in caplog.text
    finally:
        await app.close()


async def test_a_run_that_overran_its_timeout_is_a_timeout_whatever_the_handler_did_with_the_cancel(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    ends: list[float] = []

    @app.job("stubborn", queue="work", timeout="300ms", retry=RetryPolicy(max_attempts=1))
    async def stubborn(payload: dict[str, Any], ctx: JobContext) -> str:
        started = time.monotonic()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:  # swallowed: the handler goes on past its timeout
            await asyncio.sleep(0.5)
        ends.append(time.monotonic() - started)
        return "done anyway"

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("stubborn", {"n": 1}, job_id="st-1")
        await rec.wait_for(lambda o: len(o) == 1)
    await app.close()
    assert len(ends) == 1
    assert ends[0] >= 0.8
    (outcome,) = rec.outcomes
    assert (outcome.kind, outcome.timed_out) == ("quarantined", True)
    assert outcome.duration >= 0.8
    (msg,) = await drain(broker, "work.quarantine")
    h = msg.headers
    assert (h[evidence.REASON], h[evidence.ERROR_TYPE], h[evidence.ATTEMPTS]) == ("timeout", "TimeoutError", 1)
    assert h[evidence.ERROR_MESSAGE] == (
        "job stubborn ran longer than its timeout of 0.3s (it caught the cancellation and went on; its result "
        "is not used)"
    )
    assert await depth(broker, "work") == 0


async def test_handlers_that_return_an_awaitable_or_a_generator_are_judged_by_what_ran(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """A plain callable returning a coroutine has it run (its value, its timeout); a generator is a failure.

    On the old code each of these was acked "succeeded" with none of its body run (reviews 21-23).
    """
    app = await make_app(broker, tmp_path)
    ran: list[str] = []
    once = RetryPolicy(max_attempts=1)

    async def body(ctx: JobContext, seconds: float) -> str:
        await asyncio.sleep(seconds)
        ran.append(ctx.job_id)
        return ctx.job_id

    def gen(payload: dict[str, Any], ctx: JobContext) -> Any:
        ran.append("gen")
        yield 1

    class AsyncCall:
        async def __call__(self, payload: dict[str, Any], ctx: JobContext) -> str:
            return await body(ctx, 0)

    app.job("lambda", queue="work", retry=once)(lambda p, c: body(c, 0))
    app.job("object", queue="work", retry=once)(AsyncCall())

    def slow(payload: dict[str, Any], ctx: JobContext) -> Any:
        time.sleep(0.3)  # in its thread
        return body(ctx, 0.4)  # 0.7 s in all: past its 0.5 s

    app.job("slow", queue="work", timeout=0.5, retry=once)(slow)
    app.job("gen", queue="work", retry=once)(lambda p, c: gen(p, c))
    async with running_worker(app, broker, concurrency=4) as (_, rec):
        for job in ("lambda", "object", "slow", "gen"):
            await app.enqueue(job, {}, job_id=f"{job}-1")
        await rec.wait_for(lambda o: len(o) == 4)
    await app.close()
    got = {o.job: (o.kind, o.value if o.kind == "succeeded" else o.error) for o in rec.outcomes}
    assert got == {
        "lambda": ("succeeded", "lambda-1"),
        "object": ("succeeded", "object-1"),
        "slow": ("quarantined", "TimeoutError: job slow ran longer than its timeout of 0.5s"),
        "gen": ("quarantined", "TypeError: the handler returned a generator: none of its body ran; fix: return a "
                "value, not a generator (as a wrapper around a generator function does)"),
    }  # fmt: skip
    assert sorted(ran) == ["lambda-1", "object-1"]
    quarantined = {m.message_id: m.headers for m in await drain(broker, "work.quarantine")}
    assert {k: (h[evidence.REASON], h[evidence.ERROR_TYPE]) for k, h in quarantined.items()} == {
        "slow-1": ("timeout", "TimeoutError"),
        "gen-1": ("exhausted", "TypeError"),
    }
    assert await depth(broker, "work") == 0


class Abort(BaseException):
    """A handler's own ``BaseException`` subclass (as some libraries raise to unwind)."""


def own_cancel() -> BaseException:
    return asyncio.CancelledError("the handler's own raise, not a cancellation of its run")


@pytest.mark.parametrize("make", [lambda: GeneratorExit("g"), own_cancel, lambda: Abort("a")],
                         ids=["GeneratorExit", "CancelledError", "BaseException-subclass"])  # fmt: skip
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "thread"])
async def test_a_handlers_own_raise_of_any_base_exception_is_its_jobs_failure_and_the_worker_goes_on(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Any, is_async: bool
) -> None:
    """Retried, then quarantined ``exhausted`` with its type; the slot comes back (a later job runs).

    On the old code (helper-176) only ``Exception``, ``SystemExit`` and ``KeyboardInterrupt``
    were a failure: any other raise ended the delivery's task ("a delivery's handler failed"),
    the delivery stayed unacked and its one slot taken: no outcome, and the next job never ran.
    """
    app = await make_app(broker, tmp_path)
    runs: list[int] = []
    once_more = RetryPolicy(max_attempts=2)

    async def odd(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise make()

    def odd_in_thread(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise make()

    app.job("odd", queue="work", retry=once_more)(odd if is_async else odd_in_thread)
    app.job("fine", queue="work")(lambda p, c: "ok")
    error_type = qualname(make())
    async with running_worker(app, broker, concurrency=1) as (_, rec):
        await app.enqueue("odd", {"n": 1}, job_id="odd-1")
        await app.enqueue("fine", {"n": 2}, job_id="fine-1")
        await rec.wait_for(lambda o: len(o) == 3, timeout=10)
    await app.close()
    assert runs == [1, 2]
    assert [(o.job_id, o.kind) for o in rec.outcomes] == [
        ("odd-1", "retried"),
        ("fine-1", "succeeded"),
        ("odd-1", "quarantined"),
    ]
    (msg,) = await drain(broker, "work.quarantine")
    h = msg.headers
    assert (h[evidence.REASON], h[evidence.ERROR_TYPE], h[evidence.ATTEMPTS]) == ("exhausted", error_type, 2)
    assert "raised by the handler, not a signal to the worker" in str(h[evidence.ERROR_MESSAGE])
    assert await depth(broker, "work") == 0
    assert "a delivery's handler failed" not in caplog.text


class BadAddress(Exception):
    """A permanent failure of the ``group`` job below."""


@pytest.mark.parametrize(
    ("leaf", "reason", "runs"),
    [
        (lambda: Reject("no such customer"), "rejected", 1),
        (lambda: BadAddress("x@"), "permanent", 1),
        (lambda: TimeoutError("slow api"), "timeout", 2),
        (lambda: ValueError("blip"), "exhausted", 2),
    ],
    ids=["reject", "permanent", "timeout", "error"],
)
async def test_a_task_groups_failure_is_judged_by_what_its_tasks_raised(
    broker: BrokerSettings, tmp_path: Path, leaf: Any, reason: str, runs: int
) -> None:
    """An async handler's TaskGroup raises an ExceptionGroup: a Reject or a permanent error in it counts as such.

    Before (helper-176): every group was an ordinary transient error, so a Reject or a
    permanent error raised in a TaskGroup ran the job (and its other tasks' effects) again
    through every retry tier, then quarantined it "exhausted".
    """
    app = await make_app(broker, tmp_path)
    effects: list[int] = []

    @app.job("group", queue="work", retry=RetryPolicy(max_attempts=2, permanent=(BadAddress,)))
    async def group(payload: dict[str, Any], ctx: JobContext) -> None:
        async def effect() -> None:
            effects.append(ctx.attempt)

        async def fail() -> None:
            await asyncio.sleep(0.01)
            raise leaf()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(effect())
            tg.create_task(fail())

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("group", {}, job_id="g-1")
        await rec.wait_for(lambda o: any(x.kind == "quarantined" for x in o))
    await app.close()
    assert effects == list(range(1, runs + 1))
    (msg,) = await drain(broker, "work.quarantine")
    assert (msg.headers[evidence.REASON], msg.headers[evidence.ERROR_TYPE]) == (reason, "ExceptionGroup")


async def test_a_handler_cant_change_the_headers_its_jobs_copies_and_evidence_are_made_of(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """``ctx.headers`` is read-only: the retry copies keep the tenant, the run count and the origin.

    Before (helper-176): it was the delivery's own dict; a handler that cleared it (or popped
    a header it wanted for itself) changed what its retry copies and its evidence were made
    of: the tenant was gone from attempt 2 on, the evidence said 1 attempt after 3 runs, and
    the original exchange was "" instead of "jobs".
    """
    app = await make_app(broker, tmp_path)
    seen: list[tuple[int, Any, str]] = []

    @app.job("meddle", queue="work", retry=RetryPolicy(max_attempts=3))
    async def meddle(payload: dict[str, Any], ctx: JobContext) -> None:
        refused = ""
        try:
            ctx.headers.clear()  # type: ignore[attr-defined]
        except (AttributeError, TypeError) as exc:
            refused = type(exc).__name__
        seen.append((ctx.attempt, ctx.headers.get("amqpjobs-tenant"), refused))
        raise ValueError("meddled")

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("meddle", {}, job_id="md-1", tenant="acme")
        await rec.wait_for(lambda o: any(x.kind == "quarantined" for x in o))
    await app.close()
    assert seen == [(1, "acme", "AttributeError"), (2, "acme", "AttributeError"), (3, "acme", "AttributeError")]
    (msg,) = await drain(broker, "work.quarantine")
    h = msg.headers
    assert (h[evidence.ATTEMPTS], h["amqpjobs-tenant"], h["amqpjobs-original-exchange"]) == (3, "acme", "jobs")


@pytest.mark.parametrize("make", [lambda: GeneratorExit("g"), lambda: SystemExit(2), lambda: Abort("a")],
                         ids=["GeneratorExit", "SystemExit", "BaseException-subclass"])  # fmt: skip
async def test_a_base_exception_raised_after_the_timeouts_cancellation_is_a_timeout_like_any_other_raise(
    broker: BrokerSettings, tmp_path: Path, make: Any
) -> None:
    """Before (helper-176): only an ``Exception`` raised after the cancellation made the run a timeout;
    these were the job's ordinary failure (reason ``exhausted``, their own type)."""
    app = await make_app(broker, tmp_path)

    @app.job("late", queue="work", timeout="200ms", retry=RetryPolicy(max_attempts=1))
    async def late(payload: dict[str, Any], ctx: JobContext) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            raise make() from None

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("late", {}, job_id="late-1")
        await rec.wait_for(lambda o: len(o) == 1)
    await app.close()
    (msg,) = await drain(broker, "work.quarantine")
    h = msg.headers
    assert (h[evidence.REASON], h[evidence.ERROR_TYPE]) == ("timeout", "TimeoutError")
    assert h[evidence.ERROR_MESSAGE] == (
        f"job late ran longer than its timeout of 0.2s (it caught the cancellation and then raised {qualname(make())})"
    )


class Order(BaseModel):
    """A payload model whose validator (app code, run before the handler) raises what ``ref`` names."""

    ref: str

    @field_validator("ref")
    @classmethod
    def _check(cls, ref: str) -> str:
        if ref == "sysexit":
            raise SystemExit(3)
        if ref == "genexit":
            raise GeneratorExit()
        if ref == "runtime":
            raise RuntimeError("the reference service is down")
        return ref


@pytest.mark.parametrize(("ref", "error_type"), [("sysexit", "SystemExit"), ("genexit", "GeneratorExit"),
                                                 ("runtime", "RuntimeError")])  # fmt: skip
async def test_a_payload_validator_raising_anything_refuses_the_payload_and_the_worker_goes_on(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, ref: str, error_type: str
) -> None:
    """Quarantined ``invalid-payload`` with the validator's error; the next job runs.

    Before (helper-176): a validator's SystemExit or GeneratorExit ended the delivery's task ("a
    delivery's handler failed"): the delivery unacked, its slot taken, nothing ran after it; a
    RuntimeError was quarantined ``worker-error``, blamed on the worker ("failed inside the worker").
    """
    app = await make_app(broker, tmp_path)
    ran: list[str] = []

    @app.job("order", queue="work", payload=Order)
    async def order(payload: Order, ctx: JobContext) -> None:
        ran.append(payload.ref)

    caplog.set_level(logging.INFO, logger="amqpjobs")
    async with running_worker(app, broker, concurrency=1) as (_, rec), raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        body = json.dumps({"ref": ref}).encode()
        message = aio_pika.Message(body, content_type="application/json", type="order", message_id="bad-1")
        await exchange.publish(message, routing_key="work")
        await app.enqueue("order", {"ref": "fine"}, job_id="fine-1")
        await rec.wait_for(lambda o: len(o) == 2, timeout=10)
    await app.close()
    assert ran == ["fine"]
    assert sorted((o.job_id, o.kind) for o in rec.outcomes) == [("bad-1", "quarantined"), ("fine-1", "succeeded")]
    (msg,) = await drain(broker, "work.quarantine")
    assert (msg.headers[evidence.REASON], msg.headers[evidence.ERROR_TYPE]) == ("invalid-payload", error_type)
    assert "a delivery's handler failed" not in caplog.text
    assert "failed inside the worker" not in caplog.text
