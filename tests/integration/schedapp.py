"""A job app with one cron schedule, for tests that run scheduler replicas as processes.

``amqpjobs schedule run tests.integration.schedapp:app``; settings come from the environment:
``SCHEDAPP_TOPOLOGY`` (topology file), ``SCHEDAPP_CRON`` (default every second) and
``SCHEDAPP_MISSED`` (``catch-up-once``, the default, or ``skip``); ``SCHEDAPP_SLOW_IMPORT``
(seconds: importing this module appends "importing <pid>" to ``SCHEDAPP_RECORD``, then sleeps
that long: an app slow to load).
"""

from __future__ import annotations

import os
import time
from typing import Any, cast

from amqpjobs import App, JobContext
from amqpjobs.jobs.cron import MissedPolicy

if os.environ.get("SCHEDAPP_SLOW_IMPORT"):
    with open(os.environ["SCHEDAPP_RECORD"], "a", encoding="utf-8") as _fh:
        _fh.write(f"importing {os.getpid()}\n")
    time.sleep(float(os.environ["SCHEDAPP_SLOW_IMPORT"]))

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
