"""A job app with a rate-limited job, for ``consume --processes`` tests (README "Flow control" -> "Rate limits").

Settings come from the environment: ``RATEAPP_TOPOLOGY`` (topology file), ``RATEAPP_RECORD``
(a file every run appends one line to, with O_APPEND: ``<job> start|done <time.time()> <pid>``)
and ``RATEAPP_RATE`` (the ``limited`` job's rate limit, default ``10/s``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from amqpjobs import App, JobContext

app = App("rateapp", topology=os.environ.get("RATEAPP_TOPOLOGY", "topology"))


def _append(line: str) -> None:
    """One small O_APPEND write per line: whole lines from many processes."""
    fd = os.open(os.environ["RATEAPP_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.job("limited", queue="work", rate_limit=os.environ.get("RATEAPP_RATE", "10/s"))
async def limited(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record the start time, nothing else."""
    _append(f"limited start {time.time():.6f} {os.getpid()}")


@app.job("other", queue="work")
async def other(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record start and end around a sleep of ``payload["seconds"]``."""
    _append(f"other start {time.time():.6f} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    _append(f"other done {time.time():.6f} {os.getpid()}")
