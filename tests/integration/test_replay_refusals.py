"""One message a replay or park can't move never blocks the others (real broker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.parking import park
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.console_env import BASE, CSRF, client, wait_done
from tests.integration.helpers import cli, depth, raw_channel
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import make_app

pytestmark = pytest.mark.broker

#: Bytes of a content-header frame besides the properties (frame header and end, class, weight, body size).
FRAME_OVERHEAD = 20


def big_message(frame_max: int, room: int = 4) -> aio_pika.Message:
    """A broker-side dead-letter whose properties fill its header frame to ``room`` bytes under ``frame_max``.

    It was delivered, so it fits; the copy a replay or park makes (``x-death`` gone, provenance
    or evidence headers added) does not.
    """
    headers: dict[str, Any] = {
        "x-death": [{"queue": "work", "reason": "rejected", "count": 1, "exchange": "jobs", "routing-keys": ["work"]}],
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "work",
        "blob": "",
    }

    def message() -> aio_pika.Message:
        return aio_pika.Message(b'{"n": 99}', content_type="application/json", message_id="big-1", type="mail",
                                headers=headers)  # fmt: skip

    headers["blob"] = "x" * (frame_max - room - FRAME_OVERHEAD - len(message().properties.marshal()))
    assert len(message().properties.marshal()) + FRAME_OVERHEAD == frame_max - room
    return message()


async def fill_with_one_too_big(broker: BrokerSettings) -> None:
    """Five ordinary quarantined jobs (q-0 .. q-4) and one, big-1, third in the queue, whose copy won't fit."""
    await fill_quarantine(broker, 2)
    async with raw_channel(broker) as ch:
        underlay = await ch.get_underlay_channel()
        frame_max = underlay.connection.connection_tune.frame_max
        await ch.default_exchange.publish(big_message(frame_max), routing_key="work.quarantine")
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("work.quarantine")
        for i in range(2, 5):
            await ex.publish(aio_pika.Message(json.dumps({"n": i}).encode(), message_id=f"q-{i}", type="mail",
                                              headers={"amqpjobs-reason": "exhausted",
                                                       "amqpjobs-original-queue": "work"}),
                             routing_key="work")  # fmt: skip


SKIPPED = "job 'mail' id 'big-1'"


async def test_replay_skips_a_message_whose_copy_is_over_frame_max_and_replays_the_rest(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_with_one_too_big(broker)
    dry = await replay(broker, "work.quarantine", ReplayOptions(rate=1000, dry_run=True))
    assert (dry.replayed, dry.skipped, dry.left) == (5, 1, 6)
    assert [line.split(":")[0] for line in dry.not_moved] == [SKIPPED]
    assert dry.not_moved[0].startswith(f"{SKIPPED}: its copy would be too large: headers and properties of ")
    assert "bytes, over the connection's frame_max of" in dry.not_moved[0]
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))
    assert (report.replayed, report.skipped, report.left) == (5, 1, 1)
    assert report.not_moved == dry.not_moved
    assert sorted(job_id for job_id, _ in report.moves) == ["q-0", "q-1", "q-2", "q-3", "q-4"]
    assert await depth(broker, "work") == 5
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["big-1"]  # nothing lost: it stays, as it was
    assert left[0].delivery.headers["blob"] == "x" * len(left[0].delivery.headers["blob"])


async def test_cli_replay_names_the_skipped_message_and_exits_1(broker: BrokerSettings, tmp_path: Path):
    await make_app(broker, tmp_path)
    await fill_with_one_too_big(broker)
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
    assert dry.exit_code == 1, dry.output
    assert "dry run: 5 would be replayed, 1 skipped, nothing moved; 6 in work.quarantine" in dry.stdout
    assert f"would not replay {SKIPPED}: its copy would be too large: headers and properties of" in dry.stderr
    assert "it would stay in work.quarantine" in dry.stderr
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
    assert run.exit_code == 1, run.output
    assert "replayed 5, skipped 1, left 1 in work.quarantine (" in run.stdout
    assert "; 1 skipped: too large to send, still in work.quarantine" in run.stdout
    assert f"not replayed {SKIPPED}: its copy would be too large: headers and properties of" in run.stderr
    assert "it stays in work.quarantine" in run.stderr
    assert await depth(broker, "work") == 5


async def test_park_skips_a_message_whose_copy_is_over_frame_max_and_parks_the_rest(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_with_one_too_big(broker)
    report = await park(broker, "work.quarantine")
    assert (report.taken, report.left) == (5, 1)
    assert [line.split(":")[0] for line in report.not_moved] == [SKIPPED]
    assert await depth(broker, "work.parked") == 5
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["big-1"]
    await fill_with_one_too_big(broker)  # five more beside big-1, then the CLI
    result = await asyncio.to_thread(cli, broker, "quarantine", "park", "work", "--yes")
    assert result.exit_code == 1, result.output
    assert "parked 5 message(s) from work.quarantine in work.parked; 2 left in work.quarantine" in result.stdout
    assert f"not parked {SKIPPED}: its copy would be too large: headers and properties of" in result.stderr
    assert q.describe(left[0].delivery.headers, "big-1", "mail").reason == "x-death:rejected"


def test_the_console_names_the_message_a_replay_or_park_left(broker: BrokerSettings, tmp_path: Path):
    asyncio.run(make_app(broker, tmp_path))
    asyncio.run(fill_with_one_too_big(broker))
    base = {"queue": "work.quarantine", "scope": "all", "csrf_token": CSRF}
    with client(broker, tmp_path) as c:
        replayed = c.post("/actions/replay", data={**base, "rate": "100", "canary": ""})
        replay_run = wait_done(c, replayed.headers["location"].replace(BASE, ""))
        asyncio.run(fill_with_one_too_big(broker))
        parked = c.post("/actions/park", data=base)
        park_run = wait_done(c, parked.headers["location"].replace(BASE, ""))
    assert (replay_run["state"], replay_run["moved"]) == ("done", 5), replay_run
    assert "1 skipped: too large to send, still in work.quarantine" in replay_run["summary"]
    assert [d.split(":")[0] for d in replay_run["details"]] == [f"not replayed {SKIPPED}"]
    assert (park_run["state"], park_run["moved"], park_run["left"]) == ("done", 5, 2), park_run
    assert [d.split(":")[0] for d in park_run["details"]] == [f"not parked {SKIPPED}"] * 2


async def test_replay_whose_copy_cannot_be_published_leaves_the_original_in_quarantine(
    broker: BrokerSettings, tmp_path: Path
):
    # the target queue was deleted: no copy can go, so no original may be acked; each stays, named
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 3)
    async with raw_channel(broker) as ch:
        await ch.queue_delete("work")
    report = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))
    assert (report.replayed, report.skipped, report.left, report.missing) == (0, 3, 3, {"work": 3})
    assert [line.split(":")[0] for line in report.not_moved] == [f"job 'mail' id 'q-{i}'" for i in range(3)]
    _, left = await browse(broker, "work.quarantine")
    assert sorted(str(m.delivery.message_id) for m in left) == ["q-0", "q-1", "q-2"]
    assert [q.describe(m.delivery.headers, m.delivery.message_id, m.delivery.type).attempts for m in left] == [4, 4, 4]


#: A work queue name as another stack's worker might write it in its evidence: 300 bytes, which no
#: publish can carry (the routing key is an AMQP short string: at most 255 bytes).
TOO_LONG = "w" * 300


async def test_replay_skips_a_message_whose_evidence_names_a_queue_no_publish_can_address(
    broker: BrokerSettings, tmp_path: Path
):
    await make_app(broker, tmp_path)
    await fill_quarantine(broker, 2)
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("work.quarantine")
        await ex.publish(aio_pika.Message(b'{"n": 9}', message_id="long-1", type="mail",
                                          headers={"amqpjobs-reason": "exhausted",
                                                   "amqpjobs-original-queue": TOO_LONG}),
                         routing_key="work")  # fmt: skip
    await fill_quarantine(broker, 1)  # q-0 again, after it
    said = "; 1 skipped: the queue their evidence names is over 255 bytes, which no publish can address"
    dry = await asyncio.to_thread(cli, broker, "replay", "work", "--dry-run")
    assert dry.exit_code == 1, dry.output  # partial: a matching message stays
    assert "dry run: 3 would be replayed, 1 skipped, nothing moved; 4 in work.quarantine" + said in dry.stdout
    run = await asyncio.to_thread(cli, broker, "replay", "work", "--rate", "1000")
    assert run.exit_code == 1, run.output
    assert "replayed 3, skipped 1, left 1 in work.quarantine (" in run.stdout
    assert said + " (another stack's evidence?): replay them with amqpjobs replay --to QUEUE" in run.stdout
    assert await depth(broker, "work") == 3
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["long-1"]  # nothing lost: it stays, as it was
    moved = await asyncio.to_thread(cli, broker, "replay", "work", "--to", "work")
    assert moved.exit_code == 0, moved.output
    assert "replayed 1, skipped 0, left 0 in work.quarantine" in moved.stdout
