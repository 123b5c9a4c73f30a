"""The in-memory double refuses what the broker's publisher refuses, by the same rule and with the same words.

``enqueue`` leaves :data:`~amqpjobs.jobs.evidence.WORKER_HEADROOM` (20 KiB) of the
connection's ``frame_max`` (131072 bytes by default) free for the headers a worker adds to
its copies: a job's headers and properties may take 110592 bytes, not one more (README
"Bad messages"). The same enqueues against RabbitMQ: tests/integration/test_testing_contract.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from amqpjobs import App, JobContext, RetryPolicy
from amqpjobs.errors import ConfigurationError, MessageTooLargeError
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from tests.topologies import work_topology

TOPOLOGY = work_topology()

#: What a job's headers and properties may take at the default frame_max: 131072 - 20480.
LIMIT = 110_592


class Order(BaseModel):
    order_id: int


def make_app(tmp_path: Path) -> tuple[App, list[int]]:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    app = App("limits", topology=load_topology(path).topology)
    ran: list[int] = []

    @app.job("big", queue="work", payload=Order)
    async def big(order: Order, ctx: JobContext) -> None:
        ran.append(order.order_id)

    return app, ran


async def refused(app: App, pad: int) -> MessageTooLargeError:
    with pytest.raises(MessageTooLargeError) as info:
        await app.enqueue("big", {"order_id": pad}, job_id="big-1", headers={"pad": "x" * pad})
    return info.value


async def test_enqueue_in_the_double_leaves_the_workers_headroom_of_frame_max(tmp_path: Path) -> None:
    app, ran = make_app(tmp_path)
    async with TestBroker(app) as broker:
        over = await refused(app, 120_000)
        assert over.excess is not None
        assert over.excess > 0
        fits = 120_000 - over.excess  # the header's bytes are its characters: one byte less per character
        await app.enqueue("big", {"order_id": fits}, job_id="big-1", headers={"pad": "x" * fits})
        one_over = await refused(app, fits + 1)
        assert broker.memory.queue("work").messages[0].message.headers["pad"] == "x" * fits
        await broker.drain()
    assert ran == [fits]  # the one that fitted ran; the refused ones were never sent
    assert one_over.excess == 1
    assert str(one_over) == (
        f"the message's headers and properties take {LIMIT + 1} bytes, over the connection's frame_max of 131072 "
        "bytes less the 20480 bytes of it for the worker's own headers on its copies (they travel in one frame); "
        "nothing was sent. Put large data in the body"
    )
    assert one_over.reason == (
        f"headers and properties of {LIMIT + 1} bytes, over the connection's frame_max of 131072 bytes less the "
        "20480 bytes of it for the worker's own headers on its copies (one frame carries them)"
    )


async def test_a_header_value_amqp_cannot_carry_is_refused_in_the_double_as_on_the_broker(tmp_path: Path) -> None:
    # on RabbitMQ pamqp refuses a set while encoding the frame (nothing sent): the double took it and ran the job
    app, ran = make_app(tmp_path)
    async with TestBroker(app) as broker:
        with pytest.raises(ConfigurationError) as info:
            await app.enqueue("big", {"order_id": 1}, job_id="set-1", headers={"tags": {"a"}})
        await broker.drain()
    assert ran == []
    assert str(info.value) == (
        "job 'big': header 'tags': value is a set, which AMQP can't carry; nothing was sent. Give str, int (64-bit), "
        "float, Decimal, bool, bytes, datetime, None, or lists and dicts (str keys) of these"
    )


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            {"h" * 129: 1},
            "job 'big': header 'hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh': header name must be at most 128 UTF-8 bytes "
            "(got 129 bytes, 129 characters): AMQP field names are cut to 128 bytes on the way",
        ),
        (
            {"meta": {"k" * 129: 1}},
            "job 'big': header 'meta': table key 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk' must be at most 128 UTF-8 "
            "bytes (got 129 bytes, 129 characters): AMQP field names are cut to 128 bytes on the way",
        ),
        ({1: "a"}, "job 'big': header 1: header names must be str (got int)"),
    ],
    ids=["name", "nested-key", "not-a-str"],
)
async def test_a_header_name_the_wire_would_cut_short_is_refused(
    tmp_path: Path, headers: dict[Any, Any], message: str
) -> None:
    # pamqp cuts a field name over 128 bytes to 128 (a log warning): a handler on RabbitMQ saw another
    # name than the double's handler did, and two long names with one 128-byte prefix became one
    app, ran = make_app(tmp_path)
    async with TestBroker(app) as broker:
        with pytest.raises(ConfigurationError) as info:
            await app.enqueue("big", {"order_id": 1}, job_id="long-1", headers=headers)
        await broker.drain()
    assert ran == []
    assert str(info.value) == message


_NAN_FIX = (
    "a float RabbitMQ can't take (it closes the connection with INTERNAL_ERROR on NaN and infinities); "
    "nothing was sent. Send it as a str"
)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"h": float("nan")}, f"job 'big': header 'h': value is nan, {_NAN_FIX} (e.g. 'nan') or None"),
        ({"h": float("inf")}, f"job 'big': header 'h': value is inf, {_NAN_FIX} (e.g. 'inf') or None"),
        ({"h": float("-inf")}, f"job 'big': header 'h': value is -inf, {_NAN_FIX} (e.g. '-inf') or None"),
        ({"h": [1.5, float("nan")]}, f"job 'big': header 'h': value[1] is nan, {_NAN_FIX} (e.g. 'nan') or None"),
        (
            {"ok": 1.5, "h": {"k": [float("inf")]}},
            f"job 'big': header 'h': value['k'][0] is inf, {_NAN_FIX} (e.g. 'inf') or None",
        ),
        (
            {"h": {1: "a"}},
            "job 'big': header 'h': value has table key 1 (int): table keys must be str; nothing was sent. "
            "Use str keys (e.g. '1')",
        ),
        (
            {"h": [{1: 1}]},
            "job 'big': header 'h': value[0] has table key 1 (int): table keys must be str; nothing was sent. "
            "Use str keys (e.g. '1')",
        ),
        (
            {"h": {"a": {b"k": 1}}},
            "job 'big': header 'h': value['a'] has table key b'k' (bytes): table keys must be str; nothing was "
            "sent. Use str keys (e.g. 'k')",
        ),
    ],
    ids=["nan", "inf", "minus-inf", "nan-in-a-list", "inf-in-a-table", "int-key", "int-key-in-a-list", "bytes-key"],
)
async def test_a_header_value_rabbitmq_closes_the_connection_on_is_refused_naming_header_and_path(
    tmp_path: Path, headers: dict[str, Any], message: str
) -> None:
    # NaN / infinities: RabbitMQ 3.10 and 4.3 closed the publisher's connection (INTERNAL_ERROR), failing the
    # good enqueues beside it, while the double took them; a non-str table key: pamqp's "'int' object has no
    # attribute 'encode'", naming neither header nor path
    app, ran = make_app(tmp_path)
    async with TestBroker(app) as broker:
        with pytest.raises(ConfigurationError) as info:
            await app.enqueue("big", {"order_id": 1}, job_id="nan-1", headers=headers)
        await app.enqueue("big", {"order_id": 2}, job_id="fine-1", headers={"h": 1.5, "t": {"k": [0.0]}})
        await broker.drain()
    assert ran == [2]
    assert str(info.value) == message


async def test_a_payload_key_json_would_rewrite_is_refused_naming_the_job(tmp_path: Path) -> None:
    # json.dumps wrote {1: 2} as {"1": 2}: the handler got a key it was not given
    app, _ = make_app(tmp_path)
    got: list[dict[str, Any]] = []

    @app.job("free", queue="work")
    async def free(payload: dict[str, Any], ctx: JobContext) -> None:
        got.append(payload)

    async with TestBroker(app) as broker:
        with pytest.raises(ConfigurationError) as info:
            await app.enqueue("free", {"ids": {1: "a"}})
        await app.enqueue("free", {"ids": {"1": "a"}})
        await broker.drain()
    assert got == [{"ids": {"1": "a"}}]
    assert str(info.value) == (
        "job 'free': the payload has a key that is not a str: payload['ids'] has the key 1 (an int); JSON object "
        "keys are strings, so the job would get '1'; fix: write the key as a str"
    )


async def test_a_handler_that_returns_an_awaitable_has_it_run(tmp_path: Path) -> None:
    # review 21 H1: run in the thread pool and never awaited, these were "succeeded" with their body never run
    app, _ = make_app(tmp_path)
    ran: list[str] = []

    async def real(payload: dict[str, Any], ctx: JobContext) -> str:
        ran.append(ctx.job)
        return ctx.job

    class AsyncCall:
        async def __call__(self, payload: dict[str, Any], ctx: JobContext) -> str:
            return await real(payload, ctx)

    @functools.wraps(real)
    def wrapper(payload: dict[str, Any], ctx: JobContext) -> Any:
        return real(payload, ctx)

    app.job("object", queue="work")(AsyncCall())
    app.job("lambda", queue="work")(lambda p, c: real(p, c))
    app.job("wrapper", queue="work")(wrapper)
    async with TestBroker(app) as broker:
        for name in ("object", "lambda", "wrapper"):
            await app.enqueue(name, {})
        done = await broker.drain()
    assert sorted(ran) == ["lambda", "object", "wrapper"]
    assert sorted((p.outcome.job, p.outcome.kind, p.outcome.value) for p in done) == [
        ("lambda", "succeeded", "lambda"), ("object", "succeeded", "object"), ("wrapper", "succeeded", "wrapper")
    ]  # fmt: skip


async def test_a_run_that_returns_a_generator_or_an_awaitable_within_an_awaitable_is_judged(tmp_path: Path) -> None:
    # review 22 H1, H2: a wrapped generator, or an async def returning a coroutine: "succeeded", the body never run
    app, _ = make_app(tmp_path)
    ran: list[str] = []

    def gen(payload: dict[str, Any], ctx: JobContext) -> Any:
        ran.append("gen")
        yield 1

    async def body(payload: dict[str, Any], ctx: JobContext) -> str:
        ran.append(ctx.job)
        return "done"

    async def returns_coroutine(payload: dict[str, Any], ctx: JobContext) -> Any:
        return body(payload, ctx)

    app.job("wrapped-gen", queue="work", retry=RetryPolicy(max_attempts=1))(lambda p, c: gen(p, c))
    app.job("nested", queue="work")(returns_coroutine)
    async with TestBroker(app) as broker:
        await app.enqueue("wrapped-gen", {})
        await app.enqueue("nested", {})
        done = {p.outcome.job: p.outcome for p in await broker.drain()}
    assert ran == ["nested"]
    assert (done["nested"].kind, done["nested"].value) == ("succeeded", "done")
    assert done["wrapped-gen"].kind == "quarantined"
    assert done["wrapped-gen"].error == (
        "TypeError: the handler returned a generator: none of its body ran; fix: return a value, not a generator "
        "(as a wrapper around a generator function does)"
    )


async def test_the_timeout_covers_a_plain_function_and_the_awaitable_it_returns(tmp_path: Path) -> None:
    # review 22 H3: the awaitable got a fresh full timeout after the thread's part
    app, _ = make_app(tmp_path)

    def split(payload: dict[str, Any], ctx: JobContext) -> Any:
        time.sleep(0.3)

        async def rest() -> str:
            await asyncio.sleep(0.3)
            return "late"

        return rest()

    app.job("split", queue="work", timeout=0.5, retry=RetryPolicy(max_attempts=1))(split)
    async with TestBroker(app) as broker:
        await app.enqueue("split", {})
        (done,) = await broker.drain()
    assert done.outcome.kind == "quarantined"
    assert done.outcome.error == "TimeoutError: job split ran longer than its timeout of 0.5s"


async def test_a_model_payload_nested_too_deep_is_refused_with_the_depth_words(tmp_path: Path) -> None:
    # review 22 M1: pydantic's own "Maximum serialization depth exceeded" (a raw ValueError) past 255 levels
    app, _ = make_app(tmp_path)

    class Loose(BaseModel):
        data: Any

    app.job("loose", queue="work", payload=Loose)(lambda p, c: None)
    deep: Any = 1
    for _ in range(300):
        deep = {"d": deep}
    async with TestBroker(app):
        with pytest.raises(ConfigurationError) as info:
            await app.enqueue("loose", Loose(data=deep))
    assert str(info.value).startswith("job 'loose': the payload is nested deeper than 64 levels")


async def test_the_awaitable_a_plain_function_returns_cannot_outlive_the_timeout_by_catching_it(
    tmp_path: Path,
) -> None:
    # review 23: catching the timeout's cancellation and returning (or raising) was "succeeded" (or "exhausted")
    app, _ = make_app(tmp_path)

    async def stubborn() -> str:
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            return "caught"
        return "slept"

    async def raises_after() -> str:
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            raise ValueError("raised after cancel") from None
        return "slept"

    once = RetryPolicy(max_attempts=1)
    app.job("stubborn", queue="work", timeout=0.3, retry=once)(lambda p, c: stubborn())
    app.job("raises", queue="work", timeout=0.3, retry=once)(lambda p, c: raises_after())
    async with TestBroker(app) as broker:
        await app.enqueue("stubborn", {})
        await app.enqueue("raises", {})
        done = {p.outcome.job: p.outcome for p in await broker.drain()}
    assert (done["stubborn"].kind, done["stubborn"].error) == (
        "quarantined",
        "TimeoutError: job stubborn ran longer than its timeout of 0.3s (it caught the cancellation and went on; "
        "its result is not used)",
    )
    assert (done["raises"].kind, done["raises"].error) == (
        "quarantined",
        "TimeoutError: job raises ran longer than its timeout of 0.3s (it caught the cancellation and then raised "
        "ValueError)",
    )


async def test_an_async_handler_that_blocks_the_loop_past_its_timeout_is_judged_by_its_result_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # helper-194: time.sleep in an async handler ran 8 s under a 2 s timeout and logged only "succeeded":
    # nothing could cancel it (the loop was blocked), so, like a thread's run, its result stands, with a warning
    app, _ = make_app(tmp_path)
    ran: list[str] = []

    async def blocks(payload: dict[str, Any], ctx: JobContext) -> None:
        time.sleep(0.5)  # noqa: ASYNC251 - the fault under test
        ran.append(ctx.job_id)

    app.job("blocks", queue="work", timeout=0.2, retry=RetryPolicy(max_attempts=1))(blocks)
    caplog.set_level(logging.WARNING, logger="amqpjobs")
    async with TestBroker(app) as broker:
        job_id = await app.enqueue("blocks", {})
        done = [p.outcome for p in await broker.drain()]
    assert [(o.kind, o.job) for o in done] == [("succeeded", "blocks")]
    assert ran == [job_id]
    said = [r.getMessage() for r in caplog.records if "never cancelled: the event loop was blocked" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"job blocks id {job_id}: ran 0.5s, past its timeout of 0.2s, never cancelled"), said
