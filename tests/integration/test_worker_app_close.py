"""A worker process closes the app it enqueued through (F4, review 13): no lost connection after its stop.

Handlers that ``await app.enqueue(...)`` open the app's publishing connection (and its
enqueue gate's management API client). ``amqpjobs consume`` (and each ``--processes``
child) must close them once the last handler has ended, before the process exits: before
the fix the log ended with ``connection fanoutapp-publisher lost ...`` after ``worker
stopped: ...; exit 0``, and ``ResourceWarning: unclosed <socket ... 15682>`` under ``-X dev``.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from amqpjobs import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, depth, drain, write_file

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the app's close is ours, not the broker's

#: asyncio's debug-mode line for a slow callback (``loop.slow_callback_duration``, 0.1 s).
SLOW_CALLBACK = re.compile(r"WARNING .*asyncio: Executing <.*> took \d+\.\d+ seconds$")
TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"

[[job_queue]]
name = "side"
exchange = "jobs"
"""
PARENTS, CHILDREN = 10, 50


async def wait_for_depths(broker: BrokerSettings, side: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await depth(broker, "side"), await depth(broker, "work")) != (side, 0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"side {await depth(broker, 'side')} of {side}, work {await depth(broker, 'work')}")
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_a_worker_process_closes_the_app_its_handlers_enqueued_through(
    broker: BrokerSettings, tmp_path: Path, processes: str
) -> None:
    topology = tmp_path / "fanout.toml"
    write_file(topology, TOPOLOGY)
    await apply_topology(topology, broker)
    producer = App("producer", topology=topology, url=broker.url)
    producer.job("parent", queue="work")(lambda p, c: None)  # the name only: to publish
    for i in range(PARENTS):
        await producer.enqueue("parent", {"n": CHILDREN}, job_id=f"P{i}")
    await producer.close()
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url,
           "FANOUTAPP_TOPOLOGY": str(topology),
           "PYTHONDEVMODE": "1", "PYTHONWARNINGS": "error::ResourceWarning"}  # fmt: skip
    log = tmp_path / "worker.log"
    args = ("--queues", "work", "--concurrency", "4", "--processes", processes)
    with consume_subprocess("tests.integration.fanoutapp:app", env, args, log) as proc:
        await wait_for_depths(broker, PARENTS * CHILDREN)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    out = log.read_text()
    assert code == 0, out
    assert "connection fanoutapp-publisher connected" in out, out  # the handlers' enqueues opened it
    stops = [n for n, line in enumerate(out.splitlines()) if "worker stopped: " in line]
    assert len(stops) == int(processes), out
    assert all(line.endswith("exit 0") for line in out.splitlines() if "worker stopped: " in line), out
    # -X dev turns asyncio's debug mode on, whose "Executing <Task ...> took 0.103 seconds" (a callback over
    # 100 ms: CPU load, CI on 2 cores) says nothing of the close
    after = [line for line in out.splitlines()[stops[0] :] if not SLOW_CALLBACK.search(line)]
    assert [line for line in after if "lost" in line or "WARNING" in line or "ERROR" in line] == [], out
    assert "ResourceWarning" not in out, out
    assert "unclosed" not in out, out
    stored = Counter(m.message_id for m in await drain(broker, "side"))
    assert stored == Counter({f"P{i}-c{k}": 1 for i in range(PARENTS) for k in range(CHILDREN)})
