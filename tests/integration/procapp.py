"""A job app for tests that run the worker as a separate process (`amqpjobs consume`).

Settings come from the environment: ``PROCAPP_TOPOLOGY`` (topology file),
``PROCAPP_RECORD`` (a file each run appends "start <id> <attempt> <redelivered 0|1> <pid>" and
"done <id> <pid>" lines to) and ``PROCAPP_RESULTS`` (a SQLite results store; none when unset).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from amqpjobs import App, JobContext, SqliteResults

_results = os.environ.get("PROCAPP_RESULTS")
app = App(
    "procapp",
    topology=os.environ.get("PROCAPP_TOPOLOGY", "topology"),
    results=SqliteResults(_results) if _results else None,
)


def _record(line: str) -> None:
    with open(os.environ["PROCAPP_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@app.job("sleep", queue="work", timeout="60s")
async def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
    """Sleep ``payload["seconds"]``, recording start and completion."""
    _record(f"start {ctx.job_id} {ctx.attempt} {int(ctx.redelivered)} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    _record(f"done {ctx.job_id} {os.getpid()}")
