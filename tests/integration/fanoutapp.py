"""A job app whose async handler enqueues jobs through the app, for tests of a worker process's stop.

``amqpjobs consume tests.integration.fanoutapp:app --queues work``; the topology file comes
from ``FANOUTAPP_TOPOLOGY`` (job queues ``work`` and ``side``). A ``parent`` job enqueues
``payload["n"]`` ``child`` jobs to ``side`` at once (``asyncio.gather`` of ``app.enqueue``),
job ids ``<parent id>-c<k>``: the app's own publishing connection, opened by the first.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from amqpjobs import App, JobContext

app = App("fanoutapp", topology=os.environ.get("FANOUTAPP_TOPOLOGY", "topology"))


@app.job("parent", queue="work", timeout="60s")
async def parent(payload: dict[str, Any], ctx: JobContext) -> None:
    """Enqueue ``payload["n"]`` children to ``side``, all at once."""
    children = (app.enqueue("child", {"k": k}, job_id=f"{ctx.job_id}-c{k}") for k in range(int(payload["n"])))
    await asyncio.gather(*children)


@app.job("child", queue="side")
async def child(payload: dict[str, Any], ctx: JobContext) -> None:
    """Nothing: the tests count the children stored in ``side`` (no worker consumes it)."""
