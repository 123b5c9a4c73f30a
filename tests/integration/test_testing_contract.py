"""Contract: the in-memory double (amqpjobs.testing) decides exactly as the worker on a real broker.

The same scenarios run against RabbitMQ and against ``TestBroker``: success; fail twice then
succeed; exhausted; invalid payload; unknown job; ``Reject``; replay of a quarantined job;
on a classic and on a quorum job queue. Compared: every decision (with attempt, tier,
delay, reason), the headers each handler run saw, and every quarantined message's headers
and evidence, leaving out what differs by nature (times, host, pid, the replay run's id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import job_message
from amqpjobs.jobs.outcome import Quarantine, Reject, RetryLater
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.jobs.registry import JobContext
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.replay import replay
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.abc import Publisher
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain
from tests.integration.worker_env import running_worker

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "cq"
exchange = "jobs"
type = "classic"
retry_tiers = ["200ms", "400ms"]

[[job_queue]]
name = "qq"
exchange = "jobs"
type = "quorum"
retry_tiers = ["200ms", "400ms"]
"""

#: Left out of the comparison: times, where the worker ran, the replay run's random id.
VARYING = {
    "amqpjobs-enqueued-at",
    "amqpjobs-first-failure-at",
    "amqpjobs-last-failure-at",
    "amqpjobs-previous-failure-at",
    "amqpjobs-worker-host",
    "amqpjobs-worker-pid",
    "amqpjobs-replay-id",
}


class Order(BaseModel):
    order_id: int


def build_app(
    topology_file: Path, queue: str, url: str | None, runs: list[tuple[str, int, dict[str, Any]]], broker_set: list[str]
) -> App:
    """The scenarios' jobs on job queue ``queue``; each run's job id, attempt and headers go to ``runs``.

    Headers the broker sets (``x-death`` & co after a retry tier: the double sets none, README
    "Testing your jobs") are left out of ``runs`` and their names noted in ``broker_set``.
    """
    app = App("contract", topology=load_topology(topology_file).topology, app_version="1.2.3", url=url)

    def seen(ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt, normal(ctx.headers)))
        broker_set.extend(sorted(k for k in ctx.headers if k.startswith("x-")))

    @app.job("ok", queue=queue, payload=Order)
    async def ok(order: Order, ctx: JobContext) -> None:
        seen(ctx)

    @app.job("flaky", queue=queue, payload=Order)
    async def flaky(order: Order, ctx: JobContext) -> None:
        seen(ctx)
        if ctx.attempt < 3:
            raise ConnectionError(f"blip {ctx.attempt}")

    @app.job("doomed", queue=queue, payload=Order)
    async def doomed(order: Order, ctx: JobContext) -> None:
        seen(ctx)
        raise ValueError(f"order {order.order_id} is on fire")

    @app.job("rejected", queue=queue, payload=Order)
    async def rejected(order: Order, ctx: JobContext) -> None:
        seen(ctx)
        raise Reject("card declined")

    @app.job("fixme", queue=queue, payload=Order)
    async def fixme(order: Order, ctx: JobContext) -> None:
        seen(ctx)
        if "amqpjobs-replay-count" not in ctx.headers:
            raise Reject("fix me, then replay")

    return app


def normal(value: Any) -> Any:
    """Header values as comparable data: text for bytes, tables and lists recursively, varying keys out."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Mapping):  # ctx.headers is a read-only mapping
        return {str(k): normal(v) for k, v in sorted(value.items()) if k not in VARYING and not k.startswith("x-")}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value


def evidence(headers: dict[str, Any]) -> dict[str, Any]:
    """A quarantined message's headers, the traceback down to its last line (the exception)."""
    out: dict[str, Any] = normal(headers)
    tb = out.pop("amqpjobs-traceback", "")
    out["traceback-last-line"] = tb.rstrip().splitlines()[-1] if tb else ""
    return out


async def enqueue_all(app: App, publisher: Publisher, queue: str) -> None:
    now = time.time()
    await app.enqueue("ok", {"order_id": 1}, job_id="ok-1")
    await app.enqueue("flaky", {"order_id": 2}, job_id="flaky-1")
    await app.enqueue("doomed", {"order_id": 3}, job_id="doomed-1")
    await app.enqueue("rejected", {"order_id": 4}, job_id="rejected-1")
    await app.enqueue("fixme", {"order_id": 5}, job_id="fixme-1")
    await publisher.publish("jobs", queue, job_message("ok", {"order_id": "six"}, job_id="invalid-1", now=now))
    await publisher.publish("jobs", queue, job_message("nope", {"order_id": 7}, job_id="unknown-1", now=now))


def decisions(outcomes: list[Any]) -> list[tuple[Any, ...]]:
    """(job id, attempt, decision, its details) sorted by job id, attempt order kept."""
    out = []
    for o in outcomes:
        d = o.decision
        detail: Any = None
        if isinstance(d, RetryLater):
            detail = (d.next_attempt, d.tier, d.delay, d.wait)
        elif isinstance(d, Quarantine):
            detail = d.reason
        out.append((o.job_id, o.attempt, type(d).__name__, detail, o.job, o.failure[:2], o.acked))
    return sorted(out, key=lambda t: (t[0], t[1]))


def per_job(outcomes: list[Any]) -> dict[str, list[tuple[int, str]]]:
    """Each job id's (attempt, decision) in the order they happened (not sorted: order is part of the contract)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for o in outcomes:
        out.setdefault(o.job_id, []).append((o.attempt, type(o.decision).__name__))
    return out


Result = tuple[list[Any], list[Any], list[Any], list[str], dict[str, list[tuple[int, str]]]]


async def on_the_broker(broker: BrokerSettings, tmp_path: Path, queue: str) -> Result:
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    runs: list[tuple[str, int, dict[str, Any]]] = []
    broker_set: list[str] = []
    app = build_app(topology, queue, broker.url, runs, broker_set)
    async with running_worker(app, broker, queues=(queue,)) as (_, rec):
        await app.connect()
        assert app._publisher is not None
        raw = ConfirmedPublisher(app._connection)  # type: ignore[arg-type]
        await enqueue_all(app, raw, queue)
        await rec.wait_for(lambda o: len(o) >= 11, timeout=20)  # 7 deliveries + 2 flaky + 2 doomed retries
        await replay(broker, f"{queue}.quarantine", ReplayOptions(selection=Selection(job="fixme")))
        await rec.wait_for(lambda o: len(o) >= 12, timeout=20)
        await asyncio.sleep(0.3)  # nothing more may happen
        await raw.close()
    await app.close()
    quarantined = sorted((m.message_id, evidence(dict(m.headers))) for m in await drain(broker, f"{queue}.quarantine"))
    return (
        decisions(rec.outcomes),
        sorted(runs, key=lambda r: (r[0], r[1])),
        quarantined,
        broker_set,
        per_job(rec.outcomes),
    )


async def on_the_double(tmp_path: Path, queue: str) -> Result:
    topology = tmp_path / "double.toml"
    topology.write_text(TOPOLOGY)
    runs: list[tuple[str, int, dict[str, Any]]] = []
    broker_set: list[str] = []
    app = build_app(topology, queue, None, runs, broker_set)
    async with TestBroker(app) as broker:
        await enqueue_all(app, broker.publisher, queue)
        await broker.drain()
        assert await broker.replay(queue, ReplayOptions(selection=Selection(job="fixme"))) == 1
        await broker.drain()
        quarantined = sorted((m.message_id, evidence(m.headers)) for m in broker.quarantine(queue))
    return (decisions(broker.outcomes), sorted(runs, key=lambda r: (r[0], r[1])), quarantined, broker_set,
            per_job(broker.outcomes))  # fmt: skip


@pytest.mark.version_independent
@pytest.mark.parametrize("queue", ["cq", "qq"], ids=["classic", "quorum"])
async def test_the_double_decides_as_the_real_worker(broker: BrokerSettings, tmp_path: Path, queue: str) -> None:
    real = await on_the_broker(broker, tmp_path, queue)
    double = await on_the_double(tmp_path, queue)
    real_decisions, real_runs, real_quarantine, real_broker_set, real_order = real
    # the scenarios happened at all, on the broker
    assert [(d[0], d[1], d[2], d[3]) for d in real_decisions] == [
        ("doomed-1", 1, "RetryLater", (2, 0, 0.2, False)),
        ("doomed-1", 2, "RetryLater", (3, 1, 0.4, False)),
        ("doomed-1", 3, "Quarantine", "exhausted"),
        ("fixme-1", 1, "Quarantine", "rejected"),
        ("fixme-1", 1, "Ack", None),
        ("flaky-1", 1, "RetryLater", (2, 0, 0.2, False)),
        ("flaky-1", 2, "RetryLater", (3, 1, 0.4, False)),
        ("flaky-1", 3, "Ack", None),
        ("invalid-1", 1, "Quarantine", "invalid-payload"),
        ("ok-1", 1, "Ack", None),
        ("rejected-1", 1, "Quarantine", "rejected"),
        ("unknown-1", 1, "Quarantine", "unknown-job"),
    ]
    assert [m for m, _ in real_quarantine] == ["doomed-1", "invalid-1", "rejected-1", "unknown-1"]
    assert real_quarantine[0][1]["amqpjobs-original-queue"] == queue
    fixme_replayed = [h for job_id, attempt, h in real_runs if job_id == "fixme-1"][1]
    assert fixme_replayed["amqpjobs-replay-count"] == 1
    # and the double decided, saw and quarantined the same
    assert double[0] == real_decisions
    assert double[1] == real_runs
    assert double[2] == real_quarantine
    # in the same order per job id, as it happened (a retry before its success, a rejection before its replay)
    assert real_order["flaky-1"] == [(1, "RetryLater"), (2, "RetryLater"), (3, "Ack")]
    assert real_order["fixme-1"] == [(1, "Quarantine"), (1, "Ack")]
    assert double[4] == real_order
    # the one difference: RabbitMQ adds x-death & co when a tier dead-letters a retry back (4 retries)
    assert {"x-death", "x-first-death-queue", "x-first-death-reason"} <= set(real_broker_set)
    assert real_broker_set.count("x-death") == 4
    assert double[3] == []


#: What the double and RabbitMQ must refuse alike when enqueued (keyword arguments of ``app.enqueue``), each
#: check of the real enqueue in turn: header names and types, job id, priority, JSON-only payloads.
REFUSED: dict[str, dict[str, Any]] = {
    "header-reserved-name": {"headers": {"x-mine": "1"}},
    "header-name-over-255-bytes": {"headers": {"é" * 128: "1"}},
    "header-name-over-128-bytes": {"headers": {"h" * 129: "1"}},  # pamqp cut it to 128 bytes on the way
    "header-table-key-over-128-bytes": {"headers": {"meta": {"k" * 129: 1}}},
    "header-name-not-a-str": {"headers": {1: "a"}},
    "header-a-set": {"headers": {"tags": {"a"}}},
    "header-a-date": {"headers": {"day": date(2026, 12, 1)}},
    "header-int-beyond-64-bits": {"headers": {"n": 2**64}},
    "header-table-int-key": {"headers": {"t": {1: "a"}}},
    "header-table-int-key-in-a-list": {"headers": {"t": [{1: 1}]}},
    "header-nan": {"headers": {"h": float("nan")}},
    "header-inf": {"headers": {"h": float("inf")}},
    "header-minus-inf": {"headers": {"h": float("-inf")}},
    "header-nan-in-a-list": {"headers": {"h": [1.5, float("nan")]}},
    "header-inf-in-a-table": {"headers": {"h": {"k": [float("inf")]}}},
    "header-float-not-exact-in-32-bits": {"headers": {"h": {"k": 0.1}}},  # pamqp sends a float as 32 bits
    "header-float-too-large-for-32-bits": {"headers": {"h": 1e308}},
    "header-lone-surrogate": {"headers": {"s": "\udcff"}},
    "job-id-blank": {"job_id": " "},
    "job-id-over-255-bytes": {"job_id": "é" * 128},
    "priority-256": {"priority": 256},
    "priority-negative": {"priority": -1},
    "priority-bool": {"priority": True},
    "payload-nan": {"payload": {"x": float("nan")}},
    "payload-a-set": {"payload": {"x": {1}}},
    "payload-a-model-field-wrong": {"job": "typed", "payload": {"order_id": "six"}},
}


def refusal_app(topology: Path, url: str | None) -> App:
    app = App("refusals", topology=load_topology(topology).topology, url=url)

    @app.job("loose", queue="qq")  # no model: any dict, as JSON carries it
    async def loose(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    @app.job("typed", queue="qq", payload=Order)
    async def typed(order: Order, ctx: JobContext) -> None:
        pass

    return app


async def refusal(app: App, case: dict[str, Any]) -> tuple[str, str, int | None]:
    """How ``app.enqueue`` refuses ``case``: the error's class, its message, and ``excess`` when too large."""
    kw = dict(case)
    job, payload = kw.pop("job", "loose"), kw.pop("payload", {"order_id": 1})
    kw.setdefault("job_id", "refused-1")
    try:
        await app.enqueue(job, payload, **kw)
    except Exception as exc:
        return type(exc).__name__, str(exc), getattr(exc, "excess", None)
    raise AssertionError(f"enqueue took {case}")


@pytest.mark.version_independent
async def test_the_double_refuses_each_enqueue_the_broker_refuses_with_the_same_error(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    on_broker = refusal_app(topology, broker.url)
    try:
        real = {name: await refusal(on_broker, case) for name, case in REFUSED.items()}
        # one byte under and one over what enqueue leaves of frame_max: 131072 - 20480 = 110592 bytes
        over = await refusal(on_broker, {"headers": {"pad": "x" * 120_000}})
        assert over[2] is not None
        fits = 120_000 - over[2]
        await on_broker.enqueue("loose", {"n": 1}, job_id="fits-1", headers={"pad": "x" * fits})
        real["one-byte-over"] = await refusal(on_broker, {"headers": {"pad": "x" * (fits + 1)}})
    finally:
        await on_broker.close()
    [stored] = await drain(broker, "qq")  # only the one that fitted
    assert (stored.message_id, len(stored.headers["pad"])) == ("fits-1", fits)  # type: ignore[arg-type]
    assert real["one-byte-over"] == (
        "MessageTooLargeError",
        "the message's headers and properties take 110593 bytes, over the connection's frame_max of 131072 bytes "
        "less the 20480 bytes of it for the worker's own headers on its copies (they travel in one frame); "
        "nothing was sent. Put large data in the body",
        1,
    )
    # a float 32 bits can't hold exactly: it arrived as 0.10000000149011612 (1e308: pamqp's own struct.error)
    assert real["header-float-not-exact-in-32-bits"] == (
        "ConfigurationError",
        "job 'loose': header 'h': value['k'] is 0.1, which pamqp sends as a 32-bit AMQP float: it would arrive as "
        "0.10000000149011612; nothing was sent. Send it as a str (e.g. '0.1') or a decimal.Decimal",
        None,
    )
    # NaN and infinities: RabbitMQ closed the publisher's connection (INTERNAL_ERROR), failing every enqueue on it
    assert real["header-inf-in-a-table"] == (
        "ConfigurationError",
        "job 'loose': header 'h': value['k'][0] is inf, a float RabbitMQ can't take (it closes the connection "
        "with INTERNAL_ERROR on NaN and infinities); nothing was sent. Send it as a str (e.g. 'inf') or None",
        None,
    )
    assert real["header-table-int-key-in-a-list"] == (
        "ConfigurationError",
        "job 'loose': header 't': value[0] has table key 1 (int): table keys must be str; nothing was sent. "
        "Use str keys (e.g. '1')",
        None,
    )
    in_memory = refusal_app(topology, None)
    async with TestBroker(in_memory) as double:
        doubled = {name: await refusal(in_memory, case) for name, case in REFUSED.items()}
        await in_memory.enqueue("loose", {"n": 1}, job_id="fits-1", headers={"pad": "x" * fits})
        doubled["one-byte-over"] = await refusal(in_memory, {"headers": {"pad": "x" * (fits + 1)}})
        assert [m.message.message_id for m in double.memory.queue("qq").messages] == ["fits-1"]
    assert doubled == real


@pytest.mark.version_independent
async def test_a_nan_header_refused_leaves_the_enqueues_sent_beside_it_stored(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: the NaN went out and the broker closed the publisher's connection (INTERNAL_ERROR), failing the
    good enqueues sent at the same time (4 of 4 on 4.3)."""
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    app = refusal_app(topology, broker.url)
    try:
        await app.enqueue("loose", {"n": 0}, job_id="warm-up")  # connected: the five go out side by side
        good = [app.enqueue("loose", {"n": n}, job_id=f"good-{n}", headers={"h": 1.5}) for n in range(4)]
        bad = app.enqueue("loose", {"n": 9}, job_id="nan-1", headers={"h": [float("nan")]})
        results = await asyncio.gather(bad, *good, return_exceptions=True)
    finally:
        await app.close()
    assert [type(r).__name__ if isinstance(r, BaseException) else r for r in results] == [
        "ConfigurationError", "good-0", "good-1", "good-2", "good-3"
    ]  # fmt: skip
    assert sorted(m.message_id or "" for m in await drain(broker, "qq")) == [
        "good-0", "good-1", "good-2", "good-3", "warm-up"
    ]  # fmt: skip


async def test_the_double_given_the_brokers_version_takes_or_refuses_a_priority_as_the_broker_does(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Version-dependent on purpose: 3.x refuses a priority for a quorum job queue, 4.0+ takes it (CI: each version)."""
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    refusals: list[str] = []
    app = build_app(topology, "qq", broker.url, [], [])
    try:
        await app.connect()
        version = app._broker_version
        try:
            await app.enqueue("ok", {"order_id": 1}, job_id="prio-3", priority=3)
        except ConfigurationError as exc:
            refusals.append(str(exc))
    finally:
        await app.close()
    double_app = build_app(topology, "qq", None, [], [])
    async with TestBroker(double_app, broker_version=version) as double:
        try:
            await double_app.enqueue("ok", {"order_id": 1}, job_id="prio-3", priority=3)
        except ConfigurationError as exc:
            refusals.append(str(exc))
        ran = [(p.outcome.job_id, type(p.outcome.decision).__name__) for p in await double.drain()]
    stored = [(m.message_id, m.priority) for m in await drain(broker, "qq")]
    if version >= (4, 0):  # quorum queues take priorities there: neither refuses, both hold the job
        assert refusals == []
        assert ran == [("prio-3", "Ack")]
        assert stored == [("prio-3", 3)]
    else:
        assert len(refusals) == 2
        assert refusals[0] == refusals[1]
        assert refusals[0].startswith("job 'ok': priority 3 can't be kept: job queue 'qq'")
        assert ran == []
        assert stored == []  # nothing of the refused job reached the broker


#: Header values whose Python type the AMQP encoding changes (a tuple is an array, bytes a byte array).
ODD_HEADERS: dict[str, Any] = {"pair": (1, 2), "raw": b"\x00\xff", "nested": {"list": (b"a", (3,))}, "flag": True}


@pytest.mark.version_independent
async def test_a_handler_sees_the_same_header_values_and_types_on_the_broker_and_in_the_double(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    seen: dict[str, list[Any]] = {"real": [], "double": []}

    def build(url: str | None, where: str) -> App:
        app = App("contract", topology=load_topology(topology).topology, url=url)

        @app.job("ok", queue="cq", payload=Order)
        async def ok(order: Order, ctx: JobContext) -> None:
            seen[where].append([(k, type(ctx.headers[k]).__name__, ctx.headers[k]) for k in ODD_HEADERS])

        return app

    real = build(broker.url, "real")
    async with running_worker(real, broker, queues=("cq",)) as (_, rec):
        await real.enqueue("ok", {"order_id": 1}, headers=ODD_HEADERS)
        await rec.wait_for(lambda o: len(o) >= 1, timeout=20)
    await real.close()
    double = build(None, "double")
    async with TestBroker(double) as memory:
        await double.enqueue("ok", {"order_id": 1}, headers=ODD_HEADERS)
        await memory.drain()
    assert seen["real"][0][0] == ("pair", "list", [1, 2])
    assert seen["real"][0][1] == ("raw", "bytearray", bytearray(b"\x00\xff"))
    assert seen["double"] == seen["real"]


@pytest.mark.version_independent
@pytest.mark.parametrize("value", [float("nan"), [1, float("-inf")]])
async def test_a_raw_publish_of_a_nan_header_closes_the_connection_as_the_doubles_publish_raw_refuses_it(
    broker: BrokerSettings, tmp_path: Path, value: Any
) -> None:
    """The broker's word behind the double's rule (helper-231): a NaN or infinity in a header, sent by a client
    that does not check (aio-pika), gets the publisher's connection closed with INTERNAL_ERROR; nothing stored."""
    import aio_pika

    topology = tmp_path / "t.toml"
    topology.write_text(TOPOLOGY)
    await apply_topology(topology, broker)
    connection = await aio_pika.connect(broker.url)

    async def publish_then_one_more() -> None:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(aio_pika.Message(b"{}", headers={"x": value}), routing_key="qq")
        await asyncio.sleep(1)  # the close may come after the publish returned
        await channel.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="qq")

    try:
        with pytest.raises(Exception, match=r"INTERNAL_ERROR|541"):  # aio-pika's and aiormq's types vary
            await publish_then_one_more()
    finally:
        await connection.close()
    assert await drain(broker, "qq") == []
    app = refusal_app(topology, None)
    async with TestBroker(app) as double:
        with pytest.raises(ConfigurationError, match="closes the publisher's connection"):
            await double.publish_raw("", "qq", b"{}", type="loose", headers={"x": value})
