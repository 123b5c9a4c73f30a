"""The double's replay refuses what ``amqpjobs quarantine replay --app`` refuses (helper-231).

It took ``rate=0`` and ``limit=0``, returned 0 for a ``to`` queue that does not exist, and moved
jobs to a job queue whose workers do not serve them (they came back ``unknown-job``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, JobContext, ReplayOptions
from amqpjobs.errors import ConfigurationError
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from tests.topologies import work_topology


def make_app(tmp_path: Path) -> App:
    path = tmp_path / "t.toml"
    path.write_text(work_topology("money"))
    app = App("r", topology=load_topology(path).topology)

    @app.job("boom", queue="work")
    async def boom(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError("no")

    @app.job("charge", queue="money")
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError("no")

    return app


async def quarantined_boom(broker: TestBroker, app: App) -> None:
    await app.enqueue("boom", {}, job_id="b-1")
    await broker.drain()
    assert [m.message_id for m in broker.quarantine("work")] == ["b-1"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (ReplayOptions(rate=0), "--rate must be a positive, finite number"),
        (ReplayOptions(limit=0), "limit must be a whole number of at least 1 (got 0)"),
        (ReplayOptions(to="nosuch"), "target queue(s) 'nosuch' do not exist; nothing was moved"),
        (ReplayOptions(to="work.quarantine"), "--to 'work.quarantine' is a quarantine queue"),
        (ReplayOptions(to="money"), "'money' workers do not handle job(s) 'boom' (1 message(s))"),
        (ReplayOptions(rate="5"), "ReplayOptions(rate=...) must be a number of messages per second (got '5')"),  # type: ignore[arg-type]
        (ReplayOptions(to=5), "ReplayOptions(to=...) must be a work queue's name"),  # type: ignore[arg-type]
        (ReplayOptions(to=" "), "ReplayOptions(to=...) must be a work queue's name"),
    ],
)
async def test_a_replay_the_cli_refuses_is_refused_and_moves_nothing(
    tmp_path: Path, options: ReplayOptions, said: str
) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app) as broker:
        await quarantined_boom(broker, app)
        with pytest.raises(ConfigurationError) as caught:
            await broker.replay("work", options)
        assert [m.message_id for m in broker.quarantine("work")] == ["b-1"]
        assert broker.messages("money") == []
    assert said in str(caught.value), str(caught.value)


async def test_a_replay_to_a_queue_that_serves_the_job_still_moves_it(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with TestBroker(app) as broker:
        await quarantined_boom(broker, app)
        assert await broker.replay("work", ReplayOptions(to="work")) == 1
        assert [p.kind for p in await broker.drain()] == ["retried", "quarantined"]
