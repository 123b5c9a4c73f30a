"""A job app with one cron schedule, for tests that run scheduler replicas as processes.

``amqpjobs schedule run tests.integration.schedapp:app``; settings come from the environment:
``SCHEDAPP_TOPOLOGY`` (topology file), ``SCHEDAPP_CRON`` (default every second) and
``SCHEDAPP_MISSED`` (``catch-up-once``, the default, or ``skip``).
"""

from __future__ import annotations

import os
from typing import Any, cast

from amqpjobs import App, JobContext
from amqpjobs.jobs.cron import MissedPolicy

app = App("schedapp", topology=os.environ.get("SCHEDAPP_TOPOLOGY", "topology"))


@app.cron(
    os.environ.get("SCHEDAPP_CRON", "* * * * * *"),
    name="every-second",
    payload={"source": "schedapp"},
    missed=cast(MissedPolicy, os.environ.get("SCHEDAPP_MISSED", "catch-up-once")),
)
@app.job("tick", queue="work")
async def tick(payload: dict[str, Any], ctx: JobContext) -> None:
    """Nothing: the tests read the enqueued jobs from the work queue."""
