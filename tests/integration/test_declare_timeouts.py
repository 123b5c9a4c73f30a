"""Declarations that never get an answer end in a clear error (exit 3), never a hang.

On RabbitMQ 4.3 (Khepri only) a declaration needs a Raft majority; a node in a minority
blocks it (release notes 4.2.0, 4.3.0). The relay below plays that node: it passes every
AMQP frame between client and broker except declarations and bindings, which it drops, so
the broker never answers them. What is tested is ours (the bound and its message), so it
runs on one broker version only.

Checked by hand on a real minority (4.3.6, a 2-node cluster with one node stopped): `topology
apply` exited 3 with this message after its --declare-timeout; `schedule run` exited 3 after
30 s (the node itself gave up at about the same time: "INTERNAL_ERROR - Could not declare
queue ... because the metadata store operation timed out", mapped to the same message). On a
3-node 4.3 cluster with two nodes stopped, `topology apply` and a worker's start-up now refuse
at once (they ask the management API which nodes run): tests/integration/test_khepri_cluster.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs import App, BrokerError, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire import declare as wire_declare
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.worker_env import APPLIED_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: (class id, method id) of exchange.declare, exchange.bind, queue.declare, queue.bind.
SWALLOWED = {(40, 10), (40, 30), (50, 10), (50, 20)}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, swallow: bool) -> None:
    try:
        if swallow:
            writer.write(await reader.readexactly(8))  # protocol header
        while True:
            if not swallow:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                continue
            head = await reader.readexactly(7)
            kind, _channel, size = struct.unpack(">BHI", head)
            rest = await reader.readexactly(size + 1)
            if kind == 1 and struct.unpack(">HH", rest[:4]) in SWALLOWED:
                continue  # the broker never sees it, so it never answers
            writer.write(head + rest)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def minority_node(settings: BrokerSettings) -> AsyncIterator[BrokerSettings]:
    """Settings whose AMQP URL goes through a relay that drops every declaration."""
    target = urlsplit(settings.url)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        broker_r, broker_w = await asyncio.open_connection(target.hostname, target.port)
        await asyncio.gather(_pipe(client_r, broker_w, True), _pipe(broker_r, client_w, False))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    netloc = f"{target.username}:{target.password}@127.0.0.1:{port}"
    url = urlunsplit((target.scheme, netloc, target.path, target.query, target.fragment))
    try:
        yield broker_settings(url, settings.management_url)
    finally:
        server.close()


def write(tmp_path: Path) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(APPLIED_TOPOLOGY)
    return path


async def test_topology_apply_exits_3_naming_the_cause(broker: BrokerSettings, tmp_path: Path):
    path = write(tmp_path)
    async with minority_node(broker) as stuck:
        exe = Path(sys.executable).with_name("amqpjobs")
        env = {"AMQPJOBS_URL": stuck.url, "AMQPJOBS_MANAGEMENT_URL": stuck.management_url, "PATH": "/usr/bin:/bin"}
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            str(exe), "topology", "apply", "--declare-timeout", "2s", str(path),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        took = time.monotonic() - started
    assert proc.returncode == 3, err.decode()
    text = err.decode()
    assert "declaring the topology on" in text
    assert "got no answer within 2s" in text
    assert "Khepri metadata store" in text
    assert "majority" in text
    assert took < 15


async def test_apply_scheduler_and_worker_start_give_up_with_the_cause(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(wire_declare, "DECLARE_TIMEOUT", 1.5)
    path = write(tmp_path)
    await apply_topology(path, broker)  # the queues exist: only the blocked declarations stop them
    app = App("t", topology=load_topology(path).topology, url=broker.url)

    @app.cron("* * * * *")
    @app.job("tick", queue="work")
    def tick(payload: object, ctx: object) -> None:
        pass

    more = tmp_path / "more.toml"
    more.write_text(APPLIED_TOPOLOGY + '\n[[job_queue]]\nname = "other"\nexchange = "jobs"\n')
    async with minority_node(broker) as stuck:
        with pytest.raises(BrokerError, match=r"declaring the topology .* no answer within 1.5s"):
            await apply_topology(more, stuck, declare_timeout=1.5)
        scheduler = Scheduler(app, stuck, SchedulerOptions())
        with pytest.raises(BrokerError, match=r"the scheduler's start-up declarations .* no answer within 1.5s"):
            await asyncio.wait_for(scheduler.start(), 20)
        worker = Worker(app, stuck, WorkerOptions(queues=("work",)))
        with pytest.raises(BrokerError, match=r"looking for queues and exchanges .* no answer within 1.5s"):
            await asyncio.wait_for(worker.start(), 20)
        await worker.shutdown()
