"""Every CLI command, run as a user would, against the suite's broker.

On RabbitMQ 4.3 deprecated features are denied (global QoS, transient non-exclusive queues,
CQv1; release notes 4.3.0; the project's 4.3 node denies transient non-exclusive queues too,
which 4.3.6 still permits by default): a command that used one would fail here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import aiormq
import pytest

from amqpjobs import App
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import depth, raw_channel
from tests.integration.worker_env import APPLIED_TOPOLOGY

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).with_name("amqpjobs"))

pytestmark = pytest.mark.broker


def env_for(broker: BrokerSettings, topology: Path, record: Path) -> dict[str, str]:
    # a one-shot command's 5 s connect: twice (local CI 65 on 4.3.6, 66 on 4.0.5) `replay` got "unreachable after
    # 5s: no answer within 5s" from a node busy with the tier's other tests (vhosts made and deleted by 4 workers);
    # this test checks that every command runs, not the handshake's time under that load
    return dict(
        os.environ, AMQPJOBS_URL=broker.url, AMQPJOBS_MANAGEMENT_URL=broker.management_url,
        PROCAPP_TOPOLOGY=str(topology), PROCAPP_RECORD=str(record), SCHEDAPP_TOPOLOGY=str(topology),
        AMQPJOBS_CONNECT_TIMEOUT="30s",
    )  # fmt: skip


def run(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = subprocess.run([EXE, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=90)
    return proc.returncode, proc.stdout + proc.stderr


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


async def refuses_transient_queues(broker: BrokerSettings) -> bool:
    async with raw_channel(broker) as ch:
        try:
            await ch.declare_queue("amqpjobs-probe-transient", durable=False, exclusive=False)
        except aiormq.exceptions.AMQPError:
            return True
        await ch.queue_delete("amqpjobs-probe-transient")
        return False


async def enqueue(broker: BrokerSettings, topology: Path) -> None:
    app = App("t", topology=load_topology(topology).topology, url=broker.url)
    app.job("sleep", queue="work")(lambda p, c: None)
    for i in range(3):
        await app.enqueue("sleep", {"seconds": 0}, job_id=f"ok-{i}")
    await app.close()
    async with raw_channel(broker) as ch:  # a job no app serves: quarantined as unknown-job
        exchange = await ch.get_exchange("jobs")
        await exchange.publish(aio_pika.Message(b"{}", type="nobody", message_id="stray-1"), routing_key="work")


def wait_until(condition: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_every_command_runs_on_the_suites_broker(broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path):
    if broker_root.version >= (4, 3) and broker_root.source == "local":
        assert asyncio.run(refuses_transient_queues(broker)), "the 4.3 node must deny transient non-exclusive queues"
    topology = tmp_path / "t.toml"
    topology.write_text(APPLIED_TOPOLOGY)
    record = tmp_path / "record.txt"
    env = env_for(broker, topology, record)

    code, out = run(env, "topology", "plan", str(topology))
    assert code == 0, out
    assert "12 to create, 0 unchanged, 0 conflict(s)" in out
    assert run(env, "topology", "apply", str(topology))[0] == 0
    code, out = run(env, "topology", "plan", str(topology))
    assert code == 0, out
    assert "0 to create, 12 unchanged" in out
    code, out = run(env, "topology", "export", str(topology))
    assert code == 0, out
    assert '"queues"' in out
    code, out = run(env, "asyncapi", "examples.shop:app")  # needs no broker; here so no command is missed
    assert code == 0, out
    assert '"asyncapi": "3.0.0"' in out

    asyncio.run(enqueue(broker, topology))
    worker = subprocess.Popen(
        [EXE, "consume", "tests.integration.procapp:app", "--concurrency", "2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: record.exists() and record.read_text().count("done ") == 3, "3 jobs done")
        wait_until(lambda: asyncio.run(depth(broker, "work.quarantine")) == 1, "the stray job quarantined")
    finally:
        code, out = stop(worker)
    assert code == 0, out

    code, out = run(env, "status", str(topology))
    assert code in (0, 1), out  # a quarantined job may count as unhealthy; the command itself works
    assert "work" in out
    for args in (
        ("quarantine", "list", "--all"),
        ("quarantine", "show", "work.quarantine"),
        ("quarantine", "export", "work.quarantine", str(tmp_path / "q.jsonl")),
        ("replay", "work.quarantine", "--dry-run"),
        ("replay", "work.quarantine"),
        ("quarantine", "park", "work.quarantine", "--yes"),
        ("quarantine", "purge", "work.quarantine", "--yes"),
        ("schedule", "list", "tests.integration.schedapp:app"),
    ):
        code, out = run(env, *args)
        assert code == 0, (args, out)
    assert "stray-1" in (tmp_path / "q.jsonl").read_text()

    before = asyncio.run(depth(broker, "work"))
    scheduler = subprocess.Popen(
        [EXE, "schedule", "run", "tests.integration.schedapp:app"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: asyncio.run(depth(broker, "work")) > before, "a tick enqueued", timeout=40)
    finally:
        code, out = stop(scheduler)
    assert code == 0, out
