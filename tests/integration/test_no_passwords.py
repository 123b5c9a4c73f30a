"""An app's password or token in its handler's exception reaches no record: evidence, outcome, log line, traceback.

The handler raises ``ConnectionError("could not connect to postgres://app:s3cret@db/orders")``
(``retry=RetryPolicy(max_attempts=1)``: quarantined at once). The quarantine copy's error message
and traceback, the outcome's error (what the outcome event and the results store write) and every
log line, as the CLI's text and JSON formatters write it, say ``postgres://app:***@db/orders``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import RetryPolicy
from amqpjobs.jobs import evidence
from amqpjobs.jobs.outcome import Quarantine
from amqpjobs.runtime.logs import JsonFormatter, TextFormatter
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker

SECRET = "s3cret"
URL = f"postgres://app:{SECRET}@db/orders"
#: (what the handler's exception says after "could not connect to ", as every record must write it)
CASES = [
    (URL, "postgres://app:***@db/orders"),
    (f"https://ghp_{SECRET}@github.com/o/r", "https://***@github.com/o/r"),
    (f"{{'host': 'db', 'password': '{SECRET}'}}", "{'host': 'db', 'password': '***'}"),
]


@pytest.mark.parametrize(("raised", "written"), CASES, ids=["url-password", "url-token", "dict-item"])
async def test_a_password_in_a_handlers_exception_is_redacted_everywhere(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, raised: str, written: str
) -> None:
    app = await make_app(broker, tmp_path)

    async def sync_orders(payload: dict[str, Any], ctx: Any) -> None:
        raise ConnectionError(f"could not connect to {raised}")

    app.job("sync", queue="work", retry=RetryPolicy(max_attempts=1))(sync_orders)
    await app.enqueue("sync", {}, job_id="pw-1")
    with caplog.at_level(logging.DEBUG, logger="amqpjobs"):
        async with running_worker(app, broker) as (_, recorder):
            await recorder.wait_for(lambda o: any(isinstance(x.decision, Quarantine) for x in o))
    await app.close()
    (outcome,) = [o for o in recorder.outcomes if isinstance(o.decision, Quarantine)]
    async with raw_channel(broker) as ch:
        dead = await (await ch.get_queue("work.quarantine", ensure=False)).get(timeout=5)
        await dead.ack()
    message, tb = str(dead.headers[evidence.ERROR_MESSAGE]), str(dead.headers[evidence.TRACEBACK])
    assert message == f"could not connect to {written}"
    assert written in tb
    assert SECRET not in tb
    assert outcome.error == f"ConnectionError: could not connect to {written}"
    lines = [f.format(r) for r in caplog.records for f in (TextFormatter(), JsonFormatter())]
    assert any(written in line for line in lines)
    assert [line for line in lines if SECRET in line] == []
