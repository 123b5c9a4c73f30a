"""A publisher we don't control sets ``amqpjobs-waiting-start`` on an idempotent job (README "Poison jobs").

The header is the worker's own note on a suspect's copy that waits in a retry tier (its claim
busy, or the ledger away): back in the work queue, the copy is registered again for that
start. Before, any publisher's value was honoured: the job was registered as a suspect at the
start it named (up to the last allowed), so a single crash, a worker killed by a deploy
included, quarantined it as ``crashed``; and it ran alone, stopping its worker's other jobs
meanwhile. Now the worker seals the value with a key kept in the ledger (HMAC over the job id
and the start): a value without a valid seal is ignored like any publisher's
``amqpjobs-starts``, and the job starts as an ordinary first start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiormq
import pytest

from amqpjobs import App, JobContext
from amqpjobs.jobs import crash
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import wait_until
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]


async def publish(broker: BrokerSettings, job_id: str, headers: dict[str, Any]) -> None:
    """A job as another stack publishes it: straight to the work queue, with the headers it likes."""
    connection = await connect(broker)
    try:
        channel = await connection.channel()
        underlay = await channel.get_underlay_channel()
        props = aiormq.spec.Basic.Properties(message_id=job_id, message_type="charge", delivery_mode=2,
                                             content_type="application/json",
                                             headers={"amqpjobs-job": "charge", **headers})  # fmt: skip
        await underlay.basic_publish(b"{}", exchange="", routing_key="work", properties=props)
    finally:
        await connection.close()


@pytest.mark.parametrize("forged", [6, 2, "2:" + "0" * 32, "abc"])
async def test_a_forged_waiting_start_is_an_ordinary_first_start(
    broker: BrokerSettings, tmp_path: Path, forged: object
) -> None:
    base = await make_app(broker, tmp_path)
    app = App("idem", topology=base.topology(), url=broker.url, ledger=SqliteLedger(tmp_path / "ledger.db"))
    starts: list[object] = []

    @app.job("charge", queue="work", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        starts.append(ctx.headers.get(crash.STARTS))

    async with running_worker(app, broker) as (_, rec):
        await publish(broker, "charge:forged", {crash.WAITING_START: forged})
        await wait_until(lambda: any(o.job_id == "charge:forged" and o.kind == "succeeded" for o in rec.outcomes), 20,
                         "the job's run")  # fmt: skip
    kinds = [o.kind for o in rec.outcomes if o.job_id == "charge:forged"]
    assert kinds == ["succeeded"], kinds  # not registered as a suspect ("redelivered") first
    assert starts == [None], starts  # an ordinary first start, charged nothing
