"""An idempotent job published without ``message_id`` keeps its payload key through a redelivery.

Without ``message_id`` the worker keys an idempotent job by its payload (README "Idempotency":
``sha256:`` of its headers and body when the job has no ``key`` function), so a redelivery finds
the claim of its first start and an identical message is a ``duplicate``. Before: a redelivered
one (a killed worker's start; here taken and not acked) was registered for a start alone under a
``generated-<uuid>`` job id, which it then ran as, so an identical message later ran again
(``assert 2 == 1`` on 3.10.8). Published through the management API: nothing fills in a message_id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs import App, JobContext
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel
from tests.integration.worker_env import running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the worker's keying, not the broker's


def _publish(broker: BrokerSettings) -> None:
    doc = {"properties": {"type": "charge", "content_type": "application/json"}, "routing_key": "work",
           "payload": '{"n": 1}', "payload_encoding": "string"}  # fmt: skip
    with ManagementClient(broker) as mgmt:
        assert mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc) == {
            "routed": True
        }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("redelivered", [False, True], ids=["first-delivery", "redelivered"])
@pytest.mark.parametrize("keyed", [False, True], ids=["hashed", "key-function"])
async def test_an_idempotent_job_without_message_id_runs_under_its_payload_key_after_a_redelivery_too(
    broker: BrokerSettings, tmp_path: Path, redelivered: bool, keyed: bool
) -> None:
    """With a ``key`` function the key is its value; before, a redelivery ran as ``generated-<uuid>``, then again."""
    path = tmp_path / "topology.toml"
    path.write_text(work_topology())
    await apply_topology(path, broker)
    app = App("unnamed", topology=path, url=broker.url, ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    ran: list[str] = []

    key = (lambda p: f"charge-{p['n']}") if keyed else None

    @app.job("charge", queue="work", idempotent=True, key=key)
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    _publish(broker)
    if redelivered:  # taken and not acked: back in the queue marked redelivered, as after a killed worker
        async with raw_channel(broker) as ch:
            queue = await ch.get_queue("work", ensure=False)
            assert await queue.get(fail=False, no_ack=False) is not None
    try:
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda outs: any(o.kind == "succeeded" for o in outs), 20)
            _publish(broker)  # the same message again: the same key, a duplicate
            await recorder.wait_for(lambda outs: any(o.kind == "duplicate" for o in outs), 20)
    finally:
        await app.close()
    assert len(ran) == 1, ran
    assert ran[0] == "charge-1" if keyed else ran[0].startswith("sha256:"), ran
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.suspects") == 0
    assert await depth(broker, "work.quarantine") == 0
