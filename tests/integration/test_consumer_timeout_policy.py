"""A ``consumer-timeout`` policy shorter than a job's run: the broker redelivers the running job, so it runs twice.

RabbitMQ before 4.3 evaluates a policy's ``consumer-timeout`` on every queue type, over the node's
``consumer_timeout``; 4.3 evaluates none on classic queues and lets our per-consumer
``x-consumer-timeout`` win on quorum ones (:mod:`amqpjobs.topology.versions`). 3.10 has no such
policy key. Seen on 4.0.5 before the check: a policy of 3 s on a classic work queue, a job of 75 s: it
ran twice (the channel closed on the 60 s channel tick and the job was delivered again while
its first run went on; the worker ran it again as that run ended, its ack lost), and
``status``, ``topology plan`` and the worker's start said nothing of the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from tests.conftest import BrokerRoot
from tests.integration.helpers import applied_app, cli, wait_until
from tests.integration.test_policy_effects import policy_shown, set_policy

pytestmark = pytest.mark.broker  # version-dependent: 4.0-4.2 apply the policy, 4.3 does not, 3.10 can't set it

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "classic"

[[job_queue]]
name = "pay"
exchange = "jobs"
type = "quorum"
"""


def applies(root: BrokerRoot) -> bool:
    """Whether the broker evaluates a consumer-timeout policy on our queues (skips where it has no such key)."""
    if root.version < (3, 12):
        pytest.skip(f"RabbitMQ {root.version}: no consumer-timeout policy key")
    return root.version < (4, 3)


@pytest.mark.timeout(90)
async def test_status_plan_and_a_starting_worker_name_a_short_consumer_timeout_policy(
    broker_root: BrokerRoot, broker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before_43 = applies(broker_root)
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")

    @app.job("noop", queue="work")
    async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    set_policy(broker, "short-ack", r"^(work|pay)$", {"consumer-timeout": 3000})
    await policy_shown(broker, "work", "consumer-timeout")
    await policy_shown(broker, "pay", "consumer-timeout")

    result = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "app.toml"), "--json")
    by_name = {jq["name"]: jq for jq in json.loads(result.stdout)["job_queues"]}
    found = {name: [p for p in jq["problems"] if "short-ack" in p] for name, jq in by_name.items()}
    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(tmp_path / "app.toml"))
    lines = [line for line in plan.output.splitlines() if line.startswith("POLICY") and "short-ack" in line]
    caplog.set_level(logging.WARNING)
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    await worker.start()
    try:
        await asyncio.sleep(3)  # the check runs beside the start
        warned = [r.getMessage() for r in caplog.records if "short-ack" in r.getMessage()]
    finally:
        await worker.shutdown()
        await app.close()
    if not before_43:  # 4.3: classic queues have no timeout, our x-consumer-timeout wins on quorum ones
        assert (found, lines, warned) == ({"work": [], "pay": []}, [], []), (found, plan.output, warned)
        return
    shown = ".".join(map(str, broker_root.version))
    for name in ("work", "pay"):
        (problem,) = found[name]
        assert problem.startswith(f"policy 'short-ack' on {name}: consumer-timeout 3s (RabbitMQ {shown}: "), problem
        assert "runs twice" in problem, problem
        assert "raise the policy's consumer-timeout above" in problem, problem
    assert result.exit_code == 1
    assert (plan.exit_code, len(lines)) == (1, 2), plan.output
    assert len(warned) == 1, warned
    assert warned[0].startswith("policy 'short-ack' on work: consumer-timeout 3s"), warned


@pytest.mark.timeout(200)
async def test_a_job_longer_than_a_consumer_timeout_policy_runs_twice_before_4_3(
    broker_root: BrokerRoot, broker: Any, tmp_path: Path
) -> None:
    """The measurement behind the words: the broker's side, not ours (the channel tick checks every 60 s)."""
    before_43 = applies(broker_root)
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")
    starts: list[float] = []

    @app.job("long", queue="work", timeout=120)
    async def long(payload: dict[str, Any], ctx: JobContext) -> None:
        starts.append(time.monotonic())
        await asyncio.sleep(75)

    set_policy(broker, "short-ack", r"^work$", {"consumer-timeout": 3000})
    await policy_shown(broker, "work", "consumer-timeout")
    await app.enqueue("long", {}, job_id="once")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=1))
    await worker.start()
    try:
        await wait_until(lambda: len(starts) >= 1, 20, "the first run")
        with contextlib.nullcontext() if before_43 else pytest.raises(TimeoutError):
            await wait_until(lambda: len(starts) >= 2, 85, "a second run of the same job")
    finally:
        await worker.shutdown()
        await app.close()
    assert len(starts) == (2 if before_43 else 1), starts
    # measured on 4.0.5: the broker delivered the job again on its 60 s channel tick, and this worker started
    # the second run as the first ended (75 s), its ack lost with the closed channel
