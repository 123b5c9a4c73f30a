"""A message no AMQP 0-9-1 client can receive is moved to quarantine with evidence, never dropped.

RabbitMQ 3.10 stores a message published through the management API's HTTP publish with a
short-string property (``correlation_id``, ``message_id`` ...) or a header name over 255 bytes;
every delivery of it closes the reading connection (541 INTERNAL_ERROR) and leaves it at the
head of its queue (README "Wire format"). The worker reads it through the management API
("Get messages", requeued), publishes a copy a 0-9-1 client can read to the quarantine with a
confirm, and only then removes the original, checking that it removes that very message: a
process killed at any step leaves the job in the work queue, the quarantine, or both.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import ROOT, depth
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = pytest.mark.broker
LONG = "c" * 300
KINDS: dict[str, dict[str, Any]] = {
    "correlation-id": {"correlation_id": LONG},
    "message-id": {"message_id": "m" * 300},
    "message-id-10kb": {"message_id": "m" * 10240},  # the data file's "message-id-10kb" (an HTTP publisher's)
    "header-name": {"headers": {"h" * 300: "v", "keep": "k"}},
}


def _publish_over_http(
    broker: BrokerSettings, props: dict[str, Any], routing_key: str = "work", body: bytes = b'{"n": 0}'
) -> None:
    doc = {
        "properties": {"content_type": "application/json", "type": "sleep", "message_id": "long-one",
                       "delivery_mode": 2, **props},
        "routing_key": routing_key, "payload": base64.b64encode(body).decode(), "payload_encoding": "base64",
    }  # fmt: skip
    with ManagementClient(broker) as mgmt:
        assert mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc) == {
            "routed": True
        }


def _peek_all(broker: BrokerSettings, queue: str, count: int = 100) -> list[dict[str, Any]]:
    """The first ``count`` messages, left in place (each then counts as redelivered: peek a work queue's head only)."""
    with ManagementClient(broker) as mgmt:
        got = mgmt.request("POST", f"/queues/{quote(broker.vhost, safe='')}/{queue}/get",
                           json={"count": count, "ackmode": "reject_requeue_true", "encoding": "auto"})  # fmt: skip
    assert isinstance(got, list)
    return got


async def _recording_app(broker: BrokerSettings, tmp_path: Path) -> tuple[App, list[int]]:
    """The fast topology's app with job ``sleep`` on ``work``: the payloads' ``n`` it ran, in order."""
    app = await make_app(broker, tmp_path)
    ran: list[int] = []

    @app.job("sleep", queue="work")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(int(payload["n"]))

    return app, ran


async def _own_topology_app(broker: BrokerSettings, tmp_path: Path, text: str, queue: str) -> tuple[App, list[str]]:
    """An app of topology ``text`` (applied) with job ``sleep`` on ``queue``: the job ids it ran."""
    path = tmp_path / "own.toml"
    path.write_text(text)
    await apply_topology(path, broker)
    app = App("test", topology=load_topology(path).topology, url=broker.url)
    ran: list[str] = []

    @app.job("sleep", queue=queue)
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    return app, ran


async def _run_until_ran(app: App, broker: BrokerSettings, queue: str, ran: list[str], count: int, wait: float) -> None:
    """A worker of ``app`` on job queue ``queue`` (concurrency 2) until ``ran`` holds ``count`` ids; the app closed."""
    rec = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=(queue,), concurrency=2, grace=10), rec)
    await worker.start()
    try:
        await rec.wait_for(lambda _: len(set(ran)) >= count, timeout=wait)
    finally:
        await worker.shutdown()
        await app.close()


@pytest.fixture
def http_publish_stores_it(broker: BrokerSettings) -> None:
    """RabbitMQ 4.x refuses such an HTTP publish (506 content_properties_shortstr_overflow, measured on 4.3.6)."""
    if _version(broker) >= (4,):
        pytest.skip("RabbitMQ 4.x refuses the HTTP publish of such a message (see the AMQP 1.0 test)")


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_worker_quarantines_the_message_and_runs_the_jobs_behind_it(
    broker: BrokerSettings, tmp_path: Path, kind: str
):
    app, ran = await _recording_app(broker, tmp_path)
    await asyncio.to_thread(_publish_over_http, broker, KINDS[kind])
    for n in (1, 2, 3):
        await app.enqueue("sleep", {"n": n}, job_id=f"good-{n}")
    async with running_worker(app, broker, concurrency=2) as (_, rec):
        await rec.wait_for(lambda _: len(ran) >= 3, timeout=60)  # a job fetched with it comes back redelivered
    await app.close()
    assert sorted(ran) == [1, 2, 3]
    assert await depth(broker, "work") == 0
    (copy,) = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    props, headers = copy["properties"], copy["properties"]["headers"]
    assert headers["amqpjobs-reason"] == "undeliverable"
    assert headers["amqpjobs-original-queue"] == "work"
    assert headers["amqpjobs-job"] == "sleep"
    assert "over 255 bytes" in headers["amqpjobs-error-message"]
    assert len(headers["amqpjobs-undeliverable-sha256"]) == 64
    assert (
        base64.b64decode(copy["payload"]) == b'{"n": 0}'
        if copy["payload_encoding"] == "base64"
        else (copy["payload"] == '{"n": 0}')
    )
    if kind == "correlation-id":
        assert "correlation_id" not in props
        assert headers["amqpjobs-undeliverable-correlation_id"] == LONG
        assert props["message_id"] == headers["amqpjobs-job-id"] == "long-one"
    elif kind.startswith("message-id"):
        assert headers["amqpjobs-undeliverable-message_id"] == KINDS[kind]["message_id"]
        assert props["message_id"] == headers["amqpjobs-job-id"]
        assert props["message_id"].startswith("undeliverable-")
    else:
        assert "h" * 300 not in headers
        assert headers["keep"] == "k"
        assert headers["amqpjobs-undeliverable-headers"] == '{"' + "h" * 300 + '": "v"}'


STEPS = ("locked", "peeked", "copied", "removed")
_DIE = """
import asyncio, os, signal, sys
from amqpjobs.runtime.undeliverable import rescue_heads
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import broker_settings

async def main() -> None:
    settings = broker_settings(sys.argv[1], sys.argv[2])
    connection = await connect(settings, name="rescue-test")
    def step(name: str) -> None:
        print("step", name, flush=True)
        if name == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)
    await rescue_heads(settings, connection, {"work": "work.quarantine"}, on_step=step)
    print("done", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("step", STEPS)
async def test_a_rescue_killed_at_any_step_loses_nothing(broker: BrokerSettings, tmp_path: Path, step: str):
    """3.10: a 300-byte correlation_id published over HTTP; 4.x: a 300-byte content-type over AMQP 1.0."""
    if (http := _version(broker) < (4,)) is False:
        pytest.importorskip("proton", reason="python-qpid-proton (the dev extra) publishes AMQP 1.0")
    app, ran = await _recording_app(broker, tmp_path)
    if http:
        await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"])
    else:
        await asyncio.to_thread(_publish_amqp10, broker, "application/json; x=" + LONG)
    moved = "correlation_id" if http else "content_type"
    for n in (1, 2, 3):
        await app.enqueue("sleep", {"n": n}, job_id=f"good-{n}")
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _DIE, broker.url, broker.management_url, step],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert f"step {step}" in proc.stdout.splitlines()[-1]
    # the 3 good jobs are untouched; the original, when still there, is at the head (peek only then:
    # a peeked good job would come back redelivered, and the worker would take it for a crash's)
    originals = await depth(broker, "work") - 3
    if originals:
        (head,) = await asyncio.to_thread(_peek_all, broker, "work", 1)
        assert LONG in head["properties"][moved]
    quarantined = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    copies = [m for m in quarantined if LONG in m["properties"]["headers"].get(f"amqpjobs-undeliverable-{moved}", "")]
    assert originals + len(copies) >= 1, (step, quarantined)  # never zero
    expected = {"locked": (1, 0), "peeked": (1, 0), "copied": (1, 1), "removed": (0, 1)}[step]
    assert (originals, len(copies)) == expected
    # a worker then finishes the job: the 3 run, the message ends in quarantine (twice at worst)
    async with running_worker(app, broker, concurrency=2) as (_, rec):
        await rec.wait_for(lambda _: len(ran) >= 3, timeout=60)  # a job fetched with it comes back redelivered
    await app.close()
    assert sorted(ran) == [1, 2, 3], rec.outcomes
    assert await depth(broker, "work") == 0
    final = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    assert 1 <= len(final) <= 2
    assert all(m["properties"]["headers"]["amqpjobs-reason"] == "undeliverable" for m in final)


def _version(broker: BrokerSettings) -> tuple[int, ...]:
    with ManagementClient(broker) as mgmt:
        return mgmt.broker_version()


def _publish_amqp10(broker: BrokerSettings, content_type: str) -> None:
    """A job over AMQP 1.0 (RabbitMQ 4.x), to exchange ``jobs`` with key ``work``, whose content-type is given."""
    from urllib.parse import urlsplit

    from proton import Message
    from proton.utils import BlockingConnection

    url = urlsplit(broker.url)
    conn = BlockingConnection(f"amqp://{url.hostname}:{url.port}", virtual_host=f"vhost:{broker.vhost}",
                              user=url.username, password=url.password, allowed_mechs="PLAIN")  # fmt: skip
    try:
        message = Message(body=b'{"n": 0}', durable=True, id="long-ct", subject="sleep", content_type=content_type)
        message.inferred = True  # the body is the bytes themselves (a data section)
        conn.create_sender("/exchanges/jobs/work").send(message)
    finally:
        conn.close()


async def test_on_rabbitmq_4_an_amqp_1_0_content_type_over_255_bytes_is_quarantined_too(
    broker: BrokerSettings, tmp_path: Path
):
    """RabbitMQ 4.3 refuses the HTTP publish of such a message (506), but takes it over AMQP 1.0.

    Measured on 4.3.6: an AMQP 1.0 ``content-type`` over 255 bytes is stored and every 0-9-1
    delivery of it closes the connection with 541, as on 3.10 (a long ``message-id`` or
    ``correlation-id`` the broker moves into ``x-message-id``/``x-correlation-id`` headers, a long
    ``subject``, ``reply-to`` or application property name it leaves out: all deliverable).
    """
    pytest.importorskip("proton", reason="python-qpid-proton (the dev extra) publishes AMQP 1.0")
    if _version(broker) < (4,):
        pytest.skip("AMQP 1.0 publishers reach our queues from RabbitMQ 4.0 (3.10: the HTTP publish, above)")
    app = await make_app(broker, tmp_path)
    ran: list[int] = []

    @app.job("sleep", queue="work")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(int(payload["n"]))

    long_type = "application/json; x=" + "p" * 300
    await asyncio.to_thread(_publish_amqp10, broker, long_type)
    for n in (1, 2, 3):
        await app.enqueue("sleep", {"n": n}, job_id=f"good-{n}")
    async with running_worker(app, broker, concurrency=2) as (_, rec):
        await rec.wait_for(lambda _: len(ran) >= 3, timeout=60)
    await app.close()
    assert sorted(ran) == [1, 2, 3]
    assert await depth(broker, "work") == 0
    (copy,) = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    headers = copy["properties"]["headers"]
    assert (headers["amqpjobs-reason"], headers["amqpjobs-job-id"]) == ("undeliverable", "long-ct")
    assert headers["amqpjobs-undeliverable-content_type"] == long_type
    assert "content_type" not in copy["properties"]


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seconds", [(1, 1), (0.2, 3)], ids=["ending-together", "second-much-later"])
async def test_behind_slow_jobs_it_waits_for_them_then_goes(
    broker: BrokerSettings, tmp_path: Path, seconds: tuple[float, float]
):
    """Two slow jobs ahead of it in the worker's hands: the 541 comes when the first is acked, and
    the second goes back ahead of it (redelivered). With a prefetch of 2 the broker would send that
    one and the message together at every reconnect (a 541 each time, the look at the head finding
    the good job: CI on 3.10.8, 90 s without the third job); after a 541 the worker takes one
    delivery at a time, so the message is at the head when it is sent, and is moved."""
    app = await make_app(broker, tmp_path)
    ran: list[int] = []

    @app.job("sleep", queue="work")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(float(payload.get("s", 0)))
        ran.append(int(payload["n"]))

    for n, s in zip((1, 2), seconds, strict=True):
        await app.enqueue("sleep", {"n": n, "s": s}, job_id=f"slow-{n}")
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"])
    await app.enqueue("sleep", {"n": 3}, job_id="good-3")
    async with running_worker(app, broker, concurrency=2) as (_, rec):
        await rec.wait_for(lambda _: {1, 2, 3} <= set(ran), timeout=60)
        outcomes = [(o.job_id, type(o.decision).__name__) for o in rec.outcomes]
    await app.close()
    # the first 541 cuts slow-2's ack whenever it ends after slow-1 (at least once: it may run twice), no more
    assert (ran.count(1), ran.count(3)) == (1, 1), ran
    assert 1 <= ran.count(2) <= 2, ran
    assert await depth(broker, "work") == 0
    (copy,) = await asyncio.to_thread(_peek_all, broker, "work.quarantine")
    assert copy["properties"]["headers"]["amqpjobs-reason"] == "undeliverable"
    assert all(name != "Quarantine" for _, name in outcomes), outcomes


SHARDED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "split"
exchange = "jobs"
shards = 2
"""


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.timeout(120)
async def test_in_a_shard_it_goes_to_quarantine_and_every_shard_runs(broker: BrokerSettings, tmp_path: Path):
    app, ran = await _own_topology_app(broker, tmp_path, SHARDED, "split")
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"], "split.shard-0")
    await asyncio.to_thread(_publish_over_http, broker, KINDS["header-name"], "split.shard-1")
    for n in range(6):
        await app.enqueue("sleep", {"n": n}, job_id=f"t-{n}", tenant=f"tenant-{n}")
    await _run_until_ran(app, broker, "split", ran, 6, 90)
    assert sorted(ran) == [f"t-{n}" for n in range(6)]
    assert (await depth(broker, "split.shard-0"), await depth(broker, "split.shard-1")) == (0, 0)
    copies = await asyncio.to_thread(_peek_all, broker, "split.quarantine")
    origins = sorted(m["properties"]["headers"]["amqpjobs-original-queue"] for m in copies)
    assert origins == ["split.shard-0", "split.shard-1"]


@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.timeout(120)
async def test_in_a_shard_behind_a_slow_job_it_goes_to_quarantine(broker: BrokerSettings, tmp_path: Path):
    """A shard's takes after a 541 are one at a time too: the slow job that went back ahead of the
    message is run and acked before the message is taken, so it is the head when its 541 comes."""
    path = tmp_path / "own.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("test", topology=load_topology(path).topology, url=broker.url)
    ran: list[str] = []

    @app.job("sleep", queue="split")
    async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
        await asyncio.sleep(float(payload.get("s", 0)))
        ran.append(ctx.job_id)

    for job_id, seconds in (("slow-1", 0.2), ("slow-2", 3)):
        body = json.dumps({"s": seconds}).encode()
        await asyncio.to_thread(_publish_over_http, broker, {"message_id": job_id}, "split.shard-0", body)
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"], "split.shard-0")
    await asyncio.to_thread(_publish_over_http, broker, {"message_id": "good-3"}, "split.shard-0")
    await _run_until_ran(app, broker, "split", ran, 3, 60)
    assert sorted(set(ran)) == ["good-3", "slow-1", "slow-2"]  # slow-2 maybe twice: the 541 cut its ack
    assert (await depth(broker, "split.shard-0"), await depth(broker, "split.shard-1")) == (0, 0)
    (copy,) = await asyncio.to_thread(_peek_all, broker, "split.quarantine")
    assert copy["properties"]["headers"]["amqpjobs-reason"] == "undeliverable"


QUORUM = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "q"
exchange = "jobs"
type = "quorum"
delivery_limit = 3
"""


@pytest.mark.xfail(
    strict=True,
    reason="open: a quorum queue puts returned messages at its back, so the message is never at the head after its "
    "first delivery; the broker dead-letters it, and the good job fetched with it, into quarantine as they are at "
    "the delivery limit (measured on 3.10.8); the worker does not read a quorum queue's head (quarantines_of)",
)
@pytest.mark.usefixtures("http_publish_stores_it")
@pytest.mark.timeout(120)
async def test_on_a_quorum_job_queue_it_goes_to_quarantine_once_with_evidence(broker: BrokerSettings, tmp_path: Path):
    """A quorum queue counts each failed delivery (and each requeued read) against its delivery
    limit and would dead-letter the message as it is into the quarantine, where the quarantine
    tools can't read it either: the worker moves it first, at the first 541."""
    app, ran = await _own_topology_app(broker, tmp_path, QUORUM, "q")
    await asyncio.to_thread(_publish_over_http, broker, KINDS["correlation-id"], "q")
    for n in range(3):
        await app.enqueue("sleep", {"n": n}, job_id=f"j-{n}")
    await _run_until_ran(app, broker, "q", ran, 3, 20)
    assert sorted(ran) == ["j-0", "j-1", "j-2"]
    assert await depth(broker, "q") == 0
    (copy,) = await asyncio.to_thread(_peek_all, broker, "q.quarantine")  # the copy, not the original dead-lettered
    headers = copy["properties"]["headers"]
    assert (headers["amqpjobs-reason"], headers["amqpjobs-undeliverable-correlation_id"]) == ("undeliverable", LONG)
    assert "x-death" not in headers
