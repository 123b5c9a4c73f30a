"""Where ``amqpjobs status`` takes its job queues from: a topology PATH, --queues, or both (real broker).

Both: the topology's job queues, narrowed to the names given (a name the topology lacks is
bad input). --queues alone: the queues are found on the broker by the naming scheme; a name
with none of its queues there is one problem that says so, not four "apply the topology"
lines for a job queue that may only be misspelt.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from amqpjobs.cli import main
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.worker_env import APPLIED_TOPOLOGY, FAST_TOPOLOGY

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def status(broker: BrokerSettings, *args: str) -> Result:
    env = {"AMQPJOBS_URL": broker.url, "AMQPJOBS_MANAGEMENT_URL": broker.management_url}
    return await asyncio.to_thread(CliRunner().invoke, main, ["status", *args], env=env)


async def topology(broker: BrokerSettings, tmp_path: Path) -> Path:
    """``work`` applied; the file also declares ``ghost``, not applied."""
    (tmp_path / "applied.toml").write_text(APPLIED_TOPOLOGY)
    await apply_topology(tmp_path / "applied.toml", broker)
    (tmp_path / "full.toml").write_text(FAST_TOPOLOGY)
    return tmp_path / "full.toml"


async def test_a_path_and_queues_narrow_the_topology_to_those_job_queues(broker: BrokerSettings, tmp_path: Path):
    path = await topology(broker, tmp_path)
    both = await status(broker, str(path), "--queues", "ghost", "--json")
    assert both.exit_code == 1, both.output
    doc = json.loads(both.stdout)
    assert doc["source"] == f"topology {path.resolve()}, job queue(s) ghost"
    assert [j["name"] for j in doc["job_queues"]] == ["ghost"]
    assert doc["job_queues"][0]["problems"][0] == "queue ghost does not exist (apply the topology)"  # it is in it
    text = await status(broker, str(path), "-q", "work")
    assert (
        text.stdout.splitlines()[0]
        == f"topology {path.resolve()}, job queue(s) work; vhost {broker.vhost!r} on {broker.safe_url}"
    )
    assert "UNHEALTHY work: no consumer on work" in text.stdout


async def test_a_queue_name_the_topology_lacks_is_bad_input_naming_its_job_queues(
    broker: BrokerSettings, tmp_path: Path
):
    path = await topology(broker, tmp_path)
    wrong = await status(broker, str(path), "--queues", "work,wrok")
    assert wrong.exit_code == 2, wrong.output
    assert wrong.stderr == (
        f"error: --queues: wrok: not a job queue of the topology {path} (its job queues: ghost, work; "
        "leave PATH out to look for any job queue on the broker)\n"
    )
    assert wrong.stdout == ""


async def test_a_queues_name_with_none_of_its_queues_on_the_broker_is_one_problem(
    broker: BrokerSettings, tmp_path: Path
):
    await topology(broker, tmp_path)
    result = await status(broker, "--queues", "wrok,work", "--json")
    assert result.exit_code == 1, result.output
    found = {j["name"]: j["problems"] for j in json.loads(result.stdout)["job_queues"]}
    assert found["wrok"] == [
        f"no job queue wrok on vhost {broker.vhost!r}: none of its queues exist (check the name; job queues "
        "here: work; or apply the topology that declares it)"
    ]
    assert found["work"] == ["no consumer on work"]
    for odd in ("ürgent", "a*b"):  # names the AMQP client can't send: the management API's list tells
        found = {
            j["name"]: j["problems"]
            for j in json.loads((await status(broker, "-q", odd, "--json")).stdout)["job_queues"]
        }
        assert found[odd] == [
            f"no job queue {odd} on vhost {broker.vhost!r}: none of its queues exist (check the name; job queues "
            "here: work; or apply the topology that declares it)"
        ]
    text = await status(broker, "--queues", "wrok")
    assert [line for line in text.stdout.splitlines() if line.startswith(("UNHEALTHY", "note"))] == [
        f"UNHEALTHY wrok: no job queue wrok on vhost {broker.vhost!r}: none of its queues exist (check the "
        "name; job queues here: work; or apply the topology that declares it)"
    ]


@pytest.mark.parametrize(
    ("queues", "error"),
    [
        ("work.quarantine", "--queues: work.quarantine is the quarantine queue of job queue work: give job queue "
         "names"),
        ("work.retry.400ms", "--queues: work.retry.400ms is retry tier 400ms of work queue work (job queue work): give "
         "job queue names"),
        ("work.shard-1", "--queues: work.shard-1 is shard 1 of job queue work: give job queue names"),
        ("work.parked,work", "--queues: work.parked is the parked queue of job queue work: give job queue names"),
        (" \t, ", "--queues is empty: give job queue names, or a topology PATH"),
    ],
)  # fmt: skip
async def test_a_queues_name_no_job_queue_can_have_is_bad_input(broker: BrokerSettings, tmp_path: Path, queues: str,
                                                                 error: str):  # fmt: skip
    await topology(broker, tmp_path)
    result = await status(broker, "--queues", queues)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {error}\n", "")


async def test_queues_named_twice_are_shown_once_and_tiers_in_the_order_of_their_delays(
    broker: BrokerSettings, tmp_path: Path
):
    (tmp_path / "tiered.toml").write_text(
        '[[exchange]]\nname = "jobs"\n\n[[job_queue]]\nname = "tiered"\nexchange = "jobs"\n'
        'retry_tiers = ["5s", "30s", "2m"]\n'
    )
    await apply_topology(tmp_path / "tiered.toml", broker)
    result = await status(broker, "--queues", "tiered,tiered", "--json")
    doc = json.loads(result.stdout)
    assert doc["source"] == "--queues tiered"
    assert [j["name"] for j in doc["job_queues"]] == ["tiered"]
    tiers = [t["name"] for t in doc["job_queues"][0]["tiers"]]
    assert tiers == ["tiered.retry.5s", "tiered.retry.30s", "tiered.retry.2m"]  # by name: 2m, 30s, 5s
