"""topology plan / apply / export against a real broker, each test in its own vhost."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import pytest

from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.conftest import BrokerRoot
from tests.integration.helpers import (
    TOPOLOGY,
    binding_triples,
    cli,
    cli_subprocess,
    depth,
    exchange_names,
    queue_names,
    raw_channel,
)
from tests.invalid_topologies import INVALID

pytestmark = pytest.mark.broker

EXPECTED_QUEUE_ARGS: dict[str, dict[str, object]] = {
    "urgent": {"x-queue-type": "classic", "x-max-priority": 5, "x-dead-letter-exchange": "urgent.quarantine"},
    "urgent.retry.1s": {
        "x-queue-type": "classic",
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "urgent",
    },
    "urgent.retry.5s": {
        "x-queue-type": "classic",
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "urgent",
    },
    "urgent.retry.30s": {
        "x-queue-type": "classic",
        "x-message-ttl": 30000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "urgent",
    },
    "urgent.quarantine": {"x-queue-type": "classic"},
    "batch": {"x-queue-type": "classic", "x-dead-letter-exchange": "batch.quarantine"},
    "batch.retry.10s": {
        "x-queue-type": "classic",
        "x-message-ttl": 10000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "batch",
    },
    "batch.retry.1m": {
        "x-queue-type": "classic",
        "x-message-ttl": 60000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "batch",
    },
    "batch.retry.10m": {
        "x-queue-type": "classic",
        "x-message-ttl": 600000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "batch",
    },
    "batch.quarantine": {"x-queue-type": "classic"},
    "billing": {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "billing.quarantine",
        "x-dead-letter-strategy": "at-least-once",
        "x-delivery-limit": 5,
        "x-overflow": "reject-publish",
    },
    **{
        f"billing.retry.{t}": {
            "x-queue-type": "quorum",
            "x-message-ttl": ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "billing",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        for t, ms in (("5s", 5000), ("1m", 60000), ("15m", 900000))
    },
    "billing.quarantine": {"x-queue-type": "quorum", "x-delivery-limit": 2**31 - 1},  # the job queue's type
    "urgent.suspects": {"x-queue-type": "classic", "x-dead-letter-exchange": "urgent.quarantine"},
    "batch.suspects": {"x-queue-type": "classic", "x-dead-letter-exchange": "batch.quarantine"},
    "billing.suspects": {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "billing.quarantine",
        "x-dead-letter-strategy": "at-least-once",
        "x-delivery-limit": 5,
        "x-overflow": "reject-publish",
    },
    **{f"{jq}.parked": {"x-queue-type": "classic"} for jq in ("urgent", "batch")},
    "billing.parked": {"x-queue-type": "quorum", "x-delivery-limit": 2**31 - 1},
}
EXPECTED_EXCHANGES = {
    "jobs": "direct",
    "urgent.quarantine": "fanout",
    "batch.quarantine": "fanout",
    "billing.quarantine": "fanout",
    "amqpjobs.events": "topic",
}
EXPECTED_BINDINGS = sorted(
    [
        ("jobs", "urgent", "urgent"),
        ("jobs", "batch", "batch"),
        ("jobs", "billing", "billing"),
        ("urgent.quarantine", "urgent.quarantine", ""),
        ("batch.quarantine", "batch.quarantine", ""),
        ("billing.quarantine", "billing.quarantine", ""),
    ]
)


def test_apply_creates_exactly_the_topology_and_is_idempotent(broker: BrokerSettings, mgmt: ManagementClient):
    first = cli(broker, "topology", "apply", str(TOPOLOGY))
    assert first.exit_code == 0, first.output
    assert "32 created, 0 unchanged" in first.stdout
    assert f":{broker.password}@" not in first.output  # credentials never printed
    assert ":***@" in first.stdout

    queues = {q["name"]: q for q in mgmt.queues(broker.vhost)}
    assert sorted(queues) == sorted(EXPECTED_QUEUE_ARGS)
    for name, args in EXPECTED_QUEUE_ARGS.items():
        assert queues[name]["arguments"] == args, name
        assert queues[name]["durable"] is True
        assert queues[name]["auto_delete"] is False
        assert queues[name]["type"] == args["x-queue-type"]
    exchanges = {e["name"]: e for e in mgmt.exchanges(broker.vhost) if e["name"] in EXPECTED_EXCHANGES}
    assert {n: e["type"] for n, e in exchanges.items()} == EXPECTED_EXCHANGES
    assert exchange_names(mgmt, broker.vhost) == sorted(EXPECTED_EXCHANGES)
    assert all(e["durable"] for e in exchanges.values())
    assert binding_triples(mgmt, broker.vhost) == EXPECTED_BINDINGS

    second = cli(broker, "topology", "apply", str(TOPOLOGY))
    assert second.exit_code == 0, second.output
    assert "nothing to create" in second.stdout
    assert "all 32 objects unchanged" in second.stdout
    assert "created" not in second.stdout.replace("nothing to create", "")

    plan = cli(broker, "topology", "plan", str(TOPOLOGY))
    assert plan.exit_code == 0
    assert "0 to create, 32 unchanged, 0 conflict(s)" in plan.stdout


async def _predeclare(broker: BrokerSettings) -> None:
    async with raw_channel(broker) as ch:
        # urgent: no DLX and another x-max-priority
        await ch.declare_queue("urgent", durable=True, arguments={"x-max-priority": 10})
        # billing: classic instead of quorum
        await ch.declare_queue("billing", durable=True)
        # a tier with another TTL
        await ch.declare_queue(
            "batch.retry.10s",
            durable=True,
            arguments={
                "x-message-ttl": 7000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "batch",
            },
        )
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="urgent")


@pytest.mark.parametrize("command", ["plan", "apply"])
async def test_conflicts_are_named_and_nothing_is_declared(
    broker: BrokerSettings, mgmt: ManagementClient, command: str
):
    await _predeclare(broker)
    before_queues = queue_names(mgmt, broker.vhost)
    before_exchanges = exchange_names(mgmt, broker.vhost)
    result = await asyncio.to_thread(cli_subprocess, broker, "topology", command, str(TOPOLOGY))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "Traceback" not in result.stderr
    assert "CONFLICT  queue    urgent\n" in out
    assert "x-dead-letter-exchange: live (none), desired 'urgent.quarantine'" in out
    assert "x-max-priority: live 10, desired 5" in out
    assert "CONFLICT  queue    billing\n" in out
    assert "type: live 'classic', desired 'quorum'" in out
    assert "CONFLICT  queue    batch.retry.10s\n" in out
    assert "x-message-ttl: live 7000, desired 10000" in out
    assert "now: 1 message(s)" in out  # urgent's remedy shows its depth
    assert "delete it and apply again" in out
    assert "3 conflict(s)" in out
    if command == "apply":
        assert "nothing was declared" in result.stderr
    # nothing declared, and the broker never closed anything on us
    assert queue_names(mgmt, broker.vhost) == before_queues
    assert exchange_names(mgmt, broker.vhost) == before_exchanges
    assert await depth(broker, "urgent") == 1


def test_export_imports_with_rabbitmqctl_and_plans_unchanged(
    broker: BrokerSettings, broker_root: BrokerRoot, mgmt: ManagementClient, tmp_path: Path
):
    out = tmp_path / "defs.json"
    result = cli(broker, "topology", "export", str(TOPOLOGY), "--vhost", broker.vhost, "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert len(doc["queues"]) == 21
    assert len(doc["exchanges"]) == 5
    assert len(doc["bindings"]) == 6
    out.chmod(0o644)
    tmp_path.chmod(0o755)
    if broker_root.source == "local":
        ctl = broker_root.ctl("import_definitions", str(out))
        assert ctl.returncode == 0, ctl.stdout + ctl.stderr
    else:  # same import through the HTTP API when rabbitmqctl is out of reach
        mgmt.import_definitions(broker.vhost, doc)
    plan = cli(broker, "topology", "plan", str(TOPOLOGY))
    assert plan.exit_code == 0, plan.output
    assert "0 to create, 32 unchanged, 0 conflict(s)" in plan.stdout
    assert sorted(queue_names(mgmt, broker.vhost)) == sorted(EXPECTED_QUEUE_ARGS)


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_topology_exit_2_names_key_path_declares_nothing(
    broker: BrokerSettings, mgmt: ManagementClient, tmp_path: Path, case: str
):
    text, key_path, _ = INVALID[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = cli(broker, "topology", "apply", str(path))
    assert result.exit_code == 2, result.output
    where = f"{path}: " if key_path == "-" else f"{path}: {key_path}: "  # a whole-file problem has no key path
    assert f"  - {where}" in result.stderr
    assert "fix:" in result.stderr
    assert queue_names(mgmt, broker.vhost) == []
    assert exchange_names(mgmt, broker.vhost) == []


TIMING_TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s", "2s"]
"""


@pytest.mark.parametrize(("tier", "ttl"), [("work.retry.1s", 1.0), ("work.retry.2s", 2.0)])
async def test_tier_returns_message_to_work_queue_after_ttl(
    broker: BrokerSettings, tmp_path: Path, tier: str, ttl: float
):
    path = tmp_path / "t.toml"
    path.write_text(TIMING_TOPOLOGY)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        work = await ch.get_queue("work", ensure=False)
        arrived: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()
            if not arrived.done():
                arrived.set_result(time.monotonic())

        await work.consume(on_message)
        sent = time.monotonic()
        await ch.default_exchange.publish(aio_pika.Message(b'{"n": 1}'), routing_key=tier)
        back = await asyncio.wait_for(arrived, ttl + 5)
    waited = back - sent
    assert ttl <= waited + 0.01, waited
    assert waited - ttl < 0.5, waited


async def test_rejected_message_lands_in_quarantine_with_x_death(
    broker: BrokerSettings, tmp_path: Path, mgmt: ManagementClient
):
    path = tmp_path / "t.toml"
    path.write_text(TIMING_TOPOLOGY)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        exchange = await ch.get_exchange("jobs")
        await exchange.publish(aio_pika.Message(b'{"n": 1}', message_id="m-1"), routing_key="work")
        work = await ch.get_queue("work", ensure=False)
        msg = await work.get(timeout=5)
        assert msg is not None
        await msg.reject(requeue=False)
        quarantine = await ch.get_queue("work.quarantine", ensure=False)
        got = None
        for _ in range(50):
            got = await quarantine.get(fail=False)
            if got is not None:
                break
            await asyncio.sleep(0.1)
        assert got is not None
        assert got.message_id == "m-1"
        assert got.body == b'{"n": 1}'
        deaths = got.headers["x-death"]
        assert isinstance(deaths, list)
        assert len(deaths) == 1
        death = deaths[0]
        assert isinstance(death, dict)
        assert death["reason"] == "rejected"
        assert death["queue"] == "work"
        assert death["count"] == 1
        assert death["exchange"] == "jobs"
        await got.ack()
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.quarantine") == 0


SHARDED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "exports"
exchange = "jobs"
shards = 4
retry_tiers = ["1s"]
"""


async def test_plan_reports_shards_the_topology_dropped(broker: BrokerSettings, tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    async with raw_channel(broker) as ch:
        for _ in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="exports.shard-3")
    path.write_text(SHARDED.replace("shards = 4", "shards = 2"))
    result = await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ORPHAN    queue    exports.shard-3 (3 message(s))" in result.stdout
    assert "ORPHAN    queue    exports.shard-2 (0 message(s))" in result.stdout
    assert "ORPHAN    queue    exports.shard-3.retry.1s (0 message(s))" in result.stdout
    orphans = [line.split()[2] for line in result.stdout.splitlines() if line.startswith("ORPHAN")]
    assert orphans == ["exports.shard-2", "exports.shard-2.retry.1s", "exports.shard-3", "exports.shard-3.retry.1s"]
    # crc32: publishers stop sending there, but the jobs already in shard-3 wait: the fix is named on each line
    lines = [line for line in result.stdout.splitlines() if line.startswith("ORPHAN")]
    held = [line for line in lines if "(0 message(s))" not in line]
    assert [line.split()[2] for line in held] == ["exports.shard-3"]
    assert all("drain it" in line and "or raise shards back to 4 so workers read it again" in line for line in held)
    assert all("it is empty: delete it" in line for line in lines if line not in held)  # nothing to drain
    applied = await asyncio.to_thread(cli_subprocess, broker, "topology", "apply", str(path))
    assert applied.returncode == 0, applied.stderr  # apply declares nothing new, and repeats the warning
    assert "warning: ORPHAN    queue    exports.shard-3 (3 message(s))" in applied.stderr, applied.stderr
    assert await depth(broker, "exports.shard-3") == 3


async def test_plan_says_a_dropped_tiers_jobs_go_back_not_raise_shards(broker: BrokerSettings, tmp_path: Path):
    path = tmp_path / "s.toml"
    # the dropped tier holds its message 5 s: long enough for plan (a subprocess) to count it on a loaded machine
    path.write_text(SHARDED.replace('["1s"]', '["5s", "10s"]'))
    await apply_topology(path, broker)
    path.write_text(SHARDED.replace('["1s"]', '["10s"]'))
    async with raw_channel(broker) as ch:
        await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key="exports.shard-1.retry.5s")
    result = await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(path))
    lines = [line for line in result.stdout.splitlines() if line.startswith("ORPHAN")]
    assert [line.split()[2] for line in lines] == [f"exports.shard-{n}.retry.5s" for n in range(4)], lines
    assert "ORPHAN    queue    exports.shard-1.retry.5s (1 message(s))" in lines[1]
    assert "its messages go back to exports.shard-1 when their delay ends (dead-lettering)" in lines[1], lines[1]
    assert not any("raise shards" in line for line in lines), lines  # the shards are all there
    for _ in range(150):  # and so they do: the tier's own TTL and dead-letter target still hold
        if await depth(broker, "exports.shard-1") == 1:
            break
        await asyncio.sleep(0.1)
    assert await depth(broker, "exports.shard-1") == 1
    assert await depth(broker, "exports.shard-1.retry.5s") == 0


def test_a_queue_exclusive_to_another_connection_is_named_not_a_traceback(broker: BrokerSettings):
    async def hold_and_plan() -> subprocess.CompletedProcess[str]:
        async with raw_channel(broker) as ch:
            await ch.declare_queue("urgent", exclusive=True)  # conflicts, and can't be probed from elsewhere
            return await asyncio.to_thread(cli_subprocess, broker, "topology", "plan", str(TOPOLOGY))

    result = asyncio.run(hold_and_plan())
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "queue 'urgent'" in result.stderr
    assert "exclusive to another connection (RESOURCE_LOCKED)" in result.stderr


def test_a_refused_declaration_says_what_remains(broker: BrokerSettings, mgmt: ManagementClient):
    """A user who may configure only some of the objects: the broker refuses the rest mid-apply."""
    user = f"limited-{broker.vhost[-8:]}"
    mgmt.request("PUT", f"/users/{user}", json={"password": "limited", "tags": "management"})
    try:
        vhost = quote(broker.vhost, safe="")
        mgmt.request(
            "PUT", f"/permissions/{vhost}/{user}", json={"configure": "^urgent.*", "write": ".*", "read": ".*"}
        )
        parts = urlsplit(broker.url)
        limited = broker_settings(
            urlunsplit(parts._replace(netloc=f"{user}:limited@{parts.hostname}:{parts.port}")), broker.management_url
        )
        result = cli_subprocess(limited, "topology", "apply", str(TOPOLOGY))
    finally:
        mgmt.request("DELETE", f"/users/{user}")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "ACCESS_REFUSED" in result.stderr
    assert "objects declared before it remain" in result.stderr
    assert len(result.stderr.splitlines()) <= 3, result.stderr  # our one message, not a client library's logs


def test_the_largest_integer_amqp_carries_applies_whole_and_plans_unchanged(
    broker: BrokerSettings, mgmt: ManagementClient, tmp_path: Path
) -> None:
    # review M1: one past it half-applied (4 queues declared, then a pamqp TypeError); now the loader
    # refuses that (tests/invalid_topologies.py), and the bound itself is what RabbitMQ takes
    biggest = 2**63 - 1
    path = tmp_path / "big.toml"
    path.write_text(
        '[[exchange]]\nname = "jobs"\n\n'
        f'[[job_queue]]\nname = "q"\nexchange = "jobs"\nmax_length = {biggest}\noverflow = "drop-head"\n'
        'retry_tiers = ["1s"]\n\n'
        f'[[job_queue]]\nname = "qq"\nexchange = "jobs"\ntype = "quorum"\ndelivery_limit = {biggest}\n'
    )
    applied = cli(broker, "topology", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    args = {q["name"]: q["arguments"] for q in mgmt.queues(broker.vhost)}
    assert args["q"]["x-max-length"] == biggest
    assert args["qq"]["x-delivery-limit"] == biggest
    plan = cli(broker, "topology", "plan", str(path))
    assert plan.exit_code == 0, plan.output
    assert "\n0 to create, 17 unchanged, 0 conflict(s)\n" in plan.stdout


def test_the_management_api_names_the_exchange_types_the_broker_offers(mgmt: ManagementClient) -> None:
    """What plan checks each exchange's type against (helper-177): AMQP's four at least (x-consistent-hash
    with its plugin, which scripts/broker.sh enables; a testcontainers node may not)."""
    offered = mgmt.exchange_types()
    assert offered is not None
    assert {"direct", "fanout", "headers", "topic"} <= offered
    assert all(isinstance(name, str) and name for name in offered)
