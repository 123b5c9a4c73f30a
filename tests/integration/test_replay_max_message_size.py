"""A quarantined message over the broker's ``max_message_size`` never stops a replay.

``max_message_size`` is node-wide (no per-vhost setting on 3.10), and the shared test
broker's config is not ours to change: these tests run on a throwaway node of their own
(:mod:`tests.integration.own_node`), whose limit is lowered at run time with
``rabbitmqctl eval`` after the big message is in quarantine (a channel reads the limit when
it opens: the replay's channels get the low one).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.runtime.parking import park
from amqpjobs.runtime.quarantine import browse
from amqpjobs.runtime.replay import replay
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import depth, raw_channel
from tests.integration.own_node import OwnNode, own_node
from tests.integration.worker_env import make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

#: The node's lowered limit, and the big message's body (over it; far under frame_max's concern: bodies span frames).
LIMIT = 50_000
BIG = 80_000


@pytest.fixture(scope="module")
def size_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnNode]:
    with own_node(tmp_path_factory.mktemp("maxsize"), "maxsize") as node:
        yield node


@pytest.fixture
def on_size_node(size_node: OwnNode, request: pytest.FixtureRequest) -> Iterator[tuple[OwnNode, BrokerSettings]]:
    """A fresh vhost on the node; its max_message_size set back to the default after the test."""
    settings = broker_settings(f"amqp://guest:guest@127.0.0.1:{size_node.port}/")
    vhost = f"t-{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
    with ManagementClient(settings) as mgmt:
        mgmt.create_vhost(vhost)
        try:
            yield size_node, settings.with_vhost(vhost)
        finally:
            size_node.ctl("eval", "application:set_env(rabbit, max_message_size, 134217728).")
            mgmt.delete_vhost(vhost)


async def fill(broker: BrokerSettings) -> None:
    """Quarantined jobs q-0 .. q-4 with small bodies, and big-2 (third) with a body of BIG bytes."""
    async with raw_channel(broker) as ch:
        ex = await ch.get_exchange("work.quarantine")
        for i in range(5):
            body = json.dumps({"n": i, "pad": "x" * (BIG if i == 2 else 0)}).encode()
            await ex.publish(
                aio_pika.Message(body, content_type="application/json", message_id="big-2" if i == 2 else f"q-{i}",
                                 type="mail", headers={"amqpjobs-reason": "exhausted",
                                                       "amqpjobs-original-queue": "work"}),
                routing_key="work",
            )  # fmt: skip


@pytest.mark.timeout(120)
async def test_replay_skips_a_message_over_the_brokers_max_message_size_and_replays_the_rest(
    on_size_node: tuple[OwnNode, BrokerSettings], tmp_path: Path
):
    node, broker = on_size_node
    await make_app(broker, tmp_path)
    await fill(broker)
    node.ctl("eval", f"application:set_env(rabbit, max_message_size, {LIMIT}).")
    first = await replay(broker, "work.quarantine", ReplayOptions(rate=1000))  # moves overlap (a window)
    assert (first.replayed, first.skipped, first.left) == (4, 1, 1), first
    assert sorted(job_id for job_id, _ in first.moves) == ["q-0", "q-1", "q-3", "q-4"]
    second = await replay(broker, "work.quarantine", ReplayOptions(rate=2))  # it alone: one at a time
    assert (second.replayed, second.skipped, second.left) == (0, 1, 1), second
    for report in (first, second):
        [line] = report.not_moved
        assert line.startswith("job 'mail' id 'big-2': its copy would be too large: a body of "), line
        assert line.endswith(f"bytes, over the broker's max_message_size of {LIMIT} bytes"), line
    assert await depth(broker, "work") == 4
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["big-2"]  # it stays, as it was
    assert len(left[0].delivery.body) > BIG


@pytest.mark.timeout(120)
async def test_park_skips_a_message_over_the_brokers_max_message_size_and_parks_the_rest(
    on_size_node: tuple[OwnNode, BrokerSettings], tmp_path: Path
):
    node, broker = on_size_node
    await make_app(broker, tmp_path)
    await fill(broker)
    node.ctl("eval", f"application:set_env(rabbit, max_message_size, {LIMIT}).")
    report = await park(broker, "work.quarantine")
    assert (report.taken, report.left) == (4, 1), report
    [line] = report.not_moved
    assert line.startswith("job 'mail' id 'big-2': its copy would be too large: a body of "), line
    assert line.endswith(f"bytes, over the broker's max_message_size of {LIMIT} bytes"), line
    assert await depth(broker, "work.parked") == 4
    _, left = await browse(broker, "work.quarantine")
    assert [m.delivery.message_id for m in left] == ["big-2"]
