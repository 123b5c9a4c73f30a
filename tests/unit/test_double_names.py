"""A TestBroker asked about a job queue the topology lacks says so, naming the known ones (not ``KeyError``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpjobs import App, JobContext
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.testing import TestBroker
from amqpjobs.topology.loader import load_topology
from tests.topologies import work_topology

pytestmark = pytest.mark.asyncio

TOPOLOGY = work_topology()


def make_app(tmp_path: Path) -> App:
    """An app on :data:`TOPOLOGY` (given as a Topology object), no jobs yet."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    return App("n", topology=load_topology(path).topology)


def app_with_a_job(tmp_path: Path) -> App:
    """:func:`make_app` with job ``j`` on ``work``, whose handler does nothing."""
    app = make_app(tmp_path)

    @app.job("j", queue="work")
    async def j(payload: dict[str, int], ctx: JobContext) -> None:
        return None

    return app


@pytest.mark.parametrize("name", ["nope", "wrok", ""])
async def test_quarantine_and_replay_of_a_job_queue_not_in_the_topology_name_the_known_ones(
    tmp_path: Path, name: str
) -> None:
    app = app_with_a_job(tmp_path)

    async with TestBroker(app) as broker:
        words = rf"job queue {name!r} is not in the topology \(given to App\(\) as a Topology object\); known: work"
        with pytest.raises(ConfigurationError, match=words):
            broker.quarantine(name)
        with pytest.raises(ConfigurationError, match=words):
            await broker.replay(name, ReplayOptions())
        with pytest.raises(
            ConfigurationError, match=r"queue 'nope.quarantine' does not exist; known: .*work.quarantine"
        ):
            broker.quarantine("nope.quarantine")
        assert broker.quarantine("work") == broker.quarantine("work.quarantine") == []


@pytest.mark.parametrize("body", ["{}", {"a": 1}, None, 7])
async def test_publish_raw_takes_bytes_only_as_any_amqp_publish(tmp_path: Path, body: object) -> None:
    app = app_with_a_job(tmp_path)

    async with TestBroker(app) as broker:
        with pytest.raises(TypeError, match=r"publish_raw\(\) body must be bytes .*, not "):
            await broker.publish_raw("jobs", "work", body, type="j")  # type: ignore[arg-type]
        assert await broker.drain() == []  # nothing was stored
        await broker.publish_raw("jobs", "work", bytearray(b"{}"), type="j", message_id="ba")
        [done] = await broker.drain()
        assert (done.kind, done.job_id) == ("succeeded", "ba")
        assert broker.memory.queue("work").messages == []


async def test_a_testbroker_used_before_it_is_open_says_so_not_that_the_topology_is_missing(tmp_path: Path) -> None:
    app = app_with_a_job(tmp_path)

    broker = TestBroker(app)  # no `async with`
    words = r"this TestBroker is not open yet: use it as `async with TestBroker\(app\) as broker:`"
    with pytest.raises(ConfigurationError, match=words):
        await broker.drain()
    with pytest.raises(ConfigurationError, match=words):
        await broker.advance("1s")
    with pytest.raises(ConfigurationError, match=words):
        await broker.publish_raw("jobs", "work", b"{}", type="j")
    with pytest.raises(ConfigurationError, match=words):
        await broker.replay("work", ReplayOptions())
    with pytest.raises(ConfigurationError, match=words):
        broker.messages("work")
    async with broker:  # and it opens as usual afterwards
        await broker.publish_raw("jobs", "work", b"{}", type="j", message_id="m-1")
        assert [p.kind for p in await broker.drain()] == ["succeeded"]


async def test_a_closed_testbroker_runs_nothing_more_and_says_so_but_its_records_stay_readable(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    runs: list[str] = []

    @app.job("j", queue="work")
    async def j(payload: dict[str, int], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    async with TestBroker(app) as broker:
        await broker.publish_raw("jobs", "work", b"{}", type="j", message_id="m-1")
        await broker.drain()
        await broker.publish_raw("jobs", "work", b"{}", type="j", message_id="m-2")  # left in its queue
    words = r"this TestBroker is closed: it runs jobs only inside `async with TestBroker\(app\) as broker:`"
    with pytest.raises(ConfigurationError, match=words):
        await broker.drain()
    with pytest.raises(ConfigurationError, match=words):
        await broker.advance("1s")
    with pytest.raises(ConfigurationError, match=words):
        await broker.publish_raw("jobs", "work", b"{}", type="j", message_id="m-3")
    with pytest.raises(ConfigurationError, match=words):
        await broker.replay("work", ReplayOptions())
    assert runs == ["m-1"]
    assert [p.job_id for p in broker.completed()] == ["m-1"]  # what it recorded stays readable
    assert [h.get("amqpjobs-attempt") for h in broker.messages("work")] == [None]


async def test_stopping_what_is_no_running_scheduler_replica_says_so(tmp_path: Path) -> None:
    app = make_app(tmp_path)

    @app.cron("0 8 * * *", name="daily")
    @app.job("j", queue="work")
    async def j(payload: dict[str, int], ctx: JobContext) -> None:
        return None

    async with TestBroker(app, scheduler=False) as broker:
        replica = await broker.add_scheduler("s-1")
        with pytest.raises(
            ConfigurationError, match=r"stop_scheduler\(99\): not a running scheduler replica .*\['s-1'\]"
        ):
            await broker.stop_scheduler(99)  # type: ignore[arg-type]
        await broker.stop_scheduler(replica)
        with pytest.raises(ConfigurationError, match=r"not a running scheduler replica .* its replicas: \[\]"):
            await broker.stop_scheduler(replica)  # twice
