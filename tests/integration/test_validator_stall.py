"""A payload model's validator is app code on the event loop: a block in it is said as a handler's is.

Before, the stall watch knew only handler runs: a ``@field_validator`` that called
``time.sleep(8)`` stopped the loop (heartbeats with it) with no WARNING at all, and the job's
line said ``duration=0.000s outcome=succeeded`` (helper-226). Validation runs on the loop for
every job, a plain-function handler's too, so the fix it names is not the handler's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from urllib.parse import quote

import aio_pika
import pytest
from pydantic import BaseModel, field_validator

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.jobs.outcome import Outcome
from amqpjobs.runtime import stall
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""


class Slow(BaseModel):
    """A payload whose validator blocks for ``seconds`` (or raises SystemExit when it is negative)."""

    seconds: float

    @field_validator("seconds")
    @classmethod
    def wait(cls, value: float) -> float:
        if value < 0:
            raise SystemExit(3)
        time.sleep(value)
        return value


async def _run(broker: BrokerSettings, tmp_path: Path, seconds: float) -> list[Outcome]:
    topo = tmp_path / "topology.toml"
    topo.write_text(TOPOLOGY)
    await apply_topology(topo, broker)
    app = App("validator-stall", topology=load_topology(topo).topology, url=broker.url)
    ran: list[str] = []

    @app.job("v", queue="work", payload=Slow)
    def v(payload: Slow, ctx: JobContext) -> None:  # a plain function: validation is on the loop all the same
        ran.append(ctx.job_id)

    outcomes: list[Outcome] = []
    await app.enqueue("v", {"seconds": 0}, job_id="slow-val")  # validated at enqueue: 0 passes there
    worker = Worker(app, broker, WorkerOptions(queues=("work",), grace=5), on_outcome=outcomes.append)
    async with raw_channel(broker) as ch:  # raw: enqueue would run the validator here, in the test
        exchange = await ch.get_exchange("jobs")
        body = f'{{"seconds": {seconds}}}'.encode()
        await exchange.publish(
            aio_pika.Message(body, type="v", message_id="raw-val", content_type="application/json"), "work"
        )
    await worker.start()
    try:
        deadline = time.monotonic() + 20
        while len(outcomes) < 2:
            assert time.monotonic() < deadline, outcomes
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the loop's own line comes on its next tick
    finally:
        await worker.shutdown()
        await app.close()
    return outcomes


async def test_a_validator_that_blocks_the_loop_is_said_while_it_blocks_and_after(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stall, "BLOCKED_WARN_AFTER", 0.5)
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        outcomes = await _run(broker, tmp_path, 2.0)
    assert sorted((o.job_id, o.kind) for o in outcomes) == [("raw-val", "succeeded"), ("slow-val", "succeeded")]
    lines = [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(lines) == 2, lines
    live, after = sorted(lines, key=lambda line: "still does" not in line)
    model = f"{__name__}.Slow"
    assert live.startswith(
        f"job=v id=raw-val payload_model={model} has blocked the event loop for 0.5s validating its payload "
        "(before its handler started) and still does: heartbeats have stopped with it"
    ), live
    assert live.endswith(
        "A payload model's validators run on the event loop for every job, whatever the handler: keep them quick "
        "and move the blocking call into the handler (a plain `def` runs in a thread)"
    ), live
    assert after.startswith("job=v id=raw-val blocked the event loop for "), after
    seconds = float(after.split(" for ")[1].split("s ")[0])
    assert 1.7 <= seconds <= 3.0, after
    assert "validating its payload (before its handler started): heartbeats stop" in after


async def test_a_validator_raising_system_exit_is_quarantined_as_the_validations_raise(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    outcomes = await _run(broker, tmp_path, -1)
    by_id = {o.job_id: o for o in outcomes}
    assert by_id["raw-val"].kind == "quarantined"
    assert by_id["raw-val"].failure[0] == "SystemExit"
    assert by_id["raw-val"].failure[1] == (
        "SystemExit(3) raised by its payload model's validation, not a signal to the worker: a failure of this job "
        "(the worker went on)"
    )
    assert by_id["slow-val"].kind == "succeeded"


class Keyed(BaseModel):
    """A payload of no validator of its own."""

    seconds: float


def slow_key(payload: Keyed) -> str:
    """An idempotent job's key function: blocks for the payload's seconds, or raises SystemExit when negative."""
    if payload.seconds < 0:
        raise SystemExit(4)
    time.sleep(payload.seconds)
    return f"k-{payload.seconds}"


@pytest.mark.parametrize("seconds", [2.0, -1.0], ids=["blocks", "raises"])
async def test_an_idempotent_jobs_key_function_is_watched_and_its_raise_keys_by_the_payload(
    broker: BrokerSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    seconds: float,
) -> None:
    """helper-227: a key function's 7 s block left no line; its SystemExit quarantined the job as ``worker-error``."""
    monkeypatch.setattr(stall, "BLOCKED_WARN_AFTER", 0.5)
    topo = tmp_path / "topology.toml"
    topo.write_text(TOPOLOGY)
    await apply_topology(topo, broker)
    app = App("key-stall", topology=load_topology(topo).topology, url=broker.url,
              ledger=SqliteLedger(str(tmp_path / "ledger.db")))  # fmt: skip
    ran: list[str] = []

    @app.job("k", queue="work", payload=Keyed, idempotent=True, key=slow_key)
    async def k(payload: Keyed, ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    outcomes: list[Outcome] = []
    published = {"properties": {"type": "k", "content_type": "application/json"}, "routing_key": "work",
                 "payload": f'{{"seconds": {seconds}}}', "payload_encoding": "string"}  # fmt: skip
    with ManagementClient(broker) as mgmt:  # no message_id (aiormq gives every publish one): the worker keys it
        mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=published)
    worker = Worker(app, broker, WorkerOptions(queues=("work",), grace=5), on_outcome=outcomes.append)
    with caplog.at_level(logging.WARNING, logger="amqpjobs.worker"):
        await worker.start()
        try:
            deadline = time.monotonic() + 20
            while not outcomes:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
        finally:
            await worker.shutdown()
            await app.close()
    assert [o.kind for o in outcomes] == ["succeeded"], outcomes
    lines = [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]
    if seconds > 0:
        assert ran == ["k-2.0"]
        live = next(line for line in lines if "still does" in line)
        assert live.startswith("job=k id=generated-"), live  # the id it gets is the key being computed
        assert (
            f" key={__name__}.slow_key has blocked the event loop for 0.5s computing its idempotency key (before its "
            "handler started) and still does"
        ) in live
        assert "A job's key function runs on the event loop" in live
    else:
        assert lines == []
        assert len(ran) == 1
        assert ran[0].startswith("sha256:"), ran  # keyed by its payload, as when the key function raises an Exception
        assert not [r for r in caplog.records if "failed inside the worker" in r.getMessage()]
