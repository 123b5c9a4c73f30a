"""Jobs end to end against the real broker: enqueue, run, ack, retry tiers, quarantine."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from pydantic import BaseModel

from amqpjobs.errors import ConfigurationError, InvalidPayloadError, UnroutableError
from amqpjobs.jobs import envelope, evidence
from amqpjobs.jobs.outcome import Reject, Retry
from amqpjobs.jobs.registry import JobContext
from amqpjobs.jobs.retry import RetryPolicy
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


class Mail(BaseModel):
    to: str
    order_id: int


async def quarantined(
    broker: BrokerSettings, queue: str = "work.quarantine"
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Drain the quarantine queue (acking), returning its messages."""
    return await drain(broker, queue)


async def test_thousand_jobs_complete_exactly_once(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    done: list[int] = []

    @app.job("count", queue="work", payload=Mail)
    async def count(payload: Mail, ctx: JobContext) -> None:
        done.append(payload.order_id)

    async with running_worker(app, broker, concurrency=4) as (_, rec):
        for i in range(1000):
            await app.enqueue("count", Mail(to="a@example.com", order_id=i))
        await rec.wait_for(lambda o: len(o) >= 1000, timeout=60)
        await asyncio.sleep(0.3)
    await app.close()
    assert len(done) == 1000
    assert sorted(done) == list(range(1000))
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0


async def test_fails_twice_then_succeeds_at_attempt_3_after_each_tier(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: list[tuple[int, float]] = []

    @app.job("flaky", queue="work")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, time.monotonic()))
        if ctx.attempt < 3:
            raise ConnectionError("smtp blip")

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("flaky", {"n": 1}, job_id="flaky-1")
        await rec.wait_for(lambda o: any(x.attempt == 3 for x in o))
    await app.close()
    assert [a for a, _ in runs] == [1, 2, 3]
    assert runs[1][1] - runs[0][1] >= 0.2
    assert runs[2][1] - runs[1][1] >= 0.4
    assert [type(o.decision).__name__ for o in rec.outcomes] == ["RetryLater", "RetryLater", "Ack"]
    assert await depth(broker, "work.quarantine") == 0


def _failing_handler(kind: str, runs: list[int]) -> Any:
    async def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if kind == "raise":
            raise ValueError(f"the printer is on fire (attempt {ctx.attempt})")
        if kind == "retry":
            raise Retry(f"try later (attempt {ctx.attempt})")
        raise Reject(f"customer unknown (attempt {ctx.attempt})")

    return handler


@pytest.mark.parametrize(("kind", "runs_expected", "reason", "error_type", "message"), [
    ("raise", [1, 2, 3, 4], "exhausted", "ValueError", "the printer is on fire (attempt 4)"),
    ("retry", [1, 2, 3, 4], "exhausted", "amqpjobs.jobs.outcome.Retry", "try later (attempt 4)"),
    ("reject", [1], "rejected", "amqpjobs.jobs.outcome.Reject", "customer unknown (attempt 1)"),
], ids=["raise", "retry", "reject"])  # fmt: skip
async def test_failure_paths_quarantine_with_every_evidence_header(
    broker: BrokerSettings, tmp_path: Path, kind: str, runs_expected: list[int], reason: str, error_type: str,
    message: str,
):  # fmt: skip
    app = await make_app(broker, tmp_path)
    runs: list[int] = []
    app.job("fail", queue="work", retry=RetryPolicy(max_attempts=4))(_failing_handler(kind, runs))
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("fail", {"n": 1}, job_id="job-42", tenant="acme")
        await rec.wait_for(lambda o: any(type(x.decision).__name__ == "Quarantine" for x in o))
        await asyncio.sleep(0.8)  # nothing more may happen
    await app.close()
    assert runs == runs_expected
    msgs = await quarantined(broker)
    assert len(msgs) == 1
    h: dict[str, Any] = dict(msgs[0].headers)
    assert set(evidence.EVIDENCE_HEADERS) <= set(h)
    assert h[evidence.REASON] == reason
    assert h[evidence.ATTEMPTS] == len(runs_expected)
    assert h[evidence.ERROR_TYPE] == error_type
    assert h[evidence.ERROR_MESSAGE] == message  # the last attempt's error, this kind's own message
    assert "Traceback (most recent call last)" in str(h[evidence.TRACEBACK])
    assert str(h[evidence.TRACEBACK]).rstrip().endswith(f"{error_type.rsplit('.', 1)[-1]}: {message}")
    assert h[evidence.JOB] == "fail"
    assert h[evidence.JOB_ID] == "job-42"
    assert h[evidence.TENANT] == "acme"
    assert h[evidence.ORIGINAL_QUEUE] == "work"
    assert h[evidence.ORIGINAL_EXCHANGE] == "jobs"  # also after coming back from a tier
    assert h[evidence.ORIGINAL_ROUTING_KEY] == "work"
    assert h[evidence.APP_VERSION] == "9.9.9"
    assert h[evidence.WORKER_PID] > 0
    assert str(h[evidence.FIRST_FAILURE_AT]).endswith("Z")
    assert str(h[evidence.LAST_FAILURE_AT]) >= str(h[evidence.FIRST_FAILURE_AT])
    assert "x-death" not in h
    assert msgs[0].message_id == "job-42"
    assert json.loads(msgs[0].body) == {"n": 1}
    assert await depth(broker, "work") == 0
    for tier in ("200ms", "400ms", "600ms"):
        assert await depth(broker, f"work.retry.{tier}") == 0


@pytest.mark.parametrize(("body", "props", "reason"), [
    (b"not json", {"content_type": "application/json", "type": "mail"}, "undecodable"),
    (b'{"to": 5}', {"content_type": "application/json", "type": "mail"}, "invalid-payload"),
    (b'{"to": "a@example.com", "order_id": 1}', {"content_type": "application/json", "type": "nope"}, "unknown-job"),
    (b'{"to": "a@example.com", "order_id": 1}', {"content_type": "text/plain", "type": "mail"},
     "unsupported-content-type"),
])  # fmt: skip
async def test_bad_messages_quarantined_at_once_worker_keeps_serving(
    broker: BrokerSettings, tmp_path: Path, body: bytes, props: dict[str, Any], reason: str
):
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        runs.append(payload.order_id)

    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            ex = await ch.get_exchange("jobs")
            await ex.publish(aio_pika.Message(body, message_id="bad-1", **props), routing_key="work")
        await rec.wait_for(lambda o: len(o) == 1)
        await app.enqueue("mail", Mail(to="b@example.com", order_id=7))
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert runs == [7]
    msgs = await quarantined(broker)
    assert len(msgs) == 1
    assert msgs[0].headers[evidence.REASON] == reason
    assert msgs[0].headers[evidence.ATTEMPTS] == 0
    assert msgs[0].body == body
    assert [type(o.decision).__name__ for o in rec.outcomes] == ["Quarantine", "Ack"]


async def test_wire_format_lets_other_languages_enqueue(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    seen: list[tuple[Mail, JobContext]] = []

    @app.job("mail", queue="work", payload=Mail)
    async def mail(payload: Mail, ctx: JobContext) -> None:
        seen.append((payload, ctx))

    async with running_worker(app, broker) as (_, rec):
        async with raw_channel(broker) as ch:
            ex = await ch.get_exchange("jobs")
            await ex.publish(
                aio_pika.Message(
                    b'{"to": "x@example.com", "order_id": 99}',
                    content_type="application/json",
                    message_id="from-go-1",
                    type="mail",
                    headers={"amqpjobs-tenant": "t1", "amqpjobs-attempt": 1},
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="work",
            )
        await rec.wait_for(lambda o: len(o) == 1)
    ((payload, ctx),) = seen
    assert payload == Mail(to="x@example.com", order_id=99)
    assert (ctx.job_id, ctx.tenant, ctx.attempt, ctx.max_attempts) == ("from-go-1", "t1", 1, 4)


async def test_enqueue_sets_documented_properties(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    app.job("mail", queue="work", payload=Mail)(lambda p, c: None)
    before = time.time()
    job_id = await app.enqueue("mail", {"to": "a@example.com", "order_id": 3}, priority=4, tenant="acme",
                               headers={"trace": "abc"})  # fmt: skip
    await app.close()
    async with raw_channel(broker) as ch:
        q = await ch.get_queue("work", ensure=False)
        msg = await q.get(timeout=5)
        assert msg is not None
        await msg.ack()
    assert msg.message_id == job_id
    assert msg.type == "mail"
    assert msg.content_type == "application/json"
    assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert msg.priority == 4
    assert msg.timestamp is not None
    assert abs(msg.timestamp.timestamp() - before) < 2
    assert json.loads(msg.body) == {"to": "a@example.com", "order_id": 3}
    assert msg.headers == {
        "trace": "abc",
        envelope.ATTEMPT: 1,
        envelope.TENANT: "acme",
        envelope.ENQUEUED_AT: msg.headers[envelope.ENQUEUED_AT],
    }
    assert str(msg.headers[envelope.ENQUEUED_AT]).endswith("Z")


async def test_enqueue_errors(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    app.job("mail", queue="work", payload=Mail)(lambda p, c: None)
    app.job("lost", queue="ghost")(lambda p, c: None)
    with pytest.raises(InvalidPayloadError, match="order_id"):
        await app.enqueue("mail", {"to": "a@example.com"})
    with pytest.raises(UnroutableError, match="no queue is bound") as unroutable:
        await app.enqueue("lost", {"n": 1})
    assert unroutable.type is UnroutableError  # the documented class, not just any PublishError
    with pytest.raises(ConfigurationError, match=r"priority 9 is above job queue 'work'.s max_priority 5"):
        await app.enqueue("mail", {"to": "a@example.com", "order_id": 1}, priority=9)
    with pytest.raises(ConfigurationError, match="job_id is empty"):
        await app.enqueue("mail", {"to": "a@example.com", "order_id": 1}, job_id="")
    with pytest.raises(ConfigurationError, match="tenant is empty"):
        await app.enqueue("mail", {"to": "a@example.com", "order_id": 1}, tenant=" ")
    with pytest.raises(ConfigurationError, match="reserved"):
        await app.enqueue("mail", {"to": "a@example.com", "order_id": 1}, headers={"x-death": []})
    # the publisher still works after a returned message
    await app.enqueue("mail", {"to": "a@example.com", "order_id": 1})
    await app.close()
    assert await depth(broker, "work") == 1


async def test_huge_exception_message_is_truncated_and_connection_stays_healthy(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("huge", queue="work", retry=RetryPolicy(max_attempts=1))
    async def huge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(payload["n"])
        if payload["n"] == 1:
            raise RuntimeError("x" * 1_000_000)

    async with running_worker(app, broker) as (worker, rec):
        await app.enqueue("huge", {"n": 1})
        await rec.wait_for(lambda o: len(o) == 1)
        await app.enqueue("huge", {"n": 2})
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert runs == [1, 2]
    msgs = await quarantined(broker)
    assert len(msgs) == 1
    h: dict[str, Any] = dict(msgs[0].headers)
    size = sum(len(k) + len(str(v).encode()) for k, v in h.items() if k.startswith("amqpjobs-"))
    assert size <= evidence.DEFAULT_BUDGET
    assert str(h[evidence.ERROR_MESSAGE]).startswith("xxxx")
    assert str(h[evidence.ERROR_MESSAGE]).endswith("[truncated]")
    assert h[evidence.REASON] == "exhausted"
    assert worker.stats["quarantined"] == 1
    assert worker.stats["succeeded"] == 1


async def test_timeout_is_a_transient_failure_with_reason_timeout(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    @app.job("slow", queue="work", timeout=0.2, retry=RetryPolicy(max_attempts=2))
    async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        await asyncio.sleep(5)

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("slow", {})
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert runs == [1, 2]
    msgs = await quarantined(broker)
    assert [m.headers[evidence.REASON] for m in msgs] == ["timeout"]
    assert msgs[0].headers[evidence.ERROR_TYPE] == "TimeoutError"


async def test_sync_handler_and_permanent_error_and_immediate_retries(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    calls: list[str] = []

    class BadAddress(Exception):
        pass

    def send(payload: dict[str, Any], ctx: JobContext) -> None:  # plain function: runs in a thread
        calls.append(payload["kind"])
        if payload["kind"] == "permanent":
            raise BadAddress("no such mailbox")
        if payload["kind"] == "blip" and calls.count("blip") < 3:
            raise ConnectionError("blip")

    app.job("send", queue="work", retry=RetryPolicy(permanent=(BadAddress,), immediate_retries=2,
                                                    immediate_wait=0.01))(send)  # fmt: skip
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("send", {"kind": "permanent"})
        await app.enqueue("send", {"kind": "blip"})
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert calls == ["permanent", "blip", "blip", "blip"]  # permanent: no immediate retry
    assert [o.attempt for o in rec.outcomes] == [1, 1]
    msgs = await quarantined(broker)
    assert [m.headers[evidence.REASON] for m in msgs] == ["permanent"]
    assert str(msgs[0].headers[evidence.ERROR_TYPE]).endswith("BadAddress")


async def test_sync_publisher(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    app.job("mail", queue="work", payload=Mail)(lambda p, c: None)

    def publish_from_plain_code() -> list[str]:
        with app.sync_publisher(broker.url) as pub:
            ids = [pub.enqueue("mail", {"to": "a@example.com", "order_id": i}) for i in range(5)]
            with pytest.raises(InvalidPayloadError):
                pub.enqueue("mail", {"order_id": "x"})
            return ids

    ids = await asyncio.to_thread(publish_from_plain_code)
    assert len(set(ids)) == 5
    assert await depth(broker, "work") == 5


async def test_sync_handler_over_its_timeout_is_waited_for_never_run_twice(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    app = await make_app(broker, tmp_path)
    runs: list[int] = []

    def slow(payload: dict[str, Any], ctx: JobContext) -> None:
        time.sleep(0.5)
        runs.append(ctx.attempt)

    app.job("slow", queue="work", timeout=0.1)(slow)
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("slow", {})
        await rec.wait_for(lambda o: len(o) == 1)
        await asyncio.sleep(0.8)
    await app.close()
    assert runs == [1]
    assert [type(o.decision).__name__ for o in rec.outcomes] == ["Ack"]
    assert any("passed its timeout of 0.1s" in r.getMessage() for r in caplog.records)


async def test_worker_refuses_to_start_without_its_retry_tiers(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    app.job("x", queue="work")(lambda p, c: None)
    async with raw_channel(broker) as ch:
        await ch.queue_delete("work.retry.400ms")
    from amqpjobs import BrokerError, Worker, WorkerOptions

    with pytest.raises(BrokerError, match=r"work\.retry\.400ms do not exist"):
        await Worker(app, broker, WorkerOptions(queues=("work",))).start()
