"""A worker of two job queues whose connections the broker closes after the first queue's consumer took deliveries.

``work`` and ``work2`` (topology ``CUTAPP_TOPOLOGY``), a ``slow`` job on each that records
"start <id> <redelivered 0|1> <pid>", sleeps ``payload["seconds"]``, then records "done <id> <pid>"
(``CUTAPP_RECORD``). The first start of the process, before it starts its first consumer, waits until the
management API lists its connections; before its second consumer, until a handler started, then
``CUTAPP_AFTER`` seconds (default 0.1), then closes them (``DELETE /api/connections/<name>``: 320
CONNECTION_FORCED), as a broker may at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial, wraps
from typing import Any
from urllib.parse import quote

from amqpjobs import App, JobContext
from amqpjobs.runtime.worker import Worker
from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import broker_settings

app = App("cutapp", topology=os.environ.get("CUTAPP_TOPOLOGY", "topology"))
_NAMES = {f"{app.name}-worker", f"{app.name}-worker-publisher"}
_listed: list[str] = []  # the management API's names of those connections (first start only)
_cut = [True]


def _record(line: str) -> None:
    with open(os.environ["CUTAPP_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@app.job("slow", queue="work", timeout="60s")
async def slow(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record its start, sleep ``payload["seconds"]``, record its end."""
    _record(f"start {ctx.job_id} {int(ctx.redelivered)} {os.getpid()}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    _record(f"done {ctx.job_id} {os.getpid()}")


@app.job("slow2", queue="work2", timeout="60s")
async def slow2(payload: dict[str, Any], ctx: JobContext) -> None:
    """As ``slow``, on ``work2``."""
    await slow(payload, ctx)


def _list() -> None:
    settings = broker_settings()
    deadline = time.monotonic() + 20
    with ManagementClient(settings) as mgmt:
        while time.monotonic() < deadline:
            found = mgmt.request("GET", f"/vhosts/{quote(settings.vhost, safe='')}/connections") or []
            mine = [c for c in found if (c.get("client_properties") or {}).get("connection_name") in _NAMES]
            if len(mine) == len(_NAMES):
                _listed[:] = [c["name"] for c in mine]
                return
            time.sleep(0.1)


def _close() -> None:
    with ManagementClient(broker_settings()) as mgmt:
        for name in _listed:
            mgmt.request("DELETE", f"/connections/{quote(name, safe='')}", allow_404=True)
    print("cutapp: closed the worker's connections", flush=True)


_start_consumer = Worker._start_consumer


@wraps(_start_consumer)
async def _cutting(self: Worker, layout: Any, work_queue: str) -> None:
    if _cut[0] and work_queue == "work":
        await asyncio.to_thread(_list)
    if _cut[0] and work_queue == "work2":
        _cut[0] = False
        deadline = time.monotonic() + 10
        while not self.took_deliveries and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(float(os.environ.get("CUTAPP_AFTER", "0.1")))
        await _cut_under(self, partial(_start_consumer, self, layout, work_queue))
        return
    await _start_consumer(self, layout, work_queue)


async def _cut_under(worker: Worker, start: Callable[[], Awaitable[None]]) -> None:
    """Close the worker's connections, then ``start()`` once the loss is seen, before the reconnect.

    The reconnect waits for ``start()`` to end (the connection's ``turn``): under load on 4.3.6 it came
    back while the management API's close call returned, and the start then went through on it, not
    cut (CI: no "lost while starting" line).
    """
    connection = worker._connection
    assert isinstance(connection, ClusterConnection)
    before, ended = connection.turn, asyncio.Event()

    async def after_the_start() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), 10)
        if before is not None:
            await before()

    connection.turn = after_the_start
    try:
        await asyncio.to_thread(_close)
        deadline = time.monotonic() + 10
        while connection.connected.is_set() and time.monotonic() < deadline:  # the close is read by the client
            await asyncio.sleep(0.02)
        await start()
    finally:
        connection.turn = before
        ended.set()


Worker._start_consumer = _cutting  # type: ignore[method-assign]
