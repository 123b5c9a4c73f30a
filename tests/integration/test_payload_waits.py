"""A stored payload (claim-check) is read only when its job is about to run, not for each wait.

Before, the worker read the payload from the store before it looked at the job's circuit
breaker (and the operator's pause): each pass of a job waiting on an open breaker read it
again, and a store that failed the read made the delivery a failed attempt (``payload-store-error``,
retried in a tier, quarantined ``exhausted`` in the end) though it was never going to run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, Breaker, FilePayloadStore, JobContext
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent, pytest.mark.timeout(90)]


class CountingStore(FilePayloadStore):
    """A FilePayloadStore that counts its reads, and fails them while ``failing``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, threshold=64)
        self.reads = 0
        self.failing = False

    async def read(self, key: str) -> bytes | None:
        self.reads += 1
        if self.failing:
            raise OSError(5, "Input/output error", key)
        return await super().read(key)


async def breaker_app(broker: BrokerSettings, tmp_path: Path, ran: list[str]) -> tuple[App, CountingStore]:
    base = await make_app(broker, tmp_path)
    store = CountingStore(tmp_path / "payloads")
    app = App("waits", topology=base.topology(), url=broker.url, payload_store=store)

    @app.job("flaky", queue="work", breaker=Breaker(failures=1, window="1m", cool_down="1m"))
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)
        if ctx.job_id == "trip":
            raise ConnectionError("the provider is down")

    return app, store


def waits(rec: Recorder, job_id: str) -> list[Any]:
    return [o for o in rec.outcomes if o.job_id == job_id]


@pytest.mark.parametrize("failing", [False, True], ids=["store-reads", "store-fails"])
async def test_a_job_behind_an_open_breaker_reads_no_stored_payload(
    broker: BrokerSettings, tmp_path: Path, failing: bool
) -> None:
    ran: list[str] = []
    app, store = await breaker_app(broker, tmp_path, ran)
    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("flaky", {"small": 1}, job_id="trip")  # inline (below the threshold): fails, opens it
        await rec.wait_for(lambda o: len(o) == 1)
        assert store.reads == 0
        store.failing = failing
        await app.enqueue("flaky", {"big": "x" * 1000}, job_id="big")  # stored
        started = time.monotonic()
        await rec.wait_for(lambda o: len(waits(rec, "big")) >= 4, timeout=30)  # handed back to a tier 4 times
    await app.close()
    passes = waits(rec, "big")
    assert ran == ["trip"]
    assert {o.kind for o in passes} == {"deferred"}
    assert {o.attempt for o in passes} == {1}  # before, failing: 1, 2, 3, 4 (payload-store-error each pass)
    assert all(o.error.startswith("BreakerOpen") for o in passes), passes[0].error
    assert store.reads == 0  # before: one read per pass (4 or more)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("failing", [False, True], ids=["store-reads", "store-fails"])
async def test_a_done_idempotent_job_is_a_duplicate_without_a_read(
    broker: BrokerSettings, tmp_path: Path, failing: bool
) -> None:
    """Its claim answers done: nothing runs, so nothing is read (before: read first, and a store failing the read
    made the duplicate a failed attempt, ``retried``)."""
    base = await make_app(broker, tmp_path)
    store = CountingStore(tmp_path / "payloads")
    app = App("waits", topology=base.topology(), url=broker.url, payload_store=store,
              ledger=SqliteLedger(tmp_path / "ledger.db"))  # fmt: skip
    ran: list[int] = []

    @app.job("charge", queue="work", idempotent=True)
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(len(payload["big"]))

    async with running_worker(app, broker) as (_, rec):
        await app.enqueue("charge", {"big": "x" * 1000}, job_id="pay-1")
        await rec.wait_for(lambda o: len(o) == 1)
        assert store.reads == 1  # read to run it
        store.failing = failing
        await app.enqueue("charge", {"big": "y" * 1000}, job_id="pay-1")  # the same job again
        await rec.wait_for(lambda o: len(o) == 2)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["succeeded", "duplicate"]
    assert ran == [1000]
    assert store.reads == 1  # before: 2
