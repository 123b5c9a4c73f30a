"""Rate-limited jobs published without ``message_id`` (a foreign publisher): every one runs, as without the limit.

A rate-limited job's delivery is moved into its waiting room as a copy (amqpjobs.runtime.rate_limits
``divert``); a message without ``message_id`` got a ``generated-<uuid>`` id there, a path no test
took. Each test publishes raw (no id) to the work queue and counts what ran and what is left in
the work queue, the waiting room and the quarantine, with the rate limit and, where it matters,
without it (the same jobs must come out the same).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs import App, JobContext
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.topology.naming import rate_queue_names
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the worker's copies, not the broker's rules

ROOMS = rate_queue_names("work", "note")


async def _run(
    broker: BrokerSettings, tmp_path: Path, rate_limit: str | None, bodies: list[str], expected: int, **job: Any
) -> list[str]:
    """Publish ``bodies`` (job ``note``, no message_id) and run a worker until ``expected`` ran; the job ids run."""
    path = tmp_path / "topology.toml"
    path.write_text(work_topology())
    await apply_topology(path, broker)
    app = App("unnamed", topology=path, url=broker.url, ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    ran: list[str] = []

    @app.job("note", queue="work", rate_limit=rate_limit, **job)
    async def note(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    with ManagementClient(broker) as mgmt:  # as from its web UI: nothing fills in a message_id (aio-pika would)
        for body in bodies:
            doc = {"properties": {"type": "note", "content_type": "application/json"}, "routing_key": "work",
                   "payload": body, "payload_encoding": "string"}  # fmt: skip
            answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
            assert answer == {"routed": True}
    try:
        async with running_worker(app, broker, concurrency=2) as (_, recorder):
            # each message ends succeeded or duplicate; one that met its twin's claim is first deferred (a copy
            # back later: counted, it left 1 in work in CI on 3.10.8, -n 4)
            await recorder.wait_for(
                lambda outs: sum(o.kind in ("succeeded", "duplicate") for o in outs) >= len(bodies), 30
            )
            await asyncio.sleep(1.0)  # a run more than expected would come meanwhile
    finally:
        await app.close()
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0
    if rate_limit is not None:
        assert await depth(broker, ROOMS.waiting) == 0
    return ran


@pytest.mark.timeout(90)
async def test_rate_limited_jobs_without_message_id_each_run_once_with_an_id_of_their_own(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    bodies = [f'{{"n": {i % 3}}}' for i in range(12)]  # bodies alike: a job that is not idempotent runs each
    ran = await _run(broker, tmp_path, "20/s", bodies, 12)
    assert len(ran) == 12
    assert len(set(ran)) == 12
    assert all(job_id.startswith("generated-") and len(job_id) == len("generated-") + 36 for job_id in ran), ran


@pytest.mark.timeout(90)
@pytest.mark.parametrize("rate_limit", [None, "20/s"], ids=["no-limit", "rate-limited"])
async def test_an_idempotent_job_without_message_id_is_one_job_per_payload_with_or_without_a_rate_limit(
    broker: BrokerSettings, tmp_path: Path, rate_limit: str | None
) -> None:
    # README "Idempotency": without message_id an idempotent job is keyed by its payload, so identical ones are one
    bodies = ['{"n": 1}'] * 3 + ['{"n": 2}'] * 2
    ran = await _run(broker, tmp_path, rate_limit, bodies, 2, idempotent=True)
    assert len(ran) == 2, ran
    assert len(set(ran)) == 2
    assert not any(job_id.startswith("generated-") for job_id in ran), ran
