"""A quorum job queue's quarantine and parked queues are quorum too, on every version (3.10, 4.0, 4.3).

A classic queue lives on one node and, on RabbitMQ 4.x, confirms before it fsyncs (README "Durability:
what a confirmed job survives"); a job quarantined out of a quorum job queue must not lose that. Browsing
returns messages, which raises a quorum queue's ``x-delivery-count`` on 4.0-4.2, and 4.0 drops a message
past its default limit of 20: the holding queues carry a limit of 2**31 - 1, so 25 browses keep the job.
A classic quarantine an earlier amqpjobs declared stays usable: the plan notes it instead of refusing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs import App, JobContext, Reject
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.quarantine import browse
from amqpjobs.topology.holding_queues import HOLDING_DELIVERY_LIMIT
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth, raw_channel, wait_until_async
from tests.integration.worker_env import running_worker

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "money"
exchange = "jobs"
type = "quorum"
retry_tiers = []
"""

BROWSES = 25  # past RabbitMQ 4.0's default delivery limit of 20


@pytest.fixture
async def apps() -> AsyncIterator[list[App]]:
    """The apps a test made, closed after it (an app left open holds management API clients)."""
    made: list[App] = []
    yield made
    for app in made:
        await app.close()


def quorum_app(broker: BrokerSettings, path: Path, runs: list[int], apps: list[App]) -> App:
    app = App("t", topology=load_topology(path).topology, url=broker.url)
    apps.append(app)

    @app.job("pay", queue="money")
    async def pay(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(payload["n"])
        if payload.get("fail"):
            raise Reject("card declined")

    return app


async def browse_many(broker: BrokerSettings, queue: str) -> list[dict[str, Any]]:
    """Browse ``queue`` :data:`BROWSES` times; the payloads seen each time."""
    seen: list[dict[str, Any]] = []
    for _ in range(BROWSES):
        _, items = await browse(broker, queue)
        seen.extend(json.loads(m.delivery.body) for m in items)
    return seen


async def test_a_quorum_job_queues_holding_queues_are_quorum_and_keep_a_job_browsed_25_times(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient, apps: list[App]
) -> None:
    path = tmp_path / "q.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    for name in ("money.quarantine", "money.parked"):
        live = mgmt.queue(broker.vhost, name)
        assert live is not None
        assert (live["type"], live["durable"], live["arguments"]) == (
            "quorum",
            True,
            {"x-queue-type": "quorum", "x-delivery-limit": HOLDING_DELIVERY_LIMIT},
        )
    runs: list[int] = []
    app = quorum_app(broker, path, runs, apps)
    async with running_worker(app, broker, queues=("money",)):
        for n in (1, 2, 3):
            await app.enqueue("pay", {"n": n, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 3), 15, "the jobs in quarantine")
    assert runs == [1, 2, 3]
    jobs = [{"n": n, "fail": True} for n in (1, 2, 3)]
    assert await browse_many(broker, "money.quarantine") == jobs * BROWSES  # none lost, none out of order
    assert await depth(broker, "money.quarantine") == 3

    parked = await asyncio.to_thread(cli, broker, "quarantine", "park", "money", "--yes")
    assert parked.exit_code == 0, parked.output
    assert (await depth(broker, "money.quarantine"), await depth(broker, "money.parked")) == (0, 3)
    assert await browse_many(broker, "money.parked") == jobs * BROWSES
    assert await depth(broker, "money.parked") == 3

    replayed = await asyncio.to_thread(cli, broker, "replay", "money.parked", "--rate", "100")
    assert replayed.exit_code == 0, replayed.output
    assert (await depth(broker, "money.parked"), await depth(broker, "money")) == (0, 3)
    async with running_worker(app, broker, queues=("money",)):  # they fail again: back into quarantine
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 3), 15, "the replayed jobs back")
    assert runs == [1, 2, 3, 1, 2, 3]


async def test_a_classic_quarantine_an_earlier_version_declared_is_kept_with_a_note(
    broker: BrokerSettings, tmp_path: Path, apps: list[App]
) -> None:
    async with raw_channel(broker) as ch:  # as amqpjobs declared them before they followed the job queue's type
        for name in ("money.quarantine", "money.parked"):
            await ch.declare_queue(name, durable=True)
        await ch.declare_exchange("money.quarantine", aio_pika.ExchangeType.FANOUT, durable=True)
        await (await ch.get_queue("money.quarantine", ensure=False)).bind("money.quarantine")
        await (await ch.get_exchange("money.quarantine")).publish(
            aio_pika.Message(b'{"n": 0}', message_id="old-1", type="pay", delivery_mode=2), routing_key=""
        )
    path = tmp_path / "q.toml"
    path.write_text(TOPOLOGY)
    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(path))
    assert plan.exit_code == 0, plan.output
    for name in ("money.quarantine", "money.parked"):
        assert f"unchanged queue    {name}\n            note: {name} is classic, as amqpjobs declared it" in plan.stdout
    assert "0 conflict(s)" in plan.stdout
    applied = await asyncio.to_thread(cli, broker, "topology", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    assert "kept      queue    money.quarantine\n            note: money.quarantine is classic" in applied.stdout
    assert "To make it quorum without losing a job: move its jobs to money.parked" in applied.stdout

    runs: list[int] = []
    app = quorum_app(broker, path, runs, apps)
    async with running_worker(app, broker, queues=("money",)):
        await app.enqueue("pay", {"n": 2, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 2), 15, "the job in the old quarantine")
    _, items = await browse(broker, "money.quarantine")
    assert [json.loads(m.delivery.body) for m in items] == [{"n": 0}, {"n": 2, "fail": True}]


async def test_the_notes_steps_make_a_classic_quarantine_and_parked_queue_quorum_losing_no_job(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient, apps: list[App]
) -> None:
    """An upgrade from an amqpjobs that declared them classic, done as the plan's notes say, in their order: no job
    lost, none run (before, the parked queue's note said to replay it: each parked job ran once more)."""
    async with raw_channel(broker) as ch:  # as amqpjobs declared them before they followed the job queue's type
        for name in ("money.quarantine", "money.parked"):
            await ch.declare_queue(name, durable=True)
    path = tmp_path / "q.toml"
    path.write_text(TOPOLOGY)
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(path))).exit_code == 0
    runs: list[int] = []
    app = quorum_app(broker, path, runs, apps)
    async with running_worker(app, broker, queues=("money",)):  # one job parked, two quarantined
        await app.enqueue("pay", {"n": 1, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 1), 15, "the first job quarantined")
        assert (await asyncio.to_thread(cli, broker, "quarantine", "park", "money", "--yes")).exit_code == 0
        for n in (2, 3):
            await app.enqueue("pay", {"n": n, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 2), 15, "two more quarantined")
    plan = await asyncio.to_thread(cli, broker, "topology", "plan", str(path))
    notes = [line for line in plan.stdout.splitlines() if line.lstrip().startswith("note:")]
    assert len(notes) == 2, plan.stdout
    assert "`amqpjobs quarantine park money.quarantine --yes`" in notes[0]
    for note, queue in zip(notes, ("money.quarantine", "money.parked"), strict=True):  # the vhost named, not <vhost>
        assert f"(`rabbitmqctl -p {broker.vhost} delete_queue --if-empty {queue}`)" in note, note
    assert "once money.quarantine is quorum: `amqpjobs quarantine unpark money.parked --yes`" in notes[1]
    assert "replay" not in notes[1]  # a replay would run each parked job once more
    assert all("purge" not in note for note in notes)

    async def delete_if_empty(name: str) -> None:  # what `rabbitmqctl delete_queue --if-empty` does
        async with raw_channel(broker) as ch:
            await ch.queue_delete(name, if_empty=True)

    # the quarantine: park its jobs, delete it, apply
    assert (await asyncio.to_thread(cli, broker, "quarantine", "park", "money.quarantine", "--yes")).exit_code == 0
    await delete_if_empty("money.quarantine")
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(path))).exit_code == 0
    # the parked queue: unpark its jobs into the quorum quarantine (none runs), delete it, apply, park them again
    unparked = await asyncio.to_thread(cli, broker, "quarantine", "unpark", "money.parked", "--yes")
    assert unparked.exit_code == 0, unparked.output
    assert await depth(broker, "money.quarantine") == 3
    await delete_if_empty("money.parked")
    applied = await asyncio.to_thread(cli, broker, "topology", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    assert "note:" not in applied.stdout, applied.stdout
    assert (await asyncio.to_thread(cli, broker, "quarantine", "park", "money.quarantine", "--yes")).exit_code == 0
    for name in ("money.quarantine", "money.parked"):
        live = mgmt.queue(broker.vhost, name)
        assert live is not None
        assert live["type"] == "quorum", live
    _, items = await browse(broker, "money.parked")
    assert sorted(json.loads(m.delivery.body)["n"] for m in items) == [1, 2, 3]  # none lost
    assert await depth(broker, "money.quarantine") == 0
    assert runs == [1, 2, 3]  # none ran again (before: a replay ran each once more)


async def test_the_readmes_rollback_steps_make_both_classic_again_each_job_in_its_place_none_run(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient, apps: list[App]
) -> None:
    """README "Rolling back": quorum quarantine and parked queues back to classic, as an older release declared them."""
    path = tmp_path / "q.toml"
    path.write_text(TOPOLOGY)
    assert (await asyncio.to_thread(cli, broker, "topology", "apply", str(path))).exit_code == 0
    runs: list[int] = []
    app = quorum_app(broker, path, runs, apps)
    async with running_worker(app, broker, queues=("money",)):  # two parked, then three quarantined
        for n in (1, 2):
            await app.enqueue("pay", {"n": n, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 2), 15, "two quarantined")
        assert (await asyncio.to_thread(cli, broker, "quarantine", "park", "money", "--yes")).exit_code == 0
        for n in (3, 4, 5):
            await app.enqueue("pay", {"n": n, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 3), 15, "three more quarantined")
    assert runs == [1, 2, 3, 4, 5]

    def classic_again(name: str) -> None:  # rabbitmqctl delete_queue (no --if-empty on quorum), rabbitmqadmin declare
        # empty by the management API too, as an operator sees it: its figures lag (stats every 5 s; CI 62 on
        # 4.0.5 read 5 a moment after the park, which AMQP's passive declare already counted 0)
        deadline = time.monotonic() + 15
        while (left := (mgmt.queue(broker.vhost, name) or {}).get("messages")) not in (0, None):
            assert time.monotonic() < deadline, f"{name} still holds {left} by the management API"
            time.sleep(0.25)
        mgmt.request("DELETE", f"/queues/{quote(broker.vhost, safe='')}/{name}")
        mgmt.request("PUT", f"/queues/{quote(broker.vhost, safe='')}/{name}",
                     json={"durable": True, "arguments": {"x-queue-type": "classic"}})  # fmt: skip

    def run(*args: str) -> str:
        result = cli(broker, *args)
        assert result.exit_code == 0, result.output
        return result.stdout

    assert "unparked 2 message(s) from money.parked in money.quarantine" in await asyncio.to_thread(
        run, "quarantine", "unpark", "money", "--yes"
    )
    assert await depth(broker, "money.parked") == 0
    await asyncio.to_thread(classic_again, "money.parked")
    assert "parked 5 message(s)" in await asyncio.to_thread(run, "quarantine", "park", "money", "--yes")
    assert await depth(broker, "money.quarantine") == 0
    await asyncio.to_thread(classic_again, "money.quarantine")
    applied = await asyncio.to_thread(run, "topology", "apply", str(path))
    assert "kept      queue    money.quarantine" in applied
    assert "kept      queue    money.parked" in applied
    assert "unparked 3 message(s)" in await asyncio.to_thread(
        run, "quarantine", "unpark", "money", "--limit", "3", "--yes"
    )
    for name, wanted in (("money.quarantine", [3, 4, 5]), ("money.parked", [1, 2])):
        live = mgmt.queue(broker.vhost, name)
        assert live is not None
        assert (live["type"], live["arguments"]) == ("classic", {"x-queue-type": "classic"}), live
        _, items = await browse(broker, name)
        assert [json.loads(m.delivery.body)["n"] for m in items] == wanted, name  # in place, in order
    async with running_worker(app, broker, queues=("money",)):  # still bound: a new failure lands in quarantine
        await app.enqueue("pay", {"n": 6, "fail": True})
        await wait_until_async(lambda: _depth_is(broker, "money.quarantine", 4), 15, "a new failure quarantined")
    assert runs == [1, 2, 3, 4, 5, 6]  # no job ran in the steps


async def _depth_is(broker: BrokerSettings, queue: str, n: int) -> bool:
    return await depth(broker, queue) == n
