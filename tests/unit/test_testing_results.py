"""The test double writes the results store's records before drain()/advance() return (no broker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError, JobContext, Reject, SqliteResults
from amqpjobs.testing import TestBroker

pytestmark = [pytest.mark.asyncio, pytest.mark.version_independent]

TOPOLOGY = Path(__file__).resolve().parents[2] / "topology"


def _app(tmp_path: Path) -> App:
    app = App("statusdouble", topology=TOPOLOGY, results=SqliteResults(tmp_path / "results.db"))

    @app.job("math.add", queue="urgent")
    async def add(payload: dict[str, Any], ctx: JobContext) -> int:
        return int(payload["a"]) + int(payload["b"])

    @app.job("math.refuse", queue="urgent")
    async def refuse(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Reject("no")

    @app.cron("0 8 * * *", tz="Europe/Paris")
    @app.job("reports.daily", queue="batch")
    async def daily(payload: dict[str, Any], ctx: JobContext) -> str:
        return "built"

    return app


async def test_job_status_after_drain_is_the_outcome_not_a_stale_record(tmp_path: Path) -> None:
    # Before: right after drain() the store still read `unknown` (the worker's and the app's background
    # writers had not run yet): `assert 'unknown' == 'succeeded'`; only result()'s polling saw it.
    app = _app(tmp_path)
    async with TestBroker(app) as broker:
        done_id = await app.enqueue("math.add", {"a": 2, "b": 3})
        refused_id = await app.enqueue("math.refuse", {})
        await broker.drain()
        done = await app.job_status(done_id)
        assert (done.state, done.value()) == ("succeeded", 5)
        assert [r.state for r in done.history] == ["queued", "running", "succeeded"]
        refused = await app.job_status(refused_id)
        assert refused.current is not None
        assert (refused.state, refused.current.detail) == ("quarantined", "rejected")


async def test_a_cron_tick_has_its_status_once_advance_returns(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with TestBroker(app, start=datetime(2026, 3, 28, 23, 0, tzinfo=UTC)) as broker:
        await broker.advance("12h")  # 08:00 CEST is 06:00Z on 2026-03-29
        [run] = broker.completed("reports.daily")
        assert run.job_id == "cron:reports.daily:2026-03-29T06:00:00Z"
        status = await app.job_status(run.job_id)
        assert (status.state, status.value()) == ("succeeded", "built")


async def test_completed_of_a_job_the_app_does_not_have_is_refused_not_an_empty_list(tmp_path: Path) -> None:
    # Before: broker.completed("math.ad") (a typo) returned [], so `assert not broker.completed("math.ad")`
    # passed whatever ran; quarantine("nope") and messages("nope") already raised.
    app = _app(tmp_path)
    async with TestBroker(app) as broker:
        await app.enqueue("math.add", {"a": 2, "b": 3})
        await broker.drain()
        assert [p.job for p in broker.completed("math.add")] == ["math.add"]
        assert broker.completed("math.refuse") == []  # a job of the app that did not succeed: empty
        with pytest.raises(ConfigurationError) as caught:
            broker.completed("math.ad")
        assert str(caught.value) == (
            "no job 'math.ad' in app 'statusdouble'; registered: math.add, math.refuse, reports.daily"
        )
