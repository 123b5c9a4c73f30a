"""Policies that override what the topology declared: plan, apply, status and a worker say which can lose jobs.

A policy (or an operator policy) matching our queues changes them at run time (RabbitMQ
"Policies"): a ``message-ttl`` or ``max-length`` on a quarantine queue, which has no
dead-letter exchange, drops the evidence the broker expires or pushes out; an ``expires``
deletes a queue nobody consumes (a retry tier, the quarantine) with every message in it.
Seen on 3.10 before the check: three jobs quarantined ``exhausted`` under a
``message-ttl: 3000`` policy were gone 3 s later, while ``status`` said nothing of it and
``topology plan`` printed every queue ``unchanged``, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs import JobContext, Scheduler, Worker, WorkerOptions
from amqpjobs.runtime.scheduler import TICK_QUEUE_ARGUMENTS
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import applied_app, cli, depth, raw_channel

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
type = "classic"
retry_tiers = ["1s", "5s"]

[[job_queue]]
name = "pay"
exchange = "jobs"
type = "quorum"
delivery_limit = 5
retry_tiers = ["1s"]
"""


def set_policy(
    broker: BrokerSettings, name: str, pattern: str, definition: dict[str, Any], operator: bool = False
) -> None:
    """A user policy (or an operator policy) of the test's vhost on queues matching ``pattern``."""
    kind = "operator-policies" if operator else "policies"
    body = {"pattern": pattern, "definition": definition, "apply-to": "queues", "priority": 0}
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/{kind}/{quote(broker.vhost, safe='')}/{quote(name, safe='')}", json=body)


async def policy_shown(broker: BrokerSettings, queue: str, key: str, *more_queues: str) -> None:
    """Wait until the management API lists ``key`` in each queue's effective policy.

    It lags a little, and queue by queue: on 4.3.6 one queue showed a new policy while
    another it matches did not yet, so a test that reads several waits for each.
    """
    deadline = time.monotonic() + 15
    with ManagementClient(broker) as mgmt:
        for name in (queue, *more_queues):
            while key not in ((mgmt.queue(broker.vhost, name) or {}).get("effective_policy_definition") or {}):
                assert time.monotonic() < deadline, f"{name} never showed policy key {key}"
                await asyncio.sleep(0.2)


async def status(broker: BrokerSettings, topology: Path) -> tuple[int, dict[str, Any]]:
    result = await asyncio.to_thread(cli, broker, "status", str(topology), "--json")
    by_name = {jq["name"]: jq for jq in json.loads(result.stdout)["job_queues"]}
    return result.exit_code, by_name


@pytest.mark.timeout(60)
async def test_a_ttl_policy_on_the_quarantine_drops_evidence_and_every_command_says_so(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    await applied_app(broker, tmp_path, TOPOLOGY, "app")
    topology = tmp_path / "app.toml"
    set_policy(broker, "short-lived", r"^work\.quarantine$", {"message-ttl": 1000})
    await policy_shown(broker, "work.quarantine", "message-ttl")

    # the broker's side, as the rule says: a quarantined job is gone a second later
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("work.quarantine", ensure=False)
        await exchange.publish(aio_pika.Message(b"{}", delivery_mode=2), routing_key="")
    assert await depth(broker, "work.quarantine") == 1
    await asyncio.sleep(1.5)
    assert await depth(broker, "work.quarantine") == 0

    code, by_name = await status(broker, topology)
    assert code == 1
    (problem,) = [p for p in by_name["work"]["problems"] if "policy" in p]
    assert problem.startswith("policy 'short-lived' on work.quarantine: message-ttl 1s: "), problem
    assert "dropped" in problem, problem
    assert not [p for p in by_name["pay"]["problems"] if "policy" in p]

    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(topology))
    assert plan.exit_code == 1, plan.output
    lines = [line for line in plan.output.splitlines() if line.startswith("POLICY")]
    assert len(lines) == 1, plan.output
    assert "policy 'short-lived' on work.quarantine" in lines[0], plan.output

    apply = await asyncio.to_thread(cli, broker, "topology", "apply", str(topology))
    assert apply.exit_code == 0
    assert "policy 'short-lived' on work.quarantine" in apply.stderr, apply.stderr


@pytest.mark.timeout(60)
async def test_an_operator_policy_that_bounds_or_expires_our_queues_is_a_problem(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    await applied_app(broker, tmp_path, TOPOLOGY, "app")
    set_policy(broker, "caps", ".*", {"max-length": 1000, "expires": 3600000}, operator=True)
    checked = {"work": ("work.quarantine", "work.retry.5s"), "pay": ("pay.quarantine", "pay")}
    await policy_shown(broker, "pay.retry.1s", "expires", *(q for queues in checked.values() for q in queues))

    code, by_name = await status(broker, tmp_path / "app.toml")
    assert code == 1
    for job_queue, queues in checked.items():
        problems = [p for p in by_name[job_queue]["problems"] if "policy" in p]
        for queue in queues:
            found_all = [p for p in problems if p.startswith(f"operator policy 'caps' on {queue}:")]
            assert len(found_all) == 1, (queue, problems)
            (found,) = found_all
            assert "expires 1h: the broker deletes the queue" in found, found
        quarantine = next(p for p in problems if p.startswith(f"operator policy 'caps' on {job_queue}.quarantine:"))
        assert "max-length" in quarantine, quarantine


@pytest.mark.timeout(60)
async def test_policies_that_lose_nothing_are_notes_or_nothing(broker: BrokerSettings, tmp_path: Path) -> None:
    await applied_app(broker, tmp_path, TOPOLOGY, "app")
    # a lazy queue and a higher delivery limit change nothing we rely on; a shorter tier or a
    # lower delivery limit changes when a job comes back or is quarantined, and loses none
    set_policy(broker, "lazy", r"^work$", {"queue-mode": "lazy"})
    set_policy(broker, "quick", r"^work\.retry\.5s$", {"message-ttl": 2000})
    set_policy(broker, "limit", r"^pay$", {"delivery-limit": 2})
    await policy_shown(broker, "pay", "delivery-limit")
    await policy_shown(broker, "work.retry.5s", "message-ttl")

    _, by_name = await status(broker, tmp_path / "app.toml")
    assert not [p for jq in by_name.values() for p in jq["problems"] if "policy" in p], by_name
    notes = [n for jq in by_name.values() for n in jq["notes"] if "policy" in n]
    assert len(notes) == 2, notes
    assert any("work.retry.5s" in n and "2s" in n for n in notes), notes
    assert any("pay" in n and "delivery-limit" in n and "2" in n for n in notes), notes

    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(tmp_path / "app.toml"))
    assert plan.exit_code == 0, plan.output
    assert sum(line.startswith("POLICY") for line in plan.output.splitlines()) == 2, plan.output


@pytest.mark.timeout(60)
async def test_plan_names_a_policy_that_would_match_queues_not_created_yet(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    set_policy(broker, "cleanup", r"\.retry\.", {"expires": 60000})
    path = tmp_path / "new.toml"
    path.write_text(TOPOLOGY)
    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(path))
    assert plan.exit_code == 1, plan.output
    lines = [line for line in plan.output.splitlines() if line.startswith("POLICY")]
    assert {line.split()[5].rstrip(":") for line in lines} == {"work.retry.1s", "work.retry.5s", "pay.retry.1s"}, lines


@pytest.mark.timeout(60)
async def test_a_worker_starting_warns_of_a_policy_that_can_lose_jobs(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")

    @app.job("noop", queue="work")
    async def noop(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    set_policy(broker, "short-lived", r"^work\.quarantine$", {"message-ttl": 1000})
    await policy_shown(broker, "work.quarantine", "message-ttl")
    caplog.set_level(logging.WARNING)
    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=1, grace=2))
    await worker.start()
    try:
        deadline = time.monotonic() + 10  # a best-effort check beside the start: it does not hold ready back
        while not (warned := [r.getMessage() for r in caplog.records if "short-lived" in r.getMessage()]):
            assert time.monotonic() < deadline, "the worker never warned of the policy"
            await asyncio.sleep(0.1)
        assert len(warned) == 1, warned
        assert warned[0].startswith("policy 'short-lived' on work.quarantine: "), warned
        assert "dropped" in warned[0], warned
    finally:
        await worker.shutdown()
        await app.close()


@pytest.mark.timeout(60)
async def test_the_overflow_a_policy_sets_wins_on_a_quorum_queue_only(broker: BrokerSettings, tmp_path: Path) -> None:
    """The broker's rule the check follows (3.10.8 and 4.3.6 alike): a quorum queue takes the policy's overflow."""
    await applied_app(broker, tmp_path, TOPOLOGY, "app")
    async with raw_channel(broker) as ch:
        await ch.declare_queue("classic-capped", durable=True, arguments={
            "x-queue-type": "classic", "x-max-length": 1, "x-overflow": "reject-publish",
            "x-dead-letter-exchange": "work.quarantine",
        })  # fmt: skip
    set_policy(broker, "drop", r"^(pay|classic-capped)$", {"overflow": "drop-head", "max-length": 1})
    await policy_shown(broker, "pay", "overflow")
    await policy_shown(broker, "classic-capped", "overflow")
    refused = {}
    async with raw_channel(broker) as ch:
        for queue in ("pay", "classic-capped"):
            for body in (b"1", b"2"):
                try:
                    await ch.default_exchange.publish(aio_pika.Message(body, delivery_mode=2), routing_key=queue)
                except aio_pika.exceptions.DeliveryError:
                    refused[queue] = body
    assert refused == {"classic-capped": b"2"}  # the classic queue's own reject-publish held
    assert await depth(broker, "pay") == 1  # drop-head: the first went to its quarantine
    await asyncio.sleep(0.5)
    assert await depth(broker, "pay.quarantine") == 1

    _, by_name = await status(broker, tmp_path / "app.toml")
    (problem,) = [p for p in by_name["pay"]["problems"] if p.startswith("policy 'drop' on pay:")]
    assert "falls back to at-most-once" in problem, problem


@pytest.mark.timeout(60)
async def test_a_missing_job_binding_is_a_problem_and_an_alternate_exchange_policy_is_named(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Without its binding a job queue gets nothing; with an alternate exchange the enqueue does not even fail.

    Seen on 3.10 before: binding jobs -> work removed, a policy {"alternate-exchange": "ae"} on
    ``jobs``: two enqueues were confirmed and landed in ``ae-q``, while ``status`` reported only
    "no consumer", and ``topology plan`` a binding to create, exit 0.
    """
    app = await applied_app(broker, tmp_path, TOPOLOGY, "app")
    app.job("noop", queue="work")(lambda p, c: None)
    async with raw_channel(broker) as ch:
        ae = await ch.declare_exchange("ae", aio_pika.ExchangeType.FANOUT, durable=True)
        caught = await ch.declare_queue("ae-q", durable=True)
        await caught.bind(ae)
        jobs = await ch.get_exchange("jobs", ensure=False)
        await (await ch.get_queue("work", ensure=False)).unbind(jobs, routing_key="work")
    # on the quarantine exchange too: a worker's quarantine copy would be confirmed into ae-q
    body = {
        "pattern": r"^(jobs|work\.quarantine)$",
        "definition": {"alternate-exchange": "ae"},
        "apply-to": "exchanges",
    }
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", f"/policies/{quote(broker.vhost, safe='')}/ae", json=body)
    await asyncio.sleep(0.5)
    await app.enqueue("noop", {}, job_id="diverted")  # confirmed: the alternate exchange took it
    await app.close()
    assert await depth(broker, "ae-q") == 1

    code, by_name = await status(broker, tmp_path / "app.toml")
    assert code == 1
    (problem,) = [p for p in by_name["work"]["problems"] if "not bound" in p]
    assert problem.startswith("exchange jobs is not bound to work with routing key 'work' (apply the topology)")
    notes = [n for n in by_name["work"]["notes"] if "alternate-exchange" in n]
    assert [n.split(":")[0] for n in notes] == [
        "policy 'ae' on exchange jobs",
        "policy 'ae' on exchange work.quarantine",
    ]
    assert notes[0].startswith("policy 'ae' on exchange jobs: alternate-exchange 'ae': a job no binding"), notes

    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(tmp_path / "app.toml"))
    lines = [line for line in plan.output.splitlines() if line.startswith("POLICY")]
    assert lines == [f"POLICY    exchange {n}" for n in notes], plan.output


@pytest.mark.timeout(60)
async def test_a_policy_that_expires_our_state_queues_is_a_problem(broker: BrokerSettings, tmp_path: Path) -> None:
    """A pause flag or a schedule's tick record lives in a queue nobody consumes: ``expires`` deletes it.

    Seen on 3.10 before: `amqpjobs pause mail`, then a policy {"expires": 3000} on ``\\.paused$``:
    3 s later the flag was gone (workers would start the paused jobs) and ``status`` showed
    neither the pause nor the policy.
    """
    await applied_app(broker, tmp_path, TOPOLOGY, "app")
    assert (await asyncio.to_thread(cli, broker, "pause", "work", "--reason", "deploy")).exit_code == 0
    ticks = "amqpjobs.scheduler.shop.ticks.daily"
    async with raw_channel(broker) as ch:  # as a scheduler replica declares it
        await ch.declare_queue(ticks, durable=True, arguments={"x-max-length": 1, "x-overflow": "drop-head"})
    set_policy(broker, "sweep", r"\.paused$|\.ticks\.", {"expires": 600000, "message-ttl": 60000})
    await policy_shown(broker, "work.paused", "expires")
    await policy_shown(broker, ticks, "expires")

    code, by_name = await status(broker, tmp_path / "app.toml")
    assert code == 1
    problems = [p for jq in by_name.values() for p in jq["problems"] if "policy" in p]
    (flag,) = [p for p in problems if p.startswith("policy 'sweep' on work.paused:")]
    assert "expires 10m: the broker deletes the queue" in flag, flag
    assert "the pause ends with it" in flag, flag
    (record,) = [p for p in problems if p.startswith(f"policy 'sweep' on {ticks}:")]
    assert "message-ttl 1m: a message older is dropped" in record, record
    assert "the schedule's tick record" in record, record


@pytest.mark.timeout(60)
async def test_a_scheduler_starting_warns_of_a_policy_that_can_lose_its_tick_records(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await applied_app(broker, tmp_path, TOPOLOGY, "shop")

    @app.cron("@hourly")
    @app.job("report", queue="work")
    async def report(payload: dict[str, Any], ctx: JobContext) -> None: ...

    ticks = "amqpjobs.scheduler.shop.ticks.report"
    async with raw_channel(broker) as ch:  # declared by an earlier replica (the API shows a policy seconds late)
        await ch.declare_queue(ticks, durable=True, arguments=dict(TICK_QUEUE_ARGUMENTS))
    set_policy(broker, "sweep", r"\.ticks\.", {"message-ttl": 60000})
    await policy_shown(broker, ticks, "message-ttl")
    caplog.set_level(logging.WARNING)
    scheduler = Scheduler(app, broker)
    await scheduler.start()
    try:
        deadline = time.monotonic() + 10  # a best-effort check beside the start
        while not (warned := [r.getMessage() for r in caplog.records if "'sweep'" in r.getMessage()]):
            assert time.monotonic() < deadline, "the scheduler never warned of the policy"
            await asyncio.sleep(0.1)
        assert warned[0].startswith(f"policy 'sweep' on {ticks}: message-ttl 1m"), warned
        assert "the schedule's tick record goes with it" in warned[0], warned
    finally:
        await scheduler.shutdown()
        await app.close()
