"""The ``worker consuming`` line comes before the first job's line, also over a pre-filled queue (README "Workers").

Before, a worker started over a queue holding jobs logged 3 job lines (``--concurrency 1``; 8 at 4,
measured on 3.10) before its ``worker consuming work with N slot(s)`` line: its first consumer took
deliveries, and ran them, while the start still opened the suspects queue's channel and checked its
connections. A user reads the line as "now taking jobs"; tests wait for it as "consumers ready".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import consume_subprocess, write_file
from tests.integration.test_worker_process import publisher, read_record
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

JOBS = 40


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_the_consuming_line_comes_before_the_first_jobs_line_over_a_prefilled_queue(
    broker: BrokerSettings, tmp_path: Path, concurrency: int
):
    app = await publisher(broker, tmp_path)
    for i in range(JOBS):
        await app.enqueue("sleep", {"seconds": 0}, job_id=f"j-{i}")
    await app.close()
    topo, record, log = tmp_path / "proc.toml", tmp_path / "record.txt", tmp_path / "worker.log"
    write_file(topo, APPLIED_TOPOLOGY)
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url, "PROCAPP_TOPOLOGY": str(topo),
           "PROCAPP_RECORD": str(record)}  # fmt: skip
    args = ("--concurrency", str(concurrency))
    with consume_subprocess("tests.integration.procapp:app", env, args, log, terminate=True) as proc:
        deadline = time.monotonic() + 40
        while sum(1 for r in read_record(record) if r[0] == "done") < JOBS:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.2)
        proc.terminate()
        code = await asyncio.to_thread(proc.wait, 30)
    lines = log.read_text().splitlines()
    consuming = [i for i, line in enumerate(lines) if "amqpjobs.worker: worker consuming work with" in line]
    jobs = [i for i, line in enumerate(lines) if " outcome=succeeded" in line]
    assert code == 0, lines[-20:]
    assert len(consuming) == 1, lines
    assert len(jobs) == JOBS, lines
    # before: 3 job lines before it at concurrency 1, 8 at 4
    assert consuming[0] < jobs[0], [line for line in lines if "outcome=" in line][: consuming[0]]
